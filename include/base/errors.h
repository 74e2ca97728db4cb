/*
 * base/errors.h - the error domains of bson_error_t, one enum for the whole
 * program, as mongo-c-driver enumerates its own.
 *
 * Thread: any (constants only).
 *
 * Every fallible function fills a bson_error_t: a domain saying which
 * module failed, a code that module's header names, and a message.  The
 * domains live here, in one enum, so that two modules cannot share a value
 * (tests/check-layout refuses an *_ERROR_DOMAIN defined anywhere else).
 * They start above libbson's and mongo-c-driver's own domains (small
 * integers), which arrive in the same bson_error_t from a mongoc call, so
 * a domain alone says whose error it is.  The codes stay in each module's
 * header, beside the function that returns them.
 */
#ifndef RELAYBUS_BASE_ERRORS_H
#define RELAYBUS_BASE_ERRORS_H

typedef enum {
   ERROR_DOMAIN_FIRST_ = 0x4000, /* not a domain: above libbson's and mongoc's */
   /* base/ */
   AUTHFILE_ERROR_DOMAIN,
   CONFIG_ERROR_DOMAIN,
   LOOPWAKE_ERROR_DOMAIN,
   PULL_ERROR_DOMAIN,
   TOPOLOGY_ERROR_DOMAIN,
   TRACE_ERROR_DOMAIN,
   WORKER_ERROR_DOMAIN,
   /* codec/ */
   ANNOTATE_ERROR_DOMAIN,
   COMPRESS_ERROR_DOMAIN,
   HANDSHAKE_ERROR_DOMAIN,
   SASL_ERROR_DOMAIN,
   SCRAM_ERROR_DOMAIN,
   WIRE_ERROR_DOMAIN,
   /* proxy/ */
   CLIENT_ERROR_DOMAIN,
   LISTENER_ERROR_DOMAIN,
   LOOPS_ERROR_DOMAIN,
   OPERATOR_ERROR_DOMAIN,
   SIDE_ERROR_DOMAIN,
   TLS_ERROR_DOMAIN,
   /* publish/ */
   INJECT_ERROR_DOMAIN,
   PUBLISH_ERROR_DOMAIN,
   PULLTXN_ERROR_DOMAIN,
   /* store/ */
   STORE_ERROR_DOMAIN,
   /* dispatch/ */
   CONSUMER_ERROR_DOMAIN,
   DISPATCH_ERROR_DOMAIN,
   FORMAT_ERROR_DOMAIN,
   TRANSPORT_ERROR_DOMAIN,
   WEBHOOK_ERROR_DOMAIN,
   /* admin/ */
   ADMIN_ERROR_DOMAIN,
   /* src/main.c */
   MAIN_ERROR_DOMAIN,
} error_domain_t;

#endif /* RELAYBUS_BASE_ERRORS_H */
