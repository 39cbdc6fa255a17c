/*
 * readahead.c - the read-ahead engine: fetch threads ("streams") that
 * read blocks of remote files ahead of a sequential reader and put them in
 * the block cache. The contract is cache.h ("read-ahead").
 *
 * Callers: fs/ calls cache_ra_note() after each read of a clean file and
 * cache_ra_wait() before fetching a block itself that may be in flight.
 *
 * Each stream has its own struct rmt (rmt_open(spec, opts)), so a
 * remote_stream_rate throttle applies per stream and a driver that is one
 * connection per thread gets one each. A stream keeps the files it reads
 * open, keyed by path (STREAM_FILES of them, least recently used closed
 * first; closed after IDLE_MS without use), and checks at open that the
 * remote file still is the version of the job (size and mtime, ctime when
 * the key has one): bytes of another version are never put under a key.
 *
 * JOB STATES (all under ra->lock)
 *
 *            cache_ra_note(): not cached, not queued, not in flight
 *   (none) ----------------------------------------------> QUEUED
 *                                                            |
 *                      stream_main(): popped, oldest first   v
 *                                                        INFLIGHT
 *      stream_main(): put in the cache, or dropped on an    |
 *      error (counted); ra->done broadcast                  v
 *                                                         (none)
 *   cache_ra_stop() frees QUEUED jobs and waits for INFLIGHT ones.
 *
 * A block is QUEUED or INFLIGHT at most once (job_find() before queueing):
 * it is never fetched twice at the same time, and cache_ra_wait() waits
 * for exactly the one fetch.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cache_i.h"
#include "log.h"
#include "remote.h"

#define STREAM_FILES 8
#define IDLE_MS 2000
#define QUEUE_MAX 4096
#define NEAR_READS 4 /* a reader not yet sequential: how far out of order */

struct ra_job {
	struct ra_job *next;
	struct cache_key k;
	uint64_t index;
	char path[]; /* NUL-terminated */
};

struct ra_open {
	char *path; /* NULL: unused entry */
	struct rmt_file *f;
	struct stat st;   /* at open */
	uint64_t used_ms; /* last use */
};

struct ra_stream {
	struct cache_ra *ra;
	pthread_t th;
	struct rmt *r;
	struct ra_job *cur;  /* INFLIGHT job; protected by ra->lock */
	struct ra_open files[STREAM_FILES]; /* this thread's only */
	void *buf;           /* one block; this thread's only */
};

/* No cache or remote call is made under ra->lock. */
struct cache_ra {
	struct cache *c;
	unsigned int max_window;
	unsigned int nstreams;
	struct ra_stream *s;

	pthread_mutex_t lock;
	pthread_cond_t work;  /* a job was queued, or stop */
	pthread_cond_t done;  /* a fetch ended */
	struct ra_job *head, *tail; /* QUEUED; protected by lock */
	unsigned int queued, inflight; /* protected by lock */
	bool stop;                     /* protected by lock */
	uint64_t fetched_bytes, fetches, errors; /* protected by lock */
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static bool same_key(const struct cache_key *a, const struct cache_key *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
	       a->mtime.tv_sec == b->mtime.tv_sec &&
	       a->mtime.tv_nsec == b->mtime.tv_nsec &&
	       a->ctime.tv_sec == b->ctime.tv_sec &&
	       a->ctime.tv_nsec == b->ctime.tv_nsec;
}

/* Is block @index of @k QUEUED or INFLIGHT? Under ra->lock. */
static bool job_find(struct cache_ra *ra, const struct cache_key *k,
		     uint64_t index)
{
	for (struct ra_job *j = ra->head; j; j = j->next)
		if (j->index == index && same_key(&j->k, k))
			return true;
	for (unsigned int i = 0; i < ra->nstreams; i++) {
		struct ra_job *j = ra->s[i].cur;

		if (j && j->index == index && same_key(&j->k, k))
			return true;
	}
	return false;
}

/* --- streams ---------------------------------------------------------------- */

static void file_close(struct ra_open *o)
{
	rmt_file_close(o->f);
	free(o->path);
	memset(o, 0, sizeof(*o));
}

static bool st_matches(const struct stat *st, const struct cache_key *k)
{
	if ((uint64_t)st->st_size != k->size ||
	    st->st_mtim.tv_sec != k->mtime.tv_sec ||
	    st->st_mtim.tv_nsec != k->mtime.tv_nsec)
		return false;
	if (k->ctime.tv_sec || k->ctime.tv_nsec)
		return st->st_ctim.tv_sec == k->ctime.tv_sec &&
		       st->st_ctim.tv_nsec == k->ctime.tv_nsec;
	return true;
}

/* The stream's open file for the job, opened (again) if needed and
 * checked against the job's version. */
static int file_get(struct ra_stream *s, const struct ra_job *j,
		    struct ra_open **out)
{
	struct ra_open *o = NULL, *lru = &s->files[0];
	int rc;

	for (int i = 0; i < STREAM_FILES; i++) {
		struct ra_open *e = &s->files[i];

		if (e->path && !strcmp(e->path, j->path)) {
			o = e;
			break;
		}
		if (!e->path || (lru->path && e->used_ms < lru->used_ms))
			lru = e;
	}
	if (o && !st_matches(&o->st, &j->k))
		file_close(o); /* maybe replaced since: look again */
	else if (o)
		goto found;
	o = o ? o : lru;
	if (o->path)
		file_close(o);
	rc = rmt_file_open(s->r, j->path, O_RDONLY, 0, &o->f);
	if (rc)
		return rc;
	rc = rmt_file_stat(o->f, &o->st);
	if (rc || !(o->path = strdup(j->path))) {
		rmt_file_close(o->f);
		memset(o, 0, sizeof(*o));
		return rc ? rc : -ENOMEM;
	}
	if (!st_matches(&o->st, &j->k))
		return -ESTALE; /* kept open: the newer jobs want it */
found:
	o->used_ms = now_ms();
	*out = o;
	return 0;
}

static void files_close_idle(struct ra_stream *s, bool all)
{
	uint64_t now = now_ms();

	for (int i = 0; i < STREAM_FILES; i++)
		if (s->files[i].path &&
		    (all || now - s->files[i].used_ms >= IDLE_MS))
			file_close(&s->files[i]);
}

/* Fetch one block; returns its length or -errno. */
static ssize_t fetch(struct ra_stream *s, const struct ra_job *j)
{
	struct cache *c = s->ra->c;
	uint64_t bs = cache_block_size(c), start = j->index * bs;
	size_t len = (size_t)(j->k.size - start < bs ? j->k.size - start : bs);
	struct ra_open *o;
	ssize_t n;
	int rc, fd;

	if (cache_has(c, &j->k, j->index))
		return 0;
	rc = file_get(s, j, &o);
	if (rc)
		return rc;
	fd = rmt_file_fd(o->f);
	if (fd >= 0) {
		/* a kernel file (the path driver): spliced into the slab */
		rc = cache_put_fd(c, &j->k, j->index, fd, (off_t)start, len);
		if (rc != -EINVAL) {
			if (!rc)
				rmt_file_count_read(o->f, len);
			return rc ? rc : (ssize_t)len;
		}
	}
	n = rmt_file_pread(o->f, s->buf, len, (off_t)start);
	if (n < 0) {
		file_close(o);
		return n;
	}
	if ((size_t)n != len)
		return -ESTALE; /* shorter than the version says */
	rc = cache_put(c, &j->k, j->index, s->buf, len);
	return rc ? rc : (ssize_t)len;
}

static void *stream_main(void *arg)
{
	struct ra_stream *s = arg;
	struct cache_ra *ra = s->ra;

	pthread_mutex_lock(&ra->lock);
	for (;;) {
		struct ra_job *j;
		ssize_t n;

		while (!ra->stop && !ra->head) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			if (pthread_cond_timedwait(&ra->work, &ra->lock, &ts)) {
				pthread_mutex_unlock(&ra->lock);
				files_close_idle(s, false);
				pthread_mutex_lock(&ra->lock);
			}
		}
		if (ra->stop)
			break;
		j = ra->head;
		ra->head = j->next;
		if (!ra->head)
			ra->tail = NULL;
		ra->queued--;
		ra->inflight++;
		s->cur = j;
		pthread_mutex_unlock(&ra->lock);

		n = fetch(s, j);
		if (n < 0)
			LOG_DBG("read-ahead of '%s' block %" PRIu64 " failed: %s",
				j->path, j->index, strerror((int)-n));

		pthread_mutex_lock(&ra->lock);
		if (n < 0) {
			ra->errors++;
		} else if (n > 0) {
			ra->fetches++;
			ra->fetched_bytes += (uint64_t)n;
		}
		s->cur = NULL;
		ra->inflight--;
		pthread_cond_broadcast(&ra->done);
		free(j);
	}
	pthread_mutex_unlock(&ra->lock);
	files_close_idle(s, true);
	return NULL;
}

/* --- the engine ----------------------------------------------------------- */

void cache_ra_stop(struct cache_ra *ra)
{
	if (!ra)
		return;
	pthread_mutex_lock(&ra->lock);
	ra->stop = true;
	while (ra->head) {
		struct ra_job *j = ra->head;

		ra->head = j->next;
		free(j);
	}
	ra->tail = NULL;
	ra->queued = 0;
	pthread_cond_broadcast(&ra->work);
	pthread_mutex_unlock(&ra->lock);
	for (unsigned int i = 0; i < ra->nstreams; i++) {
		struct ra_stream *s = &ra->s[i];

		if (s->th)
			pthread_join(s->th, NULL);
		rmt_close(s->r);
		free(s->buf);
	}
	pthread_cond_destroy(&ra->done);
	pthread_cond_destroy(&ra->work);
	pthread_mutex_destroy(&ra->lock);
	free(ra->s);
	free(ra);
}

int cache_ra_start(struct cache *c, const struct cache_ra_config *cfg,
		   struct cache_ra **out)
{
	struct cache_ra *ra;
	char *opts = NULL;
	int rc = 0;

	*out = NULL;
	if (!c || !cfg || !cfg->remote_spec ||
	    cfg->streams > CACHE_RA_STREAMS_MAX)
		return -EINVAL;
	ra = calloc(1, sizeof(*ra));
	if (!ra)
		return -ENOMEM;
	ra->c = c;
	ra->nstreams = cfg->streams ? cfg->streams : CACHE_RA_STREAMS_DEFAULT;
	ra->max_window = cfg->max_window_blocks ? cfg->max_window_blocks :
						  CACHE_RA_WINDOW_DEFAULT;
	pthread_mutex_init(&ra->lock, NULL);
	pthread_cond_init(&ra->work, NULL);
	pthread_cond_init(&ra->done, NULL);
	ra->s = calloc(ra->nstreams, sizeof(*ra->s));
	if (!ra->s || rmt_opts_one_connection(cfg->remote_opts, &opts)) {
		ra->nstreams = 0;
		cache_ra_stop(ra);
		return -ENOMEM;
	}
	for (unsigned int i = 0; i < ra->nstreams && !rc; i++) {
		struct ra_stream *s = &ra->s[i];

		s->ra = ra;
		s->buf = malloc(cache_block_size(c));
		if (!s->buf) {
			rc = -ENOMEM;
			break;
		}
		/* a stream is one connection: no pool of them per stream */
		rc = rmt_open(cfg->remote_spec, opts, &s->r);
		if (rc) {
			LOG_ERR("read-ahead: cannot open remote '%s': %s",
				cfg->remote_spec, strerror(-rc));
			break;
		}
		rc = -pthread_create(&s->th, NULL, stream_main, s);
		if (rc) {
			s->th = 0;
			rc = -EAGAIN;
		}
	}
	free(opts);
	if (rc) {
		cache_ra_stop(ra);
		return rc;
	}
	*out = ra;
	return 0;
}

void cache_ra_file_init(struct cache_ra_file *f)
{
	memset(f, 0, sizeof(*f));
}

/* Queue block @index unless cached, queued or in flight (or the queue is
 * full). */
static void queue(struct cache_ra *ra, const char *path,
		  const struct cache_key *k, uint64_t index)
{
	size_t plen = strlen(path) + 1;
	struct ra_job *j;

	if (cache_has(ra->c, k, index))
		return;
	j = malloc(sizeof(*j) + plen);
	if (!j)
		return;
	j->next = NULL;
	j->k = *k;
	j->index = index;
	memcpy(j->path, path, plen);
	pthread_mutex_lock(&ra->lock);
	if (ra->stop || ra->queued >= QUEUE_MAX || job_find(ra, k, index)) {
		pthread_mutex_unlock(&ra->lock);
		free(j);
		return;
	}
	if (ra->tail)
		ra->tail->next = j;
	else
		ra->head = j;
	ra->tail = j;
	ra->queued++;
	pthread_cond_signal(&ra->work);
	pthread_mutex_unlock(&ra->lock);
}

void cache_ra_note(struct cache_ra *ra, struct cache_ra_file *f,
		   const char *path, const struct cache_key *k, off_t off,
		   size_t len)
{
	uint64_t bs = cache_block_size(ra->c), end, first, last, nblocks;
	uint64_t read_blocks, near;

	if (off < 0 || !len)
		return;
	end = (uint64_t)off + len;
	/* sequential: right after the previous read, or out of order by a
	 * few reads of its size; once a reader is sequential (window > 0),
	 * anywhere within a window of where it is. The kernel's own
	 * read-ahead sends several reads at once and our threads take them
	 * in any order, from the first one on. */
	near = f->window ? (uint64_t)f->window * bs : NEAR_READS * (uint64_t)len;
	if ((uint64_t)f->last_end != (uint64_t)off &&
	    ((uint64_t)off + near < (uint64_t)f->last_end ||
	     (uint64_t)off > (uint64_t)f->last_end + near)) {
		/* random: no window, nothing ahead */
		f->window = 0;
		f->next_index = 0;
		f->last_end = (off_t)end;
		return;
	}
	if (end > (uint64_t)f->last_end)
		f->last_end = (off_t)end;
	read_blocks = (len + bs - 1) / bs;
	f->window = f->window ? f->window * 2 : 1;
	if (f->window < read_blocks)
		f->window = (uint32_t)(read_blocks < ra->max_window ?
					       read_blocks : ra->max_window);
	if (f->window > ra->max_window)
		f->window = ra->max_window;
	nblocks = (k->size + bs - 1) / bs;
	/* ahead: the blocks after the last one the read touched (the
	 * reader fetches those itself) */
	first = (end + bs - 1) / bs;
	last = first + f->window; /* exclusive */
	if (first < f->next_index)
		first = f->next_index;
	if (last > nblocks)
		last = nblocks;
	for (uint64_t i = first; i < last; i++)
		queue(ra, path, k, i);
	if (last > f->next_index)
		f->next_index = last;
}

bool cache_ra_wait(struct cache_ra *ra, const struct cache_key *k,
		   uint64_t index, int timeout_ms)
{
	struct timespec dl;

	clock_gettime(CLOCK_REALTIME, &dl);
	if (timeout_ms >= 0) {
		dl.tv_sec += timeout_ms / 1000;
		dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (dl.tv_nsec >= 1000000000) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&ra->lock);
	while (job_find(ra, k, index)) {
		if (timeout_ms < 0)
			pthread_cond_wait(&ra->done, &ra->lock);
		else if (pthread_cond_timedwait(&ra->done, &ra->lock, &dl))
			break;
	}
	pthread_mutex_unlock(&ra->lock);
	return cache_has(ra->c, k, index);
}

void cache_ra_stats(struct cache_ra *ra, struct cache_ra_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&ra->lock);
	out->fetched_bytes = ra->fetched_bytes;
	out->fetches = ra->fetches;
	out->errors = ra->errors;
	out->queued = ra->queued;
	out->inflight = ra->inflight;
	pthread_mutex_unlock(&ra->lock);
}
