/*
 * base/counters.c - the counters of include/base/counters.h and their names.
 *
 * Relaxed atomics are enough: each counter is independent, readers only
 * want a recent value, and nothing is derived from two counters at once.
 */
#include "base/counters.h"

stats_t stats;

static const char *const close_reason_names[STATS_CLOSE_REASON_COUNT] = {
   [STATS_CLOSE_CLIENT_EOF] = "client_eof",
   [STATS_CLOSE_CLIENT_ERROR] = "client_error",
   [STATS_CLOSE_CLIENT_PROTOCOL] = "client_protocol",
   [STATS_CLOSE_UPSTREAM_EOF] = "upstream_eof",
   [STATS_CLOSE_UPSTREAM_ERROR] = "upstream_error",
   [STATS_CLOSE_UPSTREAM_PROTOCOL] = "upstream_protocol",
   [STATS_CLOSE_UPSTREAM_CONNECT] = "upstream_connect",
   [STATS_CLOSE_NO_PRIMARY] = "no_primary",
   [STATS_CLOSE_HANDSHAKE_TIMEOUT] = "handshake_timeout",
   [STATS_CLOSE_MESSAGE_TIMEOUT] = "message_timeout",
   [STATS_CLOSE_MAX_CLIENTS] = "max_clients",
   [STATS_CLOSE_SHUTDOWN] = "shutdown",
   [STATS_CLOSE_SHUTDOWN_TIMEOUT] = "shutdown_timeout",
   [STATS_CLOSE_INTERNAL] = "internal",
};

const char *
stats_close_reason_name (stats_close_reason_t reason)
{
   if ((unsigned) reason >= STATS_CLOSE_REASON_COUNT)
      return "unknown";
   return close_reason_names[reason];
}

void
stats_count_close (stats_close_reason_t reason)
{
   if ((unsigned) reason >= STATS_CLOSE_REASON_COUNT)
      reason = STATS_CLOSE_INTERNAL;
   atomic_fetch_add_explicit (&stats.connections_closed[reason], 1, memory_order_relaxed);
}
