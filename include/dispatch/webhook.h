/*
 * dispatch/webhook.h - webhook deliveries: Standard Webhooks signatures,
 * the retry policy (status classes, Retry-After) and the HTTP client.  The
 * body and the retry schedule are every kind's (dispatch/delivery.h).
 *
 * The client uses libevent's evhttp on the event base it is given (the
 * dispatcher's own thread, never the forwarding loop), with OpenSSL for
 * https (certificate verification against the system store, host name
 * check, SNI).  One connection per request: no keep-alive state to get
 * wrong across retries and TLS.  The pure functions (signature, secret,
 * Retry-After, classification, error text) are what the unit tests
 * check.
 *
 * Thread: the client on the dispatcher's; the pure functions on any.
 */
#ifndef RELAYBUS_WEBHOOK_H
#define RELAYBUS_WEBHOOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "base/config.h"
#include "dispatch/format.h"
#include "store/store.h"
#include "base/errors.h"

#define WEBHOOK_KEY_MAX 128
/* "v1," + base64 of 32 bytes (44) + NUL, with room. */
#define WEBHOOK_SIGNATURE_MAX 64
/* A Retry-After further away than this is cut to it. */
#define WEBHOOK_RETRY_AFTER_MAX_MS (24 * 3600 * 1000LL)
/* Limits on what an endpoint's answer may make the proxy buffer. */
#define WEBHOOK_MAX_HEADERS_SIZE (16 * 1024)
#define WEBHOOK_MAX_BODY_SIZE (64 * 1024)
/* Bytes of a failing answer's body kept as the delivery's lastError. */
#define WEBHOOK_ERROR_BODY_MAX 200
/* lastError texts (webhook_result_t.error) are at most this long. */
#define WEBHOOK_ERROR_MAX 256

/* --------------------------------------------------------- pure helpers */

/* The HMAC key of a secret: the base64 part after "whsec_" decoded.
 * False if the prefix is missing, the base64 is invalid or the key is
 * empty or longer than WEBHOOK_KEY_MAX. */
bool webhook_secret_decode (const char *secret, uint8_t key[WEBHOOK_KEY_MAX], size_t *key_len)
   __attribute__ ((warn_unused_result));

/* A handler's `secret` value: up to WEBHOOK_SECRETS_MAX secrets separated
 * by white space, so that receivers can rotate (each request carries one
 * signature per secret, in this order). */
#define WEBHOOK_SECRETS_MAX 8
typedef struct {
   size_t n;
   size_t len[WEBHOOK_SECRETS_MAX];
   uint8_t key[WEBHOOK_SECRETS_MAX][WEBHOOK_KEY_MAX];
} webhook_keys_t;

/* Decodes every secret of `secrets` into `keys` (n = 0 for an empty or
 * blank value).  False with `error` saying which secret (by position) is
 * wrong and why; the message never contains a secret. */
bool webhook_secrets_parse (const char *secrets, webhook_keys_t *keys, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* True when webhook_secrets_parse accepts `secrets`; the keys it decoded
 * are wiped (the configuration's check, config_set_checks). */
bool webhook_secrets_valid (const char *secrets, bson_error_t *error) __attribute__ ((warn_unused_result));

/* "v1,<base64 HMAC-SHA256(key, id + "." + timestamp + "." + body)>". */
void webhook_sign (const uint8_t *key,
                   size_t key_len,
                   const char *msg_id,
                   int64_t timestamp_s,
                   const char *body,
                   size_t body_len,
                   char out[WEBHOOK_SIGNATURE_MAX]);

/* The webhook-signature header value: one signature per key, separated
 * by a space, in the order of `keys`.  Empty when keys->n is 0. */
#define WEBHOOK_SIGNATURES_MAX (WEBHOOK_SECRETS_MAX * WEBHOOK_SIGNATURE_MAX)
void webhook_sign_all (const webhook_keys_t *keys,
                       const char *msg_id,
                       int64_t timestamp_s,
                       const char *body,
                       size_t body_len,
                       char out[WEBHOOK_SIGNATURES_MAX]);

/* Retry-After as delay seconds or an HTTP date (IMF-fixdate, RFC 850 or
 * asctime), relative to now_ms; clamped to [0, WEBHOOK_RETRY_AFTER_MAX_MS]. */
bool webhook_parse_retry_after (const char *value, int64_t now_ms, int64_t *delay_ms)
   __attribute__ ((warn_unused_result));

typedef enum {
   WEBHOOK_OUTCOME_COMPLETE,    /* 2xx */
   WEBHOOK_OUTCOME_RETRY,       /* 5xx, timeouts, connection errors (and 4xx with retry_4xx) */
   WEBHOOK_OUTCOME_RETRY_AFTER, /* 429, 503: Retry-After if given, else backoff */
   WEBHOOK_OUTCOME_DEAD,        /* other 4xx (and 1xx/3xx) */
} webhook_outcome_t;

const char *webhook_outcome_name (webhook_outcome_t o);
/* status 0 means no HTTP answer (connection error or timeout). */
webhook_outcome_t webhook_classify (int status, bool retry_4xx);

/* The lastError of a failing answer: "HTTP <status>" then ": " and the
 * start of the body, at most WEBHOOK_ERROR_BODY_MAX bytes of it once made
 * safe to store and show: cut before a character that would not fit (a
 * multibyte character straddling the limit is left out whole), control
 * characters as spaces, bytes that are not UTF-8 as U+FFFD.  `body` is
 * what the endpoint sent, any bytes (give at least
 * WEBHOOK_ERROR_BODY_MAX + 3 when there are, so a character crossing the
 * limit is seen whole).  `out` always ends up valid UTF-8. */
void webhook_error_text (int status, const char *body, size_t body_len, char *out, size_t out_len);

/* ------------------------------------------------------------ the client */

/* True for an IPv4 or IPv6 literal (verified as an IP SAN, sent without
 * SNI). */
bool webhook_host_is_ip (const char *host);

typedef struct webhook webhook_t;
typedef struct webhook_req webhook_req_t;

typedef struct {
   webhook_outcome_t outcome;
   int status;                /* 0: no answer */
   int64_t retry_after_ms;    /* -1: none given */
   char error[WEBHOOK_ERROR_MAX]; /* for lastError when not complete */
} webhook_result_t;

typedef void (*webhook_done_cb_t) (const webhook_result_t *result, void *arg);

/* A client for one handler.  `ssl` (may be NULL for http-only) and `dns`
 * are borrowed; the handler's strings are copied. */
webhook_t *webhook_new (struct event_base *base,
                        struct evdns_base *dns,
                        SSL_CTX *ssl,
                        const config_handler_t *handler,
                        bson_error_t *error) __attribute__ ((warn_unused_result));
void webhook_destroy (webhook_t *w);

/* POSTs msg's body, with its content type and headers (dispatch/format.h,
 * the HTTP binding; copied) and the Standard Webhooks headers, whose
 * signature signs that body.  cb runs exactly once on the base's thread,
 * unless the request is cancelled first.  Returns NULL (and calls
 * nothing) if the request cannot be started; `error` says why. */
webhook_req_t *webhook_send (webhook_t *w,
                             const char *msg_id,
                             int64_t timestamp_s,
                             const format_msg_t *msg,
                             webhook_done_cb_t cb,
                             void *arg,
                             bson_error_t *error);
/* Abandons a request in flight: cb will not run; its connection is
 * closed. */
void webhook_cancel (webhook_req_t *req);

/* An SSL_CTX for https webhooks: TLS 1.2+, peer verification against the
 * default paths. */
SSL_CTX *webhook_ssl_ctx_new (bson_error_t *error);

#endif /* RELAYBUS_WEBHOOK_H */
