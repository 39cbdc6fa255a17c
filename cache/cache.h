/*
 * cache.h - the read side of ferryfs (../shared/DESIGN.md, "Reads"): a
 * local-disk cache of fixed-size blocks of remote files, and the read-ahead
 * engine that fills it from the remote in parallel streams.
 *
 * Block cache. A cache is a directory on local disk owned by one process
 * at a time (cache_open() flock()s it):
 *   DIR/index.mdb/  LMDB environment: which block of which file version is
 *                   in which slot, in which LRU order (cache.c)
 *   DIR/blocks      the slab: max_bytes / block_size slots of block_size
 *                   bytes each; block data lives at slot * block_size
 *   DIR/open        present while the cache is open: the boot id of the
 *                   machine (a system crash while open discards the cache)
 * Block @i of a file is the bytes [i * block_size, (i + 1) * block_size);
 * only the file's last block may be short. A block belongs to one version
 * of a file (struct cache_key): the cache keeps, per (dev, ino), the
 * version it last saw, and a call naming another version drops every block
 * of the old one first. The FUSE layer validates at open (close-to-open):
 * the key it passes is what the remote said at open.
 *
 * Bound. Cached bytes never exceed max_bytes: there are max_bytes /
 * block_size slots; a put that finds none free evicts the least recently
 * used block (approximately: a block read again while among the youngest
 * 1/8 of the cache is not moved, which keeps most hits free of a write).
 *
 * Durability. Nothing is fsynced per put. A killed process keeps every
 * block whose put returned; a block is served only once all its bytes were
 * written (the slot is written before its index record is committed, and
 * a slot's record is removed before the slot is overwritten). A system
 * crash while the cache was open discards the whole cache at the next open
 * (the slab and the index may have reached the disk in any order): it is
 * made anew from that open's cache_config, as if the directory were empty.
 *
 * Errors: 0 (or a count) on success, -errno on failure:
 *   -EINVAL   a bad argument (block size, a block index or length that does
 *             not fit the key's size, max_bytes below one block)
 *   -EBUSY    cache_open: another process has the cache open
 *   -EPROTO   cache_open: a corrupted LMDB file, or an LMDB environment
 *             that is not a ferryfs cache, or another format version
 *   -ENOSPC   the LMDB map is full
 *   -EAGAIN   cache_put: every slot is being written by another put
 *   -EIO      anything else LMDB reports; a failed slab read or write
 * cache_errmsg() gives a one-line reason for the last cache_open() failure.
 *
 * Threads: every function may be called from any thread at any time,
 * except cache_close() (no other call on the cache may run or follow).
 * Writers of the index take turns (one short LMDB write transaction at a
 * time), readers run in parallel; no lock is held across a slab read or
 * write.
 *
 * Read-ahead engine (struct cache_ra, readahead.c): N fetch threads, each
 * with its own remote connection, that pread blocks at a remote path and
 * cache_put() them (cache_put_fd() where the remote gives a kernel fd).
 * The FUSE layer tells it about every read (cache_ra_note()); a
 * sequential pattern queues the blocks ahead.
 */
#ifndef FERRYFS_CACHE_H
#define FERRYFS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

struct cache;

#define CACHE_FORMAT_VERSION 1
#define CACHE_DEFAULT_BLOCK (1u << 20)
#define CACHE_MIN_BLOCK (64u << 10)
#define CACHE_MAX_BLOCK (16u << 20)

struct cache_config {
	/* bound on cached block bytes; 0 = the stored bound when reopening,
	 * 1/10 of the free space of the cache directory's disk when
	 * creating. A new bound at reopen applies at once (a smaller one
	 * drops the blocks past it). */
	uint64_t max_bytes;
	/* power of two, CACHE_MIN_BLOCK..CACHE_MAX_BLOCK, 0 = default 1 MiB;
	 * used when creating, else the stored one wins (cache_block_size) */
	uint32_t block_size;
};

/* Identity and version of a remote file: blocks are valid only while all
 * of it matches. A small value type. */
struct cache_key {
	uint64_t dev, ino;     /* remote identity */
	uint64_t size;         /* remote size */
	struct timespec mtime; /* remote mtime */
	struct timespec ctime; /* remote ctime (change attribute), 0 if none */
};

/*
 * Open (create if missing) the cache in @dir. Caller owns *out; close with
 * cache_close(). Errors: -EINVAL (bad cfg), -EBUSY, -EPROTO, -ENOSPC, the
 * errors of mkdir/open; on error *out is NULL and cache_errmsg() says why.
 */
int cache_open(const char *dir, const struct cache_config *cfg,
	       struct cache **out);
/* Sync the slab and the index and close. NULL is a no-op. */
void cache_close(struct cache *c);
/* Why the last cache_open() of this thread failed (a per-thread buffer). */
const char *cache_errmsg(void);

uint32_t cache_block_size(const struct cache *c);

/*
 * Copy what the cache holds of [@off, @off + @len) of version @k into
 * @buf. @have has one entry per block the range touches (have[0] for block
 * off / block_size): true where that block's part of @buf was filled.
 * Parts past k->size are zeros and count as had. A key whose version
 * differs from the stored one drops that file's blocks first (counted in
 * invalidations) and serves nothing. Counts a hit or a miss per block
 * inside the file and marks served blocks recently used. Entries of
 * blocks not had leave their part of @buf undefined.
 * Returns 0 or -errno (-EINVAL for off < 0; -EIO, -ENOSPC).
 */
int cache_read(struct cache *c, const struct cache_key *k, void *buf,
	       size_t len, off_t off, bool *have);

/*
 * Store block @index of version @k: @len must be min(block size, k->size -
 * index * block size) (-EINVAL otherwise). Evicts least recently used
 * blocks to stay under the bound. Another version of the file stored
 * before is dropped (the newest caller wins). A block already cached is
 * left as is. Returns 0 or -errno (-EINVAL, -EAGAIN, -ENOSPC, -EIO); on
 * error the block is not cached (evictions it made stay made).
 */
int cache_put(struct cache *c, const struct cache_key *k, uint64_t index,
	      const void *buf, size_t len);

/*
 * cache_put() with the bytes read from the kernel file @fd at @off
 * (splice(): the source's pages are not copied to user space). A file
 * with fewer than @len bytes there gives -ESTALE and caches nothing.
 * Also -errno of splice() (-EINVAL for an fd it cannot splice from).
 */
int cache_put_fd(struct cache *c, const struct cache_key *k, uint64_t index,
		 int fd, off_t off, size_t len);

/*
 * Pin [@off, @off + @len) of version @k, which must lie inside the file,
 * when every block of it is cached: *p then says where its bytes are in
 * the slab (p->fd, the spans s[0..n) in order), and no put overwrites
 * them until cache_unpin(c, p), which the caller calls soon (after one
 * reply: a put of another block may wait for it). Counts hits and marks
 * the blocks used like cache_read(). Returns 0; -ENOENT if a block is not
 * cached (or the version differs; nothing pinned, nothing counted);
 * -E2BIG for a range over more than CACHE_PIN_MAX blocks; -EINVAL;
 * -ENOMEM, -EIO.
 */
#define CACHE_PIN_MAX 17 /* a 1 MiB read over 64 KiB blocks */
struct cache_pin {
	int fd; /* the slab */
	unsigned int n;
	struct {
		uint64_t slot;
		off_t off; /* in the slab */
		size_t len;
	} s[CACHE_PIN_MAX];
};
int cache_pin(struct cache *c, const struct cache_key *k, off_t off,
	      size_t len, struct cache_pin *p);
void cache_unpin(struct cache *c, struct cache_pin *p);

/* Is block @index of version @k cached? No LRU touch, no counting. */
bool cache_has(struct cache *c, const struct cache_key *k, uint64_t index);

/* Drop every block of (@dev, @ino) and forget its version. Returns 0 or
 * -errno (-EIO, -ENOSPC). */
int cache_invalidate(struct cache *c, uint64_t dev, uint64_t ino);

struct cache_stats {
	uint64_t bytes;     /* bytes of cached blocks */
	uint64_t blocks;    /* cached blocks */
	uint64_t max_bytes; /* the bound in effect (slots x block size) */
	/* since cache_open(): */
	uint64_t hits, misses;   /* blocks, by cache_read() */
	uint64_t hit_bytes;      /* bytes served by cache_read() */
	uint64_t put_bytes;      /* bytes stored by cache_put() */
	uint64_t evictions;      /* blocks evicted to make room */
	uint64_t invalidations;  /* blocks dropped: stale version, or
				    cache_invalidate() */
};

/* A snapshot of the counters (bytes and blocks at one instant). */
void cache_stats(struct cache *c, struct cache_stats *out);

/* --- read-ahead ---------------------------------------------------------- */

struct cache_ra;

#define CACHE_RA_STREAMS_DEFAULT 4
#define CACHE_RA_STREAMS_MAX 64
#define CACHE_RA_WINDOW_DEFAULT 64

struct cache_ra_config {
	const char *remote_spec;      /* rmt_open() spec */
	const char *remote_opts;      /* rmt_open() options, may be NULL */
	unsigned int streams;         /* 0 = CACHE_RA_STREAMS_DEFAULT */
	unsigned int max_window_blocks; /* 0 = CACHE_RA_WINDOW_DEFAULT */
};

/*
 * Open cfg->streams remote connections (rmt_open(spec, opts) each, with
 * connections=1: one connection, not a pool, whatever opts say) and
 * start one fetch thread per connection, filling @c. @c must outlive the
 * engine. Caller owns *out; stop with cache_ra_stop(). Errors: -EINVAL (no
 * spec, streams > CACHE_RA_STREAMS_MAX), the errors of rmt_open(),
 * -ENOMEM, -EAGAIN (no thread); on error nothing runs and *out is NULL.
 */
int cache_ra_start(struct cache *c, const struct cache_ra_config *cfg,
		   struct cache_ra **out);
/* Drop what is queued, finish the fetches in flight, close the
 * connections and free @ra. NULL is a no-op. No other call on @ra may run
 * at the same time or follow. */
void cache_ra_stop(struct cache_ra *ra);

/* Per open file state for sequential detection, embedded in the caller's
 * file handle; the caller serialises the notes of one handle. */
struct cache_ra_file {
	off_t last_end;      /* end of the previous read */
	uint32_t window;     /* blocks ahead to keep queued, 0 = random */
	uint64_t next_index; /* first block this run has not queued yet */
};

void cache_ra_file_init(struct cache_ra_file *f);

/*
 * A read of [@off, @off + @len) of the remote file at @path (version @k)
 * happened. A sequential read (off == the previous end, or within 4
 * times the read's size of it: the kernel sends several at once and they
 * come in any order; the first read of a handle at offset 0 too; once
 * sequential, any read within a window of the furthest end) doubles the
 * window (from 1 block, at least
 * the read's size, up to max_window_blocks) and queues the blocks of the
 * window after the read that are not cached and not queued yet. Any other
 * read resets the window and queues nothing. Never blocks on I/O beyond
 * cache_has() lookups; a full queue (4096 blocks) drops the excess.
 */
void cache_ra_note(struct cache_ra *ra, struct cache_ra_file *f,
		   const char *path, const struct cache_key *k, off_t off,
		   size_t len);

/*
 * Wait until block @index of @k is cached, or no fetch of it is queued or
 * in flight, or @timeout_ms passed (< 0: no limit). Returns true if the
 * block is cached now.
 */
bool cache_ra_wait(struct cache_ra *ra, const struct cache_key *k,
		   uint64_t index, int timeout_ms);

struct cache_ra_stats {
	uint64_t fetched_bytes; /* bytes fetched and cached */
	uint64_t fetches;       /* blocks fetched and cached */
	uint64_t errors;        /* fetches dropped: remote error, a file that
				   changed, a failed cache_put() */
	unsigned int queued, inflight;
};

void cache_ra_stats(struct cache_ra *ra, struct cache_ra_stats *out);

#endif
