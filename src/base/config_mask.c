/*
 * base/config_mask.c - what the configuration holds that is secret, and
 * the one masking function every text that may quote it goes through
 * (config_mask, base/config.h).
 *
 * A validated snapshot lists its secrets (config_collect_secrets: the admin
 * token, the webhook secrets, the passwords of the upstream's and the
 * handlers' URLs, the secret kafka.* values), so that a free text (an
 * error from a library, a log line) can have every secret it quotes
 * verbatim masked, besides the password of each URL it holds.  A key's
 * value is masked by the key's rule: a secret key whole, a URL's password
 * and its secret options.
 *
 * What this file does not do: parse or validate keys (base/config.c).
 */
#include "base/config.h"
#include "base/config_private.h"
#include "base/authfile.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

#include <bson/bson.h>

/* ----------------------------------------------------------- secrets */

/* Adds s[0..len) to the snapshot's secrets, once, when it is long enough
 * to be searched for (CONFIG_SECRET_MIN_VERBATIM). */
static void
secrets_add (config_t *cfg, const char *s, size_t len)
{
   if (!s || len < CONFIG_SECRET_MIN_VERBATIM)
      return;
   for (size_t i = 0; i < cfg->n_secrets; i++)
      if (strlen (cfg->secrets[i]) == len && memcmp (cfg->secrets[i], s, len) == 0)
         return;
   cfg->secrets = bson_realloc (cfg->secrets, (cfg->n_secrets + 1) * sizeof *cfg->secrets);
   cfg->secrets[cfg->n_secrets++] = bson_strndup (s, len);
}

static int hex_value (char c);

/* `s[0..len)` percent-decoded into a new string (*n its length); free
 * with bson_zero_free (len + 1). */
static char *
percent_decoded (const char *s, size_t len, size_t *n)
{
   char *out = bson_malloc (len + 1);

   *n = 0;
   for (const char *p = s; p < s + len; p++) {
      if (*p == '%' && p + 2 < s + len && hex_value (p[1]) >= 0 && hex_value (p[2]) >= 0) {
         out[(*n)++] = (char) (hex_value (p[1]) * 16 + hex_value (p[2]));
         p += 2;
      } else {
         out[(*n)++] = *p;
      }
   }
   out[*n] = '\0'; /* secrets_add copies with bson_strndup, which reads up to it */
   return out;
}

/* The password (or the token: user information without ':') of a URL,
 * as written and percent-decoded: a library's message may quote either.
 * And the Basic credential curl sends for it, base64 of the decoded
 * "user:password" (a token alone goes as "token:"): an endpoint that
 * echoes the request puts it in the answer that lastError keeps. */
static void
secrets_add_url (config_t *cfg, const char *url)
{
   const char *auth = url ? strstr (url, "://") : NULL;
   const char *end, *at = NULL, *colon, *user;
   char *decoded, *duser, *basic, *b64;
   size_t n = 0, nuser = 0, blen, ulen;

   if (!auth)
      return;
   auth += 3;
   for (end = auth; *end && !strchr ("/?#", *end); end++)
      if (*end == '@')
         at = end;
   if (!at)
      return;
   user = auth;
   colon = memchr (auth, ':', (size_t) (at - auth));
   if (colon)
      auth = colon + 1;
   secrets_add (cfg, auth, (size_t) (at - auth));
   decoded = percent_decoded (auth, (size_t) (at - auth), &n);
   secrets_add (cfg, decoded, n);
   /* Without ':', the user information is the user name, with an empty
    * password. */
   ulen = colon ? (size_t) (colon - user) : (size_t) (at - user);
   duser = percent_decoded (user, ulen, &nuser);
   blen = nuser + 1 + (colon ? n : 0);
   basic = bson_malloc (blen + 1);
   memcpy (basic, duser, nuser);
   basic[nuser] = ':';
   if (colon)
      memcpy (basic + nuser + 1, decoded, n);
   basic[blen] = '\0';
   b64 = bson_malloc (4 * ((blen + 2) / 3) + 1);
   if (authfile_b64_encode ((const uint8_t *) basic, blen, b64, 4 * ((blen + 2) / 3) + 1) > 0)
      secrets_add (cfg, b64, strlen (b64));
   bson_zero_free (b64, 4 * ((blen + 2) / 3) + 1);
   bson_zero_free (basic, blen + 1);
   bson_zero_free (duser, ulen + 1);
   bson_zero_free (decoded, (size_t) (at - auth) + 1);
}

bool
config_kafka_prop_is_secret (const char *name)
{
   return strstr (name, "password") || strstr (name, "secret") || strstr (name, ".pem") ||
          strstr (name, "key.password") || strstr (name, "sasl.oauthbearer.config");
}

bool
config_header_is_secret (const char *name)
{
   static const char *const words[] = {"auth", "token", "secret", "key", "cookie", "password", "signature"};

   for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
      if (strcasestr (name, words[i]))
         return true;
   return false;
}

/* Fills cfg->secrets from the validated snapshot (config_t.secrets). */
void
config_collect_secrets (config_t *cfg)
{
   secrets_add (cfg, cfg->admin_token, strlen (cfg->admin_token));
   secrets_add (cfg, cfg->upstream_auth.password, cfg->upstream_auth.password ? strlen (cfg->upstream_auth.password) : 0);
   secrets_add (cfg,
                cfg->upstream_tls.cert_key_password,
                cfg->upstream_tls.cert_key_password ? strlen (cfg->upstream_tls.cert_key_password) : 0);
   secrets_add_url (cfg, cfg->upstream);
   for (size_t i = 0; i < cfg->n_handlers; i++) {
      const config_handler_t *h = &cfg->handlers[i];
      const char *p = h->secret;

      /* The whole value, each of its white-space separated secrets, and
       * each one's key without the whsec_ prefix. */
      secrets_add (cfg, h->secret, strlen (h->secret));
      for (;;) {
         size_t len;

         while (isspace ((unsigned char) *p))
            p++;
         if (!*p)
            break;
         for (len = 0; p[len] && !isspace ((unsigned char) p[len]); len++)
            ;
         secrets_add (cfg, p, len);
         if (len > 6 && strncmp (p, "whsec_", 6) == 0)
            secrets_add (cfg, p + 6, len - 6);
         p += len;
      }
      secrets_add_url (cfg, h->url);
      for (size_t k = 0; k < h->n_kafka_props; k++)
         if (config_kafka_prop_is_secret (h->kafka_props[2 * k]))
            secrets_add (cfg, h->kafka_props[2 * k + 1], strlen (h->kafka_props[2 * k + 1]));
      for (size_t k = 0; k < h->n_headers; k++)
         if (config_header_is_secret (h->headers[2 * k]))
            secrets_add (cfg, h->headers[2 * k + 1], strlen (h->headers[2 * k + 1]));
      secrets_add_url (cfg, h->proxy);
   }
}

/* Keys whose whole value is a secret: [admin] token, [handler] secret. */
static bool
config_is_secret (const char *key_name)
{
   return strcmp (key_name, "token") == 0 || strcmp (key_name, "secret") == 0;
}

/* ----------------------------------------------------------- masking */

/* The options of a MongoDB URI whose whole value is a secret, compared
 * case-insensitively after percent-decoding, as the driver reads keys. */
static const char *const mask_mongodb_options[] = {
   "tlsCertificateKeyFilePassword",
   "tlsCertificateKeyPassword",
   "sslClientCertificateKeyPassword",
   "sslPEMKeyPassword",
};

static int
hex_value (char c)
{
   if (c >= '0' && c <= '9')
      return c - '0';
   if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
   if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
   return -1;
}

/* True if the percent-decoded key s[0..len) equals `want` ignoring case. */
static bool
key_is (const char *s, size_t len, const char *want)
{
   size_t i = 0, w = 0;

   while (i < len) {
      int c = (unsigned char) s[i];

      if (c == '%' && i + 2 < len && hex_value (s[i + 1]) >= 0 && hex_value (s[i + 2]) >= 0) {
         c = hex_value (s[i + 1]) * 16 + hex_value (s[i + 2]);
         i += 3;
      } else {
         i++;
      }
      if (!want[w] || tolower (c) != tolower ((unsigned char) want[w]))
         return false;
      w++;
   }
   return want[w] == '\0';
}

/* Appends one query option "key=value" (or a bare "key") with its value
 * masked as the scheme requires. */
static void
mask_option (bson_string_t *out, const char *opt, size_t len, bool mongodb)
{
   const char *eq = memchr (opt, '=', len);
   size_t klen = eq ? (size_t) (eq - opt) : len;
   const char *v;
   size_t vlen;
   bool whole = !mongodb;

   if (!eq) {
      /* A bare word: for a webhook URL it may be the token itself. */
      char *copy = bson_strndup (opt, len);
      bson_string_append (out, mongodb ? copy : CONFIG_MASK);
      bson_free (copy);
      return;
   }
   {
      char *key = bson_strndup (opt, klen + 1);
      bson_string_append (out, key);
      bson_free (key);
   }
   v = eq + 1;
   vlen = len - klen - 1;
   for (size_t i = 0; mongodb && i < sizeof mask_mongodb_options / sizeof mask_mongodb_options[0]; i++)
      if (key_is (opt, klen, mask_mongodb_options[i]))
         whole = true;
   if (vlen == 0)
      return;
   if (mongodb && key_is (opt, klen, "authMechanismProperties")) {
      /* "NAME:value,NAME:value": the names stay, every value goes. */
      size_t i = 0;

      while (i <= vlen) {
         size_t end = i;
         const char *colon;

         while (end < vlen && v[end] != ',')
            end++;
         colon = memchr (v + i, ':', end - i);
         if (colon) {
            char *name = bson_strndup (v + i, (size_t) (colon - (v + i)) + 1);
            bson_string_append (out, name);
            bson_free (name);
         }
         bson_string_append (out, CONFIG_MASK);
         if (end < vlen)
            bson_string_append_c (out, ',');
         i = end + 1;
      }
      return;
   }
   if (whole) {
      bson_string_append (out, CONFIG_MASK);
   } else {
      char *copy = bson_strndup (v, vlen);
      bson_string_append (out, copy);
      bson_free (copy);
   }
}

/* Appends n bytes of s. */
static void
append_n (bson_string_t *out, const char *s, size_t n)
{
   char *copy = bson_strndup (s, n);
   bson_string_append (out, copy);
   bson_free (copy);
}

/* Appends the URL url[0..len) with its credentials masked; `scheme` points
 * at its "://".  A text cut to a length before the URL's '@' shows no
 * '@': its "user:pass" cannot be told from a "host:port" (nor a help
 * text's "host:port" from a password), so nothing is masked here, and
 * mask_secrets masks what is left of a configured password instead. */
static void
mask_url (bson_string_t *out, const char *url, size_t len, const char *scheme)
{
   const char *end = url + len;
   const char *auth = scheme + 3, *auth_end, *at = NULL, *q;
   size_t slen = (size_t) (scheme - url);
   bool mongodb = (slen == 7 && strncasecmp (url, "mongodb", 7) == 0) || (slen == 11 && strncasecmp (url, "mongodb+srv", 11) == 0);

   append_n (out, url, (size_t) (auth - url));
   /* Where the user information may end: a MongoDB URI's password may hold
    * an unescaped '/', so its authority runs to the query; for other URLs
    * it ends at the path (RFC 3986).  Masking too much is the safe side. */
   for (auth_end = auth; auth_end < end && !strchr (mongodb ? "?#" : "/?#", *auth_end); auth_end++)
      if (*auth_end == '@')
         at = auth_end;
   if (at) {
      const char *colon = memchr (auth, ':', (size_t) (at - auth));

      /* user:password@: the user stays.  A bare user information is a
       * token: all of it goes. */
      if (colon)
         append_n (out, auth, (size_t) (colon - auth) + 1);
      bson_string_append (out, CONFIG_MASK);
      auth = at;
   }
   for (q = auth; q < end && *q != '?' && *q != '#'; q++)
      ;
   append_n (out, auth, (size_t) (q - auth));
   if (q < end && *q == '?') {
      const char *p = q + 1;
      const char *qend = memchr (p, '#', (size_t) (end - p));

      if (!qend)
         qend = end;
      bson_string_append_c (out, '?');
      while (p < qend) {
         size_t n = 0;

         while (p + n < qend && p[n] != '&' && p[n] != ';')
            n++;
         if (n)
            mask_option (out, p, n, mongodb);
         p += n;
         if (p < qend) {
            bson_string_append_c (out, *p);
            p++;
         }
      }
      q = qend;
   }
   if (q < end && *q == '#')
      bson_string_append (out, q + 1 < end ? "#" CONFIG_MASK : "#");
}

/* Replaces in `text` (taken over) every secret of the snapshot in force
 * that it quotes verbatim; returns the result, which the caller frees.
 * The longest secrets first, so that a secret holding a shorter one is
 * masked whole. */
static char *
mask_secrets (char *text)
{
   config_t *cfg = config_acquire ();
   bool *done = NULL;

   if (!cfg || cfg->n_secrets == 0)
      goto done;
   done = bson_malloc0 (cfg->n_secrets * sizeof *done);
   for (;;) {
      size_t best = cfg->n_secrets, best_len = 0;
      bson_string_t *out;
      const char *p, *hit;

      for (size_t i = 0; i < cfg->n_secrets; i++) {
         size_t len = strlen (cfg->secrets[i]);
         if (!done[i] && len > best_len) {
            best = i;
            best_len = len;
         }
      }
      if (best == cfg->n_secrets)
         break;
      done[best] = true;
      if (!strstr (text, cfg->secrets[best]))
         continue;
      out = bson_string_new (NULL);
      for (p = text; (hit = strstr (p, cfg->secrets[best])); p = hit + best_len) {
         append_n (out, p, (size_t) (hit - p));
         bson_string_append (out, CONFIG_MASK);
      }
      bson_string_append (out, p);
      bson_zero_free (text, strlen (text) + 1);
      text = bson_string_free (out, false);
   }
   /* A text cut to a length may end within a secret: a tail that is the
    * secret's first CONFIG_SECRET_MIN_VERBATIM or more bytes goes too. */
   for (size_t i = 0; i < cfg->n_secrets; i++) {
      size_t n = strlen (text), len = strlen (cfg->secrets[i]);

      for (size_t k = len - 1; k >= CONFIG_SECRET_MIN_VERBATIM && k > 0; k--) {
         if (k <= n && memcmp (text + n - k, cfg->secrets[i], k) == 0) {
            bson_string_t *out = bson_string_new (NULL);

            append_n (out, text, n - k);
            bson_string_append (out, CONFIG_MASK);
            bson_zero_free (text, n + 1);
            text = bson_string_free (out, false);
            break;
         }
      }
   }

done:
   bson_free (done);
   config_release (cfg);
   return text;
}

char *
config_mask (const char *key_name, const char *value)
{
   static const char url_end[] = " \t\r\n\"'<>`";
   bson_string_t *out;
   const char *p, *scheme;

   if (!value)
      return NULL;
   if (key_name && *value && config_is_secret (key_name))
      return bson_strdup (CONFIG_MASK);
   /* Every URL in the value: it starts at its scheme and ends at the end
    * of a key's value, or in a message (no key; it may hold several) at
    * white space or a quote. */
   out = bson_string_new (NULL);
   p = value;
   while ((scheme = strstr (p, "://"))) {
      const char *start = scheme, *stop = scheme + 3;

      while (start > p && (isalnum ((unsigned char) start[-1]) || strchr ("+.-", start[-1])))
         start--;
      while (*stop && (key_name || !strchr (url_end, *stop)))
         stop++;
      append_n (out, p, (size_t) (start - p));
      if (start == scheme)
         append_n (out, scheme, (size_t) (stop - scheme)); /* no scheme: not a URL */
      else
         mask_url (out, start, (size_t) (stop - start), scheme);
      p = stop;
   }
   bson_string_append (out, p);
   if (!key_name)
      return mask_secrets (bson_string_free (out, false));
   return bson_string_free (out, false);
}

