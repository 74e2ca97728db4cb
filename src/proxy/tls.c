/*
 * proxy/tls.c - OpenSSL context set-up for upstream and listener connections.
 *
 * Host name verification uses OpenSSL's own X509_VERIFY_PARAM matching
 * (an IP address literal is matched against IP SANs), so the handshake
 * fails inside OpenSSL and bufferevent_openssl reports it as an event
 * error: there is no separate post-handshake check to forget.
 *
 * The upstream context never holds the URI's tlsCertificateKeyFile: every
 * client-paired connection uses it, and a certificate presented there
 * would let any client authenticate with MONGODB-X509 as the proxy (as
 * __system if it is a cluster member's).  The file is still loaded once at
 * start-up, with its password, so a bad file fails there as before; the
 * proxy's own mongoc connections (topology, store, dispatch, admin) read it
 * from the URI through mongoc's TLS and present it.
 */
#include "proxy/tls.h"

#include <arpa/inet.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "base/assert.h"

struct tls_upstream {
   SSL_CTX *ctx; /* no client certificate, see the file comment */
   bool verify_hostname;
   bool cert_withheld; /* the URI names a tlsCertificateKeyFile */
};

const char *
tls_last_error (void)
{
   static _Thread_local char buf[256];
   unsigned long e = ERR_get_error ();

   buf[0] = '\0';
   if (e)
      ERR_error_string_n (e, buf, sizeof buf);
   ERR_clear_error ();
   return buf;
}

/* Peers (drivers, a killed server) often close without close_notify.
 * Every message is length-framed, so a truncated one is detected by the
 * framing anyway; OpenSSL 3 would otherwise report such a close as an
 * SSL error instead of an end of stream. */
static void
tls_ctx_common (SSL_CTX *ctx)
{
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
   SSL_CTX_set_options (ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
}

static int
tls_password_cb (char *buf, int size, int rwflag, void *userdata)
{
   const char *pw = userdata;
   size_t len;

   if (!pw)
      return 0;
   len = strlen (pw);
   if (len > (size_t) size)
      len = (size_t) size;
   memcpy (buf, pw, len);
   return (int) len;
}

void
tls_upstream_destroy (tls_upstream_t *tls)
{
   if (!tls)
      return;
   SSL_CTX_free (tls->ctx);
   bson_free (tls);
}

/* Loads the URI's certificate and key (one PEM, mongo-c-driver's
 * convention) into a context used for nothing else, so a missing file, a
 * wrong password or a key that does not match fails start-up with the same
 * error as before, without the certificate reaching client connections. */
static bool
tls_check_keyfile (const char *keyfile, const char *pw, bson_error_t *error)
{
   SSL_CTX *ctx = SSL_CTX_new (TLS_client_method ());
   char *password = pw ? bson_strdup (pw) : NULL;
   bool ok = false;

   if (!ctx) {
      bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CONTEXT, "SSL_CTX_new: %s", tls_last_error ());
      goto done;
   }
   SSL_CTX_set_default_passwd_cb (ctx, tls_password_cb);
   SSL_CTX_set_default_passwd_cb_userdata (ctx, password);
   if (SSL_CTX_use_certificate_chain_file (ctx, keyfile) != 1 ||
       SSL_CTX_use_PrivateKey_file (ctx, keyfile, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key (ctx) != 1) {
      bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CERT, "tlsCertificateKeyFile %s: %s", keyfile, tls_last_error ());
      goto done;
   }
   ok = true;
done:
   SSL_CTX_free (ctx);
   if (password)
      bson_zero_free (password, strlen (password));
   return ok;
}

bool
tls_upstream_withholds_cert (const tls_upstream_t *tls)
{
   return tls && tls->cert_withheld;
}

bool
tls_upstream_new (const config_upstream_tls_t *opts, tls_upstream_t **out, bson_error_t *error)
{
   tls_upstream_t *tls = NULL;
   const char *ca = opts->ca_file, *keyfile = opts->cert_key_file;
   bool allow_certs = opts->allow_invalid_certificates, allow_hosts = opts->allow_invalid_hostnames;
   bool ok = false;

   *out = NULL;
   if (!opts->enabled) {
      ok = true;
      goto done;
   }
   tls = bson_malloc0 (sizeof *tls);
   tls->ctx = SSL_CTX_new (TLS_client_method ());
   if (!tls->ctx) {
      bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CONTEXT, "SSL_CTX_new: %s", tls_last_error ());
      goto done;
   }
   SSL_CTX_set_min_proto_version (tls->ctx, TLS1_2_VERSION);
   tls_ctx_common (tls->ctx);
   SSL_CTX_set_mode (tls->ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
   if (ca) {
      if (SSL_CTX_load_verify_locations (tls->ctx, ca, NULL) != 1) {
         bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CA, "tlsCAFile %s: %s", ca, tls_last_error ());
         goto done;
      }
   } else if (SSL_CTX_set_default_verify_paths (tls->ctx) != 1) {
      bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CA, "system CA store: %s", tls_last_error ());
      goto done;
   }
   if (keyfile) {
      if (!tls_check_keyfile (keyfile, opts->cert_key_password, error))
         goto done;
      tls->cert_withheld = true;
   }
   SSL_CTX_set_verify (tls->ctx, allow_certs ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
   tls->verify_hostname = !allow_hosts && !allow_certs;
   *out = tls;
   tls = NULL;
   ok = true;
done:
   tls_upstream_destroy (tls);
   return ok;
}

static bool
is_ip_literal (const char *host)
{
   unsigned char buf[16];
   return inet_pton (AF_INET, host, buf) == 1 || inet_pton (AF_INET6, host, buf) == 1;
}

SSL *
tls_upstream_ssl_new (tls_upstream_t *tls, const char *host, bson_error_t *error)
{
   SSL *ssl;
   bool ip;

   RELAYBUS_ASSERT (tls && tls->ctx && host);
   ssl = SSL_new (tls->ctx);
   ip = is_ip_literal (host);

   if (!ssl) {
      bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_SSL, "SSL_new: %s", tls_last_error ());
      return NULL;
   }
   /* SNI carries names only (RFC 6066). */
   if (!ip && SSL_set_tlsext_host_name (ssl, host) != 1)
      goto fail;
   if (tls->verify_hostname) {
      X509_VERIFY_PARAM *param = SSL_get0_param (ssl);
      X509_VERIFY_PARAM_set_hostflags (param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      if ((ip ? X509_VERIFY_PARAM_set1_ip_asc (param, host) : X509_VERIFY_PARAM_set1_host (param, host, 0)) != 1)
         goto fail;
   }
   return ssl;
fail:
   bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_HOST, "cannot set up TLS for %s: %s", host, tls_last_error ());
   SSL_free (ssl);
   return NULL;
}

bool
tls_server_new (const char *cert_file, const char *key_file, const char *ca_file, SSL_CTX **out, bson_error_t *error)
{
   SSL_CTX *ctx = NULL;
   bool ok = false;

   *out = NULL;
   if (!cert_file || !*cert_file) {
      ok = true;
      goto done;
   }
   ctx = SSL_CTX_new (TLS_server_method ());
   if (!ctx) {
      bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CONTEXT, "SSL_CTX_new: %s", tls_last_error ());
      goto done;
   }
   SSL_CTX_set_min_proto_version (ctx, TLS1_2_VERSION);
   tls_ctx_common (ctx);
   SSL_CTX_set_mode (ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
   if (SSL_CTX_use_certificate_chain_file (ctx, cert_file) != 1) {
      bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CERT, "tls_cert_file %s: %s", cert_file, tls_last_error ());
      goto done;
   }
   if (!key_file || !*key_file)
      key_file = cert_file; /* one PEM with both, as mongod's tlsCertificateKeyFile */
   if (SSL_CTX_use_PrivateKey_file (ctx, key_file, SSL_FILETYPE_PEM) != 1 ||
       SSL_CTX_check_private_key (ctx) != 1) {
      bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CERT, "tls_key_file %s: %s", key_file, tls_last_error ());
      goto done;
   }
   if (ca_file && *ca_file) {
      if (SSL_CTX_load_verify_locations (ctx, ca_file, NULL) != 1) {
         bson_set_error (error, TLS_ERROR_DOMAIN, TLS_ERROR_CA, "tls_ca_file %s: %s", ca_file, tls_last_error ());
         goto done;
      }
      /* A CA file means: clients must present a certificate it signed. */
      SSL_CTX_set_verify (ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
   }
   *out = ctx;
   ctx = NULL;
   ok = true;
done:
   SSL_CTX_free (ctx);
   return ok;
}
