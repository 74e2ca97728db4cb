/*
 * dispatch/delivery.c - the delivery body every kind sends, the retry
 * schedule with full jitter, and the one generator of its random numbers
 * (see dispatch/delivery.h).
 *
 * Not the webhook's: every dispatched kind sends this body, and the
 * dispatcher and the pull consumers wait by this schedule, each with a
 * generator of its own thread.  Nothing here does I/O.
 */
#include "dispatch/delivery.h"

#include <stdio.h>
#include <time.h>

#include <openssl/rand.h>

#include "base/clock.h"

/* ------------------------------------------------------------------ body */

static void
format_iso (int64_t ms, char out[32])
{
   time_t secs = (time_t) (ms / 1000);
   struct tm tm;
   char base[24];

   gmtime_r (&secs, &tm);
   strftime (base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
   snprintf (out, 32, "%s.%03dZ", base, (int) (ms % 1000));
}

char *
delivery_body (const store_delivery_t *d, size_t *len)
{
   bson_t b = BSON_INITIALIZER, del;
   bson_iter_t it;
   char iso[32], hex[25];
   char *json;

   BSON_APPEND_UTF8 (&b, "id", d->event_id ? d->event_id : "");
   BSON_APPEND_UTF8 (&b, "type", d->event_type ? d->event_type : "");
   if (d->key) {
      BSON_APPEND_UTF8 (&b, "key", d->key);
      BSON_APPEND_INT64 (&b, "sequence", d->sequence);
   }
   if (d->event && bson_iter_init_find (&it, d->event, "payload"))
      bson_append_iter (&b, "payload", -1, &it);
   else
      BSON_APPEND_NULL (&b, "payload");
   if (d->event && bson_iter_init_find (&it, d->event, "headers") && BSON_ITER_HOLDS_DOCUMENT (&it))
      bson_append_iter (&b, "headers", -1, &it);
   if (d->event && bson_iter_init_find (&it, d->event, "correlationId") && BSON_ITER_HOLDS_UTF8 (&it))
      bson_append_iter (&b, "correlationId", -1, &it);
   if (d->event && bson_iter_init_find (&it, d->event, "causationId") && BSON_ITER_HOLDS_UTF8 (&it))
      bson_append_iter (&b, "causationId", -1, &it);
   format_iso (d->event && bson_iter_init_find (&it, d->event, "createdAt") && BSON_ITER_HOLDS_DATE_TIME (&it)
                  ? bson_iter_date_time (&it)
                  : d->created_at,
               iso);
   BSON_APPEND_UTF8 (&b, "createdAt", iso);
   bson_oid_to_string (&d->id, hex);
   BSON_APPEND_DOCUMENT_BEGIN (&b, "delivery", &del);
   BSON_APPEND_UTF8 (&del, "id", hex);
   BSON_APPEND_UTF8 (&del, "handler", d->handler ? d->handler : "");
   BSON_APPEND_INT32 (&del, "attempt", d->attempt);
   bson_append_document_end (&b, &del);
   json = bson_as_relaxed_extended_json (&b, len);
   bson_destroy (&b);
   return json;
}

/* ------------------------------------------------------------- retries */

int64_t
delivery_backoff_ms (const int64_t *delays_ms, size_t n_delays, int32_t attempt, uint64_t rnd)
{
   size_t i = attempt < 1 ? 0 : (size_t) attempt - 1;
   int64_t cap;

   if (n_delays == 0)
      return 0;
   cap = delays_ms[i < n_delays ? i : n_delays - 1];
   return cap <= 0 ? 0 : (int64_t) (rnd % ((uint64_t) cap + 1));
}

void
delivery_rng_seed (delivery_rng_t *rng)
{
   /* xorshift stays at 0 for ever: a zero seed is replaced. */
   if (RAND_bytes ((unsigned char *) &rng->s, sizeof rng->s) != 1 || rng->s == 0)
      rng->s = (uint64_t) clock_now_ms () | 1;
}

uint64_t
delivery_rng_next (delivery_rng_t *rng)
{
   /* xorshift64* (Vigna): jitter only. */
   rng->s ^= rng->s >> 12;
   rng->s ^= rng->s << 25;
   rng->s ^= rng->s >> 27;
   return rng->s * 2685821657736338717ULL;
}
