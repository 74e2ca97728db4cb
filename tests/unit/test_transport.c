/*
 * test_transport.c - dispatch/transport.c: the templates of broker
 * subjects ({type}, {key}, the event id without a key, characters a
 * subject may not hold replaced), their validation, and the kind table
 * (which kinds the dispatcher sends itself, and the names of states and
 * outcomes), and the queue between the dispatcher and a broker's
 * publishing threads (dispatch/transport_queue.h): bounded, results
 * called back on the base in order, cancels of queued, finished and busy
 * sends, stop; and the broker kinds' base (transport_base_t): its queue's
 * bound, its state and last error, its cancel and state ops, and a stop
 * that joins its threads after they finished what they held.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>
#include <event2/thread.h>

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

/* ------------------------------------------------------------- the base */

/* A kind built on the base, as kafka.c, nats.c and rabbitmq.c are. */
typedef struct {
   transport_base_t base; /* first */
   int published;
} fake_kind_t;

/* A publishing thread: every send it takes is published OK. */
static void *
fake_publisher (void *arg)
{
   fake_kind_t *k = arg;
   tqueue_item_t *it;

   while ((it = tqueue_take (k->base.q, -1))) {
      it->res.outcome = TRANSPORT_OUTCOME_OK;
      pthread_mutex_lock (&k->base.mu);
      k->published++;
      pthread_mutex_unlock (&k->base.mu);
      tqueue_done (k->base.q, it);
   }
   return NULL;
}

static void
test_base (void **state)
{
   struct event_base *base = event_base_new ();
   transport_env_t env = {.base = base};
   config_handler_t h;
   fake_kind_t k;
   item_t *items[5];
   char detail[TRANSPORT_DETAIL_MAX];
   bson_error_t err;

   (void) state;
   memset (&h, 0, sizeof h);
   h.name = "b";
   h.concurrency = 2;
   freed = called = 0;
   assert_true (transport_base_init (&k.base, &env, &h, "nats://u:pw@host", "ev.{type}", item_free));
   k.published = 0;
   assert_string_equal (k.base.name, "b");
   assert_string_equal (k.base.tmpl, "ev.{type}");
   /* Connecting, no error yet. */
   assert_int_equal (transport_base_state (&k, detail, sizeof detail), TRANSPORT_STATE_CONNECTING);
   assert_string_equal (detail, "");
   /* The last error is the state's detail while not connected... */
   assert_int_equal (transport_base_set (&k.base, TRANSPORT_STATE_DISCONNECTED, "refused"), TRANSPORT_STATE_CONNECTING);
   assert_int_equal (transport_base_state (&k, detail, sizeof detail), TRANSPORT_STATE_DISCONNECTED);
   assert_string_equal (detail, "refused");
   /* ...a state without an error keeps it, and an error alone keeps the state... */
   assert_int_equal (transport_base_set (&k.base, TRANSPORT_STATE_CONNECTING, NULL), TRANSPORT_STATE_DISCONNECTED);
   transport_base_set_error (&k.base, "timed out");
   assert_int_equal (transport_base_get (&k.base), TRANSPORT_STATE_CONNECTING);
   transport_base_last_error (&k.base, detail, sizeof detail);
   assert_string_equal (detail, "timed out");
   /* ...and none is shown once connected. */
   transport_base_set (&k.base, TRANSPORT_STATE_CONNECTED, NULL);
   detail[0] = '\0';
   assert_int_equal (transport_base_state (&k, detail, sizeof detail), TRANSPORT_STATE_CONNECTED);
   assert_string_equal (detail, "");
   /* The queue holds twice the handler's concurrency. */
   for (int i = 0; i < 5; i++)
      items[i] = item_new (i);
   for (int i = 0; i < 4; i++)
      assert_true (tqueue_push (k.base.q, &items[i]->item, &err));
   assert_false (tqueue_push (k.base.q, &items[4]->item, &err));
   bson_free (items[4]);
   /* The cancel op: a queued send is freed, never called. */
   transport_base_cancel (&k, &items[3]->item);
   assert_int_equal (freed, 1);
   /* The threads publish what is queued; stop joins them. */
   assert_true (transport_base_start_threads (&k.base, 2, fake_publisher, &k));
   assert_int_equal (k.base.n_threads, 2);
   /* The results wake the loop (an active event): no timer needed. */
   while (called < 3)
      event_base_loop (base, EVLOOP_ONCE);
   transport_base_stop (&k.base);
   assert_int_equal (k.base.n_threads, 0);
   assert_int_equal (k.published, 3);
   assert_int_equal (freed, 4);
   transport_base_fini (&k.base);
   event_base_free (base);
}

/* A base whose kind failed before its threads started is stopped and
 * freed all the same (the kinds' start failure path). */
static void
test_base_no_threads (void **state)
{
   struct event_base *base = event_base_new ();
   transport_env_t env = {.base = base};
   config_handler_t h;
   transport_base_t b;
   bson_error_t err;

   (void) state;
   memset (&h, 0, sizeof h);
   h.name = "c";
   freed = 0;
   assert_true (transport_base_init (&b, &env, &h, "", "", item_free));
   assert_true (tqueue_push (b.q, &item_new (1)->item, &err));
   /* concurrency 0 counts as 1: room for two */
   assert_true (tqueue_push (b.q, &item_new (2)->item, &err));
   transport_base_stop (&b);
   transport_base_fini (&b);
   assert_int_equal (freed, 2);
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
      cmocka_unit_test (test_base),
      cmocka_unit_test (test_base_no_threads),
   };

   /* The base's threads hand results to the base's loop, as in the proxy. */
   evthread_use_pthreads ();
   return cmocka_run_group_tests (tests, NULL, NULL);
}
