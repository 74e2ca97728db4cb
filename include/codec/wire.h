/*
 * codec/wire.h - the MongoDB wire protocol codec.
 *
 * Thread: any (pure: no I/O, no shared state); called on the forwarding loop.
 *
 * Parses and builds the messages the proxy handles: the 16-byte header,
 * OP_MSG (kind 0 and kind 1 sections, optional CRC-32C), OP_QUERY (legacy
 * hello only), OP_REPLY and OP_COMPRESSED.  Every read is bounds-checked;
 * parsing never allocates and never copies: a parsed message points into the
 * caller's contiguous buffer, which must outlive it.  Building writes into an
 * evbuffer.  Compression algorithms live in codec/compress.h; this module only
 * frames OP_COMPRESSED.
 *
 * The codec knows nothing about connections, sessions or annotations.
 */
#ifndef RELAYBUS_WIRE_H
#define RELAYBUS_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/errors.h"

/* Little-endian integers, as every field of the protocol is stored: the
 * one set of readers and writers (a put returns the position after). */
static inline uint32_t
wire_get_u32 (const uint8_t *p)
{
   return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) |
          ((uint32_t) p[3] << 24);
}

static inline int32_t
wire_get_i32 (const uint8_t *p)
{
   /* Two's complement conversion; gcc and clang define it as modular. */
   return (int32_t) wire_get_u32 (p);
}

static inline int64_t
wire_get_i64 (const uint8_t *p)
{
   return (int64_t) ((uint64_t) wire_get_u32 (p) | ((uint64_t) wire_get_u32 (p + 4) << 32));
}

static inline uint8_t *
wire_put_u32 (uint8_t *p, uint32_t v)
{
   p[0] = (uint8_t) v;
   p[1] = (uint8_t) (v >> 8);
   p[2] = (uint8_t) (v >> 16);
   p[3] = (uint8_t) (v >> 24);
   return p + 4;
}

static inline uint8_t *
wire_put_i32 (uint8_t *p, int32_t v)
{
   return wire_put_u32 (p, (uint32_t) v);
}

static inline uint8_t *
wire_put_i64 (uint8_t *p, int64_t v)
{
   p = wire_put_u32 (p, (uint32_t) ((uint64_t) v & 0xffffffffu));
   return wire_put_u32 (p, (uint32_t) ((uint64_t) v >> 32));
}

struct evbuffer;

#define WIRE_HEADER_LEN 16
/* The server's advertised maxMessageSizeBytes; also the proxy's hard limit. */
#define WIRE_MAX_MESSAGE_LEN 48000000
#define WIRE_MAX_SECTIONS 64
/* The largest BSON document a message may carry, body or sequence document:
 * mongod's BSONObjMaxInternalSize (16 MiB plus 16 KiB of headroom for the
 * command around a maximum-size user document).  Larger ones are refused
 * before they are walked. */
#define WIRE_MAX_BSON_LEN (16 * 1024 * 1024 + 16 * 1024)
/* Embedded documents deeper than this are refused (mongod's default
 * maximum BSON depth). */
#define WIRE_MAX_BSON_DEPTH 200

typedef enum {
   WIRE_OP_REPLY = 1,
   WIRE_OP_QUERY = 2004,
   WIRE_OP_COMPRESSED = 2012,
   WIRE_OP_MSG = 2013,
} wire_opcode_t;

/* OP_MSG flag bits. */
#define WIRE_MSG_CHECKSUM_PRESENT (1u << 0)
#define WIRE_MSG_MORE_TO_COME (1u << 1)
#define WIRE_MSG_EXHAUST_ALLOWED (1u << 16)
/* Bits 0-15 not listed above are required-to-understand: an error. */
#define WIRE_MSG_REQUIRED_MASK 0xffffu
#define WIRE_MSG_KNOWN_REQUIRED (WIRE_MSG_CHECKSUM_PRESENT | WIRE_MSG_MORE_TO_COME)

/* Error codes filled into bson_error_t.code by this module
 * (bson_error_t.domain is WIRE_ERROR_DOMAIN). */
typedef enum {
   WIRE_ERR_SHORT = 1,      /* length below 16, or a field runs past the end */
   WIRE_ERR_TOO_LARGE,      /* length above the limit */
   WIRE_ERR_OPCODE,         /* unknown or unexpected opcode */
   WIRE_ERR_FLAGS,          /* unknown required OP_MSG flag bit */
   WIRE_ERR_SECTION,        /* unknown section kind, bad size, duplicate identifier */
   WIRE_ERR_BSON,           /* invalid BSON document */
   WIRE_ERR_CHECKSUM,       /* CRC-32C mismatch */
   WIRE_ERR_COMPRESSION,    /* unknown compressor or corrupt compressed data */
   WIRE_ERR_NO_BODY,        /* OP_MSG without exactly one kind-0 section */
   WIRE_ERR_RESPONSE_TO,    /* a reply whose responseTo is not the request's id */
} wire_error_code_t;

typedef struct {
   int32_t length;
   int32_t request_id;
   int32_t response_to;
   int32_t opcode;
} wire_header_t;

/* A kind-1 document sequence: the identifier and the concatenated documents,
 * both pointing into the message buffer. */
typedef struct {
   const char *identifier; /* NUL-terminated, inside the buffer */
   const uint8_t *docs;
   uint32_t docs_len;
   uint32_t ndocs;
} wire_sequence_t;

/* A parsed OP_MSG.  `body` is a read-only bson_t initialised with
 * bson_init_static over the kind-0 section: never destroy it, never modify it.
 *
 * Do not copy a parsed struct by value (wire_msg_t, wire_query_t,
 * wire_reply_t): a static bson_t points into itself, so a copy's bson_t would
 * read through the original struct.  Pass pointers, or rebuild a bson_t from
 * body_data/body_len with bson_init_static.
 *
 * Sequence identifiers are unique, none is also a field of the body, and
 * there are at most WIRE_MAX_SECTIONS of them.
 *
 * `command` and `comment_offset` are facts the validation pass gathers at
 * the body's top level, so that routing does not walk the body again. */
typedef struct {
   wire_header_t header;
   uint32_t flags;
   bson_t body;
   const uint8_t *body_data; /* the kind-0 document's bytes */
   uint32_t body_len;
   wire_sequence_t sequences[WIRE_MAX_SECTIONS];
   uint32_t nsequences;
   bool checksum_present; /* when set, it was verified */
   const char *command;   /* the body's first key (as wire_command_name), NULL if empty */
   uint32_t command_len;  /* its length in bytes */
   /* The first top-level "comment" element: its offset in body_data (that
    * of its type byte, as bson_iter_offset gives), 0 when there is none.
    * `comment_repeated`: the body has more than one. */
   uint32_t comment_offset;
   bool comment_repeated;
} wire_msg_t;

/* A parsed OP_QUERY.  `query` points into the buffer like wire_msg_t.body. */
typedef struct {
   wire_header_t header;
   int32_t flags;
   const char *full_collection_name;
   int32_t number_to_skip;
   int32_t number_to_return;
   bson_t query;
   bool has_fields;
   bson_t fields;
} wire_query_t;

/* A parsed OP_REPLY.  `doc` is the first document (the proxy only ever reads
 * hello replies in this form); `docs` spans all of them, each validated, and
 * their count equals number_returned. */
typedef struct {
   wire_header_t header;
   int32_t flags;
   int64_t cursor_id;
   int32_t starting_from;
   int32_t number_returned;
   bool has_doc;
   bson_t doc;
   const uint8_t *docs;
   uint32_t docs_len;
} wire_reply_t;

/* A parsed OP_COMPRESSED frame: the compressed payload points into the buffer. */
typedef struct {
   wire_header_t header;
   int32_t original_opcode;
   int32_t uncompressed_size; /* without the 16-byte header */
   uint8_t compressor_id;
   const uint8_t *data;
   uint32_t data_len;
} wire_compressed_t;

/* Reads the header from the first 16 bytes of `buf`.  Returns false if fewer
 * than 16 bytes are available (no error: wait for more).  Does not validate. */
bool wire_peek_header (const uint8_t *buf, size_t len, wire_header_t *out);

/* Validates a header: length in [16, max_len], opcode one of the four above.
 * `max_len` of 0 means WIRE_MAX_MESSAGE_LEN. */
bool wire_check_header (const wire_header_t *h, uint32_t max_len, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Parse whole messages: `buf` holds exactly header.length bytes.  Each checks
 * every bound, validates each BSON document (every element, nested ones
 * included, at least as strictly as bson_iter_next; UTF-8 is not enforced,
 * as mongod does not), and fills `error`.  So bson_iter_* can read every
 * accepted document to its end, but libbson's visitors (bson_validate,
 * bson_iter_visit_all, bson_as_*json) may still refuse one whose keys are not
 * UTF-8.
 * Trailing bytes after the last field are an error.  The size limit is the
 * caller's (wire_check_header); these do not apply WIRE_MAX_MESSAGE_LEN,
 * but refuse any document above WIRE_MAX_BSON_LEN.  Cost: linear in `len`
 * whatever the content (no check compares keys with identifiers pairwise),
 * so the work per message is bounded by the message size limit. */
bool wire_parse_msg (const uint8_t *buf, size_t len, wire_msg_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
bool wire_parse_query (const uint8_t *buf, size_t len, wire_query_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
bool wire_parse_reply (const uint8_t *buf, size_t len, wire_reply_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
bool wire_parse_compressed (const uint8_t *buf,
                            size_t len,
                            wire_compressed_t *out,
                            bson_error_t *error) __attribute__ ((warn_unused_result));

/* Decompresses an OP_COMPRESSED frame into `out` as a complete uncompressed
 * message (header rebuilt with original opcode, same requestID/responseTo).
 * Refuses a rebuilt message (16 + uncompressed_size bytes) above `max_len`
 * (0 means WIRE_MAX_MESSAGE_LEN) before allocating anything, an
 * uncompressed_size that does not match what the algorithm produced, corrupt
 * data, an unknown compressor and an original opcode of OP_COMPRESSED or any
 * unknown one.  `out` is appended to, and left as it was on failure. */
bool wire_decompress (const wire_compressed_t *c,
                      uint32_t max_len,
                      struct evbuffer *out,
                      bson_error_t *error) __attribute__ ((warn_unused_result));

/* Compresses a complete message (header included, any opcode but
 * OP_COMPRESSED) with `compressor_id` and appends the OP_COMPRESSED frame to
 * `out`.  Uses the message's own requestID/responseTo.  `level` as in
 * compress_buffer (-1: the algorithm's default).  Refuses a frame that would
 * exceed WIRE_MAX_MESSAGE_LEN; `out` is left as it was on failure. */
bool wire_compress (const uint8_t *msg,
                    size_t len,
                    uint8_t compressor_id,
                    int level,
                    struct evbuffer *out,
                    bson_error_t *error) __attribute__ ((warn_unused_result));

/* Builders append one complete message to `out`, copying the documents
 * once into space reserved in one piece.  OP_MSG is written without a
 * checksum, and checksumPresent is cleared from `flags` (the proxy drops
 * checksums of messages it rewrites); the body goes first, then the
 * sequences in the order given; `sequences` may be NULL when nsequences is
 * 0.  Returns false only when the message would exceed WIRE_MAX_MESSAGE_LEN
 * (then `out` is unchanged) or memory runs out. */
bool wire_append_msg (struct evbuffer *out,
                      int32_t request_id,
                      int32_t response_to,
                      uint32_t flags,
                      const bson_t *body,
                      const wire_sequence_t *sequences,
                      uint32_t nsequences) __attribute__ ((warn_unused_result));
bool wire_append_reply (struct evbuffer *out,
                        int32_t request_id,
                        int32_t response_to,
                        int32_t flags,
                        const bson_t *doc) __attribute__ ((warn_unused_result));
bool wire_append_query (struct evbuffer *out,
                        int32_t request_id,
                        int32_t flags,
                        const char *full_collection_name,
                        int32_t skip,
                        int32_t number_to_return,
                        const bson_t *query) __attribute__ ((warn_unused_result));

/* CRC-32C (Castagnoli), as OP_MSG checksums use it.  Start with crc = 0;
 * calls chain: crc(a || b) = wire_crc32c (wire_crc32c (0, a), b).  Uses
 * SSE4.2 when the CPU has it, else wire_crc32c_sw. */
uint32_t wire_crc32c (uint32_t crc, const uint8_t *data, size_t len);
/* The portable table-driven implementation, exposed so tests can check that
 * both paths agree. */
uint32_t wire_crc32c_sw (uint32_t crc, const uint8_t *data, size_t len);

/* The command name: the first key of an OP_MSG body, or NULL if empty. */
const char *wire_command_name (const bson_t *body);

/* The opcode's name for logs ("OP_MSG", ...), "unknown" otherwise. */
const char *wire_opcode_name (int32_t opcode);

#endif /* RELAYBUS_WIRE_H */
