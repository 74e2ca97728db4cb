/*
 * test_side.c - src/proxy/side.c: one socket side, over a socketpair.
 *
 * A plain accepted side is read by its own event only while reading is on,
 * reports what arrives, EOF and the partial-message timeout through its
 * callbacks, writes its output at once on a flush, calls its drain
 * callback only when asked to, and closes its socket on side_close.  A connect
 * that fails at once is an error with the address, and leaves nothing open.
 */
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "proxy/side.h"

typedef struct {
   struct event_base *base;
   side_t side;
   int peer; /* the other end of the socketpair */
   int reads, drains, timeouts, events;
   side_event_t last_event;
} fixture_t;

static void
on_read (side_t *s)
{
   fixture_t *f = s->owner;
   f->reads++;
   event_base_loopbreak (f->base);
}

static void
on_drained (side_t *s)
{
   fixture_t *f = s->owner;
   f->drains++;
   event_base_loopbreak (f->base);
}

static void
on_event (side_t *s, side_event_t ev, const char *detail)
{
   fixture_t *f = s->owner;
   f->events++;
   f->last_event = ev;
   event_base_loopbreak (f->base);
}

static void
on_timeout (side_t *s)
{
   fixture_t *f = s->owner;
   f->timeouts++;
   event_base_loopbreak (f->base);
}

static const side_callbacks_t callbacks = {
   .on_read = on_read,
   .on_drained = on_drained,
   .on_event = on_event,
   .on_timeout = on_timeout,
};

/* Runs the loop until a callback breaks it, or for at most 2 s. */
static void
run (fixture_t *f)
{
   struct timeval tv = {2, 0};
   event_base_loopexit (f->base, &tv);
   event_base_dispatch (f->base);
}

static int
setup (void **state)
{
   fixture_t *f = calloc (1, sizeof *f);
   int sv[2];
   bson_error_t error;

   assert_non_null (f);
   f->base = event_base_new ();
   assert_non_null (f->base);
   assert_int_equal (socketpair (AF_UNIX, SOCK_STREAM, 0, sv), 0);
   assert_int_equal (evutil_make_socket_nonblocking (sv[0]), 0);
   f->peer = sv[1];
   assert_true (side_accept (&f->side, f->base, sv[0], false, NULL, &callbacks, f, &error));
   *state = f;
   return 0;
}

static int
teardown (void **state)
{
   fixture_t *f = *state;

   side_close (&f->side);
   if (f->peer >= 0)
      close (f->peer);
   event_base_free (f->base);
   free (f);
   return 0;
}

static void
test_accept_plain (void **state)
{
   fixture_t *f = *state;

   assert_int_equal (f->side.kind, SIDE_CLIENT);
   assert_true (f->side.connected);
   assert_true (f->side.direct);
   assert_false (f->side.tls);
   assert_true (side_is_open (&f->side));
   assert_false (side_is_reading (&f->side));
}

static void
test_reads_only_while_reading (void **state)
{
   fixture_t *f = *state;
   struct timeval tv = {0, 50 * 1000};

   assert_int_equal (write (f->peer, "hello", 5), 5);
   /* Reading off: the bytes wait in the kernel. */
   event_base_loopexit (f->base, &tv);
   event_base_dispatch (f->base);
   assert_int_equal (f->reads, 0);
   side_set_reading (&f->side, true);
   assert_true (side_is_reading (&f->side));
   run (f);
   assert_int_equal (f->reads, 1);
   assert_int_equal (evbuffer_get_length (side_input (&f->side)), 5);
   side_set_reading (&f->side, false);
   assert_false (side_is_reading (&f->side));
}

static void
test_eof (void **state)
{
   fixture_t *f = *state;

   close (f->peer);
   f->peer = -1;
   side_set_reading (&f->side, true);
   run (f);
   assert_int_equal (f->events, 1);
   assert_int_equal (f->last_event, SIDE_EVENT_EOF);
}

static void
test_flush_writes_now (void **state)
{
   fixture_t *f = *state;
   char buf[16];

   evbuffer_add (side_output (&f->side), "pong", 4);
   /* Written by the flush itself, without a loop turn; what is left is
    * what side_write_now says. */
   assert_int_equal (side_write_now (&f->side), 0);
   assert_int_equal (evbuffer_get_length (side_output (&f->side)), 0);
   assert_int_equal (read (f->peer, buf, sizeof buf), 4);
   assert_memory_equal (buf, "pong", 4);
}

/* The owner passes the input's length it counted; here, read it. */
static void
timer_update (fixture_t *f, int64_t timeout_ms, bool consumed)
{
   side_timer_update (&f->side, timeout_ms, consumed, evbuffer_get_length (side_input (&f->side)));
}

static void
test_partial_message_timer (void **state)
{
   fixture_t *f = *state;

   assert_int_equal (write (f->peer, "part", 4), 4);
   side_set_reading (&f->side, true);
   run (f);
   assert_int_equal (f->reads, 1);
   /* Something partial while reading: the timer is armed and fires. */
   timer_update (f, 20, false);
   assert_true (f->side.timer_armed);
   run (f);
   assert_int_equal (f->timeouts, 1);
   assert_false (f->side.timer_armed);
   /* Not reading: a stall of our own is not timed. */
   side_set_reading (&f->side, false);
   timer_update (f, 20, false);
   assert_false (f->side.timer_armed);
   /* Reading again: armed; no limit configured (0): disarmed. */
   side_set_reading (&f->side, true);
   timer_update (f, 20, false);
   assert_true (f->side.timer_armed);
   timer_update (f, 0, false);
   assert_false (f->side.timer_armed);
   /* Armed again, then the message is taken and nothing is left: disarmed. */
   timer_update (f, 20, false);
   assert_true (f->side.timer_armed);
   evbuffer_drain (side_input (&f->side), 4);
   timer_update (f, 20, true);
   assert_false (f->side.timer_armed);
}

/* The peer reads whatever arrives. */
static void
peer_read_cb (evutil_socket_t fd, short what, void *arg)
{
   char buf[65536];

   while (read (fd, buf, sizeof buf) > 0)
      ;
}

/* Queues more than the socket takes at once and lets the peer read it:
 * returns whether on_drained ran before the output was written out. */
static bool
drain_big_output (fixture_t *f)
{
   static char big[4 * 1024 * 1024];
   struct timeval tv = {0, 200 * 1000};
   int before = f->drains;

   assert_int_equal (evbuffer_add (side_output (&f->side), big, sizeof big), 0);
   side_flush (&f->side);
   /* The socket took part of it; libevent writes the rest. */
   assert_true (evbuffer_get_length (side_output (&f->side)) > 0);
   while (evbuffer_get_length (side_output (&f->side)) > 0 && f->drains == before) {
      event_base_loopexit (f->base, &tv);
      event_base_dispatch (f->base);
   }
   return f->drains > before;
}

static void
test_drain_callback_on_request (void **state)
{
   fixture_t *f = *state;
   struct event *pr;

   assert_int_equal (evutil_make_socket_nonblocking (f->peer), 0);
   pr = event_new (f->base, f->peer, EV_READ | EV_PERSIST, peer_read_cb, NULL);
   assert_non_null (pr);
   assert_int_equal (event_add (pr, NULL), 0);
   side_set_write_low (&f->side, 0);
   /* Not asked for: the output empties without a drain callback. */
   assert_false (drain_big_output (f));
   assert_int_equal (evbuffer_get_length (side_output (&f->side)), 0);
   /* Asked for: it runs once the output is at the low watermark (0). */
   side_want_drained (&f->side, true);
   assert_true (f->side.drained_cb);
   assert_true (drain_big_output (f));
   assert_int_equal (evbuffer_get_length (side_output (&f->side)), 0);
   side_want_drained (&f->side, false);
   assert_false (f->side.drained_cb);
   event_free (pr);
}

static void
test_close_closes_the_socket (void **state)
{
   fixture_t *f = *state;
   char c;

   side_close (&f->side);
   assert_false (side_is_open (&f->side));
   assert_null (f->side.rd);
   assert_null (f->side.timer);
   side_close (&f->side); /* idempotent */
   /* libevent finalizes a freed bufferevent (closing its socket) on the
    * loop's next turn. */
   event_base_loop (f->base, EVLOOP_NONBLOCK);
   assert_int_equal (evutil_make_socket_nonblocking (f->peer), 0);
   assert_int_equal (read (f->peer, &c, 1), 0); /* EOF: the socket is closed */
}

static void
test_connect_failure (void **state)
{
   struct event_base *base = event_base_new ();
   topology_primary_t p;
   struct sockaddr_in *in = (struct sockaddr_in *) &p.addr;
   side_t s;
   bson_error_t error;

   memset (&p, 0, sizeof p);
   bson_strncpy (p.host, "192.0.2.1", sizeof p.host);
   p.port = 27017;
   /* AF_UNSPEC: refused by connect() at once. */
   in->sin_family = AF_UNSPEC;
   p.addr_len = sizeof *in;
   assert_false (side_connect (&s, base, &p, NULL, &callbacks, NULL, &error));
   assert_int_equal (error.domain, SIDE_ERROR_DOMAIN);
   assert_int_equal (error.code, SIDE_ERR_CONNECT);
   assert_non_null (strstr (error.message, "connect to 192.0.2.1:27017: "));
   assert_false (side_is_open (&s));
   assert_null (s.timer);
   event_base_free (base);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown (test_accept_plain, setup, teardown),
      cmocka_unit_test_setup_teardown (test_reads_only_while_reading, setup, teardown),
      cmocka_unit_test_setup_teardown (test_eof, setup, teardown),
      cmocka_unit_test_setup_teardown (test_flush_writes_now, setup, teardown),
      cmocka_unit_test_setup_teardown (test_partial_message_timer, setup, teardown),
      cmocka_unit_test_setup_teardown (test_drain_callback_on_request, setup, teardown),
      cmocka_unit_test_setup_teardown (test_close_closes_the_socket, setup, teardown),
      cmocka_unit_test (test_connect_failure),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
