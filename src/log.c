/*
 * log.c - leveled log lines on stderr.
 *
 * Each line is formatted into a stack buffer and written with one write(2),
 * so lines from different threads never interleave.  Long messages are cut
 * (with "...") rather than allocated: logging must never fail or block on
 * memory.  The level is an atomic so a reload can change it from the loop
 * while other threads log.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define LOG_LINE_MAX 2048

static atomic_int log_level = LOG_LEVEL_INFO;
static _Thread_local char log_thread_name[16] = "main";

static const char *const log_level_names[] = {
   [LOG_LEVEL_ERROR] = "error",
   [LOG_LEVEL_WARN] = "warn",
   [LOG_LEVEL_INFO] = "info",
   [LOG_LEVEL_DEBUG] = "debug",
};

const char *
log_level_name (log_level_t level)
{
   if ((unsigned) level >= sizeof log_level_names / sizeof log_level_names[0])
      return "unknown";
   return log_level_names[level];
}

bool
log_level_parse (const char *name, log_level_t *out)
{
   for (size_t i = 0; i < sizeof log_level_names / sizeof log_level_names[0]; i++) {
      if (name && strcmp (name, log_level_names[i]) == 0) {
         *out = (log_level_t) i;
         return true;
      }
   }
   return false;
}

void
log_set_level (log_level_t level)
{
   atomic_store (&log_level, (int) level);
}

log_level_t
log_get_level (void)
{
   return (log_level_t) atomic_load_explicit (&log_level, memory_order_relaxed);
}

void
log_set_thread_name (const char *name)
{
   snprintf (log_thread_name, sizeof log_thread_name, "%s", name);
}

void
log_msg (log_level_t level, const char *fmt, ...)
{
   char line[LOG_LINE_MAX];
   struct timeval tv;
   struct tm tm;
   size_t n;
   int r;
   va_list ap;

   if (!log_enabled (level))
      return;

   gettimeofday (&tv, NULL);
   gmtime_r (&tv.tv_sec, &tm);
   n = strftime (line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
   r = snprintf (line + n,
                 sizeof line - n,
                 ".%03dZ %-5s [%s] ",
                 (int) (tv.tv_usec / 1000),
                 log_level_name (level),
                 log_thread_name);
   if (r > 0)
      n += (size_t) r < sizeof line - n ? (size_t) r : sizeof line - n - 1;

   va_start (ap, fmt);
   r = vsnprintf (line + n, sizeof line - n, fmt, ap);
   va_end (ap);
   if (r < 0) {
      r = 0;
   }
   if ((size_t) r >= sizeof line - n - 1) {
      /* Truncated: mark it, keep room for the newline. */
      n = sizeof line - 5;
      memcpy (line + n, "...", 3);
      n += 3;
   } else {
      n += (size_t) r;
   }
   line[n++] = '\n';

   /* One write per line; a short write to stderr is not worth a retry loop
    * that could block the caller. */
   if (write (STDERR_FILENO, line, n) < 0) {
      /* Nowhere left to report it. */
   }
}
