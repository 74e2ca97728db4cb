/*
 * double.c - spawning and stopping the server double for C tests.
 */
#include "double.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void
sleep_ms (int ms)
{
   struct timespec ts = {ms / 1000, (long) (ms % 1000) * 1000000L};
   nanosleep (&ts, NULL);
}

bool
double_start (test_double_t *d, const char *top)
{
   char bin[1024];
   int out_fd, err_fd;

   memset (d, 0, sizeof *d);
   snprintf (bin, sizeof bin, "%s/tests/mongod-double/mongod-double", top);
   snprintf (d->out_path, sizeof d->out_path, "/tmp/relaybus-double-%d-XXXXXX", (int) getpid ());
   out_fd = mkstemp (d->out_path);
   snprintf (d->err_path, sizeof d->err_path, "/tmp/relaybus-double-err-%d-XXXXXX", (int) getpid ());
   err_fd = mkstemp (d->err_path);
   if (out_fd < 0 || err_fd < 0) {
      perror ("mkstemp");
      return false;
   }
   d->pid = fork ();
   if (d->pid < 0) {
      perror ("fork");
      return false;
   }
   if (d->pid == 0) {
      dup2 (out_fd, 1);
      dup2 (err_fd, 2);
      execl (bin, bin, "--port", "0", (char *) NULL);
      perror ("exec mongod-double");
      _exit (127);
   }
   close (out_fd);
   close (err_fd);
   for (int waited = 0; waited < 30000; waited += 20) {
      FILE *f = fopen (d->out_path, "r");
      int port = 0;
      char line[64];
      if (f) {
         if (fgets (line, sizeof line, f) && strchr (line, '\n'))
            port = atoi (line);
         fclose (f);
      }
      if (port > 0) {
         d->port = port;
         snprintf (d->uri,
                   sizeof d->uri,
                   "mongodb://127.0.0.1:%d/?serverSelectionTimeoutMS=5000",
                   port);
         return true;
      }
      if (waitpid (d->pid, NULL, WNOHANG) == d->pid) {
         fprintf (stderr, "mongod-double exited before printing its port (see %s)\n", d->err_path);
         d->pid = 0;
         return false;
      }
      sleep_ms (20);
   }
   fprintf (stderr, "mongod-double printed no port within 30 s\n");
   double_stop (d);
   return false;
}

void
double_stop (test_double_t *d)
{
   if (d->pid > 0) {
      kill (d->pid, SIGTERM);
      for (int waited = 0; waited < 5000; waited += 20) {
         if (waitpid (d->pid, NULL, WNOHANG) == d->pid) {
            d->pid = 0;
            break;
         }
         sleep_ms (20);
      }
      if (d->pid > 0) {
         kill (d->pid, SIGKILL);
         waitpid (d->pid, NULL, 0);
         d->pid = 0;
      }
   }
   if (d->out_path[0])
      unlink (d->out_path);
   if (d->err_path[0] && !getenv ("RELAYBUS_KEEP_DOUBLE_LOG"))
      unlink (d->err_path);
}
