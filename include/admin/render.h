/*
 * admin/render.h - the Prometheus text rendering of every metric.
 * Thread: admin thread.
 *
 * Everything the process counts is in the registry of base/counters.h and
 * is rendered from its table alone, in table order.  What only a scrape
 * knows, read from the store by the admin thread for this scrape
 * (render_view_t), follows it.  Rendering allocates only the output
 * string; it never blocks and never runs on the forwarding loop.
 */
#ifndef RELAYBUS_ADMIN_RENDER_H
#define RELAYBUS_ADMIN_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "admin/process.h"
#include "store/ops.h"

/* What the admin thread read from the store for this scrape. */
typedef struct {
   int64_t now_ms;
   bool store_ok; /* the store queries below succeeded */
   store_stats_t totals;
   const store_handler_stats_t *handlers;
   size_t n_handlers;
   int64_t lanes_leased, lanes_held;
   process_stats_t process; /* the process_* families, after the store's */
} render_view_t;

/* Appends the Prometheus text exposition (format 0.0.4) of the registry,
 * then of `view`: the store's figures, and the process's under the names
 * of Prometheus' client libraries. */
void render_metrics (bson_string_t *out, const render_view_t *view);

#endif /* RELAYBUS_ADMIN_RENDER_H */
