/*
 * base/log.c - leveled log lines on stderr.
 *
 * Each line is formatted into a stack buffer, as text or as one JSON
 * object, and handed whole to the destination, so lines from different
 * threads never interleave.  Long messages are cut (with "...") rather
 * than grown: logging must never fail or block on a destination.  Once
 * log_start has run, lines go through a bounded queue that a writer thread
 * drains to stderr or log_file: a destination that stalls (a log reader
 * that stopped reading a full pipe) costs dropped lines, counted in
 * relaybus_log_lines_dropped_total and reported when it recovers, never a
 * blocked forwarding loop.  The level and the format are atomics so a reload can change them
 * from the loop while other threads log.
 *
 * Messages often carry strings a client or an endpoint chose (command
 * names, event ids, annotation fields, answers of webhooks): every message
 * goes through log_escape here, so that no caller can forget it and no
 * client can start a forged line.  Control characters become \n, \r, \t
 * or \xNN; printable UTF-8 stays as it is.  Before that, every message
 * goes through the masking main.c installs (log_set_mask: the
 * configuration's config_mask), so the user information of each URL and
 * each configured secret quoted verbatim become "********".
 *
 * When stderr is the journal (systemd sets JOURNAL_STREAM to its device
 * and inode), each line written there starts with its sd-daemon(3)
 * priority, "<3>" for error to "<7>" for debug, which journald takes as
 * the entry's priority (so `journalctl -p err` finds the errors) and
 * removes from the text.
 */
#include "base/log.h"
#include "base/assert.h"
#include "base/counters.h"
#include "base/trustfile.h"
#include "base/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <bson/bson.h>

/* Writes what is queued, then stops the writer. */
static void log_stop (void);

/* "error", "warn", "info", "debug". */
static const char *log_level_name (log_level_t level);

/* log_set_trace's ids as hex; "" when none is set. */
static _Thread_local char log_trace_id[33], log_span_id[17];

static void
hex_into (char *out, const uint8_t *in, size_t n)
{
   static const char digits[] = "0123456789abcdef";

   for (size_t i = 0; i < n; i++) {
      out[2 * i] = digits[in[i] >> 4];
      out[2 * i + 1] = digits[in[i] & 15];
   }
   out[2 * n] = '\0';
}

void
log_set_trace (const uint8_t *trace_id, const uint8_t *span_id)
{
   if (!trace_id || !span_id) {
      log_trace_id[0] = log_span_id[0] = '\0';
      return;
   }
   hex_into (log_trace_id, trace_id, 16);
   hex_into (log_span_id, span_id, 8);
}

#define LOG_LINE_MAX 2048
/* "2026-11-30T11:05:18.123Z error [thread] ": 24 + 7 + 15 + 3, rounded up. */
#define LOG_PREFIX_MAX 64

static atomic_int log_level = LOG_LEVEL_INFO;
static _Thread_local char log_thread_name[16] = "main";
/* Set once, before any other thread starts (log_set_mask). */
static log_mask_t log_mask;

static const char *const log_level_names[] = {
   [LOG_LEVEL_ERROR] = "error",
   [LOG_LEVEL_WARN] = "warn",
   [LOG_LEVEL_INFO] = "info",
   [LOG_LEVEL_DEBUG] = "debug",
};

static const char *
log_level_name (log_level_t level)
{
   if ((unsigned) level >= sizeof log_level_names / sizeof log_level_names[0])
      return "unknown";
   return log_level_names[level];
}

/* The index of `name` in names[0..n), or -1. */
static int
name_index (const char *const *names, size_t n, const char *name)
{
   for (size_t i = 0; name && i < n; i++) {
      if (strcmp (name, names[i]) == 0)
         return (int) i;
   }
   return -1;
}

bool
log_level_parse (const char *name, log_level_t *out)
{
   int i = name_index (log_level_names, sizeof log_level_names / sizeof log_level_names[0], name);

   if (i < 0)
      return false;
   *out = (log_level_t) i;
   return true;
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

/* ------------------------------------------------------------ destination and queue */

/* Where lines go: stderr, or log_file (opened by the writer thread, or
 * directly while no writer runs).  `queue` is a byte ring of whole lines;
 * once the writer thread runs, log_msg only copies a line into it under the
 * mutex, so a stalled destination (a full pipe, a slow disk) costs dropped
 * lines, counted, never a blocked caller. */
static struct {
   pthread_mutex_t mu;
   pthread_cond_t cond;
   pthread_t thread;
   bool running, stop;
   char queue[LOG_QUEUE_BYTES];
   size_t head, len;    /* ring: bytes [head, head + len) mod size */
   int fd;              /* STDERR_FILENO or the open log_file */
   char path[LOG_PATH_MAX]; /* "" for stderr */
   bool reopen;         /* open `path` again before the next write */
   uint64_t dropped_unreported;
} lq = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false, false, {0}, 0, 0, STDERR_FILENO, "", false, 0};

/* Whether stderr is the journal: JOURNAL_STREAM ("DEVICE:INODE", set by
 * systemd for a unit whose stderr it connected to journald) names the
 * file stderr is.  -1: not checked since the destination last changed. */
static atomic_int journal_stream = -1;

static bool
stderr_is_journal (void)
{
   int v = atomic_load (&journal_stream);

   if (v < 0) {
      const char *e = getenv ("JOURNAL_STREAM");
      unsigned long long dev, ino;
      struct stat st;
      char end;

      v = e && sscanf (e, "%llu:%llu%c", &dev, &ino, &end) == 2 && fstat (STDERR_FILENO, &st) == 0 &&
          (unsigned long long) st.st_dev == dev && (unsigned long long) st.st_ino == ino;
      atomic_store (&journal_stream, v);
   }
   return v == 1;
}

/* sd-daemon(3)'s prefixes: SD_ERR, SD_WARNING, SD_INFO, SD_DEBUG. */
static const char *const journal_prefix[] = {
   [LOG_LEVEL_ERROR] = "<3>",
   [LOG_LEVEL_WARN] = "<4>",
   [LOG_LEVEL_INFO] = "<6>",
   [LOG_LEVEL_DEBUG] = "<7>",
};
#define JOURNAL_PREFIX_LEN 3

static atomic_int log_format = LOG_FORMAT_TEXT;

static const char *const log_format_names[] = {[LOG_FORMAT_TEXT] = "text", [LOG_FORMAT_JSON] = "json"};

void
log_set_mask (log_mask_t mask)
{
   log_mask = mask;
}

bool
log_format_parse (const char *name, log_format_t *out)
{
   int i = name_index (log_format_names, sizeof log_format_names / sizeof log_format_names[0], name);

   if (i < 0)
      return false;
   *out = (log_format_t) i;
   return true;
}

void
log_set_format (log_format_t format)
{
   atomic_store (&log_format, (int) format);
}

/* Writes all of buf to fd (the writer thread, or a caller while none runs). */
static void
write_all (int fd, const char *buf, size_t n)
{
   while (n > 0) {
      ssize_t w = write (fd, buf, n);
      if (w < 0 && errno == EINTR)
         continue;
      if (w <= 0)
         return; /* nowhere left to report it */
      buf += w;
      n -= (size_t) w;
   }
}

/* Every line goes to log_file, so it must be the proxy's own file: a
 * regular file (a FIFO would hold the open, and start-up, until a reader
 * came: trustfile_open never waits), not a symbolic link nor a hard link
 * (one planted in a writable directory would send the lines, and the
 * appends, to a file of its maker's choice), owned by the proxy's user or
 * root, and writable by nobody else (who could truncate it, or forge
 * lines).  The same check as the auth file's (base/trustfile.h), at
 * start-up, on reload and on every reopen. */
static int
open_log_file (const char *path, char *why, size_t why_len)
{
   return trustfile_open (path,
                          O_WRONLY | O_APPEND | O_CREAT,
                          0640,
                          TRUSTFILE_NOFOLLOW | TRUSTFILE_ONE_LINK | TRUSTFILE_OWNER | TRUSTFILE_NO_GROUP_WRITE |
                             TRUSTFILE_NO_OTHERS_WRITE,
                          NULL,
                          why,
                          why_len);
}

/* Opens lq.path in place of the current destination; lq.mu held. */
static void
reopen_locked (char *note, size_t note_len)
{
   char why[LOG_PATH_MAX + 160]; /* cut to fit in the note */
   int fd;

   lq.reopen = false;
   note[0] = '\0';
   if (!lq.path[0]) {
      if (lq.fd != STDERR_FILENO)
         close (lq.fd);
      lq.fd = STDERR_FILENO;
      return;
   }
   fd = open_log_file (lq.path, why, sizeof why);
   if (fd < 0) {
      snprintf (note, note_len, "log_file refused (%s): logging on to the previous destination", why);
      return;
   }
   if (lq.fd != STDERR_FILENO)
      close (lq.fd);
   lq.fd = fd;
}

static void
note_line (const char *text)
{
   log_msg (LOG_LEVEL_WARN, "log: %s", text);
}

bool
log_set_file (const char *path, char *why, size_t why_len)
{
   const char *p = path ? path : "";
   char note[LOG_PATH_MAX + 256];
   bool ok = true;

   if (strlen (p) >= sizeof lq.path) {
      snprintf (why, why_len, "path longer than %d bytes", LOG_PATH_MAX - 1);
      return false;
   }
   if (*p) {
      /* Checked here, in the caller, so that a bad path is a config error. */
      int fd = open_log_file (p, why, why_len);
      if (fd < 0)
         return false;
      close (fd);
   }
   pthread_mutex_lock (&lq.mu);
   if (strcmp (lq.path, p) != 0) {
      snprintf (lq.path, sizeof lq.path, "%s", p);
      if (lq.running) {
         lq.reopen = true;
         pthread_cond_signal (&lq.cond);
      } else {
         reopen_locked (note, sizeof note);
         ok = note[0] == '\0';
         if (!ok)
            snprintf (why, why_len, "%s", note);
      }
   }
   pthread_mutex_unlock (&lq.mu);
   return ok;
}

void
log_reopen (void)
{
   char note[LOG_PATH_MAX + 256];

   pthread_mutex_lock (&lq.mu);
   if (lq.running) {
      lq.reopen = true;
      pthread_cond_signal (&lq.cond);
      note[0] = '\0';
   } else {
      reopen_locked (note, sizeof note);
   }
   pthread_mutex_unlock (&lq.mu);
   if (note[0])
      note_line (note);
}

static void *
log_writer (void *arg)
{
   char note[LOG_PATH_MAX + 256];

   (void) arg;
   log_set_thread_name ("log");
   pthread_mutex_lock (&lq.mu);
   for (;;) {
      while (lq.len == 0 && !lq.stop && !lq.reopen && lq.dropped_unreported == 0)
         pthread_cond_wait (&lq.cond, &lq.mu);
      if (lq.reopen) {
         reopen_locked (note, sizeof note);
         if (note[0]) {
            pthread_mutex_unlock (&lq.mu);
            note_line (note);
            pthread_mutex_lock (&lq.mu);
         }
         continue;
      }
      if (lq.len > 0) {
         /* The contiguous part; the lock is not held while writing. */
         size_t n = lq.len < LOG_QUEUE_BYTES - lq.head ? lq.len : LOG_QUEUE_BYTES - lq.head;
         const char *p = lq.queue + lq.head;
         int fd = lq.fd;

         pthread_mutex_unlock (&lq.mu);
         write_all (fd, p, n);
         pthread_mutex_lock (&lq.mu);
         lq.head = (lq.head + n) % LOG_QUEUE_BYTES;
         lq.len -= n;
         continue;
      }
      if (lq.dropped_unreported > 0) {
         uint64_t d = lq.dropped_unreported;

         lq.dropped_unreported = 0;
         pthread_mutex_unlock (&lq.mu);
         log_msg (LOG_LEVEL_WARN, "log: %" PRIu64 " lines dropped: the log destination did not keep up", d);
         pthread_mutex_lock (&lq.mu);
         continue;
      }
      if (lq.stop)
         break;
   }
   pthread_mutex_unlock (&lq.mu);
   return NULL;
}

bool
log_start (void)
{
   bool ok;

   pthread_mutex_lock (&lq.mu);
   lq.stop = false;
   ok = lq.running || pthread_create (&lq.thread, NULL, log_writer, NULL) == 0;
   if (ok)
      lq.running = true;
   pthread_mutex_unlock (&lq.mu);
   return ok;
}

static void
log_stop (void)
{
   pthread_mutex_lock (&lq.mu);
   if (!lq.running) {
      pthread_mutex_unlock (&lq.mu);
      return;
   }
   lq.stop = true;
   pthread_cond_signal (&lq.cond);
   pthread_mutex_unlock (&lq.mu);
   pthread_join (lq.thread, NULL);
   pthread_mutex_lock (&lq.mu);
   lq.running = false;
   pthread_mutex_unlock (&lq.mu);
}

void
log_close (void)
{
   log_stop ();
   pthread_mutex_lock (&lq.mu);
   if (lq.fd != STDERR_FILENO)
      close (lq.fd);
   lq.fd = STDERR_FILENO;
   lq.path[0] = '\0';
   pthread_mutex_unlock (&lq.mu);
   /* stderr may be another file next time (checked again at the next line). */
   atomic_store (&journal_stream, -1);
}

/* Hands one whole line to the destination: queued while the writer runs
 * (dropped and counted when it does not fit), written at once otherwise.
 * The JOURNAL_PREFIX_LEN bytes before `line` are the caller's: the
 * priority prefix goes there when the destination is the journal. */
static void
emit (log_level_t level, char *line, size_t n)
{
   pthread_mutex_lock (&lq.mu);
   if (lq.fd == STDERR_FILENO && (unsigned) level < sizeof journal_prefix / sizeof journal_prefix[0] &&
       stderr_is_journal ()) {
      line -= JOURNAL_PREFIX_LEN;
      memcpy (line, journal_prefix[level], JOURNAL_PREFIX_LEN);
      n += JOURNAL_PREFIX_LEN;
   }
   if (!lq.running) {
      write_all (lq.fd, line, n);
   } else if (LOG_QUEUE_BYTES - lq.len < n) {
      lq.dropped_unreported++;
      counters_add (COUNTER_LOG_LINES_DROPPED, 1);
   } else {
      size_t tail = (lq.head + lq.len) % LOG_QUEUE_BYTES;
      size_t first = n < LOG_QUEUE_BYTES - tail ? n : LOG_QUEUE_BYTES - tail;

      memcpy (lq.queue + tail, line, first);
      memcpy (lq.queue, line + first, n - first);
      lq.len += n;
      pthread_cond_signal (&lq.cond);
   }
   pthread_mutex_unlock (&lq.mu);
}

/* ------------------------------------------------------------ formats */

/* Appends `s` to out[*o..cap) as the inside of a JSON string.  `s` is
 * already escaped by log_escape (printable UTF-8 only), so only the quote
 * and the backslash need escaping; stops before an escape that would not
 * fit. */
static void
json_str (char *out, size_t cap, size_t *o, const char *s, size_t len)
{
   for (size_t i = 0; i < len; i++) {
      size_t need = (s[i] == '"' || s[i] == '\\') ? 2 : 1;
      if (*o + need >= cap)
         return;
      if (need == 2)
         out[(*o)++] = '\\';
      out[(*o)++] = s[i];
   }
}

static void
json_lit (char *out, size_t cap, size_t *o, const char *s)
{
   size_t n = strlen (s);
   if (*o + n < cap) {
      memcpy (out + *o, s, n);
      *o += n;
   }
}

/* One JSON object: time, level, thread, subsystem, and for a connection's
 * line (log_conn's "c<id> <peer>: ") conn and peer, then msg. */
static size_t
format_json (char *out, size_t cap, const char *stamp, log_level_t level, const char *msg, size_t len)
{
   const char *body = msg, *peer = NULL, *sub = NULL;
   size_t body_len = len, peer_len = 0, sub_len = 0, o = 0;
   uint64_t conn = 0;
   bool have_conn = false;
   char num[24];

   if (len > 1 && msg[0] == 'c' && msg[1] >= '0' && msg[1] <= '9') {
      size_t i = 1;
      while (i < len && msg[i] >= '0' && msg[i] <= '9')
         conn = conn * 10 + (uint64_t) (msg[i++] - '0');
      if (i < len && msg[i] == ' ') {
         const char *colon = memchr (msg + i + 1, ' ', len - i - 1);
         if (colon && colon > msg + i + 1 && colon[-1] == ':') {
            have_conn = true;
            peer = msg + i + 1;
            peer_len = (size_t) (colon - 1 - peer);
            body = colon + 1;
            body_len = len - (size_t) (body - msg);
         }
      }
   }
   if (!have_conn) {
      /* "dispatch: ...", "reload: ...": a short lowercase word and ": ". */
      size_t i = 0;
      while (i < len && i < 24 && ((msg[i] >= 'a' && msg[i] <= 'z') || msg[i] == '_' || msg[i] == '-' ||
                                   (i > 0 && msg[i] >= '0' && msg[i] <= '9')))
         i++;
      if (i > 0 && i + 1 < len && msg[i] == ':' && msg[i + 1] == ' ') {
         sub = msg;
         sub_len = i;
      }
   }
   json_lit (out, cap, &o, "{\"time\":\"");
   json_lit (out, cap, &o, stamp);
   json_lit (out, cap, &o, "\",\"level\":\"");
   json_lit (out, cap, &o, log_level_name (level));
   json_lit (out, cap, &o, "\",\"thread\":\"");
   json_str (out, cap, &o, log_thread_name, strlen (log_thread_name));
   json_lit (out, cap, &o, "\",\"subsystem\":\"");
   if (have_conn)
      json_lit (out, cap, &o, "client");
   else if (sub)
      json_str (out, cap, &o, sub, sub_len);
   else
      json_str (out, cap, &o, log_thread_name, strlen (log_thread_name));
   json_lit (out, cap, &o, "\"");
   if (have_conn) {
      snprintf (num, sizeof num, "%" PRIu64, conn);
      json_lit (out, cap, &o, ",\"conn\":");
      json_lit (out, cap, &o, num);
      json_lit (out, cap, &o, ",\"peer\":\"");
      json_str (out, cap, &o, peer, peer_len);
      json_lit (out, cap, &o, "\"");
   }
   if (log_trace_id[0]) {
      json_lit (out, cap, &o, ",\"trace_id\":\"");
      json_lit (out, cap, &o, log_trace_id);
      json_lit (out, cap, &o, "\",\"span_id\":\"");
      json_lit (out, cap, &o, log_span_id);
      json_lit (out, cap, &o, "\"");
   }
   json_lit (out, cap, &o, ",\"msg\":\"");
   json_str (out, cap, &o, body, body_len);
   /* Room for the closing characters was kept by the callers' bound. */
   memcpy (out + o, "\"}\n", 3);
   return o + 3;
}

void
log_msg (log_level_t level, const char *fmt, ...)
{
   char raw[LOG_LINE_MAX];
   char msg[LOG_LINE_MAX];
   char buf[JOURNAL_PREFIX_LEN + 2 * LOG_LINE_MAX + 256];
   char *line = buf + JOURNAL_PREFIX_LEN; /* room for emit's priority prefix */
   char stamp[32];
   char *masked = NULL;
   const char *text = raw;
   bool cut;
   struct timeval tv;
   struct tm tm;
   size_t n, m;
   int r;
   va_list ap;

   if (!log_enabled (level))
      return;

   gettimeofday (&tv, NULL);
   gmtime_r (&tv.tv_sec, &tm);
   n = strftime (stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
   snprintf (stamp + n, sizeof stamp - n, ".%03dZ", (int) (tv.tv_usec / 1000));

   va_start (ap, fmt);
   r = vsnprintf (raw, sizeof raw, fmt, ap);
   va_end (ap);
   if (r < 0)
      r = 0;
   /* Every line goes through the one masking of credentials, so that no
    * caller can log a broker's URL or a library's message quoting a
    * password in clear.  It allocates (bson_malloc aborts rather than
    * fail); a line cut by vsnprintf is masked as cut. */
   if (log_mask && (masked = log_mask (raw)))
      text = masked;
   /* Room is kept for "..." and for the text format's prefix (at most
    * LOG_PREFIX_MAX bytes), so that a text line never exceeds LOG_LINE_MAX. */
   m = log_escape (text, strlen (text), msg, sizeof msg - 4 - LOG_PREFIX_MAX, &cut);
   bson_free (masked);
   if (cut || (size_t) r >= sizeof raw) {
      /* Truncated: mark it. */
      memcpy (msg + m, "...", 4);
      m += 3;
   }

   if (atomic_load_explicit (&log_format, memory_order_relaxed) == LOG_FORMAT_JSON) {
      /* Every byte of msg doubles at most: the line always fits. */
      n = format_json (line, sizeof buf - JOURNAL_PREFIX_LEN - 3, stamp, level, msg, m);
   } else {
      r = snprintf (line, sizeof buf - JOURNAL_PREFIX_LEN, "%s %-5s [%s] ", stamp, log_level_name (level), log_thread_name);
      n = r > 0 ? (size_t) r : 0;
      memcpy (line + n, msg, m);
      n += m;
      line[n++] = '\n';
   }
   RELAYBUS_ASSERT (n <= sizeof buf - JOURNAL_PREFIX_LEN);
   emit (level, line, n);
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
