/*
 * fuzz_annotate.c - libFuzzer target for the annotation parser.
 *
 * The first input byte picks how the rest reaches annotate_parse:
 *   0: the rest is a whole command body (BSON);
 *   1: the rest is one event document: {insert, comment: {relaybus: doc}};
 *   2: the rest is read as an array of events: {comment: {relaybus: [..]}};
 *   3: the rest is the text after "relaybus:" in a string comment;
 *   4: the rest is relaybusPublish's `events` array (annotate_parse_events).
 * BSON inputs are first checked the way the wire codec checks them (libbson
 * iterates every nested document to its end), since annotate_parse only
 * ever sees bodies the codec accepted.
 *
 * Every annotation that parses is then planned by publish/inject.h against
 * a fixed config, with well-formed replies (checks that no input crashes
 * the command builders, and that the job finishes without failure).
 *
 * Oracles (abort() on failure):
 *   - ANNOTATE_ABSENT exactly when annotate_present is false;
 *   - FOUND: 1..ANNOTATE_MAX_EVENTS events, each with a valid UTF-8 type,
 *     an id, and fields within their limits; the forwarded body carries no
 *     annotation, keeps every other field, and is not larger than the input;
 *   - INVALID: a "relaybus: " message, empty outputs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <bson/bson.h>

#include "codec/annotate.h"
#include "base/config.h"
#include "publish/inject.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

#define CHECK(cond)                                                                \
   do {                                                                            \
      if (!(cond)) {                                                               \
         fprintf (stderr, "%s:%d: oracle failed: %s\n", __FILE__, __LINE__, #cond); \
         abort ();                                                                 \
      }                                                                            \
   } while (0)

#define MAX_DEPTH 200

/* Accepts a document libbson can iterate to its end, nested ones included
 * (what the wire codec guarantees for bodies). */
static bool
iterable (const uint8_t *p, uint32_t len, int depth)
{
   bson_t b;
   bson_iter_t it;

   if (depth > MAX_DEPTH || !bson_init_static (&b, p, len) || !bson_iter_init (&it, &b))
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
      default:
         break;
      }
      if (sub && !iterable (sub, sublen, depth + 1))
         return false;
   }
   return it.off == len - 1;
}

static void
check_events (const annotate_t *a)
{
   CHECK (a->storage != NULL);
   CHECK (a->n_events >= 1 && a->n_events <= ANNOTATE_MAX_EVENTS);
   for (uint32_t i = 0; i < a->n_events; i++) {
      const annotate_event_t *ev = &a->events[i];
      const char *id = annotate_event_id (ev);

      CHECK (ev->type && ev->type_len > 0 && ev->type_len <= ANNOTATE_MAX_TYPE_LEN);
      CHECK (strlen (ev->type) == ev->type_len);
      CHECK (bson_utf8_validate (ev->type, ev->type_len, false));
      CHECK (id && strlen (id) > 0 && strlen (id) <= ANNOTATE_MAX_ID_LEN);
      CHECK (!ev->key || (strlen (ev->key) == ev->key_len && ev->key_len <= ANNOTATE_MAX_KEY_LEN));
      if (ev->has_headers) {
         bson_iter_t h;
         int n = 0;

         CHECK (bson_iter_recurse (&ev->headers, &h));
         while (bson_iter_next (&h)) {
            CHECK (BSON_ITER_HOLDS_UTF8 (&h));
            n++;
         }
         CHECK (n > 0 && n <= ANNOTATE_MAX_HEADERS);
      }
      /* Explicit ids are unique within one annotation. */
      for (uint32_t j = 0; j < i; j++)
         CHECK (strcmp (id, annotate_event_id (&a->events[j])) != 0);
   }
}

/* Every field of `body` but the comment is in `fwd`, in order. */
static void
check_forward (const bson_t *body, const bson_t *fwd)
{
   bson_iter_t a, b;

   CHECK (!annotate_present (fwd));
   CHECK (fwd->len <= body->len);
   CHECK (bson_iter_init (&a, body) && bson_iter_init (&b, fwd));
   while (bson_iter_next (&a)) {
      if (strcmp (bson_iter_key (&a), "comment") == 0)
         continue;
      do {
         CHECK (bson_iter_next (&b));
      } while (strcmp (bson_iter_key (&b), "comment") == 0);
      CHECK (strcmp (bson_iter_key (&a), bson_iter_key (&b)) == 0);
      CHECK (bson_iter_type (&a) == bson_iter_type (&b));
   }
}

/* The `n` a write command's reply reports: its statements or documents. */
static int32_t
statements (const bson_t *cmd)
{
   bson_iter_t it, sub;
   int32_t n = 0;

   if ((bson_iter_init_find (&it, cmd, "updates") || bson_iter_init_find (&it, cmd, "documents")) &&
       bson_iter_recurse (&it, &sub)) {
      while (bson_iter_next (&sub))
         n++;
   }
   return n;
}

/* Plans and "runs" the outbox writes of `a` (moved in) with good replies. */
static void
run_inject (annotate_t *a)
{
   static config_t *cfg;
   bson_error_t error;
   bson_t *cmd;
   inject_job_t *job;
   uint32_t n, rounds = 0;

   if (!cfg) {
      cfg = config_parse_string ("[handler a]\nevents = *\nkind = pull\n[handler b]\nevents = t, order.*\nkind = pull\n",
                                 "fuzz.ini", &error);
      CHECK (cfg);
   }
   cmd = BCON_NEW ("insert", "o", "lsid", "{", "id", BCON_INT32 (1), "}", "txnNumber", BCON_INT64 (1), "autocommit",
                   BCON_BOOL (false));
   job = inject_job_new (a, cmd, false, cfg, 0, &error);
   CHECK (job);
   CHECK (a->n_events == 0 && a->storage == NULL);
   while ((n = inject_job_next_round (job)) > 0) {
      CHECK (++rounds <= 3);
      for (uint32_t i = 0; i < n; i++) {
         const bson_t *c = inject_job_command (job, i);
         bson_t *reply;

         CHECK (c);
         switch (inject_job_phase (job)) {
         case INJECT_PHASE_READ:
            reply = BCON_NEW ("cursor", "{", "id", BCON_INT64 (0), "firstBatch", "[", "]", "}", "ok", BCON_INT32 (1));
            break;
         case INJECT_PHASE_SEQ:
            reply = BCON_NEW ("value", "{", "value", BCON_INT64 (1000), "}", "ok", BCON_INT32 (1));
            break;
         default:
            reply = BCON_NEW ("n", BCON_INT32 (statements (c)), "ok", BCON_INT32 (1));
            break;
         }
         inject_job_reply (job, i, reply);
         bson_destroy (reply);
      }
   }
   CHECK (!inject_job_failed (job, NULL));
   CHECK (inject_job_phase (job) == INJECT_PHASE_DONE);
   inject_job_destroy (job);
   bson_destroy (cmd);
}

static void
run_body (const bson_t *body)
{
   annotate_t *a = malloc (sizeof *a);
   bson_t fwd;
   bson_error_t error;
   bool present = annotate_present (body);
   annotate_status_t st = annotate_parse (body, a, &fwd, &error);

   CHECK (a);
   CHECK ((st == ANNOTATE_ABSENT) == !present);
   switch (st) {
   case ANNOTATE_FOUND:
      check_events (a);
      check_forward (body, &fwd);
      run_inject (a);
      break;
   case ANNOTATE_INVALID:
      CHECK (strncmp (error.message, "relaybus: ", 10) == 0);
      /* fall through */
   case ANNOTATE_ABSENT:
      CHECK (a->storage == NULL && a->n_events == 0);
      CHECK (bson_empty (&fwd));
      break;
   }
   bson_destroy (&fwd);
   annotate_cleanup (a);
   free (a);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   bson_t in, *body;
   uint8_t mode;

   if (size < 1)
      return 0;
   mode = data[0] % 5;
   data++;
   size--;

   if (mode == 3) {
      char *text = malloc (sizeof ANNOTATE_STRING_PREFIX + size);

      memcpy (text, ANNOTATE_STRING_PREFIX, sizeof ANNOTATE_STRING_PREFIX - 1);
      memcpy (text + sizeof ANNOTATE_STRING_PREFIX - 1, data, size);
      body = bson_new ();
      BSON_APPEND_UTF8 (body, "insert", "o");
      bson_append_utf8 (body, "comment", 7, text, (int) (sizeof ANNOTATE_STRING_PREFIX - 1 + size));
      BSON_APPEND_UTF8 (body, "$db", "d");
      run_body (body);
      bson_destroy (body);
      free (text);
      return 0;
   }

   if (size > UINT32_MAX || !iterable (data, (uint32_t) size, 0) || !bson_init_static (&in, data, size))
      return 0;

   switch (mode) {
   case 0:
      run_body (&in);
      break;
   case 1:
   case 2: {
      bson_t comment;

      body = bson_new ();
      BSON_APPEND_UTF8 (body, "insert", "o");
      BSON_APPEND_DOCUMENT_BEGIN (body, "comment", &comment);
      if (mode == 1)
         BSON_APPEND_DOCUMENT (&comment, "relaybus", &in);
      else
         BSON_APPEND_ARRAY (&comment, "relaybus", &in);
      bson_append_document_end (body, &comment);
      BSON_APPEND_UTF8 (body, "$db", "d");
      run_body (body);
      bson_destroy (body);
      break;
   }
   case 4: {
      annotate_t *a = malloc (sizeof *a);
      bson_error_t error;
      bson_iter_t it;

      body = bson_new ();
      BSON_APPEND_ARRAY (body, "events", &in);
      CHECK (bson_iter_init_find (&it, body, "events"));
      if (annotate_parse_events (&it, a, &error)) {
         check_events (a);
         run_inject (a);
      } else
         CHECK (strncmp (error.message, "relaybus: ", 10) == 0 && a->storage == NULL);
      annotate_cleanup (a);
      free (a);
      bson_destroy (body);
      break;
   }
   default:
      break;
   }
   return 0;
}
