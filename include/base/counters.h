/*
 * base/counters.h - the one registry of every counter, gauge and histogram.
 * Thread: any.  Every thread bumps what it sees (the forwarding loop, the
 * dispatcher thread, the admin thread, the topology worker); the admin
 * thread reads the table to render /metrics and the JSON API
 * (admin/render.c, admin/api.c).
 *
 * COUNTERS_TABLE below declares each metric once: its id, its Prometheus
 * name, type, label and help.  The values are relaxed atomic 64-bit slots:
 * each counter is independent and readers only want a recent value; no
 * reader needs two slots to agree (a histogram's count, the sum of its
 * buckets, may be one observation ahead of its sum).  Counters are monotonic;
 * gauges go up and down or are set.  A labelled metric has one slot per
 * value of its label, and every label set is bounded: close reasons,
 * publishing error kinds and command names are fixed lists, handlers come
 * from the configuration (at most COUNTERS_MAX_HANDLERS), event types are
 * the first COUNTERS_MAX_EVENT_TYPES seen and the rest one "_other".
 *
 * Nothing here allocates, logs or does I/O; incrementing is one atomic add
 * (inline), so it is safe on the forwarding loop.  Adding a handler or an
 * event type takes a mutex, at most a bounded number of times per process.
 * Rendering (the text format, the escaping) belongs to admin/render.c.
 */
#ifndef RELAYBUS_BASE_COUNTERS_H
#define RELAYBUS_BASE_COUNTERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/assert.h"
#include "base/outbox.h"

/* ------------------------------------------------------------ labels */

/* Why a client connection ended.  Every close goes through
 * client_disconnect(), which logs the detail and counts the reason under
 * relaybus_client_connections_closed_total. */
typedef enum {
   COUNTERS_CLOSE_CLIENT_EOF = 0,     /* the client hung up */
   COUNTERS_CLOSE_CLIENT_ERROR,       /* socket or TLS error on the client side */
   COUNTERS_CLOSE_CLIENT_PROTOCOL,    /* the client sent something the proxy refuses */
   COUNTERS_CLOSE_UPSTREAM_EOF,       /* the upstream hung up */
   COUNTERS_CLOSE_UPSTREAM_ERROR,     /* socket or TLS error on the upstream side */
   COUNTERS_CLOSE_UPSTREAM_PROTOCOL,  /* the upstream sent something unexpected */
   COUNTERS_CLOSE_UPSTREAM_CONNECT,   /* could not connect to the primary */
   COUNTERS_CLOSE_NO_PRIMARY,         /* no primary known within upstream_connect_timeout_ms */
   COUNTERS_CLOSE_NOT_PRIMARY,        /* relayed a not-primary error: closed once answered, so the
                                       * client's next connection pairs with the new primary */
   COUNTERS_CLOSE_HANDSHAKE_TIMEOUT,  /* no first hello within handshake_timeout_ms */
   COUNTERS_CLOSE_LOGIN_TIMEOUT,      /* pooled: no login to the proxy within login_timeout_ms */
   COUNTERS_CLOSE_MESSAGE_TIMEOUT,    /* a partial message stalled past message_timeout_ms */
   COUNTERS_CLOSE_MAX_CLIENTS,        /* refused at accept: max_clients reached */
   COUNTERS_CLOSE_SHUTDOWN,           /* drained at shutdown */
   COUNTERS_CLOSE_SHUTDOWN_TIMEOUT,   /* still busy when drain_timeout_ms ran out */
   COUNTERS_CLOSE_INTERNAL,           /* out of memory or a proxy bug: never expected */
   COUNTERS_CLOSE_OPERATOR,           /* POST /api/clients/ID/close */
   COUNTERS_CLOSE_RECONNECT,          /* POST /api/reconnect, session mode: the client had authenticated on
                                       * its upstream connection, so it closes (once idle) to log in again */
   COUNTERS_CLOSE_REASON_COUNT
} counters_close_reason_t;

/* Publishing failures (relaybus_publish_errors_total{kind}). */
typedef enum {
   COUNTERS_PUBLISH_BAD_ANNOTATION = 0, /* BadValue answers: the annotation or relaybusPublish is malformed */
   COUNTERS_PUBLISH_OUTSIDE_TRANSACTION, /* InvalidOptions answers: annotated work outside a transaction */
   COUNTERS_PUBLISH_OUTBOX_WRITE,       /* an outbox write failed: its error went to the client */
   COUNTERS_PUBLISH_CONNECTION_LOST,    /* the connection closed in the middle of an operation */
   COUNTERS_PUBLISH_ERROR_COUNT
} counters_publish_error_t;

/* Why a pooled upstream connection stays with one client between its
 * requests (relaybus_pool_pinned_connections{reason}; proxy/pool.h). */
typedef enum {
   COUNTERS_PIN_TRANSACTION = 0, /* a transaction runs on it */
   COUNTERS_PIN_EXHAUST,         /* an exhaust stream is still sending */
   COUNTERS_PIN_MORE_TO_COME,    /* moreToCome requests are still being written */
   COUNTERS_PIN_COUNT
} counters_pin_t;

/* Logins at the proxy, pooled mode (relaybus_logins_total{result}). */
typedef enum {
   COUNTERS_LOGIN_SUCCESS = 0, /* the proof was right */
   COUNTERS_LOGIN_FAILURE,     /* unknown user, wrong password, bad message */
   COUNTERS_LOGIN_THROTTLED,   /* refused unchecked: auth_failures_per_minute reached */
   COUNTERS_LOGIN_COUNT
} counters_login_t;

/* Why a handler's state changed (relaybus_handler_state_changes_total{reason}). */
typedef enum {
   COUNTERS_STATE_GONE = 0,  /* disabled: its webhook answered 410 Gone */
   COUNTERS_STATE_FAILING,   /* disabled: every delivery failed for disable_after */
   COUNTERS_STATE_OPERATOR,  /* disabled by POST /api/handlers/NAME/disable */
   COUNTERS_STATE_ENABLED,   /* enabled by POST /api/handlers/NAME/enable */
   COUNTERS_STATE_COUNT
} counters_state_t;

/* Commands counted by name: this many fixed names, plus "other". */
#define COUNTERS_N_COMMANDS 44
/* Handlers with their own series: at least the configuration's bound
 * (CONFIG_MAX_HANDLERS, checked in config.c); a name past it is not
 * counted. */
#define COUNTERS_MAX_HANDLERS 256
/* Event types with their own relaybus_events_unrouted_total series; later
 * ones are counted under COUNTERS_EVENT_TYPE_OTHER. */
#define COUNTERS_MAX_EVENT_TYPES 100
#define COUNTERS_EVENT_TYPE_OTHER "_other"
/* Forwarding loops with a slot of their own in a LOOP_HISTOGRAM: at least
 * CLIENT_LOOPS_MAX (checked in proxy/loops.c). */
#define COUNTERS_LOOPS_MAX 64

/* What a metric's samples are labelled by, with the label's key and how
 * many slots it takes.  NONE: one sample without labels. */
#define COUNTERS_LABELS(L)                                  \
   L (NONE, NULL, 1)                                        \
   L (BUILD, "version", 1)                                  \
   L (REASON, "reason", COUNTERS_CLOSE_REASON_COUNT)        \
   L (COMMAND, "command", COUNTERS_N_COMMANDS + 1)          \
   L (KIND, "kind", COUNTERS_PUBLISH_ERROR_COUNT)           \
   L (PIN, "reason", COUNTERS_PIN_COUNT)                    \
   L (LOGIN, "result", COUNTERS_LOGIN_COUNT)                \
   L (STATE, "reason", COUNTERS_STATE_COUNT)                \
   L (HANDLER, "handler", COUNTERS_MAX_HANDLERS)            \
   L (HANDLER_OUTCOME, "handler", COUNTERS_MAX_HANDLERS * OUTBOX_ATTEMPT_OUTCOMES) \
   L (TYPE, "type", COUNTERS_MAX_EVENT_TYPES + 1)          \
   L (LOOP, "loop", COUNTERS_LOOPS_MAX)

typedef enum {
#define COUNTERS_L_ENUM(label, key, slots) COUNTERS_LABEL_##label,
   COUNTERS_LABELS (COUNTERS_L_ENUM)
#undef COUNTERS_L_ENUM
   COUNTERS_LABEL_COUNT
} counters_label_t;

#define COUNTERS_L_SLOTS(label, key, slots) COUNTERS_SLOTS_LABEL_##label = (slots),
enum { COUNTERS_LABELS (COUNTERS_L_SLOTS) };
#undef COUNTERS_L_SLOTS

/* --------------------------------------------------------- histograms */

/* Upper bounds of the latency buckets, in ms (then +Inf). */
#define COUNTERS_N_BUCKETS 14
extern const int64_t counters_bucket_ms[COUNTERS_N_BUCKETS];

/* Slots of one histogram sample: the buckets (not cumulative; the last one
 * is +Inf), then the sum of the observations in ms.  Its count is the sum
 * of its buckets. */
#define COUNTERS_HISTOGRAM_SUM (COUNTERS_N_BUCKETS + 1)

/* A LOOP_HISTOGRAM measures what the forwarding loops do per request, in
 * microseconds: upper bounds of its buckets in µs (then +Inf).  Each loop
 * observes into its own sample (label LOOP, its index), so no two threads
 * add to the same slot; /metrics merges the samples into one histogram
 * without a label. */
#define COUNTERS_N_BUCKETS_US 12
extern const int64_t counters_bucket_us[COUNTERS_N_BUCKETS_US];
#define COUNTERS_LOOP_HISTOGRAM_SUM (COUNTERS_N_BUCKETS_US + 1)
enum {
   COUNTERS_WIDTH_COUNTER = 1,
   COUNTERS_WIDTH_GAUGE = 1,
   COUNTERS_WIDTH_HISTOGRAM = COUNTERS_HISTOGRAM_SUM + 1,
   COUNTERS_WIDTH_LOOP_HISTOGRAM = COUNTERS_LOOP_HISTOGRAM_SUM + 1,
};

typedef enum {
   COUNTERS_TYPE_COUNTER = 0,
   COUNTERS_TYPE_GAUGE,
   COUNTERS_TYPE_HISTOGRAM,
   COUNTERS_TYPE_LOOP_HISTOGRAM, /* rendered as a histogram, its loops merged */
} counters_type_t;

/* ------------------------------------------------------------- table */

/* Every metric of the process, in the order /metrics renders them (the
 * store's, read per scrape, follow them: admin/render.h).  X (id, name,
 * type, label, help).  Gauges marked "set per scrape" are written by the
 * admin thread just before it renders. */
#define COUNTERS_TABLE(X)                                                                                              \
   X (BUILD_INFO, "relaybus_build_info", GAUGE, BUILD, "Always 1; the version is a label.")                         \
   X (START_TIME, "relaybus_start_time_seconds", GAUGE, NONE,                                                          \
      "When the process started, in seconds since the Unix epoch.") /* set per scrape */                              \
   X (UPSTREAM_UP, "relaybus_upstream_up", GAUGE, NONE,                                                                \
      "1 while a writable upstream (primary or mongos) is known.") /* set per scrape */                               \
   X (OUTBOX_READY, "relaybus_outbox_ready", GAUGE, NONE,                                                              \
      "1 once the outbox collections, indexes and lanes are set up.") /* set per scrape */                            \
   X (ADMIN_REQUESTS, "relaybus_admin_requests_total", COUNTER, NONE, "Admin HTTP requests served.")                  \
   X (ADMIN_REJECTED, "relaybus_admin_rejected_total", COUNTER, NONE,                                                  \
      "Admin HTTP requests refused (401, 400, 404, 405, 413, 415, 503).")                                             \
   X (LOG_LINES_DROPPED, "relaybus_log_lines_dropped_total", COUNTER, NONE,                                            \
      "Log lines dropped because the log destination did not keep up with the queue.")                                \
   /* span export (base/trace.h) */                                                                                   \
   X (TRACE_SPANS_EXPORTED, "relaybus_trace_spans_exported_total", COUNTER, NONE,                                      \
      "Spans the OTLP collector accepted.")                                                                           \
   X (TRACE_SPANS_DROPPED, "relaybus_trace_spans_dropped_total", COUNTER, NONE,                                        \
      "Spans dropped: the export queue was full, or the collector did not take their batch.")                         \
   X (TRACE_EXPORT_FAILURES, "relaybus_trace_export_failures_total", COUNTER, NONE,                                    \
      "OTLP export requests that failed (no connection, timeout, or a non-2xx answer).")                              \
   /* operator commands (proxy/operator.h) */                                                                          \
   X (PAUSED, "relaybus_paused", GAUGE, NONE,                                                                          \
      "1 while POST /api/pause holds new client requests (until POST /api/resume).")                                  \
   X (OPERATOR_PAUSES, "relaybus_operator_pauses_total", COUNTER, NONE, "POST /api/pause commands that paused.")      \
   X (OPERATOR_RESUMES, "relaybus_operator_resumes_total", COUNTER, NONE, "POST /api/resume commands that resumed.")  \
   X (OPERATOR_CLIENT_CLOSES, "relaybus_operator_client_closes_total", COUNTER, NONE,                                  \
      "Client connections POST /api/clients/ID/close asked to close.")                                                \
   X (OPERATOR_RECONNECTS, "relaybus_operator_reconnects_total", COUNTER, NONE,                                        \
      "POST /api/reconnect commands: upstream connections open then close as they come free.")                        \
   X (RECONNECTED_UPSTREAMS, "relaybus_operator_reconnected_upstreams_total", COUNTER, NONE,                           \
      "Upstream connections closed because of a POST /api/reconnect (pool connections, session mode pairings).")      \
   /* forwarding */                                                                                                    \
   X (CONNECTIONS_OPEN, "relaybus_client_connections", GAUGE, NONE, "Client connections open.")                       \
   X (FORWARDING_LOOPS, "relaybus_forwarding_loops", GAUGE, NONE,                                                      \
      "Forwarding loops running ([proxy] threads), each a thread owning its connections.")                            \
   X (CONNECTIONS_ACCEPTED, "relaybus_client_connections_accepted_total", COUNTER, NONE,                               \
      "Client connections accepted, including those refused over max_clients.")                                      \
   X (CONNECTIONS_CLOSED, "relaybus_client_connections_closed_total", COUNTER, REASON,                                 \
      "Client connections closed, by reason.")                                                                        \
   X (UPSTREAMS_OPEN, "relaybus_upstream_connections", GAUGE, NONE, "Upstream connections open.")                     \
   X (UPSTREAM_CONNECTS, "relaybus_upstream_connects_total", COUNTER, NONE, "Upstream connections opened.")           \
   X (UPSTREAM_CONNECT_FAILURES, "relaybus_upstream_connect_failures_total", COUNTER, NONE,                            \
      "Upstream connection attempts that failed.")                                                                    \
   X (BYTES_FROM_CLIENTS, "relaybus_client_received_bytes_total", COUNTER, NONE,                                       \
      "Bytes of messages received from clients.")                                                                     \
   X (BYTES_TO_CLIENTS, "relaybus_client_sent_bytes_total", COUNTER, NONE, "Bytes of messages sent to clients.")      \
   X (BYTES_FROM_UPSTREAM, "relaybus_upstream_received_bytes_total", COUNTER, NONE,                                    \
      "Bytes of messages received from the upstream.")                                                                \
   X (BYTES_TO_UPSTREAM, "relaybus_upstream_sent_bytes_total", COUNTER, NONE,                                          \
      "Bytes of messages sent to the upstream.")                                                                      \
   X (MESSAGES_FROM_CLIENTS, "relaybus_client_messages_total", COUNTER, NONE, "Messages received from clients.")      \
   X (MESSAGES_FROM_UPSTREAM, "relaybus_upstream_messages_total", COUNTER, NONE,                                       \
      "Messages received from the upstream.")                                                                         \
   X (COMMANDS, "relaybus_commands_total", COUNTER, COMMAND,                                                           \
      "Client commands by name (hellos are counted by relaybus_hellos_total; unlisted names as other).")              \
   X (HELLOS_REWRITTEN, "relaybus_hellos_total", COUNTER, NONE, "Handshake hellos answered (rewritten) by the proxy.") \
   X (NOT_PRIMARY_ERRORS, "relaybus_not_primary_errors_total", COUNTER, NONE, "Not-primary class errors relayed.")    \
   X (UPSTREAM_REPAIRS, "relaybus_upstream_repairs_total", COUNTER, NONE,                                              \
      "Client connections paired again without closing them: after a not-primary error, or after their mongos went "  \
      "away while they were idle.")                                                                                   \
   X (PRIMARY_CHANGES, "relaybus_primary_changes_total", COUNTER, NONE, "Times the primary changed.")                 \
   X (INTERNAL_REQUESTS, "relaybus_internal_requests_total", COUNTER, NONE,                                            \
      "Requests the proxy sent upstream on its own.")                                                                 \
   X (ACCEPT_PAUSES, "relaybus_accept_pauses_total", COUNTER, NONE,                                                    \
      "Times the listener paused accepting on EMFILE or ENFILE.")                                                     \
   X (BUFFERED_BYTES, "relaybus_buffered_bytes", GAUGE, NONE,                                                          \
      "Bytes all connections hold or have reserved (partial messages, decompression, queues); bounded by "            \
      "max_buffered_bytes.")                                                                                          \
   X (CONNECTIONS_PAUSED_MEMORY, "relaybus_memory_paused_connections", GAUGE, NONE,                                    \
      "Connections not read now because max_buffered_bytes is reached.")                                              \
   X (MEMORY_PAUSES, "relaybus_memory_pauses_total", COUNTER, NONE,                                                    \
      "Times a connection stopped being read because max_buffered_bytes was reached.")                                \
   X (REQUESTS_OFFLOADED, "relaybus_requests_offloaded_total", COUNTER, NONE,                                          \
      "Requests of 1 MiB or more decompressed and validated on the decoding thread.")                                 \
   X (ADDED_LATENCY, "relaybus_proxy_added_latency_seconds", LOOP_HISTOGRAM, LOOP,                                     \
      "Time the proxy added to each answered client request: from reading it to writing its answer, minus the "        \
      "upstream's time from sending it to reading the reply.")                                                        \
   /* pooled mode */                                                                                                   \
   X (POOL_SIZE, "relaybus_pool_size", GAUGE, NONE,                                                                    \
      "Pooled mode: the most upstream connections the pool opens ([proxy] pool_size); 0 in session mode.")            \
   X (POOL_CONNECTIONS, "relaybus_pool_connections", GAUGE, NONE,                                                      \
      "Pooled mode: upstream connections of the pool open now, logged in or logging in.")                             \
   X (POOL_IN_USE, "relaybus_pool_connections_in_use", GAUGE, NONE,                                                    \
      "Pooled mode: pool connections lent to a client now (a request in flight, or pinned).")                          \
   X (POOL_PINNED, "relaybus_pool_pinned_connections", GAUGE, PIN,                                                     \
      "Pooled mode: pool connections held by one client between its requests, by reason.")                            \
   X (POOL_WAITERS, "relaybus_pool_waiters", GAUGE, NONE,                                                              \
      "Pooled mode: client requests waiting for a free pool connection now.")                                         \
   X (POOL_WAITS, "relaybus_pool_waits_total", COUNTER, NONE,                                                          \
      "Pooled mode: client requests that had to wait for a pool connection.")                                         \
   X (POOL_WAIT_TIME, "relaybus_pool_wait_seconds", HISTOGRAM, NONE,                                                   \
      "Pooled mode: how long the requests that waited waited for a pool connection.")                                 \
   X (POOL_WAIT_TIMEOUTS, "relaybus_pool_wait_timeouts_total", COUNTER, NONE,                                          \
      "Pooled mode: requests answered with a retryable error after pool_wait_timeout_ms without a connection.")       \
   X (POOL_CONNECTS, "relaybus_pool_connects_total", COUNTER, NONE,                                                    \
      "Pooled mode: pool connections opened and logged in.")                                                          \
   X (POOL_CONNECT_FAILURES, "relaybus_pool_connect_failures_total", COUNTER, NONE,                                    \
      "Pooled mode: pool connection attempts that failed (connect, hello or login).")                                 \
   X (POOL_CLOSED_IN_DOUBT, "relaybus_pool_closed_in_doubt_total", COUNTER, NONE,                                      \
      "Pooled mode: pool connections closed because a client left with something in flight on them.")                \
   X (LOGINS, "relaybus_logins_total", COUNTER, LOGIN,                                                                 \
      "Pooled mode: SCRAM logins of clients at the proxy, by result.")                                                \
   /* publishing */                                                                                                    \
   X (ANNOTATED, "relaybus_annotated_statements_total", COUNTER, NONE, "Annotated statements seen.")                  \
   X (EVENTS_PUBLISHED, "relaybus_events_published_total", COUNTER, NONE, "Events written into the outbox.")          \
   X (DELIVERIES_WRITTEN, "relaybus_deliveries_written_total", COUNTER, NONE, "Deliveries written into the outbox.")  \
   X (PUBLISH_ERRORS, "relaybus_publish_errors_total", COUNTER, KIND, "Publishing failures, by kind.")                \
   X (POISONED, "relaybus_poisoned_transactions_total", COUNTER, NONE,                                                 \
      "Transactions poisoned: a publish lost its connection or an outbox write failed, so their commit is refused.")  \
   X (POISON_REFUSED, "relaybus_poisoned_commits_refused_total", COUNTER, NONE,                                        \
      "commitTransaction requests of poisoned transactions, aborted instead of forwarded.")                           \
   X (POISON_FULL_REFUSED, "relaybus_poisoned_table_full_refusals_total", COUNTER, NONE,                               \
      "Annotated statements and relaybusPublish calls refused (transient error) because max_poisoned_transactions "   \
      "were held.")                                                                                                   \
   X (POISON_ENTRIES, "relaybus_poisoned_transactions", GAUGE, NONE,                                                   \
      "Poisoned transactions remembered now.") /* set per scrape */                                                   \
   X (OUTBOX_WRITES_REFUSED, "relaybus_outbox_client_writes_refused_total", COUNTER, NONE,                             \
      "Client commands refused (Unauthorized) because they write the outbox collections.")                            \
   X (EVENTS_UNROUTED, "relaybus_events_unrouted_total", COUNTER, TYPE,                                                \
      "Annotated events no handler (local or of a live proxy) subscribes to, by type (the first 100 types; later "    \
      "ones as _other).")                                                                                             \
   /* dispatch */                                                                                                      \
   X (DISPATCH_CLAIMS, "relaybus_dispatch_claims_total", COUNTER, NONE, "Claim calls made by this process's dispatcher.") \
   X (DISPATCH_CLAIMED, "relaybus_dispatch_claimed_total", COUNTER, NONE,                                              \
      "Deliveries claimed by this process's dispatcher.")                                                             \
   X (DISPATCH_COMPLETED, "relaybus_dispatch_completed_total", COUNTER, NONE,                                          \
      "Deliveries this process completed (all handlers).")                                                            \
   X (DISPATCH_RETRIED, "relaybus_dispatch_retried_total", COUNTER, NONE,                                              \
      "Delivery attempts this process rescheduled (all handlers).")                                                   \
   X (DISPATCH_DEAD, "relaybus_dispatch_dead_total", COUNTER, NONE, "Deliveries this process buried (all handlers).") \
   X (DISPATCH_LOST_COMPLETIONS, "relaybus_dispatch_lost_completions_total", COUNTER, NONE,                            \
      "Completions not proven because a lane changed hands (they may run again).")                                    \
   X (DISPATCH_HTTP_REQUESTS, "relaybus_dispatch_http_requests_total", COUNTER, NONE, "Webhook requests started.")    \
   X (DISPATCH_LEASE_SHORT, "relaybus_dispatch_lease_short_total", COUNTER, NONE,                                      \
      "Deliveries given back unstarted because less than a third of lease_ms was left of their lease.")               \
   X (DELIVERIES_COMPLETED, "relaybus_deliveries_completed_total", COUNTER, HANDLER, "Deliveries completed, by handler.") \
   X (DELIVERIES_RETRIED, "relaybus_deliveries_retried_total", COUNTER, HANDLER,                                       \
      "Delivery attempts that failed and were rescheduled, by handler.")                                              \
   X (DELIVERIES_DEAD, "relaybus_deliveries_dead_total", COUNTER, HANDLER,                                             \
      "Deliveries that became dead letters, by handler.")                                                             \
   X (HANDLER_LATENCY, "relaybus_handler_latency_seconds", HISTOGRAM, HANDLER,                                         \
      "Time from a send's start (a webhook request, a broker publish) to its answer, by handler.")                                               \
   X (ATTEMPT_DURATION, "relaybus_attempt_duration_seconds", HISTOGRAM, HANDLER_OUTCOME,                               \
      "How long each delivery attempt this process ran took, from its start (a send, a pull claim) to its end, by "    \
      "handler and outcome (succeeded, failed, timed_out, lease_lost, refused, released).")                           \
   X (RATE_LIMITED, "relaybus_handler_rate_limited", GAUGE, HANDLER,                                                   \
      "Deliveries this process claimed that wait for a token of their handler's rate_limit now.")                      \
   X (CLAIM_LATENCY, "relaybus_claim_latency_seconds", HISTOGRAM, NONE, "Duration of one claim call.")                \
   /* pull consumers */                                                                                                \
   X (CONSUMER_CLAIMED, "relaybus_consumer_claimed_total", COUNTER, HANDLER,                                           \
      "Deliveries handed out to pull consumers (relaybusClaim), by handler.")                                          \
   X (CONSUMER_COMPLETED, "relaybus_consumer_completed_total", COUNTER, HANDLER,                                       \
      "Deliveries pull consumers completed with relaybusComplete outside a transaction, by handler.")                  \
   X (CONSUMER_COMPLETED_TXN, "relaybus_consumer_completed_in_transaction_total", COUNTER, HANDLER,                     \
      "Deliveries pull consumers completed inside their own transaction, counted at its commit, by handler.")          \
   X (CONSUMER_CLOSED_CHARGED, "relaybus_consumer_closed_charged_total", COUNTER, HANDLER,                             \
      "Claims charged one attempt because the consumer's connection closed, by handler.")                             \
   X (CONSUMER_CHARGES_RETRIED, "relaybus_consumer_charges_retried_total", COUNTER, NONE,                            \
      "Charges of a closed connection's claims retried later because an open transaction held their delivery.")    \
   X (STORE_DEFERRED, "relaybus_store_deferred_completion_times_total", COUNTER, NONE,                              \
      "Events' completion times a completion deferred because an open transaction held the event.")                 \
   X (STORE_DEFERRED_DROPPED, "relaybus_store_deferred_completion_times_dropped_total", COUNTER, NONE,              \
      "Deferred events' completion times dropped because the deferred list was full.")                             \
   X (CONSUMER_CONNECTIONS, "relaybus_consumer_connections", GAUGE, HANDLER,                                           \
      "Client connections that hold claims of the handler or wait in a relaybusClaim long poll for it now.")           \
   X (CONSUMER_CLAIMS, "relaybus_consumer_claims", GAUGE, HANDLER,                                                     \
      "Claims pull consumers hold now and have not settled, by handler.")                                             \
   X (CONSUMER_LONG_POLLS, "relaybus_consumer_long_polls", GAUGE, HANDLER,                                             \
      "relaybusClaim long polls waiting now, by handler.")                                                            \
   X (FLEET_INSTANCES, "relaybus_fleet_instances", GAUGE, NONE,                                                        \
      "Live proxy instances in the fleet's handler set as this process last read it.") /* set per scrape */           \
   X (HANDLER_SETS_DISAGREEING, "relaybus_handler_sets_disagreeing", GAUGE, NONE,                                      \
      "Handler names live proxies declare differently (kind, events or settings hash).") /* set per scrape */         \
   X (RETIRED_DELIVERIES, "relaybus_handler_retired_deliveries_total", COUNTER, NONE,                                  \
      "Pending deliveries this process moved to the dead letters because no live proxy declared their handler.")      \
   X (REPLAYS, "relaybus_replays_total", COUNTER, NONE, "POST /api/replay requests that queued their window.")      \
   X (REPLAYED_DELIVERIES, "relaybus_replayed_deliveries_total", COUNTER, NONE,                                        \
      "Deliveries POST /api/replay queued (events sent again to a handler).")                                         \
   X (DISABLED_HANDLERS, "relaybus_disabled_handlers", GAUGE, NONE,                                                    \
      "Handlers disabled in the outbox (410 Gone, failing, operator) as this process last read them.")                \
   X (HANDLER_STATE_CHANGES, "relaybus_handler_state_changes_total", COUNTER, STATE,                                  \
      "Handlers this process disabled or enabled, by reason.")                                                         \
   X (PURGE_RUNS, "relaybus_purge_runs_total", COUNTER, NONE, "Scheduled purge runs this process completed.")         \
   X (PURGE_ERRORS, "relaybus_purge_errors_total", COUNTER, NONE, "Scheduled purge runs this process ended on an error.") \
   X (PURGED_EVENTS, "relaybus_purged_events_total", COUNTER, NONE,                                                    \
      "Events (deduplication records) removed by scheduled purges of this process.")                                  \
   X (PURGED_DEAD, "relaybus_purged_dead_letters_total", COUNTER, NONE,                                                \
      "Dead deliveries removed by scheduled purges of this process.")                                                 \
   X (PURGED_HISTORY, "relaybus_purged_history_total", COUNTER, NONE,                                                  \
      "Completion history records removed by scheduled purges of this process.")

/* A metric's id is the index of its first slot in counters_slots: its
 * samples take COUNTERS_SLOTS (type, label) slots from there. */
#define COUNTERS_SLOTS(type, label) (COUNTERS_WIDTH_##type * COUNTERS_SLOTS_LABEL_##label)

typedef enum {
#define COUNTERS_X_ID(id, name, type, label, help) \
   COUNTER_##id, COUNTERS_LAST_SLOT_##id = COUNTER_##id + COUNTERS_SLOTS (type, label) - 1,
   COUNTERS_TABLE (COUNTERS_X_ID)
#undef COUNTERS_X_ID
   COUNTERS_N_SLOTS
} counter_id_t;

/* The values, zero at start (BUILD_INFO: 1).  Read and written only
 * through the functions below. */
extern _Atomic uint64_t counters_slots[COUNTERS_N_SLOTS];

/* One metric's declaration, for rendering. */
typedef struct {
   counter_id_t id;
   const char *name, *help;
   counters_type_t type;
   counters_label_t label;
} counters_def_t;

/* The declarations in table order; *n is set to how many. */
const counters_def_t *counters_defs (size_t *n);

/* ------------------------------------------------------------ writing */

/* Unlabelled counters and gauges (slot 0). */
static inline void
counters_add (counter_id_t id, uint64_t n)
{
   atomic_fetch_add_explicit (&counters_slots[id], n, memory_order_relaxed);
}

static inline void
counters_sub (counter_id_t id, uint64_t n)
{
   atomic_fetch_sub_explicit (&counters_slots[id], n, memory_order_relaxed);
}

static inline void
counters_set (counter_id_t id, uint64_t v)
{
   atomic_store_explicit (&counters_slots[id], v, memory_order_relaxed);
}

/* Sample `slot` of a labelled counter (a close reason, a publishing error
 * kind, a handler slot).  `slot` must be below the label's slot count; the
 * debug check is only against the widest label and the table's end, which
 * costs two compares instead of a lookup. */
static inline void
counters_add_at (counter_id_t id, size_t slot, uint64_t n)
{
   RELAYBUS_ASSERT (slot < COUNTERS_SLOTS_LABEL_HANDLER && (size_t) id + slot < COUNTERS_N_SLOTS);
   atomic_fetch_add_explicit (&counters_slots[id + slot], n, memory_order_relaxed);
}

/* Sets sample `slot` of a labelled gauge (one writer per gauge). */
static inline void
counters_set_at (counter_id_t id, size_t slot, uint64_t v)
{
   RELAYBUS_ASSERT (slot < COUNTERS_SLOTS_LABEL_HANDLER && (size_t) id + slot < COUNTERS_N_SLOTS);
   atomic_store_explicit (&counters_slots[id + slot], v, memory_order_relaxed);
}

/* Counts one closed connection under `reason` (anything out of range as
 * internal); the caller owns the open gauge. */
void counters_count_close (counters_close_reason_t reason);

/* "client_eof", ... for logs and the reason label. */
const char *counters_close_reason_name (counters_close_reason_t reason);

/* Counts one command by name (a fixed set of names; others and NULL count
 * as "other").  Hellos are not counted here (COUNTER_HELLOS_REWRITTEN). */
void counters_count_command (const char *cmd);

/* One observation of `ms` (negative as 0) in sample `slot` of histogram
 * `id`. */
void counters_observe (counter_id_t id, size_t slot, int64_t ms);

/* The handler slot of `name`, added on first use when `add`; SIZE_MAX when
 * it is not there (or the table is full, or the name too long).  Lookups
 * take no lock; adding does. */
size_t counters_handler_slot (const char *name, bool add);

/* One delivery attempt of `handler` ended as `outcome`
 * (COUNTER_DELIVERIES_COMPLETED, _RETRIED or _DEAD) after `latency_ms` in
 * the handler: counts it and observes the handler's latency. */
void counters_delivery (const char *handler, counter_id_t outcome, int64_t latency_ms);

/* One attempt of a delivery of `handler` that this process ran ended as
 * `outcome` after `ms`: observed in relaybus_attempt_duration_seconds. */
void counters_attempt (const char *handler, outbox_attempt_outcome_t outcome, int64_t ms);

/* An annotated event of `type` that no handler subscribes to: the first
 * COUNTERS_MAX_EVENT_TYPES distinct types get their own series, the rest
 * count under COUNTERS_EVENT_TYPE_OTHER.  Lock-free once the type has its
 * series. */
void counters_unrouted (const char *type);

/* ------------------------------------------------------------ reading */

/* Unlabelled value, and value of sample `slot`. */
static inline uint64_t
counters_get (counter_id_t id)
{
   return atomic_load_explicit (&counters_slots[id], memory_order_relaxed);
}

static inline uint64_t
counters_get_at (counter_id_t id, size_t slot)
{
   RELAYBUS_ASSERT (slot < COUNTERS_SLOTS_LABEL_HANDLER && (size_t) id + slot < COUNTERS_N_SLOTS);
   return atomic_load_explicit (&counters_slots[id + slot], memory_order_relaxed);
}

/* The key of `label` ("reason", ...; NULL for NONE). */
const char *counters_label_key (counters_label_t label);
/* A second label of each sample of `label` (HANDLER_OUTCOME: "outcome"),
 * with its value for the i-th sample; NULL when `label` has one. */
const char *counters_label_key2 (counters_label_t label);
const char *counters_label_value2 (counters_label_t label, size_t i);

/* The i-th value of `label` to render now, counting i from 0 until it
 * returns NULL, with the slot that holds its sample.  *omit_if_zero is set
 * for a sample that is rendered only once it is non-zero (the "_other" of
 * event types). */
const char *counters_label_value (counters_label_t label, size_t i, size_t *slot, bool *omit_if_zero);

/* One observation of `us` microseconds (negative as 0) by forwarding loop
 * `loop` in LOOP_HISTOGRAM `id`: relaxed adds to that loop's own slots. */
static inline void
counters_observe_loop_us (counter_id_t id, unsigned loop, int64_t us)
{
   size_t base = (size_t) id + (size_t) loop * COUNTERS_WIDTH_LOOP_HISTOGRAM;
   size_t b = 0;

   RELAYBUS_ASSERT (loop < COUNTERS_LOOPS_MAX && base + COUNTERS_WIDTH_LOOP_HISTOGRAM <= COUNTERS_N_SLOTS);
   if (us < 0)
      us = 0;
   while (b < COUNTERS_N_BUCKETS_US && us > counters_bucket_us[b])
      b++;
   atomic_fetch_add_explicit (&counters_slots[base + b], 1, memory_order_relaxed);
   atomic_fetch_add_explicit (&counters_slots[base + COUNTERS_LOOP_HISTOGRAM_SUM], (uint64_t) us, memory_order_relaxed);
}

/* LOOP_HISTOGRAM `id` with every loop's sample added up: buckets (not
 * cumulative, the last one +Inf), the sum in µs, the count. */
typedef struct {
   uint64_t buckets[COUNTERS_N_BUCKETS_US + 1];
   uint64_t sum_us;
   uint64_t count;
} counters_loop_histogram_t;
void counters_loop_histogram (counter_id_t id, counters_loop_histogram_t *out);

/* Histogram sample `slot` of `id`: its buckets (not cumulative, the last
 * one +Inf), the sum in ms, and the count (the buckets' sum). */
typedef struct {
   uint64_t buckets[COUNTERS_N_BUCKETS + 1];
   uint64_t sum_ms;
   uint64_t count;
} counters_histogram_t;
void counters_histogram (counter_id_t id, size_t slot, counters_histogram_t *out);

#endif /* RELAYBUS_BASE_COUNTERS_H */
