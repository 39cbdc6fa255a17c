/*
 * read.c - reads of remote bytes through the block cache and read-ahead
 * (cache/, issue 5).
 *
 * Which reads: a file opened read-only that the journal does not know (a
 * clean file on the share, the case of pulling a project back from the
 * NAS), write-through or write-back; none of a share on a local disk
 * (RMT_CAP_LOCAL) unless -o cache_local: it reads as fast as the cache
 * would, which would only copy it (a cold read 0.62-0.82 of a direct
 * read with the cache, 1.09-1.22 without; tests/bench/RESULTS.md). Its
 * version (identity, size, mtime, ctime) is taken at open: close-to-open,
 * like NFS; a change on the share is seen at the next open, and blocks of
 * the old version are dropped then (cache_read with a new key).
 * Everything else (files with changes in the journal, files open for
 * writing) reads the share directly.
 *
 * A read of [off, off+len):
 *   1. tells the read-ahead engine (cache_ra_note): a sequential reader
 *      gets the next blocks fetched in parallel, a growing window;
 *   2. takes what the cache holds (cache_read);
 *   3. for a block it does not hold: waits for it if read-ahead is
 *      fetching it, else reads it from the share: the whole block for a
 *      sequential reader or a read that covers it (then cached), only the
 *      part asked for otherwise (a random reader fetches no more than it
 *      reads).
 * A FUSE read whose blocks are all cached (at once or after waiting for
 * read-ahead) is answered from the slab's pages by splice (cache_pin():
 * no put overwrites them meanwhile), without copying them through a
 * buffer; the others through a buffer (steps 2 and 3).
 * Counters (app bytes, share bytes) go to `ferryfs status`.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "cache.h"
#include "fs.h"
#include "fs_i.h"
#include "log.h"
#include "remote.h"
#include "sys.h"

void fs_read_open(struct fs *fs, struct fs_handle *h, const char *rpath,
		  const struct stat *st, int flags)
{
	if (!fs->cache || (flags & O_ACCMODE) != O_RDONLY || !S_ISREG(st->st_mode))
		return;
	h->rpath = strdup(rpath);
	if (!h->rpath)
		return; /* no cache for it: slower, not wrong */
	memset(&h->key, 0, sizeof(h->key));
	h->key.dev = (uint64_t)st->st_dev;
	h->key.ino = (uint64_t)st->st_ino;
	h->key.size = (uint64_t)st->st_size;
	h->key.mtime = st->st_mtim;
	h->key.ctime = st->st_ctim;
	cache_ra_file_init(&h->ra);
	h->cacheable = true;
}

void fs_read_release(struct fs_handle *h)
{
	free(h->rpath);
	h->rpath = NULL;
}

/* Block @idx of the file into @blk (its length), from the share; cached. */
static ssize_t fetch_block(struct fs *fs, struct fs_handle *h, uint64_t idx,
			   char *blk)
{
	uint64_t bs = cache_block_size(fs->cache), start = idx * bs;
	size_t len = (size_t)(h->key.size - start < bs ? h->key.size - start
						       : bs);
	ssize_t n = rmt_file_pread_all(h->file, blk, len, (off_t)start);

	if (n < 0)
		return n;
	atomic_fetch_add(&fs->share_read_bytes, (uint64_t)n);
	if ((size_t)n == len)
		cache_put(fs->cache, &h->key, idx, blk, len); /* best effort */
	return n;
}

/* The start of a read of a cacheable handle: @len clipped to the file's
 * size at open (0 at or past its end), counted, told to read-ahead. */
static size_t read_begin(struct fs *fs, struct fs_handle *h, size_t len,
			 off_t off)
{
	if ((uint64_t)off >= h->key.size || len == 0)
		return 0;
	if (len > h->key.size - (uint64_t)off)
		len = (size_t)(h->key.size - (uint64_t)off);
	atomic_fetch_add(&fs->app_read_bytes, len);
	if (fs->ra) {
		pthread_mutex_lock(&h->lock);
		cache_ra_note(fs->ra, &h->ra, h->rpath, &h->key, off, len);
		pthread_mutex_unlock(&h->lock);
	}
	return len;
}

/* [off, off + len) through the cache into @buf (read_begin() done). */
static ssize_t read_fill(struct fs *fs, struct fs_handle *h, char *buf,
			 size_t len, off_t off)
{
	uint64_t bs, first, last, idx;
	bool *have = NULL;
	char *blk = NULL;
	ssize_t n;
	int rc = 0;

	bs = cache_block_size(fs->cache);
	first = (uint64_t)off / bs;
	last = ((uint64_t)off + len - 1) / bs;
	have = calloc(last - first + 1, sizeof(*have));
	if (!have)
		return -ENOMEM;
	rc = cache_read(fs->cache, &h->key, buf, len, off, have);
	for (idx = first; rc == 0 && idx <= last; idx++) {
		uint64_t s = idx * bs > (uint64_t)off ? idx * bs : (uint64_t)off;
		uint64_t e = (idx + 1) * bs < (uint64_t)off + len
				     ? (idx + 1) * bs
				     : (uint64_t)off + len;
		bool sequential = h->ra.window > 0;

		if (have[idx - first])
			continue;
		/* read-ahead has it on the way: wait rather than fetch twice */
		if (fs->ra && cache_ra_wait(fs->ra, &h->key, idx, 10000)) {
			bool one = false;

			if (cache_read(fs->cache, &h->key,
				       buf + (s - (uint64_t)off), e - s,
				       (off_t)s, &one) == 0 && one)
				continue;
		}
		if (sequential || (s == idx * bs && e == (idx + 1) * bs) ||
		    (s == idx * bs && e == h->key.size)) {
			if (!blk && !(blk = malloc(bs))) {
				rc = -ENOMEM;
				break;
			}
			n = fetch_block(fs, h, idx, blk);
			if (n < 0) {
				rc = (int)n;
				break;
			}
			/* a short block: the share's file is shorter than at
			 * open; what is missing reads as zeros */
			if ((uint64_t)n < e - idx * bs)
				memset(blk + n, 0, e - idx * bs - (uint64_t)n);
			memcpy(buf + (s - (uint64_t)off), blk + (s - idx * bs),
			       e - s);
		} else {
			n = rmt_file_pread_all(h->file,
					       buf + (s - (uint64_t)off),
					       e - s, (off_t)s);
			if (n < 0) {
				rc = (int)n;
				break;
			}
			atomic_fetch_add(&fs->share_read_bytes, (uint64_t)n);
			if ((uint64_t)n < e - s)
				memset(buf + (s - (uint64_t)off) + n, 0,
				       e - s - (uint64_t)n);
		}
	}
	free(blk);
	free(have);
	return rc < 0 ? rc : (ssize_t)len;
}

/* Pin the cached blocks of [off, off + len), waiting for read-ahead's
 * fetches of those not cached yet. */
static int read_pin(struct fs *fs, struct fs_handle *h, size_t len, off_t off,
		    struct cache_pin *p)
{
	uint64_t bs = cache_block_size(fs->cache);
	int rc = cache_pin(fs->cache, &h->key, off, len, p);

	if (rc != -ENOENT || !fs->ra)
		return rc;
	for (uint64_t i = (uint64_t)off / bs; i <= ((uint64_t)off + len - 1) / bs;
	     i++)
		if (!cache_has(fs->cache, &h->key, i))
			cache_ra_wait(fs->ra, &h->key, i, 10000);
	return cache_pin(fs->cache, &h->key, off, len, p);
}

/* Answer [off, off + len) (read_begin() done) with the slab's pages,
 * spliced into /dev/fuse (libfuse copies through a buffer where it cannot
 * splice), if every block is cached. False: nothing replied. */
static bool reply_pinned(struct fs *fs, struct fs_handle *h, fuse_req_t req,
			 size_t len, off_t off)
{
	struct fuse_bufvec *bv;
	struct cache_pin pin;

	if (read_pin(fs, h, len, off, &pin))
		return false;
	bv = malloc(sizeof(*bv) + pin.n * sizeof(bv->buf[0]));
	if (bv) {
		*bv = (struct fuse_bufvec)FUSE_BUFVEC_INIT(0);
		bv->count = pin.n;
		for (unsigned int i = 0; i < pin.n; i++) {
			bv->buf[i] = bv->buf[0];
			bv->buf[i].size = pin.s[i].len;
			bv->buf[i].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
			bv->buf[i].fd = pin.fd;
			bv->buf[i].pos = pin.s[i].off;
		}
		fuse_reply_data(req, bv, FUSE_BUF_SPLICE_MOVE);
		free(bv);
	}
	cache_unpin(fs->cache, &pin);
	return bv != NULL;
}

void fs_read_reply(struct fs *fs, struct fs_handle *h, fuse_req_t req,
		   size_t size, off_t off)
{
	size_t len = size;
	char *buf;
	ssize_t n;

	if (h->cacheable) {
		len = read_begin(fs, h, size, off);
		if (!len) {
			fuse_reply_buf(req, NULL, 0);
			return;
		}
		if (reply_pinned(fs, h, req, len, off))
			return;
	}
	buf = malloc(len ? len : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (h->cacheable) {
		n = read_fill(fs, h, buf, len, off);
	} else {
		n = rmt_file_pread_all(h->file, buf, len, off);
		if (n > 0)
			atomic_fetch_add(&fs->share_read_bytes, (uint64_t)n);
	}
	if (n < 0)
		reply_err(req, (int)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

int fs_cache_open(struct fs *fs)
{
	const struct fs_opts *o = fs->o;
	struct cache_config cfg = { .max_bytes = o->cache_max };
	int rc;

	if (o->no_cache) {
		fs->cache_off = "-o cache=off";
		return 0;
	}
	if ((rmt_caps(fs->rmt) & RMT_CAP_LOCAL) && !o->cache_local) {
		/* its reads come from a local disk and the page cache
		 * already: a copy would take the space for nothing */
		fs->cache_off = "the share is on a local disk (-o cache_local "
				"caches it)";
		if (o->cache) /* a directory was given: say why it stays empty */
			LOG_INFO("no block cache in '%s': %s", o->cache,
				 fs->cache_off);
		return 0;
	}
	fs->cache_dir = o->cache ? strdup(o->cache)
				 : fs_state_default("cache", rmt_id(fs->rmt));
	if (!fs->cache_dir) {
		fprintf(stderr, "ferryfs: no cache directory: give -o cache=DIR "
				"or -o cache=off\n");
		return -EINVAL;
	}
	rc = sys_mkdir_parents(fs->cache_dir, 0700);
	if (rc == 0)
		rc = cache_open(fs->cache_dir, &cfg, &fs->cache);
	if (rc < 0) {
		fprintf(stderr, "ferryfs: cannot open cache '%s': %s\n",
			fs->cache_dir,
			fs->cache || rc == -ENAMETOOLONG ? strerror(-rc)
							 : cache_errmsg());
		return rc;
	}
	return 0;
}

int fs_cache_start(struct fs *fs)
{
	struct cache_ra_config cfg = {
		.remote_spec = fs->spec,
		.remote_opts = fs->o->remote_opts,
		.streams = fs->o->readahead,
	};
	int rc;

	if (!fs->cache || !fs->o->readahead)
		return 0;
	rc = cache_ra_start(fs->cache, &cfg, &fs->ra);
	if (rc < 0)
		LOG_WARN("no read-ahead for '%s' (reads stay correct, one "
			 "at a time): %s",
			 fs->spec, strerror(-rc));
	return 0;
}

void fs_cache_stop(struct fs *fs)
{
	cache_ra_stop(fs->ra);
	fs->ra = NULL;
	cache_close(fs->cache);
	fs->cache = NULL;
}

void fs_cache_status(struct fs *fs, struct fs_cache_status *c)
{
	struct cache_ra_stats rs = { 0 };
	struct cache_stats cs = { 0 };

	*c = (struct fs_cache_status){ .on = fs->cache != NULL,
				       .off = fs->cache_off ? fs->cache_off
							    : "" };
	if (!fs->cache)
		return;
	cache_stats(fs->cache, &cs);
	if (fs->ra)
		cache_ra_stats(fs->ra, &rs);
	c->dir = fs->cache_dir;
	c->bytes = cs.bytes;
	c->max_bytes = cs.max_bytes;
	c->hits = cs.hits;
	c->misses = cs.misses;
	c->readahead_streams = fs->ra ? fs->o->readahead : 0;
	c->readahead_bytes = rs.fetched_bytes;
	c->readahead_errors = rs.errors;
	c->readahead_pending = rs.queued + rs.inflight;
	c->app_read_bytes = atomic_load(&fs->app_read_bytes);
	c->share_read_bytes = atomic_load(&fs->share_read_bytes);
}
