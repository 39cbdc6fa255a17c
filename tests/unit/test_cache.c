/*
 * test_cache.c - unit tests of cache/: the block cache (cache.c) and the
 * read-ahead engine (readahead.c).
 *
 * Each case gets a fresh mkdtemp() dir <tmp>:
 *   <tmp>/c      the cache directory
 *   <tmp>/share  a local directory opened through the path driver as the
 *                remote of the read-ahead cases
 * Block contents are a pattern of (ino, index, offset), so any byte served
 * from the wrong slot or a torn block shows. cache_assert_sane() runs
 * after every mutation.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
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

#include "cache.h"
#include "cache_i.h" /* cache_assert_sane() */
#include "remote.h"

#include "test_util.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define BS (64 * KiB)

struct fx {
	char tmp[PATH_MAX];
	char dir[PATH_MAX];   /* <tmp>/c */
	char share[PATH_MAX]; /* <tmp>/share */
	struct cache *c;
};

/* --- helpers ----------------------------------------------------------- */

static uint8_t pat(uint64_t ino, uint64_t pos)
{
	uint64_t x = ino * 0x9e3779b97f4a7c15ull ^ (pos / 8) * 0xbf58476d1ce4e5b9ull;

	return (uint8_t)(x >> (8 * (pos % 8)));
}

static void fill(void *buf, uint64_t ino, uint64_t pos, size_t len)
{
	uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		p[i] = pat(ino, pos + i);
}

/* Does buf hold the pattern of ino at [pos, pos+len)? */
static bool check(const void *buf, uint64_t ino, uint64_t pos, size_t len)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		if (p[i] != pat(ino, pos + i))
			return false;
	return true;
}

static bool all_zero(const void *buf, size_t len)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		if (p[i])
			return false;
	return true;
}

static struct cache_key key(uint64_t ino, uint64_t size, long mtime)
{
	struct cache_key k = { .dev = 7, .ino = ino, .size = size };

	k.mtime.tv_sec = mtime;
	return k;
}

static size_t blen(const struct cache_key *k, uint64_t idx, size_t bs)
{
	uint64_t start = idx * bs;

	return k->size - start < bs ? (size_t)(k->size - start) : bs;
}

/* Put block idx of k with its pattern. */
static int put(struct cache *c, const struct cache_key *k, uint64_t idx)
{
	size_t bs = cache_block_size(c), len = blen(k, idx, bs);
	void *buf = malloc(len);
	int rc;

	assert_non_null(buf);
	fill(buf, k->ino, idx * bs, len);
	rc = cache_put(c, k, idx, buf, len);
	free(buf);
	return rc;
}

static void open_cache(struct fx *fx, uint64_t max_bytes, uint32_t bs)
{
	struct cache_config cfg = { .max_bytes = max_bytes, .block_size = bs };

	assert_rc_ok(cache_open(fx->dir, &cfg, &fx->c));
	cache_assert_sane(fx->c);
}

static int rm_one(const char *path, const struct stat *st, int flag,
		  struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static int setup(void **state)
{
	struct fx *fx = calloc(1, sizeof(*fx));

	assert_non_null(fx);
	strcpy(fx->tmp, "/tmp/test_cache.XXXXXX");
	assert_non_null(mkdtemp(fx->tmp));
	assert_true(snprintf(fx->dir, sizeof(fx->dir), "%s/c", fx->tmp) <
		    (int)sizeof(fx->dir));
	assert_true(snprintf(fx->share, sizeof(fx->share), "%s/share",
			     fx->tmp) < (int)sizeof(fx->share));
	assert_int_equal(mkdir(fx->share, 0700), 0);
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fx *fx = *state;

	cache_close(fx->c);
	nftw(fx->tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(fx);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* --- the block cache ------------------------------------------------------- */

static void test_cache__put_read_round_trip(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(1, 4 * BS, 100);
	struct cache_stats st;
	bool have[4];
	char *buf = malloc(4 * BS);

	open_cache(fx, 16 * BS, BS);
	assert_int_equal(cache_block_size(fx->c), BS);
	assert_rc_ok(put(fx->c, &k, 0));
	cache_assert_sane(fx->c);
	assert_rc_ok(put(fx->c, &k, 1));
	cache_assert_sane(fx->c);
	assert_true(cache_has(fx->c, &k, 0));
	assert_true(cache_has(fx->c, &k, 1));
	assert_false(cache_has(fx->c, &k, 2));

	assert_rc_ok(cache_read(fx->c, &k, buf, 4 * BS, 0, have));
	assert_true(have[0] && have[1] && !have[2] && !have[3]);
	assert_true(check(buf, 1, 0, 2 * BS));
	/* a second put of a cached block changes nothing */
	assert_rc_ok(put(fx->c, &k, 1));
	cache_assert_sane(fx->c);

	cache_stats(fx->c, &st);
	assert_int_equal(st.blocks, 2);
	assert_int_equal(st.bytes, 2 * BS);
	assert_int_equal(st.max_bytes, 16 * BS);
	assert_int_equal(st.hits, 2);
	assert_int_equal(st.misses, 2);
	assert_int_equal(st.hit_bytes, 2 * BS);
	assert_int_equal(st.put_bytes, 2 * BS);
	/* bad block sizes and an index past the end */
	assert_rc_err(cache_put(fx->c, &k, 2, buf, BS - 1), EINVAL);
	assert_rc_err(cache_put(fx->c, &k, 4, buf, BS), EINVAL);
	free(buf);
}

/* cache_put_fd: the bytes spliced from a file; a file shorter than the
 * block caches nothing and gives the slot back. */
static void test_cache__put_fd(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(9, 2 * BS + 300, 100);
	char path[PATH_MAX + 8];
	char *buf = malloc(3 * BS);
	struct cache_stats st;
	bool have[3];
	int fd;

	open_cache(fx, 16 * BS, BS);
	snprintf(path, sizeof(path), "%s/f", fx->share);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	fill(buf, 9, 0, 2 * BS + 300);
	assert_int_equal(pwrite(fd, buf, 2 * BS + 300, 0), 2 * BS + 300);
	assert_rc_ok(cache_put_fd(fx->c, &k, 1, fd, BS, BS));
	assert_rc_ok(cache_put_fd(fx->c, &k, 2, fd, 2 * BS, 300));
	assert_rc_err(cache_put_fd(fx->c, &k, 2, fd, 2 * BS, BS), EINVAL);
	cache_assert_sane(fx->c);
	memset(buf, 0, 3 * BS);
	assert_rc_ok(cache_read(fx->c, &k, buf, BS + 300, BS, have));
	assert_true(have[0] && have[1]);
	assert_true(check(buf, 9, BS, BS + 300));
	/* the file lost its last bytes: block 0 of another version cannot
	 * be had from it at 2 * BS */
	assert_int_equal(ftruncate(fd, 2 * BS + 100), 0);
	assert_rc_err(cache_put_fd(fx->c, &k, 0, fd, 2 * BS, BS), ESTALE);
	assert_false(cache_has(fx->c, &k, 0));
	cache_assert_sane(fx->c);
	cache_stats(fx->c, &st);
	assert_int_equal(st.blocks, 2);
	assert_int_equal(st.put_bytes, BS + 300);
	close(fd);
	free(buf);
}

struct put_arg {
	struct cache *c;
	struct cache_key k;
	uint64_t idx;
	int rc;
	_Atomic bool done;
};

static void *put_thread(void *arg)
{
	struct put_arg *a = arg;

	a->rc = put(a->c, &a->k, a->idx);
	atomic_store(&a->done, true);
	return NULL;
}

/* cache_pin: all or nothing; a pinned slot is not overwritten by a put
 * that evicts its block: the put waits for cache_unpin(). */
static void test_cache__pin_holds_slots(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(10, 3 * BS, 100);
	struct put_arg a = { .k = k, .idx = 2 };
	struct cache_stats st;
	struct cache_pin p;
	char *buf = malloc(BS);
	pthread_t th;
	size_t got = 0;

	open_cache(fx, 2 * BS, BS);
	a.c = fx->c;
	assert_rc_ok(put(fx->c, &k, 0));
	assert_rc_err(cache_pin(fx->c, &k, 0, 2 * BS, &p), ENOENT);
	assert_int_equal(p.n, 0);
	assert_rc_err(cache_pin(fx->c, &k, BS, 2 * BS + 1, &p), EINVAL);
	assert_rc_ok(put(fx->c, &k, 1));
	cache_stats(fx->c, &st);
	assert_int_equal(st.hits, 0); /* a failed pin counts nothing */
	/* both slots pinned, 100 bytes into block 0 to 10 into block 1 */
	assert_rc_ok(cache_pin(fx->c, &k, 100, BS - 90, &p));
	assert_int_equal(p.n, 2);
	assert_int_equal(p.s[0].len, BS - 100);
	assert_int_equal(p.s[1].len, 10);
	cache_stats(fx->c, &st);
	assert_int_equal(st.hits, 2);
	/* block 2 needs a slot: it evicts block 0 or 1, then waits */
	assert_int_equal(pthread_create(&th, NULL, put_thread, &a), 0);
	usleep(300 * 1000);
	assert_false(atomic_load(&a.done));
	for (unsigned int i = 0; i < p.n; i++) {
		assert_int_equal(pread(p.fd, buf, p.s[i].len, p.s[i].off),
				 (ssize_t)p.s[i].len);
		assert_true(check(buf, 10, 100 + got, p.s[i].len));
		got += p.s[i].len;
	}
	cache_unpin(fx->c, &p);
	assert_int_equal(p.n, 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_rc_ok(a.rc);
	assert_true(cache_has(fx->c, &k, 2));
	assert_false(cache_has(fx->c, &k, 0) && cache_has(fx->c, &k, 1));
	cache_assert_sane(fx->c);
	free(buf);
}

static void test_cache__partial_last_block(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(2, 3 * BS + 100, 100);
	bool have[3];
	char *buf = malloc(3 * BS);

	open_cache(fx, 16 * BS, BS);
	assert_rc_err(cache_put(fx->c, &k, 3, buf, BS), EINVAL);
	assert_rc_ok(put(fx->c, &k, 3));
	cache_assert_sane(fx->c);
	memset(buf, 0xaa, 3 * BS);
	/* block 3 (100 bytes, then zeros), block 4 and 5 past the end */
	assert_rc_ok(cache_read(fx->c, &k, buf, 3 * BS, 3 * BS, have));
	assert_true(have[0] && have[1] && have[2]);
	assert_true(check(buf, 2, 3 * BS, 100));
	assert_true(all_zero(buf + 100, 3 * BS - 100));
	/* only past the end: all had, all zeros, block 3 unread */
	memset(buf, 0xaa, BS);
	assert_rc_ok(cache_read(fx->c, &k, buf, 10, 5 * BS + 7, have));
	assert_true(have[0]);
	assert_true(all_zero(buf, 10));
	free(buf);
}

static void test_cache__have_across_block_boundaries(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(3, 4 * BS, 100);
	bool have[3];
	char *buf = malloc(2 * BS + 20);

	open_cache(fx, 16 * BS, BS);
	assert_rc_ok(put(fx->c, &k, 0));
	assert_rc_ok(put(fx->c, &k, 2));
	cache_assert_sane(fx->c);
	/* [BS - 10, 2 BS + 10) touches blocks 0, 1, 2 */
	assert_rc_ok(cache_read(fx->c, &k, buf, BS + 20, BS - 10, have));
	assert_true(have[0] && !have[1] && have[2]);
	assert_true(check(buf, 3, BS - 10, 10));
	assert_true(check(buf + 10 + BS, 3, 2 * BS, 10));
	/* inside one block, unaligned */
	assert_rc_ok(cache_read(fx->c, &k, buf, 1000, 2 * BS + 333, have));
	assert_true(have[0]);
	assert_true(check(buf, 3, 2 * BS + 333, 1000));
	assert_rc_ok(cache_read(fx->c, &k, buf, 1000, BS + 333, have));
	assert_false(have[0]);
	assert_rc_err(cache_read(fx->c, &k, buf, 1, -1, have), EINVAL);
	free(buf);
}

static void test_cache__version_change_invalidates(void **state)
{
	struct fx *fx = *state;
	struct cache_key k1 = key(4, 4 * BS, 100), k2 = key(4, 4 * BS, 101);
	struct cache_key k3 = key(4, 2 * BS, 102), other = key(5, BS, 100);
	struct cache_stats st;
	bool have[4];
	char *buf = malloc(4 * BS);

	open_cache(fx, 16 * BS, BS);
	for (int i = 0; i < 4; i++)
		assert_rc_ok(put(fx->c, &k1, (uint64_t)i));
	assert_rc_ok(put(fx->c, &other, 0));
	cache_assert_sane(fx->c);
	/* another mtime: nothing served, the 4 blocks dropped */
	assert_rc_ok(cache_read(fx->c, &k2, buf, 4 * BS, 0, have));
	assert_true(!have[0] && !have[1] && !have[2] && !have[3]);
	cache_assert_sane(fx->c);
	cache_stats(fx->c, &st);
	assert_int_equal(st.invalidations, 4);
	assert_int_equal(st.blocks, 1);
	assert_false(cache_has(fx->c, &k1, 0));
	assert_true(cache_has(fx->c, &other, 0));
	/* a put of a newer version replaces */
	assert_rc_ok(put(fx->c, &k2, 0));
	assert_rc_ok(put(fx->c, &k3, 1));
	cache_assert_sane(fx->c);
	assert_false(cache_has(fx->c, &k2, 0));
	assert_true(cache_has(fx->c, &k3, 1));
	/* explicit invalidation */
	assert_rc_ok(cache_invalidate(fx->c, 7, 4));
	cache_assert_sane(fx->c);
	assert_false(cache_has(fx->c, &k3, 1));
	cache_stats(fx->c, &st);
	assert_int_equal(st.invalidations, 6);
	assert_int_equal(st.blocks, 1);
	free(buf);
}

static void test_cache__lru_eviction_keeps_the_bound(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(6, 64 * BS, 100);
	struct cache_stats st;
	bool have[1];
	char *buf = malloc(BS);

	open_cache(fx, 4 * BS + BS / 2, BS); /* 4 slots */
	for (int i = 0; i < 4; i++)
		assert_rc_ok(put(fx->c, &k, (uint64_t)i));
	/* use 0: 1 is now the least recently used */
	assert_rc_ok(cache_read(fx->c, &k, buf, 10, 0, have));
	assert_true(have[0]);
	assert_rc_ok(put(fx->c, &k, 4));
	cache_assert_sane(fx->c);
	assert_true(cache_has(fx->c, &k, 0));
	assert_false(cache_has(fx->c, &k, 1));
	assert_true(cache_has(fx->c, &k, 2));
	assert_true(cache_has(fx->c, &k, 4));
	assert_rc_ok(put(fx->c, &k, 5)); /* evicts 2 */
	assert_false(cache_has(fx->c, &k, 2));
	assert_true(cache_has(fx->c, &k, 3));
	cache_stats(fx->c, &st);
	assert_int_equal(st.evictions, 2);
	assert_int_equal(st.blocks, 4);
	assert_int_equal(st.max_bytes, 4 * BS);
	/* a long run: never over the bound, every block still right */
	for (int i = 6; i < 64; i++) {
		assert_rc_ok(put(fx->c, &k, (uint64_t)i));
		cache_stats(fx->c, &st);
		assert_true(st.bytes <= st.max_bytes);
	}
	cache_assert_sane(fx->c);
	for (int i = 60; i < 64; i++) {
		assert_rc_ok(cache_read(fx->c, &k, buf, BS, (off_t)i * BS,
					have));
		assert_true(have[0]);
		assert_true(check(buf, 6, (uint64_t)i * BS, BS));
	}
	free(buf);
}

static void test_cache__reopen_keeps_blocks_and_bound(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(8, 8 * BS, 100);
	struct cache_stats st;
	struct cache *c2;
	bool have[8];
	char *buf = malloc(8 * BS);

	open_cache(fx, 8 * BS, BS);
	for (int i = 0; i < 8; i++)
		assert_rc_ok(put(fx->c, &k, (uint64_t)i));
	/* the directory is locked while open */
	assert_rc_err(cache_open(fx->dir, NULL, &c2), EBUSY);
	assert_null(c2);
	cache_close(fx->c);
	fx->c = NULL;

	/* the stored block size wins, the stored bound stays */
	open_cache(fx, 0, 4 * BS);
	assert_int_equal(cache_block_size(fx->c), BS);
	cache_stats(fx->c, &st);
	assert_int_equal(st.max_bytes, 8 * BS);
	assert_int_equal(st.blocks, 8);
	assert_rc_ok(cache_read(fx->c, &k, buf, 8 * BS, 0, have));
	for (int i = 0; i < 8; i++)
		assert_true(have[i]);
	assert_true(check(buf, 8, 0, 8 * BS));
	cache_close(fx->c);
	fx->c = NULL;

	/* a smaller bound drops what does not fit */
	open_cache(fx, 3 * BS, 0);
	cache_stats(fx->c, &st);
	assert_int_equal(st.max_bytes, 3 * BS);
	assert_true(st.bytes <= 3 * BS);
	assert_rc_ok(cache_read(fx->c, &k, buf, 8 * BS, 0, have));
	for (int i = 0; i < 8; i++)
		if (have[i])
			assert_true(check(buf + i * BS, 8, (uint64_t)i * BS,
					  BS));
	for (int i = 0; i < 8; i++)
		assert_rc_ok(put(fx->c, &k, (uint64_t)i));
	cache_assert_sane(fx->c);
	cache_stats(fx->c, &st);
	assert_int_equal(st.blocks, 3);
	free(buf);
}

static void test_cache__corrupted_lmdb_is_eproto(void **state)
{
	struct fx *fx = *state;
	char path[PATH_MAX + 32], junk[8192];
	struct cache_config cfg = { .max_bytes = 4 * BS, .block_size = BS };
	int fd;

	open_cache(fx, 4 * BS, BS);
	cache_close(fx->c);
	fx->c = NULL;
	snprintf(path, sizeof(path), "%s/index.mdb/data.mdb", fx->dir);
	fd = open(path, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	memset(junk, 'x', sizeof(junk));
	assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
	close(fd);
	assert_rc_err(cache_open(fx->dir, &cfg, &fx->c), EPROTO);
	assert_null(fx->c);
	assert_non_null(strstr(cache_errmsg(), "corrupted"));
	/* a bad block size */
	cfg.block_size = 3000;
	assert_rc_err(cache_open(fx->dir, &cfg, &fx->c), EINVAL);
}

/* A child puts blocks as fast as it can and is killed: every block the
 * reopened cache serves is complete and right. */
static void test_cache__kill_keeps_only_complete_blocks(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(9, 256 * BS, 100);
	struct cache_stats st;
	bool have[1];
	char *buf = malloc(BS);
	pid_t pid;
	int status, served = 0;

	open_cache(fx, 16 * BS, BS);
	cache_close(fx->c);
	fx->c = NULL;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct cache *c;

		if (cache_open(fx->dir, NULL, &c))
			_exit(1);
		for (uint64_t i = 0;; i = (i + 1) % 256)
			put(c, &k, i);
	}
	usleep(300 * 1000);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));

	open_cache(fx, 0, 0);
	cache_stats(fx->c, &st);
	assert_true(st.blocks > 0 && st.bytes <= 16 * BS);
	for (uint64_t i = 0; i < 256; i++) {
		assert_rc_ok(cache_read(fx->c, &k, buf, BS, (off_t)(i * BS),
					have));
		if (have[0]) {
			assert_true(check(buf, 9, i * BS, BS));
			served++;
		}
	}
	assert_int_equal(served, (int)st.blocks);
	free(buf);
}

/* DIR/open from another boot: the system went down with the cache open,
 * the slab and the index may disagree: the cache starts empty. */
static void test_cache__system_crash_discards(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = key(10, 4 * BS, 100);
	struct cache_stats st;
	char path[PATH_MAX + 16];
	FILE *f;

	open_cache(fx, 8 * BS, BS);
	for (int i = 0; i < 4; i++)
		assert_rc_ok(put(fx->c, &k, (uint64_t)i));
	cache_close(fx->c);
	fx->c = NULL;
	snprintf(path, sizeof(path), "%s/open", fx->dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("00000000-0000-0000-0000-000000000000\n", f);
	fclose(f);
	open_cache(fx, 4 * BS, BS); /* made anew from cfg */
	cache_stats(fx->c, &st);
	assert_int_equal(st.blocks, 0);
	assert_int_equal(st.max_bytes, 4 * BS);
	assert_false(cache_has(fx->c, &k, 0));
	assert_rc_ok(put(fx->c, &k, 0));
	cache_assert_sane(fx->c);
}

struct worker {
	struct cache *c;
	unsigned int seed;
	int bad, errors;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char *buf = malloc(2 * BS);
	bool have[3];

	for (int n = 0; n < 400; n++) {
		uint64_t ino = 100 + (uint64_t)(rand_r(&w->seed) % 3);
		struct cache_key k = key(ino, 32 * BS - 1000, 100);
		uint64_t idx = (uint64_t)(rand_r(&w->seed) % 32);
		int op = rand_r(&w->seed) % 3;

		if (op == 0) {
			if (put(w->c, &k, idx))
				w->errors++;
		} else if (op == 1) {
			/* pinned bytes stay right while puts evict around */
			off_t off = (off_t)(idx * BS) + rand_r(&w->seed) % BS;
			size_t len = BS + (size_t)(rand_r(&w->seed) % BS);
			struct cache_pin p;
			uint64_t pos = (uint64_t)off;
			int rc;

			if (pos >= k.size)
				continue;
			if (len > k.size - pos)
				len = (size_t)(k.size - pos);
			rc = cache_pin(w->c, &k, off, len, &p);
			if (rc == -ENOENT)
				continue;
			if (rc) {
				w->errors++;
				continue;
			}
			usleep((useconds_t)(rand_r(&w->seed) % 300));
			for (unsigned int i = 0; i < p.n; i++) {
				if (pread(p.fd, buf, p.s[i].len, p.s[i].off) !=
					    (ssize_t)p.s[i].len ||
				    !check(buf, ino, pos, p.s[i].len))
					w->bad++;
				pos += p.s[i].len;
			}
			cache_unpin(w->c, &p);
		} else {
			off_t off = (off_t)(idx * BS) + rand_r(&w->seed) % BS;
			size_t len = BS + (size_t)(rand_r(&w->seed) % BS);

			if (cache_read(w->c, &k, buf, len, off, have)) {
				w->errors++;
				continue;
			}
			for (uint64_t i = 0; i < 3; i++) {
				uint64_t bs = (uint64_t)off / BS + i;
				uint64_t from = bs * BS > (uint64_t)off ?
							bs * BS :
							(uint64_t)off;
				uint64_t to = (bs + 1) * BS;

				if (to > (uint64_t)off + len)
					to = (uint64_t)off + len;
				if (from >= to)
					break;
				if (to > k.size)
					to = from > k.size ? from : k.size;
				if (have[i] &&
				    !check(buf + (from - (uint64_t)off), ino,
					   from, to - from))
					w->bad++;
			}
		}
	}
	free(buf);
	return NULL;
}

static void test_cache__concurrent_put_read_evict(void **state)
{
	struct fx *fx = *state;
	struct worker w[4];
	pthread_t th[4];
	struct cache_stats st;

	open_cache(fx, 8 * BS, BS);
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){ .c = fx->c, .seed = (unsigned)i + 1 };
		assert_int_equal(pthread_create(&th[i], NULL, worker_main,
						&w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(w[i].bad, 0);
		assert_int_equal(w[i].errors, 0);
	}
	cache_assert_sane(fx->c);
	cache_stats(fx->c, &st);
	assert_true(st.bytes <= 8 * BS);
	assert_true(st.evictions > 0);
	assert_true(st.hits > 0);
	print_message("concurrency: %llu hits, %llu misses, %llu evictions\n",
		      (unsigned long long)st.hits,
		      (unsigned long long)st.misses,
		      (unsigned long long)st.evictions);
}

/* --- read-ahead ------------------------------------------------------------ */

#define RA_FILE_SIZE (64 * MiB)

/* <share>/name with the pattern of @ino, @size bytes; its key. */
static struct cache_key make_remote_file(struct fx *fx, const char *name,
					 uint64_t ino, size_t size)
{
	char path[PATH_MAX + 64];
	struct cache_key k;
	struct stat st;
	char *buf = malloc(MiB);
	int fd;

	snprintf(path, sizeof(path), "%s/%s", fx->share, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	for (size_t off = 0; off < size; off += MiB) {
		size_t n = size - off < MiB ? size - off : MiB;

		fill(buf, ino, off, n);
		assert_int_equal(pwrite(fd, buf, n, (off_t)off), (ssize_t)n);
	}
	assert_int_equal(fstat(fd, &st), 0);
	close(fd);
	free(buf);
	memset(&k, 0, sizeof(k));
	k.dev = ino; /* the pattern's seed; any identity will do */
	k.ino = (uint64_t)st.st_ino;
	k.size = (uint64_t)st.st_size;
	k.mtime = st.st_mtim;
	k.ctime = st.st_ctim;
	return k;
}

static void check_cached(struct cache *c, const struct cache_key *k,
			 uint64_t idx, uint64_t seed)
{
	size_t bs = cache_block_size(c), len = blen(k, idx, bs);
	char *buf = malloc(bs);
	bool have[1];

	assert_rc_ok(cache_read(c, k, buf, len, (off_t)(idx * bs), have));
	assert_true(have[0]);
	assert_true(check(buf, seed, idx * bs, len));
	free(buf);
}

static void test_cache__readahead_sequential_fills_ahead(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = make_remote_file(fx, "big", 11, RA_FILE_SIZE);
	struct cache_ra_config cfg = { .remote_spec = fx->share };
	struct cache_ra_stats rs;
	struct cache_ra_file f;
	struct cache_ra *ra;
	uint64_t nblocks = RA_FILE_SIZE / MiB;

	k.dev = 11;
	open_cache(fx, 128 * MiB, MiB);
	assert_rc_ok(cache_ra_start(fx->c, &cfg, &ra));
	cache_ra_file_init(&f);
	/* 128 KiB reads, as FUSE does; the block after each read shows up */
	for (off_t off = 0; off < (off_t)RA_FILE_SIZE; off += 128 * KiB) {
		uint64_t next = (uint64_t)off / MiB + 1;

		cache_ra_note(ra, &f, "big", &k, off, 128 * KiB);
		if (next < nblocks)
			assert_true(cache_ra_wait(ra, &k, next, 10000));
	}
	cache_ra_stats(ra, &rs);
	assert_int_equal(rs.errors, 0);
	assert_int_equal(rs.fetches, nblocks - 1); /* block 0: the reader's */
	assert_int_equal(rs.fetched_bytes, RA_FILE_SIZE - MiB);
	assert_int_equal(rs.queued, 0);
	assert_int_equal(rs.inflight, 0);
	cache_ra_stop(ra);
	assert_false(cache_has(fx->c, &k, 0));
	for (uint64_t i = 1; i < nblocks; i++)
		check_cached(fx->c, &k, i, 11);
	cache_assert_sane(fx->c);
}

/* The kernel's first reads of a file come in any order: a reader that
 * starts at 512 KiB, then 0, then 1 MiB is sequential from its first read
 * (its first block is then fetched whole, and cached, by the reader). */
static void test_cache__readahead_out_of_order_start(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = make_remote_file(fx, "ooo", 14, RA_FILE_SIZE);
	struct cache_ra_config cfg = { .remote_spec = fx->share };
	struct cache_ra_file f;
	struct cache_ra *ra;

	k.dev = 14;
	open_cache(fx, 128 * MiB, MiB);
	assert_rc_ok(cache_ra_start(fx->c, &cfg, &ra));
	cache_ra_file_init(&f);
	cache_ra_note(ra, &f, "ooo", &k, 512 * KiB, 512 * KiB);
	assert_true(f.window > 0);
	assert_true(cache_ra_wait(ra, &k, 1, 10000));
	cache_ra_note(ra, &f, "ooo", &k, 0, 512 * KiB);
	assert_true(f.window > 0);
	cache_ra_note(ra, &f, "ooo", &k, 2 * MiB, 512 * KiB);
	assert_true(f.window > 0);
	/* far from where it was: random again */
	cache_ra_note(ra, &f, "ooo", &k, 40 * MiB, 512 * KiB);
	assert_int_equal(f.window, 0);
	cache_ra_stop(ra);
}

static void test_cache__readahead_random_fetches_nothing_extra(void **state)
{
	struct fx *fx = *state;
	struct cache_key k = make_remote_file(fx, "rnd", 12, RA_FILE_SIZE);
	struct cache_ra_config cfg = { .remote_spec = fx->share };
	struct cache_ra_stats rs;
	struct cache_ra_file f;
	struct cache_ra *ra;
	unsigned int seed = 5;
	uint64_t read_bytes = 0;

	k.dev = 12;
	open_cache(fx, 128 * MiB, MiB);
	assert_rc_ok(cache_ra_start(fx->c, &cfg, &ra));
	cache_ra_file_init(&f);
	for (int i = 0; i < 200; i++) {
		off_t off = (off_t)(rand_r(&seed) % (RA_FILE_SIZE / 4096)) *
			    4096;

		cache_ra_note(ra, &f, "rnd", &k, off, 4096);
		read_bytes += 4096;
	}
	/* let anything queued finish */
	for (uint64_t i = 0; i < RA_FILE_SIZE / MiB; i++)
		cache_ra_wait(ra, &k, i, 10000);
	cache_ra_stats(ra, &rs);
	print_message("random: read %llu bytes, fetched %llu\n",
		      (unsigned long long)read_bytes,
		      (unsigned long long)rs.fetched_bytes);
	assert_true(rs.fetched_bytes <= 2 * read_bytes);
	assert_int_equal(rs.errors, 0);
	cache_ra_stop(ra);
}

/* Fetch @mib blocks ahead of a sequential reader with @streams streams of
 * 20 MB/s each; returns the seconds it took. */
static double ra_timed(struct fx *fx, unsigned int streams, uint64_t mib)
{
	struct cache_key k = make_remote_file(fx, "thr", 13, mib * MiB + MiB);
	struct cache_ra_config cfg = { .remote_spec = fx->share,
				       .remote_opts = "remote_stream_rate=20M",
				       .streams = streams,
				       .max_window_blocks = 64 };
	struct cache_ra_stats rs;
	struct cache_ra_file f;
	struct cache_ra *ra;
	double t0;

	k.dev = 13;
	assert_rc_ok(cache_invalidate(fx->c, 13, k.ino));
	assert_rc_ok(cache_ra_start(fx->c, &cfg, &ra));
	cache_ra_file_init(&f);
	t0 = now_s();
	/* a reader going through it at full speed: 1 MiB reads */
	for (uint64_t i = 0; i < mib; i++) {
		cache_ra_note(ra, &f, "thr", &k, (off_t)(i * MiB), MiB);
		assert_true(cache_ra_wait(ra, &k, i + 1, 20000));
	}
	t0 = now_s() - t0;
	cache_ra_stats(ra, &rs);
	assert_int_equal(rs.errors, 0);
	cache_ra_stop(ra);
	for (uint64_t i = 1; i <= mib; i++)
		check_cached(fx->c, &k, i, 13);
	return t0;
}

static void test_cache__readahead_streams_in_parallel(void **state)
{
	struct fx *fx = *state;
	double t1, t4;

	open_cache(fx, 128 * MiB, MiB);
	t1 = ra_timed(fx, 1, 24);
	t4 = ra_timed(fx, 4, 24);
	print_message("read-ahead of 24 MiB at 20 MB/s per stream: 1 stream "
		      "%.2f s (%.1f MB/s), 4 streams %.2f s (%.1f MB/s), "
		      "x%.2f\n", t1, 24 * 1.048576 / t1, t4,
		      24 * 1.048576 / t4, t1 / t4);
	cache_assert_sane(fx->c);
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_cache__put_read_round_trip),
		T(test_cache__put_fd),
		T(test_cache__pin_holds_slots),
		T(test_cache__partial_last_block),
		T(test_cache__have_across_block_boundaries),
		T(test_cache__version_change_invalidates),
		T(test_cache__lru_eviction_keeps_the_bound),
		T(test_cache__reopen_keeps_blocks_and_bound),
		T(test_cache__corrupted_lmdb_is_eproto),
		T(test_cache__kill_keeps_only_complete_blocks),
		T(test_cache__system_crash_discards),
		T(test_cache__concurrent_put_read_evict),
		T(test_cache__readahead_sequential_fills_ahead),
		T(test_cache__readahead_out_of_order_start),
		T(test_cache__readahead_random_fetches_nothing_extra),
		T(test_cache__readahead_streams_in_parallel),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
