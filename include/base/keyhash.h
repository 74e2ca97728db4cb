/*
 * base/keyhash.h - the hash of keys a client chooses: SipHash-2-4 keyed
 * with a random 128-bit key per process.
 *
 * Thread: any.  The key is drawn once (getrandom), the first time any
 * thread hashes or when main calls keyhash_init at start, under
 * pthread_once; it never changes after, so reading it takes no lock.
 *
 * An in-memory table whose keys come from clients (session ids,
 * transaction numbers, the field names of a message) must not be hashed
 * with a function anyone can compute offline: a client could send keys
 * that all land in one slot or one probe window, turning each lookup into
 * a scan or evicting other clients' entries.  With a secret per-process
 * key, which keys collide cannot be known from outside.  Not for anything
 * stored or shared between processes (the outbox's laneId stays FNV-1a:
 * every proxy must compute the same lane), nor a MAC: the output is 64
 * bits, used for table slots only.
 */
#ifndef RELAYBUS_KEYHASH_H
#define RELAYBUS_KEYHASH_H

#include <stddef.h>
#include <stdint.h>

#define KEYHASH_KEY_LEN 16

/* Draws the process's key if no call did yet.  main calls it at start, so
 * that a missing entropy source is known then rather than mid-request. */
void keyhash_init (void);

/* SipHash-2-4 of data[0..len) under the process's key. */
uint64_t keyhash (const void *data, size_t len);

/* SipHash-2-4 of data[0..len) under `key` (the reference's byte order:
 * k0 and k1 are the key's two halves, little-endian).  For the tests'
 * known vectors. */
uint64_t keyhash_siphash24 (const uint8_t key[KEYHASH_KEY_LEN], const void *data, size_t len);

#endif /* RELAYBUS_KEYHASH_H */
