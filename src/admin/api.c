/*
 * admin/api.c - the admin port's endpoints: probes, /metrics, the JSON API
 * and the dashboard page (see docs/admin.md).  admin/http.c has already checked
 * the method, the token and the Host of actions when these run, on the
 * admin thread.
 *
 * Input from a request reaches the store only as strings, ObjectIds parsed
 * from 24 hex characters, or integers: query parameters are checked against
 * each endpoint's list of names (so `status[$ne]=x` is an unknown
 * parameter, a 400), and JSON bodies field by field (an id that is an
 * object is a 400).  Every action that changes something (requeue, bury,
 * replay, purge) is logged with the peer, what was asked and what changed.
 */
#include "admin/admin_private.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "autoconf.h"
#include "proxy/clients.h"
#include "dispatch/dispatch.h"
#include "base/clock.h"
#include "base/fleet.h"
#include "base/heartbeat.h"
#include "base/instance.h"
#include "base/log.h"
#include "admin/render.h"
#include "base/counters.h"
#include "base/outbox.h"
#include "codec/annotate.h"
#include "publish/txns.h"
#include "store/attempts.h"

#define ADMIN_MAX_PARAM_LEN 256
#define ADMIN_CLIENTS_DEFAULT 500
#define ADMIN_CLIENTS_MAX 10000

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
bool
api_parse_iso8601 (const char *s, int64_t *ms)
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

/* ------------------------------------------------------- query parameters */

/* Parses the query string into `params` (names listed by the caller).
 * Unknown names (`status[$ne]`), repeated names, over-long or non-UTF-8
 * values are refused with a message in `why`. */
bool
api_parse_params (struct evhttp_request *req, api_param_t *params, size_t n, struct evkeyvalq *store, char *why, size_t why_len)
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

bool
api_parse_int (const char *s, int64_t min, int64_t max, int64_t *out)
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

/* Our own page cursors: "<ms>.<24 hex>" (a time in ms since the epoch
 * and the last row's ObjectId). */
bool
api_parse_cursor (const char *s, int64_t *ms, bson_oid_t *oid)
{
   const char *dot = strchr (s, '.');
   char num[24];

   if (!dot || (size_t) (dot - s) >= sizeof num || strlen (dot + 1) != 24 || !bson_oid_is_valid (dot + 1, 24))
      return false;
   memcpy (num, s, (size_t) (dot - s));
   num[dot - s] = '\0';
   if (!api_parse_int (num, 0, INT64_MAX, ms))
      return false;
   bson_oid_init_from_string (oid, dot + 1);
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
      admin_send_error (a, req, 415, "the body must be JSON (Content-Type: application/json)");
      return false;
   }
   if (len == 0) {
      admin_send_error (a, req, 400, "an empty body; expected a JSON object");
      return false;
   }
   if (len > ADMIN_MAX_BODY_SIZE) {
      admin_send_error (a, req, 400, "the body is larger than %d bytes", ADMIN_MAX_BODY_SIZE);
      return false;
   }
   data = evbuffer_pullup (in, (ev_ssize_t) len);
   if (data) {
      /* libbson would take a top-level array as a document of "0", "1"... */
      size_t i = 0;
      while (i < len && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n'))
         i++;
      if (i == len || data[i] != '{') {
         admin_send_error (a, req, 400, "the body must be a JSON object");
         return false;
      }
   }
   if (!data || !bson_init_from_json (doc, (const char *) data, (ssize_t) len, &err)) {
      admin_send_error (a, req, 400, "malformed JSON: %s", data ? err.message : "cannot read the body");
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
         admin_send_error (a, req, 400, "unknown field '%.64s'", k);
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
      admin_send_error (a, req, 400, "\"ids\" must be an array of delivery ids (24 hex characters)");
      return false;
   }
   while (bson_iter_next (&arr)) {
      uint32_t len = 0;
      const char *s;
      if (!BSON_ITER_HOLDS_UTF8 (&arr)) {
         admin_send_error (a, req, 400, "ids[%zu] is not a string: ids are 24 hex characters", *n);
         goto fail;
      }
      s = bson_iter_utf8 (&arr, &len);
      if (len != 24 || !bson_oid_is_valid (s, 24)) {
         admin_send_error (a, req, 400, "ids[%zu] is not a delivery id (24 hex characters)", *n);
         goto fail;
      }
      if (*n == ADMIN_MAX_IDS) {
         admin_send_error (a, req, 400, "at most %d ids per request", ADMIN_MAX_IDS);
         goto fail;
      }
      if (*n == cap) {
         cap = cap ? cap * 2 : 16;
         *ids = bson_realloc ((void *) *ids, cap * sizeof **ids);
      }
      (*ids)[(*n)++] = s;
   }
   if (*n == 0) {
      admin_send_error (a, req, 400, "\"ids\" is empty");
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

/* A date field of `doc` in ms (0: none). */
static int64_t
api_doc_date (const bson_t *doc, const char *field)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, doc, field) && BSON_ITER_HOLDS_DATE_TIME (&it) ? bson_iter_date_time (&it) : 0;
}

void
api_append_page_end (bson_t *out, const bson_t *page, uint32_t count, const char *date_field, bool more)
{
   char cursor[64] = "";
   bson_iter_t it;

   if (more && bson_iter_init (&it, page))
      while (bson_iter_next (&it)) {
         bson_iter_t id;
         bson_t d;
         const uint8_t *data;
         uint32_t len;
         char hex[25];

         if (!BSON_ITER_HOLDS_DOCUMENT (&it))
            continue;
         bson_iter_document (&it, &len, &data);
         if (!bson_init_static (&d, data, len) || !bson_iter_init_find (&id, &d, "_id") || !BSON_ITER_HOLDS_OID (&id))
            continue;
         bson_oid_to_string (bson_iter_oid (&id), hex);
         snprintf (cursor, sizeof cursor, "%" PRId64 ".%s", api_doc_date (&d, date_field), hex);
      }
   BSON_APPEND_INT32 (out, "count", (int32_t) count);
   if (cursor[0])
      BSON_APPEND_UTF8 (out, "next", cursor);
   else
      BSON_APPEND_NULL (out, "next");
}

void
api_append_date (bson_t *out, const char *name, int64_t ms)
{
   char iso[64];

   if (ms <= 0)
      return;
   iso8601 (ms, iso);
   BSON_APPEND_UTF8 (out, name, iso);
}

/* A delivery (or completion record) as the API shows it: ids as strings,
 * dates as ISO-8601 strings. */
void
api_delivery_json (bson_t *out, const bson_t *doc)
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
         api_append_date (out, k, bson_iter_date_time (&it));
      } else if (BSON_ITER_HOLDS_UTF8 (&it) || BSON_ITER_HOLDS_INT32 (&it) || BSON_ITER_HOLDS_INT64 (&it) ||
                 BSON_ITER_HOLDS_DOUBLE (&it) || BSON_ITER_HOLDS_BOOL (&it)) {
         bson_append_iter (out, k, -1, &it);
      }
      /* inFlight-style arrays and other internals are left out. */
   }
}

/* A string field of `doc`, or NULL. */
const char *
api_doc_utf8 (const bson_t *doc, const char *field)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, doc, field) && BSON_ITER_HOLDS_UTF8 (&it) ? bson_iter_utf8 (&it, NULL) : NULL;
}

/* Appends `value` through config_mask (the one masking of credentials):
 * the API shows the upstream URI and webhook URLs, never the credentials
 * in them.  A value that is not UTF-8 is shown as null. */
static void
append_masked (bson_t *doc, const char *name, const char *key_name, const char *value)
{
   char *masked = config_mask (key_name, value);

   if (masked && bson_utf8_validate (masked, strlen (masked), false))
      BSON_APPEND_UTF8 (doc, name, masked);
   else
      BSON_APPEND_NULL (doc, name);
   bson_free (masked);
}

/* ------------------------------------------------------------- handlers */

/* 503 while a forwarding loop is stalled (base/heartbeat.h): the process
 * answers here from its admin thread, but it does not forward. */
void
admin_api_healthz (admin_t *a, struct evhttp_request *req)
{
   char why[160], body[200];
   int n;

   (void) a;
   if (!heartbeat_check (clock_mono_ms (), HEARTBEAT_STALL_MS, why, sizeof why)) {
      n = snprintf (body, sizeof body, "unhealthy: %s\n", why);
      admin_send_text (req, 503, "Service Unavailable", "text/plain; charset=utf-8", body, (size_t) n);
      return;
   }
   admin_send_text (req, 200, "OK", "text/plain; charset=utf-8", "ok\n", 3);
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

void
admin_api_readyz (admin_t *a, struct evhttp_request *req)
{
   topology_primary_t snap;
   bson_t doc = BSON_INITIALIZER;
   bool up, outbox, ready;

   fleet_set_t *fs = fleet_acquire ();
   bool fleet = fs != NULL;

   fleet_release (fs);
   topology_get_primary (a->topo, &snap);
   up = snap.state == TOPOLOGY_STATE_PRIMARY;
   outbox = up && outbox_ready (a);
   /* Before the fleet's handler set is read, publishes are refused: the
    * events would miss the other proxies' handlers. */
   ready = up && outbox && fleet;
   BSON_APPEND_BOOL (&doc, "ready", ready);
   BSON_APPEND_UTF8 (&doc, "upstream", topology_state_name (snap.state));
   BSON_APPEND_BOOL (&doc, "outbox", outbox);
   BSON_APPEND_BOOL (&doc, "fleet", fleet);
   if (!up && snap.last_error[0] && bson_utf8_validate (snap.last_error, strlen (snap.last_error), false)) {
      /* The driver's error about the upstream may quote its URI. */
      char *masked = config_mask (NULL, snap.last_error);
      BSON_APPEND_UTF8 (&doc, "reason", masked);
      bson_free (masked);
   } else if (up && !fleet) {
      BSON_APPEND_UTF8 (&doc, "reason", "the fleet's handler set has not been read from the outbox yet: publishes are refused until it is");
   }
   {
      /* Broker connections are details, listed when there are any: a
       * broker that is down delays deliveries (they are retried), it does
       * not make the proxy unready. */
      bson_t brokers = BSON_INITIALIZER;
      dispatch_handler_states (&brokers);
      if (bson_count_keys (&brokers) > 0)
         BSON_APPEND_ARRAY (&doc, "brokers", &brokers);
      bson_destroy (&brokers);
   }
   admin_send_json (req, ready ? 200 : 503, ready ? "OK" : "Service Unavailable", &doc);
   bson_destroy (&doc);
}

static void
store_view_load (admin_t *a, store_view_t *v, int64_t now)
{
   bson_error_t err;

   memset (v, 0, sizeof *v);
   bson_init (&v->lanes);
   v->ok = store_statistics (a->store, now, &v->totals, &err) && store_handler_stats (a->store, &v->hs, &v->n_hs, &err) &&
           store_list_lanes (a->store, now, a->local_prefix, &v->lanes, &v->leased, &v->held, &err) &&
           store_fleet_disabled (a->store, &v->disabled, &v->n_disabled, CONFIG_MAX_HANDLERS * 4, &err);
   if (!v->ok) {
      /* Shown in /api/stats: the driver's text may quote the URI. */
      char *masked = config_mask (NULL, err.message);
      bson_strncpy (v->error, masked, sizeof v->error);
      bson_free (masked);
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
   store_handler_states_free (v->disabled, v->n_disabled);
   v->disabled = NULL;
   v->n_disabled = 0;
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

void
admin_view_invalidate (admin_t *a)
{
   store_view_invalidate (a);
}

void
admin_api_metrics (admin_t *a, struct evhttp_request *req)
{
   int64_t now = clock_now_ms ();
   topology_primary_t snap;
   const store_view_t *sv;
   render_view_t mv = {0};
   fleet_set_t *fs = fleet_acquire ();
   size_t live = 0;
   bson_string_t *out = bson_string_new (NULL);

   topology_get_primary (a->topo, &snap);
   sv = store_view (a, now);
   /* The registry's gauges that only a scrape reads. */
   for (size_t i = 0; fs && i < fs->n_instances; i++)
      live += fs->instances[i].live;
   counters_set (COUNTER_START_TIME, (uint64_t) (a->start_ms / 1000));
   counters_set (COUNTER_UPSTREAM_UP, snap.state == TOPOLOGY_STATE_PRIMARY);
   counters_set (COUNTER_OUTBOX_READY, sv->ok && outbox_ready (a));
   counters_set (COUNTER_FLEET_INSTANCES, live);
   counters_set (COUNTER_HANDLER_SETS_DISAGREEING, fs ? fs->n_disagreeing : 0);
   counters_set (COUNTER_POISON_ENTRIES, txns_poison_entries ());
   fleet_release (fs);
   mv.now_ms = now;
   mv.store_ok = sv->ok;
   mv.totals = sv->totals;
   mv.handlers = sv->hs;
   mv.n_handlers = sv->n_hs;
   mv.lanes_leased = sv->leased;
   mv.lanes_held = sv->held;
   process_stats_read (&mv.process);
   render_metrics (out, &mv);
   admin_send_text (req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", out->str, out->len);
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

/* A pull handler's consumers on this proxy, from the registry's
 * per-handler slots (the consumer thread publishes them as relaxed atomic
 * stores; each value is recent, and the values need not agree with each
 * other to the request). */
static void
append_consumers (bson_t *parent, size_t slot)
{
   bson_t doc;
   uint64_t v[7] = {0};

   if (slot != SIZE_MAX) {
      v[0] = counters_get_at (COUNTER_CONSUMER_CONNECTIONS, slot);
      v[1] = counters_get_at (COUNTER_CONSUMER_CLAIMS, slot);
      v[2] = counters_get_at (COUNTER_CONSUMER_LONG_POLLS, slot);
      v[3] = counters_get_at (COUNTER_CONSUMER_CLAIMED, slot);
      v[4] = counters_get_at (COUNTER_CONSUMER_COMPLETED, slot);
      v[5] = counters_get_at (COUNTER_CONSUMER_COMPLETED_TXN, slot);
      v[6] = counters_get_at (COUNTER_CONSUMER_CLOSED_CHARGED, slot);
   }
   BSON_APPEND_DOCUMENT_BEGIN (parent, "consumers", &doc);
   BSON_APPEND_INT64 (&doc, "connections", (int64_t) v[0]);
   BSON_APPEND_INT64 (&doc, "claims", (int64_t) v[1]);
   BSON_APPEND_INT64 (&doc, "longPolls", (int64_t) v[2]);
   BSON_APPEND_INT64 (&doc, "claimedTotal", (int64_t) v[3]);
   BSON_APPEND_INT64 (&doc, "completedTotal", (int64_t) v[4]);
   BSON_APPEND_INT64 (&doc, "completedInTransactionTotal", (int64_t) v[5]);
   BSON_APPEND_INT64 (&doc, "closedChargedTotal", (int64_t) v[6]);
   bson_append_document_end (parent, &doc);
}

static void
append_handler (admin_t *a, bson_t *arr, uint32_t i, const store_handler_stats_t *h, int64_t now, bool with_config)
{
   const config_handler_t *hc = handler_cfg (a, h->name);
   size_t slot = counters_handler_slot (h->name, false);
   uint64_t completed = 0, retried = 0, dead = 0;
   counters_histogram_t lat = {0};
   char buf[16];
   const char *key;
   bson_t doc;

   if (slot != SIZE_MAX) {
      completed = counters_get_at (COUNTER_DELIVERIES_COMPLETED, slot);
      retried = counters_get_at (COUNTER_DELIVERIES_RETRIED, slot);
      dead = counters_get_at (COUNTER_DELIVERIES_DEAD, slot);
      counters_histogram (COUNTER_HANDLER_LATENCY, slot, &lat);
   }
   bson_uint32_to_string (i, &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (arr, key, &doc);
   BSON_APPEND_UTF8 (&doc, "name", h->name);
   BSON_APPEND_BOOL (&doc, "configured", hc != NULL);
   if (hc)
      BSON_APPEND_UTF8 (&doc, "kind", hc->kind);
   {
      /* The outbox's state (a->view is the view h comes from). */
      const store_handler_state_t *st = NULL;

      for (size_t k = 0; k < a->view.n_disabled && !st; k++)
         if (!strcmp (a->view.disabled[k].name, h->name))
            st = &a->view.disabled[k];
      BSON_APPEND_UTF8 (&doc, "state", st ? "disabled" : "enabled");
      if (st) {
         BSON_APPEND_UTF8 (&doc, "disabledReason", st->reason);
         api_append_date (&doc, "disabledAt", st->at);
      }
   }
   BSON_APPEND_INT64 (&doc, "pending", h->pending);
   BSON_APPEND_INT64 (&doc, "parked", h->parked);
   BSON_APPEND_INT64 (&doc, "dead", h->dead);
   api_append_date (&doc, "oldestDueAt", h->oldest_due_at);
   BSON_APPEND_INT64 (&doc, "oldestDueAgeMs", h->oldest_due_at > 0 && now > h->oldest_due_at ? now - h->oldest_due_at : 0);
   BSON_APPEND_INT64 (&doc, "completedTotal", (int64_t) completed);
   BSON_APPEND_INT64 (&doc, "retriedTotal", (int64_t) retried);
   BSON_APPEND_INT64 (&doc, "deadTotal", (int64_t) dead);
   BSON_APPEND_INT64 (&doc, "meanLatencyMs", lat.count ? (int64_t) ((double) lat.sum_ms / (double) lat.count) : 0);
   if (hc && hc->kind_id == HANDLER_KIND_PULL)
      append_consumers (&doc, slot);
   if (hc)
      dispatch_handler_connection (h->name, &doc, "connection"); /* broker kinds */
   if (with_config && hc) {
      BSON_APPEND_UTF8 (&doc, "events", hc->events ? hc->events : "");
      if (hc->url)
         append_masked (&doc, "url", "url", hc->url);
      BSON_APPEND_BOOL (&doc, "signed", hc->secret && *hc->secret);
      BSON_APPEND_INT64 (&doc, "maxAttempts", hc->max_attempts);
      BSON_APPEND_INT64 (&doc, "timeoutMs", hc->timeout_ms);
      BSON_APPEND_INT64 (&doc, "concurrency", hc->concurrency);
      BSON_APPEND_BOOL (&doc, "retry4xx", hc->retry_4xx);
   }
   bson_append_document_end (arr, &doc);
}

void
admin_api_stats (admin_t *a, struct evhttp_request *req)
{
   int64_t now = clock_now_ms ();
   topology_primary_t snap;
   const store_view_t *sv;
   bson_t doc = BSON_INITIALIZER, sub, arr;

   topology_get_primary (a->topo, &snap);
   sv = store_view (a, now);
   api_append_date (&doc, "time", now);
   BSON_APPEND_INT64 (&doc, "timeMs", now);
   BSON_APPEND_UTF8 (&doc, "version", PACKAGE_VERSION);
   BSON_APPEND_INT64 (&doc, "uptimeMs", now - a->start_ms);
   {
      char sid[25];
      bson_oid_to_string (instance_service_id (), sid);
      BSON_APPEND_UTF8 (&doc, "serviceId", sid); /* hex: as drivers' logs print it */
   }

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "upstream", &sub);
   BSON_APPEND_UTF8 (&sub, "state", topology_state_name (snap.state));
   if (snap.state == TOPOLOGY_STATE_PRIMARY && bson_utf8_validate (snap.host, strlen (snap.host), false)) {
      BSON_APPEND_UTF8 (&sub, "host", snap.host);
      BSON_APPEND_INT32 (&sub, "port", snap.port);
      BSON_APPEND_UTF8 (&sub, "serverType", snap.server_type);
   }
   bson_append_document_end (&doc, &sub);

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "proxy", &sub);
   BSON_APPEND_INT64 (&sub, "connections", (int64_t) counters_get (COUNTER_CONNECTIONS_OPEN));
   BSON_APPEND_BOOL (&sub, "paused", counters_get (COUNTER_PAUSED) != 0); /* POST /api/pause */
   BSON_APPEND_INT64 (&sub, "connectionsAccepted", (int64_t) counters_get (COUNTER_CONNECTIONS_ACCEPTED));
   BSON_APPEND_INT64 (&sub, "upstreamConnections", (int64_t) counters_get (COUNTER_UPSTREAMS_OPEN));
   BSON_APPEND_INT64 (&sub, "messagesFromClients", (int64_t) counters_get (COUNTER_MESSAGES_FROM_CLIENTS));
   BSON_APPEND_INT64 (&sub, "bytesFromClients", (int64_t) counters_get (COUNTER_BYTES_FROM_CLIENTS));
   BSON_APPEND_INT64 (&sub, "bytesToClients", (int64_t) counters_get (COUNTER_BYTES_TO_CLIENTS));
   BSON_APPEND_INT64 (&sub, "bytesFromUpstream", (int64_t) counters_get (COUNTER_BYTES_FROM_UPSTREAM));
   BSON_APPEND_INT64 (&sub, "bytesToUpstream", (int64_t) counters_get (COUNTER_BYTES_TO_UPSTREAM));
   bson_append_document_end (&doc, &sub);

   if (counters_get (COUNTER_POOL_SIZE) > 0) {
      counters_histogram_t wait;
      bson_t pinned, logins;

      counters_histogram (COUNTER_POOL_WAIT_TIME, 0, &wait);
      BSON_APPEND_DOCUMENT_BEGIN (&doc, "pool", &sub);
      BSON_APPEND_INT64 (&sub, "size", (int64_t) counters_get (COUNTER_POOL_SIZE));
      BSON_APPEND_INT64 (&sub, "connections", (int64_t) counters_get (COUNTER_POOL_CONNECTIONS));
      BSON_APPEND_INT64 (&sub, "inUse", (int64_t) counters_get (COUNTER_POOL_IN_USE));
      BSON_APPEND_INT64 (&sub, "waiters", (int64_t) counters_get (COUNTER_POOL_WAITERS));
      BSON_APPEND_DOCUMENT_BEGIN (&sub, "pinned", &pinned);
      BSON_APPEND_INT64 (&pinned, "transaction", (int64_t) counters_get_at (COUNTER_POOL_PINNED, COUNTERS_PIN_TRANSACTION));
      BSON_APPEND_INT64 (&pinned, "exhaust", (int64_t) counters_get_at (COUNTER_POOL_PINNED, COUNTERS_PIN_EXHAUST));
      BSON_APPEND_INT64 (&pinned, "moreToCome", (int64_t) counters_get_at (COUNTER_POOL_PINNED, COUNTERS_PIN_MORE_TO_COME));
      bson_append_document_end (&sub, &pinned);
      BSON_APPEND_INT64 (&sub, "waits", (int64_t) counters_get (COUNTER_POOL_WAITS));
      BSON_APPEND_INT64 (&sub, "meanWaitMs", wait.count ? (int64_t) (wait.sum_ms / wait.count) : 0);
      BSON_APPEND_INT64 (&sub, "waitTimeouts", (int64_t) counters_get (COUNTER_POOL_WAIT_TIMEOUTS));
      BSON_APPEND_INT64 (&sub, "connects", (int64_t) counters_get (COUNTER_POOL_CONNECTS));
      BSON_APPEND_INT64 (&sub, "connectFailures", (int64_t) counters_get (COUNTER_POOL_CONNECT_FAILURES));
      BSON_APPEND_INT64 (&sub, "closedInDoubt", (int64_t) counters_get (COUNTER_POOL_CLOSED_IN_DOUBT));
      BSON_APPEND_DOCUMENT_BEGIN (&sub, "logins", &logins);
      BSON_APPEND_INT64 (&logins, "success", (int64_t) counters_get_at (COUNTER_LOGINS, COUNTERS_LOGIN_SUCCESS));
      BSON_APPEND_INT64 (&logins, "failure", (int64_t) counters_get_at (COUNTER_LOGINS, COUNTERS_LOGIN_FAILURE));
      BSON_APPEND_INT64 (&logins, "throttled", (int64_t) counters_get_at (COUNTER_LOGINS, COUNTERS_LOGIN_THROTTLED));
      bson_append_document_end (&sub, &logins);
      bson_append_document_end (&doc, &sub);
   }

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "publishing", &sub);
   BSON_APPEND_INT64 (&sub, "annotatedStatements", (int64_t) counters_get (COUNTER_ANNOTATED));
   BSON_APPEND_INT64 (&sub, "eventsPublished", (int64_t) counters_get (COUNTER_EVENTS_PUBLISHED));
   BSON_APPEND_INT64 (&sub, "deliveriesWritten", (int64_t) counters_get (COUNTER_DELIVERIES_WRITTEN));
   bson_append_document_end (&doc, &sub);

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "dispatch", &sub);
   BSON_APPEND_INT64 (&sub, "claims", (int64_t) counters_get (COUNTER_DISPATCH_CLAIMS));
   BSON_APPEND_INT64 (&sub, "claimed", (int64_t) counters_get (COUNTER_DISPATCH_CLAIMED));
   BSON_APPEND_INT64 (&sub, "completed", (int64_t) counters_get (COUNTER_DISPATCH_COMPLETED));
   BSON_APPEND_INT64 (&sub, "retried", (int64_t) counters_get (COUNTER_DISPATCH_RETRIED));
   BSON_APPEND_INT64 (&sub, "dead", (int64_t) counters_get (COUNTER_DISPATCH_DEAD));
   BSON_APPEND_INT64 (&sub, "httpRequests", (int64_t) counters_get (COUNTER_DISPATCH_HTTP_REQUESTS));
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
      api_append_date (&sub, "oldestDueAt", sv->totals.oldest_due_at);
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
   admin_send_json (req, 200, "OK", &doc);
   bson_destroy (&doc);
}

static void
append_fleet_handler (bson_t *arr, uint32_t i, const fleet_handler_t *h)
{
   char buf[16];
   const char *key;
   bson_t doc, ev;

   bson_uint32_to_string (i, &key, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (arr, key, &doc);
   BSON_APPEND_UTF8 (&doc, "name", h->name);
   BSON_APPEND_UTF8 (&doc, "kind", h->kind);
   BSON_APPEND_ARRAY_BEGIN (&doc, "events", &ev);
   for (size_t p = 0; p < h->n_patterns; p++) {
      char pbuf[16];
      const char *pk;

      bson_uint32_to_string ((uint32_t) p, &pk, pbuf, sizeof pbuf);
      BSON_APPEND_UTF8 (&ev, pk, h->patterns[p]);
   }
   bson_append_array_end (&doc, &ev);
   BSON_APPEND_UTF8 (&doc, "hash", h->hash);
   bson_append_document_end (arr, &doc);
}

/* The fleet's handler sets as the dispatcher last read them: every
 * instance with its heartbeat and handlers, the names of the fleet's set
 * (what publishers write deliveries for), and the names live instances
 * declare differently. */
static void
append_fleet (bson_t *parent)
{
   fleet_set_t *fs = fleet_acquire ();
   bson_t doc, arr, inst, hs;
   char buf[16];
   const char *key;

   BSON_APPEND_DOCUMENT_BEGIN (parent, "fleet", &doc);
   if (fs)
      api_append_date (&doc, "readAt", fs->read_at);
   BSON_APPEND_ARRAY_BEGIN (&doc, "instances", &arr);
   for (size_t i = 0; fs && i < fs->n_instances; i++) {
      const fleet_instance_t *in = &fs->instances[i];

      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, key, &inst);
      BSON_APPEND_UTF8 (&inst, "instance", in->instance);
      BSON_APPEND_BOOL (&inst, "live", in->live);
      BSON_APPEND_BOOL (&inst, "kept", in->kept);
      BSON_APPEND_BOOL (&inst, "stopped", in->stopped);
      api_append_date (&inst, "startedAt", in->started_at);
      api_append_date (&inst, "heartbeatAt", in->heartbeat_at);
      BSON_APPEND_ARRAY_BEGIN (&inst, "handlers", &hs);
      for (size_t h = 0; h < in->n_handlers; h++)
         append_fleet_handler (&hs, (uint32_t) h, &in->handlers[h]);
      bson_append_array_end (&inst, &hs);
      bson_append_document_end (&arr, &inst);
   }
   bson_append_array_end (&doc, &arr);
   BSON_APPEND_ARRAY_BEGIN (&doc, "set", &arr);
   for (size_t i = 0; fs && i < fs->n_set; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, fs->set[i]->name);
   }
   bson_append_array_end (&doc, &arr);
   BSON_APPEND_ARRAY_BEGIN (&doc, "disagreeing", &arr);
   for (size_t i = 0; fs && i < fs->n_disagreeing; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_UTF8 (&arr, key, fs->disagreeing[i]);
   }
   bson_append_array_end (&doc, &arr);
   bson_append_document_end (parent, &doc);
   fleet_release (fs);
}

void
admin_api_handlers (admin_t *a, struct evhttp_request *req)
{
   int64_t now = clock_now_ms ();
   const store_view_t *sv;
   bson_t doc = BSON_INITIALIZER, arr;

   sv = store_view (a, now);
   if (!sv->ok) {
      admin_send_error (a, req, 502, "reading the outbox failed: %s", sv->error);
      bson_destroy (&doc);
      return;
   }
   BSON_APPEND_ARRAY_BEGIN (&doc, "handlers", &arr);
   for (size_t i = 0; i < sv->n_hs; i++)
      append_handler (a, &arr, (uint32_t) i, &sv->hs[i], now, true);
   bson_append_array_end (&doc, &arr);
   append_fleet (&doc);
   admin_send_json (req, 200, "OK", &doc);
   bson_destroy (&doc);
}

/* GET /api/deliveries?status=&handler=&eventType=&eventId=&key=&limit=&after= */
void
admin_api_deliveries (admin_t *a, struct evhttp_request *req)
{
   enum { P_STATUS, P_HANDLER, P_TYPE, P_EVENT, P_KEY, P_LIMIT, P_AFTER, P_N };
   api_param_t p[P_N] = {{"status", NULL},
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
   uint32_t i = 0;

   if (!api_parse_params (req, p, P_N, &q, why, sizeof why)) {
      admin_send_error (a, req, 400, "%s", why);
      goto done;
   }
   if (p[P_STATUS].value && strcmp (p[P_STATUS].value, "pending") != 0 && strcmp (p[P_STATUS].value, "dead") != 0 &&
       strcmp (p[P_STATUS].value, "completed") != 0) {
      admin_send_error (a, req, 400, "status must be pending, dead or completed");
      goto done;
   }
   if (p[P_LIMIT].value && !api_parse_int (p[P_LIMIT].value, 1, 1000, &limit)) {
      admin_send_error (a, req, 400, "limit must be an integer from 1 to 1000");
      goto done;
   }
   if (p[P_AFTER].value) {
      /* "<createdAt ms>.<_id>" */
      if (!api_parse_cursor (p[P_AFTER].value, &after_created, &after_oid)) {
         admin_send_error (a, req, 400, "after must be a cursor from a previous page");
         goto done;
      }
      has_after = true;
   }
   f.status = p[P_STATUS].value;
   f.handler = p[P_HANDLER].value;
   f.event_type = p[P_TYPE].value;
   f.event_id = p[P_EVENT].value;
   f.key = p[P_KEY].value;
   f.limit = limit;
   if (!store_list_page (a->store, &f, after_created, has_after ? &after_oid : NULL, &raw, &more, &err)) {
      admin_send_error (a, req, 502, "listing deliveries failed: %s", err.message);
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

         if (!BSON_ITER_HOLDS_DOCUMENT (&it))
            continue;
         bson_iter_document (&it, &len, &data);
         if (!bson_init_static (&d, data, len))
            continue;
         bson_uint32_to_string (i++, &key, buf, sizeof buf);
         BSON_APPEND_DOCUMENT_BEGIN (&arr, key, &item);
         api_delivery_json (&item, &d);
         bson_append_document_end (&arr, &item);
      }
   bson_append_array_end (&doc, &arr);
   api_append_page_end (&doc, &raw, i, OUTBOX_F_CREATED_AT, more);
   admin_send_json (req, 200, "OK", &doc);
done:
   evhttp_clear_headers (&q);
   bson_destroy (&raw);
   bson_destroy (&doc);
}

/* POST /api/deliveries/requeue and /api/deliveries/bury: {"ids": [...]} */
static void
requeue_or_bury (admin_t *a, struct evhttp_request *req, bool bury)
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
            admin_send_error (a, req, 400, "\"reason\" must be a string of 1 to 200 characters");
            goto done;
         }
         snprintf (reason, sizeof reason, "buried by an operator: %s", r);
      }
   }
   /* One id at a time, so the log and the answer say exactly which
    * deliveries changed. */
   done_ids = bson_malloc0 ((n ? n : 1) * sizeof *done_ids);
   kept_ids = bson_malloc0 ((n ? n : 1) * sizeof *kept_ids);
   now = clock_now_ms ();
   ok = true;
   for (size_t i = 0; ok && i < n; i++) {
      size_t c = 0;
      ok = bury ? store_bury_ids (a->store, &ids[i], 1, now, reason, &c, &err) : store_requeue (a->store, &ids[i], 1, now, &c, &err);
      if (ok && c > 0)
         done_ids[changed++] = ids[i];
      else if (ok)
         kept_ids[n_kept++] = ids[i];
   }
   admin_peer_of (req, peer, sizeof peer);
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
      admin_send_error (a, req, 502, "%s failed after %zu of %zu: %s", bury ? "bury" : "requeue", changed, n, err.message);
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
   admin_send_json (req, 200, "OK", &doc);
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
   if (BSON_ITER_HOLDS_UTF8 (&it) && api_parse_iso8601 (bson_iter_utf8 (&it, NULL), ms) && *ms > 0)
      return true;
   if ((BSON_ITER_HOLDS_INT32 (&it) || BSON_ITER_HOLDS_INT64 (&it)) && bson_iter_as_int64 (&it) > 0) {
      *ms = bson_iter_as_int64 (&it);
      return true;
   }
   if (BSON_ITER_HOLDS_DATE_TIME (&it) && bson_iter_date_time (&it) > 0) {
      *ms = bson_iter_date_time (&it);
      return true;
   }
   admin_send_error (a, req, 400, "\"%s\" must be an ISO-8601 UTC time (\"2026-11-30T00:00:00Z\") or milliseconds since the epoch", name);
   return false;
}

/* POST /api/purge: {"deadBefore": ..., "completedBefore": ...} */
void
admin_api_purge (admin_t *a, struct evhttp_request *req)
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
      admin_send_error (a, req, 400, "give deadBefore, completedBefore or both");
      goto done;
   }
   admin_peer_of (req, peer, sizeof peer);
   if (o.dead_before)
      iso8601 (o.dead_before, d1);
   if (o.completed_before)
      iso8601 (o.completed_before, d2);
   if (!store_purge (a->store, &o, &r, &err)) {
      log_warn ("admin: %s purge (dead before %s, completed before %s) failed: %s", peer, d1, d2, err.message);
      admin_send_error (a, req, 502, "purge failed: %s", err.message);
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
   admin_send_json (req, 200, "OK", &doc);
done:
   bson_destroy (&body);
   bson_destroy (&doc);
}

/* The most events one replay sends again (docs/admin.md): a replay reads
 * them into memory on the admin thread before it writes. */
#define ADMIN_REPLAY_MAX_EVENTS 100000

/* A required or optional time of a replay's window: an ISO-8601 UTC
 * string only, so the answer to a typo is a 400, not another window. */
static bool
read_window_time (admin_t *a, struct evhttp_request *req, const bson_t *body, const char *name, bool required, int64_t *ms)
{
   bson_iter_t it;

   *ms = 0;
   if (!bson_iter_init_find (&it, body, name)) {
      if (!required)
         return true;
      admin_send_error (a, req, 400, "\"%s\" is required: an ISO-8601 UTC time (\"2026-11-30T00:00:00Z\")", name);
      return false;
   }
   if (BSON_ITER_HOLDS_UTF8 (&it) && api_parse_iso8601 (bson_iter_utf8 (&it, NULL), ms) && *ms > 0)
      return true;
   admin_send_error (a, req, 400, "\"%s\" must be an ISO-8601 UTC time (\"2026-11-30T00:00:00Z\")", name);
   return false;
}

/* POST /api/replay: {"handler": NAME, "since": ISO, "until": ISO} */
void
admin_api_replay (admin_t *a, struct evhttp_request *req)
{
   static const char *const fields[] = {"handler", "since", "until", NULL};
   const config_handler_t *h = NULL;
   store_replay_opts_t o = {0};
   store_replay_result_t r;
   bson_t body, doc = BSON_INITIALIZER;
   bson_iter_t it;
   bson_error_t err;
   char peer[80], d1[64], d2[64];

   if (!read_body (a, req, &body)) {
      bson_destroy (&doc);
      return;
   }
   if (!only_fields (a, req, &body, fields))
      goto done;
   if (!bson_iter_init_find (&it, &body, "handler") || !BSON_ITER_HOLDS_UTF8 (&it)) {
      admin_send_error (a, req, 400, "\"handler\" is required: the name of a configured handler");
      goto done;
   }
   for (size_t i = 0; i < a->cfg->n_handlers && !h; i++)
      if (strcmp (a->cfg->handlers[i].name, bson_iter_utf8 (&it, NULL)) == 0)
         h = &a->cfg->handlers[i];
   if (!h) {
      /* Not echoed: the name is the requester's text. */
      admin_send_error (a, req, 400, "\"handler\" names no handler of this proxy's configuration");
      goto done;
   }
   if (!read_window_time (a, req, &body, "since", true, &o.since) ||
       !read_window_time (a, req, &body, "until", false, &o.until))
      goto done;
   o.now = clock_now_ms ();
   if (!o.until)
      o.until = o.now;
   if (o.since >= o.until) {
      admin_send_error (a, req, 400, "\"since\" must be before \"until\" (or before now without \"until\")");
      goto done;
   }
   o.handler = h->name;
   o.patterns = (const char *const *) h->event_patterns;
   o.n_patterns = h->n_event_patterns;
   o.max_events = ADMIN_REPLAY_MAX_EVENTS;
   admin_peer_of (req, peer, sizeof peer);
   iso8601 (o.since, d1);
   iso8601 (o.until, d2);
   if (!store_replay (a->store, &o, &r, &err)) {
      if (err.code == STORE_ERROR_INVALID) {
         log_info ("admin: %s replay of handler %s from %s to %s refused: %s", peer, h->name, d1, d2, err.message);
         admin_send_error (a, req, 400, "%s", err.message);
      } else {
         log_warn ("admin: %s replay of handler %s from %s to %s failed: %s", peer, h->name, d1, d2, err.message);
         admin_send_error (a, req, 502, "replay failed: %s", err.message);
      }
      goto done;
   }
   counters_add (COUNTER_REPLAYS, 1);
   counters_add (COUNTER_REPLAYED_DELIVERIES, (uint64_t) r.queued);
   log_info ("admin: %s replayed handler %s from %s to %s: %zu events matched, %zu deliveries queued, %zu skipped "
             "(a delivery of the event is still pending or dead)",
             peer,
             h->name,
             d1,
             d2,
             r.matched,
             r.queued,
             r.skipped);
   if (r.queued > 0) {
      store_view_invalidate (a);
      dispatch_wake ();
   }
   BSON_APPEND_INT64 (&doc, "queued", (int64_t) r.queued);
   BSON_APPEND_INT64 (&doc, "skipped", (int64_t) r.skipped);
   admin_send_json (req, 200, "OK", &doc);
done:
   bson_destroy (&body);
   bson_destroy (&doc);
}

void
admin_api_lanes (admin_t *a, struct evhttp_request *req)
{
   bson_t lanes = BSON_INITIALIZER, doc = BSON_INITIALIZER, arr, owners;
   bson_error_t err;
   int64_t leased = 0, held = 0, now = clock_now_ms ();
   bson_iter_t it;
   /* Owners with their lane and in-flight counts (few: one per worker). */
   struct {
      const char *owner;
      int64_t lanes, in_flight, live;
   } own[64];
   size_t n_own = 0;

   if (!store_list_lanes (a->store, now, a->local_prefix, &lanes, &leased, &held, &err)) {
      admin_send_error (a, req, 502, "reading the lanes failed: %s", err.message);
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
               if (!strcmp (k2, OUTBOX_F_LEASE_EXPIRES_AT)) {
                  exp = bson_iter_as_int64 (&f);
                  api_append_date (&item, OUTBOX_F_LEASE_EXPIRES_AT, exp);
               } else {
                  bson_append_iter (&item, k2, -1, &f);
               }
               if (!strcmp (k2, "owner"))
                  owner = bson_iter_utf8 (&f, NULL);
               else if (!strcmp (k2, OUTBOX_F_IN_FLIGHT))
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
   admin_send_json (req, 200, "OK", &doc);
done:
   bson_destroy (&lanes);
   bson_destroy (&doc);
}

void
admin_api_clients (admin_t *a, struct evhttp_request *req)
{
   api_param_t p[1] = {{"limit", NULL}};
   struct evkeyvalq q;
   char why[160];
   int64_t limit = ADMIN_CLIENTS_DEFAULT;
   bson_t doc = BSON_INITIALIZER, arr;
   uint64_t total;

   if (!api_parse_params (req, p, 1, &q, why, sizeof why)) {
      admin_send_error (a, req, 400, "%s", why);
      goto done;
   }
   if (p[0].value && !api_parse_int (p[0].value, 1, ADMIN_CLIENTS_MAX, &limit)) {
      admin_send_error (a, req, 400, "limit must be an integer from 1 to %d", ADMIN_CLIENTS_MAX);
      goto done;
   }
   BSON_APPEND_ARRAY_BEGIN (&doc, "clients", &arr);
   total = clients_registry_snapshot (&arr, (uint32_t) limit);
   bson_append_array_end (&doc, &arr);
   BSON_APPEND_INT64 (&doc, "count", (int64_t) total);
   admin_send_json (req, 200, "OK", &doc);
done:
   evhttp_clear_headers (&q);
   bson_destroy (&doc);
}

/* The key table with the values in force; the token and secrets masked. */
void
admin_api_config (admin_t *a, struct evhttp_request *req)
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
      /* The default of a secret is not shown; its value goes through
       * config_mask like every string. */
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
         case CONFIG_TYPE_DURATION: /* in ms */
            BSON_APPEND_INT64 (&item, "value", *(const int64_t *) (base + key->offset));
            break;
         case CONFIG_TYPE_BOOL:
            BSON_APPEND_BOOL (&item, "value", *(const bool *) (base + key->offset));
            break;
         default: {
            const char *v = *(char *const *) (base + key->offset);
            append_masked (&item, "value", key->name, v);
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
   admin_send_json (req, 200, "OK", &doc);
   bson_destroy (&doc);
   config_release (cfg);
}

void
admin_api_dashboard (admin_t *a, struct evhttp_request *req)
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
   admin_send_text (req, 200, "OK", "text/html; charset=utf-8", (const char *) admin_dashboard_html, (size_t) admin_dashboard_html_len);
}

void
admin_api_requeue (admin_t *a, struct evhttp_request *req)
{
   requeue_or_bury (a, req, false);
}

void
admin_api_bury (admin_t *a, struct evhttp_request *req)
{
   requeue_or_bury (a, req, true);
}

void
admin_api_clear_cache (admin_t *a)
{
   if (a->view_at > 0)
      store_view_clear (&a->view);
   a->view_at = 0;
}
