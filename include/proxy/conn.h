/*
 * proxy/conn.h - client connections, each paired with its own upstream.
 *
 * Thread: forwarding loop, for every function here (the request decoding
 * thread behind client_loop_set_wake is proxy/pump.c's own).
 *
 * A client connection is a state machine (client_state_t) that owns one
 * upstream connection to the primary.  Messages are framed on both sides;
 * requests are inspected (decompressed, parsed, the command name read) and
 * forwarded by moving evbuffer chains, with only the header's requestID
 * rewritten: every message the proxy sends upstream carries an id from the
 * connection's own counter, so the proxy's own requests can never collide
 * with the client's.  Two bounded FIFOs match replies:
 *
 *  - client requests awaiting an answer (client_req_t), in the client's
 *    order: answers are delivered in that order whatever produced them;
 *  - upstream requests awaiting a reply (upstream_req_t), in the upstream's
 *    order: each says what to do with its reply (relay it, rewrite a hello,
 *    or hand it to an internal callback).
 *
 * This split is what lets later modules (injection, virtual commands) hold
 * a client request, send the proxy's own requests on the same upstream
 * connection (client_send_internal), and answer the client themselves
 * (client_answer) without the client ever seeing the internal traffic.
 *
 * client_loop_t is one forwarding loop's own state (one per loop thread,
 * proxy/loops.h): its connections, the current config snapshot, its
 * waiters for memory.  Connection ids are process-wide, so a log line or
 * /api/clients names one connection whichever loop owns it.
 */
#ifndef RELAYBUS_CLIENT_H
#define RELAYBUS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <bson/bson.h>
#include <event2/util.h>
#include <openssl/ssl.h>

#include "base/config.h"
#include "base/counters.h"
#include "proxy/tls.h"
#include "base/topology.h"
#include "codec/wire.h"
#include "base/errors.h"

struct event_base;
struct loopwake;

/* The errors of this module (CLIENT_ERROR_DOMAIN). */
typedef enum {
   CLIENT_ERR_CLOSED = 1,           /* the connection closed before the reply came */
   CLIENT_ERR_NO_MEMORY,            /* a buffer, event or connection could not be allocated or moved */
   CLIENT_ERR_INFLIGHT_FULL,        /* CLIENT_MAX_INFLIGHT (or _UPSTREAM_) requests wait already */
   CLIENT_ERR_NO_SUCH_REQUEST,      /* client_answer for a request that waits for none */
   CLIENT_ERR_ANSWER_TOO_LARGE,     /* the proxy's answer does not fit in a message */
   CLIENT_ERR_INTERNAL_TOO_LARGE,   /* the proxy's own request does not fit in a message */
   CLIENT_ERR_REQUEST_TOO_LARGE,    /* a checksummed request, re-encoded, does not fit */
   CLIENT_ERR_HELLO_TOO_LARGE,      /* the hello rewritten for the upstream does not fit */
   CLIENT_ERR_HELLO_REPLY_TOO_LARGE, /* the hello reply rewritten as a mongos does not fit */
   CLIENT_ERR_REPLY_TOO_LARGE,      /* a checksummed reply, re-encoded, does not fit */
   CLIENT_ERR_NOT_CONNECTED,        /* client_send_internal before the upstream is connected */
   CLIENT_ERR_DECODER,               /* the request decoding thread cannot start, or runs already */
   CLIENT_ERR_BAD_REQUEST,           /* a request refused whole: an opcode, a compressor or a size it may not have */
   CLIENT_ERR_BAD_REPLY,             /* a reply that answers nothing asked: its opcode, responseTo, length, flags or body */
} client_error_t;
/* Client requests awaiting an answer.  Drivers do not pipeline (one request
 * per connection at a time, plus moreToCome writes which need no answer),
 * so this only bounds a misbehaving client: when full, reading pauses. */
#define CLIENT_MAX_INFLIGHT 16
/* Upstream requests awaiting a reply: the client's plus the proxy's own. */
#define CLIENT_MAX_UPSTREAM_INFLIGHT 64

typedef enum {
   CLIENT_STATE_AWAIT_UPSTREAM = 0, /* waiting for a primary and the upstream connect */
   CLIENT_STATE_HANDSHAKE,          /* upstream up; first hello not answered yet */
   CLIENT_STATE_READY,              /* forwarding */
   CLIENT_STATE_DRAINING,           /* shutdown, or a not-primary error relayed: no new requests; close when answered */
   CLIENT_STATE_CLOSING,            /* disconnected; freed on the next loop turn */
   CLIENT_STATE_COUNT_,
   /* Not a state: a connection between its accept and its first
    * transition (to AWAIT_UPSTREAM), which is neither logged nor listed. */
   CLIENT_STATE_NONE = CLIENT_STATE_COUNT_
} client_state_t;

typedef struct client_loop client_loop_t;
typedef struct client_conn client_conn_t;

/* Room for a peer's address as text: "[IPv6]:port" at the longest. */
#define CLIENT_PEER_MAX (INET6_ADDRSTRLEN + 8)
/* Writes `sa` as "ip:port" (IPv4), "[ip]:port" (IPv6) or "unix" (any
 * other family) to `out`, as connection logs name peers. */
void client_format_peer (const struct sockaddr *sa, char *out, size_t outlen);

/* --- the loop ---------------------------------------------------------- */

/* At most this many forwarding loops run ([proxy] threads). */
#define CLIENT_LOOPS_MAX CONFIG_THREADS_MAX

/* `index` (below CLIENT_LOOPS_MAX, one per loop) names the loop in logs
 * and in the answers other threads post back to it.  `cfg` is retained (new connections take their own reference to whatever
 * snapshot is current when they are accepted); `topo` and `tls` (may be
 * NULL) are borrowed and must outlive the loop. */
client_loop_t *client_loop_new (struct event_base *base,
                                unsigned index,
                                topology_t *topo,
                                tls_upstream_t *tls,
                                config_t *cfg,
                                bson_error_t *error) __attribute__ ((warn_unused_result));
/* Starts the thread that decompresses and validates big requests off the
 * loop, posting results through `wake` (borrowed; it must outlive the
 * loop), the loop's own way in from other threads.  Other loops post
 * through it too, when memory they give back lets this loop's waiters go
 * on.  Without it every request is decoded on the loop, and this loop's
 * memory waiters resume only on room its own connections give back. */
bool client_loop_set_wake (client_loop_t *loop, struct loopwake *wake, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* Pooled mode's modules as the connection calls them.  Pool and login
 * (proxy/pool.h, proxy/login.h) are built on the connection, so it cannot
 * include them: proxy/loops.c, above both, fills one static table with
 * their functions, each entry the function of its name, and gives it to
 * client_loop_enable_pool.  Called only in pooled mode, so session mode's
 * path makes no indirect call. */
struct login;
struct pool;
struct pool_server;
typedef struct {
   struct pool *(*pool_new) (client_loop_t *loop, unsigned size, bson_error_t *error);
   void (*pool_destroy) (struct pool *pool);
   void (*pool_topology_changed) (struct pool *pool);
   void (*pool_reconnect) (struct pool *pool);
   const bson_t *(*pool_hello) (const struct pool *pool);
   void (*pool_want_hello) (struct pool *pool);
   const char *(*pool_last_error) (const struct pool *pool);
   bool (*pool_wants_flush) (const client_conn_t *c);
   void (*pool_settle) (client_conn_t *c);
   void (*pool_client_closed) (client_conn_t *c);
   void (*pool_server_lost) (client_conn_t *c, const char *detail);
   const char *(*pool_server_name) (const struct pool_server *s);
   void (*pool_server_not_primary) (client_conn_t *c);
   bool (*login_deadline_start) (client_conn_t *c);
   void (*login_stop) (client_conn_t *c);
   void (*login_destroy) (struct login *login);
   const char *(*login_user) (const client_conn_t *c);
} client_pooled_ops_t;

/* Pooled mode ([proxy] pool_mode = pooled): the loop's clients share a pool
 * of `size` upstream connections (ops->pool_new, proxy/pool.h) instead of
 * each pairing with its own.  Once, before the first client; `ops`
 * (every entry set) is borrowed for the loop's life. */
bool client_loop_enable_pool (client_loop_t *loop, const client_pooled_ops_t *ops, unsigned size, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* Swaps the snapshot used for new connections (reload). Retains `cfg`. */
void client_loop_set_config (client_loop_t *loop, config_t *cfg);
/* The topology snapshot changed: waiting clients try to connect. */
void client_loop_topology_changed (client_loop_t *loop);
/* Stops reading new requests everywhere, closes each connection once its
 * in-flight requests are answered, and all of them after `timeout_ms`.
 * `on_empty` runs (on the loop) when the last connection is gone. */
void client_loop_drain (client_loop_t *loop, int64_t timeout_ms, void (*on_empty) (void *), void *ctx);
/* Closes every connection at once and frees the loop.  NULL ok. */
void client_loop_destroy (client_loop_t *loop);
/* The operator's commands for this loop (proxy/operator.h): closes the
 * connections of `ids` that are here (reason operator), then with
 * `reconnect` closes the upstream connections older than the reconnect
 * generation that are free now (the others as they come free), then with
 * `resume` pumps every connection a pause held. */
void client_loop_operator (client_loop_t *loop, const uint64_t *ids, unsigned n_ids, bool reconnect, bool resume);

/* What a request hook decided about one client request. */
typedef enum {
   CLIENT_ROUTE_FORWARD = 0, /* not ours: forward it unchanged */
   CLIENT_ROUTE_HELD,        /* taken: the hook called client_hold_request and
                              * will call client_answer (maybe after
                              * client_send_internal round trips) */
   CLIENT_ROUTE_ERROR,       /* close the connection; `error` says why */
} client_route_t;

/* Called on the loop for every parsed OP_MSG request that expects a reply
 * or not (check WIRE_MSG_MORE_TO_COME), after decompression and before
 * forwarding; hellos never reach it.  `msg` and `cmd` point into the
 * request's buffer, valid only during the call: copy what you keep.
 * `compressor` is what client_hold_request wants.  The request's bytes are
 * dropped after CLIENT_ROUTE_HELD. */
typedef client_route_t (*client_request_hook_t) (client_conn_t *c,
                                                 const wire_msg_t *msg,
                                                 const char *cmd,
                                                 int compressor,
                                                 void *ctx,
                                                 bson_error_t *error);

/* Installs the hook: one per loop, installed once (main.c: the publishing
 * hook; installing over another is a bug, asserted in a debug build); NULL
 * removes it. */
void client_loop_set_request_hook (client_loop_t *loop, client_request_hook_t hook, void *ctx);

/* Takes over an accepted socket (closes it on failure).  `server_tls` may
 * be NULL.  The connection starts waiting for a primary. */
bool client_accept (client_loop_t *loop,
                    evutil_socket_t fd,
                    const struct sockaddr *addr,
                    int addr_len,
                    SSL_CTX *server_tls,
                    bson_error_t *error) __attribute__ ((warn_unused_result));

/* --- one connection ---------------------------------------------------- */

uint64_t client_id (const client_conn_t *c);
/* The index of the loop that owns `c` (client_loop_new). */
unsigned client_loop_of (const client_conn_t *c);
const char *client_peer (const client_conn_t *c);
client_state_t client_state (const client_conn_t *c);

/* Who the connection is, as a pull handler's `consumers` list names users:
 * in pooled mode the auth-file user it logged in to the proxy as (*db set
 * to NULL); in session mode the user the server accepted in the last SASL
 * conversation the proxy relayed, with its database (codec/sasl.h).  NULL
 * (and *db NULL): nobody, or not known. */
const char *client_user (const client_conn_t *c, const char **db);

/* A slot for a module's per-connection state (e.g. a transaction being
 * injected into).  `destroy` (may be NULL) runs when the connection is
 * freed, after every callback has fired.  Setting replaces (and destroys)
 * the previous value. */
void client_set_data (client_conn_t *c, void *data, void (*destroy) (void *));
void *client_get_data (const client_conn_t *c);

/* The one way a connection ends: logs "c<id> <peer>: closing (<reason>):
 * <detail>", counts the reason, fails pending internal requests, frees the
 * sockets now and the struct on the next loop turn.  Idempotent: on a
 * closed connection it does nothing. */
void client_disconnect (client_conn_t *c, counters_close_reason_t reason, const char *fmt, ...)
   __attribute__ ((format (printf, 3, 4)));

/* --- the proxy's own traffic (injection, virtual commands) ------------- */

/* Receives the reply to a request sent with client_send_internal: the
 * parsed OP_MSG (valid only during the call) and NULL error, or NULL reply
 * and an error when the connection closed first (then `c` is CLOSING:
 * release `ctx` and send nothing).  It may call client_send_internal,
 * client_answer and client_disconnect. */
typedef void (*client_internal_cb_t) (client_conn_t *c,
                                      const wire_msg_t *reply,
                                      const bson_error_t *error,
                                      void *ctx);

/* Sends the proxy's own OP_MSG on this client's upstream connection, after
 * everything already queued there (so it runs inside whatever transaction
 * the client's previous statements opened, given the same lsid/txnNumber).
 * The reply goes to `cb`, never to the client.  Fails if the upstream is not
 * connected (as on a closed connection) or the in-flight FIFO is full. */
bool client_send_internal (client_conn_t *c,
                           const bson_t *body,
                           const wire_sequence_t *sequences,
                           uint32_t nsequences,
                           client_internal_cb_t cb,
                           void *ctx,
                           bson_error_t *error) __attribute__ ((warn_unused_result));

/* Registers a client request the proxy will answer itself (a virtual
 * command, or a statement injection holds): returns its sequence number for
 * client_answer.  `family` is the request's opcode (WIRE_OP_MSG or
 * WIRE_OP_QUERY), `compressor` the id it arrived compressed with or -1.
 * Fails when CLIENT_MAX_INFLIGHT requests are already waiting. */
bool client_hold_request (client_conn_t *c,
                          int32_t client_request_id,
                          int32_t family,
                          int compressor,
                          uint64_t *request_seq,
                          bson_error_t *error) __attribute__ ((warn_unused_result));

/* Answers client request `request_seq` (a value returned by
 * client_hold_request) with `reply`, encoded in the request's opcode family,
 * compressed as the request was, delivered in request order.  Fails
 * (CLIENT_ERR_NO_SUCH_REQUEST) on a closed connection: none waits there. */
bool client_answer (client_conn_t *c, uint64_t request_seq, const bson_t *reply, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Convenience: answers with {ok: 0, errmsg, code, codeName}. */
bool client_answer_error (client_conn_t *c,
                          uint64_t request_seq,
                          int32_t code,
                          const char *code_name,
                          const char *errmsg,
                          bson_error_t *error) __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_CLIENT_H */
