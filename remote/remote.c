/*
 * remote.c - the remote interface: path checks and dispatch to the driver.
 *
 * Invariants:
 *  1. No path reaches a driver unless rmt_path_check() accepted it; the root
 *     is "". So a driver never sees "..", "." or an absolute path.
 *  2. Drivers return -errno; nothing here rewrites their errors.
 *  3. Every call that reaches a driver is counted here (r->cnt, relaxed
 *     atomics: rmt_counters()), with the bytes it moved; nothing else
 *     writes r->cnt but rmt_count_fault().
 *
 * rmt_open() takes its own options (remote_rate, remote_stream_rate,
 * remote_latency, remote_fault: throttle.c parses them; connections:
 * pool.c) out of the option string, picks the driver by the spec's scheme
 * (none: path, "nfs://": nfs, "smb://": smb), opens it with the rest,
 * wraps it in the pool if its connections are not thread-safe, and wraps
 * that in the throttle driver if any throttle option was given:
 *
 *   caller -> [throttle] -> [pool -> K connections] -> driver
 *
 * so every struct rmt it returns is RMT_CAP_THREADSAFE.
 *
 * Callers: fs/ today; journal/ and cache/ later (see remote.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote_i.h"

static void count(atomic_uint_least64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* one call that reaches the driver */
#define OP(r) count(&(r)->cnt.ops, 1)

static void counters_init(struct rmt *r)
{
	atomic_init(&r->cnt.bytes_read, 0);
	atomic_init(&r->cnt.bytes_written, 0);
	atomic_init(&r->cnt.bytes_copied, 0);
	atomic_init(&r->cnt.ops, 0);
	atomic_init(&r->cnt.faults, 0);
}

int rmt_path_check(const char *path)
{
	const char *p = path;
	size_t len;

	if (!path)
		return -EINVAL;
	len = strlen(path);
	if (len == 0)
		return 0;
	if (len >= PATH_MAX)
		return -ENAMETOOLONG;
	for (;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);

		if (n == 0)
			return -EINVAL; /* leading, trailing or double '/' */
		if (n > NAME_MAX)
			return -ENAMETOOLONG;
		if ((n == 1 && p[0] == '.') ||
		    (n == 2 && p[0] == '.' && p[1] == '.'))
			return -EINVAL;
		if (!slash)
			return 0;
		p = slash + 1;
	}
}

int rmt_driver_open(rmt_open_fn drv, const char *spec, const char *opts,
		    struct rmt **out)
{
	int rc = drv(spec, opts, out);

	if (rc == 0)
		counters_init(*out);
	return rc;
}

/* The driver of a spec: a scheme ("xyz://") names it, else a directory. */
static int driver_of(const char *spec, rmt_open_fn *drv)
{
	size_t n = strspn(spec, "abcdefghijklmnopqrstuvwxyz");

	*drv = rmt_path_open;
	if (n == 0 || strncmp(spec + n, "://", 3))
		return 0;
	if (n == 3 && !strncmp(spec, "nfs", 3)) {
		*drv = rmt_nfs_open;
		return 0;
	}
	if (n == 3 && !strncmp(spec, "smb", 3)) {
		*drv = rmt_smb_open;
		return 0;
	}
	if (n == 5 && !strncmp(spec, "agent", 5)) {
		*drv = rmt_agent_open;
		return 0;
	}
	return -EPROTONOSUPPORT;
}

int rmt_opts_one_connection(const char *opts, char **out)
{
	bool any = opts && *opts;

	if (asprintf(out, "%s%sconnections=1", any ? opts : "",
		     any ? "," : "") < 0) {
		*out = NULL;
		return -ENOMEM;
	}
	return 0;
}

int rmt_opts_split(const char *opts, rmt_opt_fn fn, void *arg, char **rest)
{
	char *buf, *item, *next, *out;
	size_t olen = 0;
	bool took = false;
	int rc = 0;

	*rest = NULL;
	if (!opts || !*opts)
		return 0;
	buf = strdup(opts);
	out = malloc(strlen(opts) + 1);
	if (!buf || !out) {
		rc = -ENOMEM;
		goto out_free;
	}
	out[0] = '\0';
	for (item = buf; item; item = next) {
		char *comma = strchr(item, ','), *eq;

		next = NULL;
		if (comma) {
			*comma = '\0';
			next = comma + 1;
		}
		if (!*item)
			continue;
		eq = strchr(item, '=');
		rc = fn(item, eq ? (size_t)(eq - item) : strlen(item),
			eq ? eq + 1 : NULL, arg);
		if (rc < 0)
			goto out_free;
		if (rc > 0) {
			took = true;
			continue;
		}
		/* not the caller's: passed on as it was */
		if (olen)
			out[olen++] = ',';
		strcpy(out + olen, item);
		olen += strlen(item);
	}
	rc = 0;
	if (took) {
		*rest = out;
		out = NULL;
	}
out_free:
	free(out);
	free(buf);
	return rc;
}

int rmt_open(const char *spec, const char *opts, struct rmt **out)
{
	struct rmt_throttle_opts topts;
	char *rest, *prest = NULL;
	unsigned int nconn;
	struct rmt *r, *w;
	rmt_open_fn drv;
	const char *o;
	int rc;

	*out = NULL;
	if (!spec || !*spec)
		return -EINVAL;
	rc = driver_of(spec, &drv);
	if (rc < 0)
		return rc;
	rc = rmt_throttle_parse(opts, &topts, &rest);
	if (rc < 0)
		return rc;
	o = topts.any ? rest : opts;
	rc = rmt_pool_parse(o, &nconn, &prest);
	if (rc < 0)
		goto out_rest;
	if (prest)
		o = prest;
	rc = rmt_driver_open(drv, spec, o, &r);
	if (rc < 0)
		goto out_rest;
	/* connections=N of a thread-safe driver: nothing to pool, ignored */
	if (!(r->caps & RMT_CAP_THREADSAFE)) {
		rc = rmt_pool_wrap(r, drv, spec, o, nconn, &w);
		if (rc < 0) {
			rmt_close(r);
			goto out_rest;
		}
		r = w;
		counters_init(r);
	}
	if (topts.any) {
		rc = rmt_throttle_wrap(r, &topts, &w);
		if (rc < 0) {
			rmt_close(r);
			goto out_rest;
		}
		r = w;
		counters_init(r);
	}
	*out = r;
out_rest:
	free(prest);
	free(rest);
	rmt_throttle_opts_release(&topts);
	return rc;
}

void rmt_counters(const struct rmt *r, struct rmt_counters *out)
{
	const struct rmt_cnt *c = &r->cnt;

	out->bytes_read = atomic_load_explicit(&c->bytes_read,
					       memory_order_relaxed);
	out->bytes_written = atomic_load_explicit(&c->bytes_written,
						  memory_order_relaxed);
	out->bytes_copied = atomic_load_explicit(&c->bytes_copied,
						 memory_order_relaxed);
	out->ops = atomic_load_explicit(&c->ops, memory_order_relaxed);
	out->faults = atomic_load_explicit(&c->faults, memory_order_relaxed);
}

void rmt_file_count_read(struct rmt_file *f, uint64_t n)
{
	atomic_fetch_add_explicit(&f->r->cnt.bytes_read, n,
				  memory_order_relaxed);
}

void rmt_file_count_write(struct rmt_file *f, uint64_t n)
{
	atomic_fetch_add_explicit(&f->r->cnt.bytes_written, n,
				  memory_order_relaxed);
}

void rmt_count_fault(struct rmt *r)
{
	count(&r->cnt.faults, 1);
}

void rmt_close(struct rmt *r)
{
	char *id;

	if (!r)
		return;
	id = r->id;
	r->ops->close(r);
	free(id);
}

unsigned int rmt_caps(const struct rmt *r)
{
	return r->caps;
}

const char *rmt_id(const struct rmt *r)
{
	return r->id;
}

/* Set while rmt_marker_*() calls through the public functions (the
 * decorators pass a call on in the same thread): RMT_RESERVED may be
 * reached then only. */
static _Thread_local bool marker_call;

static bool reserved(const char *path)
{
	size_t n = sizeof(RMT_RESERVED) - 1;

	return !marker_call && !strncmp(path, RMT_RESERVED, n) &&
	       (path[n] == 0 || path[n] == '/');
}

/* A path to look at or remove: a reserved one is not there. */
#define CHECK(path)                                   \
	do {                                          \
		int check_rc_ = rmt_path_check(path); \
		if (check_rc_ < 0)                    \
			return check_rc_;             \
		if (reserved(path))                   \
			return -ENOENT;               \
	} while (0)

/* A path to make: a reserved one is refused. */
#define CHECK_NEW(path)                               \
	do {                                          \
		int check_rc_ = rmt_path_check(path); \
		if (check_rc_ < 0)                    \
			return check_rc_;             \
		if (reserved(path))                   \
			return -EPERM;                \
	} while (0)

int rmt_stat(struct rmt *r, const char *path, struct stat *st)
{
	CHECK(path);
	OP(r);
	return r->ops->stat(r, path, st);
}

int rmt_name_check(struct rmt *r, const char *name)
{
	return r->ops->name_check ? r->ops->name_check(r, name) : 0;
}

int rmt_statfs(struct rmt *r, struct statvfs *sv)
{
	OP(r);
	return r->ops->statfs(r, sv);
}

struct hide {
	rmt_dirent_fn fn;
	void *arg;
};

static int hide_reserved(const char *name, const struct stat *st, void *arg)
{
	const struct hide *h = arg;

	return strcmp(name, RMT_RESERVED) ? h->fn(name, st, h->arg) : 0;
}

int rmt_readdir(struct rmt *r, const char *path, rmt_dirent_fn fn, void *arg)
{
	struct hide h = { fn, arg };

	CHECK(path);
	OP(r);
	if (!*path && !marker_call)
		return r->ops->readdir(r, path, hide_reserved, &h);
	return r->ops->readdir(r, path, fn, arg);
}

static void listing_clear(struct rmt_listing *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		free(l->e[i].name);
	l->n = 0;
}

static int listing_add(const char *name, const struct stat *st, void *arg)
{
	struct rmt_listing *l = arg;
	struct rmt_dirent *e;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct rmt_dirent *ne = realloc(l->e, cap * sizeof(*ne));

		if (!ne)
			return -ENOMEM;
		l->e = ne;
		l->cap = cap;
	}
	e = &l->e[l->n];
	e->name = strdup(name);
	if (!e->name)
		return -ENOMEM;
	e->have_st = st != NULL;
	if (st)
		e->st = *st;
	l->n++;
	return 0;
}

int rmt_list(struct rmt *r, const char *path, struct rmt_listing *l)
{
	listing_clear(l);
	return rmt_readdir(r, path, listing_add, l);
}

void rmt_listing_release(struct rmt_listing *l)
{
	listing_clear(l);
	free(l->e);
	l->e = NULL;
	l->cap = 0;
}

int rmt_mkdir(struct rmt *r, const char *path, mode_t mode)
{
	CHECK_NEW(path);
	if (!*path)
		return -EEXIST;
	OP(r);
	return r->ops->mkdir(r, path, mode);
}

int rmt_syncdir(struct rmt *r, const char *path)
{
	CHECK(path);
	if (!r->ops->syncdir)
		return 0;
	OP(r);
	return r->ops->syncdir(r, path);
}

int rmt_rmdir(struct rmt *r, const char *path)
{
	CHECK(path);
	if (!*path)
		return -EBUSY;
	OP(r);
	return r->ops->rmdir(r, path);
}

int rmt_unlink(struct rmt *r, const char *path)
{
	CHECK(path);
	if (!*path)
		return -EISDIR;
	OP(r);
	return r->ops->unlink(r, path);
}

int rmt_mknod(struct rmt *r, const char *path, mode_t mode, dev_t rdev)
{
	CHECK_NEW(path);
	if (!*path)
		return -EEXIST;
	if (!S_ISFIFO(mode) && !S_ISSOCK(mode))
		return -EPERM;
	OP(r);
	return r->ops->mknod(r, path, mode, rdev);
}

int rmt_symlink(struct rmt *r, const char *target, const char *path)
{
	CHECK_NEW(path);
	if (!*path)
		return -EEXIST;
	if (!target || !*target)
		return -ENOENT;
	OP(r);
	return r->ops->symlink(r, target, path);
}

int rmt_readlink(struct rmt *r, const char *path, char *buf, size_t size)
{
	CHECK(path);
	if (size == 0)
		return -EINVAL;
	OP(r);
	return r->ops->readlink(r, path, buf, size);
}

int rmt_link(struct rmt *r, const char *from, const char *to)
{
	CHECK(from);
	CHECK_NEW(to);
	if (!*to)
		return -EEXIST;
	if (!*from)
		return -EPERM;
	OP(r);
	return r->ops->link(r, from, to);
}

int rmt_rename(struct rmt *r, const char *from, const char *to,
	       unsigned int flags)
{
	CHECK(from);
	CHECK_NEW(to);
	if (!*from || !*to)
		return -EBUSY;
	if (flags & ~(unsigned int)(RMT_RENAME_NOREPLACE | RMT_RENAME_EXCHANGE))
		return -EINVAL;
	if ((flags & RMT_RENAME_NOREPLACE) && (flags & RMT_RENAME_EXCHANGE))
		return -EINVAL;
	OP(r);
	return r->ops->rename(r, from, to, flags);
}

int rmt_setattr(struct rmt *r, const char *path, struct rmt_file *f,
		const struct rmt_setattr *sa)
{
	if (f && f->r != r)
		return -EINVAL;
	if (!f)
		CHECK(path);
	else if (path)
		CHECK(path);
	OP(r);
	return r->ops->setattr(r, path, f, sa);
}

ssize_t rmt_getxattr(struct rmt *r, const char *path, const char *name,
		     void *buf, size_t size)
{
	CHECK(path);
	if (!(r->caps & RMT_CAP_XATTR))
		return -EOPNOTSUPP;
	OP(r);
	return r->ops->getxattr(r, path, name, buf, size);
}

int rmt_setxattr(struct rmt *r, const char *path, const char *name,
		 const void *value, size_t size, int flags)
{
	CHECK(path);
	if (!(r->caps & RMT_CAP_XATTR))
		return -EOPNOTSUPP;
	OP(r);
	return r->ops->setxattr(r, path, name, value, size, flags);
}

ssize_t rmt_listxattr(struct rmt *r, const char *path, char *buf, size_t size)
{
	CHECK(path);
	if (!(r->caps & RMT_CAP_XATTR))
		return 0;
	OP(r);
	return r->ops->listxattr(r, path, buf, size);
}

int rmt_removexattr(struct rmt *r, const char *path, const char *name)
{
	CHECK(path);
	if (!(r->caps & RMT_CAP_XATTR))
		return -EOPNOTSUPP;
	OP(r);
	return r->ops->removexattr(r, path, name);
}

int rmt_file_open(struct rmt *r, const char *path, int flags, mode_t mode,
		  struct rmt_file **out)
{
	*out = NULL;
	if (flags & O_CREAT)
		CHECK_NEW(path);
	else
		CHECK(path);
	if (!*path)
		return -EISDIR;
	OP(r);
	return r->ops->file_open(r, path, flags, mode, out);
}

ssize_t rmt_marker_get(struct rmt *r, const char *name, char *buf,
		       size_t size)
{
	char path[NAME_MAX + sizeof(RMT_RESERVED) + 2];
	struct rmt_file *f;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/%s", RMT_RESERVED, name);
	marker_call = true;
	n = rmt_file_open(r, path, O_RDONLY, 0, &f);
	if (!n) {
		n = rmt_file_pread_all(f, buf, size, 0);
		rmt_file_close(f);
	}
	marker_call = false;
	return n;
}

int rmt_marker_put(struct rmt *r, const char *name, const char *text)
{
	char path[NAME_MAX + sizeof(RMT_RESERVED) + 2];
	size_t len = strlen(text);
	struct rmt_file *f;
	ssize_t n;
	int rc, rc2;

	snprintf(path, sizeof(path), "%s/%s", RMT_RESERVED, name);
	marker_call = true;
	rc = rmt_mkdir(r, RMT_RESERVED, 0755);
	if (rc == -EEXIST)
		rc = 0;
	if (!rc)
		rc = rmt_file_open(r, path, O_WRONLY | O_CREAT | O_TRUNC, 0644,
				   &f);
	if (!rc) {
		n = rmt_file_pwrite(f, text, len, 0);
		rc = n < 0 ? (int)n : (size_t)n != len ? -EIO : 0;
		if (!rc)
			rc = rmt_file_fsync(f, false);
		rc2 = rmt_file_close(f);
		if (!rc)
			rc = rc2;
	}
	if (!rc)
		rc = rmt_syncdir(r, RMT_RESERVED);
	if (!rc)
		rc = rmt_syncdir(r, "");
	marker_call = false;
	return rc;
}

int rmt_file_close(struct rmt_file *f)
{
	if (!f)
		return 0;
	OP(f->r);
	return f->r->ops->file_close(f);
}

ssize_t rmt_file_pread(struct rmt_file *f, void *buf, size_t len, off_t off)
{
	struct rmt *r = f->r;
	ssize_t n;

	OP(r);
	n = r->ops->file_pread(f, buf, len, off);
	if (n > 0)
		count(&r->cnt.bytes_read, (uint64_t)n);
	return n;
}

ssize_t rmt_file_pread_all(struct rmt_file *f, void *buf, size_t len,
			   off_t off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = rmt_file_pread(f, (char *)buf + got, len - got,
					   off + (off_t)got);

		if (n < 0)
			return n;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

ssize_t rmt_file_pwrite(struct rmt_file *f, const void *buf, size_t len,
			off_t off)
{
	struct rmt *r = f->r;
	ssize_t n;

	OP(r);
	n = r->ops->file_pwrite(f, buf, len, off);
	if (n > 0)
		count(&r->cnt.bytes_written, (uint64_t)n);
	return n;
}

int rmt_file_stat(struct rmt_file *f, struct stat *st)
{
	OP(f->r);
	return f->r->ops->file_stat(f, st);
}

int rmt_file_fsync(struct rmt_file *f, bool datasync)
{
	OP(f->r);
	return f->r->ops->file_fsync(f, datasync);
}

int rmt_file_flush(struct rmt_file *f)
{
	if (!f->r->ops->file_flush)
		return 0;
	OP(f->r);
	return f->r->ops->file_flush(f);
}

int rmt_file_fallocate(struct rmt_file *f, int mode, off_t off, off_t len)
{
	OP(f->r);
	if (!f->r->ops->file_fallocate)
		return -EOPNOTSUPP;
	return f->r->ops->file_fallocate(f, mode, off, len);
}

/* A driver that cannot tell holes (file_seek NULL): all of a file is
 * data. */
static off_t seek_all_data(struct rmt_file *f, off_t off, int whence)
{
	struct stat st;
	int rc;

	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return -EINVAL;
	if (off < 0)
		return -ENXIO;
	rc = f->r->ops->file_stat(f, &st);
	if (rc < 0)
		return rc;
	if (off >= st.st_size)
		return -ENXIO;
	return whence == SEEK_DATA ? off : st.st_size;
}

off_t rmt_file_seek(struct rmt_file *f, off_t off, int whence)
{
	OP(f->r);
	if (!f->r->ops->file_seek)
		return seek_all_data(f, off, whence);
	return f->r->ops->file_seek(f, off, whence);
}

/* The generic copy: read and write through a bounce buffer. An error after
 * partial progress is returned as the error: a short count means EOF. */
static ssize_t copy_by_rw(struct rmt_file *in, off_t off_in,
			  struct rmt_file *out, off_t off_out, size_t len)
{
	size_t bufsz = len < (1u << 20) ? len : (1u << 20);
	size_t done = 0;
	ssize_t rc = 0;
	char *buf;

	if (len == 0)
		return 0;
	buf = malloc(bufsz);
	if (!buf)
		return -ENOMEM;
	while (done < len) {
		size_t want = len - done < bufsz ? len - done : bufsz;
		ssize_t n = rmt_file_pread(in, buf, want, off_in + (off_t)done);

		if (n <= 0) {
			rc = n;
			break;
		}
		rc = rmt_file_pwrite(out, buf, (size_t)n, off_out + (off_t)done);
		if (rc < 0)
			break;
		done += (size_t)n;
	}
	free(buf);
	return rc < 0 ? rc : (ssize_t)done;
}

ssize_t rmt_file_copy(struct rmt_file *in, off_t off_in, struct rmt_file *out,
		      off_t off_out, size_t len)
{
	if (in->r != out->r)
		return -EXDEV;
	if (off_in < 0 || off_out < 0)
		return -EINVAL;
	/* overlapping ranges of one file: refused, as copy_file_range(2)
	 * does (a forward copy would corrupt them) */
	if (in == out && (size_t)(off_in > off_out ? off_in - off_out
						   : off_out - off_in) < len)
		return -EINVAL;
	if (in->r->ops->file_copy) {
		ssize_t n;

		OP(in->r);
		n = in->r->ops->file_copy(in, off_in, out, off_out, len);
		if (n > 0)
			count(&in->r->cnt.bytes_copied, (uint64_t)n);
		if (n != -EOPNOTSUPP && n != -EXDEV && n != -ENOSYS &&
		    n != -EINVAL)
			return n;
	}
	return copy_by_rw(in, off_in, out, off_out, len);
}

ssize_t rmt_file_put(struct rmt_file *f, const void *buf, size_t len,
		     off_t off, const unsigned char sha[32])
{
	struct rmt *r = f->r;
	ssize_t n;

	if (!(r->caps & RMT_CAP_PUT) || !r->ops->file_put)
		return -EOPNOTSUPP;
	OP(r);
	n = r->ops->file_put(f, buf, len, off, sha);
	if (n > 0)
		count(&r->cnt.bytes_written, (uint64_t)n);
	return n;
}

ssize_t rmt_put_path(struct rmt *r, const char *path, const void *buf,
		     size_t len, off_t off, const unsigned char sha[32])
{
	ssize_t n;

	CHECK(path);
	if (!(r->caps & RMT_CAP_PUT) || !r->ops->put_path)
		return -EOPNOTSUPP;
	OP(r);
	n = r->ops->put_path(r, path, buf, len, off, sha);
	if (n > 0)
		count(&r->cnt.bytes_written, (uint64_t)n);
	return n;
}

int rmt_batch_begin(struct rmt *r)
{
	if (!(r->caps & RMT_CAP_BATCH) || !r->ops->batch_begin)
		return -EOPNOTSUPP;
	return r->ops->batch_begin(r);
}

void rmt_batch_mark(struct rmt *r)
{
	if ((r->caps & RMT_CAP_BATCH) && r->ops->batch_mark)
		r->ops->batch_mark(r);
}

int rmt_batch_end(struct rmt *r, int *rc, unsigned int max)
{
	if (!(r->caps & RMT_CAP_BATCH) || !r->ops->batch_end)
		return -EOPNOTSUPP;
	OP(r);
	return r->ops->batch_end(r, rc, max);
}

int rmt_file_fd(const struct rmt_file *f)
{
	if (!f->r->ops->file_fd)
		return -EOPNOTSUPP;
	return f->r->ops->file_fd(f);
}
