/*
 * cdriver-client.c - a small mongo-c-driver application for the proxy integration tests.
 *
 *   cdriver-client URI [DATABASE]
 *
 * Through whatever URI it is given (the tests pass the proxy, with or without compressors and
 * TLS, or a load balancer with loadBalanced=true, where the driver sees a LoadBalancer
 * server instead), it checks the server is a mongos, does CRUD, reads a cursor over several getMore
 * batches, and runs a transaction with mongoc_client_session_with_transaction.  It prints one
 * "ok ..." line per step and exits 0; on any failure it prints "FAIL: ..." and exits 1.
 */
#include <mongoc/mongoc.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CURSOR_DOCS 60
#define CURSOR_BATCH 7

static int getmore_started;
static int getmore_succeeded;
static int commands_failed;

static void
fail (const char *fmt, ...)
{
   va_list ap;
   va_start (ap, fmt);
   fputs ("cdriver-client: FAIL: ", stderr);
   vfprintf (stderr, fmt, ap);
   fputc ('\n', stderr);
   va_end (ap);
   exit (1);
}

static void
ok (const char *step)
{
   printf ("ok %s\n", step);
   fflush (stdout);
}

static void
on_started (const mongoc_apm_command_started_t *e)
{
   if (strcmp (mongoc_apm_command_started_get_command_name (e), "getMore") == 0) {
      getmore_started++;
   }
}

static void
on_succeeded (const mongoc_apm_command_succeeded_t *e)
{
   if (strcmp (mongoc_apm_command_succeeded_get_command_name (e), "getMore") == 0) {
      getmore_succeeded++;
   }
}

static void
on_failed (const mongoc_apm_command_failed_t *e)
{
   bson_error_t err;
   mongoc_apm_command_failed_get_error (e, &err);
   commands_failed++;
   fprintf (stderr, "cdriver-client: note: %s failed: %s\n", mongoc_apm_command_failed_get_command_name (e), err.message);
}

static int64_t
count (mongoc_collection_t *coll, const bson_t *filter)
{
   bson_error_t err;
   int64_t n = mongoc_collection_count_documents (coll, filter, NULL, NULL, NULL, &err);
   if (n < 0) {
      fail ("count_documents: %s", err.message);
   }
   return n;
}

static void
check_mongos (mongoc_client_t *client, bool load_balanced)
{
   bson_t reply;
   bson_error_t err;
   bson_iter_t it;
   bson_t *cmd = BCON_NEW ("hello", BCON_INT32 (1));
   if (!mongoc_client_command_simple (client, "admin", cmd, NULL, &reply, &err)) {
      fail ("hello: %s", err.message);
   }
   if (!bson_iter_init_find (&it, &reply, "msg") || !BSON_ITER_HOLDS_UTF8 (&it) ||
       strcmp (bson_iter_utf8 (&it, NULL), "isdbgrid") != 0) {
      char *s = bson_as_relaxed_extended_json (&reply, NULL);
      fail ("hello through the proxy is not a mongos hello: %s", s);
   }
   if (bson_iter_init_find (&it, &reply, "setName") || bson_iter_init_find (&it, &reply, "hosts")) {
      fail ("hello through the proxy still has replica-set identity");
   }
   bson_destroy (&reply);
   bson_destroy (cmd);

   /* The driver's own view: the server it selected is a mongos (in load-balanced mode, the
    * balancer, which the driver accepted only with a serviceId in the handshake). */
   mongoc_server_description_t *sd = mongoc_client_select_server (client, true, NULL, &err);
   if (!sd) {
      fail ("select_server: %s", err.message);
   }
   const char *want = load_balanced ? "LoadBalancer" : "Mongos";
   if (strcmp (mongoc_server_description_type (sd), want) != 0) {
      fail ("server type is %s, want %s", mongoc_server_description_type (sd), want);
   }
   mongoc_server_description_destroy (sd);
   ok ("mongos persona");
}

static void
crud (mongoc_collection_t *coll)
{
   bson_error_t err;
   bson_t reply;
   mongoc_collection_drop (coll, NULL); /* may not exist */

   bson_t *docs[3];
   for (int i = 0; i < 3; i++) {
      docs[i] = BCON_NEW ("_id", BCON_INT32 (i + 1), "name", BCON_UTF8 ("item"), "qty", BCON_INT32 (10 * (i + 1)));
   }
   if (!mongoc_collection_insert_many (coll, (const bson_t **) docs, 3, NULL, &reply, &err)) {
      fail ("insert_many: %s", err.message);
   }
   bson_destroy (&reply);
   for (int i = 0; i < 3; i++) {
      bson_destroy (docs[i]);
   }
   if (count (coll, &(bson_t) BSON_INITIALIZER) != 3) {
      fail ("expected 3 documents after insert_many");
   }

   bson_t *sel = BCON_NEW ("_id", BCON_INT32 (2));
   bson_t *upd = BCON_NEW ("$set", "{", "name", BCON_UTF8 ("updated"), "}", "$inc", "{", "qty", BCON_INT32 (5), "}");
   if (!mongoc_collection_update_one (coll, sel, upd, NULL, &reply, &err)) {
      fail ("update_one: %s", err.message);
   }
   bson_iter_t it;
   if (!bson_iter_init_find (&it, &reply, "modifiedCount") || bson_iter_as_int64 (&it) != 1) {
      fail ("update_one modified no document");
   }
   bson_destroy (&reply);

   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, sel, NULL, NULL);
   const bson_t *doc;
   int found = 0;
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t f;
      if (!bson_iter_init_find (&f, doc, "name") || strcmp (bson_iter_utf8 (&f, NULL), "updated") != 0) {
         fail ("updated document has the wrong name");
      }
      if (!bson_iter_init_find (&f, doc, "qty") || bson_iter_as_int64 (&f) != 25) {
         fail ("updated document has the wrong qty");
      }
      found++;
   }
   if (mongoc_cursor_error (cur, &err)) {
      fail ("find: %s", err.message);
   }
   if (found != 1) {
      fail ("find after update returned %d documents", found);
   }
   mongoc_cursor_destroy (cur);

   /* A duplicate key is a write error, not a broken connection. */
   bson_t *dup = BCON_NEW ("_id", BCON_INT32 (1));
   if (mongoc_collection_insert_one (coll, dup, NULL, NULL, &err)) {
      fail ("duplicate _id insert succeeded");
   }
   if (err.code != 11000) {
      fail ("duplicate _id gave code %u (%s), want 11000", err.code, err.message);
   }
   bson_destroy (dup);

   if (!mongoc_collection_delete_one (coll, sel, NULL, &reply, &err)) {
      fail ("delete_one: %s", err.message);
   }
   bson_destroy (&reply);
   if (count (coll, &(bson_t) BSON_INITIALIZER) != 2) {
      fail ("expected 2 documents after delete_one");
   }
   bson_destroy (sel);
   bson_destroy (upd);
   ok ("crud");
}

static void
cursor (mongoc_collection_t *coll)
{
   bson_error_t err;
   mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts (coll, NULL);
   for (int i = 0; i < N_CURSOR_DOCS; i++) {
      bson_t *d = BCON_NEW ("_id", BCON_INT32 (1000 + i), "k", BCON_INT32 (i));
      mongoc_bulk_operation_insert (bulk, d);
      bson_destroy (d);
   }
   bson_t reply;
   if (!mongoc_bulk_operation_execute (bulk, &reply, &err)) {
      fail ("bulk insert: %s", err.message);
   }
   bson_destroy (&reply);
   mongoc_bulk_operation_destroy (bulk);

   int before = getmore_succeeded;
   bson_t *filter = BCON_NEW ("_id", "{", "$gte", BCON_INT32 (1000), "}");
   bson_t *opts = BCON_NEW ("batchSize", BCON_INT32 (CURSOR_BATCH), "sort", "{", "_id", BCON_INT32 (1), "}");
   mongoc_cursor_t *cur = mongoc_collection_find_with_opts (coll, filter, opts, NULL);
   const bson_t *doc;
   int n = 0;
   while (mongoc_cursor_next (cur, &doc)) {
      bson_iter_t f;
      if (!bson_iter_init_find (&f, doc, "k") || bson_iter_as_int64 (&f) != n) {
         fail ("cursor document %d out of order", n);
      }
      n++;
   }
   if (mongoc_cursor_error (cur, &err)) {
      fail ("cursor: %s", err.message);
   }
   mongoc_cursor_destroy (cur);
   if (n != N_CURSOR_DOCS) {
      fail ("cursor returned %d documents, want %d", n, N_CURSOR_DOCS);
   }
   int batches = getmore_succeeded - before;
   if (batches < N_CURSOR_DOCS / CURSOR_BATCH) {
      fail ("cursor used %d getMores, want at least %d", batches, N_CURSOR_DOCS / CURSOR_BATCH);
   }
   bson_destroy (filter);
   bson_destroy (opts);
   printf ("ok cursor (%d documents, %d getMore batches)\n", n, batches);
}

typedef struct {
   mongoc_collection_t *coll;
   int calls;
} txn_ctx_t;

static bool
txn_cb (mongoc_client_session_t *session, void *ctx_, bson_t **reply, bson_error_t *err)
{
   txn_ctx_t *ctx = ctx_;
   ctx->calls++;
   bson_t opts = BSON_INITIALIZER;
   if (!mongoc_client_session_append (session, &opts, err)) {
      return false;
   }
   bson_t *a = BCON_NEW ("_id", BCON_UTF8 ("txn-a"), "v", BCON_INT32 (1));
   bson_t *b = BCON_NEW ("_id", BCON_UTF8 ("txn-b"), "v", BCON_INT32 (2));
   bool r = mongoc_collection_insert_one (ctx->coll, a, &opts, NULL, err) &&
            mongoc_collection_insert_one (ctx->coll, b, &opts, NULL, err);
   bson_destroy (a);
   bson_destroy (b);
   bson_destroy (&opts);
   (void) reply;
   return r;
}

static void
transaction (mongoc_client_t *client, mongoc_collection_t *coll)
{
   bson_error_t err;
   mongoc_client_session_t *session = mongoc_client_start_session (client, NULL, &err);
   if (!session) {
      fail ("start_session: %s", err.message);
   }
   txn_ctx_t ctx = {coll, 0};
   bson_t reply;
   if (!mongoc_client_session_with_transaction (session, txn_cb, NULL, &ctx, &reply, &err)) {
      char *s = bson_as_relaxed_extended_json (&reply, NULL);
      fail ("with_transaction: %s (reply %s)", err.message, s);
   }
   bson_destroy (&reply);
   mongoc_client_session_destroy (session);
   bson_t *f = BCON_NEW ("_id", "{", "$in", "[", BCON_UTF8 ("txn-a"), BCON_UTF8 ("txn-b"), "]", "}");
   if (count (coll, f) != 2) {
      fail ("transaction did not commit both documents");
   }
   bson_destroy (f);

   /* An aborted transaction leaves nothing behind. */
   session = mongoc_client_start_session (client, NULL, &err);
   if (!mongoc_client_session_start_transaction (session, NULL, &err)) {
      fail ("start_transaction: %s", err.message);
   }
   bson_t opts = BSON_INITIALIZER;
   if (!mongoc_client_session_append (session, &opts, &err)) {
      fail ("session_append: %s", err.message);
   }
   bson_t *c = BCON_NEW ("_id", BCON_UTF8 ("txn-aborted"));
   if (!mongoc_collection_insert_one (coll, c, &opts, NULL, &err)) {
      fail ("insert in transaction: %s", err.message);
   }
   if (!mongoc_client_session_abort_transaction (session, &err)) {
      fail ("abort_transaction: %s", err.message);
   }
   bson_destroy (&opts);
   mongoc_client_session_destroy (session);
   if (count (coll, c) != 0) {
      fail ("aborted transaction's document is visible");
   }
   bson_destroy (c);
   printf ("ok transaction (callback ran %d time(s))\n", ctx.calls);
}

int
main (int argc, char **argv)
{
   if (argc < 2) {
      fprintf (stderr, "usage: %s URI [DATABASE]\n", argv[0]);
      return 2;
   }
   const char *dbname = argc > 2 ? argv[2] : "rbit_cdriver";
   bson_error_t err;

   mongoc_init ();
   mongoc_uri_t *uri = mongoc_uri_new_with_error (argv[1], &err);
   if (!uri) {
      fail ("bad URI: %s", err.message);
   }
   mongoc_uri_set_option_as_int32 (uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, 10000);
   mongoc_client_t *client = mongoc_client_new_from_uri_with_error (uri, &err);
   if (!client) {
      fail ("client: %s", err.message);
   }
   mongoc_client_set_error_api (client, MONGOC_ERROR_API_VERSION_2);
   mongoc_client_set_appname (client, "rbit-cdriver-client");
   mongoc_apm_callbacks_t *cbs = mongoc_apm_callbacks_new ();
   mongoc_apm_set_command_started_cb (cbs, on_started);
   mongoc_apm_set_command_succeeded_cb (cbs, on_succeeded);
   mongoc_apm_set_command_failed_cb (cbs, on_failed);
   mongoc_client_set_apm_callbacks (client, cbs, NULL);

   bson_t *ping = BCON_NEW ("ping", BCON_INT32 (1));
   if (!mongoc_client_command_simple (client, "admin", ping, NULL, NULL, &err)) {
      fail ("ping: %s", err.message);
   }
   bson_destroy (ping);
   ok ("ping");

   check_mongos (client, mongoc_uri_get_option_as_bool (uri, MONGOC_URI_LOADBALANCED, false));
   mongoc_collection_t *coll = mongoc_client_get_collection (client, dbname, "items");
   crud (coll);
   cursor (coll);
   transaction (client, coll);

   /* Its own collection, not the database: against a real deployment (scripts/test --upstream)
    * the database is the run's, which holds the proxy's outbox, and the proxy refuses a client's
    * dropDatabase of it. */
   if (!mongoc_collection_drop (coll, &err)) {
      fail ("drop collection: %s", err.message);
   }
   mongoc_collection_destroy (coll);
   mongoc_client_destroy (client);
   mongoc_apm_callbacks_destroy (cbs);
   mongoc_uri_destroy (uri);
   mongoc_cleanup ();
   printf ("ok all (getMore started %d, commands failed %d)\n", getmore_started, commands_failed);
   return 0;
}
