/*
 * proxy/conn.c - a client connection's lifecycle: its states, who may read
 * (backpressure), the libevent callbacks, pairing with an upstream,
 * draining, and every way to close.  What flows through the connection
 * (framing, the in-flight FIFOs, forwarding and answers) is proxy/pump.c.
 *
 * Sides.  The client socket and the upstream connection are two sides of
 * one type (proxy/side.h); their callbacks come here through one table and
 * are told apart by the side's kind.
 *
 * Flow.  Each callback ends in one of two pumps (client_pump,
 * upstream_pump): route what is complete, then client_update_flow decides
 * what to read next and which drain callbacks are wanted, touching libevent
 * only when a decision changes.
 *
 * Memory.  Every connection's buffers and reservations count towards the
 * process-wide max_buffered_bytes; past it, sides with a large message to
 * receive are not read (see "memory" below).
 *
 * Loops.  Each forwarding loop (proxy/loops.h) has one client_loop_t and
 * owns its connections entirely; what loops share is process-wide and
 * thread-safe: connection ids, the counters, the clients registry, and
 * the memory bound, whose waiters on one loop are resumed by room given
 * back on another (mem_poke_others).
 *
 * Lifetime.  client_disconnect frees the sockets and timers at once (so no
 * callback of ours can fire again) and puts the struct on the loop's free
 * list; it is freed from an event on the next loop turn.  Any code that
 * calls something able to disconnect checks for CLIENT_STATE_CLOSING before
 * touching buffers again.
 */
#include "proxy/conn.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/loopwake.h"
#include "proxy/clients.h"
#include "proxy/conn_private.h"
#include "proxy/login.h"
#include "proxy/operator.h"
#include "proxy/pool.h"
#include "proxy/side.h"

static const char *const client_state_names[CLIENT_STATE_COUNT_] = {
   [CLIENT_STATE_AWAIT_UPSTREAM] = "await_upstream",
   [CLIENT_STATE_HANDSHAKE] = "handshake",
   [CLIENT_STATE_READY] = "ready",
   [CLIENT_STATE_DRAINING] = "draining",
   [CLIENT_STATE_CLOSING] = "closing",
};

const char *
client_state_name (client_state_t state)
{
   return (unsigned) state < CLIENT_STATE_COUNT_ ? client_state_names[state] : "invalid";
}

static void client_pump (client_conn_t *c);
static void upstream_pump (client_conn_t *c);
static void client_update_flow (client_conn_t *c);
static void client_timer_cb (evutil_socket_t fd, short what, void *arg);
static void mem_release_all (client_conn_t *c);
static void client_try_connect (client_conn_t *c);
static const side_callbacks_t conn_side_callbacks;

/* Takes `x` out of the doubly linked list of connections threaded through
 * its fields PREV and NEXT, whose first element is `head` (an lvalue).
 * The loop keeps two: its live connections and those waiting for memory. */
#define CONN_LIST_UNLINK(head, x, PREV, NEXT) \
   do {                                       \
      if ((x)->PREV)                          \
         (x)->PREV->NEXT = (x)->NEXT;         \
      else                                    \
         (head) = (x)->NEXT;                  \
      if ((x)->NEXT)                          \
         (x)->NEXT->PREV = (x)->PREV;         \
   } while (0)

/* ------------------------------------------------------------ state */

/* The transitions there are: forward through the handshake (from NONE
 * only at accept), to DRAINING once the upstream is paired,
 * and to CLOSING from anywhere; CLOSING is final. */
static bool __attribute__ ((unused)) /* only RELAYBUS_ASSERT calls it (gone with NDEBUG) */
client_transition_ok (client_state_t from, client_state_t to)
{
   switch (to) {
   case CLIENT_STATE_AWAIT_UPSTREAM:
      return from == CLIENT_STATE_NONE || from == CLIENT_STATE_READY; /* READY: client_repair */
   case CLIENT_STATE_HANDSHAKE:
      return from == CLIENT_STATE_AWAIT_UPSTREAM;
   case CLIENT_STATE_READY:
      return from == CLIENT_STATE_HANDSHAKE || from == CLIENT_STATE_AWAIT_UPSTREAM;
   case CLIENT_STATE_DRAINING:
      return from == CLIENT_STATE_HANDSHAKE || from == CLIENT_STATE_READY;
   case CLIENT_STATE_CLOSING:
      return from != CLIENT_STATE_CLOSING;
   default:
      return false;
   }
}

void
client_set_state (client_conn_t *c, client_state_t next)
{
   struct timeval tv;
   int64_t ms = 0;

   if (c->state == next)
      return;
   RELAYBUS_ASSERT (client_transition_ok (c->state, next));
   if (c->state != CLIENT_STATE_NONE)
      log_debug ("c%" PRIu64 " %s: %s -> %s",
              c->id,
              c->peer,
              client_state_name (c->state),
              client_state_name (next));
   c->state = next;
   /* /api/clients: before CLOSING frees the socket the registry reads. */
   clients_registry_note (
      c->id, c->loop->index, c->peer, side_is_open (&c->client) ? c->client.fd : -1, client_state_name (next),
      next != CLIENT_STATE_CLOSING);
   if (next == CLIENT_STATE_CLOSING)
      return;
   /* The per-state timer: each state has at most one deadline; a state
    * without one (READY, the long one) holds no timer. */
   if (c->timer)
      evtimer_del (c->timer);
   switch (next) {
   case CLIENT_STATE_AWAIT_UPSTREAM:
      ms = c->cfg->upstream_connect_timeout_ms;
      break;
   case CLIENT_STATE_HANDSHAKE:
      ms = c->cfg->handshake_timeout_ms;
      break;
   default:
      break;
   }
   if (ms > 0) {
      if (!c->timer)
         c->timer = evtimer_new (c->loop->base, client_timer_cb, c);
      tv = clock_timeval_ms (ms);
      if (c->timer)
         evtimer_add (c->timer, &tv);
      else
         log_conn (LOG_LEVEL_WARN, c->id, c->peer, "out of memory for a timer: %s has no deadline", client_state_name (next));
   } else if (c->timer) {
      event_free (c->timer);
      c->timer = NULL;
   }
   client_update_flow (c);
}

/* Whether a close for `reason` is logged as a warning: all but the
 * ordinary ends (the client left, the proxy stops, the primary moved). */
static bool
client_close_is_warning (counters_close_reason_t reason)
{
   switch (reason) {
   case COUNTERS_CLOSE_CLIENT_EOF:
   case COUNTERS_CLOSE_SHUTDOWN:
   case COUNTERS_CLOSE_NOT_PRIMARY:
   case COUNTERS_CLOSE_OPERATOR:
   case COUNTERS_CLOSE_RECONNECT:
      return false;
   default:
      return true;
   }
}

void
client_disconnect (client_conn_t *c, counters_close_reason_t reason, const char *fmt, ...)
{
   client_loop_t *loop = c->loop;
   char detail[512];
   va_list ap;
   bson_error_t error;

   if (c->state == CLIENT_STATE_CLOSING)
      return;
   va_start (ap, fmt);
   vsnprintf (detail, sizeof detail, fmt, ap);
   va_end (ap);
   log_conn (client_close_is_warning (reason) ? LOG_LEVEL_WARN : LOG_LEVEL_INFO,
             c->id,
             c->peer,
             "closing (%s) in %s: %s",
             counters_close_reason_name (reason),
             client_state_name (c->state),
             detail);
   counters_count_close (reason);
   counters_sub (COUNTER_CONNECTIONS_OPEN, 1);
   /* Pooled: the lent connection goes back to the pool, or is closed when
    * something of this client is still in flight on it (in doubt); the
    * client leaves the pool's wait list.  Before CLOSING: detaching
    * counts its buffers out of this connection's memory. */
   if (c->loop->pool)
      pool_client_closed (c);
   client_set_state (c, CLIENT_STATE_CLOSING);
   mem_release_all (c);

   /* Sockets and timers go now: nothing of ours can fire after this. */
   if (c->upstream.connected)
      counters_sub (COUNTER_UPSTREAMS_OPEN, 1);
   side_close (&c->upstream);
   side_close (&c->client);
   proxy_event_free (c->timer);
   c->timer = NULL;
   login_deadline_stop (c);

   /* Internal requests learn that no reply will come (their owners free
    * their context).  They may not send anything: the state is CLOSING. */
   bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_CLOSED, "connection closed: %s", detail);
   while (c->up_count > 0) {
      upstream_req_t u = c->flight->upreqs[c->up_head];
      upreq_pop (c);
      if (u.kind == UPREQ_INTERNAL && u.cb)
         u.cb (c, NULL, &error, u.cb_ctx);
   }
   for (uint64_t s = c->creq_head; s < c->creq_tail; s++) {
      client_req_t *r = creq_find (c, s);
      proxy_evbuffer_free (r->held);
      r->held = NULL;
   }
   c->creq_head = c->creq_tail;
   client_job_cancel (c);

   /* Off the live list, onto the free list. */
   CONN_LIST_UNLINK (loop->clients, c, prev, next);
   RELAYBUS_ASSERT (loop->nclients > 0);
   loop->nclients--;
   c->prev = NULL;
   c->next = loop->free_list;
   loop->free_list = c;
   event_active (loop->free_ev, EV_READ, 0);

   if (loop->draining && loop->nclients == 0 && loop->on_empty) {
      void (*cb) (void *) = loop->on_empty;
      loop->on_empty = NULL;
      cb (loop->on_empty_ctx);
   }
}

static void
client_free (client_conn_t *c)
{
   if (c->data_destroy)
      c->data_destroy (c->data);
   login_destroy (c->login);
   bson_free (c->sasl);
   proxy_evbuffer_free (c->scratch);
   proxy_evbuffer_free (c->tmp);
   config_release (c->cfg);
   bson_free (c->upstream_name);
   bson_free (c->flight);
   bson_free (c);
}

static void
client_loop_free_cb (evutil_socket_t fd, short what, void *arg)
{
   client_loop_t *loop = arg;

   while (loop->free_list) {
      client_conn_t *c = loop->free_list;
      loop->free_list = c->next;
      client_free (c);
   }
}

/* ------------------------------------------------------------ memory */

/*
 * The process-wide bound on buffered bytes ([proxy] max_buffered_bytes).
 * COUNTER_BUFFERED_BYTES (atomic: the admin thread reads it; it is the one
 * process counter, should there be several loops) is the sum over the
 * connections of
 *   - mem_held: the bytes in their buffers (client and upstream, input and
 *     output, decompressed requests, re-encoded and held answers), kept
 *     exact by an evbuffer callback on each, but for the sockets of direct
 *     (plain) sides: those are counted by their lengths where every pump
 *     ends, in client_update_flow, and before a reservation (mem_sync_side;
 *     a buffer callback runs on every add and drain, four per message);
 *   - reservations: the rest of a partial message whose header announced
 *     its length (each side's mem_partial), and for a request its
 *     decompressed size or the copy it is validated from, plus its bytes
 *     while the decoding thread has them (mem_decode).
 * A side of a connection is read only while the rest of the message it is
 * receiving is reserved; a reservation that does not fit under the bound
 * puts the connection on the loop's wait list with that side unread: the
 * clients stopped are those with the largest messages coming, while small
 * requests (whole in one read) never wait.  Messages already reserved
 * finish, leave towards their destination and free their room; when the
 * total is below the low mark (three quarters of the bound) the waiters
 * are resumed oldest first, each as its reservation fits.  A newcomer may
 * not take the room the oldest waiter needs, so none starves.  Beyond the
 * bound only one read per connection (4 KiB, a TLS record) is unreserved.
 * Per-connection watermarks keep working underneath.
 */

#define MEM_LOG_INTERVAL_MS 10000

/* Room is process-wide, waiters are per loop: a loop that gives room back
 * while other loops have waiters posts them a resume (one queued at a time
 * per loop).  `loop` and `wake` are set and cleared under mem_slots_mu;
 * the post's callback runs on the slot's own loop, which alone frees it,
 * so it reads `loop` there without the lock. */
typedef struct {
   client_loop_t *loop;
   loopwake_t *wake;
   atomic_bool waiting; /* the loop has connections waiting for memory */
   atomic_bool posted;  /* a resume is queued on its wake */
} mem_slot_t;

static mem_slot_t mem_slots[CLIENT_LOOPS_MAX];
static pthread_mutex_t mem_slots_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint mem_loops_waiting; /* slots with `waiting` set */

static int64_t
mem_total (void)
{
   return (int64_t) counters_get (COUNTER_BUFFERED_BYTES);
}

static int64_t
mem_low_mark (const client_loop_t *loop)
{
   return loop->cfg->max_buffered_bytes / 4 * 3;
}

/* Room went up: resume waiters from mem_ev (never from inside a buffer
 * callback, where a pump must not run). */
static void
mem_maybe_resume (client_loop_t *loop)
{
   if (loop->mem_wait_head && !loop->mem_ev_active && mem_total () <= mem_low_mark (loop)) {
      loop->mem_ev_active = true;
      event_active (loop->mem_ev, EV_READ, 0);
   }
}

/* On the slot's loop: another loop gave room back. */
static void
mem_remote_cb (void *arg)
{
   mem_slot_t *slot = arg;

   atomic_store (&slot->posted, false);
   if (slot->loop)
      mem_maybe_resume (slot->loop);
}

/* Room went up on `loop`: the other loops' waiters may go on too. */
static void
mem_poke_others (client_loop_t *loop)
{
   if (mem_total () > mem_low_mark (loop))
      return;
   for (unsigned i = 0; i < CLIENT_LOOPS_MAX; i++) {
      mem_slot_t *slot = &mem_slots[i];
      bool ok = false;

      if (i == loop->index || !atomic_load (&slot->waiting) || atomic_exchange (&slot->posted, true))
         continue;
      pthread_mutex_lock (&mem_slots_mu);
      if (slot->loop && slot->wake)
         ok = loopwake_post (slot->wake, mem_remote_cb, slot);
      pthread_mutex_unlock (&mem_slots_mu);
      /* Full, or the loop is going: the next room given back tries again. */
      if (!ok)
         atomic_store (&slot->posted, false);
   }
}

static void
mem_give_back (client_loop_t *loop, int64_t n)
{
   if (n > 0) {
      counters_sub (COUNTER_BUFFERED_BYTES, n);
      mem_maybe_resume (loop);
      if (atomic_load_explicit (&mem_loops_waiting, memory_order_relaxed) > (loop->mem_wait_head ? 1u : 0u))
         mem_poke_others (loop);
   }
}

/* The loop's wait list went from empty to not, or back. */
static void
mem_set_waiting (client_loop_t *loop, bool waiting)
{
   mem_slot_t *slot = &mem_slots[loop->index];

   if (atomic_exchange (&slot->waiting, waiting) == waiting)
      return;
   if (waiting)
      atomic_fetch_add (&mem_loops_waiting, 1);
   else
      atomic_fetch_sub (&mem_loops_waiting, 1);
}

static void
mem_account (client_conn_t *c, int64_t delta)
{
   c->mem_held += delta;
   if (delta > 0)
      counters_add (COUNTER_BUFFERED_BYTES, delta);
   else
      mem_give_back (c->loop, -delta);
}

/* Any of the connection's buffers changed. */
static void
mem_cb (struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
   client_conn_t *c = arg;

   if (c->state != CLIENT_STATE_CLOSING)
      mem_account (c, (int64_t) info->n_added - (int64_t) info->n_deleted);
}

/* An input: bytes that arrive for a partial message were reserved, so
 * they turn from reservation into held bytes. */
static void
mem_input_cb (client_conn_t *c, int64_t *partial, const struct evbuffer_cb_info *info)
{
   int64_t added = (int64_t) info->n_added;
   int64_t take = added < *partial ? added : *partial;

   if (c->state == CLIENT_STATE_CLOSING)
      return;
   RELAYBUS_ASSERT (*partial >= 0);
   if (take > 0) {
      *partial -= take;
      counters_sub (COUNTER_BUFFERED_BYTES, take);
   }
   mem_account (c, added - (int64_t) info->n_deleted);
}

static void
mem_side_in_cb (struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
   side_t *s = arg;
   mem_input_cb (s->owner, &s->mem_partial, info);
}

void
client_mem_watch (client_conn_t *c, struct evbuffer *buf)
{
   (void) evbuffer_add_cb (buf, mem_cb, c);
}

static bool
lazy_buffer (client_conn_t *c, struct evbuffer **buf, bson_error_t *error)
{
   if (!*buf) {
      *buf = evbuffer_new ();
      if (!*buf || !evbuffer_add_cb (*buf, mem_cb, c)) {
         proxy_evbuffer_free (*buf);
         *buf = NULL;
         bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory for a buffer");
         return false;
      }
   }
   evbuffer_drain (*buf, evbuffer_get_length (*buf));
   return true;
}

bool
client_tmp (client_conn_t *c, bson_error_t *error)
{
   return lazy_buffer (c, &c->tmp, error);
}

bool
client_scratch (client_conn_t *c, bson_error_t *error)
{
   return lazy_buffer (c, &c->scratch, error);
}

/* What an idle connection need not hold: its FIFO slots and its empty
 * work buffers (scratch stays while compression is on: every request
 * needs it).  Only where nothing points into them. */
static void
client_settle (client_conn_t *c)
{
   client_flight_settle (c);
   if (c->tmp && evbuffer_get_length (c->tmp) == 0) {
      evbuffer_free (c->tmp);
      c->tmp = NULL;
   }
   if (c->scratch && c->compressors_negotiated == 0 && evbuffer_get_length (c->scratch) == 0) {
      evbuffer_free (c->scratch);
      c->scratch = NULL;
   }
}

static void
mem_unwatch_side (side_t *s)
{
   if (s->mem_cb_in)
      evbuffer_remove_cb_entry (side_input (s), s->mem_cb_in);
   if (s->mem_cb_out)
      evbuffer_remove_cb_entry (side_output (s), s->mem_cb_out);
   s->mem_cb_in = s->mem_cb_out = NULL;
}

/* Counts a side's input and output: by buffer callbacks, or, for a
 * direct side, by mem_sync_side from the lengths it counted last (none
 * yet).  False: out of memory. */
static bool
mem_watch_side (client_conn_t *c, side_t *s)
{
   s->mem_read = 0;
   s->mem_in_seen = s->mem_out_seen = 0;
   if (s->direct)
      return true;
   s->mem_cb_in = evbuffer_add_cb (side_input (s), mem_side_in_cb, s);
   s->mem_cb_out = evbuffer_add_cb (side_output (s), mem_cb, c);
   return s->mem_cb_in && s->mem_cb_out;
}

/* A side counted by callbacks went direct: from now on by its lengths,
 * which the callbacks counted up to here. */
static void
mem_side_went_direct (side_t *s)
{
   mem_unwatch_side (s);
   s->mem_read = 0;
   s->mem_in_seen = evbuffer_get_length (side_input (s));
   s->mem_out_seen = evbuffer_get_length (side_output (s));
}

/* Brings a direct side's count up to date.  Its input grows only by its
 * own reads (mem_read), so what left it is the rest; its reserved bytes
 * turn into held ones as they arrive, as in mem_input_cb.  Its output
 * shrinks by its own writes (side_flush), which this follows, and while
 * the socket is full by libevent's writes, which run without us: a buffer
 * callback counts the output then. */
static void
mem_sync_side (client_conn_t *c, side_t *s)
{
   struct evbuffer *out;
   size_t in_len, out_len;

   if (!s->direct || c->state == CLIENT_STATE_CLOSING)
      return;
   in_len = evbuffer_get_length (side_input (s));
   if (s->mem_read > 0 || in_len != s->mem_in_seen) {
      struct evbuffer_cb_info info = {
         .orig_size = s->mem_in_seen,
         .n_added = (size_t) s->mem_read,
         .n_deleted = s->mem_in_seen + (size_t) s->mem_read - in_len,
      };
      RELAYBUS_ASSERT (s->mem_in_seen + (size_t) s->mem_read >= in_len);
      s->mem_read = 0;
      s->mem_in_seen = in_len;
      mem_input_cb (c, &s->mem_partial, &info);
   }
   out = side_output (s);
   if (!s->mem_cb_out) {
      out_len = evbuffer_get_length (out);
      if (out_len != s->mem_out_seen) {
         mem_account (c, (int64_t) out_len - (int64_t) s->mem_out_seen);
         s->mem_out_seen = out_len;
      }
      /* Counted up to here; libevent's writes from now on by the callback. */
      if (s->libevent_writes && !(s->mem_cb_out = evbuffer_add_cb (out, mem_cb, c)))
         log_conn (LOG_LEVEL_WARN, c->id, c->peer, "out of memory for a buffer callback: the count may lag");
   } else if (!s->libevent_writes) {
      evbuffer_remove_cb_entry (out, s->mem_cb_out);
      s->mem_cb_out = NULL;
      s->mem_out_seen = evbuffer_get_length (out);
   }
}

/* A side's input and output lengths right after mem_sync_side (which read
 * them already, for a direct side that libevent does not write). */
static size_t
mem_synced_in_len (side_t *s)
{
   return s->direct ? s->mem_in_seen : evbuffer_get_length (side_input (s));
}

static size_t
mem_synced_out_len (side_t *s)
{
   return s->direct && !s->mem_cb_out ? s->mem_out_seen : evbuffer_get_length (side_output (s));
}

static bool
mem_try_reserve (client_conn_t *c, int64_t n)
{
   client_loop_t *loop = c->loop;
   int64_t room = loop->cfg->max_buffered_bytes - mem_total ();

   if (loop->mem_wait_head && loop->mem_wait_head != c)
      room -= loop->mem_wait_head->mem_need; /* the oldest waiter's turn */
   if (n > room)
      return false;
   counters_add (COUNTER_BUFFERED_BYTES, n);
   return true;
}

/* What a connection waits for: reading its client (a partial request),
 * reading its upstream (a partial reply), or decompressing the request at
 * the front of its input (the client is not read meanwhile either). */
#define MEM_SIDE_CLIENT 1u
#define MEM_SIDE_UP 2u
#define MEM_SIDE_DECODE 4u

static void
mem_wait (client_conn_t *c, unsigned side, int64_t need)
{
   client_loop_t *loop = c->loop;
   int64_t now;

   if (c->mem_wait_sides) {
      c->mem_wait_sides |= side;
      c->mem_need = need > c->mem_need ? need : c->mem_need;
      return;
   }
   c->mem_wait_sides = side;
   c->mem_need = need;
   c->mem_wait_next = NULL;
   c->mem_wait_prev = loop->mem_wait_tail;
   if (loop->mem_wait_tail) {
      loop->mem_wait_tail->mem_wait_next = c;
   } else {
      loop->mem_wait_head = c;
      mem_set_waiting (loop, true);
   }
   loop->mem_wait_tail = c;
   counters_add (COUNTER_CONNECTIONS_PAUSED_MEMORY, 1);
   counters_add (COUNTER_MEMORY_PAUSES, 1);
   log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "waiting for memory: %" PRId64 " bytes", need);
   loop->mem_episode_pauses++;
   if (loop->mem_pause_started_ms)
      return;
   now = clock_mono_ms ();
   loop->mem_pause_started_ms = now;
   if (!loop->mem_last_log_ms || now - loop->mem_last_log_ms >= MEM_LOG_INTERVAL_MS) {
      loop->mem_last_log_ms = now;
      log_warn ("memory: %" PRId64 " bytes buffered, max_buffered_bytes=%" PRId64
                ": not reading from clients with large messages until it drains below %" PRId64,
                mem_total (),
                loop->cfg->max_buffered_bytes,
                mem_low_mark (loop));
   }
}

static void
mem_unwait (client_conn_t *c)
{
   client_loop_t *loop = c->loop;

   if (!c->mem_wait_sides)
      return;
   if (!c->mem_wait_next)
      loop->mem_wait_tail = c->mem_wait_prev;
   CONN_LIST_UNLINK (loop->mem_wait_head, c, mem_wait_prev, mem_wait_next);
   c->mem_wait_prev = c->mem_wait_next = NULL;
   c->mem_wait_sides = 0;
   c->mem_need = 0;
   counters_sub (COUNTER_CONNECTIONS_PAUSED_MEMORY, 1);
   if (!loop->mem_wait_head)
      mem_set_waiting (loop, false);
   if (!loop->mem_wait_head && loop->mem_pause_started_ms) {
      int64_t now = clock_mono_ms ();
      /* The end of an episode is logged when its start was (or when the
       * log is quiet enough again). */
      if (loop->mem_last_log_ms == loop->mem_pause_started_ms || now - loop->mem_last_log_ms >= MEM_LOG_INTERVAL_MS) {
         loop->mem_last_log_ms = now;
         log_info ("memory: reading from every client again after %" PRId64 " ms (%" PRIu64 " pauses), %" PRId64
                   " bytes buffered",
                   now - loop->mem_pause_started_ms,
                   loop->mem_episode_pauses,
                   mem_total ());
      }
      loop->mem_pause_started_ms = 0;
      loop->mem_episode_pauses = 0;
   }
}

static int64_t
mem_le32 (const uint8_t *p)
{
   return (int32_t) ((uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24);
}

/* Whether a side may read (called right after mem_sync_side): yes unless
 * a partial message in its input needs more room than is reserved and
 * that cannot be reserved; then the connection waits.  Everything a request will need is reserved at once,
 * when its header is first seen: the rest of its bytes, and for the client
 * side its decompressed size (OP_COMPRESSED) or the copy it is parsed from
 * (a request decoded off the loop).  So a connection never waits for
 * memory while it holds a message it has received: only while holding at
 * most one read, which is what keeps the waiting deadlock-free. */
static bool
mem_may_read (client_conn_t *c, side_t *s)
{
   bool client = s->kind == SIDE_CLIENT;
   struct evbuffer *in = side_input (s);
   int64_t *partial = &s->mem_partial;
   size_t avail = mem_synced_in_len (s);
   uint8_t hb[WIRE_HEADER_LEN + 9];
   int64_t len, rest, extra = 0;
   size_t got;

   if (c->mem_wait_sides & (client ? MEM_SIDE_CLIENT | MEM_SIDE_DECODE : MEM_SIDE_UP))
      return false;
   if (avail < WIRE_HEADER_LEN)
      return true;
   got = avail < sizeof hb ? WIRE_HEADER_LEN : sizeof hb;
   if (evbuffer_copyout (in, hb, got) != (ssize_t) got)
      return true;
   len = mem_le32 (hb);
   /* Complete, or refused once its header is read. */
   if (len <= (int64_t) avail || len > WIRE_MAX_MESSAGE_LEN)
      return true;
   if (client && c->mem_decode == 0) {
      if (mem_le32 (hb + 12) == WIRE_OP_COMPRESSED) {
         if (got < sizeof hb)
            return true; /* uncompressedSize not read yet: one more read */
         extra = mem_le32 (hb + WIRE_HEADER_LEN + 4);
         extra = extra >= 0 && extra <= WIRE_MAX_MESSAGE_LEN ? extra + WIRE_HEADER_LEN : 0;
      } else if (len >= CLIENT_OFFLOAD_MIN && c->loop->decoder) {
         extra = len;
      }
   }
   rest = len - (int64_t) avail - *partial;
   if (rest < 0)
      rest = 0;
   if (rest + extra == 0)
      return true;
   if (!mem_try_reserve (c, rest + extra)) {
      mem_wait (c, client ? MEM_SIDE_CLIENT : MEM_SIDE_UP, rest + extra);
      return false;
   }
   *partial += rest;
   c->mem_decode += extra;
   return true;
}

bool
client_mem_reserve_decode (client_conn_t *c, int64_t n)
{
   int64_t more = n - c->mem_decode;

   if (more <= 0)
      return true;
   mem_sync_side (c, &c->client);
   if (c->up)
      mem_sync_side (c, c->up);
   if (!mem_try_reserve (c, more)) {
      mem_wait (c, MEM_SIDE_DECODE, more);
      return false;
   }
   c->mem_decode += more;
   return true;
}

void
client_mem_release_decode (client_conn_t *c)
{
   int64_t n = c->mem_decode;

   RELAYBUS_ASSERT (n >= 0);
   c->mem_decode = 0;
   mem_give_back (c->loop, n);
}

/* The upstream side closes while the connection stays (client_repair), or
 * a pooled connection goes back to its pool: what its buffers held and its
 * partial reply reserved goes back. */
static void
mem_release_side (client_conn_t *c, side_t *s)
{
   struct evbuffer *in = side_input (s), *out = side_output (s);

   if (c->mem_wait_sides & MEM_SIDE_UP)
      mem_unwait (c);
   /* The callbacks (or the lengths, for a direct side) count the drains. */
   evbuffer_drain (in, evbuffer_get_length (in));
   evbuffer_unfreeze (out, 1);
   evbuffer_drain (out, evbuffer_get_length (out));
   evbuffer_freeze (out, 1);
   mem_sync_side (c, s);
   mem_unwatch_side (s);
   mem_give_back (c->loop, s->mem_partial);
   s->mem_partial = s->mem_read = 0;
   s->mem_in_seen = s->mem_out_seen = 0;
}

/* The connection closes: everything it held or reserved goes back. */
static void
mem_release_all (client_conn_t *c)
{
   mem_unwait (c);
   mem_unwatch_side (&c->client);
   mem_unwatch_side (&c->upstream);
   mem_give_back (c->loop, c->mem_held + c->client.mem_partial + c->upstream.mem_partial + c->mem_decode);
   c->mem_held = c->client.mem_partial = c->upstream.mem_partial = c->mem_decode = 0;
}

/* mem_ev: room below the low mark; waiters resume oldest first while
 * their reservations fit.  A resumed connection reserves in its pump (or
 * waits again, at the tail); each waiter is looked at once per run. */
static void
mem_resume_cb (evutil_socket_t fd, short what, void *arg)
{
   client_loop_t *loop = arg;
   client_conn_t *c;
   size_t budget = loop->nclients;

   loop->mem_ev_active = false;
   while ((c = loop->mem_wait_head) && budget-- > 0) {
      if (c->mem_need > loop->cfg->max_buffered_bytes - mem_total ())
         break;
      mem_unwait (c);
      client_pump (c);
      if (c->state != CLIENT_STATE_CLOSING)
         upstream_pump (c);
   }
}

/* ------------------------------------------------------------ flow */

/* Recomputes which sides may read.  Rules (le-proxy's, plus the FIFOs):
 *  - the client is read only in HANDSHAKE/READY, with the upstream
 *    connected, room in the FIFOs, and the upstream's output below the
 *    high watermark;
 *  - the upstream is read while the client's output is below it.
 * Write low watermarks are high/2, so the drain callbacks resume reading
 * with hysteresis.  A drain callback is installed only while its side's
 * output holds the other side back (and the client's while DRAINING,
 * which waits for its output to empty): every other resumption comes from
 * a read or a reply, which end here too.  Cheap when nothing changes:
 * beyond the writes themselves, only length reads and
 * bufferevent_get_enabled. */
static void
client_update_flow (client_conn_t *c)
{
   bool up = client_up_connected (c);
   bool up_full = false, client_full;
   size_t high;

   if (c->state == CLIENT_STATE_CLOSING)
      return;
   /* What the pump queued goes out first: the decisions below read the
    * outputs' lengths after it. */
   side_flush (&c->client);
   mem_sync_side (c, &c->client);
   if (up) {
      side_flush (c->up);
      mem_sync_side (c, c->up);
   }
   high = high_watermark (c);
   client_full = mem_synced_out_len (&c->client) >= high;
   if (up) {
      up_full = mem_synced_out_len (c->up) >= high;
      side_set_reading (c->up, !client_full && mem_may_read (c, c->up));
      /* Pooled: a connection that holds only moreToCome requests goes back
       * once they are written, so its drain is wanted then too. */
      side_want_drained (c->up, up_full || (c->server && pool_wants_flush (c)));
   }
   /* Pooled mode reads requests without a connection (hellos, logins and
    * whatever waits for one in the input), but not while it waits. */
   side_set_reading (&c->client,
                     (c->state == CLIENT_STATE_HANDSHAKE || (c->state == CLIENT_STATE_READY && !c->not_primary_seen)) &&
                        (up || (c->loop->pool && !c->server)) && !c->pool_waiting && !c->pool_handed &&
                        fifo_has_room (c) && !up_full && !c->job && !operator_paused () &&
                        mem_may_read (c, &c->client));
   side_want_drained (&c->client, client_full || c->state == CLIENT_STATE_DRAINING);
}

/* ------------------------------------------------------------ pumps */

/* The outermost pump's end: no FIFO slot is pointed at any more, so an
 * idle connection gives its slots back. */
static void
pump_end (client_conn_t *c)
{
   if (c->pumping == 0 && c->state != CLIENT_STATE_CLOSING) {
      /* Pooled: a lent connection with nothing in flight and no pin goes
       * back to the pool. */
      if (c->server)
         pool_settle (c);
      client_settle (c);
   }
}

/* Everything that may let requests through ends here: process what is
 * complete, then decide what to read next. */
static void
client_pump (client_conn_t *c)
{
   bool consumed;

   c->pumping++;
   /* After a not-primary error no request goes to the old member: what
    * is buffered waits for the new pairing (or the close).  While the
    * operator paused the proxy, what is buffered waits for the resume
    * (client_loop_operator pumps every connection then): what is in
    * flight was routed already and is answered meanwhile. */
   consumed = c->not_primary_seen || operator_paused () ? false : client_route (c, &c->client);
   if (c->state != CLIENT_STATE_CLOSING) {
      client_update_flow (c);
      side_timer_update (&c->client, c->cfg->message_timeout_ms, consumed);
   }
   c->pumping--; /* the struct outlives a disconnect until the next loop turn */
   pump_end (c);
}

/* A not-primary error was relayed and everything in flight is answered:
 * the upstream connection closes and the client's waits for the primary
 * (topology_suspect keeps new pairings off the old member until one says
 * it is writable), then goes on where it was, READY, its next requests
 * unread meanwhile.  The driver sees no close: the request it retries
 * after the error, and every later one, reaches the new primary. */
static void
client_repair (client_conn_t *c, bool reconnect)
{
   if (reconnect) {
      log_conn (LOG_LEVEL_INFO, c->id, c->peer, "replacing its connection to %s (POST /api/reconnect)", c->upstream_name);
      counters_add (COUNTER_RECONNECTED_UPSTREAMS, 1);
   } else {
      log_conn (LOG_LEVEL_INFO,
                c->id,
                c->peer,
                "%s answered not primary: pairing this connection again once a primary is known",
                c->upstream_name);
      counters_add (COUNTER_UPSTREAM_REPAIRS, 1);
   }
   mem_release_side (c, &c->upstream);
   if (c->upstream.connected)
      counters_sub (COUNTER_UPSTREAMS_OPEN, 1);
   side_close (&c->upstream);
   c->not_primary_seen = false;
   c->repairing = true;
   client_set_state (c, CLIENT_STATE_AWAIT_UPSTREAM);
   client_try_connect (c);
}

/* Session mode: whether the connection's upstream is older than the last
 * POST /api/reconnect and free to go now: READY with nothing in flight. */
static bool
client_reconnect_due (const client_conn_t *c)
{
   return !c->loop->pool && c->state == CLIENT_STATE_READY && !c->not_primary_seen && creq_count (c) == 0 &&
          c->up_count == 0 && !c->job && c->up_generation < operator_generation ();
}

/* Replaces an idle connection's upstream after POST /api/reconnect.  One
 * that never authenticated on it is paired again, unseen by the client, as
 * after a not-primary error; one that did (session_bound) would lose its
 * login, so it closes once its output is written and the driver opens a
 * new one and logs in again, with whatever credentials it has now. */
static void
client_reconnect (client_conn_t *c)
{
   if (!c->session_bound) {
      client_repair (c, true);
      return;
   }
   counters_add (COUNTER_RECONNECTED_UPSTREAMS, 1);
   c->drain_reason = COUNTERS_CLOSE_RECONNECT;
   client_set_state (c, CLIENT_STATE_DRAINING);
   client_check_drained (c);
}

/* Everything that may let replies through ends here, like client_pump. */
static void
upstream_pump (client_conn_t *c)
{
   uint32_t before = creq_count (c);
   bool consumed;

   c->pumping++;
   consumed = c->up ? client_route (c, c->up) : false;
   if (c->state == CLIENT_STATE_CLOSING)
      goto done;
   if (c->not_primary_seen && c->state == CLIENT_STATE_READY && c->session_bound) {
      /* c->not_primary_seen: no request read after the error goes to the
       * old member; what is in flight is answered, then it closes. */
      c->drain_reason = COUNTERS_CLOSE_NOT_PRIMARY;
      client_set_state (c, CLIENT_STATE_DRAINING);
   }
   /* Answers freed FIFO room: requests may be waiting in the input
    * (client_pump updates the flow); else only the flow may change.
    * Either writes the answers out, so a drain check comes after. */
   if (creq_count (c) < before)
      client_pump (c);
   else
      client_update_flow (c);
   if (c->state == CLIENT_STATE_CLOSING)
      goto done;
   client_check_drained (c);
   if (c->state == CLIENT_STATE_CLOSING)
      goto done;
   if (c->not_primary_seen && c->state == CLIENT_STATE_READY && creq_count (c) == 0 && c->up_count == 0) {
      client_repair (c, false);
      goto done;
   }
   if (client_reconnect_due (c)) {
      client_reconnect (c);
      goto done;
   }
   if (!client_up_connected (c))
      goto done;
   side_timer_update (c->up, c->cfg->message_timeout_ms, consumed);
done:
   c->pumping--;
   pump_end (c);
}

void
client_resume (client_conn_t *c)
{
   if (c->state != CLIENT_STATE_CLOSING)
      client_pump (c);
}

void
client_output_queued (client_conn_t *c)
{
   if (c->pumping == 0 && c->state != CLIENT_STATE_CLOSING) {
      client_update_flow (c);
      pump_end (c);
   }
}

void
client_attach_upstream (client_conn_t *c, side_t *s)
{
   RELAYBUS_ASSERT (!c->up && s->connected && c->state != CLIENT_STATE_CLOSING);
   s->owner = c;
   s->cb = &conn_side_callbacks;
   c->up = s;
   side_set_write_low (s, high_watermark (c) / 2);
   if (!mem_watch_side (c, s))
      log_conn (LOG_LEVEL_WARN, c->id, c->peer, "out of memory for a buffer callback: the count may lag");
}

void
client_detach_upstream (client_conn_t *c)
{
   side_t *s = c->up;

   /* With something in flight only when the connection closes (the
    * side is then closed too: its state is in doubt). */
   if (!s)
      return;
   side_timer_rearm (s, 0, false);
   /* Not mem_release_side: the side lives on (for another client), so
    * its buffers are neither drained nor frozen here (a TLS side's output
    * frozen at its front would never be written again).  With nothing in
    * flight they are empty, so this connection holds none of their bytes
    * once they are counted; what an in-doubt side (closed next) still
    * holds stays in mem_held, all of which goes back at the close. */
   if (c->state != CLIENT_STATE_CLOSING)
      mem_sync_side (c, s);
   if (c->mem_wait_sides & MEM_SIDE_UP)
      mem_unwait (c);
   mem_unwatch_side (s);
   mem_give_back (c->loop, s->mem_partial);
   s->mem_partial = s->mem_read = 0;
   s->mem_in_seen = s->mem_out_seen = 0;
   side_want_drained (s, false);
   c->up = NULL;
}

const char *
client_upstream_name (const client_conn_t *c)
{
   if (c->server)
      return pool_server_name (c->server);
   return c->upstream_name ? c->upstream_name : "(no upstream)";
}

/* ------------------------------------------------------------ callbacks */

/* Both sides' callbacks (proxy/side.h), told apart by the side's kind. */

static client_conn_t *
side_conn (const side_t *s)
{
   return s->owner;
}

/* Runs the pump of what `from` sends: requests, or replies. */
static void
conn_pump_from (client_conn_t *c, side_kind_t from)
{
   if (from == SIDE_CLIENT)
      client_pump (c);
   else
      upstream_pump (c);
}

static void
conn_side_read (side_t *s)
{
   conn_pump_from (side_conn (s), s->kind);
}

/* A side's output fell to high/2: what the other side sends to it may
 * flow again (the client's output holds back replies; the upstream's,
 * requests). */
static void
conn_side_drained (side_t *s)
{
   conn_pump_from (side_conn (s), s->kind == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT);
}

static void
conn_client_event (client_conn_t *c, side_event_t ev, const char *detail)
{
   size_t partial;

   if (ev != SIDE_EVENT_EOF) {
      client_disconnect (c, COUNTERS_CLOSE_CLIENT_ERROR, "%s", detail);
      return;
   }
   partial = evbuffer_get_length (side_input (&c->client));
   if (partial > 0)
      /* Bytes left over are a message the client never finished. */
      client_disconnect (c,
                         COUNTERS_CLOSE_CLIENT_EOF,
                         "client closed the connection in the middle of a message (%zu bytes of a partial message buffered)",
                         partial);
   else
      client_disconnect (c, COUNTERS_CLOSE_CLIENT_EOF, "client closed the connection");
}

static void
conn_upstream_event (client_conn_t *c, side_event_t ev, const char *detail)
{
   if (c->server) {
      /* A pooled connection lent to this client failed: the pool closes it.
       * The client closes only if it waits for something on it. */
      pool_server_lost (c, ev == SIDE_EVENT_EOF ? "upstream closed the connection" : detail);
      return;
   }
   switch (ev) {
   case SIDE_EVENT_CONNECTED:
      counters_add (COUNTER_UPSTREAMS_OPEN, 1);
      counters_add (COUNTER_UPSTREAM_CONNECTS, 1);
      log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "paired with upstream %s", c->upstream_name);
      side_set_write_low (&c->upstream, high_watermark (c) / 2);
      if (!side_go_direct (&c->upstream, c->loop->base)) {
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "out of memory pairing with %s", c->upstream_name);
         break;
      }
      if (c->upstream.direct)
         mem_side_went_direct (&c->upstream);
      if (c->repairing) {
         /* Paired again after a not-primary error: the client's handshake
          * was done; the server needs none on this connection (the proxy
          * speaks to it uncompressed, and the client never authenticated). */
         c->repairing = false;
         log_conn (LOG_LEVEL_INFO, c->id, c->peer, "paired again, with %s", c->upstream_name);
         client_set_state (c, CLIENT_STATE_READY);
      } else {
         client_set_state (c, CLIENT_STATE_HANDSHAKE);
      }
      client_pump (c);
      break;
   case SIDE_EVENT_CONNECT_FAILED:
      counters_add (COUNTER_UPSTREAM_CONNECT_FAILURES, 1);
      topology_request_refresh (c->loop->topo, "upstream connect failed");
      client_disconnect (c, COUNTERS_CLOSE_UPSTREAM_CONNECT, "cannot connect to %s: %s", c->upstream_name, detail);
      break;
   case SIDE_EVENT_EOF:
   case SIDE_EVENT_ERROR:
      /* A primary that goes away is often a failover in progress. */
      topology_request_refresh (c->loop->topo, "upstream connection lost");
      client_disconnect (c,
                         ev == SIDE_EVENT_EOF ? COUNTERS_CLOSE_UPSTREAM_EOF : COUNTERS_CLOSE_UPSTREAM_ERROR,
                         "upstream %s: %s (%u requests in flight)",
                         c->upstream_name,
                         ev == SIDE_EVENT_EOF ? "upstream closed the connection" : detail,
                         (unsigned) c->up_count);
      break;
   }
}

static void
conn_side_event (side_t *s, side_event_t ev, const char *detail)
{
   if (s->kind == SIDE_CLIENT)
      conn_client_event (side_conn (s), ev, detail);
   else
      conn_upstream_event (side_conn (s), ev, detail);
}

/* A side's partial message stalled for message_timeout_ms. */
static void
conn_side_timeout (side_t *s)
{
   client_conn_t *c = side_conn (s);

   if (s->kind == SIDE_CLIENT)
      client_disconnect (c,
                         COUNTERS_CLOSE_MESSAGE_TIMEOUT,
                         "partial request (%zu bytes buffered) stalled for message_timeout_ms=%" PRId64,
                         evbuffer_get_length (side_input (s)),
                         c->cfg->message_timeout_ms);
   else
      client_disconnect (c,
                         COUNTERS_CLOSE_MESSAGE_TIMEOUT,
                         "partial reply from %s stalled for message_timeout_ms=%" PRId64,
                         c->upstream_name,
                         c->cfg->message_timeout_ms);
}

static const side_callbacks_t conn_side_callbacks = {
   .on_read = conn_side_read,
   .on_drained = conn_side_drained,
   .on_event = conn_side_event,
   .on_timeout = conn_side_timeout,
};

static void
client_timer_cb (evutil_socket_t fd, short what, void *arg)
{
   client_conn_t *c = arg;

   switch (c->state) {
   case CLIENT_STATE_AWAIT_UPSTREAM:
      if (c->loop->pool) {
         client_disconnect (c,
                            COUNTERS_CLOSE_NO_PRIMARY,
                            "no pooled upstream connection could open within upstream_connect_timeout_ms=%" PRId64
                            " (%s)",
                            c->cfg->upstream_connect_timeout_ms,
                            pool_last_error (c->loop->pool));
      } else if (!side_is_open (&c->upstream)) {
         topology_primary_t p;
         topology_get_primary (c->loop->topo, &p);
         client_disconnect (c,
                            COUNTERS_CLOSE_NO_PRIMARY,
                            "no primary within upstream_connect_timeout_ms=%" PRId64 " (%s)",
                            c->cfg->upstream_connect_timeout_ms,
                            p.last_error[0] ? p.last_error : topology_state_name (p.state));
      } else {
         topology_request_refresh (c->loop->topo, "upstream connect timed out");
         client_disconnect (c,
                            COUNTERS_CLOSE_UPSTREAM_CONNECT,
                            "connect to %s timed out after %" PRId64 " ms",
                            c->upstream_name,
                            c->cfg->upstream_connect_timeout_ms);
      }
      break;
   case CLIENT_STATE_HANDSHAKE:
      client_disconnect (c,
                         COUNTERS_CLOSE_HANDSHAKE_TIMEOUT,
                         "no hello answered within handshake_timeout_ms=%" PRId64,
                         c->cfg->handshake_timeout_ms);
      break;
   default:
      break;
   }
}

/* ------------------------------------------------------------ pairing */

/* In AWAIT_UPSTREAM: connect to the current primary, or wait for one. */
static void
client_try_connect (client_conn_t *c)
{
   topology_primary_t p;
   bson_error_t error;

   topology_get_primary (c->loop->topo, &p);
   if (p.state != TOPOLOGY_STATE_PRIMARY) {
      if (!c->waiting_primary)
         log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "waiting for a primary");
      c->waiting_primary = true;
      return;
   }
   c->waiting_primary = false;
   bson_free (c->upstream_name);
   c->upstream_name = bson_strdup_printf ("%s:%u", p.host, (unsigned) p.port);
   c->up_generation = operator_generation ();
   if (!side_connect (&c->upstream, c->loop->base, &p, c->loop->tls, &conn_side_callbacks, c, &error)) {
      if (error.domain == SIDE_ERROR_DOMAIN && error.code == SIDE_ERR_CONNECT)
         counters_add (COUNTER_UPSTREAM_CONNECT_FAILURES, 1);
      topology_request_refresh (c->loop->topo, "upstream connect failed");
      client_disconnect (c, COUNTERS_CLOSE_UPSTREAM_CONNECT, "%s", error.message);
      return;
   }
   if (!mem_watch_side (c, &c->upstream))
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "out of memory pairing with an upstream");
}

void
client_format_peer (const struct sockaddr *sa, char *out, size_t outlen)
{
   char host[INET6_ADDRSTRLEN] = "?";

   if (sa->sa_family == AF_INET) {
      const struct sockaddr_in *in = (const struct sockaddr_in *) sa;
      evutil_inet_ntop (AF_INET, &in->sin_addr, host, sizeof host);
      bson_snprintf (out, outlen, "%s:%u", host, (unsigned) ntohs (in->sin_port));
   } else if (sa->sa_family == AF_INET6) {
      const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *) sa;
      evutil_inet_ntop (AF_INET6, &in6->sin6_addr, host, sizeof host);
      bson_snprintf (out, outlen, "[%s]:%u", host, (unsigned) ntohs (in6->sin6_port));
   } else {
      bson_snprintf (out, outlen, "unix");
   }
}

bool
client_accept (client_loop_t *loop,
               evutil_socket_t fd,
               const struct sockaddr *addr,
               int addr_len,
               SSL_CTX *server_tls,
               bson_error_t *error)
{
   /* Process-wide, from 1: ids name connections in logs and the admin
    * views whichever loop owns them. */
   static atomic_uint_fast64_t next_conn_id;
   client_conn_t *c = bson_malloc0 (sizeof *c);

   c->id = atomic_fetch_add_explicit (&next_conn_id, 1, memory_order_relaxed) + 1;
   c->loop = loop;
   c->cfg = config_retain (loop->cfg);
   c->compressor = -1;
   client_format_peer (addr, c->peer, sizeof c->peer);
   if (!side_accept (&c->client,
                     loop->base,
                     fd,
                     addr->sa_family == AF_INET || addr->sa_family == AF_INET6,
                     server_tls,
                     &conn_side_callbacks,
                     c,
                     error)) {
      client_free (c);
      return false;
   }
   c->timer = evtimer_new (loop->base, client_timer_cb, c);
   /* Every byte this connection buffers counts towards max_buffered_bytes. */
   if (!c->timer || !mem_watch_side (c, &c->client)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory accepting a connection");
      mem_release_all (c);
      side_close (&c->client);
      proxy_event_free (c->timer);
      client_free (c);
      return false;
   }
   /* Reading and the drain callback are decided by client_update_flow. */
   side_set_write_low (&c->client, high_watermark (c) / 2);

   c->next = loop->clients;
   if (loop->clients)
      loop->clients->prev = c;
   loop->clients = c;
   loop->nclients++;
   counters_add (COUNTER_CONNECTIONS_OPEN, 1);
   log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "accepted (%zu open)", loop->nclients);

   /* AWAIT_UPSTREAM is 0, the zeroed state: arm its timer explicitly. */
   c->state = CLIENT_STATE_NONE;
   client_set_state (c, CLIENT_STATE_AWAIT_UPSTREAM);
   if (loop->pool) {
      /* Pooled: no connection of its own.  Its hello is answered from what
       * the pool learned of the upstream; until the pool has learned it,
       * the client waits (pool_hello_learned moves it on). */
      if (!login_deadline_start (c)) {
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "out of memory for the login deadline");
         return true;
      }
      if (pool_hello (loop->pool))
         client_set_state (c, CLIENT_STATE_HANDSHAKE);
      else
         pool_want_hello (loop->pool);
      return true;
   }
   c->up = &c->upstream;
   client_try_connect (c);
   return true;
}

/* ------------------------------------------------------------ drain */

void
client_check_drained (client_conn_t *c)
{
   if (c->state != CLIENT_STATE_DRAINING)
      return;
   if (creq_count (c) == 0 && c->up_count == 0 && evbuffer_get_length (client_output (c)) == 0)
      if (c->drain_reason == COUNTERS_CLOSE_NOT_PRIMARY)
         client_disconnect (c,
                            COUNTERS_CLOSE_NOT_PRIMARY,
                            "answered after a not-primary error from %s: the next connection pairs with the primary",
                            c->upstream_name);
      else
         client_disconnect (c, COUNTERS_CLOSE_SHUTDOWN, "drained");
   else if (creq_count (c) == 0 && c->up_count == 0)
      /* Output still flushing: ask for the write callback at empty. */
      side_set_write_low (&c->client, 0);
}

static void
client_loop_drain_timeout_cb (evutil_socket_t fd, short what, void *arg)
{
   client_loop_t *loop = arg;

   log_warn ("drain timeout: closing %zu connections still busy", loop->nclients);
   while (loop->clients)
      client_disconnect (loop->clients, COUNTERS_CLOSE_SHUTDOWN_TIMEOUT, "still busy when drain_timeout_ms ran out");
}

void
client_loop_drain (client_loop_t *loop, int64_t timeout_ms, void (*on_empty) (void *), void *ctx)
{
   client_conn_t *c, *next;
   struct timeval tv = clock_timeval_ms (timeout_ms);

   loop->draining = true;
   loop->on_empty = on_empty;
   loop->on_empty_ctx = ctx;
   log_info ("draining %zu connections (up to %" PRId64 " ms)", loop->nclients, timeout_ms);
   for (c = loop->clients; c; c = next) {
      next = c->next;
      if (c->state == CLIENT_STATE_AWAIT_UPSTREAM || (creq_count (c) == 0 && c->up_count == 0 &&
                                                      evbuffer_get_length (client_output (c)) == 0)) {
         client_disconnect (c, COUNTERS_CLOSE_SHUTDOWN, "shutting down");
         continue;
      }
      c->drain_reason = COUNTERS_CLOSE_SHUTDOWN;
      client_set_state (c, CLIENT_STATE_DRAINING);
      client_check_drained (c);
   }
   if (loop->nclients == 0) {
      if (loop->on_empty) {
         loop->on_empty = NULL;
         on_empty (ctx);
      }
      return;
   }
   evtimer_add (loop->drain_timer, &tv);
}

/* ------------------------------------------------------------ operator */

void
client_loop_operator (client_loop_t *loop, const uint64_t *ids, unsigned n_ids, bool reconnect, bool resume)
{
   client_conn_t *c, *next;

   for (unsigned i = 0; i < n_ids; i++) {
      for (c = loop->clients; c && c->id != ids[i]; c = c->next)
         ;
      if (c)
         client_disconnect (c, COUNTERS_CLOSE_OPERATOR, "closed by the operator (POST /api/clients/%" PRIu64 "/close)", ids[i]);
      else
         log_info ("operator: c%" PRIu64 " had closed already on loop %u", ids[i], loop->index);
   }
   if (reconnect) {
      if (loop->pool) {
         pool_reconnect (loop->pool);
      } else {
         for (c = loop->clients; c; c = next) {
            next = c->next;
            if (client_reconnect_due (c))
               client_reconnect (c);
         }
      }
   }
   /* A pause that came again since the resume holds them still. */
   if (resume && !operator_paused ()) {
      for (c = loop->clients; c; c = next) {
         next = c->next;
         if (c->state == CLIENT_STATE_READY || c->state == CLIENT_STATE_HANDSHAKE)
            client_resume (c);
      }
   }
}

/* ------------------------------------------------------------ loop */

client_loop_t *
client_loop_new (struct event_base *base,
                 unsigned index,
                 topology_t *topo,
                 tls_upstream_t *tls,
                 config_t *cfg,
                 bson_error_t *error)
{
   client_loop_t *loop;

   if (index >= CLIENT_LOOPS_MAX) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "loop index %u: at most %d loops", index,
                      CLIENT_LOOPS_MAX);
      return NULL;
   }
   loop = bson_malloc0 (sizeof *loop);
   loop->base = base;
   loop->index = index;
   loop->topo = topo;
   loop->tls = tls;
   loop->cfg = config_retain (cfg);
   loop->free_ev = event_new (base, -1, 0, client_loop_free_cb, loop);
   loop->drain_timer = evtimer_new (base, client_loop_drain_timeout_cb, loop);
   loop->mem_ev = event_new (base, -1, 0, mem_resume_cb, loop);
   if (!loop->free_ev || !loop->drain_timer || !loop->mem_ev) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory");
      client_loop_destroy (loop);
      return NULL;
   }
   pthread_mutex_lock (&mem_slots_mu);
   RELAYBUS_ASSERT (mem_slots[index].loop == NULL);
   mem_slots[index].loop = loop;
   pthread_mutex_unlock (&mem_slots_mu);
   return loop;
}

bool
client_loop_set_wake (client_loop_t *loop, loopwake_t *wake, bson_error_t *error)
{
   if (loop->decoder)
      return true;
   if (!client_decoder_start (loop, wake, error))
      return false;
   loop->wake = wake;
   pthread_mutex_lock (&mem_slots_mu);
   mem_slots[loop->index].wake = wake;
   pthread_mutex_unlock (&mem_slots_mu);
   return true;
}

bool
client_loop_enable_pool (client_loop_t *loop, unsigned size, bson_error_t *error)
{
   RELAYBUS_ASSERT (!loop->pool && !loop->clients);
   loop->pool = pool_new (loop, size, error);
   return loop->pool != NULL;
}

void
client_loop_set_config (client_loop_t *loop, config_t *cfg)
{
   config_t *old = loop->cfg;
   loop->cfg = config_retain (cfg);
   config_release (old);
   /* A larger max_buffered_bytes may let waiters go on at once. */
   mem_maybe_resume (loop);
}

void
client_loop_topology_changed (client_loop_t *loop)
{
   client_conn_t *c, *next;

   if (loop->pool) {
      pool_topology_changed (loop->pool);
      return;
   }
   for (c = loop->clients; c; c = next) {
      next = c->next;
      if (c->state == CLIENT_STATE_AWAIT_UPSTREAM && c->waiting_primary)
         client_try_connect (c);
   }
}

void
client_loop_destroy (client_loop_t *loop)
{
   if (!loop)
      return;
   loop->on_empty = NULL;
   while (loop->clients)
      client_disconnect (loop->clients, COUNTERS_CLOSE_SHUTDOWN, "proxy stopping");
   pool_destroy (loop->pool);
   loop->pool = NULL;
   /* No other loop posts to this one from here on; a resume already
    * queued finds the slot empty. */
   pthread_mutex_lock (&mem_slots_mu);
   if (mem_slots[loop->index].loop == loop) {
      mem_slots[loop->index].loop = NULL;
      mem_slots[loop->index].wake = NULL;
   }
   pthread_mutex_unlock (&mem_slots_mu);
   client_decoder_stop (loop);
   client_loop_free_cb (-1, 0, loop);
   while (loop->flight_free) {
      client_flight_t *f = loop->flight_free;
      loop->flight_free = f->next;
      bson_free (f);
   }
   proxy_event_free (loop->free_ev);
   proxy_event_free (loop->drain_timer);
   proxy_event_free (loop->mem_ev);
   config_release (loop->cfg);
   bson_free (loop);
}

/* ------------------------------------------------------------ accessors */

void
client_loop_set_request_hook (client_loop_t *loop, client_request_hook_t hook, void *ctx)
{
   /* One installer: a hook set over another would silently drop it. */
   RELAYBUS_ASSERT (hook == NULL || loop->hook == NULL);
   loop->hook = hook;
   loop->hook_ctx = ctx;
}

void
client_set_data (client_conn_t *c, void *data, void (*destroy) (void *))
{
   if (c->data_destroy && c->data != data)
      c->data_destroy (c->data);
   c->data = data;
   c->data_destroy = destroy;
}

void *
client_get_data (const client_conn_t *c)
{
   return c->data;
}

const char *
client_user (const client_conn_t *c, const char **db)
{
   *db = NULL;
   if (c->loop->pool)
      return login_user (c);
   if (!c->sasl || !c->sasl->user[0])
      return NULL;
   *db = c->sasl->db;
   return c->sasl->user;
}

unsigned
client_loop_of (const client_conn_t *c)
{
   return c->loop->index;
}

uint64_t
client_id (const client_conn_t *c)
{
   return c->id;
}

const char *
client_peer (const client_conn_t *c)
{
   return c->peer;
}

client_state_t
client_state (const client_conn_t *c)
{
   return c->state;
}
