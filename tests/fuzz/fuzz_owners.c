/*
 * fuzz_owners.c - libFuzzer target for what a pooled client's request meets
 * before it may take a pooled connection: pool_admit's peek at the raw
 * request (proxy/pool.h), the pre-login gate (login_gate_local,
 * proxy/login.h) and the owners' check (owners_check_user,
 * proxy/owners.h), in that order, as pool_admit runs them.
 *
 * Input: records, each a flags byte, a 16-bit little-endian length N and N
 * bytes: what follows the 16-byte header of one message, whose header
 * this target writes (messageLength 16 + N).  Flags: bits 0-1 the user
 * (0: none, so nothing is checked; 1-3: three users), bit 2: the client
 * must still log in, bit 3: the opcode is OP_COMPRESSED instead of OP_MSG.
 * The owners' table persists from record to record and input to input, as
 * it does in the process, so one record's session is another's to steal.
 *
 * Oracles (abort() on failure):
 *   - the peek reads only OP_MSG whose first section is the body, within
 *     the first 64 KiB; its command is the body's first key;
 *   - before a login nothing takes the pool: the gate answers locally
 *     whatever the peek read or could not read; after it, only hello, the
 *     login commands, logout and connectionStatus, never an unread request;
 *   - a refusal is 13 Unauthorized or 261 TooManyLogicalSessions with an
 *     errmsg; killOp, killAllSessions, killAllSessionsByPattern and
 *     currentOp are always refused, and so is a getMore of a non-zero
 *     cursor (no reply ever opened one for these users);
 *   - a session a user's allowed request named is that user's: the same
 *     user may name it again, every other user is refused with 13;
 *   - the check gives the same verdict twice in a row.
 */
#include <stdint.h>
#include <string.h>

#include <bson/bson.h>
#include <event2/buffer.h>

#include "codec/wire.h"
#include "fuzz_util.h"
#include "proxy/login.h"
#include "proxy/owners.h"
#include "proxy/pool.h"

#define PEEK_MAX (64 * 1024)
#define USERS 3

static const char *const local_before_login[] = {
   "hello", "isMaster", "ismaster", "saslStart", "saslContinue", "authenticate", "logout", "connectionStatus",
};
static const char *const always_refused[] = {"killOp", "killAllSessions", "killAllSessionsByPattern", "currentOp"};

static bool
in_list (const char *cmd, const char *const *list, size_t n)
{
   for (size_t i = 0; i < n; i++)
      if (strcmp (cmd, list[i]) == 0)
         return true;
   return false;
}

static void
check_refusal (owners_verdict_t v, const owners_refusal_t *r)
{
   if (v != OWNERS_REFUSE)
      return;
   CHECK (r->code == 13 || r->code == 261);
   CHECK (strcmp (r->code_name, r->code == 13 ? "Unauthorized" : "TooManyLogicalSessions") == 0);
   CHECK (memchr (r->why, '\0', sizeof r->why) != NULL && r->why[0] != '\0');
}

/* The body's lsid as a request of its own: {ping: 1, lsid: {id: <16 bytes>}}. */
static bool
lsid_request (const bson_t *body, bson_t *out)
{
   bson_iter_t it, child;
   bson_subtype_t sub;
   uint32_t len;
   const uint8_t *data;
   bson_t lsid;

   if (!bson_iter_init_find (&it, body, "lsid") || !BSON_ITER_HOLDS_DOCUMENT (&it) || !bson_iter_recurse (&it, &child) ||
       !bson_iter_find (&child, "id") || !BSON_ITER_HOLDS_BINARY (&child))
      return false;
   bson_iter_binary (&child, &sub, &len, &data);
   if (len != 16)
      return false;
   bson_init (out);
   BSON_APPEND_INT32 (out, "ping", 1);
   BSON_APPEND_DOCUMENT_BEGIN (out, "lsid", &lsid);
   BSON_APPEND_BINARY (&lsid, "id", BSON_SUBTYPE_UUID, data, 16);
   bson_append_document_end (out, &lsid);
   return true;
}

static void
check_owners (uint64_t user, const bson_t *body, const char *cmd)
{
   owners_refusal_t r, again;
   /* No session quota (0): the checks below compare verdicts of one request
    * sent twice; the quota's own refusals are tests/unit/test_owners.c's. */
   owners_verdict_t v = owners_check_user (user, 0, body, cmd, &r);
   bson_iter_t it;
   bson_t ping;

   check_refusal (v, &r);
   if (user == 0) {
      CHECK (v == OWNERS_ALLOW);
      return;
   }
   CHECK (owners_check_user (user, 0, body, cmd, &again) == v);
   if (in_list (cmd, always_refused, sizeof always_refused / sizeof always_refused[0]))
      CHECK (v == OWNERS_REFUSE);
   if (strcmp (cmd, "getMore") == 0 && bson_iter_init (&it, body) && bson_iter_next (&it) &&
       BSON_ITER_HOLDS_NUMBER (&it) && bson_iter_as_int64 (&it) != 0)
      CHECK (v == OWNERS_REFUSE && r.code == 13);
   if (v != OWNERS_ALLOW || !lsid_request (body, &ping))
      return;
   /* An allowed request's session is its user's. */
   CHECK (owners_check_user (user, 0, &ping, "ping", &r) == OWNERS_ALLOW);
   for (uint64_t other = 1; other <= USERS; other++)
      if (other != user) {
         CHECK (owners_check_user (other, 0, &ping, "ping", &r) == OWNERS_REFUSE);
         CHECK (r.code == 13);
      }
   bson_destroy (&ping);
}

static void
one_record (uint8_t flags, const uint8_t *rest, size_t n)
{
   struct evbuffer *in = evbuffer_new ();
   uint8_t header[WIRE_HEADER_LEN];
   wire_header_t h = {0};
   char cmd[64];
   bson_t body;
   bool peeked, must_log_in = (flags & 4) != 0;
   uint64_t user = flags & 3;

   CHECK (in);
   h.length = (int32_t) (WIRE_HEADER_LEN + n);
   h.request_id = 1;
   h.opcode = (flags & 8) ? WIRE_OP_COMPRESSED : WIRE_OP_MSG;
   wire_put_u32 (wire_put_u32 (wire_put_u32 (wire_put_u32 (header, (uint32_t) h.length), 1), 0), (uint32_t) h.opcode);
   evbuffer_add (in, header, sizeof header);
   evbuffer_add (in, rest, n);
   peeked = pool_peek (in, &h, cmd, sizeof cmd, &body);
   if (peeked) {
      bson_iter_t it;
      CHECK (h.opcode == WIRE_OP_MSG && n >= 4 + 1 + 5 && rest[4] == 0);
      CHECK (WIRE_HEADER_LEN + 5 + body.len <= (size_t) h.length && WIRE_HEADER_LEN + 5 + body.len <= PEEK_MAX);
      CHECK (bson_iter_init (&it, &body) && bson_iter_next (&it));
      CHECK (strncmp (cmd, bson_iter_key (&it), sizeof cmd - 1) == 0);
   }
   /* The gate: before a login, nothing the peek read or could not read
    * reaches the pool. */
   if (must_log_in)
      CHECK (login_gate_local (peeked ? cmd : NULL, true));
   else if (!peeked)
      CHECK (!login_gate_local (NULL, false));
   else
      CHECK (login_gate_local (cmd, false) ==
             in_list (cmd, local_before_login, sizeof local_before_login / sizeof local_before_login[0]));
   /* On the body as peeked, unvalidated: pool_admit checks it before the
    * request is read and validated. */
   if (peeked && !must_log_in)
      check_owners (user, &body, cmd);
   evbuffer_free (in);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
   while (size >= 3) {
      uint8_t flags = data[0];
      size_t n = (size_t) data[1] | (size_t) data[2] << 8;
      data += 3;
      size -= 3;
      if (n > size)
         n = size;
      one_record (flags, data, n);
      data += n;
      size -= n;
   }
   return 0;
}
