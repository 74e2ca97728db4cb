/*
 * proxy/loops.h - the forwarding loops: one per thread, each owning the
 * connections it was handed.
 *
 * Thread: the main thread (loop 0's) for every function here.
 *
 * [proxy] threads sets how many.  Loop 0 runs on the main thread's event
 * base, next to the listener, the signals and the topology notices; loops
 * 1..N-1 each run an event base of their own on a thread of their own
 * (without libevent's locks, as loop 0's: base/loopwake.h).  Every loop has
 * its own client_loop_t, request decoding thread and loopwake, and owns
 * its connections from accept to free: nothing of a connection is touched
 * by another thread, so DESIGN's rules for the forwarding loop hold per
 * loop.
 *
 * One acceptor hands connections out: the listener accepts on loop 0 and
 * gives each socket to the next loop in turn (loops_accept).  A socket for
 * another loop goes through that loop's bounded hand-off queue
 * (LOOPS_HANDOFF_MAX); when it is full the socket goes to the next loop
 * with room, and when every queue is full loop 0 takes it itself, so a
 * connection is never dropped for the hand-off.  Round robin, not
 * SO_REUSEPORT: the kernel's hash spreads connections only as well as
 * their source ports differ, and one listener keeps max_clients, the
 * accept pause on EMFILE and the drain in one place.
 *
 * What crosses loops is posted, coalesced: one queued post per loop at a
 * time carries every pending notice (new sockets, a reloaded snapshot, a
 * topology change, drain, stop).
 */
#ifndef RELAYBUS_LOOPS_H
#define RELAYBUS_LOOPS_H

#include <stdbool.h>
#include <stddef.h>

#include <bson/bson.h>
#include <event2/util.h>
#include <openssl/ssl.h>

#include "base/config.h"
#include "base/topology.h"
#include "proxy/conn.h"
#include "proxy/tls.h"
#include "base/errors.h"

struct event_base;
struct loopwake;

/* Sockets waiting for one loop to take them over. */
#define LOOPS_HANDOFF_MAX 256

/* Codes of LOOPS_ERROR_DOMAIN. */
typedef enum {
   LOOPS_ERR_EVENT_BASE = 1, /* a loop's event base cannot be created */
   LOOPS_ERR_THREAD,         /* a loop's thread cannot start */
   LOOPS_ERR_THREADS,        /* `threads` is out of range */
   LOOPS_ERR_CLOSED,         /* the loops are closed: nothing more is handed to them */
   LOOPS_ERR_NO_MEMORY,
} loops_error_code_t;

typedef struct loops loops_t;

/* An event base without libevent's locks, as every forwarding loop's is:
 * only the loop's own thread may touch it.  NULL when out of memory. */
struct event_base *loops_base_new (void);

/* How many loops `cfg` asks for: [proxy] threads, or for 0 one per online
 * core, at most CONFIG_THREADS_DEFAULT_MAX. */
unsigned loops_wanted (const config_t *cfg);

/* Makes `n` loops (1..CLIENT_LOOPS_MAX): loop 0 on `base0` with `wake0`
 * (the main thread's, borrowed), the others with bases and threads of
 * their own, started at once.  Each gets its decoding thread and `hook`.
 * `cfg` is retained; `topo` and `tls` are borrowed and outlive the loops. */
loops_t *loops_new (struct event_base *base0,
                    struct loopwake *wake0,
                    unsigned n,
                    topology_t *topo,
                    tls_upstream_t *tls,
                    config_t *cfg,
                    client_request_hook_t hook,
                    bson_error_t *error) __attribute__ ((warn_unused_result));

unsigned loops_count (const loops_t *l);
/* The wakes of loops 0..n-1, in order, for consumer_start. */
struct loopwake *const *loops_wakes (const loops_t *l);

/* Client connections open on every loop, plus sockets handed off and not
 * yet taken: what max_clients is checked against. */
size_t loops_clients (const loops_t *l);

/* Gives an accepted socket to the next loop (closed on failure). */
bool loops_accept (loops_t *l, evutil_socket_t fd, const struct sockaddr *addr, int addr_len, SSL_CTX *server_tls,
                   bson_error_t *error) __attribute__ ((warn_unused_result));

/* Reload: every loop's new connections take `cfg` (retained). */
void loops_set_config (loops_t *l, config_t *cfg);
/* For the service watchdog, on loop 0 (which is turning, since it runs
 * this): true when every other running loop answered the previous call's
 * ping; then pings them all again.  A loop that did not answer is logged. */
bool loops_ping (loops_t *l);
/* The topology snapshot changed: each loop's waiting clients try again. */
void loops_topology_changed (loops_t *l);
/* Drains every loop (client_loop_drain); `on_empty` runs on loop 0 once
 * the last connection of the last loop is gone. */
void loops_drain (loops_t *l, int64_t timeout_ms, void (*on_empty) (void *), void *ctx);
/* Closes every connection of every loop at once (a second stop signal);
 * the threads stay until loops_destroy. */
void loops_close_all (loops_t *l);
/* Stops and joins the loop threads (each closes its connections on its own
 * thread first) and closes loop 0's connections.  The wakes stay valid
 * (other threads may still post to them) until loops_destroy.  NULL ok. */
void loops_stop (loops_t *l);
/* loops_stop if not done yet, then frees everything, the loops' wakes
 * included: every thread that posts to them has stopped.  NULL ok. */
void loops_destroy (loops_t *l);

#endif /* RELAYBUS_LOOPS_H */
