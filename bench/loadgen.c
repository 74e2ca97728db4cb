/*
 * loadgen.c - a closed-loop MongoDB wire-protocol load generator.
 *
 * Opens N connections, sends one OP_MSG hello on each, and once all have
 * answered keeps every connection busy with exactly one request in flight
 * (ping or find): a reply is timed and the next request goes out from the
 * same callback.  Latency goes into a log-linear histogram (exact below
 * 256 ns, then 128 sub-buckets per power of two: under 0.8% error), so memory
 * does not grow with the run and percentiles need no sort.  Results are one
 * line of JSON on stdout (and a human summary with --human).
 *
 * The idle mode (--idle N --hold S) only opens N connections, says hello on
 * each, prints one JSON line when all are ready and holds them S seconds: the
 * benchmark measures a proxy's memory per idle connection with it.
 *
 * It is single-threaded on purpose: on the 2-core benchmark machine the proxy
 * under test gets the other core.  It checks what it reads (lengths, opcode,
 * responseTo) but not what the reply says: the stub's replies are fixed.
 *
 * Usage: loadgen --port P [--host H] [--connections N] [--duration S]
 *                [--warmup S] [--requests N] [--command ping|find] [--human]
 *        loadgen --port P --idle N [--hold S]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <bson/bson.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#define LG_HEADER_LEN 16
#define LG_MAX_MESSAGE_LEN 48000000
#define LG_OP_MSG 2013
/* Connects in progress at once: more only overflows the listener's backlog
 * and turns into SYN retransmits of a second or more. */
#define LG_CONNECT_CONCURRENCY 128
/* How long to wait for requests still in flight after the measurement. */
#define LG_DRAIN_SECONDS 2.0
/* A proxy that accepts but never answers hello must not hang the benchmark. */
#define LG_CONNECT_TIMEOUT 60.0

/* ---------------------------------------------------------------- histogram */

#define LG_HIST_SUB_BITS 7
#define LG_HIST_SUB (1u << LG_HIST_SUB_BITS)
#define LG_HIST_EXACT (2u * LG_HIST_SUB) /* values below this are exact */
#define LG_HIST_MAX_EXP 47                /* 2^47 ns = 39 hours */
#define LG_HIST_BUCKETS (LG_HIST_EXACT + (LG_HIST_MAX_EXP - LG_HIST_SUB_BITS) * LG_HIST_SUB)

typedef struct {
   uint64_t counts[LG_HIST_BUCKETS];
   uint64_t total;
   uint64_t min;
   uint64_t max;
   double sum;
} lg_hist_t;

static size_t
lg_hist_index (uint64_t v)
{
   if (v < LG_HIST_EXACT)
      return (size_t) v;
   unsigned e = 63u - (unsigned) __builtin_clzll (v); /* top bit, >= 8 */
   if (e >= LG_HIST_MAX_EXP)
      return LG_HIST_BUCKETS - 1;
   unsigned sub = (unsigned) (v >> (e - LG_HIST_SUB_BITS)) & (LG_HIST_SUB - 1);
   return LG_HIST_EXACT + (size_t) (e - LG_HIST_SUB_BITS - 1) * LG_HIST_SUB + sub;
}

/* The middle of bucket `i`: the value a percentile falling into it reports. */
static double
lg_hist_value (size_t i)
{
   if (i < LG_HIST_EXACT)
      return (double) i;
   size_t k = i - LG_HIST_EXACT;
   unsigned e = (unsigned) (k / LG_HIST_SUB) + LG_HIST_SUB_BITS + 1;
   uint64_t sub = k % LG_HIST_SUB;
   uint64_t width = 1ull << (e - LG_HIST_SUB_BITS);
   uint64_t low = (LG_HIST_SUB + sub) * width;
   return (double) low + (double) width / 2.0;
}

static void
lg_hist_record (lg_hist_t *h, uint64_t v)
{
   h->counts[lg_hist_index (v)]++;
   if (h->total == 0 || v < h->min)
      h->min = v;
   if (v > h->max)
      h->max = v;
   h->total++;
   h->sum += (double) v;
}

/* The value at quantile q (0 < q <= 1), clamped to the observed range. */
static double
lg_hist_quantile (const lg_hist_t *h, double q)
{
   if (h->total == 0)
      return 0.0;
   uint64_t rank = (uint64_t) ceil (q * (double) h->total);
   if (rank < 1)
      rank = 1;
   uint64_t seen = 0;
   for (size_t i = 0; i < LG_HIST_BUCKETS; i++) {
      seen += h->counts[i];
      if (seen >= rank) {
         double v = lg_hist_value (i);
         if (v > (double) h->max)
            v = (double) h->max;
         if (v < (double) h->min)
            v = (double) h->min;
         return v;
      }
   }
   return (double) h->max;
}

/* ---------------------------------------------------------------- state */

typedef enum {
   LG_PHASE_CONNECTING, /* opening connections, saying hello */
   LG_PHASE_WARMUP,     /* load on, nothing recorded */
   LG_PHASE_MEASURE,    /* load on, latencies recorded */
   LG_PHASE_DRAIN,      /* no new requests, waiting for the last replies */
   LG_PHASE_HOLD,       /* idle mode: connections open, nothing sent */
} lg_phase_t;

typedef enum {
   LG_CONN_CONNECTING,
   LG_CONN_HELLO,   /* hello sent, waiting for its reply */
   LG_CONN_READY,   /* hello answered; idle or between requests */
   LG_CONN_BUSY,    /* one request in flight */
   LG_CONN_CLOSED,
} lg_conn_state_t;

typedef struct lg lg_t;

/* One client connection.  Owned by lg_t's array; the bufferevent is freed by
 * lg_conn_close or at exit. */
typedef struct {
   lg_t *lg;
   struct bufferevent *bev;
   lg_conn_state_t state;
   int32_t request_id; /* of the message in flight */
   uint64_t sent_ns;
} lg_conn_t;

struct lg {
   /* options */
   struct sockaddr_in addr;
   const char *host;
   int port;
   int connections;
   double duration;
   double warmup;
   uint64_t request_limit; /* 0 = run for --duration */
   const char *command;
   bool human;
   int idle;               /* > 0: idle mode with this many connections */
   double hold;

   struct event_base *base;
   lg_conn_t *conns;
   int nconns;
   int next_to_connect;
   int connecting; /* connects or hellos in progress */
   int ready;
   int failed;
   int busy;
   lg_phase_t phase;
   int32_t next_request_id;

   /* The request, encoded once; only requestID is patched per send. */
   uint8_t *request;
   size_t request_len;
   uint8_t *hello;
   size_t hello_len;

   uint64_t t_start_ns;    /* first connect */
   uint64_t t_ready_ns;    /* all hellos answered */
   uint64_t t_measure_ns;  /* measurement began */
   uint64_t t_end_ns;      /* measurement ended */
   uint64_t requests_total; /* answered, warm-up included */
   uint64_t errors;
   lg_hist_t hist;
   struct event *timer;
   const char *first_error;
};

static uint64_t
lg_now_ns (void)
{
   struct timespec ts;
   clock_gettime (CLOCK_MONOTONIC, &ts);
   return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static void
lg_put_le32 (uint8_t *p, int32_t v)
{
   uint32_t u = (uint32_t) v;
   p[0] = (uint8_t) u;
   p[1] = (uint8_t) (u >> 8);
   p[2] = (uint8_t) (u >> 16);
   p[3] = (uint8_t) (u >> 24);
}

static int32_t
lg_get_le32 (const uint8_t *p)
{
   return (int32_t) ((uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
                     (uint32_t) p[3] << 24);
}

/* An OP_MSG with flags 0 and one kind-0 section holding `doc`. */
static uint8_t *
lg_encode_msg (const bson_t *doc, size_t *len)
{
   *len = LG_HEADER_LEN + 4 + 1 + doc->len;
   uint8_t *msg = calloc (1, *len);
   if (!msg) {
      perror ("loadgen: calloc");
      exit (1);
   }
   lg_put_le32 (msg, (int32_t) *len);
   lg_put_le32 (msg + 12, LG_OP_MSG);
   msg[LG_HEADER_LEN + 4] = 0;
   memcpy (msg + LG_HEADER_LEN + 5, bson_get_data (doc), doc->len);
   return msg;
}

static void
lg_encode_requests (lg_t *lg)
{
   bson_t doc, filter;

   bson_init (&doc);
   BSON_APPEND_INT32 (&doc, "hello", 1);
   BSON_APPEND_UTF8 (&doc, "$db", "admin");
   lg->hello = lg_encode_msg (&doc, &lg->hello_len);
   bson_destroy (&doc);

   bson_init (&doc);
   if (strcmp (lg->command, "find") == 0) {
      /* What a driver sends for a point-ish read, minus the session fields. */
      BSON_APPEND_UTF8 (&doc, "find", "items");
      BSON_APPEND_DOCUMENT_BEGIN (&doc, "filter", &filter);
      BSON_APPEND_UTF8 (&filter, "name", "benchmark");
      bson_append_document_end (&doc, &filter);
      BSON_APPEND_INT32 (&doc, "limit", 10);
      BSON_APPEND_UTF8 (&doc, "$db", "bench");
   } else {
      BSON_APPEND_INT32 (&doc, "ping", 1);
      BSON_APPEND_UTF8 (&doc, "$db", "admin");
   }
   lg->request = lg_encode_msg (&doc, &lg->request_len);
   bson_destroy (&doc);
}

static void lg_connect_more (lg_t *lg);
static void lg_maybe_finish (lg_t *lg);

static void
lg_fail (lg_t *lg, const char *why)
{
   lg->errors++;
   if (!lg->first_error)
      lg->first_error = why;
}

/* Every way a connection ends goes through here. */
static void
lg_conn_close (lg_conn_t *conn, const char *why)
{
   lg_t *lg = conn->lg;

   if (conn->state == LG_CONN_CLOSED)
      return;
   if (why)
      lg_fail (lg, why);
   switch (conn->state) {
   case LG_CONN_CONNECTING:
   case LG_CONN_HELLO:
      lg->connecting--;
      lg->failed++;
      break;
   case LG_CONN_BUSY:
      lg->busy--;
      /* fall through */
   case LG_CONN_READY:
      lg->ready--;
      break;
   case LG_CONN_CLOSED:
      break;
   }
   conn->state = LG_CONN_CLOSED;
   if (conn->bev) {
      bufferevent_free (conn->bev);
      conn->bev = NULL;
   }
   if (lg->phase == LG_PHASE_CONNECTING)
      lg_connect_more (lg);
   else
      lg_maybe_finish (lg);
}

static void
lg_send (lg_conn_t *conn, const uint8_t *tmpl, size_t len)
{
   lg_t *lg = conn->lg;

   conn->request_id = lg->next_request_id++;
   if (lg->next_request_id <= 0)
      lg->next_request_id = 1;
   /* Patched in the shared template: evbuffer_add copies it right away. */
   lg_put_le32 ((uint8_t *) tmpl + 4, conn->request_id);
   conn->sent_ns = lg_now_ns ();
   evbuffer_add (bufferevent_get_output (conn->bev), tmpl, len);
}

static void
lg_send_request (lg_conn_t *conn)
{
   conn->state = LG_CONN_BUSY;
   conn->lg->busy++;
   lg_send (conn, conn->lg->request, conn->lg->request_len);
}

static void
lg_emit_result (lg_t *lg)
{
   double elapsed = (double) (lg->t_end_ns - lg->t_measure_ns) / 1e9;
   double rps = elapsed > 0 ? (double) lg->hist.total / elapsed : 0.0;
   const lg_hist_t *h = &lg->hist;
   double mean = h->total ? h->sum / (double) h->total : 0.0;

   printf ("{\"target\":\"%s:%d\",\"command\":\"%s\",\"connections\":%d,"
           "\"connected\":%d,\"warmup_s\":%.3f,\"duration_s\":%.3f,"
           "\"requests\":%llu,\"requests_total\":%llu,\"throughput_rps\":%.1f,"
           "\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,"
           "\"min_us\":%.2f,\"max_us\":%.2f,\"mean_us\":%.2f,\"errors\":%llu}\n",
           lg->host, lg->port, lg->command, lg->connections, lg->nconns - lg->failed,
           lg->warmup, elapsed, (unsigned long long) h->total,
           (unsigned long long) lg->requests_total, rps,
           lg_hist_quantile (h, 0.50) / 1e3, lg_hist_quantile (h, 0.90) / 1e3,
           lg_hist_quantile (h, 0.99) / 1e3, lg_hist_quantile (h, 0.999) / 1e3,
           (double) h->min / 1e3, (double) h->max / 1e3, mean / 1e3,
           (unsigned long long) lg->errors);
   if (lg->human) {
      fprintf (stdout,
               "%s:%d %s x%d: %.0f req/s over %.2f s (%llu requests)\n"
               "  latency us: p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n"
               "  errors: %llu%s%s\n",
               lg->host, lg->port, lg->command, lg->connections, rps, elapsed,
               (unsigned long long) h->total, lg_hist_quantile (h, 0.50) / 1e3,
               lg_hist_quantile (h, 0.90) / 1e3, lg_hist_quantile (h, 0.99) / 1e3,
               lg_hist_quantile (h, 0.999) / 1e3, (double) h->max / 1e3,
               (unsigned long long) lg->errors, lg->first_error ? " - first: " : "",
               lg->first_error ? lg->first_error : "");
   }
   fflush (stdout);
}

static void
lg_end_measure (lg_t *lg)
{
   if (lg->phase != LG_PHASE_MEASURE && lg->phase != LG_PHASE_WARMUP)
      return;
   lg->t_end_ns = lg_now_ns ();
   if (lg->phase == LG_PHASE_WARMUP)
      lg->t_measure_ns = lg->t_end_ns;
   lg->phase = LG_PHASE_DRAIN;
   struct timeval tv = {(time_t) LG_DRAIN_SECONDS, 0};
   evtimer_add (lg->timer, &tv);
   lg_maybe_finish (lg);
}

/* Ends the loop once nothing is in flight any more (or nothing is left). */
static void
lg_maybe_finish (lg_t *lg)
{
   if (lg->phase == LG_PHASE_DRAIN && lg->busy == 0)
      event_base_loopbreak (lg->base);
   else if ((lg->phase == LG_PHASE_WARMUP || lg->phase == LG_PHASE_MEASURE) && lg->ready == 0)
      lg_end_measure (lg);
   else if (lg->phase == LG_PHASE_HOLD && lg->ready == 0)
      event_base_loopbreak (lg->base);
}

static void
lg_timer_cb (evutil_socket_t fd, short what, void *ctx)
{
   lg_t *lg = ctx;

   switch (lg->phase) {
   case LG_PHASE_WARMUP: {
      lg->phase = LG_PHASE_MEASURE;
      lg->t_measure_ns = lg_now_ns ();
      if (lg->request_limit == 0) {
         struct timeval tv = {(time_t) lg->duration,
                              (suseconds_t) ((lg->duration - (double) (time_t) lg->duration) * 1e6)};
         evtimer_add (lg->timer, &tv);
      }
      break;
   }
   case LG_PHASE_MEASURE:
      lg_end_measure (lg);
      break;
   case LG_PHASE_CONNECTING:
      lg_fail (lg, "timed out opening connections and saying hello");
      fprintf (stderr, "loadgen: %d of %d connections not ready after %.0f s\n",
               lg->connecting + lg->nconns - lg->next_to_connect, lg->nconns,
               LG_CONNECT_TIMEOUT);
      event_base_loopbreak (lg->base);
      break;
   case LG_PHASE_DRAIN:
   case LG_PHASE_HOLD:
      event_base_loopbreak (lg->base);
      break;
   }
}

static void
lg_timer_after (lg_t *lg, double seconds)
{
   struct timeval tv = {(time_t) seconds,
                        (suseconds_t) ((seconds - (double) (time_t) seconds) * 1e6)};
   evtimer_add (lg->timer, &tv);
}

/* All hellos answered (or failed): start the load, or hold in idle mode. */
static void
lg_all_ready (lg_t *lg)
{
   lg->t_ready_ns = lg_now_ns ();
   evtimer_del (lg->timer); /* the connect timeout */
   if (lg->ready == 0) {
      fprintf (stderr, "loadgen: no connection to %s:%d got through: %s\n", lg->host,
               lg->port, lg->first_error ? lg->first_error : "unknown error");
      event_base_loopbreak (lg->base);
      return;
   }
   if (lg->idle > 0) {
      lg->phase = LG_PHASE_HOLD;
      printf ("{\"mode\":\"idle\",\"target\":\"%s:%d\",\"connections\":%d,\"ready\":%d,"
              "\"failed\":%d,\"connect_s\":%.3f,\"hold_s\":%.1f}\n",
              lg->host, lg->port, lg->idle, lg->ready, lg->failed,
              (double) (lg->t_ready_ns - lg->t_start_ns) / 1e9, lg->hold);
      fflush (stdout);
      lg_timer_after (lg, lg->hold);
      return;
   }
   if (lg->warmup > 0) {
      lg->phase = LG_PHASE_WARMUP;
      lg_timer_after (lg, lg->warmup);
   } else {
      lg->phase = LG_PHASE_WARMUP;
      lg_timer_cb (-1, 0, lg); /* straight to MEASURE */
   }
   for (int i = 0; i < lg->nconns; i++)
      if (lg->conns[i].state == LG_CONN_READY)
         lg_send_request (&lg->conns[i]);
}

/* One whole reply for `conn`: time it and send the next request. */
static void
lg_on_reply (lg_conn_t *conn, uint64_t now)
{
   lg_t *lg = conn->lg;

   if (conn->state == LG_CONN_HELLO) {
      conn->state = LG_CONN_READY;
      lg->connecting--;
      lg->ready++;
      lg_connect_more (lg);
      return;
   }
   conn->state = LG_CONN_READY;
   lg->busy--;
   lg->requests_total++;
   if (lg->phase == LG_PHASE_MEASURE) {
      lg_hist_record (&lg->hist, now - conn->sent_ns);
      if (lg->request_limit && lg->hist.total >= lg->request_limit) {
         lg_end_measure (lg);
         return;
      }
   }
   if (lg->phase == LG_PHASE_WARMUP || lg->phase == LG_PHASE_MEASURE)
      lg_send_request (conn);
   else
      lg_maybe_finish (lg);
}

static void
lg_read_cb (struct bufferevent *bev, void *ctx)
{
   lg_conn_t *conn = ctx;
   struct evbuffer *in = bufferevent_get_input (bev);
   uint8_t header[LG_HEADER_LEN];
   uint64_t now = lg_now_ns ();

   while (conn->state != LG_CONN_CLOSED) {
      size_t have = evbuffer_get_length (in);
      if (have < LG_HEADER_LEN)
         return;
      evbuffer_copyout (in, header, LG_HEADER_LEN);
      int32_t len = lg_get_le32 (header);
      if (len < LG_HEADER_LEN || len > LG_MAX_MESSAGE_LEN) {
         lg_conn_close (conn, "reply with a bad messageLength");
         return;
      }
      if (have < (size_t) len)
         return;
      if (conn->state != LG_CONN_HELLO && conn->state != LG_CONN_BUSY) {
         lg_conn_close (conn, "reply without a request");
         return;
      }
      if (lg_get_le32 (header + 8) != conn->request_id) {
         lg_conn_close (conn, "reply with a wrong responseTo");
         return;
      }
      if (lg_get_le32 (header + 12) != LG_OP_MSG) {
         lg_conn_close (conn, "reply is not OP_MSG");
         return;
      }
      evbuffer_drain (in, (size_t) len);
      lg_on_reply (conn, now);
   }
}

static void
lg_event_cb (struct bufferevent *bev, short what, void *ctx)
{
   lg_conn_t *conn = ctx;

   if (what & BEV_EVENT_CONNECTED) {
      int one = 1;
      setsockopt (bufferevent_getfd (bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      conn->state = LG_CONN_HELLO;
      lg_send (conn, conn->lg->hello, conn->lg->hello_len);
      return;
   }
   if (what & BEV_EVENT_EOF)
      lg_conn_close (conn, "connection closed by peer");
   else if (what & BEV_EVENT_ERROR)
      lg_conn_close (conn, conn->state == LG_CONN_CONNECTING ? "connect failed"
                                                             : "connection error");
}

/* Keeps up to LG_CONNECT_CONCURRENCY connects and hellos in progress. */
static void
lg_connect_more (lg_t *lg)
{
   while (lg->next_to_connect < lg->nconns && lg->connecting < LG_CONNECT_CONCURRENCY) {
      lg_conn_t *conn = &lg->conns[lg->next_to_connect++];
      conn->lg = lg;
      conn->state = LG_CONN_CONNECTING;
      lg->connecting++;
      conn->bev = bufferevent_socket_new (lg->base, -1, BEV_OPT_CLOSE_ON_FREE);
      if (!conn->bev) {
         lg_conn_close (conn, "bufferevent_socket_new failed");
         return; /* lg_conn_close re-entered lg_connect_more */
      }
      bufferevent_setcb (conn->bev, lg_read_cb, NULL, lg_event_cb, conn);
      bufferevent_enable (conn->bev, EV_READ | EV_WRITE);
      if (bufferevent_socket_connect (conn->bev, (struct sockaddr *) &lg->addr,
                                      sizeof lg->addr) != 0) {
         lg_conn_close (conn, errno == EMFILE ? "out of file descriptors" : "connect failed");
         return;
      }
   }
   if (lg->phase == LG_PHASE_CONNECTING && lg->next_to_connect == lg->nconns &&
       lg->connecting == 0)
      lg_all_ready (lg);
}

static void
lg_signal_cb (evutil_socket_t sig, short what, void *ctx)
{
   lg_t *lg = ctx;
   if (lg->phase == LG_PHASE_WARMUP || lg->phase == LG_PHASE_MEASURE)
      lg_end_measure (lg);
   else
      event_base_loopbreak (lg->base);
}

static void
lg_raise_fd_limit (int needed)
{
   struct rlimit rl;
   if (getrlimit (RLIMIT_NOFILE, &rl) != 0)
      return;
   if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      (void) setrlimit (RLIMIT_NOFILE, &rl);
   }
   if (rl.rlim_cur != RLIM_INFINITY && (rlim_t) needed + 16 > rl.rlim_cur)
      fprintf (stderr, "loadgen: warning: %d connections need more than the %llu file "
                       "descriptors allowed (ulimit -n)\n",
               needed, (unsigned long long) rl.rlim_cur);
}

static void
lg_usage (FILE *f)
{
   fprintf (f,
            "usage: loadgen --port P [options]\n"
            "  --host ADDR        IPv4 address (default 127.0.0.1)\n"
            "  --port P           port (required)\n"
            "  --connections N    connections, one request in flight each (default 16)\n"
            "  --duration S       measured seconds (default 10)\n"
            "  --warmup S         unrecorded seconds before measuring (default 1)\n"
            "  --requests N       measure N requests instead of a duration\n"
            "  --command C        ping or find (default ping)\n"
            "  --human            also print a human-readable summary\n"
            "  --idle N           idle mode: open N connections, hello, hold, exit\n"
            "  --hold S           seconds to hold idle connections (default 30)\n");
}

static bool
lg_parse_seconds (const char *s, double *out)
{
   char *end;
   double v = strtod (s, &end);
   if (end == s || *end || !(v >= 0) || v > 86400)
      return false;
   *out = v;
   return true;
}

int
main (int argc, char **argv)
{
   static const struct option options[] = {
      {"host", required_argument, NULL, 'H'},
      {"port", required_argument, NULL, 'p'},
      {"connections", required_argument, NULL, 'c'},
      {"duration", required_argument, NULL, 'd'},
      {"warmup", required_argument, NULL, 'w'},
      {"requests", required_argument, NULL, 'n'},
      {"command", required_argument, NULL, 'C'},
      {"human", no_argument, NULL, 'h'},
      {"idle", required_argument, NULL, 'i'},
      {"hold", required_argument, NULL, 'o'},
      {"help", no_argument, NULL, '?'},
      {NULL, 0, NULL, 0},
   };
   static lg_t lg; /* static: the histogram is ~43 KiB */
   int c;

   lg.host = "127.0.0.1";
   lg.connections = 16;
   lg.duration = 10.0;
   lg.warmup = 1.0;
   lg.command = "ping";
   lg.hold = 30.0;
   lg.next_request_id = 1;

   while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
      switch (c) {
      case 'H':
         lg.host = optarg;
         break;
      case 'p':
         lg.port = atoi (optarg);
         break;
      case 'c':
         lg.connections = atoi (optarg);
         break;
      case 'd':
         if (!lg_parse_seconds (optarg, &lg.duration))
            goto bad;
         break;
      case 'w':
         if (!lg_parse_seconds (optarg, &lg.warmup))
            goto bad;
         break;
      case 'n':
         lg.request_limit = strtoull (optarg, NULL, 10);
         break;
      case 'C':
         lg.command = optarg;
         break;
      case 'h':
         lg.human = true;
         break;
      case 'i':
         lg.idle = atoi (optarg);
         break;
      case 'o':
         if (!lg_parse_seconds (optarg, &lg.hold))
            goto bad;
         break;
      case '?':
      default:
         if (c == '?' && optopt == 0 && strcmp (argv[optind - 1], "--help") == 0) {
            lg_usage (stdout);
            return 0;
         }
         goto bad;
      }
   }
   if (optind != argc || lg.port <= 0 || lg.port > 65535 || lg.connections <= 0 ||
       lg.idle < 0 || (strcmp (lg.command, "ping") != 0 && strcmp (lg.command, "find") != 0))
      goto bad;

   memset (&lg.addr, 0, sizeof lg.addr);
   lg.addr.sin_family = AF_INET;
   lg.addr.sin_port = htons ((uint16_t) lg.port);
   if (inet_pton (AF_INET, lg.host, &lg.addr.sin_addr) != 1) {
      fprintf (stderr, "loadgen: --host must be an IPv4 address: %s\n", lg.host);
      return 2;
   }

   signal (SIGPIPE, SIG_IGN);
   lg.nconns = lg.idle > 0 ? lg.idle : lg.connections;
   lg_raise_fd_limit (lg.nconns);
   lg.conns = calloc ((size_t) lg.nconns, sizeof *lg.conns);
   lg.base = event_base_new ();
   if (!lg.conns || !lg.base) {
      fprintf (stderr, "loadgen: out of memory\n");
      return 1;
   }
   lg.timer = evtimer_new (lg.base, lg_timer_cb, &lg);
   struct event *sigint = evsignal_new (lg.base, SIGINT, lg_signal_cb, &lg);
   struct event *sigterm = evsignal_new (lg.base, SIGTERM, lg_signal_cb, &lg);
   event_add (sigint, NULL);
   event_add (sigterm, NULL);
   lg_encode_requests (&lg);

   lg.phase = LG_PHASE_CONNECTING;
   lg.t_start_ns = lg_now_ns ();
   lg_timer_after (&lg, LG_CONNECT_TIMEOUT);
   lg_connect_more (&lg);
   event_base_dispatch (lg.base);

   int rc = 0;
   if (lg.idle > 0) {
      if (lg.phase != LG_PHASE_HOLD)
         rc = 1;
   } else if (lg.phase == LG_PHASE_DRAIN) {
      lg_emit_result (&lg);
      if (lg.hist.total == 0)
         rc = 1;
   } else {
      rc = 1;
   }
   if (lg.first_error)
      fprintf (stderr, "loadgen: %llu errors, first: %s\n", (unsigned long long) lg.errors,
               lg.first_error);

   for (int i = 0; i < lg.nconns; i++)
      if (lg.conns[i].bev)
         bufferevent_free (lg.conns[i].bev);
   event_free (sigint);
   event_free (sigterm);
   event_free (lg.timer);
   event_base_free (lg.base);
   free (lg.conns);
   free (lg.request);
   free (lg.hello);
   return rc;

bad:
   lg_usage (stderr);
   return 2;
}
