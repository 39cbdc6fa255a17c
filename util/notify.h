/*
 * notify.h - the service manager's readiness protocol (sd_notify(3)),
 * without libsystemd.
 *
 *   notify_send("READY=1\nSTATUS=serving");
 *
 * A service of Type=notify gets the address of systemd's socket in the
 * environment variable NOTIFY_SOCKET: a path ("/run/systemd/notify") or
 * an abstract name ("@..."). Each message is one datagram of
 * newline-separated VARIABLE=value lines (READY=1, STATUS=..., STOPPING=1,
 * MAINPID=...); systemd learns the sender's pid from the kernel.
 *
 * A library of its own (no libfuse): ferryfs and ferry-agent link it.
 * Thread-safe; every call opens and closes its own socket.
 */
#ifndef FERRYFS_NOTIFY_H
#define FERRYFS_NOTIFY_H

#include <stdbool.h>

/* Is NOTIFY_SOCKET set (to something non-empty)? */
bool notify_enabled(void);

/*
 * Send @msg as one datagram to the socket named by NOTIFY_SOCKET.
 * Returns 0 when sent, and 0 when NOTIFY_SOCKET is unset or empty
 * (nothing to tell). Errors: -EAFNOSUPPORT (an address neither "/..."
 * nor "@...", e.g. "vsock:"), -ENAMETOOLONG (longer than sun_path), and
 * those of socket(2) and sendto(2) (-ECONNREFUSED, -ENOENT, ...).
 */
int notify_send(const char *msg);

/* notify_send() of a printf(3)-formatted message; -ENOMEM too. */
int notify_sendf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* FERRYFS_NOTIFY_H */
