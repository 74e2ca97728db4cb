/*
 * proxy/clients.c - the connected clients, for /api/clients (see
 * proxy/clients.h).
 *
 * A chained hash of CR_BUCKETS buckets keyed by connection id, under one
 * mutex.  The forwarding loop inserts on the first state, updates on each
 * change and removes on CLOSING; the admin thread copies a snapshot.  The
 * registry does not own the sockets: it only reads TCP_INFO from them, under
 * the mutex, while the loop cannot yet have closed them.
 */
#include "proxy/clients.h"
#include "base/clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#ifdef __linux__
#include <linux/tcp.h>
#include <netinet/in.h>
#endif

#define CR_BUCKETS 1024

typedef struct clients_entry {
   struct clients_entry *next;
   uint64_t id;
   unsigned loop;
   char peer[128];
   int fd;
   const char *state; /* static storage */
   /* Static storage; the loop stores them without the mutex. */
   _Atomic (const char *) pairing;
   _Atomic (const char *) read_hold;
   int64_t since, state_since;
} cr_entry_t;

static pthread_mutex_t cr_mu = PTHREAD_MUTEX_INITIALIZER;
static cr_entry_t *cr_buckets[CR_BUCKETS];
static uint64_t cr_count;

clients_entry_t *
clients_registry_note (uint64_t id, unsigned loop, const char *peer, int fd, const char *state, bool open)
{
   cr_entry_t **pp, *e, *gone = NULL;
   int64_t now = clock_now_ms ();

   pthread_mutex_lock (&cr_mu);
   for (pp = &cr_buckets[id % CR_BUCKETS]; *pp && (*pp)->id != id; pp = &(*pp)->next)
      ;
   e = *pp;
   if (!open) {
      if (e) {
         *pp = e->next;
         cr_count--;
         gone = e;
         e = NULL;
      }
   } else if (e) {
      e->state = state;
      e->state_since = now;
      if (fd >= 0)
         e->fd = fd;
   } else if ((e = calloc (1, sizeof *e))) {
      e->id = id;
      e->loop = loop;
      bson_strncpy (e->peer, peer ? peer : "", sizeof e->peer);
      e->fd = fd;
      e->state = state;
      atomic_init (&e->pairing, NULL);
      atomic_init (&e->read_hold, NULL);
      e->since = e->state_since = now;
      e->next = cr_buckets[id % CR_BUCKETS];
      cr_buckets[id % CR_BUCKETS] = e;
      cr_count++;
   }
   pthread_mutex_unlock (&cr_mu);
   free (gone);
   return e;
}

void
clients_entry_set_pairing (clients_entry_t *e, const char *pairing)
{
   if (e)
      atomic_store_explicit (&e->pairing, pairing, memory_order_relaxed);
}

void
clients_entry_set_read_hold (clients_entry_t *e, const char *read_hold)
{
   if (e)
      atomic_store_explicit (&e->read_hold, read_hold, memory_order_relaxed);
}

static int
cr_cmp (const void *a, const void *b)
{
   uint64_t x = (*(cr_entry_t *const *) a)->id, y = (*(cr_entry_t *const *) b)->id;
   return x < y ? -1 : x > y;
}

uint64_t
clients_registry_snapshot (bson_t *out, uint32_t limit)
{
   uint32_t i = bson_count_keys (out);
   cr_entry_t **v;
   size_t n = 0;
   uint64_t total;

   pthread_mutex_lock (&cr_mu);
   total = cr_count;
   v = malloc ((total ? total : 1) * sizeof *v);
   for (size_t b = 0; v && b < CR_BUCKETS; b++)
      for (cr_entry_t *e = cr_buckets[b]; e; e = e->next)
         v[n++] = e;
   if (v)
      qsort (v, n, sizeof *v, cr_cmp);
   for (size_t k = 0; v && k < n && k < limit; k++) {
      cr_entry_t *e = v[k];
      char buf[16];
      const char *key;
      bson_t doc;

      bson_uint32_to_string (i++, &key, buf, sizeof buf);
      BSON_APPEND_DOCUMENT_BEGIN (out, key, &doc);
      BSON_APPEND_INT64 (&doc, "id", (int64_t) e->id);
      BSON_APPEND_INT32 (&doc, "loop", (int32_t) e->loop);
      BSON_APPEND_UTF8 (&doc, "peer", e->peer);
      BSON_APPEND_UTF8 (&doc, "state", e->state ? e->state : "unknown");
      {
         const char *pairing = atomic_load_explicit (&e->pairing, memory_order_relaxed);
         const char *hold = atomic_load_explicit (&e->read_hold, memory_order_relaxed);
         if (pairing)
            BSON_APPEND_UTF8 (&doc, "pairing", pairing);
         BSON_APPEND_UTF8 (&doc, "readHold", hold ? hold : "unknown");
      }
      BSON_APPEND_INT64 (&doc, "since", e->since);
      BSON_APPEND_INT64 (&doc, "stateSince", e->state_since);
#if defined(__linux__) && defined(TCP_INFO)
      {
         struct tcp_info ti;
         socklen_t len = sizeof ti;
         memset (&ti, 0, sizeof ti);
         /* Kernels before 4.2 fill a shorter struct: then no bytes. */
         if (e->fd >= 0 && getsockopt (e->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
             len >= offsetof (struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) {
            BSON_APPEND_INT64 (&doc, "bytesIn", (int64_t) ti.tcpi_bytes_received);
            BSON_APPEND_INT64 (&doc, "bytesOut", (int64_t) ti.tcpi_bytes_acked);
         }
      }
#endif
      bson_append_document_end (out, &doc);
   }
   pthread_mutex_unlock (&cr_mu);
   free (v);
   return total;
}

bool
clients_registry_loop_of (uint64_t id, unsigned *loop)
{
   cr_entry_t *e;

   pthread_mutex_lock (&cr_mu);
   for (e = cr_buckets[id % CR_BUCKETS]; e && e->id != id; e = e->next)
      ;
   if (e)
      *loop = e->loop;
   pthread_mutex_unlock (&cr_mu);
   return e != NULL;
}

void
clients_registry_clear (void)
{
   pthread_mutex_lock (&cr_mu);
   for (size_t b = 0; b < CR_BUCKETS; b++)
      while (cr_buckets[b]) {
         cr_entry_t *e = cr_buckets[b];
         cr_buckets[b] = e->next;
         free (e);
      }
   cr_count = 0;
   pthread_mutex_unlock (&cr_mu);
}
