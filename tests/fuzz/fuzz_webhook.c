/*
 * fuzz_webhook.c - libFuzzer target for what the proxy reads from a
 * webhook endpoint's answer, and the secret it signs with.
 *
 * Input: bytes 0-1 the HTTP status (little-endian, modulo 1000), byte 2
 * flags (bit 0 retry_4xx, bits 1-6 a small buffer size, bit 7 sign with
 * the secret: HMAC is most of the time of an input), bytes 3-4 an offset in seconds added to the
 * reference clock; then the Retry-After header's value up to the first
 * NUL, then the answer's body (any bytes).  The header value is also tried
 * as a handler secret.
 *
 * Oracles (abort() on failure):
 *   - the lastError text of the answer (webhook_error_text, what
 *     req_done_cb stores): "HTTP <status>", then at most
 *     WEBHOOK_ERROR_BODY_MAX bytes of body; always within the buffer,
 *     valid UTF-8 by libbson's own validator (what the JSON encoder of
 *     /api/deliveries needs), no control characters; the same from the
 *     whole body as from the WEBHOOK_ERROR_BODY_MAX + 3 bytes req_done_cb
 *     copies out; a body that is clean UTF-8 is kept to its last whole
 *     character that fits; tried with small buffers too;
 *   - base/utf8.h, which that text goes through: utf8_valid agrees with
 *     bson_utf8_validate, utf8_char_len with it character by character,
 *     and utf8_sanitize/utf8_repair output is valid, bounded and keeps a
 *     valid input unchanged;
 *   - classification: 0 and 5xx retry, 2xx complete, 429/503 retry-after,
 *     every other answer retried with retry_4xx, dead without;
 *   - Retry-After: a delay in [0, WEBHOOK_RETRY_AFTER_MAX_MS]; delay
 *     seconds give exactly that many (clamped) whatever the clock; a date
 *     gives a delay that moves with the clock, millisecond for
 *     millisecond, until it is clamped; the same input gives the same
 *     answer;
 *   - backoff within [0, min(cap, base * 2^(attempt-1))];
 *   - (bit 7) a secret that decodes gives 1..WEBHOOK_KEY_MAX bytes, and its
 *     signature is "v1," and 44 base64 characters, the same each time.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "base/utf8.h"
#include "dispatch/delivery.h"
#include "dispatch/webhook.h"

#define NOW_MS 1767225600000LL /* 2026-01-01T00:00:00Z */

static bool
clean_text (const char *s)
{
   for (; *s; s++)
      if ((unsigned char) *s < 0x20 || *s == 0x7f)
         return false;
   return true;
}

static void
check_utf8 (const uint8_t *body, size_t len)
{
   const char *b = (const char *) body;
   bool valid = utf8_valid (b, len);
   size_t n, cap = len * 3 + 1;
   char *out = malloc (cap), *rep;

   CHECK (out);
   CHECK (valid == bson_utf8_validate (b, len, false));
   for (size_t i = 0; i < len; i += n ? n : 1) {
      n = utf8_char_len (b + i, len - i);
      CHECK (n <= 4 && n <= len - i);
      /* A character is exactly what libbson takes as one (NUL apart:
       * libbson refuses it in strings, and with allow_null takes the
       * overlong C0 80 for it, which is no character here). */
      if (n)
         CHECK (bson_utf8_validate (b + i, n, false) || b[i] == '\0');
      else
         for (size_t k = 1; k <= 4 && k <= len - i; k++)
            CHECK (!bson_utf8_validate (b + i, k, false));
   }
   n = utf8_sanitize (b, len, out, cap, 0);
   CHECK (n < cap && out[n] == '\0' && strlen (out) == n);
   CHECK (bson_utf8_validate (out, n, false));
   if (valid)
      CHECK (n == len && memcmp (out, b, len) == 0);
   rep = utf8_repair (b, len);
   CHECK (strcmp (rep, out) == 0);
   bson_free (rep);
   n = utf8_sanitize (b, len, out, cap, UTF8_CONTROLS_AS_SPACE);
   CHECK (bson_utf8_validate (out, n, false) && clean_text (out));
   free (out);
}

static void
check_error_text (int status, const uint8_t *body, size_t len, size_t small)
{
   char out[WEBHOOK_ERROR_MAX], cut[WEBHOOK_ERROR_MAX], tiny[64], head[32];
   const char *b = (const char *) body;
   size_t n, hn, copied = len < WEBHOOK_ERROR_BODY_MAX + 3 ? len : WEBHOOK_ERROR_BODY_MAX + 3;

   hn = (size_t) snprintf (head, sizeof head, "HTTP %d", status);
   webhook_error_text (status, b, len, out, sizeof out);
   n = strlen (out);
   CHECK (n < sizeof out);
   CHECK (strncmp (out, head, hn) == 0);
   CHECK (bson_utf8_validate (out, n, false) && clean_text (out));
   if (len == 0) {
      CHECK (n == hn);
   } else if (n > hn) {
      CHECK (out[hn] == ':' && out[hn + 1] == ' ');
      CHECK (n - hn - 2 <= WEBHOOK_ERROR_BODY_MAX);
   }
   /* What req_done_cb copies out of the answer gives the same text. */
   webhook_error_text (status, b, copied, cut, sizeof cut);
   CHECK (strcmp (out, cut) == 0);
   /* Clean UTF-8 is kept as it is, to its last character that fits. */
   if (len > 0 && utf8_valid (b, len)) {
      size_t keep = 0, k;
      bool clean = true;

      while (keep < len && (k = utf8_char_len (b + keep, len - keep)) && keep + k <= WEBHOOK_ERROR_BODY_MAX)
         keep += k;
      for (size_t i = 0; i < keep; i++)
         clean &= (unsigned char) b[i] >= 0x20 && b[i] != 0x7f;
      if (clean && keep > 0)
         CHECK (n == hn + 2 + keep && memcmp (out + hn + 2, b, keep) == 0);
   }
   /* Any buffer size: terminated inside it, still valid. */
   small = small % sizeof tiny + 1;
   memset (tiny, 'X', sizeof tiny);
   webhook_error_text (status, b, len, tiny, small);
   CHECK (memchr (tiny, '\0', small) != NULL);
   CHECK (bson_utf8_validate (tiny, strlen (tiny), false) && clean_text (tiny));
   for (size_t i = small; i < sizeof tiny; i++)
      CHECK (tiny[i] == 'X');
}

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
   else if (status == 410)
      want = WEBHOOK_OUTCOME_GONE; /* the handler is disabled, whatever retry_4xx says */
   else
      want = retry_4xx ? WEBHOOK_OUTCOME_RETRY : WEBHOOK_OUTCOME_DEAD;
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
   /* The default retry_schedule, and one with a zero delay. */
   static const int64_t delays[] = {5000, 300000, 1800000, 7200000, 18000000, 36000000, 36000000};
   static const int64_t zero[] = {0};
   size_t n = sizeof delays / sizeof delays[0];
   int64_t cap = delays[attempt >= 1 && (size_t) attempt <= n ? attempt - 1 : attempt < 1 ? 0 : (int32_t) n - 1];
   int64_t b = delivery_backoff_ms (delays, n, attempt, rnd);

   CHECK (b >= 0 && b <= cap);
   CHECK (delivery_backoff_ms (zero, 1, attempt, rnd) == 0);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   int status;
   uint8_t flags;
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
   flags = data[2];
   retry_4xx = flags & 1;
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
   /* The decoder is local (a character is at most 4 bytes): a longer body
    * would only spend the time on instrumented loops. */
   check_utf8 (body, body_len < 512 ? body_len : 512);
   check_error_text (status, body, body_len, (flags >> 1) & 0x3f);
   check_retry_after (header, now);
   if (flags & 0x80)
      check_secret (header, body, body_len);
   for (size_t i = 0; i < 8 && i < body_len; i++)
      rnd = rnd << 8 | body[i];
   check_backoff ((int32_t) (status % 40) - 2, rnd);

   free (header);
   free ((void *) body);
   return 0;
}
