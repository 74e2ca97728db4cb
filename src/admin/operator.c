/*
 * admin/operator.c - the operator's commands on the admin port: POST
 * /api/pause, /api/resume, /api/reconnect, /api/clients/ID/close and
 * /api/handlers/NAME/disable and /enable.
 *
 * Each command is handed to proxy/operator.h, which carries it to the
 * forwarding loops by posts that never block them; this thread answers at
 * once, with what it asked, not with what the loops did (a close of a
 * connection that ends meanwhile is no error).  When a loop's wake-up queue
 * was full, a timer on this thread posts again every
 * OPERATOR_KICK_RETRY_MS until every loop took its command.
 *
 * The bodies are empty or "{}", with Content-Type: application/json like
 * every POST of the port: a form on another origin cannot send that
 * without a preflight, which is never answered, so a browser cannot be
 * made to pause the proxy.  The token (when set) is checked by the router.
 *
 * A handler's state is the outbox's (store/fleet.h, handler_states), not
 * this process's: the disable and enable write it there, blocking this
 * thread for one write, and every proxy's dispatcher reads it at its next
 * heartbeat.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "admin/admin_private.h"
#include "base/clock.h"
#include "base/counters.h"
#include "base/log.h"
#include "proxy/clients.h"
#include "proxy/operator.h"
#include "store/fleet.h"

/* Posts what proxy/operator.h could not post yet, and while something
 * still does not fit, again from a timer. */
static void admin_operator_kick (admin_t *a);

#define OPERATOR_KICK_RETRY_MS 10
#define OPERATOR_CLIENTS_PREFIX "/api/clients/"
#define OPERATOR_CLOSE_SUFFIX "/close"
#define OPERATOR_HANDLERS_PREFIX "/api/handlers/"
#define OPERATOR_DISABLE_SUFFIX "/disable"
#define OPERATOR_ENABLE_SUFFIX "/enable"
/* Longer than any handler name the configuration accepts. */
#define OPERATOR_HANDLER_NAME_MAX 256

/* Empty, or a JSON object without fields, sent as JSON (file comment). */
static bool
empty_json_body (admin_t *a, struct evhttp_request *req)
{
   const char *ct = evhttp_find_header (evhttp_request_get_input_headers (req), "Content-Type");
   struct evbuffer *in = evhttp_request_get_input_buffer (req);
   size_t len = evbuffer_get_length (in);
   bson_t doc;
   bson_error_t err;
   unsigned char *data;
   bool ok;

   if (!ct || strncasecmp (ct, "application/json", 16) != 0 || (ct[16] && ct[16] != ';' && ct[16] != ' ')) {
      admin_send_error (a, req, 415, "send Content-Type: application/json (the body may be empty)");
      return false;
   }
   if (len == 0)
      return true;
   data = evbuffer_pullup (in, (ev_ssize_t) len);
   ok = data && data[strspn ((const char *) data, " \t\r\n")] == '{' &&
        bson_init_from_json (&doc, (const char *) data, (ssize_t) len, &err);
   if (!ok) {
      admin_send_error (a, req, 400, "the body must be empty or {}");
      return false;
   }
   ok = bson_count_keys (&doc) == 0;
   bson_destroy (&doc);
   if (!ok)
      admin_send_error (a, req, 400, "this command takes no fields");
   return ok;
}

static void
kick_cb (evutil_socket_t fd, short what, void *arg)
{
   admin_t *a = arg;

   (void) fd;
   (void) what;
   admin_operator_kick (a);
}

static void
admin_operator_kick (admin_t *a)
{
   struct timeval tv = clock_timeval_ms (OPERATOR_KICK_RETRY_MS);

   if (operator_kick ())
      return;
   if (!a->operator_kick_ev)
      a->operator_kick_ev = evtimer_new (worker_base (a->w), kick_cb, a);
   if (a->operator_kick_ev)
      evtimer_add (a->operator_kick_ev, &tv);
   else
      log_warn ("admin: no memory for the operator's retry timer: a loop takes its command at the next one");
}

static void
answer (admin_t *a, struct evhttp_request *req, const char *key, bool changed)
{
   bson_t doc = BSON_INITIALIZER;

   BSON_APPEND_BOOL (&doc, key, changed);
   BSON_APPEND_BOOL (&doc, "paused", operator_paused ());
   admin_operator_kick (a);
   admin_send_json (req, 200, "OK", &doc);
   bson_destroy (&doc);
}

void
admin_api_pause (admin_t *a, struct evhttp_request *req)
{
   char peer[80];
   bool changed;

   if (!empty_json_body (a, req))
      return;
   changed = operator_pause ();
   log_info ("admin: %s: pause: %s", admin_peer_of (req, peer, sizeof peer),
             changed ? "new client requests wait until POST /api/resume; what is in flight goes on"
                     : "paused already");
   answer (a, req, "changed", changed);
}

void
admin_api_resume (admin_t *a, struct evhttp_request *req)
{
   char peer[80];
   bool changed;

   if (!empty_json_body (a, req))
      return;
   changed = operator_resume ();
   log_info ("admin: %s: resume: %s", admin_peer_of (req, peer, sizeof peer),
             changed ? "the requests held are read again" : "not paused");
   answer (a, req, "changed", changed);
}

void
admin_api_reconnect (admin_t *a, struct evhttp_request *req)
{
   char peer[80];
   uint64_t gen;
   bson_t doc = BSON_INITIALIZER;

   if (!empty_json_body (a, req))
      goto done;
   gen = operator_reconnect ();
   log_info ("admin: %s: reconnect (generation %" PRIu64 "): upstream connections close as they come free",
             admin_peer_of (req, peer, sizeof peer),
             gen);
   admin_operator_kick (a);
   BSON_APPEND_INT64 (&doc, "generation", (int64_t) gen);
   admin_send_json (req, 200, "OK", &doc);
done:
   bson_destroy (&doc);
}

bool
admin_operator_route (const char *path)
{
   size_t n = strlen (path), np = strlen (OPERATOR_CLIENTS_PREFIX), ns = strlen (OPERATOR_CLOSE_SUFFIX);

   return n > np + ns && !strncmp (path, OPERATOR_CLIENTS_PREFIX, np) && !strcmp (path + n - ns, OPERATOR_CLOSE_SUFFIX);
}

void
admin_api_client_close (admin_t *a, struct evhttp_request *req)
{
   const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri (req);
   const char *path = uri ? evhttp_uri_get_path (uri) : NULL;
   const char *id_text;
   char digits[24], peer[80];
   size_t len;
   char *end;
   unsigned long long id;
   unsigned loop = 0;
   bson_error_t err;
   bson_t doc = BSON_INITIALIZER;

   if (!path || !admin_operator_route (path)) {
      admin_send_error (a, req, 404, "no such endpoint");
      goto done;
   }
   id_text = path + strlen (OPERATOR_CLIENTS_PREFIX);
   len = strlen (id_text) - strlen (OPERATOR_CLOSE_SUFFIX);
   if (len == 0 || len >= sizeof digits || strspn (id_text, "0123456789") != len) {
      admin_send_error (a, req, 400, "the id must be a connection id as GET /api/clients lists it");
      goto done;
   }
   memcpy (digits, id_text, len);
   digits[len] = '\0';
   id = strtoull (digits, &end, 10);
   if (!empty_json_body (a, req))
      goto done;
   if (!clients_registry_loop_of ((uint64_t) id, &loop)) {
      admin_send_error (a, req, 404, "no client connection %llu is open", id);
      goto done;
   }
   if (!operator_close_client ((uint64_t) id, loop, &err)) {
      admin_send_error (a, req, 503, "%s", err.message);
      goto done;
   }
   log_info ("admin: %s: closing client connection c%llu (loop %u)", admin_peer_of (req, peer, sizeof peer), id, loop);
   admin_operator_kick (a);
   BSON_APPEND_INT64 (&doc, "id", (int64_t) id);
   BSON_APPEND_INT32 (&doc, "loop", (int32_t) loop);
   BSON_APPEND_BOOL (&doc, "closing", true);
   admin_send_json (req, 200, "OK", &doc);
done:
   bson_destroy (&doc);
}

/* The handler NAME of "/api/handlers/NAME/<suffix>" (copied into out), or
 * false. */
static bool
handler_of_path (const char *path, const char *suffix, char *out, size_t out_len)
{
   size_t n = strlen (path), np = strlen (OPERATOR_HANDLERS_PREFIX), ns = strlen (suffix), len;

   if (n <= np + ns || strncmp (path, OPERATOR_HANDLERS_PREFIX, np) != 0 || strcmp (path + n - ns, suffix) != 0)
      return false;
   len = n - np - ns;
   if (len >= out_len || memchr (path + np, '/', len))
      return false;
   memcpy (out, path + np, len);
   out[len] = '\0';
   return true;
}

const char *
admin_handler_route (const char *path)
{
   char name[OPERATOR_HANDLER_NAME_MAX];

   if (handler_of_path (path, OPERATOR_DISABLE_SUFFIX, name, sizeof name))
      return "/api/handlers/NAME/disable";
   if (handler_of_path (path, OPERATOR_ENABLE_SUFFIX, name, sizeof name))
      return "/api/handlers/NAME/enable";
   return NULL;
}

static void
handler_state_change (admin_t *a, struct evhttp_request *req, bool disable)
{
   const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri (req);
   const char *path = uri ? evhttp_uri_get_path (uri) : NULL;
   char name[OPERATOR_HANDLER_NAME_MAX], peer[80];
   bool known = false, changed = false, ok;
   bson_error_t err;
   bson_t doc = BSON_INITIALIZER;

   if (!path || !handler_of_path (path, disable ? OPERATOR_DISABLE_SUFFIX : OPERATOR_ENABLE_SUFFIX, name, sizeof name)) {
      admin_send_error (a, req, 404, "no such endpoint");
      goto done;
   }
   if (!empty_json_body (a, req))
      goto done;
   for (size_t i = 0; i < a->cfg->n_handlers && !known; i++) {
      known = !strcmp (a->cfg->handlers[i].name, name);
      /* The dispatchers honour the state; a pull handler's consumers claim
       * for themselves (stop them instead). */
      if (known && disable && a->cfg->handlers[i].kind_id == HANDLER_KIND_PULL) {
         admin_send_error (a, req, 400, "handler %s is a pull handler: its consumers claim its deliveries", name);
         goto done;
      }
   }
   /* Enabling is allowed for any name: a handler this proxy no longer
    * declares may still be disabled in the outbox. */
   if (disable && !known) {
      admin_send_error (a, req, 404, "no handler %s is configured on this proxy", name);
      goto done;
   }
   ok = disable ? store_fleet_disable (a->store, name, "operator", &changed, &err)
                : store_fleet_enable (a->store, name, &changed, &err);
   if (!ok) {
      admin_send_error (a, req, 502, "%s", err.message);
      goto done;
   }
   if (changed)
      counters_add_at (COUNTER_HANDLER_STATE_CHANGES, disable ? COUNTERS_STATE_OPERATOR : COUNTERS_STATE_ENABLED, 1);
   log_warn ("admin: %s: handler %s %s",
             admin_peer_of (req, peer, sizeof peer),
             name,
             !changed   ? (disable ? "disable: disabled already" : "enable: not disabled")
             : disable  ? "disabled by the operator: its deliveries wait as pending (every proxy within one heartbeat)"
                        : "enabled by the operator: its waiting deliveries are sent (every proxy within one heartbeat)");
   admin_view_invalidate (a);
   BSON_APPEND_UTF8 (&doc, "handler", name);
   BSON_APPEND_BOOL (&doc, "changed", changed);
   BSON_APPEND_UTF8 (&doc, "state", disable ? "disabled" : "enabled");
   admin_send_json (req, 200, "OK", &doc);

done:
   bson_destroy (&doc);
}

void
admin_api_handler_disable (admin_t *a, struct evhttp_request *req)
{
   handler_state_change (a, req, true);
}

void
admin_api_handler_enable (admin_t *a, struct evhttp_request *req)
{
   handler_state_change (a, req, false);
}
