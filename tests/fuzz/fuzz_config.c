/*
 * fuzz_config.c - libFuzzer target for the configuration file parser.
 *
 * The input is the file's text, refused the way config_load refuses a file
 * (a NUL byte, more than 1 MiB); config_load hands the rest to
 * config_parse_string, which is what is fuzzed.  The first line is also
 * given to config_parse_listen.
 *
 * Oracles (abort() on failure):
 *   - a refused file names its origin in an error of the config domain;
 *   - an accepted one holds only values the key table allows: integers in
 *     [min, max], booleans, lists without empty or padded items, values
 *     below the value limit, at most CONFIG_MAX_HANDLERS handlers with
 *     distinct valid names, each with its patterns split;
 *   - round trip: every key written back as `key=value` from the table
 *     parses again, to a snapshot that writes the same text, that
 *     config_write prints the same, and that a reload may replace the
 *     first one with (nothing changed);
 *   - config_write never prints a token or a handler secret in clear;
 *   - each handler matches its own patterns;
 *   - config_parse_listen: a Unix path comes back whole with port 0, a
 *     host is the text before the last ':' (or inside [...]) and the port
 *     the decimal after it.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mongoc/mongoc.h>

#include "base/config.h"
#include "codec/compress.h"
#include "dispatch/webhook.h"
#include "fuzz_util.h"

#define ORIGIN "fuzz.ini"
#define FILE_MAX (1024 * 1024)  /* config_load's limit */
#define VALUE_MAX 4096          /* base/config.c's limit on one value */


/* Text written into a growing buffer. */
typedef struct {
   char *p;
   size_t len, cap;
} text_t;

static void
text_add (text_t *t, const char *s, size_t n)
{
   if (t->len + n + 1 > t->cap) {
      t->cap = (t->len + n + 1) * 2;
      t->p = realloc (t->p, t->cap);
      CHECK (t->p);
   }
   memcpy (t->p + t->len, s, n);
   t->len += n;
   t->p[t->len] = '\0';
}

static void
text_str (text_t *t, const char *s)
{
   text_add (t, s, strlen (s));
}

/* A value as the file spells it: a literal "${" is written "$${". */
static void
text_value (text_t *t, const char *s)
{
   for (const char *p = s; *p;) {
      const char *v = strstr (p, "${");

      if (!v) {
         text_str (t, p);
         break;
      }
      text_add (t, p, (size_t) (v - p));
      text_str (t, "$${");
      p = v + 2;
   }
}

/* The value of `k` in `base` as the file spells it; checks it against the
 * table on the way. */
static void
format_value (const void *base, const config_key_t *k, text_t *t)
{
   const char *field = (const char *) base + k->offset;
   char num[32];

   switch (k->type) {
   case CONFIG_TYPE_STRING:
   case CONFIG_TYPE_LIST: {
      const char *s = *(char *const *) field;
      size_t n;

      CHECK (s); /* format_section skips unset keys */
      n = strlen (s);
      CHECK (n < VALUE_MAX);
      /* Stored trimmed, so that writing it back changes nothing. */
      CHECK (n == 0 || (!isspace ((unsigned char) s[0]) && !isspace ((unsigned char) s[n - 1])));
      CHECK (!strchr (s, '\n'));
      if (k->type == CONFIG_TYPE_LIST) {
         for (const char *item = s; n > 0;) {
            size_t len = strcspn (item, ",");

            CHECK (len > 0 && !isspace ((unsigned char) item[0]) && !isspace ((unsigned char) item[len - 1]));
            if (!item[len])
               break;
            item += len + 1;
         }
      }
      text_value (t, s);
      return;
   }
   case CONFIG_TYPE_INT: {
      int64_t v = *(const int64_t *) field;

      CHECK (v >= k->min && v <= k->max);
      snprintf (num, sizeof num, "%" PRId64, v);
      text_str (t, num);
      return;
   }
   case CONFIG_TYPE_DURATION: {
      int64_t v = *(const int64_t *) field;

      /* In ms, which the parser takes back as "<n>ms". */
      CHECK (v >= k->min && v <= k->max);
      snprintf (num, sizeof num, "%" PRId64 "ms", v);
      text_str (t, num);
      return;
   }
   case CONFIG_TYPE_BOOL: {
      unsigned char b;

      memcpy (&b, field, 1);
      CHECK (b == 0 || b == 1);
      text_str (t, b ? "true" : "false");
      return;
   }
   }
   CHECK (!"unknown key type");
}

static void
format_section (const void *base, config_section_t section, const config_key_t *keys, size_t n, text_t *t)
{
   for (size_t i = 0; i < n; i++) {
      const char *field = (const char *) base + keys[i].offset;

      if (keys[i].section != section)
         continue;
      /* An unset string stays unset: its line is left out. */
      if ((keys[i].type == CONFIG_TYPE_STRING || keys[i].type == CONFIG_TYPE_LIST) && !*(char *const *) field)
         continue;
      text_str (t, keys[i].name);
      text_str (t, "=");
      format_value (base, &keys[i], t);
      text_str (t, "\n");
   }
}

/* Every key of the snapshot, from the table, as INI text. */
static char *
format_config (const config_t *cfg)
{
   size_t n;
   const config_key_t *keys = config_keys (&n);
   text_t t = {0};

   for (int s = CONFIG_SECTION_PROXY; s < CONFIG_SECTION_HANDLER; s++) {
      text_str (&t, "[");
      text_str (&t, config_section_name ((config_section_t) s));
      text_str (&t, "]\n");
      format_section (cfg, (config_section_t) s, keys, n, &t);
   }
   for (size_t h = 0; h < cfg->n_handlers; h++) {
      text_str (&t, "[handler ");
      text_str (&t, cfg->handlers[h].name);
      text_str (&t, "]\n");
      format_section (&cfg->handlers[h], CONFIG_SECTION_HANDLER, keys, n, &t);
      /* The prefixed lines: header.NAME and kafka.PROPERTY, in file order. */
      for (size_t i = 0; i < cfg->handlers[h].n_headers; i++) {
         text_str (&t, "header.");
         text_str (&t, cfg->handlers[h].headers[2 * i]);
         text_str (&t, "=");
         text_value (&t, cfg->handlers[h].headers[2 * i + 1]);
         text_str (&t, "\n");
      }
      for (size_t i = 0; i < cfg->handlers[h].n_kafka_props; i++) {
         text_str (&t, "kafka.");
         text_str (&t, cfg->handlers[h].kafka_props[2 * i]);
         text_str (&t, "=");
         text_value (&t, cfg->handlers[h].kafka_props[2 * i + 1]);
         text_str (&t, "\n");
      }
   }
   return t.p;
}

static char *
written (const config_t *cfg, size_t *len)
{
   char *out = NULL;
   FILE *f = open_memstream (&out, len);

   CHECK (f);
   config_write (cfg, f);
   CHECK (fclose (f) == 0);
   return out;
}

static bool
valid_handler_name (const char *s)
{
   size_t n = strlen (s);

   if (n == 0 || n > 64)
      return false;
   for (size_t i = 0; i < n; i++)
      if (!isalnum ((unsigned char) s[i]) && !strchr ("_-.", s[i]))
         return false;
   return true;
}

/* `name = value` must not be printed for a secret, whatever the mask. */
static void
check_masked (const char *out, const char *name, const char *value)
{
   char *line;
   size_t n;

   /* A value that reads like a mask cannot be told from one. */
   if (!value || !*value || value[0] == '(')
      return;
   n = strlen (name) + strlen (value) + 6;
   line = malloc (n);
   CHECK (line);
   snprintf (line, n, "\n%s = %s\n", name, value);
   CHECK (!strstr (out, line));
   free (line);
}

static size_t
count_char (const char *s, char c)
{
   size_t n = 0;

   for (; *s; s++)
      n += *s == c;
   return n;
}

static void
check_handlers (const config_t *cfg)
{
   CHECK (cfg->n_handlers <= CONFIG_MAX_HANDLERS);
   for (size_t h = 0; h < cfg->n_handlers; h++) {
      const config_handler_t *hd = &cfg->handlers[h];

      CHECK (valid_handler_name (hd->name));
      for (size_t j = 0; j < h; j++)
         CHECK (strcmp (cfg->handlers[j].name, hd->name) != 0);
      /* One pattern per list item; an empty `events =` gives none. */
      CHECK (hd->n_event_patterns == (*hd->events ? 1 + count_char (hd->events, ',') : 0));
      CHECK (hd->event_patterns[hd->n_event_patterns] == NULL);
      for (size_t i = 0; i < hd->n_event_patterns; i++) {
         const char *pat = hd->event_patterns[i];
         size_t len = strlen (pat);

         CHECK (len > 0);
         if (pat[len - 1] == '*') {
            char *type = malloc (len + 3);

            CHECK (type);
            memcpy (type, pat, len - 1);
            memcpy (type + len - 1, "x.y", 4);
            CHECK (config_handler_matches (hd, type));
            free (type);
         } else {
            CHECK (config_handler_matches (hd, pat));
         }
      }
      CHECK (hd->kind_id == (strcmp (hd->kind, "webhook") == 0 ? HANDLER_KIND_WEBHOOK : HANDLER_KIND_PULL));
   }
}

static void
check_listen (const uint8_t *data, size_t size)
{
   size_t n = 0;
   char *v, host[256];
   uint16_t port = 1;
   bson_error_t err;

   while (n < size && data[n] != '\n')
      n++;
   v = malloc (n + 1);
   CHECK (v);
   memcpy (v, data, n);
   v[n] = '\0';
   if (!config_parse_listen (v, host, sizeof host, &port, &err)) {
      CHECK (err.domain == CONFIG_ERROR_DOMAIN);
   } else if (v[0] == '/') {
      CHECK (port == 0 && strcmp (host, v) == 0);
   } else {
      const char *colon = strrchr (v, ':');
      size_t hlen;

      CHECK (colon);
      if (v[0] == '[') {
         hlen = strlen (host);
         CHECK (hlen > 0 && strncmp (v + 1, host, hlen) == 0 && v[1 + hlen] == ']' && v + 2 + hlen == colon);
      } else {
         hlen = (size_t) (colon - v);
         CHECK (strlen (host) == hlen && strncmp (v, host, hlen) == 0);
      }
      CHECK (strtol (colon + 1, NULL, 10) == (long) port);
   }
   free (v);
}

int LLVMFuzzerInitialize (int *argc, char ***argv);

/* mongoc logs every URI it refuses; millions of lines would only slow the
 * run down.  The checks main.c registers run here too. */
int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
   (void) argc;
   (void) argv;
   mongoc_log_set_handler (NULL, NULL);
   config_set_checks (&(config_checks_t){compress_offerable, webhook_secrets_valid});
   return 0;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   config_t *cfg, *again;
   bson_error_t err;
   char *text, *fmt, *fmt2, *w, *w2;
   size_t wlen, wlen2;

   if (size > FILE_MAX || memchr (data, '\0', size))
      return 0;
   check_listen (data, size);
   text = malloc (size + 1);
   CHECK (text);
   memcpy (text, data, size);
   text[size] = '\0';

   memset (&err, 0, sizeof err);
   cfg = config_parse_string (text, ORIGIN, &err);
   free (text);
   if (!cfg) {
      CHECK (err.domain == CONFIG_ERROR_DOMAIN);
      CHECK (strncmp (err.message, ORIGIN ":", sizeof ORIGIN) == 0);
      return 0;
   }

   check_handlers (cfg);
   fmt = format_config (cfg);
   again = config_parse_string (fmt, ORIGIN, &err);
   if (!again) {
      fprintf (stderr, "round trip refused: %s\n---\n%s---\n", err.message, fmt);
      CHECK (again);
   }
   fmt2 = format_config (again);
   CHECK (strcmp (fmt, fmt2) == 0);
   CHECK (config_reload_allowed (cfg, again, &err));
   CHECK (config_reload_allowed (again, cfg, &err));

   w = written (cfg, &wlen);
   w2 = written (again, &wlen2);
   CHECK (wlen == wlen2 && memcmp (w, w2, wlen) == 0);
   if (cfg->admin_token)
      check_masked (w, "token", cfg->admin_token);
   for (size_t h = 0; h < cfg->n_handlers; h++)
      check_masked (w, "secret", cfg->handlers[h].secret);

   free (w);
   free (w2);
   free (fmt);
   free (fmt2);
   config_release (again);
   config_release (cfg);
   return 0;
}
