/*
 * dispatch/webhook.c - webhook deliveries: Standard Webhooks signature, retry
 * policy (status classes, Retry-After), the checks of a handler's headers,
 * proxy and TLS files, and the HTTP client (libcurl's multi-socket
 * interface on the dispatcher's event base).
 *
 * It knows nothing of the store: as the webhook kind of the handler
 * interface (transport_webhook_ops, at the end), it sends a claimed
 * delivery as rendered for HTTP (dispatch/format.h: the body, its content
 * type and the headers of the handler's format), and maps the answer to
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
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "base/log.h"
#include "base/utf8.h"
#include "dispatch/delivery.h"
#include "dispatch/transport.h"

/* POSTs msg's body, with its content type and headers (dispatch/format.h,
 * the HTTP binding; copied) and the Standard Webhooks headers, whose
 * signature signs that body.  cb runs exactly once on the base's thread,
 * unless the request is cancelled first.  Returns NULL (and calls
 * nothing) if the request cannot be started; `error` says why. */
static webhook_req_t *webhook_send (webhook_t *w,
                             const char *msg_id,
                             int64_t timestamp_s,
                             const format_msg_t *msg,
                             webhook_done_cb_t cb,
                             void *arg,
                             bson_error_t *error);

/* A client for one handler; `base` is borrowed, the handler's strings are
 * copied.  NULL with `error` for a URL that is not http(s), a bad secret,
 * unusable TLS files or a libcurl webhook_curl_check refuses. */
static webhook_t *webhook_new (struct event_base *base, const config_handler_t *handler, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* NULL ok.  Requests still in flight are abandoned without a callback.
 * May be called from a request's callback. */
static void webhook_destroy (webhook_t *w);

/* False, with a message for the operator, when the linked libcurl cannot
 * serve webhooks without blocking: it lacks AsynchDNS (a synchronous
 * resolver would stop the dispatcher's loop) or TLS.  Checked at start. */
static bool webhook_curl_check (bson_error_t *error) __attribute__ ((warn_unused_result));

/* Abandons a request in flight: cb will not run; its connection is
 * closed unless curl can keep it. */
static void webhook_cancel (webhook_req_t *req);

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
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_SECRETS, "more than %d secrets", WEBHOOK_SECRETS_MAX);
         goto fail;
      }
      st = secret_decode_n (p, len, keys->key[count - 1], &keys->len[count - 1]);
      if (st != SECRET_OK) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_SECRETS, "secret %zu of the list %s", count, why[st]);
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
   [WEBHOOK_OUTCOME_GONE] = "gone",
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
   /* 410 Gone: the endpoint was removed; as Svix does, the handler is
    * disabled (its deliveries wait) rather than each delivery failed. */
   if (status == 410)
      return WEBHOOK_OUTCOME_GONE;
   /* A 4xx during a receiver's deploy (401, 404) heals by itself; a 3xx
    * (redirects are not followed) is a failure to retry too, as Svix
    * treats them.  retry_4xx = false keeps the former rule: the request
    * itself is wrong, bury it. */
   return retry_4xx ? WEBHOOK_OUTCOME_RETRY : WEBHOOK_OUTCOME_DEAD;
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

/* The client is libcurl's multi interface driven by the dispatcher's event
 * base (the "multi-socket" API): curl says which sockets to watch and when
 * its next timeout is due (socket_cb, timer_cb); libevent's events call
 * curl_multi_socket_action when they fire, and finished transfers are
 * collected after each call (transfers_reap).  No curl call waits: name
 * resolution runs on curl's threaded resolver (webhook_curl_check refuses
 * a libcurl without AsynchDNS), connecting and TLS are non-blocking.
 *
 * One multi per handler: its connection cache holds at most `concurrency`
 * connections to the endpoint, reused from one delivery to the next
 * (HTTP/1.1 keep-alive, or HTTP/2 streams on one connection where the
 * endpoint offers h2 over TLS); its share handle keeps TLS sessions and
 * resolved names across connections. */

/* One watched socket: curl_multi_assign links it to curl's socket, and
 * socket_cb frees it when curl is done with the socket.  On the handler's
 * list so that webhook_destroy frees any that curl does not report. */
typedef struct webhook_sock {
   struct webhook_sock *next, **prevp;
   webhook_t *w;
   curl_socket_t fd;
   short events; /* what ev watches */
   struct event *ev;
} webhook_sock_t;

/* One request: its easy handle, the headers and the body it sends (curl
 * reads them while the transfer runs: owned here until it ends), and what
 * is kept of the answer. */
struct webhook_req {
   webhook_req_t *next, **prevp;
   webhook_t *w;
   CURL *easy;
   struct curl_slist *headers;
   char *body;
   size_t body_len;
   webhook_done_cb_t cb;
   void *arg;
   /* The answer: the start of its body (lastError, the attempt's record),
    * its Retry-After, and the sizes the caps are checked against. */
   char answer[WEBHOOK_RESPONSE_MAX + 3];
   size_t answer_len;
   size_t body_seen, header_seen;
   char retry_after[64];
   bool body_too_long, headers_too_long;
   char curl_error[CURL_ERROR_SIZE];
};

/* A handler's client.  Owns its multi and share handles, its strings, its
 * requests in flight and its watched sockets.  Freed by webhook_destroy. */
struct webhook {
   struct event_base *base;
   CURLM *multi;
   CURLSH *share;
   struct event *timer;
   struct event *kick; /* reaps what a send's first step finished (kick_cb) */
   char *name;
   char *url;
   char *host; /* for error texts: host and port, never the userinfo */
   int port;
   bool https;
   char *ca_file, *cert_file, *key_file; /* NULL: not set */
   char *proxy;                          /* NULL: the environment's (https_proxy, no_proxy) */
   struct curl_slist *extra;             /* the header.* lines, "Name: value" */
   webhook_keys_t keys;                  /* keys.n == 0: requests are not signed */
   int64_t timeout_ms;
   bool retry_4xx;
   /* Inside transfers_reap: a callback that destroys the client (a reload
    * freeing a replaced handler) leaves the freeing to transfers_reap. */
   bool reaping;
   bool destroy_pending;
   webhook_req_t *reqs;
   webhook_sock_t *socks;
};

bool
webhook_header_valid (const char *name, const char *value, bson_error_t *error)
{
   static const char *const reserved[] = {"host", "content-type", "content-length", "transfer-encoding", "connection",
                                          "expect", "webhook-id", "webhook-timestamp", "webhook-signature"};
   size_t n = strlen (name);

   if (n == 0 || n > 64) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_HEADER, "a header name is 1 to 64 bytes");
      return false;
   }
   for (size_t i = 0; i < n; i++) {
      unsigned char c = (unsigned char) name[i];
      if (!(isalnum (c) || (c && strchr ("!#$%&'*+-.^_`|~", c)))) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_HEADER,
                         "'%s' is not an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~ only; no colon, space "
                         "or line break)",
                         name);
         return false;
      }
   }
   for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
      if (strcasecmp (name, reserved[i]) == 0) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_HEADER, "set by the proxy; it cannot be configured");
         return false;
      }
   if (strlen (value) > 1024) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_HEADER, "the value is longer than 1024 bytes");
      return false;
   }
   for (const char *p = value; *p; p++)
      if ((iscntrl ((unsigned char) *p) && *p != '\t') || *p == 0x7f) {
         /* A line break would end the header and start another one. */
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_HEADER, "the value has a line break or a control character");
         return false;
      }
   return true;
}

bool
webhook_proxy_valid (const char *url, bson_error_t *error)
{
   CURLU *u = curl_url ();
   char *scheme = NULL, *host = NULL;
   bool ok = u && curl_url_set (u, CURLUPART_URL, url, 0) == CURLUE_OK &&
             curl_url_get (u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
             curl_url_get (u, CURLUPART_HOST, &host, 0) == CURLUE_OK && *host &&
             (strcasecmp (scheme, "http") == 0 || strcasecmp (scheme, "https") == 0);

   if (!ok)
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_PROXY, "is not an http:// or https:// URL (http://host:port)");
   curl_free (scheme);
   curl_free (host);
   curl_url_cleanup (u);
   return ok;
}

static bool
webhook_curl_check (bson_error_t *error)
{
   const curl_version_info_data *v = curl_version_info (CURLVERSION_NOW);

   /* Without an asynchronous resolver, curl resolves names in the calling
    * thread: one slow DNS server would stop every delivery and the
    * dispatcher's leases with it. */
   if (!(v->features & CURL_VERSION_ASYNCHDNS)) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_LIBCURL,
                      "libcurl %s resolves names synchronously (no AsynchDNS feature); webhooks need a libcurl built "
                      "with the threaded resolver or c-ares (Debian's libcurl4-openssl-dev has it)",
                      v->version);
      return false;
   }
   if (!(v->features & CURL_VERSION_SSL)) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_LIBCURL_TLS, "libcurl %s has no TLS support; webhooks need it for https",
                      v->version);
      return false;
   }
   return true;
}

static int
tls_no_passphrase (char *buf, int size, int rwflag, void *u)
{
   (void) buf;
   (void) size;
   (void) rwflag;
   (void) u;
   return 0; /* an encrypted key is refused, never prompted for */
}

static void
tls_error (bson_error_t *error, const char *what, const char *file)
{
   char reason[160] = "";
   unsigned long e = ERR_peek_last_error ();

   if (e)
      ERR_error_string_n (e, reason, sizeof reason);
   ERR_clear_error ();
   bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_TLS_FILE, "%s '%s'%s%s", what, file, *reason ? ": " : "", reason);
}

bool
webhook_tls_files_valid (const char *ca_file, const char *cert_file, const char *key_file, bson_error_t *error)
{
   SSL_CTX *ctx = SSL_CTX_new (TLS_client_method ());
   bool ok = false;

   if (!ctx) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_TLS, "SSL_CTX_new failed");
      return false;
   }
   SSL_CTX_set_default_passwd_cb (ctx, tls_no_passphrase);
   if (ca_file && *ca_file && SSL_CTX_load_verify_locations (ctx, ca_file, NULL) != 1) {
      tls_error (error, "tls_ca_file: no PEM certificate can be read from", ca_file);
      goto done;
   }
   if (cert_file && *cert_file && SSL_CTX_use_certificate_chain_file (ctx, cert_file) != 1) {
      tls_error (error, "tls_cert_file: no PEM certificate chain can be read from", cert_file);
      goto done;
   }
   if (key_file && *key_file && SSL_CTX_use_PrivateKey_file (ctx, key_file, SSL_FILETYPE_PEM) != 1) {
      /* OpenSSL checks the key against the certificate as it loads it. */
      if (ERR_GET_REASON (ERR_peek_last_error ()) == X509_R_KEY_VALUES_MISMATCH)
         tls_error (error, "tls_key_file: the key does not match the certificate of tls_cert_file, in", key_file);
      else
         tls_error (error, "tls_key_file: no unencrypted PEM private key can be read from", key_file);
      goto done;
   }
   if (cert_file && *cert_file && key_file && *key_file && SSL_CTX_check_private_key (ctx) != 1) {
      tls_error (error, "tls_key_file: the key does not match the certificate of tls_cert_file, in", key_file);
      goto done;
   }
   ok = true;

done:
   ERR_clear_error ();
   SSL_CTX_free (ctx);
   return ok;
}

static void transfers_reap (webhook_t *w);

static void
sock_event_cb (evutil_socket_t fd, short what, void *arg)
{
   webhook_t *w = arg;
   int flags = (what & EV_READ ? CURL_CSELECT_IN : 0) | (what & EV_WRITE ? CURL_CSELECT_OUT : 0);
   int running = 0;

   curl_multi_socket_action (w->multi, fd, flags, &running);
   transfers_reap (w);
}

static void
timer_event_cb (evutil_socket_t fd, short what, void *arg)
{
   webhook_t *w = arg;
   int running = 0;

   (void) fd;
   (void) what;
   curl_multi_socket_action (w->multi, CURL_SOCKET_TIMEOUT, 0, &running);
   transfers_reap (w);
}

static void
kick_cb (evutil_socket_t fd, short what, void *arg)
{
   (void) fd;
   (void) what;
   transfers_reap (arg);
}

static void
sock_free (webhook_sock_t *s)
{
   event_free (s->ev);
   *s->prevp = s->next;
   if (s->next)
      s->next->prevp = s->prevp;
   bson_free (s);
}

/* CURLMOPT_SOCKETFUNCTION: watch `fd` for what curl waits for, or stop. */
static int
socket_cb (CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
   webhook_t *w = userp;
   webhook_sock_t *s = socketp;
   short events = (what & CURL_POLL_IN ? EV_READ : 0) | (what & CURL_POLL_OUT ? EV_WRITE : 0);

   (void) easy;
   if (what == CURL_POLL_REMOVE) {
      if (s) {
         curl_multi_assign (w->multi, fd, NULL);
         sock_free (s);
      }
      return 0;
   }
   if (!s) {
      s = bson_malloc0 (sizeof *s);
      s->w = w;
      s->fd = fd;
      s->next = w->socks;
      s->prevp = &w->socks;
      if (w->socks)
         w->socks->prevp = &s->next;
      w->socks = s;
      curl_multi_assign (w->multi, fd, s);
   } else if (s->events == events) {
      return 0;
   } else {
      event_free (s->ev);
   }
   s->events = events;
   s->ev = event_new (w->base, fd, events | EV_PERSIST, sock_event_cb, w);
   if (!s->ev || event_add (s->ev, NULL) != 0) {
      log_error ("webhook %s: cannot watch a socket", w->name);
      return -1;
   }
   return 0;
}

/* CURLMOPT_TIMERFUNCTION: curl's next timeout.  Never acts at once: curl
 * must not be re-entered from its own callback. */
static int
timer_cb (CURLM *multi, long timeout_ms, void *userp)
{
   webhook_t *w = userp;
   struct timeval tv;

   (void) multi;
   if (timeout_ms < 0) {
      evtimer_del (w->timer);
      return 0;
   }
   tv = clock_timeval_ms (timeout_ms);
   return evtimer_add (w->timer, &tv) == 0 ? 0 : -1;
}

/* CURLOPT_CLOSESOCKETFUNCTION: a socket of this handler is closed.  Its
 * event goes first: every handler's sockets share the dispatcher's base,
 * and an event left on a closed descriptor would keep libevent believing
 * the number watched, so that the next socket given the same number (by
 * another handler's connect) would never be added to epoll, and its
 * request would wait for its timeout. */
static int
closesocket_cb (void *arg, curl_socket_t fd)
{
   webhook_t *w = arg;

   for (webhook_sock_t *s = w->socks; s; s = s->next)
      if (s->fd == fd) {
         curl_multi_assign (w->multi, fd, NULL);
         sock_free (s);
         break;
      }
   return close (fd);
}

/* CURLOPT_HEADERFUNCTION: one header line of the answer.  Keeps
 * Retry-After; a line of an interim (1xx) answer starts a new count. */
static size_t
header_cb (char *line, size_t size, size_t n, void *arg)
{
   webhook_req_t *r = arg;
   size_t len = size * n;
   static const char ra[] = "retry-after:";

   r->header_seen += len;
   if (r->header_seen > WEBHOOK_MAX_HEADERS_SIZE) {
      r->headers_too_long = true;
      return 0; /* curl ends the transfer: CURLE_WRITE_ERROR */
   }
   if (len >= 5 && !strncmp (line, "HTTP/", 5)) {
      r->retry_after[0] = '\0';
   } else if (len > sizeof ra - 1 && !strncasecmp (line, ra, sizeof ra - 1)) {
      const char *v = line + sizeof ra - 1, *end = line + len;
      size_t k;

      while (v < end && (*v == ' ' || *v == '\t'))
         v++;
      while (end > v && isspace ((unsigned char) end[-1]))
         end--;
      k = (size_t) (end - v) < sizeof r->retry_after - 1 ? (size_t) (end - v) : sizeof r->retry_after - 1;
      memcpy (r->retry_after, v, k);
      r->retry_after[k] = '\0';
   }
   return len;
}

/* CURLOPT_WRITEFUNCTION: the answer's body.  Only its start is kept (for
 * lastError and the attempt's record); a body longer than
 * WEBHOOK_MAX_BODY_SIZE ends the transfer. */
static size_t
body_cb (char *data, size_t size, size_t n, void *arg)
{
   webhook_req_t *r = arg;
   size_t len = size * n;

   r->body_seen += len;
   if (r->body_seen > WEBHOOK_MAX_BODY_SIZE) {
      r->body_too_long = true;
      return 0;
   }
   if (r->answer_len < sizeof r->answer) {
      size_t k = sizeof r->answer - r->answer_len < len ? sizeof r->answer - r->answer_len : len;
      memcpy (r->answer + r->answer_len, data, k);
      r->answer_len += k;
   }
   return len;
}

static void
req_free (webhook_req_t *r)
{
   if (r->easy) {
      curl_multi_remove_handle (r->w->multi, r->easy);
      curl_easy_cleanup (r->easy);
   }
   curl_slist_free_all (r->headers);
   bson_free (r->body);
   *r->prevp = r->next;
   if (r->next)
      r->next->prevp = r->prevp;
   bson_free (r);
}

/* The result of a finished transfer. */
static void
req_result (webhook_req_t *r, CURLcode code, webhook_result_t *res)
{
   webhook_t *w = r->w;
   long status = 0;

   memset (res, 0, sizeof *res);
   res->retry_after_ms = -1;
   if (code == CURLE_OK)
      curl_easy_getinfo (r->easy, CURLINFO_RESPONSE_CODE, &status);
   res->status = (int) status;
   res->outcome = webhook_classify (res->status, w->retry_4xx);
   if (code == CURLE_OK) {
      /* What the endpoint answered, for the attempt's record, whatever
       * its status: receivers debug their endpoints from it. */
      if (r->answer_len > 0)
         utf8_sanitize (r->answer, r->answer_len, res->response, sizeof res->response, 0);
      if (res->outcome == WEBHOOK_OUTCOME_COMPLETE)
         return;
      webhook_error_text (res->status, r->answer, r->answer_len, res->error, sizeof res->error);
      if (r->retry_after[0] && res->outcome == WEBHOOK_OUTCOME_RETRY_AFTER &&
          !webhook_parse_retry_after (r->retry_after, clock_now_ms (), &res->retry_after_ms))
         res->retry_after_ms = -1;
      return;
   }
   /* No complete answer: retried as a connection error. */
   res->timed_out = code == CURLE_OPERATION_TIMEDOUT;
   if (code == CURLE_OPERATION_TIMEDOUT)
      snprintf (res->error, sizeof res->error, "timeout: no complete answer within %" PRId64 " ms (%s:%d)",
                w->timeout_ms, w->host, w->port);
   else if (r->headers_too_long)
      snprintf (res->error, sizeof res->error, "answer too long: more than %d bytes of headers (%s:%d)",
                WEBHOOK_MAX_HEADERS_SIZE, w->host, w->port);
   else if (r->body_too_long)
      snprintf (res->error, sizeof res->error, "answer too long: more than %d bytes of body (%s:%d)",
                WEBHOOK_MAX_BODY_SIZE, w->host, w->port);
   else if (code == CURLE_PEER_FAILED_VERIFICATION)
      snprintf (res->error, sizeof res->error, "TLS: certificate verify failed: %.160s (%s:%d)",
                r->curl_error[0] ? r->curl_error : curl_easy_strerror (code), w->host, w->port);
   else if (code == CURLE_SSL_CONNECT_ERROR || code == CURLE_SSL_CERTPROBLEM || code == CURLE_SSL_CIPHER ||
            code == CURLE_SSL_CACERT_BADFILE || code == CURLE_SSL_ISSUER_ERROR)
      snprintf (res->error, sizeof res->error, "TLS: %.160s (%s:%d)",
                r->curl_error[0] ? r->curl_error : curl_easy_strerror (code), w->host, w->port);
   else
      snprintf (res->error, sizeof res->error, "connection error: %.160s (%s:%d)",
                r->curl_error[0] ? r->curl_error : curl_easy_strerror (code), w->host, w->port);
}

/* Calls back every finished transfer.  A callback may send (the
 * transfer is added to the multi, which curl allows outside its own
 * callbacks) or cancel another request (its pending message, if any, goes
 * with its handle). */
static void
transfers_reap (webhook_t *w)
{
   CURLMsg *msg;
   int left;

   if (w->reaping)
      return;
   w->reaping = true;
   while (!w->destroy_pending && (msg = curl_multi_info_read (w->multi, &left))) {
      webhook_req_t *r = NULL;
      webhook_result_t res;

      if (msg->msg != CURLMSG_DONE)
         continue;
      curl_easy_getinfo (msg->easy_handle, CURLINFO_PRIVATE, (char **) &r);
      BSON_ASSERT (r && r->easy == msg->easy_handle);
      req_result (r, msg->data.result, &res);
      /* Freed before calling back: the callback may cancel or send. */
      {
         webhook_done_cb_t cb = r->cb;
         void *arg = r->arg;
         req_free (r);
         cb (&res, arg);
      }
   }
   w->reaping = false;
   if (w->destroy_pending)
      webhook_destroy (w);
}

static webhook_t *
webhook_new (struct event_base *base, const config_handler_t *h, bson_error_t *error)
{
   webhook_t *w = NULL;
   CURLU *u = curl_url ();
   char *scheme = NULL, *host = NULL, *port = NULL;
   bson_error_t sub;
   long max_conns = h->concurrency > 0 ? h->concurrency : 8;

   if (!webhook_curl_check (error))
      goto done;
   if (!u || curl_url_set (u, CURLUPART_URL, h->url ? h->url : "", 0) != CURLUE_OK ||
       curl_url_get (u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
       curl_url_get (u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !*host ||
       curl_url_get (u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
       (strcasecmp (scheme, "http") != 0 && strcasecmp (scheme, "https") != 0)) {
      char *masked = config_mask ("url", h->url ? h->url : "");
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_URL, "handler %s: url \"%s\" is not an http:// or https:// URL", h->name, masked);
      bson_free (masked);
      goto done;
   }
   w = bson_malloc0 (sizeof *w);
   w->base = base;
   w->name = bson_strdup (h->name);
   w->url = bson_strdup (h->url);
   w->host = bson_strdup (host);
   w->port = atoi (port);
   w->https = strcasecmp (scheme, "https") == 0;
   w->timeout_ms = h->timeout_ms > 0 ? h->timeout_ms : 10000;
   w->retry_4xx = h->retry_4xx;
   w->ca_file = h->tls_ca_file && *h->tls_ca_file ? bson_strdup (h->tls_ca_file) : NULL;
   w->cert_file = h->tls_cert_file && *h->tls_cert_file ? bson_strdup (h->tls_cert_file) : NULL;
   w->key_file = h->tls_key_file && *h->tls_key_file ? bson_strdup (h->tls_key_file) : NULL;
   w->proxy = h->proxy && *h->proxy ? bson_strdup (h->proxy) : NULL;
   for (size_t i = 0; i < h->n_headers; i++) {
      char *line = bson_strdup_printf ("%s: %s", h->headers[2 * i], h->headers[2 * i + 1]);
      struct curl_slist *l = curl_slist_append (w->extra, line);

      bson_free (line);
      if (!l) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_NO_MEMORY, "handler %s: cannot hold its headers", h->name);
         goto fail;
      }
      w->extra = l;
   }
   if (!webhook_secrets_parse (h->secret, &w->keys, &sub)) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_SECRET, "handler %s: secret: %s", h->name, sub.message);
      goto fail;
   }
   /* The files again, as the dispatcher is about to use them (config_load
    * checked them, but a reload may race an operator's edit). */
   if ((w->ca_file || w->cert_file) && !webhook_tls_files_valid (w->ca_file, w->cert_file, w->key_file, &sub)) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_TLS_FILE, "handler %s: %s", h->name, sub.message);
      goto fail;
   }
   w->timer = evtimer_new (base, timer_event_cb, w);
   w->kick = event_new (base, -1, 0, kick_cb, w);
   w->multi = curl_multi_init ();
   w->share = curl_share_init ();
   if (!w->timer || !w->kick || !w->multi || !w->share) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_NO_MEMORY, "handler %s: cannot create the HTTP client", h->name);
      goto fail;
   }
   /* One thread uses the share (the dispatcher's): no lock functions. */
   curl_share_setopt (w->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
   curl_share_setopt (w->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
   curl_multi_setopt (w->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
   curl_multi_setopt (w->multi, CURLMOPT_SOCKETDATA, w);
   curl_multi_setopt (w->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
   curl_multi_setopt (w->multi, CURLMOPT_TIMERDATA, w);
   /* At most `concurrency` connections, kept open between deliveries; the
    * dispatcher never has more requests of the handler in flight. */
   curl_multi_setopt (w->multi, CURLMOPT_MAX_HOST_CONNECTIONS, max_conns);
   curl_multi_setopt (w->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, max_conns);
   curl_multi_setopt (w->multi, CURLMOPT_MAXCONNECTS, max_conns);
   curl_multi_setopt (w->multi, CURLMOPT_PIPELINING, (long) CURLPIPE_MULTIPLEX);
   goto done;

fail:
   webhook_destroy (w);
   w = NULL;
done:
   curl_free (scheme);
   curl_free (host);
   curl_free (port);
   curl_url_cleanup (u);
   return w;
}

static void
webhook_destroy (webhook_t *w)
{
   if (!w)
      return;
   if (w->reaping) {
      w->destroy_pending = true;
      return;
   }
   while (w->reqs)
      req_free (w->reqs);
   if (w->multi)
      curl_multi_cleanup (w->multi); /* closes the cached connections */
   if (w->share)
      curl_share_cleanup (w->share);
   while (w->socks)
      sock_free (w->socks);
   if (w->timer)
      event_free (w->timer);
   if (w->kick)
      event_free (w->kick);
   bson_free (w->name);
   bson_free (w->url);
   bson_free (w->host);
   bson_free (w->ca_file);
   bson_free (w->cert_file);
   bson_free (w->key_file);
   bson_free (w->proxy);
   curl_slist_free_all (w->extra);
   OPENSSL_cleanse (&w->keys, sizeof w->keys);
   bson_free (w);
}

/* Adds a header line to the request's (the list is kept when curl cannot
 * grow it). */
static bool
req_header_line (webhook_req_t *r, const char *line)
{
   struct curl_slist *l = curl_slist_append (r->headers, line);

   if (!l)
      return false;
   r->headers = l;
   return true;
}

/* Adds "Name: value" to the request's headers. */
static bool
req_header (webhook_req_t *r, const char *name, const char *value)
{
   char *line = bson_strdup_printf ("%s: %s", name, value);
   bool ok = req_header_line (r, line);

   bson_free (line);
   return ok;
}

/* The easy handle of one request: every limit of the transfer is set here. */
static bool
req_easy_setup (webhook_t *w, webhook_req_t *r)
{
   CURL *e = r->easy;
   bool ok = true;

   ok &= curl_easy_setopt (e, CURLOPT_URL, w->url) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_PRIVATE, r) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_ERRORBUFFER, r->curl_error) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_NOSIGNAL, 1L) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_CLOSESOCKETFUNCTION, closesocket_cb) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_CLOSESOCKETDATA, w) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_SHARE, w->share) == CURLE_OK;
   /* The body is the one signed: curl sends these bytes as they are. */
   ok &= curl_easy_setopt (e, CURLOPT_POST, 1L) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_POSTFIELDS, r->body) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) r->body_len) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_HTTPHEADER, r->headers) == CURLE_OK;
   /* A redirect is an answer (a 3xx), never followed. */
   ok &= curl_easy_setopt (e, CURLOPT_FOLLOWLOCATION, 0L) == CURLE_OK;
   /* The whole exchange, connect to last byte: an endpoint that trickles
    * or never answers holds the delivery, and its key, this long at most. */
   ok &= curl_easy_setopt (e, CURLOPT_TIMEOUT_MS, (long) w->timeout_ms) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_HEADERFUNCTION, header_cb) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_HEADERDATA, r) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_WRITEFUNCTION, body_cb) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_WRITEDATA, r) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_HTTP_VERSION, (long) CURL_HTTP_VERSION_2TLS) == CURLE_OK;
   ok &= curl_easy_setopt (e, CURLOPT_TCP_KEEPALIVE, 1L) == CURLE_OK;
   /* The url's user:password goes as Basic auth (curl reads it from the
    * URL); only Basic, never offered to another host. */
   ok &= curl_easy_setopt (e, CURLOPT_HTTPAUTH, (long) CURLAUTH_BASIC) == CURLE_OK;
   /* Without a proxy key, curl applies https_proxy, http_proxy and
    * no_proxy of the environment itself. */
   if (w->proxy) {
      ok &= curl_easy_setopt (e, CURLOPT_PROXY, w->proxy) == CURLE_OK;
      ok &= curl_easy_setopt (e, CURLOPT_PROXYTYPE, (long) (strncasecmp (w->proxy, "https:", 6) == 0 ? CURLPROXY_HTTPS : CURLPROXY_HTTP)) == CURLE_OK;
   }
   if (w->https) {
      const char *env_file = getenv ("SSL_CERT_FILE"), *env_dir = getenv ("SSL_CERT_DIR");

      ok &= curl_easy_setopt (e, CURLOPT_SSLVERSION, (long) CURL_SSLVERSION_TLSv1_2) == CURLE_OK;
      /* Wait for the first connection's ALPN to tell whether it takes
       * streams (h2) rather than open more at once.  Only over TLS: ALPN
       * answers in the handshake, where a plain HTTP/1.1 connection is
       * known not to multiplex only once an answer's status line is read,
       * and an endpoint whose answer never gets there (a huge header)
       * would hold every other request waiting for that connection until
       * its timeout. */
      ok &= curl_easy_setopt (e, CURLOPT_PIPEWAIT, 1L) == CURLE_OK;
      /* The certificate and the host name (or IP address) are always
       * checked; no key turns this off. */
      ok &= curl_easy_setopt (e, CURLOPT_SSL_VERIFYPEER, 1L) == CURLE_OK;
      ok &= curl_easy_setopt (e, CURLOPT_SSL_VERIFYHOST, 2L) == CURLE_OK;
      /* Without tls_ca_file, the system's store as OpenSSL finds it
       * (SSL_CERT_FILE and SSL_CERT_DIR honoured, as before libcurl). */
      if (w->ca_file)
         ok &= curl_easy_setopt (e, CURLOPT_CAINFO, w->ca_file) == CURLE_OK;
      else if (env_file && *env_file)
         ok &= curl_easy_setopt (e, CURLOPT_CAINFO, env_file) == CURLE_OK;
      if (!w->ca_file && env_dir && *env_dir)
         ok &= curl_easy_setopt (e, CURLOPT_CAPATH, env_dir) == CURLE_OK;
      if (w->cert_file) {
         ok &= curl_easy_setopt (e, CURLOPT_SSLCERT, w->cert_file) == CURLE_OK;
         ok &= curl_easy_setopt (e, CURLOPT_SSLKEY, w->key_file) == CURLE_OK;
      }
   }
   return ok;
}

static webhook_req_t *
webhook_send (webhook_t *w,
              const char *msg_id,
              int64_t timestamp_s,
              const format_msg_t *msg,
              webhook_done_cb_t cb,
              void *arg,
              bson_error_t *error)
{
   webhook_req_t *r;
   char ts[32];
   bool ok = true;

   /* format_render encodes what a header cannot hold; a name or value
    * that still has a line break is refused here rather than sent, where
    * it would start a header of its own. */
   for (size_t i = 0; i < msg->n_headers; i++)
      if (!format_header_safe (msg->headers[i].name) || !format_header_safe (msg->headers[i].value)) {
         bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_HEADER,
                         "header %.64s: a control character in its name or value; not sent to %s:%d",
                         format_header_safe (msg->headers[i].name) ? msg->headers[i].name : "(name)", w->host, w->port);
         return NULL;
      }
   r = bson_malloc0 (sizeof *r);
   r->w = w;
   r->cb = cb;
   r->arg = arg;
   r->next = w->reqs;
   r->prevp = &w->reqs;
   if (w->reqs)
      w->reqs->prevp = &r->next;
   w->reqs = r;
   r->body = bson_malloc (msg->body_len + 1);
   memcpy (r->body, msg->body, msg->body_len);
   r->body[msg->body_len] = '\0';
   r->body_len = msg->body_len;
   snprintf (ts, sizeof ts, "%" PRId64, timestamp_s);
   ok &= req_header (r, "Content-Type", msg->content_type);
   /* The format's headers (CloudEvents' ce-*, the trace context, the
    * metadata of the payload format), then the handler's own. */
   for (size_t i = 0; i < msg->n_headers && ok; i++)
      ok &= req_header (r, msg->headers[i].name, msg->headers[i].value);
   ok &= req_header (r, "User-Agent", "relaybus-proxy");
   /* curl would wait for a 100 Continue before a body over 1 KiB. */
   ok &= req_header_line (r, "Expect:");
   for (const struct curl_slist *l = w->extra; l && ok; l = l->next)
      ok &= req_header_line (r, l->data);
   ok &= req_header (r, "webhook-id", msg_id);
   ok &= req_header (r, "webhook-timestamp", ts);
   if (w->keys.n > 0) {
      char sig[WEBHOOK_SIGNATURES_MAX];
      webhook_sign_all (&w->keys, msg_id, timestamp_s, r->body, r->body_len, sig);
      ok &= req_header (r, "webhook-signature", sig);
   }
   r->easy = ok ? curl_easy_init () : NULL;
   if (!r->easy || !req_easy_setup (w, r)) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_NO_MEMORY, "cannot create a request to %s:%d", w->host, w->port);
      goto fail;
   }
   if (curl_multi_add_handle (w->multi, r->easy) != CURLM_OK) {
      bson_set_error (error, WEBHOOK_ERROR_DOMAIN, WEBHOOK_ERR_START, "cannot start a request to %s:%d", w->host, w->port);
      curl_easy_cleanup (r->easy);
      r->easy = NULL;
      goto fail;
   }
   /* The connect starts now, as the dispatcher's next store call may keep
    * the base busy for a while, and timeout_ms runs from here.  What this
    * step finishes (a refused connection) is called back from the base,
    * never from within this call. */
   {
      int running = 0;
      curl_multi_socket_action (w->multi, CURL_SOCKET_TIMEOUT, 0, &running);
      event_active (w->kick, EV_TIMEOUT, 0);
   }
   return r;

fail:
   if (r->easy) {
      curl_easy_cleanup (r->easy);
      r->easy = NULL;
   }
   req_free (r);
   return NULL;
}

static void
webhook_cancel (webhook_req_t *r)
{
   if (!r)
      return;
   /* Removing the handle ends the transfer; its connection is closed
    * unless curl can keep it for the next request. */
   req_free (r);
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
   return webhook_new (env->base, h, error);
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
   case WEBHOOK_OUTCOME_GONE:
      out.outcome = TRANSPORT_OUTCOME_GONE;
      break;
   case WEBHOOK_OUTCOME_RETRY:
   default:
      break;
   }
   out.http_status = res->status;
   out.fault = res->timed_out ? TRANSPORT_FAULT_TIMEOUT : TRANSPORT_FAULT_NONE;
   bson_strncpy (out.error, res->error, sizeof out.error);
   bson_strncpy (out.response, res->response, sizeof out.response);
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
   return TRANSPORT_STATE_NONE; /* connections come and go with the requests */
}

static void
webhook_t_destroy (void *impl)
{
   webhook_destroy (impl);
}

static bool
str_equal (const char *a, const char *b)
{
   return !strcmp (a ? a : "", b ? b : "");
}

static bool
headers_equal (const config_handler_t *a, const config_handler_t *b)
{
   if (a->n_headers != b->n_headers)
      return false;
   for (size_t i = 0; i < 2 * a->n_headers; i++)
      if (strcmp (a->headers[i], b->headers[i]) != 0)
         return false;
   return true;
}

/* What webhook_new copies: url, secret, timeout, retry_4xx, the TLS files,
 * concurrency (the size of the connection cache), proxy and headers. */
static bool
webhook_t_settings_equal (const config_handler_t *a, const config_handler_t *b)
{
   if (!str_equal (a->proxy, b->proxy) || !headers_equal (a, b))
      return false;
   return str_equal (a->url, b->url) && str_equal (a->secret, b->secret) && a->timeout_ms == b->timeout_ms &&
          a->retry_4xx == b->retry_4xx && str_equal (a->tls_ca_file, b->tls_ca_file) &&
          str_equal (a->tls_cert_file, b->tls_cert_file) && str_equal (a->tls_key_file, b->tls_key_file) &&
          a->concurrency == b->concurrency;
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
