/*
 * base/authfile.c - loading and validating the auth file, formatting its
 * entries, and the base64 both the file and SCRAM messages use.
 *
 * The file holds what RFC 5802 calls the server's stored information:
 * salt, iteration count, StoredKey and ServerKey.  A password never
 * appears in it, in an error or in a log line; a bad line is reported by
 * its number and the field at fault, never by its contents.
 *
 * What this file does not do: derive keys or run a conversation
 * (codec/scram.c does both).
 */
#include "base/authfile.h"
#include "base/trustfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "base/utf8.h"

/* The largest file read: every line at its bound. */
#define AUTHFILE_MAX_BYTES ((size_t) 64 * 1024 * 1024)

struct authfile {
   authfile_user_t *users; /* sorted by name; owned */
   size_t n;
};

static const char *const mech_names[AUTHFILE_N_MECHS] = {
   [AUTHFILE_SCRAM_SHA_1] = "SCRAM-SHA-1",
   [AUTHFILE_SCRAM_SHA_256] = "SCRAM-SHA-256",
};

const char *
authfile_mech_name (authfile_mech_t mech)
{
   return (unsigned) mech < AUTHFILE_N_MECHS ? mech_names[mech] : "unknown";
}

bool
authfile_mech_from_name (const char *name, size_t len, authfile_mech_t *out)
{
   for (int m = 0; m < AUTHFILE_N_MECHS; m++) {
      if (strlen (mech_names[m]) == len && memcmp (name, mech_names[m], len) == 0) {
         *out = (authfile_mech_t) m;
         return true;
      }
   }
   return false;
}

size_t
authfile_key_len (authfile_mech_t mech)
{
   return mech == AUTHFILE_SCRAM_SHA_1 ? 20 : 32;
}

/* ------------------------------------------------------------- base64 */

size_t
authfile_b64_encode (const uint8_t *in, size_t len, char *out, size_t out_len)
{
   size_t need = 4 * ((len + 2) / 3);

   if (out_len < need + 1 || len > INT32_MAX) {
      if (out_len)
         out[0] = '\0';
      return 0;
   }
   return (size_t) EVP_EncodeBlock ((unsigned char *) out, in, (int) len);
}

static int
b64_value (char c)
{
   if (c >= 'A' && c <= 'Z')
      return c - 'A';
   if (c >= 'a' && c <= 'z')
      return c - 'a' + 26;
   if (c >= '0' && c <= '9')
      return c - '0' + 52;
   if (c == '+')
      return 62;
   if (c == '/')
      return 63;
   return -1;
}

bool
authfile_b64_decode (const char *in, size_t len, uint8_t *out, size_t out_len, size_t *written)
{
   size_t pad = 0, n = 0;

   *written = 0;
   if (len % 4 != 0)
      return false;
   if (len >= 1 && in[len - 1] == '=')
      pad++;
   if (len >= 2 && in[len - 2] == '=')
      pad++;
   if (len / 4 * 3 - pad > out_len)
      return false;
   for (size_t i = 0; i < len; i += 4) {
      int v[4];
      bool last = i + 4 == len;
      for (int k = 0; k < 4; k++) {
         if (last && in[i + k] == '=' && (size_t) k >= 4 - pad) {
            v[k] = 0;
            continue;
         }
         v[k] = b64_value (in[i + k]);
         if (v[k] < 0)
            return false;
      }
      uint32_t triple = (uint32_t) v[0] << 18 | (uint32_t) v[1] << 12 | (uint32_t) v[2] << 6 | (uint32_t) v[3];
      size_t take = last ? 3 - pad : 3;
      for (size_t k = 0; k < take; k++)
         out[n++] = (uint8_t) (triple >> (16 - 8 * k));
   }
   *written = n;
   return true;
}

/* ---------------------------------------------------------- user names */

bool
authfile_name_valid (const char *name, bson_error_t *error)
{
   size_t len = strlen (name);

   if (len == 0) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_NAME, "user name is empty");
      return false;
   }
   if (len > AUTHFILE_MAX_NAME) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_NAME,
                      "user name is %zu bytes, the limit is %d", len, AUTHFILE_MAX_NAME);
      return false;
   }
   if (!utf8_valid (name, len)) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_NAME, "user name is not valid UTF-8");
      return false;
   }
   for (size_t i = 0; i < len; i++) {
      unsigned char c = (unsigned char) name[i];
      if (c < 0x20 || c == 0x7f) {
         bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_NAME,
                         "user name holds a control character (byte %zu)", i + 1);
         return false;
      }
   }
   /* A comment line starts with optional blanks and '#'. */
   if (name[0] == ' ' || name[0] == '\t' || name[0] == '#') {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_NAME,
                      "user name may not start with a blank or '#'");
      return false;
   }
   return true;
}

/* ------------------------------------------------------------- parsing */

static int
user_cmp (const void *a, const void *b)
{
   return strcmp (((const authfile_user_t *) a)->name, ((const authfile_user_t *) b)->name);
}

/* Decodes field [s, s+len) into out (exactly `want` bytes unless want is
 * 0, then 1..cap bytes). */
static bool
field_b64 (const char *s, size_t len, uint8_t *out, size_t cap, size_t want, size_t *got)
{
   if (!authfile_b64_decode (s, len, out, cap, got))
      return false;
   return want ? *got == want : *got > 0;
}

/* Parses line[0..len) (number `lineno`) into `user` and `mech`. */
static bool
parse_line (const char *line, size_t len, const char *source, unsigned lineno, authfile_user_t *user,
            authfile_mech_t *mech, bson_error_t *error)
{
   const char *f[6]; /* name, mechanism, iterations, salt, storedkey, serverkey */
   size_t flen[6];
   const char *end = line + len;
   const char *p = end;
   bson_error_t name_error;
   authfile_key_t *key;
   char digits[16];
   size_t got;

   /* The last five fields hold no colon; the name is what precedes them. */
   for (int k = 5; k >= 1; k--) {
      const char *q = p;
      while (q > line && q[-1] != ':')
         q--;
      if (q == line) {
         bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX,
                         "%s:%u: expected NAME:MECHANISM:ITERATIONS:SALT:STOREDKEY:SERVERKEY (6 fields "
                         "separated by ':')",
                         source, lineno);
         return false;
      }
      f[k] = q;
      flen[k] = (size_t) (p - q);
      p = q - 1;
   }
   f[0] = line;
   flen[0] = (size_t) (p - line);

   if (flen[0] > AUTHFILE_MAX_NAME) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX,
                      "%s:%u: user name is %zu bytes, the limit is %d", source, lineno, flen[0],
                      AUTHFILE_MAX_NAME);
      return false;
   }
   memcpy (user->name, f[0], flen[0]);
   user->name[flen[0]] = '\0';
   if (memchr (f[0], '\0', flen[0]) || !authfile_name_valid (user->name, &name_error)) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX, "%s:%u: %s", source, lineno,
                      memchr (f[0], '\0', flen[0]) ? "user name holds a NUL byte" : name_error.message);
      return false;
   }
   if (!authfile_mech_from_name (f[1], flen[1], mech)) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX,
                      "%s:%u: unknown mechanism '%.*s' (SCRAM-SHA-256 or SCRAM-SHA-1)", source, lineno,
                      (int) (flen[1] > 32 ? 32 : flen[1]), f[1]);
      return false;
   }
   key = &user->keys[*mech];
   key->present = true;

   if (flen[2] == 0 || flen[2] >= sizeof digits || strspn (f[2], "0123456789") < flen[2]) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX,
                      "%s:%u: iteration count is not a decimal number", source, lineno);
      return false;
   }
   memcpy (digits, f[2], flen[2]);
   digits[flen[2]] = '\0';
   unsigned long it = strtoul (digits, NULL, 10);
   if (it < AUTHFILE_MIN_ITERATIONS || it > AUTHFILE_MAX_ITERATIONS) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX,
                      "%s:%u: iteration count %lu is outside %d..%d (drivers refuse fewer than %d)",
                      source, lineno, it, AUTHFILE_MIN_ITERATIONS, AUTHFILE_MAX_ITERATIONS,
                      AUTHFILE_MIN_ITERATIONS);
      return false;
   }
   key->iterations = (uint32_t) it;

   if (!field_b64 (f[3], flen[3], key->salt, sizeof key->salt, 0, &key->salt_len)) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX,
                      "%s:%u: salt is not base64 of 1 to %d bytes", source, lineno, AUTHFILE_MAX_SALT);
      return false;
   }
   size_t klen = authfile_key_len (*mech);
   uint8_t *dest[2] = {key->stored_key, key->server_key};
   const char *what[2] = {"stored key", "server key"};
   for (int k = 0; k < 2; k++) {
      uint8_t tmp[AUTHFILE_KEY_MAX + 3];
      if (!field_b64 (f[4 + k], flen[4 + k], tmp, sizeof tmp, klen, &got)) {
         bool decodes = authfile_b64_decode (f[4 + k], flen[4 + k], tmp, sizeof tmp, &got);
         if (decodes)
            bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX,
                            "%s:%u: %s is %zu bytes, %s needs %zu", source, lineno, what[k], got,
                            authfile_mech_name (*mech), klen);
         else
            bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_SYNTAX,
                            "%s:%u: %s is not valid base64", source, lineno, what[k]);
         return false;
      }
      memcpy (dest[k], tmp, klen);
   }
   user->line[*mech] = lineno;
   return true;
}

authfile_t *
authfile_parse (const char *text, size_t len, const char *source, bson_error_t *error)
{
   authfile_t *af = bson_malloc0 (sizeof *af);
   authfile_t *ret = NULL;
   size_t cap = 0, entries = 0;
   unsigned lineno = 0;
   const char *p = text, *end = text + len;

   if (len > AUTHFILE_MAX_BYTES) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_LIMIT, "%s: file is larger than %zu bytes",
                      source, AUTHFILE_MAX_BYTES);
      goto done;
   }
   while (p < end) {
      const char *nl = memchr (p, '\n', (size_t) (end - p));
      const char *eol = nl ? nl : end;
      size_t llen = (size_t) (eol - p);
      size_t i = 0;

      lineno++;
      if (llen && p[llen - 1] == '\r')
         llen--;
      if (llen > AUTHFILE_MAX_LINE) {
         bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_LIMIT,
                         "%s:%u: line is longer than %d bytes", source, lineno, AUTHFILE_MAX_LINE);
         goto done;
      }
      while (i < llen && (p[i] == ' ' || p[i] == '\t'))
         i++;
      if (i < llen && p[i] != '#') {
         authfile_user_t user;
         authfile_mech_t mech;

         memset (&user, 0, sizeof user);
         if (++entries > AUTHFILE_MAX_ENTRIES) {
            bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_LIMIT,
                            "%s:%u: more than %d entries", source, lineno, AUTHFILE_MAX_ENTRIES);
            goto done;
         }
         if (!parse_line (p, llen, source, lineno, &user, &mech, error)) {
            OPENSSL_cleanse (&user, sizeof user);
            goto done;
         }
         if (af->n == cap) {
            cap = cap ? cap * 2 : 16;
            af->users = bson_realloc (af->users, cap * sizeof *af->users);
         }
         af->users[af->n++] = user;
         OPENSSL_cleanse (&user, sizeof user);
      }
      p = nl ? nl + 1 : end;
   }

   /* Merge a user's lines (one per mechanism); the same mechanism twice is
    * an error naming both lines.  A stable order is not needed: the lines
    * are compared, not the positions. */
   if (af->n) {
      size_t out = 0;
      qsort (af->users, af->n, sizeof *af->users, user_cmp);
      for (size_t i = 0; i < af->n; i++) {
         authfile_user_t *u = &af->users[i];
         if (out && strcmp (af->users[out - 1].name, u->name) == 0) {
            authfile_user_t *into = &af->users[out - 1];
            for (int m = 0; m < AUTHFILE_N_MECHS; m++) {
               if (!u->keys[m].present)
                  continue;
               if (into->keys[m].present) {
                  unsigned a = into->line[m], b = u->line[m];
                  bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_DUPLICATE,
                                  "%s:%u: duplicate %s entry for user '%s' (first on line %u)", source,
                                  a > b ? a : b, authfile_mech_name ((authfile_mech_t) m), u->name,
                                  a < b ? a : b);
                  goto done;
               }
               into->keys[m] = u->keys[m];
               into->line[m] = u->line[m];
            }
         } else {
            if (out != i)
               af->users[out] = *u;
            out++;
         }
      }
      for (size_t i = out; i < af->n; i++)
         OPENSSL_cleanse (&af->users[i], sizeof af->users[i]);
      af->n = out;
   }
   ret = af;
   af = NULL;

done:
   authfile_destroy (af);
   return ret;
}

authfile_t *
authfile_load (const char *path, bson_error_t *error)
{
   authfile_t *ret = NULL;
   char *buf = NULL;
   size_t len = 0;
   struct stat st;
   trustfile_err_t terr;
   char why[512];
   /* The one check of trusted files (base/trustfile.h): a regular file
    * others may neither read nor write.  A symbolic link is followed (a
    * mounted secret is often one) and any owner is accepted: the file is
    * only read. */
   int fd = trustfile_open (path, O_RDONLY, 0, TRUSTFILE_NO_OTHERS_READ | TRUSTFILE_NO_OTHERS_WRITE, &terr, why, sizeof why);

   if (fd < 0) {
      if (terr == TRUSTFILE_ERR_MODE)
         bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_PERMISSIONS, "%s; it holds SCRAM keys", why);
      else
         bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_IO, "%s", why);
      goto done;
   }
   if (fstat (fd, &st) != 0) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_IO, "%s: fstat: %s", path, strerror (errno));
      goto done;
   }
   if ((size_t) st.st_size > AUTHFILE_MAX_BYTES) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_LIMIT, "%s: file is larger than %zu bytes",
                      path, AUTHFILE_MAX_BYTES);
      goto done;
   }
   buf = bson_malloc ((size_t) st.st_size + 1);
   while (len < (size_t) st.st_size) {
      ssize_t r = read (fd, buf + len, (size_t) st.st_size - len);
      if (r < 0 && errno == EINTR)
         continue;
      if (r < 0) {
         bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_IO, "%s: read: %s", path,
                         strerror (errno));
         goto done;
      }
      if (r == 0)
         break;
      len += (size_t) r;
   }
   ret = authfile_parse (buf, len, path, error);

done:
   if (buf) {
      OPENSSL_cleanse (buf, len);
      bson_free (buf);
   }
   if (fd >= 0)
      close (fd);
   return ret;
}

void
authfile_destroy (authfile_t *af)
{
   if (!af)
      return;
   if (af->users) {
      OPENSSL_cleanse (af->users, af->n * sizeof *af->users);
      bson_free (af->users);
   }
   bson_free (af);
}

const authfile_user_t *
authfile_lookup (const authfile_t *af, const char *name, size_t len)
{
   size_t lo = 0, hi;

   if (!af || len > AUTHFILE_MAX_NAME || memchr (name, '\0', len))
      return NULL;
   hi = af->n;
   while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      const char *n = af->users[mid].name;
      size_t nlen = strlen (n);
      int c = memcmp (n, name, nlen < len ? nlen : len);
      if (c == 0)
         c = nlen < len ? -1 : nlen > len ? 1 : 0;
      if (c == 0)
         return &af->users[mid];
      if (c < 0)
         lo = mid + 1;
      else
         hi = mid;
   }
   return NULL;
}

size_t
authfile_count (const authfile_t *af)
{
   return af ? af->n : 0;
}

const authfile_user_t *
authfile_user_at (const authfile_t *af, size_t i)
{
   return af && i < af->n ? &af->users[i] : NULL;
}

char *
authfile_format_user (const authfile_user_t *user)
{
   bson_string_t *s = bson_string_new (NULL);

   /* SCRAM-SHA-256 first: drivers prefer it, and so does a reader. */
   for (int m = AUTHFILE_N_MECHS - 1; m >= 0; m--) {
      const authfile_key_t *k = &user->keys[m];
      char salt[4 * (AUTHFILE_MAX_SALT + 2) / 3 + 1];
      char stored[4 * (AUTHFILE_KEY_MAX + 2) / 3 + 1], server[sizeof stored];
      size_t klen = authfile_key_len ((authfile_mech_t) m);

      if (!k->present)
         continue;
      authfile_b64_encode (k->salt, k->salt_len, salt, sizeof salt);
      authfile_b64_encode (k->stored_key, klen, stored, sizeof stored);
      authfile_b64_encode (k->server_key, klen, server, sizeof server);
      bson_string_append_printf (s, "%s:%s:%u:%s:%s:%s\n", user->name,
                                 authfile_mech_name ((authfile_mech_t) m), (unsigned) k->iterations, salt,
                                 stored, server);
   }
   return bson_string_free (s, false);
}

/* ------------------------------------------------------------ password */

bool
authfile_read_password (FILE *in, char *buf, size_t buf_len, bson_error_t *error)
{
   struct termios saved, quiet;
   bool restore = false, ok = false;
   int fd = fileno (in);
   size_t len;

   if (isatty (fd) && tcgetattr (fd, &saved) == 0) {
      quiet = saved;
      quiet.c_lflag &= (tcflag_t) ~(ECHO | ECHONL);
      quiet.c_lflag |= ICANON;
      restore = tcsetattr (fd, TCSAFLUSH, &quiet) == 0;
   }
   if (!fgets (buf, (int) buf_len, in)) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_PASSWORD,
                      "no password on standard input (one line expected)");
      goto done;
   }
   len = strlen (buf);
   if (len && buf[len - 1] == '\n')
      buf[--len] = '\0';
   else if (len >= buf_len - 1) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_PASSWORD,
                      "password is longer than %zu bytes", buf_len - 2);
      goto done;
   }
   if (len && buf[len - 1] == '\r')
      buf[--len] = '\0';
   if (len > AUTHFILE_MAX_PASSWORD) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_PASSWORD,
                      "password is longer than %d bytes", AUTHFILE_MAX_PASSWORD);
      goto done;
   }
   if (len == 0) {
      bson_set_error (error, AUTHFILE_ERROR_DOMAIN, AUTHFILE_ERR_PASSWORD, "password is empty");
      goto done;
   }
   ok = true;

done:
   if (restore) {
      tcsetattr (fd, TCSAFLUSH, &saved);
      fputc ('\n', stderr); /* the newline the user typed was not echoed */
   }
   if (!ok)
      OPENSSL_cleanse (buf, buf_len);
   return ok;
}
