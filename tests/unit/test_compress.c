/*
 * test_compress.c - unit tests of src/codec/compress.c and of OP_COMPRESSED framing
 * in src/codec/wire.c (wire_compress / wire_decompress).
 *
 * Inputs and outputs live in heap buffers of exactly their size, so an
 * over-read or over-write by a decompressor shows up under ASan/valgrind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "codec/compress.h"
#include "codec/wire.h"

static const int real_ids[] = {COMPRESS_SNAPPY, COMPRESS_ZLIB, COMPRESS_ZSTD};
static const int all_ids[] = {COMPRESS_NOOP, COMPRESS_SNAPPY, COMPRESS_ZLIB, COMPRESS_ZSTD};
#define NELEM(a) (sizeof (a) / sizeof (a)[0])

/* ------------------------------------------------------------ inputs */

typedef struct {
   const char *name;
   uint8_t *data;
   size_t len;
} input_t;

static input_t inputs[5];

static uint8_t *
dup_bytes (const uint8_t *p, size_t n)
{
   uint8_t *d = malloc (n ? n : 1);
   assert_non_null (d);
   if (n) {
      memcpy (d, p, n);
   }
   return d;
}

static int
setup_inputs (void **state)
{
   static const size_t big = 200 * 1024;
   uint8_t *b;
   uint32_t x = 12345;

   inputs[0] = (input_t){"empty", dup_bytes (NULL, 0), 0};
   inputs[1] = (input_t){"one byte", dup_bytes ((const uint8_t *) "x", 1), 1};
   inputs[2] = (input_t){"text", dup_bytes ((const uint8_t *) "hello hello hello hello", 23), 23};
   b = malloc (big);
   for (size_t i = 0; i < big; i++) {
      b[i] = (uint8_t) "abcdefgh"[(i / 7) % 8];
   }
   inputs[3] = (input_t){"200 KiB repetitive", b, big};
   b = malloc (64 * 1024);
   for (size_t i = 0; i < 64 * 1024; i++) {
      x = x * 1103515245u + 12345u;
      b[i] = (uint8_t) (x >> 16);
   }
   inputs[4] = (input_t){"64 KiB random", b, 64 * 1024};
   return 0;
}

static int
teardown_inputs (void **state)
{
   for (size_t i = 0; i < NELEM (inputs); i++) {
      free (inputs[i].data);
   }
   return 0;
}

/* Compresses `in` with `id` into an exactly-sized heap buffer. */
static uint8_t *
compress_exact (int id, int level, const uint8_t *in, size_t len, size_t *clen)
{
   size_t cap = compress_bound (id, len);
   uint8_t *tmp = malloc (cap ? cap : 1);
   uint8_t *out;
   bson_error_t err;

   assert_non_null (tmp);
   if (!compress_buffer (id, level, in, len, tmp, cap, clen, &err)) {
      fail_msg ("%s: %s", compress_name (id), err.message);
   }
   out = dup_bytes (tmp, *clen);
   free (tmp);
   return out;
}

/* ------------------------------------------------------------ names */

static void
test_names (void **state)
{
   static const struct {
      int id;
      const char *name;
   } names[] = {
      {COMPRESS_NOOP, "noop"},
      {COMPRESS_SNAPPY, "snappy"},
      {COMPRESS_ZLIB, "zlib"},
      {COMPRESS_ZSTD, "zstd"},
   };

   for (size_t i = 0; i < NELEM (names); i++) {
      assert_string_equal (compress_name (names[i].id), names[i].name);
      assert_int_equal (compress_id (names[i].name), names[i].id);
   }
   assert_null (compress_name (-1));
   assert_null (compress_name (4));
   assert_null (compress_name (255));
   assert_int_equal (compress_id ("Zlib"), -1);
   assert_int_equal (compress_id ("lz4"), -1);
   assert_int_equal (compress_id (""), -1);
   assert_int_equal (compress_id (NULL), -1);
   assert_int_equal (compress_bound (7, 100), 0);
}

static void
test_exempt (void **state)
{
   static const struct {
      const char *cmd;
      bool exempt;
   } cmds[] = {
      {"hello", true},
      {"isMaster", true},
      {"ismaster", true},
      {"saslStart", true},
      {"saslContinue", true},
      {"authenticate", true},
      {"getnonce", true},
      {"createUser", true},
      {"updateUser", true},
      {"find", false},
      {"insert", false},
      {"Hello", false},
      {"hello2", false},
      {"", false},
      {NULL, false},
   };

   for (size_t i = 0; i < NELEM (cmds); i++) {
      if (compress_command_is_exempt (cmds[i].cmd) != cmds[i].exempt) {
         fail_msg ("\"%s\" should%s be exempt", cmds[i].cmd ? cmds[i].cmd : "(null)", cmds[i].exempt ? "" : " not");
      }
   }
}

/* ------------------------------------------------------------ buffers */

static void
test_round_trip (void **state)
{
   static const int levels[] = {-1, 1, 6};

   for (size_t k = 0; k < NELEM (all_ids); k++) {
      int id = all_ids[k];
      for (size_t i = 0; i < NELEM (inputs); i++) {
         for (size_t l = 0; l < NELEM (levels); l++) {
            const input_t *in = &inputs[i];
            size_t clen;
            uint8_t *c = compress_exact (id, levels[l], in->data, in->len, &clen);
            uint8_t *back = malloc (in->len ? in->len : 1);
            bson_error_t err;

            assert_true (clen <= compress_bound (id, in->len));
            if (!compress_unbuffer (id, c, clen, back, in->len, &err)) {
               fail_msg ("%s %s: %s", compress_name (id), in->name, err.message);
            }
            assert_memory_equal (back, in->data, in->len);
            if (i == 3 && id != COMPRESS_NOOP) {
               /* Repetitive data really is compressed. */
               assert_true (clen < in->len / 4);
            }
            free (back);
            free (c);
         }
      }
   }
}

/* Every algorithm refuses data that decompresses to another size than the
 * announced one, both larger and smaller. */
static void
test_size_mismatch (void **state)
{
   const input_t *in = &inputs[3];

   for (size_t k = 0; k < NELEM (all_ids); k++) {
      int id = all_ids[k];
      size_t clen;
      uint8_t *c = compress_exact (id, -1, in->data, in->len, &clen);
      static const long deltas[] = {-1, +1, -1000, +1000};

      for (size_t d = 0; d < NELEM (deltas); d++) {
         size_t want = (size_t) ((long) in->len + deltas[d]);
         uint8_t *out = malloc (want);
         bson_error_t err = {0};

         if (compress_unbuffer (id, c, clen, out, want, &err)) {
            fail_msg ("%s accepted %zu bytes announced as %zu", compress_name (id), in->len, want);
         }
         assert_int_equal (err.domain, COMPRESS_ERROR_DOMAIN);
         free (out);
      }
      free (c);
   }
}

/* A stream of a few bytes announced as empty is refused by every
 * algorithm, with and without an output buffer: zlib's uncompress2, given
 * no room, inflates into a byte of its own and reports success. */
static void
test_size_zero (void **state)
{
   static const uint8_t data[] = {'x', 'y', 'z'};

   (void) state;
   for (size_t k = 0; k < NELEM (all_ids); k++) {
      int id = all_ids[k];
      for (size_t len = 1; len <= sizeof data; len++) {
         size_t clen;
         uint8_t *c = compress_exact (id, -1, data, len, &clen);
         uint8_t *out = malloc (1);
         bson_error_t err = {0};

         if (compress_unbuffer (id, c, clen, out, 0, &err))
            fail_msg ("%s accepted %zu bytes announced as 0", compress_name (id), len);
         if (compress_unbuffer (id, c, clen, NULL, 0, &err))
            fail_msg ("%s accepted %zu bytes announced as 0 (no buffer)", compress_name (id), len);
         free (out);
         free (c);
      }
   }
}

/* Corrupt input is refused.  Truncations and garbage for every algorithm;
 * a flipped bit only where the format carries a checksum (zlib's Adler-32):
 * snappy and zstd without a frame checksum may decode a flipped literal to
 * other bytes of the same length, which is not detectable. */
static void
test_corrupt (void **state)
{
   const input_t *in = &inputs[2];

   for (size_t k = 0; k < NELEM (real_ids); k++) {
      int id = real_ids[k];
      size_t clen;
      uint8_t *c = compress_exact (id, -1, in->data, in->len, &clen);
      uint8_t out[64];
      bson_error_t err;

      /* Every truncation. */
      for (size_t n = 0; n < clen; n++) {
         uint8_t *t = dup_bytes (c, n);
         if (compress_unbuffer (id, t, n, out, in->len, &err)) {
            fail_msg ("%s accepted a %zu-byte truncation of %zu", compress_name (id), n, clen);
         }
         free (t);
      }
      /* Garbage of the right announced size. */
      {
         static const uint8_t garbage[] = {0xff, 0xfe, 0xfd, 0x17, 0x00, 0x42, 0x99, 0x01, 0x80, 0x80, 0x80};
         uint8_t *g = dup_bytes (garbage, sizeof garbage);
         assert_false (compress_unbuffer (id, g, sizeof garbage, out, in->len, &err));
         free (g);
      }
      /* Trailing bytes after a complete stream. */
      {
         uint8_t *t = malloc (clen + 3);
         memcpy (t, c, clen);
         memcpy (t + clen, "\x01\x02\x03", 3);
         assert_false (compress_unbuffer (id, t, clen + 3, out, in->len, &err));
         free (t);
      }
      if (id == COMPRESS_ZLIB) {
         for (size_t n = 2; n < clen; n++) {
            uint8_t *t = dup_bytes (c, clen);
            t[n] ^= 0x10;
            if (compress_unbuffer (id, t, clen, out, in->len, &err) && memcmp (out, in->data, in->len) != 0) {
               fail_msg ("zlib decoded a flipped byte %zu to other data without error", n);
            }
            free (t);
         }
      }
      free (c);
   }
}

/* ------------------------------------------------------------ OP_COMPRESSED */

static bson_t *
sample_body (void)
{
   bson_t *b = bson_new ();
   char key[16];

   BSON_APPEND_UTF8 (b, "insert", "c");
   for (int i = 0; i < 50; i++) {
      snprintf (key, sizeof key, "k%d", i);
      BSON_APPEND_UTF8 (b, key, "the same value, again and again");
   }
   BSON_APPEND_UTF8 (b, "$db", "test");
   return b;
}

/* OP_MSG -> OP_COMPRESSED -> OP_MSG with each compressor. */
static void
test_wire_round_trip (void **state)
{
   bson_t *body = sample_body ();
   bson_t *doc = BCON_NEW ("a", BCON_INT32 (1));
   wire_sequence_t seq = {"documents", bson_get_data (doc), doc->len, 1};

   for (size_t k = 0; k < NELEM (all_ids); k++) {
      struct evbuffer *msg = evbuffer_new (), *comp = evbuffer_new (), *back = evbuffer_new ();
      wire_compressed_t wc;
      static wire_msg_t parsed;
      bson_error_t err;
      uint8_t *m, *c;
      size_t mlen, clen;

      assert_true (wire_append_msg (msg, 77, 66, 0, body, &seq, 1));
      mlen = evbuffer_get_length (msg);
      m = evbuffer_pullup (msg, -1);
      if (!wire_compress (m, mlen, (uint8_t) all_ids[k], -1, comp, &err)) {
         fail_msg ("%s: %s", compress_name (all_ids[k]), err.message);
      }
      clen = evbuffer_get_length (comp);
      c = evbuffer_pullup (comp, -1);
      if (all_ids[k] != COMPRESS_NOOP) {
         assert_true (clen < mlen);
      }
      assert_true (wire_parse_compressed (c, clen, &wc, &err));
      assert_int_equal (wc.header.length, (int32_t) clen);
      assert_int_equal (wc.header.opcode, WIRE_OP_COMPRESSED);
      assert_int_equal (wc.header.request_id, 77);
      assert_int_equal (wc.header.response_to, 66);
      assert_int_equal (wc.original_opcode, WIRE_OP_MSG);
      assert_int_equal (wc.uncompressed_size, (int32_t) (mlen - WIRE_HEADER_LEN));
      assert_int_equal (wc.compressor_id, all_ids[k]);
      assert_int_equal (wc.data_len, clen - WIRE_HEADER_LEN - 9);

      /* Appends: something already in `back` stays in front. */
      evbuffer_add (back, "xy", 2);
      if (!wire_decompress (&wc, 0, back, &err)) {
         fail_msg ("%s: %s", compress_name (all_ids[k]), err.message);
      }
      assert_int_equal (evbuffer_get_length (back), 2 + mlen);
      assert_memory_equal (evbuffer_pullup (back, -1) + 2, m, mlen);
      assert_true (wire_parse_msg (evbuffer_pullup (back, -1) + 2, mlen, &parsed, &err));
      assert_true (bson_equal (&parsed.body, body));
      assert_int_equal (parsed.sequences[0].ndocs, 1);

      evbuffer_free (msg);
      evbuffer_free (comp);
      evbuffer_free (back);
   }
   bson_destroy (doc);
   bson_destroy (body);
}

/* Builds an OP_COMPRESSED frame by hand: announced size, id, payload. */
static size_t
frame (uint8_t *b, int32_t original, int32_t size, uint8_t id, const uint8_t *data, size_t dlen)
{
   size_t len = WIRE_HEADER_LEN + 9 + dlen;
   uint32_t v[5] = {(uint32_t) len, 5, 0, WIRE_OP_COMPRESSED, (uint32_t) original};

   for (int i = 0; i < 5; i++) {
      b[i * 4] = (uint8_t) v[i];
      b[i * 4 + 1] = (uint8_t) (v[i] >> 8);
      b[i * 4 + 2] = (uint8_t) (v[i] >> 16);
      b[i * 4 + 3] = (uint8_t) (v[i] >> 24);
   }
   b[20] = (uint8_t) size;
   b[21] = (uint8_t) ((uint32_t) size >> 8);
   b[22] = (uint8_t) ((uint32_t) size >> 16);
   b[23] = (uint8_t) ((uint32_t) size >> 24);
   b[24] = id;
   memcpy (b + 25, data, dlen);
   return len;
}

/* Frames wire_decompress must refuse, leaving `out` as it was. */
static void
test_wire_decompress_refusals (void **state)
{
   const input_t *in = &inputs[3]; /* 200 KiB, compresses well */
   int32_t size = (int32_t) in->len;

   for (size_t k = 0; k < NELEM (all_ids); k++) {
      int id = all_ids[k];
      size_t clen;
      uint8_t *c = compress_exact (id, -1, in->data, in->len, &clen);
      uint8_t *b = malloc (WIRE_HEADER_LEN + 9 + clen);
      const struct {
         const char *what;
         int32_t original;
         int32_t size;
         uint8_t id;
         size_t dlen;
         uint32_t max;
         int code;
      } bad[] = {
         {"announced one more", WIRE_OP_MSG, size + 1, (uint8_t) id, clen, 0, WIRE_ERR_COMPRESSION},
         {"announced one less", WIRE_OP_MSG, size - 1, (uint8_t) id, clen, 0, WIRE_ERR_COMPRESSION},
         {"truncated payload", WIRE_OP_MSG, size, (uint8_t) id, clen / 2, 0, WIRE_ERR_COMPRESSION},
         {"above max", WIRE_OP_MSG, size, (uint8_t) id, clen, (uint32_t) size + 15, WIRE_ERR_TOO_LARGE},
         {"above the default max", WIRE_OP_MSG, WIRE_MAX_MESSAGE_LEN - 15, (uint8_t) id, clen, 0, WIRE_ERR_TOO_LARGE},
         {"huge size", WIRE_OP_MSG, INT32_MAX, (uint8_t) id, clen, 0, WIRE_ERR_TOO_LARGE},
         {"unknown compressor", WIRE_OP_MSG, size, 4, clen, 0, WIRE_ERR_COMPRESSION},
         {"wraps OP_COMPRESSED", WIRE_OP_COMPRESSED, size, (uint8_t) id, clen, 0, WIRE_ERR_OPCODE},
      };

      for (size_t i = 0; i < NELEM (bad); i++) {
         struct evbuffer *out = evbuffer_new ();
         wire_compressed_t wc;
         bson_error_t err = {0};
         size_t len = frame (b, bad[i].original, bad[i].size, bad[i].id, c, bad[i].dlen);

         if (bad[i].original == WIRE_OP_COMPRESSED) {
            /* The parser refuses it already; check decompress on its own. */
            assert_false (wire_parse_compressed (b, len, &wc, &err));
            assert_int_equal (err.code, WIRE_ERR_OPCODE);
            frame (b, WIRE_OP_MSG, bad[i].size, bad[i].id, c, bad[i].dlen);
            assert_true (wire_parse_compressed (b, len, &wc, &err));
            wc.original_opcode = WIRE_OP_COMPRESSED;
         } else {
            assert_true (wire_parse_compressed (b, len, &wc, &err));
         }
         evbuffer_add (out, "keep", 4);
         if (wire_decompress (&wc, bad[i].max, out, &err)) {
            fail_msg ("%s, %s: accepted", compress_name (id), bad[i].what);
         }
         if (err.domain != WIRE_ERROR_DOMAIN || (int) err.code != bad[i].code) {
            fail_msg ("%s, %s: error %" PRIu32 " (%s), expected %d",
                      compress_name (id),
                      bad[i].what,
                      err.code,
                      err.message,
                      bad[i].code);
         }
         assert_int_equal (evbuffer_get_length (out), 4);
         evbuffer_free (out);
      }

      /* And the well-formed frame passes, exactly at the limit. */
      {
         struct evbuffer *out = evbuffer_new ();
         wire_compressed_t wc;
         bson_error_t err;
         size_t len = frame (b, WIRE_OP_MSG, size, (uint8_t) id, c, clen);

         assert_true (wire_parse_compressed (b, len, &wc, &err));
         if (!wire_decompress (&wc, (uint32_t) size + WIRE_HEADER_LEN, out, &err)) {
            fail_msg ("%s: %s", compress_name (id), err.message);
         }
         assert_int_equal (evbuffer_get_length (out), WIRE_HEADER_LEN + in->len);
         assert_memory_equal (evbuffer_pullup (out, -1) + WIRE_HEADER_LEN, in->data, in->len);
         evbuffer_free (out);
      }
      free (b);
      free (c);
   }
}

/* Garbage payloads of every real algorithm, through the wire layer. */
static void
test_wire_corrupt (void **state)
{
   static const uint8_t garbage[] = {0x05, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x02, 0xff, 0xff};

   for (size_t k = 0; k < NELEM (real_ids); k++) {
      uint8_t b[64];
      struct evbuffer *out = evbuffer_new ();
      wire_compressed_t wc;
      bson_error_t err = {0};
      size_t len = frame (b, WIRE_OP_MSG, 5, (uint8_t) real_ids[k], garbage, sizeof garbage);

      assert_true (wire_parse_compressed (b, len, &wc, &err));
      assert_false (wire_decompress (&wc, 0, out, &err));
      assert_int_equal (err.domain, WIRE_ERROR_DOMAIN);
      assert_int_equal (err.code, WIRE_ERR_COMPRESSION);
      assert_int_equal (evbuffer_get_length (out), 0);
      evbuffer_free (out);
   }
}

static void
test_wire_compress_refusals (void **state)
{
   struct evbuffer *out = evbuffer_new ();
   uint8_t b[64];
   bson_error_t err = {0};
   size_t len = frame (b, WIRE_OP_MSG, 5, 0, (const uint8_t *) "abcde", 5);

   /* An OP_COMPRESSED is never compressed again. */
   assert_false (wire_compress (b, len, COMPRESS_ZLIB, -1, out, &err));
   assert_int_equal (err.code, WIRE_ERR_OPCODE);
   /* Length field disagreeing with the buffer. */
   b[12] = (uint8_t) WIRE_OP_MSG;
   b[13] = (uint8_t) (WIRE_OP_MSG >> 8);
   assert_false (wire_compress (b, len - 1, COMPRESS_ZLIB, -1, out, &err));
   assert_int_equal (err.code, WIRE_ERR_SHORT);
   assert_false (wire_compress (b, 10, COMPRESS_ZLIB, -1, out, &err));
   /* Unknown compressor. */
   assert_false (wire_compress (b, len, 9, -1, out, &err));
   assert_int_equal (err.code, WIRE_ERR_COMPRESSION);
   /* A zlib level zlib refuses. */
   assert_false (wire_compress (b, len, COMPRESS_ZLIB, 42, out, &err));
   assert_int_equal (err.code, WIRE_ERR_COMPRESSION);
   assert_int_equal (evbuffer_get_length (out), 0);
   evbuffer_free (out);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_names),
      cmocka_unit_test (test_exempt),
      cmocka_unit_test (test_round_trip),
      cmocka_unit_test (test_size_mismatch),
      cmocka_unit_test (test_size_zero),
      cmocka_unit_test (test_corrupt),
      cmocka_unit_test (test_wire_round_trip),
      cmocka_unit_test (test_wire_decompress_refusals),
      cmocka_unit_test (test_wire_corrupt),
      cmocka_unit_test (test_wire_compress_refusals),
   };

   return cmocka_run_group_tests_name ("compress", tests, setup_inputs, teardown_inputs);
}
