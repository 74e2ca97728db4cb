/*
 * base/log.h - the one way the proxy writes log lines.
 *
 * Thread: any.  log_set_mask: the main thread, before any other thread
 * starts; log_start, log_close and log_set_file: the main thread
 * (start-up, reload, exit); log_reopen: the forwarding loop (SIGUSR1).
 *
 * Lines go to stderr or to log_file, whole, so threads never interleave
 * within a line: "2026-11-30T11:05:18.123Z LEVEL [thread] message", or with
 * log_format = json one object per line: {"time", "level", "thread",
 * "subsystem", "conn" and "peer" for a connection's line, "msg"}.  From
 * log_start to log_stop, lines pass through a queue of LOG_QUEUE_BYTES that
 * a writer thread drains: a caller never waits for the destination, and a
 * line that does not fit is dropped and counted
 * (relaybus_log_lines_dropped_total).
 * Lines about a connection start with "c<id> <peer>: " (see log_conn) so one
 * client's story can be grepped.  The level is process-wide and may change
 * on reload.
 */
#ifndef RELAYBUS_LOG_H
#define RELAYBUS_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>

/* The queue between the callers and the writer thread, in bytes of whole lines. */
#define LOG_QUEUE_BYTES (1024 * 1024)
#define LOG_PATH_MAX 1024

typedef enum {
   LOG_FORMAT_TEXT = 0,
   LOG_FORMAT_JSON,
} log_format_t;

typedef enum {
   LOG_LEVEL_ERROR = 0,
   LOG_LEVEL_WARN,
   LOG_LEVEL_INFO,
   LOG_LEVEL_DEBUG,
} log_level_t;

bool log_level_parse (const char *name, log_level_t *out);

void log_set_level (log_level_t level);
log_level_t log_get_level (void);
/* A short name for the calling thread's lines ("main", "store", "admin"). */
void log_set_thread_name (const char *name);

/* The trace context of the event this thread logs about next (a
 * delivery's trace id and its attempt's span id, 16 and 8 bytes): while
 * set, JSON lines carry them as "trace_id" and "span_id" (lower-case hex,
 * as OpenTelemetry's log data model names them).  NULL clears it. */
void log_set_trace (const uint8_t *trace_id, const uint8_t *span_id);

/* The masking of credentials every message goes through before it is
 * escaped: returns a copy of `text` the caller frees with bson_free.  The
 * configuration's (base/config.h, config_mask of free text), which main.c
 * installs before anything logs; without one nothing is masked. */
typedef char *(*log_mask_t) (const char *text);
void log_set_mask (log_mask_t mask);

/* "text" or "json". */
bool log_format_parse (const char *name, log_format_t *out);
void log_set_format (log_format_t format);

/* Sends lines to `path` (appended to, created 0640), or to stderr for NULL
 * or "".  The file is opened here once to check it (false with the reason
 * in why, which names the path): it must not be a symbolic link, must be
 * owned by the proxy's user or root, and not writable by its group or
 * others (base/trustfile.h); while the writer runs, it switches after the
 * lines already queued. */
bool log_set_file (const char *path, char *why, size_t why_len) __attribute__ ((warn_unused_result));

/* Opens log_file again (SIGUSR1, after logrotate moved it), with the
 * checks of log_set_file; a file refused leaves the lines going to the one
 * in use, and a warning says why. */
void log_reopen (void);

/* Starts the writer thread; until then (and after log_stop) lines are
 * written at once by their caller. */
bool log_start (void) __attribute__ ((warn_unused_result));
/* Writes what is queued, stops the writer thread and closes log_file:
 * lines go to stderr again. */
void log_close (void);

/* Writes one line.  The formatted message is escaped with log_escape, so
 * strings from clients and endpoints may be passed as they are. */
void log_msg (log_level_t level, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

/* Copies in[0..in_len) to out, NUL-terminated, with control characters
 * escaped: LF, CR and tab as \n, \r and \t, other bytes below 0x20, DEL,
 * C1 controls, U+2028/U+2029 and bytes that are not valid UTF-8 as \xNN
 * (one per byte).  Printable UTF-8 is kept.  Stops before an escape or a
 * character that would not fit (never splits one), and sets *cut (may be
 * NULL) when it stopped early.  Returns the length written. */
size_t log_escape (const char *in, size_t in_len, char *out, size_t out_len, bool *cut);

#define log_enabled(level) ((level) <= log_get_level ())
#define log_error(...) log_msg (LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg (LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) log_msg (LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...)                              \
   do {                                            \
      if (log_enabled (LOG_LEVEL_DEBUG))           \
         log_msg (LOG_LEVEL_DEBUG, __VA_ARGS__);   \
   } while (0)

/* A line about one connection: prefixed with "c<id> <peer>: ". */
#define log_conn(level, id, peer, fmt, ...) \
   log_msg ((level), "c%" PRIu64 " %s: " fmt, (uint64_t) (id), (peer), ##__VA_ARGS__)

#endif /* RELAYBUS_LOG_H */
