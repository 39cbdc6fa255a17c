/*
 * flush.c - the flusher: N stream threads that drain the journal into the
 * remote (journal.h, "the flusher"). With conflict.c the only file of
 * journal/ that calls remote/; it uses the journal through journal.h
 * alone, plus the wake-up hook of journal_i.h (jnl_notify_set()) and
 * jnl_conflict_epoch().
 *
 * Callers: fs/ (start at mount, stop at unmount, pause/resume/kick/wait/
 * stats for `ferryfs flush|pause|resume|status`), tests.
 *
 * HOW A STREAM WORKS
 *
 * Each stream is a thread with its own connection (struct rmt: NFS and SMB
 * drivers are one TCP flow per connection, so N streams are N flows), its
 * own chunk buffer and its own cache of open remote files. It loops:
 *
 *   1. a chunk it claimed and has not sent yet          -> send_chunk()
 *   2. an op from the shared queue (refilled from
 *      jnl_ops_ready(), OPQ_BATCH at a time)            -> replay()
 *   3. claim DIRTY chunks, one chunk size of bytes at most
 *      (jnl_chunk_claim_upto())                         -> back to 1
 *   4. a parked chunk whose retry time came             -> send_chunk()
 *   5. nothing: close its files, sleep until the journal commits work
 *      (jnl_notify_set() hook), a kick, or POLL_NS.
 *
 * So ops go first (a file's create before its data, which the journal
 * enforces anyway), many files go at once, and the chunks of one big file
 * go to whichever streams claim them: the file is split across streams.
 *
 * Each stream has a helper thread (struct prep). While the stream writes
 * the last chunk it holds to the share, the helper releases the chunk
 * written before it (its release was owed: send_chunk()), then, if no op
 * may be waiting, claims the next chunk and reads and hashes it. So a
 * stream's connection does not idle between two chunks for the journal:
 * the read and the hash (~5 ms a 4 MiB chunk), the claim's LMDB sync and
 * the releases queued behind it (1 GiB to smb:// at 1 Gbit/s: ~0.5 s
 * in all per stream without the helper, ~0.05 s with it). Not through an
 * agent (send_put()), nor on the share while an agent is configured (the
 * loop must run dry now and then for agent_try()).
 *
 * STREAM STATES (st.state, under f->lock)
 *
 *             start                      work found
 *   (thread) -------> IDLE ---------------------------------> FLUSHING
 *                      ^  <------ nothing to do (step 5) ------+  |
 *                      |                                          |
 *                      |  backoff_until passed, or kick()         | transient
 *                      +--------------------------- BACKOFF <-----+ remote
 *                                                                   error
 *   any state --- pause() ---> PAUSED (claims put back) --- resume() ---> IDLE
 *   any state --- the journal FAILED (-EIO) ---> STOPPED (thread exits)
 *
 * INVARIANTS
 *
 *  1. A stream's claimed chunks (s->claim[], s->park[], the helper's
 *     pre.ref and the written pre.rel_ref) are INFLIGHT in the journal
 *     and only that stream (or its helper, while asked) touches them.
 *     Every way out (stop, pause, an error, a journal error) releases them
 *     not-ok: back to DIRTY; a written one ok (owed_settle()). Nothing is
 *     lost.
 *  2. A chunk is released ok only after the write (and the fdatasync, or
 *     the flush of a share that reports errors at close, and the
 *     read-back when verifying) succeeded, with the SHA-256 of exactly the
 *     bytes rmt_file_pwrite() wrote at its offset where one is looked at
 *     (verify=readback, the agent's PUT, jnl_chunk_digest_used()), else
 *     with all zeros. The journal then marks it FLUSHED only if no write
 *     changed its generation meanwhile.
 *  3. f->lock is never held across a remote call or a journal call. Lock
 *     order: the journal's j->lock, then f->lock (the hook on_work() runs
 *     under j->lock).
 *  4. A chunk's remote path is used only if no UNLINK, RMDIR or RENAME
 *     replay started or ended between its jnl_node_rpath() and its open
 *     (f->ns_epoch unchanged, f->ns_busy 0 at the start: a seqlock,
 *     handle_get()). Those replays bump the epoch before the remote call
 *     and again after their ack moved the node in the journal. So a chunk
 *     never lands in a file an op moved onto its old name meanwhile. An
 *     open file follows its inode through later renames. The same
 *     replays are the journal's name moves (jnl_names_move_begin()), for
 *     the mount's own uses of remote paths (jnl_names_hold()).
 *  5. FINISH and SETATTR with a size of node X are replayed only while no
 *     stream writes a chunk of X (s->writing, gate()), and no stream starts
 *     one until the remote call returned (s->sizing): no chunk write
 *     lands during a truncate. The size is read after the gate: it covers
 *     every chunk written before (FLUSHED chunks lie within the size), so
 *     the truncate never cuts bytes the journal holds FLUSHED (a file
 *     still being appended to gets a FINISH each time the streams catch
 *     up with it). Writes claimed after see the truncated chunk records; a
 *     chunk that ends past the final size is followed by the FINISH its
 *     release appends. A chunk written whose release the helper still owes
 *     is not in s->writing: its bytes are on the remote already (a gate
 *     waiting for it while its stream waited in writing_begin() for that
 *     gate's sizing was a deadlock), and a truncate of it in the journal
 *     meanwhile makes its release stale. The size "now" is not the op's:
 *     a shrink since it left JNL_NODE_CUT, and the replay cuts the remote
 *     at remote_cut before it sets the size (journal.c invariant 19).
 *  6. An op taken from the queue ends in exactly one of jnl_op_ack(),
 *     jnl_op_fail(fatal) (permanent remote error: logged once with its
 *     path) or jnl_op_fail(retry); ops still queued at stop are failed for
 *     retry (pending again).
 *  7. A stream claims at most one chunk size of bytes at a time, and its
 *     helper one more chunk while the stream writes its last (plus the
 *     parked chunks). The helper claims only after it released the chunk
 *     written before, and a claim's sync makes that release durable: a
 *     crash resends at most 2 x streams x chunk size.
 *
 * ERRORS AND BACKOFF
 *
 *   permanent() splits remote errors. Transient: the chunk goes back to
 *   DIRTY or the op back to pending, errors and retries count, and the
 *   stream backs off (BACKOFF_MIN_MS doubling to backoff_max_ms); the first
 *   success resets it. Permanent: an op is dropped (its node becomes
 *   JNL_NODE_ERROR in the journal); a chunk is parked, i.e. kept claimed and
 *   retried every PARK_RETRY_NS, so one file the remote refuses does not
 *   hold the queue behind it (a released chunk would come back first).
 *   A journal -EIO (FAILED, sticky) stops every stream.
 *
 * BANDWIDTH LIMIT
 *
 *   cfg->bwlimit is a token bucket shared by the streams (bw_book(), the
 *   GCRA of remote/throttle.c): before a chunk is written, its bytes book
 *   [max(tat, now - BW_BURST_NS), + n / rate) and the stream sleeps to the
 *   end of the booking. Not remote_rate=: that option of rmt_open() caps
 *   one connection, and each stream has its own.
 */
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crash.h"
#include "journal_i.h"
#include "log.h"
#include "remote.h"

#define NS_PER_MS INT64_C(1000000)
#define NS_PER_S INT64_C(1000000000)
#define OPQ_BATCH 64              /* ops per jnl_ops_ready() */
#define CLAIM_MAX 64              /* chunks per claim (bytes bound it) */
#define HANDLE_MAX 16             /* open remote files per stream */
#define RMDIR_SETTLE_MS 12000     /* rmdir_settled(): 50 + 100 + ... ms */
#define PARK_MAX 16               /* parked chunks per stream */
#define PARK_RETRY_NS (30 * NS_PER_S)
#define POLL_NS NS_PER_S          /* idle fallback poll */
#define BACKOFF_MIN_MS 50u
#define BACKOFF_MAX_MS 10000u
#define BW_BURST_NS (5 * NS_PER_MS)
#define RATE_SLOTS 8              /* rate_bps: 8 slots of 250 ms */
#define RATE_SLOT_NS (250 * NS_PER_MS)
#define OPEN_TRIES 16             /* handle_get() against renames */
#define AGENT_RETRY_NS (3 * NS_PER_S) /* the agent again, after a loss */
#define AGENT_RETRY_MAX_NS (60 * NS_PER_S)

struct handle {
	jnl_id id;           /* 0 = free */
	struct rmt_file *f;
	int64_t used;        /* CLOCK_MONOTONIC ns */
};

struct parked {
	struct jnl_chunk_ref ref;
	int64_t retry_at;    /* CLOCK_MONOTONIC ns */
};

/* What a failed step was: who to blame decides what happens next. */
enum fault {
	F_REMOTE,  /* the remote refused or failed: permanent() decides */
	F_JOURNAL, /* a journal call failed */
	F_GONE,    /* the chunk or node went away meanwhile: nothing to do */
	F_STOP,    /* stop() interrupted a wait */
};

/*
 * A stream's helper thread (prep_main(); why: top of this file). Asked
 * (P_ASKED) while its stream writes a chunk, it releases the chunk written
 * before (rel), then claims the next one and reads and hashes it into buf.
 * It touches the fields below only while P_ASKED; the stream only while
 * P_IDLE (both under lock).
 */
struct prep {
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	enum { P_IDLE, P_ASKED, P_QUIT } state;
	bool have;                /* it claimed ref; buf, sha, n are its */
	bool ready;               /* the stream's: ref is in s->claim[] and
				     buf, sha, n are still its */
	struct jnl_chunk_ref ref;
	unsigned char *buf;       /* chunk size; swapped with the stream's */
	unsigned char sha[32];
	ssize_t n;                /* chunk_read(): length or -errno, */
	enum fault fault;         /* with this */
	bool rel;                 /* rel_ref written, its release owed: */
	bool rel_done;            /* done by the helper, with rel_rc */
	struct jnl_chunk_ref rel_ref;
	unsigned char rel_sha[32];
	size_t rel_sent;
	int rel_rc;
};

struct stream {
	struct jnl_flusher *f;
	unsigned int no;
	pthread_t thread;
	bool started;

	/* this stream's thread only (after start) */
	struct rmt *r;                 /* share or agent: the one in use */
	struct rmt *share, *agent;     /* agent NULL: none configured */
	int64_t agent_retry_at;        /* CLOCK_MONOTONIC ns */
	int64_t agent_wait_ns;         /* before the next try: doubles from
					  AGENT_RETRY_NS to AGENT_RETRY_MAX_NS
					  while the agent does not answer */
	bool agent_elsewhere;          /* its root is not the share's: logged */
	uid_t own_uid, own_gid;        /* agent_owner(): the share's owner */
	bool batching;                 /* in replay_batch(): ungate later */
	int batch_at;                  /* the op replay_batch_part() queues */
	struct {                       /* its new base, recorded when the */
		bool owed;             /* batch succeeded (replay_attrs()) */
		jnl_id id;
		uint64_t size;
		struct timespec mtime;
		bool cut;              /* and its cut (jnl_node_send_done()) */
		uint64_t rcut;
	} batch_base[OPQ_BATCH];
	unsigned char *buf, *vbuf;     /* chunk size each; vbuf if verifying */
	struct handle h[HANDLE_MAX];
	struct jnl_chunk_ref claim[CLAIM_MAX];
	int nclaim, next;              /* claim[next..nclaim) not sent yet */
	struct parked park[PARK_MAX];
	int npark;
	unsigned int backoff_ms;       /* 0: not backing off */
	jnl_id logged_park;            /* last node a park was logged for */
	uint64_t kick_seen;            /* f->kick_gen handled */
	uint64_t conflict_seen;        /* jnl_conflict_epoch() of h[] */
	char path[PATH_MAX], path2[PATH_MAX];
	char *pbuf;                    /* send_put(): CLAIM_MAX paths */
	struct prep pre;               /* the next chunk, made ready while
					  one is written (prep_main()) */

	/* protected by f->lock */
	jnl_id writing[CLAIM_MAX];     /* nodes of the chunks being sent */
	int nwriting;
	jnl_id sizing[OPQ_BATCH];      /* nodes whose size is being applied
					  (invariant 5) */
	int nsizing;
	int64_t backoff_until;         /* CLOCK_MONOTONIC ns, 0 = none */
	struct jnl_stream_stats st;
	uint64_t rate_bytes[RATE_SLOTS];
	int64_t rate_slot[RATE_SLOTS]; /* slot number each bucket counts */
	int64_t t0;                    /* start, for rate_bps */
	bool via_agent;                /* r == agent, for stats */
	uint64_t parked;               /* npark, for stats */
};

/* Lock order: the journal's j->lock, then f->lock (invariant 3). */
struct jnl_flusher {
	/* immutable after jnl_flusher_start() */
	struct jnl *j;
	unsigned int nstreams;
	uint32_t chunk_size;
	uint64_t bwlimit;
	unsigned int flags;            /* enum jnl_flush_flags */
	unsigned int backoff_max_ms;
	bool root;                     /* may set owners on the remote */
	struct stream *s;              /* [nstreams] */

	pthread_mutex_t lock;
	pthread_cond_t wake;  /* streams: work, kick, pause, stop; lock */
	pthread_cond_t done;  /* a step ended: gate(), handle_get(),
				 jnl_flusher_wait(); lock */
	bool stop, paused;             /* lock */
	int failed;                    /* the journal's sticky error; lock */
	uint64_t failed_ops;           /* lock */
	uint64_t work_gen;             /* bumped by on_work() and kick; lock */
	uint64_t kick_gen;             /* lock */
	int64_t last_poll;             /* lock */
	struct jnl_op *q;              /* the op queue, OPQ_BATCH; lock */
	int qhead, qlen;               /* lock */
	bool qfill;                    /* a stream is refilling it; lock */
	uint64_t qgen;                 /* work_gen of the last empty refill,
					  UINT64_MAX = none; lock */
	uint64_t ns_epoch;             /* invariant 4; lock */
	unsigned int ns_busy;          /* lock */
	unsigned int ns_readers;       /* send_put()s under way; lock */
	unsigned int ns_wwait;         /* ns_enter()s waiting for them; lock */
	int64_t tat;                   /* bw_book(); lock */
};

/* --- small helpers ------------------------------------------------------ */

static struct timespec ts_of(int64_t ns)
{
	struct timespec ts = { (time_t)(ns / NS_PER_S), (long)(ns % NS_PER_S) };

	return ts;
}

/* Wait on @c (f->lock held) until @until (CLOCK_MONOTONIC ns). */
static void wait_until(struct jnl_flusher *f, pthread_cond_t *c, int64_t until)
{
	struct timespec ts = ts_of(until);

	pthread_cond_timedwait(c, &f->lock, &ts);
}

/* Sleep (f->lock held) until @until or stop(): false on stop. */
static bool sleep_until(struct jnl_flusher *f, int64_t until)
{
	while (!f->stop && jnl_mono_ns() < until)
		wait_until(f, &f->wake, until);
	return !f->stop;
}

/* Errors of the remote that retrying will not cure (journal.h). */
static bool permanent(int rc)
{
	switch (-rc) {
	case EACCES:
	case EPERM:
	case EROFS:
	case ENOTDIR:
	case EISDIR:
	case EINVAL:
	case ENOENT:
	case EEXIST:
	case ENOTEMPTY:
	case ELOOP:
	case ENAMETOOLONG:
	case EXDEV:
	case EFBIG:
	case EMLINK:
	case EOPNOTSUPP:
	case EILSEQ: /* a name the share cannot hold */
		return true;
	}
	return false;
}

static const char *op_name(enum jnl_op_type t)
{
	static const char *const names[] = {
		[JNL_OP_MKDIR] = "mkdir",   [JNL_OP_CREATE] = "create",
		[JNL_OP_SYMLINK] = "symlink", [JNL_OP_LINK] = "link",
		[JNL_OP_UNLINK] = "unlink", [JNL_OP_RMDIR] = "rmdir",
		[JNL_OP_RENAME] = "rename", [JNL_OP_SETATTR] = "setattr",
		[JNL_OP_FINISH] = "finish",
	};

	if ((unsigned int)t < sizeof(names) / sizeof(names[0]) && names[t])
		return names[t];
	return "op";
}

/* rpath(parent)/name into @buf. Journal errors. */
static int child_path(struct jnl *j, jnl_id parent, const char *name,
		      char *buf, size_t size)
{
	int rc = jnl_node_rpath(j, parent, buf, size);
	size_t len, nlen = strlen(name);

	if (rc)
		return rc;
	len = strlen(buf);
	if (len + 1 + nlen >= size)
		return -ENAMETOOLONG;
	if (len)
		buf[len++] = '/';
	memcpy(buf + len, name, nlen + 1);
	return 0;
}

/* --- stats and state (f->lock held) -------------------------------------- */

static void set_state(struct stream *s, enum jnl_stream_state st)
{
	s->st.state = st;
}

static void rate_add(struct stream *s, uint64_t n, int64_t now)
{
	int64_t slot = now / RATE_SLOT_NS;
	int i = (int)(slot % RATE_SLOTS);

	if (s->rate_slot[i] != slot) {
		s->rate_slot[i] = slot;
		s->rate_bytes[i] = 0;
	}
	s->rate_bytes[i] += n;
}

static uint64_t rate_get(const struct stream *s, int64_t now)
{
	int64_t slot = now / RATE_SLOT_NS, span;
	uint64_t sum = 0;

	for (int i = 0; i < RATE_SLOTS; i++)
		if (s->rate_slot[i] > slot - RATE_SLOTS &&
		    s->rate_slot[i] <= slot)
			sum += s->rate_bytes[i];
	/* the window: RATE_SLOTS slots, or the time since the start */
	span = now - s->t0;
	if (span > RATE_SLOTS * RATE_SLOT_NS)
		span = RATE_SLOTS * RATE_SLOT_NS;
	if (span < RATE_SLOT_NS)
		span = RATE_SLOT_NS;
	return (uint64_t)((double)sum * (double)NS_PER_S / (double)span);
}

/* --- wake-ups --------------------------------------------------------------- */

/* The journal's hook: it committed work for us (runs under j->lock). */
static void on_work(void *arg)
{
	struct jnl_flusher *f = arg;

	pthread_mutex_lock(&f->lock);
	f->work_gen++;
	pthread_cond_broadcast(&f->wake);
	pthread_mutex_unlock(&f->lock);
}

/* A step ended: wake gate()/handle_get()/jnl_flusher_wait() waiters. */
static void step_done(struct stream *s)
{
	struct jnl_flusher *f = s->f;

	pthread_mutex_lock(&f->lock);
	s->nwriting = 0;
	pthread_cond_broadcast(&f->done);
	pthread_mutex_unlock(&f->lock);
}

/* The journal failed: every stream stops (invariant: sticky). */
static void journal_failed(struct stream *s, int rc)
{
	struct jnl_flusher *f = s->f;

	pthread_mutex_lock(&f->lock);
	if (!f->failed) {
		f->failed = rc;
		LOG_ERR("flusher stops: the journal failed: %s",
			strerror(-rc));
	}
	s->st.last_error = rc;
	pthread_cond_broadcast(&f->wake);
	pthread_cond_broadcast(&f->done);
	pthread_mutex_unlock(&f->lock);
}

/* A success: end a backoff. */
static void backoff_reset(struct stream *s)
{
	if (!s->backoff_ms)
		return;
	LOG_INFO("flush stream %u: the remote answers again", s->no);
	s->backoff_ms = 0;
	pthread_mutex_lock(&s->f->lock);
	s->backoff_until = 0;
	pthread_mutex_unlock(&s->f->lock);
}

static void handles_close_all(struct stream *s);

/* A transient failure: count it, back off. */
static void backoff(struct stream *s, int rc, const char *what)
{
	struct jnl_flusher *f = s->f;

	if (!s->backoff_ms)
		LOG_WARN("flush stream %u: %s failed, backing off: %s", s->no,
			 what, strerror(-rc));
	s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : BACKOFF_MIN_MS;
	if (s->backoff_ms > f->backoff_max_ms)
		s->backoff_ms = f->backoff_max_ms;
	/* a file this stream keeps open may be what the remote is waiting
	 * for (an rmdir of the directory it was unlinked from: -EBUSY) */
	handles_close_all(s);
	pthread_mutex_lock(&f->lock);
	s->backoff_until = jnl_mono_ns() + (int64_t)s->backoff_ms * NS_PER_MS;
	pthread_mutex_unlock(&f->lock);
}

/* Flush through @r from now on (the share or the agent). */
static void use_remote(struct stream *s, struct rmt *r)
{
	handles_close_all(s); /* files belong to a connection */
	s->r = r;
	pthread_mutex_lock(&s->f->lock);
	s->via_agent = r == s->agent;
	pthread_mutex_unlock(&s->f->lock);
}

/* The agent's connection broke (not a refusal of one call). */
static bool lost(int rc)
{
	return rc == -ECONNRESET || rc == -EPIPE || rc == -ETIMEDOUT ||
	       rc == -ENOTCONN || rc == -ECONNREFUSED || rc == -EHOSTUNREACH ||
	       rc == -ENETUNREACH || rc == -ECONNABORTED;
}

static void count_error(struct stream *s, int rc, bool retry)
{
	pthread_mutex_lock(&s->f->lock);
	s->st.errors++;
	if (retry)
		s->st.retries++;
	s->st.last_error = rc;
	pthread_mutex_unlock(&s->f->lock);
	if (s->agent && s->r == s->agent && lost(rc)) {
		LOG_WARN("flush stream %u: agent lost (%s), flushing through "
			 "the share until it is back", s->no, strerror(-rc));
		use_remote(s, s->share);
		s->agent_retry_at = jnl_mono_ns() + AGENT_RETRY_NS;
	}
}

/*
 * Over a share that gives every file its login's owner (no RMT_CAP_OWNER:
 * SMB), the agent, which writes on the NAS's own disk, must give each
 * file it makes that owner too, or the share's users could not change or
 * remove what it wrote. Which owner that is, the share's server decides
 * (its login, a "force user"): a probe file made through the share, seen
 * through the agent, tells. The probe is named like no file of a user
 * and lives for three round trips at the share's root; named by the
 * journal and the stream, so that one a killed daemon left is truncated
 * and removed by the next probe of the same journal.
 */
static int agent_owner(struct stream *s)
{
	struct rmt_file *rf;
	struct stat st;
	char name[64];
	int rc, rc2;

	if (rmt_caps(s->share) & RMT_CAP_OWNER)
		return 0; /* the journal's owners go as they are */
	snprintf(name, sizeof(name), ".ferryfs-owner.%016" PRIx64 ".%u",
		 jnl_ident(s->f->j), s->no);
	rc = rmt_file_open(s->share, name, O_WRONLY | O_CREAT | O_TRUNC, 0600,
			   &rf);
	if (rc)
		return rc;
	rc = rmt_file_close(rf);
	if (!rc)
		rc = rmt_stat(s->agent, name, &st);
	rc2 = rmt_unlink(s->share, name);
	if (rc)
		return rc == -ENOENT ? -EXDEV : rc; /* not the share's root */
	if (rc2)
		return rc2;
	s->own_uid = st.st_uid;
	s->own_gid = st.st_gid;
	return 0;
}

/* Through the agent over a share without RMT_CAP_OWNER: what the agent
 * makes gets own_uid:own_gid (agent_try() used the agent only after
 * agent_owner() found them). */
static bool agent_gives_owner(const struct stream *s)
{
	return s->r == s->agent && !(rmt_caps(s->share) & RMT_CAP_OWNER);
}

/*
 * -ENOENT from the agent over a share that matches names without case
 * (no RMT_CAP_CASE: SMB): the journal may hold a name in other letters
 * than the disk (an application opened "A" where the share has "a"),
 * which the agent, on the disk itself, does not find. True, and the
 * stream flushes through the share until agent_try() is due again: the
 * call is retried there, where the share finds the name or gives its own
 * answer.
 */
static bool agent_misses_case(struct stream *s, int rc)
{
	if (rc != -ENOENT || s->r != s->agent ||
	    (rmt_caps(s->share) & RMT_CAP_CASE))
		return false;
	LOG_INFO("flush stream %u: the agent finds no such name: flushing "
		 "through the share for now (the share matches names "
		 "without case)", s->no);
	use_remote(s, s->share);
	s->agent_retry_at = jnl_mono_ns() + AGENT_RETRY_NS;
	return true;
}

/*
 * On the share with an agent configured: try the agent again when due.
 * The agent must serve the share's root (paths are relative to it): an
 * agent whose root is another directory (e.g. --root at the export while
 * the mount is of a directory in it) would put every flushed name in the
 * wrong place, so it is not used.
 */
static void agent_try(struct stream *s)
{
	struct stat ast, sst;
	int64_t now;
	int rc;

	if (!s->agent || s->r == s->agent)
		return;
	now = jnl_mono_ns();
	if (now < s->agent_retry_at)
		return;
	rc = rmt_stat(s->agent, "", &ast);
	if (!rc)
		rc = rmt_stat(s->share, "", &sst);
	if (!rc && ast.st_ino != sst.st_ino) {
		if (!s->no && !s->agent_elsewhere)
			LOG_ERR("agent '%s' serves another directory than the "
				"share's root (inode %llu, not %llu): not used; "
				"give the share's directory below the agent's "
				"root as agent=HOST:PORT/PATH",
				rmt_id(s->agent),
				(unsigned long long)ast.st_ino,
				(unsigned long long)sst.st_ino);
		s->agent_elsewhere = true;
		rc = -EXDEV;
	}
	if (!rc)
		rc = agent_owner(s);
	if (rc) {
		/* a host that does not answer costs a connect timeout per
		 * try: try less often while it stays away */
		s->agent_wait_ns = s->agent_wait_ns ? s->agent_wait_ns * 2 :
						      AGENT_RETRY_NS;
		if (s->agent_wait_ns > AGENT_RETRY_MAX_NS)
			s->agent_wait_ns = AGENT_RETRY_MAX_NS;
		if (!s->agent_elsewhere)
			LOG_INFO("flush stream %u: agent not used: %s; through "
				 "the share, the agent again in %lld s", s->no,
				 strerror(-rc),
				 (long long)(s->agent_wait_ns / NS_PER_S));
		s->agent_retry_at = jnl_mono_ns() + s->agent_wait_ns;
		return;
	}
	s->agent_wait_ns = 0;
	LOG_INFO("flush stream %u: flushing through the agent", s->no);
	use_remote(s, s->agent);
}

/*
 * A stat by the agent as the share's driver would give it, to compare with
 * a base the share gave (jnl_node_send_begin()). The agent sees the file
 * on its own disk: the same inode number as the share reports (agent_try()
 * checked the root's) but another device number than the share's driver
 * gave, and times to the nanosecond where SMB gives them to 100 ns.
 */
static void agent_stat_as_share(const struct stream *s, struct stat *st,
				uint64_t base_dev)
{
	st->st_dev = (dev_t)base_dev;
	if (rmt_caps(s->share) & RMT_CAP_NSEC)
		return;
	st->st_atim.tv_nsec -= st->st_atim.tv_nsec % 100;
	st->st_mtim.tv_nsec -= st->st_mtim.tv_nsec % 100;
	st->st_ctim.tv_nsec -= st->st_ctim.tv_nsec % 100;
}

/* --- open remote files ------------------------------------------------------ */

static void handle_close(struct stream *s, struct handle *h)
{
	int rc = rmt_file_close(h->f);

	/* written chunks were synced (or flushed) before their release:
	 * an error here concerns nothing released */
	if (rc)
		LOG_DBG("flush stream %u: close of node %" PRIu64 ": %s",
			s->no, h->id, strerror(-rc));
	h->id = 0;
	h->f = NULL;
}

static void handle_drop(struct stream *s, jnl_id id)
{
	for (int i = 0; i < HANDLE_MAX; i++)
		if (s->h[i].id == id)
			handle_close(s, &s->h[i]);
}

static void handles_close_all(struct stream *s)
{
	for (int i = 0; i < HANDLE_MAX; i++)
		if (s->h[i].id)
			handle_close(s, &s->h[i]);
}

/*
 * The open remote file of node @id, opened at its rpath under the
 * rename/unlink epoch (invariant 4). On error *fault says whose: the
 * journal's (rpath: -ENOENT when the node has no remote name), the
 * remote's, or F_STOP.
 */
static int handle_get(struct stream *s, jnl_id id, struct rmt_file **out,
		      enum fault *fault)
{
	struct jnl_flusher *f = s->f;
	struct handle *h = NULL;
	struct rmt_file *rf = NULL;
	int flags = (f->flags & JNL_FLUSH_VERIFY) ? O_RDWR : O_WRONLY;
	uint64_t ce = jnl_conflict_epoch(f->j);
	int rc = -EAGAIN;

	if (ce != s->conflict_seen) { /* a node moved: journal.c C3 */
		handles_close_all(s);
		s->conflict_seen = ce;
	}
	for (int i = 0; i < HANDLE_MAX; i++)
		if (s->h[i].id == id) {
			s->h[i].used = jnl_mono_ns();
			*out = s->h[i].f;
			return 0;
		}
	for (int tries = 0; tries < OPEN_TRIES; tries++) {
		uint64_t epoch;
		bool same, stop;

		pthread_mutex_lock(&f->lock);
		while (f->ns_busy && !f->stop)
			pthread_cond_wait(&f->done, &f->lock);
		epoch = f->ns_epoch;
		stop = f->stop;
		pthread_mutex_unlock(&f->lock);
		if (stop) {
			*fault = F_STOP;
			return -ECANCELED;
		}
		rc = jnl_node_rpath(f->j, id, s->path, sizeof(s->path));
		if (rc) {
			*fault = F_JOURNAL;
			return rc;
		}
		rc = rmt_file_open(s->r, s->path, flags, 0, &rf);
		pthread_mutex_lock(&f->lock);
		same = f->ns_epoch == epoch;
		pthread_mutex_unlock(&f->lock);
		if (same)
			break;
		if (!rc)
			rmt_file_close(rf);
		rf = NULL;
		rc = -EAGAIN; /* a rename or unlink ran meanwhile: again */
	}
	if (rc) {
		*fault = F_REMOTE;
		return rc;
	}
	for (int i = 0; i < HANDLE_MAX && (!h || h->id); i++)
		if (!h || !s->h[i].id || s->h[i].used < h->used)
			h = &s->h[i]; /* a free slot, else the least recent */
	if (h->id)
		handle_close(s, h);
	h->id = id;
	h->f = rf;
	h->used = jnl_mono_ns();
	*out = rf;
	return 0;
}

/* --- bandwidth ---------------------------------------------------------------- */

/* Book @n bytes in the shared bucket and sleep to the end of the booking.
 * -ECANCELED if stop() came meanwhile. */
static int bw_book(struct stream *s, size_t n)
{
	struct jnl_flusher *f = s->f;
	int64_t now, until;
	int rc = 0;

	if (!f->bwlimit)
		return 0;
	pthread_mutex_lock(&f->lock);
	now = jnl_mono_ns();
	if (f->tat < now - BW_BURST_NS)
		f->tat = now - BW_BURST_NS;
	f->tat += (int64_t)((double)n * (double)NS_PER_S / (double)f->bwlimit);
	until = f->tat;
	if (!sleep_until(f, until))
		rc = -ECANCELED;
	pthread_mutex_unlock(&f->lock);
	return rc;
}

/* --- chunks --------------------------------------------------------------------- */

/*
 * Write a chunk: the part past the remote file's end keeps its holes
 * (4 KiB blocks of zeros are not written, the size is set instead), so a
 * sparse file stays sparse on the share. Below the remote's end every byte
 * is written: zeros there may replace data.
 */
#define SPARSE_BLOCK 4096u

static bool all_zero(const char *p, size_t n)
{
	return n == 0 || (p[0] == 0 && !memcmp(p, p + 1, n - 1));
}

/* From @pos of a chunk of @n bytes at file offset @off: the bytes up to
 * the next block boundary of the file, at most the rest of the chunk. */
static size_t block_run(off_t off, size_t pos, size_t n)
{
	size_t run = SPARSE_BLOCK - (size_t)((uint64_t)(off + (off_t)pos) %
					     SPARSE_BLOCK);

	return run < n - pos ? run : n - pos;
}

static ssize_t write_sparse(struct rmt_file *rf,
			    const char *buf, size_t n, off_t off)
{
	size_t head = 0, pos, run;
	struct stat st;
	ssize_t got;

	/* no block of zeros: nothing to leave out, and the remote's size
	 * (a round trip) does not matter */
	for (pos = 0; pos < n; pos += run) {
		run = block_run(off, pos, n);
		if (run == SPARSE_BLOCK && all_zero(buf + pos, run))
			break;
	}
	if (pos >= n || rmt_file_stat(rf, &st) < 0 ||
	    (uint64_t)off + n <= (uint64_t)st.st_size)
		return rmt_file_pwrite(rf, buf, n, off);
	if (st.st_size > off)
		head = (size_t)(st.st_size - off);
	if (head) {
		got = rmt_file_pwrite(rf, buf, head, off);
		if (got < 0)
			return got;
	}
	for (pos = head; pos < n; pos += run) {
		/* a run of blocks that are all zeros, or all not */
		bool zero;

		run = block_run(off, pos, n);
		zero = all_zero(buf + pos, run);
		while (pos + run < n) {
			size_t b = n - pos - run < SPARSE_BLOCK
					   ? n - pos - run
					   : SPARSE_BLOCK;

			if (all_zero(buf + pos + run, b) != zero)
				break;
			run += b;
		}
		if (zero)
			continue;
		got = rmt_file_pwrite(rf, buf + pos, run, off + (off_t)pos);
		if (got < 0)
			return got;
	}
	/* trailing zeros: one byte marks where the chunk ends (a write
	 * never shrinks the file, as a truncate would under another
	 * stream's later chunk) */
	if (!all_zero(buf + n - 1, 1) || rmt_file_pwrite(rf, buf + n - 1, 1,
							  off + (off_t)n - 1) >= 0)
		return (ssize_t)n;
	return -EIO;
}

/*
 * Before the first change of an imported file's data, size or mtime on the
 * remote (a chunk @c, or a SETATTR/FINISH op @allow_seq): is the remote
 * still the base the local changes were made against (journal.h
 * "Conflicts", journal.c C1)? One rmt_stat() per file and flush: nothing
 * in SENDING. 0: go on. A conflict is resolved here (the node becomes the
 * conflict copy: -ESTALE with F_GONE, the chunk or op is not ours to send
 * any more); one that cannot be kept apart is logged and the local
 * version goes on (the last writer wins).
 */
static int conflict_check(struct stream *s, jnl_id id,
			  const struct jnl_chunk_ref *c, uint64_t allow_seq,
			  enum fault *fault)
{
	struct jnl_flusher *f = s->f;
	char path[PATH_MAX];
	struct jnl_node n;
	struct stat st;
	int rc = -EAGAIN;

	for (int tries = 0; tries < 4 && rc == -EAGAIN; tries++) {
		rc = jnl_node_get(f->j, id, &n);
		if (rc) {
			*fault = rc == -ENOENT ? F_GONE : F_JOURNAL;
			return rc;
		}
		if (n.base != JNL_BASE_SET)
			return 0;
		rc = jnl_node_rpath(f->j, id, path, sizeof(path));
		if (rc == -ENOENT)
			return 0; /* nowhere on the remote: the caller sees */
		if (rc) {
			*fault = F_JOURNAL;
			return rc;
		}
		rc = rmt_stat(s->r, path, &st);
		if (rc) {
			*fault = F_REMOTE;
			return rc;
		}
		if (s->r == s->agent)
			agent_stat_as_share(s, &st, n.base_dev);
		rc = jnl_node_send_begin(f->j, id, n.base_seq, c, &st);
		if (rc != -EXDEV)
			continue;
		rc = jnl_conflict_resolve(f->j, s->r, id, n.base_seq, &st,
					  allow_seq, NULL);
		if (!rc) {
			*fault = F_GONE;
			return -ESTALE;
		}
		if (rc == -ESTALE || rc == -EBUSY || rc == -ENAMETOOLONG ||
		    rc == -EEXIST || rc == -EINVAL || rc == -ENODATA)
			rc = -EAGAIN; /* look again (SENDING: not converted) */
		else if (rc != -EAGAIN) {
			*fault = rc == -EIO ? F_JOURNAL : F_REMOTE;
			return rc;
		}
	}
	if (rc == -ENOENT)
		*fault = F_GONE;
	else if (rc == -EAGAIN)
		*fault = F_REMOTE; /* retried later */
	else if (rc)
		*fault = F_JOURNAL;
	return rc;
}

/* Whose is it that node @id has no remote name: lost its last name
 * meanwhile (F_GONE), or a name the journal does not place (F_JOURNAL:
 * the chunk is parked). */
static enum fault no_rpath(struct jnl_flusher *f, jnl_id id)
{
	struct jnl_node node;

	if (!jnl_node_get(f->j, id, &node) &&
	    (node.flags & (JNL_NODE_UNLINKED | JNL_NODE_LOCAL)))
		return F_GONE;
	return F_JOURNAL;
}

/* Is the SHA-256 of a chunk of node @id needed (invariant 2)? Not for
 * the agent's PUT: the caller knows. */
static bool digest_wanted(struct jnl_flusher *f, jnl_id id)
{
	return (f->flags & JNL_FLUSH_VERIFY) || jnl_chunk_digest_used(f->j, id);
}

/* The SHA-256 of the @n bytes read into @buf: @n, or -errno with *fault. */
static ssize_t chunk_hash(const unsigned char *buf, ssize_t n,
			  unsigned char sha[32], enum fault *fault)
{
	if (!EVP_Digest(buf, (size_t)n, sha, NULL, EVP_sha256(), NULL)) {
		*fault = F_JOURNAL;
		return -ENOMEM;
	}
	return n;
}

/*
 * Read claimed chunk @c into @buf and, if @digest, hash it into @sha (else
 * @sha is all zeros). Its length, or -errno with *fault. The journal
 * only: the helper calls it too.
 */
static ssize_t chunk_read(struct jnl_flusher *f, const struct jnl_chunk_ref *c,
			  unsigned char *buf, unsigned char sha[32],
			  bool digest, enum fault *fault)
{
	ssize_t n = jnl_read(f->j, c->id, buf, c->length,
			     (off_t)(c->index * f->chunk_size), NULL);

	memset(sha, 0, 32);
	if (n <= 0) { /* 0: truncated away, the release is stale */
		*fault = n == 0 || n == -ENOENT ? F_GONE : F_JOURNAL;
		return n == 0 ? -ENOENT : n;
	}
	return digest ? chunk_hash(buf, n, sha, fault) : n;
}

/*
 * After chunk_read() gave @n: check that no other writer changed its file
 * (conflict_check()) and that the claim still holds. @n, or -errno with
 * *fault.
 */
static ssize_t chunk_check(struct stream *s, const struct jnl_chunk_ref *c,
			   ssize_t n, enum fault *fault)
{
	struct jnl_flusher *f = s->f;
	int rc;

	if (n < 0)
		return n;
	rc = conflict_check(s, c->id, c, 0, fault);
	if (rc)
		return rc;
	/* after the read: a claim gone stale meanwhile (a conversion took
	 * the chunk back, and the copy's own claim may have flushed it and
	 * given its staging back) read bytes that are not the chunk's; a
	 * parked one retried 30 s later wrote a copy's length of zeros over
	 * the copy (it_conflict c3) */
	rc = jnl_chunk_claimed(f->j, c);
	if (rc) {
		*fault = rc == -ENOENT ? F_GONE : F_JOURNAL;
		return rc;
	}
	return n;
}

/* chunk_read() and chunk_check() of claimed chunk @c into @buf. */
static ssize_t chunk_prepare(struct stream *s, const struct jnl_chunk_ref *c,
			     unsigned char *buf, unsigned char sha[32],
			     enum fault *fault)
{
	return chunk_check(s, c, chunk_read(s->f, c, buf, sha, true, fault),
			   fault);
}

/* --- the helper: the next chunk while this one is written ----------------- */

static int queued(struct stream *s);
static void chunk_released(struct stream *s, const struct jnl_chunk_ref *c,
			   int rc, size_t sent);
static void owed_settle(struct stream *s);

/* The helper's job: claim one chunk and read it, unless an op may be
 * waiting (ops go first: take_op() has looked since the last commit of
 * work and found none) or the flusher stops or pauses. */
static void prep_next(struct stream *s)
{
	struct jnl_flusher *f = s->f;
	struct prep *p = &s->pre;
	bool ops;

	if (p->rel && !p->rel_done) {
		p->rel_rc = jnl_chunk_release(f->j, &p->rel_ref, true,
					      p->rel_sha);
		p->rel_done = true;
	}
	pthread_mutex_lock(&f->lock);
	ops = f->qlen || f->qgen != f->work_gen || f->stop || f->paused ||
	      f->failed;
	pthread_mutex_unlock(&f->lock);
	if (ops || queued(s) <= 0 ||
	    jnl_chunk_claim_upto(f->j, &p->ref, 1, f->chunk_size) != 1)
		return; /* a journal error shows in the stream's own claim */
	p->have = true;
	p->n = chunk_read(f, &p->ref, p->buf, p->sha,
			  digest_wanted(f, p->ref.id), &p->fault);
}

static void *prep_main(void *arg)
{
	struct stream *s = arg;
	struct prep *p = &s->pre;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (p->state == P_IDLE)
			pthread_cond_wait(&p->cond, &p->lock);
		if (p->state == P_QUIT)
			break;
		pthread_mutex_unlock(&p->lock);
		prep_next(s);
		pthread_mutex_lock(&p->lock);
		p->state = P_IDLE;
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* The chunk about to be written is the last one the stream holds: ask the
 * helper for the next. */
static void prep_ask(struct stream *s)
{
	struct prep *p = &s->pre;

	/* on the share while an agent is configured: the loop must run dry
	 * now and then for agent_try() */
	if (!p->started || s->next < s->nclaim ||
	    (s->agent && s->r != s->agent))
		return;
	pthread_mutex_lock(&p->lock);
	p->state = P_ASKED;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/* Wait for the helper; what it claimed is the stream's next claim. */
static void prep_take(struct stream *s)
{
	struct prep *p = &s->pre;

	if (!p->started)
		return;
	pthread_mutex_lock(&p->lock);
	while (p->state == P_ASKED)
		pthread_cond_wait(&p->cond, &p->lock);
	pthread_mutex_unlock(&p->lock);
	if (p->rel && p->rel_done) {
		p->rel = false;
		chunk_released(s, &p->rel_ref, p->rel_rc, p->rel_sent);
	}
	if (!p->have)
		return;
	p->have = false;
	p->ready = true;
	if (s->next >= s->nclaim)
		s->next = s->nclaim = 0;
	s->claim[s->nclaim++] = p->ref;
}

static void prep_start(struct stream *s)
{
	struct prep *p = &s->pre;

	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->state = P_IDLE;
	p->started = !pthread_create(&p->thread, NULL, prep_main, s);
	if (!p->started)
		LOG_WARN("flush stream %u: no helper thread: each chunk is "
			 "read between two writes", s->no);
}

static void prep_stop(struct stream *s)
{
	struct prep *p = &s->pre;

	if (p->started) {
		pthread_mutex_lock(&p->lock);
		p->state = P_QUIT;
		pthread_cond_signal(&p->cond);
		pthread_mutex_unlock(&p->lock);
		pthread_join(p->thread, NULL);
		p->started = false;
	}
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
}

/*
 * Write chunk @c at its node's remote path (invariant 2). 0 with @sha the
 * digest of what was written, or -errno with *fault.
 */
static int chunk_write(struct stream *s, const struct jnl_chunk_ref *c,
		       unsigned char sha[32], size_t *sent, enum fault *fault)
{
	struct jnl_flusher *f = s->f;
	off_t off = (off_t)(c->index * f->chunk_size);
	unsigned char vsha[32];
	struct rmt_file *rf;
	bool digest = (rmt_caps(s->r) & RMT_CAP_PUT) ||
		      digest_wanted(f, c->id);
	ssize_t n, got;
	int rc;

	*sent = 0;
	if (s->pre.ready && !memcmp(&s->pre.ref, c, sizeof(*c))) {
		unsigned char *b = s->buf; /* the helper read it */

		s->buf = s->pre.buf;
		s->pre.buf = b;
		s->pre.ready = false;
		memcpy(sha, s->pre.sha, sizeof(s->pre.sha));
		*fault = s->pre.fault;
		n = s->pre.n;
		if (n > 0 && digest && !jnl_digest_known(sha))
			n = chunk_hash(s->buf, n, sha, fault);
	} else {
		s->pre.ready = false;
		n = chunk_read(f, c, s->buf, sha, digest, fault);
	}
	n = chunk_check(s, c, n, fault);
	if (n < 0)
		return (int)n;
	prep_ask(s);
	rc = handle_get(s, c->id, &rf, fault);
	if (rc == -ENOENT && *fault == F_JOURNAL)
		*fault = no_rpath(f, c->id);
	if (rc)
		return rc;
	rc = bw_book(s, (size_t)n);
	if (rc) {
		*fault = F_STOP;
		return rc;
	}
	*fault = F_REMOTE;
	if (rmt_caps(s->r) & RMT_CAP_PUT) { /* written, checked, synced */
		got = rmt_file_put(rf, s->buf, (size_t)n, off, sha);
		rc = got < 0 ? (int)got : 0;
	} else {
		got = write_sparse(rf, (const char *)s->buf, (size_t)n, off);
		rc = got < 0 ? (int)got : 0;
		if (!rc && !(f->flags & JNL_FLUSH_NO_FSYNC))
			rc = rmt_file_fsync(rf, true);
		else if (!rc && (rmt_caps(s->r) & RMT_CAP_CLOSE_ERRORS))
			rc = rmt_file_flush(rf);
	}
	if (!rc && (f->flags & JNL_FLUSH_VERIFY)) {
		got = rmt_file_pread(rf, s->vbuf, (size_t)n, off);
		if (got < 0) {
			rc = (int)got;
		} else if (got != n ||
			   !EVP_Digest(s->vbuf, (size_t)n, vsha, NULL,
				       EVP_sha256(), NULL) ||
			   memcmp(sha, vsha, sizeof(vsha))) {
			/* the remote does not hold what we sent */
			LOG_ERR("flush stream %u: read-back of chunk %" PRIu64
				" of '%s' differs from what was written",
				s->no, c->index, s->path);
			rc = -EIO;
		}
	}
	if (rc) {
		handle_drop(s, c->id); /* it may be broken: reopen */
		return rc;
	}
	*sent = (size_t)n;
	return 0;
}

/* Release @c not-ok (back to DIRTY). False if the journal failed. */
static bool put_back(struct stream *s, const struct jnl_chunk_ref *c)
{
	int rc = jnl_chunk_release(s->f->j, c, false, NULL);

	if (rc == -EIO) {
		journal_failed(s, rc);
		return false;
	}
	if (rc)
		LOG_ERR("flush stream %u: cannot put chunk %" PRIu64
			" of node %" PRIu64 " back: %s", s->no, c->index,
			c->id, strerror(-rc));
	return true;
}

/* A transient error @rc of @what: @c back to DIRTY, the stream backs off. */
static void retry_later(struct stream *s, const struct jnl_chunk_ref *c,
			int rc, const char *what)
{
	if (put_back(s, c))
		backoff(s, rc, what);
	count_error(s, rc, true);
}

static void park(struct stream *s, const struct jnl_chunk_ref *c, int rc)
{
	if (s->npark == PARK_MAX) { /* too many: treat it as transient */
		retry_later(s, c, rc, "writing a chunk");
		return;
	}
	if (s->logged_park != c->id) {
		LOG_ERR("cannot write chunk %" PRIu64 " of '%s' (node %" PRIu64
			") on the remote, holding it back: %s", c->index,
			s->path[0] ? s->path : "?", c->id, strerror(-rc));
		s->logged_park = c->id;
	}
	s->park[s->npark].ref = *c;
	s->park[s->npark].retry_at = jnl_mono_ns() + PARK_RETRY_NS;
	s->npark++;
	count_error(s, rc, false);
	pthread_mutex_lock(&s->f->lock);
	s->parked = (uint64_t)s->npark;
	pthread_mutex_unlock(&s->f->lock);
}

/* Is another stream applying the size of node @id? f->lock held. */
static bool sized(const struct stream *s, jnl_id id)
{
	const struct jnl_flusher *f = s->f;

	for (unsigned int i = 0; i < f->nstreams; i++)
		for (int k = 0; &f->s[i] != s && k < f->s[i].nsizing; k++)
			if (f->s[i].sizing[k] == id)
				return true;
	return false;
}

static void chunk_done(struct stream *s, const struct jnl_chunk_ref *c,
		       int rc, enum fault fault, const unsigned char sha[32],
		       size_t sent);

/* Invariant 5: wait until no other stream sizes a node of the @n chunks
 * @c, then hold them in s->writing[] (step_done() lets go). */
static void writing_begin(struct stream *s, const struct jnl_chunk_ref *c,
			  int n)
{
	struct jnl_flusher *f = s->f;

	pthread_mutex_lock(&f->lock);
	for (bool again = true; again && !f->stop;) {
		again = false;
		for (int i = 0; i < n && !again; i++)
			again = sized(s, c[i].id);
		if (again)
			pthread_cond_wait(&f->done, &f->lock);
	}
	for (int i = 0; i < n; i++)
		s->writing[i] = c[i].id;
	s->nwriting = n;
	set_state(s, JNL_STREAM_FLUSHING);
	pthread_mutex_unlock(&f->lock);
}

/* Send one claimed chunk and release (or park) it; then take what the
 * helper claimed meanwhile. */
static void send_chunk(struct stream *s, const struct jnl_chunk_ref *c)
{
	struct jnl_chunk_ref cur = *c; /* prep_take() reuses s->claim[] */
	unsigned char sha[32];
	enum fault fault = F_REMOTE;
	size_t sent;
	int rc;

	writing_begin(s, &cur, 1);
	s->path[0] = 0;

	rc = chunk_write(s, &cur, sha, &sent, &fault);
	CRASH_POINT("chunk_sent"); /* written, not released */
	prep_take(s);
	owed_settle(s); /* the helper was not asked: no overlap to lose */
	if (!rc && s->pre.ready) { /* the helper releases it next time */
		struct prep *p = &s->pre;

		p->rel = true;
		p->rel_done = false;
		p->rel_ref = cur;
		memcpy(p->rel_sha, sha, sizeof(p->rel_sha));
		p->rel_sent = sent;
	} else {
		chunk_done(s, &cur, rc, fault, sha, sent);
	}
	step_done(s);
}

static void chunk_failed(struct stream *s, const struct jnl_chunk_ref *c,
			 int rc, enum fault fault);

/* Chunk @c's ok release gave @rc: count it, or handle the failure. */
static void chunk_released(struct stream *s, const struct jnl_chunk_ref *c,
			   int rc, size_t sent)
{
	struct jnl_flusher *f = s->f;

	if (rc) {
		chunk_failed(s, c, rc, F_JOURNAL);
		return;
	}
	pthread_mutex_lock(&f->lock);
	s->st.bytes += sent;
	s->st.chunks++;
	rate_add(s, sent, jnl_mono_ns());
	pthread_mutex_unlock(&f->lock);
	backoff_reset(s);
}

/* End chunk @c after its write gave @rc (invariant 1): release or park. */
static void chunk_done(struct stream *s, const struct jnl_chunk_ref *c,
		       int rc, enum fault fault, const unsigned char sha[32],
		       size_t sent)
{
	if (rc)
		chunk_failed(s, c, rc, fault);
	else
		chunk_released(s, c, jnl_chunk_release(s->f->j, c, true, sha),
			       sent);
}

/* The release the helper was not asked to do: do it now. */
static void owed_settle(struct stream *s)
{
	struct prep *p = &s->pre;

	if (!p->rel)
		return;
	p->rel = false;
	chunk_done(s, &p->rel_ref, 0, F_REMOTE, p->rel_sha, p->rel_sent);
}

/* Chunk @c failed with @rc: back to DIRTY, or parked (invariant 1). */
static void chunk_failed(struct stream *s, const struct jnl_chunk_ref *c,
			 int rc, enum fault fault)
{
	switch (fault) {
	case F_STOP:
	case F_GONE:
		put_back(s, c);
		break;
	case F_JOURNAL:
		if (rc == -EIO) {
			journal_failed(s, rc);
			break;
		}
		if (rc == -ENOENT) { /* no remote name: see journal.h */
			park(s, c, rc);
			break;
		}
		retry_later(s, c, rc, "the journal");
		break;
	case F_REMOTE:
		if (agent_misses_case(s, rc)) {
			put_back(s, c); /* to the share, at once */
			break;
		}
		if (permanent(rc)) {
			park(s, c, rc);
			break;
		}
		retry_later(s, c, rc, "writing a chunk");
		break;
	}
}

/* The read side (send_put()): no name-moving replay runs until
 * ns_read_end(); waits for those under way, and lets waiting ones go
 * first. */
static void ns_read_begin(struct jnl_flusher *f)
{
	pthread_mutex_lock(&f->lock);
	while ((f->ns_busy || f->ns_wwait) && !f->stop)
		pthread_cond_wait(&f->done, &f->lock);
	f->ns_readers++;
	pthread_mutex_unlock(&f->lock);
}

static void ns_read_end(struct jnl_flusher *f)
{
	pthread_mutex_lock(&f->lock);
	f->ns_readers--;
	pthread_cond_broadcast(&f->done);
	pthread_mutex_unlock(&f->lock);
}

#define PUT_BATCH_MAX (256u << 10) /* chunks up to this go in one batch */

/*
 * The claimed chunks not sent yet, through rmt_put_path() (RMT_CAP_PUT:
 * the agent): each chunk is written, checked and synced in one exchange at
 * its node's path, without an open file, and small chunks of many files go
 * in one batch (one round trip). Invariant 4 by the read side of the
 * epoch (ns_read_begin()): no rename, unlink or rmdir replay runs between
 * jnl_node_rpath() and the writes. Invariant 5: every chunk's node is in
 * s->writing[] while it is sent, after no other stream was sizing it.
 */
static void send_put(struct stream *s)
{
	struct jnl_flusher *f = s->f;
	struct jnl_chunk_ref *c = &s->claim[s->next];
	int n = 0, rc[CLAIM_MAX], grc[CLAIM_MAX], groups;
	enum fault fault[CLAIM_MAX];
	unsigned char sha[CLAIM_MAX][32];
	size_t len[CLAIM_MAX], pos = 0, total = 0;
	bool batch = true;

	/* as many as fit the buffer (the claim's budget is one chunk) */
	while (s->next + n < s->nclaim &&
	       (n == 0 || pos + c[n].length <= f->chunk_size)) {
		pos += c[n].length;
		n++;
	}
	s->next += n;
	/* the read side first, then the gates: a batch holding the write
	 * side may wait in gate() for what a writer of ours would hold */
	ns_read_begin(f);
	writing_begin(s, c, n);

	owed_settle(s); /* send_chunk() left it to the helper */

	pos = 0;
	for (int i = 0; i < n; i++) {
		char *path = s->pbuf + (size_t)i * PATH_MAX;
		unsigned char *buf = s->buf + pos;
		ssize_t got;

		len[i] = 0;
		got = chunk_prepare(s, &c[i], buf, sha[i], &fault[i]);
		rc[i] = got < 0 ? (int)got : 0;
		if (got < 0)
			continue;
		len[i] = (size_t)got;
		pos += len[i];
		fault[i] = F_JOURNAL;
		rc[i] = jnl_node_rpath(f->j, c[i].id, path, PATH_MAX);
		if (rc[i] == -ENOENT) {
			fault[i] = no_rpath(f, c[i].id);
			continue;
		}
		if (rc[i])
			continue;
		fault[i] = F_REMOTE;
		total += len[i];
		batch = batch && len[i] <= PUT_BATCH_MAX;
	}
	if (total && bw_book(s, total)) {
		for (int i = 0; i < n; i++)
			if (!rc[i]) {
				rc[i] = -ECANCELED;
				fault[i] = F_STOP;
			}
		total = 0;
	}
	/* in a batch the puts are queued (one round trip), else sent */
	batch = total && batch && n > 1 && !rmt_batch_begin(s->r);
	pos = 0;
	for (int i = 0; total && i < n; i++) {
		ssize_t got = 0;

		if (batch)
			rmt_batch_mark(s->r);
		if (!rc[i])
			got = rmt_put_path(s->r, s->pbuf + (size_t)i * PATH_MAX,
					   s->buf + pos, len[i],
					   (off_t)(c[i].index * f->chunk_size),
					   sha[i]);
		if (got < 0)
			rc[i] = (int)got;
		pos += len[i];
	}
	if (batch) {
		groups = rmt_batch_end(s->r, grc, (unsigned int)n);
		for (int i = 0; i < n; i++)
			if (fault[i] == F_REMOTE && !rc[i])
				rc[i] = groups < 0 ? groups : grc[i];
	}
	ns_read_end(f);
	for (int i = 0; i < n; i++) {
		if (rc[i] && fault[i] == F_REMOTE)
			snprintf(s->path, sizeof(s->path), "%s",
				 s->pbuf + (size_t)i * PATH_MAX);
		chunk_done(s, &c[i], rc[i], fault[i], sha[i], len[i]);
	}
	step_done(s);
}

/* Release every chunk this stream holds not-ok (invariant 1). */
static void put_back_all(struct stream *s)
{
	for (; s->next < s->nclaim; s->next++)
		put_back(s, &s->claim[s->next]);
	s->next = s->nclaim = 0;
	s->pre.ready = false; /* it was one of them */
	owed_settle(s);
	for (int i = 0; i < s->npark; i++)
		put_back(s, &s->park[i].ref);
	s->npark = 0;
	pthread_mutex_lock(&s->f->lock);
	s->parked = 0;
	pthread_mutex_unlock(&s->f->lock);
}

/* A parked chunk whose time came (or all of them after a kick). */
static bool unpark_one(struct stream *s, struct jnl_chunk_ref *out)
{
	int64_t now = jnl_mono_ns();

	for (int i = 0; i < s->npark; i++) {
		if (s->park[i].retry_at > now)
			continue;
		*out = s->park[i].ref;
		s->park[i] = s->park[--s->npark];
		pthread_mutex_lock(&s->f->lock);
		s->parked = (uint64_t)s->npark;
		pthread_mutex_unlock(&s->f->lock);
		return true;
	}
	return false;
}

/* --- ops ---------------------------------------------------------------------------- */

/* Keep streams from starting a chunk of @id, and wait until no other
 * stream writes one (invariant 5); ungate() when the size is applied. */
static int gate(struct stream *s, jnl_id id)
{
	struct jnl_flusher *f = s->f;
	bool busy = true;

	pthread_mutex_lock(&f->lock);
	if (s->nsizing == OPQ_BATCH) { /* not in a batch of more ops */
		pthread_mutex_unlock(&f->lock);
		return -ECANCELED;
	}
	s->sizing[s->nsizing++] = id;
	while (!f->stop && busy) {
		busy = false;
		for (unsigned int i = 0; i < f->nstreams; i++)
			for (int k = 0; &f->s[i] != s && k < f->s[i].nwriting;
			     k++)
				if (f->s[i].writing[k] == id)
					busy = true;
		if (busy)
			pthread_cond_wait(&f->done, &f->lock);
	}
	if (busy) {
		s->nsizing--;
		pthread_cond_broadcast(&f->done);
	}
	pthread_mutex_unlock(&f->lock);
	return busy ? -ECANCELED : 0;
}

static void ungate(struct stream *s)
{
	struct jnl_flusher *f = s->f;

	if (s->batching)
		return; /* replay_batch() ungates when the batch is back */
	pthread_mutex_lock(&f->lock);
	s->nsizing = 0;
	pthread_cond_broadcast(&f->done);
	pthread_mutex_unlock(&f->lock);
}

static void ns_enter(struct jnl_flusher *f)
{
	pthread_mutex_lock(&f->lock);
	f->ns_wwait++;
	while (f->ns_readers)
		pthread_cond_wait(&f->done, &f->lock);
	f->ns_wwait--;
	f->ns_busy++;
	f->ns_epoch++;
	pthread_mutex_unlock(&f->lock);
	jnl_names_move_begin(f->j); /* the mount's remote paths too */
}

static void ns_leave(struct jnl_flusher *f)
{
	jnl_names_move_end(f->j);
	pthread_mutex_lock(&f->lock);
	f->ns_busy--;
	f->ns_epoch++;
	pthread_cond_broadcast(&f->done);
	pthread_mutex_unlock(&f->lock);
}

/* Attributes of @n as an rmt_setattr (owner_bits(): uid/gid). Through an
 * agent that gives the share's owner (agent_gives_owner()), every owner
 * set is that one. A node with data still to flush keeps its owner's
 * write bit for a flusher that is not root (the chunks open the file for
 * writing); its FINISH, after the last chunk, sets the mode asked. */
static struct rmt_setattr attrs_of(const struct stream *s,
				   const struct jnl_node *n, unsigned int set)
{
	struct rmt_setattr sa;
	bool own = agent_gives_owner(s);

	memset(&sa, 0, sizeof(sa));
	sa.set = set;
	sa.mode = n->mode & 07777;
	if (!s->f->root && (n->flags & JNL_NODE_DATA))
		sa.mode |= S_IWUSR;
	sa.uid = own ? s->own_uid : n->uid;
	sa.gid = own ? s->own_gid : n->gid;
	sa.size = (off_t)n->size;
	sa.atime = n->atime;
	sa.mtime = n->mtime;
	return sa;
}

static unsigned int owner_bits(const struct stream *s)
{
	if (agent_gives_owner(s))
		return RMT_SET_UID | RMT_SET_GID; /* the share's owner */
	return s->f->root && (rmt_caps(s->r) & RMT_CAP_OWNER)
		       ? RMT_SET_UID | RMT_SET_GID
		       : 0;
}

static int replay_create(struct stream *s, const struct jnl_node *n)
{
	unsigned int set = RMT_SET_MODE | RMT_SET_ATIME | RMT_SET_MTIME |
			   owner_bits(s);
	struct rmt_setattr sa = attrs_of(s, n, set);
	struct rmt_file *rf;
	struct stat st;
	int rc, rc2;

	/* data follows, and its FINISH sets mode, owner and times; the
	 * share's owner (the agent's) is given now */
	if (n->flags & JNL_NODE_DATA)
		sa.set &= agent_gives_owner(s) ? owner_bits(s) : 0;
	if (S_ISREG(n->mode)) {
		/* truncating is safe: journal.h, "Op replay" */
		rc = rmt_file_open(s->r, s->path, O_WRONLY | O_CREAT | O_TRUNC,
				   sa.mode, &rf);
		if (rc)
			return rc;
		rc = sa.set ? rmt_setattr(s->r, NULL, rf, &sa) : 0;
		rc2 = rmt_file_close(rf);
		return rc ? rc : rc2;
	}
	rc = rmt_mknod(s->r, s->path, n->mode, 0);
	if (rc == -EEXIST) {
		rc2 = rmt_stat(s->r, s->path, &st);
		if (rc2)
			return rc2;
		if ((st.st_mode & S_IFMT) == (n->mode & S_IFMT))
			rc = 0;
	}
	return rc ? rc : rmt_setattr(s->r, s->path, NULL, &sa);
}

static int replay_symlink(struct stream *s, const struct jnl_node *n,
			  enum fault *fault)
{
	struct rmt_setattr sa = attrs_of(s, n, RMT_SET_ATIME | RMT_SET_MTIME |
						    owner_bits(s));
	int rc;

	rc = jnl_readlink(s->f->j, n->id, s->path2, sizeof(s->path2));
	if (rc < 0) {
		*fault = F_JOURNAL;
		return rc;
	}
	rc = rmt_symlink(s->r, s->path2, s->path);
	if (rc == -EEXIST) {
		char *cur = malloc(PATH_MAX);
		int rc2;

		if (!cur)
			return -ENOMEM;
		rc2 = rmt_readlink(s->r, s->path, cur, PATH_MAX);
		if (rc2 >= 0 && !strcmp(cur, s->path2))
			rc = 0; /* ours, from before a crash */
		free(cur);
	}
	return rc ? rc : rmt_setattr(s->r, s->path, NULL, &sa);
}

/* An exchange is the one rename whose replay is not idempotent: sent
 * again after a crash between the remote's answer and the ack, it swaps
 * the two back. So the source's remote inode goes into the op durably
 * before it is sent (jnl_op_exchange_mark()), and a replay that finds it
 * at the target and another at the source has nothing to do (*@done). */
static int exchange_prepare(struct stream *s, const struct jnl_op *op,
			    bool *done, enum fault *fault)
{
	struct stat a, b;
	int rc;

	*done = false;
	rc = rmt_stat(s->r, s->path, &a);
	if (rc)
		return rc;
	if (op->xino) {
		*done = (uint64_t)a.st_ino != op->xino &&
			!rmt_stat(s->r, s->path2, &b) &&
			(uint64_t)b.st_ino == op->xino;
		return 0;
	}
	rc = jnl_op_exchange_mark(s->f->j, op->seq, (uint64_t)a.st_ino);
	if (rc)
		*fault = F_JOURNAL;
	return rc;
}

static int replay_rename(struct stream *s, const struct jnl_op *op,
			 enum fault *fault)
{
	unsigned int flags = 0;
	struct stat st;
	bool done;
	int rc;

	if (op->flags & RENAME_NOREPLACE)
		flags |= RMT_RENAME_NOREPLACE;
	if (op->flags & RENAME_EXCHANGE) {
		flags |= RMT_RENAME_EXCHANGE;
		rc = exchange_prepare(s, op, &done, fault);
		if (rc || done)
			return rc;
	}
	rc = rmt_rename(s->r, s->path, s->path2, flags);
	/* done before a crash: the source is gone, the target is there */
	if (rc == -ENOENT && !(flags & RMT_RENAME_EXCHANGE) &&
	    !rmt_stat(s->r, s->path2, &st))
		rc = 0;
	if (rc == -EEXIST && (flags & RMT_RENAME_NOREPLACE) &&
	    rmt_stat(s->r, s->path, &st) == -ENOENT)
		rc = 0;
	return rc;
}

/* SETATTR or FINISH of node @n at its rpath. */
static int replay_attrs(struct stream *s, const struct jnl_op *op,
			const struct jnl_node *n, enum fault *fault)
{
	struct jnl_flusher *f = s->f;
	unsigned int set = 0;
	struct rmt_setattr sa;
	struct jnl_node now;
	bool cut;
	int rc;

	if (op->type == JNL_OP_FINISH) {
		if (!S_ISREG(n->mode))
			return 0;
		set = RMT_SET_SIZE | RMT_SET_MODE | RMT_SET_ATIME |
		      RMT_SET_MTIME | owner_bits(s);
	} else {
		set |= (op->flags & JNL_SET_MODE) ? RMT_SET_MODE : 0;
		set |= (op->flags & JNL_SET_UID) ? RMT_SET_UID : 0;
		set |= (op->flags & JNL_SET_GID) ? RMT_SET_GID : 0;
		set |= (op->flags & JNL_SET_SIZE) ? RMT_SET_SIZE : 0;
		set |= (op->flags & JNL_SET_ATIME) ? RMT_SET_ATIME : 0;
		set |= (op->flags & JNL_SET_MTIME) ? RMT_SET_MTIME : 0;
		if (S_ISLNK(n->mode))
			set &= ~(unsigned int)RMT_SET_MODE;
		/* a truncate moves the remote mtime, and no FINISH may
		 * follow: one that drops every chunk not flushed leaves
		 * nothing to finish, so it also sets what a SETATTR left
		 * to that FINISH (below) */
		if ((set & RMT_SET_SIZE) && S_ISREG(n->mode))
			set |= RMT_SET_ATIME | RMT_SET_MTIME | RMT_SET_MODE |
			       owner_bits(s);
	}
	/* the share's owner was given at the create; a file the share had
	 * keeps its own (an application's chown there is to the login's
	 * owner, which the share makes a no-op: fs/wb.c refuses others) */
	if (agent_gives_owner(s))
		set &= ~(unsigned int)(RMT_SET_UID | RMT_SET_GID);
	/* a file with data not flushed yet: its FINISH follows its last
	 * chunk (journal.c invariant 13) and sets every attribute but the
	 * size, as the node has them then; a SETATTR without a size is
	 * left to it (cp -p, tar and rsync set times, mode and owner of
	 * each file they write: a remote call or three each, for nothing) */
	if (op->type == JNL_OP_SETATTR && !(set & RMT_SET_SIZE) &&
	    (n->flags & JNL_NODE_DATA))
		return 0;
	if (!set)
		return 0;
	if (S_ISREG(n->mode) && (set & (RMT_SET_SIZE | RMT_SET_MTIME))) {
		rc = conflict_check(s, n->id, NULL, op->seq, fault);
		if (rc)
			return rc;
	}
	rc = jnl_node_rpath(f->j, n->id, s->path, sizeof(s->path));
	if (rc == -ENOENT && (n->flags & JNL_NODE_UNLINKED))
		return 0; /* gone here and there: nothing to apply */
	if (rc) {
		*fault = F_JOURNAL;
		return rc;
	}
	if (set & RMT_SET_SIZE) {
		rc = gate(s, n->id);
		if (rc) {
			*fault = F_STOP;
			return rc;
		}
		/* the size now: it covers every chunk written before */
		rc = jnl_node_get(f->j, n->id, &now);
		if (rc) {
			ungate(s);
			*fault = F_JOURNAL;
			return rc;
		}
		n = &now;
		if (op->type == JNL_OP_FINISH && (n->flags & JNL_NODE_DATA)) {
			/* written again since: that data's own FINISH
			 * follows its last chunk (journal.c invariant 13),
			 * and this one's size, set now, would put the new
			 * holes below the remote's end, where the chunks
			 * write their zeros (write_sparse()) */
			ungate(s);
			return 0;
		}
	}
	if (op->type == JNL_OP_FINISH)
		handle_drop(s, n->id); /* nothing touches it after the times */
	cut = (set & RMT_SET_SIZE) && S_ISREG(n->mode) &&
	      (n->flags & JNL_NODE_CUT);
	rc = 0;
	if (cut && n->remote_cut < n->size) { /* at the size: one call */
		/* shrunk here: the share's bytes past the shrink (its own,
		 * or chunks flushed before) go before the size is set, or
		 * a later grow would show them where the mount has zeros
		 * (journal.c invariant 19); again after a crash: the same */
		memset(&sa, 0, sizeof(sa));
		sa.set = RMT_SET_SIZE;
		sa.size = (off_t)n->remote_cut;
		rc = rmt_setattr(s->r, s->path, NULL, &sa);
	}
	sa = attrs_of(s, n, set);
	if (!rc)
		rc = rmt_setattr(s->r, s->path, NULL, &sa);
	if (!rc && S_ISREG(n->mode) && (set & RMT_SET_SIZE)) {
		/* FINISH, or a truncate (which sets the times too): the
		 * remote has the node's size and mtime, the new base, taken
		 * while no chunk of it is written (journal.c C2); in a batch,
		 * only once the batch has succeeded (replay_batch_part()) */
		if (s->batching) {
			s->batch_base[s->batch_at].owed = true;
			s->batch_base[s->batch_at].id = n->id;
			s->batch_base[s->batch_at].size = n->size;
			s->batch_base[s->batch_at].mtime = n->mtime;
			s->batch_base[s->batch_at].cut = cut;
			s->batch_base[s->batch_at].rcut = n->remote_cut;
		} else {
			rc = jnl_node_send_done(f->j, n->id, n->size,
						&n->mtime,
						cut ? &n->remote_cut : NULL);
			if (rc)
				*fault = F_JOURNAL;
		}
	}
	if (set & RMT_SET_SIZE)
		ungate(s);
	return rc;
}

struct names {
	char buf[256];
	int n;
};

static int name_add(const char *name, const struct stat *st, void *arg)
{
	struct names *nm = arg;
	size_t l = strlen(nm->buf);

	(void)st;
	if (nm->n++ < 5)
		snprintf(nm->buf + l, sizeof(nm->buf) - l, "%s'%s'",
			 l ? ", " : "", name);
	return 0;
}

/* An rmdir the remote refused with ENOTEMPTY: say what is in it. */
static void log_remote_names(struct stream *s)
{
	struct names nm = { .buf = "" };
	int rc = rmt_readdir(s->r, s->path, name_add, &nm);

	if (rc)
		LOG_ERR("'%s' on the remote: cannot list it: %s", s->path,
			strerror(-rc));
	else
		LOG_ERR("'%s' on the remote holds %d name%s: %s%s", s->path,
			nm.n, nm.n == 1 ? "" : "s", nm.buf,
			nm.n > 5 ? ", ..." : "");
}

/* Sleep @ms, less if the flusher stops; false if it does. */
static bool nap(struct stream *s, int64_t ms)
{
	struct jnl_flusher *f = s->f;
	bool go;

	pthread_mutex_lock(&f->lock);
	go = sleep_until(f, jnl_mono_ns() + ms * NS_PER_MS);
	pthread_mutex_unlock(&f->lock);
	return go;
}

/*
 * The rmdir of a directory the journal emptied. A server may answer
 * ENOTEMPTY for a while and list nothing: nfs-ganesha did so in CI, once,
 * while names in the directory were being removed on other connections
 * (the driver's own retries had passed). So while the listing is empty,
 * try again, waiting longer each time, up to RMDIR_SETTLE_MS in all; a
 * name in it is another client's (or ours, behind the server's back): the
 * server's answer stands.
 */
static int rmdir_settled(struct stream *s)
{
	int rc = rmt_rmdir(s->r, s->path);
	int64_t ms = 50, waited = 0;

	while (rc == -ENOTEMPTY && waited < RMDIR_SETTLE_MS) {
		struct names nm = { .buf = "" };

		if (rmt_readdir(s->r, s->path, name_add, &nm) || nm.n ||
		    !nap(s, ms))
			break;
		waited += ms;
		ms *= 2;
		rc = rmt_rmdir(s->r, s->path);
		if (rc != -ENOTEMPTY)
			LOG_INFO("rmdir '%s': the remote answered ENOTEMPTY "
				 "and listed nothing for %" PRId64 " ms",
				 s->path, waited);
	}
	return rc;
}

/* Carry @op out on the remote (journal.h, "Op replay"). */
static int replay_op(struct stream *s, const struct jnl_op *op,
		     enum fault *fault)
{
	struct jnl_flusher *f = s->f;
	struct jnl_node n;
	struct stat st, st2;
	int rc;

	*fault = F_JOURNAL;
	s->path[0] = s->path2[0] = 0;
	rc = jnl_node_get(f->j, op->id, &n);
	if (rc)
		return rc;
	switch (op->type) {
	case JNL_OP_MKDIR:
	case JNL_OP_CREATE:
	case JNL_OP_SYMLINK:
	case JNL_OP_LINK:
	case JNL_OP_UNLINK:
	case JNL_OP_RMDIR:
	case JNL_OP_RENAME:
		rc = child_path(f->j, op->parent, op->name, s->path,
				sizeof(s->path));
		if (!rc && op->type == JNL_OP_RENAME)
			rc = child_path(f->j, op->newparent, op->newname,
					s->path2, sizeof(s->path2));
		if (!rc && op->type == JNL_OP_LINK)
			rc = jnl_node_rpath(f->j, op->id, s->path2,
					    sizeof(s->path2));
		if (rc)
			return rc;
		break;
	case JNL_OP_SETATTR:
	case JNL_OP_FINISH:
		break;
	}
	*fault = F_REMOTE;
	switch (op->type) {
	case JNL_OP_MKDIR:
		rc = rmt_mkdir(s->r, s->path, n.mode & 07777);
		if (rc == -EEXIST && !rmt_stat(s->r, s->path, &st) &&
		    S_ISDIR(st.st_mode))
			rc = 0;
		if (!rc) { /* mkdir's mode went through the umask; the
			    * times are the application's */
			struct rmt_setattr sa = attrs_of(
				s, &n, RMT_SET_MODE | RMT_SET_ATIME |
					    RMT_SET_MTIME | owner_bits(s));

			rc = rmt_setattr(s->r, s->path, NULL, &sa);
		}
		return rc;
	case JNL_OP_CREATE:
		return replay_create(s, &n);
	case JNL_OP_SYMLINK:
		return replay_symlink(s, &n, fault);
	case JNL_OP_LINK:
		/* path2 is the existing name, path the new one */
		rc = rmt_link(s->r, s->path2, s->path);
		if (rc == -EEXIST && !rmt_stat(s->r, s->path, &st) &&
		    !rmt_stat(s->r, s->path2, &st2) && st.st_ino == st2.st_ino &&
		    st.st_dev == st2.st_dev)
			rc = 0;
		return rc;
	case JNL_OP_UNLINK:
		rc = rmt_unlink(s->r, s->path);
		return rc == -ENOENT ? 0 : rc;
	case JNL_OP_RMDIR:
		rc = rmdir_settled(s);
		return rc == -ENOENT ? 0 : rc;
	case JNL_OP_RENAME:
		return replay_rename(s, op, fault);
	case JNL_OP_SETATTR:
	case JNL_OP_FINISH:
		return replay_attrs(s, op, &n, fault);
	}
	*fault = F_JOURNAL;
	return -EINVAL;
}

static bool moves_names(enum jnl_op_type t)
{
	return t == JNL_OP_UNLINK || t == JNL_OP_RMDIR || t == JNL_OP_RENAME;
}

/* End op @op after its replay and ack gave @rc (invariant 6). */
static void replay_done(struct stream *s, const struct jnl_op *op, int rc,
			enum fault fault)
{
	struct jnl_flusher *f = s->f;
	bool misses;
	int rc2;

	if (!rc) {
		pthread_mutex_lock(&f->lock);
		s->st.ops++;
		pthread_mutex_unlock(&f->lock);
		backoff_reset(s);
		rc2 = jnl_node_clean(f->j, op->id);
		if (rc2 == -EIO)
			journal_failed(s, rc2);
		else if (rc2 && rc2 != -EBUSY)
			LOG_WARN("cannot clean node %" PRIu64 " of the "
				 "journal: %s", op->id, strerror(-rc2));
		return;
	}
	if (fault == F_JOURNAL && rc == -EIO) {
		journal_failed(s, rc);
		return;
	}
	if (fault == F_STOP || fault == F_GONE) {
		/* F_GONE: a conflict took the node's ops (journal.c C3); if
		 * the op is still there it is pending again */
		jnl_op_fail(f->j, op->seq, false);
		if (fault == F_GONE) {
			pthread_mutex_lock(&f->lock);
			f->work_gen++;
			pthread_mutex_unlock(&f->lock);
		}
		return;
	}
	misses = fault == F_REMOTE && agent_misses_case(s, rc);
	if ((fault == F_REMOTE && permanent(rc) && !misses) ||
	    (fault == F_JOURNAL && rc != -ENOSPC && rc != -ENOMEM)) {
		/* the remote refuses it, or it cannot be placed there (its
		 * parent is not on the remote): drop it, say so once */
		LOG_ERR("cannot %s '%s'%s%s on the remote, giving it up "
			"(node %" PRIu64 " marked in error): %s",
			op_name(op->type), s->path[0] ? s->path : op->name,
			s->path2[0] ? " -> " : "", s->path2, op->id,
			strerror(-rc));
		if (op->type == JNL_OP_RMDIR && rc == -ENOTEMPTY)
			log_remote_names(s);
		rc2 = jnl_op_fail(f->j, op->seq, true);
		if (rc2 == -EIO)
			journal_failed(s, rc2);
		pthread_mutex_lock(&f->lock);
		f->failed_ops++;
		f->work_gen++; /* what waited for it may go now */
		pthread_mutex_unlock(&f->lock);
		count_error(s, rc, false);
		return;
	}
	rc2 = jnl_op_fail(f->j, op->seq, false);
	if (rc2 == -EIO)
		journal_failed(s, rc2);
	pthread_mutex_lock(&f->lock);
	f->work_gen++; /* pending again: another stream may take it */
	pthread_mutex_unlock(&f->lock);
	if (misses)
		return; /* to the share, at once */
	count_error(s, rc, true);
	backoff(s, rc, op_name(op->type));
}

/* Replay one op and end it (invariant 6). */
static void replay(struct stream *s, const struct jnl_op *op)
{
	struct jnl_flusher *f = s->f;
	bool ns = moves_names(op->type);
	enum fault fault;
	int rc;

	pthread_mutex_lock(&f->lock);
	set_state(s, JNL_STREAM_FLUSHING);
	pthread_mutex_unlock(&f->lock);
	if (ns)
		ns_enter(f);
	rc = replay_op(s, op, &fault);
	if (!rc) {
		CRASH_POINT("op_before_ack"); /* on the remote, not acked */
		rc = jnl_op_ack(f->j, op->seq);
		fault = F_JOURNAL;
	}
	if (ns)
		ns_leave(f);
	replay_done(s, op, rc, fault);
}

/*
 * Replay @n ops (all handed out together: independent of each other) in
 * one batch of the remote (RMT_CAP_BATCH): each op's calls are a group,
 * queued by the same replay_op() as one by one. The ops whose group came
 * back 0 are acked; every other one (its replay_op() needed an answer, a
 * call failed, or the batch did) is replayed again alone, which is safe
 * since replays are idempotent, and gives each error its usual handling.
 * Size gates taken for the batch are held until it came back. A batch
 * holds either the write side of the rename epoch (UNLINK, RMDIR, RENAME:
 * @ns) or size gates, never both: a writer waiting for the epoch in
 * handle_get() holds a node gate() would wait for.
 */
static void replay_batch_part(struct stream *s, struct jnl_op *ops, int n,
			      bool ns);

static void replay_batch(struct stream *s, struct jnl_op *ops, int n)
{
	struct jnl_op *moving = malloc((size_t)n * sizeof(*moving));
	int m = 0, k = 0;

	if (!moving) {
		for (int i = 0; i < n; i++)
			replay(s, &ops[i]);
		return;
	}
	for (int i = 0; i < n; i++) {
		if (moves_names(ops[i].type))
			moving[m++] = ops[i];
		else
			ops[k++] = ops[i];
	}
	if (m == 1)
		replay(s, &moving[0]);
	else if (m)
		replay_batch_part(s, moving, m, true);
	if (k == 1)
		replay(s, &ops[0]);
	else if (k)
		replay_batch_part(s, ops, k, false);
	free(moving);
}

static void replay_batch_part(struct stream *s, struct jnl_op *ops, int n,
			      bool ns)
{
	struct jnl_flusher *f = s->f;
	int rc[OPQ_BATCH], grc[OPQ_BATCH], groups;
	enum fault fault[OPQ_BATCH];
	bool redo[OPQ_BATCH];

	pthread_mutex_lock(&f->lock);
	set_state(s, JNL_STREAM_FLUSHING);
	pthread_mutex_unlock(&f->lock);
	if (ns)
		ns_enter(f);
	groups = rmt_batch_begin(s->r);
	if (!groups) {
		s->batching = true;
		for (int i = 0; i < n; i++) {
			s->batch_at = i;
			s->batch_base[i].owed = false;
			rmt_batch_mark(s->r);
			rc[i] = replay_op(s, &ops[i], &fault[i]);
		}
		groups = rmt_batch_end(s->r, grc, (unsigned int)n);
		s->batching = false;
		for (int i = 0; i < n; i++) {
			if (!s->batch_base[i].owed || groups != n || rc[i] ||
			    grc[i])
				continue; /* a redo records it */
			rc[i] = jnl_node_send_done(
				f->j, s->batch_base[i].id,
				s->batch_base[i].size, &s->batch_base[i].mtime,
				s->batch_base[i].cut ? &s->batch_base[i].rcut
						     : NULL);
			if (rc[i])
				fault[i] = F_JOURNAL;
		}
		ungate(s);
	}
	for (int i = 0; i < n; i++) {
		redo[i] = groups != n || rc[i] || grc[i];
		if (!redo[i]) {
			CRASH_POINT("op_before_ack");
			rc[i] = jnl_op_ack(f->j, ops[i].seq);
			fault[i] = F_JOURNAL;
		}
	}
	if (ns)
		ns_leave(f);
	for (int i = 0; i < n; i++) {
		if (redo[i])
			replay(s, &ops[i]);
		else
			replay_done(s, &ops[i], rc[i], fault[i]);
	}
}

/* The next op of the shared queue, refilling it when empty. */
static bool take_op(struct stream *s, struct jnl_op *out)
{
	struct jnl_flusher *f = s->f;
	struct jnl_op *batch;
	uint64_t gen;
	int n;

	pthread_mutex_lock(&f->lock);
	if (f->qlen) {
		*out = f->q[f->qhead];
		f->qhead = (f->qhead + 1) % OPQ_BATCH;
		f->qlen--;
		pthread_mutex_unlock(&f->lock);
		return true;
	}
	if (f->qfill || f->qgen == f->work_gen || f->stop) {
		pthread_mutex_unlock(&f->lock);
		return false;
	}
	f->qfill = true;
	gen = f->work_gen;
	pthread_mutex_unlock(&f->lock);

	batch = malloc(OPQ_BATCH * sizeof(*batch));
	n = batch ? jnl_ops_ready(f->j, batch, OPQ_BATCH) : -ENOMEM;
	if (n == -EIO)
		journal_failed(s, n);
	else if (n < 0)
		LOG_ERR("flush stream %u: cannot read the op log: %s", s->no,
			strerror(-n));

	pthread_mutex_lock(&f->lock);
	f->qfill = false;
	if (n <= 0) {
		f->qgen = gen; /* nothing until the journal commits again */
		pthread_mutex_unlock(&f->lock);
		free(batch);
		return false;
	}
	f->qgen = UINT64_MAX;
	*out = batch[0];
	for (int i = 1; i < n; i++) {
		f->q[(f->qhead + f->qlen) % OPQ_BATCH] = batch[i];
		f->qlen++;
	}
	pthread_cond_broadcast(&f->wake); /* others may take the rest */
	pthread_mutex_unlock(&f->lock);
	free(batch);
	return true;
}

/* More ops from the shared queue, without refilling it: up to @max. */
static int take_more(struct stream *s, struct jnl_op *out, int max)
{
	struct jnl_flusher *f = s->f;
	int n = 0;

	pthread_mutex_lock(&f->lock);
	for (; n < max && f->qlen; n++) {
		out[n] = f->q[f->qhead];
		f->qhead = (f->qhead + 1) % OPQ_BATCH;
		f->qlen--;
	}
	pthread_mutex_unlock(&f->lock);
	return n;
}

/* --- the stream ------------------------------------------------------------------------ */

enum next { N_WORK, N_STOP };

/*
 * Between steps: stop, pause, backoff, kick. Returns N_STOP when the
 * stream must exit.
 */
static enum next between(struct stream *s)
{
	struct jnl_flusher *f = s->f;

	pthread_mutex_lock(&f->lock);
	for (;;) {
		int64_t now = jnl_mono_ns();

		if (f->stop || f->failed)
			break;
		if (f->kick_gen != s->kick_seen) {
			s->kick_seen = f->kick_gen;
			s->backoff_until = 0;
			for (int i = 0; i < s->npark; i++)
				s->park[i].retry_at = 0;
		}
		if (f->paused) {
			if (s->nclaim || s->npark) {
				pthread_mutex_unlock(&f->lock);
				put_back_all(s);
				pthread_mutex_lock(&f->lock);
				continue;
			}
			set_state(s, JNL_STREAM_PAUSED);
			pthread_cond_broadcast(&f->done);
			pthread_cond_wait(&f->wake, &f->lock);
			continue;
		}
		if (s->backoff_until > now) {
			set_state(s, JNL_STREAM_BACKOFF);
			wait_until(f, &f->wake, s->backoff_until);
			continue;
		}
		if (s->st.state == JNL_STREAM_PAUSED ||
		    s->st.state == JNL_STREAM_BACKOFF)
			set_state(s, JNL_STREAM_IDLE);
		pthread_mutex_unlock(&f->lock);
		return N_WORK;
	}
	pthread_mutex_unlock(&f->lock);
	return N_STOP;
}

/* Nothing to do: sleep until work is committed, a kick, a parked chunk's
 * time or the poll. @gen is work_gen from before the search. */
static void idle(struct stream *s, uint64_t gen)
{
	struct jnl_flusher *f = s->f;
	int64_t until = jnl_mono_ns() + POLL_NS;

	for (int i = 0; i < s->npark; i++)
		if (s->park[i].retry_at < until)
			until = s->park[i].retry_at;
	handles_close_all(s);
	jnl_hungry(f->j);
	pthread_mutex_lock(&f->lock);
	/* qlen: another stream's refill may have queued ops since ours */
	if (f->work_gen == gen && !f->qlen && !f->stop && !f->paused &&
	    !f->failed && f->kick_gen == s->kick_seen) {
		set_state(s, JNL_STREAM_IDLE);
		pthread_cond_broadcast(&f->done);
		wait_until(f, &f->wake, until);
		if (f->work_gen == gen &&
		    jnl_mono_ns() - f->last_poll >= POLL_NS) {
			f->last_poll = jnl_mono_ns();
			f->work_gen++; /* the fallback: look again */
		}
	}
	pthread_mutex_unlock(&f->lock);
}

/* Are there chunks to claim? A read transaction, so that idle streams
 * woken by every commit do not queue for LMDB's writer lock. */
static int queued(struct stream *s)
{
	struct jnl_stats st;
	int rc = jnl_stats(s->f->j, &st);

	return rc ? rc : st.queued_chunks > 0;
}

static void *stream_main(void *arg)
{
	struct stream *s = arg;
	struct jnl_flusher *f = s->f;
	uint64_t budget = f->chunk_size;
	struct jnl_chunk_ref c;
	struct jnl_op ops[OPQ_BATCH];
	uint64_t gen;
	int n;

	prep_start(s);
	while (between(s) == N_WORK) {
		if (s->next >= s->nclaim)
			agent_try(s);
		if (s->next < s->nclaim) {
			if ((rmt_caps(s->r) & RMT_CAP_PUT) &&
			    !(f->flags & JNL_FLUSH_VERIFY))
				send_put(s);
			else
				send_chunk(s, &s->claim[s->next++]);
			continue;
		}
		s->next = s->nclaim = 0;
		pthread_mutex_lock(&f->lock);
		gen = f->work_gen;
		pthread_mutex_unlock(&f->lock);
		if (take_op(s, &ops[0])) {
			n = 1;
			if (rmt_caps(s->r) & RMT_CAP_BATCH)
				n += take_more(s, ops + 1, OPQ_BATCH - 1);
			if (n > 1)
				replay_batch(s, ops, n);
			else
				replay(s, &ops[0]);
			continue;
		}
		n = queued(s);
		if (n > 0)
			n = jnl_chunk_claim_upto(f->j, s->claim, CLAIM_MAX,
						 budget);
		if (n > 0) {
			s->nclaim = n;
			continue;
		}
		if (n == -EIO) {
			journal_failed(s, n);
			continue;
		}
		if (n < 0) {
			count_error(s, n, false);
			backoff(s, n, "claiming chunks");
			continue;
		}
		if (unpark_one(s, &c)) {
			send_chunk(s, &c);
			continue;
		}
		idle(s, gen);
	}
	put_back_all(s);
	prep_stop(s);
	handles_close_all(s);
	pthread_mutex_lock(&f->lock);
	set_state(s, JNL_STREAM_STOPPED);
	pthread_cond_broadcast(&f->done);
	pthread_mutex_unlock(&f->lock);
	return NULL;
}

/* --- the public side ------------------------------------------------------------------- */

static void flusher_free(struct jnl_flusher *f)
{
	if (!f)
		return;
	for (unsigned int i = 0; f->s && i < f->nstreams; i++) {
		rmt_close(f->s[i].share);
		rmt_close(f->s[i].agent);
		free(f->s[i].buf);
		free(f->s[i].pre.buf);
		free(f->s[i].pbuf);
		free(f->s[i].vbuf);
	}
	free(f->s);
	free(f->q);
	pthread_cond_destroy(&f->done);
	pthread_cond_destroy(&f->wake);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

/* Stop and join the started streams (no hook may run any more). */
static void streams_join(struct jnl_flusher *f)
{
	pthread_mutex_lock(&f->lock);
	f->stop = true;
	pthread_cond_broadcast(&f->wake);
	pthread_cond_broadcast(&f->done);
	pthread_mutex_unlock(&f->lock);
	for (unsigned int i = 0; i < f->nstreams; i++)
		if (f->s[i].started)
			pthread_join(f->s[i].thread, NULL);
}

int jnl_flusher_start(struct jnl *j, const struct jnl_flush_config *cfg,
		      struct jnl_flusher **out)
{
	struct jnl_flusher *f;
	pthread_condattr_t ca;
	char *stream_opts = NULL;
	int rc = 0;

	*out = NULL;
	if (!j || !cfg || !cfg->remote_spec ||
	    cfg->streams > JNL_FLUSH_STREAMS_MAX ||
	    (cfg->flags & ~(unsigned int)(JNL_FLUSH_NO_FSYNC |
					  JNL_FLUSH_VERIFY)))
		return -EINVAL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->j = j;
	f->nstreams = cfg->streams ? cfg->streams : JNL_FLUSH_STREAMS_DEFAULT;
	f->chunk_size = jnl_chunk_size(j);
	f->bwlimit = cfg->bwlimit;
	f->flags = cfg->flags;
	f->backoff_max_ms = cfg->backoff_max_ms ? cfg->backoff_max_ms :
						  BACKOFF_MAX_MS;
	if (f->backoff_max_ms < BACKOFF_MIN_MS)
		f->backoff_max_ms = BACKOFF_MIN_MS;
	f->root = geteuid() == 0;
	f->qgen = UINT64_MAX;
	f->last_poll = jnl_mono_ns();
	pthread_mutex_init(&f->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->wake, &ca);
	pthread_cond_init(&f->done, &ca);
	pthread_condattr_destroy(&ca);
	f->s = calloc(f->nstreams, sizeof(*f->s));
	f->q = malloc(OPQ_BATCH * sizeof(*f->q));
	if (!f->s || !f->q) {
		flusher_free(f);
		return -ENOMEM;
	}
	if (rmt_opts_one_connection(cfg->remote_opts, &stream_opts)) {
		flusher_free(f);
		return -ENOMEM;
	}
	for (unsigned int i = 0; i < f->nstreams && !rc; i++) {
		struct stream *s = &f->s[i];

		s->f = f;
		s->no = i;
		s->t0 = jnl_mono_ns();
		s->buf = malloc(f->chunk_size);
		s->pre.buf = malloc(f->chunk_size);
		s->pbuf = malloc((size_t)CLAIM_MAX * PATH_MAX);
		if (f->flags & JNL_FLUSH_VERIFY)
			s->vbuf = malloc(f->chunk_size);
		if (!s->buf || !s->pre.buf || !s->pbuf ||
		    ((f->flags & JNL_FLUSH_VERIFY) && !s->vbuf)) {
			rc = -ENOMEM;
			break;
		}
		/* a stream is one connection: no pool of them per stream */
		rc = rmt_open(cfg->remote_spec, stream_opts, &s->share);
		if (rc) {
			LOG_ERR("cannot open remote '%s' for flushing: %s",
				cfg->remote_spec, strerror(-rc));
			break;
		}
		s->r = s->share;
		if (strcmp(rmt_id(s->r), jnl_remote_id(j))) {
			LOG_ERR("cannot flush journal of '%s' to '%s': another "
				"share", jnl_remote_id(j), rmt_id(s->r));
			rc = -EXDEV;
			break;
		}
		if (cfg->agent_spec) {
			rc = rmt_open(cfg->agent_spec, cfg->agent_opts,
				      &s->agent);
			if (rc) {
				LOG_ERR("cannot use agent '%s': %s",
					cfg->agent_spec, strerror(-rc));
				break;
			}
			agent_try(s);
			if (s->r != s->agent && !i)
				LOG_WARN("agent '%s' does not answer: flushing "
					 "through the share until it does",
					 cfg->agent_spec);
		}
	}
	free(stream_opts);
	if (!rc)
		rc = jnl_notify_set(j, on_work, f);
	if (rc) {
		flusher_free(f);
		return rc;
	}
	for (unsigned int i = 0; i < f->nstreams && !rc; i++) {
		rc = -pthread_create(&f->s[i].thread, NULL, stream_main,
				     &f->s[i]);
		f->s[i].started = !rc;
	}
	if (rc) {
		streams_join(f);
		jnl_notify_set(j, NULL, NULL);
		flusher_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

void jnl_flusher_stop(struct jnl_flusher *f)
{
	if (!f)
		return;
	streams_join(f);
	jnl_notify_set(f->j, NULL, NULL);
	/* invariant 6: what is still queued is pending again */
	for (; f->qlen; f->qlen--, f->qhead = (f->qhead + 1) % OPQ_BATCH)
		jnl_op_fail(f->j, f->q[f->qhead].seq, false);
	flusher_free(f);
}

void jnl_flusher_pause(struct jnl_flusher *f)
{
	pthread_mutex_lock(&f->lock);
	f->paused = true;
	pthread_cond_broadcast(&f->wake);
	pthread_mutex_unlock(&f->lock);
}

void jnl_flusher_resume(struct jnl_flusher *f)
{
	pthread_mutex_lock(&f->lock);
	f->paused = false;
	f->work_gen++;
	pthread_cond_broadcast(&f->wake);
	pthread_mutex_unlock(&f->lock);
}

void jnl_flusher_kick(struct jnl_flusher *f)
{
	pthread_mutex_lock(&f->lock);
	f->work_gen++;
	f->kick_gen++;
	pthread_cond_broadcast(&f->wake);
	pthread_mutex_unlock(&f->lock);
}

int jnl_flusher_wait(struct jnl_flusher *f, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? INT64_MAX :
			   jnl_mono_ns() + (int64_t)timeout_ms * NS_PER_MS;

	for (;;) {
		struct jnl_stats st;
		int64_t now, until;
		int rc;

		pthread_mutex_lock(&f->lock);
		rc = f->failed;
		pthread_mutex_unlock(&f->lock);
		if (rc)
			return rc;
		rc = jnl_stats(f->j, &st);
		if (rc)
			return rc;
		if (!st.queued_chunks && !st.inflight_chunks &&
		    !st.pending_ops && !st.uncommitted)
			return 0;
		now = jnl_mono_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		until = now + 50 * NS_PER_MS; /* commits do not signal done */
		if (until > deadline)
			until = deadline;
		pthread_mutex_lock(&f->lock);
		wait_until(f, &f->done, until);
		pthread_mutex_unlock(&f->lock);
	}
}

int jnl_flusher_stats(struct jnl_flusher *f, struct jnl_flush_stats *out)
{
	int64_t now = jnl_mono_ns();

	memset(out, 0, sizeof(*out));
	out->streams = f->nstreams;
	pthread_mutex_lock(&f->lock);
	out->paused = f->paused;
	out->failed = f->failed;
	out->failed_ops = f->failed_ops;
	for (unsigned int i = 0; i < f->nstreams; i++) {
		struct stream *s = &f->s[i];
		struct jnl_stream_stats *o = &out->stream[i];

		*o = s->st;
		o->rate_bps = rate_get(s, now);
		o->via_agent = s->via_agent;
		out->parked += s->parked;
	}
	pthread_mutex_unlock(&f->lock);
	for (unsigned int i = 0; i < f->nstreams; i++) {
		struct jnl_stream_stats *o = &out->stream[i];
		struct rmt_counters c, ca = { 0 };

		/* both connections: what went through either counts */
		rmt_counters(f->s[i].share, &c);
		if (f->s[i].agent)
			rmt_counters(f->s[i].agent, &ca);
		o->remote_bytes_written = c.bytes_written + ca.bytes_written;
		o->remote_bytes_read = c.bytes_read + ca.bytes_read;
		o->remote_ops = c.ops + ca.ops;
		o->remote_faults = c.faults + ca.faults;
		out->bytes += o->bytes;
		out->chunks += o->chunks;
		out->ops += o->ops;
		out->errors += o->errors;
		out->retries += o->retries;
		out->rate_bps += o->rate_bps;
		out->remote_bytes_written += o->remote_bytes_written;
	}
	return 0;
}

