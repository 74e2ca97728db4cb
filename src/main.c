/*
 * main.c - relaybus-proxy's entry point: command line, start-up, signals,
 * reload and drain.
 *
 * Start-up order matters: the config is loaded and validated first (exit 1
 * with the reason), then the upstream URI and TLS files (exit 1), then the
 * topology monitor is given a bounded time to find out what the upstream is
 * (a standalone is refused with exit 1; an unreachable upstream is only
 * logged: the monitor keeps trying while clients wait), and only then does
 * the proxy listen.  Everything after that runs on libevent loops: the
 * main thread's (loop 0: listener, signals, topology notices, and its
 * share of the connections) and [proxy] threads - 1 more forwarding loops
 * (proxy/loops.h); no loop ever blocks (docs/architecture.md, "The
 * threads").
 *
 * Signals are libevent signal events, so their handlers run on the loop
 * like everything else: SIGHUP reloads, SIGTERM/SIGINT drain and stop.
 * Every state has a defined answer (docs/operations.md, Signals): before
 * the loop runs and after it has stopped, a plain handler only records a
 * stop request (SIGHUP is dropped); once stopping, a SIGHUP is logged and
 * ignored, because the listener and, after a second stop signal, the
 * connections it would reconfigure are gone.
 *
 * The loops' event bases run without libevent's locks: other threads
 * reach a loop only through its loopwake (base/loopwake.h).
 */
#include <getopt.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#include <pthread.h>
#endif
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <mongoc/mongoc.h>
#include <openssl/crypto.h>
#include <openssl/ssl.h>

#include "admin/admin.h"
#include "autoconf.h"
#include "proxy/conn.h"
#include "base/authfile.h"
#include "base/config.h"
#include "base/fleet.h"
#include "base/instance.h"
#include "codec/compress.h"
#include "codec/scram.h"
#ifdef RELAYBUS_HAVE_KAFKA
#include "dispatch/kafka.h"
#endif
#include "dispatch/consumer.h"
#include "dispatch/dispatch.h"
#include "dispatch/webhook.h"
#include "proxy/listener.h"
#include "proxy/loops.h"
#include "base/keyhash.h"
#include "base/log.h"
#include "base/loopwake.h"
#include "base/clock.h"
#include "base/notify.h"
#include "base/counters.h"
#include "proxy/tls.h"
#include "base/topology.h"
#include "base/trace.h"
#include "publish/hooks.h"
#include "publish/publish.h"
#include "publish/pull.h"

/* The errors of this file's own steps (MAIN_ERROR_DOMAIN): the keys only
 * main.c applies, and the start-up's.  Nothing outside this file reads
 * them, so they are named here rather than in a header. */
typedef enum {
   MAIN_ERR_LOGGING = 1, /* log_level, log_format or log_file cannot be applied */
   MAIN_ERR_EVENT_LOOP,  /* the event loop cannot be made */
   MAIN_ERR_STANDALONE,  /* the upstream is a standalone mongod: refused */
   MAIN_ERR_EVENTS,      /* a signal handler or a timer cannot be installed */
} main_error_t;

/* Exit codes, as --help documents them. */
enum {
   EXIT_OK = 0,
   EXIT_FAILURE_RUNTIME = 1, /* config, upstream, TLS or listen error */
   EXIT_USAGE = 2,           /* bad command line */
};

/* The stop signal that arrived while no libevent signal event was installed
 * (start-up, teardown); 0 when none.  Written by early_signal_handler only. */
static volatile sig_atomic_t early_stop_signal;

/* Everything the process owns; freed in reverse order by proxy_teardown. */
typedef struct {
   const char *config_path;
   config_t *cfg; /* our reference to the current snapshot */
   struct event_base *base;
   loopwake_t *wake; /* other threads' way into the loop */
   topology_t *topo;
   tls_upstream_t *tls;
   SSL_CTX *server_tls;
   loops_t *loops; /* the forwarding loops */
   listener_t *listener;
   struct event *sig_hup, *sig_term, *sig_int, *sig_usr1;
   struct event *watchdog; /* WATCHDOG=1 to the service manager, from this loop */
   struct event *extend;   /* EXTEND_TIMEOUT_USEC while the start waits for a primary */
   bool stopping;
   bool closed; /* a second stop signal closed every connection */
   bool ready_sent; /* READY=1 sent: listening, and the primary known */
   int exit_code;
} proxy_t;

static void
usage (FILE *out)
{
   fprintf (out,
            "Usage: relaybus-proxy -c FILE [--check-config [--quiet]]\n"
            "       relaybus-proxy --make-user NAME <PASSWORD\n"
            "       relaybus-proxy --version | --help\n"
            "\n"
            "A MongoDB wire-protocol proxy with a transactional outbox.\n"
            "Runs in the foreground and logs to standard error.\n"
            "\n"
            "  -c, --config FILE   the INI configuration (required)\n"
            "      --check-config  load and validate FILE, print the effective\n"
            "                      configuration (credentials and header values\n"
            "                      masked), and exit\n"
            "      --quiet         with --check-config: print only errors and\n"
            "                      warnings, not the configuration\n"
            "      --make-user NAME  read NAME's password from standard input (one\n"
            "                      line, not echoed on a terminal), print its\n"
            "                      auth-file entries (SCRAM-SHA-256 and SCRAM-SHA-1\n"
            "                      keys, never the password) and exit\n"
            "  -V, --version       print the version and exit\n"
            "  -h, --help          print this help and exit\n"
            "\n"
            "Signals: SIGHUP reloads the configuration (all or nothing);\n"
            "SIGUSR1 reopens log_file at its path (after logrotate moved it);\n"
            "SIGTERM and SIGINT stop accepting, let requests in flight finish\n"
            "for up to drain_timeout_ms, then exit; a second one closes\n"
            "everything at once.  A SIGHUP while stopping is logged and ignored.\n"
            "SIGPIPE is ignored (a peer that went away is a write error).\n"
            "SIGQUIT is not handled: it exits at once with a core dump.\n"
            "\n"
            "Exit codes:\n"
            "  0  clean exit (after a drain), a valid --check-config, or the\n"
            "     entries of --make-user printed\n"
            "  1  configuration, upstream (e.g. a standalone mongod), TLS or\n"
            "     listen error; the reason is logged\n"
            "  2  command-line usage error, or for --make-user a bad NAME or an\n"
            "     empty or overlong password, or one SASLprep refuses\n"
            "\n"
            "Report bugs at " PACKAGE_BUGREPORT "\n");
}

/* Applies log_level, log_format and (with open_file) log_file: all or
 * nothing, so a log_file that cannot be opened leaves everything as it was. */
static bool
apply_logging (const config_t *cfg, bool open_file, bson_error_t *error)
{
   log_level_t level;
   log_format_t format;
   char why[256];

   if (!log_level_parse (cfg->log_level, &level)) {
      bson_set_error (error, MAIN_ERROR_DOMAIN, MAIN_ERR_LOGGING, "unknown log_level '%s'", cfg->log_level);
      return false;
   }
   if (!log_format_parse (cfg->log_format, &format)) {
      bson_set_error (error, MAIN_ERROR_DOMAIN, MAIN_ERR_LOGGING, "unknown log_format '%s'", cfg->log_format);
      return false;
   }
   if (open_file && !log_set_file (cfg->log_file, why, sizeof why)) {
      /* `why` names the path. */
      bson_set_error (error, MAIN_ERROR_DOMAIN, MAIN_ERR_LOGGING, "[proxy] log_file: %s", why);
      return false;
   }
   log_set_level (level);
   log_set_format (format);
   return true;
}

/* Every log line's masking of credentials (base/log.h): the
 * configuration's, of free text. */
static char *
mask_log_text (const char *text)
{
   return config_mask (NULL, text);
}

/* mongoc warns "Error in abortTransaction: ..." whenever the abort that
 * ends a failed transaction fails: typically NoSuchTransaction, the
 * server having aborted the transaction itself at the write conflict that
 * failed it.  The store reports that failure on its own; a transaction
 * that keeps meeting another client's open transaction (a consumer killed
 * inside its own, until the server ends it) would repeat the warning
 * several times a second.  One a minute is logged, saying how many were
 * left out since; the others at debug. */
#define MONGOC_ABORT_WARNING "Error in abortTransaction"
#define MONGOC_ABORT_LOG_MS 60000

static bool
abort_warning_due (uint64_t *left_out)
{
   static atomic_int_fast64_t last; /* clock_mono_ms of the last one logged; 0: none yet */
   static atomic_uint_fast64_t skipped;
   int_fast64_t now = clock_mono_ms (), prev = atomic_load (&last);

   if ((prev != 0 && now - prev < MONGOC_ABORT_LOG_MS) || !atomic_compare_exchange_strong (&last, &prev, now ? now : 1)) {
      atomic_fetch_add (&skipped, 1);
      return false;
   }
   *left_out = atomic_exchange (&skipped, 0);
   return true;
}

/* mongo-c-driver logs through its own handler to stderr by default; route
 * it through ours so every line has one format and obeys log_level.  Its
 * DEBUG lines (monitoring retries every half second while the upstream is
 * down) would drown everything else, so they only show at debug. */
static void
proxy_mongoc_log (mongoc_log_level_t level, const char *domain, const char *message, void *user_data)
{
   uint64_t left_out = 0;

   if (level == MONGOC_LOG_LEVEL_WARNING && !strncmp (message, MONGOC_ABORT_WARNING, strlen (MONGOC_ABORT_WARNING))) {
      if (abort_warning_due (&left_out))
         log_warn ("mongoc %s: %s (%" PRIu64 " like it left out since the last one logged; at most one a minute is)", domain,
                   message, left_out);
      else
         log_debug ("mongoc %s: %s", domain, message);
      return;
   }
   switch (level) {
   case MONGOC_LOG_LEVEL_ERROR:
   case MONGOC_LOG_LEVEL_CRITICAL:
      log_error ("mongoc %s: %s", domain, message);
      break;
   case MONGOC_LOG_LEVEL_WARNING:
      log_warn ("mongoc %s: %s", domain, message);
      break;
   case MONGOC_LOG_LEVEL_MESSAGE:
   case MONGOC_LOG_LEVEL_INFO:
      log_info ("mongoc %s: %s", domain, message);
      break;
   case MONGOC_LOG_LEVEL_DEBUG:
      log_debug ("mongoc %s: %s", domain, message);
      break;
   default: /* TRACE: never */
      break;
   }
}

/* ------------------------------------------------------------ signals */

/* Installed before the loop's signal events exist; libevent saves it when
 * it installs its own and puts it back when they are freed, so a signal
 * during start-up or teardown never takes its default, fatal action. */
static void
early_signal_handler (int sig)
{
   if (sig == SIGTERM || sig == SIGINT)
      early_stop_signal = sig;
}

static bool
install_early_handlers (void)
{
   struct sigaction sa;

   memset (&sa, 0, sizeof sa);
   sa.sa_handler = early_signal_handler;
   sa.sa_flags = SA_RESTART;
   sigemptyset (&sa.sa_mask);
   return sigaction (SIGHUP, &sa, NULL) == 0 && sigaction (SIGTERM, &sa, NULL) == 0 &&
          sigaction (SIGINT, &sa, NULL) == 0 && sigaction (SIGUSR1, &sa, NULL) == 0;
}

static void
proxy_reload (proxy_t *p)
{
   bson_error_t error;
   config_t *next;

   /* Draining: there is no listener to resize, and after a second stop
    * signal no client loop either; a new snapshot would serve nobody. */
   if (p->stopping) {
      log_warn ("SIGHUP while stopping: reload ignored");
      return;
   }
   next = config_load (p->config_path, &error);
   if (!next) {
      log_error ("reload: keeping the current configuration: %s", error.message);
      return;
   }
   if (!config_reload_allowed (p->cfg, next, &error) || !apply_logging (next, true, &error)) {
      log_error ("reload: keeping the current configuration: %s", error.message);
      config_release (next);
      return;
   }
   /* Whole snapshot or nothing: from here on nothing can fail. */
   (void) notify_send ("RELOADING=1");
   config_release (p->cfg);
   p->cfg = next;
   config_publish (config_retain (next));
   dispatch_reload (next);
   loops_set_config (p->loops, next);
   listener_set_max_clients (p->listener, next->max_clients);
   log_info ("reloaded %s (existing connections keep their settings)", p->config_path);
   (void) notify_send ("READY=1");
}

static void
proxy_drained (void *arg)
{
   proxy_t *p = arg;
   log_info ("all connections closed; exiting");
   event_base_loopexit (p->base, NULL);
}

static void
proxy_stop (proxy_t *p, const char *why)
{
   if (p->stopping) {
      if (p->closed) {
         log_warn ("%s again: already closing everything", why);
         return;
      }
      log_warn ("%s again: closing everything now", why);
      loops_close_all (p->loops);
      p->closed = true;
      event_base_loopexit (p->base, NULL);
      return;
   }
   p->stopping = true;
   log_info ("%s: draining", why);
   (void) notify_send ("STOPPING=1\nSTATUS=draining");
   listener_destroy (p->listener);
   p->listener = NULL;
   consumer_drain (); /* long polls answer now instead of holding their connections */
   loops_drain (p->loops, p->cfg->drain_timeout_ms, proxy_drained, p);
}

static void
proxy_signal_cb (evutil_socket_t sig, short what, void *arg)
{
   proxy_t *p = arg;

   if (sig == SIGHUP) {
      proxy_reload (p);
   } else if (sig == SIGUSR1) {
      /* logrotate moved the file: continue in a new one at that path. */
      log_reopen ();
      log_info ("SIGUSR1: log file reopened");
   } else
      proxy_stop (p, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ------------------------------------------------------------ service manager */

/* READY=1 once the proxy listens and knows the primary (base/notify.h). */
static void
proxy_notify_ready (proxy_t *p)
{
   topology_primary_t snap;
   char state[512];

   if (p->ready_sent || !p->listener || p->stopping || !notify_enabled ())
      return;
   topology_get_primary (p->topo, &snap);
   if (snap.state != TOPOLOGY_STATE_PRIMARY)
      return;
   snprintf (state, sizeof state, "READY=1\nSTATUS=listening on %s, primary %s:%u", listener_address (p->listener),
             snap.host, (unsigned) snap.port);
   p->ready_sent = notify_send (state);
}

/* While the start waits for a primary (MongoDB down at boot), the service
 * manager's start timeout (TimeoutStartSec, 90 s by default) would kill the
 * proxy and restart it over and over: each PROXY_EXTEND_MS the loop asks
 * for PROXY_EXTEND_USEC more (EXTEND_TIMEOUT_USEC, systemd 236 and later),
 * so the start lasts as long as the proxy is alive and waiting, and a
 * proxy that hangs still times out.  Stops once READY=1 is sent. */
#define PROXY_EXTEND_MS 10000
#define PROXY_EXTEND_USEC "30000000"
static void
proxy_extend_cb (evutil_socket_t fd, short what, void *arg)
{
   proxy_t *p = arg;
   topology_primary_t snap;
   char state[512];

   (void) fd;
   (void) what;
   if (p->ready_sent || p->stopping) {
      event_del (p->extend);
      return;
   }
   topology_get_primary (p->topo, &snap);
   snprintf (state, sizeof state, "EXTEND_TIMEOUT_USEC=" PROXY_EXTEND_USEC "\nSTATUS=waiting for a primary: %s",
             snap.last_error[0] ? snap.last_error : "no member answered yet");
   (void) notify_send (state);
}

/* Runs on loop 0, and sends only when every other loop answered the
 * previous round's ping (proxy/loops.h): a loop that stopped turning, any
 * of them, stops the pings and the service manager restarts the proxy. */
static void
proxy_watchdog_cb (evutil_socket_t fd, short what, void *arg)
{
   proxy_t *p = arg;

   (void) fd;
   (void) what;
   if (p->loops && !loops_ping (p->loops)) {
      log_warn ("watchdog: a forwarding loop did not answer in %" PRId64 " ms; WATCHDOG=1 withheld",
                notify_watchdog_ms () / 2);
      return;
   }
   (void) notify_send ("WATCHDOG=1");
}

/* ------------------------------------------------------------ topology */

static void
proxy_topology_changed (void *arg)
{
   proxy_t *p = arg;
   topology_primary_t snap;

   topology_get_primary (p->topo, &snap);
   if (snap.state == TOPOLOGY_STATE_STANDALONE) {
      /* Found late (the upstream was down at start-up): same refusal. */
      log_error ("upstream refused: %s", snap.last_error);
      p->exit_code = EXIT_FAILURE_RUNTIME;
      event_base_loopbreak (p->base);
      return;
   }
   if (p->loops && !p->closed)
      loops_topology_changed (p->loops);
   proxy_notify_ready (p);
}

/* ------------------------------------------------------------ lifecycle */

/* The publish wake hook: a commit that carried events wakes the
 * dispatcher and the pull consumers' long polls. */
static void
proxy_commit_wake (void)
{
   dispatch_wake ();
   consumer_wake ();
}

static bool
proxy_start (proxy_t *p, bson_error_t *error)
{
   topology_state_t state;
   topology_primary_t snap;

   /* Loop 0's base, without locks: nothing but this thread touches it
    * (other threads post through p->wake). */
   p->base = loops_base_new ();
   if (!p->base) {
      bson_set_error (error, MAIN_ERROR_DOMAIN, MAIN_ERR_EVENT_LOOP, "cannot create the event loop");
      return false;
   }
   p->wake = loopwake_new (p->base, error);
   if (!p->wake)
      return false;
   if (!tls_upstream_new (&p->cfg->upstream_tls, &p->tls, error))
      return false;
   if (!tls_server_new (p->cfg->tls_cert_file, p->cfg->tls_key_file, p->cfg->tls_ca_file, &p->server_tls, error))
      return false;
   p->topo = topology_new (p->wake, p->cfg->upstream, p->cfg->upstream_connect_timeout_ms, proxy_topology_changed, p, error);
   if (!p->topo || !topology_start (p->topo, error))
      return false;

   /* A little longer than one selection attempt, so the first answer is seen. */
   state = topology_wait_first (p->topo, p->cfg->upstream_connect_timeout_ms + 1000);
   topology_get_primary (p->topo, &snap);
   if (state == TOPOLOGY_STATE_STANDALONE) {
      bson_set_error (error, MAIN_ERROR_DOMAIN, MAIN_ERR_STANDALONE, "%s", snap.last_error);
      return false;
   }
   if (state != TOPOLOGY_STATE_PRIMARY)
      log_warn ("upstream not reachable yet (%s); listening anyway, clients wait up to %" PRId64 " ms for a primary",
                snap.last_error[0] ? snap.last_error : "no answer",
                p->cfg->upstream_connect_timeout_ms);
   /* The span exporter before the first span: the dispatcher's and the
    * loops' (a thread of its own, when [tracing] otlp_endpoint is set). */
   if (!trace_start (&(trace_options_t){.otlp_endpoint = p->cfg->tracing_otlp_endpoint,
                                        .sample = p->cfg->tracing_sample,
                                        .service_name = p->cfg->tracing_service_name,
                                        .resource_attributes = p->cfg->tracing_resource_attributes},
                     error))
      return false;
   /* The outbox setup, and the dispatcher on its own thread when enabled. */
   if (!dispatch_start (p->cfg, error))
      return false;
   /* The fleet's handler set before the listener: the first events a client
    * publishes get deliveries for every handler of the fleet, not only
    * this proxy's.  Bounded, as the wait for the primary, and not at all
    * without one (the dispatcher cannot read it either): the proxy then
    * listens anyway, refuses publishes (transiently) until the dispatcher
    * has read the set, and /readyz says why. */
   if (state != TOPOLOGY_STATE_PRIMARY ||
       !fleet_wait_first (p->cfg->upstream_connect_timeout_ms + p->cfg->handler_heartbeat_ms))
      log_warn ("the fleet's handler set is not read yet; listening anyway, publishes are refused until it is");
   /* The publishing path wakes the dispatcher after a commit it injected
    * into. */
   publish_set_wake_hook (proxy_commit_wake);
   /* The forwarding loops, each with its decoding thread for big requests
    * and the publishing hook (annotated statements, relaybus* commands,
    * commit wake-ups); loops 1.. start their threads here, with nothing to
    * do until the listener hands them connections. */
   p->loops = loops_new (p->base, p->wake, loops_wanted (p->cfg), p->topo, p->tls, p->cfg, publish_request_hook, error);
   if (!p->loops)
      return false;
   /* The pull consumers' thread, when a handler is kind = pull; a loop
    * hands it its connections' commands and gets the answers through its
    * own wake. */
   if (!consumer_start (p->cfg, loops_wakes (p->loops), loops_count (p->loops), pull_answer, error))
      return false;
   pull_set_consumer (consumer_submit, consumer_closed, consumer_settled);
   /* The admin port, on its own thread. */
   if (!admin_start (p->cfg, p->topo, error))
      return false;
   p->listener = listener_new (p->base, p->cfg->listen, p->loops, p->server_tls, error);
   if (!p->listener)
      return false;
   listener_set_max_clients (p->listener, p->cfg->max_clients);

   p->sig_hup = evsignal_new (p->base, SIGHUP, proxy_signal_cb, p);
   p->sig_term = evsignal_new (p->base, SIGTERM, proxy_signal_cb, p);
   p->sig_int = evsignal_new (p->base, SIGINT, proxy_signal_cb, p);
   p->sig_usr1 = evsignal_new (p->base, SIGUSR1, proxy_signal_cb, p);
   if (!p->sig_hup || !p->sig_term || !p->sig_int || !p->sig_usr1 || evsignal_add (p->sig_hup, NULL) != 0 ||
       evsignal_add (p->sig_term, NULL) != 0 || evsignal_add (p->sig_int, NULL) != 0 ||
       evsignal_add (p->sig_usr1, NULL) != 0) {
      bson_set_error (error, MAIN_ERROR_DOMAIN, MAIN_ERR_EVENTS, "cannot install signal handlers");
      return false;
   }
   {
      char sid[25];

      /* The serviceId names this process to drivers in load-balanced mode
       * (their events and errors show it): the line to find it by. */
      bson_oid_to_string (instance_service_id (), sid);
      log_info ("relaybus-proxy %s listening on %s%s, upstream %s, serviceId %s",
                PACKAGE_VERSION,
                listener_address (p->listener),
                p->server_tls ? " (TLS)" : "",
                p->tls ? "with TLS" : "without TLS",
                sid);
   }
   if (tls_upstream_withholds_cert (p->tls))
      log_info ("upstream tlsCertificateKeyFile: presented only on the proxy's own connections (topology, outbox "
                "store, dispatch, admin); client connections present no certificate and MONGODB-X509 from "
                "clients is refused");
#ifdef RELAYBUS_TEST_COMMANDS
   log_warn ("test build (--enable-test-commands): relaybusDebugInternal sends commands past the publishing hook; never run this build in production");
#endif
   if (notify_watchdog_ms () > 0) {
      struct timeval tv = clock_timeval_ms (notify_watchdog_ms () / 2 > 0 ? notify_watchdog_ms () / 2 : 1);
      p->watchdog = event_new (p->base, -1, EV_PERSIST, proxy_watchdog_cb, p);
      if (!p->watchdog || event_add (p->watchdog, &tv) != 0) {
         bson_set_error (error, MAIN_ERROR_DOMAIN, MAIN_ERR_EVENTS, "cannot start the service watchdog timer");
         return false;
      }
      log_info ("service watchdog: WATCHDOG=1 every %" PRId64 " ms", notify_watchdog_ms () / 2);
   }
   proxy_notify_ready (p);
   if (notify_enabled () && !p->ready_sent) {
      struct timeval tv = clock_timeval_ms (PROXY_EXTEND_MS);
      p->extend = event_new (p->base, -1, EV_PERSIST, proxy_extend_cb, p);
      if (!p->extend || event_add (p->extend, &tv) != 0) {
         bson_set_error (error, MAIN_ERROR_DOMAIN, MAIN_ERR_EVENTS, "cannot start the start-timeout extension timer");
         return false;
      }
      proxy_extend_cb (-1, 0, p); /* at once, then every PROXY_EXTEND_MS */
   }
   /* A stop asked for while starting: drain (nothing to drain yet) and exit. */
   if (early_stop_signal)
      proxy_stop (p, early_stop_signal == SIGINT ? "SIGINT during start-up" : "SIGTERM during start-up");
   return true;
}

static void
proxy_teardown (proxy_t *p)
{
   admin_stop (); /* before the topology it reads */
   /* No loop thread runs from here on, so what follows changes nothing a
    * loop reads; the consumer may still post to the loops' wakes, which
    * stay until loops_destroy. */
   listener_destroy (p->listener);
   p->listener = NULL;
   loops_stop (p->loops);
   publish_set_wake_hook (NULL);
   dispatch_stop (); /* hands its lanes back */
   pull_set_consumer (NULL, NULL, NULL);
   consumer_stop (); /* hands its lanes back; before the loopwake it posts to */
   trace_stop ();    /* after every thread that emits spans; sends what is queued */
   loops_destroy (p->loops);
   /* The topology monitor may still post to the loop: join it before freeing the
    * loopwake and the base. */
   topology_destroy (p->topo);
   loopwake_destroy (p->wake);
   if (p->sig_hup)
      event_free (p->sig_hup);
   if (p->sig_term)
      event_free (p->sig_term);
   if (p->sig_int)
      event_free (p->sig_int);
   if (p->sig_usr1)
      event_free (p->sig_usr1);
   if (p->watchdog)
      event_free (p->watchdog);
   if (p->extend)
      event_free (p->extend);
   tls_upstream_destroy (p->tls);
   SSL_CTX_free (p->server_tls);
   if (p->base)
      event_base_free (p->base);
   config_release (p->cfg);
}

/* How long the exit waits for the teardown once the upstream is gone, and
 * how long the upstream gets to accept a connection to tell (below). */
#define PROXY_EXIT_UPSTREAM_GONE_MS 1000
#define PROXY_EXIT_PROBE_MS 250

static void *
proxy_teardown_thread (void *arg)
{
   proxy_teardown (arg);
   return NULL;
}

/* Runs proxy_teardown, bounded when the upstream is gone.  What the teardown
 * sends upstream (the dispatcher's claim in flight, the hand-back of its
 * lanes, the fleet's stop record, the driver's endSessions when a pool is
 * destroyed) waits for a server selection each, one after the other: about
 * ten seconds in all when no server will answer, for writes that cannot
 * land and whose effect comes by itself anyway (the lanes return after
 * lease_ms, the instance stops counting as live after three heartbeats, the
 * server ends idle sessions).  So after a stop, when the last primary
 * refuses connections (or does not accept one within PROXY_EXIT_PROBE_MS),
 * the teardown runs on a thread of its own for at most
 * PROXY_EXIT_UPSTREAM_GONE_MS.  An upstream that answers keeps the
 * unbounded teardown: requests in flight and their completions are never
 * cut while they can still land.  Returns false when the teardown was left
 * running: the caller then ends the process at once, without the global
 * cleanups whose state the teardown's threads may still be using. */
static bool
proxy_teardown_bounded (proxy_t *p)
{
   pthread_t thread;
   struct timespec deadline;

   if (!p->stopping || !p->topo || topology_primary_answers (p->topo, PROXY_EXIT_PROBE_MS)) {
      proxy_teardown (p);
      return true;
   }
   log_warn ("exit: the upstream's primary does not accept connections: waiting at most %d ms for the "
             "dispatcher and the upstream connections to stop",
             PROXY_EXIT_UPSTREAM_GONE_MS);
   if (pthread_create (&thread, NULL, proxy_teardown_thread, p) != 0) {
      proxy_teardown (p);
      return true;
   }
   clock_gettime (CLOCK_REALTIME, &deadline);
   deadline.tv_sec += PROXY_EXIT_UPSTREAM_GONE_MS / 1000;
   deadline.tv_nsec += (long) (PROXY_EXIT_UPSTREAM_GONE_MS % 1000) * 1000000L;
   if (deadline.tv_nsec >= 1000000000L) {
      deadline.tv_sec++;
      deadline.tv_nsec -= 1000000000L;
   }
   if (pthread_timedjoin_np (thread, NULL, &deadline) == 0)
      return true;
   log_warn ("exit: the upstream is gone: not waiting for the writes that cannot reach it (held lanes return "
             "after lease_ms; the fleet sees this instance stop after three heartbeats)");
   return false;
}

/* With several forwarding loops, one malloc arena for the whole process.
 * glibc gives each thread an arena of its own; a loop's connections then
 * allocate from its arena only, and the room one loop freed after a burst
 * of large messages stays in that arena, unused by the others, so RSS
 * grows past max_buffered_bytes with the number of loops (the 40 MB
 * requests of tests/integration/proxy/memory-bound.test.js: a peak of
 * 368 MiB at 4 loops, against 240 MiB with one arena and 194 MiB with one
 * loop).  One arena costs a lock per allocation; docs/benchmarks.md has
 * what it costs per request.  An operator's MALLOC_ARENA_MAX wins. */
static void
set_malloc_arenas (unsigned loops)
{
#ifdef M_ARENA_MAX
   /* A sanitizer's allocator refuses it, and has no arenas to spread. */
   if (loops > 1 && !getenv ("MALLOC_ARENA_MAX") && mallopt (M_ARENA_MAX, 1) != 1)
      log_info ("start-up: mallopt (M_ARENA_MAX, 1) refused (not glibc's allocator?); with %u loops RSS may grow "
                "past max_buffered_bytes after bursts of large messages",
                loops);
#else
   (void) loops;
#endif
}

/* --make-user NAME: the auth-file entries of NAME for the password on
 * standard input.  The password is cleared as soon as the keys exist. */
static int
make_user (const char *name)
{
   char password[AUTHFILE_MAX_PASSWORD + 2];
   authfile_user_t user;
   bson_error_t error;
   char *lines;
   bool ok;

   if (!authfile_name_valid (name, &error)) {
      fprintf (stderr, "relaybus-proxy: --make-user: %s\n", error.message);
      return EXIT_USAGE;
   }
   if (isatty (STDIN_FILENO))
      fprintf (stderr, "Password for %s: ", name);
   if (!authfile_read_password (stdin, password, sizeof password, &error)) {
      fprintf (stderr, "relaybus-proxy: --make-user: %s\n", error.message);
      return EXIT_USAGE;
   }
   ok = scram_make_user (name, password, &user, &error);
   OPENSSL_cleanse (password, sizeof password);
   if (!ok) {
      fprintf (stderr, "relaybus-proxy: --make-user: %s\n", error.message);
      return error.domain == SCRAM_ERROR_DOMAIN && error.code == SCRAM_ERR_CRYPTO ? EXIT_FAILURE_RUNTIME
                                                                                  : EXIT_USAGE;
   }
   lines = authfile_format_user (&user);
   OPENSSL_cleanse (&user, sizeof user);
   fputs (lines, stdout);
   bson_free (lines);
   return fflush (stdout) == 0 ? EXIT_OK : EXIT_FAILURE_RUNTIME;
}

int
main (int argc, char **argv)
{
   static const struct option longopts[] = {
      {"config", required_argument, NULL, 'c'},
      {"check-config", no_argument, NULL, 'C'},
      {"quiet", no_argument, NULL, 'Q'},
      {"version", no_argument, NULL, 'V'},
      {"help", no_argument, NULL, 'h'},
      {"make-user", required_argument, NULL, 'U'},
      {NULL, 0, NULL, 0},
   };
   proxy_t p = {0};
   bool check_only = false, quiet = false;
   const char *make_user_name = NULL;
   bson_error_t error;
   int opt;

   log_set_mask (mask_log_text);
   log_set_thread_name ("main");
   /* The key of the tables that hash client-chosen keys: drawn now, before
    * any thread, so that a missing entropy source stops the start. */
   keyhash_init ();
   while ((opt = getopt_long (argc, argv, "c:Vh", longopts, NULL)) != -1) {
      switch (opt) {
      case 'c':
         p.config_path = optarg;
         break;
      case 'C':
         check_only = true;
         break;
      case 'Q':
         quiet = true;
         break;
      case 'U':
         make_user_name = optarg;
         break;
      case 'V':
#ifdef RELAYBUS_TEST_COMMANDS
         printf ("relaybus-proxy %s (test build: --enable-test-commands)\n", PACKAGE_VERSION);
#else
         printf ("relaybus-proxy %s\n", PACKAGE_VERSION);
#endif
         return EXIT_OK;
      case 'h':
         usage (stdout);
         return EXIT_OK;
      default:
         usage (stderr);
         return EXIT_USAGE;
      }
   }
   if (optind < argc) {
      fprintf (stderr, "relaybus-proxy: unexpected argument '%s'\n", argv[optind]);
      usage (stderr);
      return EXIT_USAGE;
   }
   if (quiet && !check_only) {
      fprintf (stderr, "relaybus-proxy: --quiet goes with --check-config\n");
      usage (stderr);
      return EXIT_USAGE;
   }
   if (make_user_name)
      return make_user (make_user_name);
   if (!p.config_path) {
      fprintf (stderr, "relaybus-proxy: -c FILE is required (etc/relaybus-proxy.ini is a commented sample)\n");
      usage (stderr);
      return EXIT_USAGE;
   }

   /* The configuration's checks that belong to other layers. */
#ifdef RELAYBUS_HAVE_KAFKA
   config_set_checks (
      &(config_checks_t){compress_offerable, webhook_secrets_valid, kafka_property_valid, webhook_tls_files_valid,
                         webhook_header_valid, webhook_proxy_valid});
#else
   config_set_checks (&(config_checks_t){compress_offerable, webhook_secrets_valid, NULL, webhook_tls_files_valid,
                                         webhook_header_valid, webhook_proxy_valid});
#endif
   if (!install_early_handlers ()) {
      log_error ("start-up: cannot install signal handlers");
      return EXIT_FAILURE_RUNTIME;
   }
   p.cfg = config_load (p.config_path, &error);
   if (!p.cfg) {
      log_error ("configuration: %s", error.message);
      return EXIT_FAILURE_RUNTIME;
   }
   if (!apply_logging (p.cfg, !check_only, &error)) {
      log_error ("configuration: %s", error.message);
      config_release (p.cfg);
      return EXIT_FAILURE_RUNTIME;
   }
   if (check_only) {
      /* A warning, not an error: the file is valid, its mode is the
       * operator's call (docs/configuration.md, Secrets). */
      (void) config_warn_exposed_secrets (p.cfg);
      if (!quiet)
         config_write (p.cfg, stdout);
      config_release (p.cfg);
      return EXIT_OK;
   }
   /* Before any other thread exists, so that every thread obeys it. */
   set_malloc_arenas (loops_wanted (p.cfg));
   /* From here on no thread waits for the log destination (base/log.h). */
   if (!log_start ()) {
      log_error ("start-up: cannot start the log writer thread");
      config_release (p.cfg);
      return EXIT_FAILURE_RUNTIME;
   }
   config_publish (config_retain (p.cfg));

   /* A peer that closes while we write must not kill the process. */
   signal (SIGPIPE, SIG_IGN);
   /* Locks for the dispatcher's and the admin thread's own bases, which
    * other threads still poke with event_active (dispatch_wake from the
    * forwarding loop, dispatch_stop and admin_stop from this thread).  The
    * forwarding loop's base opts out with EVENT_BASE_FLAG_NOLOCK. */
   evthread_use_pthreads ();
   mongoc_log_set_handler (proxy_mongoc_log, NULL);
   mongoc_init ();
   /* Before any thread uses libcurl (the dispatcher's webhooks). */
   if (curl_global_init (CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      log_error ("start-up: libcurl cannot be initialised");
      config_release (p.cfg);
      return EXIT_FAILURE_RUNTIME;
   }

   p.exit_code = EXIT_OK;
   (void) notify_init (); /* a bad NOTIFY_SOCKET is logged, not fatal */
   if (!proxy_start (&p, &error)) {
      log_error ("start-up: %s", error.message);
      p.exit_code = EXIT_FAILURE_RUNTIME;
   } else {
      event_base_dispatch (p.base);
   }
   if (!proxy_teardown_bounded (&p)) {
      /* The teardown thread still holds the upstream pools: no mongoc_cleanup
       * under it.  The log is flushed first; its later lines go to the log's
       * file descriptor directly (base/log.h). */
      log_info ("exit %d", p.exit_code);
      log_close ();
      _exit (p.exit_code);
   }
   notify_close ();
   /* Drop the published snapshot too, so nothing is left at exit. */
   config_publish (NULL);
   mongoc_cleanup ();
   curl_global_cleanup ();
   libevent_global_shutdown ();
   log_info ("exit %d", p.exit_code);
   log_close (); /* the queued lines are written before the process ends */
   return p.exit_code;
}
