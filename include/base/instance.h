/*
 * base/instance.h - this process's identity as a service: the ObjectId that
 * names it to drivers in load-balanced mode.
 *
 * Thread: any.
 *
 * A driver with loadBalanced=true requires a `serviceId` in the reply to
 * its connection's first hello (the drivers' load-balancer specification),
 * names each connection's service by it in its events, and clears only
 * the connections of that service when one of them fails.  Each proxy
 * process is one service: the id is made once, on the first call, and
 * does not change for the process's lifetime (a reload keeps it; a
 * restarted process is a new service, whose old connections are gone).
 * Not here: when a hello gets it (proxy/pump.c, codec/handshake.h).
 */
#ifndef RELAYBUS_BASE_INSTANCE_H
#define RELAYBUS_BASE_INSTANCE_H

#include <bson/bson.h>

/* The process's serviceId: a fresh ObjectId, the same at every call. */
const bson_oid_t *instance_service_id (void);

#endif /* RELAYBUS_BASE_INSTANCE_H */
