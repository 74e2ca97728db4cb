/*
 * proxy/owners.c - whose cursors and sessions they are, in pooled mode
 * (proxy/owners.h).
 *
 * One process-wide table of owners, OWNERS_STRIPES stripes under a mutex
 * of their own, each stripe an open-addressed array probed OWNERS_PROBE
 * slots from the key's hash, keyed by what an id names and the id:
 * sessions by their 16-byte id, cursors by their id, users' pin counts by
 * the user's hash.  An entry holds a hash of the user name (64-bit FNV-1a; user names come
 * from the operator's auth file, not from clients) and when it was last
 * used.  The check is one function over one table of the commands that
 * name something (`named`): adding a command that names a cursor or a
 * session is adding a row.  The arrays are allocated the first time a logged-in pooled client
 * needs them, so session mode pays nothing.
 *
 * A reply's cursor id is read where it lies in the reply's buffer, by
 * walking the BSON element headers (a few small copies), never by making a
 * large reply contiguous: a find's firstBatch comes before its id.
 */
#include "proxy/owners.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>

#include "base/clock.h"
#include "base/config.h"
#include "base/keyhash.h"
#include "base/log.h"
#include "base/servercodes.h"
#include "proxy/conn_private.h"
#include "proxy/login.h"

#define OWNERS_STRIPES 16
#define OWNERS_PROBE 16
#define OWNERS_SESSION_TTL_MS (30 * 60000) /* logicalSessionTimeoutMinutes */
#define OWNERS_CURSOR_TTL_MS (10 * 60000)  /* cursorTimeoutMillis */

/* What an id names.  Operations are never entered: through the pool every
 * operation on the server is the pool's login's, and the proxy hides the
 * listings that would tell one user's from another's ($currentOp), so no
 * operation is any proxy user's and killOp is always refused. */
typedef enum {
   OWNED_FREE = 0,
   OWNED_SESSION,
   OWNED_CURSOR,
   OWNED_PINS, /* a user's count of pinned pool connections; key: the user's hash */
   OWNED_TXN,  /* the pool connections one transaction pins, on any loop; key: txn_key */
} owned_kind_t;

typedef struct {
   uint8_t key[16];   /* the session id; a cursor's id or a user's hash in the first 8 bytes */
   uint64_t user;     /* 0: free */
   int64_t used_ms;
   uint32_t pins;     /* OWNED_PINS: the count; the entry lives while it is not 0 */
   uint8_t kind;      /* owned_kind_t */
} entry_t;

typedef struct {
   pthread_mutex_t mu;
   entry_t *slots;
} stripe_t;

/* The one table of owners: sessions, cursors and pin counts side by side. */
static stripe_t stripes[OWNERS_STRIPES];
static const size_t per_stripe = OWNERS_ENTRIES / OWNERS_STRIPES;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* Each user's count of live sessions in the table, for
 * pool_max_sessions_per_user: a live session never gives up its slot, so
 * without a quota one user's fresh lsids could fill the table and every
 * other user's next session would be refused.  Entries expire lazily (a
 * slot is reused when found expired), so a user's count is kept by when
 * each session expires: a ring of QUOTA_BUCKETS buckets of QUOTA_BUCKET_MS,
 * the bucket of a session's expiry counting it; moving the ring forward
 * clears the buckets passed, so a session stops counting at most one
 * bucket after it expired, never before.  One record per user (auth-file
 * users: the operator's, so their number is too), QUOTA_USERS of them,
 * the least recently used given to a newcomer; the records take their own
 * mutex, always after a stripe's. */
#define QUOTA_BUCKET_MS 60000
#define QUOTA_BUCKETS (OWNERS_SESSION_TTL_MS / QUOTA_BUCKET_MS + 2)
#define QUOTA_USERS 4096
#define QUOTA_PROBE 8

typedef struct {
   uint64_t user; /* 0: free */
   int64_t epoch; /* the oldest bucket the ring holds (now_ms / QUOTA_BUCKET_MS) */
   int64_t used_ms;
   uint32_t n[QUOTA_BUCKETS];
} quota_t;

static pthread_mutex_t quota_mu = PTHREAD_MUTEX_INITIALIZER;
static quota_t *quotas;

static void
tables_init (void)
{
   for (size_t i = 0; i < OWNERS_STRIPES; i++) {
      pthread_mutex_init (&stripes[i].mu, NULL);
      stripes[i].slots = bson_malloc0 (per_stripe * sizeof (entry_t));
   }
   quotas = bson_malloc0 (QUOTA_USERS * sizeof (quota_t));
}

static uint64_t
user_hash (const char *user)
{
   uint64_t h = 14695981039346656037ull;

   for (; *user; user++)
      h = (h ^ (uint8_t) *user) * 1099511628211ull;
   return h ? h : 1;
}

static uint64_t
key_hash (const uint8_t key[16])
{
   /* Session ids are chosen by the client (drivers send random UUIDs, a
    * hostile one need not): keyed, so nobody can aim ids at one stripe's
    * probe window and evict other users' entries (base/keyhash.h). */
   return keyhash (key, 16);
}

static bool
entry_live (const entry_t *e, int64_t now)
{
   switch ((owned_kind_t) e->kind) {
   case OWNED_SESSION:
      return now - e->used_ms < OWNERS_SESSION_TTL_MS;
   case OWNED_CURSOR:
      return now - e->used_ms < OWNERS_CURSOR_TTL_MS;
   case OWNED_PINS:
   case OWNED_TXN:
      return e->pins > 0;
   case OWNED_FREE:
   default:
      return false;
   }
}

/* ------------------------------------------------------------ quotas */

/* `user`'s record (under quota_mu), its ring moved to now; with `create`,
 * a free record or the least recently used of the neighbourhood. */
static quota_t *
quota_find (uint64_t user, int64_t now, bool create)
{
   quota_t *victim = NULL, *q = NULL;
   int64_t e = now / QUOTA_BUCKET_MS;

   for (unsigned i = 0; i < QUOTA_PROBE; i++) {
      quota_t *c = &quotas[(user + i) % QUOTA_USERS];
      if (c->user == user) {
         q = c;
         break;
      }
      if (!victim || (victim->user && (!c->user || c->used_ms < victim->used_ms)))
         victim = c;
   }
   if (!q) {
      if (!create)
         return NULL;
      q = victim;
      memset (q, 0, sizeof *q);
      q->user = user;
      q->epoch = e;
   }
   if (e > q->epoch) {
      if (e - q->epoch >= QUOTA_BUCKETS)
         memset (q->n, 0, sizeof q->n);
      else
         for (int64_t b = q->epoch; b < e; b++)
            q->n[b % QUOTA_BUCKETS] = 0;
      q->epoch = e;
   }
   q->used_ms = now;
   return q;
}

static uint32_t
quota_sum (const quota_t *q)
{
   uint32_t sum = 0;

   for (int i = 0; i < QUOTA_BUCKETS; i++)
      sum += q->n[i];
   return sum;
}

/* A session of `user` used at `used_ms` counts in its expiry's bucket. */
static int64_t
quota_bucket (int64_t used_ms)
{
   return (used_ms + OWNERS_SESSION_TTL_MS) / QUOTA_BUCKET_MS;
}

/* Moves one of `user`'s sessions from the bucket of `from_ms`'s use to
 * that of `to_ms`'s (0: none, as for a new or a gone session). */
static void
quota_move (uint64_t user, int64_t from_ms, int64_t to_ms, int64_t now)
{
   quota_t *q;

   if (!user || (from_ms && to_ms && quota_bucket (from_ms) == quota_bucket (to_ms)))
      return;
   pthread_mutex_lock (&quota_mu);
   q = quota_find (user, now, to_ms != 0);
   if (q) {
      if (from_ms && quota_bucket (from_ms) >= q->epoch && q->n[quota_bucket (from_ms) % QUOTA_BUCKETS] > 0)
         q->n[quota_bucket (from_ms) % QUOTA_BUCKETS]--;
      if (to_ms)
         q->n[quota_bucket (to_ms) % QUOTA_BUCKETS]++;
   }
   pthread_mutex_unlock (&quota_mu);
}

/* `user`'s live sessions. */
static uint32_t
quota_count (uint64_t user, int64_t now)
{
   quota_t *q;
   uint32_t n = 0;

   pthread_mutex_lock (&quota_mu);
   q = quota_find (user, now, false);
   if (q)
      n = quota_sum (q);
   pthread_mutex_unlock (&quota_mu);
   return n;
}

typedef enum {
   TABLE_GET,    /* look it up */
   TABLE_TOUCH,  /* look it up; an entry of `user` is used now (it expires later) */
   TABLE_CLAIM,  /* look it up; absent, it becomes `user`'s */
   TABLE_FORGET, /* look it up and remove it */
} table_op_t;

/* The live entry of (`kind`, `key`) in its probe window of stripe `st`
 * (under its mutex), or NULL; *free_slot is then the window's first free
 * or expired slot, *lru its least recently used cursor (NULL: none). */
static entry_t *
probe (stripe_t *st, uint64_t h, owned_kind_t kind, const uint8_t key[16], int64_t now, entry_t **free_slot,
       entry_t **lru)
{
   *free_slot = NULL;
   *lru = NULL;
   for (size_t i = 0; i < OWNERS_PROBE; i++) {
      entry_t *e = &st->slots[(h / OWNERS_STRIPES + i) % per_stripe];
      bool live = entry_live (e, now);

      if (live && e->kind == kind && memcmp (e->key, key, 16) == 0)
         return e;
      if (!live && !*free_slot)
         *free_slot = e;
      if (live && e->kind == OWNED_CURSOR && (!*lru || e->used_ms < (*lru)->used_ms))
         *lru = e;
   }
   return NULL;
}

/* The owner of (`kind`, `key`): 0 when absent or expired.  TABLE_TOUCH
 * refreshes an entry of `user`; TABLE_CLAIM does too, and enters an absent
 * one (then the result is `user`); an entry of another user stays theirs.  A claim finds room
 * in a free or expired slot, else takes the least recently used cursor's
 * (that cursor can then be used by nobody through the proxy: refused, it
 * expires on the server); a live session never gives up its slot, since
 * the next user to name it would become its owner.  No room: 0, *full set.
 * A new session of a user who has `max_sessions` live ones (0: no quota)
 * is not entered either: 0, *over set. */
static uint64_t
table_op_quota (owned_kind_t kind, const uint8_t key[16], uint64_t user, table_op_t op, uint32_t max_sessions, bool *full,
                bool *over)
{
   uint64_t h = key_hash (key), found = 0;
   stripe_t *st = &stripes[h % OWNERS_STRIPES];
   int64_t now = clock_mono_ms ();
   entry_t *free_slot = NULL, *lru = NULL, *hit = NULL;

   if (full)
      *full = false;
   if (over)
      *over = false;
   pthread_once (&tables_once, tables_init);
   pthread_mutex_lock (&st->mu);
   hit = probe (st, h, kind, key, now, &free_slot, &lru);
   if (hit) {
      found = hit->user;
      if (op == TABLE_FORGET) {
         hit->kind = OWNED_FREE;
         if (kind == OWNED_SESSION)
            quota_move (hit->user, hit->used_ms, 0, now);
      } else if ((op == TABLE_CLAIM || op == TABLE_TOUCH) && hit->user == user) {
         if (kind == OWNED_SESSION)
            quota_move (user, hit->used_ms, now, now);
         hit->used_ms = now;
      }
   } else if (op == TABLE_CLAIM && user != 0 && kind == OWNED_SESSION && max_sessions > 0 &&
              quota_count (user, now) >= max_sessions) {
      if (over)
         *over = true;
   } else if (op == TABLE_CLAIM && user != 0) {
      entry_t *e = free_slot ? free_slot : lru;
      if (e && kind == OWNED_SESSION)
         quota_move (user, 0, now, now);
      if (e) {
         memcpy (e->key, key, 16);
         e->kind = (uint8_t) kind;
         e->user = user;
         e->used_ms = now;
         e->pins = 0;
         found = user;
      } else if (full) {
         *full = true;
      }
   }
   pthread_mutex_unlock (&st->mu);
   return found;
}

static uint64_t
table_op (owned_kind_t kind, const uint8_t key[16], uint64_t user, table_op_t op, bool *full)
{
   return table_op_quota (kind, key, user, op, 0, full, NULL);
}

static void
id_key (int64_t id, uint8_t key[16])
{
   memset (key, 0, 16);
   memcpy (key, &id, sizeof id);
}

bool
owners_enabled (const client_conn_t *c)
{
   return c->loop->pool && login_user (c);
}

uint64_t
owners_user (const client_conn_t *c)
{
   return owners_enabled (c) ? user_hash (login_user (c)) : 0;
}

/* The 16-byte id of a session document {id: UUID}. */
static bool
lsid_of (bson_iter_t *doc_it, uint8_t out[16])
{
   bson_iter_t child;
   bson_subtype_t sub;
   uint32_t len;
   const uint8_t *data;

   if (!BSON_ITER_HOLDS_DOCUMENT (doc_it) || !bson_iter_recurse (doc_it, &child) || !bson_iter_find (&child, "id") ||
       !BSON_ITER_HOLDS_BINARY (&child))
      return false;
   bson_iter_binary (&child, &sub, &len, &data);
   if (len != 16)
      return false;
   memcpy (out, data, 16);
   return true;
}

/* ------------------------------------------------------------ the check */

/* How a command names what it acts on, besides the lsid every command may
 * carry.  This table is the whole list: a command not in it names nothing
 * but its lsid. */
typedef enum {
   NAMES_CURSOR,        /* getMore: its own value is a cursor id */
   NAMES_CURSORS,       /* killCursors: the array `cursors` */
   NAMES_SESSIONS,      /* killSessions, endSessions, refreshSessions: the array that is its own value */
   NAMES_OPERATION,     /* killOp: `op` */
   NAMES_EVERYONE,      /* what acts on, or shows, every user's sessions or operations */
} names_t;

static const struct {
   const char *cmd;
   names_t names;
   bool forgets; /* once forwarded, what it names is gone (owners_note_request) */
} named[] = {
   {"getMore", NAMES_CURSOR, false},
   {"killCursors", NAMES_CURSORS, true},
   {"killSessions", NAMES_SESSIONS, true},
   {"endSessions", NAMES_SESSIONS, true},
   {"refreshSessions", NAMES_SESSIONS, false},
   {"killOp", NAMES_OPERATION, false},
   {"killAllSessions", NAMES_EVERYONE, false},
   {"killAllSessionsByPattern", NAMES_EVERYONE, false},
   {"currentOp", NAMES_EVERYONE, false},
};

/* The aggregation stages that list every user's sessions or operations.
 * The database `config` holds every user's session ids and transactions
 * (system.sessions, transactions, image_collection), and a pipeline there
 * can read one collection from another ($lookup, $unionWith): all of it
 * is refused rather than some collections. */
static const char *const everyone_stages[] = {"$currentOp", "$listLocalSessions", "$listSessions"};

static int
named_find (const char *cmd)
{
   for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
      if (strcmp (named[i].cmd, cmd) == 0)
         return (int) i;
   return -1;
}

static const char *
db_of (const bson_t *body)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, body, "$db") && BSON_ITER_HOLDS_UTF8 (&it) ? bson_iter_utf8 (&it, NULL) : "?";
}

/* Whether `body` (an aggregate, or anything on `config`) shows or changes
 * every user's sessions or operations. */
static bool
shows_everyone (const bson_t *body, const char *cmd)
{
   bson_iter_t it, stage;

   if (strcmp (db_of (body), "config") == 0)
      return true;
   if (strcmp (cmd, "aggregate") != 0 || !bson_iter_init_find (&it, body, "pipeline") || !BSON_ITER_HOLDS_ARRAY (&it) ||
       !bson_iter_recurse (&it, &stage) || !bson_iter_next (&stage) || !BSON_ITER_HOLDS_DOCUMENT (&stage) ||
       !bson_iter_recurse (&stage, &it) || !bson_iter_next (&it))
      return false;
   for (size_t i = 0; i < sizeof everyone_stages / sizeof everyone_stages[0]; i++)
      if (strcmp (bson_iter_key (&it), everyone_stages[i]) == 0)
         return true;
   return false;
}

/* The refusal of a request naming what is not the user's. */
static owners_verdict_t
refuse (owners_refusal_t *r, server_code_t code, const char *fmt, ...) BSON_GNUC_PRINTF (3, 4);

static owners_verdict_t
refuse (owners_refusal_t *r, server_code_t code, const char *fmt, ...)
{
   va_list ap;

   r->code = code;
   r->code_name = server_code_name (code);
   va_start (ap, fmt);
   bson_vsnprintf (r->why, sizeof r->why, fmt, ap);
   va_end (ap);
   return OWNERS_REFUSE;
}

/* mongod's answer to a command its user may not run. */
static owners_verdict_t
refuse_command (owners_refusal_t *r, const bson_t *body, const char *cmd)
{
   return refuse (r, SERVER_UNAUTHORIZED, "not authorized on %.100s to execute command { %.60s: ... }",
                  db_of (body), cmd);
}

/* The first element's value, when it is a string (a collection's name). */
static const char *
coll_of (const bson_t *body)
{
   bson_iter_t it;

   return bson_iter_init (&it, body) && bson_iter_next (&it) && BSON_ITER_HOLDS_UTF8 (&it) ? bson_iter_utf8 (&it, NULL)
                                                                                           : "?";
}

/* Whether cursor `id` is the user's.  Cursor 0 is no cursor: the server
 * answers it.  Its use keeps the entry alive as the server keeps the
 * cursor: a change stream's getMores run for hours. */
static bool
cursor_owned (const bson_iter_t *it, uint64_t user, int64_t *id)
{
   uint8_t key[16];

   if (BSON_ITER_HOLDS_DOUBLE (it)) {
      /* Converted only in range (a cast out of it is undefined): no
       * cursor of anyone's has another id. */
      double d = bson_iter_double (it);
      *id = d > -9.2e18 && d < 9.2e18 ? (int64_t) d : INT64_MAX;
   } else {
      *id = BSON_ITER_HOLDS_NUMBER (it) ? bson_iter_as_int64 (it) : 0;
   }
   id_key (*id, key);
   return *id == 0 || table_op (OWNED_CURSOR, key, user, TABLE_TOUCH, NULL) == user;
}

/* Whether the session {id: UUID} at `it` is the user's; with `claim`, a
 * session nobody used becomes the user's (*full: no room for it; *over:
 * the user has max_sessions already). */
static bool
session_owned (bson_iter_t *it, uint64_t user, bool claim, uint32_t max_sessions, bool *full, bool *over)
{
   uint8_t key[16];

   *full = false;
   *over = false;
   if (!lsid_of (it, key))
      return true; /* malformed: the server refuses it */
   return table_op_quota (OWNED_SESSION, key, user, claim ? TABLE_CLAIM : TABLE_TOUCH, max_sessions, full, over) == user;
}

owners_verdict_t
owners_check (client_conn_t *c, const bson_t *body, const char *cmd, owners_refusal_t *r)
{
   return owners_check_user (owners_user (c), (uint32_t) c->loop->cfg->pool_max_sessions_per_user, body, cmd, r);
}

owners_verdict_t
owners_check_user (uint64_t user, uint32_t max_sessions, const bson_t *body, const char *cmd, owners_refusal_t *r)
{
   bson_iter_t it, arr;
   bool full, over;
   int64_t id;
   int n;

   if (!cmd || !user)
      return OWNERS_ALLOW;
   n = named_find (cmd);
   if (shows_everyone (body, cmd) || (n >= 0 && named[n].names == NAMES_EVERYONE))
      return refuse_command (r, body, cmd);
   if (n >= 0)
      switch (named[n].names) {
      case NAMES_CURSOR:
         if (bson_iter_init (&it, body) && bson_iter_next (&it) && !cursor_owned (&it, user, &id))
            return refuse (r, SERVER_UNAUTHORIZED,
                           "cursor id %" PRId64 " was not created by the authenticated user", id);
         break;
      case NAMES_CURSORS:
         if (bson_iter_init_find (&it, body, "cursors") && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &arr))
            while (bson_iter_next (&arr))
               if (!cursor_owned (&arr, user, &id))
                  return refuse (r, SERVER_UNAUTHORIZED, "not authorized to kill cursor on %.100s.%.100s",
                                 db_of (body), coll_of (body));
         break;
      case NAMES_SESSIONS:
         /* Without ids, killSessions ends every user's sessions. */
         if (!bson_iter_init_find (&it, body, cmd) || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
            break; /* malformed: the server refuses it */
         if (strcmp (cmd, "killSessions") == 0 && !bson_iter_next (&arr))
            return refuse_command (r, body, cmd);
         (void) bson_iter_recurse (&it, &arr);
         while (bson_iter_next (&arr))
            if (!session_owned (&arr, user, false, 0, &full, &over))
               return refuse_command (r, body, cmd);
         break;
      case NAMES_OPERATION:
         return refuse (r, SERVER_UNAUTHORIZED, "Unauthorized");
      case NAMES_EVERYONE:
      default:
         break;
      }
   /* The session the command runs in, and so its transaction. */
   if (bson_iter_init_find (&it, body, "lsid") && !session_owned (&it, user, true, max_sessions, &full, &over)) {
      if (full)
         return refuse (r, SERVER_TOO_MANY_LOGICAL_SESSIONS,
                        "Unable to add session into the cache because the number of active sessions is too high");
      if (over)
         return refuse (r, SERVER_TOO_MANY_LOGICAL_SESSIONS,
                        "Unable to add session into the cache because the number of active sessions is too high "
                        "(relaybus: this user has pool_max_sessions_per_user = %u sessions in use through the proxy; "
                        "end some, or wait until they expire after 30 minutes unused)",
                        max_sessions);
      return refuse_command (r, body, cmd);
   }
   return OWNERS_ALLOW;
}

void
owners_note_request (client_conn_t *c, const bson_t *body, const char *cmd)
{
   bson_iter_t it, arr;
   uint8_t key[16];
   int n;

   if (!cmd || !owners_enabled (c) || (n = named_find (cmd)) < 0 || !named[n].forgets)
      return;
   if (!bson_iter_init_find (&it, body, named[n].names == NAMES_CURSORS ? "cursors" : cmd) ||
       !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
      return;
   while (bson_iter_next (&arr)) {
      if (named[n].names == NAMES_CURSORS) {
         id_key (BSON_ITER_HOLDS_NUMBER (&arr) ? bson_iter_as_int64 (&arr) : 0, key);
         (void) table_op (OWNED_CURSOR, key, 0, TABLE_FORGET, NULL);
      } else if (lsid_of (&arr, key)) {
         (void) table_op (OWNED_SESSION, key, 0, TABLE_FORGET, NULL);
      }
   }
}

/* ------------------------------------------------------------ pins */

/* The count of entry (`kind`, `key`) of `user`, changed by `delta` (0:
 * read): a user's pinned connections (OWNED_PINS) or a transaction's
 * (OWNED_TXN).  An entry lives while its count is not 0; with no room for
 * it (a neighbourhood of live sessions), the change goes uncounted.  The
 * change made goes to *changed (may be NULL): delta, less when the count
 * stops at 0, or 0 when uncounted. */
static unsigned
count_op (owned_kind_t kind, const uint8_t key[16], uint64_t user, int delta, int *changed)
{
   uint64_t h = key_hash (key);
   stripe_t *st = &stripes[h % OWNERS_STRIPES];
   entry_t *hit, *free_slot = NULL, *lru = NULL;
   int64_t now = clock_mono_ms ();
   unsigned n = 0;
   int done = 0;

   pthread_once (&tables_once, tables_init);
   pthread_mutex_lock (&st->mu);
   hit = probe (st, h, kind, key, now, &free_slot, &lru);
   if (!hit && delta > 0 && (hit = free_slot ? free_slot : lru)) {
      memcpy (hit->key, key, 16);
      hit->kind = (uint8_t) kind;
      hit->user = user;
      hit->pins = 0;
   }
   if (hit) {
      done = delta < 0 && hit->pins < (unsigned) -delta ? -(int) hit->pins : delta;
      hit->pins = (unsigned) ((int64_t) hit->pins + done);
      hit->used_ms = now;
      n = hit->pins;
      if (n == 0)
         hit->kind = OWNED_FREE;
   }
   pthread_mutex_unlock (&st->mu);
   if (changed)
      *changed = done;
   return n;
}

/* A user's count of pinned connections, changed by `delta`. */
static unsigned
pins_op (uint64_t user, int delta)
{
   uint8_t key[16];

   if (!user)
      return 0;
   id_key ((int64_t) user, key);
   return count_op (OWNED_PINS, key, user, delta, NULL);
}

unsigned
owners_pins (uint64_t user)
{
   return pins_op (user, 0);
}

/* The key of a user's transaction (lsid, txnNumber): a keyed hash of both
 * in the first 8 bytes, the user's hash in the last 8. */
static void
txn_key (uint64_t user, const uint8_t lsid[16], int64_t txn_number, uint8_t key[16])
{
   uint8_t buf[24];
   uint64_t h;

   memcpy (buf, lsid, 16);
   memcpy (buf + 16, &txn_number, 8);
   h = keyhash (buf, sizeof buf);
   memcpy (key, &h, 8);
   memcpy (key + 8, &user, 8);
}

/* The transaction's count is the one the user's follows: a pin the
 * transaction's entry did not count (no room), or one owners_txn_ended
 * took off already, changes the user's count neither. */
void
owners_pin (uint64_t user, const uint8_t lsid[16], int64_t txn_number, bool on)
{
   uint8_t key[16];
   int changed;

   if (!user)
      return;
   txn_key (user, lsid, txn_number, key);
   (void) count_op (OWNED_TXN, key, user, on ? 1 : -1, &changed);
   if (changed)
      (void) pins_op (user, changed);
}

void
owners_txn_ended (uint64_t user, const uint8_t lsid[16], int64_t txn_number)
{
   uint8_t key[16];
   int changed;

   if (!user)
      return;
   txn_key (user, lsid, txn_number, key);
   (void) count_op (OWNED_TXN, key, user, -INT_MAX, &changed);
   if (changed)
      (void) pins_op (user, changed);
}

bool
owners_txn_pinned (uint64_t user, const uint8_t lsid[16], int64_t txn_number)
{
   uint8_t key[16];

   if (!user)
      return false;
   txn_key (user, lsid, txn_number, key);
   return count_op (OWNED_TXN, key, user, 0, NULL) > 0;
}


bool
owners_opens_cursors (const char *cmd)
{
   if (!cmd)
      return false;
   switch (cmd[0]) {
   case 'f':
      return strcmp (cmd, "find") == 0;
   case 'a':
      return strcmp (cmd, "aggregate") == 0;
   case 'l':
      return strcmp (cmd, "listCollections") == 0 || strcmp (cmd, "listIndexes") == 0 ||
             strcmp (cmd, "listSearchIndexes") == 0;
   case 'b':
      return strcmp (cmd, "bulkWrite") == 0;
   default:
      return false;
   }
}

/* ------------------------------------------------------------ replies */

static bool
copy_at (struct evbuffer *in, size_t off, void *out, size_t n)
{
   struct evbuffer_ptr p;

   if (evbuffer_ptr_set (in, &p, off, EVBUFFER_PTR_SET) < 0)
      return false;
   return evbuffer_copyout_from (in, &p, out, n) == (ssize_t) n;
}

static bool
le32_at (struct evbuffer *in, size_t off, int32_t *v)
{
   uint8_t b[4];

   if (!copy_at (in, off, b, 4))
      return false;
   *v = (int32_t) ((uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16 | (uint32_t) b[3] << 24);
   return true;
}

/* The end of the C string at `off` (the offset past its NUL), below `end`. */
static bool
cstring_end (struct evbuffer *in, size_t off, size_t end, size_t *after)
{
   struct evbuffer_ptr start, found;

   if (evbuffer_ptr_set (in, &start, off, EVBUFFER_PTR_SET) < 0)
      return false;
   found = evbuffer_search_range (in, "", 1, &start, NULL);
   if (found.pos < 0 || (size_t) found.pos >= end)
      return false;
   *after = (size_t) found.pos + 1;
   return true;
}

/* The length of a value of BSON type `type` at `off`. */
static bool
value_len (struct evbuffer *in, uint8_t type, size_t off, size_t end, size_t *len)
{
   int32_t n;
   size_t a;

   switch (type) {
   case 0x01: case 0x09: case 0x11: case 0x12:
      *len = 8;
      return true;
   case 0x02: case 0x0D: case 0x0E:
      if (!le32_at (in, off, &n) || n < 1)
         return false;
      *len = 4 + (size_t) n;
      return true;
   case 0x03: case 0x04: case 0x0F:
      if (!le32_at (in, off, &n) || n < 5)
         return false;
      *len = (size_t) n;
      return true;
   case 0x05:
      if (!le32_at (in, off, &n) || n < 0)
         return false;
      *len = 5 + (size_t) n;
      return true;
   case 0x06: case 0x0A: case 0x7F: case 0xFF:
      *len = 0;
      return true;
   case 0x07:
      *len = 12;
      return true;
   case 0x08:
      *len = 1;
      return true;
   case 0x0B:
      if (!cstring_end (in, off, end, &a) || !cstring_end (in, a, end, &a))
         return false;
      *len = a - off;
      return true;
   case 0x0C:
      if (!le32_at (in, off, &n) || n < 1)
         return false;
      *len = 4 + (size_t) n + 12;
      return true;
   case 0x10:
      *len = 4;
      return true;
   case 0x13:
      *len = 16;
      return true;
   default:
      return false;
   }
}

/* Finds element `name` of the document at `doc`; its type and where its
 * value starts. */
static bool
find_element (struct evbuffer *in, size_t doc, size_t limit, const char *name, uint8_t *type, size_t *value)
{
   int32_t dlen;
   size_t off, end, vlen, nlen = strlen (name);
   char key[32];

   if (!le32_at (in, doc, &dlen) || dlen < 5 || doc + (size_t) dlen > limit)
      return false;
   end = doc + (size_t) dlen - 1;
   for (off = doc + 4; off < end;) {
      uint8_t t;
      size_t after;
      if (!copy_at (in, off, &t, 1) || !cstring_end (in, off + 1, end, &after))
         return false;
      if (after - off - 2 == nlen && nlen < sizeof key && copy_at (in, off + 1, key, nlen) && memcmp (key, name, nlen) == 0) {
         *type = t;
         *value = after;
         return true;
      }
      if (!value_len (in, t, after, end, &vlen))
         return false;
      off = after + vlen;
   }
   return false;
}

void
owners_note_reply (client_conn_t *c, struct evbuffer *in, size_t len)
{
   uint8_t kind, type, key[16];
   size_t cursor, id_at;
   int64_t id;

   if (!owners_enabled (c) || len < WIRE_HEADER_LEN + 5 + 5)
      return;
   /* header, flagBits, the body section's kind byte (0), the body */
   if (!copy_at (in, WIRE_HEADER_LEN + 4, &kind, 1) || kind != 0)
      return;
   if (!find_element (in, WIRE_HEADER_LEN + 5, len, "cursor", &type, &cursor) || type != 0x03 ||
       !find_element (in, cursor, len, "id", &type, &id_at) || type != 0x12 || !copy_at (in, id_at, &id, 8))
      return;
   id = BSON_UINT64_FROM_LE (id);
   if (id == 0)
      return;
   id_key (id, key);
   (void) table_op (OWNED_CURSOR, key, user_hash (login_user (c)), TABLE_CLAIM, NULL);
}
