/*
 * fuzz_util.h - what the newer libFuzzer targets share: the oracle macro
 * and the "the codec would have accepted this document" check.
 *
 * Header-only (static functions) so each target stays one translation unit
 * linked against librelaybus.a, as fuzz_wire and fuzz_annotate are.
 */
#ifndef RELAYBUS_FUZZ_UTIL_H
#define RELAYBUS_FUZZ_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <bson/bson.h>

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

/* An oracle failure aborts, which libFuzzer reports as a crash. */
#define CHECK(cond)                                                                \
   do {                                                                            \
      if (!(cond)) {                                                               \
         fprintf (stderr, "%s:%d: oracle failed: %s\n", __FILE__, __LINE__, #cond); \
         abort ();                                                                 \
      }                                                                            \
   } while (0)

#define FUZZ_MAX_DEPTH 200

/* True for a document libbson iterates to its very end, nested documents
 * included: what the wire codec guarantees for every body it passes on, so
 * the only documents the code under test ever sees. */
static inline bool
fuzz_iterable (const uint8_t *p, uint32_t len, int depth)
{
   bson_t b;
   bson_iter_t it;

   if (depth > FUZZ_MAX_DEPTH || !bson_init_static (&b, p, len) || !bson_iter_init (&it, &b))
      return false;
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
         if (!bson_iter_utf8 (&it, &slen))
            return false;
         break;
      default:
         break;
      }
      if (sub && !fuzz_iterable (sub, sublen, depth + 1))
         return false;
   }
   return it.off == len - 1;
}

/* Reads the length prefix of a document at p (n bytes left); 0 if there
 * is no whole prefix. */
static inline uint32_t
fuzz_doc_len (const uint8_t *p, size_t n)
{
   if (n < 4)
      return 0;
   return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

#endif /* RELAYBUS_FUZZ_UTIL_H */
