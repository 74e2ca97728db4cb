/*
 * fuzz_lease.c - libFuzzer target for lease tokens (base/outbox.h), the
 * "<laneId>:<epoch>:<claims>" strings a pull consumer hands back to the
 * admin API with every settle call.
 *
 * The first input byte picks the mode:
 *   even: the rest, up to its first NUL, is a token from a client;
 *   odd:  the rest gives a lease's fields (lane u32, epoch i64, claims
 *         i32, little-endian, zero-padded) to format and parse back.
 *
 * Oracles (abort() on failure):
 *   - outbox_lease_parse accepts exactly the strings a separate reading of
 *     the grammar accepts (three decimal fields without sign, padding or
 *     leading zeros, lane < 256, 1 <= epoch <= INT64_MAX, claims <=
 *     INT32_MAX, shorter than OUTBOX_LEASE_TOKEN_MAX), with those values;
 *   - an accepted token is canonical: formatting it gives the same bytes;
 *   - formatting never overflows OUTBOX_LEASE_TOKEN_MAX, and the result
 *     parses back to the same fields exactly when they are in range;
 *   - store_ref_lease, the store's gate, agrees with outbox_lease_parse
 *     and refuses with a message.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "base/outbox.h"
#include "store/store.h"
#include "store/store_private.h"

/* One decimal field at *p, up to `stop`; false on anything else. */
static bool
field (const char **p, char stop, uint64_t max, uint64_t *out)
{
   const char *s = *p;
   uint64_t v = 0;
   size_t n = 0;

   for (; s[n] >= '0' && s[n] <= '9'; n++) {
      unsigned d = (unsigned) (s[n] - '0');

      if (v > (UINT64_MAX - d) / 10)
         return false;
      v = v * 10 + d;
      if (v > max)
         return false;
   }
   if (n == 0 || (s[0] == '0' && n > 1) || s[n] != stop)
      return false;
   *out = v;
   *p = s + n + 1;
   return true;
}

static bool
reference_parse (const char *token, outbox_lease_t *l)
{
   const char *p = token;
   uint64_t lane, epoch, claims;

   if (strlen (token) >= OUTBOX_LEASE_TOKEN_MAX)
      return false;
   if (!field (&p, ':', OUTBOX_LANES - 1, &lane) || !field (&p, ':', INT64_MAX, &epoch) ||
       !field (&p, '\0', INT32_MAX, &claims) || epoch < 1)
      return false;
   l->lane_id = (uint32_t) lane;
   l->epoch = (int64_t) epoch;
   l->claims = (int32_t) claims;
   return true;
}

static void
check_gate (const char *token, bool expect)
{
   store_ref_t ref;
   outbox_lease_t l;
   bson_error_t err;

   memset (&ref, 0, sizeof ref);
   ref.lease = token;
   memset (&err, 0, sizeof err);
   CHECK (store_ref_lease (&ref, &l, &err) == expect);
   if (!expect)
      CHECK (err.message[0] != '\0');
}

static void
check_token (const char *token)
{
   outbox_lease_t got, want;
   bool ok = outbox_lease_parse (token, &got);

   CHECK (ok == reference_parse (token, &want));
   check_gate (token, ok);
   if (ok) {
      char again[OUTBOX_LEASE_TOKEN_MAX];

      CHECK (got.lane_id == want.lane_id && got.epoch == want.epoch && got.claims == want.claims);
      CHECK (got.lane_id < OUTBOX_LANES && got.epoch >= 1 && got.claims >= 0);
      outbox_lease_format (&got, again);
      CHECK (strcmp (again, token) == 0);
   }
}

static void
check_fields (const uint8_t *data, size_t size)
{
   uint8_t raw[16] = {0};
   outbox_lease_t l, back;
   char token[OUTBOX_LEASE_TOKEN_MAX + 1];
   uint64_t e = 0;
   uint32_t lane = 0, c = 0;
   bool in_range;

   memcpy (raw, data, size < sizeof raw ? size : sizeof raw);
   for (int i = 3; i >= 0; i--)
      lane = lane << 8 | raw[i];
   for (int i = 11; i >= 4; i--)
      e = e << 8 | raw[i];
   for (int i = 15; i >= 12; i--)
      c = c << 8 | raw[i];
   l.lane_id = lane;
   l.epoch = (int64_t) e;
   l.claims = (int32_t) c;

   /* A guard byte past the declared size must survive. */
   token[OUTBOX_LEASE_TOKEN_MAX] = 'G';
   outbox_lease_format (&l, token);
   CHECK (token[OUTBOX_LEASE_TOKEN_MAX] == 'G');
   CHECK (memchr (token, '\0', OUTBOX_LEASE_TOKEN_MAX) != NULL);
   in_range = l.lane_id < OUTBOX_LANES && l.epoch >= 1 && l.claims >= 0;
   CHECK (outbox_lease_parse (token, &back) == in_range);
   if (in_range)
      CHECK (back.lane_id == l.lane_id && back.epoch == l.epoch && back.claims == l.claims);
   check_token (token);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   char *token;
   size_t n;

   if (size < 1)
      return 0;
   if (data[0] & 1) {
      check_fields (data + 1, size - 1);
      return 0;
   }
   data++;
   size--;
   n = 0;
   while (n < size && data[n])
      n++;
   /* An exact-size heap copy, so ASan sees any read past the end. */
   token = malloc (n + 1);
   CHECK (token);
   memcpy (token, data, n);
   token[n] = '\0';
   check_token (token);
   free (token);
   check_gate (NULL, false);
   return 0;
}
