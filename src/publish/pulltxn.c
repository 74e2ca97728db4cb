/*
 * publish/pulltxn.c - plan the writes of a relaybusComplete sent inside the
 * consumer's transaction and read their replies (publish/pulltxn.h).
 *
 * The documents and fields are the store's (store/complete.c): the
 * deliveries are deleted, their events get $max completedAt (with attempt
 * history after the commit instead: store_settled_elsewhere), and with
 * completion history each delivery leaves a record with the delivery's id,
 * eventId, handler, eventType, key, sequence, createdAt, attempts + 1 and
 * completedAt; with attempt history each delivery's attempt gets its
 * record in <prefix>attempts (store/attempts.c's fields, outcome
 * succeeded), so it commits or aborts with the consumer's transaction.
 * The fence is the one the store applies in its own
 * transaction (complete_fence): the delivery pending in the lease's lane
 * with the lease's claim generation (a missing one counts as 0), the lane
 * at the lease's epoch listing it.  A pull handler's leases are issued by
 * the consumer thread, in the handler's lane space (base/outbox.h): lane n
 * of a lease is the lane document of _id
 * outbox_lane_doc_id (outbox_lane_space_of (handler), n).
 *
 * No I/O and no global state: publish/pull.c sends the commands and hands
 * back the replies.
 */
#include "publish/pulltxn.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/assert.h"
#include "base/outbox.h"
#include "publish/inject.h"

/* The FENCE round's commands. */
enum { FENCE_DELIVERIES = 0, FENCE_LANES = 1 };

/* Owns its copies of the leases, its commands, the documents the FENCE
 * round read, the failure reply and a reference on the config. */
struct pulltxn {
   config_t *cfg;
   char coll_deliveries[OUTBOX_NAME_MAX];
   char coll_events[OUTBOX_NAME_MAX];
   char coll_lanes[OUTBOX_NAME_MAX];
   char coll_completed[OUTBOX_NAME_MAX];
   char coll_attempts[OUTBOX_NAME_MAX];
   char handler[128];
   int64_t *claimed_at; /* per lease: when the consumer thread handed it out (0: unknown) */
   char instance[128];  /* that thread's instance name ("": unknown) */
   pull_lease_t *leases;
   outbox_lease_t *tokens;
   bson_t **docs;      /* per lease: its delivery as the FENCE round read it, or NULL */
   bson_t **lane_docs; /* per lease: its lane as read, or NULL (borrowed from lanes_read) */
   bson_t *lanes_read[OUTBOX_LANES];
   uint32_t n;
   int64_t now_ms;

   bson_t txn;   /* lsid, txnNumber, autocommit: false, API parameters */
   bson_t first; /* startTransaction, readConcern, $clusterTime: first command only */
   bool first_pending;
   bool opened; /* a command was planned: the transaction exists on the server */

   pulltxn_phase_t phase, next;
   bson_t cmds[PULLTXN_MAX_ROUND_COMMANDS];
   int64_t expect_n[PULLTXN_MAX_ROUND_COMMANDS]; /* -1: not checked */
   uint32_t n_cmds;

   bool failed;
   bson_t fail_reply;
   bson_t times; /* $clusterTime and operationTime of the last reply */
};

/* As publish/inject.c: the API parameters must match across a
 * transaction's statements; only the command that opens it hands on the
 * others. */
static const char *const txn_fields[] = {"lsid", "txnNumber", "apiVersion", "apiStrict", "apiDeprecationErrors"};
static const char *const first_fields[] = {"startTransaction", "readConcern", "$clusterTime"};

pulltxn_t *
pulltxn_new (const pull_req_t *r, const bson_t *cmd, config_t *cfg, int64_t now_ms, bson_error_t *error)
{
   pulltxn_t *t;
   inject_txn_t kind = inject_txn_of (cmd);

   if (kind == INJECT_TXN_NO) {
      bson_set_error (error, PULLTXN_ERROR_DOMAIN, PULLTXN_ERROR_NOT_TXN, "not a transaction statement");
      return NULL;
   }
   /* bson_t members want libbson's 128-byte alignment. */
   t = BSON_ALIGNED_ALLOC0 (pulltxn_t);
   t->cfg = config_retain (cfg);
   t->now_ms = now_ms;
   t->phase = t->next = PULLTXN_PHASE_FENCE;
   bson_init (&t->txn);
   bson_init (&t->first);
   bson_init (&t->fail_reply);
   bson_init (&t->times);
   bson_strncpy (t->handler, r->handler, sizeof t->handler);
   t->n = (uint32_t) r->n_leases;
   t->leases = bson_malloc0 ((t->n ? t->n : 1) * sizeof *t->leases);
   t->tokens = bson_malloc0 ((t->n ? t->n : 1) * sizeof *t->tokens);
   t->docs = bson_malloc0 ((t->n ? t->n : 1) * sizeof *t->docs);
   t->lane_docs = bson_malloc0 ((t->n ? t->n : 1) * sizeof *t->lane_docs);
   t->claimed_at = bson_malloc0 ((t->n ? t->n : 1) * sizeof *t->claimed_at);
   if (!outbox_collection_name (cfg->collection_prefix, OUTBOX_DELIVERIES, t->coll_deliveries, sizeof t->coll_deliveries) ||
       !outbox_collection_name (cfg->collection_prefix, OUTBOX_ATTEMPTS, t->coll_attempts, sizeof t->coll_attempts) ||
       !outbox_collection_name (cfg->collection_prefix, OUTBOX_EVENTS, t->coll_events, sizeof t->coll_events) ||
       !outbox_collection_name (cfg->collection_prefix, OUTBOX_LANES_COLL, t->coll_lanes, sizeof t->coll_lanes) ||
       !outbox_collection_name (cfg->collection_prefix, OUTBOX_COMPLETED, t->coll_completed, sizeof t->coll_completed)) {
      bson_set_error (error, PULLTXN_ERROR_DOMAIN, PULLTXN_ERROR_PREFIX_TOO_LONG, "collection_prefix is too long");
      pulltxn_destroy (t);
      return NULL;
   }
   for (uint32_t i = 0; i < t->n; i++) {
      t->leases[i] = r->leases[i];
      if (!outbox_lease_parse (t->leases[i].token, &t->tokens[i])) {
         bson_set_error (error, PULLTXN_ERROR_DOMAIN, PULLTXN_ERROR_BAD_LEASE, "lease '%s' is malformed", t->leases[i].text);
         pulltxn_destroy (t);
         return NULL;
      }
   }
   inject_copy_fields (cmd, txn_fields, 2, &t->txn);
   BSON_APPEND_BOOL (&t->txn, "autocommit", false);
   inject_copy_fields (cmd, txn_fields + 2, sizeof txn_fields / sizeof txn_fields[0] - 2, &t->txn);
   if (kind == INJECT_TXN_STARTS) {
      inject_copy_fields (cmd, first_fields, sizeof first_fields / sizeof first_fields[0], &t->first);
      t->first_pending = true;
   }
   return t;
}

void
pulltxn_destroy (pulltxn_t *t)
{
   if (!t)
      return;
   for (uint32_t i = 0; i < t->n_cmds; i++)
      bson_destroy (&t->cmds[i]);
   for (uint32_t i = 0; i < t->n; i++)
      bson_destroy (t->docs[i]);
   for (int i = 0; i < OUTBOX_LANES; i++)
      bson_destroy (t->lanes_read[i]);
   bson_free (t->docs);
   bson_free (t->lane_docs);
   bson_free (t->claimed_at);
   bson_free (t->leases);
   bson_free (t->tokens);
   bson_destroy (&t->txn);
   bson_destroy (&t->first);
   bson_destroy (&t->fail_reply);
   bson_destroy (&t->times);
   config_release (t->cfg);
   bson_free (t);
}

/* --- commands -------------------------------------------------------------- */

static bson_t *
cmd_begin (pulltxn_t *t, const char *name, const char *coll, int64_t expect_n)
{
   bson_t *c;

   RELAYBUS_ASSERT (t->n_cmds < PULLTXN_MAX_ROUND_COMMANDS);
   c = &t->cmds[t->n_cmds];
   t->expect_n[t->n_cmds] = expect_n;
   t->n_cmds++;
   bson_init (c);
   BSON_APPEND_UTF8 (c, name, coll);
   return c;
}

static void
cmd_end (pulltxn_t *t, bson_t *c)
{
   BSON_APPEND_UTF8 (c, "$db", t->cfg->outbox_database);
   bson_concat (c, &t->txn);
   if (t->first_pending) {
      bson_concat (c, &t->first);
      t->first_pending = false;
   }
   t->opened = true;
}

static const char *
idx_key (uint32_t i, char buf[16])
{
   const char *k;

   bson_uint32_to_string (i, &k, buf, 16);
   return k;
}

static void
plan_fence (pulltxn_t *t)
{
   bson_t *c;
   bson_t filter, id, in;
   bool want[OUTBOX_LANES] = {false};
   uint32_t n_lanes = 0;
   char buf[16];

   c = cmd_begin (t, "find", t->coll_deliveries, -1);
   BSON_APPEND_DOCUMENT_BEGIN (c, "filter", &filter);
   BSON_APPEND_DOCUMENT_BEGIN (&filter, "_id", &id);
   BSON_APPEND_ARRAY_BEGIN (&id, "$in", &in);
   for (uint32_t i = 0; i < t->n; i++)
      BSON_APPEND_OID (&in, idx_key (i, buf), &t->leases[i].id);
   bson_append_array_end (&id, &in);
   bson_append_document_end (&filter, &id);
   bson_append_document_end (c, &filter);
   /* At most PULL_MAX_LEASES small documents: all in the first batch. */
   BSON_APPEND_INT32 (c, "batchSize", (int32_t) t->n);
   BSON_APPEND_BOOL (c, "singleBatch", true);
   cmd_end (t, c);

   c = cmd_begin (t, "find", t->coll_lanes, -1);
   BSON_APPEND_DOCUMENT_BEGIN (c, "filter", &filter);
   BSON_APPEND_DOCUMENT_BEGIN (&filter, "_id", &id);
   BSON_APPEND_ARRAY_BEGIN (&id, "$in", &in);
   for (uint32_t i = 0; i < t->n; i++)
      if (!want[t->tokens[i].lane_id]) {
         const char *k = idx_key (n_lanes++, buf);
         want[t->tokens[i].lane_id] = true;
         BSON_APPEND_INT32 (&in, k, outbox_lane_doc_id (outbox_lane_space_of (t->handler), t->tokens[i].lane_id));
      }
   bson_append_array_end (&id, &in);
   bson_append_document_end (&filter, &id);
   bson_append_document_end (c, &filter);
   {
      bson_t proj;
      BSON_APPEND_DOCUMENT_BEGIN (c, "projection", &proj);
      BSON_APPEND_INT32 (&proj, OUTBOX_F_EPOCH, 1);
      BSON_APPEND_INT32 (&proj, OUTBOX_F_IN_FLIGHT, 1);
      bson_append_document_end (c, &proj);
   }
   BSON_APPEND_INT32 (c, "batchSize", (int32_t) n_lanes);
   BSON_APPEND_BOOL (c, "singleBatch", true);
   cmd_end (t, c);
}

void
pulltxn_set_claims (pulltxn_t *t, const bson_t *checked)
{
   bson_iter_t it, arr;
   uint32_t i = 0;

   if (bson_iter_init_find (&it, checked, "claimedAt") && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &arr))
      while (bson_iter_next (&arr) && i < t->n) {
         t->claimed_at[i++] = BSON_ITER_HOLDS_DATE_TIME (&arr) ? bson_iter_date_time (&arr) : 0;
      }
   if (bson_iter_init_find (&it, checked, "instance") && BSON_ITER_HOLDS_UTF8 (&it))
      bson_strncpy (t->instance, bson_iter_utf8 (&it, NULL), sizeof t->instance);
}

/* With attempt history: one insert of each delivery's attempt record, as
 * store/attempts.c writes one (its event and attempt number from the
 * delivery the fence read). */
static void
plan_attempts (pulltxn_t *t)
{
   bson_t *c;
   bson_t arr, one;
   char buf[16];

   if (t->cfg->attempt_history_ms <= 0)
      return;
   c = cmd_begin (t, "insert", t->coll_attempts, t->n);
   BSON_APPEND_ARRAY_BEGIN (c, "documents", &arr);
   for (uint32_t i = 0; i < t->n; i++) {
      bson_oid_t id;
      bson_iter_t it;
      int64_t attempts = 0;

      bson_oid_init (&id, NULL);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, idx_key (i, buf), &one);
      BSON_APPEND_OID (&one, "_id", &id);
      BSON_APPEND_OID (&one, OUTBOX_F_DELIVERY_ID, &t->leases[i].id);
      if (bson_iter_init_find (&it, t->docs[i], OUTBOX_F_EVENT_ID) && BSON_ITER_HOLDS_UTF8 (&it))
         BSON_APPEND_UTF8 (&one, OUTBOX_F_EVENT_ID, bson_iter_utf8 (&it, NULL));
      BSON_APPEND_UTF8 (&one, "handler", t->handler);
      if (bson_iter_init_find (&it, t->docs[i], OUTBOX_F_ATTEMPTS) && BSON_ITER_HOLDS_NUMBER (&it))
         attempts = bson_iter_as_int64 (&it);
      BSON_APPEND_INT32 (&one, OUTBOX_F_ATTEMPT, (int32_t) attempts + 1);
      if (t->instance[0])
         BSON_APPEND_UTF8 (&one, OUTBOX_F_INSTANCE, t->instance);
      if (t->claimed_at[i] > 0 && t->claimed_at[i] <= t->now_ms) {
         BSON_APPEND_DATE_TIME (&one, OUTBOX_F_STARTED_AT, t->claimed_at[i]);
         BSON_APPEND_DATE_TIME (&one, OUTBOX_F_ENDED_AT, t->now_ms);
         BSON_APPEND_INT64 (&one, OUTBOX_F_DURATION_MS, t->now_ms - t->claimed_at[i]);
      } else {
         BSON_APPEND_DATE_TIME (&one, OUTBOX_F_ENDED_AT, t->now_ms);
      }
      BSON_APPEND_UTF8 (&one, OUTBOX_F_OUTCOME, outbox_attempt_outcome_name (OUTBOX_ATTEMPT_SUCCEEDED));
      bson_append_document_end (&arr, &one);
   }
   bson_append_array_end (c, &arr);
   BSON_APPEND_BOOL (c, "ordered", true);
   cmd_end (t, c);
}

/* The events' completion time: $max, as both of the store's paths. */
static void
plan_events (pulltxn_t *t)
{
   bson_t *c;
   bson_t arr, st, q, u, sub, id, in;
   char buf[16];

   c = cmd_begin (t, "update", t->coll_events, -1);
   BSON_APPEND_ARRAY_BEGIN (c, "updates", &arr);
   BSON_APPEND_DOCUMENT_BEGIN (&arr, "0", &st);
   BSON_APPEND_DOCUMENT_BEGIN (&st, "q", &q);
   BSON_APPEND_DOCUMENT_BEGIN (&q, "_id", &id);
   BSON_APPEND_ARRAY_BEGIN (&id, "$in", &in);
   for (uint32_t i = 0; i < t->n; i++) {
      const char *ev = NULL;
      bson_iter_t it;
      if (t->docs[i] && bson_iter_init_find (&it, t->docs[i], OUTBOX_F_EVENT_ID) && BSON_ITER_HOLDS_UTF8 (&it))
         ev = bson_iter_utf8 (&it, NULL);
      BSON_APPEND_UTF8 (&in, idx_key (i, buf), ev ? ev : "");
   }
   bson_append_array_end (&id, &in);
   bson_append_document_end (&q, &id);
   bson_append_document_end (&st, &q);
   BSON_APPEND_DOCUMENT_BEGIN (&st, "u", &u);
   BSON_APPEND_DOCUMENT_BEGIN (&u, "$max", &sub);
   BSON_APPEND_DATE_TIME (&sub, OUTBOX_F_COMPLETED_AT, t->now_ms);
   bson_append_document_end (&u, &sub);
   bson_append_document_end (&st, &u);
   BSON_APPEND_BOOL (&st, "multi", true);
   bson_append_document_end (&arr, &st);
   bson_append_array_end (c, &arr);
   BSON_APPEND_BOOL (c, "ordered", true);
   cmd_end (t, c);
}

static void
plan_write (pulltxn_t *t)
{
   bson_t *c;
   bson_t arr, st, q, or_arr, one;
   char buf[16];

   /* The delete: each delivery only with the lease's claim generation, in
    * the lease's lane, still pending (store/complete.c's match). */
   c = cmd_begin (t, "delete", t->coll_deliveries, t->n);
   BSON_APPEND_ARRAY_BEGIN (c, "deletes", &arr);
   BSON_APPEND_DOCUMENT_BEGIN (&arr, "0", &st);
   BSON_APPEND_DOCUMENT_BEGIN (&st, "q", &q);
   BSON_APPEND_ARRAY_BEGIN (&q, "$or", &or_arr);
   for (uint32_t i = 0; i < t->n; i++) {
      BSON_APPEND_DOCUMENT_BEGIN (&or_arr, idx_key (i, buf), &one);
      BSON_APPEND_OID (&one, "_id", &t->leases[i].id);
      if (t->tokens[i].claims == 0) {
         /* Documents written before claim generations existed have none. */
         bson_t cl, cin;
         BSON_APPEND_DOCUMENT_BEGIN (&one, OUTBOX_F_CLAIMS, &cl);
         BSON_APPEND_ARRAY_BEGIN (&cl, "$in", &cin);
         BSON_APPEND_INT32 (&cin, "0", 0);
         BSON_APPEND_NULL (&cin, "1");
         bson_append_array_end (&cl, &cin);
         bson_append_document_end (&one, &cl);
      } else {
         BSON_APPEND_INT32 (&one, OUTBOX_F_CLAIMS, t->tokens[i].claims);
      }
      BSON_APPEND_INT32 (&one, OUTBOX_F_LANE_ID, (int32_t) t->tokens[i].lane_id);
      BSON_APPEND_UTF8 (&one, "status", "pending");
      bson_append_document_end (&or_arr, &one);
   }
   bson_append_array_end (&q, &or_arr);
   bson_append_document_end (&st, &q);
   BSON_APPEND_INT32 (&st, "limit", 0);
   bson_append_document_end (&arr, &st);
   bson_append_array_end (c, &arr);
   BSON_APPEND_BOOL (c, "ordered", true);
   cmd_end (t, c);

   /* The events' completion time, without attempt history: with it not
    * here but once the transaction committed (store_settled_elsewhere). A
    * write on the event in this transaction would make every other
    * handler's completion of it conflict for as long as the transaction
    * stays open, and the attempt records written here hold the time until
    * then (the purge reads them). */
   if (t->cfg->attempt_history_ms <= 0)
      plan_events (t);
   plan_attempts (t);
   if (!t->cfg->completion_history)
      return;
   c = cmd_begin (t, "insert", t->coll_completed, t->n);
   BSON_APPEND_ARRAY_BEGIN (c, "documents", &arr);
   for (uint32_t i = 0; i < t->n; i++) {
      static const char *const copy[] = {OUTBOX_F_EVENT_ID, "handler", OUTBOX_F_EVENT_TYPE, "key", "sequence", OUTBOX_F_CREATED_AT};
      bson_iter_t it;
      int64_t attempts = 0;

      BSON_APPEND_DOCUMENT_BEGIN (&arr, idx_key (i, buf), &one);
      BSON_APPEND_OID (&one, "_id", &t->leases[i].id);
      inject_copy_fields (t->docs[i], copy, sizeof copy / sizeof copy[0], &one);
      if (bson_iter_init_find (&it, t->docs[i], OUTBOX_F_ATTEMPTS) && BSON_ITER_HOLDS_NUMBER (&it))
         attempts = bson_iter_as_int64 (&it);
      BSON_APPEND_INT32 (&one, OUTBOX_F_ATTEMPTS, (int32_t) attempts + 1);
      BSON_APPEND_DATE_TIME (&one, OUTBOX_F_COMPLETED_AT, t->now_ms);
      bson_append_document_end (&arr, &one);
   }
   bson_append_array_end (c, &arr);
   BSON_APPEND_BOOL (c, "ordered", true);
   cmd_end (t, c);
}

/* --- failures ------------------------------------------------------------- */

static void fail_made (pulltxn_t *t, bool transient, int32_t code, const char *code_name, const char *fmt, ...)
   __attribute__ ((format (printf, 5, 6)));

static void
fail_made (pulltxn_t *t, bool transient, int32_t code, const char *code_name, const char *fmt, ...)
{
   char msg[768];
   va_list ap;

   va_start (ap, fmt);
   vsnprintf (msg, sizeof msg, fmt, ap);
   va_end (ap);
   t->failed = true;
   bson_reinit (&t->fail_reply);
   inject_error_reply (&t->fail_reply, code, code_name, msg, transient);
   bson_concat (&t->fail_reply, &t->times);
}

/* Every lease must hold in the snapshot the transaction read. */
static void
check_fence (pulltxn_t *t)
{
   for (uint32_t i = 0; i < t->n; i++) {
      if (!outbox_lease_holds (&t->tokens[i], &t->leases[i].id, t->handler, t->docs[i], t->lane_docs[i])) {
         fail_made (t, false, PULL_CODE_LEASE_LOST, pull_code_name (PULL_CODE_LEASE_LOST),
                    "relaybus: relaybusComplete: lease '%s' no longer holds (it expired and the delivery was taken "
                    "back, or its claim ended otherwise): nothing of the completion was written; abort the "
                    "transaction, the delivery will be handed out again",
                    t->leases[i].text);
         return;
      }
   }
}

uint32_t
pulltxn_next_round (pulltxn_t *t)
{
   for (uint32_t i = 0; i < t->n_cmds; i++)
      bson_destroy (&t->cmds[i]);
   t->n_cmds = 0;
   if (!t->failed && t->phase == PULLTXN_PHASE_FENCE && t->next == PULLTXN_PHASE_WRITE)
      check_fence (t);
   if (t->failed) {
      t->phase = t->next = PULLTXN_PHASE_DONE;
      return 0;
   }
   t->phase = t->next;
   switch (t->phase) {
   case PULLTXN_PHASE_FENCE:
      t->next = PULLTXN_PHASE_WRITE;
      if (t->n > 0)
         plan_fence (t);
      break;
   case PULLTXN_PHASE_WRITE:
      t->next = PULLTXN_PHASE_DONE;
      plan_write (t);
      break;
   default:
      t->next = PULLTXN_PHASE_DONE;
      break;
   }
   if (t->n_cmds == 0)
      t->phase = t->next = PULLTXN_PHASE_DONE;
   return t->n_cmds;
}

pulltxn_phase_t
pulltxn_phase (const pulltxn_t *t)
{
   return t->phase;
}

const bson_t *
pulltxn_command (const pulltxn_t *t, uint32_t i)
{
   return i < t->n_cmds ? &t->cmds[i] : NULL;
}

/* --- replies ---------------------------------------------------------------- */

/* Calls take (t, doc) for each document of the firstBatch array of a
 * find reply (doc static, valid while the reply is); false when the reply
 * is not a find's or its batch holds something other than documents. */
static bool
each_in_batch (pulltxn_t *t, const bson_t *reply, void (*take) (pulltxn_t *t, const bson_t *doc))
{
   bson_iter_t it, cursor, batch;

   if (!bson_iter_init_find (&it, reply, "cursor") || !BSON_ITER_HOLDS_DOCUMENT (&it) || !bson_iter_recurse (&it, &cursor) ||
       !bson_iter_find (&cursor, "firstBatch") || !BSON_ITER_HOLDS_ARRAY (&cursor) || !bson_iter_recurse (&cursor, &batch))
      return false;
   while (bson_iter_next (&batch)) {
      const uint8_t *data;
      uint32_t len;
      bson_t doc;

      if (!BSON_ITER_HOLDS_DOCUMENT (&batch))
         return false;
      bson_iter_document (&batch, &len, &data);
      if (!bson_init_static (&doc, data, len))
         return false;
      take (t, &doc);
   }
   return true;
}

/* A delivery read by the fence's find: kept for the lease it is. */
static void
take_delivery (pulltxn_t *t, const bson_t *doc)
{
   bson_iter_t id;

   if (!bson_iter_init_find (&id, doc, "_id") || !BSON_ITER_HOLDS_OID (&id))
      return;
   for (uint32_t i = 0; i < t->n; i++)
      if (!t->docs[i] && bson_oid_equal (bson_iter_oid (&id), &t->leases[i].id))
         t->docs[i] = bson_copy (doc);
}

/* A lane document of the handler's lane space read by the fence's find. */
static void
take_lane (pulltxn_t *t, const bson_t *doc)
{
   bson_iter_t id;
   int64_t lane;

   if (!bson_iter_init_find (&id, doc, "_id") || !BSON_ITER_HOLDS_NUMBER (&id))
      return;
   lane = bson_iter_as_int64 (&id) - outbox_lane_doc_id (outbox_lane_space_of (t->handler), 0);
   if (lane < 0 || lane >= OUTBOX_LANES || t->lanes_read[lane])
      return;
   t->lanes_read[lane] = bson_copy (doc);
}

static bool
take_lanes (pulltxn_t *t, const bson_t *reply)
{
   if (!each_in_batch (t, reply, take_lane))
      return false;
   for (uint32_t i = 0; i < t->n; i++)
      t->lane_docs[i] = t->lanes_read[t->tokens[i].lane_id];
   return true;
}

static const char *
command_desc (const pulltxn_t *t, uint32_t i, char *buf, size_t len)
{
   bson_iter_t it;

   if (i < t->n_cmds && bson_iter_init (&it, &t->cmds[i]) && bson_iter_next (&it))
      snprintf (buf, len, "%s on %s", bson_iter_key (&it), BSON_ITER_HOLDS_UTF8 (&it) ? bson_iter_utf8 (&it, NULL) : "?");
   else
      snprintf (buf, len, "a completion command");
   return buf;
}

void
pulltxn_reply (pulltxn_t *t, uint32_t i, const bson_t *reply)
{
   bson_iter_t it, we, f;
   char desc[OUTBOX_NAME_MAX + 32];

   if (t->failed || i >= t->n_cmds)
      return;
   bson_reinit (&t->times);
   inject_copy_times (reply, &t->times);
   if (!bson_iter_init_find (&it, reply, "ok") || !BSON_ITER_HOLDS_NUMBER (&it) || bson_iter_as_double (&it) != 1.0) {
      /* The server's own error, labels and all (a WriteConflict with a
       * takeover stays TransientTransactionError: the driver retries). */
      t->failed = true;
      bson_destroy (&t->fail_reply);
      bson_copy_to (reply, &t->fail_reply);
      return;
   }
   if (bson_iter_init_find (&it, reply, "writeErrors") && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &we) &&
       bson_iter_next (&we)) {
      int32_t code = INJECT_CODE_UNKNOWN_ERROR;
      const char *msg = "write error";
      char name[32];
      const char *cn;

      if (BSON_ITER_HOLDS_DOCUMENT (&we) && bson_iter_recurse (&we, &f))
         while (bson_iter_next (&f)) {
            if (strcmp (bson_iter_key (&f), "code") == 0 && BSON_ITER_HOLDS_NUMBER (&f))
               code = (int32_t) bson_iter_as_int64 (&f);
            else if (strcmp (bson_iter_key (&f), "errmsg") == 0 && BSON_ITER_HOLDS_UTF8 (&f))
               msg = bson_iter_utf8 (&f, NULL);
         }
      cn = server_code_name (code);
      if (!cn) {
         snprintf (name, sizeof name, "Location%d", code);
         cn = name;
      }
      fail_made (t, code == INJECT_CODE_WRITE_CONFLICT, code, cn, "relaybus: relaybusComplete: %s failed: %.300s",
                 command_desc (t, i, desc, sizeof desc), msg);
      return;
   }
   switch (t->phase) {
   case PULLTXN_PHASE_FENCE:
      if (!(i == FENCE_DELIVERIES ? each_in_batch (t, reply, take_delivery) : take_lanes (t, reply)))
         fail_made (t, false, INJECT_CODE_INTERNAL_ERROR, "InternalError", "relaybus: relaybusComplete: unexpected reply to %s",
                    command_desc (t, i, desc, sizeof desc));
      return;
   case PULLTXN_PHASE_WRITE:
      if (t->expect_n[i] >= 0 &&
          !(bson_iter_init_find (&it, reply, "n") && BSON_ITER_HOLDS_NUMBER (&it) && bson_iter_as_int64 (&it) == t->expect_n[i])) {
         /* The snapshot showed every delivery: a delete that misses one
          * met a concurrent change the server did not call a conflict.
          * Either way the transaction must not commit as it is. */
         fail_made (t, true, INJECT_CODE_WRITE_CONFLICT, "WriteConflict", "relaybus: relaybusComplete: %s wrote %lld of %lld documents",
                    command_desc (t, i, desc, sizeof desc),
                    (long long) (bson_iter_init_find (&it, reply, "n") && BSON_ITER_HOLDS_NUMBER (&it) ? bson_iter_as_int64 (&it) : -1),
                    (long long) t->expect_n[i]);
      }
      return;
   default:
      return;
   }
}

bool
pulltxn_failed (const pulltxn_t *t, const bson_t **client_reply)
{
   if (t->failed && client_reply)
      *client_reply = &t->fail_reply;
   return t->failed;
}

void
pulltxn_answer (const pulltxn_t *t, bson_t *out)
{
   bson_t arr;
   char buf[16];

   bson_init (out);
   BSON_APPEND_DOUBLE (out, "ok", 1.0);
   BSON_APPEND_ARRAY_BEGIN (out, "completed", &arr);
   for (uint32_t i = 0; i < t->n; i++)
      BSON_APPEND_UTF8 (&arr, idx_key (i, buf), t->leases[i].text);
   bson_append_array_end (out, &arr);
   BSON_APPEND_ARRAY_BEGIN (out, "notCompleted", &arr);
   bson_append_array_end (out, &arr);
   bson_concat (out, &t->times);
}

void
pulltxn_abort_command (const pulltxn_t *t, bson_t *out)
{
   bson_init (out);
   BSON_APPEND_INT32 (out, "abortTransaction", 1);
   BSON_APPEND_UTF8 (out, "$db", "admin");
   bson_concat (out, &t->txn);
}

bool
pulltxn_opened (const pulltxn_t *t)
{
   return t->opened || bson_empty (&t->first);
}
