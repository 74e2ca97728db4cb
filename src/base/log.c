/*
 * base/log.c - leveled log lines on stderr.
 *
 * Each line is formatted into a stack buffer and written with one write(2),
 * so lines from different threads never interleave.  Long messages are cut
 * (with "...") rather than allocated: logging must never fail or block on
 * memory.  The level is an atomic so a reload can change it from the loop
 * while other threads log.
 *
 * Messages often carry strings a client or an endpoint chose (command
 * names, event ids, annotation fields, answers of webhooks): every message
 * goes through log_escape here, so that no caller can forget it and no
 * client can start a forged line.  Control characters become \n, \r, \t
 * or \xNN; printable UTF-8 stays as it is.
 */
#include "base/log.h"
#include "base/assert.h"
#include "base/utf8.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
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

/* C1 controls (U+0080..U+009F) and the Unicode line and paragraph
 * separators end or rewrite lines in some terminals and viewers. */
static bool
utf8_is_control (const unsigned char *s, size_t n)
{
   if (n == 2 && s[0] == 0xc2 && s[1] < 0xa0)
      return true;
   return n == 3 && s[0] == 0xe2 && s[1] == 0x80 && (s[2] == 0xa8 || s[2] == 0xa9);
}

size_t
log_escape (const char *in, size_t in_len, char *out, size_t out_len, bool *cut)
{
   static const char hex[] = "0123456789abcdef";
   const unsigned char *s = (const unsigned char *) in;
   size_t i = 0, o = 0;

   if (cut)
      *cut = false;
   if (out_len == 0)
      return 0;
   while (i < in_len) {
      char esc[16];
      size_t e = 0, n = utf8_char_len (in + i, in_len - i);

      if (n == 1 && s[i] >= 0x20 && s[i] != 0x7f) {
         esc[e++] = (char) s[i];
      } else if (n == 1 && (s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) {
         esc[e++] = '\\';
         esc[e++] = s[i] == '\n' ? 'n' : s[i] == '\r' ? 'r' : 't';
      } else if (n > 1 && !utf8_is_control (s + i, n)) {
         memcpy (esc, s + i, n);
         e = n;
      } else {
         /* A control byte, a C1 control or line separator (each of its
          * bytes), or a byte that starts no valid UTF-8 sequence. */
         if (n == 0)
            n = 1;
         for (size_t k = 0; k < n; k++) {
            esc[e++] = '\\';
            esc[e++] = 'x';
            esc[e++] = hex[s[i + k] >> 4];
            esc[e++] = hex[s[i + k] & 0xf];
         }
      }
      /* Whole escapes and whole characters only; room for the NUL. */
      if (o + e >= out_len) {
         if (cut)
            *cut = true;
         break;
      }
      memcpy (out + o, esc, e);
      o += e;
      i += n;
   }
   out[o] = '\0';
   return o;
}

void
log_msg (log_level_t level, const char *fmt, ...)
{
   char line[LOG_LINE_MAX];
   char raw[LOG_LINE_MAX];
   bool cut;
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
   r = vsnprintf (raw, sizeof raw, fmt, ap);
   va_end (ap);
   if (r < 0)
      r = 0;
   /* Room is kept for "..." and the newline. */
   n += log_escape (raw, (size_t) r < sizeof raw ? (size_t) r : sizeof raw - 1, line + n, sizeof line - n - 4, &cut);
   if (cut || (size_t) r >= sizeof raw) {
      /* Truncated: mark it. */
      memcpy (line + n, "...", 3);
      n += 3;
   }
   line[n++] = '\n';

   /* One write per line; a short write to stderr is not worth a retry loop
    * that could block the caller. */
   if (write (STDERR_FILENO, line, n) < 0) {
      /* Nowhere left to report it. */
   }
}

#ifdef RELAYBUS_DEBUG
void
relaybus_assert_fail (const char *cond, const char *file, int line, const char *func)
{
   char buf[512];
   int n = snprintf (buf, sizeof buf, "assertion failed: %s (%s:%d, %s) [%s]\n", cond, file, line, func, log_thread_name);

   if (n > 0 && write (STDERR_FILENO, buf, (size_t) n < sizeof buf ? (size_t) n : sizeof buf - 1) < 0) {
      /* Aborting anyway. */
   }
   abort ();
}
#endif
