/*
 * codec/annotate.h - the publishing annotation carried in a command's `comment`.
 *
 * Thread: any (pure: no I/O, no shared state).
 *
 * An application publishes events by adding them to the `comment` of a
 * statement it already runs inside a transaction:
 *
 *   comment: {relaybus: {type: "order.placed.v1", key: "o-1", payload: {...}}}
 *   comment: {relaybus: [{type: ...}, {type: ...}], traceId: "kept"}
 *   comment: 'relaybus:{"type": "order.placed.v1", "payload": {"$numberLong": "5"}}'
 *
 * This module finds such an annotation in a command body, validates every
 * event field (errors name the field: "relaybus: events[1].type must be a
 * non-empty string"), and builds the body to forward: the same command with
 * the relaybus part removed (other comment fields kept; a comment left empty,
 * or a string comment that was only the annotation, is dropped).
 *
 * Pure functions: no I/O, no logging; memory comes from libbson's allocator
 * (the parsed events point into one bson_t the annotate_t owns).  What to do with
 * the events (transactions, injected writes) is publish/inject.h's business.
 *
 * The limits below are part of the documented interface (docs/publishing.md).
 */
#ifndef RELAYBUS_ANNOTATE_H
#define RELAYBUS_ANNOTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "codec/wire.h"
#include "base/errors.h"

/* The string form: this prefix, optional white space, then Extended JSON
 * (canonical or relaxed) of a document or an array of documents. */
#define ANNOTATE_STRING_PREFIX "relaybus:"

#define ANNOTATE_MAX_EVENTS 100
/* The annotation's size: its BSON form (the document or array), and the
 * text of the string form, each at most this many bytes. */
#define ANNOTATE_MAX_BYTES (1024 * 1024)
/* Byte lengths of UTF-8 strings (without the terminating NUL). */
#define ANNOTATE_MAX_TYPE_LEN 256
#define ANNOTATE_MAX_ID_LEN 256
#define ANNOTATE_MAX_KEY_LEN 1024
#define ANNOTATE_MAX_REF_LEN 256 /* correlationId, causationId */
#define ANNOTATE_MAX_HEADERS 64
#define ANNOTATE_MAX_HEADER_NAME_LEN 256
#define ANNOTATE_MAX_HEADER_VALUE_LEN 8192
/* A generated id: the 24 hex digits of a fresh ObjectId. */
#define ANNOTATE_GENERATED_ID_LEN 24

/* Error codes in bson_error_t.code (domain ANNOTATE_ERROR_DOMAIN).  The
 * message is always the client-facing text, starting with "relaybus: ". */
typedef enum {
   ANNOTATE_ERR_INVALID = 1, /* the annotation is malformed: BadValue for the client */
} annotate_error_code_t;

/* One validated event.  Strings are NUL-terminated, valid UTF-8 without
 * embedded NULs, and point into the annotate_t's storage. */
typedef struct {
   const char *type;
   uint32_t type_len;
   const char *key; /* NULL: no ordering key */
   uint32_t key_len;
   const char *given_id; /* the annotation's id, or NULL: see annotate_event_id */
   char generated_id[ANNOTATE_GENERATED_ID_LEN + 1];
   bool has_payload; /* else the payload is null */
   bson_iter_t payload;
   bool has_headers; /* a non-empty document of strings */
   bson_iter_t headers;
   const char *correlation_id; /* NULL when absent */
   const char *causation_id;   /* NULL when absent */
   bool has_not_before;
   int64_t not_before_ms; /* milliseconds since the epoch */
} annotate_event_t;

/* A parsed annotation.  Owns `storage`, into which every event points, and
 * the `events` array (exactly n_events long).  Moving the struct (memcpy)
 * is safe: nothing points into it.  Release it with annotate_cleanup. */
typedef struct {
   bson_t *storage;
   annotate_event_t *events;
   uint32_t n_events;
   bool from_string; /* came from the string form */
} annotate_t;

typedef enum {
   ANNOTATE_ABSENT = 0, /* no annotation: forward the command unchanged */
   ANNOTATE_FOUND,      /* parsed and valid */
   ANNOTATE_INVALID,    /* annotated, but malformed: `error` says why */
} annotate_status_t;

/* True if the body carries an annotation (a `comment` document with a
 * `relaybus` field, or a string comment starting with the prefix), valid or
 * not.  Cheap: no allocation, no validation. */
bool annotate_present (const bson_t *body);

/* annotate_present for a parsed OP_MSG, from the facts wire_parse_msg
 * gathered while validating it: a body without a top-level `comment`
 * (nearly every command) costs nothing, one with a comment a look at that
 * field only.  Same answer as annotate_present (&msg->body). */
bool annotate_msg_present (const wire_msg_t *msg);

/* Finds, validates and parses the annotation of a command body.
 *
 * `out` and `forward` are always initialised (release them with
 * annotate_cleanup and bson_destroy, whatever the result).  With
 * ANNOTATE_FOUND, `out` holds the events and `forward` the body to send
 * upstream without the relaybus part; otherwise both are empty.  With
 * ANNOTATE_INVALID `error` holds the client-facing message.  Generated ids
 * are filled in for events without an id. */
annotate_status_t annotate_parse (const bson_t *body, annotate_t *out, bson_t *forward, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Parses a bare list of events (the `events` field of relaybusPublish):
 * `value` is positioned on an array of documents, or on one document.
 * `out` is always initialised.  Messages name events as "events[i]". */
bool annotate_parse_events (const bson_iter_t *value, annotate_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Builds `forward` (always initialised) as `body` without its relaybus part,
 * valid or not, and without validating anything: for commands whose comment
 * is only a driver's copy of another command's (getMore, killCursors), which
 * publish nothing but should not carry payloads to the server's logs.
 * False if the body could not be rebuilt. */
bool annotate_strip (const bson_t *body, bson_t *forward) __attribute__ ((warn_unused_result));

/* The event's id: the given one, or the generated one. */
const char *annotate_event_id (const annotate_event_t *ev);

/* Releases what `a` owns and leaves it empty.  NULL ok; idempotent. */
void annotate_cleanup (annotate_t *a);

#endif /* RELAYBUS_ANNOTATE_H */
