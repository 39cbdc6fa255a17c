/*
 * data.c - staging files and chunk records (journal.h "data" and "the
 * flusher's side"; the chunk state diagram and invariants 1-5, 10, 11 are
 * in journal.c).
 *
 * A write is three steps: (1) with rw shared, decide from pend/committing
 * and then LMDB whether the chunks it touches are held and how many new
 * staging bytes it adds, and reserve them (or, if they do not fit, let go
 * of rw, wait for room and start again: room_wait()); (2) pwrite to
 * data/<id>; (3) record marks in the pending table (memory). The group
 * commit (journal.c) turns the marks into chunk records. A write that
 * reaches the end of a chunk starts the writeback of the chunks it ends
 * (sync_file_range(), no wait), so that the group commit's fdatasync has
 * little left to write: a big copy then costs the disk a steady stream
 * instead of a burst every JNL_COMMIT_MS that stalls every other sync on
 * the disk (measured on the NAS bench: the flush of 1 GiB through the
 * agent 9.31 s instead of 9.44, the `cp` 0.89 s instead of 1.10, medians
 * of 7). Fill, truncate,
 * clean and drop take rw exclusive, so "held" never changes under a
 * writer that has decided.
 *
 * Giving staging back (journal.c "SPACE", invariant 17). Records go in a
 * change (clean: all of a node's; drop_flushed(): full FLUSHED chunks
 * under pressure), their staging bytes later: jnl_gc_add() names them,
 * and after the change is durable jnl_gc_run() removes the file or punches
 * the chunks out, each only if nothing holds it again.
 *
 * Imported files and jnl_chunk_fill(). A chunk of an imported node holds
 * remote bytes in [0, rvalid). A write that covers such a chunk only in part
 * would leave zeros in staging where the remote has data, and the flusher
 * would send those zeros. So jnl_write() refuses (-ENODATA) until the
 * chunk is held: fs/ reads the chunk from the remote and gives it to
 * jnl_chunk_fill(), which stores it as FLUSHED, then writes again.
 *
 * Callers: fs/ (write, read, fill, fsync) and the flusher (claim, release).
 */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/statvfs.h>

#include "crash.h"
#include "journal_i.h"
#include "log.h"
#include "sys.h"

/* --- the pending table ------------------------------------------------------ */

static size_t ptab_hash(jnl_id id, uint64_t idx)
{
	uint64_t h = id * 0x9e3779b97f4a7c15ull ^ (idx + 0x632be59bd9b4e019ull) *
						     0xc2b2ae3d27d4eb4full;

	h ^= h >> 29;
	return (size_t)h;
}

struct jnl_pent *jnl_ptab_find(struct jnl_ptab *t, jnl_id id, uint64_t idx)
{
	if (!t->cap)
		return NULL;
	for (size_t i = ptab_hash(id, idx) & (t->cap - 1);;
	     i = (i + 1) & (t->cap - 1)) {
		struct jnl_pent *e = &t->e[i];

		if (!(e->flags & JNL_PENT_USED))
			return NULL;
		if (e->id == id && e->idx == idx)
			return e;
	}
}

static int ptab_grow(struct jnl_ptab *t)
{
	size_t cap = t->cap ? t->cap * 2 : 64;
	struct jnl_pent *e = calloc(cap, sizeof(*e));

	if (!e)
		return -ENOMEM;
	for (size_t i = 0; i < t->cap; i++) {
		struct jnl_pent *o = &t->e[i];
		size_t k;

		if (!(o->flags & JNL_PENT_USED))
			continue;
		for (k = ptab_hash(o->id, o->idx) & (cap - 1);
		     e[k].flags & JNL_PENT_USED; k = (k + 1) & (cap - 1))
			;
		e[k] = *o;
	}
	free(t->e);
	t->e = e;
	t->cap = cap;
	return 0;
}

struct jnl_pent *jnl_ptab_get(struct jnl_ptab *t, jnl_id id, uint64_t idx)
{
	struct jnl_pent *e = jnl_ptab_find(t, id, idx);
	size_t i;

	if (e)
		return e;
	if ((t->used + 1) * 2 > t->cap && ptab_grow(t))
		return NULL;
	for (i = ptab_hash(id, idx) & (t->cap - 1);
	     t->e[i].flags & JNL_PENT_USED; i = (i + 1) & (t->cap - 1))
		;
	e = &t->e[i];
	memset(e, 0, sizeof(*e));
	e->id = id;
	e->idx = idx;
	e->flags = JNL_PENT_USED;
	t->used++;
	return e;
}

void jnl_ptab_clear(struct jnl_ptab *t)
{
	if (t->cap > 65536) { /* after a burst: give the memory back */
		jnl_ptab_free(t);
		return;
	}
	if (t->cap)
		memset(t->e, 0, t->cap * sizeof(*t->e));
	t->used = 0;
}

void jnl_ptab_free(struct jnl_ptab *t)
{
	free(t->e);
	memset(t, 0, sizeof(*t));
}

/* A mark of (id, idx) in pend or committing. lock held. */
static void pend_find(struct jnl *j, jnl_id id, uint64_t idx,
		      struct jnl_pent *out)
{
	struct jnl_pent *a = jnl_ptab_find(&j->pend, id, idx);
	struct jnl_pent *b = jnl_ptab_find(&j->committing, id, idx);

	memset(out, 0, sizeof(*out));
	for (int i = 0; i < 2; i++) {
		struct jnl_pent *e = i ? b : a;

		if (!e)
			continue;
		out->flags |= e->flags;
		if (e->len > out->len)
			out->len = e->len;
		if (e->max_end > out->max_end)
			out->max_end = e->max_end;
		if ((e->flags & JNL_PENT_MTIME) && e == a)
			out->mtime = e->mtime; /* pend is the newer */
		else if ((e->flags & JNL_PENT_MTIME) &&
			 !(a && (a->flags & JNL_PENT_MTIME)))
			out->mtime = e->mtime;
	}
}

static bool pent_held(const struct jnl_pent *e)
{
	return e->flags & (JNL_PENT_DIRTY | JNL_PENT_FILL);
}

void jnl_pend_node_get(struct jnl *j, jnl_id id, struct jnl_pnode *p)
{
	struct jnl_pent e;

	pthread_mutex_lock(&j->lock);
	pend_find(j, id, JNL_PENT_NODE, &e);
	pthread_mutex_unlock(&j->lock);
	p->size_set = e.flags & JNL_PENT_SIZE;
	p->mtime_set = e.flags & JNL_PENT_MTIME;
	p->max_end = e.max_end;
	p->mtime = e.mtime;
}

void jnl_pnode_merge(const struct jnl_pnode *p, struct jnl_node_rec *r)
{
	if (p->size_set && p->max_end > r->size)
		r->size = p->max_end;
	if (p->mtime_set) {
		r->mtime_sec = r->ctime_sec = (int64_t)p->mtime.tv_sec;
		r->mtime_nsec = r->ctime_nsec = (uint32_t)p->mtime.tv_nsec;
	}
}

void jnl_pend_mtime_drop(struct jnl *j, jnl_id id)
{
	struct jnl_ptab *t[2] = { &j->pend, &j->committing };

	pthread_mutex_lock(&j->lock);
	for (int i = 0; i < 2; i++) {
		struct jnl_pent *e = jnl_ptab_find(t[i], id, JNL_PENT_NODE);

		if (e)
			e->flags &= ~(unsigned int)JNL_PENT_MTIME;
	}
	pthread_mutex_unlock(&j->lock);
}

/* Before staging bytes past @size go (a truncate): make the truncation
 * durable first, or a crash could bring back chunk records over bytes that
 * are gone. Only when there are such bytes. */
static int staging_cut_durably(struct jnl *j, int fd, uint64_t size)
{
	struct stat st;
	int rc;

	if (fstat(fd, &st) < 0)
		return jnl_fail(j, -errno);
	if ((uint64_t)st.st_size <= size)
		return 0;
	pthread_mutex_lock(&j->txn_lock);
	rc = jnl_batch_commit(j);
	pthread_mutex_unlock(&j->txn_lock);
	return rc ? rc : jnl_mdb(j, mdb_env_sync(j->env, 1));
}

int jnl_pend_setattr(struct jnl *j, jnl_id id, unsigned int set,
		     uint64_t size)
{
	uint64_t first = (size + j->chunk_size - 1) >> j->chunk_shift;
	int fd, rc = 0;

	pthread_mutex_lock(&j->lock);
	/* committing is empty: the caller holds commit_lock */
	for (size_t i = 0; i < j->pend.cap; i++) {
		struct jnl_pent *e = &j->pend.e[i];

		if (!(e->flags & JNL_PENT_USED) || e->id != id)
			continue;
		if (e->idx == JNL_PENT_NODE) {
			if ((set & JNL_SET_SIZE) && e->max_end > size)
				e->max_end = size;
			if (set & JNL_SET_MTIME)
				e->flags &= ~(unsigned int)JNL_PENT_MTIME;
		} else if ((set & JNL_SET_SIZE) && e->idx >= first) {
			j->pend_new -= e->added;
			e->added = 0;
			e->len = 0;
			e->flags = JNL_PENT_USED; /* no mark left */
		} else if ((set & JNL_SET_SIZE) &&
			   ((e->idx << j->chunk_shift) + e->len > size)) {
			e->len = (uint32_t)(size - (e->idx << j->chunk_shift));
		}
	}
	pthread_mutex_unlock(&j->lock);
	if (!(set & JNL_SET_SIZE))
		return 0;
	rc = jnl_fd_get(j, id, false, &fd);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	rc = staging_cut_durably(j, fd, size);
	if (!rc)
		rc = jnl_sys_ftruncate(fd, (off_t)size);
	jnl_fd_put(j, id, fd);
	if (rc)
		LOG_ERR("cannot truncate staging file of node %" PRIu64
			" in '%s': %s", id, j->dir, strerror(-rc));
	return jnl_fail(j, rc);
}

/* --- chunk records ------------------------------------------------------------ */

int jnl_chunk_get(struct jnl *j, MDB_txn *txn, jnl_id id, uint64_t idx,
		  struct jnl_chunk_rec *c)
{
	struct jnl_key16 kk = jnl_key16(id, idx);
	MDB_val k = { 16, kk.b }, v;
	int rc = mdb_get(txn, j->db_chunks, &k, &v);

	if (rc)
		return jnl_mdb(j, rc);
	if (jnl_chunk_decode(v.mv_data, v.mv_size, c) == 0)
		return 0;
	LOG_ERR("journal '%s': bad record of chunk %" PRIu64 "/%" PRIu64,
		j->dir, id, idx);
	return jnl_fail(j, -EIO);
}

static uint64_t *state_bytes(struct jnl_meta_rec *m, int state)
{
	switch (state) {
	case JNL_CHUNK_DIRTY:
		return &m->dirty_bytes;
	case JNL_CHUNK_INFLIGHT:
		return &m->inflight_bytes;
	case JNL_CHUNK_FLUSHED:
		return &m->flushed_bytes;
	}
	BUG("chunk state %d", state);
}

static int dirtyq_put(struct jnl_wtx *w, uint64_t dseq,
		      const struct jnl_key16 *key, bool in)
{
	unsigned char kb[8];
	MDB_val k = { 8, kb }, v = { 16, (void *)key->b };

	jnl_be64_put(kb, dseq);
	if (in) {
		w->wake = true; /* a chunk to claim */
		return jnl_mdb(w->j, jnl_put(w->j, w->txn, w->j->db_dirtyq,
					     &k, &v, 0));
	}
	return jnl_mdb(w->j,
		       jnl_del(w->j, w->txn, w->j->db_dirtyq, &k, NULL));
}

/*
 * Move chunk (id, idx) from @old (NULL: no record) to @nw (NULL: delete
 * it), keeping invariants 2-4: the inflight and dirtyq indexes, the byte
 * counters in w->m, and @n's unflushed count and DATA flag (the caller
 * writes @n). The only function that writes chunk records.
 */
static int chunk_move(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n,
		      uint64_t idx, const struct jnl_chunk_rec *old,
		      const struct jnl_chunk_rec *nw)
{
	struct jnl *j = w->j;
	struct jnl_key16 key = jnl_key16(id, idx);
	MDB_val k = { 16, key.b }, v;
	bool claimable = jnl_node_claimable(&n->r);
	bool oq = old && old->state == JNL_CHUNK_DIRTY && claimable;
	bool nq = nw && nw->state == JNL_CHUNK_DIRTY && claimable;
	bool oi = old && old->state == JNL_CHUNK_INFLIGHT;
	bool ni = nw && nw->state == JNL_CHUNK_INFLIGHT;
	bool had = n->r.flags & JNL_NODE_DATA;
	int rc = 0;

	if (old) {
		*state_bytes(&w->m, old->state) -= old->length;
		if (old->state != JNL_CHUNK_FLUSHED)
			n->r.unflushed--;
	}
	if (nw) {
		*state_bytes(&w->m, nw->state) += nw->length;
		if (nw->state != JNL_CHUNK_FLUSHED)
			n->r.unflushed++;
	}
	if (had != (n->r.unflushed > 0)) {
		n->r.flags ^= JNL_NODE_DATA;
		w->m.dirty_nodes += had ? (uint64_t)-1 : 1;
	}
	w->m_dirty = true;

	if (oi && !ni)
		rc = jnl_mdb(j, jnl_del(j, w->txn, j->db_inflight, &k, NULL));
	if (!rc && ni && !oi) {
		v.mv_size = 0;
		v.mv_data = "";
		rc = jnl_mdb(j, jnl_put(j, w->txn, j->db_inflight, &k, &v, 0));
	}
	if (!rc && oq && !(nq && nw->dseq == old->dseq))
		rc = dirtyq_put(w, old->dseq, &key, false);
	if (!rc && nq && !(oq && nw->dseq == old->dseq))
		rc = dirtyq_put(w, nw->dseq, &key, true);
	if (rc)
		return rc;
	if (!nw)
		return jnl_mdb(j, jnl_del(j, w->txn, j->db_chunks, &k, NULL));
	v.mv_size = sizeof(*nw);
	v.mv_data = (void *)nw;
	return jnl_mdb(j, jnl_put(j, w->txn, j->db_chunks, &k, &v, 0));
}

static int pent_cmp(const void *a, const void *b)
{
	const struct jnl_pent *x = *(const struct jnl_pent *const *)a;
	const struct jnl_pent *y = *(const struct jnl_pent *const *)b;

	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	if (x->idx != y->idx)
		return x->idx < y->idx ? -1 : 1;
	return 0;
}

static int apply_chunk(struct jnl_wtx *w, struct jnl_nrec *n,
		       const struct jnl_pent *e)
{
	struct jnl_chunk_rec old, nw;
	bool have;
	int rc;

	rc = jnl_chunk_get(w->j, w->txn, e->id, e->idx, &old);
	if (rc && rc != -ENOENT)
		return rc;
	have = !rc;
	if (have) {
		nw = old;
	} else {
		memset(&nw, 0, sizeof(nw));
		nw.version = JNL_CHUNK_REC_VERSION;
	}
	if ((e->flags & JNL_PENT_FILL) && !have) {
		nw.state = JNL_CHUNK_FLUSHED;
		nw.generation = w->m.next_gen++;
		nw.length = e->len;
		memcpy(nw.sha256, e->sha256, sizeof(nw.sha256));
	} else if (!(e->flags & JNL_PENT_DIRTY)) {
		return 0; /* a fill of a chunk already held */
	}
	if (e->flags & JNL_PENT_DIRTY) {
		nw.generation = w->m.next_gen++;
		if (!nw.state || nw.state == JNL_CHUNK_FLUSHED) {
			nw.state = JNL_CHUNK_DIRTY;
			nw.dseq = w->m.next_dseq++;
		} /* DIRTY keeps its place, INFLIGHT stays with its flusher */
		if (e->len > nw.length)
			nw.length = e->len;
	}
	w->m_dirty = true;
	return chunk_move(w, e->id, n, e->idx, have ? &old : NULL, &nw);
}

int jnl_pend_apply(struct jnl_wtx *w, struct jnl_ptab *t)
{
	struct jnl_pent **v;
	struct jnl_nrec *n;
	size_t count = 0;
	jnl_id cur = 0;
	bool skip = false;
	int rc = 0;

	v = malloc(t->used * sizeof(*v) + 1);
	n = malloc(sizeof(*n));
	if (!v || !n) {
		free(v);
		free(n);
		return -ENOMEM;
	}
	for (size_t i = 0; i < t->cap; i++)
		if (t->e[i].flags & (JNL_PENT_DIRTY | JNL_PENT_FILL |
				     JNL_PENT_SIZE | JNL_PENT_MTIME))
			v[count++] = &t->e[i];
	qsort(v, count, sizeof(*v), pent_cmp);
	for (size_t i = 0; i < count && !rc; i++) {
		struct jnl_pent *e = v[i];

		if (e->id != cur) {
			if (cur && !skip)
				rc = jnl_node_write(w->j, w->txn, cur, n);
			if (rc)
				break;
			cur = e->id;
			rc = jnl_node_read(w->j, w->txn, cur, n);
			skip = rc == -ENOENT; /* gone: nothing to mark */
			if (skip)
				rc = 0;
		}
		if (rc || skip)
			continue;
		if (e->idx != JNL_PENT_NODE) {
			rc = apply_chunk(w, n, e);
			continue;
		}
		if ((e->flags & JNL_PENT_SIZE) && e->max_end > n->r.size)
			n->r.size = e->max_end;
		if (e->flags & JNL_PENT_MTIME) {
			n->r.mtime_sec = n->r.ctime_sec =
				(int64_t)e->mtime.tv_sec;
			n->r.mtime_nsec = n->r.ctime_nsec =
				(uint32_t)e->mtime.tv_nsec;
		}
	}
	if (!rc && cur && !skip)
		rc = jnl_node_write(w->j, w->txn, cur, n);
	free(n);
	free(v);
	return rc;
}

/* The chunk records of @id from index @from: keys and records, in order. */
static int chunks_of(struct jnl_wtx *w, jnl_id id, uint64_t from,
		     uint64_t **idx, struct jnl_chunk_rec **recs, size_t *count)
{
	struct jnl_key16 kk = jnl_key16(id, from);
	MDB_val k = { 16, kk.b }, v;
	size_t cap = 0;
	MDB_cursor *c;
	int rc;

	*idx = NULL;
	*recs = NULL;
	*count = 0;
	rc = mdb_cursor_open(w->txn, w->j->db_chunks, &c);
	if (rc)
		return jnl_mdb(w->j, rc);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE); !rc;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		if (k.mv_size != 16 || jnl_be64_get(k.mv_data) != id)
			break;
		if (v.mv_size != sizeof(**recs)) {
			rc = MDB_CORRUPTED;
			break;
		}
		if (*count == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			uint64_t *ni = realloc(*idx, ncap * sizeof(**idx));
			struct jnl_chunk_rec *nr;

			if (ni)
				*idx = ni;
			nr = ni ? realloc(*recs, ncap * sizeof(**recs)) : NULL;
			if (!nr) {
				mdb_cursor_close(c);
				return -ENOMEM;
			}
			*recs = nr;
			cap = ncap;
		}
		(*idx)[*count] = jnl_be64_get((const unsigned char *)k.mv_data +
					      8);
		memcpy(&(*recs)[*count], v.mv_data, sizeof(**recs));
		(*count)++;
	}
	mdb_cursor_close(c);
	return rc == MDB_NOTFOUND ? 0 : jnl_mdb(w->j, rc);
}

int jnl_chunks_enqueue(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n,
		       bool in)
{
	struct jnl_chunk_rec *recs;
	uint64_t *idx;
	size_t count;
	int rc;

	(void)n;
	rc = chunks_of(w, id, 0, &idx, &recs, &count);
	for (size_t i = 0; i < count && !rc; i++) {
		struct jnl_key16 key = jnl_key16(id, idx[i]);

		if (recs[i].state == JNL_CHUNK_DIRTY)
			rc = dirtyq_put(w, recs[i].dseq, &key, in);
	}
	free(idx);
	free(recs);
	return rc;
}

int jnl_chunks_truncate(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n,
			uint64_t size)
{
	unsigned int shift = w->j->chunk_shift;
	struct jnl_chunk_rec *recs;
	uint64_t *idx;
	size_t count;
	int rc;

	rc = chunks_of(w, id, size >> shift, &idx, &recs, &count);
	for (size_t i = 0; i < count && !rc; i++) {
		uint64_t start = idx[i] << shift;
		struct jnl_chunk_rec nw = recs[i];

		if (start >= size) {
			rc = chunk_move(w, id, n, idx[i], &recs[i], NULL);
		} else if (start + recs[i].length > size) {
			nw.length = (uint32_t)(size - start);
			rc = chunk_move(w, id, n, idx[i], &recs[i], &nw);
		}
	}
	free(idx);
	free(recs);
	return rc;
}

/*
 * Under staging pressure: drop chunk records of @n that the remote holds,
 * so their staging bytes can go (jnl_gc_add()) and the merged view reads
 * them on the remote, as it reads an imported file: full FLUSHED chunks
 * with no mark, below rvalid anywhere, and from rvalid on as long as they
 * run contiguously (rvalid then grows over them). Only for a regular file on
 * the remote with no pending op (nops 0: no truncate or FINISH may still
 * change its remote bytes). Updates @n (the caller writes it) and sets
 * *any. Caller holds rw exclusive (invariant 11) and is inside a change.
 */
static int drop_flushed(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n,
			bool *any)
{
	struct jnl *j = w->j;
	uint64_t from = n->r.rvalid >> j->chunk_shift, next = from;
	uint64_t end = n->r.rvalid, run = 0, runlen = 0;
	struct jnl_chunk_rec *recs;
	uint64_t *idx;
	size_t count;
	int rc;

	*any = false;
	if (!S_ISREG(n->r.mode) || !jnl_node_claimable(&n->r) ||
	    !n->r.rparent || n->r.nops)
		return 0;
	rc = chunks_of(w, id, 0, &idx, &recs, &count);
	for (size_t i = 0; i < count && !rc; i++) {
		uint64_t start = idx[i] << j->chunk_shift;
		bool below = idx[i] < from;
		struct jnl_pent e;

		if (!below && idx[i] != next)
			break; /* a gap past rvalid: not the remote's bytes */
		pthread_mutex_lock(&j->lock);
		pend_find(j, id, idx[i], &e);
		pthread_mutex_unlock(&j->lock);
		if (recs[i].state != JNL_CHUNK_FLUSHED || pent_held(&e) ||
		    recs[i].length < j->chunk_size) {
			/* not on the remote yet, written again, or short:
			 * the end of the file, where a writer may append
			 * (dropped, it would need a fill from the remote) */
			if (below)
				continue;
			break;
		}
		rc = chunk_move(w, id, n, idx[i], &recs[i], NULL);
		if (rc)
			break;
		*any = true;
		if (runlen && run + runlen == idx[i]) {
			runlen++;
		} else {
			if (runlen)
				rc = jnl_gc_add(j, id, run, runlen);
			run = idx[i];
			runlen = 1;
		}
		if (below)
			continue;
		if (start + recs[i].length > end)
			end = start + recs[i].length;
		next++;
	}
	if (!rc && runlen)
		rc = jnl_gc_add(j, id, run, runlen);
	free(idx);
	free(recs);
	if (!rc)
		n->r.rvalid = end;
	return rc;
}

int jnl_chunks_recover(struct jnl_wtx *w, uint64_t *resent)
{
	struct jnl *j = w->j;
	struct jnl_key16 *keys = NULL;
	size_t count = 0, cap = 0;
	struct jnl_nrec *n;
	MDB_cursor *c;
	MDB_val k, v;
	int rc;

	rc = mdb_cursor_open(w->txn, j->db_inflight, &c);
	if (rc)
		return jnl_mdb(j, rc);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		if (k.mv_size != 16) {
			rc = MDB_CORRUPTED;
			break;
		}
		if (count == cap) {
			struct jnl_key16 *nk;

			cap = cap ? cap * 2 : 64;
			nk = realloc(keys, cap * sizeof(*keys));
			if (!nk) {
				rc = ENOMEM;
				break;
			}
			keys = nk;
		}
		memcpy(keys[count++].b, k.mv_data, 16);
	}
	mdb_cursor_close(c);
	n = malloc(sizeof(*n));
	rc = rc == MDB_NOTFOUND ? 0 : jnl_mdb(j, rc);
	if (!rc && !n)
		rc = -ENOMEM;
	for (size_t i = 0; i < count && !rc; i++) {
		jnl_id id = jnl_be64_get(keys[i].b);
		uint64_t idx = jnl_be64_get(keys[i].b + 8);
		struct jnl_chunk_rec old, nw;

		rc = jnl_chunk_get(j, w->txn, id, idx, &old);
		if (!rc)
			rc = jnl_node_read(j, w->txn, id, n);
		if (!rc && old.state != JNL_CHUNK_INFLIGHT)
			rc = jnl_fail(j, -EIO);
		if (rc)
			break;
		nw = old;
		nw.state = JNL_CHUNK_DIRTY;
		nw.claim_gen = 0;
		rc = chunk_move(w, id, n, idx, &old, &nw);
		if (!rc)
			rc = jnl_node_write(j, w->txn, id, n);
		*resent += old.length;
	}
	free(n);
	free(keys);
	return rc;
}

/* --- staging files ----------------------------------------------------------- */

int jnl_fd_get(struct jnl *j, jnl_id id, bool create, int *fd)
{
	struct jnl_fdslot *s, *victim = NULL;
	char name[24];
	int nfd, old = -1;

	pthread_mutex_lock(&j->lock);
	for (int i = 0; i < JNL_FD_SLOTS; i++) {
		s = &j->fds[i];
		if (s->id == id && !s->gone) {
			s->refs++;
			s->tick = ++j->fd_tick;
			*fd = s->fd;
			pthread_mutex_unlock(&j->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&j->lock);

	snprintf(name, sizeof(name), "%" PRIu64, id);
	nfd = jnl_sys_openat(j->datafd, name, O_RDWR | (create ? O_CREAT : 0),
			     0600);
	if (nfd < 0)
		return nfd;

	pthread_mutex_lock(&j->lock);
	for (int i = 0; i < JNL_FD_SLOTS; i++) {
		s = &j->fds[i];
		if (s->id == id && !s->gone) { /* another thread was faster */
			s->refs++;
			s->tick = ++j->fd_tick;
			*fd = s->fd;
			pthread_mutex_unlock(&j->lock);
			close(nfd);
			return 0;
		}
		if (!s->refs && (!victim || !s->id ||
				 (victim->id && s->tick < victim->tick)))
			victim = s;
	}
	if (victim) {
		if (victim->id)
			old = victim->fd;
		victim->id = id;
		victim->fd = nfd;
		victim->refs = 1;
		victim->tick = ++j->fd_tick;
	}
	pthread_mutex_unlock(&j->lock);
	if (old >= 0)
		close(old);
	*fd = nfd; /* uncached if no slot was free: jnl_fd_put() closes it */
	return 0;
}

void jnl_fd_put(struct jnl *j, jnl_id id, int fd)
{
	pthread_mutex_lock(&j->lock);
	for (int i = 0; i < JNL_FD_SLOTS; i++) {
		struct jnl_fdslot *s = &j->fds[i];

		if (s->id == id && s->fd == fd) {
			bool last = !--s->refs && s->gone;

			if (last) {
				s->id = 0;
				s->gone = false;
			}
			pthread_mutex_unlock(&j->lock);
			if (last)
				close(fd);
			return;
		}
	}
	pthread_mutex_unlock(&j->lock);
	close(fd);
}

void jnl_fd_close_all(struct jnl *j)
{
	for (int i = 0; i < JNL_FD_SLOTS; i++)
		if (j->fds[i].id) {
			close(j->fds[i].fd);
			j->fds[i].id = 0;
		}
}

/* --- write, fill, read ---------------------------------------------------------- */

struct span {
	uint64_t first, count;      /* chunks touched */
	bool *held;                 /* per chunk: the journal holds it */
	uint32_t *len;              /* per chunk: bytes held from its start */
};

static int span_init(struct jnl *j, struct span *sp, uint64_t off,
		     uint64_t len)
{
	sp->first = off >> j->chunk_shift;
	sp->count = ((off + len - 1) >> j->chunk_shift) - sp->first + 1;
	sp->held = calloc(sp->count, sizeof(*sp->held));
	sp->len = calloc(sp->count, sizeof(*sp->len));
	if (!sp->held || !sp->len) {
		free(sp->held);
		free(sp->len);
		return -ENOMEM;
	}
	return 0;
}

static void span_free(struct span *sp)
{
	free(sp->held);
	free(sp->len);
}

/* Fill sp->held/len from pend/committing, then from LMDB (invariant 11),
 * and read the node into @n. */
static int span_look(struct jnl *j, jnl_id id, struct span *sp,
		     struct jnl_pnode *pn, struct jnl_nrec *n)
{
	MDB_txn *txn;
	int rc;

	pthread_mutex_lock(&j->lock);
	for (uint64_t k = 0; k < sp->count; k++) {
		struct jnl_pent e;

		pend_find(j, id, sp->first + k, &e);
		sp->held[k] = pent_held(&e);
		sp->len[k] = pent_held(&e) ? e.len : 0;
	}
	pthread_mutex_unlock(&j->lock);
	jnl_pend_node_get(j, id, pn);

	rc = jnl_rtx_begin(j, &txn);
	if (rc)
		return rc;
	rc = jnl_node_read(j, txn, id, n);
	for (uint64_t k = 0; k < sp->count && !rc; k++) {
		struct jnl_chunk_rec c;

		rc = jnl_chunk_get(j, txn, id, sp->first + k, &c);
		if (rc == -ENOENT) {
			rc = 0;
			continue;
		}
		if (rc)
			break;
		sp->held[k] = true;
		if (c.length > sp->len[k])
			sp->len[k] = c.length;
	}
	jnl_rtx_end(j);
	if (!rc && !S_ISREG(n->r.mode))
		rc = S_ISDIR(n->r.mode) ? -EISDIR : -EINVAL;
	return rc;
}

/* Must chunk @idx be filled before a write of [off, end) lands in it? */
static bool needs_fill(struct jnl *j, uint64_t rvalid, uint64_t idx,
		       uint64_t off, uint64_t end)
{
	uint64_t start = idx << j->chunk_shift;
	uint64_t stop = start + j->chunk_size;

	if (rvalid < stop)
		stop = rvalid;
	if (stop <= start)
		return false; /* no remote bytes in this chunk */
	return !(off <= start && end >= stop);
}

/*
 * Two bounds on staging (journal.c "SPACE"): max_bytes, against the staging
 * bytes held (committed records and reservations of marks), and the
 * journal disk: bytes reserved since the last look at its free space
 * (disk_look()) against what was free then, less a margin. A chunk given
 * back frees its disk bytes only when jnl_gc_run() punches them out, which
 * the next look sees.
 */

/* Do @bytes more fit? lock held. */
static bool room_fits(const struct jnl *j, uint64_t bytes)
{
	if (j->max_bytes && j->staged + j->pend_new + bytes > j->max_bytes)
		return false;
	return j->disk_avail == UINT64_MAX ||
	       j->reserved - j->disk_base + bytes <= j->disk_avail;
}

/* Near a bound (a quarter of max_bytes, or of the disk's room, at most
 * 1 GiB left): backpressure starts, released chunks are given back at
 * once (drop_flushed()). lock held. */
static bool room_pressure(const struct jnl *j)
{
	uint64_t slack = j->max_bytes / 4;

	if (slack > (1ull << 30))
		slack = 1ull << 30;
	if (j->max_bytes && j->staged + j->pend_new + slack >= j->max_bytes)
		return true;
	return j->disk_avail != UINT64_MAX &&
	       j->reserved - j->disk_base + j->disk_slack >= j->disk_avail;
}

/* Look at the journal disk's free space, at most every DISK_LOOK_NS:
 * staging may use what is free less a margin (1/64 of the disk, 1 to 256
 * MiB) for LMDB's growth, block rounding and other writers of the disk.
 * So a filling disk makes writers wait for the flusher as max_bytes does,
 * and -ENOSPC from the disk itself is the last word only. No lock held. */
#define DISK_LOOK_NS 50000000
static void disk_look(struct jnl *j)
{
	uint64_t avail, total, margin, slack;
	struct statvfs sv;
	int64_t now = jnl_mono_ns();

	if (!j->disk_room)
		return;
	pthread_mutex_lock(&j->lock);
	if (j->disk_at && now - j->disk_at < DISK_LOOK_NS) {
		pthread_mutex_unlock(&j->lock);
		return;
	}
	j->disk_at = now;
	pthread_mutex_unlock(&j->lock);
	if (fstatvfs(j->datafd, &sv) < 0 || !sv.f_blocks)
		return;
	avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	total = (uint64_t)sv.f_blocks * sv.f_frsize;
	margin = total / 64;
	if (margin < (1u << 20))
		margin = 1u << 20;
	if (margin > (256u << 20))
		margin = 256u << 20;
	slack = total / 4 < (1ull << 30) ? total / 4 : 1ull << 30;
	pthread_mutex_lock(&j->lock);
	/* reservations after the statvfs are not in avail: count them */
	j->disk_avail = avail > margin ? avail - margin : 0;
	j->disk_base = j->reserved;
	j->disk_slack = slack;
	jnl_room_signal(j);
	pthread_mutex_unlock(&j->lock);
}

/* Reserve @bytes of staging space against the bounds: 0, -EAGAIN (no room
 * now: room_wait()), or -ENOSPC (the group commit cannot commit).
 * lock held. */
static int reserve(struct jnl *j, uint64_t bytes)
{
	if (j->commit_err)
		return j->commit_err;
	if (bytes && !room_fits(j, bytes))
		return -EAGAIN;
	j->pend_new += bytes;
	j->reserved += bytes;
	return 0;
}

/* Under max_bytes pressure, give back the FLUSHED chunks of @id that the
 * remote holds (drop_flushed()). Takes rw exclusive: the chunks stop being
 * held (invariant 11). No lock held by the caller. */
static void make_room(struct jnl *j, jnl_id id)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	struct jnl_wtx w;
	int rc;

	if (!n)
		return;
	pthread_rwlock_wrlock(&j->rw);
	rc = jnl_wtx_begin(j, &w, false);
	if (!rc) {
		bool any = false;

		rc = jnl_node_read(j, w.txn, id, n);
		if (!rc)
			rc = drop_flushed(&w, id, n, &any);
		if (!rc && any)
			rc = jnl_node_write(j, w.txn, id, n);
		if (rc || !any)
			jnl_wtx_abort(&w);
		else
			rc = jnl_wtx_commit(&w);
	}
	pthread_rwlock_unlock(&j->rw);
	if (rc && rc != -ENOENT)
		LOG_WARN("cannot give back flushed chunks of node %" PRIu64
			 " in '%s': %s", id, j->dir, strerror(-rc));
	free(n);
}

/* Start writing back the chunks a write of [@off, +@len) filled up to
 * their end (advisory: the group commit's fdatasync reports errors). */
static void writeback_start(struct jnl *j, int fd, off_t off, size_t len)
{
	uint64_t lo = (uint64_t)off >> j->chunk_shift << j->chunk_shift;
	uint64_t hi = ((uint64_t)off + len) >> j->chunk_shift << j->chunk_shift;

	if (hi > lo)
		(void)sync_file_range(fd, (off_t)lo, (off_t)(hi - lo),
				      SYNC_FILE_RANGE_WRITE);
}

/*
 * A write or fill of node @id needs @bytes more staging than the bound
 * leaves: wait for the flusher to make room (chunks flushed and dropped,
 * nodes cleaned) until *deadline (set by the first call: now + wait_ms).
 * Holds no journal lock while waiting. 0 (try again), or -ENOSPC.
 */
static int room_wait(struct jnl *j, jnl_id id, uint64_t bytes,
		     int64_t *deadline)
{
	int rc = 0;

	if (j->max_bytes && bytes > j->max_bytes)
		return -ENOSPC; /* can never fit */
	make_room(j, id);
	pthread_mutex_lock(&j->lock);
	if (!*deadline) {
		*deadline = jnl_mono_ns() + (int64_t)j->wait_ms * 1000000;
		j->write_waits++;
	}
	j->waiters++;
	if (j->notify_fn) /* the flusher: work, do not sleep */
		j->notify_fn(j->notify_arg);
	j->hurry = true; /* the committer: make the marks claimable now */
	pthread_cond_signal(&j->cond);
	while (!room_fits(j, bytes)) {
		int64_t now = jnl_mono_ns(), until = now + DISK_LOOK_NS;
		struct timespec ts;

		rc = jnl_failed(j);
		if (!rc && (j->commit_err || j->stop || now >= *deadline))
			rc = -ENOSPC;
		if (rc)
			break;
		if (until > *deadline)
			until = *deadline;
		ts.tv_sec = (time_t)(until / 1000000000);
		ts.tv_nsec = (long)(until % 1000000000);
		pthread_cond_timedwait(&j->room, &j->lock, &ts);
		pthread_mutex_unlock(&j->lock);
		disk_look(j); /* the disk may have room again (gc) */
		pthread_mutex_lock(&j->lock);
	}
	j->waiters--;
	pthread_mutex_unlock(&j->lock);
	return rc;
}

/* jnl_write(), or with @buf NULL (jnl_pt_mark()) only the marks of bytes
 * the kernel wrote into the staging file itself: their room is taken
 * whatever the bounds say (the bytes are on the disk already), and the
 * node's mtime becomes @mtime. */
static ssize_t write_marks(struct jnl *j, jnl_id id, const void *buf,
			   size_t len, off_t off, const struct timespec *mtime)
{
	uint64_t o = (uint64_t)off, end = o + len, added = 0;
	int64_t deadline = 0;
	struct jnl_pnode pn;
	struct jnl_nrec *n;
	struct timespec now;
	struct span sp;
	int fd, rc;
	ssize_t w;

	rc = jnl_failed(j);
	if (rc)
		return rc;
	if (off < 0 || len > SSIZE_MAX)
		return -EINVAL;
	if (end > (uint64_t)INT64_MAX || end < o)
		return -EFBIG;
	if (!len)
		return 0;
	n = malloc(sizeof(*n));
	if (!n)
		return -ENOMEM;
	rc = span_init(j, &sp, o, len);
	if (rc) {
		free(n);
		return rc;
	}
again:
	disk_look(j);
	pthread_rwlock_rdlock(&j->rw);
	if (!buf) { /* jnl_pt_mark(): not truncated since (growth is fine:
		     * those bytes are marked later) */
		struct stat st;

		rc = jnl_fd_get(j, id, false, &fd);
		if (rc)
			goto out;
		rc = fstat(fd, &st) < 0 ? -errno : 0;
		jnl_fd_put(j, id, fd);
		if (!rc && (uint64_t)st.st_size < end)
			rc = -EAGAIN;
		if (rc)
			goto out;
	}
	rc = span_look(j, id, &sp, &pn, n);
	if (rc)
		goto out;
	if ((!sp.held[0] && needs_fill(j, n->r.rvalid, sp.first, o, end)) ||
	    (!sp.held[sp.count - 1] &&
	     needs_fill(j, n->r.rvalid, sp.first + sp.count - 1, o, end))) {
		rc = -ENODATA;
		goto out;
	}
	added = 0;
	for (uint64_t k = 0; k < sp.count; k++) {
		uint64_t start = (sp.first + k) << j->chunk_shift;
		uint64_t stop = start + j->chunk_size;
		uint32_t want = (uint32_t)((end < stop ? end : stop) - start);

		/* from here on sp.len[k] is the growth this write reserves */
		sp.len[k] = want > sp.len[k] ? want - sp.len[k] : 0;
		added += sp.len[k];
	}
	pthread_mutex_lock(&j->lock);
	if (buf) {
		rc = reserve(j, added);
	} else { /* on the disk already: counted, never refused */
		j->pend_new += added;
		j->reserved += added;
		rc = 0;
	}
	pthread_mutex_unlock(&j->lock);
	if (rc == -EAGAIN) {
		/* max_bytes: wait for the flusher with no lock held, then
		 * look again (what is held may have changed meanwhile) */
		pthread_rwlock_unlock(&j->rw);
		rc = room_wait(j, id, added, &deadline);
		if (!rc)
			goto again;
		goto out_unlocked;
	}
	if (rc)
		goto out;

	rc = buf ? jnl_fd_get(j, id, true, &fd) : 0;
	if (!rc && buf) {
		w = sys_pwrite_all(fd, buf, len, off);
		CRASH_POINT("staging_written"); /* no mark yet */
		if (w > 0)
			writeback_start(j, fd, off, len);
		jnl_fd_put(j, id, fd);
		rc = w < 0 ? (int)w : 0;
	}
	if (rc) {
		pthread_mutex_lock(&j->lock);
		j->pend_new -= added;
		pthread_mutex_unlock(&j->lock);
		if (rc != -ENOSPC && rc != -EDQUOT && rc != -EFBIG)
			LOG_ERR("cannot write staging file of node %" PRIu64
				" in '%s': %s", id, j->dir, strerror(-rc));
		jnl_fail(j, rc);
		goto out;
	}

	jnl_now(&now);
	pthread_mutex_lock(&j->lock);
	for (uint64_t k = 0; k < sp.count; k++) {
		struct jnl_pent *e = jnl_ptab_get(&j->pend, id, sp.first + k);
		uint64_t start = (sp.first + k) << j->chunk_shift;
		uint64_t stop = start + j->chunk_size;
		uint32_t want = (uint32_t)((end < stop ? end : stop) - start);

		if (!e)
			BUG("out of memory recording a chunk mark");
		e->flags |= JNL_PENT_DIRTY;
		if (want > e->len)
			e->len = want;
		e->added += sp.len[k];
		if (j->hungry && e->len == j->chunk_size &&
		    jnl_mono_ns() - j->commit_end_ns >=
			    (int64_t)JNL_HUNGRY_GAP_MS * 1000000) {
			j->hungry = false;
			j->hurry = true;
		}
	}
	{
		struct jnl_pent *e = jnl_ptab_get(&j->pend, id, JNL_PENT_NODE);

		if (!e)
			BUG("out of memory recording a chunk mark");
		e->flags |= JNL_PENT_SIZE | JNL_PENT_MTIME;
		if (end > e->max_end)
			e->max_end = end;
		e->mtime = mtime ? *mtime : now;
	}
	pthread_cond_signal(&j->cond);
	pthread_mutex_unlock(&j->lock);
	rc = 0;
out:
	pthread_rwlock_unlock(&j->rw);
out_unlocked:
	span_free(&sp);
	free(n);
	return rc < 0 ? rc : (ssize_t)len;
}

ssize_t jnl_write(struct jnl *j, jnl_id id, const void *buf, size_t len,
		  off_t off)
{
	if (!buf && len)
		return -EINVAL;
	return write_marks(j, id, buf ? buf : "", len, off, NULL);
}

/* --- passthrough: the kernel writes the staging file (fs/pt.c) ---------- */

/* The pin of @id, or NULL. lock held. */
static struct jnl_pt_pin *pt_pin(struct jnl *j, jnl_id id)
{
	for (unsigned int i = 0; i < j->pt_npins; i++)
		if (j->pt_pins[i].id == id)
			return &j->pt_pins[i];
	return NULL;
}

bool jnl_pt_pinned_locked(struct jnl *j, jnl_id id)
{
	return j->pt_npins && pt_pin(j, id);
}

bool jnl_chunk_digest_used(struct jnl *j, jnl_id id)
{
	bool used;

	pthread_mutex_lock(&j->lock);
	used = (j->pt_npins && pt_pin(j, id)) ||
	       jnl_u64set_has(&j->pt_ended, id) ||
	       jnl_u64set_has(&j->pt_unsynced, id) ||
	       jnl_u64set_has(&j->pt_unsynced_old, id);
	pthread_mutex_unlock(&j->lock);
	return used;
}

static bool pt_pinned(struct jnl *j, jnl_id id)
{
	bool pinned;

	pthread_mutex_lock(&j->lock);
	pinned = j->pt_npins && pt_pin(j, id);
	pthread_mutex_unlock(&j->lock);
	return pinned;
}

/* A mark of @id failed: its marker stays when the pin ends. */
static void pt_mark_failed(struct jnl *j, jnl_id id)
{
	struct jnl_pt_pin *p;

	pthread_mutex_lock(&j->lock);
	p = pt_pin(j, id);
	if (p)
		p->keep = true;
	pthread_mutex_unlock(&j->lock);
}

static void pt_unpin(struct jnl *j, jnl_id id)
{
	struct jnl_pt_pin *p;

	pthread_mutex_lock(&j->lock);
	p = pt_pin(j, id);
	if (p && !--p->refs) {
		atomic_fetch_add(&j->pt_ends, 1); /* before the pin goes */
		/* its marker goes after the commit of its last marks; after
		 * a failed mark (or without memory) it stays, and the next
		 * open of the journal marks again (jnl_pt_recover()) */
		if (!p->keep && jnl_u64set_add(&j->pt_ended, id))
			LOG_WARN("journal '%s': out of memory: the marker of "
				 "node %" PRIu64 " stays", j->dir, id);
		if (jnl_u64set_has(&j->pt_unclean, id)) {
			jnl_u64set_del(&j->pt_unclean, id);
			jnl_clean_later_locked(j, id);
		}
		*p = j->pt_pins[--j->pt_npins];
	}
	pthread_mutex_unlock(&j->lock);
}

static void pt_marker_name(char *name, size_t size, jnl_id id)
{
	snprintf(name, size, "%" PRIu64, id);
}

/*
 * The marker pt/<id> says "the kernel may have written this staging file
 * behind the journal's back". It is there before the kernel gets the file
 * and goes only once the marks of the last close are committed, so a
 * daemon killed meanwhile (the application goes on writing through the
 * backing file) loses nothing: the next open marks the whole file.
 */
static int pt_marker_make(struct jnl *j, jnl_id id)
{
	char name[24];
	int fd;

	pt_marker_name(name, sizeof(name), id);
	fd = jnl_sys_openat(j->ptfd, name, O_CREAT | O_WRONLY, 0600);
	if (fd < 0) {
		LOG_ERR("cannot create '%s/pt/%s': %s", j->dir, name,
			strerror(-fd));
		return fd;
	}
	close(fd);
	return 0;
}

void jnl_pt_unmark(struct jnl *j, struct jnl_u64set *ended)
{
	char name[24];

	for (size_t i = 0; i < ended->cap; i++) {
		jnl_id id = ended->v[i];

		if (!id)
			continue;
		/* under lock: a jnl_pt_begin() makes its marker after its
		 * pin, so a marker seen unpinned here is not a new one's */
		pthread_mutex_lock(&j->lock);
		if (!pt_pin(j, id)) {
			pt_marker_name(name, sizeof(name), id);
			if (unlinkat(j->ptfd, name, 0) < 0 && errno != ENOENT)
				LOG_WARN("cannot remove '%s/pt/%s': %s",
					 j->dir, name, strerror(errno));
		}
		pthread_mutex_unlock(&j->lock);
		ended->v[i] = 0;
		ended->used--;
	}
}

void jnl_pt_recover(struct jnl *j)
{
	struct dirent *de;
	unsigned int n = 0, failed = 0;
	DIR *d;
	int fd;

	fd = fcntl(j->ptfd, F_DUPFD_CLOEXEC, 0);
	d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		LOG_ERR("cannot read '%s/pt': %s", j->dir, strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(d))) {
		char *end;
		unsigned long long v;
		jnl_id id;

		if (de->d_name[0] == '.')
			continue;
		errno = 0;
		v = strtoull(de->d_name, &end, 10);
		if (errno || *end || !v) {
			LOG_WARN("'%s/pt/%s': not a node's marker; left alone",
				 j->dir, de->d_name);
			continue;
		}
		id = (jnl_id)v;
		pthread_mutex_lock(&j->lock);
		if (j->pt_npins < JNL_PT_PINS && !pt_pin(j, id))
			j->pt_pins[j->pt_npins++] =
				(struct jnl_pt_pin){ .id = id, .refs = 1 };
		else
			id = 0;
		pthread_mutex_unlock(&j->lock);
		if (!id)
			break; /* the rest at the next open */
		if (jnl_pt_mark(j, id))
			failed++;
		pt_unpin(j, id);
		n++;
	}
	closedir(d);
	if (n)
		LOG_INFO("journal '%s': %u file(s) written past the daemon's "
			 "stop marked again%s", j->dir, n,
			 failed ? "; some could not be, see above" : "");
}

int jnl_pt_begin(struct jnl *j, jnl_id id, int *fd)
{
	struct jnl_pt_pin *p;
	int sfd, rc = jnl_failed(j);

	if (rc)
		return rc;
	/* not inside a gc run (rw exclusive): from here on it leaves the
	 * staging file alone */
	pthread_rwlock_rdlock(&j->rw);
	pthread_mutex_lock(&j->lock);
	p = pt_pin(j, id);
	if (p)
		p->refs++;
	else if (j->pt_npins < JNL_PT_PINS)
		j->pt_pins[j->pt_npins++] = (struct jnl_pt_pin){
			.id = id, .refs = 1, .since = jnl_mono_ns() };
	else
		rc = -EBUSY;
	pthread_mutex_unlock(&j->lock);
	if (!rc) {
		rc = jnl_fd_get(j, id, true, &sfd);
		if (!rc) {
			*fd = fcntl(sfd, F_DUPFD_CLOEXEC, 0);
			rc = *fd < 0 ? -errno : 0;
			jnl_fd_put(j, id, sfd);
		}
		if (!rc) {
			rc = pt_marker_make(j, id);
			if (rc)
				close(*fd);
		}
		if (rc)
			pt_unpin(j, id);
	}
	pthread_rwlock_unlock(&j->rw);
	return rc;
}

void jnl_pt_end(struct jnl *j, jnl_id id)
{
	pt_unpin(j, id);
}

/* No lock: every stat of a node asks. The bump comes before the pin
 * goes, under lock, so one who saw the pin gone (pt_pinned()) sees it. */
uint64_t jnl_pt_epoch(struct jnl *j)
{
	return atomic_load(&j->pt_ends);
}

/*
 * Which chunks of a staging file of @size bytes must a mark take? need[]
 * has a flag per chunk. Not:
 *  - one FLUSHED (with no mark pending) whose bytes in the staging file
 *    have the SHA-256 the remote has, so that an fsync or a close does
 *    not send again what the kernel did not change since;
 *  - one DIRTY of its whole length: the flusher reads its bytes when it
 *    claims it, after this (jnl_pt_grow() marked it while it was written);
 *  - one INFLIGHT (its bytes were read at some time before): looked at
 *    again, as above, once the stream is done with it (PT_SETTLE_MS at
 *    most), so a close does not send again what streams are sending.
 * The last chunk is taken also when the node's size or mtime differ from
 * the staging file's (they go with its mark).
 */
#define PT_BATCH 64
#define PT_SETTLE_MS 1000
#define PT_SETTLE_MAX 64 /* INFLIGHT chunks waited for */

/* the length chunk @k of a staging file of @size bytes has */
static uint64_t pt_want(const struct jnl *j, uint64_t size, uint64_t k)
{
	uint64_t start = k << j->chunk_shift;

	return size - start < j->chunk_size ? size - start : j->chunk_size;
}

/* need[@k] of chunk record @c (FLUSHED or DIRTY, of full length @want):
 * false if its bytes are what the remote has or will have. */
static int pt_chunk_need(struct jnl *j, jnl_id id, int fd, uint64_t k,
			 const struct jnl_chunk_rec *c, uint64_t want,
			 unsigned char **buf, bool *need)
{
	unsigned char sha[32];
	struct jnl_pent e;
	ssize_t r;

	*need = true;
	if (c->length != want)
		return 0;
	if (c->state == JNL_CHUNK_DIRTY) {
		*need = false;
		return 0;
	}
	if (c->state != JNL_CHUNK_FLUSHED || !jnl_digest_known(c->sha256))
		return 0; /* no digest: sent again */
	pthread_mutex_lock(&j->lock);
	pend_find(j, id, k, &e);
	pthread_mutex_unlock(&j->lock);
	if (pent_held(&e))
		return 0;
	if (!*buf && !(*buf = malloc(j->chunk_size)))
		return -ENOMEM;
	r = sys_pread_all(fd, *buf, want, (off_t)(k << j->chunk_shift));
	if (r < 0)
		return (int)r;
	if ((uint64_t)r == want &&
	    EVP_Digest(*buf, want, sha, NULL, EVP_sha256(), NULL) &&
	    !memcmp(sha, c->sha256, sizeof(sha)))
		*need = false;
	return 0;
}

static int pt_need(struct jnl *j, jnl_id id, int fd, const struct stat *st,
		   bool *need, uint64_t count)
{
	uint64_t size = (uint64_t)st->st_size;
	uint64_t settle[PT_SETTLE_MAX];
	struct jnl_chunk_rec c[PT_BATCH];
	bool have[PT_BATCH], same = false;
	unsigned char *buf = NULL;
	unsigned int nsettle = 0;
	struct jnl_nrec *nr;
	struct jnl_pnode pn;
	MDB_txn *txn;
	int rc = 0;

	nr = malloc(sizeof(*nr));
	if (!nr)
		return -ENOMEM;
	for (uint64_t k0 = 0; k0 < count && !rc; k0 += PT_BATCH) {
		uint64_t n = count - k0 < PT_BATCH ? count - k0 : PT_BATCH;

		rc = jnl_rtx_begin(j, &txn);
		if (rc)
			break;
		if (k0 + n == count && !jnl_node_read(j, txn, id, nr)) {
			jnl_pend_node_get(j, id, &pn);
			jnl_pnode_merge(&pn, &nr->r);
			same = nr->r.size == size &&
			       nr->r.mtime_sec == st->st_mtim.tv_sec &&
			       nr->r.mtime_nsec == (uint32_t)st->st_mtim.tv_nsec;
		}
		for (uint64_t i = 0; i < n && !rc; i++) {
			rc = jnl_chunk_get(j, txn, id, k0 + i, &c[i]);
			have[i] = !rc;
			if (rc == -ENOENT)
				rc = 0;
		}
		jnl_rtx_end(j);
		for (uint64_t i = 0; i < n && !rc; i++) {
			uint64_t k = k0 + i, want = pt_want(j, size, k);

			need[k] = true;
			if ((k == count - 1 && !same) || !have[i])
				continue;
			if (c[i].state == JNL_CHUNK_INFLIGHT &&
			    c[i].length == want && nsettle < PT_SETTLE_MAX)
				settle[nsettle++] = k;
			else
				rc = pt_chunk_need(j, id, fd, k, &c[i], want,
						   &buf, &need[k]);
		}
	}
	/* the INFLIGHT ones, once their streams are done with them */
	for (int64_t t0 = jnl_mono_ns(); !rc && nsettle;) {
		struct jnl_chunk_rec r[PT_SETTLE_MAX];
		bool got[PT_SETTLE_MAX];
		unsigned int left = 0;

		rc = jnl_rtx_begin(j, &txn);
		if (rc)
			break;
		for (unsigned int i = 0; i < nsettle && !rc; i++) {
			rc = jnl_chunk_get(j, txn, id, settle[i], &r[i]);
			got[i] = !rc;
			if (rc == -ENOENT)
				rc = 0; /* truncated meanwhile: need[] stays */
		}
		jnl_rtx_end(j);
		for (unsigned int i = 0; i < nsettle && !rc; i++) {
			uint64_t k = settle[i], want = pt_want(j, size, k);

			if (got[i] && r[i].state == JNL_CHUNK_INFLIGHT)
				settle[left++] = k;
			else if (got[i])
				rc = pt_chunk_need(j, id, fd, k, &r[i], want,
						   &buf, &need[k]);
		}
		nsettle = left;
		if (!nsettle || rc ||
		    jnl_mono_ns() - t0 > (int64_t)PT_SETTLE_MS * 1000000)
			break; /* still INFLIGHT: need[] stays true */
		usleep(2000);
	}
	free(buf);
	free(nr);
	return rc;
}

/* One try of jnl_pt_mark(): -EAGAIN if the file shrank meanwhile. */
static int pt_mark_once(struct jnl *j, jnl_id id)
{
	struct stat st;
	uint64_t size, count, k = 0;
	bool *need;
	int fd, rc;

	rc = jnl_fd_get(j, id, false, &fd);
	if (rc)
		return rc == -ENOENT ? 1 : rc; /* 1: nothing written */
	rc = fstat(fd, &st) < 0 ? -errno : 0;
	size = rc ? 0 : (uint64_t)st.st_size;
	if (rc || !size) {
		jnl_fd_put(j, id, fd);
		return rc;
	}
	count = ((size - 1) >> j->chunk_shift) + 1;
	need = calloc(count, sizeof(*need));
	rc = need ? pt_need(j, id, fd, &st, need, count) : -ENOMEM;
	jnl_fd_put(j, id, fd);
	/* each run of chunks to mark as one mark */
	while (!rc && k < count) {
		uint64_t a, off, end;
		ssize_t w;

		while (k < count && !need[k])
			k++;
		if (k == count)
			break;
		for (a = k; k < count && need[k]; k++)
			;
		off = a << j->chunk_shift;
		end = k << j->chunk_shift;
		if (end > size)
			end = size;
		w = write_marks(j, id, NULL, (size_t)(end - off), (off_t)off,
				&st.st_mtim);
		rc = w < 0 ? (int)w : 0;
	}
	free(need);
	if (!rc) { /* jnl_pt_grow() goes on from here */
		struct jnl_pt_pin *p;

		pthread_mutex_lock(&j->lock);
		p = pt_pin(j, id);
		if (p && p->grown < ((size >> j->chunk_shift) << j->chunk_shift))
			p->grown = (size >> j->chunk_shift) << j->chunk_shift;
		pthread_mutex_unlock(&j->lock);
	}
	return rc;
}

int jnl_pt_mark(struct jnl *j, jnl_id id)
{
	int rc = 0;

	if (!pt_pinned(j, id))
		return 0; /* the journal saw every write of it */
	/* write_marks() looks at the size again under rw (a truncation
	 * takes it exclusive): -EAGAIN if it changed meanwhile */
	for (int tries = 0; tries < 100; tries++) {
		rc = pt_mark_once(j, id);
		if (rc == 1)
			return 0; /* no staging file: nothing written */
		if (rc != -EAGAIN)
			break;
	}
	if (rc && rc != -ENOENT) {
		pt_mark_failed(j, id);
		LOG_ERR("cannot mark the staging file of node %" PRIu64
			" in '%s': %s", id, j->dir, strerror(-rc));
	}
	return rc;
}

int jnl_pt_mark_all(struct jnl *j)
{
	jnl_id ids[JNL_PT_PINS];
	unsigned int n;
	int rc = 0, r;

	/* a ref on each pin: none ends (and its node is cleaned) under a mark */
	pthread_mutex_lock(&j->lock);
	n = j->pt_npins;
	for (unsigned int i = 0; i < n; i++) {
		ids[i] = j->pt_pins[i].id;
		j->pt_pins[i].refs++;
	}
	pthread_mutex_unlock(&j->lock);
	for (unsigned int i = 0; i < n; i++) {
		r = jnl_pt_mark(j, ids[i]);
		if (r && r != -ENOENT && !rc)
			rc = r;
		pt_unpin(j, ids[i]);
	}
	return rc;
}

/* known[i]: has chunk @k0 + i (i < @n <= PT_BATCH) of @id a record, or a
 * mark pending? All true if that cannot be told (left to the last mark). */
static void pt_known(struct jnl *j, jnl_id id, uint64_t k0, uint64_t n,
		     bool *known)
{
	struct jnl_chunk_rec c;
	struct jnl_pent e;
	MDB_txn *txn;

	pthread_mutex_lock(&j->lock);
	for (uint64_t i = 0; i < n; i++) {
		pend_find(j, id, k0 + i, &e);
		known[i] = pent_held(&e);
	}
	pthread_mutex_unlock(&j->lock);
	if (jnl_rtx_begin(j, &txn)) {
		for (uint64_t i = 0; i < n; i++)
			known[i] = true;
		return;
	}
	for (uint64_t i = 0; i < n; i++)
		if (!known[i])
			known[i] = jnl_chunk_get(j, txn, id, k0 + i, &c) !=
				   -ENOENT;
	jnl_rtx_end(j);
}

/* jnl_pt_grow() of one node: mark [@from, the last whole chunk of its
 * staging file). Failures are left to the node's last jnl_pt_mark(),
 * which marks the whole file anyway (it logs them). */
static void pt_grow_one(struct jnl *j, jnl_id id, uint64_t from)
{
	struct jnl_pt_pin *p;
	bool known[PT_BATCH];
	struct stat st;
	uint64_t end;
	int fd;

	if (jnl_fd_get(j, id, false, &fd))
		return; /* no staging file yet: nothing written */
	if (fstat(fd, &st) < 0) {
		jnl_fd_put(j, id, fd);
		return;
	}
	jnl_fd_put(j, id, fd);
	end = (uint64_t)st.st_size >> j->chunk_shift; /* whole chunks */
	/* shrunk (a truncate): the chunks past it are the last mark's. Each
	 * run of chunks never marked (no record, no mark pending): one a
	 * jnl_pt_mark() (an fsync) took already is not marked again, it may
	 * be on the remote */
	for (uint64_t k0 = from >> j->chunk_shift; k0 < end; k0 += PT_BATCH) {
		uint64_t n = end - k0 < PT_BATCH ? end - k0 : PT_BATCH;

		pt_known(j, id, k0, n, known);
		for (uint64_t i = 0, a; i < n;) {
			while (i < n && known[i])
				i++;
			for (a = i; i < n && !known[i]; i++)
				;
			if (i > a &&
			    write_marks(j, id, NULL,
					(size_t)((i - a) << j->chunk_shift),
					(off_t)((k0 + a) << j->chunk_shift),
					&st.st_mtim) < 0)
				return;
		}
	}
	pthread_mutex_lock(&j->lock);
	p = pt_pin(j, id);
	if (p)
		p->grown = end << j->chunk_shift;
	pthread_mutex_unlock(&j->lock);
}

/* a ref on each pin open for JNL_PT_GROW_AFTER_MS, as jnl_pt_mark_all() */
void jnl_pt_grow(struct jnl *j)
{
	int64_t after = (int64_t)JNL_PT_GROW_AFTER_MS * 1000000;
	int64_t now = jnl_mono_ns();
	uint64_t from[JNL_PT_PINS];
	jnl_id ids[JNL_PT_PINS];
	unsigned int n = 0;

	pthread_mutex_lock(&j->lock);
	for (unsigned int i = 0; i < j->pt_npins; i++) {
		if (now - j->pt_pins[i].since < after)
			continue;
		ids[n] = j->pt_pins[i].id;
		from[n] = j->pt_pins[i].grown;
		j->pt_pins[i].refs++;
		n++;
	}
	pthread_mutex_unlock(&j->lock);
	for (unsigned int i = 0; i < n; i++) {
		if (!jnl_failed(j))
			pt_grow_one(j, ids[i], from[i]);
		pt_unpin(j, ids[i]);
	}
}

void jnl_pt_attr(struct jnl *j, jnl_id id, struct jnl_node *nd)
{
	struct stat st;
	int fd;

	if (!pt_pinned(j, id) || jnl_fd_get(j, id, false, &fd))
		return;
	if (fstat(fd, &st) == 0) {
		nd->size = (uint64_t)st.st_size;
		nd->mtime = st.st_mtim;
	}
	jnl_fd_put(j, id, fd);
}

void jnl_pt_times(struct jnl *j, jnl_id id, const struct timespec *mtime)
{
	struct timespec ts[2] = { { 0, UTIME_OMIT }, *mtime };
	int fd;

	if (!pt_pinned(j, id) || jnl_fd_get(j, id, false, &fd))
		return;
	if (futimens(fd, ts) < 0)
		LOG_WARN("cannot set the mtime of the staging file of node %"
			 PRIu64 " in '%s': %s", id, j->dir, strerror(errno));
	jnl_fd_put(j, id, fd);
}

int jnl_chunk_fill(struct jnl *j, jnl_id id, uint64_t index, const void *buf,
		   size_t len)
{
	uint64_t start = index << j->chunk_shift;
	int64_t deadline = 0;
	struct jnl_pnode pn;
	struct jnl_nrec *n;
	struct span sp;
	unsigned char sha[32];
	int fd, rc;
	ssize_t w;

	rc = jnl_failed(j);
	if (rc)
		return rc;
	if (len > j->chunk_size || index > ((uint64_t)INT64_MAX >> j->chunk_shift))
		return -EINVAL;
	n = malloc(sizeof(*n));
	if (!n)
		return -ENOMEM;
	rc = span_init(j, &sp, start, 1);
	if (rc) {
		free(n);
		return rc;
	}
again:
	disk_look(j);
	pthread_rwlock_wrlock(&j->rw);
	rc = span_look(j, id, &sp, &pn, n);
	if (rc || sp.held[0])
		goto out; /* held already: another thread filled or wrote */
	/* keep only the bytes that still belong to the merged content */
	if (n->r.rvalid <= start)
		goto out;
	if (len > n->r.rvalid - start)
		len = (size_t)(n->r.rvalid - start);
	if (!len)
		goto out;
	pthread_mutex_lock(&j->lock);
	rc = reserve(j, len);
	pthread_mutex_unlock(&j->lock);
	if (rc == -EAGAIN) {
		pthread_rwlock_unlock(&j->rw);
		rc = room_wait(j, id, len, &deadline);
		if (!rc)
			goto again;
		goto out_unlocked;
	}
	if (rc)
		goto out;
	rc = jnl_fd_get(j, id, true, &fd);
	if (!rc) {
		w = sys_pwrite_all(fd, buf, len, (off_t)start);
		jnl_fd_put(j, id, fd);
		rc = w < 0 ? (int)w : 0;
	}
	if (!rc && !EVP_Digest(buf, len, sha, NULL, EVP_sha256(), NULL))
		rc = -ENOMEM;
	pthread_mutex_lock(&j->lock);
	if (rc) {
		j->pend_new -= len;
	} else {
		struct jnl_pent *e = jnl_ptab_get(&j->pend, id, index);

		if (!e)
			BUG("out of memory recording a chunk mark");
		e->flags |= JNL_PENT_FILL;
		if (len > e->len)
			e->len = (uint32_t)len;
		e->added += len;
		memcpy(e->sha256, sha, sizeof(sha));
		pthread_cond_signal(&j->cond);
	}
	pthread_mutex_unlock(&j->lock);
	if (rc)
		jnl_fail(j, rc);
out:
	pthread_rwlock_unlock(&j->rw);
out_unlocked:
	span_free(&sp);
	free(n);
	return rc;
}

ssize_t jnl_read(struct jnl *j, jnl_id id, void *buf, size_t len, off_t off,
		 bool *have)
{
	uint64_t o = (uint64_t)off, size, count = 0;
	struct jnl_pnode pn;
	struct jnl_nrec *n;
	struct span sp;
	ssize_t got = 0;
	int fd, rc;

	rc = jnl_failed(j);
	if (rc)
		return rc;
	if (off < 0 || len > SSIZE_MAX || o + len < o)
		return -EINVAL;
	if (!len)
		return 0;
	n = malloc(sizeof(*n));
	if (!n)
		return -ENOMEM;
	rc = span_init(j, &sp, o, len);
	if (rc) {
		free(n);
		return rc;
	}
	/* shared: "held" and the staging bytes cannot go away between the
	 * look and the pread (truncate, jnl_node_clean take rw exclusive) */
	pthread_rwlock_rdlock(&j->rw);
	rc = span_look(j, id, &sp, &pn, n);
	if (rc)
		goto out;
	jnl_pnode_merge(&pn, &n->r);
	size = n->r.size;
	for (uint64_t k = 0; k < sp.count; k++) {
		uint64_t start = (sp.first + k) << j->chunk_shift;

		if (have)
			have[k] = sp.held[k] || start >= n->r.rvalid ||
				  start >= size;
	}
	if (o >= size)
		goto out;
	count = size - o < len ? size - o : len;
	rc = jnl_fd_get(j, id, false, &fd);
	if (rc == -ENOENT) {
		rc = 0; /* nothing staged: all holes */
	} else if (!rc) {
		got = sys_pread_all(fd, buf, (size_t)count, off);
		jnl_fd_put(j, id, fd);
		if (got < 0)
			rc = jnl_fail(j, (int)got);
	}
	if (!rc && (uint64_t)got < count)
		memset((char *)buf + got, 0, (size_t)(count - (uint64_t)got));
out:
	pthread_rwlock_unlock(&j->rw);
	span_free(&sp);
	free(n);
	return rc < 0 ? rc : (ssize_t)count;
}

int jnl_fsync_node(struct jnl *j, jnl_id id)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	MDB_txn *txn;
	int rc;

	if (!n)
		return -ENOMEM;
	rc = jnl_rtx_begin(j, &txn);
	if (!rc) {
		rc = jnl_node_read(j, txn, id, n);
		jnl_rtx_end(j);
	}
	free(n);
	/* its marks only (its staging file), and the whole batch */
	return rc ? rc : jnl_commit_pending(j, false, id);
}

/* --- claim and release -------------------------------------------------------- */

int jnl_chunk_claim(struct jnl *j, struct jnl_chunk_ref *out, int max)
{
	return jnl_chunk_claim_upto(j, out, max, UINT64_MAX);
}

int jnl_chunk_claim_upto(struct jnl *j, struct jnl_chunk_ref *out, int max,
			 uint64_t max_bytes)
{
	uint64_t bytes = 0;
	int nkeys = 0;
	struct jnl_key16 *keys;
	struct jnl_nrec *n;
	struct jnl_wtx w;
	MDB_cursor *c;
	MDB_val k, v;
	int rc, count = 0;

	if (max <= 0)
		return max < 0 ? -EINVAL : 0;
	if (max > JNL_CLAIM_MAX)
		max = JNL_CLAIM_MAX;
	keys = malloc((size_t)max * sizeof(*keys));
	n = malloc(sizeof(*n));
	if (!keys || !n) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = jnl_wtx_begin(j, &w, false);
	if (rc)
		goto out_free;
	rc = mdb_cursor_open(w.txn, j->db_dirtyq, &c);
	if (rc) {
		rc = jnl_mdb(j, rc);
		goto out_abort;
	}
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc && nkeys < max;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		if (v.mv_size != 16) {
			rc = MDB_CORRUPTED;
			break;
		}
		memcpy(keys[nkeys++].b, v.mv_data, 16);
	}
	mdb_cursor_close(c);
	rc = rc == MDB_NOTFOUND ? 0 : jnl_mdb(j, rc);
	for (int i = 0; i < nkeys && !rc; i++) {
		jnl_id id = jnl_be64_get(keys[i].b);
		uint64_t idx = jnl_be64_get(keys[i].b + 8);
		struct jnl_chunk_rec old, nw;

		rc = jnl_chunk_get(j, w.txn, id, idx, &old);
		if (!rc)
			rc = jnl_node_read(j, w.txn, id, n);
		if (!rc && (old.state != JNL_CHUNK_DIRTY ||
			    !jnl_node_claimable(&n->r))) {
			LOG_ERR("BUG: journal '%s': dirtyq names chunk %" PRIu64
				"/%" PRIu64 " that is not claimable",
				j->dir, id, idx);
			rc = jnl_fail(j, -EIO);
		}
		if (rc)
			break;
		if (count && bytes + old.length > max_bytes)
			break; /* the first one always goes */
		bytes += old.length;
		nw = old;
		nw.state = JNL_CHUNK_INFLIGHT;
		nw.claim_gen = old.generation;
		/* DIRTY -> INFLIGHT: n's unflushed count stays */
		rc = chunk_move(&w, id, n, idx, &old, &nw);
		out[count].id = id;
		out[count].index = idx;
		out[count].generation = old.generation;
		out[count].length = old.length;
		count++;
	}
	if (rc)
		goto out_abort;
	/* durable before a byte is sent: recovery counts (and resends) only
	 * INFLIGHT chunks; the stream's earlier releases go with it */
	w.sync = count > 0;
	rc = jnl_wtx_commit(&w);
	goto out_free;

out_abort:
	jnl_wtx_abort(&w);
out_free:
	free(keys);
	free(n);
	return rc ? rc : count;
}

int jnl_chunk_release(struct jnl *j, const struct jnl_chunk_ref *c, bool ok,
		      const unsigned char sha256[32])
{
	struct jnl_chunk_rec old, nw;
	struct jnl_nrec *n;
	struct jnl_wtx w;
	bool pressure;
	int rc;

	if (!c || (ok && !sha256))
		return -EINVAL;
	n = malloc(sizeof(*n));
	if (!n)
		return -ENOMEM;
	pthread_mutex_lock(&j->lock);
	pressure = ok && room_pressure(j);
	pthread_mutex_unlock(&j->lock);
	if (pressure) /* drop_flushed() below: chunks stop being held */
		pthread_rwlock_wrlock(&j->rw);
	rc = jnl_wtx_begin(j, &w, false);
	if (rc)
		goto out_free;
	rc = jnl_chunk_get(j, w.txn, c->id, c->index, &old);
	if (rc == -ENOENT || (!rc && jnl_claim_stale(&old, c))) {
		rc = 0; /* stale: truncated away, or recovered and reclaimed */
		goto out_abort;
	}
	if (!rc)
		rc = jnl_node_read(j, w.txn, c->id, n);
	if (rc)
		goto out_abort;
	nw = old;
	nw.claim_gen = 0;
	if (ok && old.generation == c->generation) {
		nw.state = JNL_CHUNK_FLUSHED;
		memcpy(nw.sha256, sha256, sizeof(nw.sha256));
	} else {
		nw.state = JNL_CHUNK_DIRTY; /* keeps its dseq: oldest first */
	}
	rc = chunk_move(&w, c->id, n, c->index, &old, &nw);
	if (!rc && pressure && nw.state == JNL_CHUNK_FLUSHED) {
		/* backpressure: the remote has it, give the room back */
		bool any;

		rc = drop_flushed(&w, c->id, n, &any);
	}
	if (!rc)
		rc = jnl_node_write(j, w.txn, c->id, n);
	if (!rc && nw.state == JNL_CHUNK_FLUSHED && !n->r.unflushed &&
	    jnl_node_claimable(&n->r)) {
		/* the node's last chunk went out: finish it (journal.h) */
		struct jnl_orec o;
		uint64_t seq;

		memset(&o, 0, sizeof(o));
		o.r.type = JNL_OP_FINISH;
		o.r.id = c->id;
		rc = jnl_op_append(&w, &o, &seq);
	}
	if (rc)
		goto out_abort;
	rc = jnl_wtx_commit(&w);
	if (!rc && (n->r.flags & JNL_NODE_UNLINKED)) {
		/* jnl_node_clean() left it for this release */
		pthread_mutex_lock(&j->lock);
		jnl_clean_later_locked(j, c->id);
		pthread_mutex_unlock(&j->lock);
	}
	goto out_free;

out_abort:
	jnl_wtx_abort(&w);
out_free:
	if (pressure)
		pthread_rwlock_unlock(&j->rw);
	free(n);
	return rc;
}

int jnl_chunk_claimed(struct jnl *j, const struct jnl_chunk_ref *c)
{
	struct jnl_chunk_rec cr;
	MDB_txn *txn;
	int rc = jnl_rtx_begin(j, &txn);

	if (rc)
		return rc;
	rc = jnl_chunk_get(j, txn, c->id, c->index, &cr);
	jnl_rtx_end(j);
	/* a truncate that shortened it keeps its generation: what was read
	 * for the claim is longer than the chunk now (invariant 19) */
	if (!rc && (jnl_claim_stale(&cr, c) || cr.length != c->length))
		rc = -ENOENT;
	return rc;
}

/* --- clean ---------------------------------------------------------------------- */

/* Has node @n something the remote does not have yet (a create, an op, a
 * chunk not FLUSHED), or no remote name? */
static bool node_pending(const struct jnl_nrec *n)
{
	return (n->r.flags & (JNL_NODE_LOCAL | JNL_NODE_UNLINKED)) ||
	       !n->r.rparent || n->r.unflushed || n->r.nops;
}

/* May node @n (read in some transaction) be cleaned? 0 yes, 1 nothing to
 * clean (not a regular file), -EBUSY not yet (journal.h). */
static int clean_ok(const struct jnl_nrec *n)
{
	if (!S_ISREG(n->r.mode))
		return 1;
	if (n->r.flags & JNL_NODE_UNLINKED)
		return 0; /* its data goes nowhere: dropped (if not open) */
	return node_pending(n) ? -EBUSY : 0;
}

/* Let the committer clean node @id (jnl_node_clean()). lock held. */
void jnl_clean_later_locked(struct jnl *j, jnl_id id)
{
	if (!jnl_u64set_add(&j->clean_due, id))
		pthread_cond_signal(&j->cond);
}

int jnl_node_open(struct jnl *j, jnl_id id)
{
	int64_t n;

	pthread_mutex_lock(&j->lock);
	n = jnl_u64count_add(&j->opens, id, 1);
	pthread_mutex_unlock(&j->lock);
	return n < 0 ? (int)n : 0;
}

void jnl_node_close(struct jnl *j, jnl_id id)
{
	pthread_mutex_lock(&j->lock);
	if (jnl_u64count_add(&j->opens, id, -1) == 0 &&
	    jnl_u64set_has(&j->gone_open, id)) { /* unlinked while open */
		jnl_u64set_del(&j->gone_open, id);
		jnl_clean_later_locked(j, id);
	}
	pthread_mutex_unlock(&j->lock);
}

void jnl_node_gone_locked(struct jnl *j, jnl_id id)
{
	if (!jnl_u64count_get(&j->opens, id))
		jnl_clean_later_locked(j, id);
	else if (jnl_u64set_add(&j->gone_open, id))
		jnl_clean_later_locked(j, id); /* no memory: the clean waits
						  for the sweep after an open */
}

/* Has node @id a mark in pend? lock held, and commit_lock (committing is
 * empty then). */
static bool pend_has_node(struct jnl *j, jnl_id id)
{
	for (size_t i = 0; i < j->pend.cap; i++) {
		const struct jnl_pent *e = &j->pend.e[i];

		if ((e->flags & JNL_PENT_USED) && e->id == id &&
		    (e->flags & ~(unsigned int)JNL_PENT_USED))
			return true;
	}
	return false;
}

/*
 * Begin a write transaction on node @id with nobody else at its records:
 * no mark between memory and LMDB (commit_lock), no writer, reader or
 * filler between our look and our I/O (rw exclusive), and no mark of @id
 * pending (-EBUSY; with @commit they are committed first, under rw
 * exclusive so that none comes after). On success end with quiet_end()
 * after the commit or abort; on error nothing is held.
 */
int jnl_quiet_begin(struct jnl *j, jnl_id id, bool commit, struct jnl_wtx *w)
{
	int rc = 0;

	pthread_mutex_lock(&j->commit_lock);
	for (int tries = 0;; tries++) {
		/* not under rw: the commit gives staging back (jnl_gc_run()
		 * takes rw); a writer may mark again before we have rw */
		if (commit)
			rc = jnl_commit_pending(j, true, id);
		pthread_rwlock_wrlock(&j->rw);
		pthread_mutex_lock(&j->lock);
		if (!rc)
			rc = pend_has_node(j, id) ? -EBUSY : 0;
		pthread_mutex_unlock(&j->lock);
		if (rc != -EBUSY || !commit || tries == 8)
			break;
		pthread_rwlock_unlock(&j->rw);
		rc = 0;
	}
	if (!rc)
		rc = jnl_wtx_begin(j, w, commit);
	if (rc) {
		pthread_rwlock_unlock(&j->rw);
		pthread_mutex_unlock(&j->commit_lock);
	}
	return rc;
}

void jnl_quiet_end(struct jnl *j)
{
	pthread_rwlock_unlock(&j->rw);
	pthread_mutex_unlock(&j->commit_lock);
}

#define quiet_begin(j, id, w) jnl_quiet_begin(j, id, false, w)
#define quiet_end(j) jnl_quiet_end(j)

int jnl_chunks_conflict(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n)
{
	struct jnl *j = w->j;
	uint64_t below = (n->r.rvalid + j->chunk_size - 1) >> j->chunk_shift;
	struct jnl_chunk_rec *recs;
	uint64_t *idx, next = 0;
	size_t count;
	int rc;

	rc = chunks_of(w, id, 0, &idx, &recs, &count);
	for (size_t i = 0; i < count && !rc; i++) {
		struct jnl_chunk_rec nw = recs[i];

		if (idx[i] < below && idx[i] != next)
			break; /* a chunk of the remote's not held */
		next = idx[i] + 1;
		nw.state = JNL_CHUNK_DIRTY;
		nw.generation = w->m.next_gen++;
		nw.claim_gen = 0;
		if (recs[i].state != JNL_CHUNK_DIRTY)
			nw.dseq = w->m.next_dseq++;
		w->m_dirty = true;
		rc = chunk_move(w, id, n, idx[i], &recs[i], &nw);
	}
	if (!rc && next < below)
		rc = -EAGAIN;
	free(idx);
	free(recs);
	return rc;
}

/* Does node @id have a chunk record? */
static int has_chunks(struct jnl *j, MDB_txn *txn, jnl_id id)
{
	struct jnl_key16 kk = jnl_key16(id, 0);
	MDB_val k = { 16, kk.b }, v;
	MDB_cursor *c;
	int rc;

	rc = mdb_cursor_open(txn, j->db_chunks, &c);
	if (rc)
		return jnl_mdb(j, rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	mdb_cursor_close(c);
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return jnl_mdb(j, rc);
	return k.mv_size == 16 && jnl_be64_get(k.mv_data) == id;
}

/* Close the cached staging fd of @id and remove data/<id>. commit_lock and
 * rw exclusive held: nobody writes the file; the passthrough look-ups
 * (jnl_pt_attr(), jnl_pt_times(), pt_mark_once()) hold neither and may
 * still use its fd, which then goes with their jnl_fd_put(). */
static void staging_remove(struct jnl *j, jnl_id id)
{
	char name[24];
	int fd = -1, rc;

	pthread_mutex_lock(&j->lock);
	for (int i = 0; i < JNL_FD_SLOTS; i++) {
		struct jnl_fdslot *s = &j->fds[i];

		if (s->id != id || s->gone)
			continue;
		if (s->refs) {
			s->gone = true;
			continue;
		}
		fd = s->fd;
		s->id = 0;
	}
	pthread_mutex_unlock(&j->lock);
	if (fd >= 0)
		close(fd);
	snprintf(name, sizeof(name), "%" PRIu64, id);
	rc = unlinkat(j->datafd, name, 0) < 0 ? -errno : 0;
	if (rc && rc != -ENOENT) /* harmless: see jnl_node_clean() */
		LOG_WARN("cannot remove staging file of node %" PRIu64
			 " in '%s': %s", id, j->dir, strerror(-rc));
}

int jnl_node_clean(struct jnl *j, jnl_id id)
{
	struct jnl_chunk_rec *recs = NULL;
	uint64_t *idx = NULL;
	struct jnl_nrec *n;
	struct jnl_wtx w;
	size_t count = 0;
	bool unlinked;
	MDB_txn *txn;
	int rc;

	n = malloc(sizeof(*n));
	if (!n)
		return -ENOMEM;
	/* a cheap look first: most calls find nothing to do */
	rc = jnl_rtx_begin(j, &txn);
	if (rc)
		goto out_free;
	rc = jnl_node_read(j, txn, id, n);
	if (!rc)
		rc = clean_ok(n);
	unlinked = !rc && (n->r.flags & JNL_NODE_UNLINKED);
	if (!rc) {
		rc = has_chunks(j, txn, id);
		rc = rc < 0 ? rc : !rc;
	}
	jnl_rtx_end(j);
	if (rc)
		goto out_free;

	/* an unlinked node's marks are committed first: they go too */
	rc = jnl_quiet_begin(j, id, unlinked, &w);
	if (rc)
		goto out_free;
	rc = jnl_node_read(j, w.txn, id, n);
	if (!rc)
		rc = clean_ok(n);
	if (!rc && (n->r.flags & JNL_NODE_UNLINKED)) {
		/* open: the application may read it still (its close
		 * calls this again) */
		pthread_mutex_lock(&j->lock);
		if (jnl_u64count_get(&j->opens, id))
			rc = -EBUSY;
		pthread_mutex_unlock(&j->lock);
	}
	if (!rc) {
		/* the kernel writes it (passthrough): its chunk records stay
		 * for jnl_pt_mark() to compare with; cleaned after the pin
		 * (pt_unpin(), the committer) */
		pthread_mutex_lock(&j->lock);
		if (j->pt_npins && pt_pin(j, id)) {
			rc = -EBUSY;
			if (jnl_u64set_add(&j->pt_unclean, id))
				rc = 1; /* no memory: clean it after all */
		}
		pthread_mutex_unlock(&j->lock);
		if (rc == 1)
			rc = 0;
	}
	if (!rc)
		rc = chunks_of(&w, id, 0, &idx, &recs, &count);
	for (size_t i = 0; i < count && !rc; i++) /* a stream's: its
						    release calls again */
		if (recs[i].state == JNL_CHUNK_INFLIGHT)
			rc = -EBUSY;
	for (size_t i = 0; i < count && !rc; i++)
		rc = chunk_move(&w, id, n, idx[i], &recs[i], NULL);
	if (!rc) {
		/* the remote holds the merged content now: read it there */
		n->r.rvalid = n->r.size;
		rc = jnl_node_write(j, w.txn, id, n);
	}
	/* the staging file goes once this is durable (jnl_gc_run()) */
	if (!rc)
		rc = jnl_gc_add(j, id, 0, 0);
	if (rc)
		jnl_wtx_abort(&w);
	else
		rc = jnl_wtx_commit(&w);
	quiet_end(j);
out_free:
	free(idx);
	free(recs);
	free(n);
	return rc == 1 ? 0 : rc;
}

int jnl_sweep(struct jnl *j, jnl_id *from)
{
	struct jnl_key16 key = jnl_key16(*from, 0);
	MDB_val k = { 16, key.b }, v;
	jnl_id ids[64], next = *from;
	struct jnl_nrec *n;
	size_t count = 0;
	MDB_cursor *c = NULL;
	MDB_txn *txn;
	int rc, g, looked = 0;

	n = malloc(sizeof(*n));
	if (!n)
		return -ENOMEM;
	rc = jnl_rtx_begin(j, &txn);
	if (rc)
		goto out_free;
	g = mdb_cursor_open(txn, j->db_chunks, &c);
	if (!g)
		g = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	/* one node read per node with chunk records, the next found by key:
	 * (id + 1, 0) */
	while (!g && count < 64 && looked++ < 256) {
		jnl_id id = jnl_be64_get(k.mv_data);

		rc = jnl_node_read(j, txn, id, n);
		if (rc)
			break;
		if (!clean_ok(n))
			ids[count++] = id;
		next = id + 1;
		key = jnl_key16(next, 0);
		k.mv_size = 16;
		k.mv_data = key.b;
		g = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	}
	if (c)
		mdb_cursor_close(c);
	jnl_rtx_end(j);
	if (!rc && g && g != MDB_NOTFOUND)
		rc = jnl_mdb(j, g);
	if (rc)
		goto out_free;
	*from = g == MDB_NOTFOUND ? 0 : next;
	for (size_t i = 0; i < count; i++) {
		int r = jnl_node_clean(j, ids[i]);

		if (r == -EIO) {
			rc = r;
			break;
		}
	}
	if (!rc)
		rc = (int)count;
out_free:
	free(n);
	return rc;
}

int jnl_node_refresh(struct jnl *j, jnl_id id, const struct stat *st)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	struct jnl_wtx w;
	int rc;

	if (!n)
		return -ENOMEM;
	rc = quiet_begin(j, id, &w);
	if (rc)
		goto out_free;
	rc = jnl_node_read(j, w.txn, id, n);
	if (!rc && node_pending(n))
		rc = -EBUSY;
	if (!rc && S_ISREG(n->r.mode)) {
		rc = has_chunks(j, w.txn, id);
		rc = rc < 0 ? rc : rc ? -EBUSY : 0;
	}
	if (!rc && ((uint32_t)st->st_mode & S_IFMT) != (n->r.mode & S_IFMT))
		rc = -ESTALE;
	if (!rc && n->r.base_ino && (n->r.base_ino != (uint64_t)st->st_ino ||
				     n->r.base_dev != (uint64_t)st->st_dev))
		rc = -ESTALE;
	if (!rc) {
		jnl_rec_take_stat(&n->r, st);
		if (n->r.base_ino) /* imported: a new base */
			jnl_rec_base_set(&n->r, st);
		rc = jnl_node_write(j, w.txn, id, n);
	}
	if (rc)
		jnl_wtx_abort(&w);
	else
		rc = jnl_wtx_commit(&w);
	quiet_end(j);
out_free:
	free(n);
	return rc;
}

/* --- giving staging back ------------------------------------------------ */

/* Is chunk (id, idx) held: a record, or a mark? txn_lock held, commit_lock
 * (committing is empty). */
static int chunk_held(struct jnl *j, MDB_txn *txn, jnl_id id, uint64_t idx)
{
	struct jnl_chunk_rec c;
	struct jnl_pent e;
	int rc;

	pthread_mutex_lock(&j->lock);
	pend_find(j, id, idx, &e);
	pthread_mutex_unlock(&j->lock);
	if (pent_held(&e))
		return 1;
	rc = jnl_chunk_get(j, txn, id, idx, &c);
	return rc == -ENOENT ? 0 : rc < 0 ? rc : 1;
}

void jnl_gc_run(struct jnl *j, const struct jnl_gc *g)
{
	struct jnl_gc_ent *todo;
	size_t n = 0;
	bool txn_held;
	MDB_txn *txn;
	int rc;

	/* one entry per chunk to punch, or per file to remove */
	for (size_t i = 0; i < g->n; i++)
		n += g->e[i].count ? g->e[i].count : 1;
	todo = malloc((n ? n : 1) * sizeof(*todo));
	if (!todo)
		return; /* the bytes stay: harmless */
	n = 0;
	/* nothing can become held meanwhile (rw exclusive, commit_lock) */
	pthread_rwlock_wrlock(&j->rw);
	rc = jnl_rtx_begin(j, &txn);
	txn_held = !rc;
	for (size_t i = 0; i < g->n && !rc; i++) {
		const struct jnl_gc_ent *e = &g->e[i];

		pthread_mutex_lock(&j->lock);
		if (j->pt_npins && pt_pin(j, e->id)) {
			/* the kernel writes it: its bytes stay */
			pthread_mutex_unlock(&j->lock);
			continue;
		}
		pthread_mutex_unlock(&j->lock);
		if (!e->count) {
			pthread_mutex_lock(&j->lock);
			rc = pend_has_node(j, e->id) ? 1 : 0;
			pthread_mutex_unlock(&j->lock);
			if (!rc)
				rc = has_chunks(j, txn, e->id);
			if (!rc)
				todo[n++] = *e;
			rc = rc > 0 ? 0 : rc;
			continue;
		}
		for (uint64_t k = e->first; k < e->first + e->count && !rc;
		     k++) {
			rc = chunk_held(j, txn, e->id, k);
			if (!rc)
				todo[n++] = (struct jnl_gc_ent){ e->id, k, 1 };
			rc = rc > 0 ? 0 : rc;
		}
	}
	if (txn_held)
		jnl_rtx_end(j);
	for (size_t i = 0; i < n && !rc; i++) {
		int fd;

		if (!todo[i].count) {
			staging_remove(j, todo[i].id);
			continue;
		}
		if (jnl_fd_get(j, todo[i].id, false, &fd))
			continue;
		/* not held: nobody reads these bytes; failing is harmless */
		(void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				(off_t)(todo[i].first << j->chunk_shift),
				(off_t)j->chunk_size);
		jnl_fd_put(j, todo[i].id, fd);
	}
	pthread_rwlock_unlock(&j->rw);
	free(todo);
	if (n) { /* disk bytes came back: writers may look again */
		pthread_mutex_lock(&j->lock);
		j->disk_at = 0;
		jnl_room_signal(j);
		pthread_mutex_unlock(&j->lock);
	}
}
