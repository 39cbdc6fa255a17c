/*
 * test_notify.c - unit tests of util/notify.c, the sd_notify(3) datagram.
 *
 * Each case binds its own AF_UNIX datagram socket, a file in a fresh
 * mkdtemp() dir or an abstract name made from the pid, points
 * NOTIFY_SOCKET at it, sends and reads back what arrived (and with
 * SO_PASSCRED, who sent it, as systemd checks). Runs in milliseconds.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>

#include "notify.h"

#include "test_util.h"

struct fx {
	char tmp[PATH_MAX]; /* mkdtemp(); removed by teardown */
	char name[PATH_MAX]; /* what NOTIFY_SOCKET says */
	int fd; /* the receiving socket, or -1 */
};

static int setup(void **state)
{
	struct fx *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -1;
	snprintf(fx->tmp, sizeof(fx->tmp), "/tmp/ferryfs-notify.XXXXXX");
	if (!mkdtemp(fx->tmp)) {
		free(fx);
		return -1;
	}
	fx->fd = -1;
	unsetenv("NOTIFY_SOCKET");
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 16];

	if (fx->fd >= 0)
		close(fx->fd);
	snprintf(path, sizeof(path), "%s/notify", fx->tmp);
	unlink(path);
	rmdir(fx->tmp);
	unsetenv("NOTIFY_SOCKET");
	free(fx);
	return 0;
}

/* Bind the receiving socket to @name ("/path" or "@abstract") and export
 * it as NOTIFY_SOCKET. */
static void listen_on(struct fx *fx, const char *name)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = strlen(name);
	int one = 1;

	assert_true(n < sizeof(sa.sun_path));
	memcpy(sa.sun_path, name, n);
	if (name[0] == '@')
		sa.sun_path[0] = '\0';
	fx->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(fx->fd >= 0);
	assert_int_equal(setsockopt(fx->fd, SOL_SOCKET, SO_PASSCRED, &one,
				    sizeof(one)),
			 0);
	assert_int_equal(
		bind(fx->fd, (struct sockaddr *)&sa,
		     (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
				 (name[0] == '/'))),
		0);
	snprintf(fx->name, sizeof(fx->name), "%s", name);
	assert_int_equal(setenv("NOTIFY_SOCKET", name, 1), 0);
}

/* The next datagram, NUL-terminated in @buf, and its sender's pid. */
static void recv_one(struct fx *fx, char *buf, size_t size, pid_t *pid)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(struct ucred))];
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = size - 1 };
	struct msghdr m = { .msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = &ctl,
			    .msg_controllen = sizeof(ctl) };
	struct cmsghdr *c;
	ssize_t n = recvmsg(fx->fd, &m, MSG_DONTWAIT);

	if (n < 0)
		fail_msg("nothing arrived at '%s': %s", fx->name,
			 strerror(errno));
	buf[n] = '\0';
	*pid = 0;
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET &&
		    c->cmsg_type == SCM_CREDENTIALS) {
			struct ucred u;

			memcpy(&u, CMSG_DATA(c), sizeof(u));
			*pid = u.pid;
		}
}

static void assert_nothing_waiting(struct fx *fx)
{
	char b[16];

	assert_int_equal(recv(fx->fd, b, sizeof(b), MSG_DONTWAIT), -1);
	assert_int_equal(errno, EAGAIN);
}

/* --- cases ------------------------------------------------------------- */

static void test_notify__unset_is_a_noop(void **state)
{
	(void)state;
	assert_false(notify_enabled());
	assert_rc_ok(notify_send("READY=1"));
	setenv("NOTIFY_SOCKET", "", 1);
	assert_false(notify_enabled());
	assert_int_equal(notify_send("READY=1"), 0);
}

static void test_notify__path_socket(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 16], buf[256];
	pid_t pid;

	snprintf(path, sizeof(path), "%s/notify", fx->tmp);
	listen_on(fx, path);
	assert_true(notify_enabled());
	assert_rc_ok(notify_send("READY=1\nSTATUS=serving"));
	recv_one(fx, buf, sizeof(buf), &pid);
	assert_string_equal(buf, "READY=1\nSTATUS=serving");
	assert_int_equal(pid, getpid());
	assert_nothing_waiting(fx);
}

static void test_notify__abstract_socket(void **state)
{
	struct fx *fx = *state;
	char name[64], buf[256];
	pid_t pid;

	snprintf(name, sizeof(name), "@ferryfs-test-notify-%d", (int)getpid());
	listen_on(fx, name);
	assert_rc_ok(notify_send("STOPPING=1"));
	recv_one(fx, buf, sizeof(buf), &pid);
	assert_string_equal(buf, "STOPPING=1");
	assert_int_equal(pid, getpid());
}

static void test_notify__formatted_messages_in_order(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 16], buf[256];
	pid_t pid;

	snprintf(path, sizeof(path), "%s/notify", fx->tmp);
	listen_on(fx, path);
	assert_rc_ok(notify_sendf("STATUS=%llu bytes in %u files pending",
				  12345ULL, 6U));
	assert_rc_ok(notify_sendf("READY=1\nMAINPID=%d", 42));
	recv_one(fx, buf, sizeof(buf), &pid);
	assert_string_equal(buf, "STATUS=12345 bytes in 6 files pending");
	recv_one(fx, buf, sizeof(buf), &pid);
	assert_string_equal(buf, "READY=1\nMAINPID=42");
	assert_nothing_waiting(fx);
}

static void test_notify__bad_addresses(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 16], longname[200];

	(void)fx;
	setenv("NOTIFY_SOCKET", "vsock:2:1234", 1);
	assert_rc_err(notify_send("READY=1"), EAFNOSUPPORT);
	setenv("NOTIFY_SOCKET", "relative/notify", 1);
	assert_rc_err(notify_send("READY=1"), EAFNOSUPPORT);
	memset(longname, 'x', sizeof(longname) - 1);
	longname[0] = '/';
	longname[sizeof(longname) - 1] = '\0';
	setenv("NOTIFY_SOCKET", longname, 1);
	assert_rc_err(notify_send("READY=1"), ENAMETOOLONG);
	/* nobody listening there */
	snprintf(path, sizeof(path), "%s/nobody", fx->tmp);
	setenv("NOTIFY_SOCKET", path, 1);
	assert_rc_err(notify_send("READY=1"), ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_notify__unset_is_a_noop,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify__path_socket, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_notify__abstract_socket,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_notify__formatted_messages_in_order, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_notify__bad_addresses,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
