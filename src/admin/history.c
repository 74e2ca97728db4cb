/*
 * admin/history.c - what happened to a delivery and to an event, from the
 * attempt records (store/attempts): GET /api/deliveries/ID/attempts, GET
 * /api/events/ID and GET /api/attempts.
 *
 * Each answer is read from the store on the admin thread; ids and query
 * parameters are checked and bounded here (a malformed one is a 400, an id
 * nothing is left of a 404) before anything reaches a query.  The other
 * endpoints, and the query and document helpers these share with them, are
 * admin/api.c's.  Not here: writing the records (store/attempts).
 */
#include "admin/admin_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "base/clock.h"
#include "base/config.h"
#include "base/fleet.h"
#include "base/outbox.h"
#include "codec/annotate.h"
#include "store/attempts.h"

#define HISTORY_DELIVERIES_PREFIX "/api/deliveries/"
#define HISTORY_ATTEMPTS_SUFFIX "/attempts"
#define HISTORY_EVENTS_PREFIX "/api/events/"
/* The handlers an event view lists at most (its deliveries, the handlers
 * its event names, those of the fleet that subscribe to its type). */
#define HISTORY_HANDLERS_MAX 512

const char *
admin_history_route (const char *path)
{
   size_t n = strlen (path), np = strlen (HISTORY_DELIVERIES_PREFIX), ns = strlen (HISTORY_ATTEMPTS_SUFFIX);
   size_t ne = strlen (HISTORY_EVENTS_PREFIX);

   if (n >= np + ns && !strncmp (path, HISTORY_DELIVERIES_PREFIX, np) && !strcmp (path + n - ns, HISTORY_ATTEMPTS_SUFFIX) &&
       !memchr (path + np, '/', n - np - ns))
      return "/api/deliveries/ID/attempts";
   if (n > ne && !strncmp (path, HISTORY_EVENTS_PREFIX, ne) && !strchr (path + ne, '/'))
      return "/api/events/ID";
   return NULL;
}

/* An attempt record as the API shows it: ids as strings, dates as
 * ISO-8601 strings (durationMs, status and attempt as numbers). */
static void
attempt_json (bson_t *out, const bson_t *rec)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, rec))
      return;
   while (bson_iter_next (&it)) {
      const char *k = bson_iter_key (&it);
      if (BSON_ITER_HOLDS_OID (&it)) {
         char hex[25];
         bson_oid_to_string (bson_iter_oid (&it), hex);
         BSON_APPEND_UTF8 (out, !strcmp (k, "_id") ? "id" : k, hex);
      } else if (BSON_ITER_HOLDS_DATE_TIME (&it)) {
         api_append_date (out, k, bson_iter_date_time (&it));
      } else if (BSON_ITER_HOLDS_UTF8 (&it) || BSON_ITER_HOLDS_INT32 (&it) || BSON_ITER_HOLDS_INT64 (&it) ||
                 BSON_ITER_HOLDS_DOUBLE (&it)) {
         bson_append_iter (out, k, -1, &it);
      }
   }
}

/* Appends each record of `raw` (an array), through attempt_json, to the
 * array `arr` (from index *i), only those of `handler` when it is not
 * NULL; the last one's error (of a record that did not succeed) in
 * *last_error, its outcome in *last_outcome. */
static void
attempts_json (bson_t *arr, uint32_t *i, const bson_t *raw, const char *handler, const char **last_error, const char **last_outcome)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, raw))
      return;
   while (bson_iter_next (&it)) {
      bson_t d, item;
      const uint8_t *data;
      uint32_t len;
      char buf[16];
      const char *key, *h, *o;
      bson_iter_t f;

      if (!BSON_ITER_HOLDS_DOCUMENT (&it))
         continue;
      bson_iter_document (&it, &len, &data);
      if (!bson_init_static (&d, data, len))
         continue;
      h = bson_iter_init_find (&f, &d, "handler") && BSON_ITER_HOLDS_UTF8 (&f) ? bson_iter_utf8 (&f, NULL) : "";
      if (handler && strcmp (h, handler) != 0)
         continue;
      bson_uint32_to_string ((*i)++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (arr, key, &item);
      attempt_json (&item, &d);
      bson_append_document_end (arr, &item);
      o = bson_iter_init_find (&f, &d, OUTBOX_F_OUTCOME) && BSON_ITER_HOLDS_UTF8 (&f) ? bson_iter_utf8 (&f, NULL) : NULL;
      if (last_outcome)
         *last_outcome = o;
      if (last_error && o && strcmp (o, "succeeded") != 0 && bson_iter_init_find (&f, &d, OUTBOX_F_ERROR) && BSON_ITER_HOLDS_UTF8 (&f))
         *last_error = bson_iter_utf8 (&f, NULL);
   }
}

/* The id segment of `path` after `prefix` and before `suffix` ("": none). */
static const char *
path_segment (struct evhttp_request *req, const char *prefix, const char *suffix, char *out, size_t out_len)
{
   const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri (req);
   const char *path = uri ? evhttp_uri_get_path (uri) : NULL;
   size_t n, np = strlen (prefix), ns = strlen (suffix);

   out[0] = '\0';
   if (!path || (n = strlen (path)) < np + ns || n - np - ns >= out_len)
      return out;
   memcpy (out, path + np, n - np - ns);
   out[n - np - ns] = '\0';
   return out;
}

/* GET /api/deliveries/ID/attempts?limit= */
void
admin_api_delivery_attempts (admin_t *a, struct evhttp_request *req)
{
   enum { P_LIMIT, P_N };
   api_param_t p[P_N] = {{"limit", NULL}};
   struct evkeyvalq q;
   char why[160], id[64];
   int64_t limit = 100;
   bson_oid_t oid;
   store_delivery_history_t h;
   bson_t doc = BSON_INITIALIZER, arr;
   bson_error_t err;
   uint32_t i = 0;

   if (!api_parse_params (req, p, P_N, &q, why, sizeof why)) {
      admin_send_error (a, req, 400, "%s", why);
      goto done;
   }
   path_segment (req, HISTORY_DELIVERIES_PREFIX, HISTORY_ATTEMPTS_SUFFIX, id, sizeof id);
   if (strlen (id) != 24 || !bson_oid_is_valid (id, 24)) {
      admin_send_error (a, req, 400, "the id must be a delivery id (24 hex characters, the webhook-id a receiver saw)");
      goto done;
   }
   if (p[P_LIMIT].value && !api_parse_int (p[P_LIMIT].value, 1, STORE_ATTEMPTS_LIMIT_MAX, &limit)) {
      admin_send_error (a, req, 400, "limit must be an integer from 1 to %d", STORE_ATTEMPTS_LIMIT_MAX);
      goto done;
   }
   bson_oid_init_from_string (&oid, id);
   if (!store_delivery_history (a->store, &oid, limit, &h, &err)) {
      admin_send_error (a, req, 502, "reading the attempts failed: %s", err.message);
      store_delivery_history_clear (&h);
      goto done;
   }
   if (!h.found) {
      admin_send_error (a, req, 404, "no delivery %s, and no attempt of it on record", id);
      store_delivery_history_clear (&h);
      goto done;
   }
   BSON_APPEND_UTF8 (&doc, "id", id);
   BSON_APPEND_UTF8 (&doc, "state", h.state);
   if (bson_empty (&h.delivery)) {
      BSON_APPEND_NULL (&doc, "delivery");
   } else {
      bson_t d;
      BSON_APPEND_DOCUMENT_BEGIN (&doc, "delivery", &d);
      api_delivery_json (&d, &h.delivery);
      bson_append_document_end (&doc, &d);
   }
   BSON_APPEND_ARRAY_BEGIN (&doc, "attempts", &arr);
   attempts_json (&arr, &i, &h.attempts, NULL, NULL, NULL);
   bson_append_array_end (&doc, &arr);
   BSON_APPEND_INT32 (&doc, "count", (int32_t) i);
   BSON_APPEND_BOOL (&doc, "more", h.more);
   store_delivery_history_clear (&h);
   admin_send_json (req, 200, "OK", &doc);
done:
   evhttp_clear_headers (&q);
   bson_destroy (&doc);
}

/* An event id from the path: percent-decoded, 1 to 256 bytes of UTF-8
 * without control characters (the annotation's rule); false otherwise. */
static bool
event_id_of (struct evhttp_request *req, char *out, size_t out_len)
{
   char raw[3 * ANNOTATE_MAX_ID_LEN + 8];
   size_t len = 0;
   char *dec;
   bool ok;

   path_segment (req, HISTORY_EVENTS_PREFIX, "", raw, sizeof raw);
   if (!raw[0])
      return false;
   dec = evhttp_uridecode (raw, 0, &len);
   ok = dec && len > 0 && len <= ANNOTATE_MAX_ID_LEN && len < out_len && strlen (dec) == len && bson_utf8_validate (dec, len, false);
   for (size_t k = 0; ok && k < len; k++)
      ok = (unsigned char) dec[k] >= 0x20 && dec[k] != 0x7f;
   if (ok)
      memcpy (out, dec, len + 1);
   free (dec);
   return ok;
}

/* A name in the list, added when new (at most HISTORY_HANDLERS_MAX). */
static void
names_add (const char **names, size_t *n, const char *name)
{
   if (!name || !*name)
      return;
   for (size_t i = 0; i < *n; i++)
      if (!strcmp (names[i], name))
         return;
   if (*n < HISTORY_HANDLERS_MAX)
      names[(*n)++] = name;
}

/* The document of `arr` (an array of documents) whose string `field` is
 * `value`, into *out (static); false when none is. */
static bool
find_by (const bson_t *arr, const char *field, const char *value, bson_t *out)
{
   bson_iter_t it, f;

   if (!bson_iter_init (&it, arr))
      return false;
   while (bson_iter_next (&it)) {
      const uint8_t *data;
      uint32_t len;
      if (!BSON_ITER_HOLDS_DOCUMENT (&it))
         continue;
      bson_iter_document (&it, &len, &data);
      if (bson_init_static (out, data, len) && bson_iter_init_find (&f, out, field) && BSON_ITER_HOLDS_UTF8 (&f) &&
          !strcmp (bson_iter_utf8 (&f, NULL), value))
         return true;
   }
   return false;
}

/* Whether the fleet (or this proxy's configuration) subscribes `handler`
 * to `type`. */
static bool
subscribes (const config_t *cfg, const fleet_set_t *fs, const char *handler, const char *type)
{
   for (size_t i = 0; type && fs && i < fs->n_set; i++)
      if (!strcmp (fs->set[i]->name, handler) && fleet_handler_matches (fs->set[i], type))
         return true;
   for (size_t i = 0; type && cfg && i < cfg->n_handlers; i++)
      if (!strcmp (cfg->handlers[i].name, handler) && config_handler_matches (&cfg->handlers[i], type))
         return true;
   return false;
}

/* One handler of an event view: its delivery's state, attempts and last
 * error. */
static void
event_handler_json (bson_t *out, const char *name, const store_event_history_t *h, const bson_t *listed, const char *type,
                    const config_t *cfg, const fleet_set_t *fs)
{
   bson_t d, arr;
   uint32_t i = 0;
   const char *last_error = NULL, *last_outcome = NULL, *state;
   bool has_delivery = find_by (&h->deliveries, "handler", name, &d);
   bool was_listed = false;
   bson_iter_t it;

   if (bson_iter_init (&it, listed))
      while (bson_iter_next (&it))
         was_listed = was_listed || (BSON_ITER_HOLDS_UTF8 (&it) && !strcmp (bson_iter_utf8 (&it, NULL), name));
   BSON_APPEND_UTF8 (out, "handler", name);
   BSON_APPEND_BOOL (out, "subscribed", subscribes (cfg, fs, name, type));
   BSON_APPEND_ARRAY_BEGIN (out, "attempts", &arr);
   attempts_json (&arr, &i, &h->attempts, name, &last_error, &last_outcome);
   bson_append_array_end (out, &arr);
   if (has_delivery) {
      bson_t dj;
      state = api_doc_utf8 (&d, "state");
      if (api_doc_utf8 (&d, OUTBOX_F_LAST_ERROR))
         last_error = api_doc_utf8 (&d, OUTBOX_F_LAST_ERROR);
      BSON_APPEND_DOCUMENT_BEGIN (out, "delivery", &dj);
      api_delivery_json (&dj, &d);
      bson_append_document_end (out, &dj);
   } else {
      /* Deleted by its completion (without completion history), or never
       * written for this event (a handler that came after it). */
      state = last_outcome && !strcmp (last_outcome, "succeeded") ? "completed"
              : was_listed && i == 0                               ? "completed"
              : was_listed                                         ? "unknown"
                                                                   : "none";
      BSON_APPEND_NULL (out, "delivery");
   }
   BSON_APPEND_UTF8 (out, "state", state ? state : "unknown");
   if (last_error && bson_utf8_validate (last_error, strlen (last_error), false))
      BSON_APPEND_UTF8 (out, "lastError", last_error);
   else
      BSON_APPEND_NULL (out, "lastError");
}

/* GET /api/events/ID */
void
admin_api_event (admin_t *a, struct evhttp_request *req)
{
   struct evkeyvalq q;
   char why[160], id[ANNOTATE_MAX_ID_LEN + 1];
   store_event_history_t h;
   bson_t doc = BSON_INITIALIZER, arr, listed = BSON_INITIALIZER, d;
   bson_error_t err;
   const char **names = NULL;
   const char *type = NULL;
   size_t n = 0;
   config_t *cfg = NULL;
   fleet_set_t *fs = NULL;
   bson_iter_t it;

   if (!api_parse_params (req, NULL, 0, &q, why, sizeof why)) { /* it takes none */
      admin_send_error (a, req, 400, "%s", why);
      goto done;
   }
   if (!event_id_of (req, id, sizeof id)) {
      admin_send_error (a, req, 400,
                        "the id must be an event id: 1 to %d bytes of UTF-8 without control characters, percent-encoded in the path",
                        ANNOTATE_MAX_ID_LEN);
      goto done;
   }
   if (!store_event_history (a->store, id, &h, &err)) {
      admin_send_error (a, req, 502, "reading the event failed: %s", err.message);
      store_event_history_clear (&h);
      goto done;
   }
   if (!h.found) {
      admin_send_error (a, req, 404, "no event %s, and no delivery or attempt of it on record", id);
      store_event_history_clear (&h);
      goto done;
   }
   cfg = config_acquire ();
   fs = fleet_acquire ();
   names = bson_malloc0 (HISTORY_HANDLERS_MAX * sizeof *names);
   type = api_doc_utf8 (&h.event, "type");
   if (bson_iter_init_find (&it, &h.event, "handlers") && BSON_ITER_HOLDS_ARRAY (&it)) {
      const uint8_t *data;
      uint32_t len;
      bson_iter_array (&it, &len, &data);
      bson_destroy (&listed);
      if (!bson_init_static (&listed, data, len))
         bson_init (&listed);
   }
   /* Its handlers: those it had a delivery for, those with a delivery or an
    * attempt on record, and those of the fleet that subscribe to its type. */
   if (bson_iter_init (&it, &listed))
      while (bson_iter_next (&it))
         if (BSON_ITER_HOLDS_UTF8 (&it))
            names_add (names, &n, bson_iter_utf8 (&it, NULL));
   for (int pass = 0; pass < 2; pass++)
      if (bson_iter_init (&it, pass ? &h.attempts : &h.deliveries))
         while (bson_iter_next (&it)) {
            bson_iter_t f;
            if (BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &f) && bson_iter_find (&f, "handler") && BSON_ITER_HOLDS_UTF8 (&f))
               names_add (names, &n, bson_iter_utf8 (&f, NULL));
            if (!type && !pass && BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &f) && bson_iter_find (&f, OUTBOX_F_EVENT_TYPE) &&
                BSON_ITER_HOLDS_UTF8 (&f))
               type = bson_iter_utf8 (&f, NULL);
         }
   for (size_t i = 0; type && fs && i < fs->n_set; i++)
      if (fleet_handler_matches (fs->set[i], type))
         names_add (names, &n, fs->set[i]->name);
   for (size_t i = 0; type && cfg && i < cfg->n_handlers; i++)
      if (config_handler_matches (&cfg->handlers[i], type))
         names_add (names, &n, cfg->handlers[i].name);

   if (bson_empty (&h.event)) {
      BSON_APPEND_NULL (&doc, "event");
   } else {
      BSON_APPEND_DOCUMENT_BEGIN (&doc, "event", &d);
      if (bson_iter_init (&it, &h.event))
         while (bson_iter_next (&it)) {
            const char *k = bson_iter_key (&it);
            if (!strcmp (k, "_id"))
               bson_append_iter (&d, "id", -1, &it);
            else if (BSON_ITER_HOLDS_DATE_TIME (&it))
               api_append_date (&d, k, bson_iter_date_time (&it));
            else
               bson_append_iter (&d, k, -1, &it); /* the payload and headers as stored */
         }
      bson_append_document_end (&doc, &d);
   }
   BSON_APPEND_UTF8 (&doc, "id", id);
   BSON_APPEND_ARRAY_BEGIN (&doc, "handlers", &arr);
   for (size_t i = 0; i < n; i++) {
      char buf[16];
      const char *key;
      bson_t one;
      bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, key, &one);
      event_handler_json (&one, names[i], &h, &listed, type, cfg, fs);
      bson_append_document_end (&arr, &one);
   }
   bson_append_array_end (&doc, &arr);
   BSON_APPEND_BOOL (&doc, "more", h.more);
   admin_send_json (req, 200, "OK", &doc);
   store_event_history_clear (&h);
done:
   bson_free ((void *) names);
   fleet_release (fs);
   config_release (cfg);
   evhttp_clear_headers (&q);
   bson_destroy (&listed);
   bson_destroy (&doc);
}

/* `since`: an ISO-8601 UTC time, ms since the epoch, or a duration ago
 * (N followed by s, m, h or d: "1h" is the last hour). */
static bool
parse_since (const char *s, int64_t now, int64_t *ms)
{
   static const struct {
      char unit;
      int64_t ms;
   } units[] = {{'s', 1000}, {'m', 60000}, {'h', 3600000}, {'d', 86400000}};
   size_t len = strlen (s);
   int64_t n;

   if (api_parse_iso8601 (s, ms))
      return true;
   if (api_parse_int (s, 0, INT64_MAX, ms))
      return true;
   for (size_t i = 0; len > 1 && i < sizeof units / sizeof units[0]; i++)
      if (s[len - 1] == units[i].unit) {
         char num[24];
         if (len - 1 >= sizeof num)
            return false;
         memcpy (num, s, len - 1);
         num[len - 1] = '\0';
         if (!api_parse_int (num, 0, 3650LL * 86400000 / units[i].ms, &n))
            return false;
         *ms = now - n * units[i].ms;
         return true;
      }
   return false;
}

/* GET /api/attempts?handler=&outcome=&since=&limit=&before= */
void
admin_api_attempts (admin_t *a, struct evhttp_request *req)
{
   enum { P_HANDLER, P_OUTCOME, P_SINCE, P_LIMIT, P_BEFORE, P_N };
   api_param_t p[P_N] = {{"handler", NULL}, {"outcome", NULL}, {"since", NULL}, {"limit", NULL}, {"before", NULL}};
   struct evkeyvalq q;
   char why[160];
   store_attempts_filter_t f = {.limit = 100};
   outbox_attempt_outcome_t outcome;
   bson_oid_t before;
   bson_t raw = BSON_INITIALIZER, doc = BSON_INITIALIZER, arr;
   bson_error_t err;
   bool more = false;
   uint32_t i = 0;

   if (!api_parse_params (req, p, P_N, &q, why, sizeof why)) {
      admin_send_error (a, req, 400, "%s", why);
      goto done;
   }
   if (p[P_OUTCOME].value && !outbox_attempt_outcome_parse (p[P_OUTCOME].value, &outcome)) {
      admin_send_error (a, req, 400, "outcome must be succeeded, failed, timed_out, lease_lost, refused, released or buried");
      goto done;
   }
   if (p[P_SINCE].value && !parse_since (p[P_SINCE].value, clock_now_ms (), &f.since)) {
      admin_send_error (a, req, 400, "since must be an ISO-8601 UTC time, ms since the epoch, or a duration ago (30m, 1h, 7d)");
      goto done;
   }
   if (p[P_LIMIT].value && !api_parse_int (p[P_LIMIT].value, 1, STORE_ATTEMPTS_LIMIT_MAX, &f.limit)) {
      admin_send_error (a, req, 400, "limit must be an integer from 1 to %d", STORE_ATTEMPTS_LIMIT_MAX);
      goto done;
   }
   if (p[P_BEFORE].value) {
      /* "<endedAt ms>.<_id>" */
      if (!api_parse_cursor (p[P_BEFORE].value, &f.before_ended, &before)) {
         admin_send_error (a, req, 400, "before must be a cursor from a previous page");
         goto done;
      }
      f.before_id = &before;
   }
   f.handler = p[P_HANDLER].value;
   f.outcome = p[P_OUTCOME].value;
   if (!store_attempts_list (a->store, &f, &raw, &more, &err)) {
      admin_send_error (a, req, 502, "listing attempts failed: %s", err.message);
      goto done;
   }
   BSON_APPEND_ARRAY_BEGIN (&doc, "attempts", &arr);
   attempts_json (&arr, &i, &raw, NULL, NULL, NULL);
   bson_append_array_end (&doc, &arr);
   api_append_page_end (&doc, &raw, i, OUTBOX_F_ENDED_AT, more);
   admin_send_json (req, 200, "OK", &doc);
done:
   evhttp_clear_headers (&q);
   bson_destroy (&raw);
   bson_destroy (&doc);
}
