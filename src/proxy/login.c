/*
 * proxy/login.c - clients logging in to the proxy itself, in pooled mode
 * (proxy/login.h): the SASL commands, a hello's login fields, the commands
 * answered without a connection, and the limit on guesses per (user,
 * address).
 *
 * One conversation per connection at a time (login_t, in the connection),
 * with conversationId 1 as mongod numbers them.  The conversation holds a
 * reference on the config snapshot whose users it checks against, so a
 * reload in the middle of a login cannot free them; a login finished is
 * kept by the connection across reloads (mongod keeps a logged-in
 * connection when a user changes, too).
 *
 * The guess table (base/authlimit.h) is one for the process, behind a
 * mutex: an address's connections are spread over the loops, so a table
 * per loop would multiply the limit by the loops.  Only logins take the
 * mutex, never forwarded traffic.  A proof is checked under that mutex,
 * and only while its (user, address) pair has fewer than
 * auth_failures_per_minute failures; a wrong one is counted before the
 * mutex is let go.  So parallel wrong proofs never pass the limit, and
 * right proofs, however many at once (a driver filling a pool of
 * minPoolSize connections), are never refused for it.
 */
#include "proxy/login.h"

#include <inttypes.h>
#include <pthread.h>
#include <string.h>

#include <event2/event.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "base/assert.h"
#include "base/authfile.h"
#include "base/authlimit.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/servercodes.h"
#include "codec/handshake.h"
#include "codec/sasl.h"
#include "codec/scram.h"
#include "proxy/conn_private.h"

#define LOGIN_ADDR_MAX 64

struct login {
   scram_server_t *conv; /* the conversation in progress, or NULL */
   config_t *cfg;        /* the snapshot whose users `conv` checks against */
   bool skip_empty;      /* the client asked for skipEmptyExchange */
   bool final_sent;      /* server-final sent; an empty saslContinue ends it */
   char *user;           /* logged in as; NULL: not logged in */
   char *db;             /* the database the login named ($db, or the speculative `db`) */
   char *pending_db;
   /* A saslContinue whose proof waits out its user's delay (delay_*):
    * the timer (made on the first delay, on the connection's loop), the
    * held request and a copy of its body; delayed_body NULL: none waits. */
   struct event *delay_ev;
   bson_t *delayed_body;
   uint64_t delayed_seq;
   struct event *deadline; /* login_timeout_ms from accept; gone once logged in */
};

/* ------------------------------------------------------------ guesses */

/* The process's table of guesses (base/authlimit.h), made on the first
 * login under a key drawn once per process: a client that cannot know it
 * cannot choose names that crowd one part of the table. */
static authlimit_t *guesses;
static pthread_once_t guesses_once = PTHREAD_ONCE_INIT;

static void
guesses_init (void)
{
   uint8_t key[AUTHLIMIT_KEY_BYTES];

   if (RAND_bytes (key, sizeof key) != 1) {
      /* Without randomness the table still bounds and limits; only its
       * spreading is then predictable. */
      int64_t t = clock_now_ms () ^ clock_mono_ms ();
      log_warn ("login: RAND_bytes failed; the login failure table's hash key is derived from the clock");
      memset (key, 0, sizeof key);
      memcpy (key, &t, sizeof t);
   }
   guesses = authlimit_new (key);
   OPENSSL_cleanse (key, sizeof key);
}

static authlimit_t *
guesses_table (void)
{
   pthread_once (&guesses_once, guesses_init);
   return guesses;
}

/* The address a connection's guesses count under: its peer ("ip:port",
 * "[v6]:port", "unix") without the port, an IPv6 address as its /64
 * (base/authlimit.h). */
static void
peer_addr (const client_conn_t *c, char *out, size_t len)
{
   const char *p = c->peer;
   const char *colon = strrchr (p, ':');
   size_t n = strlen (p);
   char host[LOGIN_ADDR_MAX];

   if (p[0] == '[') {
      const char *close = strchr (p, ']');
      if (close)
         n = (size_t) (close - p + 1);
   } else if (colon) {
      n = (size_t) (colon - p);
   }
   if (n >= sizeof host)
      n = sizeof host - 1;
   memcpy (host, p, n);
   host[n] = '\0';
   authlimit_addr_group (host, out, len);
}

/* A guess refused unchecked: its (user, address) pair has
 * auth_failures_per_minute failures.  Counted, logged, and errmsg names
 * the limit. */
static void
guess_refused (client_conn_t *c, const char *user, const char *addr, int64_t limit, uint32_t failures, bool first,
               char *errmsg, size_t errmsg_len)
{
   counters_add_at (COUNTER_LOGINS, COUNTERS_LOGIN_THROTTLED, 1);
   if (first)
      log_warn ("login: user %s from %s has %u failed logins within a minute (auth_failures_per_minute = %" PRId64
                "): its further proofs from that address are refused unchecked until the oldest is a minute old",
                user, addr, failures, limit);
   log_conn (LOG_LEVEL_INFO, c->id, c->peer, "login refused unchecked: user %s, auth_failures_per_minute = %" PRId64,
             user, limit);
   bson_snprintf (errmsg, errmsg_len,
                  "Authentication failed. (relaybus: too many failed logins for this user from this address: "
                  "auth_failures_per_minute = %" PRId64 "; try again in a minute)",
                  limit);
}

/* The conversation that just started (its user is known and in the auth
 * file): false when its (user, address) pair already has
 * auth_failures_per_minute failures, so that its proof would not be
 * checked, with errmsg naming the limit.  Nothing is counted: a guess
 * counts when its proof fails (cmd_sasl_continue). */
static bool
guess_allowed (client_conn_t *c, login_t *l, char *errmsg, size_t errmsg_len)
{
   char addr[LOGIN_ADDR_MAX];
   const char *user = scram_server_user (l->conv);
   int64_t limit = l->cfg->auth_failures_per_minute;
   uint32_t failures;
   bool first;

   RELAYBUS_ASSERT (user);
   peer_addr (c, addr, sizeof addr);
   if (authlimit_allowed (guesses_table (), user, addr, (uint32_t) limit, clock_mono_ms (), &failures, &first))
      return true;
   guess_refused (c, user, addr, limit, failures, first, errmsg, errmsg_len);
   return false;
}

/* A started conversation failed without a proof checked (a malformed
 * step): counted as a wrong proof of its pair and user. */
static void
guess_failed (client_conn_t *c, login_t *l)
{
   char addr[LOGIN_ADDR_MAX];

   if (!l->conv || !scram_server_user (l->conv))
      return;
   peer_addr (c, addr, sizeof addr);
   authlimit_fail (guesses_table (), scram_server_user (l->conv), addr, clock_mono_ms ());
}

/* ------------------------------------------------------------ state */

static login_t *
login_get (client_conn_t *c)
{
   if (!c->login)
      c->login = bson_malloc0 (sizeof *c->login);
   return c->login;
}

static void
conversation_end (login_t *l)
{
   scram_server_destroy (l->conv);
   l->conv = NULL;
   config_release (l->cfg);
   l->cfg = NULL;
   l->final_sent = false;
   bson_free (l->pending_db);
   l->pending_db = NULL;
}

void
login_destroy (login_t *l)
{
   if (!l)
      return;
   proxy_event_free (l->delay_ev);
   l->delay_ev = NULL;
   if (l->delayed_body)
      bson_destroy (l->delayed_body);
   l->delayed_body = NULL;
   conversation_end (l);
   if (l->deadline)
      event_free (l->deadline);
   bson_free (l->user);
   bson_free (l->db);
   bson_free (l);
}

/* ------------------------------------------------------------ deadline */

static void
deadline_cb (evutil_socket_t fd, short what, void *arg)
{
   client_conn_t *c = arg;

   (void) fd;
   (void) what;
   if (!login_user (c))
      client_disconnect (c, COUNTERS_CLOSE_LOGIN_TIMEOUT, "not logged in within login_timeout_ms=%" PRId64,
                         c->cfg->login_timeout_ms);
}

/* From accept, not from the hello: a client that says hello and nothing
 * more would otherwise hold its socket and its slot of max_clients for
 * ever, since pooled mode gives it no upstream connection to time out. */
bool
login_deadline_start (client_conn_t *c)
{
   login_t *l;
   struct timeval tv;

   if (!c->loop->cfg->users)
      return true;
   l = login_get (c);
   l->deadline = evtimer_new (c->loop->base, deadline_cb, c);
   if (!l->deadline)
      return false;
   tv = clock_timeval_ms (c->cfg->login_timeout_ms);
   return evtimer_add (l->deadline, &tv) == 0;
}

/* Disarms the login deadline (logged in, or closing). */
static void
login_deadline_stop (client_conn_t *c)
{
   if (c->login && c->login->deadline) {
      event_free (c->login->deadline);
      c->login->deadline = NULL;
   }
}

void
login_stop (client_conn_t *c)
{
   login_t *l = c->login;

   login_deadline_stop (c);
   if (l) {
      proxy_event_free (l->delay_ev);
      l->delay_ev = NULL;
      if (l->delayed_body)
         bson_destroy (l->delayed_body);
      l->delayed_body = NULL;
   }
}

const char *
login_user (const client_conn_t *c)
{
   return c->login ? c->login->user : NULL;
}

/* ping is not among them once the client may run commands: it goes to the
 * server like any command, so that it checks the upstream, carries the
 * server's $clusterTime, and meets a failCommand fail point or an apiVersion
 * error as it does directly.  Before a required login it is answered here
 * (mongod answers it unauthenticated too), so that a client that has not
 * logged in never takes a pooled connection. */
bool
login_answers_locally (const client_conn_t *c, const char *cmd)
{
   return login_gate_local (cmd, c->loop->cfg->users && !login_user (c));
}

bool
login_gate_local (const char *cmd, bool must_log_in)
{
   if (!cmd)
      return must_log_in;
   switch (cmd[0]) {
   case 'h':
   case 'i':
      if (handshake_is_hello (cmd))
         return true;
      break;
   case 's':
      if (strcmp (cmd, "saslStart") == 0 || strcmp (cmd, "saslContinue") == 0)
         return true;
      break;
   case 'a':
      if (strcmp (cmd, "authenticate") == 0)
         return true;
      break;
   case 'l':
      if (strcmp (cmd, "logout") == 0)
         return true;
      break;
   case 'c':
      if (strcmp (cmd, "connectionStatus") == 0)
         return true;
      break;
   default:
      break;
   }
   return must_log_in;
}

/* ------------------------------------------------------------ the delay */

static void cmd_sasl_continue (client_conn_t *c, uint64_t seq, const bson_t *body);
static void answer_error (client_conn_t *c, uint64_t seq, server_code_t code, const char *errmsg);

/* The delayed saslContinue's time is up: its proof is checked and
 * answered now.  The timer is freed with the login (login_destroy, when
 * the connection is freed), so c is alive here; a connection closed
 * meanwhile gets no answer. */
static void
delay_fire (evutil_socket_t fd, short what, void *arg)
{
   client_conn_t *c = arg;
   login_t *l = c->login;
   bson_t *body = l->delayed_body;

   (void) fd;
   (void) what;
   l->delayed_body = NULL;
   if (!body)
      return;
   /* Open: the close stops this timer (login_stop). */
   cmd_sasl_continue (c, l->delayed_seq, body);
   bson_destroy (body);
}

/* Whether the saslContinue `body` (request seq) of c waits before its
 * proof is checked: once the conversation's user has
 * auth_failures_per_minute failures within a minute, from any address,
 * each proof of that user waits 100 ms, doubled by each further failure,
 * up to auth_failure_delay_max_ms.  This slows guessing spread over many
 * addresses, which the per-address limit does not, without locking the
 * user out.  True: held (the timer answers it), or answered. */
static bool
delay_continue (client_conn_t *c, uint64_t seq, const bson_t *body)
{
   login_t *l = c->login;
   const char *user;
   int64_t ms;
   struct timeval tv;

   if (!l || !l->conv || l->final_sent || scram_server_state (l->conv) != SCRAM_STATE_FIRST_SENT)
      return false;
   user = scram_server_user (l->conv);
   ms = authlimit_delay_ms (guesses_table (), user, (uint32_t) l->cfg->auth_failures_per_minute,
                            l->cfg->auth_failure_delay_max_ms, clock_mono_ms ());
   if (ms <= 0)
      return false;
   if (!l->delay_ev)
      l->delay_ev = evtimer_new (c->loop->base, delay_fire, c);
   if (!l->delay_ev) {
      /* No timer: refuse unchecked rather than check without the delay. */
      conversation_end (l);
      answer_error (c, seq, SERVER_AUTHENTICATION_FAILED, "Authentication failed.");
      return true;
   }
   RELAYBUS_ASSERT (!l->delayed_body);
   l->delayed_body = bson_copy (body);
   l->delayed_seq = seq;
   tv = clock_timeval_ms (ms);
   evtimer_add (l->delay_ev, &tv);
   log_conn (LOG_LEVEL_INFO, c->id, c->peer, "login: proof of user %s delayed %" PRId64 " ms (failed logins of the user)",
             user, ms);
   return true;
}

/* While a saslContinue waits out its delay, the conversation is its: a
 * saslStart, saslContinue or logout meanwhile is refused (ProtocolError),
 * not run, so that another command can neither have the proof checked
 * early nor end the conversation under it.  True: answered. */
static bool
delay_busy (client_conn_t *c, uint64_t seq, const char *cmd)
{
   if (!c->login || !c->login->delayed_body || !cmd)
      return false;
   if (strcmp (cmd, "saslStart") != 0 && strcmp (cmd, "saslContinue") != 0 && strcmp (cmd, "logout") != 0)
      return false;
   answer_error (c, seq, SERVER_PROTOCOL_ERROR,
                 "relaybus: this connection's saslContinue waits for its answer (auth_failure_delay_max_ms); send "
                 "the next login command after it");
   return true;
}

/* ------------------------------------------------------------ SCRAM */


static bool
skip_empty_of (const bson_t *cmd)
{
   bson_iter_t it, opt;

   return bson_iter_init_find (&it, cmd, "options") && BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &opt) &&
          bson_iter_find (&opt, "skipEmptyExchange") && bson_iter_as_bool (&opt);
}

/* The step that failed: counted and logged; the conversation ends. */
static void
login_failed (client_conn_t *c, login_t *l, const char *why)
{
   counters_add_at (COUNTER_LOGINS, COUNTERS_LOGIN_FAILURE, 1);
   log_conn (LOG_LEVEL_INFO, c->id, c->peer, "login refused: %s", why);
   conversation_end (l);
}

/* Starts a conversation from saslStart's (or speculativeAuthenticate's)
 * mechanism and client-first.  Sets *server_first (free with bson_free);
 * false: refused, with the code and errmsg to answer. */
static bool
sasl_start (client_conn_t *c, const bson_t *cmd, const char *db, char **server_first, size_t *sf_len, int32_t *code,
            char *errmsg, size_t errmsg_len)
{
   login_t *l = login_get (c);
   bson_iter_t it;
   authfile_mech_t mech;
   const char *mech_name = NULL;
   uint32_t mech_len = 0;
   const uint8_t *payload;
   uint32_t plen;
   bson_error_t error;

   conversation_end (l);
   *code = SERVER_AUTHENTICATION_FAILED;
   if (bson_iter_init_find (&it, cmd, "mechanism") && BSON_ITER_HOLDS_UTF8 (&it))
      mech_name = bson_iter_utf8 (&it, &mech_len);
   if (!mech_name || !authfile_mech_from_name (mech_name, mech_len, &mech)) {
      *code = SERVER_MECHANISM_UNAVAILABLE;
      bson_snprintf (errmsg, errmsg_len,
                     "Received authentication for mechanism %.40s which is not enabled (relaybus: the proxy offers "
                     "SCRAM-SHA-256 and SCRAM-SHA-1)",
                     mech_name ? mech_name : "(none)");
      return false;
   }
   if (!c->loop->cfg->users) {
      login_failed (c, l, "the proxy has no auth_file");
      bson_snprintf (errmsg, errmsg_len, "Authentication failed.");
      return false;
   }
   if (!sasl_payload (cmd, "payload", &payload, &plen)) {
      login_failed (c, l, "saslStart without a payload");
      bson_snprintf (errmsg, errmsg_len, "Authentication failed.");
      return false;
   }
   l->cfg = config_retain (c->loop->cfg);
   l->conv = scram_server_new (mech);
   l->skip_empty = skip_empty_of (cmd);
   l->pending_db = bson_strdup (db ? db : "admin");
   if (!scram_server_first (l->conv, l->cfg->users, payload, plen, server_first, sf_len, &error)) {
      char why[300];
      bson_snprintf (why, sizeof why, "%s step 1: %s", authfile_mech_name (mech), error.message);
      if (error.code == SCRAM_ERR_SASLPREP) {
         *code = SERVER_AUTHENTICATION_FAILED;
         bson_snprintf (errmsg, errmsg_len, "Authentication failed. (relaybus: %s)", error.message);
      } else {
         bson_snprintf (errmsg, errmsg_len, "Authentication failed.");
      }
      login_failed (c, l, why);
      return false;
   }
   if (!guess_allowed (c, l, errmsg, errmsg_len)) {
      bson_free (*server_first);
      *server_first = NULL;
      conversation_end (l);
      return false;
   }
   return true;
}

static void
answer_error (client_conn_t *c, uint64_t seq, server_code_t code, const char *errmsg)
{
   bson_error_t error;
   const char *name = server_code_name (code);

   RELAYBUS_ASSERT (name != NULL);
   if (!client_answer_error (c, seq, code, name, errmsg, &error))
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "answering a login: %s", error.message);
}

static void
answer_doc (client_conn_t *c, uint64_t seq, const bson_t *doc)
{
   bson_error_t error;

   if (!client_answer (c, seq, doc, &error))
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "answering a login: %s", error.message);
}

static void
login_succeeded (client_conn_t *c, login_t *l)
{
   bson_free (l->user);
   bson_free (l->db);
   l->user = bson_strdup (scram_server_user (l->conv));
   l->db = l->pending_db;
   l->pending_db = NULL;
   login_deadline_stop (c);
   counters_add_at (COUNTER_LOGINS, COUNTERS_LOGIN_SUCCESS, 1);
   log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "logged in as %s with %s", l->user,
             authfile_mech_name (scram_server_mech (l->conv)));
}

static void
cmd_sasl_start (client_conn_t *c, uint64_t seq, const bson_t *body, const char *db)
{
   char *sf = NULL;
   size_t sf_len = 0;
   int32_t code;
   char errmsg[300];
   bson_t doc = BSON_INITIALIZER;

   if (!sasl_start (c, body, db, &sf, &sf_len, &code, errmsg, sizeof errmsg)) {
      answer_error (c, seq, code, errmsg);
      return;
   }
   BSON_APPEND_INT32 (&doc, "conversationId", 1);
   BSON_APPEND_BOOL (&doc, "done", false);
   BSON_APPEND_BINARY (&doc, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *) sf, (uint32_t) sf_len);
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   answer_doc (c, seq, &doc);
   bson_destroy (&doc);
   bson_free (sf);
}

/* The proof's check, run by authlimit_check under the guess table's
 * mutex: scram_server_final's few HMACs and comparisons. */
typedef struct {
   scram_server_t *conv;
   const uint8_t *payload;
   uint32_t plen;
   char *sfinal;
   size_t sfinal_len;
   bson_error_t error;
} proof_check_t;

static bool
proof_check (void *arg)
{
   proof_check_t *p = arg;

   return scram_server_final (p->conv, p->payload, p->plen, &p->sfinal, &p->sfinal_len, &p->error);
}

static void
cmd_sasl_continue (client_conn_t *c, uint64_t seq, const bson_t *body)
{
   login_t *l = login_get (c);
   bson_iter_t it;
   const uint8_t *payload;
   uint32_t plen;
   bson_error_t error;
   char *sfinal = NULL;
   size_t sfinal_len = 0;
   bson_t doc = BSON_INITIALIZER;

   if (!l->conv || !bson_iter_init_find (&it, body, "conversationId") || !BSON_ITER_HOLDS_NUMBER (&it) ||
       bson_iter_as_int64 (&it) != 1) {
      conversation_end (l);
      answer_error (c, seq, SERVER_PROTOCOL_ERROR, "No SASL session state found");
      goto done;
   }
   if (l->final_sent) {
      /* The empty exchange of a client without skipEmptyExchange. */
      BSON_APPEND_INT32 (&doc, "conversationId", 1);
      BSON_APPEND_BOOL (&doc, "done", true);
      BSON_APPEND_BINARY (&doc, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *) "", 0);
      BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
      conversation_end (l);
      answer_doc (c, seq, &doc);
      goto done;
   }
   if (!sasl_payload (body, "payload", &payload, &plen)) {
      guess_failed (c, l);
      login_failed (c, l, "saslContinue without a payload");
      answer_error (c, seq, SERVER_AUTHENTICATION_FAILED, "Authentication failed.");
      goto done;
   }
   {
      proof_check_t p = {.conv = l->conv, .payload = payload, .plen = plen};
      const char *user = scram_server_user (l->conv);
      char addr[LOGIN_ADDR_MAX], errmsg[300];
      uint32_t failures;
      bool first;
      authlimit_verdict_t v;

      if (!user) {
         /* No user: step 1 never succeeded; scram_server_final refuses it. */
         v = proof_check (&p) ? AUTHLIMIT_PASSED : AUTHLIMIT_FAILED;
      } else {
         peer_addr (c, addr, sizeof addr);
         v = authlimit_check (guesses_table (), user, addr, (uint32_t) l->cfg->auth_failures_per_minute,
                              clock_mono_ms (), proof_check, &p, &failures, &first);
      }
      sfinal = p.sfinal;
      sfinal_len = p.sfinal_len;
      error = p.error;
      if (v == AUTHLIMIT_REFUSED) {
         guess_refused (c, user, addr, l->cfg->auth_failures_per_minute, failures, first, errmsg, sizeof errmsg);
         conversation_end (l);
         answer_error (c, seq, SERVER_AUTHENTICATION_FAILED, errmsg);
         goto done;
      }
      if (v == AUTHLIMIT_FAILED) {
         char why[300];
         bson_snprintf (why, sizeof why, "%s step 2 (user %s): %s", authfile_mech_name (scram_server_mech (l->conv)),
                        user ? user : "?", error.message);
         login_failed (c, l, why);
         answer_error (c, seq, SERVER_AUTHENTICATION_FAILED, "Authentication failed.");
         goto done;
      }
   }
   login_succeeded (c, l);
   BSON_APPEND_INT32 (&doc, "conversationId", 1);
   BSON_APPEND_BOOL (&doc, "done", l->skip_empty);
   BSON_APPEND_BINARY (&doc, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *) sfinal, (uint32_t) sfinal_len);
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   if (l->skip_empty)
      conversation_end (l);
   else
      l->final_sent = true;
   answer_doc (c, seq, &doc);
done:
   bson_free (sfinal);
   bson_destroy (&doc);
}

void
login_hello (client_conn_t *c, const bson_t *hello, bson_t *reply)
{
   const authfile_t *users = c->loop->cfg->users;
   bson_iter_t it;

   if (!users)
      return;
   if (bson_iter_init_find (&it, hello, "saslSupportedMechs") && BSON_ITER_HOLDS_UTF8 (&it)) {
      /* "db.user": the user's mechanisms; nothing for an unknown one. */
      uint32_t len;
      const char *ns = bson_iter_utf8 (&it, &len);
      const char *dot = memchr (ns, '.', len);
      const authfile_user_t *u = dot ? authfile_lookup (users, dot + 1, len - (uint32_t) (dot + 1 - ns)) : NULL;
      if (u) {
         bson_t arr;
         unsigned i = 0;
         char key[16];
         const char *k;
         BSON_APPEND_ARRAY_BEGIN (reply, "saslSupportedMechs", &arr);
         for (int m = AUTHFILE_N_MECHS - 1; m >= 0; m--)
            if (u->keys[m].present) {
               bson_uint32_to_string (i++, &k, key, sizeof key);
               BSON_APPEND_UTF8 (&arr, k, authfile_mech_name ((authfile_mech_t) m));
            }
         bson_append_array_end (reply, &arr);
      }
   }
   if (bson_iter_init_find (&it, hello, "speculativeAuthenticate") && BSON_ITER_HOLDS_DOCUMENT (&it)) {
      const uint8_t *data;
      uint32_t len;
      bson_t spec, answer;
      bson_iter_t db;
      char *sf = NULL;
      size_t sf_len = 0;
      int32_t code;
      char errmsg[300];

      bson_iter_document (&it, &len, &data);
      if (!bson_init_static (&spec, data, len) || !bson_has_field (&spec, "saslStart"))
         return; /* not a SASL start (X.509 is refused at authenticate) */
      if (c->login && c->login->delayed_body)
         return; /* a delayed saslContinue keeps its conversation (delay_busy) */
      if (!sasl_start (c, &spec,
                       bson_iter_init_find (&db, &spec, "db") && BSON_ITER_HOLDS_UTF8 (&db) ? bson_iter_utf8 (&db, NULL)
                                                                                          : "admin",
                       &sf, &sf_len, &code, errmsg, sizeof errmsg))
         return; /* the driver logs in explicitly, and sees the error then */
      BSON_APPEND_DOCUMENT_BEGIN (reply, "speculativeAuthenticate", &answer);
      BSON_APPEND_INT32 (&answer, "conversationId", 1);
      BSON_APPEND_BOOL (&answer, "done", false);
      BSON_APPEND_BINARY (&answer, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *) sf, (uint32_t) sf_len);
      bson_append_document_end (reply, &answer);
      bson_free (sf);
   }
}

/* ------------------------------------------------------------ commands */

static void
cmd_connection_status (client_conn_t *c, uint64_t seq)
{
   bson_t doc = BSON_INITIALIZER, info, users, user, roles;

   BSON_APPEND_DOCUMENT_BEGIN (&doc, "authInfo", &info);
   BSON_APPEND_ARRAY_BEGIN (&info, "authenticatedUsers", &users);
   if (login_user (c)) {
      BSON_APPEND_DOCUMENT_BEGIN (&users, "0", &user);
      BSON_APPEND_UTF8 (&user, "user", c->login->user);
      BSON_APPEND_UTF8 (&user, "db", c->login->db ? c->login->db : "admin");
      bson_append_document_end (&users, &user);
   }
   bson_append_array_end (&info, &users);
   BSON_APPEND_ARRAY_BEGIN (&info, "authenticatedUserRoles", &roles);
   bson_append_array_end (&info, &roles);
   bson_append_document_end (&doc, &info);
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   answer_doc (c, seq, &doc);
   bson_destroy (&doc);
}

bool
login_command (client_conn_t *c,
               const wire_msg_t *msg,
               const char *cmd,
               int compressor,
               struct evbuffer *src,
               size_t len,
               bson_error_t *error)
{
   uint64_t seq;
   bson_iter_t it;
   const char *db = NULL;
   bool ok;

   /* Answers to the SASL commands are never compressed (the exempt list). */
   if (cmd && (strcmp (cmd, "saslStart") == 0 || strcmp (cmd, "saslContinue") == 0 || strcmp (cmd, "authenticate") == 0))
      compressor = -1;
   if (!client_hold_request (c, msg->header.request_id, WIRE_OP_MSG, compressor, &seq, error)) {
      evbuffer_drain (src, len);
      return false;
   }
   if (bson_iter_init_find (&it, &msg->body, "$db") && BSON_ITER_HOLDS_UTF8 (&it))
      db = bson_iter_utf8 (&it, NULL);
   if (!cmd) {
      answer_error (c, seq, SERVER_UNAUTHORIZED, "command requires authentication");
   } else if (delay_busy (c, seq, cmd)) {
      /* answered */
   } else if (strcmp (cmd, "saslStart") == 0) {
      cmd_sasl_start (c, seq, &msg->body, db);
   } else if (strcmp (cmd, "saslContinue") == 0) {
      if (!delay_continue (c, seq, &msg->body))
         cmd_sasl_continue (c, seq, &msg->body);
   } else if (strcmp (cmd, "authenticate") == 0) {
      answer_error (c, seq, SERVER_AUTHENTICATION_FAILED,
                    "relaybus: the pooled proxy authenticates clients with SCRAM-SHA-256 and SCRAM-SHA-1 only "
                    "(saslStart)");
   } else if (strcmp (cmd, "logout") == 0) {
      if (c->login) {
         conversation_end (c->login);
         bson_free (c->login->user);
         c->login->user = NULL;
      }
      bson_t doc = BSON_INITIALIZER;
      BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
      answer_doc (c, seq, &doc);
      bson_destroy (&doc);
   } else if (strcmp (cmd, "connectionStatus") == 0) {
      cmd_connection_status (c, seq);
   } else if (strcmp (cmd, "ping") == 0) {
      bson_t doc = BSON_INITIALIZER;
      BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
      answer_doc (c, seq, &doc);
      bson_destroy (&doc);
   } else {
      char errmsg[200];
      bson_snprintf (errmsg, sizeof errmsg, "command %.100s requires authentication", cmd);
      answer_error (c, seq, SERVER_UNAUTHORIZED, errmsg);
   }
   ok = c->state != CLIENT_STATE_CLOSING;
   /* Only now: `msg` points into the request's bytes. */
   if (ok)
      evbuffer_drain (src, len);
   return ok;
}
