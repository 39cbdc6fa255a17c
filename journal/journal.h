/*
 * journal.h - the upper layer of ferryfs: a durable local record of
 * everything written through the mount that the remote does not have yet
 * (../shared/DESIGN.md, "The journal").
 *
 * A journal is a directory on local disk owned by one mount (one process
 * at a time: jnl_open() flock()s the directory):
 *   meta.mdb/   LMDB environment (data.mdb, lock.mdb) with the databases
 *               meta, nodes, dentries, chunks, ops (and the indexes dirtyq,
 *               inflight, imports: journal.c)
 *   data/<id>   sparse staging file of node <id> (decimal): dirty chunks at
 *               their file offsets
 *
 * Identity. Every object the journal knows is a *node* with a 64-bit id that
 * is never reused; id 1 (JNL_ROOT) is the share's root (created with the
 * journal, as an imported directory). A node is either created here
 * (JNL_NODE_LOCAL: not on the remote until its create op is acknowledged;
 * the ack clears the flag) or *imported*: an object found on the remote
 * that something local now depends on (a write to it, a child created in
 * it, a rename of it). Objects nothing local touched are not in the journal
 * at all: the merged view (fs/) falls through to the remote for them.
 *
 * Two namespaces are kept per node:
 *  - the merged view: dentries (parent id, name) -> child id, or a whiteout
 *    (a name removed here, still on the remote). This is what the mount
 *    shows.
 *  - where the remote has the node *now* (rparent, rname): updated when an
 *    op is acknowledged. jnl_node_rpath() turns it into a remote path; the
 *    flusher writes a node's chunks there, so a pending rename never sends
 *    data to the wrong place.
 *
 * Data. jnl_write() puts bytes in data/<id> and marks the chunks it covers
 * dirty, giving each chunk a new generation. A chunk of an imported file is
 * written in part only once the journal holds it: jnl_write() says
 * -ENODATA, fs/ reads the chunk from the remote and hands it to
 * jnl_chunk_fill() (recorded FLUSHED: staging and remote agree), then
 * writes again. Otherwise staging would hold zeros where the remote has
 * data, and the flusher would send them. Chunk states (invariants in
 * journal.c):
 *
 *                  jnl_write()
 *      (clean) ----------------> DIRTY <-----------------------------+
 *                                  |  ^                              |
 *          jnl_chunk_claim()       |  | jnl_chunk_release(ok=false)  |
 *                                  v  | recovery in jnl_open()       |
 *                               INFLIGHT ----------------------------+
 *                                  |      jnl_chunk_release(ok=true)
 *                                  |      but the generation changed
 *                                  v      (a write landed meanwhile)
 *             jnl_chunk_release(ok=true), generation unchanged
 *                                  |
 *                               FLUSHED  (sha256 recorded; a crash does
 *                                         not resend it; a later write
 *                                         makes it DIRTY again;
 *                                         jnl_chunk_fill() creates it)
 *
 * Only chunks of nodes on the remote (create acknowledged, a name left) are
 * claimed: data of a file goes out after its create.
 *
 * When every chunk of a node is FLUSHED and its finishing op (truncate to
 * the final size, mode, the times the application set) is acknowledged,
 * jnl_node_clean() (a later slice) drops its chunk records and staging
 * file.
 *
 * Op log. Namespace changes (mkdir, create, symlink, link, rename, unlink,
 * rmdir, setattr, finish) are appended with increasing sequence numbers and
 * name nodes by id, not by path. jnl_ops_ready() hands out the ops that may
 * be replayed now: an op waits for every earlier unacknowledged op that
 * touches one of its nodes or an ancestor of one (in the remote tree), or
 * the same name (ops.c has the exact rule); independent ops go out
 * together. Replay of each op must be idempotent (a crash may replay an op
 * the remote already has). Unlinking the only name of a file (or an empty
 * directory) whose create is still pending and not handed out cancels the
 * create: neither op reaches the remote.
 *
 * Durability. Staging data is written at once; LMDB changes are grouped:
 * jnl_write() records chunk marks in memory, a background commit makes them
 * durable within JNL_COMMIT_MS, and jnl_sync() commits now (fsync of a
 * file through the mount = jnl_fsync_node()). A crash loses at most the
 * writes of the last JNL_COMMIT_MS that nobody fsynced, as a local
 * filesystem would. Namespace changes commit at once but LMDB syncs its meta
 * page with the next group commit (MDB_NOMETASYNC): the same bound. Marks
 * are committed only after the staging bytes they cover are fdatasync()ed,
 * so a crash never leaves a DIRTY chunk over bytes that were lost.
 *
 * Errors: 0 (or a byte count) on success, -errno on failure:
 *   -ENOENT    no such node / dentry / journal (jnl_open without JNL_CREATE)
 *   -EEXIST    dentry exists
 *   -ENODATA   jnl_write: fill the chunk first (jnl_chunk_fill)
 *   -ENOSPC    the journal disk or the LMDB map is full, or max_bytes is
 *              reached (nothing was changed by the failing call)
 *   -EINVAL    a bad argument (name with '/', "." or "..", flags, types)
 *   -EXDEV     jnl_open: the journal belongs to another remote
 *   -EPROTO    jnl_open: not a ferryfs journal, another format version,
 *              or a corrupted LMDB file
 *   -EBUSY     jnl_open: another process has the journal open
 *   -ENOTEMPTY jnl_open with JNL_CREATE: a directory that is not a journal
 *   -EIO       anything else LMDB reports, or a failed read/write/sync of
 *              a staging file; the journal is then FAILED and every later
 *              call returns the same error (sticky)
 * jnl_errmsg() gives a one-line human reason for the last jnl_open failure.
 *
 * Threads: every function may be called from any thread; the journal
 * serialises LMDB writes itself (one writer) and never holds its lock across
 * a remote call (it makes none: journal/ never calls remote/ except in the
 * flusher, flush.c, through its own API).
 */
#ifndef FERRYFS_JOURNAL_H
#define FERRYFS_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

struct jnl;

typedef uint64_t jnl_id;
#define JNL_ROOT ((jnl_id)1)

#define JNL_FORMAT_VERSION 1
#define JNL_DEFAULT_CHUNK (4u << 20)
#define JNL_COMMIT_MS 100

enum jnl_flags {
	JNL_CREATE = 1 << 0, /* create the journal if the directory is empty
				or missing */
};

struct jnl_config {
	/* power of two, 64 KiB..64 MiB; used when creating, else the stored
	 * value wins (jnl_chunk_size()) */
	uint32_t chunk_size;
	/* rmt_id() of the share: stored at creation, must match at open */
	const char *remote_id;
	/* bound on staging bytes (journal_max); 0 = until the disk is full */
	uint64_t max_bytes;
};

/*
 * Open (and with JNL_CREATE create) the journal in @dir and recover it:
 * INFLIGHT chunks become DIRTY, ops handed out but not acknowledged become
 * pending again. Recovery touches only those records: it does not scan the
 * whole journal, so a journal holding 100,000 pending files opens at once.
 * JNL_CREATE creates @dir if missing and refuses a non-empty directory
 * that holds no journal (-ENOTEMPTY). The stored chunk size wins over
 * cfg->chunk_size. Starts the group-commit thread.
 * Caller owns *out; close with jnl_close(). Errors: see above, and -ENOENT
 * (no journal, no JNL_CREATE), -EINVAL (bad cfg); on error *out is NULL.
 */
int jnl_open(const char *dir, const struct jnl_config *cfg, unsigned int flags,
	     struct jnl **out);
/* Commit what is pending and close. NULL is a no-op. */
void jnl_close(struct jnl *j);
/* Why the last jnl_open() of this thread failed: a per-thread buffer,
 * valid until that thread's next jnl_open(). */
const char *jnl_errmsg(void);

uint32_t jnl_chunk_size(const struct jnl *j);
/* Make every change so far durable (group commit now: fdatasync the
 * staging files with marks, commit, sync LMDB). Errors: -ENOSPC (the marks
 * stay pending and are retried), -EIO. */
int jnl_sync(struct jnl *j);

/* --- nodes and the merged namespace ------------------------------------ */

enum jnl_node_flags {
	JNL_NODE_LOCAL = 1 << 0,      /* created here; not on the remote yet */
	JNL_NODE_DATA = 1 << 1,       /* has chunks not yet FLUSHED */
	JNL_NODE_UNLINKED = 1 << 2,   /* no name left; kept while open (no
					 call drops it yet: a later slice) */
	JNL_NODE_TIMES_SET = 1 << 3,  /* the application set the times */
	JNL_NODE_SIZE_SET = 1 << 4,   /* truncated here: size is authoritative */
	JNL_NODE_ERROR = 1 << 5,      /* the remote refused it; see status */
};

struct jnl_node {
	jnl_id id;
	unsigned int flags;   /* enum jnl_node_flags */
	mode_t mode;          /* type and permission bits */
	uid_t uid;
	gid_t gid;
	uint64_t size;        /* the merged size */
	struct timespec atime, mtime, ctime;
	uint64_t nlink;
	/* imported nodes: the remote identity they overlay (0 if LOCAL) */
	uint64_t base_dev, base_ino;
	/* where the remote has it now (rparent 0: nowhere yet) */
	jnl_id rparent;
};

/* Read a node; size and mtime include writes not committed yet.
 * Errors: -ENOENT. */
int jnl_node_get(struct jnl *j, jnl_id id, struct jnl_node *out);

/*
 * Record the remote object @st found at (@parent, @name) as a node, or
 * return the node that already overlays it: the one the dentry names, or
 * for a non-directory the one imported with the same (st_dev, st_ino)
 * under another name (a hard link). The dentry (parent, name) then names
 * it in the merged view. No op is appended. Errors: -ENOSPC, -ENOENT (no
 * parent, or the name is whited out here), -ENOTDIR.
 */
int jnl_node_import(struct jnl *j, jnl_id parent, const char *name,
		    const struct stat *st, jnl_id *out);

/*
 * The merged-view entry of (@parent, @name): 0 and *id, or -ENOENT with
 * *whiteout = true for a name removed here, or -ENOENT with *whiteout =
 * false when the journal knows nothing of the name (ask the remote; also
 * when it knows nothing of @parent). A LOCAL directory has no remote side.
 */
int jnl_lookup(struct jnl *j, jnl_id parent, const char *name, jnl_id *id,
	       bool *whiteout);

/*
 * Namespace changes: apply to the merged view and append the op in one
 * transaction; on error nothing changed. Attributes of a new node come
 * from @attr (permission bits of mode, uid, gid; atime/mtime, now if zero);
 * jnl_create() takes the file type from attr->mode (0 = regular; not a
 * directory or symlink). The journal sees only its own dentries: the
 * caller has checked the remote side first (that a new name is free there,
 * that a directory is empty there) and has imported what it names (a
 * rename's or link's source, an EXCHANGE target, a parent).
 * Removing a name leaves a whiteout unless the parent is LOCAL.
 * Errors: -EEXIST, -ENOENT, -ENOTDIR, -EISDIR, -ENOTEMPTY (rmdir or rename
 * over a directory with entries in the journal), -EPERM (link of a
 * directory), -EINVAL (rename of a directory into itself, bad flags),
 * -ENAMETOOLONG, -ENOSPC.
 */
int jnl_mkdir(struct jnl *j, jnl_id parent, const char *name,
	      const struct jnl_node *attr, jnl_id *out);
int jnl_create(struct jnl *j, jnl_id parent, const char *name,
	       const struct jnl_node *attr, jnl_id *out);
int jnl_symlink(struct jnl *j, jnl_id parent, const char *name,
		const char *target, const struct jnl_node *attr, jnl_id *out);
int jnl_link(struct jnl *j, jnl_id id, jnl_id parent, const char *name);
int jnl_unlink(struct jnl *j, jnl_id parent, const char *name);
int jnl_rmdir(struct jnl *j, jnl_id parent, const char *name);
/* @flags: RENAME_NOREPLACE, RENAME_EXCHANGE (both names must exist in the
 * journal). Renaming a name onto itself or onto another name of the same
 * node does nothing and returns 0. */
int jnl_rename(struct jnl *j, jnl_id parent, const char *name,
	       jnl_id newparent, const char *newname, unsigned int flags);
/* @set: enum jnl_set bits, values from @attr (mode, uid, gid, size, atime,
 * mtime). SIZE (regular files only: -EISDIR, -EINVAL) truncates the
 * staging file and drops the chunks past the new size. Appends one SETATTR
 * op per call; replay reads the values from the node then. */
enum jnl_set {
	JNL_SET_MODE = 1 << 0,
	JNL_SET_UID = 1 << 1,
	JNL_SET_GID = 1 << 2,
	JNL_SET_SIZE = 1 << 3,
	JNL_SET_ATIME = 1 << 4,
	JNL_SET_MTIME = 1 << 5,
};
int jnl_setattr(struct jnl *j, jnl_id id, unsigned int set,
		const struct jnl_node *attr);
/* The target of a symlink created here, NUL-terminated in @buf; returns
 * its length. Errors: -EINVAL (not a symlink), -ENODATA (an imported
 * symlink: ask the remote), -ERANGE (@size too small), -ENOENT. */
int jnl_readlink(struct jnl *j, jnl_id id, char *buf, size_t size);

/* Enumerate the merged-view entries the journal has for @dir (whiteouts
 * included, with id 0), in byte order of the names: fn returns 0 to go on
 * or -errno to stop (returned). fn runs inside a read transaction: it may
 * read the journal but must not change it. Errors: -ENOENT, -ENOTDIR. */
typedef int (*jnl_dirent_fn)(const char *name, jnl_id id, void *arg);
int jnl_readdir(struct jnl *j, jnl_id dir, jnl_dirent_fn fn, void *arg);

/* --- data ---------------------------------------------------------------- */

/* Write into the staging file and mark the chunks dirty (see Durability);
 * returns @len. Errors: -ENODATA (a chunk of an imported file that this
 * write covers only in part is not held: jnl_chunk_fill() it, for both the
 * first and the last chunk of the range, then write again; nothing was
 * written), -ENOSPC (journal disk or max_bytes; nothing marked. A later
 * slice makes writers wait for the flusher before this), -EISDIR/-EINVAL
 * (not a regular file), -EFBIG, -ENOENT. */
ssize_t jnl_write(struct jnl *j, jnl_id id, const void *buf, size_t len,
		  off_t off);
/* Give the journal the remote's bytes of chunk @index of an imported file
 * (@len <= chunk size, short at the remote's EOF), after jnl_write() said
 * -ENODATA. Stored FLUSHED with their sha256. A no-op returning 0 if the
 * chunk is held already (another thread filled or wrote it first), or if
 * it holds no remote bytes. Errors: -ENOSPC, -EINVAL, -ENOENT. */
int jnl_chunk_fill(struct jnl *j, jnl_id id, uint64_t index, const void *buf,
		   size_t len);
/*
 * Read what the journal has of [off, off+len): @have (may be NULL) gets one
 * entry per chunk the range touches, have[0] for chunk off / chunk size:
 * true if the journal holds it (DIRTY, INFLIGHT or FLUSHED-but-kept), or
 * it has no remote bytes (the node is LOCAL, or the chunk lies past the
 * remote size or a truncation), or it lies past the merged size. fs/ reads
 * the remote for the rest; those bytes of @buf are unspecified. Holes read
 * as zeros. Returns the bytes up to the merged size (0 at or past EOF).
 * Errors: -ENOENT, -EISDIR/-EINVAL.
 */
ssize_t jnl_read(struct jnl *j, jnl_id id, void *buf, size_t len, off_t off,
		 bool *have);
/* fsync through the mount: staging data and LMDB marks durable (for now a
 * whole jnl_sync()). Errors: -ENOENT, as jnl_sync(). */
int jnl_fsync_node(struct jnl *j, jnl_id id);

/* --- the flusher's side ------------------------------------------------ */

struct jnl_chunk_ref {
	jnl_id id;
	uint64_t index;      /* chunk number: offset = index * chunk size */
	uint64_t generation; /* at claim time; generations are journal-wide
				and never repeat */
	uint32_t length;     /* bytes (short at the end of a file) */
};

/* Claim up to @max (at most JNL_CLAIM_MAX) DIRTY chunks (-> INFLIGHT),
 * oldest first (by when they became dirty), of nodes on the remote only.
 * Read the bytes with jnl_read() and write them at jnl_node_rpath().
 * Returns the count (0: none claimable). */
#define JNL_CLAIM_MAX 4096
int jnl_chunk_claim(struct jnl *j, struct jnl_chunk_ref *out, int max);
/* The flusher is done with a claimed chunk: @ok with the SHA-256 of what
 * the remote now has -> FLUSHED if the generation is unchanged, else back
 * to DIRTY. Not @ok -> DIRTY (retried later, keeping its place in the
 * queue). A stale release (the chunk was truncated away, or is no longer
 * INFLIGHT under this claim) changes nothing and returns 0.
 * Errors: -EINVAL (@ok without @sha256). */
int jnl_chunk_release(struct jnl *j, const struct jnl_chunk_ref *c, bool ok,
		      const unsigned char sha256[32]);

enum jnl_op_type {
	JNL_OP_MKDIR = 1,
	JNL_OP_CREATE,
	JNL_OP_SYMLINK,
	JNL_OP_LINK,
	JNL_OP_UNLINK,
	JNL_OP_RMDIR,
	JNL_OP_RENAME,
	JNL_OP_SETATTR,
	JNL_OP_FINISH, /* after the last chunk: truncate, mode, owner, times */
};

/*
 * What each op means (paths from jnl_node_rpath(), valid when handed out):
 *   MKDIR, CREATE, SYMLINK  create @id at rpath(parent)/name (mode, owner,
 *                           times: jnl_node_get(id); target: jnl_readlink)
 *   LINK                    link rpath(id) as rpath(parent)/name
 *   UNLINK, RMDIR           remove rpath(parent)/name (it was @id)
 *   RENAME                  rpath(parent)/name -> rpath(newparent)/newname
 *                           with @flags (RENAME_NOREPLACE/EXCHANGE)
 *   SETATTR                 apply the @flags (enum jnl_set) attributes of
 *                           jnl_node_get(id) at rpath(id)
 *   FINISH                  (not appended yet) truncate, mode, times
 */
struct jnl_op {
	uint64_t seq;
	enum jnl_op_type type;
	jnl_id id;                 /* the node the op is about */
	jnl_id parent, newparent;  /* the dentries involved */
	char name[256], newname[256];
	unsigned int flags;        /* rename flags; setattr enum jnl_set */
};

/* Hand out up to @max ops that may be replayed now (see "Op log"); an op
 * is handed out once until acked or failed. Looks at most at the 16,384
 * oldest pending ops per call. Returns the count. */
int jnl_ops_ready(struct jnl *j, struct jnl_op *out, int max);
/* The op is on the remote: drop it and update rparent/rname (CREATE,
 * MKDIR, SYMLINK: placed at parent/name and no longer LOCAL, its dirty
 * chunks become claimable; RENAME: moved, both sides of an EXCHANGE;
 * UNLINK/RMDIR: nowhere), and drop the whiteout the op made.
 * Errors: -ENOENT (no such op), -EINVAL (not handed out). */
int jnl_op_ack(struct jnl *j, uint64_t seq);
/* The op failed: back to pending (retried), or with @fatal marks its node
 * JNL_NODE_ERROR and drops it. Errors: as jnl_op_ack(). */
int jnl_op_fail(struct jnl *j, uint64_t seq, bool fatal);

/* The remote path of a node now (where the flusher writes its data): ""
 * for the root, "a/b" below. Errors: -ENOENT (not on the remote: create
 * not acknowledged, or removed), -ENAMETOOLONG. */
int jnl_node_rpath(struct jnl *j, jnl_id id, char *buf, size_t size);

/* --- status ------------------------------------------------------------ */

struct jnl_stats {
	uint64_t dirty_bytes, inflight_bytes, flushed_bytes;
	uint64_t dirty_nodes;
	uint64_t pending_ops;
	uint64_t resent_bytes; /* INFLIGHT chunks found at recovery by this
				  jnl_open(), in bytes */
	uint64_t staging_bytes; /* dirty + inflight + flushed */
};
/* Counters as committed, plus the bytes of writes not committed yet in
 * dirty_bytes (which of those rewrite FLUSHED chunks is known only at the
 * commit); jnl_sync() first for exact figures. */
int jnl_stats(struct jnl *j, struct jnl_stats *out);

#endif
