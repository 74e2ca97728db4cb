/*
 * codec/wire.c - the MongoDB wire protocol codec.
 *
 * Parsing is a single forward pass over a caller-owned contiguous buffer
 * through a bounds-checked cursor (reader_t): every length read from the
 * message is attacker-controlled, so each one is checked against what is left
 * before it is used, in size_t arithmetic that cannot overflow.  Nothing is
 * allocated and nothing is copied; parsed structs point into the buffer.
 * Each BSON document's length must fit the span left and end in a NUL, and
 * check_bson walks every element, nested documents included, before
 * bson_init_static wraps it.
 *
 * Building writes little-endian integers byte by byte into space reserved
 * once in the destination evbuffer, so a message costs one copy.
 *
 * Not here: the compression algorithms (codec/compress.c) and anything about
 * connections.
 */
#include "codec/wire.h"

#include <inttypes.h>
#include <pthread.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/keyhash.h"
#include "codec/compress.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define WIRE_HAVE_SSE42 1
#endif

/* OP_MSG: flags, then at least one section kind byte. */
#define MSG_FLAGS_LEN 4
#define MSG_CHECKSUM_LEN 4
/* OP_COMPRESSED: originalOpcode, uncompressedSize, compressorId. */
#define COMPRESSED_PREFIX_LEN 9
/* OP_REPLY: flags, cursorID, startingFrom, numberReturned. */
#define REPLY_PREFIX_LEN 20
/* The smallest BSON document: int32 length and the terminating NUL. */
#define BSON_MIN_LEN 5

/* ------------------------------------------------------------ byte order */

static inline uint8_t *
put_bytes (uint8_t *p, const void *src, size_t len)
{
   if (len) {
      memcpy (p, src, len);
   }
   return p + len;
}

static uint8_t *
put_header (uint8_t *p, uint32_t length, int32_t request_id, int32_t response_to, int32_t opcode)
{
   p = wire_put_u32 (p, length);
   p = wire_put_i32 (p, request_id);
   p = wire_put_i32 (p, response_to);
   return wire_put_i32 (p, opcode);
}

/* ------------------------------------------------------------ the cursor */

/* A read cursor over [p, p + len).  Invariant: off <= len. */
typedef struct {
   const uint8_t *p;
   size_t len;
   size_t off;
} reader_t;

static inline size_t
rd_left (const reader_t *r)
{
   return r->len - r->off;
}

static inline bool
rd_u8 (reader_t *r, uint8_t *v)
{
   if (rd_left (r) < 1) {
      return false;
   }
   *v = r->p[r->off++];
   return true;
}

static inline bool
rd_i32 (reader_t *r, int32_t *v)
{
   if (rd_left (r) < 4) {
      return false;
   }
   *v = wire_get_i32 (r->p + r->off);
   r->off += 4;
   return true;
}

static inline bool
rd_i64 (reader_t *r, int64_t *v)
{
   if (rd_left (r) < 8) {
      return false;
   }
   *v = wire_get_i64 (r->p + r->off);
   r->off += 8;
   return true;
}

/* A NUL-terminated string wholly inside the cursor's span. */
static bool
rd_cstring (reader_t *r, const char **s, size_t *slen)
{
   const uint8_t *start = r->p + r->off;
   const uint8_t *nul = memchr (start, 0, rd_left (r));

   if (!nul) {
      return false;
   }
   *s = (const char *) start;
   *slen = (size_t) (nul - start);
   r->off += *slen + 1;
   return true;
}

/* ------------------------------------------------------------ BSON */

/* A string value at d[o]: int32 length counting the NUL, bytes, NUL.
 * `avail` bytes are available.  Sets *need to the value's size. */
static bool
check_string (const uint8_t *d, size_t o, size_t avail, size_t *need)
{
   int32_t l;

   if (avail < 4) {
      return false;
   }
   l = wire_get_i32 (d + o);
   if (l < 1 || (size_t) l > avail - 4 || d[o + 4 + (size_t) l - 1] != 0) {
      return false;
   }
   *need = 4 + (size_t) l;
   return true;
}

/* The document sequences' identifiers of one OP_MSG, for the checks that
 * identifiers are unique and that none is a top-level key of the body.  An
 * open-addressing hash table (linear probing, at most WIRE_MAX_SECTIONS
 * entries in twice as many slots) so each check costs one hash of the key
 * and a probe or two: the body's keys are checked in the same pass that
 * validates the body, linear in its size whatever the number of sequences.
 * `len_mask` has bit min(length, 63) set for each identifier: most keys are
 * ruled out by their length before anything is hashed. */
#define SEQ_SLOTS (2 * WIRE_MAX_SECTIONS)
typedef struct {
   const char *id[SEQ_SLOTS]; /* NUL-terminated, inside the message; NULL: free */
   uint32_t id_len[SEQ_SLOTS];
   uint64_t len_mask;
} seq_ids_t;

static inline uint64_t
seq_len_bit (size_t len)
{
   return (uint64_t) 1 << (len < 63 ? len : 63);
}

/* The identifiers and the body's keys are the client's: keyed
 * (base/keyhash.h), so that no message's keys all probe one run of slots. */
static uint32_t
seq_hash (const char *key, size_t len)
{
   return (uint32_t) keyhash (key, len);
}

/* Whether `key` (len bytes) is one of the identifiers.  The table always
 * has a free slot (SEQ_SLOTS > WIRE_MAX_SECTIONS), so probing ends. */
static bool
seq_ids_find (const seq_ids_t *t, const char *key, size_t len)
{
   uint32_t i;

   if (!(t->len_mask & seq_len_bit (len))) {
      return false;
   }
   for (i = seq_hash (key, len) & (SEQ_SLOTS - 1); t->id[i]; i = (i + 1) & (SEQ_SLOTS - 1)) {
      if (t->id_len[i] == len && memcmp (t->id[i], key, len) == 0) {
         return true;
      }
   }
   return false;
}

/* Adds an identifier; false if it is already there. */
static bool
seq_ids_add (seq_ids_t *t, const char *id, size_t len)
{
   uint32_t i;

   for (i = seq_hash (id, len) & (SEQ_SLOTS - 1); t->id[i]; i = (i + 1) & (SEQ_SLOTS - 1)) {
      if (t->id_len[i] == len && memcmp (t->id[i], id, len) == 0) {
         return false;
      }
   }
   t->id[i] = id;
   t->id_len[i] = (uint32_t) len;
   t->len_mask |= seq_len_bit (len);
   return true;
}

/* What check_bson notes about a document's top level on its way through. */
typedef struct {
   const char *first_key; /* NULL: no element */
   size_t first_key_len;
   size_t comment_pos;    /* offset of the first "comment" element; 0: none */
   bool comment_repeated;
   /* In: the message's sequence identifiers (NULL or none: no check).
    * Out: the first top-level key that is one of them, NULL if none. */
   const seq_ids_t *seq_ids;
   const char *seq_clash;
} doc_facts_t;

#define COMMENT_KEY "comment"
#define COMMENT_KEY_LEN (sizeof COMMENT_KEY - 1)

/*
 * Validates the BSON document d[0, len), whose length field the caller has
 * checked equals len and whose last byte is NUL.  With `facts`, also notes
 * the first key and where a "comment" key is at the top level (one pass
 * serves both validation and routing).
 *
 * Why not bson_validate: libbson 1.23's validator skips an embedded document
 * whose bson_init_static fails (a nested document without its terminator
 * passes), and it recurses once per nesting level with no limit, so a
 * 16 MB document of nested empty documents exhausts the stack.  This walk is
 * iterative, bounded by WIRE_MAX_BSON_DEPTH (mongod's default limit), and at
 * least as strict as bson_iter_next, so anything it accepts libbson can
 * iterate to the end (the fuzz target checks that).  UTF-8 is not checked,
 * as mongod does not.
 */
static bool
check_bson (const uint8_t *d, size_t len, doc_facts_t *facts, const char **why)
{
   size_t ends[WIRE_MAX_BSON_DEPTH]; /* the enclosing documents' ends */
   size_t depth = 0;
   size_t pos = 4;  /* next element's type byte */
   size_t end = len; /* current document's end; its NUL is at end - 1 */

   for (;;) {
      uint8_t type = d[pos];
      const uint8_t *nul;
      size_t o, avail, need = 0;
      int32_t l;

      /* Invariant: 4 <= pos <= end - 1, and d[end - 1] is what must be NUL. */
      if (type == 0) {
         if (pos != end - 1) {
            *why = "terminator before the end of the document";
            return false;
         }
         if (depth == 0) {
            return true;
         }
         pos = end;
         end = ends[--depth];
         if (pos >= end) {
            *why = "embedded document overruns its parent";
            return false;
         }
         continue;
      }
      if (pos == end - 1) {
         *why = "document is not terminated";
         return false;
      }
      /* The key, then the value: both must end before the terminator. */
      nul = memchr (d + pos + 1, 0, end - 1 - (pos + 1));
      if (!nul) {
         *why = "key is not terminated";
         return false;
      }
      o = (size_t) (nul - d) + 1;
      avail = end - 1 - o;
      if (depth == 0 && facts) {
         const char *key = (const char *) d + pos + 1;
         size_t klen = o - 1 - (pos + 1);

         if (!facts->first_key) {
            facts->first_key = key;
            facts->first_key_len = klen;
         }
         if (klen == COMMENT_KEY_LEN && memcmp (key, COMMENT_KEY, COMMENT_KEY_LEN) == 0) {
            if (facts->comment_pos)
               facts->comment_repeated = true;
            else
               facts->comment_pos = pos;
         }
         if (facts->seq_ids && !facts->seq_clash && seq_ids_find (facts->seq_ids, key, klen)) {
            facts->seq_clash = key;
         }
      }

      switch (type) {
      case BSON_TYPE_DOUBLE:
      case BSON_TYPE_DATE_TIME:
      case BSON_TYPE_TIMESTAMP:
      case BSON_TYPE_INT64:
         need = 8;
         break;
      case BSON_TYPE_INT32:
         need = 4;
         break;
      case BSON_TYPE_OID:
         need = 12;
         break;
      case BSON_TYPE_DECIMAL128:
         need = 16;
         break;
      case BSON_TYPE_UNDEFINED:
      case BSON_TYPE_NULL:
      case BSON_TYPE_MINKEY:
      case BSON_TYPE_MAXKEY:
         need = 0;
         break;
      case BSON_TYPE_BOOL:
         if (avail < 1 || d[o] > 1) {
            *why = "invalid boolean";
            return false;
         }
         need = 1;
         break;
      case BSON_TYPE_UTF8:
      case BSON_TYPE_CODE:
      case BSON_TYPE_SYMBOL:
         if (!check_string (d, o, avail, &need)) {
            *why = "invalid string";
            return false;
         }
         break;
      case BSON_TYPE_DBPOINTER:
         if (!check_string (d, o, avail, &need)) {
            *why = "invalid DBPointer";
            return false;
         }
         need += 12;
         break;
      case BSON_TYPE_BINARY:
         if (avail < 5 || (l = wire_get_i32 (d + o)) < 0 || (size_t) l > avail - 5) {
            *why = "invalid binary length";
            return false;
         }
         /* Subtype 2 repeats the length inside the data. */
         if (d[o + 4] == BSON_SUBTYPE_BINARY_DEPRECATED && (l < 4 || wire_get_i32 (d + o + 5) != l - 4)) {
            *why = "invalid old binary length";
            return false;
         }
         need = 5 + (size_t) l;
         break;
      case BSON_TYPE_REGEX: {
         const uint8_t *opts;
         nul = memchr (d + o, 0, avail);
         opts = nul ? memchr (nul + 1, 0, (size_t) (d + end - 1 - (nul + 1))) : NULL;
         if (!opts) {
            *why = "invalid regular expression";
            return false;
         }
         need = (size_t) (opts - (d + o)) + 1;
         break;
      }
      case BSON_TYPE_DOCUMENT:
      case BSON_TYPE_ARRAY:
         if (avail < 4 || (l = wire_get_i32 (d + o)) < BSON_MIN_LEN || (size_t) l > avail) {
            *why = "embedded document length out of bounds";
            return false;
         }
         if (depth == WIRE_MAX_BSON_DEPTH) {
            *why = "documents nested too deeply";
            return false;
         }
         ends[depth++] = end;
         end = o + (size_t) l;
         pos = o + 4;
         continue;
      case BSON_TYPE_CODEWSCOPE: {
         size_t slen, scope;
         /* int32 total, string, scope document, which ends the value. */
         if (avail < 4 || (l = wire_get_i32 (d + o)) < 14 || (size_t) l > avail) {
            *why = "invalid code with scope length";
            return false;
         }
         if (!check_string (d, o + 4, (size_t) l - 4, &slen) || (size_t) l - 4 - slen < BSON_MIN_LEN) {
            *why = "invalid code with scope string";
            return false;
         }
         scope = o + 4 + slen;
         if (wire_get_i32 (d + scope) != l - 4 - (int32_t) slen) {
            *why = "invalid code with scope document length";
            return false;
         }
         if (depth == WIRE_MAX_BSON_DEPTH) {
            *why = "documents nested too deeply";
            return false;
         }
         ends[depth++] = end;
         end = o + (size_t) l;
         pos = scope + 4;
         continue;
      }
      default:
         *why = "unknown element type";
         return false;
      }
      if (need > avail) {
         *why = "value runs past the end of the document";
         return false;
      }
      pos = o + need;
   }
}

/* One BSON document at the cursor, validated, as a static bson_t.
 * `facts` may be NULL. */
static bool
rd_doc (reader_t *r, bson_t *doc, doc_facts_t *facts, const char *what, bson_error_t *error)
{
   const char *why = NULL;
   int32_t dlen;
   const uint8_t *start = r->p + r->off;

   if (rd_left (r) < 4) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_SHORT, "%s: truncated document length", what);
      return false;
   }
   dlen = wire_get_i32 (start);
   if (dlen > WIRE_MAX_BSON_LEN) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_TOO_LARGE,
                      "%s: document length %" PRId32 " exceeds the limit of %d",
                      what,
                      dlen,
                      WIRE_MAX_BSON_LEN);
      return false;
   }
   if (dlen < BSON_MIN_LEN || (size_t) dlen > rd_left (r)) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_BSON,
                      "%s: document length %" PRId32 " outside [5, %zu]",
                      what,
                      dlen,
                      rd_left (r));
      return false;
   }
   if (start[dlen - 1] != 0) {
      why = "document is not terminated";
   } else {
      (void) check_bson (start, (size_t) dlen, facts, &why);
   }
   /* bson_init_static cannot fail on a checked document; test it anyway. */
   if (why || !bson_init_static (doc, start, (size_t) dlen)) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_BSON,
                      "%s: invalid BSON at offset %zu: %s",
                      what,
                      r->off,
                      why ? why : "rejected by libbson");
      return false;
   }
   r->off += (size_t) dlen;
   return true;
}

static bool
short_error (bson_error_t *error, const char *what)
{
   bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_SHORT, "%s runs past the end of the message", what);
   return false;
}

/* ------------------------------------------------------------ header */

bool
wire_peek_header (const uint8_t *buf, size_t len, wire_header_t *out)
{
   if (len < WIRE_HEADER_LEN) {
      return false;
   }
   out->length = wire_get_i32 (buf);
   out->request_id = wire_get_i32 (buf + 4);
   out->response_to = wire_get_i32 (buf + 8);
   out->opcode = wire_get_i32 (buf + 12);
   return true;
}

static bool
opcode_known (int32_t opcode)
{
   return opcode == WIRE_OP_REPLY || opcode == WIRE_OP_QUERY || opcode == WIRE_OP_COMPRESSED ||
          opcode == WIRE_OP_MSG;
}

bool
wire_check_header (const wire_header_t *h, uint32_t max_len, bson_error_t *error)
{
   if (max_len == 0) {
      max_len = WIRE_MAX_MESSAGE_LEN;
   }
   if (h->length < WIRE_HEADER_LEN) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_SHORT,
                      "message length %" PRId32 " is below the header's 16 bytes",
                      h->length);
      return false;
   }
   if ((uint32_t) h->length > max_len) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_TOO_LARGE,
                      "message length %" PRId32 " exceeds the limit of %" PRIu32,
                      h->length,
                      max_len);
      return false;
   }
   if (!opcode_known (h->opcode)) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_OPCODE, "unknown opcode %" PRId32, h->opcode);
      return false;
   }
   return true;
}

/* Common start of every parser: the header, consistent with `len` and of the
 * expected opcode.  Leaves the cursor after the header. */
static bool
start_parse (const uint8_t *buf,
             size_t len,
             int32_t opcode,
             wire_header_t *h,
             reader_t *r,
             bson_error_t *error)
{
   if (!wire_peek_header (buf, len, h)) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_SHORT, "message of %zu bytes is shorter than a header", len);
      return false;
   }
   if (h->length < WIRE_HEADER_LEN || (size_t) h->length != len) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_SHORT,
                      "message length %" PRId32 " does not match the %zu bytes given",
                      h->length,
                      len);
      return false;
   }
   if (h->opcode != opcode) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_OPCODE,
                      "expected %s, got opcode %" PRId32,
                      wire_opcode_name (opcode),
                      h->opcode);
      return false;
   }
   r->p = buf;
   r->len = len;
   r->off = WIRE_HEADER_LEN;
   return true;
}

/* ------------------------------------------------------------ OP_MSG */

/* A kind-1 section at the cursor (after its kind byte). */
static bool
parse_sequence (reader_t *r, wire_sequence_t *seq, bson_error_t *error)
{
   int32_t size;
   size_t idlen;
   reader_t sec;
   bson_t doc;

   if (!rd_i32 (r, &size)) {
      return short_error (error, "document sequence size");
   }
   /* The size counts itself; an identifier needs at least its NUL. */
   if (size < 5 || (size_t) size - 4 > rd_left (r)) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_SECTION,
                      "document sequence size %" PRId32 " outside [5, %zu]",
                      size,
                      rd_left (r) + 4);
      return false;
   }
   sec.p = r->p + r->off;
   sec.len = (size_t) size - 4;
   sec.off = 0;
   r->off += sec.len;

   if (!rd_cstring (&sec, &seq->identifier, &idlen)) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_SECTION, "document sequence identifier is not terminated");
      return false;
   }
   seq->docs = sec.p + sec.off;
   seq->docs_len = (uint32_t) rd_left (&sec);
   seq->ndocs = 0;
   while (rd_left (&sec) > 0) {
      if (!rd_doc (&sec, &doc, NULL, "document sequence", error)) {
         return false;
      }
      seq->ndocs++;
   }
   return true;
}

/* The framing pre-pass: enters every document sequence's identifier in
 * `ids` (cleared here) without validating anything else; stops quietly at
 * the first section it cannot frame, or after WIRE_MAX_SECTIONS
 * sequences, leaving the errors to the parsing pass.  Returns whether there
 * was any sequence.  Cost: one step per section. */
static bool
prescan_ids (const reader_t *from, seq_ids_t *ids)
{
   reader_t r = *from;
   uint32_t n = 0;
   bool cleared = false;

   while (rd_left (&r) > 0 && n < WIRE_MAX_SECTIONS) {
      uint8_t kind = r.p[r.off++];
      int32_t size;

      if (rd_left (&r) < 4) {
         break;
      }
      size = wire_get_i32 (r.p + r.off);
      if (kind == 0) {
         if (size < BSON_MIN_LEN || (size_t) size > rd_left (&r)) {
            break;
         }
      } else if (kind == 1) {
         const uint8_t *id = r.p + r.off + 4;
         const uint8_t *nul;

         if (size < 5 || (size_t) size > rd_left (&r) || !(nul = memchr (id, 0, (size_t) size - 4))) {
            break;
         }
         if (!cleared) {
            memset (ids, 0, sizeof *ids);
            cleared = true;
         }
         (void) seq_ids_add (ids, (const char *) id, (size_t) (nul - id)); /* a duplicate: the parse refuses it */
         n++;
      } else {
         break;
      }
      r.off += (size_t) size;
   }
   return cleared;
}

bool
wire_parse_msg (const uint8_t *buf, size_t len, wire_msg_t *out, bson_error_t *error)
{
   reader_t r;
   int32_t flags;
   uint32_t nbodies = 0;
   doc_facts_t facts = {0};
   seq_ids_t ids, seen;

   if (!start_parse (buf, len, WIRE_OP_MSG, &out->header, &r, error)) {
      return false;
   }
   if (!rd_i32 (&r, &flags)) {
      return short_error (error, "OP_MSG flags");
   }
   out->flags = (uint32_t) flags;
   out->nsequences = 0;
   out->body_data = NULL;
   out->body_len = 0;
   out->command = NULL;
   out->command_len = 0;
   out->comment_offset = 0;
   out->comment_repeated = false;
   if ((out->flags & WIRE_MSG_REQUIRED_MASK) & ~WIRE_MSG_KNOWN_REQUIRED) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_FLAGS,
                      "unknown required OP_MSG flag bits 0x%04" PRIx32,
                      (out->flags & WIRE_MSG_REQUIRED_MASK) & ~WIRE_MSG_KNOWN_REQUIRED);
      return false;
   }
   out->checksum_present = (out->flags & WIRE_MSG_CHECKSUM_PRESENT) != 0;
   if (out->checksum_present) {
      uint32_t want, got;

      if (rd_left (&r) < MSG_CHECKSUM_LEN) {
         return short_error (error, "OP_MSG checksum");
      }
      /* The checksum covers everything before it; sections end there. */
      r.len -= MSG_CHECKSUM_LEN;
      want = wire_get_u32 (buf + r.len);
      got = wire_crc32c (0, buf, r.len);
      if (want != got) {
         bson_set_error (error,
                         WIRE_ERROR_DOMAIN,
                         WIRE_ERR_CHECKSUM,
                         "OP_MSG checksum 0x%08" PRIx32 " does not match the computed 0x%08" PRIx32,
                         want,
                         got);
         return false;
      }
   }

   /* Each identifier is checked against the others with `seen` as its
    * sequence is parsed, and against the body's top-level keys with `ids`
    * (filled by a framing pre-pass, as sequences may follow the body) in
    * the one pass that validates the body: linear in the message's size,
    * nothing compares keys with identifiers pairwise.  A clash is reported
    * after every structural check, as mongod refuses it: the command would
    * be ambiguous. */
   if (prescan_ids (&r, &ids)) {
      facts.seq_ids = &ids;
   }
   while (rd_left (&r) > 0) {
      uint8_t kind;

      (void) rd_u8 (&r, &kind); /* cannot fail: rd_left > 0 */
      if (kind == 0) {
         if (++nbodies > 1) {
            bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_NO_BODY, "OP_MSG has more than one body section");
            return false;
         }
         out->body_data = r.p + r.off;
         if (!rd_doc (&r, &out->body, &facts, "OP_MSG body", error)) {
            return false;
         }
         out->body_len = (uint32_t) (r.p + r.off - out->body_data);
         out->command = facts.first_key;
         out->command_len = (uint32_t) facts.first_key_len;
         out->comment_offset = (uint32_t) facts.comment_pos;
         out->comment_repeated = facts.comment_repeated;
      } else if (kind == 1) {
         wire_sequence_t *seq = &out->sequences[out->nsequences];

         if (out->nsequences == WIRE_MAX_SECTIONS) {
            bson_set_error (error,
                            WIRE_ERROR_DOMAIN,
                            WIRE_ERR_SECTION,
                            "OP_MSG has more than %d document sequences",
                            WIRE_MAX_SECTIONS);
            return false;
         }
         if (!parse_sequence (&r, seq, error)) {
            return false;
         }
         if (out->nsequences == 0) {
            memset (&seen, 0, sizeof seen);
         }
         if (!seq_ids_add (&seen, seq->identifier, strlen (seq->identifier))) {
            bson_set_error (
               error, WIRE_ERROR_DOMAIN, WIRE_ERR_SECTION, "duplicate document sequence \"%s\"", seq->identifier);
            return false;
         }
         out->nsequences++;
      } else {
         bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_SECTION, "unknown OP_MSG section kind %u", kind);
         return false;
      }
   }
   if (nbodies != 1) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_NO_BODY, "OP_MSG has no body section");
      return false;
   }
   if (facts.seq_clash) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_SECTION,
                      "document sequence \"%s\" is also a field of the body",
                      facts.seq_clash);
      return false;
   }
   return true;
}

/* ------------------------------------------------------------ OP_QUERY */

bool
wire_parse_query (const uint8_t *buf, size_t len, wire_query_t *out, bson_error_t *error)
{
   reader_t r;
   size_t nlen;

   if (!start_parse (buf, len, WIRE_OP_QUERY, &out->header, &r, error)) {
      return false;
   }
   if (!rd_i32 (&r, &out->flags)) {
      return short_error (error, "OP_QUERY flags");
   }
   if (!rd_cstring (&r, &out->full_collection_name, &nlen)) {
      return short_error (error, "OP_QUERY fullCollectionName");
   }
   if (!rd_i32 (&r, &out->number_to_skip) || !rd_i32 (&r, &out->number_to_return)) {
      return short_error (error, "OP_QUERY skip and return");
   }
   if (!rd_doc (&r, &out->query, NULL, "OP_QUERY query", error)) {
      return false;
   }
   out->has_fields = rd_left (&r) > 0;
   if (out->has_fields && !rd_doc (&r, &out->fields, NULL, "OP_QUERY returnFieldsSelector", error)) {
      return false;
   }
   if (rd_left (&r) > 0) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_BSON, "OP_QUERY has %zu trailing bytes", rd_left (&r));
      return false;
   }
   return true;
}

/* ------------------------------------------------------------ OP_REPLY */

bool
wire_parse_reply (const uint8_t *buf, size_t len, wire_reply_t *out, bson_error_t *error)
{
   reader_t r;
   int32_t ndocs = 0;
   bson_t doc;

   if (!start_parse (buf, len, WIRE_OP_REPLY, &out->header, &r, error)) {
      return false;
   }
   if (!rd_i32 (&r, &out->flags) || !rd_i64 (&r, &out->cursor_id) || !rd_i32 (&r, &out->starting_from) ||
       !rd_i32 (&r, &out->number_returned)) {
      return short_error (error, "OP_REPLY fields");
   }
   out->has_doc = false;
   out->docs = r.p + r.off;
   out->docs_len = (uint32_t) rd_left (&r);
   while (rd_left (&r) > 0) {
      if (!rd_doc (&r, ndocs == 0 ? &out->doc : &doc, NULL, "OP_REPLY document", error)) {
         return false;
      }
      out->has_doc = true;
      ndocs++;
   }
   if (ndocs != out->number_returned) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_BSON,
                      "OP_REPLY numberReturned %" PRId32 " but %" PRId32 " documents",
                      out->number_returned,
                      ndocs);
      return false;
   }
   return true;
}

/* ------------------------------------------------------------ OP_COMPRESSED */

bool
wire_parse_compressed (const uint8_t *buf, size_t len, wire_compressed_t *out, bson_error_t *error)
{
   reader_t r;

   if (!start_parse (buf, len, WIRE_OP_COMPRESSED, &out->header, &r, error)) {
      return false;
   }
   if (!rd_i32 (&r, &out->original_opcode) || !rd_i32 (&r, &out->uncompressed_size) ||
       !rd_u8 (&r, &out->compressor_id)) {
      return short_error (error, "OP_COMPRESSED fields");
   }
   if (out->original_opcode == WIRE_OP_COMPRESSED || !opcode_known (out->original_opcode)) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_OPCODE,
                      "OP_COMPRESSED wraps opcode %" PRId32,
                      out->original_opcode);
      return false;
   }
   if (out->uncompressed_size < 0) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_COMPRESSION,
                      "OP_COMPRESSED uncompressedSize %" PRId32 " is negative",
                      out->uncompressed_size);
      return false;
   }
   out->data = r.p + r.off;
   out->data_len = (uint32_t) rd_left (&r);
   return true;
}

bool
wire_decompress (const wire_compressed_t *c, uint32_t max_len, struct evbuffer *out, bson_error_t *error)
{
   struct evbuffer_iovec v;
   uint64_t total;
   uint8_t *p;

   if (max_len == 0) {
      max_len = WIRE_MAX_MESSAGE_LEN;
   }
   if (c->original_opcode == WIRE_OP_COMPRESSED || !opcode_known (c->original_opcode)) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_OPCODE,
                      "OP_COMPRESSED wraps opcode %" PRId32,
                      c->original_opcode);
      return false;
   }
   if (!compress_name (c->compressor_id)) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_COMPRESSION, "unknown compressor id %u", c->compressor_id);
      return false;
   }
   if (c->uncompressed_size < 0) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_COMPRESSION, "negative uncompressedSize");
      return false;
   }
   total = (uint64_t) WIRE_HEADER_LEN + (uint64_t) c->uncompressed_size;
   if (total > max_len) {
      bson_set_error (error,
                      WIRE_ERROR_DOMAIN,
                      WIRE_ERR_TOO_LARGE,
                      "uncompressed message of %" PRIu64 " bytes exceeds the limit of %" PRIu32,
                      total,
                      max_len);
      return false;
   }
   /* One contiguous region: the algorithms need a flat output buffer.
    * Uncommitted space is simply dropped on failure. */
   if (evbuffer_reserve_space (out, (ev_ssize_t) total, &v, 1) != 1) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_COMPRESSION, "out of memory for %" PRIu64 " bytes", total);
      return false;
   }
   p = v.iov_base;
   put_header (p, (uint32_t) total, c->header.request_id, c->header.response_to, c->original_opcode);
   if (!compress_unbuffer (c->compressor_id,
                           c->data,
                           c->data_len,
                           p + WIRE_HEADER_LEN,
                           (size_t) c->uncompressed_size,
                           error)) {
      /* codec/compress.c fills its own domain; keep the caller's view in ours. */
      if (error) {
         error->domain = WIRE_ERROR_DOMAIN;
         error->code = WIRE_ERR_COMPRESSION;
      }
      return false;
   }
   v.iov_len = (size_t) total;
   if (evbuffer_commit_space (out, &v, 1) != 0) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_COMPRESSION, "evbuffer_commit_space failed");
      return false;
   }
   return true;
}

bool
wire_compress (const uint8_t *msg,
               size_t len,
               uint8_t compressor_id,
               int level,
               struct evbuffer *out,
               bson_error_t *error)
{
   wire_header_t h;
   struct evbuffer_iovec v;
   size_t bound, clen, payload;
   uint64_t cap;
   uint8_t *p;

   if (!wire_peek_header (msg, len, &h) || h.length < WIRE_HEADER_LEN || (size_t) h.length != len) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_SHORT, "message to compress is not one whole message");
      return false;
   }
   if (h.opcode == WIRE_OP_COMPRESSED || !opcode_known (h.opcode)) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_OPCODE, "cannot compress opcode %" PRId32, h.opcode);
      return false;
   }
   if (!compress_name (compressor_id)) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_COMPRESSION, "unknown compressor id %u", compressor_id);
      return false;
   }
   payload = len - WIRE_HEADER_LEN;
   bound = compress_bound (compressor_id, payload);
   cap = (uint64_t) WIRE_HEADER_LEN + COMPRESSED_PREFIX_LEN + bound;
   if (bound == 0 && payload > 0) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_TOO_LARGE, "message too large to compress");
      return false;
   }
   if (evbuffer_reserve_space (out, (ev_ssize_t) cap, &v, 1) != 1) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_COMPRESSION, "out of memory for %" PRIu64 " bytes", cap);
      return false;
   }
   p = v.iov_base;
   if (!compress_buffer (compressor_id,
                         level,
                         msg + WIRE_HEADER_LEN,
                         payload,
                         p + WIRE_HEADER_LEN + COMPRESSED_PREFIX_LEN,
                         bound,
                         &clen,
                         error)) {
      if (error) {
         error->domain = WIRE_ERROR_DOMAIN;
         error->code = WIRE_ERR_COMPRESSION;
      }
      return false;
   }
   /* Incompressible data can grow past the limit the peer will accept. */
   if ((uint64_t) WIRE_HEADER_LEN + COMPRESSED_PREFIX_LEN + clen > WIRE_MAX_MESSAGE_LEN) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_TOO_LARGE, "compressed message exceeds the limit");
      return false;
   }
   v.iov_len = WIRE_HEADER_LEN + COMPRESSED_PREFIX_LEN + clen;
   p = put_header (p, (uint32_t) v.iov_len, h.request_id, h.response_to, WIRE_OP_COMPRESSED);
   p = wire_put_i32 (p, h.opcode);
   p = wire_put_u32 (p, (uint32_t) payload);
   *p = compressor_id;
   if (evbuffer_commit_space (out, &v, 1) != 0) {
      bson_set_error (error, WIRE_ERROR_DOMAIN, WIRE_ERR_COMPRESSION, "evbuffer_commit_space failed");
      return false;
   }
   return true;
}

/* ------------------------------------------------------------ builders */

/* Reserves `total` contiguous bytes at the end of `out`. */
static uint8_t *
reserve (struct evbuffer *out, size_t total, struct evbuffer_iovec *v)
{
   if (evbuffer_reserve_space (out, (ev_ssize_t) total, v, 1) != 1) {
      return NULL;
   }
   v->iov_len = total;
   return v->iov_base;
}

bool
wire_append_msg (struct evbuffer *out,
                 int32_t request_id,
                 int32_t response_to,
                 uint32_t flags,
                 const bson_t *body,
                 const wire_sequence_t *sequences,
                 uint32_t nsequences)
{
   struct evbuffer_iovec v;
   uint64_t total = WIRE_HEADER_LEN + MSG_FLAGS_LEN + 1 + (uint64_t) body->len;
   uint8_t *p;

   for (uint32_t i = 0; i < nsequences; i++) {
      total += 1 + 4 + strlen (sequences[i].identifier) + 1 + (uint64_t) sequences[i].docs_len;
   }
   if (total > WIRE_MAX_MESSAGE_LEN || !(p = reserve (out, (size_t) total, &v))) {
      return false;
   }
   p = put_header (p, (uint32_t) total, request_id, response_to, WIRE_OP_MSG);
   /* No checksum is written, so the flag must not claim one. */
   p = wire_put_u32 (p, flags & ~WIRE_MSG_CHECKSUM_PRESENT);
   *p++ = 0;
   p = put_bytes (p, bson_get_data (body), body->len);
   for (uint32_t i = 0; i < nsequences; i++) {
      size_t idlen = strlen (sequences[i].identifier) + 1;

      *p++ = 1;
      p = wire_put_u32 (p, (uint32_t) (4 + idlen + sequences[i].docs_len));
      p = put_bytes (p, sequences[i].identifier, idlen);
      p = put_bytes (p, sequences[i].docs, sequences[i].docs_len);
   }
   return evbuffer_commit_space (out, &v, 1) == 0;
}

bool
wire_append_reply (struct evbuffer *out, int32_t request_id, int32_t response_to, int32_t flags, const bson_t *doc)
{
   struct evbuffer_iovec v;
   uint64_t total = WIRE_HEADER_LEN + REPLY_PREFIX_LEN + (doc ? (uint64_t) doc->len : 0);
   uint8_t *p;

   if (total > WIRE_MAX_MESSAGE_LEN || !(p = reserve (out, (size_t) total, &v))) {
      return false;
   }
   p = put_header (p, (uint32_t) total, request_id, response_to, WIRE_OP_REPLY);
   p = wire_put_i32 (p, flags);
   p = wire_put_i64 (p, 0);     /* cursorID */
   p = wire_put_i32 (p, 0);     /* startingFrom */
   p = wire_put_i32 (p, doc ? 1 : 0);
   if (doc) {
      put_bytes (p, bson_get_data (doc), doc->len);
   }
   return evbuffer_commit_space (out, &v, 1) == 0;
}

bool
wire_append_query (struct evbuffer *out,
                   int32_t request_id,
                   int32_t flags,
                   const char *full_collection_name,
                   int32_t skip,
                   int32_t number_to_return,
                   const bson_t *query)
{
   struct evbuffer_iovec v;
   size_t nlen = strlen (full_collection_name) + 1;
   uint64_t total = WIRE_HEADER_LEN + 4 + (uint64_t) nlen + 8 + (uint64_t) query->len;
   uint8_t *p;

   if (total > WIRE_MAX_MESSAGE_LEN || !(p = reserve (out, (size_t) total, &v))) {
      return false;
   }
   p = put_header (p, (uint32_t) total, request_id, 0, WIRE_OP_QUERY);
   p = wire_put_i32 (p, flags);
   p = put_bytes (p, full_collection_name, nlen);
   p = wire_put_i32 (p, skip);
   p = wire_put_i32 (p, number_to_return);
   put_bytes (p, bson_get_data (query), query->len);
   return evbuffer_commit_space (out, &v, 1) == 0;
}

/* ------------------------------------------------------------ CRC-32C */

/* Reflected Castagnoli polynomial. */
#define CRC32C_POLY 0x82f63b78u

/* Slicing-by-8 tables: crc_table[0] is the classic byte table, crc_table[k]
 * advances a byte through k more zero bytes.  Built once (crc_once). */
static uint32_t crc_table[8][256];
static uint32_t (*crc_impl) (uint32_t, const uint8_t *, size_t);
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static uint32_t
crc_sw_raw (uint32_t c, const uint8_t *p, size_t len)
{
   while (len && ((uintptr_t) p & 7u)) {
      c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
      len--;
   }
   while (len >= 8) {
      uint32_t lo = c ^ wire_get_u32 (p);
      uint32_t hi = wire_get_u32 (p + 4);
      c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
          crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
          crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
      p += 8;
      len -= 8;
   }
   while (len--) {
      c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
   }
   return c;
}

#ifdef WIRE_HAVE_SSE42
__attribute__ ((target ("sse4.2"))) static uint32_t
crc_hw_raw (uint32_t c, const uint8_t *p, size_t len)
{
   uint64_t c64;

   while (len && ((uintptr_t) p & 7u)) {
      c = _mm_crc32_u8 (c, *p++);
      len--;
   }
   c64 = c;
   while (len >= 8) {
      uint64_t w;
      memcpy (&w, p, 8); /* aligned here; memcpy keeps UBSan quiet anyway */
      c64 = _mm_crc32_u64 (c64, w);
      p += 8;
      len -= 8;
   }
   c = (uint32_t) c64;
   while (len--) {
      c = _mm_crc32_u8 (c, *p++);
   }
   return c;
}
#endif

static void
crc_init (void)
{
   for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) {
         c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
      }
      crc_table[0][i] = c;
   }
   for (uint32_t i = 0; i < 256; i++) {
      for (int t = 1; t < 8; t++) {
         crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
      }
   }
   crc_impl = crc_sw_raw;
#ifdef WIRE_HAVE_SSE42
   __builtin_cpu_init ();
   if (__builtin_cpu_supports ("sse4.2")) {
      crc_impl = crc_hw_raw;
   }
#endif
}

uint32_t
wire_crc32c (uint32_t crc, const uint8_t *data, size_t len)
{
   pthread_once (&crc_once, crc_init);
   return ~crc_impl (~crc, data, len);
}

uint32_t
wire_crc32c_sw (uint32_t crc, const uint8_t *data, size_t len)
{
   pthread_once (&crc_once, crc_init);
   return ~crc_sw_raw (~crc, data, len);
}

/* ------------------------------------------------------------ names */

const char *
wire_command_name (const bson_t *body)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, body) || !bson_iter_next (&it)) {
      return NULL;
   }
   return bson_iter_key (&it);
}

const char *
wire_opcode_name (int32_t opcode)
{
   switch (opcode) {
   case WIRE_OP_REPLY:
      return "OP_REPLY";
   case WIRE_OP_QUERY:
      return "OP_QUERY";
   case WIRE_OP_COMPRESSED:
      return "OP_COMPRESSED";
   case WIRE_OP_MSG:
      return "OP_MSG";
   default:
      return "unknown";
   }
}
