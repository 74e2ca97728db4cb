/*
 * dispatch/format.h - what one delivery looks like on the wire: its body,
 * its content type and its protocol headers, for a handler's `format`
 * (relaybus, cloudevents, cloudevents-structured, payload) and `json`
 * (relaxed, canonical, plain), in each kind's binding (HTTP, Kafka, NATS,
 * AMQP, a pull consumer's delivery).  The one place every kind takes its
 * message from: the dispatcher renders a delivery before it hands it to
 * the kind's transport, and the consumer thread before relaybusClaim
 * answers.  The W3C trace context of the event (its `traceparent` and
 * `tracestate` headers) is carried here too, as the protocol's header.
 *
 * Pure functions: no I/O, no store, no loop.  Not here: how a kind sends
 * what is rendered (dispatch/webhook.h, dispatch/transport.h), the
 * Standard Webhooks signature (it signs the rendered body), and the
 * validation of a traceparent at publish (codec/annotate.h).
 *
 * Thread: any; a format_msg_t belongs to whoever rendered it.
 */
#ifndef RELAYBUS_FORMAT_H
#define RELAYBUS_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/config.h"
#include "store/store.h"

typedef enum {
   FORMAT_ERROR_JSON = 1, /* the event has a value libbson writes no JSON for */
} format_error_code_t;

/* The protocol a message is rendered for: its header names. */
typedef enum {
   FORMAT_BINDING_HTTP,  /* webhook: ce-* headers, Content-Type */
   FORMAT_BINDING_KAFKA, /* ce_* headers, content-type */
   FORMAT_BINDING_NATS,  /* ce-* headers, content-type */
   FORMAT_BINDING_AMQP,  /* cloudEvents_* headers; content_type is a property */
   FORMAT_BINDING_PULL,  /* no headers: a relaybusClaim delivery's fields */
} format_binding_t;

/* The CloudEvents spec version every cloudevents format declares. */
#define FORMAT_CE_SPECVERSION "1.0"
/* `source` when a handler names none (config.c's default). */
#define FORMAT_CE_SOURCE_DEFAULT "relaybus-proxy"

/* One protocol header.  `numeric` headers (relaybus-sequence) keep their
 * number for a protocol that types its headers (AMQP). */
typedef struct {
   char *name;
   char *value;
   bool numeric;
   int64_t number;
} format_header_t;

/* A byte no header value carries as it is: an ASCII control character
 * other than the tab (CR and LF would end the header and start another).
 * format_render writes each as %XX. */
#define FORMAT_HEADER_CTL(c) ((((unsigned char) (c)) < 0x20 && (c) != '\t') || ((unsigned char) (c)) == 0x7f)

/* Whether `s` holds no FORMAT_HEADER_CTL byte: what each transport checks
 * of every header name and value once more where it emits them. */
bool format_header_safe (const char *s);

/* What a handler's settings ask of the rendering, copied out of its
 * config_handler_t (a snapshot may be released while a message waits). */
typedef struct {
   handler_format_t format;
   handler_json_t json;
   const char *source; /* borrowed; never NULL */
} format_opts_t;

/* A rendered message: owned by its caller, freed by format_msg_fini. */
typedef struct {
   char *body;
   size_t body_len;
   const char *content_type; /* static text */
   format_header_t *headers;
   size_t n_headers;
   /* The event's W3C trace context (NULL without one): also among the
    * headers of every binding but PULL, which carries them as fields. */
   const char *traceparent; /* points into the headers or the event */
   const char *tracestate;
} format_msg_t;

/* The binding of a handler kind (PULL for pull). */
format_binding_t format_binding_of (handler_kind_t kind);

/* The options of handler `h` (borrowing its source). */
void format_opts_from_handler (format_opts_t *o, const config_handler_t *h);

/* Renders delivery `d` for binding `b`; `out` is zeroed first and is
 * always fit for format_msg_fini.  False (error set) only when the event
 * cannot be written as JSON at all. */
bool format_render (const format_opts_t *o, format_binding_t b, const store_delivery_t *d, format_msg_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* NULL-safe; leaves `m` zeroed. */
void format_msg_fini (format_msg_t *m);

/* The value of header `name` (ASCII case-insensitive), or NULL. */
const char *format_msg_header (const format_msg_t *m, const char *name);

/* ms since the epoch as RFC 3339 in UTC with milliseconds
 * ("2024-01-02T03:04:05.678Z"); false (out untouched) for a year outside
 * 0000-9999, which RFC 3339 cannot write. */
bool format_rfc3339 (int64_t ms, char out[32]);

#endif /* RELAYBUS_FORMAT_H */
