/*
 * test_sasl.c - the SASL conversation reader of session mode (codec/sasl.h):
 * the user of SCRAM client-first messages from a table (RFC 5802's
 * escaping of ',' and '=' as "=2C" and "=3D", malformed messages), and the
 * watch's verdicts: a user recorded only when the server's last reply
 * accepts the conversation, a refused conversation recording nothing, a
 * new one replacing the user only on success, pipelined SASL commands
 * losing the watch, a hello's speculativeAuthenticate, logout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "codec/sasl.h"

typedef struct {
   const char *msg;
   const char *user; /* NULL: refused */
} first_case_t;

static const first_case_t first_cases[] = {
   {"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL", "user"},
   {"y,,n=alice,r=abc", "alice"},
   {"n,,n=a=2Cb,r=x", "a,b"},
   {"n,,n=a=3Db,r=x", "a=b"},
   {"n,,n==3D=2C=3D,r=x", "=,="},
   {"n,,n=bob@shop.example,r=x", "bob@shop.example"},
   {"n,a=admin,n=carol,r=x", "carol"}, /* an authzid: the user is still n= */
   {"n,,n=dave", "dave"},              /* no nonce: the server's to refuse */
   {"n,,n=a=2,r=x", NULL},             /* '=' not followed by 2C or 3D */
   {"n,,n=a=,r=x", NULL},
   {"n,,n=a=4Fb,r=x", NULL},
   {"n,,n=,r=x", NULL},  /* empty */
   {"n,,r=x,n=eve", NULL}, /* n= must come first */
   {"n,,", NULL},
   {"x,,n=user,r=x", NULL}, /* no gs2 header */
   {"n", NULL},
   {"", NULL},
   {"n,n=user,r=x", NULL}, /* the gs2 header does not end before n= */
};

static void
test_client_first_table (void **state)
{
   (void) state;
   for (size_t i = 0; i < sizeof first_cases / sizeof first_cases[0]; i++) {
      const first_case_t *t = &first_cases[i];
      char user[SASL_USER_MAX];
      bson_error_t error;
      bool ok = sasl_client_first_user ((const uint8_t *) t->msg, strlen (t->msg), user, sizeof user, &error);

      if (t->user) {
         if (!ok)
            fail_msg ("%s: refused: %s", t->msg, error.message);
         assert_string_equal (user, t->user);
      } else if (ok) {
         fail_msg ("%s: read as '%s', expected a refusal", t->msg, user);
      } else {
         assert_int_equal (error.domain, SASL_ERROR_DOMAIN);
      }
   }
}

static void
test_client_first_bounds (void **state)
{
   char small[4], user[SASL_USER_MAX];
   bson_error_t error;
   const char nul[] = "n,,n=a\0b,r=x";

   (void) state;
   assert_true (sasl_client_first_user ((const uint8_t *) "n,,n=abc,r=x", 12, small, sizeof small, &error));
   assert_string_equal (small, "abc");
   assert_false (sasl_client_first_user ((const uint8_t *) "n,,n=abcd,r=x", 13, small, sizeof small, &error));
   assert_int_equal (error.code, SASL_ERR_TOO_LONG);
   assert_string_equal (small, "");
   /* An escape counts as one byte of the name. */
   assert_true (sasl_client_first_user ((const uint8_t *) "n,,n=a=2Cb,r=x", 14, small, sizeof small, &error));
   assert_false (sasl_client_first_user ((const uint8_t *) nul, sizeof nul - 1, user, sizeof user, &error));
   /* Only `len` bytes are read: the name ends where the message does. */
   assert_true (sasl_client_first_user ((const uint8_t *) "n,,n=alice,r=x", 10, user, sizeof user, &error));
   assert_string_equal (user, "alice");
   assert_false (sasl_client_first_user ((const uint8_t *) "n,,n=a=2", 8, user, sizeof user, &error));
}

/* A saslStart for `user` (SCRAM-SHA-256) as a driver sends it. */
static bson_t *
sasl_start (const char *client_first)
{
   return BCON_NEW ("saslStart", BCON_INT32 (1), "mechanism", BCON_UTF8 ("SCRAM-SHA-256"), "payload",
                    BCON_BIN (BSON_SUBTYPE_BINARY, (const uint8_t *) client_first, (uint32_t) strlen (client_first)),
                    "autoAuthorize", BCON_INT32 (1));
}

static bson_t *
reply (bool ok, bool done)
{
   if (!ok)
      return BCON_NEW ("ok", BCON_DOUBLE (0), "code", BCON_INT32 (18), "errmsg", BCON_UTF8 ("Authentication failed."));
   return BCON_NEW ("conversationId", BCON_INT32 (1), "done", BCON_BOOL (done), "payload",
                    BCON_BIN (BSON_SUBTYPE_BINARY, (const uint8_t *) "v=x", 3), "ok", BCON_DOUBLE (1));
}

/* Runs one SCRAM conversation for client-first `first` in db `db`: start,
 * continue, (empty continue when `two_continues`), the last reply `ok`. */
static void
converse (sasl_watch_t *w, const char *first, const char *db, bool ok)
{
   bson_t *start = sasl_start (first), *cont = BCON_NEW ("saslContinue", BCON_INT32 (1), "conversationId", BCON_INT32 (1));
   bson_t *r1 = reply (true, false), *r2 = reply (ok, ok), *r_mid = reply (true, false);

   assert_true (sasl_watch_request (w, "saslStart", start, db));
   assert_int_equal (w->state, SASL_WATCH_STARTED);
   sasl_watch_reply (w, r1);
   assert_int_equal (w->state, SASL_WATCH_CONVERSING);
   /* Without skipEmptyExchange: one more round whose reply is not done. */
   assert_true (sasl_watch_request (w, "saslContinue", cont, db));
   sasl_watch_reply (w, r_mid);
   assert_int_equal (w->state, SASL_WATCH_CONVERSING);
   assert_true (sasl_watch_request (w, "saslContinue", cont, db));
   sasl_watch_reply (w, r2);
   assert_int_equal (w->state, SASL_WATCH_IDLE);
   bson_destroy (start);
   bson_destroy (cont);
   bson_destroy (r1);
   bson_destroy (r2);
   bson_destroy (r_mid);
}

static void
test_watch_verdicts (void **state)
{
   sasl_watch_t w = {0};

   (void) state;
   assert_string_equal (w.user, "");
   /* Refused: nothing recorded. */
   converse (&w, "n,,n=alice,r=a", "admin", false);
   assert_string_equal (w.user, "");
   /* Accepted. */
   converse (&w, "n,,n=ali=2Cce,r=a", "shop", true);
   assert_string_equal (w.user, "ali,ce");
   assert_string_equal (w.db, "shop");
   /* A refused new conversation keeps the user; an accepted one replaces it. */
   converse (&w, "n,,n=mallory,r=a", "admin", false);
   assert_string_equal (w.user, "ali,ce");
   converse (&w, "n,,n=bob,r=a", "admin", true);
   assert_string_equal (w.user, "bob");
   assert_string_equal (w.db, "admin");
}

static void
test_watch_refused_start (void **state)
{
   sasl_watch_t w = {0};
   bson_t *start = sasl_start ("n,,n=alice,r=a"), *no = reply (false, false);

   (void) state;
   converse (&w, "n,,n=bob,r=a", "admin", true);
   assert_true (sasl_watch_request (&w, "saslStart", start, "admin"));
   sasl_watch_reply (&w, no);
   assert_int_equal (w.state, SASL_WATCH_IDLE);
   assert_string_equal (w.user, "bob");
   bson_destroy (start);
   bson_destroy (no);
}

/* A second SASL command before the first is answered could pair a verdict
 * with another conversation's user: the watch is lost for good. */
static void
test_watch_pipelined (void **state)
{
   sasl_watch_t w = {0};
   bson_t *alice = sasl_start ("n,,n=alice,r=a"), *bob = sasl_start ("n,,n=bob,r=a");
   bson_t *cont = BCON_NEW ("saslContinue", BCON_INT32 (1)), *r1 = reply (true, false), *yes = reply (true, true);

   (void) state;
   converse (&w, "n,,n=bob,r=a", "admin", true);
   assert_true (sasl_watch_request (&w, "saslStart", bob, "admin"));
   sasl_watch_reply (&w, r1);
   assert_true (sasl_watch_request (&w, "saslContinue", cont, "admin"));
   /* alice's start goes before bob's proof is answered. */
   assert_false (sasl_watch_request (&w, "saslStart", alice, "admin"));
   assert_int_equal (w.state, SASL_WATCH_LOST);
   assert_string_equal (w.user, "");
   sasl_watch_reply (&w, yes);
   assert_string_equal (w.user, "");
   /* Nothing is recorded any more. */
   assert_false (sasl_watch_request (&w, "saslStart", bob, "admin"));
   assert_string_equal (w.user, "");
   bson_destroy (alice);
   bson_destroy (bob);
   bson_destroy (cont);
   bson_destroy (r1);
   bson_destroy (yes);
}

static void
test_watch_speculative (void **state)
{
   sasl_watch_t w = {0};
   const char *first = "n,,n=carol,r=a";
   bson_t *spec = BCON_NEW ("saslStart", BCON_INT32 (1), "mechanism", BCON_UTF8 ("SCRAM-SHA-256"), "payload",
                            BCON_BIN (BSON_SUBTYPE_BINARY, (const uint8_t *) first, (uint32_t) strlen (first)), "db",
                            BCON_UTF8 ("admin"));
   bson_t *hello_yes = BCON_NEW ("isWritablePrimary", BCON_BOOL (true), "speculativeAuthenticate", "{",
                                 "conversationId", BCON_INT32 (1), "done", BCON_BOOL (false), "}", "ok", BCON_DOUBLE (1));
   bson_t *hello_no = BCON_NEW ("isWritablePrimary", BCON_BOOL (true), "ok", BCON_DOUBLE (1));
   bson_t *cont = BCON_NEW ("saslContinue", BCON_INT32 (1)), *yes = reply (true, true);

   (void) state;
   /* Declined by the server: nothing changes. */
   assert_true (sasl_watch_hello (&w, spec));
   sasl_watch_hello_reply (&w, hello_no);
   assert_int_equal (w.state, SASL_WATCH_IDLE);
   assert_string_equal (w.user, "");
   /* Taken: the conversation goes on with saslContinue. */
   assert_true (sasl_watch_hello (&w, spec));
   sasl_watch_hello_reply (&w, hello_yes);
   assert_int_equal (w.state, SASL_WATCH_CONVERSING);
   assert_string_equal (w.user, "");
   assert_true (sasl_watch_request (&w, "saslContinue", cont, "admin"));
   sasl_watch_reply (&w, yes);
   assert_string_equal (w.user, "carol");
   assert_string_equal (w.db, "admin");
   bson_destroy (spec);
   bson_destroy (hello_yes);
   bson_destroy (hello_no);
   bson_destroy (cont);
   bson_destroy (yes);
}

static void
test_watch_other_mechanisms (void **state)
{
   sasl_watch_t w = {0};
   const uint8_t plain[] = "\0dave\0secret";
   bson_t *start = BCON_NEW ("saslStart", BCON_INT32 (1), "mechanism", BCON_UTF8 ("PLAIN"), "payload",
                             BCON_BIN (BSON_SUBTYPE_BINARY, plain, (uint32_t) sizeof plain - 1));
   bson_t *gssapi = BCON_NEW ("saslStart", BCON_INT32 (1), "mechanism", BCON_UTF8 ("GSSAPI"), "payload",
                              BCON_BIN (BSON_SUBTYPE_BINARY, (const uint8_t *) "x", 1));
   bson_t *x509 = BCON_NEW ("authenticate", BCON_INT32 (1), "mechanism", BCON_UTF8 ("MONGODB-X509"), "user",
                            BCON_UTF8 ("CN=client,O=relaybus"));
   bson_t *logout = BCON_NEW ("logout", BCON_INT32 (1)), *yes = reply (true, true);
   bson_t *ok = BCON_NEW ("ok", BCON_DOUBLE (1));

   (void) state;
   assert_true (sasl_watch_request (&w, "saslStart", start, "$external"));
   sasl_watch_reply (&w, yes);
   assert_string_equal (w.user, "dave");
   assert_string_equal (w.db, "$external");
   /* Accepted, but whose it is cannot be read: nobody. */
   assert_true (sasl_watch_request (&w, "saslStart", gssapi, "$external"));
   sasl_watch_reply (&w, yes);
   assert_string_equal (w.user, "");
   assert_true (sasl_watch_request (&w, "authenticate", x509, "$external"));
   sasl_watch_reply (&w, ok);
   assert_string_equal (w.user, "CN=client,O=relaybus");
   assert_false (sasl_watch_request (&w, "logout", logout, "admin"));
   assert_string_equal (w.user, "");
   assert_true (sasl_watch_wants ("saslStart") && sasl_watch_wants ("saslContinue") && sasl_watch_wants ("authenticate") &&
                sasl_watch_wants ("logout"));
   assert_false (sasl_watch_wants ("find") || sasl_watch_wants ("sasl") || sasl_watch_wants (NULL));
   bson_destroy (start);
   bson_destroy (gssapi);
   bson_destroy (x509);
   bson_destroy (logout);
   bson_destroy (yes);
   bson_destroy (ok);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_client_first_table),   cmocka_unit_test (test_client_first_bounds),
      cmocka_unit_test (test_watch_verdicts),       cmocka_unit_test (test_watch_refused_start),
      cmocka_unit_test (test_watch_pipelined),      cmocka_unit_test (test_watch_speculative),
      cmocka_unit_test (test_watch_other_mechanisms),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
