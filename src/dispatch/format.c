/*
 * dispatch/format.c - a delivery as each kind sends it: the relaybus
 * envelope, CloudEvents 1.0 in binary or structured content mode, or the
 * payload alone; the payload as relaxed or canonical Extended JSON or as
 * plain JSON; and the headers of each protocol's binding (see
 * dispatch/format.h).
 *
 * The bindings' header names are the CloudEvents specs': HTTP and NATS
 * prefix an attribute with "ce-", Kafka with "ce_", AMQP with
 * "cloudEvents_" (the AMQP binding's prefix that every AMQP client can
 * carry as a header name; "cloudEvents:" is its other spelling).  Every
 * broker binding also carries the relaybus-* headers and the event's own
 * headers, as the broker kinds always did; HTTP carries the event's
 * headers only in the payload format (the envelope holds them otherwise),
 * but its trace context always.  Nothing here does I/O.
 */
#include "dispatch/format.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <openssl/evp.h>

#include "base/assert.h"
#include "base/errors.h"

/* Digits of a CloudEvents sequence (INT64_MAX has 19). */
#define CE_SEQUENCE_DIGITS 19

/* The payload value `it` points at as JSON in mode `json`; NULL when
 * libbson cannot write it (a string that is not UTF-8, which the
 * publishing path refuses).  Caller frees with bson_free. */
static char *format_json_value (const bson_iter_t *it, handler_json_t json, size_t *len);

/* Headers one message carries, at most: the event's own (the annotation
 * allows 64, codec/annotate.h) and ours (at most 13). */
#define FORMAT_HEADERS_MAX 96
/* Nesting a plain conversion follows; BSON documents nest at most 100
 * deep in practice, the codec refuses deeper events. */
#define FORMAT_PLAIN_DEPTH_MAX 128

/* ----------------------------------------------------------- JSON values */

bool
format_rfc3339 (int64_t ms, char out[32])
{
   int64_t secs = ms / 1000, rem = ms % 1000;
   time_t t;
   struct tm tm;
   char base[24];

   if (rem < 0) {
      rem += 1000;
      secs--;
   }
   t = (time_t) secs;
   if (!gmtime_r (&t, &tm) || tm.tm_year + 1900 < 0 || tm.tm_year + 1900 > 9999)
      return false;
   strftime (base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
   snprintf (out, 32, "%s.%03dZ", base, (int) rem);
   return true;
}

static char *
base64 (const uint8_t *data, uint32_t len)
{
   char *out = bson_malloc (4 * ((size_t) len / 3 + 1) + 1);

   EVP_EncodeBlock ((unsigned char *) out, data, (int) len);
   return out;
}

static void plain_append (bson_t *dst, const char *key, const bson_iter_t *it, int depth);

static void
plain_children (bson_t *dst, const bson_iter_t *it, int depth)
{
   bson_iter_t child;

   if (!bson_iter_recurse (it, &child))
      return;
   while (bson_iter_next (&child))
      plain_append (dst, bson_iter_key (&child), &child, depth + 1);
}

/* Appends the value at `it` to `dst` as `key`, in the types plain JSON
 * has: see docs/handlers.md#payload-json for each mapping. */
static void
plain_append (bson_t *dst, const char *key, const bson_iter_t *it, int depth)
{
   char buf[BSON_DECIMAL128_STRING > 32 ? BSON_DECIMAL128_STRING : 32];
   bson_t sub;

   if (depth > FORMAT_PLAIN_DEPTH_MAX) {
      BSON_APPEND_NULL (dst, key);
      return;
   }
   switch (bson_iter_type (it)) {
   case BSON_TYPE_DATE_TIME:
      /* A date RFC 3339 cannot write (before year 0, after 9999) keeps
       * its milliseconds since the epoch. */
      if (format_rfc3339 (bson_iter_date_time (it), buf))
         BSON_APPEND_UTF8 (dst, key, buf);
      else
         BSON_APPEND_INT64 (dst, key, bson_iter_date_time (it));
      break;
   case BSON_TYPE_OID:
      bson_oid_to_string (bson_iter_oid (it), buf);
      BSON_APPEND_UTF8 (dst, key, buf);
      break;
   case BSON_TYPE_DECIMAL128: {
      bson_decimal128_t dec;
      bson_iter_decimal128 (it, &dec);
      bson_decimal128_to_string (&dec, buf);
      BSON_APPEND_UTF8 (dst, key, buf);
      break;
   }
   case BSON_TYPE_BINARY: {
      const uint8_t *data;
      uint32_t len;
      char *b64;
      bson_iter_binary (it, NULL, &len, &data);
      b64 = base64 (data, len);
      BSON_APPEND_UTF8 (dst, key, b64);
      bson_free (b64);
      break;
   }
   case BSON_TYPE_DOUBLE: {
      double v = bson_iter_double (it);
      /* JSON has no NaN or infinities. */
      if (isnan (v))
         BSON_APPEND_UTF8 (dst, key, "NaN");
      else if (isinf (v))
         BSON_APPEND_UTF8 (dst, key, v > 0 ? "Infinity" : "-Infinity");
      else
         BSON_APPEND_DOUBLE (dst, key, v);
      break;
   }
   case BSON_TYPE_REGEX: {
      const char *options, *pattern = bson_iter_regex (it, &options);
      char *s = bson_strdup_printf ("/%s/%s", pattern, options ? options : "");
      BSON_APPEND_UTF8 (dst, key, s);
      bson_free (s);
      break;
   }
   case BSON_TYPE_TIMESTAMP: {
      uint32_t t, i;
      bson_iter_timestamp (it, &t, &i);
      BSON_APPEND_DOCUMENT_BEGIN (dst, key, &sub);
      BSON_APPEND_INT64 (&sub, "t", t);
      BSON_APPEND_INT64 (&sub, "i", i);
      bson_append_document_end (dst, &sub);
      break;
   }
   case BSON_TYPE_CODE:
      BSON_APPEND_UTF8 (dst, key, bson_iter_code (it, NULL));
      break;
   case BSON_TYPE_CODEWSCOPE: {
      uint32_t len, scope_len;
      const uint8_t *scope;
      BSON_APPEND_UTF8 (dst, key, bson_iter_codewscope (it, &len, &scope_len, &scope));
      break;
   }
   case BSON_TYPE_SYMBOL:
      BSON_APPEND_UTF8 (dst, key, bson_iter_symbol (it, NULL));
      break;
   case BSON_TYPE_DBPOINTER: {
      const char *coll;
      uint32_t len;
      const bson_oid_t *oid;
      bson_iter_dbpointer (it, &len, &coll, &oid);
      bson_oid_to_string (oid, buf);
      BSON_APPEND_DOCUMENT_BEGIN (dst, key, &sub);
      BSON_APPEND_UTF8 (&sub, "$ref", coll);
      BSON_APPEND_UTF8 (&sub, "$id", buf);
      bson_append_document_end (dst, &sub);
      break;
   }
   case BSON_TYPE_UNDEFINED:
   case BSON_TYPE_MINKEY:
   case BSON_TYPE_MAXKEY:
      BSON_APPEND_NULL (dst, key);
      break;
   case BSON_TYPE_DOCUMENT:
      BSON_APPEND_DOCUMENT_BEGIN (dst, key, &sub);
      plain_children (&sub, it, depth);
      bson_append_document_end (dst, &sub);
      break;
   case BSON_TYPE_ARRAY:
      BSON_APPEND_ARRAY_BEGIN (dst, key, &sub);
      plain_children (&sub, it, depth);
      bson_append_array_end (dst, &sub);
      break;
   default:
      /* Strings, booleans, null, 32- and 64-bit integers: relaxed
       * Extended JSON writes them as plain JSON already. */
      bson_append_iter (dst, key, -1, it);
      break;
   }
}

static char *
format_json_value (const bson_iter_t *it, handler_json_t json, size_t *len)
{
   /* libbson writes a document only: the value is written as the one
    * field of {"v": value} and cut out of `{ "v" : ` and ` }`. */
   static const char head[] = "{ \"v\" : ", tail[] = " }";
   bson_t w = BSON_INITIALIZER;
   char *doc, *out;
   size_t n;

   if (json == HANDLER_JSON_PLAIN)
      plain_append (&w, "v", it, 0);
   else
      bson_append_iter (&w, "v", 1, it);
   doc = json == HANDLER_JSON_CANONICAL ? bson_as_canonical_extended_json (&w, &n) : bson_as_relaxed_extended_json (&w, &n);
   bson_destroy (&w);
   if (!doc)
      return NULL; /* libbson writes no JSON for a string that is not UTF-8 */
   RELAYBUS_ASSERT (n >= sizeof head - 1 + sizeof tail - 1 && !strncmp (doc, head, sizeof head - 1));
   n -= sizeof head - 1 + sizeof tail - 1;
   out = bson_strndup (doc + sizeof head - 1, n);
   bson_free (doc);
   if (len)
      *len = n;
   return out;
}

/* The payload as JSON, "null" without one. */
static char *
payload_json (const store_delivery_t *d, handler_json_t json, size_t *len)
{
   bson_iter_t it;

   if (d->event && bson_iter_init_find (&it, d->event, "payload"))
      return format_json_value (&it, json, len);
   *len = 4;
   return bson_strdup ("null");
}

/* ------------------------------------------------------------- headers */

/* A header value as it may be carried: each ASCII control character but
 * the tab (CR and LF above all, which HTTP and NATS read as the header's
 * end and the start of another) written as %XX, as CloudEvents' HTTP
 * binding percent-encodes what a header cannot hold.  The publishing path
 * refuses such a type, key or id (codec/annotate.c); this holds for
 * whatever else reaches a header: an event stored before that check, or
 * written into a shared outbox by another program. */
static char *
header_value (const char *value)
{
   size_t n = 0;
   char *out, *o;

   for (const unsigned char *c = (const unsigned char *) value; *c; c++)
      n += FORMAT_HEADER_CTL (*c) ? 3 : 1;
   o = out = bson_malloc (n + 1);
   for (const unsigned char *c = (const unsigned char *) value; *c; c++) {
      if (FORMAT_HEADER_CTL (*c)) {
         snprintf (o, 4, "%%%02X", *c);
         o += 3;
      } else {
         *o++ = (char) *c;
      }
   }
   *o = '\0';
   return out;
}

bool
format_header_safe (const char *s)
{
   for (; *s; s++)
      if (FORMAT_HEADER_CTL (*s))
         return false;
   return true;
}

static void
add_header (format_msg_t *m, const char *name, const char *value)
{
   RELAYBUS_ASSERT (m->n_headers < FORMAT_HEADERS_MAX);
   m->headers[m->n_headers].name = bson_strdup (name);
   m->headers[m->n_headers].value = header_value (value);
   m->n_headers++;
}

static void
add_number (format_msg_t *m, const char *name, int64_t v)
{
   char buf[32];

   snprintf (buf, sizeof buf, "%" PRId64, v);
   add_header (m, name, buf);
   m->headers[m->n_headers - 1].numeric = true;
   m->headers[m->n_headers - 1].number = v;
}

/* An HTTP token (RFC 9110): what HTTP and NATS carry as a header name. */
static bool
token (const char *k)
{
   if (!*k)
      return false;
   for (const unsigned char *c = (const unsigned char *) k; *c; c++)
      if (*c <= ' ' || *c >= 0x7f || strchr ("()<>@,;:\\\"/[]?={}", *c))
         return false;
   return true;
}

static bool
prefixed (const char *name, const char *prefix)
{
   return !strncasecmp (name, prefix, strlen (prefix));
}

static bool
is_trace (const char *name)
{
   return !strcasecmp (name, "traceparent") || !strcasecmp (name, "tracestate");
}

/* Whether the event's own header `name` is carried in binding `b`: a
 * name the protocol can carry, never one of the names we set ourselves
 * (so that each appears once and ours are the ones read). */
static bool
event_header_carried (format_binding_t b, handler_format_t f, const char *name)
{
   bool ce = f == HANDLER_FORMAT_CLOUDEVENTS || f == HANDLER_FORMAT_CLOUDEVENTS_STRUCTURED;

   if (!*name || prefixed (name, "relaybus-"))
      return false;
   if (ce && !strcasecmp (name, "content-type"))
      return false;
   switch (b) {
   case FORMAT_BINDING_KAFKA:
      return !(f == HANDLER_FORMAT_CLOUDEVENTS && prefixed (name, "ce_"));
   case FORMAT_BINDING_NATS:
      return token (name) && !prefixed (name, "nats-") && !(f == HANDLER_FORMAT_CLOUDEVENTS && prefixed (name, "ce-"));
   case FORMAT_BINDING_AMQP:
      return strlen (name) < 128 && !(f == HANDLER_FORMAT_CLOUDEVENTS && prefixed (name, "cloudEvents"));
   case FORMAT_BINDING_HTTP:
      /* The envelope holds the event's headers; the trace context is an
       * HTTP header in every format, the rest only in the payload
       * format, and never one that HTTP or the signature reads. */
      if (is_trace (name))
         return token (name);
      return f == HANDLER_FORMAT_PAYLOAD && token (name) && strcasecmp (name, "host") && !prefixed (name, "content-") &&
             strcasecmp (name, "connection") && strcasecmp (name, "transfer-encoding") && strcasecmp (name, "te") &&
             strcasecmp (name, "upgrade") && strcasecmp (name, "expect") && strcasecmp (name, "keep-alive") &&
             strcasecmp (name, "trailer") && strcasecmp (name, "user-agent") && !prefixed (name, "proxy-") &&
             !prefixed (name, "webhook-") && !prefixed (name, "ce-");
   case FORMAT_BINDING_PULL:
   default:
      return false;
   }
}

/* The event's own headers that binding `b` carries; header values never
 * hold a line break (HTTP and NATS would read it as the next header). */
static void
add_event_headers (format_msg_t *m, format_binding_t b, handler_format_t f, const store_delivery_t *d)
{
   bson_iter_t it, hit;

   if (!d->event || !bson_iter_init_find (&it, d->event, "headers") || !BSON_ITER_HOLDS_DOCUMENT (&it) ||
       !bson_iter_recurse (&it, &hit))
      return;
   while (bson_iter_next (&hit) && m->n_headers < FORMAT_HEADERS_MAX - 16) {
      const char *name = bson_iter_key (&hit);
      char *value;
      if (!BSON_ITER_HOLDS_UTF8 (&hit) || !event_header_carried (b, f, name))
         continue;
      /* A line break becomes a space (the value reads on); any other
       * control character is encoded by add_header. */
      value = bson_strdup (bson_iter_utf8 (&hit, NULL));
      for (char *c = value; *c; c++)
         if (*c == '\r' || *c == '\n')
            *c = ' ';
      add_header (m, name, value);
      bson_free (value);
   }
}

/* The relaybus-* headers the broker kinds always carried. */
static void
add_relaybus_headers (format_msg_t *m, const store_delivery_t *d, const char *delivery_id)
{
   add_header (m, "relaybus-event-id", d->event_id ? d->event_id : "");
   add_header (m, "relaybus-delivery-id", delivery_id);
   add_header (m, "relaybus-type", d->event_type ? d->event_type : "");
   if (d->key) {
      add_header (m, "relaybus-key", d->key);
      add_number (m, "relaybus-sequence", d->sequence);
   }
}

static const char *
ce_prefix (format_binding_t b)
{
   switch (b) {
   case FORMAT_BINDING_KAFKA:
      return "ce_";
   case FORMAT_BINDING_AMQP:
      return "cloudEvents_";
   case FORMAT_BINDING_PULL:
      return "";
   case FORMAT_BINDING_HTTP:
   case FORMAT_BINDING_NATS:
   default:
      return "ce-";
   }
}

/* createdAt: the event's, else the delivery's. */
static int64_t
created_at (const store_delivery_t *d)
{
   bson_iter_t it;

   if (d->event && bson_iter_init_find (&it, d->event, "createdAt") && BSON_ITER_HOLDS_DATE_TIME (&it))
      return bson_iter_date_time (&it);
   return d->created_at;
}

/* The CloudEvents context attributes of `d`, in order, as (name, value)
 * pairs into `names`/`values`; `seq` holds the sequence's text.  Returns
 * how many (at most 7). */
static size_t
ce_attributes (const format_opts_t *o, const store_delivery_t *d, const char *names[7], const char *values[7], char time[32], char seq[32])
{
   size_t n = 0;

   if (!format_rfc3339 (created_at (d), time))
      bson_strncpy (time, "1970-01-01T00:00:00.000Z", 32); /* never: the store writes today's dates */
   names[n] = "specversion", values[n++] = FORMAT_CE_SPECVERSION;
   names[n] = "id", values[n++] = d->event_id ? d->event_id : "";
   names[n] = "source", values[n++] = o->source;
   names[n] = "type", values[n++] = d->event_type ? d->event_type : "";
   names[n] = "time", values[n++] = time;
   if (d->key) {
      /* The sequence extension wants a lexicographically orderable string:
       * zero-padded to the 19 digits of INT64_MAX, so "10" does not sort
       * before "9". */
      snprintf (seq, 32, "%0*" PRId64, CE_SEQUENCE_DIGITS, d->sequence);
      names[n] = "subject", values[n++] = d->key;
      names[n] = "sequence", values[n++] = seq;
   }
   return n;
}

/* ---------------------------------------------------------------- bodies */

/* `{ a..., "payload" : P, b... }` from the relaxed JSON of two documents
 * (`a` ends with " }", `b` starts with "{ "), so that the envelope keeps
 * its field order and only the payload follows `json`. */
static char *
envelope_splice (const bson_t *a, const char *payload, const bson_t *b, size_t *len)
{
   size_t na, nb;
   char *ja = bson_as_relaxed_extended_json (a, &na), *jb = bson_as_relaxed_extended_json (b, &nb);
   char *out = NULL;

   if (!ja || !jb)
      goto done; /* a field libbson cannot write as JSON */
   RELAYBUS_ASSERT (na >= 4 && nb >= 4 && !strcmp (ja + na - 2, " }") && !strncmp (jb, "{ ", 2));
   ja[na - 2] = '\0';
   out = bson_strdup_printf ("%s, \"payload\" : %s, %s", ja, payload, jb + 2);
   *len = strlen (out);

done:
   bson_free (ja);
   bson_free (jb);
   return out;
}

/* The relaybus envelope (docs/handlers.md#the-relaybus-envelope). */
static char *
envelope (const format_opts_t *o, const store_delivery_t *d, const char *payload, size_t *len)
{
   bson_t a = BSON_INITIALIZER, b = BSON_INITIALIZER, del;
   bson_iter_t it;
   char iso[32], hex[25];
   char *json;

   (void) o;
   BSON_APPEND_UTF8 (&a, "id", d->event_id ? d->event_id : "");
   BSON_APPEND_UTF8 (&a, "type", d->event_type ? d->event_type : "");
   if (d->key) {
      BSON_APPEND_UTF8 (&a, "key", d->key);
      BSON_APPEND_INT64 (&a, "sequence", d->sequence);
   }
   if (d->event && bson_iter_init_find (&it, d->event, "headers") && BSON_ITER_HOLDS_DOCUMENT (&it))
      bson_append_iter (&b, "headers", -1, &it);
   if (d->event && bson_iter_init_find (&it, d->event, "correlationId") && BSON_ITER_HOLDS_UTF8 (&it))
      bson_append_iter (&b, "correlationId", -1, &it);
   if (d->event && bson_iter_init_find (&it, d->event, "causationId") && BSON_ITER_HOLDS_UTF8 (&it))
      bson_append_iter (&b, "causationId", -1, &it);
   if (!format_rfc3339 (created_at (d), iso))
      bson_strncpy (iso, "1970-01-01T00:00:00.000Z", sizeof iso);
   BSON_APPEND_UTF8 (&b, "createdAt", iso);
   bson_oid_to_string (&d->id, hex);
   BSON_APPEND_DOCUMENT_BEGIN (&b, "delivery", &del);
   BSON_APPEND_UTF8 (&del, "id", hex);
   BSON_APPEND_UTF8 (&del, "handler", d->handler ? d->handler : "");
   BSON_APPEND_INT32 (&del, "attempt", d->attempt);
   bson_append_document_end (&b, &del);
   json = envelope_splice (&a, payload, &b, len);
   bson_destroy (&a);
   bson_destroy (&b);
   return json;
}

/* One application/cloudevents+json object: the attributes, the trace
 * context (CloudEvents' distributed tracing extension) and the payload as
 * `data`, last. */
static char *
structured (const format_opts_t *o, const store_delivery_t *d, const format_msg_t *m, const char *payload, size_t *len)
{
   const char *names[7], *values[7];
   char time[32], seq[32];
   size_t n = ce_attributes (o, d, names, values, time, seq), na;
   bson_t a = BSON_INITIALIZER;
   char *ja, *json;

   for (size_t i = 0; i < n; i++)
      bson_append_utf8 (&a, names[i], -1, values[i], -1);
   BSON_APPEND_UTF8 (&a, "datacontenttype", "application/json");
   if (m->traceparent)
      BSON_APPEND_UTF8 (&a, "traceparent", m->traceparent);
   if (m->tracestate)
      BSON_APPEND_UTF8 (&a, "tracestate", m->tracestate);
   ja = bson_as_relaxed_extended_json (&a, &na);
   bson_destroy (&a);
   if (!ja)
      return NULL; /* a string libbson cannot write as JSON */
   RELAYBUS_ASSERT (na >= 4 && !strcmp (ja + na - 2, " }"));
   ja[na - 2] = '\0';
   json = bson_strdup_printf ("%s, \"data\" : %s }", ja, payload);
   *len = strlen (json);
   bson_free (ja);
   return json;
}

/* ----------------------------------------------------------- rendering */

format_binding_t
format_binding_of (handler_kind_t kind)
{
   switch (kind) {
   case HANDLER_KIND_WEBHOOK:
      return FORMAT_BINDING_HTTP;
   case HANDLER_KIND_KAFKA:
      return FORMAT_BINDING_KAFKA;
   case HANDLER_KIND_NATS:
      return FORMAT_BINDING_NATS;
   case HANDLER_KIND_RABBITMQ:
      return FORMAT_BINDING_AMQP;
   case HANDLER_KIND_PULL:
   default:
      return FORMAT_BINDING_PULL;
   }
}

void
format_opts_from_handler (format_opts_t *o, const config_handler_t *h)
{
   o->format = h->format_id;
   o->json = h->json_id;
   o->source = h->source && *h->source ? h->source : FORMAT_CE_SOURCE_DEFAULT;
}

/* The event's trace context, pointing into d->event. */
static void
find_trace (format_msg_t *m, const store_delivery_t *d)
{
   bson_iter_t it, hit;

   if (!d->event || !bson_iter_init_find (&it, d->event, "headers") || !BSON_ITER_HOLDS_DOCUMENT (&it) ||
       !bson_iter_recurse (&it, &hit))
      return;
   while (bson_iter_next (&hit))
      if (BSON_ITER_HOLDS_UTF8 (&hit)) {
         if (!strcasecmp (bson_iter_key (&hit), "traceparent"))
            m->traceparent = bson_iter_utf8 (&hit, NULL);
         else if (!strcasecmp (bson_iter_key (&hit), "tracestate"))
            m->tracestate = bson_iter_utf8 (&hit, NULL);
      }
}

bool
format_render (const format_opts_t *o, format_binding_t b, const store_delivery_t *d, format_msg_t *m, bson_error_t *error)
{
   char hex[25];
   char *payload;
   size_t plen = 0;

   memset (m, 0, sizeof *m);
   m->headers = bson_malloc0 (FORMAT_HEADERS_MAX * sizeof *m->headers);
   bson_oid_to_string (&d->id, hex);
   find_trace (m, d);
   payload = payload_json (d, o->json, &plen);
   if (!payload) {
      bson_set_error (error, FORMAT_ERROR_DOMAIN, FORMAT_ERROR_JSON, "delivery %s: the event's payload cannot be written as JSON", hex);
      return false;
   }
   switch (o->format) {
   case HANDLER_FORMAT_CLOUDEVENTS_STRUCTURED:
      m->body = structured (o, d, m, payload, &m->body_len);
      m->content_type = "application/cloudevents+json";
      break;
   case HANDLER_FORMAT_CLOUDEVENTS:
   case HANDLER_FORMAT_PAYLOAD:
      m->body = payload;
      m->body_len = plen;
      payload = NULL;
      m->content_type = "application/json";
      break;
   case HANDLER_FORMAT_RELAYBUS:
   default:
      m->body = envelope (o, d, payload, &m->body_len);
      m->content_type = "application/json";
      break;
   }
   bson_free (payload);
   if (!m->body) {
      bson_set_error (error, FORMAT_ERROR_DOMAIN, FORMAT_ERROR_JSON, "delivery %s: the event cannot be written as JSON", hex);
      return false;
   }

   /* Headers: the event's own first, then ours (set after them, they are
    * the ones a reader of the last value sees, and none is doubled). */
   add_event_headers (m, b, o->format, d);
   if (b == FORMAT_BINDING_HTTP && o->format == HANDLER_FORMAT_PAYLOAD)
      add_relaybus_headers (m, d, hex);
   else if (b != FORMAT_BINDING_HTTP && b != FORMAT_BINDING_PULL)
      add_relaybus_headers (m, d, hex);
   if (o->format == HANDLER_FORMAT_CLOUDEVENTS) {
      const char *names[7], *values[7];
      char time[32], seq[32], name[64];
      size_t n = ce_attributes (o, d, names, values, time, seq);

      for (size_t i = 0; i < n; i++) {
         snprintf (name, sizeof name, "%s%s", ce_prefix (b), names[i]);
         add_header (m, name, values[i]);
      }
   }
   /* Kafka and NATS have no content type of their own: their bindings
    * name a header for it.  HTTP's and AMQP's is the kind's to set. */
   if ((b == FORMAT_BINDING_KAFKA || b == FORMAT_BINDING_NATS) &&
       (o->format == HANDLER_FORMAT_CLOUDEVENTS || o->format == HANDLER_FORMAT_CLOUDEVENTS_STRUCTURED))
      add_header (m, "content-type", m->content_type);
   /* The trace context's pointers follow the headers the message carries
    * when it carries them (they outlive the event the dispatcher frees
    * before the message). */
   {
      const char *tp = format_msg_header (m, "traceparent"), *ts = format_msg_header (m, "tracestate");
      if (tp)
         m->traceparent = tp;
      if (ts)
         m->tracestate = ts;
   }
   return true;
}

void
format_msg_fini (format_msg_t *m)
{
   if (!m)
      return;
   for (size_t i = 0; i < m->n_headers; i++) {
      bson_free (m->headers[i].name);
      bson_free (m->headers[i].value);
   }
   bson_free (m->headers);
   bson_free (m->body);
   memset (m, 0, sizeof *m);
}

const char *
format_msg_header (const format_msg_t *m, const char *name)
{
   for (size_t i = 0; i < m->n_headers; i++)
      if (!strcasecmp (m->headers[i].name, name))
         return m->headers[i].value;
   return NULL;
}
