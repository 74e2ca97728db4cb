/*
 * fuzz_webhook.c - libFuzzer target for what the proxy reads from a
 * webhook endpoint's answer, and the secret it signs with.
 *
 * Input: bytes 0-1 the HTTP status (little-endian, modulo 1000), byte 2
 * flags (bit 0 retry_4xx), bytes 3-4 an offset in seconds added to the
 * reference clock; then the Retry-After header's value up to the first
 * NUL, then the answer's body (any bytes).  The header value is also tried
 * as a handler secret.
 *
 * Oracles (abort() on failure):
 *   - classification: 0 and 5xx retry, 2xx complete, 429/503 retry-after,
 *     4xx dead unless retry_4xx, everything else dead;
 *   - Retry-After: a delay in [0, WEBHOOK_RETRY_AFTER_MAX_MS]; delay
 *     seconds give exactly that many (clamped) whatever the clock; a date
 *     gives a delay that moves with the clock, millisecond for
 *     millisecond, until it is clamped; the same input gives the same
 *     answer;
 *   - backoff within [0, min(cap, base * 2^(attempt-1))];
 *   - a secret that decodes gives 1..WEBHOOK_KEY_MAX bytes, and its
 *     signature is "v1," and 44 base64 characters, the same each time.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "webhook.h"

#define NOW_MS 1767225600000LL /* 2026-01-01T00:00:00Z */

static void
check_classify (int status, bool retry_4xx)
{
   webhook_outcome_t o = webhook_classify (status, retry_4xx), want;

   if (status == 0 || (status >= 500 && status < 600 && status != 503))
      want = WEBHOOK_OUTCOME_RETRY;
   else if (status >= 200 && status < 300)
      want = WEBHOOK_OUTCOME_COMPLETE;
   else if (status == 429 || status == 503)
      want = WEBHOOK_OUTCOME_RETRY_AFTER;
   else if (status >= 400 && status < 500)
      want = retry_4xx ? WEBHOOK_OUTCOME_RETRY : WEBHOOK_OUTCOME_DEAD;
   else
      want = WEBHOOK_OUTCOME_DEAD;
   CHECK (o == want);
   CHECK (strcmp (webhook_outcome_name (o), "?") != 0);
}

/* Delay seconds: digits with optional surrounding whitespace.  Returns
 * true with the expected delay when `v` is that form. */
static bool
delay_seconds (const char *v, int64_t *ms)
{
   const int64_t max_s = WEBHOOK_RETRY_AFTER_MAX_MS / 1000;
   int64_t s = 0;
   bool digits = false, big = false;

   while (*v == ' ' || (*v >= '\t' && *v <= '\r'))
      v++;
   for (; *v >= '0' && *v <= '9'; v++) {
      digits = true;
      if (!big && s > (max_s - (*v - '0')) / 10)
         big = true;
      if (!big)
         s = s * 10 + (*v - '0');
   }
   while (*v == ' ' || (*v >= '\t' && *v <= '\r'))
      v++;
   if (!digits || *v)
      return false;
   *ms = big ? WEBHOOK_RETRY_AFTER_MAX_MS : s * 1000;
   return true;
}

static void
check_retry_after (const char *v, int64_t now)
{
   int64_t d = -7, d2 = -7, later = -7, want;
   bool ok = webhook_parse_retry_after (v, now, &d);

   CHECK (!webhook_parse_retry_after (NULL, now, &d2));
   CHECK (webhook_parse_retry_after (v, now, &d2) == ok);
   if (!ok) {
      CHECK (!delay_seconds (v, &want));
      return;
   }
   CHECK (d == d2);
   CHECK (d >= 0 && d <= WEBHOOK_RETRY_AFTER_MAX_MS);
   if (delay_seconds (v, &want)) {
      CHECK (d == want);
      CHECK (webhook_parse_retry_after (v, now + 123456, &later) && later == d);
      return;
   }
   /* A date: 1.5 s later it is 1.5 s closer, unless clamped at either end. */
   CHECK (webhook_parse_retry_after (v, now + 1500, &later));
   CHECK (later <= d);
   if (d > 1500 && d < WEBHOOK_RETRY_AFTER_MAX_MS)
      CHECK (later == d - 1500);
}

static void
check_secret (const char *secret, const uint8_t *body, size_t body_len)
{
   uint8_t key[WEBHOOK_KEY_MAX];
   size_t key_len = 0;
   char sig[WEBHOOK_SIGNATURE_MAX + 1], sig2[WEBHOOK_SIGNATURE_MAX];

   if (!webhook_secret_decode (secret, key, &key_len))
      return;
   CHECK (key_len >= 1 && key_len <= WEBHOOK_KEY_MAX);
   if (strncmp (secret, "whsec_", 6) != 0)
      CHECK (key_len == strlen (secret) && memcmp (key, secret, key_len) == 0);
   sig[WEBHOOK_SIGNATURE_MAX] = 'G';
   webhook_sign (key, key_len, "msg_1", 1767225600, (const char *) body, body_len, sig);
   CHECK (sig[WEBHOOK_SIGNATURE_MAX] == 'G');
   CHECK (strlen (sig) == 3 + 44 && strncmp (sig, "v1,", 3) == 0);
   for (size_t i = 3; i < 3 + 44; i++)
      CHECK ((sig[i] >= 'A' && sig[i] <= 'Z') || (sig[i] >= 'a' && sig[i] <= 'z') ||
             (sig[i] >= '0' && sig[i] <= '9') || sig[i] == '+' || sig[i] == '/' || sig[i] == '=');
   webhook_sign (key, key_len, "msg_1", 1767225600, (const char *) body, body_len, sig2);
   CHECK (strcmp (sig, sig2) == 0);
}

static void
check_backoff (int32_t attempt, uint64_t rnd)
{
   int64_t cap = WEBHOOK_BACKOFF_BASE_MS, b = webhook_backoff_ms (attempt, rnd);

   for (int32_t i = 1; i < attempt && cap < WEBHOOK_BACKOFF_CAP_MS; i++)
      cap *= 2;
   if (cap > WEBHOOK_BACKOFF_CAP_MS)
      cap = WEBHOOK_BACKOFF_CAP_MS;
   CHECK (b >= 0 && b <= cap);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   int status;
   bool retry_4xx;
   int64_t now;
   size_t hlen;
   char *header;
   const uint8_t *body;
   size_t body_len;
   uint64_t rnd = 0;

   if (size < 5)
      return 0;
   status = (int) ((uint32_t) data[0] | (uint32_t) data[1] << 8) % 1000;
   retry_4xx = data[2] & 1;
   now = NOW_MS + ((int64_t) data[3] | (int64_t) data[4] << 8) * 1000;
   data += 5;
   size -= 5;
   for (hlen = 0; hlen < size && data[hlen]; hlen++)
      ;
   /* Exact-size heap copies, so ASan sees any read past the end. */
   header = malloc (hlen + 1);
   CHECK (header);
   memcpy (header, data, hlen);
   header[hlen] = '\0';
   body_len = hlen < size ? size - hlen - 1 : 0;
   body = malloc (body_len ? body_len : 1);
   CHECK (body);
   if (body_len)
      memcpy ((uint8_t *) body, data + hlen + 1, body_len);

   check_classify (status, retry_4xx);
   check_retry_after (header, now);
   check_secret (header, body, body_len);
   for (size_t i = 0; i < 8 && i < body_len; i++)
      rnd = rnd << 8 | body[i];
   check_backoff ((int32_t) (status % 40) - 2, rnd);

   free (header);
   free ((void *) body);
   return 0;
}
