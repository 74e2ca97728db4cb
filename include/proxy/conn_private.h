/*
 * proxy/conn_private.h - what the two halves of a client connection share.
 *
 * Thread: forwarding loop (the decoding thread of proxy/decode.c touches
 * only its jobs).
 *
 * proxy/conn.c is a connection's lifecycle, and the one owner of its
 * state: its states and session mode's pairing (each changed by one
 * function, on the events the others report through client_event), the
 * flow decisions (the read gate: who may read, and why not), the callbacks
 * of its two sides, pairing with an upstream, draining and the one way to
 * close.  proxy/pump.c is what flows through it: framing, the two
 * in-flight FIFOs, forwarding, reply matching, the proxy's own answers and
 * internal requests; proxy/decode.c decodes a request (off the loop for a
 * big one), and proxy/route.c says what becomes of it.  proxy/side.c is
 * one socket of it, the client's or the upstream's.  Each includes this
 * header, and so do the pooled mode's modules that act on a client
 * connection's fields: proxy/pool.c (lending an upstream connection),
 * proxy/login.c (the login at the proxy) and proxy/owners.c (whose
 * cursors and sessions they are).  Every other module uses proxy/conn.h
 * only.
 *
 * The connection is the bottom of the proxy's modules that act on it:
 * login, owners and pool are built on it, route on those and pump on all
 * of them, so this header includes none of theirs (the pooled part of a
 * connection is the plain data of proxy/pool_client.h) and proxy/conn.c
 * reaches pool and login only through the table they install
 * (client_pooled_ops_t).
 */
#ifndef RELAYBUS_CLIENT_PRIVATE_H
#define RELAYBUS_CLIENT_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "base/assert.h"
#include "codec/handshake.h"
#include "codec/sasl.h"
#include "proxy/conn.h"
#include "proxy/pool_client.h"
#include "proxy/side.h"

struct event;
struct loopwake;
struct login;
struct pool;
struct pool_server;
struct clients_entry;

/* A request decoded off the loop, and the thread that does it
 * (proxy/decode.c). */
typedef struct client_job client_job_t;
typedef struct client_decoder client_decoder_t;

/* Requests whose decoding touches at least this many bytes (their length,
 * or for OP_COMPRESSED the announced uncompressed size) are decoded by the
 * loop's decoding thread (proxy/decode.c). */
#define CLIENT_OFFLOAD_MIN (1024 * 1024)

/* What the upstream's reply to one request is for. */
typedef enum {
   UPREQ_RELAY,    /* relay to the client (responseTo mapped back) */
   UPREQ_HELLO,    /* rewrite as the mongos persona, then relay */
   UPREQ_INTERNAL, /* the proxy's own request: reply to a callback */
} upreq_kind_t;

/* A client request that expects an answer, in the client's order. */
typedef struct {
   uint64_t seq;
   int32_t client_id;     /* the client's requestID: the answer's responseTo */
   int32_t family;        /* WIRE_OP_MSG or WIRE_OP_QUERY: the answer's opcode family */
   int compressor;        /* compress the answer with this id; -1: plain */
   bool done;             /* the final answer has been produced */
   struct evbuffer *held; /* answers produced while earlier requests wait; owned */
   /* relaybus_proxy_added_latency_seconds: when it was read
    * (clock_mono_us), and the upstream's time for its reply. */
   int64_t read_us;
   int64_t upstream_us;
} client_req_t;

/* A message sent upstream that expects a reply, in the upstream's order. */
typedef struct {
   upreq_kind_t kind;
   int32_t upstream_id;        /* the requestID the proxy sent */
   int32_t expect_response_to; /* upstream_id; then the last reply's id (exhaust) */
   uint64_t creq_seq;          /* RELAY, HELLO: the client request it answers */
   handshake_compression_t offer; /* HELLO: what to advertise */
   client_internal_cb_t cb;       /* INTERNAL */
   void *cb_ctx;
   bool track_cursor; /* RELAY, pooled: the cursor its reply opens is the client's user's (proxy/owners.h) */
   bool track_auth;   /* RELAY, HELLO, session mode: its reply is a SASL verdict for c->sasl (codec/sasl.h) */
   bool load_balanced; /* HELLO: the connection's first, with loadBalanced: true (its reply gets the serviceId) */
   int64_t sent_us;   /* clock_mono_us when queued upstream */
} upstream_req_t;

/* Session mode: where a connection is with its own upstream connection,
 * beside its state (client_conn_t.pairing).  proxy/conn.c alone changes it,
 * through one function whose moves are checked (client_set_pairing); the
 * pump and the routing policy report what they see with client_event.
 * Pooled mode: NONE throughout (its part is the pool's, pool_client_t).
 *
 * In AWAIT_UPSTREAM it waits for a primary, then connects to it; a
 * connection paired again (REPAIR_*) is READY again once connected,
 * without a hello, its requests unread meanwhile.  From the connect on it
 * is PAIRED, or BOUND once it carries state of its upstream connection
 * that a new one would not have (a login: saslStart, authenticate or a
 * speculativeAuthenticate hello; an exhaust cursor; moreToCome writes).
 * A not-primary error relayed (NOT_PRIMARY) means the member stepped down:
 * no request read after it goes to the old member.  Left paired with it,
 * the driver, which keeps a connection a state-change error came on, would
 * get the same error on every later request.  So once what is in flight
 * is answered, a PAIRED connection is paired again (client_repair, the
 * driver sees no close) and a BOUND one is drained and closed
 * (BOUND_NOT_PRIMARY, DRAINING with drain_reason not_primary).  The four
 * connected sub-states come last (client_event asserts it), the two not
 * primary last of all (one comparison tells them, at every pump's end). */
typedef enum {
   CLIENT_PAIRING_NONE = 0,            /* pooled mode, or not yet accepted */
   CLIENT_PAIRING_WAIT_PRIMARY,        /* AWAIT_UPSTREAM: no primary known */
   CLIENT_PAIRING_CONNECTING,          /* AWAIT_UPSTREAM: connecting; HANDSHAKE once connected */
   CLIENT_PAIRING_REPAIR_WAIT_PRIMARY, /* paired again: no primary known */
   CLIENT_PAIRING_REPAIR_CONNECTING,   /* paired again: connecting; READY once connected */
   CLIENT_PAIRING_PAIRED,              /* connected; may be paired again */
   CLIENT_PAIRING_BOUND,               /* connected, with state of its upstream connection: never paired again */
   CLIENT_PAIRING_NOT_PRIMARY,         /* PAIRED, and its member answered not primary */
   CLIENT_PAIRING_BOUND_NOT_PRIMARY,   /* BOUND, and its member answered not primary */
   CLIENT_PAIRING_COUNT_
} client_pairing_t;

/* Why a connection's client side is not read (CLIENT_HOLD_NONE: it is):
 * the one answer of proxy/conn.c's read gate (client_read_hold), kept in
 * client_conn_t.read_hold and shown by /api/clients (readHold). */
typedef enum {
   CLIENT_HOLD_NONE = 0,
   CLIENT_HOLD_UPSTREAM,        /* no upstream connection yet (AWAIT_UPSTREAM), or it is not connected */
   CLIENT_HOLD_DRAINING,        /* DRAINING: no new requests */
   CLIENT_HOLD_NOT_PRIMARY,     /* its member answered not primary: waits to be paired again, or closes */
   CLIENT_HOLD_POOL,            /* pooled: waits for an upstream connection of the pool */
   CLIENT_HOLD_INFLIGHT,        /* CLIENT_MAX_INFLIGHT requests (or _UPSTREAM_) wait for answers */
   CLIENT_HOLD_UPSTREAM_OUTPUT, /* the upstream's output is at buffer_high_watermark */
   CLIENT_HOLD_DECODING,        /* a request of it is being decoded off the loop */
   CLIENT_HOLD_PAUSED,          /* the operator paused the proxy (POST /api/pause) */
   CLIENT_HOLD_MEMORY,          /* waits for room under max_buffered_bytes */
   CLIENT_HOLD_COUNT_
} client_hold_t;

/* What the pump and the routing policy saw that the connection's state
 * depends on (client_event). */
typedef enum {
   CLIENT_EVENT_HELLO_ANSWERED, /* a hello's answer is on its way: HANDSHAKE is over */
   CLIENT_EVENT_BINDS_SESSION,  /* a request that leaves state on the upstream connection was routed */
   CLIENT_EVENT_NOT_PRIMARY,    /* a not-primary error of the upstream is being relayed */
} client_event_t;

/* Owned by its loop (listed in loop->clients until disconnected, then in
 * loop->free_list until freed).  Owns its two sides, its timer, its held
 * answers and a reference on its config snapshot. */
/* The slots of a connection's two FIFOs while something is in flight. */
typedef struct client_flight client_flight_t;
struct client_flight {
   client_req_t creqs[CLIENT_MAX_INFLIGHT];
   upstream_req_t upreqs[CLIENT_MAX_UPSTREAM_INFLIGHT];
   client_flight_t *next; /* loop->flight_free */
};

/* Free FIFO slots a loop keeps for the next busy connections; more are
 * freed. */
#define CLIENT_FLIGHT_FREE_MAX 256

struct client_conn {
   uint64_t id;
   char peer[CLIENT_PEER_MAX];
   client_state_t state;
   counters_close_reason_t drain_reason; /* DRAINING: why it closes (beside state: no padding) */
   client_loop_t *loop;
   config_t *cfg;

   side_t client;   /* the accepted socket; its timer: a partial request stalls */
   side_t upstream; /* session mode: the paired connection to the primary,
                     * open from client_try_connect on; its timer: a
                     * partial reply.  Unused in pooled mode. */
   /* The upstream side requests go to: &upstream in session mode (from
    * accept on, open or not); in pooled mode the side of the pooled
    * connection lent to this client (server), or NULL while it has none. */
   side_t *up;
   struct pool_server *server; /* pooled: the connection lent (proxy/pool.c), or NULL */
   char *upstream_name; /* session mode: host:port, for logs; set when it connects */
   client_pairing_t pairing; /* session mode: where it is with its upstream connection (proxy/conn.c alone writes it) */
   int32_t next_id; /* requestIDs the proxy sends upstream or to the client (after pairing: no padding) */
   /* Session mode: operator_generation () when its upstream connection
    * was opened; an older one is replaced once the connection is idle
    * (POST /api/reconnect, client_reconnect_due in proxy/conn.c). */
   uint64_t up_generation;

   struct event *timer;          /* per state: no primary / handshake */
   unsigned pumping; /* pumps on the stack: the outer one's end writes */
   unsigned mem_wait_sides; /* MEM_SIDE_* bits (below); 0: not waiting (beside pumping: no padding) */
   client_hold_t read_hold; /* the read gate's last answer (client_update_flow) */
   struct clients_entry *registry; /* its /api/clients entry (proxy/clients.h) until CLOSING */

   struct evbuffer *scratch; /* decompressed requests; NULL until one comes (client_scratch) */
   client_job_t *job; /* a request being decoded off the loop: the
                       * connection neither reads nor routes until it is
                       * back (proxy/decode.c owns it) */
   struct evbuffer *tmp;     /* re-encoded replies; NULL while unused (client_tmp) */

   int compressor; /* negotiated on the first hello, for logs; -1 none */
   /* Bit (1 << id) for each compressor the first hello negotiated: the
    * only ones (besides noop) its OP_COMPRESSED requests may use. */
   unsigned compressors_negotiated;

   /* The two FIFOs' slots, taken from the loop when a request arrives and
    * given back once nothing is in flight (client_flight_settle): an idle
    * connection holds none of their 4.6 KB. */
   client_flight_t *flight;
   uint64_t creq_head, creq_tail; /* seqs: [head, tail) are waiting */
   uint32_t up_head, up_count;

   /* The process-wide memory bound (proxy/mem.c).  mem_held: bytes
    * in this connection's buffers, kept exact by evbuffer callbacks;
    * each side's mem_partial: reserved for the rest of the partial message
    * at the front of its input; mem_decode: reserved for the request being
    * decompressed (and, off the loop, for its bytes).  All three are in
    * COUNTER_BUFFERED_BYTES.  A connection whose reservation does not fit
    * waits in loop->mem_wait_head (FIFO) with mem_need, that side not
    * read. */
   int64_t mem_held;
   int64_t mem_decode;
   int64_t mem_need;
   client_conn_t *mem_wait_prev, *mem_wait_next;

   /* Pooled mode: the client's place in the pool's FIFO and hand-off,
    * and how a request is refused without a connection (proxy/pool.h;
    * pool.c alone writes it). */
   pool_client_t pool;
   struct login *login;  /* pooled: the SASL conversation and who logged in (proxy/login.c) */
   /* Session mode: who the server accepted the client as, read from the
    * conversation relayed (codec/sasl.h); NULL until the first SASL
    * command.  Owned, freed with the connection. */
   sasl_watch_t *sasl;

   client_conn_t *prev, *next; /* loop->clients, or loop->free_list (next only) */

   void *data; /* client_set_data: another module's state, owned via data_destroy */
   void (*data_destroy) (void *);
};

struct client_loop {
   struct event_base *base;
   topology_t *topo;      /* borrowed */
   tls_upstream_t *tls;   /* borrowed, may be NULL */
   config_t *cfg;         /* retained */
   unsigned index;        /* client_loop_new's */
   struct loopwake *wake; /* client_loop_set_wake's; NULL before */
   client_conn_t *clients;
   size_t nclients;
   client_conn_t *free_list;
   struct event *free_ev;
   client_flight_t *flight_free; /* at most CLIENT_FLIGHT_FREE_MAX */
   size_t n_flight_free;
   bool draining;
   struct event *drain_timer;
   void (*on_empty) (void *);
   void *on_empty_ctx;
   client_request_hook_t hook; /* injection and virtual commands */
   void *hook_ctx;
   client_decoder_t *decoder; /* decodes big requests; NULL: all on the loop */
   /* Connections waiting for memory, oldest first; mem_ev resumes them. */
   client_conn_t *mem_wait_head, *mem_wait_tail;
   struct event *mem_ev;
   bool mem_ev_active;
   int64_t mem_pause_started_ms; /* first pause of the episode; 0: none */
   int64_t mem_last_log_ms;
   uint64_t mem_episode_pauses;
   struct pool *pool; /* pooled mode: this loop's upstream connections; NULL in session mode */
   const client_pooled_ops_t *pooled; /* pooled mode: how to reach pool and login; NULL in session mode */
};

/* ------------------------------------------------------------ buffers */

static inline struct evbuffer *
client_output (client_conn_t *c)
{
   return side_output (&c->client);
}

/* Only while c->up is set (always in session mode). */
static inline struct evbuffer *
upstream_output (client_conn_t *c)
{
   return side_output (c->up);
}

/* Whether requests can go upstream now: the upstream side is there and
 * connected. */
static inline bool
client_up_connected (const client_conn_t *c)
{
   return c->up && c->up->connected;
}

static inline size_t
high_watermark (const client_conn_t *c)
{
   return (size_t) c->cfg->buffer_high_watermark;
}

/* ------------------------------------------------------------ FIFOs */

static inline uint32_t
creq_count (const client_conn_t *c)
{
   RELAYBUS_ASSERT (c->creq_tail - c->creq_head <= CLIENT_MAX_INFLIGHT);
   return (uint32_t) (c->creq_tail - c->creq_head);
}

static inline client_req_t *
creq_find (client_conn_t *c, uint64_t seq)
{
   if (seq < c->creq_head || seq >= c->creq_tail)
      return NULL;
   return &c->flight->creqs[seq % CLIENT_MAX_INFLIGHT];
}

static inline void
upreq_pop (client_conn_t *c)
{
   RELAYBUS_ASSERT (c->up_count > 0);
   c->up_head = (c->up_head + 1) % CLIENT_MAX_UPSTREAM_INFLIGHT;
   c->up_count--;
}

/* The connection's FIFO slots, from the loop's free ones or new. */
static inline client_flight_t *
client_flight_take (client_conn_t *c)
{
   client_loop_t *loop = c->loop;

   if (!c->flight) {
      if (loop->flight_free) {
         c->flight = loop->flight_free;
         loop->flight_free = c->flight->next;
         loop->n_flight_free--;
      } else {
         c->flight = bson_malloc0 (sizeof *c->flight);
      }
      c->flight->next = NULL;
   }
   return c->flight;
}

/* Gives the FIFO slots back to the loop when nothing is in flight.  Only
 * where no slot pointer is live: the end of a pump (client_update_flow)
 * and the connection's end. */
static inline void
client_flight_settle (client_conn_t *c)
{
   client_loop_t *loop = c->loop;

   if (!c->flight || creq_count (c) > 0 || c->up_count > 0)
      return;
   if (loop->n_flight_free < CLIENT_FLIGHT_FREE_MAX) {
      c->flight->next = loop->flight_free;
      loop->flight_free = c->flight;
      loop->n_flight_free++;
   } else {
      bson_free (c->flight);
   }
   c->flight = NULL;
}

/* Room for one more request in both FIFOs (a relayed request takes one of
 * each; HELLO too). */
static inline bool
fifo_has_room (const client_conn_t *c)
{
   return creq_count (c) < CLIENT_MAX_INFLIGHT && c->up_count < CLIENT_MAX_UPSTREAM_INFLIGHT;
}

/* ------------------------------------------------------------ across */

/* proxy/conn.c: what the pump or the routing policy saw; the connection
 * changes its state or sub-state at once (its one transition function
 * each), and acts on the rest where the pump returns to it. */
void client_event (client_conn_t *c, client_event_t ev);
/* proxy/conn.c, pooled mode: the pool learned the upstream's hello: the
 * clients that waited for it (AWAIT_UPSTREAM) shake hands now. */
void client_loop_hello_learned (client_loop_t *loop);
/* proxy/conn.c: in DRAINING, closes the connection once nothing is in flight
 * and its output is written.  Returns false when it closed it. */
bool client_check_drained (client_conn_t *c);
/* proxy/conn.c: something was queued on an output.  Inside a pump (the request
 * hook, an internal reply's callback) the pump's end writes it with the
 * rest; outside one (a call from any other loop callback) it is written
 * now, as plain sockets have no write event armed to do it later. */
void client_output_queued (client_conn_t *c);

/* Takes `x` out of the doubly linked list of connections threaded through
 * its fields PREV and NEXT, whose first element is `head` (an lvalue).
 * The loop keeps two: its live connections (proxy/conn.c) and those
 * waiting for memory (proxy/mem.c). */
#define CONN_LIST_UNLINK(head, x, PREV, NEXT) \
   do {                                       \
      if ((x)->PREV)                          \
         (x)->PREV->NEXT = (x)->NEXT;         \
      else                                    \
         (head) = (x)->NEXT;                  \
      if ((x)->NEXT)                          \
         (x)->NEXT->PREV = (x)->PREV;         \
   } while (0)

/* proxy/mem.c, the memory bound.  client_mem_reserve_decode reserves `n`
 * bytes for decompressing the request at the front of the input (false:
 * the connection now waits for memory; stop routing); release gives back
 * what the decode reserved.  client_mem_watch counts a buffer of the
 * connection's (a held answer, a work buffer) in mem_held (false: out of
 * memory). */
bool client_mem_reserve_decode (client_conn_t *c, int64_t n);
void client_mem_release_decode (client_conn_t *c);
bool client_mem_watch (client_conn_t *c, struct evbuffer *buf);

/* proxy/mem.c, for proxy/conn.c.  What a connection waits for
 * (mem_wait_sides): reading its client (a partial request), reading its
 * upstream (a partial reply), or decompressing the request at the front
 * of its input (the client is not read meanwhile either). */
#define MEM_SIDE_CLIENT 1u
#define MEM_SIDE_UP 2u
#define MEM_SIDE_DECODE 4u
/* A side's count: by buffer callbacks (mem_watch_side; false: out of
 * memory), none (mem_unwatch_side), or by its lengths once it went
 * direct (mem_side_went_direct, then mem_sync_side where a pump ends). */
bool mem_watch_side (client_conn_t *c, side_t *s);
void mem_unwatch_side (side_t *s);
void mem_side_went_direct (side_t *s);
void mem_sync_direct (client_conn_t *c, side_t *s, size_t out_len);
static inline void
mem_sync_side (client_conn_t *c, side_t *s)
{
   if (s->direct)
      mem_sync_direct (c, s, evbuffer_get_length (side_output (s)));
}
/* A side's output length right after mem_sync_side (which read it
 * already, for a direct side that libevent does not write). */
static inline size_t
mem_synced_out_len (side_t *s)
{
   return s->direct && !s->mem_cb_out ? s->mem_out_seen : evbuffer_get_length (side_output (s));
}
/* A side's input length right after mem_sync_side (which read it
 * already, for a direct side). */
static inline size_t
mem_synced_in_len (side_t *s)
{
   return s->direct ? s->mem_in_seen : evbuffer_get_length (side_input (s));
}
/* Whether a side may read (right after mem_sync_side); false: the
 * connection now waits for memory, on the loop's wait list.  Inline for
 * the usual answer, a connection that waits for nothing with no header in
 * the side's input: yes, nothing to reserve (every pump's end asks, for
 * both sides). */
bool mem_may_read_partial (client_conn_t *c, side_t *s);
static inline bool
mem_may_read (client_conn_t *c, side_t *s)
{
   if (!c->mem_wait_sides && mem_synced_in_len (s) < WIRE_HEADER_LEN)
      return true;
   return mem_may_read_partial (c, s);
}
/* Leaves the wait list. */
void mem_unwait (client_conn_t *c);
/* `n` bytes counted or reserved go back; waiters may resume. */
void mem_give_back (client_loop_t *loop, int64_t n);
/* The total fell (a reload raised the bound): resume waiters if it fits. */
void mem_maybe_resume (client_loop_t *loop);
/* The upstream side goes (client_repair), or everything the connection
 * held or reserved (its close). */
void mem_release_side (client_conn_t *c, side_t *s);
void mem_release_all (client_conn_t *c);
/* loop->mem_ev's callback: resumes waiters oldest first while their
 * reservations fit, each through client_pump_both. */
void mem_resume_cb (evutil_socket_t fd, short what, void *arg);
/* The loop's slot among the loops that post each other resumes: taken at
 * creation, given its wake, left before the loop is destroyed. */
void mem_loop_attach (client_loop_t *loop);
void mem_loop_set_wake (client_loop_t *loop, struct loopwake *wake);
void mem_loop_detach (client_loop_t *loop);
/* proxy/conn.c: runs the connection's request pump, then its reply pump. */
void client_pump_both (client_conn_t *c);
/* proxy/conn.c: c->tmp, empty, created (and counted) on first use; false:
 * out of memory (error set).  Freed again at the pump's end while empty. */
bool client_tmp (client_conn_t *c, bson_error_t *error);
/* proxy/conn.c: c->scratch, created on first use, like client_tmp; kept
 * while the connection negotiated compression (each request needs it). */
bool client_scratch (client_conn_t *c, bson_error_t *error);

/* proxy/conn.c: runs the client's pump from outside a libevent callback of
 * the connection (a finished decoding job, a pooled connection handed
 * over). */
void client_resume (client_conn_t *c);

/* proxy/conn.c, pooled mode: lends the connected side `s` (owner and
 * callbacks become the connection's) to c as its upstream, counted in its
 * memory from now on; and takes it back: what its buffers held goes back
 * to the memory bound, reading and the drain callback stop, and the side
 * is the caller's again (it sets owner and callbacks).  Detach only with
 * nothing in flight. */
void client_attach_upstream (client_conn_t *c, side_t *s);
void client_detach_upstream (client_conn_t *c);

/* The name of the upstream the connection talks to, for logs. */
const char *client_upstream_name (const client_conn_t *c);

/* proxy/decode.c: the decoding thread of a loop.  Start posts its results
 * through `wake`; stop joins it and frees what it still holds (call it
 * after every connection is closed). */
bool client_decoder_start (client_loop_t *loop, struct loopwake *wake, bson_error_t *error)
   __attribute__ ((warn_unused_result));
void client_decoder_stop (client_loop_t *loop);
/* proxy/decode.c: the connection closes: its job, if any, is dropped. */
void client_job_cancel (client_conn_t *c);

/* What client_route did with the complete messages of a side's input. */
typedef enum {
   CLIENT_ROUTED_NONE = 0, /* took none */
   CLIENT_ROUTED_SOME,     /* took at least one */
   CLIENT_ROUTED_CLOSED,   /* the connection closed (CLOSING): touch nothing of it */
} client_routed_t;

/* proxy/pump.c: handles every complete message in the input of `from`
 * (c->client: requests, while the FIFOs and the upstream's output have
 * room; c->upstream: replies, while the client's output has room). */
client_routed_t client_route (client_conn_t *c, side_t *from);

#endif /* RELAYBUS_CLIENT_PRIVATE_H */
