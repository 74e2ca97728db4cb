/*
 * proxy/route.h - what becomes of a client's request: the request-routing
 * policy (proxy/route.c).
 *
 * Thread: forwarding loop (the connection's own).
 *
 * The pump (proxy/pump.c) frames and decodes a request, then asks
 * route_msg (OP_MSG) or route_query (the legacy OP_QUERY) what becomes of
 * it: forwarded as it is, a hello for the pump to forward rewritten (or,
 * pooled, to answer), or taken here.  The policy: an X.509 login refused;
 * in pooled mode the login at the proxy (proxy/login.h), the owners'
 * check (proxy/owners.h) and the pool's pins (proxy/pool.h); the request
 * hook (publish); commands named relaybus* never forwarded.  Not here:
 * framing, decoding, forwarding and answering (proxy/pump.c).
 */
#ifndef RELAYBUS_PROXY_ROUTE_H
#define RELAYBUS_PROXY_ROUTE_H

#include <stddef.h>

#include <bson/bson.h>
#include <event2/buffer.h>

#include "codec/wire.h"
#include "proxy/conn.h"

/* What becomes of a request. */
typedef enum {
   ROUTE_FORWARD,      /* the pump forwards it unchanged */
   ROUTE_FORWARD_SASL, /* the same, and reads the SASL conversation it is part of (session mode) */
   ROUTE_HELLO,        /* a hello: the pump forwards it rewritten (session mode) or answers it (pooled) */
   ROUTE_TAKEN,        /* answered, refused, dropped or held: its `len` bytes are gone from `src` */
   ROUTE_FAILED,       /* the connection must close: `error` says why */
   ROUTE_CLOSED,       /* the connection closed */
} route_action_t;

/* One parsed OP_MSG request (`msg`, from the `len` bytes at the front of
 * `src`, as it arrived compressed with `compressor`, -1: plain). */
route_action_t route_msg (client_conn_t *c,
                          struct evbuffer *src,
                          size_t len,
                          const wire_msg_t *msg,
                          int compressor,
                          bson_error_t *error) __attribute__ ((warn_unused_result));

/* One parsed OP_QUERY request; ROUTE_HELLO sets *hello to the command it
 * wraps (pointing into the request). */
route_action_t route_query (client_conn_t *c,
                            struct evbuffer *src,
                            size_t len,
                            const wire_query_t *q,
                            int compressor,
                            bson_t *hello,
                            bson_error_t *error) __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_PROXY_ROUTE_H */
