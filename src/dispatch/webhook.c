/*
 * dispatch/webhook.c - webhook deliveries: Standard Webhooks signature, retry
 * policy (status classes, Retry-After) and the evhttp client (with OpenSSL
 * for https).
 *
 * It knows nothing of the store: as the webhook kind of the handler
 * interface (transport_webhook_ops, at the end), it sends a claimed
 * delivery as rendered for HTTP (dispatch/format.h: the body, its content
 * type and headers of the handler's format), and maps the answer to
 * a result the dispatcher completes, reschedules or buries.  Everything
 * here runs on the dispatcher's event base.
 */
#include "dispatch/webhook.h"
#include "base/clock.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <arpa/inet.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/x509v3.h>

#include "base/log.h"
#include "base/utf8.h"
#include "dispatch/delivery.h"
#include "dispatch/transport.h"

/* ----------------------------------------------------------- signatures */

/* Why a secret is refused; SECRET_OK when it is not. */
typedef enum {
   SECRET_OK,
   SECRET_NO_PREFIX,
   SECRET_BAD_BASE64,
   SECRET_EMPTY,
   SECRET_TOO_LONG,
} secret_status_t;

/* Decodes the `len` bytes at `secret` (not NUL-terminated). */
static secret_status_t
secret_decode_n (const char *secret, size_t len, uint8_t key[WEBHOOK_KEY_MAX], size_t *key_len)
{
   static const char prefix[] = "whsec_";
   uint8_t buf[WEBHOOK_KEY_MAX + 3];
   const char *b64;
   size_t b64_len;
   int n, pad = 0;

   *key_len = 0;
   if (len < sizeof prefix - 1 || memcmp (secret, prefix, sizeof prefix - 1) != 0)
      return SECRET_NO_PREFIX;
   b64 = secret + sizeof prefix - 1;
   b64_len = len - (sizeof prefix - 1);
   if (b64_len == 0)
      return SECRET_EMPTY;
   if (b64_len % 4 != 0)
      return SECRET_BAD_BASE64;
   for (size_t i = 0; i < b64_len; i++) {
      unsigned char c = (unsigned char) b64[i];
      /* '=' only as the last one or two characters. */
      if (c == '=' ? i + 2 < b64_len || (i + 2 == b64_len && b64[i + 1] != '=')
                   : !(isalnum (c) || c == '+' || c == '/'))
         return SECRET_BAD_BASE64;
   }
   if (b64_len / 4 * 3 > sizeof buf)
      return SECRET_TOO_LONG;
   n = EVP_DecodeBlock (buf, (const unsigned char *) b64, (int) b64_len);
   if (n < 0)
      return SECRET_BAD_BASE64;
   /* EVP_DecodeBlock counts the padding as zero bytes. */
   if (b64[b64_len - 1] == '=')
      pad++;
   if (b64[b64_len - 2] == '=')
      pad++;
   n -= pad;
   if (n <= 0)
      return SECRET_EMPTY;
   if ((size_t) n > WEBHOOK_KEY_MAX)
      return SECRET_TOO_LONG;
   memcpy (key, buf, (size_t) n);
   *key_len = (size_t) n;
   OPENSSL_cleanse (buf, sizeof buf);
   return SECRET_OK;
}

bool
webhook_secret_decode (const char *secret, uint8_t key[WEBHOOK_KEY_MAX], size_t *key_len)
{
   *key_len = 0;
   if (!secret)
      return false;
   return secret_decode_n (secret, strlen (secret), key, key_len) == SECRET_OK;
}

#define WEBHOOK_STR_(x) #x
#define WEBHOOK_STR(x) WEBHOOK_STR_ (x)

bool
webhook_secrets_parse (const char *secrets, webhook_keys_t *keys, bson_error_t *error)
{
   static const char *const why[] = {
      [SECRET_NO_PREFIX] = "does not start with whsec_",
      [SECRET_BAD_BASE64] = "is not whsec_ followed by valid base64",
      [SECRET_EMPTY] = "decodes to an empty key",
      [SECRET_TOO_LONG] = "decodes to a key longer than " WEBHOOK_STR (WEBHOOK_KEY_MAX) " bytes",
   };
   const char *p = secrets ? secrets : "";
   size_t count = 0;

   keys->n = 0;
   for (;;) {
      size_t len;
      secret_status_t st;

      while (isspace ((unsigned char) *p))
         p++;
      if (!*p)
         break;
      for (len = 0; p[len] && !isspace ((unsigned char) p[len]); len++)
         ;
      count++;
      if (count > WEBHOOK_SECRETS_MAX) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 9, "more than %d secrets", WEBHOOK_SECRETS_MAX);
         goto fail;
      }
      st = secret_decode_n (p, len, keys->key[count - 1], &keys->len[count - 1]);
      if (st != SECRET_OK) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 9, "secret %zu of the list %s", count, why[st]);
         goto fail;
      }
      keys->n = count;
      p += len;
   }
   return true;
fail:
   OPENSSL_cleanse (keys, sizeof *keys);
   keys->n = 0;
   return false;
}

bool
webhook_secrets_valid (const char *secrets, bson_error_t *error)
{
   webhook_keys_t keys;
   bool ok = webhook_secrets_parse (secrets, &keys, error);

   OPENSSL_cleanse (&keys, sizeof keys);
   return ok;
}

void
webhook_sign (const uint8_t *key,
              size_t key_len,
              const char *msg_id,
              int64_t timestamp_s,
              const char *body,
              size_t body_len,
              char out[WEBHOOK_SIGNATURE_MAX])
{
   unsigned char mac[EVP_MAX_MD_SIZE];
   unsigned int mac_len = 0;
   char ts[32];
   EVP_MAC *hmac = EVP_MAC_fetch (NULL, "HMAC", NULL);
   EVP_MAC_CTX *ctx = hmac ? EVP_MAC_CTX_new (hmac) : NULL;
   OSSL_PARAM params[2];
   size_t outl = 0;

   snprintf (ts, sizeof ts, "%" PRId64, timestamp_s);
   params[0] = OSSL_PARAM_construct_utf8_string ("digest", (char *) "SHA256", 0);
   params[1] = OSSL_PARAM_construct_end ();
   if (ctx && EVP_MAC_init (ctx, key, key_len, params) == 1 &&
       EVP_MAC_update (ctx, (const unsigned char *) msg_id, strlen (msg_id)) == 1 &&
       EVP_MAC_update (ctx, (const unsigned char *) ".", 1) == 1 &&
       EVP_MAC_update (ctx, (const unsigned char *) ts, strlen (ts)) == 1 &&
       EVP_MAC_update (ctx, (const unsigned char *) ".", 1) == 1 &&
       EVP_MAC_update (ctx, (const unsigned char *) body, body_len) == 1 &&
       EVP_MAC_final (ctx, mac, &outl, sizeof mac) == 1)
      mac_len = (unsigned int) outl;
   EVP_MAC_CTX_free (ctx);
   EVP_MAC_free (hmac);
   memcpy (out, "v1,", 3);
   EVP_EncodeBlock ((unsigned char *) out + 3, mac, (int) mac_len);
}

void
webhook_sign_all (const webhook_keys_t *keys,
                  const char *msg_id,
                  int64_t timestamp_s,
                  const char *body,
                  size_t body_len,
                  char out[WEBHOOK_SIGNATURES_MAX])
{
   size_t used = 0;

   out[0] = '\0';
   for (size_t i = 0; i < keys->n && i < WEBHOOK_SECRETS_MAX; i++) {
      char sig[WEBHOOK_SIGNATURE_MAX];
      size_t len;

      webhook_sign (keys->key[i], keys->len[i], msg_id, timestamp_s, body, body_len, sig);
      len = strlen (sig);
      if (i > 0)
         out[used++] = ' ';
      memcpy (out + used, sig, len + 1);
      used += len;
   }
}

/* ---------------------------------------------------------- Retry-After */

bool
webhook_parse_retry_after (const char *value, int64_t now_ms, int64_t *delay_ms)
{
   static const char *const formats[] = {
      "%a, %d %b %Y %H:%M:%S GMT", /* IMF-fixdate */
      "%A, %d-%b-%y %H:%M:%S GMT", /* RFC 850 */
      "%a %b %e %H:%M:%S %Y",      /* asctime */
   };
   const char *p;

   if (!value)
      return false;
   while (isspace ((unsigned char) *value))
      value++;
   if (!*value)
      return false;
   for (p = value; isdigit ((unsigned char) *p); p++)
      ;
   if (p != value) {
      const char *q = p;
      while (isspace ((unsigned char) *q))
         q++;
      if (*q == '\0') {
         long long secs;
         errno = 0;
         secs = strtoll (value, NULL, 10);
         if (errno == ERANGE || secs > WEBHOOK_RETRY_AFTER_MAX_MS / 1000)
            *delay_ms = WEBHOOK_RETRY_AFTER_MAX_MS;
         else
            *delay_ms = (int64_t) secs * 1000;
         return true;
      }
   }
   for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
      struct tm tm;
      const char *end;
      memset (&tm, 0, sizeof tm);
      end = strptime (value, formats[i], &tm);
      if (end) {
         while (isspace ((unsigned char) *end))
            end++;
         if (*end == '\0') {
            int64_t at = (int64_t) timegm (&tm) * 1000;
            int64_t d = at - now_ms;
            *delay_ms = d < 0 ? 0 : d > WEBHOOK_RETRY_AFTER_MAX_MS ? WEBHOOK_RETRY_AFTER_MAX_MS : d;
            return true;
         }
      }
   }
   return false;
}

static const char *const outcome_names[] = {
   [WEBHOOK_OUTCOME_COMPLETE] = "complete",
   [WEBHOOK_OUTCOME_RETRY] = "retry",
   [WEBHOOK_OUTCOME_RETRY_AFTER] = "retry-after",
   [WEBHOOK_OUTCOME_DEAD] = "dead",
};

const char *
webhook_outcome_name (webhook_outcome_t o)
{
   return (unsigned) o < sizeof outcome_names / sizeof outcome_names[0] ? outcome_names[o] : "?";
}

webhook_outcome_t
webhook_classify (int status, bool retry_4xx)
{
   if (status == 0)
      return WEBHOOK_OUTCOME_RETRY;
   if (status >= 200 && status < 300)
      return WEBHOOK_OUTCOME_COMPLETE;
   if (status == 429 || status == 503)
      return WEBHOOK_OUTCOME_RETRY_AFTER;
   if (status >= 500 && status < 600)
      return WEBHOOK_OUTCOME_RETRY;
   if (status >= 400 && status < 500)
      return retry_4xx ? WEBHOOK_OUTCOME_RETRY : WEBHOOK_OUTCOME_DEAD;
   return WEBHOOK_OUTCOME_DEAD; /* 1xx, 3xx: a misconfigured URL */
}

void
webhook_error_text (int status, const char *body, size_t body_len, char *out, size_t out_len)
{
   int r;
   size_t n, room;

   if (out_len == 0)
      return;
   r = snprintf (out, out_len, "HTTP %d: ", status);
   if (r < 0 || (size_t) r >= out_len) {
      snprintf (out, out_len, "HTTP %d", status); /* ASCII: cut anywhere */
      return;
   }
   n = (size_t) r;
   room = out_len - n < WEBHOOK_ERROR_BODY_MAX + 1 ? out_len - n : WEBHOOK_ERROR_BODY_MAX + 1;
   if (!body || body_len == 0 || utf8_sanitize (body, body_len, out + n, room, UTF8_CONTROLS_AS_SPACE) == 0)
      snprintf (out, out_len, "HTTP %d", status); /* nothing of the body fits, or none */
}

/* ---------------------------------------------------------------- client */

bool
webhook_host_is_ip (const char *host)
{
   unsigned char buf[16];
   return inet_pton (AF_INET, host, buf) == 1 || inet_pton (AF_INET6, host, buf) == 1;
}

/* One request.  libevent owns `req` (it frees it after req_done_cb, or in
 * evhttp_cancel_request); `req` is NULL once it is gone.  `deadline` bounds
 * the whole exchange: evhttp's own timeout is per read or write, so an
 * endpoint that trickles bytes would otherwise hold the delivery, and its
 * lane, for ever. */
struct webhook_req {
   webhook_req_t *next;
   webhook_t *w;
   struct evhttp_connection *conn;
   struct evhttp_request *req;
   struct event *deadline;
   webhook_done_cb_t cb;
   void *arg;
   enum evhttp_request_error err;
   bool got_error;
   bool done; /* the callback ran or the request was cancelled: reap */
};

/* A handler's client.  Owns its strings and its requests (in flight and
 * finished ones waiting to be reaped outside libevent's callbacks). */
struct webhook {
   struct event_base *base;
   struct evdns_base *dns;
   SSL_CTX *ssl;
   char *name;
   char *host;
   char *path; /* path and query */
   int port;
   bool https;
   webhook_keys_t keys; /* keys.n == 0: requests are not signed */
   int64_t timeout_ms;
   bool retry_4xx;
   webhook_req_t *reqs;
   struct event *reap_ev;
};

static void
req_free (webhook_req_t *r)
{
   if (r->deadline)
      event_free (r->deadline);
   if (r->conn)
      evhttp_connection_free (r->conn);
   bson_free (r);
}

/* Frees finished requests: their connections cannot be freed inside
 * libevent's own callback. */
static void
reap_cb (evutil_socket_t fd, short what, void *arg)
{
   webhook_t *w = arg;
   webhook_req_t **pp = &w->reqs;

   (void) fd;
   (void) what;
   while (*pp) {
      webhook_req_t *r = *pp;
      if (r->done) {
         *pp = r->next;
         req_free (r);
      } else {
         pp = &r->next;
      }
   }
}

webhook_t *
webhook_new (struct event_base *base, struct evdns_base *dns, SSL_CTX *ssl, const config_handler_t *h, bson_error_t *error)
{
   struct evhttp_uri *uri = evhttp_uri_parse (h->url ? h->url : "");
   webhook_t *w = NULL;
   const char *scheme, *host, *path, *query;
   char pq[2048];
   bson_error_t sub;

   if (!uri || !(scheme = evhttp_uri_get_scheme (uri)) || !(host = evhttp_uri_get_host (uri)) || !*host ||
       (strcasecmp (scheme, "http") != 0 && strcasecmp (scheme, "https") != 0)) {
      char *masked = config_mask ("url", h->url ? h->url : "");
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 1, "handler %s: url \"%s\" is not an http:// or https:// URL", h->name, masked);
      bson_free (masked);
      goto done;
   }
   w = bson_malloc0 (sizeof *w);
   w->base = base;
   w->dns = dns;
   w->ssl = ssl;
   w->name = bson_strdup (h->name);
   w->host = bson_strdup (host);
   w->https = strcasecmp (scheme, "https") == 0;
   w->port = evhttp_uri_get_port (uri) > 0 ? evhttp_uri_get_port (uri) : (w->https ? 443 : 80);
   path = evhttp_uri_get_path (uri);
   query = evhttp_uri_get_query (uri);
   snprintf (pq, sizeof pq, "%s%s%s", path && *path ? path : "/", query ? "?" : "", query ? query : "");
   w->path = bson_strdup (pq);
   w->timeout_ms = h->timeout_ms > 0 ? h->timeout_ms : 10000;
   w->retry_4xx = h->retry_4xx;
   if (!webhook_secrets_parse (h->secret, &w->keys, &sub)) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 2, "handler %s: secret: %s", h->name, sub.message);
      webhook_destroy (w);
      w = NULL;
      goto done;
   }
   if (w->https && !ssl) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 3, "handler %s: https needs TLS, which failed to initialise", h->name);
      webhook_destroy (w);
      w = NULL;
      goto done;
   }
   w->reap_ev = event_new (base, -1, 0, reap_cb, w);

done:
   if (uri)
      evhttp_uri_free (uri);
   return w;
}

void
webhook_destroy (webhook_t *w)
{
   if (!w)
      return;
   while (w->reqs) {
      webhook_req_t *r = w->reqs;
      w->reqs = r->next;
      req_free (r);
   }
   if (w->reap_ev)
      event_free (w->reap_ev);
   bson_free (w->name);
   bson_free (w->host);
   bson_free (w->path);
   OPENSSL_cleanse (&w->keys, sizeof w->keys);
   bson_free (w);
}

static const char *
request_error_name (enum evhttp_request_error e)
{
   switch (e) {
   case EVREQ_HTTP_TIMEOUT:
      return "timeout";
   case EVREQ_HTTP_EOF:
      return "connection closed before an answer";
   case EVREQ_HTTP_INVALID_HEADER:
      return "invalid answer";
   case EVREQ_HTTP_BUFFER_ERROR:
      return "connection error";
   case EVREQ_HTTP_REQUEST_CANCEL:
      return "cancelled";
   case EVREQ_HTTP_DATA_TOO_LONG:
      return "answer too long";
   default:
      return "error";
   }
}

static void
req_error_cb (enum evhttp_request_error e, void *arg)
{
   webhook_req_t *r = arg;
   r->err = e;
   r->got_error = true;
}

static void
req_done_cb (struct evhttp_request *req, void *arg)
{
   webhook_req_t *r = arg;
   webhook_t *w = r->w;
   webhook_result_t res;
   int status = req ? evhttp_request_get_response_code (req) : 0;

   if (r->done)
      return;
   r->req = NULL; /* libevent frees it when this returns */
   if (r->deadline)
      event_del (r->deadline);
   memset (&res, 0, sizeof res);
   res.status = status;
   res.retry_after_ms = -1;
   res.outcome = webhook_classify (status, w->retry_4xx);
   if (status == 0) {
      unsigned long ssl_err = 0;
      struct bufferevent *bev = r->conn ? evhttp_connection_get_bufferevent (r->conn) : NULL;
      if (w->https && bev)
         ssl_err = bufferevent_get_openssl_error (bev);
      if (ssl_err) {
         char buf[160];
         ERR_error_string_n (ssl_err, buf, sizeof buf);
         snprintf (res.error, sizeof res.error, "TLS: %s", buf);
      } else {
         snprintf (res.error,
                   sizeof res.error,
                   "%s (%s:%d)",
                   r->got_error ? request_error_name (r->err) : "connection failed",
                   w->host,
                   w->port);
      }
   } else if (res.outcome != WEBHOOK_OUTCOME_COMPLETE) {
      struct evbuffer *in = evhttp_request_get_input_buffer (req);
      /* 3 bytes more than kept: a character crossing the limit is seen
       * whole, and left out whole. */
      char body[WEBHOOK_ERROR_BODY_MAX + 3];
      ev_ssize_t copied = in ? evbuffer_copyout (in, body, sizeof body) : 0;
      size_t n = copied > 0 ? (size_t) copied : 0;
      const char *ra = evhttp_find_header (evhttp_request_get_input_headers (req), "Retry-After");
      webhook_error_text (status, body, n, res.error, sizeof res.error);
      if (ra && res.outcome == WEBHOOK_OUTCOME_RETRY_AFTER &&
          !webhook_parse_retry_after (ra, clock_now_ms (), &res.retry_after_ms))
         res.retry_after_ms = -1;
   }
   r->done = true;
   r->cb (&res, r->arg);
   event_active (w->reap_ev, EV_TIMEOUT, 0);
}

/* The whole request took longer than timeout_ms: cancel it (libevent
 * frees the request and calls only the error callback) and report a
 * timeout through the ordinary retry path. */
static void
req_deadline_cb (evutil_socket_t fd, short what, void *arg)
{
   webhook_req_t *r = arg;
   webhook_t *w = r->w;
   webhook_result_t res;

   (void) fd;
   (void) what;
   if (r->done)
      return;
   r->done = true;
   if (r->req) {
      struct evhttp_request *req = r->req;
      r->req = NULL;
      evhttp_cancel_request (req);
   }
   memset (&res, 0, sizeof res);
   res.status = 0;
   res.retry_after_ms = -1;
   res.outcome = webhook_classify (0, w->retry_4xx);
   snprintf (res.error, sizeof res.error, "timeout: no complete answer within %" PRId64 " ms (%s:%d)", w->timeout_ms, w->host, w->port);
   r->cb (&res, r->arg);
   event_active (w->reap_ev, EV_TIMEOUT, 0);
}

SSL_CTX *
webhook_ssl_ctx_new (bson_error_t *error)
{
   SSL_CTX *ctx = SSL_CTX_new (TLS_client_method ());

   if (!ctx) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 4, "SSL_CTX_new failed");
      return NULL;
   }
   SSL_CTX_set_min_proto_version (ctx, TLS1_2_VERSION);
   SSL_CTX_set_verify (ctx, SSL_VERIFY_PEER, NULL);
   if (SSL_CTX_set_default_verify_paths (ctx) != 1)
      log_warn ("webhook: no default CA paths; https webhooks will fail verification");
   return ctx;
}

webhook_req_t *
webhook_send (webhook_t *w,
              const char *msg_id,
              int64_t timestamp_s,
              const format_msg_t *msg,
              webhook_done_cb_t cb,
              void *arg,
              bson_error_t *error)
{
   webhook_req_t *r = bson_malloc0 (sizeof *r);
   struct bufferevent *bev = NULL;
   struct evhttp_request *req;
   struct evkeyvalq *h;
   struct timeval tv = clock_timeval_ms (w->timeout_ms);
   char ts[32], hostport[300];

   r->w = w;
   r->cb = cb;
   r->arg = arg;
   if (w->https) {
      SSL *ssl = SSL_new (w->ssl);
      if (!ssl) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 5, "SSL_new failed");
         bson_free (r);
         return NULL;
      }
      /* Without the name or address to verify, any certificate the CAs
       * signed would do: refuse to send rather than go on unchecked. */
      if (webhook_host_is_ip (w->host)) {
         /* No SNI for an address (RFC 6066); the certificate must list it
          * as an IP address. */
         if (X509_VERIFY_PARAM_set1_ip_asc (SSL_get0_param (ssl), w->host) != 1) {
            bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 9, "TLS: cannot set the address %s to verify the certificate against", w->host);
            SSL_free (ssl);
            bson_free (r);
            return NULL;
         }
      } else if (SSL_set_tlsext_host_name (ssl, w->host) != 1 /* SNI */ ||
                 SSL_set1_host (ssl, w->host) != 1 /* the certificate must name it */) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 9, "TLS: cannot set the host name %s to verify the certificate against", w->host);
         SSL_free (ssl);
         bson_free (r);
         return NULL;
      }
      bev = bufferevent_openssl_socket_new (w->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, BEV_OPT_CLOSE_ON_FREE);
      if (!bev) {
         SSL_free (ssl);
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 6, "cannot create a TLS bufferevent");
         bson_free (r);
         return NULL;
      }
      bufferevent_openssl_set_allow_dirty_shutdown (bev, 1);
   }
   r->conn = evhttp_connection_base_bufferevent_new (w->base, w->dns, bev, w->host, (unsigned short) w->port);
   if (!r->conn) {
      if (bev)
         bufferevent_free (bev);
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 7, "cannot create an HTTP connection to %s:%d", w->host, w->port);
      bson_free (r);
      return NULL;
   }
   evhttp_connection_set_timeout_tv (r->conn, &tv);
   evhttp_connection_set_retries (r->conn, 0);
   /* Only the status and the start of the body matter: bound what an
    * endpoint can make us buffer. */
   evhttp_connection_set_max_headers_size (r->conn, WEBHOOK_MAX_HEADERS_SIZE);
   evhttp_connection_set_max_body_size (r->conn, WEBHOOK_MAX_BODY_SIZE);
   r->deadline = evtimer_new (w->base, req_deadline_cb, r);
   req = evhttp_request_new (req_done_cb, r);
   if (!r->deadline || !req) {
      if (req)
         evhttp_request_free (req);
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 10, "cannot create a request to %s:%d", w->host, w->port);
      req_free (r);
      return NULL;
   }
   evhttp_request_set_error_cb (req, req_error_cb);
   h = evhttp_request_get_output_headers (req);
   if ((w->https && w->port == 443) || (!w->https && w->port == 80))
      snprintf (hostport, sizeof hostport, "%s", w->host);
   else
      snprintf (hostport, sizeof hostport, "%s:%d", w->host, w->port);
   evhttp_add_header (h, "Host", hostport);
   evhttp_add_header (h, "Content-Type", msg->content_type);
   for (size_t i = 0; i < msg->n_headers; i++)
      evhttp_add_header (h, msg->headers[i].name, msg->headers[i].value);
   evhttp_add_header (h, "User-Agent", "relaybus-proxy");
   evhttp_add_header (h, "Connection", "close");
   snprintf (ts, sizeof ts, "%" PRId64, timestamp_s);
   evhttp_add_header (h, "webhook-id", msg_id);
   evhttp_add_header (h, "webhook-timestamp", ts);
   if (w->keys.n > 0) {
      char sig[WEBHOOK_SIGNATURES_MAX];
      webhook_sign_all (&w->keys, msg_id, timestamp_s, msg->body, msg->body_len, sig);
      evhttp_add_header (h, "webhook-signature", sig);
   }
   evbuffer_add (evhttp_request_get_output_buffer (req), msg->body, msg->body_len);
   r->next = w->reqs;
   w->reqs = r;
   if (evhttp_make_request (r->conn, req, EVHTTP_REQ_POST, w->path) != 0) {
      /* libevent freed the request; the connection is ours. */
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, 8, "cannot start a request to %s:%d", w->host, w->port);
      r->done = true;
      event_active (w->reap_ev, EV_TIMEOUT, 0);
      return NULL;
   }
   r->req = req;
   evtimer_add (r->deadline, &tv);
   return r;
}

void
webhook_cancel (webhook_req_t *r)
{
   if (!r || r->done)
      return;
   r->done = true;
   r->req = NULL;
   if (r->deadline)
      event_del (r->deadline);
   /* Freeing the connection frees its request without calling back. */
   event_active (r->w->reap_ev, EV_TIMEOUT, 0);
}

/* ------------------------------------------------- the handler interface */

/* webhook as a transport (dispatch/transport.h): the rendered message
 * through webhook_send, the answer's class as the result.  The
 * webhook-id is the delivery id; the timestamp is the send's. */

/* One send: the caller's callback around a webhook request.  Freed after
 * the callback ran, or by a cancel. */
typedef struct {
   webhook_req_t *req;
   transport_done_cb_t cb;
   void *arg;
} webhook_treq_t;

static void *
webhook_t_start (const transport_env_t *env, const config_handler_t *h, bson_error_t *error)
{
   return webhook_new (env->base, env->dns, env->ssl, h, error);
}

static void
webhook_t_done (const webhook_result_t *res, void *arg)
{
   webhook_treq_t *t = arg;
   transport_result_t out = {.outcome = TRANSPORT_OUTCOME_RETRY, .retry_after_ms = -1};

   switch (res->outcome) {
   case WEBHOOK_OUTCOME_COMPLETE:
      out.outcome = TRANSPORT_OUTCOME_OK;
      break;
   case WEBHOOK_OUTCOME_RETRY_AFTER:
      out.retry_after_ms = res->retry_after_ms >= 0 ? res->retry_after_ms : -1;
      break;
   case WEBHOOK_OUTCOME_DEAD:
      out.outcome = TRANSPORT_OUTCOME_DEAD;
      break;
   case WEBHOOK_OUTCOME_RETRY:
   default:
      break;
   }
   bson_strncpy (out.error, res->error, sizeof out.error);
   t->req = NULL;
   t->cb (&out, t->arg);
   bson_free (t);
}

static void *
webhook_t_send (void *impl, const store_delivery_t *d, const format_msg_t *m, transport_done_cb_t cb, void *arg, bson_error_t *error)
{
   webhook_treq_t *t = bson_malloc0 (sizeof *t);
   char hex[25];

   bson_oid_to_string (&d->id, hex);
   t->cb = cb;
   t->arg = arg;
   t->req = webhook_send (impl, hex, clock_now_ms () / 1000, m, webhook_t_done, t, error);
   if (!t->req) {
      bson_free (t);
      return NULL;
   }
   return t;
}

static void
webhook_t_cancel (void *impl, void *req)
{
   webhook_treq_t *t = req;

   (void) impl;
   webhook_cancel (t->req);
   bson_free (t);
}

static transport_state_t
webhook_t_state (void *impl, char *detail, size_t detail_len)
{
   (void) impl;
   (void) detail;
   (void) detail_len;
   return TRANSPORT_STATE_NONE; /* a connection per request */
}

static void
webhook_t_destroy (void *impl)
{
   webhook_destroy (impl);
}

/* What webhook_new copies: url, secret, timeout, retry_4xx. */
static bool
webhook_t_settings_equal (const config_handler_t *a, const config_handler_t *b)
{
   return !strcmp (a->url ? a->url : "", b->url ? b->url : "") &&
          !strcmp (a->secret ? a->secret : "", b->secret ? b->secret : "") && a->timeout_ms == b->timeout_ms &&
          a->retry_4xx == b->retry_4xx;
}

const transport_ops_t transport_webhook_ops = {
   .kind = "webhook",
   .start = webhook_t_start,
   .send = webhook_t_send,
   .cancel = webhook_t_cancel,
   .state = webhook_t_state,
   .destroy = webhook_t_destroy,
   .settings_equal = webhook_t_settings_equal,
};
