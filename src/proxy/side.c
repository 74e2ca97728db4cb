/*
 * proxy/side.c - one socket side of a client connection (proxy/side.h):
 * opening it (accepting, or connecting to the primary), reading and
 * writing a plain socket directly, the partial-message timer, and turning
 * libevent's callbacks into the owner's.
 *
 * An upstream's address is numeric (resolved by the topology worker), so
 * bufferevent_socket_connect never needs DNS.  With TLS its bufferevent is
 * an OpenSSL socket bufferevent in connecting mode: CONNECTED arrives after
 * the TLS handshake, so the owner never writes into a half-open session.
 */
#include "proxy/side.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>

#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>

#include "base/assert.h"
#include "base/clock.h"

/* At most this much per read, as evbuffer_read too: a bigger message
 * takes several loop turns, which keeps one connection from starving the
 * others. */
#define SIDE_READ_CHUNK 4096

static void side_bev_read_cb (struct bufferevent *bev, void *arg);
static void side_bev_write_cb (struct bufferevent *bev, void *arg);
static void side_bev_event_cb (struct bufferevent *bev, short what, void *arg);

/* TCP_NODELAY: requests and replies are small and latency-bound. */
static void
side_nodelay (evutil_socket_t fd)
{
   int one = 1;

   if (fd >= 0)
      (void) setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Why a side failed: OpenSSL's last error on a TLS side, else errno's. */
static const char *
side_error_detail (side_t *s, char *buf, size_t len)
{
   int err = EVUTIL_SOCKET_ERROR ();
   unsigned long ssl_err = 0, e;

   if (s->tls)
      while ((e = bufferevent_get_openssl_error (s->bev)) != 0)
         ssl_err = e;
   if (ssl_err) {
      char tmp[200];
      ERR_error_string_n (ssl_err, tmp, sizeof tmp);
      bson_snprintf (buf, len, "TLS: %s", tmp);
   } else if (err) {
      bson_snprintf (buf, len, "%s", evutil_socket_error_to_string (err));
   } else {
      bson_snprintf (buf, len, "connection error");
   }
   return buf;
}

/* ------------------------------------------------------------ callbacks */

static void
side_bev_read_cb (struct bufferevent *bev, void *arg)
{
   side_t *s = arg;
   s->cb->on_read (s);
}

static void
side_bev_write_cb (struct bufferevent *bev, void *arg)
{
   side_t *s = arg;
   s->cb->on_drained (s);
}

static void
side_bev_event_cb (struct bufferevent *bev, short what, void *arg)
{
   side_t *s = arg;
   char detail[256];

   /* Still inside side_connect (a libevent that reports an immediate
    * connect failure without deferring it): its return value says it. */
   if (s->opening)
      return;
   if (what & BEV_EVENT_CONNECTED) {
      /* A client's is the end of its TLS handshake: nothing changes. */
      if (s->connected)
         return;
      s->connected = true;
      s->cb->on_event (s, SIDE_EVENT_CONNECTED, NULL);
   } else if (!s->connected) {
      s->cb->on_event (s, SIDE_EVENT_CONNECT_FAILED, side_error_detail (s, detail, sizeof detail));
   } else if (what & BEV_EVENT_EOF) {
      s->cb->on_event (s, SIDE_EVENT_EOF, NULL);
   } else {
      s->cb->on_event (s, SIDE_EVENT_ERROR, side_error_detail (s, detail, sizeof detail));
   }
}

/* Reads what a direct socket has (up to SIDE_READ_CHUNK) into its
 * bufferevent's input, as the bufferevent would but without asking the
 * kernel first how much there is.  Returns the bytes read, 0 at EOF, -1 on
 * an error (errno; EAGAIN: nothing there).  The input of a socket
 * bufferevent is frozen at its end (only libevent fills it); this unfreezes
 * it around the read, as libevent's read callback does. */
static ssize_t
side_read_now (side_t *s)
{
   struct evbuffer *in = side_input (s);
   struct evbuffer_iovec v;
   ssize_t n;

   evbuffer_unfreeze (in, 0);
   if (evbuffer_reserve_space (in, SIDE_READ_CHUNK, &v, 1) != 1) {
      evbuffer_freeze (in, 0);
      errno = ENOMEM;
      return -1;
   }
   do
      n = recv (s->fd, v.iov_base, v.iov_len, 0);
   while (n < 0 && errno == EINTR);
   if (n > 0) {
      v.iov_len = (size_t) n;
      evbuffer_commit_space (in, &v, 1);
      s->mem_read += n;
   }
   evbuffer_freeze (in, 0);
   return n;
}

/* rd: a direct socket is readable. */
static void
side_sock_read_cb (evutil_socket_t fd, short what, void *arg)
{
   side_t *s = arg;
   ssize_t n = side_read_now (s);
   char detail[256];

   if (n > 0)
      s->cb->on_read (s);
   else if (n == 0)
      s->cb->on_event (s, SIDE_EVENT_EOF, NULL);
   else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      s->cb->on_event (s, SIDE_EVENT_ERROR, side_error_detail (s, detail, sizeof detail));
}

static void
side_timer_cb (evutil_socket_t fd, short what, void *arg)
{
   side_t *s = arg;

   s->timer_armed = false;
   s->cb->on_timeout (s);
}

/* ------------------------------------------------------------ opening */

/* Deferred callbacks are for TLS only, whose bufferevent may call back
 * from inside our own buffer operations.  A socket bufferevent calls back
 * only from its own event callbacks, holding a reference, so ours may run
 * there directly (and may free it): no second loop turn per read. */
static int
side_bev_options (bool tls)
{
   return BEV_OPT_CLOSE_ON_FREE | (tls ? BEV_OPT_DEFER_CALLBACKS : 0);
}

/* The new bufferevent's buffers (side_input, side_output). */
static void
side_take_buffers (side_t *s)
{
   s->input = bufferevent_get_input (s->bev);
   s->output = bufferevent_get_output (s->bev);
}

/* What both kinds share: the callbacks.  The timer is created when a
 * partial message first arms it (side_timer_rearm): most connections
 * never see one.  (False: out of memory.) */
static bool
side_init (side_t *s, side_kind_t kind, struct event_base *base, const side_callbacks_t *cb, void *owner)
{
   (void) base;
   memset (s, 0, sizeof *s);
   s->kind = kind;
   s->fd = -1;
   s->cb = cb;
   s->owner = owner;
   return true;
}

bool
side_accept (side_t *s,
             struct event_base *base,
             evutil_socket_t fd,
             bool inet,
             SSL_CTX *server_tls,
             const side_callbacks_t *cb,
             void *owner,
             bson_error_t *error)
{
   const int opts = side_bev_options (server_tls != NULL);

   if (!side_init (s, SIDE_CLIENT, base, cb, owner))
      goto fail;
   s->connected = true;
   s->tls = server_tls != NULL;
   if (inet)
      side_nodelay (fd);
   if (server_tls) {
      SSL *ssl = SSL_new (server_tls);
      if (ssl) {
         s->bev = bufferevent_openssl_socket_new (base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, opts);
         if (s->bev)
            /* Dirty shutdown of the TLS session is what a killed peer
             * looks like; treat it as EOF rather than an error. */
            bufferevent_openssl_set_allow_dirty_shutdown (s->bev, 1);
         else
            SSL_free (ssl);
      }
   } else {
      s->bev = bufferevent_socket_new (base, fd, opts);
   }
   if (!s->bev)
      goto fail;
   side_take_buffers (s);
   s->fd = fd;
   bufferevent_setcb (s->bev, side_bev_read_cb, NULL, side_bev_event_cb, s);
   if (server_tls) {
      /* Written by libevent, always on: the handshake writes too. */
      bufferevent_enable (s->bev, EV_WRITE);
      bufferevent_disable (s->bev, EV_READ);
      return true;
   }
   if (side_go_direct (s, base))
      return true;
fail:
   if (!s->bev)
      evutil_closesocket (fd);
   side_close (s);
   bson_set_error (error, SIDE_ERROR_DOMAIN, SIDE_ERR_NO_MEMORY, "out of memory accepting a connection");
   return false;
}

bool
side_connect (side_t *s,
              struct event_base *base,
              const topology_primary_t *primary,
              tls_upstream_t *tls,
              const side_callbacks_t *cb,
              void *owner,
              bson_error_t *error)
{
   const int opts = side_bev_options (tls != NULL);
   bool ok = false;

   if (!side_init (s, SIDE_UPSTREAM, base, cb, owner)) {
      bson_set_error (error, SIDE_ERROR_DOMAIN, SIDE_ERR_NO_MEMORY, "out of memory connecting upstream");
      goto done;
   }
   s->tls = tls != NULL;
   if (tls) {
      SSL *ssl = tls_upstream_ssl_new (tls, primary->host, error);
      if (!ssl)
         goto done;
      s->bev = bufferevent_openssl_socket_new (base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, opts);
      if (s->bev)
         bufferevent_openssl_set_allow_dirty_shutdown (s->bev, 1);
      else
         SSL_free (ssl);
   } else {
      s->bev = bufferevent_socket_new (base, -1, opts);
   }
   if (!s->bev) {
      bson_set_error (error, SIDE_ERROR_DOMAIN, SIDE_ERR_NO_MEMORY, "cannot create a bufferevent");
      goto done;
   }
   side_take_buffers (s);
   bufferevent_setcb (s->bev, side_bev_read_cb, NULL, side_bev_event_cb, s);
   s->opening = true;
   if (bufferevent_socket_connect (s->bev, (const struct sockaddr *) &primary->addr, (int) primary->addr_len) < 0) {
      bson_set_error (error,
                      SIDE_ERROR_DOMAIN,
                      SIDE_ERR_CONNECT,
                      "connect to %s:%u: %s",
                      primary->host,
                      (unsigned) primary->port,
                      evutil_socket_error_to_string (EVUTIL_SOCKET_ERROR ()));
      goto done;
   }
   s->fd = bufferevent_getfd (s->bev);
   side_nodelay (s->fd);
   /* The connect itself needs libevent's write event; reading waits for
    * side_go_direct (plain) or the owner's flow decision (TLS). */
   bufferevent_enable (s->bev, EV_READ | EV_WRITE);
   ok = true;
done:
   s->opening = false;
   if (!ok)
      side_close (s);
   return ok;
}

bool
side_go_direct (side_t *s, struct event_base *base)
{
   RELAYBUS_ASSERT (s->connected && !s->rd && !s->direct);
   if (s->tls)
      return true;
   s->rd = event_new (base, s->fd, EV_READ | EV_PERSIST, side_sock_read_cb, s);
   if (!s->rd)
      return false;
   s->direct = true;
   bufferevent_disable (s->bev, EV_READ);
   /* EV_WRITE (on in a new bufferevent, and for a connect) goes off with
    * the first flush that finds the output empty, as side_write_now says. */
   side_write_now (s);
   return true;
}

void
side_set_write_low (side_t *s, size_t low)
{
   bufferevent_setwatermark (s->bev, EV_WRITE, low, 0);
}

void
side_close (side_t *s)
{
   /* Our read event first, while its descriptor is still open. */
   proxy_event_free (s->rd);
   /* bufferevent_free clears the callbacks first, so nothing of ours runs
    * after this even with deferred callbacks queued. */
   if (s->bev)
      bufferevent_free (s->bev);
   proxy_event_free (s->timer);
   s->rd = NULL;
   s->bev = NULL;
   s->input = s->output = NULL;
   s->timer = NULL;
   s->fd = -1;
   s->direct = s->reading = s->drained_cb = s->timer_armed = s->connected = s->libevent_writes = false;
}

/* ------------------------------------------------------------ flow */

void
side_set_reading_slow (side_t *s, bool on)
{
   if (s->rd) {
      if (on)
         event_add (s->rd, NULL);
      else
         event_del (s->rd);
      s->reading = on;
   } else if (on) {
      bufferevent_enable (s->bev, EV_READ);
   } else {
      bufferevent_disable (s->bev, EV_READ);
   }
}

void
side_want_drained_slow (side_t *s, bool want)
{
   /* libevent schedules no write callback at all while it is NULL. */
   bufferevent_setcb (s->bev, side_bev_read_cb, want ? side_bev_write_cb : NULL, side_bev_event_cb, s);
   s->drained_cb = want;
}

/* A bufferevent would arm its write event (epoll_ctl), write on the next
 * loop turn and disarm it when empty (epoll_ctl again): two syscalls and a
 * loop turn per message per side.  Here EV_WRITE stays off while the
 * socket takes everything at once, the usual case for small messages.
 * What it does not take (EAGAIN, a partial write, or an error) is left to
 * libevent with EV_WRITE on: it finishes the write in order, reports an
 * error through the event callback as usual, and the first flush that
 * finds the output empty turns EV_WRITE off again.
 *
 * The output of a socket bufferevent is frozen at its front (only libevent
 * drains it); its own write callback unfreezes it around the write, and so
 * does this. */
size_t
side_write_now (side_t *s)
{
   struct evbuffer *out = side_output (s);
   bool libevent_writes = (bufferevent_get_enabled (s->bev) & EV_WRITE) != 0;
   size_t len = evbuffer_get_length (out);
   int n;

   if (len == 0) {
      if (libevent_writes)
         bufferevent_disable (s->bev, EV_WRITE);
      s->libevent_writes = false;
      return 0;
   }
   if (libevent_writes) {
      s->libevent_writes = true;
      return len; /* it is writing already: let it, so bytes keep their order */
   }
   evbuffer_unfreeze (out, 1);
   /* It drains what it wrote; -1 (an error) wrote nothing. */
   n = evbuffer_write_atmost (out, s->fd, bufferevent_get_max_single_write (s->bev));
   evbuffer_freeze (out, 1);
   if (n > 0)
      len -= (size_t) n;
   s->libevent_writes = len > 0;
   if (s->libevent_writes)
      bufferevent_enable (s->bev, EV_WRITE);
   return len;
}

void
side_timer_rearm (side_t *s, int64_t timeout_ms, bool partial)
{
   if (s->timer_armed) {
      evtimer_del (s->timer);
      s->timer_armed = false;
   }
   if (partial) {
      struct timeval tv = clock_timeval_ms (timeout_ms);
      if (!s->timer)
         s->timer = evtimer_new (bufferevent_get_base (s->bev), side_timer_cb, s);
      if (!s->timer)
         return; /* out of memory: this partial message goes untimed */
      evtimer_add (s->timer, &tv);
      s->timer_armed = true;
   }
}
