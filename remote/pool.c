/*
 * pool.c - the "pool" wrapper: one thread-safe struct rmt over K
 * connections that are not.
 *
 * A driver whose connection may be used by one thread at a time (nfs.c:
 * one libnfs context, one TCP connection) has no RMT_CAP_THREADSAFE.
 * rmt_open() wraps such a driver here: the pool opens K connections
 * (rmt_open option connections=N, default RMT_POOL_DEFAULT) and runs each
 * call on one of them, so up to K calls are on the wire at once, one per
 * connection, like sshfs's "multiple SFTP connections". The pool is what
 * its share is: rmt_id() is the driver's, rmt_caps() the driver's plus
 * RMT_CAP_THREADSAFE.
 *
 * Which connection runs a call:
 *
 *   names (stat, mkdir, readdir, rename, setattr by path, ...):
 *       any free connection (checkout_any(); round robin among the free
 *       ones, so all TCP connections stay warm)
 *   rmt_file_open():
 *       the connection with the fewest open files (pick_for_open()); the
 *       file is BOUND to it for its life, since a driver's file handle
 *       belongs to its connection
 *   every call on a file (pread, pwrite, fsync, close, setattr with f):
 *       the file's connection (checkout()), waiting while it is busy
 *
 * So one struct rmt_file is one stream: calls on it from many threads run
 * one at a time. To move one big file over K streams, open it K times;
 * pick_for_open() puts the K opens on K connections.
 *
 * Connection states (all under p->lock):
 *
 *   free --checkout_any() / checkout()--> busy --checkin()--> free
 *
 * Invariants:
 *  1. A connection is busy while exactly one thread is inside a call of its
 *     driver, and no thread calls into a connection it has not checked out.
 *     That is the whole point: the driver never sees two threads at once.
 *  2. A thread holds at most one connection at a time: no call here checks
 *     out a second one while holding one, so the pool cannot deadlock on
 *     itself (a copy between files bound to two connections is refused
 *     with -EXDEV, and remote.c copies it through pread/pwrite instead).
 *  3. No callback of the caller runs while a connection is held:
 *     pool_readdir() collects the entries first, gives the connection
 *     back, then calls rmt_dirent_fn; so a callback may call the pool.
 *  4. checkout_any() takes a connection only if no thread waits for that
 *     very connection (c->waiting == 0): calls on a bound file are not
 *     starved by calls that could run anywhere.
 *  5. c->nfiles counts the files bound to a connection (an open in
 *     progress counts), so pick_for_open() spreads files evenly.
 *  6. The conns[] array, n, every c->r and the id are set in
 *     rmt_pool_wrap() and never change; only busy, waiting, nfiles and
 *     next do, under p->lock.
 *
 * The pool calls its connections through the public rmt_*() functions
 * (checked again, counted in their own counters, which nobody reads), like
 * throttle.c; the server-side copy is called on the inner table, so that
 * its fallback stays in the outer remote.c.
 *
 * Called only through remote.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "remote_i.h"

struct conn {
	struct rmt *r;        /* immutable; owned */
	bool busy;            /* protected by pool lock */
	unsigned int waiting; /* protected by pool lock: checkout() waiters */
	unsigned int nfiles;  /* protected by pool lock: files bound here */
};

struct pool {
	struct rmt base;     /* first: remote.c sees only this */
	unsigned int n;      /* connections; immutable */
	struct conn *conns;  /* n of them; the array is immutable */
	pthread_mutex_t lock;
	pthread_cond_t freed; /* broadcast by checkin() */
	unsigned int next;   /* protected by lock: round-robin start */
};

struct pfile {
	struct rmt_file base; /* first */
	struct rmt_file *inner;
	unsigned int idx;     /* the connection it is bound to; immutable */
};

static struct pool *to_pool(struct rmt *r)
{
	return (struct pool *)r;
}

static struct pfile *to_pfile(struct rmt_file *f)
{
	return (struct pfile *)f;
}

static const struct pfile *to_cpfile(const struct rmt_file *f)
{
	return (const struct pfile *)f;
}

/* --- checkout and checkin ---------------------------------------------- */

/* A free connection nobody waits for (invariant 4), marked busy. */
static unsigned int checkout_any(struct pool *p)
{
	unsigned int i, k;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		for (k = 0; k < p->n; k++) {
			i = (p->next + k) % p->n;
			if (!p->conns[i].busy && !p->conns[i].waiting)
				goto found;
		}
		pthread_cond_wait(&p->freed, &p->lock);
	}
found:
	p->conns[i].busy = true;
	p->next = (i + 1) % p->n;
	pthread_mutex_unlock(&p->lock);
	return i;
}

/* Connection i, marked busy; waits while another thread has it. */
static void checkout(struct pool *p, unsigned int i)
{
	struct conn *c = &p->conns[i];

	pthread_mutex_lock(&p->lock);
	if (c->busy) {
		c->waiting++;
		while (c->busy)
			pthread_cond_wait(&p->freed, &p->lock);
		c->waiting--;
	}
	c->busy = true;
	pthread_mutex_unlock(&p->lock);
}

static void checkin(struct pool *p, unsigned int i)
{
	pthread_mutex_lock(&p->lock);
	p->conns[i].busy = false;
	/* waiters for "any" and for this one share the condvar: wake all */
	pthread_cond_broadcast(&p->freed);
	pthread_mutex_unlock(&p->lock);
}

/* The connection a new file goes to: fewest files, a free one among those
 * if any; its nfiles is counted now (invariant 5). */
static unsigned int pick_for_open(struct pool *p)
{
	unsigned int i, k, best = p->n;

	pthread_mutex_lock(&p->lock);
	for (k = 0; k < p->n; k++) {
		struct conn *c;

		i = (p->next + k) % p->n;
		c = &p->conns[i];
		if (best == p->n || c->nfiles < p->conns[best].nfiles ||
		    (c->nfiles == p->conns[best].nfiles &&
		     p->conns[best].busy && !c->busy))
			best = i;
	}
	p->conns[best].nfiles++;
	p->next = (best + 1) % p->n;
	pthread_mutex_unlock(&p->lock);
	return best;
}

static void unbind(struct pool *p, unsigned int i)
{
	pthread_mutex_lock(&p->lock);
	p->conns[i].nfiles--;
	pthread_mutex_unlock(&p->lock);
}

/* Run one name call on any free connection: `rc = call` with `r` bound. */
#define ON_ANY(p, rc, call)                                \
	do {                                               \
		unsigned int i_ = checkout_any(p);         \
		struct rmt *r_ = (p)->conns[i_].r;         \
		rc = call;                                 \
		checkin(p, i_);                            \
	} while (0)

/* Run one call on the connection of file f. */
#define ON_FILE(f, rc, call)                                 \
	do {                                                 \
		struct pool *p_ = to_pool((f)->r);           \
		unsigned int i_ = to_pfile(f)->idx;          \
		checkout(p_, i_);                            \
		rc = call;                                   \
		checkin(p_, i_);                             \
	} while (0)

#define IN(f) (to_pfile(f)->inner)

/* --- options ----------------------------------------------------------- */

/* "connections=N" with N in 1..RMT_POOL_MAX, digits only. */
static int parse_count(const char *v, unsigned int *n)
{
	unsigned long x = 0;
	const char *s;

	if (!*v)
		return -EINVAL;
	for (s = v; *s; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		x = x * 10 + (unsigned long)(*s - '0');
		if (x > RMT_POOL_MAX)
			return -EINVAL;
	}
	if (x < 1)
		return -EINVAL;
	*n = (unsigned int)x;
	return 0;
}

static int take_connections(const char *item, size_t klen,
			    const char *value, void *arg)
{
	static const char key[] = "connections";
	unsigned int *n = arg;
	int rc;

	if (klen != sizeof(key) - 1 || strncmp(item, key, klen))
		return 0;
	rc = value ? parse_count(value, n) : -EINVAL;
	if (rc < 0) {
		LOG_ERR("invalid remote option '%s': want a number of connections from 1 to %d",
			item, RMT_POOL_MAX);
		return rc;
	}
	return 1;
}

int rmt_pool_parse(const char *opts, unsigned int *n, char **rest)
{
	int rc;

	*n = 0;
	rc = rmt_opts_split(opts, take_connections, n, rest);
	if (rc < 0)
		*n = 0;
	return rc;
}

/* --- the share --------------------------------------------------------- */

static const struct rmt_ops pool_ops;

int rmt_pool_wrap(struct rmt *first, rmt_open_fn drv, const char *spec,
		  const char *opts, unsigned int n, struct rmt **out)
{
	struct pool *p;
	unsigned int i;
	int rc;

	*out = NULL;
	if (n == 0)
		n = RMT_POOL_DEFAULT;
	if (n > RMT_POOL_MAX)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->conns = calloc(n, sizeof(*p->conns));
	p->base.id = strdup(rmt_id(first));
	if (!p->conns || !p->base.id) {
		rc = -ENOMEM;
		goto out_p;
	}
	rc = -pthread_mutex_init(&p->lock, NULL);
	if (rc < 0)
		goto out_p;
	rc = -pthread_cond_init(&p->freed, NULL);
	if (rc < 0)
		goto out_lock;
	p->conns[0].r = first;
	/* one after another: libnfs 4.0 context creation is not thread-safe */
	for (i = 1; i < n; i++) {
		rc = rmt_driver_open(drv, spec, opts, &p->conns[i].r);
		if (rc < 0) {
			LOG_ERR("cannot open connection %u of %u to '%s': %s",
				i + 1, n, rmt_id(first), strerror(-rc));
			goto out_conns;
		}
	}
	p->n = n;
	p->base.ops = &pool_ops;
	p->base.caps = (rmt_caps(first) | RMT_CAP_THREADSAFE) &
		      ~(unsigned int)(RMT_CAP_PUT | RMT_CAP_BATCH);
	LOG_DBG("remote '%s': %u connections", p->base.id, n);
	*out = &p->base;
	return 0;

out_conns:
	while (--i > 0)
		rmt_close(p->conns[i].r);
	pthread_cond_destroy(&p->freed);
out_lock:
	pthread_mutex_destroy(&p->lock);
out_p:
	free(p->base.id);
	free(p->conns);
	free(p);
	return rc;
}

unsigned int rmt_pool_inspect(struct rmt *r, struct rmt_pool_conn *out,
			      unsigned int max)
{
	struct pool *p = to_pool(r);
	unsigned int i;

	if (r->ops != &pool_ops)
		return 0;
	pthread_mutex_lock(&p->lock);
	for (i = 0; i < p->n && i < max; i++) {
		out[i].busy = p->conns[i].busy;
		out[i].waiting = p->conns[i].waiting;
		out[i].nfiles = p->conns[i].nfiles;
	}
	pthread_mutex_unlock(&p->lock);
	return p->n;
}

/* remote.c frees r->id after this; every file is closed (remote.h). */
static void pool_close(struct rmt *r)
{
	struct pool *p = to_pool(r);
	unsigned int i;

	for (i = 0; i < p->n; i++) {
		if (p->conns[i].busy || p->conns[i].nfiles)
			BUG("pool closed with connection %u busy or with open files",
			    i);
		rmt_close(p->conns[i].r);
	}
	pthread_cond_destroy(&p->freed);
	pthread_mutex_destroy(&p->lock);
	free(p->conns);
	free(p);
}

static int pool_statfs(struct rmt *r, struct statvfs *sv)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_statfs(r_, sv));
	return rc;
}

/* --- names ------------------------------------------------------------- */

static int pool_name_check(struct rmt *r, const char *name)
{
	return rmt_name_check(to_pool(r)->conns[0].r, name); /* no I/O */
}

static int pool_stat(struct rmt *r, const char *path, struct stat *st)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_stat(r_, path, st));
	return rc;
}

/* Invariant 3: the listing is collected, the connection given back, then
 * the caller's callback runs. */
static int pool_readdir(struct rmt *r, const char *path, rmt_dirent_fn fn,
			void *arg)
{
	struct rmt_listing l = { 0 };
	size_t i;
	int rc;

	ON_ANY(to_pool(r), rc, rmt_list(r_, path, &l));
	for (i = 0; rc == 0 && i < l.n; i++)
		rc = fn(l.e[i].name, l.e[i].have_st ? &l.e[i].st : NULL, arg);
	rmt_listing_release(&l);
	return rc;
}

static int pool_mkdir(struct rmt *r, const char *path, mode_t mode)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_mkdir(r_, path, mode));
	return rc;
}

static int pool_rmdir(struct rmt *r, const char *path)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_rmdir(r_, path));
	return rc;
}

static int pool_unlink(struct rmt *r, const char *path)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_unlink(r_, path));
	return rc;
}

static int pool_mknod(struct rmt *r, const char *path, mode_t mode,
		      dev_t rdev)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_mknod(r_, path, mode, rdev));
	return rc;
}

static int pool_symlink(struct rmt *r, const char *target, const char *path)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_symlink(r_, target, path));
	return rc;
}

static int pool_readlink(struct rmt *r, const char *path, char *buf,
			 size_t size)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_readlink(r_, path, buf, size));
	return rc;
}

static int pool_link(struct rmt *r, const char *from, const char *to)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_link(r_, from, to));
	return rc;
}

static int pool_rename(struct rmt *r, const char *from, const char *to,
		       unsigned int flags)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_rename(r_, from, to, flags));
	return rc;
}

static int pool_setattr(struct rmt *r, const char *path, struct rmt_file *f,
			const struct rmt_setattr *sa)
{
	struct pool *p = to_pool(r);
	int rc;

	if (f) {
		ON_FILE(f, rc,
			rmt_setattr(p->conns[to_pfile(f)->idx].r, path, IN(f),
				    sa));
		return rc;
	}
	ON_ANY(p, rc, rmt_setattr(r_, path, NULL, sa));
	return rc;
}

static ssize_t pool_getxattr(struct rmt *r, const char *path,
			     const char *name, void *buf, size_t size)
{
	ssize_t rc;

	ON_ANY(to_pool(r), rc, rmt_getxattr(r_, path, name, buf, size));
	return rc;
}

static int pool_setxattr(struct rmt *r, const char *path, const char *name,
			 const void *value, size_t size, int flags)
{
	int rc;

	ON_ANY(to_pool(r), rc,
	       rmt_setxattr(r_, path, name, value, size, flags));
	return rc;
}

static ssize_t pool_listxattr(struct rmt *r, const char *path, char *buf,
			      size_t size)
{
	ssize_t rc;

	ON_ANY(to_pool(r), rc, rmt_listxattr(r_, path, buf, size));
	return rc;
}

static int pool_removexattr(struct rmt *r, const char *path,
			    const char *name)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_removexattr(r_, path, name));
	return rc;
}

static int pool_syncdir(struct rmt *r, const char *path)
{
	int rc;

	ON_ANY(to_pool(r), rc, rmt_syncdir(r_, path));
	return rc;
}

/* --- files ------------------------------------------------------------- */

static int pool_file_open(struct rmt *r, const char *path, int flags,
			  mode_t mode, struct rmt_file **out)
{
	struct pool *p = to_pool(r);
	struct pfile *pf;
	unsigned int i;
	int rc;

	/* before the open: an O_EXCL create must not be undone by ENOMEM */
	pf = calloc(1, sizeof(*pf));
	if (!pf)
		return -ENOMEM;
	i = pick_for_open(p);
	checkout(p, i);
	rc = rmt_file_open(p->conns[i].r, path, flags, mode, &pf->inner);
	checkin(p, i);
	if (rc < 0) {
		unbind(p, i);
		free(pf);
		return rc;
	}
	pf->base.r = r;
	pf->idx = i;
	*out = &pf->base;
	return 0;
}

static int pool_file_close(struct rmt_file *f)
{
	struct pool *p = to_pool(f->r);
	unsigned int i = to_pfile(f)->idx;
	int rc;

	ON_FILE(f, rc, rmt_file_close(IN(f)));
	unbind(p, i);
	free(to_pfile(f));
	return rc;
}

static ssize_t pool_file_pread(struct rmt_file *f, void *buf, size_t len,
			       off_t off)
{
	ssize_t rc;

	ON_FILE(f, rc, rmt_file_pread(IN(f), buf, len, off));
	return rc;
}

static ssize_t pool_file_pwrite(struct rmt_file *f, const void *buf,
				size_t len, off_t off)
{
	ssize_t rc;

	ON_FILE(f, rc, rmt_file_pwrite(IN(f), buf, len, off));
	return rc;
}

static int pool_file_stat(struct rmt_file *f, struct stat *st)
{
	int rc;

	ON_FILE(f, rc, rmt_file_stat(IN(f), st));
	return rc;
}

static int pool_file_fsync(struct rmt_file *f, bool datasync)
{
	int rc;

	ON_FILE(f, rc, rmt_file_fsync(IN(f), datasync));
	return rc;
}

static int pool_file_flush(struct rmt_file *f)
{
	int rc;

	ON_FILE(f, rc, rmt_file_flush(IN(f)));
	return rc;
}

static int pool_file_fallocate(struct rmt_file *f, int mode, off_t off,
			       off_t len)
{
	int rc;

	ON_FILE(f, rc, rmt_file_fallocate(IN(f), mode, off, len));
	return rc;
}

static off_t pool_file_seek(struct rmt_file *f, off_t off, int whence)
{
	off_t rc;

	ON_FILE(f, rc, rmt_file_seek(IN(f), off, whence));
	return rc;
}

/*
 * The driver's server-side copy, when both files are bound to one
 * connection; else -EXDEV (invariant 2), and remote.c copies through
 * pool_file_pread/pool_file_pwrite, each on its own file's connection.
 */
static ssize_t pool_file_copy(struct rmt_file *in, off_t off_in,
			      struct rmt_file *out, off_t off_out, size_t len)
{
	struct pool *p = to_pool(in->r);
	unsigned int i = to_pfile(in)->idx;
	ssize_t (*copy)(struct rmt_file *, off_t, struct rmt_file *, off_t,
			size_t) = p->conns[i].r->ops->file_copy;
	ssize_t rc;

	if (!copy)
		return -EOPNOTSUPP;
	if (to_pfile(out)->idx != i)
		return -EXDEV;
	ON_FILE(in, rc, copy(IN(in), off_in, IN(out), off_out, len));
	return rc;
}

/* A kernel fd is thread-safe by itself: no connection is held for it. */
static int pool_file_fd(const struct rmt_file *f)
{
	return rmt_file_fd(to_cpfile(f)->inner);
}

static const struct rmt_ops pool_ops = {
	.name = "pool",
	.close = pool_close,
	.stat = pool_stat,
	.statfs = pool_statfs,
	.name_check = pool_name_check,
	.readdir = pool_readdir,
	.mkdir = pool_mkdir,
	.rmdir = pool_rmdir,
	.unlink = pool_unlink,
	.mknod = pool_mknod,
	.symlink = pool_symlink,
	.readlink = pool_readlink,
	.link = pool_link,
	.rename = pool_rename,
	.setattr = pool_setattr,
	.getxattr = pool_getxattr,
	.setxattr = pool_setxattr,
	.listxattr = pool_listxattr,
	.removexattr = pool_removexattr,
	.file_open = pool_file_open,
	.file_close = pool_file_close,
	.file_pread = pool_file_pread,
	.file_pwrite = pool_file_pwrite,
	.file_stat = pool_file_stat,
	.file_fsync = pool_file_fsync,
	.file_fallocate = pool_file_fallocate,
	.file_seek = pool_file_seek,
	.file_copy = pool_file_copy,
	.file_fd = pool_file_fd,
	.file_flush = pool_file_flush,
	.syncdir = pool_syncdir,
};
