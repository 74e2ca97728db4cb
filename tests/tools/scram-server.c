/*
 * scram-server.c - one SCRAM conversation of codec/scram.c over standard
 * input and output, so that a real client's messages can be run through
 * the server side (tests/check-scram-clients drives it with pymongo's
 * SCRAM client).  A test tool: never installed.
 *
 *   scram-server AUTHFILE MECHANISM
 *
 * Reads one line per client message (client-first, then client-final),
 * each the message in base64, and answers each with one line:
 * "ok BASE64" (server-first, then server-final) or "error CODE MESSAGE",
 * CODE being the scram_error_code_t.  Exits 0 after server-final, 1 after
 * an error answer, 2 on bad arguments or input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/authfile.h"
#include "codec/scram.h"

#define LINE_MAX_BYTES (4 * SCRAM_MAX_MESSAGE / 3 + 8)

/* Reads a base64 line into msg; false at EOF or on bad input. */
static bool
read_message (uint8_t *msg, size_t cap, size_t *len)
{
   char line[LINE_MAX_BYTES + 2];
   size_t n;

   if (!fgets (line, sizeof line, stdin))
      return false;
   n = strcspn (line, "\r\n");
   line[n] = '\0';
   return authfile_b64_decode (line, n, msg, cap, len);
}

static void
answer_ok (const char *out, size_t len)
{
   char b64[4 * (SCRAM_MAX_MESSAGE / 3 + 2) + 1];

   authfile_b64_encode ((const uint8_t *) out, len, b64, sizeof b64);
   printf ("ok %s\n", b64);
   fflush (stdout);
}

int
main (int argc, char **argv)
{
   authfile_t *users = NULL;
   scram_server_t *conv = NULL;
   authfile_mech_t mech;
   bson_error_t error;
   uint8_t msg[SCRAM_MAX_MESSAGE + 3];
   size_t len, out_len;
   char *out = NULL;
   int rc = 2;

   if (argc != 3 || !authfile_mech_from_name (argv[2], strlen (argv[2]), &mech)) {
      fprintf (stderr, "usage: scram-server AUTHFILE SCRAM-SHA-256|SCRAM-SHA-1\n");
      goto done;
   }
   users = authfile_load (argv[1], &error);
   if (!users) {
      fprintf (stderr, "scram-server: %s\n", error.message);
      goto done;
   }
   conv = scram_server_new (mech);
   if (!read_message (msg, sizeof msg, &len))
      goto done;
   if (!scram_server_first (conv, users, msg, len, &out, &out_len, &error))
      goto refused;
   answer_ok (out, out_len);
   bson_free (out);
   out = NULL;
   if (!read_message (msg, sizeof msg, &len))
      goto done;
   if (!scram_server_final (conv, msg, len, &out, &out_len, &error))
      goto refused;
   answer_ok (out, out_len);
   rc = 0;
   goto done;

refused:
   printf ("error %u %s\n", error.code, error.message);
   rc = 1;

done:
   bson_free (out);
   scram_server_destroy (conv);
   authfile_destroy (users);
   return rc;
}
