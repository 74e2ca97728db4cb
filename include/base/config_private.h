/*
 * base/config_private.h - what the two files of the configuration module
 * share: base/config.c (parsing, validation, snapshots) and
 * base/config_mask.c (the secrets a snapshot holds, and masking).
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

#endif /* RELAYBUS_BASE_CONFIG_PRIVATE_H */
