/*
 * base/config.c - the INI configuration, driven by one key table.
 *
 * The file is parsed into a fresh snapshot: every key first gets its default
 * through the same setter that parses the file, so defaults are validated
 * like user values; then the file's keys are applied; then the cross-key
 * checks run (TLS pairs, handler kinds, the upstream URI).  Any error names
 * the origin, the line and the key, and no snapshot is returned.
 *
 * Syntax: "[section]" or "[handler NAME]" headers, "key = value" lines, full
 * line comments starting with ';' or '#', and inline comments that start
 * with whitespace followed by ';' or '#'.  Unknown sections and keys are
 * errors: a typo must never be silently ignored.  A value's ${NAME} is the
 * environment variable NAME, and a secret-bearing key's NAME_file reads the
 * value from a file (base/config_secret.c).
 *
 * This module does not act on the configuration: subsystems read their
 * keys from the snapshot they acquired.
 */
#include "base/config.h"
#include "base/config_private.h"
#include "base/snapshot.h"
#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "base/assert.h"
#include "base/authfile.h"
#include "base/counters.h"
#include "base/log.h"
#include "base/trace.h"

/* Every configured handler has its series (base/counters.h). */
_Static_assert (COUNTERS_MAX_HANDLERS >= CONFIG_MAX_HANDLERS, "COUNTERS_MAX_HANDLERS");

#define CONFIG_FILE_MAX (1024 * 1024)
#define CONFIG_VALUE_MAX 4096

/* The checks of the higher layers (config_set_checks). */
static config_checks_t config_checks;

void
config_set_checks (const config_checks_t *checks)
{
   config_checks = checks ? *checks : (config_checks_t){0};
}

const config_checks_t *
config_checks_installed (void)
{
   return &config_checks;
}

#define P(name, type, def, min, max, reload, field, help) \
   {CONFIG_SECTION_PROXY, name, type, def, min, max, reload, help, offsetof (config_t, field), 0}
#define O(name, type, def, min, max, reload, field, help) \
   {CONFIG_SECTION_OUTBOX, name, type, def, min, max, reload, help, offsetof (config_t, field), 0}
#define D(name, type, def, min, max, reload, field, help) \
   {CONFIG_SECTION_DISPATCH, name, type, def, min, max, reload, help, offsetof (config_t, field), 0}
#define A(name, type, def, min, max, reload, field, help) \
   {CONFIG_SECTION_ADMIN, name, type, def, min, max, reload, help, offsetof (config_t, field), 0}
#define T(name, type, def, min, max, reload, field, help) \
   {CONFIG_SECTION_TRACING, name, type, def, min, max, reload, help, offsetof (config_t, field), 0}
/* Every handler key is reloadable: the dispatcher applies a new handler
 * set on reload (dispatch/dispatch.c, handlers_apply). */
#define H(name, type, def, min, max, field, help) \
   {CONFIG_SECTION_HANDLER, name, type, def, min, max, true, help, offsetof (config_handler_t, field), 0}
/* NAME_file, the file form of a secret-bearing key NAME (CONFIG_KEY_FILE_FORM):
 * a path, reloadable as NAME is; NAME's own checks apply to the content. */
#define P_FILE(name, reload, field, help) \
   {CONFIG_SECTION_PROXY, name, CONFIG_TYPE_STRING, "", 0, 0, reload, help, offsetof (config_t, field), CONFIG_KEY_FILE_FORM}
#define A_FILE(name, reload, field, help) \
   {CONFIG_SECTION_ADMIN, name, CONFIG_TYPE_STRING, "", 0, 0, reload, help, offsetof (config_t, field), CONFIG_KEY_FILE_FORM}
#define H_FILE(name, field, help) \
   {CONFIG_SECTION_HANDLER, name, CONFIG_TYPE_STRING, "", 0, 0, true, help, offsetof (config_handler_t, field), CONFIG_KEY_FILE_FORM}

#define S CONFIG_TYPE_STRING
#define I CONFIG_TYPE_INT
#define B CONFIG_TYPE_BOOL
#define L CONFIG_TYPE_LIST
#define DU CONFIG_TYPE_DURATION
#define MS_HOUR 3600000
#define MS_DAY INT64_C (86400000)

/* The one table.  Handler keys are all reloadable (the H macro above): a
 * reload that adds, removes or changes a handler is applied by the
 * dispatcher as one new handler set. */
static const config_key_t config_key_table[] = {
   P ("listen", S, "127.0.0.1:27018", 0, 0, false, listen,
      "Client listener: host:port, [v6]:port, or an absolute path for a Unix socket."),
   P ("upstream", S, "mongodb://127.0.0.1:27017/?replicaSet=rs0", 0, 0, false, upstream,
      "MongoDB URI of the replica set or mongos the proxy forwards to (TLS options included)."),
   P_FILE ("upstream_file", false, upstream_file,
      "A file holding the upstream URI (one trailing newline removed), instead of upstream; relative to the config file's folder."),
   P ("max_clients", I, "10000", 1, 1000000, true, max_clients,
      "Most client connections open at once; more are closed at accept with a log line."),
   P ("threads", I, "0", 0, CONFIG_THREADS_MAX, false, threads,
      "Forwarding loops, each a thread owning the connections it accepted; 0: one per core, at most 8."),
   P ("pool_mode", S, "session", 0, 0, false, pool_mode,
      "session: each client gets its own upstream connection; pooled: clients share pool_size upstream connections and log in to the proxy (auth_file)."),
   P ("pool_size", I, "32", 1, 100000, false, pool_size,
      "pooled: upstream connections of the whole process, shared out among the forwarding loops."),
   P ("pool_wait_timeout_ms", I, "10000", 1, MS_HOUR, true, pool_wait_timeout_ms,
      "pooled: how long a request may wait for a free upstream connection before it is answered with a retryable error."),
   P ("pool_max_pins_per_user", I, "0", 0, 100000, true, pool_max_pins_per_user,
      "pooled, with auth_file: most upstream connections the open transactions of one user may pin at once; 0: half of pool_size (at least 1). Any transaction statement that would pin one more is answered with the retryable pool error."),
   P ("pool_max_sessions_per_user", I, "10000", 1, 262144 /* OWNERS_ENTRIES */, true, pool_max_sessions_per_user,
      "pooled, with auth_file: the most server sessions (lsids) one user may have in use through the proxy at once (each is forgotten 30 minutes after its last use, or when ended); a new one past it is refused with TooManyLogicalSessions. The proxy's table holds 262144 sessions and cursors for all users."),
   P ("login_timeout_ms", I, "10000", 100, MS_HOUR, true, login_timeout_ms,
      "pooled, with auth_file: time a new client has to log in to the proxy before it is closed."),
   P ("auth_file", S, "", 0, 0, true, auth_file,
      "pooled: the users clients authenticate as (SCRAM keys made by --make-user); empty: clients are not authenticated by the proxy. Re-read on SIGHUP."),
   P ("auth_failures_per_minute", I, "10", 1, 1000000, true, auth_failures_per_minute,
      "pooled: wrong passwords one user may have checked from one client address (an IPv6 /64) in a minute (a proof is checked only while the pair is under it; a right one never counts); more are refused unchecked. A user with this many failures in a minute, from any address, has its next proofs delayed (auth_failure_delay_max_ms)."),
   P ("auth_failure_delay_max_ms", I, "5000", 0, 60000, true, auth_failure_delay_max_ms,
      "pooled: the longest delay before a proof of a user under attack is checked: 100 ms once the user has auth_failures_per_minute failures in a minute, doubled with each further failure, up to this; 0: no delay."),
   P ("handshake_timeout_ms", I, "10000", 100, MS_HOUR, true, handshake_timeout_ms,
      "Time a new client has to complete its first hello before it is closed."),
   P ("message_timeout_ms", I, "30000", 100, MS_HOUR, true, message_timeout_ms,
      "Time a client may take to send the rest of a message it started; then it is closed."),
   P ("drain_timeout_ms", I, "10000", 0, MS_HOUR, true, drain_timeout_ms,
      "On SIGTERM, how long requests in flight may take to finish before connections are closed."),
   P ("buffer_high_watermark", I, "4194304", 65536, 1073741824, true, buffer_high_watermark,
      "Bytes queued towards one side before the proxy stops reading from the other (per connection)."),
   /* At least four maximum-size (48,000,000-byte) messages: a message
    * being received reserves itself and its decompressed form or
    * validation copy at once, and must fit beside what the other
    * connections hold even when the total is not down to zero. */
   P ("max_buffered_bytes", I, "1073741824", 192000000, INT64_C (1099511627776), true, max_buffered_bytes,
      "Bytes all connections together may hold in partial messages, decompressed requests and queues; past it the proxy stops reading from the clients with large messages until the total drains."),
   P ("upstream_connect_timeout_ms", I, "10000", 100, 600000, true, upstream_connect_timeout_ms,
      "Time to open an upstream connection, or to wait for a primary, before the client is closed."),
   P ("compressors", L, "snappy,zlib,zstd", 0, 0, true, compressors,
      "Compressors offered to clients, from snappy, zlib, zstd; empty for none."),
   P ("zlib_level", I, "-1", -1, 9, true, zlib_level,
      "zlib level for replies compressed with zlib; -1 is zlib's default."),
   P ("zstd_level", I, "-1", -1, 22, true, zstd_level,
      "zstd level for replies compressed with zstd; -1 is zstd's default."),
   P ("tls_cert_file", S, "", 0, 0, false, tls_cert_file,
      "PEM certificate chain for client TLS; when set, clients must connect with TLS."),
   P ("tls_key_file", S, "", 0, 0, false, tls_key_file,
      "PEM private key of tls_cert_file."),
   P ("tls_ca_file", S, "", 0, 0, false, tls_ca_file,
      "PEM CA bundle; when set, clients must present a certificate it signed."),
   P ("log_level", S, "info", 0, 0, true, log_level,
      "error, warn, info or debug."),
   P ("log_format", S, "text", 0, 0, true, log_format,
      "text (one readable line each) or json (one JSON object per line)."),
   P ("log_file", S, "", 0, 0, true, log_file,
      "File the log lines are appended to (created 0640); empty: standard error. SIGUSR1 reopens it (logrotate). "
      "Refused when it is a symbolic link, owned by another user than the proxy's or root, or writable by group or others."),

   O ("database", S, "relaybus", 0, 0, false, outbox_database,
      "Database of the outbox collections."),
   O ("collection_prefix", S, "relaybus_", 0, 0, false, collection_prefix,
      "Prefix of the outbox collection names."),
   O ("completion_history", B, "false", 0, 0, false, completion_history,
      "Keep a record of completed deliveries (same value in every proxy instance)."),
   O ("attempt_history", DU, "7d", 0, 3650 * MS_DAY, false, attempt_history_ms,
      "How long every delivery attempt is kept on record (<prefix>attempts, a TTL index); 0 keeps none."),
   O ("shard_collections", S, "auto", 0, 0, false, shard_collections,
      "On a sharded cluster: auto (shard the outbox collections when the upstream is a mongos), on (the same, and a warning "
      "when it is not one) or off (they stay unsharded, on the database's primary shard)."),
   O ("allow_client_writes", B, "false", 0, 0, true, allow_client_writes,
      "Let client commands through the proxy write the outbox collections (insert, drop, $out, ...)."),
   O ("readers", L, "", 0, 0, true, outbox_readers,
      "Pooled mode: the users who may read the outbox collections (find, aggregate, getMore, count, distinct, change streams), beside every user a pull handler's consumers list names; anyone else gets 13 Unauthorized. Empty, with no consumers list either: every user (the pool's upstream user decides)."),
   O ("max_poisoned_transactions", I, "4096", 1, 1000000, false, max_poisoned_transactions,
      "Poisoned transactions remembered at once; when full, annotated writes are refused until entries expire."),
   O ("retain_completed", DU, "7d", 1000, 3650 * MS_DAY, true, retain_completed_ms,
      "Scheduled purge: events whose deliveries all completed, and completion history, are removed this long after their last completion."),
   O ("retain_dead", DU, "30d", 1000, 3650 * MS_DAY, true, retain_dead_ms,
      "Scheduled purge: dead deliveries are removed this long after they died (last changed)."),
   O ("purge_interval", DU, "10m", 1000, 7 * MS_DAY, true, purge_interval_ms,
      "Time between two scheduled purge runs of this proxy's dispatcher."),
   O ("handler_heartbeat", DU, "5s", 100, 10 * 60000, true, handler_heartbeat_ms,
      "How often this proxy records its handlers in the outbox and reads the fleet's; an instance silent for three of them is not live."),
   O ("handler_retire_after", DU, "1h", 1000, 3650 * MS_DAY, true, handler_retire_after_ms,
      "A handler no proxy has declared for this long leaves the fleet's handler set and is retired: its pending deliveries become dead letters."),
   O ("transaction_lifetime", DU, "60s", 1000, MS_DAY, true, transaction_lifetime_ms,
      "The upstream's transactionLifetimeLimitSeconds, or more: a handler new to the fleet is backfilled from this long before its first declaration until this long after every proxy has read it; the server's own limit counts when it is larger and can be read (not through a mongos: set the shards' largest)."),
   O ("unrouted", S, "accept", 0, 0, true, unrouted,
      "An event no handler of the fleet subscribes to: accept (counted), warn (counted and logged) or refuse (the statement fails)."),

   D ("enabled", B, "true", 0, 0, false, dispatch_enabled,
      "Run the dispatch engine in this process."),
   D ("poll_interval_ms", I, "1000", 10, MS_HOUR, true, poll_interval_ms,
      "How often the dispatcher looks for due deliveries when nothing woke it."),
   D ("batch_size", I, "100", 1, 10000, true, batch_size,
      "Deliveries claimed per claim call."),
   D ("lease_ms", I, "30000", 1000, MS_HOUR, true, lease_ms,
      "Lane lease duration; renewed while handlers run."),
   D ("watch", B, "true", 0, 0, false, dispatch_watch,
      "Watch new deliveries with a change stream, so a commit through any proxy wakes this one at once; false: polling only."),

   A ("listen", S, "127.0.0.1:27118", 0, 0, false, admin_listen,
      "Admin HTTP listener host:port; empty disables the admin port."),
   A ("token", S, "", 0, 0, true, admin_token,
      "Bearer token required on /api/* and /metrics; empty: no authentication, only allowed when listen is on loopback."),
   A_FILE ("token_file", true, admin_token_file,
      "A file holding the admin token (one trailing newline removed), instead of token; re-read on SIGHUP."),
   A ("tls_cert_file", S, "", 0, 0, false, admin_tls_cert_file,
      "PEM certificate chain of the admin port; when set (with tls_key_file), it serves HTTPS only."),
   A ("tls_key_file", S, "", 0, 0, false, admin_tls_key_file,
      "PEM private key of [admin] tls_cert_file."),

   T ("otlp_endpoint", S, "", 0, 0, false, tracing_otlp_endpoint,
      "Base URL of an OpenTelemetry collector's OTLP/HTTP receiver (http://host:4318): spans are POSTed as JSON to <otlp_endpoint>/v1/traces. Empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT when set, else no spans are exported and trace context passes through unchanged."),
   T ("sample", S, "never", 0, 0, false, tracing_sample,
      "Whether a publish without a traceparent starts a trace of its own: never, always, or a ratio from 0 to 1 (0.1: one in ten)."),
   T ("service_name", S, "", 0, 0, false, tracing_service_name,
      "The service.name resource attribute of the exported spans. Empty: OTEL_SERVICE_NAME, else relaybus-proxy."),
   T ("resource_attributes", L, "", 0, 0, false, tracing_resource_attributes,
      "More resource attributes of the exported spans, as a list of key=value (deployment.environment=prod,service.namespace=shop); they win over OTEL_RESOURCE_ATTRIBUTES's of the same key."),

   H ("events", L, NULL, 0, 0, events,
      "Event types the handler takes: exact names, or a prefix ending in '*'."),
   H ("kind", S, NULL, 0, 0, kind, "webhook, pull, nats, rabbitmq or kafka."),
   H ("url", S, "", 0, 0, url,
      "webhook: the http:// or https:// URL events are POSTed to; nats: the server(s), nats://host:port (or tls://), comma-separated."),
   H_FILE ("url_file", url_file,
      "A file holding url (one trailing newline removed), for a URL with a password (nats://user:pass@..., amqp://user:pass@...)."),
   H ("exchange", S, "", 0, 0, exchange,
      "rabbitmq: the exchange each event is published to (it must exist)."),
   H ("routing_key", S, "{type}", 0, 0, routing_key,
      "rabbitmq: the routing key; {type} and {key} are replaced by the event's type and key (its id without a key)."),
   H ("persistent", B, "true", 0, 0, persistent,
      "rabbitmq: publish persistent messages (delivery mode 2), which a durable queue keeps across a broker restart."),
   H ("tls_ca_file", S, "", 0, 0, tls_ca_file,
      "webhook (https://) and rabbitmq (amqps://): PEM CA bundle the endpoint's or broker's certificate is verified against; empty: the system's store."),
   H ("tls_cert_file", S, "", 0, 0, tls_cert_file,
      "webhook (https://) and rabbitmq (amqps://): PEM client certificate presented to the endpoint or broker (with tls_key_file)."),
   H ("tls_key_file", S, "", 0, 0, tls_key_file,
      "webhook (https://) and rabbitmq (amqps://): PEM private key of tls_cert_file (not encrypted)."),
   H ("brokers", S, "", 0, 0, brokers,
      "kafka: the bootstrap servers, host:port, comma-separated (librdkafka's bootstrap.servers)."),
   H ("topic", S, "", 0, 0, topic,
      "kafka: the topic each event is produced to; {type}, {type_prefix} and {key} are replaced by the event's type, the type up to its first '.', and key (its id without a key)."),
   H ("subject", S, "", 0, 0, subject,
      "nats: the JetStream subject each event is published to; {type} and {key} are replaced by the event's type and key (its id without a key)."),
   H ("secret", S, "", 0, 0, secret,
      "webhook: Standard Webhooks secret (whsec_ followed by base64); signs each request."),
   H_FILE ("secret_file", secret_file,
      "webhook: a file holding secret (one trailing newline removed); re-read on SIGHUP."),
   H ("retry_schedule", L, CONFIG_RETRY_SCHEDULE_DEFAULT, 0, 0, retry_schedule,
      "Delays before each retry of a failing delivery (durations); each wait is drawn uniformly in [0, delay]."),
   /* No default: it follows from retry_schedule (config_validate_handler). */
   H ("max_attempts", I, NULL, 1, 1000, max_attempts,
      "Attempts before a failing delivery becomes a dead letter; default 1 + the delays of retry_schedule, the last delay repeating past them."),
   H ("timeout_ms", I, "10000", 100, 600000, timeout_ms,
      "webhook: time allowed for the whole request, connect to last byte; nats: time allowed for the PubAck; kafka: librdkafka's message.timeout.ms (queued, sent and acknowledged); then it is retried."),
   H ("concurrency", I, "8", 1, 1024, concurrency, "Deliveries of this handler run at once."),
   H ("rate_limit", S, "", 0, 0, rate_limit,
      "webhook and brokers: at most N deliveries started a second (N/s) or a minute (N/min) by this proxy, bursts up to N; empty: no limit."),
   H ("disable_after", DU, "5d", 1000, 3650 * MS_DAY, disable_after_ms,
      "webhook: a handler whose every delivery failed for this long is disabled (its deliveries wait as pending until POST /api/handlers/NAME/enable), as is one answered 410 Gone."),
   H ("retry_4xx", B, "true", 0, 0, retry_4xx,
      "webhook: retry every answer that is not a 2xx (4xx, 3xx included) on retry_schedule; false: a 4xx, 1xx or 3xx buries the delivery at once."),
   H ("proxy", S, "", 0, 0, proxy,
      "webhook: the forward proxy requests go through, http://host:port or https://host:port; empty: https_proxy, http_proxy and no_proxy of the environment."),
   H ("consumers", L, "", 0, 0, consumers,
      "pull: the users who may run the relaybus* commands on this handler (pooled mode: auth-file users; session mode: the user the connection authenticated as, DB.USER outside admin); empty: any connection allowed to read the outbox."),
   H ("format", S, "relaybus", 0, 0, format,
      "What a delivery looks like: relaybus (the envelope), cloudevents (CloudEvents 1.0 binary mode: attributes in the protocol's headers, the payload as the body), cloudevents-structured (one application/cloudevents+json object) or payload (the payload alone, the metadata in headers)."),
   H ("json", S, "relaxed", 0, 0, json,
      "How the payload is written: relaxed or canonical Extended JSON, or plain JSON (dates as RFC 3339 strings, ObjectIds and decimals as strings, binary as base64)."),
   H ("source", S, "relaybus-proxy", 0, 0, source,
      "The CloudEvents source attribute of this handler's events (format = cloudevents or cloudevents-structured)."),
};

#undef P
#undef O
#undef D
#undef A
#undef T
#undef H
#undef P_FILE
#undef A_FILE
#undef H_FILE
#undef S
#undef I
#undef B
#undef L
#undef DU

static const char *const config_section_names[] = {
   [CONFIG_SECTION_PROXY] = "proxy",
   [CONFIG_SECTION_OUTBOX] = "outbox",
   [CONFIG_SECTION_DISPATCH] = "dispatch",
   [CONFIG_SECTION_ADMIN] = "admin",
   [CONFIG_SECTION_TRACING] = "tracing",
   [CONFIG_SECTION_HANDLER] = "handler",
};

#define N_KEYS (sizeof config_key_table / sizeof config_key_table[0])

const config_key_t *
config_keys (size_t *n)
{
   *n = N_KEYS;
   return config_key_table;
}

const char *
config_section_name (config_section_t section)
{
   if ((unsigned) section >= sizeof config_section_names / sizeof config_section_names[0])
      return "unknown";
   return config_section_names[section];
}

void
config_error (bson_error_t *error, const char *origin, int line, const char *fmt, ...)
{
   char msg[sizeof error->message];
   va_list ap;

   va_start (ap, fmt);
   vsnprintf (msg, sizeof msg, fmt, ap);
   va_end (ap);
   if (line > 0)
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_INVALID, "%s:%d: %s", origin, line, msg);
   else
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_INVALID, "%s: %s", origin, msg);
}

static char *
trim (char *s)
{
   char *end;

   while (*s && isspace ((unsigned char) *s))
      s++;
   end = s + strlen (s);
   while (end > s && isspace ((unsigned char) end[-1]))
      *--end = '\0';
   return s;
}

/* "a , b,c" -> "a,b,c"; empty items are errors. */
static bool
normalize_list (const char *value, char *out, size_t out_len, const char **why)
{
   size_t n = 0;
   const char *p = value;

   while (*p) {
      const char *start, *end;

      while (*p && isspace ((unsigned char) *p))
         p++;
      start = p;
      while (*p && *p != ',')
         p++;
      end = p;
      while (end > start && isspace ((unsigned char) end[-1]))
         end--;
      if (end == start) {
         *why = "empty item in list";
         return false;
      }
      if (n + (size_t) (end - start) + 2 > out_len) {
         *why = "list too long";
         return false;
      }
      if (n > 0)
         out[n++] = ',';
      memcpy (out + n, start, (size_t) (end - start));
      n += (size_t) (end - start);
      if (*p == ',') {
         p++;
         if (*p == '\0') {
            *why = "empty item in list";
            return false;
         }
      }
   }
   out[n] = '\0';
   return true;
}

static bool
parse_bool (const char *v, bool *out)
{
   static const char *const yes[] = {"true", "yes", "on", "1"};
   static const char *const no[] = {"false", "no", "off", "0"};

   for (size_t i = 0; i < 4; i++) {
      if (strcasecmp (v, yes[i]) == 0) {
         *out = true;
         return true;
      }
      if (strcasecmp (v, no[i]) == 0) {
         *out = false;
         return true;
      }
   }
   return false;
}

/* Units of a duration, largest first (config_format picks the largest
 * that divides the value exactly). */
static const struct {
   const char *unit;
   int64_t ms;
} duration_units[] = {
   {"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}, {"ms", 1},
};

/* A duration: digits and one unit, "7d", "10m", "2s", "500ms".  A plain
 * number is refused: its unit would be a guess. */
bool
config_parse_duration (const char *v, int64_t *out, char *why, size_t why_len)
{
   const char *p = v;
   int64_t n = 0;

   while (*p >= '0' && *p <= '9') {
      if (n > (INT64_MAX - 9) / 10)
         goto bad;
      n = n * 10 + (*p++ - '0');
   }
   if (p == v)
      goto bad;
   if (*p == '\0' && n == 0) {
      /* Zero needs no unit: "0" turns a window off. */
      *out = 0;
      return true;
   }
   for (size_t i = 0; i < sizeof duration_units / sizeof duration_units[0]; i++) {
      if (strcmp (p, duration_units[i].unit) != 0)
         continue;
      if (n > INT64_MAX / duration_units[i].ms)
         goto bad;
      *out = n * duration_units[i].ms;
      return true;
   }
bad:
   snprintf (why,
             why_len,
             "'%.64s' is not a duration: a whole number and a unit (ms, s, m, h or d), such as 7d, 10m, 2s or 500ms",
             v);
   return false;
}

/* Applies one value to the field `key` describes, inside `base` (a config_t
 * or a config_handler_t).  On failure `*why` says what is wrong. */
static bool
config_set (void *base, const config_key_t *key, const char *value, char *why, size_t why_len)
{
   char *field = (char *) base + key->offset;
   char list[CONFIG_VALUE_MAX];
   const char *list_why = NULL;

   if (strlen (value) >= CONFIG_VALUE_MAX) {
      snprintf (why, why_len, "value longer than %d bytes", CONFIG_VALUE_MAX - 1);
      return false;
   }

   switch (key->type) {
   case CONFIG_TYPE_STRING:
      bson_free (*(char **) field);
      *(char **) field = bson_strdup (value);
      return true;
   case CONFIG_TYPE_LIST:
      if (!normalize_list (value, list, sizeof list, &list_why)) {
         snprintf (why, why_len, "%s", list_why);
         return false;
      }
      bson_free (*(char **) field);
      *(char **) field = bson_strdup (list);
      return true;
   case CONFIG_TYPE_BOOL:
      if (!parse_bool (value, (bool *) field)) {
         snprintf (why, why_len, "'%.64s' is not a boolean (true/false)", value);
         return false;
      }
      return true;
   case CONFIG_TYPE_INT: {
      char *end = NULL;
      long long v;

      errno = 0;
      v = strtoll (value, &end, 10);
      if (errno || end == value || *end != '\0') {
         snprintf (why, why_len, "'%.64s' is not an integer", value);
         return false;
      }
      if (v < key->min || v > key->max) {
         snprintf (why,
                   why_len,
                   "%lld is outside [%" PRId64 ", %" PRId64 "]",
                   v,
                   key->min,
                   key->max);
         return false;
      }
      *(int64_t *) field = (int64_t) v;
      return true;
   }
   case CONFIG_TYPE_DURATION: {
      int64_t ms;

      if (!config_parse_duration (value, &ms, why, why_len))
         return false;
      if (ms < key->min || ms > key->max) {
         snprintf (why, why_len, "'%.64s' is outside [%" PRId64 " ms, %" PRId64 " ms]", value, key->min, key->max);
         return false;
      }
      *(int64_t *) field = ms;
      return true;
   }
   }
   snprintf (why, why_len, "unknown key type");
   return false;
}

const config_key_t *
config_find_key (config_section_t section, const char *name)
{
   for (size_t i = 0; i < N_KEYS; i++) {
      if (config_key_table[i].section == section && strcmp (config_key_table[i].name, name) == 0)
         return &config_key_table[i];
   }
   return NULL;
}

/* Gives every key of `section` its default; required keys stay NULL. */
static void
config_apply_defaults (void *base, config_section_t section)
{
   char why[128];

   for (size_t i = 0; i < N_KEYS; i++) {
      const config_key_t *key = &config_key_table[i];

      if (key->section != section || !key->default_value)
         continue;
      /* Defaults are constants of this file: a failure is a programming
       * error the unit test catches. */
      if (!config_set (base, key, key->default_value, why, sizeof why))
         log_error ("config: bad default for %s: %s", key->name, why);
   }
}

static void
config_handler_free_fields (config_handler_t *h)
{
   for (size_t i = 0; i < N_KEYS; i++) {
      const config_key_t *key = &config_key_table[i];

      if (key->section == CONFIG_SECTION_HANDLER &&
          (key->type == CONFIG_TYPE_STRING || key->type == CONFIG_TYPE_LIST))
         bson_free (*(char **) ((char *) h + key->offset));
   }
   bson_free (h->name);
   for (size_t i = 0; i < 2 * h->n_kafka_props; i++)
      bson_free (h->kafka_props[i]);
   bson_free (h->kafka_props);
   for (size_t i = 0; i < 2 * h->n_headers; i++)
      bson_free (h->headers[i]);
   bson_free (h->headers);
   for (size_t i = 0; i < h->n_event_patterns; i++)
      bson_free (h->event_patterns[i]);
   bson_free (h->event_patterns);
   bson_free (h->retry_delays_ms);
}

static void
config_free (config_t *cfg)
{
   if (!cfg)
      return;
   for (size_t i = 0; i < N_KEYS; i++) {
      const config_key_t *key = &config_key_table[i];

      if (key->section != CONFIG_SECTION_HANDLER &&
          (key->type == CONFIG_TYPE_STRING || key->type == CONFIG_TYPE_LIST))
         bson_free (*(char **) ((char *) cfg + key->offset));
   }
   for (size_t i = 0; i < cfg->n_handlers; i++)
      config_handler_free_fields (&cfg->handlers[i]);
   bson_free (cfg->handlers);
   bson_free (cfg->upstream_auth.user);
   if (cfg->upstream_auth.password)
      bson_zero_free (cfg->upstream_auth.password, strlen (cfg->upstream_auth.password));
   bson_free (cfg->upstream_auth.source);
   bson_free (cfg->upstream_auth.mechanism);
   authfile_destroy (cfg->users);
   bson_free (cfg->upstream_tls.ca_file);
   bson_free (cfg->upstream_tls.cert_key_file);
   if (cfg->upstream_tls.cert_key_password)
      bson_zero_free (cfg->upstream_tls.cert_key_password, strlen (cfg->upstream_tls.cert_key_password));
   for (size_t i = 0; i < cfg->n_secrets; i++)
      bson_zero_free (cfg->secrets[i], strlen (cfg->secrets[i]));
   bson_free (cfg->secrets);
   bson_free (cfg->path);
   bson_free (cfg);
}

static config_t *
config_alloc (void)
{
   config_t *cfg = bson_malloc0 (sizeof *cfg);

   cfg->refcount = 1;
   config_apply_defaults (cfg, CONFIG_SECTION_PROXY);
   config_apply_defaults (cfg, CONFIG_SECTION_OUTBOX);
   config_apply_defaults (cfg, CONFIG_SECTION_DISPATCH);
   config_apply_defaults (cfg, CONFIG_SECTION_ADMIN);
   config_apply_defaults (cfg, CONFIG_SECTION_TRACING);
   return cfg;
}

config_t *
config_new_defaults (void)
{
   config_t *cfg = config_alloc ();

   cfg->path = bson_strdup ("(defaults)");
   return cfg;
}

bool
config_parse_listen (
   const char *value, char *host, size_t host_len, uint16_t *port, bson_error_t *error)
{
   const char *colon;
   char *end = NULL;
   long p;
   size_t hlen;

   if (!value || !*value) {
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_LISTEN, "empty listen address");
      return false;
   }
   if (value[0] == '/') {
      if (strlen (value) >= host_len || strlen (value) >= 108 /* sun_path */) {
         bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_LISTEN, "socket path too long: %s", value);
         return false;
      }
      snprintf (host, host_len, "%s", value);
      *port = 0;
      return true;
   }
   if (value[0] == '[') {
      const char *close = strchr (value, ']');

      if (!close || close[1] != ':') {
         bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_LISTEN, "expected [v6-address]:port, got '%s'", value);
         return false;
      }
      hlen = (size_t) (close - value - 1);
      colon = close + 1;
      value++;
   } else {
      colon = strrchr (value, ':');
      if (!colon) {
         bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_LISTEN, "expected host:port, got '%s'", value);
         return false;
      }
      hlen = (size_t) (colon - value);
   }
   if (hlen == 0 || hlen >= host_len) {
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_LISTEN, "bad host in listen address");
      return false;
   }
   errno = 0;
   p = strtol (colon + 1, &end, 10);
   if (errno || end == colon + 1 || *end != '\0' || p < 0 || p > 65535) {
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_LISTEN, "bad port '%s'", colon + 1);
      return false;
   }
   memcpy (host, value, hlen);
   host[hlen] = '\0';
   *port = (uint16_t) p;
   return true;
}

bool
config_valid_name (const char *s, size_t max, const char *extra)
{
   size_t n = strlen (s);

   if (n == 0 || n > max)
      return false;
   for (size_t i = 0; i < n; i++) {
      if (!isalnum ((unsigned char) s[i]) && !strchr (extra, s[i]))
         return false;
   }
   return true;
}

/* The items of a list value, which the list setter left without blanks
 * or empty items: how many there are, and the next one (false after the
 * last). */
size_t
config_list_count (const char *p)
{
   size_t n = *p ? 1 : 0;

   for (; *p; p++)
      n += *p == ',';
   return n;
}

bool
config_list_next (const char **p, const char **item, size_t *len)
{
   const char *end;

   if (!**p)
      return false;
   end = strchr (*p, ',');
   *item = *p;
   *len = end ? (size_t) (end - *p) : strlen (*p);
   *p = end ? end + 1 : *p + *len;
   return true;
}

/* Whether a listener's host reaches only this machine: a Unix socket
 * (port 0), "localhost", 127.0.0.0/8 or ::1.  Any other host, a name
 * included, may be reached from elsewhere. */
static bool
listen_is_loopback (const char *host, uint16_t port)
{
   struct in_addr v4;
   struct in6_addr v6;

   if (port == 0 || !strcasecmp (host, "localhost"))
      return true;
   if (inet_pton (AF_INET, host, &v4) == 1)
      return (ntohl (v4.s_addr) >> 24) == 127;
   return inet_pton (AF_INET6, host, &v6) == 1 && IN6_IS_ADDR_LOOPBACK (&v6);
}

/* Cross-key checks once the whole file is read. */
static bool
config_validate (config_t *cfg, const char *origin, bson_error_t *error)
{
   char host[256];
   uint16_t port;
   log_level_t level;
   bson_error_t sub;

   if (!config_parse_listen (cfg->listen, host, sizeof host, &port, &sub)) {
      config_error (error, origin, 0, "[proxy] listen: %s", sub.message);
      return false;
   }
   if (*cfg->admin_listen && !config_parse_listen (cfg->admin_listen, host, sizeof host, &port, &sub)) {
      config_error (error, origin, 0, "[admin] listen: %s", sub.message);
      return false;
   }
   /* An empty token turns the admin port's authentication off, which only
    * a port on loopback may do: an empty token, an empty token_file or a
    * ${VAR} set to nothing (a container's RELAYBUS_ADMIN_TOKEN= ...) on
    * any other address is refused, not taken as "no token". */
   if (*cfg->admin_listen && !*cfg->admin_token && !listen_is_loopback (host, port)) {
      if (*cfg->admin_token_file)
         config_error (error, origin, 0,
                       "[admin] token_file: %s is empty, and the admin port listens on %s, beyond loopback: it "
                       "needs a non-empty token (an empty one would turn its authentication off)",
                       cfg->admin_token_file, cfg->admin_listen);
      else
         config_error (error, origin, 0,
                       "[admin] token: empty, and the admin port listens on %s, beyond loopback: set a non-empty "
                       "token (token, token_file or a ${VAR} that is set to one), or listen on 127.0.0.1",
                       cfg->admin_listen);
      return false;
   }
   if (!config_read_upstream (cfg, origin, error))
      return false;
   if (!log_level_parse (cfg->log_level, &level)) {
      config_error (error, origin, 0, "[proxy] log_level: '%s' is not error, warn, info or debug",
                    cfg->log_level);
      return false;
   }
   {
      log_format_t format;
      if (!log_format_parse (cfg->log_format, &format)) {
         config_error (error, origin, 0, "[proxy] log_format: '%s' is not text or json", cfg->log_format);
         return false;
      }
   }
   if (cfg->log_file[0] && cfg->log_file[0] != '/') {
      config_error (error, origin, 0, "[proxy] log_file: '%s' is not an absolute path", cfg->log_file);
      return false;
   }
   {
      /* [tracing]: refused here, so --check-config and a reload say so,
       * rather than at start-up only (trace_start). */
      uint64_t threshold;
      const char *p = cfg->tracing_resource_attributes, *item;
      size_t len;

      if (!trace_parse_sample (cfg->tracing_sample, &threshold)) {
         config_error (error, origin, 0, "[tracing] sample: '%s' is not never, always or a ratio from 0 to 1", cfg->tracing_sample);
         return false;
      }
      if (cfg->tracing_otlp_endpoint[0] && strncmp (cfg->tracing_otlp_endpoint, "http://", 7) != 0 &&
          strncmp (cfg->tracing_otlp_endpoint, "https://", 8) != 0) {
         config_error (error, origin, 0, "[tracing] otlp_endpoint: '%s' is not an http:// or https:// URL", cfg->tracing_otlp_endpoint);
         return false;
      }
      while (config_list_next (&p, &item, &len)) {
         if (!memchr (item, '=', len) || item[0] == '=') {
            config_error (error, origin, 0, "[tracing] resource_attributes: '%.*s' is not key=value", (int) len, item);
            return false;
         }
      }
   }
   if (strcmp (cfg->shard_collections, "auto") == 0) {
      cfg->shard_mode = CONFIG_SHARD_AUTO;
   } else if (strcmp (cfg->shard_collections, "on") == 0) {
      cfg->shard_mode = CONFIG_SHARD_ON;
   } else if (strcmp (cfg->shard_collections, "off") == 0) {
      cfg->shard_mode = CONFIG_SHARD_OFF;
   } else {
      config_error (error, origin, 0, "[outbox] shard_collections: '%s' is not auto, on or off", cfg->shard_collections);
      return false;
   }
   if (strcmp (cfg->unrouted, "accept") == 0) {
      cfg->unrouted_mode = CONFIG_UNROUTED_ACCEPT;
   } else if (strcmp (cfg->unrouted, "warn") == 0) {
      cfg->unrouted_mode = CONFIG_UNROUTED_WARN;
   } else if (strcmp (cfg->unrouted, "refuse") == 0) {
      cfg->unrouted_mode = CONFIG_UNROUTED_REFUSE;
   } else {
      config_error (error, origin, 0, "[outbox] unrouted: '%s' is not accept, warn or refuse", cfg->unrouted);
      return false;
   }
   {
      const char *p = cfg->compressors, *item;
      size_t len;

      while (config_list_next (&p, &item, &len)) {
         char name[32];

         snprintf (name, sizeof name, "%.*s", (int) (len < 31 ? len : 31), item);
         if (len >= sizeof name || (config_checks_installed ()->compressor_known && !config_checks_installed ()->compressor_known (name))) {
            config_error (error, origin, 0,
                          "[proxy] compressors: '%.*s' is not one of snappy, zlib, zstd", (int) len,
                          item);
            return false;
         }
      }
   }
   if (!!*cfg->tls_cert_file != !!*cfg->tls_key_file) {
      config_error (error, origin, 0, "[proxy] tls_cert_file and tls_key_file go together");
      return false;
   }
   if (*cfg->tls_ca_file && !*cfg->tls_cert_file) {
      config_error (error, origin, 0, "[proxy] tls_ca_file needs tls_cert_file and tls_key_file");
      return false;
   }
   {
      const char *files[] = {cfg->tls_cert_file, cfg->tls_key_file, cfg->tls_ca_file};
      const char *names[] = {"tls_cert_file", "tls_key_file", "tls_ca_file"};

      for (int i = 0; i < 3; i++) {
         if (*files[i] && access (files[i], R_OK) != 0) {
            config_error (error, origin, 0, "[proxy] %s: cannot read '%s': %s", names[i],
                          files[i], strerror (errno));
            return false;
         }
      }
   }
   /* The admin files are loaded by admin_start; here they must exist and
    * be readable, so --check-config refuses a wrong path by its key. */
   if (!!*cfg->admin_tls_cert_file != !!*cfg->admin_tls_key_file) {
      config_error (error, origin, 0, "[admin] tls_cert_file and tls_key_file go together (%s is not set)",
                    *cfg->admin_tls_cert_file ? "tls_key_file" : "tls_cert_file");
      return false;
   }
   {
      const char *files[] = {cfg->admin_tls_cert_file, cfg->admin_tls_key_file};
      const char *names[] = {"tls_cert_file", "tls_key_file"};

      for (int i = 0; i < 2; i++) {
         if (*files[i] && access (files[i], R_OK) != 0) {
            config_error (error, origin, 0, "[admin] %s: cannot read '%s': %s", names[i], files[i],
                          strerror (errno));
            return false;
         }
      }
   }
   if (!config_valid_name (cfg->outbox_database, 63, "_-")) {
      config_error (error, origin, 0,
                    "[outbox] database: 1-63 characters of letters, digits, '_' and '-'");
      return false;
   }
   if (*cfg->collection_prefix && !config_valid_name (cfg->collection_prefix, 64, "_-.")) {
      config_error (error, origin, 0,
                    "[outbox] collection_prefix: up to 64 letters, digits, '_', '-' and '.'");
      return false;
   }
   if (cfg->attempt_history_ms > 0 && cfg->attempt_history_ms < 1000) {
      /* The TTL index counts whole seconds. */
      config_error (error, origin, 0, "[outbox] attempt_history: at least 1s, or 0 to keep no attempt records");
      return false;
   }
   for (size_t i = 0; i < cfg->n_handlers; i++) {
      if (!config_validate_handler (&cfg->handlers[i], origin, error))
         return false;
   }
   config_collect_secrets (cfg);
   return true;
}

static bool
config_parse_section (config_t *cfg,
                      char *header,
                      config_section_t *section,
                      config_handler_t **handler,
                      const char *origin,
                      int line,
                      bson_error_t *error)
{
   char *name = trim (header);

   *handler = NULL;
   if (strncmp (name, "handler", 7) == 0 && isspace ((unsigned char) name[7])) {
      char *hname = trim (name + 8);
      config_handler_t *h;

      if (!config_valid_name (hname, 64, "_-.")) {
         config_error (error, origin, line,
                       "handler name '%s': 1-64 letters, digits, '_', '-' and '.'", hname);
         return false;
      }
      for (size_t i = 0; i < cfg->n_handlers; i++) {
         if (strcmp (cfg->handlers[i].name, hname) == 0) {
            config_error (error, origin, line, "[handler %s] defined twice", hname);
            return false;
         }
      }
      if (cfg->n_handlers == CONFIG_MAX_HANDLERS) {
         config_error (error, origin, line, "more than %d handlers", CONFIG_MAX_HANDLERS);
         return false;
      }
      cfg->handlers =
         bson_realloc (cfg->handlers, (cfg->n_handlers + 1) * sizeof (config_handler_t));
      h = &cfg->handlers[cfg->n_handlers++];
      memset (h, 0, sizeof *h);
      h->name = bson_strdup (hname);
      config_apply_defaults (h, CONFIG_SECTION_HANDLER);
      *section = CONFIG_SECTION_HANDLER;
      *handler = h;
      return true;
   }
   for (int s = CONFIG_SECTION_PROXY; s < CONFIG_SECTION_HANDLER; s++) {
      if (strcmp (name, config_section_names[s]) == 0) {
         *section = (config_section_t) s;
         return true;
      }
   }
   config_error (error, origin, line,
                 "unknown section [%s] (expected proxy, outbox, dispatch, admin, tracing or handler NAME)",
                 name);
   return false;
}

/* The line `NAME_file = PATH` of a file-form key: PATH goes into its own
 * field (for --check-config and reload), and the base key NAME takes the
 * file's content through its own setter.  `seen` is the parser's record of
 * the keys set in this section. */
static bool
config_set_from_file (config_t *cfg, void *target, const config_key_t *file_key, const char *path, bool *seen,
                      char *why, size_t why_len)
{
   const config_key_t *base = config_file_base (file_key);
   char content[CONFIG_VALUE_MAX];

   RELAYBUS_ASSERT (base);
   if (!config_set (target, file_key, path, why, why_len))
      return false;
   if (!*path)
      return true; /* empty: the file form is not used (the sample lists it so) */
   if (seen[base - config_key_table]) {
      snprintf (why, why_len, "both %s and %s are set: keep one", base->name, file_key->name);
      return false;
   }
   if (!config_read_secret_file (cfg->path, path, content, sizeof content, why, why_len))
      return false;
   seen[base - config_key_table] = true;
   return config_set (target, base, content, why, why_len);
}

/* A `kafka.<property>` line; `kafka.<property>_file = PATH` sets the
 * property to the file's content, as a key's file form does. */
static bool
config_set_kafka_line (
   config_t *cfg, config_handler_t *h, const char *name, const char *value, bool from_file, char *why, size_t why_len)
{
   size_t len = strlen (name);
   char content[CONFIG_VALUE_MAX];
   char prop[160];

   if (len > 5 && strcmp (name + len - 5, "_file") == 0) {
      if (len - 5 >= sizeof prop) {
         snprintf (why, why_len, "'%s' is not a librdkafka property name", name);
         return false;
      }
      memcpy (prop, name, len - 5);
      prop[len - 5] = '\0';
      if (!config_read_secret_file (cfg->path, value, content, sizeof content, why, why_len))
         return false;
      return config_add_kafka_prop (h, prop, content, why, why_len);
   }
   if (from_file && *value && config_kafka_prop_is_secret (name))
      cfg->secret_inline = true;
   return config_add_kafka_prop (h, name, value, why, why_len);
}

/* A check made once the whole file is read (a value's meaning, two keys
 * together) names its key as "[section] key..."; when the file set that
 * key, the message gets the key's FILE:LINE as every parse error has it
 * (docs/configuration.md promises FILE:LINE for a value out of limits). */
static void
config_error_add_line (bson_error_t *error, const char *origin, const int *key_line)
{
   size_t olen = strlen (origin), slen, klen;
   const char *msg = error->message, *sec, *key;
   char buf[sizeof error->message];

   if (strncmp (msg, origin, olen) != 0 || strncmp (msg + olen, ": [", 3) != 0)
      return;
   sec = msg + olen + 3;
   slen = strcspn (sec, "]");
   if (sec[slen] != ']' || sec[slen + 1] != ' ')
      return;
   key = sec + slen + 2;
   klen = strcspn (key, ": ");
   for (size_t i = 0; i < sizeof config_key_table / sizeof config_key_table[0]; i++) {
      const config_key_t *k = &config_key_table[i];
      const char *sname = config_section_names[k->section];

      if (k->section == CONFIG_SECTION_HANDLER || key_line[i] <= 0 || strlen (sname) != slen ||
          strncmp (sname, sec, slen) != 0 || strlen (k->name) != klen || strncmp (k->name, key, klen) != 0)
         continue;
      snprintf (buf, sizeof buf, "%s:%d: %s", origin, key_line[i], msg + olen + 2);
      bson_strncpy (error->message, buf, sizeof error->message);
      return;
   }
}

config_t *
config_parse_string (const char *text, const char *origin, bson_error_t *error)
{
   config_t *cfg = config_alloc ();
   config_section_t section = CONFIG_SECTION_PROXY;
   config_handler_t *handler = NULL;
   bool in_section = false;
   /* Which keys of the current section were set, to refuse duplicates. */
   bool seen[sizeof config_key_table / sizeof config_key_table[0]];
   /* The line that set each key outside [handler]s (0: not set). */
   int key_line[sizeof config_key_table / sizeof config_key_table[0]];
   char *copy = bson_strdup (text);
   char *save = NULL;
   int line = 0;
   bool ok = false;

   memset (seen, 0, sizeof seen);
   memset (key_line, 0, sizeof key_line);
   cfg->path = bson_strdup (origin);

   for (char *p = copy; p; p = save) {
      char *s, *eq, *key, *value;
      const config_key_t *k, *file_form;
      char why[256];
      char expanded[CONFIG_VALUE_MAX];
      bool from_file;
      void *target;

      save = strchr (p, '\n');
      if (save)
         *save++ = '\0';
      line++;
      s = trim (p);
      if (*s == '\0' || *s == ';' || *s == '#')
         continue;
      if (*s == '[') {
         char *close = strchr (s, ']');

         if (!close || *trim (close + 1) != '\0') {
            config_error (error, origin, line, "malformed section header");
            goto done;
         }
         *close = '\0';
         if (!config_parse_section (cfg, s + 1, &section, &handler, origin, line, error))
            goto done;
         /* A section may appear once (handlers are unique by name). */
         if (section != CONFIG_SECTION_HANDLER) {
            for (size_t i = 0; i < N_KEYS; i++) {
               if (config_key_table[i].section == section && seen[i]) {
                  config_error (error, origin, line, "section [%s] appears twice",
                                config_section_names[section]);
                  goto done;
               }
            }
         } else {
            for (size_t i = 0; i < N_KEYS; i++) {
               if (config_key_table[i].section == CONFIG_SECTION_HANDLER)
                  seen[i] = false;
            }
         }
         in_section = true;
         continue;
      }
      if (!in_section) {
         config_error (error, origin, line, "key outside of a section");
         goto done;
      }
      eq = strchr (s, '=');
      if (!eq) {
         config_error (error, origin, line, "expected 'key = value'");
         goto done;
      }
      *eq = '\0';
      key = trim (s);
      value = eq + 1;
      /* Inline comment: whitespace, then ';' or '#'. */
      for (char *c = value; *c; c++) {
         if ((*c == ';' || *c == '#') && c > value && isspace ((unsigned char) c[-1])) {
            *c = '\0';
            break;
         }
      }
      value = trim (value);
      /* Before the expansion: a reference is not a credential in the file. */
      from_file = !strstr (value, "${");
      if (!config_expand (value, expanded, sizeof expanded, why, sizeof why)) {
         config_error (error, origin, line, "%s: %s", key, why);
         goto done;
      }
      value = expanded;
      if (section == CONFIG_SECTION_HANDLER && strncmp (key, "header.", 7) == 0) {
         if (!config_add_header (handler, key + 7, value, why, sizeof why)) {
            config_error (error, origin, line, "%s: %s", key, why);
            goto done;
         }
         if (from_file && config_header_is_secret (key + 7))
            cfg->secret_inline = true;
         continue;
      }
      if (section == CONFIG_SECTION_HANDLER && strncmp (key, "kafka.", 6) == 0) {
         if (!config_set_kafka_line (cfg, handler, key + 6, value, from_file, why, sizeof why)) {
            config_error (error, origin, line, "%s: %s", key, why);
            goto done;
         }
         continue;
      }
      k = config_find_key (section, key);
      if (!k) {
         if (section == CONFIG_SECTION_HANDLER)
            config_error (error, origin, line, "unknown key '%s' in [handler %s]", key,
                          handler->name);
         else
            config_error (error, origin, line, "unknown key '%s' in [%s]", key,
                          config_section_names[section]);
         goto done;
      }
      target = section == CONFIG_SECTION_HANDLER ? (void *) handler : (void *) cfg;
      /* Set already by its file form: the message names both. */
      if ((file_form = config_file_form (k)) && seen[file_form - config_key_table] &&
          **(char **) ((char *) target + file_form->offset)) {
         config_error (error, origin, line, "both %s and %s are set: keep one", key, file_form->name);
         goto done;
      }
      if (seen[k - config_key_table]) {
         config_error (error, origin, line, "key '%s' set twice", key);
         goto done;
      }
      seen[k - config_key_table] = true;
      if (section != CONFIG_SECTION_HANDLER)
         key_line[k - config_key_table] = line;
      if (k->flags & CONFIG_KEY_FILE_FORM) {
         if (!config_set_from_file (cfg, target, k, value, seen, why, sizeof why)) {
            config_error (error, origin, line, "%s: %s", key, why);
            goto done;
         }
         continue;
      }
      if (!config_set (target, k, value, why, sizeof why)) {
         config_error (error, origin, line, "%s: %s", key, why);
         goto done;
      }
      if (file_form && from_file)
         config_note_inline_secret (cfg, k->name, value);
   }
   ok = config_validate (cfg, origin, error);
   if (!ok)
      config_error_add_line (error, origin, key_line);

done:
   bson_free (copy);
   if (!ok) {
      config_free (cfg);
      return NULL;
   }
   return cfg;
}

config_t *
config_load (const char *path, bson_error_t *error)
{
   FILE *f = fopen (path, "rb");
   char *text;
   size_t n;
   config_t *cfg;

   if (!f) {
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_FILE, "%s: %s", path, strerror (errno));
      return NULL;
   }
   text = bson_malloc (CONFIG_FILE_MAX + 1);
   n = fread (text, 1, CONFIG_FILE_MAX + 1, f);
   if (ferror (f)) {
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_FILE, "%s: read error", path);
      cfg = NULL;
   } else if (n > CONFIG_FILE_MAX) {
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_FILE, "%s: larger than %d bytes", path,
                      CONFIG_FILE_MAX);
      cfg = NULL;
   } else if (memchr (text, '\0', n)) {
      bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_FILE, "%s: contains a NUL byte", path);
      cfg = NULL;
   } else {
      text[n] = '\0';
      cfg = config_parse_string (text, path, error);
   }
   fclose (f);
   bson_free (text);
   return cfg;
}

/* The value of `key` inside `base` as the file would spell it. */
static void
config_format (const void *base, const config_key_t *key, char *out, size_t len)
{
   const char *field = (const char *) base + key->offset;

   switch (key->type) {
   case CONFIG_TYPE_STRING:
   case CONFIG_TYPE_LIST: {
      const char *s = *(char *const *) field;

      snprintf (out, len, "%s", s ? s : "");
      break;
   }
   case CONFIG_TYPE_INT:
      snprintf (out, len, "%" PRId64, *(const int64_t *) field);
      break;
   case CONFIG_TYPE_BOOL:
      snprintf (out, len, "%s", *(const bool *) field ? "true" : "false");
      break;
   case CONFIG_TYPE_DURATION: {
      int64_t ms = *(const int64_t *) field;
      size_t u = 0;

      while (u + 1 < sizeof duration_units / sizeof duration_units[0] &&
             (ms == 0 || ms % duration_units[u].ms != 0))
         u++;
      snprintf (out, len, "%" PRId64 "%s", ms / duration_units[u].ms, duration_units[u].unit);
      break;
   }
   }
}

bool
config_reload_allowed (const config_t *cur, const config_t *next, bson_error_t *error)
{
   char a[CONFIG_VALUE_MAX], b[CONFIG_VALUE_MAX];

   for (size_t i = 0; i < N_KEYS; i++) {
      const config_key_t *key = &config_key_table[i];

      if (key->reloadable || key->section == CONFIG_SECTION_HANDLER)
         continue;
      config_format (cur, key, a, sizeof a);
      config_format (next, key, b, sizeof b);
      if (strcmp (a, b) != 0) {
         bson_set_error (error, CONFIG_ERROR_DOMAIN, CONFIG_ERR_NEEDS_RESTART,
                         "[%s] %s changed; it needs a restart", config_section_names[key->section],
                         key->name);
         return false;
      }
   }
   return true;
}

static void
config_write_key (const void *base, const config_key_t *key, FILE *out)
{
   char v[CONFIG_VALUE_MAX];

   char *masked;

   config_format (base, key, v, sizeof v);
   masked = key->type == CONFIG_TYPE_STRING ? config_mask (key->name, v) : bson_strdup (v);
   fprintf (out, "%s = %s\n", key->name, masked);
   bson_free (masked);
}

void
config_write (const config_t *cfg, FILE *out)
{
   for (int s = CONFIG_SECTION_PROXY; s < CONFIG_SECTION_HANDLER; s++) {
      fprintf (out, "%s[%s]\n", s == CONFIG_SECTION_PROXY ? "" : "\n", config_section_names[s]);
      for (size_t i = 0; i < N_KEYS; i++) {
         if ((int) config_key_table[i].section == s)
            config_write_key (cfg, &config_key_table[i], out);
      }
   }
   for (size_t h = 0; h < cfg->n_handlers; h++) {
      fprintf (out, "\n[handler %s]\n", cfg->handlers[h].name);
      for (size_t i = 0; i < N_KEYS; i++) {
         if (config_key_table[i].section == CONFIG_SECTION_HANDLER)
            config_write_key (&cfg->handlers[h], &config_key_table[i], out);
      }
      for (size_t i = 0; i < cfg->handlers[h].n_kafka_props; i++) {
         const char *name = cfg->handlers[h].kafka_props[2 * i];
         /* Passwords, keys and secrets of librdkafka (sasl.password,
          * ssl.key.password, ...) are never echoed. */
         bool secret = config_kafka_prop_is_secret (name);
         fprintf (out, "kafka.%s = %s\n", name, secret ? CONFIG_MASK : cfg->handlers[h].kafka_props[2 * i + 1]);
      }
      for (size_t i = 0; i < cfg->handlers[h].n_headers; i++)
         /* No header value is echoed: whatever its name, it may be a
          * credential (an API key in X-Tenant-Id), and the unit's
          * ExecStartPre runs --check-config at every start. */
         fprintf (out, "header.%s = %s\n", cfg->handlers[h].headers[2 * i], CONFIG_MASK);
   }
}

config_t *
config_retain (config_t *cfg)
{
   int before = atomic_fetch_add (&cfg->refcount, 1);

   /* Only a holder may retain: a snapshot at 0 is being freed. */
   RELAYBUS_ASSERT (before > 0);
   (void) before;
   return cfg;
}

void
config_release (config_t *cfg)
{
   int before;

   if (!cfg)
      return;
   before = atomic_fetch_sub (&cfg->refcount, 1);
   RELAYBUS_ASSERT (before > 0); /* one release per reference */
   if (before == 1)
      config_free (cfg);
}

static snapshot_t config_current = SNAPSHOT_INIT;

static void *
config_retain_any (void *cfg)
{
   return config_retain (cfg);
}

void
config_publish (config_t *cfg)
{
   config_release (snapshot_swap (&config_current, cfg));
}

config_t *
config_acquire (void)
{
   return snapshot_take (&config_current, config_retain_any);
}

bool
config_patterns_match (const char *const *patterns, size_t n, const char *event_type)
{
   for (size_t i = 0; i < n; i++) {
      const char *pat = patterns[i];
      size_t len = strlen (pat);

      if (len > 0 && pat[len - 1] == '*' ? strncmp (event_type, pat, len - 1) == 0 : strcmp (event_type, pat) == 0)
         return true;
   }
   return false;
}

bool
config_handler_matches (const config_handler_t *h, const char *event_type)
{
   return config_patterns_match ((const char *const *) h->event_patterns, h->n_event_patterns, event_type);
}
