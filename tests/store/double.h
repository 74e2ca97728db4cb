/*
 * double.h - starts the server double for a C test (or uses MONGODB_URI).
 *
 * double_start runs tests/mongod-double/mongod-double --port 0 with its
 * standard output in a temporary file, waits for the port line (the first
 * line), and builds a URI.  With MONGODB_URI set it starts nothing and
 * hands that URI back: the test then uses its own database.
 */
#ifndef RELAYBUS_TESTS_DOUBLE_H
#define RELAYBUS_TESTS_DOUBLE_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct {
   pid_t pid; /* 0 when MONGODB_URI was used */
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
