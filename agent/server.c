/*
 * server.c - ferry-agent: serves one directory (--root) to ferryfs
 * flushers over the protocol of agent.h. It runs next to the share (on the
 * NAS, or a box with local access to its disks), so the bytes of a flush
 * arrive over the network and are written to a local disk: the fast
 * direction of NFS/SMB (network read, local write) instead of the slow one.
 *
 * One thread per connection; a connection is one flush stream of one
 * ferryfs. Requests are answered in order. A PUT that is not inline is
 * pulled: the agent checks whether the file already holds bytes with the
 * chunk's SHA-256 (a resend after a crash: "want" 0, nothing fetched), else
 * answers "want" 1 when it is ready for them, then takes the DATA frame,
 * writes it, checks the SHA-256 of what it got, fdatasync()s, and only
 * then acknowledges. So the agent paces the flusher: the next chunk comes
 * when its disk has taken the last one.
 *
 * CONFINEMENT (invariant): every path is resolved beneath the root with
 * openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) -
 * no "..", no absolute path, no symlink anywhere in it is followed; the last
 * component is acted on through its parent's fd with *at() calls that do
 * not follow it (chmod goes through an O_PATH fd of the object itself).
 * Paths are also checked by the parser (clean, relative) first.
 *
 * FILE DESCRIPTORS: main.c raises the soft RLIMIT_NOFILE to the hard one.
 * Out of them all the same (EMFILE/ENFILE at accept), the listener would
 * stay readable and accept() fail at once, for ever: a spin at 100% CPU.
 * So the server keeps one spare fd (/dev/null); then it closes it,
 * accepts the waiting connection, closes that at once (the peer sees its
 * connection closed, as when max_conns are served) and takes the spare
 * back; if it cannot, it sleeps SHED_SLEEP_MS between tries
 * (shed_one()). Either way a connection that ends gives its fd back and
 * the next accept() works again.
 *
 * CONNECTIONS: one still in its handshake (at most AGENT_HANDSHAKE_MS,
 * agent.h) holds a place of its own: at most PRE_MAX of them, PRE_PEER
 * from one address; past that a connection is closed at once. Only an
 * authenticated one counts against max_conns, so idle or slow strangers
 * cannot push the mount's streams off the agent. Refusals are logged at
 * most once a second, with a count of those not logged (refuse_log()).
 *
 * Errors: a request that fails gets its -errno in the reply; a malformed
 * frame gets -EPROTO and the connection is closed; a frame with a bad tag
 * or seq closes it at once. Nothing of a peer's input can crash it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <linux/openat2.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "crash.h"
#include "server.h"

#define HANDLES_MAX 256
#define SHED_SLEEP_MS 100   /* out of fds and no spare: between accepts */
#define SHED_LOG_S 10       /* at most one "out of fds" line in that time */

/* One line on stderr in one write: connections' threads log at once (a
 * format and its newline written apart mixed two lines into one). */
static void agent_log(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
static void agent_log(const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "ferry-agent: %s\n", line);
}

#define LOG(...) agent_log(__VA_ARGS__)

struct handle {
	uint32_t hid; /* 0 = free */
	int fd;
};

#define PRE_MAX 32  /* connections in the handshake */
#define PRE_PEER 16 /* of them from one address */

struct conn {
	struct agent_server *srv;
	struct conn *next, *prev; /* in srv->conns, protected by srv->lock */
	bool authed;              /* past the handshake; srv->lock */
	int fd;
	char peer[64];
	struct agent_conn c;
	struct handle h[HANDLES_MAX];
	struct agent_buf out;   /* the reply being built */
	struct agent_req q;
	uint8_t *buf;           /* PREAD and the have-check */
	size_t bufcap;
	uint64_t bytes_in, bytes_have, puts;
};

struct agent_server {
	int root;
	int lfd;                /* -1: none (agent_server_serve_fd() only) */
	int spare;              /* /dev/null kept for shed_one(), or -1; used
				   by agent_server_run()'s thread only */
	unsigned long long shed; /* connections closed for want of an fd */
	time_t shed_logged;     /* when shed_one() last logged */
	bool encrypt;
	struct agent_key key;
	unsigned int max_conns;
	pthread_mutex_t lock;
	pthread_cond_t gone;    /* signalled when a connection ends */
	struct conn *conns;     /* protected by lock */
	unsigned int nconns;    /* protected by lock: all of them */
	unsigned int nauth;     /* of them authenticated (lock) */
	time_t refuse_t;        /* refuse_log(): the second last logged */
	unsigned long long refuse_n; /* refusals not logged since (lock) */
};

/* Log a refusal of @peer, at most one a second (a flood of strangers
 * must not flood the log): the others are counted in the next line. */
static void refuse_log(struct agent_server *s, const char *peer,
		       const char *why)
{
	time_t now = time(NULL);
	unsigned long long more = 0;
	bool say = false;

	pthread_mutex_lock(&s->lock);
	if (now != s->refuse_t) {
		say = true;
		more = s->refuse_n;
		s->refuse_t = now;
		s->refuse_n = 0;
	} else {
		s->refuse_n++;
	}
	pthread_mutex_unlock(&s->lock);
	if (say && more)
		LOG("%s: refused: %s (and %llu more refused, not logged)",
		    peer, why, more);
	else if (say)
		LOG("%s: refused: %s", peer, why);
}

/* --- paths ------------------------------------------------------------------- */

static int open_beneath(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.mode = (flags & O_CREAT) ? mode : 0,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
			   RESOLVE_NO_MAGICLINKS,
	};
	long fd;

	do
		fd = syscall(SYS_openat2, dirfd, *path ? path : ".", &how,
			     sizeof(how));
	while (fd < 0 && errno == EINTR);
	return fd < 0 ? -errno : (int)fd;
}

/* The parent directory of @path (an O_PATH fd) and its last component. */
static int parent_of(struct conn *k, const char *path, const char **base)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');

	if (!slash) {
		*base = path;
		return open_beneath(k->srv->root, "", O_PATH | O_DIRECTORY, 0);
	}
	memcpy(dir, path, (size_t)(slash - path));
	dir[slash - path] = 0;
	*base = slash + 1;
	return open_beneath(k->srv->root, dir, O_PATH | O_DIRECTORY, 0);
}

static int sys_rc(int rc)
{
	return rc < 0 ? -errno : rc;
}

/* --- handles ------------------------------------------------------------------- */

static struct handle *handle_find(struct conn *k, uint32_t hid)
{
	for (int i = 0; hid && i < HANDLES_MAX; i++)
		if (k->h[i].hid == hid)
			return &k->h[i];
	return NULL;
}

static int handle_fd(struct conn *k, uint32_t hid)
{
	struct handle *h = handle_find(k, hid);

	return h ? h->fd : -EBADF;
}

static void handles_close(struct conn *k)
{
	for (int i = 0; i < HANDLES_MAX; i++)
		if (k->h[i].hid) {
			close(k->h[i].fd);
			k->h[i].hid = 0;
		}
}

/* --- operations -------------------------------------------------------------- */

static int do_open(struct conn *k, const struct agent_req *q)
{
	int flags = (int)q->flags & (O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC);
	struct handle *free_h = NULL;
	struct stat st = { 0 };
	int fd, rc;

	if (handle_find(k, q->hid))
		return -EEXIST;
	for (int i = 0; i < HANDLES_MAX && !free_h; i++)
		if (!k->h[i].hid)
			free_h = &k->h[i];
	if (!free_h)
		return -EMFILE;
	fd = open_beneath(k->srv->root, q->path,
			  flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY,
			  q->mode & 07777);
	if (fd < 0)
		return fd;
	rc = sys_rc(fstat(fd, &st));
	if (!rc && !S_ISREG(st.st_mode))
		rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
	if (rc) {
		close(fd);
		return rc;
	}
	free_h->hid = q->hid;
	free_h->fd = fd;
	return 0;
}

/* chmod of the object @dirfd/@base itself, never what a symlink names */
static int chmod_at(int dirfd, const char *base, mode_t mode)
{
	char proc[64];
	struct stat st;
	int fd, rc;

	fd = openat(dirfd, base, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st))
		rc = -errno;
	else if (S_ISLNK(st.st_mode))
		rc = -EOPNOTSUPP;
	else {
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
		rc = sys_rc(chmod(proc, mode & 07777));
	}
	close(fd);
	return rc;
}

static int do_setattr(struct conn *k, const struct agent_req *q)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
				  { .tv_nsec = UTIME_OMIT } };
	const char *base = NULL;
	int fd = -1, dirfd = -1, rc = 0;
	bool own = false;

	if (q->hid) {
		fd = handle_fd(k, q->hid);
		if (fd < 0)
			return fd;
	} else if (!q->path[0]) {
		dirfd = k->srv->root;
		base = ".";
	} else {
		dirfd = parent_of(k, q->path, &base);
		if (dirfd < 0)
			return dirfd;
		own = true;
	}
	if (q->set & AGENT_SET_SIZE) {
		if (fd >= 0) {
			rc = sys_rc(ftruncate(fd, (off_t)q->size));
		} else {
			int tfd = open_beneath(k->srv->root, q->path,
					       O_WRONLY | O_NOFOLLOW |
						       O_NONBLOCK, 0);

			rc = tfd < 0 ? tfd : sys_rc(ftruncate(tfd,
							      (off_t)q->size));
			if (tfd >= 0)
				close(tfd);
		}
	}
	/* owner before mode: a chown clears the setuid and setgid bits,
	 * even root's */
	if (!rc && (q->set & (AGENT_SET_UID | AGENT_SET_GID))) {
		uid_t u = (q->set & AGENT_SET_UID) ? q->uid : (uid_t)-1;
		gid_t g = (q->set & AGENT_SET_GID) ? q->gid : (gid_t)-1;

		rc = fd >= 0 ? sys_rc(fchown(fd, u, g)) :
			       sys_rc(fchownat(dirfd, base, u, g,
					       AT_SYMLINK_NOFOLLOW));
	}
	if (!rc && (q->set & AGENT_SET_MODE))
		rc = fd >= 0 ? sys_rc(fchmod(fd, q->mode & 07777)) :
			       chmod_at(dirfd, base, q->mode);
	if (!rc && (q->set & (AGENT_SET_ATIME | AGENT_SET_MTIME))) {
		if (q->set & AGENT_SET_ATIME)
			ts[0] = q->atime;
		if (q->set & AGENT_SET_MTIME)
			ts[1] = q->mtime;
		rc = fd >= 0 ? sys_rc(futimens(fd, ts)) :
			       sys_rc(utimensat(dirfd, base, ts,
						AT_SYMLINK_NOFOLLOW));
	}
	if (own)
		close(dirfd);
	return rc;
}

static int buf_need(struct conn *k, size_t n)
{
	if (n > k->bufcap) {
		uint8_t *b = realloc(k->buf, n);

		if (!b)
			return -ENOMEM;
		k->buf = b;
		k->bufcap = n;
	}
	return 0;
}

static void sha256(const void *p, size_t n, uint8_t out[32])
{
	if (!EVP_Digest(p, n, out, NULL, EVP_sha256(), NULL))
		memset(out, 0, 32);
}

static int write_all(int fd, const uint8_t *p, size_t n, off_t off)
{
	while (n) {
		ssize_t w = pwrite(fd, p, n, off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
		off += w;
	}
	return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && !memcmp(p, p + 1, n - 1));
}

#define SPARSE_BLOCK 4096u

/*
 * Write a chunk and fdatasync it (unless !@sync: the caller does). Past the file's end, blocks of zeros
 * are not written (they stay holes, as journal/flush.c's write_sparse()
 * keeps them); a last byte marks where the chunk ends (a write never
 * shrinks the file, which a truncate could under another stream's chunk).
 */
static int write_chunk(int fd, const uint8_t *p, size_t n, off_t off,
		       bool sync)
{
	struct stat st;
	size_t head, pos, run;
	int rc;

	if (fstat(fd, &st))
		return -errno;
	head = st.st_size <= off ? 0 :
	       (uint64_t)(st.st_size - off) >= n ? n :
						    (size_t)(st.st_size - off);
	rc = write_all(fd, p, head, off);
	for (pos = head; !rc && pos < n; pos += run) {
		run = SPARSE_BLOCK - (size_t)((uint64_t)(off + (off_t)pos) %
					      SPARSE_BLOCK);
		if (run > n - pos)
			run = n - pos;
		if (!all_zero(p + pos, run))
			rc = write_all(fd, p + pos, run, off + (off_t)pos);
	}
	if (!rc && n > head && all_zero(p + n - 1, 1))
		rc = write_all(fd, p + n - 1, 1, off + (off_t)n - 1);
	CRASH_POINT("agent_before_sync"); /* written, not synced */
	return rc || !sync ? rc : sys_rc(fdatasync(fd));
}

/* Does the file hold the chunk already (same SHA-256)? A range that is
 * all hole (other streams wrote chunks past it) is not read and hashed:
 * it is fetched (if the chunk is all zeros, that costs one transfer). */
static bool have(struct conn *k, int fd, const struct agent_req *q)
{
	uint8_t sha[32];
	struct stat st;
	off_t data;
	ssize_t n;

	if (fstat(fd, &st) || (uint64_t)st.st_size < q->off + q->len ||
	    buf_need(k, q->len))
		return false;
	data = lseek(fd, (off_t)q->off, SEEK_DATA);
	if ((data < 0 && errno == ENXIO) ||
	    (data >= 0 && (uint64_t)data >= q->off + q->len))
		return false;
	n = pread(fd, k->buf, q->len, (off_t)q->off);
	if (n != (ssize_t)q->len)
		return false;
	sha256(k->buf, q->len, sha);
	return !CRYPTO_memcmp(sha, q->sha, 32);
}

/* A REPLY to the request just received: its seq, @status, @n bytes. */
static int reply_raw(struct conn *k, int status, const void *p, size_t n)
{
	uint8_t hdr[12];
	uint64_t seq = k->c.seq_in - 1;

	for (int i = 0; i < 8; i++)
		hdr[i] = (uint8_t)(seq >> (8 * i));
	for (int i = 0; i < 4; i++)
		hdr[8 + i] = (uint8_t)((uint32_t)status >> (8 * i));
	return agent_send(&k->c, AGENT_T_REPLY, hdr, sizeof(hdr), p, n);
}

static int reply(struct conn *k, int status)
{
	if (!agent_buf_ok(&k->out))
		return reply_raw(k, -ENOMEM, NULL, 0);
	return reply_raw(k, status, k->out.p, status ? 0 : k->out.len);
}

/*
 * PUT: inline bytes are written at once; otherwise "want" and the DATA
 * frame. Returns the status to reply, or a connection error (*fatal).
 */
static int put_fd(struct conn *k, int fd, const struct agent_req *q,
		  uint32_t *want, bool *fatal, bool sync)
{
	uint8_t sha[32];
	const uint8_t *p;
	uint16_t type;
	size_t len;
	int rc;

	*want = 0;
	k->puts++;
	if (q->inline_data) {
		sha256(q->data, q->len, sha);
		if (CRYPTO_memcmp(sha, q->sha, 32))
			return -EIO;
		k->bytes_in += q->len;
		return write_chunk(fd, q->data, q->len, (off_t)q->off, sync);
	}
	if (have(k, fd, q)) {
		k->bytes_have += q->len;
		return 0;
	}
	/* ask for the bytes now: our disk took the last chunk */
	*want = 1;
	{
		uint8_t w[4] = { 1, 0, 0, 0 };

		rc = reply_raw(k, 0, w, sizeof(w));
	}
	if (!rc)
		rc = agent_recv(&k->c, &type, &p, &len);
	if (!rc && (type != AGENT_T_DATA || len != q->len))
		rc = -EPROTO;
	if (rc) {
		*fatal = true;
		return rc;
	}
	k->bytes_in += len;
	if (k->c.encrypt)
		sha256(p, len, sha);
	else /* the frame's check hashed these very bytes */
		memcpy(sha, k->c.data_sha, 32);
	if (CRYPTO_memcmp(sha, q->sha, 32))
		return -EIO;
	return write_chunk(fd, p, len, (off_t)q->off, true);
}

/*
 * PUT (to an open file) or PUTP (to the file at a path, opened for it).
 * @synced: NULL to fdatasync before returning; else (an inline one in a
 * batch) *synced gets an fd of the file for the caller to fdatasync and
 * close, so one batch costs the disk about one journal commit.
 */
static int do_put(struct conn *k, const struct agent_req *q, uint32_t *want,
		  bool *fatal, int *synced)
{
	int fd, rc;

	if (q->type == AGENT_T_PUT) {
		fd = handle_fd(k, q->hid);
		if (fd >= 0 && synced)
			fd = sys_rc(fcntl(fd, F_DUPFD_CLOEXEC, 0));
	} else {
		fd = open_beneath(k->srv->root, q->path,
				  O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY,
				  0);
	}
	if (fd < 0)
		return fd;
	rc = put_fd(k, fd, q, want, fatal, !synced);
	if (synced && !rc)
		*synced = fd;
	else if (synced || q->type == AGENT_T_PUTP)
		close(fd);
	return rc;
}

/* Carry out one request (not PUT, BATCH); the result goes to k->out. */
static int do_req(struct conn *k, const struct agent_req *q)
{
	const char *base, *base2;
	struct stat st;
	struct statvfs sv;
	int dfd, dfd2, fd, rc;

	switch (q->type) {
	case AGENT_T_STAT:
		if (!q->path[0])
			rc = sys_rc(fstat(k->srv->root, &st));
		else {
			dfd = parent_of(k, q->path, &base);
			if (dfd < 0)
				return dfd;
			rc = sys_rc(fstatat(dfd, base, &st,
					    AT_SYMLINK_NOFOLLOW));
			close(dfd);
		}
		if (!rc)
			agent_put_stat(&k->out, &st);
		return rc;
	case AGENT_T_STATFS:
		rc = sys_rc(fstatvfs(k->srv->root, &sv));
		if (!rc)
			agent_put_statfs(&k->out, &sv);
		return rc;
	case AGENT_T_MKDIR:
	case AGENT_T_RMDIR:
	case AGENT_T_UNLINK:
	case AGENT_T_MKNOD:
	case AGENT_T_SYMLINK:
	case AGENT_T_READLINK:
		dfd = parent_of(k, q->path, &base);
		if (dfd < 0)
			return dfd;
		switch (q->type) {
		case AGENT_T_MKDIR:
			rc = sys_rc(mkdirat(dfd, base, q->mode & 07777));
			break;
		case AGENT_T_RMDIR:
			rc = sys_rc(unlinkat(dfd, base, AT_REMOVEDIR));
			break;
		case AGENT_T_UNLINK:
			rc = sys_rc(unlinkat(dfd, base, 0));
			break;
		case AGENT_T_MKNOD:
			rc = (S_ISFIFO(q->mode) || S_ISSOCK(q->mode)) ?
				     sys_rc(mknodat(dfd, base, q->mode, 0)) :
				     -EPERM;
			break;
		case AGENT_T_SYMLINK:
			rc = sys_rc(symlinkat(q->path2, dfd, base));
			break;
		default: { /* READLINK */
			char t[PATH_MAX];
			ssize_t n = readlinkat(dfd, base, t, sizeof(t) - 1);

			rc = n < 0 ? -errno : 0;
			if (!rc) {
				t[n] = 0;
				agent_put_str(&k->out, t);
			}
		}
		}
		close(dfd);
		return rc;
	case AGENT_T_LINK:
	case AGENT_T_RENAME:
		dfd = parent_of(k, q->path, &base);
		if (dfd < 0)
			return dfd;
		dfd2 = parent_of(k, q->path2, &base2);
		if (dfd2 < 0) {
			close(dfd);
			return dfd2;
		}
		if (q->type == AGENT_T_LINK)
			rc = sys_rc(linkat(dfd, base, dfd2, base2, 0));
		else if (q->flags & ~(unsigned int)(RENAME_NOREPLACE |
						     RENAME_EXCHANGE))
			rc = -EINVAL;
		else
			rc = sys_rc(renameat2(dfd, base, dfd2, base2,
					      q->flags));
		close(dfd);
		close(dfd2);
		return rc;
	case AGENT_T_SETATTR:
		return do_setattr(k, q);
	case AGENT_T_OPEN:
		return do_open(k, q);
	case AGENT_T_CLOSE: {
		struct handle *h = handle_find(k, q->hid);

		if (!h)
			return -EBADF;
		rc = sys_rc(close(h->fd));
		h->hid = 0;
		return rc;
	}
	case AGENT_T_FSTAT:
		fd = handle_fd(k, q->hid);
		if (fd < 0)
			return fd;
		rc = sys_rc(fstat(fd, &st));
		if (!rc)
			agent_put_stat(&k->out, &st);
		return rc;
	case AGENT_T_FSYNC:
		fd = handle_fd(k, q->hid);
		if (fd < 0)
			return fd;
		return sys_rc(q->datasync ? fdatasync(fd) : fsync(fd));
	case AGENT_T_PREAD: {
		ssize_t n;

		fd = handle_fd(k, q->hid);
		if (fd < 0)
			return fd;
		rc = buf_need(k, q->len);
		if (rc)
			return rc;
		n = pread(fd, k->buf, q->len, (off_t)q->off);
		if (n < 0)
			return -errno;
		agent_put_bytes(&k->out, k->buf, (size_t)n);
		return 0;
	}
	}
	return -EPROTO;
}

/* Is the BATCH well-formed, every request in it too? (0 or -EPROTO) */
static int batch_check(struct conn *k, const uint8_t *p, size_t len)
{
	struct agent_batch_rd b;
	uint16_t type, group;
	const uint8_t *rq;
	size_t rlen;
	int rc;

	rc = agent_batch_open(&b, p, len);
	while (!rc && (rc = agent_batch_next(&b, &type, &group, &rq,
					     &rlen)) == 1) {
		rc = agent_req_parse(type, rq, rlen, &k->q);
		if (rc == -EPROTO || ((type == AGENT_T_PUT ||
				       type == AGENT_T_PUTP) &&
				      !k->q.inline_data))
			return -EPROTO;
		rc = 0;
	}
	return rc;
}

/* BATCH: checked whole first (a malformed one does nothing), then each
 * request in turn; after a failure, the rest of its group is skipped
 * (-ECANCELED). Statuses only. */
static int do_batch(struct conn *k, const uint8_t *p, size_t len)
{
	struct agent_batch_rd b;
	int32_t st[AGENT_BATCH_MAX];
	int sync_fd[AGENT_BATCH_MAX];
	uint16_t type, group, failed_group = 0;
	bool failed = false;
	const uint8_t *rq;
	size_t rlen;
	uint32_t n = 0;
	int rc;

	rc = batch_check(k, p, len);
	if (!rc)
		rc = agent_batch_open(&b, p, len);
	while (!rc && (rc = agent_batch_next(&b, &type, &group, &rq,
					     &rlen)) == 1) {
		rc = agent_req_parse(type, rq, rlen, &k->q);
		sync_fd[n] = -1;
		if (failed && group == failed_group) {
			rc = -ECANCELED;
		} else if (!rc && (type == AGENT_T_PUT ||
				   type == AGENT_T_PUTP)) {
			uint32_t want;
			bool fatal = false;

			rc = do_put(k, &k->q, &want, &fatal, &sync_fd[n]);
		} else if (!rc) {
			size_t mark = k->out.len;

			rc = do_req(k, &k->q);
			k->out.len = mark; /* results are not returned */
		}
		failed = rc != 0;
		failed_group = group;
		st[n++] = rc;
		rc = 0;
	}
	/* the writes are acknowledged durable: one sync pass at the end */
	for (uint32_t i = 0; i < n; i++) {
		if (sync_fd[i] < 0)
			continue;
		CRASH_POINT("agent_before_sync");
		if (rc >= 0 && !st[i])
			st[i] = sys_rc(fdatasync(sync_fd[i]));
		close(sync_fd[i]);
	}
	if (rc < 0)
		return rc;
	agent_put_u32(&k->out, n);
	for (uint32_t i = 0; i < n; i++)
		agent_put_u32(&k->out, (uint32_t)st[i]);
	return 0;
}

/* --- connections ---------------------------------------------------------------- */

static void serve(struct conn *k)
{
	const uint8_t *p;
	uint16_t type;
	size_t len;
	int rc;

	rc = agent_handshake_agent(k->fd, &k->srv->key, k->srv->encrypt,
				   &k->c);
	if (rc) {
		refuse_log(k->srv, k->peer,
			   rc == -EACCES ? "wrong key" : strerror(-rc));
		return;
	}
	pthread_mutex_lock(&k->srv->lock);
	if (k->srv->nauth < k->srv->max_conns) {
		k->authed = true;
		k->srv->nauth++;
	}
	pthread_mutex_unlock(&k->srv->lock);
	if (!k->authed) {
		refuse_log(k->srv, k->peer, "max_conns connections served");
		return;
	}
	for (;;) {
		rc = agent_recv(&k->c, &type, &p, &len);
		if (rc) {
			if (rc != -ECONNRESET)
				LOG("%s: closing: %s", k->peer,
				    rc == -EBADMSG ? "a frame failed its "
						     "check (tampered, "
						     "replayed or reordered)" :
						     strerror(-rc));
			return;
		}
		k->out.len = 0;
		k->out.bad = false; /* a failed allocation fails one reply */
		if (type == AGENT_T_BATCH) {
			rc = do_batch(k, p, len);
		} else if (type == AGENT_T_PUT || type == AGENT_T_PUTP) {
			uint32_t want = 0;
			bool fatal = false;

			rc = agent_req_parse(type, p, len, &k->q);
			if (!rc)
				rc = do_put(k, &k->q, &want, &fatal, NULL);
			if (fatal && rc != -EPROTO) {
				LOG("%s: closing: %s", k->peer, strerror(-rc));
				return;
			}
			if (!rc)
				agent_put_u32(&k->out, 0);
		} else {
			rc = agent_req_parse(type, p, len, &k->q);
			if (!rc)
				rc = do_req(k, &k->q);
		}
		if (rc == -EPROTO) {
			LOG("%s: closing: malformed frame (type %u, %zu "
			    "bytes)", k->peer, type, len);
			k->out.len = 0;
			reply(k, -EPROTO);
			return;
		}
		if (reply(k, rc))
			return;
	}
}

/* A connection on @fd (owned from here on), counted and listed, in its
 * handshake; NULL if PRE_MAX are in theirs already, PRE_PEER of them
 * from @peer, or out of memory (@fd is closed). */
static struct conn *conn_new(struct agent_server *s, int fd,
			     const char *peer)
{
	unsigned int pre = 0, from = 0;
	struct conn *k = NULL;

	pthread_mutex_lock(&s->lock);
	for (struct conn *x = s->conns; x; x = x->next) {
		if (x->authed)
			continue;
		pre++;
		from += !strcmp(x->peer, peer);
	}
	if (pre < PRE_MAX && from < PRE_PEER)
		k = calloc(1, sizeof(*k));
	if (k) {
		k->srv = s;
		k->fd = fd;
		snprintf(k->peer, sizeof(k->peer), "%s", peer);
		k->next = s->conns;
		if (s->conns)
			s->conns->prev = k;
		s->conns = k;
		s->nconns++;
	}
	pthread_mutex_unlock(&s->lock);
	if (!k) {
		close(fd);
		refuse_log(s, peer, pre >= PRE_MAX || from >= PRE_PEER
					    ? "too many connections in the "
					      "handshake"
					    : "out of memory");
	}
	return k;
}

/* Free @k, unlist it and close its fd. */
static void conn_end(struct conn *k)
{
	struct agent_server *s = k->srv;

	handles_close(k);
	agent_conn_release(&k->c);
	agent_buf_release(&k->out);
	free(k->buf);
	pthread_mutex_lock(&s->lock);
	if (k->prev)
		k->prev->next = k->next;
	else
		s->conns = k->next;
	if (k->next)
		k->next->prev = k->prev;
	close(k->fd); /* under the lock: agent_server_free() shuts it down */
	s->nconns--;
	if (k->authed)
		s->nauth--;
	pthread_cond_broadcast(&s->gone);
	pthread_mutex_unlock(&s->lock);
	free(k); /* s may be gone from here on */
}

static void *conn_main(void *arg)
{
	struct conn *k = arg;

	serve(k);
	LOG("%s: done: %llu bytes written, %llu bytes already there, %llu "
	    "chunks", k->peer, (unsigned long long)k->bytes_in,
	    (unsigned long long)k->bytes_have, (unsigned long long)k->puts);
	conn_end(k);
	return NULL;
}

int agent_server_serve_fd(struct agent_server *s, int fd)
{
	struct conn *k = conn_new(s, fd, "fd");

	if (!k)
		return -EBUSY;
	conn_main(k);
	return 0;
}

int agent_server_new(const struct agent_server_config *cfg,
		     struct agent_server **out)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE };
	struct addrinfo *ai = NULL;
	struct agent_server *s;
	char host[256], port[16];
	const char *colon = cfg->listen ? strrchr(cfg->listen, ':') : NULL;
	int one = 1, rc;

	*out = NULL;
	if (cfg->listen && (!colon ||
			    (size_t)(colon - cfg->listen) >= sizeof(host) ||
			    strlen(colon + 1) >= sizeof(port) || !colon[1]))
		return -EINVAL;
	if (cfg->listen) {
		memcpy(host, cfg->listen, (size_t)(colon - cfg->listen));
		host[colon - cfg->listen] = 0;
		strcpy(port, colon + 1);
		if (host[0] == '[' && host[strlen(host) - 1] == ']') {
			memmove(host, host + 1, strlen(host));
			host[strlen(host) - 1] = 0;
		}
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->gone, NULL);
	s->lfd = -1;
	s->root = -1;
	s->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s->encrypt = cfg->encrypt;
	s->max_conns = cfg->max_conns ? cfg->max_conns : 64;
	rc = agent_key_load(cfg->key_file, &s->key);
	if (rc) {
		LOG("cannot use key file '%s': %s", cfg->key_file,
		    rc == -EPERM ? "group or others may read it (chmod 600)" :
		    rc == -EINVAL ? "not a file of 16 to 1023 bytes" :
				    strerror(-rc));
		goto fail;
	}
	s->root = open(cfg->root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (s->root < 0) {
		rc = -errno;
		LOG("cannot open root '%s': %s", cfg->root, strerror(-rc));
		goto fail;
	}
	if (!cfg->listen) {
		*out = s;
		return 0;
	}
	rc = getaddrinfo(*host ? host : NULL, port, &hints, &ai);
	if (rc) {
		LOG("cannot resolve '%s': %s", cfg->listen, gai_strerror(rc));
		rc = -EINVAL;
		goto fail;
	}
	s->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s->lfd < 0 ||
	    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(s->lfd, ai->ai_addr, ai->ai_addrlen) || listen(s->lfd, 64)) {
		rc = -errno;
		LOG("cannot listen on '%s': %s", cfg->listen, strerror(-rc));
		goto fail;
	}
	freeaddrinfo(ai);
	*out = s;
	return 0;
fail:
	if (ai)
		freeaddrinfo(ai);
	agent_server_free(s);
	return rc;
}

/* accept() failed with EMFILE or ENFILE: take the waiting connection off
 * the queue with the spare fd and close it, or wait a little; see "FILE
 * DESCRIPTORS" above. */
static void shed_one(struct agent_server *s, int err)
{
	time_t now = time(NULL);
	int fd;

	if (s->spare >= 0) {
		close(s->spare);
		s->spare = -1;
		fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd >= 0) {
			close(fd);
			s->shed++;
		}
		s->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	if (s->spare < 0)
		(void)poll(NULL, 0, SHED_SLEEP_MS);
	if (now - s->shed_logged >= SHED_LOG_S) {
		unsigned int n;

		pthread_mutex_lock(&s->lock);
		n = s->nconns;
		pthread_mutex_unlock(&s->lock);
		s->shed_logged = now;
		LOG("cannot accept: %s (%u connections served): %llu "
		    "connections closed so far", strerror(err), n, s->shed);
	}
}

int agent_server_run(struct agent_server *s)
{
	for (;;) {
		struct sockaddr_storage sa;
		socklen_t salen = sizeof(sa);
		int fd = accept4(s->lfd, (struct sockaddr *)&sa, &salen,
				 SOCK_CLOEXEC);
		char peer[64];
		pthread_attr_t at;
		pthread_t t;
		struct conn *k;

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE) {
				shed_one(s, errno);
				continue;
			}
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return -errno;
		}
		agent_sock_live(fd);
		if (getnameinfo((struct sockaddr *)&sa, salen, peer,
				sizeof(peer), NULL, 0, NI_NUMERICHOST))
			strcpy(peer, "?");
		k = conn_new(s, fd, peer);
		if (!k)
			continue;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &at, conn_main, k))
			conn_end(k);
		pthread_attr_destroy(&at);
	}
}

int agent_server_port(const struct agent_server *s)
{
	struct sockaddr_storage sa;
	socklen_t salen = sizeof(sa);

	if (s->lfd < 0)
		return -EINVAL;
	if (getsockname(s->lfd, (struct sockaddr *)&sa, &salen))
		return -errno;
	if (sa.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&sa)->sin_port);
	if (sa.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
	return -EAFNOSUPPORT;
}

void agent_server_stop(struct agent_server *s)
{
	if (s->lfd >= 0)
		shutdown(s->lfd, SHUT_RDWR);
}

void agent_server_free(struct agent_server *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	for (struct conn *k = s->conns; k; k = k->next)
		shutdown(k->fd, SHUT_RDWR);
	while (s->nconns)
		pthread_cond_wait(&s->gone, &s->lock);
	pthread_mutex_unlock(&s->lock);
	pthread_cond_destroy(&s->gone);
	pthread_mutex_destroy(&s->lock);
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->spare >= 0)
		close(s->spare);
	if (s->root >= 0)
		close(s->root);
	OPENSSL_cleanse(&s->key, sizeof(s->key));
	free(s);
}
