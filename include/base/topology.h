/*
 * base/topology.h - where the primary is, learned off the forwarding loop.
 *
 * Thread: topology_new, topology_start, topology_wait_first and
 * topology_destroy: the main thread; topology_get_primary and
 * topology_request_refresh: any thread (the forwarding loop reads the
 * snapshot); the on_changed callback: the loop; the selection and the
 * address resolution: the topology monitor.
 *
 * The interface is plain data and calls: no mongoc type crosses it, so
 * the forwarding loop (proxy/) reads the snapshot without including the
 * driver.  A monitor thread owns a mongoc_client_pool on the `upstream` URI
 * (made by base/worker.h's worker_pool_new, appName "relaybus-proxy") and asks
 * mongo-c-driver's topology monitoring for a writable server (the primary
 * of a replica set, or a mongos).  It resolves the address itself, so the
 * loop never blocks on DNS, and publishes a snapshot under a mutex.  The
 * loop reads the snapshot (topology_get_primary), asks for a fresh look
 * after a "not primary"-class error or a failed connect
 * (topology_request_refresh), and is told of changes through the loop's
 * loopwake (the loop's event base has no locks: the monitor never touches
 * it).
 *
 * A standalone mongod is refused: it has no transactions.
 */
#ifndef RELAYBUS_TOPOLOGY_H
#define RELAYBUS_TOPOLOGY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <bson/bson.h>

#include "base/loopwake.h"
#include "base/errors.h"

typedef enum {
   TOPOLOGY_ERROR_RESOLVE = 1, /* the primary's host name does not resolve */
   TOPOLOGY_ERROR_THREAD,      /* the monitor thread cannot start */
} topology_error_code_t;
#define TOPOLOGY_HOST_MAX 256

typedef enum {
   TOPOLOGY_STATE_UNKNOWN = 0, /* no answer yet, or the upstream is unreachable */
   TOPOLOGY_STATE_PRIMARY,     /* a writable server is known */
   TOPOLOGY_STATE_STANDALONE,  /* refused: no transactions on a standalone */
   TOPOLOGY_STATE_COUNT_
} topology_state_t;

/* One published view of the upstream.  Plain data, copied out whole. */
typedef struct {
   topology_state_t state;
   uint64_t generation;              /* bumped whenever the primary changes */
   char host[TOPOLOGY_HOST_MAX];     /* as the topology names it: TLS SNI and verification */
   uint16_t port;
   char server_type[32];             /* "RSPrimary", "Mongos", "Standalone" */
   struct sockaddr_storage addr;     /* resolved by the monitor */
   socklen_t addr_len;
   char last_error[256];             /* why the last attempt failed, for logs */
} topology_primary_t;

typedef struct topology topology_t;

/* Called on the loop thread after the snapshot changed. */
typedef void (*topology_changed_cb_t) (void *ctx);

/* Parses the URI, makes the pool (errors in WORKER_ERROR_DOMAIN) and
 * prepares the monitor (not started).  Change
 * notifications reach the loop through `wake` (borrowed: it must outlive the
 * topology, whose destroy joins the monitor).  `select_timeout_ms` bounds one
 * server selection attempt (and so how long topology_destroy may wait). */
topology_t *topology_new (loopwake_t *wake,
                          const char *uri,
                          int64_t select_timeout_ms,
                          topology_changed_cb_t on_changed,
                          void *ctx,
                          bson_error_t *error) __attribute__ ((warn_unused_result));

bool topology_start (topology_t *topo, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Blocks the caller (start-up only, before the loop runs) until the first
 * attempt finished or `timeout_ms` passed; returns the state then. */
topology_state_t topology_wait_first (topology_t *topo, int64_t timeout_ms);

/* Copies the current snapshot.  Cheap: one mutex, one memcpy. */
void topology_get_primary (topology_t *topo, topology_primary_t *out);

/* Asks the monitor to look again now (coalesced; never blocks). */
void topology_request_refresh (topology_t *topo, const char *why);

/* A not-primary error came from `host`:`port` (any thread): if that is the
 * published primary, it is unpublished at once (state UNKNOWN, a new
 * generation), so that no new pairing goes to a member that stepped down,
 * and the next primary is published only once its own hello says it is
 * writable: the driver's view of the set (mongoc's) may still name the old
 * member until its next heartbeat. */
void topology_suspect (topology_t *topo, const char *host, uint16_t port);

/* Whether the last primary the monitor resolved still accepts a TCP
 * connection, within `timeout_ms` (any thread; it blocks that long at most:
 * no name lookup, no TLS, no hello).  False when no address was ever
 * resolved.  main.c asks it at exit, to tell an upstream that is gone (a
 * refused or silent address) from one that is only slow. */
bool topology_primary_answers (topology_t *topo, int timeout_ms);

/* Stops and joins the monitor, frees everything.  NULL is accepted. */
void topology_destroy (topology_t *topo);

/* "unknown", "primary", "standalone". */
const char *topology_state_name (topology_state_t state);

#endif /* RELAYBUS_TOPOLOGY_H */
