/*
 * proxy/pool_open.c - a pooled connection's opening (proxy/pool_private.h):
 * connecting (TLS included) to the primary, the hello that the pool's
 * clients are told of, and the login as the configured upstream user
 * (SCRAM or X.509), all within one deadline of upstream_connect_timeout_ms;
 * and the callbacks of a connection the pool holds (opening or idle).
 * What a connection does once it is open (lent, given back, pinned,
 * closed) is proxy/pool.c's, and so is how many may be open (the budget).
 */
#include "proxy/pool_private.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "autoconf.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/servercodes.h"
#include "codec/sasl.h"
#include "codec/scram.h"
#include "proxy/operator.h"
#include "proxy/side.h"

static atomic_uint_fast64_t next_server_id;

/* An opening failed: counted, logged, retried after a backoff while
 * somebody waits for a connection. */
static void
open_failed (pool_server_t *s, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

static void
open_failed (pool_server_t *s, const char *fmt, ...)
{
   pool_t *pool = s->pool;
   va_list ap;

   va_start (ap, fmt);
   vsnprintf (pool->last_error, sizeof pool->last_error, fmt, ap);
   va_end (ap);
   counters_add (COUNTER_POOL_CONNECT_FAILURES, 1);
   log_warn ("pool: cannot open a connection to %s: %s (next attempt in %" PRId64 " ms)", s->name, pool->last_error,
             pool->backoff_ms ? pool->backoff_ms : POOL_BACKOFF_MIN_MS);
   topology_request_refresh (pool->loop->topo, "pooled upstream connection failed");
   server_close (s, pool->last_error);
   pool->backoff_ms = pool->backoff_ms ? pool->backoff_ms * 2 : POOL_BACKOFF_MIN_MS;
   if (pool->backoff_ms > POOL_BACKOFF_MAX_MS)
      pool->backoff_ms = POOL_BACKOFF_MAX_MS;
   if (!pool->retry_armed) {
      struct timeval tv = clock_timeval_ms (pool->backoff_ms);
      pool->retry_armed = true;
      evtimer_add (pool->retry_timer, &tv);
   }
}

/* ------------------------------------------------------------ opening */

static bool
send_cmd (pool_server_t *s, const bson_t *cmd)
{
   int32_t id = s->next_id++;

   if (!wire_append_msg (side_output (&s->side), id, 0, 0, cmd, NULL, 0))
      return false;
   s->expect = id;
   side_flush (&s->side);
   return true;
}

/* What the pool's clients are told of the upstream: the hello of its
 * newest logged-in connection.  Clients accepted before the first one
 * was ready may shake hands now. */
static void
learn_hello (pool_server_t *s)
{
   pool_t *pool = s->pool;

   if (pool->hello)
      bson_destroy (pool->hello);
   pool->hello = s->hello;
   s->hello = NULL;
   if (pool->want_hello) {
      pool->want_hello = false;
      client_loop_hello_learned (pool->loop);
   }
}

static void
server_ready (pool_server_t *s)
{
   pool_t *pool = s->pool;

   pool->n_opening--;
   evtimer_del (s->deadline);
   scram_client_destroy (s->scram);
   s->scram = NULL;
   pool->backoff_ms = 0;
   pool->last_error[0] = '\0';
   counters_add (COUNTER_POOL_CONNECTS, 1);
   log_debug ("pool: p%" PRIu64 " %s ready (%u open on this loop)", s->id, s->name, pool->n_open);
   server_set_state (s, SERVER_BACK);
   learn_hello (s);
   starve_update (pool);
   server_free_for_use (s);
}

/* The hello reply: what the pool's clients will be told, and how to log in. */
static void
on_hello (pool_server_t *s, const bson_t *reply)
{
   pool_t *pool = s->pool;
   const config_upstream_auth_t *auth = &pool_cfg (pool)->upstream_auth;
   bson_iter_t it;
   bool writable = false;

   if (bson_iter_init_find (&it, reply, "isWritablePrimary") || bson_iter_init_find (&it, reply, "ismaster"))
      writable = bson_iter_as_bool (&it);
   if (bson_iter_init_find (&it, reply, "msg") && BSON_ITER_HOLDS_UTF8 (&it) &&
       strcmp (bson_iter_utf8 (&it, NULL), "isdbgrid") == 0)
      writable = true;
   if (!writable) {
      s->stale = true;
      open_failed (s, "it is not the primary any more");
      return;
   }
   s->hello = bson_copy (reply);
   if (!auth->user && !(auth->mechanism && strcmp (auth->mechanism, "MONGODB-X509") == 0)) {
      server_ready (s);
      return;
   }
   if (auth->mechanism && strcmp (auth->mechanism, "MONGODB-X509") == 0) {
      bson_t cmd = BSON_INITIALIZER;
      BSON_APPEND_INT32 (&cmd, "authenticate", 1);
      BSON_APPEND_UTF8 (&cmd, "mechanism", "MONGODB-X509");
      if (auth->user)
         BSON_APPEND_UTF8 (&cmd, "user", auth->user);
      BSON_APPEND_UTF8 (&cmd, "$db", "$external");
      s->step = STEP_X509;
      if (!send_cmd (s, &cmd))
         open_failed (s, "cannot send authenticate");
      bson_destroy (&cmd);
      return;
   }
   /* SCRAM: the URI's mechanism, else SCRAM-SHA-256 when the server lists
    * it for the user, else SCRAM-SHA-1 (the authentication spec's rule). */
   s->mech = AUTHFILE_SCRAM_SHA_1;
   if (auth->mechanism) {
      (void) authfile_mech_from_name (auth->mechanism, strlen (auth->mechanism), &s->mech);
   } else if (bson_iter_init_find (&it, reply, "saslSupportedMechs") && BSON_ITER_HOLDS_ARRAY (&it)) {
      bson_iter_t m;
      if (bson_iter_recurse (&it, &m))
         while (bson_iter_next (&m))
            if (BSON_ITER_HOLDS_UTF8 (&m) && strcmp (bson_iter_utf8 (&m, NULL), "SCRAM-SHA-256") == 0)
               s->mech = AUTHFILE_SCRAM_SHA_256;
   }
   {
      bson_error_t error;
      char *first = NULL;
      size_t first_len = 0;
      bson_t cmd = BSON_INITIALIZER, opts;
      bool ok;

      s->scram = scram_client_new (s->mech, auth->user, auth->password ? auth->password : "", &error);
      if (!s->scram || !scram_client_first (s->scram, &first, &first_len, &error)) {
         open_failed (s, "SCRAM as %s: %s", auth->user, error.message);
         return;
      }
      BSON_APPEND_INT32 (&cmd, "saslStart", 1);
      BSON_APPEND_UTF8 (&cmd, "mechanism", authfile_mech_name (s->mech));
      BSON_APPEND_BINARY (&cmd, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *) first, (uint32_t) first_len);
      BSON_APPEND_INT32 (&cmd, "autoAuthorize", 1);
      BSON_APPEND_DOCUMENT_BEGIN (&cmd, "options", &opts);
      BSON_APPEND_BOOL (&opts, "skipEmptyExchange", true);
      bson_append_document_end (&cmd, &opts);
      BSON_APPEND_UTF8 (&cmd, "$db", auth->source);
      s->step = STEP_SASL_START;
      ok = send_cmd (s, &cmd);
      bson_destroy (&cmd);
      bson_free (first);
      if (!ok)
         open_failed (s, "cannot send saslStart");
   }
}

static bool
reply_done (const bson_t *reply)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, reply, "done") && bson_iter_as_bool (&it);
}

static void
send_sasl_continue (pool_server_t *s, const char *payload, size_t len, open_step_t step)
{
   const config_upstream_auth_t *auth = &pool_cfg (s->pool)->upstream_auth;
   bson_t cmd = BSON_INITIALIZER;
   bool ok;

   BSON_APPEND_INT32 (&cmd, "saslContinue", 1);
   BSON_APPEND_INT32 (&cmd, "conversationId", s->conversation_id);
   BSON_APPEND_BINARY (&cmd, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *) payload, (uint32_t) len);
   BSON_APPEND_UTF8 (&cmd, "$db", auth->source);
   s->step = step;
   ok = send_cmd (s, &cmd);
   bson_destroy (&cmd);
   if (!ok)
      open_failed (s, "cannot send saslContinue");
}

/* One reply of the opening.  Errors close the connection. */
static void
on_open_reply (pool_server_t *s, const bson_t *reply)
{
   const config_upstream_auth_t *auth = &pool_cfg (s->pool)->upstream_auth;
   bson_iter_t it;
   bson_error_t error;
   const uint8_t *payload;
   uint32_t plen;

   if (!bson_iter_init_find (&it, reply, "ok") || bson_iter_as_double (&it) != 1.0) {
      const char *msg = "no errmsg";
      if (bson_iter_init_find (&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8 (&it))
         msg = bson_iter_utf8 (&it, NULL);
      if (s->step == STEP_HELLO)
         open_failed (s, "hello refused: %s", msg);
      else
         open_failed (s, "login as %s refused: %s", auth->user ? auth->user : "(certificate)", msg);
      return;
   }
   switch (s->step) {
   case STEP_HELLO:
      on_hello (s, reply);
      return;
   case STEP_X509:
      server_ready (s);
      return;
   case STEP_SASL_START: {
      char *final = NULL;
      size_t final_len = 0;
      if (bson_iter_init_find (&it, reply, "conversationId") && BSON_ITER_HOLDS_NUMBER (&it))
         s->conversation_id = (int32_t) bson_iter_as_int64 (&it);
      if (!sasl_payload (reply, "payload", &payload, &plen)) {
         open_failed (s, "saslStart reply has no payload");
         return;
      }
      if (!scram_client_final (s->scram, payload, plen, &s->pool->salt, &final, &final_len, &error)) {
         open_failed (s, "SCRAM as %s: %s", auth->user, error.message);
         return;
      }
      send_sasl_continue (s, final, final_len, STEP_SASL_CONTINUE);
      bson_free (final);
      return;
   }
   case STEP_SASL_CONTINUE:
      if (!sasl_payload (reply, "payload", &payload, &plen) || !scram_client_verify (s->scram, payload, plen, &error)) {
         open_failed (s, "SCRAM as %s: the server's signature does not verify", auth->user);
         return;
      }
      if (reply_done (reply))
         server_ready (s);
      else
         send_sasl_continue (s, "", 0, STEP_SASL_EMPTY);
      return;
   case STEP_SASL_EMPTY:
      if (reply_done (reply))
         server_ready (s);
      else
         open_failed (s, "SCRAM as %s: the conversation did not end", auth->user);
      return;
   case STEP_CONNECT:
   default:
      open_failed (s, "a reply before the hello");
      return;
   }
}

static void
send_hello (pool_server_t *s)
{
   const config_upstream_auth_t *auth = &pool_cfg (s->pool)->upstream_auth;
   bson_t cmd = BSON_INITIALIZER, client, sub;
   bool ok;

   BSON_APPEND_INT32 (&cmd, "hello", 1);
   BSON_APPEND_BOOL (&cmd, "helloOk", true);
   BSON_APPEND_DOCUMENT_BEGIN (&cmd, "client", &client);
   BSON_APPEND_DOCUMENT_BEGIN (&client, "application", &sub);
   BSON_APPEND_UTF8 (&sub, "name", "relaybus-proxy pool");
   bson_append_document_end (&client, &sub);
   BSON_APPEND_DOCUMENT_BEGIN (&client, "driver", &sub);
   BSON_APPEND_UTF8 (&sub, "name", "relaybus-proxy");
   BSON_APPEND_UTF8 (&sub, "version", PACKAGE_VERSION);
   bson_append_document_end (&client, &sub);
   BSON_APPEND_DOCUMENT_BEGIN (&client, "os", &sub);
   BSON_APPEND_UTF8 (&sub, "type", "Linux");
   bson_append_document_end (&client, &sub);
   bson_append_document_end (&cmd, &client);
   if (auth->user && !auth->mechanism) {
      char *ns = bson_strdup_printf ("%s.%s", auth->source, auth->user);
      BSON_APPEND_UTF8 (&cmd, "saslSupportedMechs", ns);
      bson_free (ns);
   }
   BSON_APPEND_UTF8 (&cmd, "$db", "admin");
   s->step = STEP_HELLO;
   ok = send_cmd (s, &cmd);
   bson_destroy (&cmd);
   if (!ok)
      open_failed (s, "cannot send hello");
}

/* ------------------------------------------------------------ callbacks */

/* Bytes from a connection the pool holds: replies of the opening, or, from
 * an idle one, something nobody asked for. */
static void
pool_side_read (side_t *side)
{
   pool_server_t *s = side->owner;
   struct evbuffer *in = side_input (side);

   while (evbuffer_get_length (in) >= WIRE_HEADER_LEN) {
      wire_header_t h;
      wire_msg_t reply;
      bson_error_t error;
      const uint8_t *buf = evbuffer_pullup (in, WIRE_HEADER_LEN);

      if (s->state != SERVER_OPENING) {
         server_close (s, "the server sent bytes nobody asked for");
         return;
      }
      if (!buf || !wire_peek_header (buf, WIRE_HEADER_LEN, &h) || !wire_check_header (&h, POOL_HANDSHAKE_MAX_REPLY, &error)) {
         open_failed (s, "bad reply header");
         return;
      }
      if (evbuffer_get_length (in) < (size_t) h.length)
         break;
      buf = evbuffer_pullup (in, h.length);
      if (h.opcode != WIRE_OP_MSG || h.response_to != s->expect || !buf ||
          !wire_parse_msg (buf, (size_t) h.length, &reply, &error)) {
         open_failed (s, "bad reply to the proxy's own request");
         return;
      }
      {
         /* A copy: the reply may close (and free) the connection. */
         bson_t *body = bson_copy (&reply.body);
         evbuffer_drain (in, (size_t) h.length);
         on_open_reply (s, body);
         bson_destroy (body);
      }
      /* The connection may be closed (freed), lent or idle now. */
      return;
   }
   if (s->state == SERVER_IDLE && evbuffer_get_length (in) > 0)
      server_close (s, "the server sent bytes nobody asked for");
}

static void
pool_side_drained (side_t *side)
{
   (void) side;
}

static void
pool_side_event (side_t *side, side_event_t ev, const char *detail)
{
   pool_server_t *s = side->owner;

   switch (ev) {
   case SIDE_EVENT_CONNECTED:
      s->counted_open = true;
      counters_add (COUNTER_POOL_CONNECTIONS, 1);
      counters_add (COUNTER_UPSTREAMS_OPEN, 1);
      counters_add (COUNTER_UPSTREAM_CONNECTS, 1);
      if (!side_go_direct (&s->side, s->pool->loop->base)) {
         open_failed (s, "out of memory");
         return;
      }
      side_set_reading (&s->side, true);
      send_hello (s);
      return;
   case SIDE_EVENT_CONNECT_FAILED:
      counters_add (COUNTER_UPSTREAM_CONNECT_FAILURES, 1);
      open_failed (s, "%s", detail ? detail : "connect failed");
      return;
   case SIDE_EVENT_EOF:
   case SIDE_EVENT_ERROR:
   default:
      if (s->state == SERVER_OPENING) {
         open_failed (s, "%s", ev == SIDE_EVENT_EOF ? "the server closed the connection" : detail);
         return;
      }
      topology_request_refresh (s->pool->loop->topo, "pooled upstream connection lost");
      {
         pool_t *pool = s->pool;
         server_close (s, ev == SIDE_EVENT_EOF ? "the server closed the connection" : detail); /* frees s */
         pool_fill (pool);
      }
      return;
   }
}

static void
pool_side_timeout (side_t *side)
{
   pool_server_t *s = side->owner;

   open_failed (s, "a partial reply stalled");
}

const side_callbacks_t pool_side_cb = {
   .on_read = pool_side_read,
   .on_drained = pool_side_drained,
   .on_event = pool_side_event,
   .on_timeout = pool_side_timeout,
};

static void
deadline_cb (evutil_socket_t fd, short what, void *arg)
{
   pool_server_t *s = arg;

   (void) fd;
   (void) what;
   open_failed (s, "not logged in within upstream_connect_timeout_ms=%" PRId64,
                pool_cfg (s->pool)->upstream_connect_timeout_ms);
}

/* Opens one more connection to the primary, with the budget the caller
 * took (budget_take; a connection gives it back when it closes); false
 * when none is known (the budget goes back) or the attempt failed at once
 * (it is retried). */
bool
server_open (pool_t *pool)
{
   topology_primary_t p;
   pool_server_t *s;
   bson_error_t error;
   struct timeval tv;

   topology_get_primary (pool->loop->topo, &p);
   if (p.state != TOPOLOGY_STATE_PRIMARY) {
      bson_snprintf (pool->last_error, sizeof pool->last_error, "no primary known (%s)",
                     p.last_error[0] ? p.last_error : topology_state_name (p.state));
      /* Quietly: waking the starving loops would only have them find no
       * primary either, and wake this one again.  They fill when the
       * topology names one (pool_topology_changed). */
      budget_untake (pool);
      return false;
   }
   s = bson_malloc0 (sizeof *s);
   s->pool = pool;
   s->id = atomic_fetch_add_explicit (&next_server_id, 1, memory_order_relaxed) + 1;
   s->generation = p.generation;
   s->op_generation = operator_generation ();
   /* What the loop was told may lag what the snapshot says now. */
   pool->primary_known = true;
   pool->generation = p.generation;
   s->next_id = 1;
   server_set_state (s, SERVER_OPENING);
   s->step = STEP_CONNECT;
   bson_snprintf (s->name, sizeof s->name, "%s:%u", p.host, (unsigned) p.port);
   s->deadline = evtimer_new (pool->loop->base, deadline_cb, s);
   s->next = pool->servers;
   if (pool->servers)
      pool->servers->prev = s;
   pool->servers = s;
   pool->n_open++;
   pool->n_opening++;
   budget_note_open (pool);
   if (!s->deadline) {
      open_failed (s, "out of memory");
      return false;
   }
   tv = clock_timeval_ms (pool_cfg (pool)->upstream_connect_timeout_ms);
   evtimer_add (s->deadline, &tv);
   if (!side_connect (&s->side, pool->loop->base, &p, pool->loop->tls, &pool_side_cb, s, &error)) {
      if (error.domain == SIDE_ERROR_DOMAIN && error.code == SIDE_ERR_CONNECT)
         counters_add (COUNTER_UPSTREAM_CONNECT_FAILURES, 1);
      open_failed (s, "%s", error.message);
      return false;
   }
   log_debug ("pool: p%" PRIu64 " connecting to %s (%u open on this loop)", s->id, s->name, pool->n_open);
   return true;
}
