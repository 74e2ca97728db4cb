/* matrix.c - every pull consumer command through the proxy with mongo-c-driver.
 *
 * Usage: matrix PROXY_URI DIRECT_URI PLAN_JSON
 *
 * The same cases as matrix.py, in the same order, with the same JSON line per case; the plan
 * (written by matrix.test.js) names the handler, the events published for it, the outbox
 * database and prefix, the application database and the bad inputs to send. Built by
 * matrix.test.js with cc -Wall -Wextra -Werror $(pkg-config --cflags --libs libmongoc-1.0).
 * A single-threaded mongoc_client_t keeps one connection to the proxy: a lease is settled on the
 * connection that claimed it. Any unexpected failure ends the program with status 1. */
#include <mongoc/mongoc.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *handler;
static int64_t lane_base; /* the lane document of the handler's lane 0 (the plan's laneBase) */
static const char *app_db;
static mongoc_collection_t *deliveries, *lanes;

static void
die (const char *what, const bson_error_t *error)
{
   fprintf (stderr, "matrix: %s: %s\n", what, error ? error->message : "failed");
   exit (1);
}

static int64_t
now_ms (void)
{
   struct timespec ts;
   clock_gettime (CLOCK_REALTIME, &ts);
   return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
sleep_ms (int ms)
{
   struct timespec ts = {ms / 1000, (long) (ms % 1000) * 1000000L};
   nanosleep (&ts, NULL);
}

/* Prints `line` (its "case" appended) as one JSON line, and destroys it. */
static void
out (const char *name, bson_t *line)
{
   char *json;
   BSON_APPEND_UTF8 (line, "case", name);
   json = bson_as_relaxed_extended_json (line, NULL);
   printf ("%s\n", json);
   fflush (stdout);
   bson_free (json);
   bson_destroy (line);
}

static const char *
type_name (bson_type_t t)
{
   switch (t) {
   case BSON_TYPE_UTF8: return "string";
   case BSON_TYPE_INT32: return "int32";
   case BSON_TYPE_INT64: return "int64";
   case BSON_TYPE_DOUBLE: return "double";
   case BSON_TYPE_DATE_TIME: return "date";
   case BSON_TYPE_DOCUMENT: return "document";
   case BSON_TYPE_ARRAY: return "array";
   case BSON_TYPE_NULL: return "null";
   case BSON_TYPE_BOOL: return "bool";
   default: return "other";
   }
}

/* Appends to `dst` the value of `src` under `key`, dates as milliseconds since the epoch. */
static void
append_plain (bson_t *dst, const char *key, const bson_iter_t *src)
{
   if (BSON_ITER_HOLDS_DATE_TIME (src))
      BSON_APPEND_INT64 (dst, key, bson_iter_date_time (src));
   else
      BSON_APPEND_VALUE (dst, key, bson_iter_value ((bson_iter_t *) src));
}

/* Appends {field: type name} of every field of `doc` under `key`. */
static void
append_types (bson_t *dst, const char *key, const bson_t *doc)
{
   bson_t child;
   bson_iter_t it;
   BSON_APPEND_DOCUMENT_BEGIN (dst, key, &child);
   if (bson_iter_init (&it, doc))
      while (bson_iter_next (&it))
         BSON_APPEND_UTF8 (&child, bson_iter_key (&it), type_name (bson_iter_type (&it)));
   bson_append_document_end (dst, &child);
}

/* Appends the fields of `doc` but `skip...` (a NULL-ended list), dates as milliseconds. */
static void
append_fields (bson_t *dst, const char *key, const bson_t *doc, ...)
{
   bson_t child;
   bson_iter_t it;
   BSON_APPEND_DOCUMENT_BEGIN (dst, key, &child);
   if (bson_iter_init (&it, doc))
      while (bson_iter_next (&it)) {
         va_list ap;
         const char *skip;
         bool skipped = false;
         va_start (ap, doc);
         while ((skip = va_arg (ap, const char *)))
            if (!strcmp (skip, bson_iter_key (&it)))
               skipped = true;
         va_end (ap);
         if (!skipped)
            append_plain (&child, bson_iter_key (&it), &it);
      }
   bson_append_document_end (dst, &child);
}

static const char *
get_utf8 (const bson_t *doc, const char *path)
{
   bson_iter_t it;
   if (bson_iter_init (&it, doc) && bson_iter_find_descendant (&it, path, &it) && BSON_ITER_HOLDS_UTF8 (&it))
      return bson_iter_utf8 (&it, NULL);
   return NULL;
}

static bool
get_bool (const bson_t *doc, const char *path)
{
   bson_iter_t it;
   return bson_iter_init (&it, doc) && bson_iter_find_descendant (&it, path, &it) && bson_iter_as_bool (&it);
}

static int64_t
get_int (const bson_t *doc, const char *path)
{
   bson_iter_t it;
   if (bson_iter_init (&it, doc) && bson_iter_find_descendant (&it, path, &it)) {
      if (BSON_ITER_HOLDS_DATE_TIME (&it))
         return bson_iter_date_time (&it);
      return bson_iter_as_int64 (&it);
   }
   return 0;
}

/* Copies the value at `path` of `src` into `dst` under `key` (null when absent). */
static void
copy_field (bson_t *dst, const char *key, const bson_t *src, const char *path)
{
   bson_iter_t it;
   if (bson_iter_init (&it, src) && bson_iter_find_descendant (&it, path, &it))
      append_plain (dst, key, &it);
   else
      BSON_APPEND_NULL (dst, key);
}

/* Runs `cmd` on `client` (the admin database), with `session` when given. Answers true on
 * success; on failure, when `err` is given, appends {code, codeName, errmsg, labels} to it. */
static bool
run (mongoc_client_t *client, const bson_t *cmd, mongoc_client_session_t *session, bson_t *reply, bson_t *err)
{
   bson_error_t error;
   bson_t opts = BSON_INITIALIZER, labels;
   bson_iter_t it;
   bool ok;

   if (session && !mongoc_client_session_append (session, &opts, &error))
      die ("session", &error);
   ok = mongoc_client_command_with_opts (client, "admin", cmd, NULL, &opts, reply, &error);
   bson_destroy (&opts);
   if (!ok && err) {
      if (bson_iter_init_find (&it, reply, "code"))
         BSON_APPEND_INT32 (err, "code", bson_iter_as_int64 (&it) > INT32_MAX ? -1 : (int32_t) bson_iter_as_int64 (&it));
      else
         BSON_APPEND_INT32 (err, "code", (int32_t) error.code);
      copy_field (err, "codeName", reply, "codeName");
      if (get_utf8 (reply, "errmsg"))
         BSON_APPEND_UTF8 (err, "errmsg", get_utf8 (reply, "errmsg"));
      else
         BSON_APPEND_UTF8 (err, "errmsg", error.message);
      BSON_APPEND_ARRAY_BEGIN (err, "labels", &labels);
      if (bson_iter_init_find (&it, reply, "errorLabels") && BSON_ITER_HOLDS_ARRAY (&it)) {
         bson_iter_t l;
         uint32_t i = 0;
         char k[16];
         const char *kp;
         bson_iter_recurse (&it, &l);
         while (bson_iter_next (&l))
            if (BSON_ITER_HOLDS_UTF8 (&l)) {
               bson_uint32_to_string (i++, &kp, k, sizeof k);
               bson_append_utf8 (&labels, kp, -1, bson_iter_utf8 (&l, NULL), -1);
            }
      }
      bson_append_array_end (err, &labels);
   } else if (!ok) {
      fprintf (stderr, "command: %s\n", bson_as_relaxed_extended_json (cmd, NULL));
      die ("command failed", &error);
   }
   return ok;
}

/* Runs `cmd` expecting a refusal: appends the error under `key` of `dst` (null if it succeeded). */
static void
append_error_of (bson_t *dst, const char *key, mongoc_client_t *client, const bson_t *cmd, mongoc_client_session_t *session)
{
   bson_t reply, err = BSON_INITIALIZER;
   if (run (client, cmd, session, &reply, &err))
      BSON_APPEND_NULL (dst, key);
   else
      BSON_APPEND_DOCUMENT (dst, key, &err);
   bson_destroy (&err);
   bson_destroy (&reply);
}

/* {name: handler, key: [lease]} */
static bson_t *
leases_cmd (const char *name, const char *lease)
{
   return BCON_NEW (name, BCON_UTF8 (handler), "leases", "[", BCON_UTF8 (lease), "]");
}

/* Sends {name: handler, leases: [every lease of the reply's deliveries]}, if there are any. */
static void
settle_all (mongoc_client_t *client, const char *name, const bson_t *claim_reply)
{
   bson_t cmd = BSON_INITIALIZER, arr, reply;
   bson_iter_t it, d;
   uint32_t n = 0;
   char k[16];
   const char *kp;

   BSON_APPEND_UTF8 (&cmd, name, handler);
   BSON_APPEND_ARRAY_BEGIN (&cmd, "leases", &arr);
   if (bson_iter_init (&it, claim_reply) && bson_iter_find_descendant (&it, "deliveries", &it) && bson_iter_recurse (&it, &d))
      while (bson_iter_next (&d)) {
         bson_t doc;
         const uint8_t *data;
         uint32_t len;
         bson_iter_document (&d, &len, &data);
         bson_init_static (&doc, data, len);
         bson_uint32_to_string (n++, &kp, k, sizeof k);
         bson_append_utf8 (&arr, kp, -1, get_utf8 (&doc, "lease"), -1);
      }
   bson_append_array_end (&cmd, &arr);
   if (n) {
      run (client, &cmd, NULL, &reply, NULL);
      bson_destroy (&reply);
   }
   bson_destroy (&cmd);
}

/* The events a claim loop waits for, and their deliveries once claimed. */
typedef struct {
   const char **wanted;
   int n_wanted;
   bson_t *got; /* one per wanted, copied in when claimed */
   bool *have;
} claimed_t;

static int
wanted_index (const claimed_t *c, const char *event_id)
{
   for (int i = 0; i < c->n_wanted; i++)
      if (event_id && !strcmp (c->wanted[i], event_id))
         return i;
   return -1;
}

/* Claims until every wanted event was handed out; others' leftovers are released. */
static void
claim_until (mongoc_client_t *client, claimed_t *c, const char *consumer)
{
   int64_t until = now_ms () + 10000;
   for (;;) {
      int missing = 0;
      for (int i = 0; i < c->n_wanted; i++)
         missing += !c->have[i];
      if (!missing)
         return;
      if (now_ms () > until) {
         fprintf (stderr, "matrix: %d events never claimed\n", missing);
         exit (1);
      }
      bson_t *cmd = consumer ? BCON_NEW ("relaybusClaim", BCON_UTF8 (handler), "limit", BCON_INT32 (100), "leaseMs",
                                         BCON_INT32 (30000), "consumer", BCON_UTF8 (consumer))
                             : BCON_NEW ("relaybusClaim", BCON_UTF8 (handler), "limit", BCON_INT32 (100));
      bson_t reply, others = BSON_INITIALIZER, arr;
      bson_iter_t it, d;
      uint32_t n = 0;
      char k[16];
      const char *kp;
      run (client, cmd, NULL, &reply, NULL);
      BSON_APPEND_UTF8 (&others, "relaybusRelease", handler);
      BSON_APPEND_ARRAY_BEGIN (&others, "leases", &arr);
      if (bson_iter_init_find (&it, &reply, "deliveries") && bson_iter_recurse (&it, &d))
         while (bson_iter_next (&d)) {
            bson_t doc;
            const uint8_t *data;
            uint32_t len;
            int i;
            bson_iter_document (&d, &len, &data);
            bson_init_static (&doc, data, len);
            i = wanted_index (c, get_utf8 (&doc, "eventId"));
            if (i >= 0) {
               bson_destroy (&c->got[i]);
               bson_copy_to (&doc, &c->got[i]);
               c->have[i] = true;
            } else {
               bson_uint32_to_string (n++, &kp, k, sizeof k);
               bson_append_utf8 (&arr, kp, -1, get_utf8 (&doc, "lease"), -1);
            }
         }
      bson_append_array_end (&others, &arr);
      if (n) {
         bson_t r2;
         run (client, &others, NULL, &r2, NULL);
         bson_destroy (&r2);
      }
      bson_destroy (&others);
      bson_destroy (&reply);
      bson_destroy (cmd);
      sleep_ms (50);
   }
}

/* How many deliveries a claim reply holds. */
static int32_t
count_deliveries (const bson_t *reply)
{
   bson_iter_t it, d;
   int32_t n = 0;
   if (bson_iter_init_find (&it, reply, "deliveries") && bson_iter_recurse (&it, &d))
      while (bson_iter_next (&d))
         n++;
   return n;
}

/* The stored delivery of an event as {status, attempts, lastError}, or null once gone. */
static void
append_stored (bson_t *dst, const char *key, const char *event_id)
{
   bson_t *filter = BCON_NEW ("eventId", BCON_UTF8 (event_id), "handler", BCON_UTF8 (handler));
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (deliveries, filter, NULL, NULL);
   const bson_t *doc;
   bson_error_t error;
   if (mongoc_cursor_next (cur, &doc)) {
      bson_t child;
      BSON_APPEND_DOCUMENT_BEGIN (dst, key, &child);
      copy_field (&child, "status", doc, "status");
      copy_field (&child, "attempts", doc, "attempts");
      copy_field (&child, "lastError", doc, "lastError");
      bson_append_document_end (dst, &child);
   } else {
      if (mongoc_cursor_error (cur, &error))
         die ("find", &error);
      BSON_APPEND_NULL (dst, key);
   }
   mongoc_cursor_destroy (cur);
   bson_destroy (filter);
}

/* Every document of a collection, sorted by _id, as one canonical JSON string. */
static char *
snapshot (mongoc_collection_t *coll)
{
   bson_t filter = BSON_INITIALIZER;
   bson_t *opts = BCON_NEW ("sort", "{", "_id", BCON_INT32 (1), "}");
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, &filter, opts, NULL);
   bson_string_t *s = bson_string_new ("");
   const bson_t *doc;
   bson_error_t error;
   while (mongoc_cursor_next (cur, &doc)) {
      char *j = bson_as_canonical_extended_json (doc, NULL);
      bson_string_append (s, j);
      bson_string_append (s, "\n");
      bson_free (j);
   }
   if (mongoc_cursor_error (cur, &error))
      die ("snapshot", &error);
   mongoc_cursor_destroy (cur);
   bson_destroy (opts);
   bson_destroy (&filter);
   return bson_string_free (s, false);
}

/* Copies `in` to `out`, the strings "$LEASE" and "$FORGED" replaced (in arrays too). */
static void
subst (const bson_t *in, bson_t *outd, const char *lease, const char *forged)
{
   bson_iter_t it;
   bson_iter_init (&it, in);
   while (bson_iter_next (&it)) {
      const char *k = bson_iter_key (&it);
      if (BSON_ITER_HOLDS_UTF8 (&it) && !strcmp (bson_iter_utf8 (&it, NULL), "$LEASE"))
         BSON_APPEND_UTF8 (outd, k, lease);
      else if (BSON_ITER_HOLDS_UTF8 (&it) && !strcmp (bson_iter_utf8 (&it, NULL), "$FORGED"))
         BSON_APPEND_UTF8 (outd, k, forged);
      else if (BSON_ITER_HOLDS_ARRAY (&it) || BSON_ITER_HOLDS_DOCUMENT (&it)) {
         bson_t sub, child;
         const uint8_t *data;
         uint32_t len;
         bool arr = BSON_ITER_HOLDS_ARRAY (&it);
         if (arr)
            bson_iter_array (&it, &len, &data);
         else
            bson_iter_document (&it, &len, &data);
         bson_init_static (&sub, data, len);
         if (arr)
            BSON_APPEND_ARRAY_BEGIN (outd, k, &child);
         else
            BSON_APPEND_DOCUMENT_BEGIN (outd, k, &child);
         subst (&sub, &child, lease, forged);
         if (arr)
            bson_append_array_end (outd, &child);
         else
            bson_append_document_end (outd, &child);
      } else
         BSON_APPEND_VALUE (outd, k, bson_iter_value (&it));
   }
}

int
main (int argc, char **argv)
{
   bson_error_t error;
   bson_t *plan;
   mongoc_client_t *a, *b, *direct;
   const char *keys[] = {"claim", "txn", "retry", "bury", "ext"};
   const char *ids[5];
   bson_t got[5];
   bool have[5] = {false};
   claimed_t held = {ids, 5, got, have};
   char path[64];
   bson_t *line, *cmd, reply;
   const char *lease;
   char forged[128];

   if (argc != 4) {
      fprintf (stderr, "usage: matrix PROXY_URI DIRECT_URI PLAN_JSON\n");
      return 2;
   }
   mongoc_init ();
   plan = bson_new_from_json ((const uint8_t *) argv[3], -1, &error);
   if (!plan)
      die ("the plan", &error);
   handler = get_utf8 (plan, "handler");
   {
      bson_iter_t it;
      if (!bson_iter_init_find (&it, plan, "laneBase") || !BSON_ITER_HOLDS_NUMBER (&it))
         die ("the plan's laneBase", NULL);
      lane_base = bson_iter_as_int64 (&it);
   }
   app_db = get_utf8 (plan, "appDb");
   for (int i = 0; i < 5; i++) {
      snprintf (path, sizeof path, "ids.%s", keys[i]);
      ids[i] = get_utf8 (plan, path);
      bson_init (&got[i]);
      if (!ids[i])
         die (path, NULL);
   }
   a = mongoc_client_new (argv[1]);
   b = mongoc_client_new (argv[1]);
   direct = mongoc_client_new (argv[2]);
   if (!a || !b || !direct)
      die ("a URI", NULL);
   {
      char dn[128], ln[128];
      snprintf (dn, sizeof dn, "%sdeliveries", get_utf8 (plan, "prefix"));
      snprintf (ln, sizeof ln, "%slanes", get_utf8 (plan, "prefix"));
      deliveries = mongoc_client_get_collection (direct, get_utf8 (plan, "outboxDb"), dn);
      lanes = mongoc_client_get_collection (direct, get_utf8 (plan, "outboxDb"), ln);
   }

   /* claim: every field of a delivery, with its BSON type. */
   claim_until (a, &held, "matrix-c");
   {
      bson_t *filter = BCON_NEW ("eventId", BCON_UTF8 (ids[0]), "handler", BCON_UTF8 (handler));
      mongoc_cursor_t *cur = mongoc_collection_find_with_opts (deliveries, filter, NULL, NULL);
      const bson_t *doc;
      char oid[25] = "";
      bson_iter_t it;
      if (mongoc_cursor_next (cur, &doc) && bson_iter_init_find (&it, doc, "_id") && BSON_ITER_HOLDS_OID (&it))
         bson_oid_to_string (bson_iter_oid (&it), oid);
      mongoc_cursor_destroy (cur);
      bson_destroy (filter);
      line = bson_new ();
      append_fields (line, "fields", &got[0], "createdAt", NULL);
      append_types (line, "types", &got[0]);
      BSON_APPEND_UTF8 (line, "storedId", oid);
      out ("claim", line);
   }

   /* status: the handler while this connection holds the batch. */
   cmd = BCON_NEW ("relaybusStatus", BCON_UTF8 (handler));
   run (a, cmd, NULL, &reply, NULL);
   line = bson_new ();
   append_fields (line, "reply", &reply, "$clusterTime", "operationTime", NULL);
   append_types (line, "types", &reply);
   BSON_APPEND_INT32 (line, "held", 5);
   out ("status", line);
   bson_destroy (&reply);
   bson_destroy (cmd);

   /* bad input: each refused with its code, nothing changed. */
   lease = get_utf8 (&got[0], "lease");
   {
      const char *last = strrchr (lease, ':');
      snprintf (forged, sizeof forged, "%.*s:000000000000000000000000", (int) (last - lease), lease);
   }
   {
      char *d0 = snapshot (deliveries), *l0 = snapshot (lanes), *d1, *l1;
      bson_iter_t it, bad;
      bson_t arr;
      uint32_t n = 0;
      char k[16];
      const char *kp;
      mongoc_client_session_t *s;

      line = bson_new ();
      BSON_APPEND_ARRAY_BEGIN (line, "results", &arr);
      if (bson_iter_init_find (&it, plan, "bad") && bson_iter_recurse (&it, &bad))
         while (bson_iter_next (&bad)) {
            bson_t doc, sent = BSON_INITIALIZER;
            const uint8_t *data;
            uint32_t len;
            bson_iter_document (&bad, &len, &data);
            bson_init_static (&doc, data, len);
            subst (&doc, &sent, lease, forged);
            bson_uint32_to_string (n++, &kp, k, sizeof k);
            append_error_of (&arr, kp, a, &sent, NULL);
            bson_destroy (&sent);
         }
      bson_append_array_end (line, &arr);

      BSON_APPEND_ARRAY_BEGIN (line, "foreign", &arr);
      cmd = leases_cmd ("relaybusComplete", lease);
      append_error_of (&arr, "0", b, cmd, NULL);
      bson_destroy (cmd);
      cmd = leases_cmd ("relaybusRelease", lease);
      append_error_of (&arr, "1", b, cmd, NULL);
      bson_append_array_end (line, &arr);

      s = mongoc_client_start_session (a, NULL, &error);
      if (!s || !mongoc_client_session_start_transaction (s, NULL, &error))
         die ("start_transaction", &error);
      append_error_of (line, "inTransaction", a, cmd, s);
      mongoc_client_session_abort_transaction (s, &error);
      mongoc_client_session_destroy (s);
      bson_destroy (cmd);

      d1 = snapshot (deliveries);
      l1 = snapshot (lanes);
      BSON_APPEND_BOOL (line, "deliveriesUnchanged", !strcmp (d0, d1));
      BSON_APPEND_BOOL (line, "lanesUnchanged", !strcmp (l0, l1));
      out ("bad", line);
      bson_free (d0);
      bson_free (d1);
      bson_free (l0);
      bson_free (l1);
   }

   /* complete outside a transaction. */
   cmd = leases_cmd ("relaybusComplete", lease);
   run (a, cmd, NULL, &reply, NULL);
   line = bson_new ();
   BSON_APPEND_UTF8 (line, "lease", lease);
   copy_field (line, "completed", &reply, "completed");
   copy_field (line, "notCompleted", &reply, "notCompleted");
   append_stored (line, "stored", ids[0]);
   out ("completeOutside", line);
   bson_destroy (&reply);
   bson_destroy (cmd);

   /* complete inside the consumer's transaction, with the handler's write. */
   {
      mongoc_client_session_t *s = mongoc_client_start_session (a, NULL, &error);
      mongoc_collection_t *proj = mongoc_client_get_collection (a, app_db, "projections");
      bson_t *filter = BCON_NEW ("_id", BCON_UTF8 (ids[1]));
      bson_t *update = BCON_NEW ("$inc", "{", "n", BCON_INT32 (1), "}");
      bson_t uopts = BSON_INITIALIZER, ureply, creply;
      const char *tl = get_utf8 (&got[1], "lease");

      if (!s || !mongoc_client_session_start_transaction (s, NULL, &error))
         die ("start_transaction", &error);
      BSON_APPEND_BOOL (&uopts, "upsert", true);
      if (!mongoc_client_session_append (s, &uopts, &error))
         die ("session", &error);
      if (!mongoc_collection_update_one (proj, filter, update, &uopts, &ureply, &error))
         die ("update_one", &error);
      bson_destroy (&ureply);
      cmd = leases_cmd ("relaybusComplete", tl);
      run (a, cmd, s, &reply, NULL);
      if (!mongoc_client_session_commit_transaction (s, &creply, &error))
         die ("commit", &error);
      bson_destroy (&creply);
      mongoc_client_session_destroy (s);
      line = bson_new ();
      BSON_APPEND_UTF8 (line, "lease", tl);
      copy_field (line, "completed", &reply, "completed");
      copy_field (line, "notCompleted", &reply, "notCompleted");
      append_error_of (line, "again", a, cmd, NULL);
      append_stored (line, "stored", ids[1]);
      out ("completeInTransaction", line);
      bson_destroy (&reply);
      bson_destroy (cmd);
      bson_destroy (&uopts);
      bson_destroy (filter);
      bson_destroy (update);
      mongoc_collection_destroy (proj);
   }

   /* retry with delayMs: pending with the error, not due before delayMs, due again after it. */
   {
      const char *tl = get_utf8 (&got[2], "lease");
      const char *one[] = {ids[2]};
      bson_t again_doc = BSON_INITIALIZER, early;
      bool have_again = false, early_had = false;
      claimed_t again = {one, 1, &again_doc, &have_again};
      int64_t retried_at;
      bson_iter_t it, d;

      line = bson_new ();
      cmd = BCON_NEW ("relaybusRetry", BCON_UTF8 (handler), "lease", BCON_UTF8 (tl), "delayMs", BCON_INT32 (800), "error", BCON_UTF8 ("boom"));
      run (a, cmd, NULL, &reply, NULL);
      retried_at = now_ms ();
      BSON_APPEND_BOOL (line, "applied", get_bool (&reply, "applied"));
      copy_field (line, "status", &reply, "status");
      {
         bson_iter_t di;
         BSON_APPEND_UTF8 (line, "dueAtType",
                           bson_iter_init_find (&di, &reply, "dueAt") ? type_name (bson_iter_type (&di)) : "null");
      }
      bson_destroy (&reply);
      bson_destroy (cmd);
      append_stored (line, "stored", ids[2]);
      cmd = BCON_NEW ("relaybusClaim", BCON_UTF8 (handler), "limit", BCON_INT32 (100));
      run (a, cmd, NULL, &early, NULL);
      bson_destroy (cmd);
      if (bson_iter_init_find (&it, &early, "deliveries") && bson_iter_recurse (&it, &d))
         while (bson_iter_next (&d)) {
            bson_iter_t e;
            if (bson_iter_recurse (&d, &e) && bson_iter_find (&e, "eventId") && !strcmp (bson_iter_utf8 (&e, NULL), ids[2]))
               early_had = true;
         }
      settle_all (a, "relaybusRelease", &early);
      bson_destroy (&early);
      BSON_APPEND_BOOL (line, "earlyHadIt", early_had);
      claim_until (a, &again, NULL);
      BSON_APPEND_INT64 (line, "dueAfterMs", now_ms () - retried_at);
      copy_field (line, "attempt", &again_doc, "attempt");
      BSON_APPEND_BOOL (line, "newLease", strcmp (get_utf8 (&again_doc, "lease"), tl) != 0);
      cmd = leases_cmd ("relaybusComplete", tl);
      append_error_of (line, "oldLease", a, cmd, NULL);
      bson_destroy (cmd);
      cmd = leases_cmd ("relaybusComplete", get_utf8 (&again_doc, "lease"));
      run (a, cmd, NULL, &reply, NULL);
      BSON_APPEND_BOOL (line, "completed", get_utf8 (&reply, "completed.0") && !strcmp (get_utf8 (&reply, "completed.0"), get_utf8 (&again_doc, "lease")));
      bson_destroy (&reply);
      bson_destroy (cmd);
      out ("retry", line);
      bson_destroy (&again_doc);
   }

   /* bury: dead at once, with the error. */
   cmd = BCON_NEW ("relaybusBury", BCON_UTF8 (handler), "lease", BCON_UTF8 (get_utf8 (&got[3], "lease")), "error",
                   BCON_UTF8 ("poison: cannot parse"));
   run (a, cmd, NULL, &reply, NULL);
   line = bson_new ();
   BSON_APPEND_BOOL (line, "applied", get_bool (&reply, "applied"));
   copy_field (line, "status", &reply, "status");
   append_stored (line, "stored", ids[3]);
   out ("bury", line);
   bson_destroy (&reply);
   bson_destroy (cmd);

   /* extend, then release: no attempt charged, another connection claims it as attempt 1. */
   {
      const char *tl = get_utf8 (&got[4], "lease");
      const char *one[] = {ids[4]};
      bson_t again_doc = BSON_INITIALIZER;
      bool have_again = false;
      claimed_t again = {one, 1, &again_doc, &have_again};
      /* A pull handler's lane n is lane n of the handler's own lane space. */
      bson_t *filter = BCON_NEW ("_id", BCON_INT32 ((int32_t) (lane_base + strtol (tl, NULL, 10))));
      mongoc_cursor_t *cur;
      const bson_t *lane;
      bson_iter_t it;

      cmd = BCON_NEW ("relaybusExtend", BCON_UTF8 (handler), "leases", "[", BCON_UTF8 (tl), "]", "leaseMs", BCON_INT32 (120000));
      run (a, cmd, NULL, &reply, NULL);
      bson_destroy (cmd);
      line = bson_new ();
      copy_field (line, "extended", &reply, "extended");
      copy_field (line, "notExtended", &reply, "notExtended");
      BSON_APPEND_UTF8 (line, "leaseExpiresAtType",
                        bson_iter_init_find (&it, &reply, "leaseExpiresAt") ? type_name (bson_iter_type (&it)) : "null");
      bson_destroy (&reply);
      cur = mongoc_collection_find_with_opts (lanes, filter, NULL, NULL);
      if (!mongoc_cursor_next (cur, &lane))
         die ("the lane of the extended lease", NULL);
      BSON_APPEND_INT64 (line, "laneLeaseLeftMs", get_int (lane, "leaseExpiresAt") - now_ms ());
      mongoc_cursor_destroy (cur);
      bson_destroy (filter);
      out ("extend", line);

      cmd = leases_cmd ("relaybusRelease", tl);
      run (a, cmd, NULL, &reply, NULL);
      bson_destroy (cmd);
      line = bson_new ();
      copy_field (line, "released", &reply, "released");
      copy_field (line, "notReleased", &reply, "notReleased");
      bson_destroy (&reply);
      append_stored (line, "stored", ids[4]);
      claim_until (b, &again, NULL);
      copy_field (line, "attempt", &again_doc, "attempt");
      cmd = leases_cmd ("relaybusComplete", get_utf8 (&again_doc, "lease"));
      run (b, cmd, NULL, &reply, NULL);
      BSON_APPEND_BOOL (line, "completed", get_utf8 (&reply, "completed.0") && !strcmp (get_utf8 (&reply, "completed.0"), get_utf8 (&again_doc, "lease")));
      bson_destroy (&reply);
      bson_destroy (cmd);
      out ("release", line);
      bson_destroy (&again_doc);
   }

   /* the long poll: empty after maxAwaitTimeMS, then answered by a commit (the test publishes). */
   {
      bson_t left;
      int64_t t0, answered;
      bson_iter_t it, d;
      uint32_t n = 0;
      bson_t ids_arr;
      char k[16];
      const char *kp;

      cmd = BCON_NEW ("relaybusClaim", BCON_UTF8 (handler), "limit", BCON_INT32 (1000));
      run (a, cmd, NULL, &left, NULL);
      bson_destroy (cmd);
      if (bson_iter_init_find (&it, &left, "deliveries") && bson_iter_recurse (&it, &d))
         while (bson_iter_next (&d))
            n++;
      settle_all (a, "relaybusRelease", &left);
      bson_destroy (&left);
      cmd = BCON_NEW ("relaybusClaim", BCON_UTF8 (handler), "limit", BCON_INT32 (5), "maxAwaitTimeMS", BCON_INT32 (400));
      t0 = now_ms ();
      run (b, cmd, NULL, &reply, NULL);
      line = bson_new ();
      BSON_APPEND_INT64 (line, "waitedMs", now_ms () - t0);
      BSON_APPEND_INT32 (line, "deliveries", count_deliveries (&reply));
      BSON_APPEND_INT32 (line, "leftover", (int32_t) n);
      out ("longPollEmpty", line);
      bson_destroy (&reply);
      bson_destroy (cmd);

      line = bson_new ();
      BSON_APPEND_INT64 (line, "at", now_ms ());
      out ("longPollWaiting", line);
      cmd = BCON_NEW ("relaybusClaim", BCON_UTF8 (handler), "limit", BCON_INT32 (5), "maxAwaitTimeMS", BCON_INT32 (10000));
      run (b, cmd, NULL, &reply, NULL);
      answered = now_ms ();
      bson_destroy (cmd);
      settle_all (b, "relaybusComplete", &reply);
      line = bson_new ();
      BSON_APPEND_INT64 (line, "answeredAt", answered);
      BSON_APPEND_ARRAY_BEGIN (line, "eventIds", &ids_arr);
      n = 0;
      if (bson_iter_init_find (&it, &reply, "deliveries") && bson_iter_recurse (&it, &d))
         while (bson_iter_next (&d)) {
            bson_iter_t e;
            if (bson_iter_recurse (&d, &e) && bson_iter_find (&e, "eventId")) {
               bson_uint32_to_string (n++, &kp, k, sizeof k);
               bson_append_utf8 (&ids_arr, kp, -1, bson_iter_utf8 (&e, NULL), -1);
            }
         }
      bson_append_array_end (line, &ids_arr);
      out ("longPoll", line);
      bson_destroy (&reply);
   }

   for (int i = 0; i < 5; i++)
      bson_destroy (&got[i]);
   mongoc_collection_destroy (deliveries);
   mongoc_collection_destroy (lanes);
   mongoc_client_destroy (a);
   mongoc_client_destroy (b);
   mongoc_client_destroy (direct);
   bson_destroy (plan);
   mongoc_cleanup ();
   return 0;
}
