/*
 * test_pool.c - unit tests of the pool wrapper (remote/pool.c) and of its
 * option, connections=N.
 *
 * The pool is driven over a fake driver, "unsafe": each of its
 * connections forwards every call to a path driver over <tmp>/root, but
 * has no RMT_CAP_THREADSAFE, and watches itself: a call that finds
 * another thread already inside the same connection counts a violation
 * (the one thing the pool exists to prevent), and every call stays inside
 * for hold_us so that overlaps would be seen. The fake also counts the
 * calls in flight over all connections, to see the pool does run K of
 * them at once, and can fail the Nth connection it opens.
 *
 * Each case gets a fresh mkdtemp() dir. Threads report through atomics;
 * only the main thread asserts (cmocka is not thread-safe).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>
#include <fuse_log.h>

#include "remote.h"
#include "remote_i.h" /* the pool's and the fake driver's internals */

#include "test_util.h"

#define MAXC 8

/* --- the fake driver ----------------------------------------------------- */

/* What all connections of the fake share; reset by setup(). */
static struct {
	atomic_int violations; /* a call found another inside its connection */
	atomic_int active;     /* calls inside any connection now */
	atomic_int max_active; /* the most at once */
	atomic_int opened;     /* connections opened so far */
	atomic_int closed;
	atomic_int calls;      /* calls that reached a connection */
	int fail_open_at;      /* the Nth open fails (1-based); 0: never */
	unsigned int hold_us;  /* time each call spends inside */
} fk;

struct urmt {
	struct rmt base;
	struct rmt *inner; /* path driver: thread-safe, but we act as not */
	atomic_int inside;
	atomic_int nfiles; /* files open on this connection */
	int index;         /* 0-based order of opening */
};

struct ufile {
	struct rmt_file base;
	struct rmt_file *inner;
};

static struct urmt *to_u(struct rmt *r)
{
	return (struct urmt *)r;
}

static struct rmt_file *in_of(struct rmt_file *f)
{
	return ((struct ufile *)f)->inner;
}

static void enter(struct urmt *u)
{
	int a, m;

	if (atomic_fetch_add(&u->inside, 1) != 0)
		atomic_fetch_add(&fk.violations, 1);
	atomic_fetch_add(&fk.calls, 1);
	a = atomic_fetch_add(&fk.active, 1) + 1;
	m = atomic_load(&fk.max_active);
	while (a > m && !atomic_compare_exchange_weak(&fk.max_active, &m, a))
		;
	if (fk.hold_us)
		usleep(fk.hold_us);
}

static void leave(struct urmt *u)
{
	atomic_fetch_sub(&fk.active, 1);
	atomic_fetch_sub(&u->inside, 1);
}

/* `return call` on connection u, inside enter/leave. */
#define FWD(u, type, call)            \
	do {                          \
		type rc_;             \
		enter(u);             \
		rc_ = call;           \
		leave(u);             \
		return rc_;           \
	} while (0)

static void u_close(struct rmt *r)
{
	rmt_close(to_u(r)->inner);
	atomic_fetch_add(&fk.closed, 1);
	free(r);
}

static int u_stat(struct rmt *r, const char *path, struct stat *st)
{
	FWD(to_u(r), int, rmt_stat(to_u(r)->inner, path, st));
}

static int u_statfs(struct rmt *r, struct statvfs *sv)
{
	FWD(to_u(r), int, rmt_statfs(to_u(r)->inner, sv));
}

static int u_readdir(struct rmt *r, const char *path, rmt_dirent_fn fn,
		     void *arg)
{
	FWD(to_u(r), int, rmt_readdir(to_u(r)->inner, path, fn, arg));
}

static int u_mkdir(struct rmt *r, const char *path, mode_t mode)
{
	FWD(to_u(r), int, rmt_mkdir(to_u(r)->inner, path, mode));
}

static int u_rmdir(struct rmt *r, const char *path)
{
	FWD(to_u(r), int, rmt_rmdir(to_u(r)->inner, path));
}

static int u_unlink(struct rmt *r, const char *path)
{
	FWD(to_u(r), int, rmt_unlink(to_u(r)->inner, path));
}

static int u_mknod(struct rmt *r, const char *path, mode_t mode, dev_t rdev)
{
	FWD(to_u(r), int, rmt_mknod(to_u(r)->inner, path, mode, rdev));
}

static int u_symlink(struct rmt *r, const char *target, const char *path)
{
	FWD(to_u(r), int, rmt_symlink(to_u(r)->inner, target, path));
}

static int u_readlink(struct rmt *r, const char *path, char *buf,
		      size_t size)
{
	FWD(to_u(r), int, rmt_readlink(to_u(r)->inner, path, buf, size));
}

static int u_link(struct rmt *r, const char *from, const char *to)
{
	FWD(to_u(r), int, rmt_link(to_u(r)->inner, from, to));
}

static int u_rename(struct rmt *r, const char *from, const char *to,
		    unsigned int flags)
{
	FWD(to_u(r), int, rmt_rename(to_u(r)->inner, from, to, flags));
}

static int u_setattr(struct rmt *r, const char *path, struct rmt_file *f,
		     const struct rmt_setattr *sa)
{
	/* a file must come back on the connection it was opened on */
	if (f && f->r != r)
		atomic_fetch_add(&fk.violations, 1);
	FWD(to_u(r), int,
	    rmt_setattr(to_u(r)->inner, path, f ? in_of(f) : NULL, sa));
}

static ssize_t u_getxattr(struct rmt *r, const char *path, const char *name,
			  void *buf, size_t size)
{
	FWD(to_u(r), ssize_t,
	    rmt_getxattr(to_u(r)->inner, path, name, buf, size));
}

static int u_setxattr(struct rmt *r, const char *path, const char *name,
		      const void *value, size_t size, int flags)
{
	FWD(to_u(r), int,
	    rmt_setxattr(to_u(r)->inner, path, name, value, size, flags));
}

static ssize_t u_listxattr(struct rmt *r, const char *path, char *buf,
			   size_t size)
{
	FWD(to_u(r), ssize_t, rmt_listxattr(to_u(r)->inner, path, buf, size));
}

static int u_removexattr(struct rmt *r, const char *path, const char *name)
{
	FWD(to_u(r), int, rmt_removexattr(to_u(r)->inner, path, name));
}

static int u_file_open(struct rmt *r, const char *path, int flags,
		       mode_t mode, struct rmt_file **out)
{
	struct ufile *uf = calloc(1, sizeof(*uf));
	int rc;

	if (!uf)
		return -ENOMEM;
	enter(to_u(r));
	rc = rmt_file_open(to_u(r)->inner, path, flags, mode, &uf->inner);
	leave(to_u(r));
	if (rc < 0) {
		free(uf);
		return rc;
	}
	atomic_fetch_add(&to_u(r)->nfiles, 1);
	uf->base.r = r;
	*out = &uf->base;
	return 0;
}

static int u_file_close(struct rmt_file *f)
{
	struct urmt *u = to_u(f->r);
	int rc;

	enter(u);
	rc = rmt_file_close(in_of(f));
	leave(u);
	atomic_fetch_sub(&u->nfiles, 1);
	free(f);
	return rc;
}

static ssize_t u_file_pread(struct rmt_file *f, void *buf, size_t len,
			    off_t off)
{
	FWD(to_u(f->r), ssize_t, rmt_file_pread(in_of(f), buf, len, off));
}

static ssize_t u_file_pwrite(struct rmt_file *f, const void *buf, size_t len,
			     off_t off)
{
	FWD(to_u(f->r), ssize_t, rmt_file_pwrite(in_of(f), buf, len, off));
}

static int u_file_stat(struct rmt_file *f, struct stat *st)
{
	FWD(to_u(f->r), int, rmt_file_stat(in_of(f), st));
}

static int u_file_fsync(struct rmt_file *f, bool datasync)
{
	FWD(to_u(f->r), int, rmt_file_fsync(in_of(f), datasync));
}

static int u_file_fallocate(struct rmt_file *f, int mode, off_t off,
			    off_t len)
{
	FWD(to_u(f->r), int, rmt_file_fallocate(in_of(f), mode, off, len));
}

static off_t u_file_seek(struct rmt_file *f, off_t off, int whence)
{
	FWD(to_u(f->r), off_t, rmt_file_seek(in_of(f), off, whence));
}

static int u_file_flush(struct rmt_file *f)
{
	FWD(to_u(f->r), int, rmt_file_flush(in_of(f)));
}

static const struct rmt_ops unsafe_ops = {
	.name = "unsafe",
	.close = u_close,
	.stat = u_stat,
	.statfs = u_statfs,
	.readdir = u_readdir,
	.mkdir = u_mkdir,
	.rmdir = u_rmdir,
	.unlink = u_unlink,
	.mknod = u_mknod,
	.symlink = u_symlink,
	.readlink = u_readlink,
	.link = u_link,
	.rename = u_rename,
	.setattr = u_setattr,
	.getxattr = u_getxattr,
	.setxattr = u_setxattr,
	.listxattr = u_listxattr,
	.removexattr = u_removexattr,
	.file_open = u_file_open,
	.file_close = u_file_close,
	.file_pread = u_file_pread,
	.file_pwrite = u_file_pwrite,
	.file_stat = u_file_stat,
	.file_fsync = u_file_fsync,
	.file_fallocate = u_file_fallocate,
	.file_seek = u_file_seek,
	.file_copy = NULL, /* remote.c copies through pread/pwrite */
	.file_fd = NULL,
	.file_flush = u_file_flush,
	.syncdir = NULL,
};

/* The fake's constructor (an rmt_open_fn): spec is the root directory. */
static int unsafe_open(const char *spec, const char *opts, struct rmt **out)
{
	int nth = atomic_fetch_add(&fk.opened, 1) + 1;
	struct urmt *u;
	int rc;

	*out = NULL;
	if (fk.fail_open_at && nth == fk.fail_open_at)
		return -ECONNREFUSED;
	u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	rc = rmt_open(spec, opts, &u->inner);
	if (rc < 0) {
		free(u);
		return rc;
	}
	u->base.ops = &unsafe_ops;
	u->base.caps = rmt_caps(u->inner) &
		       ~(unsigned int)(RMT_CAP_THREADSAFE | RMT_CAP_FD);
	u->base.id = strdup(rmt_id(u->inner));
	u->index = nth - 1;
	if (!u->base.id) {
		rmt_close(u->inner);
		free(u);
		return -ENOMEM;
	}
	*out = &u->base;
	return 0;
}

/* --- fixtures ------------------------------------------------------------ */

struct fx {
	char tmp[PATH_MAX];  /* mkdtemp(); removed by teardown */
	char root[PATH_MAX]; /* <tmp>/root, the share */
	struct rmt *r;       /* closed by teardown */
};

static int rm_one(const char *path, const struct stat *st, int type,
		  struct FTW *ftw)
{
	(void)st, (void)type, (void)ftw;
	return remove(path);
}

static int setup(void **state)
{
	struct fx *fx = calloc(1, sizeof(*fx));

	assert_non_null(fx);
	strcpy(fx->tmp, "/tmp/ferryfs-test-pool-XXXXXX");
	assert_non_null(mkdtemp(fx->tmp));
	assert_true(snprintf(fx->root, sizeof(fx->root), "%s/root", fx->tmp) <
		    (int)sizeof(fx->root));
	assert_int_equal(mkdir(fx->root, 0755), 0);
	atomic_store(&fk.violations, 0);
	atomic_store(&fk.active, 0);
	atomic_store(&fk.max_active, 0);
	atomic_store(&fk.opened, 0);
	atomic_store(&fk.closed, 0);
	atomic_store(&fk.calls, 0);
	fk.fail_open_at = 0;
	fk.hold_us = 0;
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fx *fx = *state;

	rmt_close(fx->r);
	fuse_set_log_func(NULL);
	assert_int_equal(nftw(fx->tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
	free(fx);
	return 0;
}

/* A pool of n connections of the fake over fx->root, in fx->r. */
static void pool_open(struct fx *fx, unsigned int n)
{
	struct rmt *first;

	assert_rc_ok(rmt_driver_open(unsafe_open, fx->root, NULL, &first));
	assert_false(rmt_caps(first) & RMT_CAP_THREADSAFE);
	assert_rc_ok(rmt_pool_wrap(first, unsafe_open, fx->root, NULL, n,
				   &fx->r));
}

/* No connection busy or waited for; files bound as want[] (may be NULL). */
static void assert_sane_pool(struct rmt *r, unsigned int n,
			     const unsigned int *want_files)
{
	struct rmt_pool_conn c[MAXC];
	unsigned int i;

	assert_int_equal(rmt_pool_inspect(r, c, MAXC), n);
	for (i = 0; i < n; i++) {
		assert_false(c[i].busy);
		assert_int_equal(c[i].waiting, 0);
		if (want_files)
			assert_int_equal(c[i].nfiles, want_files[i]);
	}
	assert_int_equal(atomic_load(&fk.violations), 0);
	assert_int_equal(atomic_load(&fk.active), 0);
}

static void ignore_log(enum fuse_log_level level, const char *fmt,
		       va_list ap)
{
	(void)level, (void)fmt, (void)ap;
}

/* --- options ------------------------------------------------------------- */

static void parse_ok(const char *opts, unsigned int want_n,
		     const char *want_rest)
{
	unsigned int n = 99;
	char *rest = (char *)1;

	assert_rc_ok(rmt_pool_parse(opts, &n, &rest));
	assert_int_equal(n, want_n);
	if (want_rest)
		assert_string_equal(rest, want_rest);
	else
		assert_null(rest);
	free(rest);
}

static void parse_bad(const char *opts)
{
	unsigned int n = 99;
	char *rest = (char *)1;

	assert_rc_err(rmt_pool_parse(opts, &n, &rest), EINVAL);
	assert_null(rest);
	assert_int_equal(n, 0);
}

static void test_pool__parse(void **state)
{
	(void)state;
	parse_ok(NULL, 0, NULL);
	parse_ok("", 0, NULL);
	parse_ok("remote_rate=1M,x=2", 0, NULL); /* not ours: unchanged */
	parse_ok("connections=4", 4, "");
	parse_ok("connections=1", 1, "");
	parse_ok("connections=64", 64, "");
	parse_ok("a=1,connections=2,,b", 2, "a=1,b");
	parse_ok("connections=2,connections=7", 7, ""); /* the last wins */
	parse_ok("connectionsx=3", 0, NULL);
	fuse_set_log_func(ignore_log);
	parse_bad("connections=0");
	parse_bad("connections=65");
	parse_bad("connections=1000000000000");
	parse_bad("connections=-1");
	parse_bad("connections=2x");
	parse_bad("connections=");
	parse_bad("connections");
	parse_bad("a,connections=0x4");
}

/* A stream of its own (flush, read-ahead) is one connection, whatever
 * connections=N the mount's options hold: they once gave every read-ahead
 * stream a pool of 4 (24 SMB workers for a default smb:// mount, where
 * 12 serve), and -o connections=N every flush stream a pool of N. */
static void test_pool__one_connection_opts(void **state)
{
	static const char *const in[] = { NULL, "", "connections=8",
					  "remote_rate=1M,connections=8,x" };
	unsigned int n;
	char *o, *rest;

	(void)state;
	for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
		assert_rc_ok(rmt_opts_one_connection(in[i], &o));
		assert_rc_ok(rmt_pool_parse(o, &n, &rest));
		assert_int_equal(n, 1);
		/* the other options stay, in their order */
		if (i == 3)
			assert_string_equal(rest, "remote_rate=1M,x");
		free(rest);
		free(o);
	}
}

/* rmt_open(): the option is taken, checked, and ignored for a share that
 * is thread-safe by itself (the path driver). */
static void test_pool__rmt_open_takes_the_option(void **state)
{
	struct fx *fx = *state;
	struct rmt *r = NULL;

	assert_rc_ok(rmt_open(fx->root, "connections=3", &fx->r));
	assert_true(rmt_caps(fx->r) & RMT_CAP_THREADSAFE);
	fuse_set_log_func(ignore_log);
	assert_rc_err(rmt_open(fx->root, "connections=0", &r), EINVAL);
	assert_null(r);
	assert_rc_err(rmt_open(fx->root, "connections=3,bogus=1", &r), EINVAL);
	assert_null(r);
	/* with the throttle's options in the same string */
	rmt_close(fx->r);
	fx->r = NULL;
	assert_rc_ok(rmt_open(fx->root, "remote_latency=0,connections=2",
			      &fx->r));
}

/* --- the pool ------------------------------------------------------------ */

/* The pool is the same share: id and caps, plus RMT_CAP_THREADSAFE. */
static void test_pool__is_the_same_share(void **state)
{
	struct fx *fx = *state;
	struct rmt *plain;
	char want[PATH_MAX + 8];
	struct stat st;

	pool_open(fx, 3);
	assert_int_equal(atomic_load(&fk.opened), 3);
	assert_rc_ok(rmt_open(fx->root, NULL, &plain));
	snprintf(want, sizeof(want), "%s", rmt_id(plain));
	assert_string_equal(rmt_id(fx->r), want);
	assert_int_equal(rmt_caps(fx->r),
			 (rmt_caps(plain) & ~(unsigned int)RMT_CAP_FD) |
				 RMT_CAP_THREADSAFE);
	rmt_close(plain);
	assert_rc_ok(rmt_stat(fx->r, "", &st));
	assert_true(S_ISDIR(st.st_mode));
	assert_sane_pool(fx->r, 3, NULL);
	rmt_close(fx->r);
	fx->r = NULL;
	assert_int_equal(atomic_load(&fk.closed), 3);
}

static void test_pool__default_connections(void **state)
{
	struct fx *fx = *state;

	pool_open(fx, 0);
	assert_int_equal(atomic_load(&fk.opened), RMT_POOL_DEFAULT);
	assert_sane_pool(fx->r, RMT_POOL_DEFAULT, NULL);
}

/* A connection that cannot be opened: the ones opened are closed again,
 * the first stays the caller's. */
static void test_pool__open_failure_undoes(void **state)
{
	struct fx *fx = *state;
	struct rmt *first, *w = (void *)1;
	struct stat st;

	assert_rc_ok(rmt_driver_open(unsafe_open, fx->root, NULL, &first));
	fk.fail_open_at = 4;
	fuse_set_log_func(ignore_log);
	assert_rc_err(rmt_pool_wrap(first, unsafe_open, fx->root, NULL, 5, &w),
		      ECONNREFUSED);
	assert_null(w);
	assert_int_equal(atomic_load(&fk.opened), 4);
	assert_int_equal(atomic_load(&fk.closed), 2); /* the 2nd and 3rd */
	assert_rc_ok(rmt_stat(first, "", &st));
	rmt_close(first);
	assert_rc_err(rmt_pool_wrap(NULL, unsafe_open, fx->root, NULL,
				    RMT_POOL_MAX + 1, &w),
		      EINVAL);
}

/* Opening one file K times puts it on K connections; each later open
 * goes where the fewest files are; closes give the slots back. */
static void test_pool__files_spread_and_bind(void **state)
{
	struct fx *fx = *state;
	struct rmt_file *f[6];
	static const unsigned int two[3] = { 2, 2, 2 };
	static const unsigned int none[3] = { 0, 0, 0 };
	struct rmt_setattr sa = { .set = RMT_SET_MODE, .mode = 0640 };
	struct rmt_setattr sz = { .set = RMT_SET_SIZE, .size = 5 };
	struct rmt_pool_conn c[3];
	struct stat st;
	int i;

	pool_open(fx, 3);
	for (i = 0; i < 3; i++)
		assert_rc_ok(rmt_file_open(fx->r, "f", O_RDWR | O_CREAT, 0644,
					   &f[i]));
	assert_int_equal(rmt_pool_inspect(fx->r, c, 3), 3);
	for (i = 0; i < 3; i++)
		assert_int_equal(c[i].nfiles, 1);
	for (i = 3; i < 6; i++)
		assert_rc_ok(rmt_file_open(fx->r, "f", O_RDONLY, 0, &f[i]));
	assert_sane_pool(fx->r, 3, two);
	/* every call on a file runs on its connection (the fake checks
	 * setattr's f; the others are structural) */
	for (i = 0; i < 6; i++) {
		if (i < 3) /* the writable ones */
			assert_rc_ok(rmt_setattr(fx->r, NULL, f[i], &sz));
		assert_rc_ok(rmt_setattr(fx->r, NULL, f[i], &sa));
		assert_rc_ok(rmt_file_stat(f[i], &st));
		assert_int_equal(st.st_size, 5);
		assert_int_equal(st.st_mode & 07777, 0640);
	}
	for (i = 0; i < 6; i++)
		assert_rc_ok(rmt_file_close(f[i]));
	assert_sane_pool(fx->r, 3, none);
	/* a failed open binds nothing */
	assert_rc_err(rmt_file_open(fx->r, "missing", O_RDONLY, 0, &f[0]),
		      ENOENT);
	assert_sane_pool(fx->r, 3, none);
}

/* The readdir callback runs with no connection held: with one connection
 * it may call the pool again (a deadlock otherwise). */
struct nested {
	struct rmt *r;
	int seen, stat_ok;
};

static int stat_each(const char *name, const struct stat *st, void *arg)
{
	struct nested *n = arg;
	struct stat again;

	n->seen++;
	if (st && rmt_stat(n->r, name, &again) == 0 &&
	    again.st_ino == st->st_ino)
		n->stat_ok++;
	return 0;
}

static int stop_at_two(const char *name, const struct stat *st, void *arg)
{
	(void)name, (void)st;
	return ++*(int *)arg == 2 ? -ECANCELED : 0;
}

static void test_pool__readdir_callback_may_reenter(void **state)
{
	struct fx *fx = *state;
	struct nested n = { 0 };
	char name[16];
	int i, count = 0;

	pool_open(fx, 1);
	for (i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "d%d", i);
		assert_rc_ok(rmt_mkdir(fx->r, name, 0755));
	}
	n.r = fx->r;
	assert_rc_ok(rmt_readdir(fx->r, "", stat_each, &n));
	assert_int_equal(n.seen, 5);
	assert_int_equal(n.stat_ok, 5);
	/* a callback's error stops the listing and is returned */
	assert_rc_err(rmt_readdir(fx->r, "", stop_at_two, &count), ECANCELED);
	assert_int_equal(count, 2);
	assert_rc_err(rmt_readdir(fx->r, "nope", stat_each, &n), ENOENT);
	assert_sane_pool(fx->r, 1, NULL);
}

/* A copy between files on two connections goes through remote.c's
 * read/write loop, each half on its own file's connection. */
static void test_pool__copy_across_connections(void **state)
{
	struct fx *fx = *state;
	struct rmt_file *a, *b;
	char buf[100], got[100];
	struct rmt_counters c;
	int i;

	pool_open(fx, 2);
	for (i = 0; i < 100; i++)
		buf[i] = (char)('a' + i % 26);
	assert_rc_ok(rmt_file_open(fx->r, "a", O_RDWR | O_CREAT, 0644, &a));
	assert_rc_ok(rmt_file_open(fx->r, "b", O_RDWR | O_CREAT, 0644, &b));
	assert_int_equal(rmt_file_pwrite(a, buf, 100, 0), 100);
	assert_int_equal(rmt_file_copy(a, 10, b, 0, 200), 90);
	assert_int_equal(rmt_file_pread(b, got, 100, 0), 90);
	assert_memory_equal(got, buf + 10, 90);
	assert_rc_ok(rmt_file_fsync(b, false));
	assert_rc_ok(rmt_file_flush(b));
	assert_rc_err(rmt_file_fd(b), EOPNOTSUPP);
	assert_rc_ok(rmt_file_close(a));
	assert_rc_ok(rmt_file_close(b));
	/* the pool's own counters (remote.c) saw the bytes */
	rmt_counters(fx->r, &c);
	assert_int_equal(c.bytes_written, 100 + 90);
	assert_int_equal(c.bytes_read, 90 + 90);
	assert_sane_pool(fx->r, 2, NULL);
}

/* Every name call of remote.h through the pool reaches the share. */
static void test_pool__every_name_call(void **state)
{
	struct fx *fx = *state;
	struct rmt_setattr sa = { .set = RMT_SET_MODE, .mode = 0600 };
	struct statvfs sv;
	struct stat st;
	char buf[64];

	pool_open(fx, 2);
	assert_rc_ok(rmt_statfs(fx->r, &sv));
	assert_rc_ok(rmt_mkdir(fx->r, "d", 0700));
	assert_rc_ok(rmt_syncdir(fx->r, "d"));
	assert_rc_ok(rmt_mknod(fx->r, "d/p", S_IFIFO | 0600, 0));
	assert_rc_ok(rmt_symlink(fx->r, "target", "d/l"));
	assert_int_equal(rmt_readlink(fx->r, "d/l", buf, sizeof(buf)), 6);
	assert_string_equal(buf, "target");
	assert_rc_ok(rmt_link(fx->r, "d/p", "d/p2"));
	assert_rc_ok(rmt_rename(fx->r, "d/p2", "d/p3", RMT_RENAME_NOREPLACE));
	assert_rc_ok(rmt_setattr(fx->r, "d", NULL, &sa));
	assert_rc_ok(rmt_stat(fx->r, "d", &st));
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_rc_ok(rmt_stat(fx->r, "d/p3", &st));
	assert_int_equal(st.st_nlink, 2);
	if (rmt_caps(fx->r) & RMT_CAP_XATTR) {
		assert_rc_ok(rmt_setxattr(fx->r, "d", "user.k", "v", 1, 0));
		assert_int_equal(rmt_getxattr(fx->r, "d", "user.k", buf, 64),
				 1);
		assert_true(rmt_listxattr(fx->r, "d", buf, 64) > 0);
		assert_rc_ok(rmt_removexattr(fx->r, "d", "user.k"));
	}
	assert_rc_ok(rmt_unlink(fx->r, "d/p"));
	assert_rc_ok(rmt_unlink(fx->r, "d/p3"));
	assert_rc_ok(rmt_unlink(fx->r, "d/l"));
	assert_rc_ok(rmt_rmdir(fx->r, "d"));
	assert_sane_pool(fx->r, 2, NULL);
}

/* --- threads -------------------------------------------------------------- */

#define NTHREADS 12
#define ROUNDS 20

struct worker {
	struct rmt *r;
	int id;
	atomic_int *errors;
};

/* A mix of name and file calls on names of its own. */
static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char dir[32], file[64], buf[4096], got[4096];
	struct rmt_file *f;
	struct stat st;
	int i;

	snprintf(dir, sizeof(dir), "w%d", w->id);
	snprintf(file, sizeof(file), "w%d/f", w->id);
	memset(buf, 'a' + w->id, sizeof(buf));
	if (rmt_mkdir(w->r, dir, 0755) < 0)
		goto fail;
	for (i = 0; i < ROUNDS; i++) {
		if (rmt_file_open(w->r, file, O_RDWR | O_CREAT, 0644, &f) < 0)
			goto fail;
		if (rmt_file_pwrite(f, buf, sizeof(buf), (off_t)i * 4096) !=
			    (ssize_t)sizeof(buf) ||
		    rmt_file_pread(f, got, sizeof(got), (off_t)i * 4096) !=
			    (ssize_t)sizeof(got) ||
		    memcmp(buf, got, sizeof(buf)) || rmt_file_stat(f, &st) < 0 ||
		    st.st_size != (off_t)(i + 1) * 4096) {
			rmt_file_close(f);
			goto fail;
		}
		if (rmt_file_close(f) < 0 || rmt_stat(w->r, file, &st) < 0)
			goto fail;
	}
	if (rmt_unlink(w->r, file) < 0 || rmt_rmdir(w->r, dir) < 0)
		goto fail;
	return NULL;
fail:
	atomic_fetch_add(w->errors, 1);
	return NULL;
}

/* The point of the pool: many threads, never two in one connection, and
 * all K connections busy at once. */
static void test_pool__never_two_threads_in_a_connection(void **state)
{
	struct fx *fx = *state;
	struct worker w[NTHREADS];
	pthread_t tid[NTHREADS];
	atomic_int errors;
	int i;

	atomic_init(&errors, 0);
	pool_open(fx, 3);
	fk.hold_us = 200;
	for (i = 0; i < NTHREADS; i++) {
		w[i] = (struct worker){ .r = fx->r, .id = i,
					.errors = &errors };
		assert_int_equal(pthread_create(&tid[i], NULL, worker_main,
						&w[i]),
				 0);
	}
	for (i = 0; i < NTHREADS; i++)
		assert_int_equal(pthread_join(tid[i], NULL), 0);
	assert_int_equal(atomic_load(&errors), 0);
	assert_int_equal(atomic_load(&fk.violations), 0);
	/* 12 threads, 3 connections: the pool ran 3 calls at once, no more */
	assert_int_equal(atomic_load(&fk.max_active), 3);
	assert_true(atomic_load(&fk.calls) > NTHREADS * ROUNDS * 5);
	assert_sane_pool(fx->r, 3, NULL);
}

/* Threads hammering ONE file: its calls run one at a time, on its
 * connection, while other threads' name calls use the others. */
struct hammer {
	struct rmt *r;
	struct rmt_file *f;
	int id;
	atomic_int *errors;
};

static void *hammer_main(void *arg)
{
	struct hammer *h = arg;
	char buf[512], got[512];
	struct stat st;
	int i;

	memset(buf, 'A' + h->id, sizeof(buf));
	for (i = 0; i < ROUNDS; i++) {
		off_t off = (off_t)(h->id * ROUNDS + i) * 512;

		if (rmt_file_pwrite(h->f, buf, 512, off) != 512 ||
		    rmt_file_pread(h->f, got, 512, off) != 512 ||
		    memcmp(buf, got, 512) || rmt_stat(h->r, "", &st) < 0)
			atomic_fetch_add(h->errors, 1);
	}
	return NULL;
}

static void test_pool__one_file_many_threads(void **state)
{
	struct fx *fx = *state;
	struct hammer h[8];
	pthread_t tid[8];
	struct rmt_pool_conn c[2];
	atomic_int errors;
	struct stat st;
	int i;

	atomic_init(&errors, 0);
	pool_open(fx, 2);
	fk.hold_us = 100;
	assert_rc_ok(rmt_file_open(fx->r, "shared", O_RDWR | O_CREAT, 0644,
				   &h[0].f));
	for (i = 0; i < 8; i++) {
		h[i] = (struct hammer){ .r = fx->r, .f = h[0].f, .id = i,
					.errors = &errors };
		assert_int_equal(pthread_create(&tid[i], NULL, hammer_main,
						&h[i]),
				 0);
	}
	for (i = 0; i < 8; i++)
		assert_int_equal(pthread_join(tid[i], NULL), 0);
	assert_int_equal(atomic_load(&errors), 0);
	assert_int_equal(atomic_load(&fk.violations), 0);
	assert_rc_ok(rmt_file_stat(h[0].f, &st));
	assert_int_equal(st.st_size, 8 * ROUNDS * 512);
	assert_int_equal(rmt_pool_inspect(fx->r, c, 2), 2);
	assert_int_equal(c[0].nfiles + c[1].nfiles, 1);
	assert_rc_ok(rmt_file_close(h[0].f));
	assert_sane_pool(fx->r, 2, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
		T(test_pool__parse),
		T(test_pool__one_connection_opts),
		T(test_pool__rmt_open_takes_the_option),
		T(test_pool__is_the_same_share),
		T(test_pool__default_connections),
		T(test_pool__open_failure_undoes),
		T(test_pool__files_spread_and_bind),
		T(test_pool__readdir_callback_may_reenter),
		T(test_pool__copy_across_connections),
		T(test_pool__every_name_call),
		T(test_pool__never_two_threads_in_a_connection),
		T(test_pool__one_file_many_threads),
#undef T
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
