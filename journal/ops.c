/*
 * ops.c - the op log (journal.h "op log"): append, hand out in dependency
 * order, acknowledge, fail; and remote paths of nodes.
 *
 * Dependency order (jnl_ops_ready). Each op has
 *   subjects  the nodes whose identity or place it changes: the new node of
 *             a create, the removed node, the moved node (and for a rename
 *             the node at the target), the node of a link or setattr;
 *   context   the directories whose paths it uses (parent, newparent);
 *   dentries  the (parent, name) pairs it reads or writes;
 *   paths     subjects and context plus all their ancestors, following both
 *             the remote parent (rparent) and the merged one (mparent).
 * An op B waits for an earlier unacknowledged op A (handed out or not) if
 * A's subjects meet B's paths, B's subjects meet A's paths, or their
 * dentries meet. So a directory's mkdir goes before anything in it, a
 * rename of a directory waits for ops under it and the other way round,
 * and a name is unlinked before it is created again; creates in the same
 * directory go out together. Dentries are compared by a 64-bit hash: a
 * collision only makes an op wait.
 *
 * One call examines at most JNL_OPS_WINDOW pending ops from the oldest,
 * reading the batch under txn_lock: it sees the latest change and no
 * namespace change can run between its decision and its record in
 * j->handed (invariant 12 of journal.c; cancellation in node.c relies on
 * it). It stops at the first op not committed yet (durable_seq): the
 * remote never gets an op a crash could take back (invariant 15).
 *
 * An op acknowledged (or given up) is deleted from the log in the open
 * batch; until that deletion is synced it still counts as pending for
 * what waits for it (j->acked, scanned before the log): else a crash
 * takes the ack back and the older op replays over what the newer one
 * did on the remote (a rename of "a" to "b", then a create of "a":
 * after the kill the rename replayed and moved the new, empty "a" over
 * the "b" that held the data; invariant 18 of journal.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "crash.h"
#include "journal_i.h"
#include "log.h"

/* --- u64 set ----------------------------------------------------------------- */

static size_t u64_hash(uint64_t v)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdull;
	v ^= v >> 33;
	return (size_t)v;
}

/* The slot of @v in @tab (linear probing), or the empty one it goes to. */
static size_t u64_slot(const uint64_t *tab, size_t cap, uint64_t v)
{
	size_t i = u64_hash(v) & (cap - 1);

	while (tab[i] && tab[i] != v)
		i = (i + 1) & (cap - 1);
	return i;
}

/* Empty slot @i of @tab and re-place the rest of its run (linear probing
 * deletion), moving @n's values (if any) along with their keys. */
static void u64_unplace(uint64_t *tab, uint32_t *n, size_t cap, size_t i)
{
	tab[i] = 0;
	for (size_t k = (i + 1) & (cap - 1); tab[k]; k = (k + 1) & (cap - 1)) {
		uint64_t x = tab[k];
		size_t to;

		tab[k] = 0;
		to = u64_slot(tab, cap, x);
		tab[to] = x;
		if (n)
			n[to] = n[k];
	}
}

bool jnl_u64set_has(const struct jnl_u64set *s, uint64_t v)
{
	if (!v)
		return s->has_zero;
	return s->cap && s->v[u64_slot(s->v, s->cap, v)] == v;
}

int jnl_u64set_add(struct jnl_u64set *s, uint64_t v)
{
	if (!v) {
		s->has_zero = true;
		return 0;
	}
	if (jnl_u64set_has(s, v))
		return 0;
	if ((s->used + 1) * 2 > s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 16;
		uint64_t *tab = calloc(cap, sizeof(*tab));

		if (!tab)
			return -ENOMEM;
		for (size_t i = 0; i < s->cap; i++)
			if (s->v[i])
				tab[u64_slot(tab, cap, s->v[i])] = s->v[i];
		free(s->v);
		s->v = tab;
		s->cap = cap;
	}
	s->v[u64_slot(s->v, s->cap, v)] = v;
	s->used++;
	return 0;
}

void jnl_u64set_del(struct jnl_u64set *s, uint64_t v)
{
	if (!v) {
		s->has_zero = false;
		return;
	}
	if (!jnl_u64set_has(s, v))
		return;
	u64_unplace(s->v, NULL, s->cap, u64_slot(s->v, s->cap, v));
	s->used--;
}

void jnl_u64set_free(struct jnl_u64set *s)
{
	free(s->v);
	memset(s, 0, sizeof(*s));
}

/* --- u64 counts -------------------------------------------------------- */

uint32_t jnl_u64count_get(const struct jnl_u64count *c, uint64_t k)
{
	size_t i;

	if (!c->cap || !k)
		return 0;
	i = u64_slot(c->k, c->cap, k);
	return c->k[i] ? c->n[i] : 0;
}

static int count_grow(struct jnl_u64count *c)
{
	struct jnl_u64count g = { .cap = c->cap ? c->cap * 2 : 16 };

	g.k = calloc(g.cap, sizeof(*g.k));
	g.n = calloc(g.cap, sizeof(*g.n));
	if (!g.k || !g.n) {
		free(g.k);
		free(g.n);
		return -ENOMEM;
	}
	for (size_t i = 0; i < c->cap; i++) {
		if (c->k[i]) {
			size_t s = u64_slot(g.k, g.cap, c->k[i]);

			g.k[s] = c->k[i];
			g.n[s] = c->n[i];
		}
	}
	g.used = c->used;
	jnl_u64count_free(c);
	*c = g;
	return 0;
}

int64_t jnl_u64count_add(struct jnl_u64count *c, uint64_t k, int d)
{
	size_t i;

	if (!k)
		return 0;
	if ((c->used + 1) * 2 > c->cap && count_grow(c))
		return -ENOMEM;
	i = u64_slot(c->k, c->cap, k);
	if (!c->k[i]) {
		if (d <= 0)
			return 0;
		c->k[i] = k;
		c->n[i] = 0;
		c->used++;
	}
	if (d < 0 && c->n[i] <= 1) { /* gone */
		u64_unplace(c->k, c->n, c->cap, i);
		c->used--;
		return 0;
	}
	c->n[i] = (uint32_t)((int64_t)c->n[i] + d);
	return c->n[i];
}

void jnl_u64count_free(struct jnl_u64count *c)
{
	free(c->k);
	free(c->n);
	memset(c, 0, sizeof(*c));
}

/* --- records -------------------------------------------------------------------- */

int jnl_op_nodes(const struct jnl_op_rec *r, jnl_id out[4])
{
	jnl_id all[4] = { r->id, r->parent, r->newparent, r->id2 };
	int n = 0;

	for (int i = 0; i < 4; i++) {
		bool dup = !all[i];

		for (int k = 0; k < n && !dup; k++)
			dup = out[k] == all[i];
		if (!dup)
			out[n++] = all[i];
	}
	return n;
}

int jnl_op_read(struct jnl *j, MDB_txn *txn, uint64_t seq, struct jnl_orec *o)
{
	unsigned char kb[8];
	MDB_val k = { 8, kb }, v;
	int rc;

	jnl_be64_put(kb, seq);
	rc = mdb_get(txn, j->db_ops, &k, &v);
	if (rc)
		return jnl_mdb(j, rc);
	if (jnl_op_decode(v.mv_data, v.mv_size, seq, o) == 0)
		return 0;
	LOG_ERR("journal '%s': bad record of op %" PRIu64, j->dir, seq);
	return jnl_fail(j, -EIO);
}

static int nops_add(struct jnl_wtx *w, const struct jnl_op_rec *r, int delta)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	jnl_id ids[4];
	int count = jnl_op_nodes(r, ids), rc = 0;

	if (!n)
		return -ENOMEM;
	for (int i = 0; i < count && !rc; i++) {
		rc = jnl_node_read(w->j, w->txn, ids[i], n);
		if (rc)
			break;
		n->r.nops += (uint64_t)(int64_t)delta;
		rc = jnl_node_write(w->j, w->txn, ids[i], n);
	}
	free(n);
	return rc;
}

/* Write @o as op @seq (@flags: jnl_put()'s). */
static int op_put(struct jnl_wtx *w, const struct jnl_orec *o, uint64_t seq,
		  unsigned int flags)
{
	unsigned char kb[8], buf[sizeof(o->r) + 2 * NAME_MAX];
	struct jnl_op_rec r = o->r;
	MDB_val k = { 8, kb }, v = { 0, buf };

	r.version = JNL_OP_REC_VERSION;
	r.name_len = (uint16_t)strlen(o->name);
	r.newname_len = (uint16_t)strlen(o->newname);
	memcpy(buf, &r, sizeof(r));
	memcpy(buf + sizeof(r), o->name, r.name_len);
	memcpy(buf + sizeof(r) + r.name_len, o->newname, r.newname_len);
	v.mv_size = sizeof(r) + r.name_len + r.newname_len;
	jnl_be64_put(kb, seq);
	return jnl_mdb(w->j, jnl_put(w->j, w->txn, w->j->db_ops, &k, &v,
				     flags));
}

int jnl_op_append(struct jnl_wtx *w, const struct jnl_orec *o, uint64_t *seq)
{
	int rc;

	*seq = w->m.next_seq++;
	w->m.pending_ops++;
	w->m_dirty = true;
	w->wake = true; /* an op to replay */
	rc = op_put(w, o, *seq, MDB_NOOVERWRITE);
	return rc ? rc : nops_add(w, &o->r, 1);
}

int jnl_op_delete(struct jnl_wtx *w, const struct jnl_orec *o)
{
	unsigned char kb[8];
	MDB_val k = { 8, kb };
	int rc;

	jnl_be64_put(kb, o->seq);
	rc = jnl_mdb(w->j, jnl_del(w->j, w->txn, w->j->db_ops, &k, NULL));
	if (rc)
		return rc;
	w->m.pending_ops--;
	w->m_dirty = true;
	w->wake = true; /* ops that waited for it may be ready */
	return nops_add(w, &o->r, -1);
}

/* --- ready ------------------------------------------------------------------------ */

struct scan {
	struct jnl_wtx *w;
	struct jnl_u64set subj, paths, dents; /* of the earlier ops */
	struct jnl_nrec *n;
};

static uint64_t dent_hash(jnl_id parent, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull ^ parent;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001b3ull;
	return h ^ (h >> 31) ^ parent * 0x9e3779b97f4a7c15ull;
}

/* Add @id and its ancestors (remote and merged) to @out. */
static int add_paths(struct scan *sc, jnl_id id, struct jnl_u64set *out)
{
	jnl_id stack[64];
	int top = 0, rc = 0, steps = 0;

	stack[top++] = id;
	while (top && !rc) {
		jnl_id x = stack[--top];

		if (!x || jnl_u64set_has(out, x))
			continue;
		rc = jnl_u64set_add(out, x);
		if (rc || x == JNL_ROOT)
			break;
		if (++steps > 65536)
			return jnl_fail(sc->w->j, -EIO); /* a cycle */
		rc = jnl_node_read(sc->w->j, sc->w->txn, x, sc->n);
		if (rc == -ENOENT) {
			rc = 0;
			continue;
		}
		if (top + 2 > (int)(sizeof(stack) / sizeof(stack[0])))
			return -ENOMEM;
		stack[top++] = sc->n->r.rparent;
		if (sc->n->r.mparent != sc->n->r.rparent)
			stack[top++] = sc->n->r.mparent;
	}
	return rc;
}

static int op_subjects(const struct jnl_op_rec *r, jnl_id out[2])
{
	int n = 0;

	out[n++] = r->id;
	if (r->type == JNL_OP_RENAME && r->id2)
		out[n++] = r->id2;
	return n;
}

static bool has_any(const struct jnl_u64set *s, const struct jnl_u64set *t)
{
	const struct jnl_u64set *small = s->used < t->used ? s : t;
	const struct jnl_u64set *big = small == s ? t : s;

	for (size_t i = 0; i < small->cap; i++)
		if (small->v[i] && jnl_u64set_has(big, small->v[i]))
			return true;
	return false;
}

/* Decide op @o against the earlier ops, then add it to them. */
static int scan_op(struct scan *sc, const struct jnl_orec *o, bool *ready)
{
	struct jnl_u64set paths = { 0 };
	jnl_id subj[2], ctx[2] = { o->r.parent, o->r.newparent };
	uint64_t dents[2];
	int ns = op_subjects(&o->r, subj), nd = 0, rc = 0;
	bool conflict = false;

	if (o->r.name_len)
		dents[nd++] = dent_hash(o->r.parent, o->name);
	if (o->r.newname_len)
		dents[nd++] = dent_hash(o->r.newparent, o->newname);
	for (int i = 0; i < ns && !rc; i++)
		rc = add_paths(sc, subj[i], &paths);
	for (int i = 0; i < 2 && !rc; i++)
		if (ctx[i])
			rc = add_paths(sc, ctx[i], &paths);
	if (rc)
		goto out;
	for (int i = 0; i < ns && !conflict; i++)
		conflict = jnl_u64set_has(&sc->paths, subj[i]);
	for (int i = 0; i < nd && !conflict; i++)
		conflict = jnl_u64set_has(&sc->dents, dents[i]);
	if (!conflict)
		conflict = has_any(&paths, &sc->subj);
	*ready = !conflict;

	for (int i = 0; i < ns && !rc; i++)
		rc = jnl_u64set_add(&sc->subj, subj[i]);
	for (int i = 0; i < nd && !rc; i++)
		rc = jnl_u64set_add(&sc->dents, dents[i]);
	for (size_t i = 0; i < paths.cap && !rc; i++)
		if (paths.v[i])
			rc = jnl_u64set_add(&sc->paths, paths.v[i]);
out:
	jnl_u64set_free(&paths);
	return rc;
}

static void to_public(const struct jnl_orec *o, struct jnl_op *out)
{
	memset(out, 0, sizeof(*out));
	out->seq = o->seq;
	out->type = (enum jnl_op_type)o->r.type;
	out->id = o->r.id;
	out->parent = o->r.parent;
	out->newparent = o->r.newparent;
	memcpy(out->name, o->name, sizeof(out->name));
	memcpy(out->newname, o->newname, sizeof(out->newname));
	out->flags = o->r.flags;
	if (o->r.type == JNL_OP_RENAME && (o->r.flags & RENAME_EXCHANGE))
		out->xino = o->r.xino;
}

/* Keep @o as acknowledged in the open batch (op_end()). txn_lock. */
static int acked_add(struct jnl *j, const struct jnl_orec *o)
{
	struct jnl_acked *a = &j->acked;

	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;
		struct jnl_orec *no = realloc(a->o, cap * sizeof(*no));
		uint64_t *ng;

		if (!no)
			return -ENOMEM;
		a->o = no;
		ng = realloc(a->gen, cap * sizeof(*ng));
		if (!ng)
			return -ENOMEM;
		a->gen = ng;
		a->cap = cap;
	}
	a->o[a->n] = *o;
	a->gen[a->n++] = j->batch_gen;
	pthread_mutex_lock(&j->lock);
	j->acks_unsynced = true;
	pthread_mutex_unlock(&j->lock);
	return 0;
}

bool jnl_acked_purge(struct jnl *j, uint64_t synced_gen, bool open_clean)
{
	struct jnl_acked *a = &j->acked;
	size_t k = 0;
	bool any;

	for (size_t i = 0; i < a->n; i++) {
		bool stale = open_clean && a->gen[i] == j->batch_gen;

		if (a->gen[i] >= synced_gen && !stale) {
			a->o[k] = a->o[i];
			a->gen[k++] = a->gen[i];
		}
	}
	any = k != a->n;
	a->n = k;
	if (!k && a->cap > 4096) { /* a big flush's worth: give it back */
		free(a->o);
		free(a->gen);
		memset(a, 0, sizeof(*a));
	}
	pthread_mutex_lock(&j->lock);
	j->acks_unsynced = k > 0;
	pthread_mutex_unlock(&j->lock);
	return any;
}

void jnl_acked_free(struct jnl *j)
{
	free(j->acked.o);
	free(j->acked.gen);
	memset(&j->acked, 0, sizeof(j->acked));
}

int jnl_ops_ready(struct jnl *j, struct jnl_op *out, int max)
{
	struct scan sc = { 0 };
	struct jnl_orec o;
	struct jnl_wtx w = { 0 };
	MDB_cursor *c;
	MDB_val k, v;
	int rc, count = 0, seen = 0;

	if (max <= 0)
		return max < 0 ? -EINVAL : 0;
	sc.n = malloc(sizeof(*sc.n));
	if (!sc.n)
		return -ENOMEM;
	rc = jnl_rtx_begin(j, &w.txn); /* the batch, read only */
	if (rc)
		goto out_free;
	w.j = j;
	sc.w = &w;
	/* acknowledged, not synced: still in the way of what waits for
	 * them (never handed out again) */
	for (size_t i = 0; i < j->acked.n && !rc; i++) {
		bool ready;

		rc = scan_op(&sc, &j->acked.o[i], &ready);
	}
	if (rc)
		goto out_abort;
	rc = mdb_cursor_open(w.txn, j->db_ops, &c);
	if (rc) {
		rc = jnl_mdb(j, rc);
		goto out_abort;
	}
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	     !rc && count < max && seen < JNL_OPS_WINDOW;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT), seen++) {
		bool ready, handed;

		if (k.mv_size != 8) {
			rc = MDB_CORRUPTED;
			break;
		}
		if (jnl_be64_get(k.mv_data) >= j->durable_seq) {
			rc = MDB_NOTFOUND; /* not durable yet: the remote must
					      never be ahead of the journal */
			break;
		}
		rc = jnl_op_read(j, w.txn, jnl_be64_get(k.mv_data), &o);
		if (!rc)
			rc = scan_op(&sc, &o, &ready);
		if (rc)
			break;
		pthread_mutex_lock(&j->lock);
		handed = jnl_u64set_has(&j->handed, o.seq);
		if (ready && !handed) {
			rc = jnl_u64set_add(&j->handed, o.seq);
			if (!rc)
				to_public(&o, &out[count++]);
		}
		pthread_mutex_unlock(&j->lock);
	}
	mdb_cursor_close(c);
	if (rc == MDB_NOTFOUND)
		rc = 0;
	else if (rc > 0 || rc < -4096)
		rc = jnl_mdb(j, rc);
	if (rc) { /* hand out nothing: forget what this call took */
		pthread_mutex_lock(&j->lock);
		for (int i = 0; i < count; i++)
			jnl_u64set_del(&j->handed, out[i].seq);
		pthread_mutex_unlock(&j->lock);
	}
out_abort:
	jnl_rtx_end(j);
out_free:
	jnl_u64set_free(&sc.subj);
	jnl_u64set_free(&sc.paths);
	jnl_u64set_free(&sc.dents);
	free(sc.n);
	return rc ? rc : count;
}

/* --- ack and fail --------------------------------------------------------------- */

/* Does node @n sit at (parent, name) on the remote? */
static bool at(const struct jnl_nrec *n, jnl_id parent, const char *name)
{
	return n->r.rparent == parent && !strcmp(n->rname, name);
}

static void place(struct jnl_nrec *n, jnl_id parent, const char *name)
{
	n->r.rparent = parent;
	snprintf(n->rname, sizeof(n->rname), "%s", parent ? name : "");
}

/* Drop the whiteout at (parent, name) if op @seq made it. */
static int whiteout_done(struct jnl_wtx *w, jnl_id parent, const char *name,
			 uint64_t seq)
{
	struct jnl_dval d;
	int rc = jnl_dentry_get(w->j, w->txn, parent, name, &d);

	if (rc == -ENOENT)
		return 0;
	if (rc || d.id || d.wseq != seq)
		return rc;
	return jnl_dentry_del(w->j, w->txn, parent, name);
}

/* Does a pending op on node @id put it at (parent, name), a name the
 * remote does not have yet? */
static int pending_target(struct jnl_wtx *w, jnl_id id, jnl_id parent,
			  const char *name, bool *yes)
{
	struct jnl_orec *o = malloc(sizeof(*o));
	MDB_cursor *c;
	MDB_val k, v;
	int rc;

	*yes = false;
	if (!o)
		return -ENOMEM;
	rc = mdb_cursor_open(w->txn, w->j->db_ops, &c);
	if (rc) {
		free(o);
		return jnl_mdb(w->j, rc);
	}
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc && !*yes;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		if (k.mv_size != 8) {
			rc = MDB_CORRUPTED; /* as jnl_ops_ready() */
			break;
		}
		rc = jnl_op_read(w->j, w->txn, jnl_be64_get(k.mv_data), o);
		if (rc)
			break;
		if (o->r.type == JNL_OP_RENAME)
			*yes = (o->r.id == id && o->r.newparent == parent &&
				!strcmp(o->newname, name)) ||
			       ((o->r.flags & RENAME_EXCHANGE) &&
				o->r.id2 == id && o->r.parent == parent &&
				!strcmp(o->name, name));
		else
			*yes = o->r.id == id && o->r.parent == parent &&
			       !strcmp(o->name, name) &&
			       o->r.type != JNL_OP_UNLINK &&
			       o->r.type != JNL_OP_RMDIR;
	}
	mdb_cursor_close(c);
	free(o);
	if (rc == MDB_NOTFOUND)
		return 0;
	return rc > 0 ? jnl_mdb(w->j, rc) : rc;
}

/*
 * Node @a (@id) lost the name the remote had it at, but keeps others: a
 * hard link whose newest name was removed. Place it at one of its names
 * in the merged view that the remote has (its parent placed, no pending op
 * making the name), if there is one; else it stays nowhere until an op
 * gives it a name (a rename's or link's ack). @p: room for a parent.
 * Rare (an unlink of a linked file's remote name): a scan of the dentries
 * and of the pending ops.
 */
static int place_elsewhere(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *a,
			   struct jnl_nrec *p)
{
	char name[NAME_MAX + 1];
	MDB_cursor *c;
	MDB_val k, v;
	int rc;

	rc = mdb_cursor_open(w->txn, w->j->db_dentries, &c);
	if (rc)
		return jnl_mdb(w->j, rc);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc && !a->r.rparent;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		struct jnl_dval d;
		jnl_id parent;
		bool pending;

		if (v.mv_size != sizeof(d) || k.mv_size <= 8 ||
		    k.mv_size > 8 + NAME_MAX) {
			rc = MDB_CORRUPTED; /* as dir_has_names() */
			break;
		}
		memcpy(&d, v.mv_data, sizeof(d));
		if (d.id != id)
			continue;
		parent = jnl_be64_get(k.mv_data);
		memcpy(name, (const char *)k.mv_data + 8, k.mv_size - 8);
		name[k.mv_size - 8] = 0;
		if (parent != JNL_ROOT) {
			rc = jnl_node_read(w->j, w->txn, parent, p);
			if (rc)
				break;
			if (!p->r.rparent)
				continue;
		}
		rc = pending_target(w, id, parent, name, &pending);
		if (!rc && !pending)
			place(a, parent, name);
	}
	mdb_cursor_close(c);
	if (rc == MDB_NOTFOUND)
		return 0;
	return rc > 0 ? jnl_mdb(w->j, rc) : rc;
}

/* place_elsewhere() with a scratch record of its own. */
static int place_other(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n)
{
	struct jnl_nrec *p = malloc(sizeof(*p));
	int rc;

	if (!p)
		return -ENOMEM;
	rc = place_elsewhere(w, id, n, p);
	free(p);
	return rc;
}

static int ack_effects(struct jnl_wtx *w, const struct jnl_orec *o,
		       struct jnl_nrec *a, struct jnl_nrec *b)
{
	const struct jnl_op_rec *r = &o->r;
	int rc;

	switch ((enum jnl_op_type)r->type) {
	case JNL_OP_MKDIR:
	case JNL_OP_CREATE:
	case JNL_OP_SYMLINK:
		rc = jnl_node_read(w->j, w->txn, r->id, a);
		if (rc)
			return rc;
		place(a, r->parent, o->name);
		if (a->r.create_seq == o->seq) {
			bool was = jnl_node_claimable(&a->r);

			a->r.create_seq = 0;
			a->r.flags &= ~(uint32_t)JNL_NODE_LOCAL;
			if (!was && jnl_node_claimable(&a->r)) {
				rc = jnl_chunks_enqueue(w, r->id, a, true);
				if (rc)
					return rc;
			}
		}
		return jnl_node_write(w->j, w->txn, r->id, a);
	case JNL_OP_UNLINK:
	case JNL_OP_RMDIR:
		rc = jnl_node_read(w->j, w->txn, r->id, a);
		if (!rc && at(a, r->parent, o->name)) {
			place(a, 0, "");
			if (!(a->r.flags & JNL_NODE_UNLINKED))
				rc = place_elsewhere(w, r->id, a, b);
			if (!rc)
				rc = jnl_node_write(w->j, w->txn, r->id, a);
		}
		return rc ? rc : whiteout_done(w, r->parent, o->name, o->seq);
	case JNL_OP_RENAME:
		rc = jnl_node_read(w->j, w->txn, r->id, a);
		if (!rc && r->id2)
			rc = jnl_node_read(w->j, w->txn, r->id2, b);
		if (rc)
			return rc;
		if (r->id2 && at(b, r->newparent, o->newname)) {
			if (r->flags & RENAME_EXCHANGE) {
				place(b, r->parent, o->name);
			} else {
				/* replaced: a hard link of it elsewhere is
				 * its name on the remote now, as at an
				 * unlink (else its data went nowhere and a
				 * lookup of that link failed) */
				place(b, 0, "");
				if (!(b->r.flags & JNL_NODE_UNLINKED))
					rc = place_other(w, r->id2, b);
				if (rc)
					return rc;
			}
		}
		/* nowhere but named (place_elsewhere() found no name the
		 * remote has): the remote has it at the new name now */
		if (at(a, r->parent, o->name) ||
		    (!a->r.rparent && !(a->r.flags & JNL_NODE_UNLINKED)))
			place(a, r->newparent, o->newname);
		rc = jnl_node_write(w->j, w->txn, r->id, a);
		if (!rc && r->id2)
			rc = jnl_node_write(w->j, w->txn, r->id2, b);
		if (!rc && !(r->flags & RENAME_EXCHANGE))
			rc = whiteout_done(w, r->parent, o->name, o->seq);
		return rc;
	case JNL_OP_LINK:
		/* the new name is on the remote: the node's data goes there
		 * from now on, so that an unlink of the old name (ordered
		 * after this op) does not leave it nowhere; an unlink of this
		 * newest name goes back to an older one (place_elsewhere()) */
		rc = jnl_node_read(w->j, w->txn, r->id, a);
		if (rc)
			return rc;
		place(a, r->parent, o->name);
		return jnl_node_write(w->j, w->txn, r->id, a);
	case JNL_OP_SETATTR:
	case JNL_OP_FINISH:
		return 0;
	}
	return jnl_fail(w->j, -EIO);
}

/* Begin the change @w about op @seq, read into @o: it must have been
 * handed out by jnl_ops_ready() (-EINVAL). On error no change is open. */
static int op_begin(struct jnl *j, uint64_t seq, struct jnl_wtx *w,
		    struct jnl_orec *o)
{
	int rc = jnl_wtx_begin(j, w, false);

	if (rc)
		return rc;
	rc = jnl_op_read(j, w->txn, seq, o);
	pthread_mutex_lock(&j->lock);
	if (!rc && !jnl_u64set_has(&j->handed, seq))
		rc = -EINVAL;
	pthread_mutex_unlock(&j->lock);
	if (rc)
		jnl_wtx_abort(w);
	return rc;
}

static int op_end(struct jnl *j, uint64_t seq, bool ack, bool fatal)
{
	struct jnl_nrec *a = malloc(2 * sizeof(*a));
	struct jnl_orec o;
	struct jnl_wtx w;
	int rc;

	if (!a)
		return -ENOMEM;
	rc = op_begin(j, seq, &w, &o);
	if (rc)
		goto out_free;
	if (!ack && !fatal) {
		jnl_wtx_abort(&w);
		goto out_unhand;
	}
	if (ack) {
		/* an exchange's ack waits for the batch like any other: its
		 * replay finds the mark (jnl_op_exchange_mark()) done */
		rc = ack_effects(&w, &o, &a[0], &a[1]);
	} else {
		rc = jnl_node_read(j, w.txn, o.r.id, &a[0]);
		if (!rc) {
			a[0].r.flags |= JNL_NODE_ERROR;
			if (a[0].r.create_seq == seq)
				a[0].r.create_seq = 0;
			rc = jnl_node_write(j, w.txn, o.r.id, &a[0]);
		}
	}
	if (!rc)
		rc = jnl_op_delete(&w, &o);
	if (!rc) /* a change that fails after this leaves a stale entry:
		    jnl_acked_purge() drops it */
		rc = acked_add(j, &o);
	if (rc)
		goto out_abort;
	rc = jnl_wtx_commit(&w);
	if (rc)
		goto out_free;
	CRASH_POINT("op_acked"); /* acked in the batch, not committed */
out_unhand:
	pthread_mutex_lock(&j->lock);
	jnl_u64set_del(&j->handed, seq);
	pthread_mutex_unlock(&j->lock);
	goto out_free;

out_abort:
	jnl_wtx_abort(&w);
out_free:
	free(a);
	return rc;
}

int jnl_op_ack(struct jnl *j, uint64_t seq)
{
	return op_end(j, seq, true, false);
}

int jnl_op_exchange_mark(struct jnl *j, uint64_t seq, uint64_t ino)
{
	struct jnl_orec o;
	struct jnl_wtx w;
	int rc;

	if (!ino)
		return -EINVAL;
	rc = op_begin(j, seq, &w, &o);
	if (rc)
		return rc;
	if (o.r.type != JNL_OP_RENAME || !(o.r.flags & RENAME_EXCHANGE))
		rc = -EINVAL;
	if (!rc) {
		o.r.xino = ino;
		rc = op_put(&w, &o, seq, 0);
	}
	if (rc) {
		jnl_wtx_abort(&w);
		return rc;
	}
	w.sync = true; /* before the remote sees the exchange */
	return jnl_wtx_commit(&w);
}

int jnl_op_fail(struct jnl *j, uint64_t seq, bool fatal)
{
	if (!fatal) {
		int rc = jnl_failed(j);
		bool had;

		if (rc)
			return rc;
		pthread_mutex_lock(&j->lock);
		had = jnl_u64set_has(&j->handed, seq);
		jnl_u64set_del(&j->handed, seq);
		pthread_mutex_unlock(&j->lock);
		return had ? 0 : -EINVAL;
	}
	return op_end(j, seq, false, true);
}

/* --- remote paths ---------------------------------------------------------------- */

/*
 * Phase-fair, one code for both sides (JNL_NAMES_HOLDERS, _MOVERS): a side
 * enters when the other is not inside and either nobody of the other side
 * waits or it is this side's turn. A waiter that sees the other side
 * inside gives the turn to its own side, so that no newcomer of the other
 * side enters before it: holders and movers alternate under contention.
 */
static void names_enter(struct jnl *j, enum jnl_names_side side)
{
	enum jnl_names_side other = side == JNL_NAMES_HOLDERS ? JNL_NAMES_MOVERS
							      : JNL_NAMES_HOLDERS;

	pthread_mutex_lock(&j->names_lock);
	j->names_wait[side]++;
	while (j->names_in[other] ||
	       (j->names_wait[other] && j->names_turn != side)) {
		if (j->names_in[other])
			j->names_turn = side;
		pthread_cond_wait(&j->names_cond, &j->names_lock);
	}
	j->names_wait[side]--;
	j->names_in[side]++;
	pthread_mutex_unlock(&j->names_lock);
}

static void names_leave(struct jnl *j, enum jnl_names_side side)
{
	pthread_mutex_lock(&j->names_lock);
	if (--j->names_in[side] == 0)
		pthread_cond_broadcast(&j->names_cond);
	pthread_mutex_unlock(&j->names_lock);
}

void jnl_names_hold(struct jnl *j)
{
	names_enter(j, JNL_NAMES_HOLDERS);
}

void jnl_names_release(struct jnl *j)
{
	names_leave(j, JNL_NAMES_HOLDERS);
}

void jnl_names_move_begin(struct jnl *j)
{
	names_enter(j, JNL_NAMES_MOVERS);
}

void jnl_names_move_end(struct jnl *j)
{
	names_leave(j, JNL_NAMES_MOVERS);
}

int jnl_node_rpath(struct jnl *j, jnl_id id, char *buf, size_t size)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	size_t pos;
	MDB_txn *txn;
	int rc, depth = 0;

	if (!n)
		return -ENOMEM;
	if (!size) {
		free(n);
		return -ENAMETOOLONG;
	}
	rc = jnl_rtx_begin(j, &txn);
	if (rc)
		goto out_free;
	/* build from the end of buf towards its start */
	pos = size - 1;
	buf[pos] = 0;
	while (id != JNL_ROOT) {
		size_t len;

		rc = jnl_node_read(j, txn, id, n);
		if (rc)
			break;
		if (!n->r.rparent) {
			rc = -ENOENT; /* not on the remote (yet, or any more) */
			break;
		}
		len = strlen(n->rname);
		if (len + (pos < size - 1 ? 1 : 0) > pos) {
			rc = -ENAMETOOLONG;
			break;
		}
		if (pos < size - 1)
			buf[--pos] = '/';
		pos -= len;
		memcpy(buf + pos, n->rname, len);
		id = n->r.rparent;
		if (++depth > 4096) {
			rc = jnl_fail(j, -EIO); /* a cycle */
			break;
		}
	}
	jnl_rtx_end(j);
	if (!rc)
		memmove(buf, buf + pos, size - pos);
out_free:
	free(n);
	return rc;
}
