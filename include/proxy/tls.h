/*
 * proxy/tls.h - OpenSSL contexts for both sides of the proxy.
 *
 * Thread: tls_upstream_new, tls_server_new and the destroys: the main
 * thread at start-up and teardown; tls_upstream_ssl_new: any forwarding
 * loop, concurrently (the SSL_CTX is only read; OpenSSL makes each SSL
 * from it safely); tls_last_error: any thread.
 *
 * Upstream: built from the TLS options of the `upstream` URI, as
 * mongo-c-driver reads them (tls/ssl, tlsCAFile, tlsAllowInvalidCertificates,
 * tlsAllowInvalidHostnames, tlsInsecure), which base/config.c reads into
 * the snapshot (config_upstream_tls_t).  Each connection gets SNI (for a
 * host name) and host name or IP verification unless the URI turns it off.
 * These are the client-paired connections, so they present no client
 * certificate: tlsCertificateKeyFile (and its password) is only checked at
 * start-up and left to the proxy's own mongoc connections.
 * Listener: a server context from [proxy] tls_cert_file / tls_key_file,
 * verifying client certificates when tls_ca_file is set.
 *
 * Contexts are built once at start-up (file I/O happens there, never per
 * connection) and are immutable afterwards.
 */
#ifndef RELAYBUS_TLS_H
#define RELAYBUS_TLS_H

#include <stdbool.h>

#include <bson/bson.h>
#include <openssl/ssl.h>

#include "base/config.h"
#include "base/errors.h"

typedef enum {
   TLS_ERROR_CONTEXT = 1, /* SSL_CTX_new failed */
   TLS_ERROR_CA,          /* a CA file (or the system store) does not load */
   TLS_ERROR_CERT,        /* a certificate or key file does not load or match */
   TLS_ERROR_SSL,         /* SSL_new failed */
   TLS_ERROR_HOST,        /* SNI or host verification could not be set up */
} tls_error_code_t;

typedef struct tls_upstream tls_upstream_t;

/* Returns true and sets *out to NULL when the options do not ask for TLS.
 * Otherwise *out is a new context the caller destroys. */
bool tls_upstream_new (const config_upstream_tls_t *opts, tls_upstream_t **out, bson_error_t *error)
   __attribute__ ((warn_unused_result));
/* A new SSL for one connection to `host` (SNI and verification set up).
 * The caller hands it to a bufferevent that frees it. */
SSL *tls_upstream_ssl_new (tls_upstream_t *tls, const char *host, bson_error_t *error)
   __attribute__ ((warn_unused_result));
void tls_upstream_destroy (tls_upstream_t *tls);
/* True when the URI names a tlsCertificateKeyFile that client-paired
 * connections do not present (for the start-up log). */
bool tls_upstream_withholds_cert (const tls_upstream_t *tls);

/* The listener side; NULL cert_file means no TLS (*out = NULL). */
bool tls_server_new (const char *cert_file,
                     const char *key_file,
                     const char *ca_file,
                     SSL_CTX **out,
                     bson_error_t *error) __attribute__ ((warn_unused_result));

/* The last OpenSSL error as text, for logs ("" when none).  Thread-local
 * buffer. */
const char *tls_last_error (void);

#endif /* RELAYBUS_TLS_H */
