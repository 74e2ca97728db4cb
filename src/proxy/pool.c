/*
 * proxy/pool.c - pooled mode's upstream connections (proxy/pool.h): opening
 * and logging them in, lending them to clients, pins, the wait list and its
 * deadline, and closing what is in doubt.
 *
 * A connection (pool_server_t) is one side_t of its own.  While it is idle
 * or logging in, its owner and callbacks are the pool's (pool_side_cb);
 * while it is lent, they are the client's (client_attach_upstream), so its
 * replies flow through the client's pump exactly as a session-mode upstream
 * does, and its EOF reaches pool_server_lost.  What it holds is counted in
 * the client's memory only while lent; idle, its buffers are empty.
 *
 * States: OPENING (connecting, TLS, hello, login; one deadline of
 * upstream_connect_timeout_ms for all of it), IDLE (in the idle stack,
 * read so that an EOF or stray bytes close it), LENT (a client holds it),
 * BACK (just given back, until server_return places or closes it).
 * A closed connection is freed at once: every pointer to it (the client's
 * `server`, the idle stack, the list) is cleared first, and its side's
 * callbacks cannot fire after side_close.
 *
 * Fairness: the wait list is FIFO, and a connection that comes back goes to
 * its head before anyone new may take an idle one.  The hand-over runs the
 * waiter's pump from an event (handoff_ev), never from inside another
 * client's pump.
 */
#include "proxy/pool.h"
#include "proxy/pool_private.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "autoconf.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/loopwake.h"
#include "base/servercodes.h"
#include "codec/sasl.h"
#include "codec/scram.h"
#include "proxy/conn_private.h"
#include "proxy/login.h"
#include "proxy/operator.h"
#include "proxy/owners.h"
#include "proxy/side.h"

/* Bytes of a request looked at before it is read (its command name and
 * transaction); a request whose body is longer is routed on any
 * connection. */
#define POOL_PEEK_MAX (64 * 1024)
/* Idle transaction pins are looked at this often. */
#define POOL_PIN_CHECK_MS 1000
/* At most one "requests wait for a connection" warning per loop this often. */
#define POOL_WARN_INTERVAL_MS 10000


/* The moves a pooled connection makes: opened (BACK), placed (IDLE) or
 * given to a waiter (LENT), lent from the idle stack, given back (BACK);
 * OPENING again only from LENT at teardown, to be counted with the
 * connections being opened when the pool is destroyed. */
static bool __attribute__ ((unused)) /* only RELAYBUS_ASSERT calls it (gone with NDEBUG) */
server_transition_ok (server_state_t from, server_state_t to)
{
   switch (to) {
   case SERVER_OPENING:
      return from == SERVER_OPENING || from == SERVER_LENT;
   case SERVER_BACK:
      return from == SERVER_OPENING || from == SERVER_LENT;
   case SERVER_IDLE:
      return from == SERVER_BACK;
   case SERVER_LENT:
      return from == SERVER_IDLE || from == SERVER_BACK;
   }
   return false;
}





/*
 * The ends of transactions, told to the other loops.  A driver may send a
 * transaction's statements on connections that landed on different loops,
 * so several loops may each hold a connection pinned to it; the loop that
 * relays its commit or abort tells the others, which then let their pins
 * go at once instead of after POOL_PIN_IDLE_MAX_MS.  Each loop has a slot:
 * a small ring of ended transactions under the slot's mutex and one
 * coalesced post at a time.  A ring that is full drops the notice (the pin
 * then idles out).  Static: a post still queued when its loop goes finds
 * the slot empty.
 */
#define POOL_ENDED_RING 64

typedef struct {
   pthread_mutex_t mu;
   pool_t *pool;     /* NULL: no pooled loop here */
   loopwake_t *wake;
   pool_txn_t ended[POOL_ENDED_RING];
   unsigned head, len;
   bool posted;
   /* Sharing the budget (below): what the other loops read of this one
    * without the mutex, and its coalesced posts (under the mutex). */
   atomic_uint share;    /* its pool->size */
   atomic_uint open;     /* its n_open */
   atomic_uint idle;     /* its n_idle */
   atomic_bool starving; /* clients wait that nothing it opens will serve */
   bool fill_posted;
   bool reclaim_posted;
} pool_slot_t;

static pool_slot_t pool_slots[CLIENT_LOOPS_MAX];
static atomic_uint pooled_loops; /* slots with a pool */
/* Slots below this index may hold a pool (the loops are numbered from 0):
 * what the scans of the other loops look at, not all CLIENT_LOOPS_MAX. */
static atomic_uint pool_slots_n;

/*
 * One budget of pool_size connections for the whole process.  Each loop
 * has a share (pool_share), but may open past it while the process holds
 * fewer than pool_size connections (pool_total, open or opening): with a
 * fixed share, a loop whose few connections a transaction pins would leave
 * its clients waiting pool_wait_timeout_ms while other loops' connections
 * idle.  A connection cannot move between loops (its socket and TLS state
 * belong to one event base), so budget moves by closing and opening: when
 * the budget is spent and a loop starves (clients wait that nothing it
 * opens will serve),
 *  - a loop with idle connections closes them for it (reclaim_cb, posted
 *    by the starving loop; a connection that goes idle while a loop
 *    starves is closed at once instead, give_away_idle);
 *  - a loop above its share that gets a connection back while a loop
 *    below its share starves closes it instead of lending it again
 *    (server_free_for_use), so under contention every loop keeps its
 *    share;
 * and every close posts a fill to the starving loops (fill_cb), which open
 * what they need.  Ordering (sequentially consistent atomics): a starving
 * loop publishes that it starves, then looks at the budget and at the
 * others' idle connections; a loop that frees budget or idles a connection
 * does so, then looks at who starves.  So one of the two always sees the
 * other.  Two loops that close for the same starving loop at once may close
 * one connection too many: an idle one, opened again when needed.
 */
static atomic_uint pool_total;    /* connections open or opening, every loop */
static atomic_uint pool_starving; /* slots whose `starving` is set */
static pthread_once_t pool_slots_once = PTHREAD_ONCE_INIT;

static void
pool_slots_init (void)
{
   for (unsigned i = 0; i < CLIENT_LOOPS_MAX; i++)
      pthread_mutex_init (&pool_slots[i].mu, NULL);
}

static void server_return (pool_server_t *s);
static void give_away_idle (pool_t *pool);
static void wake_starving (pool_t *pool);

unsigned
pool_share (int64_t pool_size, unsigned index, unsigned nloops)
{
   unsigned n = (unsigned) (pool_size / nloops) + (index < (unsigned) (pool_size % nloops) ? 1u : 0u);

   return n > 0 ? n : 1;
}

const char *
pool_server_name (const pool_server_t *s)
{
   return s->name;
}

const bson_t *
pool_hello (const pool_t *pool)
{
   return pool->hello;
}

const char *
pool_last_error (const pool_t *pool)
{
   return pool->last_error[0] ? pool->last_error : "no primary known yet";
}


/* ------------------------------------------------------------ the budget */

static pool_slot_t *
slot_of (const pool_t *pool)
{
   return &pool_slots[pool->loop->index];
}

/* One more connection may open: taken from the budget. */
static bool
budget_take (pool_t *pool)
{
   unsigned n;

   if (!pool->shared)
      return pool->n_open < pool->limit;
   n = atomic_load (&pool_total);
   while (n < pool->limit)
      if (atomic_compare_exchange_weak (&pool_total, &n, n + 1))
         return true;
   return false;
}

static bool
budget_spent (const pool_t *pool)
{
   return pool->shared ? atomic_load (&pool_total) >= pool->limit : pool->n_open >= pool->limit;
}

/* Whether a loop other than this one starves (below its share, if asked). */
static bool
others_starving (const pool_t *pool, bool below_share)
{
   unsigned n = atomic_load (&pool_starving);

   if (!pool->shared || n == 0 || (n == 1 && pool->starving))
      return false;
   for (unsigned i = 0, slots_n = atomic_load (&pool_slots_n); i < slots_n; i++) {
      pool_slot_t *slot = &pool_slots[i];
      if (i == pool->loop->index || !atomic_load (&slot->starving))
         continue;
      if (!below_share || atomic_load (&slot->open) < atomic_load (&slot->share))
         return true;
   }
   return false;
}

static void
fill_cb (void *arg)
{
   pool_slot_t *slot = arg;
   pool_t *pool;

   pthread_mutex_lock (&slot->mu);
   pool = slot->pool;
   slot->fill_posted = false;
   pthread_mutex_unlock (&slot->mu);
   if (!pool)
      return;
   pool_fill (pool);
   /* Woken for budget it no longer needs (its clients were served
    * meanwhile): another starving loop may use it, for instance the one
    * that closed a connection above its share for this one.  A loop that
    * still starves keeps the wake: passing it on from a loop that cannot
    * open either (no primary) would bounce between them. */
   if (!pool->starving && !budget_spent (pool))
      wake_starving (pool);
}

static void
reclaim_cb (void *arg)
{
   pool_slot_t *slot = arg;
   pool_t *pool;

   pthread_mutex_lock (&slot->mu);
   pool = slot->pool;
   slot->reclaim_posted = false;
   pthread_mutex_unlock (&slot->mu);
   if (pool)
      give_away_idle (pool);
}

/* Posts fn to the slot's loop unless one such post is already queued. */
static void
slot_post (pool_slot_t *slot, bool *posted, loopwake_fn_t fn)
{
   pthread_mutex_lock (&slot->mu);
   if (slot->pool && !*posted) {
      *posted = true;
      if (!loopwake_post (slot->wake, fn, slot))
         *posted = false; /* the queue is full: the next change posts again */
   }
   pthread_mutex_unlock (&slot->mu);
}

/* Budget was given back: the starving loops may open now. */
static void
wake_starving (pool_t *pool)
{
   if (atomic_load (&pool_starving) == 0)
      return;
   for (unsigned i = 0, slots_n = atomic_load (&pool_slots_n); i < slots_n; i++) {
      pool_slot_t *slot = &pool_slots[i];
      if (i != pool->loop->index && atomic_load (&slot->starving))
         slot_post (slot, &slot->fill_posted, fill_cb);
   }
}

/* A closed connection's budget goes back. */
void
budget_untake (pool_t *pool)
{
   if (pool->shared)
      atomic_fetch_sub (&pool_total, 1);
}

void
budget_note_open (pool_t *pool)
{
   if (pool->shared)
      atomic_store (&slot_of (pool)->open, pool->n_open);
}

static void
budget_give (pool_t *pool)
{
   if (!pool->shared)
      return;
   atomic_fetch_sub (&pool_total, 1);
   if (!pool->stopping)
      wake_starving (pool);
}

/* The budget is spent and this loop starves: the loops with idle
 * connections close them for it. */
static void
ask_reclaim (pool_t *pool)
{
   for (unsigned i = 0, slots_n = atomic_load (&pool_slots_n); i < slots_n; i++) {
      pool_slot_t *slot = &pool_slots[i];
      if (i != pool->loop->index && atomic_load (&slot->idle) > 0)
         slot_post (slot, &slot->reclaim_posted, reclaim_cb);
   }
}

/* Publishes whether clients wait that nothing this loop opens will serve
 * (or it has no connection yet to learn the hello from). */
void
starve_update (pool_t *pool)
{
   bool starving = pool->n_waiting > pool->n_opening || (!pool->hello && pool->n_open == 0);

   if (!pool->shared || starving == pool->starving)
      return;
   pool->starving = starving;
   atomic_store (&slot_of (pool)->starving, starving);
   if (starving)
      atomic_fetch_add (&pool_starving, 1);
   else
      atomic_fetch_sub (&pool_starving, 1);
}

/* Idle connections of this loop close while another loop starves and the
 * budget is spent: least recently used first.  From reclaim_cb only, at
 * the top of an event: it closes connections other than the caller's. */
static void
give_away_idle (pool_t *pool)
{
   while (pool->idle && others_starving (pool, false) && budget_spent (pool)) {
      pool_server_t *s = pool->idle;
      while (s->idle_next)
         s = s->idle_next;
      server_close (s, "another loop's clients need the budget");
   }
}

/* ------------------------------------------------------------ pins */

static void
pin_set (pool_server_t *s, counters_pin_t pin, bool on)
{
   unsigned bit = 1u << pin;

   if (on == ((s->pins & bit) != 0))
      return;
   if (on) {
      s->pins |= bit;
      counters_add_at (COUNTER_POOL_PINNED, pin, 1);
   } else {
      s->pins &= ~bit;
      atomic_fetch_sub_explicit (&counters_slots[COUNTER_POOL_PINNED + pin], 1, memory_order_relaxed);
   }
   if (pin == COUNTERS_PIN_TRANSACTION) {
      /* Counted per user for pool_max_pins_per_user (pool_admit). */
      if (on) {
         s->pin_user = s->client ? owners_user (s->client) : 0;
         owners_pin (s->pin_user, s->txn.lsid, s->txn.txn_number, true);
      } else {
         owners_pin (s->pin_user, s->txn.lsid, s->txn.txn_number, false);
         s->pin_user = 0;
      }
      if (on)
         s->pool->n_pinned_txn++;
      else
         s->pool->n_pinned_txn--;
      if (!on)
         s->txn.valid = false;
   }
}

static void
pins_clear (pool_server_t *s)
{
   for (int p = 0; p < COUNTERS_PIN_COUNT; p++)
      pin_set (s, (counters_pin_t) p, false);
}

static bool
txn_equal (const pool_txn_t *a, const pool_txn_t *b)
{
   return a->valid && b->valid && a->txn_number == b->txn_number && memcmp (a->lsid, b->lsid, sizeof a->lsid) == 0;
}

/* What a request body says of its transaction: in one when it carries
 * `autocommit: false` with an lsid (a 16-byte UUID) and a txnNumber. */
static void
txn_of_body (const bson_t *body, pool_txn_t *out, bool *retryable_write)
{
   bson_iter_t it, child;
   bool autocommit_false = false, has_lsid = false, has_number = false;

   out->valid = false;
   if (retryable_write)
      *retryable_write = false;
   if (!bson_iter_init (&it, body))
      return;
   while (bson_iter_next (&it)) {
      const char *k = bson_iter_key (&it);
      if (k[0] == 'a' && strcmp (k, "autocommit") == 0) {
         autocommit_false = !bson_iter_as_bool (&it);
      } else if (k[0] == 't' && strcmp (k, "txnNumber") == 0 && BSON_ITER_HOLDS_NUMBER (&it)) {
         out->txn_number = bson_iter_as_int64 (&it);
         has_number = true;
      } else if (k[0] == 'l' && strcmp (k, "lsid") == 0 && BSON_ITER_HOLDS_DOCUMENT (&it) &&
                 bson_iter_recurse (&it, &child) && bson_iter_find (&child, "id") && BSON_ITER_HOLDS_BINARY (&child)) {
         bson_subtype_t sub;
         uint32_t len;
         const uint8_t *data;
         bson_iter_binary (&child, &sub, &len, &data);
         if (len == sizeof out->lsid) {
            memcpy (out->lsid, data, len);
            has_lsid = true;
         }
      }
   }
   out->valid = autocommit_false && has_lsid && has_number;
   if (retryable_write)
      *retryable_write = has_number && !autocommit_false;
}

/* This loop's connection a transaction is pinned to. */
static pool_server_t *
pinned_server (pool_t *pool, const pool_txn_t *txn)
{
   if (!txn->valid || pool->n_pinned_txn == 0)
      return NULL;
   for (pool_server_t *s = pool->servers; s; s = s->next)
      if ((s->pins & (1u << COUNTERS_PIN_TRANSACTION)) && txn_equal (&s->txn, txn))
         return s;
   return NULL;
}

/* ------------------------------------------------------------ lending */

void
server_set_state (pool_server_t *s, server_state_t next)
{
   RELAYBUS_ASSERT (server_transition_ok (s->state, next));
   s->state = next;
}

static void
idle_push (pool_server_t *s)
{
   pool_t *pool = s->pool;

   server_set_state (s, SERVER_IDLE);
   s->idle_prev = NULL;
   s->idle_next = pool->idle;
   if (pool->idle)
      pool->idle->idle_prev = s;
   pool->idle = s;
   pool->n_idle++;
   if (pool->shared)
      atomic_store (&slot_of (pool)->idle, pool->n_idle);
}

static void
idle_remove (pool_server_t *s)
{
   pool_t *pool = s->pool;

   RELAYBUS_ASSERT (s->state == SERVER_IDLE);
   if (s->idle_prev)
      s->idle_prev->idle_next = s->idle_next;
   else
      pool->idle = s->idle_next;
   if (s->idle_next)
      s->idle_next->idle_prev = s->idle_prev;
   s->idle_prev = s->idle_next = NULL;
   pool->n_idle--;
   if (pool->shared)
      atomic_store (&slot_of (pool)->idle, pool->n_idle);
}

/* The connection is c's now: its bytes flow through c's pump. */
static void
lend (pool_server_t *s, client_conn_t *c)
{
   if (s->state == SERVER_IDLE)
      idle_remove (s);
   server_set_state (s, SERVER_LENT);
   s->client = c;
   c->server = s;
   counters_add (COUNTER_POOL_IN_USE, 1);
   client_attach_upstream (c, &s->side);
}

/* c gives its connection up: it is the pool's again (not yet in the idle
 * stack: the caller decides what becomes of it). */
static pool_server_t *
unlend (client_conn_t *c)
{
   pool_server_t *s = c->server;

   client_detach_upstream (c);
   c->server = NULL;
   s->client = NULL;
   server_set_state (s, SERVER_BACK);
   s->side.owner = s;
   s->side.cb = &pool_side_cb;
   counters_sub (COUNTER_POOL_IN_USE, 1);
   return s;
}

/* ------------------------------------------------------------ waiting */

static void
wait_timer_arm (pool_t *pool)
{
   int64_t due, now;
   struct timeval tv;

   if (!pool->wait_head)
      return;
   now = clock_mono_ms ();
   due = pool->wait_head->pool.wait_since_ms + pool_cfg (pool)->pool_wait_timeout_ms;
   tv = clock_timeval_ms (due > now ? due - now : 0);
   evtimer_add (pool->wait_timer, &tv);
   pool->wait_timer_armed = true;
}

/* The client's moves through the pool (proxy/pool.h): into the FIFO and
 * out, onto the hand-off list and off. */
static bool __attribute__ ((unused)) /* only RELAYBUS_ASSERT calls it (gone with NDEBUG) */
client_pool_transition_ok (pool_client_state_t from, pool_client_state_t to)
{
   switch (to) {
   case POOL_CLIENT_WAITING:
   case POOL_CLIENT_HANDED:
      return from == POOL_CLIENT_IDLE;
   case POOL_CLIENT_IDLE:
      return from == POOL_CLIENT_WAITING || from == POOL_CLIENT_HANDED;
   }
   return false;
}

static void
client_pool_set_state (client_conn_t *c, pool_client_state_t next)
{
   RELAYBUS_ASSERT (client_pool_transition_ok (c->pool.state, next));
   c->pool.state = next;
}

void
pool_request_answered (client_conn_t *c)
{
   c->pool.refusal = POOL_REFUSAL_NONE;
   c->pool.peek_valid = false;
}

static void
wait_remove (client_conn_t *c)
{
   pool_t *pool = c->loop->pool;

   if (c->pool.wait_prev)
      c->pool.wait_prev->pool.wait_next = c->pool.wait_next;
   else
      pool->wait_head = c->pool.wait_next;
   if (c->pool.wait_next)
      c->pool.wait_next->pool.wait_prev = c->pool.wait_prev;
   else
      pool->wait_tail = c->pool.wait_prev;
   c->pool.wait_prev = c->pool.wait_next = NULL;
   client_pool_set_state (c, POOL_CLIENT_IDLE);
   pool->n_waiting--;
   counters_sub (COUNTER_POOL_WAITERS, 1);
   /* The timer stays armed for the head it was armed for: the waiters'
    * deadlines only grow along the FIFO, so a new head's is no earlier,
    * and wait_timer_cb arms it again for whoever is at the head then (no
    * timer change per hand-off). */
   if (!pool->wait_head && pool->wait_timer_armed) {
      evtimer_del (pool->wait_timer);
      pool->wait_timer_armed = false;
   }
   starve_update (pool);
}

static void
wait_add (client_conn_t *c)
{
   pool_t *pool = c->loop->pool;
   int64_t now = clock_mono_ms ();

   client_pool_set_state (c, POOL_CLIENT_WAITING);
   c->pool.wait_since_ms = now;
   c->pool.wait_next = NULL;
   c->pool.wait_prev = pool->wait_tail;
   if (pool->wait_tail)
      pool->wait_tail->pool.wait_next = c;
   else
      pool->wait_head = c;
   pool->wait_tail = c;
   pool->n_waiting++;
   counters_add (COUNTER_POOL_WAITERS, 1);
   counters_add (COUNTER_POOL_WAITS, 1);
   if (!pool->wait_timer_armed)
      wait_timer_arm (pool);
   if (budget_spent (pool) && now - pool->last_warn_ms >= POOL_WARN_INTERVAL_MS) {
      pool->last_warn_ms = now;
      log_info ("pool: all %u connections of this loop are busy and the pool has no more to open; %u request(s) wait "
                "(pool_size = %" PRId64 ", pool_wait_timeout_ms = %" PRId64 ")",
                pool->n_open, pool->n_waiting, pool_cfg (pool)->pool_size, pool_cfg (pool)->pool_wait_timeout_ms);
   }
}

/* c is pumped from handoff_ev: it got a connection, or its wait ran out. */
static void
hand (client_conn_t *c)
{
   pool_t *pool = c->loop->pool;

   client_pool_set_state (c, POOL_CLIENT_HANDED);
   c->pool.handed_next = pool->handed;
   pool->handed = c;
   event_active (pool->handoff_ev, EV_READ, 0);
}

static void
handed_remove (client_conn_t *c)
{
   pool_t *pool = c->loop->pool;

   for (client_conn_t **p = &pool->handed; *p; p = &(*p)->pool.handed_next)
      if (*p == c) {
         *p = c->pool.handed_next;
         break;
      }
   c->pool.handed_next = NULL;
   client_pool_set_state (c, POOL_CLIENT_IDLE);
}

static void
handoff_cb (evutil_socket_t fd, short what, void *arg)
{
   pool_t *pool = arg;

   (void) fd;
   (void) what;
   while (pool->handed) {
      client_conn_t *c = pool->handed;
      pool->handed = c->pool.handed_next;
      c->pool.handed_next = NULL;
      client_pool_set_state (c, POOL_CLIENT_IDLE);
      client_resume (c);
   }
}

/* The head waiters whose wait ran out: their request is answered with a
 * retryable error (route_msg, pool_answer_timeout). */
static void
wait_timer_cb (evutil_socket_t fd, short what, void *arg)
{
   pool_t *pool = arg;
   int64_t now = clock_mono_ms (), limit = pool_cfg (pool)->pool_wait_timeout_ms;

   (void) fd;
   (void) what;
   pool->wait_timer_armed = false;
   while (pool->wait_head && now - pool->wait_head->pool.wait_since_ms >= limit) {
      client_conn_t *c = pool->wait_head;
      wait_remove (c);
      counters_observe (COUNTER_POOL_WAIT_TIME, 0, now - c->pool.wait_since_ms);
      c->pool.refusal = POOL_REFUSAL_TIMED_OUT;
      hand (c);
   }
   wait_timer_arm (pool);
}

/* A connection is free: the oldest waiter gets it, else the idle stack;
 * or it closes, when the budget is better spent on another loop. */
void
server_free_for_use (pool_server_t *s)
{
   pool_t *pool = s->pool;

   if (pool->wait_head) {
      client_conn_t *c = pool->wait_head;
      /* Above its share while a loop below its share starves: that loop
       * gets the budget, this one's clients the connections of its share. */
      if (pool->shared && pool->n_open > pool->size && budget_spent (pool) && others_starving (pool, true)) {
         server_close (s, "a loop below its share needs the budget");
         return;
      }
      wait_remove (c);
      counters_observe (COUNTER_POOL_WAIT_TIME, 0, clock_mono_ms () - c->pool.wait_since_ms);
      lend (s, c);
      hand (c);
      return;
   }
   idle_push (s);
   side_set_reading (&s->side, true); /* an EOF or stray bytes close it */
   /* After idle_push published it: a loop that starved meanwhile asked
    * nobody for it (ask_reclaim looks at the idle counts).  Only this one
    * closes here, as a stale one would: callers may be walking the list
    * (pin_timer_cb), and another connection closed under them would be
    * freed memory. */
   if (others_starving (pool, false) && budget_spent (pool))
      server_close (s, "another loop's clients need the budget");
}

/* ------------------------------------------------------------ closing */

static void
server_free (pool_server_t *s)
{
   scram_client_destroy (s->scram);
   if (s->hello)
      bson_destroy (s->hello);
   proxy_event_free (s->deadline);
   bson_free (s);
}

void
server_close (pool_server_t *s, const char *why)
{
   pool_t *pool = s->pool;

   RELAYBUS_ASSERT (s->state != SERVER_LENT);
   log_debug ("pool: p%" PRIu64 " %s closed: %s", s->id, s->name, why);
   if (s->state == SERVER_IDLE)
      idle_remove (s);
   if (s->state == SERVER_OPENING)
      pool->n_opening--;
   pins_clear (s);
   if (s->counted_open) {
      counters_sub (COUNTER_POOL_CONNECTIONS, 1);
      if (s->side.connected)
         counters_sub (COUNTER_UPSTREAMS_OPEN, 1);
   }
   side_close (&s->side);
   if (s->prev)
      s->prev->next = s->next;
   else
      pool->servers = s->next;
   if (s->next)
      s->next->prev = s->prev;
   pool->n_open--;
   server_free (s);
   if (pool->shared)
      atomic_store (&slot_of (pool)->open, pool->n_open);
   starve_update (pool);
   budget_give (pool);
}

/* A connection back from a client: reused, or closed when stale. */
static void
server_return (pool_server_t *s)
{
   pool_t *pool = s->pool;

   if (s->op_generation < operator_generation ()) {
      counters_add (COUNTER_RECONNECTED_UPSTREAMS, 1);
      server_close (s, "the operator asked for new connections (POST /api/reconnect)"); /* frees s */
      pool_fill (pool);
      return;
   }
   if (s->stale || !pool->primary_known || pool->generation != s->generation) {
      server_close (s, "its member is no longer the primary"); /* frees s */
      pool_fill (pool);
      return;
   }
   server_free_for_use (s);
}

/* Opens what the waiters (and a client waiting for the first hello) need,
 * while the budget lasts, unless a failed attempt's backoff runs.  Without
 * budget, the loops with idle connections are asked to close them. */
void
pool_fill (pool_t *pool)
{
   bool spent = false;

   for (int round = 0; round < 2 && !pool->retry_armed; round++) {
      spent = false;
      while (!pool->retry_armed &&
             (pool->n_opening < pool->n_waiting || (!pool->hello && pool->n_opening == 0 && pool->n_open == 0))) {
         if (!budget_take (pool)) {
            spent = true;
            break;
         }
         if (!server_open (pool))
            break;
      }
      starve_update (pool);
      /* Now that it says it starves, once more: budget a loop gave back
       * before that woke nobody. */
      if (!spent || !pool->starving || budget_spent (pool))
         break;
   }
   starve_update (pool);
   if (spent && pool->starving)
      ask_reclaim (pool);
}

static void
retry_cb (evutil_socket_t fd, short what, void *arg)
{
   pool_t *pool = arg;

   (void) fd;
   (void) what;
   pool->retry_armed = false;
   pool_fill (pool);
}

void
pool_want_hello (pool_t *pool)
{
   pool->want_hello = true;
   pool_fill (pool);
}

void
pool_topology_changed (pool_t *pool)
{
   topology_primary_t p;
   pool_server_t *s, *next;

   topology_get_primary (pool->loop->topo, &p);
   pool->primary_known = p.state == TOPOLOGY_STATE_PRIMARY;
   pool->generation = p.generation;
   for (s = pool->servers; s; s = next) {
      next = s->next;
      if (p.state == TOPOLOGY_STATE_PRIMARY && s->generation == p.generation)
         continue;
      s->stale = true;
      if (s->state == SERVER_IDLE)
         server_close (s, "the primary changed");
   }
   if (p.state == TOPOLOGY_STATE_PRIMARY && pool->retry_armed) {
      /* A new primary: try it now rather than after the backoff. */
      evtimer_del (pool->retry_timer);
      pool->retry_armed = false;
      pool->backoff_ms = 0;
   }
   pool_fill (pool);
}

void
pool_reconnect (pool_t *pool)
{
   uint64_t gen = operator_generation ();
   pool_server_t *s, *next;
   unsigned closed = 0, later = 0;

   for (s = pool->servers; s; s = next) {
      next = s->next;
      if (s->op_generation >= gen)
         continue;
      /* An opening one logs in with what the process had before: it is
       * closed too, and pool_fill opens its replacement. */
      if (s->state == SERVER_IDLE || s->state == SERVER_OPENING) {
         counters_add (COUNTER_RECONNECTED_UPSTREAMS, 1);
         server_close (s, "the operator asked for new connections (POST /api/reconnect)");
         closed++;
      } else {
         later++; /* lent: server_return closes it */
      }
   }
   log_info ("pool: reconnect: %u idle connection(s) closed, %u lent one(s) close when given back", closed, later);
   pool_fill (pool);
}

/* ------------------------------------------------------------ pins' age */

static void
pin_timer_cb (evutil_socket_t fd, short what, void *arg)
{
   pool_t *pool = arg;
   int64_t now = clock_mono_ms ();
   pool_server_t *s, *next;

   (void) fd;
   (void) what;
   pool->pin_timer_armed = false;
   for (s = pool->servers; s; s = next) {
      client_conn_t *c = s->client;
      next = s->next;
      if (!(s->pins & (1u << COUNTERS_PIN_TRANSACTION)) || s->state != SERVER_LENT || !c || c->up_count > 0 ||
          now - s->idle_since_ms < POOL_PIN_IDLE_MAX_MS)
         continue;
      log_conn (LOG_LEVEL_INFO, c->id, c->peer,
                "pool: a transaction held %s idle for %d s (transactionLifetimeLimitSeconds): it goes back to the pool",
                s->name, POOL_PIN_IDLE_MAX_MS / 1000);
      pin_set (s, COUNTERS_PIN_TRANSACTION, false);
      pool_settle (c);
   }
   if (pool->n_pinned_txn > 0) {
      struct timeval tv = clock_timeval_ms (POOL_PIN_CHECK_MS);
      pool->pin_timer_armed = true;
      evtimer_add (pool->pin_timer, &tv);
   }
}

static void
pin_timer_arm (pool_t *pool)
{
   if (!pool->pin_timer_armed) {
      struct timeval tv = clock_timeval_ms (POOL_PIN_CHECK_MS);
      pool->pin_timer_armed = true;
      evtimer_add (pool->pin_timer, &tv);
   }
}

/* ------------------------------------------------------------ requests */

/* Peeks at the request at the front of `in`: its command name (the
 * body's first key) and its transaction.  False when it cannot tell (a
 * compressed request, a body past POOL_PEEK_MAX): it needs a connection. */
static bool
peek_request (struct evbuffer *in, const wire_header_t *h, char *cmd, size_t cmd_len, pool_txn_t *txn, bson_t *body)
{
   size_t window = (size_t) h->length < POOL_PEEK_MAX ? (size_t) h->length : POOL_PEEK_MAX;
   const uint8_t *buf;
   uint32_t doc_len;
   bson_iter_t it;

   cmd[0] = '\0';
   txn->valid = false;
   if (h->opcode != WIRE_OP_MSG || window < WIRE_HEADER_LEN + 4 + 1 + 5)
      return false;
   buf = evbuffer_pullup (in, (ssize_t) window);
   if (!buf || buf[WIRE_HEADER_LEN + 4] != 0)
      return false; /* the body is not the first section */
   doc_len = wire_get_u32 (buf + WIRE_HEADER_LEN + 5);
   if (doc_len < 5 || doc_len > window - (WIRE_HEADER_LEN + 5) ||
       !bson_init_static (body, buf + WIRE_HEADER_LEN + 5, doc_len) || !bson_iter_init (&it, body) ||
       !bson_iter_next (&it))
      return false;
   bson_strncpy (cmd, bson_iter_key (&it), cmd_len);
   txn_of_body (body, txn, NULL);
   return true;
}

bool
pool_peek (struct evbuffer *in, const wire_header_t *h, char *cmd, size_t cmd_len, bson_t *body)
{
   pool_txn_t txn;

   return peek_request (in, h, cmd, cmd_len, &txn, body);
}

static bool
ends_transaction (const char *cmd)
{
   return cmd && (strcmp (cmd, "commitTransaction") == 0 || strcmp (cmd, "abortTransaction") == 0);
}

/* Whether c's user pins as many connections as it may. */
static bool
pins_full (const client_conn_t *c)
{
   const config_t *cfg = c->loop->cfg;
   uint64_t user = owners_user (c);
   int64_t max = cfg->pool_max_pins_per_user;

   if (!user)
      return false;
   if (max == 0)
      max = cfg->pool_size / 2 > 0 ? cfg->pool_size / 2 : 1;
   return (int64_t) owners_pins (user) >= max;
}

/* Whether a request of transaction `txn` (cmd) would pin one more of this
 * loop's connections than c's user may have pinned.  Every statement that
 * carries lsid, txnNumber and autocommit: false pins, whatever the command
 * and whether or not it says startTransaction (the server may answer it
 * NoSuchTransaction: the pin is taken all the same), so each is counted.
 * Two are let through: the commit or abort, which ends the transaction
 * and its pins; and a statement of a transaction of the user's that a
 * connection of another loop is pinned to and none of this loop's (a
 * driver sends a transaction's statements on any connection of its pool,
 * which may land on any loop), or the transaction could never finish.
 * So a user pins at most the cap, plus at most one connection per loop
 * for a transaction that goes on across loops. */
static bool
over_pins (client_conn_t *c, const pool_txn_t *txn, const char *cmd)
{
   if (!txn->valid || ends_transaction (cmd) || !pins_full (c))
      return false;
   if (!pinned_server (c->loop->pool, txn) && owners_txn_pinned (owners_user (c), txn->lsid, txn->txn_number))
      return false;
   return true;
}

bool
pool_admit (client_conn_t *c, struct evbuffer *in, const wire_header_t *h)
{
   pool_t *pool = c->loop->pool;
   char cmd[64];
   pool_txn_t txn;
   pool_server_t *s;
   bson_t body;
   owners_refusal_t refusal;
   bool peeked;

   RELAYBUS_ASSERT (!c->server && c->pool.state != POOL_CLIENT_WAITING);
   if (h->opcode == WIRE_OP_QUERY)
      return true; /* the legacy hello, or refused: the proxy answers */
   peeked = peek_request (in, h, cmd, sizeof cmd, &txn, &body);
   /* Kept for pool_note_request, lent now or after a wait. */
   c->pool.peek_valid = peeked;
   c->pool.peek_request_id = h->request_id;
   c->pool.peek_txn = txn;
   /* Before a required login, whatever the peek cannot read (compressed,
    * large, the body not first) is the proxy's to answer too: read whole,
    * it is a hello, a login, or refused (proxy/login.h). */
   if (login_answers_locally (c, peeked ? cmd : NULL))
      return true;
   /* A request the owners' check refuses is answered without a connection,
    * least of all the one another user's transaction pins.  (Without an
    * auth file nobody is checked: no call per request for that.) */
   if (peeked && owners_enabled (c) && owners_check (c, &body, cmd, &refusal) == OWNERS_REFUSE)
      return true;
   /* A transaction statement that would pin a connection while its user
    * already pins pool_max_pins_per_user: answered as a wait that ran out
    * (retryable), without a connection, so that one user's transactions
    * cannot hold every connection of the pool (over_pins).  The statement
    * of a transaction pinned here takes that connection: no new pin. */
   if (peeked && !pinned_server (pool, &txn) && over_pins (c, &txn, cmd)) {
      c->pool.refusal = POOL_REFUSAL_OVER_PINS;
      return true;
   }
   /* A statement of a transaction pinned here: the same connection, taken
    * from the client that holds it idle. */
   if (txn.valid && (s = pinned_server (pool, &txn))) {
      client_conn_t *holder = s->client;
      if (s->state == SERVER_IDLE) {
         lend (s, c);
         return true;
      }
      if (s->state == SERVER_LENT && holder != c && holder->up_count == 0 && !holder->job &&
          evbuffer_get_length (side_output (&s->side)) == 0) {
         (void) unlend (holder);
         lend (s, c);
         return true;
      }
   }
   if (!pool->wait_head && pool->idle) {
      s = pool->idle;
      lend (s, c);
      return true;
   }
   wait_add (c);
   pool_fill (pool);
   return false;
}

bool
pool_note_request (client_conn_t *c, const wire_msg_t *msg, const char *cmd)
{
   pool_server_t *s = c->server;
   pool_txn_t txn;

   if (!s)
      return true;
   if (msg->flags & WIRE_MSG_MORE_TO_COME)
      pin_set (s, COUNTERS_PIN_MORE_TO_COME, true);
   if (c->pool.peek_valid && c->pool.peek_request_id == msg->header.request_id)
      txn = c->pool.peek_txn;
   else
      txn_of_body (&msg->body, &txn, NULL);
   c->pool.peek_valid = false;
   if (txn.valid) {
      if (!txn_equal (&s->txn, &txn)) {
         pin_set (s, COUNTERS_PIN_TRANSACTION, false);
         /* What pool_admit could not peek at (compressed, large) is
          * counted here, before it is forwarded: refused, the connection
          * goes back once the pump ends (pool_settle). */
         if (over_pins (c, &txn, cmd)) {
            c->pool.refusal = POOL_REFUSAL_OVER_PINS;
            return false;
         }
         s->txn = txn;
         pin_set (s, COUNTERS_PIN_TRANSACTION, true);
         pin_timer_arm (s->pool);
      }
      if (ends_transaction (cmd))
         c->pool.txn_ending = true;
   } else if (s->pins & (1u << COUNTERS_PIN_TRANSACTION)) {
      /* The client left the transaction (its driver runs it, or commits
       * it, elsewhere): nothing holds the connection for it any more. */
      pin_set (s, COUNTERS_PIN_TRANSACTION, false);
      c->pool.txn_ending = false;
   }
   return true;
}

static void txn_ended_tell_others (pool_t *pool, const pool_txn_t *txn);

/* The transaction c's connection is pinned to ended (its commit or abort
 * was answered): its pins go, this one, and those of other loops for the
 * user's count at once (owners_txn_ended) and on their loops once told. */
static void
txn_end (client_conn_t *c)
{
   pool_server_t *s = c->server;

   c->pool.txn_ending = false;
   if (s->txn.valid) {
      owners_txn_ended (s->pin_user, s->txn.lsid, s->txn.txn_number);
      if (atomic_load_explicit (&pooled_loops, memory_order_relaxed) > 1)
         txn_ended_tell_others (s->pool, &s->txn);
   }
   pin_set (s, COUNTERS_PIN_TRANSACTION, false);
}

void
pool_note_reply (client_conn_t *c, bool more)
{
   if (!c->server)
      return;
   pin_set (c->server, COUNTERS_PIN_EXHAUST, more);
   /* The answer to a commit or an abort, the last in flight: the pins end
    * before it is queued for the client (which may write it at once), so
    * that no request the client sends once it has the answer, on any
    * loop, finds them counted (over_pins). */
   if (c->pool.txn_ending && !more && c->up_count == 1)
      txn_end (c);
}

bool
pool_wants_flush (const client_conn_t *c)
{
   return c->server && (c->server->pins & (1u << COUNTERS_PIN_MORE_TO_COME)) && c->up_count == 0;
}

/* On the slot's loop: the transactions other loops saw end. */
static void
txn_ended_cb (void *arg)
{
   pool_slot_t *slot = arg;
   pool_txn_t ended[POOL_ENDED_RING];
   unsigned n = 0;
   pool_t *pool;

   pthread_mutex_lock (&slot->mu);
   pool = slot->pool;
   while (slot->len > 0) {
      ended[n++] = slot->ended[slot->head];
      slot->head = (slot->head + 1) % POOL_ENDED_RING;
      slot->len--;
   }
   slot->posted = false;
   pthread_mutex_unlock (&slot->mu);
   for (unsigned i = 0; pool && i < n; i++) {
      pool_server_t *s = pinned_server (pool, &ended[i]);
      if (!s)
         continue;
      pin_set (s, COUNTERS_PIN_TRANSACTION, false);
      if (s->state == SERVER_LENT && s->client && s->client->up_count == 0)
         pool_settle (s->client);
   }
}

/* A transaction of this loop's ended: the other pooled loops let their
 * pins of it go. */
static void
txn_ended_tell_others (pool_t *pool, const pool_txn_t *txn)
{
   for (unsigned i = 0, slots_n = atomic_load (&pool_slots_n); i < slots_n; i++) {
      pool_slot_t *slot = &pool_slots[i];
      bool post = false;

      if (i == pool->loop->index)
         continue;
      pthread_mutex_lock (&slot->mu);
      if (slot->pool && slot->len < POOL_ENDED_RING) {
         slot->ended[(slot->head + slot->len) % POOL_ENDED_RING] = *txn;
         slot->len++;
         if (!slot->posted)
            post = slot->posted = true;
      }
      if (post && !loopwake_post (slot->wake, txn_ended_cb, slot))
         slot->posted = false; /* the next notice posts again */
      pthread_mutex_unlock (&slot->mu);
   }
}

void
pool_settle (client_conn_t *c)
{
   pool_server_t *s = c->server;

   /* Open: pump_end asks; a closed client gave its connection back. */
   if (!s || c->up_count > 0 || c->job)
      return;
   pin_set (s, COUNTERS_PIN_EXHAUST, false);
   if (s->pins & (1u << COUNTERS_PIN_MORE_TO_COME)) {
      if (evbuffer_get_length (side_output (&s->side)) > 0)
         return; /* the drain callback comes back here */
      pin_set (s, COUNTERS_PIN_MORE_TO_COME, false);
   }
   if (c->pool.txn_ending)
      txn_end (c); /* answered otherwise than by a relayed reply last */
   if (s->pins & (1u << COUNTERS_PIN_TRANSACTION)) {
      s->idle_since_ms = clock_mono_ms ();
      return;
   }
   if (evbuffer_get_length (side_output (&s->side)) > 0 || evbuffer_get_length (side_input (&s->side)) > 0)
      return; /* still writing, or a reply nobody asked for: its pump decides */
   server_return (unlend (c));
}

void
pool_client_closed (client_conn_t *c)
{
   pool_server_t *s = c->server;
   bool doubt;

   if (c->pool.state == POOL_CLIENT_WAITING)
      wait_remove (c);
   else if (c->pool.state == POOL_CLIENT_HANDED)
      handed_remove (c);
   if (!s)
      return;
   doubt = c->up_count > 0 || evbuffer_get_length (side_output (&s->side)) > 0 ||
           evbuffer_get_length (side_input (&s->side)) > 0;
   (void) unlend (c);
   pins_clear (s);
   if (doubt) {
      counters_add (COUNTER_POOL_CLOSED_IN_DOUBT, 1);
      log_conn (LOG_LEVEL_INFO, c->id, c->peer, "pool: %s closed: this client left %u request(s) in flight on it",
                s->name, (unsigned) c->up_count);
      server_close (s, "a client left a request in flight on it");
      pool_fill (c->loop->pool);
      return;
   }
   server_return (s);
}

void
pool_server_lost (client_conn_t *c, const char *detail)
{
   pool_server_t *s = c->server;
   bool in_flight = c->up_count > 0;
   char name[sizeof s->name];

   bson_strncpy (name, s->name, sizeof name);
   (void) unlend (c);
   topology_request_refresh (c->loop->topo, "pooled upstream connection lost");
   server_close (s, detail ? detail : "lost");
   if (in_flight) {
      client_disconnect (c, COUNTERS_CLOSE_UPSTREAM_EOF, "pooled upstream %s: %s (%u requests in flight)", name,
                         detail ? detail : "lost", (unsigned) c->up_count);
      return;
   }
   pool_fill (c->loop->pool);
}

void
pool_server_not_primary (client_conn_t *c)
{
   if (c->server)
      c->server->stale = true;
}

bool
pool_answer_timeout (client_conn_t *c,
                     const wire_msg_t *msg,
                     const char *cmd,
                     int compressor,
                     struct evbuffer *src,
                     size_t len,
                     bson_error_t *error)
{
   bson_t doc = BSON_INITIALIZER, labels;
   pool_txn_t txn;
   bool retryable_write, ok;
   uint64_t seq;
   char errmsg[256];
   bool ends = ends_transaction (cmd);

   txn_of_body (&msg->body, &txn, &retryable_write);
   if (c->pool.refusal == POOL_REFUSAL_OVER_PINS) {
      log_conn (LOG_LEVEL_INFO, c->id, c->peer,
                "pool: %s of user %s would pin more than pool_max_pins_per_user connections: answered with a "
                "retryable error",
                cmd ? cmd : "a request", login_user (c));
      bson_snprintf (errmsg, sizeof errmsg,
                     "relaybus: user %.64s already pins as many pooled upstream connections with open transactions "
                     "as pool_max_pins_per_user allows; retry",
                     login_user (c));
   } else {
      counters_add (COUNTER_POOL_WAIT_TIMEOUTS, 1);
      log_conn (LOG_LEVEL_INFO, c->id, c->peer, "pool: %s waited pool_wait_timeout_ms=%" PRId64 " for a connection: answered with a retryable error",
                cmd ? cmd : "a request", c->cfg->pool_wait_timeout_ms);
      bson_snprintf (errmsg, sizeof errmsg,
                     "relaybus: no pooled upstream connection was free within pool_wait_timeout_ms=%" PRId64
                     " (pool_size = %" PRId64 "); retry",
                     c->cfg->pool_wait_timeout_ms, c->cfg->pool_size);
   }
   if (c->pool.refusal == POOL_REFUSAL_OVER_PINS)
      c->pool.refusal = POOL_REFUSAL_NONE;
   /* `msg` and `cmd` point into the request's bytes: not used after this. */
   evbuffer_drain (src, len);
   if (!client_hold_request (c, msg->header.request_id, WIRE_OP_MSG, compressor, &seq, error)) {
      bson_destroy (&doc);
      return false;
   }
   BSON_APPEND_DOUBLE (&doc, "ok", 0.0);
   BSON_APPEND_UTF8 (&doc, "errmsg", errmsg);
   /* ExceededTimeLimit: a retryable read error for drivers, and not a
    * state-change error (no pool is cleared).  Writes are retried on
    * their labels, as a 4.4+ server sets them. */
   BSON_APPEND_INT32 (&doc, "code", SERVER_EXCEEDED_TIME_LIMIT);
   BSON_APPEND_UTF8 (&doc, "codeName", server_code_name (SERVER_EXCEEDED_TIME_LIMIT));
   if (txn.valid || retryable_write) {
      BSON_APPEND_ARRAY_BEGIN (&doc, "errorLabels", &labels);
      BSON_APPEND_UTF8 (&labels, "0", txn.valid && !ends ? "TransientTransactionError" : "RetryableWriteError");
      bson_append_array_end (&doc, &labels);
   }
   ok = client_answer (c, seq, &doc, error);
   bson_destroy (&doc);
   return ok;
}

/* ------------------------------------------------------------ the pool */

pool_t *
pool_new (client_loop_t *loop, unsigned size, bson_error_t *error)
{
   pool_t *pool = bson_malloc0 (sizeof *pool);

   pool->loop = loop;
   pool->size = size;
   pool->limit = size;
   pool->handoff_ev = event_new (loop->base, -1, 0, handoff_cb, pool);
   pool->wait_timer = evtimer_new (loop->base, wait_timer_cb, pool);
   pool->retry_timer = evtimer_new (loop->base, retry_cb, pool);
   pool->pin_timer = evtimer_new (loop->base, pin_timer_cb, pool);
   if (!pool->handoff_ev || !pool->wait_timer || !pool->retry_timer || !pool->pin_timer) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory for the pool");
      pool_destroy (pool);
      return NULL;
   }
   pthread_once (&pool_slots_once, pool_slots_init);
   if (loop->wake) {
      pool_slot_t *slot = &pool_slots[loop->index];
      pthread_mutex_lock (&slot->mu);
      slot->pool = pool;
      slot->wake = loop->wake;
      atomic_fetch_add (&pooled_loops, 1);
      {
         unsigned n = atomic_load (&pool_slots_n);
         while (n < loop->index + 1 && !atomic_compare_exchange_weak (&pool_slots_n, &n, loop->index + 1))
            ;
      }
      slot->len = slot->head = 0;
      slot->posted = false;
      slot->fill_posted = slot->reclaim_posted = false;
      atomic_store (&slot->share, size);
      atomic_store (&slot->open, 0);
      atomic_store (&slot->idle, 0);
      atomic_store (&slot->starving, false);
      pthread_mutex_unlock (&slot->mu);
      /* Its budget is the process's pool_size, shared with the other
       * loops (pool_size is at least the number of loops). */
      pool->shared = true;
      pool->limit = (unsigned) loop->cfg->pool_size;
      if (pool->limit < size)
         pool->limit = size;
   }
   /* The first connection teaches the pool the upstream's hello. */
   pool->want_hello = false;
   pool_fill (pool);
   return pool;
}

void
pool_destroy (pool_t *pool)
{
   if (!pool)
      return;
   pool->stopping = true;
   pthread_once (&pool_slots_once, pool_slots_init);
   {
      pool_slot_t *slot = &pool_slots[pool->loop->index];
      pthread_mutex_lock (&slot->mu);
      if (slot->pool == pool) {
         atomic_fetch_sub (&pooled_loops, 1);
         slot->pool = NULL;
         slot->wake = NULL;
         slot->len = 0;
      }
      pthread_mutex_unlock (&slot->mu);
   }
   while (pool->servers) {
      pool_server_t *s = pool->servers;
      if (s->state == SERVER_LENT) {
         /* Only at teardown, after every client closed: none is lent. */
         server_set_state (s, SERVER_OPENING);
         pool->n_opening++;
      }
      server_close (s, "proxy stopping");
   }
   if (pool->starving) {
      pool->starving = false;
      atomic_store (&slot_of (pool)->starving, false);
      atomic_fetch_sub (&pool_starving, 1);
   }
   proxy_event_free (pool->handoff_ev);
   proxy_event_free (pool->wait_timer);
   proxy_event_free (pool->retry_timer);
   proxy_event_free (pool->pin_timer);
   if (pool->hello)
      bson_destroy (pool->hello);
   OPENSSL_cleanse (&pool->salt, sizeof pool->salt);
   bson_free (pool);
}
