/*
 * proxy/tls.h - OpenSSL contexts for both sides of the proxy.
 *
 * Upstream: built from the TLS options of the `upstream` URI, as
 * mongo-c-driver reads them (tls/ssl, tlsCAFile, tlsAllowInvalidCertificates,
 * tlsAllowInvalidHostnames, tlsInsecure).  Each connection gets SNI (for a
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

#define TLS_ERROR_DOMAIN 0x544c /* "TL" */

typedef struct tls_upstream tls_upstream_t;

/* Returns true and sets *out to NULL when the URI does not ask for TLS.
 * Otherwise *out is a new context the caller destroys. */
bool tls_upstream_new (const char *uri, tls_upstream_t **out, bson_error_t *error)
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
