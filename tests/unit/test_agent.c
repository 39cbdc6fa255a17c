/*
 * test_agent.c - unit tests of agent/: the wire protocol (proto.c: keys,
 * handshake, frames, request and BATCH parsing, the stat readers) and the
 * server (server.c) run in-process on 127.0.0.1 with a private temp root.
 *
 * Frame tests run both ends of a session over socketpairs with a "tap": the
 * test reads each frame off the wire (capture()) and writes it, changed or
 * not, to the other end (inject()), so it can tamper, replay, reorder and
 * reflect frames:
 *
 *   client c.fd=cfd <--> wire        (test: client's frames out, frames in)
 *   agent  c.fd=tap_a <--> tap       (test: frames in, agent's frames out)
 *
 * Server tests: <tmp>/root is served; <tmp>/outside/secret is a file no
 * request may reach; root/link -> <tmp>/outside, root/rel -> ../outside
 * and root/flink -> <tmp>/outside/secret point out of the root.
 * assert_outside_sane() checks after each test that nothing outside
 * changed (mode, owner, size, links, times of the dir, the file and <tmp>).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>

#include "agent.h"
#include "server.h"

#include "test_util.h"

static const struct agent_key key_a = { .k = "0123456789abcdef-the-test-key-a",
					.len = 31 };
static const struct agent_key key_b = { .k = "0123456789abcdef-the-test-key-b",
					.len = 31 };
static bool enc_off = false, enc_on = true;

/* --- raw I/O ---------------------------------------------------------------- */

static void read_n(int fd, void *buf, size_t n)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t k = read(fd, p, n);

		if (k <= 0)
			fail_msg("read: %s", k ? strerror(errno) : "EOF");
		p += k;
		n -= (size_t)k;
	}
}

static void write_n(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k <= 0)
			fail_msg("write: %s", strerror(errno));
		p += k;
		n -= (size_t)k;
	}
}

/* One frame off the wire: header, payload, tag. Returns its size. */
static size_t capture(int fd, uint8_t *buf, size_t cap)
{
	uint32_t len;

	read_n(fd, buf, AGENT_HDR);
	len = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 |
	      (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
	assert_true(AGENT_HDR + len + AGENT_MAC <= cap);
	read_n(fd, buf + AGENT_HDR, len + AGENT_MAC);
	return AGENT_HDR + len + AGENT_MAC;
}

static void inject(int fd, const uint8_t *frame, size_t n)
{
	write_n(fd, frame, n);
}

/* --- sessions over socketpairs ---------------------------------------------- */

struct hs {
	int fd;
	const struct agent_key *k;
	bool encrypt, agent;
	struct agent_conn c;
	int rc;
};

static void *hs_main(void *arg)
{
	struct hs *h = arg;

	h->rc = h->agent ?
			agent_handshake_agent(h->fd, h->k, h->encrypt, &h->c) :
			agent_handshake_client(h->fd, h->k, h->encrypt, &h->c);
	if (h->rc)
		shutdown(h->fd, SHUT_WR); /* as its caller's close would */
	return NULL;
}

static void hs_start(struct hs *h, pthread_t *t, int fd,
		     const struct agent_key *k, bool encrypt, bool agent)
{
	*h = (struct hs){
		.fd = fd, .k = k, .encrypt = encrypt, .agent = agent, .rc = 1
	};
	assert_int_equal(pthread_create(t, NULL, hs_main, h), 0);
}

struct sess {
	int cfd, wire; /* client's socket and the test's end of it */
	int tap_a, tap; /* agent's socket and the test's end of it */
	struct agent_conn cli, agt;
};

/* A session whose handshake ran straight (client fd <-> agent fd), then
 * the agent's fd is swapped for the tap. */
static void sess_open(struct sess *s, bool cli_enc, bool agt_enc)
{
	int sv[2], tv[2];
	struct hs a;
	pthread_t t;
	int rc;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, tv), 0);
	hs_start(&a, &t, sv[1], &key_a, agt_enc, true);
	rc = agent_handshake_client(sv[0], &key_a, cli_enc, &s->cli);
	pthread_join(t, NULL);
	assert_rc_ok(rc);
	assert_rc_ok(a.rc);
	s->agt = a.c;
	assert_true(s->cli.encrypt == (cli_enc || agt_enc));
	assert_true(s->agt.encrypt == s->cli.encrypt);
	s->cfd = sv[0];
	s->wire = sv[1];
	s->tap_a = tv[0];
	s->tap = tv[1];
	s->agt.fd = s->tap_a;
}

static void sess_close(struct sess *s)
{
	agent_conn_release(&s->cli);
	agent_conn_release(&s->agt);
	close(s->cfd);
	close(s->wire);
	close(s->tap_a);
	close(s->tap);
}

static bool has(const uint8_t *p, size_t n, const char *s)
{
	return memmem(p, n, s, strlen(s)) != NULL;
}

#define MARK_C "client-plaintext-marker"
#define MARK_A "agent-plaintext-marker"

/* client -> agent and agent -> client, through the tap; the markers show
 * on the wire only without encryption */
static void round_trip(struct sess *s, size_t big)
{
	static uint8_t frame[AGENT_HDR + 65536 + AGENT_MAC + 64];
	uint8_t *msg = calloc(1, big + sizeof(MARK_C));
	const uint8_t *p;
	uint16_t type;
	size_t len, n;

	assert_non_null(msg);
	memcpy(msg, MARK_C, sizeof(MARK_C));
	for (size_t i = sizeof(MARK_C); i < big; i++)
		msg[i] = (uint8_t)(i * 7);
	assert_rc_ok(
		agent_send(&s->cli, AGENT_T_STAT, msg, 10, msg + 10, big - 10));
	n = capture(s->wire, frame, sizeof(frame));
	assert_int_equal(n, AGENT_HDR + big + AGENT_MAC);
	assert_true(has(frame, n, MARK_C) == !s->cli.encrypt);
	inject(s->tap, frame, n);
	assert_rc_ok(agent_recv(&s->agt, &type, &p, &len));
	assert_int_equal(type, AGENT_T_STAT);
	assert_int_equal(len, big);
	assert_memory_equal(p, msg, big);

	assert_rc_ok(agent_send(&s->agt, AGENT_T_REPLY, MARK_A, sizeof(MARK_A),
				NULL, 0));
	n = capture(s->tap, frame, sizeof(frame));
	assert_true(has(frame, n, MARK_A) == !s->cli.encrypt);
	inject(s->wire, frame, n);
	assert_rc_ok(agent_recv(&s->cli, &type, &p, &len));
	assert_int_equal(type, AGENT_T_REPLY);
	assert_int_equal(len, sizeof(MARK_A));
	assert_memory_equal(p, MARK_A, sizeof(MARK_A));

	/* an empty frame */
	assert_rc_ok(agent_send(&s->cli, AGENT_T_STATFS, NULL, 0, NULL, 0));
	n = capture(s->wire, frame, sizeof(frame));
	inject(s->tap, frame, n);
	assert_rc_ok(agent_recv(&s->agt, &type, &p, &len));
	assert_int_equal(type, AGENT_T_STATFS);
	assert_int_equal(len, 0);
	free(msg);
}

static void test_agent__handshake_round_trip(void **state)
{
	bool enc = *(bool *)*state;
	struct sess s;

	sess_open(&s, enc, false);
	round_trip(&s, 100);
	round_trip(&s, 60000);
	round_trip(&s, sizeof(MARK_C));
	assert_int_equal(s.cli.seq_out, 3 * 2);
	assert_int_equal(s.agt.seq_in, 3 * 2);
	sess_close(&s);
}

/* an agent that requires encryption gets it from a client that did not
 * ask */
static void test_agent__handshake_agent_requires_encryption(void **state)
{
	struct sess s;

	(void)state;
	sess_open(&s, false, true);
	assert_true(s.cli.encrypt);
	round_trip(&s, 100);
	sess_close(&s);
}

/* Run a handshake through the test: client on cfd, agent on tap_a; the
 * test relays hello, answer and proof, flipping bit @bit of byte @at of
 * message @msg (0 hello, 1 answer, 2 proof; -1: none). */
static void relay_handshake(const struct agent_key *kc,
			    const struct agent_key *ka, bool enc, int msg,
			    int at, int bit, int *rc_c, int *rc_a)
{
	uint8_t buf[128];
	static const size_t len[3] = { 48, 80, 32 };
	int sv[2], tv[2];
	struct hs c, a;
	pthread_t tc, ta;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, tv), 0);
	hs_start(&c, &tc, sv[0], kc, enc, false);
	hs_start(&a, &ta, tv[0], ka, false, true);
	for (int m = 0; m < 3; m++) {
		int from = m == 1 ? tv[1] : sv[1], to = m == 1 ? sv[1] : tv[1];
		ssize_t k;
		size_t got = 0;

		/* a side that gave up closes: relay what there is */
		while (got < len[m]) {
			k = read(from, buf + got, len[m] - got);
			if (k <= 0)
				break;
			got += (size_t)k;
		}
		if (got < len[m])
			break;
		if (m == msg)
			buf[at] ^= (uint8_t)(1u << bit);
		if (send(to, buf, got, MSG_NOSIGNAL) != (ssize_t)got)
			break;
	}
	/* a side that gave up: the other sees the close */
	shutdown(tv[1], SHUT_WR);
	/* the agent ends first (it answers or refuses), then the client
	 * sees its first frame or the close */
	pthread_join(ta, NULL);
	if (!a.rc) {
		uint8_t frame[256];
		size_t n = capture(tv[1], frame, sizeof(frame));

		inject(sv[1], frame, n);
	}
	close(tv[0]);
	close(tv[1]);
	shutdown(sv[1], SHUT_RDWR);
	pthread_join(tc, NULL);
	close(sv[0]);
	close(sv[1]);
	agent_conn_release(&c.c);
	agent_conn_release(&a.c);
	*rc_c = c.rc;
	*rc_a = a.rc;
}

static void test_agent__handshake_relay_ok(void **state)
{
	int rc_c, rc_a;

	(void)state;
	/* the relay itself changes nothing: both sides succeed */
	relay_handshake(&key_a, &key_a, true, -1, 0, 0, &rc_c, &rc_a);
	assert_rc_ok(rc_c);
	assert_rc_ok(rc_a);
}

static void test_agent__handshake_wrong_key(void **state)
{
	int rc_c, rc_a;

	(void)state;
	/* the client does not take the agent's proof: -EACCES; it sends
	 * none, and the agent reads that close as a wrong key too */
	relay_handshake(&key_a, &key_b, false, -1, 0, 0, &rc_c, &rc_a);
	assert_rc_err(rc_c, EACCES);
	assert_rc_err(rc_a, EACCES);
	/* a client proof that is wrong: the agent refuses it (-EACCES) and
	 * closes, the client reads that as -EACCES too */
	relay_handshake(&key_a, &key_a, false, 2, 5, 0, &rc_c, &rc_a);
	assert_rc_err(rc_a, EACCES);
	assert_rc_err(rc_c, EACCES);
	/* an agent proof that is wrong */
	relay_handshake(&key_a, &key_a, false, 1, 16 + 32 + 3, 7, &rc_c, &rc_a);
	assert_rc_err(rc_c, EACCES);
	/* another nonce in the hello than the one the client sent */
	relay_handshake(&key_a, &key_a, false, 0, 20, 1, &rc_c, &rc_a);
	assert_rc_err(rc_c, EACCES);
}

/* a client of another protocol version is told the agent's before the
 * close, so that it can say why; both sides fail with -EPROTO */
static void test_agent__handshake_other_version(void **state)
{
	uint8_t hello[48] = "FERRYAG1", ans[80];
	size_t got = 0;
	ssize_t k;
	struct hs a;
	pthread_t ta;
	int sv[2];

	(void)state;
	hello[8] = 1; /* version 1, flags 0, a nonce of zeros */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	hs_start(&a, &ta, sv[0], &key_a, false, true);
	assert_int_equal(write(sv[1], hello, sizeof(hello)), sizeof(hello));
	while (got < sizeof(ans) &&
	       (k = read(sv[1], ans + got, sizeof(ans) - got)) > 0)
		got += (size_t)k;
	pthread_join(ta, NULL);
	assert_rc_err(a.rc, EPROTO);
	assert_int_equal(got, sizeof(ans));
	assert_memory_equal(ans, AGENT_MAGIC, 8);
	assert_int_equal(ans[8] | ans[9] << 8, AGENT_VERSION);
	for (size_t i = 12; i < sizeof(ans); i++)
		assert_int_equal(ans[i], 0); /* no proof of anything */
	agent_conn_release(&a.c);
	close(sv[0]);
	close(sv[1]);

	/* and a client told another version gives -EPROTO (the mount's
	 * "does not speak our protocol version"), not a wrong key */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	hs_start(&a, &ta, sv[0], &key_a, false, false);
	for (got = 0; got < sizeof(hello) &&
		      (k = read(sv[1], hello + got, sizeof(hello) - got)) > 0;)
		got += (size_t)k;
	assert_int_equal(got, sizeof(hello));
	ans[8] = (uint8_t)(AGENT_VERSION + 1);
	assert_int_equal(write(sv[1], ans, sizeof(ans)), sizeof(ans));
	pthread_join(ta, NULL);
	assert_rc_err(a.rc, EPROTO);
	agent_conn_release(&a.c);
	close(sv[0]);
	close(sv[1]);
}

static void test_agent__handshake_downgrade_refused(void **state)
{
	int rc_c, rc_a;

	(void)state;
	/* the hello's "encrypt" cleared on the way: the agent answers 0,
	 * the client that asked refuses */
	relay_handshake(&key_a, &key_a, true, 0, 12, 0, &rc_c, &rc_a);
	assert_rc_err(rc_c, EPROTO);
	/* the answer's flag changed on the way: it is under the proof */
	relay_handshake(&key_a, &key_a, true, 1, 12, 1, &rc_c, &rc_a);
	assert_rc_err(rc_c, EPROTO);
	relay_handshake(&key_a, &key_a, false, 1, 12, 0, &rc_c, &rc_a);
	assert_rc_err(rc_c, EACCES);
	/* not the protocol: magic, version */
	relay_handshake(&key_a, &key_a, false, 0, 0, 0, &rc_c, &rc_a);
	assert_rc_err(rc_a, EPROTO);
	relay_handshake(&key_a, &key_a, false, 0, 8, 1, &rc_c, &rc_a);
	assert_rc_err(rc_a, EPROTO);
	relay_handshake(&key_a, &key_a, false, 1, 2, 1, &rc_c, &rc_a);
	assert_rc_err(rc_c, EPROTO);
}

/* --- frames: tampering, replay, reordering, reflection ----------------------- */

static void test_agent__frame_tampered(void **state)
{
	bool enc = *(bool *)*state;
	/* a payload byte, the header's type, flags, seq; the tag */
	static const size_t at[] = { AGENT_HDR + 3,	 4, 6, 8, 15,
				     AGENT_HDR + 20 + 31 };
	uint8_t frame[256], bad[256];
	const uint8_t *p;
	uint16_t type;
	size_t len, n;
	struct sess s;

	uint8_t sha[32];

	/* a DATA frame's tag covers the SHA-256 of its payload, not the
	 * payload: tampering must be caught all the same */
	assert_true(EVP_Digest("twenty bytes payload", 20, sha, NULL,
			       EVP_sha256(), NULL));
	sess_open(&s, enc, false);
	for (int data = 0; data < 2; data++) {
		for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
			if (data)
				assert_rc_ok(agent_send_data(
					&s.cli, "twenty bytes payload", 20,
					i & 1 ? sha : NULL));
			else
				assert_rc_ok(agent_send(&s.cli, AGENT_T_UNLINK,
							"twenty bytes payload",
							20, NULL, 0));
			n = capture(s.wire, frame, sizeof(frame));
			assert_int_equal(n, AGENT_HDR + 20 + AGENT_MAC);
			for (int bit = 0; bit < 8; bit += 7) {
				memcpy(bad, frame, n);
				bad[at[i]] ^= (uint8_t)(1u << bit);
				inject(s.tap, bad, n);
				assert_rc_err(agent_recv(&s.agt, &type, &p,
							 &len),
					      EBADMSG);
			}
			/* the frame as sent passes */
			inject(s.tap, frame, n);
			assert_rc_ok(agent_recv(&s.agt, &type, &p, &len));
			assert_int_equal(type, data ? AGENT_T_DATA
						    : AGENT_T_UNLINK);
			assert_int_equal(len, 20);
			assert_memory_equal(p, "twenty bytes payload", 20);
			if (data && !enc)
				assert_memory_equal(s.agt.data_sha, sha, 32);
		}
	}
	/* a DATA frame whose sender claims another digest is refused */
	sha[0] ^= 1;
	if (!enc) {
		assert_rc_ok(agent_send_data(&s.cli, "twenty bytes payload",
					     20, sha));
		n = capture(s.wire, frame, sizeof(frame));
		inject(s.tap, frame, n);
		assert_rc_err(agent_recv(&s.agt, &type, &p, &len), EBADMSG);
	}
	sess_close(&s);
}

/* A frame's expected tag that cannot be computed (out of memory) refuses
 * the frame: it is not an all-zero tag that a frame carrying zeros
 * matches (issue 38). DATA frames (tag over the payload's digest) and
 * the others. */
static void test_agent__frame_hmac_failure_refused(void **state)
{
	uint8_t frame[256];
	const uint8_t *p;
	uint16_t type;
	size_t len, n;
	struct sess s;
	int rc;

	(void)state;
	sess_open(&s, false, false);
	for (int data = 0; data < 2; data++) {
		if (data)
			assert_rc_ok(agent_send_data(&s.cli, "twenty bytes "
						     "payload", 20, NULL));
		else
			assert_rc_ok(agent_send(&s.cli, AGENT_T_UNLINK,
						"twenty bytes payload", 20,
						NULL, 0));
		n = capture(s.wire, frame, sizeof(frame));
		memset(frame + n - AGENT_MAC, 0, AGENT_MAC);
		inject(s.tap, frame, n);
		agent_test_fail_hmac = true;
		rc = agent_recv(&s.agt, &type, &p, &len);
		agent_test_fail_hmac = false;
		if (rc == 0)
			fail_msg("a %s frame with a zero tag was taken while "
				 "its tag could not be computed",
				 data ? "DATA" : "non-DATA");
		assert_true(rc == -ENOMEM || rc == -EBADMSG);
		/* the session is over for that frame; open a new one */
		sess_close(&s);
		sess_open(&s, false, false);
	}
	sess_close(&s);
}

static void test_agent__frame_replayed(void **state)
{
	bool enc = *(bool *)*state;
	uint8_t f0[256];
	const uint8_t *p;
	uint16_t type;
	size_t len, n;
	struct sess s, s2;

	sess_open(&s, enc, false);
	assert_rc_ok(
		agent_send(&s.cli, AGENT_T_RMDIR, "\x01\x00x", 3, NULL, 0));
	n = capture(s.wire, f0, sizeof(f0));
	inject(s.tap, f0, n);
	assert_rc_ok(agent_recv(&s.agt, &type, &p, &len));
	inject(s.tap, f0, n);
	assert_rc_err(agent_recv(&s.agt, &type, &p, &len), EBADMSG);
	/* nor does it pass in another session (other keys), at its seq */
	sess_open(&s2, enc, false);
	inject(s2.tap, f0, n);
	assert_rc_err(agent_recv(&s2.agt, &type, &p, &len), EBADMSG);
	sess_close(&s2);
	sess_close(&s);
}

static void test_agent__frame_reordered(void **state)
{
	bool enc = *(bool *)*state;
	uint8_t f0[256], f1[256];
	const uint8_t *p;
	uint16_t type;
	size_t len, n0, n1;
	struct sess s;

	sess_open(&s, enc, false);
	assert_rc_ok(agent_send(&s.cli, AGENT_T_STAT, "\x01\x00a", 3, NULL, 0));
	assert_rc_ok(agent_send(&s.cli, AGENT_T_STAT, "\x01\x00b", 3, NULL, 0));
	n0 = capture(s.wire, f0, sizeof(f0));
	n1 = capture(s.wire, f1, sizeof(f1));
	inject(s.tap, f1, n1);
	assert_rc_err(agent_recv(&s.agt, &type, &p, &len), EBADMSG);
	inject(s.tap, f0, n0);
	assert_rc_ok(agent_recv(&s.agt, &type, &p, &len));
	assert_memory_equal(p, "\x01\x00a", 3);
	inject(s.tap, f1, n1);
	assert_rc_ok(agent_recv(&s.agt, &type, &p, &len));
	assert_memory_equal(p, "\x01\x00b", 3);
	sess_close(&s);
}

static void test_agent__frame_reflected(void **state)
{
	bool enc = *(bool *)*state;
	uint8_t f[256];
	const uint8_t *p;
	uint16_t type;
	size_t len, n;
	struct sess s;

	sess_open(&s, enc, false);
	/* after the handshake the client receives seq 1 next: its own
	 * frame of seq 1 differs from what it expects only in direction */
	assert_int_equal(s.cli.seq_in, 1);
	assert_rc_ok(agent_send(&s.cli, AGENT_T_REPLY, "x", 1, NULL, 0));
	(void)capture(s.wire, f, sizeof(f));
	assert_rc_ok(agent_send(&s.cli, AGENT_T_REPLY, "y", 1, NULL, 0));
	n = capture(s.wire, f, sizeof(f));
	inject(s.wire, f, n);
	assert_rc_err(agent_recv(&s.cli, &type, &p, &len), EBADMSG);
	/* the agent's frame of seq 1 passes */
	assert_int_equal(s.agt.seq_out, 1);
	assert_rc_ok(agent_send(&s.agt, AGENT_T_REPLY, "y", 1, NULL, 0));
	n = capture(s.tap, f, sizeof(f));
	inject(s.wire, f, n);
	assert_rc_ok(agent_recv(&s.cli, &type, &p, &len));
	assert_memory_equal(p, "y", 1);
	/* and the other way: the agent's own frame of seq 2 fed back to it
	 * when it expects the client's seq 2 (a new session) */
	sess_close(&s);
	sess_open(&s, enc, false);
	for (int i = 0; i < 2; i++) {
		assert_rc_ok(
			agent_send(&s.cli, AGENT_T_STATFS, NULL, 0, NULL, 0));
		n = capture(s.wire, f, sizeof(f));
		inject(s.tap, f, n);
		assert_rc_ok(agent_recv(&s.agt, &type, &p, &len));
	}
	assert_int_equal(s.agt.seq_in, 2);
	assert_rc_ok(agent_send(&s.agt, AGENT_T_STATFS, NULL, 0, NULL, 0));
	assert_rc_ok(agent_send(&s.agt, AGENT_T_STATFS, NULL, 0, NULL, 0));
	(void)capture(s.tap, f, sizeof(f));
	n = capture(s.tap, f, sizeof(f));
	inject(s.tap, f, n);
	assert_rc_err(agent_recv(&s.agt, &type, &p, &len), EBADMSG);
	sess_close(&s);
}

static void test_agent__frame_too_long(void **state)
{
	uint8_t hdr[AGENT_HDR] = { 0 };
	const uint8_t *p;
	uint16_t type;
	size_t len;
	struct sess s;

	(void)state;
	sess_open(&s, false, false);
	hdr[0] = 0x01;
	hdr[3] = 0x04; /* 64 MiB + 1 */
	hdr[4] = AGENT_T_STAT;
	inject(s.tap, hdr, sizeof(hdr));
	assert_rc_err(agent_recv(&s.agt, &type, &p, &len), EPROTO);
	assert_rc_err(agent_send(&s.cli, AGENT_T_PUT, NULL,
				 AGENT_PAYLOAD_MAX + 1, NULL, 0),
		      EMSGSIZE);
	sess_close(&s);
}

/* --- keys ------------------------------------------------------------------- */

struct tmp {
	char dir[PATH_MAX];
};

static int rm_one(const char *path, const struct stat *st, int type,
		  struct FTW *ftw)
{
	(void)st, (void)ftw;
	if (type == FTW_DP)
		chmod(path, 0700);
	return remove(path) && errno != ENOENT ? -1 : 0;
}

static void rm_tree(const char *dir)
{
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int tmp_setup(void **state)
{
	struct tmp *t = calloc(1, sizeof(*t));

	if (!t)
		return -1;
	snprintf(t->dir, sizeof(t->dir), "/tmp/test_agent.XXXXXX");
	if (!mkdtemp(t->dir))
		return -1;
	*state = t;
	return 0;
}

static int tmp_teardown(void **state)
{
	struct tmp *t = *state;

	rm_tree(t->dir);
	free(t);
	return 0;
}

static void key_file(const char *path, const char *data, size_t n, mode_t mode)
{
	int fd;

	unlink(path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

static void test_agent__key_file_rules(void **state)
{
	struct tmp *t = *state;
	char path[PATH_MAX + 16], big[AGENT_KEY_MAX + 8];
	struct agent_key k;

	snprintf(path, sizeof(path), "%s/key", t->dir);
	key_file(path, "0123456789abcdef\n", 17, 0600);
	assert_rc_ok(agent_key_load(path, &k));
	assert_int_equal(k.len, 16); /* the newline dropped */
	assert_memory_equal(k.k, "0123456789abcdef", 16);
	key_file(path, "0123456789abcdef\n", 17, 0400);
	assert_rc_ok(agent_key_load(path, &k));

	key_file(path, "0123456789abcdef\n", 17, 0644);
	assert_rc_err(agent_key_load(path, &k), EPERM);
	assert_int_equal(k.len, 0);
	key_file(path, "0123456789abcdef\n", 17, 0640);
	assert_rc_err(agent_key_load(path, &k), EPERM);
	key_file(path, "0123456789abcdef\n", 17, 0602);
	assert_rc_err(agent_key_load(path, &k), EPERM);

	key_file(path, "0123456789abcde\n", 16, 0600);
	assert_rc_err(agent_key_load(path, &k), EINVAL);
	key_file(path, "", 0, 0600);
	assert_rc_err(agent_key_load(path, &k), EINVAL);
	memset(big, 'k', sizeof(big));
	key_file(path, big, AGENT_KEY_MAX - 1, 0600);
	assert_rc_ok(agent_key_load(path, &k));
	assert_int_equal(k.len, AGENT_KEY_MAX - 1);
	key_file(path, big, AGENT_KEY_MAX, 0600);
	assert_rc_err(agent_key_load(path, &k), EINVAL);
	key_file(path, big, sizeof(big), 0600);
	assert_rc_err(agent_key_load(path, &k), EINVAL);

	assert_rc_err(agent_key_load(t->dir, &k), EINVAL);
	snprintf(path, sizeof(path), "%s/none", t->dir);
	assert_rc_err(agent_key_load(path, &k), ENOENT);
}

/* --- request parsing --------------------------------------------------------- */

#define HID 7u

/* A well-formed payload of @type with @path (and @path2 where there is a
 * second string: LINK, RENAME's target, SYMLINK's link target). */
static void build(struct agent_buf *b, uint16_t type, const char *path,
		  const char *path2)
{
	static const uint8_t sha[32] = { 1, 2, 3 };

	b->len = 0;
	b->bad = false;
	switch (type) {
	case AGENT_T_STAT:
	case AGENT_T_READLINK:
	case AGENT_T_RMDIR:
	case AGENT_T_UNLINK:
		agent_put_str(b, path);
		break;
	case AGENT_T_STATFS:
		break;
	case AGENT_T_MKDIR:
		agent_put_str(b, path);
		agent_put_u32(b, 0755);
		break;
	case AGENT_T_MKNOD:
		agent_put_str(b, path);
		agent_put_u32(b, S_IFIFO | 0644);
		agent_put_u64(b, 0);
		break;
	case AGENT_T_SYMLINK:
		agent_put_str(b, path2);
		agent_put_str(b, path);
		break;
	case AGENT_T_LINK:
		agent_put_str(b, path);
		agent_put_str(b, path2);
		break;
	case AGENT_T_RENAME:
		agent_put_str(b, path);
		agent_put_str(b, path2);
		agent_put_u32(b, RENAME_NOREPLACE);
		break;
	case AGENT_T_SETATTR:
		agent_put_u32(b, 0);
		agent_put_str(b, path);
		agent_put_u32(b, AGENT_SET_MODE | AGENT_SET_MTIME);
		agent_put_u32(b, 0640);
		agent_put_u32(b, 1000);
		agent_put_u32(b, 1001);
		agent_put_u64(b, 12345);
		agent_put_u64(b, 11);
		agent_put_u32(b, UTIME_OMIT);
		agent_put_u64(b, 22);
		agent_put_u32(b, 999999999);
		break;
	case AGENT_T_OPEN:
		agent_put_u32(b, HID);
		agent_put_str(b, path);
		agent_put_u32(b, O_RDWR | O_CREAT);
		agent_put_u32(b, 0600);
		break;
	case AGENT_T_CLOSE:
	case AGENT_T_FSTAT:
		agent_put_u32(b, HID);
		break;
	case AGENT_T_FSYNC:
		agent_put_u32(b, HID);
		agent_put_u32(b, 1);
		break;
	case AGENT_T_PREAD:
		agent_put_u32(b, HID);
		agent_put_u64(b, 4096);
		agent_put_u32(b, 65536);
		break;
	case AGENT_T_PUT:
	case AGENT_T_PUTP:
		if (type == AGENT_T_PUT)
			agent_put_u32(b, HID);
		else
			agent_put_str(b, path);
		agent_put_u64(b, 8192);
		agent_put_u32(b, 5);
		agent_put_bytes(b, sha, sizeof(sha));
		agent_put_u32(b, 1);
		agent_put_bytes(b, "hello", 5);
		break;
	default:
		fail_msg("build: type %u", type);
	}
	assert_true(agent_buf_ok(b));
}

static bool takes_path(uint16_t t)
{
	return t != AGENT_T_STATFS && t != AGENT_T_CLOSE &&
	       t != AGENT_T_FSTAT && t != AGENT_T_FSYNC && t != AGENT_T_PREAD &&
	       t != AGENT_T_PUT;
}

static bool takes_path2(uint16_t t)
{
	return t == AGENT_T_LINK || t == AGENT_T_RENAME;
}

static const char
	*const unclean[] = {
		"..",	"../x",	    "a/../b", "a/..", "/abs",  "/",
		"a//b", ".",	    "./a",    "a/.",  "a/./b", "a/",
		"//",	"a/...//b", NULL, /* a component of NAME_MAX + 1 bytes, made by long_name() */
	};

static const char *long_name(void)
{
	static char n[2 + NAME_MAX + 2] = "a/";

	memset(n + 2, 'x', NAME_MAX + 1);
	return n;
}

static void test_agent__parse_every_type(void **state)
{
	struct agent_buf b = { 0 };
	struct agent_req *q = malloc(sizeof(*q));

	(void)state;
	assert_non_null(q);
	for (uint16_t t = AGENT_T_STAT; t < AGENT_T_MAX; t++) {
		if (t == AGENT_T_DATA || t == AGENT_T_BATCH)
			continue;
		build(&b, t, "dir/file", "dir/other");
		assert_rc_ok(agent_req_parse(t, b.p, b.len, q));
		assert_int_equal(q->type, t);
		if (takes_path(t))
			assert_string_equal(q->path, "dir/file");
		if (takes_path2(t) || t == AGENT_T_SYMLINK)
			assert_string_equal(q->path2, "dir/other");
		/* every truncation, and one byte more */
		for (size_t n = 0; n < b.len; n++)
			if (agent_req_parse(t, b.p, n, q) != -EPROTO)
				fail_msg("type %u cut to %zu of %zu: not "
					 "-EPROTO",
					 t, n, b.len);
		agent_put_u16(&b, 0);
		assert_rc_err(agent_req_parse(t, b.p, b.len - 1, q), EPROTO);
		assert_rc_err(agent_req_parse(t, b.p, b.len, q), EPROTO);
		/* unclean paths */
		for (size_t i = 0;
		     takes_path(t) && i < sizeof(unclean) / sizeof(*unclean);
		     i++) {
			const char *u = unclean[i] ? unclean[i] : long_name();

			build(&b, t, u, "dir/other");
			if (agent_req_parse(t, b.p, b.len, q) != -EINVAL)
				fail_msg("type %u path '%s': not -EINVAL", t,
					 u);
			if (!takes_path2(t))
				continue;
			build(&b, t, "dir/file", u);
			if (agent_req_parse(t, b.p, b.len, q) != -EINVAL)
				fail_msg("type %u path2 '%s': not -EINVAL", t,
					 u);
		}
	}
	/* the fields */
	build(&b, AGENT_T_SETATTR, "f", NULL);
	assert_rc_ok(agent_req_parse(AGENT_T_SETATTR, b.p, b.len, q));
	assert_int_equal(q->set, AGENT_SET_MODE | AGENT_SET_MTIME);
	assert_int_equal(q->mode, 0640);
	assert_int_equal(q->uid, 1000);
	assert_int_equal(q->gid, 1001);
	assert_int_equal(q->size, 12345);
	assert_int_equal(q->atime.tv_nsec, UTIME_OMIT);
	assert_int_equal(q->mtime.tv_sec, 22);
	build(&b, AGENT_T_PUT, NULL, NULL);
	assert_rc_ok(agent_req_parse(AGENT_T_PUT, b.p, b.len, q));
	assert_int_equal(q->hid, HID);
	assert_int_equal(q->off, 8192);
	assert_int_equal(q->len, 5);
	assert_int_equal(q->inline_data, 1);
	assert_memory_equal(q->data, "hello", 5);
	build(&b, AGENT_T_PREAD, NULL, NULL);
	assert_rc_ok(agent_req_parse(AGENT_T_PREAD, b.p, b.len, q));
	assert_int_equal(q->len, 65536);
	agent_buf_release(&b);
	free(q);
}

static void test_agent__parse_bad_values(void **state)
{
	struct agent_buf b = { 0 };
	struct agent_req *q = malloc(sizeof(*q));
	char name[300];

	(void)state;
	assert_non_null(q);
	/* not requests */
	for (uint16_t t = 0; t < 300; t++) {
		if (t >= AGENT_T_STAT && t < AGENT_T_MAX && t != AGENT_T_DATA &&
		    t != AGENT_T_BATCH)
			continue;
		assert_rc_err(agent_req_parse(t, NULL, 0, q), EPROTO);
	}
	/* the root: where it may be named, and where not */
	build(&b, AGENT_T_STAT, "", NULL);
	assert_rc_ok(agent_req_parse(AGENT_T_STAT, b.p, b.len, q));
	build(&b, AGENT_T_SETATTR, "", NULL);
	assert_rc_ok(agent_req_parse(AGENT_T_SETATTR, b.p, b.len, q));
	for (uint16_t t = AGENT_T_MKDIR; t < AGENT_T_SETATTR; t++) {
		if (t == AGENT_T_READLINK)
			continue;
		build(&b, t, "", "x");
		assert_rc_err(agent_req_parse(t, b.p, b.len, q), EINVAL);
	}
	build(&b, AGENT_T_OPEN, "", NULL);
	assert_rc_err(agent_req_parse(AGENT_T_OPEN, b.p, b.len, q), EINVAL);
	build(&b, AGENT_T_LINK, "x", "");
	assert_rc_err(agent_req_parse(AGENT_T_LINK, b.p, b.len, q), EINVAL);
	/* a symlink's target is data: any bytes but none */
	build(&b, AGENT_T_SYMLINK, "s", "../../etc/passwd");
	assert_rc_ok(agent_req_parse(AGENT_T_SYMLINK, b.p, b.len, q));
	build(&b, AGENT_T_SYMLINK, "s", "");
	assert_rc_err(agent_req_parse(AGENT_T_SYMLINK, b.p, b.len, q), EPROTO);
	/* a NUL in a path, a path too long for PATH_MAX */
	b.len = 0;
	agent_put_u16(&b, 3);
	agent_put_bytes(&b, "a\0b", 3);
	assert_rc_err(agent_req_parse(AGENT_T_STAT, b.p, b.len, q), EPROTO);
	b.len = 0;
	agent_put_u16(&b, PATH_MAX);
	for (int i = 0; i < PATH_MAX; i++)
		agent_put_bytes(&b, (i % 100) == 99 ? "/" : "a", 1);
	assert_rc_err(agent_req_parse(AGENT_T_STAT, b.p, b.len, q), EPROTO);
	memset(name, 'n', 255);
	name[255] = 0;
	build(&b, AGENT_T_STAT, name, NULL);
	assert_rc_ok(agent_req_parse(AGENT_T_STAT, b.p, b.len, q));
	/* OPEN needs a handle id; SETATTR by handle takes no path */
	build(&b, AGENT_T_OPEN, "f", NULL);
	memset(b.p, 0, 4);
	assert_rc_err(agent_req_parse(AGENT_T_OPEN, b.p, b.len, q), EPROTO);
	build(&b, AGENT_T_SETATTR, "f", NULL);
	b.p[0] = 1;
	assert_rc_err(agent_req_parse(AGENT_T_SETATTR, b.p, b.len, q), EINVAL);
	build(&b, AGENT_T_SETATTR, "", NULL);
	b.p[0] = 1;
	assert_rc_ok(agent_req_parse(AGENT_T_SETATTR, b.p, b.len, q));
	/* a time's nanoseconds */
	build(&b, AGENT_T_SETATTR, "f", NULL);
	b.p[b.len - 1] = 0x40; /* mtime nsec >= 1e9 */
	assert_rc_err(agent_req_parse(AGENT_T_SETATTR, b.p, b.len, q), EPROTO);
	/* lengths: PREAD, PUT */
	b.len = 0;
	agent_put_u32(&b, HID);
	agent_put_u64(&b, 0);
	agent_put_u32(&b, AGENT_DATA_MAX + 1);
	assert_rc_err(agent_req_parse(AGENT_T_PREAD, b.p, b.len, q), EPROTO);
	b.len = 0;
	agent_put_u32(&b, HID);
	agent_put_u64(&b, (uint64_t)INT64_MAX);
	agent_put_u32(&b, 1);
	agent_put_bytes(&b, name, 32);
	agent_put_u32(&b, 0);
	assert_rc_err(agent_req_parse(AGENT_T_PUT, b.p, b.len, q), EPROTO);
	b.len = 0;
	agent_put_u32(&b, HID);
	agent_put_u64(&b, 0);
	agent_put_u32(&b, AGENT_DATA_MAX + 1);
	agent_put_bytes(&b, name, 32);
	agent_put_u32(&b, 0);
	assert_rc_err(agent_req_parse(AGENT_T_PUT, b.p, b.len, q), EPROTO);
	b.p[12] = 5; /* len 5, not inline: no bytes follow */
	memset(b.p + 13, 0, 3);
	assert_rc_ok(agent_req_parse(AGENT_T_PUT, b.p, b.len, q));
	b.p[b.len - 4] = 2; /* inline 2 */
	assert_rc_err(agent_req_parse(AGENT_T_PUT, b.p, b.len, q), EPROTO);
	agent_buf_release(&b);
	free(q);
}

/* --- BATCH ------------------------------------------------------------------- */

static void batch_add(struct agent_buf *b, uint16_t type, uint16_t group,
		      const struct agent_buf *req)
{
	agent_put_u16(b, type);
	agent_put_u16(b, group);
	agent_put_u32(b, (uint32_t)req->len);
	agent_put_bytes(b, req->p, req->len);
}

static void test_agent__batch_walk(void **state)
{
	struct agent_buf b = { 0 }, r = { 0 };
	struct agent_batch_rd br;
	const uint8_t *rq;
	uint16_t type, group;
	size_t rl, full;

	(void)state;
	agent_put_u32(&b, 3);
	build(&r, AGENT_T_MKDIR, "d", NULL);
	batch_add(&b, AGENT_T_MKDIR, 0, &r);
	build(&r, AGENT_T_STATFS, NULL, NULL);
	batch_add(&b, AGENT_T_STATFS, 0, &r);
	build(&r, AGENT_T_UNLINK, "d/f", NULL);
	batch_add(&b, AGENT_T_UNLINK, 1, &r);
	assert_rc_ok(agent_batch_open(&br, b.p, b.len));
	assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl), 1);
	assert_int_equal(type, AGENT_T_MKDIR);
	assert_int_equal(group, 0);
	assert_int_equal(rl, 2 + 1 + 4);
	assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl), 1);
	assert_int_equal(type, AGENT_T_STATFS);
	assert_int_equal(rl, 0);
	assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl), 1);
	assert_int_equal(group, 1);
	assert_memory_equal(rq,
			    "\x03\x00"
			    "d/f",
			    5);
	assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl), 0);
	full = b.len;

	/* every truncation: the open or a next fails, never a read past */
	for (size_t n = 0; n < full; n++) {
		int rc = agent_batch_open(&br, b.p, n);

		while (!rc) {
			rc = agent_batch_next(&br, &type, &group, &rq, &rl);
			if (rc != 1)
				break;
			assert_true(rq + rl <= b.p + n);
			rc = 0;
		}
		if (rc != -EPROTO)
			fail_msg("batch cut to %zu of %zu: %d", n, full, rc);
	}
	/* trailing bytes */
	agent_put_u16(&b, 0);
	assert_rc_ok(agent_batch_open(&br, b.p, b.len));
	for (int i = 0; i < 3; i++)
		assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl),
				 1);
	assert_rc_err(agent_batch_next(&br, &type, &group, &rq, &rl), EPROTO);
	/* a count that claims more than there is */
	b.len = full;
	b.p[0] = 4;
	assert_rc_ok(agent_batch_open(&br, b.p, b.len));
	for (int i = 0; i < 3; i++)
		assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl),
				 1);
	assert_rc_err(agent_batch_next(&br, &type, &group, &rq, &rl), EPROTO);
	/* an entry length past the end */
	b.p[0] = 3;
	b.p[4 + 4] = 0xff;
	assert_rc_ok(agent_batch_open(&br, b.p, b.len));
	assert_rc_err(agent_batch_next(&br, &type, &group, &rq, &rl), EPROTO);
	/* nothing: 0 entries */
	b.len = 0;
	agent_put_u32(&b, 0);
	assert_rc_ok(agent_batch_open(&br, b.p, b.len));
	assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl), 0);
	/* the count's limit */
	b.len = 0;
	agent_put_u32(&b, AGENT_BATCH_MAX);
	build(&r, AGENT_T_STATFS, NULL, NULL);
	for (int i = 0; i < AGENT_BATCH_MAX; i++)
		batch_add(&b, AGENT_T_STATFS, 0, &r);
	assert_rc_ok(agent_batch_open(&br, b.p, b.len));
	for (int i = 0; i < AGENT_BATCH_MAX; i++)
		assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl),
				 1);
	assert_int_equal(agent_batch_next(&br, &type, &group, &rq, &rl), 0);
	b.p[0] = (uint8_t)(AGENT_BATCH_MAX + 1);
	b.p[1] = (uint8_t)((AGENT_BATCH_MAX + 1) >> 8);
	batch_add(&b, AGENT_T_STATFS, 0, &r);
	assert_rc_err(agent_batch_open(&br, b.p, b.len), EPROTO);
	b.len = 0;
	agent_put_u32(&b, UINT32_MAX);
	assert_rc_err(agent_batch_open(&br, b.p, b.len), EPROTO);
	/* what may not be in a batch: BATCH, REPLY, DATA */
	for (uint16_t t = AGENT_T_REPLY; t < AGENT_T_MAX; t++) {
		if (t != AGENT_T_BATCH && t != AGENT_T_REPLY &&
		    t != AGENT_T_DATA)
			continue;
		b.len = 0;
		agent_put_u32(&b, 1);
		r.len = 0;
		agent_put_u32(&r, 0);
		batch_add(&b, t, 0, &r);
		assert_rc_ok(agent_batch_open(&br, b.p, b.len));
		assert_rc_err(agent_batch_next(&br, &type, &group, &rq, &rl),
			      EPROTO);
	}
	agent_buf_release(&b);
	agent_buf_release(&r);
}

/* --- byte buffers and readers --------------------------------------------------- */

/* nothing put in an empty buffer: no pointer arithmetic on its NULL p
 * (UBSan; found by fuzz_agent on a PREAD of 0 bytes as a first reply) */
static void test_agent__buf_put_nothing(void **state)
{
	struct agent_buf b = { 0 };
	struct agent_rd r = { 0 };

	(void)state;
	agent_put_bytes(&b, "", 0);
	agent_put_bytes(&b, NULL, 0);
	assert_true(agent_buf_ok(&b));
	assert_int_equal(b.len, 0);
	agent_put_str(&b, "");
	assert_int_equal(b.len, 2);
	agent_put_bytes(&b, NULL, 0);
	assert_int_equal(b.len, 2);
	agent_buf_release(&b);
	assert_null(agent_get_bytes(&r, 1));
	assert_true(r.bad);
	r = (struct agent_rd){ 0 };
	assert_non_null(agent_get_bytes(&r, 0));
	assert_false(r.bad);
}

/* --- the stat and statfs readers ------------------------------------------- */

static void test_agent__stat_readers(void **state)
{
	struct agent_buf b = { 0 };
	struct stat st, got;
	struct statvfs sv, svgot;
	struct agent_rd r;

	(void)state;
	assert_int_equal(stat("/", &st), 0);
	agent_put_stat(&b, &st);
	r = (struct agent_rd){ .p = b.p, .len = b.len };
	agent_get_stat(&r, &got);
	assert_false(r.bad);
	assert_int_equal(r.off, r.len);
	assert_int_equal(got.st_mode, st.st_mode);
	assert_int_equal(got.st_ino, st.st_ino);
	assert_int_equal(got.st_size, st.st_size);
	assert_int_equal(got.st_mtim.tv_sec, st.st_mtim.tv_sec);
	assert_int_equal(got.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
	for (size_t n = 0; n < b.len; n++) {
		r = (struct agent_rd){ .p = b.p, .len = n };
		agent_get_stat(&r, &got);
		assert_true(r.bad);
		assert_true(r.off <= n);
	}
	b.p[b.len - 1] = 0x7f; /* ctime nsec */
	r = (struct agent_rd){ .p = b.p, .len = b.len };
	agent_get_stat(&r, &got);
	assert_true(r.bad);

	b.len = 0;
	assert_int_equal(statvfs("/", &sv), 0);
	agent_put_statfs(&b, &sv);
	r = (struct agent_rd){ .p = b.p, .len = b.len };
	agent_get_statfs(&r, &svgot);
	assert_false(r.bad);
	assert_int_equal(svgot.f_blocks, sv.f_blocks);
	assert_int_equal(svgot.f_namemax, sv.f_namemax);
	for (size_t n = 0; n < b.len; n++) {
		r = (struct agent_rd){ .p = b.p, .len = n };
		agent_get_statfs(&r, &svgot);
		assert_true(r.bad);
	}
	agent_buf_release(&b);
}

/* --- a real server ------------------------------------------------------------ */

struct fx {
	char tmp[PATH_MAX]; /* mkdtemp(); removed by teardown */
	char root[PATH_MAX + 8]; /* <tmp>/root, served */
	char outside[PATH_MAX + 8];
	char secret[PATH_MAX + 16];
	char key[PATH_MAX + 8];
	struct stat st_tmp, st_out, st_secret;
	struct agent_server *srv;
	pthread_t t;
	int port;
	int fd; /* a client connection */
	struct agent_conn c;
	struct agent_buf b;
};

static void *srv_main(void *arg)
{
	struct fx *fx = arg;

	agent_server_run(fx->srv);
	return NULL;
}

static bool same(const struct stat *a, const struct stat *b)
{
	return a->st_mode == b->st_mode && a->st_uid == b->st_uid &&
	       a->st_gid == b->st_gid && a->st_size == b->st_size &&
	       a->st_nlink == b->st_nlink && a->st_ino == b->st_ino &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	       a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
	       a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
	       a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

static void assert_outside_sane(const struct fx *fx)
{
	struct stat st;
	char buf[64];
	int fd;
	ssize_t n;

	assert_int_equal(lstat(fx->tmp, &st), 0);
	if (!same(&st, &fx->st_tmp))
		fail_msg("'%s' changed", fx->tmp);
	assert_int_equal(lstat(fx->outside, &st), 0);
	if (!same(&st, &fx->st_out))
		fail_msg("'%s' changed", fx->outside);
	assert_int_equal(lstat(fx->secret, &st), 0);
	if (!same(&st, &fx->st_secret))
		fail_msg("'%s' changed (mode %o size %lld nlink %lu)",
			 fx->secret, st.st_mode, (long long)st.st_size,
			 (unsigned long)st.st_nlink);
	fd = open(fx->secret, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, buf, sizeof(buf));
	close(fd);
	assert_int_equal(n, 7);
	assert_memory_equal(buf, "secret\n", 7);
}

static int tcp_to(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

static void client_open(struct fx *fx, bool encrypt)
{
	fx->fd = tcp_to(fx->port);
	assert_rc_ok(agent_handshake_client(fx->fd, &key_a, encrypt, &fx->c));
}

static void client_close(struct fx *fx)
{
	if (fx->fd >= 0) {
		close(fx->fd);
		agent_conn_release(&fx->c);
		fx->fd = -1;
	}
}

static int srv_setup(void **state)
{
	struct fx *fx = calloc(1, sizeof(*fx));
	struct agent_server_config cfg = { .listen = "127.0.0.1:0" };
	char p[PATH_MAX * 2];
	int fd;

	if (!fx)
		return -1;
	fx->fd = -1;
	snprintf(fx->tmp, sizeof(fx->tmp), "/tmp/test_agent.XXXXXX");
	if (!mkdtemp(fx->tmp))
		return -1;
	snprintf(fx->root, sizeof(fx->root), "%s/root", fx->tmp);
	snprintf(fx->outside, sizeof(fx->outside), "%s/outside", fx->tmp);
	snprintf(fx->secret, sizeof(fx->secret), "%s/secret", fx->outside);
	snprintf(fx->key, sizeof(fx->key), "%s/key", fx->tmp);
	if (mkdir(fx->root, 0755) || mkdir(fx->outside, 0755))
		return -1;
	fd = open(fx->secret, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0 || write(fd, "secret\n", 7) != 7)
		return -1;
	close(fd);
	fd = open(fx->key, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0 || write(fd, key_a.k, key_a.len) != (ssize_t)key_a.len)
		return -1;
	close(fd);
	snprintf(p, sizeof(p), "%s/link", fx->root);
	if (symlink(fx->outside, p))
		return -1;
	snprintf(p, sizeof(p), "%s/flink", fx->root);
	if (symlink(fx->secret, p))
		return -1;
	snprintf(p, sizeof(p), "%s/rel", fx->root);
	if (symlink("../outside", p))
		return -1;
	snprintf(p, sizeof(p), "%s/f", fx->root);
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0)
		return -1;
	close(fd);
	if (lstat(fx->tmp, &fx->st_tmp) || lstat(fx->outside, &fx->st_out) ||
	    lstat(fx->secret, &fx->st_secret))
		return -1;
	cfg.root = fx->root;
	cfg.key_file = fx->key;
	if (agent_server_new(&cfg, &fx->srv))
		return -1;
	fx->port = agent_server_port(fx->srv);
	if (fx->port <= 0 || pthread_create(&fx->t, NULL, srv_main, fx))
		return -1;
	*state = fx;
	return 0;
}

static int srv_teardown(void **state)
{
	struct fx *fx = *state;

	client_close(fx);
	agent_server_stop(fx->srv);
	pthread_join(fx->t, NULL);
	agent_server_free(fx->srv);
	agent_buf_release(&fx->b);
	rm_tree(fx->tmp);
	free(fx);
	return 0;
}

/* Send fx->b as @type and read the reply: its status; *res the result. */
static int call(struct fx *fx, uint16_t type, struct agent_rd *res)
{
	uint64_t seq = fx->c.seq_out;
	const uint8_t *p;
	uint16_t rtype;
	size_t len;
	struct agent_rd r;
	int32_t st;

	assert_true(agent_buf_ok(&fx->b));
	assert_rc_ok(agent_send(&fx->c, type, fx->b.p, fx->b.len, NULL, 0));
	assert_rc_ok(agent_recv(&fx->c, &rtype, &p, &len));
	assert_int_equal(rtype, AGENT_T_REPLY);
	r = (struct agent_rd){ .p = p, .len = len };
	assert_int_equal(agent_get_u64(&r), seq);
	st = (int32_t)agent_get_u32(&r);
	assert_false(r.bad);
	if (res)
		*res = r;
	return st;
}

static int req(struct fx *fx, uint16_t type, const char *path,
	       const char *path2)
{
	build(&fx->b, type, path, path2);
	return call(fx, type, NULL);
}

static int setattr(struct fx *fx, const char *path, uint32_t set, uint32_t mode,
		   uint64_t size)
{
	struct agent_buf *b = &fx->b;

	b->len = 0;
	agent_put_u32(b, 0);
	agent_put_str(b, path);
	agent_put_u32(b, set);
	agent_put_u32(b, mode);
	agent_put_u32(b, getuid());
	agent_put_u32(b, getgid());
	agent_put_u64(b, size);
	agent_put_u64(b, 0);
	agent_put_u32(b, UTIME_OMIT);
	agent_put_u64(b, 1000000);
	agent_put_u32(b, 0);
	return call(fx, AGENT_T_SETATTR, NULL);
}

static int open_(struct fx *fx, uint32_t hid, const char *path, int flags)
{
	struct agent_buf *b = &fx->b;

	b->len = 0;
	agent_put_u32(b, hid);
	agent_put_str(b, path);
	agent_put_u32(b, (uint32_t)flags);
	agent_put_u32(b, 0666);
	return call(fx, AGENT_T_OPEN, NULL);
}

static mode_t lmode(const struct fx *fx, const char *rel)
{
	char p[PATH_MAX * 2];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", fx->root, rel);
	if (lstat(p, &st))
		return 0;
	return st.st_mode;
}

static void test_agent__server_dotdot_and_absolute(void **state)
{
	struct fx *fx = *state;

	client_open(fx, false);
	assert_rc_ok(req(fx, AGENT_T_STAT, "f", NULL));
	assert_rc_err(req(fx, AGENT_T_STAT, "../outside/secret", NULL), EINVAL);
	assert_rc_err(req(fx, AGENT_T_STAT, fx->secret, NULL), EINVAL);
	assert_rc_err(open_(fx, 1, "../outside/secret", O_RDWR | O_TRUNC),
		      EINVAL);
	assert_rc_err(open_(fx, 1, fx->secret, O_RDWR | O_TRUNC), EINVAL);
	assert_rc_err(setattr(fx, "../outside/secret", AGENT_SET_MODE, 0777, 0),
		      EINVAL);
	assert_rc_err(setattr(fx, "f/../../outside/secret", AGENT_SET_SIZE, 0,
			      0),
		      EINVAL);
	assert_rc_err(req(fx, AGENT_T_UNLINK, "../outside/secret", NULL),
		      EINVAL);
	assert_rc_err(req(fx, AGENT_T_RENAME, "../outside/secret", "got"),
		      EINVAL);
	assert_rc_err(req(fx, AGENT_T_RENAME, "f", "../outside/f"), EINVAL);
	assert_rc_err(req(fx, AGENT_T_LINK, "../outside/secret", "got"),
		      EINVAL);
	assert_rc_err(req(fx, AGENT_T_MKDIR, "../outside/d", NULL), EINVAL);
	/* the connection goes on after -EINVAL */
	assert_rc_ok(req(fx, AGENT_T_STATFS, NULL, NULL));
	assert_outside_sane(fx);
}

static void test_agent__server_symlink_intermediate(void **state)
{
	struct fx *fx = *state;

	client_open(fx, true);
	for (int i = 0; i < 2; i++) {
		const char *in = i ? "rel/secret" : "link/secret";

		assert_rc_err(req(fx, AGENT_T_STAT, in, NULL), ELOOP);
		assert_rc_err(req(fx, AGENT_T_READLINK, in, NULL), ELOOP);
		assert_rc_err(open_(fx, 1, in, O_RDWR | O_TRUNC), ELOOP);
		assert_rc_err(open_(fx, 1, in, O_RDONLY), ELOOP);
		assert_rc_err(open_(fx, 1, i ? "rel/new" : "link/new",
				    O_RDWR | O_CREAT),
			      ELOOP);
		assert_rc_err(setattr(fx, in, AGENT_SET_MODE, 0777, 0), ELOOP);
		assert_rc_err(setattr(fx, in, AGENT_SET_SIZE, 0, 0), ELOOP);
		assert_rc_err(setattr(fx, in,
				      AGENT_SET_UID | AGENT_SET_GID |
					      AGENT_SET_MTIME,
				      0, 0),
			      ELOOP);
		assert_rc_err(req(fx, AGENT_T_UNLINK, in, NULL), ELOOP);
		assert_rc_err(req(fx, AGENT_T_RENAME, in, "got"), ELOOP);
		assert_rc_err(req(fx, AGENT_T_RENAME, "f", in), ELOOP);
		assert_rc_err(req(fx, AGENT_T_MKDIR, i ? "rel/d" : "link/d",
				  NULL),
			      ELOOP);
		assert_rc_err(req(fx, AGENT_T_MKNOD, i ? "rel/p" : "link/p",
				  NULL),
			      ELOOP);
		assert_rc_err(req(fx, AGENT_T_SYMLINK, i ? "rel/s" : "link/s",
				  "/"),
			      ELOOP);
		assert_outside_sane(fx);
	}
	/* a symlink made through the agent is not followed either */
	assert_rc_ok(req(fx, AGENT_T_SYMLINK, "s2", fx->outside));
	assert_rc_err(open_(fx, 2, "s2/secret", O_RDWR | O_TRUNC), ELOOP);
	assert_rc_err(open_(fx, 2, "s2/new", O_RDWR | O_CREAT), ELOOP);
	assert_outside_sane(fx);
}

static void test_agent__server_symlink_last(void **state)
{
	struct fx *fx = *state;
	struct agent_rd res;
	struct stat st;
	char t[PATH_MAX];

	client_open(fx, false);
	/* OPEN, however asked, does not open what flink names */
	assert_rc_err(open_(fx, 1, "flink", O_RDONLY), ELOOP);
	assert_rc_err(open_(fx, 1, "flink", O_RDWR | O_TRUNC), ELOOP);
	assert_rc_err(open_(fx, 1, "flink", O_WRONLY | O_CREAT | O_TRUNC),
		      ELOOP);
	assert_rc_err(open_(fx, 1, "link", O_RDONLY), ELOOP);
	/* a dangling link to a name outside: O_CREAT does not create it */
	{
		char p[PATH_MAX * 2], to[PATH_MAX * 2];

		snprintf(p, sizeof(p), "%s/dl", fx->root);
		snprintf(to, sizeof(to), "%s/new", fx->outside);
		assert_int_equal(symlink(to, p), 0);
		assert_rc_err(open_(fx, 1, "dl", O_WRONLY | O_CREAT), ELOOP);
		assert_rc_err(req(fx, AGENT_T_MKDIR, "dl", NULL), EEXIST);
		assert_int_equal(access(to, F_OK), -1);
	}
	/* SETATTR: chmod, truncate never reach the target */
	assert_rc_err(setattr(fx, "flink", AGENT_SET_MODE, 0777, 0),
		      EOPNOTSUPP);
	assert_rc_err(setattr(fx, "link", AGENT_SET_MODE, 0777, 0), EOPNOTSUPP);
	assert_rc_err(setattr(fx, "flink", AGENT_SET_SIZE, 0, 0), ELOOP);
	/* owner and times act on the link itself */
	assert_rc_ok(setattr(fx, "flink",
			     AGENT_SET_UID | AGENT_SET_GID | AGENT_SET_MTIME, 0,
			     0));
	assert_true(S_ISLNK(lmode(fx, "flink")));
	assert_outside_sane(fx);
	/* stat and readlink see the link */
	build(&fx->b, AGENT_T_STAT, "flink", NULL);
	assert_rc_ok(call(fx, AGENT_T_STAT, &res));
	agent_get_stat(&res, &st);
	assert_false(res.bad);
	assert_true(S_ISLNK(st.st_mode));
	build(&fx->b, AGENT_T_READLINK, "flink", NULL);
	assert_rc_ok(call(fx, AGENT_T_READLINK, &res));
	agent_get_str(&res, t, sizeof(t));
	assert_string_equal(t, fx->secret);
	/* a file in the root still gets its chmod */
	assert_rc_ok(setattr(fx, "f", AGENT_SET_MODE, 0600, 0));
	assert_int_equal(lmode(fx, "f") & 07777, 0600);
	assert_outside_sane(fx);
}

static void test_agent__server_hardlink_outside(void **state)
{
	struct fx *fx = *state;

	client_open(fx, false);
	assert_rc_err(req(fx, AGENT_T_LINK, "link/secret", "got"), ELOOP);
	assert_rc_err(req(fx, AGENT_T_LINK, "rel/secret", "got"), ELOOP);
	assert_rc_err(req(fx, AGENT_T_LINK, "f", "link/got"), ELOOP);
	assert_rc_err(req(fx, AGENT_T_LINK, "../outside/secret", "got"),
		      EINVAL);
	assert_rc_err(req(fx, AGENT_T_LINK, fx->secret, "got"), EINVAL);
	/* linking the symlink links the symlink, not the file */
	assert_rc_ok(req(fx, AGENT_T_LINK, "flink", "hl"));
	assert_true(S_ISLNK(lmode(fx, "hl")));
	assert_rc_err(open_(fx, 1, "hl", O_RDWR | O_TRUNC), ELOOP);
	assert_int_equal(lmode(fx, "got"), 0);
	assert_outside_sane(fx); /* nlink of secret still 1 */
}

/* read a frame and expect the close */
static void assert_closed(struct fx *fx)
{
	const uint8_t *p;
	uint16_t type;
	size_t len;

	assert_rc_err(agent_recv(&fx->c, &type, &p, &len), ECONNRESET);
}

static void test_agent__server_malformed_frame(void **state)
{
	struct fx *fx = *state;
	static const uint16_t types[] = { AGENT_T_STAT,
					  AGENT_T_PUT,
					  AGENT_T_BATCH,
					  AGENT_T_REPLY,
					  AGENT_T_DATA,
					  0,
					  99 };

	for (size_t i = 0; i < sizeof(types) / sizeof(*types); i++) {
		client_open(fx, i & 1);
		assert_rc_ok(req(fx, AGENT_T_STAT, "f", NULL));
		fx->b.len = 0;
		agent_put_u16(&fx->b, 100); /* a string of 100, 3 bytes */
		agent_put_bytes(&fx->b, "abc", 3);
		assert_rc_err(call(fx, types[i], NULL), EPROTO);
		assert_closed(fx);
		client_close(fx);
	}
	/* a batch with one bad entry after a good one: the whole frame is
	 * malformed, and nothing of it was done */
	client_open(fx, false);
	fx->b.len = 0;
	agent_put_u32(&fx->b, 2);
	agent_put_u16(&fx->b, AGENT_T_MKDIR);
	agent_put_u16(&fx->b, 0);
	agent_put_u32(&fx->b, 2 + 1 + 4);
	agent_put_str(&fx->b, "m");
	agent_put_u32(&fx->b, 0755);
	agent_put_u16(&fx->b, AGENT_T_BATCH);
	agent_put_u16(&fx->b, 0);
	agent_put_u32(&fx->b, 0);
	assert_rc_err(call(fx, AGENT_T_BATCH, NULL), EPROTO);
	assert_closed(fx);
	client_close(fx);
	assert_int_equal(lmode(fx, "m"), 0);
	/* the server serves the next connection */
	client_open(fx, false);
	assert_rc_ok(req(fx, AGENT_T_STATFS, NULL, NULL));
	assert_rc_ok(req(fx, AGENT_T_STAT, "f", NULL));
	assert_outside_sane(fx);
}

static void test_agent__server_bad_frame_closes(void **state)
{
	struct fx *fx = *state;
	uint8_t frame[64];
	int sv[2];
	size_t n;

	/* a frame with a bad tag: closed without a reply. The client's
	 * frame goes through a socketpair to be changed on the way. */
	client_open(fx, false);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	fx->c.fd = sv[0];
	build(&fx->b, AGENT_T_STAT, "f", NULL);
	assert_rc_ok(
		agent_send(&fx->c, AGENT_T_STAT, fx->b.p, fx->b.len, NULL, 0));
	n = capture(sv[1], frame, sizeof(frame));
	frame[n - 1] ^= 1;
	write_n(fx->fd, frame, n);
	fx->c.fd = fx->fd;
	assert_closed(fx);
	client_close(fx);
	close(sv[0]);
	close(sv[1]);
	/* a key the server does not know */
	fx->fd = tcp_to(fx->port);
	assert_rc_err(agent_handshake_client(fx->fd, &key_b, false, &fx->c),
		      EACCES);
	client_close(fx);
	/* not the protocol */
	fx->fd = tcp_to(fx->port);
	memset(frame, 'x', 48);
	memcpy(frame, "GET / HTTP/1.0\r\n\r\n", 18);
	write_n(fx->fd, frame, 48);
	n = (size_t)read(fx->fd, frame, sizeof(frame));
	assert_int_equal(n, 0); /* closed, nothing said */
	close(fx->fd);
	fx->fd = -1;
	client_open(fx, true);
	assert_rc_ok(req(fx, AGENT_T_STAT, "f", NULL));
}

/* PUT inline, pulled (want, DATA), already there (have); PREAD; BATCH
 * groups: the requests behind a failure in its group are skipped */
static void test_agent__server_put_and_batch(void **state)
{
	struct fx *fx = *state;
	struct agent_buf r = { 0 };
	size_t big = 300000;
	uint8_t *data = malloc(big), sha[32] = { 0 };
	struct agent_rd res;
	uint64_t seq;
	const uint8_t *p;
	uint16_t type;
	size_t len;
	int32_t want[] = { 0, -EEXIST, 0, -ENOENT, -ECANCELED, 0 };

	assert_non_null(data);
	for (size_t i = 0; i < big; i++)
		data[i] = (uint8_t)(i * 31 + 7);
	client_open(fx, true);
	assert_rc_ok(open_(fx, 5, "data", O_RDWR | O_CREAT));
	/* a wrong SHA-256: -EIO, nothing written */
	fx->b.len = 0;
	agent_put_u32(&fx->b, 5);
	agent_put_u64(&fx->b, 0);
	agent_put_u32(&fx->b, 5);
	agent_put_bytes(&fx->b, sha, 32);
	agent_put_u32(&fx->b, 1);
	agent_put_bytes(&fx->b, "hello", 5);
	assert_rc_err(call(fx, AGENT_T_PUT, NULL), EIO);
	/* pulled */
	fx->b.len = 0;
	agent_put_u32(&fx->b, 5);
	agent_put_u64(&fx->b, 0);
	agent_put_u32(&fx->b, (uint32_t)big);
	assert_int_equal(EVP_Digest(data, big, sha, NULL, EVP_sha256(), NULL),
			 1);
	agent_put_bytes(&fx->b, sha, 32);
	agent_put_u32(&fx->b, 0);
	assert_rc_ok(call(fx, AGENT_T_PUT, &res));
	assert_int_equal(agent_get_u32(&res), 1); /* want */
	seq = fx->c.seq_out;
	assert_rc_ok(agent_send(&fx->c, AGENT_T_DATA, data, big, NULL, 0));
	assert_rc_ok(agent_recv(&fx->c, &type, &p, &len));
	res = (struct agent_rd){ .p = p, .len = len };
	assert_int_equal(agent_get_u64(&res), seq);
	assert_int_equal((int32_t)agent_get_u32(&res), 0);
	/* again: the file has it */
	assert_rc_ok(call(fx, AGENT_T_PUT, &res));
	assert_int_equal(agent_get_u32(&res), 0);
	/* read back */
	fx->b.len = 0;
	agent_put_u32(&fx->b, 5);
	agent_put_u64(&fx->b, 1000);
	agent_put_u32(&fx->b, 5000);
	assert_rc_ok(call(fx, AGENT_T_PREAD, &res));
	assert_int_equal(res.len - res.off, 5000);
	assert_memory_equal(res.p + res.off, data + 1000, 5000);

	/* a batch of three groups */
	fx->b.len = 0;
	agent_put_u32(&fx->b, 6);
	build(&r, AGENT_T_MKDIR, "d", NULL);
	batch_add(&fx->b, AGENT_T_MKDIR, 0, &r);
	batch_add(&fx->b, AGENT_T_MKDIR, 1, &r); /* exists now */
	build(&r, AGENT_T_MKDIR, "d/e", NULL);
	batch_add(&fx->b, AGENT_T_MKDIR, 2, &r);
	build(&r, AGENT_T_MKDIR, "x/y", NULL);
	batch_add(&fx->b, AGENT_T_MKDIR, 3, &r);
	build(&r, AGENT_T_MKDIR, "x/y/z", NULL);
	batch_add(&fx->b, AGENT_T_MKDIR, 3, &r);
	build(&r, AGENT_T_MKDIR, "d/e/f", NULL);
	batch_add(&fx->b, AGENT_T_MKDIR, 4, &r);
	assert_rc_ok(call(fx, AGENT_T_BATCH, &res));
	assert_int_equal(agent_get_u32(&res), 6);
	for (int i = 0; i < 6; i++)
		assert_int_equal((int32_t)agent_get_u32(&res), want[i]);
	assert_false(res.bad);
	assert_true(S_ISDIR(lmode(fx, "d/e/f")));
	agent_buf_release(&r);
	free(data);
	assert_outside_sane(fx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_prestate(test_agent__handshake_round_trip,
					  &enc_off),
		cmocka_unit_test_prestate(test_agent__handshake_round_trip,
					  &enc_on),
		cmocka_unit_test(
			test_agent__handshake_agent_requires_encryption),
		cmocka_unit_test(test_agent__handshake_relay_ok),
		cmocka_unit_test(test_agent__handshake_wrong_key),
		cmocka_unit_test(test_agent__handshake_downgrade_refused),
		cmocka_unit_test(test_agent__handshake_other_version),
		cmocka_unit_test_prestate(test_agent__frame_tampered, &enc_off),
		cmocka_unit_test_prestate(test_agent__frame_tampered, &enc_on),
		cmocka_unit_test_prestate(test_agent__frame_replayed, &enc_off),
		cmocka_unit_test_prestate(test_agent__frame_replayed, &enc_on),
		cmocka_unit_test_prestate(test_agent__frame_reordered,
					  &enc_off),
		cmocka_unit_test_prestate(test_agent__frame_reordered, &enc_on),
		cmocka_unit_test_prestate(test_agent__frame_reflected,
					  &enc_off),
		cmocka_unit_test_prestate(test_agent__frame_reflected, &enc_on),
		cmocka_unit_test(test_agent__frame_too_long),
		cmocka_unit_test(test_agent__frame_hmac_failure_refused),
		cmocka_unit_test_setup_teardown(test_agent__key_file_rules,
						tmp_setup, tmp_teardown),
		cmocka_unit_test(test_agent__parse_every_type),
		cmocka_unit_test(test_agent__parse_bad_values),
		cmocka_unit_test(test_agent__batch_walk),
		cmocka_unit_test(test_agent__buf_put_nothing),
		cmocka_unit_test(test_agent__stat_readers),
		cmocka_unit_test_setup_teardown(
			test_agent__server_dotdot_and_absolute, srv_setup,
			srv_teardown),
		cmocka_unit_test_setup_teardown(
			test_agent__server_symlink_intermediate, srv_setup,
			srv_teardown),
		cmocka_unit_test_setup_teardown(test_agent__server_symlink_last,
						srv_setup, srv_teardown),
		cmocka_unit_test_setup_teardown(
			test_agent__server_hardlink_outside, srv_setup,
			srv_teardown),
		cmocka_unit_test_setup_teardown(
			test_agent__server_malformed_frame, srv_setup,
			srv_teardown),
		cmocka_unit_test_setup_teardown(
			test_agent__server_bad_frame_closes, srv_setup,
			srv_teardown),
		cmocka_unit_test_setup_teardown(test_agent__server_put_and_batch,
						srv_setup, srv_teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
