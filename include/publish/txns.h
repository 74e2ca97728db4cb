/*
 * publish/txns.h - transaction slots and the poison policy.
 *
 * Thread: any forwarding loop (txns_poison_entries: any).  Both tables are
 * process-wide, since a commit may come on any loop's connection: the
 * injected-into slots behind a mutex of their own, the poisoned table
 * behind publish/poison.h's short mutex.
 *
 * The transactions the publishing path remembers: those it injected into
 * (so that their commit wakes the dispatcher) and those it poisoned (so
 * that their commit is refused).
 *
 * Injected into: a direct-mapped table of TXNS_SLOTS (lsid, txnNumber)
 * pairs.  A collision forgets the older transaction, which only costs its
 * wake-up: its events go out at the dispatcher's next poll.
 *
 * Poisoned: the policy of publish/publish.c's header comment.  Work that may
 * poison its transaction reserves a slot first (txns_poison_reserve) and
 * either turns it into an entry (txns_poison) or hands it back
 * (txns_poison_unreserve).  The table is created at the first reservation
 * with the capacity of that moment's configuration ([outbox]
 * max_poisoned_transactions, a restart-only key) and lives until exit.
 * Entries age by the monotonic clock: a wall-clock step neither keeps a
 * transaction poisoned for ever nor forgets it early.
 */
#ifndef RELAYBUS_PUBLISH_TXNS_H
#define RELAYBUS_PUBLISH_TXNS_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/config.h"
#include "base/log.h"
#include "publish/poison.h"

/* Transactions remembered for the wake-up at commit, process-wide. */
#define TXNS_SLOTS 1024
/* How long a poisoned transaction is remembered: well past MongoDB's
 * default transactionLifetimeLimitSeconds (60 s), after which the server
 * has aborted the transaction itself. */
#define TXNS_POISON_TTL_MS (10 * 60 * 1000)
/* Room for txns_lsid_hex: 16 bytes of the session id in hex. */
#define TXNS_LSID_HEX_MAX 33

/* Appends the command's lsid and txnNumber (only those: the body may be
 * megabytes) to `out`, which is all the functions below read. */
void txns_key_copy (const bson_t *cmd, bson_t *out);

/* Remembers the transaction of `cmd` (lsid and txnNumber) as injected
 * into; a command without them is ignored. */
void txns_remember (const bson_t *cmd);

/* Was the transaction of `cmd` injected into (and not forgotten since)?
 * With `forget`, a true answer also forgets it. */
bool txns_injected (const bson_t *cmd, bool forget);

/* Reserves a slot of the poisoned table (created now, with `cfg`'s
 * max_poisoned_transactions, if this is the first reservation).  False when
 * every slot is live or reserved: the caller must refuse the work; its
 * `capacity` is then filled for the error message. */
bool txns_poison_reserve (const config_t *cfg, uint32_t *capacity) __attribute__ ((warn_unused_result));

/* Hands back a reservation that did not turn into an entry. */
void txns_poison_unreserve (void);

/* Records the transaction of `txn_cmd` (txns_key_copy's fields) as
 * poisoned, consuming the caller's reservation when `*reserved` (which is
 * then cleared), and logs it with connection `conn_id`/`peer` at `level`.
 * `fmt` says what went wrong; it is quoted, cut to valid UTF-8, in the
 * error a refused commit gets.  True when a new entry was recorded (the
 * caller counts it); false when the transaction was already poisoned, has
 * no binary session id (nothing the server could commit), or could not be
 * recorded (only without a reservation). */
bool txns_poison (const bson_t *txn_cmd,
                  bool *reserved,
                  uint64_t conn_id,
                  const char *peer,
                  log_level_t level,
                  const char *fmt,
                  ...) __attribute__ ((format (printf, 6, 7)));

/* Is the commitTransaction `cmd` for a poisoned transaction?  True copies
 * the entry to `out`.  While nothing was ever poisoned, or the table is
 * empty, this costs two atomic loads and takes no lock. */
bool txns_poisoned (const bson_t *cmd, poison_entry_t *out);

/* Forgets a poisoned transaction once the server confirmed its abort (it
 * refuses any commit itself then).  Returns whether it was there. */
bool txns_poison_forget (const poison_key_t *key);

/* Did this abortTransaction reply prove the transaction can no longer
 * commit?  ok: aborted now; NoSuchTransaction: it was already. */
bool txns_abort_confirmed (const bson_t *reply);

/* Poisoned entries held now (expired ones until a call drops them). */
uint32_t txns_poison_entries (void);

/* The session id of `key` in hex (at most 16 bytes of it), to tie log
 * lines together. */
void txns_lsid_hex (const poison_key_t *key, char out[TXNS_LSID_HEX_MAX]);

#endif /* RELAYBUS_PUBLISH_TXNS_H */
