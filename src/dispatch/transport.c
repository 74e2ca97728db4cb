/*
 * dispatch/transport.c - the handler interface's dispatch by kind, and
 * what the broker kinds share: subject and routing templates, and their
 * base (the queue to their publishing threads, the connection state and
 * its last error, cancel, stop and join).
 *
 * A transport_t is the kind's ops and its object; the kind's client lives
 * in the kind's own file (webhook.c, kafka.c, nats.c, rabbitmq.c).
 * Nothing here does network I/O.
 */
#include "dispatch/transport.h"
#include "dispatch/transport_queue.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "autoconf.h"
#include "base/assert.h"

/* Owned by the dispatcher's handler; impl by the kind.  transport_req_t
 * is never defined: it names the kind's own request object. */
struct transport {
   const transport_ops_t *ops;
   void *impl;
};

static const char *const outcome_names[] = {
   [TRANSPORT_OUTCOME_OK] = "ok",
   [TRANSPORT_OUTCOME_RETRY] = "retry",
   [TRANSPORT_OUTCOME_DEAD] = "dead",
   [TRANSPORT_OUTCOME_GONE] = "gone",
};

static const char *const state_names[] = {
   [TRANSPORT_STATE_NONE] = "none",
   [TRANSPORT_STATE_CONNECTING] = "connecting",
   [TRANSPORT_STATE_CONNECTED] = "connected",
   [TRANSPORT_STATE_DISCONNECTED] = "disconnected",
   [TRANSPORT_STATE_CLOSED] = "closed",
};

outbox_attempt_outcome_t
transport_attempt_outcome (const transport_result_t *res)
{
   switch (res->outcome) {
   case TRANSPORT_OUTCOME_OK:
      return OUTBOX_ATTEMPT_SUCCEEDED;
   case TRANSPORT_OUTCOME_GONE:
      return OUTBOX_ATTEMPT_RELEASED; /* given back uncharged, the handler disabled */
   default:
      return res->fault == TRANSPORT_FAULT_TIMEOUT   ? OUTBOX_ATTEMPT_TIMED_OUT
             : res->fault == TRANSPORT_FAULT_REFUSED ? OUTBOX_ATTEMPT_REFUSED
                                                     : OUTBOX_ATTEMPT_FAILED;
   }
}

const char *
transport_outcome_name (transport_outcome_t o)
{
   return (size_t) o < sizeof outcome_names / sizeof outcome_names[0] ? outcome_names[o] : "?";
}

const char *
transport_state_name (transport_state_t s)
{
   return (size_t) s < sizeof state_names / sizeof state_names[0] ? state_names[s] : "?";
}

bool
transport_kind_dispatched (handler_kind_t kind)
{
   return kind == HANDLER_KIND_WEBHOOK || kind == HANDLER_KIND_NATS || kind == HANDLER_KIND_RABBITMQ ||
          kind == HANDLER_KIND_KAFKA;
}

const transport_ops_t *
transport_ops_for (const config_handler_t *h)
{
   switch (h->kind_id) {
   case HANDLER_KIND_WEBHOOK:
      return &transport_webhook_ops;
   case HANDLER_KIND_NATS:
#ifdef RELAYBUS_HAVE_NATS
      return &transport_nats_ops;
#else
      return NULL;
#endif
   case HANDLER_KIND_RABBITMQ:
#ifdef RELAYBUS_HAVE_RABBITMQ
      return &transport_rabbitmq_ops;
#else
      return NULL;
#endif
   case HANDLER_KIND_KAFKA:
#ifdef RELAYBUS_HAVE_KAFKA
      return &transport_kafka_ops;
#else
      return NULL;
#endif
   case HANDLER_KIND_PULL:
   default:
      return NULL;
   }
}

transport_t *
transport_new (const transport_env_t *env, const config_handler_t *h, bson_error_t *error)
{
   const transport_ops_t *ops = transport_ops_for (h);
   transport_t *t;
   void *impl;

   if (!ops) {
      bson_set_error (error,
                      TRANSPORT_ERROR_DOMAIN,
                      TRANSPORT_ERROR_KIND,
                      "handler %s: kind = %s: %s",
                      h->name,
                      h->kind ? h->kind : "?",
                      h->kind_id == HANDLER_KIND_NATS       ? "this build has no NATS support"
                      : h->kind_id == HANDLER_KIND_RABBITMQ ? "this build has no RabbitMQ support"
                      : h->kind_id == HANDLER_KIND_KAFKA    ? "this build has no Kafka support"
                                                            : "not dispatched by the proxy");
      return NULL;
   }
   impl = ops->start (env, h, error);
   if (!impl)
      return NULL;
   t = bson_malloc0 (sizeof *t);
   t->ops = ops;
   t->impl = impl;
   return t;
}

void
transport_destroy (transport_t *t)
{
   if (!t)
      return;
   t->ops->destroy (t->impl);
   bson_free (t);
}

const char *
transport_kind (const transport_t *t)
{
   return t->ops->kind;
}

transport_req_t *
transport_send (transport_t *t, const store_delivery_t *d, const format_msg_t *m, transport_done_cb_t cb, void *arg, bson_error_t *error)
{
   return (transport_req_t *) t->ops->send (t->impl, d, m, cb, arg, error);
}

void
transport_cancel (transport_t *t, transport_req_t *req)
{
   if (req)
      t->ops->cancel (t->impl, req);
}

void
transport_fence (transport_t *t)
{
   if (t && t->ops->fence)
      t->ops->fence (t->impl);
}

transport_state_t
transport_state (transport_t *t, char *detail, size_t detail_len)
{
   transport_state_t st;

   if (detail_len)
      detail[0] = '\0';
   st = t->ops->state (t->impl, detail, detail_len);
   if (detail_len && detail[0]) {
      /* A broker's connection error may quote its URL or its password
       * (the admin port's /readyz shows it): masked here, for every kind. */
      char *masked = config_mask (NULL, detail);
      bson_strncpy (detail, masked, detail_len);
      bson_free (masked);
   }
   return st;
}

bool
transport_settings_equal (const config_handler_t *a, const config_handler_t *b)
{
   const transport_ops_t *ops = transport_ops_for (a);

   return a->kind_id == b->kind_id && ops && ops->settings_equal (a, b);
}

/* ------------------------------------------------------------ templates */

static void
append_clean (bson_string_t *s, const char *v, const char *bad)
{
   for (; *v; v++)
      bson_string_append_c (s, strchr (bad, *v) ? '_' : *v);
}

char *
transport_expand (const char *tmpl, const store_delivery_t *d, const char *bad)
{
   bson_string_t *s = bson_string_new (NULL);
   const char *type = d->event_type ? d->event_type : "";
   const char *key = d->key ? d->key : (d->event_id ? d->event_id : "");

   for (const char *p = tmpl; *p;) {
      if (!strncmp (p, "{type}", 6)) {
         append_clean (s, type, bad);
         p += 6;
      } else if (!strncmp (p, "{type_prefix}", 13)) {
         const char *dot = strchr (type, '.');
         char *prefix = bson_strndup (type, dot ? (size_t) (dot - type) : strlen (type));
         append_clean (s, prefix, bad);
         bson_free (prefix);
         p += 13;
      } else if (!strncmp (p, "{key}", 5)) {
         append_clean (s, key, bad);
         p += 5;
      } else
         bson_string_append_c (s, *p++);
   }
   return bson_string_free (s, false);
}

bool
transport_template_valid (const char *tmpl, char *why, size_t why_len)
{
   for (const char *c = strchr (tmpl, '{'); c; c = strchr (c + 1, '{'))
      if (strncmp (c, "{type}", 6) != 0 && strncmp (c, "{key}", 5) != 0) {
         snprintf (why, why_len, "'%s': only {type} and {key} may be replaced", tmpl);
         return false;
      }
   return true;
}

void
transport_text (char *out, size_t len, const char *fmt, ...)
{
   va_list ap;

   va_start (ap, fmt);
   vsnprintf (out, len, fmt, ap);
   va_end (ap);
}

/* ------------------------------------------------- the broker kinds' base */

bool
transport_base_init (transport_base_t *b,
                     const transport_env_t *env,
                     const config_handler_t *h,
                     const char *url,
                     const char *tmpl,
                     void (*free_fn) (struct tqueue_item *))
{
   memset (b, 0, sizeof *b);
   b->name = bson_strdup (h->name);
   b->url = bson_strdup (url);
   b->tmpl = bson_strdup (tmpl);
   b->free_fn = free_fn;
   pthread_mutex_init (&b->mu, NULL);
   atomic_store (&b->state, TRANSPORT_STATE_CONNECTING);
   /* The dispatcher never has more than `concurrency` sends of a handler
    * in flight; twice that leaves room for cancelled sends still being
    * published. */
   b->q = tqueue_new (env->base, (size_t) (h->concurrency > 0 ? h->concurrency : 1) * 2, free_fn);
   return b->q != NULL;
}

bool
transport_base_start_threads (transport_base_t *b, size_t n, void *(*fn) (void *), void *arg)
{
   RELAYBUS_ASSERT (b->n_threads == 0 && n <= TRANSPORT_THREADS_MAX);
   pthread_mutex_lock (&b->mu);
   for (size_t i = 0; i < n; i++) {
      if (pthread_create (&b->threads[i], NULL, fn, arg) != 0)
         break;
      b->n_threads++;
   }
   pthread_mutex_unlock (&b->mu);
   return b->n_threads > 0;
}

void
transport_base_set_error (transport_base_t *b, const char *error)
{
   pthread_mutex_lock (&b->mu);
   bson_strncpy (b->last_error, error, sizeof b->last_error);
   pthread_mutex_unlock (&b->mu);
}

transport_state_t
transport_base_set (transport_base_t *b, transport_state_t state, const char *error)
{
   if (error)
      transport_base_set_error (b, error);
   return (transport_state_t) atomic_exchange (&b->state, (int) state);
}

transport_state_t
transport_base_get (transport_base_t *b)
{
   return (transport_state_t) atomic_load (&b->state);
}

void
transport_base_last_error (transport_base_t *b, char *out, size_t out_len)
{
   pthread_mutex_lock (&b->mu);
   bson_strncpy (out, b->last_error, out_len);
   pthread_mutex_unlock (&b->mu);
}

void *
transport_base_push (
   transport_base_t *b, struct tqueue_item *it, transport_done_cb_t cb, void *arg, bool built, bson_error_t *error)
{
   it->cb = cb;
   it->arg = arg;
   if (built && tqueue_push (b->q, it, error))
      return it;
   b->free_fn (it);
   return NULL;
}

void
transport_base_cancel (void *impl, void *req)
{
   transport_base_t *b = impl;

   tqueue_cancel (b->q, (tqueue_item_t *) req);
}

/* The detail only when not connected: a connected client's last error is
 * history.  transport_state masks it. */
transport_state_t
transport_base_state (void *impl, char *detail, size_t detail_len)
{
   transport_base_t *b = impl;
   transport_state_t s = transport_base_get (b);

   if (s != TRANSPORT_STATE_CONNECTED)
      transport_base_last_error (b, detail, detail_len);
   return s;
}

void
transport_base_stop (transport_base_t *b)
{
   if (b->q)
      tqueue_stop (b->q);
   for (size_t i = 0; i < b->n_threads; i++)
      pthread_join (b->threads[i], NULL);
   b->n_threads = 0;
}

void
transport_base_fini (transport_base_t *b)
{
   RELAYBUS_ASSERT (b->n_threads == 0); /* stopped first: no thread holds a send */
   tqueue_destroy (b->q);
   b->q = NULL;
   pthread_mutex_destroy (&b->mu);
   bson_free (b->name);
   bson_free (b->url);
   bson_free (b->tmpl);
   b->name = b->url = b->tmpl = NULL;
}
