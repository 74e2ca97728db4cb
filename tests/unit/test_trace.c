/*
 * test_trace.c - base/trace.c: W3C traceparent parsing (a table of valid
 * and invalid values) and writing, the OTLP JSON encoding of a batch
 * (resource and span fields, hex ids, nanosecond strings, string and int
 * attributes, escaping, a root span without parentSpanId), attribute
 * bounds, and [tracing] sample's accepted values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include "autoconf.h"
#include "base/trace.h"

static void
test_traceparent_table (void **state)
{
   static const struct {
      const char *v;
      bool ok;
   } table[] = {
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
      {"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false}, /* zero trace id */
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false}, /* zero span id */
      {"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false}, /* upper case */
      {"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false}, /* another version */
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", false},
      {"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", false},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", false},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", false},
      {"", false},
      {NULL, false},
   };
   (void) state;

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      trace_context_t c;
      bool ok = trace_parse_traceparent (table[i].v, &c);
      if (ok != table[i].ok)
         fail_msg ("%s: expected %s", table[i].v ? table[i].v : "(null)", table[i].ok ? "valid" : "invalid");
      if (ok) {
         char back[TRACE_PARENT_LEN + 1];
         trace_format_traceparent (&c, back);
         assert_string_equal (back, table[i].v);
      }
   }
}

static void
test_new_ids (void **state)
{
   uint8_t a[16], b[16], zero[16] = {0};
   (void) state;

   trace_new_id (a, sizeof a);
   trace_new_id (b, sizeof b);
   assert_memory_not_equal (a, zero, sizeof a);
   assert_memory_not_equal (a, b, sizeof a);
}

/* The body as a BSON document, for reading fields back. */
static bson_t *
parse_json (const char *json)
{
   bson_error_t err;
   bson_t *b = bson_new_from_json ((const uint8_t *) json, -1, &err);
   if (!b)
      fail_msg ("not JSON (%s): %s", err.message, json);
   return b;
}

static const char *
utf8_at (const bson_t *b, const char *dotted)
{
   bson_iter_t it, f;
   if (!bson_iter_init (&it, b) || !bson_iter_find_descendant (&it, dotted, &f) || !BSON_ITER_HOLDS_UTF8 (&f))
      fail_msg ("no string at %s", dotted);
   return bson_iter_utf8 (&f, NULL);
}

static bool
has (const bson_t *b, const char *dotted)
{
   bson_iter_t it, f;
   return bson_iter_init (&it, b) && bson_iter_find_descendant (&it, dotted, &f);
}

static void
test_otlp_json (void **state)
{
   trace_span_t s[2];
   trace_context_t c;
   size_t len = 0;
   char *json;
   bson_t *b;
   (void) state;

   memset (s, 0, sizeof s);
   assert_true (trace_parse_traceparent ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &c));
   memcpy (s[0].trace_id, c.trace_id, 16);
   memcpy (s[0].parent_id, c.span_id, 8);
   memcpy (s[0].span_id, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
   s[0].kind = TRACE_KIND_PRODUCER;
   strcpy (s[0].name, "publish order.\"placed\"");
   s[0].start_ns = 1700000000123456789;
   s[0].end_ns = 1700000000223456789;
   trace_span_str (&s[0], "messaging.message.id", "ord-1");
   trace_span_int (&s[0], "relaybus.attempt", 5000000000);
   s[1] = s[0];
   memset (s[1].parent_id, 0, 8);
   s[1].kind = TRACE_KIND_CLIENT;
   s[1].error = true;

   json = trace_encode_otlp_json (s, 2, "shop", "deployment.environment=prod,team=a=b", &len);
   assert_int_equal (len, strlen (json));
   b = parse_json (json);
   assert_string_equal (utf8_at (b, "resourceSpans.0.resource.attributes.0.key"), "service.name");
   assert_string_equal (utf8_at (b, "resourceSpans.0.resource.attributes.0.value.stringValue"), "shop");
   assert_string_equal (utf8_at (b, "resourceSpans.0.resource.attributes.1.key"), "service.version");
   assert_string_equal (utf8_at (b, "resourceSpans.0.resource.attributes.1.value.stringValue"), PACKAGE_VERSION);
   assert_string_equal (utf8_at (b, "resourceSpans.0.resource.attributes.2.key"), "deployment.environment");
   assert_string_equal (utf8_at (b, "resourceSpans.0.resource.attributes.2.value.stringValue"), "prod");
   assert_string_equal (utf8_at (b, "resourceSpans.0.resource.attributes.3.value.stringValue"), "a=b");
   assert_string_equal (utf8_at (b, "resourceSpans.0.scopeSpans.0.scope.name"), "relaybus-proxy");
#define SPAN0 "resourceSpans.0.scopeSpans.0.spans.0."
#define SPAN1 "resourceSpans.0.scopeSpans.0.spans.1."
   assert_string_equal (utf8_at (b, SPAN0 "traceId"), "4bf92f3577b34da6a3ce929d0e0e4736");
   assert_string_equal (utf8_at (b, SPAN0 "spanId"), "0102030405060708");
   assert_string_equal (utf8_at (b, SPAN0 "parentSpanId"), "00f067aa0ba902b7");
   assert_string_equal (utf8_at (b, SPAN0 "name"), "publish order.\"placed\"");
   assert_string_equal (utf8_at (b, SPAN0 "startTimeUnixNano"), "1700000000123456789");
   assert_string_equal (utf8_at (b, SPAN0 "endTimeUnixNano"), "1700000000223456789");
   assert_string_equal (utf8_at (b, SPAN0 "attributes.0.value.stringValue"), "ord-1");
   assert_string_equal (utf8_at (b, SPAN0 "attributes.1.key"), "relaybus.attempt");
   assert_string_equal (utf8_at (b, SPAN0 "attributes.1.value.intValue"), "5000000000");
   assert_false (has (b, SPAN0 "status.code"));
   assert_false (has (b, SPAN1 "parentSpanId")); /* a root span */
   {
      bson_iter_t it, f;
      assert_true (bson_iter_init (&it, b) && bson_iter_find_descendant (&it, SPAN0 "kind", &f));
      assert_int_equal (bson_iter_as_int64 (&f), 4);
      assert_true (bson_iter_init (&it, b) && bson_iter_find_descendant (&it, SPAN1 "kind", &f));
      assert_int_equal (bson_iter_as_int64 (&f), 3);
      assert_true (bson_iter_init (&it, b) && bson_iter_find_descendant (&it, SPAN1 "status.code", &f));
      assert_int_equal (bson_iter_as_int64 (&f), 2);
   }
   bson_destroy (b);
   bson_free (json);
}

static void
test_attribute_bounds (void **state)
{
   trace_span_t s = {0};
   char big[TRACE_ATTR_VALUE_MAX + 10];
   (void) state;

   /* "é" (2 bytes) repeated: the cut falls inside one and backs off. */
   for (size_t i = 0; i + 1 < sizeof big; i += 2) {
      big[i] = (char) 0xc3;
      big[i + 1] = (char) 0xa9;
   }
   big[sizeof big - 1] = '\0';
   big[sizeof big - 2] = 'x';
   trace_span_str (&s, "k", big);
   assert_true (strlen (s.attrs[0].str_value) < TRACE_ATTR_VALUE_MAX);
   assert_int_equal (strlen (s.attrs[0].str_value) % 2, 0);
   for (int i = 1; i < TRACE_ATTRS_MAX + 5; i++)
      trace_span_int (&s, "n", i);
   assert_int_equal (s.n_attrs, TRACE_ATTRS_MAX);
}

static void
test_sample_values (void **state)
{
   static const struct {
      const char *v;
      bool ok;
   } table[] = {
      {"never", true}, {"always", true}, {"0", true}, {"0.25", true}, {"1", true},
      {"1.5", false},  {"-0.1", false},  {"sometimes", false}, {"0.5x", false},
   };
   (void) state;

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      trace_options_t opts = {.otlp_endpoint = "", .sample = table[i].v};
      bson_error_t err;
      if (trace_start (&opts, &err) != table[i].ok)
         fail_msg ("sample = %s: expected %s", table[i].v, table[i].ok ? "accepted" : "refused");
      /* No endpoint: nothing exported, emitting is a no-op. */
      assert_false (trace_enabled ());
      trace_stop ();
   }
   {
      trace_options_t opts = {.otlp_endpoint = "", .sample = "always"};
      bson_error_t err;
      assert_true (trace_start (&opts, &err));
      assert_true (trace_sample ());
      opts.sample = "never";
      assert_true (trace_start (&opts, &err));
      assert_false (trace_sample ());
   }
}

static const char *const otel_vars[] = {
   "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
   "OTEL_EXPORTER_OTLP_HEADERS",  "OTEL_EXPORTER_OTLP_TRACES_HEADERS",  "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER",
};

static void
otel_clear (void)
{
   for (size_t i = 0; i < sizeof otel_vars / sizeof otel_vars[0]; i++)
      unsetenv (otel_vars[i]);
}

/* The url the settings resolve to with `endpoint` in [tracing] (may be "")
 * and the environment as set. */
static const char *
url_of (const char *endpoint)
{
   static char url[TRACE_URL_MAX];
   trace_options_t opts = {.otlp_endpoint = endpoint, .service_name = "", .resource_attributes = ""};
   trace_settings_t t;
   bson_error_t err;

   assert_true (trace_settings_resolve (&opts, &t, &err));
   bson_strncpy (url, t.url, sizeof url);
   trace_settings_fini (&t);
   return url;
}

static const char *
attr (const trace_settings_t *t, const char *key)
{
   for (size_t i = 0; i < t->n_attrs; i++)
      if (!strcmp (t->attr_keys[i], key))
         return t->attr_values[i];
   return NULL;
}

static const char *
header (const trace_settings_t *t, const char *name)
{
   for (size_t i = 0; i < t->n_headers; i++)
      if (!strcasecmp (t->header_names[i], name))
         return t->header_values[i];
   return NULL;
}

/* OpenTelemetry's environment where [tracing] leaves a key empty, and the
 * configuration over it: the OTLP exporter specification's endpoint rules
 * (the base endpoint gets v1/traces, the traces endpoint is used as it
 * is), %-decoded resource attributes and headers, bad items left out. */
static void
test_settings_environment (void **state)
{
   trace_options_t opts = {0};
   trace_settings_t t;
   bson_error_t err;

   (void) state;
   otel_clear ();
   assert_string_equal (url_of (""), "");
   setenv ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318", 1);
   assert_string_equal (url_of (""), "http://collector:4318/v1/traces");
   setenv ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318/", 1);
   assert_string_equal (url_of (""), "https://collector:4318/v1/traces");
   setenv ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://gw/otel", 1);
   assert_string_equal (url_of (""), "http://gw/otel/v1/traces");
   setenv ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/custom/path", 1);
   assert_string_equal (url_of (""), "http://traces:4318/custom/path");
   /* The configuration wins. */
   assert_string_equal (url_of ("http://mine:4318/"), "http://mine:4318/v1/traces");
   /* Not a URL of HTTP: nothing. */
   setenv ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317", 1);
   assert_string_equal (url_of (""), "");
   /* Disabled, or another exporter: the environment counts for nothing. */
   setenv ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/v1/traces", 1);
   setenv ("OTEL_SDK_DISABLED", "true", 1);
   assert_string_equal (url_of (""), "");
   assert_string_equal (url_of ("http://mine:4318"), "http://mine:4318/v1/traces");
   unsetenv ("OTEL_SDK_DISABLED");
   setenv ("OTEL_TRACES_EXPORTER", "none", 1);
   assert_string_equal (url_of (""), "");
   unsetenv ("OTEL_TRACES_EXPORTER");

   setenv ("OTEL_SERVICE_NAME", "orders-relay", 1);
   setenv ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging, team = a%2Cb%3Dc ,broken,service.name=ignored,zone=%zz", 1);
   setenv ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20s3cret,x-tenant=t1,bad name=1,x-crlf=a%0D%0Ab", 1);
   setenv ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Tenant=t2", 1);
   opts.otlp_endpoint = "";
   opts.service_name = "";
   opts.resource_attributes = "deployment.environment=prod,region=eu";
   assert_true (trace_settings_resolve (&opts, &t, &err));
   assert_string_equal (t.url, "http://traces:4318/v1/traces");
   assert_string_equal (t.service_name, "orders-relay");
   assert_string_equal (attr (&t, "deployment.environment"), "prod"); /* the configuration's */
   assert_string_equal (attr (&t, "team"), "a,b=c");                  /* trimmed, %-decoded */
   assert_string_equal (attr (&t, "region"), "eu");
   assert_null (attr (&t, "broken"));
   assert_null (attr (&t, "zone")); /* a bad %-escape */
   assert_string_equal (header (&t, "authorization"), "Bearer s3cret");
   assert_string_equal (header (&t, "x-tenant"), "t2"); /* the traces variable over the general one */
   assert_int_equal (t.n_headers, 2);                  /* a bad name and a line break left out */
   trace_settings_fini (&t);

   /* service.name: the configuration's, else OTEL_SERVICE_NAME, else the
    * attribute, else relaybus-proxy. */
   opts.service_name = "from-config";
   assert_true (trace_settings_resolve (&opts, &t, &err));
   assert_string_equal (t.service_name, "from-config");
   trace_settings_fini (&t);
   opts.service_name = "";
   unsetenv ("OTEL_SERVICE_NAME");
   assert_true (trace_settings_resolve (&opts, &t, &err));
   assert_string_equal (t.service_name, "ignored");
   trace_settings_fini (&t);
   otel_clear ();
   assert_true (trace_settings_resolve (&opts, &t, &err));
   assert_string_equal (t.service_name, "relaybus-proxy");
   assert_int_equal (t.n_headers, 0);
   trace_settings_fini (&t);
}

static const char *
span_attr (const trace_span_t *s, const char *key)
{
   for (size_t i = 0; i < s->n_attrs; i++)
      if (!strcmp (s->attrs[i].key, key))
         return s->attrs[i].is_int ? NULL : s->attrs[i].str_value;
   return NULL;
}

static int64_t
span_int (const trace_span_t *s, const char *key)
{
   for (size_t i = 0; i < s->n_attrs; i++)
      if (!strcmp (s->attrs[i].key, key) && s->attrs[i].is_int)
         return s->attrs[i].int_value;
   return -1;
}

/* A webhook send span's HTTP client attributes: the URL without its
 * credentials and query values, the server's address and port. */
static void
test_http_client_attributes (void **state)
{
   trace_span_t s = {0};

   (void) state;
   trace_span_http_client (&s, "POST", "https://user:pw@hooks.example:8443/in/h?sig=abc&v=2");
   assert_string_equal (span_attr (&s, "http.request.method"), "POST");
   assert_string_equal (span_attr (&s, "url.full"), "https://REDACTED:REDACTED@hooks.example:8443/in/h?sig=REDACTED&v=REDACTED");
   assert_string_equal (span_attr (&s, "server.address"), "hooks.example");
   assert_int_equal (span_int (&s, "server.port"), 8443);
   memset (&s, 0, sizeof s);
   trace_span_http_client (&s, "POST", "http://[::1]/hook");
   assert_string_equal (span_attr (&s, "url.full"), "http://[::1]/hook");
   assert_string_equal (span_attr (&s, "server.address"), "::1");
   assert_int_equal (span_int (&s, "server.port"), 80);
   memset (&s, 0, sizeof s);
   trace_span_http_client (&s, "POST", "not a url");
   assert_string_equal (span_attr (&s, "url.full"), "");
   assert_null (span_attr (&s, "server.address"));
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_traceparent_table),
      cmocka_unit_test (test_new_ids),
      cmocka_unit_test (test_otlp_json),
      cmocka_unit_test (test_attribute_bounds),
      cmocka_unit_test (test_sample_values),
      cmocka_unit_test (test_settings_environment),
      cmocka_unit_test (test_http_client_attributes),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
