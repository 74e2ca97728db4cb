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
 */
#include "publish/pull.h"

#include <inttypes.h>
#include <string.h>

#include "base/config.h"
#include "base/log.h"
#include "base/outbox.h"

static pull_submit_fn g_submit;
static pull_closed_fn g_closed;

void
pull_set_consumer (pull_submit_fn submit, pull_closed_fn closed)
{
   g_submit = submit;
   g_closed = closed;
}

/* --- per connection --------------------------------------------------------- */

#define PULL_CONN_BUCKETS 256

typedef struct pull_conn {
   uint64_t id;
   client_conn_t *c;
   bool authorized; /* the probe passed */
   bool submitted;  /* the consumer has heard of it */
   struct pull_conn *next;
} pull_conn_t;

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

   if (client_state (c) == CLIENT_STATE_CLOSING)
      return;
   if (!client_answer (c, seq, doc, &error))
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "answering a pull command: %s", error.message);
}

static void
answer_error (client_conn_t *c, uint64_t seq, pull_code_t code, const char *errmsg)
{
   bson_t doc = BSON_INITIALIZER;

   pull_error_reply (&doc, code, errmsg);
   answer_doc (c, seq, &doc);
   bson_destroy (&doc);
}

void
pull_answer (uint64_t conn, uint64_t seq, const bson_t *reply)
{
   pull_conn_t *p = conn_find (conn);

   if (!p) /* closed: its claims are the consumer's to end */
      return;
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
      answer_error (c, seq, (pull_code_t) error.code, error.message);
      goto done;
   }
   r->conn = p->id;
   r->seq = seq;
   if (!g_submit) {
      char msg[256];
      bson_snprintf (msg, sizeof msg,
                     "relaybus: %s: no consumer thread runs (the proxy started without a kind = pull handler; "
                     "restart it to consume one a reload added)",
                     cmd);
      answer_error (c, seq, PULL_CODE_INTERNAL, msg);
      goto done;
   }
   if (!g_submit (r, &error)) {
      answer_error (c, seq, error.domain == PULL_ERROR_DOMAIN ? (pull_code_t) error.code : PULL_CODE_INTERNAL,
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

   if (error || !p || client_state (c) == CLIENT_STATE_CLOSING)
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
      char msg[512];
      /* 13 Unauthorized, 18 AuthenticationFailed: the connection may not
       * read the outbox; anything else is refused with its reason too. */
      bson_snprintf (msg, sizeof msg,
                     "relaybus: %s needs a connection allowed to read the outbox: the deployment answered: %.300s", pr->cmd,
                     errmsg);
      answer_error (c, pr->seq, code == 13 || code == 18 || code == 0 ? PULL_CODE_UNAUTHORIZED : PULL_CODE_INTERNAL, msg);
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

bool
pull_route (client_conn_t *c, const wire_msg_t *msg, const char *cmd, int compressor, bson_error_t *error)
{
   pull_conn_t *p;
   uint64_t seq;
   char errmsg[256];

   if (!client_hold_request (c, msg->header.request_id, WIRE_OP_MSG, compressor, &seq, error))
      return false;
   if (bson_has_field (&msg->body, "txnNumber") || bson_has_field (&msg->body, "startTransaction")) {
      bson_snprintf (errmsg, sizeof errmsg,
                     "relaybus: %s inside a transaction is not supported by this version of the proxy: send it "
                     "outside the transaction",
                     cmd);
      answer_error (c, seq, PULL_CODE_IN_TRANSACTION, errmsg);
      return true;
   }
   p = conn_get (c);
   if (p->authorized) {
      submit (c, p, seq, cmd, &msg->body);
      return true;
   }
   if (!probe (c, seq, cmd, &msg->body)) {
      bson_snprintf (errmsg, sizeof errmsg, "relaybus: %s: cannot check this connection's authorization now; try again",
                     cmd);
      answer_error (c, seq, PULL_CODE_TEMPORARILY_UNAVAILABLE, errmsg);
   }
   return true;
}
