/*
 * conflict.c - resolving a conflict with another writer of the share
 * (journal.h "Conflicts", journal.c "CONFLICTS"): jnl_conflict_resolve().
 * With flush.c the only file of journal/ that calls remote/: it reads the
 * share through the caller's connection (fs/ its own, a flusher stream its
 * stream's), and changes the journal only through jnl_chunk_fill() and the
 * one transaction of jnl_node_conflict().
 *
 *   1. fill: every chunk of the node below remote_valid the journal does
 *      not hold is read from the share (its current bytes: the base's are
 *      gone; zeros past its end if it shrank) and given to
 *      jnl_chunk_fill(), so that the journal holds the whole local
 *      version. A file rewritten whole here has remote_valid
 *      0: nothing to read, the copy is exactly the local version.
 *   2. name: NAME.conflict-YYYYmmdd-HHMMSS (UTC), then -2, -3...: the
 *      first that neither the journal nor the share has.
 *   3. jnl_node_conflict(); -EAGAIN (a chunk went meanwhile, or the base
 *      moved) starts again, a few times.
 *
 * Callers: fs/wb.c (a lookup, stat or open finds the conflict) and the
 * flusher (before it first writes a file).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "journal_i.h"
#include "log.h"
#include "remote.h"

#define RESOLVE_TRIES 4
#define NAME_TRIES 100

/* Step 1: the chunks of the remote's part the journal does not hold. */
static int fill(struct jnl *j, struct rmt *r, jnl_id id, const char *path,
		const struct jnl_node *nd)
{
	uint64_t cs = jnl_chunk_size(j);
	struct rmt_file *f = NULL;
	char *buf = NULL, one;
	int rc = 0;

	for (uint64_t c = 0; c * cs < nd->remote_valid && !rc; c++) {
		bool have = false;
		ssize_t n = jnl_read(j, id, &one, 1, (off_t)(c * cs), &have);

		if (n < 0) {
			rc = (int)n;
			break;
		}
		if (have)
			continue;
		if (!f) {
			buf = malloc(cs);
			rc = buf ? rmt_file_open(r, path, O_RDONLY, 0, &f)
				 : -ENOMEM;
			if (rc)
				break;
		}
		n = rmt_file_pread_all(f, buf, cs, (off_t)(c * cs));
		if (n < 0) {
			rc = (int)n;
			break;
		}
		/* past the share's end (it shrank): zeros, but held, so
		 * that the copy holds every byte of the local version */
		memset(buf + n, 0, cs - (size_t)n);
		rc = jnl_chunk_fill(j, id, c, buf,
				    nd->remote_valid - c * cs < cs
					    ? (size_t)(nd->remote_valid - c * cs)
					    : cs);
	}
	if (f)
		rmt_file_close(f);
	free(buf);
	return rc;
}

/* "dir/name" of a remote path: *name points into @path, @dir gets the
 * rest ("" at the root). */
static void split(const char *path, char *dir, size_t size, const char **name)
{
	const char *slash = strrchr(path, '/');

	if (!slash) {
		dir[0] = 0;
		*name = path;
		return;
	}
	snprintf(dir, size, "%.*s", (int)(slash - path), path);
	*name = slash + 1;
}

int jnl_conflict_resolve(struct jnl *j, struct rmt *r, jnl_id id,
			 uint64_t seq, const struct stat *st,
			 uint64_t allow_seq, jnl_id *share_id)
{
	char *path = malloc(PATH_MAX), *dir = malloc(PATH_MAX);
	char *cpath = malloc(PATH_MAX), cname[NAME_MAX + 1], stamp[32];
	const char *name;
	struct jnl_node nd;
	struct stat cst;
	struct tm tm;
	time_t now = time(NULL);
	int rc = -ENOMEM, k = 1;

	if (!path || !dir || !cpath)
		goto out;
	gmtime_r(&now, &tm);
	strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
	rc = jnl_node_rpath(j, id, path, PATH_MAX);
	if (rc < 0)
		goto out;
	split(path, dir, PATH_MAX, &name);
	for (int tries = 0; tries < RESOLVE_TRIES; tries++) {
		rc = jnl_node_get(j, id, &nd);
		if (rc)
			break;
		if (nd.base != JNL_BASE_SET || nd.base_seq != seq) {
			rc = -EAGAIN; /* the base moved: not this conflict */
			break;
		}
		if (!nd.unflushed && !nd.uncommitted &&
		    nd.size == nd.base_size &&
		    nd.remote_valid == nd.base_size) {
			rc = -ENODATA; /* attributes only: not a conflict */
			break;
		}
		rc = fill(j, r, id, path, &nd);
		for (; !rc && k <= NAME_TRIES; k++) {
			jnl_id cid;
			bool whiteout;
			int n = k == 1 ? snprintf(cname, sizeof(cname),
						  "%s.conflict-%s", name, stamp)
				       : snprintf(cname, sizeof(cname),
						  "%s.conflict-%s-%d", name,
						  stamp, k);

			if (n < 0 || (size_t)n >= sizeof(cname)) {
				rc = -ENAMETOOLONG;
				break;
			}
			n = snprintf(cpath, PATH_MAX, "%s%s%s", dir,
				     *dir ? "/" : "", cname);
			if (n < 0 || n >= PATH_MAX) {
				rc = -ENAMETOOLONG;
				break;
			}
			rc = jnl_lookup(j, nd.rparent, cname, &cid, &whiteout);
			if (rc == 0 || whiteout) {
				rc = 0;
				continue; /* the journal has it */
			}
			if (rc != -ENOENT)
				break;
			rc = rmt_stat(r, cpath, &cst);
			if (rc == 0)
				continue; /* the share has it */
			if (rc != -ENOENT)
				break;
			rc = jnl_node_conflict(j, id, seq, st, cname, cpath,
					       allow_seq, share_id);
			if (rc != -EEXIST)
				break;
			rc = 0;
		}
		if (!rc && k > NAME_TRIES)
			rc = -EEXIST;
		if (rc != -EAGAIN)
			break;
	}
	if (!rc) {
		LOG_WARN("conflict: '%s' was changed on the share while "
			 "changes to it were pending here; the share's "
			 "version keeps '%s', the local version is kept as "
			 "'%s'", path, path, cpath);
	} else if (rc == -EBUSY || rc == -ENAMETOOLONG || rc == -EEXIST ||
		   rc == -EINVAL) {
		LOG_WARN("conflict: '%s' was changed on the share while "
			 "changes to it were pending here, and the local "
			 "version cannot be kept apart (it replaces the "
			 "share's): %s", path, strerror(-rc));
		/* not found again: the flusher takes it over (SENDING) */
		jnl_node_send_begin(j, id, seq, NULL, NULL);
	} else if (rc == -ENODATA) {
		/* the attributes go to the share's version; once nothing is
		 * pending a stat takes it as the base (refresh) */
		jnl_node_send_begin(j, id, seq, NULL, NULL);
	}
out:
	free(path);
	free(dir);
	free(cpath);
	return rc;
}
