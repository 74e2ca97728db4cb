/*
 * base/config_secret.c - secrets outside the configuration file: a value's
 * ${NAME} references to the environment, a secret-bearing key's file form
 * NAME_file, a credential written in the file itself, and the warnings for
 * files every user may read.  What a snapshot holds that is secret, and its
 * masking, is base/config_mask.c's; the parsing that asks for these is
 * base/config.c's.
 */
#include "base/config.h"
#include "base/config_private.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/assert.h"
#include "base/log.h"

/*
 * A secret need not be written in the file.  Any value may name
 * environment variables as ${NAME} (all of it or inside it; "$${" is a
 * literal "${", any other '$' is itself), and each secret-bearing key NAME
 * has a file form NAME_file (CONFIG_KEY_FILE_FORM in the table) whose
 * value is a path: NAME takes the file's content, one trailing newline
 * removed.  Both happen whenever the file is parsed, so at start and at
 * each reload.  An unset variable, an unreadable file and both forms of one
 * key are errors that name the variable, the file or the key: a secret that
 * silently became empty would start a proxy without authentication. */

#define CONFIG_ENV_NAME_MAX 128

/* An environment variable's name: letters, digits and '_', not starting
 * with a digit. */
static bool
valid_name_span (const char *s, size_t n)
{
   if (isdigit ((unsigned char) s[0]))
      return false;
   for (size_t i = 0; i < n; i++) {
      if (!isalnum ((unsigned char) s[i]) && s[i] != '_')
         return false;
   }
   return true;
}

/* Expands the ${NAME} references of `in` into `out`. */
bool
config_expand (const char *in, char *out, size_t out_len, char *why, size_t why_len)
{
   size_t n = 0;

   for (const char *p = in; *p;) {
      const char *piece = p;
      size_t piece_len = 1;

      if (p[0] == '$' && p[1] == '$' && p[2] == '{') {
         piece = "${";
         piece_len = 2;
         p += 3;
      } else if (p[0] == '$' && p[1] == '{') {
         const char *name = p + 2, *end = strchr (name, '}');
         char var[CONFIG_ENV_NAME_MAX];

         if (!end) {
            snprintf (why, why_len, "'${' without its '}' (write $${ for a literal ${)");
            return false;
         }
         if (end == name || (size_t) (end - name) >= sizeof var || !valid_name_span (name, (size_t) (end - name))) {
            snprintf (why, why_len, "'${%.*s}' is not a variable name (letters, digits and '_')",
                      (int) (end - name > 64 ? 64 : end - name), name);
            return false;
         }
         memcpy (var, name, (size_t) (end - name));
         var[end - name] = '\0';
         piece = getenv (var);
         if (!piece) {
            snprintf (why, why_len, "the environment variable %.100s is not set", var);
            return false;
         }
         piece_len = strlen (piece);
         p = end + 1;
      } else {
         p++;
      }
      if (n + piece_len >= out_len) {
         snprintf (why, why_len, "value longer than %zu bytes once its variables are expanded", out_len - 1);
         return false;
      }
      memcpy (out + n, piece, piece_len);
      n += piece_len;
   }
   out[n] = '\0';
   return true;
}

/* The path a _file key names: a relative one is taken from the folder of
 * the configuration file, not from the working directory (a service's is
 * "/").  Caller frees. */
static char *
config_resolve_path (const char *origin, const char *path)
{
   const char *slash = origin ? strrchr (origin, '/') : NULL;

   if (path[0] == '/' || !slash)
      return bson_strdup (path);
   return bson_strdup_printf ("%.*s/%s", (int) (slash - origin), origin, path);
}

/* Reads the secret of a _file key into `out`: the whole file, one trailing
 * newline (LF or CRLF) removed; it must hold one line. */
bool
config_read_secret_file (const char *origin, const char *path, char *out, size_t out_len, char *why, size_t why_len)
{
   char *full = config_resolve_path (origin, path);
   FILE *f = fopen (full, "rb");
   size_t n = 0;
   bool ok = false;

   if (!f) {
      snprintf (why, why_len, "%s: %s", full, strerror (errno));
      goto done;
   }
   n = fread (out, 1, out_len, f);
   if (ferror (f)) {
      snprintf (why, why_len, "%s: read error", full);
      goto done;
   }
   if (n == out_len) {
      snprintf (why, why_len, "%s: longer than %zu bytes", full, out_len - 1);
      goto done;
   }
   if (n > 0 && out[n - 1] == '\n')
      n--;
   if (n > 0 && out[n - 1] == '\r')
      n--;
   out[n] = '\0';
   if (memchr (out, '\0', n) || memchr (out, '\n', n) || memchr (out, '\r', n)) {
      snprintf (why, why_len, "%s: holds more than one line (or a NUL byte)", full);
      goto done;
   }
   ok = true;
done:
   if (f)
      fclose (f);
   bson_free (full);
   return ok;
}

/* The key a file-form key is the file of ("upstream" for "upstream_file"). */
const config_key_t *
config_file_base (const config_key_t *file_key)
{
   char name[64];
   size_t len = strlen (file_key->name) - strlen ("_file");

   RELAYBUS_ASSERT (len < sizeof name);
   memcpy (name, file_key->name, len);
   name[len] = '\0';
   return config_find_key (file_key->section, name);
}

/* The file form of `key`, or NULL when it has none. */
const config_key_t *
config_file_form (const config_key_t *key)
{
   char name[80];
   const config_key_t *f;

   snprintf (name, sizeof name, "%s_file", key->name);
   f = config_find_key (key->section, name);
   return f && (f->flags & CONFIG_KEY_FILE_FORM) ? f : NULL;
}

/* Marks the snapshot as holding a credential written in the file when
 * `value` of the secret-bearing key `name` has one (what config_mask would
 * hide). */
void
config_note_inline_secret (config_t *cfg, const char *name, const char *value)
{
   char *masked = config_mask (name, value);

   if (strcmp (masked, value) != 0)
      cfg->secret_inline = true;
   bson_free (masked);
}

/* Warns when `path` (resolved against the config file's folder) may be read
 * by others; `what` says what it holds. */
static int
config_warn_exposed (const char *origin, const char *path, const char *what)
{
   char *full = config_resolve_path (origin, path);
   struct stat st;
   int warned = 0;

   if (stat (full, &st) == 0 && (st.st_mode & S_IROTH)) {
      log_warn ("%s is readable by every user (mode %03o) and holds %s: chmod o-r %s", full,
                (unsigned) (st.st_mode & 0777), what, full);
      warned = 1;
   }
   bson_free (full);
   return warned;
}

int
config_warn_exposed_secrets (const config_t *cfg)
{
   size_t n_keys;
   const config_key_t *keys = config_keys (&n_keys);
   int n = 0;

   if (cfg->secret_inline && cfg->path)
      n += config_warn_exposed (NULL, cfg->path, "a credential written in the configuration");
   for (size_t i = 0; i < n_keys; i++) {
      const config_key_t *key = &keys[i];

      if (!(key->flags & CONFIG_KEY_FILE_FORM))
         continue;
      if (key->section != CONFIG_SECTION_HANDLER) {
         const char *path = *(char *const *) ((const char *) cfg + key->offset);

         if (path && *path)
            n += config_warn_exposed (cfg->path, path, "a secret (a _file key names it)");
         continue;
      }
      for (size_t h = 0; h < cfg->n_handlers; h++) {
         const char *path = *(char *const *) ((const char *) &cfg->handlers[h] + key->offset);

         if (path && *path)
            n += config_warn_exposed (cfg->path, path, "a secret (a _file key names it)");
      }
   }
   return n;
}
