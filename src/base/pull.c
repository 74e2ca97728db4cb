/*
 * base/pull.c - parsing and validating the pull consumers' commands, and
 * their lease strings (base/pull.h).
 *
 * Every refusal names the field and says what was expected; nothing is
 * taken for granted from a client: numbers must be integral and in range,
 * strings must be UTF-8 strings of a bounded length, unknown fields are
 * refused (a misspelt `limit` would otherwise be silently ignored).  The
 * fields a driver adds to every command are let through.
 */
#include "base/pull.h"

#include <math.h>
#include <string.h>

/* The operation of a command name; false: not a pull command (relaybusStatus
 * counts only with a handler name: see pull_is_command). */
static bool pull_op_of (const char *cmd, pull_op_t *op);

static const char *const op_names[PULL_OP_COUNT_] = {
   [PULL_CLAIM] = "relaybusClaim",
   [PULL_COMPLETE] = "relaybusComplete",
   [PULL_RETRY] = "relaybusRetry",
   [PULL_BURY] = "relaybusBury",
   [PULL_EXTEND] = "relaybusExtend",
   [PULL_RELEASE] = "relaybusRelease",
   [PULL_STATUS] = "relaybusStatus",
};

const char *
pull_op_name (pull_op_t op)
{
   return (unsigned) op < PULL_OP_COUNT_ ? op_names[op] : "relaybus";
}

static bool
pull_op_of (const char *cmd, pull_op_t *op)
{
   for (int i = 0; cmd && i < PULL_OP_COUNT_; i++)
      if (strcmp (cmd, op_names[i]) == 0) {
         *op = (pull_op_t) i;
         return true;
      }
   return false;
}

bool
pull_is_command (const char *cmd, const bson_t *body)
{
   pull_op_t op;
   bson_iter_t it;

   if (!pull_op_of (cmd, &op))
      return false;
   if (op != PULL_STATUS)
      return true;
   return bson_iter_init (&it, body) && bson_iter_next (&it) && BSON_ITER_HOLDS_UTF8 (&it);
}

const char *
pull_code_name (pull_code_t code)
{
   const char *name;

   switch (code) {
   case PULL_CODE_NO_SUCH_LEASE:
      return "RelaybusLeaseNotHeld";
   case PULL_CODE_LEASE_LOST:
      return "RelaybusLeaseLost";
   default:
      name = server_code_name (code);
      return name ? name : "InternalError";
   }
}

void
pull_error_reply (bson_t *doc, pull_code_t code, const char *errmsg)
{
   BSON_APPEND_DOUBLE (doc, "ok", 0.0);
   BSON_APPEND_UTF8 (doc, "errmsg", errmsg);
   BSON_APPEND_INT32 (doc, "code", (int32_t) code);
   BSON_APPEND_UTF8 (doc, "codeName", pull_code_name (code));
}

void
pull_error_replyv (bson_t *doc, pull_code_t code, const char *fmt, va_list ap)
{
   char errmsg[512];

   bson_vsnprintf (errmsg, sizeof errmsg, fmt, ap);
   pull_error_reply (doc, code, errmsg);
}

/* --- leases ------------------------------------------------------------- */

void
pull_lease_format (const char *token, const bson_oid_t *id, char out[PULL_LEASE_MAX])
{
   char hex[25];

   bson_oid_to_string (id, hex);
   bson_snprintf (out, PULL_LEASE_MAX, "%s:%s", token, hex);
}

bool
pull_lease_parse (const char *text, pull_lease_t *out)
{
   const char *colon;
   size_t len, tlen;
   outbox_lease_t lease;

   if (!text)
      return false;
   len = strlen (text);
   colon = strrchr (text, ':');
   if (len >= PULL_LEASE_MAX || !colon || strlen (colon + 1) != 24)
      return false;
   tlen = (size_t) (colon - text);
   if (tlen == 0 || tlen >= OUTBOX_LEASE_TOKEN_MAX)
      return false;
   for (int i = 1; i <= 24; i++)
      if (!((colon[i] >= '0' && colon[i] <= '9') || (colon[i] >= 'a' && colon[i] <= 'f')))
         return false;
   memcpy (out->token, text, tlen);
   out->token[tlen] = '\0';
   if (!outbox_lease_parse (out->token, &lease))
      return false;
   bson_oid_init_from_string (&out->id, colon + 1);
   memcpy (out->text, text, len + 1);
   return true;
}

/* --- commands ------------------------------------------------------------ */

/* The fields drivers add to any command, and the ones pull commands take
 * no interest in. */
static bool
driver_field (const char *key)
{
   static const char *const known[] = {
      "lsid", "txnNumber", "autocommit", "startTransaction", "readConcern", "writeConcern", "apiVersion",
      "apiStrict", "apiDeprecationErrors", "comment", "maxTimeMS", NULL,
   };

   if (key[0] == '$')
      return true;
   for (int i = 0; known[i]; i++)
      if (strcmp (key, known[i]) == 0)
         return true;
   return false;
}

#define FAIL(code, ...)                                                          \
   do {                                                                          \
      bson_set_error (error, PULL_ERROR_DOMAIN, (uint32_t) (code), __VA_ARGS__); \
      goto done;                                                                 \
   } while (0)

/* An integral number in [min, max] (int32, int64 or a double without a
 * fraction, as drivers send numbers). */
static bool
iter_integer (const bson_iter_t *it, int64_t min, int64_t max, int64_t *out)
{
   int64_t v;

   if (BSON_ITER_HOLDS_INT32 (it))
      v = bson_iter_int32 (it);
   else if (BSON_ITER_HOLDS_INT64 (it))
      v = bson_iter_int64 (it);
   else if (BSON_ITER_HOLDS_DOUBLE (it)) {
      double d = bson_iter_double (it);
      if (!isfinite (d) || d != floor (d) || d < (double) min || d > (double) max)
         return false;
      v = (int64_t) d;
   } else
      return false;
   if (v < min || v > max)
      return false;
   *out = v;
   return true;
}

/* A string of at most max - 1 bytes, copied. */
static bool
iter_string (const bson_iter_t *it, char *out, size_t max)
{
   uint32_t len;
   const char *s;

   if (!BSON_ITER_HOLDS_UTF8 (it))
      return false;
   s = bson_iter_utf8 (it, &len);
   if (len >= max || strlen (s) != len)
      return false;
   memcpy (out, s, len + 1);
   return true;
}

/* What each operation takes beyond its handler. */
enum { F_LIMIT = 1, F_LEASE_MS = 2, F_AWAIT = 4, F_CONSUMER = 8, F_LEASES = 16, F_LEASE = 32, F_DELAY = 64, F_ERROR = 128 };

static const unsigned op_fields[PULL_OP_COUNT_] = {
   [PULL_CLAIM] = F_LIMIT | F_LEASE_MS | F_AWAIT | F_CONSUMER,
   [PULL_COMPLETE] = F_LEASES,
   [PULL_RETRY] = F_LEASE | F_DELAY | F_ERROR,
   [PULL_BURY] = F_LEASE | F_ERROR,
   [PULL_EXTEND] = F_LEASES | F_LEASE_MS,
   [PULL_RELEASE] = F_LEASES,
   [PULL_STATUS] = 0,
};

static unsigned
field_of (const char *key)
{
   static const struct {
      const char *name;
      unsigned bit;
   } names[] = {
      {"limit", F_LIMIT}, {"leaseMs", F_LEASE_MS}, {"maxAwaitTimeMS", F_AWAIT}, {"consumer", F_CONSUMER},
      {"leases", F_LEASES}, {"lease", F_LEASE}, {"delayMs", F_DELAY}, {"error", F_ERROR},
   };

   for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
      if (strcmp (key, names[i].name) == 0)
         return names[i].bit;
   return 0;
}

/* One lease of the command (`what` names the field in messages). */
static bool
parse_lease (const bson_iter_t *it, pull_lease_t *out, const char *cmd, const char *what, bson_error_t *error)
{
   if (!BSON_ITER_HOLDS_UTF8 (it)) {
      bson_set_error (error, PULL_ERROR_DOMAIN, PULL_CODE_BAD_VALUE, "relaybus: %s: %s must be a lease string", cmd, what);
      return false;
   }
   if (!pull_lease_parse (bson_iter_utf8 (it, NULL), out)) {
      bson_set_error (error, PULL_ERROR_DOMAIN, PULL_CODE_BAD_VALUE,
                      "relaybus: %s: %s '%.80s' is not a lease relaybusClaim handed out "
                      "(<laneId>:<epoch>:<claims>:<deliveryId>)",
                      cmd, what, bson_iter_utf8 (it, NULL));
      return false;
   }
   return true;
}

const config_handler_t *
pull_handler_named (const bson_t *body, const config_t *cfg)
{
   char name[sizeof ((pull_req_t *) 0)->handler];
   bson_iter_t it;

   if (!cfg || !bson_iter_init (&it, body) || !bson_iter_next (&it) || !iter_string (&it, name, sizeof name))
      return NULL;
   for (size_t i = 0; i < cfg->n_handlers; i++)
      if (strcmp (cfg->handlers[i].name, name) == 0)
         return &cfg->handlers[i];
   return NULL;
}

/* Does list entry e[0..n) name `user` of `db`? */
static bool
entry_names (const char *e, size_t n, const char *user, const char *db)
{
   size_t ulen = strlen (user), dlen;

   if (!db || strcmp (db, "admin") == 0)
      if (n == ulen && memcmp (e, user, n) == 0)
         return true;
   if (!db)
      return false;
   dlen = strlen (db);
   return n == dlen + 1 + ulen && memcmp (e, db, dlen) == 0 && e[dlen] == '.' && memcmp (e + dlen + 1, user, ulen) == 0;
}

/* Does the user list `p` (normalised by the config: "a,b,c", no blanks)
 * name `user` of `db`? */
static bool
list_names (const char *p, const char *user, const char *db)
{
   if (!p || !user || !*user)
      return false;
   while (*p) {
      const char *comma = strchr (p, ',');
      size_t n = comma ? (size_t) (comma - p) : strlen (p);

      if (entry_names (p, n, user, db))
         return true;
      p += n + (comma ? 1 : 0);
   }
   return false;
}

bool
pull_consumer_admitted (const config_handler_t *h, const char *user, const char *db)
{
   if (!h->consumers || !*h->consumers)
      return true;
   return list_names (h->consumers, user, db);
}

bool
pull_outbox_reader (const config_t *cfg, const char *user, const char *db)
{
   bool restricted = cfg->outbox_readers && *cfg->outbox_readers;

   if (list_names (cfg->outbox_readers, user, db))
      return true;
   for (size_t i = 0; i < cfg->n_handlers; i++) {
      const char *list = cfg->handlers[i].consumers;
      if (list && *list) {
         restricted = true;
         if (list_names (list, user, db))
            return true;
      }
   }
   return !restricted;
}

bool
pull_parse (const char *cmd, const bson_t *body, const config_t *cfg, pull_req_t **out, bson_error_t *error)
{
   pull_req_t *r = bson_malloc0 (sizeof *r);
   const config_handler_t *h = NULL;
   unsigned seen = 0, allowed;
   bson_iter_t it;
   bool ok = false;

   *out = NULL;
   if (!pull_op_of (cmd, &r->op))
      FAIL (PULL_CODE_BAD_VALUE, "relaybus: '%.100s' is not a pull command", cmd);
   allowed = op_fields[r->op];
   r->limit = 1;
   r->lease_ms = PULL_LEASE_MS_DEFAULT;
   r->delay_ms = -1;
   if (!bson_iter_init (&it, body) || !bson_iter_next (&it))
      FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: empty command", cmd);
   if (!iter_string (&it, r->handler, sizeof r->handler) || !r->handler[0])
      FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: the command's value must be the handler's name (a string)", cmd);
   for (size_t i = 0; cfg && i < cfg->n_handlers; i++)
      if (strcmp (cfg->handlers[i].name, r->handler) == 0)
         h = &cfg->handlers[i];
   if (!h)
      FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: handler: no handler named '%.100s' is configured", cmd, r->handler);
   if (h->kind_id != HANDLER_KIND_PULL && r->op != PULL_STATUS)
      FAIL (PULL_CODE_BAD_VALUE,
            "relaybus: %s: handler: '%.100s' is kind = %s; only kind = pull handlers are consumed with "
            "relaybus* commands",
            cmd, r->handler, h->kind);

   while (bson_iter_next (&it)) {
      const char *key = bson_iter_key (&it);
      unsigned f = field_of (key);

      if (driver_field (key))
         continue;
      if (!(f & allowed))
         FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: unknown field '%.100s'", cmd, key);
      if (seen & f)
         FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: %s is given twice", cmd, key);
      seen |= f;
      switch (f) {
      case F_LIMIT:
         if (!iter_integer (&it, 1, PULL_MAX_LIMIT, &r->limit))
            FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: limit must be an integer from 1 to %d", cmd, PULL_MAX_LIMIT);
         break;
      case F_LEASE_MS:
         if (!iter_integer (&it, PULL_LEASE_MS_MIN, PULL_LEASE_MS_MAX, &r->lease_ms))
            FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: leaseMs must be an integer from %d to %d (ms)", cmd,
                  PULL_LEASE_MS_MIN, PULL_LEASE_MS_MAX);
         break;
      case F_AWAIT:
         if (!iter_integer (&it, 0, PULL_MAX_AWAIT_MS, &r->await_ms))
            FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: maxAwaitTimeMS must be an integer from 0 to %d (ms)", cmd,
                  PULL_MAX_AWAIT_MS);
         break;
      case F_CONSUMER:
         if (!iter_string (&it, r->consumer, sizeof r->consumer))
            FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: consumer must be a string of at most %d bytes", cmd,
                  PULL_CONSUMER_MAX - 1);
         break;
      case F_DELAY:
         if (!iter_integer (&it, 0, CONFIG_RETRY_DELAY_MAX_MS, &r->delay_ms))
            FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: delayMs must be an integer from 0 to %lld (ms)", cmd,
                  (long long) CONFIG_RETRY_DELAY_MAX_MS);
         break;
      case F_ERROR: {
         uint32_t len;
         const char *s;
         if (!BSON_ITER_HOLDS_UTF8 (&it))
            FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: error must be a string", cmd);
         s = bson_iter_utf8 (&it, &len);
         if (len >= PULL_ERROR_TEXT_MAX)
            len = PULL_ERROR_TEXT_MAX - 1;
         /* Cut on a character boundary: the store keeps it as a string. */
         while (len > 0 && ((unsigned char) s[len] & 0xC0) == 0x80)
            len--;
         r->error_text = bson_strndup (s, len);
         break;
      }
      case F_LEASE:
         r->leases = bson_malloc0 (sizeof *r->leases);
         if (!parse_lease (&it, &r->leases[0], cmd, "lease", error))
            goto done;
         r->n_leases = 1;
         break;
      case F_LEASES: {
         bson_iter_t arr;
         uint32_t n = 0;
         if (!BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &arr))
            FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: leases must be an array of lease strings", cmd);
         while (bson_iter_next (&arr))
            n++;
         if (n == 0 || n > PULL_MAX_LEASES)
            FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: leases must hold from 1 to %d leases", cmd, PULL_MAX_LEASES);
         r->leases = bson_malloc0 (n * sizeof *r->leases);
         (void) bson_iter_recurse (&it, &arr);
         while (bson_iter_next (&arr)) {
            char what[32];
            bson_snprintf (what, sizeof what, "leases.%zu", r->n_leases);
            if (!parse_lease (&arr, &r->leases[r->n_leases], cmd, what, error))
               goto done;
            for (size_t j = 0; j < r->n_leases; j++)
               if (strcmp (r->leases[j].text, r->leases[r->n_leases].text) == 0)
                  FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: %s repeats lease '%s'", cmd, what, r->leases[j].text);
            r->n_leases++;
         }
         break;
      }
      default:
         break;
      }
   }
   if ((allowed & F_LEASE) && !(seen & F_LEASE))
      FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: lease is required (a lease relaybusClaim handed out)", cmd);
   if ((allowed & F_LEASES) && !(seen & F_LEASES))
      FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: leases is required (an array of leases relaybusClaim handed out)",
            cmd);
   if (r->op == PULL_EXTEND && !(seen & F_LEASE_MS))
      FAIL (PULL_CODE_BAD_VALUE, "relaybus: %s: leaseMs is required (from %d to %d ms)", cmd, PULL_LEASE_MS_MIN,
            PULL_LEASE_MS_MAX);
   ok = true;

done:
   if (!ok) {
      pull_req_destroy (r);
      return false;
   }
   *out = r;
   return true;
}

void
pull_req_destroy (pull_req_t *r)
{
   if (!r)
      return;
   bson_free (r->error_text);
   bson_free (r->leases);
   bson_free (r);
}
