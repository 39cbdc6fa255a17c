/*
 * node.c - node records, dentries and the merged namespace (journal.h,
 * "nodes and the merged namespace"; invariants 6-9 of journal.c).
 *
 * Every namespace change runs in one write transaction (a child of the
 * batch: journal.c "BATCHES"): read the nodes it touches into a node set,
 * check, change the set, write the dentries, write the set, append the op
 * (which bumps nops on the records just written), commit into the batch
 * (no I/O; durable with the batch). On any error the transaction is
 * aborted: nothing changed.
 *
 * Whiteouts. Removing a name (unlink, rmdir, the source of a rename) leaves a
 * whiteout, also under a LOCAL parent: the directory does not exist on the
 * remote yet, but the pending ops of the node put the name there (after the
 * directory's create) until the removing op is replayed, and a listing of
 * the remote meanwhile must not show it. Only a cancelled create leaves
 * none (the remote never sees the name). The whiteout records the seq of
 * the op that made it and is dropped when that op is acknowledged.
 *
 * Cancellation. Unlinking the only name of a LOCAL node whose create op is
 * pending, not handed out, and the only op naming the node (nops == 1)
 * deletes the create op and appends nothing: the remote never sees the file.
 * The node stays (UNLINKED) for open handles.
 */
#include <inttypes.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <wctype.h>

#include "journal_i.h"
#include "log.h"
#include "utf8.h"

/* --- records -------------------------------------------------------------- */

void jnl_now(struct timespec *ts)
{
	clock_gettime(CLOCK_REALTIME, ts);
}

int jnl_name_check(const char *name)
{
	size_t len;

	if (!name || !*name || strchr(name, '/') || !strcmp(name, ".") ||
	    !strcmp(name, ".."))
		return -EINVAL;
	len = strlen(name);
	return len > NAME_MAX ? -ENAMETOOLONG : 0;
}

struct jnl_dkey jnl_dkey(jnl_id parent, const char *name)
{
	struct jnl_dkey k;

	k.len = strlen(name);
	jnl_be64_put(k.b, parent);
	memcpy(k.b + 8, name, k.len);
	k.len += 8;
	return k;
}

int jnl_node_read(struct jnl *j, MDB_txn *txn, jnl_id id, struct jnl_nrec *n)
{
	unsigned char kb[8];
	MDB_val k = { 8, kb }, v;
	int rc;

	jnl_be64_put(kb, id);
	rc = mdb_get(txn, j->db_nodes, &k, &v);
	if (rc)
		return jnl_mdb(j, rc);
	if (jnl_node_decode(v.mv_data, v.mv_size, n) < 0) {
		LOG_ERR("journal '%s': bad record of node %" PRIu64, j->dir,
			id);
		return jnl_fail(j, -EIO);
	}
	return 0;
}

int jnl_node_write(struct jnl *j, MDB_txn *txn, jnl_id id,
		   const struct jnl_nrec *n)
{
	unsigned char kb[8], buf[sizeof(n->r) + NAME_MAX + PATH_MAX];
	struct jnl_node_rec r = n->r;
	MDB_val k = { 8, kb }, v;

	r.version = JNL_NODE_REC_VERSION;
	r.rname_len = (uint16_t)strlen(n->rname);
	memcpy(buf, &r, sizeof(r));
	memcpy(buf + sizeof(r), n->rname, r.rname_len);
	memcpy(buf + sizeof(r) + r.rname_len, n->target, r.target_len);
	jnl_be64_put(kb, id);
	v.mv_size = sizeof(r) + r.rname_len + r.target_len;
	v.mv_data = buf;
	return jnl_mdb(j, jnl_put(j, txn, j->db_nodes, &k, &v, 0));
}

int jnl_dentry_get(struct jnl *j, MDB_txn *txn, jnl_id parent,
		   const char *name, struct jnl_dval *d)
{
	struct jnl_dkey dk = jnl_dkey(parent, name);
	MDB_val k = { dk.len, dk.b }, v;
	int rc = mdb_get(txn, j->db_dentries, &k, &v);

	if (rc)
		return jnl_mdb(j, rc);
	if (jnl_dentry_decode(v.mv_data, v.mv_size, d) < 0)
		return jnl_fail(j, -EIO);
	return 0;
}

/* glibc's built-in C.UTF-8 (2.35 on): Unicode's simple case mappings,
 * whatever the daemon's own locale is; jnl_open() fails without it */
static locale_t fold_loc;
static pthread_once_t fold_once = PTHREAD_ONCE_INIT;

static void fold_loc_init(void)
{
	fold_loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
}

int jnl_fold_init(void)
{
	pthread_once(&fold_once, fold_loc_init);
	return fold_loc ? 0 : -ENOTSUP;
}

struct jnl_dkey jnl_fold_key(jnl_id parent, const char *name)
{
	const unsigned char *s = (const unsigned char *)name;
	size_t n = strlen(name), i = 0, len;
	struct jnl_dkey k;

	_Static_assert(sizeof(k.b) >= 8 + NAME_MAX + NAME_MAX / 2 + 1,
		       "room for a name that upper-casing made longer");
	jnl_be64_put(k.b, parent);
	k.len = 8;
	while (i < n && k.len + 4 <= sizeof(k.b)) {
		int32_t c = utf8_get(s + i, n - i, &len);

		if (c < 0) {
			k.b[k.len++] = s[i];
		} else {
			if (c >= 0x80 || (c >= 'a' && c <= 'z'))
				c = (int32_t)towupper_l((wint_t)c, fold_loc);
			k.len += utf8_put(k.b + k.len, c);
		}
		i += len;
	}
	return k;
}

/* folds: @name of @parent is (@add) or is not a dentry (a whiteout is not) */
static int fold_set(struct jnl *j, MDB_txn *txn, jnl_id parent,
		    const char *name, bool add)
{
	struct jnl_dkey fk = jnl_fold_key(parent, name);
	MDB_val k = { fk.len, fk.b }, v = { strlen(name), (void *)name };
	int rc = add ? jnl_put(j, txn, j->db_folds, &k, &v, MDB_NODUPDATA)
		     : jnl_del(j, txn, j->db_folds, &k, &v);

	if (rc == (add ? MDB_KEYEXIST : MDB_NOTFOUND))
		rc = 0;
	return jnl_mdb(j, rc);
}

int jnl_dentry_put(struct jnl *j, MDB_txn *txn, jnl_id parent,
		   const char *name, jnl_id id, uint64_t wseq)
{
	struct jnl_dkey dk = jnl_dkey(parent, name);
	struct jnl_dval d = { id, wseq };
	MDB_val k = { dk.len, dk.b }, v = { sizeof(d), &d };
	int rc = jnl_mdb(j, jnl_put(j, txn, j->db_dentries, &k, &v, 0));

	return rc ? rc : fold_set(j, txn, parent, name, id != 0);
}

int jnl_dentry_del(struct jnl *j, MDB_txn *txn, jnl_id parent,
		   const char *name)
{
	struct jnl_dkey dk = jnl_dkey(parent, name);
	MDB_val k = { dk.len, dk.b };
	int rc = jnl_mdb(j, jnl_del(j, txn, j->db_dentries, &k, NULL));

	return rc ? rc : fold_set(j, txn, parent, name, false);
}

int jnl_folds_build(struct jnl *j, MDB_txn *txn)
{
	char name[NAME_MAX + 1];
	MDB_val k, v;
	MDB_cursor *c;
	int rc = mdb_cursor_open(txn, j->db_dentries, &c);

	if (rc)
		return jnl_mdb(j, rc);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		struct jnl_dval d;

		if (k.mv_size < 9 || k.mv_size > 8 + NAME_MAX ||
		    v.mv_size != sizeof(d)) {
			rc = MDB_CORRUPTED;
			break;
		}
		memcpy(&d, v.mv_data, sizeof(d));
		if (!d.id)
			continue;
		memcpy(name, (char *)k.mv_data + 8, k.mv_size - 8);
		name[k.mv_size - 8] = '\0';
		rc = fold_set(j, txn, jnl_be64_get(k.mv_data), name, true);
		if (rc)
			break;
	}
	mdb_cursor_close(c);
	return rc == MDB_NOTFOUND ? 0 : rc > 0 ? jnl_mdb(j, rc) : rc;
}

int jnl_name_case_taken(struct jnl *j, jnl_id dir, const char *name,
			jnl_id except)
{
	struct jnl_dkey fk = jnl_fold_key(dir, name);
	char other[NAME_MAX + 1];
	MDB_val k = { fk.len, fk.b }, v;
	MDB_cursor *c = NULL;
	MDB_txn *txn;
	int rc = jnl_name_check(name), g;

	if (rc)
		return rc;
	rc = jnl_rtx_begin(j, &txn);
	if (rc)
		return rc;
	g = mdb_cursor_open(txn, j->db_folds, &c);
	if (!g)
		g = mdb_cursor_get(c, &k, &v, MDB_SET_KEY);
	for (; !rc && !g; g = mdb_cursor_get(c, &k, &v, MDB_NEXT_DUP)) {
		struct jnl_dval d;

		if (v.mv_size > NAME_MAX) {
			rc = jnl_fail(j, -EIO);
			break;
		}
		memcpy(other, v.mv_data, v.mv_size);
		other[v.mv_size] = '\0';
		if (!strcmp(other, name))
			continue;
		rc = jnl_dentry_get(j, txn, dir, other, &d);
		if (rc == -ENOENT) {
			rc = 0;
			continue;
		}
		if (!rc && d.id && d.id != except)
			rc = -EEXIST;
	}
	if (!rc && g != MDB_NOTFOUND)
		rc = jnl_mdb(j, g);
	if (c)
		mdb_cursor_close(c);
	jnl_rtx_end(j);
	return rc;
}

static void ts_get(struct timespec *ts, int64_t sec, uint32_t nsec)
{
	ts->tv_sec = (time_t)sec;
	ts->tv_nsec = (long)nsec;
}

static void ts_set(int64_t *sec, uint32_t *nsec, const struct timespec *ts)
{
	*sec = (int64_t)ts->tv_sec;
	*nsec = (uint32_t)ts->tv_nsec;
}

void jnl_rec_take_stat(struct jnl_node_rec *r, const struct stat *st)
{
	r->mode = (uint32_t)st->st_mode;
	r->uid = (uint32_t)st->st_uid;
	r->gid = (uint32_t)st->st_gid;
	ts_set(&r->atime_sec, &r->atime_nsec, &st->st_atim);
	ts_set(&r->mtime_sec, &r->mtime_nsec, &st->st_mtim);
	ts_set(&r->ctime_sec, &r->ctime_nsec, &st->st_ctim);
	r->size = (uint64_t)st->st_size;
	r->nlink = st->st_nlink ? (uint64_t)st->st_nlink : 1;
	r->rvalid = S_ISREG(st->st_mode) ? (uint64_t)st->st_size : 0;
}

void jnl_rec_base_set(struct jnl_node_rec *r, const struct stat *st)
{
	r->bseq++;
	if (!st || !S_ISREG(st->st_mode) || st->st_nlink > 1) {
		r->bstate = JNL_BASE_NONE; /* not tracked (journal.h) */
		return;
	}
	r->bstate = JNL_BASE_SET;
	r->bsize = (uint64_t)st->st_size;
	ts_set(&r->bmtime_sec, &r->bmtime_nsec, &st->st_mtim);
}

/* The base is @size and mtime (@sec, @nsec) of a regular file, and the
 * remote identity (@ino, @dev) when the node has one. */
static bool base_match(uint64_t size, int64_t sec, uint32_t nsec,
		       uint64_t ino, uint64_t dev, const struct stat *st)
{
	return size == (uint64_t)st->st_size &&
	       sec == (int64_t)st->st_mtim.tv_sec &&
	       nsec == (uint32_t)st->st_mtim.tv_nsec &&
	       (!ino || (ino == (uint64_t)st->st_ino &&
			 dev == (uint64_t)st->st_dev)) &&
	       S_ISREG(st->st_mode);
}

bool jnl_rec_base_is(const struct jnl_node_rec *r, const struct stat *st)
{
	return base_match(r->bsize, r->bmtime_sec, r->bmtime_nsec, r->base_ino,
			  r->base_dev, st);
}

bool jnl_node_base_is(const struct jnl_node *nd, const struct stat *st)
{
	return base_match(nd->base_size, (int64_t)nd->base_mtime.tv_sec,
			  (uint32_t)nd->base_mtime.tv_nsec, nd->base_ino,
			  nd->base_dev, st);
}

static void touch(struct jnl_node_rec *r, bool mtime)
{
	struct timespec now;

	jnl_now(&now);
	ts_set(&r->ctime_sec, &r->ctime_nsec, &now);
	if (mtime)
		ts_set(&r->mtime_sec, &r->mtime_nsec, &now);
}

/* --- node sets: the records one change touches --------------------------- */

#define NSET_MAX 5

struct nset {
	struct jnl_wtx *w;
	int count;
	jnl_id id[NSET_MAX];
	struct jnl_nrec n[NSET_MAX];
};

static int nset_get(struct nset *s, jnl_id id, struct jnl_nrec **out)
{
	int rc;

	for (int i = 0; i < s->count; i++)
		if (s->id[i] == id) {
			*out = &s->n[i];
			return 0;
		}
	if (s->count == NSET_MAX)
		BUG("node set full");
	rc = jnl_node_read(s->w->j, s->w->txn, id, &s->n[s->count]);
	if (rc)
		return rc;
	s->id[s->count] = id;
	*out = &s->n[s->count++];
	return 0;
}

/* A new record in the set (not read from LMDB). */
static struct jnl_nrec *nset_new(struct nset *s, jnl_id id)
{
	struct jnl_nrec *n;

	if (s->count == NSET_MAX)
		BUG("node set full");
	n = &s->n[s->count];
	memset(n, 0, sizeof(*n));
	n->r.version = JNL_NODE_REC_VERSION;
	s->id[s->count++] = id;
	return n;
}

static int nset_write(struct nset *s)
{
	for (int i = 0; i < s->count; i++) {
		int rc = jnl_node_write(s->w->j, s->w->txn, s->id[i], &s->n[i]);

		if (rc)
			return rc;
	}
	return 0;
}

static struct nset *nset_alloc(struct jnl_wtx *w)
{
	struct nset *s = malloc(sizeof(*s));

	if (s) {
		s->w = w;
		s->count = 0;
	}
	return s;
}

/* The start of a namespace change: @names (NULL-terminated) checked, a
 * write transaction, its node set. On error nothing is open. */
static int change_begin(struct jnl *j, const char *const *names,
			struct jnl_wtx *w, struct nset **s)
{
	int rc = 0;

	for (; *names && !rc; names++)
		rc = jnl_name_check(*names);
	if (!rc)
		rc = jnl_wtx_begin(j, w, true);
	if (rc)
		return rc;
	*s = nset_alloc(w);
	if (!*s) {
		jnl_wtx_abort(w);
		return -ENOMEM;
	}
	return 0;
}

/* Its end when nothing is to change: aborted. */
static void change_abort(struct jnl_wtx *w, struct nset *s)
{
	free(s);
	jnl_wtx_abort(w);
}

/* Its end: committed if @rc is 0, else aborted (nothing changed). */
static int change_end(struct jnl_wtx *w, struct nset *s, int rc)
{
	if (rc) {
		change_abort(w, s);
		return rc;
	}
	free(s);
	return jnl_wtx_commit(w);
}

/* A directory that can take names: exists, is a directory, not removed. */
static int dir_get(struct nset *s, jnl_id id, struct jnl_nrec **out)
{
	int rc = nset_get(s, id, out);

	if (rc)
		return rc;
	if (!S_ISDIR((*out)->r.mode))
		return -ENOTDIR;
	if ((*out)->r.flags & JNL_NODE_UNLINKED)
		return -ENOENT;
	return 0;
}

/* The merged entry of (parent, name): 0 with d, or -ENOENT (no entry or a
 * whiteout: *d tells). */
static int name_get(struct jnl_wtx *w, jnl_id parent, const char *name,
		    struct jnl_dval *d)
{
	int rc = jnl_dentry_get(w->j, w->txn, parent, name, d);

	if (rc == -ENOENT)
		memset(d, 0, sizeof(*d));
	if (rc)
		return rc;
	return d->id ? 0 : -ENOENT;
}

/* Has @dir a name (not a whiteout) in the merged view? */
static int dir_has_names(struct jnl *j, MDB_txn *txn, jnl_id dir)
{
	unsigned char kb[8];
	MDB_val k = { 8, kb }, v;
	MDB_cursor *c;
	int rc, found = 0;

	jnl_be64_put(kb, dir);
	rc = mdb_cursor_open(txn, j->db_dentries, &c);
	if (rc)
		return jnl_mdb(j, rc);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE); !rc;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		struct jnl_dval d;

		if (k.mv_size < 8 || jnl_be64_get(k.mv_data) != dir)
			break;
		if (v.mv_size != sizeof(d)) {
			rc = MDB_CORRUPTED;
			break;
		}
		memcpy(&d, v.mv_data, sizeof(d));
		if (d.id) {
			found = 1;
			break;
		}
	}
	mdb_cursor_close(c);
	if (rc && rc != MDB_NOTFOUND)
		return jnl_mdb(j, rc);
	return found;
}

/* Is @id an ancestor of (or equal to) @dir in the merged view? */
static int is_ancestor(struct jnl_wtx *w, jnl_id id, jnl_id dir)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	int rc = 0;

	if (!n)
		return -ENOMEM;
	for (int depth = 0; dir && depth < 4096; depth++) {
		if (dir == id) {
			rc = 1;
			break;
		}
		if (dir == JNL_ROOT)
			break;
		rc = jnl_node_read(w->j, w->txn, dir, n);
		if (rc)
			break;
		dir = n->r.mparent;
	}
	free(n);
	return rc;
}

static bool is_handed(struct jnl *j, uint64_t seq)
{
	bool handed;

	pthread_mutex_lock(&j->lock);
	handed = jnl_u64set_has(&j->handed, seq);
	pthread_mutex_unlock(&j->lock);
	return handed;
}

/* A node lost its last name: UNLINKED, and its chunks leave dirtyq. */
static int node_unlinked(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n)
{
	bool was = jnl_node_claimable(&n->r);

	n->r.nlink = 0;
	n->r.flags |= JNL_NODE_UNLINKED;
	if (S_ISREG(n->r.mode)) { /* its data goes nowhere now */
		pthread_mutex_lock(&w->j->lock);
		jnl_node_gone_locked(w->j, id);
		pthread_mutex_unlock(&w->j->lock);
	}
	return was ? jnl_chunks_enqueue(w, id, n, false) : 0;
}

/* --- reading ---------------------------------------------------------------- */

static void to_public(jnl_id id, const struct jnl_node_rec *r,
		      struct jnl_node *out)
{
	memset(out, 0, sizeof(*out));
	out->id = id;
	out->flags = r->flags;
	out->mode = (mode_t)r->mode;
	out->uid = (uid_t)r->uid;
	out->gid = (gid_t)r->gid;
	out->size = r->size;
	ts_get(&out->atime, r->atime_sec, r->atime_nsec);
	ts_get(&out->mtime, r->mtime_sec, r->mtime_nsec);
	ts_get(&out->ctime, r->ctime_sec, r->ctime_nsec);
	out->nlink = r->nlink;
	out->base_dev = r->base_dev;
	out->base_ino = r->base_ino;
	out->rparent = r->rparent;
	out->base = (enum jnl_base)r->bstate;
	out->base_size = r->bsize;
	ts_get(&out->base_mtime, r->bmtime_sec, r->bmtime_nsec);
	out->base_seq = r->bseq;
	out->remote_valid = r->rvalid;
	out->remote_cut = r->rcut;
}

int jnl_node_get(struct jnl *j, jnl_id id, struct jnl_node *out)
{
	struct jnl_pnode p;
	struct jnl_nrec *n;
	MDB_txn *txn;
	int rc;

	n = malloc(sizeof(*n));
	if (!n)
		return -ENOMEM;
	jnl_pend_node_get(j, id, &p); /* memory first: invariant 11 */
	rc = jnl_rtx_begin(j, &txn);
	if (!rc) {
		rc = jnl_node_read(j, txn, id, n);
		jnl_rtx_end(j);
	}
	if (!rc) {
		jnl_pnode_merge(&p, &n->r);
		to_public(id, &n->r, out);
		out->pending_ops = n->r.nops;
		out->unflushed = n->r.unflushed;
		out->uncommitted = p.size_set || p.mtime_set;
	}
	free(n);
	return rc;
}

int jnl_lookup(struct jnl *j, jnl_id parent, const char *name, jnl_id *id,
	       bool *whiteout)
{
	struct jnl_dval d;
	MDB_txn *txn;
	int rc;

	*id = 0;
	*whiteout = false;
	rc = jnl_name_check(name);
	if (rc)
		return rc;
	rc = jnl_rtx_begin(j, &txn);
	if (rc)
		return rc;
	rc = jnl_dentry_get(j, txn, parent, name, &d);
	jnl_rtx_end(j);
	if (rc)
		return rc;
	if (!d.id) {
		*whiteout = true;
		return -ENOENT;
	}
	*id = d.id;
	return 0;
}

int jnl_readlink(struct jnl *j, jnl_id id, char *buf, size_t size)
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
	if (!rc && !S_ISLNK(n->r.mode))
		rc = -EINVAL;
	else if (!rc && !n->r.target_len)
		rc = -ENODATA; /* imported: the remote has the target */
	else if (!rc && size <= n->r.target_len)
		rc = -ERANGE;
	if (!rc) {
		memcpy(buf, n->target, n->r.target_len + 1u);
		rc = n->r.target_len;
	}
	free(n);
	return rc;
}

#define READDIR_BATCH 64

struct dirent_batch {
	int count;
	jnl_id id[READDIR_BATCH];
	char name[READDIR_BATCH][NAME_MAX + 1];
};

/* Up to READDIR_BATCH entries of @dir after @after ("" = from the start)
 * into @b. */
static int readdir_batch(struct jnl *j, MDB_txn *txn, jnl_id dir,
			 const char *after, struct dirent_batch *b)
{
	struct jnl_dkey dk;
	MDB_val k, v;
	MDB_cursor *c;
	int rc;

	b->count = 0;
	jnl_be64_put(dk.b, dir);
	dk.len = 8 + strlen(after);
	memcpy(dk.b + 8, after, dk.len - 8);
	k.mv_size = dk.len;
	k.mv_data = dk.b;
	rc = mdb_cursor_open(txn, j->db_dentries, &c);
	if (rc)
		return jnl_mdb(j, rc);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	     !rc && b->count < READDIR_BATCH;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		struct jnl_dval d;
		size_t len;

		if (k.mv_size < 9 || k.mv_size > 8 + NAME_MAX ||
		    jnl_be64_get(k.mv_data) != dir)
			break;
		len = k.mv_size - 8;
		if (*after && len == strlen(after) &&
		    !memcmp((const char *)k.mv_data + 8, after, len))
			continue; /* the last one of the batch before */
		if (v.mv_size != sizeof(d)) {
			rc = jnl_fail(j, -EIO);
			break;
		}
		memcpy(&d, v.mv_data, sizeof(d));
		memcpy(b->name[b->count], (const char *)k.mv_data + 8, len);
		b->name[b->count][len] = 0;
		b->id[b->count++] = d.id;
	}
	mdb_cursor_close(c);
	if (rc == MDB_NOTFOUND)
		rc = 0;
	else if (rc > 0 || rc < -4096)
		rc = jnl_mdb(j, rc);
	return rc;
}

int jnl_readdir(struct jnl *j, jnl_id dir, jnl_dirent_fn fn, void *arg)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	struct dirent_batch *b = malloc(sizeof(*b));
	char after[NAME_MAX + 1] = "";
	MDB_txn *txn;
	int rc;

	if (!n || !b) {
		rc = -ENOMEM;
		goto out_free;
	}
	/* in batches, fn called with no lock held: it may use the journal */
	for (bool first = true;; first = false) {
		b->count = 0;
		rc = jnl_rtx_begin(j, &txn);
		if (rc)
			break;
		rc = first ? jnl_node_read(j, txn, dir, n) : 0;
		if (!rc && !S_ISDIR(n->r.mode))
			rc = -ENOTDIR;
		if (!rc)
			rc = readdir_batch(j, txn, dir, after, b);
		jnl_rtx_end(j);
		for (int i = 0; i < b->count && !rc; i++)
			rc = fn(b->name[i], b->id[i], arg);
		if (rc || b->count < READDIR_BATCH)
			break;
		memcpy(after, b->name[b->count - 1], sizeof(after));
	}
out_free:
	free(b);
	free(n);
	return rc;
}

/* --- import ----------------------------------------------------------------- */

static int import_get(struct jnl_wtx *w, const struct stat *st, jnl_id *id)
{
	struct jnl_key16 kk = jnl_key16((uint64_t)st->st_dev,
					(uint64_t)st->st_ino);
	MDB_val k = { 16, kk.b }, v;
	int rc = mdb_get(w->txn, w->j->db_imports, &k, &v);

	if (rc)
		return jnl_mdb(w->j, rc);
	if (v.mv_size != 8)
		return jnl_fail(w->j, -EIO);
	*id = jnl_be64_get(v.mv_data);
	return 0;
}

static int import_put(struct jnl_wtx *w, const struct stat *st, jnl_id id)
{
	struct jnl_key16 kk = jnl_key16((uint64_t)st->st_dev,
					(uint64_t)st->st_ino);
	unsigned char vb[8];
	MDB_val k = { 16, kk.b }, v = { 8, vb };

	jnl_be64_put(vb, id);
	return jnl_mdb(w->j, jnl_put(w->j, w->txn, w->j->db_imports, &k, &v, 0));
}

/* A new node in @s overlaying the share's object @st at (@parent, @name):
 * its record (the base set from @st), the dentry and the import key. */
static int import_new(struct jnl_wtx *w, struct nset *s, jnl_id parent,
		      const char *name, const struct stat *st, jnl_id *out)
{
	jnl_id id = w->m.next_id++;
	struct jnl_nrec *n = nset_new(s, id);
	int rc;

	w->m_dirty = true;
	jnl_rec_take_stat(&n->r, st);
	n->r.base_dev = (uint64_t)st->st_dev;
	n->r.base_ino = (uint64_t)st->st_ino;
	jnl_rec_base_set(&n->r, st);
	n->r.rparent = parent;
	n->r.mparent = parent;
	snprintf(n->rname, sizeof(n->rname), "%s", name);
	rc = jnl_dentry_put(w->j, w->txn, parent, name, id, 0);
	if (!rc && st->st_ino)
		rc = import_put(w, st, id);
	*out = id;
	return rc;
}

int jnl_node_import(struct jnl *j, jnl_id parent, const char *name,
		    const struct stat *st, jnl_id *out)
{
	struct jnl_nrec *p, *n;
	struct jnl_wtx w;
	struct jnl_dval d;
	struct nset *s;
	jnl_id id = 0;
	int rc;

	*out = 0;
	rc = change_begin(j, (const char *const[]){ name, NULL }, &w, &s);
	if (rc)
		return rc;
	rc = dir_get(s, parent, &p);
	if (rc)
		goto out_abort;
	rc = jnl_dentry_get(j, w.txn, parent, name, &d);
	if (!rc) { /* already known: the node, or removed here */
		*out = d.id;
		change_abort(&w, s);
		return d.id ? 0 : -ENOENT;
	}
	if (rc != -ENOENT)
		goto out_abort;
	if (st->st_ino) {
		rc = import_get(&w, st, &id);
		if (!rc) {
			rc = nset_get(s, id, &n);
			if (rc)
				goto out_abort;
			if ((n->r.mode & S_IFMT) ==
				    ((uint32_t)st->st_mode & S_IFMT) &&
			    !(n->r.flags & JNL_NODE_UNLINKED) &&
			    !S_ISDIR(n->r.mode)) {
				/* another remote name of a known file */
				rc = jnl_dentry_put(j, w.txn, parent, name, id,
						    0);
				rc = change_end(&w, s, rc);
				if (!rc)
					*out = id;
				return rc;
			}
		} else if (rc != -ENOENT) {
			goto out_abort;
		}
	}

	rc = import_new(&w, s, parent, name, st, &id);
	if (!rc)
		rc = nset_write(s);
	rc = change_end(&w, s, rc);
	if (!rc)
		*out = id;
	return rc;

out_abort:
	return change_end(&w, s, rc);
}

/* --- creation ---------------------------------------------------------------- */

static int make_node(struct jnl *j, jnl_id parent, const char *name,
		     mode_t type, const char *target,
		     const struct jnl_node *attr, jnl_id *out)
{
	struct jnl_nrec *p, *n;
	struct jnl_orec o;
	struct jnl_wtx w;
	struct jnl_dval d;
	struct timespec now;
	struct nset *s;
	uint64_t seq;
	jnl_id id;
	int rc;

	*out = 0;
	if (!attr || (target && !*target))
		return -EINVAL;
	if (target && strlen(target) >= PATH_MAX)
		return -ENAMETOOLONG;
	rc = change_begin(j, (const char *const[]){ name, NULL }, &w, &s);
	if (rc)
		return rc;
	rc = dir_get(s, parent, &p);
	if (rc)
		goto out_abort;
	rc = name_get(&w, parent, name, &d);
	if (!rc)
		rc = -EEXIST;
	if (rc != -ENOENT)
		goto out_abort;

	id = w.m.next_id++;
	w.m_dirty = true;
	n = nset_new(s, id);
	jnl_now(&now);
	n->r.flags = JNL_NODE_LOCAL;
	n->r.mode = (uint32_t)(type | (attr->mode & 07777));
	n->r.uid = (uint32_t)attr->uid;
	n->r.gid = (uint32_t)attr->gid;
	ts_set(&n->r.atime_sec, &n->r.atime_nsec,
	       attr->atime.tv_sec || attr->atime.tv_nsec ? &attr->atime : &now);
	ts_set(&n->r.mtime_sec, &n->r.mtime_nsec,
	       attr->mtime.tv_sec || attr->mtime.tv_nsec ? &attr->mtime : &now);
	ts_set(&n->r.ctime_sec, &n->r.ctime_nsec, &now);
	n->r.nlink = S_ISDIR(type) ? 2 : 1;
	n->r.mparent = parent;
	n->r.create_seq = w.m.next_seq; /* jnl_op_append() takes it */
	/* the name it will have on the remote, with rparent 0 until the ack:
	 * then the ack does not grow the record (a full map drains) */
	snprintf(n->rname, sizeof(n->rname), "%s", name);
	if (target) {
		n->r.target_len = (uint16_t)strlen(target);
		memcpy(n->target, target, n->r.target_len + 1u);
		n->r.size = n->r.target_len;
	}
	if (S_ISDIR(type))
		p->r.nlink++;
	touch(&p->r, true);

	rc = jnl_dentry_put(j, w.txn, parent, name, id, 0);
	if (!rc)
		rc = nset_write(s);
	if (rc)
		goto out_abort;
	memset(&o, 0, sizeof(o));
	o.r.type = (uint16_t)(S_ISDIR(type)   ? JNL_OP_MKDIR :
			      S_ISLNK(type) ? JNL_OP_SYMLINK :
					      JNL_OP_CREATE);
	o.r.id = id;
	o.r.parent = parent;
	o.r.wseq = d.wseq; /* the whiteout replaced, if any */
	snprintf(o.name, sizeof(o.name), "%s", name);
	rc = jnl_op_append(&w, &o, &seq);
out_abort:
	rc = change_end(&w, s, rc);
	if (!rc)
		*out = id;
	return rc;
}

int jnl_mkdir(struct jnl *j, jnl_id parent, const char *name,
	      const struct jnl_node *attr, jnl_id *out)
{
	return make_node(j, parent, name, S_IFDIR, NULL, attr, out);
}

int jnl_create(struct jnl *j, jnl_id parent, const char *name,
	       const struct jnl_node *attr, jnl_id *out)
{
	mode_t type = attr ? attr->mode & S_IFMT : 0;

	if (!type)
		type = S_IFREG;
	if (type == S_IFDIR || type == S_IFLNK)
		return -EINVAL;
	return make_node(j, parent, name, type, NULL, attr, out);
}

int jnl_symlink(struct jnl *j, jnl_id parent, const char *name,
		const char *target, const struct jnl_node *attr, jnl_id *out)
{
	if (!target)
		return -EINVAL;
	return make_node(j, parent, name, S_IFLNK, target, attr, out);
}

int jnl_link(struct jnl *j, jnl_id id, jnl_id parent, const char *name)
{
	struct jnl_nrec *p, *n;
	struct jnl_orec o;
	struct jnl_wtx w;
	struct jnl_dval d;
	struct nset *s;
	uint64_t seq;
	int rc;

	rc = change_begin(j, (const char *const[]){ name, NULL }, &w, &s);
	if (rc)
		return rc;
	rc = nset_get(s, id, &n);
	if (!rc && S_ISDIR(n->r.mode))
		rc = -EPERM;
	if (!rc && (n->r.flags & JNL_NODE_UNLINKED))
		rc = -ENOENT;
	if (!rc)
		rc = dir_get(s, parent, &p);
	if (rc)
		goto out_abort;
	rc = name_get(&w, parent, name, &d);
	if (!rc)
		rc = -EEXIST;
	if (rc != -ENOENT)
		goto out_abort;
	n->r.nlink++;
	touch(&n->r, false);
	touch(&p->r, true);
	rc = jnl_dentry_put(j, w.txn, parent, name, id, 0);
	if (!rc)
		rc = nset_write(s);
	if (rc)
		goto out_abort;
	memset(&o, 0, sizeof(o));
	o.r.type = JNL_OP_LINK;
	o.r.id = id;
	o.r.parent = parent;
	snprintf(o.name, sizeof(o.name), "%s", name);
	rc = jnl_op_append(&w, &o, &seq);
out_abort:
	return change_end(&w, s, rc);
}

/* --- removal ----------------------------------------------------------------- */

/*
 * May the removal of (parent, name) -> n cancel n's create op? Then *co is
 * the create op. See "Cancellation" above.
 */
static int may_cancel(struct jnl_wtx *w, const struct jnl_nrec *n,
		      jnl_id parent, const char *name, struct jnl_orec *co)
{
	int rc;

	if (!(n->r.flags & JNL_NODE_LOCAL) || !n->r.create_seq ||
	    n->r.nops != 1 || (!S_ISDIR(n->r.mode) && n->r.nlink != 1))
		return 0;
	rc = jnl_op_read(w->j, w->txn, n->r.create_seq, co);
	if (rc)
		return rc == -ENOENT ? jnl_fail(w->j, -EIO) : rc;
	if (co->r.parent != parent || strcmp(co->name, name))
		return 0;
	return !is_handed(w->j, co->seq);
}

static int remove_name(struct jnl *j, jnl_id parent, const char *name,
		       bool dir)
{
	struct jnl_nrec *p, *n;
	struct jnl_orec o, co;
	struct jnl_wtx w;
	struct jnl_dval d;
	struct nset *s;
	uint64_t seq;
	jnl_id id;
	int rc, cancel;

	rc = change_begin(j, (const char *const[]){ name, NULL }, &w, &s);
	if (rc)
		return rc;
	rc = dir_get(s, parent, &p);
	if (!rc)
		rc = name_get(&w, parent, name, &d);
	if (rc)
		goto out_abort;
	id = d.id;
	rc = nset_get(s, id, &n);
	if (rc)
		goto out_abort;
	if (dir && !S_ISDIR(n->r.mode))
		rc = -ENOTDIR;
	else if (!dir && S_ISDIR(n->r.mode))
		rc = -EISDIR;
	else if (dir) {
		rc = dir_has_names(j, w.txn, id);
		if (rc > 0)
			rc = -ENOTEMPTY;
	}
	if (rc)
		goto out_abort;

	cancel = may_cancel(&w, n, parent, name, &co);
	if (cancel < 0) {
		rc = cancel;
		goto out_abort;
	}
	seq = w.m.next_seq; /* the op appended below, if any */
	if (cancel) {
		/* the remote never sees it: drop the dentry, or bring back
		 * the whiteout the create replaced if its op is pending */
		struct jnl_orec wo;

		if (co.r.wseq && !(p->r.flags & JNL_NODE_LOCAL) &&
		    !jnl_op_read(j, w.txn, co.r.wseq, &wo))
			rc = jnl_dentry_put(j, w.txn, parent, name, 0,
					    co.r.wseq);
		else
			rc = jnl_dentry_del(j, w.txn, parent, name);
		n->r.create_seq = 0;
	} else {
		/* also under a LOCAL parent: the node's ops (its create,
		 * not cancelled: a setattr or a write named it too) will put
		 * the name on the remote until this op takes it away */
		rc = jnl_dentry_put(j, w.txn, parent, name, 0, seq);
	}
	if (rc)
		goto out_abort;
	if (dir) {
		p->r.nlink--;
		rc = node_unlinked(&w, id, n);
	} else if (--n->r.nlink == 0) {
		rc = node_unlinked(&w, id, n);
	}
	touch(&n->r, false);
	touch(&p->r, true);
	if (!rc)
		rc = nset_write(s);
	if (rc)
		goto out_abort;
	if (cancel) {
		rc = jnl_op_delete(&w, &co);
	} else {
		memset(&o, 0, sizeof(o));
		o.r.type = dir ? JNL_OP_RMDIR : JNL_OP_UNLINK;
		o.r.id = id;
		o.r.parent = parent;
		snprintf(o.name, sizeof(o.name), "%s", name);
		rc = jnl_op_append(&w, &o, &seq);
	}
out_abort:
	return change_end(&w, s, rc);
}

int jnl_unlink(struct jnl *j, jnl_id parent, const char *name)
{
	return remove_name(j, parent, name, false);
}

int jnl_rmdir(struct jnl *j, jnl_id parent, const char *name)
{
	return remove_name(j, parent, name, true);
}

/* --- rename ------------------------------------------------------------------- */

static int rename_exchange(struct nset *s, jnl_id parent, const char *name,
			   jnl_id newparent, const char *newname,
			   struct jnl_orec *o)
{
	struct jnl_wtx *w = s->w;
	struct jnl_nrec *p, *np, *a, *b;
	int rc;

	rc = nset_get(s, parent, &p);
	if (!rc)
		rc = nset_get(s, newparent, &np);
	if (!rc)
		rc = nset_get(s, o->r.id, &a);
	if (!rc)
		rc = nset_get(s, o->r.id2, &b);
	if (rc)
		return rc;
	if (parent != newparent) {
		if (S_ISDIR(a->r.mode)) {
			rc = is_ancestor(w, o->r.id, newparent);
			if (rc)
				return rc < 0 ? rc : -EINVAL;
			p->r.nlink--;
			np->r.nlink++;
		}
		if (S_ISDIR(b->r.mode)) {
			rc = is_ancestor(w, o->r.id2, parent);
			if (rc)
				return rc < 0 ? rc : -EINVAL;
			np->r.nlink--;
			p->r.nlink++;
		}
	}
	a->r.mparent = newparent;
	b->r.mparent = parent;
	touch(&a->r, false);
	touch(&b->r, false);
	touch(&p->r, true);
	touch(&np->r, true);
	rc = jnl_dentry_put(w->j, w->txn, parent, name, o->r.id2, 0);
	if (!rc)
		rc = jnl_dentry_put(w->j, w->txn, newparent, newname, o->r.id,
				    0);
	return rc;
}

static int rename_move(struct nset *s, jnl_id parent, const char *name,
		       jnl_id newparent, const char *newname,
		       unsigned int flags, struct jnl_orec *o)
{
	struct jnl_wtx *w = s->w;
	struct jnl_nrec *p, *np, *a, *b = NULL;
	int rc;

	rc = nset_get(s, parent, &p);
	if (!rc)
		rc = nset_get(s, newparent, &np);
	if (!rc)
		rc = nset_get(s, o->r.id, &a);
	if (rc)
		return rc;
	if (S_ISDIR(a->r.mode) && parent != newparent) {
		rc = is_ancestor(w, o->r.id, newparent);
		if (rc)
			return rc < 0 ? rc : -EINVAL;
	}
	if (o->r.id2) {
		if (flags & RENAME_NOREPLACE)
			return -EEXIST;
		rc = nset_get(s, o->r.id2, &b);
		if (rc)
			return rc;
		if (S_ISDIR(a->r.mode) && !S_ISDIR(b->r.mode))
			return -ENOTDIR;
		if (!S_ISDIR(a->r.mode) && S_ISDIR(b->r.mode))
			return -EISDIR;
		if (S_ISDIR(b->r.mode)) {
			rc = dir_has_names(w->j, w->txn, o->r.id2);
			if (rc)
				return rc < 0 ? rc : -ENOTEMPTY;
			np->r.nlink--;
			rc = node_unlinked(w, o->r.id2, b);
		} else if (--b->r.nlink == 0) {
			rc = node_unlinked(w, o->r.id2, b);
		}
		if (rc)
			return rc;
		touch(&b->r, false);
	}
	if (S_ISDIR(a->r.mode) && parent != newparent) {
		p->r.nlink--;
		np->r.nlink++;
	}
	a->r.mparent = newparent;
	touch(&a->r, false);
	touch(&p->r, true);
	touch(&np->r, true);
	rc = jnl_dentry_put(w->j, w->txn, newparent, newname, o->r.id, 0);
	if (rc)
		return rc;
	/* a whiteout also under a LOCAL parent: the node's create puts the
	 * old name on the remote until this rename moves it */
	return jnl_dentry_put(w->j, w->txn, parent, name, 0, w->m.next_seq);
}

int jnl_rename(struct jnl *j, jnl_id parent, const char *name,
	       jnl_id newparent, const char *newname, unsigned int flags)
{
	struct jnl_nrec *p;
	struct jnl_dval sd, dd;
	struct jnl_orec o;
	struct jnl_wtx w;
	struct nset *s;
	uint64_t seq;
	int rc;

	if (flags & ~(unsigned int)(RENAME_NOREPLACE | RENAME_EXCHANGE))
		return -EINVAL;
	if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
		return -EINVAL;
	rc = change_begin(j, (const char *const[]){ name, newname, NULL }, &w,
			  &s);
	if (rc)
		return rc;
	rc = dir_get(s, parent, &p);
	if (!rc)
		rc = dir_get(s, newparent, &p);
	if (!rc)
		rc = name_get(&w, parent, name, &sd);
	if (rc)
		goto out_abort;
	rc = name_get(&w, newparent, newname, &dd);
	if (rc && rc != -ENOENT)
		goto out_abort;
	if ((parent == newparent && !strcmp(name, newname)) || sd.id == dd.id) {
		/* the same name, or two names of one node: nothing to do */
		change_abort(&w, s);
		return 0;
	}
	memset(&o, 0, sizeof(o));
	o.r.type = JNL_OP_RENAME;
	o.r.flags = flags;
	o.r.id = sd.id;
	o.r.id2 = dd.id;
	o.r.parent = parent;
	o.r.newparent = newparent;
	snprintf(o.name, sizeof(o.name), "%s", name);
	snprintf(o.newname, sizeof(o.newname), "%s", newname);
	if (flags & RENAME_EXCHANGE)
		rc = dd.id ? rename_exchange(s, parent, name, newparent,
					     newname, &o) :
			     -ENOENT;
	else
		rc = rename_move(s, parent, name, newparent, newname, flags,
				 &o);
	if (!rc)
		rc = nset_write(s);
	if (!rc)
		rc = jnl_op_append(&w, &o, &seq);
out_abort:
	return change_end(&w, s, rc);
}

/* --- setattr ------------------------------------------------------------------ */

int jnl_setattr(struct jnl *j, jnl_id id, unsigned int set,
		const struct jnl_node *attr)
{
	const unsigned int all = JNL_SET_MODE | JNL_SET_UID | JNL_SET_GID |
				 JNL_SET_SIZE | JNL_SET_ATIME | JNL_SET_MTIME;
	struct jnl_nrec *n;
	struct jnl_pnode pn;
	struct jnl_orec o;
	struct jnl_wtx w;
	struct nset *s;
	uint64_t seq;
	int rc;

	if ((set & ~all) || !attr)
		return -EINVAL;
	if (!set)
		return jnl_failed(j);
	/* SIZE: no mark may be in flight (commit_lock) and no write (rw
	 * exclusive) while the node's chunks and marks are edited. The other
	 * attributes take neither: a group commit does not hold them up */
	if (set & JNL_SET_SIZE) {
		pthread_mutex_lock(&j->commit_lock);
		pthread_rwlock_wrlock(&j->rw);
	}
	rc = jnl_wtx_begin(j, &w, true);
	if (rc)
		goto out_unlock;
	s = nset_alloc(&w);
	if (!s) {
		rc = -ENOMEM;
		goto out_abort;
	}
	rc = nset_get(s, id, &n);
	if (rc)
		goto out_abort;
	if ((set & JNL_SET_SIZE) && !S_ISREG(n->r.mode)) {
		rc = S_ISDIR(n->r.mode) ? -EISDIR : -EINVAL;
		goto out_abort;
	}
	if (set & JNL_SET_MODE)
		n->r.mode = (n->r.mode & S_IFMT) | (attr->mode & 07777);
	if (set & JNL_SET_UID)
		n->r.uid = (uint32_t)attr->uid;
	if (set & JNL_SET_GID)
		n->r.gid = (uint32_t)attr->gid;
	touch(&n->r, false);
	if (set & JNL_SET_SIZE) {
		jnl_pend_node_get(j, id, &pn);
		jnl_pnode_merge(&pn, &n->r);
		if (attr->size != n->r.size)
			touch(&n->r, true);
		if (attr->size < n->r.size && !(n->r.flags & JNL_NODE_LOCAL)) {
			/* invariant 19: the share's bytes past the new size
			 * are cut before any chunk goes out again */
			if (jnl_node_claimable(&n->r))
				rc = jnl_chunks_enqueue(&w, id, n, false);
			if (rc)
				goto out_abort;
			if (!(n->r.flags & JNL_NODE_CUT) ||
			    attr->size < n->r.rcut)
				n->r.rcut = attr->size;
			n->r.flags |= JNL_NODE_CUT;
		}
		rc = jnl_chunks_truncate(&w, id, n, attr->size);
		if (rc)
			goto out_abort;
		n->r.size = attr->size;
		if (n->r.rvalid > attr->size)
			n->r.rvalid = attr->size;
		n->r.flags |= JNL_NODE_SIZE_SET;
	}
	if (set & JNL_SET_ATIME)
		ts_set(&n->r.atime_sec, &n->r.atime_nsec, &attr->atime);
	if (set & JNL_SET_MTIME)
		ts_set(&n->r.mtime_sec, &n->r.mtime_nsec, &attr->mtime);
	if (set & (JNL_SET_ATIME | JNL_SET_MTIME))
		n->r.flags |= JNL_NODE_TIMES_SET;
	rc = nset_write(s);
	if (rc)
		goto out_abort;
	memset(&o, 0, sizeof(o));
	o.r.type = JNL_OP_SETATTR;
	o.r.id = id;
	o.r.flags = set;
	rc = jnl_op_append(&w, &o, &seq);
	if (rc)
		goto out_abort;
	free(s);
	/* the mtime set wins over the one of a write not committed yet: drop
	 * that one now, while no group commit can apply it (txn_lock) */
	if ((set & JNL_SET_MTIME) && !(set & JNL_SET_SIZE))
		jnl_pend_mtime_drop(j, id);
	rc = jnl_wtx_commit(&w);
	if (!rc && (set & JNL_SET_SIZE))
		rc = jnl_pend_setattr(j, id, set, attr->size);
	if (!rc && (set & JNL_SET_MTIME))
		jnl_pt_times(j, id, &attr->mtime);
	goto out_unlock;

out_abort:
	free(s);
	jnl_wtx_abort(&w);
out_unlock:
	if (set & JNL_SET_SIZE) {
		pthread_rwlock_unlock(&j->rw);
		pthread_mutex_unlock(&j->commit_lock);
	}
	return rc;
}

/* --- conflicts (journal.h "Conflicts"; journal.c "CONFLICTS") ------------- */

int jnl_node_send_begin(struct jnl *j, jnl_id id, uint64_t seq,
			const struct jnl_chunk_ref *c, const struct stat *st)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	struct jnl_chunk_rec cr;
	struct jnl_wtx w;
	int rc;

	if (!n)
		return -ENOMEM;
	rc = jnl_wtx_begin(j, &w, false);
	if (rc)
		goto out_free;
	rc = jnl_node_read(j, w.txn, id, n);
	if (!rc && c) {
		rc = jnl_chunk_get(j, w.txn, c->id, c->index, &cr);
		if (!rc && jnl_claim_stale(&cr, c))
			rc = -ENOENT; /* stale: a conversion took it back */
	}
	if (rc)
		goto out_abort;
	if (n->r.bstate == JNL_BASE_NONE) {
		/* not tracked; LOCAL: converted meanwhile (its ops went) */
		rc = (n->r.flags & JNL_NODE_LOCAL) ? -ENOENT : 0;
		goto out_abort;
	}
	if (n->r.bstate == JNL_BASE_SENDING)
		goto out_abort; /* rc 0: sending already */
	if (n->r.bseq != seq) {
		rc = -EAGAIN;
		goto out_abort;
	}
	if (st && !jnl_rec_base_is(&n->r, st)) {
		rc = -EXDEV;
		goto out_abort;
	}
	n->r.bstate = JNL_BASE_SENDING;
	n->r.bseq++;
	rc = jnl_node_write(j, w.txn, id, n);
	if (rc)
		goto out_abort;
	/* durable before the first byte goes: after a crash the remote
	 * attributes changed by our own writes are never taken for
	 * another writer's */
	w.sync = true;
	rc = jnl_wtx_commit(&w);
	goto out_free;

out_abort:
	jnl_wtx_abort(&w);
out_free:
	free(n);
	return rc;
}

int jnl_node_send_done(struct jnl *j, jnl_id id, uint64_t size,
		       const struct timespec *mtime, const uint64_t *rcut)
{
	struct jnl_nrec *n = malloc(sizeof(*n));
	bool changed = false;
	struct jnl_wtx w;
	int rc;

	if (!n)
		return -ENOMEM;
	rc = jnl_wtx_begin(j, &w, false);
	if (rc)
		goto out_free;
	rc = jnl_node_read(j, w.txn, id, n);
	if (rc) {
		jnl_wtx_abort(&w);
		goto out_free;
	}
	if (n->r.bstate != JNL_BASE_NONE) {
		n->r.bstate = JNL_BASE_SET;
		n->r.bsize = size;
		ts_set(&n->r.bmtime_sec, &n->r.bmtime_nsec, mtime);
		n->r.bseq++;
		changed = true;
	}
	/* the cut: unless shrunk lower meanwhile (a later replay cuts) */
	if (rcut && (n->r.flags & JNL_NODE_CUT) && n->r.rcut == *rcut) {
		n->r.flags &= ~(uint32_t)JNL_NODE_CUT;
		n->r.rcut = 0;
		if (jnl_node_claimable(&n->r))
			rc = jnl_chunks_enqueue(&w, id, n, true);
		changed = true;
	}
	if (!rc && changed)
		rc = jnl_node_write(j, w.txn, id, n);
	if (rc || !changed)
		jnl_wtx_abort(&w);
	else
		rc = jnl_wtx_commit(&w);
out_free:
	free(n);
	return rc;
}

/* The ops naming @id: all SETATTR or FINISH (-EBUSY otherwise), none
 * handed out but @allow_seq (-EINPROGRESS otherwise). Caller frees
 * *out. */
static int conflict_ops(struct jnl_wtx *w, jnl_id id, uint64_t allow_seq,
			struct jnl_orec **out, size_t *count)
{
	struct jnl *j = w->j;
	struct jnl_orec *v = NULL;
	size_t cap = 0;
	MDB_cursor *c;
	MDB_val k, val;
	int rc;

	*out = NULL;
	*count = 0;
	rc = mdb_cursor_open(w->txn, j->db_ops, &c);
	if (rc)
		return jnl_mdb(j, rc);
	for (rc = mdb_cursor_get(c, &k, &val, MDB_FIRST); !rc;
	     rc = mdb_cursor_get(c, &k, &val, MDB_NEXT)) {
		struct jnl_orec o;
		jnl_id ids[4];
		int nids;
		bool mine = false;

		if (k.mv_size != 8) {
			rc = MDB_CORRUPTED;
			break;
		}
		rc = jnl_op_read(j, w->txn, jnl_be64_get(k.mv_data), &o);
		if (rc)
			break;
		nids = jnl_op_nodes(&o.r, ids);
		for (int i = 0; i < nids; i++)
			mine = mine || ids[i] == id;
		if (!mine)
			continue;
		if (o.r.type != JNL_OP_SETATTR && o.r.type != JNL_OP_FINISH) {
			rc = -EBUSY;
			break;
		}
		if (o.seq != allow_seq && is_handed(j, o.seq)) {
			rc = -EINPROGRESS; /* a stream replays it: later */
			break;
		}
		if (*count == cap) {
			struct jnl_orec *nv;

			cap = cap ? cap * 2 : 8;
			nv = realloc(v, cap * sizeof(*v));
			if (!nv) {
				rc = -ENOMEM;
				break;
			}
			v = nv;
		}
		v[(*count)++] = o;
	}
	mdb_cursor_close(c);
	if (rc == MDB_NOTFOUND)
		rc = 0;
	else if (rc > 0 || rc < -4096)
		rc = jnl_mdb(j, rc);
	if (rc) {
		free(v);
		*count = 0;
		return rc;
	}
	*out = v;
	return 0;
}

static int meta_u64(struct jnl_wtx *w, const char *key, uint64_t *v)
{
	MDB_val k = { strlen(key), (void *)key }, val;
	int rc = mdb_get(w->txn, w->j->db_meta, &k, &val);

	*v = 0;
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return jnl_mdb(w->j, rc);
	if (val.mv_size != sizeof(*v))
		return jnl_fail(w->j, -EIO);
	memcpy(v, val.mv_data, sizeof(*v));
	return 0;
}

/* meta "conflict" + be64(n) -> the path of conflict copy n (1..) */
static void conflict_key(unsigned char kb[16], uint64_t n)
{
	memcpy(kb, "conflict", 8);
	jnl_be64_put(kb + 8, n);
}

/* Count a conflict and keep its path, dropping the one that falls out of
 * the JNL_CONFLICTS_KEPT most recent. */
static int conflict_record(struct jnl_wtx *w, const char *cpath)
{
	struct jnl *j = w->j;
	unsigned char kb[16];
	MDB_val k = { 9, "conflicts" }, v;
	uint64_t total;
	int rc = meta_u64(w, "conflicts", &total);

	if (rc)
		return rc;
	total++;
	v.mv_size = sizeof(total);
	v.mv_data = &total;
	rc = jnl_mdb(j, jnl_put(j, w->txn, j->db_meta, &k, &v, 0));
	if (rc)
		return rc;
	conflict_key(kb, total);
	k.mv_size = 16;
	k.mv_data = kb;
	v.mv_size = strlen(cpath);
	v.mv_data = (void *)cpath;
	rc = jnl_mdb(j, jnl_put(j, w->txn, j->db_meta, &k, &v, 0));
	if (rc || total <= JNL_CONFLICTS_KEPT)
		return rc;
	conflict_key(kb, total - JNL_CONFLICTS_KEPT);
	rc = jnl_del(j, w->txn, j->db_meta, &k, NULL);
	return rc == MDB_NOTFOUND ? 0 : jnl_mdb(j, rc);
}

static int import_del(struct jnl_wtx *w, uint64_t dev, uint64_t ino, jnl_id id)
{
	struct jnl_key16 kk = jnl_key16(dev, ino);
	MDB_val k = { 16, kk.b }, v;
	int rc = mdb_get(w->txn, w->j->db_imports, &k, &v);

	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return jnl_mdb(w->j, rc);
	if (v.mv_size != 8 || jnl_be64_get(v.mv_data) != id)
		return 0; /* another node's */
	return jnl_mdb(w->j, jnl_del(w->j, w->txn, w->j->db_imports, &k, NULL));
}

/*
 * The conversion (journal.h jnl_node_conflict()). One transaction: node X
 * becomes the conflict copy (LOCAL, CONFLICT, at @cname, its chunks DIRTY,
 * a CREATE op, its SETATTR/FINISH ops dropped), node S (new) the share's
 * version at X's old name.
 */
int jnl_node_conflict(struct jnl *j, jnl_id id, uint64_t seq,
		      const struct stat *st, const char *cname,
		      const char *cpath, uint64_t allow_seq, jnl_id *share_id)
{
	struct jnl_orec *ops = NULL, o;
	struct jnl_nrec *x, *p;
	struct jnl_dval d;
	struct jnl_wtx w;
	struct nset *s = NULL;
	size_t nops = 0;
	char oldname[NAME_MAX + 1];
	jnl_id parent, sid;
	uint64_t cseq;
	int rc;

	if (share_id)
		*share_id = 0;
	rc = jnl_name_check(cname);
	if (rc)
		return rc;
	if (!st || !cpath)
		return -EINVAL;
	rc = jnl_quiet_begin(j, id, true, &w);
	if (rc)
		return rc;
	s = nset_alloc(&w);
	if (!s) {
		rc = -ENOMEM;
		goto out_abort;
	}
	rc = nset_get(s, id, &x);
	if (rc)
		goto out_abort;
	if (x->r.bstate != JNL_BASE_SET || jnl_rec_base_is(&x->r, st) ||
	    !S_ISREG(x->r.mode) ||
	    (x->r.flags & (JNL_NODE_LOCAL | JNL_NODE_UNLINKED))) {
		rc = -ESTALE; /* not (or no longer) a conflict */
		goto out_abort;
	}
	if (x->r.bseq != seq) {
		rc = -EAGAIN;
		goto out_abort;
	}
	if (!x->r.unflushed && x->r.size == x->r.bsize &&
	    x->r.rvalid == x->r.bsize) {
		rc = -ENODATA; /* attributes only: applied to the share's */
		goto out_abort;
	}
	parent = x->r.rparent;
	if (x->r.nlink != 1 || !parent || parent != x->r.mparent) {
		rc = -EBUSY;
		goto out_abort;
	}
	snprintf(oldname, sizeof(oldname), "%s", x->rname);
	rc = jnl_dentry_get(j, w.txn, parent, oldname, &d);
	if (rc == -ENOENT || (!rc && d.id != id))
		rc = -EBUSY; /* named elsewhere in the merged view */
	if (rc)
		goto out_abort;
	rc = jnl_dentry_get(j, w.txn, parent, cname, &d);
	if (!rc)
		rc = -EEXIST; /* a name, or a whiteout: the remote has it */
	if (rc != -ENOENT)
		goto out_abort;
	rc = dir_get(s, parent, &p);
	if (!rc)
		rc = conflict_ops(&w, id, allow_seq, &ops, &nops);
	if (rc)
		goto out_abort;

	/* X: the conflict copy, created here */
	rc = import_del(&w, x->r.base_dev, x->r.base_ino, id);
	if (rc)
		goto out_abort;
	if (jnl_node_claimable(&x->r)) /* not CUT: out of dirtyq */
		rc = jnl_chunks_enqueue(&w, id, x, false);
	if (rc)
		goto out_abort;
	x->r.flags |= JNL_NODE_LOCAL | JNL_NODE_CONFLICT;
	/* its create makes a new file: nothing of the share's to cut */
	x->r.flags &= ~(uint32_t)(JNL_NODE_SIZE_SET | JNL_NODE_CUT);
	x->r.rcut = 0;
	rc = jnl_chunks_conflict(&w, id, x);
	if (rc)
		goto out_abort;
	x->r.base_dev = x->r.base_ino = 0;
	x->r.rvalid = 0;
	x->r.rparent = 0;
	x->r.bstate = JNL_BASE_NONE;
	x->r.bsize = 0;
	x->r.bmtime_sec = 0;
	x->r.bmtime_nsec = 0;
	x->r.bseq++;
	snprintf(x->rname, sizeof(x->rname), "%s", cname);
	touch(&x->r, false);

	/* S: the share's version, a fresh import at the old name */
	touch(&p->r, true);
	rc = import_new(&w, s, parent, oldname, st, &sid);
	if (!rc)
		rc = jnl_dentry_put(j, w.txn, parent, cname, id, 0);
	if (!rc)
		rc = nset_write(s);
	for (size_t i = 0; i < nops && !rc; i++)
		rc = jnl_op_delete(&w, &ops[i]);
	if (rc)
		goto out_abort;
	/* its create: the node record is read again by the append */
	rc = jnl_node_read(j, w.txn, id, x);
	if (rc)
		goto out_abort;
	x->r.create_seq = w.m.next_seq; /* jnl_op_append() takes it */
	rc = jnl_node_write(j, w.txn, id, x);
	if (rc)
		goto out_abort;
	memset(&o, 0, sizeof(o));
	o.r.type = JNL_OP_CREATE;
	o.r.id = id;
	o.r.parent = parent;
	snprintf(o.name, sizeof(o.name), "%s", cname);
	rc = jnl_op_append(&w, &o, &cseq);
	if (!rc)
		rc = conflict_record(&w, cpath);
	if (rc)
		goto out_abort;
	rc = jnl_wtx_commit(&w);
	if (!rc) {
		/* the ops went: none is handed out any more */
		pthread_mutex_lock(&j->lock);
		for (size_t i = 0; i < nops; i++)
			jnl_u64set_del(&j->handed, ops[i].seq);
		pthread_mutex_unlock(&j->lock);
		atomic_fetch_add(&j->conflict_epoch, 1);
		if (share_id)
			*share_id = sid;
	}
	jnl_quiet_end(j);
	free(ops);
	free(s);
	return rc;

out_abort:
	jnl_wtx_abort(&w);
	jnl_quiet_end(j);
	free(ops);
	free(s);
	return rc;
}

int jnl_conflict_paths(struct jnl *j, char (*paths)[PATH_MAX], int max,
		       uint64_t *total)
{
	struct jnl_wtx w; /* only w.j and w.txn: meta_u64() */
	uint64_t t = 0;
	int count = 0, rc;

	memset(&w, 0, sizeof(w));
	w.j = j;
	rc = jnl_rtx_begin(j, &w.txn);
	if (rc)
		return rc;
	rc = meta_u64(&w, "conflicts", &t);
	for (uint64_t n = t; !rc && n > 0 && count < max &&
			     n + JNL_CONFLICTS_KEPT > t;
	     n--) {
		unsigned char kb[16];
		MDB_val k = { 16, kb }, v;

		conflict_key(kb, n);
		if (mdb_get(w.txn, j->db_meta, &k, &v))
			continue;
		if (v.mv_size >= PATH_MAX)
			v.mv_size = PATH_MAX - 1;
		memcpy(paths[count], v.mv_data, v.mv_size);
		paths[count][v.mv_size] = 0;
		count++;
	}
	jnl_rtx_end(j);
	if (total)
		*total = t;
	return rc ? rc : count;
}

uint64_t jnl_conflicts_count(struct jnl *j, MDB_txn *txn)
{
	struct jnl_wtx w;
	uint64_t t = 0;

	memset(&w, 0, sizeof(w));
	w.j = j;
	w.txn = txn;
	meta_u64(&w, "conflicts", &t);
	return t;
}
