/*
 * base/loopwake.c - a bounded queue of calls into the forwarding loop, and the
 * eventfd that wakes it (see base/loopwake.h for why the loop has no locks).
 *
 * Wake-ups are edge-like: a producer writes to the eventfd only when it
 * puts the first entry into an empty queue.  The loop reads the eventfd
 * before it takes the entries, so an entry queued after the take always
 * finds the queue empty and writes again: nothing is left without a
 * wake-up.  The entries are copied out under the mutex and run without
 * it, so a posted function may itself post.
 */
#include "base/loopwake.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/eventfd.h>
#endif

#include <event2/event.h>

#include "base/log.h"

typedef struct {
   loopwake_fn_t fn;
   void *arg;
} loopwake_entry_t;

/* Owned by the loop's thread; producers touch only the fields under `mu`
 * and write to `wfd`. */
struct loopwake {
   struct event *ev; /* persistent EV_READ on rfd */
   int rfd, wfd;     /* the same eventfd twice, or a pipe's two ends */

   pthread_mutex_t mu;
   loopwake_entry_t q[LOOPWAKE_CAPACITY]; /* under mu: a ring */
   size_t head, count;                    /* under mu */
};

static void
loopwake_signal (loopwake_t *w)
{
   uint64_t one = 1;
   ssize_t n;

   /* An eventfd takes 8 bytes; a pipe takes them too.  EAGAIN means a
    * wake-up is already pending, which is all we want. */
   do
      n = write (w->wfd, &one, sizeof one);
   while (n < 0 && errno == EINTR);
}

static void
loopwake_drain_fd (loopwake_t *w)
{
   uint64_t buf[16];
   ssize_t n;

   do
      n = read (w->rfd, buf, sizeof buf);
   while (n == (ssize_t) sizeof buf || (n < 0 && errno == EINTR));
}

static void
loopwake_cb (evutil_socket_t fd, short what, void *arg)
{
   loopwake_t *w = arg;
   loopwake_entry_t run[LOOPWAKE_CAPACITY];
   size_t n = 0;

   (void) fd;
   (void) what;
   loopwake_drain_fd (w); /* first: see the file comment */
   pthread_mutex_lock (&w->mu);
   while (w->count > 0) {
      run[n++] = w->q[w->head];
      w->head = (w->head + 1) % LOOPWAKE_CAPACITY;
      w->count--;
   }
   pthread_mutex_unlock (&w->mu);
   for (size_t i = 0; i < n; i++)
      run[i].fn (run[i].arg);
}

static bool
set_nonblocking (int fd)
{
   int flags = fcntl (fd, F_GETFL);

   return flags >= 0 && fcntl (fd, F_SETFL, flags | O_NONBLOCK) == 0 && fcntl (fd, F_SETFD, FD_CLOEXEC) == 0;
}

loopwake_t *
loopwake_new (struct event_base *base, bson_error_t *error)
{
   loopwake_t *w = bson_malloc0 (sizeof *w);

   w->rfd = w->wfd = -1;
   pthread_mutex_init (&w->mu, NULL);
#ifdef __linux__
   w->rfd = w->wfd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
#endif
   if (w->rfd < 0) {
      int fds[2];
      if (pipe (fds) != 0 || !set_nonblocking (fds[0]) || !set_nonblocking (fds[1])) {
         bson_set_error (error, LOOPWAKE_ERROR_DOMAIN, LOOPWAKE_ERR_PIPE, "cannot create the loop's wake-up pipe: %s", strerror (errno));
         goto fail;
      }
      w->rfd = fds[0];
      w->wfd = fds[1];
   }
   w->ev = event_new (base, w->rfd, EV_READ | EV_PERSIST, loopwake_cb, w);
   if (!w->ev || event_add (w->ev, NULL) != 0) {
      bson_set_error (error, LOOPWAKE_ERROR_DOMAIN, LOOPWAKE_ERR_EVENT, "cannot watch the loop's wake-up descriptor");
      goto fail;
   }
   return w;
fail:
   loopwake_destroy (w);
   return NULL;
}

bool
loopwake_post (loopwake_t *w, loopwake_fn_t fn, void *arg)
{
   bool was_empty;

   pthread_mutex_lock (&w->mu);
   if (w->count == LOOPWAKE_CAPACITY) {
      pthread_mutex_unlock (&w->mu);
      return false;
   }
   was_empty = w->count == 0;
   w->q[(w->head + w->count) % LOOPWAKE_CAPACITY] = (loopwake_entry_t){fn, arg};
   w->count++;
   /* Only the first entry of an empty queue wakes the loop: the loop reads
    * the descriptor before it empties the queue (file comment).  The write
    * never blocks, so it may run under the mutex. */
   if (was_empty)
      loopwake_signal (w);
   pthread_mutex_unlock (&w->mu);
   return true;
}

void
loopwake_destroy (loopwake_t *w)
{
   if (!w)
      return;
   if (w->ev)
      event_free (w->ev);
   if (w->wfd >= 0 && w->wfd != w->rfd)
      close (w->wfd);
   if (w->rfd >= 0)
      close (w->rfd);
   if (w->count > 0)
      log_debug ("loopwake: %zu posted call(s) dropped at shutdown", w->count);
   pthread_mutex_destroy (&w->mu);
   bson_free (w);
}
