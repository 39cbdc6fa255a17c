/*
 * remote.h - the one interface between ferryfs and a share.
 *
 * A `struct rmt` is a connection to one share; a `struct rmt_file` is a file
 * open on it. Everything is named by a *relative path* below the share's
 * root: "" is the root itself, "a/b" a name two levels down. Paths never
 * start with '/', never contain "." or ".." components or empty components;
 * rmt_path_check() enforces that and every entry point calls it, so a caller
 * bug cannot climb out of the share. Drivers resolve paths *without*
 * following symlinks anywhere (a symlink is data, returned by readlink), so
 * nothing outside the root is reachable through a remote.
 *
 * Drivers (remote/<name>.c) fill a `struct rmt_ops` table (remote_i.h):
 *   path  - any mounted directory (kernel NFS/SMB mount, local disk)
 *   nfs   - an NFS server spoken to by libnfs (remote/nfs.c)
 *   smb   - an SMB server spoken to by libsmbclient (remote/smb.c)
 *   agent - ferry-agent next to the share (remote/agent.c): used by the
 *           flusher only (it has no readdir), see agent/PROTOCOL.md
 *
 * Errors: every function returns 0 (or a byte count) on success and -errno
 * on failure. Each driver maps its foreign codes to errno in one function.
 * Unless said otherwise, on failure nothing was changed on the share.
 *
 * Threads: a struct rmt whose rmt_caps() has RMT_CAP_THREADSAFE may be used
 * by many threads at once; rmt_open() returns only such ones: a driver
 * whose connection is for one thread at a time (nfs) is wrapped in the
 * pool (remote/pool.c), which runs each call on one of N connections
 * (connections=N below). A struct rmt_file of a pool is bound to the
 * connection it was opened on: its calls run one at a time, from any
 * thread; to move one file over N streams, open it N times (the opens go
 * to the connections with the fewest files).
 *
 * Callers: fs/ (write-through operations), later journal/ (the flusher) and
 * cache/ (block fetches). This module knows nothing of FUSE or chunk state.
 */
#ifndef FERRYFS_REMOTE_H
#define FERRYFS_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>

struct rmt;
struct rmt_file;

enum rmt_caps {
	RMT_CAP_THREADSAFE = 1 << 0, /* one struct rmt serves all threads */
	RMT_CAP_XATTR = 1 << 1,      /* extended attributes are stored */
	RMT_CAP_FD = 1 << 2,         /* rmt_file_fd() gives a kernel fd */
	/* closing a written file can report errors the writes did not (a
	 * kernel NFS/SMB mount below): rmt_file_flush() is worth calling */
	RMT_CAP_CLOSE_ERRORS = 1 << 3,
	/* rmt_file_put() writes, checks and syncs a chunk in one exchange */
	RMT_CAP_PUT = 1 << 4,
	/* rmt_batch_begin() works: namespace calls go in one round trip */
	RMT_CAP_BATCH = 1 << 5,
	/* What the share can hold. Without one of these, the call gives what
	 * the driver answers (-EPERM, -EINVAL) and write-back refuses the
	 * same at once instead of taking it into the journal. */
	RMT_CAP_LINK = 1 << 6,     /* hard links */
	RMT_CAP_SYMLINK = 1 << 7,  /* symbolic links */
	RMT_CAP_SPECIAL = 1 << 8,  /* fifos and sockets */
	RMT_CAP_OWNER = 1 << 9,    /* any owner and group (else: the login's) */
	RMT_CAP_EXCHANGE = 1 << 10, /* rename with RMT_RENAME_EXCHANGE */
	/* names differing only in case are different names (without it, as
	 * on SMB: "a" and "A" are one name, the first one made) */
	RMT_CAP_CASE = 1 << 11,
	/* stat gives times to the nanosecond (without it, to 100 ns: SMB's
	 * FILETIME) */
	RMT_CAP_NSEC = 1 << 12,
	/* the share is a local disk's file system (ext4, xfs, tmpfs, ...):
	 * its files read as fast as the block cache's would, so fs/read.c
	 * reads them directly (FS-Cache, too, caches only network file
	 * systems); a network or FUSE file system below has it off */
	RMT_CAP_LOCAL = 1 << 13,
};

#define RMT_CAPS_POSIX                                                    \
	(RMT_CAP_LINK | RMT_CAP_SYMLINK | RMT_CAP_SPECIAL | RMT_CAP_OWNER | \
	 RMT_CAP_EXCHANGE | RMT_CAP_CASE | RMT_CAP_NSEC)

/* Which fields of a struct rmt_setattr are applied. */
enum rmt_set {
	RMT_SET_MODE = 1 << 0,
	RMT_SET_UID = 1 << 1,
	RMT_SET_GID = 1 << 2,
	RMT_SET_SIZE = 1 << 3,
	RMT_SET_ATIME = 1 << 4,
	RMT_SET_MTIME = 1 << 5,
};

struct rmt_setattr {
	unsigned int set; /* enum rmt_set bits */
	mode_t mode;      /* permission bits only (07777) */
	uid_t uid;
	gid_t gid;
	off_t size;
	/* tv_nsec may be UTIME_NOW; an unset time is left alone */
	struct timespec atime, mtime;
};

/* Flags for rmt_rename(), same values as renameat2(2). */
enum rmt_rename_flags {
	RMT_RENAME_NOREPLACE = 1 << 0,
	RMT_RENAME_EXCHANGE = 1 << 1,
};

/*
 * Called once per directory entry by rmt_readdir(), "." and ".." excluded.
 * @st is the entry's lstat, or NULL if it vanished between listing and stat.
 * Return 0 to go on, or a negative errno to stop; rmt_readdir() then returns
 * that value.
 */
typedef int (*rmt_dirent_fn)(const char *name, const struct stat *st,
			     void *arg);

/*
 * Open a share given as a string: an existing directory (the path driver)
 * or nfs://HOST/EXPORT[/path][?version=3|4&uid=N&gid=N&nfsport=N&mountport=N]
 * (the nfs driver; remote/nfs.c says what each key does); later
 * "smb://...". @opts is a comma-separated option string, may be NULL. These
 * options are taken by rmt_open() itself; all others go to the driver:
 *
 *   connections=N            a driver without RMT_CAP_THREADSAFE gets N
 *                            connections (1..64, default 4), one per
 *                            stream; ignored for the others
 *   remote_rate=RATE         all data to and from the share (bytes read,
 *                            written and copied), all threads and all
 *                            connections of this process with the same
 *                            RATE together, is capped at RATE bytes/s
 *   remote_stream_rate=RATE  each stream is capped at RATE; a stream is one
 *                            calling thread (the flusher runs one per thread)
 *   remote_latency=DURATION  every operation first waits DURATION
 *   remote_fault=FILE        while FILE (an absolute path) exists, every
 *                            operation fails with -EIO, or with the errno
 *                            named in the file ("ENOSPC", "ETIMEDOUT", ...)
 *
 * RATE is a number with an optional suffix K (or k), M, G (x1000) or Ki, Mi,
 * Gi (x1024): "110M", "1.5Gi". DURATION is a number with a unit ns, us, ms
 * or s: "500us", "0.5ms" ("0" alone is allowed). A later option overrides
 * an earlier one of the same name. With any of them, the share is wrapped
 * in the throttle driver (remote/throttle.c), a simulation aid that lets
 * the gain of parallel streams be measured without a network; its rmt_id()
 * is the share's own, its rmt_caps() the share's without RMT_CAP_FD.
 *
 * Errors: -ENOENT, -ENOTDIR, -EACCES (the root), -EINVAL (a malformed spec,
 * a malformed or unknown option), -EPROTONOSUPPORT (a scheme with no
 * driver), -ENOMEM; for nfs:// also the mount's errors (the server's,
 * -EACCES or -ENOENT; -EIO; -ETIMEDOUT after 30 s without an answer).
 * Caller owns *out; free with rmt_close().
 */
int rmt_open(const char *spec, const char *opts, struct rmt **out);

/*
 * @opts (may be NULL) for a stream of its own: a flush or read-ahead
 * stream is one thread, so one connection, whatever connections=N the
 * mount asked for its own pool (a later option overrides an earlier one,
 * so "connections=1" goes last). 0, or -ENOMEM. Caller frees *out.
 */
int rmt_opts_one_connection(const char *opts, char **out);

/* Close a share; every struct rmt_file of it must be closed first. NULL ok. */
void rmt_close(struct rmt *r);

/* enum rmt_caps of this share. */
unsigned int rmt_caps(const struct rmt *r);

/* A stable string naming the share (driver and canonical location), e.g.
 * "path:/srv/nas". Owned by r. */
const char *rmt_id(const struct rmt *r);

/* A rate or size as the options take it: digits (a fraction allowed) and
 * one of "", K, M, G (powers of 1000), Ki, Mi, Gi (of 1024); at least 1.
 * Errors: -EINVAL. */
int rmt_parse_rate(const char *s, uint64_t *out);

/*
 * What went through a struct rmt since rmt_open(), counted in remote.c for
 * every driver. Each field is read atomically, but not all of them at one
 * instant; any thread may call rmt_counters() at any time.
 */
struct rmt_counters {
	uint64_t bytes_read;    /* returned by rmt_file_pread() */
	uint64_t bytes_written; /* written by rmt_file_pwrite() */
	/* copied by the driver itself in rmt_file_copy(); a copy that falls
	 * back to reading and writing through this process counts in
	 * bytes_read and bytes_written instead */
	uint64_t bytes_copied;
	uint64_t ops;    /* calls that reached the driver, failed ones too */
	uint64_t faults; /* failures injected by remote_fault (rmt_open) */
};

void rmt_counters(const struct rmt *r, struct rmt_counters *out);
/* Count @n bytes read by a caller through rmt_file_fd() itself (splice),
 * so rmt_counters() still sees every byte. */
void rmt_file_count_read(struct rmt_file *f, uint64_t n);
/* The same for bytes written through rmt_file_fd(). */
void rmt_file_count_write(struct rmt_file *f, uint64_t n);

/*
 * Check a relative path: 0, or -EINVAL for NULL, "/x", "a//b", "a/./b",
 * "..", "a/../b", a trailing '/'; -ENAMETOOLONG for a path of PATH_MAX or
 * more or a component longer than NAME_MAX. The root is "".
 */
int rmt_path_check(const char *path);

/* --- names ------------------------------------------------------------- */

/*
 * 0 if the share can hold an entry named @name (one component, checked by
 * rmt_path_check already), else what creating it would answer: -EINVAL
 * (a character the share refuses: SMB's \ : * ? " < > | and controls),
 * -EILSEQ (not UTF-8 where names are Unicode). No I/O: write-back asks
 * before it takes a new name into the journal.
 */
int rmt_name_check(struct rmt *r, const char *name);

/* lstat(2) of path: symlinks are not followed. */
int rmt_stat(struct rmt *r, const char *path, struct stat *st);
int rmt_statfs(struct rmt *r, struct statvfs *sv);

/* Enumerate the directory at path (see rmt_dirent_fn). The share's root
 * never lists RMT_RESERVED. */
int rmt_readdir(struct rmt *r, const char *path, rmt_dirent_fn fn, void *arg);

/*
 * The name ferryfs keeps at the root of a share for itself: a directory
 * with a marker per journal bound to the share (fs/bind.c). It is hidden
 * from every caller: rmt_readdir() of the root skips it, and every call
 * on it or below it answers -ENOENT, or -EPERM for a call that would make
 * it (mkdir, create, the target of a rename or link). Only the two
 * functions below reach it.
 */
#define RMT_RESERVED ".ferryfs"

/* Read the marker RMT_RESERVED/@name into @buf (at most @size bytes).
 * Returns its length; -ENOENT if there is none. */
ssize_t rmt_marker_get(struct rmt *r, const char *name, char *buf,
		       size_t size);
/* Write @text as the marker RMT_RESERVED/@name (the directory made if
 * missing), synced with its directory. -EACCES, -EROFS, -EPERM: the share
 * cannot be written there. */
int rmt_marker_put(struct rmt *r, const char *name, const char *text);

/* A directory listing held in memory (a snapshot): see rmt_list(). */
struct rmt_dirent {
	char *name;
	bool have_st; /* false: vanished between listing and stat */
	struct stat st;
};

struct rmt_listing {
	struct rmt_dirent *e;
	size_t n, cap;
};

/*
 * Read the whole directory at path into @l, which is emptied first (its
 * array is reused). On error @l holds what was read before it; release
 * it with rmt_listing_release() either way. Errors as rmt_readdir().
 */
int rmt_list(struct rmt *r, const char *path, struct rmt_listing *l);
/* Free the names and the array; @l is empty after. */
void rmt_listing_release(struct rmt_listing *l);

int rmt_mkdir(struct rmt *r, const char *path, mode_t mode);
/* Make the entries of the directory at path durable (fsync(2) of it). */
int rmt_syncdir(struct rmt *r, const char *path);
int rmt_rmdir(struct rmt *r, const char *path);
int rmt_unlink(struct rmt *r, const char *path);
/* Only fifos and sockets: devices, and regular files (use rmt_file_open
 * with O_CREAT|O_EXCL), are refused with -EPERM. */
int rmt_mknod(struct rmt *r, const char *path, mode_t mode, dev_t rdev);
int rmt_symlink(struct rmt *r, const char *target, const char *path);
/* Copies at most size-1 bytes and a NUL; returns the target's length,
 * or -ENAMETOOLONG if it did not fit. */
int rmt_readlink(struct rmt *r, const char *path, char *buf, size_t size);
int rmt_link(struct rmt *r, const char *from, const char *to);
/* @flags: enum rmt_rename_flags. */
int rmt_rename(struct rmt *r, const char *from, const char *to,
	       unsigned int flags);

/*
 * Change attributes of path, or of @f if not NULL (then path may be NULL:
 * an unlinked but open file). Fields are applied in the order size,
 * uid/gid, mode, times: a chown clears the setuid and setgid bits (even
 * root's), so the mode asked comes after it and stays, and set times
 * come last and stay. A symlink's own times and
 * owner can be set; its mode cannot (-EOPNOTSUPP).
 * On failure the fields before the failing one may have been applied.
 */
int rmt_setattr(struct rmt *r, const char *path, struct rmt_file *f,
		const struct rmt_setattr *sa);

/* Extended attributes, with getxattr(2)'s size-0 probe semantics:
 * return the size or -ERANGE / -ENODATA / -EOPNOTSUPP. */
ssize_t rmt_getxattr(struct rmt *r, const char *path, const char *name,
		     void *buf, size_t size);
int rmt_setxattr(struct rmt *r, const char *path, const char *name,
		 const void *value, size_t size, int flags);
ssize_t rmt_listxattr(struct rmt *r, const char *path, char *buf, size_t size);
int rmt_removexattr(struct rmt *r, const char *path, const char *name);

/* --- files ------------------------------------------------------------- */

/*
 * Open a regular file: @flags are open(2)'s (O_ACCMODE, O_CREAT, O_EXCL,
 * O_TRUNC, O_APPEND; O_NOFOLLOW is implied, others ignored); @mode is used
 * with O_CREAT. Caller owns *out; close with rmt_file_close().
 * Errors as open(2), plus -ELOOP for a symlink, -EISDIR for a directory,
 * -EINVAL for a fifo, socket or device.
 */
int rmt_file_open(struct rmt *r, const char *path, int flags, mode_t mode,
		  struct rmt_file **out);
/* Close; returns the close error (deferred write errors) if any. NULL ok. */
int rmt_file_close(struct rmt_file *f);

ssize_t rmt_file_pread(struct rmt_file *f, void *buf, size_t len, off_t off);
/* rmt_file_pread() until @len bytes or the file's end: the count, short
 * only at the end, or the first -errno. */
ssize_t rmt_file_pread_all(struct rmt_file *f, void *buf, size_t len,
			   off_t off);
/* Writes all of buf or fails; returns len. Ignores O_APPEND: offsets are
 * explicit (the caller resolves appends). */
ssize_t rmt_file_pwrite(struct rmt_file *f, const void *buf, size_t len,
			off_t off);
int rmt_file_stat(struct rmt_file *f, struct stat *st);
int rmt_file_fsync(struct rmt_file *f, bool datasync);
/* close(2) of one descriptor of the file: report deferred write errors
 * (an NFS/SMB kernel mount below reports them at close). */
int rmt_file_flush(struct rmt_file *f);
/* fallocate(2): @mode is FALLOC_FL_* (KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE). */
int rmt_file_fallocate(struct rmt_file *f, int mode, off_t off, off_t len);
/* lseek(2) for SEEK_DATA / SEEK_HOLE; returns the offset, -ENXIO past the
 * data, or -EINVAL for any other whence. */
off_t rmt_file_seek(struct rmt_file *f, off_t off, int whence);
/*
 * Copy len bytes between two files of the same share, server-side where the
 * driver can, else by reading and writing through this process. Returns the
 * byte count copied (short only at the source's EOF); an error after
 * partial progress is returned as the error. Overlapping ranges of one file
 * are refused with -EINVAL.
 */
ssize_t rmt_file_copy(struct rmt_file *in, off_t off_in, struct rmt_file *out,
		      off_t off_out, size_t len);
/* The kernel fd behind f (RMT_CAP_FD only, for splice), else -EOPNOTSUPP. */
int rmt_file_fd(const struct rmt_file *f);

/*
 * RMT_CAP_PUT only (else -EOPNOTSUPP): make the @len bytes at @off, whose
 * SHA-256 is @sha, the file's and durable (as pwrite + fdatasync), in one
 * exchange; the driver may skip sending bytes the share already holds
 * (same SHA-256). Past the file's end, blocks of zeros may stay holes.
 * Returns the bytes sent over the wire (0: they were there already), or
 * -errno (-EIO: what arrived did not match @sha).
 */
ssize_t rmt_file_put(struct rmt_file *f, const void *buf, size_t len,
		     off_t off, const unsigned char sha[32]);
/* The same for the existing regular file at @path, opened and closed for
 * it on the share's side (no round trip of its own): RMT_CAP_PUT only.
 * In a batch (below) it is queued when the driver can carry @len bytes
 * there (else -EAGAIN). */
ssize_t rmt_put_path(struct rmt *r, const char *path, const void *buf,
		     size_t len, off_t off, const unsigned char sha[32]);

/*
 * Batches (RMT_CAP_BATCH only, else -EOPNOTSUPP). Between
 * rmt_batch_begin() and rmt_batch_end(), calls of this thread on @r are
 * queued and return 0 at once: mkdir, rmdir, unlink, mknod, symlink, link,
 * rename, setattr, file_open (its file may be used by later queued calls),
 * file_close, put_path (small ones); any other call returns -EAGAIN and is
 * not queued.
 * rmt_batch_mark() starts a group: rmt_batch_end() sends the batch (one
 * round trip), the share carries the calls out in order, skipping the rest
 * of a group after its first failure, and rc[i] is the result of group i
 * (0 or its first -errno), for at most @max groups; it returns the number
 * of groups, or -errno if the batch as a whole failed (then nothing is
 * known of any group: redo them one by one).
 */
int rmt_batch_begin(struct rmt *r);
void rmt_batch_mark(struct rmt *r);
int rmt_batch_end(struct rmt *r, int *rc, unsigned int max);

#endif
