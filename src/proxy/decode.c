/*
 * proxy/decode.c - a client's request decoded: decompressed when it came
 * compressed, and parsed (decode_request, pure); and the loop's decoding
 * thread, which does it off the loop for a big request.  What a decoded
 * request becomes is proxy/pump.c's; while a request of a connection is
 * being decoded the connection is not read (proxy/conn.c's read gate).
 */
#include "proxy/decode.h"

#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "autoconf.h"
#include "base/assert.h"
#include "base/counters.h"
#include "base/loopwake.h"
#include "proxy/conn_private.h"

/* Decompresses (into `plain`, when the request is OP_COMPRESSED) and parses
 * one complete request of h.length bytes at the front of `in`.  Pure: it
 * reads no connection state and logs nothing, so the decoding thread runs
 * it as well as the loop.  Each step is linear in the message's size (the
 * compressor's output is capped by the announced size, checked first).
 * On failure `error` says why; every failure is the client's.
 *
 * With `copy`, a plain request is parsed from a copy (*copy, to free with
 * bson_free once the parsed structs are no longer used) rather than made
 * contiguous in place: its bytes then travel on in the chains they were
 * read into, each freed as soon as it is written, instead of as one block
 * that stays resident until its last byte is out. */
bool
decode_request (
   struct evbuffer *in, wire_header_t h, struct evbuffer *plain, uint8_t **copy, decoded_t *d, bson_error_t *error)
{
   const uint8_t *buf;

   d->src = in;
   d->len = (size_t) h.length;
   d->h = h;
   d->compressor = -1;
   if (h.opcode == WIRE_OP_COMPRESSED) {
      wire_compressed_t cm;
      uint8_t hb[WIRE_HEADER_LEN];

      buf = evbuffer_pullup (in, (ssize_t) d->len);
      if (!buf || !wire_parse_compressed (buf, d->len, &cm, error))
         return false;
      evbuffer_drain (plain, evbuffer_get_length (plain));
      if (!wire_decompress (&cm, WIRE_MAX_MESSAGE_LEN, plain, error))
         return false;
      d->compressor = cm.compressor_id > 0 ? cm.compressor_id : -1;
      evbuffer_drain (in, d->len);
      d->src = plain;
      d->len = evbuffer_get_length (plain);
      if (evbuffer_copyout (plain, hb, sizeof hb) != (ssize_t) sizeof hb || !wire_peek_header (hb, sizeof hb, &d->h) ||
          (size_t) d->h.length != d->len) {
         bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REQUEST, "decompressed message has a bad header");
         return false;
      }
   }
   if (copy && d->src == in) {
      *copy = bson_malloc (d->len);
      if (evbuffer_copyout (in, *copy, d->len) != (ssize_t) d->len) {
         bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "cannot copy a %zu-byte request", d->len);
         return false;
      }
      buf = *copy;
   } else {
      buf = evbuffer_pullup (d->src, (ssize_t) d->len);
   }
   if (!buf) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory for a %zu-byte request", d->len);
      return false;
   }
   if (d->h.opcode == WIRE_OP_MSG)
      return wire_parse_msg (buf, d->len, &d->msg, error);
   if (d->h.opcode == WIRE_OP_QUERY)
      return wire_parse_query (buf, d->len, &d->q, error);
   bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REQUEST, "clients may not send %s", wire_opcode_name (d->h.opcode));
   return false;
}

/* ------------------------------------------------------------ offload */

/*
 * Requests whose decoding touches at least CLIENT_OFFLOAD_MIN bytes (their
 * length, or for OP_COMPRESSED the announced uncompressed size) are
 * decompressed and validated by the loop's decoding thread, so that one big
 * or hostile message (16 MiB of tiny elements decompressed from a few KB)
 * never holds up the other connections: the loop only moves the message's
 * chains into the job and back.  Meanwhile the connection neither reads nor
 * routes (its requests keep their order); everything else flows.
 *
 * Ownership: a job is owned by the decoding thread from client_job_submit until it
 * is on the done list, then by the loop.  `c` is read and written on the
 * loop only: client_job_cancel clears it when the connection closes first,
 * and the finished job is then just freed.  The evbuffers are touched by
 * one thread at a time, the mutex ordering the hand-overs.
 */
struct client_job {
   client_job_t *next;
   client_conn_t *c;      /* loop only; NULL once the connection closed */
   bool finished;         /* loop only: back from the decoding thread */
   wire_header_t h;       /* as received */
   struct evbuffer *raw;  /* the message as received */
   struct evbuffer *plain; /* its decompressed form */
   uint8_t *copy;         /* what a plain request was parsed from */
   bool ok;               /* the decoding thread's result */
   bson_error_t error;
   decoded_t d;
};

struct client_decoder {
   pthread_t thread;
   pthread_mutex_t mu;
   pthread_cond_t cv;
   client_job_t *pending, **pending_tail; /* under mu */
   client_job_t *done, **done_tail; /* under mu */
   bool running;                    /* under mu: started and not stopped */
   bool stop;                       /* under mu */
   bool wake_pending;               /* under mu: a post to the loop is waiting */
   loopwake_t *wake;                /* borrowed */
};

/* Static, never freed: a post to the loop may still be queued when the
 * loop is destroyed (a second SIGTERM destroys it from inside the loop),
 * and its callback must find a valid, stopped decoder.  One per loop,
 * by the loop's index; each mutex is initialised once (decoders_once). */
static client_decoder_t decoders[CLIENT_LOOPS_MAX];
static pthread_once_t decoders_once = PTHREAD_ONCE_INIT;

static void
decoders_init (void)
{
   for (unsigned i = 0; i < CLIENT_LOOPS_MAX; i++) {
      pthread_mutex_init (&decoders[i].mu, NULL);
      pthread_cond_init (&decoders[i].cv, NULL);
   }
}

void
client_job_free (client_job_t *j)
{
   if (!j)
      return;
   proxy_evbuffer_free (j->raw);
   proxy_evbuffer_free (j->plain);
   bson_free (j->copy);
   bson_free (j);
}

/* On the loop: takes every finished job and lets its connection go on. */
static void
client_decoder_done_cb (void *arg)
{
   client_decoder_t *w = arg;
   client_job_t *list;

   pthread_mutex_lock (&w->mu);
   if (!w->running) {
      pthread_mutex_unlock (&w->mu);
      return; /* stopped since the post: nothing is left */
   }
   list = w->done;
   w->done = NULL;
   w->done_tail = &w->done;
   w->wake_pending = false;
   pthread_mutex_unlock (&w->mu);
   while (list) {
      client_job_t *j = list;
      list = j->next;
      j->next = NULL;
      if (!j->c) {
         client_job_free (j);
         continue;
      }
      j->finished = true;
      client_resume (j->c); /* routes it from client_route */
   }
}

/* How much lower the decoding thread's priority is than the loop's: on a
 * busy machine the forwarding loop gets the CPU first, and a hostile
 * message waits instead of the other connections. */
#define CLIENT_DECODER_NICE 10

static void *
client_decoder_main (void *arg)
{
   client_decoder_t *w = arg;

   /* Linux: nice is per thread (a failure only costs the preference). */
   (void) setpriority (PRIO_PROCESS, (id_t) gettid (), CLIENT_DECODER_NICE);
   pthread_mutex_lock (&w->mu);
   for (;;) {
      client_job_t *j;

      while (!w->pending && !w->stop)
         pthread_cond_wait (&w->cv, &w->mu);
      if (w->stop)
         break;
      j = w->pending;
      w->pending = j->next;
      if (!w->pending)
         w->pending_tail = &w->pending;
      j->next = NULL;
      pthread_mutex_unlock (&w->mu);

      j->ok = decode_request (j->raw, j->h, j->plain, &j->copy, &j->d, &j->error);

      pthread_mutex_lock (&w->mu);
      *w->done_tail = j;
      w->done_tail = &j->next;
      /* One post covers every job done until the loop runs it.  A full
       * queue (LOOPWAKE_CAPACITY posts waiting) is retried shortly. */
      while (!w->wake_pending && !w->stop) {
         if (loopwake_post (w->wake, client_decoder_done_cb, w)) {
            w->wake_pending = true;
            break;
         }
         pthread_mutex_unlock (&w->mu);
         usleep (1000);
         pthread_mutex_lock (&w->mu);
      }
   }
   pthread_mutex_unlock (&w->mu);
   return NULL;
}

bool
client_decoder_start (client_loop_t *loop, loopwake_t *wake, bson_error_t *error)
{
   client_decoder_t *w;

   pthread_once (&decoders_once, decoders_init);
   w = &decoders[loop->index];

   pthread_mutex_lock (&w->mu);
   if (w->running) {
      pthread_mutex_unlock (&w->mu);
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_DECODER, "the request decoding thread is already running");
      return false;
   }
   w->wake = wake;
   w->pending = w->done = NULL;
   w->pending_tail = &w->pending;
   w->done_tail = &w->done;
   w->stop = w->wake_pending = false;
   if (pthread_create (&w->thread, NULL, client_decoder_main, w) != 0) {
      pthread_mutex_unlock (&w->mu);
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_DECODER, "cannot start the request decoding thread");
      return false;
   }
   w->running = true;
   pthread_mutex_unlock (&w->mu);
   loop->decoder = w;
   return true;
}

void
client_decoder_stop (client_loop_t *loop)
{
   client_decoder_t *w = loop->decoder;

   if (!w)
      return;
   pthread_mutex_lock (&w->mu);
   w->stop = true;
   pthread_cond_signal (&w->cv);
   pthread_mutex_unlock (&w->mu);
   pthread_join (w->thread, NULL);
   pthread_mutex_lock (&w->mu);
   w->running = false;
   /* Every connection is closed by now, so no job has an owner. */
   while (w->pending) {
      client_job_t *j = w->pending;
      w->pending = j->next;
      client_job_free (j);
   }
   while (w->done) {
      client_job_t *j = w->done;
      w->done = j->next;
      client_job_free (j);
   }
   w->pending_tail = &w->pending;
   w->done_tail = &w->done;
   pthread_mutex_unlock (&w->mu);
   loop->decoder = NULL;
}

void
client_job_cancel (client_conn_t *c)
{
   client_job_t *j = c->job;

   if (!j)
      return;
   c->job = NULL;
   if (j->finished)
      client_job_free (j); /* back on the loop, not routed yet */
   else
      j->c = NULL; /* the decoding thread has it; client_decoder_done_cb frees it */
}

/* Hands the request at the front of `in` to the decoding thread.  Returns false
 * after disconnecting. */
bool
client_job_submit (client_conn_t *c, struct evbuffer *in, wire_header_t h)
{
   client_decoder_t *w = c->loop->decoder;
   client_job_t *j = bson_malloc0 (sizeof *j);

   RELAYBUS_ASSERT (!c->job); /* one request at a time */
   j->c = c;
   j->h = h;
   j->raw = evbuffer_new ();
   j->plain = evbuffer_new ();
   if (!j->raw || !j->plain || evbuffer_remove_buffer (in, j->raw, (size_t) h.length) != (int) h.length) {
      client_job_free (j);
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "out of memory handing request %d to the decoder", h.request_id);
      return false;
   }
   c->job = j;
   /* Out of the counted input and into the job: still the connection's. */
   counters_add (COUNTER_BUFFERED_BYTES, h.length);
   c->mem_decode += h.length;
   counters_add (COUNTER_REQUESTS_OFFLOADED, 1);
   pthread_mutex_lock (&w->mu);
   *w->pending_tail = j;
   w->pending_tail = &j->next;
   pthread_cond_signal (&w->cv);
   pthread_mutex_unlock (&w->mu);
   return true;
}

bool
client_job_finished (const client_job_t *j)
{
   return j->finished;
}

const wire_header_t *
client_job_header (const client_job_t *j)
{
   return &j->h;
}

decoded_t *
client_job_decoded (client_job_t *j, const bson_error_t **error)
{
   *error = &j->error;
   return j->ok ? &j->d : NULL;
}
