/*
 * throttle.c - the "throttle" driver: a SIMULATION AID, not a feature.
 *
 * It wraps another struct rmt (in practice the path driver over a local
 * directory) and makes it behave like a share behind a slow link, so the
 * gain of ferryfs's parallel streams can be measured, and the flusher's
 * error paths exercised, without a network or a NAS. rmt_open() wraps the
 * share when its option string has any of (remote.h):
 *
 *   remote_rate=RATE         one token bucket caps all data moved (read +
 *                            written + copied) at RATE: shared by every
 *                            thread AND every connection of this process to
 *                            the same share with the same RATE (struct
 *                            link), so the flusher's streams and the mount
 *                            share one simulated link, as on a real NAS
 *   remote_stream_rate=RATE  a bucket per stream caps each at RATE: the
 *                            single-stream wall of a NAS. A STREAM IS ONE
 *                            CALLING THREAD (thread-local state, see
 *                            stream_of()), not a struct rmt_file: the flusher
 *                            runs one stream per thread, and one thread
 *                            copying many small files is still one TCP flow
 *   remote_latency=DURATION  every operation first sleeps DURATION: a round
 *                            trip. Once per call, however large the call
 *   remote_fault=FILE        the fault switch: while FILE exists, every
 *                            operation fails with -EIO, or with the errno
 *                            named in it ("ENOSPC", "ETIMEDOUT", or a
 *                            number); an empty or unreadable file, or an
 *                            unknown name, means EIO
 *
 * The wrapper is what its share is: rmt_id() is the inner id (a journal
 * matches the same share with or without the throttle), rmt_caps() the
 * inner caps without RMT_CAP_FD, and rmt_file_fd() is always -EOPNOTSUPP,
 * so fs/ never splices from the inner fd around the buckets. (Also with only
 * latency or fault set: simpler, and a simulation need not be zero-copy.)
 * Nor RMT_CAP_LOCAL: a throttled share stands for a remote one, whose
 * reads go through the block cache.
 *
 * Time, per operation (enter(), then the data in slices, take()):
 *
 *   call --> sleep latency --> open(FILE)? --exists--> -errno, faults++
 *                                  | ENOENT
 *                                  v
 *            for each slice of at most t->slice bytes:
 *              pwrite, copy: take(n) (sleep) then move the bytes
 *              pread:        move the bytes, then take(n) for what came
 *
 * take() is a virtual-time token bucket (GCRA): a bucket keeps `tat`, the
 * time its link is busy until. A slice of n bytes books [start, start +
 * n/rate) with start = max(tat, now - BURST_NS) and sleeps to the end of
 * that booking (clock_nanosleep(TIMER_ABSTIME), ~0.1 ms accurate): the
 * bytes arrive when the link has carried them. Bookings of the shared
 * bucket are taken in arrival order under its lock and slept outside it, so
 * N threads get ~1/N each; a stream's own bucket needs no lock. A slice is
 * min(1 MiB, 10 ms at the lowest rate set), at least 4 KiB, so a long
 * transfer is smooth and threads interleave every few ms. BURST_NS is the
 * depth of a bucket: an idle bucket credits at most 5 ms of link time,
 * which also absorbs the time spent doing the I/O and oversleeping.
 *
 * Invariants:
 *  1. Every operation of this table, file_close included, goes through
 *     enter() first; file_close always closes the inner file, then reports
 *     the inner error, else the injected one.
 *  2. When a rate is set, no byte moves before take() booked it (pwrite,
 *     copy) and no pread returns before take() booked what it read.
 *  3. t->rate, t->stream_rate, t->latency_ns, t->slice, t->fault, t->inner
 *     and t->id are set in rmt_throttle_wrap() and never change; only
 *     t->link->tat (under t->link->lock) and the thread-local streams[]
 *     do.
 *  4. Paths reaching this file were checked by remote.c; this file hands
 *     them to the inner share through the public rmt_*() calls (checked
 *     again, counted in the inner's own counters, which nobody reads),
 *     except the server-side copy, called on the inner table directly so
 *     that its fallback stays in the outer remote.c, through the buckets.
 *
 * The fault switch is one open(2) per call while it is off (ENOENT); while
 * on, the file is also read each call (no cache: a new errno written into
 * it applies at the next call).
 *
 * Threads: thread-safe if the inner share is (RMT_CAP_THREADSAFE copied).
 * Called only through remote.c.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "remote_i.h"

#define NS_PER_S INT64_C(1000000000)
#define BURST_NS (5 * INT64_C(1000000))  /* bucket depth */
#define SLICE_NS (10 * INT64_C(1000000)) /* link time per booking, at most */
#define SLICE_MAX ((size_t)1 << 20)
#define SLICE_MIN ((size_t)4096)
#define LATENCY_MAX (60 * NS_PER_S)
#define RATE_MAX ((double)(UINT64_C(1) << 62))
#define STREAM_SLOTS 8

struct trmt {
	struct rmt base;      /* first: remote.c sees only this */
	struct rmt *inner;    /* owned: closed with this one */
	uint64_t id;          /* unique per process: keys streams[] */
	uint64_t rate;        /* bytes/s, all threads; 0 = none */
	uint64_t stream_rate; /* bytes/s per thread; 0 = none */
	int64_t latency_ns;
	size_t slice;         /* bytes per booking (take()) */
	char *fault;          /* absolute path of the switch, or NULL */
	atomic_bool warned;   /* an unknown errno name was logged once */
	struct link *link;    /* the shared bucket of rate, or NULL */
};

/* The bucket of remote_rate: one per (share id, rate) in the process. */
struct link {
	char *id;             /* rmt_id() of the share; immutable */
	uint64_t rate;        /* immutable */
	unsigned int refs;    /* protected by links_lock */
	struct link *next;    /* protected by links_lock */
	pthread_mutex_t lock;
	int64_t tat;          /* protected by lock: CLOCK_MONOTONIC ns */
};

static pthread_mutex_t links_lock = PTHREAD_MUTEX_INITIALIZER;
static struct link *links; /* protected by links_lock */

static struct link *link_get(const char *id, uint64_t rate)
{
	struct link *l;

	pthread_mutex_lock(&links_lock);
	for (l = links; l; l = l->next)
		if (l->rate == rate && !strcmp(l->id, id))
			break;
	if (!l) {
		l = calloc(1, sizeof(*l));
		if (l && !(l->id = strdup(id))) {
			free(l);
			l = NULL;
		}
		if (l) {
			l->rate = rate;
			pthread_mutex_init(&l->lock, NULL);
			l->next = links;
			links = l;
		}
	}
	if (l)
		l->refs++;
	pthread_mutex_unlock(&links_lock);
	return l;
}

static void link_put(struct link *l)
{
	struct link **p;

	if (!l)
		return;
	pthread_mutex_lock(&links_lock);
	if (--l->refs == 0) {
		for (p = &links; *p != l; p = &(*p)->next)
			;
		*p = l->next;
		pthread_mutex_destroy(&l->lock);
		free(l->id);
		free(l);
	}
	pthread_mutex_unlock(&links_lock);
}

struct tfile {
	struct rmt_file base; /* first */
	struct rmt_file *inner;
};

/* A thread's streams, one per throttled share it used lately (LRU). */
struct stream {
	uint64_t owner; /* trmt id; 0 = free */
	int64_t tat;    /* CLOCK_MONOTONIC ns */
	uint64_t used;  /* stream_tick when last used */
};

static _Thread_local struct stream streams[STREAM_SLOTS];
static _Thread_local uint64_t stream_tick;
static atomic_uint_least64_t last_id;

static struct trmt *to_trmt(struct rmt *r)
{
	return (struct trmt *)r;
}

static struct tfile *to_tfile(struct rmt_file *f)
{
	return (struct tfile *)f;
}

/* --- time -------------------------------------------------------------- */

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static void sleep_until(int64_t t)
{
	struct timespec ts = {
		.tv_sec = (time_t)(t / NS_PER_S),
		.tv_nsec = (long)(t % NS_PER_S),
	};

	/* returns the error itself; EINTR (a signal) just sleeps on */
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
	       EINTR)
		;
}

static int64_t cost_ns(size_t n, uint64_t rate)
{
	return (int64_t)((double)n * (double)NS_PER_S / (double)rate);
}

static int64_t max64(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/* --- the buckets ------------------------------------------------------- */

/* This thread's stream on t: found, or the least recently used slot. */
static struct stream *stream_of(const struct trmt *t)
{
	struct stream *s = &streams[0];
	int i;

	for (i = 0; i < STREAM_SLOTS; i++) {
		if (streams[i].owner == t->id) {
			s = &streams[i];
			goto out;
		}
		if (streams[i].used < s->used)
			s = &streams[i];
	}
	s->owner = t->id;
	s->tat = 0; /* a new stream: a full bucket */
out:
	s->used = ++stream_tick;
	return s;
}

static bool rated(const struct trmt *t)
{
	return t->rate || t->stream_rate;
}

/* Book n bytes in the buckets set and sleep until they have gone through. */
static void take(struct trmt *t, size_t n)
{
	int64_t now, wake = 0;

	if (n == 0)
		return;
	now = now_ns();
	if (t->stream_rate) {
		struct stream *s = stream_of(t);

		s->tat = max64(s->tat, now - BURST_NS) +
			 cost_ns(n, t->stream_rate);
		wake = s->tat;
	}
	if (t->rate) {
		int64_t end;

		pthread_mutex_lock(&t->link->lock);
		t->link->tat = max64(t->link->tat, now - BURST_NS) +
			       cost_ns(n, t->rate);
		end = t->link->tat;
		pthread_mutex_unlock(&t->link->lock);
		wake = max64(wake, end);
	}
	if (wake > now)
		sleep_until(wake);
}

/* --- the fault switch -------------------------------------------------- */

/* The errno named by the switch's text: a name or a number, else EIO. */
static int errno_of(struct trmt *t, char *text)
{
	char *end = text + strlen(text);
	long num;
	int e;

	while (isspace((unsigned char)*text))
		text++;
	while (end > text && isspace((unsigned char)end[-1]))
		*--end = '\0';
	if (!*text)
		return EIO;
	if (isdigit((unsigned char)*text)) {
		num = strtol(text, &end, 10);
		if (!*end && num > 0 && num < 4096)
			return (int)num;
	} else {
		for (e = 1; e < 256; e++) {
			const char *name = strerrorname_np(e);

			if (name && !strcmp(name, text))
				return e;
		}
	}
	if (!atomic_exchange(&t->warned, true))
		LOG_WARN("unknown errno '%s' in fault switch '%s', failing with EIO",
			 text, t->fault);
	return EIO;
}

/* 0 while the switch is off, else the positive errno to fail with. */
static int fault_errno(struct trmt *t)
{
	char buf[64];
	ssize_t n;
	int fd;

	/* O_NONBLOCK: a fifo put there must not hang every operation */
	fd = open(t->fault, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return (errno == ENOENT || errno == ENOTDIR) ? 0 : EIO;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return EIO;
	buf[n] = '\0';
	return errno_of(t, buf);
}

/* Invariant 1: the round trip, then the switch. */
static int enter(struct trmt *t)
{
	int err;

	if (t->latency_ns)
		sleep_until(now_ns() + t->latency_ns);
	if (!t->fault)
		return 0;
	err = fault_errno(t);
	if (!err)
		return 0;
	rmt_count_fault(&t->base);
	return -err;
}

#define ENTER(t)                                  \
	do {                                      \
		int enter_rc_ = enter(t);         \
		if (enter_rc_ < 0)                \
			return enter_rc_;         \
	} while (0)

/* --- options ----------------------------------------------------------- */

/* digits, optionally '.' digits; *end is the first byte after. */
static int parse_number(const char *s, double *v, const char **end)
{
	double x = 0, scale = 1;
	const char *p = s;

	if (!isdigit((unsigned char)*p))
		return -EINVAL;
	for (; isdigit((unsigned char)*p); p++) {
		x = x * 10 + (*p - '0');
		if (x > 1e18)
			return -EINVAL;
	}
	if (*p == '.') {
		p++;
		if (!isdigit((unsigned char)*p))
			return -EINVAL;
		for (; isdigit((unsigned char)*p); p++) {
			scale /= 10;
			x += (*p - '0') * scale;
		}
	}
	*v = x;
	*end = p;
	return 0;
}

struct unit {
	const char *suffix;
	double mult;
};

/* s is all of number + one of units[]; returns 0 or -EINVAL. */
static int parse_with_unit(const char *s, const struct unit *units,
			   size_t nunits, double *v)
{
	const char *end;
	double x;
	size_t i;

	if (parse_number(s, &x, &end) < 0)
		return -EINVAL;
	for (i = 0; i < nunits; i++) {
		if (!strcmp(end, units[i].suffix)) {
			*v = x * units[i].mult;
			return 0;
		}
	}
	return -EINVAL;
}

int rmt_parse_rate(const char *s, uint64_t *out)
{
	static const struct unit units[] = {
		{ "", 1 },
		{ "K", 1e3 },
		{ "k", 1e3 },
		{ "M", 1e6 },
		{ "G", 1e9 },
		{ "Ki", 1024.0 },
		{ "Mi", 1024.0 * 1024 },
		{ "Gi", 1024.0 * 1024 * 1024 },
	};
	double v;

	if (parse_with_unit(s, units, sizeof(units) / sizeof(units[0]), &v) <
	    0)
		return -EINVAL;
	/* 0 would stall for ever: leave the option out for no cap */
	if (v < 1 || v > RATE_MAX)
		return -EINVAL;
	*out = (uint64_t)(v + 0.5);
	return 0;
}

static int parse_duration(const char *s, int64_t *out)
{
	static const struct unit units[] = {
		{ "ns", 1 },
		{ "us", 1e3 },
		{ "ms", 1e6 },
		{ "s", 1e9 },
	};
	double v;

	if (!strcmp(s, "0")) {
		*out = 0;
		return 0;
	}
	if (parse_with_unit(s, units, sizeof(units) / sizeof(units[0]), &v) <
	    0)
		return -EINVAL;
	if (v > (double)LATENCY_MAX)
		return -EINVAL;
	*out = (int64_t)(v + 0.5);
	return 0;
}

enum key { KEY_RATE, KEY_STREAM_RATE, KEY_LATENCY, KEY_FAULT, KEY_NONE };

static const char *const keys[] = {
	[KEY_RATE] = "remote_rate",
	[KEY_STREAM_RATE] = "remote_stream_rate",
	[KEY_LATENCY] = "remote_latency",
	[KEY_FAULT] = "remote_fault",
};

static const char *const wants[] = {
	[KEY_RATE] = "a rate in bytes/s above 0, like 110M or 1.5Gi",
	[KEY_STREAM_RATE] = "a rate in bytes/s above 0, like 110M or 1.5Gi",
	[KEY_LATENCY] = "a duration up to 60s, like 500us or 2ms",
	[KEY_FAULT] = "an absolute path",
};

static enum key key_of(const char *item, size_t len)
{
	int k;

	for (k = 0; k < KEY_NONE; k++)
		if (strlen(keys[k]) == len && !strncmp(item, keys[k], len))
			return (enum key)k;
	return KEY_NONE;
}

/* Parse one "key=value" of ours into t. */
static int parse_item(enum key k, const char *value,
		      struct rmt_throttle_opts *t)
{
	char *dup;

	switch (k) {
	case KEY_RATE:
		return rmt_parse_rate(value, &t->rate);
	case KEY_STREAM_RATE:
		return rmt_parse_rate(value, &t->stream_rate);
	case KEY_LATENCY:
		return parse_duration(value, &t->latency_ns);
	case KEY_FAULT:
		/* absolute: the daemon chdirs to / once detached */
		if (value[0] != '/' || strlen(value) >= PATH_MAX)
			return -EINVAL;
		dup = strdup(value);
		if (!dup)
			return -ENOMEM;
		free(t->fault);
		t->fault = dup;
		return 0;
	case KEY_NONE:
		break;
	}
	BUG("parse_item of key %d", (int)k);
}

void rmt_throttle_opts_release(struct rmt_throttle_opts *t)
{
	free(t->fault);
	t->fault = NULL;
}

static int take_throttle(const char *item, size_t klen, const char *value,
			 void *arg)
{
	struct rmt_throttle_opts *t = arg;
	enum key k = key_of(item, klen);
	int rc;

	if (k == KEY_NONE)
		return 0; /* the driver's */
	t->any = true;
	rc = value ? parse_item(k, value, t) : -EINVAL;
	if (rc == -EINVAL)
		LOG_ERR("invalid remote option '%s': want %s", item, wants[k]);
	return rc < 0 ? rc : 1;
}

int rmt_throttle_parse(const char *opts, struct rmt_throttle_opts *t,
		       char **rest)
{
	int rc;

	memset(t, 0, sizeof(*t));
	rc = rmt_opts_split(opts, take_throttle, t, rest);
	if (rc < 0) {
		rmt_throttle_opts_release(t);
		t->any = false;
	}
	return rc;
}

/* --- the share --------------------------------------------------------- */

static const struct rmt_ops throttle_ops;

/* 10 ms at the lowest rate set, within [SLICE_MIN, SLICE_MAX]. */
static size_t slice_of(uint64_t rate, uint64_t stream_rate)
{
	uint64_t low = rate;
	uint64_t bytes;

	if (!low || (stream_rate && stream_rate < low))
		low = stream_rate;
	if (!low)
		return SLICE_MAX;
	bytes = (uint64_t)((double)low * (double)SLICE_NS / (double)NS_PER_S);
	if (bytes < SLICE_MIN)
		return SLICE_MIN;
	if (bytes > SLICE_MAX)
		return SLICE_MAX;
	return (size_t)bytes;
}

int rmt_throttle_wrap(struct rmt *inner, struct rmt_throttle_opts *o,
		      struct rmt **out)
{
	struct trmt *t;
	int rc;

	*out = NULL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->base.id = strdup(rmt_id(inner));
	if (!t->base.id) {
		rc = -ENOMEM;
		goto out_t;
	}
	if (o->rate) {
		t->link = link_get(t->base.id, o->rate);
		if (!t->link) {
			rc = -ENOMEM;
			goto out_id;
		}
	}
	t->base.ops = &throttle_ops;
	t->base.caps = rmt_caps(inner) & ~(unsigned int)(RMT_CAP_FD | RMT_CAP_PUT |
						 RMT_CAP_BATCH | RMT_CAP_LOCAL);
	t->inner = inner;
	t->id = atomic_fetch_add(&last_id, 1) + 1;
	t->rate = o->rate;
	t->stream_rate = o->stream_rate;
	t->latency_ns = o->latency_ns;
	t->slice = slice_of(o->rate, o->stream_rate);
	t->fault = o->fault;
	o->fault = NULL;
	atomic_init(&t->warned, false);
	LOG_DBG("remote '%s' throttled: rate %llu B/s, stream rate %llu B/s, latency %lld ns, fault switch '%s'",
		t->base.id, (unsigned long long)t->rate,
		(unsigned long long)t->stream_rate, (long long)t->latency_ns,
		t->fault ? t->fault : "");
	*out = &t->base;
	return 0;

out_id:
	free(t->base.id);
out_t:
	free(t);
	return rc;
}

/* remote.c frees r->id after this. */
static void throttle_close(struct rmt *r)
{
	struct trmt *t = to_trmt(r);

	rmt_close(t->inner);
	link_put(t->link);
	free(t->fault);
	free(t);
}

static int throttle_name_check(struct rmt *r, const char *name)
{
	return rmt_name_check(to_trmt(r)->inner, name); /* no I/O: free */
}

static int throttle_statfs(struct rmt *r, struct statvfs *sv)
{
	ENTER(to_trmt(r));
	return rmt_statfs(to_trmt(r)->inner, sv);
}

/* --- names ------------------------------------------------------------- */

static int throttle_stat(struct rmt *r, const char *path, struct stat *st)
{
	ENTER(to_trmt(r));
	return rmt_stat(to_trmt(r)->inner, path, st);
}

static int throttle_readdir(struct rmt *r, const char *path,
			    rmt_dirent_fn fn, void *arg)
{
	ENTER(to_trmt(r));
	return rmt_readdir(to_trmt(r)->inner, path, fn, arg);
}

static int throttle_mkdir(struct rmt *r, const char *path, mode_t mode)
{
	ENTER(to_trmt(r));
	return rmt_mkdir(to_trmt(r)->inner, path, mode);
}

static int throttle_rmdir(struct rmt *r, const char *path)
{
	ENTER(to_trmt(r));
	return rmt_rmdir(to_trmt(r)->inner, path);
}

static int throttle_unlink(struct rmt *r, const char *path)
{
	ENTER(to_trmt(r));
	return rmt_unlink(to_trmt(r)->inner, path);
}

static int throttle_mknod(struct rmt *r, const char *path, mode_t mode,
			  dev_t rdev)
{
	ENTER(to_trmt(r));
	return rmt_mknod(to_trmt(r)->inner, path, mode, rdev);
}

static int throttle_symlink(struct rmt *r, const char *target,
			    const char *path)
{
	ENTER(to_trmt(r));
	return rmt_symlink(to_trmt(r)->inner, target, path);
}

static int throttle_readlink(struct rmt *r, const char *path, char *buf,
			     size_t size)
{
	ENTER(to_trmt(r));
	return rmt_readlink(to_trmt(r)->inner, path, buf, size);
}

static int throttle_link(struct rmt *r, const char *from, const char *to)
{
	ENTER(to_trmt(r));
	return rmt_link(to_trmt(r)->inner, from, to);
}

static int throttle_rename(struct rmt *r, const char *from, const char *to,
			   unsigned int flags)
{
	ENTER(to_trmt(r));
	return rmt_rename(to_trmt(r)->inner, from, to, flags);
}

static int throttle_setattr(struct rmt *r, const char *path,
			    struct rmt_file *f, const struct rmt_setattr *sa)
{
	ENTER(to_trmt(r));
	return rmt_setattr(to_trmt(r)->inner, path,
			   f ? to_tfile(f)->inner : NULL, sa);
}

static ssize_t throttle_getxattr(struct rmt *r, const char *path,
				 const char *name, void *buf, size_t size)
{
	ENTER(to_trmt(r));
	return rmt_getxattr(to_trmt(r)->inner, path, name, buf, size);
}

static int throttle_setxattr(struct rmt *r, const char *path,
			     const char *name, const void *value, size_t size,
			     int flags)
{
	ENTER(to_trmt(r));
	return rmt_setxattr(to_trmt(r)->inner, path, name, value, size, flags);
}

static ssize_t throttle_listxattr(struct rmt *r, const char *path, char *buf,
				  size_t size)
{
	ENTER(to_trmt(r));
	return rmt_listxattr(to_trmt(r)->inner, path, buf, size);
}

static int throttle_removexattr(struct rmt *r, const char *path,
				const char *name)
{
	ENTER(to_trmt(r));
	return rmt_removexattr(to_trmt(r)->inner, path, name);
}

static int throttle_syncdir(struct rmt *r, const char *path)
{
	ENTER(to_trmt(r));
	return rmt_syncdir(to_trmt(r)->inner, path);
}

/* --- files ------------------------------------------------------------- */

static int throttle_file_open(struct rmt *r, const char *path, int flags,
			      mode_t mode, struct rmt_file **out)
{
	struct tfile *tf;
	int rc;

	ENTER(to_trmt(r));
	/* before the open: an O_EXCL create must not be undone by ENOMEM */
	tf = calloc(1, sizeof(*tf));
	if (!tf)
		return -ENOMEM;
	rc = rmt_file_open(to_trmt(r)->inner, path, flags, mode, &tf->inner);
	if (rc < 0) {
		free(tf);
		return rc;
	}
	tf->base.r = r;
	*out = &tf->base;
	return 0;
}

/* Invariant 1: always closes; the inner error first, then the injected. */
static int throttle_file_close(struct rmt_file *f)
{
	struct tfile *tf = to_tfile(f);
	int frc = enter(to_trmt(f->r));
	int rc = rmt_file_close(tf->inner);

	free(tf);
	return rc < 0 ? rc : frc;
}

static size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}

/* Slice by slice, each booked after it was read (invariant 2). As
 * sys_pread_all(): short only at EOF; an error after progress is the
 * error. */
static ssize_t throttle_file_pread(struct rmt_file *f, void *buf, size_t len,
				   off_t off)
{
	struct trmt *t = to_trmt(f->r);
	struct rmt_file *in = to_tfile(f)->inner;
	size_t done = 0;

	ENTER(t);
	if (!rated(t))
		return rmt_file_pread(in, buf, len, off);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	do {
		size_t want = min_size(len - done, t->slice);
		ssize_t n = rmt_file_pread(in, (char *)buf + done, want,
					   off + (off_t)done);

		if (n < 0)
			return n;
		take(t, (size_t)n);
		done += (size_t)n;
		if ((size_t)n < want)
			break; /* EOF */
	} while (done < len);
	return (ssize_t)done;
}

/* Slice by slice, each booked before it is written (invariant 2). */
static ssize_t throttle_file_pwrite(struct rmt_file *f, const void *buf,
				    size_t len, off_t off)
{
	struct trmt *t = to_trmt(f->r);
	struct rmt_file *in = to_tfile(f)->inner;
	size_t done = 0;

	ENTER(t);
	if (!rated(t))
		return rmt_file_pwrite(in, buf, len, off);
	do {
		size_t want = min_size(len - done, t->slice);
		ssize_t n;

		take(t, want);
		n = rmt_file_pwrite(in, (const char *)buf + done, want,
				    off + (off_t)done);
		if (n < 0)
			return n;
		done += want;
	} while (done < len);
	return (ssize_t)len;
}

static int throttle_file_stat(struct rmt_file *f, struct stat *st)
{
	ENTER(to_trmt(f->r));
	return rmt_file_stat(to_tfile(f)->inner, st);
}

static int throttle_file_fsync(struct rmt_file *f, bool datasync)
{
	ENTER(to_trmt(f->r));
	return rmt_file_fsync(to_tfile(f)->inner, datasync);
}

static int throttle_file_flush(struct rmt_file *f)
{
	ENTER(to_trmt(f->r));
	return rmt_file_flush(to_tfile(f)->inner);
}

static int throttle_file_fallocate(struct rmt_file *f, int mode, off_t off,
				   off_t len)
{
	ENTER(to_trmt(f->r));
	return rmt_file_fallocate(to_tfile(f)->inner, mode, off, len);
}

static off_t throttle_file_seek(struct rmt_file *f, off_t off, int whence)
{
	ENTER(to_trmt(f->r));
	return rmt_file_seek(to_tfile(f)->inner, off, whence);
}

/*
 * The inner share's server-side copy, slice by slice, each booked once
 * (the share's disks still move the bytes). Without one, -EOPNOTSUPP, and
 * remote.c copies through this driver's pread and pwrite: booked twice, as
 * a copy through this host crosses the link twice (invariant 4).
 */
static ssize_t throttle_file_copy(struct rmt_file *in, off_t off_in,
				  struct rmt_file *out, off_t off_out,
				  size_t len)
{
	struct trmt *t = to_trmt(in->r);
	struct rmt_file *iin = to_tfile(in)->inner;
	struct rmt_file *iout = to_tfile(out)->inner;
	ssize_t (*copy)(struct rmt_file *, off_t, struct rmt_file *, off_t,
			size_t) = t->inner->ops->file_copy;
	size_t done = 0;

	if (!copy)
		return -EOPNOTSUPP;
	ENTER(t);
	if (!rated(t))
		return copy(iin, off_in, iout, off_out, len);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	while (done < len) {
		size_t want = min_size(len - done, t->slice);
		ssize_t n = copy(iin, off_in + (off_t)done, iout,
				 off_out + (off_t)done, want);

		if (n < 0)
			return n; /* as path_file_copy(): even after progress */
		take(t, (size_t)n);
		done += (size_t)n;
		if ((size_t)n < want)
			break; /* EOF */
	}
	return (ssize_t)done;
}

static const struct rmt_ops throttle_ops = {
	.name = "throttle",
	.close = throttle_close,
	.stat = throttle_stat,
	.statfs = throttle_statfs,
	.name_check = throttle_name_check,
	.readdir = throttle_readdir,
	.mkdir = throttle_mkdir,
	.rmdir = throttle_rmdir,
	.unlink = throttle_unlink,
	.mknod = throttle_mknod,
	.symlink = throttle_symlink,
	.readlink = throttle_readlink,
	.link = throttle_link,
	.rename = throttle_rename,
	.setattr = throttle_setattr,
	.getxattr = throttle_getxattr,
	.setxattr = throttle_setxattr,
	.listxattr = throttle_listxattr,
	.removexattr = throttle_removexattr,
	.file_open = throttle_file_open,
	.file_close = throttle_file_close,
	.file_pread = throttle_file_pread,
	.file_pwrite = throttle_file_pwrite,
	.file_stat = throttle_file_stat,
	.file_fsync = throttle_file_fsync,
	.file_fallocate = throttle_file_fallocate,
	.file_seek = throttle_file_seek,
	.file_copy = throttle_file_copy,
	.file_fd = NULL, /* never: fs/ would splice around the buckets */
	.file_flush = throttle_file_flush,
	.syncdir = throttle_syncdir,
};
