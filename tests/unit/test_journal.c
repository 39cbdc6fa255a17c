/*
 * test_journal.c - unit tests of journal/: open and identity, the merged
 * namespace, data and the chunk state machine, group commit and crash
 * recovery, the op log's dependency order.
 *
 * Each case gets a fresh mkdtemp() dir <tmp> with the journal in <tmp>/j,
 * opened with JNL_CREATE, a 64 KiB chunk size (CS) and the remote id RID.
 * jnl_assert_sane() (journal_i.h) checks every invariant of journal.c after
 * each mutation. "Crashes" are forked children that _exit() without
 * jnl_close(): what they committed must be there, nothing else.
 */
#include <dirent.h>
#include <openssl/evp.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>

#include "journal.h"
#include "journal_i.h"

#include "test_util.h"

#define CS (64u << 10) /* chunk size of the test journals */
#define RID "path:/srv/share"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
/* instrumented builds: smaller runs, a sanity floor (10,000 creates/s
 * under ASan alone on the CI machine) */
#define CREATES_FLOOR 300.0
#define HEAVY(n) ((n) / 10)
#else
#define CREATES_FLOOR 30000.0
#define HEAVY(n) (n)
#endif

struct fx {
	char tmp[256]; /* mkdtemp(); removed by teardown */
	char dir[272]; /* <tmp>/j, the journal */
	struct jnl_config cfg;
	struct jnl *j;
};

/* --- helpers ------------------------------------------------------------ */

static int rm_one(const char *path, const struct stat *st, int type,
		  struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	return type == FTW_DP ? rmdir(path) : unlink(path);
}

static void reopen(struct fx *fx)
{
	jnl_close(fx->j);
	fx->j = NULL;
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	jnl_assert_sane(fx->j);
}

static struct jnl_node attr(mode_t mode)
{
	struct jnl_node a;

	memset(&a, 0, sizeof(a));
	a.mode = mode;
	a.uid = 1000;
	a.gid = 100;
	return a;
}

static jnl_id mk_file(struct jnl *j, jnl_id parent, const char *name)
{
	struct jnl_node a = attr(S_IFREG | 0644);
	jnl_id id;

	assert_rc_ok(jnl_create(j, parent, name, &a, &id));
	jnl_assert_sane(j);
	return id;
}

static jnl_id mk_dir(struct jnl *j, jnl_id parent, const char *name)
{
	struct jnl_node a = attr(0755);
	jnl_id id;

	assert_rc_ok(jnl_mkdir(j, parent, name, &a, &id));
	jnl_assert_sane(j);
	return id;
}

static jnl_id import_n(struct jnl *j, jnl_id parent, const char *name,
		       mode_t mode, uint64_t ino, off_t size, nlink_t nlink)
{
	struct stat st;
	jnl_id id;

	memset(&st, 0, sizeof(st));
	st.st_dev = 42;
	st.st_ino = ino;
	st.st_mode = mode;
	st.st_nlink = nlink;
	st.st_size = size;
	st.st_mtim.tv_sec = 1000000000;
	assert_rc_ok(jnl_node_import(j, parent, name, &st, &id));
	jnl_assert_sane(j);
	return id;
}

static jnl_id import(struct jnl *j, jnl_id parent, const char *name,
		     mode_t mode, uint64_t ino, off_t size)
{
	return import_n(j, parent, name, mode, ino, size, S_ISDIR(mode) ? 2 : 1);
}

static void pattern(unsigned char *buf, size_t len, unsigned int seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 8));
}

static void write_pattern(struct jnl *j, jnl_id id, off_t off, size_t len,
			  unsigned int seed)
{
	unsigned char *buf = malloc(len);

	assert_non_null(buf);
	pattern(buf, len, seed);
	assert_int_equal(jnl_write(j, id, buf, len, off), len);
	free(buf);
}

static struct jnl_stats stats(struct jnl *j)
{
	struct jnl_stats s;

	assert_rc_ok(jnl_sync(j));
	assert_rc_ok(jnl_stats(j, &s));
	return s;
}

static uint64_t nops(struct jnl *j)
{
	return stats(j).pending_ops;
}

/* The ops ready once the acks so far are durable (invariant 18). */
static int ready(struct jnl *j, struct jnl_op *ops, int max)
{
	assert_rc_ok(jnl_sync(j));
	return jnl_ops_ready(j, ops, max);
}

/* jnl_ops_ready() polled every 10 ms, @tries times at most, until it
 * hands something out: what a commit of the committer's lets go. */
static int ready_within(struct jnl *j, struct jnl_op *ops, int max, int tries)
{
	int n = 0;

	for (int i = 0; i < tries && n == 0; i++) {
		n = jnl_ops_ready(j, ops, max);
		if (n == 0)
			usleep(10000);
	}
	return n;
}

/* Hand out everything ready and ack it, until nothing is pending. */
static void ack_everything(struct jnl *j)
{
	struct jnl_op ops[64];
	int n, rounds = 0;

	do { /* nops() syncs: the acks' dependents are ready next round */
		while ((n = jnl_ops_ready(j, ops, 64)) > 0)
			for (int i = 0; i < n; i++)
				assert_rc_ok(jnl_op_ack(j, ops[i].seq));
		assert_rc_ok(n);
	} while (nops(j) && ++rounds < 1000);
	assert_int_equal(nops(j), 0);
	jnl_assert_sane(j);
}

/* Hand out what is ready and ack the ops of @type only. */
static void ack_only(struct jnl *j, enum jnl_op_type type)
{
	struct jnl_op ops[64];
	int n = jnl_ops_ready(j, ops, 64);

	assert_true(n > 0);
	for (int i = 0; i < n; i++) {
		if (ops[i].type == type)
			assert_rc_ok(jnl_op_ack(j, ops[i].seq));
		else
			assert_rc_ok(jnl_op_fail(j, ops[i].seq, false));
	}
}

static const struct jnl_op *find_op(const struct jnl_op *ops, int n,
				    enum jnl_op_type type, jnl_id id)
{
	for (int i = 0; i < n; i++)
		if (ops[i].type == type && ops[i].id == id)
			return &ops[i];
	return NULL;
}

static void assert_rpath(struct jnl *j, jnl_id id, const char *want)
{
	char buf[PATH_MAX];

	assert_rc_ok(jnl_node_rpath(j, id, buf, sizeof(buf)));
	assert_string_equal(buf, want);
}

static uint64_t node_size(struct jnl *j, jnl_id id)
{
	struct jnl_node n;

	assert_rc_ok(jnl_node_get(j, id, &n));
	return n.size;
}

/* State of chunk (id, idx) in LMDB, 0 if it has no record. */
static int chunk_state(struct jnl *j, jnl_id id, uint64_t idx,
		       struct jnl_chunk_rec *out)
{
	struct jnl_chunk_rec c;
	MDB_txn *txn;
	int rc;

	assert_rc_ok(jnl_rtx_begin(j, &txn));
	rc = jnl_chunk_get(j, txn, id, idx, &c);
	jnl_rtx_end(j);
	if (rc == -ENOENT)
		return 0;
	assert_rc_ok(rc);
	if (out)
		*out = c;
	return c.state;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t last_txnid(struct jnl *j)
{
	MDB_envinfo info;

	assert_int_equal(mdb_env_info(j->env, &info), 0);
	return info.me_last_txnid;
}

/* --- fixtures ------------------------------------------------------------ */

static int setup(void **state)
{
	struct fx *fx = calloc(1, sizeof(*fx));
	const char *t = getenv("TMPDIR");

	assert_non_null(fx);
	if (!t || !*t || strlen(t) > 200)
		t = "/tmp";
	snprintf(fx->tmp, sizeof(fx->tmp), "%s/ferryfs-test-journal-XXXXXX", t);
	assert_non_null(mkdtemp(fx->tmp));
	snprintf(fx->dir, sizeof(fx->dir), "%s/j", fx->tmp);
	fx->cfg.chunk_size = CS;
	fx->cfg.remote_id = RID;
	jnl_test_map_size = 0;
	jnl_test_commit_ms = 0;
	jnl_test_env_flags = 0;
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, JNL_CREATE, &fx->j));
	jnl_assert_sane(fx->j);
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fx *fx = *state;

	if (fx->j)
		jnl_assert_sane(fx->j);
	jnl_close(fx->j);
	jnl_test_map_size = 0;
	jnl_test_commit_ms = 0;
	jnl_test_env_flags = 0;
	nftw(fx->tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(fx);
	return 0;
}

/* --- open, identity, errors ------------------------------------------------ */

static void test_journal__create_then_reopen(void **state)
{
	struct fx *fx = *state;
	struct jnl_node root;
	struct jnl_config other = fx->cfg;
	uint64_t ident = jnl_ident(fx->j);
	char dir2[300];
	struct jnl *j2;
	jnl_id id;
	bool wh;

	assert_int_equal(jnl_chunk_size(fx->j), CS);
	/* the journal's name: fixed at creation, another journal's differs */
	assert_true(ident != 0);
	snprintf(dir2, sizeof(dir2), "%s/j2", fx->tmp);
	assert_rc_ok(jnl_open(dir2, &fx->cfg, JNL_CREATE, &j2));
	assert_true(jnl_ident(j2) != ident);
	jnl_close(j2);
	assert_rc_ok(jnl_node_get(fx->j, JNL_ROOT, &root));
	assert_true(S_ISDIR(root.mode));
	assert_false(root.flags & JNL_NODE_LOCAL);
	assert_rpath(fx->j, JNL_ROOT, "");
	mk_dir(fx->j, JNL_ROOT, "kept");
	reopen(fx);
	assert_true(jnl_ident(fx->j) == ident);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "kept", &id, &wh));
	assert_int_equal(id, JNL_ROOT + 1);
	/* the stored chunk size wins over the configured one */
	jnl_close(fx->j);
	other.chunk_size = 1u << 20;
	assert_rc_ok(jnl_open(fx->dir, &other, JNL_CREATE, &fx->j));
	assert_int_equal(jnl_chunk_size(fx->j), CS);
}

static void test_journal__missing_journal_is_enoent(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 16];
	struct jnl *j = (struct jnl *)1;

	snprintf(path, sizeof(path), "%s/none", fx->tmp);
	assert_rc_err(jnl_open(path, &fx->cfg, 0, &j), ENOENT);
	assert_null(j);
	assert_non_null(strstr(jnl_errmsg(), "none"));
	assert_int_equal(mkdir(path, 0700), 0);
	assert_rc_err(jnl_open(path, &fx->cfg, 0, &j), ENOENT);
	assert_non_null(strstr(jnl_errmsg(), "no journal"));
}

static void test_journal__create_refuses_foreign_dir(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 16], file[PATH_MAX + 32];
	struct jnl *j;
	int fd;

	snprintf(path, sizeof(path), "%s/home", fx->tmp);
	snprintf(file, sizeof(file), "%s/notes.txt", path);
	assert_int_equal(mkdir(path, 0700), 0);
	fd = open(file, O_WRONLY | O_CREAT, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_rc_err(jnl_open(path, &fx->cfg, JNL_CREATE, &j), ENOTEMPTY);
	assert_int_equal(access(file, F_OK), 0);
}

static void test_journal__bad_config_is_einval(void **state)
{
	struct fx *fx = *state;
	struct jnl_config c = fx->cfg;
	struct jnl *j;

	c.chunk_size = 100000;
	assert_rc_err(jnl_open(fx->dir, &c, 0, &j), EINVAL);
	c.chunk_size = 1u << 12;
	assert_rc_err(jnl_open(fx->dir, &c, 0, &j), EINVAL);
	c = fx->cfg;
	c.remote_id = "";
	assert_rc_err(jnl_open(fx->dir, &c, 0, &j), EINVAL);
}

static void test_journal__other_remote_is_exdev(void **state)
{
	struct fx *fx = *state;
	struct jnl_config other = fx->cfg;
	struct jnl *j = NULL;

	jnl_close(fx->j);
	fx->j = NULL;
	other.remote_id = "nfs://nas/other";
	assert_rc_err(jnl_open(fx->dir, &other, JNL_CREATE, &j), EXDEV);
	assert_null(j);
	assert_non_null(strstr(jnl_errmsg(), RID));
	assert_non_null(strstr(jnl_errmsg(), "nfs://nas/other"));
	assert_null(strchr(jnl_errmsg(), '\n'));
	reopen(fx);
}

static void test_journal__second_opener_is_ebusy(void **state)
{
	struct fx *fx = *state;
	pid_t pid = fork();
	int status;

	assert_true(pid >= 0);
	if (pid == 0) {
		struct jnl *j;
		int rc;

		/* the child's own open file description: flock conflicts */
		rc = jnl_open(fx->dir, &fx->cfg, 0, &j);
		_exit(rc == -EBUSY ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

static void write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), len);
	assert_int_equal(close(fd), 0);
}

static void test_journal__garbage_lmdb_is_eproto(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 32];
	unsigned char *junk = malloc(256 << 10);
	struct jnl *j = NULL;

	assert_non_null(junk);
	jnl_close(fx->j);
	fx->j = NULL;
	snprintf(path, sizeof(path), "%s/meta.mdb/data.mdb", fx->dir);

	pattern(junk, 256 << 10, 7); /* a full-size file of noise */
	write_file(path, junk, 256 << 10);
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, JNL_CREATE, &j), EPROTO);
	assert_null(j);
	assert_non_null(strstr(jnl_errmsg(), "corrupted"));

	write_file(path, "this is not lmdb\n", 17); /* a short one */
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, 0, &j), EPROTO);

	/* meta.mdb itself a file */
	snprintf(path, sizeof(path), "%s/meta.mdb/data.mdb", fx->dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/meta.mdb/lock.mdb", fx->dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/meta.mdb", fx->dir);
	assert_int_equal(rmdir(path), 0);
	write_file(path, junk, 4096);
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, JNL_CREATE, &j), EPROTO);
	assert_non_null(strstr(jnl_errmsg(), "meta.mdb"));
	free(junk);
}

/* A journal whose LMDB file was emptied (what a crash of its disk can
 * leave), cut short, or whose parts disagree, is refused with the reason,
 * and nothing of it is touched: before, an empty data.mdb silently began
 * a new journal and the pending, fsynced data was gone (issue 36, bug 3),
 * its staging file left under an id the next node was given again. */
static void test_journal__damaged_journal_is_refused(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 32], sp[PATH_MAX + 32];
	struct stat st;
	struct jnl *j = NULL;
	jnl_id f;

	f = mk_file(fx->j, JNL_ROOT, "f");
	write_pattern(fx->j, f, 0, 3 * CS, 1);
	assert_rc_ok(jnl_sync(fx->j));
	jnl_close(fx->j);
	fx->j = NULL;
	snprintf(path, sizeof(path), "%s/meta.mdb/data.mdb", fx->dir);
	snprintf(sp, sizeof(sp), "%s/data/%" PRIu64, fx->dir, f);
	assert_int_equal(stat(path, &st), 0);

	/* cut short: the pages its records need are not there */
	assert_int_equal(truncate(path, st.st_size / 2), 0);
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, JNL_CREATE, &j), EPROTO);
	assert_null(j);
	assert_non_null(strstr(jnl_errmsg(), "damaged"));

	/* emptied */
	assert_int_equal(truncate(path, 0), 0);
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, JNL_CREATE, &j), EPROTO);
	assert_null(j);
	assert_non_null(strstr(jnl_errmsg(), "holds no journal"));
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, 0, &j), EPROTO);
	assert_int_equal(stat(sp, &st), 0); /* its data is still there */
	assert_int_equal(st.st_size, 3 * CS);
}

static void test_journal__parts_that_disagree_are_refused(void **state)
{
	struct fx *fx = *state;
	char sp[PATH_MAX + 32], foreign[PATH_MAX + 32];
	struct jnl *j = NULL;
	jnl_id f;

	f = mk_file(fx->j, JNL_ROOT, "f");
	write_pattern(fx->j, f, 0, CS, 2);
	assert_rc_ok(jnl_sync(fx->j));
	jnl_close(fx->j);
	fx->j = NULL;
	snprintf(sp, sizeof(sp), "%s/data/%" PRIu64, fx->dir, f);
	snprintf(foreign, sizeof(foreign), "%s/data/%" PRIu64, fx->dir,
		 f + 10 * (uint64_t)65536);

	/* a staging file with an id the journal never handed out (an LMDB
	 * file older than its staging files) */
	write_file(foreign, "old", 3);
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, 0, &j), EPROTO);
	assert_non_null(strstr(jnl_errmsg(), "never handed out"));
	assert_int_equal(unlink(foreign), 0);

	/* a node's data whose staging file is gone */
	snprintf(foreign, sizeof(foreign), "%s/moved", fx->tmp);
	assert_int_equal(rename(sp, foreign), 0);
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, 0, &j), EPROTO);
	assert_non_null(strstr(jnl_errmsg(), "is gone"));
	assert_int_equal(rename(foreign, sp), 0);

	/* an orphan of a batch a crash lost (an id above next_id, within
	 * the gap) is harmless: the journal opens */
	snprintf(foreign, sizeof(foreign), "%s/data/%" PRIu64, fx->dir, f + 7);
	write_file(foreign, "lost", 4);
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	jnl_assert_sane(fx->j);
}

/* A creation killed before its first commit leaves DIR/creating: the
 * next open makes the journal; without that mark the same empty
 * environment is refused (above). */
static void test_journal__creation_cut_short_resumes(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 32];

	jnl_close(fx->j);
	fx->j = NULL;
	snprintf(path, sizeof(path), "%s/creating", fx->dir);
	assert_int_equal(access(path, F_OK), -1); /* gone once made */
	write_file(path, "", 0);
	snprintf(path, sizeof(path), "%s/meta.mdb/data.mdb", fx->dir);
	assert_int_equal(truncate(path, 0), 0);
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, JNL_CREATE, &fx->j));
	jnl_assert_sane(fx->j);
	snprintf(path, sizeof(path), "%s/creating", fx->dir);
	assert_int_equal(access(path, F_OK), -1);
}

/* Rewrite the meta record of a closed journal with @edit applied. */
static void edit_meta(struct fx *fx, void (*edit)(struct jnl_meta_rec *))
{
	char path[PATH_MAX + 16];
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = { 4, "meta" }, v;
	struct jnl_meta_rec m;

	snprintf(path, sizeof(path), "%s/meta.mdb", fx->dir);
	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
	assert_int_equal(mdb_env_open(env, path, 0, 0600), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
	assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
	memcpy(&m, v.mv_data, sizeof(m));
	edit(&m);
	v.mv_size = sizeof(m);
	v.mv_data = &m;
	assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
}

static void format_2(struct jnl_meta_rec *m)
{
	m->format = 2;
}

static void swap_magic(struct jnl_meta_rec *m)
{
	m->magic = __builtin_bswap32(m->magic);
}

static void test_journal__foreign_format_is_eproto(void **state)
{
	struct fx *fx = *state;
	struct jnl *j;

	jnl_close(fx->j);
	fx->j = NULL;
	edit_meta(fx, format_2);
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, 0, &j), EPROTO);
	assert_non_null(strstr(jnl_errmsg(), "format 2"));
	edit_meta(fx, swap_magic);
	assert_rc_err(jnl_open(fx->dir, &fx->cfg, 0, &j), EPROTO);
}

static void test_journal__map_full_is_enospc(void **state)
{
	struct fx *fx = *state;
	char name[64];
	int i, rc = 0;
	jnl_id id;
	bool wh;

	jnl_close(fx->j);
	fx->j = NULL;
	nftw(fx->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	jnl_test_map_size = 512 << 10; /* 128 pages, 32 kept in reserve */
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, JNL_CREATE, &fx->j));
	for (i = 0; i < 100000; i++) {
		struct jnl_node a = attr(S_IFREG | 0600);

		snprintf(name, sizeof(name), "file-with-a-long-name-%06d", i);
		rc = jnl_create(fx->j, JNL_ROOT, name, &a, &id);
		if (rc)
			break;
	}
	assert_rc_err(rc, ENOSPC);
	assert_true(i > 10);
	/* the failing call changed nothing; the journal is not FAILED */
	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, name, &id, &wh), ENOENT);
	assert_false(wh);
	snprintf(name, sizeof(name), "file-with-a-long-name-%06d", i - 1);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, name, &id, &wh));
	assert_int_equal(nops(fx->j), (uint64_t)i);
	jnl_assert_sane(fx->j);
	/* the reserve lets the flusher drain it: acking frees room again */
	ack_everything(fx->j);
	assert_rc_ok(jnl_create(fx->j, JNL_ROOT, "after",
				&(struct jnl_node){ .mode = 0600 }, &id));
}

/* Every record of every database, as one byte string (for equality). */
static unsigned char *lmdb_dump(struct jnl *j, size_t *len)
{
	MDB_dbi dbis[] = { j->db_meta,     j->db_nodes,   j->db_dentries,
			   j->db_chunks,   j->db_dirtyq,  j->db_inflight,
			   j->db_ops,      j->db_imports, j->db_folds };
	unsigned char *buf = NULL;
	size_t cap = 0;
	MDB_txn *txn;

	*len = 0;
	assert_rc_ok(jnl_rtx_begin(j, &txn));
	for (size_t i = 0; i < sizeof(dbis) / sizeof(dbis[0]); i++) {
		MDB_cursor *c;
		MDB_val k, v;
		int rc;

		assert_int_equal(mdb_cursor_open(txn, dbis[i], &c), 0);
		for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc;
		     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
			size_t need = *len + 2 * sizeof(size_t) + k.mv_size +
				      v.mv_size + 1;

			if (need > cap) {
				cap = need * 2;
				buf = realloc(buf, cap);
				assert_non_null(buf);
			}
			buf[(*len)++] = (unsigned char)i;
			memcpy(buf + *len, &k.mv_size, sizeof(size_t));
			*len += sizeof(size_t);
			memcpy(buf + *len, &v.mv_size, sizeof(size_t));
			*len += sizeof(size_t);
			memcpy(buf + *len, k.mv_data, k.mv_size);
			*len += k.mv_size;
			memcpy(buf + *len, v.mv_data, v.mv_size);
			*len += v.mv_size;
		}
		assert_int_equal(rc, MDB_NOTFOUND);
		mdb_cursor_close(c);
	}
	jnl_rtx_end(j);
	return buf;
}

/* Step @i of test_journal__failed_change_is_undone: one journal call. */
static int undo_step(struct jnl *j, int i)
{
	static char data[3 * CS];
	static uint64_t seq;
	struct jnl_node a = attr(S_IFREG | 0644);
	struct jnl_op op;
	jnl_id d, f, id;
	bool wh;
	int rc;

	switch (i) {
	case 0:
		a = attr(0755);
		return jnl_mkdir(j, JNL_ROOT, "d", &a, &id);
	case 1:
		rc = jnl_lookup(j, JNL_ROOT, "d", &d, &wh);
		return rc ? rc : jnl_create(j, d, "f", &a, &id);
	case 2:
		return jnl_create(j, JNL_ROOT, "g", &a, &id);
	case 3: /* marks: the group commit's change */
		rc = jnl_lookup(j, JNL_ROOT, "g", &f, &wh);
		if (!rc)
			rc = jnl_write(j, f, data, sizeof(data), 0) < 0;
		return rc ? -EIO : jnl_sync(j);
	case 4: /* a truncate drops chunks */
		rc = jnl_lookup(j, JNL_ROOT, "g", &f, &wh);
		a.size = CS / 2;
		return rc ? rc : jnl_setattr(j, f, JNL_SET_SIZE, &a);
	case 5:
		rc = jnl_lookup(j, JNL_ROOT, "g", &f, &wh);
		return rc ? rc : jnl_link(j, f, JNL_ROOT, "g2");
	case 6:
		return jnl_symlink(j, JNL_ROOT, "s", "d/f", &a, &id);
	case 7: /* over a file: the target goes */
		rc = jnl_lookup(j, JNL_ROOT, "d", &d, &wh);
		return rc ? rc : jnl_rename(j, d, "f", JNL_ROOT, "g2", 0);
	case 8: /* a symlink and a directory */
		return jnl_rename(j, JNL_ROOT, "s", JNL_ROOT, "d",
				  RENAME_EXCHANGE);
	case 9:
		return jnl_unlink(j, JNL_ROOT, "g");
	case 10: /* an op handed out stays so until it is acked */
		if (!seq) {
			rc = jnl_ops_ready(j, &op, 1);
			if (rc <= 0)
				return rc ? rc : -ENODATA;
			seq = op.seq;
		}
		rc = jnl_op_ack(j, seq);
		if (!rc)
			seq = 0;
		return rc;
	case 11:
		return jnl_rename(j, JNL_ROOT, "d", JNL_ROOT, "e", 0);
	}
	return -ENODATA;
}

/* A change that fails at any of its writes changed nothing (the undo log,
 * journal.c "BATCHES"); the journal goes on. */
static void test_journal__failed_change_is_undone(void **state)
{
	struct fx *fx = *state;
	int fails = 0;

	for (int i = 0; i < 12; i++) {
		for (unsigned int n = 1;; n++) {
			unsigned char *before, *after;
			size_t blen, alen;
			int rc;

			assert_rc_ok(jnl_sync(fx->j));
			before = lmdb_dump(fx->j, &blen);
			jnl_test_fail_write = n;
			rc = undo_step(fx->j, i);
			if (!jnl_test_fail_write) { /* the n-th write failed */
				assert_rc_err(rc, ENOSPC);
				assert_int_equal(jnl_failed(fx->j), 0);
				after = lmdb_dump(fx->j, &alen);
				assert_int_equal(alen, blen);
				assert_memory_equal(after, before, blen);
				free(after);
				jnl_assert_sane(fx->j);
				fails++;
			}
			jnl_test_fail_write = 0;
			free(before);
			if (!rc)
				break; /* fewer than n writes: done */
			if (n >= 1000)
				print_message("step %d: %d\n", i, rc);
			assert_true(n < 1000);
		}
		jnl_assert_sane(fx->j);
	}
	assert_true(fails > 30);
	print_message("failed_change_is_undone: %d failed changes undone\n",
		      fails);
}

static void test_journal__lmdb_errors_map_to_errno(void **state)
{
	(void)state;
	assert_int_equal(jnl_err_from_mdb(MDB_SUCCESS), 0);
	assert_rc_err(jnl_err_from_mdb(MDB_NOTFOUND), ENOENT);
	assert_rc_err(jnl_err_from_mdb(MDB_MAP_FULL), ENOSPC);
	assert_rc_err(jnl_err_from_mdb(MDB_TXN_FULL), ENOSPC);
	assert_rc_err(jnl_err_from_mdb(EACCES), EACCES);
	assert_rc_err(jnl_err_from_mdb(MDB_CORRUPTED), EIO);
	assert_rc_err(jnl_err_from_mdb(MDB_PANIC), EIO);
}

static void test_journal__max_bytes_is_enospc(void **state)
{
	struct fx *fx = *state;
	static unsigned char x[CS];
	jnl_id f;

	double t0, t1;

	jnl_close(fx->j);
	fx->cfg.max_bytes = 3 * CS;
	fx->cfg.write_wait_ms = 50; /* no flusher: the wait times out */
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	f = mk_file(fx->j, JNL_ROOT, "f");
	write_pattern(fx->j, f, 0, 2 * CS, 1);
	write_pattern(fx->j, f, 2 * CS, CS / 2, 2);
	t0 = now_s();
	assert_rc_err(jnl_write(fx->j, f, x, CS, 2 * CS + CS / 2), ENOSPC);
	t1 = now_s();
	assert_true(t1 - t0 >= 0.045);
	assert_rc_err(jnl_write(fx->j, f, x, CS, 5 * CS), ENOSPC);
	assert_int_equal(stats(fx->j).write_waits, 2);
	/* more than max_bytes in one write can never fit: no wait */
	{
		unsigned char *big = calloc(1, 4 * CS);

		assert_non_null(big);
		t0 = now_s();
		assert_rc_err(jnl_write(fx->j, f, big, 4 * CS, 10 * CS),
			      ENOSPC);
		assert_true(now_s() - t0 < 0.045);
		free(big);
	}
	/* rewriting what is held adds nothing */
	write_pattern(fx->j, f, 0, CS, 3);
	write_pattern(fx->j, f, 2 * CS, CS / 2, 4);
	assert_int_equal(stats(fx->j).staging_bytes, 2 * CS + CS / 2);
	write_pattern(fx->j, f, 2 * CS + CS / 2, CS / 2, 5);
	assert_rc_err(jnl_write(fx->j, f, x, 1, 3 * CS), ENOSPC);
	/* truncation gives the room back */
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_SIZE,
				 &(struct jnl_node){ .size = CS }));
	write_pattern(fx->j, f, CS, 2 * CS, 6);
	jnl_assert_sane(fx->j);
}

static void test_journal__eio_is_sticky(void **state)
{
	struct fx *fx = *state;
	unsigned char kb[8];
	MDB_val k = { 8, kb }, v = { 3, "bad" };
	struct jnl_node n;
	struct jnl_wtx w;
	jnl_id f, id;
	bool wh;

	f = mk_file(fx->j, JNL_ROOT, "f");
	assert_rc_ok(jnl_wtx_begin(fx->j, &w, false));
	jnl_be64_put(kb, f);
	assert_int_equal(mdb_put(w.txn, fx->j->db_nodes, &k, &v, 0), 0);
	assert_rc_ok(jnl_wtx_commit(&w));

	assert_rc_err(jnl_node_get(fx->j, f, &n), EIO);
	assert_rc_err(jnl_node_get(fx->j, JNL_ROOT, &n), EIO);
	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, "f", &id, &wh), EIO);
	assert_rc_err(jnl_write(fx->j, JNL_ROOT, "x", 1, 0), EIO);
	assert_rc_err(jnl_sync(fx->j), EIO);
	assert_rc_err(jnl_chunk_claim(fx->j, NULL, 1), EIO);
	jnl_close(fx->j);
	fx->j = NULL;
}

/* --- merged namespace ------------------------------------------------------ */

struct dents {
	int count;
	char name[16][NAME_MAX + 1];
	jnl_id id[16];
};

static int collect(const char *name, jnl_id id, void *arg)
{
	struct dents *d = arg;

	if (d->count == 16)
		return -E2BIG;
	snprintf(d->name[d->count], sizeof(d->name[0]), "%s", name);
	d->id[d->count++] = id;
	return 0;
}

static void test_journal__lookup_import_and_whiteout(void **state)
{
	struct fx *fx = *state;
	struct dents d = { 0 };
	struct jnl_node n;
	jnl_id x, again, link2, id;
	bool wh;

	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, "x", &id, &wh), ENOENT);
	assert_false(wh); /* unknown: ask the remote */
	x = import_n(fx->j, JNL_ROOT, "x", S_IFREG | 0644, 100, 5000, 2);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "x", &id, &wh));
	assert_int_equal(id, x);
	again = import_n(fx->j, JNL_ROOT, "x", S_IFREG | 0644, 100, 5000, 2);
	assert_int_equal(again, x);
	/* the same remote file under another name: one node */
	link2 = import_n(fx->j, JNL_ROOT, "x-link", S_IFREG | 0644, 100, 5000,
			 2);
	assert_int_equal(link2, x);
	assert_rc_ok(jnl_node_get(fx->j, x, &n));
	assert_false(n.flags & JNL_NODE_LOCAL);
	assert_int_equal(n.size, 5000);
	assert_int_equal(n.base_ino, 100);
	assert_rpath(fx->j, x, "x");
	assert_int_equal(nops(fx->j), 0); /* importing is not a change */

	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "x"));
	jnl_assert_sane(fx->j);
	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, "x", &id, &wh), ENOENT);
	assert_true(wh);
	assert_rc_err(jnl_unlink(fx->j, JNL_ROOT, "x"), ENOENT);
	assert_rc_err(jnl_node_import(fx->j, JNL_ROOT, "x",
				      &(struct stat){ .st_mode = S_IFREG },
				      &id),
		      ENOENT);
	assert_rc_ok(jnl_readdir(fx->j, JNL_ROOT, collect, &d));
	assert_int_equal(d.count, 2);
	assert_string_equal(d.name[0], "x");
	assert_int_equal(d.id[0], 0);
	assert_string_equal(d.name[1], "x-link");
	assert_int_equal(d.id[1], x);

	/* a create over the whiteout */
	id = mk_file(fx->j, JNL_ROOT, "x");
	assert_true(id != x);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "x", &again, &wh));
	assert_int_equal(again, id);
	assert_rc_err(jnl_readdir(fx->j, x, collect, &d), ENOTDIR);
}

static void test_journal__names_are_checked(void **state)
{
	struct fx *fx = *state;
	struct jnl_node a = attr(0644);
	char longname[NAME_MAX + 2];
	jnl_id id;

	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	assert_rc_err(jnl_create(fx->j, JNL_ROOT, "a/b", &a, &id), EINVAL);
	assert_rc_err(jnl_create(fx->j, JNL_ROOT, "..", &a, &id), EINVAL);
	assert_rc_err(jnl_create(fx->j, JNL_ROOT, "", &a, &id), EINVAL);
	assert_rc_err(jnl_create(fx->j, JNL_ROOT, longname, &a, &id),
		      ENAMETOOLONG);
	assert_rc_err(jnl_create(fx->j, 999, "f", &a, &id), ENOENT);
	id = mk_file(fx->j, JNL_ROOT, "f");
	assert_rc_err(jnl_create(fx->j, id, "g", &a, &id), ENOTDIR);
	assert_rc_err(jnl_create(fx->j, JNL_ROOT, "f", &a, &id), EEXIST);
	assert_int_equal(nops(fx->j), 1);
}

static void test_journal__create_link_symlink_setattr(void **state)
{
	struct fx *fx = *state;
	struct jnl_node n, a = attr(0640);
	char buf[64];
	jnl_id d, f, s;

	d = mk_dir(fx->j, JNL_ROOT, "d");
	f = mk_file(fx->j, d, "f");
	assert_rc_ok(jnl_node_get(fx->j, f, &n));
	assert_true(S_ISREG(n.mode));
	assert_int_equal(n.mode & 07777, 0644);
	assert_true(n.flags & JNL_NODE_LOCAL);
	assert_int_equal(n.nlink, 1);
	assert_int_equal(n.uid, 1000);
	assert_rc_err(jnl_node_rpath(fx->j, f, buf, sizeof(buf)), ENOENT);

	assert_rc_ok(jnl_link(fx->j, f, JNL_ROOT, "f2"));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_node_get(fx->j, f, &n));
	assert_int_equal(n.nlink, 2);
	assert_rc_err(jnl_link(fx->j, d, JNL_ROOT, "d2"), EPERM);

	assert_rc_ok(jnl_symlink(fx->j, d, "s", "../target", &a, &s));
	jnl_assert_sane(fx->j);
	assert_int_equal(jnl_readlink(fx->j, s, buf, sizeof(buf)), 9);
	assert_string_equal(buf, "../target");
	assert_rc_err(jnl_readlink(fx->j, s, buf, 9), ERANGE);
	assert_rc_err(jnl_readlink(fx->j, f, buf, sizeof(buf)), EINVAL);
	assert_rc_ok(jnl_node_get(fx->j, s, &n));
	assert_true(S_ISLNK(n.mode));

	a.mode = 0600;
	a.uid = 7;
	a.mtime.tv_sec = 1234567890;
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_MODE | JNL_SET_UID |
				 JNL_SET_MTIME, &a));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_node_get(fx->j, f, &n));
	assert_int_equal(n.mode, S_IFREG | 0600);
	assert_int_equal(n.uid, 7);
	assert_int_equal(n.mtime.tv_sec, 1234567890);
	assert_true(n.flags & JNL_NODE_TIMES_SET);
	assert_rc_err(jnl_setattr(fx->j, d, JNL_SET_SIZE, &a), EISDIR);
	/* mkdir, create, link, symlink, setattr */
	assert_int_equal(nops(fx->j), 5);
}

/* After a link and the unlink of the first name, the node is at the new
 * name on the remote (its data and later ops go there). */
static void test_journal__link_ack_moves_the_remote_name(void **state)
{
	struct fx *fx = *state;
	struct jnl_node n;
	jnl_id f;

	f = mk_file(fx->j, JNL_ROOT, "h1");
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rpath(fx->j, f, "h1");
	assert_rc_ok(jnl_link(fx->j, f, JNL_ROOT, "h2"));
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "h1"));
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rpath(fx->j, f, "h2");
	assert_rc_ok(jnl_node_get(fx->j, f, &n));
	assert_int_equal(n.nlink, 1);
	assert_false(n.flags & JNL_NODE_UNLINKED);
	jnl_assert_sane(fx->j);
}

/* --- remote paths in use: jnl_names_hold() against moves ------------------ */

struct names_side {
	struct jnl *j;
	bool mover;
	int *order;  /* atomic: entries so far */
	int entered; /* order number at entry; 0 = not yet */
};

static void names_enter(struct jnl *j, bool mover)
{
	if (mover)
		jnl_names_move_begin(j);
	else
		jnl_names_hold(j);
}

static void names_leave(struct jnl *j, bool mover)
{
	if (mover)
		jnl_names_move_end(j);
	else
		jnl_names_release(j);
}

static void *names_side_run(void *arg)
{
	struct names_side *x = arg;

	names_enter(x->j, x->mover);
	x->entered = __atomic_add_fetch(x->order, 1, __ATOMIC_SEQ_CST);
	names_leave(x->j, x->mover);
	return NULL;
}

static void names_side_start(struct names_side *x, pthread_t *t)
{
	assert_int_equal(pthread_create(t, NULL, names_side_run, x), 0);
	usleep(50 * 1000); /* it is waiting now (or never will) */
}

/*
 * Two of one side (movers or holders) inside: one of the other side comes
 * and waits until both left, and one more of the first side, come after
 * it, waits behind it. What is seen while they wait is asserted once every
 * thread is out (an assert would leave them blocked).
 */
static void names_turns(struct jnl *j, bool movers_in)
{
	int order = 0, early;
	struct names_side other = { j, !movers_in, &order, 0 },
			  same = { j, movers_in, &order, 0 };
	pthread_t t1, t2;

	names_enter(j, movers_in);
	names_enter(j, movers_in);
	names_side_start(&other, &t1);
	early = __atomic_load_n(&other.entered, __ATOMIC_SEQ_CST);
	names_side_start(&same, &t2);
	early += __atomic_load_n(&same.entered, __ATOMIC_SEQ_CST);
	names_leave(j, movers_in);
	usleep(50 * 1000);
	early += __atomic_load_n(&other.entered, __ATOMIC_SEQ_CST);
	names_leave(j, movers_in);
	assert_int_equal(pthread_join(t1, NULL), 0);
	assert_int_equal(pthread_join(t2, NULL), 0);
	assert_int_equal(early, 0);
	assert_int_equal(other.entered, 1);
	assert_int_equal(same.entered, 2);
}

/*
 * A path resolved and used under jnl_names_hold() is never used while the
 * flusher moves names (jnl_names_move_begin()), and neither side starves
 * the other: a waiter keeps newcomers of the side inside out.
 */
static void test_journal__names_holders_and_movers_alternate(void **state)
{
	struct fx *fx = *state;
	struct names_side m = { fx->j, true, NULL, 0 };
	pthread_t t;
	int order = 0;

	names_turns(fx->j, false);
	/* the turn to the movers (a mover waited for a holder), so that
	 * the holder below must take it back */
	m.order = &order;
	jnl_names_hold(fx->j);
	names_side_start(&m, &t);
	jnl_names_release(fx->j);
	assert_int_equal(pthread_join(t, NULL), 0);
	names_turns(fx->j, true);
}

/* The unlink of the newest name while an older one remains: the node goes
 * back to a name the remote has, acked link or not, and a name another
 * pending op makes is not taken for one the remote has. */
static void test_journal__unlink_of_newest_link_keeps_older_name(void **state)
{
	struct fx *fx = *state;
	struct jnl_node n;
	jnl_id f, g;

	f = mk_file(fx->j, JNL_ROOT, "k1");
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	/* link acked, then its name removed */
	assert_rc_ok(jnl_link(fx->j, f, JNL_ROOT, "k2"));
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rpath(fx->j, f, "k2");
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "k2"));
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rpath(fx->j, f, "k1");
	/* link and unlink acked together */
	assert_rc_ok(jnl_link(fx->j, f, JNL_ROOT, "k3"));
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "k3"));
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rpath(fx->j, f, "k1");
	assert_rc_ok(jnl_node_get(fx->j, f, &n));
	assert_int_equal(n.nlink, 1);
	assert_false(n.flags & JNL_NODE_UNLINKED);
	/* the only other name is one a pending rename makes: the remote has
	 * the rename's source; the node is placed when the rename is acked */
	g = mk_file(fx->j, JNL_ROOT, "m1");
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rc_ok(jnl_link(fx->j, g, JNL_ROOT, "m2"));
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "m2"));
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "m1", JNL_ROOT, "m3", 0));
	assert_rc_ok(jnl_sync(fx->j));
	ack_only(fx->j, JNL_OP_UNLINK);
	assert_int_equal(jnl_node_rpath(fx->j, g, (char[64]){ 0 }, 64),
			 -ENOENT);
	ack_everything(fx->j);
	assert_rpath(fx->j, g, "m3");
	jnl_assert_sane(fx->j);
}

/* A rename over the newest link of a file: its older name is where the
 * remote has it now, as after an unlink of that link (crash checker:
 * [link A/f B/f; rename A/g B/f] left A/f listed in the mount and not
 * found by a lookup, placed nowhere). */
static void test_journal__rename_over_a_link_keeps_older_name(void **state)
{
	struct fx *fx = *state;
	struct jnl_node n;
	jnl_id f, g;

	f = mk_file(fx->j, JNL_ROOT, "r1");
	g = mk_file(fx->j, JNL_ROOT, "r2");
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rc_ok(jnl_link(fx->j, f, JNL_ROOT, "r3"));
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rpath(fx->j, f, "r3");
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "r2", JNL_ROOT, "r3", 0));
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rpath(fx->j, g, "r3");
	assert_rpath(fx->j, f, "r1");
	assert_rc_ok(jnl_node_get(fx->j, f, &n));
	assert_int_equal(n.nlink, 1);
	assert_false(n.flags & JNL_NODE_UNLINKED);
	jnl_assert_sane(fx->j);
}

/* Another writer changed a flushed file: the journal takes its attributes;
 * with changes pending it keeps its own. */
static void test_journal__refresh_only_when_nothing_pending(void **state)
{
	struct fx *fx = *state;
	struct jnl_node n;
	struct stat st;
	jnl_id f;

	f = mk_file(fx->j, JNL_ROOT, "f");
	memset(&st, 0, sizeof(st));
	st.st_mode = S_IFREG | 0600;
	st.st_size = 99;
	st.st_mtim.tv_sec = 1500000000;
	st.st_nlink = 1;
	/* its create is pending */
	assert_rc_err(jnl_node_refresh(fx->j, f, &st), EBUSY);
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j);
	assert_rc_ok(jnl_node_refresh(fx->j, f, &st));
	assert_rc_ok(jnl_node_get(fx->j, f, &n));
	assert_int_equal(n.size, 99);
	assert_int_equal(n.mode, S_IFREG | 0600);
	assert_int_equal(n.mtime.tv_sec, 1500000000);
	jnl_assert_sane(fx->j);
	/* another type at the name: not this node */
	st.st_mode = S_IFDIR | 0755;
	assert_rc_err(jnl_node_refresh(fx->j, f, &st), ESTALE);
	/* a write pending: the journal's version stands */
	st.st_mode = S_IFREG | 0644;
	assert_int_equal(jnl_write(fx->j, f, "x", 1, 0), -ENODATA);
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_SIZE, &(struct jnl_node){ .size = 0 }));
	assert_rc_err(jnl_node_refresh(fx->j, f, &st), EBUSY);
	jnl_assert_sane(fx->j);
}

static void test_journal__rmdir_and_unlink_rules(void **state)
{
	struct fx *fx = *state;
	jnl_id d, e, id;
	bool wh;

	d = import(fx->j, JNL_ROOT, "d", S_IFDIR | 0755, 10, 0);
	e = mk_dir(fx->j, d, "e");
	mk_file(fx->j, e, "f");
	assert_rc_err(jnl_rmdir(fx->j, d, "e"), ENOTEMPTY);
	assert_rc_err(jnl_unlink(fx->j, d, "e"), EISDIR);
	assert_rc_err(jnl_rmdir(fx->j, e, "f"), ENOTDIR);
	ack_everything(fx->j);
	assert_rc_ok(jnl_unlink(fx->j, e, "f"));
	jnl_assert_sane(fx->j);
	/* e is on the remote now (acked): its removed names are whiteouts */
	assert_rc_err(jnl_lookup(fx->j, e, "f", &id, &wh), ENOENT);
	assert_true(wh);
	assert_rc_ok(jnl_rmdir(fx->j, d, "e"));
	jnl_assert_sane(fx->j);
	assert_rc_err(jnl_lookup(fx->j, d, "e", &id, &wh), ENOENT);
	assert_true(wh);
	assert_rc_err(jnl_create(fx->j, e, "g", &(struct jnl_node){ 0 }, &id),
		      ENOENT); /* e is gone */
}

/* jnl_name_case_taken(): another live name that differs only in case
 * (Unicode's simple mapping), kept through renames, unlinks, whiteouts, a
 * reopen, and rebuilt for a journal made before the index ("folds.u"
 * missing; the ASCII-only "folds" of an older version dropped) */
static void test_journal__case_taken(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX];
	jnl_id c, d, sub;
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;

	c = mk_file(fx->j, JNL_ROOT, "Case");
	sub = mk_dir(fx->j, JNL_ROOT, "sub");
	assert_rc_err(jnl_name_case_taken(fx->j, JNL_ROOT, "case", 0), EEXIST);
	assert_rc_err(jnl_name_case_taken(fx->j, JNL_ROOT, "CASE", 0), EEXIST);
	assert_rc_ok(jnl_name_case_taken(fx->j, JNL_ROOT, "Case", 0));
	assert_rc_ok(jnl_name_case_taken(fx->j, JNL_ROOT, "case", c));
	assert_rc_ok(jnl_name_case_taken(fx->j, JNL_ROOT, "cases", 0));
	assert_rc_ok(jnl_name_case_taken(fx->j, sub, "case", 0));
	/* letters beyond ASCII: "Été" against "été", "ÉTÉ" */
	d = mk_file(fx->j, JNL_ROOT, "\xc3\x89t\xc3\xa9");
	assert_rc_err(jnl_name_case_taken(fx->j, JNL_ROOT, "\xc3\xa9t\xc3\xa9", 0),
		      EEXIST);
	assert_rc_err(jnl_name_case_taken(fx->j, JNL_ROOT, "\xc3\x89T\xc3\x89", 0),
		      EEXIST);
	assert_rc_ok(jnl_name_case_taken(fx->j, JNL_ROOT, "\xc3\xa9t\xc3\xa9", d));
	assert_rc_ok(jnl_name_case_taken(fx->j, JNL_ROOT, "ete", 0));
	/* Greek omega, final and plain sigma (both are capital sigma) */
	mk_file(fx->j, JNL_ROOT, "\xcf\x89\xcf\x82");
	assert_rc_err(jnl_name_case_taken(fx->j, JNL_ROOT, "\xce\xa9\xcf\x83", 0),
		      EEXIST);
	/* bytes that are not UTF-8 are compared as they are */
	mk_file(fx->j, JNL_ROOT, "x\xffy");
	assert_rc_err(jnl_name_case_taken(fx->j, JNL_ROOT, "X\xffY", 0), EEXIST);
	assert_rc_ok(jnl_name_case_taken(fx->j, JNL_ROOT, "x\xfey", 0));
	/* a longest name whose upper case is longer: 85 x U+0250 (2 bytes)
	 * folds to 85 x U+2C6F (3 bytes each: 255, NAME_MAX) */
	{
		char lo[NAME_MAX + 1] = "", up[NAME_MAX + 1] = "";

		for (int i = 0; i < 85; i++) {
			strcat(lo, "\xc9\x90");
			strcat(up, "\xe2\xb1\xaf");
		}
		mk_file(fx->j, sub, lo);
		jnl_assert_sane(fx->j);
		assert_rc_err(jnl_name_case_taken(fx->j, sub, up, 0), EEXIST);
		assert_rc_ok(jnl_unlink(fx->j, sub, lo));
		assert_rc_ok(jnl_name_case_taken(fx->j, sub, up, 0));
	}

	/* a rename moves it */
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "Case", sub, "Moved", 0));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_name_case_taken(fx->j, JNL_ROOT, "case", 0));
	assert_rc_err(jnl_name_case_taken(fx->j, sub, "moved", 0), EEXIST);
	/* an unlink takes it away */
	assert_rc_ok(jnl_unlink(fx->j, sub, "Moved"));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_name_case_taken(fx->j, sub, "moved", 0));
	/* an imported name that is unlinked leaves a whiteout: not a name */
	import(fx->j, sub, "Share", S_IFREG | 0644, 20, 0);
	assert_rc_err(jnl_name_case_taken(fx->j, sub, "share", 0), EEXIST);
	assert_rc_ok(jnl_unlink(fx->j, sub, "Share"));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_name_case_taken(fx->j, sub, "share", 0));

	mk_file(fx->j, sub, "Kept");
	reopen(fx);
	assert_rc_err(jnl_name_case_taken(fx->j, sub, "kept", 0), EEXIST);

	/* a journal from before the index: built at open */
	jnl_close(fx->j);
	fx->j = NULL;
	snprintf(path, sizeof(path), "%s/meta.mdb", fx->dir);
	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
	assert_int_equal(mdb_env_open(env, path, MDB_NOLOCK, 0600), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "folds.u", MDB_DUPSORT, &dbi), 0);
	assert_int_equal(mdb_drop(txn, dbi, 1), 0);
	assert_int_equal(mdb_dbi_open(txn, "folds", MDB_DUPSORT | MDB_CREATE,
				      &dbi), 0);
	assert_int_equal(mdb_put(txn, dbi, &(MDB_val){ 4, "old!" },
				 &(MDB_val){ 3, "old" }, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	jnl_assert_sane(fx->j);
	assert_rc_err(jnl_name_case_taken(fx->j, sub, "KEPT", 0), EEXIST);
	assert_rc_err(jnl_name_case_taken(fx->j, JNL_ROOT, "\xc3\xa9T\xc3\xa9", 0),
		      EEXIST);
	/* the old index is gone */
	jnl_close(fx->j);
	fx->j = NULL;
	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
	assert_int_equal(mdb_env_open(env, path, MDB_NOLOCK | MDB_RDONLY, 0600),
			 0);
	assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "folds", MDB_DUPSORT, &dbi),
			 MDB_NOTFOUND);
	mdb_txn_abort(txn);
	mdb_env_close(env);
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
}

static void test_journal__rename_rules(void **state)
{
	struct fx *fx = *state;
	struct jnl_node n;
	jnl_id a, b, sub, f, g, id;
	bool wh;

	a = import(fx->j, JNL_ROOT, "a", S_IFDIR | 0755, 10, 0);
	b = mk_dir(fx->j, JNL_ROOT, "b");
	sub = mk_dir(fx->j, a, "sub");
	f = mk_file(fx->j, a, "f");
	g = mk_file(fx->j, b, "g");

	assert_rc_err(jnl_rename(fx->j, JNL_ROOT, "a", sub, "a", 0), EINVAL);
	assert_rc_err(jnl_rename(fx->j, JNL_ROOT, "a", a, "x", 0), EINVAL);
	assert_rc_err(jnl_rename(fx->j, a, "f", b, "g", RENAME_NOREPLACE),
		      EEXIST);
	assert_rc_err(jnl_rename(fx->j, a, "f", JNL_ROOT, "b", 0), EISDIR);
	assert_rc_err(jnl_rename(fx->j, a, "sub", b, "g", 0), ENOTDIR);
	assert_rc_err(jnl_rename(fx->j, JNL_ROOT, "a", JNL_ROOT, "b", 0),
		      ENOTEMPTY);
	assert_rc_err(jnl_rename(fx->j, a, "nope", b, "x", 0), ENOENT);
	assert_rc_err(jnl_rename(fx->j, a, "f", b, "zz", RENAME_EXCHANGE),
		      ENOENT);
	assert_rc_err(jnl_rename(fx->j, a, "f", b, "g",
				 RENAME_EXCHANGE | RENAME_NOREPLACE),
		      EINVAL);
	assert_rc_ok(jnl_rename(fx->j, a, "f", a, "f", 0)); /* itself */
	jnl_assert_sane(fx->j);

	/* over an existing file: g loses its only name */
	assert_rc_ok(jnl_rename(fx->j, a, "f", b, "g", 0));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_lookup(fx->j, b, "g", &id, &wh));
	assert_int_equal(id, f);
	assert_rc_err(jnl_lookup(fx->j, a, "f", &id, &wh), ENOENT);
	assert_true(wh); /* a is imported: the remote may still have f */
	assert_rc_ok(jnl_node_get(fx->j, g, &n));
	assert_true(n.flags & JNL_NODE_UNLINKED);
	assert_int_equal(n.nlink, 0);

	/* a directory moves, nlink follows */
	assert_rc_ok(jnl_rename(fx->j, a, "sub", b, "sub", 0));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_node_get(fx->j, b, &n));
	assert_int_equal(n.nlink, 3);
	/* b is LOCAL, but the rename into it will put sub there on the
	 * remote until this one moves it on: a whiteout hides it meanwhile */
	assert_rc_ok(jnl_rename(fx->j, b, "sub", a, "sub2", 0));
	assert_rc_err(jnl_lookup(fx->j, b, "sub", &id, &wh), ENOENT);
	assert_true(wh);

	/* exchange a file and a directory */
	assert_rc_ok(jnl_rename(fx->j, b, "g", a, "sub2", RENAME_EXCHANGE));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_lookup(fx->j, b, "g", &id, &wh));
	assert_int_equal(id, sub);
	assert_rc_ok(jnl_lookup(fx->j, a, "sub2", &id, &wh));
	assert_int_equal(id, f);
}

static void test_journal__unlink_cancels_pending_create(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	struct jnl_node n;
	jnl_id f, d, x, id;
	bool wh;

	/* create + unlink: neither reaches the remote */
	f = mk_file(fx->j, JNL_ROOT, "tmp");
	write_pattern(fx->j, f, 0, 100, 1);
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "tmp"));
	jnl_assert_sane(fx->j);
	assert_int_equal(nops(fx->j), 0);
	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, "tmp", &id, &wh), ENOENT);
	assert_false(wh);
	assert_rc_ok(jnl_node_get(fx->j, f, &n)); /* kept for open handles */
	assert_true(n.flags & JNL_NODE_UNLINKED);

	/* mkdir + rmdir too */
	d = mk_dir(fx->j, JNL_ROOT, "d");
	assert_rc_ok(jnl_rmdir(fx->j, JNL_ROOT, "d"));
	assert_int_equal(nops(fx->j), 0);
	(void)d;

	/* over a whiteout whose unlink is pending: the whiteout comes back */
	x = import(fx->j, JNL_ROOT, "x", S_IFREG | 0644, 77, 10);
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "x"));
	mk_file(fx->j, JNL_ROOT, "x");
	assert_int_equal(nops(fx->j), 2);
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "x"));
	jnl_assert_sane(fx->j);
	assert_int_equal(nops(fx->j), 1);
	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, "x", &id, &wh), ENOENT);
	assert_true(wh);
	/* acking the unlink drops the whiteout: the remote has no x now */
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 1);
	assert_int_equal(ops[0].type, JNL_OP_UNLINK);
	assert_int_equal(ops[0].id, x);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	jnl_assert_sane(fx->j);
	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, "x", &id, &wh), ENOENT);
	assert_false(wh);

	/* a create already handed out is not cancelled */
	f = mk_file(fx->j, JNL_ROOT, "busy");
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 1);
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "busy"));
	jnl_assert_sane(fx->j);
	assert_int_equal(nops(fx->j), 2);
	/* and a renamed one is not either (its rename op names it) */
	f = mk_file(fx->j, JNL_ROOT, "r1");
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "r1", JNL_ROOT, "r2", 0));
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "r2"));
	jnl_assert_sane(fx->j);
	assert_int_equal(nops(fx->j), 5);
}

/* --- data ------------------------------------------------------------------- */

static void test_journal__write_read_local(void **state)
{
	struct fx *fx = *state;
	unsigned char *buf = malloc(4 * CS), *want = malloc(4 * CS);
	bool have[5];
	jnl_id f;

	assert_non_null(buf);
	assert_non_null(want);
	f = mk_file(fx->j, JNL_ROOT, "f");
	write_pattern(fx->j, f, CS + 10, 100, 3);
	assert_int_equal(node_size(fx->j, f), CS + 110); /* before commit */
	memset(have, 0, sizeof(have));
	memset(buf, 0xee, 4 * CS);
	assert_int_equal(jnl_read(fx->j, f, buf, 4 * CS, 0, have), CS + 110);
	memset(want, 0, CS + 10);
	pattern(want + CS + 10, 100, 3);
	assert_memory_equal(buf, want, CS + 110);
	for (int i = 0; i < 4; i++)
		assert_true(have[i]); /* LOCAL: the journal has everything */
	assert_int_equal(jnl_read(fx->j, f, buf, 10, CS + 110, have), 0);
	assert_int_equal(jnl_read(fx->j, f, buf, 10, 5 * CS, NULL), 0);
	/* a hole past the staging file but inside the size */
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_SIZE,
				 &(struct jnl_node){ .size = 3 * CS }));
	memset(buf, 0xee, 4 * CS);
	assert_int_equal(jnl_read(fx->j, f, buf, 4 * CS, 0, NULL), 3 * CS);
	memset(want + CS + 110, 0, 2 * CS - 110);
	assert_memory_equal(buf, want, 3 * CS);
	assert_rc_err(jnl_read(fx->j, JNL_ROOT, buf, 1, 0, NULL), EISDIR);
	assert_rc_err(jnl_write(fx->j, JNL_ROOT, buf, 1, 0), EISDIR);
	assert_rc_err(jnl_write(fx->j, 9999, buf, 1, 0), ENOENT);
	assert_rc_err(jnl_write(fx->j, f, buf, 1, -1), EINVAL);
	jnl_assert_sane(fx->j);
	free(buf);
	free(want);
}

static void test_journal__imported_partial_write_needs_fill(void **state)
{
	struct fx *fx = *state;
	uint64_t size = 3 * CS + 100;
	unsigned char *remote = malloc(4 * CS), *buf = malloc(4 * CS);
	bool have[4];
	jnl_id f;

	assert_non_null(remote);
	assert_non_null(buf);
	pattern(remote, size, 9); /* what the remote file holds */
	f = import(fx->j, JNL_ROOT, "big", S_IFREG | 0644, 55, (off_t)size);

	assert_rc_err(jnl_write(fx->j, f, "hello", 5, 10), ENODATA);
	assert_rc_err(jnl_write(fx->j, f, buf, CS, CS / 2), ENODATA);
	assert_rc_ok(jnl_chunk_fill(fx->j, f, 0, remote, CS));
	assert_rc_ok(jnl_chunk_fill(fx->j, f, 0, buf, CS)); /* held: no-op */
	jnl_assert_sane(fx->j);
	assert_int_equal(jnl_write(fx->j, f, "hello", 5, 10), 5);
	memcpy(remote + 10, "hello", 5);
	/* a write covering a whole chunk needs no fill */
	pattern(buf, CS, 4);
	assert_int_equal(jnl_write(fx->j, f, buf, CS, 2 * CS), CS);
	memcpy(remote + 2 * CS, buf, CS);
	jnl_assert_sane(fx->j);

	memset(have, 0, sizeof(have));
	assert_int_equal(jnl_read(fx->j, f, buf, 4 * CS, 0, have), size);
	assert_true(have[0]);
	assert_false(have[1]); /* the remote has it */
	assert_true(have[2]);
	assert_false(have[3]); /* 100 remote bytes in it */
	assert_memory_equal(buf, remote, 15);
	assert_memory_equal(buf + 2 * CS, remote + 2 * CS, CS);

	/* appending past the remote's bytes in the last chunk needs them */
	assert_rc_err(jnl_write(fx->j, f, "tail", 4, (off_t)size), ENODATA);
	assert_rc_ok(jnl_chunk_fill(fx->j, f, 3, remote + 3 * CS, 100));
	assert_int_equal(jnl_write(fx->j, f, "tail", 4, (off_t)size), 4);
	assert_int_equal(node_size(fx->j, f), size + 4);
	/* the filled chunk was FLUSHED, the write made it DIRTY */
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(chunk_state(fx->j, f, 3, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), 0);

	/* after a truncation to 0 no remote byte belongs to the file */
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_SIZE,
				 &(struct jnl_node){ .size = 0 }));
	assert_int_equal(jnl_write(fx->j, f, "x", 1, CS + 5), 1);
	assert_int_equal(jnl_read(fx->j, f, buf, 2 * CS, 0, have), CS + 6);
	assert_true(have[0] && have[1]);
	jnl_assert_sane(fx->j);
	free(remote);
	free(buf);
}

/* Create f at the root, write @chunks full chunks, ack the create (so
 * its chunks are claimable), commit. */
static jnl_id flushable_file(struct fx *fx, const char *name, int chunks)
{
	jnl_id f = mk_file(fx->j, JNL_ROOT, name);

	for (int i = 0; i < chunks; i++)
		write_pattern(fx->j, f, (off_t)i * CS, CS, (unsigned)i);
	ack_everything(fx->j);
	assert_rc_ok(jnl_sync(fx->j));
	return f;
}

static const unsigned char sha[32] = { 1, 2, 3 };

/* A kill between a file's FINISH ack and the flusher's clean leaves its
 * flushed staging held: the sweep after the next open cleans it, and
 * only it. */
static void test_journal__sweep_after_open_cleans_flushed_nodes(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c[8];
	jnl_id f[3], keep;
	int n, i;

	for (i = 0; i < 3; i++) {
		char name[8];

		snprintf(name, sizeof(name), "f%d", i);
		f[i] = flushable_file(fx, name, 2);
	}
	n = jnl_chunk_claim(fx->j, c, 8);
	assert_int_equal(n, 6);
	for (i = 0; i < n; i++)
		assert_rc_ok(jnl_chunk_release(fx->j, &c[i], true, sha));
	assert_rc_ok(jnl_sync(fx->j));
	ack_everything(fx->j); /* the FINISHes: no jnl_node_clean() */
	keep = flushable_file(fx, "pending", 1); /* DIRTY: stays */
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(stats(fx->j).staging_bytes, 7 * CS);
	assert_int_equal(chunk_state(fx->j, f[1], 0, NULL),
			 JNL_CHUNK_FLUSHED);

	reopen(fx);
	for (i = 0; i < 100 && stats(fx->j).staging_bytes != CS; i++)
		usleep(20 * 1000); /* stats() syncs: the staging goes */
	print_message("sweep: staging %" PRIu64 " bytes after %d ms\n",
		      stats(fx->j).staging_bytes, i * 20);
	assert_int_equal(stats(fx->j).staging_bytes, CS);
	for (i = 0; i < 3; i++)
		assert_int_equal(chunk_state(fx->j, f[i], 0, NULL), 0);
	assert_int_equal(chunk_state(fx->j, keep, 0, NULL), JNL_CHUNK_DIRTY);
	jnl_assert_sane(fx->j);
}

static void test_journal__chunk_state_machine(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c[8];
	struct jnl_chunk_rec rec;
	struct jnl_stats s;
	uint64_t gen0;
	jnl_id f, g;

	/* a LOCAL node's chunks wait for its create */
	f = mk_file(fx->j, JNL_ROOT, "f");
	write_pattern(fx->j, f, 0, 2 * CS, 1);
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(chunk_state(fx->j, f, 0, &rec), JNL_CHUNK_DIRTY);
	gen0 = rec.generation;
	assert_int_equal(jnl_chunk_claim(fx->j, c, 8), 0);
	s = stats(fx->j);
	assert_int_equal(s.dirty_bytes, 2 * CS);
	assert_int_equal(s.dirty_nodes, 1);
	ack_everything(fx->j);

	/* DIRTY -> INFLIGHT, oldest first */
	g = flushable_file(fx, "g", 1);
	assert_int_equal(jnl_chunk_claim(fx->j, c, 2), 2);
	jnl_assert_sane(fx->j);
	assert_int_equal(c[0].id, f);
	assert_int_equal(c[0].index, 0);
	assert_int_equal(c[0].generation, gen0);
	assert_int_equal(c[0].length, CS);
	assert_int_equal(c[1].id, f);
	assert_int_equal(c[1].index, 1);
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_INFLIGHT);
	s = stats(fx->j);
	assert_int_equal(s.inflight_bytes, 2 * CS);
	assert_int_equal(s.dirty_bytes, CS);

	/* INFLIGHT -> FLUSHED (ok, same generation) */
	assert_rc_ok(jnl_chunk_release(fx->j, &c[0], true, sha));
	jnl_assert_sane(fx->j);
	assert_int_equal(chunk_state(fx->j, f, 0, &rec), JNL_CHUNK_FLUSHED);
	assert_memory_equal(rec.sha256, sha, 32);
	/* INFLIGHT -> DIRTY (not ok), keeping its place: first again */
	assert_rc_ok(jnl_chunk_release(fx->j, &c[1], false, NULL));
	jnl_assert_sane(fx->j);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(jnl_chunk_claim(fx->j, c, 8), 2);
	assert_int_equal(c[0].id, f);
	assert_int_equal(c[0].index, 1);
	assert_int_equal(c[1].id, g);
	assert_rc_ok(jnl_chunk_release(fx->j, &c[0], true, sha));
	assert_rc_ok(jnl_chunk_release(fx->j, &c[1], true, sha));
	s = stats(fx->j);
	assert_int_equal(s.flushed_bytes, 3 * CS);
	assert_int_equal(s.dirty_bytes + s.inflight_bytes, 0);
	assert_int_equal(s.dirty_nodes, 0);
	assert_rc_err(jnl_chunk_release(fx->j, &c[1], true, NULL), EINVAL);

	/* FLUSHED -> DIRTY by a write, with a new generation */
	write_pattern(fx->j, f, 100, 10, 2);
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(chunk_state(fx->j, f, 0, &rec), JNL_CHUNK_DIRTY);
	assert_true(rec.generation > gen0);
	assert_int_equal(stats(fx->j).dirty_nodes, 1);
	/* a release of a chunk not in flight changes nothing */
	assert_rc_ok(jnl_chunk_release(fx->j, &c[0], true, sha));
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_FLUSHED);
	jnl_assert_sane(fx->j);
}

/* Reopen the journal with a commit period that never ends in a test:
 * only a hurry commits. */
static void endless_period(struct fx *fx)
{
	jnl_close(fx->j);
	jnl_test_commit_ms = 600000;
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
}

static void test_journal__hungry_commits_a_filled_chunk(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c;
	jnl_id f;
	int n = 0;

	endless_period(fx);
	f = flushable_file(fx, "f", 0);
	/* the flusher is busy: a filled chunk waits for the period */
	write_pattern(fx->j, f, 0, CS, 1);
	usleep(200000);
	assert_int_equal(jnl_chunk_claim(fx->j, &c, 1), 0);
	/* hungry: a write that fills no chunk does not hurry */
	jnl_hungry(fx->j);
	write_pattern(fx->j, f, CS, CS / 2, 2);
	usleep(200000);
	assert_int_equal(jnl_chunk_claim(fx->j, &c, 1), 0);
	/* the write that fills one commits both at once */
	write_pattern(fx->j, f, CS + CS / 2, CS / 2, 3);
	for (int i = 0; i < 500 && n == 0; i++) {
		n = jnl_chunk_claim(fx->j, &c, 1);
		if (n == 0)
			usleep(10000);
	}
	assert_int_equal(n, 1);
	assert_int_equal(c.id, f);
	assert_int_equal(c.index, 0);
	assert_rc_ok(jnl_chunk_release(fx->j, &c, false, NULL));
}

/* The flusher's own work (the FINISH the release of a file's last chunk
 * appends) is committed once the flusher is hungry, not a period later. */
static void test_journal__hungry_commits_the_flushers_own_work(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c;
	struct jnl_op ops[8];
	jnl_id f;

	endless_period(fx);
	f = flushable_file(fx, "f", 1);
	assert_int_equal(jnl_chunk_claim(fx->j, &c, 1), 1);
	assert_rc_ok(jnl_chunk_release(fx->j, &c, true, sha));
	/* its FINISH is in the batch, not durable: not handed out */
	usleep(50000);
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 0);
	jnl_hungry(fx->j);
	assert_int_equal(ready_within(fx->j, ops, 8, 500), 1);
	assert_int_equal(ops[0].type, JNL_OP_FINISH);
	assert_int_equal(ops[0].id, f);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	jnl_assert_sane(fx->j);
}

/* An ack the flusher's next op waits for (invariant 18) is committed
 * JNL_HUNGRY_GAP_MS after the last commit when the flusher ran dry
 * sooner than that, not a period later: with a 100 ms period that wait
 * made 10,000 small files flush 12% slower. */
static void test_journal__hungry_soon_after_a_commit_hurries(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	jnl_id a;

	endless_period(fx);
	a = mk_file(fx->j, JNL_ROOT, "a");
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "a", JNL_ROOT, "b", 0));
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 1);
	assert_int_equal(ops[0].type, JNL_OP_CREATE);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	/* dry within the gap of jnl_sync()'s commit */
	jnl_hungry(fx->j);
	assert_int_equal(ready_within(fx->j, ops, 8, 300), 1);
	assert_int_equal(ops[0].type, JNL_OP_RENAME);
	assert_int_equal(ops[0].id, a);
	jnl_assert_sane(fx->j);
}

static void test_journal__write_while_inflight_stays_dirty(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c, c2;
	struct jnl_chunk_rec rec;
	jnl_id f;

	f = flushable_file(fx, "f", 1);
	assert_int_equal(jnl_chunk_claim(fx->j, &c, 1), 1);
	/* the generation race: a write lands while the chunk is in flight */
	write_pattern(fx->j, f, 5, 5, 2);
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(chunk_state(fx->j, f, 0, &rec), JNL_CHUNK_INFLIGHT);
	assert_true(rec.generation != c.generation);
	/* still this flusher's claim: it sends, the release sees the write */
	assert_rc_ok(jnl_chunk_claimed(fx->j, &c));
	assert_int_equal(jnl_chunk_claim(fx->j, &c2, 1), 0); /* one flusher */
	assert_rc_ok(jnl_chunk_release(fx->j, &c, true, sha));
	jnl_assert_sane(fx->j);
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(jnl_chunk_claim(fx->j, &c2, 1), 1);
	assert_int_equal(c2.generation, rec.generation);
	assert_rc_ok(jnl_chunk_release(fx->j, &c2, true, sha));
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_FLUSHED);

	/* the same race with the write's mark not committed at the release:
	 * FLUSHED for a moment, DIRTY again once the mark commits */
	write_pattern(fx->j, f, 0, 1, 3);
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(jnl_chunk_claim(fx->j, &c, 1), 1);
	write_pattern(fx->j, f, 1, 1, 4);
	assert_rc_ok(jnl_chunk_release(fx->j, &c, true, sha));
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_DIRTY);
	jnl_assert_sane(fx->j);
}

static void test_journal__truncate_drops_chunks(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c[4];
	struct jnl_chunk_rec rec;
	struct jnl_stats s;
	jnl_id f;

	f = flushable_file(fx, "f", 3);
	assert_int_equal(jnl_chunk_claim(fx->j, c, 4), 3);
	write_pattern(fx->j, f, 4 * CS, 10, 5); /* a pending mark past it */
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_SIZE,
				 &(struct jnl_node){ .size = CS + CS / 2 }));
	jnl_assert_sane(fx->j);
	assert_int_equal(node_size(fx->j, f), CS + CS / 2);
	assert_int_equal(chunk_state(fx->j, f, 2, NULL), 0);
	assert_int_equal(chunk_state(fx->j, f, 4, NULL), 0);
	assert_int_equal(chunk_state(fx->j, f, 1, &rec), JNL_CHUNK_INFLIGHT);
	assert_int_equal(rec.length, CS / 2);
	/* the release of the dropped chunk is stale */
	assert_rc_ok(jnl_chunk_release(fx->j, &c[2], true, sha));
	assert_rc_ok(jnl_chunk_release(fx->j, &c[0], true, sha));
	assert_rc_ok(jnl_chunk_release(fx->j, &c[1], true, sha));
	s = stats(fx->j);
	assert_int_equal(s.flushed_bytes, CS + CS / 2);
	assert_int_equal(s.staging_bytes, CS + CS / 2);
	assert_int_equal(s.dirty_bytes + s.inflight_bytes, 0);
	jnl_assert_sane(fx->j);
}

static void test_journal__unlinked_node_is_not_claimed(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c;
	jnl_id f;

	f = flushable_file(fx, "f", 1);
	assert_rc_ok(jnl_node_open(fx->j, f));
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "f"));
	jnl_assert_sane(fx->j);
	assert_int_equal(jnl_chunk_claim(fx->j, &c, 1), 0);
	write_pattern(fx->j, f, CS, 10, 1); /* an open handle still writes */
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(jnl_chunk_claim(fx->j, &c, 1), 0);
	jnl_assert_sane(fx->j);
	jnl_node_close(fx->j, f);
}

/* The u64 set and count (one probing and deletion for both) against a
 * plain array, through growth and deletions inside probe runs. */
static void test_journal__u64_set_and_count(void **state)
{
	enum { N = 3000 };
	static uint32_t ref[N];
	static bool in[N];
	struct jnl_u64count c = { 0 };
	struct jnl_u64set s = { 0 };
	uint64_t x = 88172645463325252ull;

	(void)state;
	memset(ref, 0, sizeof(ref));
	memset(in, 0, sizeof(in));
	for (int step = 0; step < 40000; step++) {
		uint64_t k;

		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		k = x % N; /* 0 too: the set keeps it apart, the count not */
		if ((x >> 20) % 3) {
			assert_int_equal(jnl_u64set_add(&s, k), 0);
			in[k] = true;
			assert_int_equal(jnl_u64count_add(&c, k, 1),
					 k ? ++ref[k] : 0);
		} else {
			jnl_u64set_del(&s, k);
			in[k] = false;
			assert_int_equal(jnl_u64count_add(&c, k, -1),
					 k && ref[k] ? --ref[k] : 0);
		}
		if (step % 997 == 0)
			for (uint64_t i = 0; i < N; i++) {
				assert_int_equal(jnl_u64set_has(&s, i), in[i]);
				assert_int_equal(jnl_u64count_get(&c, i),
						 i ? ref[i] : 0);
			}
	}
	jnl_u64set_free(&s);
	jnl_u64count_free(&c);
}

/* poll (2 s at most) until the journal holds no chunk and no staging
 * byte; the ms it took, or -1 */
static int wait_no_data(struct jnl *j)
{
	for (int i = 0; i < 100; i++) {
		struct jnl_stats s = stats(j);

		if (!s.dirty_bytes && !s.inflight_bytes && !s.flushed_bytes &&
		    !s.staging_bytes)
			return i * 20;
		usleep(20 * 1000);
	}
	return -1;
}

/* An unlinked file's data goes nowhere: the journal drops it, but not
 * while a handle is open (the application reads it still) nor a chunk
 * in a stream's hands; a kill that left one is swept after the open. */
static void test_journal__unlinked_node_data_goes_once_closed(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c;
	char buf[10];
	bool have[1];
	jnl_id f, g;
	int ms;

	f = flushable_file(fx, "f", 2);
	assert_rc_ok(jnl_node_open(fx->j, f));
	assert_rc_ok(jnl_node_open(fx->j, f)); /* two handles */
	assert_int_equal(jnl_chunk_claim(fx->j, &c, 1), 1);
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "f"));
	write_pattern(fx->j, f, 2 * CS, 10, 7); /* a mark still pending */
	usleep(300 * 1000);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(jnl_read(fx->j, f, buf, sizeof(buf), 2 * CS, have),
			 (ssize_t)sizeof(buf));
	assert_true(have[0]);
	jnl_node_close(fx->j, f);
	usleep(300 * 1000); /* one handle left */
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	jnl_node_close(fx->j, f);
	usleep(300 * 1000); /* chunk 0 is a stream's: all stays */
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_INFLIGHT);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_chunk_release(fx->j, &c, true, sha));
	ms = wait_no_data(fx->j);
	print_message("unlinked: data gone %d ms after the release\n", ms);
	assert_true(ms >= 0);
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), 0);
	assert_int_equal(chunk_state(fx->j, f, 2, NULL), 0);
	jnl_assert_sane(fx->j);

	/* a kill with a handle open: the sweep after the open drops it */
	g = flushable_file(fx, "g", 1);
	assert_rc_ok(jnl_node_open(fx->j, g));
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "g"));
	usleep(300 * 1000);
	assert_int_equal(chunk_state(fx->j, g, 0, NULL), JNL_CHUNK_DIRTY);
	reopen(fx);
	assert_true(wait_no_data(fx->j) >= 0);
	jnl_assert_sane(fx->j);
}

/* --- durability and recovery ------------------------------------------------- */

static void test_journal__recovery_resends_only_inflight(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c[4];
	struct jnl_stats s;
	jnl_id f;

	f = flushable_file(fx, "f", 3);
	assert_int_equal(jnl_chunk_claim(fx->j, c, 3), 3);
	assert_rc_ok(jnl_chunk_release(fx->j, &c[0], true, sha));
	/* c[1], c[2] in flight: stop without releasing them */
	reopen(fx);
	s = stats(fx->j);
	assert_int_equal(s.resent_bytes, 2 * CS);
	assert_int_equal(s.inflight_bytes, 0);
	assert_int_equal(s.dirty_bytes, 2 * CS);
	assert_int_equal(s.flushed_bytes, CS);
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_FLUSHED);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	/* the old claims are stale; the chunks are claimable again */
	assert_rc_ok(jnl_chunk_release(fx->j, &c[1], true, sha));
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(jnl_chunk_claim(fx->j, c, 4), 2);
	assert_int_equal(c[0].index, 1);
	assert_int_equal(c[1].index, 2);
	reopen(fx);
	assert_int_equal(stats(fx->j).resent_bytes, 2 * CS);
}

/* In a child: open, do @fn, _exit() without jnl_close(). */
static void crash_child(struct fx *fx, unsigned int commit_ms,
			int (*fn)(struct jnl *j))
{
	pid_t pid;
	int status;

	jnl_close(fx->j);
	fx->j = NULL;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct jnl *j;
		int rc;

		jnl_test_commit_ms = commit_ms;
		rc = jnl_open(fx->dir, &fx->cfg, 0, &j);
		if (!rc)
			rc = fn(j);
		_exit(rc ? 1 : 0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	jnl_assert_sane(fx->j);
}

static int crash_after_claim(struct jnl *j)
{
	struct jnl_chunk_ref c[2];
	jnl_id f;
	bool wh;

	if (jnl_lookup(j, JNL_ROOT, "f", &f, &wh))
		return -1;
	/* as a stream does: a release is made durable by the next claim
	 * (a claim is durable before any byte of it is sent) */
	if (jnl_chunk_claim(j, &c[0], 1) != 1)
		return -1;
	if (jnl_chunk_release(j, &c[0], true, sha))
		return -1;
	if (jnl_chunk_claim(j, &c[1], 1) != 1)
		return -1;
	return 0; /* c[1] dies in flight */
}

static int crash_after_release(struct jnl *j)
{
	struct jnl_chunk_ref c[2];

	if (jnl_chunk_claim(j, c, 2) != 1) /* chunk 1 only */
		return -1;
	return jnl_chunk_release(j, &c[0], true, sha) ? -1 : 0;
}

static void test_journal__crash_with_chunks_in_flight(void **state)
{
	struct fx *fx = *state;
	struct jnl_stats s;
	jnl_id f;

	f = flushable_file(fx, "f", 2);
	crash_child(fx, 60000, crash_after_claim);
	s = stats(fx->j);
	assert_int_equal(s.resent_bytes, CS);
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_FLUSHED);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	/* a release nothing made durable is lost: the claim counts whole */
	crash_child(fx, 60000, crash_after_release);
	s = stats(fx->j);
	assert_int_equal(s.resent_bytes, CS);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
}

static int crash_mid_writes(struct jnl *j)
{
	unsigned char buf[CS];
	struct jnl_node a = attr(S_IFREG | 0644);
	jnl_id f, g;

	if (jnl_create(j, JNL_ROOT, "f", &a, &f))
		return -1;
	pattern(buf, CS, 1);
	for (int i = 0; i < 4; i++) /* many writes, one commit */
		if (jnl_write(j, f, buf + i * (CS / 4), CS / 4,
			      i * (CS / 4)) != CS / 4)
			return -1;
	if (jnl_sync(j))
		return -1;
	/* after the sync: a namespace change and writes that nobody syncs
	 * (the commit period is a minute): all lost */
	if (jnl_create(j, JNL_ROOT, "g", &a, &g))
		return -1;
	if (jnl_write(j, f, buf, CS, 2 * CS) != CS)
		return -1;
	if (jnl_write(j, g, buf, 10, 0) != 10)
		return -1;
	return 0;
}

static void test_journal__group_commit_survives_crash(void **state)
{
	struct fx *fx = *state;
	unsigned char want[CS], buf[CS];
	struct jnl_stats s;
	jnl_id f, g;
	bool wh;

	crash_child(fx, 60000, crash_mid_writes);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "f", &f, &wh));
	/* synced: f, chunk 0 and the size; not synced: chunk 2, the create
	 * of g and its data */
	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, "g", &g, &wh), ENOENT);
	assert_false(wh);
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(chunk_state(fx->j, f, 2, NULL), 0);
	assert_int_equal(node_size(fx->j, f), CS);
	s = stats(fx->j);
	assert_int_equal(s.dirty_bytes, CS);
	assert_int_equal(s.dirty_nodes, 1);
	assert_int_equal(s.pending_ops, 1);
	pattern(want, CS, 1);
	assert_int_equal(jnl_read(fx->j, f, buf, CS, 0, NULL), CS);
	assert_memory_equal(buf, want, CS);
	/* g's id is not handed out again (the crash left data/<id>): a new
	 * file does not see g's bytes */
	g = mk_file(fx->j, JNL_ROOT, "h");
	assert_true(g > f + 1);
	assert_rc_ok(jnl_setattr(fx->j, g, JNL_SET_SIZE,
				 &(struct jnl_node){ .size = 10 }));
	memset(want, 0, 10);
	assert_int_equal(jnl_read(fx->j, g, buf, 10, 0, NULL), 10);
	assert_memory_equal(buf, want, 10);
}

static void test_journal__writes_share_one_commit(void **state)
{
	struct fx *fx = *state;
	size_t before;
	jnl_id f;

	jnl_close(fx->j);
	jnl_test_commit_ms = 60000;
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	f = mk_file(fx->j, JNL_ROOT, "f");
	before = last_txnid(fx->j);
	for (int i = 0; i < 200; i++)
		write_pattern(fx->j, f, (off_t)i * 1000, 1000, (unsigned)i);
	assert_int_equal(last_txnid(fx->j), before);
	assert_rc_ok(jnl_fsync_node(fx->j, f));
	assert_int_equal(last_txnid(fx->j), before + 1);
	assert_int_equal(chunk_state(fx->j, f, 3, NULL), JNL_CHUNK_DIRTY);
	assert_rc_err(jnl_fsync_node(fx->j, 12345), ENOENT);

	/* without a sync the committer commits within its period */
	jnl_close(fx->j);
	jnl_test_commit_ms = 0; /* JNL_COMMIT_MS */
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	write_pattern(fx->j, f, 10 * CS, 10, 1);
	for (int i = 0; i < 100 && !chunk_state(fx->j, f, 10, NULL); i++)
		usleep(20000);
	assert_int_equal(chunk_state(fx->j, f, 10, NULL), JNL_CHUNK_DIRTY);
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	assert_non_null(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* A commit syncs the staging files of all its nodes, more of them than
 * the journal keeps open (JNL_FD_SLOTS): with syncfs() (more than
 * JNL_SYNC_EACH_MAX files; on an idle machine), then one by one. */
static void test_journal__commit_syncs_many_staging_files(void **state)
{
	struct fx *fx = *state;
	unsigned char want[100], buf[100];
	jnl_id f[150];
	char name[16];
	int fds;

	for (int round = 0; round < 2; round++) {
		jnl_close(fx->j);
		jnl_test_commit_ms = 60000; /* only jnl_sync() commits */
		jnl_test_sync_each = round == 1;
		assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
		for (int i = 0; i < 150; i++) {
			snprintf(name, sizeof(name), "r%d-%d", round, i);
			f[i] = mk_file(fx->j, JNL_ROOT, name);
			write_pattern(fx->j, f[i], 0, 100,
				      (unsigned)(i + round));
		}
		assert_int_equal(chunk_state(fx->j, f[149], 0, NULL), 0);
		fds = count_fds();
		assert_rc_ok(jnl_sync(fx->j));
		assert_int_equal(count_fds(), fds);
		for (int i = 0; i < 150; i++)
			assert_int_equal(chunk_state(fx->j, f[i], 0, NULL),
					 JNL_CHUNK_DIRTY);
		jnl_test_commit_ms = 0;
		jnl_test_sync_each = false;
		reopen(fx);
		for (int i = 0; i < 150; i++) {
			pattern(want, 100, (unsigned)(i + round));
			assert_int_equal(
				jnl_read(fx->j, f[i], buf, 100, 0, NULL), 100);
			assert_memory_equal(buf, want, 100);
		}
	}
}

/* Passthrough (fs/pt.c): the kernel writes the staging file itself; the
 * journal marks those bytes only when told, keeps the pinned file's mtime
 * a SETATTR gives, and marks nothing of a file it is not pinned for. */
static void test_journal__passthrough_marks_what_the_kernel_wrote(void **state)
{
	struct fx *fx = *state;

	jnl_test_commit_ms = 600000; /* no jnl_pt_grow() by the committer */
	reopen(fx);
	const size_t len = 3 * CS + 100;
	unsigned char *want = malloc(len), *buf = malloc(len);
	struct timespec mt = { 1700000000, 5 };
	struct jnl_node a = { 0 }, nd;
	jnl_id f, g;
	int fd;

	assert_non_null(want);
	assert_non_null(buf);
	f = mk_file(fx->j, JNL_ROOT, "pt");
	g = mk_file(fx->j, JNL_ROOT, "plain");
	write_pattern(fx->j, g, 0, 100, 9);
	assert_rc_ok(jnl_pt_begin(fx->j, f, &fd));
	pattern(want, len, 3);
	assert_int_equal(pwrite(fd, want, len, 0), (ssize_t)len);
	/* the journal saw nothing: the flusher's view */
	assert_int_equal(node_size(fx->j, f), 0);
	/* what the mount shows: the staging file */
	assert_rc_ok(jnl_node_get(fx->j, f, &nd));
	jnl_pt_attr(fx->j, f, &nd);
	assert_int_equal(nd.size, len);
	/* a SETATTR of its mtime reaches the staging file */
	a.mtime = mt;
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_MTIME, &a));
	jnl_pt_attr(fx->j, f, &nd);
	assert_int_equal(nd.mtime.tv_sec, mt.tv_sec);
	assert_int_equal(nd.mtime.tv_nsec, mt.tv_nsec);
	/* unpinned: nothing to mark */
	assert_rc_ok(jnl_pt_mark(fx->j, g));
	assert_int_equal(node_size(fx->j, g), 100);
	assert_rc_ok(jnl_pt_mark(fx->j, f));
	assert_rc_ok(jnl_sync(fx->j));
	for (uint64_t c = 0; c < 4; c++)
		assert_int_equal(chunk_state(fx->j, f, c, NULL),
				 JNL_CHUNK_DIRTY);
	assert_rc_ok(jnl_node_get(fx->j, f, &nd));
	assert_int_equal(nd.size, len);
	assert_int_equal(nd.mtime.tv_sec, mt.tv_sec);
	jnl_pt_end(fx->j, f);
	close(fd);
	/* no longer pinned: a mark is a no-op, the attributes the marks' */
	assert_rc_ok(jnl_pt_mark(fx->j, f));
	jnl_pt_attr(fx->j, f, &nd);
	assert_int_equal(nd.size, len);
	reopen(fx);
	assert_int_equal(jnl_read(fx->j, f, buf, len, 0, NULL), (ssize_t)len);
	assert_memory_equal(buf, want, len);
	assert_int_equal(node_size(fx->j, g), 100);
	jnl_assert_sane(fx->j);
	free(want);
	free(buf);
}

struct late_release {
	struct jnl *j;
	struct jnl_chunk_ref c;
	unsigned char sha[32];
};

static void *release_later(void *arg)
{
	struct late_release *r = arg;

	usleep(100 * 1000);
	assert_rc_ok(jnl_chunk_release(r->j, &r->c, true, r->sha));
	return NULL;
}

static bool pt_marker_exists(struct fx *fx, jnl_id id)
{
	char path[PATH_MAX];
	struct stat st;

	snprintf(path, sizeof(path), "%s/pt/%" PRIu64, fx->dir, id);
	return stat(path, &st) == 0;
}

/* A passthrough file flows while it is written: once it is pinned for
 * JNL_PT_GROW_AFTER_MS, jnl_pt_grow() marks the whole chunks it grew by. Its last mark (the close) takes none of them
 * again but the one the kernel changed after it was flushed: not a DIRTY
 * one, not an INFLIGHT one once its stream is done with it unchanged.
 * A commit but jnl_sync() does not sync its staging file; its marker goes
 * only after that sync (pt_sync_deferred()). */
static void test_journal__passthrough_grows_while_written(void **state)
{
	struct fx *fx = *state;
	const size_t len = 4 * CS + 100;
	unsigned char *want = malloc(len);
	struct jnl_chunk_rec r0, r3;
	struct jnl_chunk_ref c[8];
	struct late_release lr;
	pthread_t t;
	jnl_id f;
	int fd, n;

	assert_non_null(want);
	jnl_test_commit_ms = 600000; /* jnl_pt_grow() by hand */
	reopen(fx);
	f = mk_file(fx->j, JNL_ROOT, "grows");
	ack_everything(fx->j);
	assert_rc_ok(jnl_sync(fx->j));
	assert_rc_ok(jnl_pt_begin(fx->j, f, &fd));
	assert_true(pt_marker_exists(fx, f));
	pattern(want, len, 11);
	assert_int_equal(pwrite(fd, want, len, 0), (ssize_t)len);
	/* a file pinned for less than JNL_PT_GROW_AFTER_MS: not yet */
	jnl_pt_grow(fx->j);
	assert_rc_ok(jnl_commit_pending(fx->j, false, 0));
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), 0);
	for (unsigned int i = 0; i < fx->j->pt_npins; i++)
		if (fx->j->pt_pins[i].id == f)
			fx->j->pt_pins[i].since -=
				(int64_t)JNL_PT_GROW_AFTER_MS * 1000000;
	jnl_pt_grow(fx->j);
	assert_rc_ok(jnl_commit_pending(fx->j, false, 0));
	for (uint64_t k = 0; k < 4; k++) /* the whole chunks, not the tail */
		assert_int_equal(chunk_state(fx->j, f, k, NULL),
				 JNL_CHUNK_DIRTY);
	assert_int_equal(chunk_state(fx->j, f, 4, NULL), 0);
	jnl_pt_grow(fx->j); /* nothing new: nothing marked again */
	assert_int_equal(fx->j->pend.used, 0);

	/* chunks 0-2 to a stream; 0 and 1 arrive, 2 is still on its way */
	n = jnl_chunk_claim(fx->j, c, 3);
	assert_int_equal(n, 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(c[i].index, (uint64_t)i);
	for (int i = 0; i < 2; i++) {
		unsigned char s[32];

		EVP_Digest(want + i * CS, CS, s, NULL, EVP_sha256(), NULL);
		assert_rc_ok(jnl_chunk_release(fx->j, &c[i], true, s));
	}
	assert_rc_ok(jnl_sync(fx->j));
	chunk_state(fx->j, f, 3, &r3);
	/* the kernel changes chunk 1 after it arrived */
	want[CS + 7] ^= 0xff;
	assert_int_equal(pwrite(fd, want + CS + 7, 1, CS + 7), 1);
	lr.j = fx->j;
	lr.c = c[2];
	EVP_Digest(want + 2 * CS, CS, lr.sha, NULL, EVP_sha256(), NULL);
	assert_int_equal(pthread_create(&t, NULL, release_later, &lr), 0);
	assert_rc_ok(jnl_pt_mark(fx->j, f)); /* waits for chunk 2 */
	pthread_join(t, NULL);
	/* a grow after it (the pin older than JNL_PT_GROW_AFTER_MS, as after
	 * an fsync) marks none of what a mark took, even from 0 (CI under
	 * ASan: an fsync of nothing new sent the whole file again) */
	for (unsigned int i = 0; i < fx->j->pt_npins; i++)
		if (fx->j->pt_pins[i].id == f)
			fx->j->pt_pins[i].grown = 0;
	jnl_pt_grow(fx->j);
	jnl_pt_end(fx->j, f);
	close(fd);
	assert_rc_ok(jnl_commit_pending(fx->j, false, 0));

	assert_int_equal(chunk_state(fx->j, f, 0, &r0), JNL_CHUNK_FLUSHED);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(chunk_state(fx->j, f, 2, NULL), JNL_CHUNK_FLUSHED);
	assert_int_equal(chunk_state(fx->j, f, 3, &r0), JNL_CHUNK_DIRTY);
	assert_int_equal(r0.generation, r3.generation); /* not marked again */
	assert_int_equal(chunk_state(fx->j, f, 4, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(node_size(fx->j, f), len);
	/* the staging file is not synced yet: the marker stays, until the
	 * committer's lazy sync (JNL_PT_LAZY_NS) or the close of the
	 * journal synced it */
	assert_true(pt_marker_exists(fx, f));
	assert_rc_ok(jnl_commit(fx->j));
	assert_true(pt_marker_exists(fx, f));
	reopen(fx);
	assert_false(pt_marker_exists(fx, f));
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	jnl_assert_sane(fx->j);
	free(want);
}

/* The flusher records a chunk's SHA-256 only where passthrough compares
 * (jnl_chunk_digest_used(): pinned, or its marker still there): a chunk
 * FLUSHED without one (all zeros) is taken as changed by a mark, and sent
 * again; one with its digest is left alone. */
static void test_journal__passthrough_mark_resends_chunk_without_digest(
	void **state)
{
	struct fx *fx = *state;
	const size_t len = 2 * CS;
	unsigned char *want = malloc(len), s0[32], none[32] = { 0 };
	struct jnl_chunk_ref c[4];
	jnl_id f, g;
	int fd;

	assert_non_null(want);
	jnl_test_commit_ms = 600000; /* commits by hand */
	reopen(fx);
	f = mk_file(fx->j, JNL_ROOT, "nodigest");
	g = mk_file(fx->j, JNL_ROOT, "never-pinned");
	ack_everything(fx->j);
	assert_rc_ok(jnl_sync(fx->j));
	assert_false(jnl_chunk_digest_used(fx->j, f));
	assert_rc_ok(jnl_pt_begin(fx->j, f, &fd));
	assert_true(jnl_chunk_digest_used(fx->j, f));
	assert_false(jnl_chunk_digest_used(fx->j, g));
	pattern(want, len, 5);
	assert_int_equal(pwrite(fd, want, len, 0), (ssize_t)len);
	assert_rc_ok(jnl_pt_mark(fx->j, f));
	assert_rc_ok(jnl_commit_pending(fx->j, false, 0));
	assert_int_equal(jnl_chunk_claim(fx->j, c, 4), 2);
	EVP_Digest(want, CS, s0, NULL, EVP_sha256(), NULL);
	assert_rc_ok(jnl_chunk_release(fx->j, &c[0], true, s0));
	assert_rc_ok(jnl_chunk_release(fx->j, &c[1], true, none));
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_FLUSHED);
	/* the close: nothing changed, but chunk 1 has no digest */
	assert_rc_ok(jnl_pt_mark(fx->j, f));
	jnl_pt_end(fx->j, f);
	close(fd);
	assert_rc_ok(jnl_commit_pending(fx->j, false, 0));
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_FLUSHED);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), JNL_CHUNK_DIRTY);
	/* its marker is there until the staging file is synced */
	assert_true(pt_marker_exists(fx, f));
	assert_true(jnl_chunk_digest_used(fx->j, f));
	reopen(fx);
	assert_false(pt_marker_exists(fx, f));
	assert_false(jnl_chunk_digest_used(fx->j, f));
	jnl_assert_sane(fx->j);
	free(want);
}

/* A node cleaned while a passthrough look-up (jnl_pt_attr(), a mark) still
 * holds its staging fd: the file goes, the fd stays good until its last
 * jnl_fd_put() (this aborted: "staging fd ... in use while cleaning it"). */
static void test_journal__staging_fd_in_use_outlives_its_file(void **state)
{
	struct fx *fx = *state;
	struct jnl_chunk_ref c[4];
	struct jnl_op ops[8];
	struct stat st;
	char path[PATH_MAX];
	jnl_id f;
	int fd, n;

	f = flushable_file(fx, "f", 2);
	snprintf(path, sizeof(path), "%s/data/%" PRIu64, fx->dir, f);
	assert_int_equal(jnl_chunk_claim(fx->j, c, 4), 2);
	for (int k = 0; k < 2; k++)
		assert_rc_ok(jnl_chunk_release(fx->j, &c[k], true, sha));
	assert_rc_ok(jnl_sync(fx->j));
	n = jnl_ops_ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].type, JNL_OP_FINISH);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	assert_rc_ok(jnl_fd_get(fx->j, f, false, &fd));
	assert_rc_ok(jnl_node_clean(fx->j, f));
	assert_rc_ok(jnl_sync(fx->j)); /* the clean-up runs: data/<id> goes */
	assert_int_equal(stat(path, &st), -1);
	assert_int_equal(errno, ENOENT);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, 2 * CS);
	assert_int_equal(st.st_nlink, 0);
	assert_rc_err(jnl_fd_get(fx->j, f, false, &n), ENOENT);
	jnl_fd_put(fx->j, f, fd);
	assert_int_equal(fcntl(fd, F_GETFD), -1); /* closed by the last put */
	for (int i = 0; i < JNL_FD_SLOTS; i++)
		assert_false(fx->j->fds[i].id == f);
	jnl_assert_sane(fx->j);
}

/* --- op log ---------------------------------------------------------------------- */

static void test_journal__ops_wait_for_their_directory(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	const struct jnl_op *mk, *bg;
	jnl_id a, b, f, g;
	int n;

	b = import(fx->j, JNL_ROOT, "b", S_IFDIR | 0755, 20, 0);
	a = mk_dir(fx->j, JNL_ROOT, "a");
	f = mk_file(fx->j, a, "f");
	g = mk_file(fx->j, b, "g");
	n = jnl_ops_ready(fx->j, ops, 8);
	assert_int_equal(n, 2);
	mk = find_op(ops, n, JNL_OP_MKDIR, a);
	bg = find_op(ops, n, JNL_OP_CREATE, g);
	assert_non_null(mk);
	assert_non_null(bg);
	assert_int_equal(mk->parent, JNL_ROOT);
	assert_string_equal(mk->name, "a");
	assert_int_equal(bg->parent, b);
	assert_string_equal(bg->name, "g");
	assert_null(find_op(ops, n, JNL_OP_CREATE, f));
	/* handed out once */
	assert_int_equal(jnl_ops_ready(fx->j, ops + 2, 6), 0);
	assert_rc_ok(jnl_op_ack(fx->j, bg->seq));
	assert_int_equal(jnl_ops_ready(fx->j, ops + 2, 6), 0);
	assert_rc_ok(jnl_op_ack(fx->j, mk->seq));
	jnl_assert_sane(fx->j);
	assert_rpath(fx->j, a, "a");
	assert_rpath(fx->j, g, "b/g");
	n = jnl_ops_ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].type, JNL_OP_CREATE);
	assert_int_equal(ops[0].id, f);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	assert_rpath(fx->j, f, "a/f");
	assert_rc_err(jnl_op_ack(fx->j, ops[0].seq), ENOENT);
	jnl_assert_sane(fx->j);
}

static void test_journal__ops_after_dir_rename_wait(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	jnl_id d, x, y, other;
	int n;

	d = import(fx->j, JNL_ROOT, "d", S_IFDIR | 0755, 30, 0);
	y = mk_file(fx->j, d, "y");     /* before the rename */
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "d", JNL_ROOT, "e", 0));
	x = mk_file(fx->j, d, "x");     /* after it: e/x */
	other = mk_file(fx->j, JNL_ROOT, "other");
	n = jnl_ops_ready(fx->j, ops, 8);
	/* y first; the rename waits for y, x for the rename; other is free */
	assert_int_equal(n, 2);
	assert_non_null(find_op(ops, n, JNL_OP_CREATE, y));
	assert_non_null(find_op(ops, n, JNL_OP_CREATE, other));
	assert_rc_ok(jnl_op_ack(fx->j, find_op(ops, n, JNL_OP_CREATE, y)->seq));
	assert_rpath(fx->j, y, "d/y");
	n = ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].type, JNL_OP_RENAME);
	assert_int_equal(ops[0].parent, JNL_ROOT);
	assert_string_equal(ops[0].name, "d");
	assert_string_equal(ops[0].newname, "e");
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	assert_rpath(fx->j, d, "e");
	assert_rpath(fx->j, y, "e/y");
	n = ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].id, x);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	assert_rpath(fx->j, x, "e/x");
	jnl_assert_sane(fx->j);
}

static void test_journal__ops_exchange(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	jnl_id a, b, x, y, z;
	int n;

	a = import(fx->j, JNL_ROOT, "A", S_IFDIR | 0755, 40, 0);
	b = import(fx->j, JNL_ROOT, "B", S_IFDIR | 0755, 41, 0);
	x = mk_file(fx->j, a, "x");
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "A", JNL_ROOT, "B",
				RENAME_EXCHANGE));
	jnl_assert_sane(fx->j);
	y = mk_file(fx->j, b, "y"); /* b is now at "A" */
	z = mk_file(fx->j, JNL_ROOT, "z");
	n = jnl_ops_ready(fx->j, ops, 8);
	assert_int_equal(n, 2);
	assert_non_null(find_op(ops, n, JNL_OP_CREATE, x));
	assert_non_null(find_op(ops, n, JNL_OP_CREATE, z));
	for (int i = 0; i < n; i++)
		assert_rc_ok(jnl_op_ack(fx->j, ops[i].seq));
	n = ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].type, JNL_OP_RENAME);
	assert_int_equal(ops[0].flags, RENAME_EXCHANGE);
	assert_rpath(fx->j, x, "A/x");
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	assert_rpath(fx->j, a, "B");
	assert_rpath(fx->j, b, "A");
	assert_rpath(fx->j, x, "B/x");
	n = ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].id, y);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	assert_rpath(fx->j, y, "A/y");
	jnl_assert_sane(fx->j);
}

static void test_journal__ops_same_name_in_order(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	jnl_id x, x2, w;
	int n;

	x = import(fx->j, JNL_ROOT, "x", S_IFREG | 0644, 50, 1);
	w = import(fx->j, JNL_ROOT, "w", S_IFREG | 0644, 51, 1);
	assert_rc_ok(jnl_unlink(fx->j, JNL_ROOT, "x"));
	x2 = mk_file(fx->j, JNL_ROOT, "x");
	assert_rc_ok(jnl_setattr(fx->j, w, JNL_SET_MODE,
				 &(struct jnl_node){ .mode = 0600 }));
	/* ops are handed out once durable: not the setattr yet */
	n = jnl_ops_ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_non_null(find_op(ops, n, JNL_OP_UNLINK, x));
	assert_rc_ok(jnl_op_fail(fx->j, ops[0].seq, false));
	assert_rc_ok(jnl_sync(fx->j));
	n = jnl_ops_ready(fx->j, ops, 8);
	assert_int_equal(n, 2);
	assert_non_null(find_op(ops, n, JNL_OP_UNLINK, x));
	assert_non_null(find_op(ops, n, JNL_OP_SETATTR, w));
	assert_int_equal(find_op(ops, n, JNL_OP_SETATTR, w)->flags,
			 JNL_SET_MODE);
	assert_rc_ok(jnl_op_ack(fx->j, find_op(ops, n, JNL_OP_UNLINK, x)->seq));
	n = ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].id, x2);
	jnl_assert_sane(fx->j);
}

/* The logrotate pattern: rename a -> b, create a. The create waits for
 * the rename; once the rename is acked it may go only when that ack is
 * durable: handed out before, its effect on the remote (a new, empty a)
 * was there when a crash took the ack back, and the rename replayed over
 * it (the share's a and b both empty, the data gone; issue 36). */
static int crash_after_rename_ack(struct jnl *j)
{
	struct jnl_op ops[8];
	int n = jnl_ops_ready(j, ops, 8);

	if (n != 1 || ops[0].type != JNL_OP_RENAME)
		return -1;
	if (jnl_op_ack(j, ops[0].seq))
		return -1;
	/* the ack is in the open batch only: nothing more is ready */
	n = jnl_ops_ready(j, ops, 8);
	return n == 0 ? 0 : -1;
}

static int sync_after_rename_ack(struct jnl *j)
{
	struct jnl_op ops[8];
	int n = jnl_ops_ready(j, ops, 8);

	if (n != 1 || ops[0].type != JNL_OP_RENAME || jnl_op_ack(j, ops[0].seq))
		return -1;
	if (jnl_ops_ready(j, ops, 8) != 0 || jnl_sync(j))
		return -1;
	n = jnl_ops_ready(j, ops, 8); /* durable now: the create goes */
	if (n != 1 || ops[0].type != JNL_OP_CREATE || strcmp(ops[0].name, "a"))
		return -1;
	return 0;
}

/* Killed after the exchange's mark, with the exchange sent (or not):
 * the mark is durable and handed out again with the op. */
static int crash_after_exchange_mark(struct jnl *j)
{
	struct jnl_op ops[8];
	int n = jnl_ops_ready(j, ops, 8);

	if (n != 1 || ops[0].xino ||
	    jnl_op_exchange_mark(j, ops[0].seq, 0) != -EINVAL ||
	    jnl_op_exchange_mark(j, ops[0].seq + 1, 77) == 0)
		return -1;
	return jnl_op_exchange_mark(j, ops[0].seq, 77);
}

/* An exchange's replay after a crash between the remote's answer and the
 * ack must not swap the names back: the source's remote inode is in the
 * op, durably, before the exchange is sent (flush.c exchange_prepare()). */
static void test_journal__exchange_mark_survives_a_crash(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	jnl_id f, g;

	f = import(fx->j, JNL_ROOT, "f", S_IFREG | 0644, 60, 8);
	g = import(fx->j, JNL_ROOT, "g", S_IFREG | 0644, 61, 8);
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "f", JNL_ROOT, "g",
				RENAME_EXCHANGE));
	assert_rc_ok(jnl_sync(fx->j));
	crash_child(fx, 60000, crash_after_exchange_mark);
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 1);
	assert_int_equal(ops[0].type, JNL_OP_RENAME);
	assert_int_equal(ops[0].id, f);
	assert_int_equal(ops[0].xino, 77);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	assert_rpath(fx->j, f, "g");
	assert_rpath(fx->j, g, "f");
	jnl_assert_sane(fx->j);
}

static void test_journal__ops_wait_for_durable_acks(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	jnl_id a, a2, b;
	bool wh;
	int n;

	a = import(fx->j, JNL_ROOT, "a", S_IFREG | 0644, 60, 8);
	assert_rc_ok(jnl_rename(fx->j, JNL_ROOT, "a", JNL_ROOT, "b", 0));
	a2 = mk_file(fx->j, JNL_ROOT, "a");
	assert_rc_ok(jnl_sync(fx->j));
	/* killed after the ack, before any commit: the rename is pending
	 * again, and the create was not handed out in between */
	crash_child(fx, 60000, crash_after_rename_ack);
	assert_int_equal(nops(fx->j), 2);
	n = jnl_ops_ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].type, JNL_OP_RENAME);
	assert_int_equal(ops[0].id, a);
	assert_rc_ok(jnl_op_fail(fx->j, ops[0].seq, false));
	/* synced: the ack survives a crash, the create goes after it */
	crash_child(fx, 60000, sync_after_rename_ack);
	assert_int_equal(nops(fx->j), 1);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "b", &b, &wh));
	assert_int_equal(b, a);
	assert_rpath(fx->j, a, "b");
	n = jnl_ops_ready(fx->j, ops, 8);
	assert_int_equal(n, 1);
	assert_int_equal(ops[0].id, a2);
	jnl_assert_sane(fx->j);
}

static void test_journal__op_fail_and_reopen(void **state)
{
	struct fx *fx = *state;
	struct jnl_op ops[8];
	struct jnl_node n;
	jnl_id f, g;

	f = mk_file(fx->j, JNL_ROOT, "f");
	g = mk_file(fx->j, JNL_ROOT, "g");
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 2);
	assert_rc_err(jnl_op_fail(fx->j, 999, false), EINVAL);
	/* retried: handed out again */
	assert_rc_ok(jnl_op_fail(fx->j, ops[0].seq, false));
	assert_int_equal(jnl_ops_ready(fx->j, ops + 2, 6), 1);
	assert_int_equal(ops[2].seq, ops[0].seq);
	/* fatal: dropped, the node marked */
	assert_rc_ok(jnl_op_fail(fx->j, ops[0].seq, true));
	jnl_assert_sane(fx->j);
	assert_rc_ok(jnl_node_get(fx->j, f, &n));
	assert_true(n.flags & JNL_NODE_ERROR);
	assert_int_equal(nops(fx->j), 1);
	/* handed out, not acked, journal reopened: pending again */
	reopen(fx);
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 1);
	assert_int_equal(ops[0].id, g);
	assert_rc_err(jnl_op_ack(fx->j, ops[0].seq + 100), ENOENT);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	jnl_assert_sane(fx->j);
}

/* --- threads and scale -------------------------------------------------------- */

struct writer {
	struct jnl *j;
	jnl_id id;
	unsigned int seed;
	int rc;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	unsigned char buf[4096];

	pattern(buf, sizeof(buf), w->seed);
	for (int i = 0; i < 400 && !w->rc; i++) {
		off_t off = (off_t)((i * 7919u + w->seed * 104729u) %
				    (8 * CS - sizeof(buf)));
		ssize_t n = jnl_write(w->j, w->id, buf, sizeof(buf), off);

		if (n != (ssize_t)sizeof(buf))
			w->rc = n < 0 ? (int)n : -EIO;
	}
	return NULL;
}

static void *flusher_main(void *arg)
{
	struct writer *w = arg;
	struct jnl_chunk_ref c[4];

	for (int i = 0; i < 300 && !w->rc; i++) {
		int n = jnl_chunk_claim(w->j, c, 4);

		if (n < 0)
			w->rc = n;
		for (int k = 0; k < n && !w->rc; k++)
			w->rc = jnl_chunk_release(w->j, &c[k], k % 3 != 0, sha);
		if (!(i % 50) && !w->rc)
			w->rc = jnl_sync(w->j);
	}
	return NULL;
}

static void test_journal__concurrent_writers_and_flusher(void **state)
{
	struct fx *fx = *state;
	struct writer w[5];
	pthread_t t[5];
	jnl_id f = flushable_file(fx, "shared", 1);
	jnl_id g = flushable_file(fx, "other", 1);

	for (int i = 0; i < 5; i++) {
		w[i].j = fx->j;
		w[i].id = i % 2 ? g : f;
		w[i].seed = (unsigned)i + 1;
		w[i].rc = 0;
		assert_int_equal(pthread_create(&t[i], NULL,
						i == 4 ? flusher_main :
							 writer_main,
						&w[i]),
				 0);
	}
	for (int i = 0; i < 5; i++) {
		assert_int_equal(pthread_join(t[i], NULL), 0);
		assert_rc_ok(w[i].rc);
	}
	jnl_assert_sane(fx->j);
	assert_true(node_size(fx->j, f) <= 8 * CS);
	assert_true(node_size(fx->j, g) > CS);
}

/* A writer of an imported file that follows the fill protocol. */
struct filler {
	struct jnl *j;
	jnl_id id;
	const unsigned char *remote; /* the remote's bytes of the file */
	uint64_t rsize;
	int t, rc;
};

#define STRIPE 512

static int fill_chunk(struct filler *f, uint64_t idx)
{
	uint64_t start = idx * CS;
	size_t len = start >= f->rsize ? 0 :
		     f->rsize - start < CS ? (size_t)(f->rsize - start) : CS;

	return jnl_chunk_fill(f->j, f->id, idx, f->remote + start, len);
}

static void *filler_main(void *arg)
{
	struct filler *f = arg;
	unsigned char buf[STRIPE];
	uint64_t stripes = f->rsize / STRIPE;

	memset(buf, 'A' + f->t, sizeof(buf));
	/* thread t owns the stripes s with s % 4 == t, visited in a
	 * scrambled order, written at an offset inside the stripe */
	for (uint64_t k = 0; k < stripes / 4 && !f->rc; k++) {
		uint64_t s = ((k * 7919) % (stripes / 4)) * 4 + (uint64_t)f->t;
		off_t off = (off_t)(s * STRIPE + 100);
		ssize_t n;

		for (int tries = 0; tries < 3; tries++) {
			n = jnl_write(f->j, f->id, buf, STRIPE - 200, off);
			if (n != -ENODATA)
				break;
			f->rc = fill_chunk(f, (uint64_t)off / CS);
			if (!f->rc)
				f->rc = fill_chunk(f, ((uint64_t)off + STRIPE -
						       201) / CS);
		}
		if (!f->rc && n != STRIPE - 200)
			f->rc = n < 0 ? (int)n : -EIO;
	}
	return NULL;
}

static void test_journal__concurrent_fill_and_write(void **state)
{
	struct fx *fx = *state;
	uint64_t rsize = 4 * CS;
	unsigned char *remote = malloc(rsize), *want = malloc(rsize);
	unsigned char *got = malloc(rsize);
	struct filler f[4];
	pthread_t t[4];
	bool have[4];
	jnl_id id;

	assert_non_null(remote);
	assert_non_null(want);
	assert_non_null(got);
	pattern(remote, rsize, 11);
	id = import(fx->j, JNL_ROOT, "shared", S_IFREG | 0644, 99,
		    (off_t)rsize);
	for (int i = 0; i < 4; i++) {
		f[i] = (struct filler){ fx->j, id, remote, rsize, i, 0 };
		assert_int_equal(pthread_create(&t[i], NULL, filler_main,
						&f[i]),
				 0);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(t[i], NULL), 0);
		assert_rc_ok(f[i].rc);
	}
	jnl_assert_sane(fx->j);
	/* every byte is the remote's or the one thread that owns it wrote:
	 * no fill landed over a write, no write left zeros around it */
	memcpy(want, remote, rsize);
	for (uint64_t s = 0; s < rsize / STRIPE; s++)
		memset(want + s * STRIPE + 100, 'A' + (int)(s % 4), STRIPE - 200);
	assert_int_equal(jnl_read(fx->j, id, got, rsize, 0, have), rsize);
	for (int i = 0; i < 4; i++)
		assert_true(have[i]);
	assert_memory_equal(got, want, rsize);
	free(remote);
	free(want);
	free(got);
}

static void test_journal__open_100k_pending_nodes_is_fast(void **state)
{
	struct fx *fx = *state;
	struct jnl_node a = attr(S_IFREG | 0644);
	struct jnl_chunk_ref c[16];
	const int nbig = HEAVY(100000);
	char name[32];
	double t0, t1, t2;
	jnl_id d, id;

	/* build it without syncs (test hook); the open below is an ordinary
	 * one */
	jnl_close(fx->j);
	jnl_test_env_flags = MDB_NOSYNC;
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	t0 = now_s();
	d = mk_dir(fx->j, JNL_ROOT, "many");
	ack_everything(fx->j);
	for (int i = 0; i < nbig; i++) {
		snprintf(name, sizeof(name), "f%06d", i);
		assert_rc_ok(jnl_create(fx->j, d, name, &a, &id));
		if (i % 1000 == 0) {
			write_pattern(fx->j, id, 0, 100, (unsigned)i);
			write_pattern(fx->j, id, 2 * CS, 100, (unsigned)i);
		}
	}
	/* some chunks in flight at the stop */
	for (int i = 0; i < 16; i++) {
		struct jnl_op op;

		assert_int_equal(jnl_ops_ready(fx->j, &op, 1), 1);
		assert_rc_ok(jnl_op_ack(fx->j, op.seq));
	}
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(jnl_chunk_claim(fx->j, c, 16), 2);
	assert_int_equal(stats(fx->j).pending_ops, (uint64_t)nbig - 16);
	jnl_close(fx->j);
	fx->j = NULL;
	jnl_test_env_flags = 0;

	t1 = now_s();
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	t2 = now_s();
	print_message("created %d pending nodes in %.2f s; "
		      "jnl_open took %.1f ms\n", nbig, t1 - t0,
		      (t2 - t1) * 1e3);
	assert_true(t2 - t1 < 2.0);
	assert_int_equal(stats(fx->j).resent_bytes, 200);
	assert_int_equal(stats(fx->j).pending_ops, (uint64_t)nbig - 16);
}

/* --- group commit of namespace changes ------------------------------------ */


/* Creates in directories of 100, then as tar x does (per file a create, a
 * small write and the times set), then each followed by an fsync (what a
 * commit per change costs: the journal before batches). */
static void test_journal__creates_are_group_committed(void **state)
{
	struct fx *fx = *state;
	struct jnl_node a = attr(S_IFREG | 0644), t = attr(0);
	const int n1 = HEAVY(10000), n2 = HEAVY(2000), n3 = HEAVY(300);
	char name[32];
	double t0, t1, t2, t3, creates, files, synced;
	size_t before, after;
	jnl_id d = 0, id;
	bool wh;

	t.mtime.tv_sec = 1000000000;
	t.atime.tv_sec = 1000000000;
	before = last_txnid(fx->j);
	t0 = now_s();
	for (int i = 0; i < n1; i++) {
		if (i % 100 == 0) {
			snprintf(name, sizeof(name), "d%03d", i / 100);
			assert_rc_ok(jnl_mkdir(fx->j, JNL_ROOT, name, &a, &d));
		}
		snprintf(name, sizeof(name), "f%05d", i);
		assert_rc_ok(jnl_create(fx->j, d, name, &a, &id));
	}
	t1 = now_s();
	after = last_txnid(fx->j);
	creates = n1 / (t1 - t0);
	for (int i = 0; i < n2; i++) {
		if (i % 100 == 0) {
			snprintf(name, sizeof(name), "t%03d", i / 100);
			assert_rc_ok(jnl_mkdir(fx->j, JNL_ROOT, name, &a, &d));
		}
		snprintf(name, sizeof(name), "f%05d", i);
		assert_rc_ok(jnl_create(fx->j, d, name, &a, &id));
		write_pattern(fx->j, id, 0, 1000, (unsigned)i);
		assert_rc_ok(jnl_setattr(fx->j, id,
					 JNL_SET_ATIME | JNL_SET_MTIME, &t));
	}
	t2 = now_s();
	files = n2 / (t2 - t1);
	for (int i = 0; i < n3; i++) {
		snprintf(name, sizeof(name), "s%05d", i);
		assert_rc_ok(jnl_create(fx->j, JNL_ROOT, name, &a, &id));
		assert_rc_ok(jnl_fsync_node(fx->j, id));
	}
	t3 = now_s();
	synced = n3 / (t3 - t2);
	print_message("%d creates: %.0f creates/s (%zu LMDB commits); "
		      "create+write+utimens: %.0f files/s; create+fsync: "
		      "%.0f creates/s\n",
		      n1, creates, after - before, files, synced);
	assert_true(creates >= CREATES_FLOOR);
	/* a commit per period or per batch_max changes, not per change */
	assert_true(after - before <= (size_t)n1 / fx->j->batch_max + 1 +
					  (size_t)((t1 - t0) * 1000 /
						   JNL_COMMIT_MS) + 1);
	/* all of it there after a reopen (jnl_close() commits) */
	reopen(fx);
	snprintf(name, sizeof(name), "d%03d", (n1 - 1) / 100);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, name, &d, &wh));
	snprintf(name, sizeof(name), "f%05d", n1 - 1);
	assert_rc_ok(jnl_lookup(fx->j, d, name, &id, &wh));
	snprintf(name, sizeof(name), "t%03d", (n2 - 1) / 100);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, name, &d, &wh));
	snprintf(name, sizeof(name), "f%05d", n2 - 1);
	assert_rc_ok(jnl_lookup(fx->j, d, name, &id, &wh));
	assert_int_equal(node_size(fx->j, id), 1000);
	assert_int_equal(stats(fx->j).pending_ops,
			 (uint64_t)(n1 / 100 + n1 + n2 / 100 + n2 * 2 + n3));
}

/*
 * A crash loses namespace changes of the last commit period that nobody
 * synced, whole and in order: what survives is a prefix of what was done.
 * The child does op after op (create f<i>; after every tenth create a
 * rename of f<i-5> to r<i-5>) with a 2 ms commit period until killed.
 */
static void prefix_child(struct fx *fx, const char *dirname)
{
	struct jnl_node a = attr(S_IFREG | 0644);
	char name[32], to[32];
	struct jnl *j;
	jnl_id d, id;

	jnl_test_commit_ms = 2;
	if (jnl_open(fx->dir, &fx->cfg, 0, &j) ||
	    jnl_mkdir(j, JNL_ROOT, dirname, &a, &d) || jnl_sync(j))
		_exit(1);
	for (int i = 0;; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		if (jnl_create(j, d, name, &a, &id))
			_exit(1);
		if (i % 10 == 9) {
			snprintf(name, sizeof(name), "f%d", i - 5);
			snprintf(to, sizeof(to), "r%d", i - 5);
			if (jnl_rename(j, d, name, d, to, 0))
				_exit(1);
		}
	}
}

static bool has(struct jnl *j, jnl_id d, const char *fmt, int i)
{
	char name[32];
	jnl_id id;
	bool wh;
	int rc;

	snprintf(name, sizeof(name), fmt, i);
	rc = jnl_lookup(j, d, name, &id, &wh);
	if (rc && rc != -ENOENT)
		fail_msg("lookup '%s': %s", name, strerror(-rc));
	return !rc;
}

static void test_journal__crash_keeps_a_prefix_of_ops(void **state)
{
	struct fx *fx = *state;
	unsigned int seed = (unsigned int)time(NULL) ^ (unsigned)getpid();

	print_message("prefix: seed %u\n", seed);
	srand(seed);
	for (int round = 0; round < 4; round++) {
		char dirname[16];
		unsigned int ms = 20 + (unsigned)rand() % 200;
		int status, c = 0;
		jnl_id d;
		bool wh;
		pid_t pid;

		snprintf(dirname, sizeof(dirname), "round%d", round);
		jnl_close(fx->j);
		fx->j = NULL;
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0)
			prefix_child(fx, dirname);
		usleep(ms * 1000);
		kill(pid, SIGKILL);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFSIGNALED(status));
		assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
		jnl_assert_sane(fx->j);
		if (jnl_lookup(fx->j, JNL_ROOT, dirname, &d, &wh))
			continue; /* killed before its sync */
		while (has(fx->j, d, "f%d", c) || has(fx->j, d, "r%d", c))
			c++;
		/* c creates survived: none after them, and every rename
		 * done before the last of them */
		for (int i = c; i < c + 50; i++) {
			assert_false(has(fx->j, d, "f%d", i));
			assert_false(has(fx->j, d, "r%d", i));
		}
		for (int i = 9; i < c; i += 10) {
			bool renamed = has(fx->j, d, "r%d", i - 5);

			assert_true(renamed != has(fx->j, d, "f%d", i - 5));
			if (i + 1 < c)
				assert_true(renamed);
		}
		print_message("prefix: round %d killed after %u ms: %d creates "
			      "kept\n", round, ms, c);
	}
}

/* In the child of test_journal__fsync_node_makes_its_create_durable. */
static int crash_after_fsync(struct jnl *j)
{
	struct jnl_node a = attr(S_IFREG | 0644);
	unsigned char buf[1000];
	jnl_id d, f, g, x, y;

	pattern(buf, sizeof(buf), 9);
	if (jnl_mkdir(j, JNL_ROOT, "d", &a, &d) ||
	    jnl_create(j, d, "f", &a, &f) ||
	    jnl_write(j, f, buf, sizeof(buf), 0) != sizeof(buf) ||
	    jnl_create(j, JNL_ROOT, "g", &a, &g) ||
	    jnl_write(j, g, buf, 10, 0) != 10)
		return -1;
	/* f's data, f's create and d's (and g's create: one batch, as one
	 * journal commit of a local filesystem), not g's data */
	if (jnl_fsync_node(j, f))
		return -1;
	if (jnl_create(j, JNL_ROOT, "late", &a, &x))
		return -1;
	/* a directory's fsync: the names in it */
	if (jnl_mkdir(j, JNL_ROOT, "x", &a, &x) ||
	    jnl_create(j, x, "y", &a, &y) || jnl_fsync_node(j, x))
		return -1;
	return jnl_create(j, JNL_ROOT, "lost", &a, &y) ? -1 : 0;
}

static void test_journal__fsync_node_makes_its_create_durable(void **state)
{
	struct fx *fx = *state;
	unsigned char want[1000], got[1000];
	struct jnl_stats s;
	jnl_id d, f, g, x, id;
	bool wh;

	/* only the node's own marks are committed (its staging file) */
	jnl_close(fx->j);
	jnl_test_commit_ms = 60000;
	assert_rc_ok(jnl_open(fx->dir, &fx->cfg, 0, &fx->j));
	f = mk_file(fx->j, JNL_ROOT, "a");
	g = mk_file(fx->j, JNL_ROOT, "b");
	write_pattern(fx->j, f, 0, 100, 1);
	write_pattern(fx->j, g, 0, 100, 2);
	assert_rc_ok(jnl_fsync_node(fx->j, f));
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(chunk_state(fx->j, g, 0, NULL), 0);
	assert_rc_ok(jnl_stats(fx->j, &s));
	assert_int_equal(s.uncommitted, 2); /* g's chunk and node marks */
	assert_int_equal(node_size(fx->j, g), 100);
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(chunk_state(fx->j, g, 0, NULL), JNL_CHUNK_DIRTY);

	crash_child(fx, 60000, crash_after_fsync);
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "d", &d, &wh));
	assert_rc_ok(jnl_lookup(fx->j, d, "f", &f, &wh));
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "g", &g, &wh));
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "late", &id, &wh));
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "x", &x, &wh));
	assert_rc_ok(jnl_lookup(fx->j, x, "y", &id, &wh));
	assert_rc_err(jnl_lookup(fx->j, JNL_ROOT, "lost", &id, &wh), ENOENT);
	pattern(want, sizeof(want), 9);
	assert_int_equal(jnl_read(fx->j, f, got, sizeof(got), 0, NULL),
			 sizeof(got));
	assert_memory_equal(got, want, sizeof(want));
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(chunk_state(fx->j, g, 0, NULL), 0);
	assert_int_equal(node_size(fx->j, g), 0);
}

static int crash_after_truncate(struct jnl *j)
{
	jnl_id f;
	bool wh;

	if (jnl_lookup(j, JNL_ROOT, "f", &f, &wh))
		return -1;
	return jnl_setattr(j, f, JNL_SET_SIZE,
			   &(struct jnl_node){ .size = 10 });
}

/* A truncate that throws staging bytes away is durable before they go:
 * a crash cannot bring back chunk records over zeros. */
static void test_journal__truncate_is_durable_before_bytes_go(void **state)
{
	struct fx *fx = *state;
	unsigned char want[10], got[10];
	jnl_id f = mk_file(fx->j, JNL_ROOT, "f");

	write_pattern(fx->j, f, 0, 3 * CS, 4);
	assert_rc_ok(jnl_sync(fx->j));
	crash_child(fx, 60000, crash_after_truncate);
	assert_int_equal(node_size(fx->j, f), 10);
	assert_int_equal(chunk_state(fx->j, f, 1, NULL), 0);
	pattern(want, sizeof(want), 4);
	assert_int_equal(jnl_read(fx->j, f, got, 10, 0, NULL), 10);
	assert_memory_equal(got, want, 10);
}

/* --- conflicts (journal.h "Conflicts") --------------------------------- */

static struct stat remote_st(uint64_t ino, off_t size, time_t sec, long nsec)
{
	struct stat st;

	memset(&st, 0, sizeof(st));
	st.st_dev = 42;
	st.st_ino = ino;
	st.st_mode = S_IFREG | 0644;
	st.st_nlink = 1;
	st.st_size = size;
	st.st_mtim.tv_sec = sec;
	st.st_mtim.tv_nsec = nsec;
	return st;
}

static struct jnl_node node_of(struct jnl *j, jnl_id id)
{
	struct jnl_node n;

	assert_rc_ok(jnl_node_get(j, id, &n));
	return n;
}

/* The base: set at import and refresh (regular files with one link only),
 * SET -> SENDING only while the remote is the base, SENDING -> SET at
 * FINISH with its values; stale looks and stale claims are refused. */
static void test_journal__conflict_base_tracking(void **state)
{
	struct fx *fx = *state;
	struct stat st = remote_st(60, 100, 1000000000, 5), other;
	struct timespec mt = { 1600000000, 123456789 };
	struct jnl_chunk_ref c[4];
	struct jnl_node n;
	uint64_t seq;
	jnl_id f, h, l, d;

	assert_rc_ok(jnl_node_import(fx->j, JNL_ROOT, "f", &st, &f));
	n = node_of(fx->j, f);
	assert_int_equal(n.base, JNL_BASE_SET);
	assert_int_equal(n.base_size, 100);
	assert_int_equal(n.base_mtime.tv_sec, 1000000000);
	assert_int_equal(n.base_mtime.tv_nsec, 5);
	assert_int_equal(n.remote_valid, 100);
	/* not tracked: hard links, created here, directories */
	h = import_n(fx->j, JNL_ROOT, "h", S_IFREG | 0644, 61, 10, 2);
	assert_int_equal(node_of(fx->j, h).base, JNL_BASE_NONE);
	l = mk_file(fx->j, JNL_ROOT, "l");
	assert_int_equal(node_of(fx->j, l).base, JNL_BASE_NONE);
	d = import(fx->j, JNL_ROOT, "d", S_IFDIR | 0755, 62, 0);
	assert_int_equal(node_of(fx->j, d).base, JNL_BASE_NONE);
	assert_rc_err(jnl_node_send_begin(fx->j, l, 0, NULL, &st), ENOENT);
	assert_rc_ok(jnl_node_send_begin(fx->j, h, 0, NULL, &st));

	/* the remote is not the base: a conflict, nothing changed */
	seq = node_of(fx->j, f).base_seq;
	other = remote_st(60, 100, 1000000000, 6); /* 1 ns later */
	assert_rc_err(jnl_node_send_begin(fx->j, f, seq, NULL, &other), EXDEV);
	other = remote_st(63, 100, 1000000000, 5); /* another object */
	assert_rc_err(jnl_node_send_begin(fx->j, f, seq, NULL, &other), EXDEV);
	assert_int_equal(node_of(fx->j, f).base, JNL_BASE_SET);
	/* a look older than the base: again */
	assert_rc_err(jnl_node_send_begin(fx->j, f, seq + 1, NULL, &st), EAGAIN);
	/* the base: SENDING, with a new seq, durable */
	assert_rc_ok(jnl_node_send_begin(fx->j, f, seq, NULL, &st));
	n = node_of(fx->j, f);
	assert_int_equal(n.base, JNL_BASE_SENDING);
	assert_true(n.base_seq != seq);
	/* SENDING: our own writes move the remote, nothing is compared */
	other = remote_st(60, 7, 1, 0);
	assert_rc_ok(jnl_node_send_begin(fx->j, f, 0, NULL, &other));
	reopen(fx);
	assert_int_equal(node_of(fx->j, f).base, JNL_BASE_SENDING);
	/* FINISH applied: the base is what it set */
	assert_rc_ok(jnl_node_send_done(fx->j, f, 4096, &mt, NULL));
	n = node_of(fx->j, f);
	assert_int_equal(n.base, JNL_BASE_SET);
	assert_int_equal(n.base_size, 4096);
	assert_int_equal(n.base_mtime.tv_sec, mt.tv_sec);
	assert_int_equal(n.base_mtime.tv_nsec, mt.tv_nsec);
	assert_rc_ok(jnl_node_send_done(fx->j, l, 1, &mt, NULL)); /* untracked */
	assert_int_equal(node_of(fx->j, l).base, JNL_BASE_NONE);

	/* a refresh (nothing pending) takes the remote as the base */
	other = remote_st(60, 55, 1700000000, 1);
	assert_rc_ok(jnl_node_refresh(fx->j, f, &other));
	n = node_of(fx->j, f);
	assert_int_equal(n.base, JNL_BASE_SET);
	assert_int_equal(n.base_size, 55);
	assert_int_equal(n.base_mtime.tv_sec, 1700000000);

	/* a claim of the chunk is checked with it */
	write_pattern(fx->j, f, 0, CS, 3);
	assert_rc_ok(jnl_sync(fx->j));
	assert_int_equal(jnl_chunk_claim(fx->j, c, 4), 1);
	c[0].generation++; /* not this claim */
	seq = node_of(fx->j, f).base_seq;
	assert_rc_err(jnl_node_send_begin(fx->j, f, seq, &c[0], &other),
		      ENOENT);
	c[0].generation--;
	assert_rc_ok(jnl_node_send_begin(fx->j, f, seq, &c[0], &other));
	assert_rc_ok(jnl_chunk_release(fx->j, &c[0], true, sha));
	jnl_assert_sane(fx->j);

	/* a version 1 record (an older ferryfs: no base) reads as not
	 * tracked, and is written back as version 2 */
	{
		unsigned char kb[8], rec[sizeof(struct jnl_node_rec) + 64];
		MDB_val k = { 8, kb }, v;
		struct jnl_node_rec r;
		struct jnl_wtx w;
		size_t tail;

		assert_rc_ok(jnl_wtx_begin(fx->j, &w, false));
		jnl_be64_put(kb, f);
		assert_int_equal(mdb_get(w.txn, fx->j->db_nodes, &k, &v), 0);
		tail = v.mv_size - sizeof(r);
		assert_true(tail <= 64);
		memcpy(&r, v.mv_data, sizeof(r));
		r.version = 1;
		memcpy(rec, &r, JNL_NODE_REC_V1_SIZE);
		memcpy(rec + JNL_NODE_REC_V1_SIZE,
		       (const char *)v.mv_data + sizeof(r), tail);
		v.mv_data = rec;
		v.mv_size = JNL_NODE_REC_V1_SIZE + tail;
		assert_int_equal(mdb_put(w.txn, fx->j->db_nodes, &k, &v, 0), 0);
		assert_rc_ok(jnl_wtx_commit(&w));
		n = node_of(fx->j, f);
		assert_int_equal(n.base, JNL_BASE_NONE);
		assert_int_equal(n.size, CS);
		assert_rpath(fx->j, f, "f");
		assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_MODE, &n));
		reopen(fx);
		assert_int_equal(node_of(fx->j, f).base, JNL_BASE_NONE);
	}
}

/* The conversion: one transaction, the local version under the conflict
 * name as a node created here (every byte held, chunks DIRTY, its
 * SETATTR dropped, a CREATE appended), the share's version at the old
 * name; stale claims change nothing; it survives a reopen. */
static void test_journal__conflict_conversion(void **state)
{
	struct fx *fx = *state;
	uint64_t size = 3 * CS + 100;
	struct stat st = remote_st(70, (off_t)size, 1000000000, 0);
	struct stat now = remote_st(70, 50, 1000000100, 0);
	unsigned char *local = malloc(4 * CS), *buf = malloc(4 * CS);
	char paths[2][PATH_MAX];
	struct jnl_chunk_ref c[8], stale;
	struct jnl_op ops[8];
	struct jnl_node n, a = attr(0600);
	uint64_t seq, total;
	jnl_id f, sid, id, other, taken;
	bool wh;
	int k;

	assert_non_null(local);
	assert_non_null(buf);
	assert_rc_ok(jnl_node_import(fx->j, JNL_ROOT, "f", &st, &f));
	pattern(local, size, 9); /* the base */
	assert_rc_ok(jnl_chunk_fill(fx->j, f, 0, local, CS));
	assert_int_equal(jnl_write(fx->j, f, "hello", 5, 10), 5);
	memcpy(local + 10, "hello", 5);
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_MODE, &a));
	assert_rc_ok(jnl_sync(fx->j));
	/* the flusher claimed the written chunk */
	assert_int_equal(jnl_chunk_claim(fx->j, c, 8), 1);
	assert_rc_ok(jnl_chunk_claimed(fx->j, &c[0]));
	stale = c[0];
	seq = node_of(fx->j, f).base_seq;

	/* not a conflict: the remote is the base */
	assert_rc_err(jnl_node_conflict(fx->j, f, seq, &st, "f.c", "f.c", 0,
					&sid), ESTALE);
	/* chunks 1-3 hold remote bytes the journal does not have */
	assert_rc_err(jnl_node_conflict(fx->j, f, seq, &now, "f.c", "f.c", 0,
					&sid), EAGAIN);
	/* a stale look */
	assert_rc_err(jnl_node_conflict(fx->j, f, seq + 1, &now, "f.c", "f.c",
					0, &sid), EAGAIN);
	/* the fill (jnl_conflict_resolve() reads the share's bytes now) */
	pattern(local + CS, 3 * CS, 11);
	for (k = 1; k < 4; k++)
		assert_rc_ok(jnl_chunk_fill(fx->j, f, (uint64_t)k,
					    local + k * CS,
					    k < 3 ? CS : 100));
	/* the name is taken here */
	taken = mk_file(fx->j, JNL_ROOT, "taken");
	assert_rc_err(jnl_node_conflict(fx->j, f, seq, &now, "taken", "taken",
					0, &sid), EEXIST);
	assert_rc_ok(jnl_node_conflict(fx->j, f, seq, &now, "f.c", "d/f.c", 0,
				       &sid));
	jnl_assert_sane(fx->j);

	/* the old name: the share's version, a fresh import with nothing
	 * pending */
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "f", &id, &wh));
	assert_int_equal(id, sid);
	n = node_of(fx->j, sid);
	assert_int_equal(n.size, 50);
	assert_int_equal(n.base, JNL_BASE_SET);
	assert_int_equal(n.base_ino, 70);
	assert_false(n.flags & (JNL_NODE_LOCAL | JNL_NODE_DATA));
	assert_int_equal(n.pending_ops, 0);
	assert_int_equal(n.unflushed, 0);
	assert_rc_ok(jnl_node_import(fx->j, JNL_ROOT, "g", &now, &other));
	assert_int_equal(other, sid); /* the share's object is sid now */
	/* the conflict name: the local version, created here */
	assert_rc_ok(jnl_lookup(fx->j, JNL_ROOT, "f.c", &id, &wh));
	assert_int_equal(id, f);
	n = node_of(fx->j, f);
	assert_true(n.flags & JNL_NODE_LOCAL);
	assert_true(n.flags & JNL_NODE_CONFLICT);
	assert_int_equal(n.base, JNL_BASE_NONE);
	assert_int_equal(n.base_ino, 0);
	assert_int_equal(n.remote_valid, 0);
	assert_int_equal(n.size, size);
	assert_int_equal(n.mode, S_IFREG | 0600);
	assert_int_equal(n.unflushed, 4);
	assert_int_equal(jnl_read(fx->j, f, buf, 4 * CS, 0, NULL), size);
	assert_memory_equal(buf, local, size);
	for (k = 0; k < 4; k++)
		assert_int_equal(chunk_state(fx->j, f, (uint64_t)k, NULL),
				 JNL_CHUNK_DIRTY);
	/* the stale claim: refused, its release changes nothing */
	assert_rc_err(jnl_chunk_claimed(fx->j, &c[0]), ENOENT);
	assert_rc_err(jnl_node_send_begin(fx->j, f, 0, &c[0], NULL), ENOENT);
	assert_rc_ok(jnl_chunk_release(fx->j, &c[0], true, sha));
	assert_int_equal(chunk_state(fx->j, f, 0, NULL), JNL_CHUNK_DIRTY);
	assert_int_equal(jnl_chunk_claim(fx->j, c, 8), 0); /* LOCAL */
	/* status */
	assert_int_equal(stats(fx->j).conflicts, 1);
	assert_int_equal(jnl_conflict_paths(fx->j, paths, 2, &total), 1);
	assert_string_equal(paths[0], "d/f.c");
	assert_int_equal(total, 1);

	/* it survives a reopen; the only op is the copy's create */
	reopen(fx);
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 2);
	assert_non_null(find_op(ops, 2, JNL_OP_CREATE, f));
	assert_string_equal(find_op(ops, 2, JNL_OP_CREATE, f)->name, "f.c");
	assert_non_null(find_op(ops, 2, JNL_OP_CREATE, taken));
	for (k = 0; k < 2; k++)
		assert_rc_ok(jnl_op_ack(fx->j, ops[k].seq));
	assert_rpath(fx->j, f, "f.c");
	/* created: its chunks go out like any new file's; the copy's claim
	 * of chunk 0 is current, the one from before the conversion is not
	 * (a flusher holding it, parked, must not write what it reads) */
	assert_int_equal(jnl_chunk_claim(fx->j, c, 8), 4);
	for (k = 0; k < 4; k++)
		assert_rc_ok(jnl_chunk_claimed(fx->j, &c[k]));
	assert_int_equal(c[0].index, stale.index);
	assert_rc_err(jnl_chunk_claimed(fx->j, &stale), ENOENT);
	for (k = 0; k < 4; k++)
		assert_rc_ok(jnl_chunk_release(fx->j, &c[k], true, sha));
	assert_rc_err(jnl_chunk_claimed(fx->j, &c[0]), ENOENT); /* released */
	assert_rc_ok(jnl_sync(fx->j)); /* ops go out once durable */
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 1);
	assert_int_equal(ops[0].type, JNL_OP_FINISH);
	assert_rc_ok(jnl_op_ack(fx->j, ops[0].seq));
	assert_rc_ok(jnl_node_clean(fx->j, f));
	jnl_assert_sane(fx->j);
	assert_int_equal(stats(fx->j).conflicts, 1);
	free(local);
	free(buf);
}

/* What cannot be converted: links (-EBUSY), an op another stream holds
 * (-EINPROGRESS); the op handed out to the caller goes with the rest. */
static void test_journal__conflict_refusals(void **state)
{
	struct fx *fx = *state;
	struct stat st = remote_st(80, 0, 1000000000, 0);
	struct stat now = remote_st(80, 9, 1000000001, 0);
	struct jnl_node a = attr(0600);
	struct jnl_op ops[8];
	uint64_t seq;
	jnl_id f, sid;

	assert_rc_ok(jnl_node_import(fx->j, JNL_ROOT, "f", &st, &f));
	assert_int_equal(jnl_write(fx->j, f, "new", 3, 0), 3);
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_MODE, &a));
	assert_rc_ok(jnl_sync(fx->j));
	seq = node_of(fx->j, f).base_seq;
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 1);
	assert_int_equal(ops[0].type, JNL_OP_SETATTR);
	assert_rc_err(jnl_node_conflict(fx->j, f, seq, &now, "f.c", "f.c", 0,
					&sid), EINPROGRESS);
	assert_rc_ok(jnl_node_conflict(fx->j, f, seq, &now, "f.c", "f.c",
				       ops[0].seq, &sid));
	jnl_assert_sane(fx->j); /* no handed-out op that does not exist */
	assert_rc_err(jnl_op_ack(fx->j, ops[0].seq), ENOENT);
	assert_int_equal(jnl_ops_ready(fx->j, ops, 8), 1);
	assert_int_equal(ops[0].type, JNL_OP_CREATE);
	assert_int_equal(ops[0].id, f);

	/* only attributes changed here: not a conflict */
	st = remote_st(82, 5, 1000000000, 0);
	now = remote_st(82, 9, 1000000001, 0);
	assert_rc_ok(jnl_node_import(fx->j, JNL_ROOT, "a", &st, &f));
	assert_rc_ok(jnl_setattr(fx->j, f, JNL_SET_MODE | JNL_SET_MTIME, &a));
	seq = node_of(fx->j, f).base_seq;
	assert_rc_err(jnl_node_conflict(fx->j, f, seq, &now, "a.c", "a.c", 0,
					&sid), ENODATA);

	/* a second name: not converted */
	st = remote_st(81, 0, 1000000000, 0);
	now = remote_st(81, 9, 1000000001, 0);
	assert_rc_ok(jnl_node_import(fx->j, JNL_ROOT, "g", &st, &f));
	assert_int_equal(jnl_write(fx->j, f, "new", 3, 0), 3);
	assert_rc_ok(jnl_link(fx->j, f, JNL_ROOT, "g2"));
	seq = node_of(fx->j, f).base_seq;
	assert_rc_err(jnl_node_conflict(fx->j, f, seq, &now, "g.c", "g.c", 0,
					&sid), EBUSY);
	/* forced: SENDING, not found again */
	assert_rc_ok(jnl_node_send_begin(fx->j, f, seq, NULL, NULL));
	assert_int_equal(node_of(fx->j, f).base, JNL_BASE_SENDING);
	jnl_assert_sane(fx->j);
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_journal__create_then_reopen),
		T(test_journal__missing_journal_is_enoent),
		T(test_journal__create_refuses_foreign_dir),
		T(test_journal__bad_config_is_einval),
		T(test_journal__other_remote_is_exdev),
		T(test_journal__second_opener_is_ebusy),
		T(test_journal__garbage_lmdb_is_eproto),
		T(test_journal__foreign_format_is_eproto),
		T(test_journal__map_full_is_enospc),
		T(test_journal__failed_change_is_undone),
		T(test_journal__max_bytes_is_enospc),
		T(test_journal__lmdb_errors_map_to_errno),
		T(test_journal__eio_is_sticky),
		T(test_journal__lookup_import_and_whiteout),
		T(test_journal__names_are_checked),
		T(test_journal__create_link_symlink_setattr),
		T(test_journal__link_ack_moves_the_remote_name),
		T(test_journal__unlink_of_newest_link_keeps_older_name),
		T(test_journal__rename_over_a_link_keeps_older_name),
		T(test_journal__names_holders_and_movers_alternate),
		T(test_journal__refresh_only_when_nothing_pending),
		T(test_journal__conflict_base_tracking),
		T(test_journal__conflict_conversion),
		T(test_journal__conflict_refusals),
		T(test_journal__rmdir_and_unlink_rules),
		T(test_journal__case_taken),
		T(test_journal__rename_rules),
		T(test_journal__unlink_cancels_pending_create),
		T(test_journal__write_read_local),
		T(test_journal__imported_partial_write_needs_fill),
		T(test_journal__chunk_state_machine),
		T(test_journal__sweep_after_open_cleans_flushed_nodes),
		T(test_journal__hungry_commits_a_filled_chunk),
		T(test_journal__hungry_commits_the_flushers_own_work),
		T(test_journal__write_while_inflight_stays_dirty),
		T(test_journal__truncate_drops_chunks),
		T(test_journal__unlinked_node_is_not_claimed),
		T(test_journal__unlinked_node_data_goes_once_closed),
		cmocka_unit_test(test_journal__u64_set_and_count),
		T(test_journal__recovery_resends_only_inflight),
		T(test_journal__crash_with_chunks_in_flight),
		T(test_journal__group_commit_survives_crash),
		T(test_journal__writes_share_one_commit),
		T(test_journal__commit_syncs_many_staging_files),
		T(test_journal__passthrough_marks_what_the_kernel_wrote),
		T(test_journal__passthrough_grows_while_written),
		T(test_journal__passthrough_mark_resends_chunk_without_digest),
		T(test_journal__staging_fd_in_use_outlives_its_file),
		T(test_journal__ops_wait_for_their_directory),
		T(test_journal__ops_after_dir_rename_wait),
		T(test_journal__ops_exchange),
		T(test_journal__ops_same_name_in_order),
		T(test_journal__ops_wait_for_durable_acks),
		T(test_journal__hungry_soon_after_a_commit_hurries),
		T(test_journal__exchange_mark_survives_a_crash),
		T(test_journal__damaged_journal_is_refused),
		T(test_journal__parts_that_disagree_are_refused),
		T(test_journal__creation_cut_short_resumes),
		T(test_journal__op_fail_and_reopen),
		T(test_journal__concurrent_writers_and_flusher),
		T(test_journal__concurrent_fill_and_write),
		T(test_journal__open_100k_pending_nodes_is_fast),
		T(test_journal__creates_are_group_committed),
		T(test_journal__crash_keeps_a_prefix_of_ops),
		T(test_journal__fsync_node_makes_its_create_durable),
		T(test_journal__truncate_is_durable_before_bytes_go),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
