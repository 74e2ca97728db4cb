/*
 * dispatch/kafka.c - kind = kafka: deliveries produced to Kafka
 * (librdkafka), as one implementation of dispatch/transport.h.
 *
 * Each delivery is one message on the handler's topic template, keyed by
 * the event's key (its id without one, so one key stays in one partition:
 * librdkafka's partitioner hashes the key), with the body and headers of
 * the handler's format in Kafka's binding (dispatch/format.h: the
 * relaybus-* headers, the event's own, and ce_* in CloudEvents' binary
 * mode).  The producer is idempotent (enable.idempotence=true,
 * acks=all): librdkafka's own retries of a batch are not duplicated by
 * the broker.  The delivery report completes the delivery; a failed one
 * is retried with the handler's backoff (the dispatcher's max_attempts
 * then makes it dead with librdkafka's error text), except the errors
 * that no retry can cure (a message too large, an invalid or forbidden
 * topic), which are dead at once.  message.timeout.ms is the handler's
 * timeout_ms, so a broker that is down gives a failed report (retried),
 * never a send that waits for ever.
 *
 * Threads: librdkafka produces asynchronously; rd_kafka_producev does not
 * block, but neither it nor the delivery reports run on the dispatcher's
 * base.  A handler has two threads of its own: one takes sends from the
 * bounded queue of its base (dispatch/transport.h's transport_base_t,
 * over dispatch/transport_queue.h) and hands them to librdkafka,
 * one serves librdkafka's callbacks (rd_kafka_poll): the delivery reports,
 * whose results go back to the dispatcher's base, the errors and the
 * statistics, from which the connection state for /readyz is read.  The
 * dispatcher keeps one delivery per key in flight, so librdkafka never
 * holds two messages of a key at once and per-key order is kept even
 * across its retries.
 *
 * `kafka.<property> = value` lines are given to rd_kafka_conf_set after the
 * settings above, so TLS, SASL and tuning (linger.ms, compression.type)
 * are librdkafka's own; they may override the defaults set here.
 *
 * Not here: transactions (an idempotent producer is enough for one
 * message per delivery), schema registries, and re-creating a producer
 * after a fatal idempotence error (its sends are retried, the state says
 * why; a restart or a reload that changes its settings makes a new one).
 */
#include "dispatch/kafka.h"
#include "dispatch/transport.h"
#include "dispatch/transport_queue.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <librdkafka/rdkafka.h>

#include "base/clock.h"
#include "base/log.h"

/* How long a stop waits for librdkafka to deliver what it holds. */
#define KAFKA_FLUSH_MS 2000
/* How long a stop waits for the reports of purged messages. */
#define KAFKA_PURGE_WAIT_MS 1000
/* The poll thread's wait for a callback; also how soon it sees a stop. */
#define KAFKA_POLL_MS 100
/* librdkafka's statistics (the connection state) this often. */
#define KAFKA_STATS_MS "1000"

typedef struct kafka_handler kafka_handler_t;

/* One send, owned by the handler's queue (dispatch/transport_queue.h).
 * The message's parts are built on the dispatcher's thread; librdkafka
 * copies key and value (RD_KAFKA_MSG_F_COPY) and takes the headers. */
typedef struct kafka_req {
   tqueue_item_t item; /* first: the queue's part */
   char *topic;
   char *key;
   char *body;
   size_t body_len;
   rd_kafka_headers_t *headers; /* NULL once librdkafka took them */
} kafka_req_t;

/* A handler's producer.  Created by kafka_start (the dispatcher's or the
 * main thread), freed by kafka_destroy once both threads are joined and
 * every message librdkafka held has reported.  The producing thread is
 * the base's; the poll thread is this kind's own, joined only after the
 * last reports were served. */
struct kafka_handler {
   transport_base_t base; /* first: the ops' object */
   int64_t timeout_ms;
   rd_kafka_t *rk;

   atomic_bool stop_poll;
   atomic_int in_flight; /* produced, report not yet served */

   pthread_t poller;
   bool have_poller;
   bool fenced; /* kafka_fence ran: nothing it held is produced any more */
};

_Static_assert (offsetof (kafka_handler_t, base) == 0, "the ops take a kafka_handler_t for its transport_base_t");

/* ------------------------------------------------ librdkafka's callbacks */

/* Errors that no retry of the same message cures: the delivery is dead
 * at once.  Everything else (the broker down, a timeout, an unknown topic
 * that may yet be created, a leader change) is retried with backoff. */
static bool
error_permanent (rd_kafka_resp_err_t err)
{
   switch (err) {
   case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
   case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
   case RD_KAFKA_RESP_ERR_INVALID_MSG:
   case RD_KAFKA_RESP_ERR_INVALID_RECORD:
   case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
   case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
   case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
   case RD_KAFKA_RESP_ERR__INVALID_ARG:
      return true;
   default:
      return false;
   }
}

/* The attempt's kind of failure: no acknowledgement within
 * message.timeout.ms (or a request's timeout), or an error the brokers
 * answered with (their codes are positive; librdkafka's own negative,
 * but for a topic it learnt does not exist); the rest (no connection,
 * all brokers down) is a plain failure. */
static transport_fault_t
error_fault (rd_kafka_resp_err_t err)
{
   if (err == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT || err == RD_KAFKA_RESP_ERR__TIMED_OUT ||
       err == RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE || err == RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT)
      return TRANSPORT_FAULT_TIMEOUT;
   if (err > 0 || err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC || err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION)
      return TRANSPORT_FAULT_REFUSED;
   return TRANSPORT_FAULT_NONE;
}

static void
fill_failure (transport_result_t *res, const char *topic, rd_kafka_resp_err_t err, const char *text)
{
   res->retry_after_ms = -1;
   res->outcome = error_permanent (err) ? TRANSPORT_OUTCOME_DEAD : TRANSPORT_OUTCOME_RETRY;
   res->fault = error_fault (err);
   transport_text (res->error,
                   sizeof res->error,
                   "kafka: produce to '%s': %s (%s)%s",
                   topic,
                   text && *text ? text : rd_kafka_err2str (err),
                   rd_kafka_err2name (err),
                   err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC || err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART
                      ? ": the topic does not exist on the brokers"
                      : "");
}

/* The poll thread (or a stop's flush): one message's report. */
static void
on_delivery (rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
   kafka_handler_t *k = opaque;
   kafka_req_t *r = m->_private;

   (void) rk;
   if (!r)
      return;
   if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      r->item.res.outcome = TRANSPORT_OUTCOME_OK;
      transport_base_set (&k->base, TRANSPORT_STATE_CONNECTED, NULL);
   } else if (m->err == RD_KAFKA_RESP_ERR__FATAL) {
      char fatal[TRANSPORT_ERROR_MAX];
      rd_kafka_resp_err_t orig = rd_kafka_fatal_error (k->rk, fatal, sizeof fatal);
      fill_failure (&r->item.res, r->topic, orig, fatal);
      r->item.res.outcome = TRANSPORT_OUTCOME_RETRY;
   } else
      fill_failure (&r->item.res, r->topic, m->err, NULL);
   if (m->err)
      log_debug ("dispatch: handler %s: %s", k->base.name, r->item.res.error);
   atomic_fetch_sub (&k->in_flight, 1);
   tqueue_done (k->base.q, &r->item);
}

/* The poll thread: librdkafka's errors.  Most of them (a connection
 * refused, a broker restarting) librdkafka recovers from by itself; they
 * are kept as the state's detail and logged at debug.  All brokers down
 * and a fatal error are logged as warnings. */
static void
on_error (rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
   kafka_handler_t *k = opaque;
   char text[TRANSPORT_DETAIL_MAX];

   if (err == RD_KAFKA_RESP_ERR__FATAL) {
      char fatal[TRANSPORT_DETAIL_MAX];
      rd_kafka_fatal_error (rk, fatal, sizeof fatal);
      transport_text (text, sizeof text, "fatal: %s", fatal);
      transport_base_set (&k->base, TRANSPORT_STATE_CLOSED, text);
      log_error ("dispatch: handler %s: Kafka producer: %s (its sends are retried; a restart makes a new producer)", k->base.name, text);
      return;
   }
   transport_text (text, sizeof text, "%s", reason ? reason : rd_kafka_err2str ((rd_kafka_resp_err_t) err));
   if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
      transport_state_t was = transport_base_set (&k->base, TRANSPORT_STATE_DISCONNECTED, text);
      if (was != TRANSPORT_STATE_DISCONNECTED && was != TRANSPORT_STATE_CLOSED)
         log_warn ("dispatch: handler %s: no Kafka broker reachable at %s (%s); sends are retried meanwhile", k->base.name, k->base.url, text);
   } else {
      /* The state stays: librdkafka recovers from these by itself. */
      transport_base_set_error (&k->base, text);
      log_debug ("dispatch: handler %s: Kafka: %s", k->base.name, text);
   }
}

/* The poll thread: librdkafka's statistics, every KAFKA_STATS_MS.  The
 * producer is connected when a broker it learned from the metadata
 * (nodeid >= 0, not a bootstrap address) is UP. */
static int
on_stats (rd_kafka_t *rk, char *json, size_t json_len, void *opaque)
{
   kafka_handler_t *k = opaque;
   bson_t *doc;
   bson_iter_t it, brokers;
   bool up = false;
   transport_state_t was;

   (void) rk;
   doc = bson_new_from_json ((const uint8_t *) json, (ssize_t) json_len, NULL);
   if (!doc)
      return 0;
   if (bson_iter_init_find (&it, doc, "brokers") && BSON_ITER_HOLDS_DOCUMENT (&it) && bson_iter_recurse (&it, &brokers))
      while (!up && bson_iter_next (&brokers)) {
         bson_iter_t b;
         int64_t nodeid = -1;
         const char *state = "";
         if (!BSON_ITER_HOLDS_DOCUMENT (&brokers) || !bson_iter_recurse (&brokers, &b))
            continue;
         while (bson_iter_next (&b)) {
            if (!strcmp (bson_iter_key (&b), "nodeid") && BSON_ITER_HOLDS_NUMBER (&b))
               nodeid = bson_iter_as_int64 (&b);
            else if (!strcmp (bson_iter_key (&b), "state") && BSON_ITER_HOLDS_UTF8 (&b))
               state = bson_iter_utf8 (&b, NULL);
         }
         up = nodeid >= 0 && !strcmp (state, "UP");
      }
   bson_destroy (doc);
   was = transport_base_get (&k->base);
   if (was == TRANSPORT_STATE_CLOSED)
      return 0;
   if (up && was != TRANSPORT_STATE_CONNECTED) {
      transport_base_set (&k->base, TRANSPORT_STATE_CONNECTED, NULL);
      log_info ("dispatch: handler %s: connected to Kafka", k->base.name);
   } else if (!up && was == TRANSPORT_STATE_CONNECTED)
      transport_base_set (&k->base, TRANSPORT_STATE_DISCONNECTED, NULL);
   return 0; /* librdkafka frees json */
}

/* librdkafka's own log lines, through the project's log. */
static void
on_log (const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
   (void) rk;
   if (level <= 2)
      log_error ("dispatch: librdkafka %s: %s", fac, buf);
   else
      log_debug ("dispatch: librdkafka %s: %s", fac, buf);
}

/* ------------------------------------------------------------ threads */

static void
req_free (tqueue_item_t *it)
{
   kafka_req_t *r = (kafka_req_t *) it; /* never NULL: the queue's or a failed send's */

   if (r->headers)
      rd_kafka_headers_destroy (r->headers);
   bson_free (r->topic);
   bson_free (r->key);
   bson_free (r->body);
   bson_free (r);
}

/* Hands r to librdkafka; a refusal (its queue full, a message too large
 * for message.max.bytes) is r's result at once. */
static void
produce_one (kafka_handler_t *k, kafka_req_t *r)
{
   rd_kafka_resp_err_t err;
   rd_kafka_headers_t *headers = r->headers;

   atomic_fetch_add (&k->in_flight, 1);
   /* Accepted, the message is librdkafka's, headers included, and its
    * delivery report may reach the dispatcher, which frees r, before
    * rd_kafka_producev even returns here: r is not touched after a
    * success, so the headers leave r before the call. */
   r->headers = NULL;
   err = rd_kafka_producev (k->rk,
                            RD_KAFKA_V_TOPIC (r->topic),
                            RD_KAFKA_V_KEY (r->key, strlen (r->key)),
                            RD_KAFKA_V_VALUE (r->body, r->body_len),
                            RD_KAFKA_V_MSGFLAGS (RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_HEADERS (headers),
                            RD_KAFKA_V_OPAQUE (r),
                            RD_KAFKA_V_END);
   if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
      return;
   /* Refused: no report comes, and the headers are still ours. */
   r->headers = headers;
   atomic_fetch_sub (&k->in_flight, 1);
   fill_failure (&r->item.res, r->topic, err, NULL);
   tqueue_done (k->base.q, &r->item);
}

static void *
producer_main (void *arg)
{
   kafka_handler_t *k = arg;

   log_set_thread_name ("kafka");
   for (;;) {
      tqueue_item_t *it = tqueue_take (k->base.q, -1);
      if (!it)
         break; /* stopped */
      produce_one (k, (kafka_req_t *) it);
   }
   return NULL;
}

static void *
poller_main (void *arg)
{
   kafka_handler_t *k = arg;

   log_set_thread_name ("kafka-poll");
   while (!atomic_load (&k->stop_poll))
      rd_kafka_poll (k->rk, KAFKA_POLL_MS);
   return NULL;
}

/* ------------------------------------------------------------ the ops */

bool
kafka_property_valid (const char *name, const char *value, bson_error_t *error)
{
   rd_kafka_conf_t *conf = rd_kafka_conf_new ();
   char errstr[256] = "";
   bool ok = rd_kafka_conf_set (conf, name, value, errstr, sizeof errstr) == RD_KAFKA_CONF_OK;

   if (!ok)
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "librdkafka: %s", errstr);
   rd_kafka_conf_destroy (conf);
   return ok;
}

static void kafka_destroy (void *impl);

static void *
kafka_start (const transport_env_t *env, const config_handler_t *h, bson_error_t *error)
{
   kafka_handler_t *k = bson_malloc0 (sizeof *k);
   rd_kafka_conf_t *conf = rd_kafka_conf_new ();
   char errstr[512] = "", timeout[32], propagation[32], backoff[32], cname[160];
   const char *failed = NULL;

   /* librdkafka holds at most the dispatcher's `concurrency` sends of
    * this handler, as the base's queue does. */
   bool queued = transport_base_init (&k->base, env, h, h->brokers, h->topic, req_free);

   k->timeout_ms = h->timeout_ms > 0 ? h->timeout_ms : 10000;
   if (!queued) {
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "handler %s: cannot set up the Kafka producer", h->name);
      goto fail;
   }
   snprintf (timeout, sizeof timeout, "%" PRId64, k->timeout_ms);
   /* An unknown topic fails within the message's time rather than after
    * librdkafka's 30 s default, so its error is the topic's. */
   snprintf (propagation, sizeof propagation, "%" PRId64, k->timeout_ms / 2 > 1000 ? k->timeout_ms / 2 : 1000);
   /* While a broker is down, librdkafka times out the messages it holds
    * for it only when its thread wakes for a reconnect: with its default
    * backoff (up to 10 s) a send's report came up to 10 s after
    * message.timeout.ms.  Reconnecting every second at most (or every
    * timeout_ms, when shorter) keeps the report near timeout_ms. */
   snprintf (backoff, sizeof backoff, "%" PRId64, k->timeout_ms < 1000 ? k->timeout_ms : 1000);
   snprintf (cname, sizeof cname, "relaybus-proxy %s", h->name);
   {
      const char *const defaults[][2] = {
         {"bootstrap.servers", h->brokers},
         {"client.id", cname},
         {"enable.idempotence", "true"},
         {"acks", "all"},
         {"message.timeout.ms", timeout},
         {"topic.metadata.propagation.max.ms", propagation},
         {"reconnect.backoff.max.ms", backoff},
         {"statistics.interval.ms", KAFKA_STATS_MS},
      };
      for (size_t i = 0; i < sizeof defaults / sizeof defaults[0] && !failed; i++)
         if (rd_kafka_conf_set (conf, defaults[i][0], defaults[i][1], errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
            failed = defaults[i][0];
   }
   for (size_t i = 0; i < h->n_kafka_props && !failed; i++)
      if (rd_kafka_conf_set (conf, h->kafka_props[2 * i], h->kafka_props[2 * i + 1], errstr, sizeof errstr) !=
          RD_KAFKA_CONF_OK)
         failed = h->kafka_props[2 * i];
   if (failed) {
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "handler %s: kafka.%s: librdkafka: %s", h->name, failed, errstr);
      goto fail;
   }
   rd_kafka_conf_set_opaque (conf, k);
   rd_kafka_conf_set_dr_msg_cb (conf, on_delivery);
   rd_kafka_conf_set_error_cb (conf, on_error);
   rd_kafka_conf_set_stats_cb (conf, on_stats);
   rd_kafka_conf_set_log_cb (conf, on_log);
   k->rk = rd_kafka_new (RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
   if (!k->rk) {
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "handler %s: the Kafka producer: librdkafka: %s", h->name, errstr);
      goto fail;
   }
   conf = NULL; /* rd_kafka_new took it */
   if (pthread_create (&k->poller, NULL, poller_main, k) == 0)
      k->have_poller = true;
   if (!k->have_poller || !transport_base_start_threads (&k->base, 1, producer_main, k)) {
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_START, "handler %s: cannot start the Kafka threads", h->name);
      goto fail;
   }
   log_info ("dispatch: handler %s: Kafka producer for %s (idempotent, acks=all, message.timeout.ms=%s)", h->name, h->brokers, timeout);
   return k;

fail:
   if (conf)
      rd_kafka_conf_destroy (conf);
   kafka_destroy (k);
   return NULL;
}

static bool
add_header (rd_kafka_headers_t *hs, const char *name, const char *value)
{
   return rd_kafka_header_add (hs, name, -1, value, -1) == RD_KAFKA_RESP_ERR_NO_ERROR;
}

static void *
kafka_send (void *impl, const store_delivery_t *d, const format_msg_t *m, transport_done_cb_t cb, void *arg, bson_error_t *error)
{
   kafka_handler_t *k = impl;
   kafka_req_t *r = bson_malloc0 (sizeof *r);
   char id[25];
   bool ok = true;

   bson_oid_to_string (&d->id, id);
   r->topic = transport_expand (k->base.tmpl, d, "");
   r->key = bson_strdup (d->key ? d->key : (d->event_id ? d->event_id : id));
   r->body = bson_strndup (m->body, m->body_len);
   r->body_len = m->body_len;
   r->headers = rd_kafka_headers_new (m->n_headers + 1);
   /* The binding's headers as rendered: the event's own, the relaybus-*
    * ones, and the ce_* ones in the cloudevents format. */
   for (size_t i = 0; i < m->n_headers && ok; i++)
      /* Kafka frames each header by length; a consumer that copies one
       * into HTTP or NATS would not, so none holds a line break either. */
      ok = format_header_safe (m->headers[i].name) && format_header_safe (m->headers[i].value) &&
           add_header (r->headers, m->headers[i].name, m->headers[i].value);
   if (!ok)
      bson_set_error (error, TRANSPORT_ERROR_DOMAIN, TRANSPORT_ERROR_SEND, "kafka: cannot set the headers of a message to '%s'", r->topic);
   return transport_base_push (&k->base, &r->item, cb, arg, ok, error);
}

/* Stops taking sends, gives librdkafka KAFKA_FLUSH_MS to deliver what it
 * holds, and purges the rest (their reports say so, and the dispatcher
 * retries them later).  After it, no message of this producer reaches the
 * broker: the dispatcher calls it at a stop before it releases the
 * deliveries and hands the lanes back, so that another proxy that takes a
 * lane over never produces a key's next message before a late flush of
 * this one's (the flush ran after the hand-back before).  Once only. */
static void
kafka_fence (void *impl)
{
   kafka_handler_t *k = impl;

   if (k->fenced)
      return;
   k->fenced = true;
   transport_base_stop (&k->base); /* the producing thread */
   if (k->rk && atomic_load (&k->in_flight) > 0) {
      int64_t until;
      rd_kafka_flush (k->rk, KAFKA_FLUSH_MS);
      rd_kafka_purge (k->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
      until = clock_mono_ms () + KAFKA_PURGE_WAIT_MS;
      while (atomic_load (&k->in_flight) > 0 && clock_mono_ms () < until)
         rd_kafka_poll (k->rk, 10);
      if (atomic_load (&k->in_flight) > 0)
         log_warn ("dispatch: handler %s: %d Kafka messages without a report at stop", k->base.name, atomic_load (&k->in_flight));
   }
}

/* Fences the producer (if the stop did not), and frees it once every
 * report was served, so that no callback runs on freed memory. */
static void
kafka_destroy (void *impl)
{
   kafka_handler_t *k = impl;

   kafka_fence (k);
   atomic_store (&k->stop_poll, true);
   if (k->have_poller)
      pthread_join (k->poller, NULL);
   transport_base_set (&k->base, TRANSPORT_STATE_CLOSED, NULL);
   if (k->rk)
      rd_kafka_destroy (k->rk);
   transport_base_fini (&k->base);
   bson_free (k);
}

/* What kafka_start copies: brokers, topic, timeout and the properties. */
static bool
kafka_settings_equal (const config_handler_t *a, const config_handler_t *b)
{
   if (strcmp (a->brokers, b->brokers) || strcmp (a->topic, b->topic) || a->timeout_ms != b->timeout_ms ||
       a->concurrency != b->concurrency || a->n_kafka_props != b->n_kafka_props)
      return false;
   for (size_t i = 0; i < 2 * a->n_kafka_props; i++)
      if (strcmp (a->kafka_props[i], b->kafka_props[i]))
         return false;
   return true;
}

/* The base's ops, and a fence. */
const transport_ops_t transport_kafka_ops = TRANSPORT_BASE_OPS ("kafka", kafka, kafka_fence);
