/*
 * cache.c - the block cache: fixed-size blocks of remote files in a slab
 * file on local disk, indexed in LMDB, bounded with LRU eviction. The
 * contract is cache.h; record layouts are in cache_i.h.
 *
 * Callers: fs/ (reads of clean files: cache_read() first, the remote for
 * what it did not have, then cache_put()), readahead.c (fetch threads put
 * the blocks ahead of a sequential reader), tests.
 *
 * ON DISK
 *
 *   DIR/index.mdb/  LMDB environment (subdirectory form) with the named
 *                   databases meta, blocks, slots, lru, files (cache_i.h)
 *   DIR/blocks      the slab, nslots * block_size bytes (sparse)
 *   DIR/open        the boot id, while open (see CRASHES)
 *   DIR itself      flock()ed by the process that has it open (-EBUSY,
 *                   after waiting 5 s for a daemon still exiting)
 *
 * SLOT STATES
 *
 *             cache_put(): popped from free_slots, or the LRU block
 *             evicted (its records deleted) -- txn 1, committed
 *     FREE  ------------------------------------------------> WRITING
 *      ^                                                         |
 *      |   put failed, or lost a race (another put of the same   |
 *      +-- block, the version changed meanwhile): back to free --+
 *      |                                                         |
 *      |       pwrite of the bytes, then txn 2 commits the       |
 *      |       block, slot and lru records                       v
 *      +---- drop_block(): eviction, stale version, ------- CACHED
 *            cache_invalidate(), a smaller bound at open
 *
 *   WRITING lives in memory only (c->writing counts it): after a crash the
 *   slot is neither in `slots` nor in free_slots, and open finds it free.
 *
 * INVARIANTS (cache_assert_sane() checks 1-5)
 *
 *  1. Every block record names a slot < nslots whose slot record names the
 *     block back with the same gen and len; every slot record has its
 *     block record and exactly one lru record (lru[slot.lru] = slot); lru
 *     holds nothing else.
 *  2. A slot is in exactly one state: CACHED (a slot record), FREE (in
 *     free_slots) or WRITING (counted in c->writing):
 *     blocks + nfree + writing == nslots.
 *  3. c->bytes and c->blocks are the sums over the slot records; bytes <=
 *     nslots * block_size <= max_bytes: the bound holds.
 *  4. Every block record's file has a files record; its length is
 *     min(block_size, files.size - index * block_size) > 0.
 *  5. gens and lru seqs are below next_seq and unique.
 *  6. A block record exists only after all the bytes of its slot were
 *     written (txn 2 follows the pwrite), and is deleted (committed) before
 *     its slot is written again (eviction in txn 1 precedes the pwrite).
 *     So whatever a process crash leaves, every record names complete
 *     bytes.
 *  7. A reader copies a block's bytes outside any lock and then checks in
 *     a new read transaction that the block record still names the same
 *     slot and gen (a seqlock): by 6, the slot cannot have been written
 *     between the two lookups, since its record would have gone first.
 *  8. A pinned slot is not written: a put waits, before it writes its
 *     slot, until no pin names it. cache_pin() pins the slots it looked
 *     up and then checks, as in 7, that the records still name them: a
 *     put whose eviction committed before that check is seen there (the
 *     pin fails), one that committed after it finds the pin and waits.
 *     So the bytes of a pinned block stay as they were while the caller
 *     hands the slab's pages on (splice) without copying them.
 *
 * TRANSACTIONS
 *
 *   Every write transaction runs under c->wlock (and LMDB's writer lock
 *   inside it), is short (a few records; dropping a file's blocks scans
 *   just that file), and never spans slab I/O. The in-memory state
 *   protected by wlock (free slots, sums) changes only once the
 *   transaction committed (struct wtx collects the changes). Reads use
 *   their own read transactions (MDB_NOTLS: any thread) and run in
 *   parallel with the writer.
 *
 *   A hit moves the block to the young end of lru (one write
 *   transaction per cache_read(), for all its blocks) unless it is
 *   already among the youngest nslots/8 seqs: approximate LRU, so hot
 *   reads rarely write.
 *
 * CRASHES
 *
 *   The environment is MDB_NOSYNC: commits reach the OS page cache, not
 *   the disk. A killed process loses nothing the OS has (invariant 6
 *   holds in the page cache). A system crash can leave the index ahead of
 *   the slab, or a torn LMDB: so DIR/open holds the boot id while open
 *   (written and synced at open, removed at close after the slab and the
 *   index are synced); an open that finds DIR/open from another boot
 *   discards the index and the slab and starts empty.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cache_i.h"
#include "log.h"
#include "sys.h"

#define CACHE_MAX_DBS 8
#define CACHE_MAX_READERS 512

static _Thread_local char errmsg[512];

static void set_errmsg(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
static void set_errmsg(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errmsg, sizeof(errmsg), fmt, ap);
	va_end(ap);
}

const char *cache_errmsg(void)
{
	return errmsg[0] ? errmsg : "no error";
}

/* --- errors and keys ------------------------------------------------------ */

int cache_err_from_mdb(int rc)
{
	if (rc == MDB_SUCCESS)
		return 0;
	if (rc == MDB_NOTFOUND)
		return -ENOENT;
	if (rc == MDB_MAP_FULL || rc == MDB_TXN_FULL)
		return -ENOSPC;
	if (rc > 0)
		return -rc;
	return -EIO;
}

static void put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--) {
		p[i] = (uint8_t)v;
		v >>= 8;
	}
}

void cache_key_block(uint8_t out[24], uint64_t dev, uint64_t ino,
		     uint64_t index)
{
	put_be64(out, dev);
	put_be64(out + 8, ino);
	put_be64(out + 16, index);
}

void cache_key_file(uint8_t out[16], uint64_t dev, uint64_t ino)
{
	put_be64(out, dev);
	put_be64(out + 8, ino);
}

static void file_rec_of(struct cache_file_rec *r, const struct cache_key *k)
{
	memset(r, 0, sizeof(*r));
	r->size = k->size;
	r->mtime_sec = k->mtime.tv_sec;
	r->mtime_nsec = k->mtime.tv_nsec;
	r->ctime_sec = k->ctime.tv_sec;
	r->ctime_nsec = k->ctime.tv_nsec;
}

/* The expected length of block @index of a file of @size, 0 past its end */
static uint64_t block_len(const struct cache *c, uint64_t size, uint64_t index)
{
	uint64_t start = index * c->block_size;

	if (index > UINT64_MAX / c->block_size || start >= size)
		return 0;
	return size - start < c->block_size ? size - start : c->block_size;
}

/* --- write transactions ----------------------------------------------------- */

/* A write transaction and the in-memory changes it makes once committed. */
struct wtx {
	MDB_txn *txn;
	uint64_t freed[64]; /* slots to push on free_slots */
	unsigned int nfreed;
	int64_t dbytes, dblocks;
	uint64_t evicted, invalidated;
};

static int wtx_begin(struct cache *c, struct wtx *w)
{
	int rc;

	memset(w, 0, sizeof(*w));
	pthread_mutex_lock(&c->wlock);
	rc = mdb_txn_begin(c->env, NULL, 0, &w->txn);
	if (rc) {
		pthread_mutex_unlock(&c->wlock);
		LOG_ERR("cache '%s': cannot begin a transaction: %s", c->dir,
			mdb_strerror(rc));
		return cache_err_from_mdb(rc);
	}
	return 0;
}

static void push_free(struct cache *c, uint64_t slot)
{
	c->free_slots[c->nfree++] = slot;
}

/* Commit (if @rc is 0) or abort, apply the in-memory changes, unlock.
 * Returns the commit's error or @rc. */
static int wtx_end(struct cache *c, struct wtx *w, int rc)
{
	if (!rc) {
		rc = mdb_txn_commit(w->txn);
		if (rc) {
			LOG_ERR("cache '%s': cannot commit: %s", c->dir,
				mdb_strerror(rc));
			rc = cache_err_from_mdb(rc);
		}
	} else {
		mdb_txn_abort(w->txn);
	}
	if (!rc) {
		for (unsigned int i = 0; i < w->nfreed; i++)
			push_free(c, w->freed[i]);
		c->bytes = (uint64_t)((int64_t)c->bytes + w->dbytes);
		c->blocks = (uint64_t)((int64_t)c->blocks + w->dblocks);
		atomic_fetch_add(&c->evictions, w->evicted);
		atomic_fetch_add(&c->invalidations, w->invalidated);
	}
	pthread_mutex_unlock(&c->wlock);
	return rc;
}

static int mdbe(int rc)
{
	return cache_err_from_mdb(rc);
}

/* Delete the records of the block in @slot (its slot record @s); the slot
 * is freed at commit unless @keep (the caller reuses it). */
static int drop_block(struct cache *c, struct wtx *w, uint64_t slot,
		      const struct cache_slot_rec *s, bool keep)
{
	uint8_t kb[24];
	size_t sk = (size_t)slot, lk = (size_t)s->lru;
	MDB_val k = { sizeof(kb), kb };
	MDB_val ks = { sizeof(sk), &sk }, kl = { sizeof(lk), &lk };
	int rc;

	cache_key_block(kb, s->dev, s->ino, s->index);
	rc = mdb_del(w->txn, c->db_blocks, &k, NULL);
	if (!rc)
		rc = mdb_del(w->txn, c->db_lru, &kl, NULL);
	if (!rc)
		rc = mdb_del(w->txn, c->db_slots, &ks, NULL);
	if (rc) {
		LOG_ERR("cache '%s': cannot drop slot %" PRIu64 ": %s", c->dir,
			slot, mdb_strerror(rc));
		return mdbe(rc);
	}
	w->dbytes -= s->len;
	w->dblocks--;
	if (!keep) {
		if (w->nfreed == sizeof(w->freed) / sizeof(w->freed[0]))
			BUG("cache: more than %u slots freed in a transaction",
			    w->nfreed);
		w->freed[w->nfreed++] = slot;
	}
	return 0;
}

static int get_slot(struct cache *c, MDB_txn *txn, uint64_t slot,
		    struct cache_slot_rec *s)
{
	size_t sk = (size_t)slot;
	MDB_val k = { sizeof(sk), &sk }, v;
	int rc = mdb_get(txn, c->db_slots, &k, &v);

	if (rc)
		return mdbe(rc);
	if (v.mv_size != sizeof(*s))
		return -EIO;
	memcpy(s, v.mv_data, sizeof(*s));
	return 0;
}

static int get_block(struct cache *c, MDB_txn *txn, const uint8_t kb[24],
		     struct cache_block_rec *b)
{
	MDB_val k = { 24, (void *)kb }, v;
	int rc = mdb_get(txn, c->db_blocks, &k, &v);

	if (rc)
		return mdbe(rc);
	if (v.mv_size != sizeof(*b))
		return -EIO;
	memcpy(b, v.mv_data, sizeof(*b));
	return 0;
}

/*
 * Drop the blocks of (dev, ino), as many as w->freed holds (64): sets
 * *more if blocks remain; set_version() goes on in a new transaction, so
 * no write transaction grows with the size of a file.
 */
static int drop_file_some(struct cache *c, struct wtx *w, uint64_t dev,
			  uint64_t ino, bool *more)
{
	uint8_t kb[24];
	MDB_val k = { sizeof(kb), kb }, v;
	MDB_cursor *cur;
	int rc;

	*more = false;
	cache_key_block(kb, dev, ino, 0);
	rc = mdb_cursor_open(w->txn, c->db_blocks, &cur);
	if (rc)
		return mdbe(rc);
	rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	while (!rc) {
		struct cache_block_rec b;
		struct cache_slot_rec s;
		uint8_t pfx[16];

		cache_key_file(pfx, dev, ino);
		if (k.mv_size != 24 || memcmp(k.mv_data, pfx, 16))
			break;
		if (w->nfreed == sizeof(w->freed) / sizeof(w->freed[0])) {
			*more = true;
			break;
		}
		memcpy(&b, v.mv_data, sizeof(b));
		rc = get_slot(c, w->txn, b.slot, &s);
		if (!rc)
			rc = drop_block(c, w, b.slot, &s, false);
		if (rc)
			break;
		w->invalidated++;
		/* drop_block deleted the record under the cursor: look
		 * again from the same key */
		k.mv_size = sizeof(kb);
		k.mv_data = kb;
		rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc > 0 ? mdbe(rc) : rc;
}

/* Make @k the stored version of its file (k NULL: forget the file),
 * dropping the blocks of another version. Runs its own transactions. */
static int set_version(struct cache *c, const struct cache_key *k,
		       uint64_t dev, uint64_t ino)
{
	struct cache_file_rec want, have;
	uint8_t kf[16];
	MDB_val key = { sizeof(kf), kf }, v;
	bool more = true;
	struct wtx w;
	int rc;

	cache_key_file(kf, dev, ino);
	if (k)
		file_rec_of(&want, k);
	while (more) {
		rc = wtx_begin(c, &w);
		if (rc)
			return rc;
		rc = mdb_get(w.txn, c->db_files, &key, &v);
		more = false;
		if (!rc && k && v.mv_size == sizeof(have)) {
			memcpy(&have, v.mv_data, sizeof(have));
			if (!memcmp(&have, &want, sizeof(have))) {
				mdb_txn_abort(w.txn);
				pthread_mutex_unlock(&c->wlock);
				return 0;
			}
		}
		if (!rc)
			rc = drop_file_some(c, &w, dev, ino, &more);
		else if (rc == MDB_NOTFOUND)
			rc = 0;
		else
			rc = mdbe(rc);
		if (!rc && !more) {
			if (k) {
				v.mv_size = sizeof(want);
				v.mv_data = &want;
				rc = mdbe(mdb_put(w.txn, c->db_files, &key, &v,
						  0));
			} else {
				rc = mdb_del(w.txn, c->db_files, &key, NULL);
				rc = rc == MDB_NOTFOUND ? 0 : mdbe(rc);
			}
		}
		rc = wtx_end(c, &w, rc);
		if (rc)
			return rc;
	}
	return 0;
}

/* 1 if @k is the stored version, 0 if none is stored, -ESTALE if another
 * one is, or -errno. */
static int check_version(struct cache *c, MDB_txn *txn,
			 const struct cache_key *k)
{
	struct cache_file_rec want;
	uint8_t kf[16];
	MDB_val key = { sizeof(kf), kf }, v;
	int rc;

	cache_key_file(kf, k->dev, k->ino);
	rc = mdb_get(txn, c->db_files, &key, &v);
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return mdbe(rc);
	file_rec_of(&want, k);
	if (v.mv_size != sizeof(want) || memcmp(v.mv_data, &want, sizeof(want)))
		return -ESTALE;
	return 1;
}

static int rtx_begin(struct cache *c, MDB_txn **txn)
{
	int rc = mdb_txn_begin(c->env, NULL, MDB_RDONLY, txn);

	if (rc)
		LOG_ERR("cache '%s': cannot begin a read transaction: %s",
			c->dir, mdb_strerror(rc));
	return mdbe(rc);
}

/* --- put -------------------------------------------------------------------- */

/* Txn 1 of a put: the block is not cached; take a slot for it (FREE ->
 * WRITING), evicting the LRU block if none is free. *slot = UINT64_MAX if
 * the block turned out to be cached (or the version changed) already. */
static int put_reserve(struct cache *c, const struct cache_key *k,
		       const uint8_t kb[24], uint64_t *slot, uint64_t *gen)
{
	struct cache_block_rec b;
	struct wtx w;
	int rc;

	*slot = UINT64_MAX;
	rc = wtx_begin(c, &w);
	if (rc)
		return rc;
	rc = check_version(c, w.txn, k);
	if (rc < 0) {
		/* changed since set_version(): the newest caller wins */
		return wtx_end(c, &w, rc == -ESTALE ? 0 : rc);
	}
	rc = get_block(c, w.txn, kb, &b);
	if (!rc)
		return wtx_end(c, &w, 0); /* cached already */
	if (rc != -ENOENT)
		return wtx_end(c, &w, rc);
	rc = 0;
	if (c->nfree) {
		*slot = c->free_slots[c->nfree - 1];
	} else {
		MDB_cursor *cur;
		MDB_val key, v;
		struct cache_slot_rec s;

		rc = mdbe(mdb_cursor_open(w.txn, c->db_lru, &cur));
		if (rc)
			return wtx_end(c, &w, rc);
		rc = mdb_cursor_get(cur, &key, &v, MDB_FIRST);
		mdb_cursor_close(cur);
		if (rc == MDB_NOTFOUND)
			return wtx_end(c, &w, -EAGAIN); /* all WRITING */
		if (rc)
			return wtx_end(c, &w, mdbe(rc));
		memcpy(slot, v.mv_data, sizeof(*slot));
		rc = get_slot(c, w.txn, *slot, &s);
		if (!rc)
			rc = drop_block(c, &w, *slot, &s, true);
		w.evicted = 1;
	}
	*gen = atomic_fetch_add(&c->next_seq, 1);
	if (rc) {
		*slot = UINT64_MAX;
		return wtx_end(c, &w, rc);
	}
	rc = mdb_txn_commit(w.txn);
	if (rc) {
		LOG_ERR("cache '%s': cannot commit: %s", c->dir,
			mdb_strerror(rc));
		*slot = UINT64_MAX;
		pthread_mutex_unlock(&c->wlock);
		return mdbe(rc);
	}
	if (c->nfree && c->free_slots[c->nfree - 1] == *slot)
		c->nfree--;
	c->bytes = (uint64_t)((int64_t)c->bytes + w.dbytes);
	c->blocks = (uint64_t)((int64_t)c->blocks + w.dblocks);
	atomic_fetch_add(&c->evictions, w.evicted);
	c->writing++;
	pthread_mutex_unlock(&c->wlock);
	return 0;
}

/* Txn 2 of a put: the bytes are in @slot; record them (WRITING -> CACHED),
 * or give the slot back if the block or another version won meanwhile. */
static int put_commit(struct cache *c, const struct cache_key *k,
		      const uint8_t kb[24], uint64_t index, uint64_t slot,
		      uint64_t gen, size_t len, bool ok)
{
	struct cache_block_rec b;
	struct cache_slot_rec s;
	size_t sk = (size_t)slot, lk = (size_t)gen;
	MDB_val key, v;
	struct wtx w;
	int rc, vr;

	rc = wtx_begin(c, &w);
	if (rc) {
		/* cannot record it: the slot is free again (in memory) */
		pthread_mutex_lock(&c->wlock);
		c->writing--;
		push_free(c, slot);
		pthread_mutex_unlock(&c->wlock);
		return rc;
	}
	c->writing--;
	vr = ok ? check_version(c, w.txn, k) : 0;
	if (vr == 1 && get_block(c, w.txn, kb, &b) == -ENOENT) {
		memset(&b, 0, sizeof(b));
		b.slot = slot;
		b.gen = gen;
		b.len = (uint32_t)len;
		memset(&s, 0, sizeof(s));
		s.dev = k->dev;
		s.ino = k->ino;
		s.index = index;
		s.gen = gen;
		s.lru = gen;
		s.len = (uint32_t)len;
		key.mv_size = 24;
		key.mv_data = (void *)kb;
		v.mv_size = sizeof(b);
		v.mv_data = &b;
		rc = mdb_put(w.txn, c->db_blocks, &key, &v, 0);
		key.mv_size = sizeof(sk);
		key.mv_data = &sk;
		v.mv_size = sizeof(s);
		v.mv_data = &s;
		if (!rc)
			rc = mdb_put(w.txn, c->db_slots, &key, &v, 0);
		key.mv_size = sizeof(lk);
		key.mv_data = &lk;
		v.mv_size = sizeof(slot);
		v.mv_data = &slot;
		if (!rc)
			rc = mdb_put(w.txn, c->db_lru, &key, &v, 0);
		if (!rc) {
			w.dbytes += (int64_t)len;
			w.dblocks++;
			rc = wtx_end(c, &w, 0);
			if (!rc)
				return 0;
			goto give_back; /* the commit failed */
		}
		rc = mdbe(rc);
	} else {
		rc = vr < 0 && vr != -ESTALE ? vr : 0; /* lost a race: fine */
	}
	/* not recorded: the slot is free again */
	mdb_txn_abort(w.txn);
	push_free(c, slot);
	pthread_mutex_unlock(&c->wlock);
	return rc;
give_back:
	pthread_mutex_lock(&c->wlock);
	push_free(c, slot);
	pthread_mutex_unlock(&c->wlock);
	return rc;
}

/* --- pins (invariant 8) ------------------------------------------------------ */

static bool pinned(const struct cache *c, uint64_t slot)
{
	for (size_t i = 0; i < c->npins; i++)
		if (c->pins[i] == slot)
			return true;
	return false;
}

/* Wait until no pin names @slot (pins last one reply each). */
static void pin_wait(struct cache *c, uint64_t slot)
{
	pthread_mutex_lock(&c->pinlock);
	while (pinned(c, slot))
		pthread_cond_wait(&c->unpinned, &c->pinlock);
	pthread_mutex_unlock(&c->pinlock);
}

static int pins_add(struct cache *c, const struct cache_pin *p)
{
	int rc = 0;

	pthread_mutex_lock(&c->pinlock);
	if (c->npins + p->n > c->pincap) {
		size_t cap = (c->npins + p->n) * 2;
		uint64_t *np = realloc(c->pins, cap * sizeof(*np));

		if (np) {
			c->pins = np;
			c->pincap = cap;
		} else {
			rc = -ENOMEM;
		}
	}
	for (unsigned int i = 0; !rc && i < p->n; i++)
		c->pins[c->npins++] = p->s[i].slot;
	pthread_mutex_unlock(&c->pinlock);
	return rc;
}

void cache_unpin(struct cache *c, struct cache_pin *p)
{
	pthread_mutex_lock(&c->pinlock);
	for (unsigned int i = 0; i < p->n; i++) {
		for (size_t j = 0; j < c->npins; j++) {
			if (c->pins[j] == p->s[i].slot) {
				c->pins[j] = c->pins[--c->npins];
				break;
			}
		}
	}
	pthread_cond_broadcast(&c->unpinned);
	pthread_mutex_unlock(&c->pinlock);
	p->n = 0;
}

/* Copy @len bytes at @off of @fd to @at of the slab through a pipe:
 * splice() takes the source's page-cache pages by reference, so a block
 * is copied once (into the slab), not twice (out to a buffer and back).
 * Returns 0, -ESTALE if @fd has fewer bytes, or -errno. */
static int splice_in(struct cache *c, int fd, off_t off, size_t len, off_t at)
{
	int p[2], rc = 0;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	(void)fcntl(p[1], F_SETPIPE_SZ, (int)c->block_size); /* fewer calls */
	while (len && !rc) {
		ssize_t in = splice(fd, &off, p[1], NULL, len, SPLICE_F_MOVE);

		if (in <= 0) {
			rc = in == 0 ? -ESTALE : -errno;
			if (rc == -EINTR)
				rc = 0;
			continue;
		}
		len -= (size_t)in;
		while (in > 0 && !rc) {
			ssize_t out = splice(p[0], NULL, c->slabfd, &at,
					     (size_t)in, SPLICE_F_MOVE);

			if (out > 0)
				in -= out;
			else if (out == 0)
				rc = -EIO;
			else if (errno != EINTR)
				rc = -errno;
		}
	}
	close(p[0]);
	close(p[1]);
	return rc;
}

/* A put whose bytes come from @buf, or else from @fd at @off. */
static int put(struct cache *c, const struct cache_key *k, uint64_t index,
	       const void *buf, int fd, off_t off, size_t len)
{
	uint64_t slot, gen;
	uint8_t kb[24];
	off_t at;
	int rc, wr;

	if (!len || len != block_len(c, k->size, index))
		return -EINVAL;
	rc = set_version(c, k, k->dev, k->ino);
	if (rc)
		return rc;
	cache_key_block(kb, k->dev, k->ino, index);
	rc = put_reserve(c, k, kb, &slot, &gen);
	if (rc || slot == UINT64_MAX)
		return rc;
	/* WRITING: no record names the slot, no lock is held */
	pin_wait(c, slot);
	at = (off_t)(slot * c->block_size);
	if (buf) {
		ssize_t n = sys_pwrite_all(c->slabfd, buf, len, at);

		wr = n < 0 ? (int)n : 0;
	} else {
		wr = splice_in(c, fd, off, len, at);
	}
	if (wr && wr != -ESTALE)
		LOG_ERR("cache '%s': cannot write slot %" PRIu64 ": %s", c->dir,
			slot, strerror(-wr));
	rc = put_commit(c, k, kb, index, slot, gen, len, wr == 0);
	if (wr)
		return wr;
	if (!rc)
		atomic_fetch_add(&c->put_bytes, len);
	return rc;
}

int cache_put(struct cache *c, const struct cache_key *k, uint64_t index,
	      const void *buf, size_t len)
{
	return put(c, k, index, buf, -1, 0, len);
}

int cache_put_fd(struct cache *c, const struct cache_key *k, uint64_t index,
		 int fd, off_t off, size_t len)
{
	return put(c, k, index, NULL, fd, off, len);
}

/* --- read ------------------------------------------------------------------- */

struct rd_block {
	uint64_t slot, gen, lru;
	uint32_t len;
	bool found;
};

/* Move the blocks served (@rb, @n) to the young end of lru. */
static void touch(struct cache *c, const struct cache_key *k, uint64_t first,
		  struct rd_block *rb, const bool *have, size_t n)
{
	uint64_t young = c->nslots / 8, seq = atomic_load(&c->next_seq);
	bool any = false;
	struct wtx w;
	int rc;

	for (size_t i = 0; i < n; i++)
		if (have[i] && rb[i].found && seq - rb[i].lru > young)
			any = true;
	if (!any || wtx_begin(c, &w))
		return;
	rc = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		struct cache_block_rec b;
		struct cache_slot_rec s;
		uint8_t kb[24];
		size_t lk, sk;
		MDB_val key, v;

		if (!have[i] || !rb[i].found)
			continue;
		cache_key_block(kb, k->dev, k->ino, first + i);
		if (get_block(c, w.txn, kb, &b) || b.gen != rb[i].gen ||
		    get_slot(c, w.txn, b.slot, &s))
			continue; /* gone meanwhile */
		lk = (size_t)s.lru;
		key.mv_size = sizeof(lk);
		key.mv_data = &lk;
		rc = mdb_del(w.txn, c->db_lru, &key, NULL);
		s.lru = atomic_fetch_add(&c->next_seq, 1);
		lk = (size_t)s.lru;
		v.mv_size = sizeof(b.slot);
		v.mv_data = &b.slot;
		if (!rc)
			rc = mdb_put(w.txn, c->db_lru, &key, &v, 0);
		sk = (size_t)b.slot;
		key.mv_size = sizeof(sk);
		key.mv_data = &sk;
		v.mv_size = sizeof(s);
		v.mv_data = &s;
		if (!rc)
			rc = mdb_put(w.txn, c->db_slots, &key, &v, 0);
	}
	wtx_end(c, &w, mdbe(rc)); /* a lost touch only ages a block */
}

/* The seqlock check (invariants 7 and 8): do the records of the blocks
 * found (@rb, @n from block @first) still name the same slot and gen?
 * Those that do get their lru seq, the others lose found. */
static int recheck(struct cache *c, const struct cache_key *k, uint64_t first,
		   struct rd_block *rb, uint64_t n)
{
	MDB_txn *txn;
	int rc = rtx_begin(c, &txn);

	if (rc)
		return rc;
	for (uint64_t i = 0; i < n; i++) {
		struct cache_block_rec b;
		struct cache_slot_rec s;
		uint8_t kb[24];

		if (!rb[i].found)
			continue;
		cache_key_block(kb, k->dev, k->ino, first + i);
		if (get_block(c, txn, kb, &b) || b.slot != rb[i].slot ||
		    b.gen != rb[i].gen || get_slot(c, txn, b.slot, &s))
			rb[i].found = false;
		else
			rb[i].lru = s.lru;
	}
	mdb_txn_abort(txn);
	return 0;
}

int cache_read(struct cache *c, const struct cache_key *k, void *buf,
	       size_t len, off_t off, bool *have)
{
	uint64_t bs = c->block_size, first, n, hits = 0, hit_bytes = 0;
	uint64_t end;
	struct rd_block rb_small[16], *rb = rb_small;
	MDB_txn *txn;
	int rc, vr;

	if (off < 0 || (uint64_t)off > UINT64_MAX - len)
		return -EINVAL;
	if (!len)
		return 0;
	end = (uint64_t)off + len;
	first = (uint64_t)off / bs;
	n = (end - 1) / bs - first + 1;
	if (n > sizeof(rb_small) / sizeof(rb_small[0])) {
		rb = calloc(n, sizeof(*rb));
		if (!rb)
			return -ENOMEM;
	} else {
		memset(rb, 0, sizeof(rb_small));
	}

	rc = rtx_begin(c, &txn);
	if (rc)
		goto out_free;
	vr = check_version(c, txn, k);
	for (uint64_t i = 0; i < n && vr >= 0; i++) {
		uint64_t idx = first + i, blen = block_len(c, k->size, idx);
		struct cache_block_rec b;
		uint8_t kb[24];

		have[i] = false;
		if (!blen || vr == 0)
			continue;
		cache_key_block(kb, k->dev, k->ino, idx);
		rc = get_block(c, txn, kb, &b);
		if (rc == -ENOENT)
			continue;
		if (rc)
			break;
		if (b.len != blen)
			continue; /* cannot be (invariant 4) */
		rb[i].found = true;
		rb[i].slot = b.slot;
		rb[i].gen = b.gen;
	}
	mdb_txn_abort(txn);
	if (vr < 0 && vr != -ESTALE) {
		rc = vr;
		goto out_free;
	}
	if (rc && rc != -ENOENT)
		goto out_free;
	rc = 0;
	if (vr == -ESTALE) {
		/* another version: drop the old one's blocks, serve nothing */
		rc = set_version(c, k, k->dev, k->ino);
		if (rc)
			goto out_free;
	}

	/* copy outside any transaction or lock (invariant 7) */
	for (uint64_t i = 0; i < n; i++) {
		uint64_t idx = first + i, bstart = idx * bs;
		uint64_t blen = block_len(c, k->size, idx);
		uint64_t from = (uint64_t)off > bstart ? (uint64_t)off : bstart;
		uint64_t to = end < bstart + bs ? end : bstart + bs;
		char *dst = (char *)buf + (from - (uint64_t)off);

		if (!blen) { /* past the end of the file */
			memset(dst, 0, to - from);
			have[i] = true;
			continue;
		}
		have[i] = false;
		if (!rb[i].found)
			continue;
		if (to > bstart + blen) {
			memset(dst + (bstart + blen - from), 0,
			       to - (bstart + blen));
		}
		if (from < bstart + blen) {
			uint64_t cnt = (to < bstart + blen ? to : bstart + blen) -
				       from;
			ssize_t got = sys_pread_all(
				c->slabfd, dst, cnt,
				(off_t)(rb[i].slot * bs + (from - bstart)));

			if (got != (ssize_t)cnt) {
				LOG_ERR("cache '%s': cannot read slot %" PRIu64
					": %s", c->dir, rb[i].slot,
					got < 0 ? strerror((int)-got) :
						  "short read");
				rb[i].found = false;
				continue;
			}
		}
		have[i] = true;
	}

	rc = recheck(c, k, first, rb, n);
	if (rc)
		goto out_free;
	for (uint64_t i = 0; i < n; i++)
		if (!rb[i].found && block_len(c, k->size, first + i))
			have[i] = false; /* its slot changed meanwhile */

	for (uint64_t i = 0; i < n; i++) {
		uint64_t idx = first + i, bstart = idx * bs;
		uint64_t from = (uint64_t)off > bstart ? (uint64_t)off : bstart;
		uint64_t to = end < bstart + bs ? end : bstart + bs;

		if (!block_len(c, k->size, idx))
			continue;
		if (have[i]) {
			hits++;
			hit_bytes += to - from;
		}
	}
	atomic_fetch_add(&c->hits, hits);
	atomic_fetch_add(&c->hit_bytes, hit_bytes);
	{
		uint64_t inside = 0;

		for (uint64_t i = 0; i < n; i++)
			if (block_len(c, k->size, first + i))
				inside++;
		atomic_fetch_add(&c->misses, inside - hits);
	}
	if (hits)
		touch(c, k, first, rb, have, n);
out_free:
	if (rb != rb_small)
		free(rb);
	return rc;
}

int cache_pin(struct cache *c, const struct cache_key *k, off_t off,
	      size_t len, struct cache_pin *p)
{
	uint64_t bs = c->block_size, first, n, end;
	struct rd_block rb[CACHE_PIN_MAX];
	bool have[CACHE_PIN_MAX];
	MDB_txn *txn;
	int rc = 0;

	p->n = 0;
	p->fd = c->slabfd;
	if (off < 0 || !len || (uint64_t)off > k->size ||
	    len > k->size - (uint64_t)off)
		return -EINVAL;
	end = (uint64_t)off + len;
	first = (uint64_t)off / bs;
	n = (end - 1) / bs - first + 1;
	if (n > CACHE_PIN_MAX)
		return -E2BIG;
	memset(rb, 0, sizeof(rb));
	/* look up */
	rc = rtx_begin(c, &txn);
	if (rc)
		return rc;
	rc = check_version(c, txn, k) == 1 ? 0 : -ENOENT;
	for (uint64_t i = 0; i < n && !rc; i++) {
		struct cache_block_rec b;
		uint8_t kb[24];

		cache_key_block(kb, k->dev, k->ino, first + i);
		rc = get_block(c, txn, kb, &b);
		if (rc)
			break;
		if (b.len != block_len(c, k->size, first + i))
			rc = -ENOENT; /* cannot be (invariant 4) */
		rb[i].slot = b.slot;
		rb[i].gen = b.gen;
		rb[i].found = true;
		have[i] = true;
	}
	mdb_txn_abort(txn);
	if (rc)
		return rc;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t bstart = (first + i) * bs;
		uint64_t from = (uint64_t)off > bstart ? (uint64_t)off : bstart;
		uint64_t to = end < bstart + bs ? end : bstart + bs;

		p->s[i].slot = rb[i].slot;
		p->s[i].off = (off_t)(rb[i].slot * bs + (from - bstart));
		p->s[i].len = (size_t)(to - from);
	}
	p->n = (unsigned int)n;
	rc = pins_add(c, p);
	if (rc) {
		p->n = 0;
		return rc;
	}
	/* still the same records? (invariant 8) */
	rc = recheck(c, k, first, rb, n);
	for (uint64_t i = 0; i < n && !rc; i++)
		if (!rb[i].found)
			rc = -ENOENT;
	if (rc) {
		cache_unpin(c, p);
		return rc;
	}
	atomic_fetch_add(&c->hits, n);
	atomic_fetch_add(&c->hit_bytes, len);
	touch(c, k, first, rb, have, n);
	return 0;
}

bool cache_has(struct cache *c, const struct cache_key *k, uint64_t index)
{
	struct cache_block_rec b;
	uint8_t kb[24];
	MDB_txn *txn;
	bool ok;

	if (!block_len(c, k->size, index) || rtx_begin(c, &txn))
		return false;
	cache_key_block(kb, k->dev, k->ino, index);
	ok = check_version(c, txn, k) == 1 && !get_block(c, txn, kb, &b);
	mdb_txn_abort(txn);
	return ok;
}

int cache_invalidate(struct cache *c, uint64_t dev, uint64_t ino)
{
	return set_version(c, NULL, dev, ino);
}

uint32_t cache_block_size(const struct cache *c)
{
	return c->block_size;
}

void cache_stats(struct cache *c, struct cache_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&c->wlock);
	out->bytes = c->bytes;
	out->blocks = c->blocks;
	pthread_mutex_unlock(&c->wlock);
	out->max_bytes = c->nslots * c->block_size;
	out->hits = atomic_load(&c->hits);
	out->misses = atomic_load(&c->misses);
	out->hit_bytes = atomic_load(&c->hit_bytes);
	out->put_bytes = atomic_load(&c->put_bytes);
	out->evictions = atomic_load(&c->evictions);
	out->invalidations = atomic_load(&c->invalidations);
}

/* --- open and close ---------------------------------------------------------- */

static bool mdb_is_corrupt(int rc)
{
	return rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH ||
	       rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND ||
	       rc == MDB_INCOMPATIBLE || rc == MDB_BAD_DBI;
}

/* A raw LMDB code met while opening: -EPROTO for a corrupted or foreign
 * file, else the mapped error; sets errmsg. */
static int open_err(struct cache *c, int rc, const char *what)
{
	if (mdb_is_corrupt(rc)) {
		set_errmsg("cache '%s' is corrupted or not a ferryfs cache: "
			   "%s: %s", c->dir, what, mdb_strerror(rc));
		return -EPROTO;
	}
	set_errmsg("cannot open cache '%s': %s: %s", c->dir, what,
		   mdb_strerror(rc));
	return mdbe(rc);
}

static void boot_id(char out[64])
{
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, out, 63);

	if (fd >= 0)
		close(fd);
	out[n > 0 ? n : 0] = 0;
}

/* A system crash while the cache was open: start empty. Process crashes
 * (same boot) keep everything (CRASHES). */
static int check_crash(struct cache *c)
{
	char was[64], now[64];
	int fd, rc = 0;
	ssize_t n;

	fd = openat(c->dirfd, "open", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	n = read(fd, was, sizeof(was) - 1);
	close(fd);
	was[n > 0 ? n : 0] = 0;
	boot_id(now);
	if (!strcmp(was, now))
		return 0;
	LOG_WARN("cache '%s' was open when the system went down: discarding "
		 "it", c->dir);
	if (unlinkat(c->dirfd, "index.mdb/data.mdb", 0) < 0 && errno != ENOENT)
		rc = -errno;
	if (unlinkat(c->dirfd, "index.mdb/lock.mdb", 0) < 0 && errno != ENOENT)
		rc = -errno;
	if (unlinkat(c->dirfd, "blocks", 0) < 0 && errno != ENOENT)
		rc = -errno;
	if (rc)
		set_errmsg("cannot discard cache '%s': %s", c->dir,
			   strerror(-rc));
	return rc;
}

static int write_open_mark(struct cache *c)
{
	char id[64];
	int fd, rc = 0;

	boot_id(id);
	fd = openat(c->dirfd, "open.tmp", O_WRONLY | O_CREAT | O_TRUNC |
					      O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (sys_pwrite_all(fd, id, strlen(id), 0) < 0 || fsync(fd) < 0)
		rc = -EIO;
	close(fd);
	if (!rc && renameat(c->dirfd, "open.tmp", c->dirfd, "open") < 0)
		rc = -errno;
	if (!rc && fsync(c->dirfd) < 0)
		rc = -errno;
	if (rc)
		set_errmsg("cannot write '%s/open': %s", c->dir, strerror(-rc));
	return rc;
}

static int open_dir(struct cache *c)
{
	int rc;

	if (mkdir(c->dir, 0700) < 0 && errno != EEXIST) {
		rc = -errno;
		set_errmsg("cannot create cache directory '%s': %s", c->dir,
			   strerror(-rc));
		return rc;
	}
	c->dirfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->dirfd < 0) {
		rc = -errno;
		set_errmsg("cannot open cache '%s': %s", c->dir, strerror(-rc));
		return rc;
	}
	rc = sys_lock_wait(c->dirfd, SYS_LOCK_WAIT_MS);
	if (rc) {
		set_errmsg("cache '%s' is in use by another process", c->dir);
		return rc;
	}
	rc = check_crash(c);
	if (rc)
		return rc;
	if (mkdirat(c->dirfd, "index.mdb", 0700) < 0 && errno != EEXIST) {
		rc = -errno;
		set_errmsg("cannot create '%s/index.mdb': %s", c->dir,
			   strerror(-rc));
		return rc;
	}
	return 0;
}

/* Read or create meta; settle block_size and nslots. */
static int open_meta(struct cache *c, MDB_txn *txn,
		     const struct cache_config *cfg, bool *init)
{
	MDB_val k = { 4, "meta" }, v;
	struct cache_meta_rec m;
	uint32_t bs = cfg->block_size ? cfg->block_size : CACHE_DEFAULT_BLOCK;
	uint64_t want = cfg->max_bytes;
	int rc;

	rc = mdb_get(txn, c->db_meta, &k, &v);
	if (rc == MDB_NOTFOUND && *init) {
		struct statvfs sv;

		memset(&m, 0, sizeof(m));
		m.magic = CACHE_MAGIC;
		m.format = CACHE_FORMAT_VERSION;
		m.block_size = bs;
		if (!want) {
			if (fstatvfs(c->dirfd, &sv) < 0) {
				rc = -errno;
				set_errmsg("cannot statfs '%s': %s", c->dir,
					   strerror(-rc));
				return rc;
			}
			want = (uint64_t)sv.f_bavail * sv.f_frsize / 10;
		}
	} else if (rc == MDB_NOTFOUND) {
		set_errmsg("not a ferryfs cache: '%s' has no meta record",
			   c->dir);
		return -EPROTO;
	} else if (rc) {
		return open_err(c, rc, "reading meta");
	} else {
		*init = false;
		memcpy(&m, v.mv_data,
		       v.mv_size < sizeof(m) ? v.mv_size : sizeof(m));
		if (v.mv_size != sizeof(m) || m.magic != CACHE_MAGIC) {
			set_errmsg("not a ferryfs cache: bad meta in '%s'",
				   c->dir);
			return -EPROTO;
		}
		if (m.format != CACHE_FORMAT_VERSION) {
			set_errmsg("cache '%s' has format %" PRIu32 ", this "
				   "ferryfs reads format %d", c->dir, m.format,
				   CACHE_FORMAT_VERSION);
			return -EPROTO;
		}
		if (m.block_size < CACHE_MIN_BLOCK ||
		    m.block_size > CACHE_MAX_BLOCK ||
		    (m.block_size & (m.block_size - 1)) || !m.nslots) {
			set_errmsg("cache '%s' has an invalid meta record",
				   c->dir);
			return -EPROTO;
		}
		if (!want)
			want = m.nslots * m.block_size;
	}
	if (want / m.block_size == 0) {
		set_errmsg("cache bound %" PRIu64 " is below one block (%" PRIu32
			   ")", want, m.block_size);
		return -EINVAL;
	}
	m.nslots = want / m.block_size;
	if (m.nslots > (UINT64_MAX >> 1) / m.block_size ||
	    m.nslots > SIZE_MAX / sizeof(uint64_t)) {
		set_errmsg("cache bound %" PRIu64 " too large", want);
		return -EINVAL;
	}
	c->block_size = m.block_size;
	c->nslots = m.nslots;
	v.mv_size = sizeof(m);
	v.mv_data = &m;
	rc = mdb_put(txn, c->db_meta, &k, &v, 0);
	return rc ? open_err(c, rc, "writing meta") : 0;
}

/* Drop blocks in slots past nslots (a smaller bound), rebuild the free
 * slots, the sums and next_seq from the records. */
static int open_scan(struct cache *c, MDB_txn *txn)
{
	uint8_t *used = calloc(c->nslots, 1);
	MDB_cursor *cur = NULL;
	MDB_val k, v;
	uint64_t next = 1;
	int rc;

	c->free_slots = malloc(c->nslots * sizeof(uint64_t));
	if (!used || !c->free_slots) {
		free(used);
		set_errmsg("out of memory");
		return -ENOMEM;
	}
	rc = mdb_cursor_open(txn, c->db_slots, &cur);
	/* a smaller bound: the blocks in slots past it go */
	while (!rc) {
		size_t from = (size_t)c->nslots;
		struct cache_slot_rec s;
		uint8_t kb[24];
		size_t lk;
		MDB_val kk = { sizeof(kb), kb }, kl = { sizeof(lk), &lk };

		k.mv_size = sizeof(from);
		k.mv_data = &from;
		rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
		if (rc)
			break;
		if (v.mv_size != sizeof(s)) {
			rc = MDB_CORRUPTED;
			break;
		}
		memcpy(&s, v.mv_data, sizeof(s));
		lk = (size_t)s.lru;
		cache_key_block(kb, s.dev, s.ino, s.index);
		rc = mdb_del(txn, c->db_blocks, &kk, NULL);
		if (!rc)
			rc = mdb_del(txn, c->db_lru, &kl, NULL);
		if (!rc)
			rc = mdb_cursor_del(cur, 0);
	}
	if (rc == MDB_NOTFOUND)
		rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
	while (!rc) {
		struct cache_slot_rec s;
		size_t slot;

		if (k.mv_size != sizeof(slot) || v.mv_size != sizeof(s)) {
			rc = MDB_CORRUPTED;
			break;
		}
		memcpy(&slot, k.mv_data, sizeof(slot));
		memcpy(&s, v.mv_data, sizeof(s));
		if (slot >= c->nslots) {
			rc = MDB_CORRUPTED;
			break;
		}
		used[slot] = 1;
		c->bytes += s.len;
		c->blocks++;
		if (s.lru >= next)
			next = s.lru + 1;
		if (s.gen >= next)
			next = s.gen + 1;
		rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
	}
	if (cur)
		mdb_cursor_close(cur);
	if (rc != MDB_NOTFOUND) {
		free(used);
		return open_err(c, rc, "scanning slots");
	}
	for (uint64_t i = c->nslots; i-- > 0;)
		if (!used[i])
			push_free(c, i);
	free(used);
	atomic_store(&c->next_seq, next);
	return 0;
}

static int open_env(struct cache *c, const struct cache_config *cfg)
{
	static const char *const names[] = { "meta", "blocks", "slots", "lru",
					     "files" };
	MDB_dbi *dbis[] = { &c->db_meta, &c->db_blocks, &c->db_slots,
			    &c->db_lru, &c->db_files };
	unsigned int dflags[] = { 0, 0, MDB_INTEGERKEY, MDB_INTEGERKEY, 0 };
	char path[PATH_MAX];
	MDB_txn *txn;
	MDB_stat st;
	bool init;
	int rc;

	if (snprintf(path, sizeof(path), "%s/index.mdb", c->dir) >=
	    (int)sizeof(path)) {
		set_errmsg("cache path '%s' too long", c->dir);
		return -ENAMETOOLONG;
	}
	rc = mdb_env_create(&c->env);
	if (!rc)
		rc = mdb_env_set_maxdbs(c->env, CACHE_MAX_DBS);
	if (!rc)
		rc = mdb_env_set_maxreaders(c->env, CACHE_MAX_READERS);
	if (!rc) /* sparse: records of ~300 bytes per block fit many times */
		rc = mdb_env_set_mapsize(c->env, (size_t)64 << 30);
	if (!rc)
		rc = mdb_env_open(c->env, path,
				  MDB_NOTLS | MDB_NOSYNC | MDB_NOMETASYNC,
				  0600);
	if (rc)
		return open_err(c, rc, path);
	mdb_reader_check(c->env, NULL); /* readers a killed process left */
	rc = mdb_txn_begin(c->env, NULL, 0, &txn);
	if (rc)
		return open_err(c, rc, "beginning a transaction");
	/* an empty environment is a new cache; anything else must be one */
	rc = mdb_stat(txn, 1 /* MAIN_DBI */, &st);
	if (rc) {
		mdb_txn_abort(txn);
		return open_err(c, rc, "reading the main database");
	}
	init = st.ms_entries == 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		rc = mdb_dbi_open(txn, names[i],
				  dflags[i] | (init ? MDB_CREATE : 0), dbis[i]);
		if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE) {
			set_errmsg("not a ferryfs cache: '%s' has no '%s' "
				   "database", c->dir, names[i]);
			mdb_txn_abort(txn);
			return -EPROTO;
		}
		if (rc) {
			mdb_txn_abort(txn);
			return open_err(c, rc, names[i]);
		}
	}
	rc = open_meta(c, txn, cfg, &init);
	if (!rc)
		rc = open_scan(c, txn);
	if (rc) {
		mdb_txn_abort(txn);
		return rc;
	}
	rc = mdb_txn_commit(txn);
	if (!rc)
		rc = mdb_env_sync(c->env, 1);
	return rc ? open_err(c, rc, "committing") : 0;
}

static int open_slab(struct cache *c)
{
	int rc;

	c->slabfd = openat(c->dirfd, "blocks", O_RDWR | O_CREAT | O_CLOEXEC,
			   0600);
	if (c->slabfd < 0 ||
	    ftruncate(c->slabfd, (off_t)(c->nslots * c->block_size)) < 0) {
		rc = -errno;
		set_errmsg("cannot open '%s/blocks': %s", c->dir,
			   strerror(-rc));
		return rc;
	}
	return 0;
}

int cache_open(const char *dir, const struct cache_config *cfg,
	       struct cache **out)
{
	static const struct cache_config dflt;
	struct cache *c;
	uint32_t bs;
	int rc;

	*out = NULL;
	errmsg[0] = 0;
	if (!cfg)
		cfg = &dflt;
	bs = cfg->block_size;
	if (!dir || (bs && (bs < CACHE_MIN_BLOCK || bs > CACHE_MAX_BLOCK ||
			    (bs & (bs - 1))))) {
		set_errmsg("cache block size %" PRIu32 " is not a power of two "
			   "in 64 KiB..16 MiB", bs);
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c || !(c->dir = strdup(dir))) {
		free(c);
		set_errmsg("out of memory");
		return -ENOMEM;
	}
	c->dirfd = c->slabfd = -1;
	pthread_mutex_init(&c->wlock, NULL);
	pthread_mutex_init(&c->pinlock, NULL);
	pthread_cond_init(&c->unpinned, NULL);
	rc = open_dir(c);
	if (!rc)
		rc = open_env(c, cfg);
	if (!rc)
		rc = open_slab(c);
	if (!rc)
		rc = write_open_mark(c);
	if (rc) {
		if (c->env)
			mdb_env_close(c->env);
		if (c->slabfd >= 0)
			close(c->slabfd);
		if (c->dirfd >= 0)
			close(c->dirfd);
		pthread_mutex_destroy(&c->wlock);
		free(c->free_slots);
		free(c->dir);
		free(c);
		return rc;
	}
	*out = c;
	return 0;
}

void cache_close(struct cache *c)
{
	int rc = 0;

	if (!c)
		return;
	if (fdatasync(c->slabfd) < 0)
		rc = -errno;
	if (!rc)
		rc = mdbe(mdb_env_sync(c->env, 1));
	/* the slab and the index are on disk: a system crash from here on
	 * leaves a consistent cache */
	if (!rc && unlinkat(c->dirfd, "open", 0) < 0)
		rc = -errno;
	if (!rc)
		fsync(c->dirfd);
	if (rc)
		LOG_ERR("cache '%s': cannot close cleanly: %s", c->dir,
			strerror(-rc));
	mdb_env_close(c->env);
	close(c->slabfd);
	close(c->dirfd); /* drops the flock */
	pthread_mutex_destroy(&c->wlock);
	pthread_mutex_destroy(&c->pinlock);
	pthread_cond_destroy(&c->unpinned);
	free(c->pins);
	free(c->free_slots);
	free(c->dir);
	free(c);
}
