/*
 * base/config_private.h - what the files of the configuration module
 * share: base/config.c (the key table, parsing, validation, snapshots),
 * base/config_handler.c (a [handler NAME] section's pairs and checks),
 * base/config_mask.c (the secrets a snapshot holds, and masking),
 * base/config_secret.c (secrets outside the file) and
 * base/config_upstream.c (what the upstream URI says).
 *
 * Thread: the thread that parses a configuration (the main thread, at
 * start and at reload); nothing else includes it.
 */
#ifndef RELAYBUS_BASE_CONFIG_PRIVATE_H
#define RELAYBUS_BASE_CONFIG_PRIVATE_H

#include "base/config.h"

/* What a masked value or part of one reads as. */
#define CONFIG_MASK "********"

/* Fills cfg->secrets from the validated snapshot: what config_mask masks
 * in free text while that snapshot is the current one. */
void config_collect_secrets (config_t *cfg);

/* The checks of the higher layers config_set_checks installed (each NULL
 * when not installed). */
const config_checks_t *config_checks_installed (void);

/* Fills `error` with "origin:line: message" (line 0: "origin: message"). */
void config_error (bson_error_t *error, const char *origin, int line, const char *fmt, ...)
   __attribute__ ((format (printf, 4, 5)));

/* A duration: digits and one unit, "7d", "10m", "2s", "500ms"; on failure
 * `*why` says what is wrong. */
bool config_parse_duration (const char *v, int64_t *out, char *why, size_t why_len);

/* 1 to `max` letters and digits, or characters of `extra`. */
bool config_valid_name (const char *s, size_t max, const char *extra);

/* The items of a list value, which the list setter left without blanks
 * or empty items: how many there are, and the next one (false after the
 * last; `*p` moves past it). */
size_t config_list_count (const char *p);
bool config_list_next (const char **p, const char **item, size_t *len);

/* base/config.c: the key of `section` named `name`, or NULL. */
const config_key_t *config_find_key (config_section_t section, const char *name);

/* base/config_upstream.c: reads [proxy] upstream (a URI) into the
 * snapshot's upstream_tls and upstream_auth, and checks pool_mode against
 * them (and loads the auth file of pooled mode); false with `error` naming
 * the key. */
bool config_read_upstream (config_t *cfg, const char *origin, bson_error_t *error) __attribute__ ((warn_unused_result));

/* base/config_secret.c: expands the ${NAME} references of `in` into `out`
 * (false with `*why`: an unset variable, a bad name, too long). */
bool config_expand (const char *in, char *out, size_t out_len, char *why, size_t why_len);
/* base/config_secret.c: reads the secret a _file key names (`path`, taken
 * from the folder of `origin` when relative): the whole file, one trailing
 * newline removed; it must hold one line. */
bool config_read_secret_file (const char *origin, const char *path, char *out, size_t out_len, char *why, size_t why_len);
/* base/config_secret.c: the key a file-form key is the file of ("upstream"
 * for "upstream_file"); the file form of `key`, or NULL when it has none. */
const config_key_t *config_file_base (const config_key_t *file_key);
const config_key_t *config_file_form (const config_key_t *key);
/* base/config_secret.c: marks the snapshot as holding a credential written
 * in the file when `value` of the secret-bearing key `name` has one. */
void config_note_inline_secret (config_t *cfg, const char *name, const char *value);

/* base/config_handler.c: a handler's kafka.<name> and header.<name> lines
 * (false with `*why` on a bad name, a name set twice or one too many),
 * and the checks of its whole section, which also fill what follows from
 * its keys (kind_id, format_id, json_id, retry delays, event patterns). */
bool config_add_kafka_prop (config_handler_t *h, const char *name, const char *value, char *why, size_t why_len);
bool config_add_header (config_handler_t *h, const char *name, const char *value, char *why, size_t why_len);
bool config_validate_handler (config_handler_t *h, const char *origin, bson_error_t *error);

#endif /* RELAYBUS_BASE_CONFIG_PRIVATE_H */
