/*
 * remote_i.h - inside remote/: the driver table. Nothing outside remote/
 * includes this file.
 *
 * A driver embeds `struct rmt` first in its own connection struct and
 * `struct rmt_file` first in its own file struct, fills a const
 * `struct rmt_ops`, and is listed in remote.c's rmt_open(). remote.c checks
 * every path (rmt_path_check) before it reaches a driver, so drivers see only
 * clean relative paths ("" = the root).
 */
#ifndef FERRYFS_REMOTE_I_H
#define FERRYFS_REMOTE_I_H

#include <stdatomic.h>

#include "remote.h"

struct rmt_ops {
	const char *name;
	void (*close)(struct rmt *r);
	int (*stat)(struct rmt *r, const char *path, struct stat *st);
	int (*statfs)(struct rmt *r, struct statvfs *sv);
	int (*readdir)(struct rmt *r, const char *path, rmt_dirent_fn fn,
		       void *arg);
	int (*mkdir)(struct rmt *r, const char *path, mode_t mode);
	int (*rmdir)(struct rmt *r, const char *path);
	int (*unlink)(struct rmt *r, const char *path);
	int (*mknod)(struct rmt *r, const char *path, mode_t mode, dev_t rdev);
	int (*symlink)(struct rmt *r, const char *target, const char *path);
	int (*readlink)(struct rmt *r, const char *path, char *buf,
			size_t size);
	int (*link)(struct rmt *r, const char *from, const char *to);
	int (*rename)(struct rmt *r, const char *from, const char *to,
		      unsigned int flags);
	int (*setattr)(struct rmt *r, const char *path, struct rmt_file *f,
		       const struct rmt_setattr *sa);
	/* optional (NULL: every name): rmt_name_check(), no I/O */
	int (*name_check)(struct rmt *r, const char *name);
	/* the xattr calls: NULL for a driver without RMT_CAP_XATTR
	 * (remote.c answers for it) */
	ssize_t (*getxattr)(struct rmt *r, const char *path, const char *name,
			    void *buf, size_t size);
	int (*setxattr)(struct rmt *r, const char *path, const char *name,
			const void *value, size_t size, int flags);
	ssize_t (*listxattr)(struct rmt *r, const char *path, char *buf,
			     size_t size);
	int (*removexattr)(struct rmt *r, const char *path, const char *name);

	int (*file_open)(struct rmt *r, const char *path, int flags,
			 mode_t mode, struct rmt_file **out);
	int (*file_close)(struct rmt_file *f);
	ssize_t (*file_pread)(struct rmt_file *f, void *buf, size_t len,
			      off_t off);
	ssize_t (*file_pwrite)(struct rmt_file *f, const void *buf, size_t len,
			       off_t off);
	int (*file_stat)(struct rmt_file *f, struct stat *st);
	int (*file_fsync)(struct rmt_file *f, bool datasync);
	/* NULL: -EOPNOTSUPP (remote.c) */
	int (*file_fallocate)(struct rmt_file *f, int mode, off_t off,
			      off_t len);
	/* NULL: the driver cannot tell holes; remote.c answers that all of
	 * a file is data */
	off_t (*file_seek)(struct rmt_file *f, off_t off, int whence);
	/* optional: server-side copy; NULL or -EOPNOTSUPP/-EXDEV falls back
	 * to the generic read/write loop in remote.c */
	ssize_t (*file_copy)(struct rmt_file *in, off_t off_in,
			     struct rmt_file *out, off_t off_out, size_t len);
	/* optional: NULL means -EOPNOTSUPP */
	int (*file_fd)(const struct rmt_file *f);
	/* optional: NULL means nothing is deferred (returns 0) */
	int (*file_flush)(struct rmt_file *f);
	/* optional: NULL means directory changes are durable at once */
	int (*syncdir)(struct rmt *r, const char *path);
	/* RMT_CAP_PUT: rmt_file_put() */
	ssize_t (*file_put)(struct rmt_file *f, const void *buf, size_t len,
			    off_t off, const unsigned char sha[32]);
	ssize_t (*put_path)(struct rmt *r, const char *path, const void *buf,
			    size_t len, off_t off, const unsigned char sha[32]);
	/* RMT_CAP_BATCH: rmt_batch_begin(), _mark(), _end() */
	int (*batch_begin)(struct rmt *r);
	void (*batch_mark)(struct rmt *r);
	int (*batch_end)(struct rmt *r, int *rc, unsigned int max);
};

/* A call the server answers busy for a moment (a close under way here or
 * on another connection): tried again RMT_BUSY_TRIES times, the k-th
 * after k * RMT_BUSY_WAIT_US (about 1 s in all). */
#define RMT_BUSY_TRIES 8
#define RMT_BUSY_WAIT_US 30000

/* rmt_counters(); relaxed atomics, set to 0 by rmt_open() */
struct rmt_cnt {
	atomic_uint_least64_t bytes_read, bytes_written, bytes_copied;
	atomic_uint_least64_t ops, faults;
};

struct rmt {
	const struct rmt_ops *ops;
	unsigned int caps; /* enum rmt_caps */
	char *id;          /* rmt_id(); freed by remote.c */
	struct rmt_cnt cnt; /* updated by remote.c only */
};

struct rmt_file {
	struct rmt *r;
};

/*
 * One item KEY[=VALUE] of a comma-separated option string, for
 * rmt_opts_split(): @item is the whole item, @klen the length of KEY,
 * @value what follows '=' (NULL without one). Return 1 if the item is the
 * caller's (then parsed), 0 to leave it to others, or -errno to stop.
 */
typedef int (*rmt_opt_fn)(const char *item, size_t klen, const char *value,
			  void *arg);
/*
 * Take the items @fn claims out of @opts. *rest gets the other items
 * (malloc'ed, possibly "") when any item was taken, else NULL (the caller
 * keeps using @opts as it was). Errors: the first -errno of @fn, -ENOMEM;
 * *rest is then NULL.
 */
int rmt_opts_split(const char *opts, rmt_opt_fn fn, void *arg, char **rest);

/* Driver constructors, called by rmt_open(). */
typedef int (*rmt_open_fn)(const char *spec, const char *opts,
			   struct rmt **out);
int rmt_path_open(const char *dir, const char *opts, struct rmt **out);
int rmt_nfs_open(const char *url, const char *opts, struct rmt **out);
int rmt_smb_open(const char *url, const char *opts, struct rmt **out);
int rmt_agent_open(const char *url, const char *opts, struct rmt **out);

/*
 * Open one connection with the driver constructor @drv and set its
 * counters to 0, as rmt_open() does (remote.c); the pool opens its other
 * connections so.
 */
int rmt_driver_open(rmt_open_fn drv, const char *spec, const char *opts,
		    struct rmt **out);

/* The pool's option of rmt_open(), connections=N (remote.h), parsed. */
#define RMT_POOL_DEFAULT 4 /* connections when the option is not given */
#define RMT_POOL_MAX 64

/*
 * Take connections=N out of @opts (may be NULL): *n is N, or 0 if the
 * option is absent. If it was there, *rest is the other options joined by
 * ',' (maybe ""); else *rest is NULL and @opts goes on unchanged.
 * Errors: -EINVAL (N not in 1..RMT_POOL_MAX; logged), -ENOMEM; then *rest
 * is NULL. Caller frees *rest.
 */
int rmt_pool_parse(const char *opts, unsigned int *n, char **rest);

/*
 * Wrap @first, a connection of a driver without RMT_CAP_THREADSAFE, in the
 * pool (pool.c): it opens @n - 1 more with rmt_driver_open(drv, spec,
 * opts) (n == 0: RMT_POOL_DEFAULT), one after another in this thread. On
 * success the pool owns @first (rmt_close() of it closes them all); on
 * error (the driver's, -ENOMEM, or a pthread error) the connections it
 * opened are closed again and @first is the caller's, unchanged.
 */
int rmt_pool_wrap(struct rmt *first, rmt_open_fn drv, const char *spec,
		  const char *opts, unsigned int n, struct rmt **out);

/* For tests (pool.c): the state of each connection of a pool made by
 * rmt_pool_wrap() at one instant; returns how many it has (fills at most
 * max). */
struct rmt_pool_conn {
	bool busy;            /* a thread is inside a call of it */
	unsigned int waiting; /* threads waiting for this one */
	unsigned int nfiles;  /* open files bound to it */
};
unsigned int rmt_pool_inspect(struct rmt *r, struct rmt_pool_conn *out,
			      unsigned int max);

/* The throttle options of rmt_open() (remote.h), parsed. */
struct rmt_throttle_opts {
	bool any;             /* some remote_* option of ours was given */
	uint64_t rate;        /* bytes/s, all threads together; 0 = no cap */
	uint64_t stream_rate; /* bytes/s per calling thread; 0 = no cap */
	int64_t latency_ns;   /* waited before every operation */
	char *fault;          /* absolute path of the fault switch, or NULL */
};

/*
 * Split @opts (may be NULL) into the throttle options, parsed into *t, and
 * the rest. If t->any, *rest is the other options joined by ',' (maybe "";
 * empty items are dropped) for the driver; else *rest is NULL and the
 * driver gets @opts unchanged. Errors: -EINVAL (an option of ours is
 * malformed; logged), -ENOMEM; then *t holds nothing to release and *rest
 * is NULL. Caller frees *rest and releases *t (rmt_throttle_opts_release).
 */
int rmt_throttle_parse(const char *opts, struct rmt_throttle_opts *t,
		       char **rest);
void rmt_throttle_opts_release(struct rmt_throttle_opts *t);

/*
 * Wrap @inner in the throttle driver (throttle.c). On success the wrapper
 * owns @inner (rmt_close() of it closes both) and t->fault (set to NULL);
 * on error (-ENOMEM, or a pthread error) nothing changed.
 */
int rmt_throttle_wrap(struct rmt *inner, struct rmt_throttle_opts *t,
		      struct rmt **out);

/* A driver injected a failure (remote_fault): counted in rmt_counters(). */
void rmt_count_fault(struct rmt *r);

#ifdef FERRYFS_FUZZ
/* tests/fuzz/fuzz_opts.c only: the URL parsers of nfs.c and smb.c on
 * their own (0 or -errno; nothing kept) */
int rmt_nfs_parse_url_fuzz(const char *url);
int rmt_smb_parse_url_fuzz(const char *url);
/* tests/fuzz/fuzz_smb.c only: the two reading ends of smb.c's worker
 * protocol on the socket @fd (0 or -errno) */
int rmt_smb_worker_fuzz(int fd, bool conf, const char *base);
int rmt_smb_reply_fuzz(int fd, bool dyn);
#endif

#endif
