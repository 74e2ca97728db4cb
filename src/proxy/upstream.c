/*
 * proxy/upstream.c - connecting and watching one upstream socket.
 *
 * The address is numeric (resolved by the topology worker), so
 * bufferevent_socket_connect never needs DNS.  With TLS the bufferevent is
 * an OpenSSL socket bufferevent in connecting mode: the CONNECTED event
 * arrives after the TLS handshake, so the owner never writes into a
 * half-open session.  Certificate and host name failures surface as an
 * ERROR event during connect, reported as CONNECT_FAILED with OpenSSL's
 * reason.
 */
#include "proxy/upstream.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/err.h>

#include "base/log.h"
#include "base/counters.h"

/* Owned by its client connection (see proxy/conn.c), which frees it. */
struct upstream_conn {
   struct bufferevent *bev; /* frees the socket and the SSL */
   const upstream_callbacks_t *cb;
   void *owner;
   bool connected;
   bool tls;
   uint64_t generation;
   char name[TOPOLOGY_HOST_MAX + 8];
};

static void
upstream_read_cb (struct bufferevent *bev, void *arg)
{
   upstream_conn_t *up = arg;
   up->cb->on_read (up->owner);
}

static void
upstream_write_cb (struct bufferevent *bev, void *arg)
{
   upstream_conn_t *up = arg;
   up->cb->on_drained (up->owner);
}

static const char *
upstream_error_detail (upstream_conn_t *up, char *buf, size_t len)
{
   int err = EVUTIL_SOCKET_ERROR ();
   unsigned long ssl_err = 0;

   if (up->tls) {
      unsigned long e;
      while ((e = bufferevent_get_openssl_error (up->bev)) != 0)
         ssl_err = e;
   }
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

static void
upstream_event_cb (struct bufferevent *bev, short what, void *arg)
{
   upstream_conn_t *up = arg;
   char detail[256];

   if (what & BEV_EVENT_CONNECTED) {
      up->connected = true;
      stats_add (upstreams_open, 1);
      stats_add (upstream_connects, 1);
      up->cb->on_event (up->owner, UPSTREAM_EVENT_CONNECTED, up->name);
      return;
   }
   if (!up->connected) {
      stats_add (upstream_connect_failures, 1);
      up->cb->on_event (up->owner, UPSTREAM_EVENT_CONNECT_FAILED, upstream_error_detail (up, detail, sizeof detail));
      return;
   }
   if (what & BEV_EVENT_EOF)
      up->cb->on_event (up->owner, UPSTREAM_EVENT_EOF, "upstream closed the connection");
   else
      up->cb->on_event (up->owner, UPSTREAM_EVENT_ERROR, upstream_error_detail (up, detail, sizeof detail));
}

upstream_conn_t *
upstream_new (struct event_base *base,
              const topology_primary_t *primary,
              tls_upstream_t *tls,
              const upstream_callbacks_t *cb,
              void *owner,
              bson_error_t *error)
{
   upstream_conn_t *up = bson_malloc0 (sizeof *up);
   SSL *ssl = NULL;
   /* Deferred callbacks for TLS only (see client_accept). */
   const int opts = BEV_OPT_CLOSE_ON_FREE | (tls ? BEV_OPT_DEFER_CALLBACKS : 0);

   up->cb = cb;
   up->owner = owner;
   up->generation = primary->generation;
   bson_snprintf (up->name, sizeof up->name, "%s:%u", primary->host, (unsigned) primary->port);
   if (tls) {
      ssl = tls_upstream_ssl_new (tls, primary->host, error);
      if (!ssl)
         goto fail;
      up->tls = true;
      up->bev = bufferevent_openssl_socket_new (base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, opts);
      if (up->bev)
         /* Dirty shutdown of the TLS session is what a killed server looks
          * like; treat it as EOF rather than an error. */
         bufferevent_openssl_set_allow_dirty_shutdown (up->bev, 1);
      else
         SSL_free (ssl);
   } else {
      up->bev = bufferevent_socket_new (base, -1, opts);
   }
   if (!up->bev) {
      bson_set_error (error, UPSTREAM_ERROR_DOMAIN, 1, "cannot create a bufferevent");
      goto fail;
   }
   bufferevent_setcb (up->bev, upstream_read_cb, NULL, upstream_event_cb, up);
   if (bufferevent_socket_connect (up->bev, (const struct sockaddr *) &primary->addr, (int) primary->addr_len) < 0) {
      bson_set_error (error,
                      UPSTREAM_ERROR_DOMAIN,
                      2,
                      "connect to %s: %s",
                      up->name,
                      evutil_socket_error_to_string (EVUTIL_SOCKET_ERROR ()));
      stats_add (upstream_connect_failures, 1);
      goto fail;
   }
   /* TCP_NODELAY: requests and replies are small and latency-bound. */
   {
      int one = 1;
      evutil_socket_t fd = bufferevent_getfd (up->bev);
      if (fd >= 0)
         (void) setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
   }
   bufferevent_enable (up->bev, EV_READ | EV_WRITE);
   return up;
fail:
   upstream_destroy (up);
   return NULL;
}

struct bufferevent *
upstream_bev (upstream_conn_t *up)
{
   return up->bev;
}

bool
upstream_is_connected (const upstream_conn_t *up)
{
   return up && up->connected;
}

const char *
upstream_name (const upstream_conn_t *up)
{
   return up->name;
}

bool
upstream_is_tls (const upstream_conn_t *up)
{
   return up->tls;
}

uint64_t
upstream_generation (const upstream_conn_t *up)
{
   return up->generation;
}

void
upstream_want_drained (upstream_conn_t *up, bool want)
{
   /* libevent schedules no write callback at all while it is NULL. */
   bufferevent_setcb (up->bev, upstream_read_cb, want ? upstream_write_cb : NULL, upstream_event_cb, up);
}

void
upstream_destroy (upstream_conn_t *up)
{
   if (!up)
      return;
   if (up->bev) {
      /* bufferevent_free clears the callbacks first, so nothing of ours
       * runs after this even with deferred callbacks queued. */
      bufferevent_free (up->bev);
   }
   if (up->connected)
      stats_sub (upstreams_open, 1);
   bson_free (up);
}
