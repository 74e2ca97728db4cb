/*
 * dispatch/transport_result.h - what a send of any kind comes to: its
 * outcome, the result the dispatcher settles it by, the callback that
 * carries it, and the transport's error codes.
 *
 * Thread: any (types and constants only).
 *
 * The vocabulary that the handler interface (dispatch/transport.h) and
 * the queue to the broker kinds' threads (dispatch/transport_queue.h)
 * share, in a header of its own so that neither includes the other: the
 * base in transport.c uses the queue, and the queue carries results.
 * Not here: any function (the outcome's name is transport.h's).
 */
#ifndef RELAYBUS_TRANSPORT_RESULT_H
#define RELAYBUS_TRANSPORT_RESULT_H

#include <stdint.h>

#include "base/errors.h"
#include "base/outbox.h"

/* transport_result_t.error is at most this long (lastError). */
#define TRANSPORT_ERROR_MAX 256

/* The errors of the transports (TRANSPORT_ERROR_DOMAIN). */
typedef enum {
   TRANSPORT_ERROR_KIND = 1,  /* a kind this build has no transport for */
   TRANSPORT_ERROR_START,     /* the kind's client could not be made */
   TRANSPORT_ERROR_SEND,      /* a send could not be started */
} transport_error_code_t;

typedef enum {
   TRANSPORT_OUTCOME_OK,    /* confirmed: complete the delivery */
   TRANSPORT_OUTCOME_RETRY, /* failed: retry (retry_after_ms, or the handler's backoff) */
   TRANSPORT_OUTCOME_DEAD,  /* failed for good: bury now, whatever attempts are left */
   TRANSPORT_OUTCOME_GONE,  /* the endpoint is gone (a webhook's 410): disable the handler, give the delivery back uncharged */
} transport_outcome_t;

/* What kind of failure a send that did not succeed was, for its attempt's
 * record (outbox_attempt_outcome_t): NONE is a plain failure (an answer
 * that is not a 2xx, no connection). */
typedef enum {
   TRANSPORT_FAULT_NONE = 0,
   TRANSPORT_FAULT_TIMEOUT, /* no answer, PubAck, confirm or delivery report within timeout_ms */
   TRANSPORT_FAULT_REFUSED, /* the broker refused the message: a nack, unroutable, no stream, a broker's error */
} transport_fault_t;

/* The bytes of a webhook's answer a result keeps: twice what an attempt's
 * record shows, so that a secret the answer quotes across the record's
 * cut is still found whole when it is masked (store/attempts.c). */
#define TRANSPORT_RESPONSE_MAX (2 * OUTBOX_ATTEMPT_RESPONSE_MAX)

typedef struct {
   transport_outcome_t outcome;
   int64_t retry_after_ms;          /* RETRY: the delay asked for; -1: the handler's backoff */
   int http_status;                 /* a webhook's answer; 0: none (no answer, or another kind) */
   transport_fault_t fault;         /* not OK: a timeout, a broker's refusal, or neither */
   char error[TRANSPORT_ERROR_MAX]; /* lastError when not OK */
   /* A webhook's answer: the start of its body, valid UTF-8 (unmasked: the
    * attempt's record masks it); "" without one. */
   char response[TRANSPORT_RESPONSE_MAX + 1];
} transport_result_t;

typedef void (*transport_done_cb_t) (const transport_result_t *result, void *arg);

#endif /* RELAYBUS_TRANSPORT_RESULT_H */
