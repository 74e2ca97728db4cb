/*
 * base/authfile.h - the auth file: the users a proxy that authenticates
 * clients itself knows, as SCRAM stored keys, never passwords.
 *
 * Thread: any.  authfile_load reads a file (call it at start-up or from a
 * worker, never on the forwarding loop); everything else is pure.
 *
 * Format (docs/configuration.md, "Auth file"): one entry a line,
 *
 *   NAME:MECHANISM:ITERATIONS:SALT:STOREDKEY:SERVERKEY
 *
 * with MECHANISM SCRAM-SHA-256 or SCRAM-SHA-1, the last three fields in
 * base64.  A user has one line per mechanism it may use.  The name is
 * everything before the last five colons, so it may itself hold colons.
 * Blank lines and lines whose first non-blank character is '#' are
 * comments.  Every error names the line.  This module validates and holds
 * the keys; codec/scram.h runs the conversation with them and derives them
 * from a password.
 */
#ifndef RELAYBUS_AUTHFILE_H
#define RELAYBUS_AUTHFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <bson/bson.h>

#include "base/errors.h"

/* Error codes in AUTHFILE_ERROR_DOMAIN. */
typedef enum {
   AUTHFILE_ERR_IO = 1,      /* the file cannot be opened or read */
   AUTHFILE_ERR_PERMISSIONS, /* the file is readable or writable by others */
   AUTHFILE_ERR_SYNTAX,      /* a line is not a valid entry (message names it) */
   AUTHFILE_ERR_DUPLICATE,   /* the same user and mechanism twice */
   AUTHFILE_ERR_LIMIT,       /* too many entries, a line or the file too long */
   AUTHFILE_ERR_NAME,        /* a user name the file cannot hold */
   AUTHFILE_ERR_PASSWORD,    /* an empty or unreadable password */
} authfile_error_code_t;

/* Bounds: every buffer here is fixed or bounded by these. */
#define AUTHFILE_MAX_NAME 256        /* bytes of a user name */
#define AUTHFILE_MAX_LINE 1024       /* bytes of one line, without its newline */
#define AUTHFILE_MAX_ENTRIES 100000  /* lines holding an entry */
#define AUTHFILE_MAX_SALT 64         /* bytes of a decoded salt */
#define AUTHFILE_MAX_PASSWORD 1024   /* bytes of a password read by --make-user */
#define AUTHFILE_MIN_ITERATIONS 4096 /* RFC 7677; drivers refuse fewer */
#define AUTHFILE_MAX_ITERATIONS 10000000
#define AUTHFILE_KEY_MAX 32 /* the SHA-256 digest; SHA-1 keys use 20 */

/* The SCRAM mechanisms; values index authfile_user_t.keys. */
typedef enum {
   AUTHFILE_SCRAM_SHA_1 = 0,
   AUTHFILE_SCRAM_SHA_256 = 1,
   AUTHFILE_N_MECHS = 2,
} authfile_mech_t;

/* One mechanism's stored entry (RFC 5802 section 3). */
typedef struct {
   bool present;        /* the file has a line for this mechanism */
   uint32_t iterations; /* PBKDF2 iteration count */
   size_t salt_len;
   uint8_t salt[AUTHFILE_MAX_SALT];
   uint8_t stored_key[AUTHFILE_KEY_MAX]; /* H(ClientKey); authfile_key_len bytes */
   uint8_t server_key[AUTHFILE_KEY_MAX]; /* HMAC(SaltedPassword, "Server Key") */
} authfile_key_t;

/* A user: its name and an entry per mechanism (absent ones not present). */
typedef struct {
   char name[AUTHFILE_MAX_NAME + 1];
   authfile_key_t keys[AUTHFILE_N_MECHS];
   unsigned line[AUTHFILE_N_MECHS]; /* where each entry came from (1-based) */
} authfile_user_t;

/* The loaded users, sorted by name.  Owned by the caller of
 * authfile_parse/authfile_load; free with authfile_destroy. */
typedef struct authfile authfile_t;

/* "SCRAM-SHA-1" / "SCRAM-SHA-256". */
const char *authfile_mech_name (authfile_mech_t mech);
/* The mechanism of a name such as "SCRAM-SHA-256"; false for others. */
bool authfile_mech_from_name (const char *name, size_t len, authfile_mech_t *out);
/* 20 for SCRAM-SHA-1, 32 for SCRAM-SHA-256: the digest, key and proof length. */
size_t authfile_key_len (authfile_mech_t mech);

/* Parses text[0..len) (the file's contents).  `source` names it in errors
 * ("users.auth:3: ..."). */
authfile_t *authfile_parse (const char *text, size_t len, const char *source, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Reads and parses the file at `path`.  Refuses a file that others (not
 * the owner or its group) may read or write: it holds keys that let
 * anyone who also sees one exchange impersonate a client. */
authfile_t *authfile_load (const char *path, bson_error_t *error) __attribute__ ((warn_unused_result));

void authfile_destroy (authfile_t *users);

/* The user named name[0..len), or NULL.  O(log n). */
const authfile_user_t *authfile_lookup (const authfile_t *users, const char *name, size_t len);
size_t authfile_count (const authfile_t *users);
/* The i-th user in name order (i < authfile_count). */
const authfile_user_t *authfile_user_at (const authfile_t *users, size_t i);

/* True if `name` can be stored: valid UTF-8, 1..AUTHFILE_MAX_NAME bytes,
 * no control characters, not starting with a blank or '#'. */
bool authfile_name_valid (const char *name, bson_error_t *error) __attribute__ ((warn_unused_result));

/* The user's present entries as lines of the file, each ending in '\n';
 * free with bson_free. */
char *authfile_format_user (const authfile_user_t *user);

/* Reads one line (the password of --make-user) from `in` into buf, without
 * its newline; with echo off when `in` is a terminal.  Refuses an empty
 * line and one longer than AUTHFILE_MAX_PASSWORD.  buf holds at least
 * AUTHFILE_MAX_PASSWORD + 2 bytes; the caller clears it after use. */
bool authfile_read_password (FILE *in, char *buf, size_t buf_len, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Base64 (RFC 4648, with padding), as the file and SCRAM messages use it.
 * Encoding writes a NUL-terminated string of 4 * ceil(len / 3) characters
 * into out (out_len must hold that plus one) and returns its length.
 * Decoding is strict (length a multiple of 4, padding only at the end, no
 * whitespace) and returns false for anything else or when the result
 * would exceed out_len. */
size_t authfile_b64_encode (const uint8_t *in, size_t len, char *out, size_t out_len);
bool authfile_b64_decode (const char *in, size_t len, uint8_t *out, size_t out_len, size_t *written);

#endif /* RELAYBUS_AUTHFILE_H */
