/*
 * journal_i.h - inside journal/: record layouts, the in-memory state of an
 * open journal and the helpers its files share. Nothing outside journal/
 * includes this file, except tests/unit/test_journal.c (jnl_assert_sane()
 * and the test hooks at the end).
 *
 * Files of the module:
 *   journal.c  design comment (invariants, chunk states, batches, space),
 *              open/close, meta, error mapping, the batch and the undo log of
 *              its changes, group commit, sync, stats
 *   node.c     node records, dentries, the merged namespace operations
 *   data.c     staging files, the pending table, write/read/fill and the
 *              room they wait for, claim and release of chunks, giving
 *              staging back (drop, clean, jnl_gc_run())
 *   ops.c      the op log: append, ready (dependency order), ack, fail,
 *              remote paths
 *   check.c    jnl_assert_sane(): every invariant of journal.c by full scan
 *   flush.c    the flusher: stream threads that replay ops and send chunks
 *              through remote/
 *   conflict.c jnl_conflict_resolve(): fills a conflicted node from the
 *              share, names its copy, converts it (node.c); with flush.c
 *              the only files of journal/ that call remote/
 *
 * Records are host-endian binary structs with a version field: a journal
 * lives on local disk and is read by the machine that wrote it. Keys are
 * big-endian so that LMDB's byte order is numeric order.
 */
#ifndef FERRYFS_JOURNAL_I_H
#define FERRYFS_JOURNAL_I_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "journal.h"

/* --- on-disk records ------------------------------------------------------ */

#define JNL_MAGIC 0x4a595246u /* "FRYJ" read as a little-endian u32 */

/* meta: "meta" -> struct jnl_meta_rec, "remote_id" -> bytes (no NUL),
 * "ident" -> 8 random bytes (jnl_ident(); made at the first open that
 * misses them) */
struct jnl_meta_rec {
	uint32_t magic;      /* JNL_MAGIC; byte-swapped = another machine */
	uint32_t format;     /* JNL_FORMAT_VERSION */
	uint32_t chunk_size; /* fixed at creation */
	uint32_t rec_size;   /* sizeof(struct jnl_meta_rec) when written */
	uint64_t next_id;    /* next node id; ids are never reused */
	uint64_t next_seq;   /* next op sequence number */
	uint64_t next_gen;   /* next chunk generation (journal-wide) */
	uint64_t next_dseq;  /* next dirty-queue position */
	/* sums over the chunk records, kept in the same transactions */
	uint64_t dirty_bytes, inflight_bytes, flushed_bytes;
	uint64_t dirty_nodes; /* nodes with JNL_NODE_DATA */
	uint64_t pending_ops; /* records in ops */
};

#define JNL_NODE_REC_VERSION 3
/* nodes: id (be64) -> struct jnl_node_rec, then rname, then the symlink
 * target (rname_len and target_len bytes, no NULs). Version 1 records
 * (JNL_NODE_REC_V1_SIZE bytes, no base fields) are read with no base
 * (JNL_BASE_NONE), version 2 ones (JNL_NODE_REC_V2_SIZE, no rcut) with
 * no cut; every write writes version 3. */
struct jnl_node_rec {
	uint16_t version;    /* JNL_NODE_REC_VERSION */
	uint16_t rname_len;  /* name on the remote, in rparent (LOCAL: the
				name its create will give it) */
	uint16_t target_len; /* symlink created here: its target */
	uint16_t pad0;
	uint32_t flags;      /* enum jnl_node_flags */
	uint32_t mode, uid, gid;
	uint32_t atime_nsec, mtime_nsec, ctime_nsec;
	int64_t atime_sec, mtime_sec, ctime_sec;
	uint64_t size;       /* merged size as of the last commit */
	uint64_t nlink;
	uint64_t base_dev, base_ino; /* imported: the remote identity */
	uint64_t rparent;    /* remote parent (0: not on the remote) */
	uint64_t mparent;    /* merged-view parent (for directories: the
				only one; for files: the last one linked) */
	uint64_t rvalid;     /* bytes [0, rvalid) of the remote copy still
				belong to the merged content: the imported
				size, lowered by every truncation; 0 if LOCAL */
	uint64_t unflushed;  /* chunk records not FLUSHED */
	uint64_t nops;       /* ops that name this node (jnl_op_nodes) */
	uint64_t create_seq; /* LOCAL: seq of its pending create op */
	/* version 2: the remote version the local changes are made against
	 * (journal.c "CONFLICTS"; imported regular files only) */
	uint32_t bstate;     /* enum jnl_base */
	uint32_t bmtime_nsec;
	int64_t bmtime_sec;
	uint64_t bsize;
	uint64_t bseq;       /* bumped at every change of the base fields */
	/* version 3: JNL_NODE_CUT set, the remote's bytes from rcut on are
	 * not the merged content's (journal.c invariant 19) */
	uint64_t rcut;
};

#define JNL_NODE_REC_V1_SIZE offsetof(struct jnl_node_rec, bstate)
#define JNL_NODE_REC_V2_SIZE offsetof(struct jnl_node_rec, rcut)

/* A node record decoded with its variable tail. */
struct jnl_nrec {
	struct jnl_node_rec r;
	char rname[NAME_MAX + 1];
	char target[PATH_MAX];
};

enum jnl_chunk_state {
	JNL_CHUNK_DIRTY = 1,
	JNL_CHUNK_INFLIGHT = 2,
	JNL_CHUNK_FLUSHED = 3,
};

#define JNL_CHUNK_REC_VERSION 1
/* chunks: (id be64, index be64) -> struct jnl_chunk_rec */
struct jnl_chunk_rec {
	uint8_t version;     /* JNL_CHUNK_REC_VERSION */
	uint8_t state;       /* enum jnl_chunk_state */
	uint16_t pad0;
	uint32_t length;     /* bytes from the chunk start (short at EOF) */
	uint64_t generation; /* changes with every committed write */
	uint64_t claim_gen;  /* INFLIGHT: generation at jnl_chunk_claim() */
	uint64_t dseq;       /* position in dirtyq (oldest first) */
	unsigned char sha256[32]; /* FLUSHED: what the remote has */
};

/* dirtyq: dseq (be64) -> chunk key (16 bytes): the claimable DIRTY chunks
 * inflight: chunk key -> "" : the INFLIGHT chunks (recovery reads only this)
 * imports: (base_dev be64, base_ino be64) -> id (be64)
 * dentries: (parent be64, name bytes) -> struct jnl_dval
 * folds.u (MDB_DUPSORT): (parent be64, jnl_fold_key() of the name) ->
 *        the names of the dentries (not whiteouts) that fold to it:
 *        jnl_name_case_taken(); kept by jnl_dentry_put()/_del(). ("folds",
 *        its ASCII-only predecessor, is dropped at open.)
 * ops: seq (be64) -> struct jnl_op_rec, then name, then newname */

#define JNL_OP_REC_VERSION 1
struct jnl_op_rec {
	uint16_t version; /* JNL_OP_REC_VERSION */
	uint16_t type;    /* enum jnl_op_type */
	uint32_t flags;   /* struct jnl_op.flags */
	uint16_t name_len, newname_len;
	uint32_t pad0;
	uint64_t id, parent, newparent;
	uint64_t id2;     /* rename: the node at the target (exchanged or
			     replaced), 0 if none */
	union {
		uint64_t wseq; /* create/symlink/mkdir: the whiteout its
				  dentry replaced (the seq of the op that
				  made it), 0 if none; restored if the
				  create is cancelled */
		uint64_t xino; /* rename with RENAME_EXCHANGE: the remote
				  inode at the source before it was sent
				  (jnl_op_exchange_mark()), 0 if never */
	};
};

struct jnl_orec {
	uint64_t seq;
	struct jnl_op_rec r;
	char name[NAME_MAX + 1], newname[NAME_MAX + 1];
};

/* dentries value: a name, or a whiteout (id 0) made by op wseq; the
 * whiteout is dropped when that op is acknowledged (the remote no longer has
 * the name), not earlier. */
struct jnl_dval {
	uint64_t id;
	uint64_t wseq;
};

/* --- keys ---------------------------------------------------------------- */

static inline void jnl_be64_put(unsigned char *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char)v;
}

static inline uint64_t jnl_be64_get(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

struct jnl_key16 {
	unsigned char b[16];
};

static inline struct jnl_key16 jnl_key16(uint64_t a, uint64_t b)
{
	struct jnl_key16 k;

	jnl_be64_put(k.b, a);
	jnl_be64_put(k.b + 8, b);
	return k;
}

/* b is long enough for a folds key too: upper-casing a UTF-8 name can
 * make it longer, by at most half (a 2-byte letter whose upper case takes
 * 3), and 8 + that stays under LMDB's 511-byte key limit */
struct jnl_dkey {
	unsigned char b[8 + NAME_MAX + NAME_MAX / 2 + 1];
	size_t len;
};

/* --- the pending table: chunk marks not committed yet ------------------- */

#define JNL_PENT_NODE UINT64_MAX /* idx of a node's own entry */

enum jnl_pent_flags {
	JNL_PENT_USED = 1 << 0,  /* slot holds a key (maybe with no marks) */
	JNL_PENT_DIRTY = 1 << 1, /* chunk written: -> DIRTY, new generation */
	JNL_PENT_FILL = 1 << 2,  /* chunk filled: -> FLUSHED if not held */
	JNL_PENT_SIZE = 1 << 3,  /* node entry: max_end valid */
	JNL_PENT_MTIME = 1 << 4, /* node entry: mtime valid (a write) */
};

struct jnl_pent {
	jnl_id id;
	uint64_t idx;         /* chunk index, or JNL_PENT_NODE */
	unsigned int flags;   /* enum jnl_pent_flags */
	uint32_t len;         /* chunk: bytes held from the chunk start */
	uint64_t added;       /* staging bytes reserved for this entry */
	uint64_t max_end;     /* node: end of the furthest write */
	struct timespec mtime; /* node: time of the last write */
	unsigned char sha256[32]; /* chunk with FILL: the filled bytes */
};

struct jnl_ptab {
	struct jnl_pent *e; /* open addressing, linear probing */
	size_t cap;         /* power of two, or 0 */
	size_t used;        /* slots with JNL_PENT_USED */
};

struct jnl_pent *jnl_ptab_find(struct jnl_ptab *t, jnl_id id, uint64_t idx);
/* Find or insert; NULL only when out of memory. */
struct jnl_pent *jnl_ptab_get(struct jnl_ptab *t, jnl_id id, uint64_t idx);
void jnl_ptab_clear(struct jnl_ptab *t);
void jnl_ptab_free(struct jnl_ptab *t);

/* --- a set of u64 (handed-out ops, dependency scan) ---------------------- */

struct jnl_u64set {
	uint64_t *v; /* 0 = empty slot; the value 0 is kept in has_zero */
	size_t cap, used;
	bool has_zero;
};

bool jnl_u64set_has(const struct jnl_u64set *s, uint64_t v);
/* 0 or -ENOMEM */
int jnl_u64set_add(struct jnl_u64set *s, uint64_t v);
void jnl_u64set_del(struct jnl_u64set *s, uint64_t v);
void jnl_u64set_free(struct jnl_u64set *s);

/* --- a count per u64 key (open handles per node) -------------------------- */

struct jnl_u64count {
	uint64_t *k; /* 0 = empty slot (key 0 is not counted) */
	uint32_t *n;
	size_t cap, used;
};

/* the count of @k after adding @d (+1 or -1; a key at 0 goes);
 * -ENOMEM if it cannot grow */
int64_t jnl_u64count_add(struct jnl_u64count *c, uint64_t k, int d);
uint32_t jnl_u64count_get(const struct jnl_u64count *c, uint64_t k);
void jnl_u64count_free(struct jnl_u64count *c);

/* the committer cleans node @id soon (jnl_node_clean()); lock held */
void jnl_clean_later_locked(struct jnl *j, jnl_id id);
/* regular file @id lost its last name: cleaned now if no handle of it is
 * open, else at its last jnl_node_close(); lock held */
void jnl_node_gone_locked(struct jnl *j, jnl_id id);

/* --- the open journal ---------------------------------------------------- */

/* The flusher's wake-up hook (jnl_notify_set() below). */
typedef void (*jnl_notify_fn)(void *arg);

#define JNL_FD_SLOTS 64
#define JNL_OPS_WINDOW 16384 /* ops examined per jnl_ops_ready() call */

#define JNL_PT_PINS 64 /* files open for passthrough at once */

struct jnl_pt_pin {
	jnl_id id;
	unsigned int refs; /* jnl_pt_begin() calls not ended, jnl_pt_mark_all(),
			      jnl_pt_grow() */
	bool keep;         /* a mark failed: the marker stays */
	uint64_t grown;    /* whole chunks [0, grown) marked by jnl_pt_grow() */
	int64_t since;     /* jnl_mono_ns() of its jnl_pt_begin() */
};

struct jnl_fdslot {
	jnl_id id;     /* 0 = free */
	int fd;
	unsigned refs; /* callers using fd now */
	uint64_t tick; /* last use, for eviction */
	bool gone;     /* its file was removed while in use: the last
			* jnl_fd_put() closes it; jnl_fd_get() skips it */
};

/* Staging bytes to give back once the change that released them is
 * durable (journal.c "BATCHES": deferred staging clean-up). */
struct jnl_gc_ent {
	jnl_id id;
	uint64_t first; /* first chunk index */
	uint64_t count; /* chunks to punch out; 0 = remove the whole file */
};

struct jnl_gc {
	struct jnl_gc_ent *e;
	size_t n, cap;
};

/*
 * Lock order: commit_lock, then rw, then txn_lock, then lock. Every use of
 * LMDB (the batch and the changes in it) holds txn_lock.
 */
/* The two sides of jnl->names_lock. */
enum jnl_names_side { JNL_NAMES_HOLDERS, JNL_NAMES_MOVERS };

/* What the open change replaced in the batch, to put back if it fails
 * (jnl_put(), jnl_del()): entries in the order made, key then value bytes
 * in buf. Kept across changes (emptied, not freed). */
struct jnl_undo_ent {
	MDB_dbi dbi;
	bool put;     /* undone by putting (key, value) back, else deleting */
	bool has_val; /* a dupsort pair: delete that value only */
	uint32_t klen, vlen;
	size_t off; /* in buf */
};

struct jnl_undo {
	bool on; /* a change is open: log what it writes to the batch */
	struct jnl_undo_ent *e;
	size_t n, cap;
	unsigned char *buf;
	size_t len, bcap;
};

struct jnl {
	/* immutable after jnl_open() */
	char *dir;
	int dirfd;  /* the journal directory; holds the flock */
	int datafd; /* dir/data */
	int ptfd;   /* dir/pt: a file per node the kernel may have written
		       behind the journal's back (jnl_pt_begin()) */
	MDB_env *env;
	MDB_dbi db_meta, db_nodes, db_dentries, db_chunks, db_dirtyq,
		db_inflight, db_ops, db_imports, db_folds;
	uint32_t chunk_size;
	unsigned int chunk_shift;
	size_t map_pages, reserve_pages; /* LMDB map, kept for shrinking */
	unsigned int batch_max; /* changes per batch at most */
	uint64_t max_bytes;
	bool disk_room;         /* bound staging by the disk's free space */
	unsigned int wait_ms;   /* a writer waits this long for room */
	unsigned int commit_ms;
	uint64_t resent_bytes; /* set by recovery in jnl_open() */
	uint64_t ident;        /* jnl_ident() */

	atomic_int failed; /* 0, or the sticky error (-EIO) */

	/* held across one group commit (swap, fdatasync, txn); setattr holds
	 * it so that no mark is in flight while it edits a node's chunks */
	pthread_mutex_t commit_lock;
	/* jnl_write() shared across its check, pwrite and mark; fill and
	 * truncate exclusive (writer-preferring) */
	pthread_rwlock_t rw;

	/* the batch: LMDB's one write transaction, open all the time, that
	 * every change writes into (undone from its undo log if it fails)
	 * and every read reads (journal.c "BATCHES") */
	pthread_mutex_t txn_lock;
	MDB_txn *txn;          /* the batch, NULL once closed; txn_lock */
	unsigned int batch_ops; /* changes committed in it; txn_lock */
	jnl_id sweep_next;      /* jnl_sweep()'s next id, 0: done; lock */
	struct jnl_undo undo;   /* of the open change; txn_lock */
	uint64_t durable_seq;  /* ops below it are committed; txn_lock */
	/* Ops acknowledged (or given up) whose deletion is not synced yet:
	 * jnl_ops_ready() still counts them as pending when it decides what
	 * waits for what, so that no op is handed out on an ack a crash can
	 * take back (ops.c; invariant 18 of journal.c). Each entry holds the
	 * batch number (batch_gen) its deletion went into. txn_lock */
	struct jnl_acked {
		struct jnl_orec *o;
		uint64_t *gen;
		size_t n, cap;
	} acked;
	uint64_t batch_gen;    /* the open batch's number; txn_lock */
	bool wake_pending;     /* the batch made flusher work; txn_lock */
	struct jnl_gc gc_new;  /* clean-ups of changes in the batch; txn_lock */
	struct jnl_gc gc_due;  /* of committed changes; txn_lock */

	pthread_mutex_t lock;
	pthread_cond_t cond;             /* wakes the committer; lock */
	pthread_cond_t room;             /* staging room came back; lock */
	struct jnl_ptab pend;            /* marks since the last swap; lock */
	struct jnl_ptab committing;      /* marks of the commit running; lock */
	uint64_t pend_new;               /* bytes reserved by both; lock */
	int commit_err;                  /* last group commit error; lock */
	bool dirty;                      /* the batch has changes; lock
					    and txn_lock to write, either
					    to read */
	bool unsynced;                   /* meta page not synced yet; lock */
	bool acks_unsynced;              /* acked has entries: a hungry
					    flusher hurries the commit; lock */
	bool stop;                       /* committer exits; lock */
	unsigned int waiters;            /* writers waiting for room; lock */
	uint64_t write_waits;            /* writes that waited; lock */
	bool hurry;                      /* commit now: writers wait; lock */
	bool hungry;                     /* the flusher has nothing to do:
					    a filled chunk hurries the
					    commit (jnl_hungry()); lock */
	bool flusher_work;               /* the batch holds flusher work
					    (an op, a chunk to claim) not
					    committed yet; lock */
	int64_t commit_end_ns;           /* CLOCK_MONOTONIC, the last
					    commit's end; lock */
	uint64_t reserved;               /* staging bytes ever reserved;
					    lock */
	uint64_t disk_avail;             /* free on the journal disk at the
					    last look, less a margin
					    (UINT64_MAX: unknown); lock */
	uint64_t disk_base;              /* reserved at that look; lock */
	uint64_t disk_slack;             /* backpressure below this; lock */
	int64_t disk_at;                 /* the last look, CLOCK_MONOTONIC
					    ns (0: look again); lock */
	struct jnl_fdslot fds[JNL_FD_SLOTS]; /* staging fds; lock */
	/* nodes whose staging file the kernel writes (jnl_pt_begin()) */
	struct jnl_pt_pin pt_pins[JNL_PT_PINS]; /* lock */
	unsigned int pt_npins;                 /* lock */
	/* pins ended whose marker (pt/<id>) goes once their marks are
	 * committed (commit_pending()); lock */
	struct jnl_u64set pt_ended;
	/* pinned nodes jnl_node_clean() left alone (their chunk records
	 * are what jnl_pt_mark() compares with), and those of them whose
	 * pin ended since: the committer cleans them; lock */
	struct jnl_u64set pt_unclean, clean_due;
	/* open handles per node (jnl_node_open()): a node unlinked keeps
	 * its data while one is open, and is in gone_open until the last
	 * one closes; lock */
	struct jnl_u64count opens;
	struct jnl_u64set gone_open;
	/* ended pins whose last marks a commit took before their staging
	 * file was synced (commit_pending(), "defer"): the committer syncs
	 * them, then their markers go (pt_sync_deferred()): those of the
	 * last JNL_PT_LAZY_NS, and those of the one before; lock */
	struct jnl_u64set pt_unsynced, pt_unsynced_old;
	_Atomic uint64_t pt_ends; /* pins ended; bumped under lock */
	uint64_t fd_tick;                /* lock */
	struct jnl_u64set handed;        /* seqs of handed-out ops; lock */
	uint64_t staged;                 /* staging bytes in the batch; lock */
	jnl_notify_fn notify_fn;         /* jnl_notify_set(); lock */
	void *notify_arg;                /* lock */
	char *remote_id;                 /* immutable: cfg->remote_id */
	_Atomic uint64_t conflict_epoch; /* bumped by every conversion of a
					    conflict (jnl_node_conflict()) */
	/* jnl_names_hold() and jnl_names_move_begin(): a phase-fair
	 * shared/shared lock (ops.c), indexed by enum jnl_names_side */
	pthread_mutex_t names_lock;
	pthread_cond_t names_cond;       /* names_lock */
	unsigned int names_in[2];        /* inside; names_lock */
	unsigned int names_wait[2];      /* waiting; names_lock */
	enum jnl_names_side names_turn;  /* whom a tie goes to; names_lock */
	pthread_t thread;
};

/*
 * The flusher's wake-up hook: after every commit of a batch that made work
 * for it (an op appended or deleted, a chunk put in dirtyq), the journal
 * calls fn(arg) with j->lock held (so lock order:
 * j->lock, then whatever fn takes). fn must be short, must not call the
 * journal, and must not block on anything that may wait for the journal:
 * signal a condition variable and return. Only one hook at a time:
 * -EBUSY if one is set and @fn is not NULL; fn NULL clears it, and once
 * that returns no call of the old hook is running or will start.
 */
int jnl_notify_set(struct jnl *j, jnl_notify_fn fn, void *arg);

/* The flusher has nothing to send: the next write that fills a chunk
 * commits at once instead of at the end of the period, so that the link
 * does not wait JNL_COMMIT_MS for the first chunk of a big write (at most
 * one such commit per JNL_HUNGRY_GAP_MS: a flusher faster than the
 * writer would otherwise ask for a commit per chunk). Takes
 * j->lock: never call it with the flusher's lock held. */
void jnl_hungry(struct jnl *j);
/* CLOCK_MONOTONIC in nanoseconds. */
int64_t jnl_mono_ns(void);

/* Changes with every conversion of a conflict: the flusher closes the
 * remote files it keeps open when it moved (a node it had open at its old
 * name is now elsewhere). */
static inline uint64_t jnl_conflict_epoch(struct jnl *j)
{
	return atomic_load(&j->conflict_epoch);
}

/* --- errors and write transactions (journal.c) ------------------------- */

/* The one map of LMDB codes: MDB_NOTFOUND -> -ENOENT, MDB_MAP_FULL and
 * MDB_TXN_FULL -> -ENOSPC, rc > 0 (an errno) -> -rc, anything else -> -EIO. */
int jnl_err_from_mdb(int rc);
/* jnl_err_from_mdb(), and -EIO makes the journal FAILED (sticky). */
int jnl_mdb(struct jnl *j, int rc);
/* Record a failure of the journal's own files: -EIO makes it FAILED. */
int jnl_fail(struct jnl *j, int rc);
/* 0, or the sticky error of a FAILED journal. */
static inline int jnl_failed(struct jnl *j)
{
	return atomic_load(&j->failed);
}

struct jnl_wtx {
	struct jnl *j;
	MDB_txn *txn;          /* the batch */
	struct jnl_meta_rec m; /* read at begin, written at commit */
	bool m_dirty;
	bool wake; /* made work for the flusher: notify after the commit */
	bool sync; /* commit the batch with it (journal.c "BATCHES") */
	uint64_t unreserve; /* pend_new bytes its marks held: let go at the
			       commit, as the records take them over */
};

/* Begin a change: takes txn_lock, starts the batch's undo log, reads meta.
 * A @grow transaction (it may add records: namespace changes, the group
 * commit) fails with -ENOSPC once the LMDB map is down
 * to its reserve, so that the shrinking ones (ack, claim, release) can
 * always run and free room: a full map never wedges the journal. */
int jnl_wtx_begin(struct jnl *j, struct jnl_wtx *w, bool grow);
/* Write meta if changed and keep the change in the batch (no I/O);
 * commits the batch too with w->sync or once it holds batch_max changes.
 * Releases txn_lock. On failure nothing was changed. */
int jnl_wtx_commit(struct jnl_wtx *w);
/* Undo the change's writes (its undo log, last first). If that fails, or
 * LMDB left the batch unusable, the batch is aborted: the journal FAILED
 * if it held other changes. */
void jnl_wtx_abort(struct jnl_wtx *w);
/* mdb_put() and mdb_del() for every write of the journal: in a change,
 * what they replace goes to the undo log first (a dupsort database's puts
 * need MDB_NODUPDATA, its deletes a value). LMDB's return codes. */
int jnl_put(struct jnl *j, MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v,
	    unsigned int flags);
int jnl_del(struct jnl *j, MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v);
/* Read the journal as it is now (the batch, with what is not committed
 * yet): takes txn_lock and gives the batch; do not write through it. End
 * with jnl_rtx_end(); no other journal call in between. */
int jnl_rtx_begin(struct jnl *j, MDB_txn **txn);
void jnl_rtx_end(struct jnl *j);
/* Commit the batch now (LMDB commit: its pages fdatasync()ed, the meta
 * page later) and open the next one. txn_lock held. A failure makes the
 * journal FAILED: changes already answered would be lost. */
int jnl_batch_commit(struct jnl *j);

/* The group commit: swap pend (only the marks of @only, if not 0),
 * fdatasync the staging files it names, apply it, commit the batch, sync
 * LMDB's meta page, then give back the staging of durable clean-ups. Takes
 * commit_lock unless @locked. */
int jnl_commit_pending(struct jnl *j, bool locked, jnl_id only);
/* After a commit of every pending mark: the markers of the pins in @ended
 * that did not begin again go (data.c). */
void jnl_pt_unmark(struct jnl *j, struct jnl_u64set *ended);
/* At open: marks what the kernel wrote into the staging files named in
 * pt/ (a daemon stopped while they were passed through). */
void jnl_pt_recover(struct jnl *j);
/* The committer, every commit period while a node is pinned: marks the
 * whole chunks each staging file pinned for JNL_PT_GROW_AFTER_MS or more
 * grew by since the last look, so a file copied in through passthrough
 * starts to flow while it is written. Not sooner: a file written within
 * that time flows from its close, and its writer does not share the CPUs
 * with the flush (1 GiB at 1 Gbit/s, 3 runs each: the `cp` 0.33-0.47 s
 * against 0.72-0.80 s from the first period, on the NAS 10.01-10.07 s
 * against 9.92-9.97 s; 500 ms: 0.40-0.60 s, 10.09-10.35 s).
 * What the kernel changes in them later is found by the file's last
 * jnl_pt_mark() (close, fsync), which hashes the chunks the remote has and
 * marks the others again. */
void jnl_pt_grow(struct jnl *j);
#define JNL_PT_LAZY_NS (INT64_C(30) * 1000000000)
#define JNL_PT_GROW_AFTER_MS 1000
/* @id is pinned (its marker stays). lock held. */
bool jnl_pt_pinned_locked(struct jnl *j, jnl_id id);

/* Staging room: wake writers waiting for it (lock held). */
void jnl_room_signal(struct jnl *j);

/* Give back the staging bytes of chunks [first, first + count) of @id
 * (count 0: the whole staging file) once the batch that released them is
 * durable, unless the journal holds them again by then (jnl_gc_run()
 * checks). txn_lock held (inside a change). 0 or -ENOMEM. */
int jnl_gc_add(struct jnl *j, jnl_id id, uint64_t first, uint64_t count);

/* One slice of the sweep after open (the committer, when idle): cleans the
 * nodes from id *from on that hold chunk records with nothing pending (a
 * kill between a file's FINISH ack and the flusher's jnl_node_clean() left
 * them so, their flushed staging held). Looks at 256 such nodes at most;
 * *from becomes the next id, 0 once all were seen. The nodes cleaned, or
 * -errno. */
int jnl_sweep(struct jnl *j, jnl_id *from);

/* --- record decoders (rec.c) ---------------------------------------------- */

/* Decode the bytes [p, p + len) of a record as LMDB holds it into *out:
 * 0, or -EIO if they are no such record (then *out is unspecified). Pure:
 * they read nothing else and log nothing; the callers log and fail. */
int jnl_node_decode(const void *p, size_t len, struct jnl_nrec *n);
int jnl_dentry_decode(const void *p, size_t len, struct jnl_dval *d);
int jnl_chunk_decode(const void *p, size_t len, struct jnl_chunk_rec *c);
/* o->seq becomes @seq (the record's key). */
int jnl_op_decode(const void *p, size_t len, uint64_t seq, struct jnl_orec *o);
/* The "meta" record (check_meta() at open): 0, or -ENOMSG (under 16
 * bytes), -EILSEQ (the other byte order), -EBADMSG (bad magic), -EPROTO
 * (another format or size), -EDOM (a chunk size that is no power of two
 * in [64 KiB, 64 MiB]); *m holds what was read either way. */
int jnl_meta_decode(const void *p, size_t len, struct jnl_meta_rec *m);

/* --- nodes (node.c) -------------------------------------------------------- */

int jnl_node_read(struct jnl *j, MDB_txn *txn, jnl_id id,
		  struct jnl_nrec *n);
int jnl_node_write(struct jnl *j, MDB_txn *txn, jnl_id id,
		   const struct jnl_nrec *n);
/* A node may have chunks claimed: on the remote and still named. */
/* Has claim @c of chunk record @r gone stale (no longer INFLIGHT at the
 * generation it was claimed at: a release, a conversion, a truncate or
 * recovery came between)? */
static inline bool jnl_claim_stale(const struct jnl_chunk_rec *r,
				   const struct jnl_chunk_ref *c)
{
	return r->state != JNL_CHUNK_INFLIGHT || r->claim_gen != c->generation;
}

static inline bool jnl_node_claimable(const struct jnl_node_rec *r)
{
	return !(r->flags & (JNL_NODE_LOCAL | JNL_NODE_UNLINKED |
			     JNL_NODE_CUT));
}
void jnl_now(struct timespec *ts);
int jnl_name_check(const char *name);
struct jnl_dkey jnl_dkey(jnl_id parent, const char *name);
/* The folds key of @name: jnl_dkey() with every letter upper-cased,
 * code point by code point (Samba's rule); bytes that are not UTF-8 are
 * kept. */
struct jnl_dkey jnl_fold_key(jnl_id parent, const char *name);
/* 0, or -ENOTSUP without the C.UTF-8 locale jnl_fold_key() needs:
 * jnl_open() calls it first. */
int jnl_fold_init(void);
/* Fill folds from dentries (a journal made before it): jnl_open(). */
int jnl_folds_build(struct jnl *j, MDB_txn *txn);
/* The dentry (a whiteout has d->id 0), or -ENOENT. */
int jnl_dentry_get(struct jnl *j, MDB_txn *txn, jnl_id parent,
		   const char *name, struct jnl_dval *d);
int jnl_dentry_put(struct jnl *j, MDB_txn *txn, jnl_id parent,
		   const char *name, jnl_id id, uint64_t wseq);
int jnl_dentry_del(struct jnl *j, MDB_txn *txn, jnl_id parent,
		   const char *name);

/* --- data (data.c) --------------------------------------------------------- */

/* What pend and committing hold for a node, beyond its record. */
struct jnl_pnode {
	bool size_set, mtime_set;
	uint64_t max_end;
	struct timespec mtime;
};
/* A node record takes the remote's attributes @st: mode, owner, times,
 * size, nlink, and rvalid (the remote bytes of a regular file). */
void jnl_rec_take_stat(struct jnl_node_rec *r, const struct stat *st);
/* The base (journal.h enum jnl_base) becomes @st: SET for a regular file
 * with one link, else NONE (also for @st NULL); bseq moves (node.c). */
void jnl_rec_base_set(struct jnl_node_rec *r, const struct stat *st);
/* Is @st (the remote's attributes now) the base of @r? */
bool jnl_rec_base_is(const struct jnl_node_rec *r, const struct stat *st);
/* Read it (takes lock), then merge it into a record read after. */
void jnl_pend_node_get(struct jnl *j, jnl_id id, struct jnl_pnode *p);
void jnl_pnode_merge(const struct jnl_pnode *p, struct jnl_node_rec *r);
/* After a committed setattr with SIZE: drop the marks past @size and the
 * write mtime (MTIME), make the truncate durable if staging bytes go, and
 * truncate the staging file. commit_lock held, and rw exclusive. */
int jnl_pend_setattr(struct jnl *j, jnl_id id, unsigned int set,
		     uint64_t size);
/* A setattr of mtime without SIZE: drop the write mtime of @id's marks in
 * pend and committing. txn_lock held (no group commit applies them now). */
void jnl_pend_mtime_drop(struct jnl *j, jnl_id id);
/* Begin a write transaction on node @id with nobody else at its records
 * (data.c): commit_lock, rw exclusive, no mark of @id in pend (with
 * @commit, @id's marks are committed first; without, -EBUSY if there are
 * any). End with jnl_quiet_end() after the commit or abort; on error
 * nothing is held. */
int jnl_quiet_begin(struct jnl *j, jnl_id id, bool commit, struct jnl_wtx *w);
void jnl_quiet_end(struct jnl *j);
/* A conflict copy: every chunk record of @n (LOCAL already: out of
 * dirtyq) becomes DIRTY with a new generation, so that stale claims and
 * releases change nothing; -EAGAIN if a chunk below rvalid has no record.
 * Updates @n (the caller writes it). Inside jnl_quiet_begin(). */
int jnl_chunks_conflict(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n);
/* Apply the marks of @t to the chunk and node records (group commit). */
int jnl_pend_apply(struct jnl_wtx *w, struct jnl_ptab *t);
/* @n's claimability changed: put its DIRTY chunks in dirtyq (@in) or take
 * them out. */
int jnl_chunks_enqueue(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n,
		       bool in);
/* Delete the chunk records at or past @size, clamp the one across it;
 * updates @n (the caller writes it). */
int jnl_chunks_truncate(struct jnl_wtx *w, jnl_id id, struct jnl_nrec *n,
			uint64_t size);
/* jnl_open(): every INFLIGHT chunk becomes DIRTY; adds their bytes to
 * *resent. Reads only the inflight index (invariant 2). */
int jnl_chunks_recover(struct jnl_wtx *w, uint64_t *resent);
int jnl_chunk_get(struct jnl *j, MDB_txn *txn, jnl_id id, uint64_t idx,
		  struct jnl_chunk_rec *c);
/* Give back what @g names (jnl_gc_add()): punch the chunks, remove the
 * files, each only if not held again. commit_lock held, nothing else. */
void jnl_gc_run(struct jnl *j, const struct jnl_gc *g);
/* Staging file descriptors, cached (JNL_FD_SLOTS). jnl_fd_get() without
 * @create returns -ENOENT if the node has no staging file. */
int jnl_fd_get(struct jnl *j, jnl_id id, bool create, int *fd);

void jnl_fd_put(struct jnl *j, jnl_id id, int fd);
void jnl_fd_close_all(struct jnl *j);

/* --- op log (ops.c) -------------------------------------------------------- */

/* Append an op and count it in the nops of every node it names; fills
 * o->r's seq into *seq. Call it after writing the node records you hold:
 * it reads and rewrites them. */
int jnl_op_append(struct jnl_wtx *w, const struct jnl_orec *o, uint64_t *seq);
/* Read an op; -ENOENT if none. */
int jnl_op_read(struct jnl *j, MDB_txn *txn, uint64_t seq, struct jnl_orec *o);
/* Forget the acknowledged ops (j->acked) whose deletion a sync covers:
 * those of batches below @synced_gen; and, if @open_clean (the open
 * batch holds no change), those of the open batch, whose change was
 * undone. txn_lock held. True if any went (ops may be ready). */
bool jnl_acked_purge(struct jnl *j, uint64_t synced_gen, bool open_clean);
void jnl_acked_free(struct jnl *j);
/* Delete an op and uncount it from its nodes' nops. */
int jnl_op_delete(struct jnl_wtx *w, const struct jnl_orec *o);
/* The distinct nodes an op names (at most 4); returns the count. */
int jnl_op_nodes(const struct jnl_op_rec *r, jnl_id out[4]);

/* Conflicts recorded so far (node.c; meta "conflicts"). */
uint64_t jnl_conflicts_count(struct jnl *j, MDB_txn *txn);

/* --- checks and test hooks ------------------------------------------------ */

/*
 * Check every numbered invariant of journal.c by a full scan of the journal
 * (O(journal): tests only). A broken invariant logs a "BUG:" line naming
 * it and aborts, as fs_itab_assert_sane() does. Commits pending marks first.
 */
void jnl_assert_sane(struct jnl *j);

/* Test hooks, read by jnl_open() (set them before opening) unless they
 * say otherwise. 0 = default. */
extern size_t jnl_test_map_size;        /* LMDB map size in bytes */
extern unsigned int jnl_test_commit_ms; /* group commit period */
extern unsigned int jnl_test_env_flags; /* more mdb_env_open() flags, e.g.
					   MDB_NOSYNC to build big journals
					   fast */
extern bool jnl_test_sync_each;        /* a commit fdatasyncs its
					   staging files one by one */
extern bool jnl_test_no_disk_room;      /* do not bound staging by the
					   journal disk's free space (so the
					   disk's own -ENOSPC is met) */
extern unsigned int jnl_test_fail_write; /* the Nth write of a change from
					    now fails: MDB_MAP_FULL, nothing
					    written (any time, 0 = never) */

/* --- syscall wrappers (candidates for util/sys.h) ------------------------ */

static inline int jnl_sys_openat(int dirfd, const char *path, int flags,
				 mode_t mode)
{
	int fd = openat(dirfd, path, flags | O_CLOEXEC, mode);

	return fd < 0 ? -errno : fd;
}

static inline int jnl_sys_fdatasync(int fd)
{
	return fdatasync(fd) < 0 ? -errno : 0;
}

static inline int jnl_sys_ftruncate(int fd, off_t size)
{
	return ftruncate(fd, size) < 0 ? -errno : 0;
}

#endif
