/*
 * failover-loop.c - a mongo-c-driver application that writes and reads in a loop while the
 * primary steps down, for tests/integration/proxy/failover-drivers.test.js.
 *
 *   failover-loop URI DATABASE DURATION_MS single|pooled
 *
 * "single" uses one mongoc_client_t (single-threaded: the driver checks the server on the
 * connection it uses for operations), "pooled" a client popped from a mongoc_client_pool_t
 * (background monitoring on connections of its own). For DURATION_MS it inserts {_id: i} into DATABASE.items and then reads it back by _id, one
 * operation at a time, with the driver's defaults (retryable writes and reads on). Each
 * operation prints one line, the milliseconds since the start when the operation began first:
 *   T ack insert I            T err insert I KIND CODE MESSAGE
 *   T ok find I FOUND         T err find I KIND CODE MESSAGE
 * KIND is "server" (the server's error, its code), "network" (the connection failed) or
 * "client" (the driver's own, e.g. no server selectable).
 * and at the end "done ATTEMPTS ACKED ERRORS". It does not judge: the test reads the lines.
 * Exit status 0 unless the arguments or the client could not be set up.
 */
#include <mongoc/mongoc.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *
error_kind (const bson_error_t *error)
{
   if (error->domain == MONGOC_ERROR_SERVER || error->domain == MONGOC_ERROR_WRITE_CONCERN)
      return "server";
   if (error->domain == MONGOC_ERROR_STREAM)
      return "network";
   return "client";
}

static int64_t
now_ms (void)
{
   struct timespec ts;
   clock_gettime (CLOCK_MONOTONIC, &ts);
   return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int
main (int argc, char **argv)
{
   mongoc_client_pool_t *pool = NULL;
   mongoc_client_t *client = NULL;
   mongoc_uri_t *uri = NULL;
   mongoc_collection_t *coll = NULL;
   bson_error_t error;
   int64_t start, duration, i;
   int64_t acked = 0, errors = 0;
   int rc = 1;

   if (argc != 5 || (strcmp (argv[4], "single") != 0 && strcmp (argv[4], "pooled") != 0)) {
      fprintf (stderr, "usage: failover-loop URI DATABASE DURATION_MS single|pooled\n");
      return 2;
   }
   duration = strtoll (argv[3], NULL, 10);
   mongoc_init ();
   uri = mongoc_uri_new_with_error (argv[1], &error);
   if (!uri) {
      fprintf (stderr, "failover-loop: bad URI %s: %s\n", argv[1], error.message);
      goto done;
   }
   if (strcmp (argv[4], "pooled") == 0) {
      pool = mongoc_client_pool_new (uri);
      if (!pool || !mongoc_client_pool_set_error_api (pool, MONGOC_ERROR_API_VERSION_2))
         goto done;
      client = mongoc_client_pool_pop (pool);
   } else {
      client = mongoc_client_new_from_uri (uri);
      if (!client || !mongoc_client_set_error_api (client, MONGOC_ERROR_API_VERSION_2))
         goto done;
   }
   coll = mongoc_client_get_collection (client, argv[2], "items");
   setvbuf (stdout, NULL, _IOLBF, 0);
   start = now_ms ();
   for (i = 0; now_ms () - start < duration; i++) {
      bson_t *doc = BCON_NEW ("_id", BCON_INT64 (i));
      int64_t t = now_ms () - start;
      if (mongoc_collection_insert_one (coll, doc, NULL, NULL, &error)) {
         printf ("%" PRId64 " ack insert %" PRId64 "\n", t, i);
         acked++;
      } else {
         printf ("%" PRId64 " err insert %" PRId64 " %s %u %s\n", t, i, error_kind (&error), error.code, error.message);
         errors++;
      }
      {
         const bson_t *found = NULL;
         mongoc_cursor_t *cursor;
         bool got;

         t = now_ms () - start;
         cursor = mongoc_collection_find_with_opts (coll, doc, NULL, NULL);
         got = mongoc_cursor_next (cursor, &found);
         if (mongoc_cursor_error (cursor, &error)) {
            printf ("%" PRId64 " err find %" PRId64 " %s %u %s\n", t, i, error_kind (&error), error.code, error.message);
            errors++;
         } else {
            printf ("%" PRId64 " ok find %" PRId64 " %d\n", t, i, got ? 1 : 0);
         }
         mongoc_cursor_destroy (cursor);
      }
      bson_destroy (doc);
      {
         struct timespec pause = {0, 5 * 1000 * 1000};
         nanosleep (&pause, NULL);
      }
   }
   printf ("done %" PRId64 " %" PRId64 " %" PRId64 "\n", i, acked, errors);
   rc = 0;
done:
   mongoc_collection_destroy (coll);
   if (pool) {
      if (client)
         mongoc_client_pool_push (pool, client);
      mongoc_client_pool_destroy (pool);
   } else {
      mongoc_client_destroy (client);
   }
   mongoc_uri_destroy (uri);
   mongoc_cleanup ();
   return rc;
}
