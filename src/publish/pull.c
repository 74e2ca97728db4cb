/*
 * publish/pull.c - the pull consumers' commands on the forwarding loop
 * (publish/pull.h).
 *
 * State per connection that sent a pull command (pull_conn_t, in the
 * connection's data slot and in a small per-loop table by id, so an answer
 * that comes back from the consumer thread finds its connection, or finds
 * that it is gone): whether the deployment allowed it to read the outbox,
 * and whether it submitted anything the consumer must hear the close of.
 *
 * The authorization probe is a find on the lanes collection, limit 1, on
 * the client's own upstream connection: the store's own connections are
 * the proxy's, so without it any client of an authenticating deployment
 * could consume.  It costs one round trip on a connection's first pull
 * command.
 *
 * A relaybusComplete inside a transaction (txn_op_t) runs here too, after
 * the consumer confirmed the leases: the rounds of publish/pulltxn.h on
 * the client's connection, then the answer, then an entry in the per-loop
 * table of completions waiting for their commit (pending_t), which
 * publish/publish.c's relayed commitTransaction resolves.
 */
#include "publish/pull.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/log.h"
#include "base/outbox.h"
#include "publish/inject.h"
#include "publish/poison.h"
#include "publish/pulltxn.h"
#include "publish/txns.h"

static pull_submit_fn g_submit;
static pull_closed_fn g_closed;
static pull_settled_fn g_settled;

void
pull_set_consumer (pull_submit_fn submit, pull_closed_fn closed, pull_settled_fn settled)
{
   g_submit = submit;
   g_closed = closed;
   g_settled = settled;
}

/* --- per connection --------------------------------------------------------- */

#define PULL_CONN_BUCKETS 256

struct txn_op;

typedef struct pull_conn {
   uint64_t id;
   client_conn_t *c;
   bool authorized; /* the probe passed */
   bool submitted;  /* the consumer has heard of it */
   struct txn_op *txn; /* a relaybusComplete in a transaction, in progress */
   struct pull_conn *next;
} pull_conn_t;

static void txn_op_free (struct txn_op *op);
static void pending_drop_conn (uint64_t conn_id);

static _Thread_local pull_conn_t *conns[PULL_CONN_BUCKETS];

static pull_conn_t *
conn_find (uint64_t id)
{
   for (pull_conn_t *p = conns[id % PULL_CONN_BUCKETS]; p; p = p->next)
      if (p->id == id)
         return p;
   return NULL;
}

/* The data slot's destroy: the connection is being freed, after its last
 * callback. */
static void
conn_destroy (void *arg)
{
   pull_conn_t *p = arg, **pp;

   for (pp = &conns[p->id % PULL_CONN_BUCKETS]; *pp; pp = &(*pp)->next)
      if (*pp == p) {
         *pp = p->next;
         break;
      }
   if (p->submitted && g_closed)
      g_closed (p->id);
   /* Called after the connection's last callback: nothing of it runs. */
   txn_op_free (p->txn);
   pending_drop_conn (p->id);
   bson_free (p);
}

static pull_conn_t *
conn_get (client_conn_t *c)
{
   pull_conn_t *p = client_get_data (c);

   if (p)
      return p;
   p = bson_malloc0 (sizeof *p);
   p->id = client_id (c);
   p->c = c;
   p->next = conns[p->id % PULL_CONN_BUCKETS];
   conns[p->id % PULL_CONN_BUCKETS] = p;
   client_set_data (c, p, conn_destroy);
   return p;
}

/* --- answering ------------------------------------------------------------- */

static void
answer_doc (client_conn_t *c, uint64_t seq, const bson_t *doc)
{
   bson_error_t error;

   /* On a closed connection no request waits, and the close is done. */
   if (!client_answer (c, seq, doc, &error))
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "answering a pull command: %s", error.message);
}

/* An error answer, its message formatted (cut at 511 bytes). */
static void __attribute__ ((format (printf, 4, 5)))
answer_error (client_conn_t *c, uint64_t seq, pull_code_t code, const char *fmt, ...)
{
   bson_t doc = BSON_INITIALIZER;
   va_list ap;

   va_start (ap, fmt);
   pull_error_replyv (&doc, code, fmt, ap);
   va_end (ap);
   answer_doc (c, seq, &doc);
   bson_destroy (&doc);
}

/* --- completion inside the consumer's transaction --------------------------- */

/* Completions that wait for their transaction's commit, process-wide:
 * after a successful commitTransaction (on any connection of any loop: a
 * driver may commit on another connection than the statements used) the
 * consumer forgets their leases, which the connection then no longer
 * holds; after an abort they stay held.  Full, the oldest entry goes: its
 * leases then stay in the consumer's bookkeeping until the connection
 * closes or their lease ends, which costs room, never correctness (the
 * store's fencing decides what a settled lease can still change). */
#define PULL_TXN_PENDING_MAX 1024

typedef struct {
   poison_key_t key;
   uint64_t conn_id;
   uint64_t stamp;
   pull_req_t *settle; /* handler and leases, for the consumer's settled notice */
} pending_t;

/* Under pending_mu.  n_pending is atomic so that the commits of
 * transactions without a completion (most of them) take no lock while no
 * entry waits. */
static pending_t pending[PULL_TXN_PENDING_MAX];
static atomic_uint n_pending;
static uint64_t pending_stamp;
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;

static bool
key_equal (const poison_key_t *a, const poison_key_t *b)
{
   return a->id_len == b->id_len && a->txn_number == b->txn_number && memcmp (a->id, b->id, a->id_len) == 0;
}

/* With pending_mu held. */
static void
pending_remove (uint32_t i)
{
   RELAYBUS_ASSERT (i < n_pending);
   pull_req_destroy (pending[i].settle);
   pending[i] = pending[--n_pending];
}

/* Adds the leases of `r` to the entry of (key, conn, handler). */
static void
pending_add (const poison_key_t *key, uint64_t conn_id, const pull_req_t *r)
{
   pending_t *e = NULL;

   pthread_mutex_lock (&pending_mu);
   for (uint32_t i = 0; i < n_pending && !e; i++)
      if (pending[i].conn_id == conn_id && key_equal (&pending[i].key, key) && strcmp (pending[i].settle->handler, r->handler) == 0)
         e = &pending[i];
   if (!e) {
      if (n_pending == PULL_TXN_PENDING_MAX) {
         uint32_t oldest = 0;
         for (uint32_t i = 1; i < n_pending; i++)
            if (pending[i].stamp < pending[oldest].stamp)
               oldest = i;
         log_info ("c%" PRIu64 ": %d completions wait for their commit; forgetting the oldest",
                   pending[oldest].conn_id, PULL_TXN_PENDING_MAX);
         pending_remove (oldest);
      }
      e = &pending[n_pending++];
      e->key = *key;
      e->conn_id = conn_id;
      e->settle = bson_malloc0 (sizeof *e->settle);
      e->settle->op = PULL_COMPLETE;
      e->settle->conn = conn_id;
      bson_strncpy (e->settle->handler, r->handler, sizeof e->settle->handler);
   }
   e->stamp = ++pending_stamp;
   e->settle->leases = bson_realloc (e->settle->leases, (e->settle->n_leases + r->n_leases) * sizeof *e->settle->leases);
   memcpy (e->settle->leases + e->settle->n_leases, r->leases, r->n_leases * sizeof *r->leases);
   e->settle->n_leases += r->n_leases;
   pthread_mutex_unlock (&pending_mu);
}

static void
pending_drop_conn (uint64_t conn_id)
{
   if (atomic_load (&n_pending) == 0)
      return;
   pthread_mutex_lock (&pending_mu);
   for (uint32_t i = n_pending; i-- > 0;)
      if (pending[i].conn_id == conn_id)
         pending_remove (i);
   pthread_mutex_unlock (&pending_mu);
}

bool
pull_txn_pending (const bson_t *cmd)
{
   poison_key_t key;
   bool found = false;

   if (atomic_load (&n_pending) == 0 || !poison_key_of (cmd, &key))
      return false;
   pthread_mutex_lock (&pending_mu);
   for (uint32_t i = 0; i < n_pending && !found; i++)
      found = key_equal (&pending[i].key, &key);
   pthread_mutex_unlock (&pending_mu);
   return found;
}

/* Does the reply carry error label `label`? */
static bool
has_label (const bson_t *reply, const char *label)
{
   bson_iter_t it, arr;

   if (!bson_iter_init_find (&it, reply, "errorLabels") || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
      return false;
   while (bson_iter_next (&arr))
      if (BSON_ITER_HOLDS_UTF8 (&arr) && strcmp (bson_iter_utf8 (&arr, NULL), label) == 0)
         return true;
   return false;
}

void
pull_txn_outcome (const bson_t *cmd, const bson_t *reply)
{
   poison_key_t key;
   bool committed, unknown;

   if (atomic_load (&n_pending) == 0 || !poison_key_of (cmd, &key))
      return;
   /* No reply, or UnknownTransactionCommitResult: the driver sends the
    * commit again, and the entry waits for that answer. */
   if (!reply)
      return;
   committed = !inject_reply_failed (reply);
   unknown = !committed && has_label (reply, "UnknownTransactionCommitResult");
   if (unknown)
      return;
   /* g_settled only queues for the consumer thread: it never calls back. */
   pthread_mutex_lock (&pending_mu);
   for (uint32_t i = n_pending; i-- > 0;) {
      if (!key_equal (&pending[i].key, &key))
         continue;
      if (committed && g_settled) {
         g_settled (pending[i].settle); /* taken */
         pending[i].settle = NULL;
      }
      pending_remove (i);
   }
   pthread_mutex_unlock (&pending_mu);
}

void
pull_txn_aborted (const bson_t *cmd)
{
   poison_key_t key;

   if (atomic_load (&n_pending) == 0 || !poison_key_of (cmd, &key))
      return;
   pthread_mutex_lock (&pending_mu);
   for (uint32_t i = n_pending; i-- > 0;)
      if (key_equal (&pending[i].key, &key))
         pending_remove (i);
   pthread_mutex_unlock (&pending_mu);
}

/* One relaybusComplete inside a transaction: first the consumer checks
 * that this connection holds the leases (the answer to `seq` comes back
 * through pull_answer), then the rounds of publish/pulltxn.h run on the
 * client's upstream connection, then the client is answered.  Owned by
 * its connection's pull_conn_t; its internal requests are all answered
 * (or failed by the connection's close) before it is freed. */
typedef struct txn_op {
   uint64_t seq;
   pulltxn_t *job;
   pull_req_t *req;   /* handler and leases, for the pending entry */
   poison_key_t key;
   bool checked;      /* the consumer confirmed the leases */
   uint32_t round_n, answered;
} txn_op_t;

static void
txn_op_free (txn_op_t *op)
{
   if (!op)
      return;
   pulltxn_destroy (op->job);
   pull_req_destroy (op->req);
   bson_free (op);
}

bool
pull_conn_busy (uint64_t conn_id)
{
   pull_conn_t *p = conn_find (conn_id);

   return p && p->txn;
}

static void
on_txn_abort_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   (void) ctx;
   if (reply && !txns_abort_confirmed (&reply->body))
      log_info ("c%" PRIu64 " %s: abortTransaction after a failed relaybusComplete did not confirm the abort",
                client_id (c), client_peer (c));
   else if (!reply)
      log_info ("c%" PRIu64 " %s: no reply to abortTransaction after a failed relaybusComplete: %s", client_id (c),
                client_peer (c), error ? error->message : "?");
}

/* The completion failed: the transaction is aborted on the same connection
 * (before anything the client sends next), so that even a client that
 * ignores the error cannot commit its writes without the completion, and
 * the client is answered `doc`. */
static void
txn_fail (client_conn_t *c, pull_conn_t *p, const bson_t *doc)
{
   txn_op_t *op = p->txn;
   bson_error_t error;

   if (pulltxn_opened (op->job)) {
      bson_t abort;
      pulltxn_abort_command (op->job, &abort);
      if (!client_send_internal (c, &abort, NULL, 0, on_txn_abort_reply, NULL, &error)) {
         bson_destroy (&abort);
         p->txn = NULL;
         txn_op_free (op);
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "cannot abort after a failed relaybusComplete: %s", error.message);
         return;
      }
      bson_destroy (&abort);
   }
   p->txn = NULL;
   answer_doc (c, op->seq, doc);
   txn_op_free (op);
}

static void on_txn_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx);

static void
txn_round (client_conn_t *c, pull_conn_t *p)
{
   txn_op_t *op = p->txn;
   bson_error_t error;

   op->round_n = pulltxn_next_round (op->job);
   op->answered = 0;
   if (op->round_n == 0) {
      const bson_t *fail;
      bson_t doc;

      if (pulltxn_failed (op->job, &fail)) {
         const char *msg;
         int32_t code = inject_reply_error (fail, &msg);
         log_info ("c%" PRIu64 " %s: relaybusComplete in a transaction failed (%d): %s", client_id (c), client_peer (c),
                   code, msg);
         txn_fail (c, p, fail);
         return;
      }
      pending_add (&op->key, p->id, op->req);
      pulltxn_answer (op->job, &doc);
      p->txn = NULL;
      answer_doc (c, op->seq, &doc);
      bson_destroy (&doc);
      txn_op_free (op);
      return;
   }
   for (uint32_t i = 0; i < op->round_n; i++)
      if (!client_send_internal (c, pulltxn_command (op->job, i), NULL, 0, on_txn_reply, p, &error)) {
         /* The replies of those sent come back failed as the connection closes. */
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "sending a completion write: %s", error.message);
         return;
      }
}

static void
on_txn_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   pull_conn_t *p = ctx;
   txn_op_t *op = p->txn;

   (void) error;
   if (!op || !reply)
      return; /* the connection closes: conn_destroy frees the operation */
   pulltxn_reply (op->job, op->answered++, &reply->body);
   if (op->answered == op->round_n)
      txn_round (c, p);
}

/* The consumer's answer to the lease check of the operation. */
static void
txn_checked (pull_conn_t *p, const bson_t *reply)
{
   txn_op_t *op = p->txn;
   bson_iter_t it;

   if (!(bson_iter_init_find (&it, reply, "ok") && BSON_ITER_HOLDS_NUMBER (&it) && bson_iter_as_double (&it) == 1.0)) {
      /* Refused (a lease this connection does not hold): no label, so
       * withTransaction does not run the transaction again. */
      txn_fail (p->c, p, reply);
      return;
   }
   op->checked = true;
   pulltxn_set_claims (op->job, reply);
   txn_round (p->c, p);
}

void
pull_answer (uint64_t conn, uint64_t seq, const bson_t *reply)
{
   pull_conn_t *p = conn_find (conn);

   if (!p) /* closed: its claims are the consumer's to end */
      return;
   if (client_state (p->c) == CLIENT_STATE_CLOSING)
      return;
   if (p->txn && p->txn->seq == seq && !p->txn->checked) {
      txn_checked (p, reply);
      return;
   }
   answer_doc (p->c, seq, reply);
}

/* Parses and hands the request over; answers any refusal itself. */
static void
submit (client_conn_t *c, pull_conn_t *p, uint64_t seq, const char *cmd, const bson_t *body)
{
   config_t *cfg = config_acquire ();
   pull_req_t *r = NULL;
   bson_error_t error;

   if (!pull_parse (cmd, body, cfg, &r, &error)) {
      answer_error (c, seq, (pull_code_t) error.code, "%s", error.message);
      goto done;
   }
   r->conn = p->id;
   r->seq = seq;
   r->loop = client_loop_of (c);
   if (r->op == PULL_COMPLETE && inject_txn_of (body) != INJECT_TXN_NO) {
      /* In the consumer's transaction: the consumer checks the leases,
       * then the completion's writes run here, in the transaction. */
      txn_op_t *op = bson_malloc0 (sizeof *op);
      op->seq = seq;
      op->job = pulltxn_new (r, body, cfg, clock_now_ms (), &error);
      if (!op->job || !poison_key_of (body, &op->key)) {
         answer_error (c, seq, PULL_CODE_INTERNAL, "%s",
                       op->job ? "relaybus: relaybusComplete: the transaction's session id is not understood" : error.message);
         txn_op_free (op);
         goto done;
      }
      op->req = bson_malloc0 (sizeof *op->req);
      bson_strncpy (op->req->handler, r->handler, sizeof op->req->handler);
      op->req->leases = bson_malloc0 (r->n_leases * sizeof *op->req->leases);
      memcpy (op->req->leases, r->leases, r->n_leases * sizeof *r->leases);
      op->req->n_leases = r->n_leases;
      r->in_txn = true;
      p->txn = op;
   }
   if (!g_submit) {
      txn_op_free (p->txn);
      p->txn = NULL;
      answer_error (c, seq, PULL_CODE_INTERNAL,
                    "relaybus: %s: no consumer thread runs (the proxy started without a kind = pull handler; "
                    "restart it to consume one a reload added)",
                    cmd);
      goto done;
   }
   if (!g_submit (r, &error)) {
      txn_op_free (p->txn);
      p->txn = NULL;
      answer_error (c, seq, error.domain == PULL_ERROR_DOMAIN ? (pull_code_t) error.code : PULL_CODE_INTERNAL, "%s",
                    error.message);
      goto done;
   }
   r = NULL; /* the consumer's */
   p->submitted = true;
done:
   pull_req_destroy (r);
   config_release (cfg);
}

/* --- the authorization probe ----------------------------------------------- */

typedef struct {
   uint64_t seq;
   char cmd[32];
   bson_t *body; /* a bson_t needs more alignment than bson_malloc gives */
} probe_t;

static void
on_probe_reply (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   probe_t *pr = ctx;
   pull_conn_t *p = client_get_data (c);
   bson_iter_t it;
   bool ok = false;
   int32_t code = 0;
   const char *errmsg = "no reply";

   if (error || !p) /* error: the connection closed */
      goto done;
   if (bson_iter_init_find (&it, &reply->body, "ok"))
      ok = bson_iter_as_double (&it) == 1.0;
   if (bson_iter_init_find (&it, &reply->body, "code") && BSON_ITER_HOLDS_INT32 (&it))
      code = bson_iter_int32 (&it);
   if (bson_iter_init_find (&it, &reply->body, "errmsg") && BSON_ITER_HOLDS_UTF8 (&it))
      errmsg = bson_iter_utf8 (&it, NULL);
   if (ok) {
      p->authorized = true;
      submit (c, p, pr->seq, pr->cmd, pr->body);
   } else {
      /* 13 Unauthorized, 18 AuthenticationFailed: the connection may not
       * read the outbox; anything else is refused with its reason too. */
      answer_error (c, pr->seq,
                    code == SERVER_UNAUTHORIZED || code == SERVER_AUTHENTICATION_FAILED || code == 0 ? PULL_CODE_UNAUTHORIZED
                                                                                                     : PULL_CODE_INTERNAL,
                    "relaybus: %s needs a connection allowed to read the outbox: the deployment answered: %.300s", pr->cmd,
                    errmsg);
      log_info ("c%" PRIu64 " %s: %s refused: %s (code %d)", client_id (c), client_peer (c), pr->cmd, errmsg, code);
   }
done:
   bson_destroy (pr->body);
   bson_free (pr);
}

static bool
probe (client_conn_t *c, uint64_t seq, const char *cmd, const bson_t *body)
{
   config_t *cfg = config_acquire ();
   char lanes[OUTBOX_NAME_MAX];
   probe_t *pr;
   bson_t *find;
   bson_error_t error;
   bool ok;

   if (!cfg || !outbox_collection_name (cfg->collection_prefix, OUTBOX_LANES_COLL, lanes, sizeof lanes)) {
      config_release (cfg);
      return false;
   }
   find = BCON_NEW ("find", BCON_UTF8 (lanes), "filter", "{", "_id", BCON_INT32 (-1), "}", "limit", BCON_INT32 (1),
                    "singleBatch", BCON_BOOL (true), "$db", BCON_UTF8 (cfg->outbox_database));
   config_release (cfg);
   pr = bson_malloc0 (sizeof *pr);
   pr->seq = seq;
   bson_strncpy (pr->cmd, cmd, sizeof pr->cmd);
   pr->body = bson_copy (body);
   ok = client_send_internal (c, find, NULL, 0, on_probe_reply, pr, &error);
   if (!ok) {
      bson_destroy (pr->body);
      bson_free (pr);
      log_warn ("c%" PRIu64 " %s: %s: cannot check the connection's authorization: %s", client_id (c), client_peer (c),
                cmd, error.message);
   }
   bson_destroy (find);
   return ok;
}

/* --- routing --------------------------------------------------------------- */

/* The handler's `consumers` list, checked before anything else is said
 * about the command: false after answering Unauthorized. */
static bool
admitted (client_conn_t *c, uint64_t seq, const char *cmd, const bson_t *body)
{
   config_t *cfg = config_acquire ();
   const config_handler_t *h = pull_handler_named (body, cfg);
   const char *user, *db;
   bool ok;

   user = client_user (c, &db);
   ok = !h || pull_consumer_admitted (h, user, db);
   if (!ok) {
      char who[400];
      if (!user)
         bson_strncpy (who, "is not authenticated", sizeof who);
      else if (db)
         bson_snprintf (who, sizeof who, "is authenticated as '%.200s' of database '%.100s'", user, db);
      else
         bson_snprintf (who, sizeof who, "is logged in as '%.200s'", user);
      log_info ("c%" PRIu64 " %s: %s on handler %s refused: user %s%s%s is not one of its consumers", client_id (c),
                client_peer (c), cmd, h->name, user ? user : "(none)", db ? " of " : "", db ? db : "");
      answer_error (c, seq, PULL_CODE_UNAUTHORIZED,
                    "relaybus: %s: handler '%.100s' admits only the users its `consumers` list names; this connection %s",
                    cmd, h->name, who);
   }
   config_release (cfg);
   return ok;
}

bool
pull_route (client_conn_t *c, const wire_msg_t *msg, const char *cmd, int compressor, bson_error_t *error)
{
   pull_conn_t *p;
   uint64_t seq;

   if (!client_hold_request (c, msg->header.request_id, WIRE_OP_MSG, compressor, &seq, error))
      return false;
   if ((bson_has_field (&msg->body, "txnNumber") || bson_has_field (&msg->body, "startTransaction")) &&
       !(strcmp (cmd, "relaybusComplete") == 0 && inject_txn_of (&msg->body) != INJECT_TXN_NO)) {
      answer_error (c, seq, PULL_CODE_IN_TRANSACTION,
                    "relaybus: %s inside a transaction is not supported: of the pull commands only "
                    "relaybusComplete runs in the consumer's transaction; send it outside the transaction",
                    cmd);
      return true;
   }
   if (!admitted (c, seq, cmd, &msg->body))
      return true;
   p = conn_get (c);
   if (p->authorized) {
      submit (c, p, seq, cmd, &msg->body);
      return true;
   }
   if (!probe (c, seq, cmd, &msg->body))
      answer_error (c, seq, PULL_CODE_TEMPORARILY_UNAVAILABLE,
                    "relaybus: %s: cannot check this connection's authorization now; try again", cmd);
   return true;
}
