/*
 * ops.c - the FUSE low-level operations of ferryfs, and the daemon loop.
 *
 * Here every operation goes straight through to the remote (write-through).
 *
 * Names: the kernel speaks fuse_ino_t; an inode is a struct fs_inode pointer
 * (never persisted: the kernel forgets them all at unmount) and the root is
 * FUSE_ROOT_ID. Each operation turns its inode into a remote path with
 * fs_rpath() (fs_itab_path() here); the remote interface is path based
 * because NFS, SMB and the agent are.
 *
 * Rules:
 *  1. An operation that changes an inode by path first checks that the path
 *     still leads to the same remote object ((dev, ino) equal); if another
 *     writer of the share replaced it, the operation fails with ESTALE
 *     instead of touching the wrong file (checked_path()). Open files use
 *     their handle, not the path. Reads of names (readlink, getxattr,
 *     listxattr) skip the check: at worst they show the new object.
 *  2. Objects created through the mount belong to the calling user and
 *     group (the directory's group under a setgid directory), when the
 *     daemon runs as root; the remote keeps what it set otherwise.
 *  3. Errors are -errno inside; fuse_reply_err(req, -rc) converts them at
 *     the FUSE boundary only. No lock is held across fuse_reply_*() or a
 *     remote call.
 *  4. Locks (flock, fcntl) are left to the kernel: they work between the
 *     processes of this machine and are not sent to the share.
 *  5. A file opened write-only (cp's, rsync's, tar's destination) is opened
 *     in FUSE direct-I/O mode: the kernel hands the application's bytes to
 *     us without copying them into its page cache first and without asking
 *     for security.capability on every write(2). Measured: a 1 GiB cp into
 *     the mount 0.44-0.54 s instead of 1.9-4.3 s (tests/bench/RESULTS.md).
 *     Nothing is lost: a write-only descriptor cannot be mmap'ed shared,
 *     and the pages other descriptors of the file cached are dropped after
 *     each direct write (write_direct_done()). The kernel then leaves
 *     clearing setuid/setgid on write to us (clear_suid()), as it does at
 *     an open(O_TRUNC) (FUSE_ATOMIC_O_TRUNC); at a truncate it sends a
 *     mode by an older rule, which fs_setid_kill() completes.
 *
 * Write-back over the journal (the default) is fs/wb.c: its operation
 * table starts from this one (fs_wt_ops) and replaces what the journal
 * serves; it calls these write-through operations for the objects the
 * journal does not know (at fs_rpath(), where the share has them now) and
 * for the root's own attributes. -o writeback=off uses this table alone:
 * the baseline.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "fs.h"
#include "fs_i.h"
#include "log.h"
#include "remote.h"

_Static_assert(sizeof(fuse_ino_t) >= sizeof(uintptr_t),
	       "fuse_ino_t must hold a pointer");

#define FS_READAHEAD_KB 8192u /* see set_readahead() */

/* A directory listing, snapshot at opendir (and at rewind). */
struct fs_dir {
	struct rmt_listing l;
	uint64_t *ids; /* write-back: journal id of entry i, 0 if none */
	bool listed;   /* a readdir has run: offset 0 again means rewind */
	uint64_t since; /* fs_itab_moves() before the listing was taken */
	struct fs_dir *prev, *next; /* fs->dirs; protected by fs->dirs_lock */
};

static bool same_object(const struct fs_inode *n, const struct stat *st)
{
	return n->dev == (uint64_t)st->st_dev && n->ino == (uint64_t)st->st_ino;
}

/* Close the remote file of a handle out of the table, and free it. */
static int handle_free(struct fs_handle *h)
{
	int rc = rmt_file_close(h->file);

	fs_read_release(h);
	pthread_mutex_destroy(&h->lock);
	free(h);
	return rc;
}

/* Drop a handle ref; the last one closes the remote file. */
int fs_handle_put(struct fs *fs, struct fs_handle *h)
{
	if (!fs_itab_handle_put(fs->itab, h))
		return 0;
	if (h->pt)
		fs_pt_close(fs, h);
	if (h->id)
		fs_wb_handle_gone(fs, h);
	return handle_free(h);
}

/* The remote path of ino (+ "/name"); PATH_MAX buffer. */
static int path_of(struct fs *fs, fuse_ino_t ino, const char *name,
		   char *buf)
{
	return fs_rpath(fs, inode_of(fs, ino), name, buf);
}

/*
 * Attributes of an inode: through the open file if the kernel gave one,
 * else by path with the identity check (rule 1), else (unlinked but open)
 * through any open handle.
 */
static int inode_stat(struct fs *fs, struct fs_inode *n,
		      struct fuse_file_info *fi, struct stat *st)
{
	char path[PATH_MAX];
	struct fs_handle *h = NULL;
	int rc;

	if (fi && fi->fh)
		return rmt_file_stat(handle_of(fi)->file, st);
	rc = fs_rpath(fs, n, NULL, path);
	if (rc == 0) {
		rc = rmt_stat(fs->rmt, path, st);
		if (rc == 0 && !same_object(n, st))
			rc = -ESTALE;
	}
	if (rc == -ESTALE || rc == -ENOENT) {
		h = fs_itab_handle_any(fs->itab, n);
		if (h) {
			rc = rmt_file_stat(h->file, st);
			fs_handle_put(fs, h);
		}
	}
	return rc;
}

/* Path of an inode whose remote object must still be the same one. */
static int checked_path(struct fs *fs, struct fs_inode *n, char *path)
{
	struct stat st;
	int rc = fs_rpath(fs, n, NULL, path);

	if (rc < 0)
		return rc;
	rc = rmt_stat(fs->rmt, path, &st);
	if (rc == 0 && !same_object(n, &st))
		rc = -ESTALE;
	return rc;
}

/*
 * What the kernel shows of a remote stat. st_blksize is the preferred I/O
 * size programs read: cp, dd and friends then move 1 MiB per call, which
 * the kernel sends as one FUSE request (max_write), instead of 128 KiB.
 */
static void attr_fixup(struct stat *st)
{
	if (S_ISREG(st->st_mode) && st->st_blksize < (blksize_t)FS_MAX_WRITE)
		st->st_blksize = FS_MAX_WRITE;
}

static void reply_attr(fuse_req_t req, struct stat *st)
{
	attr_fixup(st);
	fuse_reply_attr(req, st, fs_of(req)->o->attr_timeout);
}

void fs_fill_entry(struct fs *fs, struct fuse_entry_param *e,
		   struct fs_inode *n, const struct stat *st)
{
	memset(e, 0, sizeof(*e));
	e->ino = ino_of(fs, n);
	e->attr = *st;
	attr_fixup(&e->attr);
	e->attr_timeout = fs->o->attr_timeout;
	e->entry_timeout = fs->o->entry_timeout;
}

/* Record (parent, name) -> st with one lookup and reply the entry. */
static void reply_new_entry(fuse_req_t req, struct fs_inode *parent,
			    const char *name, const struct stat *st)
{
	struct fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct fs_inode *n;
	int rc = fs_itab_lookup(fs->itab, parent, name, st, 1, &n);

	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	fs_fill_entry(fs, &e, n, st);
	if (fuse_reply_entry(req, &e) != 0)
		fs_itab_forget(fs->itab, n, 1); /* the kernel never got it */
}

/*
 * Rule 2: give a new object to the caller. Under a setgid directory the
 * group is the directory's, which the remote already set.
 */
static int give_to_caller(struct fs *fs, fuse_req_t req, const char *parent,
			  const char *path, struct rmt_file *f, mode_t mode)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct rmt_setattr sa = { 0 };
	struct stat pst;
	int rc;

	if (!fs->is_root || (ctx->uid == 0 && ctx->gid == 0))
		return 0; /* root's own objects are root's already */
	if (ctx->uid != 0) {
		sa.set |= RMT_SET_UID;
		sa.uid = ctx->uid;
	}
	if (ctx->gid != 0) {
		rc = rmt_stat(fs->rmt, parent, &pst);
		if (rc < 0)
			return rc;
		if (!(pst.st_mode & S_ISGID)) {
			sa.set |= RMT_SET_GID;
			sa.gid = ctx->gid;
		}
	}
	if (!sa.set)
		return 0;
	rc = rmt_setattr(fs->rmt, f ? NULL : path, f, &sa);
	if (rc < 0) {
		if (!fs->warned_chown) {
			fs->warned_chown = true;
			LOG_WARN("cannot give '%s' to uid %u gid %u: %s; "
				 "the share keeps its own owner",
				 path, (unsigned)ctx->uid, (unsigned)ctx->gid,
				 strerror(-rc));
		}
		return 0;
	}
	/* chown clears setuid/setgid of a regular file: put them back */
	if (S_ISREG(mode) && (mode & (S_ISUID | S_ISGID))) {
		sa.set = RMT_SET_MODE;
		sa.mode = mode & 07777;
		rc = rmt_setattr(fs->rmt, f ? NULL : path, f, &sa);
	}
	return rc;
}

/* --- lookup and attributes -------------------------------------------- */

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fs *fs = userdata;

	if (conn->capable & FUSE_CAP_EXPORT_SUPPORT)
		conn->want &= ~FUSE_CAP_EXPORT_SUPPORT;
	/* reads: splice the share's or the block cache's file pages into
	 * /dev/fuse, saving a copy. Not SPLICE_READ: it needs a pipe of
	 * max_write + a header, above the default pipe-max-size, so libfuse
	 * would fall back anyway. */
	if ((fs->use_fd || fs->cache) &&
	    (conn->capable & FUSE_CAP_SPLICE_WRITE))
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	conn->want &= ~FUSE_CAP_SPLICE_READ;

	/* locks stay in the kernel (rule 4) */
	conn->want &= ~(FUSE_CAP_FLOCK_LOCKS | FUSE_CAP_POSIX_LOCKS);
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	conn->max_write = FS_MAX_WRITE;
	conn->max_read = fs->o->max_read; /* = the mount option (opts.c) */
	conn->max_background = fs->o->max_background;
	conn->congestion_threshold = fs->o->max_background * 3 / 4;
	if (!conn->congestion_threshold)
		conn->congestion_threshold = 1;
	conn->max_readahead = FS_READAHEAD_KB * 1024; /* see set_readahead() */
	conn->time_gran = 1;
	fs_pt_init_reply(fs); /* pt.c: passthrough, if asked for */
}

/* The remote's answer to a LOOKUP, asked again while the object found
 * was renamed or unlinked meanwhile (fs_itab_lookup_since()). */
static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fuse_entry_param e;
	char path[PATH_MAX];
	struct fs_inode *n;
	struct stat st;
	int rc, tries = 0;

	do {
		uint64_t since = ++tries < FS_LOOKUP_TRIES
					 ? fs_itab_moves(fs->itab)
					 : FS_ITAB_ANY;

		rc = path_of(fs, parent, name, path);
		if (rc == 0)
			rc = rmt_stat(fs->rmt, path, &st);
		if (rc == 0)
			rc = fs_itab_lookup_since(fs->itab,
						  inode_of(fs, parent), name,
						  &st, 1, since, &n);
	} while (rc == -EAGAIN);
	if (rc == -ENOENT && fs->o->negative_timeout > 0) {
		e = (struct fuse_entry_param){
			.ino = 0,
			.entry_timeout = fs->o->negative_timeout,
		};
		fuse_reply_entry(req, &e);
		return;
	}
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	fs_fill_entry(fs, &e, n, &st);
	if (fuse_reply_entry(req, &e) != 0)
		fs_itab_forget(fs->itab, n, 1); /* the kernel never got it */
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct fs *fs = fs_of(req);

	fs_itab_forget(fs->itab, inode_of(fs, ino), nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count,
			    struct fuse_forget_data *forgets)
{
	struct fs *fs = fs_of(req);
	size_t i;

	for (i = 0; i < count; i++)
		fs_itab_forget(fs->itab, inode_of(fs, forgets[i].ino),
			       forgets[i].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct stat st;
	int rc = inode_stat(fs, inode_of(fs, ino), fi, &st);

	if (rc < 0)
		reply_err(req, rc);
	else
		reply_attr(req, &st);
}

/* Whether @req's caller is in group @gid (its fsgid or a supplementary
 * group). If its groups cannot be read, yes: the bit stays, as before. */
static bool caller_in_group(fuse_req_t req, gid_t gid)
{
	gid_t some[64], *list = some;
	int n, cap = 64;
	bool in = false;

	if (fuse_req_ctx(req)->gid == gid)
		return true;
	for (;;) {
		n = fuse_req_getgroups(req, cap, list);
		if (n < 0) {
			in = true;
			break;
		}
		if (n <= cap) {
			for (int i = 0; i < n && !in; i++)
				in = list[i] == gid;
			break;
		}
		if (list != some)
			free(list);
		cap = n;
		list = malloc((size_t)cap * sizeof(*list));
		if (!list)
			return true;
	}
	if (list != some)
		free(list);
	return in;
}

mode_t fs_setid_kill(fuse_req_t req, mode_t mode, gid_t gid)
{
	mode_t kill = 0;

	if (fuse_req_ctx(req)->uid == 0 || !S_ISREG(mode))
		return 0;
	if (mode & S_ISUID)
		kill |= S_ISUID;
	if ((mode & S_ISGID) &&
	    ((mode & S_IXGRP) || !caller_in_group(req, gid)))
		kill |= S_ISGID;
	return kill;
}

/*
 * A write or truncate by a user other than root clears setuid, and setgid
 * as fs_setid_kill() says, as the kernel does for its own writes; our
 * writes to the share are root's, which keep them. @st: the file's
 * attributes now, its new mode on return.
 */
static int clear_suid(struct fs *fs, fuse_req_t req, struct rmt_file *f,
		      struct stat *st)
{
	struct rmt_setattr sa = { .set = RMT_SET_MODE };
	mode_t kill;
	int rc;

	kill = fs_setid_kill(req, st->st_mode, st->st_gid);
	if (!kill)
		return 0;
	sa.mode = st->st_mode & 07777 & ~kill;
	rc = rmt_setattr(fs->rmt, NULL, f, &sa);
	if (rc == 0)
		st->st_mode &= ~kill;
	return rc;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		       int to_set, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	struct rmt_setattr sa = { 0 };
	struct rmt_file *f = NULL;
	struct fs_handle *borrowed = NULL;
	char path[PATH_MAX];
	const char *p = NULL;
	struct stat st;
	mode_t kill;
	int rc;

	if (to_set & FUSE_SET_ATTR_MODE) {
		sa.set |= RMT_SET_MODE;
		sa.mode = attr->st_mode & 07777;
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		sa.set |= RMT_SET_UID;
		sa.uid = attr->st_uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		sa.set |= RMT_SET_GID;
		sa.gid = attr->st_gid;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		sa.set |= RMT_SET_SIZE;
		sa.size = attr->st_size;
	}
	if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
		sa.set |= RMT_SET_ATIME;
		sa.atime.tv_nsec = UTIME_NOW;
	} else if (to_set & FUSE_SET_ATTR_ATIME) {
		sa.set |= RMT_SET_ATIME;
		sa.atime = attr->st_atim;
	}
	if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
		sa.set |= RMT_SET_MTIME;
		sa.mtime.tv_nsec = UTIME_NOW;
	} else if (to_set & FUSE_SET_ATTR_MTIME) {
		sa.set |= RMT_SET_MTIME;
		sa.mtime = attr->st_mtim;
	}

	if (fi && fi->fh) {
		f = handle_of(fi)->file;
	} else if (!(sa.set & RMT_SET_SIZE) &&
		   (borrowed = fs_itab_handle_any(fs->itab, n))) {
		/* open here (cp -a sets the times before it closes): the
		 * handle is this object, no path to resolve and check. Not
		 * for truncate(2): the handle may be read-only. */
		f = borrowed->file;
	} else {
		rc = checked_path(fs, n, path);
		if (rc == 0) {
			p = path;
		} else if (rc == -ESTALE || rc == -ENOENT) {
			/* unlinked but open: work on the open file */
			borrowed = fs_itab_handle_any(fs->itab, n);
			if (!borrowed)
				goto out_err;
			f = borrowed->file;
		} else {
			goto out_err;
		}
	}
	rc = sa.set ? rmt_setattr(fs->rmt, p, f, &sa) : 0;
	if (rc == 0)
		rc = f ? rmt_file_stat(f, &st) : rmt_stat(fs->rmt, p, &st);
	/* a truncate: the set-id bits go as on a local fs (fs_setid_kill();
	 * a mode the kernel sent with it followed an older rule) */
	if (rc == 0 && (sa.set & RMT_SET_SIZE) &&
	    (kill = fs_setid_kill(req, st.st_mode, st.st_gid))) {
		struct rmt_setattr ms = { .set = RMT_SET_MODE,
					  .mode = st.st_mode & 07777 & ~kill };

		rc = rmt_setattr(fs->rmt, p, f, &ms);
		st.st_mode &= ~kill;
	}
	if (borrowed)
		fs_handle_put(fs, borrowed);
	if (rc < 0)
		goto out_err;
	if (sa.set & RMT_SET_SIZE)
		fs_itab_cache_update(fs->itab, n, &st);
	reply_attr(req, &st);
	return;
out_err:
	reply_err(req, rc);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX], target[PATH_MAX];
	int rc = path_of(fs, ino, NULL, path);

	if (rc == 0)
		rc = rmt_readlink(fs->rmt, path, target, sizeof(target));
	if (rc < 0)
		reply_err(req, rc);
	else
		fuse_reply_readlink(req, target);
}

/* --- namespace ------------------------------------------------------- */

/* After a create-type call succeeded at path: owner, stat, reply. */
static void finish_create(fuse_req_t req, fuse_ino_t parent, const char *name,
			  const char *path, mode_t mode)
{
	struct fs *fs = fs_of(req);
	char ppath[PATH_MAX];
	struct stat st;
	int rc = path_of(fs, parent, NULL, ppath);

	if (rc == 0)
		rc = give_to_caller(fs, req, ppath, path, NULL, mode);
	if (rc == 0)
		rc = rmt_stat(fs->rmt, path, &st);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	reply_new_entry(req, inode_of(fs, parent), name, &st);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode, dev_t rdev)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];
	int rc = path_of(fs, parent, name, path);

	if (rc == 0) {
		if (S_ISREG(mode)) {
			struct rmt_file *f;

			rc = rmt_file_open(fs->rmt, path,
					   O_CREAT | O_EXCL | O_WRONLY,
					   mode & 07777, &f);
			if (rc == 0)
				rc = rmt_file_close(f);
		} else if (S_ISFIFO(mode) || S_ISSOCK(mode)) {
			rc = rmt_mknod(fs->rmt, path, mode, rdev);
		} else {
			rc = -EPERM; /* no device nodes on a share */
		}
	}
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	finish_create(req, parent, name, path, mode);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];
	int rc = path_of(fs, parent, name, path);

	if (rc == 0)
		rc = rmt_mkdir(fs->rmt, path, mode & 07777);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	finish_create(req, parent, name, path, S_IFDIR | mode);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		       const char *name)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];
	int rc = path_of(fs, parent, name, path);

	if (rc == 0)
		rc = rmt_symlink(fs->rmt, link, path);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	finish_create(req, parent, name, path, S_IFLNK | 0777);
}

/* unlink or rmdir (dir = true) */
static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name,
			bool dir)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];
	struct stat st;
	int rc = path_of(fs, parent, name, path);

	if (rc == 0)
		rc = rmt_stat(fs->rmt, path, &st);
	if (rc == 0)
		rc = dir ? rmt_rmdir(fs->rmt, path) : rmt_unlink(fs->rmt, path);
	if (rc == 0)
		fs_itab_unlink(fs->itab, inode_of(fs, parent), name, st.st_dev,
			       st.st_ino);
	fuse_reply_err(req, -rc);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, false);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, true);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname,
		      unsigned int flags)
{
	struct fs *fs = fs_of(req);
	char from[PATH_MAX], to[PATH_MAX];
	struct stat k1, k2;
	unsigned int rflags = 0;
	bool have_k2;
	int rc;

	if (flags & ~(unsigned int)(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
		fuse_reply_err(req, EINVAL); /* RENAME_WHITEOUT */
		return;
	}
	if (flags & RENAME_NOREPLACE)
		rflags |= RMT_RENAME_NOREPLACE;
	if (flags & RENAME_EXCHANGE)
		rflags |= RMT_RENAME_EXCHANGE;
	rc = path_of(fs, parent, name, from);
	if (rc == 0)
		rc = path_of(fs, newparent, newname, to);
	if (rc == 0)
		rc = rmt_stat(fs->rmt, from, &k1);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	have_k2 = rmt_stat(fs->rmt, to, &k2) == 0;
	rc = rmt_rename(fs->rmt, from, to, rflags);
	if (rc == 0)
		fs_itab_rename(fs->itab, inode_of(fs, parent), name, &k1,
			       inode_of(fs, newparent), newname,
			       have_k2 ? &k2 : NULL,
			       (flags & RENAME_EXCHANGE) != 0);
	fuse_reply_err(req, -rc);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		    const char *newname)
{
	struct fs *fs = fs_of(req);
	char from[PATH_MAX], to[PATH_MAX];
	struct stat st;
	int rc = checked_path(fs, inode_of(fs, ino), from);

	if (rc == 0)
		rc = path_of(fs, newparent, newname, to);
	if (rc == 0)
		rc = rmt_link(fs->rmt, from, to);
	if (rc == 0)
		rc = rmt_stat(fs->rmt, to, &st);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	reply_new_entry(req, inode_of(fs, newparent), newname, &st);
}

/* --- files ----------------------------------------------------------- */

/*
 * close(2) costs a FLUSH round trip; it is worth it only where it can
 * report something: a written file on a share whose close reports errors.
 */
static bool needs_flush(struct fs *fs, int flags)
{
	return (flags & O_ACCMODE) != O_RDONLY &&
	       (rmt_caps(fs->rmt) & RMT_CAP_CLOSE_ERRORS);
}

static int handle_new(struct fs *fs, struct fs_inode *n, struct rmt_file *f,
		      int flags, struct fs_handle **out)
{
	struct fs_handle *h = calloc(1, sizeof(*h));

	if (!h)
		return -ENOMEM;
	h->file = f;
	h->inode = n;
	pthread_mutex_init(&h->lock, NULL);
	h->append = (flags & O_APPEND) != 0;
	/* rule 5 */
	h->direct = (flags & O_ACCMODE) == O_WRONLY && !fs->o->no_direct_write;
	fs_itab_handle_add(fs->itab, h);
	*out = h;
	return 0;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *n = inode_of(fs, ino);
	struct fs_handle *h = NULL;
	struct rmt_file *f;
	char path[PATH_MAX];
	struct stat st;
	int rc;

	fs_names_hold(fs);
	rc = fs_rpath(fs, n, NULL, path);
	if (rc == 0)
		rc = rmt_file_open(fs->rmt, path, fi->flags & ~O_CREAT, 0, &f);
	fs_names_release(fs);
	if (rc < 0)
		goto out_err;
	rc = rmt_file_stat(f, &st);
	if (rc == 0 && !same_object(n, &st))
		rc = -ESTALE; /* rule 1 */
	if (rc == 0 && (fi->flags & O_TRUNC)) /* a truncate */
		rc = clear_suid(fs, req, f, &st);
	if (rc == 0)
		rc = handle_new(fs, n, f, fi->flags, &h);
	if (rc < 0) {
		rmt_file_close(f);
		goto out_err;
	}
	fs_read_open(fs, h, path, &st, fi->flags);
	/* close-to-open: keep the kernel's pages only if the file did not
	 * change on the share since the last open */
	fi->keep_cache = fs_itab_keep_cache(fs->itab, n, &st);
	fi->direct_io = h->direct;
	fi->noflush = !needs_flush(fs, fi->flags);
	if (!fi->keep_cache) {
		/* the kernel may still hold the old size and times until
		 * attr_timeout: drop them too (no dirty pages in write-through
		 * mode, so this never blocks) */
		fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0);
	}
	fi->fh = (uint64_t)(uintptr_t)h;
	if (fuse_reply_open(req, fi) != 0)
		fs_handle_put(fs, h);
	return;
out_err:
	reply_err(req, rc);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		      mode_t mode, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fuse_entry_param e;
	char path[PATH_MAX], ppath[PATH_MAX];
	struct fs_inode *n;
	struct fs_handle *h = NULL;
	struct rmt_file *f;
	bool created = true;
	struct stat st;
	int rc = path_of(fs, parent, name, path);

	if (rc < 0)
		goto out_err;
	/* O_EXCL first, so an object that appeared meanwhile on the share
	 * is opened, not given away to the caller */
	rc = rmt_file_open(fs->rmt, path, fi->flags | O_CREAT | O_EXCL,
			   mode & 07777, &f);
	if (rc == -EEXIST && !(fi->flags & O_EXCL)) {
		created = false;
		rc = rmt_file_open(fs->rmt, path, fi->flags & ~O_CREAT, 0, &f);
	}
	if (rc < 0)
		goto out_err;
	if (created) {
		rc = path_of(fs, parent, NULL, ppath);
		if (rc == 0)
			rc = give_to_caller(fs, req, ppath, path, f,
					    S_IFREG | mode);
	}
	if (rc == 0)
		rc = rmt_file_stat(f, &st);
	if (rc == 0 && !created && (fi->flags & O_TRUNC))
		rc = clear_suid(fs, req, f, &st);
	if (rc == 0)
		rc = fs_itab_lookup(fs->itab, inode_of(fs, parent), name, &st,
				    1, &n);
	if (rc < 0) {
		rmt_file_close(f);
		goto out_err;
	}
	rc = handle_new(fs, n, f, fi->flags, &h);
	if (rc < 0) {
		rmt_file_close(f);
		fs_itab_forget(fs->itab, n, 1);
		goto out_err;
	}
	fs_itab_keep_cache(fs->itab, n, &st);
	fs_fill_entry(fs, &e, n, &st);
	fi->direct_io = h->direct;
	fi->noflush = !needs_flush(fs, fi->flags);
	fi->fh = (uint64_t)(uintptr_t)h;
	if (fuse_reply_create(req, &e, fi) != 0) {
		fs_handle_put(fs, h);
		fs_itab_forget(fs->itab, n, 1);
	}
	return;
out_err:
	reply_err(req, rc);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);
	int fd = fs->use_fd && !h->cacheable ? rmt_file_fd(h->file) : -1;

	(void)ino;
	if (fd >= 0) {
		/* let libfuse splice from the file into /dev/fuse */
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);

		struct stat st;

		bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
		bv.buf[0].fd = fd;
		bv.buf[0].pos = off;
		/* count first: once replied, a release may free h */
		if (rmt_file_stat(h->file, &st) == 0 && st.st_size > off)
			rmt_file_count_read(h->file,
					    (uint64_t)st.st_size - (uint64_t)off <
							    size
						    ? (uint64_t)st.st_size -
							      (uint64_t)off
						    : size);
		fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
		return;
	}
	fs_read_reply(fs, h, req, size, off);
}

/* After a direct write (rule 5): set-id bits, other descriptors' pages. */
static ssize_t write_direct_done(struct fs *fs, fuse_req_t req,
				 struct fs_handle *h, fuse_ino_t ino, off_t off,
				 size_t len)
{
	struct stat st;
	int rc = 0;

	if (fuse_req_ctx(req)->uid != 0) {
		rc = rmt_file_stat(h->file, &st);
		if (rc == 0)
			rc = clear_suid(fs, req, h->file, &st);
	}
	if (rc < 0)
		return rc;
	if (fs_itab_cached_handles(fs->itab, h->inode))
		fuse_lowlevel_notify_inval_inode(fs->se, ino, off, (off_t)len);
	return (ssize_t)len;
}

const char *fs_write_bytes(struct fuse_bufvec *in, size_t size, char **copy,
			   ssize_t *rc)
{
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(size);

	*copy = NULL;
	*rc = 0;
	if (in->count == 1 && !in->idx && !in->off &&
	    !(in->buf[0].flags & FUSE_BUF_IS_FD))
		return in->buf[0].mem;
	*copy = malloc(size ? size : 1);
	if (!*copy) {
		*rc = -ENOMEM;
		return NULL;
	}
	out.buf[0].mem = *copy;
	*rc = fuse_buf_copy(&out, in, 0);
	if (*rc >= 0 && (size_t)*rc != size)
		*rc = -EIO;
	return *rc < 0 ? NULL : *copy;
}

static void op_write_buf(fuse_req_t req, fuse_ino_t ino,
			 struct fuse_bufvec *in, off_t off,
			 struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);
	size_t size = fuse_buf_size(in);
	int fd = fs->use_fd ? rmt_file_fd(h->file) : -1;
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(size);
	struct stat st;
	ssize_t rc = 0;
	char *buf = NULL;

	(void)ino;
	if (h->append) {
		/* O_APPEND without writeback cache: the filesystem puts each
		 * write at the end of the file */
		pthread_mutex_lock(&h->inode->append_lock);
		rc = rmt_file_stat(h->file, &st);
		off = st.st_size;
	}
	if (rc < 0)
		goto out_unlock;
	if (fd >= 0) {
		out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK |
				   FUSE_BUF_FD_RETRY;
		out.buf[0].fd = fd;
		out.buf[0].pos = off;
		rc = fuse_buf_copy(&out, in, 0);
		if (rc >= 0 && (size_t)rc != size)
			rc = -EIO;
		if (rc > 0)
			rmt_file_count_write(h->file, (uint64_t)rc);
	} else {
		const char *data = fs_write_bytes(in, size, &buf, &rc);

		if (data)
			rc = rmt_file_pwrite(h->file, data, size, off);
	}
out_unlock:
	if (h->append)
		pthread_mutex_unlock(&h->inode->append_lock);
	free(buf);
	if (rc > 0 && fs->cache) /* the share's file changed: its blocks are
				    stale (after every write: a reader may
				    have cached it again meanwhile) */
		cache_invalidate(fs->cache, h->inode->dev, h->inode->ino);
	if (rc > 0 && h->direct)
		rc = write_direct_done(fs, req, h, ino, off, (size_t)rc);
	if (rc < 0)
		reply_err(req, (int)rc);
	else
		fuse_reply_write(req, (size_t)rc);
}

/* close(2) of a descriptor: report deferred errors (sticky, once). */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = handle_of(fi);
	struct stat st;
	int rc;

	(void)ino;
	rc = rmt_file_flush(h->file);
	if (rc == 0 && rmt_file_stat(h->file, &st) == 0)
		fs_itab_cache_update(fs->itab, h->inode, &st);
	fuse_reply_err(req, -rc);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);

	(void)ino;
	fs_handle_put(fs, handle_of(fi));
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		     struct fuse_file_info *fi)
{
	(void)ino;
	fuse_reply_err(req, -rmt_file_fsync(handle_of(fi)->file, datasync));
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
			 off_t len, struct fuse_file_info *fi)
{
	(void)ino;
	fuse_reply_err(req, -rmt_file_fallocate(handle_of(fi)->file, mode, off,
						len));
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		     struct fuse_file_info *fi)
{
	off_t res;

	(void)ino;
	if (whence != SEEK_DATA && whence != SEEK_HOLE) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	res = rmt_file_seek(handle_of(fi)->file, off, whence);
	if (res < 0)
		reply_err(req, (int)res);
	else
		fuse_reply_lseek(req, res);
}

static void op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in,
			       off_t off_in, struct fuse_file_info *fi_in,
			       fuse_ino_t ino_out, off_t off_out,
			       struct fuse_file_info *fi_out, size_t len,
			       int flags)
{
	ssize_t n;

	(void)ino_in;
	(void)ino_out;
	if (flags) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	n = rmt_file_copy(handle_of(fi_in)->file, off_in,
			  handle_of(fi_out)->file, off_out, len);
	if (n < 0)
		reply_err(req, (int)n);
	else
		fuse_reply_write(req, (size_t)n);
}

/* --- directories ----------------------------------------------------- */

static void dir_free(struct fs_dir *d)
{
	rmt_listing_release(&d->l);
	free(d->ids);
	free(d);
}

static int dir_fill(struct fs *fs, fuse_ino_t ino, struct fs_dir *d)
{
	char path[PATH_MAX];
	int rc;

	d->since = fs_itab_moves(fs->itab);
	if (fs->jnl)
		return fs_wb_dir_fill(fs, inode_of(fs, ino), &d->l, &d->ids);
	rc = checked_path(fs, inode_of(fs, ino), path);

	if (rc == 0)
		rc = rmt_list(fs->rmt, path, &d->l);
	return rc;
}

/* fs->dirs: the snapshots the kernel has open (close_unreleased()) */
static void dir_link(struct fs *fs, struct fs_dir *d)
{
	pthread_mutex_lock(&fs->dirs_lock);
	d->prev = NULL;
	d->next = fs->dirs;
	if (d->next)
		d->next->prev = d;
	fs->dirs = d;
	pthread_mutex_unlock(&fs->dirs_lock);
}

static void dir_unlink(struct fs *fs, struct fs_dir *d)
{
	pthread_mutex_lock(&fs->dirs_lock);
	if (d->prev)
		d->prev->next = d->next;
	else
		fs->dirs = d->next;
	if (d->next)
		d->next->prev = d->prev;
	pthread_mutex_unlock(&fs->dirs_lock);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_dir *d = calloc(1, sizeof(*d));
	int rc = d ? dir_fill(fs, ino, d) : -ENOMEM;

	if (rc < 0) {
		if (d)
			dir_free(d);
		reply_err(req, rc);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)d;
	fi->cache_readdir = 0;
	dir_link(fs, d);
	if (fuse_reply_open(req, fi) != 0) {
		dir_unlink(fs, d);
		dir_free(d);
	}
}

/*
 * Offsets: 0 -> ".", 1 -> "..", 2 + i -> entry i; an entry's offset field
 * is the offset of the next one. The kernel serialises readdir calls on one
 * open directory, so the snapshot needs no lock.
 */
static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi, bool plus)
{
	struct fs *fs = fs_of(req);
	struct fs_dir *d = (struct fs_dir *)(uintptr_t)fi->fh;
	char *buf = malloc(size), *p = buf;
	size_t rem = size;
	int rc = 0;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (off == 0 && d->listed)
		rc = dir_fill(fs, ino, d); /* rewinddir: a fresh listing */
	d->listed = true;
	for (; rc == 0 && (size_t)off < d->l.n + 2; off++) {
		struct fuse_entry_param e = { 0 };
		struct fs_inode *n = NULL;
		const char *name;
		size_t len;

		if (off < 2) {
			name = off == 0 ? "." : "..";
			e.attr.st_mode = S_IFDIR;
			e.attr.st_ino =
				off == 0 ? inode_of(fs, ino)->ino
					 : fs_itab_parent_ino(fs->itab,
							      inode_of(fs, ino));
		} else {
			struct rmt_dirent *de = &d->l.e[off - 2];

			if (!de->have_st)
				continue; /* vanished while listing */
			name = de->name;
			e.attr = de->st;
		}
		if (!plus) {
			len = fuse_add_direntry(req, p, rem, name, &e.attr,
						off + 1);
		} else {
			if (off >= 2) {
				struct stat st = e.attr;
				uint64_t id = d->ids ? d->ids[off - 2] : 0;

				/* an entry whose object was renamed or
				 * unlinked since the listing goes without
				 * its inode: the kernel looks it up */
				rc = fs_itab_lookup_since(fs->itab,
							  inode_of(fs, ino),
							  name, &st, 1,
							  d->since, &n);
				if (rc == -EAGAIN) {
					rc = 0;
					n = NULL;
				} else if (rc < 0) {
					break;
				} else if (id &&
					   fs_itab_set_id(fs->itab, n, id) < 0) {
					fs_itab_forget(fs->itab, n, 1);
					n = NULL;
					continue; /* a stale entry: skip */
				}
				if (n)
					fs_fill_entry(fs, &e, n, &st);
			}
			len = fuse_add_direntry_plus(req, p, rem, name, &e,
						     off + 1);
		}
		if (len > rem) {
			if (n)
				fs_itab_forget(fs->itab, n, 1);
			break;
		}
		p += len;
		rem -= len;
	}
	if (rc < 0 && p == buf)
		reply_err(req, rc);
	else
		fuse_reply_buf(req, buf, size - rem);
	free(buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, true);
}

/*
 * The end of the session: close the files and directories still open. The
 * kernel sends RELEASE and RELEASEDIR in the background after the last
 * close(2), so one can still be queued in /dev/fuse when a signal ends the
 * loop; unmounting then aborts the connection and it never comes (nor does
 * one for a file a process still has open). Only once no request can run.
 */
static void close_unreleased(struct fs *fs)
{
	struct fs_handle *h = fs_itab_handles_take(fs->itab), *hnext;
	struct fs_dir *d, *dnext;
	unsigned int nh = 0, nd = 0;

	for (; h; h = hnext, nh++) {
		hnext = h->next;
		handle_free(h);
	}
	pthread_mutex_lock(&fs->dirs_lock);
	d = fs->dirs;
	fs->dirs = NULL;
	pthread_mutex_unlock(&fs->dirs_lock);
	for (; d; d = dnext, nd++) {
		dnext = d->next;
		dir_free(d);
	}
	if (nh || nd)
		LOG_DBG("closed %u files and %u directories the kernel did "
			"not release",
			nh, nd);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino,
			  struct fuse_file_info *fi)
{
	struct fs_dir *d = (struct fs_dir *)(uintptr_t)fi->fh;

	(void)ino;
	dir_unlink(fs_of(req), d);
	dir_free(d);
	fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
			struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];
	int rc = checked_path(fs, inode_of(fs, ino), path);

	(void)datasync;
	(void)fi;
	if (rc == 0)
		rc = rmt_syncdir(fs->rmt, path);
	fuse_reply_err(req, -rc);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	struct statvfs sv;
	int rc = rmt_statfs(fs->rmt, &sv);

	(void)ino;
	if (rc < 0)
		reply_err(req, rc);
	else
		fuse_reply_statfs(req, &sv);
}

/* --- extended attributes --------------------------------------------- */

/*
 * user.ferryfs.state: what ferryfs holds of a file. Answered here, never
 * stored on the share, not listed (so cp -a and rsync -X do not copy it),
 * read-only. Write-through: everything is on the share: "clean".
 */
#define FS_STATE_XATTR "user.ferryfs.state"

static bool is_state_xattr(const char *name)
{
	return !strncmp(name, "user.ferryfs.", 13);
}


static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];
	int rc = is_state_xattr(name) ? -EPERM
				      : checked_path(fs, inode_of(fs, ino), path);

	if (rc == 0)
		rc = rmt_setxattr(fs->rmt, path, name, value, size, flags);
	fuse_reply_err(req, -rc);
}

/* getxattr / listxattr share the size-0 probe protocol */
static void reply_xattr_result(fuse_req_t req, ssize_t n, const char *buf,
			       size_t size)
{
	if (n < 0)
		reply_err(req, (int)n);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];

	if (is_state_xattr(name)) {
		static const char state[] = "clean";

		if (strcmp(name, FS_STATE_XATTR))
			fuse_reply_err(req, ENODATA);
		else if (size == 0)
			fuse_reply_xattr(req, sizeof(state) - 1);
		else if (size < sizeof(state) - 1)
			fuse_reply_err(req, ERANGE);
		else
			fuse_reply_buf(req, state, sizeof(state) - 1);
		return;
	}
	char *buf = size ? malloc(size) : NULL;
	ssize_t n = (size && !buf) ? -ENOMEM : path_of(fs, ino, NULL, path);

	if (n == 0)
		n = rmt_getxattr(fs->rmt, path, name, buf, size);
	reply_xattr_result(req, n, buf, size);
	free(buf);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];
	char *buf = size ? malloc(size) : NULL;
	ssize_t n = (size && !buf) ? -ENOMEM : path_of(fs, ino, NULL, path);

	if (n == 0)
		n = rmt_listxattr(fs->rmt, path, buf, size);
	reply_xattr_result(req, n, buf, size);
	free(buf);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct fs *fs = fs_of(req);
	char path[PATH_MAX];
	int rc = is_state_xattr(name) ? -EPERM
				      : checked_path(fs, inode_of(fs, ino), path);

	if (rc == 0)
		rc = rmt_removexattr(fs->rmt, path, name);
	fuse_reply_err(req, -rc);
}

const struct fuse_lowlevel_ops fs_wt_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.readlink = op_readlink,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.symlink = op_symlink,
	.rename = op_rename,
	.link = op_link,
	.open = op_open,
	.read = op_read,
	.write_buf = op_write_buf,
	.flush = op_flush,
	.release = op_release,
	.fsync = op_fsync,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.releasedir = op_releasedir,
	.fsyncdir = op_fsyncdir,
	.statfs = op_statfs,
	.setxattr = op_setxattr,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.removexattr = op_removexattr,
	.create = op_create,
	.fallocate = op_fallocate,
	.lseek = op_lseek,
	.copy_file_range = op_copy_file_range,
};

/* --- the control socket --------------------------------------------- */

/*
 * Commands of `ferryfs status|flush|pause|resume` (ctl.c). Write-through:
 * nothing is ever pending, so a flush is done at once and there is no
 * queue to pause; the reply says so instead of pretending.
 */
int fs_status_get(struct fs *fs, struct fs_status *st)
{
	struct rmt_counters rc;
	struct timespec now;
	int err = 0;

	clock_gettime(CLOCK_MONOTONIC, &now);
	*st = (struct fs_status){
		.mountpoint = fs->mnt_abs,
		.remote = rmt_id(fs->rmt),
		.uptime_s = now.tv_sec - fs->started.tv_sec,
	};
	if (fs->jnl) {
		err = fs_wb_status(fs, st);
	} else {
		rmt_counters(fs->rmt, &rc);
		st->mode = "write-through";
		st->drained = true;
		st->eta_s = -1;
		st->remote_bytes_read = rc.bytes_read;
		st->remote_bytes_written = rc.bytes_written;
		st->remote_ops = rc.ops;
	}
	if (err < 0) {
		fs_status_release(st);
		return err;
	}
	fs_cache_status(fs, &st->cache);
	return 0;
}

static int ctl_handle(void *arg, const char *cmd, char **reply)
{
	struct fs *fs = arg;
	enum fs_ctl_cmd c = fs_ctl_parse(cmd);
	struct fs_status st;
	int rc;

	if (c == FS_CTL_STATUS) {
		rc = fs_status_get(fs, &st);
		if (rc < 0)
			return rc;
		*reply = fs_status_json(&st);
		fs_status_release(&st);
		return *reply ? 0 : -ENOMEM;
	}
	if (fs->jnl)
		return fs_wb_ctl(fs, c, reply);
	if (c == FS_CTL_FLUSH) {
		*reply = fs_reply_flush(0, 0);
	} else if (c == FS_CTL_PAUSE || c == FS_CTL_RESUME) {
		char msg[128];

		snprintf(msg, sizeof(msg),
			 "write-through mode: every operation goes straight "
			 "to the remote, there is no queue to %s",
			 cmd);
		*reply = fs_reply_error(msg);
	} else {
		*reply = fs_reply_error("unknown command");
	}
	return *reply ? 0 : -ENOMEM;
}

/* --- the daemon ------------------------------------------------------ */

/*
 * The kernel reads ahead 128 KiB on a FUSE mount, so a sequential reader
 * waits for each request in turn. A larger window lets it keep several
 * 1 MiB reads in flight, served by our threads in parallel (measured on a
 * tmpfs-backed mount: cold 1 GiB read 0.43-0.73 s instead of 0.49-1.55 s).
 * Root only (sysfs); a failure only costs speed.
 */
static void set_readahead(const char *mnt)
{
	unsigned int maj, min;
	char path[64];
	FILE *f;

	if (!mnt || fs_mount_dev(mnt, &maj, &min) < 0)
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj,
		 min);
	f = fopen(path, "we");
	if (!f)
		return;
	fprintf(f, "%u\n", FS_READAHEAD_KB);
	if (fclose(f) != 0)
		LOG_DBG("cannot set '%s': %s", path, strerror(errno));
}

int fs_run(struct fuse_args *args, const struct fs_opts *o)
{
	struct fs fs = { .o = o,
			 .is_root = geteuid() == 0,
			 .root_lock = PTHREAD_MUTEX_INITIALIZER,
			 .dirs_lock = PTHREAD_MUTEX_INITIALIZER,
			 .pt_lock = PTHREAD_MUTEX_INITIALIZER };
	struct fuse_lowlevel_ops ops = fs_wt_ops;
	struct fuse_loop_config *cfg = NULL;
	struct fuse_session *se;
	struct stat st;
	int rc, status = 1;

	umask(0); /* the kernel already applied the caller's umask */
	/* a directory given relative: absolute now, since the flusher opens
	 * its own connections after daemonize's chdir("/") */
	if (!strstr(o->remote, "://"))
		fs.spec = realpath(o->remote, NULL);
	if (!fs.spec)
		fs.spec = strdup(o->remote);
	if (!fs.spec)
		return 1;
	rc = rmt_open(fs.spec, o->remote_opts, &fs.rmt);
	if (rc < 0) {
		fprintf(stderr, "ferryfs: cannot open remote '%s': %s\n",
			o->remote, strerror(-rc));
		free(fs.spec);
		return 1;
	}
	if (!(rmt_caps(fs.rmt) & RMT_CAP_THREADSAFE)) {
		fprintf(stderr, "ferryfs: remote '%s' needs one connection per "
				"thread, which is not supported yet\n",
			o->remote);
		goto out_rmt;
	}
	fs.use_fd = (rmt_caps(fs.rmt) & RMT_CAP_FD) != 0;
	rc = rmt_stat(fs.rmt, "", &st);
	if (rc == 0)
		rc = fs_itab_new(&st, &fs.itab);
	if (rc < 0) {
		fprintf(stderr, "ferryfs: cannot read remote '%s': %s\n",
			o->remote, strerror(-rc));
		goto out_rmt;
	}
	/* "/dev/fd/N": mount.fuse3 -o drop_privileges mounted it already */
	if (!strncmp(o->mountpoint, "/dev/fd/", 8))
		rc = 0;
	else
		rc = stat(o->mountpoint, &st) < 0 ? errno
		     : !S_ISDIR(st.st_mode)        ? ENOTDIR
						   : 0;
	if (rc) {
		fprintf(stderr, "ferryfs: cannot mount on '%s': %s\n",
			o->mountpoint, strerror(rc));
		goto out_itab;
	}
	if (o->writeback) {
		/* now, for a clear error on stderr; its threads start after
		 * daemonize's fork, below */
		if (fs_wb_open(&fs, true) < 0)
			goto out_itab;
		fs_wb_ops(&ops);
	}
	if (fs_cache_open(&fs) < 0)
		goto out_itab;
	/* before mounting: afterwards resolving it would ask ourselves */
	if (strncmp(o->mountpoint, "/dev/fd/", 8))
		fs.mnt_abs = realpath(o->mountpoint, NULL);
	clock_gettime(CLOCK_MONOTONIC, &fs.started);
	se = fuse_session_new(args, &ops, sizeof(ops), &fs);
	if (!se)
		goto out_itab; /* libfuse said why, in one line */
	fs.se = se;
	if (fuse_set_signal_handlers(se) != 0)
		goto out_session;
	if (fuse_session_mount(se, o->mountpoint) != 0)
		goto out_signals;
	if (fs_pt_install(&fs) != 0)
		goto out_unmount;
	if (!o->foreground) {
		log_to_syslog();
	}
	if (fs.is_root)
		set_readahead(fs.mnt_abs);
	if (fuse_daemonize(o->foreground) != 0)
		goto out_unmount;
	if (o->writeback &&
	    (fs_wb_open(&fs, false) < 0 || fs_wb_start(&fs) < 0))
		goto out_unmount;
	fs_cache_start(&fs);
	if (fs.mnt_abs) {
		/* after the fork of daemonize: threads do not survive it */
		char why[PATH_MAX + 128];

		rc = fs_ctl_start(fs.mnt_abs, ctl_handle, &fs, &fs.ctl, why,
				  sizeof(why));
		if (rc < 0)
			LOG_WARN("no control socket for '%s' (ferryfs status "
				 "will not reach it): %s",
				 fs.mnt_abs, why);
	}
	rc = fs_ready_start(&fs);
	if (rc < 0)
		LOG_WARN("cannot start telling the service manager that the "
			 "mount is ready: %s", strerror(-rc));
	if (o->single_thread) {
		rc = fuse_session_loop(se);
	} else {
		cfg = fuse_loop_cfg_create();
		if (!cfg)
			goto out_unmount;
		fuse_loop_cfg_set_clone_fd(cfg, (unsigned int)o->clone_fd);
		fuse_loop_cfg_set_idle_threads(cfg, o->max_idle_threads);
		fuse_loop_cfg_set_max_threads(cfg, o->max_threads);
		rc = fuse_session_loop_mt(se, cfg);
		fuse_loop_cfg_destroy(cfg);
	}
	/* the loop returns the signal that ended it: a clean stop */
	status = (rc == 0 || rc == SIGTERM || rc == SIGINT || rc == SIGHUP) ? 0
									    : 1;
out_unmount:
	fs_ready_stopping(&fs);
	fs_ctl_stop(fs.ctl);
	fuse_session_unmount(se);
	fs_ready_free(&fs);
	close_unreleased(&fs); /* the loop's threads are gone: no request */
	fs_wb_stop(&fs);
	fs_cache_stop(&fs);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_itab:
	fs_cache_stop(&fs);
	free(fs.mnt_abs);
	free(fs.journal_dir);
	free(fs.cache_dir);
	fs_itab_free(fs.itab);
out_rmt:
	rmt_close(fs.rmt);
	free(fs.spec);
	return status;
}
