/*
 * proxy/pool_private.h - what the two halves of pooled mode's connections
 * share: proxy/pool.c (lending, waiting, pins, the budget, closing) and
 * proxy/pool_open.c (the opening: connect, hello, login).
 *
 * Thread: forwarding loop (the loop that owns the pool).
 *
 * Both include it; every other module uses proxy/pool.h only.  A
 * connection (pool_server_t) is one side_t of its own, in one of the
 * states below; pool_open.c makes it (server_open) and hands it to pool.c
 * once logged in (server_free_for_use), or closes it (server_close).
 */
#ifndef RELAYBUS_PROXY_POOL_PRIVATE_H
#define RELAYBUS_PROXY_POOL_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "base/authfile.h"
#include "base/config.h"
#include "base/topology.h"
#include "codec/scram.h"
#include "proxy/conn_private.h"
#include "proxy/pool.h"
#include "proxy/side.h"

struct event;

/* The longest a pooled connection's login may wait for a reply it is
 * reading: the handshake's replies are small. */
#define POOL_HANDSHAKE_MAX_REPLY (16 * 1024 * 1024)
/* Retrying a failed connection attempt: from this, doubled up to the max. */
#define POOL_BACKOFF_MIN_MS 100
#define POOL_BACKOFF_MAX_MS 5000

typedef enum {
   SERVER_OPENING = 0, /* connecting, hello, login */
   SERVER_IDLE,        /* in the idle stack */
   SERVER_LENT,        /* a client holds it */
   SERVER_BACK,        /* back from a client, not placed yet (server_return) */
} server_state_t;

/* Where the opening is. */
typedef enum {
   STEP_CONNECT = 0,
   STEP_HELLO,
   STEP_SASL_START,
   STEP_SASL_CONTINUE,
   STEP_SASL_EMPTY, /* the empty saslContinue of a server without skipEmptyExchange */
   STEP_X509,
} open_step_t;

struct pool_server {
   side_t side;
   pool_t *pool;
   uint64_t id; /* "p<id>" in logs */
   server_state_t state;
   open_step_t step;
   char name[TOPOLOGY_HOST_MAX + 8]; /* host:port */
   uint64_t generation;              /* the topology's, when it connected */
   uint64_t op_generation;           /* operator_generation () when it was opened */
   bool stale;                       /* close it when it comes back */
   bool counted_open;                /* in the open gauges */
   client_conn_t *client;            /* LENT: who holds it */
   unsigned pins;                    /* bits (1 << counters_pin_t) */
   pool_txn_t txn;                   /* the transaction pinning it */
   uint64_t pin_user;                /* whose transaction pins it (owners_user; 0: unchecked) */
   int64_t idle_since_ms;            /* a pinned transaction's last answer */
   /* The opening. */
   int32_t next_id;
   int32_t expect;          /* the requestID the next reply answers */
   authfile_mech_t mech;
   scram_client_t *scram;
   int32_t conversation_id;
   bson_t *hello; /* its hello reply, taught to the pool once it is logged in */
   struct event *deadline;
   pool_server_t *prev, *next;           /* pool->servers */
   pool_server_t *idle_prev, *idle_next; /* pool->idle, a stack */
};

struct pool {
   client_loop_t *loop;
   unsigned size;      /* this loop's share of pool_size (pool_share) */
   unsigned limit;     /* the budget: pool_size shared with the other loops, or `size` alone */
   bool shared;        /* in a slot: its budget is the process's (pool_total) */
   bool starving;      /* what its slot says (starve_update) */
   bool stopping;      /* pool_destroy: its closes wake nobody */
   unsigned n_open;    /* in pool->servers */
   unsigned n_opening; /* of them, OPENING */
   pool_server_t *servers;
   pool_server_t *idle; /* the top of the stack: the most recently used */
   unsigned n_idle;
   unsigned n_pinned_txn;
   client_conn_t *wait_head, *wait_tail;
   unsigned n_waiting;
   client_conn_t *handed; /* waiting for handoff_ev */
   struct event *handoff_ev;
   struct event *wait_timer;
   bool wait_timer_armed;
   /* The topology as this loop was last told of it (pool_topology_changed):
    * a connection that comes back is checked against it without the
    * topology's mutex. */
   bool primary_known;
   uint64_t generation;
   struct event *retry_timer;
   struct event *pin_timer;
   bool retry_armed;
   bool pin_timer_armed;
   int64_t backoff_ms;
   bson_t *hello;   /* the upstream's hello reply, as received */
   bool want_hello; /* clients wait for it */
   int64_t last_warn_ms;
   char last_error[256];
   scram_salt_cache_t salt; /* the upstream user's salted password */
};

static inline config_t *
pool_cfg (const pool_t *pool)
{
   return pool->loop->cfg;
}

/* proxy/pool.c: the one function that changes a connection's state
 * (checked moves). */
void server_set_state (pool_server_t *s, server_state_t next);
/* proxy/pool.c: closes and frees `s` (not LENT), giving its budget back. */
void server_close (pool_server_t *s, const char *why);
/* proxy/pool.c: `s` (BACK) is free: lent to the oldest waiter, or idle. */
void server_free_for_use (pool_server_t *s);
/* proxy/pool.c: whether this loop's clients wait for what nothing it opens
 * will serve, told to the other loops. */
void starve_update (pool_t *pool);
/* proxy/pool.c: opens what the waiters need while the budget lasts. */
void pool_fill (pool_t *pool);
/* proxy/pool.c: a budget taken (budget_take) goes back unused, quietly;
 * and the other loops are told how many this one has open. */
void budget_untake (pool_t *pool);
void budget_note_open (pool_t *pool);

/* proxy/pool_open.c: opens one more connection to the primary, with the
 * budget the caller took; false when none is known (the budget goes
 * back) or the attempt failed at once (it is retried). */
bool server_open (pool_t *pool);
/* proxy/pool_open.c: the callbacks of a connection the pool holds (opening
 * or idle); a lent one has the client's. */
extern const side_callbacks_t pool_side_cb;

#endif /* RELAYBUS_PROXY_POOL_PRIVATE_H */
