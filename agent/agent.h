/*
 * agent.h - the wire protocol between ferryfs (remote/agent.c, the client)
 * and ferry-agent (agent/server.c), the only thing the two share
 * (agent/PROTOCOL.md is the readable spec; this header is its code).
 *
 * A connection is TCP, opened by ferryfs. After the handshake (mutual
 * HMAC-SHA256 challenge-response over a pre-shared key) every frame is
 *
 *   header  u32 len | u16 type | u16 flags | u64 seq     (little endian)
 *   payload len bytes (AES-256-CTR encrypted if the session encrypts)
 *   tag     HMAC-SHA256(session MAC key, dir | header | payload)
 *
 * dir is 'C' for frames from the client, 'A' for the agent's; seq counts
 * each direction's frames from 0. A frame whose tag, seq or length is
 * wrong ends the connection (tampering, replay, reordering, reflection).
 *
 * Requests are answered in order, one REPLY each (u64 the request's seq,
 * i32 status = 0 or -errno, then the type's result), except that a DATA
 * frame follows a PUT the agent answered with "want" (see PROTOCOL.md).
 *
 * Everything here is pure (no I/O) except agent_key_load(), the
 * handshake and agent_send()/agent_recv(), which read and write an fd.
 * Parsers never trust a length: a malformed input gives -EPROTO, never
 * a read past the buffer (tests/fuzz/fuzz_agent.c fuzzes them).
 */
#ifndef FERRYFS_AGENT_H
#define FERRYFS_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>

#define AGENT_VERSION 2 /* 2: DATA tags cover the payload's digest */
#define AGENT_MAGIC "FERRYAG1"          /* 8 bytes, no NUL on the wire */
#define AGENT_NONCE 32
#define AGENT_MAC 32
#define AGENT_HDR 16
#define AGENT_PAYLOAD_MAX (64u << 20)   /* largest payload of a frame */
#define AGENT_DATA_MAX (AGENT_PAYLOAD_MAX - 4096u)
#define AGENT_KEY_MIN 16
#define AGENT_KEY_MAX 1024
#define AGENT_BATCH_MAX 256             /* requests in one BATCH */
#define AGENT_PORT_DEFAULT 7077

/* Frame types. The requests (client to agent): */
enum agent_type {
	AGENT_T_REPLY = 1,   /* agent: u64 req seq, i32 status, result */
	AGENT_T_STAT,        /* path -> stat */
	AGENT_T_STATFS,      /* - -> statfs */
	AGENT_T_MKDIR,       /* path, u32 mode */
	AGENT_T_RMDIR,       /* path */
	AGENT_T_UNLINK,      /* path */
	AGENT_T_MKNOD,       /* path, u32 mode, u64 rdev (fifo, socket) */
	AGENT_T_SYMLINK,     /* target, path */
	AGENT_T_READLINK,    /* path -> str */
	AGENT_T_LINK,        /* from, to */
	AGENT_T_RENAME,      /* from, to, u32 flags (RENAME_*) */
	AGENT_T_SETATTR,     /* u32 hid (0: by path), path, setattr */
	AGENT_T_OPEN,        /* u32 hid (client's choice), path, u32 flags,
				u32 mode */
	AGENT_T_CLOSE,       /* u32 hid */
	AGENT_T_PREAD,       /* u32 hid, u64 off, u32 len -> bytes */
	AGENT_T_FSTAT,       /* u32 hid -> stat */
	AGENT_T_FSYNC,       /* u32 hid, u32 datasync */
	AGENT_T_PUT,         /* u32 hid, u64 off, u32 len, sha256[32], u32
				inline (1: the bytes follow here) -> u32 want
				(1: send DATA; 0: the file has them already) */
	AGENT_T_DATA,        /* bytes of the PUT just answered "want" ->
				reply when written, checked and durable */
	AGENT_T_BATCH,       /* u32 n, n x (u16 type, u16 group, u32 len,
				request) -> u32 n, n x i32 status */
	AGENT_T_PUTP,        /* path, then as PUT without hid: the file at
				path (which exists) is opened, written and
				closed */
	AGENT_T_MAX
};

/* SETATTR's set bits (the same values as remote.h's enum rmt_set). */
enum agent_set {
	AGENT_SET_MODE = 1 << 0,
	AGENT_SET_UID = 1 << 1,
	AGENT_SET_GID = 1 << 2,
	AGENT_SET_SIZE = 1 << 3,
	AGENT_SET_ATIME = 1 << 4,
	AGENT_SET_MTIME = 1 << 5,
};

/* --- byte buffers -------------------------------------------------------- */

/* A growable output buffer; agent_buf_release() frees it. A failed
 * allocation makes it sticky-bad: agent_buf_ok() tells. */
struct agent_buf {
	uint8_t *p;
	size_t len, cap;
	bool bad;
};

void agent_buf_release(struct agent_buf *b);
static inline bool agent_buf_ok(const struct agent_buf *b)
{
	return !b->bad;
}
void agent_put_u16(struct agent_buf *b, uint16_t v);
void agent_put_u32(struct agent_buf *b, uint32_t v);
void agent_put_u64(struct agent_buf *b, uint64_t v);
void agent_put_bytes(struct agent_buf *b, const void *p, size_t n);
/* u16 length, then the bytes (no NUL); a string over 65535 bytes makes
 * the buffer bad */
void agent_put_str(struct agent_buf *b, const char *s);
void agent_put_stat(struct agent_buf *b, const struct stat *st);
void agent_put_statfs(struct agent_buf *b, const struct statvfs *sv);

/* A reader over received bytes: every get fails (and makes it bad) past
 * the end; nothing is read after that. */
struct agent_rd {
	const uint8_t *p;
	size_t len, off;
	bool bad;
};

uint16_t agent_get_u16(struct agent_rd *r);
uint32_t agent_get_u32(struct agent_rd *r);
uint64_t agent_get_u64(struct agent_rd *r);
/* Points into the buffer; NULL (and bad) if n bytes are not there. */
const void *agent_get_bytes(struct agent_rd *r, size_t n);
/* Copies a string into out (size at least PATH_MAX) with a NUL; bad if it
 * does not fit or holds a NUL. */
void agent_get_str(struct agent_rd *r, char *out, size_t size);
void agent_get_stat(struct agent_rd *r, struct stat *st);
void agent_get_statfs(struct agent_rd *r, struct statvfs *sv);

/* --- requests -------------------------------------------------------------- */

/* A request as parsed (strings point into @path / @path2). */
struct agent_req {
	uint16_t type;
	uint32_t hid;
	char path[4096], path2[4096];
	uint32_t mode, flags, set, len, datasync, inline_data;
	uint64_t rdev, off;
	uint32_t uid, gid;
	uint64_t size;
	struct timespec atime, mtime;
	uint8_t sha[32];
	const uint8_t *data; /* PUT inline bytes: @len of them */
};

/*
 * Parse the payload of a request of @type (not BATCH, REPLY or DATA) into
 * @q. Paths are checked: relative, no "." or ".." component, no empty one,
 * shorter than PATH_MAX ("" = the root where a path may be the root;
 * SETATTR by handle takes "").
 * Returns 0, or -EPROTO (malformed: the connection ends), -EINVAL (a path
 * that is not clean: answered with an error).
 */
int agent_req_parse(uint16_t type, const uint8_t *p, size_t len,
		    struct agent_req *q);

/* Walk a BATCH payload: agent_batch_next() gives each request's type,
 * group and bytes in turn; returns 1 while there is one, 0 at the end,
 * -EPROTO if malformed (count over AGENT_BATCH_MAX, a truncated entry). */
struct agent_batch_rd {
	struct agent_rd rd;
	uint32_t n, i;
};
int agent_batch_open(struct agent_batch_rd *b, const uint8_t *p, size_t len);
int agent_batch_next(struct agent_batch_rd *b, uint16_t *type,
		     uint16_t *group, const uint8_t **req, size_t *reqlen);

/* --- keys, sessions, frames ------------------------------------------------ */

struct agent_key {
	uint8_t k[AGENT_KEY_MAX];
	size_t len;
};

/*
 * Read a key file: its bytes, one trailing newline dropped, at least
 * AGENT_KEY_MIN and at most AGENT_KEY_MAX. Refused if group or others may
 * read it (-EPERM) or it is not a regular file (-EINVAL). Errors: open's,
 * -EINVAL (too short or long).
 */
int agent_key_load(const char *file, struct agent_key *out);

/* One authenticated connection (either side). */
struct agent_conn {
	int fd;
	bool agent;          /* this end is the agent */
	bool encrypt;        /* payloads are AES-256-CTR encrypted */
	uint8_t kmac[32], kenc[32];
	uint64_t seq_out, seq_in;
	uint8_t *rbuf;       /* the last received payload */
	size_t rcap;
	/* after a DATA frame is received: the SHA-256 of its payload as
	 * sent (its tag covers that digest, PROTOCOL.md section 2); the
	 * plaintext's when !encrypt, so the agent need not hash it again */
	uint8_t data_sha[32];
};

/*
 * The handshake, on a connected socket @fd (both sides, see PROTOCOL.md):
 * on success *c is ready and owns nothing but its buffer (the fd stays
 * the caller's). @encrypt: the client asks for encryption; the agent
 * requires it if its own @encrypt is set (else follows the client).
 * Errors: -EACCES (the other side does not know the key), -EPROTO
 * (not the protocol, another version), -ECONNRESET (closed), -ETIMEDOUT,
 * read/write errors.
 */
int agent_handshake_client(int fd, const struct agent_key *k, bool encrypt,
			   struct agent_conn *c);
int agent_handshake_agent(int fd, const struct agent_key *k, bool encrypt,
			  struct agent_conn *c);
void agent_conn_release(struct agent_conn *c);

/*
 * Liveness of a connected TCP socket, both sides: TCP_NODELAY, keepalive
 * probes after AGENT_IDLE_S idle, and TCP_USER_TIMEOUT: a peer that
 * stops answering at all (a partition: no reset, no error) fails the
 * next read or write with -ETIMEDOUT within AGENT_DEAD_MS, whether data
 * is in flight or the side waits for a reply. A slow agent still
 * answers the probes (its kernel does), so a long fsync is not cut.
 */
#define AGENT_HANDSHAKE_MS 5000 /* the agent's side of the handshake */
#define AGENT_IDLE_S 5
#define AGENT_DEAD_MS 15000
void agent_sock_live(int fd);

/* Send one frame: header, payload (@n parts), tag. Returns 0 or -errno. */
int agent_send(struct agent_conn *c, uint16_t type, const void *p1,
	       size_t n1, const void *p2, size_t n2);

/* Send a DATA frame of @n bytes whose SHA-256 is @sha (NULL: unknown). In
 * a session without encryption the tag then costs no pass over the bytes. */
int agent_send_data(struct agent_conn *c, const void *p, size_t n,
		    const uint8_t sha[32]);

/*
 * Receive one frame: *type and the payload (*p points into c's buffer,
 * valid until the next receive). Errors: -EBADMSG (wrong tag or seq: the
 * connection must end), -EPROTO (too long), -ECONNRESET (closed), read
 * errors.
 */
int agent_recv(struct agent_conn *c, uint16_t *type, const uint8_t **p,
	       size_t *len);

/* The tag of a frame (exposed for the unit tests): over the payload, or
 * for a DATA frame over the payload's SHA-256. Returns 0, or -ENOMEM when
 * it cannot be computed (then @tag is not a tag). */
int agent_frame_tag(const uint8_t kmac[32], char dir, const uint8_t *hdr,
		    const uint8_t *payload, size_t len, uint8_t tag[32]);

/* Test hook: while set, every HMAC computation fails as it does out of
 * memory (-ENOMEM). */
extern bool agent_test_fail_hmac;

#endif
