/*
 * base/topology.c - the primary-finding monitor thread.
 *
 * mongoc_client_pool runs its own monitoring threads, so a selection on a
 * known topology returns at once; the monitor simply selects a writable
 * server every few seconds (to notice a failover before any client hits
 * it), at once when the loop asks, and with a backoff while the upstream is
 * unreachable.  Each attempt is bounded by serverSelectionTimeoutMS, which
 * the monitor sets on its own copy of the URI so that shutdown never waits
 * for the driver's 30-second default.
 *
 * This module never touches client connections: it publishes a snapshot
 * and pokes the loop through its loopwake (never its event base, which has
 * no locks).  All blocking (selection, getaddrinfo) happens here.
 */
#include "base/topology.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mongoc/mongoc.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/worker.h"

/* Re-select this often even without a request: catches failovers early. */
#define TOPOLOGY_PERIOD_MS 5000
#define TOPOLOGY_RETRY_MIN_MS 250
#define TOPOLOGY_RETRY_MAX_MS 5000
#define TOPOLOGY_HEARTBEAT_MS 1000
/* Quick looks (at the retry backoff: 250, 500, 1000, 2000 ms) after an
 * asked-for look that changed nothing (topology_t.rechecks). */
#define TOPOLOGY_RECHECKS 4

/* Owned by the loop thread that created it; the monitor only touches the
 * fields under `mutex` and the pool (monitor-only after start). */
struct topology {
   loopwake_t *wake;           /* borrowed: the loop's */
   atomic_bool notify_pending; /* a notice is posted and has not run yet */
   topology_changed_cb_t on_changed;
   void *ctx;

   mongoc_client_pool_t *pool;
   pthread_t thread;
   bool started;

   pthread_mutex_t mutex;
   pthread_cond_t cond;     /* monitor waits on it; start-up waits on it too */
   bool stop;               /* under mutex */
   bool refresh;            /* under mutex: the loop asked for a fresh look */
   /* Monitor thread only: quick looks left after an asked-for look that
    * found the same member.  A loop asks when a connection to the member
    * was lost, often in the same instant as mongoc's own monitor learns
    * it: a mongos that went away is still listed as one (and kept, see
    * topology_keep_mongos) until that monitor's next check, and the
    * connections waiting for another one would wait out
    * TOPOLOGY_PERIOD_MS. */
   int rechecks;
   bool first_done;         /* under mutex: first attempt finished */
   bool suspect;            /* under mutex: a primary is published only once its hello says writable */
   topology_primary_t snap; /* under mutex */
};

static const char *const state_names[TOPOLOGY_STATE_COUNT_] = {
   [TOPOLOGY_STATE_UNKNOWN] = "unknown",
   [TOPOLOGY_STATE_PRIMARY] = "primary",
   [TOPOLOGY_STATE_STANDALONE] = "standalone",
};

const char *
topology_state_name (topology_state_t state)
{
   return (unsigned) state < TOPOLOGY_STATE_COUNT_ ? state_names[state] : "invalid";
}

/* On the loop.  The flag is cleared before the snapshot is read, so a
 * change published after this read posts a new notice. */
static void
topology_notify_cb (void *arg)
{
   topology_t *topo = arg;

   atomic_store (&topo->notify_pending, false);
   topo->on_changed (topo->ctx);
}

/* On the monitor: one notice in the loop's queue at a time. */
static void
topology_notify (topology_t *topo)
{
   if (atomic_exchange (&topo->notify_pending, true))
      return;
   if (!loopwake_post (topo->wake, topology_notify_cb, topo)) {
      /* Only when others flood the queue; the next change tries again. */
      atomic_store (&topo->notify_pending, false);
      log_warn ("topology: the loop's wake-up queue is full; a change notice was dropped");
   }
}

topology_t *
topology_new (loopwake_t *wake,
              const char *uri,
              int64_t select_timeout_ms,
              topology_changed_cb_t on_changed,
              void *ctx,
              bson_error_t *error)
{
   /* One attempt must end soon: the monitor retries on its own, and
    * shutdown joins the monitor; so the timeout is set even over the URI's.
    * The monitor sends no operations through the driver, so the driver only
    * learns of a step-down from its heartbeat (10 s by default when
    * pooled).  A re-selection asked for after a "not primary" error must
    * see the new primary soon: check each member every second, unless the
    * URI says otherwise.  An appName in the URI is kept. */
   const worker_pool_opts_t po = {
      .appname = "relaybus-proxy",
      .keep_uri_appname = true,
      .server_selection_ms =
         (int32_t) (select_timeout_ms < 500 ? 500 : select_timeout_ms > 5000 ? 5000 : select_timeout_ms),
      .force_server_selection = true,
      .heartbeat_ms = TOPOLOGY_HEARTBEAT_MS,
   };
   topology_t *topo = NULL;
   mongoc_client_pool_t *pool = worker_pool_new (uri, &po, "topology", error);

   if (!pool)
      return NULL;
   topo = bson_malloc0 (sizeof *topo);
   topo->wake = wake;
   atomic_init (&topo->notify_pending, false);
   topo->on_changed = on_changed;
   topo->ctx = ctx;
   topo->pool = pool;
   pthread_mutex_init (&topo->mutex, NULL);
   pthread_cond_init (&topo->cond, NULL);
   return topo;
}

/* Resolves on the monitor: the loop must never call getaddrinfo. */
static bool
topology_resolve (const char *host, uint16_t port, topology_primary_t *out, bson_error_t *error)
{
   struct addrinfo hints = {0}, *res = NULL;
   char portstr[8];
   int rc;

   hints.ai_family = AF_UNSPEC;
   hints.ai_socktype = SOCK_STREAM;
   snprintf (portstr, sizeof portstr, "%u", (unsigned) port);
   rc = getaddrinfo (host, portstr, &hints, &res);
   if (rc != 0 || !res) {
      bson_set_error (error, TOPOLOGY_ERROR_DOMAIN, TOPOLOGY_ERROR_RESOLVE, "cannot resolve %s: %s", host, gai_strerror (rc));
      return false;
   }
   memcpy (&out->addr, res->ai_addr, res->ai_addrlen);
   out->addr_len = res->ai_addrlen;
   freeaddrinfo (res);
   return true;
}

/* With several mongos, selection picks one at random each time; keep the
 * current one while the topology still lists it as a mongos, so pairing
 * does not hop between routers every period. */
static bool
topology_keep_mongos (mongoc_client_t *client, const topology_primary_t *cur)
{
   mongoc_server_description_t **sds;
   size_t n = 0;
   bool keep = false;

   if (cur->state != TOPOLOGY_STATE_PRIMARY || strcmp (cur->server_type, "Mongos") != 0)
      return false;
   sds = mongoc_client_get_server_descriptions (client, &n);
   for (size_t i = 0; i < n && !keep; i++) {
      const mongoc_host_list_t *h = mongoc_server_description_host (sds[i]);
      keep = h->port == cur->port && strcmp (h->host, cur->host) == 0 &&
             strcmp (mongoc_server_description_type (sds[i]), "Mongos") == 0;
   }
   mongoc_server_descriptions_destroy_all (sds, n);
   return keep;
}

/* Whether the member with `server_id` says in its own hello that it is
 * writable; `primary` (may be NULL) gets the member its hello names as
 * primary ("host:port", empty when none). */
static bool
topology_hello_writable (mongoc_client_t *client, uint32_t server_id, char *primary, size_t primary_len)
{
   bson_t *cmd = BCON_NEW ("hello", BCON_INT32 (1));
   bson_t reply;
   bson_error_t error;
   bson_iter_t it;
   bool writable = false;

   if (primary)
      primary[0] = '\0';
   if (mongoc_client_command_simple_with_server_id (client, "admin", cmd, NULL, server_id, &reply, &error)) {
      writable = (bson_iter_init_find (&it, &reply, "isWritablePrimary") || bson_iter_init_find (&it, &reply, "ismaster")) &&
                 bson_iter_as_bool (&it);
      if (primary && bson_iter_init_find (&it, &reply, "primary") && BSON_ITER_HOLDS_UTF8 (&it))
         bson_strncpy (primary, bson_iter_utf8 (&it, NULL), primary_len);
   }
   bson_destroy (&reply);
   bson_destroy (cmd);
   return writable;
}

/* After a not-primary error: the member mongoc selected (`*sd`) if its
 * hello says it is writable, else the member that hello names as primary
 * if that one's hello says so (replacing `*sd`).  False: neither yet. */
static bool
topology_confirm (mongoc_client_t *client, mongoc_server_description_t **sd)
{
   char named[TOPOLOGY_HOST_MAX + 8];
   mongoc_server_description_t **sds, *found = NULL;
   size_t n = 0;

   if (topology_hello_writable (client, mongoc_server_description_id (*sd), named, sizeof named))
      return true;
   if (!named[0])
      return false;
   sds = mongoc_client_get_server_descriptions (client, &n);
   for (size_t i = 0; i < n && !found; i++) {
      const mongoc_host_list_t *h = mongoc_server_description_host (sds[i]);
      char hp[TOPOLOGY_HOST_MAX + 8];
      bson_snprintf (hp, sizeof hp, "%s:%u", h->host, (unsigned) h->port);
      if (strcmp (hp, named) == 0 && topology_hello_writable (client, mongoc_server_description_id (sds[i]), NULL, 0))
         found = mongoc_server_description_new_copy (sds[i]);
   }
   mongoc_server_descriptions_destroy_all (sds, n);
   if (!found)
      return false;
   mongoc_server_description_destroy (*sd);
   *sd = found;
   return true;
}

/* No primary to pair with (`state`), and why: `next`'s last_error. */
static void __attribute__ ((format (printf, 3, 4)))
no_primary (topology_primary_t *next, topology_state_t state, const char *fmt, ...)
{
   va_list ap;

   next->state = state;
   va_start (ap, fmt);
   vsnprintf (next->last_error, sizeof next->last_error, fmt, ap);
   va_end (ap);
}

/* One attempt; fills `next` without touching the shared snapshot.
 * `confirm`: a not-primary error came from the last primary (see
 * topology_suspect); true is left in *confirmed once a member's own hello
 * said it is writable. */
static void
topology_learn (topology_t *topo, topology_primary_t *next, bool confirm, bool *confirmed)
{
   mongoc_client_t *client = NULL;
   mongoc_server_description_t *sd = NULL;
   const mongoc_host_list_t *h;
   bson_error_t error;
   const char *type;

   client = mongoc_client_pool_pop (topo->pool);
   sd = mongoc_client_select_server (client, true, NULL, &error);
   if (!sd) {
      no_primary (next, TOPOLOGY_STATE_UNKNOWN, "%s", error.message);
      goto done;
   }
   /* A mongos has nothing to confirm: its shards' primaries are its own. */
   if (confirm && strcmp (mongoc_server_description_type (sd), "RSPrimary") == 0 && !topology_confirm (client, &sd)) {
      h = mongoc_server_description_host (sd);
      no_primary (next, TOPOLOGY_STATE_UNKNOWN,
                  "%s:%u answered not primary and no member says it is writable yet (an election)", h->host,
                  (unsigned) h->port);
      goto done;
   }
   *confirmed = confirm;
   type = mongoc_server_description_type (sd);
   h = mongoc_server_description_host (sd);
   if (strcmp (type, "Mongos") == 0 && (h->port != next->port || strcmp (h->host, next->host) != 0) &&
       topology_keep_mongos (client, next))
      goto done; /* `next` still holds the current snapshot */
   bson_strncpy (next->server_type, type, sizeof next->server_type);
   bson_strncpy (next->host, h->host, sizeof next->host);
   next->port = h->port;
   if (strcmp (type, "Standalone") == 0) {
      no_primary (next, TOPOLOGY_STATE_STANDALONE,
                  "%s:%u is a standalone mongod: transactions need a replica set or a sharded cluster", h->host,
                  (unsigned) h->port);
      goto done;
   }
   if (!topology_resolve (h->host, h->port, next, &error)) {
      no_primary (next, TOPOLOGY_STATE_UNKNOWN, "%s", error.message);
      goto done;
   }
   next->state = TOPOLOGY_STATE_PRIMARY;
   next->last_error[0] = '\0';
done:
   if (next->last_error[0]) {
      /* The driver's messages may quote the upstream URI; the snapshot's
       * text reaches clients' error answers, /readyz and the log. */
      char *masked = config_mask (NULL, next->last_error);
      bson_strncpy (next->last_error, masked, sizeof next->last_error);
      bson_free (masked);
   }
   mongoc_server_description_destroy (sd);
   if (client)
      mongoc_client_pool_push (topo->pool, client);
}

static void *
topology_thread (void *arg)
{
   topology_t *topo = arg;
   int64_t retry_ms = TOPOLOGY_RETRY_MIN_MS;

   log_set_thread_name ("topology");
   pthread_mutex_lock (&topo->mutex);
   while (!topo->stop) {
      topology_primary_t next;
      bool changed, confirm, confirmed = false;

      if (topo->refresh)
         topo->rechecks = TOPOLOGY_RECHECKS;
      topo->refresh = false;
      next = topo->snap;
      confirm = topo->suspect;
      pthread_mutex_unlock (&topo->mutex);

      topology_learn (topo, &next, confirm, &confirmed);

      pthread_mutex_lock (&topo->mutex);
      if (confirmed)
         topo->suspect = false;
      /* Suspected again while this attempt ran: it does not count. */
      if (topo->suspect && !confirm && next.state == TOPOLOGY_STATE_PRIMARY)
         continue;
      RELAYBUS_ASSERT ((unsigned) next.state < TOPOLOGY_STATE_COUNT_);
      /* A primary is published with the address the monitor resolved. */
      RELAYBUS_ASSERT (next.state != TOPOLOGY_STATE_PRIMARY || next.addr_len > 0);
      changed = next.state != topo->snap.state || next.port != topo->snap.port ||
                strcmp (next.host, topo->snap.host) != 0;
      if (changed) {
         next.generation = topo->snap.generation + 1;
         if (next.state == TOPOLOGY_STATE_PRIMARY) {
            log_info ("upstream %s is %s:%u (%s)",
                      topology_state_name (next.state),
                      next.host,
                      (unsigned) next.port,
                      next.server_type);
            counters_add (COUNTER_PRIMARY_CHANGES, 1);
         } else if (next.state == TOPOLOGY_STATE_STANDALONE) {
            log_error ("upstream refused: %s", next.last_error);
         } else {
            log_warn ("no primary known: %s (retrying)", next.last_error);
         }
      }
      topo->snap = next;
      if (!topo->first_done || changed) {
         topo->first_done = true;
         pthread_cond_broadcast (&topo->cond);
         topology_notify (topo);
      }

      /* Wait for a request, the period, or the retry backoff. */
      if (!topo->stop && !topo->refresh) {
         struct timespec ts;
         int64_t wait_ms = TOPOLOGY_PERIOD_MS;
         if (changed)
            topo->rechecks = 0;
         if (next.state != TOPOLOGY_STATE_PRIMARY || topo->rechecks > 0) {
            if (topo->rechecks > 0)
               topo->rechecks--;
            wait_ms = retry_ms;
            retry_ms = retry_ms * 2 > TOPOLOGY_RETRY_MAX_MS ? TOPOLOGY_RETRY_MAX_MS : retry_ms * 2;
         } else {
            retry_ms = TOPOLOGY_RETRY_MIN_MS;
         }
         ts = clock_deadline_ms (wait_ms);
         while (!topo->stop && !topo->refresh) {
            if (pthread_cond_timedwait (&topo->cond, &topo->mutex, &ts) == ETIMEDOUT)
               break;
         }
      }
   }
   pthread_mutex_unlock (&topo->mutex);
   return NULL;
}

bool
topology_start (topology_t *topo, bson_error_t *error)
{
   int rc = pthread_create (&topo->thread, NULL, topology_thread, topo);
   if (rc != 0) {
      bson_set_error (error, TOPOLOGY_ERROR_DOMAIN, TOPOLOGY_ERROR_THREAD, "cannot start the topology thread: %s", strerror (rc));
      return false;
   }
   topo->started = true;
   return true;
}

topology_state_t
topology_wait_first (topology_t *topo, int64_t timeout_ms)
{
   struct timespec ts;
   topology_state_t state;

   ts = clock_deadline_ms (timeout_ms);
   pthread_mutex_lock (&topo->mutex);
   while (!topo->first_done) {
      if (pthread_cond_timedwait (&topo->cond, &topo->mutex, &ts) == ETIMEDOUT)
         break;
   }
   state = topo->snap.state;
   pthread_mutex_unlock (&topo->mutex);
   return state;
}

void
topology_get_primary (topology_t *topo, topology_primary_t *out)
{
   pthread_mutex_lock (&topo->mutex);
   *out = topo->snap;
   pthread_mutex_unlock (&topo->mutex);
}

void
topology_request_refresh (topology_t *topo, const char *why)
{
   pthread_mutex_lock (&topo->mutex);
   if (!topo->refresh)
      log_debug ("re-learning the primary: %s", why);
   topo->refresh = true;
   pthread_cond_broadcast (&topo->cond);
   pthread_mutex_unlock (&topo->mutex);
}

void
topology_suspect (topology_t *topo, const char *host, uint16_t port)
{
   pthread_mutex_lock (&topo->mutex);
   if (topo->snap.state == TOPOLOGY_STATE_PRIMARY && topo->snap.port == port && strcmp (topo->snap.host, host) == 0 &&
       strcmp (topo->snap.server_type, "RSPrimary") == 0) {
      topo->snap.state = TOPOLOGY_STATE_UNKNOWN;
      topo->snap.generation++;
      bson_snprintf (topo->snap.last_error,
                     sizeof topo->snap.last_error,
                     "%s:%u answered not primary: waiting for the member that is",
                     host,
                     (unsigned) port);
      topo->suspect = true;
      log_info ("upstream %s:%u answered not primary: new connections wait until a member's hello says it is "
                "writable",
                host,
                (unsigned) port);
   }
   topo->refresh = true;
   pthread_cond_broadcast (&topo->cond);
   pthread_mutex_unlock (&topo->mutex);
}

bool
topology_primary_answers (topology_t *topo, int timeout_ms)
{
   topology_primary_t snap;
   struct pollfd pfd = {.events = POLLOUT};
   int err = 0;
   socklen_t err_len = sizeof err;
   bool answers = false;

   topology_get_primary (topo, &snap);
   /* The address stays in the snapshot when the primary is unpublished
    * (topology_suspect), so a set in the middle of a failover is probed too. */
   if (snap.addr_len == 0)
      return false;
   pfd.fd = socket (snap.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
   if (pfd.fd < 0)
      return false;
   if (connect (pfd.fd, (const struct sockaddr *) &snap.addr, snap.addr_len) == 0) {
      answers = true;
      goto done;
   }
   if (errno != EINPROGRESS)
      goto done;
   if (poll (&pfd, 1, timeout_ms) != 1)
      goto done;
   answers = getsockopt (pfd.fd, SOL_SOCKET, SO_ERROR, &err, &err_len) == 0 && err == 0;
done:
   close (pfd.fd);
   return answers;
}

void
topology_destroy (topology_t *topo)
{
   if (!topo)
      return;
   if (topo->started) {
      pthread_mutex_lock (&topo->mutex);
      topo->stop = true;
      pthread_cond_broadcast (&topo->cond);
      pthread_mutex_unlock (&topo->mutex);
      pthread_join (topo->thread, NULL);
   }
   mongoc_client_pool_destroy (topo->pool);
   pthread_cond_destroy (&topo->cond);
   pthread_mutex_destroy (&topo->mutex);
   bson_free (topo);
}
