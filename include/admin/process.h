/*
 * admin/process.h - the process's own figures for /metrics, named as
 * Prometheus' client libraries name them (process_cpu_seconds_total,
 * process_resident_memory_bytes, ...), so that the dashboards and alerts
 * written for any exporter apply.
 *
 * Thread: the admin thread, once per scrape.  Read from getrusage,
 * getrlimit and Linux's /proc/self (statm, stat, fd) and /proc/stat: a few
 * small reads of kernel-made files that never block on a device.  Elsewhere
 * a figure that cannot be read is left out (`has_*` false).
 *
 * Not here: rendering (admin/render.c).
 */
#ifndef RELAYBUS_ADMIN_PROCESS_H
#define RELAYBUS_ADMIN_PROCESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
   double cpu_seconds;      /* user + system */
   bool has_memory;
   uint64_t resident_bytes; /* RSS */
   uint64_t virtual_bytes;  /* VSZ */
   bool has_fds;
   uint64_t open_fds;       /* entries of /proc/self/fd, the one reading it included */
   uint64_t max_fds;        /* RLIMIT_NOFILE's soft limit */
   bool has_start;
   double start_time_seconds; /* Unix seconds */
} process_stats_t;

/* Fills `out`; what cannot be read is marked absent. */
void process_stats_read (process_stats_t *out);

#endif /* RELAYBUS_ADMIN_PROCESS_H */
