/*
 * proxy/mem.c - the process-wide bound on buffered bytes
 * ([proxy] max_buffered_bytes): what every connection's buffers hold and
 * what its partial messages reserved, the wait list of the connections
 * that a reservation did not fit, and their resumption, oldest first, on
 * their own loop or posted from another loop that gave room back.
 *
 * Thread: each forwarding loop calls these for its own connections and
 * loop; the total (COUNTER_BUFFERED_BYTES) and the slots by which loops
 * post each other a resume are shared (atomics, and mem_slots_mu).
 *
 * proxy/conn.c decides who reads (client_update_flow) and asks here
 * whether a side may (mem_may_read); it does not touch the counts itself.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/loopwake.h"
#include "codec/wire.h"
#include "proxy/conn_private.h"
#include "proxy/side.h"


/*
 * The process-wide bound on buffered bytes ([proxy] max_buffered_bytes).
 * COUNTER_BUFFERED_BYTES (atomic: the admin thread reads it; it is the one
 * process counter, should there be several loops) is the sum over the
 * connections of
 *   - mem_held: the bytes in their buffers (client and upstream, input and
 *     output, decompressed requests, re-encoded and held answers), kept
 *     exact by an evbuffer callback on each, but for the sockets of direct
 *     (plain) sides: those are counted by their lengths where every pump
 *     ends, in client_update_flow, and before a reservation (mem_sync_side;
 *     a buffer callback runs on every add and drain, four per message);
 *   - reservations: the rest of a partial message whose header announced
 *     its length (each side's mem_partial), and for a request its
 *     decompressed size or the copy it is validated from, plus its bytes
 *     while the decoding thread has them (mem_decode).
 * A side of a connection is read only while the rest of the message it is
 * receiving is reserved; a reservation that does not fit under the bound
 * puts the connection on the loop's wait list with that side unread: the
 * clients stopped are those with the largest messages coming, while small
 * requests (whole in one read) never wait.  Messages already reserved
 * finish, leave towards their destination and free their room; when the
 * total is below the low mark (three quarters of the bound) the waiters
 * are resumed oldest first, each as its reservation fits.  A newcomer may
 * not take the room the oldest waiter needs, so none starves.  Beyond the
 * bound only one read per connection (4 KiB, a TLS record) is unreserved.
 * Per-connection watermarks keep working underneath.
 */

#define MEM_LOG_INTERVAL_MS 10000

/* Room is process-wide, waiters are per loop: a loop that gives room back
 * while other loops have waiters posts them a resume (one queued at a time
 * per loop).  `loop` and `wake` are set and cleared under mem_slots_mu;
 * the post's callback runs on the slot's own loop, which alone frees it,
 * so it reads `loop` there without the lock. */
typedef struct {
   client_loop_t *loop;
   loopwake_t *wake;
   atomic_bool waiting; /* the loop has connections waiting for memory */
   atomic_bool posted;  /* a resume is queued on its wake */
} mem_slot_t;

static mem_slot_t mem_slots[CLIENT_LOOPS_MAX];
static pthread_mutex_t mem_slots_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint mem_loops_waiting; /* slots with `waiting` set */

static int64_t
mem_total (void)
{
   return (int64_t) counters_get (COUNTER_BUFFERED_BYTES);
}

static int64_t
mem_low_mark (const client_loop_t *loop)
{
   return loop->cfg->max_buffered_bytes / 4 * 3;
}

/* Room went up: resume waiters from mem_ev (never from inside a buffer
 * callback, where a pump must not run). */
void
mem_maybe_resume (client_loop_t *loop)
{
   if (loop->mem_wait_head && !loop->mem_ev_active && mem_total () <= mem_low_mark (loop)) {
      loop->mem_ev_active = true;
      event_active (loop->mem_ev, EV_READ, 0);
   }
}

/* On the slot's loop: another loop gave room back. */
static void
mem_remote_cb (void *arg)
{
   mem_slot_t *slot = arg;

   atomic_store (&slot->posted, false);
   if (slot->loop)
      mem_maybe_resume (slot->loop);
}

/* Room went up on `loop`: the other loops' waiters may go on too. */
static void
mem_poke_others (client_loop_t *loop)
{
   if (mem_total () > mem_low_mark (loop))
      return;
   for (unsigned i = 0; i < CLIENT_LOOPS_MAX; i++) {
      mem_slot_t *slot = &mem_slots[i];
      bool ok = false;

      if (i == loop->index || !atomic_load (&slot->waiting) || atomic_exchange (&slot->posted, true))
         continue;
      pthread_mutex_lock (&mem_slots_mu);
      if (slot->loop && slot->wake)
         ok = loopwake_post (slot->wake, mem_remote_cb, slot);
      pthread_mutex_unlock (&mem_slots_mu);
      /* Full, or the loop is going: the next room given back tries again. */
      if (!ok)
         atomic_store (&slot->posted, false);
   }
}

void
mem_give_back (client_loop_t *loop, int64_t n)
{
   if (n > 0) {
      counters_sub (COUNTER_BUFFERED_BYTES, n);
      mem_maybe_resume (loop);
      if (atomic_load_explicit (&mem_loops_waiting, memory_order_relaxed) > (loop->mem_wait_head ? 1u : 0u))
         mem_poke_others (loop);
   }
}

/* The loop's wait list went from empty to not, or back. */
static void
mem_set_waiting (client_loop_t *loop, bool waiting)
{
   mem_slot_t *slot = &mem_slots[loop->index];

   if (atomic_exchange (&slot->waiting, waiting) == waiting)
      return;
   if (waiting)
      atomic_fetch_add (&mem_loops_waiting, 1);
   else
      atomic_fetch_sub (&mem_loops_waiting, 1);
}

static void
mem_account (client_conn_t *c, int64_t delta)
{
   c->mem_held += delta;
   if (delta > 0)
      counters_add (COUNTER_BUFFERED_BYTES, delta);
   else
      mem_give_back (c->loop, -delta);
}

/* Any of the connection's buffers changed. */
static void
mem_cb (struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
   client_conn_t *c = arg;

   /* Open: the close unwatches every buffer it does not free at once
    * (mem_release_all). */
   RELAYBUS_ASSERT (c->state != CLIENT_STATE_CLOSING);
   mem_account (c, (int64_t) info->n_added - (int64_t) info->n_deleted);
}

/* An input: bytes that arrive for a partial message were reserved, so
 * they turn from reservation into held bytes. */
static void
mem_input_cb (client_conn_t *c, int64_t *partial, const struct evbuffer_cb_info *info)
{
   int64_t added = (int64_t) info->n_added;
   int64_t take = added < *partial ? added : *partial;

   RELAYBUS_ASSERT (*partial >= 0);
   if (take > 0) {
      *partial -= take;
      counters_sub (COUNTER_BUFFERED_BYTES, take);
   }
   mem_account (c, added - (int64_t) info->n_deleted);
}

static void
mem_side_in_cb (struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
   side_t *s = arg;

   /* Open: the close unwatches the sides (mem_release_all); a direct side
    * is synced (mem_sync_direct) only while open, which it asserts. */
   RELAYBUS_ASSERT (((client_conn_t *) s->owner)->state != CLIENT_STATE_CLOSING);
   mem_input_cb (s->owner, &s->mem_partial, info);
}

bool
client_mem_watch (client_conn_t *c, struct evbuffer *buf)
{
   return evbuffer_add_cb (buf, mem_cb, c) != NULL;
}

void
mem_unwatch_side (side_t *s)
{
   if (s->mem_cb_in)
      evbuffer_remove_cb_entry (side_input (s), s->mem_cb_in);
   if (s->mem_cb_out)
      evbuffer_remove_cb_entry (side_output (s), s->mem_cb_out);
   s->mem_cb_in = s->mem_cb_out = NULL;
}

/* Counts a side's input and output: by buffer callbacks, or, for a
 * direct side, by mem_sync_side from the lengths it counted last (none
 * yet).  False: out of memory. */
bool
mem_watch_side (client_conn_t *c, side_t *s)
{
   s->mem_read = 0;
   s->mem_in_seen = s->mem_out_seen = 0;
   if (s->direct)
      return true;
   s->mem_cb_in = evbuffer_add_cb (side_input (s), mem_side_in_cb, s);
   s->mem_cb_out = evbuffer_add_cb (side_output (s), mem_cb, c);
   return s->mem_cb_in && s->mem_cb_out;
}

/* A side counted by callbacks went direct: from now on by its lengths,
 * which the callbacks counted up to here. */
void
mem_side_went_direct (side_t *s)
{
   mem_unwatch_side (s);
   s->mem_read = 0;
   s->mem_in_seen = evbuffer_get_length (side_input (s));
   s->mem_out_seen = evbuffer_get_length (side_output (s));
}

/* Brings a direct side's count up to date.  Its input grows only by its
 * own reads (mem_read), so what left it is the rest; its reserved bytes
 * turn into held ones as they arrive, as in mem_input_cb.  Its output
 * shrinks by its own writes (side_flush), which this follows, and while
 * the socket is full by libevent's writes, which run without us: a buffer
 * callback counts the output then.  `out_len` is the output's length now
 * (the caller that just wrote it knows it: side_write_now). */
void
mem_sync_direct (client_conn_t *c, side_t *s, size_t out_len)
{
   size_t in_len;

   RELAYBUS_ASSERT (s->direct && c->state != CLIENT_STATE_CLOSING);
   in_len = evbuffer_get_length (side_input (s));
   if (s->mem_read > 0 || in_len != s->mem_in_seen) {
      struct evbuffer_cb_info info = {
         .orig_size = s->mem_in_seen,
         .n_added = (size_t) s->mem_read,
         .n_deleted = s->mem_in_seen + (size_t) s->mem_read - in_len,
      };
      RELAYBUS_ASSERT (s->mem_in_seen + (size_t) s->mem_read >= in_len);
      s->mem_read = 0;
      s->mem_in_seen = in_len;
      mem_input_cb (c, &s->mem_partial, &info);
   }
   /* The output itself is looked up only to add or remove its callback:
    * the usual sync, neither, makes no call into libevent for it. */
   if (!s->mem_cb_out) {
      if (out_len != s->mem_out_seen) {
         mem_account (c, (int64_t) out_len - (int64_t) s->mem_out_seen);
         s->mem_out_seen = out_len;
      }
      /* Counted up to here; libevent's writes from now on by the callback. */
      if (s->libevent_writes && !(s->mem_cb_out = evbuffer_add_cb (side_output (s), mem_cb, c)))
         log_conn (LOG_LEVEL_WARN, c->id, c->peer, "out of memory for a buffer callback: the count may lag");
   } else if (!s->libevent_writes) {
      evbuffer_remove_cb_entry (side_output (s), s->mem_cb_out);
      s->mem_cb_out = NULL;
      s->mem_out_seen = out_len;
   }
}

static bool
mem_try_reserve (client_conn_t *c, int64_t n)
{
   client_loop_t *loop = c->loop;
   int64_t room = loop->cfg->max_buffered_bytes - mem_total ();

   if (loop->mem_wait_head && loop->mem_wait_head != c)
      room -= loop->mem_wait_head->mem_need; /* the oldest waiter's turn */
   if (n > room)
      return false;
   counters_add (COUNTER_BUFFERED_BYTES, n);
   return true;
}


static void
mem_wait (client_conn_t *c, unsigned side, int64_t need)
{
   client_loop_t *loop = c->loop;
   int64_t now;

   if (c->mem_wait_sides) {
      c->mem_wait_sides |= side;
      c->mem_need = need > c->mem_need ? need : c->mem_need;
      return;
   }
   c->mem_wait_sides = side;
   c->mem_need = need;
   c->mem_wait_next = NULL;
   c->mem_wait_prev = loop->mem_wait_tail;
   if (loop->mem_wait_tail) {
      loop->mem_wait_tail->mem_wait_next = c;
   } else {
      loop->mem_wait_head = c;
      mem_set_waiting (loop, true);
   }
   loop->mem_wait_tail = c;
   counters_add (COUNTER_CONNECTIONS_PAUSED_MEMORY, 1);
   counters_add (COUNTER_MEMORY_PAUSES, 1);
   log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "waiting for memory: %" PRId64 " bytes", need);
   loop->mem_episode_pauses++;
   if (loop->mem_pause_started_ms)
      return;
   now = clock_mono_ms ();
   loop->mem_pause_started_ms = now;
   if (!loop->mem_last_log_ms || now - loop->mem_last_log_ms >= MEM_LOG_INTERVAL_MS) {
      loop->mem_last_log_ms = now;
      log_warn ("memory: %" PRId64 " bytes buffered, max_buffered_bytes=%" PRId64
                ": not reading from clients with large messages until it drains below %" PRId64,
                mem_total (),
                loop->cfg->max_buffered_bytes,
                mem_low_mark (loop));
   }
}

void
mem_unwait (client_conn_t *c)
{
   client_loop_t *loop = c->loop;

   if (!c->mem_wait_sides)
      return;
   if (!c->mem_wait_next)
      loop->mem_wait_tail = c->mem_wait_prev;
   CONN_LIST_UNLINK (loop->mem_wait_head, c, mem_wait_prev, mem_wait_next);
   c->mem_wait_prev = c->mem_wait_next = NULL;
   c->mem_wait_sides = 0;
   c->mem_need = 0;
   counters_sub (COUNTER_CONNECTIONS_PAUSED_MEMORY, 1);
   if (!loop->mem_wait_head)
      mem_set_waiting (loop, false);
   if (!loop->mem_wait_head && loop->mem_pause_started_ms) {
      int64_t now = clock_mono_ms ();
      /* The end of an episode is logged when its start was (or when the
       * log is quiet enough again). */
      if (loop->mem_last_log_ms == loop->mem_pause_started_ms || now - loop->mem_last_log_ms >= MEM_LOG_INTERVAL_MS) {
         loop->mem_last_log_ms = now;
         log_info ("memory: reading from every client again after %" PRId64 " ms (%" PRIu64 " pauses), %" PRId64
                   " bytes buffered",
                   now - loop->mem_pause_started_ms,
                   loop->mem_episode_pauses,
                   mem_total ());
      }
      loop->mem_pause_started_ms = 0;
      loop->mem_episode_pauses = 0;
   }
}

static int64_t
mem_le32 (const uint8_t *p)
{
   return (int32_t) ((uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24);
}

/* Whether a side may read (called right after mem_sync_side): yes unless
 * a partial message in its input needs more room than is reserved and
 * that cannot be reserved; then the connection waits.  Everything a request will need is reserved at once,
 * when its header is first seen: the rest of its bytes, and for the client
 * side its decompressed size (OP_COMPRESSED) or the copy it is parsed from
 * (a request decoded off the loop).  So a connection never waits for
 * memory while it holds a message it has received: only while holding at
 * most one read, which is what keeps the waiting deadlock-free. */
bool
mem_may_read_partial (client_conn_t *c, side_t *s)
{
   bool client = s->kind == SIDE_CLIENT;
   struct evbuffer *in = side_input (s);
   int64_t *partial = &s->mem_partial;
   size_t avail = mem_synced_in_len (s);
   uint8_t hb[WIRE_HEADER_LEN + 9];
   int64_t len, rest, extra = 0;
   size_t got;

   if (c->mem_wait_sides & (client ? MEM_SIDE_CLIENT | MEM_SIDE_DECODE : MEM_SIDE_UP))
      return false;
   if (avail < WIRE_HEADER_LEN)
      return true;
   got = avail < sizeof hb ? WIRE_HEADER_LEN : sizeof hb;
   if (evbuffer_copyout (in, hb, got) != (ssize_t) got)
      return true;
   len = mem_le32 (hb);
   /* Complete, or refused once its header is read. */
   if (len <= (int64_t) avail || len > WIRE_MAX_MESSAGE_LEN)
      return true;
   if (client && c->mem_decode == 0) {
      if (mem_le32 (hb + 12) == WIRE_OP_COMPRESSED) {
         if (got < sizeof hb)
            return true; /* uncompressedSize not read yet: one more read */
         extra = mem_le32 (hb + WIRE_HEADER_LEN + 4);
         extra = extra >= 0 && extra <= WIRE_MAX_MESSAGE_LEN ? extra + WIRE_HEADER_LEN : 0;
      } else if (len >= CLIENT_OFFLOAD_MIN && c->loop->decoder) {
         extra = len;
      }
   }
   rest = len - (int64_t) avail - *partial;
   if (rest < 0)
      rest = 0;
   if (rest + extra == 0)
      return true;
   if (!mem_try_reserve (c, rest + extra)) {
      mem_wait (c, client ? MEM_SIDE_CLIENT : MEM_SIDE_UP, rest + extra);
      return false;
   }
   *partial += rest;
   c->mem_decode += extra;
   return true;
}

bool
client_mem_reserve_decode (client_conn_t *c, int64_t n)
{
   int64_t more = n - c->mem_decode;

   if (more <= 0)
      return true;
   mem_sync_side (c, &c->client);
   if (c->up)
      mem_sync_side (c, c->up);
   if (!mem_try_reserve (c, more)) {
      mem_wait (c, MEM_SIDE_DECODE, more);
      return false;
   }
   c->mem_decode += more;
   return true;
}

void
client_mem_release_decode (client_conn_t *c)
{
   int64_t n = c->mem_decode;

   RELAYBUS_ASSERT (n >= 0);
   c->mem_decode = 0;
   mem_give_back (c->loop, n);
}

/* The upstream side closes while the connection stays (client_repair), or
 * a pooled connection goes back to its pool: what its buffers held and its
 * partial reply reserved goes back. */
void
mem_release_side (client_conn_t *c, side_t *s)
{
   struct evbuffer *in = side_input (s), *out = side_output (s);

   if (c->mem_wait_sides & MEM_SIDE_UP)
      mem_unwait (c);
   /* The callbacks (or the lengths, for a direct side) count the drains. */
   evbuffer_drain (in, evbuffer_get_length (in));
   evbuffer_unfreeze (out, 1);
   evbuffer_drain (out, evbuffer_get_length (out));
   evbuffer_freeze (out, 1);
   mem_sync_side (c, s);
   mem_unwatch_side (s);
   mem_give_back (c->loop, s->mem_partial);
   s->mem_partial = s->mem_read = 0;
   s->mem_in_seen = s->mem_out_seen = 0;
}

/* The connection closes: everything it held or reserved goes back. */
void
mem_release_all (client_conn_t *c)
{
   mem_unwait (c);
   mem_unwatch_side (&c->client);
   mem_unwatch_side (&c->upstream);
   /* The work buffers live until the struct is freed: no count after this
    * (the held answers are freed at the close). */
   if (c->tmp)
      evbuffer_remove_cb (c->tmp, mem_cb, c);
   if (c->scratch)
      evbuffer_remove_cb (c->scratch, mem_cb, c);
   mem_give_back (c->loop, c->mem_held + c->client.mem_partial + c->upstream.mem_partial + c->mem_decode);
   c->mem_held = c->client.mem_partial = c->upstream.mem_partial = c->mem_decode = 0;
}

/* mem_ev: room below the low mark; waiters resume oldest first while
 * their reservations fit.  A resumed connection reserves in its pump (or
 * waits again, at the tail); each waiter is looked at once per run. */
void
mem_resume_cb (evutil_socket_t fd, short what, void *arg)
{
   client_loop_t *loop = arg;
   client_conn_t *c;
   size_t budget = loop->nclients;

   loop->mem_ev_active = false;
   while ((c = loop->mem_wait_head) && budget-- > 0) {
      if (c->mem_need > loop->cfg->max_buffered_bytes - mem_total ())
         break;
      mem_unwait (c);
      client_pump_both (c);
   }
}

/* The loop's slot, so that other loops can post it a resume. */
void
mem_loop_attach (client_loop_t *loop)
{
   pthread_mutex_lock (&mem_slots_mu);
   RELAYBUS_ASSERT (mem_slots[loop->index].loop == NULL);
   mem_slots[loop->index].loop = loop;
   pthread_mutex_unlock (&mem_slots_mu);
}

void
mem_loop_set_wake (client_loop_t *loop, struct loopwake *wake)
{
   pthread_mutex_lock (&mem_slots_mu);
   mem_slots[loop->index].wake = wake;
   pthread_mutex_unlock (&mem_slots_mu);
}

void
mem_loop_detach (client_loop_t *loop)
{
   pthread_mutex_lock (&mem_slots_mu);
   if (mem_slots[loop->index].loop == loop) {
      mem_slots[loop->index].loop = NULL;
      mem_slots[loop->index].wake = NULL;
   }
   pthread_mutex_unlock (&mem_slots_mu);
}
