/*
 * ctl.c - the control socket of a mount, and its client.
 *
 * Each mount listens on a Unix stream socket named after the mount's device
 * number (from /proc/self/mountinfo, unique while mounted; MOUNTPOINT is
 * an absolute path without symlinks), ctl-<major>-<minor>.sock, in the
 * directory of its daemon's user:
 *   daemon run by root:   /run/ferryfs
 *   daemon run by a user: $XDG_RUNTIME_DIR/ferryfs when XDG_RUNTIME_DIR is
 *                         an absolute path to a directory of the user's
 *                         that no one else may enter, else
 *                         /tmp/ferryfs-<uid>
 * so `ferryfs status MOUNTPOINT` finds it without asking the daemon: the
 * mount's owner is its user_id= in mountinfo, and a client looks in
 * $XDG_RUNTIME_DIR/ferryfs (if it is that user), /run/user/<uid>/ferryfs,
 * then /tmp/ferryfs-<uid>.
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
 *  4. The daemon uses its directory only if it is a directory, not a
 *     symlink, owned by the daemon's euid, and not writable by group or
 *     others; made 0700 if it is not (ctl_dir_open(): lstat, then an
 *     O_NOFOLLOW | O_DIRECTORY open and fstat of the same inode). The
 *     socket is bound and unlinked through that fd, so the directory
 *     checked is the one used. Anything else is refused with one line
 *     that says why: another local user who made the directory first
 *     would otherwise answer for the mount.
 *  5. The client believes a reply only from a server whose SO_PEERCRED
 *     uid is the mount's owner or root (-EPERM otherwise): `flush --wait`
 *     answered "drained" by anyone else is not "safe to power off".
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <limits.h>
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
	int dirfd;              /* its directory (invariant 4); immutable */
	fs_ctl_handler handler; /* immutable */
	void *arg;              /* immutable */
	char name[64];          /* the socket's name in dirfd */
	char path[PATH_MAX + 64]; /* dir/name, for messages */
};

/* Is @dir an absolute path to a directory of @uid's that only it may
 * enter (the XDG base directory spec's rules for XDG_RUNTIME_DIR)? */
static bool runtime_dir_ok(const char *dir, uid_t uid)
{
	struct stat st;

	return dir && dir[0] == '/' && lstat(dir, &st) == 0 &&
	       S_ISDIR(st.st_mode) && st.st_uid == uid &&
	       !(st.st_mode & 077);
}

/* The directory of this daemon's control sockets (see the top). */
static int daemon_dir(char *buf, size_t size)
{
	uid_t uid = geteuid();
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (uid == 0)
		n = snprintf(buf, size, "/run/ferryfs");
	else if (runtime_dir_ok(xdg, uid))
		n = snprintf(buf, size, "%s/ferryfs", xdg);
	else
		n = snprintf(buf, size, "/tmp/ferryfs-%u", (unsigned)uid);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

#define CLIENT_DIRS 3

/* The directories a client looks in for a socket of @owner's daemon, in
 * order (see the top); returns how many. */
static int client_dirs(uid_t owner, char dirs[CLIENT_DIRS][PATH_MAX])
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n = 0;

	if (owner == 0) {
		snprintf(dirs[n++], PATH_MAX, "/run/ferryfs");
		return n;
	}
	if (geteuid() == owner && runtime_dir_ok(xdg, owner) &&
	    strlen(xdg) + sizeof("/ferryfs") <= PATH_MAX)
		snprintf(dirs[n++], PATH_MAX, "%s/ferryfs", xdg);
	snprintf(dirs[n], PATH_MAX, "/run/user/%u/ferryfs", (unsigned)owner);
	if (n == 0 || strcmp(dirs[0], dirs[n]))
		n++;
	snprintf(dirs[n++], PATH_MAX, "/tmp/ferryfs-%u", (unsigned)owner);
	return n;
}

/*
 * Make or check the daemon's directory @dir (invariant 4) and open it.
 * Returns the fd, or -errno with the reason in @why: -ELOOP (a symlink),
 * -ENOTDIR, -EPERM (another owner, or group or others may write in it),
 * what mkdir(2) and open(2) return.
 */
static int ctl_dir_open(const char *dir, char *why, size_t wsize)
{
	uid_t uid = geteuid();
	struct stat lst, st;
	int fd;

	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		int rc = -errno;

		snprintf(why, wsize, "cannot create '%s': %s", dir,
			 strerror(-rc));
		return rc;
	}
	if (lstat(dir, &lst) < 0) {
		int rc = -errno;

		snprintf(why, wsize, "cannot stat '%s': %s", dir,
			 strerror(-rc));
		return rc;
	}
	if (S_ISLNK(lst.st_mode) || !S_ISDIR(lst.st_mode)) {
		snprintf(why, wsize, "'%s' is %s: refused (remove it)", dir,
			 S_ISLNK(lst.st_mode) ? "a symlink" : "not a directory");
		return S_ISLNK(lst.st_mode) ? -ELOOP : -ENOTDIR;
	}
	/* owner and mode told apart before the open, which another's
	 * 0700 directory would refuse as just "Permission denied" */
	st = lst;
	fd = -1;
	if (st.st_uid == uid && !(st.st_mode & 022)) {
		fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			int rc = -errno;

			snprintf(why, wsize, "cannot open '%s': %s", dir,
				 strerror(-rc));
			return rc;
		}
		if (fstat(fd, &st) < 0 || st.st_dev != lst.st_dev ||
		    st.st_ino != lst.st_ino) {
			snprintf(why, wsize, "'%s' changed while it was "
					     "checked: refused", dir);
			close(fd);
			return -EAGAIN;
		}
	}
	if (st.st_uid != uid) {
		snprintf(why, wsize, "'%s' is owned by uid %u, not by uid %u: "
				     "refused (another user may answer for "
				     "this mount; remove it)",
			 dir, (unsigned)st.st_uid, (unsigned)uid);
		if (fd >= 0)
			close(fd);
		return -EPERM;
	}
	if (st.st_mode & 022) {
		snprintf(why, wsize, "'%s' may be written by others (mode "
				     "%04o): refused (remove it)",
			 dir, (unsigned)(st.st_mode & 07777));
		if (fd >= 0)
			close(fd);
		return -EPERM;
	}
	if ((st.st_mode & 07777) != 0700 && fchmod(fd, 0700) < 0) {
		int rc = -errno;

		snprintf(why, wsize, "cannot chmod '%s' to 0700: %s", dir,
			 strerror(-rc));
		close(fd);
		return rc;
	}
	return fd;
}

/* "/proc/self/fd/<dirfd>/<name>": a socket's address through the fd of
 * its directory (so the one checked, and short whatever the directory). */
static int fd_addr(int dirfd, const char *name, struct sockaddr_un *sa)
{
	int n = snprintf(sa->sun_path, sizeof(sa->sun_path),
			 "/proc/self/fd/%d/%s", dirfd, name);

	sa->sun_family = AF_UNIX;
	return n < 0 || (size_t)n >= sizeof(sa->sun_path) ? -ENAMETOOLONG : 0;
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

/* The socket's name for the mount at the absolute path @mnt, and the
 * mount's owner. Errors: -ENOENT (nothing mounted there). */
static int sock_name(const char *mnt, char name[64], uid_t *owner)
{
	unsigned int maj, min;
	int rc = mount_info(mnt, &maj, &min, owner);

	if (rc < 0)
		return rc;
	snprintf(name, 64, "ctl-%u-%u.sock", maj, min);
	return 0;
}

enum fs_ctl_cmd fs_ctl_parse(const char *line)
{
	static const struct {
		const char *word;
		enum fs_ctl_cmd cmd;
	} cmds[] = {
		{ "status", FS_CTL_STATUS },
		{ "flush", FS_CTL_FLUSH },
		{ "pause", FS_CTL_PAUSE },
		{ "resume", FS_CTL_RESUME },
	};

	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(line, cmds[i].word))
			return cmds[i].cmd;
	return FS_CTL_UNKNOWN;
}

int fs_ctl_read_line(int fd, char *buf, size_t size)
{
	size_t n = 0;

#if FUZZ_PLANT
	/* planted for tests/fuzz (fuzz_plant_ctl): no room for the NUL */
	while (n < size) {
		ssize_t r = read(fd, buf + n, size - n);
#else
	while (n + 1 < size) {
		ssize_t r = read(fd, buf + n, size - 1 - n);
#endif

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
	if (fs_ctl_read_line(cfd, cmd, sizeof(cmd)) <= 0)
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
		 struct fs_ctl **out, char *why, size_t wsize)
{
	struct sockaddr_un sa;
	struct fs_ctl *c = calloc(1, sizeof(*c));
	char dir[PATH_MAX];
	uid_t owner;
	int rc;

	*out = NULL;
	snprintf(why, wsize, "out of memory");
	if (!c)
		return -ENOMEM;
	c->fd = c->dirfd = -1;
	c->stop_pipe[0] = c->stop_pipe[1] = -1;
	c->handler = handler;
	c->arg = arg;
	rc = daemon_dir(dir, sizeof(dir));
	if (rc < 0) {
		snprintf(why, wsize, "the directory's name is too long");
		goto out_free;
	}
	rc = sock_name(mountpoint, c->name, &owner);
	if (rc < 0) {
		snprintf(why, wsize, "'%s' is not in /proc/self/mountinfo",
			 mountpoint);
		goto out_free;
	}
	snprintf(c->path, sizeof(c->path), "%s/%s", dir, c->name);
	rc = ctl_dir_open(dir, why, wsize); /* invariant 4 */
	if (rc < 0)
		goto out_free;
	c->dirfd = rc;
	rc = fd_addr(c->dirfd, c->name, &sa);
	if (rc < 0)
		goto out_close;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || pipe2(c->stop_pipe, O_CLOEXEC) < 0) {
		rc = -errno;
		goto out_close;
	}
	unlinkat(c->dirfd, c->name, 0); /* invariant 3: a stale socket */
	if (bind(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    fchmodat(c->dirfd, c->name, 0600, 0) < 0 || listen(c->fd, 16) < 0) {
		rc = -errno;
		goto out_unlink;
	}
	rc = -pthread_create(&c->thread, NULL, ctl_main, c);
	if (rc < 0)
		goto out_unlink;
	*out = c;
	why[0] = '\0';
	return 0;
out_unlink:
	unlinkat(c->dirfd, c->name, 0);
out_close:
	snprintf(why, wsize, "'%s': %s", c->path, strerror(-rc));
	if (c->fd >= 0)
		close(c->fd);
	if (c->stop_pipe[0] >= 0) {
		close(c->stop_pipe[0]);
		close(c->stop_pipe[1]);
	}
	close(c->dirfd);
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
	unlinkat(c->dirfd, c->name, 0);
	close(c->fd);
	close(c->dirfd);
	close(c->stop_pipe[0]);
	close(c->stop_pipe[1]);
	free(c);
}

int fs_ctl_read_reply(int fd, char **out)
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

/*
 * Connect to the socket @name of @owner's daemon: the first directory of
 * client_dirs() with a listener on it whose uid is @owner's or root's
 * (invariant 5). Returns the fd, or -ENOENT / -ECONNREFUSED (none
 * listens), -EPERM (only someone else does), other connect(2) errors.
 */
static int connect_owner(const char *name, uid_t owner)
{
	char dirs[CLIENT_DIRS][PATH_MAX];
	int n = client_dirs(owner, dirs), rc = -ENOENT, i;
	bool foreign = false;

	for (i = 0; i < n; i++) {
		struct sockaddr_un sa;
		struct ucred cred;
		socklen_t len = sizeof(cred);
		int dfd = open(dirs[i], O_PATH | O_DIRECTORY | O_CLOEXEC), fd;

		if (dfd < 0)
			continue;
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || fd_addr(dfd, name, &sa) < 0) {
			rc = fd < 0 ? -errno : -ENAMETOOLONG;
			if (fd >= 0)
				close(fd);
			close(dfd);
			return rc;
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			int e = -errno;

			close(fd);
			close(dfd);
			if (e != -ENOENT && e != -ECONNREFUSED)
				return e;
			if (rc == -ENOENT)
				rc = e;
			continue;
		}
		close(dfd);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
		    (cred.uid == owner || cred.uid == 0))
			return fd;
		close(fd); /* invariant 5: not to be believed */
		foreign = true;
	}
	return foreign ? -EPERM : rc;
}

int fs_ctl_call(const char *mountpoint, const char *cmd, char **reply)
{
	char line[128], name[64], *abs = realpath(mountpoint, NULL);
	uid_t owner;
	int fd, rc;

	*reply = NULL;
	if (!abs)
		return -errno;
	rc = sock_name(abs, name, &owner);
	free(abs);
	if (rc < 0)
		return rc;
	/* the mount is there (sock_name found it): a daemon just started
	 * opens its socket after its journal and flush streams, so give it
	 * up to 10 s (2 s were too few for it_crash_pt's last mount once, in
	 * CI under ASan beside two other tests) */
	for (int i = 0;; i++) {
		fd = connect_owner(name, owner);
		if (fd >= 0)
			break;
		if ((fd != -ENOENT && fd != -ECONNREFUSED) || i == 200)
			return fd;
		usleep(50000);
	}
	snprintf(line, sizeof(line), "%s\n", cmd);
	if (write(fd, line, strlen(line)) != (ssize_t)strlen(line)) {
		rc = -EIO;
		goto out_close;
	}
	rc = fs_ctl_read_reply(fd, reply);
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
