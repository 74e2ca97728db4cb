/*
 * test_webhook.c - the pure parts of dispatch/webhook.c: Standard Webhooks secrets
 * and signatures (against the specification's published example),
 * Retry-After parsing, status classes, and the lastError kept from a
 * failing answer (always valid UTF-8, cut on a character boundary).  The
 * body and the retry schedule are test_delivery.c's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/utf8.h"
#include "codec/compress.h"
#include "dispatch/webhook.h"

static void
test_secret_decode (void **state)
{
   uint8_t key[WEBHOOK_KEY_MAX];
   size_t len;
   static const struct {
      const char *secret;
      bool ok;
      size_t len;
   } cases[] = {
      {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true, 24},
      {"whsec_AAEC", true, 3},
      {"whsec_AAE=", true, 2},
      {"whsec_AA==", true, 1},
      {"whsec_", false, 0},
      {"whsec_abc", false, 0},     /* not a multiple of 4 */
      {"whsec_ab!d", false, 0},    /* not base64 */
      {"plain-secret", false, 0},  /* not whsec_: refused */
      {"", false, 0},
   };

   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      bool ok = webhook_secret_decode (cases[i].secret, key, &len);
      assert_int_equal (ok, cases[i].ok);
      if (ok)
         assert_int_equal (len, cases[i].len);
   }
   assert_true (webhook_secret_decode ("whsec_AAEC", key, &len));
   assert_int_equal (key[0], 0);
   assert_int_equal (key[1], 1);
   assert_int_equal (key[2], 2);
}

/* The example of the Standard Webhooks specification. */
static void
test_signature_vector (void **state)
{
   uint8_t key[WEBHOOK_KEY_MAX];
   size_t len;
   char sig[WEBHOOK_SIGNATURE_MAX];
   const char *body = "{\"test\": 2432232314}";

   assert_true (webhook_secret_decode ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", key, &len));
   webhook_sign (key, len, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body, strlen (body), sig);
   assert_string_equal (sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
   /* any change of id, timestamp or body changes it */
   webhook_sign (key, len, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265331, body, strlen (body), sig);
   assert_string_not_equal (sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

static void
test_retry_after (void **state)
{
   /* Tue, 15 Nov 1994 08:12:31 GMT = 784887151 */
   const int64_t at = 784887151LL * 1000;
   static const struct {
      const char *value;
      int64_t now;
      bool ok;
      int64_t delay;
   } cases[] = {
      {"120", 0, true, 120000},
      {"  5 ", 0, true, 5000},
      {"0", 0, true, 0},
      {"Tue, 15 Nov 1994 08:12:31 GMT", 784887151LL * 1000 - 30000, true, 30000},
      {"Tuesday, 15-Nov-94 08:12:31 GMT", 784887151LL * 1000 - 1000, true, 1000},
      {"Tue Nov 15 08:12:31 1994", 784887151LL * 1000 - 2000, true, 2000},
      {"Tue, 15 Nov 1994 08:12:31 GMT", 784887151LL * 1000 + 5000, true, 0}, /* past: now */
      {"99999999999999999999", 0, true, WEBHOOK_RETRY_AFTER_MAX_MS},
      {"-5", 0, false, 0},
      {"soon", 0, false, 0},
      {"12abc", 0, false, 0},
      {"", 0, false, 0},
   };

   (void) at;
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      int64_t d = -1;
      bool ok = webhook_parse_retry_after (cases[i].value, cases[i].now, &d);
      assert_int_equal (ok, cases[i].ok);
      if (ok)
         assert_int_equal (d, cases[i].delay);
   }
   {
      int64_t d;
      assert_false (webhook_parse_retry_after (NULL, 0, &d));
   }
}

static void
test_classify (void **state)
{
   static const struct {
      int status;
      bool retry_4xx;
      webhook_outcome_t outcome;
   } cases[] = {
      {200, false, WEBHOOK_OUTCOME_COMPLETE},
      {204, false, WEBHOOK_OUTCOME_COMPLETE},
      {299, false, WEBHOOK_OUTCOME_COMPLETE},
      {0, false, WEBHOOK_OUTCOME_RETRY},
      {500, false, WEBHOOK_OUTCOME_RETRY},
      {502, false, WEBHOOK_OUTCOME_RETRY},
      {503, false, WEBHOOK_OUTCOME_RETRY_AFTER},
      {429, false, WEBHOOK_OUTCOME_RETRY_AFTER},
      {429, true, WEBHOOK_OUTCOME_RETRY_AFTER},
      {400, false, WEBHOOK_OUTCOME_DEAD},
      {404, false, WEBHOOK_OUTCOME_DEAD},
      {400, true, WEBHOOK_OUTCOME_RETRY},
      {301, false, WEBHOOK_OUTCOME_DEAD},
      /* retry_4xx (the default): every answer but a 2xx is retried. */
      {401, true, WEBHOOK_OUTCOME_RETRY},
      {404, true, WEBHOOK_OUTCOME_RETRY},
      {302, true, WEBHOOK_OUTCOME_RETRY},
      {101, true, WEBHOOK_OUTCOME_RETRY},
      {503, true, WEBHOOK_OUTCOME_RETRY_AFTER},
      /* 410 Gone disables the handler, whatever retry_4xx says. */
      {410, true, WEBHOOK_OUTCOME_GONE},
      {410, false, WEBHOOK_OUTCOME_GONE},
   };

   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      assert_int_equal (webhook_classify (cases[i].status, cases[i].retry_4xx), cases[i].outcome);
   assert_string_equal (webhook_outcome_name (WEBHOOK_OUTCOME_RETRY_AFTER), "retry-after");
}

static void
test_header_valid (void **state)
{
   static const struct {
      const char *name, *value;
      bool ok;
   } cases[] = {
      {"X-Tenant", "t1", true},
      {"Authorization", "Bearer abc.def", true},
      {"x_weird!#$%&'*+-.^`|~", "tab\tis fine", true},
      {"X-Empty", "", true},
      {"", "v", false},
      {"X-A:B", "v", false},
      {"X A", "v", false},
      {"X\nInjected", "v", false},
      {"X-Crlf", "a\r\nInjected: 1", false},
      {"X-Lf", "a\nb", false},
      {"X-Del", "a\x7f", false},
      {"Content-Type", "text/plain", false},
      {"webhook-signature", "v1,x", false},
      {"HOST", "evil", false},
      {"Content-Length", "1", false},
      {"\xc3\xa9t\xc3\xa9", "v", false},
      {"X-0123456789012345678901234567890123456789012345678901234567890123", "v", false},
   };
   char big[1100];
   bson_error_t error;

   (void) state;
   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      bool ok = webhook_header_valid (cases[i].name, cases[i].value, &error);
      if (ok != cases[i].ok)
         fail_msg ("header %zu (%s): %s", i, cases[i].name, ok ? "accepted" : error.message);
   }
   memset (big, 'v', sizeof big - 1);
   big[sizeof big - 1] = '\0';
   assert_false (webhook_header_valid ("X-Big", big, &error));
   assert_true (webhook_header_valid ("X-Big", big + 100, &error)); /* 999 bytes */
}

static void
test_proxy_valid (void **state)
{
   bson_error_t error;

   (void) state;
   assert_true (webhook_proxy_valid ("http://127.0.0.1:3128", &error));
   assert_true (webhook_proxy_valid ("https://user:pw@proxy.example:8443", &error));
   assert_true (webhook_proxy_valid ("http://proxy.example", &error));
   assert_false (webhook_proxy_valid ("not a url", &error));
   assert_false (webhook_proxy_valid ("socks5://127.0.0.1:1080", &error));
   assert_false (webhook_proxy_valid ("ftp://proxy.example", &error));
   assert_false (webhook_proxy_valid ("", &error));
}

/* Builds a body of `pad` ASCII bytes followed by `tail`. */
static size_t
padded (char *buf, size_t pad, const char *tail, size_t tail_len)
{
   memset (buf, 'a', pad);
   memcpy (buf + pad, tail, tail_len);
   return pad + tail_len;
}

static void
test_error_text (void **state)
{
   char out[WEBHOOK_ERROR_MAX], body[512], want[512];
   size_t n;

   (void) state;
   webhook_error_text (500, "boom 3", 6, out, sizeof out);
   assert_string_equal (out, "HTTP 500: boom 3");
   webhook_error_text (404, "", 0, out, sizeof out);
   assert_string_equal (out, "HTTP 404");
   webhook_error_text (400, "line1\r\nline2\t\x01\x7f!", 16, out, sizeof out);
   assert_string_equal (out, "HTTP 400: line1  line2   !");

   /* Not UTF-8: each bad byte is U+FFFD (as is a NUL), the rest is kept. */
   webhook_error_text (400, "\xff\xfe ok \xc3\xa9 \xc3 \xed\xa0\x80 z\0y", 18, out, sizeof out);
   assert_string_equal (out, "HTTP 400: \xef\xbf\xbd\xef\xbf\xbd ok \xc3\xa9 \xef\xbf\xbd "
                             "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd z\xef\xbf\xbdy");
   assert_true (utf8_valid (out, strlen (out)));

   /* A 2-byte character at bytes 199-200 straddles the limit: it is left
    * out whole, never cut in two or replaced. */
   n = padded (body, WEBHOOK_ERROR_BODY_MAX - 1, "\xc3\xa9tail", 6);
   webhook_error_text (400, body, n, out, sizeof out);
   memcpy (want, "HTTP 400: ", 10);
   memset (want + 10, 'a', WEBHOOK_ERROR_BODY_MAX - 1);
   want[10 + WEBHOOK_ERROR_BODY_MAX - 1] = '\0';
   assert_string_equal (out, want);
   /* The same with a 4-byte character at 198-201, given only up to 203
    * bytes as the client copies them. */
   n = padded (body, WEBHOOK_ERROR_BODY_MAX - 2, "\xf0\x9f\x98\x80zzzzzz", 10);
   webhook_error_text (400, body, WEBHOOK_ERROR_BODY_MAX + 3, out, sizeof out);
   want[10 + WEBHOOK_ERROR_BODY_MAX - 2] = '\0';
   assert_string_equal (out, want);
   /* One that ends exactly at the limit is kept. */
   n = padded (body, WEBHOOK_ERROR_BODY_MAX - 4, "\xf0\x9f\x98\x80zzz", 7);
   webhook_error_text (400, body, n, out, sizeof out);
   assert_int_equal (strlen (out), 10 + WEBHOOK_ERROR_BODY_MAX);
   assert_memory_equal (out + 10 + WEBHOOK_ERROR_BODY_MAX - 4, "\xf0\x9f\x98\x80", 4);

   /* 203 bytes that are all invalid: replacements fill the room, and the
    * text stays valid UTF-8 within WEBHOOK_ERROR_BODY_MAX bytes. */
   memset (body, 0xff, sizeof body);
   webhook_error_text (502, body, WEBHOOK_ERROR_BODY_MAX + 3, out, sizeof out);
   assert_true (utf8_valid (out, strlen (out)));
   assert_int_equal (strlen (out), 10 + WEBHOOK_ERROR_BODY_MAX / 3 * 3);
   /* A small buffer still ends up valid. */
   webhook_error_text (400, "\xc3\xa9\xc3\xa9\xc3\xa9", 6, out, 14);
   assert_string_equal (out, "HTTP 400: \xc3\xa9");
   webhook_error_text (400, "x", 1, out, 5);
   assert_string_equal (out, "HTTP");
}

/* A `secret` list: one key per secret, in order; each refusal says which
 * secret and why, and never quotes one. */
static void
test_secrets_parse (void **state)
{
   webhook_keys_t keys;
   bson_error_t error;
   char long_secret[6 + 180 + 1];

   assert_true (webhook_secrets_parse ("", &keys, &error));
   assert_int_equal (keys.n, 0);
   assert_true (webhook_secrets_parse ("  \t ", &keys, &error));
   assert_int_equal (keys.n, 0);
   assert_true (webhook_secrets_parse (" whsec_AAEC  whsec_AA==\t", &keys, &error));
   assert_int_equal (keys.n, 2);
   assert_int_equal (keys.len[0], 3);
   assert_int_equal (keys.key[0][2], 2);
   assert_int_equal (keys.len[1], 1);
   assert_true (webhook_secrets_parse (
      "whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA==", &keys, &error));
   assert_int_equal (keys.n, WEBHOOK_SECRETS_MAX);

   static const struct {
      const char *secrets;
      const char *needle;
   } bad[] = {
      {"plainsecretvalue", "secret 1 of the list does not start with whsec_"},
      {"whsec_AAEC WHSEC_AAEC", "secret 2 of the list does not start with whsec_"},
      {"whsec_AAEC whsec_ab!d", "secret 2 of the list is not whsec_ followed by valid base64"},
      {"whsec_abc", "is not whsec_ followed by valid base64"},
      {"whsec_A=AA", "is not whsec_ followed by valid base64"},
      {"whsec_AAEC whsec_", "secret 2 of the list decodes to an empty key"},
      {"whsec_====", "is not whsec_ followed by valid base64"},
      {"whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA==",
       "more than 8 secrets"},
   };
   for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      keys.n = 99;
      assert_false (webhook_secrets_parse (bad[i].secrets, &keys, &error));
      assert_int_equal (keys.n, 0);
      if (!strstr (error.message, bad[i].needle))
         fail_msg ("'%s': '%s' does not contain '%s'", bad[i].secrets, error.message, bad[i].needle);
      assert_null (strstr (error.message, "AAEC"));
      assert_null (strstr (error.message, "plainsecret"));
   }
   /* 180 base64 characters: 135 bytes, longer than WEBHOOK_KEY_MAX. */
   memcpy (long_secret, "whsec_", 6);
   memset (long_secret + 6, 'A', 180);
   long_secret[6 + 180] = '\0';
   assert_false (webhook_secrets_parse (long_secret, &keys, &error));
   assert_non_null (strstr (error.message, "decodes to a key longer than 128 bytes"));
   /* 128 bytes exactly is the limit (171 characters and one '='). */
   memset (long_secret + 6, 'A', 171);
   long_secret[6 + 171] = '=';
   long_secret[6 + 172] = '\0';
   assert_true (webhook_secrets_parse (long_secret, &keys, &error));
   assert_int_equal (keys.len[0], WEBHOOK_KEY_MAX);
}

/* Two secrets: the header holds the signature of each, in the order of
 * the list, space-separated; the first is the specification's vector. */
static void
test_sign_two_secrets (void **state)
{
   webhook_keys_t keys;
   bson_error_t error;
   char header[WEBHOOK_SIGNATURES_MAX];
   char second[WEBHOOK_SIGNATURE_MAX];
   char expected[2 * WEBHOOK_SIGNATURE_MAX];
   const char *body = "{\"test\": 2432232314}";
   const char *id = "msg_p5jXN8AQM9LWM0D4loKWxJek";

   assert_true (webhook_secrets_parse ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_AAEC", &keys, &error));
   webhook_sign_all (&keys, id, 1614265330, body, strlen (body), header);
   webhook_sign ((const uint8_t *) "\x00\x01\x02", 3, id, 1614265330, body, strlen (body), second);
   assert_string_not_equal (second, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
   snprintf (expected, sizeof expected, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= %s", second);
   assert_string_equal (header, expected);
   /* The other order gives the other order. */
   assert_true (webhook_secrets_parse ("whsec_AAEC whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &keys, &error));
   webhook_sign_all (&keys, id, 1614265330, body, strlen (body), header);
   snprintf (expected, sizeof expected, "%s v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", second);
   assert_string_equal (header, expected);
   /* Eight secrets of the longest key fit. */
   assert_true (webhook_secrets_parse (
      "whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AA== whsec_AAEC", &keys, &error));
   webhook_sign_all (&keys, id, 1614265330, body, strlen (body), header);
   assert_int_equal (strlen (header), 8 * 47 + 7);
   /* No key: an empty value. */
   keys.n = 0;
   webhook_sign_all (&keys, id, 1614265330, body, strlen (body), header);
   assert_string_equal (header, "");
}

/* --check-config goes through config parsing: every refused secret is
 * refused there, naming the handler and the key, without the secret. */
static void
test_config_secrets (void **state)
{
   static const char head[] = "[handler hooks]\nkind = webhook\nurl = http://127.0.0.1:1/\nevents = a\n";
   static const struct {
      const char *secret;
      bool ok;
      const char *needle;
   } cases[] = {
      {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true, NULL},
      {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+Pw==", true, NULL},
      /* Standard Webhooks: 24 to 64 bytes, and the message says how to make one. */
      {"whsec_AA==", false, "[handler hooks] secret: secret 1 of the list is 1 byte long; Standard Webhooks secrets are 24 to 64 bytes: make one with  echo \"whsec_$(openssl rand -base64 32)\""},
      {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_AAEC", false, "secret 2 of the list is 3 bytes long; Standard Webhooks secrets are 24 to 64 bytes"},
      {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa==", false, "secret 1 of the list is 22 bytes long"},
      {"whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0A=", false, "secret 1 of the list is 65 bytes long"},
      {"whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX", true, NULL},
      {"plain-secret-bytes", false, "[handler hooks] secret: secret 1 of the list does not start with whsec_"},
      {"whsec_AAEC whsec_Zm9v!", false, "[handler hooks] secret: secret 2 of the list is not whsec_ followed by valid base64"},
      {"whsec_AAEC whsec_", false, "[handler hooks] secret: secret 2 of the list decodes to an empty key"},
      {"whsec_AAEC whsec_AAEC whsec_AAEC whsec_AAEC whsec_AAEC whsec_AAEC whsec_AAEC whsec_AAEC whsec_AAEC",
       false, "[handler hooks] secret: more than 8 secrets"},
   };

   for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      bson_error_t error;
      char *text = bson_strdup_printf ("%ssecret = %s\n", head, cases[i].secret);
      config_t *cfg = config_parse_string (text, "test.ini", &error);

      if (cases[i].ok) {
         if (!cfg)
            fail_msg ("'%s' refused: %s", cases[i].secret, error.message);
         config_release (cfg);
      } else {
         if (cfg)
            fail_msg ("'%s' accepted", cases[i].secret);
         if (!strstr (error.message, cases[i].needle))
            fail_msg ("'%s' does not contain '%s'", error.message, cases[i].needle);
         assert_null (strstr (error.message, "AAEC"));
         assert_null (strstr (error.message, "plain-secret"));
         assert_null (strstr (error.message, "Zm9v"));
      }
      bson_free (text);
   }
   {
      /* Every secret of the list is masked where the config is shown. */
      char *masked = config_mask ("secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_AAEC");
      assert_string_equal (masked, "********");
      bson_free (masked);
   }
}

int
main (void)
{
   /* The checks main.c registers, for test_config_secrets. */
   config_set_checks (&(config_checks_t){compress_offerable, webhook_secrets_valid});
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_secret_decode),
      cmocka_unit_test (test_signature_vector),
      cmocka_unit_test (test_secrets_parse),
      cmocka_unit_test (test_sign_two_secrets),
      cmocka_unit_test (test_config_secrets),
      cmocka_unit_test (test_retry_after),
      cmocka_unit_test (test_classify),
      cmocka_unit_test (test_header_valid),
      cmocka_unit_test (test_proxy_valid),
      cmocka_unit_test (test_error_text),
   };
   return cmocka_run_group_tests_name ("webhook", tests, NULL, NULL);
}
