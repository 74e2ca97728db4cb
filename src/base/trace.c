/*
 * base/trace.c - span export to an OpenTelemetry collector (OTLP/HTTP,
 * JSON encoding) from a thread of its own.
 *
 * The queue is a ring of TRACE_QUEUE_MAX fixed-size spans under one
 * mutex: a producer (a forwarding loop, the dispatcher) copies its span in
 * and signals; the export thread takes up to TRACE_BATCH_MAX at a time
 * (or what came within TRACE_LINGER_MS), encodes them and POSTs them with
 * a blocking libcurl easy handle, outside the lock.  A full ring drops the
 * new span; a batch the collector refuses or cannot take is dropped too:
 * both counted.  A batch the collector asks to send again (429, 502, 503,
 * 504: OTLP/HTTP's retryable answers) is sent again after a backoff with
 * jitter, or after its Retry-After, up to TRACE_RETRY_MAX times; meanwhile
 * new spans wait in the ring (and past it are dropped), so a retry never
 * holds more than the ring and one batch.  Bodies are gzip-compressed.
 *
 * Where to export, and as what service, comes from [tracing], and where a
 * key is empty, from OpenTelemetry's environment variables
 * (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
 * OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS
 * and OTEL_EXPORTER_OTLP_TRACES_HEADERS): trace_settings_resolve.  What it
 * does not do: persist, or sample (the callers decide which spans exist).
 */
#include "base/trace.h"
#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <curl/curl.h>
#include <zlib.h>

#include "base/counters.h"
#include "base/log.h"

#define TRACE_LINGER_MS 200        /* longest a span waits for its batch to fill */
#define TRACE_POST_TIMEOUT_MS 5000 /* one POST, connection included */
#define TRACE_RETRY_MAX 8             /* sends of one batch the collector asks to repeat */
#define TRACE_BACKOFF_FIRST_MS 500    /* the first wait; doubled each time ... */
#define TRACE_BACKOFF_MAX_MS 8000     /* ... up to this (then a random half to all of it) */
#define TRACE_RETRY_AFTER_MAX_MS 30000 /* the longest Retry-After honoured */

/* The exporter: one per process, made by trace_start, freed by trace_stop. */
typedef struct {
   pthread_mutex_t mu;
   pthread_cond_t cv;
   trace_span_t *ring; /* TRACE_QUEUE_MAX, owned */
   size_t head, n;     /* under mu */
   bool stopping;      /* under mu */
   pthread_t thread;
   trace_settings_t set;
   char *resource_json;         /* the batch's "resource" object, built once */
   struct curl_slist *headers;  /* Content-Type, Content-Encoding, the configured ones */
} trace_exporter_t;

static trace_exporter_t *exporter;
static atomic_bool enabled;
/* sample as a threshold on a random 32-bit value: 0 never, 2^32 always. */
static _Atomic uint64_t sample_threshold;

/* --------------------------------------------------------------- ids */

/* xorshift64* per thread, seeded once from the kernel: ids need to be
 * unique, not secret, and a loop must not make a syscall per span. */
static uint64_t
trace_rand (void)
{
   static _Thread_local uint64_t state;

   while (state == 0) {
      if (getrandom (&state, sizeof state, GRND_NONBLOCK) != (ssize_t) sizeof state)
         state = (uint64_t) time (NULL) ^ (uint64_t) (uintptr_t) &state;
   }
   state ^= state >> 12;
   state ^= state << 25;
   state ^= state >> 27;
   return state * 0x2545F4914F6CDD1DULL;
}

void
trace_new_id (uint8_t *out, size_t n)
{
   bool zero = true;

   while (zero) {
      for (size_t i = 0; i < n; i += 8) {
         uint64_t r = trace_rand ();
         memcpy (out + i, &r, n - i < 8 ? n - i : 8);
      }
      for (size_t i = 0; i < n; i++)
         zero = zero && out[i] == 0;
   }
}

int64_t
trace_now_ns (void)
{
   struct timespec ts;

   clock_gettime (CLOCK_REALTIME, &ts);
   return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

bool
trace_sample (void)
{
   uint64_t t = atomic_load (&sample_threshold);

   if (t == 0)
      return false;
   return (trace_rand () & 0xffffffffu) < t;
}

/* -------------------------------------------------------- traceparent */

static int
hexval (char c)
{
   if (c >= '0' && c <= '9')
      return c - '0';
   if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
   return -1;
}

static bool
parse_hex (const char *s, uint8_t *out, size_t n)
{
   bool zero = true;

   for (size_t i = 0; i < n; i++) {
      int hi = hexval (s[2 * i]), lo = hexval (s[2 * i + 1]);
      if (hi < 0 || lo < 0)
         return false;
      out[i] = (uint8_t) (hi << 4 | lo);
      zero = zero && out[i] == 0;
   }
   return !zero;
}

static void
write_hex (const uint8_t *in, size_t n, char *out)
{
   static const char digits[] = "0123456789abcdef";

   for (size_t i = 0; i < n; i++) {
      out[2 * i] = digits[in[i] >> 4];
      out[2 * i + 1] = digits[in[i] & 15];
   }
   out[2 * n] = '\0';
}

bool
trace_parse_traceparent (const char *s, trace_context_t *out)
{
   uint8_t flags;

   if (!s || strlen (s) != TRACE_PARENT_LEN || strncmp (s, "00-", 3) != 0 || s[35] != '-' || s[52] != '-')
      return false;
   if (!parse_hex (s + 3, out->trace_id, 16) || !parse_hex (s + 36, out->span_id, 8))
      return false;
   {
      int hi = hexval (s[53]), lo = hexval (s[54]);
      if (hi < 0 || lo < 0)
         return false;
      flags = (uint8_t) (hi << 4 | lo);
   }
   out->flags = flags;
   return true;
}

void
trace_format_traceparent (const trace_context_t *c, char out[TRACE_PARENT_LEN + 1])
{
   memcpy (out, "00-", 3);
   write_hex (c->trace_id, 16, out + 3);
   out[35] = '-';
   write_hex (c->span_id, 8, out + 36);
   out[52] = '-';
   write_hex (&c->flags, 1, out + 53);
}

/* ---------------------------------------------------------- attributes */

static void
copy_cut (char *dst, size_t cap, const char *src)
{
   size_t n = strlen (src);

   if (n >= cap) {
      n = cap - 1;
      /* back to the start of a UTF-8 sequence */
      while (n > 0 && ((unsigned char) src[n] & 0xc0) == 0x80)
         n--;
   }
   memcpy (dst, src, n);
   dst[n] = '\0';
}

void
trace_span_str (trace_span_t *s, const char *key, const char *value)
{
   trace_attr_t *a;

   if (s->n_attrs >= TRACE_ATTRS_MAX || !value)
      return;
   a = &s->attrs[s->n_attrs++];
   copy_cut (a->key, sizeof a->key, key);
   a->is_int = false;
   copy_cut (a->str_value, sizeof a->str_value, value);
}

void
trace_span_int (trace_span_t *s, const char *key, int64_t value)
{
   trace_attr_t *a;

   if (s->n_attrs >= TRACE_ATTRS_MAX)
      return;
   a = &s->attrs[s->n_attrs++];
   copy_cut (a->key, sizeof a->key, key);
   a->is_int = true;
   a->int_value = value;
}

/* A query string with each value replaced by REDACTED (signatures and
 * tokens often travel there). */
static char *
redact_query (const char *q)
{
   bson_string_t *out = bson_string_new (NULL);

   for (const char *p = q; p && *p;) {
      const char *amp = strchr (p, '&');
      size_t len = amp ? (size_t) (amp - p) : strlen (p);
      const char *eq = memchr (p, '=', len);

      if (out->len)
         bson_string_append_c (out, '&');
      if (eq) {
         char *k = bson_strndup (p, (size_t) (eq - p));
         bson_string_append_printf (out, "%s=REDACTED", k);
         bson_free (k);
      } else {
         char *k = bson_strndup (p, len);
         bson_string_append (out, k);
         bson_free (k);
      }
      p = amp ? amp + 1 : NULL;
   }
   return bson_string_free (out, false);
}

void
trace_span_http_client (trace_span_t *s, const char *method, const char *url)
{
   CURLU *u = curl_url ();
   char *full = NULL, *host = NULL, *port = NULL, *part = NULL;

   trace_span_str (s, "http.request.method", method);
   if (u && curl_url_set (u, CURLUPART_URL, url, 0) == CURLUE_OK) {
      if (curl_url_get (u, CURLUPART_USER, &part, 0) == CURLUE_OK)
         curl_url_set (u, CURLUPART_USER, "REDACTED", 0);
      curl_free (part);
      part = NULL;
      if (curl_url_get (u, CURLUPART_PASSWORD, &part, 0) == CURLUE_OK)
         curl_url_set (u, CURLUPART_PASSWORD, "REDACTED", 0);
      curl_free (part);
      part = NULL;
      if (curl_url_get (u, CURLUPART_QUERY, &part, 0) == CURLUE_OK) {
         char *q = redact_query (part);
         curl_url_set (u, CURLUPART_QUERY, q, 0);
         bson_free (q);
      }
      curl_free (part);
      (void) curl_url_get (u, CURLUPART_URL, &full, 0);
      (void) curl_url_get (u, CURLUPART_HOST, &host, 0);
      (void) curl_url_get (u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
   }
   /* Unparsable: the URL is not shown at all rather than shown unmasked. */
   trace_span_str (s, "url.full", full ? full : "");
   if (host) {
      size_t n = strlen (host);
      /* "[::1]": server.address is the address without brackets. */
      if (n > 2 && host[0] == '[' && host[n - 1] == ']') {
         host[n - 1] = '\0';
         trace_span_str (s, "server.address", host + 1);
      } else {
         trace_span_str (s, "server.address", host);
      }
   }
   if (port)
      trace_span_int (s, "server.port", strtol (port, NULL, 10));
   curl_free (full);
   curl_free (host);
   curl_free (port);
   curl_url_cleanup (u);
}

/* ------------------------------------------------------------ encoding */

/* A JSON string, quoted; libbson escapes it (invalid UTF-8 is replaced
 * by bson_utf8_escape_for_json's refusal: then an empty string). */
static void
append_json_string (bson_string_t *out, const char *s)
{
   char *e = bson_utf8_escape_for_json (s, -1);

   bson_string_append_printf (out, "\"%s\"", e ? e : "");
   bson_free (e);
}

static void
append_kv_string (bson_string_t *out, const char *key, const char *value)
{
   bson_string_append (out, "{\"key\":");
   append_json_string (out, key);
   bson_string_append (out, ",\"value\":{\"stringValue\":");
   append_json_string (out, value);
   bson_string_append (out, "}}");
}

/* The "resource" object of a batch: service.name, service.version (this
 * build's, unless the attributes give one) and the attributes `keys` and
 * `values` (service.name among them is left out: `service_name` is it). */
static char *
resource_json_build (const char *service_name, char *const *keys, char *const *values, size_t n)
{
   bson_string_t *out = bson_string_new ("{\"attributes\":[");
   bool have_version = false;

   append_kv_string (out, "service.name", service_name && *service_name ? service_name : "relaybus-proxy");
   for (size_t i = 0; i < n; i++)
      have_version = have_version || !strcmp (keys[i], "service.version");
   if (!have_version) {
      bson_string_append (out, ",");
      append_kv_string (out, "service.version", PACKAGE_VERSION);
   }
   for (size_t i = 0; i < n; i++) {
      if (!strcmp (keys[i], "service.name"))
         continue;
      bson_string_append (out, ",");
      append_kv_string (out, keys[i], values[i]);
   }
   bson_string_append (out, "]}");
   return bson_string_free (out, false);
}

/* A "k=v,k=v" list (config's normalised resource_attributes) as keys and
 * values, split at the first '=' of each item; items without one are
 * left out.  Returns the count; the caller frees with strv_free. */
static size_t
split_pairs (const char *list, char ***keys, char ***values)
{
   size_t n = 0, cap = 0;
   const char *p = list;

   *keys = NULL;
   *values = NULL;
   while (p && *p) {
      const char *comma = strchr (p, ',');
      size_t len = comma ? (size_t) (comma - p) : strlen (p);
      const char *eq = memchr (p, '=', len);

      if (eq) {
         if (n == cap) {
            cap = cap ? 2 * cap : 8;
            *keys = bson_realloc (*keys, cap * sizeof **keys);
            *values = bson_realloc (*values, cap * sizeof **values);
         }
         (*keys)[n] = bson_strndup (p, (size_t) (eq - p));
         (*values)[n] = bson_strndup (eq + 1, len - (size_t) (eq - p) - 1);
         n++;
      }
      p = comma ? comma + 1 : NULL;
   }
   return n;
}

static void
strv_free (char **v, size_t n)
{
   for (size_t i = 0; i < n; i++)
      bson_free (v[i]);
   bson_free (v);
}

/* The body around spans: resourceSpans with `resource_json`, one scope. */
static char *
encode_batch (const trace_span_t *spans, size_t n, const char *resource_json, size_t *len)
{
   bson_string_t *out = bson_string_new ("{\"resourceSpans\":[{\"resource\":");
   char hex[33];

   bson_string_append (out, resource_json);
   bson_string_append (out, ",\"scopeSpans\":[{\"scope\":{\"name\":\"relaybus-proxy\",\"version\":\"" PACKAGE_VERSION "\"},\"spans\":[");
   for (size_t i = 0; i < n; i++) {
      const trace_span_t *s = &spans[i];
      uint8_t zero[8] = {0};

      if (i > 0)
         bson_string_append (out, ",");
      write_hex (s->trace_id, 16, hex);
      bson_string_append_printf (out, "{\"traceId\":\"%s\"", hex);
      write_hex (s->span_id, 8, hex);
      bson_string_append_printf (out, ",\"spanId\":\"%s\"", hex);
      if (memcmp (s->parent_id, zero, 8) != 0) {
         write_hex (s->parent_id, 8, hex);
         bson_string_append_printf (out, ",\"parentSpanId\":\"%s\"", hex);
      }
      bson_string_append (out, ",\"name\":");
      append_json_string (out, s->name);
      bson_string_append_printf (out,
                                 ",\"kind\":%d,\"startTimeUnixNano\":\"%" PRId64 "\",\"endTimeUnixNano\":\"%" PRId64
                                 "\",\"attributes\":[",
                                 (int) s->kind,
                                 s->start_ns,
                                 s->end_ns);
      for (size_t k = 0; k < s->n_attrs && k < TRACE_ATTRS_MAX; k++) {
         const trace_attr_t *a = &s->attrs[k];
         if (k > 0)
            bson_string_append (out, ",");
         if (a->is_int) {
            bson_string_append (out, "{\"key\":");
            append_json_string (out, a->key);
            /* OTLP JSON writes 64-bit integers as strings. */
            bson_string_append_printf (out, ",\"value\":{\"intValue\":\"%" PRId64 "\"}}", a->int_value);
         } else {
            append_kv_string (out, a->key, a->str_value);
         }
      }
      /* STATUS_CODE_ERROR is 2; UNSET (0) is omitted. */
      bson_string_append (out, s->error ? "],\"status\":{\"code\":2}}" : "],\"status\":{}}");
   }
   bson_string_append (out, "]}]}]}");
   if (len)
      *len = out->len;
   return bson_string_free (out, false);
}

char *
trace_encode_otlp_json (const trace_span_t *spans, size_t n, const char *service_name, const char *resource_attributes, size_t *len)
{
   char **keys, **values;
   size_t na = split_pairs (resource_attributes, &keys, &values);
   char *resource = resource_json_build (service_name, keys, values, na);
   char *json = encode_batch (spans, n, resource, len);

   strv_free (keys, na);
   strv_free (values, na);
   bson_free (resource);
   return json;
}

/* ------------------------------------------------------------ exporter */

void
trace_emit (const trace_span_t *s)
{
   trace_exporter_t *x = exporter;
   bool dropped = false;

   if (!atomic_load (&enabled) || !x)
      return;
   pthread_mutex_lock (&x->mu);
   if (x->n >= TRACE_QUEUE_MAX || x->stopping) {
      dropped = true;
   } else {
      x->ring[(x->head + x->n) % TRACE_QUEUE_MAX] = *s;
      x->n++;
      if (x->n == 1 || x->n == TRACE_BATCH_MAX)
         pthread_cond_signal (&x->cv);
   }
   pthread_mutex_unlock (&x->mu);
   if (dropped)
      counters_add (COUNTER_TRACE_SPANS_DROPPED, 1);
}

static size_t
discard_body (char *ptr, size_t size, size_t nmemb, void *arg)
{
   (void) ptr;
   (void) arg;
   return size * nmemb;
}

/* `in` gzip-compressed (OTLP/HTTP's Content-Encoding: gzip), or NULL. */
static char *
gzip_body (const char *in, size_t len, size_t *out_len)
{
   z_stream z;
   uLong cap;
   char *out;

   memset (&z, 0, sizeof z);
   /* 15 + 16: a gzip header and trailer rather than zlib's. */
   if (deflateInit2 (&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
      return NULL;
   cap = deflateBound (&z, (uLong) len);
   out = bson_malloc (cap);
   z.next_in = (Bytef *) in;
   z.avail_in = (uInt) len;
   z.next_out = (Bytef *) out;
   z.avail_out = (uInt) cap;
   if (deflate (&z, Z_FINISH) != Z_STREAM_END) {
      deflateEnd (&z);
      bson_free (out);
      return NULL;
   }
   *out_len = z.total_out;
   deflateEnd (&z);
   return out;
}

/* Waits `ms` on the exporter's condition (new spans also wake it), or
 * until it is stopping; true when it is. */
static bool
wait_or_stop (trace_exporter_t *x, int64_t ms)
{
   struct timespec until;
   bool stopping;

   clock_gettime (CLOCK_REALTIME, &until);
   until.tv_sec += ms / 1000;
   until.tv_nsec += (ms % 1000) * 1000000L;
   until.tv_sec += until.tv_nsec / 1000000000L;
   until.tv_nsec %= 1000000000L;
   pthread_mutex_lock (&x->mu);
   while (!x->stopping)
      if (pthread_cond_timedwait (&x->cv, &x->mu, &until) == ETIMEDOUT)
         break;
   stopping = x->stopping;
   pthread_mutex_unlock (&x->mu);
   return stopping;
}

/* Whether OTLP/HTTP says to send the batch again (the collector is busy
 * or behind a gateway that is). */
static bool
retryable (long status)
{
   return status == 429 || status == 502 || status == 503 || status == 504;
}

/* Sends `n` spans, again while the collector answers retryable (at most
 * TRACE_RETRY_MAX sends, waiting its Retry-After or a backoff with jitter
 * in between), and counts them exported or dropped.  A stop ends the
 * waiting: the batch is then dropped. */
static void
post_batch (trace_exporter_t *x, CURL *curl, const trace_span_t *batch, size_t n)
{
   size_t len = 0, zlen = 0;
   char *body = encode_batch (batch, n, x->resource_json, &len);
   char *zbody = gzip_body (body, len, &zlen);
   long status = 0;
   CURLcode rc = CURLE_OK;
   int64_t backoff = TRACE_BACKOFF_FIRST_MS;

   curl_easy_setopt (curl, CURLOPT_URL, x->set.url);
   /* The headers name gzip: without a compressed body, none of them. */
   curl_easy_setopt (curl, CURLOPT_HTTPHEADER, zbody ? x->headers : x->headers->next);
   curl_easy_setopt (curl, CURLOPT_POSTFIELDS, zbody ? zbody : body);
   curl_easy_setopt (curl, CURLOPT_POSTFIELDSIZE, (long) (zbody ? zlen : len));
   curl_easy_setopt (curl, CURLOPT_TIMEOUT_MS, (long) TRACE_POST_TIMEOUT_MS);
   curl_easy_setopt (curl, CURLOPT_NOSIGNAL, 1L);
   curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, discard_body);
   for (int attempt = 1;; attempt++) {
      curl_off_t after = 0;
      int64_t wait;

      status = 0;
      rc = curl_easy_perform (curl);
      if (rc == CURLE_OK)
         curl_easy_getinfo (curl, CURLINFO_RESPONSE_CODE, &status);
      if (rc != CURLE_OK || !retryable (status) || attempt >= TRACE_RETRY_MAX)
         break;
      counters_add (COUNTER_TRACE_EXPORT_FAILURES, 1);
      /* Retry-After (seconds or a date, which libcurl reads), bounded;
       * otherwise a random half to all of the doubling backoff. */
      if (curl_easy_getinfo (curl, CURLINFO_RETRY_AFTER, &after) == CURLE_OK && after > 0)
         wait = after * 1000 < TRACE_RETRY_AFTER_MAX_MS ? (int64_t) after * 1000 : TRACE_RETRY_AFTER_MAX_MS;
      else
         wait = backoff / 2 + (int64_t) (trace_rand () % (uint64_t) (backoff / 2 + 1));
      backoff = backoff * 2 < TRACE_BACKOFF_MAX_MS ? backoff * 2 : TRACE_BACKOFF_MAX_MS;
      log_debug ("trace: the collector answered %ld; sending %zu spans again in %" PRId64 " ms", status, n, wait);
      if (wait_or_stop (x, wait))
         break;
   }
   if (rc == CURLE_OK && status >= 200 && status < 300) {
      counters_add (COUNTER_TRACE_SPANS_EXPORTED, n);
   } else {
      counters_add (COUNTER_TRACE_SPANS_DROPPED, n);
      counters_add (COUNTER_TRACE_EXPORT_FAILURES, 1);
      if (rc != CURLE_OK)
         log_debug ("trace: %zu spans dropped: %s", n, curl_easy_strerror (rc));
      else
         log_debug ("trace: %zu spans dropped: the collector answered %ld", n, status);
   }
   bson_free (zbody);
   bson_free (body);
}

static void *
trace_thread (void *arg)
{
   trace_exporter_t *x = arg;
   trace_span_t *batch = bson_malloc (TRACE_BATCH_MAX * sizeof *batch);
   CURL *curl = curl_easy_init ();

   for (;;) {
      size_t n = 0;
      bool stop;

      pthread_mutex_lock (&x->mu);
      while (x->n == 0 && !x->stopping)
         pthread_cond_wait (&x->cv, &x->mu);
      /* Lingers a little for a fuller batch (not when stopping). */
      if (x->n < TRACE_BATCH_MAX && !x->stopping) {
         struct timespec until;
         clock_gettime (CLOCK_REALTIME, &until);
         until.tv_nsec += TRACE_LINGER_MS * 1000000L;
         until.tv_sec += until.tv_nsec / 1000000000L;
         until.tv_nsec %= 1000000000L;
         while (x->n < TRACE_BATCH_MAX && !x->stopping)
            if (pthread_cond_timedwait (&x->cv, &x->mu, &until) == ETIMEDOUT)
               break;
      }
      while (n < TRACE_BATCH_MAX && x->n > 0) {
         batch[n++] = x->ring[x->head];
         x->head = (x->head + 1) % TRACE_QUEUE_MAX;
         x->n--;
      }
      stop = x->stopping && x->n == 0;
      pthread_mutex_unlock (&x->mu);
      if (n > 0) {
         if (curl)
            post_batch (x, curl, batch, n);
         else
            counters_add (COUNTER_TRACE_SPANS_DROPPED, n);
      }
      if (stop)
         break;
   }
   curl_easy_cleanup (curl);
   bson_free (batch);
   return NULL;
}

bool
trace_parse_sample (const char *v, uint64_t *threshold)
{
   char *end = NULL;
   double r;

   if (!v || !*v || !strcmp (v, "never")) {
      *threshold = 0;
      return true;
   }
   if (!strcmp (v, "always")) {
      *threshold = UINT64_C (1) << 32;
      return true;
   }
   errno = 0;
   r = strtod (v, &end);
   if (errno || end == v || *end != '\0' || !(r >= 0.0 && r <= 1.0))
      return false;
   *threshold = (uint64_t) (r * 4294967296.0);
   return true;
}

/* ------------------------------------------------------------ settings */

/* Overwrites a string that held a credential before it is freed. */
static void
wipe (char *s)
{
   if (s)
      explicit_bzero (s, strlen (s));
}

/* `s[0..n)` with %XX decoded (W3C Baggage, as OTEL_RESOURCE_ATTRIBUTES and
 * OTEL_EXPORTER_OTLP_HEADERS write values) and spaces and tabs trimmed
 * around it; NULL for a bad %-escape. */
static char *
pct_decode (const char *s, size_t n)
{
   char *out, *o;

   while (n > 0 && (*s == ' ' || *s == '\t'))
      s++, n--;
   while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
      n--;
   out = o = bson_malloc (n + 1);
   for (size_t i = 0; i < n; i++) {
      int h, l;

      if (s[i] != '%') {
         *o++ = s[i];
         continue;
      }
      if (i + 2 >= n) {
         bson_free (out);
         return NULL;
      }
      h = hexval ((char) tolower ((unsigned char) s[i + 1]));
      l = hexval ((char) tolower ((unsigned char) s[i + 2]));
      if (h < 0 || l < 0) {
         bson_free (out);
         return NULL;
      }
      *o++ = (char) (h << 4 | l);
      i += 2;
   }
   *o = '\0';
   return out;
}

/* A pair list of OpenTelemetry's environment ("k1=v1,k2=v2", values
 * %-encoded) appended to keys/values, a later key replacing an earlier
 * one (case-insensitively when `fold`, as header names compare).  An item
 * that is not key=value, or whose key `name_ok` refuses, or whose value
 * holds a control character, is left out and logged by `var` and
 * position, never by its value (a header may be a credential). */
static void
env_pairs (const char *var, bool fold, bool (*name_ok) (const char *), char ***keys, char ***values, size_t *n)
{
   const char *p = getenv (var);
   size_t item = 0;

   while (p && *p) {
      const char *comma = strchr (p, ',');
      size_t len = comma ? (size_t) (comma - p) : strlen (p);
      const char *eq = memchr (p, '=', len);
      char *k = eq ? pct_decode (p, (size_t) (eq - p)) : NULL;
      char *v = eq ? pct_decode (eq + 1, len - (size_t) (eq - p) - 1) : NULL;
      bool ok = k && v && *k && (!name_ok || name_ok (k));
      size_t i;

      item++;
      for (const char *c = v; ok && *c; c++)
         ok = (unsigned char) *c >= 0x20 && *c != 0x7f;
      if (!ok) {
         if (len > 0)
            log_warn ("trace: %s: item %zu is not key=value with a valid key and %%-encoded value; left out", var, item);
         bson_free (k);
         bson_free (v);
      } else {
         for (i = 0; i < *n; i++)
            if (fold ? !strcasecmp ((*keys)[i], k) : !strcmp ((*keys)[i], k))
               break;
         if (i < *n) {
            bson_free ((*keys)[i]);
            bson_free ((*values)[i]);
         } else {
            *keys = bson_realloc (*keys, (*n + 1) * sizeof **keys);
            *values = bson_realloc (*values, (*n + 1) * sizeof **values);
            (*n)++;
         }
         (*keys)[i] = k;
         (*values)[i] = v;
      }
      p = comma ? comma + 1 : NULL;
   }
}

/* An HTTP header name: RFC 9110's token characters. */
static bool
header_name_ok (const char *name)
{
   for (const char *c = name; *c; c++)
      if (!isalnum ((unsigned char) *c) && !strchr ("!#$%&'*+-.^_`|~", *c))
         return false;
   return true;
}

/* Whether OpenTelemetry's environment may set anything: not when
 * OTEL_SDK_DISABLED is true, nor when OTEL_TRACES_EXPORTER names no otlp
 * exporter (none). */
static bool
env_allowed (void)
{
   const char *dis = getenv ("OTEL_SDK_DISABLED"), *exp = getenv ("OTEL_TRACES_EXPORTER");

   if (dis && !strcasecmp (dis, "true"))
      return false;
   return !exp || !*exp || strstr (exp, "otlp");
}

/* Writes `base` + `suffix` into url (TRACE_URL_MAX); false when too long. */
static bool
url_join (char *url, const char *base, const char *suffix)
{
   return (size_t) snprintf (url, TRACE_URL_MAX, "%s%s", base, suffix) < TRACE_URL_MAX;
}

bool
trace_settings_resolve (const trace_options_t *opts, trace_settings_t *out, bson_error_t *error)
{
   const char *e, *svc = opts->service_name;
   bool env = env_allowed ();
   char **ck = NULL, **cv = NULL;
   size_t cn;

   memset (out, 0, sizeof *out);
   /* Where: [tracing] otlp_endpoint (a base URL), else the traces
    * endpoint (as it is), else the base endpoint with v1/traces appended
    * (the OTLP exporter specification's rules). */
   e = opts->otlp_endpoint;
   if (e && *e) {
      size_t l = strlen (e);
      while (l > 0 && e[l - 1] == '/')
         l--;
      if (l + sizeof "/v1/traces" > TRACE_URL_MAX) {
         bson_set_error (error, TRACE_ERROR_DOMAIN, TRACE_ERR_CONFIG, "[tracing] otlp_endpoint is too long");
         return false;
      }
      snprintf (out->url, TRACE_URL_MAX, "%.*s/v1/traces", (int) l, e);
      out->url_from = "[tracing] otlp_endpoint";
   } else if (env && (e = getenv ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) && *e) {
      out->url_from = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
      if (!url_join (out->url, e, ""))
         out->url[0] = '\0';
   } else if (env && (e = getenv ("OTEL_EXPORTER_OTLP_ENDPOINT")) && *e) {
      out->url_from = "OTEL_EXPORTER_OTLP_ENDPOINT";
      if (!url_join (out->url, e, e[strlen (e) - 1] == '/' ? "v1/traces" : "/v1/traces"))
         out->url[0] = '\0';
   }
   if (out->url_from && strncmp (out->url, "http://", 7) != 0 && strncmp (out->url, "https://", 8) != 0) {
      log_warn ("trace: %s is not an http:// or https:// URL (or is too long): no spans are exported", out->url_from);
      out->url[0] = '\0';
   }
   /* Resource attributes: the environment's, then the configuration's
    * over them. */
   if (env)
      env_pairs ("OTEL_RESOURCE_ATTRIBUTES", false, NULL, &out->attr_keys, &out->attr_values, &out->n_attrs);
   cn = split_pairs (opts->resource_attributes, &ck, &cv);
   for (size_t i = 0; i < cn; i++) {
      size_t j;
      for (j = 0; j < out->n_attrs && strcmp (out->attr_keys[j], ck[i]) != 0; j++)
         ;
      if (j == out->n_attrs) {
         out->attr_keys = bson_realloc (out->attr_keys, (j + 1) * sizeof *out->attr_keys);
         out->attr_values = bson_realloc (out->attr_values, (j + 1) * sizeof *out->attr_values);
         out->n_attrs++;
      } else {
         bson_free (out->attr_keys[j]);
         bson_free (out->attr_values[j]);
      }
      out->attr_keys[j] = ck[i];
      out->attr_values[j] = cv[i];
   }
   bson_free (ck);
   bson_free (cv);
   /* service.name: [tracing] service_name, OTEL_SERVICE_NAME, a
    * service.name among the resource attributes, relaybus-proxy. */
   if (!svc || !*svc)
      svc = env ? getenv ("OTEL_SERVICE_NAME") : NULL;
   for (size_t i = 0; (!svc || !*svc) && i < out->n_attrs; i++)
      if (!strcmp (out->attr_keys[i], "service.name"))
         svc = out->attr_values[i];
   out->service_name = bson_strdup (svc && *svc ? svc : "relaybus-proxy");
   /* Headers of every export request (a collector's credentials). */
   if (env) {
      env_pairs ("OTEL_EXPORTER_OTLP_HEADERS", true, header_name_ok, &out->header_names, &out->header_values, &out->n_headers);
      env_pairs ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", true, header_name_ok, &out->header_names, &out->header_values,
                 &out->n_headers);
   }
   return true;
}

void
trace_settings_fini (trace_settings_t *s)
{
   strv_free (s->attr_keys, s->n_attrs);
   strv_free (s->attr_values, s->n_attrs);
   strv_free (s->header_names, s->n_headers);
   if (s->header_values)
      for (size_t i = 0; i < s->n_headers; i++)
         wipe (s->header_values[i]);
   strv_free (s->header_values, s->n_headers);
   bson_free (s->service_name);
   memset (s, 0, sizeof *s);
}

/* Frees an exporter whose thread is not running (never started, or
 * joined); NULL ok. */
static void
exporter_free (trace_exporter_t *x)
{
   if (!x)
      return;
   pthread_mutex_destroy (&x->mu);
   pthread_cond_destroy (&x->cv);
   bson_free (x->ring);
   bson_free (x->resource_json);
   curl_slist_free_all (x->headers);
   trace_settings_fini (&x->set);
   bson_free (x);
}

bool
trace_start (const trace_options_t *opts, bson_error_t *error)
{
   trace_exporter_t *x = NULL;
   uint64_t threshold;
   bool ok = false;

   if (!trace_parse_sample (opts->sample, &threshold)) {
      bson_set_error (error, TRACE_ERROR_DOMAIN, TRACE_ERR_CONFIG,
                      "[tracing] sample = '%.64s': never, always or a ratio from 0 to 1", opts->sample);
      goto done;
   }
   x = bson_malloc0 (sizeof *x);
   pthread_mutex_init (&x->mu, NULL);
   pthread_cond_init (&x->cv, NULL);
   if (!trace_settings_resolve (opts, &x->set, error))
      goto done;
   if (!x->set.url[0]) {
      ok = true; /* nowhere to export: nothing runs */
      goto done;
   }
   x->ring = bson_malloc (TRACE_QUEUE_MAX * sizeof *x->ring);
   x->resource_json = resource_json_build (x->set.service_name, x->set.attr_keys, x->set.attr_values, x->set.n_attrs);
   /* Content-Encoding first: post_batch leaves it out of a body it could
    * not compress. */
   x->headers = curl_slist_append (NULL, "Content-Encoding: gzip");
   x->headers = curl_slist_append (x->headers, "Content-Type: application/json");
   for (size_t i = 0; i < x->set.n_headers; i++) {
      char *h = bson_strdup_printf ("%s: %s", x->set.header_names[i], x->set.header_values[i]);
      x->headers = curl_slist_append (x->headers, h);
      wipe (h);
      bson_free (h);
   }
   if (pthread_create (&x->thread, NULL, trace_thread, x) != 0) {
      bson_set_error (error, TRACE_ERROR_DOMAIN, TRACE_ERR_START, "trace: cannot start the export thread");
      goto done;
   }
   exporter = x;
   x = NULL;
   atomic_store (&enabled, true);
   log_info ("trace: exporting spans to %s (from %s) as service %s, gzip, %zu header(s) of the environment", exporter->set.url,
             exporter->set.url_from, exporter->set.service_name, exporter->set.n_headers);
   ok = true;
done:
   if (ok)
      atomic_store (&sample_threshold, threshold);
   exporter_free (x);
   return ok;
}

void
trace_stop (void)
{
   trace_exporter_t *x = exporter;

   if (!x)
      return;
   pthread_mutex_lock (&x->mu);
   x->stopping = true;
   pthread_cond_signal (&x->cv);
   pthread_mutex_unlock (&x->mu);
   pthread_join (x->thread, NULL);
   atomic_store (&enabled, false);
   exporter = NULL;
   exporter_free (x);
}

bool
trace_enabled (void)
{
   return atomic_load (&enabled);
}
