/*
 * base/counters.h - process-wide counters of the forwarding path.
 *
 * A handful of relaxed atomic 64-bit counters that any thread may bump and
 * any thread (the admin port, later) may read without a lock.  They are
 * monotonic except the gauges (connections open, upstreams open), which go
 * up and down.  Nothing here allocates or logs; rendering belongs to the
 * admin/metrics module.
 */
#ifndef RELAYBUS_STATS_H
#define RELAYBUS_STATS_H

#include <stdatomic.h>
#include <stdint.h>

/* Why a client connection ended.  Every close goes through
 * client_disconnect(), which logs the detail and counts the reason here. */
typedef enum {
   STATS_CLOSE_CLIENT_EOF = 0,     /* the client hung up */
   STATS_CLOSE_CLIENT_ERROR,       /* socket or TLS error on the client side */
   STATS_CLOSE_CLIENT_PROTOCOL,    /* the client sent something the proxy refuses */
   STATS_CLOSE_UPSTREAM_EOF,       /* the upstream hung up */
   STATS_CLOSE_UPSTREAM_ERROR,     /* socket or TLS error on the upstream side */
   STATS_CLOSE_UPSTREAM_PROTOCOL,  /* the upstream sent something unexpected */
   STATS_CLOSE_UPSTREAM_CONNECT,   /* could not connect to the primary */
   STATS_CLOSE_NO_PRIMARY,         /* no primary known within upstream_connect_timeout_ms */
   STATS_CLOSE_HANDSHAKE_TIMEOUT,  /* no first hello within handshake_timeout_ms */
   STATS_CLOSE_MESSAGE_TIMEOUT,    /* a partial message stalled past message_timeout_ms */
   STATS_CLOSE_MAX_CLIENTS,        /* refused at accept: max_clients reached */
   STATS_CLOSE_SHUTDOWN,           /* drained at shutdown */
   STATS_CLOSE_SHUTDOWN_TIMEOUT,   /* still busy when drain_timeout_ms ran out */
   STATS_CLOSE_INTERNAL,           /* out of memory or a proxy bug: never expected */
   STATS_CLOSE_REASON_COUNT
} stats_close_reason_t;

typedef struct {
   _Atomic uint64_t connections_open;     /* gauge */
   _Atomic uint64_t connections_accepted; /* includes those refused over max_clients */
   _Atomic uint64_t connections_closed[STATS_CLOSE_REASON_COUNT];
   _Atomic uint64_t upstreams_open;       /* gauge */
   _Atomic uint64_t upstream_connects;
   _Atomic uint64_t upstream_connect_failures;
   _Atomic uint64_t bytes_from_clients;
   _Atomic uint64_t bytes_to_clients;
   _Atomic uint64_t bytes_from_upstream;
   _Atomic uint64_t bytes_to_upstream;
   _Atomic uint64_t messages_from_clients;
   _Atomic uint64_t messages_from_upstream;
   _Atomic uint64_t hellos_rewritten;
   _Atomic uint64_t messages_decompressed;
   _Atomic uint64_t messages_compressed;
   _Atomic uint64_t not_primary_errors;     /* relayed "not primary"-class replies */
   _Atomic uint64_t primary_changes;
   _Atomic uint64_t accept_paused;          /* EMFILE/ENFILE pauses of the listener */
   _Atomic uint64_t internal_requests;      /* the proxy's own requests upstream */
   _Atomic uint64_t requests_offloaded;     /* big requests decoded off the loop */
   /* The process-wide memory bound ([proxy] max_buffered_bytes): bytes
    * held in every connection's buffers plus those reserved for messages
    * being received or decompressed (gauge), connections not read because
    * of it now (gauge), and how often one was paused. */
   _Atomic uint64_t buffered_bytes;
   _Atomic uint64_t connections_paused_memory;
   _Atomic uint64_t memory_pauses;
} stats_t;

/* The one instance, zero-initialised at start. */
extern stats_t stats;

/* "client_eof", ... for logs and metrics labels. */
const char *stats_close_reason_name (stats_close_reason_t reason);

#define stats_add(field, n) atomic_fetch_add_explicit (&stats.field, (uint64_t) (n), memory_order_relaxed)
#define stats_sub(field, n) atomic_fetch_sub_explicit (&stats.field, (uint64_t) (n), memory_order_relaxed)
#define stats_get(field) atomic_load_explicit (&stats.field, memory_order_relaxed)

/* Counts one closed connection under `reason` (and decrements nothing:
 * the caller owns the open gauge). */
void stats_count_close (stats_close_reason_t reason);

#endif /* RELAYBUS_STATS_H */
