/*
 * dispatch/fleet.h - the dispatcher's part in the fleet's handler set:
 * recording this instance's handlers with a heartbeat, refreshing the
 * snapshot injection uses, backfilling a handler new to the fleet, and
 * retiring handlers no live instance declares (docs/handlers.md, "One
 * handler set for the fleet").
 *
 * Thread: the dispatcher's (blocking store calls).
 */
#ifndef RELAYBUS_DISPATCH_FLEET_H
#define RELAYBUS_DISPATCH_FLEET_H

#include <stdbool.h>
#include <stdint.h>

#include "base/config.h"
#include "base/counters.h"
#include "store/store.h"

typedef struct dispatch_fleet dispatch_fleet_t;

/* `store` is borrowed (it must outlive the object); `owner` is copied: the
 * instance id of the documents.  Destroy accepts NULL. */
dispatch_fleet_t *dispatch_fleet_new (store_t *store, const char *owner);
void dispatch_fleet_destroy (dispatch_fleet_t *fleet);

/* One heartbeat with the current configuration: record, read, publish the
 * snapshot, run the backfills in progress, and a retirement pass when one
 * is due.  *released: a held handler may be claimed now.  Returns true
 * when the next heartbeat should run at once (the first one that started
 * backfills records their ends without waiting). */
bool dispatch_fleet_beat (dispatch_fleet_t *fleet, const config_t *cfg, int64_t now, bool *released);

/* True while `handler`'s deliveries must not be claimed: it is being
 * backfilled, here or by another instance that declared it first; it is
 * disabled in the outbox; or the disabled handlers were not read yet. */
bool dispatch_fleet_holds (const dispatch_fleet_t *fleet, const char *handler);

/* Whether `handler` is disabled in the outbox (as the last heartbeat read
 * it, or this instance disabled it since). */
bool dispatch_fleet_disabled (const dispatch_fleet_t *fleet, const char *handler);

/* Disables `handler` in the outbox for `reason` ("410", "failing since
 * ..."), counted under `why` and logged when this call changed it; held
 * here at once.  False (logged) when the write failed. */
bool dispatch_fleet_disable (dispatch_fleet_t *fleet, const char *handler, counters_state_t why, const char *reason, int64_t now);

/* At a clean stop: records stoppedAt and hands the retirement lease back. */
void dispatch_fleet_stop (dispatch_fleet_t *fleet, int64_t now);

#endif /* RELAYBUS_DISPATCH_FLEET_H */
