/*
 * dispatch/webhook.h - webhook deliveries: Standard Webhooks signatures,
 * the retry policy (status classes, Retry-After) and the HTTP client.  The
 * body and the retry schedule are every kind's (dispatch/delivery.h).
 *
 * The client is libcurl's multi interface on the event base it is given
 * (the dispatcher's own thread, never the forwarding loop): curl's sockets
 * and timer are libevent events, names are resolved by curl's threaded
 * resolver, and no call blocks the base.  Each handler has its own multi:
 * at most `concurrency` connections to its endpoint, kept open and reused
 * (HTTP/1.1 keep-alive, or HTTP/2 streams where the endpoint offers h2),
 * TLS sessions resumed.  The certificate and the host name are always
 * verified, against tls_ca_file or the system's store; tls_cert_file and
 * tls_key_file present a client certificate.  A handler's header.* lines
 * are added to each request, the url's user:password goes as Basic auth,
 * and `proxy` (else the environment's https_proxy and no_proxy) is the
 * forward proxy.  Redirects are not followed
 * (a 3xx is an answer), the answer's headers and body are capped, the
 * whole exchange is bounded by timeout_ms.  The pure functions (signature,
 * secret, Retry-After, classification, error text) are what the unit tests
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
#include <event2/event.h>

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

/* Codes of WEBHOOK_ERROR_DOMAIN. */
typedef enum {
   WEBHOOK_ERR_URL = 1,       /* the url is not an http:// or https:// URL */
   WEBHOOK_ERR_SECRET = 2,    /* a signing secret cannot be read */
   WEBHOOK_ERR_TLS = 4,       /* a TLS context cannot be made */
   WEBHOOK_ERR_START = 8,     /* a request cannot be started */
   WEBHOOK_ERR_SECRETS = 9,   /* the list of secrets is too long or malformed */
   WEBHOOK_ERR_NO_MEMORY = 10,
   WEBHOOK_ERR_LIBCURL = 11,  /* the libcurl found lacks asynchronous DNS */
   WEBHOOK_ERR_LIBCURL_TLS = 12, /* the libcurl found has no TLS */
   WEBHOOK_ERR_TLS_FILE = 13, /* a tls_* file is missing, unreadable or does not match */
   WEBHOOK_ERR_HEADER = 14,   /* a header.* name or value is refused */
   WEBHOOK_ERR_PROXY = 15,    /* the proxy key is not a proxy URL */
} webhook_error_code_t;

typedef enum {
   WEBHOOK_OUTCOME_COMPLETE,    /* 2xx */
   WEBHOOK_OUTCOME_RETRY,       /* 5xx, timeouts, connection errors; with retry_4xx every other non-2xx */
   WEBHOOK_OUTCOME_RETRY_AFTER, /* 429, 503: Retry-After if given, else backoff */
   WEBHOOK_OUTCOME_DEAD,        /* without retry_4xx: other 4xx, 1xx, 3xx */
   WEBHOOK_OUTCOME_GONE,        /* 410: the receiver says the endpoint is gone for good */
} webhook_outcome_t;

const char *webhook_outcome_name (webhook_outcome_t o);
/* status 0 means no HTTP answer (connection error or timeout).  With
 * retry_4xx (the default, as Svix) every answer that is not a 2xx is
 * retried; without it a 4xx, 1xx or 3xx is dead at once. */
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

/* A header.<name> = value the proxy may send: the name an HTTP token
 * (RFC 9110: letters, digits and !#$%&'*+-.^_`|~; no colon, no space) of at
 * most 64 bytes and not one the proxy sets itself (Host, Content-Type,
 * Content-Length, Transfer-Encoding, Connection, Expect, the webhook-*
 * headers); the value at most 1024 bytes without a line break or another
 * control character but tab.  False with `error` saying which rule. */
bool webhook_header_valid (const char *name, const char *value, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* A handler's proxy: an http:// or https:// URL with a host. */
bool webhook_proxy_valid (const char *url, bson_error_t *error) __attribute__ ((warn_unused_result));

/* A handler's tls_ca_file, tls_cert_file and tls_key_file (each NULL or
 * "" when not set) can be used: each file holds what its key names, and
 * the key matches the certificate (an encrypted key is refused).  The
 * configuration's check at start and reload (config_checks_t), and
 * webhook_new's. */
bool webhook_tls_files_valid (const char *ca_file, const char *cert_file, const char *key_file, bson_error_t *error)
   __attribute__ ((warn_unused_result));

typedef struct webhook webhook_t;
typedef struct webhook_req webhook_req_t;

/* Bytes of an answer's body a result keeps (the attempt's record;
 * transport.h's TRANSPORT_RESPONSE_MAX). */
#define WEBHOOK_RESPONSE_MAX 1024

typedef struct {
   webhook_outcome_t outcome;
   int status;                /* 0: no answer */
   int64_t retry_after_ms;    /* -1: none given */
   bool timed_out;            /* no complete answer within timeout_ms */
   char error[WEBHOOK_ERROR_MAX]; /* for lastError when not complete */
   char response[WEBHOOK_RESPONSE_MAX + 1]; /* the start of the answer's body, valid UTF-8; "": none */
} webhook_result_t;

typedef void (*webhook_done_cb_t) (const webhook_result_t *result, void *arg);

#endif /* RELAYBUS_WEBHOOK_H */
