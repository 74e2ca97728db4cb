/*
 * base/notify.c - the sd_notify protocol (see base/notify.h).
 *
 * One non-blocking datagram per state change: a service manager that is
 * slow to read costs a dropped notification, never a stalled loop.
 */
#include "base/notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"

static int notify_fd = -1;
static struct sockaddr_un notify_addr;
static socklen_t notify_addr_len;

bool
notify_init (void)
{
   const char *path = getenv ("NOTIFY_SOCKET");
   size_t len;

   if (!path || !*path)
      return true;
   len = strlen (path);
   if ((path[0] != '/' && path[0] != '@') || len >= sizeof notify_addr.sun_path) {
      log_warn ("NOTIFY_SOCKET '%s' is not a socket path or abstract name: no service notifications", path);
      return false;
   }
   memset (&notify_addr, 0, sizeof notify_addr);
   notify_addr.sun_family = AF_UNIX;
   memcpy (notify_addr.sun_path, path, len);
   if (path[0] == '@')
      notify_addr.sun_path[0] = '\0'; /* abstract namespace */
   notify_addr_len = (socklen_t) (offsetof (struct sockaddr_un, sun_path) + len);
   notify_fd = socket (AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
   if (notify_fd < 0) {
      log_warn ("cannot open the service notification socket: %s", strerror (errno));
      return false;
   }
   return true;
}

bool
notify_enabled (void)
{
   return notify_fd >= 0;
}

bool
notify_send (const char *state)
{
   if (notify_fd < 0)
      return false;
   if (sendto (notify_fd, state, strlen (state), MSG_DONTWAIT | MSG_NOSIGNAL, (const struct sockaddr *) &notify_addr,
               notify_addr_len) < 0) {
      log_debug ("service notification '%.20s' not sent: %s", state, strerror (errno));
      return false;
   }
   return true;
}

int64_t
notify_watchdog_ms (void)
{
   const char *usec = getenv ("WATCHDOG_USEC");
   const char *pid = getenv ("WATCHDOG_PID");
   char *end;
   long long v;

   if (!usec || !*usec)
      return 0;
   if (pid && *pid && strtoll (pid, NULL, 10) != (long long) getpid ())
      return 0;
   errno = 0;
   v = strtoll (usec, &end, 10);
   if (errno || *end || v <= 0)
      return 0;
   return v / 1000 > 0 ? (int64_t) (v / 1000) : 1;
}

void
notify_close (void)
{
   if (notify_fd >= 0)
      close (notify_fd);
   notify_fd = -1;
}
