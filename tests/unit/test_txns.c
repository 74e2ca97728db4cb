/*
 * test_txns.c - the transactions the publishing path remembers: the
 * injected-into slots (remember, find, forget, what a key is made of) and
 * the poison policy over the process-wide table (reserve, poison, refuse a
 * commit, forget after a confirmed abort, the bound).
 *
 * The poisoned table is created once per process, with the capacity of the
 * first reservation, so the policy is one test that walks through it in
 * order.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "publish/txns.h"

/* A transaction statement of session `s` (its 16-byte id), number `n`. */
static bson_t *
stmt (uint8_t s, int64_t n)
{
   uint8_t uuid[16];

   for (int i = 0; i < 16; i++)
      uuid[i] = (uint8_t) (s + i);
   return BCON_NEW ("insert", "orders", "documents", "[", "{", "_id", BCON_INT32 (1), "}", "]", "lsid", "{", "id",
                    BCON_BIN (BSON_SUBTYPE_UUID, uuid, 16), "}", "txnNumber", BCON_INT64 (n), "autocommit",
                    BCON_BOOL (false), "$db", "shop");
}

/* commitTransaction of the same transaction, fields in another order. */
static bson_t *
commit_of (uint8_t s, int64_t n)
{
   uint8_t uuid[16];

   for (int i = 0; i < 16; i++)
      uuid[i] = (uint8_t) (s + i);
   return BCON_NEW ("commitTransaction", BCON_INT32 (1), "txnNumber", BCON_INT64 (n), "autocommit", BCON_BOOL (false),
                    "lsid", "{", "id", BCON_BIN (BSON_SUBTYPE_UUID, uuid, 16), "}", "$db", "admin");
}

static void
test_key_copy (void **state)
{
   bson_t *cmd = stmt (1, 7);
   bson_t key = BSON_INITIALIZER;
   bson_iter_t it;

   (void) state;
   txns_key_copy (cmd, &key);
   /* lsid and txnNumber, in that order, and nothing of the body. */
   assert_int_equal (bson_count_keys (&key), 2);
   assert_true (bson_iter_init (&it, &key) && bson_iter_next (&it));
   assert_string_equal (bson_iter_key (&it), "lsid");
   assert_true (bson_iter_next (&it));
   assert_string_equal (bson_iter_key (&it), "txnNumber");
   assert_int_equal (bson_iter_int64 (&it), 7);
   bson_destroy (&key);
   bson_destroy (cmd);

   /* A command without them copies nothing. */
   cmd = BCON_NEW ("ping", BCON_INT32 (1));
   bson_init (&key);
   txns_key_copy (cmd, &key);
   assert_true (bson_empty (&key));
   bson_destroy (&key);
   bson_destroy (cmd);
}

static void
test_injected (void **state)
{
   bson_t *a = stmt (10, 1), *a_commit = commit_of (10, 1), *a_next = commit_of (10, 2), *b = commit_of (11, 1);
   bson_t *bare = BCON_NEW ("commitTransaction", BCON_INT32 (1));
   bson_t key = BSON_INITIALIZER;

   (void) state;
   assert_false (txns_injected (a_commit, false));
   /* Remembered from the key copy an operation keeps; found from the commit. */
   txns_key_copy (a, &key);
   txns_remember (&key);
   assert_true (txns_injected (a_commit, false));
   assert_true (txns_injected (a, false));
   /* Another txnNumber of the session, another session: not this one. */
   assert_false (txns_injected (a_next, false));
   assert_false (txns_injected (b, false));
   /* Forgotten once (a commit or an abort), then no longer there. */
   assert_true (txns_injected (a_commit, true));
   assert_false (txns_injected (a_commit, false));
   /* Without lsid and txnNumber: never remembered, never found. */
   txns_remember (bare);
   assert_false (txns_injected (bare, false));
   bson_destroy (&key);
   bson_destroy (bare);
   bson_destroy (b);
   bson_destroy (a_next);
   bson_destroy (a_commit);
   bson_destroy (a);
}

static void
test_abort_confirmed (void **state)
{
   bson_t *ok = BCON_NEW ("ok", BCON_DOUBLE (1));
   bson_t *gone = BCON_NEW ("ok", BCON_DOUBLE (0), "code", BCON_INT32 (251), "codeName", "NoSuchTransaction");
   bson_t *conflict = BCON_NEW ("ok", BCON_DOUBLE (0), "code", BCON_INT32 (112), "codeName", "WriteConflict");

   (void) state;
   assert_true (txns_abort_confirmed (ok));
   assert_true (txns_abort_confirmed (gone));
   assert_false (txns_abort_confirmed (conflict));
   bson_destroy (conflict);
   bson_destroy (gone);
   bson_destroy (ok);
}

static void
test_lsid_hex (void **state)
{
   poison_key_t k;
   char hex[TXNS_LSID_HEX_MAX];

   (void) state;
   memset (&k, 0, sizeof k);
   k.id_len = 3;
   k.id[0] = 0x00;
   k.id[1] = 0xab;
   k.id[2] = 0x7f;
   txns_lsid_hex (&k, hex);
   assert_string_equal (hex, "00ab7f");
   /* At most 16 bytes of a longer id. */
   k.id_len = 20;
   txns_lsid_hex (&k, hex);
   assert_int_equal (strlen (hex), 32);
}

static void
test_poison_policy (void **state)
{
   config_t cfg;
   bson_t *s1 = stmt (20, 1), *c1 = commit_of (20, 1), *s2 = stmt (21, 1), *c2 = commit_of (21, 1);
   bson_t *s3 = stmt (22, 1);
   bson_t *no_session = BCON_NEW ("insert", "orders", "txnNumber", BCON_INT64 (1));
   bson_t k1 = BSON_INITIALIZER, k2 = BSON_INITIALIZER, k3 = BSON_INITIALIZER;
   poison_entry_t pe;
   poison_key_t key;
   uint32_t capacity = 0;
   bool r1 = false, r2 = false, r3 = false;

   (void) state;
   memset (&cfg, 0, sizeof cfg);
   cfg.max_poisoned_transactions = 2;
   txns_key_copy (s1, &k1);
   txns_key_copy (s2, &k2);
   txns_key_copy (s3, &k3);

   /* Nothing poisoned yet: no table, no entry, no refusal. */
   assert_int_equal (txns_poison_entries (), 0);
   assert_false (txns_poisoned (c1, &pe));

   /* Two reservations fit a table of two; a third is refused with the capacity. */
   r1 = txns_poison_reserve (&cfg, &capacity);
   r2 = txns_poison_reserve (&cfg, &capacity);
   assert_true (r1 && r2);
   assert_false (txns_poison_reserve (&cfg, &capacity));
   assert_int_equal (capacity, 2);

   /* A transaction without a session id cannot be poisoned, and the
    * reservation stays with the caller. */
   assert_false (txns_poison (no_session, &r2, 9, "peer", LOG_LEVEL_DEBUG, "%s", "lost"));
   assert_true (r2);

   /* Poisoned: the reservation is consumed, the commit is refused with the
    * entry (its connection and the reason). */
   assert_true (txns_poison (&k1, &r1, 7, "peer", LOG_LEVEL_DEBUG, "the connection was lost on c%d", 7));
   assert_false (r1);
   assert_int_equal (txns_poison_entries (), 1);
   assert_true (txns_poisoned (c1, &pe));
   assert_int_equal (pe.conn_id, 7);
   assert_int_equal (pe.key.txn_number, 1);
   assert_string_equal (pe.reason, "the connection was lost on c7");
   assert_false (txns_poisoned (c2, NULL));

   /* Poisoned again: known, the first reason is kept, nothing new counted. */
   assert_false (txns_poison (&k1, &r2, 8, "peer", LOG_LEVEL_DEBUG, "again"));
   assert_false (r2);
   assert_true (txns_poisoned (c1, &pe));
   assert_string_equal (pe.reason, "the connection was lost on c7");

   /* Full: one live entry and no reservation left means one free slot;
    * the second poisoning fits, and then nothing more is reserved. */
   r3 = txns_poison_reserve (&cfg, &capacity);
   assert_true (r3);
   assert_true (txns_poison (&k2, &r3, 9, "peer", LOG_LEVEL_DEBUG, "an outbox write failed"));
   assert_int_equal (txns_poison_entries (), 2);
   assert_false (txns_poison_reserve (&cfg, &capacity));

   /* Without a reservation, a full table records nothing (and says so). */
   assert_false (txns_poison (&k3, &r3, 9, "peer", LOG_LEVEL_DEBUG, "unreserved"));
   assert_int_equal (txns_poison_entries (), 2);

   /* A confirmed abort forgets the entry: its commit passes again, and the
    * slot is free for a reservation. */
   assert_true (poison_key_of (c2, &key));
   assert_true (txns_poison_forget (&key));
   assert_false (txns_poison_forget (&key));
   assert_false (txns_poisoned (c2, NULL));
   assert_int_equal (txns_poison_entries (), 1);
   r3 = txns_poison_reserve (&cfg, &capacity);
   assert_true (r3);
   txns_poison_unreserve ();
   assert_true (txns_poisoned (c1, NULL));

   bson_destroy (&k3);
   bson_destroy (&k2);
   bson_destroy (&k1);
   bson_destroy (no_session);
   bson_destroy (s3);
   bson_destroy (c2);
   bson_destroy (s2);
   bson_destroy (c1);
   bson_destroy (s1);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_key_copy),
      cmocka_unit_test (test_injected),
      cmocka_unit_test (test_abort_confirmed),
      cmocka_unit_test (test_lsid_hex),
      cmocka_unit_test (test_poison_policy),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
