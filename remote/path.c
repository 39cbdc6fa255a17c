/*
 * path.c - the "path" driver: a share that is a directory of this host (a
 * kernel NFS or SMB mount, or a local disk).
 *
 * The share is held as one directory fd, p->rootfd, opened at rmt_path_open()
 * and never changed after, so one struct rmt serves all threads
 * (RMT_CAP_THREADSAFE) without a lock.
 *
 * Invariants:
 *  1. No name is ever resolved from anything but p->rootfd, and every
 *     multi-component resolution is an openat2(2) with RESOLVE_BENEATH |
 *     RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS (resolve()). A symlink in any
 *     component fails with -ELOOP; it is never followed. Mount points inside
 *     the share are crossed (no RESOLVE_NO_XDEV): a share may contain mounts.
 *  2. The last component of a name is acted on by an *at() call on its
 *     parent's fd (loc_get()) that does not follow it: fstatat and
 *     fchownat/utimensat with AT_SYMLINK_NOFOLLOW, linkat without
 *     AT_SYMLINK_FOLLOW, mkdirat/mknodat/symlinkat/unlinkat/renameat2/
 *     readlinkat which never follow a last component. The root "" is
 *     (rootfd, ".").
 *  3. Calls that have no no-follow *at() form (chmod, the xattr calls) act
 *     on an O_PATH|O_NOFOLLOW fd of the node through "/proc/self/fd/N"
 *     (libfuse passthrough_ll.c does the same): the kernel jumps to exactly
 *     that inode, so a name swapped for a symlink in between cannot redirect
 *     them. Through such a name, the *xattr() calls that follow act on a
 *     symlink itself, not its target; the l*xattr() ones would act on the
 *     /proc link, so they are not used. Without /proc, chmod by name
 *     returns -EOPNOTSUPP and RMT_CAP_XATTR is off.
 *  4. Every fd this file opens is O_CLOEXEC; every function returns 0, a
 *     byte count or an offset, or -errno; errno is read only right after the
 *     call that set it.
 *  5. No fd of a struct pfile has O_APPEND or O_NONBLOCK: offsets are
 *     explicit (remote.h), and pwrite(2) on an O_APPEND fd ignores them.
 *
 * A file is opened with O_NONBLOCK, checked to be a regular file, then the
 * flag is cleared (path_file_open()), so a fifo put in place of a file by
 * another writer of the share fails with -EINVAL instead of blocking a
 * thread. A lease held by another process (-EWOULDBLOCK) is waited for as
 * open(2) waits (open_nonblock_first()).
 *
 * Needs Linux >= 5.6 (openat2); rmt_path_open() fails with -ENOSYS without
 * it. Needs /proc for chmod by name and xattrs (invariant 3).
 *
 * Called only through remote.c, which has checked every path
 * (rmt_path_check()): no empty, "." or ".." component, no leading or
 * trailing '/', shorter than PATH_MAX.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <linux/openat2.h>

#include "log.h"
#include "remote_i.h"
#include "sys.h"

#define RESOLVE_FLAGS \
	(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)

/* copy_file_range() chunk: bounded so one call never runs for minutes. */
#define COPY_CHUNK ((size_t)1 << 30)

/* "/proc/self/fd/" and an int */
#define PROC_FD_MAX 32

struct prmt {
	struct rmt base; /* first: remote.c sees only this */
	int rootfd; /* O_RDONLY|O_DIRECTORY of the share root; immutable */
	bool proc; /* /proc/self/fd/N reaches our fds; immutable */
};

struct pfile {
	struct rmt_file base; /* first */
	int fd; /* regular file, no O_APPEND/O_NONBLOCK */
};

/* The parent directory of a name and its last component (invariant 2). */
struct loc {
	int dirfd; /* p->rootfd or an fd owned by the loc */
	const char *name; /* points into the caller's path, or "." */
};

static struct prmt *to_prmt(struct rmt *r)
{
	return (struct prmt *)r;
}

static struct pfile *to_pfile(struct rmt_file *f)
{
	return (struct pfile *)f;
}

static const struct pfile *to_cpfile(const struct rmt_file *f)
{
	return (const struct pfile *)f;
}

/*
 * openat2(rootfd, path, flags) under invariant 1. @mode is used only with
 * O_CREAT (openat2 refuses a mode otherwise). Returns the fd or -errno.
 */
static int resolve_at(int rootfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
		.flags = (unsigned int)(flags | O_CLOEXEC | O_LARGEFILE),
		.mode = (flags & O_CREAT) ? (mode & 07777) : 0,
		.resolve = RESOLVE_FLAGS,
	};

	/* no EAGAIN retry: RESOLVE_BENEATH returns it only for ".." */
	for (;;) {
		long fd = syscall(SYS_openat2, rootfd, *path ? path : ".", &how,
				  sizeof(how));
		if (fd >= 0)
			return (int)fd;
		if (errno != EINTR)
			return -errno;
	}
}

static int resolve(struct prmt *p, const char *path, int flags, mode_t mode)
{
	return resolve_at(p->rootfd, path, flags, mode);
}

/* Fill l for path; release with loc_put(). Returns 0 or -errno. */
static int loc_get(struct prmt *p, const char *path, struct loc *l)
{
	const char *slash = strrchr(path, '/');
	char parent[PATH_MAX];
	size_t n;
	int fd;

	l->dirfd = p->rootfd;
	if (!*path) {
		l->name = ".";
		return 0;
	}
	if (!slash) {
		l->name = path;
		return 0;
	}
	n = (size_t)(slash - path);
	if (n >= sizeof(parent))
		return -ENAMETOOLONG;
	memcpy(parent, path, n);
	parent[n] = '\0';
	fd = resolve(p, parent, O_PATH | O_DIRECTORY, 0);
	if (fd < 0)
		return fd;
	l->dirfd = fd;
	l->name = slash + 1;
	return 0;
}

static void loc_put(struct prmt *p, struct loc *l)
{
	if (l->dirfd != p->rootfd)
		close(l->dirfd);
	l->dirfd = -1;
}

/* An O_PATH fd of the node at path itself, a symlink included. */
static int open_node(struct prmt *p, const char *path)
{
	return resolve(p, path, O_PATH | O_NOFOLLOW, 0);
}

static void proc_name(char *buf, int fd)
{
	snprintf(buf, PROC_FD_MAX, "/proc/self/fd/%d", fd);
}

/* --- the share --------------------------------------------------------- */

/* Is openat2(2) there (Linux >= 5.6, and not refused by a seccomp filter)? */
static int probe_openat2(int rootfd)
{
	int fd = resolve_at(rootfd, "", O_PATH | O_DIRECTORY, 0);

	if (fd < 0)
		return (fd == -ENOSYS || fd == -EPERM) ? -ENOSYS : fd;
	close(fd);
	return 0;
}

/* Does /proc/self/fd/<rootfd> name our root (invariant 3)? */
static bool probe_proc(int rootfd)
{
	char name[PROC_FD_MAX];
	struct stat a, b;

	proc_name(name, rootfd);
	if (stat(name, &a) < 0 || fstat(rootfd, &b) < 0)
		return false;
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Are user.* xattrs stored at the root? Only -EOPNOTSUPP says no. */
static bool probe_xattr(int rootfd)
{
	char name[PROC_FD_MAX];

	proc_name(name, rootfd);
	if (getxattr(name, "user.ferryfs.probe", NULL, 0) >= 0)
		return true;
	return errno != EOPNOTSUPP;
}

static const struct rmt_ops path_ops;

/* Is the share a network (or FUSE) filesystem, whose close(2) can report
 * write errors late (RMT_CAP_CLOSE_ERRORS), and whose reads are worth the
 * block cache (no RMT_CAP_LOCAL)? Unknown types count as network: flushing
 * costs a round trip, a lost error costs data; a cache costs disk space. */
static bool on_network_fs(int fd)
{
	struct statfs sf;

	if (fstatfs(fd, &sf) < 0)
		return true;
	switch ((unsigned long)sf.f_type) {
	case 0xEF53:     /* ext2/3/4 */
	case 0x58465342: /* xfs */
	case 0x9123683E: /* btrfs */
	case 0x01021994: /* tmpfs */
	case 0x2FC12FC1: /* zfs */
	case 0xF2F52010: /* f2fs */
	case 0x3153464A: /* jfs */
	case 0x52654973: /* reiserfs */
	case 0x4d44:     /* vfat */
	case 0x2011BAB0: /* exfat */
	case 0x5346544e: /* ntfs */
	case 0x7366746e: /* ntfs3 */
	case 0x794c7630: /* overlayfs */
		return false;
	default:
		return true;
	}
}

int rmt_path_open(const char *dir, const char *opts, struct rmt **out)
{
	struct prmt *p;
	char *real;
	size_t len;
	int fd, rc;

	*out = NULL;
	if (opts && *opts)
		return -EINVAL; /* no options yet */
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	rc = probe_openat2(fd);
	if (rc < 0) {
		if (rc == -ENOSYS)
			LOG_ERR("cannot open remote '%s': openat2(2) is not available (Linux >= 5.6 needed)",
				dir);
		goto out_close;
	}
	real = realpath(dir, NULL);
	if (!real) {
		rc = -errno;
		goto out_close;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		rc = -ENOMEM;
		goto out_real;
	}
	len = strlen(real);
	p->base.id = malloc(sizeof("path:") + len);
	if (!p->base.id) {
		rc = -ENOMEM;
		goto out_p;
	}
	memcpy(p->base.id, "path:", sizeof("path:") - 1);
	memcpy(p->base.id + sizeof("path:") - 1, real, len + 1);
	free(real);

	p->base.ops = &path_ops;
	p->rootfd = fd;
	p->proc = probe_proc(fd);
	p->base.caps = RMT_CAP_THREADSAFE | RMT_CAP_FD | RMT_CAPS_POSIX;
	p->base.caps |= on_network_fs(p->rootfd) ? RMT_CAP_CLOSE_ERRORS
						 : RMT_CAP_LOCAL;
	if (p->proc && probe_xattr(fd))
		p->base.caps |= RMT_CAP_XATTR;
	*out = &p->base;
	return 0;

out_p:
	free(p);
out_real:
	free(real);
out_close:
	close(fd);
	return rc;
}

/* remote.c frees r->id after this. */
static void path_close(struct rmt *r)
{
	struct prmt *p = to_prmt(r);

	close(p->rootfd);
	free(p);
}

static int path_statfs(struct rmt *r, struct statvfs *sv)
{
	if (fstatvfs(to_prmt(r)->rootfd, sv) < 0)
		return -errno;
	return 0;
}

/* --- names ------------------------------------------------------------- */

static int path_stat(struct rmt *r, const char *path, struct stat *st)
{
	struct prmt *p = to_prmt(r);
	struct loc l;
	int rc;

	rc = loc_get(p, path, &l);
	if (rc < 0)
		return rc;
	if (fstatat(l.dirfd, l.name, st, AT_SYMLINK_NOFOLLOW) < 0)
		rc = -errno;
	loc_put(p, &l);
	return rc;
}

static int path_readdir(struct rmt *r, const char *path, rmt_dirent_fn fn,
			void *arg)
{
	struct dirent *de;
	struct stat st;
	int fd, rc = 0;
	DIR *d;

	fd = resolve(to_prmt(r), path, O_RDONLY | O_DIRECTORY, 0);
	if (fd < 0)
		return fd;
	d = fdopendir(fd);
	if (!d) {
		rc = -errno;
		close(fd);
		return rc;
	}
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de) {
			rc = -errno; /* 0 at the end */
			break;
		}
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		/* one component below an fd of ours: nothing to follow */
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) <
		    0) {
			if (errno != ENOENT) {
				rc = -errno;
				break;
			}
			rc = fn(de->d_name, NULL, arg);
		} else {
			rc = fn(de->d_name, &st, arg);
		}
		if (rc < 0)
			break;
		rc = 0;
	}
	closedir(d);
	return rc;
}

static int path_mkdir(struct rmt *r, const char *path, mode_t mode)
{
	struct prmt *p = to_prmt(r);
	struct loc l;
	int rc;

	rc = loc_get(p, path, &l);
	if (rc < 0)
		return rc;
	if (mkdirat(l.dirfd, l.name, mode & 07777) < 0)
		rc = -errno;
	loc_put(p, &l);
	return rc;
}

static int path_rmdir(struct rmt *r, const char *path)
{
	struct prmt *p = to_prmt(r);
	struct loc l;
	int rc;

	rc = loc_get(p, path, &l);
	if (rc < 0)
		return rc;
	if (unlinkat(l.dirfd, l.name, AT_REMOVEDIR) < 0)
		rc = -errno;
	loc_put(p, &l);
	return rc;
}

static int path_unlink(struct rmt *r, const char *path)
{
	struct prmt *p = to_prmt(r);
	struct loc l;
	int rc;

	rc = loc_get(p, path, &l);
	if (rc < 0)
		return rc;
	if (unlinkat(l.dirfd, l.name, 0) < 0)
		rc = -errno;
	loc_put(p, &l);
	return rc;
}

static int path_mknod(struct rmt *r, const char *path, mode_t mode, dev_t rdev)
{
	struct prmt *p = to_prmt(r);
	struct loc l;
	int rc;

	(void)rdev; /* fifos and sockets have none */
	if (!S_ISFIFO(mode) && !S_ISSOCK(mode))
		return -EPERM;
	rc = loc_get(p, path, &l);
	if (rc < 0)
		return rc;
	if (mknodat(l.dirfd, l.name, mode & (S_IFMT | 07777), 0) < 0)
		rc = -errno;
	loc_put(p, &l);
	return rc;
}

/* The target is data: stored verbatim, never resolved here. */
static int path_symlink(struct rmt *r, const char *target, const char *path)
{
	struct prmt *p = to_prmt(r);
	struct loc l;
	int rc;

	rc = loc_get(p, path, &l);
	if (rc < 0)
		return rc;
	if (symlinkat(target, l.dirfd, l.name) < 0)
		rc = -errno;
	loc_put(p, &l);
	return rc;
}

static int path_readlink(struct rmt *r, const char *path, char *buf,
			 size_t size)
{
	struct prmt *p = to_prmt(r);
	struct loc l;
	ssize_t n;
	int rc;

	rc = loc_get(p, path, &l);
	if (rc < 0)
		return rc;
	n = readlinkat(l.dirfd, l.name, buf, size);
	if (n < 0)
		rc = -errno;
	else if ((size_t)n >= size)
		rc = -ENAMETOOLONG; /* no room for the NUL: maybe cut */
	else {
		buf[n] = '\0';
		rc = (int)n;
	}
	loc_put(p, &l);
	return rc;
}

static int path_link(struct rmt *r, const char *from, const char *to)
{
	struct prmt *p = to_prmt(r);
	struct loc lf, lt;
	int rc;

	rc = loc_get(p, from, &lf);
	if (rc < 0)
		return rc;
	rc = loc_get(p, to, &lt);
	if (rc < 0)
		goto out_from;
	/* no AT_SYMLINK_FOLLOW: a symlink is linked, not its target */
	if (linkat(lf.dirfd, lf.name, lt.dirfd, lt.name, 0) < 0)
		rc = -errno;
	loc_put(p, &lt);
out_from:
	loc_put(p, &lf);
	return rc;
}

static int path_rename(struct rmt *r, const char *from, const char *to,
		       unsigned int flags)
{
	struct prmt *p = to_prmt(r);
	unsigned int kflags = 0;
	struct loc lf, lt;
	int rc;

	if (flags & RMT_RENAME_NOREPLACE)
		kflags |= RENAME_NOREPLACE;
	if (flags & RMT_RENAME_EXCHANGE)
		kflags |= RENAME_EXCHANGE;
	rc = loc_get(p, from, &lf);
	if (rc < 0)
		return rc;
	rc = loc_get(p, to, &lt);
	if (rc < 0)
		goto out_from;
	if (renameat2(lf.dirfd, lf.name, lt.dirfd, lt.name, kflags) < 0)
		rc = -errno;
	loc_put(p, &lt);
out_from:
	loc_put(p, &lf);
	return rc;
}

static void times_of(const struct rmt_setattr *sa, struct timespec ts[2])
{
	ts[0].tv_sec = 0;
	ts[0].tv_nsec = UTIME_OMIT;
	ts[1] = ts[0];
	if (sa->set & RMT_SET_ATIME)
		ts[0] = sa->atime;
	if (sa->set & RMT_SET_MTIME)
		ts[1] = sa->mtime;
}

/* remote.h order: size, uid/gid, mode, times. */
static int setattr_fd(int fd, const struct rmt_setattr *sa)
{
	struct timespec ts[2];

	if ((sa->set & RMT_SET_SIZE) && ftruncate(fd, sa->size) < 0)
		return -errno;
	if (sa->set & (RMT_SET_UID | RMT_SET_GID)) {
		uid_t uid = (sa->set & RMT_SET_UID) ? sa->uid : (uid_t)-1;
		gid_t gid = (sa->set & RMT_SET_GID) ? sa->gid : (gid_t)-1;

		if (fchown(fd, uid, gid) < 0)
			return -errno;
	}
	if ((sa->set & RMT_SET_MODE) && fchmod(fd, sa->mode & 07777) < 0)
		return -errno;
	if (sa->set & (RMT_SET_ATIME | RMT_SET_MTIME)) {
		times_of(sa, ts);
		if (futimens(fd, ts) < 0)
			return -errno;
	}
	return 0;
}

/* Truncate the regular file at l, never following it. */
static int truncate_at(const struct loc *l, off_t size)
{
	int flags = O_WRONLY | O_NOFOLLOW | O_CLOEXEC;
	struct stat st;
	int fd, rc = 0;

	/* O_NONBLOCK: see open_file_fd() */
	fd = openat(l->dirfd, l->name, flags | O_NONBLOCK);
	if (fd < 0 && errno == EWOULDBLOCK)
		fd = openat(l->dirfd, l->name, flags);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0)
		rc = -errno;
	else if (!S_ISREG(st.st_mode))
		rc = -EINVAL;
	else if (ftruncate(fd, size) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* chmod the node behind an O_PATH fd (invariant 3); not a symlink. */
static int chmod_node(struct prmt *p, int nodefd, mode_t mode)
{
	char name[PROC_FD_MAX];

	if (!p->proc)
		return -EOPNOTSUPP;
	proc_name(name, nodefd);
	if (chmod(name, mode & 07777) < 0)
		return -errno;
	return 0;
}

static int setattr_path(struct prmt *p, const char *path,
			const struct rmt_setattr *sa)
{
	struct timespec ts[2];
	struct stat st;
	struct loc l;
	int nodefd, rc;

	rc = loc_get(p, path, &l);
	if (rc < 0)
		return rc;
	/* one component below l.dirfd: nothing to follow */
	nodefd = openat(l.dirfd, l.name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (nodefd < 0) {
		rc = -errno;
		goto out_loc;
	}
	if (fstat(nodefd, &st) < 0) {
		rc = -errno;
		goto out_node;
	}
	if (sa->set & RMT_SET_SIZE) {
		if (S_ISDIR(st.st_mode))
			rc = -EISDIR;
		else if (!S_ISREG(st.st_mode))
			rc = -EINVAL;
		else
			rc = truncate_at(&l, sa->size);
		if (rc < 0)
			goto out_node;
	}
	if ((sa->set & RMT_SET_MODE) && S_ISLNK(st.st_mode)) {
		rc = -EOPNOTSUPP;
		goto out_node;
	}
	if (sa->set & (RMT_SET_UID | RMT_SET_GID)) {
		uid_t uid = (sa->set & RMT_SET_UID) ? sa->uid : (uid_t)-1;
		gid_t gid = (sa->set & RMT_SET_GID) ? sa->gid : (gid_t)-1;

		if (fchownat(l.dirfd, l.name, uid, gid, AT_SYMLINK_NOFOLLOW) <
		    0) {
			rc = -errno;
			goto out_node;
		}
	}
	if (sa->set & RMT_SET_MODE) {
		rc = chmod_node(p, nodefd, sa->mode);
		if (rc < 0)
			goto out_node;
	}
	if (sa->set & (RMT_SET_ATIME | RMT_SET_MTIME)) {
		times_of(sa, ts);
		if (utimensat(l.dirfd, l.name, ts, AT_SYMLINK_NOFOLLOW) < 0)
			rc = -errno;
	}
out_node:
	close(nodefd);
out_loc:
	loc_put(p, &l);
	return rc;
}

static int path_setattr(struct rmt *r, const char *path, struct rmt_file *f,
			const struct rmt_setattr *sa)
{
	if (f)
		return setattr_fd(to_pfile(f)->fd, sa);
	return setattr_path(to_prmt(r), path, sa);
}

/*
 * The xattr calls: on an O_PATH fd of the node, through /proc (invariant 3).
 * Only reached with RMT_CAP_XATTR, so p->proc holds.
 */
static ssize_t path_getxattr(struct rmt *r, const char *path, const char *name,
			     void *buf, size_t size)
{
	char proc[PROC_FD_MAX];
	ssize_t n;
	int fd;

	fd = open_node(to_prmt(r), path);
	if (fd < 0)
		return fd;
	proc_name(proc, fd);
	n = getxattr(proc, name, buf, size);
	if (n < 0)
		n = -errno;
	close(fd);
	return n;
}

static int path_setxattr(struct rmt *r, const char *path, const char *name,
			 const void *value, size_t size, int flags)
{
	char proc[PROC_FD_MAX];
	int fd, rc = 0;

	fd = open_node(to_prmt(r), path);
	if (fd < 0)
		return fd;
	proc_name(proc, fd);
	if (setxattr(proc, name, value, size, flags) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

static ssize_t path_listxattr(struct rmt *r, const char *path, char *buf,
			      size_t size)
{
	char proc[PROC_FD_MAX];
	ssize_t n;
	int fd;

	fd = open_node(to_prmt(r), path);
	if (fd < 0)
		return fd;
	proc_name(proc, fd);
	n = listxattr(proc, buf, size);
	if (n < 0)
		n = -errno;
	close(fd);
	return n;
}

static int path_removexattr(struct rmt *r, const char *path, const char *name)
{
	char proc[PROC_FD_MAX];
	int fd, rc = 0;

	fd = open_node(to_prmt(r), path);
	if (fd < 0)
		return fd;
	proc_name(proc, fd);
	if (removexattr(proc, name) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* --- files ------------------------------------------------------------- */

/*
 * O_NONBLOCK keeps a fifo from blocking the open. On a regular file it
 * fails only where another process (e.g. Samba next to the share) holds a
 * lease: then open again without it and wait for the lease break as open(2)
 * does.
 */
static int open_nonblock_first(struct prmt *p, const char *path, int flags,
			       mode_t mode)
{
	int fd = resolve(p, path, flags | O_NONBLOCK, mode);

	if (fd == -EWOULDBLOCK)
		fd = resolve(p, path, flags, mode);
	return fd;
}

/*
 * Open with the caller's access mode, but O_RDWR for O_WRONLY where the
 * file allows it (fs/ may read through a write handle); never O_APPEND
 * (invariant 5). Returns the fd or -errno.
 */
static int open_file_fd(struct prmt *p, const char *path, int flags,
			mode_t mode)
{
	int acc = flags & O_ACCMODE;
	int oflags = (flags & (O_CREAT | O_EXCL | O_TRUNC)) | O_NOFOLLOW;
	int fd;

	if (acc == O_WRONLY) {
		fd = open_nonblock_first(p, path, oflags | O_RDWR, mode);
		if (fd != -EACCES)
			return fd;
	}
	return open_nonblock_first(p, path, oflags | acc, mode);
}

static int path_file_open(struct rmt *r, const char *path, int flags,
			  mode_t mode, struct rmt_file **out)
{
	struct pfile *pf;
	struct stat st;
	int fd, rc;

	if ((flags & O_ACCMODE) == O_ACCMODE)
		return -EINVAL;
	fd = open_file_fd(to_prmt(r), path, flags, mode);
	if (fd < 0)
		return fd;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		goto out_close;
	}
	/* clears O_NONBLOCK; O_APPEND was never set (invariant 5) */
	if (fcntl(fd, F_SETFL, 0) < 0) {
		rc = -errno;
		goto out_close;
	}
	pf = calloc(1, sizeof(*pf));
	if (!pf) {
		rc = -ENOMEM;
		goto out_close;
	}
	pf->base.r = r;
	pf->fd = fd;
	*out = &pf->base;
	return 0;

out_close:
	close(fd);
	return rc;
}

static int path_file_close(struct rmt_file *f)
{
	struct pfile *pf = to_pfile(f);
	int rc = sys_close(pf->fd);

	free(pf);
	return rc;
}

static ssize_t path_file_pread(struct rmt_file *f, void *buf, size_t len,
			       off_t off)
{
	return sys_pread_all(to_pfile(f)->fd, buf, len, off);
}

static ssize_t path_file_pwrite(struct rmt_file *f, const void *buf, size_t len,
				off_t off)
{
	return sys_pwrite_all(to_pfile(f)->fd, buf, len, off);
}

static int path_file_stat(struct rmt_file *f, struct stat *st)
{
	if (fstat(to_pfile(f)->fd, st) < 0)
		return -errno;
	return 0;
}

static int path_file_fsync(struct rmt_file *f, bool datasync)
{
	int fd = to_pfile(f)->fd;
	int rc = datasync ? fdatasync(fd) : fsync(fd);

	return rc < 0 ? -errno : 0;
}

static int path_file_fallocate(struct rmt_file *f, int mode, off_t off,
			       off_t len)
{
	if (fallocate(to_pfile(f)->fd, mode, off, len) < 0)
		return -errno;
	return 0;
}

/* The fd's position is never used for I/O, so moving it here is harmless. */
static off_t path_file_seek(struct rmt_file *f, off_t off, int whence)
{
	off_t res;

	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return -EINVAL;
	res = lseek(to_pfile(f)->fd, off, whence);
	return res < 0 ? -errno : res;
}

/*
 * copy_file_range(2) until len or the source's EOF. Any error is returned
 * as is, even after some bytes were copied: a short count would read as EOF.
 * remote.c then falls back to its read/write loop for -EXDEV, -EOPNOTSUPP,
 * -ENOSYS and -EINVAL, which rewrites the same bytes at the same offsets.
 */
static ssize_t path_file_copy(struct rmt_file *in, off_t off_in,
			      struct rmt_file *out, off_t off_out, size_t len)
{
	int ifd = to_pfile(in)->fd, ofd = to_pfile(out)->fd;
	loff_t oi = off_in, oo = off_out;
	size_t done = 0;

	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	while (done < len) {
		size_t want = len - done < COPY_CHUNK ? len - done : COPY_CHUNK;
		ssize_t n = copy_file_range(ifd, &oi, ofd, &oo, want, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

static int path_file_fd(const struct rmt_file *f)
{
	return to_cpfile(f)->fd;
}

/*
 * close(2) of a duplicate: a kernel NFS or SMB mount below reports deferred
 * write errors at close, while our own fd stays open (as libfuse's
 * passthrough examples do on flush).
 */
static int path_file_flush(struct rmt_file *f)
{
	int fd = fcntl(to_pfile(f)->fd, F_DUPFD_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	return sys_close(fd);
}

static int path_syncdir(struct rmt *r, const char *path)
{
	int fd = resolve(to_prmt(r), path, O_RDONLY | O_DIRECTORY, 0);
	int rc = 0;

	if (fd < 0)
		return fd;
	if (fsync(fd) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

static const struct rmt_ops path_ops = {
	.name = "path",
	.close = path_close,
	.stat = path_stat,
	.statfs = path_statfs,
	.readdir = path_readdir,
	.mkdir = path_mkdir,
	.rmdir = path_rmdir,
	.unlink = path_unlink,
	.mknod = path_mknod,
	.symlink = path_symlink,
	.readlink = path_readlink,
	.link = path_link,
	.rename = path_rename,
	.setattr = path_setattr,
	.getxattr = path_getxattr,
	.setxattr = path_setxattr,
	.listxattr = path_listxattr,
	.removexattr = path_removexattr,
	.file_open = path_file_open,
	.file_close = path_file_close,
	.file_pread = path_file_pread,
	.file_pwrite = path_file_pwrite,
	.file_stat = path_file_stat,
	.file_fsync = path_file_fsync,
	.file_fallocate = path_file_fallocate,
	.file_seek = path_file_seek,
	.file_copy = path_file_copy,
	.file_fd = path_file_fd,
	.file_flush = path_file_flush,
	.syncdir = path_syncdir,
};
