/*
 * proxy/owners.h - whose cursors and sessions they are, in pooled mode.
 *
 * Thread: forwarding loops (the tables are process-wide, striped under
 * mutexes: a driver's connections, and so its sessions and cursors, are
 * spread over the loops).
 *
 * In pooled mode every client's commands reach the server as the pool's
 * one login, so the server cannot tell the proxy's users apart: any of
 * them could end another's sessions or kill another's cursors by naming
 * them.  When clients log in to the proxy (auth_file), the proxy keeps
 * what mongod keeps per user: the sessions (lsid) each user sent, and the
 * cursors the replies to each user's commands opened.  Then
 *
 *  - killCursors naming a cursor the user did not open is refused, whole,
 *    with 13 Unauthorized (as mongod refuses another user's cursor);
 *  - killSessions naming a session the user did not use is refused, and
 *    so are killSessions without ids, killAllSessions and
 *    killAllSessionsByPattern, which would end every user's sessions;
 *  - endSessions naming a session of another user is answered {ok: 1} and
 *    not forwarded (mongod ignores sessions it does not know of too).
 *
 * Without an auth file every client is the same (unnamed) user, as with a
 * mongod without --auth, and nothing is checked.  The tables are bounded
 * (OWNERS_SESSIONS, OWNERS_CURSORS); entries expire as the server's would
 * (a session unused for 30 minutes, a cursor for 10), and a full
 * neighbourhood gives up its least recently used entry: that cursor or
 * session can then no longer be killed through the proxy (refused), and
 * expires on the server.
 */
#ifndef RELAYBUS_PROXY_OWNERS_H
#define RELAYBUS_PROXY_OWNERS_H

#include <stdbool.h>
#include <stddef.h>

#include <bson/bson.h>
#include <event2/buffer.h>

#include "codec/wire.h"
#include "proxy/conn.h"

#define OWNERS_SESSIONS (1u << 17)
#define OWNERS_CURSORS (1u << 16)

typedef enum {
   OWNERS_ALLOW = 0,  /* forward it */
   OWNERS_ANSWER_OK,  /* answer {ok: 1} without forwarding */
   OWNERS_REFUSE,     /* answer 13 Unauthorized with `why` */
} owners_verdict_t;

/* Whether c's requests are checked: pooled, and logged in to the proxy. */
bool owners_enabled (const client_conn_t *c);

/* A request of c is forwarded: its lsid, if any, is c's user's. */
void owners_note_session (client_conn_t *c, const bson_t *body);

/* What becomes of a killCursors, killSessions, killAllSessions,
 * killAllSessionsByPattern or endSessions of c (anything else: ALLOW). */
owners_verdict_t owners_check (client_conn_t *c, const bson_t *body, const char *cmd, char *why, size_t why_len);

/* Whether the replies to `cmd` may open a cursor (find, aggregate, ...). */
bool owners_opens_cursors (const char *cmd);

/* The reply of `len` bytes at the front of `in` answers a command of c
 * that may open a cursor: a cursor it opened is c's user's. */
void owners_note_reply (client_conn_t *c, struct evbuffer *in, size_t len);

#endif /* RELAYBUS_PROXY_OWNERS_H */
