/*
 * test_wire.c - unit tests of src/codec/wire.c, driven by tables of messages.
 *
 * Each case is a message written in hex, as mongo-c-driver's wire tests are,
 * with three conveniences so the tables stay readable and correct:
 *   [ ... ]   an int32 length that counts itself and everything up to the
 *             matching bracket (messageLength, kind-1 size, BSON length);
 *   CCCCCCCC  the CRC-32C of every byte before it (an OP_MSG checksum);
 *   spaces    ignored.
 * Deliberately wrong lengths are written as plain hex instead.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "codec/wire.h"

/* ------------------------------------------------------------ hex messages */

#define MAX_MSG 4096

typedef struct {
   uint8_t b[MAX_MSG];
   size_t len;
} msgbuf_t;

static void
put32 (uint8_t *p, uint32_t v)
{
   p[0] = (uint8_t) v;
   p[1] = (uint8_t) (v >> 8);
   p[2] = (uint8_t) (v >> 16);
   p[3] = (uint8_t) (v >> 24);
}

static int
hexval (char c)
{
   if (c >= '0' && c <= '9') {
      return c - '0';
   }
   if (c >= 'a' && c <= 'f') {
      return c - 'a' + 10;
   }
   if (c >= 'A' && c <= 'F') {
      return c - 'A' + 10;
   }
   return -1;
}

static void
from_hex (const char *hex, msgbuf_t *m)
{
   size_t stack[8], depth = 0, crc_at = SIZE_MAX;

   m->len = 0;
   for (const char *s = hex; *s;) {
      if (*s == ' ') {
         s++;
      } else if (*s == '[') {
         assert_true (depth < 8);
         stack[depth++] = m->len;
         m->len += 4;
         s++;
      } else if (*s == ']') {
         assert_true (depth > 0);
         depth--;
         put32 (m->b + stack[depth], (uint32_t) (m->len - stack[depth]));
         s++;
      } else if (strncmp (s, "CCCCCCCC", 8) == 0) {
         crc_at = m->len;
         m->len += 4;
         s += 8;
      } else {
         int hi = hexval (s[0]), lo = hexval (s[1]);
         if (hi < 0 || lo < 0) {
            fail_msg ("bad hex in test table at \"%.10s\"", s);
         }
         assert_true (m->len < MAX_MSG);
         m->b[m->len++] = (uint8_t) (hi << 4 | lo);
         s += 2;
      }
      assert_true (m->len <= MAX_MSG);
   }
   assert_int_equal (depth, 0);
   if (crc_at != SIZE_MAX) {
      put32 (m->b + crc_at, wire_crc32c (0, m->b, crc_at));
   }
}

/* Header fields: requestID 7, responseTo 0, then the opcode. */
#define H_MSG "07000000 00000000 dd070000 "
#define H_QUERY "07000000 00000000 d4070000 "
#define H_REPLY "07000000 09000000 01000000 "
#define H_COMPRESSED "07000000 00000000 dc070000 "

/* BSON documents (generated, then checked by the valid cases below). */
#define DOC_PING "1e0000001070696e67000100000002246462000600000061646d696e0000"
#define DOC_INSERT "2100000002696e7365727400020000006300022464620005000000746573740000"
#define DOC_INSERT_INLINE                                                   \
   "3100000002696e736572740002000000630004646f63756d656e74730005000000000" \
   "22464620005000000746573740000"
#define DOC_A1 "0c0000001061000100000000"
#define DOC_A2 "0c0000001061000200000000"
#define DOC_NESTED                                                        \
   "380000000266696e64000200000063000366696c74657200140000000378000c0000" \
   "00107900010000000000022464620002000000740000"
#define DOC_HELLO_LEGACY                                                  \
   "850000001069734d617374657200010000000868656c6c6f4f6b000103636c69656e" \
   "740034000000036472697665720027000000026e616d6500070000006e6f64656a73" \
   "000276657273696f6e0004000000362e3000000004636f6d7072657373696f6e001f" \
   "000000023000050000007a7374640002310007000000736e61707079000000"
#define DOC_EMPTY "0500000000"
#define DOC_FIELDS "[ 10 636c69656e7400 00000000 00]"
#define ID_DOCUMENTS "646f63756d656e747300" /* "documents" */
#define ID_UPDATES "7570646174657300"       /* "updates" */

/* ------------------------------------------------------------ the table */

typedef enum { P_MSG, P_QUERY, P_REPLY, P_COMPRESSED } parser_t;

typedef struct {
   const char *name;
   parser_t parser;
   const char *hex;
   int code; /* 0: must parse; else the wire_error_code_t expected */
} msg_case_t;

static const msg_case_t cases[] = {
   /* --- OP_MSG, valid --- */
   {"msg body only", P_MSG, "[" H_MSG "00000000 00" DOC_PING "]", 0},
   {"msg nested body", P_MSG, "[" H_MSG "00000000 00" DOC_NESTED "]", 0},
   {"msg empty body", P_MSG, "[" H_MSG "00000000 00" DOC_EMPTY "]", 0},
   {"msg kind-1 three docs",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT " 01[" ID_DOCUMENTS DOC_A1 DOC_A2 DOC_A1 "]]",
    0},
   {"msg kind-1 before body",
    P_MSG,
    "[" H_MSG "00000000 01[" ID_DOCUMENTS DOC_A1 "] 00" DOC_INSERT "]",
    0},
   {"msg two sequences",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT " 01[" ID_DOCUMENTS DOC_A1 "] 01[" ID_UPDATES DOC_A2 "]]",
    0},
   {"msg empty sequence", P_MSG, "[" H_MSG "00000000 00" DOC_INSERT " 01[" ID_DOCUMENTS "]]", 0},
   {"msg inline documents", P_MSG, "[" H_MSG "00000000 00" DOC_INSERT_INLINE "]", 0},
   {"msg correct checksum", P_MSG, "[" H_MSG "01000000 00" DOC_PING " CCCCCCCC]", 0},
   {"msg checksum with sequence",
    P_MSG,
    "[" H_MSG "01000000 00" DOC_INSERT " 01[" ID_DOCUMENTS DOC_A1 DOC_A2 "] CCCCCCCC]",
    0},
   {"msg moreToCome", P_MSG, "[" H_MSG "02000000 00" DOC_PING "]", 0},
   {"msg exhaustAllowed and unknown high bits", P_MSG, "[" H_MSG "010001c0 00" DOC_PING " CCCCCCCC]", 0},

   /* --- OP_MSG, invalid --- */
   {"msg header only 10 bytes", P_MSG, "0a000000 07000000 0000", WIRE_ERR_SHORT},
   {"msg length says more than given", P_MSG, "40000000" H_MSG "00000000 00" DOC_PING, WIRE_ERR_SHORT},
   {"msg length says less than given", P_MSG, "10000000" H_MSG "00000000 00" DOC_PING, WIRE_ERR_SHORT},
   {"msg negative length", P_MSG, "ffffffff" H_MSG "00000000 00" DOC_PING, WIRE_ERR_SHORT},
   {"msg wrong opcode", P_MSG, "[" H_QUERY "00000000 00" DOC_PING "]", WIRE_ERR_OPCODE},
   {"msg no flags", P_MSG, "[" H_MSG "0000]", WIRE_ERR_SHORT},
   {"msg unknown required flag bit 2", P_MSG, "[" H_MSG "04000000 00" DOC_PING "]", WIRE_ERR_FLAGS},
   {"msg unknown required flag bit 15", P_MSG, "[" H_MSG "00800000 00" DOC_PING "]", WIRE_ERR_FLAGS},
   {"msg no sections", P_MSG, "[" H_MSG "00000000]", WIRE_ERR_NO_BODY},
   {"msg two bodies", P_MSG, "[" H_MSG "00000000 00" DOC_PING " 00" DOC_PING "]", WIRE_ERR_NO_BODY},
   {"msg only a sequence", P_MSG, "[" H_MSG "00000000 01[" ID_DOCUMENTS DOC_A1 "]]", WIRE_ERR_NO_BODY},
   {"msg unknown section kind 2", P_MSG, "[" H_MSG "00000000 00" DOC_PING " 02" DOC_A1 "]", WIRE_ERR_SECTION},
   {"msg unknown section kind ff", P_MSG, "[" H_MSG "00000000 ff" DOC_PING "]", WIRE_ERR_SECTION},
   {"msg body length truncated", P_MSG, "[" H_MSG "00000000 00 1e00]", WIRE_ERR_SHORT},
   {"msg body length over available",
    P_MSG,
    "[" H_MSG "00000000 00 1f000000 1070696e67000100000002246462000600000061646d696e0000]",
    WIRE_ERR_BSON},
   {"msg body length below 5", P_MSG, "[" H_MSG "00000000 00 04000000 00]", WIRE_ERR_BSON},
   {"msg body length negative", P_MSG, "[" H_MSG "00000000 00 ffffffff 00]", WIRE_ERR_BSON},
   {"msg body missing terminator", P_MSG, "[" H_MSG "00000000 00 0c000000 1061000100000001]", WIRE_ERR_BSON},
   {"msg body length short of its elements",
    P_MSG,
    "[" H_MSG "00000000 00 0b000000 10610001000000 00]",
    WIRE_ERR_BSON},
   {"msg nested doc overruns parent",
    P_MSG,
    "[" H_MSG "00000000 00 [ 0378 00 1a000000 10790001000000 00 00]]",
    WIRE_ERR_BSON},
   {"msg nested doc missing terminator",
    P_MSG,
    "[" H_MSG "00000000 00 [ 0378 00 0c000000 10790001000000 01 00]]",
    WIRE_ERR_BSON},
   {"msg nested doc shorter than its elements",
    P_MSG,
    "[" H_MSG "00000000 00 [ 0378 00 0b000000 10790001000000 00 00]]",
    WIRE_ERR_BSON},
   {"msg early terminator then garbage", P_MSG, "[" H_MSG "00000000 00 [ 00 1061000100000000]]", WIRE_ERR_BSON},
   {"msg unknown element type", P_MSG, "[" H_MSG "00000000 00 [ 55 6100 01000000 00]]", WIRE_ERR_BSON},
   {"msg string length overruns", P_MSG, "[" H_MSG "00000000 00 [ 02 6100 ffffff7f 6200 00]]", WIRE_ERR_BSON},
   {"msg string length zero", P_MSG, "[" H_MSG "00000000 00 [ 02 6100 00000000 00]]", WIRE_ERR_BSON},
   {"msg key not terminated", P_MSG, "[" H_MSG "00000000 00 [ 10 61616161 00]]", WIRE_ERR_BSON},
   {"msg bool 2", P_MSG, "[" H_MSG "00000000 00 [ 08 6100 02 00]]", WIRE_ERR_BSON},
   {"msg bool 1", P_MSG, "[" H_MSG "00000000 00 [ 08 6100 01 00]]", 0},
   {"msg binary", P_MSG, "[" H_MSG "00000000 00 [ 05 6100 03000000 04 010203 00]]", 0},
   {"msg binary length overruns", P_MSG, "[" H_MSG "00000000 00 [ 05 6100 04000000 04 010203 00]]", WIRE_ERR_BSON},
   {"msg binary negative length", P_MSG, "[" H_MSG "00000000 00 [ 05 6100 ffffffff 04 010203 00]]", WIRE_ERR_BSON},
   {"msg old binary", P_MSG, "[" H_MSG "00000000 00 [ 05 6100 06000000 02 02000000 0102 00]]", 0},
   {"msg old binary inner length wrong",
    P_MSG,
    "[" H_MSG "00000000 00 [ 05 6100 06000000 02 03000000 0102 00]]",
    WIRE_ERR_BSON},
   {"msg regex", P_MSG, "[" H_MSG "00000000 00 [ 0b 6100 5e7800 6900 00]]", 0},
   {"msg regex options unterminated", P_MSG, "[" H_MSG "00000000 00 [ 0b 6100 5e7800 69 00]]", WIRE_ERR_BSON},
   {"msg dbpointer", P_MSG, "[" H_MSG "00000000 00 [ 0c 6100 02000000 6300 0102030405060708090a0b0c 00]]", 0},
   {"msg dbpointer short oid",
    P_MSG,
    "[" H_MSG "00000000 00 [ 0c 6100 02000000 6300 0102030405060708090a0b 00]]",
    WIRE_ERR_BSON},
   {"msg code with scope", P_MSG, "[" H_MSG "00000000 00 [ 0f 6100 [ 02000000 7800" DOC_A1 "] 00]]", 0},
   {"msg code with scope, scope overruns",
    P_MSG,
    "[" H_MSG "00000000 00 [ 0f 6100 [ 02000000 7800 0d000000 1061000100000000] 00]]",
    WIRE_ERR_BSON},
   {"msg code with scope, scope unterminated",
    P_MSG,
    "[" H_MSG "00000000 00 [ 0f 6100 [ 02000000 7800 0c000000 1061000100000001] 00]]",
    WIRE_ERR_BSON},
   {"msg code with scope, nested scope doc unterminated",
    P_MSG,
    "[" H_MSG "00000000 00 [ 0f 6100 [ 02000000 7800 [ 0378 00 0c000000 10790001000000 01 00]] 00]]",
    WIRE_ERR_BSON},
   {"msg all fixed-size types",
    P_MSG,
    "[" H_MSG "00000000 00 [ 01 6100 000000000000f03f  07 6200 0102030405060708090a0b0c  09 6300 0100000000000000"
    " 0a 6400 06 6500 ff 6600 7f 6700 11 6800 0100000001000000 12 6900 0200000000000000"
    " 13 6a00 01000000000000000000000000004030  0d 6b00 02000000 7800  0e 6c00 02000000 7800 00]]",
    0},
   {"msg double truncated", P_MSG, "[" H_MSG "00000000 00 [ 01 6100 000000000000f0 00]]", WIRE_ERR_BSON},
   {"msg decimal truncated", P_MSG, "[" H_MSG "00000000 00 [ 13 6100 010000000000000000000000000040 00]]", WIRE_ERR_BSON},
   {"msg array", P_MSG, "[" H_MSG "00000000 00 [ 04 6100 [ 10 3000 01000000 10 3100 02000000 00] 00]]", 0},
   {"msg array unterminated",
    P_MSG,
    "[" H_MSG "00000000 00 [ 04 6100 0c000000 10 3000 01000000 01 00]]",
    WIRE_ERR_BSON},
   {"msg kind-1 size below 5",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT " 01 04000000 " ID_DOCUMENTS "]",
    WIRE_ERR_SECTION},
   {"msg kind-1 size over available",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT " 01 40000000 " ID_DOCUMENTS DOC_A1 "]",
    WIRE_ERR_SECTION},
   {"msg kind-1 size truncated", P_MSG, "[" H_MSG "00000000 00" DOC_INSERT " 01 0400]", WIRE_ERR_SHORT},
   {"msg kind-1 identifier unterminated",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT " 01[ 646f63756d656e7473]]",
    WIRE_ERR_SECTION},
   {"msg kind-1 doc overruns section",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT " 01 19000000 " ID_DOCUMENTS DOC_A1 "]",
    WIRE_ERR_BSON},
   {"msg kind-1 invalid doc",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT " 01[" ID_DOCUMENTS DOC_A1 " 0c000000 55610001000000 00]]",
    WIRE_ERR_BSON},
   {"msg duplicate identifiers",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT " 01[" ID_DOCUMENTS DOC_A1 "] 01[" ID_DOCUMENTS DOC_A2 "]]",
    WIRE_ERR_SECTION},
   {"msg identifier is a body field",
    P_MSG,
    "[" H_MSG "00000000 00" DOC_INSERT_INLINE " 01[" ID_DOCUMENTS DOC_A1 "]]",
    WIRE_ERR_SECTION},
   {"msg wrong checksum", P_MSG, "[" H_MSG "01000000 00" DOC_PING " 83920e3e]", WIRE_ERR_CHECKSUM},
   {"msg checksum of a flipped body",
    P_MSG,
    "[" H_MSG "01000000 00" DOC_PING " CCCCCCCC]",
    -1 /* built valid, then a body byte is flipped */},
   {"msg checksum flag without checksum", P_MSG, "[" H_MSG "01000000 00]", WIRE_ERR_SHORT},
   {"msg checksum flag, 3 bytes", P_MSG, "[" H_MSG "01000000 000000]", WIRE_ERR_SHORT},

   /* --- OP_QUERY --- */
   {"query legacy hello",
    P_QUERY,
    "[" H_QUERY "04000000 61646d696e2e24636d6400 00000000 ffffffff" DOC_HELLO_LEGACY "]",
    0},
   {"query with fields",
    P_QUERY,
    "[" H_QUERY "00000000 61646d696e2e24636d6400 00000000 ffffffff" DOC_PING DOC_FIELDS "]",
    0},
   {"query name unterminated", P_QUERY, "[" H_QUERY "00000000 61646d696e2e24636d64]", WIRE_ERR_SHORT},
   {"query no skip", P_QUERY, "[" H_QUERY "00000000 6100 0000]", WIRE_ERR_SHORT},
   {"query no document", P_QUERY, "[" H_QUERY "00000000 6100 00000000 ffffffff]", WIRE_ERR_SHORT},
   {"query trailing bytes",
    P_QUERY,
    "[" H_QUERY "00000000 6100 00000000 ffffffff" DOC_PING DOC_FIELDS "00]",
    WIRE_ERR_BSON},
   {"query invalid document",
    P_QUERY,
    "[" H_QUERY "00000000 6100 00000000 ffffffff 0c000000 1061000100000001]",
    WIRE_ERR_BSON},
   {"query given to msg", P_MSG, "[" H_QUERY "00000000 6100 00000000 ffffffff" DOC_PING "]", WIRE_ERR_OPCODE},

   /* --- OP_REPLY --- */
   {"reply one doc", P_REPLY, "[" H_REPLY "08000000 0000000000000000 00000000 01000000" DOC_PING "]", 0},
   {"reply two docs",
    P_REPLY,
    "[" H_REPLY "00000000 0100000000000000 00000000 02000000" DOC_A1 DOC_A2 "]",
    0},
   {"reply no docs", P_REPLY, "[" H_REPLY "00000000 0000000000000000 00000000 00000000]", 0},
   {"reply count mismatch",
    P_REPLY,
    "[" H_REPLY "00000000 0000000000000000 00000000 02000000" DOC_A1 "]",
    WIRE_ERR_BSON},
   {"reply truncated fields", P_REPLY, "[" H_REPLY "00000000 00000000]", WIRE_ERR_SHORT},
   {"reply invalid doc",
    P_REPLY,
    "[" H_REPLY "00000000 0000000000000000 00000000 01000000 0d000000 1061000100000000]",
    WIRE_ERR_BSON},

   /* --- OP_COMPRESSED framing (payloads are tested in test_compress.c) --- */
   {"compressed noop frame", P_COMPRESSED, "[" H_COMPRESSED "dd070000 05000000 00 0102030405]", 0},
   {"compressed empty payload", P_COMPRESSED, "[" H_COMPRESSED "dd070000 00000000 02]", 0},
   {"compressed truncated", P_COMPRESSED, "[" H_COMPRESSED "dd070000 0500]", WIRE_ERR_SHORT},
   {"compressed wraps compressed",
    P_COMPRESSED,
    "[" H_COMPRESSED "dc070000 05000000 00 0102030405]",
    WIRE_ERR_OPCODE},
   {"compressed wraps unknown", P_COMPRESSED, "[" H_COMPRESSED "da070000 05000000 00 0102030405]", WIRE_ERR_OPCODE},
   {"compressed negative size",
    P_COMPRESSED,
    "[" H_COMPRESSED "dd070000 ffffffff 00 0102030405]",
    WIRE_ERR_COMPRESSION},
};

static bool
run_parser (parser_t p, const uint8_t *b, size_t len, bson_error_t *err)
{
   wire_msg_t msg;
   wire_query_t q;
   wire_reply_t r;
   wire_compressed_t c;

   switch (p) {
   case P_MSG:
      return wire_parse_msg (b, len, &msg, err);
   case P_QUERY:
      return wire_parse_query (b, len, &q, err);
   case P_REPLY:
      return wire_parse_reply (b, len, &r, err);
   case P_COMPRESSED:
      return wire_parse_compressed (b, len, &c, err);
   }
   return false;
}

static void
test_table (void **state)
{
   static msgbuf_t m;
   int failures = 0;

   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      const msg_case_t *c = &cases[i];
      bson_error_t err = {0};
      int want = c->code;
      bool ok;

      uint8_t *exact;

      from_hex (c->hex, &m);
      if (want == -1) {
         m.b[WIRE_HEADER_LEN + 10] ^= 0x01;
         want = WIRE_ERR_CHECKSUM;
      }
      /* An exact-size heap copy: under ASan any read past the end fails. */
      exact = malloc (m.len);
      assert_non_null (exact);
      memcpy (exact, m.b, m.len);
      ok = run_parser (c->parser, exact, m.len, &err);
      free (exact);
      if (want == 0 && !ok) {
         print_error ("case \"%s\": expected success, got: %s\n", c->name, err.message);
         failures++;
      } else if (want != 0 && ok) {
         print_error ("case \"%s\": expected error %d, parsed\n", c->name, want);
         failures++;
      } else if (want != 0 && (err.domain != WIRE_ERROR_DOMAIN || (int) err.code != want)) {
         print_error ("case \"%s\": expected error %d, got %" PRIu32 ": %s\n", c->name, want, err.code, err.message);
         failures++;
      }
   }
   assert_int_equal (failures, 0);
}

/* Every strict prefix of a valid message, in a heap buffer of exactly its
 * size (so ASan sees any over-read), with the length field adjusted to pass
 * the framing check.  Prefixes are refused, except where a prefix is itself
 * a whole message: an OP_MSG cut after a section, an OP_COMPRESSED frame with
 * less payload. */
static void
test_truncations (void **state)
{
   static msgbuf_t m;

   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      const msg_case_t *c = &cases[i];
      bool may_parse = c->parser == P_COMPRESSED || strstr (c->hex, "01[") || strstr (c->hex, DOC_FIELDS);

      if (c->code != 0) {
         continue;
      }
      from_hex (c->hex, &m);
      for (size_t n = 0; n < m.len; n++) {
         uint8_t *cut = malloc (n ? n : 1);
         bson_error_t err;
         bool ok;

         assert_non_null (cut);
         memcpy (cut, m.b, n);
         if (n >= 4) {
            put32 (cut, (uint32_t) n);
         }
         ok = run_parser (c->parser, cut, n, &err);
         free (cut);
         if (ok && !may_parse) {
            fail_msg ("case \"%s\": prefix of %zu bytes parsed", c->name, n);
         }
      }
   }
}

/* ------------------------------------------------------------ fields */

static void
parse_hex_msg (const char *hex, msgbuf_t *m, wire_msg_t *msg)
{
   bson_error_t err;

   from_hex (hex, m);
   if (!wire_parse_msg (m->b, m->len, msg, &err)) {
      fail_msg ("parse failed: %s", err.message);
   }
}

static void
test_msg_fields (void **state)
{
   static msgbuf_t m;
   static wire_msg_t msg;

   parse_hex_msg ("[" H_MSG "00000000 00" DOC_INSERT " 01[" ID_DOCUMENTS DOC_A1 DOC_A2 DOC_A1 "] 01[" ID_UPDATES
                  "]]",
                  &m,
                  &msg);
   assert_int_equal (msg.header.length, (int32_t) m.len);
   assert_int_equal (msg.header.request_id, 7);
   assert_int_equal (msg.header.opcode, WIRE_OP_MSG);
   assert_string_equal (wire_command_name (&msg.body), "insert");
   assert_int_equal (msg.body_len, 33);
   assert_ptr_equal (msg.body_data, m.b + WIRE_HEADER_LEN + 5);
   assert_false (msg.checksum_present);
   assert_int_equal (msg.nsequences, 2);
   assert_string_equal (msg.sequences[0].identifier, "documents");
   assert_int_equal (msg.sequences[0].ndocs, 3);
   assert_int_equal (msg.sequences[0].docs_len, 36);
   assert_memory_equal (msg.sequences[0].docs + 12, m.b + m.len - 13 - 12 - 12, 12); /* {a: 2} */
   assert_string_equal (msg.sequences[1].identifier, "updates");
   assert_int_equal (msg.sequences[1].ndocs, 0);
   assert_int_equal (msg.sequences[1].docs_len, 0);

   parse_hex_msg ("[" H_MSG "03000100 00" DOC_PING " CCCCCCCC]", &m, &msg);
   assert_true (msg.checksum_present);
   assert_int_equal (msg.flags, 0x00010003u);
   assert_string_equal (wire_command_name (&msg.body), "ping");

   parse_hex_msg ("[" H_MSG "00000000 00" DOC_EMPTY "]", &m, &msg);
   assert_null (wire_command_name (&msg.body));
}

/* The validation pass notes the command name and where the top-level
 * "comment" is (routing and annotate_msg_present rely on it); a nested
 * "comment" does not count, a second one is flagged. */
static void
test_msg_facts (void **state)
{
   static wire_msg_t msg;
   static const struct {
      const char *json;
      const char *command;
      bool has_comment;
      bool repeated;
   } fact_cases[] = {
      {"{}", NULL, false, false},
      {"{\"ping\": 1, \"$db\": \"admin\"}", "ping", false, false},
      {"{\"find\": \"c\", \"filter\": {\"comment\": 1}, \"$db\": \"t\"}", "find", false, false},
      {"{\"insert\": \"c\", \"comment\": {\"relaybus\": {}}, \"$db\": \"t\"}", "insert", true, false},
      {"{\"comment\": \"x\", \"commentary\": 1, \"comment\": 2}", "comment", true, true},
      {"{\"commen\": 1, \"comments\": 2}", "commen", false, false},
   };

   for (size_t i = 0; i < sizeof fact_cases / sizeof fact_cases[0]; i++) {
      bson_error_t err;
      bson_t *body = bson_new_from_json ((const uint8_t *) fact_cases[i].json, -1, &err);
      struct evbuffer *out = evbuffer_new ();
      const uint8_t *buf;
      size_t len;

      assert_non_null (body);
      assert_true (wire_append_msg (out, 1, 0, 0, body, NULL, 0));
      len = evbuffer_get_length (out);
      buf = evbuffer_pullup (out, -1);
      assert_true (wire_parse_msg (buf, len, &msg, &err));
      if (fact_cases[i].command) {
         assert_non_null (msg.command);
         assert_string_equal (msg.command, fact_cases[i].command);
         assert_int_equal (msg.command_len, strlen (fact_cases[i].command));
      } else {
         assert_null (msg.command);
      }
      if (fact_cases[i].has_comment) {
         bson_iter_t it;
         assert_true (bson_iter_init_from_data_at_offset (&it, msg.body_data, msg.body_len, msg.comment_offset, 7));
         assert_string_equal (bson_iter_key (&it), "comment");
      } else {
         assert_int_equal (msg.comment_offset, 0);
      }
      assert_int_equal (msg.comment_repeated, fact_cases[i].repeated);
      evbuffer_free (out);
      bson_destroy (body);
   }
}

/* 64 sequences are accepted, 65 refused. */
static void
test_msg_max_sequences (void **state)
{
   static wire_sequence_t seqs[WIRE_MAX_SECTIONS + 1];
   static char ids[WIRE_MAX_SECTIONS + 1][8];
   static wire_msg_t msg;
   bson_t *body = BCON_NEW ("insert", "c", "$db", "t");

   for (int n = WIRE_MAX_SECTIONS; n <= WIRE_MAX_SECTIONS + 1; n++) {
      struct evbuffer *out = evbuffer_new ();
      bson_error_t err;
      bool ok;

      for (int i = 0; i < n; i++) {
         snprintf (ids[i], sizeof ids[i], "s%d", i % 1000);
         seqs[i] = (wire_sequence_t){ids[i], bson_get_data (body), body->len, 1};
      }
      assert_true (wire_append_msg (out, 1, 0, 0, body, seqs, (uint32_t) n));
      ok = wire_parse_msg (evbuffer_pullup (out, -1), evbuffer_get_length (out), &msg, &err);
      if (n == WIRE_MAX_SECTIONS) {
         assert_true (ok);
         assert_int_equal (msg.nsequences, WIRE_MAX_SECTIONS);
      } else {
         assert_false (ok);
         assert_int_equal (err.code, WIRE_ERR_SECTION);
      }
      evbuffer_free (out);
   }
   bson_destroy (body);
}

/* ------------------------------------------------------------ sequences at scale */

/* An OP_MSG built by hand: a body of `nkeys` null elements (keys
 * key_prefix followed by the element's index in `width` digits, or "" when
 * key_prefix is NULL), then
 * `last_key` when not NULL, then one sequence of one empty document per
 * identifier.  Returns the message (free it) and its length. */
static uint8_t *
big_msg (size_t nkeys, const char *key_prefix, int width, const char *last_key, const char *const *ids, size_t nids, size_t *len_out)
{
   size_t cap = 64 + nkeys * 24 + (last_key ? strlen (last_key) + 2 : 0);
   uint8_t *m, *p, *body;
   char key[32];

   for (size_t i = 0; i < nids; i++)
      cap += 1 + 4 + strlen (ids[i]) + 1 + 5;
   m = malloc (cap);
   assert_non_null (m);
   p = m + WIRE_HEADER_LEN;
   put32 (m + 4, 7);
   put32 (m + 8, 0);
   put32 (m + 12, WIRE_OP_MSG);
   put32 (p, 0);
   p += 4;
   *p++ = 0;
   body = p;
   p += 4;
   for (size_t i = 0; i < nkeys; i++) {
      size_t kl = 0;
      if (key_prefix)
         kl = (size_t) snprintf (key, sizeof key, "%s%0*zu", key_prefix, width, i);
      *p++ = 0x0a; /* null */
      memcpy (p, key, kl);
      p += kl;
      *p++ = 0;
   }
   if (last_key) {
      *p++ = 0x0a;
      memcpy (p, last_key, strlen (last_key) + 1);
      p += strlen (last_key) + 1;
   }
   *p++ = 0;
   put32 (body, (uint32_t) (p - body));
   for (size_t i = 0; i < nids; i++) {
      size_t il = strlen (ids[i]) + 1;
      *p++ = 1;
      put32 (p, (uint32_t) (4 + il + 5));
      p += 4;
      memcpy (p, ids[i], il);
      p += il;
      memcpy (p, "\x05\x00\x00\x00\x00", 5);
      p += 5;
   }
   assert_true ((size_t) (p - m) <= cap);
   *len_out = (size_t) (p - m);
   put32 (m, (uint32_t) *len_out);
   return m;
}

static double
parse_ms (const uint8_t *m, size_t len, bool expect_ok)
{
   static wire_msg_t msg;
   bson_error_t err;
   struct timespec a, b;
   bool ok;

   clock_gettime (CLOCK_MONOTONIC, &a);
   ok = wire_parse_msg (m, len, &msg, &err);
   clock_gettime (CLOCK_MONOTONIC, &b);
   if (ok != expect_ok)
      fail_msg ("parse %s: %s", ok ? "succeeded" : "failed", ok ? "" : err.message);
   return (double) (b.tv_sec - a.tv_sec) * 1e3 + (double) (b.tv_nsec - a.tv_nsec) / 1e6;
}

/* The identifiers are checked against each other and against the body's
 * keys in time linear in the message: a duplicate among 64, an identifier
 * equal to the last of many body keys, lengths that share the hash's
 * length bucket; and a body of a million keys costs about as much with 64
 * sequences as with one (pairwise comparison made it 64 times more). */
static void
test_msg_sequences_linear (void **state)
{
   static const char *ids[WIRE_MAX_SECTIONS];
   static char idbuf[WIRE_MAX_SECTIONS][16];
   static wire_msg_t msg;
   const char *long_id = "a-sequence-identifier-longer-than-sixty-three-bytes-0123456789abcdef";
   const char *long_other = "a-sequence-identifier-longer-than-sixty-three-bytes-0123456789abcdeX";
   bson_error_t err;
   uint8_t *m;
   size_t len;
   double one = 1e9, many = 1e9;

   for (int i = 0; i < WIRE_MAX_SECTIONS; i++) {
      snprintf (idbuf[i], sizeof idbuf[i], "seq%02d", i);
      ids[i] = idbuf[i];
   }

   /* 64 distinct identifiers beside 10,000 keys of the same length. */
   m = big_msg (10000, "k", 4, NULL, ids, WIRE_MAX_SECTIONS, &len);
   assert_true (wire_parse_msg (m, len, &msg, &err));
   assert_int_equal (msg.nsequences, WIRE_MAX_SECTIONS);
   free (m);

   /* The last identifier repeats the first: a duplicate. */
   ids[WIRE_MAX_SECTIONS - 1] = ids[0];
   m = big_msg (10, "k", 1, NULL, ids, WIRE_MAX_SECTIONS, &len);
   assert_false (wire_parse_msg (m, len, &msg, &err));
   assert_int_equal (err.code, WIRE_ERR_SECTION);
   assert_non_null (strstr (err.message, "duplicate document sequence \"seq00\""));
   free (m);
   ids[WIRE_MAX_SECTIONS - 1] = idbuf[WIRE_MAX_SECTIONS - 1];

   /* The body's last key, after 100,000 others, is the 40th identifier. */
   m = big_msg (100000, "k", 5, "seq39", ids, WIRE_MAX_SECTIONS, &len);
   assert_false (wire_parse_msg (m, len, &msg, &err));
   assert_int_equal (err.code, WIRE_ERR_SECTION);
   assert_non_null (strstr (err.message, "\"seq39\" is also a field of the body"));
   free (m);

   /* Identifiers and keys of 64 bytes and more share a length bucket:
    * only an equal one is refused. */
   {
      const char *long_ids[2] = {long_id, "documents"};
      m = big_msg (100, "k", 1, long_other, long_ids, 2, &len);
      assert_true (wire_parse_msg (m, len, &msg, &err));
      free (m);
      m = big_msg (100, "k", 1, long_id, long_ids, 2, &len);
      assert_false (wire_parse_msg (m, len, &msg, &err));
      assert_int_equal (err.code, WIRE_ERR_SECTION);
      free (m);
   }

   /* A million empty keys: 64 sequences cost about what one does.  The
    * best of three runs each, so a busy machine does not decide it. */
   for (int run = 0; run < 3; run++) {
      double t;
      m = big_msg (1000000, NULL, 0, NULL, ids, 1, &len);
      t = parse_ms (m, len, true);
      one = t < one ? t : one;
      free (m);
      m = big_msg (1000000, NULL, 0, NULL, ids, WIRE_MAX_SECTIONS, &len);
      t = parse_ms (m, len, true);
      many = t < many ? t : many;
      free (m);
   }
   if (many > 4 * one + 5)
      fail_msg ("a million keys: %.1f ms with 64 sequences, %.1f ms with one: not linear", many, one);
}

/* A document may be at most WIRE_MAX_BSON_LEN bytes (mongod's limit):
 * one byte more is refused from its length field, before it is walked. */
static void
test_msg_document_limit (void **state)
{
   static wire_msg_t msg;
   bson_error_t err;
   size_t len;
   /* 2-byte null elements with empty keys: body = 4 + 2n + 1 bytes. */
   size_t n = (WIRE_MAX_BSON_LEN - 5) / 2;
   uint8_t *m;

   /* (WIRE_MAX_BSON_LEN - 5) is odd: one 3-byte element keyed "x" evens it. */
   m = big_msg (n - 1, NULL, 0, "x", NULL, 0, &len);
   assert_int_equal (len, WIRE_HEADER_LEN + 4 + 1 + WIRE_MAX_BSON_LEN);
   assert_true (wire_parse_msg (m, len, &msg, &err));
   free (m);
   m = big_msg (n, NULL, 0, "x", NULL, 0, &len);
   assert_int_equal (len, WIRE_HEADER_LEN + 4 + 1 + WIRE_MAX_BSON_LEN + 2);
   assert_false (wire_parse_msg (m, len, &msg, &err));
   assert_int_equal (err.code, WIRE_ERR_TOO_LARGE);
   free (m);
}

/* Nesting up to WIRE_MAX_BSON_DEPTH is accepted, one more level refused,
 * and a document nested far deeper (a stack-exhaustion attempt) is refused
 * without recursion. */
static void
test_bson_depth (void **state)
{
   static const int depths[] = {1, WIRE_MAX_BSON_DEPTH, WIRE_MAX_BSON_DEPTH + 1, 100000};

   for (size_t k = 0; k < sizeof depths / sizeof depths[0]; k++) {
      int depth = depths[k];
      /* {"a": {"a": ... {} ...}}: each level is 4 + 3 bytes + NUL. */
      size_t doclen = 5 + (size_t) depth * 8;
      size_t len = WIRE_HEADER_LEN + 4 + 1 + doclen;
      uint8_t *b = malloc (len);
      static wire_msg_t msg;
      bson_error_t err;
      size_t p = 0;
      bool ok;

      assert_non_null (b);
      put32 (b, (uint32_t) len);
      put32 (b + 4, 1);
      put32 (b + 8, 0);
      put32 (b + 12, WIRE_OP_MSG);
      put32 (b + 16, 0);
      b[20] = 0;
      p = 21;
      for (int i = 0; i < depth; i++) {
         put32 (b + p, (uint32_t) (doclen - (size_t) i * 8));
         b[p + 4] = 0x03;
         b[p + 5] = 'a';
         b[p + 6] = 0;
         p += 7;
      }
      put32 (b + p, 5);
      b[p + 4] = 0;
      p += 5;
      for (int i = 0; i < depth; i++) {
         b[p++] = 0;
      }
      assert_int_equal (p, len);
      ok = wire_parse_msg (b, len, &msg, &err);
      if (depth <= WIRE_MAX_BSON_DEPTH) {
         if (!ok) {
            fail_msg ("depth %d: %s", depth, err.message);
         }
         assert_true (bson_validate (&msg.body, BSON_VALIDATE_NONE, NULL));
      } else {
         assert_false (ok);
         assert_int_equal (err.code, WIRE_ERR_BSON);
      }
      free (b);
   }
}

/* Documents built by libbson with every type parse. */
static void
test_bson_all_types (void **state)
{
   bson_t *scope = BCON_NEW ("x", BCON_INT32 (1));
   bson_t *arr = BCON_NEW ("0", BCON_INT32 (1), "1", "two");
   bson_t *body = bson_new ();
   bson_oid_t oid;
   bson_decimal128_t dec;
   uint8_t bin[3] = {1, 2, 3};
   struct evbuffer *out = evbuffer_new ();
   static wire_msg_t msg;
   bson_error_t err;

   bson_oid_init_from_string (&oid, "0123456789abcdef01234567");
   bson_decimal128_from_string ("1.5", &dec);
   BSON_APPEND_UTF8 (body, "find", "c");
   BSON_APPEND_DOUBLE (body, "d", 1.5);
   BSON_APPEND_DOCUMENT (body, "doc", scope);
   BSON_APPEND_ARRAY (body, "arr", arr);
   BSON_APPEND_BINARY (body, "bin", BSON_SUBTYPE_UUID, bin, 3);
   BSON_APPEND_BINARY (body, "old", BSON_SUBTYPE_BINARY_DEPRECATED, bin, 3);
   BSON_APPEND_UNDEFINED (body, "u");
   BSON_APPEND_OID (body, "oid", &oid);
   BSON_APPEND_BOOL (body, "t", true);
   BSON_APPEND_DATE_TIME (body, "dt", 1234);
   BSON_APPEND_NULL (body, "n");
   BSON_APPEND_REGEX (body, "re", "^a", "i");
   BSON_APPEND_DBPOINTER (body, "dbp", "c", &oid);
   BSON_APPEND_CODE (body, "code", "x");
   BSON_APPEND_SYMBOL (body, "sym", "s");
   BSON_APPEND_CODE_WITH_SCOPE (body, "cws", "x", scope);
   BSON_APPEND_INT32 (body, "i", 1);
   BSON_APPEND_TIMESTAMP (body, "ts", 1, 2);
   BSON_APPEND_INT64 (body, "l", 3);
   BSON_APPEND_DECIMAL128 (body, "dec", &dec);
   BSON_APPEND_MINKEY (body, "min");
   BSON_APPEND_MAXKEY (body, "max");
   BSON_APPEND_UTF8 (body, "$db", "t");

   assert_true (wire_append_msg (out, 1, 0, 0, body, NULL, 0));
   if (!wire_parse_msg (evbuffer_pullup (out, -1), evbuffer_get_length (out), &msg, &err)) {
      fail_msg ("%s", err.message);
   }
   assert_true (bson_equal (&msg.body, body));
   evbuffer_free (out);
   bson_destroy (body);
   bson_destroy (arr);
   bson_destroy (scope);
}

/* ------------------------------------------------------------ header */

static void
test_header (void **state)
{
   static const struct {
      int32_t length;
      int32_t opcode;
      uint32_t max;
      int code;
   } hdrs[] = {
      {16, WIRE_OP_MSG, 0, 0},
      {48000000, WIRE_OP_MSG, 0, 0},
      {48000001, WIRE_OP_MSG, 0, WIRE_ERR_TOO_LARGE},
      {INT32_MAX, WIRE_OP_QUERY, 0, WIRE_ERR_TOO_LARGE},
      {1000, WIRE_OP_MSG, 999, WIRE_ERR_TOO_LARGE},
      {999, WIRE_OP_MSG, 999, 0},
      {15, WIRE_OP_MSG, 0, WIRE_ERR_SHORT},
      {0, WIRE_OP_MSG, 0, WIRE_ERR_SHORT},
      {-1, WIRE_OP_MSG, 0, WIRE_ERR_SHORT},
      {INT32_MIN, WIRE_OP_MSG, 0, WIRE_ERR_SHORT},
      {100, 2010 /* OP_COMMAND */, 0, WIRE_ERR_OPCODE},
      {100, 2001 /* OP_UPDATE */, 0, WIRE_ERR_OPCODE},
      {100, 0, 0, WIRE_ERR_OPCODE},
      {100, WIRE_OP_REPLY, 0, 0},
      {100, WIRE_OP_QUERY, 0, 0},
      {100, WIRE_OP_COMPRESSED, 0, 0},
   };
   uint8_t raw[WIRE_HEADER_LEN];
   wire_header_t h;

   for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++) {
      bson_error_t err = {0};

      put32 (raw, (uint32_t) hdrs[i].length);
      put32 (raw + 4, 0x01020304);
      put32 (raw + 8, 0xfffffffe);
      put32 (raw + 12, (uint32_t) hdrs[i].opcode);
      assert_true (wire_peek_header (raw, sizeof raw, &h));
      assert_int_equal (h.length, hdrs[i].length);
      assert_int_equal (h.request_id, 0x01020304);
      assert_int_equal (h.response_to, -2);
      assert_int_equal (h.opcode, hdrs[i].opcode);
      if (hdrs[i].code == 0) {
         assert_true (wire_check_header (&h, hdrs[i].max, &err));
      } else {
         assert_false (wire_check_header (&h, hdrs[i].max, &err));
         assert_int_equal (err.domain, WIRE_ERROR_DOMAIN);
         assert_int_equal (err.code, hdrs[i].code);
      }
   }
   for (size_t n = 0; n < WIRE_HEADER_LEN; n++) {
      assert_false (wire_peek_header (raw, n, &h));
   }
   assert_string_equal (wire_opcode_name (WIRE_OP_MSG), "OP_MSG");
   assert_string_equal (wire_opcode_name (WIRE_OP_COMPRESSED), "OP_COMPRESSED");
   assert_string_equal (wire_opcode_name (2010), "unknown");
}

/* ------------------------------------------------------------ OP_QUERY */

static void
test_query_hello (void **state)
{
   static msgbuf_t m;
   wire_query_t q;
   bson_error_t err;
   bson_iter_t it;

   from_hex ("[" H_QUERY "04000000 61646d696e2e24636d6400 00000000 ffffffff" DOC_HELLO_LEGACY "]", &m);
   assert_true (wire_parse_query (m.b, m.len, &q, &err));
   assert_int_equal (q.flags, 4);
   assert_string_equal (q.full_collection_name, "admin.$cmd");
   assert_int_equal (q.number_to_skip, 0);
   assert_int_equal (q.number_to_return, -1);
   assert_false (q.has_fields);
   assert_true (bson_iter_init_find (&it, &q.query, "isMaster"));
   assert_int_equal (bson_iter_int32 (&it), 1);
   assert_true (bson_iter_init_find (&it, &q.query, "compression"));
   assert_true (BSON_ITER_HOLDS_ARRAY (&it));

   /* The builder writes the same bytes back. */
   {
      struct evbuffer *out = evbuffer_new ();
      assert_true (wire_append_query (out, 7, 4, "admin.$cmd", 0, -1, &q.query));
      assert_int_equal (evbuffer_get_length (out), m.len);
      assert_memory_equal (evbuffer_pullup (out, -1), m.b, m.len);
      evbuffer_free (out);
   }

   from_hex ("[" H_QUERY "00000000 61646d696e2e24636d6400 00000000 ffffffff" DOC_PING DOC_FIELDS "]", &m);
   assert_true (wire_parse_query (m.b, m.len, &q, &err));
   assert_true (q.has_fields);
   assert_true (bson_iter_init_find (&it, &q.fields, "client"));
}

/* ------------------------------------------------------------ OP_REPLY */

static void
test_reply_round_trip (void **state)
{
   bson_t *doc = BCON_NEW ("ismaster", BCON_BOOL (true), "maxWireVersion", BCON_INT32 (21), "ok", BCON_DOUBLE (1));
   struct evbuffer *out = evbuffer_new ();
   static msgbuf_t m;
   wire_reply_t r;
   bson_error_t err;
   uint8_t *b;
   size_t len;

   assert_true (wire_append_reply (out, 42, 7, 8, doc));
   len = evbuffer_get_length (out);
   b = evbuffer_pullup (out, -1);
   assert_int_equal (len, WIRE_HEADER_LEN + 20 + doc->len);
   assert_true (wire_parse_reply (b, len, &r, &err));
   assert_int_equal (r.header.length, (int32_t) len);
   assert_int_equal (r.header.request_id, 42);
   assert_int_equal (r.header.response_to, 7);
   assert_int_equal (r.header.opcode, WIRE_OP_REPLY);
   assert_int_equal (r.flags, 8);
   assert_int_equal (r.cursor_id, 0);
   assert_int_equal (r.starting_from, 0);
   assert_int_equal (r.number_returned, 1);
   assert_true (r.has_doc);
   assert_true (bson_equal (&r.doc, doc));
   assert_int_equal (r.docs_len, doc->len);

   evbuffer_free (out);

   out = evbuffer_new ();
   assert_true (wire_append_reply (out, 1, 2, 0, NULL));
   assert_true (wire_parse_reply (evbuffer_pullup (out, -1), evbuffer_get_length (out), &r, &err));
   assert_false (r.has_doc);
   assert_int_equal (r.number_returned, 0);
   evbuffer_free (out);

   from_hex ("[" H_REPLY "00000000 efcdab8967452301 05000000 02000000" DOC_A1 DOC_A2 "]", &m);
   assert_true (wire_parse_reply (m.b, m.len, &r, &err));
   assert_int_equal (r.cursor_id, 0x0123456789abcdefLL);
   assert_int_equal (r.starting_from, 5);
   assert_int_equal (r.number_returned, 2);
   assert_int_equal (r.docs_len, 24);
   assert_int_equal (bson_get_data (&r.doc)[7], 1); /* the first: {a: 1} */
   bson_destroy (doc);
}

/* ------------------------------------------------------------ builders */

/* Parse, rebuild from the parsed struct, get the same bytes. */
static void
test_msg_reencode (void **state)
{
   static const char *const hexes[] = {
      "[" H_MSG "00000000 00" DOC_PING "]",
      "[" H_MSG "02000100 00" DOC_INSERT " 01[" ID_DOCUMENTS DOC_A1 DOC_A2 "] 01[" ID_UPDATES "]]",
   };
   static msgbuf_t m;
   static wire_msg_t msg;

   for (size_t i = 0; i < sizeof hexes / sizeof hexes[0]; i++) {
      struct evbuffer *out = evbuffer_new ();

      parse_hex_msg (hexes[i], &m, &msg);
      assert_true (wire_append_msg (out,
                                    msg.header.request_id,
                                    msg.header.response_to,
                                    msg.flags,
                                    &msg.body,
                                    msg.sequences,
                                    msg.nsequences));
      assert_int_equal (evbuffer_get_length (out), m.len);
      assert_memory_equal (evbuffer_pullup (out, -1), m.b, m.len);
      evbuffer_free (out);
   }

   /* A checksummed message is rebuilt without its checksum, and the flag
    * goes with it. */
   {
      struct evbuffer *out = evbuffer_new ();
      static wire_msg_t again;
      bson_error_t err;

      parse_hex_msg ("[" H_MSG "01000000 00" DOC_PING " CCCCCCCC]", &m, &msg);
      assert_true (wire_append_msg (out, 9, 7, msg.flags, &msg.body, NULL, 0));
      assert_int_equal (evbuffer_get_length (out), m.len - 4);
      assert_true (wire_parse_msg (evbuffer_pullup (out, -1), evbuffer_get_length (out), &again, &err));
      assert_false (again.checksum_present);
      assert_int_equal (again.header.response_to, 7);
      assert_true (bson_equal (&again.body, &msg.body));
      evbuffer_free (out);
   }
}

static void
test_builders_refuse_oversize (void **state)
{
   struct evbuffer *out = evbuffer_new ();
   bson_t *body = BCON_NEW ("insert", "c");
   /* Never read: the size check comes first. */
   wire_sequence_t big = {"documents", NULL, WIRE_MAX_MESSAGE_LEN, 1};

   assert_false (wire_append_msg (out, 1, 0, 0, body, &big, 1));
   assert_int_equal (evbuffer_get_length (out), 0);
   big.docs_len = WIRE_MAX_MESSAGE_LEN - WIRE_HEADER_LEN - 5 - body->len - 15;
   big.docs = calloc (1, big.docs_len);
   assert_non_null (big.docs);
   assert_true (wire_append_msg (out, 1, 0, 0, body, &big, 1));
   assert_int_equal (evbuffer_get_length (out), WIRE_MAX_MESSAGE_LEN);
   free ((void *) big.docs);
   evbuffer_free (out);
   bson_destroy (body);
}

/* ------------------------------------------------------------ CRC-32C */

static uint32_t
crc_bitwise (const uint8_t *p, size_t len)
{
   uint32_t c = 0xffffffffu;

   while (len--) {
      c ^= *p++;
      for (int k = 0; k < 8; k++) {
         c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      }
   }
   return ~c;
}

static void
test_crc32c (void **state)
{
   static const struct {
      const char *in;
      uint32_t crc;
   } vectors[] = {
      {"", 0},
      {"123456789", 0xe3069283u},
      {"a", 0xc1d04330u},
      {"The quick brown fox jumps over the lazy dog", 0x22620404u},
   };
   uint8_t buf[300];

   for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
      const uint8_t *p = (const uint8_t *) vectors[i].in;
      size_t n = strlen (vectors[i].in);
      assert_int_equal (wire_crc32c (0, p, n), vectors[i].crc);
      assert_int_equal (wire_crc32c_sw (0, p, n), vectors[i].crc);
      assert_int_equal (crc_bitwise (p, n), vectors[i].crc);
   }
   /* 32 zero bytes, from RFC 3720 B.4. */
   memset (buf, 0, 32);
   assert_int_equal (wire_crc32c (0, buf, 32), 0x8a9136aau);
   memset (buf, 0xff, 32);
   assert_int_equal (wire_crc32c (0, buf, 32), 0x62a8ab43u);

   /* Both paths agree with the bitwise definition at every length and
    * alignment, and chain. */
   for (size_t i = 0; i < sizeof buf; i++) {
      buf[i] = (uint8_t) (i * 131u + 7u);
   }
   for (size_t off = 0; off < 8; off++) {
      for (size_t n = 0; n + off <= sizeof buf; n += 1 + n / 16) {
         uint32_t want = crc_bitwise (buf + off, n);
         size_t half = n / 3;
         assert_int_equal (wire_crc32c (0, buf + off, n), want);
         assert_int_equal (wire_crc32c_sw (0, buf + off, n), want);
         assert_int_equal (wire_crc32c (wire_crc32c (0, buf + off, half), buf + off + half, n - half), want);
         assert_int_equal (wire_crc32c_sw (wire_crc32c_sw (0, buf + off, half), buf + off + half, n - half), want);
      }
   }
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_table),
      cmocka_unit_test (test_truncations),
      cmocka_unit_test (test_msg_fields),
      cmocka_unit_test (test_msg_facts),
      cmocka_unit_test (test_msg_max_sequences),
      cmocka_unit_test (test_msg_sequences_linear),
      cmocka_unit_test (test_msg_document_limit),
      cmocka_unit_test (test_bson_depth),
      cmocka_unit_test (test_bson_all_types),
      cmocka_unit_test (test_header),
      cmocka_unit_test (test_query_hello),
      cmocka_unit_test (test_reply_round_trip),
      cmocka_unit_test (test_msg_reencode),
      cmocka_unit_test (test_builders_refuse_oversize),
      cmocka_unit_test (test_crc32c),
   };

   return cmocka_run_group_tests_name ("wire", tests, NULL, NULL);
}
