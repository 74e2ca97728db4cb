/*
 * proxy/listener.c - the accept side of the forwarding loop.
 *
 * Over max_clients the proxy still accepts and then closes: leaving the
 * connection in the kernel's backlog would make the client wait for a
 * connect timeout instead of seeing a prompt close it can retry.
 */
#include "proxy/listener.h"
#include "base/clock.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "base/config.h"
#include "base/log.h"
#include "base/counters.h"
#include "proxy/loops.h"
#include "proxy/side.h"

/* How long to pause accepting after EMFILE/ENFILE. */
#define LISTENER_PAUSE_MS 1000

/* Owned by main; borrows the loops and the TLS context. */
struct listener {
   struct evconnlistener *ev;
   struct event *resume_timer;
   loops_t *loops;
   SSL_CTX *server_tls;
   int64_t max_clients;
   char address[300];
   char unix_path[108]; /* non-empty: remove on destroy */
};

static void
listener_accept_cb (struct evconnlistener *ev, evutil_socket_t fd, struct sockaddr *addr, int len, void *arg)
{
   listener_t *l = arg;
   bson_error_t error;

   counters_add (COUNTER_CONNECTIONS_ACCEPTED, 1);
   if (l->max_clients > 0 && (int64_t) loops_clients (l->loops) >= l->max_clients) {
      char peer[CLIENT_PEER_MAX];

      client_format_peer (addr, peer, sizeof peer);
      log_warn ("refusing a connection from %s: max_clients=%" PRId64 " reached", peer, l->max_clients);
      counters_count_close (COUNTERS_CLOSE_MAX_CLIENTS);
      evutil_closesocket (fd);
      return;
   }
   if (!loops_accept (l->loops, fd, addr, len, l->server_tls, &error))
      log_error ("accept: %s", error.message);
}

static void
listener_resume_cb (evutil_socket_t fd, short what, void *arg)
{
   listener_t *l = arg;
   log_info ("resuming accepting connections");
   evconnlistener_enable (l->ev);
}

static void
listener_error_cb (struct evconnlistener *ev, void *arg)
{
   listener_t *l = arg;
   int err = EVUTIL_SOCKET_ERROR ();

   if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
      struct timeval tv = clock_timeval_ms (LISTENER_PAUSE_MS);
      log_warn ("accept: %s; pausing for %d ms", evutil_socket_error_to_string (err), LISTENER_PAUSE_MS);
      counters_add (COUNTER_ACCEPT_PAUSES, 1);
      evconnlistener_disable (l->ev);
      evtimer_add (l->resume_timer, &tv);
      return;
   }
   /* ECONNABORTED and friends: one connection lost, keep going. */
   log_warn ("accept: %s", evutil_socket_error_to_string (err));
}

listener_t *
listener_new (struct event_base *base, const char *listen, loops_t *loops, SSL_CTX *server_tls, bson_error_t *error)
{
   listener_t *l = bson_malloc0 (sizeof *l);
   char host[256];
   uint16_t port;
   struct sockaddr_storage ss;
   socklen_t sslen;
   const unsigned flags = LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC | LEV_OPT_REUSEABLE;

   l->loops = loops;
   l->server_tls = server_tls;
   if (!config_parse_listen (listen, host, sizeof host, &port, error))
      goto fail;
   memset (&ss, 0, sizeof ss);
   if (port == 0 && host[0] == '/') {
      struct sockaddr_un *sun = (struct sockaddr_un *) &ss;
      struct stat st;
      if (strlen (host) >= sizeof sun->sun_path) {
         bson_set_error (error, LISTENER_ERROR_DOMAIN, LISTENER_ERR_PATH_TOO_LONG, "unix socket path too long: %s", host);
         goto fail;
      }
      /* A stale socket file from a previous run would make bind fail. */
      if (stat (host, &st) == 0 && S_ISSOCK (st.st_mode))
         unlink (host);
      sun->sun_family = AF_UNIX;
      bson_strncpy (sun->sun_path, host, sizeof sun->sun_path);
      bson_strncpy (l->unix_path, host, sizeof l->unix_path);
      sslen = sizeof *sun;
   } else {
      int sslen_i = (int) sizeof ss;
      char hostport[300];
      bson_snprintf (hostport, sizeof hostport, strchr (host, ':') ? "[%s]:%u" : "%s:%u", host, (unsigned) port);
      /* Numeric only: the listen address is never looked up in DNS. */
      if (evutil_parse_sockaddr_port (hostport, (struct sockaddr *) &ss, &sslen_i) != 0) {
         bson_set_error (
            error, LISTENER_ERROR_DOMAIN, LISTENER_ERR_ADDRESS, "listen address must be a numeric IP and port: %s", listen);
         goto fail;
      }
      sslen = (socklen_t) sslen_i;
   }
   l->resume_timer = evtimer_new (base, listener_resume_cb, l);
   l->ev = evconnlistener_new_bind (base, listener_accept_cb, l, flags, 1024, (struct sockaddr *) &ss, (int) sslen);
   if (!l->ev) {
      bson_set_error (error,
                      LISTENER_ERROR_DOMAIN,
                      LISTENER_ERR_BIND,
                      "cannot listen on %s: %s",
                      listen,
                      evutil_socket_error_to_string (EVUTIL_SOCKET_ERROR ()));
      l->unix_path[0] = '\0'; /* not ours to remove */
      goto fail;
   }
   evconnlistener_set_error_cb (l->ev, listener_error_cb);
   if (l->unix_path[0]) {
      bson_strncpy (l->address, l->unix_path, sizeof l->address);
   } else {
      struct sockaddr_storage bound;
      socklen_t blen = sizeof bound;

      if (getsockname (evconnlistener_get_fd (l->ev), (struct sockaddr *) &bound, &blen) == 0 &&
          (bound.ss_family == AF_INET || bound.ss_family == AF_INET6))
         client_format_peer ((const struct sockaddr *) &bound, l->address, sizeof l->address);
      else
         bson_snprintf (l->address, sizeof l->address, "?:%u", (unsigned) port);
   }
   return l;
fail:
   listener_destroy (l);
   return NULL;
}

const char *
listener_address (const listener_t *l)
{
   return l->address;
}

void
listener_set_max_clients (listener_t *l, int64_t max_clients)
{
   l->max_clients = max_clients;
}

void
listener_destroy (listener_t *l)
{
   if (!l)
      return;
   if (l->ev)
      evconnlistener_free (l->ev);
   proxy_event_free (l->resume_timer);
   if (l->unix_path[0])
      unlink (l->unix_path);
   bson_free (l);
}
