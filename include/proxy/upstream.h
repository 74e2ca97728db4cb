/*
 * proxy/upstream.h - one raw wire-protocol connection to the primary.
 *
 * An upstream connection belongs to exactly one client connection (its
 * owner), which does all framing and matching; this module only connects
 * (TCP to an address the topology worker resolved, then TLS when the URI
 * asks for it), exposes the bufferevent, counts bytes, and reports to the
 * owner through callbacks.  It never frees itself: the owner calls
 * upstream_destroy, after which no callback fires.
 */
#ifndef RELAYBUS_UPSTREAM_H
#define RELAYBUS_UPSTREAM_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "proxy/topology.h"
#include "proxy/tls.h"

struct event_base;
struct bufferevent;

#define UPSTREAM_ERROR_DOMAIN 0x5553 /* "US" */

typedef struct upstream_conn upstream_conn_t;

typedef enum {
   UPSTREAM_EVENT_CONNECTED,     /* TCP (and TLS) established */
   UPSTREAM_EVENT_CONNECT_FAILED, /* never got there */
   UPSTREAM_EVENT_EOF,           /* the server closed */
   UPSTREAM_EVENT_ERROR,         /* socket or TLS error after connecting */
} upstream_event_t;

/* The owner's hooks; all run on the loop.  `detail` is for the log line. */
typedef struct {
   void (*on_event) (void *owner, upstream_event_t ev, const char *detail);
   void (*on_read) (void *owner);
   void (*on_drained) (void *owner); /* output fell to the low watermark */
} upstream_callbacks_t;

/* Starts a non-blocking connect to `primary`.  `tls` may be NULL.  The
 * result comes through on_event. */
upstream_conn_t *upstream_new (struct event_base *base,
                               const topology_primary_t *primary,
                               tls_upstream_t *tls,
                               const upstream_callbacks_t *cb,
                               void *owner,
                               bson_error_t *error) __attribute__ ((warn_unused_result));

struct bufferevent *upstream_bev (upstream_conn_t *up);
bool upstream_is_connected (const upstream_conn_t *up);
/* host:port for logs. */
const char *upstream_name (const upstream_conn_t *up);
/* Whether the connection runs TLS (an OpenSSL bufferevent). */
bool upstream_is_tls (const upstream_conn_t *up);
/* The topology generation it was opened for. */
uint64_t upstream_generation (const upstream_conn_t *up);

/* Whether on_drained is wanted.  Off by default: the write callback runs
 * after every write that empties the output below its low watermark, and
 * the owner only cares while it holds its client back (backpressure). */
void upstream_want_drained (upstream_conn_t *up, bool want);

/* Closes the socket at once; no callback fires afterwards.  NULL ok. */
void upstream_destroy (upstream_conn_t *up);

#endif /* RELAYBUS_UPSTREAM_H */
