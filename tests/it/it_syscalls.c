/*
 * it_syscalls.c - syscall-level integration test of a ferryfs mount.
 *
 * Run by tests/it/mount_run.sh, which mounts a fresh ferryfs over an empty
 * backing directory and exports MNT (the mount point) and REMOTE (the
 * directory the "path" driver writes to). Each check goes through MNT and,
 * where the share's copy matters, looks at REMOTE directly too: the mount is
 * only right if the share ends up with the bytes, mode, owner and times the
 * application asked for.
 *
 * Model: libfuse test/test_syscalls.c. Every check prints one TAP-like line,
 * "ok N - name" or "not ok N - name: detail"; the last line is
 * "N passed, M failed". Exit 0 if nothing failed, 1 otherwise, 77 to skip
 * (not root, or MNT/REMOTE unset).
 *
 * Needs root: chown, and fork + setresuid to other users (1000, 65534) whose
 * requests the kernel checks itself (ferryfs mounts with default_permissions
 * when run as root). umask is 0 so that modes are what the test asked for.
 *
 * Every section works on its own names below MNT, so a failed setup only
 * costs that section. Names are fixed, as the mount is fresh for each run.
 *
 * Sections, in order (t_*): mount root; lookup/getattr incl. st_ino after
 * the kernel forgets the inode (writes /proc/sys/vm/drop_caches, machine
 * wide); setattr (chmod, chown, lchown, truncate, ftruncate, utimensat with
 * ns, UTIME_NOW/UTIME_OMIT, symlink times, mtime on write); readdir (d_type,
 * d_ino, 2000 entries via readdir and 512-byte getdents64, seekdir/telldir);
 * mkdir/rmdir; create/open flags and umask; read/write (16 MiB checksum,
 * unaligned pwrite model, holes, 5 GiB offset); fsync family; unlink incl.
 * open-unlinked files; rename incl. NOREPLACE/EXCHANGE and inode-table
 * follow-up (chmod after rename reaches the right remote file); link;
 * symlink/readlink; mknod; statfs; user xattrs; fallocate; SEEK_DATA/HOLE
 * against the backing fs's own answer; copy_file_range; flock and fcntl
 * locks against a child; shared mmap; errno of failing calls; permission
 * checks as 65534 and 1000; ownership and setgid dirs; set-id bits cleared;
 * ENOSPC (mounts a 1 MiB tmpfs inside REMOTE); odd byte names; a tree deeper
 * than PATH_MAX; threads: parallel writers, O_EXCL race, rename storm;
 * another writer changing REMOTE (close-to-open, DESIGN.md "Reads").
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define KiB (1024L)
#define MiB (1024L * 1024L)
#define GiB (1024L * 1024L * 1024L)

#define USER_UID 1000
#define USER_GID 1000
#define NOBODY 65534
#define OTHER_GID 2000

static const char *mnt_root;
static const char *remote_root;
static int n_pass;
static int n_fail;
static int n_skip;

/* ---- reporting ---------------------------------------------------------- */

static const char *ename(int e)
{
	const char *s = e ? strerrorname_np(e) : "success";

	return s ? s : "E?";
}

__attribute__((format(printf, 3, 0)))
static void vreport(bool good, const char *name, const char *fmt, va_list ap)
{
	int n = n_pass + n_fail + n_skip + 1;

	if (good) {
		n_pass++;
		printf("ok %d - %s\n", n, name);
	} else {
		n_fail++;
		printf("not ok %d - %s: ", n, name);
		vprintf(fmt, ap);
		putchar('\n');
	}
	fflush(stdout);
}

/* Reports one check; returns cond so that callers can stop early. */
__attribute__((format(printf, 3, 4)))
static bool check(bool cond, const char *name, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vreport(cond, name, fmt, ap);
	va_end(ap);
	return cond;
}

static void skip(const char *name, const char *why)
{
	n_skip++;
	printf("ok %d - %s # SKIP %s\n", n_pass + n_fail + n_skip, name, why);
	fflush(stdout);
}

/*
 * IT_SKIP_FEATURES: a comma-separated list of features the share under
 * test lacks (tests/it/nfs_suite.sh sets it for the nfs driver). Each
 * group of checks that needs one of them calls this first; if the feature
 * is listed, it prints "ok N - name # SKIP <IT_SKIP_REASON>: why" and the
 * group does not run. Features: xattr (user xattrs), fallocate, seek_hole
 * (SEEK_DATA/SEEK_HOLE as the backing fs answers), exchange
 * (RENAME_EXCHANGE), enospc (a small fs mounted inside REMOTE is seen
 * through the share), remote_writer (a change made on REMOTE behind the
 * server's back is seen), symlink_times (a symlink's own times),
 * remote_alloc (fallocate's allocation and punched holes reach REMOTE;
 * the data always must); and for shares without POSIX semantics
 * (tests/it/smb_suite.sh): symlink, hardlink, mknod (fifos), mode
 * (permission bits are kept; without it the checks of modes, and of
 * access by other users, which the kernel decides from the modes, are
 * skipped), owner (chown; files belong to the login), time_ns (times are
 * kept to the microsecond only: compared so), win_names (names with a
 * character Windows forbids, or not UTF-8).
 */
/* Is feature listed in IT_SKIP_FEATURES? (prints nothing) */
static bool lacks(const char *feature)
{
	const char *p = getenv("IT_SKIP_FEATURES");
	size_t len = strlen(feature);

	while (p && *p) {
		size_t n = strcspn(p, ",");

		if (n == len && !strncmp(p, feature, len))
			return true;
		p += n + (p[n] == ',');
	}
	return false;
}

static bool feature_skipped(const char *feature, const char *name,
			    const char *why)
{
	const char *p = getenv("IT_SKIP_FEATURES");
	const char *reason = getenv("IT_SKIP_REASON");
	size_t len = strlen(feature);
	char msg[256];

	while (p && *p) {
		size_t n = strcspn(p, ",");

		if (n == len && !strncmp(p, feature, len)) {
			snprintf(msg, sizeof(msg), "%s: %s",
				 reason && *reason ? reason : "IT_SKIP_FEATURES",
				 why);
			skip(name, msg);
			return true;
		}
		p += n + (p[n] == ',');
	}
	return false;
}

/* ok if a syscall did not return -1; the detail is errno. */
static bool check_sys(long rc, const char *name)
{
	int e = errno;

	return check(rc != -1, name, "failed: %s (%s)", ename(e), strerror(e));
}

/* ok if a function returning 0 or -errno returned 0. */
static bool check_rc(int rc, const char *name)
{
	return check(rc == 0, name, "failed: %s (%s)", ename(-rc),
		     strerror(-rc));
}

/* ok if a syscall failed with errno want (or want2, if non-zero). */
static bool check_err2(long rc, int want, int want2, const char *name)
{
	int e = errno;

	if (rc != -1)
		return check(false, name, "succeeded (returned %ld), want %s",
			     rc, ename(want));
	return check(e == want || (want2 && e == want2), name,
		     "got %s (%s), want %s", ename(e), strerror(e),
		     ename(want));
}

static bool check_err(long rc, int want, const char *name)
{
	return check_err2(rc, want, 0, name);
}

/* open() that is expected to fail: closes the fd if it did not. */
static bool check_open_err(const char *path, int flags, mode_t mode, int want,
			   const char *name)
{
	int fd = open(path, flags, mode);
	int e = errno;
	bool good;

	if (fd >= 0)
		close(fd);
	errno = e;
	good = check_err(fd, want, name);
	return good;
}

/* ---- paths -------------------------------------------------------------- */

#define NPATHBUF 32
static char pathbuf[NPATHBUF][PATH_MAX];
static unsigned int pathidx;

__attribute__((format(printf, 2, 0)))
static char *vjoin(const char *root, const char *fmt, va_list ap)
{
	char *buf = pathbuf[pathidx++ % NPATHBUF];
	int n = snprintf(buf, PATH_MAX, "%s/", root);

	vsnprintf(buf + n, PATH_MAX - n, fmt, ap);
	return buf;
}

/* A path below the mount; one of NPATHBUF rotating buffers. */
__attribute__((format(printf, 1, 2)))
static char *mp(const char *fmt, ...)
{
	va_list ap;
	char *p;

	va_start(ap, fmt);
	p = vjoin(mnt_root, fmt, ap);
	va_end(ap);
	return p;
}

/*
 * IT_REMOTE_SYNC: a command that brings the share up to date with the
 * mount (a write-back mount: "ferryfs flush MNT --wait"; mount_run.sh sets
 * it). Run before every look at REMOTE, so the checks of what lands on
 * the share hold in write-back mode too.
 */
static void remote_sync(void)
{
	const char *cmd = getenv("IT_REMOTE_SYNC");

	if (cmd && *cmd && system(cmd) != 0) {
		fprintf(stderr, "it_syscalls: '%s' failed\n", cmd);
		exit(1);
	}
}

/* The same relative path on the backing directory, without a sync: for
 * a loop over what one remote_sync() brought up to date (the sync is a
 * `ferryfs flush --wait` each: 100 of them were 5 s of a run, 12 s under
 * ASan). */
__attribute__((format(printf, 1, 2)))
static char *rp_synced(const char *fmt, ...)
{
	va_list ap;
	char *p;

	va_start(ap, fmt);
	p = vjoin(remote_root, fmt, ap);
	va_end(ap);
	return p;
}

/* The same relative path on the backing directory, the share synced. */
#define rp(...) (remote_sync(), rp_synced(__VA_ARGS__))

/* ---- file helpers (0 or -errno) ----------------------------------------- */

static int pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	const char *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= n;
		off += n;
	}
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= n;
	}
	return 0;
}

/* Reads up to len bytes (fewer only at EOF); byte count or -errno. */
static ssize_t pread_all(int fd, void *buf, size_t len, off_t off)
{
	char *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, p + got, len - got, off + got);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		got += n;
	}
	return got;
}

static int put_file(const char *path, const void *buf, size_t len,
		    mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
	int rc;

	if (fd < 0)
		return -errno;
	rc = write_all(fd, buf, len);
	if (close(fd) && !rc)
		rc = -errno;
	return rc;
}

static int put_str(const char *path, const char *s)
{
	return put_file(path, s, strlen(s), 0644);
}

/* Reads at most cap bytes of path; byte count or -errno. */
static ssize_t get_file(const char *path, void *buf, size_t cap)
{
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = pread_all(fd, buf, cap, 0);
	close(fd);
	return n;
}

/* ok if path holds exactly the len bytes of want. */
static bool check_content(const char *path, const void *want, size_t len,
			  const char *name)
{
	unsigned char *buf = malloc(len + 1);
	ssize_t n;
	bool good;

	if (!buf)
		return check(false, name, "out of memory");
	n = get_file(path, buf, len + 1);
	if (n < 0) {
		good = check(false, name, "cannot read '%s': %s", path,
			     strerror(-n));
	} else if ((size_t)n != len) {
		good = check(false, name, "'%s' has %zd bytes, want %zu", path,
			     n, len);
	} else if (memcmp(buf, want, len)) {
		size_t i = 0;

		while (buf[i] == ((const unsigned char *)want)[i])
			i++;
		good = check(false, name, "'%s' differs at byte %zu", path, i);
	} else {
		good = check(true, name, "-");
	}
	free(buf);
	return good;
}

static bool check_str(const char *path, const char *want, const char *name)
{
	return check_content(path, want, strlen(want), name);
}

/* ok if lstat(path) fails with ENOENT. */
static bool check_gone(const char *path, const char *name)
{
	struct stat st;

	return check_err(lstat(path, &st), ENOENT, name);
}

/* st_mode & 07777 of path (lstat), or -errno. */
static long mode_of(const char *path)
{
	struct stat st;

	if (lstat(path, &st))
		return -errno;
	return st.st_mode & 07777;
}

static bool check_mode(const char *path, mode_t want, const char *name)
{
	long m;

	if (feature_skipped("mode", name, "modes are not kept"))
		return true;
	m = mode_of(path);
	if (m < 0)
		return check(false, name, "lstat '%s': %s", path, strerror(-m));
	return check(m == (long)want, name, "'%s' has mode %04lo, want %04o",
		     path, m, (unsigned int)want);
}

static bool check_owner(const char *path, uid_t uid, gid_t gid,
			const char *name)
{
	struct stat st;

	if (feature_skipped("owner", name, "owners are not kept"))
		return true;
	if (lstat(path, &st))
		return check(false, name, "lstat '%s': %s", path,
			     strerror(errno));
	return check(st.st_uid == uid && st.st_gid == gid, name,
		     "'%s' owned by %u:%u, want %u:%u", path, st.st_uid,
		     st.st_gid, uid, gid);
}

/* equal times; to the microsecond only where the share lacks time_ns */
static bool ts_eq(struct timespec a, struct timespec b)
{
	if (lacks("time_ns"))
		return a.tv_sec == b.tv_sec &&
		       a.tv_nsec / 1000 == b.tv_nsec / 1000;
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* Compares what the share must agree on: type, mode, owner, size, mtime. */
static bool same_attrs(const struct stat *m, const struct stat *r, char *why,
		       size_t len)
{
	if (lacks("mode") ? (m->st_mode & S_IFMT) != (r->st_mode & S_IFMT)
			  : m->st_mode != r->st_mode)
		snprintf(why, len, "mode %o vs remote %o", m->st_mode,
			 r->st_mode);
	else if (!lacks("owner") &&
		 (m->st_uid != r->st_uid || m->st_gid != r->st_gid))
		snprintf(why, len, "owner %u:%u vs remote %u:%u", m->st_uid,
			 m->st_gid, r->st_uid, r->st_gid);
	else if (!S_ISDIR(m->st_mode) && m->st_size != r->st_size)
		snprintf(why, len, "size %lld vs remote %lld",
			 (long long)m->st_size, (long long)r->st_size);
	else if (!ts_eq(m->st_mtim, r->st_mtim))
		snprintf(why, len, "mtime %lld.%09ld vs remote %lld.%09ld",
			 (long long)m->st_mtim.tv_sec, m->st_mtim.tv_nsec,
			 (long long)r->st_mtim.tv_sec, r->st_mtim.tv_nsec);
	else
		return true;
	return false;
}

/* ok if lstat of rel through the mount and on REMOTE agree. */
static bool check_same_attrs(const char *rel, const char *name)
{
	struct stat m, r;
	char why[256];

	if (lstat(mp("%s", rel), &m))
		return check(false, name, "lstat mount '%s': %s", rel,
			     strerror(errno));
	if (lstat(rp("%s", rel), &r))
		return check(false, name, "lstat remote '%s': %s", rel,
			     strerror(errno));
	return check(same_attrs(&m, &r, why, sizeof(why)), name, "%s", why);
}

/* xorshift64* pattern, so that a misplaced block never looks right. */
static void fill_pattern(void *buf, size_t len, uint64_t seed)
{
	unsigned char *p = buf;
	uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;

	for (size_t i = 0; i < len; i++) {
		if ((i & 7) == 0) {
			x ^= x >> 12;
			x ^= x << 25;
			x ^= x >> 27;
		}
		p[i] = (unsigned char)((x * 0x2545F4914F6CDD1DULL) >>
				       (8 * (i & 7)));
	}
}

static uint64_t rng_state = 42;

static uint64_t rng(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t fnv1a(const void *buf, size_t len, uint64_t h)
{
	const unsigned char *p = buf;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

#define FNV_INIT 0xcbf29ce484222325ULL

/* FNV-1a of a whole file read in odd-sized chunks; 0 on error. */
static uint64_t file_sum(const char *path, off_t *size)
{
	size_t chunk = 64 * KiB + 13;
	char *buf = malloc(chunk);
	uint64_t h = FNV_INIT;
	int fd = open(path, O_RDONLY);
	ssize_t n;

	*size = 0;
	if (fd < 0 || !buf) {
		if (fd >= 0)
			close(fd);
		free(buf);
		return 0;
	}
	while ((n = read(fd, buf, chunk)) > 0) {
		h = fnv1a(buf, n, h);
		*size += n;
	}
	if (n < 0)
		h = 0;
	close(fd);
	free(buf);
	return h;
}

static struct timespec now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts;
}

/* ---- running an operation as another user ------------------------------- */

enum op_kind {
	OP_OPEN,
	OP_MKDIR,
	OP_UNLINK,
	OP_RMDIR,
	OP_SYMLINK,
	OP_MKFIFO,
	OP_CHMOD,
	OP_CHOWN,
	OP_RENAME,
	OP_UTIMES_NOW,
	OP_UTIMES_SET,
	OP_ACCESS,
	OP_STAT,
	OP_WRITE,
	OP_TRUNCATE,
};

struct op {
	enum op_kind kind;
	const char *path;
	const char *path2; /* rename target, symlink target, data to write */
	int flags;         /* open flags, access mode */
	mode_t mode;
	uid_t uid;
	gid_t gid;
};

/* Runs in the child; 0 or a positive errno. */
static int op_run(const struct op *o)
{
	struct timespec ts[2] = { { 1000, 0 }, { 1000, 0 } };
	struct stat st;
	int fd, rc = 0;

	switch (o->kind) {
	case OP_OPEN:
		fd = open(o->path, o->flags, o->mode);
		if (fd < 0)
			return errno;
		return close(fd) ? errno : 0;
	case OP_WRITE:
		fd = open(o->path, o->flags, o->mode);
		if (fd < 0)
			return errno;
		rc = -write_all(fd, o->path2, strlen(o->path2));
		if (close(fd) && !rc)
			rc = errno;
		return rc;
	case OP_MKDIR:
		return mkdir(o->path, o->mode) ? errno : 0;
	case OP_UNLINK:
		return unlink(o->path) ? errno : 0;
	case OP_RMDIR:
		return rmdir(o->path) ? errno : 0;
	case OP_SYMLINK:
		return symlink(o->path2, o->path) ? errno : 0;
	case OP_MKFIFO:
		return mkfifo(o->path, o->mode) ? errno : 0;
	case OP_CHMOD:
		return chmod(o->path, o->mode) ? errno : 0;
	case OP_CHOWN:
		return chown(o->path, o->uid, o->gid) ? errno : 0;
	case OP_RENAME:
		return rename(o->path, o->path2) ? errno : 0;
	case OP_UTIMES_NOW:
		return utimensat(AT_FDCWD, o->path, NULL, 0) ? errno : 0;
	case OP_UTIMES_SET:
		return utimensat(AT_FDCWD, o->path, ts, 0) ? errno : 0;
	case OP_ACCESS:
		return access(o->path, o->flags) ? errno : 0;
	case OP_STAT:
		return stat(o->path, &st) ? errno : 0;
	case OP_TRUNCATE:
		return truncate(o->path, 0) ? errno : 0;
	}
	return EINVAL;
}

/*
 * Runs o in a child that has dropped to uid:gid with no supplementary
 * groups. Returns 0 or the errno the operation failed with; -1 if the child
 * could not switch users or died.
 */
static int as_user(uid_t uid, gid_t gid, const struct op *o)
{
	int status;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		alarm(60);
		if (setgroups(0, NULL) || setresgid(gid, gid, gid) ||
		    setresuid(uid, uid, uid))
			_exit(255);
		_exit(op_run(o));
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
	    WEXITSTATUS(status) == 255)
		return -1;
	return WEXITSTATUS(status);
}

/* ok if o run as uid:gid ends with errno want (0 for success). */
static bool check_as(uid_t uid, gid_t gid, const struct op *o, int want,
		     const char *name)
{
	int got = as_user(uid, gid, o);

	if (got < 0)
		return check(false, name, "child as %u:%u could not run", uid,
			     gid);
	return check(got == want, name, "as %u:%u got %s, want %s", uid, gid,
		     ename(got), ename(want));
}

/* ---- lookup / getattr --------------------------------------------------- */

static int drop_caches(void)
{
	int fd, rc = 0;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0)
		return -errno;
	if (write(fd, "2", 1) != 1)
		rc = -errno;
	close(fd);
	return rc;
}

static void t_root(void)
{
	struct stat m, r;

	if (!check_sys(stat(mnt_root, &m), "stat of the mount root"))
		return;
	if (lstat(remote_root, &r))
		r.st_mode = 0;
	check(S_ISDIR(m.st_mode), "mount root is a directory", "mode %o",
	      m.st_mode);
	if (lacks("mode") || lacks("owner"))
		skip("mount root mode and owner match REMOTE",
		     "modes or owners are not kept");
	else
		check(m.st_mode == r.st_mode && m.st_uid == r.st_uid &&
			      m.st_gid == r.st_gid,
	      "mount root mode and owner match REMOTE",
	      "mount %o %u:%u, remote %o %u:%u", m.st_mode, m.st_uid, m.st_gid,
	      r.st_mode, r.st_uid, r.st_gid);
}

static void t_getattr(void)
{
	struct stat m, m2, r, r2;
	int fd, rc;

	rc = put_str(mp("ga_file"), "hello");
	if (!check_rc(rc, "getattr: create a 5-byte file"))
		return;
	if (check_sys(stat(mp("ga_file"), &m), "stat a regular file")) {
		check(S_ISREG(m.st_mode) &&
			      (lacks("mode") || (m.st_mode & 07777) == 0644) &&
			      m.st_size == 5 && m.st_nlink == 1 &&
			      m.st_uid == 0 && m.st_gid == 0,
		      "stat regular file: S_IFREG, 0644, size 5, nlink 1, 0:0",
		      "mode %o size %lld nlink %lu owner %u:%u", m.st_mode,
		      (long long)m.st_size, (unsigned long)m.st_nlink,
		      m.st_uid, m.st_gid);
		check(m.st_blksize > 0, "stat regular file: st_blksize > 0",
		      "st_blksize %ld", (long)m.st_blksize);
		check_same_attrs("ga_file",
				 "regular file: mode, owner, size, mtime (ns) "
				 "match REMOTE");
		stat(mp("ga_file"), &m2);
		check(m2.st_ino == m.st_ino, "st_ino stable across two stats",
		      "%lu then %lu", (unsigned long)m.st_ino,
		      (unsigned long)m2.st_ino);
		fd = open(mp("ga_file"), O_RDONLY);
		if (fd >= 0) {
			fstat(fd, &m2);
			close(fd);
		}
		check(fd >= 0 && m2.st_ino == m.st_ino,
		      "fstat of an open fd gives the same st_ino as stat",
		      "fd %d, %lu vs %lu", fd, (unsigned long)m2.st_ino,
		      (unsigned long)m.st_ino);
	}

	if (check_sys(mkdir(mp("ga_dir"), 0755), "getattr: mkdir") &&
	    check_sys(stat(mp("ga_dir"), &m2), "stat a directory")) {
		check(S_ISDIR(m2.st_mode) &&
			      (lacks("mode") || (m2.st_mode & 07777) == 0755) &&
			      m2.st_nlink >= 2,
		      "stat directory: S_IFDIR, 0755, nlink >= 2",
		      "mode %o nlink %lu", m2.st_mode,
		      (unsigned long)m2.st_nlink);
		check_same_attrs("ga_dir", "directory: attrs match REMOTE");
	}

	if (!feature_skipped("symlink", "getattr: symlink", "no symlinks") &&
	    check_sys(symlink("ga_file", mp("ga_link")), "getattr: symlink") &&
	    check_sys(lstat(mp("ga_link"), &m2), "lstat a symlink")) {
		check(S_ISLNK(m2.st_mode) && m2.st_size == 7,
		      "lstat symlink: S_IFLNK, st_size = target length 7",
		      "mode %o size %lld", m2.st_mode, (long long)m2.st_size);
		check(stat(mp("ga_link"), &m2) == 0 && S_ISREG(m2.st_mode) &&
			      m2.st_ino == m.st_ino,
		      "stat through a symlink reaches the target",
		      "mode %o ino %lu want %lu", m2.st_mode,
		      (unsigned long)m2.st_ino, (unsigned long)m.st_ino);
		check(lstat(rp("ga_link"), &r) == 0 && S_ISLNK(r.st_mode),
		      "symlink is a symlink on REMOTE", "mode %o", r.st_mode);
	}

	/* hard links: one inode, two names */
	if (!feature_skipped("hardlink", "getattr: link", "no hard links") &&
	    check_sys(link(mp("ga_file"), mp("ga_hard")), "getattr: link")) {
		bool ok1 = stat(mp("ga_file"), &m) == 0;
		bool ok2 = stat(mp("ga_hard"), &m2) == 0;

		check(ok1 && ok2 && m.st_ino == m2.st_ino,
		      "hard links show the same st_ino", "%lu vs %lu",
		      (unsigned long)m.st_ino, (unsigned long)m2.st_ino);
		check(ok1 && ok2 && m.st_nlink == 2 && m2.st_nlink == 2,
		      "hard links both show nlink 2", "nlink %lu and %lu",
		      (unsigned long)m.st_nlink, (unsigned long)m2.st_nlink);
		ok1 = lstat(rp("ga_file"), &r) == 0;
		ok2 = lstat(rp("ga_hard"), &r2) == 0;
		check(ok1 && ok2 && r.st_ino == r2.st_ino && r.st_nlink == 2,
		      "hard link is a hard link on REMOTE",
		      "remote ino %lu/%lu nlink %lu", (unsigned long)r.st_ino,
		      (unsigned long)r2.st_ino, (unsigned long)r.st_nlink);
	}

	/* the kernel forgets the inodes; a fresh lookup must agree */
	stat(mp("ga_file"), &m);
	stat(mp("ga_dir"), &m2);
	rc = drop_caches();
	if (rc) {
		skip("st_ino stable after the kernel forgets the inode",
		     "cannot write /proc/sys/vm/drop_caches");
	} else {
		struct stat a, b;

		stat(mp("ga_file"), &a);
		stat(mp("ga_dir"), &b);
		check(a.st_ino == m.st_ino && b.st_ino == m2.st_ino,
		      "st_ino stable after the kernel forgets the inode",
		      "file %lu -> %lu, dir %lu -> %lu",
		      (unsigned long)m.st_ino, (unsigned long)a.st_ino,
		      (unsigned long)m2.st_ino, (unsigned long)b.st_ino);
	}
}

/* ---- setattr ------------------------------------------------------------ */

static bool check_times(const char *path, struct timespec at,
			struct timespec mt, const char *name)
{
	struct stat st;

	if (lstat(path, &st))
		return check(false, name, "lstat '%s': %s", path,
			     strerror(errno));
	return check(ts_eq(st.st_atim, at) && ts_eq(st.st_mtim, mt), name,
		     "'%s' atime %lld.%09ld mtime %lld.%09ld, want %lld.%09ld "
		     "and %lld.%09ld",
		     path, (long long)st.st_atim.tv_sec, st.st_atim.tv_nsec,
		     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
		     (long long)at.tv_sec, at.tv_nsec, (long long)mt.tv_sec,
		     mt.tv_nsec);
}

/* ok if t lies in [lo - 2 s, hi + 2 s] */
static bool check_recent(const char *what, struct timespec t,
			 struct timespec lo, struct timespec hi,
			 const char *name)
{
	return check(t.tv_sec >= lo.tv_sec - 2 && t.tv_sec <= hi.tv_sec + 2,
		     name, "%s %lld, want within 2 s of [%lld, %lld]", what,
		     (long long)t.tv_sec, (long long)lo.tv_sec,
		     (long long)hi.tv_sec);
}

static void t_setattr(void)
{
	struct timespec ts[2];
	struct timespec t0, t1;
	struct stat st;
	char buf[10000];
	int fd;

	if (!check_rc(put_str(mp("sa_file"), "hello"),
		      "setattr: create a file"))
		return;

	/* chmod */
	if (feature_skipped("mode", "chmod", "modes are not kept"))
		;
	else if (check_sys(chmod(mp("sa_file"), 0640), "chmod 0640")) {
		check_mode(mp("sa_file"), 0640, "chmod 0640: seen by stat");
		check_mode(rp("sa_file"), 0640, "chmod 0640: on REMOTE");
	}
	if (lacks("mode"))
		;
	else if (check_sys(chmod(mp("sa_file"), 04755), "chmod 04755")) {
		check_mode(mp("sa_file"), 04755, "chmod 04755: seen by stat");
		check_mode(rp("sa_file"), 04755, "chmod 04755: on REMOTE");
	}
	if (check_sys(mkdir(mp("sa_dir"), 0755), "setattr: mkdir") &&
	    !lacks("mode") &&
	    check_sys(chmod(mp("sa_dir"), 01777), "chmod a directory 01777")) {
		check_mode(mp("sa_dir"), 01777, "chmod dir 01777: seen by stat");
		check_mode(rp("sa_dir"), 01777, "chmod dir 01777: on REMOTE");
	}

	/* chown */
	if (feature_skipped("owner", "chown", "owners are not kept"))
		;
	else if (check_sys(chown(mp("sa_file"), USER_UID, USER_GID),
			   "chown to 1000:1000")) {
		check_owner(mp("sa_file"), USER_UID, USER_GID,
			    "chown 1000:1000: seen by stat");
		check_owner(rp("sa_file"), USER_UID, USER_GID,
			    "chown 1000:1000: on REMOTE");
	}
	if (lacks("owner"))
		;
	else if (check_sys(chown(mp("sa_file"), -1, OTHER_GID),
			   "chown -1:2000 (group only)")) {
		check_owner(mp("sa_file"), USER_UID, OTHER_GID,
			    "chown -1:2000 keeps the uid: seen by stat");
		check_owner(rp("sa_file"), USER_UID, OTHER_GID,
			    "chown -1:2000 keeps the uid: on REMOTE");
	}
	if (check_rc(put_str(mp("sa_target"), "t"), "setattr: create target") &&
	    !lacks("symlink") && !lacks("owner") &&
	    check_sys(symlink("sa_target", mp("sa_link")),
		      "setattr: symlink") &&
	    check_sys(lchown(mp("sa_link"), USER_UID, USER_GID),
		      "lchown a symlink to 1000:1000")) {
		check_owner(rp("sa_link"), USER_UID, USER_GID,
			    "lchown: the symlink itself changed on REMOTE");
		check_owner(rp("sa_target"), 0, 0,
			    "lchown: the symlink's target unchanged on REMOTE");
	}

	/* truncate */
	memset(buf, 0, sizeof(buf));
	memcpy(buf, "hello", 5);
	put_str(mp("sa_trunc"), "hello");
	if (check_sys(truncate(mp("sa_trunc"), 10000), "truncate grow to 10000")) {
		check(stat(mp("sa_trunc"), &st) == 0 && st.st_size == 10000,
		      "truncate grow: size 10000", "size %lld",
		      (long long)st.st_size);
		check_content(mp("sa_trunc"), buf, 10000,
			      "truncate grow: old bytes then zeros");
		check_content(rp("sa_trunc"), buf, 10000,
			      "truncate grow: same on REMOTE");
	}
	if (check_sys(truncate(mp("sa_trunc"), 3), "truncate shrink to 3")) {
		check_str(mp("sa_trunc"), "hel", "truncate shrink: content");
		check_str(rp("sa_trunc"), "hel",
			  "truncate shrink: same on REMOTE");
	}
	if (check_sys(truncate(mp("sa_trunc"), 0), "truncate to 0"))
		check_str(rp("sa_trunc"), "", "truncate to 0: on REMOTE");

	fd = open(mp("sa_ftrunc"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (check_sys(fd, "ftruncate: open")) {
		write_all(fd, "abcdefgh", 8);
		check(ftruncate(fd, 4096) == 0 && fstat(fd, &st) == 0 &&
			      st.st_size == 4096,
		      "ftruncate grow: fstat size 4096", "size %lld (%s)",
		      (long long)st.st_size, strerror(errno));
		check(ftruncate(fd, 2) == 0 && fstat(fd, &st) == 0 &&
			      st.st_size == 2,
		      "ftruncate shrink: fstat size 2", "size %lld (%s)",
		      (long long)st.st_size, strerror(errno));
		check_sys(close(fd), "ftruncate: close");
		check_str(rp("sa_ftrunc"), "ab", "ftruncate: REMOTE has 'ab'");
	}

	/* utimensat */
	ts[0] = (struct timespec){ 1000000000, 123456789 };
	ts[1] = (struct timespec){ 1234567890, 987654321 };
	if (check_sys(utimensat(AT_FDCWD, mp("sa_file"), ts, 0),
		      "utimensat with explicit times")) {
		check_times(mp("sa_file"), ts[0], ts[1],
			    "utimensat explicit: atime and mtime to the ns");
		check_times(rp("sa_file"), ts[0], ts[1],
			    "utimensat explicit: same on REMOTE");
	}
	{
		struct timespec at = { 1100000000, 5 };
		struct timespec mt = ts[1];

		ts[0] = at;
		ts[1] = (struct timespec){ 0, UTIME_OMIT };
		if (check_sys(utimensat(AT_FDCWD, mp("sa_file"), ts, 0),
			      "utimensat atime set, mtime UTIME_OMIT")) {
			check_times(mp("sa_file"), at, mt,
				    "UTIME_OMIT leaves mtime alone");
			check_times(rp("sa_file"), at, mt,
				    "UTIME_OMIT leaves mtime alone on REMOTE");
		}
		ts[0] = (struct timespec){ 0, UTIME_OMIT };
		ts[1] = (struct timespec){ 0, UTIME_NOW };
		t0 = now();
		if (check_sys(utimensat(AT_FDCWD, mp("sa_file"), ts, 0),
			      "utimensat mtime UTIME_NOW, atime UTIME_OMIT")) {
			struct stat r;

			t1 = now();
			stat(mp("sa_file"), &st);
			lstat(rp("sa_file"), &r);
			check_recent("mtime", st.st_mtim, t0, t1,
				     "UTIME_NOW sets mtime to now");
			check_recent("remote mtime", r.st_mtim, t0, t1,
				     "UTIME_NOW sets mtime to now on REMOTE");
			check(ts_eq(st.st_atim, at) && ts_eq(r.st_atim, at),
			      "UTIME_OMIT leaves atime alone (mount, REMOTE)",
			      "atime %lld.%09ld / remote %lld.%09ld",
			      (long long)st.st_atim.tv_sec, st.st_atim.tv_nsec,
			      (long long)r.st_atim.tv_sec, r.st_atim.tv_nsec);
		}
	}
	ts[0] = (struct timespec){ 1111111111, 0 };
	ts[1] = (struct timespec){ 1111111111, 500000000 };
	if (!feature_skipped("symlink_times", "a symlink's own times",
			     "the server does not set them") &&
	    !feature_skipped("symlink", "a symlink's own times",
			     "no symlinks") &&
	    check_sys(utimensat(AT_FDCWD, mp("sa_link"), ts,
				AT_SYMLINK_NOFOLLOW),
		      "utimensat AT_SYMLINK_NOFOLLOW on a symlink")) {
		struct stat r;

		check(lstat(rp("sa_link"), &r) == 0 &&
			      ts_eq(r.st_mtim, ts[1]),
		      "symlink's own mtime set on REMOTE",
		      "remote link mtime %lld.%09ld",
		      (long long)r.st_mtim.tv_sec, r.st_mtim.tv_nsec);
		check(lstat(rp("sa_target"), &r) == 0 &&
			      r.st_mtim.tv_sec != ts[1].tv_sec,
		      "symlink's target mtime untouched on REMOTE",
		      "target mtime %lld", (long long)r.st_mtim.tv_sec);
	}

	/* a write moves mtime, and the share keeps the same mtime */
	ts[0] = ts[1] = (struct timespec){ 1000000000, 0 };
	put_str(mp("sa_mt"), "x");
	utimensat(AT_FDCWD, mp("sa_mt"), ts, 0);
	t0 = now();
	fd = open(mp("sa_mt"), O_WRONLY | O_APPEND);
	if (check_sys(fd, "mtime on write: open")) {
		write_all(fd, "yz", 2);
		check_sys(close(fd), "mtime on write: close");
		t1 = now();
		stat(mp("sa_mt"), &st);
		check_recent("mtime", st.st_mtim, t0, t1,
			     "write sets mtime to now");
		check_same_attrs("sa_mt",
				 "after write+close: mtime (ns) and size match "
				 "REMOTE");
	}

	/* by path while the file is open here (cp -a sets the times and the
	 * mode before it closes): the open file's object; a truncate(2)
	 * while it is open only for reading too */
	put_str(mp("sa_open"), "0123456789");
	fd = open(mp("sa_open"), O_RDONLY);
	if (check_sys(fd, "setattr while open: open read-only")) {
		ts[0] = ts[1] = (struct timespec){ 1222222222, 250000000 };
		if (check_sys(utimensat(AT_FDCWD, mp("sa_open"), ts, 0),
			      "utimensat by path while open"))
			check_times(rp("sa_open"), ts[0], ts[1],
				    "utimensat by path while open: on REMOTE");
		if (!feature_skipped("mode", "chmod while open",
				     "modes are not kept") &&
		    check_sys(chmod(mp("sa_open"), 0604),
			      "chmod by path while open")) {
			struct stat r;

			check(lstat(rp("sa_open"), &r) == 0 &&
				      (r.st_mode & 07777) == 0604,
			      "chmod by path while open: on REMOTE",
			      "remote mode %o", (unsigned)(r.st_mode & 07777));
		}
		if (check_sys(truncate(mp("sa_open"), 4),
			      "truncate by path while open read-only")) {
			struct stat r;

			check(lstat(rp("sa_open"), &r) == 0 && r.st_size == 4,
			      "truncate while open: on REMOTE", "remote size %lld",
			      (long long)r.st_size);
		}
		close(fd);
	}
}

/* ---- readdir ------------------------------------------------------------ */

struct want_ent {
	const char *name;
	unsigned char type;
	int seen;
	unsigned char got;
	ino_t d_ino;
};

static void t_readdir_small(void)
{
	struct want_ent want[] = {
		{ "reg", DT_REG, 0, 0, 0 },
		{ "sub", DT_DIR, 0, 0, 0 },
		{ "lnk", DT_LNK, 0, 0, 0 },
		{ "fifo", DT_FIFO, 0, 0, 0 },
	};
	size_t nwant = sizeof(want) / sizeof(want[0]);
	char extra[256] = "";
	char bad[512] = "";
	struct dirent *de;
	struct stat st;
	int nextra = 0;
	bool once = true;
	DIR *d;

	/* without symlinks or fifos: reg and sub only */
	if (lacks("mknod"))
		nwant = 3;
	if (lacks("symlink"))
		want[2] = want[--nwant];
	if (!check_sys(mkdir(mp("rd"), 0755), "readdir: mkdir"))
		return;
	put_str(mp("rd/reg"), "r");
	mkdir(mp("rd/sub"), 0755);
	if (!lacks("symlink"))
		symlink("reg", mp("rd/lnk"));
	if (!lacks("mknod"))
		mkfifo(mp("rd/fifo"), 0644);

	d = opendir(mp("rd"));
	if (!check(d != NULL, "opendir", "%s", strerror(errno)))
		return;
	while ((de = readdir(d))) {
		size_t i;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		for (i = 0; i < nwant; i++)
			if (!strcmp(de->d_name, want[i].name))
				break;
		if (i == nwant) {
			nextra++;
			snprintf(extra + strlen(extra),
				 sizeof(extra) - strlen(extra), " '%.40s'",
				 de->d_name);
			continue;
		}
		want[i].seen++;
		want[i].got = de->d_type;
		want[i].d_ino = de->d_ino;
	}
	closedir(d);
	for (size_t i = 0; i < nwant; i++)
		if (want[i].seen != 1)
			once = false;
	check(once && !nextra, "readdir lists reg, sub, lnk, fifo exactly once",
	      "seen %d/%d/%d/%d times, extra:%s", want[0].seen, want[1].seen,
	      want[2].seen, want[3].seen, extra);
	for (size_t i = 0; i < nwant; i++)
		if (want[i].got != want[i].type)
			snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
				 " %s has d_type %u want %u", want[i].name,
				 want[i].got, want[i].type);
	check(!bad[0], "readdir d_type: DT_REG, DT_DIR, DT_LNK, DT_FIFO", "%s",
	      bad);
	bad[0] = 0;
	for (size_t i = 0; i < nwant; i++)
		if (lstat(mp("rd/%s", want[i].name), &st) ||
		    st.st_ino != want[i].d_ino)
			snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
				 " %s d_ino %lu st_ino %lu", want[i].name,
				 (unsigned long)want[i].d_ino,
				 (unsigned long)st.st_ino);
	check(!bad[0], "readdir d_ino equals lstat st_ino", "%s", bad);
}

#define NBIG 2000

/* Counts names e0000..e1999 in seen[]; returns the number of other names. */
static int tally(const char *name, int *seen)
{
	char *end;
	long i;

	if (!strcmp(name, ".") || !strcmp(name, ".."))
		return 0;
	if (name[0] != 'e' || strlen(name) != 5)
		return 1;
	i = strtol(name + 1, &end, 10);
	if (*end || i < 0 || i >= NBIG)
		return 1;
	seen[i]++;
	return 0;
}

static bool check_tally(const int *seen, int other, const char *name)
{
	int missing = 0, dup = 0, first = -1;

	for (int i = 0; i < NBIG; i++) {
		if (seen[i] == 0)
			missing++;
		if (seen[i] > 1)
			dup++;
		if (seen[i] != 1 && first < 0)
			first = i;
	}
	return check(!missing && !dup && !other, name,
		     "%d missing, %d listed twice or more, %d unexpected names "
		     "(first bad: e%04d)",
		     missing, dup, other, first);
}

static void t_readdir_big(void)
{
	static int seen[NBIG];
	_Alignas(8) char dbuf[512];
	char first_name[256] = "", at_pos[256] = "", name[256];
	struct dirent *de;
	int other = 0, failed = 0, fd;
	long pos;
	DIR *d;

	if (!check_sys(mkdir(mp("big"), 0755), "readdir 2000: mkdir"))
		return;
	for (int i = 0; i < NBIG; i++) {
		fd = open(mp("big/e%04d", i), O_CREAT | O_WRONLY, 0644);
		if (fd < 0)
			failed++;
		else
			close(fd);
	}
	check(!failed, "create 2000 files in one directory",
	      "%d creates failed (%s)", failed, strerror(errno));

	memset(seen, 0, sizeof(seen));
	d = opendir(mp("big"));
	if (!check(d != NULL, "readdir 2000: opendir", "%s", strerror(errno)))
		return;
	while ((de = readdir(d)))
		other += tally(de->d_name, seen);
	closedir(d);
	check_tally(seen, other, "readdir lists 2000 entries exactly once");

	/* many small getdents64 calls: every offset cookie gets used */
	memset(seen, 0, sizeof(seen));
	other = 0;
	fd = open(mp("big"), O_RDONLY | O_DIRECTORY);
	if (check_sys(fd, "readdir 2000: open O_DIRECTORY")) {
		ssize_t n;

		while ((n = getdents64(fd, dbuf, sizeof(dbuf))) > 0) {
			for (ssize_t off = 0; off < n;) {
				struct dirent64 *e = (void *)(dbuf + off);

				other += tally(e->d_name, seen);
				off += e->d_reclen;
			}
		}
		check(n == 0, "getdents64 with a 512-byte buffer ends cleanly",
		      "%s", strerror(errno));
		close(fd);
		check_tally(seen, other,
			    "getdents64 with a 512-byte buffer lists 2000 "
			    "entries exactly once");
	}

	/* telldir / seekdir / rewinddir */
	d = opendir(mp("big"));
	if (!check(d != NULL, "seekdir: opendir", "%s", strerror(errno)))
		return;
	pos = -1;
	for (int i = 0; (de = readdir(d)); i++) {
		if (i == 0)
			snprintf(first_name, sizeof(first_name), "%s",
				 de->d_name);
		if (i == 700)
			pos = telldir(d);
		if (i == 701)
			snprintf(at_pos, sizeof(at_pos), "%s", de->d_name);
		if (i == 1500)
			break;
	}
	if (check(pos >= 0 && at_pos[0], "telldir after 700 entries",
		  "pos %ld", pos)) {
		seekdir(d, pos);
		de = readdir(d);
		snprintf(name, sizeof(name), "%s", de ? de->d_name : "(end)");
		check(!strcmp(name, at_pos),
		      "seekdir to a telldir position resumes there",
		      "got '%s', want '%s'", name, at_pos);
		rewinddir(d);
		de = readdir(d);
		snprintf(name, sizeof(name), "%s", de ? de->d_name : "(end)");
		check(!strcmp(name, first_name),
		      "rewinddir starts over", "got '%s', want '%s'", name,
		      first_name);
	}
	closedir(d);

	memset(seen, 0, sizeof(seen));
	other = 0;
	d = opendir(rp("big"));
	if (d) {
		while ((de = readdir(d)))
			other += tally(de->d_name, seen);
		closedir(d);
	}
	check_tally(seen, other, "REMOTE has the 2000 entries");
}

/* ---- mkdir, rmdir, create, open ----------------------------------------- */

static void t_mkdir(void)
{
	struct stat st;

	if (check_sys(mkdir(mp("md"), 0750), "mkdir 0750")) {
		check(stat(mp("md"), &st) == 0 && S_ISDIR(st.st_mode),
		      "mkdir: a directory", "mode %o", st.st_mode);
		check_mode(mp("md"), 0750, "mkdir 0750: mode");
		check_mode(rp("md"), 0750, "mkdir 0750: mode on REMOTE");
	}
	if (check_sys(mkdir(mp("md/inner"), 0777), "mkdir 0777 nested"))
		check_mode(rp("md/inner"), 0777,
			   "mkdir 0777 with umask 0: on REMOTE");
	if (check_sys(rmdir(mp("md/inner")), "rmdir")) {
		check_gone(mp("md/inner"), "rmdir: gone from the mount");
		check_gone(rp("md/inner"), "rmdir: gone from REMOTE");
	}
	check_sys(rmdir(mp("md")), "rmdir the emptied parent");
}

static void t_create(void)
{
	struct stat st;
	char hundred[100];
	int fd, fd2;

	fd = open(mp("cr_a"), O_CREAT | O_EXCL | O_WRONLY, 0640);
	if (check_sys(fd, "open O_CREAT|O_EXCL 0640")) {
		check(fstat(fd, &st) == 0 &&
			      (lacks("mode") || (st.st_mode & 07777) == 0640) &&
			      S_ISREG(st.st_mode) && st.st_size == 0,
		      "create: fstat gives an empty 0640 file",
		      "mode %o size %lld", st.st_mode, (long long)st.st_size);
		close(fd);
		check_mode(rp("cr_a"), 0640, "create 0640: mode on REMOTE");
	}
	check_open_err(mp("cr_a"), O_CREAT | O_EXCL | O_WRONLY, 0640, EEXIST,
		       "O_CREAT|O_EXCL on an existing file: EEXIST");
	fd = open(mp("cr_b"), O_CREAT | O_WRONLY, 0777);
	if (check_sys(fd, "open O_CREAT 0777")) {
		close(fd);
		check_mode(mp("cr_b"), 0777, "create 0777 with umask 0: mode");
		check_mode(rp("cr_b"), 0777,
			   "create 0777 with umask 0: on REMOTE");
	}
	umask(022);
	fd = open(mp("cr_c"), O_CREAT | O_WRONLY, 0666);
	umask(0);
	if (check_sys(fd, "open O_CREAT 0666 under umask 022")) {
		close(fd);
		check_mode(mp("cr_c"), 0644, "umask 022 applied: mode 0644");
		check_mode(rp("cr_c"), 0644,
			   "umask 022 applied: 0644 on REMOTE");
	}

	memset(hundred, 'h', sizeof(hundred));
	put_file(mp("cr_t"), hundred, sizeof(hundred), 0644);
	fd = open(mp("cr_t"), O_CREAT | O_WRONLY, 0644);
	if (check_sys(fd, "O_CREAT without O_EXCL opens an existing file")) {
		close(fd);
		check_content(mp("cr_t"), hundred, sizeof(hundred),
			      "O_CREAT on an existing file keeps its content");
	}
	fd = open(mp("cr_t"), O_WRONLY | O_TRUNC);
	if (check_sys(fd, "open O_TRUNC")) {
		check(fstat(fd, &st) == 0 && st.st_size == 0,
		      "O_TRUNC: fstat size 0", "size %lld",
		      (long long)st.st_size);
		close(fd);
		check_str(rp("cr_t"), "", "O_TRUNC: REMOTE file is empty");
	}

	put_str(mp("cr_ap"), "abc");
	fd = open(mp("cr_ap"), O_WRONLY | O_APPEND);
	if (check_sys(fd, "open O_APPEND")) {
		write_all(fd, "123", 3);
		lseek(fd, 0, SEEK_SET);
		write_all(fd, "456", 3);
		close(fd);
		check_str(mp("cr_ap"), "abc123456",
			  "O_APPEND: two writes land at the end");
	}
	fd = open(mp("cr_ap"), O_WRONLY | O_APPEND);
	fd2 = open(mp("cr_ap"), O_WRONLY | O_APPEND);
	if (check(fd >= 0 && fd2 >= 0, "O_APPEND: two fds", "%s",
		  strerror(errno))) {
		write_all(fd, "X", 1);
		write_all(fd2, "Y", 1);
		write_all(fd, "Z", 1);
		close(fd);
		close(fd2);
		check_str(mp("cr_ap"), "abc123456XYZ",
			  "O_APPEND: interleaved appends from two fds");
		check_str(rp("cr_ap"), "abc123456XYZ",
			  "O_APPEND: same on REMOTE");
	} else {
		if (fd >= 0)
			close(fd);
		if (fd2 >= 0)
			close(fd2);
	}
	check_open_err(mp("cr_missing"), O_RDONLY, 0, ENOENT,
		       "open of a missing file without O_CREAT: ENOENT");
	fd = creat(mp("cr_ap"), 0644);
	if (check_sys(fd, "creat() an existing file")) {
		close(fd);
		check_str(rp("cr_ap"), "", "creat() truncates, on REMOTE");
	}
}

/* ---- read / write ------------------------------------------------------- */

static void t_big_file(void)
{
	size_t size = 16 * MiB;
	unsigned char *buf = malloc(size);
	uint64_t want, got;
	struct stat st;
	off_t len;
	int fd, rc = 0;

	if (!check(buf != NULL, "16 MiB: allocate", "out of memory"))
		return;
	fill_pattern(buf, size, 1);
	want = fnv1a(buf, size, FNV_INIT);
	fd = open(mp("rw_big"), O_CREAT | O_TRUNC | O_WRONLY, 0644);
	if (!check_sys(fd, "16 MiB: create")) {
		free(buf);
		return;
	}
	/* odd chunk sizes so that writes straddle every boundary */
	for (size_t off = 0; off < size && !rc;) {
		size_t n = MiB + 4097;

		if (n > size - off)
			n = size - off;
		rc = write_all(fd, buf + off, n);
		off += n;
	}
	check_rc(rc, "16 MiB: write in 1 MiB + 4097 chunks");
	check(fstat(fd, &st) == 0 && st.st_size == (off_t)size,
	      "16 MiB: fstat size before close", "size %lld",
	      (long long)st.st_size);
	check_sys(close(fd), "16 MiB: close");
	got = file_sum(mp("rw_big"), &len);
	check(got == want && len == (off_t)size,
	      "16 MiB: read back, checksum equal",
	      "%lld bytes, fnv %016llx want %016llx", (long long)len,
	      (unsigned long long)got, (unsigned long long)want);
	got = file_sum(rp("rw_big"), &len);
	check(got == want && len == (off_t)size,
	      "16 MiB: REMOTE copy, checksum equal",
	      "%lld bytes, fnv %016llx want %016llx", (long long)len,
	      (unsigned long long)got, (unsigned long long)want);
	check(stat(mp("rw_big"), &st) == 0 &&
		      (long long)st.st_blocks * 512 >= (long long)size,
	      "16 MiB: st_blocks covers the size", "st_blocks %lld",
	      (long long)st.st_blocks);
	free(buf);
}

static void t_unaligned(void)
{
	size_t size = 64 * KiB + 5;
	unsigned char *model = malloc(size);
	unsigned char *buf = malloc(size);
	unsigned char data[5000];
	int fd, bad = 0, rc = 0;

	if (!model || !buf) {
		check(false, "unaligned: allocate", "out of memory");
		goto out;
	}
	fill_pattern(model, size, 2);
	put_file(mp("rw_unal"), model, size, 0644);
	fd = open(mp("rw_unal"), O_RDWR);
	if (!check_sys(fd, "unaligned: open O_RDWR"))
		goto out;
	rng_state = 7;
	for (int i = 0; i < 300 && !rc; i++) {
		size_t off = rng() % (size - 1);
		size_t len = 1 + rng() % sizeof(data);

		if (len > size - off)
			len = size - off;
		fill_pattern(data, len, 100 + i);
		rc = pwrite_all(fd, data, len, off);
		memcpy(model + off, data, len);
	}
	check_rc(rc, "unaligned: 300 pwrites at odd offsets and lengths");
	for (int i = 0; i < 200; i++) {
		size_t off = rng() % size;
		size_t len = 1 + rng() % 7000;
		ssize_t n;

		if (len > size - off)
			len = size - off;
		n = pread_all(fd, buf, len, off);
		if (n != (ssize_t)len || memcmp(buf, model + off, len))
			bad++;
	}
	check(!bad, "unaligned: 200 preads at odd offsets see the writes",
	      "%d preads wrong", bad);
	close(fd);
	check_content(mp("rw_unal"), model, size,
		      "unaligned: whole file equals the model");
	check_content(rp("rw_unal"), model, size,
		      "unaligned: REMOTE equals the model");
out:
	free(model);
	free(buf);
}

static void t_rw_misc(void)
{
	size_t hole = MiB + 2;
	unsigned char *buf = calloc(1, hole);
	unsigned char b[16];
	struct stat st;
	int fd;

	if (!buf)
		return;

	/* a write past EOF leaves a hole of zeros */
	memcpy(buf, "0123456789", 10);
	buf[hole - 1] = 'Z';
	put_str(mp("rw_hole"), "0123456789");
	fd = open(mp("rw_hole"), O_WRONLY);
	if (check_sys(fd, "hole: open")) {
		check(pwrite(fd, "Z", 1, hole - 1) == 1,
		      "pwrite 1 byte at 1 MiB + 1", "%s", strerror(errno));
		check(fstat(fd, &st) == 0 && st.st_size == (off_t)hole,
		      "write past EOF: size 1 MiB + 2", "size %lld",
		      (long long)st.st_size);
		close(fd);
		check_content(mp("rw_hole"), buf, hole,
			      "write past EOF: the gap reads as zeros");
		check_content(rp("rw_hole"), buf, hole,
			      "write past EOF: same on REMOTE");
		check(lstat(rp("rw_hole"), &st) == 0 &&
			      st.st_blocks * 512 < 512 * KiB,
		      "write past EOF: the hole stays sparse on REMOTE",
		      "remote st_blocks %lld for a 1 MiB file",
		      (long long)st.st_blocks);
	}
	free(buf);

	/* pread/pwrite leave the file offset alone */
	put_str(mp("rw_pos"), "abcdefghij");
	fd = open(mp("rw_pos"), O_RDWR);
	if (check_sys(fd, "pread/pwrite: open")) {
		lseek(fd, 3, SEEK_SET);
		check(pwrite(fd, "XY", 2, 7) == 2, "pwrite 2 bytes at 7", "%s",
		      strerror(errno));
		check(pread(fd, b, 2, 0) == 2 && !memcmp(b, "ab", 2),
		      "pread 2 bytes at 0", "%s", strerror(errno));
		check(lseek(fd, 0, SEEK_CUR) == 3,
		      "pread/pwrite do not move the file offset", "offset %ld",
		      (long)lseek(fd, 0, SEEK_CUR));
		check(read(fd, b, 2) == 2 && !memcmp(b, "de", 2),
		      "read continues at the file offset", "got '%.2s'", b);
		check(pread(fd, b, 16, 0) == 10 && !memcmp(b, "abcdefgXYj", 10),
		      "pread sees the pwrite through the same fd", "got '%.10s'",
		      b);
		lseek(fd, 0, SEEK_END);
		check(read(fd, b, 16) == 0, "read at EOF returns 0", "-");
		check(pread(fd, b, 16, 100) == 0, "pread past EOF returns 0",
		      "-");
		close(fd);
		check_str(rp("rw_pos"), "abcdefgXYj", "pwrite: on REMOTE");
	}

	/* 64-bit offsets */
	fd = open(mp("rw_large"), O_CREAT | O_RDWR, 0644);
	if (check_sys(fd, "large offset: create")) {
		check(pwrite(fd, "L", 1, 5 * GiB) == 1, "pwrite at 5 GiB", "%s",
		      strerror(errno));
		check(pread(fd, b, 1, 5 * GiB) == 1 && b[0] == 'L',
		      "pread at 5 GiB", "%s", strerror(errno));
		check(fstat(fd, &st) == 0 && st.st_size == 5 * GiB + 1,
		      "size 5 GiB + 1 after a write at 5 GiB", "size %lld",
		      (long long)st.st_size);
		close(fd);
		check(lstat(rp("rw_large"), &st) == 0 &&
			      st.st_size == 5 * GiB + 1,
		      "size 5 GiB + 1 on REMOTE", "size %lld",
		      (long long)st.st_size);
		unlink(mp("rw_large"));
	}
}

/* ---- close, flush, fsync ------------------------------------------------ */

static void t_fsync(void)
{
	int fd, fd2, dfd;

	fd = open(mp("fs_f"), O_CREAT | O_RDWR, 0644);
	if (!check_sys(fd, "fsync: create"))
		return;
	write_all(fd, "data", 4);
	check_sys(fsync(fd), "fsync");
	check_sys(fdatasync(fd), "fdatasync");
	check_sys(syncfs(fd), "syncfs");
	fd2 = dup(fd);
	check_sys(close(fd), "close returns 0");
	check_sys(write(fd2, "more", 4), "write through a dup after close");
	check_sys(close(fd2), "close of the dup returns 0");
	check_str(mp("fs_f"), "datamore", "writes through both fds kept");
	check_str(rp("fs_f"), "datamore", "after close: REMOTE has the data");
	fd = open(mp("fs_f"), O_RDONLY);
	if (check_sys(fd, "fsync: open O_RDONLY")) {
		check_sys(fsync(fd), "fsync on an O_RDONLY fd");
		close(fd);
	}
	mkdir(mp("fs_d"), 0755);
	dfd = open(mp("fs_d"), O_RDONLY | O_DIRECTORY);
	if (check_sys(dfd, "open a directory O_RDONLY")) {
		check_sys(fsync(dfd), "fsync on a directory fd");
		close(dfd);
	}
}

/* ---- unlink ------------------------------------------------------------- */

static void t_unlink(void)
{
	struct stat st;
	char b[16];
	int fd;

	put_str(mp("ul_a"), "x");
	if (check_sys(unlink(mp("ul_a")), "unlink")) {
		check_gone(mp("ul_a"), "unlink: gone from the mount");
		check_gone(rp("ul_a"), "unlink: gone from REMOTE");
	}

	/* open, unlink, keep using: sqlite and git temp files do this */
	fd = open(mp("ul_tmp"), O_CREAT | O_EXCL | O_RDWR, 0600);
	if (check_sys(fd, "open-unlink: create")) {
		write_all(fd, "data1", 5);
		check_sys(unlink(mp("ul_tmp")), "unlink an open file");
		check_gone(mp("ul_tmp"), "open-unlink: name is gone");
		check(fstat(fd, &st) == 0 && st.st_size == 5 &&
			      S_ISREG(st.st_mode),
		      "open-unlink: fstat still works", "%s, size %lld",
		      strerror(errno), (long long)st.st_size);
		check(pwrite(fd, "more", 4, 5) == 4,
		      "open-unlink: pwrite still works", "%s",
		      strerror(errno));
		memset(b, 0, sizeof(b));
		check(pread(fd, b, sizeof(b), 0) == 9 &&
			      !memcmp(b, "data1more", 9),
		      "open-unlink: pread sees all the data", "got '%.9s' (%s)",
		      b, strerror(errno));
		check(ftruncate(fd, 3) == 0 && fstat(fd, &st) == 0 &&
			      st.st_size == 3,
		      "open-unlink: ftruncate still works", "%s size %lld",
		      strerror(errno), (long long)st.st_size);
		check_sys(fsync(fd), "open-unlink: fsync still works");
		check(fchmod(fd, 0640) == 0 && fstat(fd, &st) == 0 &&
			      (lacks("mode") || (st.st_mode & 07777) == 0640),
		      "open-unlink: fchmod still works", "%s mode %o",
		      strerror(errno), st.st_mode);
		check_sys(close(fd), "open-unlink: close");
		check_gone(rp("ul_tmp"), "open-unlink: gone from REMOTE");
	}

	/* a new file under the old name while the old one is open */
	fd = open(mp("ul_re"), O_CREAT | O_RDWR, 0644);
	if (check_sys(fd, "unlink+recreate: create")) {
		write_all(fd, "old", 3);
		unlink(mp("ul_re"));
		check_rc(put_str(mp("ul_re"), "new"),
			 "unlink+recreate: new file under the same name");
		memset(b, 0, sizeof(b));
		check(pread(fd, b, sizeof(b), 0) == 3 && !memcmp(b, "old", 3),
		      "unlink+recreate: old fd still reads the old data",
		      "got '%.3s'", b);
		pwrite(fd, "OLDX", 4, 0);
		close(fd);
		check_str(mp("ul_re"), "new",
			  "unlink+recreate: old fd writes do not reach the "
			  "new file");
		check_str(rp("ul_re"), "new", "unlink+recreate: REMOTE");
	}

	/* the other hard link keeps working after the first name goes */
	put_str(mp("ul_h1"), "hard");
	if (!feature_skipped("hardlink", "unlink: link", "no hard links") &&
	    check_sys(link(mp("ul_h1"), mp("ul_h2")), "unlink: link")) {
		stat(mp("ul_h1"), &st);
		stat(mp("ul_h2"), &st);
		check_sys(unlink(mp("ul_h1")), "unlink the first hard link");
		check(stat(mp("ul_h2"), &st) == 0 && st.st_nlink == 1,
		      "remaining hard link: nlink 1", "nlink %lu (%s)",
		      (unsigned long)st.st_nlink, strerror(errno));
		check_str(mp("ul_h2"), "hard", "remaining hard link: content");
		check_sys(chmod(mp("ul_h2"), 0600),
			  "remaining hard link: chmod");
		check_mode(rp("ul_h2"), 0600,
			   "remaining hard link: chmod reached REMOTE");
		check_gone(rp("ul_h1"), "first hard link gone from REMOTE");
	}
}

/* ---- rename ------------------------------------------------------------- */

static void t_rename(void)
{
	struct stat st, st2;
	DIR *dir;
	char b[16];
	int fd;

	/* over an existing file, which stays readable through an open fd */
	put_str(mp("rn_a"), "A-content");
	put_str(mp("rn_b"), "B");
	stat(mp("rn_a"), &st);
	fd = open(mp("rn_b"), O_RDONLY);
	if (check_sys(rename(mp("rn_a"), mp("rn_b")),
		      "rename over an existing file")) {
		check_gone(mp("rn_a"), "rename: source name gone");
		check_gone(rp("rn_a"), "rename: source name gone on REMOTE");
		check_str(mp("rn_b"), "A-content", "rename: target has the "
			  "source's content");
		check_str(rp("rn_b"), "A-content", "rename: same on REMOTE");
		check(stat(mp("rn_b"), &st2) == 0 && st2.st_ino == st.st_ino,
		      "rename keeps st_ino", "%lu -> %lu",
		      (unsigned long)st.st_ino, (unsigned long)st2.st_ino);
		memset(b, 0, sizeof(b));
		check(fd >= 0 && pread(fd, b, sizeof(b), 0) == 1 && b[0] == 'B',
		      "rename: an fd open on the replaced file reads its old "
		      "data",
		      "got '%.1s'", b);
		check_sys(chmod(mp("rn_b"), 0600), "chmod the renamed file");
		check_mode(rp("rn_b"), 0600,
			   "chmod after rename reaches the new name on REMOTE");
	}
	if (fd >= 0)
		close(fd);

	/* a directory and everything below it */
	mkdir(mp("rn_d1"), 0755);
	mkdir(mp("rn_d1/sub"), 0755);
	put_str(mp("rn_d1/x"), "x-data");
	put_str(mp("rn_d1/sub/y"), "y-data");
	stat(mp("rn_d1/sub/y"), &st);
	fd = open(mp("rn_d1/x"), O_WRONLY | O_APPEND);
	if (check_sys(rename(mp("rn_d1"), mp("rn_d2")),
		      "rename a directory")) {
		check_gone(mp("rn_d1"), "rename dir: old name gone");
		check_gone(rp("rn_d1"), "rename dir: old name gone on REMOTE");
		check_str(mp("rn_d2/sub/y"), "y-data",
			  "rename dir: contents follow");
		check_str(rp("rn_d2/sub/y"), "y-data",
			  "rename dir: contents follow on REMOTE");
		check(stat(mp("rn_d2/sub/y"), &st2) == 0 &&
			      st2.st_ino == st.st_ino,
		      "rename dir: a child keeps its st_ino", "%lu -> %lu",
		      (unsigned long)st.st_ino, (unsigned long)st2.st_ino);
		check_sys(chmod(mp("rn_d2/sub/y"), 0600),
			  "rename dir: chmod a child under the new name");
		check_mode(rp("rn_d2/sub/y"), 0600,
			   "rename dir: chmod of the child reached REMOTE");
		check_rc(put_str(mp("rn_d2/sub/z"), "z"),
			 "rename dir: create under the new name");
		check_str(rp("rn_d2/sub/z"), "z",
			  "rename dir: new child on REMOTE");
		if (fd >= 0)
			check(write(fd, "+more", 5) == 5,
			      "rename dir: write through an fd opened before",
			      "%s", strerror(errno));
	}
	if (fd >= 0) {
		close(fd);
		check_str(rp("rn_d2/x"), "x-data+more",
			  "rename dir: that write reached REMOTE");
	}

	/* a listing taken (opendir) before a rename of one of its entries
	 * and read (readdirplus) after it: the object keeps its new name,
	 * the old one is not made again */
	mkdir(mp("rn_l1"), 0755);
	mkdir(mp("rn_l2"), 0755);
	put_str(mp("rn_l1/x"), "listed");
	dir = opendir(mp("rn_l1"));
	if (check(dir != NULL, "rename after opendir: opendir", "%s",
		  strerror(errno)) &&
	    check_sys(rename(mp("rn_l1/x"), mp("rn_l2/x")),
		      "rename after opendir: rename")) {
		while (readdir(dir))
			;
		check_str(mp("rn_l2/x"), "listed",
			  "rename after opendir, then readdir: the new name "
			  "opens");
		check_gone(mp("rn_l1/x"),
			   "rename after opendir, then readdir: the old name "
			   "is gone");
	}
	if (dir)
		closedir(dir);

	/* RENAME_NOREPLACE */
	put_str(mp("rn_c"), "C");
	check_err(renameat2(AT_FDCWD, mp("rn_c"), AT_FDCWD, mp("rn_b"),
			    RENAME_NOREPLACE),
		  EEXIST, "RENAME_NOREPLACE onto an existing name: EEXIST");
	check_str(mp("rn_c"), "C", "RENAME_NOREPLACE: source untouched");
	check_str(rp("rn_b"), "A-content",
		  "RENAME_NOREPLACE: target untouched on REMOTE");
	if (check_sys(renameat2(AT_FDCWD, mp("rn_c"), AT_FDCWD, mp("rn_c2"),
				RENAME_NOREPLACE),
		      "RENAME_NOREPLACE onto a free name"))
		check_str(rp("rn_c2"), "C", "RENAME_NOREPLACE: on REMOTE");

	/* RENAME_EXCHANGE: files, then directories */
	put_str(mp("rn_e1"), "one");
	put_str(mp("rn_e2"), "two");
	stat(mp("rn_e1"), &st);
	stat(mp("rn_e2"), &st2);
	if (!feature_skipped("exchange", "RENAME_EXCHANGE two files",
			     "no atomic exchange") &&
	    check_sys(renameat2(AT_FDCWD, mp("rn_e1"), AT_FDCWD, mp("rn_e2"),
				RENAME_EXCHANGE),
		      "RENAME_EXCHANGE two files")) {
		check_str(mp("rn_e1"), "two", "RENAME_EXCHANGE: first swapped");
		check_str(mp("rn_e2"), "one", "RENAME_EXCHANGE: second swapped");
		check_str(rp("rn_e1"), "two",
			  "RENAME_EXCHANGE: first swapped on REMOTE");
		check_str(rp("rn_e2"), "one",
			  "RENAME_EXCHANGE: second swapped on REMOTE");
		chmod(mp("rn_e1"), 0600);
		check(mode_of(rp("rn_e1")) == 0600 &&
			      mode_of(rp("rn_e2")) == 0644,
		      "RENAME_EXCHANGE: chmod after it hits the right file "
		      "on REMOTE",
		      "remote modes %lo and %lo", mode_of(rp("rn_e1")),
		      mode_of(rp("rn_e2")));
	}
	mkdir(mp("rn_x1"), 0755);
	mkdir(mp("rn_x2"), 0755);
	put_str(mp("rn_x1/in1"), "1");
	put_str(mp("rn_x2/in2"), "2");
	if (!feature_skipped("exchange", "RENAME_EXCHANGE two directories",
			     "no atomic exchange") &&
	    check_sys(renameat2(AT_FDCWD, mp("rn_x1"), AT_FDCWD, mp("rn_x2"),
				RENAME_EXCHANGE),
		      "RENAME_EXCHANGE two directories")) {
		check(access(mp("rn_x1/in2"), F_OK) == 0 &&
			      access(mp("rn_x2/in1"), F_OK) == 0,
		      "RENAME_EXCHANGE dirs: contents swapped", "%s",
		      strerror(errno));
		check(access(rp("rn_x1/in2"), F_OK) == 0 &&
			      access(rp("rn_x2/in1"), F_OK) == 0,
		      "RENAME_EXCHANGE dirs: swapped on REMOTE", "%s",
		      strerror(errno));
	}
	check_err(renameat2(AT_FDCWD, mp("rn_e1"), AT_FDCWD, mp("rn_nothere"),
			    RENAME_EXCHANGE),
		  ENOENT, "RENAME_EXCHANGE with a missing target: ENOENT");

	/* directories: into themselves, over others */
	mkdir(mp("rn_p"), 0755);
	mkdir(mp("rn_p/child"), 0755);
	check_err(rename(mp("rn_p"), mp("rn_p/child/x")), EINVAL,
		  "rename a dir into its own subdir: EINVAL");
	check_err(rename(mp("rn_p"), mp("rn_p/x")), EINVAL,
		  "rename a dir into itself: EINVAL");
	mkdir(mp("rn_full"), 0755);
	put_str(mp("rn_full/f"), "f");
	mkdir(mp("rn_empty"), 0755);
	if (check_sys(rename(mp("rn_full"), mp("rn_empty")),
		      "rename a dir over an empty dir"))
		check_str(rp("rn_empty/f"), "f",
			  "dir over empty dir: contents on REMOTE");
	mkdir(mp("rn_full2"), 0755);
	check_err2(rename(mp("rn_full2"), mp("rn_empty")), ENOTEMPTY, EEXIST,
		   "rename a dir over a non-empty dir: ENOTEMPTY");
	check_err(rename(mp("rn_b"), mp("rn_full2")), EISDIR,
		  "rename a file over a dir: EISDIR");
	check_err(rename(mp("rn_full2"), mp("rn_b")), ENOTDIR,
		  "rename a dir over a file: ENOTDIR");
	check_err(rename(mp("rn_nothere"), mp("rn_nothere2")), ENOENT,
		  "rename a missing file: ENOENT");
	check_sys(rename(mp("rn_b"), mp("rn_b")), "rename a file onto itself");
	check_str(mp("rn_b"), "A-content", "rename onto itself keeps it");
}

/* ---- link, symlink ------------------------------------------------------ */

static void t_link(void)
{
	struct stat a, b;

	if (feature_skipped("hardlink", "link", "no hard links"))
		return;
	put_str(mp("lk_a"), "link-data");
	if (!check_sys(link(mp("lk_a"), mp("lk_b")), "link"))
		return;
	check_str(mp("lk_b"), "link-data", "link: same content");
	{
		int fd = open(mp("lk_b"), O_WRONLY | O_APPEND);

		if (fd >= 0) {
			write_all(fd, "+", 1);
			close(fd);
		}
	}
	check_str(mp("lk_a"), "link-data+",
		  "link: a write through one name shows through the other");
	check(stat(mp("lk_a"), &a) == 0 && stat(mp("lk_b"), &b) == 0 &&
		      a.st_ino == b.st_ino && a.st_nlink == 2,
	      "link: one inode, nlink 2", "ino %lu/%lu nlink %lu",
	      (unsigned long)a.st_ino, (unsigned long)b.st_ino,
	      (unsigned long)a.st_nlink);
	check(lstat(rp("lk_a"), &a) == 0 && lstat(rp("lk_b"), &b) == 0 &&
		      a.st_ino == b.st_ino,
	      "link: one inode on REMOTE", "ino %lu/%lu",
	      (unsigned long)a.st_ino, (unsigned long)b.st_ino);
	check_err(link(mp("lk_a"), mp("lk_b")), EEXIST,
		  "link to an existing name: EEXIST");
	mkdir(mp("lk_dir"), 0755);
	check_err(link(mp("lk_dir"), mp("lk_dir2")), EPERM,
		  "link a directory: EPERM");

	/* one inode under two directories; the first directory moves away */
	mkdir(mp("lk_d1"), 0755);
	mkdir(mp("lk_d2"), 0755);
	put_str(mp("lk_d1/f"), "two dirs");
	if (!check_sys(link(mp("lk_d1/f"), mp("lk_d2/g")),
		       "link into another directory"))
		return;
	stat(mp("lk_d1/f"), &a);
	stat(mp("lk_d2/g"), &b);
	if (check_sys(rename(mp("lk_d1"), mp("lk_d1moved")),
		      "rename the first link's directory")) {
		check_sys(chmod(mp("lk_d2/g"), 0600),
			  "chmod through the second link");
		check_mode(rp("lk_d2/g"), 0600,
			   "chmod through the second link reached REMOTE");
		check_mode(rp("lk_d1moved/f"), 0600,
			   "and the first link (same inode) on REMOTE");
	}
	if (check_sys(unlink(mp("lk_d1moved/f")), "unlink the first link")) {
		int fd = open(mp("lk_d2/g"), O_WRONLY | O_APPEND);

		check(fd >= 0 && write(fd, "+", 1) == 1,
		      "write through the remaining link", "%s",
		      strerror(errno));
		if (fd >= 0)
			close(fd);
		check_str(rp("lk_d2/g"), "two dirs+",
			  "the remaining link has the write on REMOTE");
	}
}

static void t_symlink(void)
{
	char target[1001];
	char b[PATH_MAX];
	struct stat st;
	ssize_t n;

	if (feature_skipped("symlink", "symlink", "no symlinks"))
		return;
	if (check_sys(symlink("/etc/passwd", mp("sl_abs")),
		      "symlink with an absolute target")) {
		n = readlink(mp("sl_abs"), b, sizeof(b));
		check(n == 11 && !memcmp(b, "/etc/passwd", 11),
		      "readlink: absolute target verbatim", "got '%.*s'",
		      (int)(n < 0 ? 0 : n), b);
		n = readlink(rp("sl_abs"), b, sizeof(b));
		check(n == 11 && !memcmp(b, "/etc/passwd", 11),
		      "readlink on REMOTE: absolute target verbatim",
		      "got '%.*s'", (int)(n < 0 ? 0 : n), b);
	}
	if (check_sys(symlink("../../..", mp("escape-link")),
		      "symlink to ../../..")) {
		n = readlink(mp("escape-link"), b, sizeof(b));
		check(n == 8 && !memcmp(b, "../../..", 8),
		      "readlink: ../../.. verbatim", "got '%.*s'",
		      (int)(n < 0 ? 0 : n), b);
		check(lstat(mp("escape-link"), &st) == 0 &&
			      S_ISLNK(st.st_mode) && st.st_size == 8,
		      "lstat ../../.. link: S_IFLNK size 8", "mode %o size %lld",
		      st.st_mode, (long long)st.st_size);
		n = readlink(rp("escape-link"), b, sizeof(b));
		check(n == 8 && !memcmp(b, "../../..", 8),
		      "readlink on REMOTE: ../../.. verbatim", "got '%.*s'",
		      (int)(n < 0 ? 0 : n), b);
	}
	for (size_t i = 0; i < sizeof(target) - 1; i++)
		target[i] = (i % 2) ? '/' : 'a' + i % 26;
	target[sizeof(target) - 1] = 0;
	if (check_sys(symlink(target, mp("sl_long")),
		      "symlink with a 1000-byte target")) {
		n = readlink(mp("sl_long"), b, sizeof(b));
		check(n == 1000 && !memcmp(b, target, 1000),
		      "readlink: 1000-byte target verbatim", "got %zd bytes",
		      n);
	}
	put_str(mp("sl_target"), "T");
	if (check_sys(symlink("sl_target", mp("sl_rel")), "relative symlink"))
		check_str(mp("sl_rel"), "T", "open follows a relative symlink");
	if (check_sys(symlink("nowhere/x", mp("sl_dangling")),
		      "dangling symlink")) {
		check_sys(lstat(mp("sl_dangling"), &st),
			  "lstat of a dangling symlink");
		check_err(stat(mp("sl_dangling"), &st), ENOENT,
			  "stat through a dangling symlink: ENOENT");
	}
	check_err(readlink(mp("sl_target"), b, sizeof(b)), EINVAL,
		  "readlink of a regular file: EINVAL");
	check_err(symlink("x", mp("sl_target")), EEXIST,
		  "symlink onto an existing name: EEXIST");
	check_open_err(mp("sl_rel"), O_RDONLY | O_NOFOLLOW, 0, ELOOP,
		       "open O_NOFOLLOW of a symlink: ELOOP");
}

/* ---- mknod -------------------------------------------------------------- */

static void t_mknod(void)
{
	const char msg[] = "through the fifo";
	struct stat st;
	char b[64];
	pid_t pid;
	int fd;

	if (feature_skipped("mknod", "mkfifo", "no fifos"))
		;
	else if (check_sys(mkfifo(mp("nd_fifo"), 0644), "mkfifo")) {
		check(lstat(mp("nd_fifo"), &st) == 0 && S_ISFIFO(st.st_mode) &&
			      (st.st_mode & 07777) == 0644,
		      "mkfifo: S_IFIFO 0644", "mode %o", st.st_mode);
		check(lstat(rp("nd_fifo"), &st) == 0 && S_ISFIFO(st.st_mode),
		      "mkfifo: a fifo on REMOTE", "mode %o", st.st_mode);

		fd = open(mp("nd_fifo"), O_RDONLY | O_NONBLOCK);
		if (check_sys(fd, "fifo: open the read end")) {
			fflush(stdout);
			pid = fork();
			if (pid == 0) {
				int w;

				alarm(20);
				w = open(mp("nd_fifo"), O_WRONLY);
				if (w < 0 || write_all(w, msg, sizeof(msg)))
					_exit(1);
				_exit(0);
			}
			struct pollfd pfd = { fd, POLLIN, 0 };
			size_t got = 0;

			while (got < sizeof(msg) && poll(&pfd, 1, 10000) > 0) {
				ssize_t n = read(fd, b + got, sizeof(b) - got);

				if (n <= 0 && errno != EAGAIN)
					break;
				if (n > 0)
					got += n;
			}
			waitpid(pid, NULL, 0);
			close(fd);
			check(got == sizeof(msg) && !memcmp(b, msg, got),
			      "fifo: a writer and a reader talk through it",
			      "read %zu bytes", got);
		}
	}
	check_err(mknod(mp("nd_chr"), S_IFCHR | 0600, makedev(1, 3)), EPERM,
		  "mknod of a char device: EPERM");
	check_gone(rp("nd_chr"), "refused char device not on REMOTE");
	if (check_sys(mknod(mp("nd_reg"), S_IFREG | 0640, 0),
		      "mknod S_IFREG")) {
		check(lstat(rp("nd_reg"), &st) == 0 && S_ISREG(st.st_mode) &&
			      (lacks("mode") || (st.st_mode & 07777) == 0640),
		      "mknod S_IFREG: regular 0640 file on REMOTE", "mode %o",
		      st.st_mode);
	}
	if (!lacks("mknod"))
		check_err(mkfifo(mp("nd_fifo"), 0644), EEXIST,
			  "mkfifo onto an existing name: EEXIST");
}

/* ---- statfs ------------------------------------------------------------- */

static void t_statfs(void)
{
	struct statvfs m, r;
	double mt, rt;

	if (!check_sys(statvfs(mnt_root, &m), "statvfs of the mount"))
		return;
	check(m.f_bsize > 0, "statvfs: f_bsize > 0", "f_bsize %lu", m.f_bsize);
	check(m.f_blocks > 0, "statvfs: f_blocks > 0", "f_blocks %llu",
	      (unsigned long long)m.f_blocks);
	check(m.f_namemax >= 255, "statvfs: f_namemax >= 255", "f_namemax %lu",
	      m.f_namemax);
	if (statvfs(remote_root, &r) == 0) {
		mt = (double)m.f_blocks * m.f_frsize;
		rt = (double)r.f_blocks * r.f_frsize;
		check(mt > rt * 0.99 && mt < rt * 1.01,
		      "statvfs: total size is the share's",
		      "mount %.0f bytes, remote %.0f", mt, rt);
	}
}

/* ---- xattr -------------------------------------------------------------- */

static bool list_has(const char *list, ssize_t len, const char *name)
{
	for (ssize_t i = 0; i < len; i += strlen(list + i) + 1)
		if (!strcmp(list + i, name))
			return true;
	return false;
}

static void t_xattr(void)
{
	if (feature_skipped("xattr", "user xattrs", "no xattrs"))
		return;
	const char bin[] = { 'a', 0, 'b', 0, (char)0xff };
	char b[256], list[1024];
	ssize_t n;

	put_str(rp("xa_probe"), "p");
	if (lsetxattr(rp("xa_probe"), "user.probe", "1", 1, 0)) {
		skip("user xattrs", "the backing fs has no user xattrs");
		return;
	}
	put_str(mp("xa_f"), "x");
	if (!check_sys(setxattr(mp("xa_f"), "user.test", "value1", 6, 0),
		       "setxattr user.test"))
		return;
	n = getxattr(mp("xa_f"), "user.test", b, sizeof(b));
	check(n == 6 && !memcmp(b, "value1", 6), "getxattr gets the value",
	      "got %zd '%.*s'", n, (int)(n < 0 ? 0 : n), b);
	n = getxattr(mp("xa_f"), "user.test", NULL, 0);
	check(n == 6, "getxattr with size 0 gives the length", "got %zd", n);
	check_err(getxattr(mp("xa_f"), "user.test", b, 2), ERANGE,
		  "getxattr into a too small buffer: ERANGE");
	n = lgetxattr(rp("xa_f"), "user.test", b, sizeof(b));
	check(n == 6 && !memcmp(b, "value1", 6),
	      "xattr value on REMOTE (lgetxattr)", "got %zd (%s)", n,
	      n < 0 ? strerror(errno) : "-");
	n = listxattr(mp("xa_f"), list, sizeof(list));
	check(n > 0 && list_has(list, n, "user.test"),
	      "listxattr names user.test", "got %zd", n);
	n = listxattr(mp("xa_f"), NULL, 0);
	check(n > 0, "listxattr with size 0 gives the length", "got %zd", n);
	check_err(setxattr(mp("xa_f"), "user.test", "v2", 2, XATTR_CREATE),
		  EEXIST, "setxattr XATTR_CREATE on an existing name: EEXIST");
	check_err(setxattr(mp("xa_f"), "user.nothere", "v", 1, XATTR_REPLACE),
		  ENODATA, "setxattr XATTR_REPLACE on a missing name: ENODATA");
	check_sys(setxattr(mp("xa_f"), "user.test", "v2", 2, XATTR_REPLACE),
		  "setxattr XATTR_REPLACE on an existing name");
	n = getxattr(mp("xa_f"), "user.test", b, sizeof(b));
	check(n == 2 && !memcmp(b, "v2", 2), "XATTR_REPLACE changed the value",
	      "got %zd", n);
	check_err(getxattr(mp("xa_f"), "user.missing", b, sizeof(b)), ENODATA,
		  "getxattr of a missing name: ENODATA");
	if (check_sys(setxattr(mp("xa_f"), "user.bin", bin, sizeof(bin), 0),
		      "setxattr a binary value with NULs")) {
		n = getxattr(mp("xa_f"), "user.bin", b, sizeof(b));
		check(n == sizeof(bin) && !memcmp(b, bin, sizeof(bin)),
		      "binary xattr value round trip", "got %zd", n);
	}
	if (check_sys(setxattr(mp("xa_f"), "user.empty", "", 0, 0),
		      "setxattr an empty value"))
		check(getxattr(mp("xa_f"), "user.empty", b, sizeof(b)) == 0,
		      "empty xattr value reads as 0 bytes", "%s",
		      strerror(errno));
	if (check_sys(removexattr(mp("xa_f"), "user.test"), "removexattr")) {
		check_err(getxattr(mp("xa_f"), "user.test", b, sizeof(b)),
			  ENODATA, "removexattr: getxattr then ENODATA");
		check_err(lgetxattr(rp("xa_f"), "user.test", b, sizeof(b)),
			  ENODATA, "removexattr: gone on REMOTE");
	}
	check_err(removexattr(mp("xa_f"), "user.test"), ENODATA,
		  "removexattr of a missing name: ENODATA");
	/* while open here (cp -a sets the ACL before it closes): through the
	 * open file, with the same answers */
	int fd = open(mp("xa_f"), O_RDONLY);

	if (check_sys(fd, "xattr while open: open read-only")) {
		check_sys(setxattr(mp("xa_f"), "user.open", "o", 1, 0),
			  "setxattr by path while open");
		check_err(setxattr(mp("xa_f"), "user.open", "o", 1,
				   XATTR_CREATE),
			  EEXIST, "setxattr XATTR_CREATE while open: EEXIST");
		check_sys(fsetxattr(fd, "user.fd", "f", 1, 0),
			  "fsetxattr on the open fd");
		check(lgetxattr(rp("xa_f"), "user.open", b, sizeof(b)) == 1 &&
			      lgetxattr(rp("xa_f"), "user.fd", b, sizeof(b)) == 1,
		      "set while open: both on REMOTE", "%s", strerror(errno));
		close(fd);
	}
	mkdir(mp("xa_d"), 0755);
	if (check_sys(setxattr(mp("xa_d"), "user.dir", "d", 1, 0),
		      "setxattr on a directory"))
		check(lgetxattr(rp("xa_d"), "user.dir", b, sizeof(b)) == 1,
		      "directory xattr on REMOTE", "%s", strerror(errno));
}

/* ---- fallocate, SEEK_DATA/SEEK_HOLE, copy_file_range -------------------- */

static void t_fallocate(void)
{
	if (feature_skipped("fallocate", "fallocate", "no fallocate"))
		return;
	size_t len = 256 * KiB;
	unsigned char *want = malloc(len);
	struct stat st, r;
	int fd;

	if (!want)
		return;
	fd = open(mp("fa_f"), O_CREAT | O_RDWR | O_TRUNC, 0644);
	if (!check_sys(fd, "fallocate: create"))
		goto out;
	if (check_sys(fallocate(fd, 0, 0, MiB), "fallocate mode 0, 1 MiB")) {
		check(fstat(fd, &st) == 0 && st.st_size == MiB,
		      "fallocate mode 0 grows the size to 1 MiB", "size %lld",
		      (long long)st.st_size);
		if (!feature_skipped("remote_alloc", "fallocate mode 0: "
				     "REMOTE allocation", "not kept"))
		check(lstat(rp("fa_f"), &r) == 0 && r.st_size == MiB &&
			      r.st_blocks * 512 >= MiB,
		      "fallocate mode 0: REMOTE has 1 MiB allocated",
		      "size %lld blocks %lld", (long long)r.st_size,
		      (long long)r.st_blocks);
	}
	if (check_sys(fallocate(fd, FALLOC_FL_KEEP_SIZE, MiB, MiB),
		      "fallocate KEEP_SIZE 1 MiB past EOF")) {
		check(fstat(fd, &st) == 0 && st.st_size == MiB,
		      "KEEP_SIZE: size stays 1 MiB", "size %lld",
		      (long long)st.st_size);
		if (!feature_skipped("remote_alloc", "KEEP_SIZE: REMOTE "
				     "allocation", "not kept"))
		check(lstat(rp("fa_f"), &r) == 0 && r.st_size == MiB &&
			      r.st_blocks * 512 >= 2 * MiB,
		      "KEEP_SIZE: REMOTE has 2 MiB allocated, size 1 MiB",
		      "size %lld blocks %lld", (long long)r.st_size,
		      (long long)r.st_blocks);
	}
	close(fd);

	memset(want, 'x', len);
	put_file(mp("fa_p"), want, len, 0644);
	memset(want + 64 * KiB, 0, 64 * KiB);
	fd = open(mp("fa_p"), O_RDWR);
	if (check_sys(fd, "punch hole: open") &&
	    check_sys(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				64 * KiB, 64 * KiB),
		      "fallocate PUNCH_HOLE 64 KiB at 64 KiB")) {
		unsigned char *b = malloc(len);

		check(b && pread_all(fd, b, len, 0) == (ssize_t)len &&
			      !memcmp(b, want, len),
		      "PUNCH_HOLE: the range reads as zeros, the rest intact "
		      "(same fd)",
		      "-");
		free(b);
		close(fd);
		check_content(mp("fa_p"), want, len,
			      "PUNCH_HOLE: reopened file reads the same");
		check_content(rp("fa_p"), want, len, "PUNCH_HOLE: REMOTE");
		if (!feature_skipped("remote_alloc", "PUNCH_HOLE: REMOTE "
				     "blocks", "not kept"))
		check(lstat(rp("fa_p"), &r) == 0 &&
			      r.st_blocks * 512 <= (long long)(len - 64 * KiB),
		      "PUNCH_HOLE: REMOTE blocks freed", "st_blocks %lld",
		      (long long)r.st_blocks);
	} else if (fd >= 0) {
		close(fd);
	}
out:
	free(want);
}

static void t_seek_hole(void)
{
	if (feature_skipped("seek_hole", "SEEK_DATA/SEEK_HOLE",
			    "holes are not reported"))
		return;
	static char data[64 * KiB];
	off_t size = MiB + sizeof(data);
	struct {
		const char *name;
		off_t from;
		int whence;
	} q[] = {
		{ "SEEK_DATA from 0", 0, SEEK_DATA },
		{ "SEEK_HOLE from 0", 0, SEEK_HOLE },
		{ "SEEK_HOLE from 1 MiB", MiB, SEEK_HOLE },
		{ "SEEK_DATA from 1 MiB + 100", MiB + 100, SEEK_DATA },
		{ "SEEK_DATA at EOF", size, SEEK_DATA },
		{ "SEEK_HOLE past EOF", size + 1, SEEK_HOLE },
	};
	int fd, rfd;

	memset(data, 'd', sizeof(data));
	fd = open(mp("sk_f"), O_CREAT | O_RDWR | O_TRUNC, 0644);
	if (!check_sys(fd, "SEEK_HOLE: create"))
		return;
	if (!check_rc(pwrite_all(fd, data, sizeof(data), MiB),
		      "SEEK_HOLE: write 64 KiB at 1 MiB")) {
		close(fd);
		return;
	}
	fsync(fd);
	rfd = open(rp("sk_f"), O_RDONLY);
	if (!check_sys(rfd, "SEEK_HOLE: open the REMOTE copy")) {
		close(fd);
		return;
	}
	for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++) {
		char name[128];
		off_t got, want;
		int gerr, werr;

		errno = 0;
		got = lseek(fd, q[i].from, q[i].whence);
		gerr = got < 0 ? errno : 0;
		errno = 0;
		want = lseek(rfd, q[i].from, q[i].whence);
		werr = want < 0 ? errno : 0;
		snprintf(name, sizeof(name),
			 "lseek %s: same answer as the backing fs", q[i].name);
		check(got == want && gerr == werr, name,
		      "got %lld (%s), backing fs says %lld (%s)",
		      (long long)got, ename(gerr), (long long)want,
		      ename(werr));
	}
	check(lseek(fd, 0, SEEK_DATA) == MiB && lseek(fd, 0, SEEK_HOLE) == 0,
	      "sparse file: data at 1 MiB, hole at 0", "data at %lld, hole at "
	      "%lld",
	      (long long)lseek(fd, 0, SEEK_DATA),
	      (long long)lseek(fd, 0, SEEK_HOLE));
	close(rfd);
	close(fd);
}

static void t_copy_range(void)
{
	size_t len = 3 * MiB + 17;
	unsigned char *src = malloc(len);
	unsigned char *want = calloc(1, 1000 + 777);
	ssize_t n = 0;
	size_t done = 0;
	int in, out;

	if (!src || !want)
		goto out_free;
	fill_pattern(src, len, 3);
	put_file(mp("cf_src"), src, len, 0644);
	in = open(mp("cf_src"), O_RDONLY);
	out = open(mp("cf_dst"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (!check(in >= 0 && out >= 0, "copy_file_range: open both", "%s",
		   strerror(errno)))
		goto out_close;
	while (done < len) {
		n = copy_file_range(in, NULL, out, NULL, len - done, 0);
		if (n <= 0)
			break;
		done += n;
	}
	check(done == len, "copy_file_range the whole file",
	      "copied %zu of %zu (%s)", done, len,
	      n < 0 ? strerror(errno) : "short");
	close(out);
	check_content(mp("cf_dst"), src, len, "copy_file_range: content equal");
	check_content(rp("cf_dst"), src, len,
		      "copy_file_range: content equal on REMOTE");
	{
		loff_t off_in = 12345, off_out = 777;

		out = open(mp("cf_dst2"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
		n = copy_file_range(in, &off_in, out, &off_out, 1000, 0);
		check(n == 1000 && off_in == 12345 + 1000 &&
			      off_out == 777 + 1000,
		      "copy_file_range 1000 bytes at offsets 12345 -> 777",
		      "returned %zd (%s), offsets %lld %lld", n,
		      n < 0 ? strerror(errno) : "-", (long long)off_in,
		      (long long)off_out);
		memcpy(want + 777, src + 12345, 1000);
		check_content(mp("cf_dst2"), want, 1777,
			      "copy_file_range with offsets: content");
	}
out_close:
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
out_free:
	free(src);
	free(want);
}

/* ---- locks -------------------------------------------------------------- */

/* A child that takes a lock, reports, and holds it until told to go. */
struct holder {
	pid_t pid;
	int go;   /* write end: tell the child to release and exit */
	int done; /* read end: the child says the lock is held */
};

static bool holder_start(struct holder *h, const char *path, bool posix)
{
	int p2c[2], c2p[2];
	char c = 0;

	if (pipe(p2c) || pipe(c2p))
		return false;
	fflush(stdout);
	h->pid = fork();
	if (h->pid == 0) {
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET,
				    .l_start = 0, .l_len = 100 };
		int fd = open(path, O_RDWR);

		alarm(30);
		close(p2c[1]);
		close(c2p[0]);
		if (fd < 0)
			_exit(1);
		if (posix ? fcntl(fd, F_SETLK, &fl) : flock(fd, LOCK_EX))
			_exit(2);
		if (write(c2p[1], "L", 1) != 1)
			_exit(3);
		if (read(p2c[0], &c, 1) < 0)
			_exit(4);
		_exit(0);
	}
	close(p2c[0]);
	close(c2p[1]);
	h->go = p2c[1];
	h->done = c2p[0];
	if (h->pid < 0 || read(h->done, &c, 1) != 1 || c != 'L') {
		close(h->go);
		close(h->done);
		if (h->pid > 0)
			waitpid(h->pid, NULL, 0);
		return false;
	}
	return true;
}

static void holder_stop(struct holder *h)
{
	if (write(h->go, "U", 1) < 0)
		kill(h->pid, SIGKILL);
	waitpid(h->pid, NULL, 0);
	close(h->go);
	close(h->done);
}

static void t_locks(void)
{
	struct holder h;
	struct flock fl;
	int fd;

	put_str(mp("lk_flock"), "lock me");
	fd = open(mp("lk_flock"), O_RDWR);
	if (check_sys(fd, "flock: open") &&
	    check(holder_start(&h, mp("lk_flock"), false),
		  "flock: a child holds LOCK_EX", "child failed")) {
		check_err(flock(fd, LOCK_EX | LOCK_NB), EWOULDBLOCK,
			  "flock LOCK_EX|LOCK_NB while a child holds LOCK_EX: "
			  "EWOULDBLOCK");
		check_err(flock(fd, LOCK_SH | LOCK_NB), EWOULDBLOCK,
			  "flock LOCK_SH|LOCK_NB while a child holds LOCK_EX: "
			  "EWOULDBLOCK");
		holder_stop(&h);
		check_sys(flock(fd, LOCK_EX | LOCK_NB),
			  "flock LOCK_EX|LOCK_NB after the child exits");
		flock(fd, LOCK_UN);
	}
	if (fd >= 0)
		close(fd);

	put_str(mp("lk_posix"), "lock me too");
	fd = open(mp("lk_posix"), O_RDWR);
	if (check_sys(fd, "fcntl lock: open") &&
	    check(holder_start(&h, mp("lk_posix"), true),
		  "fcntl: a child holds F_WRLCK on bytes 0-99",
		  "child failed")) {
		fl = (struct flock){ .l_type = F_WRLCK, .l_whence = SEEK_SET,
				     .l_start = 50, .l_len = 10 };
		if (check_sys(fcntl(fd, F_GETLK, &fl), "F_GETLK"))
			check(fl.l_type == F_WRLCK && fl.l_pid == h.pid &&
				      fl.l_start == 0 && fl.l_len == 100,
			      "F_GETLK reports the child's lock",
			      "type %d pid %d (child %d) start %lld len %lld",
			      fl.l_type, fl.l_pid, h.pid,
			      (long long)fl.l_start, (long long)fl.l_len);
		fl = (struct flock){ .l_type = F_RDLCK, .l_whence = SEEK_SET,
				     .l_start = 0, .l_len = 100 };
		check_err2(fcntl(fd, F_SETLK, &fl), EAGAIN, EACCES,
			   "F_SETLK on the child's range: EAGAIN");
		fl = (struct flock){ .l_type = F_WRLCK, .l_whence = SEEK_SET,
				     .l_start = 100, .l_len = 100 };
		check_sys(fcntl(fd, F_SETLK, &fl),
			  "F_SETLK on a disjoint range");
		fl = (struct flock){ .l_type = F_WRLCK, .l_whence = SEEK_SET,
				     .l_start = 200, .l_len = 10 };
		check(fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type == F_UNLCK,
		      "F_GETLK on a free range: F_UNLCK", "type %d",
		      fl.l_type);
		holder_stop(&h);
		fl = (struct flock){ .l_type = F_WRLCK, .l_whence = SEEK_SET,
				     .l_start = 0, .l_len = 100 };
		check_sys(fcntl(fd, F_SETLK, &fl),
			  "F_SETLK after the child exits");
	}
	if (fd >= 0)
		close(fd);
}

/* ---- mmap --------------------------------------------------------------- */

static void t_mmap(void)
{
	size_t len = 64 * KiB + 123;
	unsigned char *want = malloc(len);
	unsigned char *map;
	int fd;

	if (!want)
		return;
	fill_pattern(want, len, 4);
	fd = open(mp("mm_f"), O_CREAT | O_RDWR | O_TRUNC, 0644);
	if (!check_sys(fd, "mmap: create") ||
	    !check_sys(ftruncate(fd, len), "mmap: ftruncate"))
		goto out;
	map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (!check(map != MAP_FAILED, "mmap MAP_SHARED PROT_WRITE", "%s",
		   strerror(errno)))
		goto out;
	memcpy(map, want, len);
	check_sys(msync(map, len, MS_SYNC), "msync MS_SYNC");
	check_sys(munmap(map, len), "munmap");
	check_sys(close(fd), "mmap: close");
	fd = -1;
	check_content(mp("mm_f"), want, len,
		      "mmap: stores seen by read()");
	check_content(rp("mm_f"), want, len, "mmap: stores reached REMOTE");

	/* and the other way: write(), then read through a mapping */
	fd = open(mp("mm_f"), O_RDWR);
	if (fd >= 0) {
		pwrite(fd, "written", 7, 4096);
		memcpy(want + 4096, "written", 7);
		map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		check(map != MAP_FAILED && !memcmp(map, want, len),
		      "mmap: a mapping sees an earlier pwrite", "%s",
		      map == MAP_FAILED ? strerror(errno) : "differs");
		if (map != MAP_FAILED)
			munmap(map, len);
	}
out:
	if (fd >= 0)
		close(fd);
	free(want);
}

/* ---- error codes -------------------------------------------------------- */

static void t_errors(void)
{
	char longname[257], okname[256];
	struct stat st;
	int fd;

	check_err(stat(mp("er_missing"), &st), ENOENT,
		  "stat a missing name: ENOENT");
	check_err(stat(mp("er_nodir/x"), &st), ENOENT,
		  "stat below a missing dir: ENOENT");
	check_err(unlink(mp("er_missing")), ENOENT,
		  "unlink a missing name: ENOENT");
	check_err(rmdir(mp("er_missing")), ENOENT,
		  "rmdir a missing name: ENOENT");

	mkdir(mp("er_dir"), 0755);
	put_str(mp("er_dir/f"), "f");
	put_str(mp("er_file"), "f");
	check_err(mkdir(mp("er_dir"), 0755), EEXIST,
		  "mkdir an existing dir: EEXIST");
	check_err(mkdir(mp("er_file"), 0755), EEXIST,
		  "mkdir over an existing file: EEXIST");
	check_err(rmdir(mp("er_dir")), ENOTEMPTY,
		  "rmdir a non-empty dir: ENOTEMPTY");
	check_open_err(mp("er_dir"), O_WRONLY, 0, EISDIR,
		       "open a dir O_WRONLY: EISDIR");
	check_open_err(mp("er_dir"), O_RDWR, 0, EISDIR,
		       "open a dir O_RDWR: EISDIR");
	check_err(unlink(mp("er_dir")), EISDIR, "unlink a dir: EISDIR");
	check_err(mkdir(mp("er_file/sub"), 0755), ENOTDIR,
		  "mkdir under a file: ENOTDIR");
	check_err(rmdir(mp("er_file")), ENOTDIR, "rmdir a file: ENOTDIR");
	check_open_err(mp("er_file"), O_RDONLY | O_DIRECTORY, 0, ENOTDIR,
		       "open a file O_DIRECTORY: ENOTDIR");
	check_err(stat(mp("er_file/x"), &st), ENOTDIR,
		  "stat below a file: ENOTDIR");

	/* EXDEV: the mount is its own filesystem */
	{
		char out[PATH_MAX];

		snprintf(out, sizeof(out), "/tmp/ferryfs-it-xdev-%d",
			 (int)getpid());
		check_err(rename(mp("er_file"), out), EXDEV,
			  "rename from the mount to /tmp: EXDEV");
		check_err(link(mp("er_file"), out), EXDEV,
			  "link from the mount to /tmp: EXDEV");
		unlink(out);
		check_err(rename(mp("er_file"), rp("er_file2")), EXDEV,
			  "rename from the mount to REMOTE: EXDEV");
		check_str(mp("er_file"), "f", "EXDEV: the file stayed");
	}

	/* names */
	memset(longname, 'n', 256);
	longname[256] = 0;
	memset(okname, 'n', 255);
	okname[255] = 0;
	check_open_err(mp("%s", longname), O_CREAT | O_WRONLY, 0644,
		       ENAMETOOLONG, "create a 256-char name: ENAMETOOLONG");
	check_err(mkdir(mp("%s", longname), 0755), ENAMETOOLONG,
		  "mkdir a 256-char name: ENAMETOOLONG");
	check_err(stat(mp("%s", longname), &st), ENAMETOOLONG,
		  "stat a 256-char name: ENAMETOOLONG");
	fd = open(mp("%s", okname), O_CREAT | O_WRONLY, 0644);
	if (check_sys(fd, "create a 255-char name")) {
		close(fd);
		check_sys(lstat(rp("%s", okname), &st),
			  "255-char name exists on REMOTE");
	}
	check_err(rename(mp("er_dir"), mp("er_dir/into")), EINVAL,
		  "rename a dir into itself: EINVAL");
}

/* ---- permissions (default_permissions) and ownership -------------------- */

static void t_perms(void)
{
	if (feature_skipped("mode", "access by other users",
			    "modes are not kept (the kernel checks them)"))
		return;
	put_file(mp("pm_secret"), "s", 1, 0600);
	put_file(mp("pm_public"), "p", 1, 0644);
	put_file(mp("pm_pubw"), "w", 1, 0666);
	mkdir(mp("pm_dir"), 0755);
	put_file(mp("pm_dir/existing"), "e", 1, 0644);
	mkdir(mp("pm_priv"), 0700);
	put_file(mp("pm_priv/f"), "f", 1, 0644);
	mkdir(mp("pm_sticky"), 01777);

	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_OPEN, .path = mp("pm_secret"),
			       .flags = O_RDONLY },
		 EACCES, "as 65534: open a 0600 root file: EACCES");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_OPEN, .path = mp("pm_public"),
			       .flags = O_RDONLY },
		 0, "as 65534: open a 0644 root file read-only works");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_OPEN, .path = mp("pm_public"),
			       .flags = O_WRONLY },
		 EACCES, "as 65534: open a 0644 root file O_WRONLY: EACCES");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_OPEN, .path = mp("pm_dir/new"),
			       .flags = O_CREAT | O_WRONLY, .mode = 0644 },
		 EACCES, "as 65534: create in a 0755 root dir: EACCES");
	check_gone(rp("pm_dir/new"), "refused create left nothing on REMOTE");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_MKDIR, .path = mp("pm_dir/newd"),
			       .mode = 0755 },
		 EACCES, "as 65534: mkdir in a 0755 root dir: EACCES");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_UNLINK,
			       .path = mp("pm_dir/existing") },
		 EACCES, "as 65534: unlink in a 0755 root dir: EACCES");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_RENAME,
			       .path = mp("pm_dir/existing"),
			       .path2 = mp("pm_dir/renamed") },
		 EACCES, "as 65534: rename in a 0755 root dir: EACCES");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_STAT, .path = mp("pm_priv/f") },
		 EACCES, "as 65534: stat below a 0700 root dir: EACCES");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_CHMOD, .path = mp("pm_public"),
			       .mode = 0666 },
		 EPERM, "as 65534: chmod a root file: EPERM");
	check_mode(rp("pm_public"), 0644, "refused chmod left REMOTE alone");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_ACCESS, .path = mp("pm_public"),
			       .flags = W_OK },
		 EACCES, "as 65534: access W_OK on a 0644 root file: EACCES");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_ACCESS, .path = mp("pm_public"),
			       .flags = R_OK },
		 0, "as 65534: access R_OK on a 0644 root file works");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_UTIMES_NOW, .path = mp("pm_public") },
		 EACCES, "as 65534: utimensat(NULL) on a 0644 root file: "
			 "EACCES");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_UTIMES_NOW, .path = mp("pm_pubw") },
		 0, "as 1000: utimensat(NULL) on a 0666 root file works");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_UTIMES_SET, .path = mp("pm_pubw") },
		 EPERM, "as 1000: utimensat explicit times on a 0666 root "
			"file: EPERM");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_WRITE, .path = mp("pm_pubw"),
			       .flags = O_WRONLY | O_TRUNC,
			       .path2 = "by 1000" },
		 0, "as 1000: write a 0666 root file works");
	check_str(rp("pm_pubw"), "by 1000", "write by 1000 reached REMOTE");
	check_owner(rp("pm_pubw"), 0, 0,
		    "write by another user keeps the owner on REMOTE");

	/* sticky directory */
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_OPEN, .path = mp("pm_sticky/mine"),
			       .flags = O_CREAT | O_WRONLY, .mode = 0666 },
		 0, "as 1000: create in a 01777 dir");
	check_as(NOBODY, NOBODY,
		 &(struct op){ .kind = OP_UNLINK,
			       .path = mp("pm_sticky/mine") },
		 EPERM, "as 65534: unlink another's file in a sticky dir: "
			"EPERM");
	check_sys(access(rp("pm_sticky/mine"), F_OK),
		  "sticky: the file is still on REMOTE");
}

static void t_owner(void)
{
	struct stat st;
	const char *names[] = { "f", "d", "l", "p" };

	if (feature_skipped("owner", "ownership of files made by others",
			    "owners are not kept") ||
	    feature_skipped("mode", "ownership of files made by others",
			    "modes are not kept (the kernel checks them)"))
		return;
	if (!check_sys(mkdir(mp("ow_pub"), 0777), "ownership: mkdir 0777"))
		return;
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_OPEN, .path = mp("ow_pub/f"),
			       .flags = O_CREAT | O_WRONLY, .mode = 0644 },
		 0, "as 1000: create a file");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_MKDIR, .path = mp("ow_pub/d"),
			       .mode = 0755 },
		 0, "as 1000: mkdir");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_SYMLINK, .path = mp("ow_pub/l"),
			       .path2 = "f" },
		 0, "as 1000: symlink");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_MKFIFO, .path = mp("ow_pub/p"),
			       .mode = 0644 },
		 0, "as 1000: mkfifo");
	remote_sync();
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char name[128];

		snprintf(name, sizeof(name),
			 "created by 1000 (%s): owner 1000:1000 on REMOTE",
			 names[i]);
		check_owner(rp_synced("ow_pub/%s", names[i]), USER_UID, USER_GID,
			    name);
		snprintf(name, sizeof(name),
			 "created by 1000 (%s): owner 1000:1000 through the "
			 "mount",
			 names[i]);
		check_owner(mp("ow_pub/%s", names[i]), USER_UID, USER_GID,
			    name);
	}
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_CHMOD, .path = mp("ow_pub/f"),
			       .mode = 0600 },
		 0, "as 1000: chmod own file");
	check_mode(rp("ow_pub/f"), 0600, "chmod by the owner reached REMOTE");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_CHOWN, .path = mp("ow_pub/f"),
			       .uid = NOBODY, .gid = -1 },
		 EPERM, "as 1000: give own file away: EPERM");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_CHOWN, .path = mp("ow_pub/f"),
			       .uid = -1, .gid = OTHER_GID },
		 EPERM, "as 1000: chgrp to a group it is not in: EPERM");
	check_owner(rp("ow_pub/f"), USER_UID, USER_GID,
		    "refused chown left REMOTE alone");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_RENAME, .path = mp("ow_pub/f"),
			       .path2 = mp("ow_pub/f2") },
		 0, "as 1000: rename own file");
	check_owner(rp("ow_pub/f2"), USER_UID, USER_GID,
		    "rename keeps the owner on REMOTE");

	/* setgid directory: new entries take the directory's group */
	if (!check_sys(mkdir(mp("ow_sg"), 0777), "setgid: mkdir") ||
	    !check_sys(chown(mp("ow_sg"), 0, OTHER_GID), "setgid: chgrp 2000") ||
	    !check_sys(chmod(mp("ow_sg"), 02777), "setgid: chmod 02777"))
		return;
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_OPEN, .path = mp("ow_sg/f"),
			       .flags = O_CREAT | O_WRONLY, .mode = 0644 },
		 0, "as 1000: create in a setgid dir");
	check_owner(mp("ow_sg/f"), USER_UID, OTHER_GID,
		    "setgid dir: the file gets the dir's group");
	check_owner(rp("ow_sg/f"), USER_UID, OTHER_GID,
		    "setgid dir: the file gets the dir's group on REMOTE");
	check_as(USER_UID, USER_GID,
		 &(struct op){ .kind = OP_MKDIR, .path = mp("ow_sg/d"),
			       .mode = 0755 },
		 0, "as 1000: mkdir in a setgid dir");
	check_owner(rp("ow_sg/d"), USER_UID, OTHER_GID,
		    "setgid dir: a subdir gets the dir's group on REMOTE");
	check(lstat(rp("ow_sg/d"), &st) == 0 && (st.st_mode & S_ISGID),
	      "setgid dir: a subdir inherits S_ISGID on REMOTE", "mode %o",
	      st.st_mode);
	check(lstat(mp("ow_sg/d"), &st) == 0 && (st.st_mode & S_ISGID),
	      "setgid dir: a subdir inherits S_ISGID through the mount",
	      "mode %o", st.st_mode);
}

/* ---- parallel writers --------------------------------------------------- */

struct worker {
	pthread_t tid;
	char path[PATH_MAX];
	size_t off;
	size_t len;
	uint64_t seed;
	int rc;
};

static void *worker_run(void *arg)
{
	struct worker *w = arg;
	size_t chunk = 64 * KiB;
	unsigned char *buf = malloc(w->len);
	int fd;

	w->rc = -ENOMEM;
	if (!buf)
		return NULL;
	fill_pattern(buf, w->len, w->seed);
	fd = open(w->path, O_CREAT | O_WRONLY, 0644);
	w->rc = fd < 0 ? -errno : 0;
	for (size_t o = 0; fd >= 0 && o < w->len && !w->rc; o += chunk) {
		size_t n = w->len - o < chunk ? w->len - o : chunk;

		w->rc = pwrite_all(fd, buf + o, n, w->off + o);
	}
	if (fd >= 0 && close(fd) && !w->rc)
		w->rc = -errno;
	free(buf);
	return NULL;
}

static void t_parallel(void)
{
	enum { NFILES = 8, NPARTS = 4 };
	struct worker w[NFILES + NPARTS];
	size_t len = 2 * MiB;
	unsigned char *want = malloc(NPARTS * len);
	int failed = 0, bad = 0;

	if (!want)
		return;
	memset(w, 0, sizeof(w));
	for (int i = 0; i < NFILES; i++) {
		snprintf(w[i].path, sizeof(w[i].path), "%s", mp("par_%d", i));
		w[i].len = len;
		w[i].seed = 10 + i;
	}
	/* NPARTS threads fill disjoint ranges of one file */
	close(open(mp("par_shared"), O_CREAT | O_WRONLY | O_TRUNC, 0644));
	for (int i = 0; i < NPARTS; i++) {
		struct worker *p = &w[NFILES + i];

		snprintf(p->path, sizeof(p->path), "%s", mp("par_shared"));
		p->off = i * len;
		p->len = len;
		p->seed = 100 + i;
		fill_pattern(want + i * len, len, p->seed);
	}
	for (int i = 0; i < NFILES + NPARTS; i++)
		if (pthread_create(&w[i].tid, NULL, worker_run, &w[i]))
			w[i].rc = -EAGAIN;
	for (int i = 0; i < NFILES + NPARTS; i++) {
		if (w[i].rc != -EAGAIN)
			pthread_join(w[i].tid, NULL);
		if (w[i].rc)
			failed++;
	}
	check(!failed, "12 threads write at once (8 files, 4 ranges of one)",
	      "%d threads failed", failed);
	remote_sync();
	for (int i = 0; i < NFILES; i++) {
		unsigned char *b = malloc(len);
		off_t size;

		fill_pattern(b, len, w[i].seed);
		if (file_sum(rp_synced("par_%d", i), &size) != fnv1a(b, len, FNV_INIT) ||
		    size != (off_t)len)
			bad++;
		free(b);
	}
	check(!bad, "parallel writers: each file intact on REMOTE",
	      "%d files differ", bad);
	check_content(mp("par_shared"), want, NPARTS * len,
		      "parallel ranges: the shared file is intact");
	check_content(rp("par_shared"), want, NPARTS * len,
		      "parallel ranges: intact on REMOTE");
	free(want);
}

/* ---- set-id bits are dropped when someone else changes the file -------- */

static bool check_no_setid(const char *path, const char *name)
{
	long m = mode_of(path);

	return check(m >= 0 && !(m & (S_ISUID | S_ISGID)), name,
		     "'%s' has mode %04lo", path, m);
}

static void t_setid_clear(void)
{
	if (feature_skipped("mode", "setuid/setgid cleared on write",
			    "modes are not kept"))
		return;
	put_file(mp("su_w"), "x", 1, 0666);
	chmod(mp("su_w"), 06777);
	if (check_as(USER_UID, USER_GID,
		     &(struct op){ .kind = OP_WRITE, .path = mp("su_w"),
				   .flags = O_WRONLY | O_APPEND,
				   .path2 = "y" },
		     0, "as 1000: write a 06777 root file")) {
		check_no_setid(mp("su_w"),
			       "write by another user clears S_ISUID/S_ISGID");
		check_no_setid(rp("su_w"),
			       "write by another user clears S_ISUID/S_ISGID "
			       "on REMOTE");
	}
	put_file(mp("su_t"), "x", 1, 0666);
	chmod(mp("su_t"), 06777);
	if (check_as(USER_UID, USER_GID,
		     &(struct op){ .kind = OP_TRUNCATE, .path = mp("su_t") },
		     0, "as 1000: truncate a 06777 root file")) {
		check_no_setid(mp("su_t"),
			       "truncate by another user clears S_ISUID/S_ISGID");
		check_no_setid(rp("su_t"),
			       "truncate by another user clears S_ISUID/S_ISGID "
			       "on REMOTE");
	}
	/* open(O_TRUNC) truncates too (FUSE_ATOMIC_O_TRUNC: the kernel
	 * sends no SETATTR after it) */
	put_file(mp("su_o"), "x", 1, 0666);
	chmod(mp("su_o"), 06777);
	if (check_as(USER_UID, USER_GID,
		     &(struct op){ .kind = OP_OPEN, .path = mp("su_o"),
				   .flags = O_WRONLY | O_TRUNC },
		     0, "as 1000: open(O_TRUNC) a 06777 root file")) {
		check_no_setid(mp("su_o"), "open(O_TRUNC) by another user "
					   "clears S_ISUID/S_ISGID");
		check_no_setid(rp("su_o"), "open(O_TRUNC) by another user "
					   "clears S_ISUID/S_ISGID on REMOTE");
	}
	/* setgid without group execute: cleared for a caller outside the
	 * file's group, as Linux does since 6.2 (setattr_should_drop_sgid) */
	put_file(mp("su_g"), "x", 1, 0666);
	chmod(mp("su_g"), 02767);
	if (check_as(USER_UID, USER_GID,
		     &(struct op){ .kind = OP_TRUNCATE, .path = mp("su_g") },
		     0, "as 1000: truncate a 02767 root:root file")) {
		check_no_setid(mp("su_g"), "truncate by a user outside the "
					   "group clears S_ISGID (no g+x)");
		check_no_setid(rp("su_g"), "truncate by a user outside the "
					   "group clears S_ISGID (no g+x) on "
					   "REMOTE");
	}
	put_file(mp("su_m"), "x", 1, 0666);
	if (lacks("owner")) {
		skip("truncate by a group member keeps S_ISGID (no g+x)",
		     "owners are not kept");
	} else if (check_sys(chown(mp("su_m"), 0, USER_GID),
			     "chown a file to root:1000") &&
		   check_sys(chmod(mp("su_m"), 02767), "chmod 02767") &&
		   check_as(USER_UID, USER_GID,
			    &(struct op){ .kind = OP_TRUNCATE,
					  .path = mp("su_m") },
			    0, "as 1000: truncate a 02767 root:1000 file")) {
		long m = mode_of(mp("su_m")), r = mode_of(rp("su_m"));

		check(m == 02767 && r == m,
		      "truncate by a group member keeps S_ISGID (no g+x)",
		      "mount %04lo, REMOTE %04lo", m, r);
	}
	put_file(mp("su_c"), "x", 1, 0755);
	chmod(mp("su_c"), 06755);
	if (check_sys(chown(mp("su_c"), USER_UID, USER_GID),
		      "chown a 06755 file")) {
		check_no_setid(mp("su_c"), "chown clears S_ISUID/S_ISGID");
		check_no_setid(rp("su_c"),
			       "chown clears S_ISUID/S_ISGID on REMOTE");
	}
}

/* ---- a full share ------------------------------------------------------- */

static void t_enospc(void)
{
	if (feature_skipped("enospc", "ENOSPC on the share reaches the writer",
			    "a fs mounted inside REMOTE is not seen"))
		return;
	const char *name = "ENOSPC on the share reaches the writer";
	size_t chunk = 64 * KiB;
	char *buf = calloc(1, chunk);
	int fd, err = 0;
	const char *where = "nowhere";

	if (!buf)
		return;
	/* a 1 MiB tmpfs inside the share, in place before the mount ever
	 * looks the name up */
	if (!check_sys(mkdir(rp("nospace"), 0755), "ENOSPC: mkdir on REMOTE"))
		goto out;
	if (mount("ferryfs-it", rp("nospace"), "tmpfs", 0, "size=1m,mode=0755")) {
		skip(name, "cannot mount a small tmpfs inside REMOTE");
		goto out;
	}
	fd = open(mp("nospace/f"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (check_sys(fd, "ENOSPC: create a file on the small fs")) {
		for (size_t done = 0; done < 4 * MiB && !err; done += chunk) {
			int rc = write_all(fd, buf, chunk);

			if (rc) {
				err = -rc;
				where = "write";
			}
		}
		if (!err && fsync(fd)) {
			err = errno;
			where = "fsync";
		}
		if (close(fd) && !err) {
			err = errno;
			where = "close";
		}
		check(err == ENOSPC, name,
		      "4 MiB into a 1 MiB fs: first error %s at %s", ename(err),
		      where);
		unlink(mp("nospace/f"));
	}
	umount2(rp("nospace"), MNT_DETACH);
out:
	free(buf);
}

/* ---- names are bytes ---------------------------------------------------- */

/* A name Windows (SMB) cannot hold: \ : * ? " < > |, control
 * characters, bytes that are never UTF-8, a trailing space or dot (Samba
 * lists such a name mangled). */
static bool win_forbidden(const char *name)
{
	size_t len = strlen(name);

	if (len && (name[len - 1] == ' ' || name[len - 1] == '.'))
		return true;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		if (*p < 0x20 || *p == 0xfe || *p == 0xff ||
		    strchr("\\:*?\"<>|", *p))
			return true;
	return false;
}

static void t_odd_names(void)
{
	const char *names[] = {
		"new\nline", "back\\slash", "\xff\xfe raw bytes", " lead",
		"trail ", "-dash", "a:b", "?*[x]", "tab\there",
		"\xc3\xbcnic\xc3\xb8" "de-\xe6\x96\x87",
	};
	size_t nn = sizeof(names) / sizeof(names[0]);
	int listed[sizeof(names) / sizeof(names[0])] = { 0 };
	char bad[512] = "";
	struct dirent *de;
	DIR *d;

	if (!check_sys(mkdir(mp("odd"), 0755), "odd names: mkdir"))
		return;
	for (size_t i = 0; i < nn; i++) {
		char name[96];
		int rc;

		snprintf(name, sizeof(name), "odd name #%zu: create", i);
		if (lacks("win_names") && win_forbidden(names[i])) {
			feature_skipped("win_names", name,
					"a character Windows forbids");
			listed[i] = 1; /* not looked for */
			continue;
		}
		rc = put_str(mp("odd/%s", names[i]), names[i]);
		if (!check_rc(rc, name))
			continue;
		snprintf(name, sizeof(name),
			 "odd name #%zu: same bytes on REMOTE", i);
		check_str(rp("odd/%s", names[i]), names[i], name);
	}
	d = opendir(mp("odd"));
	if (!check(d != NULL, "odd names: opendir", "%s", strerror(errno)))
		return;
	while ((de = readdir(d)))
		for (size_t i = 0; i < nn; i++)
			if (!strcmp(de->d_name, names[i]) &&
			    !(lacks("win_names") && win_forbidden(names[i])))
				listed[i]++;
	closedir(d);
	for (size_t i = 0; i < nn; i++)
		if (listed[i] != 1)
			snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
				 " #%zu listed %d times", i, listed[i]);
	check(!bad[0], "odd names: readdir gives the exact bytes", "%s", bad);
}

/* ---- deeper than PATH_MAX ----------------------------------------------- */

static int walk(const char *root, const char *comp, int depth, bool create)
{
	int dfd = open(root, O_RDONLY | O_DIRECTORY);

	for (int i = 0; i < depth && dfd >= 0; i++) {
		int nfd;

		if (create && mkdirat(dfd, comp, 0755) && errno != EEXIST) {
			int e = errno;

			close(dfd);
			return -e;
		}
		nfd = openat(dfd, comp, O_RDONLY | O_DIRECTORY);
		if (nfd < 0)
			nfd = -errno;
		close(dfd);
		dfd = nfd;
	}
	return dfd;
}

/*
 * Write-only opens use FUSE direct I/O (fs/ops.c rule 5): a reader that
 * cached the pages, by read() or by a shared mapping, must still see every
 * byte a write-only descriptor writes.
 */
static void t_direct_coherence(void)
{
	char buf[8192], got[4];
	int r, w;
	char *m;

	memset(buf, 'A', sizeof(buf));
	w = open(mp("dio"), O_CREAT | O_TRUNC | O_WRONLY, 0644);
	if (!check_sys(w, "direct write: create"))
		return;
	check(write(w, buf, sizeof(buf)) == (ssize_t)sizeof(buf),
	      "direct write: fill", "%s", strerror(errno));
	r = open(mp("dio"), O_RDONLY);
	if (!check_sys(r, "direct write: open a reader")) {
		close(w);
		return;
	}
	check(pread(r, got, 4, 0) == 4 && !memcmp(got, "AAAA", 4),
	      "direct write: the reader caches the old bytes", "%.4s", got);
	m = mmap(NULL, sizeof(buf), PROT_READ, MAP_SHARED, r, 0);
	check(m != MAP_FAILED && m[4096] == 'A',
	      "direct write: a shared mapping of the reader", "%s",
	      strerror(errno));
	check(pwrite(w, "BBBB", 4, 0) == 4 && pwrite(w, "CCCC", 4, 4096) == 4,
	      "direct write: write through the write-only descriptor", "%s",
	      strerror(errno));
	check(pread(r, got, 4, 0) == 4 && !memcmp(got, "BBBB", 4),
	      "direct write: read() of the reader sees the new bytes", "%.4s",
	      got);
	if (m != MAP_FAILED) {
		check(!memcmp(m + 4096, "CCCC", 4),
		      "direct write: the mapping sees the new bytes", "%.4s",
		      m + 4096);
		munmap(m, sizeof(buf));
	}
	close(r);
	close(w);
}

static void t_deep(void)
{
	/*
	 * Names below the share root are limited to PATH_MAX - 1 bytes: the
	 * remote interface names objects by path (README, "Limits"). 20
	 * levels of 200-byte names (4019 bytes) work; the 21st level would
	 * pass the limit and fails cleanly with ENAMETOOLONG, and the mount
	 * stays usable.
	 */
	enum { DEPTH = 19 };
	char comp[201];
	char b[16];
	int dfd, fd, d20;
	struct stat st;

	memset(comp, 'd', 200);
	comp[200] = 0;
	dfd = walk(mnt_root, comp, DEPTH, true);
	if (!check(dfd >= 0, "deep tree: 19 levels of 200-byte names",
		   "%s", strerror(-dfd)))
		return;
	fd = openat(dfd, "leaf", O_CREAT | O_RDWR, 0644);
	if (check_sys(fd, "deep tree: create a file at the bottom")) {
		check(write(fd, "deep", 4) == 4, "deep tree: write", "%s",
		      strerror(errno));
		close(fd);
		fd = openat(dfd, "leaf", O_RDONLY);
		memset(b, 0, sizeof(b));
		check(fd >= 0 && read(fd, b, sizeof(b)) == 4 &&
			      !memcmp(b, "deep", 4),
		      "deep tree: read back", "%s", strerror(errno));
		if (fd >= 0)
			close(fd);
		check_sys(renameat(dfd, "leaf", dfd, "leaf2"),
			  "deep tree: rename at the bottom");
	}
	check_sys(mkdirat(dfd, comp, 0755),
		  "deep tree: level 20 (4019 bytes) is created");
	d20 = openat(dfd, comp, O_RDONLY | O_DIRECTORY);
	if (check_sys(d20, "deep tree: open level 20")) {
		errno = 0;
		check(mkdirat(d20, comp, 0755) < 0 && errno == ENAMETOOLONG,
		      "deep tree: level 21 (4220 bytes) fails with ENAMETOOLONG",
		      "%s", strerror(errno));
		check(fstatat(d20, comp, &st, AT_SYMLINK_NOFOLLOW) < 0,
		      "deep tree: nothing was created past the limit", "%s",
		      "it exists");
		close(d20);
	}
	close(dfd);
	check_sys(stat(mnt_root, &st), "deep tree: the mount is still usable");
	remote_sync();
	dfd = walk(remote_root, comp, DEPTH, false);
	fd = dfd >= 0 ? openat(dfd, "leaf2", O_RDONLY) : -1;
	memset(b, 0, sizeof(b));
	check(fd >= 0 && read(fd, b, sizeof(b)) == 4 && !memcmp(b, "deep", 4),
	      "deep tree: the file is on REMOTE", "%s",
	      dfd < 0 ? strerror(-dfd) : strerror(errno));
	if (fd >= 0)
		close(fd);
	if (dfd >= 0)
		close(dfd);
}

/* ---- racing creates ----------------------------------------------------- */

enum { RACE_THREADS = 8, RACE_NAMES = 100 };

struct race {
	char (*paths)[PATH_MAX];
	int wins[RACE_NAMES];   /* updated atomically */
	int others[RACE_NAMES]; /* errors other than EEXIST */
};

static void *race_run(void *arg)
{
	struct race *r = arg;

	for (int i = 0; i < RACE_NAMES; i++) {
		int fd = open(r->paths[i], O_CREAT | O_EXCL | O_WRONLY, 0644);

		if (fd >= 0) {
			__atomic_fetch_add(&r->wins[i], 1, __ATOMIC_RELAXED);
			close(fd);
		} else if (errno != EEXIST) {
			__atomic_fetch_add(&r->others[i], 1, __ATOMIC_RELAXED);
		}
	}
	return NULL;
}

static void t_excl_race(void)
{
	static char paths[RACE_NAMES][PATH_MAX];
	static struct race r;
	pthread_t tid[RACE_THREADS];
	int started = 0, bad = 0, other = 0, onremote = 0;
	struct stat st;

	mkdir(mp("race"), 0755);
	for (int i = 0; i < RACE_NAMES; i++)
		snprintf(paths[i], PATH_MAX, "%s", mp("race/r%03d", i));
	r.paths = paths;
	for (int t = 0; t < RACE_THREADS; t++)
		if (!pthread_create(&tid[t], NULL, race_run, &r))
			started++;
	for (int t = 0; t < started; t++)
		pthread_join(tid[t], NULL);
	remote_sync();
	for (int i = 0; i < RACE_NAMES; i++) {
		if (r.wins[i] != 1)
			bad++;
		other += r.others[i];
		if (lstat(rp_synced("race/r%03d", i), &st) == 0)
			onremote++;
	}
	check(!bad && !other,
	      "8 threads race O_CREAT|O_EXCL on 100 names: one winner each",
	      "%d names without exactly one winner, %d errors other than "
	      "EEXIST",
	      bad, other);
	check(onremote == RACE_NAMES, "racing creates: 100 files on REMOTE",
	      "%d", onremote);
}

/* ---- renames racing with lookups ---------------------------------------- */

enum { STORM_FILES = 4, STORM_ROUNDS = 300 };

struct storm {
	char a[STORM_FILES][PATH_MAX]; /* name in storm_a */
	char b[STORM_FILES][PATH_MAX]; /* name in storm_b */
	int stop;                      /* atomic: the movers are done */
	int movers_failed;             /* atomic */
	int reads_failed;              /* atomic */
	char read_err[128];            /* the first failed read */
	long stats;                    /* atomic: lookups done */
};

static struct storm storm;

/*
 * Read file @i back from the share's side of the mount: without its pages
 * (POSIX_FADV_DONTNEED), so that the read reaches ferryfs, which (the file
 * flushed) reads it at its remote path while the flusher moves it there.
 */
static void storm_read(int i, int round)
{
	char want[32], got[32] = "";
	ssize_t n;
	int fd;

	snprintf(want, sizeof(want), "storm %d", i);
	fd = open(storm.a[i], O_RDONLY);
	if (fd >= 0) {
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		n = pread_all(fd, got, sizeof(got) - 1, 0);
		close(fd);
	} else {
		n = -errno;
	}
	if (n == (ssize_t)strlen(want) && !memcmp(got, want, (size_t)n))
		return;
	if (__atomic_fetch_add(&storm.reads_failed, 1, __ATOMIC_RELAXED) == 0)
		snprintf(storm.read_err, sizeof(storm.read_err),
			 "f%d after %d renames: %s", i, 2 * round + 2,
			 n < 0 ? strerror((int)-n) : "other bytes");
}

static void *storm_mover(void *arg)
{
	int i = (int)(intptr_t)arg;

	for (int r = 0; r < STORM_ROUNDS; r++) {
		if (rename(storm.a[i], storm.b[i]) ||
		    rename(storm.b[i], storm.a[i])) {
			__atomic_fetch_add(&storm.movers_failed, 1,
					   __ATOMIC_RELAXED);
			break;
		}
		storm_read(i, r);
	}
	return NULL;
}

static void *storm_looker(void *arg)
{
	struct stat st;

	(void)arg;
	while (!__atomic_load_n(&storm.stop, __ATOMIC_RELAXED)) {
		for (int i = 0; i < STORM_FILES; i++) {
			stat(storm.a[i], &st);
			stat(storm.b[i], &st);
		}
		__atomic_fetch_add(&storm.stats, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void t_rename_storm(void)
{
	pthread_t movers[STORM_FILES], lookers[2];
	int nm = 0, nl = 0, bad = 0;
	char want[32];

	mkdir(mp("storm_a"), 0755);
	mkdir(mp("storm_b"), 0755);
	for (int i = 0; i < STORM_FILES; i++) {
		snprintf(storm.a[i], PATH_MAX, "%s", mp("storm_a/f%d", i));
		snprintf(storm.b[i], PATH_MAX, "%s", mp("storm_b/f%d", i));
		snprintf(want, sizeof(want), "storm %d", i);
		put_str(storm.a[i], want);
	}
	for (int i = 0; i < 2; i++)
		if (!pthread_create(&lookers[nl], NULL, storm_looker, NULL))
			nl++;
	for (int i = 0; i < STORM_FILES; i++)
		if (!pthread_create(&movers[nm], NULL, storm_mover,
				    (void *)(intptr_t)i))
			nm++;
	for (int i = 0; i < nm; i++)
		pthread_join(movers[i], NULL);
	__atomic_store_n(&storm.stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < nl; i++)
		pthread_join(lookers[i], NULL);
	check(nm == STORM_FILES && !storm.movers_failed,
	      "4 threads rename 300 times each while 2 threads stat",
	      "%d movers failed", storm.movers_failed);
	check(!storm.reads_failed,
	      "rename storm: each file read after each rename has its bytes",
	      "%d reads failed, the first: %s", storm.reads_failed,
	      storm.read_err);
	for (int i = 0; i < STORM_FILES && !bad; i++) {
		char b[32] = "";
		struct stat st;

		snprintf(want, sizeof(want), "storm %d", i);
		if (get_file(storm.a[i], b, sizeof(b)) != (ssize_t)strlen(want) ||
		    strcmp(b, want))
			bad = snprintf(want, sizeof(want), "f%d: bytes", i);
		else if (lstat(storm.b[i], &st) == 0)
			bad = snprintf(want, sizeof(want), "f%d: 2 names", i);
		else if (lstat(rp("storm_a/f%d", i), &st))
			bad = snprintf(want, sizeof(want), "f%d: not on REMOTE",
				       i);
		else if (lstat(rp("storm_b/f%d", i), &st) == 0)
			bad = snprintf(want, sizeof(want),
				       "f%d: old name on REMOTE", i);
	}
	check(!bad, "rename storm: each file back home once, on REMOTE too",
	      "%s", want);
}

/* ---- another writer on the share ---------------------------------------- */

static void t_other_writer(void)
{
	struct dirent *de;
	bool found = false;
	struct stat st;
	DIR *d;

	mkdir(mp("ow"), 0755);
	d = opendir(mp("ow"));
	if (d) {
		while (readdir(d))
			;
		closedir(d);
	}
	put_str(rp("ow/from_remote"), "remote");
	d = opendir(mp("ow"));
	if (d) {
		while ((de = readdir(d)))
			if (!strcmp(de->d_name, "from_remote"))
				found = true;
		closedir(d);
	}
	check(found, "other writer: a file created on REMOTE is listed", "-");
	check(stat(mp("ow/from_remote"), &st) == 0 && st.st_size == 6,
	      "other writer: a file created on REMOTE can be stat'ed",
	      "%s size %lld", strerror(errno), (long long)st.st_size);
	check_str(mp("ow/from_remote"), "remote",
		  "other writer: its content reads through the mount");

	/* close-to-open (DESIGN.md, Reads): a change on the share is seen at
	 * the next open */
	put_str(mp("ow/changed"), "first version");
	check_str(mp("ow/changed"), "first version",
		  "other writer: read the first version");
	if (feature_skipped("remote_writer",
			    "other writer: a change on REMOTE is seen at the "
			    "next open",
			    "REMOTE changed behind the server's cache"))
		return;
	put_str(rp("ow/changed"), "second, longer version");
	check_str(mp("ow/changed"), "second, longer version",
		  "other writer: a change on REMOTE is seen at the next open");
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	mnt_root = getenv("MNT");
	remote_root = getenv("REMOTE");
	if (!mnt_root || !remote_root || !*mnt_root || !*remote_root) {
		printf("# skip: MNT and REMOTE must be set (run through "
		       "tests/it/mount_run.sh)\n");
		return 77;
	}
	if (geteuid() != 0) {
		printf("# skip: needs root\n");
		return 77;
	}
	umask(0);
	printf("# MNT=%s REMOTE=%s\n", mnt_root, remote_root);

	t_root();
	t_getattr();
	t_setattr();
	t_readdir_small();
	t_readdir_big();
	t_mkdir();
	t_create();
	t_big_file();
	t_unaligned();
	t_rw_misc();
	t_fsync();
	t_unlink();
	t_rename();
	t_link();
	t_symlink();
	t_mknod();
	t_statfs();
	t_xattr();
	t_fallocate();
	t_seek_hole();
	t_copy_range();
	t_locks();
	t_mmap();
	t_errors();
	t_perms();
	t_owner();
	t_setid_clear();
	t_enospc();
	t_odd_names();
	t_direct_coherence();
	t_deep();
	t_parallel();
	t_excl_race();
	t_rename_storm();
	t_other_writer();

	if (n_skip)
		printf("# %d skipped\n", n_skip);
	printf("%d passed, %d failed\n", n_pass, n_fail);
	return n_fail ? 1 : 0;
}
