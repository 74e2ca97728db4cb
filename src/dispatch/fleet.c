/*
 * dispatch/fleet.c - the dispatcher's part in the fleet's handler set (see
 * dispatch/fleet.h): every heartbeat it records this instance's handlers,
 * reads the fleet's and publishes the snapshot injection uses (base/fleet.h);
 * it backfills the handlers new to the fleet's set that this instance
 * declares, and retires under a lease the handlers no instance declared
 * for handler_retire_after.
 *
 * Every time here is the server's: the heartbeat this instance just wrote
 * ($currentDate) and read back is "now" for liveness, the set, the
 * backfills' ends and the retirement.
 *
 * What this file does not do: claim or deliver.  The dispatcher asks
 * dispatch_fleet_holds before it claims a handler, and calls
 * dispatch_fleet_beat from its timer.  Blocking store calls: the
 * dispatcher thread only.
 */
#include "dispatch/fleet.h"

#include <inttypes.h>
#include <string.h>

#include "autoconf.h"
#include "base/fleet.h"
#include "base/log.h"
#include "base/counters.h"
#include "store/fleet.h"

/* A handler this instance backfills: it declared it first, or carries on
 * the backfill of a declarer that is gone (`bf`, the window and the
 * cursor).  With `hold_only`, a live instance is backfilling it: only its
 * claims wait, until that instance's record (`until`) ends. */
typedef struct {
   char *name; /* owned: a reload may free the configuration it came from */
   store_backfill_t bf;
   int64_t until;
   size_t added;
   bool hold_only;
} fleet_backfill_t;

/* Owned by the dispatcher; the store is borrowed. */
struct dispatch_fleet {
   store_t *store;
   char *owner;
   int64_t started_ms; /* when this instance first announced (the server's clock) */
   bool announced;
   bool failing;        /* the last announce or read failed (logged once) */
   fleet_set_t *fleet;  /* our reference on the last snapshot read */
   size_t disagreeing;  /* of the last snapshot, to log changes once */
   int64_t retire_checked_ms;
   fleet_backfill_t *backfills; /* handlers still being backfilled or held */
   size_t n_backfills;
   char **known; /* the local handlers of the last heartbeat (owned names) */
   size_t n_known;
   char **recorded; /* names this process recorded as declared by the fleet (owned) */
   size_t n_recorded;
   store_handler_state_t *disabled; /* the outbox's disabled handlers, as last read (owned) */
   size_t n_disabled;
   bool disabled_read; /* read at least once (changes are logged from then on) */
};

dispatch_fleet_t *
dispatch_fleet_new (store_t *store, const char *owner)
{
   dispatch_fleet_t *f = bson_malloc0 (sizeof *f);

   f->store = store;
   f->owner = bson_strdup (owner);
   return f;
}

void
dispatch_fleet_destroy (dispatch_fleet_t *f)
{
   if (!f)
      return;
   for (size_t i = 0; i < f->n_backfills; i++) {
      bson_free (f->backfills[i].name);
      store_backfill_clear (&f->backfills[i].bf);
   }
   bson_free (f->backfills);
   for (size_t i = 0; i < f->n_known; i++)
      bson_free (f->known[i]);
   bson_free (f->known);
   for (size_t i = 0; i < f->n_recorded; i++)
      bson_free (f->recorded[i]);
   bson_free (f->recorded);
   store_handler_states_free (f->disabled, f->n_disabled);
   fleet_release (f->fleet);
   bson_free (f->owner);
   bson_free (f);
}

static const store_handler_state_t *
fleet_disabled_find (const store_handler_state_t *states, size_t n, const char *handler)
{
   for (size_t i = 0; i < n; i++)
      if (!strcmp (states[i].name, handler))
         return &states[i];
   return NULL;
}

bool
dispatch_fleet_disabled (const dispatch_fleet_t *f, const char *handler)
{
   return f && fleet_disabled_find (f->disabled, f->n_disabled, handler) != NULL;
}

bool
dispatch_fleet_disable (dispatch_fleet_t *f, const char *handler, counters_state_t why, const char *reason, int64_t now)
{
   bson_error_t err;
   bool changed = false;

   if (dispatch_fleet_disabled (f, handler))
      return true;
   if (!store_fleet_disable (f->store, handler, reason, &changed, &err)) {
      log_warn ("dispatch: disabling handler %s (%s): %s", handler, reason, err.message);
      return false;
   }
   /* Held here at once; the other proxies learn it at their next
    * heartbeat's read, and so does this one (with the server's time). */
   f->disabled = bson_realloc (f->disabled, (f->n_disabled + 1) * sizeof *f->disabled);
   f->disabled[f->n_disabled].name = bson_strdup (handler);
   f->disabled[f->n_disabled].reason = bson_strdup (reason);
   f->disabled[f->n_disabled].at = now;
   f->n_disabled++;
   counters_set (COUNTER_DISABLED_HANDLERS, f->n_disabled);
   if (changed) {
      counters_add_at (COUNTER_HANDLER_STATE_CHANGES, why, 1);
      log_warn ("dispatch: handler %s disabled (%s): its deliveries wait as pending until POST /api/handlers/%s/enable",
                handler,
                reason,
                handler);
   } else {
      log_info ("dispatch: handler %s is disabled already (%s here too): its deliveries wait", handler, reason);
   }
   return true;
}

/* Reads the outbox's disabled handlers and logs what changed since the
 * last read; true when a handler was enabled again (or this was the first
 * read).  On a failed read the
 * last set stays (a disabled handler is not sent to because the database
 * answers badly). */
static bool
fleet_read_disabled (dispatch_fleet_t *f)
{
   store_handler_state_t *states = NULL;
   size_t n = 0;
   bson_error_t err;
   bool enabled = !f->disabled_read; /* the first read releases every handler it does not name */

   if (!store_fleet_disabled (f->store, &states, &n, CONFIG_MAX_HANDLERS * 4, &err)) {
      log_warn ("dispatch: reading the disabled handlers (retried every heartbeat): %s", err.message);
      return false;
   }
   for (size_t i = 0; f->disabled_read && i < n; i++)
      if (!fleet_disabled_find (f->disabled, f->n_disabled, states[i].name))
         log_warn ("dispatch: handler %s is disabled in the outbox (%s): its deliveries wait", states[i].name, states[i].reason);
   for (size_t i = 0; i < f->n_disabled; i++)
      if (!fleet_disabled_find (states, n, f->disabled[i].name)) {
         log_info ("dispatch: handler %s is enabled again: its waiting deliveries are sent", f->disabled[i].name);
         enabled = true;
      }
   store_handler_states_free (f->disabled, f->n_disabled);
   f->disabled = states;
   f->n_disabled = n;
   f->disabled_read = true;
   counters_set (COUNTER_DISABLED_HANDLERS, n);
   return enabled;
}

/* Whether `handler` is being backfilled (or held for another's backfill). */
static bool
fleet_backfilling (const dispatch_fleet_t *f, const char *handler)
{
   for (size_t i = 0; f && i < f->n_backfills; i++)
      if (!strcmp (f->backfills[i].name, handler))
         return true;
   return false;
}

bool
dispatch_fleet_holds (const dispatch_fleet_t *f, const char *handler)
{
   /* Until the disabled handlers were read once, any handler may be one:
    * a proxy that starts must not send to an endpoint the fleet disabled. */
   if (f && !f->disabled_read)
      return true;
   return dispatch_fleet_disabled (f, handler) || fleet_backfilling (f, handler);
}

void
dispatch_fleet_stop (dispatch_fleet_t *f, int64_t now)
{
   bson_t fields = BSON_INITIALIZER;
   bson_error_t err;

   if (!f || !f->announced)
      return;
   /* From now on the others count this instance as gone, not silent. */
   BSON_APPEND_DATE_TIME (&fields, "stoppedAt", now);
   if (!store_fleet_announce (f->store, &fields, &err) || !store_fleet_lease_release (f->store, now, &err))
      log_warn ("dispatch: recording the stop in the fleet's handlers: %s", err.message);
   bson_destroy (&fields);
}

static int64_t
fleet_live_ms (const config_t *cfg)
{
   return FLEET_LIVE_HEARTBEATS * cfg->handler_heartbeat_ms;
}

static bool
local_handler (const config_t *cfg, const char *name)
{
   for (size_t i = 0; i < cfg->n_handlers; i++)
      if (!strcmp (cfg->handlers[i].name, name))
         return true;
   return false;
}

static void
backfill_remove (dispatch_fleet_t *f, size_t i)
{
   bson_free (f->backfills[i].name);
   store_backfill_clear (&f->backfills[i].bf);
   f->backfills[i] = f->backfills[--f->n_backfills];
}

/* Whether the last heartbeat declared `name`. */
static bool
fleet_known (const dispatch_fleet_t *f, const char *name)
{
   for (size_t i = 0; i < f->n_known; i++)
      if (!strcmp (f->known[i], name))
         return true;
   return false;
}

/* Remembers the handlers this heartbeat declared. */
static void
fleet_remember (dispatch_fleet_t *f, const config_t *cfg)
{
   for (size_t i = 0; i < f->n_known; i++)
      bson_free (f->known[i]);
   f->known = bson_realloc (f->known, (cfg->n_handlers + 1) * sizeof *f->known);
   f->n_known = cfg->n_handlers;
   for (size_t i = 0; i < cfg->n_handlers; i++)
      f->known[i] = bson_strdup (cfg->handlers[i].name);
}

/* How long a transaction that writes the outbox can stay open: the larger
 * of [outbox] transaction_lifetime and the server's
 * transactionLifetimeLimitSeconds (the server aborts a transaction older
 * than that, so no transaction commits later, whatever the key says).
 * Read from the server at each backfill start (a rare event: a handler's
 * first declaration), so that a limit an operator raised with setParameter
 * counts; when it cannot be read (a mongos: each shard has its own), the
 * key alone, and the log says so. */
static int64_t
fleet_txn_lifetime (dispatch_fleet_t *f, const config_t *cfg)
{
   int64_t server_ms = 0, key_ms = cfg->transaction_lifetime_ms;
   bson_error_t err;

   if (!store_fleet_server_txn_lifetime (f->store, &server_ms, &err)) {
      log_warn ("dispatch: backfill window: the server's transactionLifetimeLimitSeconds cannot be read (%s); using [outbox] "
                "transaction_lifetime (%" PRId64 " ms): set it to at least the limit of every shard",
                err.message,
                key_ms);
      return key_ms;
   }
   log_info ("dispatch: backfill window: the server's transactionLifetimeLimitSeconds is %" PRId64 " ms, [outbox] "
             "transaction_lifetime %" PRId64 " ms: using %" PRId64 " ms",
             server_ms,
             key_ms,
             server_ms > key_ms ? server_ms : key_ms);
   return server_ms > key_ms ? server_ms : key_ms;
}

/* At the first announce, and for a handler a reload added since the last
 * heartbeat: every such local handler no other kept instance declares is
 * new to the fleet's set.  Proxies that have not read our document yet
 * still write events without it, for at most a liveness bound after now,
 * and a transaction open across now commits up to a transaction lifetime
 * later with events created up to a lifetime before it (the lifetime:
 * fleet_txn_lifetime).  So the events created from now - bound - lifetime
 * (a publisher's clock may lag the server's by up to the bound) until
 * now + bound + lifetime that lack it are backfilled, and its deliveries wait until that ends, so
 * that no later delivery of a key runs before a backfilled earlier one.
 * With no other instance in the fleet (kept and not stopped) there is
 * nobody to backfill for: an instance that starts later reads our document
 * before it listens, so it writes with ours.  A handler a live instance
 * is still backfilling (its document dates the end) is not claimed here
 * either before then; one whose backfill a declarer that is gone (killed,
 * stopped, restarted: a new instance) recorded is carried on here
 * (fleet_carry_on), since nobody else would backfill what became visible
 * after that declarer's last pass. */
static void
fleet_start_backfills (dispatch_fleet_t *f, const config_t *cfg, const fleet_set_t *fs, int64_t now, bool only_new)
{
   int64_t reach = -1;
   size_t others = 0;

   for (size_t i = 0; i < fs->n_instances; i++)
      others += fs->instances[i].kept && !fs->instances[i].stopped && strcmp (fs->instances[i].instance, f->owner) != 0;
   f->backfills = bson_realloc (f->backfills, (f->n_backfills + cfg->n_handlers + 1) * sizeof *f->backfills);
   for (size_t i = 0; i < cfg->n_handlers; i++) {
      const config_handler_t *h = &cfg->handlers[i];
      fleet_backfill_t *b = &f->backfills[f->n_backfills];

      if ((only_new && fleet_known (f, h->name)) || fleet_backfilling (f, h->name))
         continue;
      memset (b, 0, sizeof *b);

      if (fleet_declared_elsewhere (fs, f->owner, h->name)) {
         int64_t since, live_until = fleet_backfill_record (fs, f->owner, h->name, true, &since);
         int64_t gone_until = fleet_backfill_record (fs, f->owner, h->name, false, &since);

         if (live_until == 0 && gone_until == 0)
            continue;
         b->name = bson_strdup (h->name);
         b->until = live_until > 0 ? live_until : gone_until;
         b->hold_only = true;
         f->n_backfills++;
         if (live_until > 0)
            log_info ("dispatch: handler %s is being backfilled by another proxy: its deliveries wait %" PRId64 " ms",
                      h->name,
                      live_until > now ? live_until - now : 0);
         /* A record of a declarer that is gone: carried on at the first
          * pass (fleet_run_backfills). */
         continue;
      }
      if (others == 0)
         continue;
      if (reach < 0)
         reach = fleet_live_ms (cfg) + fleet_txn_lifetime (f, cfg);
      b->name = bson_strdup (h->name);
      store_backfill_init (&b->bf, now - reach, now + reach, reach);
      b->until = now + reach;
      f->n_backfills++;
      log_info ("dispatch: handler %s is new to the fleet: backfilling its events for %" PRId64 " ms", h->name, 2 * reach);
   }
}

/* A held handler's backfill: whether it is still someone else's.  A live
 * declarer that records it keeps it (until its record's end plus a
 * liveness bound: its last pass runs at or after the end, and its next
 * heartbeat drops the record).  A record that remains past that, or one
 * only declarers that are gone left, is carried on here: this instance
 * backfills the recorded window itself, from its start (whatever the
 * predecessor's last pass reached), and records it as its own.  True
 * while it stays held only; *release when nobody records it any more. */
static bool
fleet_carry_on (dispatch_fleet_t *f, const config_t *cfg, fleet_backfill_t *b, int64_t now, bool *release)
{
   int64_t live_since, gone_since, since, until, reach;
   int64_t live_until = fleet_backfill_record (f->fleet, f->owner, b->name, true, &live_since);
   int64_t gone_until = fleet_backfill_record (f->fleet, f->owner, b->name, false, &gone_since);

   *release = false;
   if (live_until > 0 && now < live_until + fleet_live_ms (cfg)) {
      b->until = live_until;
      return true;
   }
   if (live_until == 0 && gone_until == 0) {
      *release = true;
      return false;
   }
   until = live_until > gone_until ? live_until : gone_until;
   since = live_until > gone_until ? live_since : gone_since;
   reach = fleet_live_ms (cfg) + fleet_txn_lifetime (f, cfg);
   if (since <= 0 || since > until)
      since = until - 2 * reach; /* a record without its start: the window as this instance would make it */
   store_backfill_init (&b->bf, since, until, reach);
   b->until = until;
   b->hold_only = false;
   log_info ("dispatch: handler %s: the backfill a proxy that is gone recorded (until %" PRId64 " ms from now) is carried on here",
             b->name,
             until - now);
   return false;
}

/* One pass of every backfill in progress; true when one ended (its
 * handler may be claimed now). */
static bool
fleet_run_backfills (dispatch_fleet_t *f, const config_t *cfg, int64_t now)
{
   bool released = false;

   for (size_t i = 0; i < f->n_backfills;) {
      fleet_backfill_t *b = &f->backfills[i];
      const config_handler_t *h = NULL;
      bson_error_t err;
      size_t added = 0;
      bool release = false;

      for (size_t k = 0; k < cfg->n_handlers; k++)
         if (!strcmp (cfg->handlers[k].name, b->name))
            h = &cfg->handlers[k];
      if (!h) {
         backfill_remove (f, i);
         continue;
      }
      if (b->hold_only && fleet_carry_on (f, cfg, b, now, &release)) {
         i++;
         continue;
      }
      if (release) {
         released = true;
         backfill_remove (f, i);
         continue;
      }
      if (!store_fleet_backfill (f->store, h->name, (const char *const *) h->event_patterns, h->n_event_patterns, &b->bf, now, &added, &err)) {
         log_warn ("dispatch: backfilling handler %s (retried at the next heartbeat): %s", h->name, err.message);
         i++;
         continue;
      }
      b->added += added;
      if (!b->bf.done) {
         i++;
         continue;
      }
      log_info ("dispatch: handler %s: backfill done, %zu deliveries added for events published without it (%zu sweeps, %zu events read)",
                h->name,
                b->added,
                b->bf.sweeps,
                b->bf.read);
      released = true;
      backfill_remove (f, i);
   }
   return released;
}

static bool
fleet_recorded (const dispatch_fleet_t *f, const char *name)
{
   for (size_t i = 0; i < f->n_recorded; i++)
      if (!strcmp (f->recorded[i], name))
         return true;
   return false;
}

/* Records, once per process and name, that this fleet declares the local
 * handlers and those of its set (the kept instances', older versions'
 * included): the records retirement goes by, which outlive the instance
 * documents.  One bulk write when there is a name new to this process. */
static void
fleet_record_declared (dispatch_fleet_t *f, const config_t *cfg, const fleet_set_t *fs)
{
   const char **names = bson_malloc0 ((cfg->n_handlers + fs->n_set + 1) * sizeof *names);
   size_t n = 0;
   bson_error_t err;

   for (size_t i = 0; i < cfg->n_handlers + fs->n_set; i++) {
      const char *name = i < cfg->n_handlers ? cfg->handlers[i].name : fs->set[i - cfg->n_handlers]->name;
      bool dup = fleet_recorded (f, name);

      for (size_t k = 0; !dup && k < n; k++)
         dup = !strcmp (names[k], name);
      if (!dup)
         names[n++] = name;
   }
   if (n > 0 && store_fleet_record_declared (f->store, names, n, &err)) {
      f->recorded = bson_realloc (f->recorded, (f->n_recorded + n) * sizeof *f->recorded);
      for (size_t i = 0; i < n; i++)
         f->recorded[f->n_recorded++] = bson_strdup (names[i]);
   } else if (n > 0) {
      log_warn ("dispatch: recording the fleet's declared handlers (retried every heartbeat): %s", err.message);
   }
   bson_free (names);
}

/* Retirement, under the retirement lease: the pending deliveries of every
 * handler that has left the fleet's set (no instance declared it for
 * handler_retire_after, counted from this instance's start when no
 * document names it any more), become dead letters, in batches. */
static void
fleet_retire (dispatch_fleet_t *f, const config_t *cfg, const fleet_set_t *fs, int64_t now)
{
   char **names = NULL;
   bool *declared = NULL;
   size_t n = 0, n_checked = 0;
   bool leased = false;
   bson_error_t err;
   int64_t after = cfg->handler_retire_after_ms;

   if (!store_fleet_lease (f->store, now, cfg->lease_ms, &leased, &err)) {
      log_warn ("dispatch: handler retirement: %s", err.message);
      return;
   }
   if (!leased)
      return;
   if (!fleet_old_version_live (fs)) {
      size_t lanes = 0, charged = 0;

      /* What a proxy before 0.2.0 left in the fixed spaces, once none runs
       * (one find while there is nothing; rare writes otherwise). */
      if (!store_fleet_release_old_lanes (f->store, now, &lanes, &charged, &err))
         log_warn ("dispatch: releasing the lanes a proxy before 0.2.0 left: %s", err.message);
      else if (lanes > 0)
         log_warn ("dispatch: %zu lane(s) a proxy before 0.2.0 left listing deliveries released, %zu lost attempt(s) charged",
                   lanes,
                   charged);
   }
   if (!store_fleet_pending_handlers (f->store, &names, &n, CONFIG_MAX_HANDLERS * 4, &err)) {
      log_warn ("dispatch: handler retirement: %s", err.message);
      return;
   }
   /* Only what a proxy of this fleet declared: a handler another program
    * names in the same outbox is not this fleet's to bury. */
   declared = bson_malloc0 ((n ? n : 1) * sizeof *declared);
   if (!store_fleet_declared (f->store, names, n, declared, &err)) {
      log_warn ("dispatch: handler retirement: %s", err.message);
      n_checked = 0;
   } else {
      n_checked = n;
   }
   for (size_t i = 0; i < n_checked; i++) {
      int64_t last = fleet_last_declared (fs, names[i]);
      int64_t since = last > 0 ? last : f->started_ms;
      char reason[300];
      size_t total = 0;
      bool more = true;

      log_debug ("dispatch: retirement: %s has pending deliveries, last declared %" PRId64 " ms ago", names[i], now - since);
      if (!declared[i]) {
         log_debug ("dispatch: retirement: no proxy of this fleet ever declared %s: its deliveries are not this fleet's", names[i]);
         continue;
      }
      if (local_handler (cfg, names[i]) || fleet_declared_elsewhere (fs, f->owner, names[i]) || now - since < after)
         continue;
      bson_snprintf (reason, sizeof reason, "handler %.200s retired: no live proxy declares it", names[i]);
      /* At most 20 batches per handler and pass: the next pass goes on. */
      for (int b = 0; more && b < 20; b++) {
         size_t buried = 0;

         if (!store_fleet_retire (f->store, names[i], reason, now, 500, &buried, &more, &err)) {
            log_warn ("dispatch: retiring handler %s: %s", names[i], err.message);
            break;
         }
         total += buried;
      }
      if (total > 0) {
         counters_add (COUNTER_RETIRED_DELIVERIES, total);
         log_warn ("dispatch: handler %s retired (no live proxy declared it for %" PRId64 " ms): %zu pending deliveries moved to the dead letters",
                   names[i],
                   now - since,
                   total);
      }
   }
   for (size_t i = 0; i < n; i++)
      bson_free (names[i]);
   bson_free (names);
   bson_free (declared);
   /* Documents of instances silent for longer than the grace period have
    * said all they can. */
   if (!store_fleet_forget (f->store, now - after - fleet_live_ms (cfg), &err))
      log_warn ("dispatch: handler retirement: %s", err.message);
}

bool
dispatch_fleet_beat (dispatch_fleet_t *f, const config_t *cfg, int64_t now, bool *released)
{
   bson_t fields = BSON_INITIALIZER;
   bson_t **docs = bson_malloc0 (FLEET_MAX_DOCS * sizeof *docs);
   size_t n = 0;
   bson_error_t err;
   fleet_set_t *fs;
   int64_t retire_every, local_now = now;
   int64_t *until = NULL, *since = NULL;
   bool ok, again = false;

   *released = false;
   BSON_APPEND_DATE_TIME (&fields, "startedAt", f->announced ? f->started_ms : now);
   /* Which version runs here: the fleet's 0.1.0 instances (documents
    * without it) still claim in the fixed lane spaces. */
   BSON_APPEND_UTF8 (&fields, "version", PACKAGE_VERSION);
   if (f->n_backfills > 0) {
      /* Other instances starting meanwhile hold their claims of these, and
       * carry the backfill on should this instance go. */
      until = bson_malloc0 ((cfg->n_handlers ? cfg->n_handlers : 1) * sizeof *until);
      since = bson_malloc0 ((cfg->n_handlers ? cfg->n_handlers : 1) * sizeof *since);
      for (size_t i = 0; i < cfg->n_handlers; i++)
         for (size_t b = 0; b < f->n_backfills; b++)
            if (!f->backfills[b].hold_only && !strcmp (f->backfills[b].name, cfg->handlers[i].name)) {
               until[i] = f->backfills[b].bf.until;
               since[i] = f->backfills[b].bf.since;
            }
   }
   ok = fleet_append_handlers (cfg, since, until, &fields, "handlers");
   bson_free (until);
   bson_free (since);
   if (!ok || !store_fleet_announce (f->store, &fields, &err) ||
       !store_fleet_read (f->store, docs, FLEET_MAX_INSTANCES, FLEET_MAX_DOCS, &n, &err)) {
      if (!f->failing)
         log_warn ("dispatch: recording or reading the fleet's handlers failed (retried every heartbeat): %s",
                   ok ? err.message : "the handlers do not fit in one document");
      f->failing = true;
      fleet_note_failed ();
      goto done;
   }
   if (f->failing)
      log_info ("dispatch: the fleet's handlers are recorded and read again");
   f->failing = false;
   /* The server's clock from here on: our heartbeat, just written. */
   now = fleet_docs_heartbeat ((const bson_t *const *) docs, n, f->owner, now);
   if (!f->announced)
      f->started_ms = now;
   fs = fleet_set_from_docs ((const bson_t *const *) docs, n, now, fleet_live_ms (cfg), cfg->handler_retire_after_ms);
   log_debug ("dispatch: fleet read: %zu instance(s), %zu handler(s) in the set, the server's clock %+" PRId64 " ms from ours",
              fs->n_instances,
              fs->n_set,
              now - local_now);
   {
      size_t before = f->n_backfills;
      fleet_start_backfills (f, cfg, fs, now, f->announced);
      f->announced = true;
      fleet_remember (f, cfg);
      /* Record the backfills' ends at once, not a heartbeat later. */
      again = f->n_backfills > before;
   }
   if (fs->n_disagreeing != f->disagreeing && fs->n_disagreeing > 0)
      log_warn ("dispatch: live proxies declare %zu handler(s) differently, %s first (see GET /api/handlers)",
                fs->n_disagreeing,
                fs->disagreeing[0]);
   f->disagreeing = fs->n_disagreeing;
   /* An enabled handler is claimable now, not at the next poll. */
   if (fleet_read_disabled (f))
      *released = true;
   fleet_record_declared (f, cfg, fs);
   fleet_publish (fleet_retain (fs));
   fleet_release (f->fleet);
   f->fleet = fs;
   if (f->n_backfills > 0 && fleet_run_backfills (f, cfg, now))
      *released = true;
   retire_every = cfg->handler_retire_after_ms / 10;
   if (retire_every > 60000)
      retire_every = 60000;
   if (now - f->retire_checked_ms >= retire_every) {
      f->retire_checked_ms = now;
      fleet_retire (f, cfg, fs, now);
   }

done:
   for (size_t i = 0; i < n; i++)
      bson_destroy (docs[i]);
   bson_free (docs);
   bson_destroy (&fields);
   return again;
}
