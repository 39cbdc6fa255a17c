/*
 * nfs.c - the "nfs" driver: a share spoken to over NFS by libnfs, in this
 * process, with no kernel NFS client.
 *
 *   nfs://HOST/EXPORT[/path][?key=value[&key=value...]]
 *
 * HOST is a name or an IPv4 address (or [IPv6]); no ":port" (use
 * nfsport=/mountport=). EXPORT[/path] is mounted as one path: the server
 * must let a client mount a directory below an export (Linux knfsd and
 * nfs-ganesha do); that directory is the root "" of the remote. Keys, all
 * checked here (an unknown key or a bad value is -EINVAL, logged):
 *
 *   version=3|4        protocol (default 3; see "NFSv4" below)
 *   uid=N, gid=N       the AUTH_SYS credential sent (default: this
 *                      process's, root for a root daemon). Ownership set
 *                      by ferryfs works only if the export does not squash
 *                      root (no_root_squash / Squash = No_Root_Squash)
 *   nfsport=N, mountport=N   skip the portmapper for NFS / MOUNT
 *
 * Percent-encoding is not supported ('%' is refused). rmt_id() is
 * "nfs://HOST/EXPORT[/path]", '/' runs collapsed, no trailing '/', no
 * query: the same share whatever the version or credential.
 *
 * One struct nrmt is ONE connection: one libnfs context, one TCP
 * connection, used by one thread at a time (no RMT_CAP_THREADSAFE);
 * rmt_open() puts K of them behind the pool (pool.c, connections=N), one
 * per stream. Contexts are created one after another (libnfs 4.0's context
 * creation bumps a global without a lock).
 *
 * Transfer sizes: NFSv3 uses the server's rtmax/wtmax from FSINFO, which
 * libnfs 4.0 caps at 1 MiB (it has no nfs_set_readmax/writemax; a pread or
 * pwrite larger than that is cut into chunks sent back to back on the
 * connection without waiting, IO_WINDOW bytes at a time: io_batch()).
 * Writes are UNSTABLE and committed by rmt_file_fsync(), rmt_file_flush()
 * and rmt_file_close() (COMMIT), as the kernel client does at close.
 *
 * Waiting, reconnecting (wait_until()): every call is started with libnfs's
 * *_async function and this file drives the socket itself until the
 * callback ran, never returning before (libnfs 4.0's own sync functions
 * may return while their request is still queued after a failed reconnect,
 * and its callback later writes into a dead stack frame). The RPC layer
 * reconnects on its own after a drop (rpc_set_autoreconnect(-1), also for
 * NFSv4, which libnfs leaves without) and resends what was in flight, so a
 * server restart or a cut link only delays calls: HARD-mount semantics,
 * no timeout. A lost and a regained connection are logged once each.
 * Resent non-idempotent calls (create, remove, rename) can fail with
 * EEXIST/ENOENT after a reconnect, as with any NFS client without a
 * server reply cache.
 *
 * Names never follow a symlink (remote.h). libnfs resolves a path one
 * LOOKUP per component, and FOLLOWS a symlink met in an intermediate
 * component (confined to the export). So before a call by name, the parent
 * components are checked to be directories, a symlink giving -ELOOP and
 * anything else -ENOTDIR (check_parent()); the last component is acted on
 * by a call that does not follow it (lstat, readlink, open with
 * O_NOFOLLOW, and unlink, rmdir, rename, mkdir, mknod, symlink, link,
 * which never follow a last component; setattr is by handle). The check
 * uses libnfs's raw API, with the root's handle:
 *
 *   NFSv3: walk3(): one LOOKUP per component, reading the type from the
 *          LOOKUP's attributes: as many round trips as components
 *   NFSv4: walk4(): one COMPOUND of a LOOKUP per component and a GETATTR
 *          of the type (a LOOKUP through a symlink is NFS4ERR_SYMLINK)
 *
 * The check and the call are two round trips: a directory swapped for a
 * symlink by another client in between is followed by the call (inside
 * the export; the remote's path is then not what it was). setattr, and
 * the NFSv3 stat and link, act on the handle the walk found: no gap.
 *
 * Attributes: setattr is a raw SETATTR on the object's handle (two when
 * times come with other fields: times last, remote.h), with ns times,
 * UTIME_NOW as the server's time and UTIME_OMIT left alone. NFSv3 times
 * outside 0..2^32-1 s are -EINVAL (nfstime3 is unsigned 32-bit). NFSv4
 * sends owners as numbers (as libnfs does): the server must accept
 * numeric owners (ganesha Only_Numeric_Owners, knfsd
 * nfs4_disable_idmapping); see setattr4() for why not libnfs's calls.
 *
 * Not supported: xattrs (no RMT_CAP_XATTR; remote.c answers), fallocate
 * (-EOPNOTSUPP), server-side copy (file_copy NULL: remote.c copies through
 * pread/pwrite), RENAME_EXCHANGE (-EINVAL: no atomic form in NFS).
 * RENAME_NOREPLACE is a lookup of the target, then RENAME: another client
 * may create the target in between, and it is then replaced. SEEK_DATA and
 * SEEK_HOLE see the whole file as data (holes are not reported; as Linux
 * does for file systems without hole support): SEEK_DATA at off < size is
 * off, SEEK_HOLE is size, at off >= size both are -ENXIO.
 *
 * A file open here survives its unlink and a rename over it, as with the
 * kernel client (a "silly rename": see open_files).
 *
 * NFSv4 (version=4) works around these limits of libnfs 4.0.0:
 *  - a COMPOUND is encoded in a fixed 4 KiB buffer: a WRITE carries at
 *    most V4_WRITE_CHUNK bytes (pipelined by io_batch(), but NFSv4 writes
 *    stay far slower than NFSv3's), and a path longer than about 3 KiB
 *    does not fit (-ENAMETOOLONG);
 *  - its calls that set attributes by name OPEN the file (setattr4() does
 *    its own SETATTRs), its MKNOD makes devices only (mknod4() makes fifos
 *    and sockets), its rmdir and unlink are one REMOVE for both (the type
 *    is looked at first: check_type4()), its LINK follows a symlink
 *    (link4());
 *  - a file created by OPEN gets mode 0600 (set again after the create);
 *    READLINK's target is not NUL-terminated (its length comes from an
 *    lstat first); READDIR entries carry no inode number (each entry is
 *    lstat'ed: a round trip per entry); st_blocks is not in 512-byte units
 *    (taken from the bytes used);
 *  - one open owner per context: a second OPEN of a file spoils the
 *    first's CLOSE, so the opens of a file on a connection share one OPEN
 *    (reuse4()); every connection gets a client name and verifier of its
 *    own (libnfs's default is the same for contexts of a process made in
 *    one second);
 *  - no state recovery: after a server restart the client is forgotten,
 *    opens fail (-EIO) until the remote is opened again (calls by name
 *    without state, stat or mkdir, go on working).
 *
 * Errors: libnfs reports -errno itself, except where nfs_err() says; that
 * is the one place a libnfs result becomes a -errno of this driver.
 *
 * Invariants:
 *  1. Every libnfs call of a connection is made by the one thread that
 *     holds it (the pool's checkout), between rmt_nfs_open() and
 *     nrmt_close(); no libnfs callback runs after the wait that started it
 *     returned (wait_until() returns only when every request it waits for
 *     has called back).
 *  2. No path reaches libnfs before its parent components were checked
 *     (check_parent(), or walk3()/walk4() for the calls by handle).
 *  3. libnfs's directory cache is off (nfs_set_dircache(0)): the pool's
 *     other connections and other clients change directories this context
 *     would not see. Its page cache and read-ahead stay off (defaults).
 *  4. nf->dirty is set by every write and cleared only by a COMMIT that
 *     succeeded; fsync/flush skip the COMMIT when it is clear.
 *
 * Called only through remote.c (paths checked by rmt_path_check()) and
 * the pool.
 */
#include <errno.h>
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-nfs.h>
#include <nfsc/libnfs-raw-nfs4.h>

#include "log.h"
#include "remote_i.h"

#ifdef LIBNFS_API_V2
#error "remote/nfs.c is written for the libnfs 4.x API (Debian 12: 4.0.0)"
#endif

/*
 * libnfs 4.0.0 exports these, but declares them (and defines struct
 * nfs_fh) only in its private header, libnfs-private.h: a handle is
 * { int len; char *val; }, the layout of nfs_fh3's data (checked at run
 * time: root_of(), fh_of()); rpc_set_autoreconnect() is what
 * nfs_set_autoreconnect() sets for NFSv3 mounts only.
 */
struct nfs_fh {
	int len;
	char *val;
};
const struct nfs_fh *nfs_get_rootfh(struct nfs_context *nfs);
void rpc_set_autoreconnect(struct rpc_context *rpc, int num_retries);

#define FH3_MAX 64  /* NFS3_FHSIZE */
#define FH4_MAX 128 /* NFS4_FHSIZE */
#define V4_WRITE_CHUNK 3072 /* fits a COMPOUND's 4 KiB encode buffer */
#define RW_CHUNK_MAX ((size_t)1 << 20)
#define IO_WINDOW ((size_t)4 << 20) /* bytes in flight per io_batch() */
#define IO_BATCH_MAX 64                /* requests in flight, at most */
#define MOUNT_TIMEOUT_MS 30000
#define PATH_BUF (PATH_MAX + 2) /* "/" + a checked path + NUL */

struct nrmt {
	struct rmt base;         /* first: remote.c sees only this */
	struct nfs_context *nfs; /* invariant 1 */
	struct rpc_context *rpc; /* nfs's */
	int version;             /* 3 or 4 */
	struct nfs_fh3 root;     /* the root's handle (v3 and v4), owned */
	size_t rchunk, wchunk;   /* bytes per READ / WRITE request */
	bool lost;               /* the connection dropped; logged */
	struct share4 *shares;   /* NFSv4: the OPENs of this connection */
};

struct openfile;

/* NFSv4: one OPEN of a file, shared by the opens of it on a connection. */
struct share4 {
	struct share4 *next; /* in its connection's shares */
	dev_t dev;
	ino_t ino;
	struct nfsfh *fh;
	bool rdwr;          /* opened for reading and writing */
	unsigned int refs;  /* struct nfile using it */
};

struct nfile {
	struct rmt_file base; /* first */
	struct nfsfh *fh;
	struct openfile *of; /* its entry in open_files */
	struct share4 *sh;   /* NFSv4: the OPEN it uses */
	bool dirty; /* invariant 4 */
};

static struct nrmt *to_nrmt(struct rmt *r)
{
	return (struct nrmt *)r;
}

static struct nfile *to_nfile(struct rmt_file *f)
{
	return (struct nfile *)f;
}

/* --- errors ------------------------------------------------------------ */

/* A request libnfs could not even queue (out of memory, encode error). */
#define NOT_QUEUED INT_MIN

/* The errno of "...NFS3ERR_NOSPC(-28)" in libnfs's error text, or 0. */
static int errno_in_text(const char *text)
{
	const char *p = text ? strstr(text, "ERR_") : NULL;
	const char *open;
	long e;

	if (!p)
		return 0;
	open = strchr(p, '(');
	if (!open || open[1] != '-')
		return 0;
	e = strtol(open + 2, NULL, 10);
	return (e > 0 && e < 4096) ? (int)e : 0;
}

/*
 * THE mapping of a libnfs result to this driver's result: >= 0 stays,
 * else a -errno. libnfs already gives -errno for an NFS status, except:
 *   -EFAULT  an RPC failed, or a READ/WRITE cut in requests failed (libnfs
 *            then keeps the status only in its error text): the text's
 *            errno if there is one, else -EIO
 *   -EINTR   a request timed out or was cancelled: -ETIMEDOUT
 *   -ERANGE  NFS3ERR_DQUOT (its name is in the error text): -EDQUOT; a
 *            status libnfs does not know (NFSv4 state errors): -EIO
 *   -1       NFS3ERR_PERM: -EPERM (the same value)
 *   NOT_QUEUED  a request that could not be sent: -ENOMEM if libnfs says
 *            it ran out of memory, -ENAMETOOLONG if it could not encode
 *            it (NFSv4: a path of more than about 3 KiB), else -EIO
 */
static int nfs_err(struct nrmt *n, int rc)
{
	const char *text;
	int e;

	if (rc >= 0)
		return rc;
	text = nfs_get_error(n->nfs);
	LOG_DBG("nfs '%s': %s (%d)", n->base.id, text ? text : "",
		rc == NOT_QUEUED ? 0 : rc);
	switch (rc) {
	case NOT_QUEUED:
		if (text && strstr(text, "emory"))
			return -ENOMEM;
		/* NFSv4: a COMPOUND past libnfs's 4 KiB encode buffer, which
		 * only a long path can make (writes are cut to fit) */
		if (text && strstr(text, "encode"))
			return -ENAMETOOLONG;
		return -EIO;
	case -EFAULT:
		e = errno_in_text(text);
		return e ? -e : -EIO;
	case -EINTR:
		return -ETIMEDOUT;
	case -ERANGE:
		return text && strstr(text, "DQUOT") ? -EDQUOT : -EIO;
	default:
		return rc > -4096 ? rc : -EIO;
	}
}

/* An NFSv3 reply of the raw API, as libnfs's own calls would report it
 * (but -EIO for a failed RPC: there is no status in the error text). */
static int raw_result(int rpc_status, int nfsstat)
{
	switch (rpc_status) {
	case RPC_STATUS_SUCCESS:
		return nfsstat == NFS3_OK ? 0 : nfsstat3_to_errno(nfsstat);
	case RPC_STATUS_ERROR:
		return -EIO;
	default: /* cancelled, timed out */
		return -EINTR;
	}
}

/* --- waiting (invariant 1) --------------------------------------------- */

/* What a callback copies out before libnfs frees its reply. */
enum out {
	OUT_NONE,
	OUT_STAT,    /* struct nfs_stat_64 */
	OUT_STATVFS, /* struct nfs_statvfs_64 */
	OUT_PTR,     /* a pointer handed over: struct nfsfh *, nfsdir * */
	OUT_BYTES,   /* status bytes (a read), at most size */
	OUT_STR,     /* a NUL-terminated string, at most size bytes with NUL */
	OUT_FIXED,   /* exactly size bytes */
};

struct wait {
	int *left; /* requests of the batch not yet called back */
	int status; /* the callback's: >= 0, or libnfs's -errno */
	enum out kind;
	void *out;
	size_t size;
};

static void done_cb(int status, struct nfs_context *nfs, void *data,
		    void *priv)
{
	struct wait *w = priv;

	(void)nfs;
	w->status = status;
	if (status >= 0) {
		switch (w->kind) {
		case OUT_NONE:
			break;
		case OUT_STAT:
			memcpy(w->out, data, sizeof(struct nfs_stat_64));
			break;
		case OUT_STATVFS:
			memcpy(w->out, data, sizeof(struct nfs_statvfs_64));
			break;
		case OUT_PTR:
			*(void **)w->out = data;
			break;
		case OUT_BYTES:
			if ((size_t)status > w->size)
				w->status = -EFAULT; /* more than asked */
			else if (status > 0)
				memcpy(w->out, data, (size_t)status);
			break;
		case OUT_FIXED:
			if (!data)
				w->status = -EFAULT;
			else
				memcpy(w->out, data, w->size);
			break;
		case OUT_STR:
			if (!data) {
				w->status = -EFAULT;
			} else {
				size_t len = strnlen(data, w->size);

				memcpy(w->out, data, len);
				((char *)w->out)[len < w->size ? len
							       : w->size - 1] =
					'\0';
				w->status = len < w->size ? (int)len
							  : -ENAMETOOLONG;
			}
			break;
		}
	}
	(*w->left)--;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
			       .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/*
 * Drive the connection until *left is 0: every request waited for has
 * called back. With @deadline_ms (a now_ms() time, or 0) or @give_up, it
 * may return early: -ETIMEDOUT, or -EIO when the RPC layer failed without
 * a reconnect; then requests may still be queued, and the caller must
 * destroy the context (which calls them back) before their struct wait
 * goes out of scope. Without either it waits until the server answers:
 * the RPC layer reconnects and resends (hard mount). Returns 0 when done.
 */
static int wait_until(struct nrmt *n, const int *left, int64_t deadline_ms,
		      bool give_up)
{
	unsigned int pause = 0;

	while (*left > 0) {
		struct pollfd pfd = {
			.fd = rpc_get_fd(n->rpc),
			.events = (short)rpc_which_events(n->rpc),
		};
		int revents = 0;

		if (deadline_ms && now_ms() > deadline_ms)
			return -ETIMEDOUT;
		if (pause)
			sleep_ms(pause);
		/* fd -1 (between connects) is ignored by poll: a short sleep */
		if (poll(&pfd, 1, 100) > 0)
			revents = pfd.revents;
		if (rpc_service(n->rpc, revents) == 0 || *left == 0)
			continue;
		if (give_up)
			return -EIO;
		/* a connect failed; the RPC layer connects again and keeps our
		 * requests queued: pace it */
		if (!n->lost) {
			const char *e = rpc_get_error(n->rpc);

			n->lost = true;
			LOG_WARN("nfs '%s': connection lost (%s), reconnecting",
				 n->base.id, e ? e : "no reason given");
		}
		pause = pause ? (pause * 2 > 1000 ? 1000 : pause * 2) : 10;
	}
	if (n->lost && rpc_get_fd(n->rpc) >= 0) {
		n->lost = false;
		LOG_INFO("nfs '%s': connection back", n->base.id);
	}
	return 0;
}

/* One request: @queued is the *_async call's return, w its record. */
static int run(struct nrmt *n, struct wait *w, int queued)
{
	if (queued != 0) {
		(*w->left)--;
		return nfs_err(n, NOT_QUEUED);
	}
	wait_until(n, w->left, 0, false);
	return nfs_err(n, w->status);
}

/* A struct wait of one request, named w, with its counter. */
#define WAIT1(kind_, out_, size_)                                          \
	int left_ = 1;                                                     \
	struct wait w = { .left = &left_, .kind = (kind_), .out = (out_), \
			  .size = (size_) }

/* --- paths ------------------------------------------------------------- */

/* "/" + a checked relative path: libnfs's name of it below the mount. */
static void abs_path(char *buf, const char *path)
{
	buf[0] = '/';
	strcpy(buf + 1, path); /* < PATH_MAX: rmt_path_check() */
}

static size_t parent_len(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? (size_t)(slash - path) : 0;
}

/* --- NFSv3 by handle (libnfs's raw API) -------------------------------- */

struct raw {
	int *left;
	int rpc_status;      /* RPC_STATUS_* */
	int nfsstat;         /* NFS3_OK or an error status */
	struct nfs_fh3 fh;   /* LOOKUP: the object's handle, malloc'ed */
	bool have_attr;
	fattr3 attr;
};

static void raw_done(struct raw *x, int status)
{
	x->rpc_status = status;
	(*x->left)--;
}

static void post_op(struct raw *x, const post_op_attr *a)
{
	x->have_attr = a->attributes_follow;
	if (x->have_attr)
		x->attr = a->post_op_attr_u.attributes;
}

static void lookup3_cb(struct rpc_context *rpc, int status, void *data,
		       void *priv)
{
	struct raw *x = priv;
	LOOKUP3res *res = data;

	(void)rpc;
	if (status == RPC_STATUS_SUCCESS) {
		x->nfsstat = res->status;
		if (res->status == NFS3_OK) {
			const nfs_fh3 *o = &res->LOOKUP3res_u.resok.object;

			x->fh.data.data_val = malloc(o->data.data_len ?
							     o->data.data_len :
							     1);
			if (!x->fh.data.data_val) {
				x->nfsstat = NFS3ERR_SERVERFAULT;
			} else {
				memcpy(x->fh.data.data_val, o->data.data_val,
				       o->data.data_len);
				x->fh.data.data_len = o->data.data_len;
			}
			post_op(x, &res->LOOKUP3res_u.resok.obj_attributes);
		}
	}
	raw_done(x, status);
}

static void getattr3_cb(struct rpc_context *rpc, int status, void *data,
			void *priv)
{
	struct raw *x = priv;
	GETATTR3res *res = data;

	(void)rpc;
	if (status == RPC_STATUS_SUCCESS) {
		x->nfsstat = res->status;
		if (res->status == NFS3_OK) {
			x->have_attr = true;
			x->attr = res->GETATTR3res_u.resok.obj_attributes;
		}
	}
	raw_done(x, status);
}

static void setattr3_cb(struct rpc_context *rpc, int status, void *data,
			void *priv)
{
	struct raw *x = priv;

	(void)rpc;
	if (status == RPC_STATUS_SUCCESS)
		x->nfsstat = ((SETATTR3res *)data)->status;
	raw_done(x, status);
}

static void link3_cb(struct rpc_context *rpc, int status, void *data,
		     void *priv)
{
	struct raw *x = priv;

	(void)rpc;
	if (status == RPC_STATUS_SUCCESS)
		x->nfsstat = ((LINK3res *)data)->status;
	raw_done(x, status);
}

static void remove3_cb(struct rpc_context *rpc, int status, void *data,
		       void *priv)
{
	struct raw *x = priv;

	(void)rpc;
	if (status == RPC_STATUS_SUCCESS)
		x->nfsstat = ((REMOVE3res *)data)->status;
	raw_done(x, status);
}

#define RAW1()        \
	int left_ = 1; \
	struct raw x = { .left = &left_ }

static int raw_run(struct nrmt *n, struct raw *x, int queued)
{
	if (queued != 0) {
		(*x->left)--;
		return nfs_err(n, NOT_QUEUED);
	}
	wait_until(n, x->left, 0, false);
	return nfs_err(n, raw_result(x->rpc_status, x->nfsstat));
}

static int getattr3(struct nrmt *n, const struct nfs_fh3 *fh, fattr3 *attr)
{
	GETATTR3args a = { .object = *fh };
	RAW1();
	int rc;

	rc = raw_run(n, &x, rpc_nfs3_getattr_async(n->rpc, getattr3_cb, &a,
						   &x));
	if (rc == 0)
		*attr = x.attr;
	return rc;
}

/* LOOKUP name in dir: *fh (caller frees fh->data.data_val) and attrs. */
static int lookup3(struct nrmt *n, const struct nfs_fh3 *dir, char *name,
		   struct nfs_fh3 *fh, fattr3 *attr)
{
	LOOKUP3args a = { .what = { .dir = *dir, .name = name } };
	RAW1();
	int rc;

	rc = raw_run(n, &x, rpc_nfs3_lookup_async(n->rpc, lookup3_cb, &a, &x));
	if (rc < 0) {
		free(x.fh.data.data_val);
		return rc;
	}
	*fh = x.fh;
	if (x.have_attr) {
		*attr = x.attr;
		return 0;
	}
	rc = getattr3(n, fh, attr);
	if (rc < 0) {
		free(fh->data.data_val);
		fh->data.data_val = NULL;
	}
	return rc;
}

/*
 * Resolve the first @len bytes of @path from the root, one LOOKUP per
 * component, never following a symlink: an intermediate component that is
 * a symlink is -ELOOP, any other non-directory -ENOTDIR; with @dir the
 * last one must be a directory too. Gives the handle (may be NULL; caller
 * frees fh->data.data_val) and attributes of the last component (the
 * root's for len 0).
 */
static int walk3(struct nrmt *n, const char *path, size_t len, bool dir,
		 struct nfs_fh3 *fh, fattr3 *attr)
{
	struct nfs_fh3 cur = n->root, next;
	const char *p = path, *end = path + len;
	char name[NAME_MAX + 1];
	fattr3 a = { .type = NF3REG };
	int rc = 0;

	if (len == 0) {
		rc = getattr3(n, &n->root, &a);
		if (rc == 0 && dir && a.type != NF3DIR)
			rc = -ENOTDIR; /* the server's root: cannot be */
		goto out;
	}
	while (p < end) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		size_t clen = slash ? (size_t)(slash - p) : (size_t)(end - p);
		bool last = !slash;

		if (clen > NAME_MAX) {
			rc = -ENAMETOOLONG;
			break;
		}
		memcpy(name, p, clen);
		name[clen] = '\0';
		rc = lookup3(n, &cur, name, &next, &a);
		if (cur.data.data_val != n->root.data.data_val)
			free(cur.data.data_val);
		cur = n->root;
		if (rc < 0)
			break;
		cur = next;
		if ((!last || dir) && a.type != NF3DIR) {
			rc = a.type == NF3LNK ? -ELOOP : -ENOTDIR;
			break;
		}
		p = last ? end : slash + 1;
	}
out:
	if (rc == 0 && fh && cur.data.data_val == n->root.data.data_val) {
		/* the root itself: a copy, so the caller can always free */
		cur.data.data_val = malloc(n->root.data.data_len);
		if (!cur.data.data_val)
			return -ENOMEM;
		memcpy(cur.data.data_val, n->root.data.data_val,
		       n->root.data.data_len);
	}
	if (rc == 0 && fh) {
		*fh = cur;
	} else if (cur.data.data_val != n->root.data.data_val) {
		free(cur.data.data_val);
	}
	if (rc == 0 && attr)
		*attr = a;
	return rc;
}

static mode_t type_bits3(ftype3 t)
{
	switch (t) {
	case NF3REG:
		return S_IFREG;
	case NF3DIR:
		return S_IFDIR;
	case NF3BLK:
		return S_IFBLK;
	case NF3CHR:
		return S_IFCHR;
	case NF3LNK:
		return S_IFLNK;
	case NF3SOCK:
		return S_IFSOCK;
	case NF3FIFO:
		return S_IFIFO;
	}
	return 0;
}

static void stat_of_fattr3(const fattr3 *a, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_dev = (dev_t)a->fsid;
	st->st_ino = (ino_t)a->fileid;
	st->st_mode = type_bits3(a->type) | (a->mode & 07777);
	st->st_nlink = a->nlink;
	st->st_uid = a->uid;
	st->st_gid = a->gid;
	st->st_rdev = makedev(a->rdev.specdata1, a->rdev.specdata2);
	st->st_size = (off_t)a->size;
	st->st_blksize = 4096;
	st->st_blocks = (blkcnt_t)((a->used + 511) / 512);
	st->st_atim.tv_sec = a->atime.seconds;
	st->st_atim.tv_nsec = a->atime.nseconds;
	st->st_mtim.tv_sec = a->mtime.seconds;
	st->st_mtim.tv_nsec = a->mtime.nseconds;
	st->st_ctim.tv_sec = a->ctime.seconds;
	st->st_ctim.tv_nsec = a->ctime.nseconds;
}

/* --- NFSv4 by COMPOUND (libnfs's raw API) ------------------------------ */

struct raw4 {
	int *left;
	int rpc_status; /* RPC_STATUS_* */
	int nfsstat;    /* the COMPOUND's status */
	uint32_t type;  /* FATTR4_TYPE of a GETATTR in it, else 0 */
};

static void compound4_cb(struct rpc_context *rpc, int status, void *data,
			 void *priv)
{
	struct raw4 *x = priv;
	COMPOUND4res *res = data;
	u_int i;

	(void)rpc;
	if (status == RPC_STATUS_SUCCESS) {
		x->nfsstat = res->status;
		for (i = 0; i < res->resarray.resarray_len; i++) {
			nfs_resop4 op;
			attrlist4 *v;
			uint32_t t;

			/* a copy: libnfs decodes the array at 4-byte
			 * alignment, less than the struct's */
			memcpy(&op, (char *)res->resarray.resarray_val +
					    i * sizeof(op),
			       sizeof(op));
			if (op.resop != OP_GETATTR ||
			    op.nfs_resop4_u.opgetattr.status != NFS4_OK)
				continue;
			v = &op.nfs_resop4_u.opgetattr.GETATTR4res_u.resok4
				     .obj_attributes.attr_vals;
			if (v->attrlist4_len >= 4) {
				memcpy(&t, v->attrlist4_val, 4);
				x->type = ntohl(t);
			}
		}
	}
	x->rpc_status = status;
	(*x->left)--;
}

/* A COMPOUND's reply, as libnfs's own calls would report it; except that
 * NFS4ERR_SYMLINK (a LOOKUP through a symlink), -EIO for libnfs, is
 * -ELOOP, a status libnfs does not know is -EIO, and so is a failed RPC
 * (there is no status in the error text). */
static int raw_result4(int rpc_status, int nfsstat)
{
	int e;

	switch (rpc_status) {
	case RPC_STATUS_SUCCESS:
		if (nfsstat == NFS4_OK)
			return 0;
		if (nfsstat == NFS4ERR_SYMLINK)
			return -ELOOP;
		if (nfsstat == NFS4ERR_DQUOT)
			return -EDQUOT;
		e = nfsstat4_to_errno(nfsstat);
		return e == -ERANGE ? -EIO : e;
	case RPC_STATUS_ERROR:
		return -EIO;
	default: /* cancelled, timed out */
		return -EINTR;
	}
}

static int compound4(struct nrmt *n, nfs_argop4 *ops, int nops,
		     struct raw4 *x)
{
	COMPOUND4args args;

	memset(&args, 0, sizeof(args));
	args.argarray.argarray_len = (u_int)nops;
	args.argarray.argarray_val = ops;
	if (rpc_nfs4_compound_async(n->rpc, compound4_cb, &args, x) != 0) {
		(*x->left)--;
		return nfs_err(n, NOT_QUEUED);
	}
	wait_until(n, x->left, 0, false);
	return nfs_err(n, raw_result4(x->rpc_status, x->nfsstat));
}

/*
 * ops: PUTFH(fh) then a LOOKUP per component of path[0, len), then room
 * for `extra` more; malloc'ed, *nops set. The server never follows a
 * symlink for a LOOKUP: one met in the middle is NFS4ERR_SYMLINK.
 */
static int ncomp4(const char *path, size_t len)
{
	int ncomp = len ? 1 : 0;
	size_t i;

	for (i = 0; i < len; i++)
		ncomp += path[i] == '/';
	return ncomp;
}

/* ops[k...]: PUTFH(fh), a LOOKUP per component; returns the next k. */
static int fill_lookups4(nfs_argop4 *ops, int k, const struct nfs_fh3 *fh,
			 const char *path, size_t len)
{
	const char *p = path, *end = path + len;

	ops[k].argop = OP_PUTFH;
	ops[k].nfs_argop4_u.opputfh.object.nfs_fh4_len = fh->data.data_len;
	ops[k].nfs_argop4_u.opputfh.object.nfs_fh4_val = fh->data.data_val;
	k++;
	while (p < end) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		size_t clen = slash ? (size_t)(slash - p) : (size_t)(end - p);
		utf8string *name = &ops[k].nfs_argop4_u.oplookup.objname;

		ops[k].argop = OP_LOOKUP;
		name->utf8string_len = (u_int)clen;
		name->utf8string_val = (char *)p;
		k++;
		p += clen + 1;
	}
	return k;
}

static nfs_argop4 *lookup_ops4(const struct nfs_fh3 *fh, const char *path,
			       size_t len, int extra, int *nops)
{
	nfs_argop4 *ops = calloc((size_t)(1 + ncomp4(path, len) + extra),
				 sizeof(*ops));

	if (ops)
		*nops = fill_lookups4(ops, 0, fh, path, len);
	return ops;
}

/* LINK in one COMPOUND: the source is not followed (a symlink is linked). */
static int link4(struct nrmt *n, const char *from, const char *to)
{
	size_t plen = parent_len(to), flen = strlen(from);
	const char *base = plen ? to + plen + 1 : to;
	int left = 1, k, rc;
	struct raw4 x = { .left = &left };
	nfs_argop4 *ops = calloc((size_t)(4 + ncomp4(from, flen) +
					  ncomp4(to, plen)),
				 sizeof(*ops));

	if (!ops)
		return -ENOMEM;
	k = fill_lookups4(ops, 0, &n->root, from, flen);
	ops[k++].argop = OP_SAVEFH;
	k = fill_lookups4(ops, k, &n->root, to, plen);
	ops[k].argop = OP_LINK;
	ops[k].nfs_argop4_u.oplink.newname.utf8string_len = (u_int)strlen(base);
	ops[k].nfs_argop4_u.oplink.newname.utf8string_val = (char *)base;
	rc = compound4(n, ops, k + 1, &x);
	free(ops);
	return rc == -EISDIR ? -EPERM : rc; /* link(2) of a directory */
}

/* The first len bytes of path lead, without a symlink, to an object of
 * type *type (nfs_ftype4): one COMPOUND. */
static int walk4(struct nrmt *n, const char *path, size_t len,
		 uint32_t *type)
{
	uint32_t mask = 1u << FATTR4_TYPE;
	int left = 1, nops, rc;
	struct raw4 x = { .left = &left };
	nfs_argop4 *ops = lookup_ops4(&n->root, path, len, 1, &nops);

	if (!ops)
		return -ENOMEM;
	ops[nops].argop = OP_GETATTR;
	ops[nops].nfs_argop4_u.opgetattr.attr_request.bitmap4_len = 1;
	ops[nops].nfs_argop4_u.opgetattr.attr_request.bitmap4_val = &mask;
	rc = compound4(n, ops, nops + 1, &x);
	free(ops);
	*type = x.type;
	return rc;
}

/* NFSv4: the first len bytes of path are directories, none a symlink. */
static int check_dirs4(struct nrmt *n, const char *path, size_t len)
{
	uint32_t type;
	int rc = walk4(n, path, len, &type);

	if (rc < 0)
		return rc;
	if (type != NF4DIR)
		return type == NF4LNK ? -ELOOP : -ENOTDIR;
	return 0;
}

/* The values of a SETATTR, in attribute order (RFC 7530 fattr4). */
struct attrs4 {
	uint32_t mask[2];
	char vals[128];
	size_t len;
};

static void put32(struct attrs4 *a, uint32_t v)
{
	v = htonl(v);
	memcpy(a->vals + a->len, &v, 4);
	a->len += 4;
}

static void put64(struct attrs4 *a, uint64_t v)
{
	v = htobe64(v);
	memcpy(a->vals + a->len, &v, 8);
	a->len += 8;
}

/* An owner as a number: what AUTH_SYS clients send (libnfs does too);
 * the server must take numeric owners (ganesha: Only_Numeric_Owners,
 * knfsd: nfs4_disable_idmapping). */
static void put_owner(struct attrs4 *a, unsigned int id)
{
	char s[16];
	int len = snprintf(s, sizeof(s), "%u", id);

	put32(a, (uint32_t)len);
	memcpy(a->vals + a->len, s, (size_t)len);
	memset(a->vals + a->len + (size_t)len, 0, (size_t)(-len & 3));
	a->len += ((size_t)len + 3) & ~(size_t)3;
}

static void put_time(struct attrs4 *a, int attr, const struct timespec *ts)
{
	a->mask[1] |= 1u << (attr - 32);
	if (ts->tv_nsec == UTIME_NOW) {
		put32(a, SET_TO_SERVER_TIME4);
		return;
	}
	put32(a, SET_TO_CLIENT_TIME4);
	put64(a, (uint64_t)(int64_t)ts->tv_sec);
	put32(a, (uint32_t)ts->tv_nsec);
}

/* The times of sa (times), or the rest (!times); false if none. */
static bool attrs4_of(const struct rmt_setattr *sa, bool times,
		      struct attrs4 *a)
{
	memset(a, 0, sizeof(*a));
	if (times) {
		if ((sa->set & RMT_SET_ATIME) &&
		    sa->atime.tv_nsec != UTIME_OMIT)
			put_time(a, FATTR4_TIME_ACCESS_SET, &sa->atime);
		if ((sa->set & RMT_SET_MTIME) &&
		    sa->mtime.tv_nsec != UTIME_OMIT)
			put_time(a, FATTR4_TIME_MODIFY_SET, &sa->mtime);
	} else {
		if (sa->set & RMT_SET_SIZE) {
			a->mask[0] |= 1u << FATTR4_SIZE;
			put64(a, (uint64_t)sa->size);
		}
		if (sa->set & RMT_SET_MODE) {
			a->mask[1] |= 1u << (FATTR4_MODE - 32);
			put32(a, sa->mode & 07777);
		}
		if (sa->set & RMT_SET_UID) {
			a->mask[1] |= 1u << (FATTR4_OWNER - 32);
			put_owner(a, sa->uid);
		}
		if (sa->set & RMT_SET_GID) {
			a->mask[1] |= 1u << (FATTR4_OWNER_GROUP - 32);
			put_owner(a, sa->gid);
		}
	}
	return a->mask[0] || a->mask[1];
}

/* SETATTR with the anonymous stateid on the object that fh, then
 * path[0, len), lead to. */
static int setattr4_call(struct nrmt *n, const struct nfs_fh3 *fh,
			 const char *path, size_t len,
			 const struct attrs4 *a)
{
	int left = 1, nops, rc;
	struct raw4 x = { .left = &left };
	nfs_argop4 *ops = lookup_ops4(fh, path, len, 1, &nops);
	SETATTR4args *sa;

	if (!ops)
		return -ENOMEM;
	ops[nops].argop = OP_SETATTR;
	sa = &ops[nops].nfs_argop4_u.opsetattr;
	memset(&sa->stateid, 0, sizeof(sa->stateid));
	sa->obj_attributes.attrmask.bitmap4_len = 2;
	sa->obj_attributes.attrmask.bitmap4_val = (uint32_t *)a->mask;
	sa->obj_attributes.attr_vals.attrlist4_len = (u_int)a->len;
	sa->obj_attributes.attr_vals.attrlist4_val = (char *)a->vals;
	rc = compound4(n, ops, nops + 1, &x);
	free(ops);
	return rc;
}

/* A fifo or a socket (libnfs 4.0's NFSv4 MKNOD makes devices only). */
static int mknod4(struct nrmt *n, const char *path, mode_t mode)
{
	size_t plen = parent_len(path);
	const char *base = plen ? path + plen + 1 : path;
	int left = 1, nops, rc;
	struct raw4 x = { .left = &left };
	nfs_argop4 *ops = lookup_ops4(&n->root, path, plen, 1, &nops);
	CREATE4args *c;
	struct attrs4 a;

	if (!ops)
		return -ENOMEM;
	memset(&a, 0, sizeof(a));
	a.mask[1] = 1u << (FATTR4_MODE - 32);
	put32(&a, mode & 07777);
	ops[nops].argop = OP_CREATE;
	c = &ops[nops].nfs_argop4_u.opcreate;
	c->objtype.type = S_ISFIFO(mode) ? NF4FIFO : NF4SOCK;
	c->objname.utf8string_len = (u_int)strlen(base);
	c->objname.utf8string_val = (char *)base;
	c->createattrs.attrmask.bitmap4_len = 2;
	c->createattrs.attrmask.bitmap4_val = a.mask;
	c->createattrs.attr_vals.attrlist4_len = (u_int)a.len;
	c->createattrs.attr_vals.attrlist4_val = a.vals;
	rc = compound4(n, ops, nops + 1, &x);
	free(ops);
	return rc;
}

/* --- checks ------------------------------------------------------------ */

static void stat_of_nfs64(const struct nfs_stat_64 *s, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_dev = (dev_t)s->nfs_dev;
	st->st_ino = (ino_t)s->nfs_ino;
	st->st_mode = (mode_t)s->nfs_mode;
	st->st_nlink = (nlink_t)s->nfs_nlink;
	st->st_uid = (uid_t)s->nfs_uid;
	st->st_gid = (gid_t)s->nfs_gid;
	st->st_rdev = (dev_t)s->nfs_rdev;
	st->st_size = (off_t)s->nfs_size;
	st->st_blksize = (blksize_t)s->nfs_blksize;
	/* NFSv4's nfs_blocks of libnfs 4.0 is not in 512-byte units */
	st->st_blocks = (blkcnt_t)((s->nfs_used + 511) / 512);
	st->st_atim.tv_sec = (time_t)s->nfs_atime;
	st->st_atim.tv_nsec = (long)s->nfs_atime_nsec;
	st->st_mtim.tv_sec = (time_t)s->nfs_mtime;
	st->st_mtim.tv_nsec = (long)s->nfs_mtime_nsec;
	st->st_ctim.tv_sec = (time_t)s->nfs_ctime;
	st->st_ctim.tv_nsec = (long)s->nfs_ctime_nsec;
}

/* lstat of the first len bytes of path, by name (libnfs). */
static int lstat_name(struct nrmt *n, const char *path, size_t len,
		      struct stat *st)
{
	char p[PATH_BUF];
	struct nfs_stat_64 s;
	WAIT1(OUT_STAT, &s, sizeof(s));
	int rc;

	if (len + 2 > sizeof(p))
		return -ENAMETOOLONG;
	p[0] = '/';
	memcpy(p + 1, path, len);
	p[len + 1] = '\0';
	rc = run(n, &w, nfs_lstat64_async(n->nfs, p, done_cb, &w));
	if (rc == 0)
		stat_of_nfs64(&s, st);
	return rc;
}

/* Invariant 2: the components before the last one are directories. */
static int check_parent(struct nrmt *n, const char *path)
{
	size_t len = parent_len(path);

	if (len == 0)
		return 0; /* the root */
	if (n->version == 3)
		return walk3(n, path, len, true, NULL, NULL);
	return check_dirs4(n, path, len);
}

/* Every component of path is a directory (the path to list). */
static int check_dir(struct nrmt *n, const char *path)
{
	if (n->version == 3)
		return walk3(n, path, strlen(path), true, NULL, NULL);
	return check_dirs4(n, path, strlen(path));
}

/* lstat(2) of path, parents checked (invariant 2). */
static int stat_path(struct nrmt *n, const char *path, struct stat *st)
{
	fattr3 a;
	int rc;

	if (n->version == 3) {
		rc = walk3(n, path, strlen(path), false, NULL, &a);
		if (rc == 0)
			stat_of_fattr3(&a, st);
		return rc;
	}
	rc = check_parent(n, path);
	if (rc < 0)
		return rc;
	return lstat_name(n, path, strlen(path), st);
}

/* --- open files and silly renames -------------------------------------- */

/*
 * An NFS server removes a file at once, also while a client has it open,
 * and the client's handle then fails with ESTALE. The kernel client
 * renames such a file to a hidden name instead and removes that at the
 * last close ("silly rename"); so does this driver, for the files open on
 * any connection of this process (open_files):
 *
 *   nrmt_file_open() ---------> registered (of_get(): refs++)
 *   unlink, rename over it ---> if open and nlink == 1 (hide_if_open()):
 *                               RENAME to ".ferryfs.<ino>.<n>" in the same
 *                               directory instead
 *   last nrmt_file_close() ---> REMOVE the hidden name (of_put()): NFSv3 by
 *                               the directory's handle (a renamed directory
 *                               does not matter), NFSv4 by path
 *
 * As with ".nfsXXXX" files, the hidden name is listed while the file is
 * open, and a crash leaves it behind. A directory holding only hidden
 * names is not empty for the server: nrmt_rmdir() answers -EBUSY while
 * one of them is a file open here, and removes those of no open file. A
 * file opened on another connection between the check and the REMOVE is
 * removed (a narrow race the kernel client closes with its inode locks).
 */
struct openfile {
	struct openfile *next; /* protected by open_lock */
	char *share;           /* rmt_id() of the connections */
	dev_t dev;
	ino_t ino;
	unsigned int refs; /* protected by open_lock: open files, and pins */
	bool hidden;       /* protected by open_lock; set once */
	char hname[64];    /* the hidden name; set before hidden */
	char *hpath;       /* NFSv4: its path */
	struct nfs_fh3 hdir; /* NFSv3: its directory's handle, owned */
};

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct openfile *open_files; /* protected by open_lock */
static atomic_uint hidden_seq;

static struct openfile *of_find(struct nrmt *n, const struct stat *st)
{
	struct openfile *of;

	for (of = open_files; of; of = of->next)
		if (of->refs && of->ino == st->st_ino &&
		    of->dev == st->st_dev && !strcmp(of->share, n->base.id))
			return of; /* not one being closed (of_put()) */
	return NULL;
}

/* Register one more open of the file st is of; NULL: out of memory. */
static struct openfile *of_get(struct nrmt *n, const struct stat *st)
{
	struct openfile *of;

	pthread_mutex_lock(&open_lock);
	of = of_find(n, st); /* hidden too: opened again by that name */
	if (!of) {
		of = calloc(1, sizeof(*of));
		if (of)
			of->share = strdup(n->base.id);
		if (of && !of->share) {
			free(of);
			of = NULL;
		}
		if (of) {
			of->dev = st->st_dev;
			of->ino = st->st_ino;
			of->next = open_files;
			open_files = of;
		}
	}
	if (of)
		of->refs++;
	pthread_mutex_unlock(&open_lock);
	return of;
}

static bool any_open(struct nrmt *n)
{
	struct openfile *of;
	bool any = false;

	pthread_mutex_lock(&open_lock);
	for (of = open_files; of && !any; of = of->next)
		any = !strcmp(of->share, n->base.id);
	pthread_mutex_unlock(&open_lock);
	return any;
}

static void remove_hidden(struct nrmt *n, struct openfile *of)
{
	int rc;

	if (n->version == 3) {
		REMOVE3args a = { .object = { .dir = of->hdir,
					      .name = of->hname } };
		RAW1();

		rc = raw_run(n, &x,
			     rpc_nfs3_remove_async(n->rpc, remove3_cb, &a, &x));
	} else {
		WAIT1(OUT_NONE, NULL, 0);

		rc = run(n, &w, nfs_unlink_async(n->nfs, of->hpath, done_cb,
						 &w));
	}
	if (rc < 0 && rc != -ENOENT)
		LOG_WARN("nfs '%s': cannot remove '%s' of a file unlinked while open: %s",
			 n->base.id, of->hname, strerror(-rc));
}

/* Drop one reference; the last one removes the hidden name if any. It
 * stays in open_files until then: an rmdir of its directory on another
 * connection waits for that REMOVE (nrmt_rmdir()) instead of racing it. */
static void of_put(struct nrmt *n, struct openfile *of)
{
	struct openfile **pp;
	bool last, hidden;

	pthread_mutex_lock(&open_lock);
	last = --of->refs == 0;
	hidden = of->hidden;
	pthread_mutex_unlock(&open_lock);
	if (!last)
		return;
	if (hidden)
		remove_hidden(n, of);
	pthread_mutex_lock(&open_lock);
	for (pp = &open_files; *pp != of; pp = &(*pp)->next)
		;
	*pp = of->next;
	pthread_mutex_unlock(&open_lock);
	free(of->hdir.data.data_val);
	free(of->hpath);
	free(of->share);
	free(of);
}

/* Rename path to a hidden name in its directory; of is pinned. */
static int hide(struct nrmt *n, const char *path, struct openfile *of)
{
	size_t plen = parent_len(path);
	char from[PATH_BUF], to[PATH_BUF];
	struct nfs_fh3 dir = { { 0, NULL } };
	char hname[sizeof(of->hname)];
	int rc;

	snprintf(hname, sizeof(hname), ".ferryfs.%llx.%x",
		 (unsigned long long)of->ino,
		 atomic_fetch_add(&hidden_seq, 1) + 1);
	pthread_mutex_lock(&open_lock); /* nrmt_rmdir() reads it */
	memcpy(of->hname, hname, sizeof(hname));
	pthread_mutex_unlock(&open_lock);
	if (plen + 1 + strlen(of->hname) + 2 > sizeof(to))
		return -ENAMETOOLONG;
	abs_path(from, path);
	snprintf(to, sizeof(to), "/%.*s%s%s", (int)plen, path, plen ? "/" : "",
		 of->hname);
	if (n->version == 3) {
		rc = walk3(n, path, plen, true, &dir, NULL);
		if (rc < 0)
			return rc;
	}
	{
		WAIT1(OUT_NONE, NULL, 0);

		rc = run(n, &w, nfs_rename_async(n->nfs, from, to, done_cb,
						 &w));
	}
	if (rc == 0 && n->version == 4) {
		of->hpath = strdup(to);
		if (!of->hpath)
			rc = -ENOMEM; /* renamed, but never removed */
	}
	if (rc < 0) {
		free(dir.data.data_val);
		return rc;
	}
	of->hdir = dir;
	pthread_mutex_lock(&open_lock);
	of->hidden = true;
	pthread_mutex_unlock(&open_lock);
	return 0;
}

/*
 * Before path is removed or replaced: if it is a file open here with no
 * other link, hide it instead. Returns 1 if hidden (path is gone), 0 if
 * nothing was to do, or -errno.
 */
static int hide_if_open(struct nrmt *n, const char *path)
{
	struct openfile *of;
	struct stat st;
	int rc;

	if (!any_open(n))
		return 0;
	rc = stat_path(n, path, &st);
	if (rc < 0)
		return rc == -ENOENT ? 0 : rc;
	if (!S_ISREG(st.st_mode) || st.st_nlink != 1)
		return 0;
	pthread_mutex_lock(&open_lock);
	of = of_find(n, &st); /* none being closed */
	if (of && of->hidden)
		of = NULL;
	if (of)
		of->refs++; /* pinned: its last close waits for us */
	pthread_mutex_unlock(&open_lock);
	if (!of)
		return 0;
	rc = hide(n, path, of);
	of_put(n, of);
	return rc < 0 ? rc : 1;
}

/* --- the URL ----------------------------------------------------------- */

struct url {
	char host[256];     /* for nfs_mount(): no brackets */
	char path[PATH_MAX]; /* "/EXPORT[/path]", normalised */
	char args[256];     /* "?k=v&..." checked, for nfs_parse_url_dir() */
	int version;        /* 3 or 4 */
};

static bool all_digits(const char *s, size_t len)
{
	size_t i;

	if (len == 0 || len > 9)
		return false;
	for (i = 0; i < len; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	return true;
}

/* One "key=value" of the query; appended to u->args if good. */
static int parse_arg(const char *item, size_t len, struct url *u)
{
	static const struct {
		const char *key;
		long min, max;
	} keys[] = {
		{ "version", 3, 4 },  { "uid", 0, INT32_MAX },
		{ "gid", 0, INT32_MAX }, { "nfsport", 1, 65535 },
		{ "mountport", 1, 65535 },
	};
	const char *eq = memchr(item, '=', len);
	size_t klen, i, used;
	long v;

	if (!eq)
		return -EINVAL;
	klen = (size_t)(eq - item);
	if (!all_digits(eq + 1, len - klen - 1))
		return -EINVAL;
	v = strtol(eq + 1, NULL, 10);
	for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (strlen(keys[i].key) != klen ||
		    strncmp(item, keys[i].key, klen))
			continue;
		if (v < keys[i].min || v > keys[i].max)
			return -EINVAL;
		if (i == 0)
			u->version = (int)v;
		used = strlen(u->args);
		if (used + len + 2 >= sizeof(u->args))
			return -EINVAL;
		snprintf(u->args + used, sizeof(u->args) - used, "%c%.*s",
			 used ? '&' : '?', (int)len, item);
		return 0;
	}
	return -EINVAL;
}

/* Append the path [p, end) to u->path: '/' runs collapsed, no trailing
 * '/', no "." or ".." component; "/" if it has no component. */
static int parse_path(const char *p, const char *end, struct url *u)
{
	size_t plen = 0;

	while (p < end) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		size_t clen = slash ? (size_t)(slash - p) : (size_t)(end - p);

		if ((clen == 1 && p[0] == '.') ||
		    (clen == 2 && p[0] == '.' && p[1] == '.'))
			return -EINVAL;
		if (clen > 0) {
			if (plen + 1 + clen >= sizeof(u->path))
				return -ENAMETOOLONG;
			u->path[plen++] = '/';
			memcpy(u->path + plen, p, clen);
			plen += clen;
		}
		p += clen + 1;
	}
	if (plen == 0)
		u->path[plen++] = '/';
	u->path[plen] = '\0';
	return 0;
}

/* Split and check nfs://HOST/PATH[?QUERY] (see the top of this file). */
static int parse_url(const char *url, struct url *u)
{
	const char *p = url + sizeof("nfs://") - 1;
	const char *host_end, *q;
	size_t hlen;
	int rc;

	memset(u, 0, sizeof(*u));
	u->version = 3;
	if (strncmp(url, "nfs://", 6))
		return -EINVAL;
	if (strpbrk(url, "%#\\ \t\n"))
		return -EINVAL;
	if (*p == '[') {
		host_end = strchr(p, ']');
		if (!host_end || host_end == p + 1)
			return -EINVAL;
		hlen = (size_t)(host_end - p - 1);
		if (hlen >= sizeof(u->host) ||
		    strspn(p + 1, "0123456789abcdefABCDEF:.") != hlen)
			return -EINVAL;
		memcpy(u->host, p + 1, hlen);
		p = host_end + 1;
	} else {
		hlen = strspn(p, "abcdefghijklmnopqrstuvwxyz"
				 "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_");
		if (hlen == 0 || hlen >= sizeof(u->host))
			return -EINVAL;
		memcpy(u->host, p, hlen);
		p += hlen;
	}
	if (*p != '/')
		return -EINVAL; /* a port, or no path */
	q = strchr(p, '?');
	rc = parse_path(p, q ? q : p + strlen(p), u);
	if (rc < 0 || !q)
		return rc;
	for (p = q + 1; *p;) {
		size_t ilen = strcspn(p, "&");

		rc = ilen ? parse_arg(p, ilen, u) : 0;
		if (rc < 0)
			return rc;
		p += ilen;
		if (*p == '&')
			p++;
	}
	return 0;
}

#ifdef FERRYFS_FUZZ
/* tests/fuzz/fuzz_opts.c: parse_url() alone (remote_i.h) */
int rmt_nfs_parse_url_fuzz(const char *url)
{
	struct url u;

	return parse_url(url, &u);
}
#endif

/* --- the share --------------------------------------------------------- */

static const struct rmt_ops nfs_ops;

/* NFSv4: a client name and verifier of this connection only. */
static void set_v4_identity(struct nfs_context *nfs)
{
	static atomic_uint seq;
	char name[128], host[64] = "host", verifier[8];
	struct timespec ts;
	unsigned int i;

	gethostname(host, sizeof(host) - 1);
	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(name, sizeof(name), "ferryfs:%s:%d:%u:%lld.%09ld", host,
		 (int)getpid(), atomic_fetch_add(&seq, 1) + 1,
		 (long long)ts.tv_sec, ts.tv_nsec);
	nfs4_set_client_name(nfs, name);
	if (getrandom(verifier, sizeof(verifier), 0) !=
	    (ssize_t)sizeof(verifier)) {
		for (i = 0; i < sizeof(verifier); i++)
			verifier[i] = (char)(ts.tv_nsec >> (i * 3));
	}
	nfs4_set_verifier(nfs, verifier);
}

/* Mount; on failure the context is destroyed here (invariant 1). */
static int mount_ctx(struct nrmt *n, const struct url *u)
{
	WAIT1(OUT_NONE, NULL, 0);
	int rc;

	if (nfs_mount_async(n->nfs, u->host, u->path, done_cb, &w) != 0) {
		rc = nfs_err(n, NOT_QUEUED);
		goto out_fail;
	}
	rc = wait_until(n, w.left, now_ms() + MOUNT_TIMEOUT_MS, true);
	if (rc == 0)
		rc = nfs_err(n, w.status);
	if (rc == 0)
		return 0;
out_fail:
	LOG_ERR("cannot mount 'nfs://%s%s' (NFSv%d): %s: %s", u->host,
		u->path, u->version, strerror(-rc),
		nfs_get_error(n->nfs) ? nfs_get_error(n->nfs) : "");
	/* calls back whatever is still queued while w is alive */
	nfs_destroy_context(n->nfs);
	n->nfs = NULL;
	return rc;
}

/* A copy of the root's handle, checked (see struct nfs_fh). */
static int root_of(struct nrmt *n)
{
	const struct nfs_fh *fh = nfs_get_rootfh(n->nfs);
	int max = n->version == 3 ? FH3_MAX : FH4_MAX;

	if (!fh || fh->len <= 0 || fh->len > max || !fh->val) {
		LOG_ERR("nfs '%s': libnfs gave no usable root handle (not libnfs 4.0?)",
			n->base.id);
		return -EPROTO;
	}
	n->root.data.data_val = malloc((size_t)fh->len);
	if (!n->root.data.data_val)
		return -ENOMEM;
	memcpy(n->root.data.data_val, fh->val, (size_t)fh->len);
	n->root.data.data_len = (u_int)fh->len;
	return 0;
}

static size_t chunk_of(uint64_t max)
{
	if (max == 0 || max > RW_CHUNK_MAX)
		return max ? RW_CHUNK_MAX : 65536;
	return (size_t)max;
}

int rmt_nfs_open(const char *url, const char *opts, struct rmt **out)
{
	struct nfs_url *parsed;
	struct nrmt *n;
	struct url u;
	char *lurl;
	int rc;

	*out = NULL;
	if (opts && *opts) {
		LOG_ERR("unknown remote option '%s' for '%s'", opts, url);
		return -EINVAL;
	}
	rc = parse_url(url, &u);
	if (rc < 0) {
		LOG_ERR("invalid NFS URL '%s': want nfs://HOST/EXPORT[/path][?version=3|4&uid=N&gid=N&nfsport=N&mountport=N]",
			url);
		return rc;
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	if (asprintf(&n->base.id, "nfs://%s%s", u.host, u.path) < 0) {
		n->base.id = NULL;
		rc = -ENOMEM;
		goto out_n;
	}
	n->version = u.version;
	n->nfs = nfs_init_context();
	if (!n->nfs) {
		rc = -ENOMEM;
		goto out_id;
	}
	n->rpc = nfs_get_rpc_context(n->nfs);
	/* the checked query: version, uid, gid, ports, applied by libnfs */
	if (asprintf(&lurl, "nfs://%s%s%s", u.host, u.path, u.args) < 0) {
		rc = -ENOMEM;
		goto out_ctx;
	}
	parsed = nfs_parse_url_dir(n->nfs, lurl);
	free(lurl);
	if (!parsed) {
		rc = -EINVAL;
		LOG_ERR("invalid NFS URL '%s': %s", url,
			nfs_get_error(n->nfs));
		goto out_ctx;
	}
	nfs_destroy_url(parsed);
	nfs_set_dircache(n->nfs, 0); /* invariant 3 */
	nfs_set_autoreconnect(n->nfs, -1);
	if (n->version == 4)
		set_v4_identity(n->nfs);
	rc = mount_ctx(n, &u);
	if (rc < 0)
		goto out_id; /* the context is gone */
	/* NFSv4 mounts leave the RPC layer without reconnect */
	rpc_set_autoreconnect(n->rpc, -1);
	rc = root_of(n);
	if (rc < 0)
		goto out_ctx;
	if (n->version == 3) {
		n->rchunk = chunk_of(nfs_get_readmax(n->nfs));
		n->wchunk = chunk_of(nfs_get_writemax(n->nfs));
	} else {
		n->rchunk = RW_CHUNK_MAX; /* a short READ is read on */
		n->wchunk = V4_WRITE_CHUNK;
	}
	n->base.ops = &nfs_ops;
	n->base.caps = RMT_CAP_CLOSE_ERRORS | (RMT_CAPS_POSIX & ~RMT_CAP_EXCHANGE);
	LOG_DBG("nfs '%s': NFSv%d, reads of %zu, writes of %zu bytes",
		n->base.id, n->version, n->rchunk, n->wchunk);
	*out = &n->base;
	return 0;

out_ctx:
	nfs_destroy_context(n->nfs);
out_id:
	free(n->base.id);
out_n:
	free(n);
	return rc;
}

/* remote.c frees r->id after this; every file is closed. */
static void nrmt_close(struct rmt *r)
{
	struct nrmt *n = to_nrmt(r);

	nfs_destroy_context(n->nfs);
	free(n->root.data.data_val);
	free(n);
}

static int nrmt_statfs(struct rmt *r, struct statvfs *sv)
{
	struct nrmt *n = to_nrmt(r);
	struct nfs_statvfs_64 s;
	WAIT1(OUT_STATVFS, &s, sizeof(s));
	int rc;

	rc = run(n, &w, nfs_statvfs64_async(n->nfs, "/", done_cb, &w));
	if (rc < 0)
		return rc;
	memset(sv, 0, sizeof(*sv));
	sv->f_bsize = s.f_bsize;
	sv->f_frsize = s.f_frsize ? s.f_frsize : s.f_bsize;
	sv->f_blocks = s.f_blocks;
	sv->f_bfree = s.f_bfree;
	sv->f_bavail = s.f_bavail;
	sv->f_files = s.f_files;
	sv->f_ffree = s.f_ffree;
	sv->f_favail = s.f_favail;
	sv->f_fsid = s.f_fsid;
	sv->f_flag = s.f_flag;
	sv->f_namemax = s.f_namemax ? s.f_namemax : NAME_MAX;
	return 0;
}

/* --- names ------------------------------------------------------------- */

static int nrmt_stat(struct rmt *r, const char *path, struct stat *st)
{
	return stat_path(to_nrmt(r), path, st);
}

static int nrmt_readdir(struct rmt *r, const char *path, rmt_dirent_fn fn,
		       void *arg)
{
	struct nrmt *n = to_nrmt(r);
	struct nfsdirent *de;
	struct nfsdir *dir = NULL;
	char p[PATH_BUF];
	int rc;

	rc = check_dir(n, path);
	if (rc < 0)
		return rc;
	abs_path(p, path);
	{
		WAIT1(OUT_PTR, &dir, 0);

		rc = run(n, &w, nfs_opendir_async(n->nfs, p, done_cb, &w));
		if (rc < 0)
			return rc;
	}
	while ((de = nfs_readdir(n->nfs, dir))) {
		struct stat st;

		if (!strcmp(de->name, ".") || !strcmp(de->name, ".."))
			continue;
		if (n->version == 4) {
			/* libnfs 4.0's NFSv4 entries have no inode numbers */
			char *sub = malloc(strlen(path) + strlen(de->name) + 2);

			if (!sub) {
				rc = -ENOMEM;
				break;
			}
			sprintf(sub, "%s%s%s", path, *path ? "/" : "",
				de->name);
			rc = lstat_name(n, sub, strlen(sub), &st);
			free(sub);
			if (rc == 0)
				rc = fn(de->name, &st, arg);
			else if (rc == -ENOENT)
				rc = fn(de->name, NULL, arg);
		} else if (!(de->mode & S_IFMT)) {
			/* no type: the server sent no attributes for it */
			rc = fn(de->name, NULL, arg);
		} else {
			memset(&st, 0, sizeof(st));
			st.st_dev = (dev_t)de->dev;
			st.st_ino = (ino_t)de->inode;
			st.st_mode = (mode_t)de->mode;
			st.st_nlink = de->nlink;
			st.st_uid = de->uid;
			st.st_gid = de->gid;
			st.st_rdev = (dev_t)de->rdev;
			st.st_size = (off_t)de->size;
			st.st_blksize = (blksize_t)de->blksize;
			st.st_blocks = (blkcnt_t)de->blocks;
			st.st_atim.tv_sec = de->atime.tv_sec;
			st.st_atim.tv_nsec = de->atime_nsec;
			st.st_mtim.tv_sec = de->mtime.tv_sec;
			st.st_mtim.tv_nsec = de->mtime_nsec;
			st.st_ctim.tv_sec = de->ctime.tv_sec;
			st.st_ctim.tv_nsec = de->ctime_nsec;
			rc = fn(de->name, &st, arg);
		}
		if (rc < 0)
			break;
		rc = 0;
	}
	nfs_closedir(n->nfs, dir);
	return rc;
}

/* The call of a name op on "/" + path, after the parent check. */
#define NAME_OP(n, path, call)                                   \
	do {                                                     \
		char p[PATH_BUF];                                \
		WAIT1(OUT_NONE, NULL, 0);                        \
		int rc_ = check_parent(n, path);                 \
		if (rc_ < 0)                                     \
			return rc_;                              \
		abs_path(p, path);                               \
		return run(n, &w, call);                         \
	} while (0)

static int nrmt_mkdir(struct rmt *r, const char *path, mode_t mode)
{
	struct nrmt *n = to_nrmt(r);

	NAME_OP(n, path,
		nfs_mkdir2_async(n->nfs, p, (int)(mode & 07777), done_cb, &w));
}

/* NFSv4 has one REMOVE for both: libnfs 4.0's rmdir removes a file and
 * its unlink an empty directory. So look first (racy, but the type of a
 * name seldom changes under it). */
static int check_type4(struct nrmt *n, const char *path, bool dir)
{
	struct stat st;
	int rc;

	if (n->version != 4)
		return 0;
	rc = stat_path(n, path, &st);
	if (rc < 0)
		return rc;
	if (dir && !S_ISDIR(st.st_mode))
		return -ENOTDIR;
	if (!dir && S_ISDIR(st.st_mode))
		return -EISDIR;
	return 0;
}

static int rmdir_once(struct nrmt *n, const char *path)
{
	NAME_OP(n, path, nfs_rmdir_async(n->nfs, p, done_cb, &w));
}

static int unlink_once(struct nrmt *n, const char *path)
{
	NAME_OP(n, path, nfs_unlink_async(n->nfs, p, done_cb, &w));
}

struct hidden_scan {
	struct nrmt *n;
	const char *dir;
	bool other; /* a name that is not a hidden one */
	bool busy;  /* a hidden name of a file open here */
	int rc;     /* of removing a stale hidden name */
};

static int hidden_one(const char *name, const struct stat *st, void *arg)
{
	struct hidden_scan *h = arg;
	char path[PATH_BUF];
	struct openfile *of;
	bool ours = false;
	int rc;

	(void)st;
	if (strncmp(name, ".ferryfs.", 9)) {
		h->other = true;
		return -ECANCELED; /* really not empty: stop */
	}
	pthread_mutex_lock(&open_lock);
	for (of = open_files; of && !ours; of = of->next)
		ours = !strcmp(of->share, h->n->base.id) &&
		       !strcmp(of->hname, name); /* hidden, or being so */
	pthread_mutex_unlock(&open_lock);
	if (ours) {
		h->busy = true;
		return 0;
	}
	/* left behind by a process that ended without its last close */
	if (snprintf(path, sizeof(path), "%s/%s", h->dir, name) >=
	    (int)sizeof(path))
		return -ENAMETOOLONG;
	rc = unlink_once(h->n, path);
	if (rc < 0 && rc != -ENOENT)
		h->rc = rc;
	return 0;
}

/*
 * A directory that holds only hidden names (open files unlinked here, see
 * "silly renames") is not empty for the server. Those of no open file,
 * which a killed process left behind, are removed, and the rmdir is made
 * again. Those of files still open here are waited for a little (a
 * close(2) just made reaches us as an asynchronous RELEASE:
 * RMT_BUSY_TRIES), then make the rmdir -EBUSY: it
 * can succeed once they are closed (the flusher tries again later).
 */
static int nrmt_rmdir(struct rmt *r, const char *path)
{
	struct nrmt *n = to_nrmt(r);
	int rc = check_type4(n, path, true);

	if (rc < 0)
		return rc;
	rc = rmdir_once(n, path);
	for (int tries = 1; rc == -ENOTEMPTY; tries++) {
		struct hidden_scan h = { .n = n, .dir = path };

		rc = nrmt_readdir(r, path, hidden_one, &h);
		if (h.other)
			return -ENOTEMPTY;
		if (rc < 0)
			return rc; /* not the server's ENOTEMPTY: its own */
		if (h.rc < 0)
			return h.rc;
		if (tries > RMT_BUSY_TRIES) /* the server may see more */
			return h.busy ? -EBUSY : -ENOTEMPTY;
		if (h.busy)
			usleep((useconds_t)tries * RMT_BUSY_WAIT_US);
		rc = rmdir_once(n, path);
	}
	return rc;
}

static int nrmt_unlink(struct rmt *r, const char *path)
{
	struct nrmt *n = to_nrmt(r);
	int rc = check_type4(n, path, false);

	if (rc == 0)
		rc = hide_if_open(n, path); /* open here: hidden instead */
	if (rc != 0)
		return rc < 0 ? rc : 0;
	return unlink_once(n, path);
}

static int nrmt_mknod(struct rmt *r, const char *path, mode_t mode, dev_t rdev)
{
	struct nrmt *n = to_nrmt(r);

	(void)rdev; /* fifos and sockets have none */
	if (!S_ISFIFO(mode) && !S_ISSOCK(mode))
		return -EPERM;
	if (n->version == 4) {
		int rc = check_parent(n, path);

		return rc < 0 ? rc : mknod4(n, path, mode);
	}
	NAME_OP(n, path,
		nfs_mknod_async(n->nfs, p, (int)(mode & (S_IFMT | 07777)), 0,
				done_cb, &w));
}

/* The target is data: stored verbatim, never resolved here. */
static int nrmt_symlink(struct rmt *r, const char *target, const char *path)
{
	struct nrmt *n = to_nrmt(r);

	NAME_OP(n, path,
		nfs_symlink_async(n->nfs, target, p, done_cb, &w));
}

static int nrmt_readlink(struct rmt *r, const char *path, char *buf,
			size_t size)
{
	struct nrmt *n = to_nrmt(r);
	char p[PATH_BUF], *tmp = NULL; /* NFSv4: the copy is st_size */
	struct stat st;
	int rc;

	rc = check_parent(n, path);
	if (rc < 0)
		return rc;
	if (n->version == 4) {
		/* libnfs 4.0 does not NUL-terminate an NFSv4 target: take
		 * its length from lstat and copy that many bytes */
		rc = lstat_name(n, path, strlen(path), &st);
		if (rc < 0)
			return rc;
		if (!S_ISLNK(st.st_mode))
			return -EINVAL;
		if ((size_t)st.st_size >= size)
			return -ENAMETOOLONG;
		tmp = buf;
	}
	abs_path(p, path);
	{
		WAIT1(tmp ? OUT_FIXED : OUT_STR, buf,
		      tmp ? (size_t)st.st_size : size);

		rc = run(n, &w, nfs_readlink_async(n->nfs, p, done_cb, &w));
	}
	if (tmp && rc >= 0) {
		buf[st.st_size] = '\0';
		rc = (int)st.st_size;
	}
	return rc;
}

static int link3(struct nrmt *n, const char *from, const char *to)
{
	struct nfs_fh3 file, dir;
	char name[NAME_MAX + 1];
	size_t plen = parent_len(to);
	const char *base = plen ? to + plen + 1 : to;
	fattr3 a;
	int rc;

	rc = walk3(n, from, strlen(from), false, &file, &a);
	if (rc < 0)
		return rc;
	if (a.type == NF3DIR) {
		rc = -EPERM; /* link(2) of a directory */
		goto out_file;
	}
	rc = walk3(n, to, plen, true, &dir, NULL);
	if (rc < 0)
		goto out_file;
	strcpy(name, base); /* a checked component: <= NAME_MAX */
	{
		LINK3args args = { .file = file,
				   .link = { .dir = dir, .name = name } };
		RAW1();

		rc = raw_run(n, &x,
			     rpc_nfs3_link_async(n->rpc, link3_cb, &args, &x));
	}
	free(dir.data.data_val);
out_file:
	free(file.data.data_val);
	return rc;
}

/* By handle (walk3(), link4()): a symlink is linked, not its target. */
static int nrmt_link(struct rmt *r, const char *from, const char *to)
{
	struct nrmt *n = to_nrmt(r);

	return n->version == 3 ? link3(n, from, to) : link4(n, from, to);
}

static int nrmt_rename(struct rmt *r, const char *from, const char *to,
		      unsigned int flags)
{
	struct nrmt *n = to_nrmt(r);
	char pf[PATH_BUF];
	struct stat st;
	int rc;

	if (flags & RMT_RENAME_EXCHANGE)
		return -EINVAL; /* NFS has no atomic exchange */
	rc = check_parent(n, from);
	if (rc < 0)
		return rc;
	if (flags & RMT_RENAME_NOREPLACE) {
		/* not atomic: see the top of this file */
		rc = check_parent(n, to);
		if (rc == 0)
			rc = nrmt_stat(r, to, &st);
		if (rc == 0)
			return -EEXIST;
		if (rc != -ENOENT)
			return rc;
	} else {
		rc = hide_if_open(n, to); /* a replaced file open here */
		if (rc < 0)
			return rc;
	}
	abs_path(pf, from);
	NAME_OP(n, to, nfs_rename_async(n->nfs, pf, p, done_cb, &w));
}

/* --- attributes -------------------------------------------------------- */

/* The handle libnfs keeps in an open file (see struct nfs_fh). */
static int fh_of(struct nrmt *n, struct nfile *nf, struct nfs_fh3 *fh)
{
	const struct nfs_fh *h = nfs_get_fh(nf->fh);
	int max = n->version == 3 ? FH3_MAX : FH4_MAX;

	if (!h || h->len <= 0 || h->len > max || !h->val)
		return -EPROTO;
	fh->data.data_len = (u_int)h->len;
	fh->data.data_val = h->val;
	return 0;
}

/* One nfstime3 setting of a struct rmt_setattr time. */
static int time3(const struct timespec *ts, bool set, set_atime *out)
{
	memset(out, 0, sizeof(*out));
	if (!set || ts->tv_nsec == UTIME_OMIT) {
		out->set_it = DONT_CHANGE;
		return 0;
	}
	if (ts->tv_nsec == UTIME_NOW) {
		out->set_it = SET_TO_SERVER_TIME;
		return 0;
	}
	if (ts->tv_sec < 0 || (uint64_t)ts->tv_sec > UINT32_MAX ||
	    ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000)
		return -EINVAL;
	out->set_it = SET_TO_CLIENT_TIME;
	out->set_atime_u.atime.seconds = (uint32_t)ts->tv_sec;
	out->set_atime_u.atime.nseconds = (uint32_t)ts->tv_nsec;
	return 0;
}

static int setattr3_call(struct nrmt *n, const struct nfs_fh3 *fh,
			 const sattr3 *sa)
{
	SETATTR3args args = { .object = *fh, .new_attributes = *sa };
	RAW1();

	return raw_run(n, &x,
		       rpc_nfs3_setattr_async(n->rpc, setattr3_cb, &args, &x));
}

/* NFSv3: one SETATTR by handle, times in a second one after the rest. */
static int setattr3(struct nrmt *n, const char *path, struct rmt_file *f,
		    const struct rmt_setattr *sa)
{
	bool times = sa->set & (RMT_SET_ATIME | RMT_SET_MTIME);
	struct nfs_fh3 fh = { { 0, NULL } };
	set_atime at, mt;
	sattr3 s = { 0 };
	fattr3 a = { .type = NF3REG };
	int rc;

	rc = time3(&sa->atime, sa->set & RMT_SET_ATIME, &at);
	if (rc == 0)
		rc = time3(&sa->mtime, sa->set & RMT_SET_MTIME, &mt);
	if (rc < 0)
		return rc;
	if (f) {
		rc = fh_of(n, to_nfile(f), &fh);
		if (rc < 0)
			return rc;
	} else {
		rc = walk3(n, path, strlen(path), false, &fh, &a);
		if (rc < 0)
			return rc;
	}
	if (sa->set & RMT_SET_SIZE) {
		if (a.type != NF3REG) {
			rc = a.type == NF3DIR ? -EISDIR : -EINVAL;
			goto out;
		}
		s.size.set_it = 1;
		s.size.set_size3_u.size = (uint64_t)sa->size;
	}
	if (sa->set & RMT_SET_MODE) {
		if (a.type == NF3LNK) {
			rc = -EOPNOTSUPP;
			goto out;
		}
		s.mode.set_it = 1;
		s.mode.set_mode3_u.mode = sa->mode & 07777;
	}
	if (sa->set & RMT_SET_UID) {
		s.uid.set_it = 1;
		s.uid.set_uid3_u.uid = sa->uid;
	}
	if (sa->set & RMT_SET_GID) {
		s.gid.set_it = 1;
		s.gid.set_gid3_u.gid = sa->gid;
	}
	/* remote.h: owner before mode. A server may apply one SETATTR's
	 * fields in any order, and a chown clears the setuid and setgid
	 * bits: a mode with them goes in a SETATTR of its own, after. */
	if (s.mode.set_it && (s.uid.set_it || s.gid.set_it) &&
	    (sa->mode & (S_ISUID | S_ISGID))) {
		s.mode.set_it = 0;
		rc = setattr3_call(n, &fh, &s);
		if (rc < 0)
			goto out;
		memset(&s, 0, sizeof(s));
		s.mode.set_it = 1;
		s.mode.set_mode3_u.mode = sa->mode & 07777;
	}
	if (s.size.set_it || s.mode.set_it || s.uid.set_it || s.gid.set_it) {
		rc = setattr3_call(n, &fh, &s);
		if (rc < 0)
			goto out;
		memset(&s, 0, sizeof(s));
	}
	if (times && (at.set_it != DONT_CHANGE || mt.set_it != DONT_CHANGE)) {
		s.atime = at;
		/* set_mtime has the layout of set_atime */
		s.mtime.set_it = mt.set_it;
		s.mtime.set_mtime_u.mtime.seconds =
			mt.set_atime_u.atime.seconds;
		s.mtime.set_mtime_u.mtime.nseconds =
			mt.set_atime_u.atime.nseconds;
		rc = setattr3_call(n, &fh, &s);
	}
out:
	if (!f)
		free(fh.data.data_val);
	return rc;
}

/*
 * NFSv4: SETATTRs of our own (attrs4_of(), setattr4_call()) on the object
 * found by LOOKUPs from the root, or on the open file's handle: libnfs
 * 4.0's calls by name OPEN the file for writing (no directory, a symlink
 * followed, and a second OPEN that spoils ours of the same file), take
 * microseconds and have no futimes. The size of an open file goes through
 * libnfs (its stateid); the rest uses the anonymous stateid.
 */
static int setattr4(struct nrmt *n, const char *path, struct rmt_file *f,
		    const struct rmt_setattr *sa)
{
	struct rmt_setattr rest = *sa;
	const char *rel = "";
	uint32_t type = NF4REG;
	struct nfs_fh3 fh;
	struct attrs4 a;
	size_t len = 0;
	int rc;

	if (f) {
		rc = fh_of(n, to_nfile(f), &fh);
		if (rc < 0)
			return rc;
		if (sa->set & RMT_SET_SIZE) {
			WAIT1(OUT_NONE, NULL, 0);

			rc = run(n, &w, nfs_ftruncate_async(n->nfs,
							    to_nfile(f)->fh,
							    (uint64_t)sa->size,
							    done_cb, &w));
			if (rc < 0)
				return rc;
			rest.set &= ~(unsigned int)RMT_SET_SIZE;
		}
	} else {
		fh = n->root;
		rel = path;
		len = strlen(path);
		rc = walk4(n, path, len, &type);
		if (rc < 0)
			return rc;
		if ((sa->set & RMT_SET_SIZE) && type != NF4REG)
			return type == NF4DIR ? -EISDIR : -EINVAL;
	}
	if ((sa->set & RMT_SET_MODE) && type == NF4LNK)
		return -EOPNOTSUPP;
	/* owner before a mode with setuid/setgid: as in setattr3() */
	if ((rest.set & RMT_SET_MODE) &&
	    (rest.set & (RMT_SET_UID | RMT_SET_GID)) &&
	    (rest.mode & (S_ISUID | S_ISGID))) {
		rest.set &= ~(unsigned int)RMT_SET_MODE;
		if (attrs4_of(&rest, false, &a)) {
			rc = setattr4_call(n, &fh, rel, len, &a);
			if (rc < 0)
				return rc;
		}
		rest.set = RMT_SET_MODE;
	}
	if (attrs4_of(&rest, false, &a)) {
		rc = setattr4_call(n, &fh, rel, len, &a);
		if (rc < 0)
			return rc;
	}
	if (attrs4_of(sa, true, &a))
		rc = setattr4_call(n, &fh, rel, len, &a);
	return rc;
}

static int nrmt_setattr(struct rmt *r, const char *path, struct rmt_file *f,
		       const struct rmt_setattr *sa)
{
	struct nrmt *n = to_nrmt(r);

	if (n->version == 3)
		return setattr3(n, path, f, sa);
	return setattr4(n, path, f, sa);
}

/* No RMT_CAP_XATTR: remote.c answers before these could be called. */
/* --- files ------------------------------------------------------------- */

static int fstat64_of(struct nrmt *n, struct nfsfh *fh, struct stat *st)
{
	struct nfs_stat_64 s;
	WAIT1(OUT_STAT, &s, sizeof(s));
	int rc;

	rc = run(n, &w, nfs_fstat64_async(n->nfs, fh, done_cb, &w));
	if (rc == 0)
		stat_of_nfs64(&s, st);
	return rc;
}

static int close_fh(struct nrmt *n, struct nfsfh *fh)
{
	WAIT1(OUT_NONE, NULL, 0);

	return run(n, &w, nfs_close_async(n->nfs, fh, done_cb, &w));
}

/* COMMIT, if anything was written since the last one (invariant 4). */
static int commit(struct nrmt *n, struct nfile *nf)
{
	WAIT1(OUT_NONE, NULL, 0);
	int rc;

	if (!nf->dirty)
		return 0;
	rc = run(n, &w, nfs_fsync_async(n->nfs, nf->fh, done_cb, &w));
	if (rc == 0)
		nf->dirty = false;
	return rc;
}

/* open(2) of an existing file, or an O_EXCL create; O_NOFOLLOW always. */
static int open_fh(struct nrmt *n, const char *p, int flags, mode_t mode,
		   struct nfsfh **fh)
{
	WAIT1(OUT_PTR, fh, 0);

	return run(n, &w,
		   nfs_open2_async(n->nfs, p, flags | O_NOFOLLOW,
				   (int)(mode & 07777), done_cb, &w));
}

/*
 * Open with the caller's access mode, but O_RDWR for O_WRONLY (and with
 * NFSv4 for O_RDONLY too) where the file allows it (fs/ may read through a
 * write handle; an NFSv4 write-only open cannot read). O_CREAT without
 * O_EXCL is an open, then an O_EXCL create if there was nothing, then an
 * open again if another client created it meanwhile: libnfs's UNCHECKED
 * create would set the mode of a file that exists.
 */
static int open_file(struct nrmt *n, const char *p, int flags, mode_t mode,
		     struct nfsfh **fh, bool *created, int *acc_used)
{
	bool excl = (flags & (O_CREAT | O_EXCL)) == (O_CREAT | O_EXCL);
	int want = flags & O_ACCMODE;
	/* NFSv4: read-only too, so that every open can share it (reuse4) */
	int acc = want == O_WRONLY || n->version == 4 ? O_RDWR : want;
	int tries, rc = -ENOENT;

	*created = false;
	for (tries = 0; tries < 3; tries++) {
		if (!excl) {
			*acc_used = acc;
			rc = open_fh(n, p, acc, 0, fh);
			if (rc == -EACCES && acc != want) {
				*acc_used = want;
				rc = open_fh(n, p, want, 0, fh);
			}
			if (rc != -ENOENT || !(flags & O_CREAT))
				return rc;
		}
		*acc_used = acc;
		rc = open_fh(n, p, acc | O_CREAT | O_EXCL, mode, fh);
		if (rc == -EACCES && acc != want) {
			*acc_used = want;
			rc = open_fh(n, p, want | O_CREAT | O_EXCL, mode, fh);
		}
		if (rc == 0)
			*created = true;
		if (rc != -EEXIST || excl)
			return rc;
	}
	return rc;
}

/*
 * NFSv4: a second OPEN of a file by the same client (libnfs uses one open
 * owner per context) changes the state of the first, whose CLOSE then
 * fails (NFS4ERR_OLD_STATEID) and spoils the next ones. So on one
 * connection a file is OPENed once and shared (refcounted) by its opens:
 * if path is a file open here with an access that fits, nf gets its
 * handle and 1 is returned (*st: its lstat); 0 if it must be opened.
 */
static int reuse4(struct nrmt *n, const char *path, int flags,
		  struct nfile *nf, struct stat *st)
{
	struct share4 *sh;
	int rc;

	if (!n->shares)
		return 0; /* nothing open here: no lookup */
	rc = lstat_name(n, path, strlen(path), st);
	if (rc < 0)
		return rc == -ENOENT ? 0 : rc;
	if (!S_ISREG(st->st_mode))
		return 0; /* the OPEN says what it is */
	if ((flags & (O_CREAT | O_EXCL)) == (O_CREAT | O_EXCL))
		return -EEXIST;
	for (sh = n->shares; sh; sh = sh->next) {
		if (sh->dev != st->st_dev || sh->ino != st->st_ino ||
		    (!sh->rdwr && (flags & O_ACCMODE) != O_RDONLY))
			continue;
		sh->refs++;
		nf->sh = sh;
		nf->fh = sh->fh;
		return 1;
	}
	return 0;
}

/* NFSv4: share a new OPEN (see reuse4()); -ENOMEM leaves it unshared. */
static int share_new4(struct nrmt *n, struct nfile *nf, const struct stat *st,
		      int acc)
{
	struct share4 *sh = calloc(1, sizeof(*sh));

	if (!sh)
		return -ENOMEM;
	sh->dev = st->st_dev;
	sh->ino = st->st_ino;
	sh->fh = nf->fh;
	sh->rdwr = acc == O_RDWR;
	sh->refs = 1;
	sh->next = n->shares;
	n->shares = sh;
	nf->sh = sh;
	return 0;
}

/* Close nf's handle, or drop its share of it (NFSv4). */
static int close_nf(struct nrmt *n, struct nfile *nf)
{
	struct share4 **pp, *sh = nf->sh;
	int rc;

	if (!sh)
		return close_fh(n, nf->fh); /* COMMITs what was written */
	rc = commit(n, nf);
	if (--sh->refs > 0)
		return rc;
	for (pp = &n->shares; *pp != sh; pp = &(*pp)->next)
		;
	*pp = sh->next;
	{
		int crc = close_fh(n, sh->fh);

		rc = rc < 0 ? rc : crc;
	}
	free(sh);
	return rc;
}

static int nrmt_file_open(struct rmt *r, const char *path, int flags,
			  mode_t mode, struct rmt_file **out)
{
	struct nrmt *n = to_nrmt(r);
	bool created = false;
	char p[PATH_BUF];
	struct nfile *nf;
	struct stat st;
	int rc, acc;

	if ((flags & O_ACCMODE) == O_ACCMODE)
		return -EINVAL;
	rc = check_parent(n, path);
	if (rc < 0)
		return rc;
	/* before the open: an O_EXCL create must not be undone by ENOMEM */
	nf = calloc(1, sizeof(*nf));
	if (!nf)
		return -ENOMEM;
	rc = n->version == 4 ? reuse4(n, path, flags, nf, &st) : 0;
	if (rc < 0)
		goto out_nf;
	if (rc == 0) {
		abs_path(p, path);
		rc = open_file(n, p, flags, mode, &nf->fh, &created, &acc);
		if (rc == -ELOOP && n->version == 4 &&
		    lstat_name(n, path, strlen(path), &st) == 0 &&
		    !S_ISLNK(st.st_mode))
			rc = -EINVAL; /* OPEN of a fifo: NFS4ERR_SYMLINK */
		if (rc < 0)
			goto out_nf;
		rc = fstat64_of(n, nf->fh, &st);
		if (rc == 0 && !S_ISREG(st.st_mode))
			rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		if (rc == 0 && n->version == 4)
			rc = share_new4(n, nf, &st, acc);
		if (rc < 0) {
			close_fh(n, nf->fh);
			goto out_nf;
		}
	}
	if (created && (st.st_mode & 07777) != (mode & 07777)) {
		/* NFSv4 OPEN of libnfs 4.0 creates with mode 0600 */
		WAIT1(OUT_NONE, NULL, 0);

		rc = run(n, &w, nfs_fchmod_async(n->nfs, nf->fh,
						 (int)(mode & 07777), done_cb,
						 &w));
		if (rc < 0)
			goto out_close;
	}
	if ((flags & O_TRUNC) && !created && st.st_size != 0) {
		WAIT1(OUT_NONE, NULL, 0);

		rc = run(n, &w, nfs_ftruncate_async(n->nfs, nf->fh, 0, done_cb,
						    &w));
		if (rc < 0)
			goto out_close;
	}
	nf->of = of_get(n, &st);
	if (!nf->of) {
		rc = -ENOMEM;
		goto out_close;
	}
	nf->base.r = r;
	*out = &nf->base;
	return 0;

out_close:
	close_nf(n, nf);
out_nf:
	free(nf);
	return rc;
}

static int nrmt_file_close(struct rmt_file *f)
{
	struct nrmt *n = to_nrmt(f->r);
	struct nfile *nf = to_nfile(f);
	int rc;

	rc = close_nf(n, nf);
	of_put(n, nf->of);
	free(nf);
	return rc;
}

/* One request of an io_batch(). */
struct io {
	struct wait w;
	off_t off;
	size_t len;
};

/*
 * Read or write [off, off + len) as requests of at most one chunk, up to
 * IO_BATCH_MAX and IO_WINDOW bytes in flight, then wait for all. Returns
 * the bytes done from off on without a gap (short: a short request), or
 * the first error; *short_io says a request came back short.
 */
static ssize_t io_batch(struct nrmt *n, struct nfile *nf, bool wr, char *buf,
			size_t len, off_t off, bool *short_io)
{
	size_t chunk = wr ? n->wchunk : n->rchunk;
	size_t max = IO_WINDOW / chunk;
	struct io io[IO_BATCH_MAX];
	size_t k, i, done = 0;
	int left = 0, qerr = 0;

	if (max < 1)
		max = 1;
	if (max > IO_BATCH_MAX)
		max = IO_BATCH_MAX;
	for (k = 0; k < max && k * chunk < len; k++) {
		size_t pos = k * chunk;
		int q;

		io[k].off = off + (off_t)pos;
		io[k].len = len - pos < chunk ? len - pos : chunk;
		io[k].w = (struct wait){ .left = &left,
					 .kind = wr ? OUT_NONE : OUT_BYTES,
					 .out = buf + pos,
					 .size = io[k].len };
		left++;
		q = wr ? nfs_pwrite_async(n->nfs, nf->fh, (uint64_t)io[k].off,
					  io[k].len, buf + pos, done_cb,
					  &io[k].w)
		       : nfs_pread_async(n->nfs, nf->fh, (uint64_t)io[k].off,
					 io[k].len, done_cb, &io[k].w);
		if (q != 0) {
			left--;
			qerr = nfs_err(n, NOT_QUEUED);
			break;
		}
	}
	wait_until(n, &left, 0, false);
	*short_io = false;
	for (i = 0; i < k; i++) {
		if (io[i].w.status < 0)
			return nfs_err(n, io[i].w.status);
		done += (size_t)io[i].w.status;
		if ((size_t)io[i].w.status < io[i].len) {
			*short_io = true;
			return (ssize_t)done;
		}
	}
	if (qerr < 0 && done == 0)
		return qerr;
	return (ssize_t)done;
}

/* As sys_pread_all(): short only at EOF; an error after progress is the
 * error. */
static ssize_t nrmt_file_pread(struct rmt_file *f, void *buf, size_t len,
			      off_t off)
{
	struct nrmt *n = to_nrmt(f->r);
	size_t done = 0;
	bool short_io;

	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	while (done < len) {
		ssize_t got = io_batch(n, to_nfile(f), false,
				       (char *)buf + done, len - done,
				       off + (off_t)done, &short_io);

		if (got < 0)
			return got;
		done += (size_t)got;
		if (got == 0)
			break; /* EOF */
		/* NFSv3 (libnfs reads on after a short reply that is not at
		 * EOF): short is EOF. NFSv4: read on to see */
		if (short_io && n->version == 3)
			break;
	}
	return (ssize_t)done;
}

/* Writes all of buf or fails (remote.h). */
static ssize_t nrmt_file_pwrite(struct rmt_file *f, const void *buf,
			       size_t len, off_t off)
{
	struct nrmt *n = to_nrmt(f->r);
	struct nfile *nf = to_nfile(f);
	size_t done = 0;
	bool short_io;

	if (len > SSIZE_MAX)
		return -EINVAL;
	nf->dirty = true; /* invariant 4: before, a failure may leave bytes */
	while (done < len) {
		ssize_t put = io_batch(n, nf, true, (char *)buf + done,
				       len - done, off + (off_t)done,
				       &short_io);

		if (put < 0)
			return put;
		if (put == 0)
			return -EIO; /* the server took nothing */
		done += (size_t)put;
	}
	return (ssize_t)len;
}

static int nrmt_file_stat(struct rmt_file *f, struct stat *st)
{
	return fstat64_of(to_nrmt(f->r), to_nfile(f)->fh, st);
}

static int nrmt_file_fsync(struct rmt_file *f, bool datasync)
{
	(void)datasync; /* COMMIT is both */
	return commit(to_nrmt(f->r), to_nfile(f));
}

/* close(2) of one descriptor: commit, as the kernel client does, so that
 * errors of UNSTABLE writes show at close. */
static int nrmt_file_flush(struct rmt_file *f)
{
	return commit(to_nrmt(f->r), to_nfile(f));
}

static const struct rmt_ops nfs_ops = {
	.name = "nfs",
	.close = nrmt_close,
	.stat = nrmt_stat,
	.statfs = nrmt_statfs,
	.readdir = nrmt_readdir,
	.mkdir = nrmt_mkdir,
	.rmdir = nrmt_rmdir,
	.unlink = nrmt_unlink,
	.mknod = nrmt_mknod,
	.symlink = nrmt_symlink,
	.readlink = nrmt_readlink,
	.link = nrmt_link,
	.rename = nrmt_rename,
	.setattr = nrmt_setattr,
	.file_open = nrmt_file_open,
	.file_close = nrmt_file_close,
	.file_pread = nrmt_file_pread,
	.file_pwrite = nrmt_file_pwrite,
	.file_stat = nrmt_file_stat,
	.file_fsync = nrmt_file_fsync,
	.file_copy = NULL, /* remote.c copies through pread/pwrite */
	.file_fd = NULL,
	.file_flush = nrmt_file_flush,
	.syncdir = NULL, /* NFS namespace calls are stable when answered */
};
