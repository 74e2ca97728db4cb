/*
 * dispatch/span.c - the send span of one delivery attempt
 * (dispatch/span.h).
 */
#include "dispatch/span.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"

void
dispatch_span_begin (dispatch_span_t *s, format_msg_t *msg)
{
   s->traced = false;
   if (!trace_enabled ())
      return;
   for (size_t i = 0; i < msg->n_headers; i++) {
      char *v = msg->headers[i].value;
      trace_context_t out;

      if (strcasecmp (msg->headers[i].name, "traceparent") != 0 || !trace_parse_traceparent (v, &s->trace))
         continue;
      trace_new_id (s->span_id, sizeof s->span_id);
      out = s->trace;
      memcpy (out.span_id, s->span_id, sizeof out.span_id);
      trace_format_traceparent (&out, v); /* TRACE_PARENT_LEN, as parsed */
      s->start_ns = trace_now_ns ();
      s->traced = true;
      return;
   }
}

void
dispatch_span_end (const dispatch_span_t *sp, const config_handler_t *hc, const store_delivery_t *d, const transport_result_t *res)
{
   bool http = hc->kind_id == HANDLER_KIND_WEBHOOK;
   trace_span_t s = {0};

   if (!sp->traced)
      return;
   memcpy (s.trace_id, sp->trace.trace_id, sizeof s.trace_id);
   memcpy (s.parent_id, sp->trace.span_id, sizeof s.parent_id);
   memcpy (s.span_id, sp->span_id, sizeof s.span_id);
   s.kind = http ? TRACE_KIND_CLIENT : TRACE_KIND_PRODUCER;
   snprintf (s.name, sizeof s.name, "send %s", hc->name);
   s.start_ns = sp->start_ns;
   s.end_ns = trace_now_ns ();
   s.error = res->outcome != TRANSPORT_OUTCOME_OK;
   trace_span_str (&s, "messaging.system", http ? "relaybus" : hc->kind);
   trace_span_str (&s, "messaging.operation.name", "send");
   trace_span_str (&s, "messaging.operation.type", "send");
   trace_span_str (&s, "messaging.destination.name", hc->name);
   trace_span_str (&s, "messaging.message.id", d->event_id);
   trace_span_str (&s, "relaybus.handler.kind", hc->kind);
   trace_span_int (&s, "relaybus.attempt", d->attempt);
   trace_span_str (&s, "relaybus.outcome", transport_outcome_name (res->outcome));
   if (http)
      trace_span_http_client (&s, "POST", hc->url);
   if (res->http_status > 0)
      trace_span_int (&s, "http.response.status_code", res->http_status);
   if (res->outcome != TRANSPORT_OUTCOME_OK)
      trace_span_str (&s, "error.type", res->error[0] ? res->error : "error");
   trace_emit (&s);
}

void
dispatch_span_log (const dispatch_span_t *s)
{
   if (s->traced)
      log_set_trace (s->trace.trace_id, s->span_id);
}
