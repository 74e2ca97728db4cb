/*
 * publish/guard.h - does a client command write the outbox collections?
 *
 * Thread: any (pure; publish/publish.c calls it on the forwarding loop).
 *
 * Publishing applications need the right to write the outbox collections
 * (the proxy's injected writes run in their own transactions, as their own
 * user), so the server cannot tell the proxy's writes from the client's.
 * The proxy can: its own writes never pass through the request hook.  This
 * module is the pure test the hook applies to every client command: given
 * the command (its body and kind-1 document sequences) and the outbox
 * namespace of the configuration, it says whether the command would write,
 * create, drop, rename or re-index an outbox collection, or drop the
 * outbox database.  Reads (find, aggregate without $out/$merge, count,
 * distinct, listIndexes, ...) are not writes: outbox_guard_reads tells
 * them, for pooled mode's [outbox] readers (publish/publish.c).
 *
 * Commands checked: insert, update, delete, findAndModify, bulkWrite (every
 * nsInfo namespace), aggregate with a $out or $merge stage into the outbox
 * (string or {db, coll} forms), mapReduce with `out` into it, drop,
 * dropDatabase of the outbox database, create, createIndexes, dropIndexes,
 * collMod, convertToCapped, cloneCollectionAsCapped (its target),
 * emptycapped, renameCollection (from or to) and applyOps (every operation's
 * namespace, and the commands it carries).
 *
 * No I/O, no allocation, no state: work is linear in the command's size.
 */
#ifndef RELAYBUS_OUTBOX_GUARD_H
#define RELAYBUS_OUTBOX_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "codec/wire.h"

/* Room for a verdict's description. */
#define OUTBOX_GUARD_WHY_MAX 256

/* The outbox namespace: the database and the collection prefix of the
 * configuration (both borrowed). */
typedef struct {
   const char *database;
   const char *prefix;
} outbox_guard_ns_t;

/* True when `body` (with its `nseq` kind-1 sequences, which may be NULL
 * when `nseq` is 0) writes the outbox namespace `ns`; `why` (when non-NULL)
 * then names the command and the collection, e.g. "insert into
 * relaybus.relaybus_events".  A command the server would reject as
 * malformed (a collection name of the wrong type, no $db) is not refused
 * here: the server answers it. */
bool outbox_guard_writes (const bson_t *body,
                          const wire_sequence_t *seqs,
                          uint32_t nseq,
                          const outbox_guard_ns_t *ns,
                          char *why,
                          size_t why_len);

/* True when `body` reads documents of an outbox collection of `ns`: a
 * find, count, distinct, mapReduce or getMore on one; an aggregate on one,
 * or whose pipeline reads one ($lookup, $graphLookup, $unionWith, also
 * inside $facet and nested pipelines); a change stream on the outbox
 * database or on the whole cluster (allChangesForCluster); a view created
 * or changed to read one; an explain of any of these.  `why` (when
 * non-NULL) names the command and the collection, e.g. "find on
 * relaybus.relaybus_events".  Pipelines nested deeper than a few levels
 * count as a read.  Linear in the command's size; no I/O, no state. */
bool outbox_guard_reads (const bson_t *body, const outbox_guard_ns_t *ns, char *why, size_t why_len);

/* Is `db`.`coll` (lengths given, not NUL-terminated) an outbox collection:
 * the outbox database and the prefix followed by one of the collection
 * suffixes of base/outbox.h? */
bool outbox_guard_is_outbox (const outbox_guard_ns_t *ns, const char *db, size_t db_len, const char *coll, size_t coll_len);

#endif /* RELAYBUS_OUTBOX_GUARD_H */
