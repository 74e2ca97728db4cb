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

#include <arpa/inet.h>
#include <netinet/in.h>

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

/* The pair's slot (created) and the count of its failures, with *first
 * set for the pair's first refusal in a window.  Under the mutex. */
static slot_t *
pair_slot (authlimit_t *al, uint64_t tag, uint32_t limit, int64_t now_ms, uint32_t *failures, bool *first)
{
   slot_t *s = slot_find (al->pairs, AUTHLIMIT_PAIRS, tag, true, now_ms);

   *failures = slot_sum (s);
   *first = false;
   if (*failures >= limit && (!s->warned_ms || now_ms - s->warned_ms >= AUTHLIMIT_WINDOW_MS)) {
      s->warned_ms = now_ms;
      *first = true;
   }
   return s;
}

/* One failure of the pair in `s` and of `user`.  Under the mutex. */
static void
count_failure (authlimit_t *al, slot_t *s, const char *user, int64_t now_ms)
{
   slot_t *u = slot_find (al->users, AUTHLIMIT_USERS, tag_of (al, 'u', user, NULL), true, now_ms);

   s->n[s->epoch % AUTHLIMIT_BUCKETS]++;
   u->n[u->epoch % AUTHLIMIT_BUCKETS]++;
}

bool
authlimit_allowed (authlimit_t *al, const char *user, const char *addr, uint32_t limit, int64_t now_ms, uint32_t *failures,
                   bool *first)
{
   uint64_t tag = tag_of (al, 'p', user, addr);
   bool ok;

   RELAYBUS_ASSERT (limit > 0);
   pthread_mutex_lock (&al->mu);
   (void) pair_slot (al, tag, limit, now_ms, failures, first);
   ok = *failures < limit;
   pthread_mutex_unlock (&al->mu);
   return ok;
}

authlimit_verdict_t
authlimit_check (authlimit_t *al,
                 const char *user,
                 const char *addr,
                 uint32_t limit,
                 int64_t now_ms,
                 bool (*check) (void *arg),
                 void *arg,
                 uint32_t *failures,
                 bool *first)
{
   uint64_t tag = tag_of (al, 'p', user, addr);
   authlimit_verdict_t v;

   RELAYBUS_ASSERT (limit > 0);
   pthread_mutex_lock (&al->mu);
   {
      slot_t *s = pair_slot (al, tag, limit, now_ms, failures, first);
      if (*failures >= limit) {
         v = AUTHLIMIT_REFUSED;
      } else if (check (arg)) {
         v = AUTHLIMIT_PASSED;
      } else {
         count_failure (al, s, user, now_ms);
         v = AUTHLIMIT_FAILED;
      }
   }
   pthread_mutex_unlock (&al->mu);
   return v;
}

void
authlimit_fail (authlimit_t *al, const char *user, const char *addr, int64_t now_ms)
{
   uint64_t tag = tag_of (al, 'p', user, addr);

   pthread_mutex_lock (&al->mu);
   count_failure (al, slot_find (al->pairs, AUTHLIMIT_PAIRS, tag, true, now_ms), user, now_ms);
   pthread_mutex_unlock (&al->mu);
}

void
authlimit_addr_group (const char *addr, char *out, size_t out_len)
{
   char buf[INET6_ADDRSTRLEN + 8], text[INET6_ADDRSTRLEN];
   size_t n = strlen (addr);
   struct in6_addr v6;
   const char *inner = addr;

   RELAYBUS_ASSERT (out_len > 0);
   if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']' && n - 2 < sizeof buf) {
      memcpy (buf, addr + 1, n - 2);
      buf[n - 2] = '\0';
      buf[strcspn (buf, "%")] = '\0'; /* a zone (fe80::1%eth0) names no other host */
      inner = buf;
   }
   if (!strchr (inner, ':') || inet_pton (AF_INET6, inner, &v6) != 1) {
      bson_strncpy (out, addr, out_len);
      return;
   }
   if (IN6_IS_ADDR_V4MAPPED (&v6)) {
      /* ::ffff:a.b.c.d is that IPv4 address, counted as itself. */
      bson_snprintf (out, out_len, "%u.%u.%u.%u", v6.s6_addr[12], v6.s6_addr[13], v6.s6_addr[14], v6.s6_addr[15]);
      return;
   }
   memset (v6.s6_addr + 8, 0, 8);
   if (!inet_ntop (AF_INET6, &v6, text, sizeof text)) {
      bson_strncpy (out, addr, out_len);
      return;
   }
   bson_snprintf (out, out_len, "[%s]/64", text);
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
