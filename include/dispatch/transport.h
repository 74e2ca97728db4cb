/*
 * dispatch/transport.h - the handler interface: what the dispatcher asks
 * of every kind of handler that it delivers to itself (webhook, nats,
 * rabbitmq).
 *
 * A transport is made per handler (transport_new), sends one delivery at a
 * time per call, asynchronously (transport_send), and reports each send's
 * result exactly once, on the dispatcher's event base: the delivery is
 * done (the broker or the endpoint confirmed it), to be retried (after a
 * given delay, or the handler's backoff), or dead (with the error that
 * becomes its lastError).  A kind whose library runs its own threads
 * posts the result back to the dispatcher's base; nothing a transport
 * does blocks that base for network I/O.  The dispatcher keeps the order
 * per key (one delivery per key in flight), the retries, the dead letters
 * and the leases; a transport only sends.
 *
 * Each kind is a file of its own (webhook.c, nats.c, rabbitmq.c) with a table of
 * transport_ops_t; this file's transport.c picks the table by the
 * handler's kind.  Pull handlers have no transport: consumers claim their
 * deliveries (dispatch/consumer.h).
 *
 * Thread: everything here on the dispatcher's thread (transport_new also
 * on the main thread before the dispatcher's thread starts), except
 * transport_state, which may be called from any thread (the admin port's
 * /readyz).
 */
#ifndef RELAYBUS_TRANSPORT_H
#define RELAYBUS_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "base/config.h"
#include "store/store.h"
#include "base/errors.h"

/* transport_result_t.error is at most this long (lastError). */
#define TRANSPORT_ERROR_MAX 256
/* A connection state's detail (its last error) is at most this long. */
#define TRANSPORT_DETAIL_MAX 256

typedef enum {
   TRANSPORT_ERROR_KIND = 1,  /* a kind this build has no transport for */
   TRANSPORT_ERROR_START,     /* the kind's client could not be made */
   TRANSPORT_ERROR_SEND,      /* a send could not be started */
} transport_error_code_t;

typedef enum {
   TRANSPORT_OUTCOME_OK,    /* confirmed: complete the delivery */
   TRANSPORT_OUTCOME_RETRY, /* failed: retry (retry_after_ms, or the handler's backoff) */
   TRANSPORT_OUTCOME_DEAD,  /* failed for good: bury now, whatever attempts are left */
} transport_outcome_t;

const char *transport_outcome_name (transport_outcome_t o);

typedef struct {
   transport_outcome_t outcome;
   int64_t retry_after_ms;          /* RETRY: the delay asked for; -1: the handler's backoff */
   char error[TRANSPORT_ERROR_MAX]; /* lastError when not OK */
} transport_result_t;

typedef void (*transport_done_cb_t) (const transport_result_t *result, void *arg);

/* A transport's connection to its broker, for /readyz.  A webhook makes
 * one connection per request and has no lasting state: NONE. */
typedef enum {
   TRANSPORT_STATE_NONE,
   TRANSPORT_STATE_CONNECTING,
   TRANSPORT_STATE_CONNECTED,
   TRANSPORT_STATE_DISCONNECTED, /* lost; reconnecting */
   TRANSPORT_STATE_CLOSED,
} transport_state_t;

const char *transport_state_name (transport_state_t s);

/* What the dispatcher lends every transport: its base (callbacks run
 * there), its DNS base and its TLS context for https (NULL when none is
 * needed).  Borrowed; they outlive the transports. */
typedef struct {
   struct event_base *base;
   struct evdns_base *dns;
   SSL_CTX *ssl;
} transport_env_t;

typedef struct transport transport_t;
typedef struct transport_req transport_req_t;

/* A kind's implementation.  `impl` is the kind's own object, `req` its
 * own request object. */
typedef struct {
   const char *kind;
   void *(*start) (const transport_env_t *env, const config_handler_t *h, bson_error_t *error);
   /* Starts sending `d`; cb(result, arg) runs once on env->base, never
    * from within send, unless cancel comes first.  NULL (error set) when
    * nothing was started. */
   void *(*send) (void *impl, const store_delivery_t *d, transport_done_cb_t cb, void *arg, bson_error_t *error);
   /* Abandons a send: its cb will not run. */
   void (*cancel) (void *impl, void *req);
   /* Any thread.  `detail` (TRANSPORT_DETAIL_MAX) gets the last
    * connection error, or "". */
   transport_state_t (*state) (void *impl, char *detail, size_t detail_len);
   /* Frees it; every send was cancelled or has called back. */
   void (*destroy) (void *impl);
   /* Whether the client made for `a` serves `b` as well (a reload keeps it). */
   bool (*settings_equal) (const config_handler_t *a, const config_handler_t *b);
} transport_ops_t;

extern const transport_ops_t transport_webhook_ops;
/* Only in a build with libnats (autoconf.h: RELAYBUS_HAVE_NATS). */
extern const transport_ops_t transport_nats_ops;
/* Only in a build with librabbitmq (RELAYBUS_HAVE_RABBITMQ). */
extern const transport_ops_t transport_rabbitmq_ops;
/* Only in a build with librdkafka (RELAYBUS_HAVE_KAFKA). */
extern const transport_ops_t transport_kafka_ops;

/* The ops of a handler's kind; NULL for pull, or a kind this build lacks. */
const transport_ops_t *transport_ops_for (const config_handler_t *h);

/* True for the kinds the dispatcher sends itself (not pull). */
bool transport_kind_dispatched (handler_kind_t kind);

/* A transport for handler `h` (its strings are copied).  NULL with
 * `error` when the kind has none in this build or its client cannot be
 * made (a bad URL); a broker that cannot be reached yet is not an error:
 * the transport keeps connecting, and its sends are retried meanwhile. */
transport_t *transport_new (const transport_env_t *env, const config_handler_t *h, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* NULL ok.  Every send was cancelled or has called back. */
void transport_destroy (transport_t *t);

const char *transport_kind (const transport_t *t);

/* See transport_ops_t.send.  The request is owned by the transport until
 * its callback ran or it is cancelled. */
transport_req_t *transport_send (transport_t *t,
                                 const store_delivery_t *d,
                                 transport_done_cb_t cb,
                                 void *arg,
                                 bson_error_t *error);
/* NULL ok. */
void transport_cancel (transport_t *t, transport_req_t *req);

/* Any thread. */
transport_state_t transport_state (transport_t *t, char *detail, size_t detail_len);

/* Whether a transport made for `a` serves `b` unchanged (same kind and
 * client settings). */
bool transport_settings_equal (const config_handler_t *a, const config_handler_t *b);

/* ------------------------------------------------------ broker helpers */

/* Expands a subject, topic or routing key template: "{type}" becomes the
 * event type, "{key}" its key (the event id when it has none); other text
 * is copied.  Characters of the substituted values that `bad` lists
 * become '_' (a NATS subject may not hold white space, '*' or '>').
 * Caller frees with bson_free. */
char *transport_expand (const char *tmpl, const store_delivery_t *d, const char *bad);

/* True when every "{...}" of `tmpl` is {type} or {key}; false with a
 * message in `why`. */
bool transport_template_valid (const char *tmpl, char *why, size_t why_len);

#endif /* RELAYBUS_TRANSPORT_H */
