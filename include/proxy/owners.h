/*
 * proxy/owners.h - whose cursors and sessions they are, in pooled mode.
 *
 * Thread: forwarding loops (the tables are process-wide, striped under
 * mutexes: a driver's connections, and so its sessions and cursors, are
 * spread over the loops).
 *
 * In pooled mode every client's commands reach the server as the pool's
 * one login, so the server cannot tell the proxy's users apart: any of
 * them could read from another's cursor, run in another's session and
 * transaction, or end them, by naming their ids.  When clients log in to
 * the proxy (auth_file), the proxy keeps what mongod keeps per user, in
 * one table of owners: the sessions (lsid) each user sent, and the
 * cursors the replies to each user's commands opened.  One check
 * (owners_check) then refuses, with 13 Unauthorized and mongod's wording,
 * a request that names what is not its user's:
 *
 *  - any command with an lsid of a session another user sent first (so
 *    its transaction: statements, commitTransaction, abortTransaction); a
 *    session nobody sent yet becomes the user's;
 *  - getMore and killCursors of a cursor the user's commands did not open;
 *  - killSessions and endSessions naming a session of another user, and
 *    killSessions without ids;
 *  - killOp: no operation on the server is any proxy user's (they all run
 *    as the pool's login), so it is always refused;
 *  - what acts on or lists every user's sessions or operations:
 *    killAllSessions, killAllSessionsByPattern, currentOp, an aggregate
 *    whose first stage is $currentOp, $listLocalSessions or $listSessions,
 *    and commands on config.system.sessions and config.transactions.
 *
 * pool_admit runs the check on the request's peek before it borrows a
 * connection, so a refused request never takes one (nor waits for one).
 *
 * Without an auth file every client is the same (unnamed) user, as with a
 * mongod without --auth, and nothing is checked.  The table is bounded
 * (OWNERS_ENTRIES); entries expire as the server's would (a session unused
 * for 30 minutes, a cursor for 10).  A full neighbourhood gives up its
 * least recently used cursor (that cursor can then be used by nobody
 * through the proxy, and expires on the server), never a live session: a
 * new session that finds no room is refused with 261
 * TooManyLogicalSessions, as mongod refuses one past its cache's limit;
 * so is a new session of a user who has pool_max_sessions_per_user of
 * them already (one user's fresh lsids cannot fill the table).
 *
 * The table also counts each user's pooled connections pinned by
 * transactions (owners_pin), for [proxy] pool_max_pins_per_user.
 */
#ifndef RELAYBUS_PROXY_OWNERS_H
#define RELAYBUS_PROXY_OWNERS_H

#include <stdbool.h>
#include <stddef.h>

#include <bson/bson.h>
#include <event2/buffer.h>

#include "codec/wire.h"
#include "proxy/conn.h"

/* Sessions, cursors and users' pin counts together. */
#define OWNERS_ENTRIES (1u << 18)

typedef enum {
   OWNERS_ALLOW = 0, /* forward it */
   OWNERS_REFUSE,    /* answer the refusal's error without forwarding */
} owners_verdict_t;

/* Why a request is refused: mongod's code (base/servercodes.h), its name
 * and its errmsg. */
typedef struct {
   int32_t code;
   const char *code_name;
   char why[300];
} owners_refusal_t;

/* Whether c's requests are checked: pooled, and logged in to the proxy. */
bool owners_enabled (const client_conn_t *c);

/* c's user as the table knows it (a hash of the name); 0 when c is not
 * checked. */
uint64_t owners_user (const client_conn_t *c);

/* The one check: whether c's request `body` (command `cmd`) names only
 * what is its user's.  A session it names for the first time becomes the
 * user's.  REFUSE fills *r. */
owners_verdict_t owners_check (client_conn_t *c, const bson_t *body, const char *cmd, owners_refusal_t *r);
/* The same for the user `user` (owners_user; 0: nothing is checked), who
 * may have at most `max_sessions` sessions in the table (0: no quota;
 * [proxy] pool_max_sessions_per_user): a new one past it is refused with
 * TooManyLogicalSessions, so that no user can fill the table. */
owners_verdict_t owners_check_user (uint64_t user, uint32_t max_sessions, const bson_t *body, const char *cmd, owners_refusal_t *r);

/* A request owners_check allowed was forwarded: the cursors it kills and
 * the sessions it ends are forgotten. */
void owners_note_request (client_conn_t *c, const bson_t *body, const char *cmd);

/* Whether the replies to `cmd` may open a cursor (find, aggregate, ...). */
bool owners_opens_cursors (const char *cmd);

/* The reply of `len` bytes at the front of `in` answers a command of c
 * that may open a cursor: a cursor it opened is c's user's. */
void owners_note_reply (client_conn_t *c, struct evbuffer *in, size_t len);

/* How many pooled connections transactions of `user` pin, process-wide. */
unsigned owners_pins (uint64_t user);
/* A pool connection's pin by transaction (lsid, txn_number) of `user`
 * starts (on) or ends: counted for the user and for the transaction. */
void owners_pin (uint64_t user, const uint8_t lsid[16], int64_t txn_number, bool on);
/* Transaction (lsid, txn_number) of `user` ended (its commit or abort is
 * answered): every connection it pins, on any loop, stops counting for
 * the user at once, and the owners_pin (off) of each, whenever its loop
 * gets to it, counts nothing again.  (A pin of the same transaction taken
 * after this, by a statement sent again, may then go uncounted while the
 * older pins of other loops end: the count errs low by at most that, never
 * high.) */
void owners_txn_ended (uint64_t user, const uint8_t lsid[16], int64_t txn_number);
/* Whether transaction (lsid, txn_number) of `user` pins a pool connection
 * on any loop. */
bool owners_txn_pinned (uint64_t user, const uint8_t lsid[16], int64_t txn_number);

#endif /* RELAYBUS_PROXY_OWNERS_H */
