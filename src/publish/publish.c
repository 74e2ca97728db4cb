/*
 * publish/publish.c - the publishing interceptor: what a client command
 * becomes (annotated statements, relaybusPublish and the other relaybus*
 * commands, commits of transactions the proxy injected into, client writes
 * to the outbox).
 *
 * One operation (publish_op_t) per request taken over.  It holds the client
 * request (client_hold_request), sends its own commands on the client's
 * upstream connection (client_send_internal) and answers (client_answer)
 * when its last reply arrived.  The commands of a publish/inject.h round are
 * pipelined, PUBLISH_WINDOW at a time.  Replies come back in order, so the
 * operation counts them instead of tagging them.
 *
 * Ownership: an operation is owned by its outstanding internal requests and
 * by whoever is running it; it is freed when it is finished (or its
 * connection closed) and no request of it is outstanding.  proxy/conn.c calls
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
 *
 * Until then a client that ignores the network error could still commit
 * the business write without its events, from another connection.  So every
 * operation that does not end with the statement and all its outbox writes
 * acknowledged (connection lost after the statement was sent, an outbox
 * write failed or was not understood) poisons its transaction in a
 * process-wide table (publish/txns.h), and a commitTransaction for a poisoned
 * transaction, on any connection of this process, is not forwarded: the
 * proxy aborts the transaction and answers NoSuchTransaction (251) with
 * TransientTransactionError.  Later statements of a poisoned transaction
 * are forwarded as usual: the commit is the only request that could make
 * the business write visible, so refusing it is enough, and checking every
 * transaction statement would put a lookup on the hot path (and change
 * replies the server would give) for no added safety.  After a failed
 * outbox write the entry is dropped again once the proxy's own
 * abortTransaction is confirmed, since the server then refuses any commit
 * itself; what stays are the transactions whose fate the proxy cannot know.
 * The table never evicts a live entry (a client could flush it with
 * throwaway poisonings): each operation that may poison reserves its slot
 * before anything is forwarded, and while none is free new annotated work
 * is refused with a transient error (answer_poison_full).
 *
 * Client commands that write the outbox namespace (publish/guard.h) are
 * refused here with Unauthorized before anything else is decided, unless
 * [outbox] allow_client_writes.  The proxy's own writes are sent with
 * client_send_internal and never pass through this hook.
 */
#include "publish/publish.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>

#include "autoconf.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/fleet.h"
#include "base/log.h"
#include "base/outbox.h"
#include "base/pull.h"
#include "codec/annotate.h"
#include "base/counters.h"
#include "publish/guard.h"
#include "publish/hooks.h"
#include "publish/inject.h"
#include "publish/poison.h"
#include "publish/pull.h"
#include "publish/txns.h"

/* Calls the hook, if one is registered. */
static void publish_wake (void);

/* What the routing of one request decided (the hook maps it to
 * client_route_t). */
typedef enum {
   ROUTE_PASS = 0, /* not ours: forward it */
   ROUTE_TAKEN,    /* consumed: answered now or later */
   ROUTE_FAILED,   /* the connection must close: the route's `reason` and `error` say why */
} route_result_t;

/* --- the wake hook ----------------------------------------------------- */

static _Atomic (publish_wake_fn) wake_hook;

void
publish_set_wake_hook (publish_wake_fn fn)
{
   atomic_store (&wake_hook, fn);
}

static void
publish_wake (void)
{
   publish_wake_fn fn = atomic_load (&wake_hook);

   if (fn)
      fn ();
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
 * request pipelined behind it is noticed.  States move forward only:
 * STATEMENT -> INJECT -> DONE, INJECT -> DONE, RELAY -> DONE. */
typedef struct publish_op {
   uint64_t conn_id;
   uint64_t request_seq; /* client_hold_request's */
   op_state_t state;
   bool is_publish;      /* relaybusPublish: answer {ok: 1, eventIds} */
   bool is_commit;       /* OP_RELAY of a commitTransaction: wake on success */
   bson_t txn_cmd;       /* lsid and txnNumber (txns_key_copy), for publish/txns.h */
   inject_job_t *job;
   bson_t stmt_reply;    /* the statement's reply, relayed after the outbox writes */
   bson_t times;         /* $clusterTime/operationTime of the last reply (relaybusPublish) */
   uint32_t round_n, sent, answered; /* of the current round */
   uint32_t outstanding; /* internal requests sent and not called back */
   bool running;         /* a function of ours is on the stack: do not free */
   bool listed;          /* in ops_by_conn */
   bool reserved;        /* holds a poisoned-table slot (txns_poison_reserve) */
   bool answer;          /* the client waits for an answer (false: moreToCome) */
   struct publish_op *next_in_bucket;
} publish_op_t;

#define OP_BUCKETS 1024
static _Thread_local publish_op_t *ops_by_conn[OP_BUCKETS];

static void
op_list (publish_op_t *op)
{
   publish_op_t **b = &ops_by_conn[op->conn_id % OP_BUCKETS];

   op->next_in_bucket = *b;
   *b = op;
}

static void
op_unlist (publish_op_t *op)
{
   for (publish_op_t **p = &ops_by_conn[op->conn_id % OP_BUCKETS]; *p; p = &(*p)->next_in_bucket) {
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
   for (publish_op_t *op = ops_by_conn[conn_id % OP_BUCKETS]; op; op = op->next_in_bucket) {
      if (op->conn_id == conn_id)
         return true;
   }
   return false;
}

static publish_op_t *
op_new (client_conn_t *c, uint64_t seq, op_state_t state)
{
   /* Its bson_t members want libbson's 128-byte alignment. */
   publish_op_t *op = BSON_ALIGNED_ALLOC0 (publish_op_t);

   *op = (publish_op_t) {
      .conn_id = client_id (c),
      .request_seq = seq,
      .state = state,
      .answer = true,
      .txn_cmd = BSON_INITIALIZER,
      .stmt_reply = BSON_INITIALIZER,
      .times = BSON_INITIALIZER,
      /* A relayed request is forwarded in order like any other: what
       * follows it cannot overtake it, so it does not make the connection
       * busy. */
      .listed = state != OP_RELAY,
   };
   if (op->listed)
      op_list (op);
   return op;
}

/* Marks the operation finished; it is freed once nothing refers to it. */
static void
op_finish (publish_op_t *op)
{
   if (op->state != OP_DONE) {
      op->state = OP_DONE;
      if (op->listed)
         op_unlist (op);
      op->listed = false;
   }
}

static void
op_release_maybe (publish_op_t *op)
{
   if (op->state != OP_DONE || op->outstanding > 0 || op->running)
      return;
   /* A finished operation is off the busy list, or a pipelined request
    * behind a freed one would be refused for ever. */
   RELAYBUS_ASSERT (!op->listed);
   if (op->reserved)
      txns_poison_unreserve ();
   inject_job_destroy (op->job);
   bson_destroy (&op->txn_cmd);
   bson_destroy (&op->stmt_reply);
   bson_destroy (&op->times);
   bson_free (op);
}

/* Answers the operation's request; a failure to answer closes the
 * connection (the client would otherwise wait forever). */
static void answer (client_conn_t *c, uint64_t seq, const bson_t *doc, const char *what);

static void
op_answer (client_conn_t *c, publish_op_t *op, const bson_t *reply)
{
   char what[32];

   /* On a closed connection client_answer finds no request, and the
    * close that follows is none. */
   if (!op->answer)
      return;
   bson_snprintf (what, sizeof what, "a %s", op_state_names[op->state]);
   answer (c, op->request_seq, reply, what);
}

/* Answers request `seq` with {ok: 0, errmsg, code, codeName}. */
static void
op_answer_error (client_conn_t *c, uint64_t seq, inject_code_t code, const char *errmsg)
{
   bson_error_t error;

   if (!client_answer_error (c, seq, (int32_t) code, server_code_name (code), errmsg, &error))
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "answering an error: %s", error.message);
}

static void
keep_times (publish_op_t *op, const bson_t *reply)
{
   bson_reinit (&op->times);
   inject_copy_times (reply, &op->times);
}

/* Poisons the operation's transaction (txns_poison, with the operation's
 * reservation) and counts a new entry. */
#define op_poison(c, op, level, ...)                                                                 \
   do {                                                                                              \
      if (txns_poison (&(op)->txn_cmd, &(op)->reserved, client_id (c), client_peer (c), (level), __VA_ARGS__)) \
         counters_add (COUNTER_POISONED, 1);                                                         \
   } while (0)

static void on_op_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx);
static void round_start (client_conn_t *c, publish_op_t *op);

/* The reply to the abortTransaction sent after a failed outbox write (`ctx`:
 * the transaction's poison_key_t, or NULL).  Once the server confirmed the
 * abort it refuses any commit itself, and the poisoned entry goes. */
static void
on_abort_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   poison_key_t *key = ctx;

   if (reply && key) {
      const char *errmsg;
      int32_t code = inject_reply_error (&reply->body, &errmsg);

      if (txns_abort_confirmed (&reply->body)) {
         if (txns_poison_forget (key))
            log_conn (LOG_LEVEL_DEBUG, client_id (c), client_peer (c),
                      "transaction %" PRId64 " aborted after its failed outbox write: no longer poisoned", key->txn_number);
      } else {
         log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c),
                   "abortTransaction after a failed outbox write failed (%d): %s; transaction %" PRId64 " stays poisoned",
                   code, errmsg, key->txn_number);
      }
   } else if (!reply && key) {
      log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c),
                "no reply to abortTransaction after a failed outbox write (%s); transaction %" PRId64 " stays poisoned",
                error ? error->message : "?", key->txn_number);
   }
   bson_free (key);
}

/* Sends what the window allows of the current round.  On a send failure
 * the connection closes (outstanding callbacks then fire with errors). */
static void
round_send (client_conn_t *c, publish_op_t *op)
{
   bson_error_t error;

   RELAYBUS_ASSERT (op->state == OP_INJECT && op->answered <= op->sent && op->sent <= op->round_n);
   while (op->sent < op->round_n && op->sent - op->answered < PUBLISH_WINDOW) {
      const bson_t *cmd = inject_job_command (op->job, op->sent);

      if (!client_send_internal (c, cmd, NULL, 0, on_op_reply, op, &error)) {
         counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_CONNECTION_LOST, 1);
         op_poison (c, op, LOG_LEVEL_WARN, "an outbox write could not be sent on c%" PRIu64 ": %s", client_id (c),
                     error.message);
         op_finish (op);
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "sending an outbox write: %s", error.message);
         return;
      }
      op->sent++;
      op->outstanding++;
   }
}

/* All rounds succeeded: the client gets its statement's reply, or
 * relaybusPublish's. */
static void
op_succeeded (client_conn_t *c, publish_op_t *op)
{
   counters_add (COUNTER_EVENTS_PUBLISHED, inject_job_n_events (op->job));
   counters_add (COUNTER_DELIVERIES_WRITTEN, inject_job_deliveries (op->job));
   txns_remember (&op->txn_cmd);
   log_conn (LOG_LEVEL_DEBUG, client_id (c), client_peer (c), "published %u event(s), %u deliveries, in %u round trip(s)",
             inject_job_n_events (op->job), inject_job_deliveries (op->job), inject_job_rounds (op->job));
   if (op->is_publish) {
      bson_t reply = BSON_INITIALIZER;

      BSON_APPEND_DOUBLE (&reply, "ok", 1.0);
      if (!inject_job_append_ids (op->job, &reply, "eventIds")) {
         bson_destroy (&reply);
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "relaybusPublish reply too large");
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

/* An outbox write failed in the `phase` round: poison the transaction,
 * abort it on the same connection, then tell the client (the abort runs
 * before anything the client sends next on this connection, as the
 * connection serialises requests; the poisoning covers the others). */
static void
op_failed (client_conn_t *c, publish_op_t *op, const bson_t *client_reply, inject_phase_t phase)
{
   bson_t abort;
   bson_error_t error;
   const char *desc;
   poison_key_t *key = bson_malloc (sizeof *key);

   counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_OUTBOX_WRITE, 1);
   (void) inject_reply_error (client_reply, &desc);
   log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c),
             "outbox write failed in the %s round; aborting the transaction: %s", inject_phase_name (phase), desc);
   /* Poisoned before the client hears of the failure: until the abort is
    * confirmed, a commit from another connection could still win. */
   op_poison (c, op, LOG_LEVEL_INFO, "an outbox write failed in the %s round on c%" PRIu64 ": %.120s",
               inject_phase_name (phase), client_id (c), desc[0] ? desc : "?");
   if (!poison_key_of (&op->txn_cmd, key)) {
      bson_free (key);
      key = NULL;
   }
   inject_job_abort_command (op->job, &abort);
   if (!client_send_internal (c, &abort, NULL, 0, on_abort_reply, key, &error)) {
      /* Without the abort the transaction could still commit: close. */
      bson_free (key);
      bson_destroy (&abort);
      op_finish (op);
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "cannot abort after a failed outbox write: %s", error.message);
      return;
   }
   bson_destroy (&abort);
   op_answer (c, op, client_reply);
   op_finish (op);
}

static void
round_start (client_conn_t *c, publish_op_t *op)
{
   /* Planning the next round moves the phase on (to "done" after a
    * failure): name the round that failed. */
   inject_phase_t last = inject_job_phase (op->job);

   op->round_n = inject_job_next_round (op->job);
   op->sent = op->answered = 0;
   if (op->round_n == 0) {
      const bson_t *fail;

      if (inject_job_failed (op->job, &fail))
         op_failed (c, op, fail, last);
      else
         op_succeeded (c, op);
      return;
   }
   round_send (c, op);
}

/* A reply to one of the round's commands, or NULL (`error`) when the
 * connection closed. */
static void
inject_reply (client_conn_t *c, publish_op_t *op, const wire_msg_t *reply, const bson_error_t *error)
{
   if (!reply) {
      counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_CONNECTION_LOST, 1);
      log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c), "connection lost in the middle of an outbox write: %s",
                error ? error->message : "?");
      op_poison (c, op, LOG_LEVEL_WARN, "the connection was lost during the outbox writes (%s round) on c%" PRIu64,
                 inject_phase_name (inject_job_phase (op->job)), client_id (c));
      op_finish (op);
      return;
   }
   /* Replies come in the order the commands were sent. */
   RELAYBUS_ASSERT (op->answered < op->sent);
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
}

/* The annotated statement's own reply, or NULL when the connection closed. */
static void
statement_reply (client_conn_t *c, publish_op_t *op, const wire_msg_t *reply)
{
   if (!reply) {
      /* The statement may have run: its reply, and the outbox writes, are
       * what never came. */
      counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_CONNECTION_LOST, 1);
      op_poison (c, op, LOG_LEVEL_WARN,
                 "the connection was lost before the annotated statement's reply on c%" PRIu64, client_id (c));
      op_finish (op);
      return;
   }
   if (inject_reply_failed (&reply->body)) {
      /* The server refused the statement and aborted the transaction:
       * nothing to write, relay as is. */
      op_answer (c, op, &reply->body);
      op_finish (op);
      return;
   }
   bson_destroy (&op->stmt_reply);
   bson_copy_to (&reply->body, &op->stmt_reply);
   op->state = OP_INJECT;
   round_start (c, op);
}

/* A request relayed through the proxy: a commit of a transaction injected
 * into (wake the dispatcher when it succeeded), or a getMore/killCursors
 * whose annotation copy was stripped. */
static void
relay_reply (client_conn_t *c, publish_op_t *op, const wire_msg_t *reply)
{
   if (op->is_commit)
      pull_txn_outcome (&op->txn_cmd, reply ? &reply->body : NULL);
   if (reply) {
      op_answer (c, op, &reply->body);
      if (op->is_commit && !inject_reply_failed (&reply->body)) {
         (void) txns_injected (&op->txn_cmd, true);
         publish_wake ();
      }
   }
   op_finish (op);
}

/* Every internal request of an operation is called back here, with its
 * reply or with NULL (`error`) when the connection closed, and handled by
 * the operation's state: the statement's reply, a round's, or a relayed
 * one.  A late reply of a finished operation only releases it. */
static void
on_op_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   publish_op_t *op = ctx;

   RELAYBUS_ASSERT (op->outstanding > 0);
   op->outstanding--;
   op->running = true;
   switch (op->state) {
   case OP_STATEMENT:
      statement_reply (c, op, reply);
      break;
   case OP_INJECT:
      inject_reply (c, op, reply, error);
      break;
   case OP_RELAY:
      relay_reply (c, op, reply);
      break;
   case OP_DONE:
   default:
      break;
   }
   op->running = false;
   op_release_maybe (op);
}

/* --- answers --------------------------------------------------------------- */

/* Answers request `seq` with `doc`; a failure to answer closes the
 * connection (the client would otherwise wait forever).  `what` names the
 * request for that line. */
static void
answer (client_conn_t *c, uint64_t seq, const bson_t *doc, const char *what)
{
   bson_error_t error;

   if (!client_answer (c, seq, doc, &error))
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "answering %s: %s", what, error.message);
}

/* Answers request `seq` with an error that TransientTransactionError
 * labels, so withTransaction runs the transaction again; `times_of` (may
 * be NULL) lends its cluster time. */
static void
answer_transient (client_conn_t *c,
                  uint64_t seq,
                  inject_code_t code,
                  const char *errmsg,
                  const bson_t *times_of,
                  const char *what)
{
   bson_t doc = BSON_INITIALIZER;

   inject_error_reply (&doc, (int32_t) code, server_code_name (code), errmsg, true);
   if (times_of)
      inject_copy_times (times_of, &doc);
   answer (c, seq, &doc, what);
   bson_destroy (&doc);
}

/* Once every 10 s per caller's `last_ms` (per loop thread): a client that
 * repeats a refused request on purpose must not flood the log as well. */
static bool
warn_due (int64_t *last_ms)
{
   int64_t now = clock_mono_ms ();

   if (*last_ms >= 0 && now - *last_ms < 10000)
      return false;
   *last_ms = now;
   return true;
}

/* --- routing ------------------------------------------------------------- */

/* One client request being routed: what the hook was given, and why the
 * connection must close when routing answers ROUTE_FAILED (`reason`, and
 * `error`, the hook's). */
typedef struct {
   client_conn_t *c;
   const wire_msg_t *msg;
   const char *cmd;
   int compressor;
   bool more; /* sent with moreToCome: no reply can carry an error */
   counters_close_reason_t reason;
   bson_error_t *error;
} route_t;

/* Fails the route: the connection closes for `reason` with the message. */
static route_result_t route_fail (route_t *r, counters_close_reason_t reason, publish_error_t code, const char *fmt, ...)
   __attribute__ ((format (printf, 4, 5)));

static route_result_t
route_fail (route_t *r, counters_close_reason_t reason, publish_error_t code, const char *fmt, ...)
{
   va_list ap;

   r->reason = reason;
   r->error->domain = PUBLISH_ERROR_DOMAIN;
   r->error->code = (uint32_t) code;
   va_start (ap, fmt);
   bson_vsnprintf (r->error->message, sizeof r->error->message, fmt, ap);
   va_end (ap);
   return ROUTE_FAILED;
}

/* Holds the request; false (and a reason) when it cannot be held. */
static bool
hold (route_t *r, uint64_t *seq)
{
   if (client_hold_request (r->c, r->msg->header.request_id, WIRE_OP_MSG, r->compressor, seq, r->error))
      return true;
   r->reason = COUNTERS_CLOSE_INTERNAL;
   return false;
}

/* A refused commit, waiting for the reply to the abortTransaction sent in
 * its place.  Owned by that request's callback. */
typedef struct {
   uint64_t seq;
   bool answer; /* false: the commit came with moreToCome, nobody waits */
   int64_t txn_number;
   char errmsg[POISON_REASON_MAX + 128];
} refusal_t;

/* Answers the refused commit: NoSuchTransaction with
 * TransientTransactionError, so withTransaction runs the transaction again
 * and manual code sees a clear, retryable error.  The abort's reply (may be
 * NULL) lends its cluster time. */
static void
refusal_answer (client_conn_t *c, refusal_t *r, const bson_t *abort_reply)
{
   if (!r->answer)
      return;
   answer_transient (c, r->seq, INJECT_CODE_NO_SUCH_TRANSACTION, r->errmsg, abort_reply, "a refused commit");
}

static void
on_refusal_abort_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   refusal_t *r = ctx;

   (void) error;
   if (reply) {
      const char *errmsg;
      int32_t code = inject_reply_error (&reply->body, &errmsg);

      if (txns_abort_confirmed (&reply->body))
         log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c), "poisoned transaction %" PRId64 " is aborted%s",
                   r->txn_number, code == INJECT_CODE_NO_SUCH_TRANSACTION ? " (it already was)" : "");
      else
         log_conn (LOG_LEVEL_WARN, client_id (c), client_peer (c),
                   "abortTransaction of poisoned transaction %" PRId64 " failed (%d): %s; its commit stays refused here",
                   r->txn_number, code, errmsg);
      refusal_answer (c, r, &reply->body);
   }
   bson_free (r);
}

/* A commitTransaction for a poisoned transaction: not forwarded.  The
 * transaction is aborted on this connection's upstream (same user, so this
 * works with authentication too; its outcome is only logged) and the client
 * answered when the abort's reply is in. */
static route_result_t
route_refuse_commit (route_t *r, const poison_entry_t *pe)
{
   client_conn_t *c = r->c;
   refusal_t *rf = bson_malloc0 (sizeof *rf);
   bson_t abort;
   bson_error_t serr;
   char hex[TXNS_LSID_HEX_MAX];

   rf->answer = !r->more;
   if (rf->answer && !hold (r, &rf->seq)) {
      bson_free (rf);
      return ROUTE_FAILED;
   }
   counters_add (COUNTER_POISON_REFUSED, 1);
   rf->txn_number = pe->key.txn_number;
   txns_lsid_hex (&pe->key, hex);
   log_conn (LOG_LEVEL_WARN, client_id (c), client_peer (c),
             "refused commitTransaction of poisoned transaction %" PRId64 " (session %s, poisoned on c%" PRIu64
             " %.1f s ago: %s); aborting it",
             pe->key.txn_number, hex, pe->conn_id, (double) (clock_mono_ms () - pe->recorded_ms) / 1000.0, pe->reason);
   bson_snprintf (rf->errmsg, sizeof rf->errmsg,
                  "relaybus: transaction %" PRId64 " was aborted because the proxy could not write its events (%s)",
                  pe->key.txn_number, pe->reason);
   inject_abort_command (&r->msg->body, &abort);
   if (!client_send_internal (c, &abort, NULL, 0, on_refusal_abort_reply, rf, &serr)) {
      /* The server aborts it when its lifetime runs out; refuse anyway. */
      log_conn (LOG_LEVEL_WARN, client_id (c), client_peer (c),
                "cannot send abortTransaction for poisoned transaction %" PRId64 ": %s", pe->key.txn_number, serr.message);
      refusal_answer (c, rf, NULL);
      bson_free (rf);
   }
   bson_destroy (&abort);
   return ROUTE_TAKEN;
}

static const char *const outside_txn_msg =
   "relaybus: annotated writes must run inside a transaction (lsid, txnNumber and autocommit: false): start one "
   "with session.withTransaction() or session.startTransaction() and pass the session to the write";

/* Answers request seq with the transient refusal of a full poisoned table:
 * the transaction may be retried as a whole once entries expire. */
static void
answer_poison_full (client_conn_t *c, uint64_t seq, uint32_t capacity)
{
   static _Thread_local int64_t last_warn_ms = -1;
   char errmsg[320];

   counters_add (COUNTER_POISON_FULL_REFUSED, 1);
   if (warn_due (&last_warn_ms))
      log_conn (LOG_LEVEL_WARN, client_id (c), client_peer (c),
                "refused an annotated write: %" PRIu32 " poisoned transactions are remembered "
                "(max_poisoned_transactions); refusing publishes until some expire",
                capacity);
   bson_snprintf (errmsg, sizeof errmsg,
                  "relaybus: too many poisoned transactions are remembered (max_poisoned_transactions = %" PRIu32
                  "); annotated writes are refused until some expire: retry the transaction later",
                  capacity);
   answer_transient (c, seq, PUBLISH_POISON_FULL_CODE, errmsg, NULL, "a refused publish");
}

/* Events no handler of the local config or of the fleet's live set
 * subscribes to: each is counted by type; with [outbox] unrouted = warn one
 * line names a type (at most one line every 10 s per loop thread), with
 * refuse the request is answered with an error before anything of it
 * runs, so its transaction writes neither the statement nor its events.
 * Returns false when the request was refused. */
static bool
check_routed (client_conn_t *c, uint64_t seq, const annotate_t *ann, const config_t *cfg, const fleet_set_t *fs)
{
   static _Thread_local int64_t last_warn_ms = -1;
   const char *first = NULL;
   uint32_t n = 0;

   for (uint32_t i = 0; i < ann->n_events; i++) {
      if (fleet_type_routed (cfg, fs, ann->events[i].type))
         continue;
      counters_unrouted (ann->events[i].type);
      if (!first)
         first = ann->events[i].type;
      n++;
   }
   if (!first)
      return true;
   if (cfg->unrouted_mode == CONFIG_UNROUTED_REFUSE) {
      char errmsg[512];

      bson_snprintf (errmsg,
                     sizeof errmsg,
                     "relaybus: no handler subscribes to event type \"%.200s\"%s ([outbox] unrouted = refuse): "
                     "check the type's spelling, or add a handler whose events match it",
                     first,
                     n > 1 ? " (and others)" : "");
      log_conn (LOG_LEVEL_DEBUG, client_id (c), client_peer (c), "refused unrouted event type \"%.200s\"", first);
      op_answer_error (c, seq, PUBLISH_UNROUTED_CODE, errmsg);
      return false;
   }
   if (cfg->unrouted_mode == CONFIG_UNROUTED_WARN && warn_due (&last_warn_ms))
      log_conn (LOG_LEVEL_WARN,
                client_id (c),
                client_peer (c),
                "no handler subscribes to event type \"%.200s\": the event is stored without deliveries "
                "(relaybus_events_unrouted_total; at most one such line every 10 s)",
                first);
   return true;
}

/* relaybusStatus: how an application checks that it talks to the proxy
 * (MongoDB answers CommandNotFound).  The proxy does not know whether the
 * connection has authenticated, so the answer names nothing an
 * unauthenticated client should learn: handler names, instances and
 * settings are on the admin port.  Allowed inside and outside
 * transactions; reads only snapshots. */
static void
answer_status (client_conn_t *c, uint64_t seq)
{
   config_t *cfg = config_acquire ();
   fleet_set_t *fs = fleet_acquire ();
   bson_t doc = BSON_INITIALIZER;
   size_t live = 0;

   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   BSON_APPEND_UTF8 (&doc, "proxy", "relaybus-proxy");
   BSON_APPEND_UTF8 (&doc, "version", PACKAGE_VERSION);
   BSON_APPEND_INT32 (&doc, "handlers", cfg ? (int32_t) cfg->n_handlers : 0);
   BSON_APPEND_INT32 (&doc, "fleetHandlers", fs ? (int32_t) fs->n_set : 0);
   for (size_t i = 0; fs && i < fs->n_instances; i++)
      live += fs->instances[i].live;
   BSON_APPEND_INT32 (&doc, "fleetInstances", (int32_t) live);
   BSON_APPEND_UTF8 (&doc, "unrouted", cfg ? cfg->unrouted : "accept");
   answer (c, seq, &doc, "relaybusStatus");
   bson_destroy (&doc);
   fleet_release (fs);
   config_release (cfg);
}

/* Makes the operation for request seq with the job that writes ann's
 * events (the job takes ann's contents and holds the current configuration).
 * The operation holds a slot of the poisoned table, reserved here, so that
 * it can poison its transaction without evicting anyone.  NULL: the client
 * has had an error (no configuration loaded, the job could not be built, or
 * the poisoned table has no free slot). */
static publish_op_t *
op_new_job (client_conn_t *c, uint64_t seq, op_state_t state, annotate_t *ann, const bson_t *body, bool opens_txn)
{
   config_t *cfg = config_acquire ();
   fleet_set_t *fs;
   publish_op_t *op;
   uint32_t capacity;
   bson_error_t error;

   if (!cfg) {
      op_answer_error (c, seq, INJECT_CODE_INTERNAL_ERROR, "relaybus: no configuration loaded");
      return NULL;
   }
   fs = fleet_acquire ();
   if (!fs) {
      /* Without the fleet's handler set the events would get deliveries
       * for this proxy's handlers only, and the others' would be lost: the
       * dispatcher has not read it yet (start-up with the upstream away). */
      config_release (cfg);
      answer_transient (c, seq, PUBLISH_NO_FLEET_CODE,
                        "relaybus: the fleet's handler set has not been read from the outbox yet; retry the transaction",
                        NULL, "a publish before the fleet's handler set");
      return NULL;
   }
   if (!check_routed (c, seq, ann, cfg, fs)) {
      fleet_release (fs);
      config_release (cfg);
      return NULL;
   }
   if (!txns_poison_reserve (cfg, &capacity)) {
      fleet_release (fs);
      config_release (cfg);
      answer_poison_full (c, seq, capacity);
      return NULL;
   }
   op = op_new (c, seq, state);
   op->reserved = true;
   op->job = inject_job_new (ann, body, opens_txn, cfg, clock_now_ms (), &error);
   config_release (cfg);
   if (op->job)
      inject_job_set_fleet (op->job, fs);
   fleet_release (fs);
   if (!op->job) {
      op_finish (op);
      op_release_maybe (op);
      op_answer_error (c, seq, INJECT_CODE_INTERNAL_ERROR, error.message);
      return NULL;
   }
   txns_key_copy (body, &op->txn_cmd);
   return op;
}

static route_result_t
route_annotated (route_t *r)
{
   client_conn_t *c = r->c;
   const wire_msg_t *msg = r->msg;
   uint64_t seq;
   annotate_t *ann = NULL;
   bson_t fwd;
   bson_error_t aerr;
   inject_txn_t txn = inject_txn_of (&msg->body);
   publish_op_t *op;
   route_result_t res = ROUTE_TAKEN;

   counters_add (COUNTER_ANNOTATED, 1);
   bson_init (&fwd);
   if (!hold (r, &seq)) {
      res = ROUTE_FAILED;
      goto done;
   }
   if (r->cmd && (strcmp (r->cmd, "commitTransaction") == 0 || strcmp (r->cmd, "abortTransaction") == 0)) {
      counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_BAD_ANNOTATION, 1);
      op_answer_error (c, seq, INJECT_CODE_BAD_VALUE,
                       "relaybus: annotate a statement inside the transaction, not commitTransaction or "
                       "abortTransaction");
      goto done;
   }
   if (txn == INJECT_TXN_NO) {
      counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_OUTSIDE_TRANSACTION, 1);
      op_answer_error (c, seq, INJECT_CODE_INVALID_OPTIONS, outside_txn_msg);
      goto done;
   }
   ann = bson_malloc (sizeof *ann);
   bson_destroy (&fwd);
   if (annotate_parse (&msg->body, ann, &fwd, &aerr) != ANNOTATE_FOUND) {
      counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_BAD_ANNOTATION, 1);
      log_conn (LOG_LEVEL_DEBUG, client_id (c), client_peer (c), "refused an annotation: %s", aerr.message);
      op_answer_error (c, seq, INJECT_CODE_BAD_VALUE, aerr.message);
      goto done;
   }
   op = op_new_job (c, seq, OP_STATEMENT, ann, &msg->body, false);
   if (!op)
      goto done;
   /* The statement itself, annotation removed, kind-1 sections as they came. */
   if (!client_send_internal (c, &fwd, msg->sequences, msg->nsequences, on_op_reply, op, r->error)) {
      op_finish (op);
      op_release_maybe (op);
      r->reason = COUNTERS_CLOSE_INTERNAL;
      res = ROUTE_FAILED;
      goto done;
   }
   op->outstanding++;
done:
   if (ann) {
      annotate_cleanup (ann); /* empty when moved into the job */
      bson_free (ann);
   }
   bson_destroy (&fwd);
   return res;
}

static route_result_t
route_publish (route_t *r)
{
   client_conn_t *c = r->c;
   uint64_t seq;
   annotate_t *ann = NULL;
   bson_error_t aerr;
   bson_iter_t it;
   inject_txn_t txn = inject_txn_of (&r->msg->body);
   publish_op_t *op;

   if (!hold (r, &seq))
      return ROUTE_FAILED;
   if (txn == INJECT_TXN_NO) {
      counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_OUTSIDE_TRANSACTION, 1);
      op_answer_error (c, seq, INJECT_CODE_INVALID_OPTIONS,
                       "relaybus: relaybusPublish must run inside a transaction (lsid, txnNumber and autocommit: "
                       "false)");
      return ROUTE_TAKEN;
   }
   if (!bson_iter_init_find (&it, &r->msg->body, "events")) {
      counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_BAD_ANNOTATION, 1);
      op_answer_error (c, seq, INJECT_CODE_BAD_VALUE, "relaybus: relaybusPublish needs events: an array of event documents");
      return ROUTE_TAKEN;
   }
   ann = bson_malloc (sizeof *ann);
   if (!annotate_parse_events (&it, ann, &aerr)) {
      counters_add_at (COUNTER_PUBLISH_ERRORS, COUNTERS_PUBLISH_BAD_ANNOTATION, 1);
      op_answer_error (c, seq, INJECT_CODE_BAD_VALUE, aerr.message);
      goto done;
   }
   op = op_new_job (c, seq, OP_INJECT, ann, &r->msg->body, txn == INJECT_TXN_STARTS);
   if (!op)
      goto done;
   op->is_publish = true;
   op->running = true;
   round_start (c, op);
   op->running = false;
   op_release_maybe (op);
done:
   annotate_cleanup (ann);
   bson_free (ann);
   return ROUTE_TAKEN;
}

/* Holds the request and sends `body` (with the request's kind-1 sections)
 * in its place; the reply is relayed by relay_reply.  A request sent
 * with moreToCome is not held and its reply is swallowed: the proxy still
 * sends it acknowledged, to learn the outcome (a commit to wake on), but
 * the client asked for no answer and must get none. */
static route_result_t
route_relay (route_t *r, const bson_t *body, bool is_commit)
{
   uint64_t seq = 0;
   publish_op_t *op;

   if (!r->more && !hold (r, &seq))
      return ROUTE_FAILED;
   op = op_new (r->c, seq, OP_RELAY);
   op->answer = !r->more;
   op->is_commit = is_commit;
   if (is_commit)
      txns_key_copy (&r->msg->body, &op->txn_cmd);
   if (!client_send_internal (r->c, body, r->msg->sequences, r->msg->nsequences, on_op_reply, op, r->error)) {
      op_finish (op);
      op_release_maybe (op);
      r->reason = COUNTERS_CLOSE_INTERNAL;
      return ROUTE_FAILED;
   }
   op->outstanding++;
   return ROUTE_TAKEN;
}

/* Drivers repeat a cursor's comment on its getMore and killCursors: the
 * annotation published once, at the command that opened the cursor.  The
 * copy is stripped so payloads stay out of the server's logs. */
static route_result_t
route_strip (route_t *r)
{
   bson_t fwd;
   route_result_t res;

   if (!annotate_strip (&r->msg->body, &fwd)) {
      bson_destroy (&fwd);
      return route_fail (r, COUNTERS_CLOSE_INTERNAL, PUBLISH_ERROR_STRIP, "cannot rebuild a %s without its annotation",
                         r->cmd);
   }
   res = route_relay (r, &fwd, false);
   bson_destroy (&fwd);
   return res;
}

/* The outbox namespace of this process: [outbox] database and
 * collection_prefix cannot change by reload, so any snapshot's values hold
 * for good.  Copied once per loop thread. */
static _Thread_local struct {
   bool loaded;
   bool pooled; /* [proxy] pool_mode = pooled, which a reload cannot change either */
   char database[OUTBOX_NAME_MAX];
   char prefix[OUTBOX_NAME_MAX];
} guard_ns;

/* Does client command `msg` write the outbox (and are such writes
 * refused)?  True with the description in `why`.  Reads no configuration
 * but on the first call of a thread and for a command that does write the
 * outbox, which no well-behaved client sends. */
/* The copy, made on a thread's first request (cold: out of guard_ns_get's
 * line, whose every call would otherwise pay this path's registers);
 * false when no configuration is published yet. */
static bool __attribute__ ((cold, noinline))
guard_ns_load (void)
{
   config_t *cfg = config_acquire ();

   if (!cfg)
      return false;
   bson_strncpy (guard_ns.database, cfg->outbox_database, sizeof guard_ns.database);
   bson_strncpy (guard_ns.prefix, cfg->collection_prefix, sizeof guard_ns.prefix);
   guard_ns.pooled = cfg->pool_mode_id == CONFIG_POOL_POOLED;
   guard_ns.loaded = true;
   config_release (cfg);
   return true;
}

/* This thread's copy of the outbox namespace; false when no configuration
 * is published yet.  Asked twice per request. */
static inline bool
guard_ns_get (outbox_guard_ns_t *ns)
{
   if (!guard_ns.loaded && !guard_ns_load ())
      return false;
   ns->database = guard_ns.database;
   ns->prefix = guard_ns.prefix;
   return true;
}

static bool
outbox_write_refused (const wire_msg_t *msg, char *why, size_t why_len)
{
   outbox_guard_ns_t ns;
   config_t *cfg;
   bool allowed;

   if (!guard_ns_get (&ns))
      return false;
   if (!outbox_guard_writes (&msg->body, msg->sequences, msg->nsequences, &ns, why, why_len))
      return false;
   cfg = config_acquire ();
   allowed = cfg && cfg->allow_client_writes;
   config_release (cfg);
   return !allowed;
}

/* Refuses a client command that writes the outbox: Unauthorized, nothing
 * forwarded.  With moreToCome no reply can carry the error, and dropping
 * the write silently would hide it: the connection is closed. */
static route_result_t
route_refuse_outbox_write (route_t *r, const char *why)
{
   char errmsg[OUTBOX_GUARD_WHY_MAX + 160];
   uint64_t seq;

   counters_add (COUNTER_OUTBOX_WRITES_REFUSED, 1);
   if (r->more)
      return route_fail (r, COUNTERS_CLOSE_CLIENT_PROTOCOL, PUBLISH_ERROR_UNACKNOWLEDGED_OUTBOX_WRITE,
                         "refused an unacknowledged %s: only the proxy writes the outbox collections", why);
   if (!hold (r, &seq))
      return ROUTE_FAILED;
   log_conn (LOG_LEVEL_INFO, client_id (r->c), client_peer (r->c), "refused a client write to the outbox: %s", why);
   bson_snprintf (errmsg, sizeof errmsg,
                  "relaybus: %s is refused: only the proxy writes the outbox collections "
                  "([outbox] allow_client_writes = false)",
                  why);
   op_answer_error (r->c, seq, INJECT_CODE_UNAUTHORIZED, errmsg);
   return ROUTE_TAKEN;
}

/* Does client command `msg` of c read the outbox while its user may not?
 * Pooled mode only: there every client shares the pool's upstream user,
 * so the proxy is the one that can tell its users apart; in session mode
 * the client's own user is the server's to authorize.  The configuration
 * is read only for a command that does read the outbox. */
static bool
outbox_read_refused (client_conn_t *c, const wire_msg_t *msg, char *why, size_t why_len, char *who, size_t who_len)
{
   outbox_guard_ns_t ns;
   config_t *cfg;
   const char *user, *db;
   bool refused;

   if (!guard_ns_get (&ns) || !guard_ns.pooled || !outbox_guard_reads (&msg->body, &ns, why, why_len))
      return false;
   cfg = config_acquire ();
   if (!cfg)
      return false;
   user = client_user (c, &db);
   refused = !pull_outbox_reader (cfg, user, db);
   bson_strncpy (who, user ? user : "(not logged in)", who_len);
   config_release (cfg);
   return refused;
}

/* Refuses a read of the outbox by a pooled user who is neither among
 * [outbox] readers nor a pull handler's consumers: Unauthorized, nothing
 * forwarded (moreToCome: the connection is closed). */
static route_result_t
route_refuse_outbox_read (route_t *r, const char *why, const char *who)
{
   char errmsg[OUTBOX_GUARD_WHY_MAX + 320];
   uint64_t seq;

   if (r->more)
      return route_fail (r, COUNTERS_CLOSE_CLIENT_PROTOCOL, PUBLISH_ERROR_UNACKNOWLEDGED_OUTBOX_WRITE,
                         "refused an unacknowledged %s: user %.64s may not read the outbox collections", why, who);
   if (!hold (r, &seq))
      return ROUTE_FAILED;
   log_conn (LOG_LEVEL_INFO, client_id (r->c), client_peer (r->c), "refused a read of the outbox by user %s: %s", who, why);
   bson_snprintf (errmsg, sizeof errmsg,
                  "relaybus: %s is refused: user %.64s is neither among [outbox] readers nor in a pull handler's "
                  "consumers, who alone may read the outbox collections",
                  why, who);
   op_answer_error (r->c, seq, INJECT_CODE_UNAUTHORIZED, errmsg);
   return ROUTE_TAKEN;
}

/* A relaybus* command (never forwarded): relaybusPublish, relaybusStatus,
 * the pull commands, or CommandNotFound. */
static route_result_t
route_command (route_t *r)
{
   char errmsg[160];
   uint64_t seq;

   if (strcmp (r->cmd, "relaybusPublish") == 0)
      return route_publish (r);
   /* The pull consumers' commands (relaybusStatus with a handler's name
    * among them): publish/pull.c. */
   if (pull_is_command (r->cmd, &r->msg->body)) {
      if (pull_route (r->c, r->msg, r->cmd, r->compressor, r->error))
         return ROUTE_TAKEN;
      r->reason = COUNTERS_CLOSE_INTERNAL;
      return ROUTE_FAILED;
   }
   if (!hold (r, &seq))
      return ROUTE_FAILED;
   if (strcmp (r->cmd, "relaybusStatus") == 0) {
      answer_status (r->c, seq);
      return ROUTE_TAKEN;
   }
   bson_snprintf (errmsg, sizeof errmsg, "relaybus: no such command: '%.100s'", r->cmd);
   op_answer_error (r->c, seq, INJECT_CODE_COMMAND_NOT_FOUND, errmsg);
   return ROUTE_TAKEN;
}

static route_result_t
publish_route (route_t *r)
{
   const char *cmd = r->cmd;
   bool relaybus_cmd = cmd && strncmp (cmd, "relaybus", 8) == 0;
   bool annotated = !relaybus_cmd && annotate_msg_present (r->msg);
   char why[OUTBOX_GUARD_WHY_MAX];

   if (conn_busy (client_id (r->c)) || pull_conn_busy (client_id (r->c)))
      /* Forwarding this now could let it overtake the outbox writes. */
      return route_fail (r, COUNTERS_CLOSE_CLIENT_PROTOCOL, PUBLISH_ERROR_PIPELINED,
                         "request pipelined behind an annotated statement or a relaybus command still running");
   /* Before anything else: an annotated write into the outbox is refused
    * as well.  The proxy's own writes never pass through here. */
   if (!relaybus_cmd && outbox_write_refused (r->msg, why, sizeof why))
      return route_refuse_outbox_write (r, why);
   /* And a read of it by a pooled user the configuration does not name. */
   {
      char who[80];
      if (!relaybus_cmd && outbox_read_refused (r->c, r->msg, why, sizeof why, who, sizeof who))
         return route_refuse_outbox_read (r, why, who);
   }
   if (r->more && (relaybus_cmd || annotated))
      /* No reply can carry an error, and forwarding would write without
       * the events: refuse loudly. */
      return route_fail (r, COUNTERS_CLOSE_CLIENT_PROTOCOL, PUBLISH_ERROR_UNACKNOWLEDGED,
                         "%s with moreToCome (an unacknowledged write) cannot be published",
                         relaybus_cmd ? cmd : "an annotated statement");
   if (relaybus_cmd)
      return route_command (r);
   if (annotated && cmd && (strcmp (cmd, "getMore") == 0 || strcmp (cmd, "killCursors") == 0))
      return route_strip (r);
   if (annotated)
      return route_annotated (r);
   /* The first letter rules out most commands before any comparison. */
   if (cmd && cmd[0] == 'c' && strcmp (cmd, "commitTransaction") == 0) {
      poison_entry_t pe;

      if (txns_poisoned (&r->msg->body, &pe))
         return route_refuse_commit (r, &pe);
      /* A completion in the transaction settles its leases on success. */
      if (txns_injected (&r->msg->body, false) || pull_txn_pending (&r->msg->body))
         return route_relay (r, &r->msg->body, true);
   }
   if (cmd && cmd[0] == 'a' && strcmp (cmd, "abortTransaction") == 0) {
      (void) txns_injected (&r->msg->body, true);
      pull_txn_aborted (&r->msg->body);
   }
   return ROUTE_PASS;
}

client_route_t
publish_request_hook (client_conn_t *c, const wire_msg_t *msg, const char *cmd, int compressor, void *ctx, bson_error_t *error)
{
   route_t r = {
      .c = c,
      .msg = msg,
      .cmd = cmd,
      .compressor = compressor,
      .more = (msg->flags & WIRE_MSG_MORE_TO_COME) != 0,
      .reason = COUNTERS_CLOSE_INTERNAL,
      .error = error,
   };

   (void) ctx;
   switch (publish_route (&r)) {
   case ROUTE_PASS:
      return CLIENT_ROUTE_FORWARD;
   case ROUTE_TAKEN:
      return CLIENT_ROUTE_HELD;
   case ROUTE_FAILED:
   default:
      client_disconnect (c, r.reason, "%s", error->message);
      return CLIENT_ROUTE_ERROR;
   }
}
