/*
 * proto.c - the ferry-agent wire protocol (agent.h, PROTOCOL.md): byte
 * encoding, request parsing, keys, the handshake and framing.
 *
 * Callers: remote/agent.c (the client side), agent/server.c (the agent),
 * tests/unit/test_agent.c and the fuzzer tests/fuzz/fuzz_agent.c.
 *
 * INVARIANTS
 *  1. No byte of a received frame is acted on before its tag checked out
 *     and its seq was the one expected (agent_recv()).
 *  2. Before the handshake ends, only fixed-size messages are read: an
 *     unauthenticated peer cannot make either side allocate.
 *  3. Parsers read only through struct agent_rd, which cannot read past
 *     its end; a bad reader makes the parse fail with -EPROTO.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

#define HANDSHAKE_MS 10000 /* the client's whole handshake */

/* --- byte buffers ---------------------------------------------------------- */

void agent_buf_release(struct agent_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* Room for @n more bytes: where they go, or NULL when @n is 0 (nothing
 * to write; an empty buffer has no p to point into) or out of memory. */
static uint8_t *buf_grow(struct agent_buf *b, size_t n)
{
	if (b->bad || !n)
		return NULL;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		uint8_t *p;

		while (cap < b->len + n)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->bad = true;
			return NULL;
		}
		b->p = p;
		b->cap = cap;
	}
	b->len += n;
	return b->p + b->len - n;
}

static void put_le(struct agent_buf *b, uint64_t v, int n)
{
	uint8_t *p = buf_grow(b, (size_t)n);

	for (int i = 0; p && i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

void agent_put_u16(struct agent_buf *b, uint16_t v)
{
	put_le(b, v, 2);
}

void agent_put_u32(struct agent_buf *b, uint32_t v)
{
	put_le(b, v, 4);
}

void agent_put_u64(struct agent_buf *b, uint64_t v)
{
	put_le(b, v, 8);
}

void agent_put_bytes(struct agent_buf *b, const void *p, size_t n)
{
	uint8_t *d = buf_grow(b, n);

	if (d && n)
		memcpy(d, p, n);
}

void agent_put_str(struct agent_buf *b, const char *s)
{
	size_t n = strlen(s);

	if (n > UINT16_MAX) {
		b->bad = true;
		return;
	}
	agent_put_u16(b, (uint16_t)n);
	agent_put_bytes(b, s, n);
}

static void put_ts(struct agent_buf *b, const struct timespec *t)
{
	agent_put_u64(b, (uint64_t)t->tv_sec);
	agent_put_u32(b, (uint32_t)t->tv_nsec);
}

void agent_put_stat(struct agent_buf *b, const struct stat *st)
{
	agent_put_u32(b, st->st_mode);
	agent_put_u32(b, st->st_uid);
	agent_put_u32(b, st->st_gid);
	agent_put_u64(b, st->st_nlink);
	agent_put_u64(b, (uint64_t)st->st_size);
	agent_put_u64(b, st->st_ino);
	agent_put_u64(b, st->st_dev);
	agent_put_u64(b, st->st_rdev);
	agent_put_u64(b, (uint64_t)st->st_blocks);
	agent_put_u32(b, (uint32_t)st->st_blksize);
	put_ts(b, &st->st_atim);
	put_ts(b, &st->st_mtim);
	put_ts(b, &st->st_ctim);
}

void agent_put_statfs(struct agent_buf *b, const struct statvfs *sv)
{
	agent_put_u64(b, sv->f_bsize);
	agent_put_u64(b, sv->f_frsize);
	agent_put_u64(b, sv->f_blocks);
	agent_put_u64(b, sv->f_bfree);
	agent_put_u64(b, sv->f_bavail);
	agent_put_u64(b, sv->f_files);
	agent_put_u64(b, sv->f_ffree);
	agent_put_u64(b, sv->f_favail);
	agent_put_u64(b, sv->f_namemax);
}

static uint64_t get_le(struct agent_rd *r, int n)
{
	uint64_t v = 0;

	if (r->bad || r->len - r->off < (size_t)n) {
		r->bad = true;
		return 0;
	}
	for (int i = 0; i < n; i++)
		v |= (uint64_t)r->p[r->off + (size_t)i] << (8 * i);
	r->off += (size_t)n;
	return v;
}

uint16_t agent_get_u16(struct agent_rd *r)
{
	return (uint16_t)get_le(r, 2);
}

uint32_t agent_get_u32(struct agent_rd *r)
{
	return (uint32_t)get_le(r, 4);
}

uint64_t agent_get_u64(struct agent_rd *r)
{
	return get_le(r, 8);
}

const void *agent_get_bytes(struct agent_rd *r, size_t n)
{
	const void *p;

	if (r->bad || r->len - r->off < n) {
		r->bad = true;
		return NULL;
	}
	if (!r->p) {
		static const uint8_t none[AGENT_MAC]; /* also a SHA-256's size */

		return none; /* no bytes (n is 0): not NULL + 0 */
	}
	p = r->p + r->off;
	r->off += n;
	return p;
}

void agent_get_str(struct agent_rd *r, char *out, size_t size)
{
	size_t n = agent_get_u16(r);
	const char *p = agent_get_bytes(r, n);

	if (!p || n >= size || memchr(p, 0, n)) {
		r->bad = true;
		if (size)
			out[0] = 0;
		return;
	}
	memcpy(out, p, n);
	out[n] = 0;
}

static void get_ts(struct agent_rd *r, struct timespec *t)
{
	t->tv_sec = (time_t)agent_get_u64(r);
	t->tv_nsec = agent_get_u32(r);
	if (t->tv_nsec >= 1000000000L && t->tv_nsec != UTIME_NOW &&
	    t->tv_nsec != UTIME_OMIT)
		r->bad = true;
}

void agent_get_stat(struct agent_rd *r, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_mode = agent_get_u32(r);
	st->st_uid = agent_get_u32(r);
	st->st_gid = agent_get_u32(r);
	st->st_nlink = agent_get_u64(r);
	st->st_size = (off_t)agent_get_u64(r);
	st->st_ino = agent_get_u64(r);
	st->st_dev = agent_get_u64(r);
	st->st_rdev = agent_get_u64(r);
	st->st_blocks = (blkcnt_t)agent_get_u64(r);
	st->st_blksize = agent_get_u32(r);
	get_ts(r, &st->st_atim);
	get_ts(r, &st->st_mtim);
	get_ts(r, &st->st_ctim);
}

void agent_get_statfs(struct agent_rd *r, struct statvfs *sv)
{
	memset(sv, 0, sizeof(*sv));
	sv->f_bsize = agent_get_u64(r);
	sv->f_frsize = agent_get_u64(r);
	sv->f_blocks = agent_get_u64(r);
	sv->f_bfree = agent_get_u64(r);
	sv->f_bavail = agent_get_u64(r);
	sv->f_files = agent_get_u64(r);
	sv->f_ffree = agent_get_u64(r);
	sv->f_favail = agent_get_u64(r);
	sv->f_namemax = agent_get_u64(r);
}

/* --- requests -------------------------------------------------------------- */

/* A clean relative path: "" or components without "", ".", "..". */
static bool path_clean(const char *p)
{
	if (!*p)
		return true;
	if (*p == '/')
		return false;
	for (;;) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);

		if (n == 0 || n > NAME_MAX || (n == 1 && p[0] == '.') ||
		    (n == 2 && p[0] == '.' && p[1] == '.'))
			return false;
		if (!e)
			return true;
		p = e + 1;
	}
}

int agent_req_parse(uint16_t type, const uint8_t *p, size_t len,
		    struct agent_req *q)
{
	struct agent_rd r = { .p = p, .len = len };
	bool path = true, path2 = false, root_ok = false;

	memset(q, 0, sizeof(*q));
	q->type = type;
	switch (type) {
	case AGENT_T_STAT:
	case AGENT_T_READLINK:
		root_ok = true;
		/* fall through */
	case AGENT_T_RMDIR:
	case AGENT_T_UNLINK:
		agent_get_str(&r, q->path, sizeof(q->path));
		break;
	case AGENT_T_STATFS:
		path = false;
		break;
	case AGENT_T_MKDIR:
		agent_get_str(&r, q->path, sizeof(q->path));
		q->mode = agent_get_u32(&r);
		break;
	case AGENT_T_MKNOD:
		agent_get_str(&r, q->path, sizeof(q->path));
		q->mode = agent_get_u32(&r);
		q->rdev = agent_get_u64(&r);
		break;
	case AGENT_T_SYMLINK:
		/* the target is data, not a path of ours: any bytes */
		agent_get_str(&r, q->path2, sizeof(q->path2));
		agent_get_str(&r, q->path, sizeof(q->path));
		if (!q->path2[0])
			r.bad = true;
		break;
	case AGENT_T_LINK:
		agent_get_str(&r, q->path, sizeof(q->path));
		agent_get_str(&r, q->path2, sizeof(q->path2));
		path2 = true;
		break;
	case AGENT_T_RENAME:
		agent_get_str(&r, q->path, sizeof(q->path));
		agent_get_str(&r, q->path2, sizeof(q->path2));
		q->flags = agent_get_u32(&r);
		path2 = true;
		break;
	case AGENT_T_SETATTR:
		q->hid = agent_get_u32(&r);
		agent_get_str(&r, q->path, sizeof(q->path));
		q->set = agent_get_u32(&r);
		q->mode = agent_get_u32(&r);
		q->uid = agent_get_u32(&r);
		q->gid = agent_get_u32(&r);
		q->size = agent_get_u64(&r);
		get_ts(&r, &q->atime);
		get_ts(&r, &q->mtime);
		root_ok = true;
		path = !q->hid;
		break;
	case AGENT_T_OPEN:
		q->hid = agent_get_u32(&r);
		agent_get_str(&r, q->path, sizeof(q->path));
		q->flags = agent_get_u32(&r);
		q->mode = agent_get_u32(&r);
		if (!q->hid)
			r.bad = true;
		break;
	case AGENT_T_CLOSE:
	case AGENT_T_FSTAT:
		q->hid = agent_get_u32(&r);
		path = false;
		break;
	case AGENT_T_FSYNC:
		q->hid = agent_get_u32(&r);
		q->datasync = agent_get_u32(&r);
		path = false;
		break;
	case AGENT_T_PREAD:
		q->hid = agent_get_u32(&r);
		q->off = agent_get_u64(&r);
		q->len = agent_get_u32(&r);
		if (q->len > AGENT_DATA_MAX)
			r.bad = true;
		path = false;
		break;
	case AGENT_T_PUT:
	case AGENT_T_PUTP: {
		const void *sha;

		if (type == AGENT_T_PUTP)
			agent_get_str(&r, q->path, sizeof(q->path));
		else
			q->hid = agent_get_u32(&r);
		q->off = agent_get_u64(&r);
		q->len = agent_get_u32(&r);
		sha = agent_get_bytes(&r, sizeof(q->sha));
		if (sha)
			memcpy(q->sha, sha, sizeof(q->sha));
		q->inline_data = agent_get_u32(&r);
		if (q->inline_data == 1)
			q->data = agent_get_bytes(&r, q->len);
		else if (q->inline_data)
			r.bad = true;
		if (q->len > AGENT_DATA_MAX || q->off > (uint64_t)INT64_MAX -
							     q->len)
			r.bad = true;
		path = type == AGENT_T_PUTP;
		break;
	}
	default:
		return -EPROTO;
	}
	if (r.bad || r.off != r.len)
		return -EPROTO;
	if (type == AGENT_T_SETATTR && q->hid && q->path[0])
		return -EINVAL; /* by handle: no path */
	if (path && (!path_clean(q->path) || (!root_ok && !q->path[0])))
		return -EINVAL;
	if (path2 && (!path_clean(q->path2) || !q->path2[0]))
		return -EINVAL;
	return 0;
}

int agent_batch_open(struct agent_batch_rd *b, const uint8_t *p, size_t len)
{
	memset(b, 0, sizeof(*b));
	b->rd.p = p;
	b->rd.len = len;
	b->n = agent_get_u32(&b->rd);
	if (b->rd.bad || b->n > AGENT_BATCH_MAX)
		return -EPROTO;
	return 0;
}

int agent_batch_next(struct agent_batch_rd *b, uint16_t *type,
		     uint16_t *group, const uint8_t **req, size_t *reqlen)
{
	uint32_t n;

	if (b->i == b->n)
		return b->rd.off == b->rd.len ? 0 : -EPROTO;
	*type = agent_get_u16(&b->rd);
	*group = agent_get_u16(&b->rd);
	n = agent_get_u32(&b->rd);
	*req = agent_get_bytes(&b->rd, n);
	*reqlen = n;
	if (b->rd.bad || *type == AGENT_T_BATCH || *type == AGENT_T_REPLY ||
	    *type == AGENT_T_DATA)
		return -EPROTO;
	b->i++;
	return 1;
}

/* --- keys ------------------------------------------------------------------ */

int agent_key_load(const char *file, struct agent_key *out)
{
	struct stat st;
	ssize_t n;
	int fd, rc = 0;

	memset(out, 0, sizeof(*out));
	fd = open(file, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		rc = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = -EINVAL;
		goto out;
	}
	if (st.st_mode & 077) {
		rc = -EPERM;
		goto out;
	}
	n = read(fd, out->k, sizeof(out->k));
	if (n < 0) {
		rc = -errno;
		goto out;
	}
	if (n > 0 && out->k[n - 1] == '\n')
		n--;
	if (n < AGENT_KEY_MIN || (size_t)n >= sizeof(out->k)) {
		rc = -EINVAL;
		goto out;
	}
	out->len = (size_t)n;
out:
	close(fd);
	if (rc)
		OPENSSL_cleanse(out, sizeof(*out));
	return rc;
}

/* --- crypto ---------------------------------------------------------------- */

bool agent_test_fail_hmac;

/* HMAC-SHA256 of the concatenation of @n parts. */
static int hmac(const uint8_t *key, size_t klen, const void *const *part,
		const size_t *plen, int n, uint8_t out[32])
{
	OSSL_PARAM params[2];
	EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
	size_t olen = 0;
	int ok;

	params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST,
						     (char *)"SHA256", 0);
	params[1] = OSSL_PARAM_construct_end();
	ok = ctx && !agent_test_fail_hmac &&
	     EVP_MAC_init(ctx, key, klen, params);
	for (int i = 0; ok && i < n; i++)
		ok = EVP_MAC_update(ctx, part[i], plen[i]);
	ok = ok && EVP_MAC_final(ctx, out, &olen, 32) && olen == 32;
	EVP_MAC_CTX_free(ctx);
	EVP_MAC_free(mac);
	return ok ? 0 : -ENOMEM;
}

static bool is_data(const uint8_t *hdr)
{
	return (hdr[4] | hdr[5] << 8) == AGENT_T_DATA;
}

/* The tag of a DATA frame from the SHA-256 @d of its payload as sent.
 * -ENOMEM if the HMAC fails: then @tag is nothing to compare with. */
static int data_tag(const uint8_t kmac[32], char dir, const uint8_t *hdr,
		    const uint8_t d[32], uint8_t tag[32])
{
	const void *part[3] = { &dir, hdr, d };
	size_t plen[3] = { 1, AGENT_HDR, 32 };

	return hmac(kmac, 32, part, plen, 3, tag);
}

/* The tag of a received frame; of a DATA frame over the payload's
 * SHA-256, which goes to @d. -ENOMEM if the digest or the HMAC fails:
 * the frame must then be refused (invariant 1), never compared with a
 * tag left at zeros, which a frame carrying zeros would match. */
static int frame_tag(const uint8_t kmac[32], char dir, const uint8_t *hdr,
		     const uint8_t *payload, size_t len, uint8_t tag[32],
		     uint8_t d[32])
{
	const void *part[3] = { &dir, hdr, payload };
	size_t plen[3] = { 1, AGENT_HDR, len };

	if (is_data(hdr)) {
		if (!EVP_Digest(payload, len, d, NULL, EVP_sha256(), NULL))
			return -ENOMEM;
		return data_tag(kmac, dir, hdr, d, tag);
	}
	return hmac(kmac, 32, part, plen, 3, tag);
}

int agent_frame_tag(const uint8_t kmac[32], char dir, const uint8_t *hdr,
		    const uint8_t *payload, size_t len, uint8_t tag[32])
{
	uint8_t d[32];

	return frame_tag(kmac, dir, hdr, payload, len, tag, d);
}

/* AES-256-CTR of @n bytes in place; the IV is seq and direction. */
static int ctr(const struct agent_conn *c, char dir, uint64_t seq,
	       uint8_t *p, size_t n)
{
	uint8_t iv[16] = { 0 };
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
	int ok, out = 0;

	for (int i = 0; i < 8; i++)
		iv[i] = (uint8_t)(seq >> (8 * i));
	iv[8] = (uint8_t)dir;
	ok = x && EVP_EncryptInit_ex(x, EVP_aes_256_ctr(), NULL, c->kenc, iv);
	while (ok && n) {
		int step = n > INT_MAX / 2 ? INT_MAX / 2 : (int)n;

		ok = EVP_EncryptUpdate(x, p, &out, p, step) && out == step;
		p += step;
		n -= (size_t)step;
	}
	EVP_CIPHER_CTX_free(x);
	return ok ? 0 : -ENOMEM;
}

/* --- I/O ------------------------------------------------------------------- */

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Read exactly n bytes; @deadline > 0 (mono_ms()) bounds the whole read,
 * however slowly the peer trickles the bytes in. */
static int read_full(int fd, void *buf, size_t n, int64_t deadline)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t k;

		if (deadline > 0) {
			struct pollfd pfd = { .fd = fd, .events = POLLIN };
			int64_t left = deadline - mono_ms();
			int pr;

			if (left <= 0)
				return -ETIMEDOUT;
			pr = poll(&pfd, 1, (int)left);
			if (pr < 0 && errno == EINTR)
				continue;
			if (pr < 0)
				return -errno;
			if (pr == 0)
				return -ETIMEDOUT;
		}
		k = read(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return -ECONNRESET;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static int write_iov(int fd, struct iovec *iov, int n)
{
	while (n) {
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
		ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		while (n && (size_t)k >= iov->iov_len) {
			k -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n) {
			iov->iov_base = (uint8_t *)iov->iov_base + k;
			iov->iov_len -= (size_t)k;
		}
	}
	return 0;
}

void agent_sock_live(int fd)
{
	int one = 1, idle = AGENT_IDLE_S, intvl = 2, cnt = 5;
	unsigned int dead = AGENT_DEAD_MS;

	/* best effort: a socket that is not TCP (a test's socketpair)
	 * refuses them and works as before */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl,
			 sizeof(intvl));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &dead,
			 sizeof(dead));
}

static int write_full(int fd, const void *p, size_t n)
{
	struct iovec iov = { .iov_base = (void *)p, .iov_len = n };

	return write_iov(fd, &iov, 1);
}

static int recv_frame(struct agent_conn *c, uint16_t *type,
		      const uint8_t **p, size_t *len, int64_t deadline);

/* --- the handshake ----------------------------------------------------------- */

#define HELLO_LEN (8 + 4 + 4 + AGENT_NONCE)
#define HELLO_A_LEN (HELLO_LEN + AGENT_MAC)

static void le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* MAC of one side's proof: who ('A' or 'C'), both nonces, the flags. */
static int proof(const struct agent_key *k, char who, const uint8_t *cn,
		 const uint8_t *an, uint32_t flags, uint8_t out[32])
{
	uint8_t f[4];
	const void *part[4] = { &who, cn, an, f };
	size_t plen[4] = { 1, AGENT_NONCE, AGENT_NONCE, 4 };

	le32(f, flags);
	return hmac(k->k, k->len, part, plen, 4, out);
}

static int session_keys(const struct agent_key *k, const uint8_t *cn,
			const uint8_t *an, struct agent_conn *c)
{
	const void *part[3] = { "mac", cn, an };
	size_t plen[3] = { 3, AGENT_NONCE, AGENT_NONCE };
	int rc = hmac(k->k, k->len, part, plen, 3, c->kmac);

	part[0] = "enc";
	return rc ? rc : hmac(k->k, k->len, part, plen, 3, c->kenc);
}

static void conn_init(struct agent_conn *c, int fd, bool agent)
{
	memset(c, 0, sizeof(*c));
	c->fd = fd;
	c->agent = agent;
}

int agent_handshake_client(int fd, const struct agent_key *k, bool encrypt,
			   struct agent_conn *c)
{
	uint8_t hello[HELLO_LEN], ans[HELLO_A_LEN], mac[32];
	int64_t deadline;
	const uint8_t *p;
	uint16_t type;
	size_t len;
	uint32_t flags;
	int rc;

	conn_init(c, fd, false);
	deadline = mono_ms() + HANDSHAKE_MS;
	memcpy(hello, AGENT_MAGIC, 8);
	le32(hello + 8, AGENT_VERSION);
	le32(hello + 12, encrypt ? 1 : 0);
	if (RAND_bytes(hello + 16, AGENT_NONCE) != 1)
		return -ENOMEM;
	rc = write_full(fd, hello, sizeof(hello));
	if (!rc)
		rc = read_full(fd, ans, sizeof(ans), deadline);
	if (rc)
		return rc;
	if (memcmp(ans, AGENT_MAGIC, 8) || rd32(ans + 8) != AGENT_VERSION)
		return -EPROTO;
	flags = rd32(ans + 12);
	if (flags > 1 || (encrypt && !flags))
		return -EPROTO;
	rc = proof(k, 'A', hello + 16, ans + 16, flags, mac);
	if (rc)
		return rc;
	if (CRYPTO_memcmp(mac, ans + 16 + AGENT_NONCE, 32))
		return -EACCES; /* the agent does not know the key */
	rc = proof(k, 'C', hello + 16, ans + 16, flags, mac);
	if (!rc)
		rc = session_keys(k, hello + 16, ans + 16, c);
	if (!rc)
		rc = write_full(fd, mac, sizeof(mac));
	if (rc)
		return rc;
	c->encrypt = flags & 1;
	/* the agent's first frame says it took our proof */
	rc = recv_frame(c, &type, &p, &len, deadline);
	if (rc == -ECONNRESET)
		rc = -EACCES; /* it closed: it did not take our proof */
	if (!rc && (type != AGENT_T_REPLY || len != 12))
		rc = -EPROTO;
	if (rc)
		agent_conn_release(c);
	return rc;
}

int agent_handshake_agent(int fd, const struct agent_key *k, bool encrypt,
			  struct agent_conn *c)
{
	uint8_t hello[HELLO_LEN], ans[HELLO_A_LEN], mac[32], want[32];
	uint8_t ok[12] = { 0 };
	int64_t deadline;
	uint32_t flags;
	int rc;

	conn_init(c, fd, true);
	deadline = mono_ms() + AGENT_HANDSHAKE_MS;
	rc = read_full(fd, hello, sizeof(hello), deadline);
	if (rc)
		return rc;
	if (!memcmp(hello, AGENT_MAGIC, 8) &&
	    rd32(hello + 8) != AGENT_VERSION) {
		/* a ferryfs of another release: our version, no proof, so
		 * that it can say why instead of "does not answer" */
		memset(ans, 0, sizeof(ans));
		memcpy(ans, AGENT_MAGIC, 8);
		le32(ans + 8, AGENT_VERSION);
		(void)write_full(fd, ans, sizeof(ans));
		return -EPROTO;
	}
	if (memcmp(hello, AGENT_MAGIC, 8) || rd32(hello + 12) > 1)
		return -EPROTO;
	flags = encrypt ? 1 : rd32(hello + 12);
	memcpy(ans, AGENT_MAGIC, 8);
	le32(ans + 8, AGENT_VERSION);
	le32(ans + 12, flags);
	if (RAND_bytes(ans + 16, AGENT_NONCE) != 1)
		return -ENOMEM;
	rc = proof(k, 'A', hello + 16, ans + 16, flags, ans + 16 + AGENT_NONCE);
	if (!rc)
		rc = write_full(fd, ans, sizeof(ans));
	if (!rc) {
		rc = read_full(fd, mac, sizeof(mac), deadline);
		/* a client closes here when our proof is not made with its
		 * key (agent_handshake_client()): the keys differ */
		if (rc == -ECONNRESET)
			rc = -EACCES;
	}
	if (rc)
		return rc;
	rc = proof(k, 'C', hello + 16, ans + 16, flags, want);
	if (rc)
		return rc;
	if (CRYPTO_memcmp(mac, want, 32))
		return -EACCES;
	rc = session_keys(k, hello + 16, ans + 16, c);
	if (rc)
		return rc;
	c->encrypt = flags & 1;
	return agent_send(c, AGENT_T_REPLY, ok, sizeof(ok), NULL, 0);
}

void agent_conn_release(struct agent_conn *c)
{
	free(c->rbuf);
	OPENSSL_cleanse(c->kmac, sizeof(c->kmac));
	OPENSSL_cleanse(c->kenc, sizeof(c->kenc));
	c->rbuf = NULL;
	c->rcap = 0;
}

/* --- frames ------------------------------------------------------------------ */

static void hdr_make(uint8_t *h, uint32_t len, uint16_t type, uint64_t seq)
{
	le32(h, len);
	h[4] = (uint8_t)type;
	h[5] = (uint8_t)(type >> 8);
	h[6] = h[7] = 0;
	for (int i = 0; i < 8; i++)
		h[8 + i] = (uint8_t)(seq >> (8 * i));
}

static int send_frame(struct agent_conn *c, uint16_t type, const void *p1,
		      size_t n1, const void *p2, size_t n2,
		      const uint8_t *sha);

int agent_send(struct agent_conn *c, uint16_t type, const void *p1,
	       size_t n1, const void *p2, size_t n2)
{
	return send_frame(c, type, p1, n1, p2, n2, NULL);
}

int agent_send_data(struct agent_conn *c, const void *p, size_t n,
		    const uint8_t sha[32])
{
	return send_frame(c, AGENT_T_DATA, p, n, NULL, 0, sha);
}

/* @sha: the SHA-256 of the payload p1|p2 in clear (DATA only), or NULL */
static int send_frame(struct agent_conn *c, uint16_t type, const void *p1,
		      size_t n1, const void *p2, size_t n2,
		      const uint8_t *sha)
{
	uint8_t hdr[AGENT_HDR], tag[32], *tmp = NULL;
	const void *part[4];
	size_t plen[4];
	struct iovec iov[4];
	char dir = c->agent ? 'A' : 'C';
	int n = 0, rc;

	if (n1 + n2 > AGENT_PAYLOAD_MAX)
		return -EMSGSIZE;
	hdr_make(hdr, (uint32_t)(n1 + n2), type, c->seq_out);
	if (c->encrypt && n1 + n2) {
		tmp = malloc(n1 + n2);
		if (!tmp)
			return -ENOMEM;
		if (n1)
			memcpy(tmp, p1, n1);
		if (n2)
			memcpy(tmp + n1, p2, n2);
		rc = ctr(c, dir, c->seq_out, tmp, n1 + n2);
		if (rc) {
			free(tmp);
			return rc;
		}
		p1 = tmp;
		n1 += n2;
		n2 = 0;
	}
	part[0] = &dir;
	plen[0] = 1;
	part[1] = hdr;
	plen[1] = sizeof(hdr);
	part[2] = n1 ? p1 : "";
	plen[2] = n1;
	part[3] = n2 ? p2 : "";
	plen[3] = n2;
	if (type == AGENT_T_DATA) { /* the tag covers the payload's digest */
		uint8_t d[32];
		EVP_MD_CTX *x = NULL;

		rc = 0;
		if (sha && !c->encrypt) {
			memcpy(d, sha, 32);
		} else if (!(x = EVP_MD_CTX_new()) ||
			   !EVP_DigestInit_ex(x, EVP_sha256(), NULL) ||
			   !EVP_DigestUpdate(x, part[2], plen[2]) ||
			   !EVP_DigestUpdate(x, part[3], plen[3]) ||
			   !EVP_DigestFinal_ex(x, d, NULL)) {
			rc = -ENOMEM;
		}
		EVP_MD_CTX_free(x);
		if (!rc)
			rc = data_tag(c->kmac, dir, hdr, d, tag);
	} else {
		rc = hmac(c->kmac, 32, part, plen, 4, tag);
	}
	if (!rc) {
		iov[n++] = (struct iovec){ hdr, sizeof(hdr) };
		if (n1)
			iov[n++] = (struct iovec){ (void *)p1, n1 };
		if (n2)
			iov[n++] = (struct iovec){ (void *)p2, n2 };
		iov[n++] = (struct iovec){ tag, sizeof(tag) };
		rc = write_iov(c->fd, iov, n);
	}
	free(tmp);
	if (!rc)
		c->seq_out++;
	return rc;
}

/* agent_recv() with a deadline (mono_ms(); 0: none) */
static int recv_frame(struct agent_conn *c, uint16_t *type,
		      const uint8_t **p, size_t *len, int64_t deadline)
{	uint8_t hdr[AGENT_HDR], tag[32], want[32];
	struct agent_rd r = { .p = hdr, .len = sizeof(hdr) };
	uint32_t n;
	uint64_t seq;
	int rc;

	rc = read_full(c->fd, hdr, sizeof(hdr), deadline);
	if (rc)
		return rc;
	n = agent_get_u32(&r);
	*type = agent_get_u16(&r);
	(void)agent_get_u16(&r);
	seq = agent_get_u64(&r);
	if (n > AGENT_PAYLOAD_MAX)
		return -EPROTO;
	if (n > c->rcap || !c->rbuf) {
		uint8_t *b = realloc(c->rbuf, n ? n : 1);

		if (!b)
			return -ENOMEM;
		c->rbuf = b;
		c->rcap = n;
	}
	rc = read_full(c->fd, c->rbuf, n, deadline);
	if (!rc)
		rc = read_full(c->fd, tag, sizeof(tag), deadline);
	if (rc)
		return rc;
	rc = frame_tag(c->kmac, c->agent ? 'C' : 'A', hdr, c->rbuf, n, want,
		       c->data_sha);
	if (rc)
		return rc;
	if (CRYPTO_memcmp(tag, want, sizeof(tag)) || seq != c->seq_in)
		return -EBADMSG;
	if (c->encrypt && n) {
		rc = ctr(c, c->agent ? 'C' : 'A', seq, c->rbuf, n);
		if (rc)
			return rc;
	}
	c->seq_in++;
	*p = c->rbuf;
	*len = n;
	return 0;
}

int agent_recv(struct agent_conn *c, uint16_t *type, const uint8_t **p,
	       size_t *len)
{
	return recv_frame(c, type, p, len, 0);
}
