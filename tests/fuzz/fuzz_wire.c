/*
 * fuzz_wire.c - libFuzzer target for the wire codec and the compressors.
 *
 * The input is one message.  It is parsed as given, then again with its
 * length field forced to the input size (so the fuzzer need not discover the
 * framing rule to reach the section parsers), by every parser.  What parses
 * is checked against independent oracles and round-tripped:
 *   - libbson must iterate every document the codec accepted to its end,
 *     nested documents included, since the proxy reads them with libbson;
 *   - OP_MSG, OP_QUERY and OP_REPLY are re-encoded with the builders and
 *     re-parsed, and the bytes compared where the builder must reproduce them;
 *   - OP_COMPRESSED is decompressed (capped) and the result parsed the same
 *     way; re-encoded messages are compressed with each compressor and
 *     decompressed back;
 *   - the SSE4.2 and table CRC-32C agree.
 * An oracle failure calls abort(), which libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "codec/compress.h"
#include "codec/wire.h"

/* Keeps one input's memory small: OP_COMPRESSED may announce 48 MB. */
#define FUZZ_MAX_UNCOMPRESSED (1u << 20)

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

#define CHECK(cond)                                                                \
   do {                                                                            \
      if (!(cond)) {                                                               \
         fprintf (stderr, "%s:%d: oracle failed: %s\n", __FILE__, __LINE__, #cond); \
         abort ();                                                                 \
      }                                                                            \
   } while (0)

/* libbson must iterate an accepted document to its very end, nested
 * documents included. */
static void
walk (const uint8_t *p, uint32_t len, int depth)
{
   bson_t b;
   bson_iter_t it;

   CHECK (depth <= WIRE_MAX_BSON_DEPTH);
   CHECK (bson_init_static (&b, p, len));
   CHECK (bson_iter_init (&it, &b));
   while (bson_iter_next (&it)) {
      const uint8_t *sub = NULL;
      uint32_t sublen = 0, slen;

      switch (bson_iter_type (&it)) {
      case BSON_TYPE_DOCUMENT:
         bson_iter_document (&it, &sublen, &sub);
         break;
      case BSON_TYPE_ARRAY:
         bson_iter_array (&it, &sublen, &sub);
         break;
      case BSON_TYPE_CODEWSCOPE:
         (void) bson_iter_codewscope (&it, &slen, &sublen, &sub);
         break;
      case BSON_TYPE_UTF8:
         CHECK (bson_iter_utf8 (&it, &slen) != NULL);
         break;
      default:
         break;
      }
      if (sub) {
         walk (sub, sublen, depth + 1);
      }
   }
   /* A clean end leaves the iterator on the terminating NUL. */
   CHECK (it.off == len - 1);
}

/* Not bson_validate: its visitor also refuses keys that are not UTF-8,
 * which the codec accepts on purpose (mongod does too). */
static void
check_doc (const bson_t *doc)
{
   walk (bson_get_data (doc), doc->len, 0);
}

static void
check_docs (const uint8_t *p, uint32_t len, uint32_t expect_n)
{
   uint32_t n = 0, off = 0;

   while (off < len) {
      uint32_t dlen;
      CHECK (len - off >= 5);
      dlen = (uint32_t) p[off] | (uint32_t) p[off + 1] << 8 | (uint32_t) p[off + 2] << 16 |
             (uint32_t) p[off + 3] << 24;
      CHECK (dlen >= 5 && dlen <= len - off);
      walk (p + off, dlen, 0);
      off += dlen;
      n++;
   }
   CHECK (n == expect_n);
}

/* Compress a whole message with each compressor and get it back. */
static void
compress_round_trip (const uint8_t *msg, size_t len)
{
   for (uint8_t id = 0; id <= COMPRESS_ZSTD; id++) {
      struct evbuffer *c = evbuffer_new (), *d = evbuffer_new ();
      wire_compressed_t wc;
      bson_error_t err;
      size_t clen;

      CHECK (c && d);
      CHECK (wire_compress (msg, len, id, 1, c, &err));
      clen = evbuffer_get_length (c);
      CHECK (wire_parse_compressed (evbuffer_pullup (c, -1), clen, &wc, &err));
      CHECK (wire_decompress (&wc, 0, d, &err));
      CHECK (evbuffer_get_length (d) == len);
      CHECK (memcmp (evbuffer_pullup (d, -1), msg, len) == 0);
      evbuffer_free (c);
      evbuffer_free (d);
   }
}

static void parse_all (const uint8_t *buf, size_t len, int nesting);

/* The facts the validation pass gathered match what iterating the body
 * finds: the first key, and where the first "comment" is. */
static void
check_msg_facts (const wire_msg_t *m)
{
   bson_iter_t it;
   const char *first = wire_command_name (&m->body);
   uint32_t ncomments = 0, first_comment = 0;

   CHECK ((first == NULL) == (m->command == NULL));
   if (first) {
      CHECK (strcmp (first, m->command) == 0 && strlen (first) == m->command_len);
   }
   CHECK (bson_iter_init (&it, &m->body));
   while (bson_iter_next (&it)) {
      if (strcmp (bson_iter_key (&it), "comment") == 0 && ncomments++ == 0) {
         first_comment = bson_iter_offset (&it);
      }
   }
   CHECK (m->comment_offset == first_comment);
   CHECK (m->comment_repeated == (ncomments > 1));
}

static void
on_msg (const uint8_t *buf, size_t len, const wire_msg_t *m)
{
   struct evbuffer *out = evbuffer_new ();
   static wire_msg_t again;
   bson_error_t err;
   const uint8_t *r;
   size_t rlen;

   CHECK (out);
   check_doc (&m->body);
   CHECK (m->body_data >= buf && m->body_data + m->body_len <= buf + len);
   CHECK (m->nsequences <= WIRE_MAX_SECTIONS);
   for (uint32_t i = 0; i < m->nsequences; i++) {
      const wire_sequence_t *s = &m->sequences[i];
      CHECK (s->docs >= buf && s->docs + s->docs_len <= buf + len);
      check_docs (s->docs, s->docs_len, s->ndocs);
   }
   (void) compress_command_is_exempt (wire_command_name (&m->body));
   check_msg_facts (m);

   /* Rebuilt without the checksum, it parses to the same parts; without a
    * checksum to begin with, it is the same bytes (sections reordered to
    * body first, so only when the body came first). */
   CHECK (wire_append_msg (out, m->header.request_id, m->header.response_to, m->flags, &m->body, m->sequences,
                           m->nsequences));
   rlen = evbuffer_get_length (out);
   r = evbuffer_pullup (out, -1);
   CHECK (wire_parse_msg (r, rlen, &again, &err));
   CHECK (!again.checksum_present);
   CHECK (again.flags == (m->flags & ~WIRE_MSG_CHECKSUM_PRESENT));
   CHECK (again.body_len == m->body_len && memcmp (again.body_data, m->body_data, m->body_len) == 0);
   CHECK (again.nsequences == m->nsequences);
   for (uint32_t i = 0; i < m->nsequences; i++) {
      CHECK (strcmp (again.sequences[i].identifier, m->sequences[i].identifier) == 0);
      CHECK (again.sequences[i].ndocs == m->sequences[i].ndocs);
      CHECK (again.sequences[i].docs_len == m->sequences[i].docs_len);
   }
   if (!m->checksum_present && m->body_data == buf + WIRE_HEADER_LEN + 5) {
      CHECK (rlen == len && memcmp (r, buf, len) == 0);
   }
   compress_round_trip (r, rlen);
   evbuffer_free (out);
}

static void
on_query (const uint8_t *buf, size_t len, const wire_query_t *q)
{
   struct evbuffer *out = evbuffer_new ();
   static wire_query_t again;
   bson_error_t err;

   CHECK (out);
   check_doc (&q->query);
   if (q->has_fields) {
      check_doc (&q->fields);
   }
   CHECK (wire_append_query (out, q->header.request_id, q->flags, q->full_collection_name, q->number_to_skip,
                             q->number_to_return, &q->query));
   CHECK (wire_parse_query (evbuffer_pullup (out, -1), evbuffer_get_length (out), &again, &err));
   CHECK (strcmp (again.full_collection_name, q->full_collection_name) == 0);
   CHECK (bson_equal (&again.query, &q->query));
   if (!q->has_fields) {
      /* Same bytes but responseTo, which the builder writes as 0. */
      CHECK (evbuffer_get_length (out) == len);
      CHECK (memcmp (evbuffer_pullup (out, -1) + 12, buf + 12, len - 12) == 0);
   }
   compress_round_trip (buf, len);
   evbuffer_free (out);
}

static void
on_reply (const uint8_t *buf, size_t len, const wire_reply_t *rp)
{
   struct evbuffer *out = evbuffer_new ();
   static wire_reply_t again;
   bson_error_t err;

   CHECK (out);
   CHECK (rp->number_returned >= 0);
   check_docs (rp->docs, rp->docs_len, (uint32_t) rp->number_returned);
   if (rp->has_doc) {
      check_doc (&rp->doc);
   }
   CHECK (wire_append_reply (out, rp->header.request_id, rp->header.response_to, rp->flags,
                             rp->has_doc ? &rp->doc : NULL));
   CHECK (wire_parse_reply (evbuffer_pullup (out, -1), evbuffer_get_length (out), &again, &err));
   CHECK (again.has_doc == rp->has_doc);
   if (rp->number_returned <= 1 && rp->cursor_id == 0 && rp->starting_from == 0) {
      CHECK (evbuffer_get_length (out) == len && memcmp (evbuffer_pullup (out, -1), buf, len) == 0);
   }
   compress_round_trip (buf, len);
   evbuffer_free (out);
}

static void
on_compressed (const wire_compressed_t *c, int nesting)
{
   struct evbuffer *out = evbuffer_new ();
   bson_error_t err;

   CHECK (out);
   CHECK (c->original_opcode != WIRE_OP_COMPRESSED);
   if (wire_decompress (c, FUZZ_MAX_UNCOMPRESSED, out, &err)) {
      size_t n = evbuffer_get_length (out);
      CHECK (n == WIRE_HEADER_LEN + (size_t) c->uncompressed_size);
      /* One level only: the result is never OP_COMPRESSED anyway. */
      if (nesting == 0) {
         parse_all (evbuffer_pullup (out, -1), n, nesting + 1);
      }
   } else {
      CHECK (err.domain == WIRE_ERROR_DOMAIN);
      CHECK (evbuffer_get_length (out) == 0);
   }
   evbuffer_free (out);
}

static void
parse_all (const uint8_t *buf, size_t len, int nesting)
{
   static wire_msg_t msg;
   wire_query_t q;
   wire_reply_t rp;
   wire_compressed_t c;
   wire_header_t h;
   bson_error_t err;
   int parsed = 0;

   if (wire_peek_header (buf, len, &h)) {
      (void) wire_check_header (&h, 0, &err);
   }
   if (wire_parse_msg (buf, len, &msg, &err)) {
      on_msg (buf, len, &msg);
      parsed++;
   }
   if (wire_parse_query (buf, len, &q, &err)) {
      on_query (buf, len, &q);
      parsed++;
   }
   if (wire_parse_reply (buf, len, &rp, &err)) {
      on_reply (buf, len, &rp);
      parsed++;
   }
   if (wire_parse_compressed (buf, len, &c, &err)) {
      on_compressed (&c, nesting);
      parsed++;
   }
   /* A message has one opcode, so at most one parser takes it, and then it
    * passes the header check too. */
   CHECK (parsed <= 1);
   if (parsed) {
      CHECK (wire_peek_header (buf, len, &h) && wire_check_header (&h, 0, &err));
   }
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   /* An exact-size heap copy, so ASan sees any read past the end. */
   uint8_t *buf = malloc (size ? size : 1);

   if (!buf) {
      return 0;
   }
   if (size) {
      memcpy (buf, data, size);
   }
   CHECK (wire_crc32c (0, buf, size) == wire_crc32c_sw (0, buf, size));
   parse_all (buf, size, 0);
   if (size >= 4) {
      buf[0] = (uint8_t) size;
      buf[1] = (uint8_t) (size >> 8);
      buf[2] = (uint8_t) (size >> 16);
      buf[3] = (uint8_t) (size >> 24);
      parse_all (buf, size, 0);
   }
   free (buf);
   return 0;
}
