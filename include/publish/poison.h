/*
 * publish/poison.h - transactions whose commit the proxy must refuse.
 *
 * Thread: any (one mutex inside; the forwarding loops call it).
 *
 * A transaction is "poisoned" when an annotated statement (or a
 * relaybusPublish) of it did not end with the statement and all its outbox
 * writes acknowledged: the upstream connection was lost after the statement
 * was sent, or an outbox write failed or got a reply the proxy did not
 * understand.  The server may then hold the business write without its
 * events, and only a commit could make that visible.  publish/txns.c records such
 * transactions here and, when a commitTransaction for one arrives on any
 * client connection of this process, publish/publish.c aborts it instead of
 * forwarding.
 *
 * A poison_table_t is a bounded map from (lsid id bytes, txnNumber) to why
 * and when the transaction was poisoned.  Entries expire after the table's
 * TTL (a transaction cannot outlive the server's
 * transactionLifetimeLimitSeconds).  A live entry is never evicted: a
 * forgotten entry would let its commit through, and a client could flush
 * the table on purpose with throwaway connections.  Instead, work that may
 * have to poison its transaction reserves a slot before it starts
 * (poison_table_reserve); when every slot is live or reserved the
 * reservation fails and the caller refuses that work until entries expire.
 * A reserved slot is turned into an entry by poison_table_add (reserved =
 * true) or handed back with poison_table_unreserve, so an add that holds a
 * reservation always finds room.  Thread-safe: one mutex around every
 * change and lookup, plus an atomic count that lets callers skip the lookup
 * (and the lock) while the table is empty, which is nearly always.
 *
 * The table knows nothing of connections or logging; time is passed in.
 */
#ifndef RELAYBUS_POISON_H
#define RELAYBUS_POISON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

/* A session id is a 16-byte UUID; anything up to this is accepted. */
#define POISON_LSID_ID_MAX 64
/* Reasons longer than this are truncated. */
#define POISON_REASON_MAX 200

/* The key of one transaction: the bytes of lsid.id and the txnNumber. */
typedef struct {
   uint8_t id[POISON_LSID_ID_MAX];
   uint32_t id_len;
   int64_t txn_number;
} poison_key_t;

/* Fills `key` from a command's lsid ({id: <binary>, ...}) and txnNumber
 * (int64 or int32).  False when either is missing, of another type, or the
 * id is longer than POISON_LSID_ID_MAX. */
bool poison_key_of (const bson_t *cmd, poison_key_t *key) __attribute__ ((warn_unused_result));

/* What one poisoned transaction is known by. */
typedef struct {
   poison_key_t key;
   int64_t recorded_ms; /* the caller's clock at poison_table_add */
   uint64_t conn_id;    /* the connection it happened on, for logs */
   char reason[POISON_REASON_MAX];
} poison_entry_t;

typedef struct poison_table poison_table_t;

/* A table of at most `capacity` (>= 1) entries that live `ttl_ms` (> 0).
 * The entries themselves are allocated at the first add or reservation.  Owned by the
 * caller; destroy accepts NULL.  Not for use after destroy by any thread. */
poison_table_t *poison_table_new (uint32_t capacity, int64_t ttl_ms);
void poison_table_destroy (poison_table_t *t);

typedef enum {
   POISON_ADDED = 0, /* a new entry */
   POISON_KNOWN,     /* already there (and live): the first reason is kept */
   POISON_FULL,      /* not recorded: every slot is live or reserved (only
                      * without a reservation; nothing was evicted) */
} poison_add_t;

/* Reserves one slot for work that may poison its transaction later, after
 * dropping what expired at `now_ms`.  False when every slot is live or
 * reserved: the caller must not start that work.  Each true answer is
 * matched by exactly one poison_table_add (.., true) or
 * poison_table_unreserve. */
bool poison_table_reserve (poison_table_t *t, int64_t now_ms) __attribute__ ((warn_unused_result));
void poison_table_unreserve (poison_table_t *t);

/* Records `key` as poisoned at `now_ms`.  With `reserved`, the caller's
 * reservation is consumed (whatever the answer) and the answer is never
 * POISON_FULL. */
poison_add_t poison_table_add (poison_table_t *t,
                               const poison_key_t *key,
                               uint64_t conn_id,
                               const char *reason,
                               int64_t now_ms,
                               bool reserved);

/* Is `key` poisoned at `now_ms`?  A true answer copies the entry into
 * `out` when non-NULL.  Expired entries are dropped on the way. */
bool poison_table_lookup (poison_table_t *t, const poison_key_t *key, int64_t now_ms, poison_entry_t *out);

/* Forgets `key` (the server confirmed the transaction aborted, so it can
 * no longer commit).  Returns whether it was there. */
bool poison_table_remove (poison_table_t *t, const poison_key_t *key);

/* Entries held, expired ones included until a call drops them.  Lock-free
 * (an acquire load): 0 means no lookup is needed. */
uint32_t poison_table_count (poison_table_t *t);

/* Slots reserved now (for tests and metrics; takes the lock). */
uint32_t poison_table_reserved (poison_table_t *t);
/* The table's capacity. */
uint32_t poison_table_capacity (const poison_table_t *t);

#endif /* RELAYBUS_POISON_H */
