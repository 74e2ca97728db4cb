/*
 * dispatch/consumer.c - the pull consumers' worker (dispatch/consumer.h).
 *
 * One thread, a store instance per pull handler's lane space (each
 * handler claims in lanes of its own, base/outbox.h, so a claim one
 * handler's consumer holds for its lease never keeps another handler's
 * consumers, on this proxy or another, waiting), three lists (and a retry
 * list, below):
 *
 *  - the inbox: requests the forwarding loop submitted (bounded), and the
 *    close notices of connections (one per connection that submitted
 *    anything), in submission order, so a connection's close is handled
 *    after its last request;
 *  - the claims held (held_t, bounded): what each connection was handed
 *    and has not settled; a lease is honoured only for the connection that
 *    claimed it, and for the handler it was claimed for;
 *  - the long polls waiting (bounded), each with its deadline; one timer
 *    looks again at the poll interval or at the nearest deadline, and a
 *    commit through this proxy (consumer_wake) makes them look at once.
 *
 * No consumer waits on another consumer's open transaction: the store's
 * writes outside a transaction are bounded (CONSUMER_STORE_MAX_TIME_MS),
 * and what hits the bound waits on a retry list this thread works through
 * between commands (retry_cb): the charges a closed connection owes for
 * deliveries its dead transaction still holds (held_t.owed), and the
 * events' completion times the store deferred.
 *
 * What the admin thread shows of them (per handler: the connections that
 * hold claims or wait, the claims, the long polls) is counted here as the
 * lists change and published into the counter registry's per-handler
 * gauges (relaxed atomic stores, base/counters.h): the admin thread reads
 * those slots, never the lists.
 *
 * Answers go into a list of their own under a mutex, and one loopwake post
 * at a time (a pending flag) makes the loop drain it, so the loop's
 * bounded queue is never filled by this thread.  That list is the module's
 * (static), not the consumer's: a post still queued when the consumer is
 * stopped finds valid, empty state.
 *
 * Ownership: a pull_req_t is this thread's once consumer_submit took it;
 * it is freed when answered, or dropped with its connection or at stop.
 */
#include "dispatch/consumer.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>

#include <event2/event.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/loopwake.h"
#include "base/worker.h"
#include "dispatch/delivery.h"
#include "dispatch/format.h"
#include "store/ops.h"
#include "store/store.h"

/* An answer larger than this stops taking deliveries: the rest of the
 * batch is released (no attempt charged) and claimed again later.  Well
 * inside a 48 MB message and a 16 MB document. */
#define CONSUMER_REPLY_MAX (8 * 1024 * 1024)
/* A retry of a post the loop's queue could not take. */
#define CONSUMER_POST_RETRY_MS 5
/* How often claims whose lease ended long ago are forgotten, and how long
 * after its end one is kept (the store honours an expired lease nobody
 * took over; a consumer that comes back a little late may still settle). */
#define CONSUMER_TIDY_MS 10000
#define CONSUMER_EXPIRED_KEEP_MS 60000
/* The internal operations (beyond pull_op_t's): a close notice, and the
 * leases a committed transaction completed. */
/* Claims of a closed connection charged in one store transaction; more
 * wait for the next turn of the inbox, behind the requests queued
 * meanwhile, so that a consumer that drops thousands of claims holds the
 * others up for one slice at a time. */
#define CONSUMER_CLOSE_SLICE 100
/* No connection has this id (ids count up from 1): a claim being
 * forgotten. */
#define CONSUMER_CONN_CHARGED UINT64_MAX
/* maxTimeMS of the consumer store's writes outside a transaction
 * (store_set_max_time_ms): one consumer's open transaction holds such a
 * write up for as long as it stays open, and this thread answers every
 * consumer of the proxy. */
#define CONSUMER_STORE_MAX_TIME_MS 200
/* How soon the retry list (the charges a closed connection owes, the
 * deferred events' completion times) is worked through again; owed charges
 * that did not land wait longer each turn, up to CONSUMER_OWED_MAX_MS. */
#define CONSUMER_RETRY_MS 250
#define CONSUMER_OWED_MAX_MS 8000
/* How long a stop retries the charges closed connections owe before it
 * hands the lanes back (stop_charge_owed; docs/consumers.md). */
#define CONSUMER_STOP_CHARGE_MS 5000
#define CONSUMER_OP_CLOSED PULL_OP_COUNT_
#define CONSUMER_OP_SETTLED (PULL_OP_COUNT_ + 1)

/* One claim handed out and not settled. */
typedef struct {
   uint64_t conn;
   char handler[128];
   pull_lease_t lease;
   char *event_id;
   uint32_t lane;
   int32_t attempt;
   int64_t claimed_at; /* ms: when it was handed out (its attempt's start) */
   int64_t expires; /* ms: the lease's end as claimed or last extended */
   size_t slot;     /* the handler's counters slot (SIZE_MAX: none) */
   /* The connection closed and the charge of this claim failed (an open
    * transaction, typically the dead consumer's own, holds the delivery):
    * retried from the retry list (retry_cb) until it lands or the lease
    * no longer holds.  Never settled by a request (no connection has
    * this id any more). */
   bool owed;
} held_t;

typedef struct {
   pull_req_t *r;
   int64_t deadline; /* clock_mono_ms */
   size_t slot;      /* as held_t's */
} waiting_t;

/* One connection's share of one handler: its claims held and its long
 * polls waiting (never both 0: the entry goes with its last one).  At most
 * one per held claim or waiting poll, so bounded by CONSUMER_MAX_CLAIMS +
 * CONSUMER_MAX_WAITING.  The fair shares per connection sum a
 * connection's entries. */
typedef struct {
   uint64_t conn;
   size_t slot;
   size_t claims, polls;
} user_t;

/* Per handler slot: what the gauges COUNTER_CONSUMER_CONNECTIONS, _CLAIMS
 * and _LONG_POLLS show. */
typedef struct {
   uint32_t conns, claims, polls;
} usage_t;

typedef struct {
   worker_t *w;    /* owns the base and the pool */
   store_t *store;        /* the handler statistics; it claims nothing */
   store_spaces_t spaces; /* an instance per pull handler's lane space (store.h) */
   struct event_base *base;
   pthread_mutex_t mu; /* the inbox */
   pull_req_t *in_head, *in_tail;
   size_t n_in; /* requests (close notices are not counted) */
   /* n_in per handler slot: one handler's consumers may fill at most half
    * of the queue (CONSUMER_HANDLER_MAX_QUEUED). */
   uint16_t in_by_slot[COUNTERS_MAX_HANDLERS];
   struct event *in_ev, *wake_ev, *poll_ev;
   struct event *tidy_ev; /* persistent: also what keeps the base's loop running */
   struct event *drain_ev;
   struct event *retry_ev; /* the retry list's timer (retry_arm) */
   int64_t owed_wait_ms, owed_at; /* the owed charges' backoff (retry_cb; clock_mono_ms) */
   atomic_bool draining; /* the proxy drains: claims wait no more */
   atomic_bool wake_pending;
   /* This thread's. */
   held_t *held;
   size_t n_held;
   waiting_t waiting[CONSUMER_MAX_WAITING];
   size_t n_waiting;
   user_t *users;
   size_t n_users, cap_users;
   usage_t usage[COUNTERS_MAX_HANDLERS];
   delivery_rng_t rng; /* the retries' jitter */
} consumer_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static consumer_t *g_c; /* under g_mu: the running consumer */

/* --- answers to the loop ------------------------------------------------ */

typedef struct answer {
   uint64_t conn, seq;
   bson_t *reply; /* a bson_t needs more alignment than bson_malloc gives */
   struct answer *next;
} answer_t;

/* The answers waiting for one forwarding loop, the one that owns their
 * connections (pull_req_t.loop). */
typedef struct {
   answer_t *head, *tail;
   bool posted;
   loopwake_t *wake;
} out_queue_t;

static struct {
   pthread_mutex_t mu;
   out_queue_t q[CONFIG_THREADS_MAX];
   size_t nq;
   struct event *retry_ev; /* on the consumer's base */
   consumer_answer_fn fn;
} g_out = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* On loop q: hands every answer to the loop's callback. */
static void
out_flush_cb (void *arg)
{
   out_queue_t *q = arg;
   answer_t *a, *next;
   consumer_answer_fn fn;

   pthread_mutex_lock (&g_out.mu);
   a = q->head;
   q->head = q->tail = NULL;
   q->posted = false;
   fn = g_out.fn;
   pthread_mutex_unlock (&g_out.mu);
   for (; a; a = next) {
      next = a->next;
      if (fn)
         fn (a->conn, a->seq, a->reply);
      bson_destroy (a->reply);
      bson_free (a);
   }
}

/* With g_out.mu held: posts loop q's drain once. */
static void
out_post_locked (out_queue_t *q)
{
   struct timeval tv;

   if (q->posted || !q->head || !q->wake)
      return;
   if (loopwake_post (q->wake, out_flush_cb, q)) {
      q->posted = true;
      return;
   }
   /* The loop's queue is full: try again shortly (answers wait in order). */
   tv = clock_timeval_ms (CONSUMER_POST_RETRY_MS);
   if (g_out.retry_ev)
      evtimer_add (g_out.retry_ev, &tv);
}

static void
out_retry_cb (evutil_socket_t fd, short what, void *arg)
{
   (void) fd;
   (void) what;
   (void) arg;
   pthread_mutex_lock (&g_out.mu);
   for (size_t i = 0; i < g_out.nq; i++)
      out_post_locked (&g_out.q[i]);
   pthread_mutex_unlock (&g_out.mu);
}

/* Queues a copy of `reply` as the answer to request r. */
static void
answer (const pull_req_t *r, bson_t *reply)
{
   answer_t *a = bson_malloc0 (sizeof *a);
   out_queue_t *q;

   a->conn = r->conn;
   a->seq = r->seq;
   a->reply = bson_copy (reply);
   pthread_mutex_lock (&g_out.mu);
   /* A loop that does not exist (never, from publish/pull.c) gets loop 0's
    * queue: the answer then finds no connection and is dropped there. */
   q = &g_out.q[r->loop < g_out.nq ? r->loop : 0];
   if (q->tail)
      q->tail->next = a;
   else
      q->head = a;
   q->tail = a;
   out_post_locked (q);
   pthread_mutex_unlock (&g_out.mu);
}

static void
answer_error (const pull_req_t *r, pull_code_t code, const char *fmt, ...) __attribute__ ((format (printf, 3, 4)));

static void
answer_error (const pull_req_t *r, pull_code_t code, const char *fmt, ...)
{
   bson_t doc = BSON_INITIALIZER;
   char msg[512];
   va_list ap;

   va_start (ap, fmt);
   bson_vsnprintf (msg, sizeof msg, fmt, ap);
   va_end (ap);
   pull_error_reply (&doc, code, msg);
   answer (r, &doc);
   bson_destroy (&doc);
}

/* --- what the admin sees ------------------------------------------------ */

static void
usage_publish (const consumer_t *c, size_t slot)
{
   counters_set_at (COUNTER_CONSUMER_CONNECTIONS, slot, c->usage[slot].conns);
   counters_set_at (COUNTER_CONSUMER_CLAIMS, slot, c->usage[slot].claims);
   counters_set_at (COUNTER_CONSUMER_LONG_POLLS, slot, c->usage[slot].polls);
}

/* Connection `conn` holds `n` more claims (or waits in `n` more long polls
 * when `poll`) of the handler of `slot`; a negative `n` fewer. */
static void
usage_track (consumer_t *c, uint64_t conn, size_t slot, bool poll, long n)
{
   usage_t *u;
   user_t *e = NULL;

   if (slot >= COUNTERS_MAX_HANDLERS || n == 0)
      return;
   u = &c->usage[slot];
   for (size_t i = 0; i < c->n_users && !e; i++)
      if (c->users[i].conn == conn && c->users[i].slot == slot)
         e = &c->users[i];
   if (!e) {
      RELAYBUS_ASSERT (n > 0);
      if (c->n_users == c->cap_users) {
         c->cap_users = c->cap_users ? 2 * c->cap_users : 16;
         c->users = bson_realloc (c->users, c->cap_users * sizeof *c->users);
      }
      e = &c->users[c->n_users++];
      *e = (user_t){.conn = conn, .slot = slot};
      u->conns++;
   }
   if (poll) {
      RELAYBUS_ASSERT (n > 0 || e->polls >= (size_t) -n);
      e->polls = (size_t) ((long) e->polls + n);
      u->polls = (uint32_t) ((long) u->polls + n);
   } else {
      RELAYBUS_ASSERT (n > 0 || e->claims >= (size_t) -n);
      e->claims = (size_t) ((long) e->claims + n);
      u->claims = (uint32_t) ((long) u->claims + n);
   }
   if (e->claims == 0 && e->polls == 0) {
      *e = c->users[--c->n_users];
      u->conns--;
   }
   usage_publish (c, slot);
}

/* What connection `conn` holds of all handlers: claims, and long polls
 * waiting. */
static void
conn_usage (const consumer_t *c, uint64_t conn, size_t *claims, size_t *polls)
{
   *claims = *polls = 0;
   for (size_t i = 0; i < c->n_users; i++)
      if (c->users[i].conn == conn) {
         *claims += c->users[i].claims;
         *polls += c->users[i].polls;
      }
}

/* How many more claims r's connection may take now: the smallest room of
 * the proxy's bound, its connection's share and its handler's share; 0
 * fills `why` with the bound that is reached. */
static size_t
claim_room (const consumer_t *c, const pull_req_t *r, size_t slot, char *why, size_t why_len)
{
   size_t conn_claims, conn_polls, room = CONSUMER_MAX_CLAIMS - c->n_held, share;

   if (room == 0) {
      bson_snprintf (why, why_len, "this proxy's consumers hold %d claims already", CONSUMER_MAX_CLAIMS);
      return 0;
   }
   conn_usage (c, r->conn, &conn_claims, &conn_polls);
   share = conn_claims < CONSUMER_CONN_MAX_CLAIMS ? CONSUMER_CONN_MAX_CLAIMS - conn_claims : 0;
   if (share == 0) {
      bson_snprintf (why, why_len, "this connection holds %d claims already (a connection's share: a quarter of the proxy's %d)",
                     CONSUMER_CONN_MAX_CLAIMS, CONSUMER_MAX_CLAIMS);
      return 0;
   }
   room = share < room ? share : room;
   if (slot < COUNTERS_MAX_HANDLERS) {
      size_t held = c->usage[slot].claims;
      share = held < CONSUMER_HANDLER_MAX_CLAIMS ? CONSUMER_HANDLER_MAX_CLAIMS - held : 0;
      if (share == 0) {
         bson_snprintf (why, why_len,
                        "the consumers of handler '%s' hold %d claims already (a handler's share: half of the "
                        "proxy's %d)",
                        r->handler, CONSUMER_HANDLER_MAX_CLAIMS, CONSUMER_MAX_CLAIMS);
         return 0;
      }
      room = share < room ? share : room;
   }
   return room;
}

/* Whether r's connection and handler are within their shares of the long
 * polls: false fills `why` with the share that is used up. */
static bool
poll_share (const consumer_t *c, const pull_req_t *r, char *why, size_t why_len)
{
   size_t conn_claims, conn_polls, slot = counters_handler_slot (r->handler, true);

   conn_usage (c, r->conn, &conn_claims, &conn_polls);
   if (conn_polls >= CONSUMER_CONN_MAX_WAITING) {
      bson_snprintf (why, why_len, "%d long polls of this connection wait already (a connection's share: a quarter of the proxy's %d)",
                     CONSUMER_CONN_MAX_WAITING, CONSUMER_MAX_WAITING);
      return false;
   }
   if (slot < COUNTERS_MAX_HANDLERS && c->usage[slot].polls >= CONSUMER_HANDLER_MAX_WAITING) {
      bson_snprintf (why, why_len,
                     "%d long polls of handler '%s' wait already (a handler's share: half of the proxy's %d)",
                     CONSUMER_HANDLER_MAX_WAITING, r->handler, CONSUMER_MAX_WAITING);
      return false;
   }
   return true;
}

/* Adds r as a waiting long poll (room checked by the caller). */
static void
waiting_add (consumer_t *c, pull_req_t *r)
{
   waiting_t *w = &c->waiting[c->n_waiting++];

   w->r = r;
   w->deadline = clock_mono_ms () + r->await_ms;
   w->slot = counters_handler_slot (r->handler, true);
   usage_track (c, r->conn, w->slot, true, 1);
}

/* Removes waiting poll i and frees its request. */
static void
waiting_remove (consumer_t *c, size_t i)
{
   waiting_t *w = &c->waiting[i];

   RELAYBUS_ASSERT (i < c->n_waiting);
   usage_track (c, w->r->conn, w->slot, true, -1);
   pull_req_destroy (w->r);
   c->waiting[i] = c->waiting[--c->n_waiting];
}

/* --- claims held -------------------------------------------------------- */

static held_t *
held_find (consumer_t *c, uint64_t conn, const char *text)
{
   for (size_t i = 0; i < c->n_held; i++)
      if (c->held[i].conn == conn && strcmp (c->held[i].lease.text, text) == 0)
         return &c->held[i];
   return NULL;
}

static void
held_remove (consumer_t *c, held_t *h)
{
   size_t i = (size_t) (h - c->held);

   RELAYBUS_ASSERT (i < c->n_held);
   usage_track (c, h->conn, h->slot, false, -1);
   bson_free (h->event_id);
   c->held[i] = c->held[--c->n_held];
}

/* Every lease of r must be held by r's connection for r's handler: a
 * foreign or stale lease refuses the whole request, with nothing changed.
 * found[i] is lease i's entry. */
static bool
leases_held (consumer_t *c, const pull_req_t *r, held_t **found)
{
   for (size_t i = 0; i < r->n_leases; i++) {
      held_t *h = held_find (c, r->conn, r->leases[i].text);
      if (!h || strcmp (h->handler, r->handler) != 0) {
         answer_error (r, PULL_CODE_NO_SUCH_LEASE,
                       "relaybus: %s: lease '%s' is not held by this connection for handler '%s' (it was "
                       "settled already, or claimed by another connection or for another handler); nothing "
                       "was changed",
                       pull_op_name (r->op), r->leases[i].text, r->handler);
         return false;
      }
      found[i] = h;
   }
   return true;
}

static store_ref_t
ref_of (const held_t *h)
{
   store_ref_t ref = {.id = h->lease.id, .lease = h->lease.token, .event_id = h->event_id};
   return ref;
}

/* The record of claim h's attempt, ending now as `outcome` (error:
 * borrowed), and its duration in relaybus_attempt_duration_seconds. */
static store_attempt_t
attempt_of (const held_t *h, outbox_attempt_outcome_t outcome, const char *error, int64_t now)
{
   store_attempt_t a = {
      .handler = h->handler, .outcome = outcome, .attempt = h->attempt, .started_at = h->claimed_at, .duration_ms = now - h->claimed_at, .error = error};

   bson_oid_init (&a.id, NULL);
   return a;
}

static void
attempt_observe (const held_t *h, outbox_attempt_outcome_t outcome, int64_t now)
{
   counters_attempt (h->handler, outcome, now - h->claimed_at);
}

/* The store instance that claims (and settles) `handler`'s deliveries. */
static store_t *
store_of (consumer_t *c, const char *handler)
{
   return store_spaces_of (&c->spaces, handler);
}

/* Hands back the lanes of every space (no consumer holds a claim). */
static void
relinquish_all (consumer_t *c, const char *when)
{
   bson_error_t err;

   for (size_t i = 0; i < c->spaces.n; i++)
      if (!store_relinquish (c->spaces.v[i], clock_now_ms (), &err))
         log_warn ("consumer: %shanding the lanes of handler %s back failed (they free up when their leases end): %s",
                   when, store_space_handler (c->spaces.v[i]), err.message);
}

/* The events' completion times deferred by every instance. */
static size_t
deferred_count (consumer_t *c)
{
   size_t n = 0;

   for (size_t i = 0; i <= c->spaces.n; i++) /* and the base's: its spaces' completions of a second (store.h) */
      n += store_deferred_count (i < c->spaces.n ? c->spaces.v[i] : c->store);
   return n;
}

/* The handler's current settings (a reload may change them): its
 * max_attempts and the retry delay after attempt `attempt`.  A handler a
 * reload removed keeps one attempt and no delay. */
static void
handler_policy (consumer_t *c, const char *name, int32_t attempt, int64_t *max_attempts, int64_t *delay_ms)
{
   config_t *cfg = config_acquire ();

   *max_attempts = 1;
   *delay_ms = 0;
   for (size_t i = 0; cfg && i < cfg->n_handlers; i++) {
      const config_handler_t *h = &cfg->handlers[i];
      if (strcmp (h->name, name) != 0)
         continue;
      *max_attempts = h->max_attempts;
      if (h->n_retry_delays > 0)
         *delay_ms = delivery_backoff_ms (h->retry_delays_ms, h->n_retry_delays, attempt, delivery_rng_next (&c->rng));
   }
   config_release (cfg);
}

/* Ends a claim in failure: rescheduled after `delay_ms` (-1: the handler's
 * backoff), or buried when the attempt was the handler's last.  *dead
 * says which; *applied is false when the lease no longer held. */
static bool
charge (consumer_t *c, const held_t *h, int64_t delay_ms, const char *why, bool *dead, bool *applied, int64_t *due_at, bson_error_t *error)
{
   store_ref_t ref = ref_of (h);
   int64_t now = clock_now_ms (), max_attempts, backoff;
   store_attempt_t a = attempt_of (h, OUTBOX_ATTEMPT_FAILED, why, now);

   ref.attempt = &a;
   handler_policy (c, h->handler, h->attempt, &max_attempts, &backoff);
   *dead = h->attempt >= max_attempts;
   if (*dead) {
      *due_at = 0;
      return store_bury (store_of (c, h->handler), &ref, now, why, applied, error);
   }
   *due_at = now + (delay_ms >= 0 ? delay_ms : backoff);
   return store_reschedule (store_of (c, h->handler), &ref, now, *due_at, why, applied, error);
}

/* --- the operations ------------------------------------------------------ */

/* The handler's format options in `fo`, from `cfg` (which the caller
 * holds while it uses them); false when it is relaybus, which shapes a
 * delivery by its fields alone. */
static bool
handler_format (const config_t *cfg, const char *name, format_opts_t *fo)
{
   for (size_t i = 0; cfg && i < cfg->n_handlers; i++)
      if (!strcmp (cfg->handlers[i].name, name)) {
         format_opts_from_handler (fo, &cfg->handlers[i]);
         return fo->format != HANDLER_FORMAT_RELAYBUS;
      }
   return false;
}

/* The rendered part of a pull delivery (format != relaybus): `body` (the
 * text a broker would carry), `contentType`, and in CloudEvents' binary
 * mode the context attributes as `attributes`. */
static void
append_rendered (bson_t *doc, const store_delivery_t *d, const format_opts_t *fo)
{
   format_msg_t m;
   bson_error_t err;
   bson_t attrs;

   if (!format_render (fo, FORMAT_BINDING_PULL, d, &m, &err)) {
      format_msg_fini (&m);
      return;
   }
   bson_append_utf8 (doc, "body", 4, m.body, (int) m.body_len);
   BSON_APPEND_UTF8 (doc, "contentType", m.content_type);
   if (fo->format == HANDLER_FORMAT_CLOUDEVENTS) {
      BSON_APPEND_DOCUMENT_BEGIN (doc, "attributes", &attrs);
      for (size_t i = 0; i < m.n_headers; i++)
         BSON_APPEND_UTF8 (&attrs, m.headers[i].name, m.headers[i].value);
      bson_append_document_end (doc, &attrs);
   }
   format_msg_fini (&m);
}

/* The W3C trace context of the event, as fields of the delivery. */
static void
append_trace (bson_t *doc, const store_delivery_t *d)
{
   bson_iter_t it, hit;

   if (!d->event || !bson_iter_init_find (&it, d->event, "headers") || !BSON_ITER_HOLDS_DOCUMENT (&it) ||
       !bson_iter_recurse (&it, &hit))
      return;
   while (bson_iter_next (&hit))
      if (BSON_ITER_HOLDS_UTF8 (&hit) &&
          (!strcasecmp (bson_iter_key (&hit), "traceparent") || !strcasecmp (bson_iter_key (&hit), "tracestate")))
         bson_append_utf8 (doc, !strcasecmp (bson_iter_key (&hit), "traceparent") ? "traceparent" : "tracestate", -1,
                           bson_iter_utf8 (&hit, NULL), -1);
}

static void
append_delivery (bson_t *arr, uint32_t i, const store_delivery_t *d, const char *lease, const format_opts_t *fo)
{
   char buf[16], hex[25];
   const char *k;
   bson_t doc;
   bson_iter_t it;

   bson_uint32_to_string (i, &k, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (arr, k, &doc);
   BSON_APPEND_UTF8 (&doc, "lease", lease);
   bson_oid_to_string (&d->id, hex);
   BSON_APPEND_UTF8 (&doc, "deliveryId", hex);
   BSON_APPEND_UTF8 (&doc, "eventId", d->event_id ? d->event_id : "");
   BSON_APPEND_UTF8 (&doc, "type", d->event_type ? d->event_type : "");
   if (d->key) {
      BSON_APPEND_UTF8 (&doc, "key", d->key);
      BSON_APPEND_INT64 (&doc, "sequence", d->sequence);
   } else {
      BSON_APPEND_NULL (&doc, "key");
      BSON_APPEND_NULL (&doc, "sequence");
   }
   if (d->event && bson_iter_init_find (&it, d->event, "payload"))
      bson_append_iter (&doc, "payload", -1, &it);
   else
      BSON_APPEND_NULL (&doc, "payload");
   if (d->event && bson_iter_init_find (&it, d->event, "headers") && BSON_ITER_HOLDS_DOCUMENT (&it))
      bson_append_iter (&doc, "headers", -1, &it);
   else {
      bson_t empty = BSON_INITIALIZER;
      BSON_APPEND_DOCUMENT (&doc, "headers", &empty);
      bson_destroy (&empty);
   }
   if (d->event && bson_iter_init_find (&it, d->event, "correlationId") && BSON_ITER_HOLDS_UTF8 (&it))
      bson_append_iter (&doc, "correlationId", -1, &it);
   else
      BSON_APPEND_NULL (&doc, "correlationId");
   if (d->event && bson_iter_init_find (&it, d->event, "causationId") && BSON_ITER_HOLDS_UTF8 (&it))
      bson_append_iter (&doc, "causationId", -1, &it);
   else
      BSON_APPEND_NULL (&doc, "causationId");
   BSON_APPEND_INT32 (&doc, "attempt", d->attempt);
   BSON_APPEND_DATE_TIME (&doc, "createdAt", d->created_at);
   append_trace (&doc, d);
   if (fo)
      append_rendered (&doc, d, fo);
   bson_append_document_end (arr, &doc);
}

/* Claims for r.  True when r was answered (deliveries, an empty batch past
 * its wait, or an error); false when nothing was due and r may wait. */
static bool
run_claim (consumer_t *c, pull_req_t *r, bool may_wait)
{
   int64_t now = clock_now_ms ();
   size_t room, limit;
   store_claim_handler_t h;
   store_claim_opts_t o;
   store_batch_t b = {0};
   bson_error_t err;
   bson_t doc = BSON_INITIALIZER, arr;
   uint32_t n = 0;
   size_t slot = counters_handler_slot (r->handler, true), n_over = 0;
   store_ref_t *over = NULL; /* the deliveries past CONSUMER_REPLY_MAX */
   char why[256];
   config_t *cfg;
   format_opts_t fo;
   bool shaped;
   store_t *st;

   room = claim_room (c, r, slot, why, sizeof why);
   if (room == 0) {
      answer_error (r, PULL_CODE_TEMPORARILY_UNAVAILABLE,
                    "relaybus: relaybusClaim: %s; complete, retry or release some first", why);
      bson_destroy (&doc);
      return true;
   }
   limit = (size_t) r->limit < room ? (size_t) r->limit : room;
   h.handler = r->handler;
   h.limit = limit;
   o = (store_claim_opts_t){.handlers = &h, .n_handlers = 1, .limit = limit, .now = now, .lease_ms = r->lease_ms, .key_run = 1};
   st = store_of (c, r->handler);
   if (!store_setup_space (st, &err)) {
      answer_error (r, PULL_CODE_INTERNAL, "relaybus: relaybusClaim: making the handler's lanes failed: %s", err.message);
      bson_destroy (&doc);
      return true;
   }
   if (!store_claim (st, &o, &b, &err)) {
      answer_error (r, PULL_CODE_INTERNAL, "relaybus: relaybusClaim: the store failed: %s", err.message);
      bson_destroy (&doc);
      return true;
   }
   if (b.n == 0 && may_wait) {
      store_batch_clear (&b);
      bson_destroy (&doc);
      return false;
   }
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   cfg = config_acquire ();
   shaped = handler_format (cfg, r->handler, &fo);
   BSON_APPEND_ARRAY_BEGIN (&doc, "deliveries", &arr);
   for (size_t i = 0; i < b.n; i++) {
      store_delivery_t *d = &b.items[i];
      held_t *hd;

      if (arr.len > CONSUMER_REPLY_MAX) {
         if (!over)
            over = bson_malloc0 (b.n * sizeof *over);
         over[n_over++] = (store_ref_t){.id = d->id, .lease = d->lease, .event_id = d->event_id};
         continue;
      }
      hd = &c->held[c->n_held++];
      memset (hd, 0, sizeof *hd);
      hd->conn = r->conn;
      bson_strncpy (hd->handler, r->handler, sizeof hd->handler);
      bson_strncpy (hd->lease.token, d->lease, sizeof hd->lease.token);
      hd->lease.id = d->id;
      pull_lease_format (d->lease, &d->id, hd->lease.text);
      hd->event_id = bson_strdup (d->event_id ? d->event_id : "");
      hd->lane = outbox_lane_id (d->key, d->event_id);
      hd->attempt = d->attempt;
      hd->claimed_at = now;
      hd->expires = now + r->lease_ms;
      hd->slot = slot;
      append_delivery (&arr, n++, d, hd->lease.text, shaped ? &fo : NULL);
   }
   bson_append_array_end (&doc, &arr);
   config_release (cfg); /* fo's source pointed into it */
   if (n_over > 0) {
      /* Given back in one transaction (they point into b: before its clear). */
      bool *applied = bson_malloc0 (n_over * sizeof *applied);
      if (!store_settle_many (st, STORE_MANY_RELEASE, over, n_over, now, 0, NULL, applied, &err))
         log_warn ("consumer: releasing %zu deliveries that did not fit in the answer (their lease runs out instead): %s",
                   n_over, err.message);
      bson_free (applied);
   }
   bson_free (over);
   store_batch_clear (&b);
   usage_track (c, r->conn, slot, false, (long) n);
   if (slot != SIZE_MAX)
      counters_add_at (COUNTER_CONSUMER_CLAIMED, slot, n);
   answer (r, &doc);
   bson_destroy (&doc);
   return true;
}

static void
append_not (bson_t *arr, uint32_t *n, const char *lease, const char *reason)
{
   char buf[16];
   const char *k;
   bson_t one;

   bson_uint32_to_string ((*n)++, &k, buf, sizeof buf);
   BSON_APPEND_DOCUMENT_BEGIN (arr, k, &one);
   BSON_APPEND_UTF8 (&one, "lease", lease);
   BSON_APPEND_UTF8 (&one, "reason", reason);
   bson_append_document_end (arr, &one);
}

static void
append_str (bson_t *arr, uint32_t *n, const char *s)
{
   char buf[16];
   const char *k;

   bson_uint32_to_string ((*n)++, &k, buf, sizeof buf);
   bson_append_utf8 (arr, k, -1, s, -1);
}

static const char *const lost_reason =
   "the lease no longer holds: it expired and the delivery was taken back, or its claim ended otherwise";

/* The answer of a command that settled r's leases in one store call:
 * ok, the leases settled (`applied`) under `yes_name`, the others, whose
 * lease no longer held, under `no_name`.  Returns how many settled. */
static uint32_t
append_settled (bson_t *doc, const pull_req_t *r, const bool *applied, const char *yes_name, const char *no_name)
{
   bson_t yes, no;
   uint32_t ny = 0, nn = 0;

   BSON_APPEND_DOUBLE (doc, "ok", 1.0);
   BSON_APPEND_ARRAY_BEGIN (doc, yes_name, &yes);
   for (size_t i = 0; i < r->n_leases; i++)
      if (applied[i])
         append_str (&yes, &ny, r->leases[i].text);
   bson_append_array_end (doc, &yes);
   BSON_APPEND_ARRAY_BEGIN (doc, no_name, &no);
   for (size_t i = 0; i < r->n_leases; i++)
      if (!applied[i])
         append_not (&no, &nn, r->leases[i].text, lost_reason);
   bson_append_array_end (doc, &no);
   return ny;
}

/* Removes the held entries of r's leases (found[] of leases_held), from
 * the last, as held_remove moves entries. */
static void
forget (consumer_t *c, const pull_req_t *r)
{
   for (size_t i = 0; i < r->n_leases; i++) {
      held_t *h = held_find (c, r->conn, r->leases[i].text);
      if (h)
         held_remove (c, h);
   }
}

static void
run_complete (consumer_t *c, pull_req_t *r)
{
   held_t **found = bson_malloc0 (r->n_leases * sizeof *found);
   store_ref_t *refs = bson_malloc0 (r->n_leases * sizeof *refs);
   bool *done = bson_malloc0 (r->n_leases * sizeof *done);
   store_attempt_t *atts = NULL;
   bson_t doc = BSON_INITIALIZER;
   uint32_t ny;
   size_t slot;
   int64_t now;
   bson_error_t err;

   if (!leases_held (c, r, found))
      goto done;
   if (r->in_txn) {
      /* In the consumer's transaction: the loop writes the completion
       * there; the claims stay held until the commit is known
       * (run_settled).  When each was handed out, and by whom, go with
       * the answer, for the attempts' records the loop writes. */
      bson_t arr;
      BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
      BSON_APPEND_ARRAY_BEGIN (&doc, "claimedAt", &arr);
      for (size_t i = 0; i < r->n_leases; i++) {
         char buf[16];
         const char *key;
         bson_uint32_to_string ((uint32_t) i, &key, buf, sizeof buf);
         BSON_APPEND_DATE_TIME (&arr, key, found[i]->claimed_at);
      }
      bson_append_array_end (&doc, &arr);
      BSON_APPEND_UTF8 (&doc, "instance", worker_owner (c->w));
      answer (r, &doc);
      goto done;
   }
   now = clock_now_ms ();
   atts = bson_malloc0 (r->n_leases * sizeof *atts);
   for (size_t i = 0; i < r->n_leases; i++) {
      refs[i] = ref_of (found[i]);
      atts[i] = attempt_of (found[i], OUTBOX_ATTEMPT_SUCCEEDED, NULL, now);
      refs[i].attempt = &atts[i];
   }
   if (!store_complete_many (store_of (c, r->handler), refs, r->n_leases, now, done, &err)) {
      /* The leases stay held: the consumer may complete them again. */
      answer_error (r, PULL_CODE_INTERNAL, "relaybus: relaybusComplete: the store failed: %s", err.message);
      goto done;
   }
   ny = append_settled (&doc, r, done, "completed", "notCompleted");
   slot = counters_handler_slot (r->handler, true);
   if (slot != SIZE_MAX)
      counters_add_at (COUNTER_CONSUMER_COMPLETED, slot, ny);
   for (size_t i = 0; i < r->n_leases; i++)
      if (done[i])
         attempt_observe (found[i], OUTBOX_ATTEMPT_SUCCEEDED, now);
   forget (c, r);
   answer (r, &doc);
done:
   bson_destroy (&doc);
   bson_free (found);
   bson_free (refs);
   bson_free (atts);
   bson_free (done);
}

/* relaybusRetry and relaybusBury: one lease. */
static void
run_fail (consumer_t *c, pull_req_t *r)
{
   held_t *found[1];
   bson_t doc = BSON_INITIALIZER;
   bson_error_t err;
   bool dead = false, applied = false, ok;
   int64_t due_at = 0;
   const char *why = r->error_text ? r->error_text : (r->op == PULL_BURY ? "buried by the consumer" : "retried by the consumer");

   RELAYBUS_ASSERT (r->n_leases == 1);
   if (!leases_held (c, r, found))
      goto done;
   if (r->op == PULL_BURY) {
      store_ref_t ref = ref_of (found[0]);
      int64_t now = clock_now_ms ();
      store_attempt_t a = attempt_of (found[0], OUTBOX_ATTEMPT_FAILED, why, now);
      ref.attempt = &a;
      dead = true;
      ok = store_bury (store_of (c, r->handler), &ref, now, why, &applied, &err);
   } else {
      ok = charge (c, found[0], r->delay_ms, why, &dead, &applied, &due_at, &err);
   }
   if (ok && applied)
      attempt_observe (found[0], OUTBOX_ATTEMPT_FAILED, clock_now_ms ());
   if (!ok) {
      answer_error (r, PULL_CODE_INTERNAL, "relaybus: %s: the store failed: %s", pull_op_name (r->op), err.message);
      goto done;
   }
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   BSON_APPEND_BOOL (&doc, "applied", applied);
   if (applied) {
      BSON_APPEND_UTF8 (&doc, "status", dead ? "dead" : "pending");
      if (!dead)
         BSON_APPEND_DATE_TIME (&doc, "dueAt", due_at);
   } else {
      BSON_APPEND_UTF8 (&doc, "reason", lost_reason);
   }
   held_remove (c, found[0]);
   answer (r, &doc);
done:
   bson_destroy (&doc);
}

static void
run_extend (consumer_t *c, pull_req_t *r)
{
   held_t **found = bson_malloc0 (r->n_leases * sizeof *found);
   store_ref_t *refs = bson_malloc0 (r->n_leases * sizeof *refs);
   bool *applied = bson_malloc0 (r->n_leases * sizeof *applied);
   int64_t now = clock_now_ms ();
   bson_t doc = BSON_INITIALIZER, yes, no;
   uint32_t ny = 0, nn = 0;
   bson_error_t err;

   if (!leases_held (c, r, found))
      goto done;
   for (size_t i = 0; i < r->n_leases; i++)
      refs[i] = ref_of (found[i]);
   /* Every lease in one transaction of three commands (store_extend_many:
    * the claim generations checked as extendLease does), so a 1,000-lease
    * extend costs the consumer thread, and the consumers queued behind
    * it, one store round of a few milliseconds, not 1,000 transactions.
    * When it fails, every lease is reported as not extended and stays held
    * (it may still hold). */
   if (!store_extend_many (store_of (c, r->handler), refs, r->n_leases, now, r->lease_ms, applied, &err)) {
      log_warn ("consumer: c%" PRIu64 " relaybusExtend of %zu leases: %s", r->conn, r->n_leases, err.message);
      for (size_t i = 0; i < r->n_leases; i++) {
         applied[i] = false;
         found[i] = NULL;
      }
   }
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   BSON_APPEND_ARRAY_BEGIN (&doc, "extended", &yes);
   for (size_t i = 0; i < r->n_leases; i++)
      if (applied[i]) {
         append_str (&yes, &ny, r->leases[i].text);
         if (found[i]->expires < now + r->lease_ms)
            found[i]->expires = now + r->lease_ms;
      }
   bson_append_array_end (&doc, &yes);
   BSON_APPEND_ARRAY_BEGIN (&doc, "notExtended", &no);
   for (size_t i = 0; i < r->n_leases; i++)
      if (!applied[i])
         append_not (&no, &nn, r->leases[i].text, found[i] ? lost_reason : "the store failed; the lease may still hold");
   bson_append_array_end (&doc, &no);
   BSON_APPEND_DATE_TIME (&doc, "leaseExpiresAt", now + r->lease_ms);
   /* A lease that did not hold is over: forget it. */
   for (size_t i = r->n_leases; i-- > 0;)
      if (!applied[i] && found[i]) {
         held_t *h = held_find (c, r->conn, r->leases[i].text);
         if (h)
            held_remove (c, h);
      }
   answer (r, &doc);
done:
   bson_destroy (&doc);
   bson_free (found);
   bson_free (refs);
   bson_free (applied);
}

static void
run_release (consumer_t *c, pull_req_t *r)
{
   held_t **found = bson_malloc0 (r->n_leases * sizeof *found);
   bool *applied = bson_malloc0 (r->n_leases * sizeof *applied);
   store_ref_t *refs = NULL;
   store_attempt_t *atts = NULL;
   int64_t now = clock_now_ms ();
   bson_t doc = BSON_INITIALIZER;
   bson_error_t err;

   if (!leases_held (c, r, found))
      goto done;
   refs = bson_malloc0 (r->n_leases * sizeof *refs);
   atts = bson_malloc0 (r->n_leases * sizeof *atts);
   for (size_t i = 0; i < r->n_leases; i++) {
      refs[i] = ref_of (found[i]);
      atts[i] = attempt_of (found[i], OUTBOX_ATTEMPT_RELEASED, NULL, now);
      refs[i].attempt = &atts[i];
   }
   /* All of them in one transaction (store_settle_many), not one each. */
   if (!store_settle_many (store_of (c, r->handler), STORE_MANY_RELEASE, refs, r->n_leases, now, 0, NULL, applied, &err)) {
      /* Nothing was released: the leases stay held. */
      answer_error (r, PULL_CODE_INTERNAL, "relaybus: relaybusRelease: the store failed (nothing was released): %s",
                    err.message);
      goto done;
   }
   append_settled (&doc, r, applied, "released", "notReleased");
   for (size_t i = 0; i < r->n_leases; i++)
      if (applied[i])
         attempt_observe (found[i], OUTBOX_ATTEMPT_RELEASED, now);
   forget (c, r);
   answer (r, &doc);
done:
   bson_destroy (&doc);
   bson_free (found);
   bson_free (applied);
   bson_free (refs);
   bson_free (atts);
}

static void
run_status (consumer_t *c, pull_req_t *r)
{
   store_handler_stats_t *v = NULL, *hs = NULL;
   size_t n = 0, running = 0, waiting = 0, n_conns = 0, n_lanes = 0;
   uint64_t *conns = NULL;
   bool lanes[OUTBOX_LANES] = {false};
   int64_t now = clock_now_ms ();
   bson_t doc = BSON_INITIALIZER;
   bson_error_t err;
   config_t *cfg = config_acquire ();
   const char *kind = "pull";

   if (!store_handler_stats (c->store, &v, &n, &err)) {
      answer_error (r, PULL_CODE_INTERNAL, "relaybus: relaybusStatus: the store failed: %s", err.message);
      goto done;
   }
   for (size_t i = 0; i < n; i++)
      if (strcmp (v[i].name, r->handler) == 0)
         hs = &v[i];
   for (size_t i = 0; cfg && i < cfg->n_handlers; i++)
      if (strcmp (cfg->handlers[i].name, r->handler) == 0)
         kind = cfg->handlers[i].kind;
   conns = bson_malloc0 ((c->n_held + c->n_waiting + 1) * sizeof *conns);
   for (size_t i = 0; i < c->n_held + c->n_waiting; i++) {
      uint64_t conn;
      bool counted = false;
      if (i < c->n_held) {
         const held_t *h = &c->held[i];
         if (strcmp (h->handler, r->handler) != 0 || h->expires <= now)
            continue;
         running++;
         if (h->lane < OUTBOX_LANES && !lanes[h->lane]) {
            lanes[h->lane] = true;
            n_lanes++;
         }
         conn = h->conn;
      } else {
         const pull_req_t *w = c->waiting[i - c->n_held].r;
         if (strcmp (w->handler, r->handler) != 0)
            continue;
         waiting++;
         conn = w->conn;
      }
      for (size_t j = 0; j < n_conns; j++)
         counted = counted || conns[j] == conn;
      if (!counted)
         conns[n_conns++] = conn;
   }
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   BSON_APPEND_UTF8 (&doc, "handler", r->handler);
   BSON_APPEND_UTF8 (&doc, "kind", kind);
   {
      int64_t pending = hs ? hs->pending : 0, parked = hs ? hs->parked : 0;
      int64_t due = pending - parked - (int64_t) running;
      BSON_APPEND_INT64 (&doc, "pending", pending);
      BSON_APPEND_INT64 (&doc, "due", due > 0 ? due : 0);
      BSON_APPEND_INT64 (&doc, "running", (int64_t) running);
      BSON_APPEND_INT64 (&doc, "parked", parked);
      BSON_APPEND_INT64 (&doc, "dead", hs ? hs->dead : 0);
   }
   if (hs && hs->oldest_due_at > 0)
      BSON_APPEND_DATE_TIME (&doc, "oldestDueAt", hs->oldest_due_at);
   else
      BSON_APPEND_NULL (&doc, "oldestDueAt");
   BSON_APPEND_INT64 (&doc, "consumers", (int64_t) n_conns);
   BSON_APPEND_INT64 (&doc, "lanesHeld", (int64_t) n_lanes);
   BSON_APPEND_INT64 (&doc, "waiting", (int64_t) waiting);
   answer (r, &doc);
done:
   bson_destroy (&doc);
   bson_free (conns);
   bson_free (v);
   config_release (cfg);
}

/* The transaction that completed r's leases committed: the claims are
 * over.  The ones this connection no longer holds (its close was handled
 * first) are skipped. */
static void
run_settled (consumer_t *c, pull_req_t *r)
{
   size_t n = 0, slot = counters_handler_slot (r->handler, true);

   for (size_t i = 0; i < r->n_leases; i++) {
      held_t *h = held_find (c, r->conn, r->leases[i].text);
      if (!h || strcmp (h->handler, r->handler) != 0)
         continue;
      n++; /* its event's completion time waits for its second's (store.h) */
      store_settled_elsewhere (store_of (c, r->handler), &h->lease.id, (const char *const *) &h->event_id, 1, clock_now_ms ());
      attempt_observe (h, OUTBOX_ATTEMPT_SUCCEEDED, clock_now_ms ());
      held_remove (c, h);
   }
   if (slot != SIZE_MAX)
      counters_add_at (COUNTER_CONSUMER_COMPLETED_TXN, slot, n);
}

/* Charges one run of a closed connection's claims (`kind`: buried or due
 * again) in one transaction; ok[i] tells which landed (applied[i]: which
 * still held).  A transaction fails as a whole when one delivery of the
 * run is held by another open transaction (the killed consumer's own,
 * which completed it): with `split`, each claim of a failed run is then
 * charged alone, so that only that one is owed and the others are due
 * again at once, not after the dead transaction's lifetime.  Only on the
 * first charge of a close: the owed ones are retried as one run (they wait
 * on dead transactions, all of them). */
/* The lastError and the attempt's error of a claim a closed connection
 * held. */
static const char *const closed_why = "the consumer's connection closed with the delivery claimed";

static void
charge_run (consumer_t *c,
            uint64_t conn,
            const char *handler,
            store_many_kind_t kind,
            const store_ref_t *refs,
            size_t n,
            int64_t now,
            bool split,
            bool *applied,
            bool *ok)
{
   const char *const why = closed_why;
   const char *what = kind == STORE_MANY_BURY ? "burying" : "charging";
   int64_t due_at = kind == STORE_MANY_BURY ? 0 : now;
   size_t failed = 0;
   bson_error_t err;

   store_t *store = store_of (c, handler);

   if (store_settle_many (store, kind, refs, n, now, due_at, why, applied, &err)) {
      for (size_t i = 0; i < n; i++)
         ok[i] = true;
      return;
   }
   if (!split || n == 1) {
      log_info ("consumer: c%" PRIu64 " closed: %s %zu claims failed (retried later): %s", conn, what, n, err.message);
      return;
   }
   for (size_t i = 0; i < n; i++) {
      ok[i] = store_settle_many (store, kind, refs + i, 1, now, due_at, why, applied + i, &err);
      failed += !ok[i];
   }
   if (failed > 0)
      log_info ("consumer: c%" PRIu64 " closed: %s %zu of %zu claims failed (retried later): %s", conn, what, failed, n,
                err.message);
}

/* Up to CONSUMER_CLOSE_SLICE claims of connection `conn` (the ones it
 * still owes with `owed`, a retry; the others on its close), charged one
 * attempt each: due now, or dead at the handler's last attempt.  Two
 * transactions at most (store_settle_many: the ones buried, the ones
 * rescheduled), not one per claim.  A transaction that fails (a consumer
 * killed after relaybusComplete inside its own transaction still holds
 * that delivery: a WriteConflict, at once) is split (charge_run): the
 * claims that still fail alone are owed: they stay held, and the retry list charges them once that
 * transaction is gone (the server aborts it, at the latest at its
 * lifetime), so every claim that ends without a completion is charged
 * once, and no consumer waits for it meanwhile.  The other claims of the
 * slice are forgotten; true when the connection holds more of the kind
 * asked for. */
static bool
charge_closed (consumer_t *c, uint64_t conn, bool owed, size_t *charged, size_t *dead, size_t *lost)
{
   size_t n = 0, n_dead = 0, n_due = 0;
   held_t **mine;
   store_ref_t *refs;
   store_attempt_t *atts;
   bool *applied, *is_dead, *ok;
   int64_t now = clock_now_ms ();
   const char *handler = NULL;
   char handler_buf[sizeof c->held[0].handler];

   /* One handler's claims per slice: they settle in its lane space. */
   for (size_t i = 0; i < c->n_held; i++)
      if (c->held[i].conn == conn && c->held[i].owed == owed) {
         if (!handler) {
            bson_strncpy (handler_buf, c->held[i].handler, sizeof handler_buf);
            handler = handler_buf;
         }
         n += !strcmp (c->held[i].handler, handler);
      }
   if (n == 0)
      return false;
   if (n > CONSUMER_CLOSE_SLICE)
      n = CONSUMER_CLOSE_SLICE;
   mine = bson_malloc0 (n * sizeof *mine);
   refs = bson_malloc0 (n * sizeof *refs);
   atts = bson_malloc0 (n * sizeof *atts);
   applied = bson_malloc0 (n * sizeof *applied);
   is_dead = bson_malloc0 (n * sizeof *is_dead);
   /* The slice: the first n claims of the connection, in two runs of
    * refs[] (and mine[], is_dead[]): the ones at their handler's last
    * attempt (buried), then the others (due again). */
   {
      held_t **found = bson_malloc0 (n * sizeof *found);
      bool *last = bson_malloc0 (n * sizeof *last);
      size_t seen = 0, a = 0, b;

      for (size_t i = 0; i < c->n_held && seen < n; i++)
         if (c->held[i].conn == conn && c->held[i].owed == owed && !strcmp (c->held[i].handler, handler)) {
            int64_t max_attempts, backoff;
            handler_policy (c, c->held[i].handler, c->held[i].attempt, &max_attempts, &backoff);
            last[seen] = c->held[i].attempt >= max_attempts;
            n_dead += last[seen];
            found[seen++] = &c->held[i];
         }
      b = n_dead;
      for (size_t i = 0; i < n; i++) {
         size_t at = last[i] ? a++ : b++;
         mine[at] = found[i];
         is_dead[at] = last[i];
         refs[at] = ref_of (found[i]);
         atts[at] = attempt_of (found[i], OUTBOX_ATTEMPT_LEASE_LOST, closed_why, now);
         refs[at].attempt = &atts[at];
      }
      bson_free (found);
      bson_free (last);
   }
   n_due = n - n_dead;
   ok = bson_malloc0 (n * sizeof *ok);
   if (n_dead > 0)
      charge_run (c, conn, handler, STORE_MANY_BURY, refs, n_dead, now, !owed, applied, ok);
   if (n_due > 0)
      charge_run (c, conn, handler, STORE_MANY_RESCHEDULE, refs + n_dead, n_due, now, !owed, applied + n_dead, ok + n_dead);
   for (size_t i = 0; i < n; i++) {
      if (!ok[i]) {
         /* Owed: kept, charged by the retry list. */
         if (!mine[i]->owed)
            counters_add (COUNTER_CONSUMER_CHARGES_RETRIED, 1);
         mine[i]->owed = true;
         continue;
      }
      if (!applied[i])
         (*lost)++;
      else if (is_dead[i])
         (*dead)++;
      else
         (*charged)++;
      if (applied[i] && mine[i]->slot != SIZE_MAX)
         counters_add_at (COUNTER_CONSUMER_CLOSED_CHARGED, mine[i]->slot, 1);
      if (applied[i])
         attempt_observe (mine[i], OUTBOX_ATTEMPT_LEASE_LOST, now);
      mine[i]->conn = CONSUMER_CONN_CHARGED;
   }
   /* Forgotten last (refs[] points into the entries, and held_remove
    * moves them): marked above, then removed in one pass from the end. */
   for (size_t i = c->n_held; i-- > 0;)
      if (c->held[i].conn == CONSUMER_CONN_CHARGED) {
         c->held[i].conn = conn; /* for the usage counts */
         held_remove (c, &c->held[i]);
      }
   bson_free (mine);
   bson_free (refs);
   bson_free (atts);
   bson_free (applied);
   bson_free (is_dead);
   bson_free (ok);
   for (size_t i = 0; i < c->n_held; i++)
      if (c->held[i].conn == conn && c->held[i].owed == owed)
         return true;
   return false;
}

/* Connection `conn` closed: its long polls go, and every claim it holds
 * is charged one attempt (rescheduled due now, or buried at the last), a
 * slice at a time.  True when claims remain for another turn. */
static bool
run_closed (consumer_t *c, uint64_t conn)
{
   size_t charged = 0, dead = 0, lost = 0;
   bool more;

   for (size_t i = c->n_waiting; i-- > 0;)
      if (c->waiting[i].r->conn == conn)
         waiting_remove (c, i);
   more = charge_closed (c, conn, false, &charged, &dead, &lost);
   /* The lanes stay this instance's until their lease ends, which would
    * keep other proxies away from their deliveries: when no consumer of
    * this proxy holds a claim any more, every lane is handed back now. */
   if (!more && charged + dead + lost > 0 && c->n_held == 0) {
      /* (Owed charges keep their lanes: store_relinquish would release
       * their deliveries with no attempt charged.) */
      char when[48];
      bson_snprintf (when, sizeof when, "c%" PRIu64 " closed: ", conn);
      relinquish_all (c, when);
   }
   if (charged + dead + lost > 0)
      log_info ("consumer: c%" PRIu64 " closed holding claims: %zu due again with one attempt charged, %zu dead, %zu "
                "no longer held%s",
                conn, charged, dead, lost, more ? " (more charged next turn)" : "");
   return more;
}

/* --- the retry list ------------------------------------------------------ */

/* Store work put off so that no consumer waits on another's open
 * transaction: the charges closed connections owe (held_t.owed; bounded by
 * CONSUMER_MAX_CLAIMS) and the events' completion times the store deferred
 * (its bounded list); one connection's owed charges per turn. */
static void
retry_arm (consumer_t *c)
{
   struct timeval tv = clock_timeval_ms (CONSUMER_RETRY_MS);
   bool owed = false;

   for (size_t i = 0; i < c->n_held && !owed; i++)
      owed = c->held[i].owed;
   if ((owed || deferred_count (c) > 0) && !evtimer_pending (c->retry_ev, NULL))
      evtimer_add (c->retry_ev, &tv);
}

static void
retry_cb (evutil_socket_t fd, short what, void *arg)
{
   consumer_t *c = arg;
   size_t charged = 0, dead = 0, lost = 0;
   int64_t now = clock_mono_ms ();

   (void) fd;
   (void) what;
   store_spaces_write_completion_times (&c->spaces, clock_now_ms (), false); /* held ones, and a second's once over */
   for (size_t i = 0; i < c->n_held && now >= c->owed_at; i++)
      if (c->held[i].owed) {
         uint64_t conn = c->held[i].conn;
         (void) charge_closed (c, conn, true, &charged, &dead, &lost);
         if (charged + dead + lost > 0)
            log_info ("consumer: c%" PRIu64 " (closed): owed charges landed: %zu due again with one attempt charged, "
                      "%zu dead, %zu no longer held",
                      conn, charged, dead, lost);
         /* None landed: the transaction that holds them lives on (up to its
          * lifetime); 250 ms, 750 ms, 1.75 s ... 8 s until one does. */
         c->owed_wait_ms = charged + dead + lost > 0 ? 0 : BSON_MIN (2 * c->owed_wait_ms + CONSUMER_RETRY_MS, CONSUMER_OWED_MAX_MS);
         c->owed_at = now + c->owed_wait_ms;
         break;
      }
   if (charged + dead + lost > 0 && c->n_held == 0) {
      /* As run_closed: no consumer holds a claim, the lanes go back. */
      relinquish_all (c, "");
   }
   retry_arm (c);
}

/* Forgets the claims whose lease ended CONSUMER_EXPIRED_KEEP_MS ago: the
 * store takes them back at its next claim, and settling them could only
 * fail. */
static void
tidy_cb (evutil_socket_t fd, short what, void *arg)
{
   consumer_t *c = arg;
   int64_t now = clock_now_ms ();

   (void) fd;
   (void) what;
   for (size_t i = c->n_held; i-- > 0;)
      if (c->held[i].expires + CONSUMER_EXPIRED_KEEP_MS < now)
         held_remove (c, &c->held[i]);
}

/* --- long polls ---------------------------------------------------------- */

static void
poll_arm (consumer_t *c)
{
   int64_t now = clock_mono_ms (), ms;
   config_t *cfg;
   struct timeval tv;

   if (c->n_waiting == 0) {
      evtimer_del (c->poll_ev);
      return;
   }
   cfg = config_acquire ();
   ms = cfg ? cfg->poll_interval_ms : 1000;
   config_release (cfg);
   for (size_t i = 0; i < c->n_waiting; i++)
      if (c->waiting[i].deadline - now < ms)
         ms = c->waiting[i].deadline - now;
   tv = clock_timeval_ms (ms > 0 ? ms : 0);
   evtimer_add (c->poll_ev, &tv);
}

/* Every waiting claim looks again; the ones past their deadline get an
 * empty batch.  A handler one claim found nothing for is not asked again
 * in the same pass: a wake-up costs one claim per handler with nothing
 * due, not one per waiting consumer. */
static void
poll_all (consumer_t *c)
{
   int64_t now = clock_mono_ms ();
   const char *dry[CONSUMER_MAX_WAITING];
   size_t n_dry = 0;

   for (size_t i = 0; i < c->n_waiting;) {
      waiting_t *w = &c->waiting[i];
      bool expired = w->deadline <= now, skip = false;

      for (size_t j = 0; !expired && j < n_dry && !skip; j++)
         skip = strcmp (dry[j], w->r->handler) == 0;
      if (skip) {
         i++;
         continue;
      }
      if (run_claim (c, w->r, !expired)) {
         waiting_remove (c, i);
         continue;
      }
      /* Still waiting: w->r (and its handler) stays in the list. */
      dry[n_dry++] = w->r->handler;
      i++;
   }
   poll_arm (c);
}

static void
poll_cb (evutil_socket_t fd, short what, void *arg)
{
   (void) fd;
   (void) what;
   poll_all (arg);
}

static void
wake_cb (evutil_socket_t fd, short what, void *arg)
{
   consumer_t *c = arg;

   (void) fd;
   (void) what;
   atomic_store (&c->wake_pending, false);
   if (c->n_waiting > 0)
      poll_all (c);
}

/* The proxy drains its connections: every waiting claim is answered now
 * (an empty batch) instead of holding its connection open. */
static void
drain_cb (evutil_socket_t fd, short what, void *arg)
{
   consumer_t *c = arg;

   (void) fd;
   (void) what;
   for (size_t i = 0; i < c->n_waiting; i++)
      c->waiting[i].deadline = 0;
   if (c->n_waiting > 0)
      poll_all (c);
}

/* --- the inbox ------------------------------------------------------------ */

static void
in_push (consumer_t *c, pull_req_t *r)
{
   r->next = NULL;
   if (c->in_tail)
      c->in_tail->next = r;
   else
      c->in_head = r;
   c->in_tail = r;
}

static void
run (consumer_t *c, pull_req_t *r)
{
   switch ((int) r->op) {
   case PULL_CLAIM:
   {
      bool may_wait = r->await_ms > 0 && !atomic_load (&c->draining);
      char why[256];

      /* Past its connection's or handler's share, a long poll is refused
       * before it costs a store claim: a flood of them then costs this
       * thread nothing, and the other consumers' requests queued behind
       * it are answered in time.  Past the proxy's own bound it claims
       * first, as before the shares: what is due is still handed out. */
      if (may_wait && !poll_share (c, r, why, sizeof why)) {
         answer_error (r, PULL_CODE_TEMPORARILY_UNAVAILABLE, "relaybus: relaybusClaim: %s; claim again later", why);
         break;
      }
      if (run_claim (c, r, may_wait))
         break;
      if (c->n_waiting == CONSUMER_MAX_WAITING) {
         answer_error (r, PULL_CODE_TEMPORARILY_UNAVAILABLE,
                       "relaybus: relaybusClaim: %d long polls wait already on this proxy; claim again later",
                       CONSUMER_MAX_WAITING);
         break;
      }
   }
      waiting_add (c, r);
      poll_arm (c);
      return; /* kept */
   case PULL_COMPLETE:
      run_complete (c, r);
      break;
   case PULL_RETRY:
   case PULL_BURY:
      run_fail (c, r);
      break;
   case PULL_EXTEND:
      run_extend (c, r);
      break;
   case PULL_RELEASE:
      run_release (c, r);
      break;
   case PULL_STATUS:
      run_status (c, r);
      break;
   case CONSUMER_OP_CLOSED:
      if (run_closed (c, r->conn)) {
         /* The rest on the next turn, behind what was queued meanwhile. */
         pthread_mutex_lock (&c->mu);
         in_push (c, r);
         pthread_mutex_unlock (&c->mu);
         event_active (c->in_ev, 0, 0);
         return; /* kept */
      }
      break;
   case CONSUMER_OP_SETTLED:
      run_settled (c, r);
      break;
   default:
      RELAYBUS_ASSERT (!"unknown pull operation");
      break;
   }
   pull_req_destroy (r);
   retry_arm (c);
}

/* Does a request of connection `conn` wait in `list`? */
static bool
conn_waits (const pull_req_t *list, uint64_t conn)
{
   for (; list; list = list->next)
      if (list->conn == conn)
         return true;
   return false;
}

/* One turn of the inbox runs one request per handler: the first queued
 * request of each handler, in queue order, and one close notice whose
 * connection has no request left before it (a connection's close comes
 * after its requests).  What is left goes back to the front of the queue, before
 * what arrives meanwhile, and the next turn follows at once.  So requests
 * of one handler, however many of its consumers flood the queue, take
 * turns with the others': another handler's request waits for at most one
 * request of each handler, not for the whole queue.  Per handler, and so
 * per connection and handler, the order is kept. */
static void
in_cb (evutil_socket_t fd, short what, void *arg)
{
   consumer_t *c = arg;
   pull_req_t *list, *rest = NULL, **rest_tail = &rest, *turn = NULL, **turn_tail = &turn, *r, *next;
   bool taken[COUNTERS_MAX_HANDLERS + 1] = {false}, taken_close = false;

   (void) fd;
   (void) what;
   pthread_mutex_lock (&c->mu);
   list = c->in_head;
   c->in_head = c->in_tail = NULL;
   pthread_mutex_unlock (&c->mu);
   for (r = list; r; r = next) {
      bool now;
      next = r->next;
      r->next = NULL;
      if (r->op == (pull_op_t) CONSUMER_OP_CLOSED) {
         /* One close per turn, and only once none of its connection's
          * requests waits before it. */
         now = !taken_close && !conn_waits (rest, r->conn);
         taken_close = taken_close || now;
      } else {
         size_t slot = counters_handler_slot (r->handler, false);
         if (slot > COUNTERS_MAX_HANDLERS)
            slot = COUNTERS_MAX_HANDLERS; /* no slot: one bucket for all of them */
         now = !taken[slot];
         taken[slot] = true;
      }
      if (now) {
         *turn_tail = r;
         turn_tail = &r->next;
      } else {
         *rest_tail = r;
         rest_tail = &r->next;
      }
   }
   if (rest) {
      /* Back to the front, before what arrived meanwhile. */
      pull_req_t *last = rest;
      while (last->next)
         last = last->next;
      pthread_mutex_lock (&c->mu);
      last->next = c->in_head;
      c->in_head = rest;
      if (!c->in_tail)
         c->in_tail = last;
      pthread_mutex_unlock (&c->mu);
      event_active (c->in_ev, 0, 0);
   }
   for (r = turn; r; r = next) {
      next = r->next;
      r->next = NULL;
      if (r->op < PULL_OP_COUNT_) {
         size_t slot = counters_handler_slot (r->handler, false);
         pthread_mutex_lock (&c->mu);
         RELAYBUS_ASSERT (c->n_in > 0);
         c->n_in--;
         if (slot < COUNTERS_MAX_HANDLERS && c->in_by_slot[slot] > 0)
            c->in_by_slot[slot]--;
         pthread_mutex_unlock (&c->mu);
      }
      run (c, r);
   }
}

bool
consumer_submit (pull_req_t *r, bson_error_t *error)
{
   consumer_t *c;
   size_t slot;
   bool ok = false;

   pthread_mutex_lock (&g_mu);
   c = g_c;
   if (!c) {
      bson_set_error (error, PULL_ERROR_DOMAIN, PULL_CODE_INTERNAL,
                      "relaybus: %s: no consumer thread runs (the proxy started without a kind = pull handler; "
                      "restart it to consume one a reload added)",
                      pull_op_name (r->op));
      goto done;
   }
   slot = counters_handler_slot (r->handler, true);
   pthread_mutex_lock (&c->mu);
   if (c->n_in >= CONSUMER_QUEUE_MAX) {
      pthread_mutex_unlock (&c->mu);
      bson_set_error (error, PULL_ERROR_DOMAIN, PULL_CODE_TEMPORARILY_UNAVAILABLE,
                      "relaybus: %s: %d consumer requests wait already; try again", pull_op_name (r->op),
                      CONSUMER_QUEUE_MAX);
      goto done;
   }
   /* A connection has at most CLIENT_MAX_INFLIGHT (16) requests in flight,
    * well inside a quarter of the queue; many connections of one handler
    * are held to half of it, so the others' requests still get in. */
   if (slot < COUNTERS_MAX_HANDLERS && c->in_by_slot[slot] >= CONSUMER_HANDLER_MAX_QUEUED) {
      pthread_mutex_unlock (&c->mu);
      bson_set_error (error, PULL_ERROR_DOMAIN, PULL_CODE_TEMPORARILY_UNAVAILABLE,
                      "relaybus: %s: %d requests for handler '%s' wait already (a handler's share: half of the "
                      "consumer queue's %d); try again",
                      pull_op_name (r->op), CONSUMER_HANDLER_MAX_QUEUED, r->handler, CONSUMER_QUEUE_MAX);
      goto done;
   }
   in_push (c, r);
   c->n_in++;
   if (slot < COUNTERS_MAX_HANDLERS)
      c->in_by_slot[slot]++;
   pthread_mutex_unlock (&c->mu);
   event_active (c->in_ev, 0, 0);
   ok = true;
done:
   pthread_mutex_unlock (&g_mu);
   return ok;
}

void
consumer_closed (uint64_t conn)
{
   consumer_t *c;

   pthread_mutex_lock (&g_mu);
   c = g_c;
   if (c) {
      pull_req_t *r = bson_malloc0 (sizeof *r);
      r->op = (pull_op_t) CONSUMER_OP_CLOSED;
      r->conn = conn;
      pthread_mutex_lock (&c->mu);
      in_push (c, r);
      pthread_mutex_unlock (&c->mu);
      event_active (c->in_ev, 0, 0);
   }
   pthread_mutex_unlock (&g_mu);
}

void
consumer_settled (pull_req_t *r)
{
   consumer_t *c;

   pthread_mutex_lock (&g_mu);
   c = g_c;
   if (c) {
      r->op = (pull_op_t) CONSUMER_OP_SETTLED;
      pthread_mutex_lock (&c->mu);
      in_push (c, r);
      pthread_mutex_unlock (&c->mu);
      event_active (c->in_ev, 0, 0);
      r = NULL;
   }
   pthread_mutex_unlock (&g_mu);
   pull_req_destroy (r);
}

void
consumer_drain (void)
{
   consumer_t *c;

   pthread_mutex_lock (&g_mu);
   c = g_c;
   if (c && !atomic_exchange (&c->draining, true))
      event_active (c->drain_ev, 0, 0);
   pthread_mutex_unlock (&g_mu);
}

void
consumer_wake (void)
{
   consumer_t *c;

   pthread_mutex_lock (&g_mu);
   c = g_c;
   if (c && !atomic_exchange (&c->wake_pending, true))
      event_active (c->wake_ev, 0, 0);
   pthread_mutex_unlock (&g_mu);
}

/* --- start and stop ------------------------------------------------------- */

/* At stop, the charges closed connections still owe (held_t.owed) are
 * retried for at most CONSUMER_STOP_CHARGE_MS, every CONSUMER_RETRY_MS:
 * the lanes are handed back after, and a hand-back releases what they
 * list with no attempt charged.  Blocking here is this thread's own time
 * (nothing more is answered).  Returns how many are still owed. */
static size_t
stop_charge_owed (consumer_t *c)
{
   int64_t until = clock_mono_ms () + CONSUMER_STOP_CHARGE_MS;
   size_t owed = 0;

   for (;;) {
      size_t charged = 0, dead = 0, lost = 0, n_conns = 0;
      uint64_t *conns = bson_malloc0 ((c->n_held ? c->n_held : 1) * sizeof *conns);

      /* One slice per connection per round (charge_closed changes held). */
      for (size_t i = 0; i < c->n_held; i++) {
         bool seen = false;
         if (!c->held[i].owed)
            continue;
         for (size_t k = 0; k < n_conns && !seen; k++)
            seen = conns[k] == c->held[i].conn;
         if (!seen)
            conns[n_conns++] = c->held[i].conn;
      }
      for (size_t k = 0; k < n_conns; k++)
         (void) charge_closed (c, conns[k], true, &charged, &dead, &lost);
      bson_free (conns);
      if (charged + dead + lost > 0)
         log_info ("consumer: stopping: owed charges landed: %zu due again with one attempt charged, %zu dead, %zu no "
                   "longer held",
                   charged, dead, lost);
      owed = 0;
      for (size_t i = 0; i < c->n_held; i++)
         owed += c->held[i].owed;
      if (owed == 0 || clock_mono_ms () + CONSUMER_RETRY_MS > until)
         return owed;
      clock_sleep_ms (CONSUMER_RETRY_MS);
   }
}

/* On the thread, at worker_stop: nothing more is answered; the owed
 * charges are retried (stop_charge_owed), the claims released and the
 * lanes handed back, except the lanes of the charges still owed: those
 * stay held, so that whoever takes them over after their lease charges
 * the claims they list (the takeover rule), rather than a hand-back
 * releasing them uncharged. */
static void
stop_cb (void *arg)
{
   consumer_t *c = arg;
   pull_req_t *r, *next;
   size_t owed, n_keep = 0;
   bson_error_t err;

   evtimer_del (c->poll_ev);
   evtimer_del (c->retry_ev);
   event_del (c->tidy_ev);
   pthread_mutex_lock (&c->mu);
   r = c->in_head;
   c->in_head = c->in_tail = NULL;
   pthread_mutex_unlock (&c->mu);
   for (; r; r = next) {
      next = r->next;
      pull_req_destroy (r);
   }
   while (c->n_waiting > 0)
      waiting_remove (c, c->n_waiting - 1);
   owed = stop_charge_owed (c);
   store_spaces_write_completion_times (&c->spaces, clock_now_ms (), true); /* all that wait */
   /* Each space's lanes go back, but for the lanes of its owed charges. */
   for (size_t k = 0; k < c->spaces.n; k++) {
      store_t *st = c->spaces.v[k];
      bool keep[OUTBOX_LANES] = {false};
      for (size_t i = 0; i < c->n_held; i++)
         if (c->held[i].owed && c->held[i].lane < OUTBOX_LANES && !keep[c->held[i].lane] && store_of (c, c->held[i].handler) == st) {
            keep[c->held[i].lane] = true;
            n_keep++;
         }
      if (!store_relinquish_except (st, clock_now_ms (), keep, &err))
         log_warn ("consumer: handing the lanes of handler %s back failed (they free up when their leases end): %s",
                   store_space_handler (st), err.message);
   }
   if (owed > 0)
      log_warn ("consumer: stopping: %zu owed charge(s) did not land within %d ms (an open transaction still holds "
                "their deliveries): their %zu lane(s) stay held, and whoever takes them over after their lease "
                "charges those claims",
                owed, CONSUMER_STOP_CHARGE_MS, n_keep);
   event_base_loopexit (c->base, NULL);
}

static void
consumer_free (consumer_t *c)
{
   if (!c)
      return;
   if (c->in_ev)
      event_free (c->in_ev);
   if (c->wake_ev)
      event_free (c->wake_ev);
   if (c->poll_ev)
      event_free (c->poll_ev);
   if (c->tidy_ev)
      event_free (c->tidy_ev);
   if (c->drain_ev)
      event_free (c->drain_ev);
   if (c->retry_ev)
      event_free (c->retry_ev);
   pthread_mutex_lock (&g_out.mu);
   if (g_out.retry_ev)
      event_free (g_out.retry_ev);
   g_out.retry_ev = NULL;
   pthread_mutex_unlock (&g_out.mu);
   for (size_t i = 0; i < c->n_held; i++)
      bson_free (c->held[i].event_id);
   bson_free (c->held);
   /* Nothing is held or waits any more. */
   for (size_t slot = 0; slot < COUNTERS_MAX_HANDLERS; slot++)
      if (c->usage[slot].conns || c->usage[slot].claims || c->usage[slot].polls) {
         c->usage[slot] = (usage_t){0};
         usage_publish (c, slot);
      }
   bson_free (c->users);
   store_spaces_clear (&c->spaces);
   store_destroy (c->store);
   worker_destroy (c->w); /* after everything on its base and pool */
   pthread_mutex_destroy (&c->mu);
   bson_free (c);
}

bool
consumer_start (config_t *cfg, struct loopwake *const *wakes, size_t n_wakes, consumer_answer_fn fn, bson_error_t *error)
{
   consumer_t *c;
   worker_opts_t wo = {
      .name = "consumer",
      .pool = {.appname = "relaybus-proxy consumer",
               .server_selection_ms = cfg->upstream_connect_timeout_ms < 2000 ? (int32_t) cfg->upstream_connect_timeout_ms : 2000},
      .on_stop = stop_cb,
   };
   size_t n_pull = 0;

   for (size_t i = 0; i < cfg->n_handlers; i++)
      if (cfg->handlers[i].kind_id == HANDLER_KIND_PULL)
         n_pull++;
   if (n_pull == 0)
      return true;
   c = bson_malloc0 (sizeof *c);
   pthread_mutex_init (&c->mu, NULL);
   wo.ctx = c;
   c->w = store_worker_new (cfg, &wo, &c->store, error);
   if (!c->w)
      goto fail;
   store_set_completion_times_by_second (c->store, true); /* its spaces' completions: store.h */
   c->spaces.base = c->store;
   c->base = worker_base (c->w);
   c->held = bson_malloc0 (CONSUMER_MAX_CLAIMS * sizeof *c->held);
   c->in_ev = event_new (c->base, -1, 0, in_cb, c);
   c->wake_ev = event_new (c->base, -1, 0, wake_cb, c);
   c->poll_ev = evtimer_new (c->base, poll_cb, c);
   c->tidy_ev = event_new (c->base, -1, EV_PERSIST, tidy_cb, c);
   c->drain_ev = event_new (c->base, -1, 0, drain_cb, c);
   c->retry_ev = evtimer_new (c->base, retry_cb, c);
   store_set_max_time_ms (c->store, CONSUMER_STORE_MAX_TIME_MS);
   delivery_rng_seed (&c->rng);
   pthread_mutex_lock (&g_out.mu);
   g_out.nq = n_wakes < CONFIG_THREADS_MAX ? n_wakes : CONFIG_THREADS_MAX;
   for (size_t i = 0; i < g_out.nq; i++)
      g_out.q[i].wake = wakes[i];
   g_out.fn = fn;
   g_out.retry_ev = evtimer_new (c->base, out_retry_cb, NULL);
   pthread_mutex_unlock (&g_out.mu);
   if (c->tidy_ev) {
      struct timeval tv = clock_timeval_ms (CONSUMER_TIDY_MS);
      if (event_add (c->tidy_ev, &tv) != 0) {
         event_free (c->tidy_ev);
         c->tidy_ev = NULL;
      }
   }
   if (!c->in_ev || !c->wake_ev || !c->poll_ev || !c->tidy_ev || !c->drain_ev || !c->retry_ev || !g_out.retry_ev) {
      bson_set_error (error, CONSUMER_ERROR_DOMAIN, CONSUMER_ERROR_NOT_RUNNING, "consumer: out of memory for its events");
      goto fail;
   }
   if (!worker_start (c->w, error))
      goto fail;
   pthread_mutex_lock (&g_mu);
   g_c = c;
   pthread_mutex_unlock (&g_mu);
   log_info ("consumer: %zu pull handler(s), owner %s", n_pull, worker_owner (c->w));
   return true;

fail:
   consumer_free (c);
   return false;
}

void
consumer_stop (void)
{
   consumer_t *c;
   answer_t *a, *next;

   pthread_mutex_lock (&g_mu);
   c = g_c;
   g_c = NULL; /* no submission, close or wake reaches it any more */
   pthread_mutex_unlock (&g_mu);
   if (!c)
      return;
   worker_stop (c->w);
   consumer_free (c);
   /* Answers the loop did not take: nobody waits for them any more. */
   pthread_mutex_lock (&g_out.mu);
   for (size_t i = 0; i < g_out.nq; i++) {
      out_queue_t *q = &g_out.q[i];
      for (a = q->head; a; a = next) {
         next = a->next;
         bson_destroy (a->reply);
         bson_free (a);
      }
      q->head = q->tail = NULL;
      q->wake = NULL;
   }
   g_out.nq = 0;
   g_out.fn = NULL;
   pthread_mutex_unlock (&g_out.mu);
}
