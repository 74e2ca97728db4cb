/*
 * proxy/owners.c - whose cursors and sessions they are, in pooled mode
 * (proxy/owners.h).
 *
 * Two process-wide tables, each OWNERS_STRIPES stripes under a mutex of
 * their own, each stripe an open-addressed array probed OWNERS_PROBE slots
 * from the key's hash: sessions by their 16-byte id, cursors by their id.
 * An entry holds a hash of the user name (64-bit FNV-1a; user names come
 * from the operator's auth file, not from clients) and when it was last
 * used.  The arrays are allocated the first time a logged-in pooled client
 * needs them, so session mode pays nothing.
 *
 * A reply's cursor id is read where it lies in the reply's buffer, by
 * walking the BSON element headers (a few small copies), never by making a
 * large reply contiguous: a find's firstBatch comes before its id.
 */
#include "proxy/owners.h"

#include <inttypes.h>
#include <pthread.h>
#include <string.h>

#include "base/clock.h"
#include "base/config.h"
#include "base/keyhash.h"
#include "base/log.h"
#include "proxy/conn_private.h"
#include "proxy/login.h"

#define OWNERS_STRIPES 16
#define OWNERS_PROBE 16
#define OWNERS_SESSION_TTL_MS (30 * 60000) /* logicalSessionTimeoutMinutes */
#define OWNERS_CURSOR_TTL_MS (10 * 60000)  /* cursorTimeoutMillis */

typedef struct {
   uint8_t key[16];   /* the session id; a cursor's id in the first 8 bytes */
   uint64_t user;     /* 0: free */
   int64_t used_ms;
} entry_t;

typedef struct {
   pthread_mutex_t mu;
   entry_t *slots;
} stripe_t;

typedef struct {
   stripe_t stripes[OWNERS_STRIPES];
   size_t per_stripe;
   int64_t ttl_ms;
} table_t;

static table_t sessions = {.per_stripe = OWNERS_SESSIONS / OWNERS_STRIPES, .ttl_ms = OWNERS_SESSION_TTL_MS};
static table_t cursors = {.per_stripe = OWNERS_CURSORS / OWNERS_STRIPES, .ttl_ms = OWNERS_CURSOR_TTL_MS};
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void
tables_init (void)
{
   table_t *tables[] = {&sessions, &cursors};

   for (size_t t = 0; t < 2; t++)
      for (size_t i = 0; i < OWNERS_STRIPES; i++) {
         pthread_mutex_init (&tables[t]->stripes[i].mu, NULL);
         tables[t]->stripes[i].slots = bson_malloc0 (tables[t]->per_stripe * sizeof (entry_t));
      }
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

/* `key`'s entry: its user (0 when absent or expired).  With `set`, an
 * absent entry becomes `set`'s and an entry of `set` is refreshed (an
 * entry of another user stays theirs); with `forget`, it goes. */
static uint64_t
table_op (table_t *t, const uint8_t key[16], uint64_t set, bool forget)
{
   uint64_t h = key_hash (key), found = 0;
   stripe_t *st = &t->stripes[h % OWNERS_STRIPES];
   int64_t now = clock_mono_ms ();
   entry_t *free_slot = NULL, *lru = NULL, *hit = NULL;

   pthread_once (&tables_once, tables_init);
   pthread_mutex_lock (&st->mu);
   for (size_t i = 0; i < OWNERS_PROBE; i++) {
      entry_t *e = &st->slots[(h / OWNERS_STRIPES + i) % t->per_stripe];
      bool live = e->user && now - e->used_ms < t->ttl_ms;
      if (live && memcmp (e->key, key, 16) == 0) {
         hit = e;
         break;
      }
      if (!live && !free_slot)
         free_slot = e;
      if (live && (!lru || e->used_ms < lru->used_ms))
         lru = e;
   }
   if (hit) {
      found = hit->user;
      if (forget)
         hit->user = 0;
      else if (set && hit->user == set)
         hit->used_ms = now;
   } else if (set) {
      entry_t *e = free_slot ? free_slot : lru;
      memcpy (e->key, key, 16);
      e->user = set;
      e->used_ms = now;
   }
   pthread_mutex_unlock (&st->mu);
   return found;
}

static void
cursor_key (int64_t id, uint8_t key[16])
{
   memset (key, 0, 16);
   memcpy (key, &id, sizeof id);
}

bool
owners_enabled (const client_conn_t *c)
{
   return c->loop->pool && login_user (c);
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

void
owners_note_session (client_conn_t *c, const bson_t *body)
{
   bson_iter_t it;
   uint8_t key[16];

   if (!owners_enabled (c) || !bson_iter_init_find (&it, body, "lsid") || !lsid_of (&it, key))
      return;
   /* A session first sent by another user stays that user's. */
   (void) table_op (&sessions, key, user_hash (login_user (c)), false);
}

/* Each session of the array `name` in `body`: whether all are the user's
 * (*n counts them); with `forget`, those are forgotten. */
static bool
sessions_owned (const bson_t *body, const char *name, uint64_t user, bool forget, unsigned *n)
{
   bson_iter_t it, arr;
   uint8_t key[16];

   *n = 0;
   if (!bson_iter_init_find (&it, body, name) || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
      return false;
   while (bson_iter_next (&arr)) {
      (*n)++;
      if (!lsid_of (&arr, key) || table_op (&sessions, key, 0, false) != user)
         return false;
   }
   if (forget && bson_iter_recurse (&it, &arr))
      while (bson_iter_next (&arr))
         if (lsid_of (&arr, key))
            (void) table_op (&sessions, key, 0, true);
   return true;
}

owners_verdict_t
owners_check (client_conn_t *c, const bson_t *body, const char *cmd, char *why, size_t why_len)
{
   uint64_t user;
   unsigned n;

   if (!cmd || (cmd[0] != 'k' && cmd[0] != 'e'))
      return OWNERS_ALLOW;
   if (!owners_enabled (c))
      return OWNERS_ALLOW;
   user = user_hash (login_user (c));
   if (strcmp (cmd, "killCursors") == 0) {
      bson_iter_t it, arr;
      uint8_t key[16];
      if (!bson_iter_init_find (&it, body, "cursors") || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
         return OWNERS_ALLOW; /* malformed: the server refuses it */
      while (bson_iter_next (&arr)) {
         int64_t id = BSON_ITER_HOLDS_NUMBER (&arr) ? bson_iter_as_int64 (&arr) : 0;
         cursor_key (id, key);
         if (id != 0 && table_op (&cursors, key, 0, false) != user) {
            bson_snprintf (why, why_len,
                           "relaybus: not authorized to kill cursor %" PRId64
                           ": it was not opened by user %.100s through this proxy",
                           id, login_user (c));
            return OWNERS_REFUSE;
         }
      }
      (void) bson_iter_recurse (&it, &arr);
      while (bson_iter_next (&arr)) {
         cursor_key (BSON_ITER_HOLDS_NUMBER (&arr) ? bson_iter_as_int64 (&arr) : 0, key);
         (void) table_op (&cursors, key, 0, true);
      }
      return OWNERS_ALLOW;
   }
   if (strcmp (cmd, "killAllSessions") == 0 || strcmp (cmd, "killAllSessionsByPattern") == 0) {
      bson_snprintf (why, why_len,
                     "relaybus: %s would end the sessions of every client of the pooled proxy; name the sessions "
                     "with killSessions",
                     cmd);
      return OWNERS_REFUSE;
   }
   if (strcmp (cmd, "killSessions") == 0) {
      if (!sessions_owned (body, "killSessions", user, true, &n) || n == 0) {
         bson_snprintf (why, why_len,
                        n == 0 ? "relaybus: killSessions without session ids would end the sessions of every client of "
                                 "the pooled proxy; name the sessions"
                               : "relaybus: not authorized to kill a session that user %.100s did not use through this "
                                 "proxy",
                        login_user (c));
         return OWNERS_REFUSE;
      }
      return OWNERS_ALLOW;
   }
   if (strcmp (cmd, "endSessions") == 0) {
      if (!sessions_owned (body, "endSessions", user, true, &n))
         return OWNERS_ANSWER_OK;
      return OWNERS_ALLOW;
   }
   return OWNERS_ALLOW;
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
   cursor_key (id, key);
   (void) table_op (&cursors, key, user_hash (login_user (c)), false);
}
