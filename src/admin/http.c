/*
 * admin/http.c - the admin port's HTTP server: evhttp on its own thread, the
 * bearer-token and Host checks, request limits, the connection bound, the
 * routing table, and start and stop.  The endpoints are in admin/api.c.
 *
 * One worker thread (base/worker.h: its event base, its mongoc pool with
 * appName "relaybus-proxy admin", at a lower priority than the forwarding
 * loop) owns everything here: the evhttp server and a store instance that
 * never claims.  Requests are served one at a time;
 * the store calls of a request block this thread and nothing else, so a
 * flood of /api/deliveries slows the admin port and the queries it sends,
 * never the forwarding loop.
 *
 * Limits: headers and bodies are capped by evhttp (413 beyond them), a
 * connection idle or stalled for ADMIN_TIMEOUT_S is dropped, and at most
 * ADMIN_MAX_CONNECTIONS are open at once (evhttp 2.1 has no such limit:
 * each accepted connection is adopted right after evhttp set it up, see
 * admin_adopt_cb).  Routes match the path exactly; the token guards
 * /metrics and every /api/ path; without a token, every request must name
 * the port by address in Host (DNS rebinding).
 *
 * With [admin] tls_cert_file and tls_key_file set, every connection is
 * TLS (1.2 at least, the listener's server context from proxy/tls.c): the port
 * serves HTTPS only, and a plain-HTTP request fails its handshake.
 */
#include "admin/admin_private.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "proxy/clients.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/worker.h"
#include "base/counters.h"
#include "proxy/tls.h"
#include "base/utf8.h"

/* The admin thread's nice value (the forwarding loop keeps the process's). */
#define ADMIN_THREAD_NICE 10

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static admin_t *g_admin;

/* ------------------------------------------------------------ responses */

const char *
admin_peer_of (struct evhttp_request *req, char *buf, size_t len)
{
   struct evhttp_connection *conn = evhttp_request_get_connection (req);
   const char *host = NULL;
   ev_uint16_t port = 0;

   if (conn)
      evhttp_connection_get_peer (conn, (char **) &host, &port);
   snprintf (buf, len, "%s:%u", host ? host : "?", (unsigned) port);
   return buf;
}

static void
common_headers (struct evhttp_request *req, const char *content_type)
{
   struct evkeyvalq *h = evhttp_request_get_output_headers (req);

   evhttp_add_header (h, "Content-Type", content_type);
   evhttp_add_header (h, "Cache-Control", "no-store");
   evhttp_add_header (h, "X-Content-Type-Options", "nosniff");
}

void
admin_send_text (struct evhttp_request *req, int code, const char *reason, const char *content_type, const char *body, size_t len)
{
   struct evbuffer *buf = evbuffer_new ();

   common_headers (req, content_type);
   if (evhttp_request_get_command (req) == EVHTTP_REQ_HEAD) {
      /* HEAD: the headers GET would send, no body. */
      char n[32];
      snprintf (n, sizeof n, "%zu", len);
      evhttp_add_header (evhttp_request_get_output_headers (req), "Content-Length", n);
      evhttp_send_reply (req, code, reason, NULL);
      if (buf)
         evbuffer_free (buf);
      return;
   }
   if (buf)
      evbuffer_add (buf, body, len);
   evhttp_send_reply (req, code, reason, buf);
   if (buf)
      evbuffer_free (buf);
}

/* Answers are built from what the store holds, and anyone with access to
 * it (or an older version) may have written a string that is not UTF-8:
 * one of them must not fail the whole answer. */
static void
json_repair (const bson_t *in, bson_t *out, int depth)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, in))
      return;
   while (bson_iter_next (&it)) {
      const char *k = bson_iter_key (&it);
      uint32_t klen = bson_iter_key_len (&it);
      char *key = utf8_valid (k, klen) ? NULL : utf8_repair (k, klen);
      const char *name = key ? key : k;

      if (BSON_ITER_HOLDS_UTF8 (&it)) {
         uint32_t len;
         const char *v = bson_iter_utf8 (&it, &len);
         char *fixed = utf8_valid (v, len) ? NULL : utf8_repair (v, len);
         bson_append_utf8 (out, name, -1, fixed ? fixed : v, fixed ? -1 : (int) len);
         bson_free (fixed);
      } else if ((BSON_ITER_HOLDS_DOCUMENT (&it) || BSON_ITER_HOLDS_ARRAY (&it)) && depth < 32) {
         const uint8_t *data;
         uint32_t len;
         bson_t sub, child;
         bool array = BSON_ITER_HOLDS_ARRAY (&it);

         if (array)
            bson_iter_array (&it, &len, &data);
         else
            bson_iter_document (&it, &len, &data);
         if (bson_init_static (&sub, data, len)) {
            if (array)
               bson_append_array_begin (out, name, -1, &child);
            else
               bson_append_document_begin (out, name, -1, &child);
            json_repair (&sub, &child, depth + 1);
            if (array)
               bson_append_array_end (out, &child);
            else
               bson_append_document_end (out, &child);
         }
      } else if (!BSON_ITER_HOLDS_DOCUMENT (&it) && !BSON_ITER_HOLDS_ARRAY (&it)) {
         bson_append_iter (out, name, -1, &it);
      }
      bson_free (key);
   }
}

void
admin_json_repair (const bson_t *in, bson_t *out)
{
   json_repair (in, out, 0);
}

void
admin_send_json (struct evhttp_request *req, int code, const char *reason, const bson_t *doc)
{
   size_t len = 0;
   char *json = bson_as_relaxed_extended_json (doc, &len);

   if (!json) {
      /* Most likely a string that is not UTF-8: repair and try again. */
      bson_t fixed = BSON_INITIALIZER;

      admin_json_repair (doc, &fixed);
      json = bson_as_relaxed_extended_json (&fixed, &len);
      bson_destroy (&fixed);
   }
   if (!json) {
      static const char oops[] = "{\"error\":\"cannot encode the answer\"}\n";
      admin_send_text (req, 500, "Internal Server Error", "application/json", oops, sizeof oops - 1);
      return;
   }
   json = bson_realloc (json, len + 2);
   json[len++] = '\n';
   json[len] = '\0';
   admin_send_text (req, code, reason, "application/json", json, len);
   bson_free (json);
}

static const char *
reason_phrase (int code)
{
   switch (code) {
   case 200:
      return "OK";
   case 400:
      return "Bad Request";
   case 401:
      return "Unauthorized";
   case 403:
      return "Forbidden";
   case 404:
      return "Not Found";
   case 405:
      return "Method Not Allowed";
   case 415:
      return "Unsupported Media Type";
   case 500:
      return "Internal Server Error";
   case 502:
      return "Bad Gateway";
   case 503:
      return "Service Unavailable";
   default:
      return "Error";
   }
}

void
admin_send_error (admin_t *a, struct evhttp_request *req, int code, const char *fmt, ...)
{
   char msg[512];
   va_list ap;
   bson_t doc = BSON_INITIALIZER;

   va_start (ap, fmt);
   vsnprintf (msg, sizeof msg, fmt, ap);
   va_end (ap);
   {
      /* An error answer may quote the store's or a broker's error. */
      char *masked = config_mask (NULL, msg);
      bson_strncpy (msg, masked, sizeof msg);
      bson_free (masked);
   }
   if (!bson_utf8_validate (msg, strlen (msg), false))
      bson_strncpy (msg, "invalid request", sizeof msg);
   if (code < 500)
      counters_add (COUNTER_ADMIN_REJECTED, 1);
   BSON_APPEND_UTF8 (&doc, "error", msg);
   if (code == 401)
      evhttp_add_header (evhttp_request_get_output_headers (req), "WWW-Authenticate", "Bearer realm=\"relaybus-admin\"");
   admin_send_json (req, code, reason_phrase (code), &doc);
   bson_destroy (&doc);
}

/* ------------------------------------------------------------------ auth */

/* Without a token, every request must name the port by address (an IP
 * literal, "localhost", or the configured listen host): a web page that
 * rebinds its own DNS name to 127.0.0.1 is same-origin for the browser, so
 * it could read the answers of GETs as well as send actions, but its
 * requests carry that name in Host and are refused. */
static bool
host_allowed (admin_t *a, struct evhttp_request *req)
{
   config_t *cfg = config_acquire ();
   bool token = cfg && cfg->admin_token && *cfg->admin_token;
   const char *host = evhttp_find_header (evhttp_request_get_input_headers (req), "Host");
   char name[300], listen_host[256];
   uint16_t port;
   bson_error_t err;
   struct in_addr v4;
   struct in6_addr v6;
   size_t len;
   bool ok = false;

   config_release (cfg);
   if (token)
      return true;
   if (!host || strlen (host) >= sizeof name)
      return false;
   bson_strncpy (name, host, sizeof name);
   if (name[0] == '[') {
      char *end = strchr (name, ']');
      if (!end)
         return false;
      *end = '\0';
      return inet_pton (AF_INET6, name + 1, &v6) == 1;
   }
   len = strcspn (name, ":");
   name[len] = '\0';
   ok = inet_pton (AF_INET, name, &v4) == 1 || !strcasecmp (name, "localhost");
   if (!ok && config_parse_listen (a->cfg->admin_listen, listen_host, sizeof listen_host, &port, &err))
      ok = !strcasecmp (name, listen_host);
   return ok;
}

/* True when no token is configured, or the request carries it.  Both sides
 * are hashed first so the comparison takes the same time whatever the
 * lengths; CRYPTO_memcmp then compares the digests in constant time. */
static bool
authorized (struct evhttp_request *req)
{
   config_t *cfg = config_acquire ();
   const char *want = cfg ? cfg->admin_token : NULL;
   const char *got = evhttp_find_header (evhttp_request_get_input_headers (req), "Authorization");
   unsigned char dw[EVP_MAX_MD_SIZE], dg[EVP_MAX_MD_SIZE];
   unsigned int lw = 0, lg = 0;
   bool ok;

   if (!want || !*want) {
      config_release (cfg);
      return true;
   }
   if (!got || strncasecmp (got, "Bearer ", 7) != 0) {
      config_release (cfg);
      return false;
   }
   got += 7;
   while (*got == ' ')
      got++;
   ok = EVP_Digest (want, strlen (want), dw, &lw, EVP_sha256 (), NULL) == 1 &&
        EVP_Digest (got, strlen (got), dg, &lg, EVP_sha256 (), NULL) == 1 && lw == lg && CRYPTO_memcmp (dw, dg, lw) == 0;
   config_release (cfg);
   return ok;
}

/* ---------------------------------------------------------------- routing */

typedef struct {
   const char *path;
   enum evhttp_cmd_type method;
   bool auth;
   admin_handler_t fn;
} route_t;

static const route_t routes[] = {
   {"/", EVHTTP_REQ_GET, false, admin_api_dashboard},
   {"/healthz", EVHTTP_REQ_GET, false, admin_api_healthz},
   {"/readyz", EVHTTP_REQ_GET, false, admin_api_readyz},
   {"/metrics", EVHTTP_REQ_GET, true, admin_api_metrics},
   {"/api/stats", EVHTTP_REQ_GET, true, admin_api_stats},
   {"/api/handlers", EVHTTP_REQ_GET, true, admin_api_handlers},
   {"/api/deliveries", EVHTTP_REQ_GET, true, admin_api_deliveries},
   {"/api/deliveries/requeue", EVHTTP_REQ_POST, true, admin_api_requeue},
   {"/api/deliveries/bury", EVHTTP_REQ_POST, true, admin_api_bury},
   {"/api/purge", EVHTTP_REQ_POST, true, admin_api_purge},
   {"/api/replay", EVHTTP_REQ_POST, true, admin_api_replay},
   {"/api/lanes", EVHTTP_REQ_GET, true, admin_api_lanes},
   {"/api/clients", EVHTTP_REQ_GET, true, admin_api_clients},
   {"/api/config", EVHTTP_REQ_GET, true, admin_api_config},
   /* What happened to a delivery and to an event.  "/api/deliveries/ID/
    * attempts" and "/api/events/ID" stand for every such path:
    * admin_history_route matches them. */
   {"/api/deliveries/ID/attempts", EVHTTP_REQ_GET, true, admin_api_delivery_attempts},
   {"/api/events/ID", EVHTTP_REQ_GET, true, admin_api_event},
   {"/api/attempts", EVHTTP_REQ_GET, true, admin_api_attempts},
   /* The operator's commands (admin/operator.c).  "/api/clients/ID/close"
    * stands for every such path: admin_operator_route matches them. */
   {"/api/pause", EVHTTP_REQ_POST, true, admin_api_pause},
   {"/api/resume", EVHTTP_REQ_POST, true, admin_api_resume},
   {"/api/reconnect", EVHTTP_REQ_POST, true, admin_api_reconnect},
   {"/api/clients/ID/close", EVHTTP_REQ_POST, true, admin_api_client_close},
   {"/api/handlers/NAME/disable", EVHTTP_REQ_POST, true, admin_api_handler_disable},
   {"/api/handlers/NAME/enable", EVHTTP_REQ_POST, true, admin_api_handler_enable},
};

static void
admin_request_cb (struct evhttp_request *req, void *arg)
{
   admin_t *a = arg;
   const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri (req);
   const char *path = uri ? evhttp_uri_get_path (uri) : NULL;
   enum evhttp_cmd_type method = evhttp_request_get_command (req);
   const route_t *r = NULL;
   bool path_known = false;

   counters_add (COUNTER_ADMIN_REQUESTS, 1);
   if (!path || !*path)
      path = "/";
   /* With TLS configured, only TLS connections reach a handler: evhttp
    * falls back to a plain bufferevent when admin_bev_cb could not make
    * one (SSL_new failed), and such a connection must not be served. */
   if (a->tls) {
      struct evhttp_connection *conn = evhttp_request_get_connection (req);
      struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent (conn) : NULL;

      if (!bev || !bufferevent_openssl_get_ssl (bev)) {
         char peer[80];
         log_warn ("admin: %s: a connection without TLS reached the HTTPS-only port; closing it",
                   admin_peer_of (req, peer, sizeof peer));
         counters_add (COUNTER_ADMIN_REJECTED, 1);
         evhttp_send_error (req, 400, "TLS required");
         return;
      }
   }
   if (!host_allowed (a, req)) {
      char peer[80];
      log_warn ("admin: %s: 403 for %s %s: no token is set and Host is not an address of this port",
                admin_peer_of (req, peer, sizeof peer),
                method == EVHTTP_REQ_GET    ? "GET"
                : method == EVHTTP_REQ_POST ? "POST"
                : method == EVHTTP_REQ_HEAD ? "HEAD"
                                            : "request",
                path);
      admin_send_error (a, req, 403, "without an admin token, requests must address this port by IP or localhost");
      return;
   }
   /* Paths with an id route as their pattern. */
   if (admin_operator_route (path))
      path = "/api/clients/ID/close";
   else if (admin_handler_route (path))
      path = admin_handler_route (path);
   else if (admin_history_route (path))
      path = admin_history_route (path);
   for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
      if (!strcmp (routes[i].path, path)) {
         path_known = true;
         if (routes[i].method == method || (method == EVHTTP_REQ_HEAD && routes[i].method == EVHTTP_REQ_GET)) {
            r = &routes[i];
            break;
         }
      }
   if (!r) {
      if (path_known) {
         bool is_post = false;
         for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
            if (!strcmp (routes[i].path, path))
               is_post = routes[i].method == EVHTTP_REQ_POST;
         evhttp_add_header (evhttp_request_get_output_headers (req), "Allow", is_post ? "POST" : "GET, HEAD");
         admin_send_error (a, req, 405, "method not allowed");
      } else {
         admin_send_error (a, req, 404, "no such endpoint");
      }
      return;
   }
   /* The token guards /metrics and /api/..., whatever the path spelling:
    * routes match exactly, so "/api/../x" is simply unknown. */
   if (r->auth && !authorized (req)) {
      char peer[80];
      log_info ("admin: %s: 401 for %s %s", admin_peer_of (req, peer, sizeof peer), method == EVHTTP_REQ_POST ? "POST" : "GET", r->path);
      admin_send_error (a, req, 401, "a valid bearer token is required");
      return;
   }
   r->fn (a, req);
}

/* ------------------------------------------------------------ connections */

static void
admin_conn_closed_cb (struct evhttp_connection *conn, void *arg)
{
   admin_t *a = arg;

   for (size_t i = 0; i < a->n_conns; i++)
      if (a->conns[i] == conn) {
         a->conns[i] = a->conns[--a->n_conns];
         return;
      }
}

/* evhttp asks us for the bufferevent of each connection it accepts: we
 * make it, and remember it so that admin_adopt_cb, which runs once evhttp
 * finished setting the connection up, can count it. */
static struct bufferevent *
admin_bev_cb (struct event_base *base, void *arg)
{
   admin_t *a = arg;
   struct bufferevent *bev = NULL;

   if (a->tls) {
      /* evhttp sets the socket afterwards (bufferevent_setfd); the
       * handshake runs as the server side.  The bufferevent owns the SSL. */
      SSL *ssl = SSL_new (a->tls);

      if (!ssl) {
         log_warn ("admin: SSL_new: %s", tls_last_error ());
         return NULL;
      }
      bev = bufferevent_openssl_socket_new (base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                            BEV_OPT_CLOSE_ON_FREE);
      if (!bev) {
         SSL_free (ssl);
         return NULL;
      }
      /* Clients (curl, browsers) often close without close_notify; each
       * HTTP message is framed, so that is an end of stream, not an error. */
      bufferevent_openssl_set_allow_dirty_shutdown (bev, 1);
   } else {
      bev = bufferevent_socket_new (base, -1, BEV_OPT_CLOSE_ON_FREE);
   }
   if (bev) {
      if (a->n_fresh == a->cap_fresh) {
         a->cap_fresh = a->cap_fresh ? a->cap_fresh * 2 : 64;
         a->fresh = bson_realloc (a->fresh, a->cap_fresh * sizeof *a->fresh);
      }
      a->fresh[a->n_fresh++] = bev;
      event_active (a->adopt_ev, EV_TIMEOUT, 0);
   }
   return bev;
}

/* Counts the connections accepted since the last turn, closing those over
 * ADMIN_MAX_CONNECTIONS.  evhttp passes its connection as the callback
 * argument of the bufferevent (libevent 2.1 offers no accept hook; this is
 * the public way to reach the connection of a bufferevent we created). */
static void
admin_adopt_cb (evutil_socket_t fd, short what, void *arg)
{
   admin_t *a = arg;

   (void) fd;
   (void) what;
   for (size_t i = 0; i < a->n_fresh; i++) {
      void *cbarg = NULL;
      struct evhttp_connection *conn;

      bufferevent_getcb (a->fresh[i], NULL, NULL, NULL, &cbarg);
      conn = cbarg;
      if (!conn)
         continue;
      if (a->n_conns >= ADMIN_MAX_CONNECTIONS) {
         if (a->refused++ % 100 == 0)
            log_warn ("admin: %d connections open: closing a new one (%" PRIu64 " refused so far)",
                      ADMIN_MAX_CONNECTIONS,
                      a->refused);
         counters_add (COUNTER_ADMIN_REJECTED, 1);
         evhttp_connection_free (conn);
         continue;
      }
      a->conns[a->n_conns++] = conn;
      evhttp_connection_set_closecb (conn, admin_conn_closed_cb, a);
   }
   a->n_fresh = 0;
}

/* -------------------------------------------------------------- lifecycle */

static void
admin_free (admin_t *a)
{
   if (!a)
      return;
   if (a->http)
      evhttp_free (a->http); /* closes the connections: closecb runs */
   admin_api_clear_cache (a);
   bson_free (a->fresh);
   if (a->adopt_ev)
      event_free (a->adopt_ev);
   if (a->operator_kick_ev)
      event_free (a->operator_kick_ev);
   SSL_CTX_free (a->tls);
   store_destroy (a->store);
   worker_destroy (a->w); /* after everything on its base and pool */
   config_release (a->cfg);
   bson_free (a);
}

/* Binds the evhttp server; logs and returns false when it cannot. */
static bool
admin_bind (admin_t *a)
{
   char host[256];
   uint16_t port = 0;
   bson_error_t err;
   struct evhttp_bound_socket *bound;
   struct sockaddr_storage ss;
   socklen_t sl = sizeof ss;
   char ip[INET6_ADDRSTRLEN] = "?";

   if (!config_parse_listen (a->cfg->admin_listen, host, sizeof host, &port, &err)) {
      log_error ("admin: [admin] listen: %s; the admin port is off", err.message);
      return false;
   }
   if (host[0] == '/') {
      log_error ("admin: [admin] listen = %s: a Unix socket is not supported for the admin port; it is off", host);
      return false;
   }
   bound = evhttp_bind_socket_with_handle (a->http, host, port);
   if (!bound) {
      log_error ("admin: cannot listen on %s (%s); the admin port is off, forwarding goes on",
                 a->cfg->admin_listen,
                 strerror (errno));
      return false;
   }
   if (getsockname (evhttp_bound_socket_get_fd (bound), (struct sockaddr *) &ss, &sl) == 0) {
      if (ss.ss_family == AF_INET) {
         struct sockaddr_in *in = (struct sockaddr_in *) &ss;
         inet_ntop (AF_INET, &in->sin_addr, ip, sizeof ip);
         snprintf (a->address, sizeof a->address, "%s:%u", ip, (unsigned) ntohs (in->sin_port));
      } else if (ss.ss_family == AF_INET6) {
         struct sockaddr_in6 *in6 = (struct sockaddr_in6 *) &ss;
         inet_ntop (AF_INET6, &in6->sin6_addr, ip, sizeof ip);
         snprintf (a->address, sizeof a->address, "[%s]:%u", ip, (unsigned) ntohs (in6->sin6_port));
      }
   }
   if (!a->address[0])
      bson_strncpy (a->address, a->cfg->admin_listen, sizeof a->address);
   return true;
}

bool
admin_start (config_t *cfg, topology_t *topo, bson_error_t *error)
{
   /* A request waits at most 2 s for a server and 10 s for an answer
    * (unless the URI says otherwise): the admin thread must not hang on an
    * unreachable upstream.  One thread, one request at a time: a few
    * clients are plenty. */
   const worker_opts_t wo = {
      .name = "admin",
      .pool = {.appname = "relaybus-proxy admin", .server_selection_ms = 2000, .socket_timeout_ms = 10000, .max_pool_size = 4},
      .nice = ADMIN_THREAD_NICE,
   };
   admin_t *a;
   bson_error_t err;
   struct event_base *base;

   /* Each handler has its series from the first scrape. */
   for (size_t i = 0; i < cfg->n_handlers; i++)
      (void) counters_handler_slot (cfg->handlers[i].name, true);
   if (!cfg->admin_listen || !*cfg->admin_listen) {
      log_info ("admin: [admin] listen is empty: the admin port is off");
      return true;
   }
   a = bson_malloc0 (sizeof *a);
   a->cfg = config_retain (cfg);
   a->topo = topo;
   a->start_ms = clock_now_ms ();

   /* The certificate and key are read here, once: a file that does not
    * load fails start-up rather than leaving the port in clear. */
   if (*cfg->admin_tls_cert_file &&
       !tls_server_new (cfg->admin_tls_cert_file, cfg->admin_tls_key_file, NULL, &a->tls, &err)) {
      bson_set_error (error, ADMIN_ERROR_DOMAIN, ADMIN_ERROR_TLS, "admin: [admin] %s", err.message);
      goto fail;
   }
   /* The store never claims: the owner name only fills the field. */
   a->w = store_worker_new (cfg, &wo, &a->store, error);
   if (!a->w)
      goto fail;
   a->local_prefix = worker_owner_prefix (a->w);

   base = worker_base (a->w);
   a->http = evhttp_new (base);
   a->adopt_ev = event_new (base, -1, 0, admin_adopt_cb, a);
   if (!a->http || !a->adopt_ev) {
      bson_set_error (error, ADMIN_ERROR_DOMAIN, ADMIN_ERROR_HTTP, "admin: cannot create the HTTP server");
      goto fail;
   }
   evhttp_set_max_headers_size (a->http, ADMIN_MAX_HEADERS_SIZE);
   evhttp_set_max_body_size (a->http, ADMIN_MAX_BODY_SIZE);
   evhttp_set_timeout (a->http, ADMIN_TIMEOUT_S);
   /* Every method reaches the router, which answers 405 with Allow. */
   evhttp_set_allowed_methods (a->http,
                               EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                  EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
   evhttp_set_gencb (a->http, admin_request_cb, a);
   evhttp_set_bevcb (a->http, admin_bev_cb, a);
   if (!admin_bind (a)) {
      admin_free (a);
      return true; /* logged: the proxy goes on without it */
   }
   if (!worker_start (a->w, error))
      goto fail;
   pthread_mutex_lock (&g_mu);
   g_admin = a;
   pthread_mutex_unlock (&g_mu);
   log_info ("admin: listening on %s (%s, %s)",
             a->address,
             a->tls ? "HTTPS only" : "plain HTTP",
             cfg->admin_token && *cfg->admin_token ? "bearer token required for /metrics and /api/*" : "no token");
   return true;

fail:
   admin_free (a);
   return false;
}

void
admin_stop (void)
{
   admin_t *a;

   pthread_mutex_lock (&g_mu);
   a = g_admin;
   g_admin = NULL;
   pthread_mutex_unlock (&g_mu);
   if (!a) {
      clients_registry_clear ();
      return;
   }
   worker_stop (a->w); /* logs "admin: stopped" */
   admin_free (a);
   clients_registry_clear ();
}
