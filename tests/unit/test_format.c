/*
 * test_format.c - dispatch/format.c: the relaybus envelope (its fields,
 * relaxed Extended JSON, createdAt in UTC with milliseconds, a null
 * payload without an event), every CloudEvents attribute in binary mode
 * under each binding's header names and in structured mode, the payload
 * format's body and headers, each json mode's mappings (dates, ObjectIds,
 * decimals, binary, 64-bit integers, non-finite doubles), the trace
 * context as a header of every binding, and {type_prefix} in templates.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dispatch/format.h"
#include "dispatch/transport.h"

#define TRACEPARENT "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

/* A delivery of order.placed.v1 with a key, a payload of every type the
 * json modes map, and the event's own headers (a trace context among
 * them).  The caller destroys d->event. */
static void
make_delivery (store_delivery_t *d, bool with_key)
{
   bson_decimal128_t dec;
   bson_oid_t oid;

   memset (d, 0, sizeof *d);
   bson_oid_init_from_string (&d->id, "65a1b2c3d4e5f60718293a4b");
   bson_oid_init_from_string (&oid, "0123456789abcdef01234567");
   bson_decimal128_from_string ("12.50", &dec);
   d->event_id = "ev-1";
   d->handler = "h";
   d->event_type = "order.placed.v1";
   d->key = with_key ? "order-1" : NULL;
   d->sequence = 7;
   d->attempt = 2;
   d->event = BCON_NEW ("_id",
                        BCON_UTF8 ("ev-1"),
                        "payload",
                        "{",
                        "n",
                        BCON_INT64 (5000000000LL),
                        "i",
                        BCON_INT32 (3),
                        "at",
                        BCON_DATE_TIME (1700000000000LL),
                        "oid",
                        BCON_OID (&oid),
                        "price",
                        BCON_DECIMAL128 (&dec),
                        "bin",
                        BCON_BIN (BSON_SUBTYPE_BINARY, (const uint8_t *) "hi!", 3),
                        "nan",
                        BCON_DOUBLE (0.0 / 0.0),
                        "list",
                        "[",
                        BCON_DATE_TIME (0),
                        "]",
                        "}",
                        "headers",
                        "{",
                        "tenant",
                        BCON_UTF8 ("t1"),
                        "traceparent",
                        BCON_UTF8 (TRACEPARENT),
                        "tracestate",
                        BCON_UTF8 ("vendor=x"),
                        "}",
                        "createdAt",
                        BCON_DATE_TIME (1700000000123LL));
}

static format_opts_t
opts (handler_format_t f, handler_json_t j)
{
   format_opts_t o = {.format = f, .json = j, .source = "/orders"};
   return o;
}

static bson_t *
parse (const format_msg_t *m)
{
   bson_error_t err;
   bson_t *b = bson_new_from_json ((const uint8_t *) m->body, (ssize_t) m->body_len, &err);

   assert_non_null (b);
   assert_int_equal (strlen (m->body), m->body_len);
   return b;
}

static void
assert_utf8 (const bson_t *b, const char *dotted, const char *want)
{
   bson_iter_t it, f;

   assert_true (bson_iter_init (&it, b) && bson_iter_find_descendant (&it, dotted, &f));
   assert_true (BSON_ITER_HOLDS_UTF8 (&f));
   assert_string_equal (bson_iter_utf8 (&f, NULL), want);
}

static void
assert_header (const format_msg_t *m, const char *name, const char *want)
{
   const char *v = format_msg_header (m, name);

   if (!v)
      fail_msg ("no header %s", name);
   assert_string_equal (v, want);
}

static void
test_envelope (void **state)
{
   store_delivery_t d;
   format_opts_t o = opts (HANDLER_FORMAT_RELAYBUS, HANDLER_JSON_RELAXED);
   format_msg_t m;
   bson_error_t err;
   bson_t *parsed;
   bson_iter_t it;

   (void) state;
   make_delivery (&d, true);
   assert_true (format_render (&o, FORMAT_BINDING_HTTP, &d, &m, &err));
   assert_string_equal (m.content_type, "application/json");
   /* relaxed Extended JSON: numbers plain, dates as $date; the field order
    * of the envelope as it always was */
   assert_non_null (strstr (m.body, "\"n\" : 5000000000"));
   assert_non_null (strstr (m.body, "\"$date\""));
   assert_true (strstr (m.body, "\"sequence\"") < strstr (m.body, "\"payload\""));
   assert_true (strstr (m.body, "\"payload\"") < strstr (m.body, "\"headers\""));
   parsed = parse (&m);
   assert_utf8 (parsed, "id", "ev-1");
   assert_utf8 (parsed, "type", "order.placed.v1");
   assert_utf8 (parsed, "key", "order-1");
   assert_true (bson_iter_init_find (&it, parsed, "sequence") && bson_iter_as_int64 (&it) == 7);
   assert_utf8 (parsed, "createdAt", "2023-11-14T22:13:20.123Z");
   assert_utf8 (parsed, "headers.tenant", "t1");
   assert_utf8 (parsed, "delivery.id", "65a1b2c3d4e5f60718293a4b");
   assert_utf8 (parsed, "delivery.handler", "h");
   /* HTTP in this format: the headers are in the body; only the trace
    * context is an HTTP header too. */
   assert_int_equal (m.n_headers, 2);
   assert_header (&m, "traceparent", TRACEPARENT);
   assert_header (&m, "tracestate", "vendor=x");
   assert_string_equal (m.traceparent, TRACEPARENT);
   bson_destroy (parsed);
   format_msg_fini (&m);

   /* no key, no event document: payload null, no sequence, no trace */
   bson_destroy (d.event);
   d.event = NULL;
   d.key = NULL;
   assert_true (format_render (&o, FORMAT_BINDING_KAFKA, &d, &m, &err));
   assert_non_null (strstr (m.body, "\"payload\" : null"));
   assert_null (strstr (m.body, "\"sequence\""));
   assert_null (m.traceparent);
   assert_null (format_msg_header (&m, "relaybus-sequence"));
   assert_header (&m, "relaybus-event-id", "ev-1");
   format_msg_fini (&m);
}

/* Binary mode: every attribute under each binding's prefix, the payload
 * alone as the body, application/json. */
static void
test_cloudevents_binary (void **state)
{
   static const struct {
      format_binding_t b;
      const char *prefix;
   } bindings[] = {
      {FORMAT_BINDING_HTTP, "ce-"},
      {FORMAT_BINDING_KAFKA, "ce_"},
      {FORMAT_BINDING_NATS, "ce-"},
      {FORMAT_BINDING_AMQP, "cloudEvents_"},
      {FORMAT_BINDING_PULL, ""},
   };
   store_delivery_t d;
   format_opts_t o = opts (HANDLER_FORMAT_CLOUDEVENTS, HANDLER_JSON_RELAXED);
   bson_error_t err;

   (void) state;
   make_delivery (&d, true);
   for (size_t i = 0; i < sizeof bindings / sizeof bindings[0]; i++) {
      format_msg_t m;
      char name[64];
      bson_t *parsed;
      const struct {
         const char *attr, *value;
      } want[] = {
         {"specversion", "1.0"},
         {"id", "ev-1"},
         {"source", "/orders"},
         {"type", "order.placed.v1"},
         {"time", "2023-11-14T22:13:20.123Z"},
         {"subject", "order-1"},
         {"sequence", "0000000000000000007"},
      };

      assert_true (format_render (&o, bindings[i].b, &d, &m, &err));
      for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
         snprintf (name, sizeof name, "%s%s", bindings[i].prefix, want[k].attr);
         assert_header (&m, name, want[k].value);
      }
      assert_string_equal (m.content_type, "application/json");
      if (bindings[i].b == FORMAT_BINDING_KAFKA || bindings[i].b == FORMAT_BINDING_NATS)
         assert_header (&m, "content-type", "application/json");
      /* the data: the payload as JSON, nothing around it */
      parsed = parse (&m);
      assert_true (bson_has_field (parsed, "price") && !bson_has_field (parsed, "payload"));
      bson_destroy (parsed);
      if (bindings[i].b != FORMAT_BINDING_PULL && bindings[i].b != FORMAT_BINDING_HTTP) {
         assert_header (&m, "relaybus-delivery-id", "65a1b2c3d4e5f60718293a4b");
         assert_header (&m, "tenant", "t1");
      }
      if (bindings[i].b != FORMAT_BINDING_PULL)
         assert_header (&m, "traceparent", TRACEPARENT);
      else
         assert_string_equal (m.traceparent, TRACEPARENT);
      format_msg_fini (&m);
   }

   /* Without a key: no subject, no sequence. */
   d.key = NULL;
   {
      format_msg_t m;
      assert_true (format_render (&o, FORMAT_BINDING_HTTP, &d, &m, &err));
      assert_null (format_msg_header (&m, "ce-subject"));
      assert_null (format_msg_header (&m, "ce-sequence"));
      assert_header (&m, "ce-id", "ev-1");
      format_msg_fini (&m);
   }
   bson_destroy (d.event);
}

static void
test_cloudevents_structured (void **state)
{
   store_delivery_t d;
   format_opts_t o = opts (HANDLER_FORMAT_CLOUDEVENTS_STRUCTURED, HANDLER_JSON_RELAXED);
   format_msg_t m;
   bson_error_t err;
   bson_t *parsed;
   bson_iter_t it;

   (void) state;
   make_delivery (&d, true);
   assert_true (format_render (&o, FORMAT_BINDING_KAFKA, &d, &m, &err));
   assert_string_equal (m.content_type, "application/cloudevents+json");
   assert_header (&m, "content-type", "application/cloudevents+json");
   assert_null (format_msg_header (&m, "ce_id"));
   parsed = parse (&m);
   assert_utf8 (parsed, "specversion", "1.0");
   assert_utf8 (parsed, "id", "ev-1");
   assert_utf8 (parsed, "source", "/orders");
   assert_utf8 (parsed, "type", "order.placed.v1");
   assert_utf8 (parsed, "time", "2023-11-14T22:13:20.123Z");
   assert_utf8 (parsed, "subject", "order-1");
   assert_utf8 (parsed, "sequence", "0000000000000000007");
   assert_utf8 (parsed, "datacontenttype", "application/json");
   assert_utf8 (parsed, "traceparent", TRACEPARENT);
   assert_utf8 (parsed, "tracestate", "vendor=x");
   assert_true (bson_iter_init_find (&it, parsed, "data") && BSON_ITER_HOLDS_DOCUMENT (&it));
   /* the data in the handler's json mode: $numberDecimal in relaxed */
   assert_non_null (strstr (m.body, "\"price\" : { \"$numberDecimal\" : \"12.50\" }"));
   bson_destroy (parsed);
   format_msg_fini (&m);
   bson_destroy (d.event);
}

static void
test_payload_format (void **state)
{
   store_delivery_t d;
   format_opts_t o = opts (HANDLER_FORMAT_PAYLOAD, HANDLER_JSON_RELAXED);
   format_msg_t m;
   bson_error_t err;
   bson_t *parsed;

   (void) state;
   make_delivery (&d, true);
   /* HTTP: the metadata in relaybus-* headers and the event's own. */
   assert_true (format_render (&o, FORMAT_BINDING_HTTP, &d, &m, &err));
   parsed = parse (&m);
   assert_true (bson_has_field (parsed, "oid") && !bson_has_field (parsed, "delivery"));
   assert_header (&m, "relaybus-event-id", "ev-1");
   assert_header (&m, "relaybus-type", "order.placed.v1");
   assert_header (&m, "relaybus-key", "order-1");
   assert_header (&m, "relaybus-sequence", "7");
   assert_header (&m, "tenant", "t1");
   assert_header (&m, "traceparent", TRACEPARENT);
   bson_destroy (parsed);
   format_msg_fini (&m);
   /* AMQP keeps the sequence a number. */
   assert_true (format_render (&o, FORMAT_BINDING_AMQP, &d, &m, &err));
   for (size_t i = 0; i < m.n_headers; i++)
      if (!strcmp (m.headers[i].name, "relaybus-sequence"))
         assert_true (m.headers[i].numeric && m.headers[i].number == 7);
   format_msg_fini (&m);
   bson_destroy (d.event);
}

/* Headers a protocol cannot carry, or that would shadow ours, stay out. */
static void
test_event_headers_filtered (void **state)
{
   store_delivery_t d;
   format_opts_t o = opts (HANDLER_FORMAT_CLOUDEVENTS, HANDLER_JSON_RELAXED);
   format_msg_t m;
   bson_error_t err;
   size_t n_id = 0;

   (void) state;
   make_delivery (&d, false);
   bson_destroy (d.event);
   d.event = BCON_NEW ("payload", "{", "}", "headers", "{", "ce-id", BCON_UTF8 ("spoof"), "relaybus-type", BCON_UTF8 ("x"),
                       "Nats-Expected-Stream", BCON_UTF8 ("s"), "bad name", BCON_UTF8 ("v"), "ok", BCON_UTF8 ("a\r\nb"), "host",
                       BCON_UTF8 ("evil"), "}");
   assert_true (format_render (&o, FORMAT_BINDING_NATS, &d, &m, &err));
   for (size_t i = 0; i < m.n_headers; i++)
      n_id += !strcmp (m.headers[i].name, "ce-id");
   assert_int_equal (n_id, 1);
   assert_header (&m, "ce-id", "ev-1");
   assert_header (&m, "relaybus-type", "order.placed.v1");
   assert_null (format_msg_header (&m, "Nats-Expected-Stream"));
   assert_null (format_msg_header (&m, "bad name"));
   assert_header (&m, "ok", "a  b");
   format_msg_fini (&m);
   o.format = HANDLER_FORMAT_PAYLOAD;
   assert_true (format_render (&o, FORMAT_BINDING_HTTP, &d, &m, &err));
   assert_null (format_msg_header (&m, "host"));
   assert_null (format_msg_header (&m, "ce-id"));
   format_msg_fini (&m);
   bson_destroy (d.event);
}

/* A type, key or id with a line break (an event stored before the
 * publishing path refused them, or written by another program) never
 * reaches a header as it is: every binding and format carries it
 * percent-encoded, and no header holds a control character. */
static void
test_header_values_encoded (void **state)
{
   static const handler_format_t formats[] = {HANDLER_FORMAT_RELAYBUS, HANDLER_FORMAT_CLOUDEVENTS,
                                              HANDLER_FORMAT_CLOUDEVENTS_STRUCTURED, HANDLER_FORMAT_PAYLOAD};
   static const format_binding_t bindings[] = {FORMAT_BINDING_HTTP, FORMAT_BINDING_KAFKA, FORMAT_BINDING_NATS,
                                               FORMAT_BINDING_AMQP};
   store_delivery_t d;
   bson_error_t err;
   size_t seen = 0;

   (void) state;
   make_delivery (&d, true);
   d.event_type = "order.placed\r\nX-Injected-Type: yes";
   d.key = "k\r\nX-Injected-Key: yes";
   d.event_id = "i\nX-Injected-Id: yes\x01\x7f";
   for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
      for (size_t b = 0; b < sizeof bindings / sizeof bindings[0]; b++) {
         format_msg_t m;
         const char *v;

         assert_true (format_render (&(format_opts_t){.format = formats[f], .json = HANDLER_JSON_RELAXED, .source = "/o"},
                                     bindings[b], &d, &m, &err));
         for (size_t i = 0; i < m.n_headers; i++) {
            assert_true (format_header_safe (m.headers[i].name));
            if (!format_header_safe (m.headers[i].value))
               fail_msg ("format %d binding %d: header %s holds a control character", (int) formats[f], (int) bindings[b],
                         m.headers[i].name);
            assert_null (strstr (m.headers[i].name, "Injected"));
         }
         if ((v = format_msg_header (&m, "relaybus-type")) || (v = format_msg_header (&m, "ce-type")) ||
             (v = format_msg_header (&m, "ce_type")) || (v = format_msg_header (&m, "cloudEvents_type"))) {
            assert_string_equal (v, "order.placed%0D%0AX-Injected-Type: yes");
            seen++;
         }
         if ((v = format_msg_header (&m, "relaybus-key")) || (v = format_msg_header (&m, "ce-subject")))
            assert_string_equal (v, "k%0D%0AX-Injected-Key: yes");
         if ((v = format_msg_header (&m, "relaybus-event-id")) || (v = format_msg_header (&m, "ce-id")))
            assert_string_equal (v, "i%0AX-Injected-Id: yes%01%7F");
         format_msg_fini (&m);
      }
   /* Every binding of the payload and cloudevents formats, and the broker
    * bindings of the other two, carry the type as a header. */
   assert_int_equal (seen, 4 + 4 + 3 + 3);
   assert_true (format_header_safe ("tab\there"));
   assert_false (format_header_safe ("a\rb"));
   bson_destroy (d.event);
}

/* Each json mode on the same payload. */
static void
test_json_modes (void **state)
{
   store_delivery_t d;
   format_msg_t m;
   bson_error_t err;
   bson_t *p;
   bson_iter_t it;
   format_opts_t o;

   (void) state;
   make_delivery (&d, true);

   o = opts (HANDLER_FORMAT_PAYLOAD, HANDLER_JSON_RELAXED);
   assert_true (format_render (&o, FORMAT_BINDING_PULL, &d, &m, &err));
   assert_non_null (strstr (m.body, "\"n\" : 5000000000"));
   assert_non_null (strstr (m.body, "\"i\" : 3"));
   assert_non_null (strstr (m.body, "\"at\" : { \"$date\" : \"2023-11-14T22:13:20Z\" }"));
   assert_non_null (strstr (m.body, "\"oid\" : { \"$oid\" : \"0123456789abcdef01234567\" }"));
   assert_non_null (strstr (m.body, "\"price\" : { \"$numberDecimal\" : \"12.50\" }"));
   assert_non_null (strstr (m.body, "\"$binary\""));
   format_msg_fini (&m);

   o.json = HANDLER_JSON_CANONICAL;
   assert_true (format_render (&o, FORMAT_BINDING_PULL, &d, &m, &err));
   assert_non_null (strstr (m.body, "\"n\" : { \"$numberLong\" : \"5000000000\" }"));
   assert_non_null (strstr (m.body, "\"i\" : { \"$numberInt\" : \"3\" }"));
   assert_non_null (strstr (m.body, "\"at\" : { \"$date\" : { \"$numberLong\" : \"1700000000000\" } }"));
   assert_non_null (strstr (m.body, "\"$oid\""));
   format_msg_fini (&m);

   o.json = HANDLER_JSON_PLAIN;
   assert_true (format_render (&o, FORMAT_BINDING_PULL, &d, &m, &err));
   assert_null (strstr (m.body, "\"$"));
   p = parse (&m);
   assert_true (bson_iter_init_find (&it, p, "n") && BSON_ITER_HOLDS_INT64 (&it) && bson_iter_int64 (&it) == 5000000000LL);
   assert_true (bson_iter_init_find (&it, p, "i") && bson_iter_as_int64 (&it) == 3);
   assert_utf8 (p, "at", "2023-11-14T22:13:20.000Z");
   assert_utf8 (p, "oid", "0123456789abcdef01234567");
   assert_utf8 (p, "price", "12.50");
   assert_utf8 (p, "bin", "aGkh"); /* base64 of "hi!" */
   assert_utf8 (p, "nan", "NaN");
   assert_utf8 (p, "list.0", "1970-01-01T00:00:00.000Z");
   bson_destroy (p);
   format_msg_fini (&m);

   /* The json mode shapes the envelope's payload only. */
   o.format = HANDLER_FORMAT_RELAYBUS;
   o.json = HANDLER_JSON_CANONICAL;
   assert_true (format_render (&o, FORMAT_BINDING_PULL, &d, &m, &err));
   assert_non_null (strstr (m.body, "\"sequence\" : 7"));
   assert_non_null (strstr (m.body, "\"$numberLong\" : \"5000000000\""));
   format_msg_fini (&m);
   bson_destroy (d.event);
}

/* A payload libbson writes no JSON for (a string that is not UTF-8, which
 * the publishing path refuses, in an event stored some other way): an
 * error the dispatcher retries and buries, never an abort. */
static void
test_not_json (void **state)
{
   store_delivery_t d;
   format_opts_t o = opts (HANDLER_FORMAT_RELAYBUS, HANDLER_JSON_RELAXED);
   format_msg_t m;
   bson_error_t err;
   bson_t payload = BSON_INITIALIZER;

   (void) state;
   make_delivery (&d, true);
   bson_destroy (d.event);
   bson_append_utf8 (&payload, "s", 1, "\xff\xfe", 2);
   d.event = BCON_NEW ("payload", BCON_DOCUMENT (&payload));
   assert_false (format_render (&o, FORMAT_BINDING_KAFKA, &d, &m, &err));
   assert_non_null (strstr (err.message, "cannot be written as JSON"));
   format_msg_fini (&m);
   bson_destroy (&payload);
   bson_destroy (d.event);
}

static void
test_rfc3339 (void **state)
{
   char out[32];

   (void) state;
   assert_true (format_rfc3339 (0, out));
   assert_string_equal (out, "1970-01-01T00:00:00.000Z");
   assert_true (format_rfc3339 (-1, out));
   assert_string_equal (out, "1969-12-31T23:59:59.999Z");
   assert_true (format_rfc3339 (253402300799999LL, out));
   assert_string_equal (out, "9999-12-31T23:59:59.999Z");
   assert_false (format_rfc3339 (253402300800000LL, out));
}

static void
test_type_prefix (void **state)
{
   store_delivery_t d;
   char *s;

   (void) state;
   memset (&d, 0, sizeof d);
   d.event_type = "order.placed.v1";
   d.event_id = "e";
   s = transport_expand ("{type_prefix}-events.{type}", &d, "");
   assert_string_equal (s, "order-events.order.placed.v1");
   bson_free (s);
   d.event_type = "ping";
   s = transport_expand ("t.{type_prefix}", &d, "");
   assert_string_equal (s, "t.ping");
   bson_free (s);
}

/* The sequence extension: sequences of one key compare as strings in their
 * order (9 before 10, 99 before 100, up to INT64_MAX), in every binding. */
static void
test_cloudevents_sequence_order (void **state)
{
   static const int64_t seqs[] = {1, 9, 10, 99, 100, 4294967296LL, INT64_MAX};
   format_opts_t o = opts (HANDLER_FORMAT_CLOUDEVENTS, HANDLER_JSON_RELAXED);
   store_delivery_t d;
   bson_error_t err;
   char prev[32] = "";

   (void) state;
   make_delivery (&d, true);
   for (size_t i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
      format_msg_t m;
      const char *v;

      d.sequence = seqs[i];
      assert_true (format_render (&o, FORMAT_BINDING_HTTP, &d, &m, &err));
      v = format_msg_header (&m, "ce-sequence");
      assert_non_null (v);
      assert_int_equal (strlen (v), 19);
      assert_int_equal (strtoll (v, NULL, 10), seqs[i]);
      if (i > 0 && strcmp (prev, v) >= 0)
         fail_msg ("sequence %s sorts before %s as a string", v, prev);
      bson_strncpy (prev, v, sizeof prev);
      format_msg_fini (&m);
   }
   bson_destroy (d.event);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_envelope),
      cmocka_unit_test (test_cloudevents_binary),
      cmocka_unit_test (test_cloudevents_structured),
      cmocka_unit_test (test_payload_format),
      cmocka_unit_test (test_event_headers_filtered),
      cmocka_unit_test (test_header_values_encoded),
      cmocka_unit_test (test_json_modes),
      cmocka_unit_test (test_not_json),
      cmocka_unit_test (test_rfc3339),
      cmocka_unit_test (test_type_prefix),
      cmocka_unit_test (test_cloudevents_sequence_order),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
