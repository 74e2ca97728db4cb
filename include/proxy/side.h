/*
 * proxy/side.h - one socket side of a client connection.
 *
 * Thread: forwarding loop.
 *
 * A side is one socket of a client connection, the accepted client socket
 * or the upstream connection to the primary, both served by the same type
 * (as PgBouncer's SBuf serves clients and servers): a bufferevent, plain or
 * OpenSSL, with what the connection decides about it (whether it is read,
 * whether its drain callback is wanted, the write low watermark) and the
 * timer that limits how long a partial message may stall.  A connection
 * embeds two sides (proxy/conn_private.h) and gets every event of both
 * through one table of callbacks that tells them apart by side_kind_t.
 *
 * What a side does not do: framing, matching, flow decisions, memory
 * accounting (proxy/pump.c and proxy/conn.c), or freeing its owner.
 *
 * Plain sockets are read and written by the side itself rather than by the
 * bufferevent: reads by its own read event (no FIONREAD ioctl before each
 * read, as a socket bufferevent does), writes straight from the pump that
 * filled the output (side_flush), leaving EV_WRITE to libevent only when
 * the socket does not take everything at once.  TLS sides are read and
 * written by their OpenSSL bufferevent, with deferred callbacks (it may
 * call back from inside our own buffer operations).
 */
#ifndef RELAYBUS_PROXY_SIDE_H
#define RELAYBUS_PROXY_SIDE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <openssl/ssl.h>

#include "proxy/tls.h"
#include "base/topology.h"
#include "base/errors.h"

/* Errors of side_accept and side_connect (SIDE_ERROR_DOMAIN). */
typedef enum {
   SIDE_ERR_NO_MEMORY = 1, /* a bufferevent, an event or a timer could not be created */
   SIDE_ERR_CONNECT,       /* connect() failed at once (the message has errno's text) */
} side_error_t;

/* Which end of the connection a side is. */
typedef enum {
   SIDE_CLIENT = 0, /* the accepted socket: connected from the start */
   SIDE_UPSTREAM,   /* the connection to the primary: connects first */
} side_kind_t;

/* What a side reports through on_event. */
typedef enum {
   SIDE_EVENT_CONNECTED,      /* an upstream's TCP (and TLS) connect finished */
   SIDE_EVENT_CONNECT_FAILED, /* an upstream never got there */
   SIDE_EVENT_EOF,            /* the peer closed */
   SIDE_EVENT_ERROR,          /* socket or TLS error on an established side */
} side_event_t;

typedef struct side side_t;

/* The owner's hooks, for both sides of a connection; all run on the loop
 * and may close the side (side_close) and free nothing else of it. */
typedef struct {
   void (*on_read) (side_t *s);    /* bytes arrived in the input */
   void (*on_drained) (side_t *s); /* the output fell to the low watermark (side_want_drained) */
   /* `detail` is for the log line (NULL for CONNECTED and EOF). */
   void (*on_event) (side_t *s, side_event_t ev, const char *detail);
   void (*on_timeout) (side_t *s); /* a partial message stalled (side_timer_update) */
} side_callbacks_t;

/* Embedded in its owner (zeroed there); owns its bufferevent (which owns
 * the socket and the SSL), its read event and its timer, all freed by
 * side_close.  The fields are read by proxy/conn.c and proxy/pump.c and
 * written through the functions below, but for the mem_* fields, which
 * belong to proxy/conn.c's memory bound. */
struct side {
   side_kind_t kind;
   bool connected;   /* an upstream's connect finished; a client's is always */
   bool tls;         /* an OpenSSL bufferevent */
   bool opening;     /* inside side_connect: events are the return value's */
   bool direct;      /* plain and connected: rd reads, side_flush writes */
   bool reading;     /* direct: rd is added */
   bool drained_cb;  /* the write callback (on_drained) is installed */
   bool timer_armed; /* timer is pending (saves event_del calls) */
   bool libevent_writes; /* direct: EV_WRITE is on, libevent drains the output */
   evutil_socket_t fd; /* the socket, for reads and writes (bufferevent_getfd is a ctrl call) */
   struct bufferevent *bev;
   /* bev's input and output, which live as long as it: looked up once, not
    * by a call into libevent each of the dozen times a request asks. */
   struct evbuffer *input, *output;
   struct event *rd;    /* direct sides' read event; NULL for TLS */
   struct event *timer; /* the partial-message timer */
   const side_callbacks_t *cb;
   void *owner;

   /* proxy/conn.c's memory bound: what is reserved for the rest of the
    * partial message in the input, and the callbacks that count the
    * input's and output's bytes of a TLS side (and of a plain one until it
    * goes direct).  A direct side is counted without them, by its lengths
    * (conn.c's mem_sync_side): mem_read is what the side read itself since
    * it was last counted (the only way its input grows), mem_in_seen and
    * mem_out_seen the lengths counted. */
   int64_t mem_partial;
   struct evbuffer_cb_entry *mem_cb_in, *mem_cb_out;
   int64_t mem_read;
   size_t mem_in_seen, mem_out_seen;
};

/* Takes over an accepted socket as a SIDE_CLIENT side, TLS when
 * `server_tls` is not NULL (the handshake runs inside the bufferevent).
 * `inet`: a TCP socket (TCP_NODELAY is set).  Not read until
 * side_set_reading.  On failure the socket is closed and nothing is left
 * to free. */
bool side_accept (side_t *s,
                  struct event_base *base,
                  evutil_socket_t fd,
                  bool inet,
                  SSL_CTX *server_tls,
                  const side_callbacks_t *cb,
                  void *owner,
                  bson_error_t *error) __attribute__ ((warn_unused_result));

/* Starts a non-blocking connect to `primary` (a numeric address: no DNS)
 * as a SIDE_UPSTREAM side, TLS when `tls` is not NULL: then CONNECTED comes
 * after the TLS handshake, and certificate or host name failures are a
 * CONNECT_FAILED with OpenSSL's reason.  On failure nothing is left to
 * free. */
bool side_connect (side_t *s,
                   struct event_base *base,
                   const topology_primary_t *primary,
                   tls_upstream_t *tls,
                   const side_callbacks_t *cb,
                   void *owner,
                   bson_error_t *error) __attribute__ ((warn_unused_result));

/* A connected plain side is read by its own event and written by
 * side_flush from now on; reading is off until side_set_reading.  No-op
 * for TLS.  False: out of memory. */
bool side_go_direct (side_t *s, struct event_base *base) __attribute__ ((warn_unused_result));

/* The write low watermark: on_drained fires when the output falls to it. */
void side_set_write_low (side_t *s, size_t low);

/* Frees the read event, the timer and the bufferevent (closing the
 * socket): no callback fires afterwards.  Idempotent. */
void side_close (side_t *s);

/* libevent's frees do not take NULL; these do (for every proxy module). */
static inline void
proxy_event_free (struct event *ev)
{
   if (ev)
      event_free (ev);
}

static inline void
proxy_evbuffer_free (struct evbuffer *buf)
{
   if (buf)
      evbuffer_free (buf);
}

static inline bool
side_is_open (const side_t *s)
{
   return s->bev != NULL;
}

static inline struct evbuffer *
side_input (const side_t *s)
{
   return s->input;
}

static inline struct evbuffer *
side_output (const side_t *s)
{
   return s->output;
}

static inline bool
side_is_reading (const side_t *s)
{
   return s->rd ? s->reading : (bufferevent_get_enabled (s->bev) & EV_READ) != 0;
}

/* Turns reading on or off; libevent is touched only when that changes
 * (bufferevent_enable re-adds the read event even when it is on). */
void side_set_reading_slow (side_t *s, bool on);
static inline void
side_set_reading (side_t *s, bool on)
{
   if (on != side_is_reading (s))
      side_set_reading_slow (s, on);
}

/* Installs on_drained or removes it, only when that changes: libevent
 * schedules the write callback after nearly every write while it is set. */
void side_want_drained_slow (side_t *s, bool want);
static inline void
side_want_drained (side_t *s, bool want)
{
   if (want != s->drained_cb)
      side_want_drained_slow (s, want);
}

/* Writes what a direct side's output holds, now (see the top of this
 * file), and returns the length it has left (from what the write took:
 * the caller that counts the output needs no second read of it).  Only
 * for a direct side; side_flush is a no-op for TLS, which libevent writes
 * on its write event. */
size_t side_write_now (side_t *s);
static inline void
side_flush (side_t *s)
{
   if (s->direct)
      (void) side_write_now (s);
}

/* A partial message in the input may wait at most `timeout_ms` (0: no
 * limit), counted from when it began to be waited for (`consumed`: a
 * message was just taken, so what is left began now), and only while the
 * side is read (a stall of our own backpressure is not the peer's fault).
 * The timer is touched only when a message is really partial or it was
 * armed: whole messages, the usual case, cost no event_add/event_del.
 * `in_len` is the input's length now (the owner counted it where its pump
 * ended: no second read). */
void side_timer_rearm (side_t *s, int64_t timeout_ms, bool partial);
static inline void
side_timer_update (side_t *s, int64_t timeout_ms, bool consumed, size_t in_len)
{
   bool partial = timeout_ms > 0 && in_len > 0 && side_is_reading (s);

   if (s->timer_armed ? consumed || !partial : partial)
      side_timer_rearm (s, timeout_ms, partial);
}

#endif /* RELAYBUS_PROXY_SIDE_H */
