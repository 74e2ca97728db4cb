/*
 * test_docs.c - the documentation against the code.
 *
 * Both ways: every configuration key a table of docs/configuration.md or a
 * "key =" line of etc/relaybus-proxy.ini names exists in the key table, in
 * that section, and every key of the table is in both; every metric named
 * anywhere in docs/ (or the README) is one that render_metrics emits, and
 * every metric it emits has its row in docs/admin.md; every endpoint and
 * query parameter the docs name ("GET /api/...", "$A/api/...?name=") is in
 * the admin port's route table (src/admin/http.c) and takes that
 * parameter (src/admin/api.c, history.c), and every route has its heading in
 * docs/admin.md; every alert the docs name is a rule of
 * etc/prometheus/relaybus-rules.yml (or one the docs' own example
 * defines), and every rule has its row in docs/admin.md.  And the sample
 * request of docs/handlers.md ("## The request") carries a signature that
 * verifies with the secret the page states, recomputed here with OpenSSL
 * rather than with dispatch/webhook.c.  Each check reports everything missing before
 * it fails.  (The retry table of handlers.md is checked by test_config.)
 */
#include <ctype.h>
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "autoconf.h"
#include "base/config.h"
#include "admin/render.h"
#include "base/outbox.h"
#include "base/pull.h"
#include "dispatch/webhook.h"

#ifndef RELAYBUS_TOP_SRCDIR
#define RELAYBUS_TOP_SRCDIR "."
#endif

#define MAX_NAMES 512

static char *
read_file (const char *path)
{
   FILE *f = fopen (path, "rb");
   char *buf;
   long n;

   if (!f)
      return NULL;
   fseek (f, 0, SEEK_END);
   n = ftell (f);
   fseek (f, 0, SEEK_SET);
   buf = malloc ((size_t) n + 1);
   if (fread (buf, 1, (size_t) n, f) != (size_t) n)
      n = 0;
   buf[n] = '\0';
   fclose (f);
   return buf;
}

/* Problems found so far; the test fails once, listing them all. */
typedef struct {
   char text[16384];
   size_t len;
   int n;
} problems_t;

static void problem (problems_t *p, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

static void
problem (problems_t *p, const char *fmt, ...)
{
   va_list ap;
   int w;

   p->n++;
   if (p->len + 2 >= sizeof p->text)
      return;
   va_start (ap, fmt);
   w = vsnprintf (p->text + p->len, sizeof p->text - p->len - 1, fmt, ap);
   va_end (ap);
   if (w > 0)
      p->len += (size_t) w < sizeof p->text - p->len - 1 ? (size_t) w : sizeof p->text - p->len - 2;
   p->text[p->len++] = '\n';
   p->text[p->len] = '\0';
}

static void
problems_check (const problems_t *p)
{
   if (p->n)
      fail_msg ("%d documentation mismatch(es):\n%s", p->n, p->text);
}

/* ------------------------------------------------------- configuration */

/* "[proxy]", "[handler x]" -> its section; false for anything else. */
static bool
section_of (const char *name, size_t len, config_section_t *out)
{
   if (len > 8 && !strncmp (name, "handler ", 8)) {
      *out = CONFIG_SECTION_HANDLER;
      return true;
   }
   for (int s = CONFIG_SECTION_PROXY; s < CONFIG_SECTION_HANDLER; s++) {
      const char *n = config_section_name ((config_section_t) s);
      if (strlen (n) == len && !strncmp (name, n, len)) {
         *out = (config_section_t) s;
         return true;
      }
   }
   return false;
}

/* The key of the table in `section` named name[0..len), or -1. */
static ssize_t
key_index (config_section_t section, const char *name, size_t len)
{
   size_t n;
   const config_key_t *keys = config_keys (&n);

   for (size_t i = 0; i < n; i++)
      if (keys[i].section == section && strlen (keys[i].name) == len && !strncmp (keys[i].name, name, len))
         return (ssize_t) i;
   return -1;
}

/* One mention of a key: it must be in the table; marks it seen. */
static void
mention (problems_t *p, const char *file, int line, bool have_section, config_section_t section, const char *name, size_t len, bool *seen)
{
   ssize_t k;

   if (!have_section) {
      problem (p, "%s:%d: key '%.*s' outside any section", file, line, (int) len, name);
      return;
   }
   k = key_index (section, name, len);
   if (k < 0)
      problem (p, "%s:%d: [%s] %.*s is not a key of the code's table", file, line, config_section_name (section), (int) len, name);
   else
      seen[k] = true;
}

static void
every_key_seen (problems_t *p, const char *file, const bool *seen)
{
   size_t n;
   const config_key_t *keys = config_keys (&n);

   for (size_t i = 0; i < n; i++)
      if (!seen[i])
         problem (p, "%s does not document [%s] %s", file, config_section_name (keys[i].section), keys[i].name);
}

/* docs/configuration.md: under "## [section]", each table row "| `key` |". */
static void
check_configuration_md (problems_t *p)
{
   char *doc = read_file (RELAYBUS_TOP_SRCDIR "/docs/configuration.md");
   bool seen[MAX_NAMES] = {false};
   bool have_section = false;
   config_section_t section = CONFIG_SECTION_PROXY;
   int line = 0;
   size_t n;

   (void) config_keys (&n);
   assert_true (n <= MAX_NAMES);
   assert_non_null (doc);
   for (char *l = doc; l && *l; line++) {
      char *eol = strchr (l, '\n');
      size_t len = eol ? (size_t) (eol - l) : strlen (l);

      if (len > 4 && !strncmp (l, "## ", 3)) {
         char *open = memchr (l, '[', len), *close = open ? memchr (open, ']', len - (size_t) (open - l)) : NULL;
         have_section = open && close && l[3] == '[' &&
                        section_of (open + 1, (size_t) (close - open - 1), &section);
      } else if (len > 4 && !strncmp (l, "| `", 3)) {
         char *name = l + 3, *end = memchr (name, '`', len - 3);

         if (end && have_section)
            mention (p, "docs/configuration.md", line + 1, true, section, name, (size_t) (end - name), seen);
      }
      l = eol ? eol + 1 : NULL;
   }
   every_key_seen (p, "docs/configuration.md", seen);
   free (doc);
}

/* etc/relaybus-proxy.ini: "[section]" or a commented "; [handler NAME]",
 * then "key =" lines, set or commented out ("; key ="). */
static void
check_sample_ini (problems_t *p)
{
   char *ini = read_file (RELAYBUS_TOP_SRCDIR "/etc/relaybus-proxy.ini");
   bool seen[MAX_NAMES] = {false};
   bool have_section = false;
   config_section_t section = CONFIG_SECTION_PROXY;
   int line = 0;

   assert_non_null (ini);
   for (char *l = ini; l && *l; line++) {
      char *eol = strchr (l, '\n');
      size_t len = eol ? (size_t) (eol - l) : strlen (l);
      const char *s = l;
      size_t k = 0;

      if (len >= 2 && (s[0] == ';' || s[0] == '#') && s[1] == ' ')
         s += 2;
      if (*s == '[') {
         const char *close = memchr (s, ']', len - (size_t) (s - l));
         config_section_t sec;

         if (close && section_of (s + 1, (size_t) (close - s - 1), &sec)) {
            have_section = true;
            section = sec;
         }
      } else {
         while (s + k < l + len && (islower ((unsigned char) s[k]) || isdigit ((unsigned char) s[k]) || s[k] == '_'))
            k++;
         if (k > 0 && s + k + 2 <= l + len && !strncmp (s + k, " =", 2) && (s + k + 2 == l + len || s[k + 2] == ' '))
            mention (p, "etc/relaybus-proxy.ini", line + 1, have_section, section, s, k, seen);
      }
      l = eol ? eol + 1 : NULL;
   }
   every_key_seen (p, "etc/relaybus-proxy.ini", seen);
   free (ini);
}

static void
test_config_keys_documented (void **state)
{
   problems_t p = {.len = 0};

   (void) state;
   check_configuration_md (&p);
   check_sample_ini (&p);
   problems_check (&p);
}

/* -------------------------------------------------------------- metrics */

typedef struct {
   char *name[MAX_NAMES];
   bool histogram[MAX_NAMES];
   size_t n;
} names_t;

static ssize_t
names_find (const names_t *ns, const char *name, size_t len)
{
   for (size_t i = 0; i < ns->n; i++)
      if (strlen (ns->name[i]) == len && !strncmp (ns->name[i], name, len))
         return (ssize_t) i;
   return -1;
}

/* What render_metrics emits: the name of each "# TYPE name type" line. */
static void
emitted_metrics (names_t *ns)
{
   bson_string_t *out = bson_string_new (NULL);
   render_view_t v = {0};
   store_handler_stats_t hs = {0};

   /* Everything on: a store that answered, one handler with series. */
   bson_strncpy (hs.name, "docs-test", sizeof hs.name);
   v.store_ok = true;
   v.process.has_memory = v.process.has_fds = v.process.has_start = true;
   v.handlers = &hs;
   v.n_handlers = 1;
   render_metrics (out, &v);
   for (char *l = out->str; l && *l;) {
      char *eol = strchr (l, '\n');

      if (!strncmp (l, "# TYPE ", 7)) {
         char *name = l + 7, *sp = strchr (name, ' ');

         assert_non_null (sp);
         assert_true (ns->n < MAX_NAMES);
         if (names_find (ns, name, (size_t) (sp - name)) < 0) {
            ns->histogram[ns->n] = !strncmp (sp + 1, "histogram", 9);
            ns->name[ns->n++] = bson_strndup (name, (size_t) (sp - name));
         }
      }
      l = eol ? eol + 1 : NULL;
   }
   bson_string_free (out, true);
}

/* A relaybus_ name that is a collection of the outbox (default prefix). */
static bool
is_collection (const char *name, size_t len)
{
   for (int c = 0; c < OUTBOX_N_COLLECTIONS; c++) {
      char full[OUTBOX_NAME_MAX];

      if (outbox_collection_name ("relaybus_", (outbox_collection_t) c, full, sizeof full) && strlen (full) == len &&
          !strncmp (full, name, len))
         return true;
   }
   return false;
}

/* Every relaybus_xxx and process_xxx named in `text` must be emitted (a histogram's
 * _bucket, _sum and _count count as its own).  Not metrics: the outbox
 * collection names, families written with a wildcard
 * (`relaybus_outbox_*`, `relaybus_purge*`), and the database and marker
 * collection of `scripts/test --upstream` (relaybus_test_...). */
static void
check_named_metrics (problems_t *p, const names_t *ns, const char *file, const char *text)
{
   static const char *const hist_suffixes[] = {"_bucket", "_sum", "_count"};
   int line = 1;

   for (const char *s = text; *s; s++) {
      size_t len = 0;

      if (*s == '\n')
         line++;
      if ((strncmp (s, "relaybus_", 9) != 0 && strncmp (s, "process_", 8) != 0) ||
          (s > text && (isalnum ((unsigned char) s[-1]) || s[-1] == '_')))
         continue;
      while (islower ((unsigned char) s[len]) || isdigit ((unsigned char) s[len]) || s[len] == '_')
         len++;
      if (s[len] == '*' || s[len - 1] == '_' || is_collection (s, len) || names_find (ns, s, len) >= 0 ||
          !strncmp (s, "relaybus_test_", 14)) {
         s += len - 1;
         continue;
      }
      {
         bool found = false;

         for (size_t i = 0; i < 3 && !found; i++) {
            size_t sl = strlen (hist_suffixes[i]);
            ssize_t k;

            if (len > sl && !strncmp (s + len - sl, hist_suffixes[i], sl)) {
               k = names_find (ns, s, len - sl);
               found = k >= 0 && ns->histogram[k];
            }
         }
         if (!found)
            problem (p, "%s:%d: names the metric %.*s, which the code does not emit", file, line, (int) len, s);
      }
      s += len - 1;
   }
}

static void
test_metrics_documented (void **state)
{
   names_t ns = {.n = 0};
   problems_t p = {.len = 0};
   char *admin = read_file (RELAYBUS_TOP_SRCDIR "/docs/admin.md");
   char *readme = read_file (RELAYBUS_TOP_SRCDIR "/README.md");
   DIR *dir = opendir (RELAYBUS_TOP_SRCDIR "/docs");
   struct dirent *de;

   (void) state;
   assert_non_null (admin);
   assert_non_null (readme);
   assert_non_null (dir);
   emitted_metrics (&ns);
   assert_true (ns.n > 20);
   /* Emitted -> documented: each has its `name` in docs/admin.md. */
   for (size_t i = 0; i < ns.n; i++) {
      char needle[160];

      snprintf (needle, sizeof needle, "`%s`", ns.name[i]);
      if (!strstr (admin, needle))
         problem (&p, "docs/admin.md does not document the metric %s", ns.name[i]);
   }
   /* Named anywhere in the docs -> emitted. */
   while ((de = readdir (dir))) {
      size_t l = strlen (de->d_name);
      char path[512], shown[300];
      char *text;

      if (l < 4 || strcmp (de->d_name + l - 3, ".md") != 0)
         continue;
      snprintf (path, sizeof path, "%s/docs/%s", RELAYBUS_TOP_SRCDIR, de->d_name);
      snprintf (shown, sizeof shown, "docs/%s", de->d_name);
      text = read_file (path);
      assert_non_null (text);
      check_named_metrics (&p, &ns, shown, text);
      free (text);
   }
   check_named_metrics (&p, &ns, "README.md", readme);
   closedir (dir);
   for (size_t i = 0; i < ns.n; i++)
      bson_free (ns.name[i]);
   free (admin);
   free (readme);
   problems_check (&p);
}

/* ------------------------------------------------ endpoints and alerts */

#define MAX_ROUTES 64
#define MAX_PARAMS 16

/* The admin port's routes, read from src/admin/http.c's table, with the
 * query parameters their handler's param_t table in src/admin/api.c (or
 * history.c) takes. */
typedef struct {
   char method[8];
   char path[96];
   char handler[64];
   char params[MAX_PARAMS][32];
   size_t n_params;
} route_t;

typedef struct {
   route_t r[MAX_ROUTES];
   size_t n;
} routes_t;

/* The names of the first param_t table in the body of `fn` in `api`. */
static void
handler_params (const char *api, route_t *r)
{
   char def[96];
   const char *body, *table, *end, *next_fn;

   snprintf (def, sizeof def, "\n%s (admin_t *a, struct evhttp_request *req)\n{", r->handler);
   body = strstr (api, def);
   if (!body)
      return;
   next_fn = strstr (body + strlen (def), "\n}\n");
   table = strstr (body, "param_t p[");
   if (!table || (next_fn && table > next_fn))
      return;
   end = strstr (table, "};");
   for (const char *s = strstr (table, "{\""); s && end && s < end && r->n_params < MAX_PARAMS; s = strstr (s + 1, "{\"")) {
      const char *q = strchr (s + 2, '"');
      if (q && (size_t) (q - s - 2) < sizeof r->params[0])
         bson_snprintf (r->params[r->n_params++], sizeof r->params[0], "%.*s", (int) (q - s - 2), s + 2);
   }
}

static void
read_routes (routes_t *rs)
{
   char *http = read_file (RELAYBUS_TOP_SRCDIR "/src/admin/http.c");
   /* The endpoints are in api.c and, for the attempt records, history.c. */
   char *api_c = read_file (RELAYBUS_TOP_SRCDIR "/src/admin/api.c");
   char *history_c = read_file (RELAYBUS_TOP_SRCDIR "/src/admin/history.c");
   char *api;
   const char *table;

   assert_non_null (http);
   assert_non_null (api_c);
   assert_non_null (history_c);
   api = bson_strdup_printf ("%s\n%s", api_c, history_c);
   free (api_c);
   free (history_c);
   table = strstr (http, "static const route_t routes[] = {");
   assert_non_null (table);
   for (const char *s = strstr (table, "\n   {\"/"); s && rs->n < MAX_ROUTES; s = strstr (s + 1, "\n   {\"/")) {
      route_t *r = &rs->r[rs->n];
      char method[8];

      memset (r, 0, sizeof *r);
      if (sscanf (s, "\n   {\"%95[^\"]\", EVHTTP_REQ_%7[A-Z], %*[a-z], %63[a-z_]}", r->path, method, r->handler) != 3)
         continue;
      bson_strncpy (r->method, method, sizeof r->method);
      handler_params (api, r);
      rs->n++;
   }
   free (http);
   bson_free (api);
}

/* The route for `method` (NULL: any) and path[0..len): numeric segments
 * stand for the table's ID. */
static const route_t *
route_find (const routes_t *rs, const char *method, const char *path, size_t len)
{
   char norm[128];
   size_t o = 0;

   for (size_t i = 0; i < len && o + 3 < sizeof norm;) {
      if (path[i] == '/' || i == 0) {
         size_t d = path[i] == '/' ? i + 1 : i, j = d;
         while (j < len && isdigit ((unsigned char) path[j]))
            j++;
         if (j > d && (j == len || path[j] == '/')) {
            if (path[i] == '/')
               norm[o++] = '/';
            memcpy (norm + o, "ID", 2);
            o += 2;
            i = j;
            continue;
         }
      }
      norm[o++] = path[i++];
   }
   norm[o] = '\0';
   {
      /* "/api/handlers/<name>/<action>" stands for the table's NAME. */
      const char *pre = "/api/handlers/", *slash;
      size_t np = strlen (pre);

      if (!strncmp (norm, pre, np) && (slash = strchr (norm + np, '/')) && slash > norm + np &&
          strlen (slash) + np + 4 < sizeof norm) {
         char tail[128];
         size_t nt = strlen (slash);

         memcpy (tail, slash, nt + 1);
         memcpy (norm + np, "NAME", 4);
         memcpy (norm + np + 4, tail, nt + 1);
      }
   }
   for (size_t i = 0; i < rs->n; i++)
      if (!strcmp (rs->r[i].path, norm) && (!method || !strcmp (rs->r[i].method, method)))
         return &rs->r[i];
   return NULL;
}

static bool
route_takes (const route_t *r, const char *name, size_t len)
{
   for (size_t i = 0; i < r->n_params; i++)
      if (strlen (r->params[i]) == len && !strncmp (r->params[i], name, len))
         return true;
   return false;
}

static bool
path_char (char c)
{
   return isalnum ((unsigned char) c) || c == '/' || c == '_' || c == '-' || c == '.';
}

/* Checks the query string q (after '?', up to a quote, space or backtick)
 * against route r. */
static void
check_query (problems_t *p, const route_t *r, const char *file, int line, const char *q)
{
   while (*q && *q != '"' && *q != ' ' && *q != '`' && *q != '\'' && *q != ')' && *q != '\n') {
      size_t n = strcspn (q, "=&\"` ')\n");
      if (n > 0 && !route_takes (r, q, n))
         problem (p, "%s:%d: %s %s has no query parameter '%.*s'", file, line, r->method, r->path, (int) n, q);
      q += n;
      while (*q && *q != '&' && *q != '"' && *q != ' ' && *q != '`' && *q != '\'' && *q != ')' && *q != '\n')
         q++;
      if (*q == '&')
         q++;
   }
}

/* "GET /api/x", "POST /api/x" and "$A/api/x?a=b" in `text`. */
static void
check_named_endpoints (problems_t *p, const routes_t *rs, const char *file, const char *text)
{
   int line = 1;

   for (const char *s = text; *s; s++) {
      const char *method = NULL, *path = NULL;
      size_t len = 0;
      const route_t *r;

      if (*s == '\n')
         line++;
      if (!strncmp (s, "GET /", 5) || !strncmp (s, "HEAD /", 6) || !strncmp (s, "POST /", 6)) {
         method = *s == 'P' ? "POST" : "GET";
         path = strchr (s, '/');
      } else if (!strncmp (s, "$A/", 3)) {
         path = s + 2;
      } else {
         continue;
      }
      while (path_char (path[len]))
         len++;
      /* Only the admin port's paths: the API, the probes, /metrics, / */
      if (len > 1 && strncmp (path, "/api", 4) && strncmp (path, "/healthz", 8) && strncmp (path, "/readyz", 7) &&
          strncmp (path, "/metrics", 8))
         continue;
      if (len > 1 && path[len - 1] == '.')
         len--; /* the end of a sentence */
      r = route_find (rs, method, path, len);
      if (!r) {
         problem (p, "%s:%d: names %s %.*s, which the admin port does not serve", file, line, method ? method : "the path",
                  (int) len, path);
      } else if (path[len] == '?') {
         check_query (p, r, file, line, path + len + 1);
      }
      s = path + len - 1;
   }
}

/* The parameter tables ("| parameter | meaning |") under a "### `GET
 * /api/x`" heading name parameters the endpoint takes. */
static void
check_parameter_tables (problems_t *p, const routes_t *rs, const char *file, const char *text)
{
   const route_t *r = NULL;
   int line = 1;
   bool in_table = false;

   for (const char *l = text; l && *l; line++) {
      const char *eol = strchr (l, '\n');
      size_t len = eol ? (size_t) (eol - l) : strlen (l);

      if (!strncmp (l, "### `GET /", 10) || !strncmp (l, "### `POST /", 11)) {
         const char *path = strchr (l, '/');
         size_t pl = 0;
         while (path_char (path[pl]))
            pl++;
         r = route_find (rs, l[5] == 'P' ? "POST" : "GET", path, pl);
         in_table = false;
      } else if (!strncmp (l, "## ", 3) || !strncmp (l, "### ", 4)) {
         r = NULL;
         in_table = false;
      } else if (!strncmp (l, "| parameter |", 13)) {
         in_table = r != NULL;
      } else if (in_table && len > 2 && l[0] == '|' && l[2] == '`') {
         /* The first cell: one or more `name`, separated by commas. */
         const char *cell_end = memchr (l + 1, '|', len - 1);
         for (const char *t = l + 1; cell_end && (t = memchr (t, '`', (size_t) (cell_end - t))); t++) {
            const char *close = memchr (t + 1, '`', (size_t) (cell_end - t - 1));
            if (!close)
               break;
            if (!route_takes (r, t + 1, (size_t) (close - t - 1)))
               problem (p, "%s:%d: %s %s has no parameter '%.*s'", file, line, r->method, r->path, (int) (close - t - 1), t + 1);
            t = close;
         }
      } else if (in_table && (len == 0 || l[0] != '|')) {
         in_table = false;
      }
      l = eol ? eol + 1 : NULL;
   }
}

static void
test_endpoints_documented (void **state)
{
   static routes_t rs;
   problems_t p = {.len = 0};
   char *admin = read_file (RELAYBUS_TOP_SRCDIR "/docs/admin.md");
   DIR *dir = opendir (RELAYBUS_TOP_SRCDIR "/docs");
   struct dirent *de;

   (void) state;
   assert_non_null (admin);
   assert_non_null (dir);
   rs.n = 0;
   read_routes (&rs);
   assert_true (rs.n > 10);
   /* The table was read: a handler with parameters has them. */
   assert_true (route_takes (route_find (&rs, "GET", "/api/deliveries", 15), "status", 6));
   /* Served -> documented: a heading "`METHOD PATH`" in docs/admin.md. */
   for (size_t i = 0; i < rs.n; i++) {
      char needle[160];

      snprintf (needle, sizeof needle, "`%s %s`", rs.r[i].method, rs.r[i].path);
      if (!strstr (admin, needle))
         problem (&p, "docs/admin.md does not document %s %s", rs.r[i].method, rs.r[i].path);
   }
   /* Named in the docs -> served, with those parameters. */
   while ((de = readdir (dir))) {
      size_t l = strlen (de->d_name);
      char path[512], shown[300];
      char *text;

      if (l < 4 || strcmp (de->d_name + l - 3, ".md") != 0)
         continue;
      snprintf (path, sizeof path, "%s/docs/%s", RELAYBUS_TOP_SRCDIR, de->d_name);
      snprintf (shown, sizeof shown, "docs/%s", de->d_name);
      text = read_file (path);
      assert_non_null (text);
      check_named_endpoints (&p, &rs, shown, text);
      check_parameter_tables (&p, &rs, shown, text);
      free (text);
   }
   closedir (dir);
   {
      char *readme = read_file (RELAYBUS_TOP_SRCDIR "/README.md");
      assert_non_null (readme);
      check_named_endpoints (&p, &rs, "README.md", readme);
      free (readme);
   }
   free (admin);
   problems_check (&p);
}

/* Whether name[0..len) is an error's codeName the proxy answers with
 * (RelaybusLeaseLost is one of the pull consumers' codes, not an alert). */
static bool
is_code_name (const char *name, size_t len)
{
   for (int32_t c = 0; c < 20000; c++) {
      const char *n = pull_code_name ((pull_code_t) c);
      if (n && strlen (n) == len && !strncmp (n, name, len))
         return true;
   }
   return false;
}

/* Alert names "RelaybusXxx" of `text` that are not in `known`. */
static void
check_named_alerts (problems_t *p, const char *file, const char *text, const char *rules, const char *admin)
{
   int line = 1;

   for (const char *s = text; *s; s++) {
      size_t len = 8;
      char def[160];

      if (*s == '\n')
         line++;
      if (strncmp (s, "Relaybus", 8) || !isupper ((unsigned char) s[8]) || (s > text && isalnum ((unsigned char) s[-1])))
         continue;
      while (isalnum ((unsigned char) s[len]))
         len++;
      /* A rule of the file, or one a rules example in the docs defines. */
      snprintf (def, sizeof def, "- alert: %.*s\n", (int) len, s);
      if (!strstr (rules, def) && !strstr (admin, def) && !is_code_name (s, len))
         problem (p, "%s:%d: names the alert %.*s, which etc/prometheus/relaybus-rules.yml does not define", file, line,
                  (int) len, s);
      s += len - 1;
   }
}

static void
test_alerts_documented (void **state)
{
   problems_t p = {.len = 0};
   char *rules = read_file (RELAYBUS_TOP_SRCDIR "/etc/prometheus/relaybus-rules.yml");
   char *admin = read_file (RELAYBUS_TOP_SRCDIR "/docs/admin.md");
   DIR *dir = opendir (RELAYBUS_TOP_SRCDIR "/docs");
   struct dirent *de;
   int n = 0;

   (void) state;
   assert_non_null (rules);
   assert_non_null (admin);
   assert_non_null (dir);
   /* Every rule of the file has its row in the alert table. */
   for (const char *s = rules; (s = strstr (s, "- alert: ")); s++) {
      char row[160];
      size_t len = strcspn (s + 9, " \n");

      snprintf (row, sizeof row, "| `%.*s` |", (int) len, s + 9);
      if (!strstr (admin, row))
         problem (&p, "docs/admin.md has no row for the alert %.*s", (int) len, s + 9);
      n++;
   }
   assert_true (n >= 5);
   while ((de = readdir (dir))) {
      size_t l = strlen (de->d_name);
      char path[512], shown[300];
      char *text;

      if (l < 4 || strcmp (de->d_name + l - 3, ".md") != 0)
         continue;
      snprintf (path, sizeof path, "%s/docs/%s", RELAYBUS_TOP_SRCDIR, de->d_name);
      snprintf (shown, sizeof shown, "docs/%s", de->d_name);
      text = read_file (path);
      assert_non_null (text);
      check_named_alerts (&p, shown, text, rules, admin);
      free (text);
   }
   closedir (dir);
   free (rules);
   free (admin);
   problems_check (&p);
}

/* --------------------------------------------------- sample signature */

/* The value of header `name` in the request's header block, or NULL. */
static char *
header_value (const char *headers, const char *name)
{
   size_t nl = strlen (name);

   for (const char *l = headers; l && *l;) {
      const char *eol = strchr (l, '\n');
      size_t len = eol ? (size_t) (eol - l) : strlen (l);

      if (len > nl + 1 && !strncasecmp (l, name, nl) && l[nl] == ':') {
         const char *v = l + nl + 1;
         while (*v == ' ')
            v++;
         return bson_strndup (v, len - (size_t) (v - l));
      }
      l = eol ? eol + 1 : NULL;
   }
   return NULL;
}

static void
test_sample_request_verifies (void **state)
{
   char *doc = read_file (RELAYBUS_TOP_SRCDIR "/docs/handlers.md");
   const char *sec, *block, *hdr_end, *body, *body_end, *next, *secret;
   char *headers = NULL, *id = NULL, *ts = NULL, *sigs = NULL, *clen = NULL;
   char secret_b64[256], *signed_msg = NULL;
   unsigned char key[256], mac[EVP_MAX_MD_SIZE];
   char expected[2 * EVP_MAX_MD_SIZE + 8];
   size_t mac_len = 0, secret_len, body_len;
   int key_len;
   bool match = false;

   (void) state;
   assert_non_null (doc);
   sec = strstr (doc, "\n## The request\n");
   if (!sec)
      fail_msg ("docs/handlers.md has no '## The request' section");
   next = strstr (sec + 1, "\n## ");
   block = strstr (sec, "```\nPOST ");
   if (!block || (next && block > next))
      fail_msg ("docs/handlers.md: '## The request' shows no POST request in a code block");
   block += 4;
   hdr_end = strstr (block, "\n\n");
   body_end = hdr_end ? strstr (hdr_end + 2, "\n```") : NULL;
   if (!hdr_end || !body_end)
      fail_msg ("docs/handlers.md: the sample request has no blank line and body");
   headers = bson_strndup (block, (size_t) (hdr_end - block));
   body = hdr_end + 2;
   body_len = (size_t) (body_end - body);
   id = header_value (headers, "webhook-id");
   ts = header_value (headers, "webhook-timestamp");
   sigs = header_value (headers, "webhook-signature");
   if (!id || !ts || !sigs)
      fail_msg ("docs/handlers.md: the sample request lacks webhook-id, webhook-timestamp or webhook-signature");
   clen = header_value (headers, "Content-Length");
   if (clen && strtoull (clen, NULL, 10) != body_len)
      fail_msg ("docs/handlers.md: the sample's Content-Length is %s, its body has %zu bytes", clen, body_len);
   /* The secret it verifies with: the first `whsec_...` the section states
    * after the request. */
   secret = strstr (body_end, "`whsec_");
   if (!secret || (next && secret > next))
      fail_msg ("docs/handlers.md: '## The request' does not state the secret the sample verifies with");
   secret += 7;
   secret_len = strcspn (secret, "`");
   assert_true (secret_len > 0 && secret_len < sizeof secret_b64);
   memcpy (secret_b64, secret, secret_len);
   secret_b64[secret_len] = '\0';
   key_len = EVP_DecodeBlock (key, (const unsigned char *) secret_b64, (int) secret_len);
   assert_true (key_len > 0);
   while (secret_len > 0 && secret_b64[secret_len - 1] == '=') {
      key_len--; /* EVP_DecodeBlock counts padding as zero bytes */
      secret_len--;
   }
   /* Standard Webhooks: base64(HMAC-SHA256(key, id "." timestamp "." body)). */
   signed_msg = bson_strdup_printf ("%s.%s.%.*s", id, ts, (int) body_len, body);
   assert_non_null (EVP_Q_mac (NULL, "HMAC", NULL, "SHA256", NULL, key, (size_t) key_len, (const unsigned char *) signed_msg,
                               strlen (signed_msg), mac, sizeof mac, &mac_len));
   memcpy (expected, "v1,", 3);
   EVP_EncodeBlock ((unsigned char *) expected + 3, mac, (int) mac_len);
   for (char *tok = strtok (sigs, " "); tok; tok = strtok (NULL, " "))
      match = match || !strcmp (tok, expected);
   if (!match)
      fail_msg ("docs/handlers.md: the sample's webhook-signature does not verify with whsec_%s over its id, timestamp and body: "
                "expected %s",
                secret_b64,
                expected);
   bson_free (signed_msg);
   bson_free (headers);
   bson_free (id);
   bson_free (ts);
   bson_free (sigs);
   bson_free (clen);
   free (doc);
}

/* ------------------------------------------------------------ versions */

/* Whether `doc` (read from `file`) holds `needle`; a problem otherwise. */
static void
want_text (problems_t *p, const char *file, const char *doc, const char *needle, const char *what)
{
   if (!doc)
      problem (p, "%s: cannot be read", file);
   else if (!strstr (doc, needle))
      problem (p, "%s: %s (no \"%s\")", file, what, needle);
}

/* One version: what configure.ac declares (PACKAGE_VERSION, which
 * --version, relaybus_build_info and the handshake print) is the first
 * entry of debian/changelog, the first version section of CHANGELOG.md,
 * the image the Kubernetes manifest runs and the file names of
 * docs/deployment.md; and the upgrade text of outbox-schema.md names it. */
static void
test_one_version (void **state)
{
   problems_t p = {0};
   char *configure = read_file (RELAYBUS_TOP_SRCDIR "/configure.ac");
   char *debian = read_file (RELAYBUS_TOP_SRCDIR "/debian/changelog");
   char *changelog = read_file (RELAYBUS_TOP_SRCDIR "/CHANGELOG.md");
   char *manifest = read_file (RELAYBUS_TOP_SRCDIR "/deploy/kubernetes/deployment.yaml");
   char *deployment = read_file (RELAYBUS_TOP_SRCDIR "/docs/deployment.md");
   char *schema = read_file (RELAYBUS_TOP_SRCDIR "/docs/outbox-schema.md");
   char buf[256];
   const char *first;

   (void) state;
   snprintf (buf, sizeof buf, "AC_INIT([relaybus-proxy], [%s]", PACKAGE_VERSION);
   want_text (&p, "configure.ac", configure, buf, "does not declare the version the build has");
   snprintf (buf, sizeof buf, "relaybus-proxy (%s) ", PACKAGE_VERSION);
   if (!debian || strncmp (debian, buf, strlen (buf)) != 0)
      problem (&p, "debian/changelog: its first entry is not \"%s\"", buf);
   first = changelog ? strstr (changelog, "\n## ") : NULL;
   snprintf (buf, sizeof buf, "\n## %s ", PACKAGE_VERSION);
   if (!first || strncmp (first, buf, strlen (buf)) != 0)
      problem (&p, "CHANGELOG.md: its first version section is not \"## %s\"", PACKAGE_VERSION);
   if (changelog && strstr (changelog, "\n## Unreleased"))
      problem (&p, "CHANGELOG.md: an \"Unreleased\" section beside the current version's");
   snprintf (buf, sizeof buf, "image: relaybus-proxy:%s\n", PACKAGE_VERSION);
   want_text (&p, "deploy/kubernetes/deployment.yaml", manifest, buf, "does not run this version's image");
   want_text (&p, "docs/deployment.md", deployment, buf, "shows another version's image");
   snprintf (buf, sizeof buf, "relaybus-proxy_%s_amd64.deb", PACKAGE_VERSION);
   want_text (&p, "docs/deployment.md", deployment, buf, "names another version's package");
   snprintf (buf, sizeof buf, "to %s", PACKAGE_VERSION);
   want_text (&p, "docs/outbox-schema.md", schema, buf, "the upgrade of the lanes does not name the version it leads to");
   problems_check (&p);
   free (configure);
   free (debian);
   free (changelog);
   free (manifest);
   free (deployment);
   free (schema);
}

/* ------------------------------------------------------------ the prose */

/* The text of `doc` from `start` (a heading or a marker) to the next
 * line starting with `end_prefix` after it (or the end); NULL when
 * `start` is missing.  Caller frees. */
static char *
section_text (const char *doc, const char *start, const char *end_prefix)
{
   const char *a = doc ? strstr (doc, start) : NULL, *b;
   char *needle;

   if (!a)
      return NULL;
   needle = bson_strdup_printf ("\n%s", end_prefix);
   b = strstr (a + strlen (start), needle);
   bson_free (needle);
   return bson_strndup (a, b ? (size_t) (b - a) : strlen (a));
}

/* README.md's sample request is what the webhook sender sends: libcurl
 * keeps the connection alive (no "connection: close") and sends an accept
 * header.  packaging/test-fresh compares the whole header list with a
 * real delivery. */
static void
test_readme_sample_request (void **state)
{
   char *readme = read_file (RELAYBUS_TOP_SRCDIR "/README.md");
   char *sample = section_text (readme, "\nPOST /hooks {", "}");
   problems_t p = {0};

   (void) state;
   if (!sample)
      problem (&p, "README.md: no sample request (POST /hooks {)");
   else {
      if (strstr (sample, "connection:"))
         problem (&p, "README.md: the sample request shows a connection header; the webhook sender keeps connections alive");
      if (!strstr (sample, "\n  accept: '*/*',"))
         problem (&p, "README.md: the sample request lacks the accept header the sender sends");
      for (const char *h = "content-type\0user-agent\0webhook-id\0webhook-timestamp\0webhook-signature\0"; *h; h += strlen (h) + 1) {
         char *want = bson_strdup_printf ("'%s':", h);
         if (!strstr (sample, want))
            problem (&p, "README.md: the sample request lacks %s", h);
         bson_free (want);
      }
   }
   problems_check (&p);
   bson_free (sample);
   free (readme);
}

/* configuration.md's syntax names every section of the key table. */
static void
test_sections_listed (void **state)
{
   char *doc = read_file (RELAYBUS_TOP_SRCDIR "/docs/configuration.md");
   char *line = section_text (doc, "- `[section]` headers:", "- ");
   problems_t p = {0};

   (void) state;
   if (!line)
      problem (&p, "docs/configuration.md: no \"[section] headers\" line in Syntax");
   for (int sec = CONFIG_SECTION_PROXY; line && sec < CONFIG_SECTION_HANDLER; sec++) {
      char *want = bson_strdup_printf ("`[%s]`", config_section_name ((config_section_t) sec));
      if (!strstr (line, want))
         problem (&p, "docs/configuration.md: the list of sections lacks %s", want);
      bson_free (want);
   }
   if (line && !strstr (line, "`[handler NAME]`"))
      problem (&p, "docs/configuration.md: the list of sections lacks [handler NAME]");
   problems_check (&p);
   bson_free (line);
   free (doc);
}

/* The job number of the first line of `block` ending in " &" that holds
 * `what` (jobs count from 1 in the order they are started); 0 if none. */
static int
job_of (const char *block, const char *what)
{
   int job = 0;

   for (const char *l = block; l && *l;) {
      const char *eol = strchr (l, '\n');
      size_t len = eol ? (size_t) (eol - l) : strlen (l);

      if (len >= 2 && !strncmp (l + len - 2, " &", 2)) {
         char *line = bson_strndup (l, len);
         job++;
         if (strstr (line, what)) {
            bson_free (line);
            return job;
         }
         bson_free (line);
      }
      l = eol ? eol + 1 : NULL;
   }
   return 0;
}

/* The README's "Try it" stops its three jobs with one kill; operations.md
 * says in which order they get the signal and names each job rightly. */
static void
test_stop_order (void **state)
{
   char *readme = read_file (RELAYBUS_TOP_SRCDIR "/README.md");
   char *ops = read_file (RELAYBUS_TOP_SRCDIR "/docs/operations.md");
   char *block = section_text (readme, "## Try it", "## ");
   const char *kill = block ? strstr (block, "Stop everything with `kill ") : NULL;
   int proxy = block ? job_of (block, "relaybus-proxy -c") : 0, dbl = block ? job_of (block, "mongod-double") : 0,
       recv = block ? job_of (block, "createServer") : 0;
   char cmd[64], want[128];
   problems_t p = {0};

   (void) state;
   if (!kill || !proxy || !dbl || !recv) {
      problem (&p, "README.md: \"Try it\" has no receiver, double and proxy job, or no \"Stop everything with `kill ...`\"");
   } else {
      kill += strlen ("Stop everything with `");
      snprintf (cmd, sizeof cmd, "%.*s", (int) strcspn (kill, "`"), kill);
      snprintf (want, sizeof want, "`%s` signals the proxy (`%%%d`) first", cmd, proxy);
      if (!ops || !strstr (ops, want))
         problem (&p, "docs/operations.md: does not say \"%s\" (the README's jobs: receiver %%%d, double %%%d, proxy %%%d)",
                  want, recv, dbl, proxy);
      snprintf (want, sizeof want, "the server double (`%%%d`) and the receiver\n(`%%%d`)", dbl, recv);
      if (ops && !strstr (ops, want))
         problem (&p, "docs/operations.md: does not name the double as %%%d and the receiver as %%%d", dbl, recv);
   }
   problems_check (&p);
   bson_free (block);
   free (readme);
   free (ops);
}

/* The man page's ENVIRONMENT names every variable the proxy reads
 * (getenv in src/), and those it hands to libraries; its DESCRIPTION names
 * every kind of handler. */
static void
test_man_page (void **state)
{
   static const char *const sources[] = {"main.c",         "base/notify.c", "base/log.c",      "base/trace.c",
                                         "base/config.c",  "dispatch/webhook.c"};
   static const char *const more[] = {"CREDENTIALS_DIRECTORY", "https_proxy", "no_proxy", "${ NAME }",
                                      "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_HEADERS",
                                      "OTEL_EXPORTER_OTLP_TRACES_HEADERS"};
   static const char *const kinds[] = {"webhooks", "pull consumers", "Kafka", "RabbitMQ", "NATS"};
   char *man = read_file (RELAYBUS_TOP_SRCDIR "/docs/man/relaybus-proxy.1.in");
   char *env = section_text (man, ".SH ENVIRONMENT", ".SH ");
   char *desc = section_text (man, ".SH DESCRIPTION", ".SH ");
   problems_t p = {0};

   (void) state;
   if (!env || !desc) {
      problem (&p, "docs/man/relaybus-proxy.1.in: no ENVIRONMENT or DESCRIPTION section");
      goto done;
   }
   for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
      char *path = bson_strdup_printf (RELAYBUS_TOP_SRCDIR "/src/%s", sources[i]);
      char *src = read_file (path);

      for (const char *g = src ? strstr (src, "getenv (\"") : NULL; g; g = strstr (g + 1, "getenv (\"")) {
         const char *name = g + strlen ("getenv (\"");
         char *var = bson_strndup (name, strcspn (name, "\""));
         if (!strstr (env, var))
            problem (&p, "relaybus-proxy(1) ENVIRONMENT: %s (read in src/%s) is missing", var, sources[i]);
         bson_free (var);
      }
      free (src);
      bson_free (path);
   }
   for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
      if (!strstr (env, more[i]))
         problem (&p, "relaybus-proxy(1) ENVIRONMENT: %s is missing", more[i]);
   for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
      if (!strstr (desc, kinds[i]))
         problem (&p, "relaybus-proxy(1) DESCRIPTION: the handlers do not include %s", kinds[i]);
done:
   problems_check (&p);
   bson_free (env);
   bson_free (desc);
   free (man);
}

/* Whether `word` occurs in `text` as a whole word (not followed or
 * preceded by a letter, a digit or '-'). */
static bool
names_word (const char *text, const char *word)
{
   size_t n = strlen (word);

   for (const char *w = strstr (text, word); w; w = strstr (w + 1, word)) {
      char before = w > text ? w[-1] : ' ', after = w[n];
      if (!isalnum ((unsigned char) before) && before != '-' && !isalnum ((unsigned char) after) && after != '-')
         return true;
   }
   return false;
}

/* etc/relaybus-proxy.ini: [outbox]'s comment names every collection; the
 * header.NAME comment names every header the sender refuses to take from
 * the configuration (and configuration.md the same); the package's
 * configuration path in deployment.md is the one debian/ installs. */
static void
test_sample_ini_and_paths (void **state)
{
   static const char *const candidates[] = {"Host",   "Content-Type", "Content-Length", "Transfer-Encoding", "Connection",
                                            "Expect", "Accept",       "User-Agent",     "Authorization",     "X-Tenant"};
   char *ini = read_file (RELAYBUS_TOP_SRCDIR "/etc/relaybus-proxy.ini");
   char *conf = read_file (RELAYBUS_TOP_SRCDIR "/docs/configuration.md");
   char *deploy = read_file (RELAYBUS_TOP_SRCDIR "/docs/deployment.md");
   char *install = read_file (RELAYBUS_TOP_SRCDIR "/debian/relaybus-proxy.install");
   char *outbox = section_text (ini, "\n[outbox]", "database =");
   char *hdr = section_text (ini, "; webhook: header.NAME = VALUE", "; header.X-Tenant");
   problems_t p = {0};

   (void) state;
   if (!outbox || !hdr) {
      problem (&p, "etc/relaybus-proxy.ini: no [outbox] comment or header.NAME comment");
      goto done;
   }
   for (int c = 0; c < OUTBOX_N_COLLECTIONS; c++) {
      const char *name = outbox_collection_suffix ((outbox_collection_t) c);
      if (!strstr (outbox, name))
         problem (&p, "etc/relaybus-proxy.ini: [outbox]'s comment does not name the collection %s", name);
   }
   for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
      bson_error_t err;
      bool refused = !webhook_header_valid (candidates[i], "x", &err);
      char *want;

      if (refused && !names_word (hdr, candidates[i]))
         problem (&p, "etc/relaybus-proxy.ini: the header.NAME comment does not name %s, which is refused", candidates[i]);
      if (!refused && names_word (hdr, candidates[i]))
         problem (&p, "etc/relaybus-proxy.ini: the header.NAME comment names %s, which is accepted", candidates[i]);
      want = bson_strdup_printf ("`%s`", candidates[i]);
      if (refused && (!conf || !strstr (conf, want)))
         problem (&p, "docs/configuration.md: header.NAME does not name %s, which is refused", candidates[i]);
      bson_free (want);
   }
   if (!strstr (hdr, "signature"))
      problem (&p, "etc/relaybus-proxy.ini: the header.NAME comment does not say values of *signature* names are masked");
   if (!install || !strstr (install, "etc/relaybus-proxy/relaybus-proxy.ini"))
      problem (&p, "debian/relaybus-proxy.install: no etc/relaybus-proxy/relaybus-proxy.ini");
   if (deploy && strstr (deploy, "/etc/relaybus-proxy.ini"))
      problem (&p, "docs/deployment.md: names /etc/relaybus-proxy.ini; the package's is /etc/relaybus-proxy/relaybus-proxy.ini");
done:
   problems_check (&p);
   bson_free (outbox);
   bson_free (hdr);
   free (ini);
   free (conf);
   free (deploy);
   free (install);
}

/* scripts/lib.sh asks for the Node.js that the locked mongodb driver needs
 * (its engines field), and CONTRIBUTING.md and README.md link only to files
 * of the repository. */
static void
test_node_and_links (void **state)
{
   char *lib = read_file (RELAYBUS_TOP_SRCDIR "/scripts/lib.sh");
   char *lock = read_file (RELAYBUS_TOP_SRCDIR "/tests/package-lock.json");
   const char *m = lock ? strstr (lock, "\"node_modules/mongodb\": {") : NULL;
   const char *eng = m ? strstr (m, "\"node\": \">=") : NULL;
   problems_t p = {0};

   (void) state;
   if (!eng)
      problem (&p, "tests/package-lock.json: no engines of node_modules/mongodb");
   else {
      /* ">=20.19.0" -> "20.19" */
      const char *v = eng + strlen ("\"node\": \">=");
      size_t n = strcspn (v, "\"");
      char *ver = bson_strndup (v, n), *want;
      char *last = strrchr (ver, '.');

      if (last && last != strchr (ver, '.') && !strcmp (last, ".0"))
         *last = '\0';
      want = bson_strdup_printf ("RELAYBUS_NODE_MIN=%s\n", ver);
      if (!lib || !strstr (lib, want))
         problem (&p, "scripts/lib.sh: does not set %s (the mongodb driver's engines: >=%.*s)", want, (int) n, v);
      bson_free (want);
      bson_free (ver);
   }
   for (const char *f = "CONTRIBUTING.md\0README.md\0docs/conventions.md\0"; *f; f += strlen (f) + 1) {
      char *path = bson_strdup_printf (RELAYBUS_TOP_SRCDIR "/%s", f);
      char *doc = read_file (path);
      const char *dir = strchr (f, '/') ? "docs/" : "";

      if (!doc)
         problem (&p, "%s: cannot be read", f);
      for (const char *l = doc ? strstr (doc, "](") : NULL; l; l = strstr (l + 2, "](")) {
         const char *t = l + 2;
         size_t n = strcspn (t, ")#");
         char *target, *full;
         FILE *fh;

         if (n == 0 || !strncmp (t, "http://", 7) || !strncmp (t, "https://", 8))
            continue;
         target = bson_strndup (t, n);
         full = bson_strdup_printf (RELAYBUS_TOP_SRCDIR "/%s%s", dir, target);
         if (!(fh = fopen (full, "r")))
            problem (&p, "%s: links to %s, which is not in the repository", f, target);
         else
            fclose (fh);
         bson_free (target);
         bson_free (full);
      }
      if (doc && strstr (doc, "STYLE.md"))
         problem (&p, "%s: cites STYLE.md, which is not in the repository (the conventions are docs/conventions.md)", f);
      free (doc);
      bson_free (path);
   }
   problems_check (&p);
   free (lib);
   free (lock);
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_config_keys_documented),
      cmocka_unit_test (test_metrics_documented),
      cmocka_unit_test (test_endpoints_documented),
      cmocka_unit_test (test_alerts_documented),
      cmocka_unit_test (test_sample_request_verifies),
      cmocka_unit_test (test_one_version),
      cmocka_unit_test (test_readme_sample_request),
      cmocka_unit_test (test_sections_listed),
      cmocka_unit_test (test_stop_order),
      cmocka_unit_test (test_man_page),
      cmocka_unit_test (test_sample_ini_and_paths),
      cmocka_unit_test (test_node_and_links),
   };

   return cmocka_run_group_tests (tests, NULL, NULL);
}
