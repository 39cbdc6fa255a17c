/*
 * agent.c - the agent driver: a share reached through ferry-agent, which
 * runs next to it and writes locally what it pulls (agent/PROTOCOL.md).
 *
 *   agent://HOST:PORT[/PATH]   options: agent_key=FILE (required),
 *                              agent_encrypt (ask for an encrypted session)
 *
 * PATH: the share's root is PATH below the agent's --root (the share is
 * nfs://HOST/export/PATH while the agent serves the export's directory).
 *
 * Used by the flusher (journal/flush.c), one connection per stream; the
 * share's own driver still serves the mount's namespace and reads, so this
 * one has no readdir. A struct rmt here is one TCP connection, opened by
 * ferryfs (the client needs no inbound port), and RMT_CAP_THREADSAFE
 * through a lock held for each exchange.
 *
 * What makes it fast where NFS/SMB are slow:
 *   - rmt_file_put(): a chunk is one PUT; the agent answers "want" when its
 *     disk took the last chunk (it paces the stream), or "have" when the
 *     file holds bytes with the same SHA-256 already (a resend after a
 *     crash is not fetched again); its reply means written, checked and
 *     fdatasync()ed. Small chunks go inline in the PUT: one round trip.
 *   - batches (rmt_batch_begin()): namespace calls of many ops in one
 *     round trip.
 *   - closes are sent without waiting (their replies are skipped later).
 *
 * CONNECTION STATES
 *
 *            rmt_agent_open(): connect + handshake
 *   (none) -----------------------------------------> UP
 *                                                      |  an I/O error, a
 *     DOWN -- the next call reconnects (at most once    |  bad frame
 *      ^      per RETRY_NS after a failed try) --> UP   v
 *      +------------------------------------------- DOWN (conn_drop())
 *
 * Files belong to the connection they were opened on (a->gen): after a
 * reconnect their calls fail with -ESTALE, and the flusher reopens them.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "log.h"
#include "remote_i.h"

#define CONNECT_MS 3000
#define RETRY_NS (1000LL * 1000 * 1000)
#define INLINE_MAX (256u << 10) /* PUTs up to this size carry their bytes */

struct arm {
	struct rmt base;
	pthread_mutex_t lock;     /* one exchange at a time; all below */
	char host[256], port[16];
	char *prefix;             /* the share's root below the agent's */
	struct agent_key key;
	bool encrypt;
	int fd;                   /* -1: DOWN */
	struct agent_conn c;
	uint64_t gen;             /* bumped by every connect */
	uint32_t next_hid;
	unsigned int skip;        /* replies of unanswered CLOSEs to skip */
	int64_t retry_at;         /* no reconnect before (CLOCK_MONOTONIC) */
	struct agent_buf req;     /* the request being built */
	/* a batch (rmt_batch_begin() .. _end()), its thread holds lock */
	bool batching;
	pthread_t batcher;
	struct agent_buf batch;
	uint32_t nbatch;
	int group;                /* -1 before the first mark */
};

struct afile {
	struct rmt_file base;
	uint32_t hid;
	uint64_t gen;
};

static struct arm *arm_of(struct rmt *r)
{
	return (struct arm *)r;
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* --- the connection ---------------------------------------------------------- */

static void conn_drop(struct arm *a)
{
	if (a->fd >= 0) {
		close(a->fd);
		a->fd = -1;
		agent_conn_release(&a->c);
	}
	a->skip = 0;
}

static int tcp_connect(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai, *p;
	int rc, fd = -1;

	rc = getaddrinfo(host, port, &hints, &ai);
	if (rc)
		return rc == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
	rc = -EHOSTUNREACH;
	for (p = ai; p && fd < 0; p = p->ai_next) {
		struct pollfd pfd;
		int err = 0;
		socklen_t elen = sizeof(err);

		fd = socket(p->ai_family, SOCK_STREAM | SOCK_CLOEXEC |
						  SOCK_NONBLOCK, 0);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		agent_sock_live(fd);
		if (connect(fd, p->ai_addr, p->ai_addrlen) && errno !=
								   EINPROGRESS) {
			rc = -errno;
		} else {
			pfd = (struct pollfd){ .fd = fd, .events = POLLOUT };
			if (poll(&pfd, 1, CONNECT_MS) != 1)
				rc = -ETIMEDOUT;
			else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err,
					    &elen) || err)
				rc = -(err ? err : errno);
			else
				rc = 0;
		}
		if (!rc) {
			int fl = fcntl(fd, F_GETFL);

			if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK))
				rc = -errno;
		}
		if (rc) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	return fd >= 0 ? fd : rc;
}

/* UP, connecting if DOWN and a try is due. a->lock held. */
static int conn_up(struct arm *a)
{
	int64_t now;
	int fd, rc;

	if (a->fd >= 0)
		return 0;
	now = mono_ns();
	if (now < a->retry_at)
		return -ENOTCONN;
	fd = tcp_connect(a->host, a->port);
	rc = fd < 0 ? fd : agent_handshake_client(fd, &a->key, a->encrypt,
						   &a->c);
	if (rc) {
		if (fd >= 0)
			close(fd);
		a->retry_at = now + RETRY_NS;
		if (rc == -EACCES)
			LOG_ERR("agent '%s:%s' refused our key (agent_key=)",
				a->host, a->port);
		else
			LOG_DBG("agent '%s:%s': cannot connect: %s", a->host,
				a->port, strerror(-rc));
		return rc;
	}
	a->fd = fd;
	a->gen++;
	a->skip = 0;
	return 0;
}

/* Read the REPLY to request @seq; skipped replies first. */
static int reply_read(struct arm *a, uint64_t seq, struct agent_rd *res)
{
	for (;;) {
		const uint8_t *p;
		uint16_t type;
		size_t len;
		uint64_t rseq;
		int32_t st;
		int rc = agent_recv(&a->c, &type, &p, &len);

		if (rc)
			return rc;
		*res = (struct agent_rd){ .p = p, .len = len };
		rseq = agent_get_u64(res);
		st = (int32_t)agent_get_u32(res);
		if (type != AGENT_T_REPLY || res->bad)
			return -EPROTO;
		if (a->skip && rseq != seq) {
			a->skip--;
			continue;
		}
		if (rseq != seq)
			return -EPROTO;
		if (st > 0 || st < -4095)
			return -EPROTO;
		return st;
	}
}

/* A transport failure: the connection cannot go on. */
static bool conn_error(int rc)
{
	return rc == -EPROTO || rc == -EBADMSG || rc == -ECONNRESET ||
	       rc == -EPIPE || rc == -ETIMEDOUT || rc == -ENOTCONN ||
	       rc == -ECONNREFUSED || rc == -EHOSTUNREACH ||
	       rc == -ENETUNREACH || rc == -ECONNABORTED || rc == -EMSGSIZE;
}

/*
 * Send a->req as a @type request and read its reply into *res (valid until
 * the next exchange). a->lock held. Returns the agent's status, or a
 * transport error (the connection is then DOWN).
 */
static int exchange(struct arm *a, uint16_t type, struct agent_rd *res)
{
	uint64_t seq;
	int rc = conn_up(a);

	if (rc)
		return rc;
	if (!agent_buf_ok(&a->req))
		return -ENOMEM;
	seq = a->c.seq_out;
	rc = agent_send(&a->c, type, a->req.p, a->req.len, NULL, 0);
	if (!rc)
		rc = reply_read(a, seq, res);
	if (conn_error(rc) || rc == -ENOMEM) {
		if (rc != -ENOTCONN)
			LOG_WARN("agent '%s:%s': connection lost: %s",
				 a->host, a->port, strerror(-rc));
		conn_drop(a);
		return rc == -EPROTO || rc == -EBADMSG ? -ECONNRESET : rc;
	}
	return rc;
}

/* Start a request: lock and clear the buffer. In a batch, the batching
 * thread holds the lock already. */
static void begin(struct arm *a)
{
	if (!(a->batching && pthread_equal(a->batcher, pthread_self())))
		pthread_mutex_lock(&a->lock);
	a->req.len = 0;
	a->req.bad = false;
}

static bool in_batch(struct arm *a)
{
	return a->batching && pthread_equal(a->batcher, pthread_self());
}

static void end(struct arm *a)
{
	if (!in_batch(a))
		pthread_mutex_unlock(&a->lock);
}

/* begin() for a call whose answer is needed now: not in a batch. */
static int begin_now(struct arm *a)
{
	begin(a);
	if (in_batch(a)) {
		end(a);
		return -EAGAIN;
	}
	return 0;
}

/* Queue a->req in the batch as @type. */
static int queue(struct arm *a, uint16_t type)
{
	if (!agent_buf_ok(&a->req))
		return -ENOMEM;
	if (a->nbatch == AGENT_BATCH_MAX || a->group < 0)
		return -E2BIG;
	agent_put_u16(&a->batch, type);
	agent_put_u16(&a->batch, (uint16_t)a->group);
	agent_put_u32(&a->batch, (uint32_t)a->req.len);
	agent_put_bytes(&a->batch, a->req.p, a->req.len);
	a->nbatch++;
	return agent_buf_ok(&a->batch) ? 0 : -ENOMEM;
}

/* Send a->req (@type) now or queue it in the batch; no result wanted. */
static int simple(struct arm *a, uint16_t type)
{
	struct agent_rd res;
	int rc;

	if (in_batch(a))
		rc = queue(a, type);
	else
		rc = exchange(a, type, &res);
	end(a);
	return rc;
}

/* A path of ours as the agent names it: below the prefix. */
static void put_path(struct arm *a, const char *path)
{
	char buf[PATH_MAX];
	int n;

	if (!a->prefix) {
		agent_put_str(&a->req, path);
		return;
	}
	n = snprintf(buf, sizeof(buf), "%s%s%s", a->prefix, *path ? "/" : "",
		     path);
	if (n < 0 || (size_t)n >= sizeof(buf))
		a->req.bad = true; /* -ENOMEM: too long for the agent */
	else
		agent_put_str(&a->req, buf);
}

/* --- names --------------------------------------------------------------------- */

static int a_stat(struct rmt *r, const char *path, struct stat *st)
{
	struct arm *a = arm_of(r);
	struct agent_rd res;
	int rc;

	rc = begin_now(a);
	if (rc)
		return rc;
	put_path(a, path);
	rc = exchange(a, AGENT_T_STAT, &res);
	if (!rc) {
		agent_get_stat(&res, st);
		if (res.bad)
			rc = -EIO;
	}
	end(a);
	return rc;
}

static int a_statfs(struct rmt *r, struct statvfs *sv)
{
	struct arm *a = arm_of(r);
	struct agent_rd res;
	int rc;

	rc = begin_now(a);
	if (rc)
		return rc;
	rc = exchange(a, AGENT_T_STATFS, &res);
	if (!rc) {
		agent_get_statfs(&res, sv);
		if (res.bad)
			rc = -EIO;
	}
	end(a);
	return rc;
}

static int a_readdir(struct rmt *r, const char *path, rmt_dirent_fn fn,
		     void *arg)
{
	(void)r, (void)path, (void)fn, (void)arg;
	return -EOPNOTSUPP; /* the share's driver lists directories */
}

static int a_path_mode(struct rmt *r, uint16_t type, const char *path,
		       mode_t mode, bool with_mode)
{
	struct arm *a = arm_of(r);

	begin(a);
	put_path(a, path);
	if (with_mode)
		agent_put_u32(&a->req, mode);
	return simple(a, type);
}

static int a_mkdir(struct rmt *r, const char *path, mode_t mode)
{
	return a_path_mode(r, AGENT_T_MKDIR, path, mode, true);
}

static int a_rmdir(struct rmt *r, const char *path)
{
	return a_path_mode(r, AGENT_T_RMDIR, path, 0, false);
}

static int a_unlink(struct rmt *r, const char *path)
{
	return a_path_mode(r, AGENT_T_UNLINK, path, 0, false);
}

static int a_mknod(struct rmt *r, const char *path, mode_t mode, dev_t rdev)
{
	struct arm *a = arm_of(r);

	begin(a);
	put_path(a, path);
	agent_put_u32(&a->req, mode);
	agent_put_u64(&a->req, rdev);
	return simple(a, AGENT_T_MKNOD);
}

static int a_symlink(struct rmt *r, const char *target, const char *path)
{
	struct arm *a = arm_of(r);

	begin(a);
	agent_put_str(&a->req, target);
	put_path(a, path);
	return simple(a, AGENT_T_SYMLINK);
}

static int a_readlink(struct rmt *r, const char *path, char *buf,
		      size_t size)
{
	struct arm *a = arm_of(r);
	struct agent_rd res;
	char t[PATH_MAX];
	int rc;

	rc = begin_now(a);
	if (rc)
		return rc;
	put_path(a, path);
	rc = exchange(a, AGENT_T_READLINK, &res);
	if (!rc) {
		agent_get_str(&res, t, sizeof(t));
		if (res.bad)
			rc = -EIO;
		else if (strlen(t) >= size)
			rc = -ENAMETOOLONG;
		else {
			strcpy(buf, t);
			rc = (int)strlen(t);
		}
	}
	end(a);
	return rc;
}

static int a_two(struct rmt *r, uint16_t type, const char *from,
		 const char *to, unsigned int flags, bool with_flags)
{
	struct arm *a = arm_of(r);

	begin(a);
	put_path(a, from);
	put_path(a, to);
	if (with_flags)
		agent_put_u32(&a->req, flags);
	return simple(a, type);
}

static int a_link(struct rmt *r, const char *from, const char *to)
{
	return a_two(r, AGENT_T_LINK, from, to, 0, false);
}

static int a_rename(struct rmt *r, const char *from, const char *to,
		    unsigned int flags)
{
	unsigned int f = 0;

	if (flags & RMT_RENAME_NOREPLACE)
		f |= RENAME_NOREPLACE;
	if (flags & RMT_RENAME_EXCHANGE)
		f |= RENAME_EXCHANGE;
	return a_two(r, AGENT_T_RENAME, from, to, f, true);
}

static int a_setattr(struct rmt *r, const char *path, struct rmt_file *f,
		     const struct rmt_setattr *sa)
{
	struct arm *a = arm_of(r);
	struct afile *af = (struct afile *)f;

	begin(a);
	if (af && af->gen != a->gen) {
		end(a);
		return -ESTALE;
	}
	agent_put_u32(&a->req, af ? af->hid : 0);
	if (af)
		agent_put_str(&a->req, ""); /* by handle: no path */
	else
		put_path(a, path);
	agent_put_u32(&a->req, sa->set);
	agent_put_u32(&a->req, sa->mode);
	agent_put_u32(&a->req, sa->uid);
	agent_put_u32(&a->req, sa->gid);
	agent_put_u64(&a->req, (uint64_t)sa->size);
	agent_put_u64(&a->req, (uint64_t)sa->atime.tv_sec);
	agent_put_u32(&a->req, (uint32_t)sa->atime.tv_nsec);
	agent_put_u64(&a->req, (uint64_t)sa->mtime.tv_sec);
	agent_put_u32(&a->req, (uint32_t)sa->mtime.tv_nsec);
	return simple(a, AGENT_T_SETATTR);
}

/* --- files --------------------------------------------------------------------- */

static int a_file_open(struct rmt *r, const char *path, int flags,
		       mode_t mode, struct rmt_file **out)
{
	struct arm *a = arm_of(r);
	struct afile *af = calloc(1, sizeof(*af));
	int rc;

	if (!af)
		return -ENOMEM;
	begin(a);
	if (!in_batch(a) && (rc = conn_up(a))) {
		end(a);
		free(af);
		return rc;
	}
	if (!++a->next_hid)
		a->next_hid = 1;
	af->hid = a->next_hid;
	af->gen = a->gen;
	af->base.r = r;
	agent_put_u32(&a->req, af->hid);
	put_path(a, path);
	agent_put_u32(&a->req, (uint32_t)flags);
	agent_put_u32(&a->req, mode);
	rc = simple(a, AGENT_T_OPEN);
	if (rc) {
		free(af);
		return rc;
	}
	*out = &af->base;
	return 0;
}

static int a_file_close(struct rmt_file *f)
{
	struct afile *af = (struct afile *)f;
	struct arm *a = arm_of(f->r);
	int rc = 0;

	begin(a);
	if (af->gen == a->gen && a->fd >= 0) {
		agent_put_u32(&a->req, af->hid);
		if (in_batch(a))
			rc = queue(a, AGENT_T_CLOSE);
		else if (!agent_send(&a->c, AGENT_T_CLOSE, a->req.p,
				     a->req.len, NULL, 0))
			a->skip++; /* its reply is read and dropped later */
		else
			conn_drop(a);
	}
	end(a);
	free(af);
	return rc;
}

/* Start a call on an open file: lock, check its connection. */
static int fbegin(struct afile *af, struct arm *a)
{
	int rc = begin_now(a);

	if (rc)
		return rc;
	if (af->gen != a->gen || a->fd < 0) {
		end(a);
		return -ESTALE;
	}
	return 0;
}

static ssize_t a_file_pread(struct rmt_file *f, void *buf, size_t len,
			    off_t off)
{
	struct afile *af = (struct afile *)f;
	struct arm *a = arm_of(f->r);
	struct agent_rd res;
	ssize_t rc;

	if (len > AGENT_DATA_MAX)
		len = AGENT_DATA_MAX;
	rc = fbegin(af, a);
	if (rc)
		return rc;
	agent_put_u32(&a->req, af->hid);
	agent_put_u64(&a->req, (uint64_t)off);
	agent_put_u32(&a->req, (uint32_t)len);
	rc = exchange(a, AGENT_T_PREAD, &res);
	if (!rc) {
		size_t n = res.len - res.off;

		if (n > len) {
			rc = -EIO;
		} else {
			memcpy(buf, res.p + res.off, n);
			rc = (ssize_t)n;
		}
	}
	end(a);
	return rc;
}

/* PUT (@af) or PUTP (@path): inline, or "want" then DATA. Returns bytes
 * sent or -errno; in a batch, queued (inline only). */
static ssize_t put(struct arm *a, struct afile *af, const char *path,
		   const void *buf, size_t len, off_t off,
		   const unsigned char sha[32])
{
	struct agent_rd res;
	bool inl = len <= INLINE_MAX;
	uint64_t seq;
	uint32_t want;
	int rc;

	if (af)
		agent_put_u32(&a->req, af->hid);
	else
		put_path(a, path);
	agent_put_u64(&a->req, (uint64_t)off);
	agent_put_u32(&a->req, (uint32_t)len);
	agent_put_bytes(&a->req, sha, 32);
	agent_put_u32(&a->req, inl);
	if (inl)
		agent_put_bytes(&a->req, buf, len);
	if (in_batch(a)) {
		rc = inl ? queue(a, af ? AGENT_T_PUT : AGENT_T_PUTP) : -EAGAIN;
		return rc ? rc : (ssize_t)len;
	}
	rc = exchange(a, af ? AGENT_T_PUT : AGENT_T_PUTP, &res);
	if (rc)
		return rc;
	want = agent_get_u32(&res);
	if (res.bad) {
		conn_drop(a);
		return -ECONNRESET;
	}
	if (inl || !want)
		return inl ? (ssize_t)len : 0;
	/* the agent wants the bytes now */
	seq = a->c.seq_out;
	rc = agent_send_data(&a->c, buf, len, sha);
	if (!rc)
		rc = reply_read(a, seq, &res);
	if (conn_error(rc)) {
		LOG_WARN("agent '%s:%s': connection lost: %s", a->host,
			 a->port, strerror(-rc));
		conn_drop(a);
		return rc == -EPROTO || rc == -EBADMSG ? -ECONNRESET : rc;
	}
	return rc ? rc : (ssize_t)len;
}

static ssize_t a_file_put(struct rmt_file *f, const void *buf, size_t len,
			  off_t off, const unsigned char sha[32])
{
	struct afile *af = (struct afile *)f;
	struct arm *a = arm_of(f->r);
	ssize_t rc;

	if (len > AGENT_DATA_MAX)
		return -EINVAL;
	rc = fbegin(af, a);
	if (rc)
		return rc;
	rc = put(a, af, NULL, buf, len, off, sha);
	end(a);
	return rc;
}

static ssize_t a_put_path(struct rmt *r, const char *path, const void *buf,
			  size_t len, off_t off, const unsigned char sha[32])
{
	struct arm *a = arm_of(r);
	ssize_t rc;

	if (len > AGENT_DATA_MAX)
		return -EINVAL;
	begin(a);
	rc = put(a, NULL, path, buf, len, off, sha);
	end(a);
	return rc;
}

static ssize_t a_file_pwrite(struct rmt_file *f, const void *buf, size_t len,
			     off_t off)
{
	unsigned char sha[32];
	size_t done = 0;

	while (done < len) {
		size_t n = len - done > (1u << 20) ? 1u << 20 : len - done;
		ssize_t rc;

		if (!EVP_Digest((const char *)buf + done, n, sha, NULL,
				EVP_sha256(), NULL))
			return -ENOMEM;
		rc = a_file_put(f, (const char *)buf + done, n,
				off + (off_t)done, sha);
		if (rc < 0)
			return rc;
		done += n;
	}
	return (ssize_t)len;
}

static int a_file_stat(struct rmt_file *f, struct stat *st)
{
	struct afile *af = (struct afile *)f;
	struct arm *a = arm_of(f->r);
	struct agent_rd res;
	int rc = fbegin(af, a);

	if (rc)
		return rc;
	agent_put_u32(&a->req, af->hid);
	rc = exchange(a, AGENT_T_FSTAT, &res);
	if (!rc) {
		agent_get_stat(&res, st);
		if (res.bad)
			rc = -EIO;
	}
	end(a);
	return rc;
}

static int a_file_fsync(struct rmt_file *f, bool datasync)
{
	struct afile *af = (struct afile *)f;
	struct arm *a = arm_of(f->r);
	struct agent_rd res;
	int rc = fbegin(af, a);

	if (rc)
		return rc;
	agent_put_u32(&a->req, af->hid);
	agent_put_u32(&a->req, datasync);
	rc = exchange(a, AGENT_T_FSYNC, &res);
	end(a);
	return rc;
}

/* --- batches ------------------------------------------------------------------- */

static int a_batch_begin(struct rmt *r)
{
	struct arm *a = arm_of(r);
	int rc;

	pthread_mutex_lock(&a->lock);
	rc = conn_up(a);
	if (rc) {
		pthread_mutex_unlock(&a->lock);
		return rc;
	}
	a->batching = true;
	a->batcher = pthread_self();
	a->batch.len = 0;
	a->batch.bad = false;
	agent_put_u32(&a->batch, 0); /* the count, set at the end */
	a->nbatch = 0;
	a->group = -1;
	return 0;
}

static void a_batch_mark(struct rmt *r)
{
	struct arm *a = arm_of(r);

	if (in_batch(a))
		a->group++;
}

static int a_batch_end(struct rmt *r, int *rcs, unsigned int max)
{
	struct arm *a = arm_of(r);
	struct agent_rd res;
	unsigned int groups;
	uint16_t g;
	int rc;

	if (!in_batch(a))
		return -EINVAL;
	a->batching = false;
	groups = (unsigned int)(a->group + 1);
	for (unsigned int i = 0; i < groups && i < max; i++)
		rcs[i] = 0;
	if (!a->nbatch) {
		pthread_mutex_unlock(&a->lock);
		return (int)(groups < max ? groups : max);
	}
	for (int i = 0; i < 4 && a->batch.p; i++)
		a->batch.p[i] = (uint8_t)(a->nbatch >> (8 * i));
	/* send the batch as the request */
	{
		struct agent_buf keep = a->req;

		a->req = a->batch;
		rc = exchange(a, AGENT_T_BATCH, &res);
		a->batch = a->req;
		a->req = keep;
	}
	if (!rc) {
		struct agent_batch_rd br;
		const uint8_t *rq;
		uint16_t type;
		size_t rl;
		uint32_t n = agent_get_u32(&res);

		/* walk our own batch again for each entry's group */
		if (res.bad || n != a->nbatch ||
		    agent_batch_open(&br, a->batch.p, a->batch.len))
			rc = -EIO;
		for (uint32_t i = 0; !rc && i < n; i++) {
			int32_t st = (int32_t)agent_get_u32(&res);

			if (agent_batch_next(&br, &type, &g, &rq, &rl) != 1 ||
			    res.bad) {
				rc = -EIO;
				break;
			}
			if (g < max && st && st != -ECANCELED && !rcs[g])
				rcs[g] = st;
		}
	}
	pthread_mutex_unlock(&a->lock);
	return rc ? rc : (int)(groups < max ? groups : max);
}

/* --- open, close ------------------------------------------------------------------- */

static void a_close(struct rmt *r)
{
	struct arm *a = arm_of(r);

	conn_drop(a);
	agent_buf_release(&a->req);
	agent_buf_release(&a->batch);
	free(a->prefix);
	pthread_mutex_destroy(&a->lock);
	memset(&a->key, 0, sizeof(a->key));
	free(a);
}

static const struct rmt_ops agent_ops = {
	.name = "agent",
	.close = a_close,
	.stat = a_stat,
	.statfs = a_statfs,
	.readdir = a_readdir,
	.mkdir = a_mkdir,
	.rmdir = a_rmdir,
	.unlink = a_unlink,
	.mknod = a_mknod,
	.symlink = a_symlink,
	.readlink = a_readlink,
	.link = a_link,
	.rename = a_rename,
	.setattr = a_setattr,
	.file_open = a_file_open,
	.file_close = a_file_close,
	.file_pread = a_file_pread,
	.file_pwrite = a_file_pwrite,
	.file_stat = a_file_stat,
	.file_fsync = a_file_fsync,
	.file_put = a_file_put,
	.put_path = a_put_path,
	.batch_begin = a_batch_begin,
	.batch_mark = a_batch_mark,
	.batch_end = a_batch_end,
};

struct parsed {
	const char *key;
	bool encrypt;
	char *keybuf;
};

static int opt_one(const char *item, size_t klen, const char *value,
		   void *arg)
{
	struct parsed *p = arg;

	if (klen == 9 && !strncmp(item, "agent_key", 9) && value && *value) {
		free(p->keybuf);
		p->keybuf = strdup(value);
		return p->keybuf ? 1 : -ENOMEM;
	}
	if (klen == 13 && !strncmp(item, "agent_encrypt", 13) && !value) {
		p->encrypt = true;
		return 1;
	}
	LOG_ERR("agent: unknown option '%.*s'", (int)klen, item);
	return -EINVAL;
}

int rmt_agent_open(const char *url, const char *opts, struct rmt **out)
{
	struct parsed p = { 0 };
	const char *hp = url + strlen("agent://"), *colon;
	char *rest = NULL;
	struct arm *a;
	int rc;

	const char *slash = strchr(hp, '/');
	char hostport[300];

	*out = NULL;
	if (strncmp(url, "agent://", 8) || (slash ? (size_t)(slash - hp) :
					      strlen(hp)) >= sizeof(hostport))
		goto bad_url;
	memcpy(hostport, hp, slash ? (size_t)(slash - hp) : strlen(hp) + 1);
	if (slash)
		hostport[slash - hp] = 0;
	if (slash && (!slash[1] || rmt_path_check(slash + 1)))
		goto bad_url;
	hp = hostport;
	colon = strrchr(hp, ':');
	if (!colon || colon == hp || (size_t)(colon - hp) >= sizeof(a->host) ||
	    !colon[1] || strlen(colon + 1) >= sizeof(a->port))
		goto bad_url;
	rc = rmt_opts_split(opts, opt_one, &p, &rest);
	free(rest);
	if (rc)
		goto out;
	if (!p.keybuf) {
		LOG_ERR("agent: no key file (agent_key=FILE)");
		rc = -EINVAL;
		goto out;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		rc = -ENOMEM;
		goto out;
	}
	a->fd = -1;
	memcpy(a->host, hp, (size_t)(colon - hp));
	strcpy(a->port, colon + 1);
	if (a->host[0] == '[') { /* [v6] */
		size_t n = strlen(a->host);

		memmove(a->host, a->host + 1, n);
		if (n > 1 && a->host[n - 2] == ']')
			a->host[n - 2] = 0;
	}
	a->encrypt = p.encrypt;
	if (slash && !(a->prefix = strdup(slash + 1))) {
		free(a);
		rc = -ENOMEM;
		goto out;
	}
	rc = agent_key_load(p.keybuf, &a->key);
	if (rc) {
		free(a->prefix);
		LOG_ERR("agent: cannot use key file '%s': %s", p.keybuf,
			rc == -EPERM ? "group or others may read it" :
			rc == -EINVAL ? "not a file of 16 to 1023 bytes" :
					strerror(-rc));
		free(a);
		goto out;
	}
	pthread_mutex_init(&a->lock, NULL);
	a->base.ops = &agent_ops;
	a->base.caps = RMT_CAP_THREADSAFE | RMT_CAP_PUT | RMT_CAP_BATCH |
		       RMT_CAPS_POSIX;
	if (asprintf(&a->base.id, "agent:%s:%s/%s", a->host, a->port,
		     a->prefix ? a->prefix : "") < 0) {
		a->base.id = NULL;
		a_close(&a->base);
		rc = -ENOMEM;
		goto out;
	}
	pthread_mutex_lock(&a->lock);
	rc = conn_up(a);
	pthread_mutex_unlock(&a->lock);
	/* not there now: the caller may go on DOWN and try later; a wrong
	 * key or another protocol on that port is an error */
	if (rc && rc != -EACCES && rc != -EPROTO && rc != -ENOMEM)
		rc = 0;
	if (rc) {
		free(a->base.id);
		a_close(&a->base);
		goto out;
	}
	*out = &a->base;
out:
	free(p.keybuf);
	return rc;
bad_url:
	LOG_ERR("agent: '%s' is not agent://HOST:PORT[/PATH]", url);
	return -EINVAL;
}
