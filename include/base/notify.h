/*
 * base/notify.h - telling a service manager how the proxy is doing: the
 * sd_notify protocol of systemd (Type=notify), spoken directly so that the
 * proxy needs no libsystemd.
 *
 * Thread: notify_init and notify_close: the main thread, before and after
 * the loop; notify_send: any thread (one sendto, never blocking).
 *
 * Under systemd, NOTIFY_SOCKET names a datagram socket (a path, or an
 * abstract name starting with '@').  The proxy sends READY=1 once it
 * listens and knows the primary, RELOADING=1 and READY=1 around a SIGHUP
 * reload, STOPPING=1 when it starts to drain, and WATCHDOG=1 from the
 * forwarding loop every half WATCHDOG_USEC when the unit sets
 * WatchdogSec (so a loop that stopped turning is restarted).  Without
 * NOTIFY_SOCKET every call does nothing.
 */
#ifndef RELAYBUS_BASE_NOTIFY_H
#define RELAYBUS_BASE_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Reads NOTIFY_SOCKET and opens the socket.  False only for a variable
 * that names no usable socket (logged); no variable is not an error. */
bool notify_init (void);

/* Sends `state` ("READY=1", "STOPPING=1\nSTATUS=draining"...).  False when
 * there is no socket or the datagram could not be sent now. */
bool notify_send (const char *state);

/* True when a service manager listens. */
bool notify_enabled (void);

/* The watchdog interval in milliseconds (WATCHDOG_USEC, when WATCHDOG_PID
 * is unset or this process), 0 without one. */
int64_t notify_watchdog_ms (void);

void notify_close (void);

#endif /* RELAYBUS_BASE_NOTIFY_H */
