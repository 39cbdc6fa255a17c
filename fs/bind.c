/*
 * bind.c - a journal belongs to one share, and the share says so.
 *
 * The journal names its remote by an address (a path, a URL: rmt_id()),
 * and another file system can take an address: a share that is a mount
 * point not mounted at the time (a nofail NFS mount that failed at boot)
 * shows the empty directory below it, and the journal's pending files
 * were flushed into that directory while `flush --wait` said "everything
 * is on the remote" (issue 36, bug 2). So the first mount of a journal
 * leaves a marker on the share itself, RMT_RESERVED/journal-<ident>
 * (remote.h: hidden from every listing and lookup through ferryfs), and
 * every later mount of that journal looks for it before anything else:
 *
 *   marker there, its binding    -> the share is the one: go on
 *   no marker, journal bound     -> refused, one line naming -o adopt
 *   no marker, journal not bound -> a new journal (or one of a ferryfs
 *                                   before binding): the marker is made
 *   a marker of another binding  -> as no marker (a share the journal
 *                                   left for another by -o adopt)
 *   -o adopt                     -> the marker is made, whatever the
 *                                   journal said (on purpose)
 *
 * The marker and the journal's meta share a random binding number: the
 * marker names the journal, the number names this binding of it. One
 * marker per journal: several journals (two clients) share one share
 * and its RMT_RESERVED directory. A share whose root cannot be written
 * (-EACCES, -EROFS, -EPERM) binds the journal to the root's identity
 * instead (dev and ino as the share's stat gives them), checked the same
 * way; the mount says so once, as it cannot leave a marker.
 *
 * Caller: fs_wb_open() (wb.c), with the journal open and before any
 * flusher starts.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "fs.h"
#include "fs_i.h"
#include "journal.h"
#include "log.h"
#include "remote.h"

static void marker_text(const struct fs *fs, uint64_t nonce, char *buf,
			size_t size)
{
	char host[256] = "";
	time_t now = time(NULL);

	gethostname(host, sizeof(host) - 1);
	snprintf(buf, size,
		 "ferryfs journal %016" PRIx64 "\n"
		 "binding %016" PRIx64 "\n"
		 "host %s\n"
		 "journal %s\n"
		 "remote %s\n"
		 "bound %lld\n",
		 jnl_ident(fs->jnl), nonce, host, fs->journal_dir,
		 rmt_id(fs->rmt), (long long)now);
}

/* One line: why the share is not the journal's, and what to do. */
static int refuse(const struct fs *fs, const char *marker, const char *why)
{
	struct jnl_stats st;
	char pending[128] = "";

	if (jnl_stats(fs->jnl, &st) == 0)
		snprintf(pending, sizeof(pending),
			 " (it has %" PRIu64 " bytes and %" PRIu64
			 " operations pending)",
			 st.dirty_bytes + st.inflight_bytes, st.pending_ops);
	fprintf(stderr,
		"ferryfs: refusing to mount: remote '%s' %s, but journal "
		"'%s'%s belongs to the share that has '%s/%s': is the share "
		"mounted? To bind this journal to this share on purpose, "
		"mount with -o adopt\n",
		fs->o->remote, why, fs->journal_dir, pending, RMT_RESERVED,
		marker);
	return -EXDEV;
}

int fs_bind_check(struct fs *fs)
{
	struct jnl_bind b, now = { .kind = JNL_BIND_MARKER };
	char marker[64], buf[1024];
	struct stat root;
	ssize_t n;
	int rc;

	snprintf(marker, sizeof(marker), "journal-%016" PRIx64,
		 jnl_ident(fs->jnl));
	rc = jnl_bind_get(fs->jnl, &b);
	if (rc)
		return rc;
	n = rmt_marker_get(fs->rmt, marker, buf, sizeof(buf) - 1);
	if (n >= 0 && b.kind == JNL_BIND_MARKER) {
		char want[32];

		buf[n] = 0;
		snprintf(want, sizeof(want), "\nbinding %016" PRIx64 "\n",
			 b.nonce);
		if (strstr(buf, want))
			return 0;
		n = -ENOENT; /* a share this journal left (-o adopt) */
	}
	if (n != -ENOENT && n < 0) {
		fprintf(stderr, "ferryfs: cannot read '%s/%s' on remote '%s': "
			"%s\n", RMT_RESERVED, marker, fs->o->remote,
			strerror((int)-n));
		return (int)n;
	}
	rc = rmt_stat(fs->rmt, "", &root);
	if (rc) {
		fprintf(stderr, "ferryfs: cannot read remote '%s': %s\n",
			fs->o->remote, strerror(-rc));
		return rc;
	}
	if (!fs->o->adopt) {
		if (b.kind == JNL_BIND_MARKER)
			return refuse(fs, marker, "has no marker of it");
		if (b.kind == JNL_BIND_ROOT &&
		    (b.dev != (uint64_t)root.st_dev ||
		     b.ino != (uint64_t)root.st_ino))
			return refuse(fs, marker,
				      "is another directory than the one it "
				      "was bound to");
	}

	if (getrandom(&now.nonce, sizeof(now.nonce), 0) != sizeof(now.nonce)) {
		rc = -errno;
		fprintf(stderr, "ferryfs: cannot bind journal '%s': getrandom: "
			"%s\n", fs->journal_dir, strerror(-rc));
		return rc;
	}
	marker_text(fs, now.nonce, buf, sizeof(buf));
	rc = rmt_marker_put(fs->rmt, marker, buf);
	if (rc == -EACCES || rc == -EROFS || rc == -EPERM) {
		if (b.kind == JNL_BIND_ROOT && !fs->o->adopt)
			return 0; /* as before: still the same root */
		fprintf(stderr,
			"ferryfs: warning: cannot write '%s/' at the root of "
			"remote '%s' (%s): journal '%s' is bound to the "
			"identity of that root instead (device %llu, inode "
			"%llu)\n",
			RMT_RESERVED, fs->o->remote, strerror(-rc),
			fs->journal_dir, (unsigned long long)root.st_dev,
			(unsigned long long)root.st_ino);
		now.kind = JNL_BIND_ROOT;
		now.dev = (uint64_t)root.st_dev;
		now.ino = (uint64_t)root.st_ino;
	} else if (rc) {
		fprintf(stderr, "ferryfs: cannot write '%s/%s' on remote "
			"'%s': %s\n", RMT_RESERVED, marker, fs->o->remote,
			strerror(-rc));
		return rc;
	} else if (fs->o->adopt && b.kind != JNL_BIND_NONE) {
		LOG_WARN("journal '%s' adopted remote '%s' (-o adopt)",
			 fs->journal_dir, fs->o->remote);
	}
	return jnl_bind_set(fs->jnl, &now);
}
