/*
 * base/config.h - the configuration: one table of keys, immutable snapshots.
 *
 * Thread: config_set_checks, config_load and config_publish: the main
 * thread; config_acquire, config_retain, config_release and the reading of
 * a snapshot: any thread (a snapshot never changes once loaded).
 *
 * A single table (config_keys) names every key with its section, type,
 * default, limits, whether a reload may change it, and a line of help.  The
 * table drives parsing, validation, --check-config, the admin API and the
 * test that etc/relaybus-proxy.ini and docs/ mention every key.
 *
 * A config_t is an immutable snapshot with a reference count.  SIGHUP parses
 * the file into a new snapshot, validates it, checks that no key marked
 * non-reloadable changed, and publishes it whole (config_publish); readers
 * take a reference with config_acquire and drop it with config_release.  A
 * failed reload keeps the old snapshot and says why.
 */
#ifndef RELAYBUS_CONFIG_H
#define RELAYBUS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <bson/bson.h>

#include "base/errors.h"

#define CONFIG_MAX_HANDLERS 256
/* A handler's default retry_schedule (Svix's): retries over 27 h 35 min. */
#define CONFIG_RETRY_SCHEDULE_DEFAULT "5s, 5m, 30m, 2h, 5h, 10h, 10h"
#define CONFIG_RETRY_DELAYS_MAX 100
#define CONFIG_RETRY_DELAY_MAX_MS (7 * 86400000LL)
/* kafka.<property> lines per handler, at most. */
#define CONFIG_KAFKA_PROPS_MAX 64
/* header.<name> = value lines of a webhook handler. */
#define CONFIG_HEADERS_MAX 32
/* rate_limit = N/s or N/min: N at most. */
#define CONFIG_RATE_LIMIT_MAX 1000000

/* Codes of CONFIG_ERROR_DOMAIN. */
typedef enum {
   CONFIG_ERR_INVALID = 1,    /* a line, key or value is wrong (the message says which) */
   CONFIG_ERR_LISTEN,         /* a listen address cannot be parsed */
   CONFIG_ERR_FILE,           /* a file the configuration names cannot be read */
   CONFIG_ERR_NEEDS_RESTART,  /* a reload changed a key that is not reloadable */
} config_error_code_t;

typedef enum {
   CONFIG_TYPE_STRING,
   CONFIG_TYPE_INT,  /* int64, with min/max */
   CONFIG_TYPE_BOOL, /* true/false, yes/no, on/off, 1/0 */
   CONFIG_TYPE_LIST, /* comma-separated words, kept as the string */
   CONFIG_TYPE_DURATION, /* a number and a unit (ms, s, m, h, d), kept as int64 ms, with min/max in ms */
} config_type_t;

typedef enum {
   CONFIG_SECTION_PROXY,
   CONFIG_SECTION_OUTBOX,
   CONFIG_SECTION_DISPATCH,
   CONFIG_SECTION_ADMIN,
   CONFIG_SECTION_TRACING,
   CONFIG_SECTION_HANDLER, /* [handler NAME], one per handler */
} config_section_t;

typedef struct {
   config_section_t section;
   const char *name;
   config_type_t type;
   const char *default_value; /* as written in the file; NULL: required */
   int64_t min, max;          /* CONFIG_TYPE_INT and CONFIG_TYPE_DURATION (ms) */
   bool reloadable;
   const char *help;
   size_t offset; /* into config_t, or config_handler_t for handler keys */
   /* CONFIG_KEY_FILE_FORM: the key is NAME_file, the file form of the
    * secret-bearing key NAME of its section: its value is a path, and NAME
    * takes the file's content (config.c, "Secrets outside the file"). */
   unsigned flags;
} config_key_t;

#define CONFIG_KEY_FILE_FORM 1u

typedef enum {
   HANDLER_KIND_WEBHOOK,
   HANDLER_KIND_PULL,
   HANDLER_KIND_NATS, /* NATS JetStream (dispatch/nats.c; a build with libnats) */
   HANDLER_KIND_RABBITMQ, /* AMQP 0-9-1 (dispatch/rabbitmq.c; a build with librabbitmq) */
   HANDLER_KIND_KAFKA,    /* Kafka (dispatch/kafka.c; a build with librdkafka) */
} handler_kind_t;

/* [handler NAME] format: how a delivery is shaped (dispatch/format.h). */
typedef enum {
   HANDLER_FORMAT_RELAYBUS,                /* the relaybus envelope (the default) */
   HANDLER_FORMAT_CLOUDEVENTS,             /* CloudEvents 1.0, binary content mode */
   HANDLER_FORMAT_CLOUDEVENTS_STRUCTURED,  /* CloudEvents 1.0, one JSON object */
   HANDLER_FORMAT_PAYLOAD,                 /* the payload alone, the metadata in headers */
} handler_format_t;

/* [handler NAME] json: how the payload is written as JSON. */
typedef enum {
   HANDLER_JSON_RELAXED,   /* relaxed Extended JSON (the default) */
   HANDLER_JSON_CANONICAL, /* canonical Extended JSON */
   HANDLER_JSON_PLAIN,     /* plain JSON: dates, ObjectIds, decimals and binary as strings */
} handler_json_t;

typedef struct {
   char *name;
   char *events; /* raw list */
   char **event_patterns; /* split, NULL-terminated; "order.*" is a prefix */
   size_t n_event_patterns;
   char *kind;
   handler_kind_t kind_id;
   char *url;
   char *subject; /* nats: the subject template ({type}, {key}) */
   char *exchange;    /* rabbitmq: the exchange published to */
   char *routing_key; /* rabbitmq: the routing key template ({type}, {key}) */
   bool persistent;   /* rabbitmq: delivery mode 2 */
   char *tls_ca_file;   /* rabbitmq amqps: PEM CA bundle; empty: the system store */
   char *tls_cert_file; /* rabbitmq amqps: PEM client certificate (with tls_key_file) */
   char *tls_key_file;  /* rabbitmq amqps: PEM private key of tls_cert_file */
   char *brokers;     /* kafka: the bootstrap servers, host:port,... */
   char *topic;       /* kafka: the topic template ({type}, {key}) */
   /* kafka: the `kafka.<property> = value` lines, pairs of strings
    * (name without "kafka.", value) in file order, owned by the
    * snapshot; at most CONFIG_KAFKA_PROPS_MAX pairs. */
   char **kafka_props;
   size_t n_kafka_props;
   /* webhook: the `header.<name> = value` lines, pairs of strings (name
    * without "header.", value) in file order, owned by the snapshot; at
    * most CONFIG_HEADERS_MAX pairs. */
   char **headers;
   size_t n_headers;
   char *proxy; /* webhook: forward proxy URL; "": https_proxy / no_proxy of the environment */
   char *secret;
   char *secret_file; /* the file `secret` was read from; "": none */
   char *url_file;    /* the file `url` was read from; "": none */
   char *retry_schedule;     /* raw list of durations */
   int64_t *retry_delays_ms; /* retry_schedule parsed: the delay before retry i + 1 */
   size_t n_retry_delays;
   int64_t max_attempts;     /* 1 + n_retry_delays unless set */
   int64_t timeout_ms;
   int64_t concurrency;
   /* rate_limit: "" (none), "N/s" or "N/min"; parsed into at most
    * rate_limit_n starts per rate_limit_period_ms (0: no limit). */
   char *rate_limit;
   int64_t rate_limit_n;
   int64_t rate_limit_period_ms;
   int64_t disable_after_ms; /* webhook: disabled after failing this long without a success */
   bool retry_4xx;
   /* pull: who may run the relaybus* commands on it, comma-separated user
    * names ("" : every connection the deployment lets read the outbox;
    * base/pull.h, pull_consumer_admitted). */
   char *consumers;
   char *format; /* raw; format_id parsed */
   handler_format_t format_id;
   char *json; /* raw; json_id parsed */
   handler_json_t json_id;
   char *source; /* CloudEvents `source` */
} config_handler_t;

/* The TLS options of the `upstream` URI, as mongo-c-driver reads them,
 * read once when the snapshot is validated (proxy/tls.h builds the
 * client-paired connections' context from them, without the driver). */
typedef struct {
   bool enabled;                   /* tls=true or ssl=true */
   char *ca_file;                  /* tlsCAFile; NULL: the system store */
   char *cert_key_file;            /* tlsCertificateKeyFile; NULL: none */
   char *cert_key_password;        /* tlsCertificateKeyFilePassword; NULL: none (wiped at release) */
   bool allow_invalid_certificates; /* tlsAllowInvalidCertificates or tlsInsecure */
   bool allow_invalid_hostnames;   /* tlsAllowInvalidHostnames or tlsInsecure */
} config_upstream_tls_t;

/* The credentials of the `upstream` URI, as mongo-c-driver reads them:
 * what pooled mode's upstream connections (proxy/pool.h) authenticate
 * with.  All NULL when the URI names no user. */
typedef struct {
   char *user;      /* NULL: no authentication upstream */
   char *password;  /* wiped at release */
   char *source;    /* authSource, the URI's default database, or "admin" */
   char *mechanism; /* authMechanism; NULL: negotiated (saslSupportedMechs) */
} config_upstream_auth_t;

/* [proxy] pool_mode. */
typedef enum {
   CONFIG_POOL_SESSION = 0, /* each client paired with its own upstream connection */
   CONFIG_POOL_POOLED,      /* clients share pool_size upstream connections */
} config_pool_mode_t;

struct authfile;

/* [outbox] unrouted: what an event no handler subscribes to gets. */
typedef enum {
   CONFIG_UNROUTED_ACCEPT = 0, /* counted only */
   CONFIG_UNROUTED_WARN,       /* counted and logged (rate-limited) */
   CONFIG_UNROUTED_REFUSE,     /* the statement is refused with an error */
} config_unrouted_t;

/* [outbox] shard_collections: whether set-up shards the outbox collections
 * (store/setup.c; their keys are in docs/outbox-schema.md). */
typedef enum {
   CONFIG_SHARD_AUTO = 0, /* when the upstream is a mongos */
   CONFIG_SHARD_ON,       /* the same, and a warning when it is not one */
   CONFIG_SHARD_OFF,      /* never: they stay unsharded on the database's primary shard */
} config_shard_t;

/* [proxy] threads: at most this many forwarding loops; 0 asks for one per
 * core, at most CONFIG_THREADS_DEFAULT_MAX. */
#define CONFIG_THREADS_MAX 64
#define CONFIG_THREADS_DEFAULT_MAX 8

typedef struct config {
   /* [proxy] */
   char *listen;
   char *upstream;
   char *upstream_file; /* the file `upstream` was read from; "": none */
   int64_t max_clients;
   int64_t threads; /* forwarding loops; 0: one per core, at most CONFIG_THREADS_DEFAULT_MAX */
   int64_t handshake_timeout_ms;
   int64_t message_timeout_ms;
   int64_t drain_timeout_ms;
   int64_t buffer_high_watermark;
   int64_t max_buffered_bytes; /* process-wide, all connections */
   int64_t upstream_connect_timeout_ms;
   config_upstream_tls_t upstream_tls; /* read from `upstream` */
   config_upstream_auth_t upstream_auth; /* read from `upstream` */
   char *pool_mode;                    /* session | pooled */
   config_pool_mode_t pool_mode_id;    /* pool_mode, parsed */
   int64_t pool_size;                  /* pooled: upstream connections of the process */
   int64_t pool_wait_timeout_ms;       /* pooled: longest wait for a free upstream connection */
   int64_t pool_max_pins_per_user;     /* pooled: connections one user's transactions may pin; 0: pool_size / 2 */
   int64_t pool_max_sessions_per_user; /* pooled: sessions one user may have in the owners' table */
   int64_t login_timeout_ms;           /* pooled, auth_file: time a client has to log in */
   char *auth_file;                    /* pooled: the users clients log in as; "": none */
   struct authfile *users;             /* auth_file loaded (pooled, set); owned by the snapshot */
   int64_t auth_failures_per_minute;   /* pooled: guesses checked per (user, address) per minute */
   int64_t auth_failure_delay_max_ms;  /* pooled: cap of a user's delay before a proof is checked */
   char *compressors;
   int64_t zlib_level;
   int64_t zstd_level;
   char *tls_cert_file;
   char *tls_key_file;
   char *tls_ca_file;
   char *log_level;
   char *log_format; /* "text" or "json" (log_format_parse) */
   char *log_file;   /* "" : standard error */

   /* [outbox] */
   char *outbox_database;
   char *collection_prefix;
   bool completion_history;
   int64_t attempt_history_ms;         /* <prefix>attempts' TTL window; 0: no attempt records */
   bool allow_client_writes;           /* client commands may write the outbox */
   char *outbox_readers;               /* [outbox] readers: "a,b,c"; "": none named */
   int64_t max_poisoned_transactions;  /* poison table capacity (restart to change) */
   int64_t retain_completed_ms;        /* scheduled purge: completed events and history */
   int64_t retain_dead_ms;             /* scheduled purge: dead deliveries */
   int64_t purge_interval_ms;          /* scheduled purge: time between runs */
   int64_t handler_heartbeat_ms;       /* fleet handler set: announce and refresh interval */
   int64_t handler_retire_after_ms;    /* fleet handler set: how long a declaration stays in the set; then it retires */
   int64_t transaction_lifetime_ms;    /* the upstream's transactionLifetimeLimitSeconds (the backfill's reach) */
   char *shard_collections;            /* auto | on | off */
   config_shard_t shard_mode;          /* shard_collections, parsed */
   char *unrouted;                     /* accept | warn | refuse */
   config_unrouted_t unrouted_mode;    /* unrouted, parsed */

   /* [dispatch] */
   bool dispatch_enabled;
   bool dispatch_watch; /* [dispatch] watch: the deliveries change stream wakes the dispatcher */
   int64_t poll_interval_ms;
   int64_t batch_size;
   int64_t lease_ms;

   /* [admin] */
   char *admin_listen;
   char *admin_token;
   char *admin_token_file; /* the file `token` was read from; "": none */
   char *admin_tls_cert_file; /* with admin_tls_key_file: the admin port is HTTPS only */
   char *admin_tls_key_file;

   /* [tracing] (base/trace.h) */
   char *tracing_otlp_endpoint;       /* "": no export */
   char *tracing_sample;              /* never | always | a ratio */
   char *tracing_service_name;
   char *tracing_resource_attributes; /* k=v list */

   config_handler_t *handlers;
   size_t n_handlers;

   /* The secrets a message may quote verbatim (config_mask): the admin
    * token, each webhook secret, the passwords of the URLs, the secret
    * kafka.<property> values; filled by validation, owned and wiped by
    * the snapshot. */
   char **secrets;
   size_t n_secrets;

   /* Where it came from, for logs and reload. */
   char *path;
   /* A credential is written in the file itself (not read from a _file
    * key or an environment variable): config_warn_exposed_secrets. */
   bool secret_inline;
   _Atomic int refcount; /* see config_retain */
} config_t;

/* The checks of values whose rules belong to a higher layer: a
 * compressor's name (codec/compress.h) and a webhook secret's encoding
 * (dispatch/webhook.h).  base depends on no other layer, so main.c (and a
 * test) registers them, once, before the first config_load; the messages
 * stay here, naming the key.  A check left NULL accepts the value as
 * written.  secrets_valid fills `error` without quoting a secret. */
typedef struct {
   bool (*compressor_known) (const char *name);
   bool (*secrets_valid) (const char *secrets, bson_error_t *error);
   /* kafka.<name> = value: librdkafka accepts the property (dispatch/kafka.h). */
   bool (*kafka_property_valid) (const char *name, const char *value, bson_error_t *error);
   /* A webhook's tls_ca_file, tls_cert_file and tls_key_file ("" when not
    * set) can be loaded and the key matches the certificate
    * (dispatch/webhook.h). */
   bool (*tls_files_valid) (const char *ca_file, const char *cert_file, const char *key_file, bson_error_t *error);
   /* header.<name> = value of a webhook: a header the proxy may send. */
   bool (*header_valid) (const char *name, const char *value, bson_error_t *error);
   /* proxy = URL of a webhook: an http:// or https:// proxy URL. */
   bool (*proxy_valid) (const char *url, bson_error_t *error);
} config_checks_t;

/* Copies `checks` (NULL: none).  Not thread-safe: call it before any load. */
void config_set_checks (const config_checks_t *checks);

/* The key tables.  Handler keys are listed with CONFIG_SECTION_HANDLER. */
const config_key_t *config_keys (size_t *n);
const char *config_section_name (config_section_t section);

/* A snapshot holding only defaults (refcount 1).  Caller releases it. */
config_t *config_new_defaults (void);

/* Parses and validates the file into a new snapshot (refcount 1), or NULL
 * with `error` naming the file, line and key. */
config_t *config_load (const char *path, bson_error_t *error) __attribute__ ((warn_unused_result));

/* Parses and validates INI text (for tests); `origin` names it in errors. */
config_t *config_parse_string (const char *text, const char *origin, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* True if `next` may replace `cur` by reload; otherwise names the first
 * non-reloadable key that changed. */
bool config_reload_allowed (const config_t *cur, const config_t *next, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Writes every key with its effective value as INI text (--check-config),
 * each string through config_mask. */
void config_write (const config_t *cfg, FILE *out);

/* The one masking of credentials for output (--check-config, the admin
 * API, every log line, every lastError the outbox stores, the brokers'
 * connection details): a copy of `value` the caller frees with bson_free,
 * or NULL for NULL.  The whole value becomes "********" for a secret key
 * (`key_name` "token" or "secret").  With `key_name` NULL the value is
 * free text (an error message, a log line): every URL in it is masked as
 * below, and then every secret of the snapshot in force (config_t.secrets,
 * at least CONFIG_SECRET_MIN_VERBATIM bytes long) that it quotes verbatim
 * becomes "********" too.  In a URL
 * the password of the user information is masked (all of it when there is
 * no ':'); in a mongodb:// or mongodb+srv:// URI also the values of the
 * certificate-key password options (tlsCertificateKeyFilePassword and its
 * older spellings) and each value of authMechanismProperties (the
 * property names stay); in any other URL every query-string value (the
 * keys stay) and the fragment. */
char *config_mask (const char *key_name, const char *value);

/* Shorter secrets are not searched for in free text: masking every "ab"
 * of a message would garble it and reveal the secret by its gaps. */
#define CONFIG_SECRET_MIN_VERBATIM 4

/* True for a kafka.<property> whose value is a secret (sasl.password,
 * ssl.key.password, ...): never echoed, masked in free text. */
bool config_kafka_prop_is_secret (const char *name);
/* A header.<name> whose value is a credential (Authorization, tokens,
 * keys, cookies): masked in --check-config, /api/config and error texts. */
bool config_header_is_secret (const char *name);

/* For --check-config: logs a warning for each file holding a secret that
 * users other than the file's owner and group may read: the configuration
 * file when a credential is written in it (secret_inline), and each file a
 * _file key names.  Returns how many it warned about. */
int config_warn_exposed_secrets (const config_t *cfg);

/* Reference counting of snapshots.  NULL is accepted by release. */
config_t *config_retain (config_t *cfg);
void config_release (config_t *cfg);

/* The process-wide current snapshot.  config_publish takes over the
 * caller's reference; config_acquire returns a new reference the caller
 * releases. */
void config_publish (config_t *cfg);
config_t *config_acquire (void);

/* The one event-pattern rule: true if one of the n patterns matches the
 * event type, exactly, or as a prefix when it ends in '*' ("order.*"). */
bool config_patterns_match (const char *const *patterns, size_t n, const char *event_type);
/* config_patterns_match over the handler's event patterns. */
bool config_handler_matches (const config_handler_t *h, const char *event_type);

/* Splits "host:port" (or "[v6]:port") into host and port; a value starting
 * with '/' is a Unix socket path (*port set to 0, host = the path). */
bool config_parse_listen (const char *value,
                          char *host,
                          size_t host_len,
                          uint16_t *port,
                          bson_error_t *error) __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_CONFIG_H */
