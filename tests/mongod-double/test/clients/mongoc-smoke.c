/* mongo-c-driver smoke client for the double's self-tests (test/drivers.test.js): insert with
 * an Int64, find, a committed transaction, count, a read with read preference secondary, and a
 * duplicate key error. Prints results on stdout; exits non-zero on any unexpected failure. */
#include <mongoc/mongoc.h>
#include <stdio.h>
int main(int argc, char **argv) {
  mongoc_init();
  bson_error_t err;
  mongoc_uri_t *uri = mongoc_uri_new_with_error(argv[1], &err);
  if (!uri) { fprintf(stderr, "uri: %s\n", err.message); return 1; }
  mongoc_client_t *client = mongoc_client_new_from_uri(uri);
  mongoc_collection_t *coll = mongoc_client_get_collection(client, "cdb", "c");
  bson_t *doc = BCON_NEW("_id", BCON_INT32(1), "x", BCON_INT64(42));
  if (!mongoc_collection_insert_one(coll, doc, NULL, NULL, &err)) { fprintf(stderr, "insert: %s\n", err.message); return 1; }
  bson_t *q = bson_new();
  mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, q, NULL, NULL);
  const bson_t *d;
  while (mongoc_cursor_next(cur, &d)) { char *s = bson_as_canonical_extended_json(d, NULL); printf("%s\n", s); bson_free(s); }
  if (mongoc_cursor_error(cur, &err)) { fprintf(stderr, "find: %s\n", err.message); return 1; }
  mongoc_cursor_destroy(cur);
  mongoc_client_session_t *s = mongoc_client_start_session(client, NULL, &err);
  if (!s) { fprintf(stderr, "session: %s\n", err.message); return 1; }
  if (!mongoc_client_session_start_transaction(s, NULL, &err)) { fprintf(stderr, "start: %s\n", err.message); return 1; }
  bson_t opts = BSON_INITIALIZER;
  if (!mongoc_client_session_append(s, &opts, &err)) return 1;
  bson_t *doc2 = BCON_NEW("_id", BCON_INT32(2));
  if (!mongoc_collection_insert_one(coll, doc2, &opts, NULL, &err)) { fprintf(stderr, "insert2: %s\n", err.message); return 1; }
  bson_t reply;
  if (!mongoc_client_session_commit_transaction(s, &reply, &err)) { fprintf(stderr, "commit: %s\n", err.message); return 1; }
  bson_destroy(&reply);
  int64_t n = mongoc_collection_count_documents(coll, q, NULL, NULL, NULL, &err);
  printf("count %lld\n", (long long) n);
  /* A read with read preference secondary: prints which member served it. */
  mongoc_read_prefs_t *rp = mongoc_read_prefs_new(MONGOC_READ_SECONDARY);
  cur = mongoc_collection_find_with_opts(coll, q, NULL, rp);
  int m = 0;
  while (mongoc_cursor_next(cur, &d)) m++;
  if (mongoc_cursor_error(cur, &err)) { fprintf(stderr, "secondary find: %s\n", err.message); return 1; }
  mongoc_host_list_t host;
  mongoc_cursor_get_host(cur, &host);
  printf("secondary read %d from port %u\n", m, (unsigned) host.port);
  mongoc_cursor_destroy(cur);
  mongoc_read_prefs_destroy(rp);
  bson_t *dup = BCON_NEW("_id", BCON_INT32(2));
  if (mongoc_collection_insert_one(coll, dup, NULL, NULL, &err)) { fprintf(stderr, "duplicate accepted\n"); return 1; }
  printf("dup code %u: %s\n", err.code, err.message);
  mongoc_client_session_destroy(s);
  mongoc_collection_destroy(coll);
  mongoc_client_destroy(client);
  mongoc_uri_destroy(uri);
  mongoc_cleanup();
  return 0;
}
