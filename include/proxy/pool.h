/*
 * proxy/pool.h - pooled mode: a forwarding loop's upstream connections,
 * lent to its clients one request at a time.
 *
 * Thread: forwarding loop (each loop has its own pool; nothing here is
 * shared between loops but the counters, the budget of pool_size
 * connections, and the notices one loop posts to the others: the ends of
 * transactions, so that their pins of it go too, and the budget's
 * fills and reclaims).
 *
 * With [proxy] pool_mode = pooled, a client connection has no upstream
 * connection of its own.  The process keeps at most pool_size connections
 * to the primary, each opened on demand by a loop, logged in with the
 * credentials of the `upstream` URI (SCRAM or X.509), and idle in that
 * loop's pool until one of its clients' requests needs one.  Each loop
 * has a share of pool_size (pool_share) it keeps under contention, and
 * may open more while the process is under pool_size; when the budget is
 * spent and a loop's clients wait, other loops close their idle
 * connections (or those above their share) so that it can open its own
 * (proxy/pool.c, "One budget").  A request
 * that needs the upstream borrows a connection before it is read
 * (pool_admit), and the connection goes back once nothing the client sent
 * is in flight on it any more (pool_settle), unless a pin holds it:
 *
 *  - a transaction, from its first statement until its commit or abort is
 *    answered: its statements, the outbox writes injected into it and its
 *    commit all run on one connection.  Another client connection of the
 *    same loop that sends a statement of the same transaction (drivers may
 *    move a session between their connections) is lent the same
 *    connection while it is idle;
 *  - an exhaust stream, until its last reply;
 *  - moreToCome requests, until they are written.
 *
 * With an auth file, one user's transactions pin at most
 * pool_max_pins_per_user connections of the process (counted in the table
 * of owners, proxy/owners.h): a transaction that starts past it is
 * answered at once as a wait that ran out.  pool_admit lends nothing to a
 * request the owners' check refuses, nor, before a login, to anything.
 *
 * Without a free connection the client waits in a FIFO, unread (its request
 * stays in its input buffer: no copy), at most pool_wait_timeout_ms; then
 * the request is answered with a retryable error (ExceededTimeLimit, with
 * RetryableWriteError or TransientTransactionError as fits), never left
 * hanging.  A connection something of a client is still in flight on when
 * the client goes (a reply not read, a partial write) is closed, not
 * reused: its state is in doubt.  A connection that relayed a not-primary
 * error, or that belongs to a primary the topology left, is closed once it
 * comes back.
 *
 * The hello the pool's first connection received teaches the pool what
 * the upstream is (wire versions, limits, session timeout): pooled clients'
 * hellos are answered from it (proxy/pump.c), so a client needs no
 * connection to connect or log in (proxy/login.h).
 */
#ifndef RELAYBUS_PROXY_POOL_H
#define RELAYBUS_PROXY_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <event2/buffer.h>

#include "codec/wire.h"
#include "proxy/conn.h"
#include "proxy/pool_client.h"

typedef struct pool pool_t;
typedef struct pool_server pool_server_t;

/* How long a transaction's pin may hold an idle connection: mongod's
 * default transactionLifetimeLimitSeconds, after which the server has
 * aborted the transaction anyway. */
#define POOL_PIN_IDLE_MAX_MS 60000

/* Loop `index` of `nloops` keeps this many of the pool_size connections
 * under contention (at least one; pool_size is at least the number of
 * loops, loops_wanted). */
unsigned pool_share (int64_t pool_size, unsigned index, unsigned nloops);

/* A pool for `loop` (client_loop_enable_pool) whose share is `size`: with
 * a loopwake, its budget is [proxy] pool_size shared with the other loops'
 * pools; without one, `size` alone.  It opens its first connection as soon
 * as a primary is known. */
pool_t *pool_new (client_loop_t *loop, unsigned size, bson_error_t *error) __attribute__ ((warn_unused_result));
/* Closes every connection.  Call once no client holds one.  NULL ok. */
void pool_destroy (pool_t *pool);

/* The topology changed: connections to a member that is no longer the
 * primary close (idle ones now, lent ones when they come back), and the
 * pool opens what its waiters need on the new primary. */
void pool_topology_changed (pool_t *pool);

/* POST /api/reconnect (proxy/operator.h): connections opened before the
 * last reconnect close, idle and opening ones now, lent ones when they
 * come back; the pool opens what its waiters need. */
void pool_reconnect (pool_t *pool);

/* The upstream's hello reply the pool learned (as received), or NULL
 * before its first connection said hello. */
const bson_t *pool_hello (const pool_t *pool);
/* A client waits for the hello: open a connection if none is opening. */
void pool_want_hello (pool_t *pool);
/* Why the last connection attempt failed ("" if none did), for logs. */
const char *pool_last_error (const pool_t *pool);

/* --- the request path (proxy/pump.c, proxy/conn.c) ------------------- */

/* The complete request with header `h` at the front of `in` is about to be
 * read by c, which holds no connection.  True: go on (the request is the
 * proxy's own to answer, or c now holds a connection).  False: c waits in
 * the pool's FIFO, unread, until a connection is handed to it or its wait
 * runs out (then it is pumped again, pool_client_timed_out). */
bool pool_admit (client_conn_t *c, struct evbuffer *in, const wire_header_t *h);

/* pool_admit's peek at the complete request with header `h` at the front
 * of `in`: its command name and its body (pointing into `in`, valid until
 * `in` changes), without reading the rest.  False: it cannot tell (not
 * OP_MSG, compressed, the body not first, or past the first 64 KiB). */
bool pool_peek (struct evbuffer *in, const wire_header_t *h, char *cmd, size_t cmd_len, bson_t *body);

/* The request at the front of c's input had its answer: what refused it
 * is over (proxy/pump.c). */
void pool_request_answered (client_conn_t *c);

/* A request of c is routed upstream on its connection (or taken by the
 * request hook, which may send on it): its transaction (lsid, txnNumber,
 * autocommit: false) pins the connection, a request outside it ends the
 * pin, a commit or abort ends it once answered, moreToCome pins it until
 * written.  False: the request would pin one more connection than its
 * user may have pinned (pool_max_pins_per_user; one pool_admit could not
 * peek at): it is not to be forwarded but answered by
 * pool_answer_timeout. */
bool pool_note_request (client_conn_t *c, const wire_msg_t *msg, const char *cmd) __attribute__ ((warn_unused_result));
/* A reply is relayed to c, called before it is queued for the client:
 * `more` (moreToCome) holds the connection for the exhaust stream's next
 * reply; the answer to a commit or an abort ends the transaction's pins
 * there and then, before the client can have it. */
void pool_note_reply (client_conn_t *c, bool more);
/* Whether c's connection waits only for moreToCome requests to be
 * written (then c wants the side's drain callback). */
bool pool_wants_flush (const client_conn_t *c);

/* The end of a pump of c: its connection goes back when nothing is in
 * flight, both its buffers are empty and no pin holds it. */
void pool_settle (client_conn_t *c);

/* c is closing: it leaves the wait list, and its connection goes back (or
 * is closed, when something of c is still in flight on it). */
void pool_client_closed (client_conn_t *c);

/* c's connection failed (EOF or error).  It is closed; c is disconnected
 * when it waited for something on it, else it just holds none now. */
void pool_server_lost (client_conn_t *c, const char *detail);

/* c's connection relayed a not-primary error: it closes when it comes back. */
void pool_server_not_primary (client_conn_t *c);

/* Answers the request (its bytes, `len` at the front of `src`) that
 * waited pool_wait_timeout_ms for a connection, or that would start a
 * transaction past pool_max_pins_per_user (POOL_REFUSAL_OVER_PINS), with
 * ExceededTimeLimit and the label that makes a driver retry it. */
bool pool_answer_timeout (client_conn_t *c,
                          const wire_msg_t *msg,
                          const char *cmd,
                          int compressor,
                          struct evbuffer *src,
                          size_t len,
                          bson_error_t *error) __attribute__ ((warn_unused_result));

/* host:port of a connection, for logs. */
const char *pool_server_name (const pool_server_t *s);

#endif /* RELAYBUS_PROXY_POOL_H */
