/*
 * delayline.c — a userspace TCP relay that holds every byte for a fixed
 * one-way delay, in both directions (the bench's stand-in for netem, which
 * this kernel lacks; see tests/bench/README-nas.md).
 *
 *   delayline [-d MS] [-b MIB] [-v] LISTEN:PORT=CONNECT:PORT ...
 *
 *   -d MS    one-way delay in milliseconds, fractions allowed (0.5); default 0
 *   -b MIB   most bytes held per direction of one connection, in MiB (rounded
 *            up to a power of two); default 64. The ring starts small and
 *            doubles as needed, so an idle or slow connection costs little.
 *   -v       log each connection (open, close, bytes each way) to stderr
 *
 * Each LISTEN=CONNECT pair is one listening socket; every connection accepted
 * on it gets its own connection to CONNECT. Addresses are numeric IPv4, or
 * IPv6 in brackets ([::1]:2049). One process, one epoll loop, any number of
 * connections.
 *
 * Every read from one side is stamped with its arrival time and written to
 * the other side no earlier than arrival + delay; an end of stream (FIN) is
 * delayed the same way and passed on as shutdown(SHUT_WR). A reset or error on
 * either side closes both at once. Reading pauses only when a direction holds
 * -b MiB, so the buffer does not cap the rate for rate x delay below that
 * (1 Gbit/s x 5 ms = 625 KB; 10 Gbit/s x 50 ms = 62.5 MB).
 *
 * What it models, and what it does not: it is a split-TCP relay. Request /
 * response round trips of the protocol above TCP (an NFS RPC, an SMB
 * request, a libnfs or SMB credit window) see 2 x delay more; TCP's own
 * handshake and congestion window see only the short hop to the relay, so
 * slow start and a TCP window limited by the round trip are not modelled.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RING_MIN (64u * 1024u)
#define SEGS_MIN 64u
#define READ_BUDGET (4u * 1024u * 1024u) /* bytes read per wake-up per side */

enum kind { K_LISTENER, K_ENDPOINT, K_TIMER };

struct listener {
	enum kind kind;
	int fd;
	struct sockaddr_storage to;
	socklen_t tolen;
	char name[336]; /* "LISTEN->CONNECT", both from a 320-byte argument */
};

struct seg {
	uint64_t end; /* stream offset just past the bytes of this read */
	uint64_t due; /* CLOCK_MONOTONIC ns at which they may be written */
};

/* One direction: bytes read from fd[from] are written to fd[1 - from]. */
struct dir {
	char *buf;
	uint64_t cap;      /* power of two */
	uint64_t rpos;     /* bytes read so far (stream offset) */
	uint64_t wpos;     /* bytes written so far */
	uint64_t released; /* bytes whose delay has elapsed */
	struct seg *segs;  /* ring of read stamps, oldest at shead */
	uint64_t scap, shead, stail;
	uint64_t eof_due; /* when eof_read: time to pass the FIN on */
	bool eof_read, shut, blocked;
};

struct conn;

struct endpoint {
	enum kind kind;
	struct conn *c;
	int side;     /* 0 = accepted (client) side, 1 = upstream side */
	int fd;
	uint32_t events; /* currently registered epoll interest */
};

struct conn {
	struct endpoint ep[2];
	struct dir d[2]; /* d[0]: client -> upstream, d[1]: upstream -> client */
	bool connecting;
	bool dead;
	uint64_t id;
	const struct listener *l;
	struct conn *next, *prev;
};

static uint64_t delay_ns;
static uint64_t max_cap = 64ull << 20;
static bool verbose;
static int epfd, tfd;
static struct conn *conns;
static uint64_t next_id = 1;
static struct { enum kind kind; } timer_tag = { K_TIMER };

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("delayline: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void logv(const char *fmt, ...)
{
	va_list ap;
	if (!verbose)
		return;
	va_start(ap, fmt);
	fputs("delayline: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n);
	if (!p)
		die("out of memory (%zu bytes)", n);
	return p;
}

static void parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
	char host[128];
	const char *colon = strrchr(s, ':');
	size_t hl;
	struct addrinfo hints, *res;
	int rc;

	if (!colon || colon == s || !colon[1])
		die("bad address '%s' (want ADDR:PORT)", s);
	hl = (size_t)(colon - s);
	if (s[0] == '[' && hl >= 2 && s[hl - 1] == ']') {
		s++;
		hl -= 2;
	}
	if (hl >= sizeof(host))
		die("address too long: '%s'", s);
	memcpy(host, s, hl);
	host[hl] = '\0';
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
	rc = getaddrinfo(host, colon + 1, &hints, &res);
	if (rc != 0)
		die("bad address '%s': %s", s, gai_strerror(rc));
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
}

static void set_nodelay(int fd)
{
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void ep_set(struct endpoint *e, uint32_t events)
{
	struct epoll_event ev;

	/* events == 0: not registered at all, so that a hung-up socket we
	 * have nothing more to do with does not keep waking the loop. */
	if (e->fd < 0 || e->events == events)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.events = events;
	ev.data.ptr = e;
	if (epoll_ctl(epfd, !events ? EPOLL_CTL_DEL : !e->events ? EPOLL_CTL_ADD : EPOLL_CTL_MOD,
		      e->fd, &ev) < 0)
		die("epoll_ctl: %s", strerror(errno));
	e->events = events;
}

static void dir_init(struct dir *d)
{
	memset(d, 0, sizeof(*d));
	d->cap = RING_MIN;
	d->buf = xmalloc(d->cap);
	d->scap = SEGS_MIN;
	d->segs = xmalloc(d->scap * sizeof(*d->segs));
}

static void dir_free(struct dir *d)
{
	free(d->buf);
	free(d->segs);
}

/* Copy len bytes at stream offset pos out of (or into) a ring. */
static void ring_get(const char *buf, uint64_t cap, uint64_t pos, char *out, uint64_t len)
{
	uint64_t i = pos & (cap - 1), first = cap - i < len ? cap - i : len;
	memcpy(out, buf + i, first);
	memcpy(out + first, buf, len - first);
}

static void ring_put(char *buf, uint64_t cap, uint64_t pos, const char *in, uint64_t len)
{
	uint64_t i = pos & (cap - 1), first = cap - i < len ? cap - i : len;
	memcpy(buf + i, in, first);
	memcpy(buf, in + first, len - first);
}

static bool dir_grow(struct dir *d)
{
	uint64_t held = d->rpos - d->wpos, ncap = d->cap * 2;
	char *nb, *tmp;

	if (ncap > max_cap)
		return false;
	nb = malloc(ncap);
	if (!nb)
		return false;
	tmp = xmalloc(held ? held : 1);
	ring_get(d->buf, d->cap, d->wpos, tmp, held);
	ring_put(nb, ncap, d->wpos, tmp, held);
	free(tmp);
	free(d->buf);
	d->buf = nb;
	d->cap = ncap;
	return true;
}

static void seg_push(struct dir *d, uint64_t end, uint64_t due)
{
	if (d->stail - d->shead == d->scap) {
		uint64_t n = d->scap * 2, k;
		struct seg *ns = xmalloc(n * sizeof(*ns));
		for (k = d->shead; k < d->stail; k++)
			ns[k & (n - 1)] = d->segs[k & (d->scap - 1)];
		free(d->segs);
		d->segs = ns;
		d->scap = n;
	}
	d->segs[d->stail & (d->scap - 1)] = (struct seg){ end, due };
	d->stail++;
}

static void conn_close(struct conn *c, const char *why)
{
	int s;

	if (c->dead)
		return;
	c->dead = true;
	logv("#%" PRIu64 " %s: closed (%s), %" PRIu64 " bytes up, %" PRIu64 " down",
	     c->id, c->l->name, why, c->d[0].wpos, c->d[1].wpos);
	for (s = 0; s < 2; s++) {
		if (c->ep[s].fd >= 0) {
			if (c->ep[s].events)
				(void)epoll_ctl(epfd, EPOLL_CTL_DEL, c->ep[s].fd, NULL);
			close(c->ep[s].fd);
			c->ep[s].fd = -1;
		}
	}
}

static void conn_reap(void)
{
	struct conn *c = conns, *n;

	for (; c; c = n) {
		n = c->next;
		if (!c->dead)
			continue;
		if (c->prev)
			c->prev->next = c->next;
		else
			conns = c->next;
		if (c->next)
			c->next->prev = c->prev;
		dir_free(&c->d[0]);
		dir_free(&c->d[1]);
		free(c);
	}
}

/* Read what side `from` has for direction d[from]. */
static void do_read(struct conn *c, int from)
{
	struct dir *d = &c->d[from];
	int fd = c->ep[from].fd;
	uint64_t budget = READ_BUDGET;

	while (!d->eof_read && budget > 0) {
		uint64_t held = d->rpos - d->wpos, room, i, first;
		struct iovec iov[2];
		ssize_t n;

		if (held == d->cap && !dir_grow(d))
			return; /* full: reading resumes once the writer drains */
		room = d->cap - (d->rpos - d->wpos);
		if (room > budget)
			room = budget;
		i = d->rpos & (d->cap - 1);
		first = d->cap - i < room ? d->cap - i : room;
		iov[0].iov_base = d->buf + i;
		iov[0].iov_len = first;
		iov[1].iov_base = d->buf;
		iov[1].iov_len = room - first;
		n = readv(fd, iov, room > first ? 2 : 1);
		if (n > 0) {
			d->rpos += (uint64_t)n;
			budget -= (uint64_t)n < budget ? (uint64_t)n : budget;
			seg_push(d, d->rpos, now_ns() + delay_ns);
			if ((uint64_t)n < room)
				return; /* socket drained */
		} else if (n == 0) {
			d->eof_read = true;
			d->eof_due = now_ns() + delay_ns;
		} else if (errno == EINTR) {
			continue;
		} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
			return;
		} else {
			conn_close(c, strerror(errno));
			return;
		}
	}
}

/* Release what is due in direction d[from] and write it to the other side. */
static void do_write(struct conn *c, int from, uint64_t now)
{
	struct dir *d = &c->d[from];
	int fd = c->ep[1 - from].fd;

	while (d->shead < d->stail && d->segs[d->shead & (d->scap - 1)].due <= now) {
		d->released = d->segs[d->shead & (d->scap - 1)].end;
		d->shead++;
	}
	if (d->blocked || (from == 0 && c->connecting))
		return;
	while (d->wpos < d->released) {
		uint64_t len = d->released - d->wpos;
		uint64_t i = d->wpos & (d->cap - 1);
		uint64_t first = d->cap - i < len ? d->cap - i : len;
		struct iovec iov[2];
		ssize_t n;

		iov[0].iov_base = d->buf + i;
		iov[0].iov_len = first;
		iov[1].iov_base = d->buf;
		iov[1].iov_len = len - first;
		n = writev(fd, iov, len > first ? 2 : 1);
		if (n > 0) {
			d->wpos += (uint64_t)n;
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			d->blocked = true;
			return;
		} else {
			conn_close(c, n < 0 ? strerror(errno) : "short write");
			return;
		}
	}
	if (d->eof_read && !d->shut && d->wpos == d->rpos && d->eof_due <= now) {
		(void)shutdown(fd, SHUT_WR);
		d->shut = true;
	}
}

static void conn_interest(struct conn *c)
{
	int s;

	for (s = 0; s < 2; s++) {
		struct dir *in = &c->d[s], *out = &c->d[1 - s];
		uint32_t ev = 0;

		if (s == 1 && c->connecting) {
			ep_set(&c->ep[s], EPOLLOUT);
			continue;
		}
		if (!in->eof_read && (in->rpos - in->wpos < in->cap || in->cap < max_cap))
			ev |= EPOLLIN | EPOLLRDHUP;
		if (out->blocked)
			ev |= EPOLLOUT;
		ep_set(&c->ep[s], ev);
	}
}

static void conn_service(struct conn *c, uint64_t now)
{
	if (c->dead)
		return;
	do_write(c, 0, now);
	if (!c->dead)
		do_write(c, 1, now);
	if (c->dead)
		return;
	if (c->d[0].shut && c->d[1].shut) {
		conn_close(c, "both ends finished");
		return;
	}
	conn_interest(c);
}

static uint64_t conn_next_due(const struct conn *c)
{
	uint64_t best = UINT64_MAX;
	int s;

	if (c->dead)
		return best;
	for (s = 0; s < 2; s++) {
		const struct dir *d = &c->d[s];
		if (d->shead < d->stail) {
			uint64_t t = d->segs[d->shead & (d->scap - 1)].due;
			if (t < best)
				best = t;
		} else if (d->eof_read && !d->shut && d->eof_due < best) {
			best = d->eof_due;
		}
	}
	return best;
}

static void add_fd(int fd, void *tag, uint32_t events)
{
	struct epoll_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.events = events;
	ev.data.ptr = tag;
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		die("epoll_ctl add: %s", strerror(errno));
}

static void do_accept(struct listener *l)
{
	for (;;) {
		int cfd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), ufd, s;
		struct conn *c;

		if (cfd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				fprintf(stderr, "delayline: accept on %s: %s\n", l->name, strerror(errno));
			return;
		}
		ufd = socket(l->to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (ufd < 0) {
			fprintf(stderr, "delayline: socket: %s\n", strerror(errno));
			close(cfd);
			continue;
		}
		set_nodelay(cfd);
		set_nodelay(ufd);
		c = xmalloc(sizeof(*c));
		memset(c, 0, sizeof(*c));
		c->id = next_id++;
		c->l = l;
		for (s = 0; s < 2; s++) {
			c->ep[s].kind = K_ENDPOINT;
			c->ep[s].c = c;
			c->ep[s].side = s;
			dir_init(&c->d[s]);
		}
		c->ep[0].fd = cfd;
		c->ep[1].fd = ufd;
		c->next = conns;
		if (conns)
			conns->prev = c;
		conns = c;
		c->ep[0].events = EPOLLIN | EPOLLRDHUP;
		add_fd(cfd, &c->ep[0], c->ep[0].events);
		c->ep[1].events = EPOLLOUT;
		add_fd(ufd, &c->ep[1], c->ep[1].events);
		c->connecting = true;
		logv("#%" PRIu64 " %s: accepted", c->id, l->name);
		if (connect(ufd, (struct sockaddr *)&l->to, l->tolen) == 0)
			c->connecting = false;
		else if (errno != EINPROGRESS)
			conn_close(c, strerror(errno));
	}
}

static void on_endpoint(struct endpoint *e, uint32_t events)
{
	struct conn *c = e->c;

	if (c->dead)
		return;
	if (e->side == 1 && c->connecting) {
		int err = 0;
		socklen_t len = sizeof(err);

		if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return;
		if (getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err) {
			conn_close(c, strerror(err));
			return;
		}
		c->connecting = false;
		logv("#%" PRIu64 " %s: connected upstream", c->id, c->l->name);
		return;
	}
	if (events & EPOLLOUT)
		c->d[1 - e->side].blocked = false;
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		do_read(c, e->side);
}

static void arm_timer(uint64_t due)
{
	struct itimerspec its;

	memset(&its, 0, sizeof(its));
	if (due != UINT64_MAX) {
		if (due == 0)
			due = 1;
		its.it_value.tv_sec = (time_t)(due / 1000000000ull);
		its.it_value.tv_nsec = (long)(due % 1000000000ull);
	}
	if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
		die("timerfd_settime: %s", strerror(errno));
}

static void add_listener(const char *spec)
{
	char buf[320], *eq;
	struct listener *l = xmalloc(sizeof(*l));
	struct sockaddr_storage at;
	socklen_t atlen;
	int one = 1;

	memset(l, 0, sizeof(*l));
	if (strlen(spec) >= sizeof(buf))
		die("argument too long: '%s'", spec);
	strcpy(buf, spec);
	eq = strchr(buf, '=');
	if (!eq)
		die("bad pair '%s' (want LISTEN:PORT=CONNECT:PORT)", spec);
	*eq = '\0';
	parse_addr(buf, &at, &atlen);
	parse_addr(eq + 1, &l->to, &l->tolen);
	snprintf(l->name, sizeof(l->name), "%s->%s", buf, eq + 1);
	l->kind = K_LISTENER;
	l->fd = socket(at.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0)
		die("socket: %s", strerror(errno));
	(void)setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l->fd, (struct sockaddr *)&at, atlen) < 0)
		die("bind %s: %s", buf, strerror(errno));
	if (listen(l->fd, 256) < 0)
		die("listen %s: %s", buf, strerror(errno));
	add_fd(l->fd, l, EPOLLIN);
}

static void usage(void)
{
	fputs("usage: delayline [-d MS] [-b MIB] [-v] LISTEN:PORT=CONNECT:PORT ...\n", stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	struct epoll_event evs[128];
	int opt, i;
	double ms = 0;
	char *end;

	while ((opt = getopt(argc, argv, "d:b:vh")) != -1) {
		switch (opt) {
		case 'd':
			ms = strtod(optarg, &end);
			if (*end || end == optarg || !(ms >= 0) || ms > 60000)
				die("bad delay '%s' (milliseconds, 0 to 60000)", optarg);
			break;
		case 'b': {
			unsigned long long mib = strtoull(optarg, &end, 10);
			if (*end || end == optarg || mib < 1 || mib > 4096)
				die("bad buffer size '%s' (MiB, 1 to 4096)", optarg);
			max_cap = RING_MIN;
			while (max_cap < (mib << 20))
				max_cap *= 2;
			break;
		}
		case 'v':
			verbose = true;
			break;
		default:
			usage();
		}
	}
	if (optind >= argc)
		usage();
	delay_ns = (uint64_t)(ms * 1e6 + 0.5);
	signal(SIGPIPE, SIG_IGN);

	epfd = epoll_create1(EPOLL_CLOEXEC);
	if (epfd < 0)
		die("epoll_create1: %s", strerror(errno));
	tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (tfd < 0)
		die("timerfd_create: %s", strerror(errno));
	add_fd(tfd, &timer_tag, EPOLLIN);
	for (i = optind; i < argc; i++)
		add_listener(argv[i]);
	fprintf(stderr, "delayline: ready, delay %.3f ms, up to %" PRIu64 " MiB per direction, %d listener(s)\n",
		ms, max_cap >> 20, argc - optind);

	for (;;) {
		uint64_t due = UINT64_MAX, now;
		struct conn *c;
		int n;

		for (c = conns; c; c = c->next) {
			uint64_t t = conn_next_due(c);
			if (t < due)
				due = t;
		}
		arm_timer(due);
		n = epoll_wait(epfd, evs, (int)(sizeof(evs) / sizeof(evs[0])), -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait: %s", strerror(errno));
		}
		for (i = 0; i < n; i++) {
			enum kind k = *(enum kind *)evs[i].data.ptr;

			if (k == K_LISTENER) {
				do_accept(evs[i].data.ptr);
			} else if (k == K_TIMER) {
				uint64_t ticks;
				(void)!read(tfd, &ticks, sizeof(ticks));
			} else {
				on_endpoint(evs[i].data.ptr, evs[i].events);
			}
		}
		now = now_ns();
		for (c = conns; c; c = c->next)
			conn_service(c, now);
		conn_reap();
	}
}
