/*
 * journal.c - the upper layer of ferryfs: open, recovery, meta, the batch
 * and its transactions, the group commit. The contract is journal.h; the
 * record layouts and the split into files are in journal_i.h.
 *
 * Callers: fs/ (every write and namespace change through the mount), the
 * flusher (flush.c: claim/release, ops_ready/ack, clean), `ferryfs status`
 * (jnl_stats), and recovery tools, which open a journal without a mount.
 *
 * ON DISK
 *
 *   DIR/meta.mdb/   LMDB environment directory (data.mdb; lock.mdb is not
 *                   used, MDB_NOLOCK, but may be there from an older
 *                   ferryfs): the subdirectory form, not MDB_NOSUBDIR
 *   DIR/data/<id>   sparse staging file of node <id> (decimal); a crash
 *                   may leave files no record names (harmless)
 *   DIR itself      flock()ed by the process that has it open (-EBUSY,
 *                   after waiting 5 s for a daemon still exiting);
 *                   that is the only lock: one process, LMDB unlocked
 *
 * Named databases: meta, nodes, dentries, chunks, ops (journal.h) and three
 * indexes: dirtyq (claim order), inflight (what recovery must undo),
 * imports (remote identity -> node).
 *
 * CHUNK STATES
 *
 *                 jnl_write(), committed by jnl_commit_pending()
 *     (no record) -----------------------------------------> DIRTY <---+
 *     FLUSHED     ----------------------------------------->   |  ^    |
 *                                                              |  |    |
 *                            jnl_chunk_claim(), oldest dseq    |  |    |
 *                            first, node claimable (inv. 3)    v  |    |
 *                                                        INFLIGHT |    |
 *      jnl_chunk_release(ok=false) ------------------------------+    |
 *      jnl_open() recovery --------------------------------------+    |
 *      jnl_chunk_release(ok=true), generation changed -----------+    |
 *                                                              |       |
 *      jnl_chunk_release(ok=true), generation == claim_gen     |       |
 *                                                              v       |
 *     (no record) ---- jnl_chunk_fill() ------------------> FLUSHED ---+
 *                                                       (a later write)
 *     (no record) <--- jnl_node_clean() (every chunk of the node FLUSHED,
 *                      no op of it pending: FINISH acknowledged) --- FLUSHED
 *     (no record) <--- drop_flushed() (data.c), under staging pressure:
 *                      a full chunk on the remote, no op of the node
 *                      pending; rvalid grows over it ----------------- FLUSHED
 *
 *   A write to an INFLIGHT chunk changes its generation and leaves it
 *   INFLIGHT: one flusher per chunk at a time; the release sends it back to
 *   DIRTY. jnl_setattr(SIZE) deletes the records of chunks past the new
 *   size in any state; a release of a chunk that is no longer INFLIGHT with
 *   the claimed generation is stale and changes nothing.
 *
 *   In DIRTY the staging file holds bytes the remote may not have; in
 *   INFLIGHT a flusher is sending them; in FLUSHED the staging file and the
 *   remote agree on [start, start + length) (sha256 recorded). Without a
 *   record below rvalid the remote has the bytes; the staging bytes of a
 *   record that went stay until the change is durable (invariant 17).
 *
 * INVARIANTS (jnl_assert_sane() checks 1-8 and 12 by a full scan)
 *
 *  1. Every chunk record is DIRTY, INFLIGHT or FLUSHED, with 0 < length <=
 *     chunk size, and belongs to an existing node.
 *  2. A chunk is INFLIGHT iff its key is in `inflight`. Recovery therefore
 *     reads `inflight` only, never the whole journal: opening a journal
 *     holding 100,000 pending files costs what a small one does.
 *  3. A chunk is in `dirtyq` (at its dseq) iff it is DIRTY and its node is
 *     claimable: neither LOCAL (its create is not on the remote, so there is
 *     nowhere to write) nor UNLINKED. jnl_op_ack() of a create and the
 *     unlink of a node's last name move its chunks in and out.
 *  4. meta's dirty/inflight/flushed bytes are the sums of the lengths of the
 *     chunk records in each state; a node's `unflushed` counts its records
 *     not FLUSHED; JNL_NODE_DATA is set iff unflushed > 0; meta.dirty_nodes
 *     counts the nodes with JNL_NODE_DATA; meta.pending_ops counts ops.
 *  5. Generations come from meta.next_gen and never repeat, so a chunk
 *     truncated away and written again cannot match an old claim.
 *  6. Ids come from meta.next_id and op seqs from meta.next_seq: both only
 *     grow, ids are never reused (not even those of a batch a crash lost:
 *     jnl_open() skips JNL_ID_GAP), every record's id/seq is below them.
 *  7. Every dentry names an existing node (or 0, a whiteout); a directory
 *     node's mparent is the parent of its dentry. Every op names existing
 *     nodes, and a node's nops counts the ops naming it.
 *  8. A LOCAL node has create_seq = the seq of its create op, which exists,
 *     unless a cancellation (node.c) made it UNLINKED or a fatal failure
 *     marked it JNL_NODE_ERROR (then 0); a node that is not LOCAL has
 *     create_seq = 0. A LOCAL node's nlink counts its dentries.
 *  9. A namespace change and the op that records it are one change of
 *     the batch: the merged view and the op log never disagree, in memory
 *     or after a crash.
 * 10. Durable mark => durable bytes (like ext4 data=ordered): the group
 *     commit fdatasyncs every staging file it has marks for before it
 *     commits them. A write is: pwrite to staging, then a mark in `pend`
 *     (memory); a crash before the commit loses the mark, never leaves a
 *     DIRTY chunk over bytes that did not reach the disk.
 * 11. Whether the journal holds a chunk ("held": a record, or a mark in
 *     pend/committing) only changes from no to yes while rw is held shared,
 *     and from yes to no only under rw exclusive (truncate, clean, drop;
 *     its staging bytes: jnl_gc_run()). Readers look
 *     at pend/committing first and at LMDB second, so a mark moving from
 *     memory into LMDB is never missed in between.
 * 12. Handed-out ops live only in memory (j->handed): after a crash they
 *     are pending again, and replay is idempotent (journal.h).
 * 13. The release that makes a node's last chunk that is not FLUSHED
 *     FLUSHED appends the node's FINISH op in the same transaction (if the
 *     node still has a name): a node whose data all went out always has
 *     its finishing op logged, crash or not.
 * 14. jnl_node_clean() drops chunk records only of a node with unflushed
 *     0, nops 0 and no mark in pend, and sets its rvalid to its size: the
 *     remote then holds all of its merged content, so the chunks no longer
 *     held are read there (and partial writes fill first); or of an
 *     UNLINKED one with no handle open (j->opens) and no chunk INFLIGHT,
 *     whose content nobody can read any more (its marks committed
 *     first). drop_flushed() drops full FLUSHED chunks with no mark of a
 *     node with nops 0 and raises rvalid only over a contiguous run of
 *     them: the same holds for [0, rvalid). The flusher cleans a node
 *     after each ack of its ops, in a change of its own; a kill in between
 *     leaves a node that could be cleaned and is not, so the committer,
 *     idle after an open, sweeps every node with chunk records once
 *     (jnl_sweep()).
 * 15. Committed changes form a prefix of the changes made: every change
 *     goes into the one batch whole or not at all, in the order of
 *     txn_lock, and the batch commits whole (BATCHES). jnl_ops_ready()
 *     hands out only ops below durable_seq (committed), so the remote is
 *     never ahead of what a crash leaves of the journal.
 * 16. A chunk is durably INFLIGHT before any byte of it is sent: claims
 *     commit the batch (with the releases before them). So recovery
 *     counts every chunk it resends, and at most two claims per stream
 *     (2 x streams x chunk size: flush.c's invariant 7) are resent.
 * 17. Staging bytes go (a file removed by clean, chunks punched out after
 *     a drop, a truncate) only once the change that let them go is
 *     durable, and only if no chunk holds them again by then
 *     (jnl_gc_run() under rw exclusive, staging_cut_durably()): a crash
 *     never brings back a record over bytes that are gone.
 * 18. An op is handed out only once every op it waits for is gone from
 *     the log durably: an ack (jnl_op_ack(), or a jnl_op_fail() that
 *     gives an op up) deletes the op in the open batch and keeps a copy
 *     in j->acked, which jnl_ops_ready() scans as still pending, until a
 *     sync covers that batch: the next batch commit's fdatasync (LMDB
 *     writes the meta page of a commit unsynced, MDB_NOMETASYNC, and the
 *     next commit's fdatasync of the same file covers it), or the sync
 *     after a commit_pending() (jnl_acked_purge(), which then wakes the
 *     flusher; a hungry flusher hurries that commit). So
 *     after a crash no older op replays over a newer one's effect on the
 *     remote: whatever the remote saw of a dependent op, the journal has
 *     the ack it came after.
 * 19. A shrink of a file the remote has (jnl_setattr() to a size below
 *     the size it had, node not LOCAL) sets JNL_NODE_CUT with rcut = the
 *     lowest such size since, in the change of the truncate and its
 *     SETATTR op. While CUT, the node is not claimable: no chunk of it
 *     goes out. The next size replay (that SETATTR, or a FINISH) first
 *     sets the remote's size to rcut, then the node's size; then
 *     jnl_node_send_done() clears CUT unless rcut moved meanwhile. So the
 *     remote's bytes past a shrink (its own, or chunks flushed before it)
 *     are gone before a grow could expose them: in [rvalid, size), bytes
 *     without a chunk record are zeros on the remote as in the merged
 *     view. A claim taken before the shrink is stale or shortened
 *     (jnl_chunk_claimed() compares the length too) and is not written;
 *     a chunk written before it is cut. Replayed after a crash, the cut
 *     is the same: nothing of the node was flushed in between.
 *
 * BATCHES
 *
 *   Every change goes into the batch: LMDB's one write transaction, kept
 *   open all the time (j->txn). A change (jnl_wtx_begin/commit) writes
 *   into it directly, every write through jnl_put()/jnl_del(), which log
 *   what they replace in the undo log (j->undo) first. A change that fails
 *   midway (a bad name found late, no memory) is undone from that log,
 *   last write first (jnl_wtx_abort), so "on error nothing changed" holds
 *   per call. Should the undo fail, or LMDB fail a write in a way that
 *   leaves the transaction unusable (MDB_TXN_ERROR: a full map or dirty
 *   list, which SPACE's reserve and batch_max keep from happening), the
 *   batch is aborted, and the journal FAILED if other changes were in it.
 *   (A change was an LMDB child transaction before: each malloc()s 3 MiB
 *   of page lists, which AddressSanitizer maps and poisons anew, ~3.7 ms a
 *   change on the CI machine.) Every read reads
 *   the batch (jnl_rtx_begin), so lookups, readdir, stats and the flusher
 *   see the journal's own uncommitted changes. All of it under txn_lock:
 *   one user of LMDB at a time, writers and readers alike; each holds it
 *   for microseconds, except a batch commit (one fdatasync).
 *
 *   That is why the environment is MDB_NOLOCK: LMDB's writer mutex must be
 *   unlocked by the thread that locked it, and the batch is begun and
 *   committed by whichever thread comes, and used by all of them in turn.
 *   With MDB_NOLOCK LMDB keeps no thread state; txn_lock serialises every
 *   use of the batch (LMDB's "exclusive lock so that no readers may be
 *   active when a writer begins"), and the flock of DIR keeps out other
 *   processes. The short read transactions map_low() opens also run under
 *   txn_lock, so no commit reuses their pages.
 *
 *   The batch commits (jnl_batch_commit) when the committer thread's
 *   period (JNL_COMMIT_MS) ends after a change, on jnl_sync() and
 *   jnl_fsync_node() (a directory's too), when a claim needs it durable
 *   (invariant 16), when a truncate would throw staging bytes away, when
 *   an exchange (the one op whose replay is not idempotent) is marked
 *   with its source's remote inode before it is sent
 *   (jnl_op_exchange_mark(); its ack then needs no commit of its own),
 *   when writers wait for room and the change made flusher work, and
 *   after batch_max changes (SPACE). Then the next
 *   batch begins at once. A failed batch commit makes the journal
 *   FAILED: changes already answered are gone from memory.
 *
 * DURABILITY
 *
 *   Environment flags MDB_NOTLS | MDB_NOLOCK | MDB_NOMETASYNC: a batch
 *   commit fdatasyncs LMDB's data pages and writes the meta page without a
 *   sync; the next commit's fdatasync, or mdb_env_sync() by the committer
 *   within commit_ms, or jnl_sync()/jnl_fsync_node() at once, makes it
 *   durable. Data pages are always synced before a meta page that names
 *   them is written, so a crash of the process or of the system never
 *   corrupts the database (LMDB's guarantee for NOMETASYNC; MDB_NOSYNC
 *   would not give it: without the sync the system may write a meta page
 *   before the pages it names, and a system crash then leaves a corrupt
 *   database). A namespace change costs no disk sync of its own.
 *
 *   What a crash loses: the changes after the last durable batch commit,
 *   that is of the last JNL_COMMIT_MS or so that nobody synced
 *   (jnl_sync, jnl_fsync_node, a claim...), whole changes and in order:
 *   what survives is a prefix of what was done (invariant 15), as with a
 *   local filesystem's metadata journal (ext4 commits its journal every
 *   5 s; data=ordered is invariant 10 here). A killed process loses the
 *   batch still in memory; a system crash may also undo the last commit
 *   whose meta page was not synced yet. Writes (chunk marks) are lost the
 *   same way; a write may be lost while a later namespace change survives
 *   (a rename after an unsynced write, as ext4 without auto_da_alloc).
 *   jnl_fsync_node(id) makes id's data durable (its staging file only) and
 *   every namespace change so far: its create and its parents' creates
 *   with it. Ids of a lost batch are not handed out again (jnl_open()
 *   skips JNL_ID_GAP ids, more than a batch holds): the staging files of
 *   lost nodes stay as harmless orphans, never seen by new nodes.

 * SPACE
 *
 *   The LMDB map is large and sparse (64 GiB). Changes that may add
 *   records (namespace changes, the group commit) fail with -ENOSPC once
 *   the map is down to a reserve (1/32 of it, 32 pages to 256 MiB, checked
 *   against the last commit); the flusher's changes (ack, claim, release)
 *   may use the reserve, so a full map drains instead of wedging. A batch
 *   holds at most batch_max = reserve / 32 pages changes (a change dirties
 *   fewer than 32 pages) before it commits, so a batch fits in the reserve
 *   it was checked against. A create stores its future remote name
 *   already, so its ack does not grow the record.
 *
 *   Staging has two bounds (data.c): max_bytes (journal_max) on the
 *   staging bytes held (committed records plus reservations of marks), and
 *   the journal disk: bytes reserved since the last look at its free space
 *   (fstatvfs, every 50 ms) against what was free then less a margin (1/64
 *   of the disk, 1 MiB to 256 MiB: LMDB's growth, block rounding, other
 *   writers of the disk). A write that does not fit waits (room_wait(), no
 *   lock held) for the flusher: the group commit is hurried so its marks
 *   become claimable, flusher work commits at once, and room comes back
 *   as chunks are released and dropped or nodes cleaned, and (disk) once
 *   their staging bytes are punched out or removed (jnl_gc_run(), after
 *   the change is durable: invariant 17). After write_wait_ms it fails
 *   with -ENOSPC, nothing changed. Backpressure starts before a bound:
 *   within a quarter of max_bytes (or of the disk's size; at most 1 GiB)
 *   the journal gives back released chunks at once (drop_flushed()), so a
 *   writer meets the bound only if the flusher is slower than it. A
 *   pwrite that finds the disk full still fails at once with -ENOSPC,
 *   nothing marked: the last word.

 * CONFLICTS
 *
 *   Another writer of the share (journal.h "Conflicts"). An imported
 *   regular file with one link records its base: the remote's size and
 *   mtime (ns) at import or refresh (jnl_rec_base_set()), with bseq bumped
 *   at every change of it. The states and the functions behind each
 *   transition are in journal.h (enum jnl_base). Rules:
 *
 *   C1. The flusher changes the data, size or mtime of a tracked node on
 *       the remote only in SENDING, and the SET -> SENDING step
 *       (jnl_node_send_begin()) compares the remote's attributes with the
 *       base and is committed before the first byte goes: the remote's
 *       attributes in SET are never the result of our own writes, crash or
 *       not (a change after the step is durable at least as late).
 *   C2. SENDING -> SET only with the values FINISH applied, while no
 *       stream writes a chunk of the node (jnl_node_send_done() inside the
 *       flusher's gate): the base is then exactly what the remote has.
 *   C3. A conversion (jnl_node_conflict()) happens only in SET with the
 *       bseq the caller compared against, so a stat taken before a
 *       SENDING/SET round trip is never taken for a conflict. It turns the
 *       node's INFLIGHT chunks DIRTY with new generations (a stream's
 *       claim and release are stale, and jnl_node_send_begin() refuses
 *       the claim), drops its SETATTR/FINISH ops (also one handed out to
 *       the converting stream, @allow_seq), and bumps conflict_epoch, at
 *       which every stream closes its cached remote files.
 *   C4. The conflict copy keeps the node's id (open handles go on
 *       writing the local version, as on a local disk); the share's
 *       version gets a new id at the old name, with the imports entry.
 *
 *   Conflicts are counted in meta ("conflicts" -> u64) and the paths of
 *   the JNL_CONFLICTS_KEPT most recent kept ("conflict" + be64 n -> path).

 * LOCKING
 *
 *   commit_lock -> rw -> txn_lock -> lock (journal_i.h). The group
 *   commit holds commit_lock across its fdatasyncs and its transactions,
 *   jnl_setattr(SIZE) and jnl_node_clean() across theirs, so that no mark
 *   is between memory and LMDB while they edit a node's chunks (a setattr
 *   without SIZE takes no commit_lock: it drops the write mtime of marks
 *   in pend and committing under txn_lock, before any group commit can
 *   apply them). jnl_read() holds rw shared from its look at "held" to its
 *   pread, so a clean, drop, truncate or gc (rw exclusive) cannot take the
 *   staging bytes away in between. txn_lock is held by every use of LMDB
 *   (BATCHES), never across a wait for room, a staging fdatasync or a
 *   remote call. The flusher's wake-up hook runs at a batch commit under
 *   lock (lock -> the flusher's own lock; it never calls the journal).
 *   Every decision that combines LMDB state with in-memory sets
 *   (handed-out ops, cancellation of a pending create, marks that a drop
 *   must not pass) is taken under txn_lock, so it sees the latest change.
 *   No lock is held across a remote call: the journal makes none
 *   (flush.c, which does, holds none of these across one).
 */
#include <dirent.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/random.h>
#include <time.h>

#include "crash.h"
#include "journal_i.h"
#include "log.h"
#include "sys.h"

#define JNL_MAP_SIZE (64ull << 30) /* sparse; grows only with use */
#define JNL_ID_GAP 65536 /* ids skipped at open: >= batch_max */
#define JNL_MAX_DBS 10

size_t jnl_test_map_size;
unsigned int jnl_test_commit_ms;
unsigned int jnl_test_env_flags;
bool jnl_test_no_disk_room;
bool jnl_test_sync_each;
unsigned int jnl_test_fail_write;

static _Thread_local char errmsg[512];

static void set_errmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_errmsg(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errmsg, sizeof(errmsg), fmt, ap);
	va_end(ap);
}

const char *jnl_errmsg(void)
{
	return errmsg[0] ? errmsg : "no error";
}

/* --- errors ------------------------------------------------------------- */

int jnl_err_from_mdb(int rc)
{
	if (rc == MDB_SUCCESS)
		return 0;
	if (rc == MDB_NOTFOUND)
		return -ENOENT;
	if (rc == MDB_MAP_FULL || rc == MDB_TXN_FULL)
		return -ENOSPC;
	if (rc > 0)
		return -rc;
	return -EIO;
}

int jnl_fail(struct jnl *j, int rc)
{
	int zero = 0;

	if (rc == -EIO && atomic_compare_exchange_strong(&j->failed, &zero, rc))
		LOG_ERR("journal '%s' failed, every later call returns "
			"the error: %s", j->dir, strerror(-rc));
	return rc;
}

int jnl_mdb(struct jnl *j, int rc)
{
	if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND && rc != MDB_MAP_FULL &&
	    rc != MDB_TXN_FULL && rc < 0)
		LOG_ERR("journal '%s': lmdb: %s", j->dir, mdb_strerror(rc));
	return jnl_fail(j, jnl_err_from_mdb(rc));
}

/* --- transactions ------------------------------------------------------- */

static int meta_get(struct jnl *j, MDB_txn *txn, struct jnl_meta_rec *m)
{
	MDB_val k = { 4, "meta" }, v;
	int rc = mdb_get(txn, j->db_meta, &k, &v);

	if (rc)
		return rc == MDB_NOTFOUND ? jnl_fail(j, -EIO) : jnl_mdb(j, rc);
	if (v.mv_size < sizeof(*m))
		return jnl_fail(j, -EIO);
	memcpy(m, v.mv_data, sizeof(*m));
	return 0;
}

static int meta_put(struct jnl *j, MDB_txn *txn, const struct jnl_meta_rec *m)
{
	MDB_val k = { 4, "meta" }, v = { sizeof(*m), (void *)m };

	return jnl_mdb(j, jnl_put(j, txn, j->db_meta, &k, &v, 0));
}

/* Is the map down to its reserve? Counts LMDB's free pages (as mdb_stat -f
 * does, in a read transaction: LMDB has no cursor on them in a write one)
 * only when the map's high-water mark is near its end. An estimate: a
 * commit may run meanwhile, the reserve absorbs it. */
static int map_low(struct jnl *j)
{
	MDB_envinfo info;
	MDB_cursor *c;
	MDB_txn *txn;
	MDB_val k, v;
	size_t room;
	int rc;

	mdb_env_info(j->env, &info);
	room = j->map_pages - info.me_last_pgno - 1;
	if (room >= j->reserve_pages)
		return 0;
	rc = mdb_txn_begin(j->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return jnl_mdb(j, rc);
	rc = mdb_cursor_open(txn, 0 /* FREE_DBI */, &c);
	if (rc) {
		mdb_txn_abort(txn);
		return jnl_mdb(j, rc);
	}
	while (room < j->reserve_pages &&
	       !(rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)))
		if (v.mv_size >= sizeof(size_t))
			room += *(const size_t *)v.mv_data;
	mdb_cursor_close(c);
	mdb_txn_abort(txn);
	if (rc && rc != MDB_NOTFOUND)
		return jnl_mdb(j, rc);
	return room < j->reserve_pages ? -ENOSPC : 0;
}

/* The batch, opened if there is none. txn_lock held. */
static int batch_get(struct jnl *j)
{
	int rc;

	if (j->txn)
		return 0;
	rc = mdb_txn_begin(j->env, NULL, 0, &j->txn);
	if (rc) {
		j->txn = NULL;
		LOG_ERR("cannot begin a transaction in journal '%s': %s",
			j->dir, mdb_strerror(rc));
		return jnl_fail(j, -EIO);
	}
	j->batch_ops = 0;
	return 0;
}

int jnl_wtx_begin(struct jnl *j, struct jnl_wtx *w, bool grow)
{
	int rc = jnl_failed(j);

	if (rc)
		return rc;
	w->j = j;
	w->m_dirty = false;
	w->wake = false;
	w->sync = false;
	w->unreserve = 0;
	pthread_mutex_lock(&j->txn_lock);
	rc = jnl_failed(j);
	if (!rc)
		rc = batch_get(j);
	if (!rc && grow)
		rc = map_low(j);
	if (!rc) {
		w->txn = j->txn;
		rc = meta_get(j, w->txn, &w->m);
	}
	if (rc) {
		pthread_mutex_unlock(&j->txn_lock);
		return rc;
	}
	j->undo.on = true; /* empty: undo_end() emptied it */
	return 0;
}

/* --- the undo log (BATCHES) --------------------------------------------- */

static bool undo_logs(const struct jnl *j, const MDB_txn *txn)
{
	return j->undo.on && txn == j->txn;
}

/* Log that (k, v) is to be put back (@put), or k (with v: that dupsort
 * pair) deleted. Copies both: v may point into LMDB's pages. */
static int undo_push(struct jnl_undo *u, MDB_dbi dbi, bool put,
		     const MDB_val *k, const MDB_val *v)
{
	size_t need = k->mv_size + (v ? v->mv_size : 0);
	struct jnl_undo_ent *e;

	if (u->n == u->cap) {
		size_t cap = u->cap ? u->cap * 2 : 16;
		struct jnl_undo_ent *ne = realloc(u->e, cap * sizeof(*ne));

		if (!ne)
			return ENOMEM;
		u->e = ne;
		u->cap = cap;
	}
	if (u->len + need > u->bcap) {
		size_t cap = u->bcap ? u->bcap * 2 : 4096;
		unsigned char *nb;

		while (cap < u->len + need)
			cap *= 2;
		nb = realloc(u->buf, cap);
		if (!nb)
			return ENOMEM;
		u->buf = nb;
		u->bcap = cap;
	}
	e = &u->e[u->n++];
	e->dbi = dbi;
	e->put = put;
	e->has_val = v != NULL;
	e->klen = (uint32_t)k->mv_size;
	e->vlen = v ? (uint32_t)v->mv_size : 0;
	e->off = u->len;
	memcpy(u->buf + u->len, k->mv_data, k->mv_size);
	if (v && v->mv_size)
		memcpy(u->buf + u->len + k->mv_size, v->mv_data, v->mv_size);
	u->len += need;
	return 0;
}

static void undo_pop(struct jnl_undo *u)
{
	u->len = u->e[--u->n].off;
}

/* The change is over: forget its log (a big one's memory too). */
static void undo_end(struct jnl_undo *u)
{
	u->on = false;
	u->n = 0;
	u->len = 0;
	if (u->bcap > (1u << 20)) {
		free(u->buf);
		u->buf = NULL;
		u->bcap = 0;
	}
}

/* Log, before a write of (k, v) (@del: a delete) in the open change, what
 * undoes it. A dupsort pair: deleting it or putting it back; else the
 * record it replaces, or deleting what it adds. */
static int undo_before(struct jnl *j, MDB_dbi dbi, MDB_val *k, MDB_val *v,
		       bool del)
{
	MDB_val old;
	int rc;

	if (dbi == j->db_folds)
		return undo_push(&j->undo, dbi, del, k, v);
	rc = mdb_get(j->txn, dbi, k, &old);
	if (rc == MDB_NOTFOUND && !del)
		return undo_push(&j->undo, dbi, false, k, NULL);
	/* MDB_NOTFOUND for a delete: what mdb_del() says too */
	return rc ? rc : undo_push(&j->undo, dbi, true, k, &old);
}

static int write_logged(struct jnl *j, MDB_txn *txn, MDB_dbi dbi, MDB_val *k,
			MDB_val *v, unsigned int flags, bool del)
{
	bool log = undo_logs(j, txn);
	int rc;

	if (!log)
		return del ? mdb_del(txn, dbi, k, v)
			   : mdb_put(txn, dbi, k, v, flags);
	if (jnl_test_fail_write && !--jnl_test_fail_write)
		return MDB_MAP_FULL;
	if (dbi == j->db_folds && (del ? !v : !(flags & MDB_NODUPDATA)))
		BUG("a dupsort write that cannot be undone (a put without "
		    "MDB_NODUPDATA, or a delete of all values)");
	rc = undo_before(j, dbi, k, v, del);
	if (rc)
		return rc;
	rc = del ? mdb_del(txn, dbi, k, v) : mdb_put(txn, dbi, k, v, flags);
	if (rc)
		undo_pop(&j->undo); /* nothing written (or the batch is lost) */
	return rc;
}

int jnl_put(struct jnl *j, MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v,
	    unsigned int flags)
{
	return write_logged(j, txn, dbi, k, v, flags, false);
}

int jnl_del(struct jnl *j, MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v)
{
	return write_logged(j, txn, dbi, k, v, 0, true);
}

/* Put back what the open change replaced, last write first. A failure
 * (LMDB refuses a transaction it marked failed) loses the batch. */
static void undo_run(struct jnl *j)
{
	struct jnl_undo *u = &j->undo;
	int rc = 0;

	while (u->n && !rc) {
		const struct jnl_undo_ent *e = &u->e[--u->n];
		MDB_val k = { e->klen, u->buf + e->off };
		MDB_val v = { e->vlen, u->buf + e->off + e->klen };

		rc = e->put ? mdb_put(j->txn, e->dbi, &k, &v, 0)
			    : mdb_del(j->txn, e->dbi, &k,
				      e->has_val ? &v : NULL);
	}
	undo_end(u);
	if (!rc)
		return;
	mdb_txn_abort(j->txn);
	j->txn = NULL;
	if (j->batch_ops) {
		/* changes already answered went with it */
		LOG_ERR("journal '%s': cannot undo a failed change: %s",
			j->dir, mdb_strerror(rc));
		jnl_fail(j, -EIO);
	}
	/* else nothing but this change was in it: batch_get() begins anew */
}

void jnl_wtx_abort(struct jnl_wtx *w)
{
	undo_run(w->j);
	pthread_mutex_unlock(&w->j->txn_lock);
}

static int gc_add(struct jnl_gc *g, const struct jnl_gc_ent *e)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 16;
		struct jnl_gc_ent *ne = realloc(g->e, cap * sizeof(*ne));

		if (!ne)
			return -ENOMEM;
		g->e = ne;
		g->cap = cap;
	}
	g->e[g->n++] = *e;
	return 0;
}

int jnl_gc_add(struct jnl *j, jnl_id id, uint64_t first, uint64_t count)
{
	struct jnl_gc_ent e = { id, first, count };

	return gc_add(&j->gc_new, &e);
}

static void gc_free(struct jnl_gc *g)
{
	free(g->e);
	memset(g, 0, sizeof(*g));
}

int jnl_wtx_commit(struct jnl_wtx *w)
{
	struct jnl *j = w->j;
	uint64_t staged;
	int rc = 0;

	if (w->m_dirty)
		rc = meta_put(j, w->txn, &w->m);
	if (rc) {
		jnl_wtx_abort(w);
		return rc;
	}
	undo_end(&j->undo);
	j->batch_ops++;
	if (w->wake)
		j->wake_pending = true;
	staged = w->m.dirty_bytes + w->m.inflight_bytes + w->m.flushed_bytes;
	pthread_mutex_lock(&j->lock);
	if (staged < j->staged + w->unreserve)
		jnl_room_signal(j);
	j->staged = staged;
	j->pend_new -= w->unreserve;
	if (w->wake)
		j->flusher_work = true;
	if (!j->dirty) {
		j->dirty = true;
		pthread_cond_signal(&j->cond);
	}
	/* writers wait for room: flusher work (a FINISH appended, an op
	 * acknowledged) must not wait for the period */
	if (w->wake && j->waiters)
		w->sync = true;
	pthread_mutex_unlock(&j->lock);
	if (w->sync || j->batch_ops >= j->batch_max)
		rc = jnl_batch_commit(j);
	pthread_mutex_unlock(&j->txn_lock);
	return rc;
}

int jnl_batch_commit(struct jnl *j)
{
	struct jnl_meta_rec m;
	bool wake, freed;
	int rc;

	pthread_mutex_lock(&j->lock);
	if (!j->dirty) { /* nothing changed since the last commit */
		pthread_mutex_unlock(&j->lock);
		return jnl_failed(j);
	}
	pthread_mutex_unlock(&j->lock);
	if (!j->txn) /* dirty but no batch: it was lost */
		return jnl_fail(j, -EIO);
	rc = meta_get(j, j->txn, &m);
	if (!rc) {
		CRASH_POINT("batch_commit"); /* the batch is lost */
		rc = mdb_txn_commit(j->txn);
		j->txn = NULL;
		if (rc) {
			/* the batch is gone with changes already answered */
			LOG_ERR("cannot commit journal '%s': %s", j->dir,
				mdb_strerror(rc));
			rc = jnl_fail(j, -EIO);
		}
	}
	if (rc)
		return rc;
	j->durable_seq = m.next_seq;
	/* this commit's fdatasync made the batches before it durable, meta
	 * page and all (MDB_NOMETASYNC writes it through the same file):
	 * the acks in them no longer hold anything back (invariant 18) */
	freed = j->acked.n && jnl_acked_purge(j, j->batch_gen, false);
	j->batch_gen++;
	/* what the batch cleaned up may go once the commit is synced */
	for (size_t i = 0; i < j->gc_new.n; i++)
		if (gc_add(&j->gc_due, &j->gc_new.e[i]))
			break; /* no memory: the bytes stay (harmless) */
	j->gc_new.n = 0;
	wake = j->wake_pending || freed;
	j->wake_pending = false;
	rc = batch_get(j);
	pthread_mutex_lock(&j->lock);
	j->dirty = false;
	j->hungry = false;
	j->flusher_work = false;
	j->commit_end_ns = jnl_mono_ns();
	if (!j->unsynced) {
		j->unsynced = true;
		pthread_cond_signal(&j->cond);
	}
	if (wake && j->notify_fn)
		j->notify_fn(j->notify_arg);
	pthread_mutex_unlock(&j->lock);
	return rc;
}

int64_t jnl_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void jnl_hungry(struct jnl *j)
{
	int64_t now = jnl_mono_ns();

	pthread_mutex_lock(&j->lock);
	j->hungry = true;
	/* work the flusher gave itself (the FINISH a chunk's release
	 * appended, ops an acknowledgement let go) waits for the commit:
	 * an idle flusher takes it now, or JNL_HUNGRY_GAP_MS after the
	 * last one (hungry_due()), not a period later */
	if (j->flusher_work || j->acks_unsynced) {
		if (now - j->commit_end_ns >=
		    (int64_t)JNL_HUNGRY_GAP_MS * 1000000)
			j->hurry = true;
		pthread_cond_signal(&j->cond);
	}
	pthread_mutex_unlock(&j->lock);
}

/* The committer's wait for the next commit: true if a hungry flusher's
 * work makes it due now, else @until is brought forward to when it is.
 * Without it a flusher that ran dry within JNL_HUNGRY_GAP_MS of a commit
 * waited out the whole period (100 ms) for the acks its next ops wait
 * for (invariant 18): 10,000 small files flushed 12% slower. lock. */
static bool hungry_due(struct jnl *j, struct timespec *until)
{
	int64_t at, till;

	if (!j->hungry || !(j->flusher_work || j->acks_unsynced))
		return false;
	at = j->commit_end_ns + (int64_t)JNL_HUNGRY_GAP_MS * 1000000;
	if (jnl_mono_ns() >= at)
		return true;
	till = (int64_t)until->tv_sec * 1000000000 + until->tv_nsec;
	if (at < till) {
		until->tv_sec = (time_t)(at / 1000000000);
		until->tv_nsec = (long)(at % 1000000000);
	}
	return false;
}

int jnl_notify_set(struct jnl *j, jnl_notify_fn fn, void *arg)
{
	int rc = 0;

	pthread_mutex_lock(&j->lock);
	if (fn && j->notify_fn) {
		rc = -EBUSY;
	} else {
		j->notify_fn = fn;
		j->notify_arg = fn ? arg : NULL;
	}
	pthread_mutex_unlock(&j->lock);
	return rc;
}

int jnl_rtx_begin(struct jnl *j, MDB_txn **txn)
{
	int rc = jnl_failed(j);

	if (rc)
		return rc;
	pthread_mutex_lock(&j->txn_lock);
	rc = jnl_failed(j);
	if (!rc)
		rc = batch_get(j);
	if (rc) {
		pthread_mutex_unlock(&j->txn_lock);
		return rc;
	}
	*txn = j->txn;
	return 0;
}

void jnl_rtx_end(struct jnl *j)
{
	pthread_mutex_unlock(&j->txn_lock);
}

void jnl_room_signal(struct jnl *j)
{
	if (j->waiters)
		pthread_cond_broadcast(&j->room);
}

/* --- group commit ------------------------------------------------------- */

/* Put the marks of @from back in front of @to (a commit failed). */
static void ptab_merge(struct jnl_ptab *to, struct jnl_ptab *from)
{
	for (size_t i = 0; i < from->cap; i++) {
		struct jnl_pent *f = &from->e[i], *t;

		if (!(f->flags & JNL_PENT_USED))
			continue;
		t = jnl_ptab_get(to, f->id, f->idx);
		if (!t)
			BUG("out of memory keeping chunk marks");
		if ((f->flags & JNL_PENT_FILL) && !(t->flags & JNL_PENT_FILL))
			memcpy(t->sha256, f->sha256, sizeof(t->sha256));
		if ((f->flags & JNL_PENT_MTIME) && !(t->flags & JNL_PENT_MTIME))
			t->mtime = f->mtime;
		t->flags |= f->flags;
		if (f->len > t->len)
			t->len = f->len;
		if (f->max_end > t->max_end)
			t->max_end = f->max_end;
		t->added += f->added;
	}
}

/* Move the marks of node @only from pend to committing (lock held;
 * committing is empty). */
static void ptab_take(struct jnl *j, jnl_id only)
{
	struct jnl_ptab rest = { 0 };

	for (size_t i = 0; i < j->pend.cap; i++) {
		struct jnl_pent *e = &j->pend.e[i], *t;

		if (!(e->flags & JNL_PENT_USED))
			continue;
		t = jnl_ptab_get(e->id == only ? &j->committing : &rest, e->id,
				 e->idx);
		if (!t)
			BUG("out of memory keeping chunk marks");
		*t = *e;
	}
	jnl_ptab_free(&j->pend);
	j->pend = rest;
}

/* A commit fdatasyncs the staging file of every node it has dirty or
 * filled chunks of. One by one, each waits for a commit of the file
 * system's journal of its own (ext4 here: 0.55-0.94 s for 1,000 one-byte
 * files, and 100,000 pending creates made an unmount wait 27.7 s in its
 * jnl_sync()); one syncfs() of the staging directory's file system took
 * 0.02 s for them. But syncfs() also writes what other programs left dirty
 * on that disk, while the commit holds commit_lock (an fsync in the mount
 * waits for it), and as the committer's periodic sync it made a `cp -r` of
 * 10,000 small files into the mount 10-35% slower (tests/bench/
 * ab_small.sh; as did the fdatasyncs 16 at a time through io_uring, 1.6x,
 * though they took 0.11-0.14 s for the 1,000). So syncfs() is for a commit
 * of more than JNL_SYNC_EACH_MAX files that someone waits for as a whole
 * (jnl_sync(), jnl_close()), or of more than JNL_SYNC_EACH_LAGGING (the
 * committer fell behind: 100 ms of such a `cp` is ~150 files), and only
 * while the system's dirty and writeback pages are within what this
 * commit wrote, JNL_SYNCFS_OTHERS_MAX more and JNL_SYNCFS_PER_FILE more
 * for each of its files: an fdatasync each took 0.28 ms a file (the
 * 100,000 above), in which this disk writes more than that (the
 * fdatasync of a 1 GiB staging file took 0.72 s). Without that last term
 * an unmount of 30,000 pending files beside a `dd` that kept 2.2 GB dirty
 * took 8.3 s, one fdatasync each; with it 0.63 s. */
#define JNL_SYNC_EACH_MAX 16
#define JNL_SYNC_EACH_LAGGING 1024
#define JNL_SYNCFS_OTHERS_MAX (64ull << 20)
#define JNL_SYNCFS_PER_FILE (128ull << 10)

/* The system's dirty and writeback bytes (/proc/meminfo), or UINT64_MAX. */
static uint64_t dirty_bytes(void)
{
	char line[128];
	uint64_t sum = 0, kb;
	int found = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return UINT64_MAX;
	while (found < 2 && fgets(line, sizeof(line), f))
		if (sscanf(line, "Dirty: %" SCNu64, &kb) == 1 ||
		    sscanf(line, "Writeback: %" SCNu64, &kb) == 1) {
			sum += kb << 10;
			found++;
		}
	fclose(f);
	return found == 2 ? sum : UINT64_MAX;
}

/* Is @e's staging file one to sync now? A passthrough node's need not
 * be with @defer (a commit nobody waits for): while its marker pt/<id>
 * stays, a crash loses none of it (jnl_pt_recover() marks it all again),
 * and the marker goes only after the committer synced it
 * (pt_sync_deferred()). So a file copied in through passthrough starts
 * to flow at its close, not a sync of all of it later (0.72 s for 1 GiB
 * here). @ended: pins that ended for this commit. */
static bool sync_wanted(struct jnl *j, const struct jnl_pent *e, bool defer,
			const struct jnl_u64set *ended)
{
	bool pt;

	if (!(e->flags & (JNL_PENT_DIRTY | JNL_PENT_FILL)))
		return false;
	if (!defer)
		return true;
	pthread_mutex_lock(&j->lock);
	pt = jnl_pt_pinned_locked(j, e->id) || jnl_u64set_has(ended, e->id) ||
	     jnl_u64set_has(&j->pt_ended, e->id);
	pthread_mutex_unlock(&j->lock);
	return !pt;
}

/* fdatasync the staging file of node @id: 0 if it has none (cancelled,
 * truncated away, cleaned), and nothing left to lose then */
static int sync_one(struct jnl *j, jnl_id id)
{
	int fd, rc;

	rc = jnl_fd_get(j, id, false, &fd);
	if (rc == -ENOENT)
		return 0;
	if (!rc) {
		rc = jnl_sys_fdatasync(fd);
		jnl_fd_put(j, id, fd);
	}
	if (rc)
		LOG_ERR("cannot sync staging file of node %" PRIu64
			" in '%s': %s", id, j->dir, strerror(-rc));
	return rc;
}

/* fdatasync the staging file of every node in @t with dirty or filled
 * chunks (but those sync_wanted() leaves). */
static int sync_staging_each(struct jnl *j, struct jnl_ptab *t, bool defer,
			     const struct jnl_u64set *ended)
{
	struct jnl_u64set done = { 0 };
	int rc = 0;

	for (size_t i = 0; i < t->cap && !rc; i++) {
		struct jnl_pent *e = &t->e[i];

		if (!sync_wanted(j, e, defer, ended) ||
		    jnl_u64set_has(&done, e->id))
			continue;
		rc = jnl_u64set_add(&done, e->id);
		if (!rc)
			rc = sync_one(j, e->id);
	}
	jnl_u64set_free(&done);
	return rc;
}

static int sync_staging(struct jnl *j, struct jnl_ptab *t, bool waited,
			bool defer, const struct jnl_u64set *ended)
{
	size_t max = waited ? JNL_SYNC_EACH_MAX : JNL_SYNC_EACH_LAGGING;
	struct jnl_u64set ids = { 0 };
	uint64_t ours = 0;
	int rc = 0;

	for (size_t i = 0; i < t->cap && !rc; i++) {
		struct jnl_pent *e = &t->e[i];

		if (!sync_wanted(j, e, defer, ended))
			continue;
		ours += e->len;
		rc = jnl_u64set_add(&ids, e->id);
	}
	if (!rc && ids.used > max && !jnl_test_sync_each &&
	    dirty_bytes() <= ours + JNL_SYNCFS_OTHERS_MAX +
				     ids.used * JNL_SYNCFS_PER_FILE) {
		/* An error syncfs reports may be another file's on that
		 * disk: the files one by one tell (a file's writeback error
		 * stays for its next fdatasync, whoever saw the disk's). */
		rc = syncfs(j->datafd) < 0 ? -errno : 0;
		if (rc)
			rc = sync_staging_each(j, t, defer, ended);
	} else if (!rc) {
		rc = sync_staging_each(j, t, defer, ended);
	}
	jnl_u64set_free(&ids);
	return rc == -EIO ? jnl_fail(j, rc) : rc;
}

/* @waited: someone waits for the whole batch (jnl_sync(), jnl_close(),
 * jnl_commit()); @defer: passthrough staging files may be synced later
 * (sync_wanted()) */
static int commit_pending(struct jnl *j, bool locked, jnl_id only, bool waited,
			  bool defer)
{
	struct jnl_ptab tmp;
	struct jnl_u64set ended = { 0 };
	struct jnl_gc due = { 0 };
	struct jnl_wtx w;
	uint64_t reserved = 0, synced_gen = 0;
	bool any, unsynced;
	int rc, marks_rc;

	if (!locked)
		pthread_mutex_lock(&j->commit_lock);
	pthread_mutex_lock(&j->lock);
	if (only) {
		ptab_take(j, only); /* committing is empty: commit_lock */
	} else {
		tmp = j->committing;
		j->committing = j->pend;
		j->pend = tmp;
		/* their last marks are in what this commits */
		ended = j->pt_ended;
		memset(&j->pt_ended, 0, sizeof(j->pt_ended));
	}
	any = j->committing.used > 0;
	defer = defer && (j->pt_npins || ended.used || j->pt_ended.used);
	pthread_mutex_unlock(&j->lock);

	rc = jnl_failed(j);
	if (!rc && any) {
		for (size_t i = 0; i < j->committing.cap; i++)
			if (j->committing.e[i].flags & JNL_PENT_USED)
				reserved += j->committing.e[i].added;
		rc = sync_staging(j, &j->committing, waited, defer, &ended);
		if (!rc)
			rc = jnl_wtx_begin(j, &w, true);
		if (!rc) {
			rc = jnl_pend_apply(&w, &j->committing);
			w.unreserve = reserved;
			if (rc)
				jnl_wtx_abort(&w);
			else
				rc = jnl_wtx_commit(&w);
		}
	}
	marks_rc = rc;
	/* the namespace changes go even if the marks could not (-ENOSPC) */
	rc = jnl_failed(j);
	if (!rc) {
		pthread_mutex_lock(&j->txn_lock);
		rc = jnl_batch_commit(j);
		/* every clean-up committed so far is covered by the sync */
		due = j->gc_due;
		memset(&j->gc_due, 0, sizeof(j->gc_due));
		synced_gen = j->batch_gen; /* so is every batch below it */
		pthread_mutex_unlock(&j->txn_lock);
	}
	pthread_mutex_lock(&j->lock);
	unsynced = j->unsynced;
	j->unsynced = false;
	pthread_mutex_unlock(&j->lock);
	if (!rc && unsynced)
		rc = jnl_mdb(j, mdb_env_sync(j->env, 1));
	if (!rc) {
		/* acks the sync made durable: what waited for them may go
		 * (invariant 18) */
		bool freed;

		pthread_mutex_lock(&j->txn_lock);
		freed = j->acked.n &&
			jnl_acked_purge(j, synced_gen, !j->dirty);
		pthread_mutex_unlock(&j->txn_lock);
		pthread_mutex_lock(&j->lock);
		if (freed && j->notify_fn)
			j->notify_fn(j->notify_arg);
		pthread_mutex_unlock(&j->lock);
	}
	if (rc) {
		pthread_mutex_lock(&j->txn_lock);
		for (size_t i = 0; i < due.n; i++) /* for the next try */
			if (gc_add(&j->gc_due, &due.e[i]))
				break;
		pthread_mutex_unlock(&j->txn_lock);
		pthread_mutex_lock(&j->lock);
		j->unsynced = j->unsynced || unsynced;
		pthread_mutex_unlock(&j->lock);
	} else if (due.n) {
		jnl_gc_run(j, &due);
	}
	gc_free(&due);

	if (!rc && !marks_rc && !defer)
		jnl_pt_unmark(j, &ended);
	pthread_mutex_lock(&j->lock);
	if (!rc && !marks_rc && defer && ended.used) {
		/* their markers go once the committer synced them */
		for (size_t i = 0; i < ended.cap; i++)
			if (ended.v[i] &&
			    !jnl_u64set_add(&j->pt_unsynced, ended.v[i]))
				ended.v[i] = 0; /* else: back to pt_ended */
		pthread_cond_signal(&j->cond); /* the committer's timer */
	}
	for (size_t i = 0; i < ended.cap; i++) /* not committed: next time */
		if (ended.v[i] && jnl_u64set_add(&j->pt_ended, ended.v[i]))
			break; /* the marker stays: the next open marks again */
	jnl_u64set_free(&ended);
	if (marks_rc && any) /* not applied: keep them for the next try */
		ptab_merge(&j->pend, &j->committing);
	/* else their reservations went with the records (w.unreserve) */
	jnl_ptab_clear(&j->committing);
	j->commit_err = marks_rc == -ENOSPC ? marks_rc : 0;
	pthread_mutex_unlock(&j->lock);
	if (!locked)
		pthread_mutex_unlock(&j->commit_lock);
	return marks_rc ? marks_rc : rc;
}

int jnl_commit_pending(struct jnl *j, bool locked, jnl_id only)
{
	return commit_pending(j, locked, only, false, !only);
}

/* The staging files of @due (ended pins, their last marks committed:
 * commit_pending() "defer") are synced: their markers go. One that cannot
 * be synced keeps its marker (logged; the next open marks it again). The
 * committer does this JNL_PT_LAZY_NS to twice that after the close: by
 * then most such files are on the remote and their staging files gone
 * (nothing to sync), and the system has written the others back itself
 * (vm.dirty_expire_centisecs, 30 s by default): a sync of the 1 GiB just
 * copied in at its close slowed the flush of it by the claims' LMDB syncs
 * queued behind its writes. */
static void pt_sync_deferred(struct jnl *j, struct jnl_u64set *due)
{
	for (size_t i = 0; i < due->cap; i++) {
		int rc = due->v[i] ? sync_one(j, due->v[i]) : 0;

		if (rc) {
			if (rc == -EIO)
				jnl_fail(j, rc);
			due->v[i] = 0;
			due->used--;
		}
	}
	jnl_pt_unmark(j, due);
	jnl_u64set_free(due);
}

/* @ts = now + @ms on CLOCK_MONOTONIC */
static void mono_after(struct timespec *ts, long ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_nsec += ms * 1000000L;
	ts->tv_sec += ts->tv_nsec / 1000000000L;
	ts->tv_nsec %= 1000000000L;
}

/* CLOCK_MONOTONIC in ns a commit period from now */
static int64_t next_period(const struct jnl *j)
{
	return jnl_mono_ns() + (int64_t)j->commit_ms * 1000000;
}

static void *committer(void *arg)
{
	struct jnl *j = arg;
	int64_t next_grow = next_period(j);
	int64_t next_lazy = jnl_mono_ns() + JNL_PT_LAZY_NS;

	pthread_mutex_lock(&j->lock);
	while (!j->stop) {
		struct timespec until;
		bool grow;

		if ((j->pt_unsynced.used || j->pt_unsynced_old.used) &&
		    jnl_mono_ns() >= next_lazy) {
			struct jnl_u64set due = j->pt_unsynced_old;

			j->pt_unsynced_old = j->pt_unsynced;
			memset(&j->pt_unsynced, 0, sizeof(j->pt_unsynced));
			next_lazy = jnl_mono_ns() + JNL_PT_LAZY_NS;
			pthread_mutex_unlock(&j->lock);
			pt_sync_deferred(j, &due);
			pthread_mutex_lock(&j->lock);
			continue;
		}
		if (j->pt_npins && jnl_mono_ns() >= next_grow) {
			/* passthrough files grow behind the journal's back */
			next_grow = next_period(j);
			pthread_mutex_unlock(&j->lock);
			jnl_pt_grow(j);
			pthread_mutex_lock(&j->lock);
			continue;
		}

		if (j->clean_due.used) {
			/* passthrough pins ended whose clean was put off */
			struct jnl_u64set due = j->clean_due;

			memset(&j->clean_due, 0, sizeof(j->clean_due));
			pthread_mutex_unlock(&j->lock);
			for (size_t i = 0; i < due.cap; i++) {
				int rc = due.v[i] ? jnl_node_clean(j, due.v[i])
						  : 0;

				if (rc && rc != -EBUSY && rc != -ENOENT)
					LOG_WARN("cannot clean node %" PRIu64
						 " of the journal: %s",
						 due.v[i], strerror(-rc));
			}
			jnl_u64set_free(&due);
			pthread_mutex_lock(&j->lock);
			continue;
		}
		if (!j->pend.used && !j->dirty && !j->unsynced) {
			/* nothing else to do: a slice of the sweep, or wait */
			jnl_id from = j->sweep_next;
			int rc;

			int64_t wake = INT64_MAX;

			if (j->pt_npins)
				wake = next_grow;
			if ((j->pt_unsynced.used || j->pt_unsynced_old.used) &&
			    next_lazy < wake)
				wake = next_lazy;
			if (!from && wake != INT64_MAX) {
				until.tv_sec = (time_t)(wake / 1000000000);
				until.tv_nsec = (long)(wake % 1000000000);
				pthread_cond_timedwait(&j->cond, &j->lock, &until);
				continue;
			}
			if (!from) {
				pthread_cond_wait(&j->cond, &j->lock);
				continue;
			}
			pthread_mutex_unlock(&j->lock);
			rc = jnl_sweep(j, &from);
			if (rc < 0 && rc != -EIO)
				LOG_WARN("journal '%s': cannot look for nodes "
					 "to clean: %s", j->dir, strerror(-rc));
			pthread_mutex_lock(&j->lock);
			j->sweep_next = rc < 0 ? 0 : from;
			continue;
		}
		mono_after(&until, (long)j->commit_ms);
		while (!j->stop && !j->hurry && !hungry_due(j, &until) &&
		       pthread_cond_timedwait(&j->cond, &j->lock, &until) !=
			       ETIMEDOUT)
			;
		if (j->stop)
			break;
		j->hurry = false;
		grow = j->pt_npins != 0;
		pthread_mutex_unlock(&j->lock);
		if (grow) { /* what they grew by goes with this commit */
			next_grow = next_period(j);
			jnl_pt_grow(j);
		}
		int rc = jnl_commit_pending(j, false, 0);
		if (rc && rc != -ENOSPC)
			LOG_ERR("cannot commit journal '%s': %s", j->dir,
				strerror(-rc));
		pthread_mutex_lock(&j->lock);
		if (rc) { /* -ENOSPC or FAILED: do not spin */
			if (jnl_failed(j))
				break;
			mono_after(&until, 1000);
			while (!j->stop &&
			       pthread_cond_timedwait(&j->cond, &j->lock,
						      &until) != ETIMEDOUT)
				;
		}
	}
	pthread_mutex_unlock(&j->lock);
	return NULL;
}

int jnl_sync(struct jnl *j)
{
	int rc = jnl_failed(j);

	return rc ? rc : commit_pending(j, false, 0, true, false);
}

int jnl_commit(struct jnl *j)
{
	int rc = jnl_failed(j);

	return rc ? rc : commit_pending(j, false, 0, true, true);
}

/* --- open ----------------------------------------------------------------- */

static bool mdb_is_corrupt(int rc)
{
	return rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH ||
	       rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND ||
	       rc == MDB_INCOMPATIBLE || rc == MDB_BAD_DBI;
}

/* A directory stream of @dirfd (a dup: closedir() leaves @dirfd open). */
static int dir_stream(int dirfd, DIR **out)
{
	int fd = dup(dirfd), rc;

	if (fd < 0)
		return -errno;
	*out = fdopendir(fd);
	if (*out)
		return 0;
	rc = -errno;
	close(fd);
	return rc;
}

static int dir_is_empty(int dirfd)
{
	struct dirent *de;
	DIR *d;
	int rc = dir_stream(dirfd, &d);

	if (rc)
		return rc;
	rc = 1;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			rc = 0;
	closedir(d);
	return rc;
}

/* The journal's subdirectory @name (data/, pt/), made if missing. */
static int open_subdir(struct jnl *j, const char *name, int *fd)
{
	const char *what = "create";
	int rc = 0;

	if (mkdirat(j->dirfd, name, 0700) < 0 && errno != EEXIST)
		rc = -errno;
	else if ((*fd = jnl_sys_openat(j->dirfd, name,
				      O_RDONLY | O_DIRECTORY, 0)) < 0) {
		rc = *fd;
		what = "open";
	}
	if (rc)
		set_errmsg("cannot %s '%s/%s': %s", what, j->dir, name,
			   strerror(-rc));
	return rc;
}

/*
 * DIR/creating exists from before DIR/meta.mdb is made until the new
 * journal's first commit is synced (jnl_open()): an environment without
 * a journal in it is one being created only then. Without the mark it is
 * a damaged journal (an LMDB file emptied or replaced by a crash of its
 * disk), which is refused: a new journal started over it would say
 * "everything is on the remote" of data it lost (issue 36, bug 3).
 */
static int creating_mark(struct jnl *j)
{
	int fd = openat(j->dirfd, "creating",
			O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int rc = 0;

	if (fd < 0 || fsync(fd) < 0 || fsync(j->dirfd) < 0)
		rc = -errno;
	if (fd >= 0)
		close(fd);
	if (rc)
		set_errmsg("cannot create a journal in '%s': %s", j->dir,
			   strerror(-rc));
	return rc;
}

static bool creating_marked(struct jnl *j)
{
	return faccessat(j->dirfd, "creating", F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

static int creating_done(struct jnl *j)
{
	int rc = 0;

	if (unlinkat(j->dirfd, "creating", 0) < 0 && errno != ENOENT)
		rc = -errno;
	else if (fsync(j->dirfd) < 0)
		rc = -errno;
	if (rc)
		set_errmsg("cannot finish journal '%s': %s", j->dir,
			   strerror(-rc));
	return rc;
}

/* Open or create DIR and DIR/meta.mdb; sets *creating. */
static int open_dirs(struct jnl *j, unsigned int flags, bool *creating)
{
	struct stat st;
	int rc;

	*creating = false;
	j->dirfd = open(j->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (j->dirfd < 0 && errno == ENOENT && (flags & JNL_CREATE)) {
		if (mkdir(j->dir, 0700) < 0 && errno != EEXIST) {
			rc = -errno;
			set_errmsg("cannot create journal directory '%s': %s",
				   j->dir, strerror(-rc));
			return rc;
		}
		j->dirfd = open(j->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	}
	if (j->dirfd < 0) {
		rc = -errno;
		set_errmsg(rc == -ENOENT ? "no journal at '%s': %s" :
					   "cannot open journal '%s': %s",
			   j->dir, strerror(-rc));
		return rc;
	}
	rc = sys_lock_wait(j->dirfd, SYS_LOCK_WAIT_MS);
	if (rc) {
		set_errmsg("journal '%s' is in use by another process", j->dir);
		return rc;
	}
	if (fstatat(j->dirfd, "meta.mdb", &st, AT_SYMLINK_NOFOLLOW) < 0) {
		rc = -errno;
		if (rc != -ENOENT) {
			set_errmsg("cannot stat '%s/meta.mdb': %s", j->dir,
				   strerror(-rc));
			return rc;
		}
		if (!(flags & JNL_CREATE)) {
			set_errmsg("no journal in '%s' (no meta.mdb)", j->dir);
			return -ENOENT;
		}
		rc = dir_is_empty(j->dirfd);
		if (rc <= 0) {
			set_errmsg("cannot create a journal in '%s': %s",
				   j->dir,
				   rc ? strerror(-rc) : "directory not empty");
			return rc ? rc : -ENOTEMPTY;
		}
		rc = creating_mark(j);
		if (rc)
			return rc;
		if (mkdirat(j->dirfd, "meta.mdb", 0700) < 0) {
			rc = -errno;
			set_errmsg("cannot create '%s/meta.mdb': %s", j->dir,
				   strerror(-rc));
			return rc;
		}
		*creating = true;
	} else if (!S_ISDIR(st.st_mode)) {
		set_errmsg("not a ferryfs journal: '%s/meta.mdb' is not an "
			   "LMDB environment directory", j->dir);
		return -EPROTO;
	}
	rc = open_subdir(j, "data", &j->datafd);
	return rc ? rc : open_subdir(j, "pt", &j->ptfd);
}

/* A raw LMDB code met while opening: -EPROTO for a corrupted or foreign
 * file, else jnl_err_from_mdb(); sets errmsg. */
static int open_err(struct jnl *j, int rc, const char *what)
{
	if (mdb_is_corrupt(rc)) {
		set_errmsg("journal '%s' is corrupted or not a ferryfs journal: "
			   "%s: %s", j->dir, what, mdb_strerror(rc));
		return -EPROTO;
	}
	set_errmsg("cannot open journal '%s': %s: %s", j->dir, what,
		   mdb_strerror(rc));
	return jnl_err_from_mdb(rc);
}

static int init_meta(struct jnl *j, struct jnl_wtx *w,
		     const struct jnl_config *cfg, uint32_t chunk_size)
{
	MDB_val k = { 9, "remote_id" };
	MDB_val v = { strlen(cfg->remote_id), (void *)cfg->remote_id };
	struct jnl_nrec root;
	struct timespec now;
	int rc;

	memset(&w->m, 0, sizeof(w->m));
	w->m.magic = JNL_MAGIC;
	w->m.format = JNL_FORMAT_VERSION;
	w->m.chunk_size = chunk_size;
	w->m.rec_size = sizeof(w->m);
	w->m.next_id = JNL_ROOT + 1;
	w->m.next_seq = 1;
	w->m.next_gen = 1;
	w->m.next_dseq = 1;
	w->m_dirty = true;
	rc = jnl_put(j, w->txn, j->db_meta, &k, &v, 0);
	if (rc)
		return open_err(j, rc, "writing meta");

	memset(&root, 0, sizeof(root));
	jnl_now(&now);
	root.r.version = JNL_NODE_REC_VERSION;
	root.r.mode = S_IFDIR | 0755;
	root.r.uid = (uint32_t)getuid();
	root.r.gid = (uint32_t)getgid();
	root.r.atime_sec = root.r.mtime_sec = root.r.ctime_sec = now.tv_sec;
	root.r.atime_nsec = root.r.mtime_nsec = root.r.ctime_nsec =
		(uint32_t)now.tv_nsec;
	root.r.nlink = 2;
	rc = jnl_node_write(j, w->txn, JNL_ROOT, &root);
	if (rc)
		set_errmsg("cannot create journal '%s': %s", j->dir,
			   strerror(-rc));
	return rc;
}

/* j->ident from meta "ident"; made if missing (a new journal, or one of
 * a ferryfs that had no ident). */
static int load_ident(struct jnl *j, MDB_txn *txn)
{
	MDB_val k = { 5, "ident" }, v;
	int rc;

	rc = mdb_get(txn, j->db_meta, &k, &v);
	if (!rc && v.mv_size == sizeof(j->ident)) {
		memcpy(&j->ident, v.mv_data, sizeof(j->ident));
		return 0;
	}
	if (rc && rc != MDB_NOTFOUND)
		return open_err(j, rc, "reading meta");
	if (getrandom(&j->ident, sizeof(j->ident), 0) !=
	    (ssize_t)sizeof(j->ident)) {
		rc = -errno;
		set_errmsg("cannot name journal '%s': getrandom: %s", j->dir,
			   strerror(errno));
		return rc;
	}
	v.mv_size = sizeof(j->ident);
	v.mv_data = &j->ident;
	rc = jnl_put(j, txn, j->db_meta, &k, &v, 0);
	return rc ? open_err(j, rc, "writing meta") : 0;
}

static int check_meta(struct jnl *j, MDB_txn *txn,
		      const struct jnl_config *cfg, struct jnl_meta_rec *m)
{
	MDB_val k = { 4, "meta" }, v;
	size_t idlen = strlen(cfg->remote_id);
	int rc;

	rc = mdb_get(txn, j->db_meta, &k, &v);
	if (rc && rc != MDB_NOTFOUND)
		return open_err(j, rc, "reading meta");
	rc = rc ? -ENOMSG : jnl_meta_decode(v.mv_data, v.mv_size, m);
	switch (rc) {
	case 0:
		break;
	case -ENOMSG:
		set_errmsg("not a ferryfs journal: '%s' has no meta record",
			   j->dir);
		return -EPROTO;
	case -EILSEQ:
		set_errmsg("journal '%s' was written by a machine of the "
			   "other byte order", j->dir);
		return -EPROTO;
	case -EBADMSG:
		set_errmsg("not a ferryfs journal: bad magic in '%s'", j->dir);
		return -EPROTO;
	case -EDOM:
		set_errmsg("journal '%s' has an invalid chunk size %" PRIu32,
			   j->dir, m->chunk_size);
		return -EPROTO;
	default:
		set_errmsg("journal '%s' has format %" PRIu32 ", this ferryfs "
			   "reads format %d", j->dir, m->format,
			   JNL_FORMAT_VERSION);
		return -EPROTO;
	}
	k.mv_size = 9;
	k.mv_data = "remote_id";
	rc = mdb_get(txn, j->db_meta, &k, &v);
	if (rc == MDB_NOTFOUND) {
		set_errmsg("not a ferryfs journal: '%s' names no remote",
			   j->dir);
		return -EPROTO;
	}
	if (rc)
		return open_err(j, rc, "reading meta");
	if (v.mv_size != idlen || memcmp(v.mv_data, cfg->remote_id, idlen)) {
		set_errmsg("journal '%s' belongs to remote '%.*s', not '%s'",
			   j->dir, (int)(v.mv_size > 200 ? 200 : v.mv_size),
			   (const char *)v.mv_data, cfg->remote_id);
		return -EXDEV;
	}
	return 0;
}

/* Add to @ids the ids of the staging files in data/. Another name there
 * is not ours: left alone. */
static int staging_ids(struct jnl *j, struct jnl_u64set *ids)
{
	struct dirent *de;
	DIR *d;
	int rc = dir_stream(j->datafd, &d);

	if (rc)
		return rc;
	while (!rc && (de = readdir(d))) {
		char *end;
		unsigned long long id;

		if (de->d_name[0] < '1' || de->d_name[0] > '9')
			continue;
		errno = 0;
		id = strtoull(de->d_name, &end, 10);
		if (!*end && !errno)
			rc = jnl_u64set_add(ids, id);
	}
	closedir(d);
	return rc;
}

/*
 * Do the journal's parts agree? Every node with chunk records has its
 * staging file (their bytes are nowhere else), and no staging file has an
 * id the journal cannot have handed out: ids below next_id + JNL_ID_GAP
 * (those of a batch a crash lost are below it, jnl_open() skips them;
 * such files, and those of nodes cleaned just before a crash, are
 * orphans no id will name again). An LMDB file older than the staging
 * files (a restored copy) would hand their ids out again: refused.
 * Costs a readdir of data/ and a look per node with chunk records.
 */
static int check_parts(struct jnl *j, MDB_txn *txn,
		       const struct jnl_meta_rec *m)
{
	struct jnl_u64set ids = { 0 };
	struct jnl_key16 kk;
	MDB_cursor *c = NULL;
	MDB_val k, v;
	uint64_t bad = 0;
	int rc;

	rc = staging_ids(j, &ids);
	if (rc) {
		set_errmsg("cannot read '%s/data': %s", j->dir, strerror(-rc));
		goto out;
	}
	for (size_t i = 0; i < ids.cap && !bad; i++)
		if (ids.v[i] && ids.v[i] >= m->next_id + JNL_ID_GAP)
			bad = ids.v[i];
	if (bad) {
		set_errmsg("journal '%s' is damaged: staging file 'data/%" PRIu64
			   "' has an id its LMDB file never handed out "
			   "(next %" PRIu64 "): is meta.mdb an older copy?",
			   j->dir, bad, m->next_id);
		rc = -EPROTO;
		goto out;
	}
	rc = mdb_cursor_open(txn, j->db_chunks, &c);
	for (rc = rc ? rc : mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc;
	     rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE)) {
		uint64_t id;

		if (k.mv_size != 16) {
			rc = MDB_CORRUPTED;
			break;
		}
		id = jnl_be64_get(k.mv_data);
		if (!jnl_u64set_has(&ids, id)) {
			bad = id;
			break;
		}
		if (id == UINT64_MAX) {
			rc = MDB_NOTFOUND;
			break;
		}
		kk = jnl_key16(id + 1, 0); /* the next node's first record */
		k.mv_size = 16;
		k.mv_data = kk.b;
	}
	if (c)
		mdb_cursor_close(c);
	if (bad) {
		set_errmsg("journal '%s' is damaged: node %" PRIu64 " has data "
			   "in the journal but its staging file 'data/%" PRIu64
			   "' is gone", j->dir, bad, bad);
		rc = -EPROTO;
	} else if (rc == MDB_NOTFOUND) {
		rc = 0;
	} else if (rc) {
		rc = open_err(j, rc, "chunks");
	}
out:
	jnl_u64set_free(&ids);
	return rc;
}

/* Open the environment and its databases, create or check meta, recover.
 * Returns -errno with errmsg set. */
static int open_env(struct jnl *j, bool creating, unsigned int flags,
		    const struct jnl_config *cfg, uint32_t chunk_size)
{
	static const char *const names[] = { "meta",   "nodes",  "dentries",
					     "chunks", "dirtyq", "inflight",
					     "ops",    "imports" };
	MDB_dbi *dbis[] = { &j->db_meta,   &j->db_nodes,  &j->db_dentries,
			    &j->db_chunks, &j->db_dirtyq, &j->db_inflight,
			    &j->db_ops,    &j->db_imports };
	char path[PATH_MAX];
	struct jnl_wtx w;
	bool init = creating;
	int rc;

	if (snprintf(path, sizeof(path), "%s/meta.mdb", j->dir) >=
	    (int)sizeof(path)) {
		set_errmsg("journal path '%s' too long", j->dir);
		return -ENAMETOOLONG;
	}
	rc = mdb_env_create(&j->env);
	if (!rc)
		rc = mdb_env_set_maxdbs(j->env, JNL_MAX_DBS);
	if (!rc)
		rc = mdb_env_set_mapsize(j->env, jnl_test_map_size ?
							jnl_test_map_size :
							JNL_MAP_SIZE);
	if (!rc)
		rc = mdb_env_open(j->env, path,
				  MDB_NOTLS | MDB_NOLOCK | MDB_NOMETASYNC |
					  jnl_test_env_flags,
				  0600);
	if (rc)
		return open_err(j, rc, path);
	{
		MDB_envinfo info;
		MDB_stat st;
		struct stat fst;
		char file[PATH_MAX + 16];

		mdb_env_info(j->env, &info);
		mdb_env_stat(j->env, &st);
		/* a file cut short (its disk crashed): its pages past the end
		 * would be read as zeros or fault (SIGBUS) */
		snprintf(file, sizeof(file), "%s/data.mdb", path);
		if (stat(file, &fst) == 0 &&
		    (uint64_t)fst.st_size <
			    ((uint64_t)info.me_last_pgno + 1) * st.ms_psize) {
			set_errmsg("journal '%s' is damaged: '%s' is %lld "
				   "bytes, its records need %llu (truncated?)",
				   j->dir, file, (long long)fst.st_size,
				   (unsigned long long)(info.me_last_pgno + 1) *
					   st.ms_psize);
			return -EPROTO;
		}
		j->map_pages = info.me_mapsize / st.ms_psize;
		j->reserve_pages = j->map_pages / 32;
		if (j->reserve_pages < 32)
			j->reserve_pages = 32;
		if (j->reserve_pages > 65536)
			j->reserve_pages = 65536;
		_Static_assert(65536 / 32 <= JNL_ID_GAP,
			       "a lost batch may hold batch_max new ids");
		/* a change dirties at most ~32 pages: a batch stays within
		 * the reserve that map_low() checked against the last commit */
		j->batch_max = (unsigned int)(j->reserve_pages / 32);
		if (!j->batch_max)
			j->batch_max = 1;
	}

	memset(&w, 0, sizeof(w));
	w.j = j;
	rc = mdb_txn_begin(j->env, NULL, 0, &w.txn);
	if (rc)
		return open_err(j, rc, "beginning a transaction");
	if (!init) {
		MDB_dbi probe;

		rc = mdb_dbi_open(w.txn, "meta", 0, &probe);
		if (rc == MDB_NOTFOUND && (flags & JNL_CREATE) &&
		    creating_marked(j))
			init = true; /* an earlier creation stopped early */
		else if (rc == MDB_NOTFOUND) {
			set_errmsg("journal '%s' is damaged: '%s/data.mdb' "
				   "holds no journal (emptied or replaced?); "
				   "refusing to start a new journal over it: "
				   "move the directory away to start afresh",
				   j->dir, path);
			rc = -EPROTO;
			goto out_abort;
		}
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		rc = mdb_dbi_open(w.txn, names[i], init ? MDB_CREATE : 0,
				  dbis[i]);
		if (rc == MDB_NOTFOUND) {
			set_errmsg("not a ferryfs journal: '%s' has no '%s' "
				   "database", path, names[i]);
			rc = -EPROTO;
			goto out_abort;
		}
		if (rc) {
			rc = open_err(j, rc, names[i]);
			goto out_abort;
		}
	}
	/* folds came later than the others: made (and filled) if missing.
	 * "folds" folded ASCII only; its keys are not ours: dropped */
	rc = jnl_fold_init();
	if (rc < 0) {
		set_errmsg("cannot index journal '%s': glibc's C.UTF-8 locale "
			   "is missing", j->dir);
		goto out_abort;
	}
	rc = mdb_dbi_open(w.txn, "folds.u", MDB_DUPSORT, &j->db_folds);
	if (rc == MDB_NOTFOUND) {
		MDB_dbi old;

		rc = mdb_dbi_open(w.txn, "folds", MDB_DUPSORT, &old);
		if (!rc)
			rc = mdb_drop(w.txn, old, 1);
		else if (rc == MDB_NOTFOUND)
			rc = 0;
		if (!rc)
			rc = mdb_dbi_open(w.txn, "folds.u",
					  MDB_DUPSORT | MDB_CREATE,
					  &j->db_folds);
		if (!rc)
			rc = init ? 0 : jnl_folds_build(j, w.txn);
	}
	if (rc > 0)
		rc = open_err(j, rc, "folds");
	else if (rc < 0)
		set_errmsg("cannot index journal '%s': %s", j->dir,
			   strerror(-rc));
	if (rc)
		goto out_abort;
	if (init) {
		rc = init_meta(j, &w, cfg, chunk_size);
	} else {
		rc = check_meta(j, w.txn, cfg, &w.m);
		if (!rc)
			rc = check_parts(j, w.txn, &w.m);
		if (!rc) {
			/* ids a crash lost (at most a batch of them) are not
			 * handed out again: their staging files may be left */
			w.m.next_id += JNL_ID_GAP;
			w.m_dirty = true;
			rc = jnl_chunks_recover(&w, &j->resent_bytes);
			CRASH_POINT("jnl_recover"); /* recovery not committed */
			if (rc)
				set_errmsg("cannot recover journal '%s': %s",
					   j->dir, strerror(-rc));
		}
	}
	if (!rc)
		rc = load_ident(j, w.txn);
	if (rc)
		goto out_abort;
	j->chunk_size = w.m.chunk_size;
	j->chunk_shift = (unsigned int)__builtin_ctz(j->chunk_size);
	j->staged = w.m.dirty_bytes + w.m.inflight_bytes + w.m.flushed_bytes;
	j->durable_seq = w.m.next_seq;
	/* not a child of a batch: commit it itself */
	rc = w.m_dirty ? meta_put(j, w.txn, &w.m) : 0;
	if (rc)
		goto out_abort;
	rc = jnl_mdb(j, mdb_txn_commit(w.txn));
	if (!rc)
		rc = jnl_mdb(j, mdb_env_sync(j->env, 1));
	if (rc)
		set_errmsg("cannot commit journal '%s': %s", j->dir,
			   strerror(-rc));
	else if (init)
		rc = creating_done(j); /* a journal now, synced */
	return rc;

out_abort:
	mdb_txn_abort(w.txn);
	return rc;
}

static void jnl_free(struct jnl *j)
{
	jnl_fd_close_all(j);
	if (j->txn) /* empty after a clean close; FAILED: lost */
		mdb_txn_abort(j->txn);
	if (j->env)
		mdb_env_close(j->env);
	if (j->datafd >= 0)
		close(j->datafd);
	if (j->ptfd >= 0)
		close(j->ptfd);
	free(j->undo.e);
	free(j->undo.buf);
	jnl_u64set_free(&j->pt_ended);
	jnl_u64set_free(&j->pt_unsynced);
	jnl_u64set_free(&j->pt_unsynced_old);
	jnl_u64set_free(&j->pt_unclean);
	jnl_u64set_free(&j->clean_due);
	jnl_u64count_free(&j->opens);
	jnl_u64set_free(&j->gone_open);
	if (j->dirfd >= 0)
		close(j->dirfd); /* drops the flock */
	jnl_ptab_free(&j->pend);
	jnl_ptab_free(&j->committing);
	jnl_u64set_free(&j->handed);
	jnl_acked_free(j);
	gc_free(&j->gc_new);
	gc_free(&j->gc_due);
	pthread_cond_destroy(&j->names_cond);
	pthread_mutex_destroy(&j->names_lock);
	pthread_cond_destroy(&j->room);
	pthread_cond_destroy(&j->cond);
	pthread_mutex_destroy(&j->lock);
	pthread_mutex_destroy(&j->txn_lock);
	pthread_rwlock_destroy(&j->rw);
	pthread_mutex_destroy(&j->commit_lock);
	free(j->remote_id);
	free(j->dir);
	free(j);
}

int jnl_open(const char *dir, const struct jnl_config *cfg, unsigned int flags,
	     struct jnl **out)
{
	pthread_rwlockattr_t rwa;
	pthread_condattr_t ca;
	uint32_t chunk;
	bool creating;
	struct jnl *j;
	int rc;

	*out = NULL;
	errmsg[0] = 0;
	if (!dir || !*dir || !cfg || !cfg->remote_id || !*cfg->remote_id) {
		set_errmsg("jnl_open needs a directory and a remote id");
		return -EINVAL;
	}
	chunk = cfg->chunk_size ? cfg->chunk_size : JNL_DEFAULT_CHUNK;
	if (chunk < (64u << 10) || chunk > (64u << 20) ||
	    (chunk & (chunk - 1))) {
		set_errmsg("chunk size %" PRIu32 " is not a power of two "
			   "from 64 KiB to 64 MiB", chunk);
		return -EINVAL;
	}
	j = calloc(1, sizeof(*j));
	if (!j || !(j->dir = strdup(dir)) ||
	    !(j->remote_id = strdup(cfg->remote_id))) {
		if (j)
			free(j->dir);
		free(j);
		set_errmsg("out of memory");
		return -ENOMEM;
	}
	j->dirfd = j->datafd = j->ptfd = -1;
	j->max_bytes = cfg->max_bytes;
	j->disk_room = !jnl_test_no_disk_room;
	j->disk_avail = UINT64_MAX;
	j->wait_ms = cfg->write_wait_ms ? cfg->write_wait_ms :
					  JNL_WRITE_WAIT_MS;
	j->commit_ms = jnl_test_commit_ms ? jnl_test_commit_ms : JNL_COMMIT_MS;
	pthread_mutex_init(&j->commit_lock, NULL);
	pthread_rwlockattr_init(&rwa);
	pthread_rwlockattr_setkind_np(
		&rwa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&j->rw, &rwa);
	pthread_rwlockattr_destroy(&rwa);
	pthread_mutex_init(&j->txn_lock, NULL);
	pthread_mutex_init(&j->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&j->cond, &ca);
	pthread_cond_init(&j->room, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&j->names_lock, NULL);
	pthread_cond_init(&j->names_cond, NULL);

	rc = open_dirs(j, flags, &creating);
	if (!rc)
		rc = open_env(j, creating, flags, cfg, chunk);
	j->sweep_next = JNL_ROOT; /* once after every open */
	if (!rc) {
		rc = -pthread_create(&j->thread, NULL, committer, j);
		if (rc)
			set_errmsg("cannot start the commit thread: %s",
				   strerror(-rc));
	}
	if (rc) {
		jnl_free(j);
		return rc;
	}
	if (j->resent_bytes)
		LOG_INFO("journal '%s': %" PRIu64 " bytes in flight at the "
			 "last stop are dirty again", dir, j->resent_bytes);
	jnl_pt_recover(j);
	*out = j;
	return 0;
}

void jnl_close(struct jnl *j)
{
	int rc;

	if (!j)
		return;
	pthread_mutex_lock(&j->lock);
	j->stop = true;
	pthread_cond_signal(&j->cond);
	pthread_cond_broadcast(&j->room);
	pthread_mutex_unlock(&j->lock);
	pthread_join(j->thread, NULL);
	rc = jnl_failed(j);
	if (rc)
		LOG_ERR("journal '%s' closed FAILED: changes after the last "
			"commit are lost: %s", j->dir, strerror(-rc));
	else if ((rc = commit_pending(j, false, 0, true, false)))
		LOG_ERR("journal '%s' closed with uncommitted changes: %s",
			j->dir, strerror(-rc));
	else { /* the committer's last ones */
		pt_sync_deferred(j, &j->pt_unsynced_old);
		pt_sync_deferred(j, &j->pt_unsynced);
	}
	jnl_free(j);
}

uint32_t jnl_chunk_size(const struct jnl *j)
{
	return j->chunk_size;
}

uint64_t jnl_ident(const struct jnl *j)
{
	return j->ident;
}

const char *jnl_remote_id(const struct jnl *j)
{
	return j->remote_id;
}

/* meta "bind" -> struct jnl_bind (missing: JNL_BIND_NONE) */
int jnl_bind_get(struct jnl *j, struct jnl_bind *out)
{
	MDB_val k = { 4, "bind" }, v;
	MDB_txn *txn;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = jnl_rtx_begin(j, &txn);
	if (rc)
		return rc;
	rc = mdb_get(txn, j->db_meta, &k, &v);
	if (!rc && v.mv_size == sizeof(*out))
		memcpy(out, v.mv_data, sizeof(*out));
	jnl_rtx_end(j);
	return rc && rc != MDB_NOTFOUND ? jnl_mdb(j, rc) : 0;
}

int jnl_bind_set(struct jnl *j, const struct jnl_bind *b)
{
	MDB_val k = { 4, "bind" }, v = { sizeof(*b), (void *)b };
	struct jnl_wtx w;
	int rc = jnl_wtx_begin(j, &w, true);

	if (rc)
		return rc;
	rc = jnl_mdb(j, jnl_put(j, w.txn, j->db_meta, &k, &v, 0));
	if (rc) {
		jnl_wtx_abort(&w);
		return rc;
	}
	rc = jnl_wtx_commit(&w);
	return rc ? rc : jnl_sync(j);
}

int jnl_stats(struct jnl *j, struct jnl_stats *out)
{
	struct jnl_meta_rec m;
	MDB_stat q, fl;
	MDB_txn *txn;
	uint64_t pend_new, marks;
	int rc;

	memset(out, 0, sizeof(*out));
	/* memory first, LMDB second (invariant 11): a mark that moves from
	 * pend into LMDB in between is counted at least once */
	pthread_mutex_lock(&j->lock);
	pend_new = j->pend_new;
	marks = j->pend.used + j->committing.used;
	out->write_waits = j->write_waits;
	out->writers_waiting = j->waiters;
	pthread_mutex_unlock(&j->lock);
	rc = jnl_rtx_begin(j, &txn);
	if (rc)
		return rc;
	rc = meta_get(j, txn, &m);
	if (!rc)
		rc = jnl_mdb(j, mdb_stat(txn, j->db_dirtyq, &q));
	if (!rc)
		rc = jnl_mdb(j, mdb_stat(txn, j->db_inflight, &fl));
	if (!rc)
		out->conflicts = jnl_conflicts_count(j, txn);
	jnl_rtx_end(j);
	if (rc)
		return rc;
	out->dirty_bytes = m.dirty_bytes;
	out->inflight_bytes = m.inflight_bytes;
	out->flushed_bytes = m.flushed_bytes;
	out->dirty_nodes = m.dirty_nodes;
	out->pending_ops = m.pending_ops;
	out->resent_bytes = j->resent_bytes;
	out->queued_chunks = q.ms_entries;
	out->inflight_chunks = fl.ms_entries;
	out->uncommitted = marks;
	out->dirty_bytes += pend_new; /* marks not committed yet */
	out->staging_bytes =
		out->dirty_bytes + out->inflight_bytes + out->flushed_bytes;
	return 0;
}
