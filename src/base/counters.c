/*
 * base/counters.c - the slots of the counter registry, its declarations in
 * table order, and the label values (include/base/counters.h).
 *
 * Fixed labels (close reasons, publishing error kinds, command names) are
 * name tables.  Handlers and event types are name sets filled at run time:
 * looked up without a lock (entries below the published count are
 * complete), added under a mutex, at most their bound times per process.
 */
#include "base/counters.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "autoconf.h"

_Atomic uint64_t counters_slots[COUNTERS_N_SLOTS] = {[COUNTER_BUILD_INFO] = 1};

const int64_t counters_bucket_ms[COUNTERS_N_BUCKETS] = {1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000};
/* From what a loop adds to a cached request (tens of µs) to what a pool
 * wait or a full loop adds (up to a second). */
const int64_t counters_bucket_us[COUNTERS_N_BUCKETS_US] = {25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 100000, 1000000};

static const counters_def_t defs[] = {
#define COUNTERS_X_DEF(id, name, type, label, help) \
   {COUNTER_##id, name, help, COUNTERS_TYPE_##type, COUNTERS_LABEL_##label},
   COUNTERS_TABLE (COUNTERS_X_DEF)
#undef COUNTERS_X_DEF
};

const counters_def_t *
counters_defs (size_t *n)
{
   *n = sizeof defs / sizeof defs[0];
   return defs;
}

/* ------------------------------------------------------- fixed labels */

static const char *const label_keys[COUNTERS_LABEL_COUNT] = {
#define COUNTERS_L_KEY(label, key, slots) [COUNTERS_LABEL_##label] = key,
   COUNTERS_LABELS (COUNTERS_L_KEY)
#undef COUNTERS_L_KEY
};

static const char *const close_reason_names[COUNTERS_CLOSE_REASON_COUNT] = {
   [COUNTERS_CLOSE_CLIENT_EOF] = "client_eof",
   [COUNTERS_CLOSE_CLIENT_ERROR] = "client_error",
   [COUNTERS_CLOSE_CLIENT_PROTOCOL] = "client_protocol",
   [COUNTERS_CLOSE_UPSTREAM_EOF] = "upstream_eof",
   [COUNTERS_CLOSE_UPSTREAM_ERROR] = "upstream_error",
   [COUNTERS_CLOSE_UPSTREAM_PROTOCOL] = "upstream_protocol",
   [COUNTERS_CLOSE_UPSTREAM_CONNECT] = "upstream_connect",
   [COUNTERS_CLOSE_NO_PRIMARY] = "no_primary",
   [COUNTERS_CLOSE_NOT_PRIMARY] = "not_primary",
   [COUNTERS_CLOSE_HANDSHAKE_TIMEOUT] = "handshake_timeout",
   [COUNTERS_CLOSE_LOGIN_TIMEOUT] = "login_timeout",
   [COUNTERS_CLOSE_MESSAGE_TIMEOUT] = "message_timeout",
   [COUNTERS_CLOSE_MAX_CLIENTS] = "max_clients",
   [COUNTERS_CLOSE_SHUTDOWN] = "shutdown",
   [COUNTERS_CLOSE_SHUTDOWN_TIMEOUT] = "shutdown_timeout",
   [COUNTERS_CLOSE_INTERNAL] = "internal",
   [COUNTERS_CLOSE_OPERATOR] = "operator",
   [COUNTERS_CLOSE_RECONNECT] = "reconnect",
};

static const char *const pin_names[COUNTERS_PIN_COUNT] = {
   [COUNTERS_PIN_TRANSACTION] = "transaction",
   [COUNTERS_PIN_EXHAUST] = "exhaust",
   [COUNTERS_PIN_MORE_TO_COME] = "more_to_come",
};

static const char *const state_names[COUNTERS_STATE_COUNT] = {
   [COUNTERS_STATE_GONE] = "410",
   [COUNTERS_STATE_FAILING] = "failing",
   [COUNTERS_STATE_OPERATOR] = "operator",
   [COUNTERS_STATE_ENABLED] = "enabled",
};

static const char *const login_names[COUNTERS_LOGIN_COUNT] = {
   [COUNTERS_LOGIN_SUCCESS] = "success",
   [COUNTERS_LOGIN_FAILURE] = "failure",
   [COUNTERS_LOGIN_THROTTLED] = "throttled",
};

static const char *const publish_error_names[COUNTERS_PUBLISH_ERROR_COUNT] = {
   [COUNTERS_PUBLISH_BAD_ANNOTATION] = "bad_annotation",
   [COUNTERS_PUBLISH_OUTSIDE_TRANSACTION] = "outside_transaction",
   [COUNTERS_PUBLISH_OUTBOX_WRITE] = "outbox_write",
   [COUNTERS_PUBLISH_CONNECTION_LOST] = "connection_lost",
};

/* Sorted (strcmp) for bsearch; slot COUNTERS_N_COMMANDS is "other". */
static const char *const command_names[] = {
   "abortTransaction", "aggregate",         "authenticate",       "buildInfo",        "collMod",
   "collStats",        "commitTransaction", "configureFailPoint", "connectionStatus", "count",
   "create",           "createIndexes",     "dbStats",            "delete",           "distinct",
   "drop",             "dropDatabase",      "dropIndexes",        "endSessions",      "explain",
   "find",             "findAndModify",     "getMore",            "getParameter",     "hostInfo",
   "insert",           "killCursors",       "killSessions",       "listCollections",  "listDatabases",
   "listIndexes",      "logout",            "ping",               "refreshSessions",  "relaybusClaim",
   "relaybusComplete", "relaybusPublish",   "relaybusStatus",     "renameCollection", "saslContinue",
   "saslStart",        "serverStatus",      "startSession",       "update",
};
_Static_assert (sizeof command_names / sizeof command_names[0] == COUNTERS_N_COMMANDS, "COUNTERS_N_COMMANDS");

const char *
counters_close_reason_name (counters_close_reason_t reason)
{
   if ((unsigned) reason >= COUNTERS_CLOSE_REASON_COUNT)
      return "unknown";
   return close_reason_names[reason];
}

void
counters_count_close (counters_close_reason_t reason)
{
   if ((unsigned) reason >= COUNTERS_CLOSE_REASON_COUNT)
      reason = COUNTERS_CLOSE_INTERNAL;
   counters_add_at (COUNTER_CONNECTIONS_CLOSED, (size_t) reason, 1);
}

static int
name_cmp (const void *key, const void *elem)
{
   return strcmp ((const char *) key, *(const char *const *) elem);
}

/* Connections mostly repeat a command: each thread remembers the last name
 * it found (a pointer into command_names), so the usual lookup is one
 * strcmp instead of a bsearch's five or six. */
static _Thread_local const char *last_command;
static _Thread_local size_t last_command_slot;

void
counters_count_command (const char *cmd)
{
   const char *const *hit;
   size_t slot = COUNTERS_N_COMMANDS;

   if (cmd && last_command && !strcmp (cmd, last_command)) {
      slot = last_command_slot;
   } else if (cmd) {
      hit = bsearch (cmd, command_names, COUNTERS_N_COMMANDS, sizeof command_names[0], name_cmp);
      if (hit) {
         slot = (size_t) (hit - command_names);
         last_command = *hit;
         last_command_slot = slot;
      }
   }
   counters_add_at (COUNTER_COMMANDS, slot, 1);
}

/* --------------------------------------------------------- name sets */

#define NAME_MAX_LEN 128

/* Names that get a slot on first use, in the order first seen. */
typedef struct {
   pthread_mutex_t mu; /* adding only */
   _Atomic size_t n;   /* names below are complete (release/acquire) */
   size_t cap;
   char (*names)[NAME_MAX_LEN];
} name_set_t;

static char handler_names[COUNTERS_MAX_HANDLERS][NAME_MAX_LEN];
static name_set_t handlers = {PTHREAD_MUTEX_INITIALIZER, 0, COUNTERS_MAX_HANDLERS, handler_names};
static char event_type_names[COUNTERS_MAX_EVENT_TYPES][NAME_MAX_LEN];
static name_set_t event_types = {PTHREAD_MUTEX_INITIALIZER, 0, COUNTERS_MAX_EVENT_TYPES, event_type_names};

static size_t
name_set_find (name_set_t *s, size_t n, const char *name)
{
   for (size_t i = 0; i < n; i++)
      if (!strcmp (s->names[i], name))
         return i;
   return SIZE_MAX;
}

/* The slot of `name` in `s`, added when `add` and there is room; SIZE_MAX
 * otherwise. */
static size_t
name_set_slot (name_set_t *s, const char *name, bool add)
{
   size_t n = atomic_load_explicit (&s->n, memory_order_acquire);
   size_t i = name_set_find (s, n, name);

   if (i != SIZE_MAX || !add || n == s->cap || strlen (name) >= NAME_MAX_LEN)
      return i;
   pthread_mutex_lock (&s->mu);
   n = atomic_load_explicit (&s->n, memory_order_acquire);
   i = name_set_find (s, n, name);
   if (i == SIZE_MAX && n < s->cap) {
      memcpy (s->names[n], name, strlen (name) + 1);
      atomic_store_explicit (&s->n, n + 1, memory_order_release);
      i = n;
   }
   pthread_mutex_unlock (&s->mu);
   RELAYBUS_ASSERT (i == SIZE_MAX || i < s->cap);
   return i;
}

size_t
counters_handler_slot (const char *name, bool add)
{
   return name ? name_set_slot (&handlers, name, add) : SIZE_MAX;
}

/* --------------------------------------------------------- histograms */

void
counters_observe (counter_id_t id, size_t slot, int64_t ms)
{
   size_t base = (size_t) id + slot * COUNTERS_WIDTH_HISTOGRAM;
   size_t b = 0;

   RELAYBUS_ASSERT (base + COUNTERS_WIDTH_HISTOGRAM <= COUNTERS_N_SLOTS);
   if (ms < 0)
      ms = 0;
   while (b < COUNTERS_N_BUCKETS && ms > counters_bucket_ms[b])
      b++;
   atomic_fetch_add_explicit (&counters_slots[base + b], 1, memory_order_relaxed);
   atomic_fetch_add_explicit (&counters_slots[base + COUNTERS_HISTOGRAM_SUM], (uint64_t) ms, memory_order_relaxed);
}

void
counters_histogram (counter_id_t id, size_t slot, counters_histogram_t *out)
{
   size_t base = (size_t) id + slot * COUNTERS_WIDTH_HISTOGRAM;

   RELAYBUS_ASSERT (base + COUNTERS_WIDTH_HISTOGRAM <= COUNTERS_N_SLOTS);
   out->count = 0;
   for (size_t b = 0; b <= COUNTERS_N_BUCKETS; b++) {
      out->buckets[b] = atomic_load_explicit (&counters_slots[base + b], memory_order_relaxed);
      out->count += out->buckets[b];
   }
   out->sum_ms = atomic_load_explicit (&counters_slots[base + COUNTERS_HISTOGRAM_SUM], memory_order_relaxed);
}

void
counters_loop_histogram (counter_id_t id, counters_loop_histogram_t *out)
{
   memset (out, 0, sizeof *out);
   for (size_t loop = 0; loop < COUNTERS_LOOPS_MAX; loop++) {
      size_t base = (size_t) id + loop * COUNTERS_WIDTH_LOOP_HISTOGRAM;

      RELAYBUS_ASSERT (base + COUNTERS_WIDTH_LOOP_HISTOGRAM <= COUNTERS_N_SLOTS);
      for (size_t b = 0; b <= COUNTERS_N_BUCKETS_US; b++) {
         uint64_t n = atomic_load_explicit (&counters_slots[base + b], memory_order_relaxed);
         out->buckets[b] += n;
         out->count += n;
      }
      out->sum_us += atomic_load_explicit (&counters_slots[base + COUNTERS_LOOP_HISTOGRAM_SUM], memory_order_relaxed);
   }
}

void
counters_delivery (const char *handler, counter_id_t outcome, int64_t latency_ms)
{
   size_t slot = counters_handler_slot (handler, true);

   RELAYBUS_ASSERT (outcome == COUNTER_DELIVERIES_COMPLETED || outcome == COUNTER_DELIVERIES_RETRIED ||
                    outcome == COUNTER_DELIVERIES_DEAD);
   if (slot == SIZE_MAX)
      return;
   counters_add_at (outcome, slot, 1);
   counters_observe (COUNTER_HANDLER_LATENCY, slot, latency_ms);
}

void
counters_attempt (const char *handler, outbox_attempt_outcome_t outcome, int64_t ms)
{
   size_t slot = counters_handler_slot (handler, true);

   if (slot == SIZE_MAX || (unsigned) outcome >= OUTBOX_ATTEMPT_OUTCOMES)
      return;
   counters_observe (COUNTER_ATTEMPT_DURATION, slot * OUTBOX_ATTEMPT_OUTCOMES + (size_t) outcome, ms);
}

void
counters_unrouted (const char *type)
{
   size_t slot = COUNTERS_MAX_EVENT_TYPES; /* COUNTERS_EVENT_TYPE_OTHER */

   if (type && strcmp (type, COUNTERS_EVENT_TYPE_OTHER) != 0) {
      size_t i = name_set_slot (&event_types, type, true);

      if (i != SIZE_MAX)
         slot = i;
   }
   counters_add_at (COUNTER_EVENTS_UNROUTED, slot, 1);
}

/* ------------------------------------------------------------ reading */

const char *
counters_label_key (counters_label_t label)
{
   return (unsigned) label < COUNTERS_LABEL_COUNT ? label_keys[label] : NULL;
}

const char *
counters_label_key2 (counters_label_t label)
{
   return label == COUNTERS_LABEL_HANDLER_OUTCOME ? "outcome" : NULL;
}

const char *
counters_label_value2 (counters_label_t label, size_t i)
{
   return label == COUNTERS_LABEL_HANDLER_OUTCOME ? outbox_attempt_outcome_name ((outbox_attempt_outcome_t) (i % OUTBOX_ATTEMPT_OUTCOMES))
                                                  : NULL;
}

const char *
counters_label_value (counters_label_t label, size_t i, size_t *slot, bool *omit_if_zero)
{
   size_t n;

   *slot = i;
   *omit_if_zero = false;
   switch (label) {
   case COUNTERS_LABEL_NONE:
      return NULL;
   case COUNTERS_LABEL_BUILD:
      return i == 0 ? PACKAGE_VERSION : NULL;
   case COUNTERS_LABEL_REASON:
      return i < COUNTERS_CLOSE_REASON_COUNT ? close_reason_names[i] : NULL;
   case COUNTERS_LABEL_COMMAND:
      if (i < COUNTERS_N_COMMANDS)
         return command_names[i];
      return i == COUNTERS_N_COMMANDS ? "other" : NULL;
   case COUNTERS_LABEL_KIND:
      return i < COUNTERS_PUBLISH_ERROR_COUNT ? publish_error_names[i] : NULL;
   case COUNTERS_LABEL_PIN:
      return i < COUNTERS_PIN_COUNT ? pin_names[i] : NULL;
   case COUNTERS_LABEL_LOGIN:
      return i < COUNTERS_LOGIN_COUNT ? login_names[i] : NULL;
   case COUNTERS_LABEL_STATE:
      return i < COUNTERS_STATE_COUNT ? state_names[i] : NULL;
   case COUNTERS_LABEL_HANDLER:
      n = atomic_load_explicit (&handlers.n, memory_order_acquire);
      return i < n ? handlers.names[i] : NULL;
   case COUNTERS_LABEL_HANDLER_OUTCOME:
      /* Each handler's outcomes in turn; only the samples that have
       * observations are rendered. */
      n = atomic_load_explicit (&handlers.n, memory_order_acquire);
      *omit_if_zero = true;
      return i / OUTBOX_ATTEMPT_OUTCOMES < n ? handlers.names[i / OUTBOX_ATTEMPT_OUTCOMES] : NULL;
   case COUNTERS_LABEL_TYPE:
      n = atomic_load_explicit (&event_types.n, memory_order_acquire);
      if (i < n)
         return event_types.names[i];
      if (i > n)
         return NULL;
      *slot = COUNTERS_MAX_EVENT_TYPES;
      *omit_if_zero = true;
      return COUNTERS_EVENT_TYPE_OTHER;
   case COUNTERS_LABEL_LOOP:
      /* Merged at rendering (counters_loop_histogram), never a label. */
      return NULL;
   case COUNTERS_LABEL_COUNT:
   default:
      break;
   }
   return NULL;
}
