/*
 * fuzz_login.c - libFuzzer target for pooled mode's login limit: the path
 * proxy/login.c takes for each conversation, with the conversation's
 * client-first from the input, against a model of what the limit allows.
 *
 * The first byte sets auth_failures_per_minute (1 to 8).  Then records:
 *   [op] [dt] [addr] [len] [len bytes]
 * dt moves the clock by dt * 137 ms; addr % 16 picks the client address.
 * op % 4:
 *   0: a conversation starts: the bytes are client-first, parsed by
 *      scram_server_first against sixteen users (user0 .. user15); for a
 *      user it knows, saslStart asks whether its proof would be checked
 *      (authlimit_allowed), which counts nothing;
 *   1: a proof of an open conversation (op / 8 picks it) is wrong, checked
 *      under the limit (authlimit_check with a check that fails), or, for
 *      op / 4 odd, its step is malformed (authlimit_fail);
 *   2: one is right (authlimit_check with a check that passes);
 *   3: the delay of an open conversation's user (authlimit_delay_ms).
 * Oracles, against a model that keeps every failure with its time: a
 * proof is checked (its check called) exactly when fewer than the limit of
 * its (user, address) pair's failures count (in the last 7 buckets of
 * 10 s), so never more than the limit fail in any minute however they
 * interleave; a right proof counts nothing; authlimit_allowed says the
 * same without counting; the delay is exactly 0 below the limit and
 * min(cap, 100 ms * 2^(failures - limit)) from it, over the user's
 * failures from every address.  Sixteen users on sixteen addresses fit
 * the table without reuse, so the model is exact.
 */
#include <string.h>

#include "base/authfile.h"
#include "base/authlimit.h"
#include "codec/scram.h"
#include "fuzz_util.h"

#define N_USERS 16
#define N_ADDRS 16
#define MAX_OPEN 32
#define MAX_RECORDS 512
#define CAP_MS 5000

typedef struct {
   int user, addr;
} open_t;

/* The model: each failure's pair and bucket. */
typedef struct {
   int user, addr;
   int64_t bucket;
} failure_t;

static int check_calls;

static bool
proof_right (void *arg)
{
   check_calls++;
   return *(const bool *) arg;
}

static authfile_t *
users_table (void)
{
   static authfile_t *users;
   bson_error_t error;

   if (!users) {
      bson_string_t *s = bson_string_new (NULL);
      for (int i = 0; i < N_USERS; i++)
         bson_string_append_printf (s,
                                    "user%d:SCRAM-SHA-256:4096:W22ZaJ0SNY7soEsUEjb6gQ==:"
                                    "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
                                    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=\n",
                                    i);
      users = authfile_parse (s->str, s->len, "fuzz", &error);
      CHECK (users && authfile_count (users) == N_USERS);
      bson_string_free (s, true);
   }
   return users;
}

static int
in_ring (int64_t bucket, int64_t now)
{
   return now / AUTHLIMIT_BUCKET_MS - bucket < AUTHLIMIT_BUCKETS;
}

static uint32_t
pair_failures (const failure_t *f, int n, int user, int addr, int64_t now)
{
   uint32_t c = 0;

   for (int i = 0; i < n; i++)
      c += f[i].user == user && f[i].addr == addr && in_ring (f[i].bucket, now);
   return c;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   static const uint8_t key[AUTHLIMIT_KEY_BYTES] = "fuzz-login-key!";
   static failure_t failures[MAX_RECORDS];
   open_t open[MAX_OPEN];
   int n_open = 0, n_failures = 0, records = 0;
   authlimit_t *al;
   uint32_t limit;
   int64_t now = 1000000000;
   size_t at = 1;
   char addrs[N_ADDRS][16];

   if (size < 1)
      return 0;
   limit = 1 + data[0] % 8;
   for (int i = 0; i < N_ADDRS; i++)
      snprintf (addrs[i], sizeof addrs[i], "10.0.0.%d", i);
   al = authlimit_new (key);
   while (at + 4 <= size && records++ < MAX_RECORDS) {
      uint8_t op = data[at], dt = data[at + 1], addr = data[at + 2] % N_ADDRS, len = data[at + 3];
      const uint8_t *msg = data + at + 4;

      if (at + 4 + len > size)
         len = (uint8_t) (size - at - 4);
      at += 4 + (size_t) len;
      now += (int64_t) dt * 137;

      if (op % 4 == 0) {
         scram_server_t *conv = scram_server_new (AUTHFILE_SCRAM_SHA_256);
         char *out = NULL;
         size_t out_len;
         bson_error_t error;
         char name[AUTHFILE_MAX_NAME + 1] = "";
         int user = -1;

         /* As saslStart: only a user of the auth file gets this far. */
         if (scram_server_first (conv, users_table (), msg, len, &out, &out_len, &error)) {
            bson_strncpy (name, scram_server_user (conv), sizeof name);
            CHECK (sscanf (name, "user%d", &user) == 1 && user >= 0 && user < N_USERS);
         }
         bson_free (out);
         scram_server_destroy (conv);
         if (user < 0 || n_open == MAX_OPEN)
            continue;
         uint32_t model = pair_failures (failures, n_failures, user, addr, now), counted;
         bool first;
         CHECK (authlimit_allowed (al, name, addrs[addr], limit, now, &counted, &first) == (model < limit));
         CHECK (counted == model);
         CHECK (pair_failures (failures, n_failures, user, addr, now) == model);
         open[n_open++] = (open_t) {user, addr};
      } else if (n_open > 0) {
         int i = (op / 8) % n_open;
         open_t *o = &open[i];
         char name[16];
         uint32_t model = pair_failures (failures, n_failures, o->user, o->addr, now), counted;
         bool first;

         snprintf (name, sizeof name, "user%d", o->user);
         if (op % 4 == 1 && (op / 4) % 2 == 1) {
            /* A malformed step: counted whatever the pair's count. */
            authlimit_fail (al, name, addrs[o->addr], now);
            if (n_failures < MAX_RECORDS)
               failures[n_failures++] = (failure_t) {o->user, o->addr, now / AUTHLIMIT_BUCKET_MS};
         } else if (op % 4 == 1 || op % 4 == 2) {
            bool right = op % 4 == 2;
            int calls = check_calls;
            authlimit_verdict_t v =
               authlimit_check (al, name, addrs[o->addr], limit, now, proof_right, &right, &counted, &first);
            CHECK (counted == model);
            if (model >= limit) {
               /* Refused: the proof is not even checked. */
               CHECK (v == AUTHLIMIT_REFUSED);
               CHECK (check_calls == calls);
            } else {
               CHECK (check_calls == calls + 1);
               CHECK (v == (right ? AUTHLIMIT_PASSED : AUTHLIMIT_FAILED));
               if (!right && n_failures < MAX_RECORDS)
                  failures[n_failures++] = (failure_t) {o->user, o->addr, now / AUTHLIMIT_BUCKET_MS};
            }
         } else {
            int64_t want = 0;
            uint32_t f = 0;
            for (int k = 0; k < n_failures; k++)
               f += failures[k].user == o->user && in_ring (failures[k].bucket, now);
            CHECK (authlimit_user_failures (al, name, now) == f);
            if (f >= limit)
               want = f - limit >= 6 ? CAP_MS : 100LL << (f - limit);
            if (want > CAP_MS)
               want = CAP_MS;
            CHECK (authlimit_delay_ms (al, name, limit, CAP_MS, now) == want);
            CHECK (authlimit_delay_ms (al, name, limit, 0, now) == 0);
            continue;
         }
         open[i] = open[--n_open];
      }
   }
   authlimit_destroy (al);
   return 0;
}
