/*
 * it_nfs.c - the nfs driver (remote/nfs.c) and the pool (remote/pool.c)
 * against a real NFS server: the remote.h contract, checked call by call.
 *
 * Run by tests/it/nfs_suite.sh, which brings a server up and sets:
 *   FERRYFS_NFS_URL   nfs://HOST/EXPORT/dir[?version=N] of an empty
 *                     directory on the server, no_root_squash
 *   FERRYFS_NFS_DIR   the same directory seen locally (the export's
 *                     directory), for the checks on the server's side; it
 *                     is only read here, never changed behind the server
 *   FERRYFS_NFS_RESTART  (optional) a command that restarts the server;
 *                     without it the reconnect case skips
 * Exit 77 (skip) when FERRYFS_NFS_URL or FERRYFS_NFS_DIR is unset.
 *
 * Each case works below its own directory, named after the case, made
 * through the share by the setup; nothing is removed (the suite drops the
 * whole export).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>
#include <fuse_log.h>

#include "remote.h"

#include "test_util.h"

#define MiB ((size_t)1 << 20)

static const char *url_base; /* FERRYFS_NFS_URL without its query */
static const char *url_query = ""; /* "?..." or "" */
static const char *dir_base; /* FERRYFS_NFS_DIR */
static int version = 3;

struct fx {
	struct rmt *r;
	char sub[64];             /* this case's directory below the root */
	char url[PATH_MAX];       /* nfs:// of the share's root */
	char local[PATH_MAX];     /* the root seen locally */
};

/* "<sub>/<rel>": a remote path of this case (one of 8 buffers). */
static const char *rp(struct fx *fx, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static const char *rp(struct fx *fx, const char *fmt, ...)
{
	static char buf[8][PATH_MAX];
	static unsigned int i;
	char *b = buf[i++ % 8];
	int n = snprintf(b, PATH_MAX, "%s/", fx->sub);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b + n, PATH_MAX - (size_t)n, fmt, ap);
	va_end(ap);
	return b;
}

/* The same file seen locally, on the server. */
static const char *lp(struct fx *fx, const char *rel)
{
	static char buf[4][PATH_MAX];
	static unsigned int i;
	char *b = buf[i++ % 4];
	int n = snprintf(b, PATH_MAX, "%s/%s/%s", fx->local, fx->sub, rel);

	assert_true(n > 0 && n < PATH_MAX);
	return b;
}

static void open_share(struct fx *fx, const char *opts)
{
	assert_rc_ok(rmt_open(fx->url, opts, &fx->r));
}

/* *state is the case's short name (prestate), then its struct fx. */
static int setup(void **state)
{
	struct fx *fx = calloc(1, sizeof(*fx));
	const char *name = *state;

	assert_non_null(fx);
	snprintf(fx->url, sizeof(fx->url), "%s%s", url_base, url_query);
	snprintf(fx->local, sizeof(fx->local), "%s", dir_base);
	snprintf(fx->sub, sizeof(fx->sub), "%s", name);
	open_share(fx, "connections=2");
	assert_rc_ok(rmt_mkdir(fx->r, fx->sub, 0755));
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fx *fx = *state;

	rmt_close(fx->r);
	fuse_set_log_func(NULL);
	free(fx);
	return 0;
}

static void ignore_log(enum fuse_log_level level, const char *fmt,
		       va_list ap)
{
	(void)level, (void)fmt, (void)ap;
}

static void put(struct fx *fx, const char *rel, const char *data)
{
	struct rmt_file *f;
	size_t len = strlen(data);

	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "%s", rel),
				   O_WRONLY | O_CREAT | O_TRUNC, 0644, &f));
	assert_int_equal(rmt_file_pwrite(f, data, len, 0), len);
	assert_rc_ok(rmt_file_close(f));
}

/* The file's content on the server's side equals want[0, len). */
static void assert_local(struct fx *fx, const char *rel, const void *want,
			 size_t len)
{
	char *got = malloc(len + 1);
	ssize_t n;
	int fd;

	assert_non_null(got);
	fd = open(lp(fx, rel), O_RDONLY);
	assert_true(fd >= 0);
	n = pread(fd, got, len + 1, 0);
	close(fd);
	assert_int_equal(n, len);
	assert_memory_equal(got, want, len);
	free(got);
}

/* The bytes at off of the file on the server's side equal want. */
static void assert_local_at(struct fx *fx, const char *rel, off_t off,
			    const void *want, size_t len)
{
	char *got = malloc(len);
	ssize_t n;
	int fd;

	assert_non_null(got);
	fd = open(lp(fx, rel), O_RDONLY);
	assert_true(fd >= 0);
	n = pread(fd, got, len, off);
	close(fd);
	assert_int_equal(n, len);
	assert_memory_equal(got, want, len);
	free(got);
}

/* --- the share ---------------------------------------------------------- */

static void test_nfs__id_caps_and_urls(void **state)
{
	struct fx *fx = *state;
	struct rmt *r = (void *)1;
	char messy[PATH_MAX + 16], want[PATH_MAX];
	struct statvfs sv;
	unsigned int caps = rmt_caps(fx->r);

	/* pooled: thread-safe; no xattrs, no fd; close reports errors */
	assert_true(caps & RMT_CAP_THREADSAFE);
	assert_true(caps & RMT_CAP_CLOSE_ERRORS);
	assert_false(caps & (RMT_CAP_XATTR | RMT_CAP_FD));
	assert_string_equal(rmt_id(fx->r), url_base);
	/* '/' runs and a trailing '/' do not make another share */
	snprintf(messy, sizeof(messy), "%s//%s/%s", url_base, fx->sub,
		 url_query);
	assert_rc_ok(rmt_open(messy, NULL, &r));
	snprintf(want, sizeof(want), "%s/%s", url_base, fx->sub);
	assert_string_equal(rmt_id(r), want);
	rmt_close(r);
	assert_rc_ok(rmt_statfs(fx->r, &sv));
	assert_true(sv.f_bsize > 0 && sv.f_blocks > 0);
	fuse_set_log_func(ignore_log);
	r = (void *)1;
	assert_rc_err(rmt_open("nfs://", NULL, &r), EINVAL);
	assert_null(r);
	assert_rc_err(rmt_open("nfs://host", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("nfs://host:2049/x", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("nfs://host/x?bogus=1", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("nfs://host/x?version=5", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("nfs://host/x?uid=-1", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("nfs://host/a/../x", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("nfs://host/a%20b", NULL, &r), EINVAL);
	assert_rc_err(rmt_open(fx->url, "bogus=1", &r), EINVAL);
	/* a directory the server does not have */
	snprintf(messy, sizeof(messy), "%s/no-such-dir%s", url_base,
		 url_query);
	assert_true(rmt_open(messy, NULL, &r) < 0);
	assert_null(r);
}

/* --- names -------------------------------------------------------------- */

struct names {
	int n, reg, dir, lnk;
	bool ino_ok;
	struct rmt *r;
	const char *sub;
};

static int count_entry(const char *name, const struct stat *st, void *arg)
{
	struct names *c = arg;
	char path[PATH_MAX];
	struct stat again;

	c->n++;
	if (!st)
		return 0;
	c->reg += S_ISREG(st->st_mode);
	c->dir += S_ISDIR(st->st_mode);
	c->lnk += S_ISLNK(st->st_mode);
	snprintf(path, sizeof(path), "%s/%s", c->sub, name);
	if (rmt_stat(c->r, path, &again) < 0 || again.st_ino != st->st_ino ||
	    again.st_dev != st->st_dev || again.st_mode != st->st_mode)
		c->ino_ok = false;
	return 0;
}

/* No call follows a symlink in a path (remote.h): -ELOOP. */
static void test_nfs__symlinks_never_followed(void **state)
{
	struct fx *fx = *state;
	struct rmt_setattr sa = { .set = RMT_SET_MODE, .mode = 0600 };
	struct names names = { .r = fx->r, .sub = fx->sub };
	struct rmt_file *f = NULL;
	char buf[64];
	struct stat st;

	assert_rc_ok(rmt_mkdir(fx->r, rp(fx, "d"), 0755));
	put(fx, "d/f", "data");
	assert_rc_ok(rmt_symlink(fx->r, "d", rp(fx, "l")));
	assert_rc_ok(rmt_symlink(fx->r, "/", rp(fx, "abs")));
	assert_rc_ok(rmt_symlink(fx->r, "../..", rp(fx, "up")));

	assert_rc_ok(rmt_stat(fx->r, rp(fx, "l"), &st));
	assert_true(S_ISLNK(st.st_mode));
	assert_rc_err(rmt_stat(fx->r, rp(fx, "l/f"), &st), ELOOP);
	assert_rc_err(rmt_stat(fx->r, rp(fx, "abs/etc"), &st), ELOOP);
	assert_rc_err(rmt_stat(fx->r, rp(fx, "up/x"), &st), ELOOP);
	assert_rc_err(rmt_file_open(fx->r, rp(fx, "l/f"), O_RDONLY, 0, &f),
		      ELOOP);
	assert_rc_err(rmt_file_open(fx->r, rp(fx, "l"), O_RDONLY, 0, &f),
		      ELOOP);
	assert_rc_err(rmt_file_open(fx->r, rp(fx, "l/new"),
				    O_WRONLY | O_CREAT | O_EXCL, 0644, &f),
		      ELOOP);
	assert_null(f);
	assert_rc_err(rmt_readdir(fx->r, rp(fx, "l"), count_entry, &names),
		      ELOOP);
	assert_rc_err(rmt_mkdir(fx->r, rp(fx, "l/x"), 0755), ELOOP);
	assert_rc_err(rmt_unlink(fx->r, rp(fx, "l/f")), ELOOP);
	assert_rc_err(rmt_rename(fx->r, rp(fx, "l/f"), rp(fx, "g"), 0), ELOOP);
	assert_rc_err(rmt_rename(fx->r, rp(fx, "d/f"), rp(fx, "l/g"), 0),
		      ELOOP);
	assert_rc_err(rmt_setattr(fx->r, rp(fx, "l/f"), NULL, &sa), ELOOP);
	assert_rc_err(rmt_symlink(fx->r, "t", rp(fx, "l/s")), ELOOP);
	assert_rc_err(rmt_link(fx->r, rp(fx, "l/f"), rp(fx, "h")), ELOOP);
	assert_rc_err(rmt_readlink(fx->r, rp(fx, "l/f"), buf, sizeof(buf)),
		      ELOOP);
	assert_rc_err(rmt_mknod(fx->r, rp(fx, "l/p"), S_IFIFO | 0600, 0),
		      ELOOP);
	/* a file in the middle: ENOTDIR */
	assert_rc_err(rmt_stat(fx->r, rp(fx, "d/f/x"), &st), ENOTDIR);
	assert_rc_err(rmt_mkdir(fx->r, rp(fx, "d/f/x"), 0755), ENOTDIR);
	/* nothing changed behind the link */
	assert_local(fx, "d/f", "data", 4);
	assert_int_equal(lstat(lp(fx, "d/f"), &st), 0);
	assert_int_equal(st.st_mode & 07777, 0644);
	assert_int_equal(rmt_readlink(fx->r, rp(fx, "l"), buf, sizeof(buf)),
			 1);
	assert_string_equal(buf, "d");
}

static void test_nfs__readdir(void **state)
{
	struct fx *fx = *state;
	struct names c = { .ino_ok = true, .r = fx->r };
	char name[32];
	int i;

	for (i = 0; i < 300; i++) {
		struct rmt_file *f;

		snprintf(name, sizeof(name), "f%03d", i);
		assert_rc_ok(rmt_file_open(fx->r, rp(fx, "%s", name),
					   O_WRONLY | O_CREAT | O_EXCL, 0600,
					   &f));
		assert_rc_ok(rmt_file_close(f));
	}
	assert_rc_ok(rmt_mkdir(fx->r, rp(fx, "sub"), 0755));
	assert_rc_ok(rmt_symlink(fx->r, "f000", rp(fx, "lnk")));
	c.sub = fx->sub;
	assert_rc_ok(rmt_readdir(fx->r, fx->sub, count_entry, &c));
	assert_int_equal(c.n, 302);
	assert_int_equal(c.reg, 300);
	assert_int_equal(c.dir, 1);
	assert_int_equal(c.lnk, 1);
	assert_true(c.ino_ok);
	assert_rc_err(rmt_readdir(fx->r, rp(fx, "f000"), count_entry, &c),
		      ENOTDIR);
	assert_rc_err(rmt_readdir(fx->r, rp(fx, "none"), count_entry, &c),
		      ENOENT);
}

static void test_nfs__name_errors(void **state)
{
	struct fx *fx = *state;
	char small[4], buf[64];
	struct stat st;

	assert_rc_ok(rmt_mkdir(fx->r, rp(fx, "d"), 0750));
	assert_int_equal(lstat(lp(fx, "d"), &st), 0);
	assert_int_equal(st.st_mode & 07777, 0750);
	put(fx, "d/f", "x");
	assert_rc_err(rmt_mkdir(fx->r, rp(fx, "d"), 0755), EEXIST);
	assert_rc_err(rmt_rmdir(fx->r, rp(fx, "d")), ENOTEMPTY);
	assert_rc_err(rmt_rmdir(fx->r, rp(fx, "d/f")), ENOTDIR);
	assert_rc_err(rmt_unlink(fx->r, rp(fx, "nothing")), ENOENT);
	assert_rc_err(rmt_link(fx->r, rp(fx, "d"), rp(fx, "d2")), EPERM);
	assert_rc_err(rmt_readlink(fx->r, rp(fx, "d/f"), buf, sizeof(buf)),
		      EINVAL);
	assert_rc_ok(rmt_symlink(fx->r, "a-long-target", rp(fx, "s")));
	assert_rc_err(rmt_readlink(fx->r, rp(fx, "s"), small, sizeof(small)),
		      ENAMETOOLONG);
	assert_int_equal(rmt_readlink(fx->r, rp(fx, "s"), buf, sizeof(buf)),
			 13);
	assert_string_equal(buf, "a-long-target");
	/* a hard link of a symlink is the symlink */
	assert_rc_ok(rmt_link(fx->r, rp(fx, "s"), rp(fx, "s2")));
	assert_rc_ok(rmt_stat(fx->r, rp(fx, "s2"), &st));
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(st.st_nlink, 2);
	assert_rc_ok(rmt_mknod(fx->r, rp(fx, "p"), S_IFIFO | 0640, 0));
	assert_int_equal(lstat(lp(fx, "p"), &st), 0);
	assert_true(S_ISFIFO(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0640);
	assert_rc_err(rmt_mknod(fx->r, rp(fx, "p"), S_IFIFO | 0640, 0), EEXIST);
	assert_rc_err(rmt_mknod(fx->r, rp(fx, "c"), S_IFCHR | 0600, 0), EPERM);
	assert_rc_ok(rmt_unlink(fx->r, rp(fx, "d/f")));
	assert_rc_ok(rmt_rmdir(fx->r, rp(fx, "d")));
	assert_int_equal(lstat(lp(fx, "d"), &st), -1);
}

static void test_nfs__rename_flags(void **state)
{
	struct fx *fx = *state;
	struct stat st;

	put(fx, "a", "A");
	put(fx, "b", "B");
	assert_rc_err(rmt_rename(fx->r, rp(fx, "a"), rp(fx, "b"),
				 RMT_RENAME_NOREPLACE),
		      EEXIST);
	assert_rc_err(rmt_rename(fx->r, rp(fx, "a"), rp(fx, "b"),
				 RMT_RENAME_EXCHANGE),
		      EINVAL);
	assert_local(fx, "a", "A", 1);
	assert_local(fx, "b", "B", 1);
	assert_rc_ok(rmt_rename(fx->r, rp(fx, "a"), rp(fx, "c"),
				RMT_RENAME_NOREPLACE));
	assert_rc_ok(rmt_rename(fx->r, rp(fx, "c"), rp(fx, "b"), 0));
	assert_local(fx, "b", "A", 1);
	assert_int_equal(lstat(lp(fx, "a"), &st), -1);
	assert_int_equal(lstat(lp(fx, "c"), &st), -1);
}

/* --- attributes --------------------------------------------------------- */

static bool ts_eq(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

static void test_nfs__setattr(void **state)
{
	struct fx *fx = *state;
	struct timespec at = { 1000000000, 123456789 };
	struct timespec mt = { 1234567890, 987654321 };
	struct rmt_setattr sa = { .set = RMT_SET_ATIME | RMT_SET_MTIME,
				  .atime = at, .mtime = mt };
	struct rmt_file *f;
	struct stat st;

	put(fx, "f", "hello world");
	/* mode, owner, size by name; times last */
	sa.set |= RMT_SET_MODE | RMT_SET_UID | RMT_SET_GID | RMT_SET_SIZE;
	sa.mode = 04751;
	sa.uid = 1000;
	sa.gid = 2000;
	sa.size = 5;
	assert_rc_ok(rmt_setattr(fx->r, rp(fx, "f"), NULL, &sa));
	assert_int_equal(lstat(lp(fx, "f"), &st), 0);
	assert_int_equal(st.st_size, 5);
	assert_int_equal(st.st_uid, 1000);
	assert_int_equal(st.st_gid, 2000);
	assert_true(ts_eq(st.st_atim, at));
	assert_true(ts_eq(st.st_mtim, mt));
	/* mode set before the owner: Linux clears set-uid on chown */
	assert_int_equal(st.st_mode & 0777, 0751);
	assert_rc_ok(rmt_stat(fx->r, rp(fx, "f"), &st));
	assert_true(ts_eq(st.st_mtim, mt));

	/* UTIME_OMIT leaves a time alone */
	sa = (struct rmt_setattr){ .set = RMT_SET_ATIME | RMT_SET_MTIME,
				   .atime = { 1100000000, 0 },
				   .mtime = { 0, UTIME_OMIT } };
	assert_rc_ok(rmt_setattr(fx->r, rp(fx, "f"), NULL, &sa));
	assert_int_equal(lstat(lp(fx, "f"), &st), 0);
	assert_int_equal(st.st_atim.tv_sec, 1100000000);
	assert_true(ts_eq(st.st_mtim, mt));
	/* UTIME_NOW: a recent time */
	sa.atime = (struct timespec){ 0, UTIME_OMIT };
	sa.mtime = (struct timespec){ 0, UTIME_NOW };
	assert_rc_ok(rmt_setattr(fx->r, rp(fx, "f"), NULL, &sa));
	assert_int_equal(lstat(lp(fx, "f"), &st), 0);
	assert_true(st.st_mtim.tv_sec > time(NULL) - 60);
	assert_int_equal(st.st_atim.tv_sec, 1100000000);

	/* by handle: the size and mode of an open file */
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "f"), O_RDWR, 0, &f));
	sa = (struct rmt_setattr){ .set = RMT_SET_SIZE | RMT_SET_MODE,
				   .size = 100, .mode = 0600 };
	assert_rc_ok(rmt_setattr(fx->r, NULL, f, &sa));
	assert_rc_ok(rmt_file_stat(f, &st));
	assert_int_equal(st.st_size, 100);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_rc_ok(rmt_file_close(f));

	/* a symlink: no mode; owner of the link itself (NFSv3) */
	assert_rc_ok(rmt_symlink(fx->r, "f", rp(fx, "l")));
	sa = (struct rmt_setattr){ .set = RMT_SET_MODE, .mode = 0600 };
	assert_rc_err(rmt_setattr(fx->r, rp(fx, "l"), NULL, &sa), EOPNOTSUPP);
	sa = (struct rmt_setattr){ .set = RMT_SET_UID | RMT_SET_GID,
				   .uid = 3000, .gid = 3001 };
	assert_rc_ok(rmt_setattr(fx->r, rp(fx, "l"), NULL, &sa));
	assert_int_equal(lstat(lp(fx, "l"), &st), 0);
	assert_int_equal(st.st_uid, 3000);
	assert_int_equal(st.st_gid, 3001);
	assert_int_equal(lstat(lp(fx, "f"), &st), 0);
	assert_int_equal(st.st_uid, 1000); /* the target: from above */
	/* a directory's mode and times */
	sa = (struct rmt_setattr){ .set = RMT_SET_MODE | RMT_SET_MTIME,
				   .mode = 01777, .mtime = mt };
	assert_rc_ok(rmt_setattr(fx->r, fx->sub, NULL, &sa));
	assert_int_equal(lstat(lp(fx, ""), &st), 0);
	assert_int_equal(st.st_mode & 07777, 01777);
	assert_true(ts_eq(st.st_mtim, mt));
	/* times of an open file, by its handle */
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "f"), O_RDONLY, 0, &f));
	sa = (struct rmt_setattr){ .set = RMT_SET_MTIME,
				   .mtime = { 1500000000, 42 } };
	assert_rc_ok(rmt_setattr(fx->r, NULL, f, &sa));
	assert_rc_ok(rmt_file_close(f));
	assert_int_equal(lstat(lp(fx, "f"), &st), 0);
	assert_int_equal(st.st_mtim.tv_sec, 1500000000);
	assert_int_equal(st.st_mtim.tv_nsec, 42);
	/* size of a directory */
	sa = (struct rmt_setattr){ .set = RMT_SET_SIZE, .size = 0 };
	assert_rc_err(rmt_setattr(fx->r, fx->sub, NULL, &sa), EISDIR);
	/* nfstime3 is unsigned 32-bit */
	sa = (struct rmt_setattr){ .set = RMT_SET_MTIME,
				   .mtime = { -1, 0 } };
	if (version == 3)
		assert_rc_err(rmt_setattr(fx->r, rp(fx, "f"), NULL, &sa),
			      EINVAL);
}

/* --- files -------------------------------------------------------------- */

static void test_nfs__open_semantics(void **state)
{
	struct fx *fx = *state;
	struct rmt_file *f = NULL;
	char buf[16];
	struct stat st;

	put(fx, "f", "content");
	assert_rc_ok(rmt_mkdir(fx->r, rp(fx, "d"), 0755));
	assert_rc_err(rmt_file_open(fx->r, rp(fx, "f"),
				    O_WRONLY | O_CREAT | O_EXCL, 0600, &f),
		      EEXIST);
	assert_null(f);
	/* O_CREAT of an existing file: neither mode nor content change */
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "f"), O_RDWR | O_CREAT, 0600,
				   &f));
	assert_rc_ok(rmt_file_close(f));
	assert_int_equal(lstat(lp(fx, "f"), &st), 0);
	assert_int_equal(st.st_mode & 07777, 0644);
	assert_local(fx, "f", "content", 7);
	/* a created file has the mode asked for */
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "g"),
				   O_WRONLY | O_CREAT | O_EXCL, 0640, &f));
	assert_rc_ok(rmt_file_close(f));
	assert_int_equal(lstat(lp(fx, "g"), &st), 0);
	assert_int_equal(st.st_mode & 07777, 0640);
	/* a write-only handle can read (fs/ reads through one) */
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "f"), O_WRONLY, 0, &f));
	assert_int_equal(rmt_file_pread(f, buf, sizeof(buf), 0), 7);
	assert_rc_ok(rmt_file_close(f));
	/* O_TRUNC */
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "f"), O_WRONLY | O_TRUNC, 0,
				   &f));
	assert_rc_ok(rmt_file_stat(f, &st));
	assert_int_equal(st.st_size, 0);
	assert_rc_ok(rmt_file_close(f));
	assert_rc_err(rmt_file_open(fx->r, rp(fx, "d"), O_RDONLY, 0, &f),
		      EISDIR);
	assert_rc_ok(rmt_mknod(fx->r, rp(fx, "p"), S_IFIFO | 0600, 0));
	assert_rc_err(rmt_file_open(fx->r, rp(fx, "p"), O_RDONLY, 0, &f),
		      EINVAL);
	assert_rc_err(rmt_file_open(fx->r, rp(fx, "none"), O_RDONLY, 0, &f),
		      ENOENT);
	assert_rc_err(rmt_file_open(fx->r, rp(fx, "f"), O_ACCMODE, 0, &f),
		      EINVAL);
}

static void test_nfs__big_io(void **state)
{
	struct fx *fx = *state;
	size_t len = 8 * MiB + 3;
	char *buf = malloc(len), *got = malloc(len + 100);
	struct rmt_counters c0, c1;
	struct rmt_file *f;
	struct stat st;
	off_t far = (off_t)5 << 30;
	size_t i;

	assert_non_null(buf);
	assert_non_null(got);
	for (i = 0; i < len; i++)
		buf[i] = (char)(i * 31 + (i >> 13));
	rmt_counters(fx->r, &c0);
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "big"),
				   O_RDWR | O_CREAT | O_EXCL, 0644, &f));
	assert_int_equal(rmt_file_pwrite(f, buf, len, 0), len);
	/* short only at EOF */
	assert_int_equal(rmt_file_pread(f, got, len + 100, 0), len);
	assert_memory_equal(got, buf, len);
	assert_int_equal(rmt_file_pread(f, got, 100, (off_t)len), 0);
	assert_int_equal(rmt_file_pread(f, got, 100, (off_t)len - 10), 10);
	/* unaligned, in the middle */
	assert_int_equal(rmt_file_pwrite(f, "XYZ", 3, 1000001), 3);
	memcpy(buf + 1000001, "XYZ", 3);
	assert_int_equal(rmt_file_pread(f, got, 5, 1000000), 5);
	assert_memory_equal(got, buf + 1000000, 5);
	/* far away: a sparse file */
	assert_int_equal(rmt_file_pwrite(f, "end", 3, far), 3);
	assert_rc_ok(rmt_file_stat(f, &st));
	assert_int_equal(st.st_size, far + 3);
	assert_int_equal(rmt_file_seek(f, 0, SEEK_DATA), 0);
	assert_int_equal(rmt_file_seek(f, 10, SEEK_HOLE), far + 3);
	assert_rc_err(rmt_file_seek(f, far + 3, SEEK_DATA), ENXIO);
	assert_rc_err(rmt_file_seek(f, 0, SEEK_SET), EINVAL);
	assert_rc_err(rmt_file_fallocate(f, 0, 0, 10), EOPNOTSUPP);
	assert_rc_ok(rmt_file_fsync(f, false));
	assert_rc_ok(rmt_file_flush(f));
	assert_rc_ok(rmt_file_close(f));
	assert_local_at(fx, "big", 0, buf, len);
	assert_local_at(fx, "big", far, "end", 3);
	rmt_counters(fx->r, &c1);
	assert_int_equal(c1.bytes_written - c0.bytes_written, len + 3 + 3);
	/* a copy: the generic read/write loop (no server-side copy) */
	{
		struct rmt_file *a, *b;

		assert_rc_ok(rmt_file_open(fx->r, rp(fx, "big"), O_RDONLY, 0,
					   &a));
		assert_rc_ok(rmt_file_open(fx->r, rp(fx, "copy"),
					   O_RDWR | O_CREAT | O_EXCL, 0644,
					   &b));
		assert_int_equal(rmt_file_copy(a, 0, b, 0, 3 * MiB), 3 * MiB);
		assert_rc_ok(rmt_file_close(a));
		assert_rc_ok(rmt_file_close(b));
		assert_local(fx, "copy", buf, 3 * MiB);
	}
	free(buf);
	free(got);
}

struct hidden {
	int hidden, total;
};

static int count_hidden(const char *name, const struct stat *st, void *arg)
{
	struct hidden *h = arg;

	(void)st;
	h->total++;
	h->hidden += !strncmp(name, ".ferryfs.", 9);
	return 0;
}

/* An open file survives its unlink and a rename over it (silly rename),
 * across the pool's connections; its last close removes it. */
static void test_nfs__open_file_survives_unlink(void **state)
{
	struct fx *fx = *state;
	struct rmt_file *f, *g;
	struct hidden h = { 0 };
	char buf[16] = "";
	struct stat st;

	put(fx, "f", "old data");
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "f"), O_RDWR, 0, &f));
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "f"), O_RDONLY, 0, &g));
	assert_rc_ok(rmt_unlink(fx->r, rp(fx, "f")));
	assert_rc_err(rmt_stat(fx->r, rp(fx, "f"), &st), ENOENT);
	assert_int_equal(rmt_file_pread(f, buf, sizeof(buf), 0), 8);
	assert_int_equal(rmt_file_pwrite(f, "NEW", 3, 0), 3);
	assert_int_equal(rmt_file_pread(g, buf, sizeof(buf), 0), 8);
	assert_memory_equal(buf, "NEW data", 8);
	assert_rc_ok(rmt_file_stat(f, &st));
	assert_int_equal(st.st_size, 8);
	assert_rc_ok(rmt_readdir(fx->r, fx->sub, count_hidden, &h));
	assert_int_equal(h.hidden, 1);
	assert_rc_ok(rmt_file_close(f));
	h = (struct hidden){ 0 };
	assert_rc_ok(rmt_readdir(fx->r, fx->sub, count_hidden, &h));
	assert_int_equal(h.hidden, 1); /* g still has it */
	assert_rc_ok(rmt_file_close(g));
	h = (struct hidden){ 0 };
	assert_rc_ok(rmt_readdir(fx->r, fx->sub, count_hidden, &h));
	assert_int_equal(h.total, 0);

	/* renamed over while open */
	put(fx, "a", "AAAA");
	put(fx, "b", "BBBB");
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "b"), O_RDONLY, 0, &f));
	assert_rc_ok(rmt_rename(fx->r, rp(fx, "a"), rp(fx, "b"), 0));
	assert_int_equal(rmt_file_pread(f, buf, 4, 0), 4);
	assert_memory_equal(buf, "BBBB", 4);
	assert_local(fx, "b", "AAAA", 4);
	assert_rc_ok(rmt_file_close(f));
	h = (struct hidden){ 0 };
	assert_rc_ok(rmt_readdir(fx->r, fx->sub, count_hidden, &h));
	assert_int_equal(h.total, 1);
	assert_int_equal(h.hidden, 0);

	/* a file with another link is simply unlinked */
	put(fx, "c", "C");
	assert_rc_ok(rmt_link(fx->r, rp(fx, "c"), rp(fx, "c2")));
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "c"), O_RDONLY, 0, &f));
	assert_rc_ok(rmt_unlink(fx->r, rp(fx, "c")));
	assert_int_equal(rmt_file_pread(f, buf, 4, 0), 1);
	h = (struct hidden){ 0 };
	assert_rc_ok(rmt_readdir(fx->r, fx->sub, count_hidden, &h));
	assert_int_equal(h.hidden, 0);
	assert_rc_ok(rmt_file_close(f));
}

/* A directory that holds only hidden names: -EBUSY while their files are
 * open here, removable once closed; a hidden name no file of ours has (a
 * killed process left it) is removed with the directory; a real name
 * keeps the directory. */
static void test_nfs__rmdir_over_hidden_names(void **state)
{
	struct fx *fx = *state;
	struct rmt_file *f;
	struct stat st;

	assert_rc_ok(rmt_mkdir(fx->r, rp(fx, "d"), 0755));
	put(fx, "d/f", "data");
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "d/f"), O_RDONLY, 0, &f));
	assert_rc_ok(rmt_unlink(fx->r, rp(fx, "d/f")));
	assert_rc_err(rmt_rmdir(fx->r, rp(fx, "d")), EBUSY);
	assert_rc_ok(rmt_file_close(f));
	assert_rc_ok(rmt_rmdir(fx->r, rp(fx, "d")));
	assert_rc_err(rmt_stat(fx->r, rp(fx, "d"), &st), ENOENT);

	assert_rc_ok(rmt_mkdir(fx->r, rp(fx, "e"), 0755));
	put(fx, "e/.ferryfs.77.1", "left behind");
	assert_rc_ok(rmt_rmdir(fx->r, rp(fx, "e")));
	assert_rc_err(rmt_stat(fx->r, rp(fx, "e"), &st), ENOENT);

	assert_rc_ok(rmt_mkdir(fx->r, rp(fx, "g"), 0755));
	put(fx, "g/.ferryfs.78.1", "left behind");
	put(fx, "g/real", "keep");
	assert_rc_err(rmt_rmdir(fx->r, rp(fx, "g")), ENOTEMPTY);
	assert_rc_ok(rmt_stat(fx->r, rp(fx, "g/real"), &st));
}

/* --- threads and connections -------------------------------------------- */

#define NTHREADS 8

struct writer {
	struct rmt *r;
	struct rmt_file *f; /* one shared big file, or NULL */
	const char *sub;
	int id;
	atomic_int *errors;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	size_t len = 2 * MiB;
	char *buf = malloc(len), *got = malloc(len);
	char name[PATH_MAX];
	struct rmt_file *f;

	if (!buf || !got)
		goto fail;
	memset(buf, 'a' + w->id, len);
	snprintf(name, sizeof(name), "%s/w%d", w->sub, w->id);
	/* its own file, and its own range of the shared one */
	if (rmt_file_open(w->r, name, O_RDWR | O_CREAT | O_EXCL, 0644, &f) < 0)
		goto fail;
	if (rmt_file_pwrite(f, buf, len, 0) != (ssize_t)len ||
	    rmt_file_close(f) < 0)
		goto fail;
	if (rmt_file_pwrite(w->f, buf, len, (off_t)(w->id * len)) !=
		    (ssize_t)len ||
	    rmt_file_pread(w->f, got, len, (off_t)(w->id * len)) !=
		    (ssize_t)len ||
	    memcmp(buf, got, len))
		goto fail;
	free(buf);
	free(got);
	return NULL;
fail:
	atomic_fetch_add(w->errors, 1);
	free(buf);
	free(got);
	return NULL;
}

static void test_nfs__threads_over_connections(void **state)
{
	struct fx *fx = *state;
	struct writer w[NTHREADS];
	pthread_t tid[NTHREADS];
	struct rmt_file *shared;
	atomic_int errors;
	char *want = malloc(2 * MiB);
	int i;

	assert_non_null(want);
	atomic_init(&errors, 0);
	rmt_close(fx->r);
	open_share(fx, "connections=4");
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "shared"),
				   O_RDWR | O_CREAT | O_EXCL, 0644, &shared));
	for (i = 0; i < NTHREADS; i++) {
		w[i] = (struct writer){ .r = fx->r, .f = shared,
					.sub = fx->sub, .id = i,
					.errors = &errors };
		assert_int_equal(pthread_create(&tid[i], NULL, writer_main,
						&w[i]),
				 0);
	}
	for (i = 0; i < NTHREADS; i++)
		assert_int_equal(pthread_join(tid[i], NULL), 0);
	assert_int_equal(atomic_load(&errors), 0);
	assert_rc_ok(rmt_file_close(shared));
	for (i = 0; i < NTHREADS; i++) {
		char name[16];
		int fd;
		ssize_t n;

		memset(want, 'a' + i, 2 * MiB);
		snprintf(name, sizeof(name), "w%d", i);
		assert_local(fx, name, want, 2 * MiB);
		fd = open(lp(fx, "shared"), O_RDONLY);
		assert_true(fd >= 0);
		n = pread(fd, want, 2 * MiB, (off_t)i * 2 * (off_t)MiB);
		close(fd);
		assert_int_equal(n, 2 * MiB);
		assert_int_equal(want[0], 'a' + i);
		assert_int_equal(want[2 * MiB - 1], 'a' + i);
	}
	free(want);
}

/*
 * The server restarts under an open file: calls wait, reconnect and go on
 * (hard-mount semantics). NFSv4: the connection comes back, but the
 * client's state died with the server and libnfs 4.0 does not set it up
 * again, so only a call by name without state is checked.
 */
static void test_nfs__reconnects_after_server_restart(void **state)
{
	struct fx *fx = *state;
	const char *restart = getenv("FERRYFS_NFS_RESTART");
	char buf[64 * 1024], got[sizeof(buf)];
	struct rmt_file *f;
	struct stat st;

	if (!restart || !*restart)
		skip();
	memset(buf, 'r', sizeof(buf));
	assert_rc_ok(rmt_file_open(fx->r, rp(fx, "f"),
				   O_RDWR | O_CREAT | O_EXCL, 0644, &f));
	assert_int_equal(rmt_file_pwrite(f, buf, sizeof(buf), 0), sizeof(buf));
	assert_rc_ok(rmt_file_fsync(f, false));
	assert_int_equal(system(restart), 0);
	fuse_set_log_func(ignore_log); /* "connection lost" */
	if (version == 4) {
		rmt_file_close(f); /* its state is gone: any result */
		assert_rc_ok(rmt_stat(fx->r, rp(fx, "f"), &st));
		assert_int_equal(st.st_size, sizeof(buf));
		return;
	}
	assert_int_equal(rmt_file_pwrite(f, buf, sizeof(buf), sizeof(buf)),
			 sizeof(buf));
	assert_rc_ok(rmt_file_fsync(f, false));
	assert_int_equal(rmt_file_pread(f, got, sizeof(got), sizeof(buf)),
			 sizeof(got));
	assert_memory_equal(got, buf, sizeof(buf));
	assert_rc_ok(rmt_stat(fx->r, rp(fx, "f"), &st));
	assert_int_equal(st.st_size, 2 * sizeof(buf));
	assert_rc_ok(rmt_file_close(f));
}

int main(void)
{
	const char *url = getenv("FERRYFS_NFS_URL");
	const char *q;
	static char base[PATH_MAX];
	const struct CMUnitTest tests[] = {
#define T(name)                                                          \
	cmocka_unit_test_prestate_setup_teardown(test_nfs__##name, setup, \
						 teardown, #name)
		T(id_caps_and_urls),
		T(symlinks_never_followed),
		T(readdir),
		T(name_errors),
		T(rename_flags),
		T(setattr),
		T(open_semantics),
		T(big_io),
		T(open_file_survives_unlink),
		T(rmdir_over_hidden_names),
		T(threads_over_connections),
		T(reconnects_after_server_restart),
#undef T
	};

	/* a failed case may end in abort() (a pool closed with a file still
	 * open): unbuffered, its message is out first */
	setvbuf(stdout, NULL, _IONBF, 0);
	dir_base = getenv("FERRYFS_NFS_DIR");
	if (!url || !*url || !dir_base || !*dir_base) {
		printf("# skip: FERRYFS_NFS_URL and FERRYFS_NFS_DIR must be set "
		       "(run through tests/it/nfs_suite.sh)\n");
		return 77;
	}
	q = strchr(url, '?');
	snprintf(base, sizeof(base), "%.*s",
		 (int)(q ? (size_t)(q - url) : strlen(url)), url);
	url_base = base;
	url_query = q ? q : "";
	if (strstr(url_query, "version=4"))
		version = 4;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
