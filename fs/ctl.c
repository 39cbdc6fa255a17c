/*
 * ctl.c - the control socket of a mount, and its client.
 *
 * Each mount listens on a Unix stream socket named after the mount's device
 * number (from /proc/self/mountinfo, unique while mounted; MOUNTPOINT is
 * an absolute path without symlinks):
 *   daemon run by root:  /run/ferryfs/ctl-<dev>.sock
 *   daemon run by a user: /tmp/ferryfs-<uid>/ctl-<dev>.sock (dir 0700)
 * so `ferryfs status MOUNTPOINT` finds it without asking the daemon.
 *
 * Protocol: the client connects, writes one command line ("status",
 * "flush", "pause", "resume"), and reads one reply: a JSON
 * object and a newline, then the server closes. Every reply has "ok" (true
 * or false) and, when false, "error". Replies are made by status.c's
 * writers and have no size bound (the status of 64 streams is ~20 KB).
 *
 * Invariants:
 *  1. Only the daemon's owner and root get an answer (SO_PEERCRED); anyone
 *     else is closed on without a reply. The socket file is 0600 too.
 *  2. One thread serves the socket; the handler runs on it and answers at
 *     once (`flush --wait` polls "status"): a slow handler would delay
 *     other clients, never the filesystem.
 *  3. fs_ctl_stop() unlinks the socket file; a stale file from a crashed
 *     daemon is replaced at start (the device number is reused only after
 *     the old mount is gone).
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "fs_i.h"
#include "log.h"

#define FS_CTL_REPLY_MAX (16u << 20) /* a client reads no more */

struct fs_ctl {
	int fd;                 /* listening socket; immutable */
	int stop_pipe[2];       /* written by fs_ctl_stop() */
	pthread_t thread;
	fs_ctl_handler handler; /* immutable */
	void *arg;              /* immutable */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static void ctl_dir(uid_t uid, char *buf, size_t size)
{
	if (uid == 0)
		snprintf(buf, size, "/run/ferryfs");
	else
		snprintf(buf, size, "/tmp/ferryfs-%u", (unsigned)uid);
}

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] && s[3]) {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 +
				      (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
}

/*
 * The device number of the topmost mount at the absolute path @mnt, and the
 * uid of its daemon (FUSE's user_id= option), from /proc/self/mountinfo: no
 * stat(2), so the daemon can ask before it serves requests. Errors:
 * -ENOENT (nothing mounted there).
 */
static int mount_info(const char *mnt, unsigned int *maj, unsigned int *min,
		      uid_t *owner)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char line[8192];
	int rc = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned int a, b;
		char point[4096];
		const char *uid;

		if (sscanf(line, "%*u %*u %u:%u %*s %4095s", &a, &b, point) != 3)
			continue;
		unescape(point);
		if (strcmp(point, mnt))
			continue;
		*maj = a;
		*min = b;
		uid = strstr(line, " - ");
		uid = uid ? strstr(uid, "user_id=") : NULL;
		*owner = uid ? (uid_t)strtoul(uid + 8, NULL, 10) : 0;
		rc = 0; /* keep going: the last one is on top */
	}
	fclose(f);
	return rc;
}

int fs_mount_dev(const char *mnt, unsigned int *maj, unsigned int *min)
{
	uid_t owner;

	return mount_info(mnt, maj, min, &owner);
}

static int ctl_path(const char *mnt, bool use_owner, uid_t owner, char *buf,
		    size_t size)
{
	unsigned int maj, min;
	uid_t mowner;
	char dir[64];
	int rc = mount_info(mnt, &maj, &min, &mowner);

	if (rc < 0)
		return rc;
	ctl_dir(use_owner ? owner : mowner, dir, sizeof(dir));
	if ((size_t)snprintf(buf, size, "%s/ctl-%u-%u.sock", dir, maj, min) >=
	    size)
		return -ENAMETOOLONG;
	return 0;
}

static int read_line(int fd, char *buf, size_t size)
{
	size_t n = 0;

	while (n + 1 < size) {
		ssize_t r = read(fd, buf + n, size - 1 - n);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break;
		n += (size_t)r;
		if (memchr(buf, '\n', n))
			break;
	}
	buf[n] = '\0';
	buf[strcspn(buf, "\r\n")] = '\0';
	return (int)n;
}

static int write_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void serve_one(struct fs_ctl *c, int cfd)
{
	struct timeval tmo = { .tv_sec = 5 };
	struct ucred cred;
	socklen_t len = sizeof(cred);
	char cmd[128], *reply = NULL;
	int rc;

	/* invariant 1 */
	if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 ||
	    (cred.uid != 0 && cred.uid != geteuid()))
		return;
	/* a client that says nothing (or reads nothing) does not hold the
	 * socket forever */
	setsockopt(cfd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof(tmo));
	setsockopt(cfd, SOL_SOCKET, SO_SNDTIMEO, &tmo, sizeof(tmo));
	if (read_line(cfd, cmd, sizeof(cmd)) <= 0)
		return;
	rc = c->handler(c->arg, cmd, &reply);
	if (rc < 0)
		reply = fs_reply_error(strerror(-rc));
	if (!reply)
		return; /* out of memory: closed without a reply */
	if (write_all(cfd, reply, strlen(reply)) == 0)
		(void)write_all(cfd, "\n", 1);
	free(reply);
}

static void *ctl_main(void *arg)
{
	struct fs_ctl *c = arg;
	struct pollfd pfd[2] = {
		{ .fd = c->fd, .events = POLLIN },
		{ .fd = c->stop_pipe[0], .events = POLLIN },
	};

	for (;;) {
		int cfd;

		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			LOG_ERR("control socket '%s' failed: %s", c->path,
				strerror(errno));
			break;
		}
		if (pfd[1].revents)
			break;
		cfd = accept4(c->fd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0)
			continue;
		serve_one(c, cfd);
		close(cfd);
	}
	return NULL;
}

int fs_ctl_start(const char *mountpoint, fs_ctl_handler handler, void *arg,
		 struct fs_ctl **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fs_ctl *c = calloc(1, sizeof(*c));
	char dir[64];
	int rc;

	*out = NULL;
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	c->stop_pipe[0] = c->stop_pipe[1] = -1;
	c->handler = handler;
	c->arg = arg;
	ctl_dir(geteuid(), dir, sizeof(dir));
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		rc = -errno;
		goto out_free;
	}
	rc = ctl_path(mountpoint, true, geteuid(), c->path, sizeof(c->path));
	if (rc < 0)
		goto out_free;
	memcpy(sa.sun_path, c->path, sizeof(sa.sun_path));
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || pipe2(c->stop_pipe, O_CLOEXEC) < 0) {
		rc = -errno;
		goto out_close;
	}
	unlink(c->path); /* invariant 3: a stale socket */
	if (bind(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    chmod(c->path, 0600) < 0 || listen(c->fd, 16) < 0) {
		rc = -errno;
		goto out_unlink;
	}
	rc = -pthread_create(&c->thread, NULL, ctl_main, c);
	if (rc < 0)
		goto out_unlink;
	*out = c;
	return 0;
out_unlink:
	unlink(c->path);
out_close:
	if (c->fd >= 0)
		close(c->fd);
	if (c->stop_pipe[0] >= 0) {
		close(c->stop_pipe[0]);
		close(c->stop_pipe[1]);
	}
out_free:
	free(c);
	return rc;
}

void fs_ctl_stop(struct fs_ctl *c)
{
	if (!c)
		return;
	if (write(c->stop_pipe[1], "x", 1) < 0)
		LOG_WARN("cannot stop the control thread: %s", strerror(errno));
	pthread_join(c->thread, NULL);
	unlink(c->path);
	close(c->fd);
	close(c->stop_pipe[0]);
	close(c->stop_pipe[1]);
	free(c);
}

/* The reply: up to its newline or the end of the stream, any length
 * (FS_CTL_REPLY_MAX at most); caller owns *out. */
static int read_reply(int fd, char **out)
{
	size_t n = 0, cap = 8192;
	char *buf = malloc(cap), *b;

	*out = NULL;
	if (!buf)
		return -ENOMEM;
	for (;;) {
		ssize_t r;

		if (cap - n < 4096) {
			if (cap >= FS_CTL_REPLY_MAX) {
				free(buf);
				return -EMSGSIZE;
			}
			b = realloc(buf, cap * 2);
			if (!b) {
				free(buf);
				return -ENOMEM;
			}
			buf = b;
			cap *= 2;
		}
		r = read(fd, buf + n, cap - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int rc = -errno;

			free(buf);
			return rc;
		}
		if (r == 0)
			break;
		if (memchr(buf + n, '\n', (size_t)r)) {
			n += (size_t)r;
			break;
		}
		n += (size_t)r;
	}
	buf[n] = '\0';
	buf[strcspn(buf, "\r\n")] = '\0';
	*out = buf;
	return (int)(n > INT32_MAX ? INT32_MAX : n);
}

int fs_ctl_call(const char *mountpoint, const char *cmd, char **reply)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char line[128], *abs = realpath(mountpoint, NULL);
	int fd, rc;

	*reply = NULL;
	if (!abs)
		return -errno;
	rc = ctl_path(abs, false, 0, sa.sun_path, sizeof(sa.sun_path));
	free(abs);
	if (rc < 0)
		return rc;
	/* the mount is there (ctl_path found it): a daemon just started
	 * opens its socket after its journal and flush streams, so give it
	 * up to 10 s (2 s were too few for it_crash_pt's last mount once, in
	 * CI under ASan beside two other tests) */
	for (int i = 0;; i++) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		rc = -errno;
		close(fd);
		if ((rc != -ENOENT && rc != -ECONNREFUSED) || i == 200)
			return rc;
		usleep(50000);
	}
	snprintf(line, sizeof(line), "%s\n", cmd);
	if (write(fd, line, strlen(line)) != (ssize_t)strlen(line)) {
		rc = -EIO;
		goto out_close;
	}
	rc = read_reply(fd, reply);
	if (rc == 0) {
		rc = -EACCES; /* closed without a reply: not ours to ask */
		free(*reply);
		*reply = NULL;
	}
out_close:
	close(fd);
	return rc < 0 ? rc : 0;
}

int fs_ctl_list(char mounts[][4096], int max)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char line[8192];
	int n = 0;

	if (!f)
		return -errno;
	while (n < max && fgets(line, sizeof(line), f)) {
		char point[4096];
		const char *sep = strstr(line, " - ");

		if (!sep || strncmp(sep, " - fuse.ferryfs ", 16))
			continue;
		if (sscanf(line, "%*u %*u %*s %*s %4095s", point) != 1)
			continue;
		unescape(point);
		memcpy(mounts[n++], point, sizeof(point));
	}
	fclose(f);
	return n;
}
