/*
 * fs_i.h - inside fs/: the inode table. Only the fs/ sources and tests/unit/test_fs.c
 * include this file.
 *
 * The table maps what the kernel knows (a fuse_ino_t, with a lookup count)
 * to what the remote knows (its (st_dev, st_ino) identity and the names under
 * which we have seen the object). The remote interface is path based, so an
 * inode's path is rebuilt from its links: (parent inode, name) pairs, most
 * recently seen first. A hard-linked file has several links; a file that was
 * unlinked but is still open has none and is reached through its handles.
 *
 * Invariants (fs_itab_assert_sane() checks them):
 *  1. Each (dev, ino) key is in the hash at most once.
 *  2. An inode is in the table while nlookup > 0 or refs > 0; refs counts
 *     the links of other inodes naming it as parent, plus the open handles
 *     of the inode itself. The root has a permanent extra ref.
 *  3. A parent is never freed before its children: a link holds a ref.
 *  4. Links of one inode are distinct (parent, name) pairs.
 *
 * Lifetime: fs_itab_lookup() creates or finds and adds a lookup;
 * fs_itab_forget() drops lookups; when nlookup and refs are both 0 the inode
 * is unlinked from its parents (dropping their refs) and freed.
 *
 * Locking: one mutex, itab->lock, protects every field marked so; no remote
 * call and no fuse_reply_*() is made under it. Inode pointers stay valid for
 * the duration of a FUSE request because the kernel holds a lookup on them.
 */
#ifndef FERRYFS_FS_I_H
#define FERRYFS_FS_I_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "cache.h"

struct rmt_file;
struct rmt;
struct jnl;
struct jnl_flusher;
struct fs_opts;
struct fuse_session;
struct fuse_file_info;

struct fs_link {
	struct fs_inode *parent; /* holds a ref on parent */
	struct fs_link *next;
	char name[];
};

/* An open file: one per FUSE open/create, travels in fi->fh. */
struct fs_handle {
	/* write-through, or a file the journal does not know: the remote
	 * file (immutable). Write-back (id != 0): the remote file read for
	 * the chunks the journal does not hold, opened on first use
	 * (protected by lock), or NULL */
	struct rmt_file *file;
	uint64_t id;            /* write-back: the journal node, or 0 */
	pthread_mutex_t lock;   /* write-back: file; reads: ra */
	/* reads through the cache (read.c): set at open, then immutable */
	bool cacheable;
	struct cache_key key;   /* the remote version at open */
	char *rpath;            /* the remote path at open */
	struct cache_ra_file ra; /* protected by lock */
	struct fs_inode *inode; /* immutable, holds a ref */
	bool append;            /* opened O_APPEND: writes go to EOF */
	bool direct;            /* FUSE direct I/O (write-only): immutable */
	bool pt;                /* passes through (pt.c): set at open under
				   fs->pt_lock, then immutable */
	int write_err;          /* sticky deferred error, reported by flush;
				   protected by itab->lock */
	unsigned int refs;      /* release + borrowers; protected by itab->lock */
	struct fs_handle *prev, *next; /* inode->handles, itab->lock */
};

struct fs_inode {
	uint64_t dev, ino;  /* the remote identity: immutable; a node created
			       in the journal: (FS_LOCAL_DEV, its id with the
			       top bit set) */
	uint64_t id;        /* write-back: the journal node (jnl_id), 0 if the
			       journal does not know the object; set once,
			       never changed; protected by itab->lock */
	mode_t type;        /* S_IFMT bits: immutable */
	uint64_t nlookup;   /* kernel lookups; protected by itab->lock */
	uint64_t refs;      /* see invariant 2; protected by itab->lock */
	struct fs_link *links;      /* protected by itab->lock */
	struct fs_handle *handles;  /* open handles; protected by itab->lock */
	struct fs_inode *hnext;     /* hash chain; protected by itab->lock */
	bool orphan;                /* out of the hash, on itab's orphans
				       list (onext); protected by itab->lock */
	struct fs_inode *onext;
	uint64_t moved;             /* fs_itab_moves() at the last rename or
				       unlink of one of its names; protected
				       by itab->lock */
	/* close-to-open: what size/mtime the kernel's page cache holds;
	 * protected by itab->lock */
	bool cache_known;
	off_t cache_size;
	struct timespec cache_mtime;
	/* serialises O_APPEND writes of this process (size then write) */
	pthread_mutex_t append_lock;
};

struct fs_itab;

/* Make a table whose root has the identity of @root_st. Caller owns *out;
 * free with fs_itab_free(). Errors: -ENOMEM. */
int fs_itab_new(const struct stat *root_st, struct fs_itab **out);
/* The key of objects that exist only in the journal (see fs_inode) */
#define FS_LOCAL_DEV UINT64_MAX
#define FS_LOCAL_INO_BIT (1ull << 63)

/* Free the table and every inode still in it. NULL is a no-op. */
void fs_itab_free(struct fs_itab *t);

struct fs_inode *fs_itab_root(struct fs_itab *t);
/* Number of inodes in the table (root included). */
size_t fs_itab_count(struct fs_itab *t);

/*
 * Record that @name in @parent is the object @st and add one kernel lookup
 * (@nlookup_inc = 1, or 0 to only record the name). The link becomes the
 * inode's first (preferred) one. An inode with the same key but another file
 * type (a reused inode number) is replaced by a new inode.
 * Errors: -ENOMEM (nothing changed).
 */
int fs_itab_lookup(struct fs_itab *t, struct fs_inode *parent,
		   const char *name, const struct stat *st,
		   uint64_t nlookup_inc, struct fs_inode **out);

/*
 * A LOOKUP races renames and unlinks: the kernel revalidates a dentry
 * without the directory's lock, so "b is X" from the remote may arrive
 * after a rename moved X from b to a here, and recording it would give X
 * its old name back (its path, used by the next open, would be gone).
 * fs_itab_moves() counts the renames and unlinks of the table; take it
 * before asking the remote, and give it to fs_itab_lookup_since(), which
 * is fs_itab_lookup() except that it fails with -EAGAIN (nothing changed)
 * when a name of the inode found was moved or removed since: ask the
 * remote again. FS_ITAB_ANY: no check (the last try).
 */
#define FS_ITAB_ANY UINT64_MAX
uint64_t fs_itab_moves(struct fs_itab *t);
int fs_itab_lookup_since(struct fs_itab *t, struct fs_inode *parent,
			 const char *name, const struct stat *st,
			 uint64_t nlookup_inc, uint64_t since,
			 struct fs_inode **out);
/* How often a LOOKUP asks the remote again before it takes the answer */
#define FS_LOOKUP_TRIES 8

/* The remote inode number of @ino's (first) parent, for a ".." entry;
 * @ino's own for the root or an inode with no name left. */
uint64_t fs_itab_parent_ino(struct fs_itab *t, struct fs_inode *ino);

/* Drop @n kernel lookups; may free the inode. */
void fs_itab_forget(struct fs_itab *t, struct fs_inode *ino, uint64_t n);

/* Find an inode by remote identity (no reference taken), or NULL. */
struct fs_inode *fs_itab_find(struct fs_itab *t, dev_t dev, ino_t ino);

/* The name (parent, name) no longer refers to the inode with this identity
 * (after unlink/rmdir/rename-over). No-op if unknown. */
void fs_itab_unlink(struct fs_itab *t, struct fs_inode *parent,
		    const char *name, dev_t dev, ino_t ino);

/*
 * After a successful rename of (p1, n1) -> (p2, n2): the object with
 * identity @k1 now lives at (p2, n2). Without @exchange, an object @k2 that
 * was at (p2, n2) lost that name; with it, @k2 moved to (p1, n1). Identities
 * not in the table are ignored. Errors: -ENOMEM (the table may then still
 * name the old place; operations on it return -ESTALE until the next lookup).
 */
int fs_itab_rename(struct fs_itab *t, struct fs_inode *p1, const char *n1,
		   const struct stat *k1, struct fs_inode *p2, const char *n2,
		   const struct stat *k2, bool exchange);

/*
 * Write the remote path of @ino (followed by "/@name" if @name is not NULL)
 * into buf. The root is "". Errors: -ESTALE (the inode has no name left, or
 * the names form a loop), -ENAMETOOLONG.
 */
int fs_itab_path(struct fs_itab *t, struct fs_inode *ino, const char *name,
		 char *buf, size_t size);

/*
 * Write-back: the path of @ino (+ "/@name") relative to its nearest
 * ancestor (or itself) that has a journal id, which goes to *base (0 when
 * none has one: then the path is from the root, as fs_itab_path()). The
 * caller prefixes jnl_node_rpath(*base). Errors: as fs_itab_path().
 */
int fs_itab_path_rel(struct fs_itab *t, struct fs_inode *ino, const char *name,
		     char *buf, size_t size, uint64_t *base);
/* The journal id of @ino (0: none). */
uint64_t fs_itab_id(struct fs_itab *t, struct fs_inode *ino);
/* Give @ino its journal id (once). Errors: -ESTALE (it has another). */
int fs_itab_set_id(struct fs_itab *t, struct fs_inode *ino, uint64_t id);
/* The same for the inode with remote identity (@dev, @ino), if there is
 * one (after the journal imported that object by name). */
void fs_itab_set_id_by_key(struct fs_itab *t, uint64_t dev, uint64_t ino,
			   uint64_t id);
/* The inode with remote identity (@dev, @ino), if its id is @from, gets
 * @to instead: a conflict gave the share's version of it a new node. */
void fs_itab_move_id(struct fs_itab *t, uint64_t dev, uint64_t ino,
		     uint64_t from, uint64_t to);
/* The first (preferred) name of @ino: its parent, with a ref taken (drop
 * it with fs_itab_unref()), and the name in @name (NAME_MAX + 1 bytes).
 * Errors: -ESTALE (no name left). */
int fs_itab_first_link(struct fs_itab *t, struct fs_inode *ino,
		       struct fs_inode **parent, char *name);
void fs_itab_unref(struct fs_itab *t, struct fs_inode *ino);

/* Attach a new open handle to its inode: h->refs becomes 1 (owned by the
 * kernel's open, dropped by release), and the inode gains a ref. */
void fs_itab_handle_add(struct fs_itab *t, struct fs_handle *h);
/* Number of open handles of @ino whose pages the kernel caches (not
 * direct). */
unsigned int fs_itab_cached_handles(struct fs_itab *t, struct fs_inode *ino);
/* Open handles of @ino other than @h that do not pass through (pt.c;
 * under fs->pt_lock). */
unsigned int fs_itab_handles_other(struct fs_itab *t, struct fs_inode *ino,
				   const struct fs_handle *h);
/* Borrow an open handle of @ino with a remote file of its own (id 0: its
 * file is set and immutable), refs + 1, or NULL: for a file open here,
 * whose handle reaches the object without a path (or has no path left).
 * Give it back with handle_put. */
struct fs_handle *fs_itab_handle_any(struct fs_itab *t, struct fs_inode *ino);
/* Borrow up to @max open handles of @ino (refs + 1 each) into @out;
 * returns how many. Give each back with handle_put. */
unsigned int fs_itab_handles(struct fs_itab *t, struct fs_inode *ino,
			     struct fs_handle **out, unsigned int max);
/* Drop a ref. Returns true when it was the last: the handle is then detached
 * from its inode (which may be freed) and the caller closes h->file and
 * frees h. */
bool fs_itab_handle_put(struct fs_itab *t, struct fs_handle *h);
/* Take every handle still open out of the table, as their last puts would
 * (each inode loses the ref its handles held, and may be freed). Returns
 * them linked by ->next, NULL if none; the caller closes h->file and frees
 * each h. Only when no request can run any more: for the opens whose
 * RELEASE the kernel never sent (the session ended first). */
struct fs_handle *fs_itab_handles_take(struct fs_itab *t);

/*
 * Close-to-open: the kernel's cached pages of @ino are still good if the
 * remote size and mtime in @st match what they were at the last open.
 * Records @st for the next open. Returns true to keep the cache.
 */
bool fs_itab_keep_cache(struct fs_itab *t, struct fs_inode *ino,
			const struct stat *st);
/* Writes through this mount keep the cache current: record the new size and
 * mtime without invalidating. */
void fs_itab_cache_update(struct fs_itab *t, struct fs_inode *ino,
			  const struct stat *st);

/* --- the control socket (ctl.c) -------------------------------------- */

struct fs_ctl;

/* Answer one command line: *reply is a JSON object, no newline, from
 * the fs_reply_*() or fs_status_json() writers (status.c); ctl.c frees
 * it. Runs on the control thread. Return 0, or -errno for a generic
 * error (then *reply is not set). */
typedef int (*fs_ctl_handler)(void *arg, const char *cmd, char **reply);

/* Listen for the mount at the absolute, symlink-free path @mountpoint
 * (call once it is mounted), in a directory that is the daemon's own
 * (ctl.c, invariant 4). Caller owns *out; stop with fs_ctl_stop(). On
 * error @why (@wsize bytes) says why in one line: the directory is a
 * symlink, another user's (-EPERM), writable by others (-EPERM)... */
int fs_ctl_start(const char *mountpoint, fs_ctl_handler handler, void *arg,
		 struct fs_ctl **out, char *why, size_t wsize);
void fs_ctl_stop(struct fs_ctl *c);
/* Client: send @cmd to the mount at @mountpoint and read its one-line
 * reply, of any length; caller owns *reply (free()). Errors: -ENOENT
 * (nothing mounted there), -ECONNREFUSED (no ferryfs daemon listening),
 * -EACCES (not ours to ask), -EPERM (the socket is answered by another
 * user than the mount's owner or root: not believed), -ENOMEM. */
int fs_ctl_call(const char *mountpoint, const char *cmd, char **reply);
/* The command of a request line (no newline): FS_CTL_UNKNOWN for
 * anything but the exact words. Pure; the handlers switch on it. */
enum fs_ctl_cmd {
	FS_CTL_UNKNOWN,
	FS_CTL_STATUS,
	FS_CTL_FLUSH,
	FS_CTL_PAUSE,
	FS_CTL_RESUME,
};
enum fs_ctl_cmd fs_ctl_parse(const char *line);
/* The framing of both sides, for tests/fuzz/fuzz_ctl.c too. Server: read
 * one request line of at most @size - 1 bytes from @fd into @buf, cut at
 * its first CR or LF and NUL-terminated; the bytes read (0: the client
 * sent nothing), or -errno. Client: read the reply up to its newline or
 * the end of the stream, any length (16 MiB at most, else -EMSGSIZE),
 * cut the same way; caller owns *out (free()); its length, or -errno. */
int fs_ctl_read_line(int fd, char *buf, size_t size);
int fs_ctl_read_reply(int fd, char **out);
#ifdef FERRYFS_FUZZ
/* main.c, tests/fuzz/fuzz_ctl.c only: the client's reading of a reply */
int fs_cli_reply_fuzz(const char *text);
#endif
/* The device number of the topmost mount at the absolute path @mnt (from
 * /proc/self/mountinfo). Errors: -ENOENT. */
int fs_mount_dev(const char *mnt, unsigned int *maj, unsigned int *min);
/* The mount points of every ferryfs mount this process sees; returns the
 * count (at most @max). */
int fs_ctl_list(char mounts[][4096], int max);

/* --- the status of a mount (status.c) ------------------------------- */

/*
 * What `ferryfs status` reports, filled by both modes (fs_status_get():
 * ops.c for what they share and write-through, fs_wb_status() in wb.c,
 * fs_cache_status() in read.c) and written as JSON by fs_status_json()
 * only. Strings point into the daemon's state or are constants, valid
 * while it runs; streams and conflict_paths are owned (free with
 * fs_status_release()).
 */
struct fs_stream_status {
	const char *state;   /* "idle", "flushing", "backoff", ... */
	bool via_agent;      /* through the agent now, not the share */
	uint64_t rate_bps, bytes, chunks, ops, errors, retries,
		remote_bytes_written;
	int last_error;      /* -errno, 0 if none */
};

struct fs_cache_status {
	bool on;             /* false: off, @off says why */
	const char *dir, *off;
	uint64_t bytes, max_bytes, hits, misses;
	unsigned int readahead_streams, readahead_pending;
	uint64_t readahead_bytes, readahead_errors, app_read_bytes,
		share_read_bytes;
};

struct fs_status {
	const char *mountpoint, *remote, *mode;
	const char *journal;      /* NULL in write-through mode */
	uint64_t journal_id;
	bool paused, drained, passthrough;
	int failed;               /* the journal's sticky -errno, or 0 */
	uint64_t pending_bytes, pending_files, pending_ops, uncommitted,
		staging_bytes, rate_bps, retries, errors, failed_ops, parked,
		conflicts, resent_bytes, flushed_bytes, write_waits,
		passthrough_opens, passthrough_requests, remote_bytes_read,
		remote_bytes_written, remote_ops;
	unsigned int passthrough_files;
	int64_t eta_s;            /* -1: unknown */
	int64_t uptime_s;
	unsigned int nstreams;
	struct fs_stream_status *streams;  /* owned */
	unsigned int nconflict_paths;
	char **conflict_paths;    /* owned; the most recent first */
	struct fs_cache_status cache;
};

struct fs;

/* Fill *st (ops.c). Errors: -ENOMEM (nothing to release then). */
int fs_status_get(struct fs *fs, struct fs_status *st);
void fs_status_release(struct fs_status *st);
/* The status reply, {"ok": true, ...}; NULL out of memory. Names are
 * escaped; a name that is not UTF-8 has its bad bytes as U+FFFD. */
char *fs_status_json(const struct fs_status *st);
/* The other replies: {"ok": false, "error": @msg}; {"ok": true}; and
 * that of "flush". NULL out of memory. */
char *fs_reply_error(const char *msg);
char *fs_reply_ok(void);
char *fs_reply_flush(uint64_t pending_bytes, uint64_t pending_ops);

/* --- the daemon's state, shared by ops.c and wb.c --------------------- */

#define FS_PT_MAX 64 /* files passing through at once (JNL_PT_PINS) */

struct fs_pt {
	uint64_t id;          /* the journal node */
	unsigned int handles; /* open handles passing through to it */
	unsigned int marking; /* releases marking it (fs_pt_close()) */
	int backing;          /* the kernel's backing id */
};

struct fs {
	struct rmt *rmt;         /* immutable after start */
	char *spec;              /* the remote as rmt_open() took it (a
				    directory made absolute); immutable */
	struct fs_itab *itab;    /* immutable after start */
	const struct fs_opts *o; /* immutable */
	bool is_root;            /* the daemon runs as uid 0 */
	bool use_fd;             /* the remote gives kernel fds: splice */
	bool warned_chown;       /* protected by nothing: a benign race */
	struct fuse_session *se; /* immutable after start */
	char *mnt_abs;           /* absolute mount point; immutable */
	struct fs_ctl *ctl;      /* the control socket, or NULL */
	struct fs_ready *ready;  /* ready.c's thread, or NULL */
	struct timespec started; /* immutable */
	/* write-back (wb.c): NULL in write-through mode; set before the
	 * session starts, immutable while it runs */
	struct jnl *jnl;
	struct jnl_flusher *fl;
	char *journal_dir;
	/* bytes of chunks in flight at the last crash, found by the first
	 * of the two opens of fs_run() (jnl_stats.resent_bytes) */
	unsigned long long resent_bytes;
	/* reads (read.c): NULL with -o cache=off or on a local share
	 * (cache_off says which) */
	struct cache *cache;
	const char *cache_off;
	struct cache_ra *ra;
	char *cache_dir;
	_Atomic uint64_t app_read_bytes, share_read_bytes;
	/* the root's last attributes from the share */
	pthread_mutex_t root_lock;
	struct stat root_st; /* protected by root_lock */
	/* directory snapshots open in the kernel (ops.c opendir, until
	 * releasedir or the end of the session) */
	pthread_mutex_t dirs_lock;
	struct fs_dir *dirs; /* protected by dirs_lock */
	/* -o passthrough (pt.c) */
	bool pt_offered;               /* the kernel's INIT offered it */
	_Atomic bool pt_on;            /* INIT was answered with it (and
					  no backing file refused since) */
	pthread_mutex_t pt_lock;
	struct fs_pt pt[FS_PT_MAX];    /* files passing through; pt_lock */
	unsigned int pt_n;             /* pt_lock */
	_Atomic unsigned int pt_nodes; /* pt_n, read without the lock */
	_Atomic uint64_t pt_opens;     /* opens that passed through */
	_Atomic uint64_t pt_requests;  /* FUSE requests read (pt_read()) */
};

/* ready.c: READY=1, STATUS= and STOPPING=1 to $NOTIFY_SOCKET (see
 * there). fs_ready_start() after the control socket, before the session
 * loop (0 and nothing started without NOTIFY_SOCKET; errors: -ENOMEM,
 * pthread_create()'s); fs_ready_stopping() once the loop has returned;
 * fs_ready_free() after the unmount. Both are no-ops if nothing started. */
struct fs_ready;
int fs_ready_start(struct fs *fs);
void fs_ready_stopping(struct fs *fs);
void fs_ready_free(struct fs *fs);

/* pt.c: passthrough of write-only copies into the journal (see there).
 * fs_pt_install() after the mount (0 if not asked for), fs_pt_init_reply()
 * from op_init(); fs_pt_open() before the reply to a write-back OPEN or
 * CREATE of registered handle @h, then fs_pt_reply_done() after it;
 * fs_pt_close() when @h is released (h->pt); fs_pt_mark(): mark what the
 * kernel wrote of node @id (0: of every file passing through) for the
 * flusher (fsync, ferryfs flush, unmount). */
int fs_pt_install(struct fs *fs);
void fs_pt_init_reply(struct fs *fs);
void fs_pt_open(struct fs *fs, struct fs_handle *h, const struct stat *st,
		int flags, struct fuse_file_info *fi);
void fs_pt_reply_done(void);
void fs_pt_close(struct fs *fs, struct fs_handle *h);
int fs_pt_mark(struct fs *fs, uint64_t id);

/* The remote path of @n (+ "/@name"), PATH_MAX bytes: fs_itab_path() in
 * write-through mode; in write-back mode from the nearest ancestor the
 * journal knows (jnl_node_rpath()), so it is where the remote has the
 * object now. Errors: as fs_itab_path(), -ENOENT (under a directory that
 * is not on the remote yet). */
int fs_rpath(struct fs *fs, struct fs_inode *n, const char *name, char *buf);

/* Write-back mode: the journal's names held (jnl_names_hold()) across the
 * resolution of a remote path and its use, so that the flusher moves no
 * name meanwhile. Never hold twice, never across a wait for the kernel
 * (a notify) or the flusher. Nothing in write-through mode. */
void fs_names_hold(struct fs *fs);
void fs_names_release(struct fs *fs);

/* wb.c: open the journal and start the flusher (fs_wb_start), stop both
 * (fs_wb_stop: says what stays pending), and the control commands. */
int fs_wb_open(struct fs *fs, bool check_only);
int fs_wb_start(struct fs *fs);
/* bind.c: is the remote the share the journal belongs to? (a marker of
 * it there, -o adopt makes one). -EXDEV with one line on stderr if not. */
int fs_bind_check(struct fs *fs);
void fs_wb_stop(struct fs *fs);
/* the last ref of a write-back handle (h->id) went: the journal drops the
 * data of its node if that has no name left (jnl_node_close()) */
void fs_wb_handle_gone(struct fs *fs, struct fs_handle *h);
int fs_wb_ctl(struct fs *fs, enum fs_ctl_cmd cmd, char **reply);
/* The write-back part of *st (fs_status_get()). Errors: -ENOMEM. */
int fs_wb_status(struct fs *fs, struct fs_status *st);

/* read.c: remote reads through the cache (see there) */
void fs_read_open(struct fs *fs, struct fs_handle *h, const char *rpath,
		  const struct stat *st, int flags);
void fs_read_release(struct fs_handle *h);
/* Reply to a FUSE read of @h: a cacheable handle's is spliced from the
 * block cache when every block of it is cached (after waiting for
 * read-ahead), else through a buffer (the cache, or the share for any
 * other handle); short only at the end of the file. */
struct fuse_req; /* fuse_req_t */
void fs_read_reply(struct fs *fs, struct fs_handle *h, struct fuse_req *req,
		   size_t size, off_t off);
int fs_cache_open(struct fs *fs);
int fs_cache_start(struct fs *fs);
void fs_cache_stop(struct fs *fs);
/* The cache part of the status (fs_status_get()). */
void fs_cache_status(struct fs *fs, struct fs_cache_status *cs);

/* the largest FUSE write and read, and the st_blksize of files (ops.c) */
#define FS_MAX_WRITE (1u << 20)
/* Default -o max_read: a read reply of 512 KiB and its header fit the
 * 1 MiB pipe an unprivileged process can have (pipe-max-size), so libfuse
 * splices it from the share's or the cache's file; a 1 MiB reply does not
 * and is copied through a buffer. */
#define FS_MAX_READ (512u << 10)
/* Default -o max_background: the kernel's default, 12 requests (6 MiB of
 * 512 KiB reads), leaves a cold sequential read waiting on FUSE round
 * trips; 64 read 2 GiB 20% faster here (tests/bench/RESULTS.md). */
#define FS_MAX_BACKGROUND 64u

#ifdef FUSE_LOWLEVEL_H_
/* What ops.c and wb.c call every FUSE argument. An inode number is the
 * struct fs_inode pointer (never persisted), FUSE_ROOT_ID the root. */
static inline struct fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static inline struct fs_inode *inode_of(struct fs *fs, fuse_ino_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return fs_itab_root(fs->itab);
	return (struct fs_inode *)(uintptr_t)ino;
}

static inline fuse_ino_t ino_of(struct fs *fs, struct fs_inode *n)
{
	if (n == fs_itab_root(fs->itab))
		return FUSE_ROOT_ID;
	return (fuse_ino_t)(uintptr_t)n;
}

static inline struct fs_handle *handle_of(struct fuse_file_info *fi)
{
	return (struct fs_handle *)(uintptr_t)fi->fh;
}

/* -errno inside, positive at the FUSE boundary (anything else: EIO) */
static inline void reply_err(fuse_req_t req, int rc)
{
	fuse_reply_err(req, rc < 0 ? -rc : EIO);
}

/* ops.c: the write-through operations (the baseline, and what wb.c uses
 * for the root's attributes and for objects the journal does not know) */
extern const struct fuse_lowlevel_ops fs_wt_ops;
/* wb.c: the table with the write-back operations over @wt */
void fs_wb_ops(struct fuse_lowlevel_ops *ops);
/* ops.c helpers wb.c shares */
void fs_fill_entry(struct fs *fs, struct fuse_entry_param *e,
		   struct fs_inode *n, const struct stat *st);
int fs_handle_put(struct fs *fs, struct fs_handle *h);
/* The @size bytes of a WRITE's @in: libfuse's own buffer when they are in
 * one (no SPLICE_READ: always), else a malloc'ed copy left in *copy for
 * the caller to free. NULL with -errno in *rc. */
const char *fs_write_bytes(struct fuse_bufvec *in, size_t size, char **copy,
			   ssize_t *rc);
/* The set-id bits of @mode (a node of group @gid) that a write or a
 * truncate (truncate(2), ftruncate(2), open(O_TRUNC)) by @req's caller
 * clears, as the VFS does on a local filesystem
 * (setattr_should_drop_suidgid()): none for a caller who may keep them
 * (CAP_FSETID: uid 0 here, the daemon sees no capabilities) or for what
 * is not a regular file; S_ISUID; S_ISGID if group execute is set or the
 * caller is not in @gid. The kernel leaves it to us: with
 * FUSE_HANDLE_KILLPRIV_V2 (pt.c) it sends no mode at all, without it a
 * mode by the older rule (S_ISGID only with group execute) and none at
 * an open(O_TRUNC) (FUSE_ATOMIC_O_TRUNC). */
mode_t fs_setid_kill(fuse_req_t req, mode_t mode, gid_t gid);
#endif

struct rmt_listing;
/* wb.c: the merged listing of directory @n, for ops.c's readdir: the
 * entries in @l (emptied first), and in *ids (realloc'ed, caller frees)
 * the journal id of each, 0 for a remote entry. */
int fs_wb_dir_fill(struct fs *fs, struct fs_inode *n, struct rmt_listing *l,
		   uint64_t **ids);

/* Check invariants 1-4; abort() with a BUG line if broken (tests). */
void fs_itab_assert_sane(struct fs_itab *t);

#endif
