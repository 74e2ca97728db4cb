/*
 * store/views.h - the outbox as the admin port sees it: per-handler
 * backlog, lanes and their owners, a paginated listing of deliveries, an
 * operator's bury, and whether setup has run.
 *
 * These sit beside store/store.h (whose store/ops.c holds requeue, purge,
 * statistics and listDeliveries) and use the same store instance; they are
 * the admin's additions, kept in their own file.  Like every store call
 * they block on mongoc: call them on the admin thread, never on the
 * forwarding loop.  Inputs that come from a request reach a query only as
 * UTF-8 strings, ObjectIds parsed from 24 hex characters, or integers.
 */
#ifndef RELAYBUS_STORE_VIEWS_H
#define RELAYBUS_STORE_VIEWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "store/store.h"

/* Deliveries of one handler, by state. */
typedef struct {
   char name[128];
   int64_t pending; /* ready and parked */
   int64_t parked;
   int64_t dead;
   int64_t oldest_due_at; /* ms, of its pending deliveries; 0: none */
} store_handler_stats_t;

/* One group by (handler, status, lane) over the deliveries.  `*out` is
 * allocated (bson_free) with `*n` entries, sorted by name. */
bool store_handler_stats (store_t *store, store_handler_stats_t **out, size_t *n, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Appends to `out` (an array) the lanes that have an owner:
 * {id, owner, leaseExpiresAt (ms), live, epoch, inFlight (count)}.
 * *leased counts lanes under a live lease at `now`; *held_local those of
 * them whose owner starts with `local_prefix` (may be NULL). */
bool store_list_lanes (store_t *store,
                       int64_t now,
                       const char *local_prefix,
                       bson_t *out,
                       int64_t *leased,
                       int64_t *held_local,
                       bson_error_t *error) __attribute__ ((warn_unused_result));

/* True when setup has run: the 256 lane documents exist. */
bool store_is_set_up (store_t *store, bool *ready, bson_error_t *error) __attribute__ ((warn_unused_result));

/* A page of deliveries in (createdAt, _id) order, after the position
 * (after_created, after_id) when after_id is non-NULL.  Filters as in
 * store_list_filter_t (strings; status NULL: pending and dead).  Appends
 * the documents to `out` (an array); *more tells whether another page
 * follows. */
bool store_list_page (store_t *store,
                      const store_list_filter_t *filter,
                      int64_t after_created,
                      const bson_oid_t *after_id,
                      bson_t *out,
                      bool *more,
                      bson_error_t *error) __attribute__ ((warn_unused_result));

/* An operator's bury: pending deliveries among `ids` (24 hex characters;
 * anything else matches nothing) that no lane lists in flight become dead
 * with `reason` as lastError; their claim generation moves on, so a lease
 * issued for them before can no longer settle them. */
bool store_bury_ids (store_t *store,
                     const char *const *ids,
                     size_t n,
                     int64_t now,
                     const char *reason,
                     size_t *n_buried,
                     bson_error_t *error) __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_STORE_VIEWS_H */
