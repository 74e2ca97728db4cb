/*
 * base/config_handler.c - a [handler NAME] section of the configuration:
 * its kafka.* and header.* lines, kept as pairs in file order, and the
 * checks of the whole section once the file is read (the kind and what
 * each kind needs, the TLS files, format and json, the retry schedule
 * into delays, the event patterns).
 *
 * base/config.c owns the key table, the parsing of lines and the
 * snapshots; it calls config_validate_handler for each handler of a
 * snapshot it validates.  This file does not read files or the
 * environment (the file form of kafka.* is config.c's) and does not act
 * on a handler: the dispatcher and the consumer read the snapshot.
 */
#include "base/config.h"
#include "base/config_private.h"
#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <bson/bson.h>

/* Appends (name, value) to a handler's list of pairs `*pairs` (`*n` pairs,
 * at most `max`), refusing a name already there: compared without case
 * when `nocase`.  `what` names the lines in the message on the bound. */
static bool
config_add_pair (char ***pairs, size_t *n, size_t max, bool nocase, const char *what, const char *name,
                 const char *value, char *why, size_t why_len)
{
   for (size_t i = 0; i < *n; i++)
      if ((nocase ? strcasecmp ((*pairs)[2 * i], name) : strcmp ((*pairs)[2 * i], name)) == 0) {
         snprintf (why, why_len, "set twice");
         return false;
      }
   if (*n >= max) {
      snprintf (why, why_len, "at most %zu %s per handler", max, what);
      return false;
   }
   *pairs = bson_realloc (*pairs, 2 * (*n + 1) * sizeof (char *));
   (*pairs)[2 * *n] = bson_strdup (name);
   (*pairs)[2 * *n + 1] = bson_strdup (value);
   (*n)++;
   return true;
}

/* kafka.<name> = value of a [handler]: kept as written, in order, for
 * librdkafka (checked by config_validate_kafka). */
bool
config_add_kafka_prop (config_handler_t *h, const char *name, const char *value, char *why, size_t why_len)
{
   if (!*name || !config_valid_name (name, 128, "._-")) {
      snprintf (why, why_len, "'%s' is not a librdkafka property name", name);
      return false;
   }
   return config_add_pair (&h->kafka_props, &h->n_kafka_props, CONFIG_KAFKA_PROPS_MAX, false, "kafka.* properties",
                           name, value, why, why_len);
}

/* header.<name> = value of a [handler]: kept in file order for the
 * webhook client (checked by config_validate_webhook_egress).  Names are
 * compared without case, as HTTP does. */
bool
config_add_header (config_handler_t *h, const char *name, const char *value, char *why, size_t why_len)
{
   if (!*name) {
      snprintf (why, why_len, "a header name is needed after 'header.'");
      return false;
   }
   return config_add_pair (&h->headers, &h->n_headers, CONFIG_HEADERS_MAX, true, "header.* keys", name, value, why,
                           why_len);
}

static bool
config_split_patterns (config_handler_t *h, const char *origin, bson_error_t *error)
{
   const char *p = h->events, *item;
   size_t len;

   h->event_patterns = bson_malloc0 ((config_list_count (p) + 1) * sizeof (char *));
   while (config_list_next (&p, &item, &len)) {
      char *pat = bson_strndup (item, len);
      char *star = strchr (pat, '*');

      h->event_patterns[h->n_event_patterns++] = pat;
      if (star && star[1] != '\0') {
         config_error (error, origin, 0,
                       "[handler %s] events: '%s': '*' may only end a pattern", h->name, pat);
         return false;
      }
   }
   if (h->n_event_patterns == 0) {
      config_error (error, origin, 0, "[handler %s] events: at least one event type or prefix is needed", h->name);
      return false;
   }
   return true;
}

/* retry_schedule into retry_delays_ms; max_attempts, when not set,
 * follows from it: the first attempt and one retry per delay. */
static bool
config_split_retry_schedule (config_handler_t *h, const char *origin, bson_error_t *error)
{
   const char *p = h->retry_schedule, *item;
   size_t n = config_list_count (p), len;

   if (n == 0) {
      config_error (error, origin, 0,
                    "[handler %s] retry_schedule: at least one delay is needed (max_attempts = 1 retries nothing)",
                    h->name);
      return false;
   }
   if (n > CONFIG_RETRY_DELAYS_MAX) {
      config_error (error, origin, 0, "[handler %s] retry_schedule: more than %d delays", h->name,
                    CONFIG_RETRY_DELAYS_MAX);
      return false;
   }
   h->retry_delays_ms = bson_malloc0 (n * sizeof (int64_t));
   while (config_list_next (&p, &item, &len)) {
      char one[64];
      char why[192];
      int64_t ms;

      snprintf (one, sizeof one, "%.*s", (int) (len < sizeof one - 1 ? len : sizeof one - 1), item);
      if (len >= sizeof one || !config_parse_duration (one, &ms, why, sizeof why)) {
         if (len >= sizeof one)
            snprintf (why, sizeof why, "'%.32s...' is not a duration", one);
         config_error (error, origin, 0, "[handler %s] retry_schedule: %s", h->name, why);
         return false;
      }
      if (ms > CONFIG_RETRY_DELAY_MAX_MS) {
         config_error (error, origin, 0, "[handler %s] retry_schedule: '%s' is longer than 7d", h->name, one);
         return false;
      }
      h->retry_delays_ms[h->n_retry_delays++] = ms;
   }
   if (h->max_attempts == 0)
      h->max_attempts = 1 + (int64_t) h->n_retry_delays;
   return true;
}

/* kind = nats: a build with libnats, the server URL(s) and a subject
 * template that makes a valid subject for any event. */
static bool
config_validate_nats (const config_handler_t *h, const char *origin, bson_error_t *error)
{
   const char *p = h->url, *item;
   size_t len, n = 0;

#ifndef RELAYBUS_HAVE_NATS
   config_error (error, origin, 0,
                 "[handler %s] kind = nats: this build has no NATS support (build with libnats, Debian libnats-dev)",
                 h->name);
   return false;
#endif
   while (config_list_next (&p, &item, &len)) {
      while (len > 0 && isspace ((unsigned char) *item))
         item++, len--;
      while (len > 0 && isspace ((unsigned char) item[len - 1]))
         len--;
      n++;
      if (!(len > 7 && strncmp (item, "nats://", 7) == 0) && !(len > 6 && strncmp (item, "tls://", 6) == 0)) {
         config_error (error, origin, 0, "[handler %s] kind = nats: url: '%.*s' is not nats://host:port or tls://host:port",
                       h->name, (int) (len < 64 ? len : 64), item);
         return false;
      }
   }
   if (n == 0) {
      config_error (error, origin, 0, "[handler %s] kind = nats needs url = nats://host:port (comma-separated for several)",
                    h->name);
      return false;
   }
   if (!*h->subject) {
      config_error (error, origin, 0, "[handler %s] kind = nats needs subject (a template, e.g. events.{type})", h->name);
      return false;
   }
   for (const char *c = h->subject; *c; c++)
      if (*c == ' ' || *c == '\t' || *c == '\r' || *c == '\n' || *c == '*' || *c == '>') {
         config_error (error, origin, 0,
                       "[handler %s] subject: '%s': a subject to publish to holds no white space, '*' or '>'",
                       h->name, h->subject);
         return false;
      }
   if (h->subject[0] == '.' || h->subject[strlen (h->subject) - 1] == '.' || strstr (h->subject, "..")) {
      config_error (error, origin, 0, "[handler %s] subject: '%s' has an empty token", h->name, h->subject);
      return false;
   }
   for (const char *c = strchr (h->subject, '{'); c; c = strchr (c + 1, '{'))
      if (strncmp (c, "{type}", 6) != 0 && strncmp (c, "{key}", 5) != 0) {
         config_error (error, origin, 0, "[handler %s] subject: '%s': only {type} and {key} may be replaced", h->name,
                       h->subject);
         return false;
      }
   return true;
}

/* kind = rabbitmq: a build with librabbitmq, an amqp:// or amqps:// URL
 * (the TLS files only with amqps, readable), an exchange and a routing
 * key template. */
static bool
config_validate_rabbitmq (const config_handler_t *h, const char *origin, bson_error_t *error)
{
   bool tls;

#ifndef RELAYBUS_HAVE_RABBITMQ
   config_error (error, origin, 0,
                 "[handler %s] kind = rabbitmq: this build has no RabbitMQ support (build with librabbitmq, Debian librabbitmq-dev)",
                 h->name);
   return false;
#endif
   if (!*h->url) {
      config_error (error, origin, 0, "[handler %s] kind = rabbitmq needs url = amqp://host:5672/vhost (the user and password before the host, as user:password@)", h->name);
      return false;
   }
   tls = strncmp (h->url, "amqps://", 8) == 0;
   if (!tls && strncmp (h->url, "amqp://", 7) != 0) {
      char *masked = config_mask ("url", h->url);
      config_error (error, origin, 0, "[handler %s] kind = rabbitmq: url: '%s' is not amqp:// or amqps://", h->name, masked);
      bson_free (masked);
      return false;
   }
   if (!tls && (*h->tls_ca_file || *h->tls_cert_file || *h->tls_key_file)) {
      config_error (error, origin, 0, "[handler %s] tls_ca_file, tls_cert_file and tls_key_file need an amqps:// url", h->name);
      return false;
   }
   /* The same rules as [proxy]'s TLS files: loaded by the publishing
    * thread at each connect, so a wrong path is refused here by its key. */
   if (!!*h->tls_cert_file != !!*h->tls_key_file) {
      config_error (error, origin, 0, "[handler %s] tls_cert_file and tls_key_file go together (%s is not set)", h->name,
                    *h->tls_cert_file ? "tls_key_file" : "tls_cert_file");
      return false;
   }
   {
      const char *files[] = {h->tls_ca_file, h->tls_cert_file, h->tls_key_file};
      const char *names[] = {"tls_ca_file", "tls_cert_file", "tls_key_file"};

      for (int i = 0; i < 3; i++)
         if (*files[i] && access (files[i], R_OK) != 0) {
            config_error (error, origin, 0, "[handler %s] %s: cannot read '%s': %s", h->name, names[i], files[i],
                          strerror (errno));
            return false;
         }
   }
   if (!*h->exchange) {
      config_error (error, origin, 0, "[handler %s] kind = rabbitmq needs exchange (the name of an existing exchange)", h->name);
      return false;
   }
   for (const char *c = strchr (h->routing_key, '{'); c; c = strchr (c + 1, '{'))
      if (strncmp (c, "{type}", 6) != 0 && strncmp (c, "{key}", 5) != 0) {
         config_error (error, origin, 0, "[handler %s] routing_key: '%s': only {type} and {key} may be replaced", h->name,
                       h->routing_key);
         return false;
      }
   if (strlen (h->routing_key) > 255 || strlen (h->exchange) > 255) {
      config_error (error, origin, 0, "[handler %s] exchange and routing_key are at most 255 bytes", h->name);
      return false;
   }
   return true;
}

/* kind = kafka: a build with librdkafka, the brokers, a topic template
 * and kafka.* properties librdkafka accepts (config_checks). */
static bool
config_validate_kafka (const config_handler_t *h, const char *origin, bson_error_t *error)
{
#ifndef RELAYBUS_HAVE_KAFKA
   config_error (error, origin, 0,
                 "[handler %s] kind = kafka: this build has no Kafka support (build with librdkafka, Debian librdkafka-dev)",
                 h->name);
   return false;
#endif
   if (!*h->brokers) {
      config_error (error, origin, 0, "[handler %s] kind = kafka needs brokers = host:port (comma-separated for several)",
                    h->name);
      return false;
   }
   if (!*h->topic) {
      config_error (error, origin, 0, "[handler %s] kind = kafka needs topic (a template, e.g. {type})", h->name);
      return false;
   }
   for (const char *c = strchr (h->topic, '{'); c; c = strchr (c + 1, '{'))
      if (strncmp (c, "{type}", 6) != 0 && strncmp (c, "{key}", 5) != 0 && strncmp (c, "{type_prefix}", 13) != 0) {
         config_error (error, origin, 0, "[handler %s] topic: '%s': only {type}, {type_prefix} and {key} may be replaced", h->name,
                       h->topic);
         return false;
      }
   for (size_t i = 0; i < h->n_kafka_props && config_checks_installed ()->kafka_property_valid; i++) {
      bson_error_t sub;
      const char *name = h->kafka_props[2 * i], *value = h->kafka_props[2 * i + 1];

      if (!config_checks_installed ()->kafka_property_valid (name, value, &sub)) {
         config_error (error, origin, 0, "[handler %s] kafka.%s: %s", h->name, name, sub.message);
         return false;
      }
   }
   return true;
}

/* A webhook's header.* lines and proxy, by the dispatcher's rules
 * (config_checks): refused at start-up and reload rather than at the first
 * request. */
static bool
config_validate_webhook_egress (const config_handler_t *h, const char *origin, bson_error_t *error)
{
   bson_error_t sub;

   for (size_t i = 0; i < h->n_headers && config_checks_installed ()->header_valid; i++)
      if (!config_checks_installed ()->header_valid (h->headers[2 * i], h->headers[2 * i + 1], &sub)) {
         config_error (error, origin, 0, "[handler %s] header.%s: %s", h->name, h->headers[2 * i], sub.message);
         return false;
      }
   if (*h->proxy && config_checks_installed ()->proxy_valid && !config_checks_installed ()->proxy_valid (h->proxy, &sub)) {
      char *masked = config_mask ("proxy", h->proxy);
      config_error (error, origin, 0, "[handler %s] proxy: '%s' %s", h->name, masked, sub.message);
      bson_free (masked);
      return false;
   }
   return true;
}

/* A webhook's tls_* files: for an https:// url, the certificate with its
 * key, each readable, and (config_checks) loadable and matching, so that
 * start-up and reload refuse what the dispatcher could not use. */
static bool
config_validate_webhook_tls (const config_handler_t *h, const char *origin, bson_error_t *error)
{
   const char *files[] = {h->tls_ca_file, h->tls_cert_file, h->tls_key_file};
   const char *names[] = {"tls_ca_file", "tls_cert_file", "tls_key_file"};
   bson_error_t sub;

   if (!*h->tls_ca_file && !*h->tls_cert_file && !*h->tls_key_file)
      return true;
   if (strncmp (h->url, "https://", 8) != 0) {
      config_error (error, origin, 0, "[handler %s] tls_ca_file, tls_cert_file and tls_key_file need an https:// url",
                    h->name);
      return false;
   }
   if (!!*h->tls_cert_file != !!*h->tls_key_file) {
      config_error (error, origin, 0, "[handler %s] tls_cert_file and tls_key_file go together (%s is not set)", h->name,
                    *h->tls_cert_file ? "tls_key_file" : "tls_cert_file");
      return false;
   }
   for (int i = 0; i < 3; i++)
      if (*files[i] && access (files[i], R_OK) != 0) {
         config_error (error, origin, 0, "[handler %s] %s: cannot read '%s': %s", h->name, names[i], files[i],
                       strerror (errno));
         return false;
      }
   if (config_checks_installed ()->tls_files_valid &&
       !config_checks_installed ()->tls_files_valid (h->tls_ca_file, h->tls_cert_file, h->tls_key_file, &sub)) {
      config_error (error, origin, 0, "[handler %s] %s", h->name, sub.message);
      return false;
   }
   return true;
}

/* format, json and source: names from their lists, and a source that a
 * CloudEvents consumer can read (a non-empty URI-reference without white
 * space or control characters). */
static bool
config_validate_format (config_handler_t *h, const char *origin, bson_error_t *error)
{
   static const char *const formats[] = {
      [HANDLER_FORMAT_RELAYBUS] = "relaybus",
      [HANDLER_FORMAT_CLOUDEVENTS] = "cloudevents",
      [HANDLER_FORMAT_CLOUDEVENTS_STRUCTURED] = "cloudevents-structured",
      [HANDLER_FORMAT_PAYLOAD] = "payload",
   };
   static const char *const jsons[] = {
      [HANDLER_JSON_RELAXED] = "relaxed",
      [HANDLER_JSON_CANONICAL] = "canonical",
      [HANDLER_JSON_PLAIN] = "plain",
   };
   size_t i;

   for (i = 0; i < sizeof formats / sizeof formats[0] && strcmp (h->format, formats[i]); i++)
      ;
   if (i == sizeof formats / sizeof formats[0]) {
      config_error (error, origin, 0, "[handler %s] format: '%s' is not relaybus, cloudevents, cloudevents-structured or payload",
                    h->name, h->format);
      return false;
   }
   h->format_id = (handler_format_t) i;
   for (i = 0; i < sizeof jsons / sizeof jsons[0] && strcmp (h->json, jsons[i]); i++)
      ;
   if (i == sizeof jsons / sizeof jsons[0]) {
      config_error (error, origin, 0, "[handler %s] json: '%s' is not relaxed, canonical or plain", h->name, h->json);
      return false;
   }
   h->json_id = (handler_json_t) i;
   if (!*h->source || strlen (h->source) > 1024) {
      config_error (error, origin, 0, "[handler %s] source: 1 to 1024 bytes (a URI-reference, e.g. /orders or urn:shop:orders)", h->name);
      return false;
   }
   for (const unsigned char *c = (const unsigned char *) h->source; *c; c++)
      if (*c <= ' ' || *c == 0x7f) {
         config_error (error, origin, 0, "[handler %s] source: '%s' holds white space or a control character", h->name, h->source);
         return false;
      }
   return true;
}

/* Standard Webhooks secrets are 24 to 64 bytes (the specification's
 * bounds): a shorter key is guessable from the signatures it makes.  Counted
 * from each whsec_ secret's base64 length and padding, so that a build
 * without the dispatcher's decoder (the fuzz targets) refuses the same;
 * the message names the secret by position, never quotes it. */
#define CONFIG_SECRET_MIN 24
#define CONFIG_SECRET_MAX 64
static bool
secrets_sized (const config_handler_t *h, const char *origin, bson_error_t *error)
{
   const char *p = h->secret;
   size_t count = 0;

   for (;;) {
      size_t len, pad, bytes;

      while (*p == ' ' || *p == '\t')
         p++;
      if (!*p)
         return true;
      for (len = 0; p[len] && p[len] != ' ' && p[len] != '\t'; len++)
         ;
      count++;
      if (len > 6 && !strncmp (p, "whsec_", 6)) {
         pad = (p[len - 1] == '=') + (len > 7 && p[len - 2] == '=');
         bytes = (len - 6) / 4 * 3;
         bytes = bytes > pad ? bytes - pad : 0;
         if (bytes < CONFIG_SECRET_MIN || bytes > CONFIG_SECRET_MAX) {
            config_error (error, origin, 0,
                          "[handler %s] secret: secret %zu of the list is %zu byte%s long; Standard Webhooks secrets are "
                          "%d to %d bytes: make one with  echo \"whsec_$(openssl rand -base64 32)\"",
                          h->name, count, bytes, bytes == 1 ? "" : "s", CONFIG_SECRET_MIN, CONFIG_SECRET_MAX);
            return false;
         }
      }
      p += len;
   }
}

/* rate_limit: "" (no limit), or "N/s" or "N/min" with N from 1 to
 * CONFIG_RATE_LIMIT_MAX: N starts per second or per minute. */
static bool
config_split_rate_limit (config_handler_t *h, const char *origin, bson_error_t *error)
{
   const char *p = h->rate_limit;
   int64_t n = 0;

   h->rate_limit_n = 0;
   h->rate_limit_period_ms = 0;
   if (!*p)
      return true;
   while (*p >= '0' && *p <= '9' && n <= CONFIG_RATE_LIMIT_MAX)
      n = n * 10 + (*p++ - '0');
   if (p == h->rate_limit || n < 1 || n > CONFIG_RATE_LIMIT_MAX || (strcmp (p, "/s") != 0 && strcmp (p, "/min") != 0)) {
      config_error (error, origin, 0,
                    "[handler %s] rate_limit: '%.64s' is not N/s or N/min with N from 1 to %d (such as 20/s or 600/min)",
                    h->name, h->rate_limit, CONFIG_RATE_LIMIT_MAX);
      return false;
   }
   if (h->kind_id == HANDLER_KIND_PULL) {
      /* Consumers claim at their own pace: the proxy starts nothing. */
      config_error (error, origin, 0, "[handler %s] rate_limit: for kind = webhook, kafka, rabbitmq or nats", h->name);
      return false;
   }
   h->rate_limit_n = n;
   h->rate_limit_period_ms = strcmp (p, "/s") == 0 ? 1000 : 60000;
   return true;
}

bool
config_validate_handler (config_handler_t *h, const char *origin, bson_error_t *error)
{
   if (!h->events) {
      config_error (error, origin, 0, "[handler %s] needs 'events'", h->name);
      return false;
   }
   if (!h->kind) {
      config_error (error, origin, 0, "[handler %s] needs 'kind' (webhook, pull, nats, rabbitmq or kafka)", h->name);
      return false;
   }
   if (strcmp (h->kind, "rabbitmq") != 0 && strcmp (h->kind, "webhook") != 0 &&
       (*h->tls_ca_file || *h->tls_cert_file || *h->tls_key_file)) {
      config_error (error, origin, 0,
                    "[handler %s] tls_ca_file, tls_cert_file and tls_key_file are for kind = webhook with an https:// "
                    "url or kind = rabbitmq with an amqps:// url",
                    h->name);
      return false;
   }
   if (strcmp (h->kind, "webhook") == 0) {
      h->kind_id = HANDLER_KIND_WEBHOOK;
      if (strncmp (h->url, "http://", 7) != 0 && strncmp (h->url, "https://", 8) != 0) {
         config_error (error, origin, 0,
                       "[handler %s] kind = webhook needs url = http://... or https://...",
                       h->name);
         return false;
      }
      if (!config_validate_webhook_tls (h, origin, error))
         return false;
   } else if (strcmp (h->kind, "pull") == 0) {
      h->kind_id = HANDLER_KIND_PULL;
   } else if (strcmp (h->kind, "nats") == 0) {
      h->kind_id = HANDLER_KIND_NATS;
      if (!config_validate_nats (h, origin, error))
         return false;
   } else if (strcmp (h->kind, "rabbitmq") == 0) {
      h->kind_id = HANDLER_KIND_RABBITMQ;
      if (!config_validate_rabbitmq (h, origin, error))
         return false;
   } else if (strcmp (h->kind, "kafka") == 0) {
      h->kind_id = HANDLER_KIND_KAFKA;
      if (!config_validate_kafka (h, origin, error))
         return false;
   } else {
      config_error (error, origin, 0, "[handler %s] kind: '%s' is not webhook, pull, nats, rabbitmq or kafka", h->name,
                    h->kind);
      return false;
   }
   if (*h->consumers && h->kind_id != HANDLER_KIND_PULL) {
      /* Only a pull handler is consumed by clients; a list elsewhere would
       * look like a protection it is not. */
      config_error (error, origin, 0, "[handler %s] consumers: the list is for kind = pull", h->name);
      return false;
   }
   if (h->kind_id != HANDLER_KIND_WEBHOOK && (h->n_headers || *h->proxy)) {
      config_error (error, origin, 0, "[handler %s] %s%s: for kind = webhook", h->name,
                    h->n_headers ? "header." : "proxy", h->n_headers ? h->headers[0] : "");
      return false;
   }
   if (!config_validate_webhook_egress (h, origin, error))
      return false;
   if (!config_validate_format (h, origin, error))
      return false;
   if (h->n_kafka_props && h->kind_id != HANDLER_KIND_KAFKA) {
      config_error (error, origin, 0, "[handler %s] kafka.%s: kafka.* properties are for kind = kafka", h->name,
                    h->kafka_props[0]);
      return false;
   }
   if (*h->secret && config_checks_installed ()->secrets_valid) {
      /* Decoded here so that --check-config refuses what the dispatcher
       * would; the message names the secret by position, never quotes it. */
      bson_error_t sub;

      if (!config_checks_installed ()->secrets_valid (h->secret, &sub)) {
         config_error (error, origin, 0,
                       "[handler %s] secret: %s (Standard Webhooks secrets are whsec_ then "
                       "base64, separated by spaces)",
                       h->name, sub.message);
         return false;
      }
   }
   if (*h->secret && !secrets_sized (h, origin, error))
      return false;
   if (!config_split_retry_schedule (h, origin, error) || !config_split_rate_limit (h, origin, error))
      return false;
   return config_split_patterns (h, origin, error);
}
