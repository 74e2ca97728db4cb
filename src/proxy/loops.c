/*
 * proxy/loops.c - the forwarding loops and the hand-off of accepted sockets
 * (see proxy/loops.h).
 *
 * Each loop but 0 is a loop_t with a thread, an event base and a loopwake
 * of its own.  What the main thread has for a loop (sockets, a snapshot,
 * notices) waits in the loop's slot under its mutex; one post of
 * loop_notice_cb at a time takes all of it.  A post that fails (the loop's
 * queue is full of other producers' posts) is retried from a timer on loop
 * 0; nothing waiting in a slot is lost meanwhile.
 *
 * Teardown: a loop stops on NOTICE_STOP, closes its connections on its own
 * thread (their per-thread state, publish/ and pull/ tables, lives there)
 * and returns; loops_destroy joins it, then frees its wake and base, whose
 * producers (the consumer thread, other loops' memory notices, its
 * decoding thread) have stopped or unregistered by then.
 */
#include "proxy/loops.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "base/clock.h"
#include "base/counters.h"
#include "base/heartbeat.h"
#include "base/log.h"
#include "base/loopwake.h"
#include "proxy/login.h"
#include "proxy/operator.h"
#include "proxy/pool.h"
#include "proxy/side.h"

/* How long loop 0 waits before posting again to a loop whose wake-up
 * queue was full. */
#define LOOPS_POST_RETRY_MS 5
/* While draining, loop 0 also counts the loops' reports this often, in
 * case a report's post did not fit its queue. */
#define LOOPS_DRAIN_CHECK_MS 100

/* Notices for a loop, coalesced in its slot. */
#define NOTICE_TOPOLOGY 1u
#define NOTICE_DRAIN 2u
#define NOTICE_STOP 4u
#define NOTICE_PING 8u

_Static_assert (HEARTBEAT_LOOPS_MAX >= CLIENT_LOOPS_MAX, "base/heartbeat.h tracks every loop");
_Static_assert (COUNTERS_LOOPS_MAX >= CLIENT_LOOPS_MAX, "every loop has its own LOOP_HISTOGRAM sample");

typedef struct {
   evutil_socket_t fd;
   struct sockaddr_storage addr;
   int addr_len;
   SSL_CTX *server_tls;
} handoff_t;

typedef struct loop {
   struct loops *owner;
   unsigned index;
   struct event_base *base; /* loop 0: borrowed; the others: owned */
   loopwake_t *wake;        /* loop 0: borrowed; the others: owned */
   client_loop_t *clients;  /* touched only on this loop's thread (and by
                             * loops_destroy after the join) */
   pthread_t thread;
   bool started;

   pthread_mutex_t mu; /* the slot: */
   handoff_t *q;       /* LOOPS_HANDOFF_MAX, a ring */
   unsigned q_head, q_len;
   config_t *next_cfg; /* a reloaded snapshot not taken yet (retained) */
   unsigned notices;
   int64_t drain_timeout_ms;
   uint64_t ping; /* the last ping sent (loops_ping) */
   atomic_uint_fast64_t pong; /* the last ping this loop answered */
   bool posted;  /* a loop_notice_cb is queued */
   bool stopped; /* NOTICE_STOP sent: nothing else is posted */
} loop_t;

struct loops {
   unsigned n;
   unsigned next; /* round robin */
   loop_t *loops;
   loopwake_t **wakes;
   struct event *retry_ev; /* on loop 0 */
   struct event *heartbeat_ev; /* on loop 0: pings every loop (base/heartbeat.h) */
   atomic_size_t handed_off; /* sockets in the slots */
   /* Drain: loops that reported empty, and what to call when all did. */
   atomic_uint drained;
   bool draining;
   bool stopped; /* loops_stop ran */
   uint64_t ping_seq; /* loops_ping */
   void (*on_empty) (void *);
   void *on_empty_ctx;
};

struct event_base *
loops_base_new (void)
{
   struct event_config *ec = event_config_new ();
   struct event_base *base = NULL;

   if (ec && event_config_set_flag (ec, EVENT_BASE_FLAG_NOLOCK) == 0)
      base = event_base_new_with_config (ec);
   if (ec)
      event_config_free (ec);
   return base;
}

unsigned
loops_wanted (const config_t *cfg)
{
   long cores;

   unsigned n;

   if (cfg->threads > 0) {
      n = (unsigned) (cfg->threads < CLIENT_LOOPS_MAX ? cfg->threads : CLIENT_LOOPS_MAX);
   } else {
      cores = sysconf (_SC_NPROCESSORS_ONLN);
      if (cores < 1)
         cores = 1;
      n = (unsigned) (cores < CONFIG_THREADS_DEFAULT_MAX ? cores : CONFIG_THREADS_DEFAULT_MAX);
   }
   /* Pooled: every loop needs a connection of its own to lend. */
   if (cfg->pool_mode_id == CONFIG_POOL_POOLED && (int64_t) n > cfg->pool_size)
      n = (unsigned) cfg->pool_size;
   return n;
}

/* ------------------------------------------------------------ drain */

/* On loop 0: a loop reported empty; the last one ends the drain. */
static void
loops_drained_cb (void *arg)
{
   loops_t *l = arg;

   if (!l->draining || atomic_load (&l->drained) < l->n || !l->on_empty)
      return;
   l->draining = false;
   l->on_empty (l->on_empty_ctx);
}

/* On loop t: its last connection is gone. */
static void
loop_empty_cb (void *arg)
{
   loop_t *t = arg;
   loops_t *l = t->owner;

   atomic_fetch_add (&l->drained, 1);
   if (t->index == 0) {
      loops_drained_cb (l);
      return;
   }
   /* A post that does not fit loop 0's queue is not lost: loop 0 counts
    * the reports every LOOPS_DRAIN_CHECK_MS while it drains. */
   if (!loopwake_post (l->loops[0].wake, loops_drained_cb, l))
      log_debug ("loop %u: drained; loop 0's wake-up queue is full, its drain check counts it", t->index);
}

/* ------------------------------------------------------------ notices */

/* On loop t: everything waiting in its slot. */
static void
loop_notice_cb (void *arg)
{
   loop_t *t = arg;
   handoff_t q[LOOPS_HANDOFF_MAX];
   unsigned n = 0, notices;
   config_t *cfg;
   int64_t drain_ms;
   uint64_t ping;
   bson_error_t error;

   pthread_mutex_lock (&t->mu);
   t->posted = false;
   while (t->q_len > 0) {
      q[n++] = t->q[t->q_head];
      t->q_head = (t->q_head + 1) % LOOPS_HANDOFF_MAX;
      t->q_len--;
   }
   cfg = t->next_cfg;
   t->next_cfg = NULL;
   notices = t->notices;
   t->notices = 0;
   drain_ms = t->drain_timeout_ms;
   ping = t->ping;
   pthread_mutex_unlock (&t->mu);

   if (notices & NOTICE_PING) {
      atomic_store (&t->pong, ping);
      heartbeat_answered (t->index);
   }

   if (cfg) {
      if (t->clients)
         client_loop_set_config (t->clients, cfg);
      config_release (cfg);
   }
   for (unsigned i = 0; i < n; i++) {
      atomic_fetch_sub (&t->owner->handed_off, 1);
      if (!t->clients) {
         evutil_closesocket (q[i].fd);
         continue;
      }
      if (!client_accept (t->clients, q[i].fd, (struct sockaddr *) &q[i].addr, q[i].addr_len, q[i].server_tls, &error))
         log_error ("loop %u: accept: %s", t->index, error.message);
   }
   if ((notices & NOTICE_TOPOLOGY) && t->clients)
      client_loop_topology_changed (t->clients);
   if (notices & NOTICE_DRAIN) {
      if (t->clients)
         client_loop_drain (t->clients, drain_ms, loop_empty_cb, t);
      else
         loop_empty_cb (t);
   }
   if (notices & NOTICE_STOP)
      event_base_loopexit (t->base, NULL);
}

/* On loop 0, with t->mu held: makes sure a loop_notice_cb is queued. */
static void
loop_post_locked (loops_t *l, loop_t *t)
{
   struct timeval tv;

   if (t->posted)
      return;
   if (loopwake_post (t->wake, loop_notice_cb, t)) {
      t->posted = true;
      return;
   }
   tv = clock_timeval_ms (LOOPS_POST_RETRY_MS);
   evtimer_add (l->retry_ev, &tv);
}

/* On loop 0: posts again to the loops that have something waiting. */
static void
loops_retry_cb (evutil_socket_t fd, short what, void *arg)
{
   loops_t *l = arg;

   (void) fd;
   (void) what;
   for (unsigned i = 1; i < l->n; i++) {
      loop_t *t = &l->loops[i];
      pthread_mutex_lock (&t->mu);
      if (t->q_len > 0 || t->next_cfg || t->notices)
         loop_post_locked (l, t);
      pthread_mutex_unlock (&t->mu);
   }
   loops_drained_cb (l);
   if (l->draining) {
      struct timeval tv = clock_timeval_ms (LOOPS_DRAIN_CHECK_MS);
      evtimer_add (l->retry_ev, &tv);
   }
}

/* On loop 0: adds `notices` to loop t's slot. */
static void
loop_notify (loops_t *l, loop_t *t, unsigned notices)
{
   pthread_mutex_lock (&t->mu);
   if (!t->stopped) {
      t->notices |= notices;
      t->stopped = (notices & NOTICE_STOP) != 0;
      loop_post_locked (l, t);
   }
   pthread_mutex_unlock (&t->mu);
}

/* On loop 0, every HEARTBEAT_PING_MS: loop 0 is turning; the others are
 * asked to show that they are (/healthz reads the answers). */
static void
loops_heartbeat_cb (evutil_socket_t fd, short what, void *arg)
{
   loops_t *l = arg;
   int64_t now = clock_mono_ms ();

   (void) fd;
   (void) what;
   heartbeat_tick (now);
   for (unsigned i = 1; i < l->n; i++) {
      heartbeat_asked (i, now); /* before the notice its answer clears */
      loop_notify (l, &l->loops[i], NOTICE_PING);
   }
}

/* ------------------------------------------------------------ pooled mode */

/* What a pooled loop's connections call of pool and login (proxy/conn.h):
 * the modules built on the connection, installed from here, above them. */
static const client_pooled_ops_t loops_pooled_ops = {
   .pool_new = pool_new,
   .pool_destroy = pool_destroy,
   .pool_topology_changed = pool_topology_changed,
   .pool_reconnect = pool_reconnect,
   .pool_hello = pool_hello,
   .pool_want_hello = pool_want_hello,
   .pool_last_error = pool_last_error,
   .pool_wants_flush = pool_wants_flush,
   .pool_settle = pool_settle,
   .pool_client_closed = pool_client_closed,
   .pool_server_lost = pool_server_lost,
   .pool_server_name = pool_server_name,
   .pool_server_not_primary = pool_server_not_primary,
   .login_deadline_start = login_deadline_start,
   .login_stop = login_stop,
   .login_destroy = login_destroy,
   .login_user = login_user,
};

/* ------------------------------------------------------------ threads */

static void *
loop_thread_main (void *arg)
{
   loop_t *t = arg;
   char name[16];

   snprintf (name, sizeof name, "loop%u", t->index);
   log_set_thread_name (name);
   event_base_dispatch (t->base);
   /* On this thread: the connections' per-thread state is here. */
   client_loop_destroy (t->clients);
   t->clients = NULL;
   return NULL;
}

static bool
loop_init (loops_t *l, loop_t *t, unsigned nloops, topology_t *topo, tls_upstream_t *tls, config_t *cfg,
           client_request_hook_t hook, bson_error_t *error)
{
   pthread_mutex_init (&t->mu, NULL);
   t->owner = l;
   t->q = bson_malloc0 (LOOPS_HANDOFF_MAX * sizeof *t->q);
   if (t->index > 0) {
      t->base = loops_base_new ();
      if (!t->base) {
         bson_set_error (error, LOOPS_ERROR_DOMAIN, LOOPS_ERR_EVENT_BASE, "loop %u: cannot create its event base", t->index);
         return false;
      }
      t->wake = loopwake_new (t->base, error);
      if (!t->wake)
         return false;
   }
   l->wakes[t->index] = t->wake;
   t->clients = client_loop_new (t->base, t->index, topo, tls, cfg, error);
   if (!t->clients)
      return false;
   /* Big requests are decompressed and validated on a thread of the loop's own. */
   if (!client_loop_set_wake (t->clients, t->wake, error))
      return false;
   client_loop_set_request_hook (t->clients, hook, NULL);
   /* Pooled mode: each loop lends connections of its own, with a share of
    * pool_size it keeps under contention and the rest shared (proxy/pool.h). */
   if (cfg->pool_mode_id == CONFIG_POOL_POOLED &&
       !client_loop_enable_pool (t->clients, &loops_pooled_ops, pool_share (cfg->pool_size, t->index, nloops), error))
      return false;
   /* Before the thread starts: the admin thread may post at once. */
   operator_attach (t->index, t->clients, t->wake, client_loop_operator);
   if (t->index > 0) {
      if (pthread_create (&t->thread, NULL, loop_thread_main, t) != 0) {
         bson_set_error (error, LOOPS_ERROR_DOMAIN, LOOPS_ERR_THREAD, "loop %u: cannot start its thread", t->index);
         return false;
      }
      t->started = true;
   }
   return true;
}

loops_t *
loops_new (struct event_base *base0,
           loopwake_t *wake0,
           unsigned n,
           topology_t *topo,
           tls_upstream_t *tls,
           config_t *cfg,
           client_request_hook_t hook,
           bson_error_t *error)
{
   loops_t *l;

   if (n < 1 || n > CLIENT_LOOPS_MAX) {
      bson_set_error (error, LOOPS_ERROR_DOMAIN, LOOPS_ERR_THREADS, "threads = %u: between 1 and %d", n, CLIENT_LOOPS_MAX);
      return NULL;
   }
   l = bson_malloc0 (sizeof *l);
   l->loops = bson_malloc0 (n * sizeof *l->loops);
   l->wakes = bson_malloc0 (n * sizeof *l->wakes);
   l->loops[0].base = base0;
   l->loops[0].wake = wake0;
   l->retry_ev = evtimer_new (base0, loops_retry_cb, l);
   if (!l->retry_ev) {
      bson_set_error (error, LOOPS_ERROR_DOMAIN, LOOPS_ERR_NO_MEMORY, "out of memory for the loops' retry timer");
      bson_free (l->wakes);
      bson_free (l->loops);
      bson_free (l);
      return NULL;
   }
   for (unsigned i = 0; i < n; i++) {
      l->loops[i].index = i;
      l->n = i + 1;
      if (!loop_init (l, &l->loops[i], n, topo, tls, cfg, hook, error)) {
         loops_destroy (l);
         return NULL;
      }
   }
   counters_set (COUNTER_FORWARDING_LOOPS, n);
   heartbeat_start (n, clock_mono_ms ());
   l->heartbeat_ev = event_new (base0, -1, EV_PERSIST, loops_heartbeat_cb, l);
   {
      struct timeval tv = clock_timeval_ms (HEARTBEAT_PING_MS);
      if (!l->heartbeat_ev || event_add (l->heartbeat_ev, &tv) != 0) {
         bson_set_error (error, LOOPS_ERROR_DOMAIN, LOOPS_ERR_NO_MEMORY, "out of memory for the loops' heartbeat timer");
         loops_destroy (l);
         return NULL;
      }
   }
   if (cfg->pool_mode_id == CONFIG_POOL_POOLED) {
      counters_set (COUNTER_POOL_SIZE, (uint64_t) cfg->pool_size);
      log_info ("pooled mode: clients share %" PRId64 " upstream connections (%u forwarding loop%s)%s", cfg->pool_size,
                n, n == 1 ? "" : "s",
                cfg->users ? "; clients log in with the users of auth_file"
                           : "; no auth_file: clients are not authenticated by the proxy");
   }
   if (n > 1)
      log_info ("%u forwarding loops (threads = %" PRId64 "%s)", n, cfg->threads, cfg->threads ? "" : ": one per core");
   return l;
}

unsigned
loops_count (const loops_t *l)
{
   return l->n;
}

loopwake_t *const *
loops_wakes (const loops_t *l)
{
   return l->wakes;
}

size_t
loops_clients (const loops_t *l)
{
   return (size_t) counters_get (COUNTER_CONNECTIONS_OPEN) + atomic_load (&l->handed_off);
}

bool
loops_accept (loops_t *l, evutil_socket_t fd, const struct sockaddr *addr, int addr_len, SSL_CTX *server_tls,
              bson_error_t *error)
{
   for (unsigned tries = 0; tries < l->n; tries++) {
      loop_t *t = &l->loops[l->next];

      l->next = (l->next + 1) % l->n;
      if (t->index == 0)
         break;
      pthread_mutex_lock (&t->mu);
      if (!t->stopped && t->q_len < LOOPS_HANDOFF_MAX && (size_t) addr_len <= sizeof t->q[0].addr) {
         handoff_t *h = &t->q[(t->q_head + t->q_len) % LOOPS_HANDOFF_MAX];
         h->fd = fd;
         memcpy (&h->addr, addr, (size_t) addr_len);
         h->addr_len = addr_len;
         h->server_tls = server_tls;
         t->q_len++;
         atomic_fetch_add (&l->handed_off, 1);
         loop_post_locked (l, t);
         pthread_mutex_unlock (&t->mu);
         return true;
      }
      pthread_mutex_unlock (&t->mu);
   }
   /* Loop 0's turn, or every other loop's queue is full. */
   if (!l->loops[0].clients) {
      evutil_closesocket (fd);
      bson_set_error (error, LOOPS_ERROR_DOMAIN, LOOPS_ERR_CLOSED, "the loops are closed");
      return false;
   }
   return client_accept (l->loops[0].clients, fd, addr, addr_len, server_tls, error);
}

void
loops_set_config (loops_t *l, config_t *cfg)
{
   if (l->loops[0].clients)
      client_loop_set_config (l->loops[0].clients, cfg);
   for (unsigned i = 1; i < l->n; i++) {
      loop_t *t = &l->loops[i];
      pthread_mutex_lock (&t->mu);
      if (!t->stopped) {
         config_release (t->next_cfg);
         t->next_cfg = config_retain (cfg);
         loop_post_locked (l, t);
      }
      pthread_mutex_unlock (&t->mu);
   }
}

bool
loops_ping (loops_t *l)
{
   bool all = true;

   l->ping_seq++;
   for (unsigned i = 1; i < l->n; i++) {
      loop_t *t = &l->loops[i];
      pthread_mutex_lock (&t->mu);
      if (!t->stopped) {
         if (atomic_load (&t->pong) != t->ping) {
            all = false;
            log_warn ("loop %u has not answered for %" PRIu64 " watchdog intervals", t->index, l->ping_seq - 1 - atomic_load (&t->pong));
         }
         t->ping = l->ping_seq;
         t->notices |= NOTICE_PING;
         loop_post_locked (l, t);
      }
      pthread_mutex_unlock (&t->mu);
   }
   return all;
}

void
loops_topology_changed (loops_t *l)
{
   if (l->loops[0].clients)
      client_loop_topology_changed (l->loops[0].clients);
   for (unsigned i = 1; i < l->n; i++)
      loop_notify (l, &l->loops[i], NOTICE_TOPOLOGY);
}

void
loops_drain (loops_t *l, int64_t timeout_ms, void (*on_empty) (void *), void *ctx)
{
   l->draining = true;
   l->on_empty = on_empty;
   l->on_empty_ctx = ctx;
   atomic_store (&l->drained, 0);
   for (unsigned i = 1; i < l->n; i++) {
      loop_t *t = &l->loops[i];
      pthread_mutex_lock (&t->mu);
      t->drain_timeout_ms = timeout_ms;
      pthread_mutex_unlock (&t->mu);
      loop_notify (l, t, NOTICE_DRAIN);
   }
   {
      struct timeval tv = clock_timeval_ms (LOOPS_DRAIN_CHECK_MS);
      evtimer_add (l->retry_ev, &tv);
   }
   /* Last: loop 0 may be empty already and report at once, which then
    * waits for the others' reports. */
   if (l->loops[0].clients)
      client_loop_drain (l->loops[0].clients, timeout_ms, loop_empty_cb, &l->loops[0]);
   else
      loop_empty_cb (&l->loops[0]);
}

void
loops_close_all (loops_t *l)
{
   l->draining = false;
   for (unsigned i = 1; i < l->n; i++)
      loop_notify (l, &l->loops[i], NOTICE_STOP);
   operator_detach (0);
   client_loop_destroy (l->loops[0].clients);
   l->loops[0].clients = NULL;
}

void
loops_stop (loops_t *l)
{
   if (!l || l->stopped)
      return;
   l->stopped = true;
   l->draining = false;
   heartbeat_stop ();
   if (l->heartbeat_ev)
      event_del (l->heartbeat_ev);
   /* The admin thread's posts find nothing from now on (it may still run). */
   for (unsigned i = 0; i < l->n; i++)
      operator_detach (i);
   for (unsigned i = 1; i < l->n; i++) {
      loop_t *t = &l->loops[i];
      if (t->started) {
         loop_notify (l, t, NOTICE_STOP);
         /* Loop 0 no longer runs its retry timer: until a notice is
          * queued, post here (the thread exits at the notice). */
         for (;;) {
            bool posted;
            pthread_mutex_lock (&t->mu);
            posted = t->posted;
            if (!posted)
               posted = t->posted = loopwake_post (t->wake, loop_notice_cb, t);
            pthread_mutex_unlock (&t->mu);
            if (posted)
               break;
            usleep (1000);
         }
         pthread_join (t->thread, NULL);
      } else {
         client_loop_destroy (t->clients);
         t->clients = NULL;
      }
   }
   client_loop_destroy (l->loops[0].clients);
   l->loops[0].clients = NULL;
}

void
loops_destroy (loops_t *l)
{
   if (!l)
      return;
   loops_stop (l);
   for (unsigned i = 0; i < l->n; i++) {
      loop_t *t = &l->loops[i];
      /* Sockets handed off and never taken. */
      for (; t->q && t->q_len > 0; t->q_len--) {
         evutil_closesocket (t->q[t->q_head].fd);
         t->q_head = (t->q_head + 1) % LOOPS_HANDOFF_MAX;
      }
      config_release (t->next_cfg);
      t->next_cfg = NULL;
      bson_free (t->q);
      if (i > 0) {
         loopwake_destroy (t->wake);
         if (t->base)
            event_base_free (t->base);
      }
      pthread_mutex_destroy (&t->mu);
   }
   proxy_event_free (l->retry_ev);
   proxy_event_free (l->heartbeat_ev);
   bson_free (l->wakes);
   bson_free (l->loops);
   bson_free (l);
}
