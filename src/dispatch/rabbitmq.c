/*
 * dispatch/rabbitmq.c - kind = rabbitmq: deliveries published to a
 * RabbitMQ exchange (AMQP 0-9-1, rabbitmq-c), as one implementation of
 * dispatch/transport.h.
 *
 * Each delivery is one message to the handler's exchange, with the
 * routing key its template gives, published `mandatory` on a channel in
 * confirm mode: the broker's basic.ack completes the delivery.  A
 * basic.return (no queue is bound for the routing key), a basic.nack, a
 * channel or connection closed by the broker (an exchange that does not
 * exist), no confirm within timeout_ms, or a send while the broker is
 * unreachable is a retry; the dispatcher's backoff and max_attempts apply,
 * then the delivery is dead with that error.  The body, its content type
 * and the AMQP headers are the handler's format in the AMQP binding
 * (dispatch/format.h: the relaybus-* headers, the event's own, and
 * cloudEvents_* in CloudEvents' binary mode); message_id is the event id,
 * and messages are persistent unless `persistent = false`.
 *
 * Threads: rabbitmq-c is synchronous and a connection is used by one
 * thread at a time, so each handler has one publishing thread with its
 * own connection that takes sends from the bounded queue of its base
 * (dispatch/transport.h's transport_base_t, over
 * dispatch/transport_queue.h), publishes one and waits for its confirm,
 * and hands the result back to the dispatcher's base.  One send at a time per handler
 * (the dispatcher keeps one per key anyway): throughput is one confirm
 * round trip per event.  The thread connects, and after a failure
 * reconnects every RABBITMQ_RECONNECT_MS, by itself; while idle it looks
 * every RABBITMQ_IDLE_CHECK_MS for a close from the broker.
 *
 * amqps:// URLs connect with TLS (rabbitmq-c's OpenSSL socket, port 5671
 * by default), the broker's certificate and host name verified, against
 * tls_ca_file or else the system's store; tls_cert_file and tls_key_file
 * present a client certificate.  The handshake runs on the publishing
 * thread like the rest of the connect; its failure, with OpenSSL's reason,
 * is the connection's last error (logged, in /readyz) and each send in the
 * meantime is a retry, never a dead letter.
 *
 * Not here: publishing without confirms.
 */
#include "dispatch/transport.h"
#include "dispatch/transport_queue.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "base/clock.h"
#include "base/log.h"

/* Pause between two connection attempts. */
#define RABBITMQ_RECONNECT_MS 500
/* How often an idle connection is checked for a close from the broker
 * (a restart), so that /readyz tells a lost broker without a send. */
#define RABBITMQ_IDLE_CHECK_MS 1000
/* Headers of a message, at most: the event's own (64 at most) and ours. */
#define RABBITMQ_HEADERS_MAX 80
#define RABBITMQ_CHANNEL 1

typedef struct rabbit_handler rabbit_handler_t;

/* One send: what the thread publishes, copied on the dispatcher's thread;
 * owned by the handler's queue (dispatch/transport_queue.h). */
typedef struct rabbit_req {
   tqueue_item_t item; /* first: the queue's part */
   char id[25];        /* the delivery id */
   char *event_id;     /* message_id */
   const char *content_type; /* static text */
   char *routing_key;
   char *body;
   size_t body_len;
   size_t n_headers;
   char *hk[RABBITMQ_HEADERS_MAX], *hv[RABBITMQ_HEADERS_MAX];
   bool numeric[RABBITMQ_HEADERS_MAX]; /* hv as AMQP's 64-bit integer (relaybus-sequence) */
   int64_t number[RABBITMQ_HEADERS_MAX];
} rabbit_req_t;

/* A handler's client.  Created by rabbit_start, freed by rabbit_destroy
 * once its thread (the base's one) is joined. */
struct rabbit_handler {
   transport_base_t base; /* first: the ops' object */
   char *exchange;
   char *ca_file, *cert_file, *key_file; /* amqps: "" when not set */
   bool persistent;
   int64_t timeout_ms;
   struct amqp_connection_info info; /* points into url_copy */
   char *url_copy;

   /* The thread's own. */
   amqp_connection_state_t conn;
   uint64_t next_tag; /* the delivery tag of the next publish on the channel */
};

_Static_assert (offsetof (rabbit_handler_t, base) == 0, "the ops take a rabbit_handler_t for its transport_base_t");


static void
req_free (tqueue_item_t *it)
{
   rabbit_req_t *r = (rabbit_req_t *) it; /* never NULL: the queue's or a failed send's */

   bson_free (r->event_id);
   bson_free (r->routing_key);
   bson_free (r->body);
   for (size_t i = 0; i < r->n_headers; i++) {
      bson_free (r->hk[i]);
      bson_free (r->hv[i]);
   }
   bson_free (r);
}

/* An rpc reply as text. */
static void
reply_text (amqp_rpc_reply_t r, char *out, size_t len)
{
   switch (r.reply_type) {
   case AMQP_RESPONSE_NORMAL:
      transport_text (out, len, "ok");
      break;
   case AMQP_RESPONSE_NONE:
      transport_text (out, len, "no reply");
      break;
   case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      transport_text (out, len, "%s", amqp_error_string2 (r.library_error));
      break;
   case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
         const amqp_connection_close_t *m = r.reply.decoded;
         transport_text (out, len, "connection closed by the broker: %u %.*s", m->reply_code, (int) m->reply_text.len, (const char *) m->reply_text.bytes);
      } else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
         const amqp_channel_close_t *m = r.reply.decoded;
         transport_text (out, len, "channel closed by the broker: %u %.*s", m->reply_code, (int) m->reply_text.len, (const char *) m->reply_text.bytes);
      } else
         transport_text (out, len, "broker error (method 0x%08x)", (unsigned) r.reply.id);
      break;
   default:
      transport_text (out, len, "unknown reply");
   }
}

/* On the thread: drops the connection (after a failure or at stop). */
static void
disconnect (rabbit_handler_t *rh, bool polite)
{
   if (!rh->conn)
      return;
   if (polite) {
      amqp_channel_close (rh->conn, RABBITMQ_CHANNEL, AMQP_REPLY_SUCCESS);
      amqp_connection_close (rh->conn, AMQP_REPLY_SUCCESS);
   }
   amqp_destroy_connection (rh->conn);
   rh->conn = NULL;
}

/* The first certificate the handshake on this thread refused, as
 * OpenSSL's verify callback saw it: OpenSSL's reason for a failed
 * verification ("unable to get local issuer certificate"), which its error
 * queue reduces to "certificate verify failed".  Each handler's thread
 * does its own handshakes, so a thread-local needs no lock. */
static _Thread_local char tls_verify_error[160];

static int
tls_verify_cb (int ok, X509_STORE_CTX *store)
{
   if (!ok && !tls_verify_error[0]) {
      int err = X509_STORE_CTX_get_error (store);
      transport_text (tls_verify_error, sizeof tls_verify_error, "%s (depth %d)", X509_verify_cert_error_string (err),
                      X509_STORE_CTX_get_error_depth (store));
   }
   return ok;
}

/* On the thread: a TLS socket for rh's amqps URL, verifying the peer and
 * its host name, with the CA and client certificate files.  NULL with
 * why filled. */
static amqp_socket_t *
tls_socket (rabbit_handler_t *rh, char *why, size_t why_len)
{
   amqp_socket_t *sock = amqp_ssl_socket_new (rh->conn);
   SSL_CTX *ctx;
   int rc;

   if (!sock) {
      transport_text (why, why_len, "cannot create a TLS socket");
      return NULL;
   }
   amqp_ssl_socket_set_verify_peer (sock, 1);
   amqp_ssl_socket_set_verify_hostname (sock, 1);
   ctx = amqp_ssl_socket_get_context (sock);
   /* rabbitmq-c sets the mode on each SSL without a callback, which keeps
    * this one (OpenSSL replaces a callback only with another). */
   SSL_CTX_set_verify (ctx, SSL_VERIFY_PEER, tls_verify_cb);
   if (*rh->ca_file)
      rc = amqp_ssl_socket_set_cacert (sock, rh->ca_file);
   else
      rc = SSL_CTX_set_default_verify_paths (ctx) == 1 ? AMQP_STATUS_OK : AMQP_STATUS_SSL_ERROR;
   if (rc != AMQP_STATUS_OK) {
      unsigned long e = ERR_get_error ();
      transport_text (why, why_len, "tls_ca_file '%s': %s", *rh->ca_file ? rh->ca_file : "(the system's store)",
                      e ? ERR_reason_error_string (e) : amqp_error_string2 (rc));
      return NULL;
   }
   if (*rh->cert_file && (rc = amqp_ssl_socket_set_key (sock, rh->cert_file, rh->key_file)) != AMQP_STATUS_OK) {
      unsigned long e = ERR_get_error ();
      transport_text (why, why_len, "tls_cert_file '%s' / tls_key_file '%s': %s", rh->cert_file, rh->key_file,
                      e ? ERR_reason_error_string (e) : amqp_error_string2 (rc));
      return NULL;
   }
   return sock;
}

/* After a failed open of a TLS socket: rabbitmq-c's status, with
 * OpenSSL's reason when there is one. */
static void
tls_open_error (rabbit_handler_t *rh, int rc, char *why, size_t why_len)
{
   unsigned long e = ERR_peek_last_error ();
   const char *reason = e ? ERR_reason_error_string (e) : NULL;

   if (tls_verify_error[0])
      transport_text (why, why_len, "TLS handshake with %s:%d: %s: %s", rh->info.host, rh->info.port, amqp_error_string2 (rc),
                      tls_verify_error);
   else if (reason)
      transport_text (why, why_len, "TLS handshake with %s:%d: %s: %s", rh->info.host, rh->info.port, amqp_error_string2 (rc), reason);
   else if (rc == AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED || rc == AMQP_STATUS_SSL_PEER_VERIFY_FAILED ||
            rc == AMQP_STATUS_SSL_CONNECTION_FAILED || rc == AMQP_STATUS_SSL_ERROR)
      /* Checked by rabbitmq-c after OpenSSL's handshake: no reason queued. */
      transport_text (why, why_len, "TLS handshake with %s:%d: %s", rh->info.host, rh->info.port, amqp_error_string2 (rc));
   else
      transport_text (why, why_len, "connecting to %s:%d (TLS): %s", rh->info.host, rh->info.port, amqp_error_string2 (rc));
   ERR_clear_error ();
}

/* On the thread: connects, logs in, opens the channel in confirm mode.
 * False with last_error set. */
static bool
connect_broker (rabbit_handler_t *rh)
{
   amqp_socket_t *sock;
   struct timeval tv = clock_timeval_ms (rh->timeout_ms < 5000 ? rh->timeout_ms : 5000);
   amqp_rpc_reply_t r;
   char why[TRANSPORT_DETAIL_MAX], buf[TRANSPORT_DETAIL_MAX];
   int rc;

   rh->conn = amqp_new_connection ();
   if (!rh->conn) {
      transport_text (why, sizeof why, "cannot create a connection");
      goto fail;
   }
   if (rh->info.ssl)
      sock = tls_socket (rh, why, sizeof why);
   else if (!(sock = amqp_tcp_socket_new (rh->conn)))
      transport_text (why, sizeof why, "cannot create a connection");
   if (!sock)
      goto fail;
   amqp_set_handshake_timeout (rh->conn, &tv);
   amqp_set_rpc_timeout (rh->conn, &tv);
   tls_verify_error[0] = '\0';
   ERR_clear_error ();
   if ((rc = amqp_socket_open_noblock (sock, rh->info.host, rh->info.port, &tv)) != AMQP_STATUS_OK) {
      if (rh->info.ssl)
         tls_open_error (rh, rc, why, sizeof why);
      else
         transport_text (why, sizeof why, "connecting to %s:%d: %s", rh->info.host, rh->info.port, amqp_error_string2 (rc));
      goto fail;
   }
   r = amqp_login (rh->conn, rh->info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, rh->info.user, rh->info.password);
   if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      reply_text (r, buf, sizeof buf);
      transport_text (why, sizeof why, "login to %s:%d: %s", rh->info.host, rh->info.port, buf);
      goto fail;
   }
   amqp_channel_open (rh->conn, RABBITMQ_CHANNEL);
   r = amqp_get_rpc_reply (rh->conn);
   if (r.reply_type == AMQP_RESPONSE_NORMAL) {
      amqp_confirm_select (rh->conn, RABBITMQ_CHANNEL);
      r = amqp_get_rpc_reply (rh->conn);
   }
   if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      reply_text (r, buf, sizeof buf);
      transport_text (why, sizeof why, "opening a channel: %s", buf);
      goto fail;
   }
   rh->next_tag = 1;
   if (transport_base_set (&rh->base, TRANSPORT_STATE_CONNECTED, "") != TRANSPORT_STATE_CONNECTED)
      log_info ("dispatch: handler %s: connected to RabbitMQ at %s:%d%s", rh->base.name, rh->info.host, rh->info.port,
                rh->info.ssl ? " (amqps)" : "");
   return true;

fail:
   disconnect (rh, false);
   {
      transport_state_t was = transport_base_set (&rh->base, TRANSPORT_STATE_DISCONNECTED, why);
      if (was == TRANSPORT_STATE_CONNECTED)
         log_warn ("dispatch: handler %s: lost RabbitMQ (%s); reconnecting (sends are retried meanwhile)", rh->base.name, why);
      else if (was == TRANSPORT_STATE_CONNECTING)
         log_warn ("dispatch: handler %s: cannot connect to RabbitMQ yet (%s); retrying in the background", rh->base.name, why);
   }
   return false;
}

/* On the thread: a connection that failed mid-publish is dropped; the
 * next send reconnects. */
static void
broken (rabbit_handler_t *rh, const char *why)
{
   disconnect (rh, false);
   if (transport_base_set (&rh->base, TRANSPORT_STATE_DISCONNECTED, why) == TRANSPORT_STATE_CONNECTED)
      log_warn ("dispatch: handler %s: lost RabbitMQ (%s); reconnecting (sends are retried meanwhile)", rh->base.name, why);
}

static amqp_bytes_t
bytes (const char *s)
{
   return amqp_cstring_bytes (s ? s : "");
}

/* On the thread: publishes r and waits for its confirm. */
static void
publish_one (rabbit_handler_t *rh, rabbit_req_t *r)
{
   transport_result_t *res = &r->item.res;
   amqp_basic_properties_t props;
   amqp_table_entry_t entries[RABBITMQ_HEADERS_MAX];
   size_t ne = 0;
   uint64_t tag;
   int64_t deadline;
   char returned[TRANSPORT_ERROR_MAX] = "";
   char why[TRANSPORT_DETAIL_MAX];

   res->outcome = TRANSPORT_OUTCOME_RETRY;
   res->retry_after_ms = -1;
   if (!rh->conn && !connect_broker (rh)) {
      transport_base_last_error (&rh->base, why, sizeof why);
      transport_text (res->error, sizeof res->error, "rabbitmq: not connected: %s", why);
      return;
   }
   for (size_t i = 0; i < r->n_headers; i++) {
      entries[ne].key = bytes (r->hk[i]);
      if (r->numeric[i]) {
         entries[ne].value.kind = AMQP_FIELD_KIND_I64;
         entries[ne].value.value.i64 = r->number[i];
      } else {
         entries[ne].value.kind = AMQP_FIELD_KIND_UTF8;
         entries[ne].value.value.bytes = bytes (r->hv[i]);
      }
      ne++;
   }
   memset (&props, 0, sizeof props);
   props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                  AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
   props.content_type = bytes (r->content_type);
   props.delivery_mode = rh->persistent ? 2 : 1;
   props.message_id = bytes (r->event_id);
   props.timestamp = (uint64_t) (clock_now_ms () / 1000);
   props.headers.num_entries = (int) ne;
   props.headers.entries = entries;
   {
      amqp_bytes_t body = {.len = r->body_len, .bytes = r->body};
      int rc = amqp_basic_publish (rh->conn, RABBITMQ_CHANNEL, bytes (rh->exchange), bytes (r->routing_key), 1, 0, &props, body);
      if (rc != AMQP_STATUS_OK) {
         transport_text (why, sizeof why, "publishing: %s", amqp_error_string2 (rc));
         transport_text (res->error, sizeof res->error, "rabbitmq: %s", why);
         broken (rh, why);
         return;
      }
   }
   tag = rh->next_tag++;
   deadline = clock_now_ms () + rh->timeout_ms;
   for (;;) {
      amqp_frame_t frame;
      int64_t left = deadline - clock_now_ms ();
      struct timeval tv = clock_timeval_ms (left > 0 ? left : 0);
      int rc;

      amqp_maybe_release_buffers (rh->conn);
      rc = left > 0 ? amqp_simple_wait_frame_noblock (rh->conn, &frame, &tv) : AMQP_STATUS_TIMEOUT;
      if (rc == AMQP_STATUS_TIMEOUT) {
         /* Its confirm may still come: the connection's state is unknown,
          * so it is dropped, and the retry goes on a new one. */
         transport_text (res->error, sizeof res->error, "rabbitmq: no publisher confirm within %" PRId64 " ms", rh->timeout_ms);
         res->fault = TRANSPORT_FAULT_TIMEOUT;
         broken (rh, "no publisher confirm in time");
         return;
      }
      if (rc != AMQP_STATUS_OK) {
         transport_text (why, sizeof why, "waiting for the confirm: %s", amqp_error_string2 (rc));
         transport_text (res->error, sizeof res->error, "rabbitmq: %s", why);
         broken (rh, why);
         return;
      }
      if (frame.frame_type != AMQP_FRAME_METHOD)
         continue;
      switch (frame.payload.method.id) {
      case AMQP_BASIC_RETURN_METHOD: {
         const amqp_basic_return_t *m = frame.payload.method.decoded;
         amqp_message_t msg;
         amqp_rpc_reply_t rr;
         transport_text (returned,
                         sizeof returned,
                         "rabbitmq: unroutable: exchange '%s' routed '%s' nowhere (%u %.*s)",
                         rh->exchange,
                         r->routing_key,
                         m->reply_code,
                         (int) m->reply_text.len,
                         (const char *) m->reply_text.bytes);
         /* The returned message's header and body follow. */
         rr = amqp_read_message (rh->conn, frame.channel, &msg, 0);
         if (rr.reply_type != AMQP_RESPONSE_NORMAL) {
            bson_strncpy (res->error, returned, sizeof res->error);
            res->fault = TRANSPORT_FAULT_REFUSED;
            broken (rh, "reading a returned message");
            return;
         }
         amqp_destroy_message (&msg);
         break;
      }
      case AMQP_BASIC_ACK_METHOD: {
         const amqp_basic_ack_t *m = frame.payload.method.decoded;
         if (m->delivery_tag < tag && !m->multiple)
            break; /* an earlier publish's late confirm */
         if (returned[0]) {
            bson_strncpy (res->error, returned, sizeof res->error);
            res->fault = TRANSPORT_FAULT_REFUSED; /* unroutable */
         } else {
            res->outcome = TRANSPORT_OUTCOME_OK;
         }
         return;
      }
      case AMQP_BASIC_NACK_METHOD: {
         const amqp_basic_nack_t *m = frame.payload.method.decoded;
         if (m->delivery_tag < tag && !m->multiple)
            break;
         transport_text (res->error, sizeof res->error, "rabbitmq: the broker refused the message (basic.nack)");
         res->fault = TRANSPORT_FAULT_REFUSED;
         return;
      }
      case AMQP_CHANNEL_CLOSE_METHOD: {
         const amqp_channel_close_t *m = frame.payload.method.decoded;
         amqp_channel_close_ok_t ok = {0};
         transport_text (res->error,
                         sizeof res->error,
                         "rabbitmq: channel closed by the broker: %u %.*s",
                         m->reply_code,
                         (int) m->reply_text.len,
                         (const char *) m->reply_text.bytes);
         res->fault = TRANSPORT_FAULT_REFUSED; /* the publish's channel error: no such exchange, access refused */
         amqp_send_method (rh->conn, frame.channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
         /* Reopened with the connection on the next send. */
         disconnect (rh, false);
         return;
      }
      case AMQP_CONNECTION_CLOSE_METHOD: {
         const amqp_connection_close_t *m = frame.payload.method.decoded;
         transport_text (why, sizeof why, "connection closed by the broker: %u %.*s", m->reply_code, (int) m->reply_text.len, (const char *) m->reply_text.bytes);
         transport_text (res->error, sizeof res->error, "rabbitmq: %s", why);
         broken (rh, why);
         return;
      }
      default:
         break;
      }
   }
}

/* On the thread, idle: whatever the broker sent meanwhile (a
 * connection.close when it stops, or the socket's end) drops the
 * connection; a late confirm is ignored. */
static void
idle_check (rabbit_handler_t *rh)
{
   for (;;) {
      amqp_frame_t frame;
      struct timeval tv = {0, 0};
      int rc;

      amqp_maybe_release_buffers (rh->conn);
      rc = amqp_simple_wait_frame_noblock (rh->conn, &frame, &tv);
      if (rc == AMQP_STATUS_TIMEOUT)
         return;
      if (rc != AMQP_STATUS_OK) {
         broken (rh, amqp_error_string2 (rc));
         return;
      }
      if (frame.frame_type == AMQP_FRAME_METHOD &&
          (frame.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD || frame.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD)) {
         broken (rh, "closed by the broker");
         return;
      }
   }
}

static void *
publisher_main (void *arg)
{
   rabbit_handler_t *rh = arg;

   connect_broker (rh);
   for (;;) {
      /* While idle: reconnect, or look for a close from the broker. */
      tqueue_item_t *it = tqueue_take (rh->base.q, rh->conn ? RABBITMQ_IDLE_CHECK_MS : RABBITMQ_RECONNECT_MS);

      if (it) {
         publish_one (rh, (rabbit_req_t *) it);
         tqueue_done (rh->base.q, it);
      } else if (tqueue_stopped (rh->base.q))
         break;
      else if (rh->conn)
         idle_check (rh);
      else
         connect_broker (rh);
   }
   disconnect (rh, true);
   return NULL;
}

/* ------------------------------------------------------------- the ops */

static void rabbit_destroy (void *impl);

static void *
rabbit_start (const transport_env_t *env, const config_handler_t *h, bson_error_t *error)
{
   rabbit_handler_t *rh = bson_malloc0 (sizeof *rh);
   bool queued = transport_base_init (&rh->base, env, h, h->url, h->routing_key, req_free);

   rh->exchange = bson_strdup (h->exchange);
   rh->persistent = h->persistent;
   rh->ca_file = bson_strdup (h->tls_ca_file);
   rh->cert_file = bson_strdup (h->tls_cert_file);
   rh->key_file = bson_strdup (h->tls_key_file);
   rh->timeout_ms = h->timeout_ms > 0 ? h->timeout_ms : 10000;
   rh->url_copy = bson_strdup (h->url);
   amqp_default_connection_info (&rh->info);
   if (amqp_parse_url (rh->url_copy, &rh->info) != AMQP_STATUS_OK) {
      char *masked = config_mask ("url", h->url);
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "handler %s: url \"%s\" is not amqp[s]://[user:password@]host[:port][/vhost]", h->name, masked);
      bson_free (masked);
      goto fail;
   }
   if (queued && transport_base_start_threads (&rh->base, 1, publisher_main, rh))
      return rh;
   bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "handler %s: cannot start the publishing thread", h->name);

fail:
   rabbit_destroy (rh);
   return NULL;
}

static void *
rabbit_send (void *impl, const store_delivery_t *d, const format_msg_t *m, transport_done_cb_t cb, void *arg, bson_error_t *error)
{
   rabbit_handler_t *rh = impl;
   rabbit_req_t *r;

   r = bson_malloc0 (sizeof *r);
   bson_oid_to_string (&d->id, r->id);
   r->event_id = bson_strdup (d->event_id ? d->event_id : "");
   r->content_type = m->content_type;
   r->routing_key = transport_expand (rh->base.tmpl, d, "");
   if (strlen (r->routing_key) > 255)
      r->routing_key[255] = '\0'; /* AMQP's limit; a cut key still routes the same every time */
   r->body = bson_strndup (m->body, m->body_len);
   r->body_len = m->body_len;
   /* The binding's headers as rendered (the relaybus-* ones, the event's
    * own, cloudEvents_* in CloudEvents' binary mode), as UTF-8 strings
    * but the sequence, a 64-bit integer as it always was. */
   for (size_t i = 0; i < m->n_headers && r->n_headers < RABBITMQ_HEADERS_MAX; i++) {
      /* AMQP frames each entry by length; a consumer that copies one into
       * HTTP or NATS would not, so none holds a line break either. */
      if (!format_header_safe (m->headers[i].name) || !format_header_safe (m->headers[i].value)) {
         bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_SEND,
                         "rabbitmq: header %.64s has a control character; the message is not sent",
                         format_header_safe (m->headers[i].name) ? m->headers[i].name : "(name)");
         return transport_base_push (&rh->base, &r->item, cb, arg, false, error);
      }
      r->hk[r->n_headers] = bson_strdup (m->headers[i].name);
      r->hv[r->n_headers] = bson_strdup (m->headers[i].value);
      r->numeric[r->n_headers] = m->headers[i].numeric;
      r->number[r->n_headers] = m->headers[i].number;
      r->n_headers++;
   }
   return transport_base_push (&rh->base, &r->item, cb, arg, true, error);
}

/* Joins the thread (it finishes the publish it is in, at most
 * timeout_ms, and closes its connection). */
static void
rabbit_destroy (void *impl)
{
   rabbit_handler_t *rh = impl;

   transport_base_stop (&rh->base);
   bson_free (rh->url_copy);
   bson_free (rh->exchange);
   bson_free (rh->ca_file);
   bson_free (rh->cert_file);
   bson_free (rh->key_file);
   transport_base_fini (&rh->base);
   bson_free (rh);
}

/* What rabbit_start copies. */
static bool
rabbit_settings_equal (const config_handler_t *a, const config_handler_t *b)
{
   return !strcmp (a->url, b->url) && !strcmp (a->exchange, b->exchange) && !strcmp (a->routing_key, b->routing_key) &&
          !strcmp (a->tls_ca_file, b->tls_ca_file) && !strcmp (a->tls_cert_file, b->tls_cert_file) &&
          !strcmp (a->tls_key_file, b->tls_key_file) && a->persistent == b->persistent && a->timeout_ms == b->timeout_ms && a->concurrency == b->concurrency;
}

const transport_ops_t transport_rabbitmq_ops = TRANSPORT_BASE_OPS ("rabbitmq", rabbit, NULL);
