/*
 * codec/handshake.h - the mongos persona: what the proxy changes in hello.
 *
 * Thread: any (pure: no I/O, no shared state); called on the forwarding loop.
 *
 * The client's hello goes to its paired upstream (so speculativeAuthenticate
 * and saslSupportedMechs work); these functions rewrite the request on the
 * way up and the reply on the way down.  Up: `compression` is removed so the
 * upstream never compresses towards the proxy, and so is a MONGODB-X509
 * `speculativeAuthenticate` (a client may not log in as the proxy's
 * certificate); a legacy OP_QUERY hello gets `$db: "admin"` so it can
 * travel as OP_MSG.  Down: the replica-set identity
 * is removed, `msg: "isdbgrid"` added, and `compression` becomes the proxy's
 * own choice; for a driver in load-balanced mode (its hello says
 * `loadBalanced: true`), `serviceId` is the proxy's (base/instance.h), and an
 * upstream's own serviceId never reaches a client.  Everything else (limits,
 * wire versions, session timeout, connectionId, auth fields, $clusterTime)
 * is kept in its order.
 *
 * Pure functions over bson_t: no connection state, no I/O, unit tested.
 */
#ifndef RELAYBUS_HANDSHAKE_H
#define RELAYBUS_HANDSHAKE_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/errors.h"

/* Error codes in HANDSHAKE_ERROR_DOMAIN. */
typedef enum {
   HANDSHAKE_ERR_INVALID = 1, /* the hello or its reply is not a valid document */
   HANDSHAKE_ERR_TOO_LARGE,   /* the rewritten document would exceed the size bound */
} handshake_error_code_t;
/* The proxy implements at most snappy, zlib and zstd (and noop). */
#define HANDSHAKE_MAX_COMPRESSORS 4

/* The outcome of compression negotiation: ids (compress_id_t) in the
 * client's order, intersected with what the proxy offers. */
typedef struct {
   int ids[HANDSHAKE_MAX_COMPRESSORS];
   int n;
   bool requested; /* the hello carried a `compression` field at all */
} handshake_compression_t;

/* True for "hello", "isMaster" and "ismaster". */
bool handshake_is_hello (const char *command_name);

/* For a legacy OP_QUERY command document: the command itself, unwrapping
 * {$query: {...}} when present.  Returns false if there is no document. */
bool handshake_unwrap_query (const bson_t *query, bson_t *out);

/* Intersects the hello's `compression` list with `offered` (a comma or
 * space separated list, e.g. the [proxy] compressors key), keeping the
 * client's order and dropping names the proxy does not implement. */
void handshake_negotiate (const bson_t *hello, const char *offered, handshake_compression_t *out);

/* True when the hello asks for the persona of a service behind a load
 * balancer: `loadBalanced: true` (the drivers' load-balancer
 * specification; a non-zero number counts as true). */
bool handshake_wants_load_balanced (const bson_t *hello);

/* True when `cmd` (an authenticate command or a speculativeAuthenticate
 * document) asks for mechanism MONGODB-X509. */
bool handshake_is_x509_auth (const bson_t *cmd);

/* True when the hello's `speculativeAuthenticate` asks for MONGODB-X509
 * (handshake_rewrite_request removes it). */
bool handshake_speculative_x509 (const bson_t *hello);

/* Builds the hello the proxy sends upstream: `compression`, a
 * MONGODB-X509 `speculativeAuthenticate`, `topologyVersion` and
 * `maxAwaitTimeMS` (an awaitable hello: answered at once) removed; with
 * `add_db`, `$db: "admin"` appended when absent (legacy OP_QUERY hello),
 * and legacy-only fields that OP_MSG refuses ($readPreference wrapper
 * remnants) dropped.  `out` is initialised here; destroy it. */
bool handshake_rewrite_request (const bson_t *hello, bool add_db, bson_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Builds the hello reply the client sees (see the file comment).  A reply
 * with ok other than 1 is copied unchanged.  `compression` may have n == 0:
 * then no `compression` field is written.  `service_id` (NULL: none) is
 * written as `serviceId`, after `msg`; a successful reply loses any
 * `serviceId` of the upstream's.  `out` is initialised here. */
bool handshake_rewrite_reply (const bson_t *reply,
                              const handshake_compression_t *compression,
                              const bson_oid_t *service_id,
                              bson_t *out,
                              bson_error_t *error) __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_HANDSHAKE_H */
