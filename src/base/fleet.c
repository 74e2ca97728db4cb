/*
 * base/fleet.c - the fleet's handler set as this process last read it (see
 * base/fleet.h): building a snapshot from the instance documents, matching, the
 * settings hash, and the process-wide current snapshot.
 *
 * No I/O here: the dispatcher thread reads the documents (store/fleet.c)
 * and publishes; the forwarding loop and the admin thread only read
 * snapshots.
 */
#include "base/fleet.h"
#include "base/snapshot.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

bool
fleet_handler_matches (const fleet_handler_t *h, const char *type)
{
   return config_patterns_match ((const char *const *) h->patterns, h->n_patterns, type);
}

/* Each field with its length in front, so no two settings hash alike by
 * moving a separator. */
static void
hash_field (EVP_MD_CTX *md, const char *name, const char *value)
{
   char len[32];

   value = value ? value : "";
   snprintf (len, sizeof len, "%s:%zu:", name, strlen (value));
   EVP_DigestUpdate (md, len, strlen (len));
   EVP_DigestUpdate (md, value, strlen (value));
}

void
fleet_handler_hash (const config_handler_t *h, char out[FLEET_HASH_LEN + 1])
{
   EVP_MD_CTX *md = EVP_MD_CTX_new ();
   unsigned char digest[EVP_MAX_MD_SIZE];
   unsigned int dlen = 0;
   char num[96];
   char *url;

   out[0] = '\0';
   if (!md)
      return;
   EVP_DigestInit_ex (md, EVP_sha256 (), NULL);
   hash_field (md, "kind", h->kind);
   for (size_t i = 0; i < h->n_event_patterns; i++)
      hash_field (md, "event", h->event_patterns[i]);
   /* No secret enters: the url with its password masked, and not the
    * signing secret (include/base/fleet.h says why). */
   url = config_mask ("url", h->url);
   hash_field (md, "url", url ? url : "");
   bson_free (url);
   for (size_t i = 0; i < h->n_retry_delays; i++) {
      snprintf (num, sizeof num, "%lld", (long long) h->retry_delays_ms[i]);
      hash_field (md, "delay", num);
   }
   snprintf (num,
             sizeof num,
             "%lld/%lld/%lld/%d",
             (long long) h->max_attempts,
             (long long) h->timeout_ms,
             (long long) h->concurrency,
             h->retry_4xx ? 1 : 0);
   hash_field (md, "limits", num);
   EVP_DigestFinal_ex (md, digest, &dlen);
   EVP_MD_CTX_free (md);
   memcpy (out, "sha256:", 7);
   for (unsigned i = 0; i < 8 && i < dlen; i++)
      snprintf (out + 7 + 2 * i, 3, "%02x", digest[i]);
}

bool
fleet_append_handlers (const config_t *cfg,
                       const int64_t *backfill_since,
                       const int64_t *backfill_until,
                       bson_t *doc,
                       const char *key)
{
   bson_t arr;

   if (!BSON_APPEND_ARRAY_BEGIN (doc, key, &arr))
      return false;
   for (size_t i = 0; i < cfg->n_handlers; i++) {
      const config_handler_t *h = &cfg->handlers[i];
      char idx[16], hash[FLEET_HASH_LEN + 1];
      const char *k;
      bson_t hd, ev;

      bson_uint32_to_string ((uint32_t) i, &k, idx, sizeof idx);
      fleet_handler_hash (h, hash);
      BSON_APPEND_DOCUMENT_BEGIN (&arr, k, &hd);
      BSON_APPEND_UTF8 (&hd, "name", h->name);
      BSON_APPEND_UTF8 (&hd, "kind", h->kind);
      BSON_APPEND_ARRAY_BEGIN (&hd, "events", &ev);
      for (size_t p = 0; p < h->n_event_patterns; p++) {
         char pidx[16];
         const char *pk;

         bson_uint32_to_string ((uint32_t) p, &pk, pidx, sizeof pidx);
         BSON_APPEND_UTF8 (&ev, pk, h->event_patterns[p]);
      }
      bson_append_array_end (&hd, &ev);
      BSON_APPEND_UTF8 (&hd, "hash", hash);
      if (backfill_since && backfill_until && backfill_until[i] > 0)
         BSON_APPEND_DATE_TIME (&hd, "backfillSince", backfill_since[i]);
      if (backfill_until && backfill_until[i] > 0)
         BSON_APPEND_DATE_TIME (&hd, "backfillUntil", backfill_until[i]);
      bson_append_document_end (&arr, &hd);
   }
   return bson_append_array_end (doc, &arr);
}

/* --- snapshots --------------------------------------------------------- */

static void
handler_clear (fleet_handler_t *h)
{
   bson_free (h->name);
   bson_free (h->kind);
   for (size_t i = 0; i < h->n_patterns; i++)
      bson_free (h->patterns[i]);
   bson_free (h->patterns);
   bson_free (h->hash);
}

static void
fleet_free (fleet_set_t *fs)
{
   for (size_t i = 0; i < fs->n_instances; i++) {
      fleet_instance_t *in = &fs->instances[i];

      for (size_t h = 0; h < in->n_handlers; h++)
         handler_clear (&in->handlers[h]);
      bson_free (in->handlers);
      bson_free (in->instance);
      bson_free (in->version);
   }
   for (size_t i = 0; i < fs->n_disagreeing; i++)
      bson_free (fs->disagreeing[i]);
   bson_free (fs->disagreeing);
   bson_free (fs->instances);
   bson_free (fs->set);
   bson_free (fs);
}

/* One handler entry {name, kind, events, hash}; false for another shape. */
static bool
handler_read (bson_iter_t *doc, fleet_handler_t *h)
{
   bson_iter_t f, ev;
   size_t n = 0;

   memset (h, 0, sizeof *h);
   if (!BSON_ITER_HOLDS_DOCUMENT (doc) || !bson_iter_recurse (doc, &f))
      return false;
   while (bson_iter_next (&f)) {
      const char *k = bson_iter_key (&f);

      if (!strcmp (k, "name") && BSON_ITER_HOLDS_UTF8 (&f) && !h->name) {
         h->name = bson_strdup (bson_iter_utf8 (&f, NULL));
      } else if (!strcmp (k, "kind") && BSON_ITER_HOLDS_UTF8 (&f) && !h->kind) {
         h->kind = bson_strdup (bson_iter_utf8 (&f, NULL));
      } else if (!strcmp (k, "backfillUntil") && BSON_ITER_HOLDS_DATE_TIME (&f)) {
         h->backfill_until = bson_iter_date_time (&f);
      } else if (!strcmp (k, "backfillSince") && BSON_ITER_HOLDS_DATE_TIME (&f)) {
         h->backfill_since = bson_iter_date_time (&f);
      } else if (!strcmp (k, "hash") && BSON_ITER_HOLDS_UTF8 (&f) && !h->hash) {
         h->hash = bson_strdup (bson_iter_utf8 (&f, NULL));
      } else if (!strcmp (k, "events") && BSON_ITER_HOLDS_ARRAY (&f) && !h->patterns && bson_iter_recurse (&f, &ev)) {
         bson_iter_t cnt = ev;

         while (bson_iter_next (&cnt))
            n++;
         h->patterns = bson_malloc0 ((n ? n : 1) * sizeof *h->patterns);
         while (bson_iter_next (&ev) && h->n_patterns < n)
            if (BSON_ITER_HOLDS_UTF8 (&ev))
               h->patterns[h->n_patterns++] = bson_strdup (bson_iter_utf8 (&ev, NULL));
      }
   }
   if (!h->name || !*h->name || !h->n_patterns) {
      handler_clear (h);
      return false;
   }
   if (!h->kind)
      h->kind = bson_strdup ("");
   if (!h->hash)
      h->hash = bson_strdup ("");
   return true;
}

static bool
same_declaration (const fleet_handler_t *a, const fleet_handler_t *b)
{
   if (strcmp (a->kind, b->kind) || strcmp (a->hash, b->hash) || a->n_patterns != b->n_patterns)
      return false;
   for (size_t i = 0; i < a->n_patterns; i++)
      if (strcmp (a->patterns[i], b->patterns[i]))
         return false;
   return true;
}

int64_t
fleet_docs_heartbeat (const bson_t *const *docs, size_t n, const char *self, int64_t fallback)
{
   bson_iter_t it;

   for (size_t i = 0; i < n; i++)
      if (bson_iter_init_find (&it, docs[i], "_id") && BSON_ITER_HOLDS_UTF8 (&it) &&
          !strcmp (bson_iter_utf8 (&it, NULL), self) && bson_iter_init_find (&it, docs[i], "heartbeatAt") &&
          BSON_ITER_HOLDS_DATE_TIME (&it))
         return bson_iter_date_time (&it);
   return fallback;
}

fleet_set_t *
fleet_set_from_docs (const bson_t *const *docs, size_t n, int64_t now, int64_t live_ms, int64_t keep_ms)
{
   fleet_set_t *fs = bson_malloc0 (sizeof *fs);
   size_t cap_set = 0;

   atomic_init (&fs->refcount, 1);
   fs->read_at = now;
   if (n > FLEET_MAX_DOCS)
      n = FLEET_MAX_DOCS;
   fs->instances = bson_malloc0 ((n ? n : 1) * sizeof *fs->instances);
   for (size_t i = 0; i < n; i++) {
      fleet_instance_t *in = &fs->instances[fs->n_instances];
      bson_iter_t it, arr;
      size_t cap = 0;

      if (!bson_iter_init_find (&it, docs[i], "_id") || !BSON_ITER_HOLDS_UTF8 (&it))
         continue;
      in->instance = bson_strdup (bson_iter_utf8 (&it, NULL));
      if (bson_iter_init_find (&it, docs[i], "heartbeatAt") && BSON_ITER_HOLDS_DATE_TIME (&it))
         in->heartbeat_at = bson_iter_date_time (&it);
      if (bson_iter_init_find (&it, docs[i], "startedAt") && BSON_ITER_HOLDS_DATE_TIME (&it))
         in->started_at = bson_iter_date_time (&it);
      /* A proxy that stopped cleanly says so: not live from then on, but
       * its last heartbeat still dates its declarations. */
      in->stopped = bson_iter_init_find (&it, docs[i], "stoppedAt");
      if (bson_iter_init_find (&it, docs[i], "version") && BSON_ITER_HOLDS_UTF8 (&it))
         in->version = bson_strdup (bson_iter_utf8 (&it, NULL));
      in->live = !in->stopped && in->heartbeat_at > now - live_ms;
      /* Stopped or silent, its declarations stand until the retention
       * ends: a stalled or restarting declarer keeps its handlers' deliveries. */
      in->kept = in->heartbeat_at > now - keep_ms;
      if (bson_iter_init_find (&it, docs[i], "handlers") && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &arr)) {
         while (bson_iter_next (&arr) && in->n_handlers < CONFIG_MAX_HANDLERS) {
            fleet_handler_t h;

            if (!handler_read (&arr, &h))
               continue;
            if (in->n_handlers == cap) {
               cap = cap ? 2 * cap : 8;
               in->handlers = bson_realloc (in->handlers, cap * sizeof *in->handlers);
            }
            in->handlers[in->n_handlers++] = h;
         }
      }
      fs->n_instances++;
   }

   /* The set: the union of the kept declarations, the newest heartbeat's
    * entry for a name (the documents come newest first). */
   for (size_t i = 0; i < fs->n_instances; i++) {
      const fleet_instance_t *in = &fs->instances[i];

      for (size_t h = 0; in->kept && h < in->n_handlers; h++) {
         const fleet_handler_t *hd = &in->handlers[h];
         size_t k;

         for (k = 0; k < fs->n_set; k++)
            if (!strcmp (fs->set[k]->name, hd->name))
               break;
         if (k < fs->n_set || fs->n_set == FLEET_MAX_HANDLERS)
            continue;
         if (fs->n_set == cap_set) {
            cap_set = cap_set ? 2 * cap_set : 16;
            fs->set = bson_realloc (fs->set, cap_set * sizeof *fs->set);
         }
         fs->set[fs->n_set++] = hd;
      }
   }
   /* The names live instances declare differently: what they declare now. */
   for (size_t i = 0; i < fs->n_instances; i++) {
      const fleet_instance_t *in = &fs->instances[i];

      for (size_t h = 0; in->live && h < in->n_handlers; h++) {
         const fleet_handler_t *hd = &in->handlers[h];
         const fleet_handler_t *first = NULL;
         bool listed = false;

         for (size_t j = 0; j < i && !first; j++)
            for (size_t k = 0; fs->instances[j].live && k < fs->instances[j].n_handlers; k++)
               if (!strcmp (fs->instances[j].handlers[k].name, hd->name)) {
                  first = &fs->instances[j].handlers[k];
                  break;
               }
         if (!first || same_declaration (first, hd))
            continue;
         for (size_t d = 0; d < fs->n_disagreeing; d++)
            listed = listed || !strcmp (fs->disagreeing[d], hd->name);
         if (!listed) {
            fs->disagreeing = bson_realloc (fs->disagreeing, (fs->n_disagreeing + 1) * sizeof *fs->disagreeing);
            fs->disagreeing[fs->n_disagreeing++] = bson_strdup (hd->name);
         }
      }
   }
   return fs;
}

fleet_set_t *
fleet_retain (fleet_set_t *fs)
{
   if (fs)
      atomic_fetch_add (&fs->refcount, 1);
   return fs;
}

void
fleet_release (fleet_set_t *fs)
{
   if (fs && atomic_fetch_sub (&fs->refcount, 1) == 1)
      fleet_free (fs);
}

static snapshot_t current = SNAPSHOT_INIT;
/* Signalled at each publish and at a failed attempt, for fleet_wait_first. */
static pthread_mutex_t first_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t first_cond = PTHREAD_COND_INITIALIZER;
static bool first_failed; /* under first_mu */

static void *
fleet_retain_any (void *fs)
{
   return fleet_retain (fs);
}

void
fleet_publish (fleet_set_t *fs)
{
   fleet_release (snapshot_swap (&current, fs));
   pthread_mutex_lock (&first_mu);
   pthread_cond_broadcast (&first_cond);
   pthread_mutex_unlock (&first_mu);
}

static bool
fleet_published (void)
{
   fleet_set_t *fs = fleet_acquire ();
   bool any = fs != NULL;

   fleet_release (fs);
   return any;
}

void
fleet_note_failed (void)
{
   pthread_mutex_lock (&first_mu);
   first_failed = true;
   pthread_cond_broadcast (&first_cond);
   pthread_mutex_unlock (&first_mu);
}

bool
fleet_wait_first (int64_t timeout_ms)
{
   struct timespec until;
   bool any;

   clock_gettime (CLOCK_REALTIME, &until);
   until.tv_sec += (time_t) (timeout_ms / 1000);
   until.tv_nsec += (long) (timeout_ms % 1000) * 1000000L;
   if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
   }
   pthread_mutex_lock (&first_mu);
   while (!(any = fleet_published ()) && !first_failed)
      if (pthread_cond_timedwait (&first_cond, &first_mu, &until) != 0) {
         any = fleet_published ();
         break;
      }
   pthread_mutex_unlock (&first_mu);
   return any;
}

fleet_set_t *
fleet_acquire (void)
{
   return snapshot_take (&current, fleet_retain_any);
}

bool
fleet_type_routed (const config_t *cfg, const fleet_set_t *fs, const char *type)
{
   for (size_t i = 0; cfg && i < cfg->n_handlers; i++)
      if (config_handler_matches (&cfg->handlers[i], type))
         return true;
   for (size_t i = 0; fs && i < fs->n_set; i++)
      if (fleet_handler_matches (fs->set[i], type))
         return true;
   return false;
}

bool
fleet_declared_elsewhere (const fleet_set_t *fs, const char *self, const char *name)
{
   for (size_t i = 0; fs && i < fs->n_instances; i++) {
      const fleet_instance_t *in = &fs->instances[i];

      if (!in->kept || (self && !strcmp (in->instance, self)))
         continue;
      for (size_t h = 0; h < in->n_handlers; h++)
         if (!strcmp (in->handlers[h].name, name))
            return true;
   }
   return false;
}

int64_t
fleet_backfill_record (const fleet_set_t *fs, const char *self, const char *name, bool live, int64_t *since)
{
   int64_t until = 0;

   *since = 0;
   for (size_t i = 0; fs && i < fs->n_instances; i++) {
      const fleet_instance_t *in = &fs->instances[i];

      if (!in->kept || in->live != live || (self && !strcmp (in->instance, self)))
         continue;
      for (size_t h = 0; h < in->n_handlers; h++)
         if (!strcmp (in->handlers[h].name, name) && in->handlers[h].backfill_until > until) {
            until = in->handlers[h].backfill_until;
            *since = in->handlers[h].backfill_since;
         }
   }
   return until;
}

bool
fleet_old_version_live (const fleet_set_t *fs)
{
   for (size_t i = 0; fs && i < fs->n_instances; i++)
      if (fs->instances[i].live && (!fs->instances[i].version || !strncmp (fs->instances[i].version, "0.1.", 4)))
         return true;
   return false;
}

int64_t
fleet_last_declared (const fleet_set_t *fs, const char *name)
{
   int64_t last = 0;

   for (size_t i = 0; fs && i < fs->n_instances; i++) {
      const fleet_instance_t *in = &fs->instances[i];

      for (size_t h = 0; h < in->n_handlers; h++)
         if (!strcmp (in->handlers[h].name, name) && in->heartbeat_at > last)
            last = in->heartbeat_at;
   }
   return last;
}
