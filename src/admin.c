/*
 * admin.c - the admin port: evhttp on its own thread, bearer-token checks,
 * request limits, and the endpoints of docs/admin.md.
 *
 * One thread owns everything here: the event base, the evhttp server, the
 * mongoc pool and a store instance.  Requests are served one at a time;
 * the store calls of a request block this thread and nothing else, so a
 * flood of /api/deliveries slows the admin port and the queries it sends,
 * never the forwarding loop.
 *
 * Limits: headers and bodies are capped by evhttp (413 beyond them), a
 * connection idle or stalled for ADMIN_TIMEOUT_S is dropped, and at most
 * ADMIN_MAX_CONNECTIONS are open at once (evhttp 2.1 has no such limit:
 * each accepted connection is adopted right after evhttp set it up, see
 * admin_adopt_cb).  Input from a request reaches the store only as
 * strings, ObjectIds parsed from 24 hex characters, or integers: query
 * parameters are checked against a list of names (so `status[$ne]=x` is an
 * unknown parameter), and JSON bodies are checked field by field.
 *
 * Every action that changes something (requeue, bury, purge) is logged
 * with the peer, what was asked and what changed.
 */
#include "admin.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <mongoc/mongoc.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "autoconf.h"
#include "clients_registry.h"
#include "dispatch.h"
#include "log.h"
#include "metrics.h"
#include "stats.h"
#include "store.h"
#include "store_views.h"
#include "virtual.h"

#define ADMIN_MAX_PARAM_LEN 256
#define ADMIN_CLIENTS_DEFAULT 500
#define ADMIN_CLIENTS_MAX 10000

typedef struct admin admin_t;

/* The store's view for /metrics, /api/stats and /api/handlers: totals,
 * per-handler figures merged with the configured handlers (zeros for those
 * without deliveries), lanes.  Cached for ADMIN_VIEW_CACHE_MS so that
 * several dashboards and scrapers cost one set of queries per second. */
typedef struct {
   bool ok;
   store_stats_t totals;
   store_handler_stats_t *hs;
   size_t n_hs;
   int64_t leased, held;
   bson_t lanes; /* array */
   char error[256];
} store_view_t;

#define ADMIN_VIEW_CACHE_MS 1000

/* The admin port.  Created by admin_start on the main thread; then used by
 * its own thread only, until admin_stop joined it and frees it. */
struct admin {
   config_t *cfg; /* our reference: handlers, upstream; the token is read per request */
   topology_t *topo; /* borrowed */
   pthread_t thread;
   bool thread_started;
   struct event_base *base;
   struct evhttp *http;
   struct event *stop_ev;
   struct event *adopt_ev;
   char address[300]; /* host:port actually bound */

   mongoc_uri_t *uri;
   mongoc_client_pool_t *pool;
   store_t *store;
   char owner[160];
   char local_prefix[160]; /* "<host>/<pid>/": lanes of this process */
   bool outbox_ready;      /* sticky once seen */
   store_view_t view;      /* cached; valid when view_at > 0 */
   int64_t view_at;
   int64_t start_ms;

   /* Connections: accepted bufferevents waiting to be adopted, and the
    * evhttp connections open (at most ADMIN_MAX_CONNECTIONS). */
   struct bufferevent **fresh; /* grows: one loop turn may accept many */
   size_t n_fresh, cap_fresh;
   struct evhttp_connection *conns[ADMIN_MAX_CONNECTIONS];
   size_t n_conns;
   uint64_t refused;

   _Atomic uint64_t requests, rejected;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static admin_t *g_admin;

static int64_t
now_ms (void)
{
   struct timeval tv;
   gettimeofday (&tv, NULL);
   return (int64_t) tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* "2026-11-30T11:05:18.123Z" */
static void
iso8601 (int64_t ms, char out[64])
{
   time_t t = (time_t) (ms / 1000);
   struct tm tm;

   gmtime_r (&t, &tm);
   snprintf (out,
             64,
             "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
             tm.tm_year + 1900,
             tm.tm_mon + 1,
             tm.tm_mday,
             tm.tm_hour,
             tm.tm_min,
             tm.tm_sec,
             (int) (ms % 1000));
}

/* Parses "YYYY-MM-DDTHH:MM:SS[.fff]Z" into ms since the epoch. */
static bool
parse_iso8601 (const char *s, int64_t *ms)
{
   struct tm tm = {0};
   int frac = 0, n = 0, consumed = 0;
   const char *p;

   if (sscanf (s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6)
      return false;
   p = s + n;
   if (*p == '.') {
      int digits = 0;
      for (p++; isdigit ((unsigned char) *p); p++, digits++)
         if (digits < 3)
            frac = frac * 10 + (*p - '0');
      if (digits == 0)
         return false;
      for (; digits < 3; digits++)
         frac *= 10;
   }
   (void) consumed;
   if (strcmp (p, "Z") != 0)
      return false;
   if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 ||
       tm.tm_sec > 60)
      return false;
   tm.tm_year -= 1900;
   tm.tm_mon -= 1;
   *ms = (int64_t) timegm (&tm) * 1000 + frac;
   return true;
}

/* ------------------------------------------------------------ responses */

static const char *
peer_of (struct evhttp_request *req, char *buf, size_t len)
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

static void
send_text (struct evhttp_request *req, int code, const char *reason, const char *content_type, const char *body, size_t len)
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

static void
send_json (struct evhttp_request *req, int code, const char *reason, const bson_t *doc)
{
   size_t len = 0;
   char *json = bson_as_relaxed_extended_json (doc, &len);

   if (!json) {
      static const char oops[] = "{\"error\":\"cannot encode the answer\"}\n";
      send_text (req, 500, "Internal Server Error", "application/json", oops, sizeof oops - 1);
      return;
   }
   json = bson_realloc (json, len + 2);
   json[len++] = '\n';
   json[len] = '\0';
   send_text (req, code, reason, "application/json", json, len);
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

static void send_error (admin_t *a, struct evhttp_request *req, int code, const char *fmt, ...)
   __attribute__ ((format (printf, 4, 5)));

static void
send_error (admin_t *a, struct evhttp_request *req, int code, const char *fmt, ...)
{
   char msg[512];
   va_list ap;
   bson_t doc = BSON_INITIALIZER;

   va_start (ap, fmt);
   vsnprintf (msg, sizeof msg, fmt, ap);
   va_end (ap);
   if (!bson_utf8_validate (msg, strlen (msg), false))
      bson_strncpy (msg, "invalid request", sizeof msg);
   if (code < 500)
      atomic_fetch_add (&a->rejected, 1);
   BSON_APPEND_UTF8 (&doc, "error", msg);
   if (code == 401)
      evhttp_add_header (evhttp_request_get_output_headers (req), "WWW-Authenticate", "Bearer realm=\"relaybus-admin\"");
   send_json (req, code, reason_phrase (code), &doc);
   bson_destroy (&doc);
}

/* ------------------------------------------------------------------ auth */

/* Without a token, an action must name the port by address (an IP
 * literal, "localhost", or the configured listen host): a web page that
 * rebinds its own DNS name to 127.0.0.1 is same-origin for the browser, but
 * its requests carry that name in Host and are refused. */
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

/* ------------------------------------------------------- query parameters */

typedef struct {
   const char *name;
   const char *value; /* NULL: absent */
} param_t;

/* Parses the query string into `params` (names listed by the caller).
 * Unknown names (`status[$ne]`), repeated names, over-long or non-UTF-8
 * values are refused with a message in `why`. */
static bool
parse_params (struct evhttp_request *req, param_t *params, size_t n, struct evkeyvalq *store, char *why, size_t why_len)
{
   const char *query = evhttp_uri_get_query (evhttp_request_get_evhttp_uri (req));
   struct evkeyval *kv;

   TAILQ_INIT (store);
   if (!query || !*query)
      return true;
   if (evhttp_parse_query_str (query, store) != 0) {
      snprintf (why, why_len, "malformed query string");
      return false;
   }
   TAILQ_FOREACH (kv, store, next)
   {
      size_t i;
      for (i = 0; i < n; i++)
         if (!strcmp (kv->key, params[i].name))
            break;
      if (!bson_utf8_validate (kv->key, strlen (kv->key), false)) {
         snprintf (why, why_len, "a parameter name is not UTF-8");
         return false;
      }
      if (i == n) {
         snprintf (why, why_len, "unknown parameter '%.64s'", kv->key);
         return false;
      }
      if (params[i].value) {
         snprintf (why, why_len, "parameter '%s' given twice", params[i].name);
         return false;
      }
      if (strlen (kv->value) > ADMIN_MAX_PARAM_LEN || !bson_utf8_validate (kv->value, strlen (kv->value), false)) {
         snprintf (why, why_len, "parameter '%s' is too long or not UTF-8", params[i].name);
         return false;
      }
      params[i].value = kv->value;
   }
   return true;
}

static bool
parse_int (const char *s, int64_t min, int64_t max, int64_t *out)
{
   char *end;
   long long v;

   if (!s || !*s || !(isdigit ((unsigned char) *s) || *s == '-'))
      return false;
   errno = 0;
   v = strtoll (s, &end, 10);
   if (errno || *end || v < min || v > max)
      return false;
   *out = v;
   return true;
}

/* ------------------------------------------------------------ JSON body */

/* Reads a JSON object body.  Refuses a wrong Content-Type (415: this also
 * makes a browser on another origin preflight, which is never answered),
 * and malformed JSON (400). */
static bool
read_body (admin_t *a, struct evhttp_request *req, bson_t *doc)
{
   const char *ct = evhttp_find_header (evhttp_request_get_input_headers (req), "Content-Type");
   struct evbuffer *in = evhttp_request_get_input_buffer (req);
   size_t len = evbuffer_get_length (in);
   bson_error_t err;
   unsigned char *data;

   if (!ct || strncasecmp (ct, "application/json", 16) != 0 || (ct[16] && ct[16] != ';' && ct[16] != ' ')) {
      send_error (a, req, 415, "the body must be JSON (Content-Type: application/json)");
      return false;
   }
   if (len == 0) {
      send_error (a, req, 400, "an empty body; expected a JSON object");
      return false;
   }
   if (len > ADMIN_MAX_BODY_SIZE) {
      send_error (a, req, 400, "the body is larger than %d bytes", ADMIN_MAX_BODY_SIZE);
      return false;
   }
   data = evbuffer_pullup (in, (ev_ssize_t) len);
   if (!data || !bson_init_from_json (doc, (const char *) data, (ssize_t) len, &err)) {
      send_error (a, req, 400, "malformed JSON: %s", data ? err.message : "cannot read the body");
      return false;
   }
   return true;
}

/* Checks that every field of `doc` is one of `names` (NULL-terminated). */
static bool
only_fields (admin_t *a, struct evhttp_request *req, const bson_t *doc, const char *const *names)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, doc))
      return false;
   while (bson_iter_next (&it)) {
      const char *k = bson_iter_key (&it);
      bool known = false;
      for (const char *const *n = names; *n; n++)
         known = known || !strcmp (*n, k);
      if (!known) {
         send_error (a, req, 400, "unknown field '%.64s'", k);
         return false;
      }
   }
   return true;
}

/* {"ids": ["<24 hex>", ...]}: every id a string of 24 hex characters.  An
 * id that is an object ({"$ne": ...}), a number or anything else is a 400.
 * `*ids` points into `doc`. */
static bool
read_ids (admin_t *a, struct evhttp_request *req, const bson_t *doc, const char ***ids, size_t *n)
{
   bson_iter_t it, arr;
   size_t cap = 0;

   *ids = NULL;
   *n = 0;
   if (!bson_iter_init_find (&it, doc, "ids") || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr)) {
      send_error (a, req, 400, "\"ids\" must be an array of delivery ids (24 hex characters)");
      return false;
   }
   while (bson_iter_next (&arr)) {
      uint32_t len = 0;
      const char *s;
      if (!BSON_ITER_HOLDS_UTF8 (&arr)) {
         send_error (a, req, 400, "ids[%zu] is not a string: ids are 24 hex characters", *n);
         goto fail;
      }
      s = bson_iter_utf8 (&arr, &len);
      if (len != 24 || !bson_oid_is_valid (s, 24)) {
         send_error (a, req, 400, "ids[%zu] is not a delivery id (24 hex characters)", *n);
         goto fail;
      }
      if (*n == ADMIN_MAX_IDS) {
         send_error (a, req, 400, "at most %d ids per request", ADMIN_MAX_IDS);
         goto fail;
      }
      if (*n == cap) {
         cap = cap ? cap * 2 : 16;
         *ids = bson_realloc ((void *) *ids, cap * sizeof **ids);
      }
      (*ids)[(*n)++] = s;
   }
   if (*n == 0) {
      send_error (a, req, 400, "\"ids\" is empty");
      goto fail;
   }
   return true;
fail:
   bson_free ((void *) *ids);
   *ids = NULL;
   *n = 0;
   return false;
}

/* "id1,id2,..." for the log, shortened past a few hundred characters. */
static void
ids_for_log (const char *const *ids, size_t n, char *out, size_t len)
{
   size_t used = 0;

   out[0] = '\0';
   for (size_t i = 0; i < n; i++) {
      int w = snprintf (out + used, len - used, "%s%s", i ? "," : "", ids[i]);
      if (w < 0 || (size_t) w >= len - used - 16) {
         snprintf (out + used, len - used, ",... (%zu in all)", n);
         return;
      }
      used += (size_t) w;
   }
}

/* ---------------------------------------------------- delivery documents */

static int64_t
doc_date (const bson_t *doc, const char *field)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, doc, field) && BSON_ITER_HOLDS_DATE_TIME (&it) ? bson_iter_date_time (&it) : 0;
}

static void
append_date (bson_t *out, const char *name, int64_t ms)
{
   char iso[64];

   if (ms <= 0)
      return;
   iso8601 (ms, iso);
   BSON_APPEND_UTF8 (out, name, iso);
}

/* A delivery (or completion record) as the API shows it: ids as strings,
 * dates as ISO-8601 strings. */
static void
delivery_json (bson_t *out, const bson_t *doc)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, doc))
      return;
   while (bson_iter_next (&it)) {
      const char *k = bson_iter_key (&it);
      if (!strcmp (k, "_id") && BSON_ITER_HOLDS_OID (&it)) {
         char hex[25];
         bson_oid_to_string (bson_iter_oid (&it), hex);
         BSON_APPEND_UTF8 (out, "id", hex);
      } else if (BSON_ITER_HOLDS_DATE_TIME (&it)) {
         append_date (out, k, bson_iter_date_time (&it));
      } else if (BSON_ITER_HOLDS_UTF8 (&it) || BSON_ITER_HOLDS_INT32 (&it) || BSON_ITER_HOLDS_INT64 (&it) ||
                 BSON_ITER_HOLDS_DOUBLE (&it) || BSON_ITER_HOLDS_BOOL (&it)) {
         bson_append_iter (out, k, -1, &it);
      }
      /* inFlight-style arrays and other internals are left out. */
   }
}

/* Appends `value` with the password of a URL's userinfo masked
 * ("mongodb://app:secret@h/" -> "mongodb://app:********@h/"): the API
 * shows the upstream URI and webhook URLs, never the credentials in them. */
static void
append_masked_url (bson_t *doc, const char *name, const char *value)
{
   const char *scheme = strstr (value, "://");
   const char *auth_end, *colon;
   bson_string_t *out;

   if (!bson_utf8_validate (value, strlen (value), false)) {
      BSON_APPEND_NULL (doc, name);
      return;
   }
   if (!scheme) {
      BSON_APPEND_UTF8 (doc, name, value);
      return;
   }
   scheme += 3;
   auth_end = strchr (scheme, '@');
   if (!auth_end || (strchr (scheme, '/') && strchr (scheme, '/') < auth_end)) {
      BSON_APPEND_UTF8 (doc, name, value);
      return;
   }
   colon = memchr (scheme, ':', (size_t) (auth_end - scheme));
   out = bson_string_new (NULL);
   if (colon) {
      char *head = bson_strndup (value, (size_t) (colon - value) + 1);
      bson_string_append (out, head);
      bson_string_append (out, "********");
      bson_free (head);
   } else {
      /* A bare userinfo is a token: all of it goes. */
      char *head = bson_strndup (value, (size_t) (scheme - value));
      bson_string_append (out, head);
      bson_string_append (out, "********");
      bson_free (head);
   }
   bson_string_append (out, auth_end);
   BSON_APPEND_UTF8 (doc, name, out->str);
   bson_string_free (out, true);
}

/* ------------------------------------------------------------- handlers */

static void
handle_healthz (admin_t *a, struct evhttp_request *req)
{
   (void) a;
   send_text (req, 200, "OK", "text/plain; charset=utf-8", "ok\n", 3);
}

static bool
outbox_ready (admin_t *a)
{
   bson_error_t err;
   bool ready = false;

   if (a->outbox_ready)
      return true;
   if (!store_is_set_up (a->store, &ready, &err))
      log_debug ("admin: setup check: %s", err.message);
   a->outbox_ready = ready;
   return ready;
}

static void
handle_readyz (admin_t *a, struct evhttp_request *req)
{
   topology_primary_t snap;
   bson_t doc = BSON_INITIALIZER;
   bool up, outbox, ready;

   topology_get_primary (a->topo, &snap);
   up = snap.state == TOPOLOGY_STATE_PRIMARY;
   outbox = up && outbox_ready (a);
   ready = up && outbox;
   BSON_APPEND_BOOL (&doc, "ready", ready);
   BSON_APPEND_UTF8 (&doc, "upstream", topology_state_name (snap.state));
   BSON_APPEND_BOOL (&doc, "outbox", outbox);
   if (!up && snap.last_error[0] && bson_utf8_validate (snap.last_error, strlen (snap.last_error), false))
      BSON_APPEND_UTF8 (&doc, "reason", snap.last_error);
   send_json (req, ready ? 200 : 503, ready ? "OK" : "Service Unavailable", &doc);
   bson_destroy (&doc);
}

static void
store_view_load (admin_t *a, store_view_t *v, int64_t now)
{
   bson_error_t err;

   memset (v, 0, sizeof *v);
   bson_init (&v->lanes);
   v->ok = store_statistics (a->store, now, &v->totals, &err) && store_handler_stats (a->store, &v->hs, &v->n_hs, &err) &&
           store_list_lanes (a->store, now, a->local_prefix, &v->lanes, &v->leased, &v->held, &err);
   if (!v->ok) {
      bson_strncpy (v->error, err.message, sizeof v->error);
      log_warn ("admin: reading the outbox: %s", err.message);
      return;
   }
   /* Configured handlers without any delivery still get a row. */
   for (size_t i = 0; i < a->cfg->n_handlers; i++) {
      const char *name = a->cfg->handlers[i].name;
      bool found = false;
      for (size_t k = 0; k < v->n_hs && !found; k++)
         found = !strcmp (v->hs[k].name, name);
      if (!found) {
         v->hs = bson_realloc (v->hs, (v->n_hs + 1) * sizeof *v->hs);
         memset (&v->hs[v->n_hs], 0, sizeof *v->hs);
         bson_strncpy (v->hs[v->n_hs].name, name, sizeof v->hs[0].name);
         v->n_hs++;
      }
   }
}

static void
store_view_clear (store_view_t *v)
{
   bson_free (v->hs);
   bson_destroy (&v->lanes);
}

/* The view, from the cache when it is fresh. */
static const store_view_t *
store_view (admin_t *a, int64_t now)
{
   if (a->view_at > 0 && now >= a->view_at && now - a->view_at < ADMIN_VIEW_CACHE_MS)
      return &a->view;
   if (a->view_at > 0)
      store_view_clear (&a->view);
   store_view_load (a, &a->view, now);
   a->view_at = now > 0 ? now : 1;
   return &a->view;
}

/* After an action: the next view is read afresh. */
static void
store_view_invalidate (admin_t *a)
{
   if (a->view_at > 0)
      store_view_clear (&a->view);
   a->view_at = 0;
}

static void
handle_metrics (admin_t *a, struct evhttp_request *req)
{
   int64_t now = now_ms ();
   topology_primary_t snap;
   const store_view_t *sv;
   metrics_view_t mv = {0};
   bson_string_t *out = bson_string_new (NULL);

   topology_get_primary (a->topo, &snap);
   sv = store_view (a, now);
   mv.now_ms = now;
   mv.start_ms = a->start_ms;
   mv.upstream = snap.state;
   mv.outbox_ready = sv->ok && outbox_ready (a);
   mv.store_ok = sv->ok;
   mv.totals = sv->totals;
   mv.handlers = sv->hs;
   mv.n_handlers = sv->n_hs;
   mv.lanes_leased = sv->leased;
   mv.lanes_held = sv->held;
   mv.admin_requests = atomic_load (&a->requests);
   mv.admin_rejected = atomic_load (&a->rejected);
   metrics_render (out, &mv);
   send_text (req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", out->str, out->len);
   bson_string_free (out, true);
}

static const config_handler_t *
handler_cfg (admin_t *a, const char *name)
{
   for (size_t i = 0; i < a->cfg->n_handlers; i++)
      if (!strcmp (a->cfg->handlers[i].name, name))
         return &a->cfg->handlers[i];
   return NULL;
}

static void
append_handler (admin_t *a, bson_t *arr, uint32_t i, const store_handler_stats_t *h, int64_t now, bool with_config)
{
   const config_handler_t *hc = handler_cfg (a, h->name);
   metrics_handler_totals_t t;
   char buf[16];
   const char *key;
   bson_t doc;

   (void) metrics_handler_totals (h->name, &t);
   bson_uint32_to_string (i, &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (arr, key, &doc);
   BSON_APPEND_UTF8 (&doc, "name", h->name);
   BSON_APPEND_BOOL (&doc, "configured", hc != NULL);
   if (hc)
      BSON_APPEND_UTF8 (&doc, "kind", hc->kind);
   BSON_APPEND_INT64 (&doc, "pending", h->pending);
   BSON_APPEND_INT64 (&doc, "parked", h->parked);
   BSON_APPEND_INT64 (&doc, "dead", h->dead);
   append_date (&doc, "oldestDueAt", h->oldest_due_at);
   BSON_APPEND_INT64 (&doc, "oldestDueAgeMs", h->oldest_due_at > 0 && now > h->oldest_due_at ? now - h->oldest_due_at : 0);
   BSON_APPEND_INT64 (&doc, "completedTotal", (int64_t) t.settled[METRICS_DELIVERY_COMPLETED]);
   BSON_APPEND_INT64 (&doc, "retriedTotal", (int64_t) t.settled[METRICS_DELIVERY_RETRIED]);
   BSON_APPEND_INT64 (&doc, "deadTotal", (int64_t) t.settled[METRICS_DELIVERY_DEAD]);
   BSON_APPEND_INT64 (&doc, "meanLatencyMs", t.latency_count ? (int64_t) (t.latency_sum_seconds * 1000.0 / (double) t.latency_count) : 0);
   if (with_config && hc) {
      BSON_APPEND_UTF8 (&doc, "events", hc->events ? hc->events : "");
      if (hc->url)
         append_masked_url (&doc, "url", hc->url);
      BSON_APPEND_BOOL (&doc, "signed", hc->secret && *hc->secret);
      BSON_APPEND_INT64 (&doc, "maxAttempts", hc->max_attempts);
      BSON_APPEND_INT64 (&doc, "timeoutMs", hc->timeout_ms);
      BSON_APPEND_INT64 (&doc, "concurrency", hc->concurrency);
      BSON_APPEND_BOOL (&doc, "retry4xx", hc->retry_4xx);
   }
   bson_append_document_end (arr, &doc);
}

static void
handle_stats (admin_t *a, struct evhttp_request *req)
{
   int64_t now = now_ms ();
   topology_primary_t snap;
   const store_view_t *sv;
   virtual_stats_t vs;
   dispatch_stats_t ds;
   bson_t doc = BSON_INITIALIZER, sub, arr;

   topology_get_primary (a->topo, &snap);
   sv = store_view (a, now);
   virtual_get_stats (&vs);
   dispatch_get_stats (&ds);
   append_date (&doc, "time", now);
   BSON_APPEND_INT64 (&doc, "timeMs", now);
   BSON_APPEND_UTF8 (&doc, "version", PACKAGE_VERSION);
   BSON_APPEND_INT64 (&doc, "uptimeMs", now - a->start_ms);

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "upstream", &sub);
   BSON_APPEND_UTF8 (&sub, "state", topology_state_name (snap.state));
   if (snap.state == TOPOLOGY_STATE_PRIMARY && bson_utf8_validate (snap.host, strlen (snap.host), false)) {
      BSON_APPEND_UTF8 (&sub, "host", snap.host);
      BSON_APPEND_INT32 (&sub, "port", snap.port);
      BSON_APPEND_UTF8 (&sub, "serverType", snap.server_type);
   }
   bson_append_document_end (&doc, &sub);

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "proxy", &sub);
   BSON_APPEND_INT64 (&sub, "connections", (int64_t) stats_get (connections_open));
   BSON_APPEND_INT64 (&sub, "connectionsAccepted", (int64_t) stats_get (connections_accepted));
   BSON_APPEND_INT64 (&sub, "upstreamConnections", (int64_t) stats_get (upstreams_open));
   BSON_APPEND_INT64 (&sub, "messagesFromClients", (int64_t) stats_get (messages_from_clients));
   BSON_APPEND_INT64 (&sub, "bytesFromClients", (int64_t) stats_get (bytes_from_clients));
   BSON_APPEND_INT64 (&sub, "bytesToClients", (int64_t) stats_get (bytes_to_clients));
   BSON_APPEND_INT64 (&sub, "bytesFromUpstream", (int64_t) stats_get (bytes_from_upstream));
   BSON_APPEND_INT64 (&sub, "bytesToUpstream", (int64_t) stats_get (bytes_to_upstream));
   bson_append_document_end (&doc, &sub);

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "publishing", &sub);
   BSON_APPEND_INT64 (&sub, "annotatedStatements", (int64_t) vs.annotated);
   BSON_APPEND_INT64 (&sub, "eventsPublished", (int64_t) vs.events);
   BSON_APPEND_INT64 (&sub, "deliveriesWritten", (int64_t) vs.deliveries);
   bson_append_document_end (&doc, &sub);

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "dispatch", &sub);
   BSON_APPEND_INT64 (&sub, "claims", (int64_t) ds.claims);
   BSON_APPEND_INT64 (&sub, "claimed", (int64_t) ds.claimed);
   BSON_APPEND_INT64 (&sub, "completed", (int64_t) ds.completed);
   BSON_APPEND_INT64 (&sub, "retried", (int64_t) ds.rescheduled);
   BSON_APPEND_INT64 (&sub, "dead", (int64_t) ds.dead);
   BSON_APPEND_INT64 (&sub, "httpRequests", (int64_t) ds.http_requests);
   bson_append_document_end (&doc, &sub);

   BSON_APPEND_BOOL (&doc, "outboxReady", sv->ok && outbox_ready (a));
   if (sv->ok) {
      BSON_APPEND_DOCUMENT_BEGIN (&doc, "outbox", &sub);
      BSON_APPEND_INT64 (&sub, "pending", sv->totals.pending);
      BSON_APPEND_INT64 (&sub, "parked", sv->totals.parked);
      BSON_APPEND_INT64 (&sub, "dead", sv->totals.dead);
      BSON_APPEND_INT64 (&sub, "running", sv->totals.running);
      BSON_APPEND_INT64 (&sub, "completedRecords", sv->totals.completed);
      BSON_APPEND_INT64 (&sub, "lanesLeased", sv->leased);
      BSON_APPEND_INT64 (&sub, "lanesHeldHere", sv->held);
      append_date (&sub, "oldestDueAt", sv->totals.oldest_due_at);
      BSON_APPEND_INT64 (&sub,
                         "oldestDueAgeMs",
                         sv->totals.oldest_due_at > 0 && now > sv->totals.oldest_due_at ? now - sv->totals.oldest_due_at : 0);
      bson_append_document_end (&doc, &sub);
      BSON_APPEND_ARRAY_BEGIN (&doc, "handlers", &arr);
      for (size_t i = 0; i < sv->n_hs; i++)
         append_handler (a, &arr, (uint32_t) i, &sv->hs[i], now, false);
      bson_append_array_end (&doc, &arr);
   } else {
      BSON_APPEND_UTF8 (&doc, "outboxError", sv->error);
   }
   send_json (req, 200, "OK", &doc);
   bson_destroy (&doc);
}

static void
handle_handlers (admin_t *a, struct evhttp_request *req)
{
   int64_t now = now_ms ();
   const store_view_t *sv;
   bson_t doc = BSON_INITIALIZER, arr;

   sv = store_view (a, now);
   if (!sv->ok) {
      send_error (a, req, 502, "reading the outbox failed: %s", sv->error);
      bson_destroy (&doc);
      return;
   }
   BSON_APPEND_ARRAY_BEGIN (&doc, "handlers", &arr);
   for (size_t i = 0; i < sv->n_hs; i++)
      append_handler (a, &arr, (uint32_t) i, &sv->hs[i], now, true);
   bson_append_array_end (&doc, &arr);
   send_json (req, 200, "OK", &doc);
   bson_destroy (&doc);
}

/* GET /api/deliveries?status=&handler=&eventType=&eventId=&key=&limit=&after= */
static void
handle_deliveries (admin_t *a, struct evhttp_request *req)
{
   enum { P_STATUS, P_HANDLER, P_TYPE, P_EVENT, P_KEY, P_LIMIT, P_AFTER, P_N };
   param_t p[P_N] = {{"status", NULL},
                     {"handler", NULL},
                     {"eventType", NULL},
                     {"eventId", NULL},
                     {"key", NULL},
                     {"limit", NULL},
                     {"after", NULL}};
   struct evkeyvalq q;
   char why[160];
   store_list_filter_t f = {0};
   int64_t limit = 100, after_created = 0;
   bson_oid_t after_oid;
   bool has_after = false, more = false;
   bson_t raw = BSON_INITIALIZER, doc = BSON_INITIALIZER, arr;
   bson_iter_t it;
   bson_error_t err;
   char last_cursor[64] = "";
   uint32_t i = 0;

   if (!parse_params (req, p, P_N, &q, why, sizeof why)) {
      send_error (a, req, 400, "%s", why);
      goto done;
   }
   if (p[P_STATUS].value && strcmp (p[P_STATUS].value, "pending") != 0 && strcmp (p[P_STATUS].value, "dead") != 0 &&
       strcmp (p[P_STATUS].value, "completed") != 0) {
      send_error (a, req, 400, "status must be pending, dead or completed");
      goto done;
   }
   if (p[P_LIMIT].value && !parse_int (p[P_LIMIT].value, 1, 1000, &limit)) {
      send_error (a, req, 400, "limit must be an integer from 1 to 1000");
      goto done;
   }
   if (p[P_AFTER].value) {
      /* Our own cursor: "<createdAt ms>.<24 hex>". */
      const char *dot = strchr (p[P_AFTER].value, '.');
      char num[24];
      if (!dot || (size_t) (dot - p[P_AFTER].value) >= sizeof num || strlen (dot + 1) != 24 || !bson_oid_is_valid (dot + 1, 24)) {
         send_error (a, req, 400, "after must be a cursor from a previous page");
         goto done;
      }
      memcpy (num, p[P_AFTER].value, (size_t) (dot - p[P_AFTER].value));
      num[dot - p[P_AFTER].value] = '\0';
      if (!parse_int (num, 0, INT64_MAX, &after_created)) {
         send_error (a, req, 400, "after must be a cursor from a previous page");
         goto done;
      }
      bson_oid_init_from_string (&after_oid, dot + 1);
      has_after = true;
   }
   f.status = p[P_STATUS].value;
   f.handler = p[P_HANDLER].value;
   f.event_type = p[P_TYPE].value;
   f.event_id = p[P_EVENT].value;
   f.key = p[P_KEY].value;
   f.limit = limit;
   if (!store_list_page (a->store, &f, after_created, has_after ? &after_oid : NULL, &raw, &more, &err)) {
      send_error (a, req, 502, "listing deliveries failed: %s", err.message);
      goto done;
   }
   BSON_APPEND_ARRAY_BEGIN (&doc, "deliveries", &arr);
   if (bson_iter_init (&it, &raw))
      while (bson_iter_next (&it)) {
         bson_t d, item;
         const uint8_t *data;
         uint32_t len;
         char buf[16];
         const char *key;
         bson_iter_t id;

         if (!BSON_ITER_HOLDS_DOCUMENT (&it))
            continue;
         bson_iter_document (&it, &len, &data);
         if (!bson_init_static (&d, data, len))
            continue;
         bson_uint32_to_string (i++, &key, buf, sizeof buf);
         BSON_APPEND_DOCUMENT_BEGIN (&arr, key, &item);
         delivery_json (&item, &d);
         bson_append_document_end (&arr, &item);
         if (bson_iter_init_find (&id, &d, "_id") && BSON_ITER_HOLDS_OID (&id)) {
            char hex[25];
            bson_oid_to_string (bson_iter_oid (&id), hex);
            snprintf (last_cursor, sizeof last_cursor, "%" PRId64 ".%s", doc_date (&d, "createdAt"), hex);
         }
      }
   bson_append_array_end (&doc, &arr);
   BSON_APPEND_INT32 (&doc, "count", (int32_t) i);
   if (more && last_cursor[0])
      BSON_APPEND_UTF8 (&doc, "next", last_cursor);
   else
      BSON_APPEND_NULL (&doc, "next");
   send_json (req, 200, "OK", &doc);
done:
   evhttp_clear_headers (&q);
   bson_destroy (&raw);
   bson_destroy (&doc);
}

/* POST /api/deliveries/requeue and /api/deliveries/bury: {"ids": [...]} */
static void
handle_requeue_bury (admin_t *a, struct evhttp_request *req, bool bury)
{
   static const char *const requeue_fields[] = {"ids", NULL};
   static const char *const bury_fields[] = {"ids", "reason", NULL};
   bson_t body;
   const char **ids = NULL, **done_ids = NULL, **kept_ids = NULL;
   size_t n = 0, changed = 0, n_kept = 0;
   bson_error_t err;
   char reason[300] = "buried by an operator";
   char peer[80], list[600], kept_list[600];
   bson_t doc = BSON_INITIALIZER;
   int64_t now;
   bool ok;

   if (!read_body (a, req, &body)) {
      bson_destroy (&doc);
      return;
   }
   if (!only_fields (a, req, &body, bury ? bury_fields : requeue_fields) || !read_ids (a, req, &body, &ids, &n))
      goto done;
   if (bury) {
      bson_iter_t it;
      if (bson_iter_init_find (&it, &body, "reason")) {
         uint32_t len;
         const char *r;
         if (!BSON_ITER_HOLDS_UTF8 (&it) || (r = bson_iter_utf8 (&it, &len), len == 0 || len > 200)) {
            send_error (a, req, 400, "\"reason\" must be a string of 1 to 200 characters");
            goto done;
         }
         snprintf (reason, sizeof reason, "buried by an operator: %s", r);
      }
   }
   /* One id at a time, so the log and the answer say exactly which
    * deliveries changed. */
   done_ids = bson_malloc0 ((n ? n : 1) * sizeof *done_ids);
   kept_ids = bson_malloc0 ((n ? n : 1) * sizeof *kept_ids);
   now = now_ms ();
   ok = true;
   for (size_t i = 0; ok && i < n; i++) {
      size_t c = 0;
      ok = bury ? store_bury_ids (a->store, &ids[i], 1, now, reason, &c, &err) : store_requeue (a->store, &ids[i], 1, now, &c, &err);
      if (ok && c > 0)
         done_ids[changed++] = ids[i];
      else if (ok)
         kept_ids[n_kept++] = ids[i];
   }
   peer_of (req, peer, sizeof peer);
   ids_for_log (done_ids, changed, list, sizeof list);
   ids_for_log (kept_ids, n_kept, kept_list, sizeof kept_list);
   if (changed > 0)
      store_view_invalidate (a);
   if (!ok) {
      log_warn ("admin: %s %s of %zu deliveries failed after %zu changed (%s): %s",
                peer,
                bury ? "bury" : "requeue",
                n,
                changed,
                list[0] ? list : "none",
                err.message);
      send_error (a, req, 502, "%s failed after %zu of %zu: %s", bury ? "bury" : "requeue", changed, n, err.message);
      goto done;
   }
   if (bury)
      log_info ("admin: %s buried %zu of %zu requested deliveries (lastError \"%s\"): %s%s%s",
                peer,
                changed,
                n,
                reason,
                list[0] ? list : "none",
                n_kept ? "; not pending or running, unchanged: " : "",
                kept_list);
   else
      log_info ("admin: %s requeued %zu of %zu requested deliveries (pending and due now): %s%s%s",
                peer,
                changed,
                n,
                list[0] ? list : "none",
                n_kept ? "; not dead, unchanged: " : "",
                kept_list);
   if (!bury && changed > 0)
      dispatch_wake ();
   BSON_APPEND_INT64 (&doc, "requested", (int64_t) n);
   BSON_APPEND_INT64 (&doc, bury ? "buried" : "requeued", (int64_t) changed);
   {
      bson_t arr;
      char buf[16];
      const char *key;
      BSON_APPEND_ARRAY_BEGIN (&doc, "ids", &arr);
      for (size_t i = 0; i < changed; i++) {
         bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
         BSON_APPEND_UTF8 (&arr, key, done_ids[i]);
      }
      bson_append_array_end (&doc, &arr);
   }
   send_json (req, 200, "OK", &doc);
done:
   bson_free ((void *) ids);
   bson_free ((void *) done_ids);
   bson_free ((void *) kept_ids);
   bson_destroy (&body);
   bson_destroy (&doc);
}

/* A cutoff: an ISO-8601 UTC string, an integer of ms since the epoch, or a
 * BSON date ({"$date": ...} in the JSON).  Objects and the rest: 400. */
static bool
read_cutoff (admin_t *a, struct evhttp_request *req, const bson_t *body, const char *name, int64_t *ms)
{
   bson_iter_t it;

   *ms = 0;
   if (!bson_iter_init_find (&it, body, name))
      return true;
   if (BSON_ITER_HOLDS_UTF8 (&it) && parse_iso8601 (bson_iter_utf8 (&it, NULL), ms) && *ms > 0)
      return true;
   if ((BSON_ITER_HOLDS_INT32 (&it) || BSON_ITER_HOLDS_INT64 (&it)) && bson_iter_as_int64 (&it) > 0) {
      *ms = bson_iter_as_int64 (&it);
      return true;
   }
   if (BSON_ITER_HOLDS_DATE_TIME (&it) && bson_iter_date_time (&it) > 0) {
      *ms = bson_iter_date_time (&it);
      return true;
   }
   send_error (a, req, 400, "\"%s\" must be an ISO-8601 UTC time (\"2026-11-30T00:00:00Z\") or milliseconds since the epoch", name);
   return false;
}

/* POST /api/purge: {"deadBefore": ..., "completedBefore": ...} */
static void
handle_purge (admin_t *a, struct evhttp_request *req)
{
   static const char *const fields[] = {"deadBefore", "completedBefore", NULL};
   store_purge_opts_t o = {0};
   store_purge_result_t r;
   bson_t body, doc = BSON_INITIALIZER;
   bson_error_t err;
   char peer[80], d1[64] = "-", d2[64] = "-";

   if (!read_body (a, req, &body)) {
      bson_destroy (&doc);
      return;
   }
   if (!only_fields (a, req, &body, fields) || !read_cutoff (a, req, &body, "deadBefore", &o.dead_before) ||
       !read_cutoff (a, req, &body, "completedBefore", &o.completed_before))
      goto done;
   if (!o.dead_before && !o.completed_before) {
      send_error (a, req, 400, "give deadBefore, completedBefore or both");
      goto done;
   }
   peer_of (req, peer, sizeof peer);
   if (o.dead_before)
      iso8601 (o.dead_before, d1);
   if (o.completed_before)
      iso8601 (o.completed_before, d2);
   if (!store_purge (a->store, &o, &r, &err)) {
      log_warn ("admin: %s purge (dead before %s, completed before %s) failed: %s", peer, d1, d2, err.message);
      send_error (a, req, 502, "purge failed: %s", err.message);
      goto done;
   }
   log_info ("admin: %s purged dead before %s, completed before %s: %" PRId64 " dead deliveries, %" PRId64
             " completion records, %" PRId64 " events deleted",
             peer,
             d1,
             d2,
             r.dead,
             r.completed,
             r.events);
   store_view_invalidate (a);
   BSON_APPEND_INT64 (&doc, "dead", r.dead);
   BSON_APPEND_INT64 (&doc, "completed", r.completed);
   BSON_APPEND_INT64 (&doc, "events", r.events);
   send_json (req, 200, "OK", &doc);
done:
   bson_destroy (&body);
   bson_destroy (&doc);
}

static void
handle_lanes (admin_t *a, struct evhttp_request *req)
{
   bson_t lanes = BSON_INITIALIZER, doc = BSON_INITIALIZER, arr, owners;
   bson_error_t err;
   int64_t leased = 0, held = 0, now = now_ms ();
   bson_iter_t it;
   /* Owners with their lane and in-flight counts (few: one per worker). */
   struct {
      const char *owner;
      int64_t lanes, in_flight, live;
   } own[64];
   size_t n_own = 0;

   if (!store_list_lanes (a->store, now, a->local_prefix, &lanes, &leased, &held, &err)) {
      send_error (a, req, 502, "reading the lanes failed: %s", err.message);
      goto done;
   }
   BSON_APPEND_INT64 (&doc, "leased", leased);
   BSON_APPEND_INT64 (&doc, "heldHere", held);
   BSON_APPEND_UTF8 (&doc, "localOwnerPrefix", a->local_prefix);
   BSON_APPEND_ARRAY_BEGIN (&doc, "lanes", &arr);
   if (bson_iter_init (&it, &lanes))
      while (bson_iter_next (&it)) {
         bson_t d, item;
         const uint8_t *data;
         uint32_t len;
         bson_iter_t f;
         const char *owner = NULL;
         int64_t in_flight = 0, exp = 0;
         bool live = false;
         size_t k;

         bson_iter_document (&it, &len, &data);
         if (!bson_init_static (&d, data, len))
            continue;
         BSON_APPEND_DOCUMENT_BEGIN (&arr, bson_iter_key (&it), &item);
         if (bson_iter_init (&f, &d))
            while (bson_iter_next (&f)) {
               const char *k2 = bson_iter_key (&f);
               if (!strcmp (k2, "leaseExpiresAt")) {
                  exp = bson_iter_as_int64 (&f);
                  append_date (&item, "leaseExpiresAt", exp);
               } else {
                  bson_append_iter (&item, k2, -1, &f);
               }
               if (!strcmp (k2, "owner"))
                  owner = bson_iter_utf8 (&f, NULL);
               else if (!strcmp (k2, "inFlight"))
                  in_flight = bson_iter_as_int64 (&f);
               else if (!strcmp (k2, "live"))
                  live = bson_iter_as_bool (&f);
            }
         bson_append_document_end (&arr, &item);
         if (!owner)
            continue;
         for (k = 0; k < n_own && strcmp (own[k].owner, owner) != 0; k++)
            ;
         if (k == n_own && n_own < sizeof own / sizeof own[0]) {
            own[n_own].owner = owner;
            own[n_own].lanes = own[n_own].in_flight = own[n_own].live = 0;
            n_own++;
         }
         if (k < n_own) {
            own[k].lanes++;
            own[k].in_flight += in_flight;
            own[k].live += live;
         }
      }
   bson_append_array_end (&doc, &arr);
   BSON_APPEND_ARRAY_BEGIN (&doc, "owners", &owners);
   for (size_t k = 0; k < n_own; k++) {
      char buf[16];
      const char *key;
      bson_t o;
      bson_uint32_to_string ((uint32_t) k, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (&owners, key, &o);
      BSON_APPEND_UTF8 (&o, "owner", own[k].owner);
      BSON_APPEND_INT64 (&o, "lanes", own[k].lanes);
      BSON_APPEND_INT64 (&o, "liveLanes", own[k].live);
      BSON_APPEND_INT64 (&o, "inFlight", own[k].in_flight);
      BSON_APPEND_BOOL (&o, "thisProcess", !strncmp (own[k].owner, a->local_prefix, strlen (a->local_prefix)));
      bson_append_document_end (&owners, &o);
   }
   bson_append_array_end (&doc, &owners);
   send_json (req, 200, "OK", &doc);
done:
   bson_destroy (&lanes);
   bson_destroy (&doc);
}

static void
handle_clients (admin_t *a, struct evhttp_request *req)
{
   param_t p[1] = {{"limit", NULL}};
   struct evkeyvalq q;
   char why[160];
   int64_t limit = ADMIN_CLIENTS_DEFAULT;
   bson_t doc = BSON_INITIALIZER, arr;
   uint64_t total;

   if (!parse_params (req, p, 1, &q, why, sizeof why)) {
      send_error (a, req, 400, "%s", why);
      goto done;
   }
   if (p[0].value && !parse_int (p[0].value, 1, ADMIN_CLIENTS_MAX, &limit)) {
      send_error (a, req, 400, "limit must be an integer from 1 to %d", ADMIN_CLIENTS_MAX);
      goto done;
   }
   BSON_APPEND_ARRAY_BEGIN (&doc, "clients", &arr);
   total = clients_registry_snapshot (&arr, (uint32_t) limit);
   bson_append_array_end (&doc, &arr);
   BSON_APPEND_INT64 (&doc, "count", (int64_t) total);
   send_json (req, 200, "OK", &doc);
done:
   evhttp_clear_headers (&q);
   bson_destroy (&doc);
}

/* The key table with the values in force; the token and secrets masked. */
static void
handle_config (admin_t *a, struct evhttp_request *req)
{
   config_t *cfg = config_acquire ();
   size_t n = 0;
   const config_key_t *keys = config_keys (&n);
   bson_t doc = BSON_INITIALIZER, arr;
   uint32_t i = 0;

   (void) a;
   BSON_APPEND_ARRAY_BEGIN (&doc, "keys", &arr);
   for (size_t k = 0; cfg && k < n; k++) {
      const config_key_t *key = &keys[k];
      char buf[16];
      const char *idx;
      bson_t item;
      bool secret = !strcmp (key->name, "token") || !strcmp (key->name, "secret");
      size_t n_obj = key->section == CONFIG_SECTION_HANDLER ? cfg->n_handlers : 1;

      for (size_t h = 0; h < n_obj; h++) {
         const char *base = key->section == CONFIG_SECTION_HANDLER ? (const char *) &cfg->handlers[h] : (const char *) cfg;
         bson_uint32_to_string (i++, &idx, buf, sizeof buf);
         BSON_APPEND_DOCUMENT_BEGIN (&arr, idx, &item);
         BSON_APPEND_UTF8 (&item, "section", config_section_name (key->section));
         if (key->section == CONFIG_SECTION_HANDLER)
            BSON_APPEND_UTF8 (&item, "handler", cfg->handlers[h].name);
         BSON_APPEND_UTF8 (&item, "name", key->name);
         switch (key->type) {
         case CONFIG_TYPE_INT:
            BSON_APPEND_INT64 (&item, "value", *(const int64_t *) (base + key->offset));
            break;
         case CONFIG_TYPE_BOOL:
            BSON_APPEND_BOOL (&item, "value", *(const bool *) (base + key->offset));
            break;
         default: {
            const char *v = *(char *const *) (base + key->offset);
            if (secret)
               BSON_APPEND_UTF8 (&item, "value", v && *v ? "********" : "");
            else if (v && strstr (v, "://"))
               append_masked_url (&item, "value", v);
            else if (v && bson_utf8_validate (v, strlen (v), false))
               BSON_APPEND_UTF8 (&item, "value", v);
            else
               BSON_APPEND_NULL (&item, "value");
         }
         }
         if (key->default_value && !secret)
            BSON_APPEND_UTF8 (&item, "default", key->default_value);
         BSON_APPEND_BOOL (&item, "reloadable", key->reloadable);
         BSON_APPEND_UTF8 (&item, "help", key->help ? key->help : "");
         bson_append_document_end (&arr, &item);
      }
   }
   bson_append_array_end (&doc, &arr);
   send_json (req, 200, "OK", &doc);
   bson_destroy (&doc);
   config_release (cfg);
}

static void
handle_dashboard (admin_t *a, struct evhttp_request *req)
{
   struct evkeyvalq *h = evhttp_request_get_output_headers (req);

   (void) a;
   /* Everything is inline; nothing may be fetched from elsewhere. */
   evhttp_add_header (h,
                      "Content-Security-Policy",
                      "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                      "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
                      "form-action 'none'");
   evhttp_add_header (h, "Referrer-Policy", "no-referrer");
   send_text (req, 200, "OK", "text/html; charset=utf-8", (const char *) admin_dashboard_html, (size_t) admin_dashboard_html_len);
}

/* ---------------------------------------------------------------- routing */

typedef struct {
   const char *path;
   enum evhttp_cmd_type method;
   bool auth;
   void (*fn) (admin_t *a, struct evhttp_request *req);
} route_t;

static void
handle_requeue (admin_t *a, struct evhttp_request *req)
{
   handle_requeue_bury (a, req, false);
}

static void
handle_bury (admin_t *a, struct evhttp_request *req)
{
   handle_requeue_bury (a, req, true);
}

static const route_t routes[] = {
   {"/", EVHTTP_REQ_GET, false, handle_dashboard},
   {"/healthz", EVHTTP_REQ_GET, false, handle_healthz},
   {"/readyz", EVHTTP_REQ_GET, false, handle_readyz},
   {"/metrics", EVHTTP_REQ_GET, true, handle_metrics},
   {"/api/stats", EVHTTP_REQ_GET, true, handle_stats},
   {"/api/handlers", EVHTTP_REQ_GET, true, handle_handlers},
   {"/api/deliveries", EVHTTP_REQ_GET, true, handle_deliveries},
   {"/api/deliveries/requeue", EVHTTP_REQ_POST, true, handle_requeue},
   {"/api/deliveries/bury", EVHTTP_REQ_POST, true, handle_bury},
   {"/api/purge", EVHTTP_REQ_POST, true, handle_purge},
   {"/api/lanes", EVHTTP_REQ_GET, true, handle_lanes},
   {"/api/clients", EVHTTP_REQ_GET, true, handle_clients},
   {"/api/config", EVHTTP_REQ_GET, true, handle_config},
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

   atomic_fetch_add (&a->requests, 1);
   if (!path || !*path)
      path = "/";
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
         send_error (a, req, 405, "method not allowed");
      } else {
         send_error (a, req, 404, "no such endpoint");
      }
      return;
   }
   /* The token guards /metrics and /api/..., whatever the path spelling:
    * routes match exactly, so "/api/../x" is simply unknown. */
   if (r->auth && !authorized (req)) {
      char peer[80];
      log_info ("admin: %s: 401 for %s %s", peer_of (req, peer, sizeof peer), method == EVHTTP_REQ_POST ? "POST" : "GET", r->path);
      send_error (a, req, 401, "a valid bearer token is required");
      return;
   }
   if (method == EVHTTP_REQ_POST && !host_allowed (a, req)) {
      char peer[80];
      log_warn ("admin: %s: 403 for POST %s: no token is set and Host is not an address of this port",
                peer_of (req, peer, sizeof peer),
                r->path);
      send_error (a, req, 403, "without an admin token, actions must address this port by IP or localhost");
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
   struct bufferevent *bev = bufferevent_socket_new (base, -1, BEV_OPT_CLOSE_ON_FREE);

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
         atomic_fetch_add (&a->rejected, 1);
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
admin_stop_cb (evutil_socket_t fd, short what, void *arg)
{
   admin_t *a = arg;

   (void) fd;
   (void) what;
   event_base_loopbreak (a->base);
}

static void *
admin_thread (void *arg)
{
   admin_t *a = arg;

   log_set_thread_name ("admin");
   event_base_dispatch (a->base);
   return NULL;
}

static void
admin_free (admin_t *a)
{
   if (!a)
      return;
   if (a->http)
      evhttp_free (a->http); /* closes the connections: closecb runs */
   if (a->view_at > 0)
      store_view_clear (&a->view);
   bson_free (a->fresh);
   if (a->stop_ev)
      event_free (a->stop_ev);
   if (a->adopt_ev)
      event_free (a->adopt_ev);
   if (a->base)
      event_base_free (a->base);
   store_destroy (a->store);
   if (a->pool)
      mongoc_client_pool_destroy (a->pool);
   if (a->uri)
      mongoc_uri_destroy (a->uri);
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
   admin_t *a;
   store_opts_t so = {0};
   bson_error_t err;
   char *slash;

   metrics_set_handlers (cfg);
   if (!cfg->admin_listen || !*cfg->admin_listen) {
      log_info ("admin: [admin] listen is empty: the admin port is off");
      return true;
   }
   a = bson_malloc0 (sizeof *a);
   a->cfg = config_retain (cfg);
   a->topo = topo;
   a->start_ms = now_ms ();

   a->uri = mongoc_uri_new_with_error (cfg->upstream, &err);
   if (!a->uri) {
      bson_set_error (error, ADMIN_ERROR_DOMAIN, 1, "admin: upstream URI: %s", err.message);
      goto fail;
   }
   mongoc_uri_set_appname (a->uri, "relaybus-proxy admin");
   /* A request waits at most this long for MongoDB: the admin thread must
    * not hang on an unreachable upstream. */
   if (!mongoc_uri_has_option (a->uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS))
      mongoc_uri_set_option_as_int32 (a->uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, 2000);
   if (!mongoc_uri_has_option (a->uri, MONGOC_URI_SOCKETTIMEOUTMS))
      mongoc_uri_set_option_as_int32 (a->uri, MONGOC_URI_SOCKETTIMEOUTMS, 10000);
   a->pool = mongoc_client_pool_new_with_error (a->uri, &err);
   if (!a->pool) {
      bson_set_error (error, ADMIN_ERROR_DOMAIN, 2, "admin: client pool: %s", err.message);
      goto fail;
   }
   mongoc_client_pool_set_error_api (a->pool, MONGOC_ERROR_API_VERSION_2);
   /* One thread, one request at a time: a few clients are plenty. */
   (void) mongoc_client_pool_max_size (a->pool, 4);
   store_make_owner (a->owner, sizeof a->owner);
   bson_strncpy (a->local_prefix, a->owner, sizeof a->local_prefix);
   slash = strchr (a->local_prefix, '/');
   slash = slash ? strchr (slash + 1, '/') : NULL;
   if (slash)
      slash[1] = '\0';
   so.database = cfg->outbox_database;
   so.prefix = cfg->collection_prefix;
   so.completion_history = cfg->completion_history;
   so.owner = a->owner; /* never claims: the name only fills the field */
   a->store = store_new (a->pool, &so, error);
   if (!a->store)
      goto fail;

   a->base = event_base_new ();
   a->http = a->base ? evhttp_new (a->base) : NULL;
   a->stop_ev = a->base ? event_new (a->base, -1, 0, admin_stop_cb, a) : NULL;
   a->adopt_ev = a->base ? event_new (a->base, -1, 0, admin_adopt_cb, a) : NULL;
   if (!a->http || !a->stop_ev || !a->adopt_ev) {
      bson_set_error (error, ADMIN_ERROR_DOMAIN, 3, "admin: cannot create the HTTP server");
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
   pthread_mutex_lock (&g_mu);
   g_admin = a;
   pthread_mutex_unlock (&g_mu);
   if (pthread_create (&a->thread, NULL, admin_thread, a) != 0) {
      pthread_mutex_lock (&g_mu);
      g_admin = NULL;
      pthread_mutex_unlock (&g_mu);
      bson_set_error (error, ADMIN_ERROR_DOMAIN, 4, "admin: cannot start the thread");
      goto fail;
   }
   a->thread_started = true;
   log_info ("admin: listening on %s (%s)",
             a->address,
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
   if (a->thread_started) {
      event_active (a->stop_ev, EV_TIMEOUT, 0);
      pthread_join (a->thread, NULL);
   }
   admin_free (a);
   clients_registry_clear ();
   log_info ("admin: stopped");
}
