/*
 * base/config_upstream.c - what the proxy reads out of [proxy] upstream,
 * the URI: its TLS options (for the client connections' upstream side,
 * proxy/tls.c) and its credentials, read the way mongo-c-driver reads
 * them; and pooled mode's checks, which depend on both (the login the pool
 * can do itself, and the auth file of its users).  The rest of the
 * snapshot's validation is base/config.c's.
 */
#include "base/config.h"
#include "base/config_private.h"

#include <string.h>

#include <mongoc/mongoc.h>

#include "base/authfile.h"

/* The URI's TLS options (config_upstream_tls_t), read the way
 * mongo-c-driver reads them. */
static void
config_read_upstream_tls (const mongoc_uri_t *uri, config_upstream_tls_t *out)
{
   const char *ca, *keyfile, *pw;
   bool insecure;

   out->enabled = mongoc_uri_get_tls (uri);
   if (!out->enabled)
      return;
   ca = mongoc_uri_get_option_as_utf8 (uri, MONGOC_URI_TLSCAFILE, NULL);
   keyfile = mongoc_uri_get_option_as_utf8 (uri, MONGOC_URI_TLSCERTIFICATEKEYFILE, NULL);
   pw = mongoc_uri_get_option_as_utf8 (uri, MONGOC_URI_TLSCERTIFICATEKEYFILEPASSWORD, NULL);
   insecure = mongoc_uri_get_option_as_bool (uri, MONGOC_URI_TLSINSECURE, false);
   out->ca_file = ca ? bson_strdup (ca) : NULL;
   out->cert_key_file = keyfile ? bson_strdup (keyfile) : NULL;
   out->cert_key_password = pw ? bson_strdup (pw) : NULL;
   out->allow_invalid_certificates =
      insecure || mongoc_uri_get_option_as_bool (uri, MONGOC_URI_TLSALLOWINVALIDCERTIFICATES, false);
   out->allow_invalid_hostnames =
      insecure || mongoc_uri_get_option_as_bool (uri, MONGOC_URI_TLSALLOWINVALIDHOSTNAMES, false);
}

/* The URI's credentials (config_upstream_auth_t), read the way
 * mongo-c-driver reads them. */
static void
config_read_upstream_auth (const mongoc_uri_t *uri, config_upstream_auth_t *out)
{
   const char *user = mongoc_uri_get_username (uri);
   const char *password = mongoc_uri_get_password (uri);
   const char *mech = mongoc_uri_get_auth_mechanism (uri);

   if (!user && !mech)
      return;
   out->user = user ? bson_strdup (user) : NULL;
   out->password = password ? bson_strdup (password) : NULL;
   out->source = bson_strdup (mongoc_uri_get_auth_source (uri));
   out->mechanism = mech ? bson_strdup (mech) : NULL;
}

/* pool_mode and what pooled mode needs: an upstream login it can do
 * itself, and the auth file's users. */
static bool
config_validate_pool (config_t *cfg, const char *origin, bson_error_t *error)
{
   const config_upstream_auth_t *a = &cfg->upstream_auth;
   bson_error_t sub;

   if (strcmp (cfg->pool_mode, "session") == 0) {
      cfg->pool_mode_id = CONFIG_POOL_SESSION;
      if (cfg->auth_file[0]) {
         config_error (error, origin, 0,
                       "[proxy] auth_file: is read in pooled mode only (pool_mode = session passes each client's "
                       "own login to the server); remove it or set pool_mode = pooled");
         return false;
      }
      return true;
   }
   if (strcmp (cfg->pool_mode, "pooled") != 0) {
      config_error (error, origin, 0, "[proxy] pool_mode: '%s' is not session or pooled", cfg->pool_mode);
      return false;
   }
   cfg->pool_mode_id = CONFIG_POOL_POOLED;
   if (a->mechanism && strcmp (a->mechanism, "SCRAM-SHA-256") != 0 && strcmp (a->mechanism, "SCRAM-SHA-1") != 0 &&
       strcmp (a->mechanism, "MONGODB-X509") != 0) {
      config_error (error, origin, 0,
                    "[proxy] upstream: authMechanism=%s is not supported in pooled mode (the pool logs in with "
                    "SCRAM-SHA-256, SCRAM-SHA-1 or MONGODB-X509)",
                    a->mechanism);
      return false;
   }
   if (a->mechanism && strcmp (a->mechanism, "MONGODB-X509") == 0 && !cfg->upstream_tls.cert_key_file) {
      config_error (error, origin, 0,
                    "[proxy] upstream: authMechanism=MONGODB-X509 needs tlsCertificateKeyFile, the certificate the "
                    "pool's connections log in with");
      return false;
   }
   if (a->user && (!a->mechanism || strcmp (a->mechanism, "MONGODB-X509") != 0) && !a->password) {
      config_error (error, origin, 0, "[proxy] upstream: user '%s' has no password (pooled mode logs in with SCRAM)",
                    a->user);
      return false;
   }
   if (cfg->auth_file[0]) {
      cfg->users = authfile_load (cfg->auth_file, &sub);
      if (!cfg->users) {
         config_error (error, origin, 0, "[proxy] auth_file: %s", sub.message);
         return false;
      }
   }
   return true;
}

bool
config_read_upstream (config_t *cfg, const char *origin, bson_error_t *error)
{
   bson_error_t sub;
   mongoc_uri_t *uri = mongoc_uri_new_with_error (cfg->upstream, &sub);

   if (!uri) {
      /* The driver's message may quote the URI, password included. */
      char *masked = config_mask (NULL, sub.message);
      config_error (error, origin, 0, "[proxy] upstream: %s", masked);
      bson_free (masked);
      return false;
   }
   config_read_upstream_tls (uri, &cfg->upstream_tls);
   config_read_upstream_auth (uri, &cfg->upstream_auth);
   mongoc_uri_destroy (uri);
   return config_validate_pool (cfg, origin, error);
}
