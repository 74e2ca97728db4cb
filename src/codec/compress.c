/*
 * codec/compress.c - the wire protocol's compressors: noop, snappy, zlib, zstd.
 *
 * Thin one-shot wrappers with one contract for all four: decompression must
 * produce exactly the size the peer announced, into a buffer of exactly that
 * size, and anything else (corrupt data, a shorter or longer result, trailing
 * bytes after the stream) is an error.  The libraries do the bounds checking
 * of their own formats; we never trust the announced size to size anything
 * but the output buffer, which the caller has already capped.
 *
 * zlib is the zlib format (compress2/uncompress2), as MongoDB uses it, not
 * raw deflate or gzip.
 */
#include "codec/compress.h"

#include <string.h>

#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

typedef struct {
   const char *name;
} compressor_t;

/* Designated initialisers, indexed by compress_id_t. */
static const compressor_t compressors[] = {
   [COMPRESS_NOOP] = {"noop"},
   [COMPRESS_SNAPPY] = {"snappy"},
   [COMPRESS_ZLIB] = {"zlib"},
   [COMPRESS_ZSTD] = {"zstd"},
};
#define NCOMPRESSORS ((int) (sizeof compressors / sizeof compressors[0]))

const char *
compress_name (int id)
{
   if (id < 0 || id >= NCOMPRESSORS) {
      return NULL;
   }
   return compressors[id].name;
}

int
compress_id (const char *name)
{
   if (!name) {
      return -1;
   }
   for (int i = 0; i < NCOMPRESSORS; i++) {
      if (strcmp (compressors[i].name, name) == 0) {
         return i;
      }
   }
   return -1;
}

bool
compress_offerable (const char *name)
{
   return compress_id (name) > COMPRESS_NOOP;
}

size_t
compress_bound (int id, size_t len)
{
   switch (id) {
   case COMPRESS_NOOP:
      return len;
   case COMPRESS_SNAPPY:
      return snappy_max_compressed_length (len);
   case COMPRESS_ZLIB:
      /* compressBound takes a uLong; on LP64 that is size_t. */
      return (size_t) compressBound ((uLong) len);
   case COMPRESS_ZSTD: {
      size_t b = ZSTD_compressBound (len);
      return ZSTD_isError (b) ? 0 : b;
   }
   default:
      return 0;
   }
}

bool
compress_buffer (int id,
                 int level,
                 const uint8_t *in,
                 size_t in_len,
                 uint8_t *out,
                 size_t out_cap,
                 size_t *out_len,
                 bson_error_t *error)
{
   switch (id) {
   case COMPRESS_NOOP:
      if (out_cap < in_len) {
         break;
      }
      if (in_len) {
         memcpy (out, in, in_len);
      }
      *out_len = in_len;
      return true;
   case COMPRESS_SNAPPY: {
      size_t n = out_cap;
      if (snappy_compress ((const char *) in, in_len, (char *) out, &n) != SNAPPY_OK) {
         break;
      }
      *out_len = n;
      return true;
   }
   case COMPRESS_ZLIB: {
      uLongf n = (uLongf) out_cap;
      int rc = compress2 (out, &n, in, (uLong) in_len, level == -1 ? Z_DEFAULT_COMPRESSION : level);
      if (rc != Z_OK) {
         bson_set_error (error, COMPRESS_ERROR_DOMAIN, id, "zlib compression failed: %s", zError (rc));
         return false;
      }
      *out_len = (size_t) n;
      return true;
   }
   case COMPRESS_ZSTD: {
      size_t n = ZSTD_compress (out, out_cap, in, in_len, level == -1 ? ZSTD_CLEVEL_DEFAULT : level);
      if (ZSTD_isError (n)) {
         bson_set_error (error, COMPRESS_ERROR_DOMAIN, id, "zstd compression failed: %s", ZSTD_getErrorName (n));
         return false;
      }
      *out_len = n;
      return true;
   }
   default:
      bson_set_error (error, COMPRESS_ERROR_DOMAIN, id, "unknown compressor id %d", id);
      return false;
   }
   bson_set_error (error, COMPRESS_ERROR_DOMAIN, id, "%s compression failed", compress_name (id));
   return false;
}

bool
compress_unbuffer (int id,
                   const uint8_t *in,
                   size_t in_len,
                   uint8_t *out,
                   size_t expected_len,
                   bson_error_t *error)
{
   uint8_t dummy;

   /* Libraries may refuse a NULL destination even for zero bytes. */
   if (!out) {
      out = &dummy;
      expected_len = 0;
   }
   switch (id) {
   case COMPRESS_NOOP:
      if (in_len != expected_len) {
         goto size_mismatch;
      }
      if (in_len) {
         memcpy (out, in, in_len);
      }
      return true;
   case COMPRESS_SNAPPY: {
      size_t n;
      /* The announced length is in the stream's preamble; check it first so
       * snappy never writes past expected_len. */
      if (snappy_uncompressed_length ((const char *) in, in_len, &n) != SNAPPY_OK) {
         goto corrupt;
      }
      if (n != expected_len) {
         goto size_mismatch;
      }
      if (snappy_uncompress ((const char *) in, in_len, (char *) out, &n) != SNAPPY_OK) {
         goto corrupt;
      }
      if (n != expected_len) {
         goto size_mismatch;
      }
      return true;
   }
   case COMPRESS_ZLIB: {
      /* Given no room at all, uncompress2 inflates into a 1-byte buffer of
       * its own and reports Z_OK for a stream of one byte: so an empty
       * expectation gets one byte of room here, and must leave it unused. */
      uint8_t one;
      uint8_t *dst = expected_len ? out : &one;
      uLongf room = expected_len ? (uLongf) expected_len : 1;
      uLongf n = room;
      uLong consumed = (uLong) in_len;
      int rc = uncompress2 (dst, &n, in, &consumed);
      if (rc == Z_BUF_ERROR && n == room) {
         /* Output full before the stream ended: the data is larger than
          * announced (or truncated, which is corrupt either way). */
         goto size_mismatch;
      }
      if (rc != Z_OK || consumed != in_len) {
         goto corrupt;
      }
      if (n != expected_len) {
         goto size_mismatch;
      }
      return true;
   }
   case COMPRESS_ZSTD: {
      size_t n = ZSTD_decompress (out, expected_len, in, in_len);
      if (ZSTD_isError (n)) {
         if (ZSTD_getErrorCode (n) == ZSTD_error_dstSize_tooSmall) {
            goto size_mismatch;
         }
         goto corrupt;
      }
      if (n != expected_len) {
         goto size_mismatch;
      }
      return true;
   }
   default:
      bson_set_error (error, COMPRESS_ERROR_DOMAIN, id, "unknown compressor id %d", id);
      return false;
   }

corrupt:
   bson_set_error (error, COMPRESS_ERROR_DOMAIN, id, "%s: corrupt compressed data", compress_name (id));
   return false;
size_mismatch:
   bson_set_error (error,
                   COMPRESS_ERROR_DOMAIN,
                   id,
                   "%s: data does not decompress to the announced %zu bytes",
                   compress_name (id),
                   expected_len);
   return false;
}

/* Handshake and authentication commands travel uncompressed (the wire
 * protocol's compression specification lists them). */
static const char *const exempt_commands[] = {
   "hello",
   "isMaster",
   "ismaster",
   "saslStart",
   "saslContinue",
   "getnonce",
   "authenticate",
   "createUser",
   "updateUser",
   "copydbSaslStart",
   "copydbgetnonce",
   "copydb",
};

bool
compress_command_is_exempt (const char *command_name)
{
   if (!command_name) {
      return false;
   }
   for (size_t i = 0; i < sizeof exempt_commands / sizeof exempt_commands[0]; i++) {
      if (strcmp (command_name, exempt_commands[i]) == 0) {
         return true;
      }
   }
   return false;
}
