/*
 * test_transport.c - dispatch/transport.c: the templates of broker
 * subjects ({type}, {key}, the event id without a key, characters a
 * subject may not hold replaced), their validation, and the kind table
 * (which kinds the dispatcher sends itself, and the names of states and
 * outcomes).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dispatch/transport.h"

static const struct {
   const char *tmpl;
   const char *type;
   const char *key; /* NULL: none */
   const char *id;
   const char *bad;
   const char *want;
} expand_cases[] = {
   {"events.{type}", "order.placed.v1", "k1", "e1", " *>", "events.order.placed.v1"},
   {"ev.{type}.{key}", "order", "k1", "e1", " *>", "ev.order.k1"},
   {"ev.{key}", "order", NULL, "evt-9", " *>", "ev.evt-9"},             /* no key: the event id */
   {"ev.{key}", "order", "a b*c>d", "e1", " \t*>", "ev.a_b_c_d"},        /* what a subject cannot hold */
   {"plain", "order", "k", "e", " ", "plain"},                          /* nothing to replace */
   {"{type}{type}", "t", "k", "e", "", "tt"},
   {"a.{other}.{type}", "t", "k", "e", "", "a.{other}.t"},              /* only the two names */
   {"{typ", "t", "k", "e", "", "{typ"},
   {"", "t", "k", "e", "", ""},
   {"x.{key}", "t", "é✓", "e", " ", "x.é✓"},                            /* UTF-8 kept */
};

static void
test_expand (void **state)
{
   (void) state;
   for (size_t i = 0; i < sizeof expand_cases / sizeof expand_cases[0]; i++) {
      store_delivery_t d;
      char *got;

      memset (&d, 0, sizeof d);
      d.event_type = (char *) expand_cases[i].type;
      d.key = (char *) expand_cases[i].key;
      d.event_id = (char *) expand_cases[i].id;
      got = transport_expand (expand_cases[i].tmpl, &d, expand_cases[i].bad);
      assert_string_equal (got, expand_cases[i].want);
      bson_free (got);
   }
}

static void
test_template_valid (void **state)
{
   char why[128];

   (void) state;
   assert_true (transport_template_valid ("events.{type}", why, sizeof why));
   assert_true (transport_template_valid ("e.{type}.{key}", why, sizeof why));
   assert_true (transport_template_valid ("plain", why, sizeof why));
   assert_false (transport_template_valid ("e.{id}", why, sizeof why));
   assert_non_null (strstr (why, "only {type} and {key}"));
   assert_false (transport_template_valid ("e.{type", why, sizeof why));
}

static void
test_kinds (void **state)
{
   config_handler_t h;

   (void) state;
   assert_true (transport_kind_dispatched (HANDLER_KIND_WEBHOOK));
   assert_true (transport_kind_dispatched (HANDLER_KIND_NATS));
   assert_true (transport_kind_dispatched (HANDLER_KIND_RABBITMQ));
   assert_false (transport_kind_dispatched (HANDLER_KIND_PULL));
   memset (&h, 0, sizeof h);
   h.kind_id = HANDLER_KIND_WEBHOOK;
   assert_ptr_equal (transport_ops_for (&h), &transport_webhook_ops);
   h.kind_id = HANDLER_KIND_PULL;
   assert_null (transport_ops_for (&h));
   assert_string_equal (transport_state_name (TRANSPORT_STATE_CONNECTED), "connected");
   assert_string_equal (transport_state_name (TRANSPORT_STATE_DISCONNECTED), "disconnected");
   assert_string_equal (transport_state_name (TRANSPORT_STATE_NONE), "none");
   assert_string_equal (transport_outcome_name (TRANSPORT_OUTCOME_DEAD), "dead");
}

/* A pull handler has no transport: transport_new says so. */
static void
test_new_refuses_pull (void **state)
{
   config_handler_t h;
   transport_env_t env = {0};
   bson_error_t err;

   (void) state;
   memset (&h, 0, sizeof h);
   h.name = "p";
   h.kind = "pull";
   h.kind_id = HANDLER_KIND_PULL;
   assert_null (transport_new (&env, &h, &err));
   assert_int_equal (err.code, TRANSPORT_ERROR_KIND);
   assert_non_null (strstr (err.message, "not dispatched by the proxy"));
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_expand),
      cmocka_unit_test (test_template_valid),
      cmocka_unit_test (test_kinds),
      cmocka_unit_test (test_new_refuses_pull),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
