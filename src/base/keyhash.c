/*
 * base/keyhash.c - SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast
 * short-input PRF") under a per-process random key (see base/keyhash.h).
 *
 * The key comes from getrandom (the kernel's CSPRNG; it waits only while
 * the pool is not yet initialised, early at boot).  Should that fail, the
 * process stops: a hash anyone can predict is what this module exists to
 * prevent, and a silent fallback would hide it.
 */
#include "base/keyhash.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static uint8_t keyhash_key[KEYHASH_KEY_LEN];
static pthread_once_t keyhash_once = PTHREAD_ONCE_INIT;

static void
keyhash_draw (void)
{
   size_t got = 0;

   while (got < sizeof keyhash_key) {
      ssize_t n = getrandom (keyhash_key + got, sizeof keyhash_key - got, 0);

      if (n < 0 && errno == EINTR)
         continue;
      if (n <= 0) {
         /* No logger here: base/log may not be set up yet, and this
          * cannot wait for it. */
         static const char msg[] = "relaybus-proxy: getrandom failed: no key for the hash of client keys\n";
         if (write (STDERR_FILENO, msg, sizeof msg - 1) < 0) {
            /* Aborting anyway. */
         }
         abort ();
      }
      got += (size_t) n;
   }
}

void
keyhash_init (void)
{
   pthread_once (&keyhash_once, keyhash_draw);
}

static inline uint64_t
rotl (uint64_t x, int b)
{
   return (x << b) | (x >> (64 - b));
}

static inline uint64_t
load_le64 (const uint8_t *p)
{
   uint64_t v = 0;

   for (int i = 7; i >= 0; i--)
      v = (v << 8) | p[i];
   return v;
}

#define SIPROUND                  \
   do {                           \
      v0 += v1;                   \
      v1 = rotl (v1, 13);         \
      v1 ^= v0;                   \
      v0 = rotl (v0, 32);         \
      v2 += v3;                   \
      v3 = rotl (v3, 16);         \
      v3 ^= v2;                   \
      v0 += v3;                   \
      v3 = rotl (v3, 21);         \
      v3 ^= v0;                   \
      v2 += v1;                   \
      v1 = rotl (v1, 17);         \
      v1 ^= v2;                   \
      v2 = rotl (v2, 32);         \
   } while (0)

uint64_t
keyhash_siphash24 (const uint8_t key[KEYHASH_KEY_LEN], const void *data, size_t len)
{
   const uint8_t *in = data;
   uint64_t k0 = load_le64 (key), k1 = load_le64 (key + 8);
   uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
   uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
   uint64_t b = (uint64_t) len << 56, m;
   size_t whole = len - len % 8;

   for (size_t i = 0; i < whole; i += 8) {
      m = load_le64 (in + i);
      v3 ^= m;
      SIPROUND;
      SIPROUND;
      v0 ^= m;
   }
   /* The last 0-7 bytes, little-endian, under the length byte. */
   for (size_t i = len % 8; i > 0; i--)
      b |= (uint64_t) in[whole + i - 1] << (8 * (i - 1));
   v3 ^= b;
   SIPROUND;
   SIPROUND;
   v0 ^= b;
   v2 ^= 0xff;
   SIPROUND;
   SIPROUND;
   SIPROUND;
   SIPROUND;
   return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t
keyhash (const void *data, size_t len)
{
   keyhash_init ();
   return keyhash_siphash24 (keyhash_key, data, len);
}
