/*
 * base/outbox.c - collection names, the lane hash, the lane spaces and
 * lease tokens.
 *
 * Pure functions with no I/O, so the forwarding loop may call them.
 */
#include "base/outbox.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"

/* A number field, exactly: false when it is missing or not a number. */
static bool
number_is (const bson_t *doc, const char *field, int64_t want)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, doc, field) && BSON_ITER_HOLDS_NUMBER (&it) && bson_iter_as_int64 (&it) == want;
}

static bool
utf8_is (const bson_t *doc, const char *field, const char *want)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, doc, field) && BSON_ITER_HOLDS_UTF8 (&it) && strcmp (bson_iter_utf8 (&it, NULL), want) == 0;
}

bool
outbox_lease_holds (
   const outbox_lease_t *lease, const bson_oid_t *id, const char *handler, const bson_t *delivery, const bson_t *lane)
{
   bson_iter_t it, arr;
   int64_t claims = 0;

   if (!delivery || !lane)
      return false;
   if (bson_iter_init_find (&it, delivery, OUTBOX_F_CLAIMS) && BSON_ITER_HOLDS_NUMBER (&it))
      claims = bson_iter_as_int64 (&it);
   if (claims != lease->claims || !number_is (delivery, OUTBOX_F_LANE_ID, (int64_t) lease->lane_id) ||
       !utf8_is (delivery, "status", "pending") || (handler && !utf8_is (delivery, "handler", handler)) ||
       !number_is (lane, OUTBOX_F_EPOCH, lease->epoch))
      return false;
   if (!bson_iter_init_find (&it, lane, OUTBOX_F_IN_FLIGHT) || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
      return false;
   while (bson_iter_next (&arr))
      if (BSON_ITER_HOLDS_OID (&arr) && bson_oid_equal (bson_iter_oid (&arr), id))
         return true;
   return false;
}

static const char *const outbox_suffixes[OUTBOX_N_COLLECTIONS] = {
   [OUTBOX_EVENTS] = "events",
   [OUTBOX_DELIVERIES] = "deliveries",
   [OUTBOX_KEY_SEQUENCES] = "key_sequences",
   [OUTBOX_LANES_COLL] = "lanes",
   [OUTBOX_COMPLETED] = "completed_deliveries",
   [OUTBOX_HANDLERS] = "handlers",
   [OUTBOX_HANDLER_STATES] = "handler_states",
   [OUTBOX_ATTEMPTS] = "attempts",
};

static const char *const attempt_outcomes[OUTBOX_ATTEMPT_OUTCOMES] = {
   [OUTBOX_ATTEMPT_SUCCEEDED] = "succeeded",
   [OUTBOX_ATTEMPT_FAILED] = "failed",
   [OUTBOX_ATTEMPT_TIMED_OUT] = "timed_out",
   [OUTBOX_ATTEMPT_LEASE_LOST] = "lease_lost",
   [OUTBOX_ATTEMPT_REFUSED] = "refused",
   [OUTBOX_ATTEMPT_RELEASED] = "released",
   [OUTBOX_ATTEMPT_BURIED] = "buried",
};

const char *
outbox_attempt_outcome_name (outbox_attempt_outcome_t o)
{
   return (unsigned) o < OUTBOX_ATTEMPT_OUTCOMES ? attempt_outcomes[o] : NULL;
}

bool
outbox_attempt_outcome_parse (const char *name, outbox_attempt_outcome_t *out)
{
   for (int i = 0; name && i < OUTBOX_ATTEMPT_OUTCOMES; i++)
      if (strcmp (name, attempt_outcomes[i]) == 0) {
         *out = (outbox_attempt_outcome_t) i;
         return true;
      }
   return false;
}

const char *
outbox_collection_suffix (outbox_collection_t c)
{
   if ((unsigned) c >= OUTBOX_N_COLLECTIONS)
      return NULL;
   return outbox_suffixes[c];
}

bool
outbox_collection_name (const char *prefix, outbox_collection_t c, char *out, size_t out_len)
{
   const char *suffix = outbox_collection_suffix (c);
   int n;

   if (!suffix)
      return false;
   n = snprintf (out, out_len, "%s%s", prefix, suffix);
   return n > 0 && (size_t) n < out_len;
}

uint32_t
outbox_fnv1a (const void *data, size_t len)
{
   const unsigned char *p = data;
   uint32_t h = 2166136261u;

   for (size_t i = 0; i < len; i++) {
      h ^= p[i];
      h *= 16777619u;
   }
   return h;
}

uint32_t
outbox_lane_id (const char *key, const char *event_id)
{
   const char *s = key ? key : event_id;

   return outbox_fnv1a (s, strlen (s)) % OUTBOX_LANES;
}

int32_t
outbox_lane_doc_id (uint32_t space, uint32_t lane)
{
   RELAYBUS_ASSERT (space < OUTBOX_LANE_SPACE_MAX && lane < OUTBOX_LANES);
   return (int32_t) (space * OUTBOX_LANES + lane);
}

int64_t
outbox_lane_space_of_doc (int64_t doc_id)
{
   return doc_id < 0 ? -1 : doc_id / OUTBOX_LANES;
}

uint32_t
outbox_lane_space_of (const char *handler)
{
   return OUTBOX_LANE_SPACES + outbox_fnv1a (handler, strlen (handler)) % (OUTBOX_LANE_SPACE_MAX - OUTBOX_LANE_SPACES);
}

const char *
outbox_lane_space_name (uint32_t space)
{
   static const char *const names[OUTBOX_LANE_SPACES] = {
      [OUTBOX_LANE_SPACE_DISPATCH] = "dispatch",
      [OUTBOX_LANE_SPACE_PULL] = "pull",
   };

   return space < OUTBOX_LANE_SPACES ? names[space] : "handler";
}

void
outbox_lease_format (const outbox_lease_t *lease, char out[OUTBOX_LEASE_TOKEN_MAX])
{
   snprintf (out,
             OUTBOX_LEASE_TOKEN_MAX,
             "%" PRIu32 ":%" PRId64 ":%" PRId32,
             lease->lane_id,
             lease->epoch,
             lease->claims);
}

/* A decimal field without sign, leading zeros (except "0") or spaces. */
static bool
parse_field (const char **p, char stop, int64_t max, int64_t *out)
{
   const char *s = *p;
   int64_t v = 0;
   size_t n = 0;

   while (s[n] >= '0' && s[n] <= '9') {
      if (v > (max - (s[n] - '0')) / 10)
         return false;
      v = v * 10 + (s[n] - '0');
      n++;
   }
   if (n == 0 || (n > 1 && s[0] == '0') || s[n] != stop)
      return false;
   *out = v;
   *p = s + n + (stop ? 1 : 0);
   return true;
}

bool
outbox_lease_parse (const char *token, outbox_lease_t *out)
{
   const char *p = token;
   int64_t lane, epoch, claims;

   if (!token || strlen (token) >= OUTBOX_LEASE_TOKEN_MAX)
      return false;
   if (!parse_field (&p, ':', OUTBOX_LANES - 1, &lane) || !parse_field (&p, ':', INT64_MAX, &epoch) ||
       !parse_field (&p, '\0', INT32_MAX, &claims))
      return false;
   if (epoch < 1)
      return false;
   out->lane_id = (uint32_t) lane;
   out->epoch = epoch;
   out->claims = (int32_t) claims;
   return true;
}
