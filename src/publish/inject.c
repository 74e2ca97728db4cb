/*
 * publish/inject.c - plan the outbox writes of one annotated statement and read
 * their replies.
 *
 * The store semantics are the reference's (relaybus-mongodb-store.md):
 *
 *  - Idempotent append: events are written with upserts, never inserts, so
 *    two transactions racing on one id meet as a write conflict (retryable,
 *    TransientTransactionError) instead of a duplicate key (which aborts the
 *    transaction without a label).  An event whose id the annotation gave
 *    may exist already: it is read inside the transaction first, and gets
 *    deliveries only for handlers its `handlers` list lacks.  Generated ids
 *    are fresh ObjectIds, so nothing needs reading.
 *  - Per-key sequence equals commit order: the counter of a key is
 *    incremented inside the transaction; an uncommitted increment makes every
 *    other appender of the key conflict until it commits.  Several events of
 *    one key take n consecutive values with one $inc of n.
 *
 * With spans exported (base/trace.h), each new event gets a `publish`
 * span here, child of its annotation's traceparent (or the root of a
 * trace of its own, as [tracing] sample says), and its stored traceparent
 * names that span as parent: the dispatcher's attempt spans are its
 * children.  The span is queued when the write is planned (enqueue only).
 *
 * This module does no I/O and keeps no global state: publish/publish.c sends the
 * commands and hands back the replies.  Commands are built completely when a
 * round is planned and stay valid until the next round.
 */
#include "publish/inject.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/assert.h"
#include "base/outbox.h"
#include "base/trace.h"

static const char *const phase_names[INJECT_PHASE_COUNT_] = {
   [INJECT_PHASE_READ] = "read",
   [INJECT_PHASE_SEQ] = "seq",
   [INJECT_PHASE_WRITE] = "write",
   [INJECT_PHASE_DONE] = "done",
};

/* What the job knows about one event beyond its annotation. */
typedef struct {
   bool existing; /* found by the READ round */
   /* Of the stored event (pointing into job->read_reply), when existing. */
   const char *stored_type;
   const char *stored_key;
   bool stored_has_sequence;
   int64_t stored_sequence;
   bool stored_has_not_before;
   int64_t stored_not_before;
   bool stored_has_handlers;
   bson_iter_t stored_handlers; /* array of strings */
   /* New keyed events: the sequence from the SEQ round. */
   int64_t sequence;
   int key_slot; /* index into job->keys, -1 without */
   /* The publish span of a new event (spans exported, and a traceparent
    * in its headers or a trace of its own by [tracing] sample): `span`
    * holds the trace id and the publish span's id, which the stored
    * traceparent carries as the parent of the dispatcher's attempts. */
   bool traced;
   trace_context_t span;
} event_state_t;

/* One distinct key of the new keyed events: one findAndModify. */
typedef struct {
   const char *key;
   uint32_t count;
} key_slot_t;

/* Owns its events (moved in), its commands, the copied READ reply, the
 * failure reply and a reference on the config. */
struct inject_job {
   annotate_t ann;
   config_t *cfg;
   fleet_set_t *fleet; /* our reference, or NULL: the local handlers only */
   char coll_events[OUTBOX_NAME_MAX];
   char coll_deliveries[OUTBOX_NAME_MAX];
   char coll_keys[OUTBOX_NAME_MAX];
   bson_t txn;   /* lsid, txnNumber, autocommit: false, API parameters */
   bson_t first; /* startTransaction, readConcern, $clusterTime: first command only */
   bool first_pending;
   int64_t now_ms;
   bool has_given_ids;

   inject_phase_t phase; /* the current round's */
   inject_phase_t next;  /* the next to plan */
   /* Sized for the job: a round has at most one command per event (SEQ)
    * and at least room for WRITE's two. */
   bson_t *cmds;
   uint32_t *expect_n; /* WRITE: the `n` each reply must report */
   uint32_t cmds_cap, n_cmds;

   event_state_t *ev; /* one per event */
   key_slot_t *keys;  /* at most one per event */
   uint32_t n_keys;
   bson_t *read_reply;

   bool failed;
   bson_t fail_reply;

   uint32_t rounds, commands, deliveries;
};

const char *
inject_phase_name (inject_phase_t phase)
{
   return (unsigned) phase < INJECT_PHASE_COUNT_ ? phase_names[phase] : "invalid";
}

/* --- transactions ------------------------------------------------------ */

inject_txn_t
inject_txn_of (const bson_t *cmd)
{
   bson_iter_t it;
   bool lsid = false, txn = false, autocommit_false = false, starts = false;

   if (!bson_iter_init (&it, cmd))
      return INJECT_TXN_NO;
   while (bson_iter_next (&it)) {
      const char *k = bson_iter_key (&it);

      if (strcmp (k, "lsid") == 0)
         lsid = BSON_ITER_HOLDS_DOCUMENT (&it);
      else if (strcmp (k, "txnNumber") == 0)
         txn = BSON_ITER_HOLDS_INT64 (&it) || BSON_ITER_HOLDS_INT32 (&it);
      else if (strcmp (k, "autocommit") == 0)
         autocommit_false = BSON_ITER_HOLDS_BOOL (&it) && !bson_iter_bool (&it);
      else if (strcmp (k, "startTransaction") == 0)
         starts = BSON_ITER_HOLDS_BOOL (&it) && bson_iter_bool (&it);
   }
   if (!lsid || !txn || !autocommit_false)
      return INJECT_TXN_NO;
   return starts ? INJECT_TXN_STARTS : INJECT_TXN_YES;
}

static bool
reply_ok (const bson_t *reply)
{
   bson_iter_t it;

   if (!bson_iter_init_find (&it, reply, "ok"))
      return false;
   if (BSON_ITER_HOLDS_BOOL (&it))
      return bson_iter_bool (&it);
   return BSON_ITER_HOLDS_NUMBER (&it) && bson_iter_as_double (&it) == 1.0;
}

/* The first write error, if any: positions `we` on its document. */
static bool
first_write_error (const bson_t *reply, bson_iter_t *we)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, reply, "writeErrors") && BSON_ITER_HOLDS_ARRAY (&it) &&
          bson_iter_recurse (&it, we) && bson_iter_next (we);
}

bool
inject_reply_failed (const bson_t *reply)
{
   bson_iter_t we;

   return !reply_ok (reply) || first_write_error (reply, &we);
}

/* Reads `code` and `errmsg` from the fields `it` walks, keeping the values
 * passed in for those absent. */
static void
error_fields (bson_iter_t *it, int32_t *code, const char **errmsg)
{
   while (bson_iter_next (it)) {
      if (strcmp (bson_iter_key (it), "code") == 0 && BSON_ITER_HOLDS_NUMBER (it))
         *code = (int32_t) bson_iter_as_int64 (it);
      else if (strcmp (bson_iter_key (it), "errmsg") == 0 && BSON_ITER_HOLDS_UTF8 (it))
         *errmsg = bson_iter_utf8 (it, NULL);
   }
}

int32_t
inject_reply_error (const bson_t *reply, const char **errmsg)
{
   bson_iter_t it;
   int32_t code = 0;

   *errmsg = "";
   if (bson_iter_init (&it, reply))
      error_fields (&it, &code, errmsg);
   return code;
}

void
inject_copy_fields (const bson_t *src, const char *const *names, size_t n, bson_t *out)
{
   bson_iter_t it;

   for (size_t i = 0; i < n; i++) {
      if (bson_iter_init_find (&it, src, names[i]))
         bson_append_iter (out, names[i], -1, &it);
   }
}

/* --- construction ------------------------------------------------------ */

/* Fields copied from the statement onto every injected command.  The API
 * parameters must match across a transaction's statements. */
static const char *const txn_fields[] = {
   "lsid", "txnNumber", "apiVersion", "apiStrict", "apiDeprecationErrors",
};
/* Only a relaybusPublish that opens the transaction hands these on. */
static const char *const first_fields[] = {"startTransaction", "readConcern", "$clusterTime"};

/* The transaction fields of statement `cmd`, appended to `out` in a fixed
 * order (lsid first, as drivers send it), whatever the statement's order,
 * plus autocommit: false. */
static void
append_txn_fields (const bson_t *cmd, bson_t *out)
{
   inject_copy_fields (cmd, txn_fields, 2, out);
   BSON_APPEND_BOOL (out, "autocommit", false);
   inject_copy_fields (cmd, txn_fields + 2, sizeof txn_fields / sizeof txn_fields[0] - 2, out);
}

void
inject_abort_command (const bson_t *cmd, bson_t *out)
{
   bson_init (out);
   BSON_APPEND_INT32 (out, "abortTransaction", 1);
   BSON_APPEND_UTF8 (out, "$db", "admin");
   append_txn_fields (cmd, out);
}

inject_job_t *
inject_job_new (annotate_t *ann, const bson_t *cmd, bool opens_txn, config_t *cfg, int64_t now_ms, bson_error_t *error)
{
   inject_job_t *job;

   if (inject_txn_of (cmd) == INJECT_TXN_NO) {
      bson_set_error (error, INJECT_ERROR_DOMAIN, INJECT_ERROR_NOT_TXN, "not a transaction statement");
      return NULL;
   }
   /* bson_t and bson_iter_t members want libbson's 128-byte alignment. */
   job = BSON_ALIGNED_ALLOC0 (inject_job_t);
   memcpy (&job->ann, ann, sizeof *ann);
   memset (ann, 0, sizeof *ann);
   job->cfg = config_retain (cfg);
   job->now_ms = now_ms;
   job->next = INJECT_PHASE_READ;
   job->phase = INJECT_PHASE_READ;
   bson_init (&job->txn);
   bson_init (&job->first);
   bson_init (&job->fail_reply);

   if (!outbox_collection_name (cfg->collection_prefix, OUTBOX_EVENTS, job->coll_events, sizeof job->coll_events) ||
       !outbox_collection_name (cfg->collection_prefix, OUTBOX_DELIVERIES, job->coll_deliveries, sizeof job->coll_deliveries) ||
       !outbox_collection_name (cfg->collection_prefix, OUTBOX_KEY_SEQUENCES, job->coll_keys, sizeof job->coll_keys)) {
      bson_set_error (error, INJECT_ERROR_DOMAIN, INJECT_ERROR_PREFIX_TOO_LONG, "collection_prefix is too long");
      inject_job_destroy (job);
      return NULL;
   }

   append_txn_fields (cmd, &job->txn);
   if (opens_txn) {
      inject_copy_fields (cmd, first_fields, sizeof first_fields / sizeof first_fields[0], &job->first);
      job->first_pending = !bson_empty (&job->first);
   }

   job->cmds_cap = job->ann.n_events > 2 ? job->ann.n_events : 2;
   job->cmds = bson_aligned_alloc0 (BSON_ALIGNOF (bson_t), job->cmds_cap * sizeof *job->cmds);
   job->expect_n = bson_malloc0 (job->cmds_cap * sizeof *job->expect_n);
   job->ev = bson_aligned_alloc0 (BSON_ALIGNOF (event_state_t), (job->ann.n_events ? job->ann.n_events : 1) * sizeof *job->ev);
   job->keys = bson_malloc0 ((job->ann.n_events ? job->ann.n_events : 1) * sizeof *job->keys);
   for (uint32_t i = 0; i < job->ann.n_events; i++) {
      job->ev[i].key_slot = -1;
      if (job->ann.events[i].given_id)
         job->has_given_ids = true;
   }
   return job;
}

void
inject_job_set_fleet (inject_job_t *job, fleet_set_t *fleet)
{
   fleet_release (job->fleet);
   job->fleet = fleet_retain (fleet);
}

void
inject_job_destroy (inject_job_t *job)
{
   if (!job)
      return;
   for (uint32_t i = 0; i < job->n_cmds; i++)
      bson_destroy (&job->cmds[i]);
   bson_free (job->cmds);
   bson_free (job->expect_n);
   bson_free (job->ev);
   bson_free (job->keys);
   annotate_cleanup (&job->ann);
   fleet_release (job->fleet);
   if (job->read_reply)
      bson_destroy (job->read_reply);
   bson_destroy (&job->txn);
   bson_destroy (&job->first);
   bson_destroy (&job->fail_reply);
   config_release (job->cfg);
   bson_free (job);
}

/* --- building commands -------------------------------------------------- */

/* Starts command `i` of the round: {<name>: <coll>, ...}. */
static bson_t *
cmd_begin (inject_job_t *job, const char *name, const char *coll)
{
   bson_t *c;

   /* READ plans 1, SEQ at most one per event, WRITE 2: within cmds_cap. */
   BSON_ASSERT (job->n_cmds < job->cmds_cap);
   c = &job->cmds[job->n_cmds];

   bson_init (c);
   BSON_APPEND_UTF8 (c, name, coll);
   job->expect_n[job->n_cmds] = 0;
   job->n_cmds++;
   return c;
}

/* Ends a command: $db and the transaction fields. */
static void
cmd_end (inject_job_t *job, bson_t *c)
{
   BSON_APPEND_UTF8 (c, "$db", job->cfg->outbox_database);
   bson_concat (c, &job->txn);
   if (job->first_pending) {
      bson_concat (c, &job->first);
      job->first_pending = false;
   }
}

static void
append_date (bson_t *doc, const char *key, int64_t ms)
{
   bson_append_date_time (doc, key, -1, ms);
}

/* Does the stored event list `handler` already? */
static bool
stored_lists (const event_state_t *st, const char *handler)
{
   bson_iter_t h;

   if (!st->stored_has_handlers || !bson_iter_recurse (&st->stored_handlers, &h))
      return false;
   while (bson_iter_next (&h)) {
      if (BSON_ITER_HOLDS_UTF8 (&h) && strcmp (bson_iter_utf8 (&h, NULL), handler) == 0)
         return true;
   }
   return false;
}

static bool
local_handler (const config_t *cfg, const char *name)
{
   for (size_t h = 0; h < cfg->n_handlers; h++)
      if (strcmp (cfg->handlers[h].name, name) == 0)
         return true;
   return false;
}

/* The names of the handlers event `i` gets a delivery for: subscribed to
 * its type and not listed yet, first of the local config, then of the
 * fleet's set (a name the local config has is matched by the local
 * declaration only).  Pointers into the config or the fleet snapshot, both
 * held by the job. */
static uint32_t
new_handlers (const inject_job_t *job, uint32_t i, const char *out[INJECT_MAX_HANDLERS])
{
   const event_state_t *st = &job->ev[i];
   const char *type = st->existing && st->stored_type ? st->stored_type : job->ann.events[i].type;
   uint32_t n = 0;

   for (size_t h = 0; h < job->cfg->n_handlers && n < INJECT_MAX_HANDLERS; h++) {
      const config_handler_t *hd = &job->cfg->handlers[h];

      if (!config_handler_matches (hd, type))
         continue;
      if (st->existing && stored_lists (st, hd->name))
         continue;
      out[n++] = hd->name;
   }
   for (size_t h = 0; job->fleet && h < job->fleet->n_set && n < INJECT_MAX_HANDLERS; h++) {
      const fleet_handler_t *fh = job->fleet->set[h];

      if (!fleet_handler_matches (fh, type) || local_handler (job->cfg, fh->name))
         continue;
      if (st->existing && stored_lists (st, fh->name))
         continue;
      out[n++] = fh->name;
   }
   return n;
}

static void
plan_read (inject_job_t *job)
{
   bson_t *c = cmd_begin (job, "find", job->coll_events);
   bson_t filter, id, in, proj;
   uint32_t n = 0;
   char idx[16];
   const char *key;

   BSON_APPEND_DOCUMENT_BEGIN (c, "filter", &filter);
   BSON_APPEND_DOCUMENT_BEGIN (&filter, "_id", &id);
   BSON_APPEND_ARRAY_BEGIN (&id, "$in", &in);
   for (uint32_t i = 0; i < job->ann.n_events; i++) {
      if (!job->ann.events[i].given_id)
         continue;
      bson_uint32_to_string (n++, &key, idx, sizeof idx);
      bson_append_utf8 (&in, key, -1, job->ann.events[i].given_id, -1);
   }
   bson_append_array_end (&id, &in);
   bson_append_document_end (&filter, &id);
   bson_append_document_end (c, &filter);
   BSON_APPEND_DOCUMENT_BEGIN (c, "projection", &proj);
   BSON_APPEND_INT32 (&proj, "type", 1);
   BSON_APPEND_INT32 (&proj, "key", 1);
   BSON_APPEND_INT32 (&proj, "sequence", 1);
   BSON_APPEND_INT32 (&proj, OUTBOX_F_NOT_BEFORE, 1);
   BSON_APPEND_INT32 (&proj, "handlers", 1);
   bson_append_document_end (c, &proj);
   /* At most ANNOTATE_MAX_EVENTS small documents: all in the first batch. */
   BSON_APPEND_INT32 (c, "batchSize", (int32_t) n);
   BSON_APPEND_BOOL (c, "singleBatch", true);
   cmd_end (job, c);
}

/* One findAndModify per distinct key of the new keyed events, in the order
 * keys first appear.  Returns false when there is none. */
static bool
plan_seq (inject_job_t *job)
{
   job->n_keys = 0;
   for (uint32_t i = 0; i < job->ann.n_events; i++) {
      const annotate_event_t *ev = &job->ann.events[i];
      uint32_t k;

      if (!ev->key || job->ev[i].existing)
         continue;
      for (k = 0; k < job->n_keys; k++) {
         if (strcmp (job->keys[k].key, ev->key) == 0)
            break;
      }
      if (k == job->n_keys) {
         job->keys[k].key = ev->key;
         job->keys[k].count = 0;
         job->n_keys++;
      }
      job->ev[i].key_slot = (int) k;
      job->keys[k].count++;
   }
   for (uint32_t k = 0; k < job->n_keys; k++) {
      bson_t *c = cmd_begin (job, "findAndModify", job->coll_keys);
      bson_t q, u, inc;

      BSON_APPEND_DOCUMENT_BEGIN (c, "query", &q);
      BSON_APPEND_UTF8 (&q, "_id", job->keys[k].key);
      bson_append_document_end (c, &q);
      BSON_APPEND_DOCUMENT_BEGIN (c, "update", &u);
      BSON_APPEND_DOCUMENT_BEGIN (&u, "$inc", &inc);
      BSON_APPEND_INT64 (&inc, "value", (int64_t) job->keys[k].count);
      bson_append_document_end (&u, &inc);
      bson_append_document_end (c, &u);
      BSON_APPEND_BOOL (c, "upsert", true);
      BSON_APPEND_BOOL (c, "new", true);
      cmd_end (job, c);
   }
   return job->n_keys > 0;
}

/* The traceparent among an annotation's headers (validated at parse:
 * annotate.c), or NULL. */
static const char *
event_traceparent (const annotate_event_t *ev)
{
   bson_iter_t hit;

   if (!ev->has_headers || !bson_iter_recurse (&ev->headers, &hit))
      return NULL;
   while (bson_iter_next (&hit))
      if (BSON_ITER_HOLDS_UTF8 (&hit) && !strcasecmp (bson_iter_key (&hit), "traceparent"))
         return bson_iter_utf8 (&hit, NULL);
   return NULL;
}

/* The publish span of new event `i`, queued (trace_emit copies it): a
 * PRODUCER span, child of the annotation's traceparent, or the root of a
 * new sampled trace.  Nothing when spans are not exported, or when the
 * event has no trace context and sample does not start one. */
static void
trace_publish (inject_job_t *job, uint32_t i)
{
   const annotate_event_t *ev = &job->ann.events[i];
   event_state_t *st = &job->ev[i];
   trace_context_t parent;
   trace_span_t s = {0};
   bool has_parent;

   st->traced = false;
   if (!trace_enabled ())
      return;
   has_parent = trace_parse_traceparent (event_traceparent (ev), &parent);
   if (has_parent) {
      st->span = parent;
      memcpy (s.parent_id, parent.span_id, sizeof s.parent_id);
   } else if (trace_sample ()) {
      trace_new_id (st->span.trace_id, sizeof st->span.trace_id);
      st->span.flags = 0x01; /* sampled */
   } else {
      return;
   }
   trace_new_id (st->span.span_id, sizeof st->span.span_id);
   st->traced = true;
   memcpy (s.trace_id, st->span.trace_id, sizeof s.trace_id);
   memcpy (s.span_id, st->span.span_id, sizeof s.span_id);
   s.kind = TRACE_KIND_PRODUCER;
   snprintf (s.name, sizeof s.name, "publish %.*s", (int) (ev->type_len < 80 ? ev->type_len : 80), ev->type);
   s.start_ns = job->now_ms * 1000000;
   s.end_ns = trace_now_ns ();
   if (s.end_ns < s.start_ns)
      s.end_ns = s.start_ns;
   trace_span_str (&s, "messaging.system", "relaybus");
   trace_span_str (&s, "messaging.operation.name", "publish");
   trace_span_str (&s, "messaging.operation.type", "create");
   trace_span_str (&s, "messaging.message.id", annotate_event_id (ev));
   trace_span_str (&s, "messaging.destination.name", job->coll_events);
   {
      char type[TRACE_ATTR_VALUE_MAX];
      snprintf (type, sizeof type, "%.*s", (int) ev->type_len, ev->type);
      trace_span_str (&s, "relaybus.event.type", type);
   }
   if (ev->key) {
      char key[TRACE_ATTR_VALUE_MAX];
      snprintf (key, sizeof key, "%.*s", (int) ev->key_len, ev->key);
      trace_span_str (&s, "relaybus.event.key", key);
   }
   trace_emit (&s);
}

/* The fields of a new event document, for $setOnInsert. */
static void
append_event_fields (const inject_job_t *job, uint32_t i, bson_t *doc)
{
   const annotate_event_t *ev = &job->ann.events[i];
   const event_state_t *st = &job->ev[i];

   bson_append_utf8 (doc, "type", 4, ev->type, (int) ev->type_len);
   if (ev->has_payload)
      bson_append_iter (doc, "payload", 7, &ev->payload);
   else
      BSON_APPEND_NULL (doc, "payload");
   if (ev->key) {
      bson_append_utf8 (doc, "key", 3, ev->key, (int) ev->key_len);
      BSON_APPEND_INT64 (doc, "sequence", st->sequence);
   }
   if (st->traced) {
      /* The headers as given, with the traceparent naming the publish span. */
      bson_t h;
      bson_iter_t hit;
      char tp[TRACE_PARENT_LEN + 1];

      BSON_APPEND_DOCUMENT_BEGIN (doc, "headers", &h);
      if (ev->has_headers && bson_iter_recurse (&ev->headers, &hit))
         while (bson_iter_next (&hit))
            if (strcasecmp (bson_iter_key (&hit), "traceparent") != 0)
               bson_append_iter (&h, NULL, 0, &hit);
      trace_format_traceparent (&st->span, tp);
      BSON_APPEND_UTF8 (&h, "traceparent", tp);
      bson_append_document_end (doc, &h);
   } else if (ev->has_headers) {
      bson_append_iter (doc, "headers", 7, &ev->headers);
   }
   if (ev->correlation_id)
      BSON_APPEND_UTF8 (doc, OUTBOX_F_CORRELATION_ID, ev->correlation_id);
   if (ev->causation_id)
      BSON_APPEND_UTF8 (doc, OUTBOX_F_CAUSATION_ID, ev->causation_id);
   if (ev->has_not_before)
      append_date (doc, OUTBOX_F_NOT_BEFORE, ev->not_before_ms);
   append_date (doc, OUTBOX_F_CREATED_AT, job->now_ms);
}

static void
append_delivery (inject_job_t *job, uint32_t i, const char *handler, bson_t *docs, uint32_t n)
{
   const annotate_event_t *ev = &job->ann.events[i];
   const event_state_t *st = &job->ev[i];
   const char *id = annotate_event_id (ev);
   const char *type = ev->type, *key = ev->key;
   bool has_seq = ev->key != NULL, has_nb = ev->has_not_before;
   int64_t seq = st->sequence, nb = ev->not_before_ms;
   bson_t d;
   bson_oid_t oid;
   char idx[16];
   const char *k;

   if (st->existing) {
      /* New deliveries of a stored event copy the stored event's fields. */
      type = st->stored_type ? st->stored_type : type;
      key = st->stored_key;
      has_seq = st->stored_has_sequence && key;
      seq = st->stored_sequence;
      has_nb = st->stored_has_not_before;
      nb = st->stored_not_before;
   }
   bson_uint32_to_string (n, &k, idx, sizeof idx);
   BSON_APPEND_DOCUMENT_BEGIN (docs, k, &d);
   bson_oid_init (&oid, NULL);
   BSON_APPEND_OID (&d, "_id", &oid);
   BSON_APPEND_UTF8 (&d, OUTBOX_F_EVENT_ID, id);
   BSON_APPEND_UTF8 (&d, "handler", handler);
   BSON_APPEND_UTF8 (&d, OUTBOX_F_EVENT_TYPE, type);
   if (key) {
      BSON_APPEND_UTF8 (&d, "key", key);
      if (has_seq)
         BSON_APPEND_INT64 (&d, "sequence", seq);
   }
   BSON_APPEND_INT32 (&d, OUTBOX_F_LANE_ID, (int32_t) outbox_lane_id (key, id));
   BSON_APPEND_UTF8 (&d, "lane", "ready");
   BSON_APPEND_UTF8 (&d, "status", "pending");
   BSON_APPEND_INT32 (&d, OUTBOX_F_ATTEMPTS, 0);
   BSON_APPEND_INT32 (&d, OUTBOX_F_CLAIMS, 0);
   append_date (&d, OUTBOX_F_DUE_AT, has_nb ? nb : job->now_ms);
   append_date (&d, OUTBOX_F_CREATED_AT, job->now_ms);
   bson_append_document_end (docs, &d);
}

/* The events update (one statement per event that needs a write) and the
 * deliveries insert.  Either may be absent: a retried publish of stored
 * events whose handlers all have deliveries writes nothing. */
static void
plan_write (inject_job_t *job)
{
   bson_t *c = NULL, updates, docs;
   uint32_t n_updates = 0, n_docs = 0;
   const char *handlers[INJECT_MAX_HANDLERS];
   uint32_t n_handlers;

   for (uint32_t i = 0; i < job->ann.n_events; i++) {
      const char *id = annotate_event_id (&job->ann.events[i]);
      bson_t st, q, u, set, add, each;
      char idx[16];
      const char *k;

      n_handlers = new_handlers (job, i, handlers);
      if (job->ev[i].existing && n_handlers == 0)
         continue;
      if (!c) {
         c = cmd_begin (job, "update", job->coll_events);
         BSON_APPEND_ARRAY_BEGIN (c, "updates", &updates);
      }
      bson_uint32_to_string (n_updates++, &k, idx, sizeof idx);
      BSON_APPEND_DOCUMENT_BEGIN (&updates, k, &st);
      BSON_APPEND_DOCUMENT_BEGIN (&st, "q", &q);
      BSON_APPEND_UTF8 (&q, "_id", id);
      bson_append_document_end (&st, &q);
      BSON_APPEND_DOCUMENT_BEGIN (&st, "u", &u);
      if (!job->ev[i].existing) {
         trace_publish (job, i);
         BSON_APPEND_DOCUMENT_BEGIN (&u, "$setOnInsert", &set);
         append_event_fields (job, i, &set);
         if (n_handlers == 0) {
            bson_t empty;

            BSON_APPEND_ARRAY_BEGIN (&set, "handlers", &empty);
            bson_append_array_end (&set, &empty);
         }
         bson_append_document_end (&u, &set);
      }
      if (n_handlers > 0) {
         BSON_APPEND_DOCUMENT_BEGIN (&u, "$addToSet", &add);
         BSON_APPEND_DOCUMENT_BEGIN (&add, "handlers", &each);
         {
            bson_t arr;

            BSON_APPEND_ARRAY_BEGIN (&each, "$each", &arr);
            for (uint32_t h = 0; h < n_handlers; h++) {
               char hidx[16];
               const char *hk;

               bson_uint32_to_string (h, &hk, hidx, sizeof hidx);
               BSON_APPEND_UTF8 (&arr, hk, handlers[h]);
            }
            bson_append_array_end (&each, &arr);
         }
         bson_append_document_end (&add, &each);
         bson_append_document_end (&u, &add);
      }
      bson_append_document_end (&st, &u);
      /* A stored event must still exist: if it went away since the read,
       * the update conflicts rather than re-creating half of it. */
      BSON_APPEND_BOOL (&st, "upsert", !job->ev[i].existing);
      bson_append_document_end (&updates, &st);
   }
   if (c) {
      bson_append_array_end (c, &updates);
      BSON_APPEND_BOOL (c, "ordered", true);
      cmd_end (job, c);
      job->expect_n[job->n_cmds - 1] = n_updates;
   }

   /* The same handlers again (matching is cheap; keeping them for every
    * event would cost ANNOTATE_MAX_EVENTS * CONFIG_MAX_HANDLERS slots). */
   c = NULL;
   for (uint32_t i = 0; i < job->ann.n_events; i++) {
      n_handlers = new_handlers (job, i, handlers);
      for (uint32_t h = 0; h < n_handlers; h++) {
         if (!c) {
            c = cmd_begin (job, "insert", job->coll_deliveries);
            BSON_APPEND_ARRAY_BEGIN (c, "documents", &docs);
         }
         append_delivery (job, i, handlers[h], &docs, n_docs++);
      }
   }
   if (c) {
      bson_append_array_end (c, &docs);
      BSON_APPEND_BOOL (c, "ordered", true);
      cmd_end (job, c);
      job->expect_n[job->n_cmds - 1] = n_docs;
   }
   job->deliveries = n_docs;
}

uint32_t
inject_job_next_round (inject_job_t *job)
{
   for (uint32_t i = 0; i < job->n_cmds; i++)
      bson_destroy (&job->cmds[i]);
   job->n_cmds = 0;
   if (job->failed) {
      job->phase = job->next = INJECT_PHASE_DONE;
      return 0;
   }
   while (job->next != INJECT_PHASE_DONE && job->n_cmds == 0) {
      /* Phases only move forward: READ, SEQ, WRITE, DONE. */
      RELAYBUS_ASSERT (job->next >= job->phase);
      job->phase = job->next;
      switch (job->phase) {
      case INJECT_PHASE_READ:
         job->next = INJECT_PHASE_SEQ;
         if (job->has_given_ids)
            plan_read (job);
         break;
      case INJECT_PHASE_SEQ:
         job->next = INJECT_PHASE_WRITE;
         (void) plan_seq (job);
         break;
      case INJECT_PHASE_WRITE:
         job->next = INJECT_PHASE_DONE;
         plan_write (job);
         break;
      default:
         job->next = INJECT_PHASE_DONE;
         break;
      }
   }
   if (job->n_cmds == 0) {
      job->phase = INJECT_PHASE_DONE;
      return 0;
   }
   RELAYBUS_ASSERT (job->n_cmds <= job->cmds_cap);
   job->rounds++;
   job->commands += job->n_cmds;
   return job->n_cmds;
}

inject_phase_t
inject_job_phase (const inject_job_t *job)
{
   return job->phase;
}

const bson_t *
inject_job_command (const inject_job_t *job, uint32_t i)
{
   return i < job->n_cmds ? &job->cmds[i] : NULL;
}

/* --- replies ------------------------------------------------------------ */

void
inject_copy_times (const bson_t *reply, bson_t *out)
{
   static const char *const fields[] = {"$clusterTime", "operationTime"};

   inject_copy_fields (reply, fields, sizeof fields / sizeof fields[0], out);
}

void
inject_error_reply (bson_t *out, int32_t code, const char *code_name, const char *errmsg, bool transient)
{
   BSON_APPEND_DOUBLE (out, "ok", 0.0);
   BSON_APPEND_UTF8 (out, "errmsg", errmsg);
   BSON_APPEND_INT32 (out, "code", code);
   BSON_APPEND_UTF8 (out, "codeName", code_name);
   if (transient) {
      bson_t labels;

      BSON_APPEND_ARRAY_BEGIN (out, "errorLabels", &labels);
      BSON_APPEND_UTF8 (&labels, "0", "TransientTransactionError");
      bson_append_array_end (out, &labels);
   }
}

/* A made-up failure: {ok: 0, errmsg, code, codeName}. */
static void
fail_made (inject_job_t *job, const bson_t *reply, bool transient, int32_t code, const char *code_name, const char *fmt, ...)
   __attribute__ ((format (printf, 6, 7)));

/* `transient`: a retry of the whole transaction is the right answer, so
 * the error carries TransientTransactionError as the server's would. */
static void
fail_made (inject_job_t *job, const bson_t *reply, bool transient, int32_t code, const char *code_name, const char *fmt, ...)
{
   char msg[512];
   va_list ap;

   va_start (ap, fmt);
   vsnprintf (msg, sizeof msg, fmt, ap);
   va_end (ap);
   job->failed = true;
   bson_reinit (&job->fail_reply);
   inject_error_reply (&job->fail_reply, code, code_name, msg, transient);
   if (reply)
      inject_copy_times (reply, &job->fail_reply);
}


/* Names of the write error codes an outbox write can meet; others get
 * mongod's generic "Location<code>". */
static const char *
code_name (int32_t code, char *buf, size_t len)
{
   const char *name = server_code_name (code);

   if (name)
      return name;
   snprintf (buf, len, "Location%d", code);
   return buf;
}

static const char *
command_desc (const inject_job_t *job, uint32_t i, char *buf, size_t len)
{
   bson_iter_t it;

   if (i < job->n_cmds && bson_iter_init (&it, &job->cmds[i]) && bson_iter_next (&it))
      snprintf (buf, len, "%s on %s", bson_iter_key (&it), BSON_ITER_HOLDS_UTF8 (&it) ? bson_iter_utf8 (&it, NULL) : "?");
   else
      snprintf (buf, len, "an outbox write");
   return buf;
}

/* The `n` a write reply reports. */
static bool
reply_n (const bson_t *reply, int64_t *n)
{
   bson_iter_t it;

   if (!bson_iter_init_find (&it, reply, "n") || !BSON_ITER_HOLDS_NUMBER (&it))
      return false;
   *n = bson_iter_as_int64 (&it);
   return true;
}

static bool
take_read_reply (inject_job_t *job, const bson_t *reply)
{
   bson_iter_t it, cursor, batch;

   job->read_reply = bson_copy (reply);
   if (!bson_iter_init_find (&it, job->read_reply, "cursor") || !BSON_ITER_HOLDS_DOCUMENT (&it) ||
       !bson_iter_recurse (&it, &cursor))
      return false;
   if (!bson_iter_find (&cursor, "firstBatch") || !BSON_ITER_HOLDS_ARRAY (&cursor) || !bson_iter_recurse (&cursor, &batch))
      return false;
   while (bson_iter_next (&batch)) {
      bson_iter_t f;
      event_state_t *st = NULL;

      if (!BSON_ITER_HOLDS_DOCUMENT (&batch) || !bson_iter_recurse (&batch, &f))
         return false;
      /* Match by _id first: fields may come in any order. */
      {
         bson_iter_t idit;
         const char *id;

         if (!bson_iter_recurse (&batch, &idit) || !bson_iter_find (&idit, "_id") || !BSON_ITER_HOLDS_UTF8 (&idit))
            return false;
         id = bson_iter_utf8 (&idit, NULL);
         for (uint32_t i = 0; i < job->ann.n_events; i++) {
            if (job->ann.events[i].given_id && strcmp (job->ann.events[i].given_id, id) == 0)
               st = &job->ev[i];
         }
      }
      if (!st)
         continue;
      st->existing = true;
      while (bson_iter_next (&f)) {
         const char *k = bson_iter_key (&f);

         if (strcmp (k, "type") == 0 && BSON_ITER_HOLDS_UTF8 (&f)) {
            st->stored_type = bson_iter_utf8 (&f, NULL);
         } else if (strcmp (k, "key") == 0 && BSON_ITER_HOLDS_UTF8 (&f)) {
            st->stored_key = bson_iter_utf8 (&f, NULL);
         } else if (strcmp (k, "sequence") == 0 && BSON_ITER_HOLDS_NUMBER (&f)) {
            st->stored_has_sequence = true;
            st->stored_sequence = bson_iter_as_int64 (&f);
         } else if (strcmp (k, OUTBOX_F_NOT_BEFORE) == 0 && BSON_ITER_HOLDS_DATE_TIME (&f)) {
            st->stored_has_not_before = true;
            st->stored_not_before = bson_iter_date_time (&f);
         } else if (strcmp (k, "handlers") == 0 && BSON_ITER_HOLDS_ARRAY (&f)) {
            st->stored_has_handlers = true;
            st->stored_handlers = f;
         }
      }
   }
   return true;
}

static bool
take_seq_reply (inject_job_t *job, uint32_t k, const bson_t *reply)
{
   bson_iter_t it, v;
   int64_t last, first;
   uint32_t rank = 0;

   if (k >= job->n_keys || !bson_iter_init_find (&it, reply, "value") || !BSON_ITER_HOLDS_DOCUMENT (&it) ||
       !bson_iter_recurse (&it, &v) || !bson_iter_find (&v, "value") || !BSON_ITER_HOLDS_NUMBER (&v))
      return false;
   last = bson_iter_as_int64 (&v);
   if (last < (int64_t) job->keys[k].count)
      return false;
   first = last - (int64_t) job->keys[k].count + 1;
   for (uint32_t i = 0; i < job->ann.n_events; i++) {
      if (job->ev[i].key_slot == (int) k)
         job->ev[i].sequence = first + rank++;
   }
   return true;
}

void
inject_job_reply (inject_job_t *job, uint32_t i, const bson_t *reply)
{
   bson_iter_t we;
   char desc[OUTBOX_NAME_MAX + 32];
   int64_t n;

   if (job->failed || i >= job->n_cmds)
      return;
   if (!reply_ok (reply)) {
      /* The server's own error: relayed as it is, labels and all. */
      job->failed = true;
      bson_destroy (&job->fail_reply);
      bson_copy_to (reply, &job->fail_reply);
      return;
   }
   if (first_write_error (reply, &we)) {
      bson_iter_t f;
      int32_t code = INJECT_CODE_UNKNOWN_ERROR;
      const char *msg = "write error";
      char buf[32];

      if (BSON_ITER_HOLDS_DOCUMENT (&we) && bson_iter_recurse (&we, &f))
         error_fields (&f, &code, &msg);
      fail_made (job, reply, code == INJECT_CODE_WRITE_CONFLICT, code, code_name (code, buf, sizeof buf), "relaybus: %s failed: %.300s",
                 command_desc (job, i, desc, sizeof desc), msg);
      return;
   }
   switch (job->phase) {
   case INJECT_PHASE_READ:
      if (!take_read_reply (job, reply))
         goto malformed;
      return;
   case INJECT_PHASE_SEQ:
      if (!take_seq_reply (job, i, reply))
         goto malformed;
      return;
   case INJECT_PHASE_WRITE:
      if (!reply_n (reply, &n) || n != (int64_t) job->expect_n[i]) {
         /* A stored event that vanished without a conflict, or a server that
          * does not count as mongod does: either way the outbox is not what
          * the transaction must commit. */
         fail_made (job, reply, true, INJECT_CODE_WRITE_CONFLICT, "WriteConflict", "relaybus: %s wrote %lld of %u documents",
                    command_desc (job, i, desc, sizeof desc), (long long) (reply_n (reply, &n) ? n : -1), job->expect_n[i]);
         return;
      }
      return;
   default:
      return;
   }
malformed:
   fail_made (job, reply, false, INJECT_CODE_INTERNAL_ERROR, "InternalError", "relaybus: unexpected reply to %s", command_desc (job, i, desc, sizeof desc));
}

bool
inject_job_failed (const inject_job_t *job, const bson_t **client_reply)
{
   if (job->failed && client_reply)
      *client_reply = &job->fail_reply;
   return job->failed;
}

void
inject_job_abort_command (const inject_job_t *job, bson_t *out)
{
   bson_init (out);
   BSON_APPEND_INT32 (out, "abortTransaction", 1);
   BSON_APPEND_UTF8 (out, "$db", "admin");
   bson_concat (out, &job->txn);
}

bool
inject_job_append_ids (const inject_job_t *job, bson_t *doc, const char *key)
{
   bson_t arr;
   char idx[16];
   const char *k;

   if (!BSON_APPEND_ARRAY_BEGIN (doc, key, &arr))
      return false;
   for (uint32_t i = 0; i < job->ann.n_events; i++) {
      bson_uint32_to_string (i, &k, idx, sizeof idx);
      BSON_APPEND_UTF8 (&arr, k, annotate_event_id (&job->ann.events[i]));
   }
   return bson_append_array_end (doc, &arr);
}

uint32_t
inject_job_rounds (const inject_job_t *job)
{
   return job->rounds;
}

uint32_t
inject_job_commands (const inject_job_t *job)
{
   return job->commands;
}

uint32_t
inject_job_deliveries (const inject_job_t *job)
{
   return job->deliveries;
}

uint32_t
inject_job_n_events (const inject_job_t *job)
{
   return job->ann.n_events;
}
