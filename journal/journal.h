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
 * When the last chunk of a node that is not FLUSHED becomes FLUSHED, the
 * same transaction appends its FINISH op (truncate to the final size, mode,
 * owner, the times the application set). When that op (and every other op
 * naming the node) is acknowledged, jnl_node_clean() drops its chunk
 * records and its staging file: the merged view then reads the remote.
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
 * Durability. Staging data is written at once; everything else is grouped.
 * A namespace change (and every other change: acks, releases, cleans) goes
 * into one long LMDB transaction, the batch, that every reader of the
 * journal sees at once; jnl_write() records chunk marks in memory. The
 * group commit makes both durable within JNL_COMMIT_MS; jnl_sync() does
 * it now; jnl_fsync_node() makes one node's data durable (only its
 * staging file is synced) together with every namespace change so far (its
 * create and its parents' creates included): fsync of a file or directory
 * through the mount. No change costs a disk sync of its own. A crash loses
 * the changes of the last JNL_COMMIT_MS or so that nobody synced: whole
 * changes, in order (what survives is a prefix of what was done), as a
 * local filesystem's metadata journal would; a write may be lost while a
 * later namespace change survives. Marks are committed only after the
 * staging bytes they cover are fdatasync()ed, so a crash never leaves a
 * DIRTY chunk over bytes that were lost; staging bytes are given back only
 * once the change that released them is durable. journal.c "BATCHES" and
 * "DURABILITY" have the details.
 *
 * Space. Staging is bounded by jnl_config.max_bytes and by the free space
 * of the journal's disk (less a margin). A write that does not fit waits
 * for the flusher to make room, up to write_wait_ms, and only then fails
 * with -ENOSPC; near a bound the journal gives flushed chunks back to the
 * remote early (backpressure). A disk that reports itself full to the
 * write still fails it at once with -ENOSPC. journal.c "SPACE".
 *
 * Errors: 0 (or a byte count) on success, -errno on failure:
 *   -ENOENT    no such node / dentry / journal (jnl_open without JNL_CREATE)
 *   -EEXIST    dentry exists
 *   -ENODATA   jnl_write: fill the chunk first (jnl_chunk_fill)
 *   -ENOSPC    the journal disk or the LMDB map is full, or a write found
 *              no room under max_bytes or the disk's free space within
 *              write_wait_ms (nothing was changed by the failing call)
 *   -EINVAL    a bad argument (name with '/', "." or "..", flags, types)
 *   -EXDEV     jnl_open: the journal belongs to another remote
 *   -EPROTO    jnl_open: not a ferryfs journal, another format version,
 *              or a corrupted LMDB file
 *   -EBUSY     jnl_open: another process has the journal open
 *   -ENOTEMPTY jnl_open with JNL_CREATE: a directory that is not a journal
 *   -EIO       anything else LMDB reports, a failed read/write/sync of a
 *              staging file, or a failed commit of the batch; the journal
 *              is then FAILED and every later call returns the same error
 *              (sticky); what the last commit did not cover is lost
 * jnl_errmsg() gives a one-line human reason for the last jnl_open failure.
 *
 * Threads: every function may be called from any thread; the journal
 * serialises its use of LMDB itself (readers and writers take turns on the
 * batch, each for microseconds) and never holds its lock across a wait or
 * a remote call (it makes none: journal/ never calls remote/ except in the
 * flusher, flush.c, through its own API, and in jnl_conflict_resolve(),
 * conflict.c, through the caller's connection). The flusher ("the flusher" at the
 * end) is optional: tests and tools drive claim/release and the op log by
 * hand.
 */
#ifndef FERRYFS_JOURNAL_H
#define FERRYFS_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <limits.h>
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
#define JNL_HUNGRY_GAP_MS 10 /* jnl_hungry(): commits at most this often */
#define JNL_WRITE_WAIT_MS 60000

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
	/* bound on staging bytes (journal_max); 0 = the free space of the
	 * journal's disk (less a margin) is the only bound */
	uint64_t max_bytes;
	/* how long a write waits for the flusher to make room under the
	 * bounds before it fails with -ENOSPC; 0 = JNL_WRITE_WAIT_MS */
	unsigned int write_wait_ms;
};

/*
 * Open (and with JNL_CREATE create) the journal in @dir and recover it:
 * INFLIGHT chunks become DIRTY, ops handed out but not acknowledged become
 * pending again. Recovery touches only those records: it does not scan the
 * whole journal, so a journal holding 100,000 pending files opens at once.
 * JNL_CREATE creates @dir if missing and refuses a non-empty directory
 * that holds no journal (-ENOTEMPTY). The stored chunk size wins over
 * cfg->chunk_size. Starts the group-commit thread. Ids a crash may have
 * lost are not handed out again (each open skips 65,536 ids).
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
/* This journal's name, random, fixed at its first open: what it leaves
 * on the remote (a probe) is named by it, so its next run finds it. */
uint64_t jnl_ident(const struct jnl *j);
/* The remote id the journal belongs to (jnl_config.remote_id, checked at
 * open). Owned by j. */
const char *jnl_remote_id(const struct jnl *j);

/*
 * How the journal is bound to its share. The remote id names a share by
 * its address (a path, a URL), which another file system can take: a
 * share that is a mount point not mounted at the time shows the empty
 * directory below. So the mount (fs/) binds the journal to the share
 * itself, the first time, and checks that binding at every mount:
 *   JNL_BIND_NONE    not bound yet (a new journal, or one from a ferryfs
 *                    before binding)
 *   JNL_BIND_MARKER  a marker on the share (.ferryfs/journal-<ident>)
 *   JNL_BIND_ROOT    the share's root could not be written: its identity
 *                    (dev, ino as the remote's stat gives them) is kept
 * jnl_bind_get() never fails on a journal that opened; jnl_bind_set()
 * returns once the binding is durable (-EIO, -ENOSPC).
 */
enum jnl_bind_kind {
	JNL_BIND_NONE = 0,
	JNL_BIND_MARKER = 1,
	JNL_BIND_ROOT = 2,
};

struct jnl_bind {
	uint32_t kind; /* enum jnl_bind_kind */
	uint32_t pad;
	uint64_t dev, ino; /* JNL_BIND_ROOT */
	uint64_t nonce;    /* JNL_BIND_MARKER: random, in the marker too, so
			      that a share the journal left (-o adopt of
			      another) no longer counts */
};

int jnl_bind_get(struct jnl *j, struct jnl_bind *out);
int jnl_bind_set(struct jnl *j, const struct jnl_bind *b);
/* Make every change so far durable (group commit now: fdatasync the
 * staging files with marks, commit the batch, sync LMDB). Errors: -ENOSPC
 * (the marks stay pending and are retried; namespace changes were
 * committed), -EIO. */
int jnl_sync(struct jnl *j);
/* Commit the batch now, as the group commit would: the flusher gets
 * what is pending at once (`ferryfs flush`). Durable as a group commit
 * is; what passed through (jnl_pt_begin()) is synced later. */
int jnl_commit(struct jnl *j);

/* --- nodes and the merged namespace ------------------------------------ */

enum jnl_node_flags {
	JNL_NODE_LOCAL = 1 << 0,      /* created here; not on the remote yet */
	JNL_NODE_DATA = 1 << 1,       /* has chunks not yet FLUSHED */
	JNL_NODE_UNLINKED = 1 << 2,   /* no name left; kept while open (no
					 call drops it yet: a later slice) */
	JNL_NODE_TIMES_SET = 1 << 3,  /* the application set the times */
	JNL_NODE_SIZE_SET = 1 << 4,   /* truncated here: size is authoritative */
	JNL_NODE_ERROR = 1 << 5,      /* the remote refused it; see status */
	JNL_NODE_CONFLICT = 1 << 6,   /* a conflict copy: the local version of
					 a file the share changed meanwhile
					 (jnl_node_conflict()) */
	JNL_NODE_CUT = 1 << 7,        /* shrunk here: the remote's bytes from
					 remote_cut on are not its content;
					 no chunk goes out until a size replay
					 cut them (jnl_node_send_done()) */
};

/*
 * The base of an imported regular file: the remote version its local
 * changes are made against ("Conflicts" below).
 *
 *   NONE --- jnl_node_import(), jnl_node_refresh() (a regular file with
 *            one link) ---------------------------------------------> SET
 *   SET  --- jnl_node_send_begin(): the remote is still the base,
 *            the flusher is about to change it -------------------> SENDING
 *   SENDING --- jnl_node_send_done(): FINISH (or a truncate) applied,
 *               the remote has the node's size and mtime ------------> SET
 *   SET, SENDING --- jnl_node_refresh() (nothing pending) -----------> SET
 *   SET --- jnl_node_conflict(): the remote is not the base ---------> NONE
 *                                (the node is the conflict copy now)
 */
enum jnl_base {
	JNL_BASE_NONE = 0, /* not tracked: created here, a directory, a
			      hard-linked file, an old journal's node */
	JNL_BASE_SET,      /* base_size/base_mtime are what the remote has
			      unless another writer changed it */
	JNL_BASE_SENDING,  /* the flusher is changing the remote: its
			      attributes say nothing until FINISH */
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
	/* what is left to flush of it (jnl_node_get): ops naming it, chunk
	 * records not FLUSHED, and writes not committed yet */
	uint64_t pending_ops, unflushed;
	bool uncommitted;
	/* imported regular files: the base (see enum jnl_base); base_seq
	 * changes with every change of the base */
	enum jnl_base base;
	uint64_t base_size;
	struct timespec base_mtime;
	uint64_t base_seq;
	/* bytes [0, remote_valid) not held by the journal are the remote's */
	uint64_t remote_valid;
	/* JNL_NODE_CUT: the lowest size a shrink gave it since the share's
	 * copy was last cut */
	uint64_t remote_cut;
};

/* Read a node; size and mtime include writes not committed yet.
 * Errors: -ENOENT. */
int jnl_node_get(struct jnl *j, jnl_id id, struct jnl_node *out);

/* Is @st (the remote's attributes now) the base of @nd, the version its
 * pending changes were made against (the same rule the journal applies)? */
bool jnl_node_base_is(const struct jnl_node *nd, const struct stat *st);

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
 * transaction, durable at the next group commit (see Durability); on
 * error nothing changed. No disk sync per call. Attributes of a new node come
 * from @attr (permission bits of mode, uid, gid; atime/mtime, now if zero);
 * jnl_create() takes the file type from attr->mode (0 = regular; not a
 * directory or symlink). The journal sees only its own dentries: the
 * caller has checked the remote side first (that a new name is free there,
 * that a directory is empty there) and has imported what it names (a
 * rename's or link's source, an EXCHANGE target, a parent).
 * Removing a name leaves a whiteout (also under a LOCAL parent: the node's
 * pending ops put the name on the remote for a while) unless the removal
 * cancelled the node's create.
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

/* -EEXIST if @dir holds (not a whiteout) another name than @name that
 * differs from it only in letter case (jnl_fold_key(): Unicode's simple
 * upper-case mapping, as Samba compares), of a node other than
 * @except: for a share that does not tell them apart (an index, no walk
 * of the directory). 0 if not; -EINVAL, -ENAMETOOLONG for a bad name. */
int jnl_name_case_taken(struct jnl *j, jnl_id dir, const char *name,
			jnl_id except);

/* Enumerate the merged-view entries the journal has for @dir (whiteouts
 * included, with id 0), in byte order of the names: fn returns 0 to go on
 * or -errno to stop (returned). Read in batches of entries; fn runs with
 * no journal lock held and may call the journal (a change made meanwhile
 * may or may not be seen, as with readdir(3)). Errors: -ENOENT, -ENOTDIR. */
typedef int (*jnl_dirent_fn)(const char *name, jnl_id id, void *arg);
int jnl_readdir(struct jnl *j, jnl_id dir, jnl_dirent_fn fn, void *arg);

/* --- data ---------------------------------------------------------------- */

/* Write into the staging file and mark the chunks dirty (see Durability);
 * returns @len. When the bytes it adds do not fit under the bounds (see
 * Space), it waits for the flusher to make room, up to write_wait_ms,
 * holding no lock. Errors: -ENODATA (a chunk of an imported file, or of a
 * file whose flushed chunks the journal gave back to the remote, that
 * this write covers only in part is not held: jnl_chunk_fill() it, for
 * both the first and the last chunk of the range, then write again;
 * nothing was written), -ENOSPC (no room after the wait, more than
 * max_bytes in one write, or the disk itself full: at once; nothing
 * marked), -EISDIR/-EINVAL (not a regular file), -EFBIG, -ENOENT. */
ssize_t jnl_write(struct jnl *j, jnl_id id, const void *buf, size_t len,
		  off_t off);
/* Give the journal the remote's bytes of chunk @index of an imported file
 * (@len <= chunk size, short at the remote's EOF), after jnl_write() said
 * -ENODATA. Stored FLUSHED with their sha256. A no-op returning 0 if the
 * chunk is held already (another thread filled or wrote it first), or if
 * it holds no remote bytes. Waits for room as jnl_write() does.
 * Errors: -ENOSPC, -EINVAL, -ENOENT. */
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
/* fsync through the mount, of a file or a directory: @id's staging data
 * (only its staging file is fdatasync()ed; other nodes' marks stay for
 * the group commit) and every namespace change so far (the batch is
 * committed: @id's create, its parents' creates, and everything before)
 * durable. Errors: -ENOENT, as jnl_sync(). */
int jnl_fsync_node(struct jnl *j, jnl_id id);

/*
 * Passthrough (fs/pt.c): the kernel writes a file's bytes straight into
 * its staging file, and the journal sees none of those writes until they
 * are marked.
 *   jnl_pt_begin(): pins @id (until as many jnl_pt_end()s): the staging
 *     file stays whatever the flusher does (no chunk of it is given
 *     back). *fd: a new
 *     descriptor of it (created if missing), the caller's to close.
 *     For a file with no remote bytes under its size (created here, or
 *     truncated to 0): its staging file is then the whole file.
 *     Errors: -EBUSY (JNL_PT_PINS pinned), as jnl_write().
 *   jnl_pt_mark(): marks the staging file's bytes [0, its size) DIRTY,
 *     as a jnl_write() of them would, with its mtime; their room is taken
 *     over the bounds (the bytes are on the disk already). A chunk the
 *     remote has (FLUSHED) with the SHA-256 of its bytes in the staging
 *     file is left as it is, so only what the kernel changed is sent
 *     again (this reads and hashes those chunks); so is a DIRTY one of
 *     its whole length, and an INFLIGHT one is looked at that way once
 *     its stream is done with it (a second at most). Meanwhile the
 *     committer marks the whole chunks the file grew by every commit
 *     period (jnl_pt_grow(), journal_i.h); while pinned a node
 *     keeps its chunk records for that (jnl_node_clean() waits for the
 *     pin to end). jnl_pt_mark_all(): the same for every pinned node
 *     (ferryfs flush).
 *   jnl_pt_attr(): a pinned node's size and mtime (what the kernel
 *     wrote) into @nd, from its staging file; nothing for another node.
 *     For what the mount shows: the flusher's jnl_node_get() keeps what
 *     is marked.
 *   jnl_pt_epoch(): how many pins have ended. A node read while pinned
 *     has the size of its last mark; jnl_pt_attr() after the pin ended
 *     cannot mend that: read the node again if the epoch moved between.
 *   jnl_pt_times(): sets the staging file's mtime (a SETATTR of a pinned
 *     node's mtime; jnl_setattr() does it).
 */
int jnl_pt_begin(struct jnl *j, jnl_id id, int *fd);
void jnl_pt_end(struct jnl *j, jnl_id id);
uint64_t jnl_pt_epoch(struct jnl *j);
int jnl_pt_mark(struct jnl *j, jnl_id id);
int jnl_pt_mark_all(struct jnl *j);
void jnl_pt_attr(struct jnl *j, jnl_id id, struct jnl_node *nd);
void jnl_pt_times(struct jnl *j, jnl_id id, const struct timespec *mtime);

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
 * A claim is durable when it returns (it commits the batch, with the
 * releases before it): recovery resends exactly the chunks of the last
 * claims. Returns the count (0: none claimable). */
#define JNL_CLAIM_MAX 4096
int jnl_chunk_claim(struct jnl *j, struct jnl_chunk_ref *out, int max);
/* The same, stopping before the chunk that would take the claimed lengths
 * past @max_bytes (the first chunk is always claimed): the flusher claims
 * one chunk size of bytes at a time, and one more chunk while it writes
 * its last, so a crash resends at most two chunk sizes per stream. */
int jnl_chunk_claim_upto(struct jnl *j, struct jnl_chunk_ref *out, int max,
			 uint64_t max_bytes);
/* The flusher is done with a claimed chunk: @ok with the SHA-256 of what
 * the remote now has, or all zeros for none (jnl_chunk_digest_used()) ->
 * FLUSHED if the generation is unchanged, else back to DIRTY. Not @ok ->
 * DIRTY (retried later, keeping its place in the queue). A stale release
 * (the chunk was truncated away, or is no longer INFLIGHT under this
 * claim) changes nothing and returns 0. When this was the node's last
 * chunk not FLUSHED (and the node still has a name), the
 * node's FINISH op is appended in the same transaction. Durable with the
 * next claim or group commit (a release lost in a crash resends its
 * chunk). Under staging pressure (see Space) the node's full FLUSHED
 * chunks are given back to the remote in the same transaction: the merged
 * view reads them there, and a partial write asks for a fill.
 * Errors: -EINVAL (@ok without @sha256). */
int jnl_chunk_release(struct jnl *j, const struct jnl_chunk_ref *c, bool ok,
		      const unsigned char sha256[32]);

/*
 * Is the SHA-256 of a chunk of @id that goes FLUSHED now ever looked at?
 * Only by passthrough's compare (jnl_pt_mark()): while @id is pinned, and
 * until its marker is gone (a daemon killed meanwhile marks the file
 * again at the next open, and compares). Elsewhere the flusher records
 * none (all zeros), and a compare takes such a chunk as changed: it is
 * sent again, nothing is lost. The digest cost ~0.65 CPU-seconds per GiB
 * (SHA-NI; more without), most of what the flush added to a plain push.
 */
bool jnl_chunk_digest_used(struct jnl *j, jnl_id id);
static inline bool jnl_digest_known(const unsigned char sha256[32])
{
	for (int i = 0; i < 32; i++)
		if (sha256[i])
			return true;
	return false;
}

/* Is claim @c still the chunk's (INFLIGHT, claimed at c->generation, of
 * c->length)? 0, or -ENOENT when it went stale (a conflict conversion or
 * a truncate took the chunk back or shortened it, recovery reclaimed
 * it): what was read for it may be
 * another version's bytes, or none (the staging of a chunk flushed since
 * is given back), so nothing of it may be written. A flusher calls it
 * after reading the chunk, before writing it. */
int jnl_chunk_claimed(struct jnl *j, const struct jnl_chunk_ref *c);

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
 *   FINISH                  the data of @id is all on the remote: truncate
 *                           to its size, apply mode, owner, atime, mtime
 *                           of jnl_node_get(id) at rpath(id) (appended by
 *                           jnl_chunk_release(); its ack changes nothing)
 */
struct jnl_op {
	uint64_t seq;
	enum jnl_op_type type;
	jnl_id id;                 /* the node the op is about */
	jnl_id parent, newparent;  /* the dentries involved */
	char name[256], newname[256];
	unsigned int flags;        /* rename flags; setattr enum jnl_set */
	uint64_t xino;             /* RENAME_EXCHANGE: the remote inode at
				      rpath(parent)/name before it was sent
				      (jnl_op_exchange_mark()), 0 if never */
};

/* Hand out up to @max ops that may be replayed now (see "Op log"); an op
 * is handed out once until acked or failed. Only durable ops are handed
 * out (committed by a group commit or a sync: the remote is never ahead
 * of what a crash leaves of the journal); the flusher's wake-up comes
 * with the commit. Looks at most at the 16,384 oldest pending ops per
 * call. Returns the count. */
int jnl_ops_ready(struct jnl *j, struct jnl_op *out, int max);
/* The op is on the remote: drop it and update rparent/rname (CREATE,
 * MKDIR, SYMLINK: placed at parent/name and no longer LOCAL, its dirty
 * chunks become claimable; RENAME: moved, both sides of an EXCHANGE;
 * LINK: at the new name; UNLINK/RMDIR of the remote name: nowhere), and
 * drop the whiteout the op made.
 * Errors: -ENOENT (no such op), -EINVAL (not handed out). */
int jnl_op_ack(struct jnl *j, uint64_t seq);
/* The RENAME_EXCHANGE op @seq (handed out) is about to be sent, and the
 * remote has inode @ino at its source: durable in the op before the
 * remote sees it, so that its replay after a crash can tell the exchange
 * done (the source has another inode, the target has @ino) from not done,
 * and does not swap the two back. Errors: -ENOENT, -EINVAL (not handed
 * out, not an exchange, @ino 0). */
int jnl_op_exchange_mark(struct jnl *j, uint64_t seq, uint64_t ino);
/* The op failed: back to pending (retried), or with @fatal marks its node
 * JNL_NODE_ERROR and drops it. Errors: as jnl_op_ack(). */
int jnl_op_fail(struct jnl *j, uint64_t seq, bool fatal);

/* The remote path of a node now (where the flusher writes its data): ""
 * for the root, "a/b" below. Errors: -ENOENT (not on the remote: create
 * not acknowledged, or removed), -ENAMETOOLONG. */
int jnl_node_rpath(struct jnl *j, jnl_id id, char *buf, size_t size);

/*
 * Remote paths in use. A remote path is right only between two moves of
 * names on the remote: the flusher's replay of an UNLINK, RMDIR or RENAME
 * changes the remote first and the journal (the op's ack) after, and in
 * between jnl_node_rpath() names the old place (ENOENT there, or another
 * object that took the name). So a caller that resolves a path and then
 * uses it on the remote (a stat, a listing, an open) holds the names
 * across both: jnl_names_hold() ... jnl_names_release(); the flusher
 * brackets each such replay, its remote calls and its ack, with
 * jnl_names_move_begin() ... jnl_names_move_end(). Holders share, movers
 * share, the two sides exclude each other and take turns (neither starves
 * the other). Never hold twice in one thread (a waiting mover would keep
 * the second hold waiting for the first), and never wait for the flusher
 * while holding.
 */
void jnl_names_hold(struct jnl *j);
void jnl_names_release(struct jnl *j);
void jnl_names_move_begin(struct jnl *j);
void jnl_names_move_end(struct jnl *j);

/*
 * The remote has all of regular file @id: drop its chunk records (all
 * FLUSHED) and its staging file; the merged view reads the remote for it
 * from now on (its remote-valid size becomes its size, so a later partial
 * write of a chunk asks for jnl_chunk_fill() like an imported file). Does
 * it only when the node is on the remote (not LOCAL, not UNLINKED), has no
 * chunk that is not FLUSHED, no write not committed yet and no pending op
 * (so its FINISH was acknowledged); the flusher calls it after acking an
 * op of the node. An UNLINKED node is cleaned otherwise (below). The
 * records go in one transaction, the staging file after it: a crash in
 * between leaves a staging file no record points at, which is harmless
 * (no chunk of it is "held"; a later write that covers a chunk in part
 * fills it first); the file is removed once the records' removal is
 * durable. Returns 0 also when there is nothing to clean
 * (not a regular file, no chunk records). Errors: -EBUSY (not yet: one of
 * the conditions above), -ENOENT, -ENOSPC, -EIO.
 * Threads: takes the locks a truncate takes; briefly blocks writers of the
 * journal (not only of this node) while it commits.
 */
int jnl_node_clean(struct jnl *j, jnl_id id);

/*
 * An unlinked regular file (no name left here) needs none of its data on
 * the remote: jnl_node_clean() drops its chunk records, whatever their
 * state (an INFLIGHT one after its stream released it), and its staging
 * file, once no handle of it is open. The caller counts its handles:
 * jnl_node_open() when one opens (-ENOMEM), jnl_node_close() when it
 * closes. The unlink, the last close and the release of a stream's chunk
 * have the committer clean the node; the sweep after an open cleans those
 * a kill left.
 */
int jnl_node_open(struct jnl *j, jnl_id id);
void jnl_node_close(struct jnl *j, jnl_id id);

/*
 * Another writer changed the remote object of a node that has nothing
 * pending (not LOCAL, not UNLINKED, no op, no chunk record, no write not
 * committed): take the remote's attributes @st (mode, owner, size, times,
 * nlink) as the node's; a regular file's content is then all the remote's.
 * The base of a regular file with one link becomes @st (SET).
 * Errors: -EBUSY (something is pending: the journal's version stands; a
 * conflict if @st is not the base: jnl_conflict_resolve()), -ESTALE
 * (another object: another file type, or an imported node whose remote
 * identity differs), -ENOENT, -EIO.
 */
int jnl_node_refresh(struct jnl *j, jnl_id id, const struct stat *st);

/* --- conflicts ----------------------------------------------------------- */

/*
 * Conflicts. Another writer changed an imported file on the share while
 * the journal holds local changes to it. Policy: neither version is lost.
 * The share's version keeps the name (it becomes a fresh import of the
 * share's object); the local version becomes a node created here named
 * NAME.conflict-YYYYmmdd-HHMMSS (UTC; -2, -3... if taken) in the same
 * directory, flushed to the share under that name like any new file. Its
 * content: the chunks the journal holds over, for the rest, the share's
 * bytes at the time of the conflict. A file rewritten whole here (opened
 * O_TRUNC or truncated to 0: cp, editors, rsync) is held whole in the
 * journal, so its copy is exactly the local version; for a file changed in
 * place, the ranges not written here come from the share's new version
 * (the base's bytes are gone from the share).
 *
 * Only changes of the content count (a write, a truncate): attribute
 * changes alone (chmod, chown, utimens) are applied to the share's
 * version. Detection compares the share's size and mtime (to the ns) and
 * identity with the base: in the mount when a file with pending changes is looked
 * up, stat'ed or opened, and in the flusher before it first changes the
 * file on the share (one stat per file and flush, jnl_node_send_begin()).
 * Once the flusher began sending a file (SENDING) its remote attributes
 * are its own until FINISH: a change by another writer in that window is
 * not detected (the last writer wins). Not checked at all: files created
 * through the mount, hard-linked files, a file with a rename or link
 * pending here (detected, logged, the local version wins).
 */

/*
 * The flusher is about to change node @id's data, size or mtime on the
 * remote: a chunk of claim @c, or (@c NULL) a SETATTR or FINISH op.
 * @st: rmt_stat() of its remote path, taken after jnl_node_get() said
 * base JNL_BASE_SET with base_seq @seq; NULL forces SENDING without a
 * comparison (a conflict that cannot be converted: the local version
 * wins). On 0 the node is SENDING (or not tracked), durable before the
 * call returns. Errors: -EAGAIN (the base changed meanwhile: look again),
 * -ENOENT (the claim @c is stale or the node gone: do not write it),
 * -EXDEV (@st is not the base: a conflict; jnl_conflict_resolve()), -EIO.
 */
int jnl_node_send_begin(struct jnl *j, jnl_id id, uint64_t seq,
			const struct jnl_chunk_ref *c, const struct stat *st);
/* FINISH of @id, or a SETATTR with a size (both set the mtime), is
 * applied on the remote while no stream writes its chunks: the base is
 * SET to @size and @mtime (nothing for a node that is not tracked). With
 * @rcut, the replay cut the remote file there first (the node's
 * remote_cut, read with JNL_NODE_CUT set): unless a shrink lowered
 * remote_cut meanwhile, JNL_NODE_CUT is cleared and the node's chunks
 * are claimable again (journal.c invariant 19). One change for both.
 * Errors: -ENOENT, -EIO. */
int jnl_node_send_done(struct jnl *j, jnl_id id, uint64_t size,
		       const struct timespec *mtime, const uint64_t *rcut);

/*
 * The conversion of a conflict, in one transaction: node @id (base SET
 * with base_seq @seq, @st not its base) becomes a node created here named
 * @cname in its directory (JNL_NODE_LOCAL | JNL_NODE_CONFLICT, a CREATE op
 * appended; every chunk it holds DIRTY again, its SETATTR and FINISH ops
 * dropped), and its old name becomes a fresh import of the remote object
 * @st: *share_id. @cpath is recorded for status (jnl_conflict_paths()).
 * Every chunk of @id below remote_valid must be held (filled: see
 * jnl_conflict_resolve()). @allow_seq: an op of the node handed out to
 * the caller (the flusher), dropped with the others; 0 if none.
 * Errors: -EAGAIN (a chunk below remote_valid is not held, or the base
 * changed: look again), -ESTALE (not a conflict any more: the base is not
 * SET, or @st is the base), -EEXIST (@cname is taken here), -EBUSY (the
 * node cannot be converted: links, a rename or link pending),
 * -EINPROGRESS (another stream has one of its ops handed out: later),
 * -ENODATA (only attribute changes are pending: not a conflict, they are
 * applied to the share's version), -EINVAL, -ENAMETOOLONG, -ENOSPC, -EIO.
 * On error nothing changed.
 */
int jnl_node_conflict(struct jnl *j, jnl_id id, uint64_t seq,
		      const struct stat *st, const char *cname,
		      const char *cpath, uint64_t allow_seq, jnl_id *share_id);

/*
 * Resolve a conflict found on node @id (conflict.c): fill the chunks below
 * remote_valid the journal does not hold from the share (its current
 * bytes), choose the conflict name (free in the journal and on the share:
 * rmt_stat() says -ENOENT), jnl_node_conflict(), and log one warning with
 * both names. @r: a connection to the share (the caller's; used by this
 * thread only). @seq, @st, @allow_seq: as jnl_node_conflict(). On success
 * *share_id (may be NULL) is the node of the share's version.
 * A conflict that cannot be converted (-EBUSY, -ENAMETOOLONG, -EEXIST:
 * no free name, -EINVAL) is logged and its node made SENDING
 * (jnl_node_send_begin() without @st): it is not found again, and the
 * local version goes on to the share (the last writer wins). So is a node
 * with only attribute changes pending (-ENODATA, not logged): they are
 * applied to the share's version.
 * Errors: as jnl_node_conflict(), the remote's, -ENOSPC.
 */
struct rmt;
int jnl_conflict_resolve(struct jnl *j, struct rmt *r, jnl_id id,
			 uint64_t seq, const struct stat *st,
			 uint64_t allow_seq, jnl_id *share_id);

#define JNL_CONFLICTS_KEPT 64
/* The remote paths of the most recent conflict copies (at most @max, at
 * most JNL_CONFLICTS_KEPT), newest first, into @paths (PATH_MAX bytes
 * each); *total (may be NULL) gets the count of conflicts ever recorded in
 * this journal. Returns the count of paths. */
int jnl_conflict_paths(struct jnl *j, char (*paths)[PATH_MAX], int max,
		       uint64_t *total);

/* --- status ------------------------------------------------------------ */

struct jnl_stats {
	uint64_t dirty_bytes, inflight_bytes, flushed_bytes;
	uint64_t dirty_nodes;
	uint64_t pending_ops;
	uint64_t resent_bytes; /* INFLIGHT chunks found at recovery by this
				  jnl_open(), in bytes */
	uint64_t staging_bytes; /* dirty + inflight + flushed */
	uint64_t queued_chunks;   /* DIRTY chunks the flusher may claim now
				     (of nodes on the remote, with a name) */
	uint64_t inflight_chunks; /* INFLIGHT chunks */
	uint64_t uncommitted;     /* chunk marks of writes not committed yet
				     (0: every write so far is counted above) */
	uint64_t write_waits;     /* writes (and fills) that had to wait for
				     room (see Space), since jnl_open() */
	uint64_t writers_waiting; /* writes waiting for room now */
	uint64_t conflicts;       /* conflicts recorded (jnl_node_conflict())
				     in this journal, ever */
};
/* Counters as committed, plus the bytes of writes not committed yet in
 * dirty_bytes (which of those rewrite FLUSHED chunks is known only at the
 * commit); jnl_sync() first for exact figures. */
int jnl_stats(struct jnl *j, struct jnl_stats *out);

/* --- the flusher (flush.c) ------------------------------------------------ */

/*
 * The flusher drains a journal into its remote with N stream threads, each
 * with its own connection (rmt_open(remote_spec, remote_opts)): many files
 * go at once, and one big file is split across the streams.
 *
 * A stream replays ready ops first (jnl_ops_ready(): the journal orders
 * dependent ops; independent ones go to different streams at once), then
 * claims DIRTY chunks, at most one chunk size of bytes at a time
 * (jnl_chunk_claim_upto()), and one more chunk while it writes its last
 * (flush.c's helper), so a crash resends at most 2 x streams x chunk size
 * (jnl_stats.resent_bytes). A chunk: jnl_read() from staging, one
 * rmt_file_pwrite() of all of it at jnl_node_rpath() (files stay open per
 * stream, keyed by node, until idle or FINISH), fdatasync unless
 * JNL_FLUSH_NO_FSYNC, read back and compared if JNL_FLUSH_VERIFY, then
 * jnl_chunk_release() with the SHA-256 of what was sent.
 *
 * Op replay is idempotent, since a crash may replay an op the remote has:
 *   MKDIR    EEXIST with a directory there is done; then mode (and owner
 *            when running as root)
 *   CREATE   open O_CREAT|O_TRUNC (no O_EXCL), then mode, owner, times
 *            (none of them if the node has data not flushed: its FINISH
 *            sets them; but the share's owner, with ferry-agent).
 *            Truncating is safe: chunks of a node are claimed only after
 *            its create is acknowledged, so a replayed create (never
 *            acknowledged) had no data sent yet; it also clears what an
 *            earlier attempt or a stale file left there. Fifos and sockets:
 *            mknod, EEXIST with the same type is done
 *   SYMLINK  EEXIST with the same target is done; then times (and owner)
 *   LINK     EEXIST naming the same remote inode is done
 *   UNLINK, RMDIR  ENOENT is done
 *   RENAME   ENOENT of the source while the target exists is done (the
 *            rename happened before the crash); EEXIST of NOREPLACE while
 *            the source is gone, the same. An EXCHANGE cannot be told done
 *            from not done: replayed after a crash between the remote
 *            rename and its acknowledgement, it swaps back (not handled)
 *   SETATTR  the op's attributes from jnl_node_get(); a size change of a
 *            regular file also sets mode, owner and times (no FINISH may
 *            follow: a truncate that drops every chunk not flushed);
 *            nothing without a size change if the node has data not
 *            flushed: the FINISH after its last chunk sets them
 *   FINISH   size, mode, owner (when root), atime, mtime of the node: the
 *            remote mtime is what the application saw, not the flush time;
 *            nothing if the node has data not flushed by then (written
 *            again: that data's FINISH follows, and a size set first
 *            would put its holes below the remote's end, written as zeros)
 * SETATTR with a size and FINISH wait until no stream is writing a chunk
 * of the node, keep streams from starting one until they are applied, and
 * take the size after that wait (so a file still being written, whose
 * FINISH came when the streams caught up, keeps every chunk flushed).
 * Chunk paths are taken with a rename/unlink epoch, so a chunk never
 * lands at a name an op is moving or removing meanwhile.
 *
 * Errors. A transient remote failure (EIO, ETIMEDOUT, ENOSPC, ECONNRESET,
 * anything not listed below) puts the chunk back (DIRTY) or the op back
 * (jnl_op_fail(retry)), counts an error and a retry, and makes the stream
 * back off: 50 ms doubling to backoff_max_ms, state BACKOFF, until a call
 * succeeds again. A permanent one (EACCES, EPERM, EROFS, ENOTDIR, EISDIR,
 * EINVAL, ENOENT, EEXIST, ENOTEMPTY, ELOOP, ENAMETOOLONG, EXDEV, EFBIG,
 * EMLINK, EOPNOTSUPP) drops an op (jnl_op_fail(fatal): its node is
 * JNL_NODE_ERROR) and is logged once with the path; a chunk that fails so
 * is kept claimed (INFLIGHT, "parked") and retried every 30 s, so it does
 * not stop the queue behind it. The journal FAILED (-EIO) stops every
 * stream (state STOPPED); jnl_flusher_wait() returns that error.
 *
 * Wake-ups: streams sleep until the journal commits work for them (a hook
 * in the journal's commit), jnl_flusher_kick(), or 1 s (a fallback).
 *
 * Threads: every function may be called from any thread, except that
 * jnl_flusher_stop() must not run at the same time as another call on the
 * same flusher (it frees it). One flusher per journal at a time. Stop the
 * flusher before jnl_close().
 */
struct jnl_flusher;

#define JNL_FLUSH_STREAMS_MAX 64
#define JNL_FLUSH_STREAMS_DEFAULT 4

enum jnl_flush_flags {
	JNL_FLUSH_NO_FSYNC = 1 << 0, /* no fdatasync after each chunk (a
					share that reports errors at close
					gets rmt_file_flush() instead) */
	JNL_FLUSH_VERIFY = 1 << 1,   /* read each chunk back and compare its
					SHA-256 with what was sent */
};

struct jnl_flush_config {
	const char *remote_spec; /* rmt_open() spec; its rmt_id() must be
				    jnl_remote_id() */
	const char *remote_opts; /* rmt_open() options, may be NULL; each
				    stream's connection gets them (a
				    remote_rate= there caps all streams
				    together, remote_stream_rate= each) */
	unsigned int streams;    /* 0 = JNL_FLUSH_STREAMS_DEFAULT */
	uint64_t bwlimit;        /* chunk bytes/s of all streams together,
				    0 = no limit (the flusher's own token
				    bucket: works with every driver) */
	unsigned int flags;      /* enum jnl_flush_flags */
	unsigned int backoff_max_ms; /* 0 = 10,000 */
	/* ferry-agent next to the share, or NULL: its rmt_open() spec
	 * ("agent://HOST:PORT") and options ("agent_key=FILE,..."). Each
	 * stream flushes through it while it answers, else through the
	 * share (and tries the agent again every few seconds). */
	const char *agent_spec;
	const char *agent_opts;
};

enum jnl_stream_state {
	JNL_STREAM_IDLE = 0, /* nothing to do */
	JNL_STREAM_FLUSHING, /* replaying an op or sending chunks */
	JNL_STREAM_BACKOFF,  /* waiting after a remote error */
	JNL_STREAM_PAUSED,   /* jnl_flusher_pause() */
	JNL_STREAM_STOPPED,  /* exited: the journal FAILED */
};

struct jnl_stream_stats {
	enum jnl_stream_state state;
	uint64_t bytes;    /* chunk bytes sent and released */
	uint64_t chunks;   /* chunks sent and released */
	uint64_t ops;      /* ops replayed and acknowledged */
	uint64_t errors;   /* failed calls (remote, or a verify mismatch) */
	uint64_t retries;  /* chunks put back DIRTY, ops put back pending */
	uint64_t rate_bps; /* chunk bytes/s over the last 2 s */
	int last_error;    /* -errno of the last failure, 0 if none */
	bool via_agent;    /* flushing through the agent now, not the share */
	/* rmt_counters() of this stream's connection */
	uint64_t remote_bytes_written, remote_bytes_read, remote_ops,
		remote_faults;
};

struct jnl_flush_stats {
	unsigned int streams;
	bool paused;
	int failed;            /* the journal's sticky error, or 0 */
	uint64_t failed_ops;   /* ops dropped as permanent failures */
	uint64_t parked;       /* chunks held back by a permanent failure */
	/* sums over the streams */
	uint64_t bytes, chunks, ops, errors, retries, rate_bps;
	uint64_t remote_bytes_written;
	struct jnl_stream_stats stream[JNL_FLUSH_STREAMS_MAX];
};

/*
 * Open cfg->streams connections and start the streams (running, not
 * paused). Caller owns *out; stop with jnl_flusher_stop().
 * Errors: -EINVAL (no spec, streams > JNL_FLUSH_STREAMS_MAX), -EXDEV (the
 * share is not the journal's), -EBUSY (the journal has a flusher), the
 * errors of rmt_open(), -ENOMEM, -EAGAIN (no thread); on error nothing is
 * left running and *out is NULL.
 */
int jnl_flusher_start(struct jnl *j, const struct jnl_flush_config *cfg,
		      struct jnl_flusher **out);
/* Stop every stream after the chunk or op it is on, put back what the
 * streams hold (claimed chunks -> DIRTY, handed-out ops -> pending), close
 * the connections and free @f. Nothing is marked FLUSHED that is not on
 * the remote, nothing is lost. NULL is a no-op. */
void jnl_flusher_stop(struct jnl_flusher *f);
/* Streams finish the chunk or op they are on, put their claimed chunks
 * back (DIRTY: jnl_stats.inflight_chunks drops to 0) and wait, state
 * PAUSED; ops already handed out stay queued. Resume makes them go on. */
void jnl_flusher_pause(struct jnl_flusher *f);
void jnl_flusher_resume(struct jnl_flusher *f);
/* Work is there, or the remote is back: wake every stream now, cutting
 * short a backoff and retrying parked chunks. */
void jnl_flusher_kick(struct jnl_flusher *f);
/*
 * Wait until nothing is pending: no claimable DIRTY chunk, no INFLIGHT
 * chunk, no op, no uncommitted write (jnl_stats). DIRTY chunks of nodes
 * that cannot be flushed (no name left, or their create failed for good:
 * JNL_NODE_ERROR) do not count: see failed_ops in jnl_flusher_stats().
 * @timeout_ms < 0 waits for ever. Returns 0, -ETIMEDOUT, or the journal's
 * sticky error.
 */
int jnl_flusher_wait(struct jnl_flusher *f, int timeout_ms);
/* A snapshot of the counters (each field consistent, not all at one
 * instant). Returns 0. */
int jnl_flusher_stats(struct jnl_flusher *f, struct jnl_flush_stats *out);

#endif
