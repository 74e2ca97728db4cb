/*
 * admin/admin.h - the admin port: health, Prometheus metrics, a JSON API and the
 * dashboard, over HTTP on its own thread.
 *
 * Thread: admin_start and admin_stop: the main thread; everything else: the admin thread.
 *
 * The admin thread is a worker (base/worker.h: an event base, a
 * mongoc_client_pool) with libevent's evhttp and a store instance (it never
 * claims).  Every store
 * call it makes blocks that thread only: the forwarding loop never waits
 * for the admin port, and the admin port reads the loop's state only
 * through the counter registry (base/counters.h) and the clients registry.
 *
 * Listening on [admin] listen (loopback by default; empty disables it).
 * When [admin] token is set, /metrics and /api/... need
 * "Authorization: Bearer <token>" (compared in constant time); /healthz,
 * /readyz and the dashboard page itself do not.  Endpoints and JSON shapes:
 * docs/admin.md.
 */
#ifndef RELAYBUS_ADMIN_H
#define RELAYBUS_ADMIN_H

#include <stdbool.h>

#include <bson/bson.h>

#include "base/config.h"
#include "base/topology.h"
#include "base/errors.h"

/* Errors of admin_start beyond those of its worker (WORKER_ERROR_DOMAIN)
 * and its store. */
typedef enum {
   ADMIN_ERROR_TLS = 1, /* [admin] tls_cert_file or tls_key_file does not load */
   ADMIN_ERROR_HTTP,    /* evhttp or its events could not be made */
} admin_error_code_t;

/* Connections served at once; more are closed at accept. */
#define ADMIN_MAX_CONNECTIONS 64
/* A connection idle (or a request stalled) this long is dropped. */
#define ADMIN_TIMEOUT_S 5
#define ADMIN_MAX_HEADERS_SIZE 8192
#define ADMIN_MAX_BODY_SIZE 65536
/* Ids in one requeue or bury request. */
#define ADMIN_MAX_IDS 1000

/* Starts the admin thread on cfg->admin_listen (nothing when empty).
 * `topo` is borrowed and must outlive admin_stop.  A listen address that
 * cannot be bound is logged and leaves the admin port off: the proxy keeps
 * forwarding.  False only when the thread or its resources cannot be
 * created. */
bool admin_start (config_t *cfg, topology_t *topo, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Stops and joins the thread, closes its connections, frees everything.
 * Safe when nothing was started. */
void admin_stop (void);

/* The dashboard page (src/admin/dashboard.html, embedded at build time). */
extern const unsigned char admin_dashboard_html[];
extern const unsigned long admin_dashboard_html_len;

#endif /* RELAYBUS_ADMIN_H */
