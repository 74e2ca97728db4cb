/*
 * base/authlimit.c - the guess counts of (user, address) pairs and the
 * failures of users (base/authlimit.h), in two fixed tables under one
 * mutex.
 *
 * A slot counts in a ring of AUTHLIMIT_BUCKETS buckets; `epoch` is the
 * newest bucket's number (now_ms / AUTHLIMIT_BUCKET_MS), and moving it
 * forward clears the buckets it passes, so a sum over the ring is the
 * count of the last 60 to 70 s.  A slot's tag is the SipHash-2-4 of its
 * name (base/keyhash.h) under the table's own key (0 marks a free slot; a
 * hash of 0 is taken as 1).
 */
#include "base/authlimit.h"

#include <pthread.h>
#include <string.h>

#include <bson/bson.h>

#include "base/assert.h"
#include "base/keyhash.h"

/* Bytes of name hashed: a user name (AUTHFILE_MAX_NAME is 256) and an
 * address fit; longer input is cut here, the same for every call. */
#define AUTHLIMIT_MAX_INPUT 1024

typedef struct {
   uint64_t tag;     /* 0: free */
   int64_t last_ms;  /* last touched: the least recent of a full neighbourhood goes */
   int64_t epoch;    /* the newest bucket's number */
   int64_t warned_ms; /* the last first-refusal reported; 0: none */
   uint32_t n[AUTHLIMIT_BUCKETS];
} slot_t;

struct authlimit {
   pthread_mutex_t mu;
   uint8_t key[AUTHLIMIT_KEY_BYTES];
   slot_t pairs[AUTHLIMIT_PAIRS];
   slot_t users[AUTHLIMIT_USERS];
};

/* The tag of a pair ('p', user, NUL, address) or of a user ('u', user):
 * the kind byte keeps the two tables' names apart. */
static uint64_t
tag_of (const authlimit_t *al, char kind, const char *user, const char *addr)
{
   uint8_t buf[AUTHLIMIT_MAX_INPUT];
   size_t n = 0, len;
   uint64_t h;

   buf[n++] = (uint8_t) kind;
   len = strnlen (user, sizeof buf - n - 1);
   memcpy (buf + n, user, len);
   n += len;
   if (addr) {
      buf[n++] = 0;
      len = strnlen (addr, sizeof buf - n);
      memcpy (buf + n, addr, len);
      n += len;
   }
   h = keyhash_siphash24 (al->key, buf, n);
   return h ? h : 1;
}

/* ------------------------------------------------------------ slots */

/* Moves the slot's ring to now's bucket, clearing the buckets passed. */
static void
slot_advance (slot_t *s, int64_t now_ms)
{
   int64_t e = now_ms / AUTHLIMIT_BUCKET_MS;

   if (e <= s->epoch)
      return;
   if (e - s->epoch >= AUTHLIMIT_BUCKETS) {
      memset (s->n, 0, sizeof s->n);
   } else {
      for (int64_t i = s->epoch + 1; i <= e; i++)
         s->n[i % AUTHLIMIT_BUCKETS] = 0;
   }
   s->epoch = e;
}

static uint32_t
slot_sum (const slot_t *s)
{
   uint32_t sum = 0;

   for (int i = 0; i < AUTHLIMIT_BUCKETS; i++)
      sum += s->n[i];
   return sum;
}

/* The slot of `tag` in table[0..size), or NULL; with `create`, a free slot
 * or the least recently used of the neighbourhood, emptied for it.  Under
 * the mutex. */
static slot_t *
slot_find (slot_t *table, size_t size, uint64_t tag, bool create, int64_t now_ms)
{
   slot_t *victim = NULL;

   for (unsigned i = 0; i < AUTHLIMIT_PROBE; i++) {
      slot_t *s = &table[(tag + i) % size];
      if (s->tag == tag) {
         slot_advance (s, now_ms);
         s->last_ms = now_ms;
         return s;
      }
      if (!victim || (victim->tag && (!s->tag || s->last_ms < victim->last_ms)))
         victim = s;
   }
   if (!create)
      return NULL;
   memset (victim, 0, sizeof *victim);
   victim->tag = tag;
   victim->last_ms = now_ms;
   victim->epoch = now_ms / AUTHLIMIT_BUCKET_MS;
   return victim;
}

/* ------------------------------------------------------------ the API */

authlimit_t *
authlimit_new (const uint8_t key[AUTHLIMIT_KEY_BYTES])
{
   authlimit_t *al = bson_malloc0 (sizeof *al);

   pthread_mutex_init (&al->mu, NULL);
   memcpy (al->key, key, AUTHLIMIT_KEY_BYTES);
   return al;
}

void
authlimit_destroy (authlimit_t *al)
{
   if (!al)
      return;
   pthread_mutex_destroy (&al->mu);
   bson_free (al);
}

bool
authlimit_take (authlimit_t *al,
                const char *user,
                const char *addr,
                uint32_t limit,
                int64_t now_ms,
                authlimit_ticket_t *ticket,
                uint32_t *counted,
                bool *first)
{
   uint64_t tag = tag_of (al, 'p', user, addr);
   bool ok;

   RELAYBUS_ASSERT (limit > 0);
   memset (ticket, 0, sizeof *ticket);
   *first = false;
   pthread_mutex_lock (&al->mu);
   {
      slot_t *s = slot_find (al->pairs, AUTHLIMIT_PAIRS, tag, true, now_ms);
      *counted = slot_sum (s);
      ok = *counted < limit;
      if (ok) {
         s->n[s->epoch % AUTHLIMIT_BUCKETS]++;
         ticket->held = true;
         ticket->tag = tag;
         ticket->bucket = s->epoch;
      } else if (!s->warned_ms || now_ms - s->warned_ms >= AUTHLIMIT_WINDOW_MS) {
         s->warned_ms = now_ms;
         *first = true;
      }
   }
   pthread_mutex_unlock (&al->mu);
   return ok;
}

void
authlimit_refund (authlimit_t *al, authlimit_ticket_t *ticket, int64_t now_ms)
{
   if (!ticket->held)
      return;
   pthread_mutex_lock (&al->mu);
   {
      slot_t *s = slot_find (al->pairs, AUTHLIMIT_PAIRS, ticket->tag, false, now_ms);
      /* Its bucket may have left the ring (then it counts no more), or
       * the slot may be another pair's now (then there is nothing to
       * give back). */
      if (s && s->epoch - ticket->bucket < AUTHLIMIT_BUCKETS && s->n[ticket->bucket % AUTHLIMIT_BUCKETS] > 0)
         s->n[ticket->bucket % AUTHLIMIT_BUCKETS]--;
   }
   pthread_mutex_unlock (&al->mu);
   memset (ticket, 0, sizeof *ticket);
}

void
authlimit_spend (authlimit_t *al, authlimit_ticket_t *ticket, const char *user, int64_t now_ms)
{
   uint64_t tag = tag_of (al, 'u', user, NULL);

   memset (ticket, 0, sizeof *ticket);
   pthread_mutex_lock (&al->mu);
   {
      slot_t *s = slot_find (al->users, AUTHLIMIT_USERS, tag, true, now_ms);
      s->n[s->epoch % AUTHLIMIT_BUCKETS]++;
   }
   pthread_mutex_unlock (&al->mu);
}

uint32_t
authlimit_user_failures (authlimit_t *al, const char *user, int64_t now_ms)
{
   uint64_t tag = tag_of (al, 'u', user, NULL);
   uint32_t failures = 0;

   pthread_mutex_lock (&al->mu);
   {
      slot_t *s = slot_find (al->users, AUTHLIMIT_USERS, tag, false, now_ms);
      if (s)
         failures = slot_sum (s);
   }
   pthread_mutex_unlock (&al->mu);
   return failures;
}

int64_t
authlimit_delay_ms (authlimit_t *al, const char *user, uint32_t threshold, int64_t cap_ms, int64_t now_ms)
{
   uint32_t failures, k;

   if (cap_ms <= 0)
      return 0;
   failures = authlimit_user_failures (al, user, now_ms);
   if (failures < threshold)
      return 0;
   /* 2^k past the cap is the cap; stop doubling before it overflows. */
   k = failures - threshold;
   if (k >= 30 || ((int64_t) AUTHLIMIT_DELAY_BASE_MS << k) >= cap_ms)
      return cap_ms;
   return (int64_t) AUTHLIMIT_DELAY_BASE_MS << k;
}
