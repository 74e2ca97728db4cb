/*
 * proxy/decode.h - a client's request decoded: decompressed when it came
 * compressed, and parsed; on the loop, or by the loop's decoding thread
 * for a big one (proxy/decode.c).
 *
 * Thread: forwarding loop (decode_request also runs on the decoding
 * thread: it reads no connection state).
 *
 * The pump (proxy/pump.c) decodes a request on the loop with
 * decode_request, or hands one of CLIENT_OFFLOAD_MIN bytes or more to the
 * decoding thread (client_job_submit) and routes it once the job is back
 * (client_job_finished, client_job_decoded).  Starting and stopping the
 * thread, and dropping the job of a connection that closes, are the
 * connection's (proxy/conn_private.h).  Not here: what a request becomes.
 */
#ifndef RELAYBUS_PROXY_DECODE_H
#define RELAYBUS_PROXY_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>
#include <event2/buffer.h>

#include "codec/wire.h"
#include "proxy/conn_private.h"

/* One request, decompressed when it was compressed, and parsed.  `src`
 * holds exactly the parsed message at its front (the message as received,
 * or its decompressed form); the parsed structs point into it. */
typedef struct {
   struct evbuffer *src;
   size_t len;
   wire_header_t h; /* of the parsed (decompressed) message */
   int compressor;  /* what the request was compressed with; -1: plain */
   wire_msg_t msg;  /* h.opcode == WIRE_OP_MSG */
   wire_query_t q;  /* h.opcode == WIRE_OP_QUERY */
} decoded_t;

/* Decompresses (into `plain`, when the request is OP_COMPRESSED) and parses
 * one complete request of h.length bytes at the front of `in` (see
 * proxy/decode.c); `copy` may be NULL. */
bool decode_request (
   struct evbuffer *in, wire_header_t h, struct evbuffer *plain, uint8_t **copy, decoded_t *d, bson_error_t *error)
   __attribute__ ((warn_unused_result));

/* Hands the request at the front of `in` to the loop's decoding thread:
 * c->job until it is routed.  Returns false after disconnecting. */
bool client_job_submit (client_conn_t *c, struct evbuffer *in, wire_header_t h) __attribute__ ((warn_unused_result));
/* Whether the job is back from the decoding thread. */
bool client_job_finished (const client_job_t *j);
/* A finished job's request: its header as received, and its decoding
 * (NULL, with *error, when the request is the client's fault).  Both stay
 * the job's until client_job_free. */
const wire_header_t *client_job_header (const client_job_t *j);
decoded_t *client_job_decoded (client_job_t *j, const bson_error_t **error);
/* Frees a job and what it holds.  NULL ok. */
void client_job_free (client_job_t *j);

#endif /* RELAYBUS_PROXY_DECODE_H */
