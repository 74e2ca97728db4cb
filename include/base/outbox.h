/*
 * base/outbox.h - names and small pure functions shared by every part that
 * touches the outbox collections: publishing (the forwarding loop), the
 * store and dispatcher, the admin port and the tests.
 *
 * Thread: any (pure).
 *
 * The documents themselves are described in docs/outbox-schema.md; this
 * module holds what must agree byte for byte between writers and readers:
 * collection names, the lane hash, the lane spaces and the lease token
 * format.
 */
#ifndef RELAYBUS_OUTBOX_H
#define RELAYBUS_OUTBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#define OUTBOX_LANES 256
#define OUTBOX_NAME_MAX 160 /* prefix (64) + longest suffix, with room */

/* The field names of the outbox documents (docs/outbox-schema.md), written
 * once: every writer and reader of a field uses its name here. */
#define OUTBOX_F_LANE_ID             "laneId"
#define OUTBOX_F_IN_FLIGHT           "inFlight"
#define OUTBOX_F_EPOCH               "epoch"
#define OUTBOX_F_CLAIMS              "claims"
#define OUTBOX_F_DUE_AT              "dueAt"
#define OUTBOX_F_LOST_AT             "lostAt"
#define OUTBOX_F_LOST_EPOCHS         "lostEpochs"
#define OUTBOX_F_LEASE_EXPIRES_AT    "leaseExpiresAt"
#define OUTBOX_F_LAST_ERROR          "lastError"
#define OUTBOX_F_EVENT_ID            "eventId"
#define OUTBOX_F_EVENT_TYPE          "eventType"
#define OUTBOX_F_ATTEMPTS            "attempts"
#define OUTBOX_F_COMPLETED_AT        "completedAt"
#define OUTBOX_F_CREATED_AT          "createdAt"
#define OUTBOX_F_UPDATED_AT          "updatedAt"
#define OUTBOX_F_HEARTBEAT_AT        "heartbeatAt"
#define OUTBOX_F_NOT_BEFORE          "notBefore"
#define OUTBOX_F_CORRELATION_ID      "correlationId"
#define OUTBOX_F_CAUSATION_ID        "causationId"
#define OUTBOX_F_STARTED_AT          "startedAt"
#define OUTBOX_F_STOPPED_AT          "stoppedAt"
#define OUTBOX_F_DISABLED_AT         "disabledAt"
#define OUTBOX_F_OPERATOR_WRITES     "operatorWrites"
/* <prefix>attempts (docs/outbox-schema.md, "attempts") */
#define OUTBOX_F_DELIVERY_ID         "deliveryId"
#define OUTBOX_F_ATTEMPT             "attempt"
#define OUTBOX_F_INSTANCE            "instance"
#define OUTBOX_F_ENDED_AT            "endedAt"
#define OUTBOX_F_DURATION_MS         "durationMs"
#define OUTBOX_F_OUTCOME             "outcome"
#define OUTBOX_F_STATUS_CODE         "status"
#define OUTBOX_F_ERROR               "error"
#define OUTBOX_F_RESPONSE            "response"

typedef enum {
   OUTBOX_EVENTS,
   OUTBOX_DELIVERIES,
   OUTBOX_KEY_SEQUENCES,
   OUTBOX_LANES_COLL,
   OUTBOX_COMPLETED,
   OUTBOX_HANDLERS, /* the fleet's handler sets: one document per proxy instance */
   OUTBOX_HANDLER_STATES, /* disabled handlers: one document per disabled handler */
   OUTBOX_ATTEMPTS,       /* every attempt of every delivery, with a TTL ([outbox] attempt_history) */
   OUTBOX_N_COLLECTIONS,
} outbox_collection_t;

/* How an attempt of a delivery ended: the `outcome` of its record in
 * <prefix>attempts, and the outcome label of the attempt-duration
 * histogram. */
typedef enum {
   OUTBOX_ATTEMPT_SUCCEEDED = 0, /* completed: a 2xx, the broker's confirmation, a consumer's relaybusComplete */
   OUTBOX_ATTEMPT_FAILED,        /* an answer that is not a 2xx, a connection error, a consumer's retry or bury */
   OUTBOX_ATTEMPT_TIMED_OUT,     /* no answer or confirmation within timeout_ms */
   OUTBOX_ATTEMPT_LEASE_LOST,    /* its claim was lost: taken over, abandoned, or the consumer's connection closed */
   OUTBOX_ATTEMPT_REFUSED,       /* the broker refused the message (a nack, unroutable, no stream, a broker error) */
   OUTBOX_ATTEMPT_RELEASED,      /* given back uncharged (410 Gone, a stop, a consumer's relaybusRelease) */
   OUTBOX_ATTEMPT_BURIED,        /* buried by an operator (POST /api/deliveries/bury) */
   OUTBOX_ATTEMPT_OUTCOMES,
} outbox_attempt_outcome_t;

/* "succeeded", "failed", "timed_out", "lease_lost", "refused",
 * "released", "buried"; NULL out of range. */
const char *outbox_attempt_outcome_name (outbox_attempt_outcome_t o);
/* The outcome named `name`; false when none is. */
bool outbox_attempt_outcome_parse (const char *name, outbox_attempt_outcome_t *out);

/* A webhook attempt's record keeps at most this many bytes of the
 * answer's body (cut at a character). */
#define OUTBOX_ATTEMPT_RESPONSE_MAX 512

/* The suffix of a collection ("events", "deliveries", ...). */
const char *outbox_collection_suffix (outbox_collection_t c);

/* Writes "<prefix><suffix>" into out; false if it does not fit. */
bool outbox_collection_name (const char *prefix, outbox_collection_t c, char *out, size_t out_len)
   __attribute__ ((warn_unused_result));

/* 32-bit FNV-1a of the bytes. */
uint32_t outbox_fnv1a (const void *data, size_t len);

/* The lane of a delivery: FNV-1a of the UTF-8 key, or of the event id when
 * the event has no key (key NULL), modulo 256. */
uint32_t outbox_lane_id (const char *key, const char *event_id);

/* The lane spaces.  A lane space is 256 lane documents; lane n of space
 * S is the document with _id S * 256 + n, and a delivery's laneId (0..255)
 * is its lane number in whichever space fences it.  Each dispatched
 * handler (webhook, kafka, nats, rabbitmq) is claimed in a space of its
 * own, derived from its name (outbox_lane_space_of), so a lane one
 * handler's claimer holds, on any proxy, never keeps another handler's
 * deliveries waiting.  The consumer thread claims the pull handlers in
 * the pull space.  One key's deliveries of one handler are always claimed
 * in one space, so the per-key order holds.  Two handler names that hash
 * to one space share its lanes (as every handler shared the dispatch
 * space before): correct, only not independent. */
typedef enum {
   OUTBOX_LANE_SPACE_DISPATCH = 0, /* the lane documents of the first version: _id 0..255 (no claimer since handler spaces) */
   OUTBOX_LANE_SPACE_PULL,         /* _id 256..511 */
   OUTBOX_LANE_SPACES,             /* the fixed spaces; handler spaces follow */
} outbox_lane_space_t;

/* The handler spaces: OUTBOX_LANE_SPACES up to OUTBOX_LANE_SPACE_MAX - 1,
 * so every lane document _id fits an Int32. */
#define OUTBOX_LANE_SPACE_MAX ((uint32_t) (INT32_MAX / OUTBOX_LANES))

/* The lane documents of the fixed spaces (set-up creates them; a handler
 * space's are created by the first claimer of that handler). */
#define OUTBOX_LANE_DOCS (OUTBOX_LANES * OUTBOX_LANE_SPACES)

/* The _id of lane `lane` (< 256) of a space (< OUTBOX_LANE_SPACE_MAX). */
int32_t outbox_lane_doc_id (uint32_t space, uint32_t lane);
/* The space of a lane document _id (negative ids, the leases', give -1). */
int64_t outbox_lane_space_of_doc (int64_t doc_id);
/* The lane space of dispatched handler `handler`: 32-bit FNV-1a of the
 * name into the handler spaces. */
uint32_t outbox_lane_space_of (const char *handler);
/* "dispatch", "pull" or "handler". */
const char *outbox_lane_space_name (uint32_t space);

/* Lease tokens: "<laneId>:<epoch>:<claims>"; laneId is the lane number
 * (0..255), in the space of the claimer that issued the token. */
typedef struct {
   uint32_t lane_id;
   int64_t epoch;
   int32_t claims;
} outbox_lease_t;

#define OUTBOX_LEASE_TOKEN_MAX 48
void outbox_lease_format (const outbox_lease_t *lease, char out[OUTBOX_LEASE_TOKEN_MAX]);
/* Strict: decimal fields, lane < 256, epoch >= 1, claims >= 0, nothing else.
 * A token that could not have been issued is refused without a database call. */
bool outbox_lease_parse (const char *token, outbox_lease_t *out) __attribute__ ((warn_unused_result));

/* The completion fence, the one rule by which a completion may end the
 * claim of delivery `id` under `lease`: the store's (store/complete) and
 * the one a pull consumer's transaction applies (publish/pulltxn), each to
 * the documents its own reads returned.  It holds when the delivery
 * document is still pending, in the lease's lane (laneId) at the lease's
 * claim generation (claims; a missing one reads as 0), for `handler`
 * (NULL: not compared), and the lane document is at the lease's epoch and
 * lists the delivery in inFlight.  A missing document never holds. */
bool outbox_lease_holds (const outbox_lease_t *lease,
                         const bson_oid_t *id,
                         const char *handler,
                         const bson_t *delivery,
                         const bson_t *lane);

#endif /* RELAYBUS_OUTBOX_H */
