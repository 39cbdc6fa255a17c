/*
 * fuse_floor.c - the least any FUSE file system costs on this machine: a
 * bench tool (bench_floor.sh), not part of ferryfs.
 *
 *   fuse_floor MOUNTPOINT [-d]
 *
 * A libfuse low-level file system that keeps names and attributes in
 * memory and throws file data away (a write is answered at once, a read
 * returns zeros). It is mounted as ferryfs mounts (fs/ops.c: 1 MiB
 * max_write and st_blksize, default_permissions, 1 s entry, attribute and
 * negative timeouts, no FLUSH on close, direct I/O for a write-only file,
 * kernel locks, the multi-threaded loop), so what a program pays through
 * it is what the FUSE protocol itself costs: the requests the kernel
 * sends and waits for, and the copies of the data. No FUSE file system,
 * ferryfs included, can be faster.
 *
 * Enough of POSIX for cp, cp -a, dd and mkdir (nothing is ever removed:
 * a bench copies to new names); one mutex over all.
 */
#define FUSE_USE_VERSION 34
#define _GNU_SOURCE
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct node {
	struct node *parent, *hnext; /* hnext: the (parent, name) hash chain */
	struct stat st;
	char name[];
};

#define NBUCKET (1u << 18)
static struct node *bucket[NBUCKET];
static struct node root;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static ino_t next_ino = 2;
static char zeros[1 << 20];

static unsigned hash(const struct node *parent, const char *name)
{
	unsigned h = (unsigned)(uintptr_t)parent * 2654435761u;

	while (*name)
		h = h * 31 + (unsigned char)*name++;
	return h & (NBUCKET - 1);
}

static struct node *node_of(fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? &root : (struct node *)(uintptr_t)ino;
}

static fuse_ino_t ino_of(struct node *n)
{
	return n == &root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

static struct node **find(struct node *parent, const char *name)
{
	struct node **p = &bucket[hash(parent, name)];

	while (*p && ((*p)->parent != parent || strcmp((*p)->name, name)))
		p = &(*p)->hnext;
	return p;
}

static void reply_entry(fuse_req_t req, struct node *n)
{
	struct fuse_entry_param e = {
		.ino = ino_of(n),
		.attr = n->st,
		.attr_timeout = 1.0,
		.entry_timeout = 1.0,
	};

	e.attr.st_ino = e.ino;
	fuse_reply_entry(req, &e);
}

static void reply_attr(fuse_req_t req, struct node *n)
{
	struct stat st = n->st;

	st.st_ino = ino_of(n);
	fuse_reply_attr(req, &st, 1.0);
}

static void op_init(void *u, struct fuse_conn_info *conn)
{
	(void)u;
	conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_FLOCK_LOCKS |
			FUSE_CAP_POSIX_LOCKS | FUSE_CAP_EXPORT_SUPPORT);
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	conn->max_write = 1 << 20;
	conn->max_readahead = 8 << 20;
	conn->time_gran = 1;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param neg = { .entry_timeout = 1.0 };
	struct node *n;

	pthread_mutex_lock(&mu);
	n = *find(node_of(parent), name);
	if (n) {
		reply_entry(req, n);
	} else {
		fuse_reply_entry(req, &neg);
	}
	pthread_mutex_unlock(&mu);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	(void)fi;
	pthread_mutex_lock(&mu);
	reply_attr(req, node_of(ino));
	pthread_mutex_unlock(&mu);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *a, int set,
		       struct fuse_file_info *fi)
{
	struct node *n = node_of(ino);
	struct timespec now;

	(void)fi;
	clock_gettime(CLOCK_REALTIME, &now);
	pthread_mutex_lock(&mu);
	if (set & FUSE_SET_ATTR_MODE)
		n->st.st_mode = (n->st.st_mode & S_IFMT) | (a->st_mode & 07777);
	if (set & FUSE_SET_ATTR_UID)
		n->st.st_uid = a->st_uid;
	if (set & FUSE_SET_ATTR_GID)
		n->st.st_gid = a->st_gid;
	if (set & FUSE_SET_ATTR_SIZE)
		n->st.st_size = a->st_size;
	if (set & FUSE_SET_ATTR_ATIME)
		n->st.st_atim = a->st_atim;
	if (set & FUSE_SET_ATTR_ATIME_NOW)
		n->st.st_atim = now;
	if (set & FUSE_SET_ATTR_MTIME)
		n->st.st_mtim = a->st_mtim;
	if (set & FUSE_SET_ATTR_MTIME_NOW)
		n->st.st_mtim = now;
	n->st.st_ctim = now;
	reply_attr(req, n);
	pthread_mutex_unlock(&mu);
}

/* a new node; NULL and the errno in *err when the name exists */
static struct node *add(fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode, int *err)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct node *dir = node_of(parent), **slot = find(dir, name), *n;
	struct timespec now;

	if (*slot) {
		*err = EEXIST;
		return NULL;
	}
	n = calloc(1, sizeof(*n) + strlen(name) + 1);
	if (!n) {
		*err = ENOMEM;
		return NULL;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	strcpy(n->name, name);
	n->parent = dir;
	n->st.st_mode = mode & ~ctx->umask;
	n->st.st_nlink = S_ISDIR(mode) ? 2 : 1;
	n->st.st_uid = ctx->uid;
	n->st.st_gid = ctx->gid;
	/* as ferryfs reports (fs/ops.c): cp then writes 1 MiB at a time */
	n->st.st_blksize = S_ISREG(mode) ? 1 << 20 : 4096;
	n->st.st_atim = n->st.st_mtim = n->st.st_ctim = now;
	n->st.st_ino = next_ino++;
	*slot = n;
	if (S_ISDIR(mode))
		dir->st.st_nlink++;
	dir->st.st_mtim = dir->st.st_ctim = now;
	return n;
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode)
{
	struct node *n;
	int err;

	pthread_mutex_lock(&mu);
	n = add(req, parent, name, S_IFDIR | (mode & 07777), &err);
	if (n)
		reply_entry(req, n);
	else
		fuse_reply_err(req, err);
	pthread_mutex_unlock(&mu);
}

/* as ferryfs opens (fs/ops.c, rule 5): no FLUSH on close, and direct I/O
 * for a write-only file (no copy into the page cache, no GETXATTR of
 * security.capability before each write) */
static void open_flags(struct fuse_file_info *fi)
{
	fi->noflush = 1;
	fi->direct_io = (fi->flags & O_ACCMODE) == O_WRONLY;
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		      mode_t mode, struct fuse_file_info *fi)
{
	struct fuse_entry_param e = { .attr_timeout = 1.0,
				      .entry_timeout = 1.0 };
	struct node *n;
	int err;

	pthread_mutex_lock(&mu);
	n = add(req, parent, name, S_IFREG | (mode & 07777), &err);
	if (n) {
		e.ino = ino_of(n);
		e.attr = n->st;
		e.attr.st_ino = e.ino;
		open_flags(fi);
		fuse_reply_create(req, &e, fi);
	} else {
		fuse_reply_err(req, err);
	}
	pthread_mutex_unlock(&mu);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct node *n = node_of(ino);

	pthread_mutex_lock(&mu);
	if (fi->flags & O_TRUNC)
		n->st.st_size = 0;
	pthread_mutex_unlock(&mu);
	open_flags(fi);
	fuse_reply_open(req, fi);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
		     size_t size, off_t off, struct fuse_file_info *fi)
{
	struct node *n = node_of(ino);

	(void)buf;
	(void)fi;
	pthread_mutex_lock(&mu);
	if (off + (off_t)size > n->st.st_size)
		n->st.st_size = off + (off_t)size;
	pthread_mutex_unlock(&mu);
	fuse_reply_write(req, size);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	off_t end;

	(void)fi;
	pthread_mutex_lock(&mu);
	end = node_of(ino)->st.st_size;
	pthread_mutex_unlock(&mu);
	if (off >= end)
		size = 0;
	else if ((off_t)size > end - off)
		size = (size_t)(end - off);
	fuse_reply_buf(req, zeros, size > sizeof(zeros) ? sizeof(zeros) : size);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		     struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags)
{
	(void)ino;
	(void)name;
	(void)value;
	(void)size;
	(void)flags;
	fuse_reply_err(req, 0);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	(void)ino;
	(void)name;
	(void)size;
	fuse_reply_err(req, ENODATA);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	(void)ino;
	if (size)
		fuse_reply_buf(req, NULL, 0);
	else
		fuse_reply_xattr(req, 0);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	(void)ino;
	(void)name;
	fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv = {
		.f_bsize = 4096,
		.f_frsize = 4096,
		.f_blocks = 1ull << 32,
		.f_bfree = 1ull << 32,
		.f_bavail = 1ull << 32,
		.f_files = 1ull << 32,
		.f_ffree = 1ull << 32,
		.f_namemax = 255,
	};

	(void)ino;
	fuse_reply_statfs(req, &sv);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.mkdir = op_mkdir,
	.create = op_create,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.release = op_release,
	.fsync = op_fsync,
	.setxattr = op_setxattr,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.removexattr = op_removexattr,
	.statfs = op_statfs,
};

int main(int argc, char **argv)
{
	char *fargv[] = { argv[0], "-o",
			  "default_permissions,fsname=fuse_floor", NULL, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
	struct fuse_loop_config *cfg;
	struct fuse_session *se;
	struct timespec now;
	int rc = 1;

	if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "-d"))) {
		fprintf(stderr, "usage: %s MOUNTPOINT [-d]\n", argv[0]);
		return 2;
	}
	if (argc == 3) {
		fargv[3] = "-d";
		args.argc = 4;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	root.st.st_mode = S_IFDIR | 0755;
	root.st.st_nlink = 2;
	root.st.st_atim = root.st.st_mtim = root.st.st_ctim = now;
	se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	if (!se)
		return 1;
	if (fuse_set_signal_handlers(se) || fuse_session_mount(se, argv[1]))
		goto out;
	cfg = fuse_loop_cfg_create();
	if (!cfg)
		goto unmount;
	fuse_loop_cfg_set_idle_threads(cfg, 8);
	fuse_loop_cfg_set_max_threads(cfg, 16);
	rc = fuse_session_loop_mt(se, cfg) ? 1 : 0;
	fuse_loop_cfg_destroy(cfg);
unmount:
	fuse_session_unmount(se);
out:
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	return rc;
}
