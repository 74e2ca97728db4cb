/*
 * base/trace.h - span export: the proxy's own spans of an event's trace
 * (a `publish` span at injection, a `send` span per delivery attempt),
 * sent to an OpenTelemetry collector as OTLP/HTTP with JSON encoding
 * (POST <otlp_endpoint>/v1/traces) by a thread of its own.
 *
 * Where to, and as what service: [tracing] (trace_options_t, which main.c
 * fills from the configuration), and where a key is empty,
 * OpenTelemetry's environment (trace_settings_t).
 *
 * A span is a fixed-size value copied into a bounded queue
 * (TRACE_QUEUE_MAX spans): trace_emit takes a mutex for the copy and
 * never allocates, waits or does I/O, so the forwarding loops and the
 * dispatcher may call it.  When the queue is full (the collector is slow
 * or gone) the span is dropped and counted
 * (relaybus_trace_spans_dropped_total), as are the spans of a batch the
 * collector did not take; a batch the collector answers 429, 502, 503 or
 * 504 is sent again with backoff (or after its Retry-After) while new spans
 * wait in the queue.  Bodies are gzip-compressed.
 *
 * Also here, pure: W3C traceparent parsing and writing, and the OTLP JSON
 * encoding of a batch (trace_encode_otlp_json).  Not here: which spans
 * exist (publish/inject.c, dispatch/dispatch.c) and the validation of an
 * annotation's traceparent (codec/annotate.c).
 *
 * Thread: any.  trace_start and trace_stop: the main thread (start-up,
 * exit); the export thread is this module's own.
 */
#ifndef RELAYBUS_TRACE_H
#define RELAYBUS_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/errors.h"

#define TRACE_QUEUE_MAX 4096 /* spans waiting for the export thread */
#define TRACE_BATCH_MAX 256  /* spans per POST */
#define TRACE_ATTRS_MAX 14
#define TRACE_ATTR_KEY_MAX 40
#define TRACE_ATTR_VALUE_MAX 200
#define TRACE_NAME_MAX 96
#define TRACE_PARENT_LEN 55 /* "00-" 32 hex "-" 16 hex "-" 2 hex */

typedef enum {
   TRACE_ERR_CONFIG = 1, /* a [tracing] value cannot be used */
   TRACE_ERR_START,      /* the export thread could not start */
} trace_error_code_t;

/* OTLP's SpanKind values. */
typedef enum {
   TRACE_KIND_INTERNAL = 1,
   TRACE_KIND_SERVER = 2,
   TRACE_KIND_CLIENT = 3,
   TRACE_KIND_PRODUCER = 4,
   TRACE_KIND_CONSUMER = 5,
} trace_kind_t;

typedef struct {
   char key[TRACE_ATTR_KEY_MAX];
   bool is_int;
   int64_t int_value;
   char str_value[TRACE_ATTR_VALUE_MAX];
} trace_attr_t;

/* One finished span: a plain value, copied by trace_emit. */
typedef struct {
   uint8_t trace_id[16];
   uint8_t span_id[8];
   uint8_t parent_id[8]; /* all zero: a root span */
   trace_kind_t kind;
   char name[TRACE_NAME_MAX];
   int64_t start_ns, end_ns; /* unix nanoseconds */
   bool error;               /* status ERROR (else UNSET) */
   trace_attr_t attrs[TRACE_ATTRS_MAX];
   size_t n_attrs;
} trace_span_t;

/* The trace context a traceparent carries. */
typedef struct {
   uint8_t trace_id[16];
   uint8_t span_id[8];
   uint8_t flags;
} trace_context_t;

#define TRACE_URL_MAX 1024

/* [tracing] as the configuration gives it (main.c fills it from the
 * snapshot); NULL or "" where a key is empty. */
typedef struct {
   const char *otlp_endpoint;       /* a base URL: "/v1/traces" is appended */
   const char *sample;              /* never, always or a ratio (trace_parse_sample) */
   const char *service_name;
   const char *resource_attributes; /* "k=v,k=v" */
} trace_options_t;

/* Where spans go and as what, from [tracing] (trace_options_t) and, where
 * a key is empty, OpenTelemetry's environment variables (the
 * configuration wins):
 *   url: [tracing] otlp_endpoint + "/v1/traces", else
 *        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, else
 *        OTEL_EXPORTER_OTLP_ENDPOINT + "/v1/traces"; "" when none is set;
 *   resource attributes: OTEL_RESOURCE_ATTRIBUTES (%-decoded), with
 *        [tracing] resource_attributes over them, key by key;
 *   service_name: [tracing] service_name, else OTEL_SERVICE_NAME, else a
 *        service.name attribute, else "relaybus-proxy";
 *   headers: OTEL_EXPORTER_OTLP_HEADERS, with
 *        OTEL_EXPORTER_OTLP_TRACES_HEADERS over them (names compared
 *        without case), %-decoded; items that are not name=value with a
 *        token name and a value without control characters are left out.
 * OTEL_SDK_DISABLED=true, or an OTEL_TRACES_EXPORTER without otlp (none),
 * makes the environment count for nothing. */
typedef struct {
   char url[TRACE_URL_MAX];
   const char *url_from; /* the setting that named url (static), or NULL */
   char *service_name;
   char **attr_keys, **attr_values;
   size_t n_attrs;
   char **header_names, **header_values;
   size_t n_headers;
} trace_settings_t;

/* Fills `out` (trace_settings_fini frees it); false (error set) when the
 * configuration's endpoint cannot be used.  A bad environment variable is
 * logged and left out, never fatal. */
bool trace_settings_resolve (const trace_options_t *opts, trace_settings_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
void trace_settings_fini (trace_settings_t *s);

/* Starts the export thread when trace_settings_resolve finds an endpoint;
 * without one, true and nothing runs (trace_enabled stays false).  False
 * (error set) when sample cannot be read or the thread cannot start. */
bool trace_start (const trace_options_t *opts, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Sends what is queued (one last attempt, bounded by the request
 * timeout), stops the thread and frees everything; NULL-safe to repeat. */
void trace_stop (void);

/* Whether spans are exported (trace_start found an endpoint). */
bool trace_enabled (void);

/* Whether a publish without a traceparent starts a trace of its own
 * ([tracing] sample): never, always, or a fraction of them. */
bool trace_sample (void);

/* [tracing] sample: never (or empty), always, or a ratio from 0 to 1, as
 * a threshold on a random 32-bit value (0: never, 2^32: always); false
 * for anything else.  Config validation reads it too. */
bool trace_parse_sample (const char *v, uint64_t *threshold) __attribute__ ((warn_unused_result));

/* Copies `s` into the queue, or drops and counts it when full. */
void trace_emit (const trace_span_t *s);

/* A new random id (8 bytes for a span, 16 for a trace), never all zero. */
void trace_new_id (uint8_t *out, size_t n);

/* Unix time in nanoseconds. */
int64_t trace_now_ns (void);

/* Reads a version-00 traceparent (55 characters, lower-case hex, ids not
 * all zero); false for anything else. */
bool trace_parse_traceparent (const char *s, trace_context_t *out);

/* Writes `c` as a version-00 traceparent, NUL-terminated. */
void trace_format_traceparent (const trace_context_t *c, char out[TRACE_PARENT_LEN + 1]);

/* Adds an attribute (silently ignored past TRACE_ATTRS_MAX; values are
 * cut at TRACE_ATTR_VALUE_MAX - 1 bytes on a UTF-8 boundary). */
void trace_span_str (trace_span_t *s, const char *key, const char *value);
void trace_span_int (trace_span_t *s, const char *key, int64_t value);

/* The HTTP client attributes of a request's span (OpenTelemetry's HTTP
 * conventions): http.request.method, url.full with its user, password and
 * query values replaced by REDACTED, server.address and server.port. */
void trace_span_http_client (trace_span_t *s, const char *method, const char *url);

/* The OTLP JSON body of `n` spans (ExportTraceServiceRequest): one
 * resourceSpans with service.name, service.version (this build's, unless
 * the attributes give one) and the resource attributes (a "k=v,k=v" list,
 * may be NULL), one scopeSpans.  Caller frees with
 * bson_free. */
char *trace_encode_otlp_json (const trace_span_t *spans,
                              size_t n,
                              const char *service_name,
                              const char *resource_attributes,
                              size_t *len);

#endif /* RELAYBUS_TRACE_H */
