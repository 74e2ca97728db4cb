/*
 * test_loopwake.c - src/base/loopwake.c: posts from other threads run on the
 * loop, in order, none lost; a full queue refuses instead of blocking; what
 * was never run is dropped at destroy.
 *
 * The loop's base is created as the proxy creates it (EVENT_BASE_FLAG_NOLOCK,
 * no evthread), so the test also shows that nothing but the eventfd is
 * needed to wake it.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <event2/event.h>

#include "base/loopwake.h"

#define PRODUCERS 4
#define POSTS_EACH 2000

typedef struct {
   struct event_base *base;
   loopwake_t *wake;
   int ran;                         /* loop thread only */
   int last_seen[PRODUCERS];        /* loop thread only: per-producer order */
   int out_of_order;
} state_t;

typedef struct {
   state_t *st;
   int producer;
   int seq;
} post_t;

static post_t posts[PRODUCERS][POSTS_EACH];

static void
on_post (void *arg)
{
   post_t *p = arg;
   state_t *st = p->st;

   if (p->seq != st->last_seen[p->producer] + 1)
      st->out_of_order++;
   st->last_seen[p->producer] = p->seq;
   if (++st->ran == PRODUCERS * POSTS_EACH)
      event_base_loopbreak (st->base);
}

typedef struct {
   state_t *st;
   int producer;
} producer_t;

static void *
produce (void *arg)
{
   producer_t *pr = arg;

   for (int i = 0; i < POSTS_EACH; i++) {
      post_t *p = &posts[pr->producer][i];
      p->st = pr->st;
      p->producer = pr->producer;
      p->seq = i;
      /* Full: the loop is behind; a real producer would coalesce or drop. */
      while (!loopwake_post (pr->st->wake, on_post, p))
         sched_yield ();
   }
   return NULL;
}

static struct event_base *
nolock_base (void)
{
   struct event_config *ec = event_config_new ();
   struct event_base *base;

   assert_non_null (ec);
   assert_int_equal (event_config_set_flag (ec, EVENT_BASE_FLAG_NOLOCK), 0);
   base = event_base_new_with_config (ec);
   event_config_free (ec);
   assert_non_null (base);
   return base;
}

static void
safety_stop (evutil_socket_t fd, short what, void *arg)
{
   (void) fd;
   (void) what;
   event_base_loopbreak (arg);
}

static void
test_posts_from_threads (void **unused)
{
   static state_t st;
   producer_t pr[PRODUCERS];
   pthread_t th[PRODUCERS];
   bson_error_t error;
   struct timeval ten_s = {10, 0};
   struct event *guard;

   (void) unused;
   st.base = nolock_base ();
   st.wake = loopwake_new (st.base, &error);
   assert_non_null (st.wake);
   for (int i = 0; i < PRODUCERS; i++)
      st.last_seen[i] = -1;
   guard = evtimer_new (st.base, safety_stop, st.base);
   evtimer_add (guard, &ten_s);
   for (int i = 0; i < PRODUCERS; i++) {
      pr[i].st = &st;
      pr[i].producer = i;
      assert_int_equal (pthread_create (&th[i], NULL, produce, &pr[i]), 0);
   }
   event_base_dispatch (st.base);
   for (int i = 0; i < PRODUCERS; i++)
      pthread_join (th[i], NULL);
   assert_int_equal (st.ran, PRODUCERS * POSTS_EACH);
   assert_int_equal (st.out_of_order, 0);
   event_free (guard);
   loopwake_destroy (st.wake);
   event_base_free (st.base);
}

static int dropped_ran;

static void
never (void *arg)
{
   (void) arg;
   dropped_ran++;
}

static void
test_full_and_destroy (void **unused)
{
   struct event_base *base = nolock_base ();
   bson_error_t error;
   loopwake_t *w = loopwake_new (base, &error);

   (void) unused;
   assert_non_null (w);
   for (int i = 0; i < LOOPWAKE_CAPACITY; i++)
      assert_true (loopwake_post (w, never, NULL));
   assert_false (loopwake_post (w, never, NULL));
   loopwake_destroy (w); /* drops the 64 without running them */
   assert_int_equal (dropped_ran, 0);
   loopwake_destroy (NULL);
   event_base_free (base);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_posts_from_threads),
      cmocka_unit_test (test_full_and_destroy),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
