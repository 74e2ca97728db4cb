/*
 * codec/handshake.c - hello request and reply rewriting for the mongos persona.
 *
 * Why a mongos: a client that believes it talks to a replica-set member
 * discovers the members from `hosts` and connects to them directly,
 * bypassing the proxy.  A mongos is a single endpoint that supports
 * sessions, transactions and retryable writes, which is exactly what the
 * proxy is.  Without `topologyVersion` drivers poll hello instead of
 * streaming it, so no awaitable hello is ever needed.  Behind a load
 * balancer, a mongos also names itself with a `serviceId` to drivers that
 * ask (`loadBalanced: true`); so does the proxy, with its own.
 *
 * Documents are copied key by key, so field order and every value type are
 * preserved exactly (no decode/encode round trip).
 */
#include "codec/handshake.h"

#include <string.h>
#include <strings.h>

#include "codec/compress.h"

/* Replica-set identity: removed so the client sees a single mongos. */
static const char *const removed_reply_fields[] = {
   "setName", "setVersion", "electionId", "hosts", "passives", "arbiters", "primary",
   "me", "secondary", "tags", "lastWrite", "topologyVersion",
   /* Only present on non-primary members, which the proxy never pairs with,
    * but a mongos would never say them either. */
   "arbiterOnly", "passive", "hidden", "buildIndexes",
   /* Replaced by the proxy's own values.  A serviceId names the service a
    * load balancer reached: the proxy, never what is behind it. */
   "compression", "msg", "serviceId",
};

bool
handshake_is_hello (const char *name)
{
   /* Asked of every request: the first letter turns nearly all away. */
   if (!name)
      return false;
   if (name[0] == 'h')
      return strcmp (name, "hello") == 0;
   return name[0] == 'i' && (strcmp (name, "isMaster") == 0 || strcmp (name, "ismaster") == 0);
}

bool
handshake_unwrap_query (const bson_t *query, bson_t *out)
{
   bson_iter_t it;
   const uint8_t *data;
   uint32_t len;

   if (bson_iter_init (&it, query) && bson_iter_next (&it) &&
       (strcmp (bson_iter_key (&it), "$query") == 0 || strcmp (bson_iter_key (&it), "query") == 0) &&
       BSON_ITER_HOLDS_DOCUMENT (&it)) {
      bson_iter_document (&it, &len, &data);
      return bson_init_static (out, data, len);
   }
   return bson_init_static (out, bson_get_data (query), query->len);
}

static bool
name_in (const char *key, const char *const *names, size_t n)
{
   for (size_t i = 0; i < n; i++)
      if (strcmp (key, names[i]) == 0)
         return true;
   return false;
}

static bool
offered_contains (const char *offered, const char *name)
{
   size_t nlen = strlen (name);
   const char *p = offered;

   while (p && *p) {
      size_t n;
      while (*p == ',' || *p == ' ' || *p == '\t')
         p++;
      n = strcspn (p, ", \t");
      if (n == nlen && strncasecmp (p, name, n) == 0)
         return true;
      p += n;
   }
   return false;
}

void
handshake_negotiate (const bson_t *hello, const char *offered, handshake_compression_t *out)
{
   bson_iter_t it, child;

   memset (out, 0, sizeof *out);
   if (!bson_iter_init_find (&it, hello, "compression"))
      return;
   out->requested = true;
   if (!BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &child))
      return;
   while (bson_iter_next (&child) && out->n < HANDSHAKE_MAX_COMPRESSORS) {
      const char *name;
      int id;
      bool dup = false;

      if (!BSON_ITER_HOLDS_UTF8 (&child))
         continue;
      name = bson_iter_utf8 (&child, NULL);
      id = compress_id (name);
      /* noop is legal on the wire but pointless to offer back. */
      if (id <= 0 || !offered || !offered_contains (offered, name))
         continue;
      for (int i = 0; i < out->n; i++)
         dup |= out->ids[i] == id;
      if (!dup)
         out->ids[out->n++] = id;
   }
}

bool
handshake_wants_load_balanced (const bson_t *hello)
{
   bson_iter_t it;

   /* A boolean in the drivers' handshake; a number is taken as mongos
    * takes it (any non-zero value is true). */
   if (!bson_iter_init_find (&it, hello, "loadBalanced"))
      return false;
   if (BSON_ITER_HOLDS_BOOL (&it))
      return bson_iter_bool (&it);
   return BSON_ITER_HOLDS_NUMBER (&it) && bson_iter_as_double (&it) != 0.0;
}

bool
handshake_is_x509_auth (const bson_t *cmd)
{
   bson_iter_t it;

   /* mongod's mechanism names are upper case; refusing other spellings
    * too costs nothing (mongod would reject them as unknown). */
   return bson_iter_init_find (&it, cmd, "mechanism") && BSON_ITER_HOLDS_UTF8 (&it) &&
          strcasecmp (bson_iter_utf8 (&it, NULL), "MONGODB-X509") == 0;
}

/* A `speculativeAuthenticate` element (at `it`) that asks for MONGODB-X509. */
static bool
speculative_is_x509 (const bson_iter_t *it)
{
   bson_t doc;
   const uint8_t *data;
   uint32_t len;

   if (!BSON_ITER_HOLDS_DOCUMENT (it))
      return false;
   bson_iter_document (it, &len, &data);
   return bson_init_static (&doc, data, len) && handshake_is_x509_auth (&doc);
}

bool
handshake_speculative_x509 (const bson_t *hello)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, hello, "speculativeAuthenticate") && speculative_is_x509 (&it);
}

bool
handshake_rewrite_request (const bson_t *hello, bool add_db, bson_t *out, bson_error_t *error)
{
   bson_iter_t it;
   bool has_db = false;
   bool ok = false;

   bson_init (out);
   if (!bson_iter_init (&it, hello)) {
      bson_set_error (error, HANDSHAKE_ERROR_DOMAIN, HANDSHAKE_ERR_INVALID, "hello is not a valid document");
      goto done;
   }
   while (bson_iter_next (&it)) {
      const char *key = bson_iter_key (&it);

      /* The upstream must never compress towards the proxy: it would pick a
       * compressor per its own list, not the one the client negotiated. */
      if (strcmp (key, "compression") == 0)
         continue;
      /* The proxy lends no certificate to clients (proxy/tls.c), so an X.509
       * login can only be refused; without the speculative attempt the
       * driver sends an explicit authenticate, which is refused with a
       * clear error (proxy/pump.c). */
      if (strcmp (key, "speculativeAuthenticate") == 0 && speculative_is_x509 (&it))
         continue;
      /* The mongos persona has no topologyVersion, so every hello is
       * answered at once.  A driver still sends an awaitable hello after
       * it took the topologyVersion of a member's not-primary error
       * (relayed unchanged) as the proxy's; forwarded as it is, the member
       * would hold it for maxAwaitTimeMS when nothing changed, and the
       * driver would select no server meanwhile. */
      if (strcmp (key, "topologyVersion") == 0 || strcmp (key, "maxAwaitTimeMS") == 0)
         continue;
      /* Legacy OP_QUERY read preference wrapper: meaningless in OP_MSG. */
      if (add_db && strcmp (key, "$readPreference") == 0)
         continue;
      if (strcmp (key, "$db") == 0)
         has_db = true;
      if (!bson_append_iter (out, key, -1, &it)) {
         bson_set_error (error, HANDSHAKE_ERROR_DOMAIN, HANDSHAKE_ERR_TOO_LARGE, "hello too large to rewrite");
         goto done;
      }
   }
   if (add_db && !has_db && !BSON_APPEND_UTF8 (out, "$db", "admin")) {
      bson_set_error (error, HANDSHAKE_ERROR_DOMAIN, HANDSHAKE_ERR_TOO_LARGE, "hello too large to rewrite");
      goto done;
   }
   ok = true;
done:
   return ok;
}

static bool
reply_ok (const bson_t *reply)
{
   bson_iter_t it;
   return bson_iter_init_find (&it, reply, "ok") && bson_iter_as_double (&it) == 1.0;
}

static bool
append_persona (bson_t *out, const handshake_compression_t *compression, const bson_oid_t *service_id)
{
   bson_t arr;
   char idx[16];
   const char *key;

   if (!BSON_APPEND_UTF8 (out, "msg", "isdbgrid"))
      return false;
   if (service_id && !BSON_APPEND_OID (out, "serviceId", service_id))
      return false;
   if (!compression || compression->n == 0)
      return true;
   if (!BSON_APPEND_ARRAY_BEGIN (out, "compression", &arr))
      return false;
   for (int i = 0; i < compression->n; i++) {
      bson_uint32_to_string ((uint32_t) i, &key, idx, sizeof idx);
      if (!bson_append_utf8 (&arr, key, -1, compress_name (compression->ids[i]), -1))
         return false;
   }
   return bson_append_array_end (out, &arr);
}

bool
handshake_rewrite_reply (const bson_t *reply,
                         const handshake_compression_t *compression,
                         const bson_oid_t *service_id,
                         bson_t *out,
                         bson_error_t *error)
{
   bson_iter_t it;
   bool rewrite = reply_ok (reply);
   bool added = false;
   bool ok = false;

   bson_init (out);
   if (!bson_iter_init (&it, reply)) {
      bson_set_error (error, HANDSHAKE_ERROR_DOMAIN, HANDSHAKE_ERR_INVALID, "hello reply is not a valid document");
      goto done;
   }
   while (bson_iter_next (&it)) {
      const char *key = bson_iter_key (&it);

      if (rewrite) {
         if (name_in (key,
                      removed_reply_fields,
                      sizeof removed_reply_fields / sizeof removed_reply_fields[0]))
            continue;
         /* mongos places msg and compression before ok; so do we. */
         if (!added && strcmp (key, "ok") == 0) {
            if (!append_persona (out, compression, service_id))
               goto too_large;
            added = true;
         }
      }
      if (!bson_append_iter (out, key, -1, &it))
         goto too_large;
   }
   if (rewrite && !added && !append_persona (out, compression, service_id))
      goto too_large;
   ok = true;
   goto done;
too_large:
   bson_set_error (error, HANDSHAKE_ERROR_DOMAIN, HANDSHAKE_ERR_TOO_LARGE, "hello reply too large to rewrite");
done:
   return ok;
}
