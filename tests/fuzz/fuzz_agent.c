/*
 * fuzz_agent.c - libFuzzer target for agent/ (built and run by
 * tests/fuzz/fuzz.sh with clang -fsanitize=fuzzer,address,undefined).
 *
 * Every input goes to the pure parsers first: agent_req_parse() for every
 * type, the BATCH walker (and each entry's parse), agent_get_stat(),
 * agent_get_statfs(), agent_get_str(). Then its first byte picks a mode:
 *
 *   0, 1  a session with the real server (server.c, agent_server_serve_fd()
 *         in a thread on one end of a socketpair) after a real handshake,
 *         without (0) or with (1) encryption; the rest is a list of ops the
 *         harness sends as the client:
 *           0 type:u8 len:u16 bytes    a frame with a correct tag
 *           1 len:u16 bytes            raw bytes on the wire
 *           2 hid:u8 off:u16 len:u16 how:u8 bytes
 *                                      a PUT with the SHA-256 of the bytes
 *                                      (how: 1 inline, 2 a wrong SHA-256,
 *                                      4 no DATA); not inline, the DATA
 *                                      frame follows when the agent
 *                                      answered want = 1
 *         so that the fuzzer gets past the tag check to the request code;
 *   2     raw bytes to the server's side of the handshake;
 *   3     raw bytes as the agent's answer to the client's handshake.
 *
 * The server's root is a temp dir (in $FUZZ_AGENT_TMP, else /dev/shm when
 * there is one), wiped now and then. Next to it, <tmp>/outside/victim: after every input the
 * harness checks that neither it, its directory nor <tmp> changed, and
 * aborts if so (an escape from the root is a crash).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "server.h"

static const struct agent_key key = { .k = "fuzz-agent-key-0123456789",
				      .len = 25 };
static struct agent_server *srv;
static char tmp[PATH_MAX], root[PATH_MAX + 8], outside[PATH_MAX + 16],
	victim[PATH_MAX + 32];
static struct stat st_tmp, st_out, st_victim;
static unsigned long runs;

static void die(const char *what)
{
	fprintf(stderr, "fuzz_agent: %s: %s\n", what, strerror(errno));
	abort();
}

/* --- the root ------------------------------------------------------------------ */

static void wipe_dir(int dfd)
{
	DIR *d = fdopendir(dup(dfd));
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		int sub;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (!unlinkat(dfd, e->d_name, 0))
			continue;
		fchmodat(dfd, e->d_name, 0700, 0);
		sub = openat(dfd, e->d_name,
			     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub >= 0) {
			wipe_dir(sub);
			close(sub);
		}
		unlinkat(dfd, e->d_name, AT_REMOVEDIR);
	}
	closedir(d);
}

static void wipe_root(void)
{
	int fd;

	chmod(root, 0755);
	fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		die("open root");
	wipe_dir(fd);
	close(fd);
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

static void check_outside(void)
{
	struct stat st;

	if (lstat(tmp, &st) || !same(&st, &st_tmp) || lstat(outside, &st) ||
	    !same(&st, &st_out) || lstat(victim, &st) ||
	    !same(&st, &st_victim)) {
		fprintf(stderr,
			"fuzz_agent: BUG: something outside the root "
			"changed ('%s')\n",
			tmp);
		abort();
	}
}

static char keyfile[PATH_MAX + 8];

static void cleanup(void)
{
	agent_server_free(srv);
	wipe_root();
	rmdir(root);
	unlink(victim);
	rmdir(outside);
	unlink(keyfile);
	rmdir(tmp);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct agent_server_config cfg = { 0 };
	const char *dir = getenv("FUZZ_AGENT_TMP");
	int fd;

	(void)argc, (void)argv;
	signal(SIGPIPE, SIG_IGN);
	if (!dir)
		dir = access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm";
	snprintf(tmp, sizeof(tmp), "%s/fuzz_agent.XXXXXX", dir);
	if (!mkdtemp(tmp))
		die("mkdtemp");
	snprintf(root, sizeof(root), "%s/root", tmp);
	snprintf(outside, sizeof(outside), "%s/outside", tmp);
	snprintf(victim, sizeof(victim), "%s/victim", outside);
	snprintf(keyfile, sizeof(keyfile), "%s/key", tmp);
	if (mkdir(root, 0755) || mkdir(outside, 0755))
		die("mkdir");
	fd = open(victim, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0 || write(fd, "victim\n", 7) != 7)
		die("victim");
	close(fd);
	fd = open(keyfile, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0 || write(fd, key.k, key.len) != (ssize_t)key.len)
		die("key");
	close(fd);
	/* links out of the root for the fuzzer to try */
	{
		char p[PATH_MAX * 2];

		snprintf(p, sizeof(p), "%s/l", root);
		if (symlink(outside, p))
			die("symlink");
		snprintf(p, sizeof(p), "%s/v", root);
		if (symlink(victim, p))
			die("symlink");
	}
	if (lstat(tmp, &st_tmp) || lstat(outside, &st_out) ||
	    lstat(victim, &st_victim))
		die("lstat");
	cfg.root = root;
	cfg.key_file = keyfile;
	cfg.max_conns = 4;
	if (agent_server_new(&cfg, &srv))
		die("agent_server_new");
	atexit(cleanup);
	return 0;
}

/* --- the parsers ------------------------------------------------------------- */

static void parsers(const uint8_t *d, size_t n)
{
	static struct agent_req q;
	struct agent_batch_rd b;
	struct agent_rd r;
	struct stat st;
	struct statvfs sv;
	char s[PATH_MAX];
	const uint8_t *rq;
	uint16_t type, group;
	size_t rl;

	for (uint16_t t = 0; t <= AGENT_T_MAX; t++)
		(void)agent_req_parse(t, d, n, &q);
	if (!agent_batch_open(&b, d, n))
		while (agent_batch_next(&b, &type, &group, &rq, &rl) == 1)
			(void)agent_req_parse(type, rq, rl, &q);
	r = (struct agent_rd){ .p = d, .len = n };
	agent_get_stat(&r, &st);
	agent_get_statfs(&r, &sv);
	agent_get_str(&r, s, sizeof(s));
	r = (struct agent_rd){ .p = d, .len = n };
	agent_get_statfs(&r, &sv);
	agent_get_str(&r, s, sizeof(s));
	(void)agent_get_bytes(&r, n);
}

/* --- sessions ------------------------------------------------------------------ */

static void *serve_main(void *arg)
{
	agent_server_serve_fd(srv, *(int *)arg);
	return NULL;
}

/* The client's side of a session: the drain thread reads the replies and
 * tells the last one (a PUT waits for its "want"). */
struct sess {
	struct agent_conn c;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool any, ended; /* protected by lock, as below */
	uint64_t seen; /* seq of the last request answered */
	int32_t status;
	uint32_t want;
	bool raw; /* raw bytes sent: the stream may be out of step */
};

static void *drain_main(void *arg)
{
	struct sess *s = arg;
	const uint8_t *p;
	uint16_t type;
	size_t len;
	uint8_t buf[4096];

	while (!agent_recv(&s->c, &type, &p, &len)) {
		struct agent_rd r = { .p = p, .len = len };
		uint64_t seq = agent_get_u64(&r);
		int32_t st = (int32_t)agent_get_u32(&r);
		uint32_t want = agent_get_u32(&r);

		pthread_mutex_lock(&s->lock);
		s->any = true;
		s->seen = seq;
		s->status = st;
		s->want = want;
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_lock(&s->lock);
	s->ended = true;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	while (read(s->c.fd, buf, sizeof(buf)) > 0)
		;
	return NULL;
}

/* Did the agent answer the request @seq with want = 1? false also when
 * the connection ended. */
static bool wanted(struct sess *s, uint64_t seq)
{
	bool w;

	pthread_mutex_lock(&s->lock);
	while (!s->ended && !(s->any && s->seen >= seq))
		pthread_cond_wait(&s->cond, &s->lock);
	w = !s->ended && s->seen == seq && !s->status && s->want == 1;
	pthread_mutex_unlock(&s->lock);
	return w;
}

struct in {
	const uint8_t *p;
	size_t n;
};

static unsigned int get(struct in *in, int bytes)
{
	unsigned int v = 0;

	for (int i = 0; i < bytes && in->n; i++, in->p++, in->n--)
		v |= (unsigned int)*in->p << (8 * i);
	return v;
}

static const uint8_t *take(struct in *in, size_t *len)
{
	const uint8_t *p = in->p;

	if (*len > in->n)
		*len = in->n;
	in->p += *len;
	in->n -= *len;
	return p;
}

/* PUT: how bit 0 inline, bit 1 a wrong SHA-256, bit 2 no DATA after a
 * want (the next op's frame comes instead) */
static bool put(struct sess *s, struct in *in)
{
	struct agent_conn *c = &s->c;
	uint8_t sha[32];
	uint32_t hid = get(in, 1), off = get(in, 2);
	size_t len = get(in, 2);
	unsigned int how = get(in, 1);
	bool inl = how & 1;
	const uint8_t *data = take(in, &len);
	struct agent_buf b = { 0 };
	uint64_t seq = c->seq_out;
	bool ok;

	if (!EVP_Digest(data, len, sha, NULL, EVP_sha256(), NULL))
		abort();
	if (how & 2)
		sha[0] ^= 1;
	agent_put_u32(&b, hid);
	agent_put_u64(&b, off);
	agent_put_u32(&b, (uint32_t)len);
	agent_put_bytes(&b, sha, 32);
	agent_put_u32(&b, inl);
	if (!agent_buf_ok(&b))
		abort();
	ok = !agent_send(c, AGENT_T_PUT, b.p, b.len, inl ? data : NULL,
			 inl ? len : 0);
	/* after raw bytes the agent may never answer this PUT: no wait */
	if (ok && !inl && !(how & 4) && (s->raw || wanted(s, seq)))
		ok = !agent_send(c, AGENT_T_DATA, data, len, NULL, 0);
	agent_buf_release(&b);
	return ok;
}

static void session(struct in *in, bool encrypt)
{
	static struct sess s0;
	struct sess *s = &s0;
	pthread_t ts, td;
	int sv[2];
	bool ok = true;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		die("socketpair");
	if (pthread_create(&ts, NULL, serve_main, &sv[1]))
		die("pthread_create");
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	if (agent_handshake_client(sv[0], &key, encrypt, &s->c)) {
		fprintf(stderr, "fuzz_agent: BUG: handshake failed\n");
		abort();
	}
	if (pthread_create(&td, NULL, drain_main, s))
		die("pthread_create");
	while (ok && in->n) {
		unsigned int op = get(in, 1) % 3, type;
		size_t len;
		const uint8_t *p;

		switch (op) {
		case 0:
			type = get(in, 1);
			len = get(in, 2);
			p = take(in, &len);
			ok = !agent_send(&s->c, (uint16_t)type, p, len, NULL,
					 0);
			break;
		case 1:
			len = get(in, 2);
			p = take(in, &len);
			ok = send(sv[0], p, len, MSG_NOSIGNAL) == (ssize_t)len;
			s->raw = true;
			break;
		default:
			ok = put(s, in);
		}
	}
	shutdown(sv[0], SHUT_WR);
	pthread_join(ts, NULL); /* the server closed sv[1] */
	pthread_join(td, NULL);
	agent_conn_release(&s->c);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	close(sv[0]);
}

static void raw_to_agent(const uint8_t *d, size_t n)
{
	uint8_t buf[4096];
	pthread_t ts;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		die("socketpair");
	if (pthread_create(&ts, NULL, serve_main, &sv[1]))
		die("pthread_create");
	(void)!send(sv[0], d, n, MSG_NOSIGNAL);
	shutdown(sv[0], SHUT_WR);
	while (read(sv[0], buf, sizeof(buf)) > 0)
		;
	pthread_join(ts, NULL);
	close(sv[0]);
}

struct cli {
	int fd;
	struct agent_conn c;
};

static void *client_main(void *arg)
{
	struct cli *k = arg;

	if (!agent_handshake_client(k->fd, &key, false, &k->c))
		agent_conn_release(&k->c);
	return NULL;
}

static void raw_to_client(const uint8_t *d, size_t n)
{
	struct cli k;
	pthread_t t;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		die("socketpair");
	k.fd = sv[0];
	if (pthread_create(&t, NULL, client_main, &k))
		die("pthread_create");
	(void)!send(sv[1], d, n, MSG_NOSIGNAL);
	shutdown(sv[1], SHUT_WR);
	pthread_join(t, NULL);
	close(sv[0]);
	close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	struct in in = { d + 1, n ? n - 1 : 0 };

	parsers(d, n);
	if (!n)
		return 0;
	switch (d[0] & 3) {
	case 0:
	case 1:
		session(&in, d[0] & 1);
		break;
	case 2:
		raw_to_agent(in.p, in.n);
		break;
	default:
		raw_to_client(in.p, in.n);
	}
	check_outside();
	chmod(root, 0755); /* SETATTR "" may have taken it away */
	if (++runs % 64 == 0) {
		wipe_root();
		check_outside();
		{
			char p[PATH_MAX * 2];

			snprintf(p, sizeof(p), "%s/l", root);
			(void)!symlink(outside, p);
			snprintf(p, sizeof(p), "%s/v", root);
			(void)!symlink(victim, p);
		}
	}
	return 0;
}
