/*
 * codec/annotate.c - find, validate and strip the publishing annotation.
 *
 * The annotation is user input arriving on the forwarding loop, so every
 * field is checked for type, length and UTF-8 validity before anything is
 * built from it, and every limit is a constant in codec/annotate.h.  The parsed
 * events point into one bson_t (`storage`: {"v": <the annotation>}) owned
 * by the annotate_t, so the client's message buffer may go away as soon as
 * annotate_parse returns.
 *
 * Not here: deciding whether the command runs in a transaction, and what is
 * written for each event (publish/inject.c).
 */
#include "codec/annotate.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/keyhash.h"

/* The event fields, in the order docs/publishing.md lists them. */
typedef enum {
   FIELD_TYPE = 0,
   FIELD_PAYLOAD,
   FIELD_KEY,
   FIELD_ID,
   FIELD_HEADERS,
   FIELD_CORRELATION_ID,
   FIELD_CAUSATION_ID,
   FIELD_NOT_BEFORE,
   FIELD_COUNT_
} event_field_t;

static const char *const field_names[FIELD_COUNT_] = {
   [FIELD_TYPE] = "type",
   [FIELD_PAYLOAD] = "payload",
   [FIELD_KEY] = "key",
   [FIELD_ID] = "id",
   [FIELD_HEADERS] = "headers",
   [FIELD_CORRELATION_ID] = "correlationId",
   [FIELD_CAUSATION_ID] = "causationId",
   [FIELD_NOT_BEFORE] = "notBefore",
};

#define FIELD_LIST "type, payload, key, id, headers, correlationId, causationId, notBefore"

/* A set of strings for the duplicate checks (header names of one event,
 * event ids of one annotation): open addressing over twice as many slots
 * as entries, so each check costs one hash and a probe or two instead of
 * a comparison with every earlier entry.  The strings are borrowed. */
#define NAME_SET_SLOTS 256 /* > 2 * max (ANNOTATE_MAX_HEADERS, ANNOTATE_MAX_EVENTS) */
typedef struct {
   const char *s[NAME_SET_SLOTS];
   size_t len[NAME_SET_SLOTS];
   uint32_t tag[NAME_SET_SLOTS];
} name_set_t;

/* Adds `s` (len bytes) with `tag`; false if it is there already, with the
 * earlier one's tag in *earlier.  The set never fills: callers add at most
 * NAME_SET_SLOTS / 2 strings. */
static bool
name_set_add (name_set_t *set, const char *s, size_t len, uint32_t tag, uint32_t *earlier)
{
   /* The names are the client's: keyed (base/keyhash.h), so that no set
    * of names probes every slot. */
   uint64_t h = keyhash (s, len);
   size_t i;

   for (i = h & (NAME_SET_SLOTS - 1); set->s[i]; i = (i + 1) & (NAME_SET_SLOTS - 1)) {
      if (set->len[i] == len && memcmp (set->s[i], s, len) == 0) {
         *earlier = set->tag[i];
         return false;
      }
   }
   set->s[i] = s;
   set->len[i] = len;
   set->tag[i] = tag;
   return true;
}

static bool
invalid (bson_error_t *error, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

/* Fills `error` with "relaybus: <message>" and returns false, so that every
 * failure reads `return invalid (error, ...)`. */
static bool
invalid (bson_error_t *error, const char *fmt, ...)
{
   char msg[sizeof error->message - 16];
   va_list ap;

   va_start (ap, fmt);
   vsnprintf (msg, sizeof msg, fmt, ap);
   va_end (ap);
   bson_set_error (error, ANNOTATE_ERROR_DOMAIN, ANNOTATE_ERR_INVALID, "relaybus: %s", msg);
   return false;
}

static bool
key_is (const bson_iter_t *it, const char *name)
{
   return strcmp (bson_iter_key (it), name) == 0;
}

static bool
string_has_prefix (const char *s, uint32_t len)
{
   size_t plen = sizeof ANNOTATE_STRING_PREFIX - 1;

   return len >= plen && memcmp (s, ANNOTATE_STRING_PREFIX, plen) == 0;
}

/* Is this `comment` element an annotation (valid or not)? */
static bool
comment_is_annotated (const bson_iter_t *comment)
{
   bson_iter_t sub;

   if (BSON_ITER_HOLDS_UTF8 (comment)) {
      uint32_t len;
      const char *s = bson_iter_utf8 (comment, &len);

      return string_has_prefix (s, len);
   }
   if (BSON_ITER_HOLDS_DOCUMENT (comment) && bson_iter_recurse (comment, &sub)) {
      while (bson_iter_next (&sub)) {
         if (key_is (&sub, "relaybus"))
            return true;
      }
   }
   return false;
}

bool
annotate_present (const bson_t *body)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, body))
      return false;
   while (bson_iter_next (&it)) {
      if (key_is (&it, "comment") && comment_is_annotated (&it))
         return true;
   }
   return false;
}

bool
annotate_msg_present (const wire_msg_t *msg)
{
   bson_iter_t it;

   if (msg->comment_offset == 0)
      return false;
   if (msg->comment_repeated) /* rare: let the general scan see them all */
      return annotate_present (&msg->body);
   if (!bson_iter_init_from_data_at_offset (&it, msg->body_data, msg->body_len, msg->comment_offset,
                                            (uint32_t) (sizeof "comment" - 1)))
      return false;
   return comment_is_annotated (&it);
}

const char *
annotate_event_id (const annotate_event_t *ev)
{
   return ev->given_id ? ev->given_id : ev->generated_id;
}

static void
annotate_init (annotate_t *a)
{
   memset (a, 0, sizeof *a);
}

void
annotate_cleanup (annotate_t *a)
{
   if (!a)
      return;
   if (a->storage)
      bson_destroy (a->storage);
   a->storage = NULL;
   bson_free (a->events);
   a->events = NULL;
   a->n_events = 0;
}

/* --- field checks ------------------------------------------------------ */

/* A string field: UTF-8 without NULs, 1..max bytes.  `what` names it. */
static bool
check_string (const bson_iter_t *it, uint32_t max, const char **out, uint32_t *out_len, const char *what, bson_error_t *error)
{
   const char *s;
   uint32_t len;

   if (!BSON_ITER_HOLDS_UTF8 (it))
      return invalid (error, "%s must be a non-empty string", what);
   s = bson_iter_utf8 (it, &len);
   if (len == 0)
      return invalid (error, "%s must be a non-empty string", what);
   if (len > max)
      return invalid (error, "%s is %u bytes long; at most %u", what, len, max);
   if (!bson_utf8_validate (s, len, false))
      return invalid (error, "%s is not valid UTF-8 (or contains a NUL character)", what);
   *out = s;
   if (out_len)
      *out_len = len;
   return true;
}

/* A field that becomes a message header (type, key and id: ce-type,
 * ce-subject, ce-id, relaybus-type, relaybus-key, relaybus-event-id, and
 * the same in NATS, Kafka and AMQP): no ASCII control character, above
 * all no CR or LF, which would end the header and start one the
 * publisher chose.  `what` names the field. */
static bool
check_no_control (const char *s, uint32_t len, const char *what, bson_error_t *error)
{
   for (uint32_t i = 0; i < len; i++) {
      unsigned char c = (unsigned char) s[i];
      if (c < 0x20 || c == 0x7f)
         return invalid (error, "%s holds a control character (0x%02x at byte %u); it becomes a message header, "
                         "where a line break would start another", what, c, i);
   }
   return true;
}

/* UTF-8 validity of any value: strings anywhere inside it, and the keys of
 * embedded documents.  NULs inside payload strings are legal BSON.  One walk
 * (bson_validate per level would rescan nested documents once per level);
 * `depth` is bounded by the wire codec's and the JSON reader's own limits,
 * and checked again here. */
#define UTF8_WALK_MAX_DEPTH 256

static bool
walk_utf8 (const bson_iter_t *it, int depth)
{
   const char *s;
   uint32_t len;
   const uint8_t *data;
   bson_iter_t child;

   switch (bson_iter_type (it)) {
   case BSON_TYPE_UTF8:
      s = bson_iter_utf8 (it, &len);
      return bson_utf8_validate (s, len, true);
   case BSON_TYPE_CODE:
      s = bson_iter_code (it, &len);
      return bson_utf8_validate (s, len, true);
   case BSON_TYPE_SYMBOL:
      s = bson_iter_symbol (it, &len);
      return bson_utf8_validate (s, len, true);
   case BSON_TYPE_REGEX: {
      const char *options;

      s = bson_iter_regex (it, &options);
      return bson_utf8_validate (s, strlen (s), false) && bson_utf8_validate (options, strlen (options), false);
   }
   case BSON_TYPE_DBPOINTER:
      bson_iter_dbpointer (it, &len, &s, NULL);
      return bson_utf8_validate (s, len, true);
   case BSON_TYPE_CODEWSCOPE: {
      uint32_t scope_len;
      bson_t scope;

      s = bson_iter_codewscope (it, &len, &scope_len, &data);
      if (!bson_utf8_validate (s, len, true))
         return false;
      if (!bson_init_static (&scope, data, scope_len) || !bson_iter_init (&child, &scope))
         return false;
      break;
   }
   case BSON_TYPE_DOCUMENT:
   case BSON_TYPE_ARRAY:
      if (!bson_iter_recurse (it, &child))
         return false;
      break;
   default:
      return true;
   }
   if (depth >= UTF8_WALK_MAX_DEPTH)
      return false;
   while (bson_iter_next (&child)) {
      if (!bson_utf8_validate (bson_iter_key (&child), bson_iter_key_len (&child), false))
         return false;
      if (!walk_utf8 (&child, depth + 1))
         return false;
   }
   return true;
}

/* W3C Trace Context: the traceparent's hex fields, lower case. */
static bool
lower_hex (const char *s, size_t n, bool *all_zero)
{
   *all_zero = true;
   for (size_t i = 0; i < n; i++) {
      if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
         return false;
      if (s[i] != '0')
         *all_zero = false;
   }
   return true;
}

/* A traceparent as W3C Trace Context writes it: version "-" trace-id
 * "-" parent-id "-" flags, 2, 32, 16 and 2 lower-case hex digits, the ids
 * not all zero, version ff invalid; version 00 is exactly 55 characters,
 * a later version may add "-" and fields after them.  Every handler sends
 * it on as the protocol's header, so a malformed one is refused here
 * rather than passed to the receivers.  NULL when valid, else why. */
static const char *
traceparent_problem (const char *v, size_t len)
{
   bool zero;

   if (len < 55)
      return "is shorter than the 55 characters of 00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>";
   if (v[2] != '-' || v[35] != '-' || v[52] != '-')
      return "is not 00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>";
   if (!lower_hex (v, 2, &zero) || !strncmp (v, "ff", 2))
      return "has a version that is not 2 lower-case hex digits other than ff";
   if (!strncmp (v, "00", 2) && len != 55)
      return "is version 00 and longer than 55 characters";
   if (len > 55 && v[55] != '-')
      return "is not 00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>";
   if (!lower_hex (v + 3, 32, &zero))
      return "has a trace-id that is not 32 lower-case hex digits";
   if (zero)
      return "has an all-zero trace-id";
   if (!lower_hex (v + 36, 16, &zero))
      return "has a parent-id that is not 16 lower-case hex digits";
   if (zero)
      return "has an all-zero parent-id";
   if (!lower_hex (v + 53, 2, &zero))
      return "has trace-flags that are not 2 lower-case hex digits";
   return NULL;
}

/* tracestate: at most 512 characters of printable ASCII (what every
 * vendor must pass on) in at most 32 comma-separated members. */
static const char *
tracestate_problem (const char *v, size_t len)
{
   size_t members = 1;

   if (len > 512)
      return "is longer than 512 characters";
   for (size_t i = 0; i < len; i++) {
      if (v[i] < 0x20 || v[i] > 0x7e)
         return "holds a character that is not printable ASCII";
      members += v[i] == ',';
   }
   if (members > 32)
      return "has more than 32 list members";
   return NULL;
}

static bool
check_headers (const bson_iter_t *it, uint32_t idx, annotate_event_t *ev, bson_error_t *error)
{
   bson_iter_t h;
   uint32_t n = 0, earlier;
   name_set_t names;
   bool has_parent = false, has_state = false;

   if (!BSON_ITER_HOLDS_DOCUMENT (it) || !bson_iter_recurse (it, &h))
      return invalid (error, "events[%u].headers must be a document of strings", idx);
   memset (&names, 0, sizeof names);
   while (bson_iter_next (&h)) {
      const char *name = bson_iter_key (&h);
      size_t name_len = bson_iter_key_len (&h);
      char what[96];
      const char *value;

      if (++n > ANNOTATE_MAX_HEADERS)
         return invalid (error, "events[%u].headers has more than %d entries", idx, ANNOTATE_MAX_HEADERS);
      if (name_len == 0 || name_len > ANNOTATE_MAX_HEADER_NAME_LEN || !bson_utf8_validate (name, name_len, false))
         return invalid (error,
                         "events[%u].headers: header names must be 1 to %d bytes of UTF-8",
                         idx,
                         ANNOTATE_MAX_HEADER_NAME_LEN);
      snprintf (what, sizeof what, "events[%u].headers.%.48s", idx, name);
      if (!check_string (&h, ANNOTATE_MAX_HEADER_VALUE_LEN, &value, NULL, what, error))
         return false;
      if (!strcasecmp (name, "traceparent") || !strcasecmp (name, "tracestate")) {
         bool parent = !strcasecmp (name, "traceparent");
         const char *why = parent ? traceparent_problem (value, strlen (value)) : tracestate_problem (value, strlen (value));
         if (why)
            return invalid (error, "events[%u].headers.%s %s (W3C Trace Context)", idx, name, why);
         if (parent)
            has_parent = true;
         else
            has_state = true;
      }
      /* Duplicate names would make the stored headers ambiguous. */
      if (!name_set_add (&names, name, name_len, n, &earlier))
         return invalid (error, "events[%u].headers.%.48s is given twice", idx, name);
   }
   if (has_state && !has_parent)
      return invalid (error, "events[%u].headers.tracestate without a traceparent (W3C Trace Context)", idx);
   if (n > 0) {
      ev->has_headers = true;
      ev->headers = *it;
   }
   return true;
}

/* Parses one event document (positioned by `it`) into `ev`. */
static bool
parse_event (const bson_iter_t *it, uint32_t idx, annotate_event_t *ev, bson_error_t *error)
{
   bson_iter_t f;
   bool seen[FIELD_COUNT_] = {false};
   char what[48];

   if (!BSON_ITER_HOLDS_DOCUMENT (it) || !bson_iter_recurse (it, &f))
      return invalid (error, "events[%u] must be a document", idx);
   memset (ev, 0, sizeof *ev);

   while (bson_iter_next (&f)) {
      const char *name = bson_iter_key (&f);
      int field = -1;

      for (int i = 0; i < FIELD_COUNT_; i++) {
         if (strcmp (name, field_names[i]) == 0) {
            field = i;
            break;
         }
      }
      if (field < 0) {
         if (!bson_utf8_validate (name, strlen (name), false))
            return invalid (error, "events[%u] has a field name that is not valid UTF-8", idx);
         return invalid (error, "events[%u].%.64s is not an event field (" FIELD_LIST ")", idx, name);
      }
      if (seen[field])
         return invalid (error, "events[%u].%s is given twice", idx, name);
      seen[field] = true;
      snprintf (what, sizeof what, "events[%u].%s", idx, name);

      /* null means absent for every optional field: drivers and ODMs
       * serialise unset properties either way. */
      if (field != FIELD_TYPE && field != FIELD_PAYLOAD && BSON_ITER_HOLDS_NULL (&f))
         continue;

      switch ((event_field_t) field) {
      case FIELD_TYPE:
         if (!check_string (&f, ANNOTATE_MAX_TYPE_LEN, &ev->type, &ev->type_len, what, error) ||
             !check_no_control (ev->type, ev->type_len, what, error))
            return false;
         break;
      case FIELD_PAYLOAD:
         if (!walk_utf8 (&f, 0))
            return invalid (error, "%s contains a string or field name that is not valid UTF-8", what);
         ev->has_payload = true;
         ev->payload = f;
         break;
      case FIELD_KEY:
         if (!check_string (&f, ANNOTATE_MAX_KEY_LEN, &ev->key, &ev->key_len, what, error) ||
             !check_no_control (ev->key, ev->key_len, what, error))
            return false;
         break;
      case FIELD_ID:
         if (!check_string (&f, ANNOTATE_MAX_ID_LEN, &ev->given_id, NULL, what, error) ||
             !check_no_control (ev->given_id, (uint32_t) strlen (ev->given_id), what, error))
            return false;
         break;
      case FIELD_HEADERS:
         if (!check_headers (&f, idx, ev, error))
            return false;
         break;
      case FIELD_CORRELATION_ID:
         if (!check_string (&f, ANNOTATE_MAX_REF_LEN, &ev->correlation_id, NULL, what, error))
            return false;
         break;
      case FIELD_CAUSATION_ID:
         if (!check_string (&f, ANNOTATE_MAX_REF_LEN, &ev->causation_id, NULL, what, error))
            return false;
         break;
      case FIELD_NOT_BEFORE:
         if (!BSON_ITER_HOLDS_DATE_TIME (&f))
            return invalid (error, "%s must be a date", what);
         ev->has_not_before = true;
         ev->not_before_ms = bson_iter_date_time (&f);
         break;
      case FIELD_COUNT_:
         break;
      }
   }
   if (!ev->type)
      return invalid (error, "events[%u].type must be a non-empty string", idx);
   return true;
}

/* Parses the annotation value at `it` (a document or an array of
 * documents, already copied into a->storage) into a->events. */
static bool
parse_events_value (const bson_iter_t *it, annotate_t *a, bson_error_t *error)
{
   uint32_t len;
   const uint8_t *data;

   /* Events hold bson_iter_t, which libbson declares 128-byte aligned:
    * plain malloc alignment would be undefined behaviour. */
   if (BSON_ITER_HOLDS_DOCUMENT (it)) {
      bson_iter_document (it, &len, &data);
      if (len > ANNOTATE_MAX_BYTES)
         return invalid (error, "the annotation is %u bytes; at most %d", len, ANNOTATE_MAX_BYTES);
      a->events = bson_aligned_alloc0 (BSON_ALIGNOF (annotate_event_t), sizeof *a->events);
      if (!parse_event (it, 0, &a->events[0], error))
         return false;
      a->n_events = 1;
   } else if (BSON_ITER_HOLDS_ARRAY (it)) {
      bson_iter_t elem;
      uint32_t n = 0;

      bson_iter_array (it, &len, &data);
      if (len > ANNOTATE_MAX_BYTES)
         return invalid (error, "the annotation is %u bytes; at most %d", len, ANNOTATE_MAX_BYTES);
      /* Counted first, so the events take only the room they need. */
      if (!bson_iter_recurse (it, &elem))
         return invalid (error, "the annotation is not a valid array");
      while (bson_iter_next (&elem)) {
         if (++n > ANNOTATE_MAX_EVENTS)
            return invalid (error, "at most %d events per annotation", ANNOTATE_MAX_EVENTS);
      }
      if (n == 0)
         return invalid (error, "the annotation has no events (an empty array)");
      a->events = bson_aligned_alloc0 (BSON_ALIGNOF (annotate_event_t), n * sizeof *a->events);
      if (!bson_iter_recurse (it, &elem))
         return invalid (error, "the annotation is not a valid array");
      while (a->n_events < n && bson_iter_next (&elem)) {
         if (!parse_event (&elem, a->n_events, &a->events[a->n_events], error))
            return false;
         a->n_events++;
      }
   } else {
      return invalid (error, "the annotation must be a document (one event) or an array of documents");
   }

   /* Two events with one id in one statement would be one event with two
    * sets of deliveries: refuse rather than guess. */
   if (a->n_events > 1) {
      name_set_t ids;
      uint32_t j;

      memset (&ids, 0, sizeof ids);
      for (uint32_t i = 0; i < a->n_events; i++) {
         const char *id = a->events[i].given_id;
         if (id && !name_set_add (&ids, id, strlen (id), i, &j))
            return invalid (error, "events[%u].id repeats events[%u].id", i, j);
      }
   }
   for (uint32_t i = 0; i < a->n_events; i++) {
      if (!a->events[i].given_id) {
         bson_oid_t oid;

         bson_oid_init (&oid, NULL);
         bson_oid_to_string (&oid, a->events[i].generated_id);
      }
   }
   return true;
}

/* Copies the value at `value` into fresh storage as {"v": value} and parses
 * it from there. */
static bool
parse_from_value (const bson_iter_t *value, annotate_t *a, bson_error_t *error)
{
   bson_iter_t it;

   a->storage = bson_new ();
   if (!bson_append_iter (a->storage, "v", 1, value))
      return invalid (error, "the annotation is too large");
   if (!bson_iter_init_find (&it, a->storage, "v"))
      return invalid (error, "the annotation could not be read back");
   return parse_events_value (&it, a, error);
}

bool
annotate_parse_events (const bson_iter_t *value, annotate_t *out, bson_error_t *error)
{
   annotate_init (out);
   if (!parse_from_value (value, out, error)) {
      annotate_cleanup (out);
      return false;
   }
   return true;
}

/* The string form: "relaybus:" + white space + Extended JSON of a document
 * or an array.  libbson reads a top-level array as a document with keys
 * "0", "1", ...; the first character tells which one was meant, and a second
 * read must find the end of the text (libbson would otherwise ignore a
 * second document). */
static bool
parse_from_string (const char *s, uint32_t len, annotate_t *a, bson_error_t *error)
{
   size_t plen = sizeof ANNOTATE_STRING_PREFIX - 1;
   bson_json_reader_t *reader = NULL;
   bson_t parsed = BSON_INITIALIZER, extra = BSON_INITIALIZER;
   bson_error_t jerr;
   bool ok = false, is_array;
   int rc;
   bson_iter_t it;

   s += plen;
   len -= (uint32_t) plen;
   while (len > 0 && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) {
      s++;
      len--;
   }
   if (len > ANNOTATE_MAX_BYTES) {
      invalid (error, "the string annotation is %u bytes; at most %d", len, ANNOTATE_MAX_BYTES);
      goto done;
   }
   if (len == 0 || (*s != '{' && *s != '[')) {
      invalid (error,
               "a string comment starting with \"" ANNOTATE_STRING_PREFIX "\" must continue with Extended JSON "
               "of an event document or an array of event documents");
      goto done;
   }
   if (!bson_utf8_validate (s, len, false)) {
      invalid (error, "the string annotation is not valid UTF-8");
      goto done;
   }
   is_array = *s == '[';
   reader = bson_json_data_reader_new (false, 0);
   bson_json_data_reader_ingest (reader, (const uint8_t *) s, len);
   rc = bson_json_reader_read (reader, &parsed, &jerr);
   if (rc != 1) {
      invalid (error, "the string annotation is not valid Extended JSON: %.200s", rc < 0 ? jerr.message : "empty");
      goto done;
   }
   rc = bson_json_reader_read (reader, &extra, &jerr);
   if (rc != 0) {
      invalid (error, "the string annotation has text after its JSON value");
      goto done;
   }
   if (parsed.len > ANNOTATE_MAX_BYTES) {
      invalid (error, "the annotation is %u bytes; at most %d", parsed.len, ANNOTATE_MAX_BYTES);
      goto done;
   }
   a->storage = bson_new ();
   if (!(is_array ? bson_append_array (a->storage, "v", 1, &parsed) : bson_append_document (a->storage, "v", 1, &parsed))) {
      invalid (error, "the annotation is too large");
      goto done;
   }
   if (!bson_iter_init_find (&it, a->storage, "v")) {
      invalid (error, "the annotation could not be read back");
      goto done;
   }
   a->from_string = true;
   ok = parse_events_value (&it, a, error);
done:
   bson_destroy (&parsed);
   bson_destroy (&extra);
   if (reader)
      bson_json_reader_destroy (reader);
   return ok;
}

/* Appends to `forward` the comment without its relaybus part, or nothing
 * when nothing else is left. */
static bool
append_stripped_comment (bson_t *forward, const bson_iter_t *comment)
{
   bson_t rest;
   bson_iter_t sub;
   bool ok = true;

   if (!BSON_ITER_HOLDS_DOCUMENT (comment))
      return true; /* the string form is all annotation */
   bson_init (&rest);
   if (!bson_iter_recurse (comment, &sub)) {
      bson_destroy (&rest);
      return false;
   }
   while (ok && bson_iter_next (&sub)) {
      if (!key_is (&sub, "relaybus"))
         ok = bson_append_iter (&rest, NULL, 0, &sub);
   }
   if (ok && !bson_empty (&rest))
      ok = bson_append_document (forward, "comment", 7, &rest);
   bson_destroy (&rest);
   return ok;
}

bool
annotate_strip (const bson_t *body, bson_t *forward)
{
   bson_iter_t it;

   bson_init (forward);
   if (!bson_iter_init (&it, body))
      return false;
   while (bson_iter_next (&it)) {
      bool ok;

      if (key_is (&it, "comment") && comment_is_annotated (&it))
         ok = append_stripped_comment (forward, &it);
      else
         ok = bson_append_iter (forward, NULL, 0, &it);
      if (!ok)
         return false;
   }
   return true;
}

annotate_status_t
annotate_parse (const bson_t *body, annotate_t *out, bson_t *forward, bson_error_t *error)
{
   bson_iter_t it, comment, sub, value;
   unsigned n_comments = 0, n_relaybus = 0;
   bool annotated = false;

   annotate_init (out);
   bson_init (forward);

   if (!bson_iter_init (&it, body))
      return ANNOTATE_ABSENT;
   while (bson_iter_next (&it)) {
      if (!key_is (&it, "comment"))
         continue;
      n_comments++;
      if (comment_is_annotated (&it)) {
         annotated = true;
         comment = it;
      }
   }
   if (!annotated)
      return ANNOTATE_ABSENT;
   if (n_comments > 1) {
      invalid (error, "the command has more than one comment field");
      goto fail;
   }

   if (BSON_ITER_HOLDS_UTF8 (&comment)) {
      uint32_t len;
      const char *s = bson_iter_utf8 (&comment, &len);

      if (!parse_from_string (s, len, out, error))
         goto fail;
   } else {
      if (!bson_iter_recurse (&comment, &sub))
         goto fail_doc;
      while (bson_iter_next (&sub)) {
         if (key_is (&sub, "relaybus")) {
            n_relaybus++;
            value = sub;
         }
      }
      if (n_relaybus != 1) {
         invalid (error, "comment.relaybus is given twice");
         goto fail;
      }
      if (!BSON_ITER_HOLDS_DOCUMENT (&value) && !BSON_ITER_HOLDS_ARRAY (&value)) {
         invalid (error, "comment.relaybus must be a document (one event) or an array of documents");
         goto fail;
      }
      if (!parse_from_value (&value, out, error))
         goto fail;
   }

   /* The forwarded body: every field in its place, the comment stripped. */
   if (!bson_iter_init (&it, body))
      goto fail_doc;
   while (bson_iter_next (&it)) {
      bool ok = key_is (&it, "comment") ? append_stripped_comment (forward, &it)
                                        : bson_append_iter (forward, NULL, 0, &it);
      if (!ok)
         goto fail_doc;
   }
   return ANNOTATE_FOUND;

fail_doc:
   invalid (error, "the command body could not be rewritten");
fail:
   annotate_cleanup (out);
   bson_reinit (forward);
   return ANNOTATE_INVALID;
}
