/*
 * wb.c - write-back: the FUSE operations over the journal (issue 3).
 *
 * With -o writeback=on (the default) every change made through the mount
 * goes to the journal (journal/) and is answered at once; the flusher
 * (journal/flush.c) takes it to the remote in the background. What the
 * mount shows is the merged view: the remote below, the journal above
 * (entries it adds, whiteouts for names it removed).
 *
 * Objects (the plan W1-W7 of ops.c, as built):
 *  - An inode has a journal id (fs_inode.id) once the journal knows the
 *    object: created here, or imported because something local depends on
 *    it (a write, a child, a rename, a removal). Its attributes, names and
 *    data are then the journal's (jnl_node_get, jnl_lookup, jnl_read).
 *    Its kernel inode number is the remote one for an imported object and
 *    the id with the top bit set for one created here (fs_inode key
 *    (FS_LOCAL_DEV, ...)), stable for as long as the journal keeps it.
 *  - An inode without an id is a remote object nothing local touched: the
 *    write-through operations of ops.c serve it, at the path fs_rpath()
 *    gives (from its nearest ancestor the journal knows: where the remote
 *    has it now, even under a directory renamed here and not flushed yet).
 *  - The root is the journal's JNL_ROOT; its own attributes stay the
 *    remote's (getattr, setattr and xattrs of the root go straight there).
 *
 * Rules:
 *  1. A change first imports what it names (ensure_id(): the parents up to
 *     a known one, each checked to be the same remote object as the inode,
 *     else -ESTALE), then checks the remote side of the merged view (a new
 *     name free there, a directory empty there: merged_empty()), then
 *     makes the journal call, which appends the op for the flusher.
 *  2. Objects created here belong to the calling user and group (the
 *     directory's group under a setgid directory), as in ops.c rule 2.
 *  3. Data: jnl_write(); -ENODATA asks for the remote bytes of a chunk
 *     written in part (fill_chunk()). Reads merge jnl_read() with the
 *     remote for the chunks the journal does not hold.
 *  4. fsync = durable in the journal (jnl_fsync_node). With -o sync=remote
 *     fsync and close also wait until the file is on the remote
 *     (wait_remote()).
 *  5. No lock is held across a journal or remote call; the journal is
 *     thread-safe.
 *  6. Other writers: a node with nothing pending takes the share's
 *     attributes at lookup, getattr and open; one with changes pending
 *     whose share version is no longer their base is a conflict, resolved
 *     there (node_stat_fresh(), journal.h "Conflicts"); the flusher finds
 *     the others before it writes.
 *
 * Not done yet (README "Status"): extended attributes of a file created
 * here wait for its create to reach the remote (set_xattr_wait()).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <limits.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "fs.h"
#include "fs_i.h"
#include "journal.h"
#include "log.h"
#include "remote.h"
#include "sys.h"


static bool is_root(struct fs *fs, struct fs_inode *n)
{
	return n == fs_itab_root(fs->itab);
}

/* --- paths --------------------------------------------------------------- */

/* buf = a + "/" + b (either may be empty); PATH_MAX bytes */
static int join(char *buf, const char *a, const char *b)
{
	int n;

	if (!*a)
		n = snprintf(buf, PATH_MAX, "%s", b);
	else if (!*b)
		n = snprintf(buf, PATH_MAX, "%s", a);
	else
		n = snprintf(buf, PATH_MAX, "%s/%s", a, b);
	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* Where the remote has node @id now (+ "/@name"). -ENOENT: not there. */
static int id_rpath(struct fs *fs, jnl_id id, const char *name, char *buf)
{
	char base[PATH_MAX];
	int rc = jnl_node_rpath(fs->jnl, id, base, sizeof(base));

	if (rc < 0)
		return rc;
	return join(buf, base, name ? name : "");
}

void fs_names_hold(struct fs *fs)
{
	if (fs->jnl)
		jnl_names_hold(fs->jnl);
}

void fs_names_release(struct fs *fs)
{
	if (fs->jnl)
		jnl_names_release(fs->jnl);
}

/* rmt_stat() at node @id's remote path (+ "/@name"), the names held
 * across both (journal.h, jnl_names_hold()). */
static int id_stat(struct fs *fs, jnl_id id, const char *name,
		   struct stat *st)
{
	char path[PATH_MAX];
	int rc;

	jnl_names_hold(fs->jnl);
	rc = id_rpath(fs, id, name, path);
	if (rc == 0)
		rc = rmt_stat(fs->rmt, path, st);
	jnl_names_release(fs->jnl);
	return rc;
}

int fs_rpath(struct fs *fs, struct fs_inode *n, const char *name, char *buf)
{
	char rel[PATH_MAX], base[PATH_MAX];
	uint64_t id;
	int rc;

	if (!fs->jnl)
		return fs_itab_path(fs->itab, n, name, buf, PATH_MAX);
	rc = fs_itab_path_rel(fs->itab, n, name, rel, sizeof(rel), &id);
	if (rc < 0)
		return rc;
	if (!id)
		return join(buf, "", rel);
	rc = jnl_node_rpath(fs->jnl, id, base, sizeof(base));
	if (rc < 0)
		return rc;
	return join(buf, base, rel);
}

/* --- nodes ----------------------------------------------------------------- */

/* What the kernel sees of a node; st_dev/st_ino are the inode table's key
 * (see fs_inode). */
static void node_to_stat(struct fs *fs, const struct jnl_node *nd,
			 struct stat *st)
{
	struct fs_inode *root = fs_itab_root(fs->itab);

	memset(st, 0, sizeof(*st));
	st->st_mode = nd->mode;
	st->st_uid = nd->uid;
	st->st_gid = nd->gid;
	st->st_size = (off_t)nd->size;
	st->st_nlink = nd->nlink ? (nlink_t)nd->nlink : 1;
	st->st_atim = nd->atime;
	st->st_mtim = nd->mtime;
	st->st_ctim = nd->ctime;
	st->st_blksize = S_ISREG(nd->mode) ? FS_MAX_WRITE : 4096;
	if (S_ISREG(nd->mode) && atomic_load(&fs->pt_nodes)) {
		struct jnl_node pt = *nd; /* what the kernel wrote (pt.c) */

		jnl_pt_attr(fs->jnl, nd->id, &pt);
		st->st_size = (off_t)pt.size;
		st->st_mtim = pt.mtime;
	}
	st->st_blocks = (blkcnt_t)(((uint64_t)st->st_size + 511) / 512);
	if (nd->id == JNL_ROOT) {
		st->st_dev = (dev_t)root->dev;
		st->st_ino = (ino_t)root->ino;
	} else if (nd->base_ino) {
		st->st_dev = (dev_t)nd->base_dev;
		st->st_ino = (ino_t)nd->base_ino;
	} else {
		st->st_dev = (dev_t)FS_LOCAL_DEV;
		st->st_ino = (ino_t)(nd->id | FS_LOCAL_INO_BIT);
	}
}

/* node_to_stat() of node @id as jnl_node_get() gives it now; @epoch:
 * jnl_pt_epoch() before @nd was read (read again if a passthrough pin
 * ended since: its size may be older than the marks of that close). */
static int node_stat_since(struct fs *fs, jnl_id id, struct jnl_node *nd,
			   uint64_t epoch, struct stat *st)
{
	uint64_t e;
	int rc;

	for (;;) {
		node_to_stat(fs, nd, st);
		e = jnl_pt_epoch(fs->jnl);
		if (e == epoch)
			return 0;
		epoch = e;
		rc = jnl_node_get(fs->jnl, id, nd);
		if (rc < 0)
			return rc;
	}
}

static int node_stat(struct fs *fs, jnl_id id, struct jnl_node *nd,
		     struct stat *st)
{
	struct jnl_node tmp;
	uint64_t epoch = jnl_pt_epoch(fs->jnl);
	int rc = jnl_node_get(fs->jnl, id, nd ? nd : &tmp);

	if (rc == 0)
		rc = node_stat_since(fs, id, nd ? nd : &tmp, epoch, st);
	return rc;
}

/* Everything of it is on the remote. */
static bool node_clean(const struct jnl_node *nd)
{
	return !(nd->flags & (JNL_NODE_LOCAL | JNL_NODE_DATA)) &&
	       !nd->pending_ops && !nd->unflushed && !nd->uncommitted;
}

static bool ts_eq(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/*
 * node_stat() for what the kernel asks (lookup, getattr, open): a file
 * with nothing pending is what the share has now, so another writer's
 * change is seen (close-to-open, as for the objects the journal does not
 * know): the share's attributes, taken into the journal when they differ
 * (jnl_node_refresh()). A node with changes pending keeps the journal's,
 * unless the share's version is no longer the one they were made against:
 * a conflict (journal.h "Conflicts"), resolved here. The node then is the
 * conflict copy, and *id becomes the node of the share's version (the
 * inode of its remote identity follows). Directories keep the journal's
 * attributes (their mtime moves with every entry the flush makes; a
 * refresh would stall the writers each time).
 */
static int node_stat_fresh(struct fs *fs, jnl_id *id, struct jnl_node *nd,
			   struct stat *st)
{
	struct jnl_node tmp;
	struct stat rs;
	uint64_t epoch;
	jnl_id sid;
	int rc;

	if (!nd)
		nd = &tmp;
	epoch = jnl_pt_epoch(fs->jnl);
	rc = jnl_node_get(fs->jnl, *id, nd);
	if (rc < 0)
		return rc;
	if (S_ISREG(nd->mode) && node_clean(nd) &&
	    id_stat(fs, *id, NULL, &rs) == 0 &&
	    ((uint64_t)rs.st_size != nd->size || !ts_eq(rs.st_mtim, nd->mtime) ||
	     rs.st_mode != nd->mode || rs.st_uid != nd->uid ||
	     rs.st_gid != nd->gid || nd->base == JNL_BASE_SENDING) &&
	    jnl_node_refresh(fs->jnl, *id, &rs) == 0) {
		/* SENDING with nothing pending: the flush ended without a
		 * FINISH (a utimens): the share's version is the base */
		rc = jnl_node_get(fs->jnl, *id, nd);
		if (rc < 0)
			return rc;
	} else if (nd->base == JNL_BASE_SET && !node_clean(nd) &&
		   id_stat(fs, *id, NULL, &rs) == 0 &&
		   !jnl_node_base_is(nd, &rs) &&
		   jnl_conflict_resolve(fs->jnl, fs->rmt, *id, nd->base_seq,
					&rs, 0, &sid) == 0) {
		fs_itab_move_id(fs->itab, nd->base_dev, nd->base_ino, *id,
				sid);
		*id = sid;
		rc = jnl_node_get(fs->jnl, *id, nd);
		if (rc < 0)
			return rc;
	}
	return node_stat_since(fs, *id, nd, epoch, st);
}

/*
 * The journal id of inode @n (0: none). An inode of a remote object whose
 * node became a conflict copy (the flusher resolved a conflict; the share's
 * version has another node now) lets go of that id: the copy has an inode
 * of its own, found by its name (journal.h "Conflicts").
 */
static jnl_id inode_id(struct fs *fs, struct fs_inode *n)
{
	jnl_id id = fs_itab_id(fs->itab, n);
	struct jnl_node nd;

	if (id && id != JNL_ROOT && n->dev != FS_LOCAL_DEV &&
	    jnl_node_get(fs->jnl, id, &nd) == 0 &&
	    (nd.flags & JNL_NODE_CONFLICT) && !nd.base_ino) {
		fs_itab_move_id(fs->itab, n->dev, n->ino, id, 0);
		id = fs_itab_id(fs->itab, n);
	}
	return id;
}

/*
 * The journal id of @n, importing it (and its parents) first if the
 * journal does not know it yet (rule 1).
 */
static int ensure_id(struct fs *fs, struct fs_inode *n, jnl_id *out)
{
	char name[NAME_MAX + 1];
	struct fs_inode *parent;
	struct stat st;
	jnl_id pid, id;
	int rc;

	*out = inode_id(fs, n);
	if (*out)
		return 0;
	rc = fs_itab_first_link(fs->itab, n, &parent, name);
	if (rc < 0)
		return rc;
	rc = ensure_id(fs, parent, &pid);
	fs_itab_unref(fs->itab, parent);
	if (rc == 0)
		rc = id_stat(fs, pid, name, &st);
	if (rc == -ENOENT)
		rc = -ESTALE;
	if (rc == 0 && (n->dev != (uint64_t)st.st_dev ||
			n->ino != (uint64_t)st.st_ino))
		rc = -ESTALE; /* another object took the name on the share */
	if (rc == 0)
		rc = jnl_node_import(fs->jnl, pid, name, &st, &id);
	if (rc == -ENOENT)
		rc = -ESTALE; /* the name was removed here meanwhile */
	if (rc == 0)
		rc = fs_itab_set_id(fs->itab, n, id);
	if (rc == 0)
		*out = id;
	return rc;
}

/* What (@pid or the remote @parent, @name) is in the merged view. */
struct found {
	bool journal;      /* a journal node: id, nd */
	jnl_id id;
	struct jnl_node nd;
	struct stat st;    /* the node's (node_to_stat) or the remote's */
};

/* The share did not answer (as opposed to answering "no"). */
static bool remote_down(int rc)
{
	return rc == -EIO || rc == -ETIMEDOUT || rc == -ECONNREFUSED ||
	       rc == -ECONNRESET || rc == -EHOSTUNREACH ||
	       rc == -ENETUNREACH || rc == -ENOTCONN || rc == -EPIPE ||
	       rc == -ECONNABORTED;
}

/*
 * While the share does not answer, a directory created through the mount
 * (not imported: no remote identity) is taken to hold only what the
 * journal has, so work in it goes on. Another writer of the share adding
 * a name there meanwhile is not seen until the share answers again.
 */
static bool created_here(struct fs *fs, jnl_id id)
{
	struct jnl_node nd;

	return id != JNL_ROOT && jnl_node_get(fs->jnl, id, &nd) == 0 &&
	       !nd.base_ino;
}

/*
 * A directory created through the mount less than FRESH_DIR_S ago: a name
 * the journal does not have is not there, without asking the share. A
 * `cp -r` or `tar x` into a new tree then makes no round trip per file
 * (the lookup before each create), however fast the flush made the
 * directory appear on the share. Another writer's file put there within
 * that time shows up after it (NFS clients cache directories longer).
 */
#define FRESH_DIR_S 30

static bool fresh_here(struct fs *fs, jnl_id id)
{
	struct jnl_node nd;
	struct timespec now;

	if (id == JNL_ROOT || jnl_node_get(fs->jnl, id, &nd) ||
	    nd.base_ino || !S_ISDIR(nd.mode))
		return false;
	clock_gettime(CLOCK_REALTIME, &now);
	return now.tv_sec - nd.ctime.tv_sec < FRESH_DIR_S;
}

static int find_in(struct fs *fs, jnl_id pid, struct fs_inode *parent,
		   const char *name, struct found *f)
{
	char path[PATH_MAX];
	bool whiteout, asked;
	int rc;

	memset(f, 0, sizeof(*f));
	if (pid) {
		rc = jnl_lookup(fs->jnl, pid, name, &f->id, &whiteout);
		if (rc == 0) {
			jnl_id again;

			f->journal = true;
			rc = node_stat_fresh(fs, &f->id, &f->nd, &f->st);
			/* another thread resolved a conflict on it meanwhile:
			 * the name is the share's version's now */
			if (rc == 0 && (f->nd.flags & JNL_NODE_CONFLICT) &&
			    jnl_lookup(fs->jnl, pid, name, &again,
				       &whiteout) == 0 &&
			    again != f->id) {
				f->id = again;
				rc = node_stat_fresh(fs, &f->id, &f->nd,
						     &f->st);
			}
			return rc;
		}
		if (rc != -ENOENT || whiteout)
			return rc;
		if (fresh_here(fs, pid))
			return -ENOENT;
	}
	jnl_names_hold(fs->jnl);
	if (pid)
		rc = id_rpath(fs, pid, name, path); /* -ENOENT: LOCAL */
	else
		rc = fs_rpath(fs, parent, name, path);
	asked = rc == 0;
	if (asked)
		rc = rmt_stat(fs->rmt, path, &f->st);
	jnl_names_release(fs->jnl);
	if (asked && remote_down(rc) && pid && created_here(fs, pid))
		rc = -ENOENT;
	return rc;
}

static int find(struct fs *fs, struct fs_inode *parent, const char *name,
		struct found *f)
{
	return find_in(fs, fs_itab_id(fs->itab, parent), parent, name, f);
}

/* Make sure the journal knows what @f found at (@pid, @name). */
static int import_found(struct fs *fs, jnl_id pid, const char *name,
			struct found *f)
{
	int rc;

	if (f->journal)
		return 0;
	rc = jnl_node_import(fs->jnl, pid, name, &f->st, &f->id);
	if (rc < 0)
		return rc == -ENOENT ? -ESTALE : rc;
	fs_itab_set_id_by_key(fs->itab, (uint64_t)f->st.st_dev,
			      (uint64_t)f->st.st_ino, f->id);
	f->journal = true;
	return jnl_node_get(fs->jnl, f->id, &f->nd);
}

/* Attributes of any inode: the root's and unknown objects' from the
 * remote, nodes' from the journal. */
static int inode_attr(struct fs *fs, struct fs_inode *n, struct stat *st)
{
	char path[PATH_MAX];
	jnl_id id = fs_itab_id(fs->itab, n);
	int rc;

	if (id && !is_root(fs, n))
		return node_stat(fs, id, NULL, st);
	jnl_names_hold(fs->jnl);
	rc = fs_rpath(fs, n, NULL, path);
	if (rc == 0)
		rc = rmt_stat(fs->rmt, path, st);
	jnl_names_release(fs->jnl);
	if (rc == 0 && (n->dev != (uint64_t)st->st_dev ||
			n->ino != (uint64_t)st->st_ino))
		rc = -ESTALE;
	return rc;
}

struct dir_scan {
	struct fs *fs;
	jnl_id dir;
	bool collect; /* keep the names, else stop at the first name */
	int found;    /* a name (not a whiteout) */
	char (*names)[NAME_MAX + 1];
	jnl_id *ids;
	size_t n, cap;
};

static int scan_names(const char *name, jnl_id id, void *arg)
{
	struct dir_scan *s = arg;

	if (id)
		s->found = 1;
	if (!s->collect)
		return id ? 1 : 0; /* emptiness only: stop at the first */
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		void *a = realloc(s->names, cap * sizeof(*s->names));

		if (!a)
			return -ENOMEM;
		s->names = a;
		a = realloc(s->ids, cap * sizeof(*s->ids));
		if (!a)
			return -ENOMEM;
		s->ids = a;
		s->cap = cap;
	}
	snprintf(s->names[s->n], NAME_MAX + 1, "%s", name);
	s->ids[s->n++] = id;
	return 0;
}

/*
 * Is the directory empty in the merged view? @id its node (0: a remote
 * directory the journal does not know, at @path).
 */
static int cmp_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* Is directory @id, or the share's (@pid, @name) the journal does not
 * know (@id 0), empty in the merged view? */
static int merged_empty(struct fs *fs, jnl_id id, jnl_id pid,
			const char *name)
{
	struct dir_scan s = { .fs = fs, .dir = id, .collect = true };
	struct rmt_listing l = { 0 };
	char rp[PATH_MAX];
	bool listed;
	size_t i;
	int rc = 0;

	/* the journal first, then the share: a name the share still lists
	 * was whited out here before its removal reached the share, and
	 * its whiteout goes only after that (the other order races) */
	jnl_names_hold(fs->jnl);
	if (id) {
		rc = jnl_readdir(fs->jnl, id, scan_names, &s);
		if (rc == 0 && s.found)
			rc = -ENOTEMPTY;
	}
	if (rc == 0)
		rc = id ? id_rpath(fs, id, NULL, rp) : id_rpath(fs, pid, name, rp);
	listed = rc == 0;
	if (listed)
		rc = rmt_list(fs->rmt, rp, &l);
	jnl_names_release(fs->jnl);
	if (!listed)
		goto out;
	if (remote_down(rc) && id && created_here(fs, id))
		rc = 0; /* l is empty or partial: the journal answers */
	for (i = 0; rc == 0 && i < l.n; i++) {
		/* whiteouts are the only names left in s (s.found is false) */
		if (!s.n || !bsearch(l.e[i].name, s.names, s.n,
				     sizeof(*s.names), cmp_name))
			rc = -ENOTEMPTY;
	}
out:
	rmt_listing_release(&l);
	free(s.names);
	free(s.ids);
	return rc == -ENOENT && id ? 0 : rc; /* not on the remote: empty */
}

/* --- entries ------------------------------------------------------------- */

/* Reply the entry (@parent, @name) -> @st (node @id, or 0). -EAGAIN
 * (nothing replied): the object was renamed or unlinked since @since
 * (fs_itab_lookup_since()). */
static int reply_entry_since(fuse_req_t req, struct fs_inode *parent,
			     const char *name, jnl_id id,
			     const struct stat *st, uint64_t since)
{
	struct fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct stat a = *st;
	struct fs_inode *n = NULL;
	int rc = fs_itab_lookup_since(fs->itab, parent, name, st, 1, since,
				      &n);

	if (rc == -EAGAIN)
		return rc;
	if (rc == 0 && id && inode_id(fs, n) != id)
		rc = fs_itab_set_id(fs->itab, n, id);
	else if (rc == 0 && !id && (id = inode_id(fs, n)) != 0)
		rc = node_stat(fs, id, NULL, &a); /* a known object */
	if (rc < 0) {
		if (n)
			fs_itab_forget(fs->itab, n, 1);
		reply_err(req, rc);
		return 0;
	}
	fs_fill_entry(fs, &e, n, &a);
	if (fuse_reply_entry(req, &e) != 0)
		fs_itab_forget(fs->itab, n, 1);
	return 0;
}

static void reply_entry_st(fuse_req_t req, struct fs_inode *parent,
			   const char *name, jnl_id id, const struct stat *st)
{
	reply_entry_since(req, parent, name, id, st, FS_ITAB_ANY);
}

/* Asked again while the object found was renamed or unlinked meanwhile
 * (ops.c op_lookup). */
static void wb_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct found f;
	int rc, tries = 0;

	do {
		uint64_t since = ++tries < FS_LOOKUP_TRIES
					 ? fs_itab_moves(fs->itab)
					 : FS_ITAB_ANY;

		rc = find(fs, inode_of(fs, parent), name, &f);
		if (rc == 0)
			rc = reply_entry_since(req, inode_of(fs, parent), name,
					       f.id, &f.st, since);
	} while (rc == -EAGAIN);
	if (rc == 0)
		return;
	if (rc == -ENOENT && fs->o->negative_timeout > 0) {
		struct fuse_entry_param e = {
			.entry_timeout = fs->o->negative_timeout,
		};
		fuse_reply_entry(req, &e);
		return;
	}
	reply_err(req, rc);
}

/* --- attributes ---------------------------------------------------------- */

static void wb_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	jnl_id id = inode_id(fs, n);
	struct stat st;
	int rc;

	if (is_root(fs, n)) {
		/* the share's root, or while the share does not answer the
		 * last one it gave (the mount point stays usable) */
		char path[PATH_MAX];

		rc = fs_rpath(fs, n, NULL, path);
		if (rc == 0)
			rc = rmt_stat(fs->rmt, path, &st);
		pthread_mutex_lock(&fs->root_lock);
		if (rc == 0)
			fs->root_st = st;
		else if (remote_down(rc) && fs->root_st.st_ino) {
			st = fs->root_st;
			rc = 0;
		}
		pthread_mutex_unlock(&fs->root_lock);
		if (rc < 0)
			reply_err(req, rc);
		else
			fuse_reply_attr(req, &st, fs->o->attr_timeout);
		return;
	}
	if (!id) {
		jnl_names_hold(fs->jnl); /* its remote path */
		fs_wt_ops.getattr(req, ino, fi);
		jnl_names_release(fs->jnl);
		return;
	}
	rc = node_stat_fresh(fs, &id, NULL, &st);
	if (rc < 0)
		reply_err(req, rc);
	else
		fuse_reply_attr(req, &st, fs->o->attr_timeout);
}

static struct timespec now_ts(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts;
}

static void wb_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		       int to_set, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	struct jnl_node a = { 0 }, cur;
	unsigned int set = 0;
	struct stat st;
	jnl_id id;
	int rc;

	if (is_root(fs, n)) {
		fs_wt_ops.setattr(req, ino, attr, to_set, fi);
		return;
	}
	rc = ensure_id(fs, n, &id);
	if (rc == 0)
		rc = jnl_node_get(fs->jnl, id, &cur);
	if (rc < 0)
		goto out_err;
	if (to_set & FUSE_SET_ATTR_MODE) {
		set |= JNL_SET_MODE;
		a.mode = (cur.mode & S_IFMT) | (attr->st_mode & 07777);
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		set |= JNL_SET_UID;
		a.uid = attr->st_uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		set |= JNL_SET_GID;
		a.gid = attr->st_gid;
	}
	/* a share whose files are all the login's: chown to another owner
	 * is refused, as its driver does */
	if (!(rmt_caps(fs->rmt) & RMT_CAP_OWNER) &&
	    (((set & JNL_SET_UID) && a.uid != cur.uid) ||
	     ((set & JNL_SET_GID) && a.gid != cur.gid))) {
		rc = -EPERM;
		goto out_err;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		set |= JNL_SET_SIZE;
		a.size = (uint64_t)attr->st_size;
	}
	if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW)) {
		set |= JNL_SET_ATIME;
		a.atime = (to_set & FUSE_SET_ATTR_ATIME_NOW) ? now_ts()
							     : attr->st_atim;
	}
	if (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)) {
		set |= JNL_SET_MTIME;
		a.mtime = (to_set & FUSE_SET_ATTR_MTIME_NOW) ? now_ts()
							     : attr->st_mtim;
	}
	/* chown by root of a regular file clears set-id bits, as the
	 * kernel does on a local filesystem (the remote's chown would) */
	if ((set & (JNL_SET_UID | JNL_SET_GID)) && S_ISREG(cur.mode) &&
	    (cur.mode & (S_ISUID | S_ISGID)) && !(set & JNL_SET_MODE)) {
		set |= JNL_SET_MODE;
		a.mode = cur.mode & ~(mode_t)(S_ISUID | S_ISGID);
	}
	/* a truncate by another user: as on a local fs (fs_setid_kill()).
	 * The kernel sends no mode with it over -o passthrough (pt.c:
	 * FUSE_HANDLE_KILLPRIV_V2), and one by an older rule otherwise. The
	 * replay sets this mode with the owner, after it (remote.h). */
	if (set & JNL_SET_SIZE) {
		mode_t m = (set & JNL_SET_MODE) ? a.mode : cur.mode;
		mode_t kill = fs_setid_kill(
			req, m, (set & JNL_SET_GID) ? a.gid : cur.gid);

		if (kill) {
			set |= JNL_SET_MODE;
			a.mode = m & ~kill;
		}
	}
	rc = set ? jnl_setattr(fs->jnl, id, set, &a) : 0;
	if (rc == 0)
		rc = node_stat(fs, id, NULL, &st);
	if (rc < 0)
		goto out_err;
	if (set & JNL_SET_SIZE)
		fs_itab_cache_update(fs->itab, n, &st);
	fuse_reply_attr(req, &st, fs->o->attr_timeout);
	return;
out_err:
	reply_err(req, rc);
}

static void wb_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	jnl_id id = fs_itab_id(fs->itab, inode_of(fs, ino));
	char target[PATH_MAX], path[PATH_MAX];
	int rc;

	if (!id) {
		jnl_names_hold(fs->jnl); /* its remote path */
		fs_wt_ops.readlink(req, ino);
		jnl_names_release(fs->jnl);
		return;
	}
	rc = jnl_readlink(fs->jnl, id, target, sizeof(target));
	if (rc == -ENODATA) { /* imported: the remote has the target */
		jnl_names_hold(fs->jnl);
		rc = id_rpath(fs, id, NULL, path);
		if (rc == 0)
			rc = rmt_readlink(fs->rmt, path, target,
					  sizeof(target));
		jnl_names_release(fs->jnl);
	}
	if (rc < 0)
		reply_err(req, rc);
	else
		fuse_reply_readlink(req, target);
}

/* --- namespace ------------------------------------------------------------ */

/* Rule 2: owner and group of a new object in @pid (mode with its type). */
static int new_attr(struct fs *fs, fuse_req_t req, struct fs_inode *parent,
		    mode_t mode, struct jnl_node *a)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct stat pst;
	int rc = inode_attr(fs, parent, &pst);

	if (rc < 0)
		return rc;
	memset(a, 0, sizeof(*a));
	a->mode = mode;
	a->uid = fs->is_root ? ctx->uid : geteuid();
	a->gid = fs->is_root ? ctx->gid : getegid();
	if (!(rmt_caps(fs->rmt) & RMT_CAP_OWNER)) {
		/* every file of such a share is the login's, as its parent */
		a->uid = pst.st_uid;
		a->gid = pst.st_gid;
	} else if (pst.st_mode & S_ISGID) {
		a->gid = pst.st_gid;
		if (S_ISDIR(mode))
			a->mode |= S_ISGID;
	}
	a->atime = a->mtime = now_ts();
	return 0;
}

/* A new name the remote could not take: one it refuses (SMB's
 * characters), or whose path would pass PATH_MAX (the same limit as
 * write-through, README "Limits"). Refused now, not at its flush. */
static int check_name(struct fs *fs, struct fs_inode *parent,
		      const char *name)
{
	char path[PATH_MAX];

	if (parent == fs_itab_root(fs->itab) && !strcmp(name, RMT_RESERVED))
		return -EPERM; /* ferryfs's own (bind.c), as the remote says */
	if (fs_itab_path(fs->itab, parent, name, path, sizeof(path)) ==
	    -ENAMETOOLONG)
		return -ENAMETOOLONG;
	return rmt_name_check(fs->rmt, name);
}

/*
 * On a share that does not tell names apart by case (no RMT_CAP_CASE:
 * SMB), -EEXIST if directory @pid holds in the journal another node
 * (not @except) under @name in other letter case (é and É too): both
 * would be one file on the share, the later overwriting the earlier at
 * the flush.
 * A name the share has already is found by its own lookup (find_in()).
 */
static int case_taken(struct fs *fs, jnl_id pid, const char *name,
		      jnl_id except)
{
	if (rmt_caps(fs->rmt) & RMT_CAP_CASE)
		return 0;
	return jnl_name_case_taken(fs->jnl, pid, name, except);
}

/*
 * The parent's id (imported if needed) and that (@parent, @name) is free
 * in the merged view: -EEXIST with *f filled when it is not; -EEXIST with
 * f->st.st_mode 0 when another case of it is taken (case_taken()).
 */
static int prepare_new(struct fs *fs, struct fs_inode *parent,
		       const char *name, jnl_id *pid, struct found *f)
{
	int rc = check_name(fs, parent, name);

	if (rc == 0)
		rc = ensure_id(fs, parent, pid);
	if (rc < 0)
		return rc;
	rc = find_in(fs, *pid, parent, name, f);
	if (rc == 0)
		return -EEXIST;
	if (rc == -ENOENT)
		rc = case_taken(fs, *pid, name, 0);
	return rc;
}

/* 0 if the share can hold a node of type @mode (0: a hard link), else
 * what its driver answers (remote.h, RMT_CAP_LINK...): refused here, not
 * found out by the flusher later */
static int share_holds(struct fs *fs, mode_t mode)
{
	unsigned int caps = rmt_caps(fs->rmt), need = 0;

	if (mode == 0)
		need = RMT_CAP_LINK;
	else if (S_ISLNK(mode))
		need = RMT_CAP_SYMLINK;
	else if (S_ISFIFO(mode) || S_ISSOCK(mode))
		need = RMT_CAP_SPECIAL;
	else if (!S_ISREG(mode) && !S_ISDIR(mode))
		return -EPERM; /* no device nodes on a share */
	return (caps & need) == need ? 0 : -EPERM;
}

/* mknod, mkdir, symlink: a new node, answered with its entry */
static void new_node(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode, const char *target)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *p = inode_of(fs, parent);
	struct jnl_node a;
	struct found f;
	struct stat st;
	jnl_id pid, id = 0;
	int rc = share_holds(fs, mode);

	if (rc == 0)
		rc = prepare_new(fs, p, name, &pid, &f);
	if (rc == 0)
		rc = new_attr(fs, req, p, mode, &a);
	if (rc < 0)
		goto out_err;
	if (S_ISDIR(mode))
		rc = jnl_mkdir(fs->jnl, pid, name, &a, &id);
	else if (S_ISLNK(mode))
		rc = jnl_symlink(fs->jnl, pid, name, target, &a, &id);
	else
		rc = jnl_create(fs->jnl, pid, name, &a, &id);
	if (rc == 0)
		rc = node_stat(fs, id, NULL, &st);
	if (rc < 0)
		goto out_err;
	reply_entry_st(req, p, name, id, &st);
	return;
out_err:
	reply_err(req, rc);
}

static void wb_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode, dev_t rdev)
{
	(void)rdev;
	new_node(req, parent, name, mode ? mode : S_IFREG, NULL);
}

static void wb_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode)
{
	new_node(req, parent, name, S_IFDIR | (mode & 07777), NULL);
}

static void wb_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		       const char *name)
{
	new_node(req, parent, name, S_IFLNK | 0777, link);
}

static int handle_remote(struct fs *fs, struct fs_handle *h,
			 struct rmt_file **out);

#define HOLD_MAX 64

/*
 * A name of the regular file @st is going while it may be open here:
 * every write-back handle of it opens the share's file now (it does so
 * only at its first read otherwise), so that the bytes the journal does
 * not hold stay readable after the flusher removes the name on the share:
 * the driver keeps an open file (an fd; NFS's and SMB's hidden names), as
 * POSIX asks for an unlinked open file. A file the share does not have
 * yet (created here) fails to open: its bytes are all in the journal.
 */
static void hold_remote(struct fs *fs, const struct stat *st)
{
	struct fs_handle *hs[HOLD_MAX];
	struct fs_inode *n;
	struct rmt_file *f;
	unsigned int k;

	if (!S_ISREG(st->st_mode))
		return;
	n = fs_itab_find(fs->itab, st->st_dev, st->st_ino);
	k = n ? fs_itab_handles(fs->itab, n, hs, HOLD_MAX) : 0;
	for (unsigned int i = 0; i < k; i++) {
		if (hs[i]->id)
			(void)handle_remote(fs, hs[i], &f);
		fs_handle_put(fs, hs[i]);
	}
}

/* unlink or rmdir (dir = true) */
static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name,
			bool dir)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *p = inode_of(fs, parent);
	struct found f;
	jnl_id pid;
	int rc = ensure_id(fs, p, &pid);

	if (rc == 0)
		rc = find_in(fs, pid, p, name, &f);
	if (rc < 0)
		goto out;
	if (dir && !S_ISDIR(f.st.st_mode))
		rc = -ENOTDIR;
	else if (!dir && S_ISDIR(f.st.st_mode))
		rc = -EISDIR;
	else if (dir)
		rc = merged_empty(fs, f.journal ? f.id : 0, pid, name);
	if (rc == 0)
		rc = import_found(fs, pid, name, &f);
	if (rc == 0 && !dir)
		hold_remote(fs, &f.st);
	if (rc == 0)
		rc = dir ? jnl_rmdir(fs->jnl, pid, name)
			 : jnl_unlink(fs->jnl, pid, name);
	if (rc == 0)
		fs_itab_unlink(fs->itab, p, name, f.st.st_dev, f.st.st_ino);
out:
	fuse_reply_err(req, -rc);
}

static void wb_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, false);
}

static void wb_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, true);
}

static void wb_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname,
		      unsigned int flags)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *p1 = inode_of(fs, parent), *p2 = inode_of(fs, newparent);
	struct found src, dst;
	bool have_dst = false;
	jnl_id pid1, pid2;
	int rc;

	if ((flags & ~(unsigned int)(RENAME_NOREPLACE | RENAME_EXCHANGE)) ||
	    ((flags & RENAME_EXCHANGE) &&
	     !(rmt_caps(fs->rmt) & RMT_CAP_EXCHANGE))) {
		/* RENAME_WHITEOUT; an exchange the share cannot make */
		fuse_reply_err(req, EINVAL);
		return;
	}
	rc = check_name(fs, p2, newname);
	if (rc == 0)
		rc = ensure_id(fs, p1, &pid1);
	if (rc == 0)
		rc = ensure_id(fs, p2, &pid2);
	if (rc == 0)
		rc = find_in(fs, pid1, p1, name, &src);
	if (rc == 0)
		rc = import_found(fs, pid1, name, &src);
	if (rc < 0)
		goto out;
	rc = find_in(fs, pid2, p2, newname, &dst);
	if (rc == 0)
		have_dst = true;
	else if (rc != -ENOENT)
		goto out;
	rc = 0;
	if (have_dst && dst.journal && dst.id == src.id)
		goto out; /* the same object: nothing to do */
	if (!have_dst)
		rc = case_taken(fs, pid2, newname, src.id);
	if (rc < 0)
		goto out;
	if ((flags & RENAME_NOREPLACE) && have_dst) {
		rc = -EEXIST;
	} else if (flags & RENAME_EXCHANGE) {
		rc = have_dst ? import_found(fs, pid2, newname, &dst) : -ENOENT;
	} else if (have_dst) {
		bool sdir = S_ISDIR(src.st.st_mode), ddir = S_ISDIR(dst.st.st_mode);

		if (sdir && !ddir)
			rc = -ENOTDIR;
		else if (!sdir && ddir)
			rc = -EISDIR;
		else if (ddir)
			rc = merged_empty(fs, dst.journal ? dst.id : 0, pid2,
					  newname);
	}
	if (rc == 0 && have_dst && !(flags & RENAME_EXCHANGE))
		hold_remote(fs, &dst.st); /* replaced */
	if (rc == 0)
		rc = jnl_rename(fs->jnl, pid1, name, pid2, newname, flags);
	if (rc == 0)
		fs_itab_rename(fs->itab, p1, name, &src.st, p2, newname,
			       have_dst ? &dst.st : NULL,
			       (flags & RENAME_EXCHANGE) != 0);
out:
	fuse_reply_err(req, -rc);
}

static void wb_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		    const char *newname)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *p = inode_of(fs, newparent);
	struct found f;
	struct stat st;
	jnl_id id, pid;
	int rc = share_holds(fs, 0);

	if (rc == 0)
		rc = ensure_id(fs, inode_of(fs, ino), &id);
	if (rc == 0)
		rc = prepare_new(fs, p, newname, &pid, &f);
	if (rc == 0)
		rc = jnl_link(fs->jnl, id, pid, newname);
	if (rc == 0)
		rc = node_stat(fs, id, NULL, &st);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	reply_entry_st(req, p, newname, id, &st);
}

/* --- files ------------------------------------------------------------------ */

static int handle_new(struct fs *fs, struct fs_inode *n, jnl_id id, int flags,
		      struct fs_handle **out)
{
	struct fs_handle *h = calloc(1, sizeof(*h));

	if (!h || jnl_node_open(fs->jnl, id)) { /* its data stays while open */
		free(h);
		return -ENOMEM;
	}
	h->id = id;
	h->inode = n;
	h->append = (flags & O_APPEND) != 0;
	h->direct = (flags & O_ACCMODE) == O_WRONLY && !fs->o->no_direct_write;
	pthread_mutex_init(&h->lock, NULL);
	fs_itab_handle_add(fs->itab, h);
	*out = h;
	return 0;
}

/* The last ref of write-back handle @h went (ops.c fs_handle_put()). */
void fs_wb_handle_gone(struct fs *fs, struct fs_handle *h)
{
	jnl_node_close(fs->jnl, h->id);
}

/* The file info of a write-back open of @n (node attributes @st). */
static void open_info(struct fs *fs, struct fs_handle *h, struct fs_inode *n,
		      const struct stat *st, struct fuse_file_info *fi)
{
	/* only this mount changes a node: the kernel's pages stay good
	 * while its size and mtime are those it saw */
	fi->keep_cache = fs_itab_keep_cache(fs->itab, n, st);
	fi->direct_io = h->direct;
	fi->noflush = !fs->o->sync_remote;
	fi->fh = (uint64_t)(uintptr_t)h;
}

/*
 * The truncate of an open(O_TRUNC) of node @id (attributes @st, its new
 * ones on return): its size, and the set-id bits a truncate by the
 * caller clears (fs_setid_kill()). The kernel tells us neither
 * (FUSE_ATOMIC_O_TRUNC: no SETATTR follows such an open).
 */
static int open_trunc(struct fs *fs, fuse_req_t req, jnl_id id, struct stat *st)
{
	struct jnl_node a = { .size = 0 };
	unsigned int set = st->st_size ? JNL_SET_SIZE : 0;
	mode_t kill = fs_setid_kill(req, st->st_mode, st->st_gid);
	int rc;

	if (kill) {
		set |= JNL_SET_MODE;
		a.mode = st->st_mode & ~kill;
	}
	if (!set)
		return 0;
	rc = jnl_setattr(fs->jnl, id, set, &a);
	return rc < 0 ? rc : node_stat(fs, id, NULL, st);
}

static void wb_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	jnl_id id = inode_id(fs, n);
	bool writing = (fi->flags & O_ACCMODE) != O_RDONLY ||
		       (fi->flags & O_TRUNC);
	struct fs_handle *h = NULL;
	struct stat st;
	int rc = 0;

	if (!id && !writing) { /* reading a remote file nothing touched */
		fs_wt_ops.open(req, ino, fi);
		return;
	}
	if (!id)
		rc = ensure_id(fs, n, &id);
	if (rc == 0)
		rc = node_stat_fresh(fs, &id, NULL, &st);
	if (rc == 0 && (fi->flags & O_TRUNC))
		rc = open_trunc(fs, req, id, &st);
	if (rc == 0)
		rc = handle_new(fs, n, id, fi->flags, &h);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	open_info(fs, h, n, &st, fi);
	fs_pt_open(fs, h, &st, fi->flags, fi);
	if (!fi->keep_cache) /* the share changed it: the kernel's size and
				times go too (ops.c op_open) */
		fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0);
	if (fuse_reply_open(req, fi) != 0)
		fs_handle_put(fs, h);
	fs_pt_reply_done();
}

static void wb_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		      mode_t mode, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *p = inode_of(fs, parent), *n;
	struct fuse_entry_param e;
	struct fs_handle *h = NULL;
	struct jnl_node a = { 0 };
	struct found f;
	struct stat st;
	jnl_id pid, id = 0;
	int rc = prepare_new(fs, p, name, &pid, &f);

	if (rc == -EEXIST && !(fi->flags & O_EXCL) && f.st.st_mode) {
		/* it appeared since the kernel's lookup: open it */
		rc = S_ISDIR(f.st.st_mode) ? -EISDIR
					   : import_found(fs, pid, name, &f);
		id = f.id;
		if (rc == 0 && (fi->flags & O_TRUNC))
			rc = node_stat(fs, id, NULL, &st);
		if (rc == 0 && (fi->flags & O_TRUNC))
			rc = open_trunc(fs, req, id, &st);
	} else if (rc == 0) {
		rc = new_attr(fs, req, p, S_IFREG | (mode & 07777), &a);
		if (rc == 0)
			rc = jnl_create(fs->jnl, pid, name, &a, &id);
	}
	if (rc == 0)
		rc = node_stat(fs, id, NULL, &st);
	if (rc == 0)
		rc = fs_itab_lookup(fs->itab, p, name, &st, 1, &n);
	if (rc < 0)
		goto out_err;
	rc = fs_itab_set_id(fs->itab, n, id);
	if (rc == 0)
		rc = handle_new(fs, n, id, fi->flags, &h);
	if (rc < 0) {
		fs_itab_forget(fs->itab, n, 1);
		goto out_err;
	}
	fs_fill_entry(fs, &e, n, &st);
	open_info(fs, h, n, &st, fi);
	fs_pt_open(fs, h, &st, fi->flags, fi);
	if (fuse_reply_create(req, &e, fi) != 0) {
		fs_handle_put(fs, h);
		fs_itab_forget(fs->itab, n, 1);
	}
	fs_pt_reply_done();
	return;
out_err:
	reply_err(req, rc);
}

/* The remote file of a write-back handle, opened on first use. */
static int handle_remote(struct fs *fs, struct fs_handle *h,
			 struct rmt_file **out)
{
	char path[PATH_MAX];
	int rc = 0;

	pthread_mutex_lock(&h->lock);
	if (!h->file) { /* it then follows the file through renames */
		jnl_names_hold(fs->jnl);
		rc = id_rpath(fs, h->id, NULL, path);
		if (rc == 0)
			rc = rmt_file_open(fs->rmt, path, O_RDONLY, 0,
					   &h->file);
		jnl_names_release(fs->jnl);
	}
	*out = h->file;
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* Read up to @len bytes at @off of the remote file (short only at its
 * end). Returns the count or -errno. */
static ssize_t remote_pread_all(struct fs *fs, struct fs_handle *h, char *buf,
				size_t len, off_t off)
{
	struct rmt_file *f;
	int rc = handle_remote(fs, h, &f);

	return rc < 0 ? rc : rmt_file_pread_all(f, buf, len, off);
}

/* Read [off, off+len) of the remote file; zeros past its end. */
static int remote_read(struct fs *fs, struct fs_handle *h, char *buf,
		       size_t len, off_t off)
{
	ssize_t n = remote_pread_all(fs, h, buf, len, off);

	if (n < 0)
		return (int)n;
	memset(buf + n, 0, len - (size_t)n);
	return 0;
}

static void wb_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);
	uint64_t cs = jnl_chunk_size(fs->jnl), c, first, last;
	/* a reader that opened the file before the journal knew it reads
	 * the journal's changes too, once there are any */
	jnl_id id = h->id ? h->id : fs_itab_id(fs->itab, h->inode);
	bool *have = NULL;
	char *buf = NULL;
	ssize_t n;
	int rc = 0;

	if (!id) {
		fs_wt_ops.read(req, ino, size, off, fi);
		return;
	}
	if (size == 0) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	first = (uint64_t)off / cs;
	last = ((uint64_t)off + size - 1) / cs;
	buf = malloc(size);
	have = calloc(last - first + 1, sizeof(*have));
	if (!buf || !have) {
		rc = -ENOMEM;
		goto out;
	}
	n = jnl_read(fs->jnl, id, buf, size, off, have);
	if (n < 0) {
		rc = (int)n;
		goto out;
	}
	for (c = first; rc == 0 && c <= last; c++) {
		uint64_t s = c * cs > (uint64_t)off ? c * cs : (uint64_t)off;
		uint64_t e = (c + 1) * cs;

		if (e > (uint64_t)off + (uint64_t)n)
			e = (uint64_t)off + (uint64_t)n;
		if (have[c - first] || s >= e)
			continue;
		rc = remote_read(fs, h, buf + (s - (uint64_t)off), e - s,
				 (off_t)s);
	}
	size = (size_t)n;
out:
	if (rc < 0)
		reply_err(req, rc);
	else
		fuse_reply_buf(req, buf, size);
	free(buf);
	free(have);
}

/* Hand the journal the remote bytes of chunk @c (jnl_write said
 * -ENODATA). */
static int fill_chunk(struct fs *fs, struct fs_handle *h, uint64_t c)
{
	uint64_t cs = jnl_chunk_size(fs->jnl);
	char *buf = malloc(cs);
	ssize_t got = buf ? remote_pread_all(fs, h, buf, cs, (off_t)(c * cs))
			  : -ENOMEM;
	int rc = got < 0 ? (int)got
			 : jnl_chunk_fill(fs->jnl, h->id, c, buf, (size_t)got);

	free(buf);
	return rc;
}

/* A write by a user other than root clears set-id bits (fs_setid_kill(),
 * the rule ops.c clear_suid() follows too). */
static int clear_suid(struct fs *fs, fuse_req_t req, jnl_id id)
{
	struct jnl_node nd, a = { 0 };
	mode_t kill;
	int rc;

	if (fuse_req_ctx(req)->uid == 0)
		return 0;
	rc = jnl_node_get(fs->jnl, id, &nd);
	if (rc < 0)
		return rc;
	kill = fs_setid_kill(req, nd.mode, nd.gid);
	if (!kill)
		return 0;
	a.mode = nd.mode & ~kill;
	return jnl_setattr(fs->jnl, id, JNL_SET_MODE, &a);
}

static void wb_write_buf(fuse_req_t req, fuse_ino_t ino,
			 struct fuse_bufvec *in, off_t off,
			 struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);
	size_t size = fuse_buf_size(in);
	uint64_t cs = jnl_chunk_size(fs->jnl);
	char *buf;
	ssize_t rc;
	const char *data = fs_write_bytes(in, size, &buf, &rc);
	int tries;

	if (!data)
		goto out;
	if (h->append)
		pthread_mutex_lock(&h->inode->append_lock);
	for (tries = 0; tries < 4; tries++) {
		if (h->append) {
			struct jnl_node nd;

			rc = jnl_node_get(fs->jnl, h->id, &nd);
			if (rc < 0)
				break;
			off = (off_t)nd.size;
		}
		rc = size ? jnl_write(fs->jnl, h->id, data, size, off) : 0;
		if (rc != -ENODATA)
			break;
		rc = fill_chunk(fs, h, (uint64_t)off / cs);
		if (rc == 0 && ((uint64_t)off + size - 1) / cs !=
				       (uint64_t)off / cs)
			rc = fill_chunk(fs, h, ((uint64_t)off + size - 1) / cs);
		if (rc < 0)
			break;
		rc = -ENODATA;
	}
	if (h->append)
		pthread_mutex_unlock(&h->inode->append_lock);
	if (rc >= 0)
		rc = clear_suid(fs, req, h->id) ?: (ssize_t)size;
	if (rc > 0 && h->direct &&
	    fs_itab_cached_handles(fs->itab, h->inode))
		fuse_lowlevel_notify_inval_inode(fs->se, ino, off, (off_t)size);
out:
	free(buf);
	if (rc < 0)
		reply_err(req, (int)rc);
	else
		fuse_reply_write(req, (size_t)rc);
}

/*
 * -o sync=remote: wait until node @id is on the remote (its data, its
 * create and every op naming it acknowledged). Waits for as long as the
 * remote takes: that is what the option asks for.
 */
static int wait_remote(struct fs *fs, jnl_id id)
{
	struct timespec d = { 0, 1000000 };
	struct jnl_node nd;
	int rc;

	for (;;) {
		rc = jnl_node_get(fs->jnl, id, &nd);
		if (rc < 0)
			return rc;
		if (nd.flags & JNL_NODE_ERROR)
			return -EIO;
		if (node_clean(&nd) || (nd.flags & JNL_NODE_UNLINKED))
			return 0;
		rc = jnl_commit(fs->jnl); /* hand the flusher the writes now */
		if (rc < 0)
			return rc;
		jnl_flusher_kick(fs->fl);
		nanosleep(&d, NULL);
		if (d.tv_nsec < 50000000)
			d.tv_nsec *= 2;
	}
}

static void wb_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);

	if (!h->id) {
		fs_wt_ops.flush(req, ino, fi);
		return;
	}
	if (fs->o->sync_remote && h->pt)
		(void)fs_pt_mark(fs, h->id); /* it logs an error */
	fuse_reply_err(req, fs->o->sync_remote ? -wait_remote(fs, h->id) : 0);
}

/* fsync or fsyncdir of what the journal does not hold: the namespace
 * changes made so far are durable all the same (journal.c, DURABILITY),
 * then write-through's @wt asks the share. */
static void sync_unheld(fuse_req_t req, fuse_ino_t ino, int datasync,
			struct fuse_file_info *fi,
			void (*wt)(fuse_req_t, fuse_ino_t, int,
				   struct fuse_file_info *))
{
	int rc = jnl_fsync_node(fs_of(req)->jnl, JNL_ROOT);

	if (rc)
		fuse_reply_err(req, -rc);
	else
		wt(req, ino, datasync, fi);
}

static void wb_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		     struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);
	int rc;

	if (!h->id) {
		sync_unheld(req, ino, datasync, fi, fs_wt_ops.fsync);
		return;
	}
	rc = h->pt ? fs_pt_mark(fs, h->id) : 0;
	if (rc == 0)
		rc = jnl_fsync_node(fs->jnl, h->id);
	if (rc == 0 && fs->o->sync_remote)
		rc = wait_remote(fs, h->id);
	fuse_reply_err(req, -rc);
}

/* Zeros over [off, off+len) inside the file's size. */
static int punch(struct fs *fs, struct fs_handle *h, const struct jnl_node *nd,
		 off_t off, off_t len)
{
	uint64_t end = (uint64_t)off + (uint64_t)len, cs = jnl_chunk_size(fs->jnl);
	char *zeros;
	int rc = 0;

	if (end > nd->size)
		end = nd->size;
	zeros = calloc(1, FS_MAX_WRITE);
	if (!zeros)
		return -ENOMEM;
	while (rc == 0 && (uint64_t)off < end) {
		size_t n = end - (uint64_t)off < FS_MAX_WRITE
				   ? (size_t)(end - (uint64_t)off)
				   : FS_MAX_WRITE;
		ssize_t w = jnl_write(fs->jnl, h->id, zeros, n, off);

		if (w == -ENODATA) {
			rc = fill_chunk(fs, h, (uint64_t)off / cs);
			if (rc == 0)
				rc = fill_chunk(fs, h, ((uint64_t)off + n - 1) / cs);
			continue;
		}
		rc = w < 0 ? (int)w : 0;
		off += (off_t)n;
	}
	free(zeros);
	return rc;
}

static void wb_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
			 off_t len, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);
	struct jnl_node nd, a = { 0 };
	int rc;

	if (!h->id) {
		fs_wt_ops.fallocate(req, ino, mode, off, len, fi);
		return;
	}
	/* the journal keeps data, not allocation: mode 0 sets the size,
	 * KEEP_SIZE alone asks for nothing the data needs, a punched hole
	 * is written as zeros; what the kernel wrote of a file passing
	 * through is marked first (the size below is the journal's) */
	rc = h->pt ? fs_pt_mark(fs, h->id) : 0;
	if (rc == 0)
		rc = jnl_node_get(fs->jnl, h->id, &nd);
	if (rc == 0 && mode == 0 && (uint64_t)off + (uint64_t)len > nd.size) {
		a.size = (uint64_t)off + (uint64_t)len;
		rc = jnl_setattr(fs->jnl, h->id, JNL_SET_SIZE, &a);
	} else if (rc == 0 && mode == (FALLOC_FL_PUNCH_HOLE |
				       FALLOC_FL_KEEP_SIZE)) {
		rc = punch(fs, h, &nd, off, len);
	} else if (rc == 0 && mode != 0 && mode != FALLOC_FL_KEEP_SIZE) {
		rc = -EOPNOTSUPP; /* COLLAPSE_RANGE, ZERO_RANGE... */
	}
	fuse_reply_err(req, -rc);
}

/* A node's data has no holes the journal reports: all of it is data. */
static void wb_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		     struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);
	struct jnl_node nd;
	int rc;

	if (!h->id) {
		fs_wt_ops.lseek(req, ino, off, whence, fi);
		return;
	}
	if (whence != SEEK_DATA && whence != SEEK_HOLE) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	rc = h->pt ? fs_pt_mark(fs, h->id) : 0; /* as fallocate */
	if (rc == 0)
		rc = jnl_node_get(fs->jnl, h->id, &nd);
	if (rc < 0)
		reply_err(req, rc);
	else if (off < 0 || (uint64_t)off >= nd.size)
		fuse_reply_err(req, ENXIO);
	else
		fuse_reply_lseek(req, whence == SEEK_DATA ? off
							  : (off_t)nd.size);
}

static void wb_copy_file_range(fuse_req_t req, fuse_ino_t ino_in,
			       off_t off_in, struct fuse_file_info *fi_in,
			       fuse_ino_t ino_out, off_t off_out,
			       struct fuse_file_info *fi_out, size_t len,
			       int flags)
{
	struct fs *fs = fs_of(req);

	if (fs_itab_id(fs->itab, handle_of(fi_in)->inode) ||
	    fs_itab_id(fs->itab, handle_of(fi_out)->inode)) {
		/* the kernel copies through read and write instead */
		fuse_reply_err(req, EOPNOTSUPP);
		return;
	}
	fs_wt_ops.copy_file_range(req, ino_in, off_in, fi_in, ino_out, off_out,
				  fi_out, len, flags);
}

/* --- directories ------------------------------------------------------- */

/* Append one entry to a listing (ops.c frees names and ids). */
struct listing {
	struct rmt_listing *l;
	uint64_t **ids;
};

static int listing_add(struct listing *d, const char *name, jnl_id id,
		       const struct stat *st)
{
	struct rmt_listing *l = d->l;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct rmt_dirent *e = realloc(l->e, cap * sizeof(*e));
		uint64_t *ids;

		if (!e)
			return -ENOMEM;
		l->e = e;
		ids = realloc(*d->ids, cap * sizeof(*ids));
		if (!ids)
			return -ENOMEM;
		*d->ids = ids;
		l->cap = cap;
	}
	l->e[l->n].name = strdup(name);
	if (!l->e[l->n].name)
		return -ENOMEM;
	l->e[l->n].have_st = true;
	l->e[l->n].st = *st;
	(*d->ids)[l->n++] = id;
	return 0;
}

int fs_wb_dir_fill(struct fs *fs, struct fs_inode *n, struct rmt_listing *l,
		   uint64_t **ids)
{
	struct listing ls = { l, ids }, *d = &ls;
	struct dir_scan s = { .fs = fs, .collect = true };
	struct rmt_listing rl = { 0 };
	char path[PATH_MAX];
	jnl_id id = fs_itab_id(fs->itab, n);
	size_t i;
	int rc;

	/* a rewind: start again */
	rmt_listing_release(l);
	free(*ids);
	*ids = NULL;

	jnl_names_hold(fs->jnl); /* the journal's names and the share's
				    of one moment */
	if (!id) {
		rc = fs_rpath(fs, n, NULL, path);
		if (rc == 0)
			rc = rmt_list(fs->rmt, path, &rl);
	} else {
		s.dir = id;
		rc = jnl_readdir(fs->jnl, id, scan_names, &s);
		if (rc == 0)
			rc = id_rpath(fs, id, NULL, path);
		if (rc == 0) {
			rc = rmt_list(fs->rmt, path, &rl);
			if (remote_down(rc) && created_here(fs, id)) {
				rmt_listing_release(&rl);
				rc = 0;
			}
		} else if (rc == -ENOENT) {
			rc = 0; /* not on the remote: the journal's only */
		}
	}
	jnl_names_release(fs->jnl);
	/* the remote's names the journal does not know (names[] is sorted
	 * in byte order: jnl_readdir) */
	for (i = 0; rc == 0 && i < rl.n; i++) {
		if (!rl.e[i].have_st)
			continue;
		if (s.n && bsearch(rl.e[i].name, s.names, s.n,
				   sizeof(*s.names), cmp_name))
			continue;
		rc = listing_add(d, rl.e[i].name, 0, &rl.e[i].st);
	}
	/* then the journal's entries (whiteouts hide the remote's above) */
	for (i = 0; rc == 0 && i < s.n; i++) {
		struct stat st;

		if (!s.ids[i] || node_stat(fs, s.ids[i], NULL, &st) < 0)
			continue;
		rc = listing_add(d, s.names[i], s.ids[i], &st);
	}
	rmt_listing_release(&rl);
	free(s.names);
	free(s.ids);
	return rc;
}

static void wb_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
			struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	jnl_id id = fs_itab_id(fs->itab, inode_of(fs, ino));
	int rc;

	if (!id) {
		sync_unheld(req, ino, datasync, fi, fs_wt_ops.fsyncdir);
		return;
	}
	rc = jnl_fsync_node(fs->jnl, id);
	fuse_reply_err(req, -rc);
}

static void wb_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	struct statvfs sv;
	int rc = rmt_statfs(fs->rmt, &sv);

	(void)ino;
	/* the remote away: the journal's disk, which takes the writes */
	if (rc < 0 && statvfs(fs->journal_dir, &sv) < 0)
		rc = -EIO;
	else
		rc = 0;
	if (rc < 0)
		reply_err(req, rc);
	else
		fuse_reply_statfs(req, &sv);
}

/* --- extended attributes --------------------------------------------------- */

static const char *node_state(struct fs *fs, const struct jnl_node *nd)
{
	struct jnl_flush_stats fst;

	if (nd->flags & JNL_NODE_ERROR)
		return "error";
	if (node_clean(nd))
		return "clean";
	jnl_flusher_stats(fs->fl, &fst);
	return !fst.paused && !(nd->flags & JNL_NODE_LOCAL) &&
			       fst.stream[0].state != JNL_STREAM_STOPPED
		       ? "flushing"
		       : "dirty";
}

/*
 * Wait until node @id has a remote path, for its xattrs: a node created
 * here waits until its create reached the remote (at most 60 s), since the
 * journal keeps no xattrs of its own. The caller resolves the path again
 * with the names held (it may move meanwhile).
 */
static int xattr_wait(struct fs *fs, jnl_id id)
{
	struct timespec d = { 0, 2000000 };
	char path[PATH_MAX];
	int i, rc;

	for (i = 0; i < 30000; i++) {
		rc = id_rpath(fs, id, NULL, path);
		if (rc != -ENOENT)
			return rc;
		jnl_commit(fs->jnl);
		jnl_flusher_kick(fs->fl);
		nanosleep(&d, NULL);
	}
	return -EIO;
}

static bool is_local(struct fs *fs, jnl_id id)
{
	struct jnl_node nd;

	return jnl_node_get(fs->jnl, id, &nd) == 0 &&
	       (nd.flags & JNL_NODE_LOCAL);
}

/*
 * An access ACL that says no more than permission bits (owner, group and
 * other entries only: what cp -a and rsync -A set on an ordinary file)
 * is a chmod: the journal's mode, which the flush applies, must have it.
 * Returns the bits, or -1 for an ACL with named users or groups or a
 * mask, which goes to the share as it is.
 */
static int acl_mode(const char *v, size_t size)
{
	uint32_t version;
	int mode = 0, seen = 0;
	size_t i;

	if (size < 4 || (size - 4) % 8)
		return -1;
	memcpy(&version, v, 4);
	if (version != 2)
		return -1;
	for (i = 4; i < size; i += 8) {
		uint16_t tag, perm;

		memcpy(&tag, v + i, 2);
		memcpy(&perm, v + i + 2, 2);
		perm &= 7;
		if (tag == 0x01) /* ACL_USER_OBJ */
			mode |= perm << 6;
		else if (tag == 0x04) /* ACL_GROUP_OBJ */
			mode |= perm << 3;
		else if (tag == 0x20) /* ACL_OTHER */
			mode |= perm;
		else
			return -1;
		seen |= tag;
	}
	return seen == 0x25 ? mode : -1;
}

static void wb_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	jnl_id id = fs_itab_id(fs->itab, n);
	char path[PATH_MAX];
	int rc, mode;

	if (!id || is_root(fs, n) || !strncmp(name, "user.ferryfs.", 13)) {
		jnl_names_hold(fs->jnl); /* its remote path */
		fs_wt_ops.setxattr(req, ino, name, value, size, flags);
		jnl_names_release(fs->jnl);
		return;
	}
	if (!strcmp(name, "system.posix_acl_access") && !flags &&
	    (mode = acl_mode(value, size)) >= 0) {
		struct jnl_node nd, a = { 0 };

		rc = jnl_node_get(fs->jnl, id, &nd);
		a.mode = (nd.mode & ~(mode_t)0777) | (mode_t)mode;
		if (rc == 0)
			rc = jnl_setattr(fs->jnl, id, JNL_SET_MODE, &a);
		fuse_reply_err(req, -rc);
		return;
	}
	rc = xattr_wait(fs, id);
	if (rc == 0) {
		jnl_names_hold(fs->jnl);
		rc = id_rpath(fs, id, NULL, path);
		if (rc == 0)
			rc = rmt_setxattr(fs->rmt, path, name, value, size,
					  flags);
		jnl_names_release(fs->jnl);
	}
	fuse_reply_err(req, -rc);
}

static void wb_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	jnl_id id = fs_itab_id(fs->itab, n);
	char path[PATH_MAX];
	int rc;

	if (!id || is_root(fs, n) || !strncmp(name, "user.ferryfs.", 13)) {
		jnl_names_hold(fs->jnl); /* its remote path */
		fs_wt_ops.removexattr(req, ino, name);
		jnl_names_release(fs->jnl);
		return;
	}
	rc = is_local(fs, id) ? -ENODATA : xattr_wait(fs, id);
	if (rc == 0) {
		jnl_names_hold(fs->jnl);
		rc = id_rpath(fs, id, NULL, path);
		if (rc == 0)
			rc = rmt_removexattr(fs->rmt, path, name);
		jnl_names_release(fs->jnl);
	}
	/* a share without ACLs has none to remove (the access ACL of mode
	 * bits only is kept as the mode: wb_setxattr) */
	if (rc == -EOPNOTSUPP && !strncmp(name, "system.posix_acl_", 17))
		rc = -ENODATA;
	fuse_reply_err(req, -rc);
}

static void reply_xattr(fuse_req_t req, ssize_t n, const char *buf,
			size_t size)
{
	if (n < 0)
		reply_err(req, (int)n);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else if ((size_t)n > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, buf, (size_t)n);
}

static void wb_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	jnl_id id = fs_itab_id(fs->itab, n);
	char path[PATH_MAX], *buf = NULL;
	struct jnl_node nd;
	ssize_t rc;

	if (!id || is_root(fs, n)) {
		jnl_names_hold(fs->jnl); /* its remote path */
		fs_wt_ops.getxattr(req, ino, name, size);
		jnl_names_release(fs->jnl);
		return;
	}
	if (!strcmp(name, "user.ferryfs.state")) {
		const char *state = "clean";

		rc = jnl_node_get(fs->jnl, id, &nd);
		if (rc == 0)
			state = node_state(fs, &nd);
		reply_xattr(req, rc < 0 ? rc : (ssize_t)strlen(state), state,
			    size);
		return;
	}
	if (!strncmp(name, "user.ferryfs.", 13) || is_local(fs, id)) {
		fuse_reply_err(req, ENODATA);
		return;
	}
	buf = size ? malloc(size) : NULL;
	rc = size && !buf ? -ENOMEM : 0;
	if (rc == 0) {
		jnl_names_hold(fs->jnl);
		rc = id_rpath(fs, id, NULL, path);
		if (rc == 0)
			rc = rmt_getxattr(fs->rmt, path, name, buf, size);
		jnl_names_release(fs->jnl);
	}
	reply_xattr(req, rc, buf, size);
	free(buf);
}

static void wb_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	jnl_id id = fs_itab_id(fs->itab, n);
	char path[PATH_MAX], *buf = NULL;
	ssize_t rc;

	if (!id || is_root(fs, n)) {
		jnl_names_hold(fs->jnl); /* its remote path */
		fs_wt_ops.listxattr(req, ino, size);
		jnl_names_release(fs->jnl);
		return;
	}
	if (is_local(fs, id)) {
		reply_xattr(req, 0, NULL, size);
		return;
	}
	buf = size ? malloc(size) : NULL;
	rc = size && !buf ? -ENOMEM : 0;
	if (rc == 0) {
		jnl_names_hold(fs->jnl);
		rc = id_rpath(fs, id, NULL, path);
		if (rc == 0)
			rc = rmt_listxattr(fs->rmt, path, buf, size);
		jnl_names_release(fs->jnl);
	}
	if (rc == -EOPNOTSUPP)
		rc = 0;
	reply_xattr(req, rc, buf, size);
	free(buf);
}

void fs_wb_ops(struct fuse_lowlevel_ops *ops)
{
	*ops = fs_wt_ops;
	ops->lookup = wb_lookup;
	ops->getattr = wb_getattr;
	ops->setattr = wb_setattr;
	ops->readlink = wb_readlink;
	ops->mknod = wb_mknod;
	ops->mkdir = wb_mkdir;
	ops->unlink = wb_unlink;
	ops->rmdir = wb_rmdir;
	ops->symlink = wb_symlink;
	ops->rename = wb_rename;
	ops->link = wb_link;
	ops->open = wb_open;
	ops->create = wb_create;
	ops->read = wb_read;
	ops->write_buf = wb_write_buf;
	ops->flush = wb_flush;
	ops->fsync = wb_fsync;
	ops->fallocate = wb_fallocate;
	ops->lseek = wb_lseek;
	ops->copy_file_range = wb_copy_file_range;
	ops->fsyncdir = wb_fsyncdir;
	ops->statfs = wb_statfs;
	ops->setxattr = wb_setxattr;
	ops->getxattr = wb_getxattr;
	ops->listxattr = wb_listxattr;
	ops->removexattr = wb_removexattr;
}

/* --- the journal and the flusher ------------------------------------------ */

/* The agent's rmt_open() spec and options of -o agent=, agent_key=. */
static int agent_spec(const struct fs_opts *o, char **spec, char **opts)
{
	*spec = *opts = NULL;
	if (!o->agent)
		return 0;
	if (asprintf(spec, "agent://%s", o->agent) < 0) {
		*spec = NULL;
		return -ENOMEM;
	}
	if (asprintf(opts, "agent_key=%s%s", o->agent_key,
		     o->agent_encrypt ? ",agent_encrypt" : "") < 0) {
		free(*spec);
		*spec = *opts = NULL;
		return -ENOMEM;
	}
	return 0;
}

/*
 * Before the mount goes to the background: an agent that answers must take
 * our key and serve the share's root (the flusher would not use it
 * otherwise); one that does not answer now is tried again by the flusher.
 */
static int agent_check(struct fs *fs)
{
	struct stat ast, sst;
	struct rmt *a = NULL;
	char *spec, *opts;
	int rc = agent_spec(fs->o, &spec, &opts);

	if (rc || !spec)
		return rc;
	rc = rmt_open(spec, opts, &a);
	if (rc) {
		fprintf(stderr, "ferryfs: cannot use agent '%s': %s\n",
			fs->o->agent,
			rc == -EACCES ? "it refused our key (agent_key= must "
					"be the key ferry-agent was started "
					"with)" :
			rc == -EPROTO ? "it does not speak our protocol "
					"version (run a ferry-agent of the "
					"same release as ferryfs)" :
					strerror(-rc));
	} else if (!rmt_stat(a, "", &ast) && !rmt_stat(fs->rmt, "", &sst) &&
		   ast.st_ino != sst.st_ino) {
		fprintf(stderr, "ferryfs: agent '%s' serves another directory "
			"than the share's root: give the share's directory "
			"below the agent's --root as agent=HOST:PORT/PATH\n",
			fs->o->agent);
		rc = -EXDEV;
	}
	rmt_close(a);
	free(spec);
	free(opts);
	return rc;
}

int fs_wb_open(struct fs *fs, bool check_only)
{
	const struct fs_opts *o = fs->o;
	struct jnl_config cfg = {
		.chunk_size = o->chunk_size ? o->chunk_size : JNL_DEFAULT_CHUNK,
		.remote_id = rmt_id(fs->rmt),
		.max_bytes = o->journal_max,
	};
	int rc;

	if (!fs->journal_dir) {
		fs->journal_dir = o->journal ? strdup(o->journal)
					     : fs_state_default("journal", cfg.remote_id);
		if (!fs->journal_dir) {
			fprintf(stderr, "ferryfs: no journal directory: give "
					"-o journal=DIR\n");
			return -EINVAL;
		}
	}
	rc = sys_mkdir_parents(fs->journal_dir, 0700);
	if (rc == 0)
		rc = jnl_open(fs->journal_dir, &cfg, JNL_CREATE, &fs->jnl);
	if (rc < 0) {
		fprintf(stderr, "ferryfs: cannot open journal '%s': %s\n",
			fs->journal_dir,
			fs->jnl || rc == -ENAMETOOLONG ? strerror(-rc)
						       : jnl_errmsg());
		if (check_only)
			return rc;
		LOG_ERR("cannot open journal '%s': %s", fs->journal_dir,
			jnl_errmsg());
		return rc;
	}
	if (check_only) {
		struct jnl_stats st;

		rc = fs_bind_check(fs);
		if (rc) {
			jnl_close(fs->jnl);
			fs->jnl = NULL;
			return rc;
		}
		/* this open did the recovery: keep what it found to resend */
		if (jnl_stats(fs->jnl, &st) == 0)
			fs->resent_bytes = st.resent_bytes;
		jnl_close(fs->jnl);
		fs->jnl = NULL;
		return agent_check(fs);
	}
	return fs_itab_set_id(fs->itab, fs_itab_root(fs->itab), JNL_ROOT);
}

int fs_wb_start(struct fs *fs)
{
	const struct fs_opts *o = fs->o;
	struct jnl_flush_config cfg = {
		.remote_spec = fs->spec,
		.remote_opts = o->remote_opts,
		.streams = o->streams,
		.bwlimit = o->bwlimit,
		.flags = o->verify ? JNL_FLUSH_VERIFY : 0,
	};
	struct jnl_stats st;
	char *aspec, *aopts;
	int rc = agent_spec(o, &aspec, &aopts);

	cfg.agent_spec = aspec;
	cfg.agent_opts = aopts;
	if (!rc)
		rc = jnl_flusher_start(fs->jnl, &cfg, &fs->fl);
	free(aspec);
	free(aopts);
	if (rc < 0) {
		LOG_ERR("cannot start the flush to '%s': %s", fs->spec,
			strerror(-rc));
		return rc;
	}
	if (jnl_stats(fs->jnl, &st) == 0 && (st.dirty_bytes || st.pending_ops))
		LOG_INFO("journal '%s': %llu bytes and %llu operations from "
			 "before are being flushed",
			 fs->journal_dir, (unsigned long long)st.dirty_bytes,
			 (unsigned long long)st.pending_ops);
	return 0;
}

void fs_wb_stop(struct fs *fs)
{
	struct jnl_stats st;

	if (!fs->jnl)
		return;
	jnl_flusher_stop(fs->fl);
	fs->fl = NULL;
	(void)fs_pt_mark(fs, 0); /* files a lazy unmount left open */
	if (jnl_sync(fs->jnl) == 0 && jnl_stats(fs->jnl, &st) == 0 &&
	    (st.dirty_bytes || st.inflight_bytes || st.pending_ops))
		LOG_WARN("unmounted with %llu bytes and %llu operations not "
			 "on '%s' yet: they stay in the journal '%s' and are "
			 "flushed at the next mount",
			 (unsigned long long)(st.dirty_bytes +
					      st.inflight_bytes),
			 (unsigned long long)st.pending_ops, fs->o->remote,
			 fs->journal_dir);
	jnl_close(fs->jnl);
	fs->jnl = NULL;
}

static const char *stream_state(enum jnl_stream_state s)
{
	switch (s) {
	case JNL_STREAM_IDLE:
		return "idle";
	case JNL_STREAM_FLUSHING:
		return "flushing";
	case JNL_STREAM_BACKOFF:
		return "backoff";
	case JNL_STREAM_PAUSED:
		return "paused";
	case JNL_STREAM_STOPPED:
		return "stopped";
	}
	return "?";
}

#define STATUS_CONFLICT_PATHS 10 /* the most recent conflict copies shown */

/* st->conflict_paths: the most recent conflict copies. */
static int conflict_paths(struct fs *fs, struct fs_status *st)
{
	char (*paths)[PATH_MAX] = malloc(STATUS_CONFLICT_PATHS * PATH_MAX);
	int n = paths ? jnl_conflict_paths(fs->jnl, paths,
					   STATUS_CONFLICT_PATHS, NULL)
		      : 0;
	int rc = paths ? 0 : -ENOMEM;

	if (n > 0) {
		st->conflict_paths = calloc((size_t)n, sizeof(char *));
		if (!st->conflict_paths)
			rc = -ENOMEM;
	}
	for (int i = 0; !rc && i < n; i++) {
		st->conflict_paths[i] = strdup(paths[i]);
		if (!st->conflict_paths[i])
			rc = -ENOMEM;
		else
			st->nconflict_paths++;
	}
	free(paths);
	return rc;
}

int fs_wb_status(struct fs *fs, struct fs_status *st)
{
	struct jnl_flush_stats *fst = calloc(1, sizeof(*fst));
	struct rmt_counters rc;
	struct jnl_stats js;
	unsigned long long flush_read = 0;
	unsigned int i;

	if (!fst)
		return -ENOMEM;
	jnl_stats(fs->jnl, &js);
	jnl_flusher_stats(fs->fl, fst);
	st->streams = calloc(fst->streams ? fst->streams : 1,
			     sizeof(*st->streams));
	if (!st->streams) {
		free(fst);
		return -ENOMEM;
	}
	for (i = 0; i < fst->streams; i++) {
		const struct jnl_stream_stats *s = &fst->stream[i];

		flush_read += s->remote_bytes_read;
		st->streams[i] = (struct fs_stream_status){
			.state = stream_state(s->state),
			.via_agent = s->via_agent,
			.rate_bps = s->rate_bps,
			.bytes = s->bytes,
			.chunks = s->chunks,
			.ops = s->ops,
			.errors = s->errors,
			.retries = s->retries,
			.remote_bytes_written = s->remote_bytes_written,
			.last_error = s->last_error,
		};
	}
	st->nstreams = fst->streams;
	st->drained = jnl_flusher_wait(fs->fl, 0) == 0;
	rmt_counters(fs->rmt, &rc);
	st->mode = "write-back";
	st->journal = fs->journal_dir;
	st->journal_id = jnl_ident(fs->jnl);
	st->paused = fst->paused;
	st->failed = fst->failed;
	st->pending_bytes = js.dirty_bytes + js.inflight_bytes;
	st->pending_files = js.dirty_nodes;
	st->pending_ops = js.pending_ops;
	st->uncommitted = js.uncommitted;
	st->staging_bytes = js.staging_bytes;
	st->rate_bps = fst->rate_bps;
	st->eta_s = fst->rate_bps
			    ? (int64_t)(st->pending_bytes / fst->rate_bps)
			    : -1;
	st->retries = fst->retries;
	st->errors = fst->errors;
	st->failed_ops = fst->failed_ops;
	st->parked = fst->parked;
	st->conflicts = js.conflicts;
	st->resent_bytes = js.resent_bytes + fs->resent_bytes;
	st->flushed_bytes = fst->bytes;
	st->write_waits = js.write_waits;
	st->passthrough = atomic_load(&fs->pt_on);
	st->passthrough_opens = atomic_load(&fs->pt_opens);
	st->passthrough_files = atomic_load(&fs->pt_nodes);
	st->passthrough_requests = atomic_load(&fs->pt_requests);
	st->remote_bytes_read = rc.bytes_read + flush_read;
	st->remote_bytes_written = rc.bytes_written + fst->remote_bytes_written;
	st->remote_ops = rc.ops;
	free(fst);
	return conflict_paths(fs, st);
}

int fs_wb_ctl(struct fs *fs, enum fs_ctl_cmd cmd, char **reply)
{
	struct jnl_stats st;

	if (cmd == FS_CTL_FLUSH) { /* now; `flush --wait` then polls */
		int rc = fs_pt_mark(fs, 0);

		if (rc == 0)
			rc = jnl_commit(fs->jnl);

		jnl_flusher_kick(fs->fl);
		jnl_stats(fs->jnl, &st);
		*reply = rc < 0 ? fs_reply_error(strerror(-rc))
				: fs_reply_flush(st.dirty_bytes +
							 st.inflight_bytes,
						 st.pending_ops);
	} else if (cmd == FS_CTL_PAUSE || cmd == FS_CTL_RESUME) {
		if (cmd == FS_CTL_PAUSE)
			jnl_flusher_pause(fs->fl);
		else
			jnl_flusher_resume(fs->fl);
		*reply = fs_reply_ok();
	} else {
		*reply = fs_reply_error("unknown command");
	}
	return *reply ? 0 : -ENOMEM;
}
