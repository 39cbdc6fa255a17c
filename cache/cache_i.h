/*
 * cache_i.h - inside cache/: record layouts and the in-memory state of an
 * open cache. Nothing outside cache/ includes this file, except
 * tests/unit/test_cache.c (cache_assert_sane()).
 *
 * Files of the module:
 *   cache.c      design comment (invariants), open/close, the block cache
 *   check.c      cache_assert_sane(): the invariants by a full scan
 *   readahead.c  the read-ahead engine (the only file that calls remote/)
 *
 * Records are host-endian structs (the cache lives on local disk); keys of
 * blocks and files are big-endian so LMDB's order is (dev, ino, index)
 * order and one file's blocks are adjacent. slots and lru use
 * MDB_INTEGERKEY (native size_t keys).
 */
#ifndef FERRYFS_CACHE_I_H
#define FERRYFS_CACHE_I_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cache.h"

#define CACHE_MAGIC 0x43595246u /* "FRYC" read as a little-endian u32 */

/* meta: "meta" -> struct cache_meta_rec */
struct cache_meta_rec {
	uint32_t magic;      /* CACHE_MAGIC */
	uint32_t format;     /* CACHE_FORMAT_VERSION */
	uint32_t block_size; /* fixed at creation */
	uint32_t pad;
	uint64_t nslots;     /* slots in the slab (the bound) */
};

/* blocks: be(dev, ino, index) (24 bytes) -> struct cache_block_rec */
struct cache_block_rec {
	uint64_t slot;
	uint64_t gen; /* put sequence number: unique per stored block */
	uint32_t len;
	uint32_t pad;
};

/* slots: slot -> struct cache_slot_rec */
struct cache_slot_rec {
	uint64_t dev, ino, index;
	uint64_t gen; /* = the block record's */
	uint64_t lru; /* key of its lru record */
	uint32_t len;
	uint32_t pad;
};

/* lru: seq -> slot (uint64_t); the first key is the least recently used */

/* files: be(dev, ino) (16 bytes) -> struct cache_file_rec */
struct cache_file_rec {
	uint64_t size;
	int64_t mtime_sec, mtime_nsec, ctime_sec, ctime_nsec;
};

/* Lock order: wlock, then LMDB's own writer lock (inside mdb_txn_begin).
 * pinlock is taken with no other lock held. */
struct cache {
	char *dir;
	int dirfd;  /* flock()ed while open */
	int slabfd; /* DIR/blocks */
	MDB_env *env;
	MDB_dbi db_meta, db_blocks, db_slots, db_lru, db_files;
	uint32_t block_size;
	uint64_t nslots;

	/* serialises every LMDB write transaction and protects: */
	pthread_mutex_t wlock;
	uint64_t *free_slots; /* stack of free slots; protected by wlock */
	uint64_t nfree;       /* protected by wlock */
	uint64_t writing;     /* slots taken by a put in progress; wlock */
	uint64_t bytes, blocks; /* committed sums; protected by wlock */
	_Atomic uint64_t next_seq; /* next gen/lru seq; written under wlock */

	_Atomic uint64_t hits, misses, hit_bytes, put_bytes, evictions,
		invalidations;

	/* slots pinned by cache_pin() (a multiset; few at a time): no put
	 * writes a pinned slot (invariant 8) */
	pthread_mutex_t pinlock;
	pthread_cond_t unpinned; /* a pin went */
	uint64_t *pins;          /* protected by pinlock */
	size_t npins, pincap;    /* protected by pinlock */
};

/* The one map from LMDB codes to -errno. */
int cache_err_from_mdb(int rc);

void cache_key_block(uint8_t out[24], uint64_t dev, uint64_t ino,
		     uint64_t index);
void cache_key_file(uint8_t out[16], uint64_t dev, uint64_t ino);

/*
 * Check every invariant of cache.c by a full scan under the writer lock;
 * a violation fails with a message naming it (abort()). For tests.
 */
void cache_assert_sane(struct cache *c);

#endif
