/*
 * base/utf8.h - the one UTF-8 decoder: which bytes form a valid character, and
 * a copy of untrusted text that is always valid UTF-8.
 *
 * Thread: any (pure).
 *
 * Text from endpoints and from the store (written by anyone with access,
 * or by an older version) may be cut mid-character or not be UTF-8 at
 * all; BSON strings must be UTF-8 for the JSON encoder, and a log line
 * must not be split.  Pure functions, no allocation except utf8_repair.
 */
#ifndef RELAYBUS_UTF8_H
#define RELAYBUS_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* The length (1-4) of the valid UTF-8 character at s[0..len), or 0 when
 * the bytes there are not one (a stray continuation byte, an overlong
 * form, a surrogate, beyond U+10FFFF, or cut short by len). */
size_t utf8_char_len (const char *s, size_t len);

/* True if s[0..len) is valid UTF-8 without NUL bytes. */
bool utf8_valid (const char *s, size_t len);

/* Flags of utf8_sanitize. */
#define UTF8_CONTROLS_AS_SPACE 1 /* bytes below 0x20 and DEL become ' ' */

/* Copies in[0..in_len) to out as valid UTF-8, NUL-terminated: every byte
 * that starts no valid character (and a NUL) becomes U+FFFD.  At most
 * out_len - 1 bytes are written, cut before a character that would not
 * fit (never inside one).  Returns the length written. */
size_t utf8_sanitize (const char *in, size_t in_len, char *out, size_t out_len, int flags);

/* A copy of s[0..len) made valid with utf8_sanitize (no length limit);
 * the caller frees it with bson_free. */
char *utf8_repair (const char *s, size_t len);

#endif /* RELAYBUS_UTF8_H */
