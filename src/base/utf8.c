/*
 * base/utf8.c - UTF-8 validation and repair (see base/utf8.h).
 *
 * The rules are those of RFC 3629 (the ones libbson's validator applies):
 * shortest form only, no surrogates, nothing above U+10FFFF.  Repair
 * replaces each offending byte with U+FFFD, so the result is never longer
 * than three times the input.
 */
#include "base/utf8.h"

#include <stdint.h>
#include <string.h>

#include <bson/bson.h>

static const char replacement[] = "\xef\xbf\xbd"; /* U+FFFD */

size_t
utf8_char_len (const char *str, size_t len)
{
   const unsigned char *s = (const unsigned char *) str;
   size_t n;
   uint32_t cp;

   if (len == 0)
      return 0;
   if (s[0] < 0x80)
      return 1;
   if (s[0] >= 0xc2 && s[0] <= 0xdf) {
      n = 2;
      cp = s[0] & 0x1f;
   } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
      n = 3;
      cp = s[0] & 0x0f;
   } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
      n = 4;
      cp = s[0] & 0x07;
   } else {
      return 0;
   }
   if (len < n)
      return 0;
   for (size_t i = 1; i < n; i++) {
      if ((s[i] & 0xc0) != 0x80)
         return 0;
      cp = (cp << 6) | (s[i] & 0x3f);
   }
   if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
      return 0;
   return n;
}

bool
utf8_valid (const char *s, size_t len)
{
   size_t i = 0;

   while (i < len) {
      size_t n = utf8_char_len (s + i, len - i);
      if (n == 0 || s[i] == '\0')
         return false;
      i += n;
   }
   return true;
}

size_t
utf8_sanitize (const char *in, size_t in_len, char *out, size_t out_len, int flags)
{
   size_t i = 0, o = 0;

   if (out_len == 0)
      return 0;
   while (i < in_len) {
      size_t n = utf8_char_len (in + i, in_len - i);
      const char *src = in + i;
      size_t w = n;
      char c;

      if (n == 0 || in[i] == '\0') {
         src = replacement;
         w = 3;
         n = 1;
      } else if (n == 1 && (flags & UTF8_CONTROLS_AS_SPACE) && ((unsigned char) in[i] < 0x20 || in[i] == 0x7f)) {
         c = ' ';
         src = &c;
      }
      if (o + w >= out_len)
         break;
      memcpy (out + o, src, w);
      o += w;
      i += n;
   }
   out[o] = '\0';
   return o;
}

char *
utf8_repair (const char *s, size_t len)
{
   size_t cap = len * 3 + 1;
   char *out = bson_malloc (cap);

   utf8_sanitize (s, len, out, cap, 0);
   return out;
}
