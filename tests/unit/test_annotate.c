/*
 * test_annotate.c - the publishing annotation: detection, every field's
 * validation (messages naming the field), the string form, limits, and the
 * forwarded body with the relaybus part removed.
 *
 * Command bodies are written as relaxed Extended JSON in tables; the cases
 * JSON cannot express (invalid UTF-8, sizes) are built with libbson.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "codec/annotate.h"

static bson_t *
json (const char *text)
{
   bson_error_t error;
   bson_t *b = bson_new_from_json ((const uint8_t *) text, -1, &error);

   if (!b)
      fail_msg ("bad test JSON (%s): %s", error.message, text);
   return b;
}

/* annotate_present, asked both ways: of the body, and of the body sent as
 * an OP_MSG (annotate_msg_present, from the parser's facts).  They agree. */
static bool
present (const bson_t *body)
{
   struct evbuffer *out = evbuffer_new ();
   static wire_msg_t msg;
   bson_error_t error;
   bool from_body = annotate_present (body), from_msg;

   assert_true (wire_append_msg (out, 1, 0, 0, body, NULL, 0));
   if (!wire_parse_msg (evbuffer_pullup (out, -1), evbuffer_get_length (out), &msg, &error))
      fail_msg ("test body does not parse as OP_MSG: %s", error.message);
   from_msg = annotate_msg_present (&msg);
   evbuffer_free (out);
   assert_int_equal (from_body, from_msg);
   return from_body;
}

static char *
to_json (const bson_t *b)
{
   return bson_as_relaxed_extended_json (b, NULL);
}

static void
assert_json_equal (const bson_t *got, const char *want_text)
{
   bson_t *want = json (want_text);

   if (!bson_equal (got, want)) {
      char *g = to_json (got), *w = to_json (want);

      fail_msg ("got %s\nwant %s", g, w);
   }
   bson_destroy (want);
}

/* A parse that must succeed; returns the annotation (caller frees). */
static annotate_t *
parse_ok (const char *body_text, const char *want_forward)
{
   bson_t *body = json (body_text);
   annotate_t *a = malloc (sizeof *a);
   bson_t fwd;
   bson_error_t error;
   annotate_status_t st = annotate_parse (body, a, &fwd, &error);

   if (st != ANNOTATE_FOUND)
      fail_msg ("expected FOUND for %s, got %d: %s", body_text, (int) st, st == ANNOTATE_INVALID ? error.message : "");
   assert_true (present (body));
   if (want_forward)
      assert_json_equal (&fwd, want_forward);
   bson_destroy (&fwd);
   bson_destroy (body);
   return a;
}

static void
free_annotation (annotate_t *a)
{
   annotate_cleanup (a);
   annotate_cleanup (a); /* idempotent */
   free (a);
}

/* --- tables --------------------------------------------------------- */

typedef struct {
   const char *body;
   const char *forward; /* the expected forwarded body */
   uint32_t n_events;
} good_case_t;

static const good_case_t good_cases[] = {
   /* The document form; the comment disappears when nothing else is left. */
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\"}}, \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
   /* Other comment fields are kept, in their order, at the comment's place. */
   {"{\"update\": \"o\", \"comment\": {\"trace\": \"a\", \"relaybus\": {\"type\": \"t\"}, \"z\": 1}, \"ordered\": true, "
    "\"$db\": \"d\"}",
    "{\"update\": \"o\", \"comment\": {\"trace\": \"a\", \"z\": 1}, \"ordered\": true, \"$db\": \"d\"}",
    1},
   /* An array of events. */
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": [{\"type\": \"a\"}, {\"type\": \"b\", \"key\": \"k\"}]}, \"$db\": "
    "\"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    2},
   /* Every field, nulls for the optional ones meaning absent. */
   {"{\"delete\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\", \"payload\": null, \"key\": null, \"id\": null, "
    "\"headers\": null, \"correlationId\": null, \"causationId\": null, \"notBefore\": null}}, \"$db\": \"d\"}",
    "{\"delete\": \"o\", \"$db\": \"d\"}",
    1},
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\", \"payload\": {\"a\": [1, {\"$k\": \"v\"}], "
    "\"b.c\": 2}, \"key\": \"k\", \"id\": \"e-1\", \"headers\": {\"h\": \"v\"}, \"correlationId\": \"c\", "
    "\"causationId\": \"x\", \"notBefore\": {\"$date\": \"2026-01-01T00:00:00Z\"}}}, \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
   /* The string form: document, array, white space, canonical and relaxed. */
   {"{\"insert\": \"o\", \"comment\": \"relaybus:{\\\"type\\\": \\\"t\\\"}\", \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
   {"{\"insert\": \"o\", \"comment\": \"relaybus: \\n [{\\\"type\\\": \\\"t\\\"}, {\\\"type\\\": \\\"u\\\", "
    "\\\"payload\\\": {\\\"n\\\": {\\\"$numberLong\\\": \\\"5\\\"}}}] \", \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    2},
   {"{\"insert\": \"o\", \"comment\": \"relaybus:{\\\"type\\\": \\\"t\\\", \\\"notBefore\\\": {\\\"$date\\\": "
    "{\\\"$numberLong\\\": \\\"1767225600000\\\"}}}\", \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
   /* Payload of any type. */
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\", \"payload\": \"s\"}}, \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\", \"payload\": [1, 2]}}, \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
   /* Empty headers count as none. */
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\", \"headers\": {}}}, \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
   /* W3C trace context: version 00, and a later version with more fields. */
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\", \"headers\": {\"traceparent\": "
    "\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\", \"tracestate\": \"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE\"}}}, "
    "\"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t\", \"headers\": {\"Traceparent\": "
    "\"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future\"}}}, \"$db\": \"d\"}",
    "{\"insert\": \"o\", \"$db\": \"d\"}",
    1},
};

typedef struct {
   const char *body;
   const char *message; /* the whole expected message */
} bad_case_t;

#define WRAP(ev) "{\"insert\": \"o\", \"comment\": {\"relaybus\": " ev "}, \"$db\": \"d\"}"
#define WRAPS(text) "{\"insert\": \"o\", \"comment\": \"relaybus:" text "\", \"$db\": \"d\"}"

static const bad_case_t bad_cases[] = {
   {WRAP ("5"), "relaybus: comment.relaybus must be a document (one event) or an array of documents"},
   {WRAP ("\"t\""), "relaybus: comment.relaybus must be a document (one event) or an array of documents"},
   {WRAP ("[]"), "relaybus: the annotation has no events (an empty array)"},
   {WRAP ("[5]"), "relaybus: events[0] must be a document"},
   {WRAP ("{}"), "relaybus: events[0].type must be a non-empty string"},
   {WRAP ("{\"type\": \"\"}"), "relaybus: events[0].type must be a non-empty string"},
   {WRAP ("{\"type\": 5}"), "relaybus: events[0].type must be a non-empty string"},
   {WRAP ("{\"type\": null}"), "relaybus: events[0].type must be a non-empty string"},
   {WRAP ("[{\"type\": \"a\"}, {\"type\": 1}]"), "relaybus: events[1].type must be a non-empty string"},
   {WRAP ("[{\"type\": \"a\"}, {\"payload\": 1}]"), "relaybus: events[1].type must be a non-empty string"},
   {WRAP ("{\"type\": \"a\", \"type\": \"b\"}"), "relaybus: events[0].type is given twice"},
   {WRAP ("{\"type\": \"a\", \"foo\": 1}"),
    "relaybus: events[0].foo is not an event field (type, payload, key, id, headers, correlationId, causationId, "
    "notBefore)"},
   {WRAP ("{\"type\": \"a\", \"Key\": \"k\"}"),
    "relaybus: events[0].Key is not an event field (type, payload, key, id, headers, correlationId, causationId, "
    "notBefore)"},
   {WRAP ("{\"type\": \"a\", \"key\": 5}"), "relaybus: events[0].key must be a non-empty string"},
   {WRAP ("{\"type\": \"a\", \"key\": \"\"}"), "relaybus: events[0].key must be a non-empty string"},
   {WRAP ("{\"type\": \"a\", \"id\": {\"$oid\": \"000000000000000000000000\"}}"),
    "relaybus: events[0].id must be a non-empty string"},
   {WRAP ("{\"type\": \"a\", \"headers\": \"h\"}"), "relaybus: events[0].headers must be a document of strings"},
   {WRAP ("{\"type\": \"a\", \"headers\": [\"h\"]}"), "relaybus: events[0].headers must be a document of strings"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"h\": 1}}"), "relaybus: events[0].headers.h must be a non-empty string"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"h\": \"1\", \"h\": \"2\"}}"),
    "relaybus: events[0].headers.h is given twice"},
   /* W3C trace context: a malformed traceparent is refused with the reason. */
   {WRAP ("{\"type\": \"a\", \"headers\": {\"traceparent\": \"00-abc\"}}"),
    "relaybus: events[0].headers.traceparent is shorter than the 55 characters of 00-<32 hex trace-id>-<16 hex "
    "parent-id>-<2 hex flags> (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"traceparent\": \"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01\"}}"),
    "relaybus: events[0].headers.traceparent has a trace-id that is not 32 lower-case hex digits (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"traceparent\": \"00-00000000000000000000000000000000-00f067aa0ba902b7-01\"}}"),
    "relaybus: events[0].headers.traceparent has an all-zero trace-id (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01\"}}"),
    "relaybus: events[0].headers.traceparent has an all-zero parent-id (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"traceparent\": \"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}}"),
    "relaybus: events[0].headers.traceparent has a version that is not 2 lower-case hex digits other than ff (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x\"}}"),
    "relaybus: events[0].headers.traceparent is version 00 and longer than 55 characters (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g\"}}"),
    "relaybus: events[0].headers.traceparent has trace-flags that are not 2 lower-case hex digits (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"tracestate\": \"v=1\"}}"),
    "relaybus: events[0].headers.tracestate without a traceparent (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"headers\": {\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\", \"tracestate\": \"v=\u00e9\"}}"),
    "relaybus: events[0].headers.tracestate holds a character that is not printable ASCII (W3C Trace Context)"},
   {WRAP ("{\"type\": \"a\", \"correlationId\": 1}"), "relaybus: events[0].correlationId must be a non-empty string"},
   {WRAP ("{\"type\": \"a\", \"causationId\": true}"), "relaybus: events[0].causationId must be a non-empty string"},
   {WRAP ("{\"type\": \"a\", \"notBefore\": \"2026-01-01\"}"), "relaybus: events[0].notBefore must be a date"},
   {WRAP ("{\"type\": \"a\", \"notBefore\": 1767225600000}"), "relaybus: events[0].notBefore must be a date"},
   {WRAP ("[{\"type\": \"a\", \"id\": \"x\"}, {\"type\": \"b\"}, {\"type\": \"c\", \"id\": \"x\"}]"),
    "relaybus: events[2].id repeats events[0].id"},
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"a\"}, \"relaybus\": {\"type\": \"b\"}}, \"$db\": "
    "\"d\"}",
    "relaybus: comment.relaybus is given twice"},
   {"{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"a\"}}, \"comment\": \"x\", \"$db\": \"d\"}",
    "relaybus: the command has more than one comment field"},
   /* The string form. */
   {WRAPS (""),
    "relaybus: a string comment starting with \"relaybus:\" must continue with Extended JSON of an event document or "
    "an array of event documents"},
   {WRAPS ("  5"),
    "relaybus: a string comment starting with \"relaybus:\" must continue with Extended JSON of an event document or "
    "an array of event documents"},
   {WRAPS ("{\\\"type\\\": \\\"t\\\"} {\\\"type\\\": \\\"u\\\"}"),
    "relaybus: the string annotation has text after its JSON value"},
   {WRAPS ("[{\\\"type\\\": \\\"t\\\"}, 5]"), "relaybus: events[1] must be a document"},
   {WRAPS ("{\\\"type\\\": \\\"t\\\", \\\"notBefore\\\": \\\"2026\\\"}"),
    "relaybus: events[0].notBefore must be a date"},
};

/* Messages that depend on libbson's wording: only the start is fixed. */
static const bad_case_t bad_prefix_cases[] = {
   {WRAPS ("{\\\"type\\\": "), "relaybus: the string annotation is not valid Extended JSON: "},
   {WRAPS ("{\\\"type\\\": \\\"t\\\"}}"), "relaybus: the string annotation is not valid Extended JSON: "},
   {WRAPS ("{\\\"type\\\": {\\\"$oid\\\": \\\"zz\\\"}}"), "relaybus: the string annotation is not valid Extended JSON: "},
};

static const char *const absent_cases[] = {
   "{\"insert\": \"o\", \"$db\": \"d\"}",
   "{\"insert\": \"o\", \"comment\": \"hello\", \"$db\": \"d\"}",
   "{\"insert\": \"o\", \"comment\": \"Relaybus:{}\", \"$db\": \"d\"}",
   "{\"insert\": \"o\", \"comment\": \" relaybus:{}\", \"$db\": \"d\"}",
   "{\"insert\": \"o\", \"comment\": {\"relay\": {\"type\": \"t\"}}, \"$db\": \"d\"}",
   "{\"insert\": \"o\", \"comment\": 5, \"$db\": \"d\"}",
   "{\"insert\": \"o\", \"comment\": [{\"relaybus\": {\"type\": \"t\"}}], \"$db\": \"d\"}",
   /* Only the command's own comment counts. */
   "{\"insert\": \"o\", \"documents\": [{\"comment\": {\"relaybus\": {\"type\": \"t\"}}}], \"$db\": \"d\"}",
};

/* --- tests ---------------------------------------------------------- */

static void
test_good (void **state)
{
   for (size_t i = 0; i < sizeof good_cases / sizeof good_cases[0]; i++) {
      annotate_t *a = parse_ok (good_cases[i].body, good_cases[i].forward);

      assert_int_equal (a->n_events, good_cases[i].n_events);
      free_annotation (a);
   }
}

static void
check_bad (const char *body_text, const char *message, bool prefix_only)
{
   bson_t *body = json (body_text);
   annotate_t *a = malloc (sizeof *a);
   bson_t fwd;
   bson_error_t error;
   annotate_status_t st = annotate_parse (body, a, &fwd, &error);

   if (st != ANNOTATE_INVALID)
      fail_msg ("expected INVALID for %s, got %d", body_text, (int) st);
   assert_int_equal (error.domain, ANNOTATE_ERROR_DOMAIN);
   assert_int_equal (error.code, ANNOTATE_ERR_INVALID);
   if (prefix_only ? strncmp (error.message, message, strlen (message)) != 0 : strcmp (error.message, message) != 0)
      fail_msg ("for %s\n got: %s\nwant: %s", body_text, error.message, message);
   assert_true (present (body));
   assert_true (bson_empty (&fwd));
   assert_int_equal (a->n_events, 0);
   assert_null (a->storage);
   bson_destroy (&fwd);
   free_annotation (a);
   bson_destroy (body);
}

static void
test_bad (void **state)
{
   for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++)
      check_bad (bad_cases[i].body, bad_cases[i].message, false);
   for (size_t i = 0; i < sizeof bad_prefix_cases / sizeof bad_prefix_cases[0]; i++)
      check_bad (bad_prefix_cases[i].body, bad_prefix_cases[i].message, true);
}

static void
test_absent (void **state)
{
   for (size_t i = 0; i < sizeof absent_cases / sizeof absent_cases[0]; i++) {
      bson_t *body = json (absent_cases[i]);
      annotate_t *a = malloc (sizeof *a);
      bson_t fwd;
      bson_error_t error;

      assert_false (present (body));
      if (annotate_parse (body, a, &fwd, &error) != ANNOTATE_ABSENT)
         fail_msg ("expected ABSENT for %s", absent_cases[i]);
      assert_true (bson_empty (&fwd));
      bson_destroy (&fwd);
      free_annotation (a);
      bson_destroy (body);
   }
}

/* The parsed fields, and that they survive the body's destruction. */
static void
test_fields (void **state)
{
   annotate_t *a = parse_ok (good_cases[4].body, NULL);
   const annotate_event_t *ev = &a->events[0];
   bson_iter_t h;

   assert_string_equal (ev->type, "t");
   assert_int_equal (ev->type_len, 1);
   assert_string_equal (ev->key, "k");
   assert_int_equal (ev->key_len, 1);
   assert_string_equal (annotate_event_id (ev), "e-1");
   assert_string_equal (ev->correlation_id, "c");
   assert_string_equal (ev->causation_id, "x");
   assert_true (ev->has_not_before);
   assert_int_equal (ev->not_before_ms, 1767225600000LL);
   assert_true (ev->has_payload);
   assert_true (BSON_ITER_HOLDS_DOCUMENT (&ev->payload));
   assert_true (ev->has_headers);
   assert_true (bson_iter_recurse (&ev->headers, &h));
   assert_true (bson_iter_find (&h, "h"));
   assert_string_equal (bson_iter_utf8 (&h, NULL), "v");
   assert_false (a->from_string);
   free_annotation (a);

   /* Generated ids: 24 hex digits, all different. */
   a = parse_ok (good_cases[2].body, NULL);
   assert_null (a->events[0].given_id);
   assert_int_equal (strlen (annotate_event_id (&a->events[0])), ANNOTATE_GENERATED_ID_LEN);
   assert_int_equal (strspn (annotate_event_id (&a->events[0]), "0123456789abcdef"), ANNOTATE_GENERATED_ID_LEN);
   assert_string_not_equal (annotate_event_id (&a->events[0]), annotate_event_id (&a->events[1]));
   assert_null (a->events[0].key);
   assert_string_equal (a->events[1].key, "k");
   assert_false (a->events[0].has_payload);
   free_annotation (a);

   /* The string form keeps types: {"$numberLong": "5"} is an Int64. */
   a = parse_ok (good_cases[6].body, NULL);
   {
      bson_iter_t p;

      assert_true (bson_iter_recurse (&a->events[1].payload, &p));
      assert_true (bson_iter_find (&p, "n"));
      assert_int_equal (bson_iter_type (&p), BSON_TYPE_INT64);
      assert_int_equal (bson_iter_int64 (&p), 5);
   }
   free_annotation (a);
}

/* Builds {insert: "o", comment: {relaybus: <ev>}, $db: "d"} around `ev`. */
static bson_t *
wrap (const bson_t *ev)
{
   bson_t *body = bson_new ();
   bson_t comment;

   BSON_APPEND_UTF8 (body, "insert", "o");
   BSON_APPEND_DOCUMENT_BEGIN (body, "comment", &comment);
   BSON_APPEND_DOCUMENT (&comment, "relaybus", ev);
   bson_append_document_end (body, &comment);
   BSON_APPEND_UTF8 (body, "$db", "d");
   return body;
}

static void
expect_invalid (bson_t *body, const char *message)
{
   annotate_t *a = malloc (sizeof *a);
   bson_t fwd;
   bson_error_t error;

   assert_int_equal (annotate_parse (body, a, &fwd, &error), ANNOTATE_INVALID);
   if (strncmp (error.message, message, strlen (message)) != 0)
      fail_msg (" got: %s\nwant: %s", error.message, message);
   bson_destroy (&fwd);
   free_annotation (a);
   bson_destroy (body);
}

static void
test_utf8 (void **state)
{
   static const char bad[] = "a\xff"; /* not UTF-8 */
   static const char nul[] = "a\0b";
   bson_t ev, sub;
   bson_t *body;

   bson_init (&ev);
   bson_append_utf8 (&ev, "type", 4, bad, 2);
   expect_invalid (wrap (&ev), "relaybus: events[0].type is not valid UTF-8");
   bson_reinit (&ev);
   bson_append_utf8 (&ev, "type", 4, nul, 3);
   expect_invalid (wrap (&ev), "relaybus: events[0].type is not valid UTF-8");

   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   bson_append_utf8 (&ev, "key", 3, bad, 2);
   expect_invalid (wrap (&ev), "relaybus: events[0].key is not valid UTF-8");

   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   bson_append_utf8 (&ev, "payload", 7, bad, 2);
   expect_invalid (wrap (&ev), "relaybus: events[0].payload contains a string or field name that is not valid UTF-8");

   /* Deep inside the payload, in a value and in a field name. */
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   BSON_APPEND_DOCUMENT_BEGIN (&ev, "payload", &sub);
   {
      bson_t arr;

      BSON_APPEND_ARRAY_BEGIN (&sub, "a", &arr);
      bson_append_utf8 (&arr, "0", 1, bad, 2);
      bson_append_array_end (&sub, &arr);
   }
   bson_append_document_end (&ev, &sub);
   expect_invalid (wrap (&ev), "relaybus: events[0].payload contains");

   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   BSON_APPEND_DOCUMENT_BEGIN (&ev, "payload", &sub);
   bson_append_int32 (&sub, bad, 2, 1);
   bson_append_document_end (&ev, &sub);
   expect_invalid (wrap (&ev), "relaybus: events[0].payload contains");

   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   BSON_APPEND_DOCUMENT_BEGIN (&ev, "payload", &sub);
   BSON_APPEND_REGEX (&sub, "r", bad, "i");
   bson_append_document_end (&ev, &sub);
   expect_invalid (wrap (&ev), "relaybus: events[0].payload contains");

   /* NUL inside a payload string is legal BSON and kept. */
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   bson_append_utf8 (&ev, "payload", 7, nul, 3);
   body = wrap (&ev);
   {
      annotate_t *a = malloc (sizeof *a);
      bson_t fwd;
      bson_error_t error;

      assert_int_equal (annotate_parse (body, a, &fwd, &error), ANNOTATE_FOUND);
      bson_destroy (&fwd);
      free_annotation (a);
   }
   bson_destroy (body);

   /* A field name of the event that is not UTF-8. */
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   bson_append_int32 (&ev, bad, 2, 1);
   expect_invalid (wrap (&ev), "relaybus: events[0] has a field name that is not valid UTF-8");

   /* Inside code with scope. */
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   {
      bson_t scope;

      bson_init (&scope);
      bson_append_utf8 (&scope, "s", 1, bad, 2);
      BSON_APPEND_CODE_WITH_SCOPE (&ev, "payload", "x", &scope);
      bson_destroy (&scope);
   }
   expect_invalid (wrap (&ev), "relaybus: events[0].payload contains");

   /* Header values. */
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   BSON_APPEND_DOCUMENT_BEGIN (&ev, "headers", &sub);
   bson_append_utf8 (&sub, "h", 1, bad, 2);
   bson_append_document_end (&ev, &sub);
   expect_invalid (wrap (&ev), "relaybus: events[0].headers.h is not valid UTF-8");

   bson_destroy (&ev);
}

static void
test_limits (void **state)
{
   bson_t ev, arr, sub;
   char *big;
   char key[16];

   /* String lengths: at the limit, and one past it. */
   big = malloc (ANNOTATE_MAX_KEY_LEN + 2);
   memset (big, 'k', ANNOTATE_MAX_KEY_LEN + 1);
   big[ANNOTATE_MAX_KEY_LEN + 1] = '\0';
   bson_init (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   bson_append_utf8 (&ev, "key", 3, big, ANNOTATE_MAX_KEY_LEN + 1);
   expect_invalid (wrap (&ev), "relaybus: events[0].key is 1025 bytes long; at most 1024");
   bson_reinit (&ev);
   bson_append_utf8 (&ev, "type", 4, big, ANNOTATE_MAX_TYPE_LEN + 1);
   expect_invalid (wrap (&ev), "relaybus: events[0].type is 257 bytes long; at most 256");
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   bson_append_utf8 (&ev, "id", 2, big, ANNOTATE_MAX_ID_LEN + 1);
   expect_invalid (wrap (&ev), "relaybus: events[0].id is 257 bytes long; at most 256");
   bson_reinit (&ev);
   bson_append_utf8 (&ev, "type", 4, big, ANNOTATE_MAX_TYPE_LEN);
   bson_append_utf8 (&ev, "key", 3, big, ANNOTATE_MAX_KEY_LEN);
   {
      bson_t *body = wrap (&ev);
      annotate_t *a = malloc (sizeof *a);
      bson_t fwd;
      bson_error_t error;

      assert_int_equal (annotate_parse (body, a, &fwd, &error), ANNOTATE_FOUND);
      assert_int_equal (a->events[0].key_len, ANNOTATE_MAX_KEY_LEN);
      bson_destroy (&fwd);
      free_annotation (a);
      bson_destroy (body);
   }
   free (big);

   /* Header count. */
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   BSON_APPEND_DOCUMENT_BEGIN (&ev, "headers", &sub);
   for (int i = 0; i <= ANNOTATE_MAX_HEADERS; i++) {
      snprintf (key, sizeof key, "h%d", i);
      BSON_APPEND_UTF8 (&sub, key, "v");
   }
   bson_append_document_end (&ev, &sub);
   expect_invalid (wrap (&ev), "relaybus: events[0].headers has more than 64 entries");

   /* Event count: 100 pass, 101 do not. */
   for (int n = ANNOTATE_MAX_EVENTS; n <= ANNOTATE_MAX_EVENTS + 1; n++) {
      bson_t *body = bson_new (), comment;
      annotate_t *a = malloc (sizeof *a);
      bson_t fwd;
      bson_error_t error;
      annotate_status_t st;

      BSON_APPEND_UTF8 (body, "insert", "o");
      BSON_APPEND_DOCUMENT_BEGIN (body, "comment", &comment);
      BSON_APPEND_ARRAY_BEGIN (&comment, "relaybus", &arr);
      for (int i = 0; i < n; i++) {
         snprintf (key, sizeof key, "%d", i);
         BSON_APPEND_DOCUMENT_BEGIN (&arr, key, &sub);
         BSON_APPEND_UTF8 (&sub, "type", "t");
         bson_append_document_end (&arr, &sub);
      }
      bson_append_array_end (&comment, &arr);
      bson_append_document_end (body, &comment);
      st = annotate_parse (body, a, &fwd, &error);
      if (n == ANNOTATE_MAX_EVENTS) {
         assert_int_equal (st, ANNOTATE_FOUND);
         assert_int_equal (a->n_events, ANNOTATE_MAX_EVENTS);
      } else {
         assert_int_equal (st, ANNOTATE_INVALID);
         assert_string_equal (error.message, "relaybus: at most 100 events per annotation");
      }
      bson_destroy (&fwd);
      free_annotation (a);
      bson_destroy (body);
   }

   /* Header names. */
   big = malloc (ANNOTATE_MAX_HEADER_NAME_LEN + 2);
   memset (big, 'h', ANNOTATE_MAX_HEADER_NAME_LEN + 1);
   big[ANNOTATE_MAX_HEADER_NAME_LEN + 1] = '\0';
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   BSON_APPEND_DOCUMENT_BEGIN (&ev, "headers", &sub);
   BSON_APPEND_UTF8 (&sub, big, "v");
   bson_append_document_end (&ev, &sub);
   expect_invalid (wrap (&ev), "relaybus: events[0].headers: header names must be 1 to 256 bytes of UTF-8");
   free (big);

   /* The string form's text. */
   {
      size_t n = ANNOTATE_MAX_BYTES + 32;
      char *text = malloc (n + 1);
      bson_t *body = bson_new ();

      memcpy (text, "relaybus:{\"type\": \"t\", \"payload\": \"", 34);
      memset (text + 34, 'x', n - 34 - 2);
      memcpy (text + n - 2, "\"}", 2);
      text[n] = '\0';
      BSON_APPEND_UTF8 (body, "insert", "o");
      bson_append_utf8 (body, "comment", 7, text, (int) n);
      expect_invalid (body, "relaybus: the string annotation is 1048599 bytes; at most 1048576");
      free (text);
   }

   /* Total size. */
   big = malloc (ANNOTATE_MAX_BYTES + 1);
   memset (big, 'p', ANNOTATE_MAX_BYTES);
   big[ANNOTATE_MAX_BYTES] = '\0';
   bson_reinit (&ev);
   BSON_APPEND_UTF8 (&ev, "type", "t");
   BSON_APPEND_UTF8 (&ev, "payload", big);
   expect_invalid (wrap (&ev), "relaybus: the annotation is ");
   free (big);
   bson_destroy (&ev);
}

/* annotate_strip: the relaybus part goes, valid or not; nothing else changes. */
static void
test_strip (void **state)
{
   static const struct {
      const char *body, *want;
   } cases[] = {
      {"{\"getMore\": 1, \"collection\": \"c\", \"comment\": {\"relaybus\": {\"type\": \"t\"}}, \"$db\": \"d\"}",
       "{\"getMore\": 1, \"collection\": \"c\", \"$db\": \"d\"}"},
      {"{\"getMore\": 1, \"comment\": {\"relaybus\": 5, \"keep\": 1}}", "{\"getMore\": 1, \"comment\": {\"keep\": 1}}"},
      {"{\"getMore\": 1, \"comment\": \"relaybus:not json\"}", "{\"getMore\": 1}"},
      {"{\"getMore\": 1, \"comment\": \"plain\"}", "{\"getMore\": 1, \"comment\": \"plain\"}"},
      {"{\"killCursors\": \"c\", \"cursors\": [1]}", "{\"killCursors\": \"c\", \"cursors\": [1]}"},
   };

   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      bson_t *body = json (cases[i].body);
      bson_t fwd;

      assert_true (annotate_strip (body, &fwd));
      assert_json_equal (&fwd, cases[i].want);
      assert_false (annotate_present (&fwd));
      bson_destroy (&fwd);
      bson_destroy (body);
   }
}

/* relaybusPublish's events field. */
static void
test_parse_events (void **state)
{
   bson_t *cmd = json ("{\"relaybusPublish\": 1, \"events\": [{\"type\": \"a\"}, {\"type\": \"b\", \"id\": \"x\"}]}");
   bson_t *bad = json ("{\"relaybusPublish\": 1, \"events\": [{\"type\": \"a\"}, {\"id\": \"x\"}]}");
   annotate_t *a = malloc (sizeof *a);
   bson_iter_t it;
   bson_error_t error;

   assert_true (bson_iter_init_find (&it, cmd, "events"));
   assert_true (annotate_parse_events (&it, a, &error));
   assert_int_equal (a->n_events, 2);
   assert_string_equal (annotate_event_id (&a->events[1]), "x");
   annotate_cleanup (a);

   assert_true (bson_iter_init_find (&it, bad, "events"));
   assert_false (annotate_parse_events (&it, a, &error));
   assert_string_equal (error.message, "relaybus: events[1].type must be a non-empty string");
   assert_null (a->storage);
   free_annotation (a);
   bson_destroy (cmd);
   bson_destroy (bad);
}

/* type, key and id become message headers: a control character in any of
 * them (CR and LF above all, which would start a header of the
 * publisher's choosing) is refused, naming the field, in both forms. */
static void
test_header_fields_no_control (void **state)
{
   static const char *const fields[] = {"type", "key", "id"};
   static const char *const values[] = {"order.placed\\r\\nX-Injected: yes", "a\\nb", "a\\u0000b", "tab\\there",
                                        "del\\u007f"};
   char body[512], want[128];

   (void) state;
   for (size_t f = 0; f < 3; f++)
      for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
         bool is_type = f == 0;
         /* A NUL is refused earlier, by the UTF-8 check. */
         bool nul = strstr (values[v], "u0000") != NULL;
         snprintf (body, sizeof body,
                   "{\"insert\": \"o\", \"comment\": {\"relaybus\": {%s\"%s\": \"%s\"}}, \"$db\": \"d\"}",
                   is_type ? "" : "\"type\": \"t\", ", fields[f], values[v]);
         snprintf (want, sizeof want, nul ? "relaybus: events[0].%s is not valid UTF-8" : "relaybus: events[0].%s holds a control character",
                   fields[f]);
         check_bad (body, want, true);
      }
   /* relaybusPublish's events: the same parser. */
   {
      bson_t *cmd = json ("{\"relaybusPublish\": 1, \"events\": [{\"type\": \"a\", \"key\": \"k\\r\\nX: 1\"}]}");
      annotate_t *a = malloc (sizeof *a);
      bson_iter_t it;
      bson_error_t error;

      assert_true (bson_iter_init_find (&it, cmd, "events"));
      assert_false (annotate_parse_events (&it, a, &error));
      assert_non_null (strstr (error.message, "events[0].key holds a control character (0x0d at byte 1)"));
      free_annotation (a);
      bson_destroy (cmd);
   }
   /* Printable text beyond ASCII stays accepted. */
   free_annotation (parse_ok ("{\"insert\": \"o\", \"comment\": {\"relaybus\": {\"type\": \"t.\u00e9\", \"key\": \"k \u00fc\", "
                              "\"id\": \"i-\u4e2d\"}}, \"$db\": \"d\"}",
                              NULL));
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_good),
      cmocka_unit_test (test_bad),
      cmocka_unit_test (test_absent),
      cmocka_unit_test (test_fields),
      cmocka_unit_test (test_utf8),
      cmocka_unit_test (test_limits),
      cmocka_unit_test (test_parse_events),
      cmocka_unit_test (test_header_fields_no_control),
      cmocka_unit_test (test_strip),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
