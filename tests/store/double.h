/*
 * double.h - starts the server double for a C test.
 *
 * double_start runs tests/mongod-double/mongod-double --port 0 with its
 * standard output in a temporary file, waits for the port line (the first
 * line), and builds a URI.  Always the double: the store tests set fail
 * points and read the double's counters, which no deployment may be put
 * through (scripts/test --upstream does not run them).
 */
#ifndef RELAYBUS_TESTS_DOUBLE_H
#define RELAYBUS_TESTS_DOUBLE_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct {
   pid_t pid;
   int port;
   char uri[512];
   char out_path[256];
   char err_path[256];
} test_double_t;

/* top: the source tree (for tests/mongod-double). */
bool double_start (test_double_t *d, const char *top);
/* Stops the double (SIGTERM, then SIGKILL after 5 s) and removes its files. */
void double_stop (test_double_t *d);

#endif
