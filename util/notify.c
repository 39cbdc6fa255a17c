/*
 * notify.c - sd_notify(3) by hand: one datagram to $NOTIFY_SOCKET.
 *
 * Who calls it: fs/ready.c (READY=1 once the mount answers, STATUS= with
 * the pending bytes now and then, STOPPING=1) and agent/main.c (READY=1
 * once it listens). The address rules are systemd's: "/path" is a socket
 * file, "@name" an abstract socket (the '@' becomes the leading NUL and
 * the address length counts the name only, no terminating NUL).
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "notify.h"

bool notify_enabled(void)
{
	const char *e = getenv("NOTIFY_SOCKET");

	return e && e[0];
}

/* @name as a sockaddr_un; *len its length. Errors: see notify_send(). */
static int addr_of(const char *name, struct sockaddr_un *sa, socklen_t *len)
{
	size_t n = strlen(name);

	if (name[0] != '/' && name[0] != '@')
		return -EAFNOSUPPORT;
	if (n > sizeof(sa->sun_path) ||
	    (name[0] == '/' && n == sizeof(sa->sun_path)))
		return -ENAMETOOLONG;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, name, n);
	if (name[0] == '@')
		sa->sun_path[0] = '\0';
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
			   (name[0] == '/'));
	return 0;
}

int notify_send(const char *msg)
{
	const char *name = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa;
	socklen_t len;
	int fd, rc;

	if (!name || !name[0])
		return 0;
	rc = addr_of(name, &sa, &len);
	if (rc < 0)
		return rc;
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	rc = 0;
	if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
		   len) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

int notify_sendf(const char *fmt, ...)
{
	va_list ap;
	char *msg;
	int n, rc;

	va_start(ap, fmt);
	n = vasprintf(&msg, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -ENOMEM;
	rc = notify_send(msg);
	free(msg);
	return rc;
}
