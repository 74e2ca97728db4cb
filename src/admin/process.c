/*
 * admin/process.c - the process's own figures for /metrics (see
 * admin/process.h).
 *
 * The start time is the kernel's (the process's start in clock ticks after
 * boot, plus the boot time), as the client libraries compute it, so that it
 * matches what `ps` says even when the admin port started later.
 */
#include "admin/process.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* /proc/self/stat's 22nd field: the start time in clock ticks after boot.
 * The 2nd field (the command name) may hold spaces and parentheses: the
 * fields after it are read from its last ')'. */
static bool
start_ticks (unsigned long long *ticks)
{
   char buf[1024], *p;
   FILE *f = fopen ("/proc/self/stat", "re");
   size_t n;
   int field;

   if (!f)
      return false;
   n = fread (buf, 1, sizeof buf - 1, f);
   fclose (f);
   buf[n] = '\0';
   p = strrchr (buf, ')');
   if (!p)
      return false;
   /* Each space after ')' begins the next field: the first one field 3
    * (the state); the start time is field 22. */
   for (field = 2, p++; *p && field < 22; p++)
      if (*p == ' ')
         field++;
   return field == 22 && sscanf (p, "%llu", ticks) == 1;
}

static bool
boot_time (unsigned long long *btime)
{
   char line[256];
   bool found = false;
   FILE *f = fopen ("/proc/stat", "re");

   if (!f)
      return false;
   while (!found && fgets (line, sizeof line, f))
      found = sscanf (line, "btime %llu", btime) == 1;
   fclose (f);
   return found;
}

void
process_stats_read (process_stats_t *out)
{
   struct rusage ru;
   struct rlimit rl;
   unsigned long long size, resident, ticks, btime;
   long page = sysconf (_SC_PAGESIZE), hz = sysconf (_SC_CLK_TCK);
   FILE *f;
   DIR *d;

   memset (out, 0, sizeof *out);
   if (getrusage (RUSAGE_SELF, &ru) == 0)
      out->cpu_seconds = (double) ru.ru_utime.tv_sec + (double) ru.ru_utime.tv_usec / 1e6 + (double) ru.ru_stime.tv_sec +
                         (double) ru.ru_stime.tv_usec / 1e6;
   f = fopen ("/proc/self/statm", "re");
   if (f) {
      out->has_memory = page > 0 && fscanf (f, "%llu %llu", &size, &resident) == 2;
      if (out->has_memory) {
         out->virtual_bytes = (uint64_t) size * (uint64_t) page;
         out->resident_bytes = (uint64_t) resident * (uint64_t) page;
      }
      fclose (f);
   }
   d = opendir ("/proc/self/fd");
   if (d && getrlimit (RLIMIT_NOFILE, &rl) == 0) {
      struct dirent *e;
      while ((e = readdir (d)))
         if (e->d_name[0] != '.')
            out->open_fds++;
      out->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t) rl.rlim_cur;
      out->has_fds = true;
   }
   if (d)
      closedir (d);
   if (hz > 0 && start_ticks (&ticks) && boot_time (&btime)) {
      out->start_time_seconds = (double) btime + (double) ticks / (double) hz;
      out->has_start = true;
   }
}
