/*
 * codec/sasl.c - who a session-mode connection authenticated as, from the
 * SASL conversation it relays (codec/sasl.h).
 *
 * A small state machine per connection: a request moves it to the state
 * that waits for its reply, the reply moves it back, and every move goes
 * through watch_set, which refuses (asserts in a debug build) a move the
 * table does not allow.  The parsing is RFC 5802's client-first grammar up
 * to the user name; the rest of the message is the server's to check.
 * Nothing here is trusted to prove anything: the user is recorded only
 * when the server's reply accepted the conversation.
 */
#include "codec/sasl.h"

#include <string.h>

#include "base/assert.h"

/* Which moves are allowed: from a state where no reply waits to one that
 * waits, from one that waits back to IDLE or CONVERSING, and to LOST from
 * anywhere. */
static bool
watch_move_allowed (sasl_watch_state_t from, sasl_watch_state_t to)
{
   if (to == SASL_WATCH_LOST)
      return true;
   switch (from) {
   case SASL_WATCH_IDLE:
   case SASL_WATCH_CONVERSING:
      return to == SASL_WATCH_STARTED || to == SASL_WATCH_CONTINUED || to == SASL_WATCH_AUTHENTICATE ||
             to == SASL_WATCH_IDLE;
   case SASL_WATCH_STARTED:
   case SASL_WATCH_CONTINUED:
      return to == SASL_WATCH_IDLE || to == SASL_WATCH_CONVERSING;
   case SASL_WATCH_AUTHENTICATE:
      return to == SASL_WATCH_IDLE;
   case SASL_WATCH_LOST:
   case SASL_WATCH_N_STATES:
   default:
      return false;
   }
}

static void
watch_set (sasl_watch_t *w, sasl_watch_state_t to)
{
   RELAYBUS_ASSERT (watch_move_allowed (w->state, to));
   w->state = to;
   if (to == SASL_WATCH_LOST) {
      /* What the server now thinks of the connection is unknown. */
      w->user[0] = w->db[0] = '\0';
      w->pending_user[0] = w->pending_db[0] = '\0';
   }
}

void
sasl_watch_lose (sasl_watch_t *w)
{
   watch_set (w, SASL_WATCH_LOST);
}

bool
sasl_client_first_user (const uint8_t *msg, size_t len, char *user, size_t user_len, bson_error_t *error)
{
   const char *m = (const char *) msg, *end = m + len, *p;
   size_t n = 0;

   if (user_len == 0) {
      bson_set_error (error, SASL_ERROR_DOMAIN, SASL_ERR_TOO_LONG, "no room for a user name");
      return false;
   }
   user[0] = '\0';
   /* gs2-header: "n," or "y," (or "p=...," with channel binding), an
    * optional authzid, then ','. */
   if (len < 3 || !(m[0] == 'n' || m[0] == 'y' || m[0] == 'p')) {
      bson_set_error (error, SASL_ERROR_DOMAIN, SASL_ERR_MALFORMED, "no gs2 header");
      return false;
   }
   p = memchr (m, ',', len);
   if (!p || !(p = memchr (p + 1, ',', (size_t) (end - p - 1)))) {
      bson_set_error (error, SASL_ERROR_DOMAIN, SASL_ERR_MALFORMED, "the gs2 header does not end");
      return false;
   }
   p++;
   if (end - p < 2 || p[0] != 'n' || p[1] != '=') {
      bson_set_error (error, SASL_ERROR_DOMAIN, SASL_ERR_MALFORMED, "no user name (n=) after the gs2 header");
      return false;
   }
   /* saslname: ',' and '=' travel as "=2C" and "=3D"; no other '='. */
   for (p += 2; p < end && *p != ','; p++) {
      char c = *p;
      if (c == '\0') {
         bson_set_error (error, SASL_ERROR_DOMAIN, SASL_ERR_MALFORMED, "the user name holds a NUL byte");
         return false;
      }
      if (c == '=') {
         if (end - p >= 3 && p[1] == '2' && p[2] == 'C')
            c = ',';
         else if (end - p >= 3 && p[1] == '3' && p[2] == 'D')
            c = '=';
         else {
            bson_set_error (error, SASL_ERROR_DOMAIN, SASL_ERR_MALFORMED, "the user name holds '=' not followed by 2C or 3D");
            return false;
         }
         p += 2;
      }
      if (n + 1 >= user_len) {
         user[0] = '\0';
         bson_set_error (error, SASL_ERROR_DOMAIN, SASL_ERR_TOO_LONG, "the user name is longer than %zu bytes", user_len - 1);
         return false;
      }
      user[n++] = c;
   }
   user[n] = '\0';
   if (n == 0) {
      bson_set_error (error, SASL_ERROR_DOMAIN, SASL_ERR_MALFORMED, "the user name (n=) is empty");
      return false;
   }
   return true;
}

bool
sasl_watch_wants (const char *cmd)
{
   if (!cmd)
      return false;
   switch (cmd[0]) {
   case 's':
      return strcmp (cmd, "saslStart") == 0 || strcmp (cmd, "saslContinue") == 0;
   case 'a':
      return strcmp (cmd, "authenticate") == 0;
   case 'l':
      return strcmp (cmd, "logout") == 0;
   default:
      return false;
   }
}

bool
sasl_payload (const bson_t *doc, const char *name, const uint8_t **data, uint32_t *len)
{
   bson_iter_t it;
   bson_subtype_t sub;

   if (!bson_iter_init_find (&it, doc, name))
      return false;
   if (BSON_ITER_HOLDS_BINARY (&it)) {
      bson_iter_binary (&it, &sub, len, data);
      return true;
   }
   if (BSON_ITER_HOLDS_UTF8 (&it)) {
      *data = (const uint8_t *) bson_iter_utf8 (&it, len);
      return true;
   }
   return false;
}

/* PLAIN's message is "[authzid] NUL user NUL password" (RFC 4616). */
static bool
plain_user (const uint8_t *msg, size_t len, char *user, size_t user_len)
{
   const uint8_t *a = memchr (msg, '\0', len), *b;
   size_t n;

   if (!a || !(b = memchr (a + 1, '\0', len - (size_t) (a + 1 - msg))))
      return false;
   n = (size_t) (b - a - 1);
   if (n == 0 || n >= user_len)
      return false;
   memcpy (user, a + 1, n);
   user[n] = '\0';
   return true;
}

/* The pending user and database of a saslStart (or speculativeAuthenticate)
 * document: "" when its mechanism or payload is not understood, so that a
 * conversation the server accepts anyway records nobody. */
static void
note_start (sasl_watch_t *w, const bson_t *start, const char *db)
{
   bson_iter_t it;
   const char *mech = NULL;
   const uint8_t *payload;
   uint32_t plen;
   bson_error_t error;
   bool ok = false;

   w->pending_user[0] = w->pending_db[0] = '\0';
   if (bson_iter_init_find (&it, start, "mechanism") && BSON_ITER_HOLDS_UTF8 (&it))
      mech = bson_iter_utf8 (&it, NULL);
   if (!mech || !db || strlen (db) >= sizeof w->pending_db || !sasl_payload (start, "payload", &payload, &plen))
      return;
   if (strncmp (mech, "SCRAM-", 6) == 0)
      ok = sasl_client_first_user (payload, plen, w->pending_user, sizeof w->pending_user, &error);
   else if (strcmp (mech, "PLAIN") == 0)
      ok = plain_user (payload, plen, w->pending_user, sizeof w->pending_user);
   if (ok)
      bson_strncpy (w->pending_db, db, sizeof w->pending_db);
   else
      w->pending_user[0] = '\0';
}

/* A reply is waiting: a second SASL command now could be answered before
 * the first, and its verdict paired with the wrong user. */
static bool
waiting (const sasl_watch_t *w)
{
   return w->state == SASL_WATCH_STARTED || w->state == SASL_WATCH_CONTINUED || w->state == SASL_WATCH_AUTHENTICATE;
}

bool
sasl_watch_request (sasl_watch_t *w, const char *cmd, const bson_t *body, const char *db)
{
   if (w->state == SASL_WATCH_LOST)
      return false;
   if (strcmp (cmd, "logout") == 0) {
      /* Forgotten at once: no request after it runs as the user. */
      w->user[0] = w->db[0] = '\0';
      if (!waiting (w))
         watch_set (w, SASL_WATCH_IDLE);
      return false;
   }
   if (waiting (w)) {
      watch_set (w, SASL_WATCH_LOST);
      return false;
   }
   if (strcmp (cmd, "saslStart") == 0) {
      note_start (w, body, db);
      watch_set (w, SASL_WATCH_STARTED);
   } else if (strcmp (cmd, "saslContinue") == 0) {
      watch_set (w, SASL_WATCH_CONTINUED);
   } else {
      /* authenticate: MONGODB-X509 names the certificate's subject. */
      bson_iter_t it;
      w->pending_user[0] = w->pending_db[0] = '\0';
      if (bson_iter_init_find (&it, body, "mechanism") && BSON_ITER_HOLDS_UTF8 (&it) &&
          strcmp (bson_iter_utf8 (&it, NULL), "MONGODB-X509") == 0 && bson_iter_init_find (&it, body, "user") &&
          BSON_ITER_HOLDS_UTF8 (&it) && strlen (bson_iter_utf8 (&it, NULL)) < sizeof w->pending_user) {
         bson_strncpy (w->pending_user, bson_iter_utf8 (&it, NULL), sizeof w->pending_user);
         bson_strncpy (w->pending_db, "$external", sizeof w->pending_db);
      }
      watch_set (w, SASL_WATCH_AUTHENTICATE);
   }
   return true;
}

bool
sasl_watch_hello (sasl_watch_t *w, const bson_t *spec)
{
   bson_iter_t it;
   const char *db = "admin";

   if (w->state == SASL_WATCH_LOST)
      return false;
   if (waiting (w)) {
      watch_set (w, SASL_WATCH_LOST);
      return false;
   }
   if (!bson_has_field (spec, "saslStart"))
      return false; /* X.509 is removed from the hello (proxy/pump.c) */
   if (bson_iter_init_find (&it, spec, "db") && BSON_ITER_HOLDS_UTF8 (&it))
      db = bson_iter_utf8 (&it, NULL);
   note_start (w, spec, db);
   watch_set (w, SASL_WATCH_STARTED);
   return true;
}

/* The conversation ended accepted: its user is the connection's. */
static void
accept_pending (sasl_watch_t *w)
{
   bson_strncpy (w->user, w->pending_user, sizeof w->user);
   bson_strncpy (w->db, w->pending_user[0] ? w->pending_db : "", sizeof w->db);
   w->pending_user[0] = w->pending_db[0] = '\0';
   watch_set (w, SASL_WATCH_IDLE);
}

static bool
reply_ok (const bson_t *reply)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, reply, "ok") && BSON_ITER_HOLDS_NUMBER (&it) && bson_iter_as_double (&it) == 1.0;
}

static bool
reply_done (const bson_t *reply)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, reply, "done") && bson_iter_as_bool (&it);
}

void
sasl_watch_reply (sasl_watch_t *w, const bson_t *reply)
{
   if (!waiting (w))
      return; /* LOST, or a logout's */
   if (!reply_ok (reply)) {
      /* Refused: the server keeps whoever was authenticated before. */
      w->pending_user[0] = w->pending_db[0] = '\0';
      watch_set (w, SASL_WATCH_IDLE);
   } else if (w->state == SASL_WATCH_AUTHENTICATE || reply_done (reply)) {
      accept_pending (w);
   } else {
      watch_set (w, SASL_WATCH_CONVERSING);
   }
}

void
sasl_watch_hello_reply (sasl_watch_t *w, const bson_t *reply)
{
   bson_iter_t it, spec;

   if (w->state != SASL_WATCH_STARTED)
      return;
   if (!reply_ok (reply) || !bson_iter_init_find (&it, reply, "speculativeAuthenticate") ||
       !BSON_ITER_HOLDS_DOCUMENT (&it) || !bson_iter_recurse (&it, &spec)) {
      /* Declined: the driver starts a conversation of its own. */
      w->pending_user[0] = w->pending_db[0] = '\0';
      watch_set (w, SASL_WATCH_IDLE);
      return;
   }
   {
      bson_t doc;
      const uint8_t *data;
      uint32_t dlen;
      bson_iter_document (&it, &dlen, &data);
      if (dlen && bson_init_static (&doc, data, dlen) && reply_done (&doc)) {
         accept_pending (w);
         return;
      }
   }
   watch_set (w, SASL_WATCH_CONVERSING);
}
