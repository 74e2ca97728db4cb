/*
 * dispatch/span.h - the send span of one delivery attempt (base/trace.h):
 * begun when the dispatcher renders the attempt's message (the attempt's
 * own span id written into its traceparent, so the receiver's span is a
 * child of it), emitted when the send's result comes.
 *
 * Thread: the dispatcher's.
 */
#ifndef RELAYBUS_DISPATCH_SPAN_H
#define RELAYBUS_DISPATCH_SPAN_H

#include <stdbool.h>
#include <stdint.h>

#include "base/config.h"
#include "base/trace.h"
#include "dispatch/format.h"
#include "dispatch/transport.h"
#include "store/store.h"

/* An attempt's send span (spans exported and the event has a trace
 * context): the trace, the parent (the publish span the stored
 * traceparent names) and the attempt's own span id, which the outgoing
 * traceparent carries. */
typedef struct {
   bool traced;
   trace_context_t trace;
   uint8_t span_id[8];
   int64_t start_ns;
} dispatch_span_t;

/* When spans are exported and msg has a traceparent: the attempt gets a
 * span id of its own, written into that header in place (same length).
 * Otherwise the header passes through as stored and nothing is traced. */
void dispatch_span_begin (dispatch_span_t *s, format_msg_t *msg);
/* Emits the span of an attempt of `d` for handler `hc` that ended with
 * `res`: a child of the publish span, kind CLIENT for a webhook (an HTTP
 * request) and PRODUCER for a broker, as OpenTelemetry's messaging and
 * HTTP conventions have them.  Nothing when it is not traced. */
void dispatch_span_end (const dispatch_span_t *s, const config_handler_t *hc, const store_delivery_t *d, const transport_result_t *res);
/* The log lines that follow are about this attempt: JSON lines carry its
 * trace (log_set_trace); nothing when it is not traced. */
void dispatch_span_log (const dispatch_span_t *s);

#endif /* RELAYBUS_DISPATCH_SPAN_H */
