/*
 * stub-upstream.c - a MongoDB upstream that answers at line rate, for benchmarks.
 *
 * It answers every request with a reply encoded once at start-up: only the
 * header's requestID and responseTo are patched before the bytes are copied
 * into the socket buffer.  It stores nothing and evaluates nothing.  It plays a
 * replica-set primary (setName rs0, me = its own address) well enough for
 * mongo-c-driver's topology monitoring, answers OP_QUERY legacy hello with
 * OP_REPLY, and knows ping, buildInfo, endSessions and find (one fixed batch of
 * 10 small documents, cursor id 0); anything else gets {ok: 1}.
 *
 * It is a benchmark tool, not a MongoDB double (tests/mongod-double is that):
 * no compression, no sessions, no errors beyond closing a connection whose
 * bytes do not parse.  It deliberately does not link the proxy's wire module,
 * so that a bug there cannot hide in both ends of a measurement.
 *
 * Usage: stub-upstream [--host 127.0.0.1] [--port N]
 * With --port 0 (the default) the bound port is printed as the first line of
 * stdout, so scripts can start it without racing for a free port.
 */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <bson/bson.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#define STUB_HEADER_LEN 16
#define STUB_MAX_MESSAGE_LEN 48000000
#define STUB_OP_REPLY 1
#define STUB_OP_QUERY 2004
#define STUB_OP_MSG 2013
#define STUB_MSG_CHECKSUM_PRESENT (1u << 0)
#define STUB_MSG_MORE_TO_COME (1u << 1)
#define STUB_FIND_BATCH 10

/* A whole reply message, header included.  The buffer is patched in place
 * before each send: the stub is single-threaded and evbuffer_add copies. */
typedef struct {
   uint8_t *bytes;
   size_t len;
} stub_reply_t;

typedef enum {
   STUB_REPLY_OK,
   STUB_REPLY_HELLO,
   STUB_REPLY_BUILDINFO,
   STUB_REPLY_FIND,
   STUB_REPLY_LEGACY_HELLO, /* OP_REPLY */
   STUB_REPLY_LEGACY_OK,    /* OP_REPLY */
   STUB_REPLY_COUNT_,
} stub_reply_kind_t;

static stub_reply_t stub_replies[STUB_REPLY_COUNT_];
static int32_t stub_next_request_id = 1;
static uint64_t stub_connections_open;

static void
stub_put_le32 (uint8_t *p, int32_t v)
{
   uint32_t u = (uint32_t) v;
   p[0] = (uint8_t) u;
   p[1] = (uint8_t) (u >> 8);
   p[2] = (uint8_t) (u >> 16);
   p[3] = (uint8_t) (u >> 24);
}

static int32_t
stub_get_le32 (const uint8_t *p)
{
   return (int32_t) ((uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
                     (uint32_t) p[3] << 24);
}

/* Frames `doc` as an OP_MSG (flags 0, one kind-0 section) or as an OP_REPLY
 * (flags 8 = AwaitCapable, cursor 0, one document), as mongod does. */
static void
stub_reply_build (stub_reply_t *reply, const bson_t *doc, bool legacy)
{
   size_t body = legacy ? 4 + 8 + 4 + 4 : 4 + 1;
   reply->len = STUB_HEADER_LEN + body + doc->len;
   reply->bytes = calloc (1, reply->len);
   if (!reply->bytes) {
      perror ("stub-upstream: calloc");
      exit (1);
   }
   uint8_t *p = reply->bytes;
   stub_put_le32 (p, (int32_t) reply->len);
   stub_put_le32 (p + 12, legacy ? STUB_OP_REPLY : STUB_OP_MSG);
   p += STUB_HEADER_LEN;
   if (legacy) {
      stub_put_le32 (p, 8);      /* responseFlags: AwaitCapable */
      p += 4 + 8 + 4;            /* cursorID 0, startingFrom 0 */
      stub_put_le32 (p, 1);      /* numberReturned */
      p += 4;
   } else {
      p += 4;                    /* flagBits 0 */
      *p++ = 0;                  /* section kind 0 */
   }
   memcpy (p, bson_get_data (doc), doc->len);
}

static void
stub_hello_doc (bson_t *doc, const char *me, bool legacy)
{
   bson_t hosts;
   bson_oid_t election_id;

   /* A fixed electionId: the driver compares (setVersion, electionId) to
    * detect stale primaries, and this primary never changes. */
   bson_oid_init_from_string (&election_id, "7fffffff0000000000000001");
   bson_init (doc);
   BSON_APPEND_BOOL (doc, "helloOk", true);
   /* No topologyVersion: drivers then poll hello instead of streaming it
    * (awaitable hello), which a stub without timers cannot serve. */
   BSON_APPEND_ARRAY_BEGIN (doc, "hosts", &hosts);
   BSON_APPEND_UTF8 (&hosts, "0", me);
   bson_append_array_end (doc, &hosts);
   BSON_APPEND_UTF8 (doc, "setName", "rs0");
   BSON_APPEND_INT32 (doc, "setVersion", 1);
   BSON_APPEND_BOOL (doc, legacy ? "ismaster" : "isWritablePrimary", true);
   BSON_APPEND_BOOL (doc, "secondary", false);
   BSON_APPEND_UTF8 (doc, "primary", me);
   BSON_APPEND_UTF8 (doc, "me", me);
   BSON_APPEND_OID (doc, "electionId", &election_id);
   BSON_APPEND_INT32 (doc, "maxBsonObjectSize", 16777216);
   BSON_APPEND_INT32 (doc, "maxMessageSizeBytes", STUB_MAX_MESSAGE_LEN);
   BSON_APPEND_INT32 (doc, "maxWriteBatchSize", 100000);
   BSON_APPEND_DATE_TIME (doc, "localTime", 0);
   BSON_APPEND_INT32 (doc, "logicalSessionTimeoutMinutes", 30);
   BSON_APPEND_INT32 (doc, "connectionId", 1);
   BSON_APPEND_INT32 (doc, "minWireVersion", 0);
   BSON_APPEND_INT32 (doc, "maxWireVersion", 21);
   BSON_APPEND_BOOL (doc, "readOnly", false);
   BSON_APPEND_DOUBLE (doc, "ok", 1.0);
}

static void
stub_replies_init (const char *me)
{
   bson_t doc, cursor, batch, item, version;
   char key[16];

   bson_init (&doc);
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   stub_reply_build (&stub_replies[STUB_REPLY_OK], &doc, false);
   stub_reply_build (&stub_replies[STUB_REPLY_LEGACY_OK], &doc, true);
   bson_destroy (&doc);

   stub_hello_doc (&doc, me, false);
   stub_reply_build (&stub_replies[STUB_REPLY_HELLO], &doc, false);
   bson_destroy (&doc);
   stub_hello_doc (&doc, me, true);
   stub_reply_build (&stub_replies[STUB_REPLY_LEGACY_HELLO], &doc, true);
   bson_destroy (&doc);

   bson_init (&doc);
   BSON_APPEND_UTF8 (&doc, "version", "7.0.0");
   BSON_APPEND_UTF8 (&doc, "gitVersion", "stub");
   BSON_APPEND_ARRAY_BEGIN (&doc, "versionArray", &version);
   BSON_APPEND_INT32 (&version, "0", 7);
   BSON_APPEND_INT32 (&version, "1", 0);
   BSON_APPEND_INT32 (&version, "2", 0);
   BSON_APPEND_INT32 (&version, "3", 0);
   bson_append_array_end (&doc, &version);
   BSON_APPEND_INT32 (&doc, "bits", 64);
   BSON_APPEND_INT32 (&doc, "maxBsonObjectSize", 16777216);
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   stub_reply_build (&stub_replies[STUB_REPLY_BUILDINFO], &doc, false);
   bson_destroy (&doc);

   /* The find batch: ten documents of ~40 bytes, a typical point-read size. */
   bson_init (&doc);
   BSON_APPEND_DOCUMENT_BEGIN (&doc, "cursor", &cursor);
   BSON_APPEND_ARRAY_BEGIN (&cursor, "firstBatch", &batch);
   for (int i = 0; i < STUB_FIND_BATCH; i++) {
      bson_snprintf (key, sizeof key, "%d", i);
      bson_append_document_begin (&batch, key, -1, &item);
      BSON_APPEND_INT32 (&item, "_id", i);
      BSON_APPEND_UTF8 (&item, "name", "benchmark");
      BSON_APPEND_INT64 (&item, "value", (int64_t) i * 1000);
      bson_append_document_end (&batch, &item);
   }
   bson_append_array_end (&cursor, &batch);
   BSON_APPEND_INT64 (&cursor, "id", 0);
   BSON_APPEND_UTF8 (&cursor, "ns", "bench.items");
   bson_append_document_end (&doc, &cursor);
   BSON_APPEND_DOUBLE (&doc, "ok", 1.0);
   stub_reply_build (&stub_replies[STUB_REPLY_FIND], &doc, false);
   bson_destroy (&doc);
}

/* The first key of the BSON document at `doc` (at most `len` bytes), or NULL
 * if the document is malformed.  Only the first element matters: the command
 * name comes first in a command body. */
static const char *
stub_first_key (const uint8_t *doc, size_t len)
{
   if (len < 5)
      return NULL;
   int32_t doc_len = stub_get_le32 (doc);
   if (doc_len < 5 || (size_t) doc_len > len || doc[doc_len - 1] != 0)
      return NULL;
   if (doc_len == 5 || doc[4] == 0)
      return ""; /* empty document */
   const char *key = (const char *) doc + 5;
   /* The key must end inside the document; doc[doc_len-1] is a NUL, so
    * memchr cannot run past it. */
   if (!memchr (key, 0, (size_t) doc_len - 5))
      return NULL;
   return key;
}

static stub_reply_kind_t
stub_classify (const char *cmd, bool legacy)
{
   if (strcmp (cmd, "hello") == 0 || strcmp (cmd, "isMaster") == 0 ||
       strcmp (cmd, "ismaster") == 0)
      return legacy ? STUB_REPLY_LEGACY_HELLO : STUB_REPLY_HELLO;
   if (legacy)
      return STUB_REPLY_LEGACY_OK;
   if (strcmp (cmd, "find") == 0)
      return STUB_REPLY_FIND;
   if (strcmp (cmd, "buildInfo") == 0 || strcmp (cmd, "buildinfo") == 0)
      return STUB_REPLY_BUILDINFO;
   /* ping, endSessions and everything else. */
   return STUB_REPLY_OK;
}

/* Decides the reply to one whole message `msg` of `len` bytes.  Returns false
 * if the message does not parse (the connection is then closed); sets
 * *silent for an OP_MSG with moreToCome, which wants no reply. */
static bool
stub_handle (const uint8_t *msg, size_t len, stub_reply_kind_t *kind, bool *silent)
{
   int32_t opcode = stub_get_le32 (msg + 12);
   const uint8_t *p = msg + STUB_HEADER_LEN;
   const uint8_t *end = msg + len;
   const char *cmd;

   *silent = false;
   if (opcode == STUB_OP_MSG) {
      if (end - p < 4)
         return false;
      uint32_t flags = (uint32_t) stub_get_le32 (p);
      p += 4;
      if (flags & STUB_MSG_CHECKSUM_PRESENT) {
         if (end - p < 4)
            return false;
         end -= 4; /* not verified: the stub trusts its benchmark clients */
      }
      *silent = (flags & STUB_MSG_MORE_TO_COME) != 0;
      /* Walk sections to the kind-0 body; kind-1 sequences are skipped. */
      while (p < end) {
         uint8_t section = *p++;
         if (section == 0) {
            cmd = stub_first_key (p, (size_t) (end - p));
            if (!cmd)
               return false;
            *kind = stub_classify (cmd, false);
            return true;
         }
         if (section != 1 || end - p < 4)
            return false;
         int32_t size = stub_get_le32 (p);
         if (size < 4 || size > end - p)
            return false;
         p += size;
      }
      return false; /* no body */
   }
   if (opcode == STUB_OP_QUERY) {
      /* flags, fullCollectionName, numberToSkip, numberToReturn, query */
      if (end - p < 4)
         return false;
      p += 4;
      const uint8_t *nul = memchr (p, 0, (size_t) (end - p));
      if (!nul)
         return false;
      p = nul + 1;
      if (end - p < 8)
         return false;
      p += 8;
      cmd = stub_first_key (p, (size_t) (end - p));
      if (!cmd)
         return false;
      *kind = stub_classify (cmd, true);
      return true;
   }
   return false; /* OP_COMPRESSED is never negotiated; others are obsolete */
}

static void
stub_close (struct bufferevent *bev)
{
   bufferevent_free (bev);
   stub_connections_open--;
}

/* Answers every whole message in the input, in order: a pipelined batch gets
 * its replies appended back to back and flushed in one write. */
static void
stub_read_cb (struct bufferevent *bev, void *ctx)
{
   struct evbuffer *in = bufferevent_get_input (bev);
   struct evbuffer *out = bufferevent_get_output (bev);
   uint8_t header[STUB_HEADER_LEN];

   for (;;) {
      size_t have = evbuffer_get_length (in);
      if (have < STUB_HEADER_LEN)
         return;
      evbuffer_copyout (in, header, STUB_HEADER_LEN);
      int32_t len = stub_get_le32 (header);
      if (len < STUB_HEADER_LEN || len > STUB_MAX_MESSAGE_LEN) {
         fprintf (stderr, "stub-upstream: bad message length %d, closing\n", (int) len);
         stub_close (bev);
         return;
      }
      if (have < (size_t) len) {
         /* Wake only when the whole message is in. */
         bufferevent_setwatermark (bev, EV_READ, (size_t) len, 0);
         return;
      }
      const uint8_t *msg = evbuffer_pullup (in, len);
      stub_reply_kind_t kind;
      bool silent;
      if (!msg || !stub_handle (msg, (size_t) len, &kind, &silent)) {
         fprintf (stderr, "stub-upstream: unparsable message, closing\n");
         stub_close (bev);
         return;
      }
      if (!silent) {
         stub_reply_t *reply = &stub_replies[kind];
         stub_put_le32 (reply->bytes + 4, stub_next_request_id++);
         memcpy (reply->bytes + 8, header + 4, 4); /* responseTo = requestID */
         evbuffer_add (out, reply->bytes, reply->len);
      }
      evbuffer_drain (in, (size_t) len);
      bufferevent_setwatermark (bev, EV_READ, 0, 0);
   }
}

static void
stub_event_cb (struct bufferevent *bev, short what, void *ctx)
{
   if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
      stub_close (bev);
}

static void
stub_accept_cb (struct evconnlistener *listener, evutil_socket_t fd,
                struct sockaddr *addr, int socklen, void *ctx)
{
   struct event_base *base = evconnlistener_get_base (listener);
   int one = 1;

   /* Replies are single writes; Nagle would only add delay. */
   setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
   struct bufferevent *bev = bufferevent_socket_new (base, fd, BEV_OPT_CLOSE_ON_FREE);
   if (!bev) {
      evutil_closesocket (fd);
      return;
   }
   stub_connections_open++;
   bufferevent_setcb (bev, stub_read_cb, NULL, stub_event_cb, NULL);
   bufferevent_enable (bev, EV_READ | EV_WRITE);
}

static void
stub_accept_error_cb (struct evconnlistener *listener, void *ctx)
{
   /* EMFILE and friends: say so and keep going; the benchmark shows it. */
   fprintf (stderr, "stub-upstream: accept: %s (open connections: %llu)\n",
            strerror (errno), (unsigned long long) stub_connections_open);
}

static void
stub_signal_cb (evutil_socket_t sig, short what, void *ctx)
{
   event_base_loopbreak ((struct event_base *) ctx);
}

/* Idle-connection benchmarks need one descriptor per connection. */
static void
stub_raise_fd_limit (void)
{
   struct rlimit rl;
   if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      (void) setrlimit (RLIMIT_NOFILE, &rl);
   }
}

static void
stub_usage (FILE *f)
{
   fprintf (f, "usage: stub-upstream [--host ADDR] [--port N]\n"
               "  --host ADDR  IPv4 address to listen on (default 127.0.0.1)\n"
               "  --port N     port; 0 (default) picks one and prints it on stdout\n");
}

int
main (int argc, char **argv)
{
   static const struct option options[] = {
      {"host", required_argument, NULL, 'h'},
      {"port", required_argument, NULL, 'p'},
      {"help", no_argument, NULL, '?'},
      {NULL, 0, NULL, 0},
   };
   const char *host = "127.0.0.1";
   int port = 0;
   int c;

   while ((c = getopt_long (argc, argv, "", options, NULL)) != -1) {
      switch (c) {
      case 'h':
         host = optarg;
         break;
      case 'p':
         port = atoi (optarg);
         break;
      case '?':
      default:
         stub_usage (c == '?' && optopt == 0 ? stdout : stderr);
         return c == '?' && optopt == 0 ? 0 : 2;
      }
   }

   signal (SIGPIPE, SIG_IGN);
   stub_raise_fd_limit ();

   struct sockaddr_in sin;
   memset (&sin, 0, sizeof sin);
   sin.sin_family = AF_INET;
   sin.sin_port = htons ((uint16_t) port);
   if (inet_pton (AF_INET, host, &sin.sin_addr) != 1) {
      fprintf (stderr, "stub-upstream: --host must be an IPv4 address: %s\n", host);
      return 2;
   }

   struct event_base *base = event_base_new ();
   if (!base) {
      fprintf (stderr, "stub-upstream: event_base_new failed\n");
      return 1;
   }
   struct evconnlistener *listener = evconnlistener_new_bind (
      base, stub_accept_cb, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 4096,
      (struct sockaddr *) &sin, sizeof sin);
   if (!listener) {
      fprintf (stderr, "stub-upstream: cannot listen on %s:%d: %s\n", host, port,
               strerror (errno));
      return 1;
   }
   evconnlistener_set_error_cb (listener, stub_accept_error_cb);

   struct sockaddr_in bound;
   socklen_t bound_len = sizeof bound;
   getsockname (evconnlistener_get_fd (listener), (struct sockaddr *) &bound, &bound_len);
   int bound_port = ntohs (bound.sin_port);

   /* hello's hosts/me must be the address as clients write it, or drivers
    * drop the primary from the topology. */
   char me[64];
   snprintf (me, sizeof me, "%s:%d", host, bound_port);
   stub_replies_init (me);

   printf ("%d\n", bound_port);
   fflush (stdout);

   struct event *sigint = evsignal_new (base, SIGINT, stub_signal_cb, base);
   struct event *sigterm = evsignal_new (base, SIGTERM, stub_signal_cb, base);
   event_add (sigint, NULL);
   event_add (sigterm, NULL);

   event_base_dispatch (base);

   event_free (sigint);
   event_free (sigterm);
   evconnlistener_free (listener);
   event_base_free (base);
   for (int i = 0; i < STUB_REPLY_COUNT_; i++)
      free (stub_replies[i].bytes);
   return 0;
}
