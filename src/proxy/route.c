/*
 * proxy/route.c - what becomes of a client's request (proxy/route.h): the
 * request-routing policy, asked by the pump for each request it decoded.
 * What a request is forwarded or answered with is proxy/pump.c's; the
 * pooled mode's login, owners and pins are proxy/login.c's, owners.c's and
 * pool.c's, asked here in their order.
 */
#include "proxy/route.h"

#include <string.h>

#include <event2/buffer.h>

#include "autoconf.h"
#include "base/assert.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/servercodes.h"
#include "codec/handshake.h"
#include "codec/sasl.h"
#include "proxy/conn_private.h"
#include "proxy/login.h"
#include "proxy/owners.h"
#include "proxy/pool.h"

/* Answers a request the proxy handles itself with an error document: the
 * server's `code` (base/servercodes.h) with its codeName. */
static bool
answer_locally (client_conn_t *c,
                int32_t client_id,
                int32_t family,
                int compressor,
                server_code_t code,
                const char *errmsg,
                struct evbuffer *src,
                size_t len,
                bson_error_t *error)
{
   uint64_t seq;

   RELAYBUS_ASSERT (server_code_name (code) != NULL);
   evbuffer_drain (src, len);
   if (!client_hold_request (c, client_id, family, compressor, &seq, error))
      return false;
   return client_answer_error (c, seq, code, server_code_name (code), errmsg, error);
}

#ifdef RELAYBUS_TEST_COMMANDS
/* Test builds only (configure --enable-test-commands, which `make install`
 * refuses; never implied by --enable-debug): it sends a client's command
 * upstream past the publishing hook, so an installed proxy must not have it.
 * {relaybusDebugInternal: {<command with $db>}, times: N}
 * holds the client's request, sends the inner command N times on the
 * upstream connection as the proxy's own requests (pipelined), and answers
 * {ok: 1, replies: [...]} once all replies are in.  It exercises exactly
 * the mechanism injection uses (hold, send internal, answer) and serves as
 * its worked example. */
typedef struct {
   uint64_t seq;      /* the held client request */
   int pending;       /* internal replies still to come */
   bson_t replies;    /* array being built */
   uint32_t nreplies;
   bool failed;
} debug_internal_t;

static void
debug_internal_cb (client_conn_t *c, const wire_msg_t *reply, const bson_error_t *error, void *ctx)
{
   debug_internal_t *d = ctx;
   bson_error_t answer_error;
   char idx[16];
   const char *key;

   d->pending--;
   if (!reply) {
      /* Connection closed: nothing to answer, just release. */
      d->failed = true;
   } else {
      bson_uint32_to_string (d->nreplies++, &key, idx, sizeof idx);
      BSON_APPEND_DOCUMENT (&d->replies, key, &reply->body);
   }
   if (d->pending > 0)
      return;
   if (!d->failed) {
      bson_t doc = BSON_INITIALIZER;
      BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
      BSON_APPEND_ARRAY (&doc, "replies", &d->replies);
      if (!client_answer (c, d->seq, &doc, &answer_error))
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "debug internal answer: %s", answer_error.message);
      bson_destroy (&doc);
   }
   bson_destroy (&d->replies);
   bson_free (d);
}

static bool
debug_internal (client_conn_t *c, struct evbuffer *src, size_t len, const wire_msg_t *msg, int compressor, bson_error_t *error)
{
   bson_iter_t it;
   bson_t inner;
   const uint8_t *data;
   uint32_t dlen;
   int times = 1;
   debug_internal_t *d;
   bool ok = false;

   if (bson_iter_init_find (&it, &msg->body, "times") && BSON_ITER_HOLDS_NUMBER (&it))
      times = (int) bson_iter_as_int64 (&it);
   if (!bson_iter_init_find (&it, &msg->body, "relaybusDebugInternal") || !BSON_ITER_HOLDS_DOCUMENT (&it) || times < 1 ||
       times > 8)
      return answer_locally (c, msg->header.request_id, WIRE_OP_MSG, compressor, SERVER_BAD_VALUE,
                             "relaybusDebugInternal wants a command document and times in [1, 8]", src, len, error);
   bson_iter_document (&it, &dlen, &data);
   if (!bson_init_static (&inner, data, dlen))
      return false;
   d = bson_malloc0 (sizeof *d);
   bson_init (&d->replies);
   if (!client_hold_request (c, msg->header.request_id, WIRE_OP_MSG, compressor, &d->seq, error))
      goto done;
   for (int i = 0; i < times; i++) {
      if (!client_send_internal (c, &inner, NULL, 0, debug_internal_cb, d, error)) {
         /* Requests already sent will still call back; let them free d. */
         if (d->pending > 0) {
            d->failed = true;
            d = NULL;
         }
         goto done;
      }
      d->pending++;
   }
   d = NULL; /* owned by the callbacks now */
   ok = true;
done:
   evbuffer_drain (src, len);
   if (d) {
      bson_destroy (&d->replies);
      bson_free (d);
   }
   return ok;
}
#endif

/* What a step that answered, refused or dropped the request (`ok`: it
 * did; else `error` says why not) leaves. */
static route_action_t
route_done (client_conn_t *c, bool ok)
{
   if (c->state == CLIENT_STATE_CLOSING)
      return ROUTE_CLOSED;
   return ok ? ROUTE_TAKEN : ROUTE_FAILED;
}

/* ------------------------------------------------------------ classes */

/* The commands the policy tells apart by name; every other is OTHER. */
typedef enum {
   ROUTE_CLASS_OTHER = 0,
   ROUTE_CLASS_HELLO,        /* hello, isMaster, ismaster (codec/handshake.h) */
   ROUTE_CLASS_SASL,         /* saslStart, saslContinue */
   ROUTE_CLASS_AUTHENTICATE, /* authenticate */
   ROUTE_CLASS_LOGOUT,       /* logout */
   ROUTE_CLASS_RELAYBUS,     /* relaybus*: the pull consumers' (publish/pull.h), through the hook */
#ifdef RELAYBUS_TEST_COMMANDS
   ROUTE_CLASS_DEBUG_INTERNAL, /* relaybusDebugInternal, test builds only (debug_internal) */
#endif
   ROUTE_CLASS_COUNT_
} route_class_t;

/* What route_msg does with a class, in its order: a hello is the pump's;
 * a command that binds the session leaves state on the upstream connection
 * that a new one would not have (a login), so the connection is never
 * paired again (CLIENT_EVENT_BINDS_SESSION); an X.509 login is refused;
 * the test command runs here; what is never forwarded and the hook did
 * not take is answered CommandNotFound; a watched command is forwarded
 * with the SASL conversation read (session mode, codec/sasl.h). */
typedef struct {
   bool hello;           /* ROUTE_HELLO, unless sent with moreToCome */
   bool binds_session;   /* as moreToCome and exhaustAllowed do, whatever the command */
   bool x509_refused;    /* with mechanism MONGODB-X509 */
   bool debug_internal;  /* test builds: debug_internal, unless sent with moreToCome */
   bool never_forwarded; /* relaybus*: no such command, unless the hook took it */
   bool watched;         /* session mode: ROUTE_FORWARD_SASL */
} route_class_info_t;

static const route_class_info_t route_classes[ROUTE_CLASS_COUNT_] = {
   [ROUTE_CLASS_OTHER] = {0},
   [ROUTE_CLASS_HELLO] = {.hello = true},
   [ROUTE_CLASS_SASL] = {.binds_session = true, .watched = true},
   [ROUTE_CLASS_AUTHENTICATE] = {.binds_session = true, .x509_refused = true, .watched = true},
   [ROUTE_CLASS_LOGOUT] = {.watched = true},
   [ROUTE_CLASS_RELAYBUS] = {.never_forwarded = true},
#ifdef RELAYBUS_TEST_COMMANDS
   [ROUTE_CLASS_DEBUG_INTERNAL] = {.debug_internal = true, .never_forwarded = true},
#endif
};

/* A command's class, by its first letter and then the codec's own tests of
 * the names (handshake_is_hello; sasl_watch_wants, whose commands are
 * told apart by their first letters), so that no name list is kept twice.
 * Asked of every request: nearly every command is OTHER at the switch. */
static route_class_t
route_classify (const char *cmd)
{
   if (!cmd)
      return ROUTE_CLASS_OTHER;
   switch (cmd[0]) {
   case 'h':
   case 'i':
      return handshake_is_hello (cmd) ? ROUTE_CLASS_HELLO : ROUTE_CLASS_OTHER;
   case 's':
      return sasl_watch_wants (cmd) ? ROUTE_CLASS_SASL : ROUTE_CLASS_OTHER;
   case 'a':
      return sasl_watch_wants (cmd) ? ROUTE_CLASS_AUTHENTICATE : ROUTE_CLASS_OTHER;
   case 'l':
      return sasl_watch_wants (cmd) ? ROUTE_CLASS_LOGOUT : ROUTE_CLASS_OTHER;
   case 'r':
      if (strncmp (cmd, "relaybus", 8) != 0)
         return ROUTE_CLASS_OTHER;
#ifdef RELAYBUS_TEST_COMMANDS
      if (strcmp (cmd, "relaybusDebugInternal") == 0)
         return ROUTE_CLASS_DEBUG_INTERNAL;
#endif
      return ROUTE_CLASS_RELAYBUS;
   default:
      return ROUTE_CLASS_OTHER;
   }
}

/* ------------------------------------------------------------ policy */

/* A request refused or dropped without an answer: one sent with
 * moreToCome waits for none, so its bytes just go. */
static route_action_t
route_drop (struct evbuffer *src, size_t len)
{
   evbuffer_drain (src, len);
   return ROUTE_TAKEN;
}

/* Client connections present no certificate upstream (proxy/tls.c), so an
 * X.509 login could only fail there, or succeed as someone else's
 * certificate: refuse it here, before any hook can forward it.  18
 * (AuthenticationFailed) is mongod's own answer to an X.509 login it
 * cannot accept; drivers report it as an authentication error and do not
 * retry.  authenticate is never compressed (-1).  Out of route_msg's line
 * (cold), as the other refusals, so that its usual path stays short. */
static route_action_t __attribute__ ((cold))
route_refuse_x509 (client_conn_t *c, struct evbuffer *src, size_t len, const wire_msg_t *msg, bson_error_t *error)
{
   log_warn ("c%" PRIu64 " %s: MONGODB-X509 %s refused", c->id, c->peer, msg->command);
   if (msg->flags & WIRE_MSG_MORE_TO_COME)
      return route_drop (src, len);
   return route_done (c, answer_locally (c, msg->header.request_id, WIRE_OP_MSG, -1, SERVER_AUTHENTICATION_FAILED,
                                         "relaybus: MONGODB-X509 authentication is not available through the proxy "
                                         "(client connections present no certificate to the server); use SCRAM, or "
                                         "connect to the server directly for X.509",
                                         src, len, error));
}

/* Commands named relaybus* are never forwarded: one the hook did not take
 * does not exist. */
static route_action_t __attribute__ ((cold))
route_refuse_unknown (client_conn_t *c,
                      struct evbuffer *src,
                      size_t len,
                      const wire_msg_t *msg,
                      int compressor,
                      bson_error_t *error)
{
   char errmsg[160];

   if (msg->flags & WIRE_MSG_MORE_TO_COME)
      return route_drop (src, len);
   bson_snprintf (errmsg, sizeof errmsg, "no such command: '%s'", msg->command);
   return route_done (c, answer_locally (c, msg->header.request_id, WIRE_OP_MSG, compressor, SERVER_COMMAND_NOT_FOUND,
                                         errmsg, src, len, error));
}

/* Pooled mode's steps, before any use of the pool: logins and everything
 * before a login are the proxy's own; what needs the upstream got a
 * connection before it was read (pool_admit), unless its wait ran out.
 * True when they decided (*action); false: the request goes on.  Part of
 * route_msg's body (always inlined): a call with its seven arguments would
 * cost pooled mode's every request more than these few tests. */
static inline __attribute__ ((always_inline)) bool
route_pooled (client_conn_t *c,
              struct evbuffer *src,
              size_t len,
              const wire_msg_t *msg,
              int compressor,
              route_action_t *action,
              bson_error_t *error)
{
   const char *cmd = msg->command;
   bool more = (msg->flags & WIRE_MSG_MORE_TO_COME) != 0;
   bool owned;

   if (login_answers_locally (c, cmd)) {
      counters_count_command (cmd);
      *action = more ? route_drop (src, len) : route_done (c, login_command (c, msg, cmd, compressor, src, len, error));
      return true;
   }
   /* The owners' check comes before any use of the pool: pool_admit
    * ran it on the peek and lent nothing to a refused request (one it
    * could not peek at is refused here, on what it borrowed).  Asked
    * once: without an auth file no one is checked, and the note below
    * has nothing to record either. */
   owned = owners_enabled (c);
   if (owned) {
      owners_refusal_t r;
      if (owners_check (c, &msg->body, cmd, &r) == OWNERS_REFUSE) {
         counters_count_command (cmd);
         log_conn (LOG_LEVEL_INFO, c->id, c->peer, "%s refused: %s", cmd, r.why);
         *action = more ? route_drop (src, len)
                        : route_done (c, answer_locally (c, msg->header.request_id, WIRE_OP_MSG, compressor, r.code,
                                                         r.why, src, len, error));
         return true;
      }
   }
   if (!c->server) {
      counters_count_command (cmd);
      if (more) {
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL,
                            "an unacknowledged %s waited pool_wait_timeout_ms=%" PRId64
                            " for an upstream connection; no reply can carry the error",
                            cmd ? cmd : "request", c->cfg->pool_wait_timeout_ms);
         *action = ROUTE_CLOSED;
      } else {
         *action = route_done (c, pool_answer_timeout (c, msg, cmd, compressor, src, len, error));
      }
      return true;
   }
   if (owned)
      owners_note_request (c, &msg->body, cmd);
   if (!pool_note_request (c, msg, cmd)) {
      counters_count_command (cmd);
      if (more) {
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL,
                            "an unacknowledged %s would pin more than pool_max_pins_per_user connections; no "
                            "reply can carry the error",
                            cmd ? cmd : "request");
         *action = ROUTE_CLOSED;
      } else {
         *action = route_done (c, pool_answer_timeout (c, msg, cmd, compressor, src, len, error));
      }
      return true;
   }
   return false;
}

/* The routing decision for one parsed OP_MSG, by its command's class
 * (route_classes).  This is where injection (annotated statements) and
 * virtual commands hook in: either may hold the request
 * (client_hold_request), send its own traffic (client_send_internal) and
 * answer later (client_answer). */
route_action_t
route_msg (client_conn_t *c, struct evbuffer *src, size_t len, const wire_msg_t *msg, int compressor, bson_error_t *error)
{
   const char *cmd = msg->command; /* from the validation pass */
   bool more = (msg->flags & WIRE_MSG_MORE_TO_COME) != 0;
   const route_class_info_t *k = &route_classes[route_classify (cmd)];
   route_action_t action;

   if (k->hello && !more)
      return ROUTE_HELLO;
   /* State of the upstream connection a new one would not have: never
    * paired again, closed after a not-primary error (proxy/conn.c). */
   if (k->binds_session || more || (msg->flags & WIRE_MSG_EXHAUST_ALLOWED))
      client_event (c, CLIENT_EVENT_BINDS_SESSION);
   if (k->x509_refused && handshake_is_x509_auth (&msg->body))
      return route_refuse_x509 (c, src, len, msg, error);
   if (c->loop->pool && route_pooled (c, src, len, msg, compressor, &action, error))
      return action;
#ifdef RELAYBUS_TEST_COMMANDS
   if (k->debug_internal && !more)
      return route_done (c, debug_internal (c, src, len, msg, compressor, error));
#endif
   /* Hellos and refused X.509 logins are not counted by name. */
   counters_count_command (cmd);
   if (c->loop->hook) {
      switch (c->loop->hook (c, msg, cmd, compressor, c->loop->hook_ctx, error)) {
      case CLIENT_ROUTE_FORWARD:
         break;
      case CLIENT_ROUTE_HELD:
         /* The hook took it; unless it closed the connection (and the
          * input with it), the request's bytes go. */
         action = route_done (c, true);
         if (action == ROUTE_TAKEN)
            evbuffer_drain (src, len);
         return action;
      case CLIENT_ROUTE_ERROR:
      default:
         return route_done (c, false);
      }
   }
   if (k->never_forwarded)
      return route_refuse_unknown (c, src, len, msg, compressor, error);
   return k->watched && !c->loop->pool ? ROUTE_FORWARD_SASL : ROUTE_FORWARD;
}

/* OP_QUERY: only the legacy hello is accepted; anything else gets the
 * error mongod 5.1+ gives, as an OP_REPLY. */
route_action_t
route_query (client_conn_t *c,
             struct evbuffer *src,
             size_t len,
             const wire_query_t *q,
             int compressor,
             bson_t *hello,
             bson_error_t *error)
{
   const char *cmd = NULL;
   const char *dot = strchr (q->full_collection_name, '.');
   char errmsg[200];

   if (handshake_unwrap_query (&q->query, hello))
      cmd = wire_command_name (hello);
   if (dot && strcmp (dot, ".$cmd") == 0 && handshake_is_hello (cmd))
      return ROUTE_HELLO;
   bson_snprintf (errmsg,
                  sizeof errmsg,
                  "Unsupported OP_QUERY command: %s. The client driver may require an upgrade.",
                  cmd ? cmd : "(none)");
   return route_done (c, answer_locally (c, q->header.request_id, WIRE_OP_QUERY, compressor,
                                         SERVER_UNSUPPORTED_OP_QUERY_COMMAND, errmsg, src, len, error));
}
