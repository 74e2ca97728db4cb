/*
 * cdriver-publish.c - publishing with mongo-c-driver through the proxy.
 *
 *   cdriver-publish [--outside-only] URI DB
 *
 * Runs, against the proxy named by URI (no replicaSet=):
 *   1. mongoc_client_session_with_transaction: insert_one with a document comment
 *      {relaybus: {type, id: "c-1", key: "ck", payload}}, and update_one with the string form;
 *   2. a manual transaction (start, insert_one with an array annotation, commit);
 *   3. relaybusPublish as a command inside a transaction;
 *   4. a bad annotation (BadValue 2) and one outside a transaction (InvalidOptions 72, as a
 *      retryable write: the driver's default), after which the same session commits a
 *      transaction.
 * --outside-only runs the write outside a transaction alone, and prints its message.
 * Prints one line per step ("ok <step>" or "FAIL <step>: <why>") and exits 0 when all passed;
 * the Node.js test then checks the stored events.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mongoc/mongoc.h>

static int failures;

static void
report (const char *step, bool ok, const bson_error_t *error)
{
   if (ok) {
      printf ("ok %s\n", step);
   } else {
      printf ("FAIL %s: %s (code %u)\n", step, error ? error->message : "", error ? error->code : 0);
      failures++;
   }
   fflush (stdout);
}

typedef struct {
   mongoc_collection_t *coll;
} ctx_t;

static bool
with_txn_cb (mongoc_client_session_t *session, void *arg, bson_t **reply, bson_error_t *error)
{
   ctx_t *ctx = arg;
   bson_t opts = BSON_INITIALIZER;
   bool ok;

   (void) reply;
   ok = mongoc_client_session_append (session, &opts, error);
   BSON_APPEND_DOCUMENT (&opts, "comment",
                         BCON_NEW ("relaybus", "{", "type", BCON_UTF8 ("order.placed.v1"), "id", BCON_UTF8 ("c-1"),
                                   "key", BCON_UTF8 ("ck"), "payload", "{", "orderId", BCON_UTF8 ("c-o1"), "}", "}"));
   ok = ok && mongoc_collection_insert_one (ctx->coll, BCON_NEW ("_id", BCON_UTF8 ("c-o1")), &opts, NULL, error);
   bson_reinit (&opts);
   ok = ok && mongoc_client_session_append (session, &opts, error);
   BSON_APPEND_UTF8 (&opts, "comment", "relaybus:{\"type\": \"order.paid.v1\", \"id\": \"c-2\", \"key\": \"ck\"}");
   ok = ok && mongoc_collection_update_one (ctx->coll, BCON_NEW ("_id", BCON_UTF8 ("c-o1")),
                                            BCON_NEW ("$set", "{", "paid", BCON_BOOL (true), "}"), &opts, NULL, error);
   bson_destroy (&opts);
   return ok;
}

/* Runs one operation expected to fail with `code`. */
static void
expect_code (const char *step, bool ok, const bson_error_t *error, uint32_t code)
{
   bson_error_t e = *error;

   if (ok) {
      bson_set_error (&e, 0, 0, "succeeded, expected code %u", code);
      report (step, false, &e);
   } else if (error->code != code) {
      report (step, false, error);
   } else {
      report (step, true, NULL);
   }
}

/* An annotated insert outside a transaction (a retryable write, the driver's
 * default) is refused with InvalidOptions 72 and the proxy's message. */
static void
outside_txn (mongoc_collection_t *coll)
{
   bson_error_t error;
   bson_t opts;
   bool ok;

   bson_init (&opts);
   BSON_APPEND_DOCUMENT (&opts, "comment", BCON_NEW ("relaybus", "{", "type", BCON_UTF8 ("x"), "}"));
   ok = mongoc_collection_insert_one (coll, BCON_NEW ("_id", BCON_UTF8 ("c-out")), &opts, NULL, &error);
   bson_destroy (&opts);
   expect_code ("outside a transaction is InvalidOptions", ok, &error, 72);
   if (!ok)
      printf ("message %s\n", error.message);
}

int
main (int argc, char **argv)
{
   mongoc_client_t *client;
   mongoc_collection_t *coll;
   mongoc_database_t *db;
   mongoc_client_session_t *session;
   bson_error_t error;
   bson_t opts, reply;
   ctx_t ctx;
   bool ok, outside_only = false;

   if (argc == 4 && strcmp (argv[1], "--outside-only") == 0) {
      outside_only = true;
      argv++;
      argc--;
   }
   if (argc != 3) {
      fprintf (stderr, "usage: %s [--outside-only] URI DB\n", argv[0]);
      return 2;
   }
   mongoc_init ();
   client = mongoc_client_new (argv[1]);
   if (!client) {
      fprintf (stderr, "bad URI\n");
      return 2;
   }
   mongoc_client_set_appname (client, "rbit-cdriver-publish");
   db = mongoc_client_get_database (client, argv[2]);
   coll = mongoc_client_get_collection (client, argv[2], "orders");
   if (outside_only) {
      outside_txn (coll);
      goto done;
   }
   session = mongoc_client_start_session (client, NULL, &error);
   if (!session) {
      report ("start session", false, &error);
      return 1;
   }

   /* 1. with_transaction */
   ctx.coll = coll;
   ok = mongoc_client_session_with_transaction (session, with_txn_cb, NULL, &ctx, NULL, &error);
   report ("with_transaction", ok, &error);

   /* 2. manual transaction */
   ok = mongoc_client_session_start_transaction (session, NULL, &error);
   bson_init (&opts);
   ok = ok && mongoc_client_session_append (session, &opts, &error);
   BSON_APPEND_DOCUMENT (&opts, "comment",
                         BCON_NEW ("relaybus", "[", "{", "type", BCON_UTF8 ("user.created.v1"), "id", BCON_UTF8 ("c-3"),
                                   "}", "{", "type", BCON_UTF8 ("order.placed.v1"), "id", BCON_UTF8 ("c-4"), "key",
                                   BCON_UTF8 ("ck"), "}", "]"));
   ok = ok && mongoc_collection_insert_one (coll, BCON_NEW ("_id", BCON_UTF8 ("c-o2")), &opts, NULL, &error);
   bson_destroy (&opts);
   ok = ok && mongoc_client_session_commit_transaction (session, NULL, &error);
   report ("manual transaction", ok, &error);

   /* 3. relaybusPublish */
   ok = mongoc_client_session_start_transaction (session, NULL, &error);
   bson_init (&opts);
   ok = ok && mongoc_client_session_append (session, &opts, &error);
   ok = ok && mongoc_database_write_command_with_opts (
                 db, BCON_NEW ("relaybusPublish", BCON_INT32 (1), "events", "[", "{", "type", BCON_UTF8 ("user.deleted.v1"),
                               "id", BCON_UTF8 ("c-5"), "}", "]"),
                 &opts, &reply, &error);
   if (ok) {
      bson_iter_t it;

      ok = bson_iter_init_find (&it, &reply, "eventIds") && BSON_ITER_HOLDS_ARRAY (&it);
      if (!ok)
         bson_set_error (&error, 0, 0, "no eventIds in the reply");
   }
   bson_destroy (&reply);
   bson_destroy (&opts);
   ok = ok && mongoc_client_session_commit_transaction (session, NULL, &error);
   report ("relaybusPublish", ok, &error);

   /* 4. errors, then the session commits again */
   ok = mongoc_client_session_start_transaction (session, NULL, &error);
   bson_init (&opts);
   ok = ok && mongoc_client_session_append (session, &opts, &error);
   BSON_APPEND_DOCUMENT (&opts, "comment", BCON_NEW ("relaybus", "{", "typo", BCON_UTF8 ("x"), "}"));
   ok = mongoc_collection_insert_one (coll, BCON_NEW ("_id", BCON_UTF8 ("c-bad")), &opts, NULL, &error);
   bson_destroy (&opts);
   expect_code ("bad annotation is BadValue", ok, &error, 2);
   (void) mongoc_client_session_abort_transaction (session, NULL);

   outside_txn (coll);

   ok = mongoc_client_session_start_transaction (session, NULL, &error);
   bson_init (&opts);
   ok = ok && mongoc_client_session_append (session, &opts, &error);
   ok = ok && mongoc_collection_insert_one (coll, BCON_NEW ("_id", BCON_UTF8 ("c-after")), &opts, NULL, &error);
   bson_destroy (&opts);
   ok = ok && mongoc_client_session_commit_transaction (session, NULL, &error);
   report ("the session commits afterwards", ok, &error);

   mongoc_client_session_destroy (session);
done:
   mongoc_collection_destroy (coll);
   mongoc_database_destroy (db);
   mongoc_client_destroy (client);
   mongoc_cleanup ();
   return failures ? 1 : 0;
}
