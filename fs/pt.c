/*
 * pt.c - passthrough (-o passthrough): a write-only copy of a new file
 * goes from the kernel straight into its staging file in the journal.
 *
 * Why: a FUSE WRITE is answered only after the daemon has copied its
 * bytes into the staging file, so a `cp` into the mount pays the copy
 * out of /dev/fuse and the daemon's copy one after the other; it took
 * 1.6x the time of a `cp` to local disk (tests/bench/RESULTS.md). Linux
 * 6.9 added FUSE passthrough: the daemon names a backing file at OPEN,
 * and the kernel reads and writes it itself (no request per write).
 *
 * libfuse 3.14 does not know it, so this file speaks the few words of
 * the kernel's protocol it needs, through libfuse's custom I/O hooks
 * (fuse_session_custom_io()): it sees the kernel's INIT (is FUSE_PASSTHROUGH
 * offered?), adds FUSE_PASSTHROUGH and a stack depth of 1 to the INIT
 * reply, and puts FOPEN_PASSTHROUGH and the backing id into the OPEN or
 * CREATE reply of a handle that passes through. The reply is written by
 * the thread that handles the request, so thread-local state says which
 * reply to change.
 *
 * It also adds FUSE_HANDLE_KILLPRIV_V2 (this daemon clears set-id bits
 * itself anyway: wb.c clear_suid(), wb_setattr()): the kernel then marks
 * the mount SB_NOSEC, and a passed-through write asks the daemon for the
 * file's security.capability only once (the inode is S_NOSEC after), not
 * at each write (backing_file_write_iter() -> file_remove_privs(): a
 * GETXATTR round trip per write, most of a `cp`'s time: 0.33 s against
 * 0.26 s for a local one, 1 GiB; 0.26 s with it, README).
 *
 * Which opens pass through (fs_pt_open()): the write-only open of a
 * regular file whose size is 0 once opened (created, or truncated by
 * O_TRUNC) with no set-id bit, and no other open of it: its staging file
 * is then the whole file. While one passes through, every other open of
 * the file must too (the kernel refuses a cached open of it: ETXTBSY);
 * they do, to the same staging file, whatever their mode.
 *
 * What the journal sees: nothing per write. The staging file is pinned
 * (jnl_pt_begin(): the flusher gives none of it back); GETATTR takes its
 * size and mtime from it (node_to_stat()). Every commit period the
 * journal marks DIRTY the whole chunks it grew by (jnl_pt_grow()), so
 * the flusher sends it while it is written; all of it is marked
 * (jnl_pt_mark()) at fsync, at `ferryfs flush`, at unmount, and when the
 * last passing handle is released. A daemon killed meanwhile loses none
 * of it: the journal's marker of the pin (pt/<id>) makes its next open
 * mark the whole staging file, what the application wrote after the kill
 * included. The same marker lets the journal commit those marks without
 * an fdatasync of the staging file first (journal.c, sync_wanted()).
 *
 * The costs, measured or by design (README): an fsync or close reads and
 * hashes the chunks already on the share (only those the kernel changed
 * are sent again); and the journal's size bound (journal_max) does not
 * hold back such a write: a file bigger than the journal disk's free
 * space fails with ENOSPC, where a FUSE write would wait for the flusher
 * to make room. Hence off by default.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "fs.h"
#include "fs_i.h"
#include "journal.h"
#include "log.h"

/* The kernel's ABI (linux/fuse.h, protocol 7.40), which libfuse 3.14 and
 * Debian 12's kernel headers lack. */
#define PT_OP_INIT 26
#define PT_INIT_EXT (1u << 30)
#define PT_FLAGS2_PASSTHROUGH (1u << 5) /* FUSE_PASSTHROUGH, 1ull << 37 */
#define PT_FLAGS_WRITEBACK_CACHE (1u << 16)
#define PT_FLAGS_HANDLE_KILLPRIV_V2 (1u << 28)
#define PT_FOPEN_PASSTHROUGH (1u << 7)
#define PT_FOPEN_DIRECT_IO (1u << 0)
#define PT_FOPEN_KEEP_CACHE (1u << 1)

struct pt_in_header {
	uint32_t len, opcode;
	uint64_t unique, nodeid;
	uint32_t uid, gid, pid;
	uint16_t total_extlen, padding;
};

struct pt_init_in {
	uint32_t major, minor, max_readahead, flags, flags2;
};

struct pt_init_out {
	uint32_t major, minor, max_readahead, flags;
	uint16_t max_background, congestion_threshold;
	uint32_t max_write, time_gran;
	uint16_t max_pages, map_alignment;
	uint32_t flags2, max_stack_depth;
	uint32_t unused[6];
};

struct pt_out_header {
	uint32_t len;
	int32_t error;
	uint64_t unique;
};

struct pt_open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;
};

struct pt_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};

#define PT_IOC_BACKING_OPEN _IOW(229, 1, struct pt_backing_map)
#define PT_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

_Static_assert(sizeof(struct pt_in_header) == 40, "fuse_in_header");
_Static_assert(sizeof(struct pt_init_out) == 64, "fuse_init_out");
_Static_assert(sizeof(struct pt_open_out) == 16, "fuse_open_out");

/* This thread is answering INIT (op_init() ran), or an OPEN/CREATE that
 * passes through to backing id t_backing. */
static _Thread_local bool t_init;
static _Thread_local int t_backing;

static ssize_t pt_read(int fd, void *buf, size_t len, void *userdata)
{
	struct fs *fs = userdata;
	ssize_t n = read(fd, buf, len);
	struct pt_in_header h;
	struct pt_init_in in;

	if (n > 0)
		atomic_fetch_add(&fs->pt_requests, 1);
	if (n >= (ssize_t)(sizeof(h) + sizeof(in))) {
		memcpy(&h, buf, sizeof(h));
		if (h.opcode == PT_OP_INIT) {
			memcpy(&in, (char *)buf + sizeof(h), sizeof(in));
			fs->pt_offered = in.major == 7 && in.minor >= 40 &&
					 (in.flags & PT_INIT_EXT) &&
					 (in.flags2 & PT_FLAGS2_PASSTHROUGH) &&
					 (in.flags & PT_FLAGS_HANDLE_KILLPRIV_V2);
		}
	}
	return n;
}

static ssize_t pt_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	struct fs *fs = userdata;
	struct pt_out_header oh;

	/* a reply (not a notification: unique 0) with one argument */
	if (count == 2 && iov[0].iov_len == sizeof(oh))
		memcpy(&oh, iov[0].iov_base, sizeof(oh));
	if (count != 2 || iov[0].iov_len != sizeof(oh) || !oh.unique)
		return writev(fd, iov, count);
	if (t_init) {
		t_init = false;
		if (!fs->pt_offered)
			LOG_WARN("-o passthrough: this kernel does not offer FUSE "
				 "passthrough (Linux >= 6.9): FUSE writes, as "
				 "without the option");
		if (!oh.error && fs->pt_offered &&
		    iov[1].iov_len == sizeof(struct pt_init_out)) {
			struct pt_init_out *o = iov[1].iov_base;

			if (!(o->flags & PT_FLAGS_WRITEBACK_CACHE)) {
				o->flags |= PT_INIT_EXT |
					    PT_FLAGS_HANDLE_KILLPRIV_V2;
				o->flags2 |= PT_FLAGS2_PASSTHROUGH;
				o->max_stack_depth = 1;
				atomic_store(&fs->pt_on, true);
			}
		}
	} else if (t_backing > 0) {
		/* OPEN: the fuse_open_out; CREATE: fuse_entry_out, then it */
		if (!oh.error && iov[1].iov_len >= sizeof(struct pt_open_out)) {
			struct pt_open_out o;
			char *p = (char *)iov[1].iov_base + iov[1].iov_len -
				  sizeof(o);

			memcpy(&o, p, sizeof(o));
			o.open_flags |= PT_FOPEN_PASSTHROUGH;
			o.open_flags &= ~(PT_FOPEN_DIRECT_IO |
					  PT_FOPEN_KEEP_CACHE);
			o.backing_id = t_backing;
			memcpy(p, &o, sizeof(o));
		}
		t_backing = 0;
	}
	return writev(fd, iov, count);
}

static ssize_t pt_splice(int fdin, off_t *offin, int fdout, off_t *offout,
			 size_t len, unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

int fs_pt_install(struct fs *fs)
{
	static const struct fuse_custom_io io = {
		.read = pt_read,
		.writev = pt_writev,
		.splice_send = pt_splice,
	};
	int rc;

	if (!fs->o->passthrough || !fs->o->writeback)
		return 0;
	rc = fuse_session_custom_io(fs->se, &io, fuse_session_fd(fs->se));
	if (rc)
		LOG_WARN("-o passthrough: cannot hook the FUSE channel: %s",
			 strerror(-rc));
	return rc;
}

void fs_pt_init_reply(struct fs *fs)
{
	if (fs->o->passthrough && fs->o->writeback)
		t_init = true;
}

/* The passthrough of journal node @id, or NULL. pt_lock held. */
static struct fs_pt *pt_find(struct fs *fs, uint64_t id)
{
	for (unsigned int i = 0; i < fs->pt_n; i++)
		if (fs->pt[i].id == id)
			return &fs->pt[i];
	return NULL;
}

/* Start passing @h's node through: pin its staging file and give it to
 * the kernel. 0, or nothing changed. pt_lock held. */
static int pt_start(struct fs *fs, struct fs_handle *h)
{
	struct pt_backing_map m = { 0 };
	int fd, id, rc;

	if (fs->pt_n == FS_PT_MAX)
		return -EBUSY;
	rc = jnl_pt_begin(fs->jnl, h->id, &fd);
	if (rc)
		return rc;
	m.fd = fd;
	id = ioctl(fuse_session_fd(fs->se), PT_IOC_BACKING_OPEN, &m);
	rc = id < 0 ? -errno : id == 0 ? -EIO : 0;
	close(fd);
	if (rc) {
		jnl_pt_end(fs->jnl, h->id);
		if (rc == -EPERM || rc == -ENOTTY || rc == -EINVAL) {
			atomic_store(&fs->pt_on, false);
			LOG_WARN("-o passthrough: the kernel refuses a backing "
				 "file (%s): off for this mount",
				 strerror(-rc));
		}
		return rc;
	}
	fs->pt[fs->pt_n++] = (struct fs_pt){ h->id, 0, 0, id };
	atomic_fetch_add(&fs->pt_nodes, 1);
	return 0;
}

void fs_pt_open(struct fs *fs, struct fs_handle *h, const struct stat *st,
		int flags, struct fuse_file_info *fi)
{
	struct fs_pt *p;

	if (!atomic_load(&fs->pt_on) || !h->id)
		return;
	pthread_mutex_lock(&fs->pt_lock);
	p = pt_find(fs, h->id);
	if (!p && (flags & O_ACCMODE) == O_WRONLY && S_ISREG(st->st_mode) &&
	    st->st_size == 0 && !(st->st_mode & (S_ISUID | S_ISGID)) &&
	    !fs_itab_handles_other(fs->itab, h->inode, h) &&
	    pt_start(fs, h) == 0)
		p = &fs->pt[fs->pt_n - 1];
	if (p) {
		p->handles++;
		h->pt = true;
		atomic_fetch_add(&fs->pt_opens, 1);
		fi->direct_io = 0;
		fi->keep_cache = 0;
		t_backing = p->backing;
	}
	pthread_mutex_unlock(&fs->pt_lock);
}

void fs_pt_reply_done(void)
{
	t_backing = 0;
}

void fs_pt_close(struct fs *fs, struct fs_handle *h)
{
	struct fs_pt *p;
	uint32_t bid;

	pthread_mutex_lock(&fs->pt_lock);
	p = pt_find(fs, h->id);
	if (!p || --p->handles) {
		pthread_mutex_unlock(&fs->pt_lock);
		return;
	}
	/* the last one: mark what the kernel wrote, without pt_lock (every
	 * open takes it). An open meanwhile joins the same backing file
	 * (still registered), and then the file stays pinned: the marks of
	 * this close are only early ones. Its release may be marking too:
	 * the last mark to end unpins, so a GETATTR after the unpin finds
	 * every mark in the node (a size of 0 was seen otherwise). */
	p->marking++;
	pthread_mutex_unlock(&fs->pt_lock);
	(void)jnl_pt_mark(fs->jnl, h->id); /* it logs an error */
	pthread_mutex_lock(&fs->pt_lock);
	p = pt_find(fs, h->id);
	if (p && !--p->marking && !p->handles) {
		jnl_pt_end(fs->jnl, p->id);
		bid = (uint32_t)p->backing;
		if (ioctl(fuse_session_fd(fs->se), PT_IOC_BACKING_CLOSE,
			  &bid) < 0)
			LOG_WARN("-o passthrough: cannot close backing id "
				 "%u: %s", bid, strerror(errno));
		*p = fs->pt[--fs->pt_n];
		atomic_fetch_sub(&fs->pt_nodes, 1);
	}
	pthread_mutex_unlock(&fs->pt_lock);
}

int fs_pt_mark(struct fs *fs, uint64_t id)
{
	if (!fs->jnl || !atomic_load(&fs->pt_nodes))
		return 0;
	return id ? jnl_pt_mark(fs->jnl, id) : jnl_pt_mark_all(fs->jnl);
}
