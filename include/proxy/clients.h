/*
 * proxy/clients.h - who is connected, readable from any thread.
 *
 * Thread: any (under one mutex): clients_registry_note and clients_entry_*
 * run on the forwarding loop, clients_registry_snapshot on the admin
 * thread, clients_registry_clear on the main thread at exit.
 *
 * The forwarding loop tells the registry about every state change of a
 * client connection (one call, in client_set_state); the admin thread reads
 * a snapshot for /api/clients.  A mutex guards a small hash of entries; the
 * loop holds it for one insert, update or removal per state change, never
 * per message.  What changes more often (the sub-state, and why the
 * connection is not read) the loop stores in its entry without the mutex,
 * one atomic store each.
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

/* One connection's entry, which its loop keeps from the first note to the
 * one that removes it. */
typedef struct clients_entry clients_entry_t;

/* Records that connection `id`, owned by forwarding loop `loop`, is now in
 * `state` (a string with static storage, e.g. client_state_name()).  `open` false removes it.  `fd` is
 * its socket (-1: unknown).  Called on the forwarding loop; never blocks
 * on I/O.  Returns the entry (NULL once removed, or out of memory). */
clients_entry_t *clients_registry_note (uint64_t id, unsigned loop, const char *peer, int fd, const char *state, bool open);

/* What changes more often than the state, stored without the mutex (one
 * relaxed atomic store each: the loop calls them where the value changes,
 * up to twice a request) and read by the snapshot under it: the
 * connection's sub-state (`pairing`, NULL: none) and why it is not read
 * (`read_hold`).  Both are strings with static storage.  Only the loop
 * that owns the entry calls them, between its first note and its removal
 * (which is also the loop's, so the entry cannot go meanwhile).  NULL `e`
 * ok. */
void clients_entry_set_pairing (clients_entry_t *e, const char *pairing);
void clients_entry_set_read_hold (clients_entry_t *e, const char *read_hold);

/* Appends up to `limit` connections, by id, to `out` (an array):
 * {id, loop, peer, state, pairing (absent when none), readHold, since (ms),
 * stateSince (ms), bytesIn, bytesOut (absent when unknown)}.  Returns how
 * many are open. */
uint64_t clients_registry_snapshot (bson_t *out, uint32_t limit);

/* Whether connection `id` is open, and then which loop owns it. */
bool clients_registry_loop_of (uint64_t id, unsigned *loop);

/* Frees what is left (at exit, after the loop is gone). */
void clients_registry_clear (void);

#endif /* RELAYBUS_CLIENTS_REGISTRY_H */
