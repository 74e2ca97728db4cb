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
 * receive are not read (proxy/mem.c).
 *
 * Loops.  Each forwarding loop (proxy/loops.h) has one client_loop_t and
 * owns its connections entirely; what loops share is process-wide and
 * thread-safe: connection ids, the counters, the clients registry, and
 * the memory bound (proxy/mem.c), whose waiters on one loop are resumed
 * by room given back on another.
 *
 * Lifetime.  client_disconnect frees the sockets and timers at once (so no
 * callback of ours can fire again), passes every request it held, and puts
 * the struct on the loop's free list; it is freed from an event on the
 * next loop turn.  A function that may close the connection says so in
 * what it returns (client_route's CLIENT_ROUTED_CLOSED, a pump's false,
 * route_msg's ROUTE_CLOSED), so its caller knows without asking the state
 * again; the state is read only at the end of a pump and where code of
 * another module ran (a hook, an internal request's callback, a post from
 * another thread) that may have closed it.  On a closed connection
 * client_answer and client_send_internal fail, and client_disconnect does
 * nothing.
 */
#include "proxy/conn.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
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
#include "proxy/operator.h"
#include "proxy/side.h"

/* "await_upstream", "handshake", ... */
static const char *client_state_name (client_state_t state);

static const char *const client_state_names[CLIENT_STATE_COUNT_] = {
   [CLIENT_STATE_AWAIT_UPSTREAM] = "await_upstream",
   [CLIENT_STATE_HANDSHAKE] = "handshake",
   [CLIENT_STATE_READY] = "ready",
   [CLIENT_STATE_DRAINING] = "draining",
   [CLIENT_STATE_CLOSING] = "closing",
};

static const char *
client_state_name (client_state_t state)
{
   return (unsigned) state < CLIENT_STATE_COUNT_ ? client_state_names[state] : "invalid";
}

static const char *const client_hold_names[CLIENT_HOLD_COUNT_] = {
   [CLIENT_HOLD_NONE] = "none",
   [CLIENT_HOLD_UPSTREAM] = "upstream",
   [CLIENT_HOLD_DRAINING] = "draining",
   [CLIENT_HOLD_NOT_PRIMARY] = "not_primary",
   [CLIENT_HOLD_POOL] = "pool",
   [CLIENT_HOLD_INFLIGHT] = "inflight",
   [CLIENT_HOLD_UPSTREAM_OUTPUT] = "upstream_output",
   [CLIENT_HOLD_DECODING] = "decoding",
   [CLIENT_HOLD_PAUSED] = "paused",
   [CLIENT_HOLD_MEMORY] = "memory",
};

static const char *const client_pairing_names[CLIENT_PAIRING_COUNT_] = {
   [CLIENT_PAIRING_NONE] = "none",
   [CLIENT_PAIRING_WAIT_PRIMARY] = "wait_primary",
   [CLIENT_PAIRING_CONNECTING] = "connecting",
   [CLIENT_PAIRING_REPAIR_WAIT_PRIMARY] = "repair_wait_primary",
   [CLIENT_PAIRING_REPAIR_CONNECTING] = "repair_connecting",
   [CLIENT_PAIRING_PAIRED] = "paired",
   [CLIENT_PAIRING_BOUND] = "bound",
   [CLIENT_PAIRING_NOT_PRIMARY] = "not_primary",
   [CLIENT_PAIRING_BOUND_NOT_PRIMARY] = "bound_not_primary",
};

static const char *
client_pairing_name (client_pairing_t p)
{
   return (unsigned) p < CLIENT_PAIRING_COUNT_ ? client_pairing_names[p] : "invalid";
}

static bool client_pump (client_conn_t *c);
static void upstream_pump (client_conn_t *c);
static void client_update_flow (client_conn_t *c);
static void client_timer_cb (evutil_socket_t fd, short what, void *arg);
static void client_try_connect (client_conn_t *c, bool repair);
static const side_callbacks_t conn_side_callbacks;

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

static void
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
   c->registry = clients_registry_note (
      c->id, c->loop->index, c->peer, side_is_open (&c->client) ? c->client.fd : -1, client_state_name (next),
      next != CLIENT_STATE_CLOSING);
   if (next == CLIENT_STATE_CLOSING)
      return;
   /* A new entry has neither: the sub-state and the read gate's last answer. */
   clients_entry_set_pairing (c->registry, c->pairing != CLIENT_PAIRING_NONE ? client_pairing_name (c->pairing) : NULL);
   clients_entry_set_read_hold (c->registry, client_hold_names[c->read_hold]);
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

/* The moves of a session-mode connection's pairing (conn_private.h): it
 * waits for a primary and connects (again, for a repair), is paired from
 * the connect on, bound by a request, and told not primary by a reply; a
 * repair starts over from PAIRED or NOT_PRIMARY.  NONE is only the start
 * (and pooled mode's, which never moves). */
static bool __attribute__ ((unused)) /* only RELAYBUS_ASSERT calls it (gone with NDEBUG) */
client_pairing_ok (client_pairing_t from, client_pairing_t to)
{
   switch (to) {
   case CLIENT_PAIRING_WAIT_PRIMARY:
      return from == CLIENT_PAIRING_NONE;
   case CLIENT_PAIRING_CONNECTING:
      return from == CLIENT_PAIRING_NONE || from == CLIENT_PAIRING_WAIT_PRIMARY;
   case CLIENT_PAIRING_REPAIR_WAIT_PRIMARY:
      return from == CLIENT_PAIRING_PAIRED || from == CLIENT_PAIRING_NOT_PRIMARY;
   case CLIENT_PAIRING_REPAIR_CONNECTING:
      return from == CLIENT_PAIRING_PAIRED || from == CLIENT_PAIRING_NOT_PRIMARY ||
             from == CLIENT_PAIRING_REPAIR_WAIT_PRIMARY;
   case CLIENT_PAIRING_PAIRED:
      return from == CLIENT_PAIRING_CONNECTING || from == CLIENT_PAIRING_REPAIR_CONNECTING;
   case CLIENT_PAIRING_BOUND:
   case CLIENT_PAIRING_NOT_PRIMARY:
      return from == CLIENT_PAIRING_PAIRED;
   case CLIENT_PAIRING_BOUND_NOT_PRIMARY:
      return from == CLIENT_PAIRING_BOUND || from == CLIENT_PAIRING_NOT_PRIMARY;
   default:
      return false;
   }
}

/* The one function that changes a connection's pairing. */
static void
client_set_pairing (client_conn_t *c, client_pairing_t next)
{
   if (c->pairing == next)
      return;
   RELAYBUS_ASSERT (client_pairing_ok (c->pairing, next));
   log_debug ("c%" PRIu64 " %s: pairing %s -> %s",
              c->id,
              c->peer,
              client_pairing_name (c->pairing),
              client_pairing_name (next));
   c->pairing = next;
   clients_entry_set_pairing (c->registry, client_pairing_name (next));
}

/* A not-primary error was relayed, and what was read since waits: no
 * request goes to the old member. */
static inline bool
client_not_primary (const client_conn_t *c)
{
   return c->pairing >= CLIENT_PAIRING_NOT_PRIMARY; /* the last two */
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
      c->loop->pooled->pool_client_closed (c);
   client_set_state (c, CLIENT_STATE_CLOSING);
   mem_release_all (c);

   /* Sockets and timers go now: nothing of ours can fire after this. */
   if (c->upstream.connected)
      counters_sub (COUNTER_UPSTREAMS_OPEN, 1);
   side_close (&c->upstream);
   side_close (&c->client);
   proxy_event_free (c->timer);
   c->timer = NULL;
   if (c->login) /* made by proxy/login.c: pooled mode only */
      c->loop->pooled->login_stop (c);

   /* No request waits for an answer any more: client_answer finds none. */
   for (uint64_t s = c->creq_head; s < c->creq_tail; s++) {
      client_req_t *r = creq_find (c, s);
      proxy_evbuffer_free (r->held);
      r->held = NULL;
   }
   c->creq_head = c->creq_tail;
   /* Internal requests learn that no reply will come (their owners free
    * their context).  They cannot send or answer anything: the upstream
    * is closed and no request waits. */
   bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_CLOSED, "connection closed: %s", detail);
   while (c->up_count > 0) {
      upstream_req_t u = c->flight->upreqs[c->up_head];
      upreq_pop (c);
      if (u.kind == UPREQ_INTERNAL && u.cb)
         u.cb (c, NULL, &error, u.cb_ctx);
   }
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
   if (c->login)
      c->loop->pooled->login_destroy (c->login);
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

static bool
lazy_buffer (client_conn_t *c, struct evbuffer **buf, bson_error_t *error)
{
   if (!*buf) {
      *buf = evbuffer_new ();
      if (!*buf || !client_mem_watch (c, *buf)) {
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

/* ------------------------------------------------------------ flow */

/* Writes what a direct side's output holds and counts the side
 * (mem_sync_side) with the length the write left: one length read of the
 * output, not three.  A TLS side is written by libevent and counted by
 * its buffer callbacks. */
static inline void
flow_flush (client_conn_t *c, side_t *s)
{
   if (s->direct)
      mem_sync_direct (c, s, side_write_now (s));
}

/* Why the client is not read now, or CLIENT_HOLD_NONE: the one answer to
 * it (the read gate), asked by client_update_flow, which has read `up` (the
 * upstream side is connected) and `up_full` (its output is at the high
 * watermark) already.  A state that reads requests (HANDSHAKE, or READY
 * unless a not-primary error came), an upstream to send them to (pooled
 * mode reads hellos, logins and whatever waits for a connection without
 * one, but not while it waits), room in both FIFOs and in the upstream's
 * output, no request being decoded, no operator pause, and memory: asked
 * last, as a "no" puts the connection on the memory wait list. */
static inline client_hold_t
client_read_hold (client_conn_t *c, bool up, bool up_full)
{
   /* READY first: it is asked at every pump's end. */
   if (c->state == CLIENT_STATE_READY) {
      if (client_not_primary (c))
         return CLIENT_HOLD_NOT_PRIMARY;
   } else if (c->state != CLIENT_STATE_HANDSHAKE) {
      return c->state == CLIENT_STATE_AWAIT_UPSTREAM ? CLIENT_HOLD_UPSTREAM : CLIENT_HOLD_DRAINING;
   }
   if (!up && !(c->loop->pool && !c->server))
      return CLIENT_HOLD_UPSTREAM;
   if (!pool_client_idle (&c->pool))
      return CLIENT_HOLD_POOL;
   if (!fifo_has_room (c))
      return CLIENT_HOLD_INFLIGHT;
   if (up_full)
      return CLIENT_HOLD_UPSTREAM_OUTPUT;
   if (c->job)
      return CLIENT_HOLD_DECODING;
   if (operator_paused ())
      return CLIENT_HOLD_PAUSED;
   if (!mem_may_read (c, &c->client))
      return CLIENT_HOLD_MEMORY;
   return CLIENT_HOLD_NONE;
}

/* Recomputes which sides may read.  Rules (le-proxy's, plus the FIFOs):
 *  - the client is read when nothing holds it (client_read_hold: among
 *    others a state that reads requests, the upstream connected, room in
 *    the FIFOs, and the upstream's output below the high watermark);
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
   client_hold_t hold;
   size_t high;

   RELAYBUS_ASSERT (c->state != CLIENT_STATE_CLOSING); /* every caller knows it is open */
   /* What the pump queued goes out first: the decisions below read the
    * outputs' lengths after it. */
   flow_flush (c, &c->client);
   if (up)
      flow_flush (c, c->up);
   high = high_watermark (c);
   client_full = mem_synced_out_len (&c->client) >= high;
   if (up) {
      up_full = mem_synced_out_len (c->up) >= high;
      side_set_reading (c->up, !client_full && mem_may_read (c, c->up));
      /* Pooled: a connection that holds only moreToCome requests goes back
       * once they are written, so its drain is wanted then too. */
      side_want_drained (c->up, up_full || (c->server && c->loop->pooled->pool_wants_flush (c)));
   }
   hold = client_read_hold (c, up, up_full);
   side_set_reading (&c->client, hold == CLIENT_HOLD_NONE);
   if (hold != c->read_hold) {
      c->read_hold = hold;
      clients_entry_set_read_hold (c->registry, client_hold_names[hold]);
   }
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
         c->loop->pooled->pool_settle (c);
      client_settle (c);
   }
}

/* Everything that may let requests through ends here: process what is
 * complete, then decide what to read next.  Returns false when the
 * connection closed. */
static bool
client_pump (client_conn_t *c)
{
   client_routed_t routed = CLIENT_ROUTED_NONE;

   c->pumping++;
   /* After a not-primary error no request goes to the old member: what
    * is buffered waits for the new pairing (or the close).  While the
    * operator paused the proxy, what is buffered waits for the resume
    * (client_loop_operator pumps every connection then): what is in
    * flight was routed already and is answered meanwhile. */
   if (!client_not_primary (c) && !operator_paused ())
      routed = client_route (c, &c->client);
   if (routed != CLIENT_ROUTED_CLOSED) {
      client_update_flow (c);
      side_timer_update (&c->client, c->cfg->message_timeout_ms, routed == CLIENT_ROUTED_SOME,
                         mem_synced_in_len (&c->client));
   }
   c->pumping--; /* the struct outlives a disconnect until the next loop turn */
   pump_end (c);
   return routed != CLIENT_ROUTED_CLOSED;
}

/* A not-primary error was relayed and everything in flight is answered:
 * the upstream connection closes and the client's waits for the primary
 * (topology_suspect keeps new pairings off the old member until one says
 * it is writable), then goes on where it was, READY, its next requests
 * unread meanwhile.  The driver sees no close: the request it retries
 * after the error, and every later one, reaches the new primary. */
/* Whether the topology's published primary is still the member this
 * connection was paired with (upstream_name, "host:port"). */
static bool
client_topology_names_upstream (const client_conn_t *c)
{
   topology_primary_t p;
   char name[TOPOLOGY_HOST_MAX + 8];

   topology_get_primary (c->loop->topo, &p);
   if (p.state != TOPOLOGY_STATE_PRIMARY || !c->upstream_name)
      return false;
   bson_snprintf (name, sizeof name, "%s:%u", p.host, (unsigned) p.port);
   return strcmp (name, c->upstream_name) == 0;
}

/* ------------------------------------------------------------ events */

/* The paired member stepped down or went away (upstream_name is
 * "host:port"): no new pairing goes there until the topology publishes a
 * member again (topology_suspect). */
static void
client_suspect_upstream (client_conn_t *c)
{
   const char *name = client_upstream_name (c);
   const char *colon = strrchr (name, ':');
   char host[TOPOLOGY_HOST_MAX];
   size_t n;

   if (!colon || (n = (size_t) (colon - name)) >= sizeof host) {
      topology_request_refresh (c->loop->topo, "not-primary error relayed");
      return;
   }
   memcpy (host, name, n);
   host[n] = '\0';
   topology_suspect (c->loop->topo, host, (uint16_t) strtoul (colon + 1, NULL, 10));
}

void
client_event (client_conn_t *c, client_event_t ev)
{
   switch (ev) {
   case CLIENT_EVENT_HELLO_ANSWERED:
      if (c->state == CLIENT_STATE_HANDSHAKE)
         client_set_state (c, CLIENT_STATE_READY);
      break;
   case CLIENT_EVENT_BINDS_SESSION:
      /* Only a connection that reads requests routes them: never while
       * it pairs (AWAIT_UPSTREAM). */
      RELAYBUS_ASSERT (c->pairing == CLIENT_PAIRING_NONE || c->pairing >= CLIENT_PAIRING_PAIRED);
      if (c->pairing == CLIENT_PAIRING_PAIRED)
         client_set_pairing (c, CLIENT_PAIRING_BOUND);
      else if (c->pairing == CLIENT_PAIRING_NOT_PRIMARY)
         client_set_pairing (c, CLIENT_PAIRING_BOUND_NOT_PRIMARY);
      break;
   case CLIENT_EVENT_NOT_PRIMARY:
      counters_add (COUNTER_NOT_PRIMARY_ERRORS, 1);
      log_conn (LOG_LEVEL_INFO,
                c->id,
                c->peer,
                "relaying a not-primary error from %s; re-learning the primary",
                client_upstream_name (c));
      client_suspect_upstream (c);
      if (c->server)
         c->loop->pooled->pool_server_not_primary (c); /* closed once it comes back */
      else if (c->pairing == CLIENT_PAIRING_PAIRED)
         client_set_pairing (c, CLIENT_PAIRING_NOT_PRIMARY);
      else if (c->pairing == CLIENT_PAIRING_BOUND)
         client_set_pairing (c, CLIENT_PAIRING_BOUND_NOT_PRIMARY);
      break;
   }
}

typedef enum {
   CLIENT_REPAIR_NOT_PRIMARY, /* its member answered not primary */
   CLIENT_REPAIR_RECONNECT,   /* POST /api/reconnect */
   CLIENT_REPAIR_MONGOS_LOST, /* its mongos went away (client_repair_after_loss) */
} client_repair_why_t;

static void
client_repair (client_conn_t *c, client_repair_why_t why)
{
   switch (why) {
   case CLIENT_REPAIR_RECONNECT:
      log_conn (LOG_LEVEL_INFO, c->id, c->peer, "replacing its connection to %s (POST /api/reconnect)", c->upstream_name);
      counters_add (COUNTER_RECONNECTED_UPSTREAMS, 1);
      break;
   case CLIENT_REPAIR_NOT_PRIMARY:
      log_conn (LOG_LEVEL_INFO,
                c->id,
                c->peer,
                "%s answered not primary: pairing this connection again once a primary is known",
                c->upstream_name);
      counters_add (COUNTER_UPSTREAM_REPAIRS, 1);
      break;
   case CLIENT_REPAIR_MONGOS_LOST:
      log_conn (LOG_LEVEL_INFO,
                c->id,
                c->peer,
                "mongos %s went away while this connection was idle: pairing it with another mongos",
                c->upstream_name);
      counters_add (COUNTER_UPSTREAM_REPAIRS, 1);
      break;
   }
   mem_release_side (c, &c->upstream);
   if (c->upstream.connected)
      counters_sub (COUNTER_UPSTREAMS_OPEN, 1);
   side_close (&c->upstream);
   client_set_state (c, CLIENT_STATE_AWAIT_UPSTREAM);
   if (why == CLIENT_REPAIR_MONGOS_LOST && client_topology_names_upstream (c)) {
      /* The monitor has not seen the mongos go yet: pairing now would
       * go back to it.  The next published one is tried
       * (client_loop_topology_changed), within upstream_connect_timeout_ms. */
      client_set_pairing (c, CLIENT_PAIRING_REPAIR_WAIT_PRIMARY);
      return;
   }
   client_try_connect (c, true);
}

/* A mongos the connection was paired with went away (EOF or a reset).  A
 * driver keeps idle connections, its monitor's among them, and may send on
 * one in the same instant as it learns of the loss from another: the
 * Node.js driver's monitor, woken by the failed operation, then sends its
 * hello on the monitoring connection that has just been closed and waits
 * for that reply until connectTimeoutMS, its pool paused meanwhile, so the
 * client stalls although another mongos is there.  A connection with
 * nothing in flight and nothing of its upstream connection's (no login,
 * exhaust or moreToCome: BOUND) is therefore paired with another
 * mongos instead of being closed, as after a not-primary error, and the
 * driver sees nothing.  What a mongos held for the connection's lsids
 * (an open transaction, cursors) is the cluster's or is gone either way:
 * the next statement gets the server's answer (NoSuchTransaction,
 * CursorNotFound) instead of a network error.  Replica sets keep closing:
 * their next primary may be seconds away, and a driver waiting for a hello
 * meanwhile would see neither a reply nor an error.  True when repaired. */
static bool
client_repair_after_loss (client_conn_t *c)
{
   topology_primary_t p;

   /* PAIRED: session mode, neither bound nor told not primary. */
   if (c->pairing != CLIENT_PAIRING_PAIRED || c->state != CLIENT_STATE_READY || creq_count (c) > 0 ||
       c->up_count > 0 || c->job || c->pumping > 0)
      return false;
   topology_get_primary (c->loop->topo, &p);
   if (strcmp (p.server_type, "Mongos") != 0)
      return false;
   client_repair (c, CLIENT_REPAIR_MONGOS_LOST);
   return true;
}

/* Session mode: whether the connection's upstream is older than the last
 * POST /api/reconnect and free to go now: READY with nothing in flight.
 * The generation first: every reply's pump asks, and it is nearly always
 * the current one. */
static inline bool
client_reconnect_due (const client_conn_t *c)
{
   return c->up_generation < operator_generation () &&
          (c->pairing == CLIENT_PAIRING_PAIRED || c->pairing == CLIENT_PAIRING_BOUND) &&
          c->state == CLIENT_STATE_READY && creq_count (c) == 0 && c->up_count == 0 && !c->job;
}

/* Replaces an idle connection's upstream after POST /api/reconnect.  One
 * that never authenticated on it is paired again, unseen by the client, as
 * after a not-primary error; one that did (BOUND) would lose its
 * login, so it closes once its output is written and the driver opens a
 * new one and logs in again, with whatever credentials it has now. */
static void
client_reconnect (client_conn_t *c)
{
   if (c->pairing == CLIENT_PAIRING_PAIRED) {
      client_repair (c, CLIENT_REPAIR_RECONNECT);
      return;
   }
   counters_add (COUNTER_RECONNECTED_UPSTREAMS, 1);
   c->drain_reason = COUNTERS_CLOSE_RECONNECT;
   client_set_state (c, CLIENT_STATE_DRAINING);
   (void) client_check_drained (c);
}

/* Whether client_pump has anything to do beyond client_update_flow: a
 * request (or part of one, whose timer it keeps) in the client's input, or
 * a decoded one to finish.  With an empty input, no job and no timer armed
 * it routes nothing and leaves the timer off, so an answer that empties
 * the input's last request (the usual case: one request at a time) costs
 * the flow update alone, not a second pass of the framing loop. */
static inline bool
client_may_have_work (client_conn_t *c)
{
   return c->job || c->client.timer_armed || evbuffer_get_length (side_input (&c->client)) > 0;
}

/* Everything that may let replies through ends here, like client_pump. */
static void
upstream_pump (client_conn_t *c)
{
   uint32_t before = creq_count (c);
   client_routed_t routed = CLIENT_ROUTED_NONE;

   c->pumping++;
   if (c->up)
      routed = client_route (c, c->up);
   if (routed == CLIENT_ROUTED_CLOSED)
      goto done;
   if (c->pairing == CLIENT_PAIRING_BOUND_NOT_PRIMARY && c->state == CLIENT_STATE_READY) {
      /* No request read after the error goes to the old member; what is
       * in flight is answered, then it closes. */
      c->drain_reason = COUNTERS_CLOSE_NOT_PRIMARY;
      client_set_state (c, CLIENT_STATE_DRAINING);
   }
   /* Answers freed FIFO room: requests may be waiting in the input
    * (client_pump updates the flow); else only the flow may change.
    * Either writes the answers out, so a drain check comes after. */
   if (creq_count (c) < before && client_may_have_work (c)) {
      if (!client_pump (c))
         goto done;
   } else {
      client_update_flow (c);
   }
   /* A state read spares the call on the usual path (READY). */
   if (c->state == CLIENT_STATE_DRAINING && !client_check_drained (c))
      goto done;
   if (c->pairing == CLIENT_PAIRING_NOT_PRIMARY && c->state == CLIENT_STATE_READY && creq_count (c) == 0 &&
       c->up_count == 0) {
      client_repair (c, CLIENT_REPAIR_NOT_PRIMARY);
      goto done;
   }
   if (client_reconnect_due (c)) {
      client_reconnect (c);
      goto done;
   }
   if (!client_up_connected (c))
      goto done;
   /* Nothing since the flow update read the upstream's input. */
   side_timer_update (c->up, c->cfg->message_timeout_ms, routed == CLIENT_ROUTED_SOME, mem_synced_in_len (c->up));
done:
   c->pumping--;
   pump_end (c);
}

void
client_resume (client_conn_t *c)
{
   /* Whoever resumes it found it on a list the close takes it off (the
    * decoder's jobs, the pool's hand-off, the memory waiters, the loop's
    * connections). */
   (void) client_pump (c);
}

void
client_output_queued (client_conn_t *c)
{
   /* Its callers queued something: the connection is open. */
   if (c->pumping == 0) {
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
   mem_sync_side (c, s); /* open: the pool detaches before the close */
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
      return c->loop->pooled->pool_server_name (c->server);
   return c->upstream_name ? c->upstream_name : "(no upstream)";
}

/* ------------------------------------------------------------ callbacks */

/* Both sides' callbacks (proxy/side.h), told apart by the side's kind. */

static client_conn_t *
side_conn (const side_t *s)
{
   return s->owner;
}

/* Both pumps, requests first (a connection the memory bound resumes). */
void
client_pump_both (client_conn_t *c)
{
   if (client_pump (c))
      upstream_pump (c);
}

/* Runs the pump of what `from` sends: requests, or replies. */
static void
conn_pump_from (client_conn_t *c, side_kind_t from)
{
   if (from == SIDE_CLIENT)
      (void) client_pump (c);
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
      c->loop->pooled->pool_server_lost (c, ev == SIDE_EVENT_EOF ? "upstream closed the connection" : detail);
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
      if (c->pairing == CLIENT_PAIRING_REPAIR_CONNECTING) {
         /* Paired again after a not-primary error: the client's handshake
          * was done; the server needs none on this connection (the proxy
          * speaks to it uncompressed, and the client never authenticated). */
         client_set_pairing (c, CLIENT_PAIRING_PAIRED);
         log_conn (LOG_LEVEL_INFO, c->id, c->peer, "paired again, with %s", c->upstream_name);
         client_set_state (c, CLIENT_STATE_READY);
      } else {
         client_set_pairing (c, CLIENT_PAIRING_PAIRED);
         client_set_state (c, CLIENT_STATE_HANDSHAKE);
      }
      (void) client_pump (c);
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
      if (client_repair_after_loss (c))
         break;
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
                            c->loop->pooled->pool_last_error (c->loop->pool));
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

/* In AWAIT_UPSTREAM: connect to the current primary, or wait for one;
 * `repair`: paired again (client_repair), READY once connected. */
static void
client_try_connect (client_conn_t *c, bool repair)
{
   client_pairing_t wait = repair ? CLIENT_PAIRING_REPAIR_WAIT_PRIMARY : CLIENT_PAIRING_WAIT_PRIMARY;
   topology_primary_t p;
   bson_error_t error;

   topology_get_primary (c->loop->topo, &p);
   if (p.state != TOPOLOGY_STATE_PRIMARY) {
      if (c->pairing != wait)
         log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "waiting for a primary");
      client_set_pairing (c, wait);
      return;
   }
   client_set_pairing (c, repair ? CLIENT_PAIRING_REPAIR_CONNECTING : CLIENT_PAIRING_CONNECTING);
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
      if (!loop->pooled->login_deadline_start (c)) {
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "out of memory for the login deadline");
         return true;
      }
      if (loop->pooled->pool_hello (loop->pool))
         client_set_state (c, CLIENT_STATE_HANDSHAKE);
      else
         loop->pooled->pool_want_hello (loop->pool);
      return true;
   }
   c->up = &c->upstream;
   client_try_connect (c, false);
   return true;
}

/* ------------------------------------------------------------ drain */

bool
client_check_drained (client_conn_t *c)
{
   if (c->state != CLIENT_STATE_DRAINING)
      return true;
   if (creq_count (c) == 0 && c->up_count == 0 && evbuffer_get_length (client_output (c)) == 0) {
      if (c->drain_reason == COUNTERS_CLOSE_NOT_PRIMARY)
         client_disconnect (c,
                            COUNTERS_CLOSE_NOT_PRIMARY,
                            "answered after a not-primary error from %s: the next connection pairs with the primary",
                            c->upstream_name);
      else
         client_disconnect (c, COUNTERS_CLOSE_SHUTDOWN, "drained");
      return false;
   }
   if (creq_count (c) == 0 && c->up_count == 0)
      /* Output still flushing: ask for the write callback at empty. */
      side_set_write_low (&c->client, 0);
   return true;
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
      (void) client_check_drained (c);
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
         loop->pooled->pool_reconnect (loop->pool);
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
   mem_loop_attach (loop);
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
   mem_loop_set_wake (loop, wake);
   return true;
}

bool
client_loop_enable_pool (client_loop_t *loop, const client_pooled_ops_t *ops, unsigned size, bson_error_t *error)
{
   RELAYBUS_ASSERT (!loop->pool && !loop->clients);
   loop->pooled = ops;
   loop->pool = ops->pool_new (loop, size, error);
   if (!loop->pool)
      loop->pooled = NULL;
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
      loop->pooled->pool_topology_changed (loop->pool);
      return;
   }
   for (c = loop->clients; c; c = next) {
      next = c->next;
      if (c->state == CLIENT_STATE_AWAIT_UPSTREAM && c->pairing == CLIENT_PAIRING_WAIT_PRIMARY)
         client_try_connect (c, false);
      else if (c->state == CLIENT_STATE_AWAIT_UPSTREAM && c->pairing == CLIENT_PAIRING_REPAIR_WAIT_PRIMARY)
         client_try_connect (c, true);
   }
}

void
client_loop_hello_learned (client_loop_t *loop)
{
   client_conn_t *c, *next;

   for (c = loop->clients; c; c = next) {
      next = c->next;
      if (c->state == CLIENT_STATE_AWAIT_UPSTREAM) {
         client_set_state (c, CLIENT_STATE_HANDSHAKE);
         client_resume (c);
      }
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
   if (loop->pool)
      loop->pooled->pool_destroy (loop->pool);
   loop->pool = NULL;
   /* No other loop posts to this one from here on; a resume already
    * queued finds the slot empty. */
   mem_loop_detach (loop);
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
      return c->loop->pooled->login_user (c);
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
