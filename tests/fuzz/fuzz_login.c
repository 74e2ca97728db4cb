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
 *      user it knows, the guess is taken (authlimit_take) as saslStart
 *      takes it;
 *   1: a proof of an open conversation (op / 4 picks it) is wrong: its
 *      guess is spent (authlimit_spend);
 *   2: one is right, or ends unchecked: its guess is given back
 *      (authlimit_refund);
 *   3: the delay of an open conversation's user (authlimit_delay_ms).
 * Oracles, against a model that keeps every counted guess and failure
 * with its time: a guess is taken exactly when fewer than the limit of
 * its (user, address) pair count (counted in the last 7 buckets of 10 s),
 * so never more than the limit in any minute however they interleave; a
 * refused guess holds nothing; the delay is exactly 0 below the limit
 * and min(cap, 100 ms * 2^(failures - limit)) from it.  Sixteen users on
 * sixteen addresses fit the table without reuse, so the model is exact.
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
   int64_t bucket;
   bool alive;
} guess_t;

typedef struct {
   int user, addr;
   int guess; /* its entry in the model */
   authlimit_ticket_t ticket;
} open_t;

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

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   static const uint8_t key[AUTHLIMIT_KEY_BYTES] = "fuzz-login-key!";
   static guess_t guesses[MAX_RECORDS];
   static int64_t failures[N_USERS][MAX_RECORDS];
   int n_failures[N_USERS] = {0};
   open_t open[MAX_OPEN];
   int n_open = 0, n_guesses = 0, records = 0;
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
         uint32_t model = 0, counted;
         bool first;
         authlimit_ticket_t t;
         for (int g = 0; g < n_guesses; g++)
            model += guesses[g].alive && guesses[g].user == user && guesses[g].addr == addr &&
                     in_ring (guesses[g].bucket, now);
         bool taken = authlimit_take (al, name, addrs[addr], limit, now, &t,
                                      &counted, &first);
         CHECK (taken == (model < limit));
         CHECK (counted == model);
         CHECK (t.held == taken);
         if (!taken)
            continue;
         guesses[n_guesses] = (guess_t) {user, addr, now / AUTHLIMIT_BUCKET_MS, true};
         open[n_open++] = (open_t) {user, addr, n_guesses++, t};
      } else if (n_open > 0) {
         int i = (op / 4) % n_open;
         open_t *o = &open[i];
         char name[16];

         snprintf (name, sizeof name, "user%d", o->user);
         if (op % 4 == 1) {
            authlimit_spend (al, &o->ticket, name, now);
            failures[o->user][n_failures[o->user]++] = now / AUTHLIMIT_BUCKET_MS;
         } else if (op % 4 == 2) {
            authlimit_refund (al, &o->ticket, now);
            guesses[o->guess].alive = false;
         } else {
            int64_t want = 0;
            uint32_t f = 0;
            for (int k = 0; k < n_failures[o->user]; k++)
               f += in_ring (failures[o->user][k], now);
            if (f >= limit)
               want = f - limit >= 6 ? CAP_MS : 100LL << (f - limit);
            if (want > CAP_MS)
               want = CAP_MS;
            CHECK (authlimit_delay_ms (al, name, limit, CAP_MS, now) == want);
            CHECK (authlimit_delay_ms (al, name, limit, 0, now) == 0);
            continue;
         }
         CHECK (!o->ticket.held);
         open[i] = open[--n_open];
      }
   }
   authlimit_destroy (al);
   return 0;
}
