/*
 * proxy/clients.h - who is connected, readable from any thread.
 *
 * Thread: any (under one mutex): clients_registry_note runs on the
 * forwarding loop, clients_registry_snapshot on the admin thread,
 * clients_registry_clear on the main thread at exit.
 *
 * The forwarding loop tells the registry about every state change of a
 * client connection (one call, in client_set_state); the admin thread reads
 * a snapshot for /api/clients.  A mutex guards a small hash of entries; the
 * loop holds it for one insert, update or removal per state change, never
 * per message.
 *
 * Bytes are read from the kernel (TCP_INFO: bytes received, bytes sent and
 * acknowledged) while the snapshot holds the mutex: an entry is removed
 * before its socket is closed (CLOSING comes before bufferevent_free), so
 * the descriptor is still the client's when it is read.  Unix sockets and
 * other systems report no bytes.
 */
#ifndef RELAYBUS_CLIENTS_REGISTRY_H
#define RELAYBUS_CLIENTS_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

/* Records that connection `id`, owned by forwarding loop `loop`, is now in
 * `state` (a string with static storage, e.g. client_state_name()).  `open` false removes it.  `fd` is
 * its socket (-1: unknown).  Called on the forwarding loop; never blocks
 * on I/O. */
void clients_registry_note (uint64_t id, unsigned loop, const char *peer, int fd, const char *state, bool open);

/* Appends up to `limit` connections, by id, to `out` (an array):
 * {id, loop, peer, state, since (ms), stateSince (ms), bytesIn, bytesOut (absent
 * when unknown)}.  Returns how many are open. */
uint64_t clients_registry_snapshot (bson_t *out, uint32_t limit);

/* Whether connection `id` is open, and then which loop owns it. */
bool clients_registry_loop_of (uint64_t id, unsigned *loop);

/* Frees what is left (at exit, after the loop is gone). */
void clients_registry_clear (void);

#endif /* RELAYBUS_CLIENTS_REGISTRY_H */
