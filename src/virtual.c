/*
 * virtual.c - the requests the proxy answers itself: annotated statements,
 * relaybusPublish and other relaybus* commands, and commits of transactions
 * it injected into.
 *
 * One operation (virtual_op_t) per request taken over.  It holds the client
 * request (client_hold_request), sends its own commands on the client's
 * upstream connection (client_send_internal) and answers (client_answer)
 * when its last reply arrived.  The commands of an inject.h round are
 * pipelined, VIRTUAL_WINDOW at a time.  Replies come back in order, so the
 * operation counts them instead of tagging them.
 *
 * Ownership: an operation is owned by its outstanding internal requests and
 * by whoever is running it; it is freed when it is finished (or its
 * connection closed) and no request of it is outstanding.  client.c calls
 * every outstanding callback with an error when the connection closes, so
 * nothing outlives its connection.
 *
 * Atomicity rests on three rules: nothing of an annotated statement is
 * forwarded before its annotation validated; the client hears of the
 * statement only after the outbox writes succeeded; and a failed outbox
 * write is followed by an abortTransaction on the same connection, so even
 * a client that ignores the error cannot commit the business write alone.
 * A client that pipelines another request behind an operation in progress
 * (no driver does) is disconnected: forwarding that request first could
 * commit the transaction before its events were written.  When the upstream
 * connection is lost mid-operation the client connection closes with it;
 * the server aborts the transaction when the driver retries it with a new
 * txnNumber, or when transactionLifetimeLimitSeconds runs out.
 */
#include "virtual.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "annotate.h"
#include "config.h"
#include "inject.h"
#include "log.h"
#include "outbox.h"
#include "publish_hooks.h"

/* What the routing of one request decided (the hook maps it to
 * client_route_t). */
typedef enum {
   VIRTUAL_PASS = 0, /* not ours: forward it */
   VIRTUAL_TAKEN,    /* consumed: answered now or later */
   VIRTUAL_FAILED,   /* the connection must close: `reason` and `error` say why */
} virtual_result_t;

/* --- counters and the wake hook --------------------------------------- */

static struct {
   _Atomic uint64_t annotated, published, events, deliveries, rounds, commands, bad_annotations, outside_txn,
      statement_failed, inject_failed, aborted_lost, wakes;
} counters;

#define COUNT(field, n) atomic_fetch_add_explicit (&counters.field, (uint64_t) (n), memory_order_relaxed)
#define READ(field) atomic_load_explicit (&counters.field, memory_order_relaxed)

void
virtual_get_stats (virtual_stats_t *out)
{
   out->annotated = READ (annotated);
   out->published = READ (published);
   out->events = READ (events);
   out->deliveries = READ (deliveries);
   out->rounds = READ (rounds);
   out->commands = READ (commands);
   out->bad_annotations = READ (bad_annotations);
   out->outside_txn = READ (outside_txn);
   out->statement_failed = READ (statement_failed);
   out->inject_failed = READ (inject_failed);
   out->aborted_lost = READ (aborted_lost);
   out->wakes = READ (wakes);
}

static _Atomic (publish_wake_fn) wake_hook;

void
publish_set_wake_hook (publish_wake_fn fn)
{
   atomic_store (&wake_hook, fn);
}

void
publish_wake (void)
{
   publish_wake_fn fn = atomic_load (&wake_hook);

   if (fn)
      fn ();
}

/* --- transactions injected into ---------------------------------------- */

/* Direct-mapped by a hash of (lsid, txnNumber): a collision forgets the
 * older transaction, which only costs its wake-up.  Thread-local, like the
 * operations below: each forwarding loop thread has its own (DESIGN: state
 * per loop), and no lock is needed.  A commit carried by another loop's
 * connection is not recognised; its events go out at the next poll. */
#define TXN_LSID_MAX 64 /* {id: UUID} is 30 bytes */

typedef struct {
   bool used;
   uint32_t lsid_len;
   uint8_t lsid[TXN_LSID_MAX];
   int64_t txn_number;
} txn_slot_t;

static _Thread_local txn_slot_t txn_slots[VIRTUAL_TXN_SLOTS];

/* The lsid document's bytes and the txnNumber of a command. */
static bool
txn_key (const bson_t *cmd, const uint8_t **lsid, uint32_t *lsid_len, int64_t *txn_number)
{
   bson_iter_t it;

   if (!bson_iter_init_find (&it, cmd, "lsid") || !BSON_ITER_HOLDS_DOCUMENT (&it))
      return false;
   bson_iter_document (&it, lsid_len, lsid);
   if (*lsid_len > TXN_LSID_MAX || !bson_iter_init_find (&it, cmd, "txnNumber") ||
       !(BSON_ITER_HOLDS_INT64 (&it) || BSON_ITER_HOLDS_INT32 (&it)))
      return false;
   *txn_number = bson_iter_as_int64 (&it);
   return true;
}

/* Copies lsid and txnNumber only (the body may be megabytes). */
static void
txn_key_copy (const bson_t *cmd, bson_t *out)
{
   bson_iter_t it;

   if (bson_iter_init_find (&it, cmd, "lsid"))
      bson_append_iter (out, NULL, 0, &it);
   if (bson_iter_init_find (&it, cmd, "txnNumber"))
      bson_append_iter (out, NULL, 0, &it);
}

static txn_slot_t *
txn_slot (const uint8_t *lsid, uint32_t lsid_len, int64_t txn_number)
{
   uint32_t h = outbox_fnv1a (lsid, lsid_len) ^ outbox_fnv1a (&txn_number, sizeof txn_number);

   return &txn_slots[h % VIRTUAL_TXN_SLOTS];
}

static void
txn_remember (const bson_t *cmd)
{
   const uint8_t *lsid;
   uint32_t len;
   int64_t n;
   txn_slot_t *s;

   if (!txn_key (cmd, &lsid, &len, &n))
      return;
   s = txn_slot (lsid, len, n);
   s->used = true;
   s->lsid_len = len;
   memcpy (s->lsid, lsid, len);
   s->txn_number = n;
}

/* Finds (and with `forget`, removes) the command's transaction. */
static bool
txn_lookup (const bson_t *cmd, bool forget)
{
   const uint8_t *lsid;
   uint32_t len;
   int64_t n;
   txn_slot_t *s;

   if (!txn_key (cmd, &lsid, &len, &n))
      return false;
   s = txn_slot (lsid, len, n);
   if (!s->used || s->txn_number != n || s->lsid_len != len || memcmp (s->lsid, lsid, len) != 0)
      return false;
   if (forget)
      s->used = false;
   return true;
}

/* --- operations ----------------------------------------------------------- */

typedef enum {
   OP_STATEMENT = 0, /* an annotated statement: waiting for its reply */
   OP_INJECT,        /* outbox rounds running */
   OP_RELAY,         /* relayed with a callback: a commit to wake on, a stripped getMore */
   OP_DONE,          /* answered, or the connection closed */
   OP_KIND_COUNT_
} op_state_t;

static const char *const op_state_names[OP_KIND_COUNT_] = {
   [OP_STATEMENT] = "statement",
   [OP_INJECT] = "inject",
   [OP_RELAY] = "relay",
   [OP_DONE] = "done",
};

/* One request taken over.  Listed in ops_by_conn while not done, so that a
 * request pipelined behind it is noticed. */
typedef struct virtual_op {
   uint64_t conn_id;
   uint64_t request_seq; /* client_hold_request's */
   op_state_t state;
   bool is_publish;      /* relaybusPublish: answer {ok: 1, eventIds} */
   bool is_commit;       /* OP_RELAY of a commitTransaction: wake on success */
   bson_t txn_cmd;       /* the statement's transaction fields, for the commit table */
   inject_job_t *job;
   bson_t stmt_reply;    /* the statement's reply, relayed after the outbox writes */
   bson_t times;         /* $clusterTime/operationTime of the last reply (relaybusPublish) */
   uint32_t round_n, sent, answered; /* of the current round */
   uint32_t outstanding; /* internal requests sent and not called back */
   bool running;         /* a function of ours is on the stack: do not free */
   bool listed;          /* in ops_by_conn */
   struct virtual_op *next_in_bucket;
} virtual_op_t;

#define OP_BUCKETS 1024
static _Thread_local virtual_op_t *ops_by_conn[OP_BUCKETS];

static void
op_list (virtual_op_t *op)
{
   virtual_op_t **b = &ops_by_conn[op->conn_id % OP_BUCKETS];

   op->next_in_bucket = *b;
   *b = op;
}

static void
op_unlist (virtual_op_t *op)
{
   for (virtual_op_t **p = &ops_by_conn[op->conn_id % OP_BUCKETS]; *p; p = &(*p)->next_in_bucket) {
      if (*p == op) {
         *p = op->next_in_bucket;
         op->next_in_bucket = NULL;
         return;
      }
   }
}

static bool
conn_busy (uint64_t conn_id)
{
   for (virtual_op_t *op = ops_by_conn[conn_id % OP_BUCKETS]; op; op = op->next_in_bucket) {
      if (op->conn_id == conn_id)
         return true;
   }
   return false;
}

static virtual_op_t *
op_new (client_conn_t *c, uint64_t seq, op_state_t state)
{
   /* Its bson_t members want libbson's 128-byte alignment. */
   virtual_op_t *op = BSON_ALIGNED_ALLOC0 (virtual_op_t);

   op->conn_id = client_id (c);
   op->request_seq = seq;
   op->state = state;
   bson_init (&op->txn_cmd);
   bson_init (&op->stmt_reply);
   bson_init (&op->times);
   /* A relayed request is forwarded in order like any other: what follows
    * it cannot overtake it, so it does not make the connection busy. */
   op->listed = state != OP_RELAY;
   if (op->listed)
      op_list (op);
   return op;
}

/* Marks the operation finished; it is freed once nothing refers to it. */
static void
op_finish (virtual_op_t *op)
{
   if (op->state != OP_DONE) {
      op->state = OP_DONE;
      if (op->listed)
         op_unlist (op);
      op->listed = false;
   }
}

static void
op_release_maybe (virtual_op_t *op)
{
   if (op->state != OP_DONE || op->outstanding > 0 || op->running)
      return;
   inject_job_destroy (op->job);
   bson_destroy (&op->txn_cmd);
   bson_destroy (&op->stmt_reply);
   bson_destroy (&op->times);
   bson_free (op);
}

static int64_t
now_ms (void)
{
   struct timespec ts;

   clock_gettime (CLOCK_REALTIME, &ts);
   return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Answers the operation's request; a failure to answer closes the
 * connection (the client would otherwise wait forever). */
static void
op_answer (client_conn_t *c, virtual_op_t *op, const bson_t *reply)
{
   bson_error_t error;

   if (client_state (c) == CLIENT_STATE_CLOSING)
      return;
   if (!client_answer (c, op->request_seq, reply, &error))
      client_disconnect (c, STATS_CLOSE_INTERNAL, "answering a %s: %s", op_state_names[op->state], error.message);
}

static void
op_answer_error (client_conn_t *c, uint64_t seq, int32_t code, const char *code_name, const char *errmsg)
{
   bson_error_t error;

   if (!client_answer_error (c, seq, code, code_name, errmsg, &error))
      client_disconnect (c, STATS_CLOSE_INTERNAL, "answering an error: %s", error.message);
}

static void
keep_times (virtual_op_t *op, const bson_t *reply)
{
   bson_iter_t it;

   bson_reinit (&op->times);
   if (bson_iter_init_find (&it, reply, "$clusterTime"))
      bson_append_iter (&op->times, NULL, 0, &it);
   if (bson_iter_init_find (&it, reply, "operationTime"))
      bson_append_iter (&op->times, NULL, 0, &it);
}

static void on_inject_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx);
static void round_start (client_conn_t *c, virtual_op_t *op);

/* The reply to the abortTransaction sent after a failure: nothing to do. */
static void
on_abort_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   (void) c;
   (void) reply;
   (void) error;
   (void) ctx;
}

/* Sends what the window allows of the current round.  On a send failure
 * the connection closes (outstanding callbacks then fire with errors). */
static void
round_send (client_conn_t *c, virtual_op_t *op)
{
   bson_error_t error;

   while (op->sent < op->round_n && op->sent - op->answered < VIRTUAL_WINDOW) {
      const bson_t *cmd = inject_job_command (op->job, op->sent);

      if (!client_send_internal (c, cmd, NULL, 0, on_inject_reply, op, &error)) {
         COUNT (aborted_lost, 1);
         op_finish (op);
         client_disconnect (c, STATS_CLOSE_INTERNAL, "sending an outbox write: %s", error.message);
         return;
      }
      op->sent++;
      op->outstanding++;
   }
}

/* All rounds succeeded: the client gets its statement's reply, or
 * relaybusPublish's. */
static void
op_succeeded (client_conn_t *c, virtual_op_t *op)
{
   COUNT (published, 1);
   COUNT (events, inject_job_n_events (op->job));
   COUNT (deliveries, inject_job_deliveries (op->job));
   COUNT (rounds, inject_job_rounds (op->job));
   COUNT (commands, inject_job_commands (op->job));
   txn_remember (&op->txn_cmd);
   log_conn (LOG_LEVEL_DEBUG, client_id (c), client_peer (c), "published %u event(s), %u deliveries, in %u round trip(s)",
             inject_job_n_events (op->job), inject_job_deliveries (op->job), inject_job_rounds (op->job));
   if (op->is_publish) {
      bson_t reply = BSON_INITIALIZER;

      BSON_APPEND_DOUBLE (&reply, "ok", 1.0);
      if (!inject_job_append_ids (op->job, &reply, "eventIds")) {
         bson_destroy (&reply);
         client_disconnect (c, STATS_CLOSE_INTERNAL, "relaybusPublish reply too large");
         op_finish (op);
         return;
      }
      bson_concat (&reply, &op->times);
      op_answer (c, op, &reply);
      bson_destroy (&reply);
   } else {
      op_answer (c, op, &op->stmt_reply);
   }
   op_finish (op);
}

/* An outbox write failed: abort the transaction on the same connection,
 * then tell the client (the abort runs before anything the client sends
 * next, as the connection serialises requests). */
static void
op_failed (client_conn_t *c, virtual_op_t *op, const bson_t *client_reply)
{
   bson_t abort;
   bson_error_t error;
   char *desc = NULL;

   COUNT (inject_failed, 1);
   if (log_enabled (LOG_LEVEL_INFO)) {
      bson_iter_t it;

      desc = bson_strdup (bson_iter_init_find (&it, client_reply, "errmsg") && BSON_ITER_HOLDS_UTF8 (&it)
                             ? bson_iter_utf8 (&it, NULL)
                             : "?");
      log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c),
                "outbox write failed in the %s round; aborting the transaction: %s",
                inject_phase_name (inject_job_phase (op->job)), desc);
      bson_free (desc);
   }
   inject_job_abort_command (op->job, &abort);
   if (!client_send_internal (c, &abort, NULL, 0, on_abort_reply, NULL, &error)) {
      /* Without the abort the transaction could still commit: close. */
      bson_destroy (&abort);
      op_finish (op);
      client_disconnect (c, STATS_CLOSE_INTERNAL, "cannot abort after a failed outbox write: %s", error.message);
      return;
   }
   bson_destroy (&abort);
   op_answer (c, op, client_reply);
   op_finish (op);
}

static void
round_start (client_conn_t *c, virtual_op_t *op)
{
   op->round_n = inject_job_next_round (op->job);
   op->sent = op->answered = 0;
   if (op->round_n == 0) {
      const bson_t *fail;

      if (inject_job_failed (op->job, &fail))
         op_failed (c, op, fail);
      else
         op_succeeded (c, op);
      return;
   }
   round_send (c, op);
}

static void
on_inject_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   virtual_op_t *op = ctx;

   op->outstanding--;
   if (!reply || op->state == OP_DONE) {
      if (op->state != OP_DONE) {
         COUNT (aborted_lost, 1);
         log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c), "connection lost in the middle of an outbox write: %s",
                   error ? error->message : "?");
         op_finish (op);
      }
      op_release_maybe (op);
      return;
   }
   op->running = true;
   inject_job_reply (op->job, op->answered++, &reply->body);
   keep_times (op, &reply->body);
   if (inject_job_failed (op->job, NULL)) {
      /* Send nothing more; finish once what was sent has come back. */
      if (op->answered == op->sent)
         round_start (c, op);
   } else if (op->answered < op->round_n) {
      round_send (c, op);
   } else {
      round_start (c, op);
   }
   op->running = false;
   op_release_maybe (op);
}

/* The annotated statement's own reply. */
static void
on_statement_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   virtual_op_t *op = ctx;

   op->outstanding--;
   if (!reply) {
      COUNT (aborted_lost, 1);
      op_finish (op);
      op_release_maybe (op);
      return;
   }
   op->running = true;
   if (inject_reply_failed (&reply->body)) {
      /* The server refused the statement and aborted the transaction:
       * nothing to write, relay as is. */
      COUNT (statement_failed, 1);
      op_answer (c, op, &reply->body);
      op_finish (op);
   } else {
      bson_destroy (&op->stmt_reply);
      bson_copy_to (&reply->body, &op->stmt_reply);
      op->state = OP_INJECT;
      round_start (c, op);
   }
   op->running = false;
   op_release_maybe (op);
}

/* A request relayed through the proxy: a commit of a transaction injected
 * into (wake the dispatcher when it succeeded), or a getMore/killCursors
 * whose annotation copy was stripped. */
static void
on_relay_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   virtual_op_t *op = ctx;

   (void) error;
   op->outstanding--;
   if (reply) {
      op->running = true;
      op_answer (c, op, &reply->body);
      if (op->is_commit && !inject_reply_failed (&reply->body)) {
         (void) txn_lookup (&op->txn_cmd, true);
         COUNT (wakes, 1);
         publish_wake ();
      }
      op->running = false;
   }
   op_finish (op);
   op_release_maybe (op);
}

/* --- routing ------------------------------------------------------------- */

/* Holds the request; false (and a reason) when it cannot be held. */
static bool
hold (client_conn_t *c, const wire_msg_t *msg, int compressor, uint64_t *seq, stats_close_reason_t *reason, bson_error_t *error)
{
   if (client_hold_request (c, msg->header.request_id, WIRE_OP_MSG, compressor, seq, error))
      return true;
   *reason = STATS_CLOSE_INTERNAL;
   return false;
}

static const char *const outside_txn_msg =
   "relaybus: annotated writes must run inside a transaction (lsid, txnNumber and autocommit: false): start one "
   "with session.withTransaction() or session.startTransaction() and pass the session to the write";

static virtual_result_t
route_annotated (client_conn_t *c, const wire_msg_t *msg, int compressor, stats_close_reason_t *reason, bson_error_t *error)
{
   uint64_t seq;
   annotate_t *ann = NULL;
   bson_t fwd;
   bson_error_t aerr;
   inject_txn_t txn = inject_txn_of (&msg->body);
   const char *cmd = wire_command_name (&msg->body);
   config_t *cfg = NULL;
   virtual_op_t *op;
   virtual_result_t res = VIRTUAL_TAKEN;

   COUNT (annotated, 1);
   bson_init (&fwd);
   if (!hold (c, msg, compressor, &seq, reason, error)) {
      res = VIRTUAL_FAILED;
      goto done;
   }
   if (cmd && (strcmp (cmd, "commitTransaction") == 0 || strcmp (cmd, "abortTransaction") == 0)) {
      COUNT (bad_annotations, 1);
      op_answer_error (c, seq, 2, "BadValue",
                       "relaybus: annotate a statement inside the transaction, not commitTransaction or "
                       "abortTransaction");
      goto done;
   }
   if (txn == INJECT_TXN_NO) {
      COUNT (outside_txn, 1);
      op_answer_error (c, seq, 20, "IllegalOperation", outside_txn_msg);
      goto done;
   }
   ann = bson_malloc (sizeof *ann);
   bson_destroy (&fwd);
   if (annotate_parse (&msg->body, ann, &fwd, &aerr) != ANNOTATE_FOUND) {
      COUNT (bad_annotations, 1);
      log_conn (LOG_LEVEL_DEBUG, client_id (c), client_peer (c), "refused an annotation: %s", aerr.message);
      op_answer_error (c, seq, 2, "BadValue", aerr.message);
      goto done;
   }
   cfg = config_acquire ();
   if (!cfg) {
      op_answer_error (c, seq, 1, "InternalError", "relaybus: no configuration loaded");
      goto done;
   }
   op = op_new (c, seq, OP_STATEMENT);
   op->job = inject_job_new (ann, &msg->body, false, cfg, now_ms (), &aerr);
   if (!op->job) {
      op_finish (op);
      op_release_maybe (op);
      op_answer_error (c, seq, 1, "InternalError", aerr.message);
      goto done;
   }
   txn_key_copy (&msg->body, &op->txn_cmd);
   /* The statement itself, annotation removed, kind-1 sections as they came. */
   if (!client_send_internal (c, &fwd, msg->sequences, msg->nsequences, on_statement_reply, op, error)) {
      op_finish (op);
      op_release_maybe (op);
      *reason = STATS_CLOSE_INTERNAL;
      res = VIRTUAL_FAILED;
      goto done;
   }
   op->outstanding++;
done:
   if (ann) {
      annotate_cleanup (ann); /* empty when moved into the job */
      bson_free (ann);
   }
   config_release (cfg);
   bson_destroy (&fwd);
   return res;
}

static virtual_result_t
route_publish (client_conn_t *c, const wire_msg_t *msg, int compressor, stats_close_reason_t *reason, bson_error_t *error)
{
   uint64_t seq;
   annotate_t *ann = NULL;
   bson_error_t aerr;
   bson_iter_t it;
   inject_txn_t txn = inject_txn_of (&msg->body);
   config_t *cfg = NULL;
   virtual_op_t *op;

   if (!hold (c, msg, compressor, &seq, reason, error))
      return VIRTUAL_FAILED;
   if (txn == INJECT_TXN_NO) {
      COUNT (outside_txn, 1);
      op_answer_error (c, seq, 20, "IllegalOperation",
                       "relaybus: relaybusPublish must run inside a transaction (lsid, txnNumber and autocommit: "
                       "false)");
      return VIRTUAL_TAKEN;
   }
   if (!bson_iter_init_find (&it, &msg->body, "events")) {
      COUNT (bad_annotations, 1);
      op_answer_error (c, seq, 2, "BadValue", "relaybus: relaybusPublish needs events: an array of event documents");
      return VIRTUAL_TAKEN;
   }
   ann = bson_malloc (sizeof *ann);
   if (!annotate_parse_events (&it, ann, &aerr)) {
      COUNT (bad_annotations, 1);
      op_answer_error (c, seq, 2, "BadValue", aerr.message);
      goto done;
   }
   cfg = config_acquire ();
   if (!cfg) {
      op_answer_error (c, seq, 1, "InternalError", "relaybus: no configuration loaded");
      goto done;
   }
   op = op_new (c, seq, OP_INJECT);
   op->is_publish = true;
   op->job = inject_job_new (ann, &msg->body, txn == INJECT_TXN_STARTS, cfg, now_ms (), &aerr);
   if (!op->job) {
      op_finish (op);
      op_release_maybe (op);
      op_answer_error (c, seq, 1, "InternalError", aerr.message);
      goto done;
   }
   txn_key_copy (&msg->body, &op->txn_cmd);
   op->running = true;
   round_start (c, op);
   op->running = false;
   op_release_maybe (op);
done:
   annotate_cleanup (ann);
   bson_free (ann);
   config_release (cfg);
   return VIRTUAL_TAKEN;
}

/* Holds the request and sends `body` (with the request's kind-1 sections)
 * in its place; the reply is relayed by on_relay_reply. */
static virtual_result_t
route_relay (client_conn_t *c,
             const wire_msg_t *msg,
             const bson_t *body,
             bool is_commit,
             int compressor,
             stats_close_reason_t *reason,
             bson_error_t *error)
{
   uint64_t seq;
   virtual_op_t *op;

   if (!hold (c, msg, compressor, &seq, reason, error))
      return VIRTUAL_FAILED;
   op = op_new (c, seq, OP_RELAY);
   op->is_commit = is_commit;
   if (is_commit)
      txn_key_copy (&msg->body, &op->txn_cmd);
   if (!client_send_internal (c, body, msg->sequences, msg->nsequences, on_relay_reply, op, error)) {
      op_finish (op);
      op_release_maybe (op);
      *reason = STATS_CLOSE_INTERNAL;
      return VIRTUAL_FAILED;
   }
   op->outstanding++;
   return VIRTUAL_TAKEN;
}

static virtual_result_t
virtual_route (client_conn_t *c,
               const wire_msg_t *msg,
               const char *cmd,
               int compressor,
               stats_close_reason_t *reason,
               bson_error_t *error)
{
   bool more = (msg->flags & WIRE_MSG_MORE_TO_COME) != 0;
   bool virtual_cmd = cmd && strncmp (cmd, "relaybus", 8) == 0;
   bool annotated = !virtual_cmd && annotate_msg_present (msg);

   if (conn_busy (client_id (c))) {
      /* Forwarding this now could let it overtake the outbox writes. */
      *reason = STATS_CLOSE_CLIENT_PROTOCOL;
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 20,
                      "request pipelined behind an annotated statement or a relaybus command still running");
      return VIRTUAL_FAILED;
   }
   if (more && (virtual_cmd || annotated)) {
      /* No reply can carry an error, and forwarding would write without
       * the events: refuse loudly. */
      *reason = STATS_CLOSE_CLIENT_PROTOCOL;
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 21,
                      "%s with moreToCome (an unacknowledged write) cannot be published",
                      virtual_cmd ? cmd : "an annotated statement");
      return VIRTUAL_FAILED;
   }
   if (virtual_cmd) {
      char errmsg[160];
      uint64_t seq;

      if (strcmp (cmd, "relaybusPublish") == 0)
         return route_publish (c, msg, compressor, reason, error);
      if (!hold (c, msg, compressor, &seq, reason, error))
         return VIRTUAL_FAILED;
      bson_snprintf (errmsg, sizeof errmsg, "relaybus: no such command: '%.100s'", cmd);
      op_answer_error (c, seq, 59, "CommandNotFound", errmsg);
      return VIRTUAL_TAKEN;
   }
   if (annotated && cmd && (strcmp (cmd, "getMore") == 0 || strcmp (cmd, "killCursors") == 0)) {
      /* Drivers repeat a cursor's comment on its getMore and killCursors:
       * the annotation published once, at the command that opened the
       * cursor.  Strip the copy so payloads stay out of the server's logs. */
      bson_t fwd;
      virtual_result_t res;

      if (!annotate_strip (&msg->body, &fwd)) {
         bson_destroy (&fwd);
         *reason = STATS_CLOSE_INTERNAL;
         bson_set_error (error, CLIENT_ERROR_DOMAIN, 22, "cannot rebuild a %s without its annotation", cmd);
         return VIRTUAL_FAILED;
      }
      res = route_relay (c, msg, &fwd, false, compressor, reason, error);
      bson_destroy (&fwd);
      return res;
   }
   if (annotated)
      return route_annotated (c, msg, compressor, reason, error);
   if (cmd && strcmp (cmd, "commitTransaction") == 0 && txn_lookup (&msg->body, false))
      return route_relay (c, msg, &msg->body, true, compressor, reason, error);
   if (cmd && strcmp (cmd, "abortTransaction") == 0)
      (void) txn_lookup (&msg->body, true);
   return VIRTUAL_PASS;
}

client_route_t
virtual_request_hook (client_conn_t *c, const wire_msg_t *msg, const char *cmd, int compressor, void *ctx, bson_error_t *error)
{
   stats_close_reason_t reason = STATS_CLOSE_INTERNAL;

   (void) ctx;
   switch (virtual_route (c, msg, cmd, compressor, &reason, error)) {
   case VIRTUAL_PASS:
      return CLIENT_ROUTE_FORWARD;
   case VIRTUAL_TAKEN:
      return CLIENT_ROUTE_HELD;
   case VIRTUAL_FAILED:
   default:
      client_disconnect (c, reason, "%s", error->message);
      return CLIENT_ROUTE_ERROR;
   }
}
