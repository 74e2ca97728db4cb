/*
 * publish/poison.c - a bounded, expiring, thread-safe set of transactions (see
 * publish/poison.h for what it is for).
 *
 * Layout: a fixed array of `capacity` slots, allocated at the first add.
 * Live slots are on a doubly linked list in the order they were added
 * (oldest first: expiry takes from the front, as entries share one TTL)
 * and on a hash chain; free slots are on a free list.  `reserved` counts
 * free slots promised to callers (live + reserved <= capacity always), so
 * an add that holds a reservation finds a free slot without evicting.  Links
 * are slot indices, -1 for none.  Every operation is O(1) but for the chain
 * walk, and chains stay short: there are twice as many buckets as slots.
 *
 * The mutex is held only for those few steps, never across I/O; the
 * forwarding loop may call in.  `count` mirrors the number of live slots
 * for the lock-free emptiness check.
 */
#include "publish/poison.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/assert.h"
#include "base/keyhash.h"

typedef struct {
   poison_entry_t e;
   int32_t prev, next;  /* age order (live), or next free (free) */
   int32_t next_in_bucket;
   uint32_t hash;
} slot_t;

struct poison_table {
   pthread_mutex_t mu;
   uint32_t capacity;
   uint32_t nbuckets; /* a power of two */
   int64_t ttl_ms;
   slot_t *slots;     /* NULL until the first add */
   int32_t *buckets;
   int32_t oldest, newest;
   int32_t free_head;
   uint32_t live;
   uint32_t reserved; /* free slots promised by poison_table_reserve */
   _Atomic uint32_t count;
};

bool
poison_key_of (const bson_t *cmd, poison_key_t *key)
{
   bson_iter_t it, lsid;
   const uint8_t *data;
   uint32_t len;
   bson_subtype_t subtype;

   if (!bson_iter_init_find (&it, cmd, "lsid") || !BSON_ITER_HOLDS_DOCUMENT (&it) || !bson_iter_recurse (&it, &lsid) ||
       !bson_iter_find (&lsid, "id") || !BSON_ITER_HOLDS_BINARY (&lsid))
      return false;
   bson_iter_binary (&lsid, &subtype, &len, &data);
   if (len > POISON_LSID_ID_MAX)
      return false;
   if (!bson_iter_init_find (&it, cmd, "txnNumber") || !(BSON_ITER_HOLDS_INT64 (&it) || BSON_ITER_HOLDS_INT32 (&it)))
      return false;
   memset (key, 0, sizeof *key);
   memcpy (key->id, data, len);
   key->id_len = len;
   key->txn_number = bson_iter_as_int64 (&it);
   return true;
}

static uint32_t
key_hash (const poison_key_t *key)
{
   /* The session id and the transaction number are the client's: keyed,
    * so no client can make its keys collide (base/keyhash.h). */
   uint8_t buf[POISON_LSID_ID_MAX + sizeof key->txn_number];

   memcpy (buf, key->id, key->id_len);
   memcpy (buf + key->id_len, &key->txn_number, sizeof key->txn_number);
   return (uint32_t) keyhash (buf, key->id_len + sizeof key->txn_number);
}

static bool
key_equal (const poison_key_t *a, const poison_key_t *b)
{
   return a->txn_number == b->txn_number && a->id_len == b->id_len && memcmp (a->id, b->id, a->id_len) == 0;
}

poison_table_t *
poison_table_new (uint32_t capacity, int64_t ttl_ms)
{
   poison_table_t *t = bson_malloc0 (sizeof *t);

   t->capacity = capacity > 0 ? capacity : 1;
   if (t->capacity > INT32_MAX / 4)
      t->capacity = INT32_MAX / 4;
   t->nbuckets = 1;
   while (t->nbuckets < 2 * t->capacity)
      t->nbuckets <<= 1;
   t->ttl_ms = ttl_ms > 0 ? ttl_ms : 1;
   t->oldest = t->newest = t->free_head = -1;
   pthread_mutex_init (&t->mu, NULL);
   atomic_init (&t->count, 0);
   return t;
}

void
poison_table_destroy (poison_table_t *t)
{
   if (!t)
      return;
   pthread_mutex_destroy (&t->mu);
   bson_free (t->slots);
   bson_free (t->buckets);
   bson_free (t);
}

/* Allocates the slots (all free) and the buckets (all empty). */
static void
ensure_slots (poison_table_t *t)
{
   if (t->slots)
      return;
   t->slots = bson_malloc0 ((size_t) t->capacity * sizeof *t->slots);
   t->buckets = bson_malloc ((size_t) t->nbuckets * sizeof *t->buckets);
   for (uint32_t b = 0; b < t->nbuckets; b++)
      t->buckets[b] = -1;
   for (uint32_t i = 0; i < t->capacity; i++)
      t->slots[i].next = i + 1 < t->capacity ? (int32_t) (i + 1) : -1;
   t->free_head = 0;
}

/* Keeps `count` equal to `live` for poison_table_count's lock-free read. */
static void
mirror_count (poison_table_t *t)
{
   atomic_store_explicit (&t->count, t->live, memory_order_release);
}

/* The slot holding `key`, or -1.  Locked, slots allocated. */
static int32_t
find (const poison_table_t *t, const poison_key_t *key, uint32_t hash)
{
   for (int32_t i = t->buckets[hash & (t->nbuckets - 1)]; i >= 0; i = t->slots[i].next_in_bucket) {
      if (t->slots[i].hash == hash && key_equal (&t->slots[i].e.key, key))
         return i;
   }
   return -1;
}

/* Takes live slot `i` off both lists and frees it.  Locked. */
static void
unlink_slot (poison_table_t *t, int32_t i)
{
   slot_t *s = &t->slots[i];

   for (int32_t *p = &t->buckets[s->hash & (t->nbuckets - 1)]; *p >= 0; p = &t->slots[*p].next_in_bucket) {
      if (*p == i) {
         *p = s->next_in_bucket;
         break;
      }
   }
   if (s->prev >= 0)
      t->slots[s->prev].next = s->next;
   else
      t->oldest = s->next;
   if (s->next >= 0)
      t->slots[s->next].prev = s->prev;
   else
      t->newest = s->prev;
   s->next = t->free_head;
   s->prev = -1;
   t->free_head = i;
   RELAYBUS_ASSERT (t->live > 0);
   t->live--;
}

/* Drops expired entries from the front.  Locked. */
static void
expire (poison_table_t *t, int64_t now_ms)
{
   while (t->oldest >= 0 && now_ms - t->slots[t->oldest].e.recorded_ms >= t->ttl_ms)
      unlink_slot (t, t->oldest);
}

bool
poison_table_reserve (poison_table_t *t, int64_t now_ms)
{
   bool ok = false;

   pthread_mutex_lock (&t->mu);
   ensure_slots (t);
   expire (t, now_ms);
   if (t->live + t->reserved < t->capacity) {
      t->reserved++;
      ok = true;
   }
   RELAYBUS_ASSERT (t->live + t->reserved <= t->capacity);
   mirror_count (t);
   pthread_mutex_unlock (&t->mu);
   return ok;
}

void
poison_table_unreserve (poison_table_t *t)
{
   pthread_mutex_lock (&t->mu);
   if (t->reserved > 0)
      t->reserved--;
   pthread_mutex_unlock (&t->mu);
}

poison_add_t
poison_table_add (poison_table_t *t,
                  const poison_key_t *key,
                  uint64_t conn_id,
                  const char *reason,
                  int64_t now_ms,
                  bool reserved)
{
   uint32_t hash = key_hash (key);
   poison_add_t res = POISON_ADDED;
   int32_t i;
   slot_t *s;

   pthread_mutex_lock (&t->mu);
   ensure_slots (t);
   if (reserved && t->reserved > 0)
      t->reserved--; /* the caller's slot is now free for this entry */
   expire (t, now_ms);
   if (find (t, key, hash) >= 0) {
      res = POISON_KNOWN;
      goto done;
   }
   if (t->live + t->reserved >= t->capacity) {
      /* Every free slot is promised to someone else, or none is free: a
       * live entry is never evicted for a new one. */
      res = POISON_FULL;
      goto done;
   }
   /* live + reserved < capacity: a free slot exists. */
   i = t->free_head;
   RELAYBUS_ASSERT (i >= 0);
   s = &t->slots[i];
   t->free_head = s->next;
   memset (&s->e, 0, sizeof s->e);
   s->e.key = *key;
   s->e.recorded_ms = now_ms;
   s->e.conn_id = conn_id;
   bson_strncpy (s->e.reason, reason ? reason : "", sizeof s->e.reason);
   s->hash = hash;
   s->next_in_bucket = t->buckets[hash & (t->nbuckets - 1)];
   t->buckets[hash & (t->nbuckets - 1)] = i;
   s->prev = t->newest;
   s->next = -1;
   if (t->newest >= 0)
      t->slots[t->newest].next = i;
   else
      t->oldest = i;
   t->newest = i;
   t->live++;
   RELAYBUS_ASSERT (t->live + t->reserved <= t->capacity);
done:
   mirror_count (t);
   pthread_mutex_unlock (&t->mu);
   return res;
}

/* Finds `key` under the lock and, for a lookup, drops what expired at
 * `now_ms` first and copies the entry to `out` (when non-NULL); for a
 * removal, frees its slot.  Returns whether it was there. */
static bool
find_locked (poison_table_t *t, const poison_key_t *key, bool remove, int64_t now_ms, poison_entry_t *out)
{
   uint32_t hash = key_hash (key);
   bool found = false;
   int32_t i;

   pthread_mutex_lock (&t->mu);
   if (!t->slots)
      goto done;
   if (!remove)
      expire (t, now_ms);
   i = find (t, key, hash);
   if (i >= 0) {
      found = true;
      if (remove)
         unlink_slot (t, i);
      else if (out)
         *out = t->slots[i].e;
   }
   mirror_count (t);
done:
   pthread_mutex_unlock (&t->mu);
   return found;
}

bool
poison_table_lookup (poison_table_t *t, const poison_key_t *key, int64_t now_ms, poison_entry_t *out)
{
   return find_locked (t, key, false, now_ms, out);
}

bool
poison_table_remove (poison_table_t *t, const poison_key_t *key)
{
   return find_locked (t, key, true, 0, NULL);
}

uint32_t
poison_table_count (poison_table_t *t)
{
   return atomic_load_explicit (&t->count, memory_order_acquire);
}

uint32_t
poison_table_reserved (poison_table_t *t)
{
   uint32_t n;

   pthread_mutex_lock (&t->mu);
   n = t->reserved;
   pthread_mutex_unlock (&t->mu);
   return n;
}

uint32_t
poison_table_capacity (const poison_table_t *t)
{
   return t->capacity;
}
