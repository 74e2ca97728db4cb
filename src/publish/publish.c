/*
 * publish/publish.c - the requests the proxy answers itself: annotated statements,
 * relaybusPublish and other relaybus* commands, and commits of transactions
 * it injected into.
 *
 * One operation (virtual_op_t) per request taken over.  It holds the client
 * request (client_hold_request), sends its own commands on the client's
 * upstream connection (client_send_internal) and answers (client_answer)
 * when its last reply arrived.  The commands of an publish/inject.h round are
 * pipelined, VIRTUAL_WINDOW at a time.  Replies come back in order, so the
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
 * process-wide table (publish/poison.h), and a commitTransaction for a poisoned
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/annotate.h"
#include "autoconf.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/fleet.h"
#include "publish/inject.h"
#include "base/log.h"
#include "admin/metrics.h"
#include "base/outbox.h"
#include "publish/guard.h"
#include "publish/poison.h"
#include "publish/hooks.h"

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
      statement_failed, inject_failed, aborted_lost, wakes, poisoned, poison_refused, poison_full_refused,
      outbox_writes_refused;
} counters;

#define COUNT(field, n) atomic_fetch_add_explicit (&counters.field, (uint64_t) (n), memory_order_relaxed)
#define READ(field) atomic_load_explicit (&counters.field, memory_order_relaxed)

/* The process-wide table of poisoned transactions: created at the first
 * poisoning, never freed (it is reachable until exit).  NULL means empty. */
static _Atomic (poison_table_t *) poison_tab;

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
   out->poisoned = READ (poisoned);
   out->poison_refused = READ (poison_refused);
   out->poison_full_refused = READ (poison_full_refused);
   out->outbox_writes_refused = READ (outbox_writes_refused);
   out->poison_entries = 0;
   {
      poison_table_t *t = atomic_load_explicit (&poison_tab, memory_order_acquire);

      if (t)
         out->poison_entries = poison_table_count (t);
   }
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
   bool reserved;        /* holds a poisoned-table slot (poison_table_reserve) */
   bool answer;          /* the client waits for an answer (false: moreToCome) */
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
   op->answer = true;
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

static poison_table_t *poison_table_get (void);

static void
op_release_maybe (virtual_op_t *op)
{
   if (op->state != OP_DONE || op->outstanding > 0 || op->running)
      return;
   if (op->reserved)
      poison_table_unreserve (poison_table_get ());
   inject_job_destroy (op->job);
   bson_destroy (&op->txn_cmd);
   bson_destroy (&op->stmt_reply);
   bson_destroy (&op->times);
   bson_free (op);
}

/* Answers the operation's request; a failure to answer closes the
 * connection (the client would otherwise wait forever). */
static void
op_answer (client_conn_t *c, virtual_op_t *op, const bson_t *reply)
{
   bson_error_t error;

   if (!op->answer || client_state (c) == CLIENT_STATE_CLOSING)
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
   bson_reinit (&op->times);
   inject_copy_times (reply, &op->times);
}

/* --- poisoned transactions ------------------------------------------------ */

/* The capacity the table is created with: [outbox] max_poisoned_transactions
 * of the first configuration seen (the key needs a restart to change). */
static _Atomic uint32_t poison_capacity = 4096;

/* The table, created by the first reservation (by whichever loop thread
 * gets there first). */
static poison_table_t *
poison_table_get (void)
{
   poison_table_t *t = atomic_load_explicit (&poison_tab, memory_order_acquire);
   poison_table_t *expected = NULL;

   if (t)
      return t;
   t = poison_table_new (atomic_load (&poison_capacity), VIRTUAL_POISON_TTL_MS);
   if (!atomic_compare_exchange_strong (&poison_tab, &expected, t)) {
      poison_table_destroy (t);
      t = expected;
   }
   return t;
}

/* Entries age by the monotonic clock: a wall-clock step neither keeps a
 * transaction poisoned for ever nor forgets it early. */
/* The session id in hex (at most 16 bytes of it), to tie log lines together. */
static void
lsid_hex (const poison_key_t *key, char out[33])
{
   static const char digits[] = "0123456789abcdef";
   uint32_t n = key->id_len < 16 ? key->id_len : 16;

   for (uint32_t i = 0; i < n; i++) {
      out[2 * i] = digits[key->id[i] >> 4];
      out[2 * i + 1] = digits[key->id[i] & 15];
   }
   out[2 * n] = '\0';
}

/* A truncated string may end inside a UTF-8 sequence; errmsg must be valid
 * UTF-8 (drivers validate it), so cut back to the last whole character. */
static void
utf8_trim (char *s)
{
   size_t len = strlen (s);

   while (len > 0 && !bson_utf8_validate (s, len, false))
      s[--len] = '\0';
}

/* Records the operation's transaction as poisoned, counts it and logs it
 * with the connection id at `level`.  `fmt` says what went wrong; it is
 * quoted in the error a refused commit gets. */
static void txn_poison (client_conn_t *c, virtual_op_t *op, log_level_t level, const char *fmt, ...)
   __attribute__ ((format (printf, 4, 5)));

static void
txn_poison (client_conn_t *c, virtual_op_t *op, log_level_t level, const char *fmt, ...)
{
   poison_key_t key;
   char reason[POISON_REASON_MAX], hex[33];
   bool reserved = op->reserved;
   va_list ap;

   va_start (ap, fmt);
   vsnprintf (reason, sizeof reason, fmt, ap);
   va_end (ap);
   utf8_trim (reason);
   if (!poison_key_of (&op->txn_cmd, &key)) {
      /* No binary lsid.id: not a session the server would run a
       * transaction for, so there is nothing to commit. */
      log_conn (LOG_LEVEL_WARN, client_id (c), client_peer (c), "cannot poison a transaction without a session id: %s", reason);
      return;
   }
   lsid_hex (&key, hex);
   /* The operation reserved its slot before it started: the entry always
    * fits, and no live entry is pushed out for it. */
   op->reserved = false;
   switch (poison_table_add (poison_table_get (), &key, client_id (c), reason, clock_mono_ms (), reserved)) {
   case POISON_KNOWN:
      log_conn (level, client_id (c), client_peer (c), "transaction %" PRId64 " of session %s was already poisoned; now also: %s",
                key.txn_number, hex, reason);
      return;
   case POISON_FULL:
      /* Only without a reservation, which no operation lacks: a bug. */
      log_conn (LOG_LEVEL_ERROR, client_id (c), client_peer (c),
                "transaction %" PRId64 " (session %s) could not be recorded as poisoned, the table is full: %s",
                key.txn_number, hex, reason);
      return;
   default:
      break;
   }
   COUNT (poisoned, 1);
   log_conn (level, client_id (c), client_peer (c),
             "transaction %" PRId64 " poisoned: %s; a commit of it through this proxy will be refused (session %s)",
             key.txn_number, reason, hex);
}

/* The code and errmsg of a reply (0 and "" when absent). */
static int32_t
reply_error (const bson_t *reply, const char **errmsg)
{
   bson_iter_t it;
   int32_t code = 0;

   *errmsg = "";
   if (bson_iter_init (&it, reply)) {
      while (bson_iter_next (&it)) {
         if (strcmp (bson_iter_key (&it), "code") == 0 && BSON_ITER_HOLDS_NUMBER (&it))
            code = (int32_t) bson_iter_as_int64 (&it);
         else if (strcmp (bson_iter_key (&it), "errmsg") == 0 && BSON_ITER_HOLDS_UTF8 (&it))
            *errmsg = bson_iter_utf8 (&it, NULL);
      }
   }
   return code;
}

/* Did this abortTransaction reply prove the transaction can no longer
 * commit?  ok: aborted now; NoSuchTransaction (251): it was already. */
static bool
abort_confirmed (const bson_t *reply)
{
   const char *errmsg;

   return !inject_reply_failed (reply) || reply_error (reply, &errmsg) == 251;
}

static void on_inject_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx);
static void round_start (client_conn_t *c, virtual_op_t *op);

/* The reply to the abortTransaction sent after a failed outbox write (`ctx`:
 * the transaction's poison_key_t, or NULL).  Once the server confirmed the
 * abort it refuses any commit itself, and the poisoned entry goes. */
static void
on_abort_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   poison_key_t *key = ctx;

   if (reply && key) {
      const char *errmsg;
      int32_t code = reply_error (&reply->body, &errmsg);

      if (abort_confirmed (&reply->body)) {
         if (poison_table_remove (poison_table_get (), key))
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
round_send (client_conn_t *c, virtual_op_t *op)
{
   bson_error_t error;

   while (op->sent < op->round_n && op->sent - op->answered < VIRTUAL_WINDOW) {
      const bson_t *cmd = inject_job_command (op->job, op->sent);

      if (!client_send_internal (c, cmd, NULL, 0, on_inject_reply, op, &error)) {
         COUNT (aborted_lost, 1);
         txn_poison (c, op, LOG_LEVEL_WARN, "an outbox write could not be sent on c%" PRIu64 ": %s", client_id (c),
                     error.message);
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

/* An outbox write failed in the `phase` round: poison the transaction,
 * abort it on the same connection, then tell the client (the abort runs
 * before anything the client sends next on this connection, as the
 * connection serialises requests; the poisoning covers the others). */
static void
op_failed (client_conn_t *c, virtual_op_t *op, const bson_t *client_reply, inject_phase_t phase)
{
   bson_t abort;
   bson_error_t error;
   const char *desc;
   poison_key_t *key = bson_malloc (sizeof *key);

   COUNT (inject_failed, 1);
   (void) reply_error (client_reply, &desc);
   log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c),
             "outbox write failed in the %s round; aborting the transaction: %s", inject_phase_name (phase), desc);
   /* Poisoned before the client hears of the failure: until the abort is
    * confirmed, a commit from another connection could still win. */
   txn_poison (c, op, LOG_LEVEL_INFO, "an outbox write failed in the %s round on c%" PRIu64 ": %.120s",
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
         txn_poison (c, op, LOG_LEVEL_WARN, "the connection was lost during the outbox writes (%s round) on c%" PRIu64,
                     inject_phase_name (inject_job_phase (op->job)), client_id (c));
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
      /* The statement may have run: its reply, and the outbox writes, are
       * what never came. */
      COUNT (aborted_lost, 1);
      if (op->state != OP_DONE)
         txn_poison (c, op, LOG_LEVEL_WARN,
                     "the connection was lost before the annotated statement's reply on c%" PRIu64, client_id (c));
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

/* Is the commitTransaction `cmd` for a poisoned transaction?  While
 * nothing was ever poisoned, or the table is empty, this costs two atomic
 * loads and takes no lock. */
static bool
commit_poisoned (const bson_t *cmd, poison_entry_t *pe)
{
   poison_table_t *t = atomic_load_explicit (&poison_tab, memory_order_acquire);
   poison_key_t key;

   if (!t || poison_table_count (t) == 0 || !poison_key_of (cmd, &key))
      return false;
   return poison_table_lookup (t, &key, clock_mono_ms (), pe);
}

/* An abortTransaction for the transaction of the commitTransaction
 * `commit`: its lsid and txnNumber, and its API parameters, which must match
 * the transaction's.  `out` is initialised. */
static void
abort_command_of (const bson_t *commit, bson_t *out)
{
   static const char *const fields[] = {"lsid", "txnNumber", "apiVersion", "apiStrict", "apiDeprecationErrors"};
   bson_iter_t it;

   bson_init (out);
   BSON_APPEND_INT32 (out, "abortTransaction", 1);
   BSON_APPEND_UTF8 (out, "$db", "admin");
   for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
      if (bson_iter_init_find (&it, commit, fields[i]))
         bson_append_iter (out, fields[i], -1, &it);
      if (i == 1)
         BSON_APPEND_BOOL (out, "autocommit", false);
   }
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
   bson_t doc = BSON_INITIALIZER, labels;
   bson_error_t error;

   if (!r->answer || client_state (c) == CLIENT_STATE_CLOSING)
      goto done;
   BSON_APPEND_DOUBLE (&doc, "ok", 0.0);
   BSON_APPEND_UTF8 (&doc, "errmsg", r->errmsg);
   BSON_APPEND_INT32 (&doc, "code", 251);
   BSON_APPEND_UTF8 (&doc, "codeName", "NoSuchTransaction");
   BSON_APPEND_ARRAY_BEGIN (&doc, "errorLabels", &labels);
   BSON_APPEND_UTF8 (&labels, "0", "TransientTransactionError");
   bson_append_array_end (&doc, &labels);
   if (abort_reply)
      inject_copy_times (abort_reply, &doc);
   if (!client_answer (c, r->seq, &doc, &error))
      client_disconnect (c, STATS_CLOSE_INTERNAL, "answering a refused commit: %s", error.message);
done:
   bson_destroy (&doc);
}

static void
on_refusal_abort_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   refusal_t *r = ctx;

   (void) error;
   if (reply) {
      const char *errmsg;
      int32_t code = reply_error (&reply->body, &errmsg);

      if (abort_confirmed (&reply->body))
         log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c), "poisoned transaction %" PRId64 " is aborted%s",
                   r->txn_number, code == 251 ? " (it already was)" : "");
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
static virtual_result_t
route_refuse_commit (client_conn_t *c,
                     const wire_msg_t *msg,
                     const poison_entry_t *pe,
                     int compressor,
                     stats_close_reason_t *reason,
                     bson_error_t *error)
{
   refusal_t *r = bson_malloc0 (sizeof *r);
   bson_t abort;
   bson_error_t serr;
   char hex[33];

   r->answer = (msg->flags & WIRE_MSG_MORE_TO_COME) == 0;
   if (r->answer && !hold (c, msg, compressor, &r->seq, reason, error)) {
      bson_free (r);
      return VIRTUAL_FAILED;
   }
   COUNT (poison_refused, 1);
   r->txn_number = pe->key.txn_number;
   lsid_hex (&pe->key, hex);
   log_conn (LOG_LEVEL_WARN, client_id (c), client_peer (c),
             "refused commitTransaction of poisoned transaction %" PRId64 " (session %s, poisoned on c%" PRIu64
             " %.1f s ago: %s); aborting it",
             pe->key.txn_number, hex, pe->conn_id, (double) (clock_mono_ms () - pe->recorded_ms) / 1000.0, pe->reason);
   bson_snprintf (r->errmsg, sizeof r->errmsg,
                  "relaybus: transaction %" PRId64 " was aborted because the proxy could not write its events (%s)",
                  pe->key.txn_number, pe->reason);
   abort_command_of (&msg->body, &abort);
   if (!client_send_internal (c, &abort, NULL, 0, on_refusal_abort_reply, r, &serr)) {
      /* The server aborts it when its lifetime runs out; refuse anyway. */
      log_conn (LOG_LEVEL_WARN, client_id (c), client_peer (c),
                "cannot send abortTransaction for poisoned transaction %" PRId64 ": %s", pe->key.txn_number, serr.message);
      refusal_answer (c, r, NULL);
      bson_free (r);
   }
   bson_destroy (&abort);
   return VIRTUAL_TAKEN;
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
   bson_t doc = BSON_INITIALIZER, labels;
   bson_error_t error;
   char errmsg[320];
   int64_t now = clock_mono_ms ();

   COUNT (poison_full_refused, 1);
   /* One warning every 10 s per loop thread: a client filling the table on
    * purpose must not flood the log as well. */
   if (last_warn_ms < 0 || now - last_warn_ms >= 10000) {
      last_warn_ms = now;
      log_conn (LOG_LEVEL_WARN, client_id (c), client_peer (c),
                "refused an annotated write: %" PRIu32 " poisoned transactions are remembered "
                "(max_poisoned_transactions); refusing publishes until some expire",
                capacity);
   }
   bson_snprintf (errmsg, sizeof errmsg,
                  "relaybus: too many poisoned transactions are remembered (max_poisoned_transactions = %" PRIu32
                  "); annotated writes are refused until some expire: retry the transaction later",
                  capacity);
   BSON_APPEND_DOUBLE (&doc, "ok", 0.0);
   BSON_APPEND_UTF8 (&doc, "errmsg", errmsg);
   BSON_APPEND_INT32 (&doc, "code", VIRTUAL_POISON_FULL_CODE);
   BSON_APPEND_UTF8 (&doc, "codeName", "TemporarilyUnavailable");
   BSON_APPEND_ARRAY_BEGIN (&doc, "errorLabels", &labels);
   BSON_APPEND_UTF8 (&labels, "0", "TransientTransactionError");
   bson_append_array_end (&doc, &labels);
   if (!client_answer (c, seq, &doc, &error))
      client_disconnect (c, STATS_CLOSE_INTERNAL, "answering a refused publish: %s", error.message);
   bson_destroy (&doc);
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
      metrics_unrouted_observe (ann->events[i].type);
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
      op_answer_error (c, seq, VIRTUAL_UNROUTED_CODE, "BadValue", errmsg);
      return false;
   }
   if (cfg->unrouted_mode == CONFIG_UNROUTED_WARN) {
      int64_t now = clock_mono_ms ();

      if (last_warn_ms < 0 || now - last_warn_ms >= 10000) {
         last_warn_ms = now;
         log_conn (LOG_LEVEL_WARN,
                   client_id (c),
                   client_peer (c),
                   "no handler subscribes to event type \"%.200s\": the event is stored without deliveries "
                   "(relaybus_events_unrouted_total; at most one such line every 10 s)",
                   first);
      }
   }
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
   bson_error_t error;
   size_t live = 0;

   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   BSON_APPEND_UTF8 (&doc, "proxy", "relaybus-proxy");
   BSON_APPEND_UTF8 (&doc, "version", PACKAGE_VERSION);
   BSON_APPEND_INT32 (&doc, "handlers", cfg ? (int32_t) cfg->n_handlers : 0);
   BSON_APPEND_INT32 (&doc, "fleetHandlers", fs ? (int32_t) fs->n_live : 0);
   for (size_t i = 0; fs && i < fs->n_instances; i++)
      live += fs->instances[i].live;
   BSON_APPEND_INT32 (&doc, "fleetInstances", (int32_t) live);
   BSON_APPEND_UTF8 (&doc, "unrouted", cfg ? cfg->unrouted : "accept");
   if (!client_answer (c, seq, &doc, &error))
      client_disconnect (c, STATS_CLOSE_INTERNAL, "answering relaybusStatus: %s", error.message);
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
static virtual_op_t *
op_new_job (client_conn_t *c, uint64_t seq, op_state_t state, annotate_t *ann, const bson_t *body, bool opens_txn)
{
   config_t *cfg = config_acquire ();
   fleet_set_t *fs;
   virtual_op_t *op;
   poison_table_t *pt;
   bson_error_t error;

   if (!cfg) {
      op_answer_error (c, seq, 1, "InternalError", "relaybus: no configuration loaded");
      return NULL;
   }
   fs = fleet_acquire ();
   if (!check_routed (c, seq, ann, cfg, fs)) {
      fleet_release (fs);
      config_release (cfg);
      return NULL;
   }
   if (!atomic_load_explicit (&poison_tab, memory_order_acquire))
      atomic_store (&poison_capacity, (uint32_t) cfg->max_poisoned_transactions);
   pt = poison_table_get ();
   if (!poison_table_reserve (pt, clock_mono_ms ())) {
      fleet_release (fs);
      config_release (cfg);
      answer_poison_full (c, seq, poison_table_capacity (pt));
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
      op_answer_error (c, seq, 1, "InternalError", error.message);
      return NULL;
   }
   txn_key_copy (body, &op->txn_cmd);
   return op;
}

static virtual_result_t
route_annotated (client_conn_t *c, const wire_msg_t *msg, int compressor, stats_close_reason_t *reason, bson_error_t *error)
{
   uint64_t seq;
   annotate_t *ann = NULL;
   bson_t fwd;
   bson_error_t aerr;
   inject_txn_t txn = inject_txn_of (&msg->body);
   const char *cmd = wire_command_name (&msg->body);
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
   op = op_new_job (c, seq, OP_STATEMENT, ann, &msg->body, false);
   if (!op)
      goto done;
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
   op = op_new_job (c, seq, OP_INJECT, ann, &msg->body, txn == INJECT_TXN_STARTS);
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
   return VIRTUAL_TAKEN;
}

/* Holds the request and sends `body` (with the request's kind-1 sections)
 * in its place; the reply is relayed by on_relay_reply.  A request sent
 * with moreToCome is not held and its reply is swallowed: the proxy still
 * sends it acknowledged, to learn the outcome (a commit to wake on), but
 * the client asked for no answer and must get none. */
static virtual_result_t
route_relay (client_conn_t *c,
             const wire_msg_t *msg,
             const bson_t *body,
             bool is_commit,
             int compressor,
             stats_close_reason_t *reason,
             bson_error_t *error)
{
   uint64_t seq = 0;
   bool answer = (msg->flags & WIRE_MSG_MORE_TO_COME) == 0;
   virtual_op_t *op;

   if (answer && !hold (c, msg, compressor, &seq, reason, error))
      return VIRTUAL_FAILED;
   op = op_new (c, seq, OP_RELAY);
   op->answer = answer;
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

/* The outbox namespace of this process: [outbox] database and
 * collection_prefix cannot change by reload, so any snapshot's values hold
 * for good.  Copied once per loop thread. */
static _Thread_local struct {
   bool loaded;
   char database[OUTBOX_NAME_MAX];
   char prefix[OUTBOX_NAME_MAX];
} guard_ns;

/* Does client command `msg` write the outbox (and are such writes
 * refused)?  True with the description in `why`.  Reads no configuration
 * but on the first call of a thread and for a command that does write the
 * outbox, which no well-behaved client sends. */
static bool
outbox_write_refused (const wire_msg_t *msg, char *why, size_t why_len)
{
   outbox_guard_ns_t ns;
   config_t *cfg;
   bool allowed;

   if (!guard_ns.loaded) {
      cfg = config_acquire ();
      if (!cfg)
         return false;
      bson_strncpy (guard_ns.database, cfg->outbox_database, sizeof guard_ns.database);
      bson_strncpy (guard_ns.prefix, cfg->collection_prefix, sizeof guard_ns.prefix);
      guard_ns.loaded = true;
      config_release (cfg);
   }
   ns.database = guard_ns.database;
   ns.prefix = guard_ns.prefix;
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
static virtual_result_t
route_refuse_outbox_write (client_conn_t *c,
                           const wire_msg_t *msg,
                           const char *why,
                           int compressor,
                           stats_close_reason_t *reason,
                           bson_error_t *error)
{
   char errmsg[OUTBOX_GUARD_WHY_MAX + 160];
   uint64_t seq;

   COUNT (outbox_writes_refused, 1);
   if (msg->flags & WIRE_MSG_MORE_TO_COME) {
      *reason = STATS_CLOSE_CLIENT_PROTOCOL;
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 23,
                      "refused an unacknowledged %s: only the proxy writes the outbox collections", why);
      return VIRTUAL_FAILED;
   }
   if (!hold (c, msg, compressor, &seq, reason, error))
      return VIRTUAL_FAILED;
   log_conn (LOG_LEVEL_INFO, client_id (c), client_peer (c), "refused a client write to the outbox: %s", why);
   bson_snprintf (errmsg, sizeof errmsg,
                  "relaybus: %s is refused: only the proxy writes the outbox collections "
                  "([outbox] allow_client_writes = false)",
                  why);
   op_answer_error (c, seq, 13, "Unauthorized", errmsg);
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
   char why[OUTBOX_GUARD_WHY_MAX];

   if (conn_busy (client_id (c))) {
      /* Forwarding this now could let it overtake the outbox writes. */
      *reason = STATS_CLOSE_CLIENT_PROTOCOL;
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 20,
                      "request pipelined behind an annotated statement or a relaybus command still running");
      return VIRTUAL_FAILED;
   }
   /* Before anything else: an annotated write into the outbox is refused
    * as well.  The proxy's own writes never pass through here. */
   if (!virtual_cmd && outbox_write_refused (msg, why, sizeof why))
      return route_refuse_outbox_write (c, msg, why, compressor, reason, error);
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
      if (strcmp (cmd, "relaybusStatus") == 0) {
         answer_status (c, seq);
         return VIRTUAL_TAKEN;
      }
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
   if (cmd && strcmp (cmd, "commitTransaction") == 0) {
      poison_entry_t pe;

      if (commit_poisoned (&msg->body, &pe))
         return route_refuse_commit (c, msg, &pe, compressor, reason, error);
      if (txn_lookup (&msg->body, false))
         return route_relay (c, msg, &msg->body, true, compressor, reason, error);
   }
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
