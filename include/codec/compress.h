/*
 * codec/compress.h - the wire protocol's compressors: snappy, zlib and zstd.
 *
 * Thread: any (pure: no I/O, no shared state).
 *
 * One-shot buffer-to-buffer compression and decompression with the ids the
 * protocol assigns, plus the negotiation rule of hello: the client's list
 * intersected with what the proxy offers, in the client's order.
 * Framing (OP_COMPRESSED) is in codec/wire.h.
 */
#ifndef RELAYBUS_COMPRESS_H
#define RELAYBUS_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/errors.h"

typedef enum {
   COMPRESS_NOOP = 0,
   COMPRESS_SNAPPY = 1,
   COMPRESS_ZLIB = 2,
   COMPRESS_ZSTD = 3,
} compress_id_t;

/* "snappy", "zlib", "zstd", "noop"; NULL for an unknown id. */
const char *compress_name (int id);
/* Id for a name, -1 if the proxy does not implement it. */
int compress_id (const char *name);
/* True for a compressor the proxy may offer ([proxy] compressors): a name
 * it implements other than "noop". */
bool compress_offerable (const char *name);

/* Upper bound of the compressed size of `len` bytes. */
size_t compress_bound (int id, size_t len);

/* Compress `in` into `out` (capacity `out_cap`, at least compress_bound);
 * `*out_len` receives the size.  `level` is the zlib/zstd level, -1 for the
 * algorithm's default. */
bool compress_buffer (int id,
                      int level,
                      const uint8_t *in,
                      size_t in_len,
                      uint8_t *out,
                      size_t out_cap,
                      size_t *out_len,
                      bson_error_t *error) __attribute__ ((warn_unused_result));

/* Decompress exactly `expected_len` bytes into `out` (capacity expected_len).
 * Fails if the data is corrupt or decompresses to any other size. */
bool compress_unbuffer (int id,
                        const uint8_t *in,
                        size_t in_len,
                        uint8_t *out,
                        size_t expected_len,
                        bson_error_t *error) __attribute__ ((warn_unused_result));

/* Commands whose messages are never compressed (hello, saslStart, ...). */
bool compress_command_is_exempt (const char *command_name);

#endif /* RELAYBUS_COMPRESS_H */
