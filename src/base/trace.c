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
 * both counted.  What it does not do: retry, persist, or sample (the
 * callers decide which spans exist).
 */
#include "base/trace.h"
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <curl/curl.h>

#include "base/counters.h"
#include "base/log.h"

#define TRACE_LINGER_MS 200        /* longest a span waits for its batch to fill */
#define TRACE_POST_TIMEOUT_MS 5000 /* one POST, connection included */
#define TRACE_URL_MAX 1024

/* The exporter: one per process, made by trace_start, freed by trace_stop. */
typedef struct {
   pthread_mutex_t mu;
   pthread_cond_t cv;
   trace_span_t *ring; /* TRACE_QUEUE_MAX, owned */
   size_t head, n;     /* under mu */
   bool stopping;      /* under mu */
   pthread_t thread;
   char url[TRACE_URL_MAX];
   char *service_name;        /* owned */
   char *resource_attributes; /* owned; may be "" */
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

/* resource_attributes: "k=v,k=v" (config's normalised list). */
static void
append_resource_attributes (bson_string_t *out, const char *list)
{
   const char *p = list;

   while (p && *p) {
      const char *comma = strchr (p, ',');
      size_t len = comma ? (size_t) (comma - p) : strlen (p);
      char *item = bson_strndup (p, len);
      char *eq = strchr (item, '=');

      if (eq) {
         *eq = '\0';
         bson_string_append (out, ",");
         append_kv_string (out, item, eq + 1);
      }
      bson_free (item);
      p = comma ? comma + 1 : NULL;
   }
}

char *
trace_encode_otlp_json (const trace_span_t *spans, size_t n, const char *service_name, const char *resource_attributes, size_t *len)
{
   bson_string_t *out = bson_string_new ("{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
   char hex[33];

   append_kv_string (out, "service.name", service_name && *service_name ? service_name : "relaybus-proxy");
   append_resource_attributes (out, resource_attributes);
   bson_string_append (out, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"relaybus-proxy\",\"version\":\"" PACKAGE_VERSION "\"},\"spans\":[");
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

/* One POST of `n` spans; counts them exported or dropped. */
static void
post_batch (trace_exporter_t *x, CURL *curl, const trace_span_t *batch, size_t n)
{
   size_t len = 0;
   char *body = trace_encode_otlp_json (batch, n, x->service_name, x->resource_attributes, &len);
   struct curl_slist *hdrs = curl_slist_append (NULL, "Content-Type: application/json");
   long status = 0;
   CURLcode rc;

   curl_easy_setopt (curl, CURLOPT_URL, x->url);
   curl_easy_setopt (curl, CURLOPT_HTTPHEADER, hdrs);
   curl_easy_setopt (curl, CURLOPT_POSTFIELDS, body);
   curl_easy_setopt (curl, CURLOPT_POSTFIELDSIZE, (long) len);
   curl_easy_setopt (curl, CURLOPT_TIMEOUT_MS, (long) TRACE_POST_TIMEOUT_MS);
   curl_easy_setopt (curl, CURLOPT_NOSIGNAL, 1L);
   curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, discard_body);
   rc = curl_easy_perform (curl);
   if (rc == CURLE_OK)
      curl_easy_getinfo (curl, CURLINFO_RESPONSE_CODE, &status);
   if (rc == CURLE_OK && status >= 200 && status < 300) {
      counters_add (COUNTER_TRACE_SPANS_EXPORTED, n);
   } else {
      counters_add (COUNTER_TRACE_SPANS_DROPPED, n);
      counters_add (COUNTER_TRACE_EXPORT_FAILURES, 1);
      log_debug ("trace: %zu spans dropped: %s", n, rc != CURLE_OK ? curl_easy_strerror (rc) : "collector answered non-2xx");
   }
   curl_slist_free_all (hdrs);
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
   bson_free (x->service_name);
   bson_free (x->resource_attributes);
   bson_free (x);
}

bool
trace_start (const config_t *cfg, bson_error_t *error)
{
   trace_exporter_t *x = NULL;
   uint64_t threshold;
   bool ok = false;

   if (!trace_parse_sample (cfg->tracing_sample, &threshold)) {
      bson_set_error (error, TRACE_ERROR_DOMAIN, TRACE_ERR_CONFIG,
                      "[tracing] sample = '%.64s': never, always or a ratio from 0 to 1", cfg->tracing_sample);
      goto done;
   }
   if (!cfg->tracing_otlp_endpoint || !*cfg->tracing_otlp_endpoint) {
      ok = true;
      goto done;
   }
   x = bson_malloc0 (sizeof *x);
   pthread_mutex_init (&x->mu, NULL);
   pthread_cond_init (&x->cv, NULL);
   x->ring = bson_malloc (TRACE_QUEUE_MAX * sizeof *x->ring);
   {
      /* The endpoint is the collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT. */
      const char *e = cfg->tracing_otlp_endpoint;
      size_t l = strlen (e);
      while (l > 0 && e[l - 1] == '/')
         l--;
      if (l + sizeof "/v1/traces" > sizeof x->url) {
         bson_set_error (error, TRACE_ERROR_DOMAIN, TRACE_ERR_CONFIG, "[tracing] otlp_endpoint is too long");
         goto done;
      }
      snprintf (x->url, sizeof x->url, "%.*s/v1/traces", (int) l, e);
   }
   x->service_name = bson_strdup (cfg->tracing_service_name ? cfg->tracing_service_name : "relaybus-proxy");
   x->resource_attributes = bson_strdup (cfg->tracing_resource_attributes ? cfg->tracing_resource_attributes : "");
   if (pthread_create (&x->thread, NULL, trace_thread, x) != 0) {
      bson_set_error (error, TRACE_ERROR_DOMAIN, TRACE_ERR_START, "trace: cannot start the export thread");
      goto done;
   }
   exporter = x;
   x = NULL;
   atomic_store (&enabled, true);
   log_info ("trace: exporting spans to %s", exporter->url);
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
