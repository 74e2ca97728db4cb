/*
 * test_poison.c - the table of poisoned transactions: keys read from
 * commands, lookup, expiry, the bound (live entries never evicted),
 * reservations, removal, and a few threads hammering one table.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "publish/poison.h"

/* A key for session `s`, transaction `n`: a 16-byte id like a UUID's. */
static poison_key_t
key (uint32_t s, int64_t n)
{
   poison_key_t k;

   memset (&k, 0, sizeof k);
   k.id_len = 16;
   for (int i = 0; i < 16; i++)
      k.id[i] = (uint8_t) (s >> (8 * (i % 4))) ^ (uint8_t) i;
   k.txn_number = n;
   return k;
}

static void
test_key_of (void **state)
{
   uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
   uint8_t big[POISON_LSID_ID_MAX + 1] = {0};
   poison_key_t k;
   bson_t *cmd;

   /* What drivers send: lsid {id: UUID}, txnNumber Int64; the key is the id's bytes. */
   cmd = BCON_NEW ("insert", "c", "lsid", "{", "id", BCON_BIN (BSON_SUBTYPE_UUID, uuid, 16), "}", "txnNumber",
                   BCON_INT64 (7), "autocommit", BCON_BOOL (false));
   assert_true (poison_key_of (cmd, &k));
   assert_int_equal (k.id_len, 16);
   assert_memory_equal (k.id, uuid, 16);
   assert_int_equal (k.txn_number, 7);
   bson_destroy (cmd);

   /* Other lsid fields (a mongos's uid) do not change the key; int32 txnNumber is read too. */
   cmd = BCON_NEW ("commitTransaction", BCON_INT32 (1), "txnNumber", BCON_INT32 (7), "lsid", "{", "uid",
                   BCON_BIN (BSON_SUBTYPE_BINARY, big, 32), "id", BCON_BIN (BSON_SUBTYPE_UUID, uuid, 16), "}");
   assert_true (poison_key_of (cmd, &k));
   assert_int_equal (k.id_len, 16);
   assert_int_equal (k.txn_number, 7);
   bson_destroy (cmd);

   /* Refused: no lsid, lsid without id, id not binary, id too long, no txnNumber, txnNumber a string. */
   cmd = BCON_NEW ("insert", "c", "txnNumber", BCON_INT64 (1));
   assert_false (poison_key_of (cmd, &k));
   bson_destroy (cmd);
   cmd = BCON_NEW ("insert", "c", "lsid", "{", "x", BCON_INT32 (1), "}", "txnNumber", BCON_INT64 (1));
   assert_false (poison_key_of (cmd, &k));
   bson_destroy (cmd);
   cmd = BCON_NEW ("insert", "c", "lsid", "{", "id", BCON_UTF8 ("abc"), "}", "txnNumber", BCON_INT64 (1));
   assert_false (poison_key_of (cmd, &k));
   bson_destroy (cmd);
   cmd = BCON_NEW ("insert", "c", "lsid", "{", "id", BCON_BIN (BSON_SUBTYPE_UUID, big, sizeof big), "}", "txnNumber",
                   BCON_INT64 (1));
   assert_false (poison_key_of (cmd, &k));
   bson_destroy (cmd);
   cmd = BCON_NEW ("insert", "c", "lsid", "{", "id", BCON_BIN (BSON_SUBTYPE_UUID, uuid, 16), "}");
   assert_false (poison_key_of (cmd, &k));
   bson_destroy (cmd);
   cmd = BCON_NEW ("insert", "c", "lsid", "{", "id", BCON_BIN (BSON_SUBTYPE_UUID, uuid, 16), "}", "txnNumber",
                   BCON_UTF8 ("1"));
   assert_false (poison_key_of (cmd, &k));
   bson_destroy (cmd);
}

static void
test_lookup (void **state)
{
   poison_table_t *t = poison_table_new (8, 1000);
   poison_key_t a = key (1, 5), other_txn = key (1, 6), other_session = key (2, 5), shorter = key (1, 5);
   poison_entry_t e;

   shorter.id_len = 15;
   assert_int_equal (poison_table_count (t), 0);
   assert_false (poison_table_lookup (t, &a, 0, &e)); /* nothing allocated yet */
   assert_int_equal (poison_table_add (t, &a, 42, "connection lost", 100, false), POISON_ADDED);
   assert_int_equal (poison_table_count (t), 1);
   assert_true (poison_table_lookup (t, &a, 200, &e));
   assert_int_equal (e.conn_id, 42);
   assert_int_equal (e.recorded_ms, 100);
   assert_int_equal (e.key.txn_number, 5);
   assert_string_equal (e.reason, "connection lost");
   assert_true (poison_table_lookup (t, &a, 200, NULL));
   /* Same session, next transaction; same number, other session; a prefix of the id. */
   assert_false (poison_table_lookup (t, &other_txn, 200, NULL));
   assert_false (poison_table_lookup (t, &other_session, 200, NULL));
   assert_false (poison_table_lookup (t, &shorter, 200, NULL));
   /* Twice: the first reason and time stay. */
   assert_int_equal (poison_table_add (t, &a, 43, "outbox write failed", 300, false), POISON_KNOWN);
   assert_true (poison_table_lookup (t, &a, 300, &e));
   assert_string_equal (e.reason, "connection lost");
   assert_int_equal (e.conn_id, 42);
   assert_int_equal (poison_table_count (t), 1);
   /* Removal. */
   assert_true (poison_table_remove (t, &a));
   assert_false (poison_table_remove (t, &a));
   assert_false (poison_table_lookup (t, &a, 300, NULL));
   assert_int_equal (poison_table_count (t), 0);
   poison_table_destroy (t);
   poison_table_destroy (NULL);
}

static void
test_reason_truncated (void **state)
{
   poison_table_t *t = poison_table_new (2, 1000);
   poison_key_t a = key (1, 1);
   char longer[POISON_REASON_MAX * 2];
   poison_entry_t e;

   memset (longer, 'x', sizeof longer - 1);
   longer[sizeof longer - 1] = '\0';
   assert_int_equal (poison_table_add (t, &a, 1, longer, 0, false), POISON_ADDED);
   assert_true (poison_table_lookup (t, &a, 0, &e));
   assert_int_equal (strlen (e.reason), POISON_REASON_MAX - 1);
   assert_int_equal (poison_table_add (t, &(poison_key_t){.id_len = 0, .txn_number = 1}, 1, NULL, 0, false), POISON_ADDED);
   poison_table_destroy (t);
}

static void
test_expiry (void **state)
{
   poison_table_t *t = poison_table_new (8, 1000);
   poison_key_t a = key (1, 1), b = key (2, 1), c = key (3, 1);

   assert_int_equal (poison_table_add (t, &a, 1, "a", 0, false), POISON_ADDED);
   assert_int_equal (poison_table_add (t, &b, 1, "b", 500, false), POISON_ADDED);
   /* Live up to just before the TTL, gone at it. */
   assert_true (poison_table_lookup (t, &a, 999, NULL));
   assert_false (poison_table_lookup (t, &a, 1000, NULL));
   assert_int_equal (poison_table_count (t), 1); /* a was dropped by the lookup */
   assert_true (poison_table_lookup (t, &b, 1499, NULL));
   /* An add drops what expired too, and an expired key may be poisoned again. */
   assert_int_equal (poison_table_add (t, &c, 1, "c", 1500, false), POISON_ADDED);
   assert_int_equal (poison_table_count (t), 1);
   assert_false (poison_table_lookup (t, &b, 1500, NULL));
   assert_int_equal (poison_table_add (t, &a, 1, "a again", 1600, false), POISON_ADDED);
   assert_true (poison_table_lookup (t, &a, 2599, NULL));
   assert_false (poison_table_lookup (t, &c, 2599, NULL));
   poison_table_destroy (t);
}

/* A full table keeps every live entry: a new one is not recorded
 * (POISON_FULL) and nothing is evicted for it, however many come. */
static void
test_bound (void **state)
{
   enum { CAP = 4 };
   poison_table_t *t = poison_table_new (CAP, 60000);
   poison_key_t k;

   assert_int_equal (poison_table_capacity (t), CAP);
   for (int64_t n = 0; n < CAP; n++) {
      k = key (9, n);
      assert_int_equal (poison_table_add (t, &k, (uint64_t) n, "r", n, false), POISON_ADDED);
   }
   assert_int_equal (poison_table_count (t), CAP);
   for (int64_t n = CAP; n < 3 * CAP; n++) {
      k = key (9, n);
      assert_int_equal (poison_table_add (t, &k, (uint64_t) n, "r", n, false), POISON_FULL);
      assert_int_equal (poison_table_count (t), CAP);
   }
   /* The first CAP are all still there, the later ones are not. */
   for (int64_t n = 0; n < 3 * CAP; n++) {
      k = key (9, n);
      assert_true (poison_table_lookup (t, &k, 3 * CAP, NULL) == (n < CAP));
   }
   /* An entry already there is still known when the table is full. */
   k = key (9, 1);
   assert_int_equal (poison_table_add (t, &k, 1, "again", 20, false), POISON_KNOWN);
   /* A freed slot (removal) is used again. */
   assert_true (poison_table_remove (t, &k));
   k = key (9, 100);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 50, false), POISON_ADDED);
   k = key (9, 101);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 51, false), POISON_FULL);
   /* Removing the newest and the oldest keeps the age order right: expiry
    * then frees the oldest first. */
   k = key (9, 100);
   assert_true (poison_table_remove (t, &k));
   k = key (9, 0);
   assert_true (poison_table_remove (t, &k));
   k = key (9, 102);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 60, false), POISON_ADDED);
   k = key (9, 103);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 61, false), POISON_ADDED);
   assert_int_equal (poison_table_count (t), CAP);
   /* At 60003 the entries of 2 and 3 have expired (60000 ms): two new fit. */
   k = key (9, 104);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 60003, false), POISON_ADDED);
   k = key (9, 105);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 60003, false), POISON_ADDED);
   k = key (9, 106);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 60003, false), POISON_FULL);
   k = key (9, 102);
   assert_true (poison_table_lookup (t, &k, 60003, NULL));
   poison_table_destroy (t);

   /* A capacity of 0 still holds one. */
   t = poison_table_new (0, 10);
   k = key (1, 1);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 0, false), POISON_ADDED);
   k = key (1, 2);
   assert_int_equal (poison_table_add (t, &k, 1, "r", 0, false), POISON_FULL);
   assert_int_equal (poison_table_count (t), 1);
   k = key (1, 1);
   assert_true (poison_table_lookup (t, &k, 5, NULL));
   poison_table_destroy (t);
}

/* The attack the reservation stops: throwaway publishes poisoning their
 * own transactions fill the table; one poisoned earlier must stay, and new
 * publishes are refused (no reservation) until entries expire. */
static void
test_reserve (void **state)
{
   enum { CAP = 3 };
   poison_table_t *t = poison_table_new (CAP, 1000);
   poison_key_t real = key (1, 1), k;

   /* A reservation turned into an entry. */
   assert_true (poison_table_reserve (t, 0));
   assert_int_equal (poison_table_reserved (t), 1);
   assert_int_equal (poison_table_add (t, &real, 1, "real", 0, true), POISON_ADDED);
   assert_int_equal (poison_table_reserved (t), 0);
   /* Reservations count against the capacity. */
   assert_true (poison_table_reserve (t, 10));
   assert_true (poison_table_reserve (t, 10));
   assert_false (poison_table_reserve (t, 10));
   assert_int_equal (poison_table_reserved (t), 2);
   /* An add without a reservation cannot take a promised slot. */
   k = key (2, 1);
   assert_int_equal (poison_table_add (t, &k, 2, "r", 10, false), POISON_FULL);
   /* Holders of reservations always find room. */
   k = key (3, 1);
   assert_int_equal (poison_table_add (t, &k, 3, "r", 20, true), POISON_ADDED);
   /* A known key consumes the reservation too. */
   assert_int_equal (poison_table_add (t, &real, 3, "r", 20, true), POISON_KNOWN);
   assert_int_equal (poison_table_reserved (t), 0);
   assert_int_equal (poison_table_count (t), 2);
   /* A reservation handed back frees its slot. */
   assert_true (poison_table_reserve (t, 30));
   assert_false (poison_table_reserve (t, 30));
   poison_table_unreserve (t);
   assert_true (poison_table_reserve (t, 30));
   k = key (4, 1);
   assert_int_equal (poison_table_add (t, &k, 4, "r", 30, true), POISON_ADDED);
   /* Full: throwaway publishes are refused, however many, and the real
    * entry stays until it expires. */
   for (int i = 0; i < 100; i++)
      assert_false (poison_table_reserve (t, 40 + i));
   assert_true (poison_table_lookup (t, &real, 999, NULL));
   /* At 1000 the real entry (0) has expired: one reservation fits again. */
   assert_true (poison_table_reserve (t, 1000));
   assert_false (poison_table_lookup (t, &real, 1000, NULL));
   assert_false (poison_table_reserve (t, 1000));
   poison_table_unreserve (t);
   poison_table_unreserve (t); /* more than reserved: ignored */
   assert_int_equal (poison_table_reserved (t), 0);
   poison_table_destroy (t);
}

/* Many keys hash into the same few buckets of a big table. */
static void
test_many (void **state)
{
   poison_table_t *t = poison_table_new (1000, 60000);
   poison_key_t k;

   for (uint32_t s = 0; s < 50; s++) {
      for (int64_t n = 1; n <= 20; n++) {
         k = key (s, n);
         assert_int_equal (poison_table_add (t, &k, s, "r", 0, false), POISON_ADDED);
      }
   }
   assert_int_equal (poison_table_count (t), 1000);
   for (uint32_t s = 0; s < 50; s++) {
      for (int64_t n = 1; n <= 21; n++) {
         k = key (s, n);
         assert_true (poison_table_lookup (t, &k, 1, NULL) == (n <= 20));
      }
   }
   for (uint32_t s = 0; s < 50; s += 2) {
      for (int64_t n = 1; n <= 20; n++) {
         k = key (s, n);
         assert_true (poison_table_remove (t, &k));
      }
   }
   assert_int_equal (poison_table_count (t), 500);
   for (uint32_t s = 0; s < 50; s++) {
      k = key (s, 3);
      assert_true (poison_table_lookup (t, &k, 1, NULL) == (s % 2 == 1));
   }
   poison_table_destroy (t);
}

typedef struct {
   poison_table_t *t;
   uint32_t id;
} worker_t;

static void *
worker (void *arg)
{
   worker_t *w = arg;

   for (int64_t n = 0; n < 2000; n++) {
      poison_key_t k = key (w->id, n);

      (void) poison_table_add (w->t, &k, w->id, "r", n, false);
      (void) poison_table_lookup (w->t, &k, n, NULL);
      if (n % 3 == 0)
         (void) poison_table_remove (w->t, &k);
      (void) poison_table_count (w->t);
   }
   return NULL;
}

/* Threads adding, looking up and removing at once (meant for the
 * sanitizer build): the bound holds throughout. */
static void
test_threads (void **state)
{
   enum { N = 4 };
   poison_table_t *t = poison_table_new (64, 100);
   pthread_t th[N];
   worker_t w[N];

   for (uint32_t i = 0; i < N; i++) {
      w[i].t = t;
      w[i].id = i + 1;
      assert_int_equal (pthread_create (&th[i], NULL, worker, &w[i]), 0);
   }
   for (uint32_t i = 0; i < N; i++)
      pthread_join (th[i], NULL);
   assert_true (poison_table_count (t) <= 64);
   poison_table_destroy (t);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_key_of),
      cmocka_unit_test (test_lookup),
      cmocka_unit_test (test_reason_truncated),
      cmocka_unit_test (test_expiry),
      cmocka_unit_test (test_bound),
      cmocka_unit_test (test_reserve),
      cmocka_unit_test (test_many),
      cmocka_unit_test (test_threads),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
