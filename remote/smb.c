/*
 * smb.c - the "smb" driver: a share spoken to over SMB2/3 by libsmbclient,
 * with no kernel CIFS client.
 *
 *   smb://[DOMAIN;]USER@HOST[:PORT]/SHARE[/path]      (USER@ optional)
 *
 * rmt_open() option of this driver (an unknown one is -EINVAL, logged):
 *
 *   credentials=FILE   smbclient -A style lines "username = NAME",
 *                      "password = SECRET", "domain = NAME" ('#' and ';'
 *                      start comments). FILE must be a regular file that
 *                      neither group nor others can read (mode 0600 or
 *                      stricter): anything else is refused with one error
 *                      line (-EACCES). USER and DOMAIN of the URL win over
 *                      the file's. A password is never taken from the URL
 *                      ("user:pass@" is -EINVAL) nor from the environment.
 *                      Without the option: USER with an empty password.
 *
 * Percent-encoding in the URL is not supported ('%' and '?' are refused).
 * rmt_id() is "smb://HOST[:PORT]/SHARE[/path]", '/' runs collapsed, no
 * trailing '/', no user: the same share whoever logs in.
 *
 * Worker processes. libsmbclient (Samba 4.17, Debian 12) is not usable
 * from several threads even with one context each (talloc aborts: "Freed
 * frame ..."), and Debian's build does not export smbc_thread_posix(). So
 * every struct srmt forks a worker process that owns the one SMBCCTX of
 * this connection and makes every libsmbclient call; this process (the
 * parent) never calls libsmbclient. The struct rmt_ops functions below
 * send a request over a socketpair and wait for its reply (call()); a
 * mutex makes that one round trip at a time. One connection is one
 * worker, one TCP connection to the server; the driver has no
 * RMT_CAP_THREADSAFE, so rmt_open() puts K of them behind the pool
 * (pool.c, connections=N): K workers, K streams.
 *
 *   request:  struct req, then len1 bytes of path 1, len2 bytes of path 2
 *   reply:    struct rep, then dlen bytes of data (stat, statvfs, a
 *             readdir listing: see pack_dirent())
 *
 * The bytes of a pwrite or pread do not go through the socket: each worker
 * shares an IO_MAX-byte buffer with its parent (a memfd, mapped by both;
 * the worker gets it as fd 4). The parent copies a pwrite's bytes in and
 * a pread's bytes out, under the mutex of the round trip, and libsmbclient
 * sends and receives straight from it. Through the socket each byte was
 * copied into it and out of it by the kernel: 1 GiB drained from the
 * journal to smb:// over an unshaped link took 1.67 CPU-seconds of the
 * machine instead of 1.85 (medians of 5 alternating runs; the time within
 * noise, 1.02 s and 1.04 s). A request moves at most IO_MAX bytes; larger
 * preads and pwrites are cut.
 *
 * Worker life:
 *
 *   (none) --rmt_smb_open(): fork, exec (worker_start())--> starting
 *   starting --conf, HELLO ok--> serving
 *   starting --HELLO error--> reaped (rmt_smb_open() returns the error)
 *   serving --srmt_close(): close the socket, EOF--> exits, reaped
 *           (waitpid; SIGKILL after REAP_WAIT_MS)
 *   serving --the parent dies--> exits (PR_SET_PDEATHSIG, EOF, or
 *           getppid() changed: worker_read_req())
 *   serving --the worker dies--> dead: every later call is -EIO (logged
 *           once); the remote must be opened again
 *   serving --this process forks (fuse_daemonize)--> the child's first
 *           call forks a worker of its own (spawn() from call()); files
 *           opened before the fork are -EIO there
 *
 * PR_SET_PDEATHSIG fires when the *thread* that forked exits, so it is set
 * only for a worker forked by the main thread; the others notice their
 * parent's end by EOF or by getppid() (checked every second while idle).
 * The worker ignores SIGINT, SIGTERM, SIGHUP and
 * SIGPIPE (a Ctrl-C to the process group must not kill it before the
 * parent has flushed) and keeps only fds 0-2 and its socket (the
 * parent's other fds, among them other workers' sockets, are closed: each
 * worker sees EOF when its own parent end closes).
 *
 * Reconnecting (worker_call()): libsmbclient reconnects a path call by
 * itself when its cached connection is gone, but an open SMBCFILE dies
 * with its connection. When a call fails with a connection error
 * (conn_lost()), the worker drops its context, makes a new one (log: once
 * lost, once back), marks every open file stale, and retries the call
 * once; a stale file is opened again by its path (without O_CREAT,
 * O_EXCL, O_TRUNC) before its next use. A retried create, mkdir, rename or
 * unlink may then fail with -EEXIST / -ENOENT, as with any client without
 * a server reply cache; a file renamed or removed meanwhile cannot be
 * opened again (its calls fail).
 *
 * What SMB2 without POSIX extensions (Samba's defaults) cannot do, and
 * what this driver answers (its caps have none of RMT_CAPS_POSIX, and
 * rmt_name_check() gives what Samba answers for a name, so write-back
 * refuses the same at once):
 *  - symlinks: rmt_symlink() -EPERM, rmt_readlink() -EINVAL (nothing is a
 *    symlink: the server follows its own, inside the share);
 *  - hard links: rmt_link() -EPERM; fifos and sockets: rmt_mknod() -EPERM;
 *  - modes: stat shows a mode made from the DOS attributes (libsmbclient:
 *    directories 0555, files 0444, +w unless read-only, +x from archive,
 *    system, hidden); mkdir's and create's mode, and RMT_SET_MODE, are
 *    accepted and not kept: the DOS read-only attribute that smbc_chmod
 *    would set for a mode without write bits keeps every client, ferryfs
 *    (root) too, from writing or deleting the file, where POSIX lets root
 *    (the flusher writes a file's data after its mode). A file made
 *    read-only by another client is made writable to be deleted
 *    (w_unlink());
 *  - owners: every file belongs to the worker's uid and gid; RMT_SET_UID /
 *    RMT_SET_GID to those is a no-op, to anything else -EPERM;
 *  - times are set with microsecond precision (smbc_utimes); UTIME_NOW is
 *    this machine's clock; a time left alone is read first and set again;
 *    st_atime/st_mtime/st_ctime come from the server;
 *  - xattrs (no RMT_CAP_XATTR: libsmbclient has only its system.* ones),
 *    fallocate (-EOPNOTSUPP), RENAME_EXCHANGE (-EINVAL);
 *  - fsync: libsmbclient has no FLUSH call: every write was answered by
 *    the server when rmt_file_pwrite() returned; rmt_file_fsync() is a
 *    no-op (the server's page cache holds the data). rmt_file_flush()
 *    (RMT_CAP_CLOSE_ERRORS) closes the SMB handle of a written file: the
 *    server fixes the write time at a close and reports what failed;
 *  - SEEK_DATA / SEEK_HOLE see all of a file as data, as nfs.c does;
 *  - RENAME_NOREPLACE is a stat of the target, then the rename: another
 *    client may create the target in between. A rename over a file is
 *    libsmbclient's rename, then unlink of the target and rename again;
 *    over an empty directory, rmdir of it and rename again: not atomic;
 *  - names: a backslash in a name is refused (-EINVAL: it is SMB's path
 *    separator), so are names that are not UTF-8 (-EILSEQ); Samba refuses
 *    names Windows cannot hold (: * ? " < > | and control characters:
 *    -EINVAL) and matches names without case ("case sensitive = auto").
 * rmt_file_copy() is a server-side copy (SMB2 COPYCHUNK, smbc_splice) when
 * both files are on one connection, else remote.c copies.
 *
 * Open files. libsmbclient opens without FILE_SHARE_DELETE, so while an
 * SMB handle is open its name cannot be removed or renamed, nor a
 * directory above it renamed (-EBUSY / -EACCES); POSIX allows both and the
 * file stays open. Every open file of this process (all connections) is
 * in `opened` with its name now. An unlink or rename that would remove,
 * replace or move an open file goes through set_aside(): the files' SMB
 * handles are closed (OP_DETACH; they reopen by name on next use), a file
 * at a name being removed or replaced is renamed to a hidden name in its
 * directory (SET_ASIDE + pid + number, left out of listings, removed at
 * its last close: NFS's "silly rename"), the call is made, the files get
 * their new names (OP_REPATH). A busy answer with no file of ours in the
 * way (Samba answers so for a moment after another connection's CLOSE) is
 * tried again, RMT_BUSY_TRIES times. Another client's open still blocks.
 *
 * Errors: smb_err() is the one place a libsmbclient errno becomes a
 * -errno of this driver.
 *
 * Invariants:
 *  1. Only the worker calls libsmbclient; the parent never does, so a
 *     fork copies no libsmbclient state.
 *  2. One request is on a worker's socket at a time (s->lock); a reply is
 *     read in full before the lock is dropped, or the worker is marked
 *     dead (the stream is out of step: never used again).
 *  3. A handle given to the parent is a struct wfile of the worker, valid
 *     until its CLOSE; wf->gen == w->gen means wf->fh belongs to the
 *     current context; wf->fh == NULL means closed (detached or stale),
 *     reopened by wf->url before the next call on it.
 *  4. Every struct sfile between srmt_file_open() and srmt_file_close() is
 *     in opened.head with the name it has on the share now (set_aside()
 *     renames it in the list and in its worker under opened.lock and the
 *     locks of every connection concerned); during its CLOSE it is in
 *     opened.closing (detach_at() waits for it).
 *
 * Called only through remote.c (paths checked by rmt_path_check()) and
 * the pool.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libsmbclient.h>

#include "log.h"
#include "remote_i.h"
#include "utf8.h"

#define IO_MAX ((size_t)8 << 20) /* bytes of data per request */
#define REPLY_MAX ((size_t)256 << 20) /* a readdir listing, at most */
#define REAP_WAIT_MS 5000
#define SMB_TIMEOUT_MS 30000 /* libsmbclient's per-call timeout */
#define SOCK_BUF (4 << 20)
#define CRED_MAX 256 /* bytes of a user, domain or password, with NUL */

enum op {
	OP_HELLO = 1, /* connect and stat the root */
	OP_STAT,
	OP_STATFS,
	OP_READDIR,
	OP_MKDIR,
	OP_RMDIR,
	OP_UNLINK,
	OP_RENAME, /* p1 -> p2, a = flags */
	OP_TRUNCATE, /* p1 to size a */
	OP_UTIMES, /* p1, a/b = atime s/ns, c/d = mtime s/ns */
	OP_OPEN, /* p1, a = flags; rep.rc: the handle */
	OP_DETACH, /* h: close its SMB handle, reopened on next use */
	OP_REPATH, /* h: its name is p1 now */
	OP_CLOSE, /* h; every op after this one is on a file */
	OP_PREAD, /* h, a = offset, b = length; rep.rc bytes in the shm */
	OP_PWRITE, /* h, a = offset, b = length: the bytes in the shm */
	OP_FSTAT, /* h */
	OP_FTRUNCATE, /* h, a = size */
	OP_COPY, /* h -> h2, a = off_in, b = off_out, c = length */
};

struct req {
	uint32_t op;
	uint32_t len1, len2; /* path bytes, no NUL */
	uint32_t wgen; /* h's worker (struct sfile); checked by call() */
	uint64_t h, h2; /* file handles (struct wfile *) */
	int64_t a, b, c, d;
};

struct rep {
	int64_t rc; /* >= 0, or -errno */
	uint64_t dlen; /* data bytes after this */
};

/* What a worker needs; spawn() sends it a copy (send_conf()). */
struct conf {
	char *server; /* HOST[:PORT] as in the URL */
	char *base; /* "smb://HOST[:PORT]/SHARE[/path]" = rmt_id() */
	char user[CRED_MAX], domain[CRED_MAX], password[CRED_MAX];
};

struct srmt {
	struct rmt base; /* first: remote.c sees only this */
	struct conf cf; /* for a new worker after a fork; immutable */
	pthread_mutex_t lock; /* invariant 2; protects the fields below */
	int fd; /* our end of the socketpair */
	char *shm; /* IO_MAX bytes shared with the worker, or NULL */
	pid_t pid; /* the worker */
	pid_t owner; /* the process that forked it */
	unsigned int wgen; /* bumped by every new worker */
	bool dead; /* the worker is gone or out of step */
};

struct sfile {
	struct rmt_file base; /* first */
	uint64_t h; /* the worker's handle (invariant 3) */
	unsigned int wgen; /* of the worker that opened it */
	struct sfile *next; /* in opened.head or .closing; opened.lock */
	char *path; /* its name now; protected by opened.lock */
	bool aside; /* path is a SET_ASIDE name; protected by opened.lock */
	unsigned long close_no; /* in opened.closing: its opened.closes */
	/* written since its handle was last closed: the calls on a file are
	 * serial (pool.c binds it to one connection) */
	bool dirty;
};

/*
 * The open files of this process, of all connections (set_aside()).
 * Lock order: opened.lock before any srmt's lock; srmt locks in address
 * order.
 */
#define SET_ASIDE ".ferryfs-unlinked-"
static struct {
	pthread_mutex_t lock;
	struct sfile *head; /* protected by lock */
	unsigned long seq; /* protected by lock: set-aside names */
	/* files out of head whose CLOSE is under way; protected by lock */
	struct sfile *closing;
	unsigned long closes; /* protected by lock: CLOSEs begun */
	pthread_cond_t closed; /* a file left closing */
} opened = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, NULL, 0,
	     PTHREAD_COND_INITIALIZER };

static struct srmt *to_srmt(struct rmt *r)
{
	return (struct srmt *)r;
}

static struct sfile *to_sfile(struct rmt_file *f)
{
	return (struct sfile *)f;
}

/* --- errors ------------------------------------------------------------ */

/*
 * THE mapping of a failed libsmbclient call (errno @e, as it sets it from
 * the NT status) to this driver's -errno:
 *   0            (libsmbclient failed without saying why): -EIO
 *   ENOTSUP      -EOPNOTSUPP (the same value on Linux, named for clarity)
 *   ECONNRESET, ECONNABORTED, ENOTCONN, EPIPE, ENETRESET, EHOSTDOWN
 *                a connection lost and not regained by the retry: -EIO
 *   anything else stays (ENOENT, EACCES, EPERM, EEXIST, ENOTEMPTY,
 *   ENOSPC, EDQUOT, EISDIR, ENOTDIR, EBUSY, ETIMEDOUT, EINVAL, ...)
 */
static int smb_err(int e)
{
	switch (e) {
	case 0:
		return -EIO;
	case ECONNRESET:
	case ECONNABORTED:
	case ENOTCONN:
	case EPIPE:
	case ENETRESET:
	case EHOSTDOWN:
		return -EIO;
	default:
		return e > 0 && e < 4096 ? -e : -EIO;
	}
}

/* An errno of libsmbclient that says the connection is gone. */
static bool conn_lost(int e)
{
	switch (e) {
	case ECONNRESET:
	case ECONNABORTED:
	case ENOTCONN:
	case EPIPE:
	case ENETRESET:
	case ETIMEDOUT:
	case EHOSTDOWN:
	case EBADF: /* an SMBCFILE whose connection was dropped */
		return true;
	default:
		return false;
	}
}

/* --- socket I/O (both sides) ------------------------------------------- */

/* Send all of iov[0..n) (modified); -errno on failure. */
static int send_all(int fd, struct iovec *iov, int n)
{
	while (n > 0) {
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
		ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);

		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		while (n > 0 && (size_t)k >= iov->iov_len) {
			k -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + k;
			iov->iov_len -= (size_t)k;
		}
	}
	return 0;
}

/* Receive exactly len bytes; -EPIPE at EOF, -errno on failure. */
static int recv_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len > 0) {
		ssize_t k = recv(fd, p, len, MSG_WAITALL);

		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			return -EPIPE;
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

/* --- the worker (invariant 1: the only caller of libsmbclient) --------- */

struct wfile {
	struct wfile *next, *prev; /* in w->files */
	SMBCFILE *fh; /* of context generation gen (invariant 3) */
	unsigned int gen;
	int flags; /* open(2) flags for a reopen */
	char *url;
};

struct worker {
	struct conf *cf;
	int fd;
	pid_t parent;
	int name_err; /* of the request's paths: make_url() */
	SMBCCTX *ctx;
	unsigned int gen; /* bumped by every new context */
	bool lost; /* a lost connection was logged */
	struct wfile files; /* list head */
	char *url1, *url2; /* request URLs */
	size_t url_size;
	char *buf; /* reply data */
	size_t buf_size;
	char *shm; /* IO_MAX bytes shared with the parent (fd 4) */
};

static bool name_char_plain(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
	       c == '~' || c == '/';
}

/* Is s[0, len) valid UTF-8 (SMB names are Unicode)? */
static bool utf8_valid(const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i, n;

	for (i = 0; i < len; i += n)
		if (utf8_get(u + i, len - i, &n) < 0)
			return false;
	return true;
}

/* rmt_name_check(): what Samba refuses in a name (a Windows name), and
 * names that are not UTF-8 */
static int srmt_name_check(struct rmt *r, const char *name)
{
	(void)r;
	if (!utf8_valid(name, strlen(name)))
		return -EILSEQ;
	for (const unsigned char *c = (const unsigned char *)name; *c; c++)
		if (*c < 0x20 || strchr("\\:*?\"<>|", *c))
			return -EINVAL;
	return 0;
}

/* base + "/" + percent-encoded path (libsmbclient decodes %XX and takes
 * '?' as the start of options). -EINVAL for a backslash. */
static int make_url(struct worker *w, char *url, const char *path, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(w->cf->base), i;

	if (!utf8_valid(path, len))
		return -EILSEQ;
	memcpy(url, w->cf->base, n);
	if (len)
		url[n++] = '/';
	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)path[i];

		if (c == '\\')
			return -EINVAL;
		if (name_char_plain(c)) {
			url[n++] = (char)c;
		} else {
			url[n++] = '%';
			url[n++] = hex[c >> 4];
			url[n++] = hex[c & 15];
		}
	}
	url[n] = '\0';
	return 0;
}

/* libsmbclient asks for the login of every server it connects to (its
 * smbc_set_credentials_with_fallback() fails with
 * NT_STATUS_WRONG_CREDENTIAL_HANDLE in 4.17). */
static void auth_fn(SMBCCTX *ctx, const char *server, const char *share,
		    char *wg, int wglen, char *user, int ulen, char *pw,
		    int pwlen)
{
	struct worker *w = smbc_getOptionUserData(ctx);

	(void)server, (void)share;
	if (w->cf->domain[0])
		snprintf(wg, (size_t)wglen, "%s", w->cf->domain);
	snprintf(user, (size_t)ulen, "%s", w->cf->user);
	snprintf(pw, (size_t)pwlen, "%s", w->cf->password);
}

static int ctx_new(struct worker *w)
{
	SMBCCTX *ctx = smbc_new_context();

	if (!ctx)
		return -ENOMEM;
	smbc_setDebug(ctx, log_debug_enabled ? 1 : 0);
	smbc_setTimeout(ctx, SMB_TIMEOUT_MS);
	smbc_setOptionUseKerberos(ctx, 0);
	smbc_setOptionFallbackAfterKerberos(ctx, 1);
	smbc_setOptionNoAutoAnonymousLogin(ctx, 1);
	smbc_setOptionCaseSensitive(ctx, 1);
	smbc_setOptionUseCCache(ctx, 0);
	smbc_setOptionUserData(ctx, w);
	smbc_setFunctionAuthDataWithContext(ctx, auth_fn);
	if (!smbc_init_context(ctx)) {
		int e = errno;

		smbc_free_context(ctx, 0);
		return smb_err(e);
	}
	w->ctx = ctx;
	w->gen++;
	return 0;
}

/* The connection is gone: a new context; files reopen on use. */
static int reconnect(struct worker *w)
{
	if (!w->lost)
		LOG_WARN("smb '%s': connection lost, reconnecting",
			 w->cf->base);
	w->lost = true;
	if (w->ctx)
		smbc_free_context(w->ctx, 1);
	w->ctx = NULL;
	return ctx_new(w);
}

static void back_again(struct worker *w)
{
	if (w->lost) {
		w->lost = false;
		LOG_INFO("smb '%s': connection back", w->cf->base);
	}
}

/* wf's SMBCFILE of the current context, reopened if stale. */
static int file_fh(struct worker *w, struct wfile *wf, SMBCFILE **fh)
{
	if (wf->gen != w->gen || !wf->fh) {
		SMBCFILE *n;

		n = smbc_getFunctionOpen(
			w->ctx)(w->ctx, wf->url,
				wf->flags & ~(O_CREAT | O_EXCL | O_TRUNC), 0);
		if (!n)
			return -errno;
		wf->fh = n;
		wf->gen = w->gen;
	}
	*fh = wf->fh;
	return 0;
}

static void stat_fix(struct stat *st)
{
	if (st->st_blksize == 0)
		st->st_blksize = 4096;
}

/* pread through lseek+read (libsmbclient has no pread); short only at
 * EOF. Returns bytes or -errno (raw). */
static ssize_t w_pread(struct worker *w, SMBCFILE *fh, char *buf, size_t len,
		       off_t off)
{
	size_t done = 0;

	if (smbc_getFunctionLseek(w->ctx)(w->ctx, fh, off, SEEK_SET) < 0)
		return -errno;
	while (done < len) {
		ssize_t k = smbc_getFunctionRead(w->ctx)(w->ctx, fh, buf + done,
							 len - done);

		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		done += (size_t)k;
	}
	return (ssize_t)done;
}

static ssize_t w_pwrite(struct worker *w, SMBCFILE *fh, const char *buf,
			size_t len, off_t off)
{
	size_t done = 0;

	if (smbc_getFunctionLseek(w->ctx)(w->ctx, fh, off, SEEK_SET) < 0)
		return -errno;
	while (done < len) {
		ssize_t k = smbc_getFunctionWrite(
			w->ctx)(w->ctx, fh, buf + done, len - done);

		if (k < 0)
			return -errno;
		if (k == 0)
			return -EIO;
		done += (size_t)k;
	}
	return (ssize_t)len;
}

/* Room for n bytes in w->buf. */
static int buf_need(struct worker *w, size_t n)
{
	char *nb;

	if (n <= w->buf_size)
		return 0;
	nb = realloc(w->buf, n);
	if (!nb)
		return -ENOMEM;
	w->buf = nb;
	w->buf_size = n;
	return 0;
}

/*
 * One directory entry in the READDIR reply: u16 name length, u8 have_st,
 * then struct stat if have_st, then the name (no NUL).
 */
static int pack_dirent(struct worker *w, size_t *len, const char *name,
		       const struct stat *st)
{
	size_t nl = strlen(name), need = 3 + (st ? sizeof(*st) : 0) + nl;
	uint16_t n16 = (uint16_t)nl;
	char *p;

	if (nl > NAME_MAX)
		return 0; /* cannot be named through the interface: skipped */
	if (*len + need > REPLY_MAX)
		return -ENOMEM;
	if (*len + need > w->buf_size) {
		size_t size = w->buf_size * 2 > *len + need ? w->buf_size * 2 :
							      *len + need;
		int rc = buf_need(w, size);

		if (rc < 0)
			return rc;
	}
	p = w->buf + *len;
	memcpy(p, &n16, 2);
	p[2] = st != NULL;
	p += 3;
	if (st) {
		memcpy(p, st, sizeof(*st));
		p += sizeof(*st);
	}
	memcpy(p, name, nl);
	*len += need;
	return 0;
}

static int w_readdir(struct worker *w, const char *url, size_t *len)
{
	SMBCFILE *d = smbc_getFunctionOpendir(w->ctx)(w->ctx, url);
	smbc_readdirplus2_fn next;
	int rc = 0;

	*len = 0;
	if (!d)
		return -errno;
	next = smbc_getFunctionReaddirPlus2(w->ctx);
	for (;;) {
		const struct libsmb_file_info *fi;
		struct stat st;

		memset(&st, 0, sizeof(st));
		errno = 0;
		fi = next(w->ctx, d, &st);
		if (!fi) {
			if (errno != 0 && errno != ENOENT)
				rc = -errno;
			break;
		}
		if (!strcmp(fi->name, ".") || !strcmp(fi->name, ".."))
			continue;
		if (strchr(fi->name, '/'))
			continue; /* not a name of ours */
		stat_fix(&st);
		rc = pack_dirent(w, len, fi->name, &st);
		if (rc < 0)
			break;
	}
	smbc_getFunctionClosedir(w->ctx)(w->ctx, d);
	return rc;
}

/*
 * unlink(2): its permission is the directory's, not the file's; SMB
 * refuses to delete a read-only file (DOS attribute, from a chmod without
 * S_IWUSR), so that attribute is cleared and the unlink tried again (the
 * kernel's CIFS client does the same).
 */
static int w_unlink(struct worker *w, const char *url)
{
	struct stat st;
	int e;

	if (smbc_getFunctionUnlink(w->ctx)(w->ctx, url) == 0)
		return 0;
	e = errno;
	/* NT_STATUS_CANNOT_DELETE is EINVAL for libsmbclient 4.17 */
	if (e != EACCES && e != EPERM && e != EINVAL)
		return -e;
	if (smbc_getFunctionStat(w->ctx)(w->ctx, url, &st) < 0 ||
	    (st.st_mode & S_IWUSR) || S_ISDIR(st.st_mode))
		return -e;
	if (smbc_getFunctionChmod(w->ctx)(w->ctx, url, 0644) < 0)
		return -EACCES;
	if (smbc_getFunctionUnlink(w->ctx)(w->ctx, url) == 0)
		return 0;
	return -errno;
}

/*
 * rename(2) semantics over libsmbclient's (see the top of this file). An
 * open file in the way (no FILE_SHARE_DELETE in libsmbclient's opens) is
 * -EBUSY: the parent then moves it aside (set_aside()).
 */
static int w_rename(struct worker *w, const char *from, const char *to,
		    int64_t flags)
{
	smbc_rename_fn rename_fn = smbc_getFunctionRename(w->ctx);
	smbc_stat_fn stat_fn = smbc_getFunctionStat(w->ctx);
	struct stat sf, st;

	if (flags & RMT_RENAME_EXCHANGE)
		return -EINVAL;
	if (stat_fn(w->ctx, from, &sf) < 0)
		return -errno;
	if (stat_fn(w->ctx, to, &st) == 0) {
		if (flags & RMT_RENAME_NOREPLACE)
			return -EEXIST;
		if (sf.st_ino == st.st_ino && sf.st_dev == st.st_dev)
			return 0; /* the same file: nothing to do */
		if (S_ISDIR(st.st_mode) && !S_ISDIR(sf.st_mode))
			return -EISDIR;
		if (!S_ISDIR(st.st_mode) && S_ISDIR(sf.st_mode))
			return -ENOTDIR;
		/* POSIX replaces the target (an empty directory); SMB2 as
		 * libsmbclient speaks it does not */
		if (S_ISDIR(st.st_mode)) {
			if (smbc_getFunctionRmdir(w->ctx)(w->ctx, to) < 0)
				return -errno;
		} else {
			int rc = w_unlink(w, to);

			if (rc < 0)
				return rc;
		}
	} else if (errno != ENOENT) {
		return -errno;
	}
	if (rename_fn(w->ctx, from, w->ctx, to) < 0)
		return -errno;
	return 0;
}

static int w_utimes(struct worker *w, const char *url, const struct req *q)
{
	struct timeval tv[2];
	struct timespec ts[2] = { { .tv_sec = q->a, .tv_nsec = q->b },
				  { .tv_sec = q->c, .tv_nsec = q->d } };
	struct stat st;
	int i;

	if (ts[0].tv_nsec == UTIME_OMIT || ts[1].tv_nsec == UTIME_OMIT) {
		if (smbc_getFunctionStat(w->ctx)(w->ctx, url, &st) < 0)
			return -errno;
		if (ts[0].tv_nsec == UTIME_OMIT)
			ts[0] = st.st_atim;
		if (ts[1].tv_nsec == UTIME_OMIT)
			ts[1] = st.st_mtim;
	}
	for (i = 0; i < 2; i++) {
		if (ts[i].tv_nsec == UTIME_NOW)
			clock_gettime(CLOCK_REALTIME, &ts[i]);
		tv[i].tv_sec = ts[i].tv_sec;
		tv[i].tv_usec = ts[i].tv_nsec / 1000;
	}
	if (smbc_getFunctionUtimes(w->ctx)(w->ctx, url, tv) < 0)
		return -errno;
	return 0;
}

static int w_truncate(struct worker *w, const char *url, off_t size)
{
	SMBCFILE *fh = smbc_getFunctionOpen(w->ctx)(w->ctx, url, O_WRONLY, 0);
	int rc = 0;

	if (!fh)
		return -errno;
	if (smbc_getFunctionFtruncate(w->ctx)(w->ctx, fh, size) < 0)
		rc = -errno;
	if (smbc_getFunctionClose(w->ctx)(w->ctx, fh) < 0 && rc == 0)
		rc = -errno;
	return rc;
}

static int w_open(struct worker *w, const char *url, int flags,
		  struct wfile **out)
{
	smbc_open_fn open_fn = smbc_getFunctionOpen(w->ctx);
	int acc = flags & O_ACCMODE;
	struct wfile *wf;
	SMBCFILE *fh;
	struct stat st;
	int rc;

	flags &= O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC;
	/* fs/ may read through a write handle: read-write where allowed */
	fh = open_fn(w->ctx, url,
		     (flags & ~O_ACCMODE) | (acc == O_WRONLY ? O_RDWR : acc),
		     0644);
	if (fh) {
		flags = (flags & ~O_ACCMODE) | (acc == O_WRONLY ? O_RDWR : acc);
	} else if (acc == O_WRONLY && (errno == EACCES || errno == EPERM)) {
		fh = open_fn(w->ctx, url, flags, 0644);
	}
	if (!fh)
		return -errno;
	/* only a read-only open can be of a directory (one for writing
	 * fails with EISDIR): the type costs a round trip */
	if (acc == O_RDONLY &&
	    smbc_getFunctionFstat(w->ctx)(w->ctx, fh, &st) < 0) {
		rc = -errno;
		goto out_close;
	}
	if (acc == O_RDONLY && !S_ISREG(st.st_mode)) {
		rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		goto out_close;
	}
	wf = calloc(1, sizeof(*wf));
	if (!wf || !(wf->url = strdup(url))) {
		free(wf);
		rc = -ENOMEM;
		goto out_close;
	}
	wf->fh = fh;
	wf->gen = w->gen;
	wf->flags = flags;
	wf->next = w->files.next;
	wf->prev = &w->files;
	wf->next->prev = wf;
	w->files.next = wf;
	*out = wf;
	return 0;

out_close:
	smbc_getFunctionClose(w->ctx)(w->ctx, fh);
	return rc;
}

static void w_close(struct worker *w, struct wfile *wf, int64_t *rc)
{
	if (wf->fh && wf->gen == w->gen &&
	    smbc_getFunctionClose(w->ctx)(w->ctx, wf->fh) < 0)
		*rc = -errno;
	wf->prev->next = wf->next;
	wf->next->prev = wf->prev;
	free(wf->url);
	free(wf);
}

static int copy_cb(off_t n, void *priv)
{
	(void)n, (void)priv;
	return 1; /* go on */
}

static ssize_t w_copy(struct worker *w, SMBCFILE *in, off_t off_in,
		      SMBCFILE *out, off_t off_out, size_t len)
{
	off_t k;

	if (smbc_getFunctionLseek(w->ctx)(w->ctx, in, off_in, SEEK_SET) < 0 ||
	    smbc_getFunctionLseek(w->ctx)(w->ctx, out, off_out, SEEK_SET) < 0)
		return -errno;
	k = smbc_getFunctionSplice(w->ctx)(w->ctx, in, out, (off_t)len, copy_cb,
					   NULL);
	if (k < 0)
		return -errno;
	return (ssize_t)k;
}

/*
 * One request, once: rep->rc is the result as a raw -errno of
 * libsmbclient (smb_err() maps it in worker_call()); the reply data in
 * out and olen.
 */
static void worker_do(struct worker *w, const struct req *q, struct rep *rep,
		      const void **out, size_t *olen)
{
	struct wfile *wf = (struct wfile *)(uintptr_t)q->h;
	SMBCCTX *c = w->ctx;
	SMBCFILE *fh = NULL;
	int64_t rc = 0;

	*out = NULL;
	*olen = 0;
	if (q->op > OP_CLOSE) {
		rc = file_fh(w, wf, &fh);
		if (rc < 0)
			goto out;
	}
	switch (q->op) {
	case OP_HELLO:
	case OP_STAT:
	case OP_FSTAT: {
		struct stat *st = (struct stat *)w->buf;

		memset(st, 0, sizeof(*st));
		if (q->op == OP_FSTAT)
			rc = smbc_getFunctionFstat(c)(c, fh, st) < 0 ? -errno :
								       0;
		else
			rc = smbc_getFunctionStat(c)(c, w->url1, st) < 0 ?
				     -errno :
				     0;
		if (rc == 0) {
			stat_fix(st);
			*out = st;
			*olen = sizeof(*st);
		}
		break;
	}
	case OP_STATFS: {
		struct statvfs *sv = (struct statvfs *)w->buf;

		memset(sv, 0, sizeof(*sv));
		rc = smbc_getFunctionStatVFS(c)(c, w->url1, sv) < 0 ? -errno :
								      0;
		if (rc == 0) {
			/* libsmbclient 4.17: f_bsize is bytes per sector,
			 * f_frsize sectors per allocation unit (a block) */
			unsigned long unit =
				sv->f_bsize * (sv->f_frsize ? sv->f_frsize : 1);

			sv->f_bsize = sv->f_frsize = unit;
			if (!sv->f_namemax)
				sv->f_namemax = 255;
			*out = sv;
			*olen = sizeof(*sv);
		}
		break;
	}
	case OP_READDIR:
		rc = w_readdir(w, w->url1, olen);
		*out = w->buf;
		break;
	case OP_MKDIR:
		rc = smbc_getFunctionMkdir(c)(c, w->url1, 0755) < 0 ? -errno :
								      0;
		break;
	case OP_RMDIR:
		rc = smbc_getFunctionRmdir(c)(c, w->url1) < 0 ? -errno : 0;
		break;
	case OP_UNLINK:
		rc = w_unlink(w, w->url1);
		break;
	case OP_RENAME:
		rc = w_rename(w, w->url1, w->url2, q->a);
		break;
	case OP_TRUNCATE:
		rc = w_truncate(w, w->url1, (off_t)q->a);
		break;
	case OP_UTIMES:
		rc = w_utimes(w, w->url1, q);
		break;
	case OP_OPEN: {
		struct wfile *nf = NULL;

		rc = w_open(w, w->url1, (int)q->a, &nf);
		if (rc == 0) {
			uint64_t h = (uint64_t)(uintptr_t)nf;

			memcpy(w->buf, &h, sizeof(h));
			*out = w->buf;
			*olen = sizeof(h);
		}
		break;
	}
	case OP_CLOSE:
		w_close(w, wf, &rc);
		break;
	case OP_DETACH:
		if (wf->fh && wf->gen == w->gen &&
		    smbc_getFunctionClose(c)(c, wf->fh) < 0)
			rc = -errno;
		wf->fh = NULL;
		break;
	case OP_REPATH: {
		char *url = strdup(w->url1);

		if (!url) {
			rc = -ENOMEM;
			break;
		}
		free(wf->url);
		wf->url = url;
		break;
	}
	case OP_PREAD:
		rc = w_pread(w, fh, w->shm, (size_t)q->b, (off_t)q->a);
		break;
	case OP_PWRITE:
		rc = w_pwrite(w, fh, w->shm, (size_t)q->b, (off_t)q->a);
		break;
	case OP_FTRUNCATE:
		rc = smbc_getFunctionFtruncate(c)(c, fh, (off_t)q->a) < 0 ?
			     -errno :
			     0;
		break;
	case OP_COPY: {
		struct wfile *wo = (struct wfile *)(uintptr_t)q->h2;
		SMBCFILE *fo = NULL;

		rc = file_fh(w, wo, &fo);
		if (rc == 0)
			rc = w_copy(w, fh, (off_t)q->a, fo, (off_t)q->b,
				    (size_t)q->c);
		break;
	}
	default:
		rc = -ENOSYS;
		break;
	}
out:
	rep->rc = rc;
}

/* One request with one retry on a new context after a lost connection. */
static void worker_call(struct worker *w, const struct req *q, struct rep *rep,
			const void **out, size_t *olen)
{
	bool lost;

	worker_do(w, q, rep, out, olen);
	lost = rep->rc < 0 && conn_lost((int)-rep->rc);
	if (lost && q->op == OP_HELLO)
		return; /* never connected: spawn() says why, in its words */
	if (lost && q->op != OP_CLOSE && reconnect(w) == 0) {
		worker_do(w, q, rep, out, olen);
		lost = rep->rc < 0 && conn_lost((int)-rep->rc);
	}
	if (rep->rc < 0 && !(q->op == OP_CLOSE && rep->rc == -EBADF))
		rep->rc = smb_err((int)-rep->rc);
	else if (rep->rc < 0)
		rep->rc = 0; /* the close of a file of a dropped connection */
	if (rep->rc >= 0 || !lost)
		back_again(w);
	if (q->op == OP_HELLO && rep->rc == 0)
		w->lost = false;
}

static int worker_read_req(struct worker *w, struct req *q)
{
	size_t need;
	int rc;

	for (;;) {
		struct pollfd pfd = { .fd = w->fd, .events = POLLIN };

		if (poll(&pfd, 1, 1000) > 0)
			break;
		if (getppid() != w->parent)
			return -EPIPE; /* the parent died (any thread) */
	}
	rc = recv_all(w->fd, q, sizeof(*q));
	if (rc < 0)
		return rc;
	if (q->len1 >= PATH_MAX || q->len2 >= PATH_MAX)
		return -EPROTO;
	if ((q->op == OP_PREAD || q->op == OP_PWRITE) &&
	    (q->b < 0 || (uint64_t)q->b > IO_MAX))
		return -EPROTO;
	need = (size_t)q->len1;
	if (need) {
		rc = recv_all(w->fd, w->buf, need);
		if (rc < 0)
			return rc;
	}
	/* a name SMB cannot carry is answered with its error */
	w->name_err = make_url(w, w->url1, w->buf, need);
	if (q->len2) {
		rc = recv_all(w->fd, w->buf, q->len2);
		if (rc < 0)
			return rc;
		rc = make_url(w, w->url2, w->buf, q->len2);
		if (w->name_err == 0)
			w->name_err = rc;
	}
	return 0;
}

static void worker_main(struct worker *w) __attribute__((noreturn));
static void worker_main(struct worker *w)
{
	for (;;) {
		struct req q;
		struct rep rep = { 0 };
		const void *out = NULL;
		size_t olen = 0;
		struct iovec iov[2];
		int rc;

		rc = worker_read_req(w, &q);
		if (rc == -EPIPE)
			_exit(0); /* the parent closed: done */
		if (rc < 0) {
			LOG_ERR("smb worker '%s': bad request: %s", w->cf->base,
				strerror(-rc));
			_exit(1);
		}
		if (w->name_err < 0)
			rep.rc = w->name_err;
		else if (!w->ctx && (rc = ctx_new(w)) < 0)
			rep.rc = rc;
		else
			worker_call(w, &q, &rep, &out, &olen);
		rep.dlen = olen;
		iov[0] = (struct iovec){ .iov_base = &rep,
					 .iov_len = sizeof(rep) };
		iov[1] = (struct iovec){ .iov_base = (void *)out,
					 .iov_len = olen };
		if (send_all(w->fd, iov, olen ? 2 : 1) < 0)
			_exit(0); /* the parent is gone */
	}
}

/*
 * The conf a worker needs, sent by spawn() ahead of its HELLO: struct
 * conf_lens, cf->user, cf->domain, cf->password (CRED_MAX bytes each),
 * then server_len bytes of cf->server and base_len of cf->base.
 */
struct conf_lens {
	uint32_t server_len, base_len;
};

static int recv_conf(int fd, struct conf *cf)
{
	struct conf_lens l;
	struct iovec iov[3] = { { cf->user, CRED_MAX },
				{ cf->domain, CRED_MAX },
				{ cf->password, CRED_MAX } };
	int rc = recv_all(fd, &l, sizeof(l));

	for (int i = 0; i < 3 && rc == 0; i++)
		rc = recv_all(fd, iov[i].iov_base, iov[i].iov_len);
	if (rc < 0)
		return rc;
	if (l.server_len >= PATH_MAX || l.base_len >= PATH_MAX ||
	    !memchr(cf->user, 0, CRED_MAX) ||
	    !memchr(cf->domain, 0, CRED_MAX) ||
	    !memchr(cf->password, 0, CRED_MAX))
		return -EPROTO;
	cf->server = calloc(1, l.server_len + 1);
	cf->base = calloc(1, l.base_len + 1);
	if (!cf->server || !cf->base)
		return -ENOMEM;
	rc = recv_all(fd, cf->server, l.server_len);
	return rc ? rc : recv_all(fd, cf->base, l.base_len);
}

static int send_conf(int fd, struct conf *cf)
{
	struct conf_lens l = { .server_len = (uint32_t)strlen(cf->server),
			       .base_len = (uint32_t)strlen(cf->base) };
	struct iovec iov[] = {
		{ &l, sizeof(l) },
		{ cf->user, CRED_MAX },
		{ cf->domain, CRED_MAX },
		{ cf->password, CRED_MAX },
		{ cf->server, l.server_len },
		{ cf->base, l.base_len },
	};

	return send_all(fd, iov, (int)(sizeof(iov) / sizeof(iov[0])));
}

/*
 * A worker is this program run again (spawn(): fork, then exec of
 * /proc/self/exe) with argv WORKER_ARG, the parent's pid, and log flags
 * ("d" debug, "s" syslog), its socket at fd 3 and the shared buffer's
 * memfd at fd 4. A new image, not just a
 * fork: the forking process has threads, and a fork's child may only make
 * async-signal-safe calls (a lock another thread held at the fork, in
 * malloc, ASan's allocator or our log, stays locked in the child). It
 * starts here, before main(), from any program linked with this driver.
 */
#define WORKER_ARG "--ferryfs-smb-worker"

static void worker_start(const char *parent, const char *flags)
	__attribute__((noreturn));
static void worker_start(const char *parent, const char *flags)
{
	static struct conf cf;
	struct worker w = { .cf = &cf, .fd = 3, .parent = atoi(parent) };
	sigset_t none;

	if (getppid() != w.parent)
		_exit(1); /* the parent died before PR_SET_PDEATHSIG */
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	close_range(5, ~0U, 0);
	prctl(PR_SET_NAME, "ferryfs-smb");
	log_debug_enabled = strchr(flags, 'd') != NULL;
	if (strchr(flags, 's'))
		log_to_syslog();
	if (recv_conf(w.fd, &cf) < 0)
		_exit(1);
	w.files.next = w.files.prev = &w.files;
	w.url_size = strlen(cf.base) + 3 * PATH_MAX + 2;
	w.url1 = malloc(w.url_size);
	w.url2 = malloc(w.url_size);
	w.shm = mmap(NULL, IO_MAX, PROT_READ | PROT_WRITE, MAP_SHARED, 4, 0);
	if (!w.url1 || !w.url2 || w.shm == MAP_FAILED || close(4) < 0 ||
	    buf_need(&w, 1 << 20) < 0)
		_exit(1);
	worker_main(&w);
}

/* Run by the loader before main() (glibc passes argc and argv). */
__attribute__((constructor)) static void worker_entry(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], WORKER_ARG))
		worker_start(argv[2], argv[3]);
}

/* --- the parent's side ------------------------------------------------- */

/* Send a request and read its reply; -errno of the socket, or 0. */
static int exchange(int fd, struct iovec *iov, int n, struct rep *rep,
		    void *out, size_t osize, void **dyn, size_t *olen)
{
	int rc = send_all(fd, iov, n);

	if (rc == 0)
		rc = recv_all(fd, rep, sizeof(*rep));
	if (rc == 0 && rep->dlen) {
		if (dyn) {
			*dyn = rep->dlen <= REPLY_MAX ? malloc(rep->dlen) :
							NULL;
			rc = *dyn ? recv_all(fd, *dyn, rep->dlen) : -EPROTO;
		} else if (rep->dlen <= osize) {
			rc = recv_all(fd, out, rep->dlen);
		} else {
			rc = -EPROTO;
		}
		if (rc == 0 && olen)
			*olen = rep->dlen;
	}
	if (rc < 0 && dyn) {
		free(*dyn);
		*dyn = NULL;
	}
	return rc;
}

static int spawn(struct srmt *s);

/*
 * One round trip (invariant 2); s->lock held. Request @q with paths @p1,
 * @p2 (may be NULL) and @dlen bytes of @data (OP_PWRITE: into the shared
 * buffer). The reply's data goes to @out (at most @osize bytes; OP_PREAD:
 * from the shared buffer), or to a malloc'ed *@dyn if @dyn is given
 * (caller frees). Returns rep.rc.
 */
static int64_t call_locked(struct srmt *s, struct req *q, const char *p1,
			   const char *p2, const void *data, size_t dlen,
			   void *out, size_t osize, void **dyn, size_t *olen)
{
	struct iovec iov[3];
	struct rep rep;
	int n = 0, rc;

	q->len1 = p1 ? (uint32_t)strlen(p1) : 0;
	q->len2 = p2 ? (uint32_t)strlen(p2) : 0;
	iov[n++] = (struct iovec){ .iov_base = q, .iov_len = sizeof(*q) };
	if (q->len1)
		iov[n++] = (struct iovec){ .iov_base = (void *)p1,
					   .iov_len = q->len1 };
	if (q->len2)
		iov[n++] = (struct iovec){ .iov_base = (void *)p2,
					   .iov_len = q->len2 };
	if (olen)
		*olen = 0;
	if (s->owner != getpid() && q->op != OP_HELLO) {
		/* we are a fork (fuse_daemonize): the worker is not ours */
		rc = spawn(s);
		if (rc < 0)
			return rc;
	}
	if (s->dead || (q->h && q->wgen != s->wgen))
		return -EIO; /* a file of a worker that is gone */
	if (q->op == OP_PWRITE) { /* after spawn(): it maps a new buffer */
		if (dlen > IO_MAX)
			return -EINVAL;
		memcpy(s->shm, data, dlen);
		q->b = (int64_t)dlen;
	}
	rc = exchange(s->fd, iov, n, &rep, out, osize, dyn, olen);
	if (rc < 0) {
		/* out of step or gone: never used again (invariant 2) */
		s->dead = true;
		LOG_ERR("smb '%s': worker %d lost: %s", s->base.id, (int)s->pid,
			strerror(-rc));
		return -EIO;
	}
	if (q->op == OP_PREAD && rep.rc > 0) {
		if ((uint64_t)rep.rc > osize ||
		    (uint64_t)rep.rc > (uint64_t)q->b)
			return -EPROTO;
		memcpy(out, s->shm, (size_t)rep.rc);
		*olen = (size_t)rep.rc;
	}
	return rep.rc;
}

static int64_t call(struct srmt *s, struct req *q, const char *p1,
		    const char *p2, const void *data, size_t dlen, void *out,
		    size_t osize, void **dyn, size_t *olen)
{
	int64_t rc;

	pthread_mutex_lock(&s->lock);
	rc = call_locked(s, q, p1, p2, data, dlen, out, osize, dyn, olen);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int call_path(struct srmt *s, uint32_t op, const char *p1,
		     const char *p2, int64_t a)
{
	struct req q = { .op = op, .a = a };

	return (int)call(s, &q, p1, p2, NULL, 0, NULL, 0, NULL, NULL);
}

static void reap(pid_t pid)
{
	int i;

	for (i = 0; i < REAP_WAIT_MS / 10; i++) {
		pid_t k = waitpid(pid, NULL, WNOHANG);

		if (k == pid || (k < 0 && errno != EINTR))
			return;
		usleep(10000);
	}
	LOG_WARN("smb worker %d did not exit, killing it", (int)pid);
	kill(pid, SIGKILL);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
}

static void conf_release(struct conf *cf);

static void srmt_close(struct rmt *r)
{
	struct srmt *s = to_srmt(r);

	close(s->fd); /* the worker reads EOF and exits */
	if (s->shm)
		munmap(s->shm, IO_MAX);
	if (s->owner == getpid())
		reap(s->pid);
	/* else a worker of the process we were forked from: not our child */
	pthread_mutex_destroy(&s->lock);
	conf_release(&s->cf);
	free(s);
}

static int srmt_stat(struct rmt *r, const char *path, struct stat *st)
{
	struct req q = { .op = OP_STAT };

	return (int)call(to_srmt(r), &q, path, NULL, NULL, 0, st, sizeof(*st),
			 NULL, NULL);
}

static int srmt_statfs(struct rmt *r, struct statvfs *sv)
{
	struct req q = { .op = OP_STATFS };

	return (int)call(to_srmt(r), &q, "", NULL, NULL, 0, sv, sizeof(*sv),
			 NULL, NULL);
}

/* Call @fn for each entry of the READDIR listing [@list, @list + @len)
 * (pack_dirent()), SET_ASIDE names too with @aside: 0, @fn's first
 * non-zero answer, or -EIO at an entry that overruns the listing. */
static int listing_walk(const char *list, size_t len, bool aside,
			rmt_dirent_fn fn, void *arg)
{
	char name[NAME_MAX + 1];
	size_t pos = 0;
	int rc = 0;

	while (rc == 0 && pos + 3 <= len) {
		const char *p = list + pos;
		struct stat st;
		uint16_t nl;
		bool have;

		memcpy(&nl, p, 2);
		have = p[2];
		p += 3;
		if (nl > NAME_MAX ||
#if FUZZ_PLANT
		    /* planted for tests/fuzz (fuzz_plant_smb): an entry may
		     * overrun the listing by one byte */
		    pos + 3 + (have ? sizeof(st) : 0) + nl > len + 1)
#else
		    pos + 3 + (have ? sizeof(st) : 0) + nl > len)
#endif
			return -EIO;
		if (have) {
			memcpy(&st, p, sizeof(st));
			p += sizeof(st);
		}
		memcpy(name, p, nl);
		name[nl] = '\0';
		pos += 3 + (have ? sizeof(st) : 0) + nl;
		if (!aside && !strncmp(name, SET_ASIDE, strlen(SET_ASIDE)))
			continue; /* an unlinked file still open */
		rc = fn(name, have ? &st : NULL, arg);
	}
	return rc;
}

/* The names in @path, SET_ASIDE ones too with @aside. */
static int list_dir(struct srmt *s, const char *path, bool aside,
		    rmt_dirent_fn fn, void *arg)
{
	struct req q = { .op = OP_READDIR };
	void *list = NULL;
	size_t len = 0;
	int rc;

	rc = (int)call(s, &q, path, NULL, NULL, 0, NULL, 0, &list, &len);
	if (rc == 0)
		rc = listing_walk(list, len, aside, fn, arg);
	free(list);
	return rc;
}

static int srmt_readdir(struct rmt *r, const char *path, rmt_dirent_fn fn,
			void *arg)
{
	return list_dir(to_srmt(r), path, false, fn, arg);
}

static int srmt_mkdir(struct rmt *r, const char *path, mode_t mode)
{
	(void)mode; /* SMB has no modes (top of this file) */
	return call_path(to_srmt(r), OP_MKDIR, path, NULL, 0);
}

struct aside_scan {
	struct srmt *s;
	const char *dir;
	bool last; /* the last try: a name of this process is stale now */
	bool busy; /* a SET_ASIDE name of a file open here */
	int rc;    /* of removing one of no open file */
};

static int aside_one(const char *name, const struct stat *st, void *arg)
{
	struct aside_scan *a = arg;
	size_t dl = strlen(a->dir);
	char path[PATH_MAX], mine[sizeof(SET_ASIDE) + 16];
	struct sfile *f;
	bool ours = false;
	int rc;

	(void)st;
	if (strncmp(name, SET_ASIDE, strlen(SET_ASIDE)))
		return -ENOTEMPTY; /* really not empty: stop */
	if (snprintf(path, sizeof(path), "%s%s%s", a->dir, dl ? "/" : "",
		     name) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	pthread_mutex_lock(&opened.lock);
	for (f = opened.head; f && !ours; f = f->next)
		ours = f->aside && !strcmp(f->path, path);
	pthread_mutex_unlock(&opened.lock);
	/* one of this process's not in `opened` may be a set_aside() under
	 * way (renamed on the share, not marked yet) or a last close under
	 * way: stale only on the last try */
	snprintf(mine, sizeof(mine), "%s%d-", SET_ASIDE, (int)getpid());
	if (ours || (!a->last && !strncmp(name, mine, strlen(mine)))) {
		a->busy = true;
		return 0;
	}
	/* left behind by a process that ended without its last close; one
	 * that another process has open stays (its SMB handle refuses) */
	rc = call_path(a->s, OP_UNLINK, path, NULL, 0);
	if (rc < 0 && rc != -ENOENT)
		a->rc = rc;
	return 0;
}

/*
 * A directory that holds only SET_ASIDE names (files unlinked while open,
 * "Open files" at the top) is not empty for the server. Those of no open
 * file, which a killed process left behind, are removed, and the rmdir is
 * made again. Those of files still open here are waited for a little (a
 * close(2) just made reaches us as an asynchronous RELEASE), then make
 * the rmdir -EBUSY: it can succeed once they are closed (the flusher
 * tries again, and closes its own files when it backs off).
 */
static int srmt_rmdir(struct rmt *r, const char *path)
{
	struct srmt *s = to_srmt(r);
	int rc = call_path(s, OP_RMDIR, path, NULL, 0);

	for (int tries = 1; rc == -ENOTEMPTY; tries++) {
		struct aside_scan a = { .s = s, .dir = path,
					.last = tries > RMT_BUSY_TRIES };

		if (tries > RMT_BUSY_TRIES + 1) /* the server may see more */
			return -ENOTEMPTY;
		rc = list_dir(s, path, true, aside_one, &a);
		if (rc < 0) /* -ENOTEMPTY: a name that is not SET_ASIDE */
			return rc == -ENAMETOOLONG ? -ENOTEMPTY : rc;
		if (a.rc < 0)
			return a.rc;
		if (a.busy && a.last)
			return -EBUSY;
		if (a.busy)
			usleep((useconds_t)tries * RMT_BUSY_WAIT_US);
		rc = call_path(s, OP_RMDIR, path, NULL, 0);
	}
	return rc;
}

static int cmp_ptr(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t) * (void *const *)a;
	uintptr_t y = (uintptr_t) * (void *const *)b;

	return x < y ? -1 : x > y;
}

/* Is f at p, or below p with @below? */
static bool at_or_below(const struct sfile *f, const char *p, bool below)
{
	size_t n = strlen(p);

	if (strncmp(f->path, p, n))
		return false;
	return f->path[n] == '\0' || (below && f->path[n] == '/');
}

/*
 * With opened.lock held: wait, at most @secs seconds, until no CLOSE begun
 * before the @mark-th (ULONG_MAX: any, also one begun meanwhile) is under
 * way. Returns the file of a CLOSE still under way when the time was up,
 * else NULL.
 */
static struct sfile *closes_wait(unsigned long mark, time_t secs)
{
	struct timespec until;
	struct sfile *f;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += secs;
	for (f = opened.closing; f;)
		if (f->close_no >= mark)
			f = f->next;
		else if (pthread_cond_timedwait(&opened.closed, &opened.lock,
						&until) == 0)
			f = opened.closing; /* the list changed: again */
		else
			break;
	/* the time is up: look again, @f may have closed (and been freed)
	 * as the wait timed out */
	for (f = opened.closing; f && f->close_no >= mark; f = f->next)
		;
	return f;
}

/* Take @sf out of the list at *@pp (opened.head or .closing). */
static void sfile_unlink(struct sfile **pp, struct sfile *sf)
{
	while (*pp != sf)
		pp = &(*pp)->next;
	*pp = sf->next;
}

/*
 * An unlink (to NULL) or rename that SMB refused because files open here
 * are in the way (top of file, "Open files"): close their handles, move
 * the file at the name being removed or replaced to a hidden name in its
 * directory (SET_ASIDE), do the rename, give the files their new names.
 * Returns 2 if no open file of ours was in the way (after waiting for
 * the closes under way: the caller waits a little and tries again; Samba
 * may answer busy for a moment after the CLOSE of another connection),
 * else the call's result.
 */
static int set_aside(struct srmt *s, const char *from, const char *to,
		     unsigned int flags)
{
	const char *victim = to ? to : from;
	struct sfile **fs = NULL, *f;
	struct srmt **ss = NULL;
	char *aside = NULL;
	size_t n = 0, ns = 0, i, k;
	int rc = 2;

	pthread_mutex_lock(&opened.lock);
	for (f = opened.head; f; f = f->next)
		n++;
	fs = calloc(n ? n : 1, sizeof(*fs));
	ss = calloc(n + 1, sizeof(*ss));
	if (!fs || !ss) {
		rc = -ENOMEM;
		goto out;
	}
	n = 0;
	for (f = opened.head; f; f = f->next)
		if (at_or_below(f, victim, false) ||
		    (to && at_or_below(f, from, true)))
			fs[n++] = f;
	if (n == 0) {
		/* a CLOSE in flight (FUSE's release runs next to the unlink
		 * that follows it): wait for it, then the caller tries again */
		closes_wait(ULONG_MAX, 2);
		goto out;
	}
	ss[ns++] = s;
	for (i = 0; i < n; i++)
		ss[ns++] = to_srmt(fs[i]->base.r);
	qsort(ss, ns, sizeof(*ss), cmp_ptr);
	for (i = k = 0; i < ns; i++)
		if (i == 0 || ss[i] != ss[k - 1])
			ss[k++] = ss[i];
	ns = k;
	for (i = 0; i < ns; i++)
		pthread_mutex_lock(&ss[i]->lock);
	for (i = 0; i < n; i++) {
		struct req q = { .op = OP_DETACH,
				 .h = fs[i]->h,
				 .wgen = fs[i]->wgen };

		call_locked(to_srmt(fs[i]->base.r), &q, NULL, NULL, NULL, 0,
			    NULL, 0, NULL, NULL);
	}
	rc = 0;
	for (i = 0; i < n && !aside; i++) {
		const char *slash = strrchr(victim, '/');
		int dl = slash ? (int)(slash - victim + 1) : 0;
		struct req q = { .op = OP_RENAME };

		if (!at_or_below(fs[i], victim, false))
			continue;
		if (asprintf(&aside, "%.*s%s%d-%lu", dl, victim, SET_ASIDE,
			     (int)getpid(), ++opened.seq) < 0) {
			aside = NULL;
			rc = -ENOMEM;
			break;
		}
		rc = (int)call_locked(s, &q, victim, aside, NULL, 0, NULL, 0,
				      NULL, NULL);
		if (rc < 0) {
			free(aside);
			aside = NULL;
			break;
		}
	}
	if (rc == 0 && to) {
		struct req q = { .op = OP_RENAME, .a = flags };

		rc = (int)call_locked(s, &q, from, to, NULL, 0, NULL, 0, NULL,
				      NULL);
	}
	for (i = 0; i < n; i++) {
		struct req q = { .op = OP_REPATH,
				 .h = fs[i]->h,
				 .wgen = fs[i]->wgen };
		char *np = NULL;

		f = fs[i];
		if (aside && at_or_below(f, victim, false)) {
			np = strdup(aside);
			f->aside = np != NULL;
		} else if (rc == 0 && to && at_or_below(f, from, true)) {
			if (asprintf(&np, "%s%s", to, f->path + strlen(from)) <
			    0)
				np = NULL;
		}
		if (!np)
			continue; /* keeps its name */
		free(f->path);
		f->path = np;
		call_locked(to_srmt(f->base.r), &q, np, NULL, NULL, 0, NULL, 0,
			    NULL, NULL);
	}
	for (i = ns; i-- > 0;)
		pthread_mutex_unlock(&ss[i]->lock);
out:
	pthread_mutex_unlock(&opened.lock);
	free(aside);
	free(ss);
	free(fs);
	return rc;
}

/*
 * Before a time is set by path: a handle that wrote makes the server set
 * the file's write time when it closes (SMB's write time at close), over
 * the time set. So close the SMB handles of the files open at path, on
 * every connection (they reopen on their next use), then wait for the
 * CLOSEs under way, of any name (a file renamed since its handle wrote
 * has its old name there). A CLOSE begun after the first step finds a
 * file at path detached. Errors are left to the call that follows.
 */
static void detach_at(const char *path)
{
	struct sfile *f;

	pthread_mutex_lock(&opened.lock);
	for (f = opened.head; f; f = f->next) {
		struct req q = { .op = OP_DETACH, .h = f->h, .wgen = f->wgen };

		if (strcmp(f->path, path))
			continue;
		/* opened.lock before the srmt lock (lock order) */
		call(to_srmt(f->base.r), &q, NULL, NULL, NULL, 0, NULL, 0, NULL,
		     NULL);
	}
	/* a CLOSE is one round trip; after 5 s the time may be lost */
	f = closes_wait(opened.closes, 5);
	if (f)
		LOG_WARN("smb: the CLOSE of '%s' has taken over 5 s: the times "
			 "set on '%s' now may become that close's",
			 f->path, path);
	pthread_mutex_unlock(&opened.lock);
}

/* The name of an open file now (a copy; NULL if out of memory). */
static char *path_of(struct sfile *f)
{
	char *p;

	pthread_mutex_lock(&opened.lock);
	p = strdup(f->path);
	pthread_mutex_unlock(&opened.lock);
	return p;
}

/* Is a file open here at the name an unlink (to NULL) or rename removes,
 * or at or below the name a rename moves? Then set_aside() comes first:
 * its SMB handle may be closed at the moment (detached, or after a
 * reconnect), so SMB would not refuse and the open file would be lost. */
static bool in_way(const char *from, const char *to)
{
	struct sfile *f;
	bool found = false;

	pthread_mutex_lock(&opened.lock);
	for (f = opened.head; f && !found; f = f->next)
		found = at_or_below(f, to ? to : from, false) ||
			(to && at_or_below(f, from, true));
	pthread_mutex_unlock(&opened.lock);
	return found;
}


static int srmt_unlink(struct rmt *r, const char *path)
{
	int rc = -EBUSY, k = 2, tries = 0;

	if (in_way(path, NULL)) {
		k = set_aside(to_srmt(r), path, NULL, 0);
		if (k != 2)
			return k;
	}
	while (k == 2 && tries < RMT_BUSY_TRIES) {
		if (tries++)
			usleep((useconds_t)(tries - 1) * RMT_BUSY_WAIT_US);
		rc = call_path(to_srmt(r), OP_UNLINK, path, NULL, 0);
		if (rc != -EBUSY && rc != -EACCES)
			return rc;
		k = set_aside(to_srmt(r), path, NULL, 0);
		if (k <= 0 || rc == -EACCES)
			return k <= 0 ? k : rc; /* EACCES: not a busy file */
	}
	return rc;
}

static int srmt_mknod(struct rmt *r, const char *path, mode_t mode, dev_t rdev)
{
	(void)r, (void)path, (void)mode, (void)rdev;
	return -EPERM; /* no fifos or sockets over SMB2 */
}

static int srmt_symlink(struct rmt *r, const char *target, const char *path)
{
	(void)r, (void)target, (void)path;
	return -EPERM; /* symlink(2): the fs does not support symlinks */
}

/* Nothing is a symlink here: readlink(2) of a non-symlink. */
static int srmt_readlink(struct rmt *r, const char *path, char *buf,
			 size_t size)
{
	struct stat st;
	int rc = srmt_stat(r, path, &st);

	(void)buf, (void)size;
	return rc < 0 ? rc : -EINVAL;
}

static int srmt_link(struct rmt *r, const char *from, const char *to)
{
	(void)r, (void)from, (void)to;
	return -EPERM; /* link(2): no hard links on this fs */
}

static int srmt_rename(struct rmt *r, const char *from, const char *to,
		       unsigned int flags)
{
	int rc = -EBUSY, k = 2, tries = 0;

	if (flags & RMT_RENAME_EXCHANGE)
		return -EINVAL;
	if (in_way(from, to)) {
		k = set_aside(to_srmt(r), from, to, flags);
		if (k != 2)
			return k;
	}
	while (k == 2 && tries < RMT_BUSY_TRIES) {
		if (tries++)
			usleep((useconds_t)(tries - 1) * RMT_BUSY_WAIT_US);
		rc = call_path(to_srmt(r), OP_RENAME, from, to, (int64_t)flags);
		if (rc != -EBUSY && rc != -EACCES)
			return rc;
		k = set_aside(to_srmt(r), from, to, flags);
		if (k <= 0 || rc == -EACCES)
			return k <= 0 ? k : rc; /* EACCES: not a busy file */
	}
	return rc;
}

static int srmt_file_stat(struct rmt_file *f, struct stat *st)
{
	struct req q = { .op = OP_FSTAT,
			 .h = to_sfile(f)->h,
			 .wgen = to_sfile(f)->wgen };

	return (int)call(to_srmt(f->r), &q, NULL, NULL, NULL, 0, st,
			 sizeof(*st), NULL, NULL);
}

/* Fields in the order of remote.h: size, mode, uid/gid, times. */
static int setattr_named(struct srmt *s, const char *path, struct rmt_file *f,
			 const struct rmt_setattr *sa, const struct stat *stp);

static int srmt_setattr(struct rmt *r, const char *path, struct rmt_file *f,
			const struct rmt_setattr *sa)
{
	struct srmt *s = to_srmt(r);
	char *fpath = NULL;
	struct stat st = { 0 };
	int rc = 0;

	if (!path && !f)
		return -EINVAL;
	/* a stat by name is three round trips (open, query, close): only
	 * for the owner, or to answer for a file that is not there when
	 * nothing else asks the server (a mode alone); a truncate's open
	 * answers EISDIR for a directory itself */
	if ((sa->set & (RMT_SET_UID | RMT_SET_GID)) ||
	    !(sa->set & (RMT_SET_SIZE | RMT_SET_ATIME | RMT_SET_MTIME)))
		rc = f ? srmt_file_stat(f, &st) : srmt_stat(r, path, &st);
	if (rc < 0)
		return rc;
	/* by its name now (set aside if unlinked): libsmbclient has no
	 * fchmod or futimes */
	if (f && (sa->set & (RMT_SET_ATIME | RMT_SET_MTIME))) {
		fpath = path_of(to_sfile(f));
		if (!fpath)
			return -ENOMEM;
		path = fpath;
	}
	rc = setattr_named(s, path, f, sa, &st);
	free(fpath);
	return rc;
}

/* srmt_setattr() once the name is known; st is the file's stat where
 * srmt_setattr() needed one (an owner or a mode alone), else zeros. */
static int setattr_named(struct srmt *s, const char *path, struct rmt_file *f,
			 const struct rmt_setattr *sa, const struct stat *stp)
{
	struct stat st = *stp;
	int rc = 0;

	if (sa->set & RMT_SET_SIZE) {
		/* a directory: EISDIR from the open (w_open, w_truncate) */
		if (f) {
			struct req q = { .op = OP_FTRUNCATE,
					 .h = to_sfile(f)->h,
					 .wgen = to_sfile(f)->wgen,
					 .a = sa->size };

			to_sfile(f)->dirty = true;
			rc = (int)call(s, &q, NULL, NULL, NULL, 0, NULL, 0,
				       NULL, NULL);
		} else {
			rc = call_path(s, OP_TRUNCATE, path, NULL, sa->size);
		}
		if (rc < 0)
			return rc;
	}
	/* RMT_SET_MODE: accepted, not kept (top of this file) */
	if (((sa->set & RMT_SET_UID) && sa->uid != st.st_uid) ||
	    ((sa->set & RMT_SET_GID) && sa->gid != st.st_gid))
		return -EPERM; /* owners are the login's */
	if (sa->set & (RMT_SET_ATIME | RMT_SET_MTIME)) {
		struct timespec at = { .tv_nsec = UTIME_OMIT };
		struct timespec mt = { .tv_nsec = UTIME_OMIT };
		struct req q = { .op = OP_UTIMES };

		if (sa->set & RMT_SET_ATIME)
			at = sa->atime;
		if (sa->set & RMT_SET_MTIME)
			mt = sa->mtime;
		if (at.tv_nsec == UTIME_OMIT && mt.tv_nsec == UTIME_OMIT)
			return 0;
		q.a = at.tv_sec;
		q.b = at.tv_nsec;
		q.c = mt.tv_sec;
		q.d = mt.tv_nsec;
		detach_at(path);
		rc = (int)call(s, &q, path, NULL, NULL, 0, NULL, 0, NULL, NULL);
	}
	return rc;
}

/* No RMT_CAP_XATTR: remote.c answers before these could be called. */
static int srmt_file_open(struct rmt *r, const char *path, int flags,
			  mode_t mode, struct rmt_file **out)
{
	struct req q = { .op = OP_OPEN, .a = flags };
	struct sfile *sf;
	uint64_t h;
	int rc;

	(void)mode; /* SMB has no modes */
	if ((flags & O_ACCMODE) == O_ACCMODE)
		return -EINVAL;
	sf = calloc(1, sizeof(*sf));
	if (!sf)
		return -ENOMEM;
	rc = (int)call(to_srmt(r), &q, path, NULL, NULL, 0, &h, sizeof(h), NULL,
		       NULL);
	if (rc < 0) {
		free(sf);
		return rc;
	}
	sf->h = h;
	sf->wgen = to_srmt(r)->wgen;
	sf->base.r = r;
	sf->path = strdup(path);
	if (!sf->path) {
		struct req c = { .op = OP_CLOSE, .h = h, .wgen = sf->wgen };

		call(to_srmt(r), &c, NULL, NULL, NULL, 0, NULL, 0, NULL, NULL);
		free(sf);
		return -ENOMEM;
	}
	pthread_mutex_lock(&opened.lock);
	sf->next = opened.head;
	opened.head = sf;
	pthread_mutex_unlock(&opened.lock);
	*out = &sf->base;
	return 0;
}

static int srmt_file_close(struct rmt_file *f)
{
	struct req q = { .op = OP_CLOSE,
			 .h = to_sfile(f)->h,
			 .wgen = to_sfile(f)->wgen };
	struct sfile *sf = to_sfile(f), *o;
	bool last = true;
	int rc = 0;

	pthread_mutex_lock(&opened.lock);
	sfile_unlink(&opened.head, sf);
	for (o = opened.head; o && sf->aside; o = o->next)
		if (!strcmp(o->path, sf->path))
			last = false;
	sf->close_no = opened.closes++;
	sf->next = opened.closing;
	opened.closing = sf;
	pthread_mutex_unlock(&opened.lock);
	/* a file of a worker that is gone is closed with it */
	if (q.wgen == to_srmt(f->r)->wgen && !to_srmt(f->r)->dead)
		rc = (int)call(to_srmt(f->r), &q, NULL, NULL, NULL, 0, NULL, 0,
			       NULL, NULL);
	pthread_mutex_lock(&opened.lock);
	sfile_unlink(&opened.closing, sf);
	pthread_cond_broadcast(&opened.closed);
	pthread_mutex_unlock(&opened.lock);
	if (sf->aside && last)
		call_path(to_srmt(f->r), OP_UNLINK, sf->path, NULL, 0);
	free(sf->path);
	free(sf);
	return rc;
}

static ssize_t srmt_file_pread(struct rmt_file *f, void *buf, size_t len,
			       off_t off)
{
	size_t done = 0;

	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	while (done < len) {
		size_t n = len - done < IO_MAX ? len - done : IO_MAX, got;
		struct req q = { .op = OP_PREAD,
				 .h = to_sfile(f)->h,
				 .wgen = to_sfile(f)->wgen,
				 .a = off + (off_t)done,
				 .b = (int64_t)n };
		int64_t rc;

		rc = call(to_srmt(f->r), &q, NULL, NULL, NULL, 0,
			  (char *)buf + done, n, NULL, &got);
		if (rc < 0)
			return (ssize_t)rc;
		done += got;
		if (got < n)
			break; /* EOF */
	}
	return (ssize_t)done;
}

static ssize_t srmt_file_pwrite(struct rmt_file *f, const void *buf, size_t len,
				off_t off)
{
	size_t done = 0;

	if (len > SSIZE_MAX)
		return -EINVAL;
	to_sfile(f)->dirty = true;
	while (done < len) {
		size_t n = len - done < IO_MAX ? len - done : IO_MAX;
		struct req q = { .op = OP_PWRITE,
				 .h = to_sfile(f)->h,
				 .wgen = to_sfile(f)->wgen,
				 .a = off + (off_t)done };
		int64_t rc;

		rc = call(to_srmt(f->r), &q, NULL, NULL,
			  (const char *)buf + done, n, NULL, 0, NULL, NULL);
		if (rc < 0)
			return (ssize_t)rc;
		done += n;
	}
	return (ssize_t)len;
}

/*
 * close(2) of one descriptor: close the SMB handle of a written file (it
 * reopens on its next use). The server fixes the file's write time at that
 * close (SMB's write time semantics), and reports what it could not do;
 * without it a stat after close(2) could see a write time that changes
 * later.
 */
static int srmt_file_flush(struct rmt_file *f)
{
	struct sfile *sf = to_sfile(f);
	struct req q = { .op = OP_DETACH, .h = sf->h, .wgen = sf->wgen };
	int rc;

	if (!sf->dirty)
		return 0;
	rc = (int)call(to_srmt(f->r), &q, NULL, NULL, NULL, 0, NULL, 0, NULL,
		       NULL);
	if (rc == 0)
		sf->dirty = false;
	return rc;
}

/* No FLUSH in libsmbclient; writes were answered (top of this file). */
static int srmt_file_fsync(struct rmt_file *f, bool datasync)
{
	(void)f, (void)datasync;
	return 0;
}

/* Server-side (COPYCHUNK) between two files of one connection. */
static ssize_t srmt_file_copy(struct rmt_file *in, off_t off_in,
			      struct rmt_file *out, off_t off_out, size_t len)
{
	struct req q = { .op = OP_COPY,
			 .h = to_sfile(in)->h,
			 .wgen = to_sfile(in)->wgen,
			 .h2 = to_sfile(out)->h,
			 .a = off_in,
			 .b = off_out };
	size_t done = 0;

	if (in->r != out->r)
		return -EXDEV;
	if (to_sfile(out)->wgen != to_sfile(in)->wgen)
		return -EIO; /* one of them is of a worker that is gone */
	to_sfile(out)->dirty = true;
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	while (done < len) {
		size_t n = len - done < ((size_t)1 << 30) ? len - done :
							    (size_t)1 << 30;
		int64_t rc;

		q.a = off_in + (off_t)done;
		q.b = off_out + (off_t)done;
		q.c = (int64_t)n;
		rc = call(to_srmt(in->r), &q, NULL, NULL, NULL, 0, NULL, 0,
			  NULL, NULL);
		if (rc < 0)
			return done ? (ssize_t)rc : (ssize_t)rc;
		done += (size_t)rc;
		if ((size_t)rc < n)
			break; /* EOF of the source */
	}
	return (ssize_t)done;
}

static const struct rmt_ops smb_ops = {
	.name = "smb",
	.close = srmt_close,
	.stat = srmt_stat,
	.statfs = srmt_statfs,
	.name_check = srmt_name_check,
	.readdir = srmt_readdir,
	.mkdir = srmt_mkdir,
	.rmdir = srmt_rmdir,
	.unlink = srmt_unlink,
	.mknod = srmt_mknod,
	.symlink = srmt_symlink,
	.readlink = srmt_readlink,
	.link = srmt_link,
	.rename = srmt_rename,
	.setattr = srmt_setattr,
	.file_open = srmt_file_open,
	.file_close = srmt_file_close,
	.file_pread = srmt_file_pread,
	.file_pwrite = srmt_file_pwrite,
	.file_stat = srmt_file_stat,
	.file_fsync = srmt_file_fsync,
	.file_copy = srmt_file_copy,
	.file_fd = NULL,
	.file_flush = srmt_file_flush,
	.syncdir = NULL, /* SMB namespace calls are done when answered */
};

/* --- opening ----------------------------------------------------------- */

static void conf_release(struct conf *cf)
{
	free(cf->server);
	free(cf->base);
	explicit_bzero(cf->password, sizeof(cf->password));
}

static int set_field(char *dst, const char *src, size_t len)
{
	if (len >= CRED_MAX)
		return -ENAMETOOLONG;
	memcpy(dst, src, len);
	dst[len] = '\0';
	return 0;
}

/* Parse smb://[DOMAIN;]USER@HOST[:PORT]/SHARE[/path] into cf. */
static int parse_url(const char *url, struct conf *cf)
{
	const char *p = url + strlen("smb://"), *slash, *at, *semi, *host;
	size_t hlen, blen;
	char *b;
	int rc;

	if (strncmp(url, "smb://", 6) || strpbrk(p, "%?#\\")) {
		LOG_ERR("bad smb url '%s' (want smb://[DOMAIN;]USER@HOST/SHARE"
			"[/path], no '%%', '?', '#' or '\\')",
			url);
		return -EINVAL;
	}
	slash = strchr(p, '/');
	at = memchr(p, '@', slash ? (size_t)(slash - p) : strlen(p));
	host = p;
	if (at) {
		const char *colon = memchr(p, ':', (size_t)(at - p));

		if (colon) {
			LOG_ERR("smb url '%s': a password in the url is not "
				"taken; use -o credentials=FILE",
				url);
			return -EINVAL;
		}
		semi = memchr(p, ';', (size_t)(at - p));
		if (semi) {
			rc = set_field(cf->domain, p, (size_t)(semi - p));
			if (rc == 0)
				rc = set_field(cf->user, semi + 1,
					       (size_t)(at - semi - 1));
		} else {
			rc = set_field(cf->user, p, (size_t)(at - p));
		}
		if (rc < 0)
			return -EINVAL;
		host = at + 1;
	}
	hlen = slash ? (size_t)(slash - host) : strlen(host);
	if (!slash || hlen == 0 || memchr(host, ';', hlen)) {
		LOG_ERR("bad smb url '%s': no HOST/SHARE", url);
		return -EINVAL;
	}
	cf->server = strndup(host, hlen);
	/* base: smb://HOST/ + the path with '/' runs collapsed */
#if FUZZ_PLANT
	/* planted for tests/fuzz (fuzz_plant_opts): no room for the NUL of
	 * a path with nothing to collapse */
	blen = 6 + hlen + strlen(slash);
#else
	blen = 6 + hlen + strlen(slash) + 1;
#endif
	cf->base = b = malloc(blen);
	if (!cf->server || !b)
		return -ENOMEM;
	b += sprintf(b, "smb://%s", cf->server);
	for (p = slash; *p;) {
		size_t n;

		while (*p == '/')
			p++;
		n = strcspn(p, "/");
		if (!n)
			break;
		if ((n == 1 && p[0] == '.') ||
		    (n == 2 && p[0] == '.' && p[1] == '.')) {
			LOG_ERR("bad smb url '%s': '.' or '..' in the path",
				url);
			return -EINVAL;
		}
		*b++ = '/';
		memcpy(b, p, n);
		b += n;
		p += n;
	}
	*b = '\0';
	if (!strchr(cf->base + 6, '/')) {
		LOG_ERR("bad smb url '%s': no SHARE", url);
		return -EINVAL;
	}
	return 0;
}

#ifdef FERRYFS_FUZZ
/* tests/fuzz/fuzz_opts.c: parse_url() alone (remote_i.h) */
int rmt_smb_parse_url_fuzz(const char *url)
{
	struct conf cf = { 0 };
	int rc = parse_url(url, &cf);

	free(cf.server);
	free(cf.base);
	return rc;
}
#endif

/* Trim spaces at both ends of [*s, *s + *n). */
static void trim(const char **s, size_t *n)
{
	while (*n && (**s == ' ' || **s == '\t'))
		(*s)++, (*n)--;
	while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t' ||
		      (*s)[*n - 1] == '\r' || (*s)[*n - 1] == '\n'))
		(*n)--;
}

/* Read an smbclient -A style credentials file into cf (top of file). */
static int read_credentials(const char *file, struct conf *cf)
{
	char user[CRED_MAX] = "", domain[CRED_MAX] = "";
	char line[2 * CRED_MAX];
	struct stat st;
	FILE *fp;
	int fd, rc = 0, lineno = 0;

	fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		rc = -errno;
		LOG_ERR("cannot open credentials file '%s': %s", file,
			strerror(-rc));
		return rc;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		LOG_ERR("credentials file '%s' is not a regular file", file);
		close(fd);
		return -EINVAL;
	}
	if (st.st_mode & 077) {
		LOG_ERR("credentials file '%s' is readable or writable by group "
			"or others (mode %04o): refused, chmod 600 it",
			file, (unsigned int)(st.st_mode & 07777));
		close(fd);
		return -EACCES;
	}
	fp = fdopen(fd, "r");
	if (!fp) {
		close(fd);
		return -ENOMEM;
	}
	while (fgets(line, sizeof(line), fp)) {
		const char *k = line, *eq, *v;
		size_t kn, vn;
		char *dst;

		lineno++;
		kn = strlen(line);
		trim(&k, &kn);
		if (!kn || *k == '#' || *k == ';')
			continue;
		eq = memchr(k, '=', kn);
		if (!eq) {
			LOG_ERR("credentials file '%s' line %d: no '='", file,
				lineno);
			rc = -EINVAL;
			break;
		}
		v = eq + 1;
		vn = kn - (size_t)(v - k);
		kn = (size_t)(eq - k);
		trim(&k, &kn);
		trim(&v, &vn);
		if (kn == 8 && !strncmp(k, "username", 8))
			dst = user;
		else if (kn == 8 && !strncmp(k, "password", 8))
			dst = cf->password;
		else if ((kn == 6 && !strncmp(k, "domain", 6)) ||
			 (kn == 9 && !strncmp(k, "workgroup", 9)))
			dst = domain;
		else
			continue; /* smbclient ignores other keys too */
		if (set_field(dst, v, vn) < 0) {
			LOG_ERR("credentials file '%s' line %d: too long", file,
				lineno);
			rc = -EINVAL;
			break;
		}
	}
	explicit_bzero(line, sizeof(line));
	fclose(fp);
	if (rc < 0)
		return rc;
	if (!cf->user[0])
		memcpy(cf->user, user, sizeof(user));
	if (!cf->domain[0])
		memcpy(cf->domain, domain, sizeof(domain));
	return 0;
}

struct smb_opts {
	char *credentials;
};

static int take_opt(const char *item, size_t klen, const char *value, void *arg)
{
	struct smb_opts *o = arg;

	if (klen == 11 && !strncmp(item, "credentials", 11) && value &&
	    *value) {
		free(o->credentials);
		o->credentials = strdup(value);
		return o->credentials ? 1 : -ENOMEM;
	}
	LOG_ERR("unknown or malformed option '%s' for an smb:// remote", item);
	return -EINVAL;
}

/*
 * Fork a worker for this process and wait for its HELLO (connect + stat of
 * the root): rmt_smb_open(), and call() after a fork of this process.
 * Called with s->lock held or before s is shared. On error nothing of s
 * changed but its fd (closed) and the error is logged.
 */
static int spawn(struct srmt *s)
{
	struct req q = { .op = OP_HELLO };
	struct iovec iov = { .iov_base = &q, .iov_len = sizeof(q) };
	int sv[2], buf = SOCK_BUF, i, rc, mfd, a3, a4;
	pid_t parent = getpid(), pid;
	bool main_thread = gettid() == parent;
	char ppid[16], flags[4], arg0[] = "ferryfs-smb", arg1[] = WORKER_ARG;
	char *argv[] = { arg0, arg1, ppid, flags, NULL };
	struct stat st;
	struct rep rep;
	size_t olen = 0;

	if (s->fd >= 0)
		close(s->fd); /* a worker of another process, or none */
	s->fd = -1;
	if (s->shm)
		munmap(s->shm, IO_MAX); /* that worker's */
	s->shm = NULL;
	mfd = memfd_create("ferryfs-smb-io", MFD_CLOEXEC);
	if (mfd < 0 || ftruncate(mfd, (off_t)IO_MAX) < 0) {
		rc = -errno;
		if (mfd >= 0)
			close(mfd);
		return rc;
	}
	s->shm = mmap(NULL, IO_MAX, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (s->shm == MAP_FAILED) {
		rc = -errno;
		s->shm = NULL;
		close(mfd);
		return rc;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		rc = -errno;
		close(mfd);
		goto out_shm;
	}
	for (i = 0; i < 2; i++) {
		if (setsockopt(sv[i], SOL_SOCKET, SO_SNDBUFFORCE, &buf,
			       sizeof(buf)) < 0)
			setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &buf,
				   sizeof(buf));
		if (setsockopt(sv[i], SOL_SOCKET, SO_RCVBUFFORCE, &buf,
			       sizeof(buf)) < 0)
			setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &buf,
				   sizeof(buf));
	}
	snprintf(ppid, sizeof(ppid), "%d", (int)parent);
	snprintf(flags, sizeof(flags), "%s%s", log_debug_enabled ? "d" : "",
		 log_in_syslog ? "s" : "");
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		rc = -errno;
		close(sv[0]);
		close(sv[1]);
		close(mfd);
		goto out_shm;
	}
	if (pid == 0) {
		/* async-signal-safe calls only, up to the exec (above
		 * worker_start()); PR_SET_PDEATHSIG follows the forking
		 * thread: only the main thread's is as long-lived as the
		 * process (top of file) */
		if (main_thread)
			prctl(PR_SET_PDEATHSIG, SIGKILL);
		/* above 4 first, so neither dup2() closes the other's fd */
		a3 = fcntl(sv[1], F_DUPFD, 5);
		a4 = fcntl(mfd, F_DUPFD, 5);
		if (a3 >= 0 && a4 >= 0 && dup2(a3, 3) == 3 && dup2(a4, 4) == 4)
			execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(sv[1]);
	close(mfd);
	rc = send_conf(sv[0], &s->cf);
	if (rc == 0)
		rc = exchange(sv[0], &iov, 1, &rep, &st, sizeof(st), NULL,
			      &olen);
	if (rc < 0)
		rc = -EIO; /* the worker died */
	else
		rc = (int)rep.rc;
	if (rc == 0 && (olen != sizeof(st) || !S_ISDIR(st.st_mode)))
		rc = -ENOTDIR;
	if (rc < 0) {
		if (rc == -EACCES || rc == -EPERM)
			LOG_ERR("cannot log in to '%s' as '%s%s%s': %s (wrong "
				"user or password?)",
				s->base.id, s->cf.domain,
				s->cf.domain[0] ? ";" : "", s->cf.user,
				strerror(-rc));
		else
			LOG_ERR("cannot connect to '%s': %s", s->base.id,
				strerror(-rc));
		close(sv[0]);
		reap(pid);
		goto out_shm;
	}
	s->fd = sv[0];
	s->pid = pid;
	s->owner = parent;
	s->wgen++;
	s->dead = false;
	return 0;

out_shm:
	munmap(s->shm, IO_MAX);
	s->shm = NULL;
	return rc;
}

int rmt_smb_open(const char *url, const char *opts, struct rmt **out)
{
	struct smb_opts o = { 0 };
	struct srmt *s;
	char *rest = NULL;
	int rc;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->fd = -1;
	rc = rmt_opts_split(opts, take_opt, &o, &rest);
	free(rest); /* every item is ours or an error */
	if (rc < 0)
		goto out_s;
	rc = parse_url(url, &s->cf);
	if (rc < 0)
		goto out_s;
	if (o.credentials) {
		rc = read_credentials(o.credentials, &s->cf);
		if (rc < 0)
			goto out_s;
	}
	if (!s->cf.user[0]) {
		LOG_ERR("smb url '%s': no user (smb://USER@HOST/SHARE, or "
			"username in -o credentials=FILE)",
			url);
		rc = -EINVAL;
		goto out_s;
	}
	s->base.id = strdup(s->cf.base);
	if (!s->base.id) {
		rc = -ENOMEM;
		goto out_s;
	}
	pthread_mutex_init(&s->lock, NULL);
	rc = spawn(s);
	if (rc < 0)
		goto out_lock;
	s->base.ops = &smb_ops;
	/* one worker: for one thread, the pool's; a close can report */
	s->base.caps = RMT_CAP_CLOSE_ERRORS; /* none of RMT_CAPS_POSIX */
	*out = &s->base;
	free(o.credentials);
	return 0;

out_lock:
	pthread_mutex_destroy(&s->lock);
	free(s->base.id);
out_s:
	conf_release(&s->cf);
	free(s);
	free(o.credentials);
	return rc;
}

#ifdef FERRYFS_FUZZ
/* tests/fuzz/fuzz_smb.c: the decoding ends of the worker protocol, each
 * reading the bytes a peer wrote into the socket @fd (remote_i.h). */

/* The worker's: the conf (recv_conf()), then requests (worker_read_req())
 * until one is refused or the stream ends. The requests' URLs are made
 * from @base. */
int rmt_smb_worker_fuzz(int fd, bool conf, const char *base)
{
	struct conf cf = { 0 };
	struct worker w = { .cf = &cf, .fd = fd, .parent = getppid() };
	struct req q;
	int rc = 0, i;

	if (conf) {
		rc = recv_conf(fd, &cf);
		conf_release(&cf);
		return rc;
	}
	cf.base = (char *)base;
	w.url_size = strlen(base) + 3 * PATH_MAX + 2;
	w.url1 = malloc(w.url_size);
	w.url2 = malloc(w.url_size);
	if (!w.url1 || !w.url2 || buf_need(&w, PATH_MAX) < 0) {
		rc = -ENOMEM;
		goto out;
	}
	for (i = 0; i < 64 && rc == 0; i++)
		rc = worker_read_req(&w, &q);
out:
	free(w.url1);
	free(w.url2);
	free(w.buf);
	return rc;
}

static int count_entry(const char *name, const struct stat *st, void *arg)
{
	(void)st;
	*(size_t *)arg += strlen(name);
	return 0;
}

/* The parent's: one reply read by exchange() (after sending a request of
 * no paths), into a struct stat's room (@dyn false) or a buffer of its
 * size (@dyn true) walked as a READDIR listing (listing_walk()). */
int rmt_smb_reply_fuzz(int fd, bool dyn)
{
	struct req q = { .op = OP_READDIR };
	struct iovec iov = { &q, sizeof(q) };
	struct rep rep;
	struct stat st;
	void *list = NULL;
	size_t len = 0, names = 0;
	int rc;

	if (!dyn)
		return exchange(fd, &iov, 1, &rep, &st, sizeof(st), NULL,
				NULL);
	rc = exchange(fd, &iov, 1, &rep, NULL, 0, &list, &len);
	if (rc == 0 && rep.rc == 0)
		rc = listing_walk(list, len, false, count_entry, &names);
	free(list);
	return rc;
}
#endif
