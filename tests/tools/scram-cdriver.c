/*
 * scram-cdriver.c - mongo-c-driver as a SCRAM client: connects to URI
 * (credentials and authMechanism in it), runs {listDatabases: 1} on admin
 * and prints "ok" or "error DOMAIN CODE MESSAGE" (a refused login is
 * libmongoc's MONGOC_ERROR_CLIENT 1, MONGOC_ERROR_CLIENT_AUTHENTICATE 11).
 * libmongoc authenticates the connection first, speculatively in its
 * handshake where the server allows.  Built and run by
 * tests/integration/proxy/scram-server.test.js; a test tool, never
 * installed.
 *
 *   scram-cdriver URI
 */
#include <stdio.h>

#include <mongoc/mongoc.h>

int
main (int argc, char **argv)
{
   mongoc_client_t *client = NULL;
   mongoc_uri_t *uri = NULL;
   bson_error_t error;
   bson_t reply;
   bson_t *cmd = BCON_NEW ("listDatabases", BCON_INT32 (1));
   int rc = 2;

   if (argc != 2) {
      fprintf (stderr, "usage: scram-cdriver URI\n");
      goto done;
   }
   mongoc_init ();
   mongoc_log_set_handler (NULL, NULL); /* its debug lines would go to stdout */
   uri = mongoc_uri_new_with_error (argv[1], &error);
   if (!uri) {
      fprintf (stderr, "scram-cdriver: %s\n", error.message);
      goto done;
   }
   client = mongoc_client_new_from_uri (uri);
   if (mongoc_client_command_simple (client, "admin", cmd, NULL, &reply, &error)) {
      printf ("ok\n");
      rc = 0;
   } else {
      printf ("error %u %u %s\n", error.domain, error.code, error.message);
      rc = 1;
   }
   bson_destroy (&reply);
   mongoc_client_destroy (client);
   mongoc_uri_destroy (uri);
   mongoc_cleanup ();

done:
   bson_destroy (cmd);
   return rc;
}
