/*
 * proxy/pump.c - what flows through a client connection: framing both
 * ways, the two in-flight FIFOs, forwarding, reply matching, hellos, the
 * proxy's own answers and internal requests.  The connection's lifecycle
 * (states, flow, callbacks, closing) is proxy/conn.c; the FIFOs' shape is in
 * proxy/conn_private.h.
 *
 * Data path.  A request is handled only once it is complete in the client's
 * input buffer.  It is made contiguous once (evbuffer_pullup) to be parsed
 * and inspected; if the proxy forwards it unchanged, its requestID is
 * replaced in place in the input buffer and the whole message moved to the
 * upstream's output with evbuffer_remove_buffer (chain moves, no copy).
 * Replies go the other way the same way with responseTo mapped back.  Only
 * hellos, checksummed messages and proxy answers are re-encoded.  The
 * parser's validation pass also yields the command name and where a
 * top-level `comment` is, so routing reads no body twice.
 *
 * Decoding.  A request of CLIENT_OFFLOAD_MIN bytes or more (decompressed)
 * is decompressed and validated by the loop's decoding thread ("offload",
 * proxy/decode.c), so the loop never spends long on one message; the
 * connection waits for it, the others go on.  Smaller ones are decoded on
 * the loop.  Compressed requests must use a compressor the connection
 * negotiated.
 *
 * Compression.  The upstream is never asked to compress (codec/handshake.c strips
 * `compression` from the hello it forwards), so everything upstream is
 * plain; the client's compressed requests are decompressed here and its
 * replies compressed with the request's compressor, as mongod does.
 */
#include "proxy/conn.h"

#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "autoconf.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/instance.h"
#include "base/log.h"
#include "base/loopwake.h"
#include "base/servercodes.h"
#include "codec/compress.h"
#include "codec/handshake.h"
#include "proxy/conn_private.h"
#include "proxy/decode.h"
#include "proxy/login.h"
#include "proxy/owners.h"
#include "proxy/pool.h"
#include "proxy/route.h"
#include "proxy/side.h"

/* Replies larger than this are not scanned for "not primary" errors: such
 * errors are small documents, and scanning a big cursor batch would cost a
 * pullup copy for nothing. */
#define CLIENT_SCAN_LIMIT (64 * 1024)

/* ------------------------------------------------------------ helpers */

static int32_t
client_next_id (client_conn_t *c)
{
   /* Positive and never 0: some drivers treat responseTo 0 as "none". */
   if (c->next_id <= 0 || c->next_id == INT32_MAX)
      c->next_id = 1;
   return c->next_id++;
}

/* Header ids are any int32 (pymongo's are random, often negative), so
 * "leave it as it is" needs a value outside that range. */
#define KEEP_ID INT64_MIN

/* Moves one complete message of `len` bytes from `src` to `dst`, replacing
 * its requestID and/or responseTo (KEEP_ID: keep).  The ids are patched in
 * place in `src`'s first chain (evbuffer_pullup of the header costs nothing
 * when the header is contiguous, as it nearly always is), then the whole
 * message moves as evbuffer chains: a message read in one piece is never
 * copied.  Every chain the proxy moves is its own (socket reads, and
 * buffers it built with evbuffer_reserve_space), never a read-only
 * reference, so writing into it is allowed. */
static bool
move_message (struct evbuffer *src, struct evbuffer *dst, size_t len, int64_t request_id, int64_t response_to)
{
   if (request_id != KEEP_ID || response_to != KEEP_ID) {
      uint8_t *hdr = evbuffer_pullup (src, WIRE_HEADER_LEN);

      if (!hdr)
         return false;
      if (request_id != KEEP_ID)
         (void) wire_put_i32 (hdr + 4, (int32_t) request_id);
      if (response_to != KEEP_ID)
         (void) wire_put_i32 (hdr + 8, (int32_t) response_to);
   }
   return evbuffer_remove_buffer (src, dst, len) == (int) len;
}

/* ------------------------------------------------------------ FIFOs */

/* `now_us` (clock_mono_us) is when the request is taken: its caller reads
 * the clock once for the request and, when it goes upstream at once, for
 * its upstream_req_t too (the two instants are the same few instructions
 * apart; a clock read is not free on the request path). */
static client_req_t *
creq_push (client_conn_t *c, int32_t client_id, int32_t family, int compressor, int64_t now_us)
{
   client_req_t *r;

   if (creq_count (c) >= CLIENT_MAX_INFLIGHT)
      return NULL;
   r = &client_flight_take (c)->creqs[c->creq_tail % CLIENT_MAX_INFLIGHT];
   /* A slot is reused only once its request is answered and passed. */
   RELAYBUS_ASSERT (!r->held || r->seq < c->creq_head);
   memset (r, 0, sizeof *r);
   r->seq = c->creq_tail++;
   r->read_us = now_us;
   r->client_id = client_id;
   r->family = family;
   r->compressor = compressor;
   return r;
}

/* `sent_us`: see creq_push; 0 for UPREQ_INTERNAL, whose reply answers no
 * client request and is not timed. */
static upstream_req_t *
upreq_push (client_conn_t *c, upreq_kind_t kind, int32_t upstream_id, int64_t sent_us)
{
   upstream_req_t *u;

   if (c->up_count >= CLIENT_MAX_UPSTREAM_INFLIGHT)
      return NULL;
   u = &client_flight_take (c)->upreqs[(c->up_head + c->up_count) % CLIENT_MAX_UPSTREAM_INFLIGHT];
   memset (u, 0, sizeof *u);
   u->kind = kind;
   u->upstream_id = upstream_id;
   u->expect_response_to = upstream_id;
   u->sent_us = sent_us;
   c->up_count++;
   RELAYBUS_ASSERT (c->up_count <= CLIENT_MAX_UPSTREAM_INFLIGHT);
   return u;
}

/* ------------------------------------------------------------ answers */

/* Puts one complete message (`len` bytes at the front of `src`) where the
 * answer to `r` belongs: the client's output if `r` is the oldest waiting
 * request, else `r`'s held buffer.  Compresses when the request was
 * compressed.  `response_to` other than KEEP_ID replaces the header's responseTo.
 * With `final`, `r` is complete and the FIFO advances. */
static bool
client_deliver (client_conn_t *c,
                client_req_t *r,
                struct evbuffer *src,
                size_t len,
                int64_t response_to,
                bool final,
                bson_error_t *error)
{
   struct evbuffer *dst;
   struct evbuffer *z = NULL;
   bool ok = false;

   RELAYBUS_ASSERT (r->seq >= c->creq_head && r->seq < c->creq_tail && !r->done);
   if (r->seq == c->creq_head && !r->held) {
      dst = client_output (c);
   } else {
      if (!r->held) {
         r->held = evbuffer_new ();
         if (!r->held) {
            bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory holding an answer");
            return false;
         }
         client_mem_watch (c, r->held);
      }
      dst = r->held;
   }
   if (r->compressor > 0) {
      const uint8_t *msg = evbuffer_pullup (src, (ssize_t) len);
      z = evbuffer_new ();
      if (!msg || !z || !wire_compress (msg, len, (uint8_t) r->compressor, (int) (r->compressor == COMPRESS_ZSTD ? c->cfg->zstd_level : c->cfg->zlib_level), z, error))
         goto done;
      evbuffer_drain (src, len);
      src = z;
      len = evbuffer_get_length (z);
   }
   if (!move_message (src, dst, len, KEEP_ID, response_to)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory moving a reply");
      goto done;
   }
   counters_add (COUNTER_BYTES_TO_CLIENTS, len);
   if (final) {
      int64_t now = clock_mono_us ();

      r->done = true;
      /* Advance past every completed request, releasing held answers in
       * order; a request that became oldest while still streaming gets its
       * held part flushed so its next replies can go straight out.  An
       * answer leaves for the client here: what the proxy added to it ends
       * now. */
      while (c->creq_head < c->creq_tail) {
         client_req_t *h = creq_find (c, c->creq_head);
         if (h->held) {
            evbuffer_add_buffer (client_output (c), h->held);
            evbuffer_free (h->held);
            h->held = NULL;
         }
         if (!h->done)
            break;
         counters_observe_loop_us (COUNTER_ADDED_LATENCY, c->loop->index, now - h->read_us - h->upstream_us);
         c->creq_head++;
      }
   }
   ok = true;
done:
   if (z)
      evbuffer_free (z);
   return ok;
}

bool
client_hold_request (client_conn_t *c,
                     int32_t client_request_id,
                     int32_t family,
                     int compressor,
                     uint64_t *request_seq,
                     bson_error_t *error)
{
   client_req_t *r = creq_push (c, client_request_id, family, compressor, clock_mono_us ());

   if (!r) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_INFLIGHT_FULL, "too many requests in flight");
      return false;
   }
   *request_seq = r->seq;
   return true;
}

/* What the relay looks for in a reply (kind-0 body): a not-primary-class
 * error, and a top-level `topologyVersion` on an error or beside a
 * writeConcernError, which the mongos persona must not show (see
 * copy_without_topology_version). */
typedef struct {
   bool not_primary;
   bool topology_version;
} reply_scan_t;

/* Scans the top level of a reply body.  Keys are compared by length first
 * (bson_iter_key_len is cheap): this runs on every small reply, and most
 * keys are none of these.  Values are skipped by their length. */
static void
reply_scan_body (const bson_t *body, reply_scan_t *out)
{
   bson_iter_t it;
   bool failed = false, not_primary = false, wce = false, ok_seen = false;

   out->not_primary = out->topology_version = false;
   if (!bson_iter_init (&it, body))
      return;
   while (bson_iter_next (&it)) {
      const char *key = bson_iter_key (&it);
      uint32_t klen = bson_iter_key_len (&it);
      if (klen == 2 && memcmp (key, "ok", 2) == 0) {
         failed = bson_iter_as_double (&it) == 0.0;
         ok_seen = true;
      } else if (klen == 4 && memcmp (key, "code", 4) == 0 && BSON_ITER_HOLDS_NUMBER (&it)) {
         not_primary |= server_code_is_not_primary ((int32_t) bson_iter_as_int64 (&it));
      } else if (klen == 6 && memcmp (key, "errmsg", 6) == 0 && BSON_ITER_HOLDS_UTF8 (&it)) {
         const char *m = bson_iter_utf8 (&it, NULL);
         not_primary |= strstr (m, "not master") != NULL || strstr (m, "not primary") != NULL;
      } else if (klen == 17 && memcmp (key, "writeConcernError", 17) == 0) {
         wce = true;
      } else if (klen == 15 && memcmp (key, "topologyVersion", 15) == 0) {
         out->topology_version = true;
      }
   }
   out->not_primary = ok_seen && failed && not_primary;
   if (!(ok_seen && (failed || wce)))
      out->topology_version = false;
}

/* Scans a small OP_MSG reply (header, flags, kind byte 0, document) with
 * reply_scan_body.  Bounds come from the buffer; nothing is trusted. */
static void
reply_scan (const uint8_t *buf, size_t len, reply_scan_t *out)
{
   bson_t body;
   uint32_t doc_len;

   out->not_primary = out->topology_version = false;
   if (len < WIRE_HEADER_LEN + 4 + 1 + 5 || buf[WIRE_HEADER_LEN + 4] != 0)
      return;
   doc_len = wire_get_u32 (buf + WIRE_HEADER_LEN + 5);
   if (doc_len < 5 || doc_len > len - (WIRE_HEADER_LEN + 5) || !bson_init_static (&body, buf + WIRE_HEADER_LEN + 5, doc_len))
      return;
   reply_scan_body (&body, out);
}

/* `src` without its top-level topologyVersion, into `dst` (initialized).
 * A member's not-primary or shutdown error carries its topologyVersion; a
 * driver takes it as the proxy's and then asks the proxy for a streaming
 * hello, which the mongos persona does not serve (codec/handshake.c): the
 * driver's monitor then fails (the Node.js driver's "Server ended
 * moreToCome unexpectedly") and clears its pool.  Everything else is kept as it is. */
static bool
copy_without_topology_version (const bson_t *src, bson_t *dst, bson_error_t *error)
{
   bson_iter_t it;

   if (!bson_iter_init (&it, src)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REPLY, "reply body is not a valid document");
      return false;
   }
   while (bson_iter_next (&it))
      if (strcmp (bson_iter_key (&it), "topologyVersion") != 0 && !bson_append_iter (dst, NULL, 0, &it)) {
         bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_REPLY_TOO_LARGE, "reply too large");
         return false;
      }
   return true;
}

bool
client_answer (client_conn_t *c, uint64_t request_seq, const bson_t *reply, bson_error_t *error)
{
   client_req_t *r = creq_find (c, request_seq);
   reply_scan_t scan;
   bson_t stripped = BSON_INITIALIZER;
   bool ok = false;

   /* A closed connection has none: client_disconnect passed them all. */
   if (!r || r->done) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_SUCH_REQUEST, "no such request waiting for an answer");
      goto done;
   }
   /* An answer built from a server's reply (a publishing statement's, an
    * injected commit's) hides the member's topologyVersion as the relay
    * does. */
   reply_scan_body (reply, &scan);
   if (scan.topology_version) {
      if (!copy_without_topology_version (reply, &stripped, error))
         goto done;
      reply = &stripped;
   }
   if (!client_tmp (c, error))
      goto done;
   if (r->family == WIRE_OP_QUERY)
      ok = wire_append_reply (c->tmp, client_next_id (c), r->client_id, 8 /* AwaitCapable */, reply);
   else
      ok = wire_append_msg (c->tmp, client_next_id (c), r->client_id, 0, reply, NULL, 0);
   if (!ok) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_ANSWER_TOO_LARGE, "answer too large");
      goto done;
   }
   ok = client_deliver (c, r, c->tmp, evbuffer_get_length (c->tmp), KEEP_ID, true, error);
   if (ok) {
      client_output_queued (c);
      (void) client_check_drained (c);
   }
done:
   bson_destroy (&stripped);
   return ok;
}

bool
client_answer_error (client_conn_t *c,
                     uint64_t request_seq,
                     int32_t code,
                     const char *code_name,
                     const char *errmsg,
                     bson_error_t *error)
{
   bson_t doc = BSON_INITIALIZER;
   bool ok;

   BSON_APPEND_DOUBLE (&doc, "ok", 0.0);
   BSON_APPEND_UTF8 (&doc, "errmsg", errmsg);
   BSON_APPEND_INT32 (&doc, "code", code);
   BSON_APPEND_UTF8 (&doc, "codeName", code_name);
   ok = client_answer (c, request_seq, &doc, error);
   bson_destroy (&doc);
   return ok;
}

/* ------------------------------------------------------------ internal */

bool
client_send_internal (client_conn_t *c,
                      const bson_t *body,
                      const wire_sequence_t *sequences,
                      uint32_t nsequences,
                      client_internal_cb_t cb,
                      void *ctx,
                      bson_error_t *error)
{
   upstream_req_t *u;
   int32_t id;
   size_t before;

   /* A closed connection's upstream side is closed (or given back). */
   if (!client_up_connected (c)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NOT_CONNECTED, "upstream not connected");
      return false;
   }
   if (c->up_count >= CLIENT_MAX_UPSTREAM_INFLIGHT) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_INFLIGHT_FULL, "too many requests in flight");
      return false;
   }
   id = client_next_id (c);
   before = evbuffer_get_length (upstream_output (c));
   if (!wire_append_msg (upstream_output (c), id, 0, 0, body, sequences, nsequences)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_INTERNAL_TOO_LARGE, "request too large");
      return false;
   }
   u = upreq_push (c, UPREQ_INTERNAL, id, 0);
   u->cb = cb;
   u->cb_ctx = ctx;
   counters_add (COUNTER_INTERNAL_REQUESTS, 1);
   counters_add (COUNTER_BYTES_TO_UPSTREAM, evbuffer_get_length (upstream_output (c)) - before);
   client_output_queued (c);
   return true;
}

/* ------------------------------------------------------------ requests */

/* Session mode: who the client authenticates as is the server's to decide;
 * the proxy reads the conversation it relays (codec/sasl.h) so that a pull
 * handler's `consumers` list can name users (client_user).  Only the SASL
 * commands and their replies are read. */
static sasl_watch_t *
auth_watch (client_conn_t *c)
{
   if (!c->sasl)
      c->sasl = bson_malloc0 (sizeof *c->sasl);
   return c->sasl;
}

/* A SASL command of the client is relayed: whether its reply is a verdict
 * to read.  One sent without waiting for a reply (moreToCome) could change
 * the server's conversation unseen: the watch is lost for good. */
static bool
auth_watch_request (client_conn_t *c, const wire_msg_t *msg, const char *cmd, bool more)
{
   sasl_watch_t *w = auth_watch (c);
   bson_iter_t it;
   const char *db = NULL;
   sasl_watch_state_t was = w->state;
   bool track;

   if (more) {
      sasl_watch_lose (w);
      log_conn (LOG_LEVEL_INFO, c->id, c->peer, "%s sent with moreToCome: its user is not recorded", cmd);
      return false;
   }
   if (bson_iter_init_find (&it, &msg->body, "$db") && BSON_ITER_HOLDS_UTF8 (&it))
      db = bson_iter_utf8 (&it, NULL);
   track = sasl_watch_request (w, cmd, &msg->body, db);
   if (w->state == SASL_WATCH_LOST && was != SASL_WATCH_LOST)
      log_conn (LOG_LEVEL_INFO, c->id, c->peer, "%s sent before the last one was answered: its user is not recorded", cmd);
   return track;
}

/* A hello's speculativeAuthenticate (at `it`) is relayed. */
static bool
auth_watch_hello (client_conn_t *c, const bson_iter_t *it)
{
   bson_t spec;
   const uint8_t *data;
   uint32_t len;

   if (!BSON_ITER_HOLDS_DOCUMENT (it))
      return false;
   bson_iter_document (it, &len, &data);
   if (!bson_init_static (&spec, data, len))
      return false;
   return sasl_watch_hello (auth_watch (c), &spec);
}

/* The reply (`len` bytes at the front of `in`) to a request the watch
 * waits for. */
static void
auth_watch_reply (client_conn_t *c, struct evbuffer *in, size_t len)
{
   const uint8_t *buf = evbuffer_pullup (in, (ssize_t) len);
   wire_msg_t reply;
   bson_error_t error = {.message = "out of memory"};
   bool had = c->sasl->user[0] != '\0';

   if (!buf || !wire_parse_msg (buf, len, &reply, &error)) {
      /* Unreadable: it cannot be believed either way. */
      log_conn (LOG_LEVEL_INFO, c->id, c->peer, "a SASL reply cannot be read (%s): its user is not recorded", error.message);
      sasl_watch_lose (c->sasl);
      return;
   }
   sasl_watch_reply (c->sasl, &reply.body);
   if (c->sasl->user[0] && !had)
      log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "authenticated upstream as %s (%s)", c->sasl->user, c->sasl->db);
}

/* Forwards a request unchanged but for its requestID.  A request with a
 * checksum is re-encoded instead: changing the header would break its
 * CRC, and the proxy drops checksums of what it rewrites. */
static bool
forward_request (client_conn_t *c,
                 struct evbuffer *src,
                 size_t len,
                 const wire_msg_t *msg,
                 const char *cmd,
                 int compressor,
                 bool track_auth,
                 bson_error_t *error)
{
   struct evbuffer *out = upstream_output (c);
   int32_t id = client_next_id (c);
   bool more = (msg->flags & WIRE_MSG_MORE_TO_COME) != 0;

   if (!more) {
      client_req_t *r;
      upstream_req_t *u;
      int64_t now_us = clock_mono_us ();

      /* Only a compressed request's answer is compressed, so only then can
       * the exempt list (12 names) matter. */
      if (compressor > 0 && compress_command_is_exempt (cmd))
         compressor = -1;
      r = creq_push (c, msg->header.request_id, WIRE_OP_MSG, compressor, now_us);
      u = upreq_push (c, UPREQ_RELAY, id, now_us);
      if (!r || !u) {
         /* fifo_has_room was checked before reading this request. */
         bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_INFLIGHT_FULL, "too many requests in flight");
         return false;
      }
      u->creq_seq = r->seq;
      u->track_cursor = c->server && owners_opens_cursors (cmd) && owners_enabled (c);
      u->track_auth = track_auth;
   }
   if (msg->checksum_present) {
      if (!wire_append_msg (out,
                            id,
                            msg->header.response_to,
                            msg->flags & ~WIRE_MSG_CHECKSUM_PRESENT,
                            &msg->body,
                            msg->sequences,
                            msg->nsequences)) {
         bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_REQUEST_TOO_LARGE, "request too large");
         return false;
      }
      counters_add (COUNTER_BYTES_TO_UPSTREAM, len);
      evbuffer_drain (src, len);
      return true;
   }
   if (!move_message (src, out, len, id, KEEP_ID)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory forwarding a request");
      return false;
   }
   counters_add (COUNTER_BYTES_TO_UPSTREAM, len);
   return true;
}

/* What the proxy offers in answer to `hello`; the first hello of the
 * connection also fixes the compressors its requests may use. */
static void
negotiate_compression (client_conn_t *c, const bson_t *hello, handshake_compression_t *offer)
{
   handshake_negotiate (hello, c->cfg->compressors, offer);
   if (c->state != CLIENT_STATE_HANDSHAKE)
      return;
   c->compressor = offer->n > 0 ? offer->ids[0] : -1;
   c->compressors_negotiated = 0;
   for (int i = 0; i < offer->n; i++)
      c->compressors_negotiated |= 1u << offer->ids[i];
}

/* Pooled mode: every hello is the proxy's to answer (the client has no
 * connection of its own to send it on), as a mongos, from the upstream's
 * hello the pool learned (pool_hello), with the client's own fields: the
 * compression negotiated with it, its connectionId (the proxy's id of the
 * connection), localTime, helloOk, and proxy/login.c's saslSupportedMechs
 * and speculativeAuthenticate. */
static bool
answer_hello_pooled (client_conn_t *c,
                     struct evbuffer *src,
                     size_t len,
                     int32_t client_id,
                     int32_t family,
                     const bson_t *hello,
                     bson_error_t *error)
{
   const bson_t *learned = pool_hello (c->loop->pool);
   handshake_compression_t offer;
   bson_t base, reply = BSON_INITIALIZER;
   bson_iter_t it;
   uint64_t seq;
   bool ok = false, base_init = false, lb;

   if (!learned) {
      /* Only after a topology change emptied what was learned: the
       * client is read only once the pool has learned a hello. */
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NOT_CONNECTED, "no upstream hello learned yet");
      goto done;
   }
   negotiate_compression (c, hello, &offer);
   lb = c->state == CLIENT_STATE_HANDSHAKE && handshake_wants_load_balanced (hello);
   if (!handshake_rewrite_reply (learned, &offer, lb ? instance_service_id () : NULL, &base, error))
      goto done;
   base_init = true;
   if (bson_iter_init (&it, &base))
      while (bson_iter_next (&it)) {
         const char *k = bson_iter_key (&it);
         if (strcmp (k, "connectionId") == 0 || strcmp (k, "localTime") == 0 || strcmp (k, "helloOk") == 0 ||
             strcmp (k, "saslSupportedMechs") == 0 || strcmp (k, "speculativeAuthenticate") == 0 ||
             strcmp (k, "ok") == 0)
            continue;
         bson_append_iter (&reply, NULL, 0, &it);
      }
   BSON_APPEND_INT32 (&reply, "connectionId", (int32_t) (c->id % INT32_MAX));
   BSON_APPEND_DATE_TIME (&reply, "localTime", (int64_t) (clock_now_ms ()));
   if (bson_iter_init_find (&it, hello, "helloOk") && bson_iter_as_bool (&it))
      BSON_APPEND_BOOL (&reply, "helloOk", true);
   login_hello (c, hello, &reply);
   BSON_APPEND_DOUBLE (&reply, "ok", 1.0);
   if (!client_hold_request (c, client_id, family, -1 /* hello is never compressed */, &seq, error))
      goto done;
   counters_add (COUNTER_HELLOS_REWRITTEN, 1);
   if (!client_answer (c, seq, &reply, error))
      goto done;
   if (c->state == CLIENT_STATE_HANDSHAKE) {
      log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "handshake done (pooled), compressor %s%s",
                c->compressor > 0 ? compress_name (c->compressor) : "none", lb ? ", load-balanced" : "");
      client_event (c, CLIENT_EVENT_HELLO_ANSWERED);
   }
   ok = true;
done:
   /* Only now: `hello` points into the request's bytes. */
   evbuffer_drain (src, len);
   if (base_init)
      bson_destroy (&base);
   bson_destroy (&reply);
   return ok;
}

/* A hello (OP_MSG or legacy OP_QUERY) goes upstream as OP_MSG without
 * `compression`; the reply comes back through reply_hello. */
static bool
forward_hello (client_conn_t *c,
               struct evbuffer *src,
               size_t len,
               int32_t client_id,
               int32_t family,
               const bson_t *hello,
               bson_error_t *error)
{
   bson_t body;
   client_req_t *r;
   upstream_req_t *u;
   int32_t id;
   int64_t now_us;
   bool ok = false, track_auth = false;

   if (c->loop->pool)
      return answer_hello_pooled (c, src, len, client_id, family, hello, error);
   {
      bson_iter_t it;
      if (bson_iter_init_find (&it, hello, "speculativeAuthenticate")) {
         client_event (c, CLIENT_EVENT_BINDS_SESSION); /* authenticated on this upstream connection */
         track_auth = auth_watch_hello (c, &it);
      }
   }
   if (handshake_speculative_x509 (hello))
      log_warn ("c%" PRIu64 " %s: hello's MONGODB-X509 speculativeAuthenticate removed (client connections present no "
                "certificate upstream)",
                c->id,
                c->peer);
   if (!handshake_rewrite_request (hello, family == WIRE_OP_QUERY, &body, error))
      goto done;
   now_us = clock_mono_us ();
   r = creq_push (c, client_id, family, -1 /* hello is never compressed */, now_us);
   id = client_next_id (c);
   u = upreq_push (c, UPREQ_HELLO, id, now_us);
   if (!r || !u) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_INFLIGHT_FULL, "too many requests in flight");
      goto done;
   }
   u->creq_seq = r->seq;
   u->track_auth = track_auth;
   /* As a mongos behind a load balancer: the connection's first hello
    * names the service, later ones are answered as without. */
   u->load_balanced = c->state == CLIENT_STATE_HANDSHAKE && handshake_wants_load_balanced (hello);
   negotiate_compression (c, hello, &u->offer);
   if (!wire_append_msg (upstream_output (c), id, 0, 0, &body, NULL, 0)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_HELLO_TOO_LARGE, "hello too large");
      goto done;
   }
   counters_add (COUNTER_BYTES_TO_UPSTREAM, len);
   evbuffer_drain (src, len);
   ok = true;
done:
   bson_destroy (&body);
   return ok;
}

/* Whether `list` (the compressors key: names separated by commas or
 * spaces) names `id`. */
static bool
compressor_listed (const char *list, int id)
{
   const char *name = compress_name (id);
   size_t n = name ? strlen (name) : 0;

   for (const char *p = list; name && p && *p;) {
      size_t len = strcspn (p, ", ");
      if (len == n && memcmp (p, name, n) == 0)
         return true;
      p += len;
      p += strspn (p, ", ");
   }
   return false;
}

/* An OP_COMPRESSED request may use noop (no decompression work: it only
 * frames the bytes), or a compressor that this connection's first hello
 * negotiated and that the compressors key still lists (a reload may have
 * dropped it).  Anything else is refused before any byte is inflated: an
 * algorithm the operator turned off must not be reachable by naming its
 * id. */
static bool
compressor_allowed (const client_conn_t *c, uint8_t id, bson_error_t *error)
{
   if (id == COMPRESS_NOOP)
      return true;
   if (!compress_name (id)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REQUEST, "unknown compressor id %u", id);
      return false;
   }
   if (id >= 8 * sizeof c->compressors_negotiated || !(c->compressors_negotiated & (1u << id))) {
      bson_set_error (error,
                      CLIENT_ERROR_DOMAIN,
                      CLIENT_ERR_BAD_REQUEST,
                      "compressor %s (id %u) was not negotiated in this connection's hello",
                      compress_name (id),
                      id);
      return false;
   }
   if (!compressor_listed (c->loop->cfg->compressors, id)) {
      bson_set_error (error,
                      CLIENT_ERROR_DOMAIN,
                      CLIENT_ERR_BAD_REQUEST,
                      "compressor %s (id %u) is not in the compressors setting",
                      compress_name (id),
                      id);
      return false;
   }
   return true;
}

/* ------------------------------------------------------------ decoding */

/* Routes a decoded request.  `h` is the header as received, for logs.
 * Returns false after disconnecting. */
static bool
route_decoded (client_conn_t *c, const wire_header_t *h, decoded_t *d)
{
   bson_error_t error;
   bson_t hello;
   route_action_t action;
   bool ok = false;

   if (d->h.opcode == WIRE_OP_MSG)
      action = route_msg (c, d->src, d->len, &d->msg, d->compressor, &error);
   else
      action = route_query (c, d->src, d->len, &d->q, d->compressor, &hello, &error);
   switch (action) {
   case ROUTE_FORWARD:
   case ROUTE_FORWARD_SASL:
      ok = forward_request (c,
                            d->src,
                            d->len,
                            &d->msg,
                            d->msg.command,
                            d->compressor,
                            action == ROUTE_FORWARD_SASL &&
                               auth_watch_request (c, &d->msg, d->msg.command, (d->msg.flags & WIRE_MSG_MORE_TO_COME) != 0),
                            &error);
      break;
   case ROUTE_HELLO:
      if (d->h.opcode == WIRE_OP_MSG)
         ok = forward_hello (c, d->src, d->len, d->msg.header.request_id, WIRE_OP_MSG, &d->msg.body, &error);
      else
         ok = forward_hello (c, d->src, d->len, d->q.header.request_id, WIRE_OP_QUERY, &hello, &error);
      break;
   case ROUTE_TAKEN:
      ok = true;
      break;
   case ROUTE_FAILED:
      break;
   case ROUTE_CLOSED:
      return false;
   }
   /* Forwarding and the hello never close the connection: a failure is
    * an error to close it for. */
   if (!ok)
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "request %d: %s", h->request_id, error.message);
   return ok;
}

static void
refuse_request (client_conn_t *c, const wire_header_t *h, const bson_error_t *error)
{
   client_disconnect (c,
                      COUNTERS_CLOSE_CLIENT_PROTOCOL,
                      "bad %s request %d (%d bytes): %s",
                      wire_opcode_name (h->opcode),
                      h->request_id,
                      h->length,
                      error->message);
}


/* The connection's finished job: refused, or routed like any request.
 * Returns false after disconnecting. */
static bool
client_job_finish (client_conn_t *c)
{
   client_job_t *j = c->job;
   const bson_error_t *error;
   decoded_t *d = client_job_decoded (j, &error);
   bool ok;

   c->job = NULL;
   if (!d) {
      refuse_request (c, client_job_header (j), error);
      client_job_free (j);
      return false;
   }
   ok = route_decoded (c, client_job_header (j), d);
   client_job_free (j);
   /* Routed into the counted buffers (or answered, or dropped). */
   if (ok)
      client_mem_release_decode (c);
   return ok;
}

/* Handles one complete request of `h->length` bytes at the front of the
 * client's input.  Returns 1 when it was taken, 0 when it must wait (its
 * decompression does not fit under max_buffered_bytes yet: the connection
 * is on the memory wait list), -1 after disconnecting. */
static int
handle_request (client_conn_t *c, struct evbuffer *in, wire_header_t h)
{
   size_t work = (size_t) h.length;
   decoded_t d;
   bson_error_t error;
   bool ok;

   if (h.opcode == WIRE_OP_COMPRESSED) {
      /* originalOpcode, uncompressedSize, compressorId: decided before
       * anything is inflated, from 25 bytes copied out. */
      uint8_t pre[WIRE_HEADER_LEN + 9];
      int32_t original, usize;

      if (h.length < (int32_t) sizeof pre || evbuffer_copyout (in, pre, sizeof pre) != (ssize_t) sizeof pre) {
         bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REQUEST, "OP_COMPRESSED fields run past the end of the message");
         goto protocol;
      }
      original = wire_get_i32 (pre + WIRE_HEADER_LEN);
      usize = wire_get_i32 (pre + WIRE_HEADER_LEN + 4);
      if (original != WIRE_OP_MSG && original != WIRE_OP_QUERY) {
         bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REQUEST, "OP_COMPRESSED wraps opcode %d", original);
         goto protocol;
      }
      if (!compressor_allowed (c, pre[WIRE_HEADER_LEN + 8], &error))
         goto protocol;
      if (usize < 0 || (uint64_t) usize + WIRE_HEADER_LEN > WIRE_MAX_MESSAGE_LEN) {
         bson_set_error (&error,
                         CLIENT_ERROR_DOMAIN,
                         CLIENT_ERR_BAD_REQUEST,
                         "OP_COMPRESSED uncompressedSize %d is outside [0, %d]",
                         usize,
                         WIRE_MAX_MESSAGE_LEN - WIRE_HEADER_LEN);
         goto protocol;
      }
      work += (size_t) usize;
      /* The decompressed form is reserved against max_buffered_bytes
       * before anything is inflated (while it was received, unless it came
       * whole in one read). */
      if (!client_mem_reserve_decode (c, (int64_t) usize + WIRE_HEADER_LEN))
         return 0;
   }
   if (work >= CLIENT_OFFLOAD_MIN && c->loop->decoder) {
      /* A plain request is parsed from a copy: reserved like a
       * decompression. */
      if (h.opcode != WIRE_OP_COMPRESSED && !client_mem_reserve_decode (c, h.length))
         return 0;
      return client_job_submit (c, in, h) ? 1 : -1;
   }
   if (h.opcode == WIRE_OP_COMPRESSED && !client_scratch (c, &error))
      goto protocol;
   ok = decode_request (in, h, c->scratch, NULL, &d, &error);
   /* Decompressed or not, what it holds is counted in c->scratch now. */
   client_mem_release_decode (c);
   if (!ok)
      goto protocol;
   return route_decoded (c, &h, &d) ? 1 : -1;
protocol:
   refuse_request (c, &h, &error);
   return -1;
}

/* Takes the complete request at the front of the client's input: 1 taken,
 * 0 it must wait for memory, -1 disconnected. */
static int
take_request (client_conn_t *c, struct evbuffer *in, const wire_header_t *h)
{
   int taken = handle_request (c, in, *h);

   if (taken == 1) {
      counters_add (COUNTER_MESSAGES_FROM_CLIENTS, 1);
      counters_add (COUNTER_BYTES_FROM_CLIENTS, (uint64_t) h->length);
   }
   return taken;
}

/* ------------------------------------------------------------ replies */

/* A parsed upstream reply written anew into c->tmp with `body`, the
 * client's responseTo and no checksum (the proxy does not compute one);
 * its document sequences are kept. */
static bool
rewrite_reply (client_conn_t *c,
               const wire_msg_t *reply,
               const bson_t *body,
               int32_t response_to,
               uint32_t flags,
               bson_error_t *error)
{
   if (!client_tmp (c, error))
      return false;
   if (!wire_append_msg (c->tmp,
                         reply->header.request_id,
                         response_to,
                         flags & ~WIRE_MSG_CHECKSUM_PRESENT,
                         body,
                         reply->sequences,
                         reply->nsequences)) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_REPLY_TOO_LARGE, "reply too large");
      return false;
   }
   return true;
}

/* The reply without its top-level topologyVersion (see
 * copy_without_topology_version), into c->tmp with the client's responseTo
 * (and no checksum).  The rest of the reply is relayed unchanged. */
static bool
relay_strip_topology_version (client_conn_t *c, const uint8_t *buf, size_t len, int32_t response_to, uint32_t flags,
                              bson_error_t *error)
{
   wire_msg_t reply;
   bson_t body = BSON_INITIALIZER;
   bool ok = false;

   if (!wire_parse_msg (buf, len, &reply, error) || !copy_without_topology_version (&reply.body, &body, error))
      goto done;
   ok = rewrite_reply (c, &reply, &body, response_to, flags, error);
done:
   bson_destroy (&body);
   return ok;
}

static bool
reply_hello (client_conn_t *c, upstream_req_t *u, client_req_t *r, struct evbuffer *in, size_t len, bson_error_t *error)
{
   const uint8_t *buf = evbuffer_pullup (in, (ssize_t) len);
   wire_msg_t reply;
   bson_t body = BSON_INITIALIZER;
   bool ok = false;

   if (!buf || !wire_parse_msg (buf, len, &reply, error))
      goto done;
   if (u->track_auth)
      sasl_watch_hello_reply (c->sasl, &reply.body);
   bson_destroy (&body);
   if (!handshake_rewrite_reply (&reply.body, &u->offer, u->load_balanced ? instance_service_id () : NULL, &body, error))
      goto done;
   if (!client_tmp (c, error))
      goto done;
   if (r->family == WIRE_OP_QUERY)
      ok = wire_append_reply (c->tmp, reply.header.request_id, r->client_id, 8 /* AwaitCapable */, &body);
   else
      ok = wire_append_msg (c->tmp, reply.header.request_id, r->client_id, 0, &body, NULL, 0);
   if (!ok) {
      bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_HELLO_REPLY_TOO_LARGE, "hello reply too large");
      goto done;
   }
   evbuffer_drain (in, len);
   counters_add (COUNTER_HELLOS_REWRITTEN, 1);
   ok = client_deliver (c, r, c->tmp, evbuffer_get_length (c->tmp), KEEP_ID, true, error);
done:
   bson_destroy (&body);
   return ok;
}

/* Closes the connection for reply `h` it could not take: a malformed one
 * (`protocol`) or an internal error. */
static void
reply_failed (client_conn_t *c, const wire_header_t *h, bool protocol, const bson_error_t *error)
{
   if (protocol)
      client_disconnect (c,
                         COUNTERS_CLOSE_UPSTREAM_PROTOCOL,
                         "bad reply %d from %s: %s",
                         h->request_id,
                         client_upstream_name (c),
                         error->message);
   else
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "relaying reply %d: %s", h->request_id, error->message);
}

/* The reply to a request of the proxy's own (UPREQ_INTERNAL): its
 * callback gets it parsed; it never reaches the client.  Internal
 * requests never allow exhaust: one reply ends them.  False: the
 * connection closed, in the callback or here for a malformed reply. */
static bool
reply_internal (client_conn_t *c, upstream_req_t *u, struct evbuffer *in, const wire_header_t *h)
{
   size_t len = (size_t) h->length;
   wire_msg_t reply;
   upstream_req_t done = *u;
   const uint8_t *buf = evbuffer_pullup (in, (ssize_t) len);
   bson_error_t error;

   if (!buf) {
      bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory reading a reply");
      reply_failed (c, h, true, &error);
      return false;
   }
   if (!wire_parse_msg (buf, len, &reply, &error)) {
      reply_failed (c, h, true, &error);
      return false;
   }
   upreq_pop (c);
   done.cb (c, &reply, NULL, done.cb_ctx);
   /* The callback is another module's: it may have closed the connection,
    * and its input with it. */
   if (c->state == CLIENT_STATE_CLOSING)
      return false;
   evbuffer_drain (in, len);
   return true;
}

/* The reply to a client's hello: rewritten (reply_hello), and the
 * handshake is done.  Returns false after disconnecting. */
static bool
reply_to_hello (client_conn_t *c, upstream_req_t *u, client_req_t *r, struct evbuffer *in, size_t len)
{
   upstream_req_t cur = *u;
   bson_error_t error;

   upreq_pop (c);
   if (!reply_hello (c, &cur, r, in, len, &error)) {
      client_disconnect (c, COUNTERS_CLOSE_UPSTREAM_PROTOCOL, "hello reply: %s", error.message);
      return false;
   }
   if (c->state == CLIENT_STATE_HANDSHAKE) {
      log_conn (LOG_LEVEL_DEBUG, c->id, c->peer, "handshake done via %s, compressor %s%s", client_upstream_name (c),
                c->compressor > 0 ? compress_name (c->compressor) : "none", cur.load_balanced ? ", load-balanced" : "");
      client_event (c, CLIENT_EVENT_HELLO_ANSWERED);
   }
   return true;
}

/* Relays the reply to a client's request: unchanged but for its
 * responseTo (the client's request id, on the first reply), without a
 * topologyVersion (a driver would compare it with the proxy's), and
 * re-encoded without its checksum (which the header change breaks).
 * Exhaust: the next reply responds to this one, and the client request
 * stays open until a reply without moreToCome.  `whole`: the reply made
 * contiguous by handle_reply when it is small enough to scan, else NULL.
 * False: the connection must close; *protocol tells a malformed reply from
 * an internal error. */
static bool
reply_relay (client_conn_t *c,
             upstream_req_t *u,
             client_req_t *r,
             struct evbuffer *in,
             const wire_header_t *h,
             uint32_t flags,
             const uint8_t *whole,
             bool *protocol,
             bson_error_t *error)
{
   size_t len = (size_t) h->length;
   bool more = (flags & WIRE_MSG_MORE_TO_COME) != 0;
   bool first = u->expect_response_to == u->upstream_id;
   int32_t response_to = first ? r->client_id : h->response_to;

   *protocol = false;
   if (c->server)
      pool_note_reply (c, more); /* before the client can have the reply */
   if (u->track_cursor && first)
      owners_note_reply (c, in, len);
   if (u->track_auth && first)
      auth_watch_reply (c, in, len);
   if (whole) {
      /* Still contiguous: the watches above read it through pullups of
       * the same length, which change nothing then. */
      const uint8_t *buf = whole;
      reply_scan_t scan = {false, false};
      reply_scan (buf, len, &scan);
      if (scan.not_primary)
         client_event (c, CLIENT_EVENT_NOT_PRIMARY); /* the paired member stepped down */
      if (scan.topology_version) {
         if (!relay_strip_topology_version (c, buf, len, response_to, flags, error)) {
            *protocol = true;
            return false;
         }
         evbuffer_drain (in, len);
         if (!client_deliver (c, r, c->tmp, evbuffer_get_length (c->tmp), KEEP_ID, !more, error))
            return false;
         goto relayed;
      }
   }
   if (flags & WIRE_MSG_CHECKSUM_PRESENT) {
      wire_msg_t reply;
      const uint8_t *buf = evbuffer_pullup (in, (ssize_t) len);
      if (!buf) {
         bson_set_error (error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory reading a reply");
         return false;
      }
      if (!wire_parse_msg (buf, len, &reply, error)) {
         *protocol = true;
         return false;
      }
      if (!rewrite_reply (c, &reply, &reply.body, response_to, flags, error)) {
         if (error->code == CLIENT_ERR_REPLY_TOO_LARGE)
            *protocol = true;
         return false;
      }
      evbuffer_drain (in, len);
      if (!client_deliver (c, r, c->tmp, evbuffer_get_length (c->tmp), KEEP_ID, !more, error))
         return false;
   } else if (!client_deliver (c, r, in, len, first ? (int64_t) r->client_id : KEEP_ID, !more, error)) {
      return false;
   }
relayed:
   if (more)
      u->expect_response_to = h->request_id;
   else
      upreq_pop (c);
   return true;
}

/* Handles one complete reply at the front of the upstream's input: checks
 * that it is the OP_MSG the oldest upstream request expects, then hands it
 * to its kind's function.  Returns false after disconnecting. */
static bool
handle_reply (client_conn_t *c, struct evbuffer *in, const wire_header_t *h)
{
   upstream_req_t *u;
   size_t len = (size_t) h->length;
   const uint8_t *pre;
   uint32_t flags;
   bool protocol = true;
   bson_error_t error;
   client_req_t *r;

   RELAYBUS_ASSERT (c->up_count > 0 && c->flight); /* take_reply refused an unsolicited one */
   u = &c->flight->upreqs[c->up_head];

   if (h->opcode != WIRE_OP_MSG) {
      bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REPLY, "unexpected %s", wire_opcode_name (h->opcode));
      goto failed;
   }
   if (h->response_to != u->expect_response_to) {
      bson_set_error (&error,
                      CLIENT_ERROR_DOMAIN,
                      CLIENT_ERR_BAD_REPLY,
                      "reply responds to %d, expected %d",
                      h->response_to,
                      u->expect_response_to);
      goto failed;
   }
   if (len < WIRE_HEADER_LEN + 4) {
      bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REPLY, "OP_MSG reply of %zu bytes", len);
      goto failed;
   }
   /* The header and the flags, without a copy when contiguous; a reply
    * small enough for reply_relay's scan is made contiguous whole, once
    * for every reader after this. */
   pre = evbuffer_pullup (in, len <= CLIENT_SCAN_LIMIT ? (ssize_t) len : WIRE_HEADER_LEN + 4);
   if (!pre) {
      bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_NO_MEMORY, "out of memory reading a reply");
      protocol = false;
      goto failed;
   }
   flags = wire_get_u32 (pre + WIRE_HEADER_LEN);

   if (u->kind == UPREQ_INTERNAL)
      return reply_internal (c, u, in, h);
   r = creq_find (c, u->creq_seq);
   if (!r) {
      client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "reply %d matches no client request", h->request_id);
      return false;
   }
   /* The upstream's time, from sending to this reply (an exhaust stream's
    * last reply counts from the request). */
   r->upstream_us = clock_mono_us () - u->sent_us;
   if (u->kind == UPREQ_HELLO) {
      if (flags & WIRE_MSG_MORE_TO_COME) {
         bson_set_error (&error, CLIENT_ERROR_DOMAIN, CLIENT_ERR_BAD_REPLY, "hello reply with moreToCome");
         goto failed;
      }
      return reply_to_hello (c, u, r, in, len);
   }
   /* The relay never closes the connection: a failure is an error to
    * close it for. */
   if (reply_relay (c, u, r, in, h, flags, len <= CLIENT_SCAN_LIMIT ? pre : NULL, &protocol, &error))
      return true;

failed:
   reply_failed (c, h, protocol, &error);
   return false;
}

/* Takes the complete reply at the front of the upstream's input, like
 * take_request (a reply never waits). */
static int
take_reply (client_conn_t *c, struct evbuffer *in, const wire_header_t *h)
{
   if (c->up_count == 0) {
      client_disconnect (c,
                         COUNTERS_CLOSE_UPSTREAM_PROTOCOL,
                         "unsolicited %s %d from %s",
                         wire_opcode_name (h->opcode),
                         h->request_id,
                         client_upstream_name (c));
      return -1;
   }
   counters_add (COUNTER_MESSAGES_FROM_UPSTREAM, 1);
   counters_add (COUNTER_BYTES_FROM_UPSTREAM, (uint64_t) h->length);
   return handle_reply (c, in, h) ? 1 : -1;
}

/* ------------------------------------------------------------ framing */

/* Whether what `from` sends may go on: a request needs room in both FIFOs
 * and the upstream's output below the high watermark (and no request of
 * the connection's being decoded), a reply the client's output below it. */
static inline bool
route_has_room (client_conn_t *c, const side_t *from)
{
   if (from->kind == SIDE_CLIENT)
      return !c->job && fifo_has_room (c) && (!c->up || evbuffer_get_length (upstream_output (c)) < high_watermark (c));
   return evbuffer_get_length (client_output (c)) < high_watermark (c);
}

/* The one framing loop, for both sides (proxy/conn_private.h): header by
 * header, each message taken once it is complete in the input. */
client_routed_t
client_route (client_conn_t *c, side_t *from)
{
   bool client = from->kind == SIDE_CLIENT;
   struct evbuffer *in;
   client_routed_t routed = CLIENT_ROUTED_NONE;

   if (client) {
      if (c->state != CLIENT_STATE_HANDSHAKE && c->state != CLIENT_STATE_READY)
         return CLIENT_ROUTED_NONE;
      if (c->job) {
         /* One request at a time: the next waits for the decoded one. */
         if (!client_job_finished (c->job))
            return CLIENT_ROUTED_NONE;
         if (!client_job_finish (c))
            return CLIENT_ROUTED_CLOSED;
         routed = CLIENT_ROUTED_SOME;
      }
   } else if (!from->connected) {
      return CLIENT_ROUTED_NONE;
   }
   in = side_input (from);
   for (;;) {
      const uint8_t *hb;
      wire_header_t h;
      bson_error_t error;
      size_t avail = evbuffer_get_length (in);

      /* The input first: the loop usually ends on an empty one, and the
       * room check costs a length read of the other side's output. */
      if (avail < WIRE_HEADER_LEN || !route_has_room (c, from))
         break;
      /* No copy when the header is contiguous (the usual case). */
      hb = evbuffer_pullup (in, WIRE_HEADER_LEN);
      if (!hb) {
         client_disconnect (c, COUNTERS_CLOSE_INTERNAL, "out of memory");
         return CLIENT_ROUTED_CLOSED;
      }
      (void) wire_peek_header (hb, WIRE_HEADER_LEN, &h);
      if (!wire_check_header (&h, 0, &error)) {
         if (client)
            client_disconnect (c, COUNTERS_CLOSE_CLIENT_PROTOCOL, "bad message header: %s", error.message);
         else
            client_disconnect (
               c, COUNTERS_CLOSE_UPSTREAM_PROTOCOL, "bad reply header from %s: %s", client_upstream_name (c), error.message);
         return CLIENT_ROUTED_CLOSED;
      }
      if (avail < (size_t) h.length)
         break;
      /* Pooled: a request that needs the upstream gets a connection first,
       * or waits for one, unread. */
      if (client && c->loop->pool && !c->server && !pool_client_timed_out (&c->pool) && !pool_admit (c, in, &h))
         return routed;
      switch (client ? take_request (c, in, &h) : take_reply (c, in, &h)) {
      case 0:
         return routed; /* waits for memory */
      case 1:
         break;
      default:
         return CLIENT_ROUTED_CLOSED;
      }
      if (client)
         pool_request_answered (c); /* that request had its answer */
      routed = CLIENT_ROUTED_SOME;
   }
   return routed;
}
