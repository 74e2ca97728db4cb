/*
 * store/attempts.h - what happened to a delivery and to an event: the
 * admin port's reads of <prefix>attempts beside the deliveries, the
 * completion records and the events (docs/admin.md: GET
 * /api/deliveries/ID/attempts, GET /api/events/ID, GET /api/attempts).
 * Thread: the admin thread (blocking mongoc calls, never the forwarding
 * loop).
 *
 * The records themselves are written by the settling calls (store/
 * store.h, store_attempt_t; store/attempts.c).  Every input reaches a
 * query as a string, an ObjectId or an integer, never as a document.
 */
#ifndef RELAYBUS_STORE_ATTEMPTS_H
#define RELAYBUS_STORE_ATTEMPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "store/store.h"

/* Attempt records one read returns at most. */
#define STORE_ATTEMPTS_LIMIT_MAX 1000

/* A delivery and its attempts (GET /api/deliveries/ID/attempts). */
typedef struct {
   bool found;        /* the delivery, its completion record or one of its attempts exists */
   bson_t delivery;   /* its document or completion record; empty when neither is left */
   const char *state; /* "pending", "running", "dead", "completed", or "unknown" (neither document is left and no attempt succeeded) */
   bson_t attempts;   /* array: its records in the order they ended (endedAt, _id) */
   bool more;         /* more than the limit exist */
} store_delivery_history_t;

/* Reads delivery `id` (deliveries, then completion records) and up to
 * `limit` (1 to STORE_ATTEMPTS_LIMIT_MAX) of its attempts into `out`,
 * which the caller clears with store_delivery_history_clear. */
bool store_delivery_history (store_t *store, const bson_oid_t *id, int64_t limit, store_delivery_history_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
void store_delivery_history_clear (store_delivery_history_t *h);

/* An event, its deliveries and their attempts (GET /api/events/ID). */
typedef struct {
   bool found;         /* the event, one of its deliveries or one of its attempts exists */
   bson_t event;       /* the event document; empty once purged */
   bson_t deliveries;  /* array: its deliveries and completion records, each with "state" (as above) */
   bson_t attempts;    /* array: the records of its deliveries, in the order they ended */
   bool more;          /* more attempts than STORE_ATTEMPTS_LIMIT_MAX exist */
} store_event_history_t;

bool store_event_history (store_t *store, const char *event_id, store_event_history_t *out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
void store_event_history_clear (store_event_history_t *h);

/* GET /api/attempts: the latest attempts first (endedAt, _id descending),
 * at most `limit` (1 to STORE_ATTEMPTS_LIMIT_MAX), of `handler` (NULL:
 * all) with `outcome` (NULL: any) that ended at or after `since` (ms; 0:
 * any), before the position (before_ended, before_id) when before_id is
 * non-NULL.  Appended to `out` (an array); *more: another page follows. */
typedef struct {
   const char *handler;
   const char *outcome;
   int64_t since;
   int64_t limit;
   int64_t before_ended;
   const bson_oid_t *before_id;
} store_attempts_filter_t;

bool store_attempts_list (store_t *store, const store_attempts_filter_t *filter, bson_t *out, bool *more, bson_error_t *error)
   __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_STORE_ATTEMPTS_H */
