/*
 * fuzz_handshake.c - libFuzzer target for the hello rewrite (codec/handshake.h).
 *
 * Input: one flags byte, then the client's hello as a BSON document (its
 * own length prefix says where it ends), then the upstream's hello reply
 * as a second document (the rest; when the rest is empty the hello itself
 * is used as the reply).  Documents libbson cannot iterate to the end are
 * dropped, as the wire codec never passes them on.  Flags: bit 0 is
 * `add_db` (a legacy OP_QUERY hello), bits 1-3 pick the proxy's
 * `compressors` value from a table of spellings.
 *
 * Oracles (abort() on failure):
 *   - handshake_is_hello and handshake_unwrap_query agree with what their
 *     header says, computed here independently;
 *   - negotiation: at most one entry per implemented compressor, noop
 *     never, each one both asked for by the client and offered, in the
 *     client's order, none left out;
 *   - request: the result is the hello with only `compression`,
 *     `topologyVersion`, `maxAwaitTimeMS`, a MONGODB-X509
 *     `speculativeAuthenticate` (and with add_db
 *     `$readPreference`) removed, every other element kept byte for byte in
 *     order, and `$db: "admin"` appended only when add_db and absent;
 *   - handshake_is_x509_auth and handshake_speculative_x509 agree with a
 *     separate reading of `mechanism`;
 *   - reply: with ok != 1 the same elements; with ok == 1 no replica-set
 *     identity field is left, exactly one `msg: "isdbgrid"`, `compression`
 *     exactly the negotiated list, both before the first `ok`, and every
 *     other element kept byte for byte in order;
 *   - whatever succeeds is a document libbson iterates to the end; what
 *     fails says so in the handshake error domain.
 */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include <bson/bson.h>

#include "codec/compress.h"
#include "fuzz_util.h"
#include "codec/handshake.h"

/* The spellings of [proxy] compressors the negotiation is tried against. */
static const char *const offered_table[8] = {
   "snappy,zlib,zstd", "zstd", "", NULL, "zlib snappy", "ZSTD,\tzlib", "noop,zstd", "zstd,zstd,snappy",
};

/* Fields a mongos never reports; the reply rewrite removes them. */
static const char *const identity_fields[] = {
   "setName", "setVersion", "electionId", "hosts", "passives", "arbiters", "primary", "me",
   "secondary", "tags", "lastWrite", "topologyVersion", "arbiterOnly", "passive", "hidden", "buildIndexes",
};

static bool
is_identity (const char *key)
{
   for (size_t i = 0; i < sizeof identity_fields / sizeof identity_fields[0]; i++)
      if (strcmp (key, identity_fields[i]) == 0)
         return true;
   return false;
}

/* Token match of `name` in a comma/space separated list, case-insensitive. */
static bool
listed (const char *list, const char *name)
{
   size_t nlen = strlen (name);

   for (const char *p = list; p && *p;) {
      size_t n = strcspn (p, ", \t");

      if (n == nlen && n > 0 && strncasecmp (p, name, n) == 0)
         return true;
      p += n;
      if (*p)
         p++;
   }
   return false;
}

/* The element under `it`, alone in a document, for byte comparisons. */
static bool
same_element (const bson_iter_t *a, const bson_iter_t *b)
{
   bson_t da = BSON_INITIALIZER, db = BSON_INITIALIZER;
   bool same;

   CHECK (bson_append_iter (&da, NULL, -1, a));
   CHECK (bson_append_iter (&db, NULL, -1, b));
   same = da.len == db.len && memcmp (bson_get_data (&da), bson_get_data (&db), da.len) == 0;
   bson_destroy (&da);
   bson_destroy (&db);
   return same;
}

/* The first `mechanism` of a document, read here without libbson's find. */
static bool
asks_x509 (const bson_t *cmd)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, cmd))
      return false;
   while (bson_iter_next (&it)) {
      if (strcmp (bson_iter_key (&it), "mechanism") == 0)
         return BSON_ITER_HOLDS_UTF8 (&it) && strcasecmp (bson_iter_utf8 (&it, NULL), "MONGODB-X509") == 0;
   }
   return false;
}

/* A speculativeAuthenticate element (at `it`) that asks for MONGODB-X509. */
static bool
element_asks_x509 (const bson_iter_t *it)
{
   bson_t doc;
   const uint8_t *data;
   uint32_t len;

   if (!BSON_ITER_HOLDS_DOCUMENT (it))
      return false;
   bson_iter_document (it, &len, &data);
   return bson_init_static (&doc, data, len) && asks_x509 (&doc);
}

/* handshake_is_x509_auth on the hello itself and on every sub-document of
 * it; handshake_speculative_x509 on the hello. */
static void
check_x509 (const bson_t *hello)
{
   bson_iter_t it;
   bool first = true, spec = false;

   CHECK (handshake_is_x509_auth (hello) == asks_x509 (hello));
   if (!bson_iter_init (&it, hello))
      return;
   while (bson_iter_next (&it)) {
      if (BSON_ITER_HOLDS_DOCUMENT (&it)) {
         bson_t doc;
         const uint8_t *data;
         uint32_t len;

         bson_iter_document (&it, &len, &data);
         CHECK (bson_init_static (&doc, data, len));
         CHECK (handshake_is_x509_auth (&doc) == asks_x509 (&doc));
      }
      if (first && strcmp (bson_iter_key (&it), "speculativeAuthenticate") == 0) {
         spec = element_asks_x509 (&it);
         first = false;
      }
   }
   CHECK (handshake_speculative_x509 (hello) == spec);
}

static void
check_is_hello (const bson_t *doc)
{
   bson_iter_t it;
   const char *k;

   CHECK (!handshake_is_hello (NULL));
   if (!bson_iter_init (&it, doc) || !bson_iter_next (&it))
      return;
   k = bson_iter_key (&it);
   CHECK (handshake_is_hello (k) ==
          (strcmp (k, "hello") == 0 || strcmp (k, "isMaster") == 0 || strcmp (k, "ismaster") == 0));
}

static void
check_unwrap (const bson_t *doc)
{
   bson_t out;
   bson_iter_t it;
   bool wrapped = false;
   const uint8_t *sub = NULL;
   uint32_t sublen = 0;

   if (bson_iter_init (&it, doc) && bson_iter_next (&it) &&
       (strcmp (bson_iter_key (&it), "$query") == 0 || strcmp (bson_iter_key (&it), "query") == 0) &&
       BSON_ITER_HOLDS_DOCUMENT (&it)) {
      bson_iter_document (&it, &sublen, &sub);
      wrapped = true;
   }
   CHECK (handshake_unwrap_query (doc, &out));
   if (wrapped)
      CHECK (bson_get_data (&out) == sub && out.len == sublen);
   else
      CHECK (bson_get_data (&out) == bson_get_data (doc) && out.len == doc->len);
}

static void
check_negotiate (const bson_t *hello, const char *offered, const handshake_compression_t *c)
{
   bson_iter_t it, child;
   int want[HANDSHAKE_MAX_COMPRESSORS];
   int nwant = 0;
   bool has = bson_iter_init_find (&it, hello, "compression");

   CHECK (c->requested == has);
   CHECK (c->n >= 0 && c->n <= HANDSHAKE_MAX_COMPRESSORS);
   /* The expected list: the client's entries, known, not noop, offered,
    * first occurrence only. */
   if (has && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &child)) {
      while (bson_iter_next (&child)) {
         int id;
         bool dup = false;

         if (!BSON_ITER_HOLDS_UTF8 (&child))
            continue;
         id = compress_id (bson_iter_utf8 (&child, NULL));
         if (id <= 0 || !listed (offered, compress_name (id)))
            continue;
         for (int i = 0; i < nwant; i++)
            dup |= want[i] == id;
         if (!dup) {
            CHECK (nwant < HANDSHAKE_MAX_COMPRESSORS);
            want[nwant++] = id;
         }
      }
   }
   CHECK (c->n == nwant);
   for (int i = 0; i < c->n; i++) {
      CHECK (c->ids[i] == want[i]);
      CHECK (c->ids[i] > COMPRESS_NOOP && c->ids[i] <= COMPRESS_ZSTD);
   }
}

static void
check_request (const bson_t *hello, bool add_db)
{
   bson_t out;
   bson_error_t err;
   bson_iter_t in_it, out_it;
   bool has_db = false, more;

   memset (&err, 0, sizeof err);
   if (!handshake_rewrite_request (hello, add_db, &out, &err)) {
      CHECK (err.domain == HANDSHAKE_ERROR_DOMAIN && err.message[0] != '\0');
      bson_destroy (&out);
      return;
   }
   CHECK (out.len <= hello->len + 15); /* + {$db: "admin"} */
   CHECK (fuzz_iterable (bson_get_data (&out), out.len, 0));
   CHECK (bson_iter_init (&in_it, hello) && bson_iter_init (&out_it, &out));
   more = bson_iter_next (&out_it);
   while (bson_iter_next (&in_it)) {
      const char *key = bson_iter_key (&in_it);

      if (strcmp (key, "compression") == 0 || strcmp (key, "topologyVersion") == 0 ||
          strcmp (key, "maxAwaitTimeMS") == 0 || (add_db && strcmp (key, "$readPreference") == 0))
         continue;
      /* A client may not log in as the proxy's certificate. */
      if (strcmp (key, "speculativeAuthenticate") == 0 && element_asks_x509 (&in_it))
         continue;
      has_db |= strcmp (key, "$db") == 0;
      CHECK (more);
      CHECK (same_element (&in_it, &out_it));
      more = bson_iter_next (&out_it);
   }
   if (add_db && !has_db) {
      CHECK (more);
      CHECK (strcmp (bson_iter_key (&out_it), "$db") == 0 && BSON_ITER_HOLDS_UTF8 (&out_it));
      CHECK (strcmp (bson_iter_utf8 (&out_it, NULL), "admin") == 0);
      more = bson_iter_next (&out_it);
   }
   CHECK (!more);
   bson_destroy (&out);
}

/* Checks the persona elements at out_it (msg, then compression if any),
 * advancing past them. */
static void
check_persona (bson_iter_t *out_it, bool *more, const handshake_compression_t *c, const bson_oid_t *sid)
{
   bson_iter_t arr;

   CHECK (*more && strcmp (bson_iter_key (out_it), "msg") == 0 && BSON_ITER_HOLDS_UTF8 (out_it));
   CHECK (strcmp (bson_iter_utf8 (out_it, NULL), "isdbgrid") == 0);
   *more = bson_iter_next (out_it);
   if (sid) {
      CHECK (*more && strcmp (bson_iter_key (out_it), "serviceId") == 0 && BSON_ITER_HOLDS_OID (out_it));
      CHECK (bson_oid_equal (bson_iter_oid (out_it), sid));
      *more = bson_iter_next (out_it);
   }
   if (c->n == 0)
      return;
   CHECK (*more && strcmp (bson_iter_key (out_it), "compression") == 0 && BSON_ITER_HOLDS_ARRAY (out_it));
   CHECK (bson_iter_recurse (out_it, &arr));
   for (int i = 0; i < c->n; i++) {
      CHECK (bson_iter_next (&arr) && BSON_ITER_HOLDS_UTF8 (&arr));
      CHECK (strcmp (bson_iter_utf8 (&arr, NULL), compress_name (c->ids[i])) == 0);
   }
   CHECK (!bson_iter_next (&arr));
   *more = bson_iter_next (out_it);
}

static void
check_reply (const bson_t *reply, const handshake_compression_t *c, const bson_oid_t *sid)
{
   bson_t out;
   bson_error_t err;
   bson_iter_t in_it, out_it;
   bool ok1, more, placed = false;

   ok1 = bson_iter_init_find (&in_it, reply, "ok") && bson_iter_as_double (&in_it) == 1.0;
   memset (&err, 0, sizeof err);
   if (!handshake_rewrite_reply (reply, c, sid, &out, &err)) {
      CHECK (err.domain == HANDSHAKE_ERROR_DOMAIN && err.message[0] != '\0');
      bson_destroy (&out);
      return;
   }
   CHECK (fuzz_iterable (bson_get_data (&out), out.len, 0));
   CHECK (bson_iter_init (&in_it, reply) && bson_iter_init (&out_it, &out));
   more = bson_iter_next (&out_it);
   if (!ok1) {
      /* Unchanged: the same elements (not always the same bytes: libbson
       * copies JavaScript code as a C string, cut at an embedded NUL). */
      while (bson_iter_next (&in_it)) {
         CHECK (more && same_element (&in_it, &out_it));
         more = bson_iter_next (&out_it);
      }
      CHECK (!more);
      bson_destroy (&out);
      return;
   }
   while (bson_iter_next (&in_it)) {
      const char *key = bson_iter_key (&in_it);

      /* An upstream's serviceId never passes: the proxy's own, if any, is
       * part of the persona. */
      if (is_identity (key) || strcmp (key, "compression") == 0 || strcmp (key, "msg") == 0 ||
          strcmp (key, "serviceId") == 0)
         continue;
      if (!placed && strcmp (key, "ok") == 0) {
         check_persona (&out_it, &more, c, sid);
         placed = true;
      }
      CHECK (more);
      CHECK (same_element (&in_it, &out_it));
      more = bson_iter_next (&out_it);
   }
   /* ok == 1 was found, so the persona went before it. */
   CHECK (placed);
   CHECK (!more);
   bson_destroy (&out);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   bson_t hello, reply;
   handshake_compression_t c;
   uint32_t hlen;
   bool add_db;
   const char *offered;

   if (size < 1)
      return 0;
   add_db = data[0] & 1;
   offered = offered_table[(data[0] >> 1) & 7];
   data++;
   size--;
   hlen = fuzz_doc_len (data, size);
   if (hlen < 5 || hlen > size || !fuzz_iterable (data, hlen, 0) || !bson_init_static (&hello, data, hlen))
      return 0;
   if (size == hlen) {
      reply = hello;
   } else if (!fuzz_iterable (data + hlen, (uint32_t) (size - hlen), 0) ||
              !bson_init_static (&reply, data + hlen, size - hlen)) {
      return 0;
   }

   check_is_hello (&hello);
   check_unwrap (&hello);
   check_x509 (&hello);
   handshake_negotiate (&hello, offered, &c);
   check_negotiate (&hello, offered, &c);
   check_request (&hello, add_db);
   check_reply (&reply, &c, NULL);
   /* A reply without compression, as when the client asked for none; and
    * with the serviceId of a client that asked for load-balanced mode. */
   c.n = 0;
   check_reply (&reply, &c, NULL);
   {
      bson_oid_t sid;
      bson_iter_t it;
      bool asked = bson_iter_init_find (&it, &hello, "loadBalanced") &&
                   (BSON_ITER_HOLDS_BOOL (&it) ? bson_iter_bool (&it)
                                               : BSON_ITER_HOLDS_NUMBER (&it) && bson_iter_as_double (&it) != 0.0);

      CHECK (handshake_wants_load_balanced (&hello) == asked);
      bson_oid_init_from_string (&sid, "65a0000000000000000000aa");
      check_reply (&reply, &c, &sid);
   }
   return 0;
}
