/*
 * check.c - jnl_assert_sane(): invariants 1-9 of journal.c, checked by a
 * full scan of every database. O(journal): tests and debugging only.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "journal_i.h"
#include "log.h"

struct ninfo {
	jnl_id id;
	struct jnl_node_rec r;
	uint64_t unflushed, nops, names, subdirs; /* counted */
};

struct check {
	struct jnl *j;
	MDB_txn *txn;
	struct jnl_meta_rec m;
	struct ninfo *nodes;
	size_t count, cap;
};

static struct ninfo *node_find(struct check *ck, jnl_id id)
{
	size_t lo = 0, hi = ck->count;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (ck->nodes[mid].id == id)
			return &ck->nodes[mid];
		if (ck->nodes[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

typedef void (*visit_fn)(struct check *ck, MDB_val *k, MDB_val *v);

static void scan(struct check *ck, MDB_dbi dbi, const char *what,
		 visit_fn fn)
{
	MDB_cursor *c;
	MDB_val k, v;
	int rc;

	if (mdb_cursor_open(ck->txn, dbi, &c))
		BUG("journal sanity: cannot scan %s", what);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT))
		fn(ck, &k, &v);
	if (rc != MDB_NOTFOUND)
		BUG("journal sanity: scanning %s: %s", what, mdb_strerror(rc));
	mdb_cursor_close(c);
}

static void visit_node(struct check *ck, MDB_val *k, MDB_val *v)
{
	struct jnl_nrec n;
	jnl_id id;

	(void)v;
	if (k->mv_size != 8)
		BUG("node key of %zu bytes", k->mv_size);
	id = jnl_be64_get(k->mv_data);
	if (jnl_node_read(ck->j, ck->txn, id, &n))
		BUG("node %" PRIu64 " unreadable", id);
	if (id >= ck->m.next_id)
		BUG("inv 6: node %" PRIu64 " >= next_id %" PRIu64, id,
		    ck->m.next_id);
	if (ck->count == ck->cap) {
		ck->cap = ck->cap ? ck->cap * 2 : 64;
		ck->nodes = realloc(ck->nodes, ck->cap * sizeof(*ck->nodes));
		if (!ck->nodes)
			BUG("out of memory");
	}
	memset(&ck->nodes[ck->count], 0, sizeof(ck->nodes[0]));
	ck->nodes[ck->count].id = id;
	ck->nodes[ck->count].r = n.r;
	ck->count++;
}

static uint64_t dirty_q, inflight_q, sums[4];

static bool key_in(struct check *ck, MDB_dbi dbi, const void *key,
		   size_t len, MDB_val *out)
{
	MDB_val k = { len, (void *)key };

	return !mdb_get(ck->txn, dbi, &k, out);
}

static void visit_chunk(struct check *ck, MDB_val *k, MDB_val *v)
{
	struct jnl_chunk_rec c;
	struct ninfo *n;
	jnl_id id;
	uint64_t idx;
	MDB_val q;

	if (k->mv_size != 16 || v->mv_size != sizeof(c))
		BUG("inv 1: chunk record of bad size");
	id = jnl_be64_get(k->mv_data);
	idx = jnl_be64_get((unsigned char *)k->mv_data + 8);
	memcpy(&c, v->mv_data, sizeof(c));
	n = node_find(ck, id);
	if (!n)
		BUG("inv 1: chunk %" PRIu64 "/%" PRIu64 " of no node", id, idx);
	if (c.version != JNL_CHUNK_REC_VERSION || c.state < JNL_CHUNK_DIRTY ||
	    c.state > JNL_CHUNK_FLUSHED)
		BUG("inv 1: chunk %" PRIu64 "/%" PRIu64 " in state %d", id, idx,
		    c.state);
	if (!c.length || c.length > ck->j->chunk_size)
		BUG("inv 1: chunk %" PRIu64 "/%" PRIu64 " length %" PRIu32, id,
		    idx, c.length);
	if (c.generation >= ck->m.next_gen)
		BUG("inv 5: chunk generation %" PRIu64 " >= next_gen",
		    c.generation);
	sums[c.state] += c.length;
	if (c.state != JNL_CHUNK_FLUSHED)
		n->unflushed++;
	if (c.state == JNL_CHUNK_INFLIGHT) {
		inflight_q++;
		if (!key_in(ck, ck->j->db_inflight, k->mv_data, 16, &q))
			BUG("inv 2: INFLIGHT chunk %" PRIu64 "/%" PRIu64
			    " not in inflight", id, idx);
		if (c.claim_gen > c.generation)
			BUG("inv 5: chunk %" PRIu64 "/%" PRIu64 " claimed at "
			    "generation %" PRIu64 " > %" PRIu64, id, idx,
			    c.claim_gen, c.generation);
	}
	if (c.state == JNL_CHUNK_DIRTY && jnl_node_claimable(&n->r)) {
		unsigned char dk[8];

		dirty_q++;
		jnl_be64_put(dk, c.dseq);
		if (!key_in(ck, ck->j->db_dirtyq, dk, 8, &q) ||
		    q.mv_size != 16 || memcmp(q.mv_data, k->mv_data, 16))
			BUG("inv 3: DIRTY chunk %" PRIu64 "/%" PRIu64
			    " of a claimable node not in dirtyq", id, idx);
	}
	if (c.state == JNL_CHUNK_DIRTY && c.dseq >= ck->m.next_dseq)
		BUG("inv 3: dseq %" PRIu64 " >= next_dseq", c.dseq);
}

static uint64_t count_q;

static void visit_count(struct check *ck, MDB_val *k, MDB_val *v)
{
	(void)ck;
	(void)k;
	(void)v;
	count_q++;
}

static void visit_dirtyq(struct check *ck, MDB_val *k, MDB_val *v)
{
	struct jnl_chunk_rec c;
	MDB_val cv;

	count_q++;
	if (k->mv_size != 8 || v->mv_size != 16 ||
	    !key_in(ck, ck->j->db_chunks, v->mv_data, 16, &cv))
		BUG("inv 3: dirtyq entry names no chunk");
	memcpy(&c, cv.mv_data, sizeof(c));
	if (c.state != JNL_CHUNK_DIRTY || c.dseq != jnl_be64_get(k->mv_data))
		BUG("inv 3: dirtyq entry %" PRIu64 " names a chunk in state "
		    "%d at dseq %" PRIu64, jnl_be64_get(k->mv_data), c.state,
		    c.dseq);
}

static uint64_t live_dentries;

/* folds: each name is a live dentry of the key's parent and folds to the
 * key; counted against live_dentries (one each) */
static void visit_fold(struct check *ck, MDB_val *k, MDB_val *v)
{
	char name[NAME_MAX + 1];
	struct jnl_dkey dk, fk;
	struct jnl_dval d;
	MDB_val dv;

	count_q++;
	if (k->mv_size < 9 || v->mv_size < 1 || v->mv_size > NAME_MAX ||
	    k->mv_size > sizeof(fk.b))
		BUG("folds: entry of bad size");
	memcpy(name, v->mv_data, v->mv_size);
	name[v->mv_size] = '\0';
	dk = jnl_dkey(jnl_be64_get(k->mv_data), name);
	fk = jnl_fold_key(jnl_be64_get(k->mv_data), name);
	if (fk.len != k->mv_size || memcmp(fk.b, k->mv_data, k->mv_size))
		BUG("folds: '%s' does not fold to '%.*s'", name,
		    (int)k->mv_size - 8, (char *)k->mv_data + 8);
	if (!key_in(ck, ck->j->db_dentries, dk.b, dk.len, &dv) ||
	    dv.mv_size != sizeof(d))
		BUG("folds: '%.*s' is no dentry", (int)v->mv_size,
		    (char *)v->mv_data);
	memcpy(&d, dv.mv_data, sizeof(d));
	if (!d.id)
		BUG("folds: '%.*s' is a whiteout", (int)v->mv_size,
		    (char *)v->mv_data);
}

static void visit_dentry(struct check *ck, MDB_val *k, MDB_val *v)
{
	struct jnl_dval d;
	struct ninfo *p, *n;
	jnl_id parent;

	if (k->mv_size < 9 || k->mv_size > 8 + NAME_MAX ||
	    v->mv_size != sizeof(d))
		BUG("inv 7: dentry of bad size");
	parent = jnl_be64_get(k->mv_data);
	memcpy(&d, v->mv_data, sizeof(d));
	p = node_find(ck, parent);
	if (!p || !S_ISDIR(p->r.mode))
		BUG("inv 7: dentry '%.*s' in %" PRIu64 ", not a directory",
		    (int)k->mv_size - 8, (char *)k->mv_data + 8, parent);
	if (!d.id) {
		if (!d.wseq || d.wseq >= ck->m.next_seq)
			BUG("inv 7: whiteout '%.*s' of op %" PRIu64,
			    (int)k->mv_size - 8, (char *)k->mv_data + 8,
			    d.wseq);
		return;
	}
	live_dentries++;
	n = node_find(ck, d.id);
	if (!n)
		BUG("inv 7: dentry '%.*s' names no node (%" PRIu64 ")",
		    (int)k->mv_size - 8, (char *)k->mv_data + 8, d.id);
	n->names++;
	if (S_ISDIR(n->r.mode)) {
		p->subdirs++;
		if (n->r.mparent != parent)
			BUG("inv 7: directory %" PRIu64 " in %" PRIu64
			    " has mparent %" PRIu64, d.id, parent,
			    n->r.mparent);
	}
}

static uint64_t ops_count;

static void visit_op(struct check *ck, MDB_val *k, MDB_val *v)
{
	struct jnl_orec o;
	jnl_id ids[4];
	uint64_t seq;
	int count;

	(void)v;
	if (k->mv_size != 8)
		BUG("op key of %zu bytes", k->mv_size);
	seq = jnl_be64_get(k->mv_data);
	if (seq >= ck->m.next_seq)
		BUG("inv 6: op %" PRIu64 " >= next_seq", seq);
	if (jnl_op_read(ck->j, ck->txn, seq, &o))
		BUG("op %" PRIu64 " unreadable", seq);
	if (o.r.type < JNL_OP_MKDIR || o.r.type > JNL_OP_FINISH)
		BUG("op %" PRIu64 " of type %u", seq, o.r.type);
	ops_count++;
	count = jnl_op_nodes(&o.r, ids);
	for (int i = 0; i < count; i++) {
		struct ninfo *n = node_find(ck, ids[i]);

		if (!n)
			BUG("inv 7: op %" PRIu64 " names no node %" PRIu64, seq,
			    ids[i]);
		n->nops++;
	}
}

void jnl_assert_sane(struct jnl *j)
{
	struct check ck = { .j = j };
	uint64_t dirty_nodes = 0;
	int rc;

	rc = jnl_sync(j);
	if (rc)
		BUG("journal sanity: cannot sync: %s", strerror(-rc));
	if (jnl_rtx_begin(j, &ck.txn))
		BUG("journal sanity: no read transaction");
	{
		MDB_val k = { 4, "meta" }, v;

		if (mdb_get(ck.txn, j->db_meta, &k, &v) ||
		    v.mv_size != sizeof(ck.m))
			BUG("journal sanity: no meta record");
		memcpy(&ck.m, v.mv_data, sizeof(ck.m));
	}
	dirty_q = inflight_q = count_q = ops_count = 0;
	memset(sums, 0, sizeof(sums));

	scan(&ck, j->db_nodes, "nodes", visit_node);
	if (!node_find(&ck, JNL_ROOT) ||
	    !S_ISDIR(node_find(&ck, JNL_ROOT)->r.mode))
		BUG("journal sanity: no root directory");
	scan(&ck, j->db_chunks, "chunks", visit_chunk);
	count_q = 0;
	scan(&ck, j->db_inflight, "inflight", visit_count);
	if (count_q != inflight_q)
		BUG("inv 2: %" PRIu64 " inflight entries, %" PRIu64
		    " INFLIGHT chunks", count_q, inflight_q);
	count_q = 0;
	scan(&ck, j->db_dirtyq, "dirtyq", visit_dirtyq);
	if (count_q != dirty_q)
		BUG("inv 3: %" PRIu64 " dirtyq entries, %" PRIu64
		    " claimable DIRTY chunks", count_q, dirty_q);
	live_dentries = 0;
	scan(&ck, j->db_dentries, "dentries", visit_dentry);
	count_q = 0;
	scan(&ck, j->db_folds, "folds", visit_fold);
	if (count_q != live_dentries)
		BUG("folds: %" PRIu64 " names, %" PRIu64 " live dentries",
		    count_q, live_dentries);
	scan(&ck, j->db_ops, "ops", visit_op);

	if (sums[JNL_CHUNK_DIRTY] != ck.m.dirty_bytes ||
	    sums[JNL_CHUNK_INFLIGHT] != ck.m.inflight_bytes ||
	    sums[JNL_CHUNK_FLUSHED] != ck.m.flushed_bytes)
		BUG("inv 4: bytes dirty/inflight/flushed %" PRIu64 "/%" PRIu64
		    "/%" PRIu64 ", meta says %" PRIu64 "/%" PRIu64
		    "/%" PRIu64, sums[1], sums[2], sums[3], ck.m.dirty_bytes,
		    ck.m.inflight_bytes, ck.m.flushed_bytes);
	if (ops_count != ck.m.pending_ops)
		BUG("inv 4: %" PRIu64 " ops, meta says %" PRIu64, ops_count,
		    ck.m.pending_ops);
	for (size_t i = 0; i < ck.count; i++) {
		struct ninfo *n = &ck.nodes[i];
		bool local = n->r.flags & JNL_NODE_LOCAL;
		bool gone = n->r.flags & JNL_NODE_UNLINKED;

		if (n->unflushed != n->r.unflushed)
			BUG("inv 4: node %" PRIu64 " has %" PRIu64
			    " unflushed chunks, record says %" PRIu64,
			    n->id, n->unflushed, n->r.unflushed);
		if (!!(n->r.flags & JNL_NODE_DATA) != (n->unflushed > 0))
			BUG("inv 4: node %" PRIu64 " DATA flag wrong", n->id);
		dirty_nodes += n->unflushed > 0;
		if (n->nops != n->r.nops)
			BUG("inv 7: node %" PRIu64 " named by %" PRIu64
			    " ops, record says %" PRIu64, n->id, n->nops,
			    n->r.nops);
		if (!local && n->r.create_seq)
			BUG("inv 8: node %" PRIu64 " not LOCAL with "
			    "create_seq", n->id);
		if (local && !gone && !(n->r.flags & JNL_NODE_ERROR) &&
		    !n->r.create_seq)
			BUG("inv 8: LOCAL node %" PRIu64 " without create_seq",
			    n->id);
		if (n->r.create_seq) {
			struct jnl_orec o;

			if (jnl_op_read(j, ck.txn, n->r.create_seq, &o) ||
			    o.r.id != n->id ||
			    (o.r.type != JNL_OP_CREATE &&
			     o.r.type != JNL_OP_MKDIR &&
			     o.r.type != JNL_OP_SYMLINK))
				BUG("inv 8: node %" PRIu64 " create_seq %" PRIu64
				    " is not its create op", n->id,
				    n->r.create_seq);
		}
		if (local && !S_ISDIR(n->r.mode) && n->r.nlink != n->names)
			BUG("inv 7: LOCAL node %" PRIu64 " nlink %" PRIu64
			    ", %" PRIu64 " names", n->id, n->r.nlink,
			    n->names);
		if (local && S_ISDIR(n->r.mode) && !gone &&
		    n->r.nlink != 2 + n->subdirs)
			BUG("inv 7: LOCAL directory %" PRIu64 " nlink %" PRIu64
			    ", %" PRIu64 " subdirectories", n->id,
			    n->r.nlink, n->subdirs);
		if (n->r.bstate > JNL_BASE_SENDING ||
		    (n->r.bstate && (local || !n->r.base_ino ||
				     !S_ISREG(n->r.mode))))
			BUG("conflicts: node %" PRIu64 " base state %" PRIu32
			    " (LOCAL %d, imported %d)", n->id, n->r.bstate,
			    local, n->r.base_ino != 0);
		if (gone != (n->r.nlink == 0))
			BUG("inv 7: node %" PRIu64 " UNLINKED %d, nlink %" PRIu64,
			    n->id, gone, n->r.nlink);
		if (gone && n->names)
			BUG("inv 7: UNLINKED node %" PRIu64 " has names", n->id);
	}
	if (dirty_nodes != ck.m.dirty_nodes)
		BUG("inv 4: %" PRIu64 " nodes with data, meta says %" PRIu64,
		    dirty_nodes, ck.m.dirty_nodes);
	pthread_mutex_lock(&j->lock);
	for (size_t i = 0; i < j->handed.cap; i++) {
		struct jnl_orec o;

		if (j->handed.v[i] &&
		    jnl_op_read(j, ck.txn, j->handed.v[i], &o))
			BUG("inv 12: handed-out op %" PRIu64 " does not exist",
			    j->handed.v[i]);
	}
	pthread_mutex_unlock(&j->lock);
	jnl_rtx_end(j);
	free(ck.nodes);
}
