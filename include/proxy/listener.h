/*
 * proxy/listener.h - accepting client connections.
 *
 * Thread: the forwarding loop's (listener_new runs on the main thread
 * before the loop does; listener_destroy from a loop callback or after
 * the loop stopped).
 *
 * One listening socket, TCP ("host:port") or Unix ("/path"), handed to
 * libevent's evconnlistener on loop 0.  Accepted sockets go to the next
 * forwarding loop (loops_accept), unless max_clients are already open on
 * all of them together: then the socket is closed at once, with a log
 * line and a count.  When accept fails for lack of file descriptors
 * (EMFILE/ENFILE) the listener pauses and retries on a timer instead of
 * spinning on a readable socket it cannot accept.
 */
#ifndef RELAYBUS_LISTENER_H
#define RELAYBUS_LISTENER_H

#include <stdbool.h>

#include <bson/bson.h>
#include <openssl/ssl.h>

#include "proxy/conn.h"
#include "proxy/loops.h"
#include "base/errors.h"

struct event_base;

/* The errors of listener_new (LISTENER_ERROR_DOMAIN). */
typedef enum {
   LISTENER_ERR_PATH_TOO_LONG = 1, /* a Unix socket path longer than sun_path */
   LISTENER_ERR_ADDRESS,           /* not a numeric IP and port */
   LISTENER_ERR_BIND,              /* socket, bind or listen failed */
} listener_error_t;

typedef struct listener listener_t;

/* Binds `listen` (config syntax) on loop 0's `base`.  `loops` and
 * `server_tls` (may be NULL) are borrowed.  max_clients is what
 * listener_set_max_clients last set. */
listener_t *listener_new (struct event_base *base,
                          const char *listen,
                          loops_t *loops,
                          SSL_CTX *server_tls,
                          bson_error_t *error) __attribute__ ((warn_unused_result));

/* The bound address as text (the real port when 0 was asked). */
const char *listener_address (const listener_t *l);

void listener_set_max_clients (listener_t *l, int64_t max_clients);

/* Stops accepting, closes the socket, removes a Unix socket file. NULL ok. */
void listener_destroy (listener_t *l);

#endif /* RELAYBUS_LISTENER_H */
