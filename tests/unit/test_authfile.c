/*
 * test_authfile.c - the auth file: entries, comments, a user's two lines,
 * every parse error with its line number from a table, the permission
 * check, lookups, formatting and the strict base64.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/authfile.h"

/* Valid fields (RFC 7677's user and the MongoDB specification's SCRAM-SHA-1 user). */
#define SALT256 "W22ZaJ0SNY7soEsUEjb6gQ=="
#define KEYS256 "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
#define SALT1 "rQ9ZY3MntBeuP3E1TDVC4w=="
#define KEYS1 "p5z6n7Utqf+pLBkaeJk4T3eBOOA=:lRrVHyqMX+OOqGvpcvv9anlA8IQ="
#define LINE256(name) name ":SCRAM-SHA-256:4096:" SALT256 ":" KEYS256 "\n"
#define LINE1(name) name ":SCRAM-SHA-1:10000:" SALT1 ":" KEYS1 "\n"

static authfile_t *
parse (const char *text, bson_error_t *error)
{
   return authfile_parse (text, strlen (text), "users.auth", error);
}

static void
test_valid_file (void **state)
{
   (void) state;
   bson_error_t error;
   const char *text = "# users of the proxy\n"
                      "\n"
                      "   # indented comment\n" LINE256 ("user") LINE1 ("user") LINE256 ("app:reports") "\t\n"
                      "zed:SCRAM-SHA-1:4096:" SALT1 ":" KEYS1 "\r\n";
   authfile_t *af = parse (text, &error);
   const authfile_user_t *u;

   if (!af)
      fail_msg ("%s", error.message);
   assert_int_equal (authfile_count (af), 3);

   u = authfile_lookup (af, "user", 4);
   assert_non_null (u);
   assert_true (u->keys[AUTHFILE_SCRAM_SHA_256].present);
   assert_true (u->keys[AUTHFILE_SCRAM_SHA_1].present);
   assert_int_equal (u->keys[AUTHFILE_SCRAM_SHA_256].iterations, 4096);
   assert_int_equal (u->keys[AUTHFILE_SCRAM_SHA_1].iterations, 10000);
   assert_int_equal (u->keys[AUTHFILE_SCRAM_SHA_256].salt_len, 16);
   assert_int_equal (u->line[AUTHFILE_SCRAM_SHA_256], 4);
   assert_int_equal (u->line[AUTHFILE_SCRAM_SHA_1], 5);
   assert_int_equal (u->keys[AUTHFILE_SCRAM_SHA_256].stored_key[0], 0x58); /* 'WG5d' */

   /* A name holding a colon: the last five fields are split off. */
   u = authfile_lookup (af, "app:reports", 11);
   assert_non_null (u);
   assert_false (u->keys[AUTHFILE_SCRAM_SHA_1].present);
   /* CRLF line ends. */
   assert_non_null (authfile_lookup (af, "zed", 3));

   assert_null (authfile_lookup (af, "use", 3));
   assert_null (authfile_lookup (af, "users", 5));
   assert_null (authfile_lookup (af, "User", 4));
   assert_null (authfile_lookup (af, "us\0r", 4));
   assert_null (authfile_lookup (NULL, "user", 4));
   /* In name order. */
   assert_string_equal (authfile_user_at (af, 0)->name, "app:reports");
   assert_string_equal (authfile_user_at (af, 2)->name, "zed");
   assert_null (authfile_user_at (af, 3));

   /* Formatting gives back the same lines (SCRAM-SHA-256 first). */
   char *lines = authfile_format_user (authfile_lookup (af, "user", 4));
   assert_string_equal (lines, LINE256 ("user") LINE1 ("user"));
   bson_free (lines);
   authfile_destroy (af);
   authfile_destroy (NULL);

   /* An empty file is valid and has no users. */
   af = parse ("# nobody yet\n", &error);
   assert_non_null (af);
   assert_int_equal (authfile_count (af), 0);
   assert_null (authfile_lookup (af, "user", 4));
   authfile_destroy (af);
}

static void
test_errors (void **state)
{
   (void) state;
   static const struct {
      const char *text;
      int code;
      const char *words;
   } table[] = {
      {"# c\nuser:SCRAM-SHA-256:4096:" SALT256 "\n", AUTHFILE_ERR_SYNTAX, "users.auth:2: expected NAME:MECHANISM"},
      {"user\n", AUTHFILE_ERR_SYNTAX, "users.auth:1: expected"},
      {LINE256 ("user") "user:SCRAM-SHA-512:4096:" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX,
       "users.auth:2: unknown mechanism 'SCRAM-SHA-512'"},
      {"user:PLAIN:4096:" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, ":1: unknown mechanism"},
      {"user:SCRAM-SHA-256:4095:" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX,
       ":1: iteration count 4095 is outside 4096..10000000"},
      {"user:SCRAM-SHA-1:100:" SALT1 ":" KEYS1 "\n", AUTHFILE_ERR_SYNTAX, ":1: iteration count 100"},
      {"user:SCRAM-SHA-256:99999999:" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, "iteration count"},
      {"user:SCRAM-SHA-256:4k:" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, ":1: iteration count is not a decimal"},
      {"user:SCRAM-SHA-256::" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, "not a decimal"},
      {"user:SCRAM-SHA-256:4096:W22ZaJ0SNY7soEsUEjb6gQ=:" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, ":1: salt is not base64"},
      {"user:SCRAM-SHA-256:4096::" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, "salt is not base64"},
      {"user:SCRAM-SHA-256:4096:" SALT256 ":WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4q!=:"
       "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=\n",
       AUTHFILE_ERR_SYNTAX, ":1: stored key is not valid base64"},
      /* A SCRAM-SHA-1 key (20 bytes) on a SCRAM-SHA-256 line. */
      {"user:SCRAM-SHA-256:4096:" SALT256 ":" KEYS1 "\n", AUTHFILE_ERR_SYNTAX,
       ":1: stored key is 20 bytes, SCRAM-SHA-256 needs 32"},
      {"user:SCRAM-SHA-1:4096:" SALT1 ":p5z6n7Utqf+pLBkaeJk4T3eBOOA=:" "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=\n",
       AUTHFILE_ERR_SYNTAX, ":1: server key is 32 bytes, SCRAM-SHA-1 needs 20"},
      {"user:SCRAM-SHA-256:4096:" SALT256 ": " KEYS256 "\n", AUTHFILE_ERR_SYNTAX, "stored key is not valid base64"},
      {":SCRAM-SHA-256:4096:" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, ":1: user name is empty"},
      {"us\ter:SCRAM-SHA-256:4096:" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, ":1: user name holds a control"},
      {"us\xffr:SCRAM-SHA-256:4096:" SALT256 ":" KEYS256 "\n", AUTHFILE_ERR_SYNTAX, ":1: user name is not valid UTF-8"},
      {"\n\n" LINE256 ("user") LINE1 ("user") "\n" LINE256 ("user"), AUTHFILE_ERR_DUPLICATE,
       "users.auth:6: duplicate SCRAM-SHA-256 entry for user 'user' (first on line 3)"},
      {LINE1 ("b") LINE1 ("a") LINE1 ("b"), AUTHFILE_ERR_DUPLICATE,
       ":3: duplicate SCRAM-SHA-1 entry for user 'b' (first on line 1)"},
   };

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_error_t error;
      authfile_t *af = parse (table[i].text, &error);
      if (af)
         fail_msg ("accepted #%zu: %s", i, table[i].text);
      if (error.domain != AUTHFILE_ERROR_DOMAIN || (int) error.code != table[i].code ||
          !strstr (error.message, table[i].words))
         fail_msg ("#%zu: got %u '%s', expected %d '%s'", i, error.code, error.message, table[i].code,
                   table[i].words);
      /* Nothing of the keys in the message. */
      assert_null (strstr (error.message, "WG5d8oPm"));
   }
}

static void
test_limits (void **state)
{
   (void) state;
   bson_error_t error;
   char *line = bson_malloc (AUTHFILE_MAX_LINE + 64);
   char name[AUTHFILE_MAX_NAME + 2];

   /* A line beyond the bound (a comment, even). */
   memset (line, 'x', AUTHFILE_MAX_LINE + 1);
   line[0] = '#';
   line[AUTHFILE_MAX_LINE + 1] = '\0';
   char *text = bson_strdup_printf ("\n%s\n", line);
   assert_null (parse (text, &error));
   assert_int_equal (error.code, AUTHFILE_ERR_LIMIT);
   assert_non_null (strstr (error.message, "users.auth:2: line is longer than 1024 bytes"));
   bson_free (text);

   /* A name one byte over the bound. */
   memset (name, 'n', AUTHFILE_MAX_NAME + 1);
   name[AUTHFILE_MAX_NAME + 1] = '\0';
   text = bson_strdup_printf ("%s:SCRAM-SHA-1:4096:" SALT1 ":" KEYS1 "\n", name);
   assert_null (parse (text, &error));
   assert_non_null (strstr (error.message, "users.auth:1: user name is 257 bytes"));
   bson_free (text);
   /* At the bound it is fine. */
   name[AUTHFILE_MAX_NAME] = '\0';
   text = bson_strdup_printf ("%s:SCRAM-SHA-1:4096:" SALT1 ":" KEYS1 "\n", name);
   authfile_t *af = parse (text, &error);
   assert_non_null (af);
   assert_non_null (authfile_lookup (af, name, AUTHFILE_MAX_NAME));
   authfile_destroy (af);
   bson_free (text);
   bson_free (line);

   assert_true (authfile_name_valid ("a b", &error));
   assert_false (authfile_name_valid (" ab", &error));
   assert_false (authfile_name_valid ("#ab", &error));
   assert_false (authfile_name_valid ("", &error));
}

static void
test_load_permissions (void **state)
{
   (void) state;
   char path[] = "/tmp/test_authfile.XXXXXX";
   int fd = mkstemp (path);
   bson_error_t error;
   authfile_t *af;
   const char *text = LINE256 ("user");

   assert_true (fd >= 0);
   assert_int_equal (write (fd, text, strlen (text)), (ssize_t) strlen (text));
   close (fd);

   assert_int_equal (chmod (path, 0640), 0);
   af = authfile_load (path, &error);
   if (!af)
      fail_msg ("%s", error.message);
   assert_non_null (authfile_lookup (af, "user", 4));
   authfile_destroy (af);

   assert_int_equal (chmod (path, 0644), 0);
   assert_null (authfile_load (path, &error));
   assert_int_equal (error.code, AUTHFILE_ERR_PERMISSIONS);
   assert_non_null (strstr (error.message, "readable or writable by others (mode 644)"));

   assert_int_equal (chmod (path, 0602), 0);
   assert_null (authfile_load (path, &error));
   assert_int_equal (error.code, AUTHFILE_ERR_PERMISSIONS);

   /* Errors of the contents name the path and the line. */
   fd = open (path, O_WRONLY | O_TRUNC);
   assert_true (fd >= 0);
   assert_int_equal (write (fd, "# x\nbad\n", 8), 8);
   close (fd);
   assert_int_equal (chmod (path, 0600), 0);
   assert_null (authfile_load (path, &error));
   char *want = bson_strdup_printf ("%s:2: expected", path);
   assert_non_null (strstr (error.message, want));
   bson_free (want);

   unlink (path);
   assert_null (authfile_load (path, &error));
   assert_int_equal (error.code, AUTHFILE_ERR_IO);
   assert_null (authfile_load ("/tmp", &error));
   assert_int_equal (error.code, AUTHFILE_ERR_IO);
}

static void
test_base64 (void **state)
{
   (void) state;
   static const struct {
      const char *b64;
      const char *raw; /* NULL: refused */
   } table[] = {
      {"", ""},
      {"Zg==", "f"},
      {"Zm8=", "fo"},
      {"Zm9v", "foo"},
      {"Zm9vYmFy", "foobar"},
      {"Zm9vYg==", "foob"},
      {"Zg=", NULL},
      {"Zg", NULL},
      {"Z===", NULL},
      {"Zg==Zg==", NULL},
      {"Zm9v\n", NULL},
      {"Zm 9", NULL},
      {"Zm9-", NULL},
   };

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      uint8_t out[16];
      size_t n;
      bool ok = authfile_b64_decode (table[i].b64, strlen (table[i].b64), out, sizeof out, &n);
      if (!table[i].raw) {
         if (ok)
            fail_msg ("accepted '%s'", table[i].b64);
         continue;
      }
      if (!ok)
         fail_msg ("refused '%s'", table[i].b64);
      assert_int_equal (n, strlen (table[i].raw));
      assert_memory_equal (out, table[i].raw, n);
      char enc[32];
      assert_int_equal (authfile_b64_encode (out, n, enc, sizeof enc), strlen (table[i].b64));
      assert_string_equal (enc, table[i].b64);
   }
   /* The output bound holds. */
   uint8_t small[2];
   size_t n;
   assert_false (authfile_b64_decode ("Zm9v", 4, small, sizeof small, &n));
   assert_true (authfile_b64_decode ("Zm8=", 4, small, sizeof small, &n));
   char tiny[4];
   assert_int_equal (authfile_b64_encode ((const uint8_t *) "foo", 3, tiny, sizeof tiny), 0);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_valid_file),
      cmocka_unit_test (test_errors),
      cmocka_unit_test (test_limits),
      cmocka_unit_test (test_load_permissions),
      cmocka_unit_test (test_base64),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
