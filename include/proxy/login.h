/*
 * proxy/login.h - clients logging in to the proxy itself (pooled mode).
 *
 * Thread: forwarding loop (the guess table behind the rate limit,
 * base/authlimit.h, is process-wide, under a mutex).
 *
 * In pooled mode the server never sees a client's login: the pool's
 * connections are logged in as the proxy.  So the proxy is the SCRAM
 * server for its clients, as mongod is for a direct client: saslStart and
 * saslContinue (with skipEmptyExchange), a hello's speculativeAuthenticate
 * and saslSupportedMechs, SCRAM-SHA-256 and SCRAM-SHA-1 (codec/scram.h),
 * against the users of [proxy] auth_file (the config snapshot's `users`).
 * Without an auth file, clients are not authenticated by the proxy, as
 * with a mongod that runs without --auth.
 *
 * What the proxy answers itself in pooled mode, without a connection:
 * hello (proxy/pump.c), saslStart, saslContinue, authenticate (refused:
 * only SCRAM is available), logout and connectionStatus; and, before a
 * login when one is required, ping ({ok: 1}) and every other command,
 * refused with 13 Unauthorized as mongod refuses it.  A ping of a client
 * that may run commands goes to the server.  Before a login nothing else
 * takes a pooled connection: pool_admit asks login_answers_locally first,
 * also of a request it cannot peek at (compressed, large), which is then
 * read whole and refused.  A client that has not logged in within
 * login_timeout_ms of its accept is closed.
 *
 * A wrong password or an unknown user is 18 AuthenticationFailed, as mongod
 * answers.  Each conversation of a user in the auth file counts as a
 * guess of its (user, peer address) pair when it starts (saslStart, or a
 * hello's speculativeAuthenticate), and is given back when its proof is
 * right or it ends unchecked: a pair with auth_failures_per_minute guesses
 * counted in the last minute has its next conversations refused at the
 * start (18, the message naming the limit), before any proof is checked,
 * however many run in parallel.  Other users on that address, and that
 * user on other addresses, are not refused for it.  A user with that many
 * failures within a minute, from any addresses, has each further
 * saslContinue wait before its proof is checked (100 ms doubling, up to
 * auth_failure_delay_max_ms), on a timer of the loop; a saslStart,
 * saslContinue or logout sent meanwhile is refused with 17 ProtocolError.
 */
#ifndef RELAYBUS_PROXY_LOGIN_H
#define RELAYBUS_PROXY_LOGIN_H

#include <stdbool.h>
#include <stddef.h>

#include <bson/bson.h>
#include <event2/buffer.h>

#include "codec/wire.h"
#include "proxy/conn.h"

typedef struct login login_t;

/* Pooled, with an auth file: arms c's login_timeout_ms (at accept); c is
 * closed (COUNTERS_CLOSE_LOGIN_TIMEOUT) unless it logs in by then.  False:
 * out of memory. */
bool login_deadline_start (client_conn_t *c) __attribute__ ((warn_unused_result));
/* c closes: the deadline and a delayed proof's timer stop, so that nothing
 * of its login fires after the close. */
void login_stop (client_conn_t *c);

/* Frees a connection's login state (NULL ok). */
void login_destroy (login_t *login);

/* Whether the proxy answers `cmd` (a command name, or NULL) of pooled
 * client c itself: hello, the login commands, connectionStatus, and
 * anything (ping included) before a required login. */
bool login_answers_locally (const client_conn_t *c, const char *cmd);
/* The same for a client that `must_log_in` (an auth file, no login yet);
 * `cmd` NULL: a request whose command could not be read. */
bool login_gate_local (const char *cmd, bool must_log_in);

/* The user c logged in as, or NULL (not logged in, or no auth file). */
const char *login_user (const client_conn_t *c);

/* Adds to the hello reply `reply` what the client's `hello` asks of the
 * login: saslSupportedMechs (the user's mechanisms, absent for an unknown
 * user, as mongod does) and the answer to speculativeAuthenticate (the
 * server-first message of a conversation it starts, or nothing when it
 * fails: the driver then logs in explicitly and sees the error). */
void login_hello (client_conn_t *c, const bson_t *hello, bson_t *reply);

/* Answers a command login_answers_locally took (its bytes, `len` at the
 * front of `src`, are dropped).  False after disconnecting (error set). */
bool login_command (client_conn_t *c,
                    const wire_msg_t *msg,
                    const char *cmd,
                    int compressor,
                    struct evbuffer *src,
                    size_t len,
                    bson_error_t *error) __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_PROXY_LOGIN_H */
