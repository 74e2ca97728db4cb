/*
 * publish/hooks.h - the wake-up that tells the process committed events wait.
 *
 * Thread: any (the hook is called on the forwarding loop).
 *
 * After a successful commitTransaction of a transaction the proxy injected
 * into, the forwarding loop calls the registered wake hook (typically
 * dispatch_wake) so the dispatcher claims at once instead of at its next
 * poll.  The hook must be thread-safe and must not block: it runs on the
 * forwarding loop.  Implemented in publish/publish.c.
 */
#ifndef RELAYBUS_PUBLISH_HOOKS_H
#define RELAYBUS_PUBLISH_HOOKS_H

typedef void (*publish_wake_fn) (void);

/* Registers the hook (NULL: none).  Any thread, at any time. */
void publish_set_wake_hook (publish_wake_fn fn);

#endif /* RELAYBUS_PUBLISH_HOOKS_H */
