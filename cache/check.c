/*
 * check.c - cache_assert_sane(): invariants 1-5 of cache.c by a full scan
 * of the index, under the writer lock so the in-memory sums and free slots
 * are those of the committed records. For tests; costs O(blocks).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_i.h"
#include "log.h"

#define SANE(cond, ...)                                                  \
	do {                                                             \
		if (!(cond))                                             \
			BUG("cache_assert_sane: " __VA_ARGS__);          \
	} while (0)

static void check_blocks(struct cache *c, MDB_txn *txn, uint8_t *state)
{
	MDB_cursor *cur;
	MDB_val k, v;
	int rc;

	SANE(!mdb_cursor_open(txn, c->db_blocks, &cur), "cursor");
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !rc;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct cache_block_rec b;
		struct cache_slot_rec s;
		struct cache_file_rec f;
		uint64_t dev = 0, ino = 0, idx = 0, start, want;
		const uint8_t *p = k.mv_data;
		uint8_t kf[16];
		size_t sk;
		MDB_val ks = { sizeof(sk), &sk }, kv, fv;

		SANE(k.mv_size == 24 && v.mv_size == sizeof(b),
		     "1: block record of size %zu/%zu", k.mv_size, v.mv_size);
		for (int i = 0; i < 8; i++) {
			dev = dev << 8 | p[i];
			ino = ino << 8 | p[8 + i];
			idx = idx << 8 | p[16 + i];
		}
		memcpy(&b, v.mv_data, sizeof(b));
		SANE(b.slot < c->nslots, "1: block in slot %" PRIu64
		     " of %" PRIu64, b.slot, c->nslots);
		SANE(state[b.slot] == 0, "1: slot %" PRIu64 " named twice",
		     b.slot);
		state[b.slot] = 1;
		sk = (size_t)b.slot;
		SANE(!mdb_get(txn, c->db_slots, &ks, &kv) &&
			     kv.mv_size == sizeof(s),
		     "1: block without slot record (slot %" PRIu64 ")", b.slot);
		memcpy(&s, kv.mv_data, sizeof(s));
		SANE(s.dev == dev && s.ino == ino && s.index == idx &&
			     s.gen == b.gen && s.len == b.len,
		     "1: slot %" PRIu64 " does not name its block back", b.slot);
		SANE(b.gen < atomic_load(&c->next_seq) &&
			     s.lru < atomic_load(&c->next_seq) && b.gen <= s.lru,
		     "5: seqs of slot %" PRIu64 " not below next_seq", b.slot);
		cache_key_file(kf, dev, ino);
		kv.mv_size = sizeof(kf);
		kv.mv_data = kf;
		SANE(!mdb_get(txn, c->db_files, &kv, &fv) &&
			     fv.mv_size == sizeof(f),
		     "4: block of a file without a version");
		memcpy(&f, fv.mv_data, sizeof(f));
		start = idx * c->block_size;
		want = start < f.size ? f.size - start : 0;
		if (want > c->block_size)
			want = c->block_size;
		SANE(want && b.len == want, "4: block %" PRIu64 " has length "
		     "%" PRIu32 ", not %" PRIu64, idx, b.len, want);
	}
	SANE(rc == MDB_NOTFOUND, "scan blocks: %s", mdb_strerror(rc));
	mdb_cursor_close(cur);
}

void cache_assert_sane(struct cache *c)
{
	uint8_t *state = calloc(c->nslots, 1);
	uint64_t bytes = 0, nslot = 0, nlru = 0;
	MDB_cursor *cur;
	MDB_txn *txn;
	MDB_val k, v;
	int rc;

	SANE(state, "out of memory");
	pthread_mutex_lock(&c->wlock);
	SANE(!mdb_txn_begin(c->env, NULL, MDB_RDONLY, &txn), "txn");
	check_blocks(c, txn, state);

	SANE(!mdb_cursor_open(txn, c->db_slots, &cur), "cursor");
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !rc;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct cache_slot_rec s;
		size_t slot, lk;
		MDB_val kl = { sizeof(lk), &lk }, lv;
		uint64_t named;

		memcpy(&slot, k.mv_data, sizeof(slot));
		memcpy(&s, v.mv_data, sizeof(s));
		SANE(slot < c->nslots && state[slot] == 1,
		     "1: slot %zu has no block record", slot);
		lk = (size_t)s.lru;
		SANE(!mdb_get(txn, c->db_lru, &kl, &lv) &&
			     lv.mv_size == sizeof(named),
		     "1: slot %zu has no lru record", slot);
		memcpy(&named, lv.mv_data, sizeof(named));
		SANE(named == slot, "1: lru %zu names slot %" PRIu64
		     ", not %zu", lk, named, slot);
		bytes += s.len;
		nslot++;
	}
	SANE(rc == MDB_NOTFOUND, "scan slots: %s", mdb_strerror(rc));
	mdb_cursor_close(cur);

	SANE(!mdb_cursor_open(txn, c->db_lru, &cur), "cursor");
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !rc;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
		nlru++;
	mdb_cursor_close(cur);
	SANE(nlru == nslot, "1: %" PRIu64 " lru records for %" PRIu64
	     " slots", nlru, nslot);

	for (uint64_t i = 0; i < c->nfree; i++) {
		SANE(c->free_slots[i] < c->nslots &&
			     state[c->free_slots[i]] == 0,
		     "2: free slot %" PRIu64 " is cached or free twice",
		     c->free_slots[i]);
		state[c->free_slots[i]] = 2;
	}
	SANE(nslot + c->nfree + c->writing == c->nslots,
	     "2: %" PRIu64 " cached + %" PRIu64 " free + %" PRIu64
	     " writing != %" PRIu64 " slots", nslot, c->nfree, c->writing,
	     c->nslots);
	SANE(c->bytes == bytes && c->blocks == nslot,
	     "3: sums %" PRIu64 "/%" PRIu64 " but records say %" PRIu64
	     "/%" PRIu64, c->bytes, c->blocks, bytes, nslot);
	SANE(bytes <= c->nslots * c->block_size, "3: over the bound");
	mdb_txn_abort(txn);
	pthread_mutex_unlock(&c->wlock);
	free(state);
}
