/*
 * fuzz_compressed.c - libFuzzer target for OP_COMPRESSED: the framing
 * (wire_parse_compressed), decompression (wire_decompress, hence
 * compress_unbuffer) for each compressor, and compression round trips.
 *
 * fuzz_wire reaches OP_COMPRESSED only when the fuzzer writes a whole frame
 * whose announced size matches its data; here the frame is built from
 * fields, so every input exercises a decompressor:
 *   byte 0      compressor id, as sent (ids above 3 are unknown ones);
 *   byte 1      bits 0-2 the original opcode (table below), bits 3-4 the
 *               zlib/zstd level of the round trip;
 *   bytes 2-5   uncompressedSize, int32 little-endian, as sent;
 *   the rest    the compressed payload.
 *
 * Oracles (abort() on failure):
 *   - the parsed frame has the fields that were written, and its data is
 *     the payload;
 *   - wire_decompress succeeds exactly when the compressor's own library
 *     (called here directly, with a larger buffer) decodes the whole
 *     payload to exactly uncompressedSize bytes; the rebuilt message has
 *     the original opcode, the frame's ids and the library's bytes;
 *   - it is tried again with the size the library found, which must work;
 *   - on failure `out` is left as it was and the error is in the wire
 *     domain;
 *   - the payload, taken as a message body, survives compress ->
 *     OP_COMPRESSED -> decompress with the compressor of byte 0 (modulo 4),
 *     stays within compress_bound, and a wrong expected size is refused.
 */
#include <stdint.h>
#include <string.h>

#include <event2/buffer.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include "codec/compress.h"
#include "fuzz_util.h"
#include "codec/wire.h"

/* Keeps one input's memory small: the announced size may be 2 GB. */
#define FUZZ_CAP (1u << 20)
#define PREFIX_LEN 9 /* originalOpcode, uncompressedSize, compressorId */

static const int32_t opcodes[8] = {
   WIRE_OP_MSG, WIRE_OP_QUERY, WIRE_OP_REPLY, WIRE_OP_COMPRESSED, 2010, 0, -1, 2011,
};
static const int levels[4] = {-1, 1, 3, 6};

static void
put_i32 (uint8_t *p, int32_t v)
{
   uint32_t u = (uint32_t) v;

   p[0] = (uint8_t) u;
   p[1] = (uint8_t) (u >> 8);
   p[2] = (uint8_t) (u >> 16);
   p[3] = (uint8_t) (u >> 24);
}

static int32_t
get_i32 (const uint8_t *p)
{
   return (int32_t) ((uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24);
}

static bool
known (int32_t op)
{
   return op == WIRE_OP_MSG || op == WIRE_OP_QUERY || op == WIRE_OP_REPLY;
}

/* The library's own decoding of the whole payload into buf (FUZZ_CAP
 * bytes): true with *n the size when it decodes completely and fits. */
static bool
reference_decode (uint8_t id, const uint8_t *in, size_t in_len, uint8_t *buf, size_t *n)
{
   switch (id) {
   case COMPRESS_NOOP:
      if (in_len > FUZZ_CAP)
         return false;
      if (in_len)
         memcpy (buf, in, in_len);
      *n = in_len;
      return true;
   case COMPRESS_SNAPPY: {
      size_t len = FUZZ_CAP;

      if (snappy_uncompressed_length ((const char *) in, in_len, &len) != SNAPPY_OK || len > FUZZ_CAP)
         return false;
      len = FUZZ_CAP;
      if (snappy_uncompress ((const char *) in, in_len, (char *) buf, &len) != SNAPPY_OK)
         return false;
      *n = len;
      return true;
   }
   case COMPRESS_ZLIB: {
      uLongf len = FUZZ_CAP;
      uLong consumed = (uLong) in_len;

      if (uncompress2 (buf, &len, in, &consumed) != Z_OK || consumed != in_len)
         return false;
      *n = (size_t) len;
      return true;
   }
   case COMPRESS_ZSTD: {
      size_t len = ZSTD_decompress (buf, FUZZ_CAP, in, in_len);

      if (ZSTD_isError (len))
         return false;
      *n = len;
      return true;
   }
   default:
      return false;
   }
}

/* Frames the payload with the given fields and checks parse + decompress. */
static void
check_frame (uint8_t id, int32_t opcode, int32_t usize, const uint8_t *payload, size_t plen, const uint8_t *ref,
             bool ref_ok, size_t ref_n)
{
   size_t len = WIRE_HEADER_LEN + PREFIX_LEN + plen;
   uint8_t *frame = malloc (len);
   struct evbuffer *out = evbuffer_new ();
   wire_compressed_t c;
   bson_error_t err;
   bool parsed, ok, expect;

   CHECK (frame && out);
   put_i32 (frame, (int32_t) len);
   put_i32 (frame + 4, 7);
   put_i32 (frame + 8, 9);
   put_i32 (frame + 12, WIRE_OP_COMPRESSED);
   put_i32 (frame + 16, opcode);
   put_i32 (frame + 20, usize);
   frame[24] = id;
   if (plen)
      memcpy (frame + 25, payload, plen);

   parsed = wire_parse_compressed (frame, len, &c, &err);
   CHECK (parsed == (known (opcode) && usize >= 0));
   if (!parsed) {
      CHECK (err.domain == WIRE_ERROR_DOMAIN);
      goto done;
   }
   CHECK (c.header.length == (int32_t) len && c.header.request_id == 7 && c.header.response_to == 9);
   CHECK (c.original_opcode == opcode && c.uncompressed_size == usize && c.compressor_id == id);
   CHECK (c.data == frame + 25 && c.data_len == plen);

   /* Something already in `out` must stay as it is. */
   CHECK (evbuffer_add (out, "abc", 3) == 0);
   ok = wire_decompress (&c, FUZZ_CAP, out, &err);
   expect = id <= COMPRESS_ZSTD && ref_ok && ref_n == (size_t) usize && WIRE_HEADER_LEN + ref_n <= FUZZ_CAP;
   CHECK (ok == expect);
   if (ok) {
      const uint8_t *m;
      size_t n = evbuffer_get_length (out);

      CHECK (n == 3 + WIRE_HEADER_LEN + (size_t) usize);
      m = evbuffer_pullup (out, -1);
      CHECK (memcmp (m, "abc", 3) == 0);
      m += 3;
      CHECK (get_i32 (m) == (int32_t) (WIRE_HEADER_LEN + usize) && get_i32 (m + 4) == 7 && get_i32 (m + 8) == 9);
      CHECK (get_i32 (m + 12) == opcode);
      CHECK (usize == 0 || memcmp (m + WIRE_HEADER_LEN, ref, (size_t) usize) == 0);
   } else {
      CHECK (err.domain == WIRE_ERROR_DOMAIN);
      CHECK (evbuffer_get_length (out) == 3 && memcmp (evbuffer_pullup (out, -1), "abc", 3) == 0);
   }
   /* A cap below the message refuses it before decompressing anything. */
   if (usize > 0) {
      CHECK (!wire_decompress (&c, WIRE_HEADER_LEN + (uint32_t) usize - 1, out, &err));
      CHECK (err.domain == WIRE_ERROR_DOMAIN && evbuffer_get_length (out) == (ok ? 3 + WIRE_HEADER_LEN + (size_t) usize : 3));
   }
done:
   evbuffer_free (out);
   free (frame);
}

/* body as the payload of a message with `opcode`: through OP_COMPRESSED
 * and back with compressor `id` (one per input: the fuzzer picks it, and
 * creating a zstd or zlib context per call is what the time goes on), then
 * the same payload through compress_unbuffer with the wrong sizes. */
static void
round_trip (uint8_t id, int32_t opcode, int level, const uint8_t *body, size_t blen)
{
   size_t len = WIRE_HEADER_LEN + blen;
   uint8_t *msg = malloc (len), *dbuf = malloc (blen + 1);
   struct evbuffer *c = evbuffer_new (), *d = evbuffer_new ();
   wire_compressed_t wc;
   bson_error_t err;
   size_t clen;

   CHECK (msg && dbuf && c && d);
   put_i32 (msg, (int32_t) len);
   put_i32 (msg + 4, 11);
   put_i32 (msg + 8, 13);
   put_i32 (msg + 12, opcode);
   if (blen)
      memcpy (msg + WIRE_HEADER_LEN, body, blen);

   /* An unknown compressor or an opcode that is not a message: refused,
    * nothing written. */
   CHECK (!wire_compress (msg, len, COMPRESS_ZSTD + 1 + id, level, c, &err));
   CHECK (err.domain == WIRE_ERROR_DOMAIN && evbuffer_get_length (c) == 0);
   if (!known (opcode)) {
      CHECK (!wire_compress (msg, len, id, level, c, &err));
      CHECK (err.domain == WIRE_ERROR_DOMAIN && evbuffer_get_length (c) == 0);
      goto done;
   }

   CHECK (wire_compress (msg, len, id, level, c, &err));
   clen = evbuffer_get_length (c);
   CHECK (clen <= WIRE_HEADER_LEN + PREFIX_LEN + compress_bound (id, blen));
   CHECK (wire_parse_compressed (evbuffer_pullup (c, -1), clen, &wc, &err));
   CHECK (wc.original_opcode == opcode && wc.compressor_id == id && wc.uncompressed_size == (int32_t) blen);
   CHECK (wc.header.request_id == 11 && wc.header.response_to == 13);
   CHECK (wc.data_len == clen - WIRE_HEADER_LEN - PREFIX_LEN);
   CHECK (wire_decompress (&wc, 0, d, &err));
   CHECK (evbuffer_get_length (d) == len && memcmp (evbuffer_pullup (d, -1), msg, len) == 0);

   /* Exactly the announced size: one byte more or less is refused. */
   CHECK (compress_unbuffer (id, wc.data, wc.data_len, dbuf, blen, &err));
   CHECK (blen == 0 || memcmp (dbuf, body, blen) == 0);
   CHECK (!compress_unbuffer (id, wc.data, wc.data_len, dbuf, blen + 1, &err));
   CHECK (err.domain == COMPRESS_ERROR_DOMAIN);
   if (blen > 0)
      CHECK (!compress_unbuffer (id, wc.data, wc.data_len, dbuf, blen - 1, &err));
done:
   evbuffer_free (c);
   evbuffer_free (d);
   free (dbuf);
   free (msg);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   static uint8_t ref[FUZZ_CAP];
   const uint8_t *payload;
   size_t plen, ref_n = 0;
   uint8_t id;
   int32_t opcode, usize;
   int level;
   bool ref_ok;

   if (size < 6)
      return 0;
   id = data[0];
   opcode = opcodes[data[1] & 7];
   level = levels[(data[1] >> 3) & 3];
   usize = get_i32 (data + 2);
   /* An exact-size heap copy, so ASan sees any read past the end. */
   plen = size - 6;
   payload = malloc (plen ? plen : 1);
   CHECK (payload);
   if (plen)
      memcpy ((uint8_t *) payload, data + 6, plen);

   ref_ok = reference_decode (id, payload, plen, ref, &ref_n);
   check_frame (id, opcode, usize, payload, plen, ref, ref_ok, ref_n);
   /* With the size the library found, the frame must decompress. */
   if (ref_ok && (size_t) usize != ref_n && ref_n <= FUZZ_CAP - WIRE_HEADER_LEN)
      check_frame (id, opcode, (int32_t) ref_n, payload, plen, ref, ref_ok, ref_n);
   round_trip (id & 3, opcode, level, payload, plen);
   free ((void *) payload);
   return 0;
}
