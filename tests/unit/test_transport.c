/*
 * test_transport.c - dispatch/transport.c: the templates of broker
 * subjects ({type}, {key}, the event id without a key, characters a
 * subject may not hold replaced), their validation, and the kind table
 * (which kinds the dispatcher sends itself, and the names of states and
 * outcomes), and the queue between the dispatcher and a broker's
 * publishing threads (dispatch/transport_queue.h): bounded, results
 * called back on the base in order, cancels of queued, finished and busy
 * sends, stop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>

#include "dispatch/transport.h"
#include "dispatch/transport_queue.h"

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

/* ------------------------------------------------------------ the queue */

typedef struct {
   tqueue_item_t item;
   int n;
} item_t;

static int freed, called, last_called;
static transport_outcome_t last_outcome;

static void
item_free (tqueue_item_t *it)
{
   freed++;
   bson_free (it);
}

static void
item_done (const transport_result_t *res, void *arg)
{
   called++;
   last_called = ((item_t *) arg)->n;
   last_outcome = res->outcome;
}

static item_t *
item_new (int n)
{
   item_t *it = bson_malloc0 (sizeof *it);
   it->n = n;
   it->item.cb = item_done;
   it->item.arg = it;
   return it;
}

static void
test_queue (void **state)
{
   struct event_base *base = event_base_new ();
   tqueue_t *q = tqueue_new (base, 3, item_free);
   item_t *a = item_new (1), *b = item_new (2), *c = item_new (3), *d = item_new (4);
   tqueue_item_t *got;
   bson_error_t err;

   (void) state;
   freed = called = 0;
   assert_true (tqueue_push (q, &a->item, &err));
   assert_true (tqueue_push (q, &b->item, &err));
   assert_true (tqueue_push (q, &c->item, &err));
   /* Bounded: a fourth is refused, and nothing is queued. */
   assert_false (tqueue_push (q, &d->item, &err));
   assert_int_equal (err.code, TRANSPORT_ERROR_SEND);
   assert_non_null (strstr (err.message, "3 publishes waiting already"));
   /* In order. */
   got = tqueue_take (q, 0);
   assert_ptr_equal (got, &a->item);
   /* A queued send cancelled: freed, never called; its room is free. */
   tqueue_cancel (q, &c->item);
   assert_int_equal (freed, 1);
   assert_true (tqueue_push (q, &d->item, &err));
   /* A busy send cancelled: freed when its thread hands it back, not called. */
   tqueue_cancel (q, &a->item);
   assert_int_equal (freed, 1);
   a->item.res.outcome = TRANSPORT_OUTCOME_OK;
   tqueue_done (q, &a->item);
   assert_int_equal (freed, 2);
   /* A finished send is called back on the base, then freed. */
   got = tqueue_take (q, 0);
   assert_ptr_equal (got, &b->item);
   b->item.res.outcome = TRANSPORT_OUTCOME_RETRY;
   tqueue_done (q, &b->item);
   assert_int_equal (called, 0); /* not on the thread */
   event_base_loop (base, EVLOOP_NONBLOCK);
   assert_int_equal (called, 1);
   assert_int_equal (last_called, 2);
   assert_int_equal (last_outcome, TRANSPORT_OUTCOME_RETRY);
   assert_int_equal (freed, 3);
   /* A finished send cancelled before the base ran it: freed, not called. */
   got = tqueue_take (q, 0);
   assert_ptr_equal (got, &d->item);
   tqueue_done (q, &d->item);
   tqueue_cancel (q, &d->item);
   event_base_loop (base, EVLOOP_NONBLOCK);
   assert_int_equal (called, 1);
   assert_int_equal (freed, 4);
   /* Empty: a take times out; after stop it returns at once. */
   assert_null (tqueue_take (q, 20));
   assert_false (tqueue_stopped (q));
   tqueue_stop (q);
   assert_null (tqueue_take (q, -1));
   assert_true (tqueue_stopped (q));
   /* What is left is freed with the queue. */
   tqueue_destroy (q);
   event_base_free (base);
}

/* Destroying a queue frees the sends still queued, without calling them. */
static void
test_queue_destroy_frees (void **state)
{
   struct event_base *base = event_base_new ();
   tqueue_t *q = tqueue_new (base, 4, item_free);
   bson_error_t err;

   (void) state;
   freed = called = 0;
   assert_true (tqueue_push (q, &item_new (1)->item, &err));
   assert_true (tqueue_push (q, &item_new (2)->item, &err));
   tqueue_destroy (q);
   assert_int_equal (freed, 2);
   assert_int_equal (called, 0);
   event_base_free (base);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_expand),
      cmocka_unit_test (test_template_valid),
      cmocka_unit_test (test_kinds),
      cmocka_unit_test (test_new_refuses_pull),
      cmocka_unit_test (test_queue),
      cmocka_unit_test (test_queue_destroy_frees),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
