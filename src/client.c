/*
 * client.c - the forwarding machine: one client connection, its upstream,
 * framing both ways, reply matching, backpressure and every way to close.
 *
 * Data path.  A request is handled only once it is complete in the client's
 * input buffer.  It is made contiguous once (evbuffer_pullup) to be parsed
 * and inspected; if the proxy forwards it unchanged, its requestID is
 * replaced in place in the input buffer and the whole message moved to the
 * upstream's output with evbuffer_remove_buffer (chain moves, no copy).
 * Replies go the other way the same way with responseTo mapped back.  Only
 * hellos, checksummed messages and proxy answers are re-encoded.
 *
 * Compression.  The upstream is never asked to compress (handshake.c strips
 * `compression` from the hello it forwards), so everything upstream is
 * plain; the client's compressed requests are decompressed here and its
 * replies compressed with the request's compressor, as mongod does.
 *
 * Lifetime.  client_disconnect frees the sockets and timers at once (so no
 * callback of ours can fire again) and puts the struct on the loop's free
 * list; it is freed from an event on the next loop turn.  Any code that
 * calls something able to disconnect checks for CLIENT_STATE_CLOSING before
 * touching buffers again.
 */
#include "client.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/err.h>

#include "clients_registry.h"
#include "compress.h"
#include "handshake.h"
#include "log.h"
#include "upstream.h"

/* Replies larger than this are not scanned for "not primary" errors: such
 * errors are small documents, and scanning a big cursor batch would cost a
 * pullup copy for nothing. */
#define CLIENT_SCAN_LIMIT (64 * 1024)

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
} upstream_req_t;

/* Owned by its loop (listed in loop->clients until disconnected, then in
 * loop->free_list until freed).  Owns its bufferevent, its upstream, its
 * timers, its held answers and a reference on its config snapshot. */
struct client_conn {
   uint64_t id;
   char peer[128];
   client_state_t state;
   client_loop_t *loop;
   config_t *cfg;

   struct bufferevent *bev;
   upstream_conn_t *up;
   bool waiting_primary;  /* in AWAIT_UPSTREAM with no primary known */

   struct event *timer;          /* per state: no primary / handshake */
   struct event *req_timer;      /* a partial request stalls */
   struct event *reply_timer;    /* a partial reply stalls */
   bool req_timer_armed;         /* req_timer is pending (saves event_del calls) */
   bool reply_timer_armed;

   /* The write callbacks are installed only while they have work to do
    * (client_update_flow): libevent schedules one after nearly every
    * write otherwise. */
   bool client_drained_cb;   /* client_write_cb installed */
   bool up_drained_cb;       /* upstream_want_drained on */

   struct evbuffer *scratch; /* decompressed requests */
   struct evbuffer *tmp;     /* re-encoded replies */

   int compressor; /* negotiated on the first hello, for logs; -1 none */
   int32_t next_id; /* requestIDs the proxy sends upstream or to the client */

   client_req_t creqs[CLIENT_MAX_INFLIGHT];
   uint64_t creq_head, creq_tail; /* seqs: [head, tail) are waiting */
   upstream_req_t upreqs[CLIENT_MAX_UPSTREAM_INFLIGHT];
   uint32_t up_head, up_count;

   client_conn_t *prev, *next; /* loop->clients, or loop->free_list (next only) */

   void *data; /* client_set_data: another module's state, owned via data_destroy */
   void (*data_destroy) (void *);
};

struct client_loop {
   struct event_base *base;
   topology_t *topo;      /* borrowed */
   tls_upstream_t *tls;   /* borrowed, may be NULL */
   config_t *cfg;         /* retained */
   uint64_t next_conn_id;
   client_conn_t *clients;
   size_t nclients;
   client_conn_t *free_list;
   struct event *free_ev;
   bool draining;
   struct event *drain_timer;
   void (*on_empty) (void *);
   void *on_empty_ctx;
   client_request_hook_t hook; /* injection and virtual commands */
   void *hook_ctx;
};

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
static void client_read_cb (struct bufferevent *bev, void *arg);
static void client_write_cb (struct bufferevent *bev, void *arg);
static void client_event_cb (struct bufferevent *bev, short what, void *arg);
static void client_update_flow (client_conn_t *c);
static void client_check_drained (client_conn_t *c);

/* ------------------------------------------------------------ helpers */

static void
put_le32 (uint8_t *p, int32_t v)
{
   uint32_t u = (uint32_t) v;
   p[0] = (uint8_t) u;
   p[1] = (uint8_t) (u >> 8);
   p[2] = (uint8_t) (u >> 16);
   p[3] = (uint8_t) (u >> 24);
}

static uint32_t
get_le32 (const uint8_t *p)
{
   return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static int32_t
client_next_id (client_conn_t *c)
{
   /* Positive and never 0: some drivers treat responseTo 0 as "none". */
   if (c->next_id <= 0 || c->next_id == INT32_MAX)
      c->next_id = 1;
   return c->next_id++;
}

static struct timeval
ms_to_tv (int64_t ms)
{
   struct timeval tv = {(time_t) (ms / 1000), (suseconds_t) ((ms % 1000) * 1000)};
   return tv;
}

/* Header ids are any int32 (pymongo's are random, often negative), so
 * "leave it as it is" needs a value outside that range. */
#define KEEP_ID INT64_MIN

/* Moves one complete message of `len` bytes from `src` to `dst`, replacing
 * its requestID and/or responseTo (KEEP_ID: keep).  The ids are patched in
 * place in `src`'s first chain (evbuffer_pullup of the header costs nothing
 * when the header is contiguous, as it nearly always is), then the whole
 * message moves as evbuffer chains: a message read in one piece is never
 * copied.  Every chain the proxy moves is its own (socket reads, and
 * buffers it built with evbuffer_reserve_space), never a read-only
 * reference, so writing into it is allowed. */
static bool
move_message (struct evbuffer *src, struct evbuffer *dst, size_t len, int64_t request_id, int64_t response_to)
{
   if (request_id != KEEP_ID || response_to != KEEP_ID) {
      uint8_t *hdr = evbuffer_pullup (src, WIRE_HEADER_LEN);

      if (!hdr)
         return false;
      if (request_id != KEEP_ID)
         put_le32 (hdr + 4, (int32_t) request_id);
      if (response_to != KEEP_ID)
         put_le32 (hdr + 8, (int32_t) response_to);
   }
   return evbuffer_remove_buffer (src, dst, len) == (int) len;
}

static struct evbuffer *
client_output (client_conn_t *c)
{
   return bufferevent_get_output (c->bev);
}

static struct evbuffer *
upstream_output (client_conn_t *c)
{
   return bufferevent_get_output (upstream_bev (c->up));
}

static size_t
high_watermark (const client_conn_t *c)
{
   return (size_t) c->cfg->buffer_high_watermark;
}

/* ------------------------------------------------------------ FIFOs */

static uint32_t
creq_count (const client_conn_t *c)
{
   return (uint32_t) (c->creq_tail - c->creq_head);
}

static client_req_t *
creq_find (client_conn_t *c, uint64_t seq)
{
   if (seq < c->creq_head || seq >= c->creq_tail)
      return NULL;
   return &c->creqs[seq % CLIENT_MAX_INFLIGHT];
}

static client_req_t *
creq_push (client_conn_t *c, int32_t client_id, int32_t family, int compressor)
{
   client_req_t *r;

   if (creq_count (c) >= CLIENT_MAX_INFLIGHT)
      return NULL;
   r = &c->creqs[c->creq_tail % CLIENT_MAX_INFLIGHT];
   memset (r, 0, sizeof *r);
   r->seq = c->creq_tail++;
   r->client_id = client_id;
   r->family = family;
   r->compressor = compressor;
   return r;
}

static upstream_req_t *
upreq_push (client_conn_t *c, upreq_kind_t kind, int32_t upstream_id)
{
   upstream_req_t *u;

   if (c->up_count >= CLIENT_MAX_UPSTREAM_INFLIGHT)
      return NULL;
   u = &c->upreqs[(c->up_head + c->up_count) % CLIENT_MAX_UPSTREAM_INFLIGHT];
   memset (u, 0, sizeof *u);
   u->kind = kind;
   u->upstream_id = upstream_id;
   u->expect_response_to = upstream_id;
   c->up_count++;
   return u;
}

static void
upreq_pop (client_conn_t *c)
{
   c->up_head = (c->up_head + 1) % CLIENT_MAX_UPSTREAM_INFLIGHT;
   c->up_count--;
}

/* Room for one more request in both FIFOs (a relayed request takes one of
 * each; HELLO too). */
static bool
fifo_has_room (const client_conn_t *c)
{
   return creq_count (c) < CLIENT_MAX_INFLIGHT && c->up_count < CLIENT_MAX_UPSTREAM_INFLIGHT;
}

/* ------------------------------------------------------------ state */

static void
client_set_state (client_conn_t *c, client_state_t next)
{
   struct timeval tv;
   int64_t ms = 0;

   if (c->state == next)
      return;
   if (c->state != CLIENT_STATE_COUNT_) /* COUNT_: not yet in any state */
      log_debug ("c%" PRIu64 " %s: %s -> %s",
              c->id,
              c->peer,
              client_state_name (c->state),
              client_state_name (next));
   c->state = next;
   /* /api/clients: before CLOSING frees the socket the registry reads. */
   clients_registry_note (
      c->id, c->peer, c->bev ? bufferevent_getfd (c->bev) : -1, client_state_name (next), next != CLIENT_STATE_CLOSING);
   if (next == CLIENT_STATE_CLOSING)
      return;
   /* The per-state timer: each state has at most one deadline. */
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
      tv = ms_to_tv (ms);
      evtimer_add (c->timer, &tv);
   }
   client_update_flow (c);
}

static const char *
client_close_level_is_warn (stats_close_reason_t reason)
{
   switch (reason) {
   case STATS_CLOSE_CLIENT_EOF:
   case STATS_CLOSE_SHUTDOWN:
      return NULL;
   default:
      return "warn";
   }
}

void
client_disconnect (client_conn_t *c, stats_close_reason_t reason, const char *fmt, ...)
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
   log_conn (client_close_level_is_warn (reason) ? LOG_LEVEL_WARN : LOG_LEVEL_INFO,
             c->id,
             c->peer,
             "closing (%s) in %s: %s",
             stats_close_reason_name (reason),
             client_state_name (c->state),
             detail);
   stats_count_close (reason);
   stats_sub (connections_open, 1);
   client_set_state (c, CLIENT_STATE_CLOSING);

   /* Sockets and timers go now: nothing of ours can fire after this. */
   upstream_destroy (c->up);
   c->up = NULL;
   if (c->bev)
      bufferevent_free (c->bev);
   c->bev = NULL;
   event_free (c->timer);
   event_free (c->req_timer);
   event_free (c->reply_timer);
   c->timer = c->req_timer = c->reply_timer = NULL;

   /* Internal requests learn that no reply will come (their owners free
    * their context).  They may not send anything: the state is CLOSING. */
   bson_set_error (&error, CLIENT_ERROR_DOMAIN, 1, "connection closed: %s", detail);
   while (c->up_count > 0) {
      upstream_req_t u = c->upreqs[c->up_head];
      upreq_pop (c);
      if (u.kind == UPREQ_INTERNAL && u.cb)
         u.cb (c, NULL, &error, u.cb_ctx);
   }
   for (uint64_t s = c->creq_head; s < c->creq_tail; s++) {
      client_req_t *r = creq_find (c, s);
      if (r->held)
         evbuffer_free (r->held);
      r->held = NULL;
   }
   c->creq_head = c->creq_tail;

   /* Off the live list, onto the free list. */
   if (c->prev)
      c->prev->next = c->next;
   else
      loop->clients = c->next;
   if (c->next)
      c->next->prev = c->prev;
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
   if (c->scratch)
      evbuffer_free (c->scratch);
   if (c->tmp)
      evbuffer_free (c->tmp);
   config_release (c->cfg);
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

/* ------------------------------------------------------------ flow */

/* Turns reading on or off only when that changes: bufferevent_enable
 * re-adds the read event (event_add) even when it is already on. */
static void
set_reading (struct bufferevent *bev, bool on)
{
   bool is_on = (bufferevent_get_enabled (bev) & EV_READ) != 0;

   if (on == is_on)
      return;
   if (on)
      bufferevent_enable (bev, EV_READ);
   else
      bufferevent_disable (bev, EV_READ);
}

/* Recomputes which sides may read.  Rules (le-proxy's, plus the FIFOs):
 *  - the client is read only in HANDSHAKE/READY, with the upstream
 *    connected, room in the FIFOs, and the upstream's output below the
 *    high watermark;
 *  - the upstream is read while the client's output is below it.
 * Write low watermarks are high/2, so the drain callbacks resume reading
 * with hysteresis.  A drain callback is installed only while its side's
 * output holds the other side back (and the client's while DRAINING,
 * which waits for its output to empty): every other resumption comes from
 * a read or a reply, which end here too.  Cheap when nothing changes: no
 * libevent call but the two length reads and bufferevent_get_enabled. */
static void
client_update_flow (client_conn_t *c)
{
   bool up = upstream_is_connected (c->up);
   bool up_full = false, client_full, want;
   size_t high;

   if (c->state == CLIENT_STATE_CLOSING)
      return;
   high = high_watermark (c);
   client_full = evbuffer_get_length (client_output (c)) >= high;
   if (up) {
      up_full = evbuffer_get_length (upstream_output (c)) >= high;
      set_reading (upstream_bev (c->up), !client_full);
      if (up_full != c->up_drained_cb) {
         upstream_want_drained (c->up, up_full);
         c->up_drained_cb = up_full;
      }
   }
   set_reading (c->bev,
                (c->state == CLIENT_STATE_HANDSHAKE || c->state == CLIENT_STATE_READY) && up && fifo_has_room (c) &&
                   !up_full);
   want = client_full || c->state == CLIENT_STATE_DRAINING;
   if (want != c->client_drained_cb) {
      bufferevent_setcb (c->bev, client_read_cb, want ? client_write_cb : NULL, client_event_cb, c);
      c->client_drained_cb = want;
   }
}

/* A partial message in `in` may wait at most message_timeout_ms, counted
 * from when it began to be waited for (`consumed`: a message was taken, so
 * what is left began now), and only while we are reading that side (a
 * stall caused by our own backpressure is not the peer's fault).  The timer
 * is touched only when a message is really partial or the timer was armed:
 * whole messages, the usual case, cost no event_add/event_del. */
static void
message_timer_update (client_conn_t *c, struct event *timer, bool *armed, struct bufferevent *bev, bool consumed)
{
   bool partial = c->cfg->message_timeout_ms > 0 && evbuffer_get_length (bufferevent_get_input (bev)) > 0 &&
                  (bufferevent_get_enabled (bev) & EV_READ);

   if (*armed && (consumed || !partial)) {
      evtimer_del (timer);
      *armed = false;
   }
   if (partial && !*armed) {
      struct timeval tv = ms_to_tv (c->cfg->message_timeout_ms);
      evtimer_add (timer, &tv);
      *armed = true;
   }
}

/* ------------------------------------------------------------ answers */

/* Puts one complete message (`len` bytes at the front of `src`) where the
 * answer to `r` belongs: the client's output if `r` is the oldest waiting
 * request, else `r`'s held buffer.  Compresses when the request was
 * compressed.  `response_to` other than KEEP_ID replaces the header's responseTo.
 * With `final`, `r` is complete and the FIFO advances. */
static bool
client_deliver (client_conn_t *c,
                client_req_t *r,
                struct evbuffer *src,
                size_t len,
                int64_t response_to,
                bool final,
                bson_error_t *error)
{
   struct evbuffer *dst;
   struct evbuffer *z = NULL;
   bool ok = false;

   if (r->seq == c->creq_head && !r->held) {
      dst = client_output (c);
   } else {
      if (!r->held)
         r->held = evbuffer_new ();
      dst = r->held;
   }
   if (r->compressor > 0) {
      const uint8_t *msg = evbuffer_pullup (src, (ssize_t) len);
      z = evbuffer_new ();
      if (!msg || !z || !wire_compress (msg, len, (uint8_t) r->compressor, (int) (r->compressor == COMPRESS_ZSTD ? c->cfg->zstd_level : c->cfg->zlib_level), z, error))
         goto done;
      evbuffer_drain (src, len);
      stats_add (messages_compressed, 1);
      src = z;
      len = evbuffer_get_length (z);
   }
   if (!move_message (src, dst, len, KEEP_ID, response_to)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 2, "out of memory moving a reply");
      goto done;
   }
   stats_add (bytes_to_clients, len);
   if (final) {
      r->done = true;
      /* Advance past every completed request, releasing held answers in
       * order; a request that became oldest while still streaming gets its
       * held part flushed so its next replies can go straight out. */
      while (c->creq_head < c->creq_tail) {
         client_req_t *h = creq_find (c, c->creq_head);
         if (h->held) {
            evbuffer_add_buffer (client_output (c), h->held);
            evbuffer_free (h->held);
            h->held = NULL;
         }
         if (!h->done)
            break;
         c->creq_head++;
      }
   }
   ok = true;
done:
   if (z)
      evbuffer_free (z);
   return ok;
}

bool
client_hold_request (client_conn_t *c,
                     int32_t client_request_id,
                     int32_t family,
                     int compressor,
                     uint64_t *request_seq,
                     bson_error_t *error)
{
   client_req_t *r = creq_push (c, client_request_id, family, compressor);

   if (!r) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 3, "too many requests in flight");
      return false;
   }
   *request_seq = r->seq;
   return true;
}

bool
client_answer (client_conn_t *c, uint64_t request_seq, const bson_t *reply, bson_error_t *error)
{
   client_req_t *r = creq_find (c, request_seq);
   bool ok = false;

   if (c->state == CLIENT_STATE_CLOSING || !r || r->done) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 4, "no such request waiting for an answer");
      goto done;
   }
   evbuffer_drain (c->tmp, evbuffer_get_length (c->tmp));
   if (r->family == WIRE_OP_QUERY)
      ok = wire_append_reply (c->tmp, client_next_id (c), r->client_id, 8 /* AwaitCapable */, reply);
   else
      ok = wire_append_msg (c->tmp, client_next_id (c), r->client_id, 0, reply, NULL, 0);
   if (!ok) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 5, "answer too large");
      goto done;
   }
   ok = client_deliver (c, r, c->tmp, evbuffer_get_length (c->tmp), KEEP_ID, true, error);
   if (ok)
      client_check_drained (c);
done:
   return ok;
}

bool
client_answer_error (client_conn_t *c,
                     uint64_t request_seq,
                     int32_t code,
                     const char *code_name,
                     const char *errmsg,
                     bson_error_t *error)
{
   bson_t doc = BSON_INITIALIZER;
   bool ok;

   BSON_APPEND_DOUBLE (&doc, "ok", 0.0);
   BSON_APPEND_UTF8 (&doc, "errmsg", errmsg);
   BSON_APPEND_INT32 (&doc, "code", code);
   BSON_APPEND_UTF8 (&doc, "codeName", code_name);
   ok = client_answer (c, request_seq, &doc, error);
   bson_destroy (&doc);
   return ok;
}

/* ------------------------------------------------------------ internal */

bool
client_send_internal (client_conn_t *c,
                      const bson_t *body,
                      const wire_sequence_t *sequences,
                      uint32_t nsequences,
                      client_internal_cb_t cb,
                      void *ctx,
                      bson_error_t *error)
{
   upstream_req_t *u;
   int32_t id;
   size_t before;

   if (c->state == CLIENT_STATE_CLOSING || !upstream_is_connected (c->up)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 6, "upstream not connected");
      return false;
   }
   if (c->up_count >= CLIENT_MAX_UPSTREAM_INFLIGHT) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 3, "too many requests in flight");
      return false;
   }
   id = client_next_id (c);
   before = evbuffer_get_length (upstream_output (c));
   if (!wire_append_msg (upstream_output (c), id, 0, 0, body, sequences, nsequences)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 5, "request too large");
      return false;
   }
   u = upreq_push (c, UPREQ_INTERNAL, id);
   u->cb = cb;
   u->cb_ctx = ctx;
   stats_add (internal_requests, 1);
   stats_add (bytes_to_upstream, evbuffer_get_length (upstream_output (c)) - before);
   return true;
}

/* ------------------------------------------------------------ requests */

/* Forwards a request unchanged but for its requestID.  A request with a
 * checksum is re-encoded instead: changing the header would break its
 * CRC, and the proxy drops checksums of what it rewrites. */
static bool
forward_request (client_conn_t *c,
                 struct evbuffer *src,
                 size_t len,
                 const wire_msg_t *msg,
                 const char *cmd,
                 int compressor,
                 bson_error_t *error)
{
   struct evbuffer *out = upstream_output (c);
   int32_t id = client_next_id (c);
   bool more = (msg->flags & WIRE_MSG_MORE_TO_COME) != 0;

   if (!more) {
      client_req_t *r;
      upstream_req_t *u;

      /* Only a compressed request's answer is compressed, so only then can
       * the exempt list (12 names) matter. */
      if (compressor > 0 && compress_command_is_exempt (cmd))
         compressor = -1;
      r = creq_push (c, msg->header.request_id, WIRE_OP_MSG, compressor);
      u = upreq_push (c, UPREQ_RELAY, id);
      if (!r || !u) {
         /* fifo_has_room was checked before reading this request. */
         bson_set_error (error, CLIENT_ERROR_DOMAIN, 3, "too many requests in flight");
         return false;
      }
      u->creq_seq = r->seq;
   }
   if (msg->checksum_present) {
      if (!wire_append_msg (out,
                            id,
                            msg->header.response_to,
                            msg->flags & ~WIRE_MSG_CHECKSUM_PRESENT,
                            &msg->body,
                            msg->sequences,
                            msg->nsequences)) {
         bson_set_error (error, CLIENT_ERROR_DOMAIN, 5, "request too large");
         return false;
      }
      stats_add (bytes_to_upstream, len);
      evbuffer_drain (src, len);
      return true;
   }
   if (!move_message (src, out, len, id, KEEP_ID)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 2, "out of memory forwarding a request");
      return false;
   }
   stats_add (bytes_to_upstream, len);
   return true;
}

/* A hello (OP_MSG or legacy OP_QUERY) goes upstream as OP_MSG without
 * `compression`; the reply comes back through reply_hello. */
static bool
forward_hello (client_conn_t *c,
               struct evbuffer *src,
               size_t len,
               int32_t client_id,
               int32_t family,
               const bson_t *hello,
               bson_error_t *error)
{
   bson_t body;
   client_req_t *r;
   upstream_req_t *u;
   int32_t id;
   bool ok = false;

   if (!handshake_rewrite_request (hello, family == WIRE_OP_QUERY, &body, error))
      goto done;
   r = creq_push (c, client_id, family, -1 /* hello is never compressed */);
   id = client_next_id (c);
   u = upreq_push (c, UPREQ_HELLO, id);
   if (!r || !u) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 3, "too many requests in flight");
      goto done;
   }
   u->creq_seq = r->seq;
   handshake_negotiate (hello, c->cfg->compressors, &u->offer);
   if (c->state == CLIENT_STATE_HANDSHAKE)
      c->compressor = u->offer.n > 0 ? u->offer.ids[0] : -1;
   if (!wire_append_msg (upstream_output (c), id, 0, 0, &body, NULL, 0)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 5, "hello too large");
      goto done;
   }
   stats_add (bytes_to_upstream, len);
   evbuffer_drain (src, len);
   ok = true;
done:
   bson_destroy (&body);
   return ok;
}

/* Answers a request the proxy handles itself with an error document. */
static bool
answer_locally (client_conn_t *c,
                int32_t client_id,
                int32_t family,
                int compressor,
                int32_t code,
                const char *code_name,
                const char *errmsg,
                struct evbuffer *src,
                size_t len,
                bson_error_t *error)
{
   uint64_t seq;

   evbuffer_drain (src, len);
   if (!client_hold_request (c, client_id, family, compressor, &seq, error))
      return false;
   return client_answer_error (c, seq, code, code_name, errmsg, error);
}

#ifdef RELAYBUS_DEBUG
/* Debug builds only: {relaybusDebugInternal: {<command with $db>}, times: N}
 * holds the client's request, sends the inner command N times on the
 * upstream connection as the proxy's own requests (pipelined), and answers
 * {ok: 1, replies: [...]} once all replies are in.  It exercises exactly
 * the mechanism injection uses (hold, send internal, answer) and serves as
 * its worked example. */
typedef struct {
   uint64_t seq;      /* the held client request */
   int pending;       /* internal replies still to come */
   bson_t replies;    /* array being built */
   uint32_t nreplies;
   bool failed;
} debug_internal_t;

static void
debug_internal_cb (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   debug_internal_t *d = ctx;
   bson_error_t answer_error;
   char idx[16];
   const char *key;

   d->pending--;
   if (!reply) {
      /* Connection closed: nothing to answer, just release. */
      d->failed = true;
   } else {
      bson_uint32_to_string (d->nreplies++, &key, idx, sizeof idx);
      BSON_APPEND_DOCUMENT (&d->replies, key, &reply->body);
   }
   if (d->pending > 0)
      return;
   if (!d->failed) {
      bson_t doc = BSON_INITIALIZER;
      BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
      BSON_APPEND_ARRAY (&doc, "replies", &d->replies);
      if (!client_answer (c, d->seq, &doc, &answer_error))
         client_disconnect (c, STATS_CLOSE_INTERNAL, "debug internal answer: %s", answer_error.message);
      bson_destroy (&doc);
   }
   bson_destroy (&d->replies);
   bson_free (d);
}

static bool
debug_internal (client_conn_t *c, struct evbuffer *src, size_t len, const wire_msg_t *msg, int compressor, bson_error_t *error)
{
   bson_iter_t it;
   bson_t inner;
   const uint8_t *data;
   uint32_t dlen;
   int times = 1;
   debug_internal_t *d;
   bool ok = false;

   if (bson_iter_init_find (&it, &msg->body, "times") && BSON_ITER_HOLDS_NUMBER (&it))
      times = (int) bson_iter_as_int64 (&it);
   if (!bson_iter_init_find (&it, &msg->body, "relaybusDebugInternal") || !BSON_ITER_HOLDS_DOCUMENT (&it) || times < 1 ||
       times > 8)
      return answer_locally (c, msg->header.request_id, WIRE_OP_MSG, compressor, 2, "BadValue",
                             "relaybusDebugInternal wants a command document and times in [1, 8]", src, len, error);
   bson_iter_document (&it, &dlen, &data);
   if (!bson_init_static (&inner, data, dlen))
      return false;
   d = bson_malloc0 (sizeof *d);
   bson_init (&d->replies);
   if (!client_hold_request (c, msg->header.request_id, WIRE_OP_MSG, compressor, &d->seq, error))
      goto done;
   for (int i = 0; i < times; i++) {
      if (!client_send_internal (c, &inner, NULL, 0, debug_internal_cb, d, error)) {
         /* Requests already sent will still call back; let them free d. */
         if (d->pending > 0) {
            d->failed = true;
            d = NULL;
         }
         goto done;
      }
      d->pending++;
   }
   d = NULL; /* owned by the callbacks now */
   ok = true;
done:
   evbuffer_drain (src, len);
   if (d) {
      bson_destroy (&d->replies);
      bson_free (d);
   }
   return ok;
}
#endif

/* The routing decision for one parsed OP_MSG.  This is where injection
 * (annotated statements) and virtual commands hook in: either may hold the
 * request (client_hold_request), send its own traffic
 * (client_send_internal) and answer later (client_answer). */
static bool
route_msg (client_conn_t *c, struct evbuffer *src, size_t len, const wire_msg_t *msg, int compressor, bson_error_t *error)
{
   const char *cmd = msg->command; /* from the validation pass */
   bool more = (msg->flags & WIRE_MSG_MORE_TO_COME) != 0;

   if (!more && handshake_is_hello (cmd))
      return forward_hello (c, src, len, msg->header.request_id, WIRE_OP_MSG, &msg->body, error);
#ifdef RELAYBUS_DEBUG
   if (!more && cmd && strcmp (cmd, "relaybusDebugInternal") == 0)
      return debug_internal (c, src, len, msg, compressor, error);
#endif
   if (c->loop->hook) {
      switch (c->loop->hook (c, msg, cmd, compressor, c->loop->hook_ctx, error)) {
      case CLIENT_ROUTE_FORWARD:
         break;
      case CLIENT_ROUTE_HELD:
         if (c->state != CLIENT_STATE_CLOSING)
            evbuffer_drain (src, len);
         return c->state != CLIENT_STATE_CLOSING;
      case CLIENT_ROUTE_ERROR:
      default:
         return false;
      }
   }
   if (cmd && cmd[0] == 'r' && strncmp (cmd, "relaybus", 8) == 0) {
      char errmsg[160];
      /* Virtual commands are never forwarded; none is implemented yet. */
      if (more) {
         evbuffer_drain (src, len);
         return true;
      }
      bson_snprintf (errmsg, sizeof errmsg, "no such command: '%s'", cmd);
      return answer_locally (c, msg->header.request_id, WIRE_OP_MSG, compressor, 59, "CommandNotFound", errmsg, src, len, error);
   }
   return forward_request (c, src, len, msg, cmd, compressor, error);
}

/* OP_QUERY: only the legacy hello is accepted; anything else gets the
 * error mongod 5.1+ gives, as an OP_REPLY. */
static bool
route_query (client_conn_t *c, struct evbuffer *src, size_t len, const wire_query_t *q, int compressor, bson_error_t *error)
{
   bson_t cmd_doc;
   const char *cmd = NULL;
   const char *dot = strchr (q->full_collection_name, '.');
   char errmsg[200];

   if (handshake_unwrap_query (&q->query, &cmd_doc))
      cmd = wire_command_name (&cmd_doc);
   if (dot && strcmp (dot, ".$cmd") == 0 && handshake_is_hello (cmd))
      return forward_hello (c, src, len, q->header.request_id, WIRE_OP_QUERY, &cmd_doc, error);
   bson_snprintf (errmsg,
                  sizeof errmsg,
                  "Unsupported OP_QUERY command: %s. The client driver may require an upgrade.",
                  cmd ? cmd : "(none)");
   return answer_locally (c, q->header.request_id, WIRE_OP_QUERY, compressor, 352, "UnsupportedOpQueryCommand", errmsg, src, len, error);
}

/* Handles one complete request of `h->length` bytes at the front of the
 * client's input.  Returns false after disconnecting. */
static bool
handle_request (client_conn_t *c, struct evbuffer *in, wire_header_t h)
{
   struct evbuffer *src = in;
   size_t len = (size_t) h.length;
   int compressor = -1;
   const uint8_t *buf;
   bson_error_t error;
   bool ok;

   if (h.opcode == WIRE_OP_COMPRESSED) {
      wire_compressed_t cm;
      uint8_t hb[WIRE_HEADER_LEN];

      buf = evbuffer_pullup (in, (ssize_t) len);
      if (!buf || !wire_parse_compressed (buf, len, &cm, &error))
         goto protocol;
      if (cm.original_opcode != WIRE_OP_MSG && cm.original_opcode != WIRE_OP_QUERY) {
         bson_set_error (&error, WIRE_ERROR_DOMAIN, WIRE_ERR_OPCODE, "OP_COMPRESSED wraps opcode %d", cm.original_opcode);
         goto protocol;
      }
      evbuffer_drain (c->scratch, evbuffer_get_length (c->scratch));
      if (!wire_decompress (&cm, WIRE_MAX_MESSAGE_LEN, c->scratch, &error))
         goto protocol;
      compressor = cm.compressor_id > 0 ? cm.compressor_id : -1;
      evbuffer_drain (in, len);
      stats_add (messages_decompressed, 1);
      src = c->scratch;
      len = evbuffer_get_length (src);
      if (evbuffer_copyout (src, hb, sizeof hb) != (ssize_t) sizeof hb || !wire_peek_header (hb, sizeof hb, &h) ||
          (size_t) h.length != len) {
         bson_set_error (&error, WIRE_ERROR_DOMAIN, WIRE_ERR_COMPRESSION, "decompressed message has a bad header");
         goto protocol;
      }
   }
   buf = evbuffer_pullup (src, (ssize_t) len);
   if (!buf) {
      client_disconnect (c, STATS_CLOSE_INTERNAL, "out of memory");
      return false;
   }
   if (h.opcode == WIRE_OP_MSG) {
      wire_msg_t msg;
      if (!wire_parse_msg (buf, len, &msg, &error))
         goto protocol;
      ok = route_msg (c, src, len, &msg, compressor, &error);
   } else if (h.opcode == WIRE_OP_QUERY) {
      wire_query_t q;
      if (!wire_parse_query (buf, len, &q, &error))
         goto protocol;
      ok = route_query (c, src, len, &q, compressor, &error);
   } else {
      bson_set_error (&error, WIRE_ERROR_DOMAIN, WIRE_ERR_OPCODE, "clients may not send %s", wire_opcode_name (h.opcode));
      goto protocol;
   }
   if (!ok && c->state != CLIENT_STATE_CLOSING)
      client_disconnect (c, STATS_CLOSE_INTERNAL, "request %d: %s", h.request_id, error.message);
   return ok && c->state != CLIENT_STATE_CLOSING;
protocol:
   client_disconnect (c,
                      STATS_CLOSE_CLIENT_PROTOCOL,
                      "bad %s request %d (%d bytes): %s",
                      wire_opcode_name (h.opcode),
                      h.request_id,
                      h.length,
                      error.message);
   return false;
}

/* Reads header by header; handles every complete request while the FIFOs
 * and the upstream's output have room.  Returns whether it took any. */
static bool
client_process (client_conn_t *c)
{
   struct evbuffer *in;
   bool consumed = false;

   if (c->state != CLIENT_STATE_HANDSHAKE && c->state != CLIENT_STATE_READY)
      return false;
   in = bufferevent_get_input (c->bev);
   while (fifo_has_room (c) && evbuffer_get_length (upstream_output (c)) < high_watermark (c)) {
      const uint8_t *hb;
      wire_header_t h;
      bson_error_t error;
      size_t avail = evbuffer_get_length (in);

      if (avail < WIRE_HEADER_LEN)
         break;
      /* No copy when the header is contiguous (the usual case). */
      hb = evbuffer_pullup (in, WIRE_HEADER_LEN);
      if (!hb) {
         client_disconnect (c, STATS_CLOSE_INTERNAL, "out of memory");
         return false;
      }
      (void) wire_peek_header (hb, WIRE_HEADER_LEN, &h);
      if (!wire_check_header (&h, 0, &error)) {
         client_disconnect (c, STATS_CLOSE_CLIENT_PROTOCOL, "bad message header: %s", error.message);
         return false;
      }
      if (avail < (size_t) h.length)
         break;
      consumed = true;
      stats_add (messages_from_clients, 1);
      stats_add (bytes_from_clients, h.length);
      if (!handle_request (c, in, h))
         return false;
   }
   return consumed;
}

/* Everything that may let requests through ends here: process what is
 * complete, then decide what to read next. */
static void
client_pump (client_conn_t *c)
{
   bool consumed = client_process (c);

   if (c->state == CLIENT_STATE_CLOSING)
      return;
   client_update_flow (c);
   message_timer_update (c, c->req_timer, &c->req_timer_armed, c->bev, consumed);
}

/* ------------------------------------------------------------ replies */

static bool
code_is_not_primary (int32_t code)
{
   switch (code) {
   case 10107: /* NotWritablePrimary */
   case 13435: /* NotPrimaryNoSecondaryOk */
   case 13436: /* NotPrimaryOrSecondary */
   case 11600: /* InterruptedAtShutdown */
   case 11602: /* InterruptedDueToReplStateChange */
   case 189:   /* PrimarySteppedDown */
   case 91:    /* ShutdownInProgress */
      return true;
   default:
      return false;
   }
}

/* Scans the top level of a small OP_MSG reply for a "not primary"-class
 * error.  Bounds come from bson_iter; nothing is trusted. */
static bool
reply_is_not_primary (const uint8_t *buf, size_t len)
{
   bson_t body;
   bson_iter_t it;
   uint32_t doc_len;
   bool failed = false, not_primary = false;

   /* header, flags, kind byte 0, document */
   if (len < WIRE_HEADER_LEN + 4 + 1 + 5 || buf[WIRE_HEADER_LEN + 4] != 0)
      return false;
   doc_len = get_le32 (buf + WIRE_HEADER_LEN + 5);
   if (doc_len < 5 || doc_len > len - (WIRE_HEADER_LEN + 5) ||
       !bson_init_static (&body, buf + WIRE_HEADER_LEN + 5, doc_len) || !bson_iter_init (&it, &body))
      return false;
   /* Keys are compared by length first (bson_iter_key_len is cheap): this
    * runs on every reply, and most keys are none of the three. */
   while (bson_iter_next (&it)) {
      const char *key = bson_iter_key (&it);
      uint32_t klen = bson_iter_key_len (&it);
      if (klen == 2 && memcmp (key, "ok", 2) == 0) {
         failed = bson_iter_as_double (&it) == 0.0;
         if (!failed)
            return false; /* {ok: 1}: whatever else it says */
      } else if (klen == 4 && memcmp (key, "code", 4) == 0 && BSON_ITER_HOLDS_NUMBER (&it)) {
         not_primary |= code_is_not_primary ((int32_t) bson_iter_as_int64 (&it));
      } else if (klen == 6 && memcmp (key, "errmsg", 6) == 0 && BSON_ITER_HOLDS_UTF8 (&it)) {
         const char *m = bson_iter_utf8 (&it, NULL);
         not_primary |= strstr (m, "not master") != NULL || strstr (m, "not primary") != NULL;
      }
   }
   return failed && not_primary;
}

static bool
reply_hello (client_conn_t *c, upstream_req_t *u, client_req_t *r, struct evbuffer *in, size_t len, bson_error_t *error)
{
   const uint8_t *buf = evbuffer_pullup (in, (ssize_t) len);
   wire_msg_t reply;
   bson_t body = BSON_INITIALIZER;
   bool ok = false;

   if (!buf || !wire_parse_msg (buf, len, &reply, error))
      goto done;
   bson_destroy (&body);
   if (!handshake_rewrite_reply (&reply.body, &u->offer, &body, error))
      goto done;
   evbuffer_drain (c->tmp, evbuffer_get_length (c->tmp));
   if (r->family == WIRE_OP_QUERY)
      ok = wire_append_reply (c->tmp, reply.header.request_id, r->client_id, 8 /* AwaitCapable */, &body);
   else
      ok = wire_append_msg (c->tmp, reply.header.request_id, r->client_id, 0, &body, NULL, 0);
   if (!ok) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 5, "hello reply too large");
      goto done;
   }
   evbuffer_drain (in, len);
   stats_add (hellos_rewritten, 1);
   ok = client_deliver (c, r, c->tmp, evbuffer_get_length (c->tmp), KEEP_ID, true, error);
done:
   bson_destroy (&body);
   return ok;
}

/* Handles one complete reply at the front of the upstream's input.
 * Returns false after disconnecting. */
static bool
handle_reply (client_conn_t *c, struct evbuffer *in, const wire_header_t *h)
{
   upstream_req_t *u = &c->upreqs[c->up_head];
   size_t len = (size_t) h->length;
   const uint8_t *pre;
   uint32_t flags;
   bool more, first;
   bson_error_t error;
   client_req_t *r = NULL;

   if (h->opcode != WIRE_OP_MSG) {
      bson_set_error (&error, WIRE_ERROR_DOMAIN, WIRE_ERR_OPCODE, "unexpected %s", wire_opcode_name (h->opcode));
      goto protocol;
   }
   if (h->response_to != u->expect_response_to) {
      bson_set_error (&error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_SHORT,
                      "reply responds to %d, expected %d",
                      h->response_to,
                      u->expect_response_to);
      goto protocol;
   }
   if (len < WIRE_HEADER_LEN + 4) {
      bson_set_error (&error, WIRE_ERROR_DOMAIN, WIRE_ERR_SHORT, "OP_MSG reply of %zu bytes", len);
      goto protocol;
   }
   /* The header and the flags, without a copy when contiguous. */
   pre = evbuffer_pullup (in, WIRE_HEADER_LEN + 4);
   if (!pre) {
      bson_set_error (&error, CLIENT_ERROR_DOMAIN, 2, "out of memory reading a reply");
      goto internal;
   }
   flags = get_le32 (pre + WIRE_HEADER_LEN);
   more = (flags & WIRE_MSG_MORE_TO_COME) != 0;
   first = u->expect_response_to == u->upstream_id;

   if (u->kind == UPREQ_INTERNAL) {
      wire_msg_t reply;
      upstream_req_t done = *u;
      const uint8_t *buf = evbuffer_pullup (in, (ssize_t) len);

      if (!buf || !wire_parse_msg (buf, len, &reply, &error))
         goto protocol;
      /* Internal requests never allow exhaust: one reply ends them. */
      upreq_pop (c);
      done.cb (c, &reply, NULL, done.cb_ctx);
      if (c->state == CLIENT_STATE_CLOSING)
         return false;
      evbuffer_drain (in, len);
      return true;
   }

   r = creq_find (c, u->creq_seq);
   if (!r) {
      client_disconnect (c, STATS_CLOSE_INTERNAL, "reply %d matches no client request", h->request_id);
      return false;
   }
   if (u->kind == UPREQ_HELLO) {
      if (more) {
         bson_set_error (&error, WIRE_ERROR_DOMAIN, WIRE_ERR_FLAGS, "hello reply with moreToCome");
         goto protocol;
      }
      upstream_req_t cur = *u;
      upreq_pop (c);
      if (!reply_hello (c, &cur, r, in, len, &error)) {
         if (c->state != CLIENT_STATE_CLOSING)
            client_disconnect (c, STATS_CLOSE_UPSTREAM_PROTOCOL, "hello reply: %s", error.message);
         return false;
      }
      if (c->state == CLIENT_STATE_HANDSHAKE) {
         log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "handshake done via %s, compressor %s", upstream_name (c->up),
                   c->compressor > 0 ? compress_name (c->compressor) : "none");
         client_set_state (c, CLIENT_STATE_READY);
      }
      return true;
   }

   /* RELAY */
   if (len <= CLIENT_SCAN_LIMIT) {
      const uint8_t *buf = evbuffer_pullup (in, (ssize_t) len);
      if (buf && reply_is_not_primary (buf, len)) {
         stats_add (not_primary_errors, 1);
         log_conn (LOG_LEVEL_INFO, c->id, c->peer, "relaying a not-primary error from %s; re-learning the primary", upstream_name (c->up));
         topology_request_refresh (c->loop->topo, "not-primary error relayed");
      }
   }
   if (flags & WIRE_MSG_CHECKSUM_PRESENT) {
      /* Our header change would break the CRC: re-encode without it. */
      wire_msg_t reply;
      const uint8_t *buf = evbuffer_pullup (in, (ssize_t) len);
      if (!buf || !wire_parse_msg (buf, len, &reply, &error))
         goto protocol;
      evbuffer_drain (c->tmp, evbuffer_get_length (c->tmp));
      if (!wire_append_msg (c->tmp,
                            reply.header.request_id,
                            first ? r->client_id : reply.header.response_to,
                            flags & ~WIRE_MSG_CHECKSUM_PRESENT,
                            &reply.body,
                            reply.sequences,
                            reply.nsequences)) {
         bson_set_error (&error, CLIENT_ERROR_DOMAIN, 5, "reply too large");
         goto protocol;
      }
      evbuffer_drain (in, len);
      if (!client_deliver (c, r, c->tmp, evbuffer_get_length (c->tmp), KEEP_ID, !more, &error))
         goto internal;
   } else if (!client_deliver (c, r, in, len, first ? (int64_t) r->client_id : KEEP_ID, !more, &error)) {
      goto internal;
   }
   /* Exhaust: the next reply responds to this one, and the client request
    * stays open until a reply without moreToCome. */
   if (more)
      u->expect_response_to = h->request_id;
   else
      upreq_pop (c);
   return true;

protocol:
   client_disconnect (c,
                      STATS_CLOSE_UPSTREAM_PROTOCOL,
                      "bad reply %d from %s: %s",
                      h->request_id,
                      upstream_name (c->up),
                      error.message);
   return false;
internal:
   client_disconnect (c, STATS_CLOSE_INTERNAL, "relaying reply %d: %s", h->request_id, error.message);
   return false;
}

/* Handles every complete reply while the client's output has room.
 * Returns whether it took any. */
static bool
upstream_process (client_conn_t *c)
{
   struct bufferevent *ubev;
   struct evbuffer *in;
   bool consumed = false;

   if (c->state == CLIENT_STATE_CLOSING || !upstream_is_connected (c->up))
      return false;
   ubev = upstream_bev (c->up);
   in = bufferevent_get_input (ubev);
   while (evbuffer_get_length (client_output (c)) < high_watermark (c)) {
      const uint8_t *hb;
      wire_header_t h;
      bson_error_t error;
      size_t avail = evbuffer_get_length (in);

      if (avail < WIRE_HEADER_LEN)
         break;
      hb = evbuffer_pullup (in, WIRE_HEADER_LEN);
      if (!hb) {
         client_disconnect (c, STATS_CLOSE_INTERNAL, "out of memory");
         return false;
      }
      (void) wire_peek_header (hb, WIRE_HEADER_LEN, &h);
      if (!wire_check_header (&h, 0, &error)) {
         client_disconnect (c, STATS_CLOSE_UPSTREAM_PROTOCOL, "bad reply header from %s: %s", upstream_name (c->up), error.message);
         return false;
      }
      if (avail < (size_t) h.length)
         break;
      if (c->up_count == 0) {
         client_disconnect (c, STATS_CLOSE_UPSTREAM_PROTOCOL, "unsolicited %s %d from %s", wire_opcode_name (h.opcode), h.request_id, upstream_name (c->up));
         return false;
      }
      consumed = true;
      stats_add (messages_from_upstream, 1);
      stats_add (bytes_from_upstream, h.length);
      if (!handle_reply (c, in, &h))
         return false;
   }
   return consumed;
}

/* Everything that may let replies through ends here, like client_pump. */
static void
upstream_pump (client_conn_t *c)
{
   uint32_t before = creq_count (c);
   bool consumed = upstream_process (c);

   if (c->state == CLIENT_STATE_CLOSING)
      return;
   client_check_drained (c);
   if (c->state == CLIENT_STATE_CLOSING)
      return;
   /* Answers freed FIFO room: requests may be waiting in the input
    * (client_pump updates the flow); else only the flow may change. */
   if (creq_count (c) < before)
      client_pump (c);
   else
      client_update_flow (c);
   if (c->state == CLIENT_STATE_CLOSING || !upstream_is_connected (c->up))
      return;
   message_timer_update (c, c->reply_timer, &c->reply_timer_armed, upstream_bev (c->up), consumed);
}

/* ------------------------------------------------------------ callbacks */

static void
client_read_cb (struct bufferevent *bev, void *arg)
{
   client_pump (arg);
}

static void
client_write_cb (struct bufferevent *bev, void *arg)
{
   client_conn_t *c = arg;

   /* The client's output fell to high/2: replies may flow again. */
   upstream_pump (c);
}

static void
client_event_cb (struct bufferevent *bev, short what, void *arg)
{
   client_conn_t *c = arg;
   unsigned long ssl_err = 0, e;

   if (what & BEV_EVENT_CONNECTED)
      return;
   if (what & BEV_EVENT_EOF) {
      size_t partial = evbuffer_get_length (bufferevent_get_input (bev));
      if (partial > 0)
         /* Bytes left over are a message the client never finished. */
         client_disconnect (c,
                            STATS_CLOSE_CLIENT_EOF,
                            "client closed the connection in the middle of a message (%zu bytes of a partial message buffered)",
                            partial);
      else
         client_disconnect (c, STATS_CLOSE_CLIENT_EOF, "client closed the connection");
      return;
   }
   while ((e = bufferevent_get_openssl_error (bev)) != 0)
      ssl_err = e;
   if (ssl_err) {
      char buf[200];
      ERR_error_string_n (ssl_err, buf, sizeof buf);
      client_disconnect (c, STATS_CLOSE_CLIENT_ERROR, "TLS: %s", buf);
   } else {
      client_disconnect (c,
                         STATS_CLOSE_CLIENT_ERROR,
                         "%s",
                         EVUTIL_SOCKET_ERROR () ? evutil_socket_error_to_string (EVUTIL_SOCKET_ERROR ()) : "connection error");
   }
}

static void
up_event (void *owner, upstream_event_t ev, const char *detail)
{
   client_conn_t *c = owner;

   switch (ev) {
   case UPSTREAM_EVENT_CONNECTED:
      log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "paired with upstream %s", detail);
      bufferevent_setwatermark (upstream_bev (c->up), EV_WRITE, high_watermark (c) / 2, 0);
      client_set_state (c, CLIENT_STATE_HANDSHAKE);
      client_pump (c);
      break;
   case UPSTREAM_EVENT_CONNECT_FAILED:
      topology_request_refresh (c->loop->topo, "upstream connect failed");
      client_disconnect (c, STATS_CLOSE_UPSTREAM_CONNECT, "cannot connect to %s: %s", upstream_name (c->up), detail);
      break;
   case UPSTREAM_EVENT_EOF:
   case UPSTREAM_EVENT_ERROR:
      /* A primary that goes away is often a failover in progress. */
      topology_request_refresh (c->loop->topo, "upstream connection lost");
      client_disconnect (c,
                         ev == UPSTREAM_EVENT_EOF ? STATS_CLOSE_UPSTREAM_EOF : STATS_CLOSE_UPSTREAM_ERROR,
                         "upstream %s: %s (%u requests in flight)",
                         upstream_name (c->up),
                         detail,
                         (unsigned) c->up_count);
      break;
   }
}

static void
up_read (void *owner)
{
   upstream_pump (owner);
}

static void
up_drained (void *owner)
{
   /* The upstream's output fell to high/2: requests may flow again. */
   client_pump (owner);
}

static const upstream_callbacks_t client_upstream_callbacks = {
   .on_event = up_event,
   .on_read = up_read,
   .on_drained = up_drained,
};

static void
client_timer_cb (evutil_socket_t fd, short what, void *arg)
{
   client_conn_t *c = arg;

   switch (c->state) {
   case CLIENT_STATE_AWAIT_UPSTREAM:
      if (!c->up) {
         topology_primary_t p;
         topology_get_primary (c->loop->topo, &p);
         client_disconnect (c,
                            STATS_CLOSE_NO_PRIMARY,
                            "no primary within upstream_connect_timeout_ms=%" PRId64 " (%s)",
                            c->cfg->upstream_connect_timeout_ms,
                            p.last_error[0] ? p.last_error : topology_state_name (p.state));
      } else {
         topology_request_refresh (c->loop->topo, "upstream connect timed out");
         client_disconnect (c,
                            STATS_CLOSE_UPSTREAM_CONNECT,
                            "connect to %s timed out after %" PRId64 " ms",
                            upstream_name (c->up),
                            c->cfg->upstream_connect_timeout_ms);
      }
      break;
   case CLIENT_STATE_HANDSHAKE:
      client_disconnect (c,
                         STATS_CLOSE_HANDSHAKE_TIMEOUT,
                         "no hello answered within handshake_timeout_ms=%" PRId64,
                         c->cfg->handshake_timeout_ms);
      break;
   default:
      break;
   }
}

static void
client_req_timer_cb (evutil_socket_t fd, short what, void *arg)
{
   client_conn_t *c = arg;

   c->req_timer_armed = false;
   client_disconnect (c,
                      STATS_CLOSE_MESSAGE_TIMEOUT,
                      "partial request (%zu bytes buffered) stalled for message_timeout_ms=%" PRId64,
                      evbuffer_get_length (bufferevent_get_input (c->bev)),
                      c->cfg->message_timeout_ms);
}

static void
client_reply_timer_cb (evutil_socket_t fd, short what, void *arg)
{
   client_conn_t *c = arg;

   c->reply_timer_armed = false;
   client_disconnect (c,
                      STATS_CLOSE_MESSAGE_TIMEOUT,
                      "partial reply from %s stalled for message_timeout_ms=%" PRId64,
                      upstream_name (c->up),
                      c->cfg->message_timeout_ms);
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
   c->up = upstream_new (c->loop->base, &p, c->loop->tls, &client_upstream_callbacks, c, &error);
   if (!c->up) {
      topology_request_refresh (c->loop->topo, "upstream connect failed");
      client_disconnect (c, STATS_CLOSE_UPSTREAM_CONNECT, "%s", error.message);
   }
}

static void
format_peer (const struct sockaddr *sa, int len, char *out, size_t outlen)
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
   client_conn_t *c = bson_malloc0 (sizeof *c);
   const int opts = BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS;

   c->id = ++loop->next_conn_id;
   c->loop = loop;
   c->cfg = config_retain (loop->cfg);
   c->compressor = -1;
   format_peer (addr, addr_len, c->peer, sizeof c->peer);
   if (addr->sa_family == AF_INET || addr->sa_family == AF_INET6) {
      int one = 1;
      (void) setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
   }
   if (server_tls) {
      SSL *ssl = SSL_new (server_tls);
      if (ssl) {
         c->bev = bufferevent_openssl_socket_new (loop->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, opts);
         if (c->bev)
            bufferevent_openssl_set_allow_dirty_shutdown (c->bev, 1);
         else
            SSL_free (ssl);
      }
   } else {
      c->bev = bufferevent_socket_new (loop->base, fd, opts);
   }
   c->scratch = evbuffer_new ();
   c->tmp = evbuffer_new ();
   c->timer = evtimer_new (loop->base, client_timer_cb, c);
   c->req_timer = evtimer_new (loop->base, client_req_timer_cb, c);
   c->reply_timer = evtimer_new (loop->base, client_reply_timer_cb, c);
   if (!c->bev || !c->scratch || !c->tmp || !c->timer || !c->req_timer || !c->reply_timer) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 7, "out of memory accepting a connection");
      if (c->bev)
         bufferevent_free (c->bev);
      else
         evutil_closesocket (fd);
      if (c->timer)
         event_free (c->timer);
      if (c->req_timer)
         event_free (c->req_timer);
      if (c->reply_timer)
         event_free (c->reply_timer);
      client_free (c);
      return false;
   }
   /* client_update_flow installs client_write_cb when it is needed. */
   bufferevent_setcb (c->bev, client_read_cb, NULL, client_event_cb, c);
   bufferevent_setwatermark (c->bev, EV_WRITE, high_watermark (c) / 2, 0);
   /* Writing is always on; reading is decided by client_update_flow. */
   bufferevent_enable (c->bev, EV_WRITE);
   bufferevent_disable (c->bev, EV_READ);

   c->next = loop->clients;
   if (loop->clients)
      loop->clients->prev = c;
   loop->clients = c;
   loop->nclients++;
   stats_add (connections_open, 1);
   log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "accepted (%zu open)", loop->nclients);

   /* AWAIT_UPSTREAM is 0, the zeroed state: arm its timer explicitly. */
   c->state = CLIENT_STATE_COUNT_;
   client_set_state (c, CLIENT_STATE_AWAIT_UPSTREAM);
   client_try_connect (c);
   return true;
}

/* ------------------------------------------------------------ drain */

static void
client_check_drained (client_conn_t *c)
{
   if (c->state != CLIENT_STATE_DRAINING)
      return;
   if (creq_count (c) == 0 && c->up_count == 0 && evbuffer_get_length (client_output (c)) == 0)
      client_disconnect (c, STATS_CLOSE_SHUTDOWN, "drained");
   else if (creq_count (c) == 0 && c->up_count == 0)
      /* Output still flushing: ask for the write callback at empty. */
      bufferevent_setwatermark (c->bev, EV_WRITE, 0, 0);
}

static void
client_loop_drain_timeout_cb (evutil_socket_t fd, short what, void *arg)
{
   client_loop_t *loop = arg;

   log_warn ("drain timeout: closing %zu connections still busy", loop->nclients);
   while (loop->clients)
      client_disconnect (loop->clients, STATS_CLOSE_SHUTDOWN_TIMEOUT, "still busy when drain_timeout_ms ran out");
}

void
client_loop_drain (client_loop_t *loop, int64_t timeout_ms, void (*on_empty) (void *), void *ctx)
{
   client_conn_t *c, *next;
   struct timeval tv = ms_to_tv (timeout_ms);

   loop->draining = true;
   loop->on_empty = on_empty;
   loop->on_empty_ctx = ctx;
   log_info ("draining %zu connections (up to %" PRId64 " ms)", loop->nclients, timeout_ms);
   for (c = loop->clients; c; c = next) {
      next = c->next;
      if (c->state == CLIENT_STATE_AWAIT_UPSTREAM || (creq_count (c) == 0 && c->up_count == 0 &&
                                                      evbuffer_get_length (client_output (c)) == 0)) {
         client_disconnect (c, STATS_CLOSE_SHUTDOWN, "shutting down");
         continue;
      }
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

/* ------------------------------------------------------------ loop */

client_loop_t *
client_loop_new (struct event_base *base, topology_t *topo, tls_upstream_t *tls, config_t *cfg, bson_error_t *error)
{
   client_loop_t *loop = bson_malloc0 (sizeof *loop);

   loop->base = base;
   loop->topo = topo;
   loop->tls = tls;
   loop->cfg = config_retain (cfg);
   loop->free_ev = event_new (base, -1, 0, client_loop_free_cb, loop);
   loop->drain_timer = evtimer_new (base, client_loop_drain_timeout_cb, loop);
   if (!loop->free_ev || !loop->drain_timer) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, 7, "out of memory");
      client_loop_destroy (loop);
      return NULL;
   }
   return loop;
}

void
client_loop_set_config (client_loop_t *loop, config_t *cfg)
{
   config_t *old = loop->cfg;
   loop->cfg = config_retain (cfg);
   config_release (old);
}

void
client_loop_topology_changed (client_loop_t *loop)
{
   client_conn_t *c, *next;

   for (c = loop->clients; c; c = next) {
      next = c->next;
      if (c->state == CLIENT_STATE_AWAIT_UPSTREAM && c->waiting_primary)
         client_try_connect (c);
   }
}

size_t
client_loop_count (const client_loop_t *loop)
{
   return loop->nclients;
}

void
client_loop_destroy (client_loop_t *loop)
{
   if (!loop)
      return;
   loop->on_empty = NULL;
   while (loop->clients)
      client_disconnect (loop->clients, STATS_CLOSE_SHUTDOWN, "proxy stopping");
   client_loop_free_cb (-1, 0, loop);
   if (loop->free_ev)
      event_free (loop->free_ev);
   if (loop->drain_timer)
      event_free (loop->drain_timer);
   config_release (loop->cfg);
   bson_free (loop);
}

/* ------------------------------------------------------------ accessors */

void
client_loop_set_request_hook (client_loop_t *loop, client_request_hook_t hook, void *ctx)
{
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
