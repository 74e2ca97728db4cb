/*
 * test_handshake.c - the mongos persona: hello request and reply rewriting
 * and compression negotiation, driven by tables of documents.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec/compress.h"
#include "codec/handshake.h"

static bson_t *
json (const char *text)
{
   bson_error_t error;
   bson_t *b = bson_new_from_json ((const uint8_t *) text, -1, &error);

   if (!b)
      fail_msg ("bad test JSON: %s: %s", error.message, text);
   return b;
}

/* The keys of `doc`, comma separated, in order. */
static void
keys_of (const bson_t *doc, char *out, size_t len)
{
   bson_iter_t it;
   out[0] = '\0';
   assert_true (bson_iter_init (&it, doc));
   while (bson_iter_next (&it)) {
      if (out[0])
         strncat (out, ",", len - strlen (out) - 1);
      strncat (out, bson_iter_key (&it), len - strlen (out) - 1);
   }
}

/* A replica-set primary's hello reply, as mongod-behaviour.md lists it. */
static const char *const rs_primary_reply =
   "{\"helloOk\": true,"
   " \"topologyVersion\": {\"processId\": {\"$oid\": \"65a000000000000000000001\"}, \"counter\": {\"$numberLong\": \"0\"}},"
   " \"hosts\": [\"db1:27017\", \"db2:27017\"], \"setName\": \"rs0\", \"setVersion\": 1,"
   " \"isWritablePrimary\": true, \"secondary\": false, \"primary\": \"db1:27017\", \"me\": \"db1:27017\","
   " \"electionId\": {\"$oid\": \"7fffffff0000000000000001\"},"
   " \"lastWrite\": {\"majorityWriteDate\": {\"$date\": 0}},"
   " \"passives\": [\"db3:27017\"], \"arbiters\": [\"db4:27017\"], \"tags\": {\"dc\": \"a\"},"
   " \"maxBsonObjectSize\": 16777216, \"maxMessageSizeBytes\": 48000000, \"maxWriteBatchSize\": 100000,"
   " \"localTime\": {\"$date\": 0}, \"logicalSessionTimeoutMinutes\": 30,"
   " \"connectionId\": 42, \"minWireVersion\": 0, \"maxWireVersion\": 21, \"readOnly\": false,"
   " \"saslSupportedMechs\": [\"SCRAM-SHA-256\"],"
   " \"speculativeAuthenticate\": {\"conversationId\": 1, \"done\": false, \"payload\": {\"$binary\": {\"base64\": \"AAAA\", \"subType\": \"00\"}}},"
   " \"compression\": [\"zstd\"],"
   " \"ok\": 1.0, \"$clusterTime\": {\"clusterTime\": {\"$timestamp\": {\"t\": 1, \"i\": 1}}}, "
   " \"operationTime\": {\"$timestamp\": {\"t\": 1, \"i\": 1}}}";

static void
test_reply_rewrite_rs_primary (void **state)
{
   bson_t *in = json (rs_primary_reply);
   handshake_compression_t comp = {.ids = {COMPRESS_ZLIB, COMPRESS_SNAPPY}, .n = 2, .requested = true};
   bson_t out;
   bson_error_t error;
   char keys[1024];
   bson_iter_t it, child;

   assert_true (handshake_rewrite_reply (in, &comp, NULL, &out, &error));
   keys_of (&out, keys, sizeof keys);
   /* Identity gone, persona added before ok, everything else kept in order. */
   assert_string_equal (keys,
                        "helloOk,isWritablePrimary,maxBsonObjectSize,maxMessageSizeBytes,maxWriteBatchSize,"
                        "localTime,logicalSessionTimeoutMinutes,connectionId,minWireVersion,maxWireVersion,"
                        "readOnly,saslSupportedMechs,speculativeAuthenticate,msg,compression,ok,"
                        "$clusterTime,operationTime");
   assert_true (bson_iter_init_find (&it, &out, "msg"));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "isdbgrid");
   /* compression is the proxy's choice, not the upstream's. */
   assert_true (bson_iter_init_find (&it, &out, "compression"));
   assert_true (bson_iter_recurse (&it, &child));
   assert_true (bson_iter_next (&child));
   assert_string_equal (bson_iter_utf8 (&child, NULL), "zlib");
   assert_true (bson_iter_next (&child));
   assert_string_equal (bson_iter_utf8 (&child, NULL), "snappy");
   assert_false (bson_iter_next (&child));
   /* Types survive: connectionId stays int32, limits untouched. */
   assert_true (bson_iter_init_find (&it, &out, "connectionId"));
   assert_true (BSON_ITER_HOLDS_INT32 (&it));
   assert_int_equal (bson_iter_int32 (&it), 42);
   assert_true (bson_iter_init_find (&it, &out, "maxWireVersion"));
   assert_int_equal (bson_iter_int32 (&it), 21);
   assert_true (bson_iter_init_find (&it, &out, "speculativeAuthenticate"));
   assert_true (BSON_ITER_HOLDS_DOCUMENT (&it));
   bson_destroy (&out);
   bson_destroy (in);
}

static void
test_reply_without_compression (void **state)
{
   bson_t *in = json ("{\"ismaster\": true, \"setName\": \"rs0\", \"maxWireVersion\": 17, \"ok\": 1}");
   handshake_compression_t none = {0};
   bson_t out;
   bson_error_t error;
   char keys[256];

   assert_true (handshake_rewrite_reply (in, &none, NULL, &out, &error));
   keys_of (&out, keys, sizeof keys);
   assert_string_equal (keys, "ismaster,maxWireVersion,msg,ok");
   bson_destroy (&out);
   bson_destroy (in);
}

static void
test_reply_from_mongos_not_duplicated (void **state)
{
   /* Upstream already a mongos: one msg, not two. */
   bson_t *in = json ("{\"isWritablePrimary\": true, \"msg\": \"isdbgrid\", \"ok\": 1}");
   handshake_compression_t none = {0};
   bson_t out;
   bson_error_t error;
   char keys[256];

   assert_true (handshake_rewrite_reply (in, &none, NULL, &out, &error));
   keys_of (&out, keys, sizeof keys);
   assert_string_equal (keys, "isWritablePrimary,msg,ok");
   bson_destroy (&out);
   bson_destroy (in);
}

static void
test_reply_error_unchanged (void **state)
{
   const char *text = "{\"ok\": 0, \"errmsg\": \"x\", \"code\": 11600, \"codeName\": \"InterruptedAtShutdown\", \"setName\": \"rs0\"}";
   bson_t *in = json (text);
   handshake_compression_t comp = {.ids = {COMPRESS_ZLIB}, .n = 1, .requested = true};
   bson_t out;
   bson_error_t error;

   assert_true (handshake_rewrite_reply (in, &comp, NULL, &out, &error));
   assert_int_equal (out.len, in->len);
   assert_memory_equal (bson_get_data (&out), bson_get_data (in), in->len);
   bson_destroy (&out);
   bson_destroy (in);
}

static void
test_reply_without_ok_unchanged (void **state)
{
   bson_t *in = json ("{\"isWritablePrimary\": true, \"hosts\": [\"a:1\"]}");
   handshake_compression_t none = {0};
   bson_t out;
   bson_error_t error;
   char keys[256];

   /* No ok: not a success, so copied unchanged. */
   assert_true (handshake_rewrite_reply (in, &none, NULL, &out, &error));
   keys_of (&out, keys, sizeof keys);
   assert_string_equal (keys, "isWritablePrimary,hosts");
   bson_destroy (&out);
   bson_destroy (in);
}

/* A driver in load-balanced mode: the proxy's serviceId after msg, an
 * upstream's own serviceId (a mongos reached through its load-balancer
 * port) removed; without a service id, the reply a driver that did not ask
 * gets, with no serviceId at all. */
static void
test_reply_service_id (void **state)
{
   bson_t *in = json ("{\"isWritablePrimary\": true, \"setName\": \"rs0\", \"maxWireVersion\": 21,"
                      " \"serviceId\": {\"$oid\": \"65a0000000000000000000ff\"}, \"connectionId\": 7, \"ok\": 1}");
   handshake_compression_t comp = {.ids = {COMPRESS_ZSTD}, .n = 1, .requested = true};
   bson_oid_t sid;
   bson_t out;
   bson_error_t error;
   char keys[256];
   bson_iter_t it;

   (void) state;
   bson_oid_init_from_string (&sid, "65a000000000000000000001");
   assert_true (handshake_rewrite_reply (in, &comp, &sid, &out, &error));
   keys_of (&out, keys, sizeof keys);
   assert_string_equal (keys, "isWritablePrimary,maxWireVersion,connectionId,msg,serviceId,compression,ok");
   assert_true (bson_iter_init_find (&it, &out, "serviceId"));
   assert_true (BSON_ITER_HOLDS_OID (&it));
   assert_true (bson_oid_equal (bson_iter_oid (&it), &sid));
   bson_destroy (&out);
   assert_true (handshake_rewrite_reply (in, &comp, NULL, &out, &error));
   keys_of (&out, keys, sizeof keys);
   assert_string_equal (keys, "isWritablePrimary,maxWireVersion,connectionId,msg,compression,ok");
   bson_destroy (&out);
   bson_destroy (in);
   /* A refused hello stays as the server wrote it, serviceId or not. */
   in = json ("{\"ok\": 0, \"errmsg\": \"x\", \"code\": 11600}");
   assert_true (handshake_rewrite_reply (in, &comp, &sid, &out, &error));
   assert_int_equal (out.len, in->len);
   assert_memory_equal (bson_get_data (&out), bson_get_data (in), in->len);
   bson_destroy (&out);
   bson_destroy (in);
}

static void
test_wants_load_balanced (void **state)
{
   static const struct {
      const char *hello;
      bool wants;
   } table[] = {
      {"{\"hello\": 1, \"loadBalanced\": true}", true},
      {"{\"hello\": 1, \"loadBalanced\": false}", false},
      {"{\"hello\": 1}", false},
      {"{\"isMaster\": 1, \"loadBalanced\": 1}", true},
      {"{\"hello\": 1, \"loadBalanced\": 0}", false},
      {"{\"hello\": 1, \"loadBalanced\": 0.5}", true},
      {"{\"hello\": 1, \"loadBalanced\": \"true\"}", false},
      {"{\"hello\": 1, \"loadBalanced\": null}", false},
      {"{\"hello\": 1, \"loadbalanced\": true}", false},
   };

   (void) state;
   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_t *hello = json (table[i].hello);
      if (handshake_wants_load_balanced (hello) != table[i].wants)
         fail_msg ("case %zu (%s): expected %d", i, table[i].hello, table[i].wants);
      bson_destroy (hello);
   }
}

/* Compression negotiation: the client's list in its order, intersected with
 * what the proxy offers and implements. */
static const struct {
   const char *hello;
   const char *offered;
   int ids[HANDSHAKE_MAX_COMPRESSORS];
   int n;
   bool requested;
} negotiate_table[] = {
   {"{\"hello\": 1}", "snappy,zlib,zstd", {0}, 0, false},
   {"{\"hello\": 1, \"compression\": []}", "snappy,zlib,zstd", {0}, 0, true},
   {"{\"hello\": 1, \"compression\": [\"zstd\", \"zlib\"]}", "snappy,zlib,zstd", {COMPRESS_ZSTD, COMPRESS_ZLIB}, 2, true},
   {"{\"hello\": 1, \"compression\": [\"zlib\", \"zstd\"]}", "zstd", {COMPRESS_ZSTD}, 1, true},
   {"{\"hello\": 1, \"compression\": [\"zlib\", \"zstd\"]}", "", {0}, 0, true},
   {"{\"hello\": 1, \"compression\": [\"lz4\", \"snappy\", \"noop\"]}", "snappy, zlib", {COMPRESS_SNAPPY}, 1, true},
   {"{\"hello\": 1, \"compression\": [\"zlib\", \"zlib\", 7]}", "zlib", {COMPRESS_ZLIB}, 1, true},
   {"{\"hello\": 1, \"compression\": \"zlib\"}", "zlib", {0}, 0, true},
   {"{\"hello\": 1, \"compression\": [\"ZLIB\"]}", "zlib", {0}, 0, true},
};

static void
test_negotiate_table (void **state)
{
   for (size_t i = 0; i < sizeof negotiate_table / sizeof negotiate_table[0]; i++) {
      bson_t *hello = json (negotiate_table[i].hello);
      handshake_compression_t out;

      handshake_negotiate (hello, negotiate_table[i].offered, &out);
      if (out.n != negotiate_table[i].n || out.requested != negotiate_table[i].requested)
         fail_msg ("case %zu (%s / %s): got n=%d requested=%d", i, negotiate_table[i].hello,
                   negotiate_table[i].offered, out.n, out.requested);
      for (int k = 0; k < out.n; k++)
         assert_int_equal (out.ids[k], negotiate_table[i].ids[k]);
      bson_destroy (hello);
   }
}

static void
test_request_rewrite (void **state)
{
   /* loadBalanced goes up as the client sent it: a server ignores it off
    * a load-balancer port, and the reply's serviceId is the proxy's. */
   bson_t *in = json ("{\"hello\": 1, \"helloOk\": true, \"client\": {\"driver\": {\"name\": \"x\"}},"
                      " \"compression\": [\"zlib\"], \"saslSupportedMechs\": \"admin.u\", \"loadBalanced\": true,"
                      " \"speculativeAuthenticate\": {\"saslStart\": 1}, \"$db\": \"admin\"}");
   bson_t out;
   bson_error_t error;
   char keys[256];

   assert_true (handshake_rewrite_request (in, false, &out, &error));
   keys_of (&out, keys, sizeof keys);
   assert_string_equal (keys, "hello,helloOk,client,saslSupportedMechs,loadBalanced,speculativeAuthenticate,$db");
   bson_destroy (&out);
   bson_destroy (in);
}

/* An awaitable hello (a driver that took a member's topologyVersion from a
 * relayed not-primary error) goes upstream as a plain one: answered at
 * once, never held for maxAwaitTimeMS. */
static void
test_request_rewrite_awaitable (void **state)
{
   bson_t *in = json ("{\"hello\": 1, \"topologyVersion\": {\"processId\": {\"$oid\": \"650000000000000000000001\"},"
                      " \"counter\": {\"$numberLong\": \"3\"}}, \"maxAwaitTimeMS\": 10000, \"$db\": \"admin\"}");
   bson_t out;
   bson_error_t error;
   char keys[256];

   (void) state;
   assert_true (handshake_rewrite_request (in, false, &out, &error));
   keys_of (&out, keys, sizeof keys);
   assert_string_equal (keys, "hello,$db");
   bson_destroy (&out);
   bson_destroy (in);
}

static void
test_request_rewrite_legacy (void **state)
{
   bson_t *in = json ("{\"isMaster\": 1, \"helloOk\": true, \"compression\": [\"zlib\"], \"$readPreference\": {\"mode\": \"primary\"}}");
   bson_t out;
   bson_error_t error;
   char keys[256];
   bson_iter_t it;

   assert_true (handshake_rewrite_request (in, true, &out, &error));
   keys_of (&out, keys, sizeof keys);
   assert_string_equal (keys, "isMaster,helloOk,$db");
   assert_true (bson_iter_init_find (&it, &out, "$db"));
   assert_string_equal (bson_iter_utf8 (&it, NULL), "admin");
   bson_destroy (&out);
   bson_destroy (in);
}

static void
test_unwrap_query (void **state)
{
   bson_t *wrapped = json ("{\"$query\": {\"ismaster\": 1}, \"$readPreference\": {\"mode\": \"primaryPreferred\"}}");
   bson_t *plain = json ("{\"isMaster\": 1}");
   bson_t cmd;
   bson_iter_t it;

   assert_true (handshake_unwrap_query (wrapped, &cmd));
   assert_true (bson_iter_init (&it, &cmd) && bson_iter_next (&it));
   assert_string_equal (bson_iter_key (&it), "ismaster");
   assert_true (handshake_unwrap_query (plain, &cmd));
   assert_true (bson_iter_init (&it, &cmd) && bson_iter_next (&it));
   assert_string_equal (bson_iter_key (&it), "isMaster");
   bson_destroy (wrapped);
   bson_destroy (plain);
}

static void
test_is_hello (void **state)
{
   assert_true (handshake_is_hello ("hello"));
   assert_true (handshake_is_hello ("isMaster"));
   assert_true (handshake_is_hello ("ismaster"));
   assert_false (handshake_is_hello ("ISMASTER"));
   assert_false (handshake_is_hello ("helloX"));
   assert_false (handshake_is_hello (""));
   assert_false (handshake_is_hello (NULL));
}

/* Which authentication documents ask for MONGODB-X509, and what the
 * forwarded hello keeps of its speculativeAuthenticate. */
static void
test_x509_table (void **state)
{
   static const struct {
      const char *doc;
      bool x509;
   } table[] = {
      {"{\"authenticate\": 1, \"mechanism\": \"MONGODB-X509\", \"$db\": \"$external\"}", true},
      {"{\"authenticate\": 1, \"mechanism\": \"mongodb-x509\", \"user\": \"CN=x\"}", true},
      {"{\"authenticate\": 1, \"mechanism\": \"MONGODB-X509 \"}", false},
      {"{\"authenticate\": 1, \"mechanism\": 509}", false},
      {"{\"authenticate\": 1}", false},
      {"{\"saslStart\": 1, \"mechanism\": \"SCRAM-SHA-256\", \"db\": \"admin\"}", false},
      {"{\"saslStart\": 1, \"mechanism\": \"MONGODB-AWS\"}", false},
   };

   for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
      bson_t *doc = json (table[i].doc);
      bson_t *hello = bson_new ();
      bson_t out;
      bson_error_t error;
      char keys[256];

      assert_int_equal (handshake_is_x509_auth (doc), table[i].x509);
      BSON_APPEND_INT32 (hello, "hello", 1);
      BSON_APPEND_DOCUMENT (hello, "speculativeAuthenticate", doc);
      BSON_APPEND_UTF8 (hello, "$db", "admin");
      assert_int_equal (handshake_speculative_x509 (hello), table[i].x509);
      assert_true (handshake_rewrite_request (hello, false, &out, &error));
      keys_of (&out, keys, sizeof keys);
      assert_string_equal (keys, table[i].x509 ? "hello,$db" : "hello,speculativeAuthenticate,$db");
      bson_destroy (&out);
      bson_destroy (hello);
      bson_destroy (doc);
   }
   /* Not a document: nothing to inspect, forwarded as it is. */
   {
      bson_t *hello = json ("{\"hello\": 1, \"speculativeAuthenticate\": \"MONGODB-X509\"}");
      assert_false (handshake_speculative_x509 (hello));
      bson_destroy (hello);
   }
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_reply_rewrite_rs_primary),
      cmocka_unit_test (test_reply_without_compression),
      cmocka_unit_test (test_reply_from_mongos_not_duplicated),
      cmocka_unit_test (test_reply_error_unchanged),
      cmocka_unit_test (test_reply_without_ok_unchanged),
      cmocka_unit_test (test_reply_service_id),
      cmocka_unit_test (test_wants_load_balanced),
      cmocka_unit_test (test_negotiate_table),
      cmocka_unit_test (test_request_rewrite),
      cmocka_unit_test (test_request_rewrite_awaitable),
      cmocka_unit_test (test_request_rewrite_legacy),
      cmocka_unit_test (test_unwrap_query),
      cmocka_unit_test (test_is_hello),
      cmocka_unit_test (test_x509_table),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
