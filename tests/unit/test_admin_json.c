/*
 * test_admin_json.c - admin_json_repair (src/admin/http.c): a key or string
 * that is not UTF-8, as the store may hold one, comes out as valid UTF-8
 * (U+FFFD per bad byte) and the JSON encoder accepts the document, while
 * everything valid, numbers and nesting included, is copied unchanged.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "admin/admin_private.h"

static void
test_repair_strings_and_keys (void **state)
{
   bson_t in = BSON_INITIALIZER, out = BSON_INITIALIZER, sub, arr;
   char *json;
   size_t len;

   (void) state;
   BSON_APPEND_UTF8 (&in, "ok", "caf\xc3\xa9");
   /* bson_append_utf8 does not validate: what a store may hand back. */
   bson_append_utf8 (&in, "lastError", -1, "HTTP 400: \xff\xc3(", 13);
   bson_append_utf8 (&in, "bad\xfekey", -1, "v", 1);
   BSON_APPEND_INT64 (&in, "attempts", 3);
   BSON_APPEND_DOCUMENT_BEGIN (&in, "nested", &sub);
   bson_append_utf8 (&sub, "s", -1, "\xed\xa0\x80", 3);
   bson_append_document_end (&in, &sub);
   BSON_APPEND_ARRAY_BEGIN (&in, "list", &arr);
   bson_append_utf8 (&arr, "0", -1, "x\x80", 2);
   bson_append_array_end (&in, &arr);
   assert_null (bson_as_relaxed_extended_json (&in, NULL)); /* what failed before */

   admin_json_repair (&in, &out);
   json = bson_as_relaxed_extended_json (&out, &len);
   assert_non_null (json);
   assert_string_equal (json,
                        "{ \"ok\" : \"caf\xc3\xa9\", \"lastError\" : \"HTTP 400: \xef\xbf\xbd\xef\xbf\xbd(\", "
                        "\"bad\xef\xbf\xbdkey\" : \"v\", \"attempts\" : 3, "
                        "\"nested\" : { \"s\" : \"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\" }, "
                        "\"list\" : [ \"x\xef\xbf\xbd\" ] }");
   bson_free (json);
   bson_destroy (&in);
   bson_destroy (&out);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_repair_strings_and_keys),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
