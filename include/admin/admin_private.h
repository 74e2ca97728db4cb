/*
 * admin/admin_private.h - what admin/http.c (the HTTP server: limits, auth, routing,
 * connections, lifecycle), admin/api.c (the endpoints) and admin/history.c
 * (the endpoints of the attempt records) share, and nobody else uses: the
 * admin port's structure, the response helpers, and the query and document
 * helpers of the endpoints.
 *
 * Thread: the admin thread.
 */
#ifndef RELAYBUS_ADMIN_PRIVATE_H
#define RELAYBUS_ADMIN_PRIVATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <pthread.h>

#include "admin/admin.h"
#include "base/config.h"
#include "base/worker.h"
#include "store/store.h"
#include "store/ops.h"
#include "store/fleet.h"
#include "base/topology.h"

struct bufferevent;
struct event;
struct event_base;
struct evhttp;
struct evhttp_connection;
struct evhttp_request;

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
   store_handler_state_t *disabled; /* the outbox's disabled handlers (owned) */
   size_t n_disabled;
   char error[256];
} store_view_t;

#define ADMIN_VIEW_CACHE_MS 1000

/* The admin port.  Created by admin_start on the main thread; then used by
 * its worker's thread only, until admin_stop joined it and frees it. */
struct admin {
   config_t *cfg; /* our reference: handlers, upstream; the token is read per request */
   topology_t *topo; /* borrowed */
   worker_t *w;      /* ours: the thread, its event base and pool, the owner name */
   struct evhttp *http;
   struct event *adopt_ev;
   char address[300]; /* host:port actually bound */
   /* [admin] tls_cert_file/tls_key_file, loaded once by admin_start (the
    * keys need a restart); NULL: plain HTTP.  Ours, freed by admin_free
    * after evhttp, whose connections hold SSLs made from it. */
   struct ssl_ctx_st *tls;

   store_t *store;
   const char *local_prefix; /* the worker's owner prefix "<host>/<pid>/": lanes of this process */
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

   /* admin/operator.c: posts again to the loops whose queue was full;
    * NULL until first needed. */
   struct event *operator_kick_ev;
};

/* Milliseconds since the Unix epoch. */

/* "<ip>:<port>" of the request's peer, into buf. */
const char *admin_peer_of (struct evhttp_request *req, char *buf, size_t len);

/* Replies with `body` (HEAD: the headers only) and the no-cache headers. */
void admin_send_text (struct evhttp_request *req,
                      int code,
                      const char *reason,
                      const char *content_type,
                      const char *body,
                      size_t len);
/* Replies with `doc` as relaxed Extended JSON (plain JSON for the types
 * the API uses).  A key or string that is not valid UTF-8 (from the store)
 * is repaired with admin_json_repair: it never turns the whole answer into
 * a 500. */
void admin_send_json (struct evhttp_request *req, int code, const char *reason, const bson_t *doc);
/* Appends `in` to `out` with every key and string that is not valid UTF-8
 * replaced by its utf8_repair (U+FFFD per bad byte); nested documents and
 * arrays are copied the same way, up to 32 levels (deeper ones are left
 * out). */
void admin_json_repair (const bson_t *in, bson_t *out);
/* Replies {"error": message}; counts 4xx as rejected; 401 adds
 * WWW-Authenticate. */
void admin_send_error (admin_t *a, struct evhttp_request *req, int code, const char *fmt, ...)
   __attribute__ ((format (printf, 4, 5)));

/* The endpoints (admin/api.c).  Each answers the request. */
typedef void (*admin_handler_t) (admin_t *a, struct evhttp_request *req);
void admin_api_healthz (admin_t *a, struct evhttp_request *req);
void admin_api_readyz (admin_t *a, struct evhttp_request *req);
void admin_api_metrics (admin_t *a, struct evhttp_request *req);
void admin_api_stats (admin_t *a, struct evhttp_request *req);
void admin_api_handlers (admin_t *a, struct evhttp_request *req);
void admin_api_deliveries (admin_t *a, struct evhttp_request *req);
void admin_api_requeue (admin_t *a, struct evhttp_request *req);
void admin_api_bury (admin_t *a, struct evhttp_request *req);
void admin_api_replay (admin_t *a, struct evhttp_request *req);
void admin_api_purge (admin_t *a, struct evhttp_request *req);
void admin_api_lanes (admin_t *a, struct evhttp_request *req);
void admin_api_clients (admin_t *a, struct evhttp_request *req);
void admin_api_config (admin_t *a, struct evhttp_request *req);
void admin_api_dashboard (admin_t *a, struct evhttp_request *req);
/* The endpoints' helpers (admin/api.c), for admin/history.c too. */
typedef struct {
   const char *name;
   const char *value; /* NULL: absent */
} api_param_t;
struct evkeyvalq;
/* Parses the query string into `params` (names listed by the caller).
 * Unknown names (`status[$ne]`), repeated names, over-long or non-UTF-8
 * values are refused with a message in `why`. */
bool api_parse_params (
   struct evhttp_request *req, api_param_t *params, size_t n, struct evkeyvalq *store, char *why, size_t why_len);
/* A decimal integer in [min, max], nothing else. */
bool api_parse_int (const char *s, int64_t min, int64_t max, int64_t *out);
/* Our own page cursors: "<ms>.<24 hex>". */
bool api_parse_cursor (const char *s, int64_t *ms, bson_oid_t *oid);
/* "YYYY-MM-DDTHH:MM:SS[.fff]Z" into ms since the epoch. */
bool api_parse_iso8601 (const char *s, int64_t *ms);
/* A string field of `doc` (NULL: none). */
const char *api_doc_utf8 (const bson_t *doc, const char *field);
/* A page's end: "count", and "next", the cursor of the last document of
 * `page` (the store's array of them) with an ObjectId _id, from its date
 * field `date_field` and its _id (what api_parse_cursor reads), or null
 * when there is no `more` or no such document. */
void api_append_page_end (bson_t *out, const bson_t *page, uint32_t count, const char *date_field, bool more);
/* `ms` as an ISO-8601 string named `name` (nothing for 0). */
void api_append_date (bson_t *out, const char *name, int64_t ms);
/* A delivery (or a record) as the API shows it: ids as strings, dates as
 * ISO-8601 strings, internals left out. */
void api_delivery_json (bson_t *out, const bson_t *doc);

/* What happened to a delivery and to an event (the attempt records, admin/history.c):
 * GET /api/deliveries/ID/attempts, GET /api/events/ID and GET
 * /api/attempts.  admin_history_route maps the paths with an id to the
 * route table's patterns (NULL: not one of them). */
void admin_api_delivery_attempts (admin_t *a, struct evhttp_request *req);
void admin_api_event (admin_t *a, struct evhttp_request *req);
void admin_api_attempts (admin_t *a, struct evhttp_request *req);
const char *admin_history_route (const char *path);

/* The operator's commands (admin/operator.c), a block of their own. */
void admin_api_pause (admin_t *a, struct evhttp_request *req);
void admin_api_resume (admin_t *a, struct evhttp_request *req);
void admin_api_reconnect (admin_t *a, struct evhttp_request *req);
/* POST /api/clients/ID/close: admin_operator_route tells its paths. */
void admin_api_client_close (admin_t *a, struct evhttp_request *req);
bool admin_operator_route (const char *path);
/* POST /api/handlers/NAME/disable and /enable: admin_handler_route maps
 * their paths to the route table's patterns (NULL: not one of them). */
void admin_api_handler_disable (admin_t *a, struct evhttp_request *req);
void admin_api_handler_enable (admin_t *a, struct evhttp_request *req);
const char *admin_handler_route (const char *path);
/* After a change: the next store view is read afresh. */
void admin_view_invalidate (admin_t *a);

/* Frees the cached outbox view (admin_free). */
void admin_api_clear_cache (admin_t *a);

#endif /* RELAYBUS_ADMIN_PRIVATE_H */
