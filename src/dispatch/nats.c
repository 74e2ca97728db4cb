/*
 * dispatch/nats.c - kind = nats: deliveries published to NATS JetStream
 * (nats.c, libnats), as one implementation of dispatch/transport.h.
 *
 * Each delivery is one message on the handler's subject template, with
 * the body and headers of the handler's format in NATS's binding
 * (dispatch/format.h: the relaybus-* headers, the event's own, and ce-*
 * in CloudEvents' binary mode) and the header Nats-Msg-Id = the delivery
 * id (JetStream's duplicate window drops a resend of it).  The stream's PubAck
 * completes the delivery; no answer (no stream captures the subject), a
 * JetStream error, a lost connection or no PubAck within timeout_ms is a
 * retry, the dispatcher's backoff and max_attempts apply, then the
 * delivery is dead with that error.
 *
 * Threads: libnats publishes synchronously, so sends never run on the
 * dispatcher's base.  A handler has a few publishing threads of its own
 * (at most NATS_THREADS_MAX, at most its concurrency) that take sends
 * from the bounded queue of its base (dispatch/transport.h's
 * transport_base_t, over dispatch/transport_queue.h), publish with
 * js_PublishMsg (which waits for the PubAck, at most timeout_ms) and hand
 * the results back to the dispatcher's base.  The dispatcher keeps one delivery per
 * key in flight, so threads publishing side by side never reorder a key.
 * The connection (libnats's own threads) reconnects by itself, forever;
 * a send while it is not connected fails at once (retried with backoff)
 * instead of waiting in libnats's reconnect buffer.
 *
 * Not here: TLS and authentication settings beyond what the URL carries
 * (nats://user:password@host, tls://host), and publishing without
 * JetStream (core NATS has no confirmation to complete on).
 */
#include "dispatch/transport.h"
#include "dispatch/transport_queue.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <nats/nats.h>

#include "base/clock.h"
#include "base/log.h"

/* Publishing threads per handler, at most (and at most its concurrency). */
#define NATS_THREADS_MAX TRANSPORT_THREADS_MAX
/* How long a stop waits for libnats to report the connection closed. */
#define NATS_CLOSE_WAIT_MS 2000
/* Characters a substituted {type} or {key} may not bring into a subject. */
#define NATS_SUBJECT_BAD " \t\r\n*>"

typedef struct nats_handler nats_handler_t;

/* One send, owned by the handler's queue (dispatch/transport_queue.h). */
typedef struct nats_req {
   tqueue_item_t item; /* first: the queue's part */
   natsMsg *msg;       /* built on the dispatcher's thread */
   char id[25];        /* the delivery id: Nats-Msg-Id */
   char *subject;
} nats_req_t;

/* A handler's client.  Created by nats_start (the dispatcher's or the
 * main thread), freed by nats_destroy once its threads are joined and
 * the connection reported closed. */
struct nats_handler {
   transport_base_t base; /* first: the ops' object; its mu guards the three flags below */
   int64_t timeout_ms;

   pthread_cond_t cv; /* with base.mu: connection made, stop, closed */
   bool stop;
   bool closed; /* libnats called the closed handler */
   bool connect_done;

   natsOptions *opts;
   natsConnection *nc;
   jsCtx *js;
};

_Static_assert (offsetof (nats_handler_t, base) == 0, "the ops take a nats_handler_t for its transport_base_t");

/* ------------------------------------------------------------ callbacks */

/* The connection's state, with "what: text" as its last error. */
static transport_state_t
set_state (nats_handler_t *n, transport_state_t state, const char *what, const char *text)
{
   char error[TRANSPORT_DETAIL_MAX];

   transport_text (error, sizeof error, "%s%s%s", what, text && *text ? ": " : "", text ? text : "");
   return transport_base_set (&n->base, state, error);
}

/* libnats's threads: the connection's state. */
static void
on_connected (natsConnection *nc, void *closure)
{
   nats_handler_t *n = closure;

   (void) nc;
   transport_base_set (&n->base, TRANSPORT_STATE_CONNECTED, NULL);
   log_info ("dispatch: handler %s: connected to NATS", n->base.name);
}

static void
on_disconnected (natsConnection *nc, void *closure)
{
   nats_handler_t *n = closure;

   (void) nc;
   if (transport_base_get (&n->base) == TRANSPORT_STATE_CLOSED)
      return;
   set_state (n, TRANSPORT_STATE_DISCONNECTED, "disconnected; reconnecting", NULL);
   log_warn ("dispatch: handler %s: disconnected from NATS; reconnecting (sends are retried meanwhile)", n->base.name);
}

static void
on_reconnected (natsConnection *nc, void *closure)
{
   nats_handler_t *n = closure;

   (void) nc;
   transport_base_set (&n->base, TRANSPORT_STATE_CONNECTED, NULL);
   log_info ("dispatch: handler %s: reconnected to NATS", n->base.name);
}

static void
on_closed (natsConnection *nc, void *closure)
{
   nats_handler_t *n = closure;

   (void) nc;
   transport_base_set (&n->base, TRANSPORT_STATE_CLOSED, NULL);
   pthread_mutex_lock (&n->base.mu);
   n->closed = true;
   pthread_cond_broadcast (&n->cv);
   pthread_mutex_unlock (&n->base.mu);
}

/* ------------------------------------------------------------ publishing */

static void
req_free (tqueue_item_t *it)
{
   nats_req_t *r = (nats_req_t *) it; /* never NULL: the queue's or a failed send's */

   natsMsg_Destroy (r->msg);
   bson_free (r->subject);
   bson_free (r);
}

/* The publishing thread's result for r. */
static void
publish_one (nats_handler_t *n, nats_req_t *r)
{
   transport_result_t *res = &r->item.res;
   jsPubOptions po;
   jsPubAck *pa = NULL;
   jsErrCode jerr = 0;
   natsStatus s;
   char detail[TRANSPORT_DETAIL_MAX];

   res->retry_after_ms = -1;
   res->outcome = TRANSPORT_OUTCOME_RETRY;
   if (!n->js || natsConnection_Status (n->nc) != NATS_CONN_STATUS_CONNECTED) {
      transport_base_last_error (&n->base, detail, sizeof detail);
      transport_text (res->error, sizeof res->error, "nats: not connected to %s%s%s", n->base.url, *detail ? ": " : "", detail);
      return;
   }
   jsPubOptions_Init (&po);
   po.MaxWait = n->timeout_ms; /* Nats-Msg-Id is a header of the message already */
   s = js_PublishMsg (&pa, n->js, r->msg, &po, &jerr);
   if (s == NATS_OK) {
      res->outcome = TRANSPORT_OUTCOME_OK;
      jsPubAck_Destroy (pa);
      return;
   }
   /* No stream captures the subject, or JetStream answered an error: the
    * server refused it; no PubAck in time: a timeout. */
   res->fault = s == NATS_TIMEOUT ? TRANSPORT_FAULT_TIMEOUT : s == NATS_NO_RESPONDERS || jerr ? TRANSPORT_FAULT_REFUSED : TRANSPORT_FAULT_NONE;
   if (s == NATS_NO_RESPONDERS)
      transport_text (res->error,
                      sizeof res->error,
                      "nats: publish to '%s': no stream captures the subject (%s)",
                      r->subject,
                      natsStatus_GetText (s));
   else if (s == NATS_TIMEOUT)
      transport_text (res->error, sizeof res->error, "nats: publish to '%s': no PubAck within %" PRId64 " ms", r->subject, n->timeout_ms);
   else {
      const char *text = nats_GetLastError (NULL);
      if (jerr)
         transport_text (res->error,
                         sizeof res->error,
                         "nats: publish to '%s': %s (JetStream error %d)",
                         r->subject,
                         text && *text ? text : natsStatus_GetText (s),
                         (int) jerr);
      else
         transport_text (res->error, sizeof res->error, "nats: publish to '%s': %s", r->subject, text && *text ? text : natsStatus_GetText (s));
   }
}

/* Connects (libnats keeps trying in the background when the server is
 * not there: the connected handler says when it is). */
static void
connect_once (nats_handler_t *n)
{
   natsConnection *nc = NULL;
   jsCtx *js = NULL;
   jsOptions jo;
   natsStatus s = natsConnection_Connect (&nc, n->opts);

   if (s == NATS_OK || s == NATS_NOT_YET_CONNECTED) {
      jsOptions_Init (&jo);
      jo.Wait = n->timeout_ms;
      if (natsConnection_JetStream (&js, nc, &jo) != NATS_OK) {
         const char *text = nats_GetLastError (NULL);
         log_error ("dispatch: handler %s: JetStream context: %s", n->base.name, text ? text : "?");
      }
   }
   if (s == NATS_OK) {
      /* on_connected runs only for a connection made in the background. */
      transport_base_set (&n->base, TRANSPORT_STATE_CONNECTED, NULL);
      log_info ("dispatch: handler %s: connected to NATS", n->base.name);
   } else if (s == NATS_NOT_YET_CONNECTED) {
      log_warn ("dispatch: handler %s: cannot connect to NATS at %s yet (%s); retrying in the background",
                n->base.name,
                n->base.url,
                natsStatus_GetText (s));
   } else {
      const char *text = nats_GetLastError (NULL);
      log_error ("dispatch: handler %s: cannot connect to NATS at %s: %s",
                 n->base.name,
                 n->base.url,
                 text && *text ? text : natsStatus_GetText (s));
   }
   /* Not connected yet, or never (a bad URL): still CONNECTING, which is
    * what /readyz shows, with why. */
   if (s != NATS_OK)
      set_state (n, TRANSPORT_STATE_CONNECTING, "connecting", natsStatus_GetText (s));
   pthread_mutex_lock (&n->base.mu);
   n->nc = nc;
   n->js = js;
   n->connect_done = true;
   if (s != NATS_OK && s != NATS_NOT_YET_CONNECTED)
      n->closed = true; /* no connection: nothing will call on_closed */
   pthread_cond_broadcast (&n->cv);
   pthread_mutex_unlock (&n->base.mu);
}

/* The first thread connects; the others wait for it. */
static void *
publisher_main (void *arg)
{
   nats_handler_t *n = arg;
   bool first;

   pthread_mutex_lock (&n->base.mu);
   first = !n->connect_done && n->base.threads[0] == pthread_self ();
   pthread_mutex_unlock (&n->base.mu);
   if (first)
      connect_once (n);
   pthread_mutex_lock (&n->base.mu);
   while (!n->connect_done && !n->stop)
      pthread_cond_wait (&n->cv, &n->base.mu);
   pthread_mutex_unlock (&n->base.mu);
   for (;;) {
      tqueue_item_t *it = tqueue_take (n->base.q, -1);
      if (!it)
         break; /* stopped */
      publish_one (n, (nats_req_t *) it);
      tqueue_done (n->base.q, it);
   }
   return NULL;
}

/* ------------------------------------------------------------- the ops */

static void nats_destroy (void *impl);

static void *
nats_start (const transport_env_t *env, const config_handler_t *h, bson_error_t *error)
{
   nats_handler_t *n = bson_malloc0 (sizeof *n);
   size_t want = h->concurrency < NATS_THREADS_MAX ? (size_t) h->concurrency : NATS_THREADS_MAX;
   char cname[128];
   natsStatus s = NATS_OK;

   bool queued = transport_base_init (&n->base, env, h, h->url, h->subject, req_free);

   n->timeout_ms = h->timeout_ms > 0 ? h->timeout_ms : 10000;
   pthread_cond_init (&n->cv, NULL);
   snprintf (cname, sizeof cname, "relaybus-proxy %s", h->name);
   if (!queued || natsOptions_Create (&n->opts) != NATS_OK) {
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "handler %s: cannot set up the NATS client", h->name);
      goto fail;
   }
   if ((s = natsOptions_SetURL (n->opts, h->url)) != NATS_OK || (s = natsOptions_SetName (n->opts, cname)) != NATS_OK ||
       (s = natsOptions_SetTimeout (n->opts, n->timeout_ms < 2000 ? n->timeout_ms : 2000)) != NATS_OK ||
       (s = natsOptions_SetAllowReconnect (n->opts, true)) != NATS_OK ||
       (s = natsOptions_SetMaxReconnect (n->opts, -1)) != NATS_OK ||
       (s = natsOptions_SetReconnectWait (n->opts, 250)) != NATS_OK ||
       (s = natsOptions_SetRetryOnFailedConnect (n->opts, true, on_connected, n)) != NATS_OK ||
       (s = natsOptions_SetDisconnectedCB (n->opts, on_disconnected, n)) != NATS_OK ||
       (s = natsOptions_SetReconnectedCB (n->opts, on_reconnected, n)) != NATS_OK ||
       (s = natsOptions_SetClosedCB (n->opts, on_closed, n)) != NATS_OK) {
      const char *text = nats_GetLastError (NULL);
      char *masked = config_mask ("url", h->url);
      bson_set_error (error,
                      TRANSPORT_ERROR_DOMAIN,
                      TRANSPORT_ERROR_START,
                      "handler %s: url \"%s\": %s",
                      h->name,
                      masked,
                      text && *text ? text : natsStatus_GetText (s));
      bson_free (masked);
      goto fail;
   }
   if (!transport_base_start_threads (&n->base, want, publisher_main, n)) {
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "handler %s: cannot start a publishing thread", h->name);
      goto fail;
   }
   return n;

fail:
   nats_destroy (n);
   return NULL;
}

static void *
nats_send (void *impl, const store_delivery_t *d, const format_msg_t *m, transport_done_cb_t cb, void *arg, bson_error_t *error)
{
   nats_handler_t *n = impl;
   nats_req_t *r = NULL;
   bool ok = true;

   r = bson_malloc0 (sizeof *r);
   bson_oid_to_string (&d->id, r->id);
   r->subject = transport_expand (n->base.tmpl, d, NATS_SUBJECT_BAD);
   if (natsMsg_Create (&r->msg, r->subject, NULL, m->body, (int) m->body_len) != NATS_OK) {
      const char *text = nats_GetLastError (NULL);
      bson_set_error (error,
                      TRANSPORT_ERROR_DOMAIN,
                      TRANSPORT_ERROR_SEND,
                      "nats: a message to '%s': %s",
                      r->subject,
                      text && *text ? text : "cannot be made");
      return transport_base_push (&n->base, &r->item, cb, arg, false, error);
   }
   /* The binding's headers as rendered (names libnats carries, none of
    * them Nats-*), then Nats-Msg-Id. */
   for (size_t i = 0; i < m->n_headers && ok; i++)
      /* libnats writes both as they are, each line ended by CRLF: one that
       * holds a line break (format_render encodes them) is refused. */
      ok = format_header_safe (m->headers[i].name) && format_header_safe (m->headers[i].value) &&
           natsMsgHeader_Add (r->msg, m->headers[i].name, m->headers[i].value) == NATS_OK;
   ok = ok && natsMsgHeader_Set (r->msg, "Nats-Msg-Id", r->id) == NATS_OK;
   if (!ok)
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_SEND, "nats: cannot set the headers of a message to '%s'", r->subject);
   return transport_base_push (&n->base, &r->item, cb, arg, ok, error);
}

/* Joins the threads (each finishes the publish it is in, at most
 * timeout_ms), closes the connection and waits for libnats to say so
 * (bounded), so that none of its callbacks runs on freed memory. */
static void
nats_destroy (void *impl)
{
   nats_handler_t *n = impl;
   struct timespec until;

   /* The threads that wait for the first connection wait no more. */
   pthread_mutex_lock (&n->base.mu);
   n->stop = true;
   pthread_cond_broadcast (&n->cv);
   pthread_mutex_unlock (&n->base.mu);
   transport_base_stop (&n->base);
   if (n->js)
      jsCtx_Destroy (n->js);
   if (n->nc) {
      natsConnection_Close (n->nc);
      clock_gettime (CLOCK_REALTIME, &until);
      until.tv_sec += NATS_CLOSE_WAIT_MS / 1000;
      pthread_mutex_lock (&n->base.mu);
      while (!n->closed)
         if (pthread_cond_timedwait (&n->cv, &n->base.mu, &until) != 0)
            break;
      pthread_mutex_unlock (&n->base.mu);
      natsConnection_Destroy (n->nc);
   }
   natsOptions_Destroy (n->opts);
   pthread_cond_destroy (&n->cv);
   transport_base_fini (&n->base);
   bson_free (n);
}

/* What nats_start copies: url, subject, timeout and the thread count. */
static bool
nats_settings_equal (const config_handler_t *a, const config_handler_t *b)
{
   return !strcmp (a->url, b->url) && !strcmp (a->subject, b->subject) && a->timeout_ms == b->timeout_ms &&
          a->concurrency == b->concurrency;
}

const transport_ops_t transport_nats_ops = TRANSPORT_BASE_OPS ("nats", nats, NULL);
