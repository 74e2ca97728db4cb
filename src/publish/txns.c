/*
 * publish/txns.c - the transactions injected into and the poisoned ones
 * (see publish/txns.h for what each is for, publish/poison.h for the
 * table itself).
 *
 * What this file decides: the key each table uses, when the poisoned table
 * is created and with what capacity, how a poisoning is worded in the log
 * and in the refused commit's error, and which abort reply ends a
 * poisoning.  What it does not: any I/O or any answer to a client; that is
 * publish/publish.c.
 */
#include "publish/txns.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/keyhash.h"
#include "publish/inject.h"

/* --- transactions injected into ---------------------------------------- */

#define TXN_LSID_MAX 64 /* {id: UUID} is 30 bytes */

typedef struct {
   bool used;
   uint32_t lsid_len;
   uint8_t lsid[TXN_LSID_MAX];
   int64_t txn_number;
} txn_slot_t;

/* Process-wide: a driver may send a transaction's statements and its
 * commit on different connections, which different forwarding loops own.
 * Under txn_mu, held only to compare or copy one slot; txn_used counts
 * the used slots, so that the commits of transactions never injected into
 * (most of them) take no lock while nothing is remembered. */
static txn_slot_t txn_slots[TXNS_SLOTS];
static pthread_mutex_t txn_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint txn_used;

/* The lsid document's bytes and the txnNumber of a command. */
static bool
txn_key (const bson_t *cmd, const uint8_t **lsid, uint32_t *lsid_len, int64_t *txn_number)
{
   bson_iter_t it;

   if (!bson_iter_init_find (&it, cmd, "lsid") || !BSON_ITER_HOLDS_DOCUMENT (&it))
      return false;
   bson_iter_document (&it, lsid_len, lsid);
   if (*lsid_len > TXN_LSID_MAX || !bson_iter_init_find (&it, cmd, "txnNumber") ||
       !(BSON_ITER_HOLDS_INT64 (&it) || BSON_ITER_HOLDS_INT32 (&it)))
      return false;
   *txn_number = bson_iter_as_int64 (&it);
   return true;
}

void
txns_key_copy (const bson_t *cmd, bson_t *out)
{
   static const char *const fields[] = {"lsid", "txnNumber"};

   inject_copy_fields (cmd, fields, sizeof fields / sizeof fields[0], out);
}

static txn_slot_t *
txn_slot (const uint8_t *lsid, uint32_t lsid_len, int64_t txn_number)
{
   /* The client's session id and number pick the slot: keyed, so a client
    * cannot aim its transactions at another's slot (base/keyhash.h). */
   uint64_t h = keyhash (lsid, lsid_len) ^ keyhash (&txn_number, sizeof txn_number);

   return &txn_slots[h % TXNS_SLOTS];
}

void
txns_remember (const bson_t *cmd)
{
   const uint8_t *lsid;
   uint32_t len;
   int64_t n;
   txn_slot_t *s;

   if (!txn_key (cmd, &lsid, &len, &n))
      return;
   s = txn_slot (lsid, len, n);
   pthread_mutex_lock (&txn_mu);
   if (!s->used)
      atomic_fetch_add (&txn_used, 1);
   s->used = true;
   s->lsid_len = len;
   memcpy (s->lsid, lsid, len);
   s->txn_number = n;
   pthread_mutex_unlock (&txn_mu);
}

bool
txns_injected (const bson_t *cmd, bool forget)
{
   const uint8_t *lsid;
   uint32_t len;
   int64_t n;
   txn_slot_t *s;
   bool found;

   if (atomic_load_explicit (&txn_used, memory_order_relaxed) == 0 || !txn_key (cmd, &lsid, &len, &n))
      return false;
   s = txn_slot (lsid, len, n);
   pthread_mutex_lock (&txn_mu);
   found = s->used && s->txn_number == n && s->lsid_len == len && memcmp (s->lsid, lsid, len) == 0;
   if (found && forget) {
      s->used = false;
      atomic_fetch_sub (&txn_used, 1);
   }
   pthread_mutex_unlock (&txn_mu);
   return found;
}

/* --- poisoned transactions ---------------------------------------------- */

/* Created at the first reservation, never freed (it is reachable until
 * exit).  NULL means empty. */
static _Atomic (poison_table_t *) poison_tab;

/* The table, created by whichever loop thread reserves first, with
 * `capacity` (the other threads' values are ignored). */
static poison_table_t *
poison_table_get (uint32_t capacity)
{
   poison_table_t *t = atomic_load_explicit (&poison_tab, memory_order_acquire);
   poison_table_t *expected = NULL;

   if (t)
      return t;
   t = poison_table_new (capacity, TXNS_POISON_TTL_MS);
   if (!atomic_compare_exchange_strong (&poison_tab, &expected, t)) {
      poison_table_destroy (t);
      t = expected;
   }
   return t;
}

/* The table once a reservation made it; the functions that need it exist
 * only for operations that hold or held one. */
static poison_table_t *
poison_table_made (void)
{
   poison_table_t *t = atomic_load_explicit (&poison_tab, memory_order_acquire);

   RELAYBUS_ASSERT (t != NULL);
   return t;
}

bool
txns_poison_reserve (const config_t *cfg, uint32_t *capacity)
{
   poison_table_t *t = poison_table_get ((uint32_t) cfg->max_poisoned_transactions);

   if (poison_table_reserve (t, clock_mono_ms ()))
      return true;
   *capacity = poison_table_capacity (t);
   return false;
}

void
txns_poison_unreserve (void)
{
   poison_table_unreserve (poison_table_made ());
}

void
txns_lsid_hex (const poison_key_t *key, char out[TXNS_LSID_HEX_MAX])
{
   static const char digits[] = "0123456789abcdef";
   uint32_t n = key->id_len < 16 ? key->id_len : 16;

   for (uint32_t i = 0; i < n; i++) {
      out[2 * i] = digits[key->id[i] >> 4];
      out[2 * i + 1] = digits[key->id[i] & 15];
   }
   out[2 * n] = '\0';
}

/* A truncated string may end inside a UTF-8 sequence; errmsg must be valid
 * UTF-8 (drivers validate it), so cut back to the last whole character. */
static void
utf8_trim (char *s)
{
   size_t len = strlen (s);

   while (len > 0 && !bson_utf8_validate (s, len, false))
      s[--len] = '\0';
}

bool
txns_poison (const bson_t *txn_cmd, bool *reserved, uint64_t conn_id, const char *peer, log_level_t level, const char *fmt, ...)
{
   poison_key_t key;
   char reason[POISON_REASON_MAX], hex[TXNS_LSID_HEX_MAX];
   bool held = *reserved;
   va_list ap;

   va_start (ap, fmt);
   vsnprintf (reason, sizeof reason, fmt, ap);
   va_end (ap);
   utf8_trim (reason);
   if (!poison_key_of (txn_cmd, &key)) {
      /* No binary lsid.id: not a session the server would run a
       * transaction for, so there is nothing to commit. */
      log_conn (LOG_LEVEL_WARN, conn_id, peer, "cannot poison a transaction without a session id: %s", reason);
      return false;
   }
   txns_lsid_hex (&key, hex);
   /* The operation reserved its slot before it started: the entry always
    * fits, and no live entry is pushed out for it. */
   *reserved = false;
   switch (poison_table_add (poison_table_made (), &key, conn_id, reason, clock_mono_ms (), held)) {
   case POISON_KNOWN:
      log_conn (level, conn_id, peer, "transaction %" PRId64 " of session %s was already poisoned; now also: %s",
                key.txn_number, hex, reason);
      return false;
   case POISON_FULL:
      /* Only without a reservation, which no operation lacks: a bug. */
      log_conn (LOG_LEVEL_ERROR, conn_id, peer,
                "transaction %" PRId64 " (session %s) could not be recorded as poisoned, the table is full: %s",
                key.txn_number, hex, reason);
      return false;
   default:
      break;
   }
   log_conn (level, conn_id, peer,
             "transaction %" PRId64 " poisoned: %s; a commit of it through this proxy will be refused (session %s)",
             key.txn_number, reason, hex);
   return true;
}

bool
txns_poisoned (const bson_t *cmd, poison_entry_t *out)
{
   poison_table_t *t = atomic_load_explicit (&poison_tab, memory_order_acquire);
   poison_key_t key;

   if (!t || poison_table_count (t) == 0 || !poison_key_of (cmd, &key))
      return false;
   return poison_table_lookup (t, &key, clock_mono_ms (), out);
}

bool
txns_poison_forget (const poison_key_t *key)
{
   return poison_table_remove (poison_table_made (), key);
}

bool
txns_abort_confirmed (const bson_t *reply)
{
   const char *errmsg;

   return !inject_reply_failed (reply) || inject_reply_error (reply, &errmsg) == INJECT_CODE_NO_SUCH_TRANSACTION;
}

uint32_t
txns_poison_entries (void)
{
   poison_table_t *t = atomic_load_explicit (&poison_tab, memory_order_acquire);

   return t ? poison_table_count (t) : 0;
}
