/*
 * proxy/pool_client.h - a client connection's part in pooled mode, as
 * plain data: the type proxy/conn_private.h embeds in every connection
 * (client_conn_t.pool) and the two readers the request path asks.
 *
 * Thread: forwarding loop (the connection's own).
 *
 * Its own header, without proxy/pool.h's functions, so that the
 * connection (proxy/conn.c), which the pool is built on, can hold it
 * without including the pool: proxy/pool.c alone writes it, and nothing
 * here calls anything.  Not here: lending, waiting and pins (proxy/pool.h).
 */
#ifndef RELAYBUS_PROXY_POOL_CLIENT_H
#define RELAYBUS_PROXY_POOL_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

struct client_conn;

/* A client connection's part in pooled mode (client_conn_t.pool).  Only
 * proxy/pool.c writes it; proxy/conn.c and proxy/pump.c read it through
 * the inline functions below.  Its state moves IDLE -> WAITING (in the
 * pool's FIFO, its request unread) -> IDLE (given a connection, or its
 * wait ran out) -> HANDED (listed for a pump on the pool's hand-off
 * event) -> IDLE, each move checked (pool.c's client_pool_set_state).
 * `refusal` says how the request at the front is answered without a
 * connection, until it is. */
typedef enum {
   POOL_CLIENT_IDLE = 0,
   POOL_CLIENT_WAITING,
   POOL_CLIENT_HANDED,
} pool_client_state_t;

/* A transaction: the session's id and its txnNumber. */
typedef struct {
   bool valid;
   uint8_t lsid[16];
   int64_t txn_number;
} pool_txn_t;

typedef enum {
   POOL_REFUSAL_NONE = 0,
   POOL_REFUSAL_TIMED_OUT, /* its wait ran out: a retryable ExceededTimeLimit */
   POOL_REFUSAL_OVER_PINS, /* its user pins pool_max_pins_per_user: answered as a wait that ran out */
} pool_refusal_t;

typedef struct pool_client {
   pool_client_state_t state;
   pool_refusal_t refusal;
   bool txn_ending; /* a commit or abort was routed: the pin ends once it is answered */
   /* What pool_admit's peek read of the request at the front (that
    * request only: its requestID), so that pool_note_request does not
    * walk the body again, whether the request got a connection at once or
    * waited for one; cleared once the request is taken. */
   bool peek_valid;
   int32_t peek_request_id;
   pool_txn_t peek_txn;
   int64_t wait_since_ms;
   struct client_conn *wait_prev, *wait_next; /* the pool's FIFO, while WAITING */
   struct client_conn *handed_next;          /* the hand-off list, while HANDED */
} pool_client_t;

/* Neither waiting for a connection nor about to be pumped for one: the
 * client may be read (proxy/conn.c). */
static inline bool
pool_client_idle (const pool_client_t *pc)
{
   return pc->state == POOL_CLIENT_IDLE;
}

/* Its wait ran out: the request at the front is answered with a
 * retryable error, not admitted again (proxy/pump.c). */
static inline bool
pool_client_timed_out (const pool_client_t *pc)
{
   return pc->refusal == POOL_REFUSAL_TIMED_OUT;
}

#endif /* RELAYBUS_PROXY_POOL_CLIENT_H */
