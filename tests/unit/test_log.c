/*
 * test_log.c - src/base/log.c: every message is escaped so that a string from a
 * client or an endpoint can neither start a new line nor hide one (LF, CR,
 * other controls, C1 controls, U+2028, bytes that are not UTF-8), while
 * printable UTF-8 is kept as it is; a long message is cut on a whole
 * escape or character, and log_msg writes exactly one line.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/log.h"
#include "base/assert.h"
#include "base/config.h"

#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

typedef struct {
   const char *in;
   size_t in_len; /* 0: strlen (in) */
   const char *out;
} escape_case_t;

static const escape_case_t escape_cases[] = {
   {"plain text", 0, "plain text"},
   {"", 0, ""},
   {"relaybusX\nfake 2026-01-01T00:00:00.000Z error [main] line", 0, "relaybusX\\nfake 2026-01-01T00:00:00.000Z error [main] line"},
   {"a\r\nb\tc", 0, "a\\r\\nb\\tc"},
   {"bell\x07 esc\x1b[31m del\x7f", 0, "bell\\x07 esc\\x1b[31m del\\x7f"},
   {"nul\0after", 9, "nul\\x00after"},
   /* Printable UTF-8 stays: é, €, 😀. */
   {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 0, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
   /* C1 control NEL (U+0085) and the line separator U+2028. */
   {"x\xc2\x85y\xe2\x80\xa8z", 0, "x\\xc2\\x85y\\xe2\\x80\\xa8z"},
   /* Not UTF-8: a stray continuation byte, 0xff, an overlong '/', a
    * surrogate, a sequence cut short at the end. */
   {"\x80\xff", 0, "\\x80\\xff"},
   {"\xc0\xaf", 0, "\\xc0\\xaf"},
   {"\xed\xa0\x80", 0, "\\xed\\xa0\\x80"},
   {"end\xe2\x82", 0, "end\\xe2\\x82"},
   /* A backslash is not a control character. */
   {"a\\nb", 0, "a\\nb"},
};

static void
test_escape_table (void **state)
{
   (void) state;
   for (size_t i = 0; i < sizeof escape_cases / sizeof escape_cases[0]; i++) {
      const escape_case_t *c = &escape_cases[i];
      size_t len = c->in_len ? c->in_len : strlen (c->in);
      char out[256];
      bool cut = true;
      size_t n = log_escape (c->in, len, out, sizeof out, &cut);

      if (strcmp (out, c->out) != 0)
         fail_msg ("case %zu: got \"%s\", want \"%s\"", i, out, c->out);
      assert_int_equal (n, strlen (c->out));
      assert_false (cut);
   }
}

/* Output that is too small stops before an escape or a character that
 * would not fit. */
static void
test_escape_cut_whole (void **state)
{
   char out[8];
   bool cut = false;

   (void) state;
   /* "ab" + "\n" fits (5 bytes with NUL); the next escape would not. */
   assert_int_equal (log_escape ("ab\n\n", 4, out, 6, &cut), 4);
   assert_string_equal (out, "ab\\n");
   assert_true (cut);
   /* A 4-byte character is never split. */
   assert_int_equal (log_escape ("abcd\xf0\x9f\x98\x80", 8, out, sizeof out, &cut), 4);
   assert_string_equal (out, "abcd");
   assert_true (cut);
   /* \x escapes are whole too. */
   assert_int_equal (log_escape ("abcd\x01", 5, out, sizeof out, &cut), 4);
   assert_string_equal (out, "abcd");
   assert_true (cut);
   assert_int_equal (log_escape ("abc", 3, out, 1, &cut), 0);
   assert_string_equal (out, "");
}

/* Reads what log_msg wrote to stderr (redirected to a file). */
static char *
capture (void (*fn) (void))
{
   char path[] = "/tmp/test_log.XXXXXX";
   int fd = mkstemp (path);
   int saved = dup (STDERR_FILENO);
   static char buf[16384];
   ssize_t n;

   assert_true (fd >= 0 && saved >= 0);
   assert_int_equal (dup2 (fd, STDERR_FILENO), STDERR_FILENO);
   fn ();
   assert_int_equal (dup2 (saved, STDERR_FILENO), STDERR_FILENO);
   close (saved);
   n = pread (fd, buf, sizeof buf - 1, 0);
   assert_true (n >= 0);
   buf[n] = '\0';
   close (fd);
   unlink (path);
   return buf;
}

static void
log_injection (void)
{
   log_info ("c7 127.0.0.1:5555: %s with moreToCome cannot be published", "relaybusX\n2026-01-01T00:00:00.000Z error [main] forged\r");
}

static void
log_long (void)
{
   static char big[5000];

   memset (big, '\n', sizeof big - 1);
   log_warn ("long: %s", big);
}

static size_t
count_char (const char *s, char ch)
{
   size_t n = 0;
   for (; *s; s++)
      n += *s == ch;
   return n;
}

static void
test_log_msg_one_line (void **state)
{
   const char *out;

   (void) state;
   log_set_level (LOG_LEVEL_INFO);
   out = capture (log_injection);
   assert_int_equal (count_char (out, '\n'), 1);
   assert_int_equal (count_char (out, '\r'), 0);
   assert_non_null (strstr (out, "info  [main] c7 127.0.0.1:5555: relaybusX\\n2026-01-01T00:00:00.000Z error [main] forged\\r with moreToCome"));
   assert_int_equal (out[strlen (out) - 1], '\n');

   /* A message that cannot fit is cut on a whole escape and marked. */
   out = capture (log_long);
   assert_int_equal (count_char (out, '\n'), 1);
   assert_true (strlen (out) <= 2048);
   assert_non_null (strstr (out, "\\n\\n..."));
   assert_null (strstr (out, "\\..."));
}

/* log_file is the proxy's own file: a symbolic link, a file another user
 * owns, and a file its group or others may write are refused, each with a
 * message that names the path and what to do; the refused file is neither
 * written nor truncated.  A refused reopen (SIGUSR1) keeps the file in use. */
static void
test_log_file_trust (void **state)
{
   char dir[] = "/tmp/relaybus-logfile-XXXXXX";
   char good[256], link_path[256], other[256], gw[256], ow[256], why[2048];
   struct passwd *nobody = getpwnam ("nobody");
   struct stat st;
   int fd;

   (void) state;
   assert_non_null (mkdtemp (dir));
   snprintf (good, sizeof good, "%s/good.log", dir);
   snprintf (link_path, sizeof link_path, "%s/link.log", dir);
   snprintf (other, sizeof other, "%s/other.log", dir);
   snprintf (gw, sizeof gw, "%s/gw.log", dir);
   snprintf (ow, sizeof ow, "%s/ow.log", dir);

   /* Created by the proxy: accepted, mode 0640. */
   assert_true (log_set_file (good, why, sizeof why));
   assert_int_equal (stat (good, &st), 0);
   assert_int_equal (st.st_mode & 0777, 0640);

   /* A symbolic link, even to an acceptable file. */
   assert_int_equal (symlink (good, link_path), 0);
   assert_false (log_set_file (link_path, why, sizeof why));
   assert_non_null (strstr (why, "is a symbolic link"));
   assert_non_null (strstr (why, link_path));

   /* A file another user owns (the test runs as root: chown works). */
   if (nobody && geteuid () == 0) {
      fd = open (other, O_WRONLY | O_CREAT, 0600);
      assert_true (fd >= 0);
      close (fd);
      assert_int_equal (chown (other, nobody->pw_uid, nobody->pw_gid), 0);
      assert_false (log_set_file (other, why, sizeof why));
      assert_non_null (strstr (why, "is owned by uid"));
      assert_int_equal (stat (other, &st), 0);
      assert_int_equal (st.st_size, 0);
   }

   /* Writable by its group, by others. */
   fd = open (gw, O_WRONLY | O_CREAT, 0600);
   assert_true (fd >= 0);
   assert_int_equal (write (fd, "x\n", 2), 2);
   close (fd);
   assert_int_equal (chmod (gw, 0660), 0);
   assert_false (log_set_file (gw, why, sizeof why));
   assert_non_null (strstr (why, "writable by its group (mode 660): chmod g-w"));
   assert_int_equal (stat (gw, &st), 0);
   assert_int_equal (st.st_size, 2);
   fd = open (ow, O_WRONLY | O_CREAT, 0600);
   assert_true (fd >= 0);
   close (fd);
   assert_int_equal (chmod (ow, 0646), 0);
   assert_false (log_set_file (ow, why, sizeof why));
   assert_non_null (strstr (why, "writable by others (mode 646): chmod o-w"));

   /* A FIFO, with no reader and with one: refused at once, never waited on
    * (an open for writing would wait for a reader for ever). */
   {
      char fifo[256];
      int rfd;

      snprintf (fifo, sizeof fifo, "%s/fifo.log", dir);
      assert_int_equal (mkfifo (fifo, 0600), 0);
      assert_false (log_set_file (fifo, why, sizeof why));
      assert_non_null (strstr (why, "not a regular file"));
      rfd = open (fifo, O_RDONLY | O_NONBLOCK);
      assert_true (rfd >= 0);
      assert_false (log_set_file (fifo, why, sizeof why));
      assert_non_null (strstr (why, "not a regular file (a FIFO)"));
      close (rfd);
      unlink (fifo);
   }

   /* A second hard link: the file may be another's name too. */
   {
      char hard[256];

      snprintf (hard, sizeof hard, "%s/hard.log", dir);
      assert_int_equal (link (gw, hard), 0);
      assert_int_equal (chmod (gw, 0600), 0);
      assert_false (log_set_file (hard, why, sizeof why));
      assert_non_null (strstr (why, "has 2 hard links"));
      unlink (hard);
      assert_true (log_set_file (gw, why, sizeof why));
      assert_true (log_set_file (good, why, sizeof why));
   }

   /* The file in use goes bad, then SIGUSR1's reopen: refused, and the
    * lines go on to the file already open. */
   assert_int_equal (chmod (good, 0666), 0);
   log_reopen ();
   log_warn ("after the refused reopen");
   {
      char buf[4096];
      ssize_t n;

      fd = open (good, O_RDONLY);
      assert_true (fd >= 0);
      n = read (fd, buf, sizeof buf - 1);
      close (fd);
      assert_true (n > 0);
      buf[n] = '\0';
      assert_non_null (strstr (buf, "log_file refused ("));
      assert_non_null (strstr (buf, "writable by others (mode 666)"));
      assert_non_null (strstr (buf, "after the refused reopen"));
   }
   log_close ();
   unlink (good);
   unlink (link_path);
   unlink (other);
   unlink (gw);
   unlink (ow);
   rmdir (dir);
}

/* log_format = json: one object per line; a connection's line carries conn
 * and peer; what the client sent is escaped, then JSON-encoded. */
static void
test_log_json (void **state)
{
   const char *out;

   (void) state;
   log_set_level (LOG_LEVEL_INFO);
   log_set_format (LOG_FORMAT_JSON);
   out = capture (log_injection);
   log_set_format (LOG_FORMAT_TEXT);
   assert_int_equal (count_char (out, '\n'), 1);
   assert_int_equal (strncmp (out, "{\"time\":\"", 9), 0);
   assert_non_null (strstr (out, "\",\"level\":\"info\",\"thread\":\"main\",\"subsystem\":\"client\",\"conn\":7,\"peer\":\"127.0.0.1:5555\",\"msg\":\"relaybusX\\\\n2026-01-01T00:00:00.000Z error [main] forged\\\\r with moreToCome"));
   assert_int_equal (strcmp (out + strlen (out) - 3, "\"}\n"), 0);
   assert_int_equal (count_char (out, '\r'), 0);
}

/* A debug build stops at a broken invariant and says where; a release
 * build does not evaluate the condition. */
static int assert_evaluated;

static int
assert_probe (int v)
{
   assert_evaluated++;
   return v;
}

static void
test_assert (void **state)
{
   (void) state;
   RELAYBUS_ASSERT (assert_probe (1) == 1);
#ifdef RELAYBUS_DEBUG
   assert_int_equal (assert_evaluated, 1);
   int fds[2];
   assert_int_equal (pipe (fds), 0);
   pid_t pid = fork ();
   assert_true (pid >= 0);
   if (pid == 0) {
      dup2 (fds[1], STDERR_FILENO);
      RELAYBUS_ASSERT (assert_probe (2) == 3);
      _exit (0);
   }
   close (fds[1]);
   char out[512] = {0};
   ssize_t n, got = 0;
   while ((n = read (fds[0], out + got, sizeof out - 1 - (size_t) got)) > 0)
      got += n;
   close (fds[0]);
   int status = 0;
   assert_int_equal (waitpid (pid, &status, 0), pid);
   assert_true (WIFSIGNALED (status));
   assert_int_equal (WTERMSIG (status), SIGABRT);
   assert_non_null (strstr (out, "assertion failed: assert_probe (2) == 3 ("));
   assert_non_null (strstr (out, "test_log.c:"));
#else
   assert_int_equal (assert_evaluated, 0);
   RELAYBUS_ASSERT (assert_probe (2) == 3); /* not evaluated: no abort */
   assert_int_equal (assert_evaluated, 0);
#endif
}

/* Logs one line per level with JOURNAL_STREAM naming the file stderr is
 * (as systemd does when stderr is the journal), then with it naming
 * another file.  log_close around each makes log.c check stderr again. */
static void
log_levels_as_journal (void)
{
   struct stat st;
   char v[64];

   log_close ();
   assert_int_equal (fstat (STDERR_FILENO, &st), 0);
   snprintf (v, sizeof v, "%llu:%llu", (unsigned long long) st.st_dev, (unsigned long long) st.st_ino);
   setenv ("JOURNAL_STREAM", v, 1);
   log_error ("journal: an error");
   log_warn ("journal: a warning");
   log_info ("journal: information");
   log_debug ("journal: a detail");
   log_close ();
   unsetenv ("JOURNAL_STREAM");
}

static void
log_levels_other_stream (void)
{
   struct stat st;
   char v[64];

   log_close ();
   assert_int_equal (fstat (STDERR_FILENO, &st), 0);
   snprintf (v, sizeof v, "%llu:%llu", (unsigned long long) st.st_dev, (unsigned long long) st.st_ino + 1);
   setenv ("JOURNAL_STREAM", v, 1);
   log_error ("journal: an error");
   log_close ();
   unsetenv ("JOURNAL_STREAM");
}

/* sd-daemon(3): under JOURNAL_STREAM each line starts with its priority,
 * in both formats, so that journalctl -p err finds the errors; a
 * JOURNAL_STREAM of another file (stderr redirected after systemd started
 * the process) leaves lines as they are. */
static void
test_journal_priorities (void **state)
{
   const char *out;

   (void) state;
   log_set_level (LOG_LEVEL_DEBUG);
   out = capture (log_levels_as_journal);
   assert_non_null (strstr (out, "<3>"));
   assert_int_equal (strncmp (out, "<3>", 3), 0);
   assert_non_null (strstr (out, "error [main] journal: an error\n<4>"));
   assert_non_null (strstr (out, "warn  [main] journal: a warning\n<6>"));
   assert_non_null (strstr (out, "info  [main] journal: information\n<7>"));
   assert_non_null (strstr (out, "debug [main] journal: a detail\n"));
   assert_int_equal (count_char (out, '<'), 4);

   log_set_format (LOG_FORMAT_JSON);
   out = capture (log_levels_as_journal);
   assert_int_equal (strncmp (out, "<3>{\"time\":", 11), 0);
   assert_non_null (strstr (out, "\n<4>{\"time\":"));
   assert_non_null (strstr (out, "\n<7>{\"time\":"));
   log_set_format (LOG_FORMAT_TEXT);

   out = capture (log_levels_other_stream);
   assert_null (strchr (out, '<'));
   assert_non_null (strstr (out, "error [main] journal: an error\n"));
   log_set_level (LOG_LEVEL_INFO);
}

static void
log_with_trace (void)
{
   static const uint8_t trace_id[16] = {0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6,
                                        0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36};
   static const uint8_t span_id[8] = {0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7};

   log_set_trace (trace_id, span_id);
   log_warn ("dispatch: hook delivery d1 attempt 1 failed");
   log_set_trace (NULL, NULL);
   log_info ("dispatch: not about an event");
}

/* A JSON line about an event carries its trace_id and span_id (OpenTelemetry's
 * log fields), so a log backend links it to the trace; other lines do not. */
static void
test_log_trace_ids (void **state)
{
   const char *out, *second;

   (void) state;
   log_set_format (LOG_FORMAT_JSON);
   out = capture (log_with_trace);
   log_set_format (LOG_FORMAT_TEXT);
   second = strchr (out, '\n');
   assert_non_null (second);
   assert_non_null (strstr (out, "\"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\",\"span_id\":\"00f067aa0ba902b7\",\"msg\":\"dispatch: hook delivery d1"));
   assert_true (strstr (out, "trace_id") < second);
   assert_null (strstr (second, "trace_id"));
}

static char *
mask_as_main (const char *text)
{
   return config_mask (NULL, text);
}

static void
log_credentials (void)
{
   log_warn ("handler h: lost amqp://relay:s3cr%%3At@mq:5672/ (\n)");
}

/* Every line goes through the masking installed (main.c installs the
 * configuration's, before anything logs), then through the escaping. */
static void
test_log_mask (void **state)
{
   const char *out;

   (void) state;
   log_set_level (LOG_LEVEL_INFO);
   log_set_mask (mask_as_main);
   out = capture (log_credentials);
   log_set_mask (NULL);
   assert_non_null (strstr (out, "handler h: lost amqp://relay:********@mq:5672/ (\\n)\n"));
   assert_null (strstr (out, "s3cr"));
   out = capture (log_credentials);
   assert_non_null (strstr (out, "amqp://relay:s3cr%3At@mq:5672/"));
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_escape_table),
      cmocka_unit_test (test_escape_cut_whole),
      cmocka_unit_test (test_log_msg_one_line),
      cmocka_unit_test (test_assert),
      cmocka_unit_test (test_log_json),
      cmocka_unit_test (test_log_file_trust),
      cmocka_unit_test (test_journal_priorities),
      cmocka_unit_test (test_log_trace_ids),
      cmocka_unit_test (test_log_mask),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
