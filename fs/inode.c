/*
 * inode.c - the inode table of fs/ (contract and invariants in fs_i.h).
 *
 * A chained hash keyed by the remote's (dev, ino), doubled when the load
 * passes 1. One mutex; every function here takes it itself, so callers hold
 * no lock. Nothing here talks to the remote or to FUSE.
 *
 * Inode life:
 *
 *   (absent) --fs_itab_lookup()--> live (nlookup > 0)
 *   live --fs_itab_forget() to 0--> pinned (nlookup 0, refs > 0: a child
 *        still names it as parent, or a handle is open) or freed
 *   pinned --fs_itab_lookup()--> live
 *   pinned --last child link / handle gone (put_ref)--> freed
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_i.h"
#include "log.h"

struct fs_itab {
	pthread_mutex_t lock;
	struct fs_inode **buckets; /* protected by lock */
	size_t nbuckets;           /* power of two; protected by lock */
	size_t count;              /* protected by lock */
	struct fs_inode *root;     /* immutable */
	/* inodes taken out of the hash while the kernel still knows them
	 * (the remote reused the number for another type): freed on forget,
	 * or by fs_itab_free(); protected by lock, linked by onext */
	struct fs_inode *orphans;
	/* renames and unlinks so far: bumped under lock, read without it */
	_Atomic uint64_t moves;
};

static size_t hash_key(uint64_t dev, uint64_t ino)
{
	uint64_t h = ino * 0x9E3779B97F4A7C15ull ^ (dev + 0x632BE59BD9B4E019ull);

	h ^= h >> 29;
	return (size_t)h;
}

static struct fs_inode **bucket_of(struct fs_itab *t, uint64_t dev,
				   uint64_t ino)
{
	return &t->buckets[hash_key(dev, ino) & (t->nbuckets - 1)];
}

static void hash_insert(struct fs_itab *t, struct fs_inode *n)
{
	struct fs_inode **b = bucket_of(t, n->dev, n->ino);

	n->hnext = *b;
	*b = n;
	t->count++;
}

static void hash_remove(struct fs_itab *t, struct fs_inode *n)
{
	struct fs_inode **pp = bucket_of(t, n->dev, n->ino);

	for (; *pp; pp = &(*pp)->hnext) {
		if (*pp == n) {
			*pp = n->hnext;
			n->hnext = NULL;
			t->count--;
			return;
		}
	}
	BUG("inode %llu not in its hash bucket", (unsigned long long)n->ino);
}

/* Double the bucket array; on allocation failure keep the old one. */
static void hash_grow(struct fs_itab *t)
{
	size_t nb = t->nbuckets * 2, i;
	struct fs_inode **nbk = calloc(nb, sizeof(*nbk));

	if (!nbk)
		return;
	for (i = 0; i < t->nbuckets; i++) {
		struct fs_inode *n = t->buckets[i], *next;

		for (; n; n = next) {
			struct fs_inode **b =
				&nbk[hash_key(n->dev, n->ino) & (nb - 1)];
			next = n->hnext;
			n->hnext = *b;
			*b = n;
		}
	}
	free(t->buckets);
	t->buckets = nbk;
	t->nbuckets = nb;
}

static struct fs_inode *find_locked(struct fs_itab *t, uint64_t dev,
				    uint64_t ino)
{
	struct fs_inode *n = *bucket_of(t, dev, ino);

	for (; n; n = n->hnext)
		if (n->dev == dev && n->ino == ino)
			return n;
	return NULL;
}

static struct fs_inode *inode_alloc(const struct stat *st)
{
	struct fs_inode *n = calloc(1, sizeof(*n));

	if (!n)
		return NULL;
	n->dev = st->st_dev;
	n->ino = st->st_ino;
	n->type = st->st_mode & S_IFMT;
	pthread_mutex_init(&n->append_lock, NULL);
	return n;
}

static void put_ref(struct fs_itab *t, struct fs_inode *n);

/* Free n if nothing holds it; drops the refs its links hold on parents. */
static void maybe_free(struct fs_itab *t, struct fs_inode *n)
{
	struct fs_link *l, *next;

	if (n->nlookup || n->refs || n == t->root)
		return;
	if (n->orphan) {
		struct fs_inode **p = &t->orphans;

		while (*p != n)
			p = &(*p)->onext;
		*p = n->onext;
	} else if (n->hnext || find_locked(t, n->dev, n->ino) == n) {
		hash_remove(t, n);
	}
	for (l = n->links; l; l = next) {
		struct fs_inode *p = l->parent;

		next = l->next;
		free(l);
		put_ref(t, p);
	}
	pthread_mutex_destroy(&n->append_lock);
	free(n);
}

static void put_ref(struct fs_itab *t, struct fs_inode *n)
{
	if (!n->refs)
		BUG("inode %llu ref underflow", (unsigned long long)n->ino);
	n->refs--;
	maybe_free(t, n);
}

static struct fs_link *link_find(struct fs_inode *n, struct fs_inode *parent,
				 const char *name, struct fs_link ***pprev)
{
	struct fs_link **pp = &n->links;

	for (; *pp; pp = &(*pp)->next) {
		if ((*pp)->parent == parent && !strcmp((*pp)->name, name)) {
			if (pprev)
				*pprev = pp;
			return *pp;
		}
	}
	return NULL;
}

/* Make (parent, name) the first link of n. -ENOMEM leaves n unchanged. */
static int link_add_front(struct fs_inode *n, struct fs_inode *parent,
			  const char *name)
{
	struct fs_link **pp, *l = link_find(n, parent, name, &pp);
	size_t len;

	if (l) {
		*pp = l->next;
		l->next = n->links;
		n->links = l;
		return 0;
	}
	len = strlen(name);
	l = malloc(sizeof(*l) + len + 1);
	if (!l)
		return -ENOMEM;
	memcpy(l->name, name, len + 1);
	l->parent = parent;
	parent->refs++;
	l->next = n->links;
	n->links = l;
	return 0;
}

/* Remove (parent, name) from n; may free parent and n. */
static void link_del(struct fs_itab *t, struct fs_inode *n,
		     struct fs_inode *parent, const char *name)
{
	struct fs_link **pp, *l = link_find(n, parent, name, &pp);

	if (!l)
		return;
	*pp = l->next;
	free(l);
	n->refs++; /* keep n while its parent may go */
	put_ref(t, parent);
	put_ref(t, n);
}

int fs_itab_new(const struct stat *root_st, struct fs_itab **out)
{
	struct fs_itab *t = calloc(1, sizeof(*t));

	*out = NULL;
	if (!t)
		return -ENOMEM;
	t->nbuckets = 1024;
	t->buckets = calloc(t->nbuckets, sizeof(*t->buckets));
	t->root = inode_alloc(root_st);
	if (!t->buckets || !t->root) {
		free(t->buckets);
		free(t->root);
		free(t);
		return -ENOMEM;
	}
	pthread_mutex_init(&t->lock, NULL);
	t->root->refs = 1;
	t->root->nlookup = 1;
	hash_insert(t, t->root);
	*out = t;
	return 0;
}

static void inode_destroy(struct fs_inode *n)
{
	struct fs_link *l, *ln;

	for (l = n->links; l; l = ln) {
		ln = l->next;
		free(l);
	}
	pthread_mutex_destroy(&n->append_lock);
	free(n);
}

void fs_itab_free(struct fs_itab *t)
{
	struct fs_inode *n, *next;
	size_t i;

	if (!t)
		return;
	for (i = 0; i < t->nbuckets; i++) {
		for (n = t->buckets[i]; n; n = next) {
			next = n->hnext;
			inode_destroy(n);
		}
	}
	for (n = t->orphans; n; n = next) {
		next = n->onext;
		inode_destroy(n);
	}
	free(t->buckets);
	pthread_mutex_destroy(&t->lock);
	free(t);
}

struct fs_inode *fs_itab_root(struct fs_itab *t)
{
	return t->root;
}

size_t fs_itab_count(struct fs_itab *t)
{
	size_t c;

	pthread_mutex_lock(&t->lock);
	c = t->count;
	pthread_mutex_unlock(&t->lock);
	return c;
}

uint64_t fs_itab_moves(struct fs_itab *t)
{
	return atomic_load(&t->moves);
}

int fs_itab_lookup(struct fs_itab *t, struct fs_inode *parent,
		   const char *name, const struct stat *st,
		   uint64_t nlookup_inc, struct fs_inode **out)
{
	return fs_itab_lookup_since(t, parent, name, st, nlookup_inc,
				    FS_ITAB_ANY, out);
}

int fs_itab_lookup_since(struct fs_itab *t, struct fs_inode *parent,
			 const char *name, const struct stat *st,
			 uint64_t nlookup_inc, uint64_t since,
			 struct fs_inode **out)
{
	struct fs_inode *n;
	bool fresh = false;
	int rc;

	pthread_mutex_lock(&t->lock);
	n = find_locked(t, st->st_dev, st->st_ino);
	if (n && since != FS_ITAB_ANY && n->moved > since) {
		pthread_mutex_unlock(&t->lock);
		return -EAGAIN; /* the answer may predate that move */
	}
	if (n && n != t->root && n->type != (st->st_mode & S_IFMT)) {
		/* the remote reused the inode number for another object:
		 * the old inode stays reachable by the kernel until forgotten
		 * but is no longer found by key */
		hash_remove(t, n);
		n->orphan = true;
		n->onext = t->orphans;
		t->orphans = n;
		n = NULL;
	}
	if (!n) {
		n = inode_alloc(st);
		if (!n) {
			pthread_mutex_unlock(&t->lock);
			return -ENOMEM;
		}
		fresh = true;
	}
	if (n != t->root) {
		rc = link_add_front(n, parent, name);
		if (rc < 0) {
			if (fresh) {
				pthread_mutex_destroy(&n->append_lock);
				free(n);
			}
			pthread_mutex_unlock(&t->lock);
			return rc;
		}
	}
	if (fresh) {
		hash_insert(t, n);
		if (t->count > t->nbuckets)
			hash_grow(t);
	}
	n->nlookup += nlookup_inc;
	pthread_mutex_unlock(&t->lock);
	*out = n;
	return 0;
}

uint64_t fs_itab_parent_ino(struct fs_itab *t, struct fs_inode *n)
{
	uint64_t ino;

	pthread_mutex_lock(&t->lock);
	ino = n->links ? n->links->parent->ino : n->ino;
	pthread_mutex_unlock(&t->lock);
	return ino;
}

void fs_itab_forget(struct fs_itab *t, struct fs_inode *n, uint64_t count)
{
	pthread_mutex_lock(&t->lock);
	if (count > n->nlookup)
		BUG("forget %llu of inode %llu with nlookup %llu",
		    (unsigned long long)count, (unsigned long long)n->ino,
		    (unsigned long long)n->nlookup);
	n->nlookup -= count;
	maybe_free(t, n);
	pthread_mutex_unlock(&t->lock);
}

struct fs_inode *fs_itab_find(struct fs_itab *t, dev_t dev, ino_t ino)
{
	struct fs_inode *n;

	pthread_mutex_lock(&t->lock);
	n = find_locked(t, dev, ino);
	pthread_mutex_unlock(&t->lock);
	return n;
}

void fs_itab_unlink(struct fs_itab *t, struct fs_inode *parent,
		    const char *name, dev_t dev, ino_t ino)
{
	struct fs_inode *n;
	uint64_t m;

	pthread_mutex_lock(&t->lock);
	n = find_locked(t, dev, ino);
	m = atomic_fetch_add(&t->moves, 1) + 1;
	if (n) {
		n->moved = m;
		link_del(t, n, parent, name);
	}
	pthread_mutex_unlock(&t->lock);
}

int fs_itab_rename(struct fs_itab *t, struct fs_inode *p1, const char *n1,
		   const struct stat *k1, struct fs_inode *p2, const char *n2,
		   const struct stat *k2, bool exchange)
{
	struct fs_inode *a, *b = NULL;
	uint64_t m;
	int rc = 0;

	pthread_mutex_lock(&t->lock);
	a = find_locked(t, k1->st_dev, k1->st_ino);
	if (k2)
		b = find_locked(t, k2->st_dev, k2->st_ino);
	if (a == b)
		b = NULL; /* rename between two links of one file: a no-op */
	m = atomic_fetch_add(&t->moves, 1) + 1;
	/* pin both while links move, so neither is freed half way */
	if (a) {
		a->refs++;
		a->moved = m;
	}
	if (b) {
		b->refs++;
		b->moved = m;
	}
	if (b) {
		link_del(t, b, p2, n2);
		if (exchange)
			rc = link_add_front(b, p1, n1);
	}
	if (a) {
		link_del(t, a, p1, n1);
		if (link_add_front(a, p2, n2) < 0)
			rc = -ENOMEM;
	}
	if (a)
		put_ref(t, a);
	if (b)
		put_ref(t, b);
	pthread_mutex_unlock(&t->lock);
	return rc;
}

int fs_itab_path_rel(struct fs_itab *t, struct fs_inode *ino, const char *name,
		     char *buf, size_t size, uint64_t *base)
{
	/* walk up collecting names, then write them root first */
	const char *parts[PATH_MAX / 2];
	size_t nparts = 0, pos = 0, i;
	struct fs_inode *n = ino;
	int rc = 0;

	if (size == 0)
		return -ENAMETOOLONG;
	pthread_mutex_lock(&t->lock);
	if (base)
		*base = 0;
	while (n != t->root || (base && n->id)) {
		if (base && n->id) {
			*base = n->id;
			break;
		}
		if (!n->links || nparts == PATH_MAX / 2) {
			rc = -ESTALE;
			goto out_unlock;
		}
		parts[nparts++] = n->links->name;
		n = n->links->parent;
	}
	for (i = nparts; i-- > 0;) {
		size_t len = strlen(parts[i]);

		if (pos + len + 2 > size) {
			rc = -ENAMETOOLONG;
			goto out_unlock;
		}
		memcpy(buf + pos, parts[i], len);
		pos += len;
		if (i > 0)
			buf[pos++] = '/';
	}
	if (name) {
		size_t len = strlen(name);

		if (pos + len + 2 > size) {
			rc = -ENAMETOOLONG;
			goto out_unlock;
		}
		if (pos)
			buf[pos++] = '/';
		memcpy(buf + pos, name, len);
		pos += len;
	}
	buf[pos] = '\0';
out_unlock:
	pthread_mutex_unlock(&t->lock);
	return rc;
}

int fs_itab_path(struct fs_itab *t, struct fs_inode *ino, const char *name,
		 char *buf, size_t size)
{
	return fs_itab_path_rel(t, ino, name, buf, size, NULL);
}

uint64_t fs_itab_id(struct fs_itab *t, struct fs_inode *n)
{
	uint64_t id;

	pthread_mutex_lock(&t->lock);
	id = n->id;
	pthread_mutex_unlock(&t->lock);
	return id;
}

int fs_itab_set_id(struct fs_itab *t, struct fs_inode *n, uint64_t id)
{
	int rc = 0;

	pthread_mutex_lock(&t->lock);
	if (n->id && n->id != id)
		rc = -ESTALE;
	else
		n->id = id;
	pthread_mutex_unlock(&t->lock);
	return rc;
}

void fs_itab_set_id_by_key(struct fs_itab *t, uint64_t dev, uint64_t ino,
			   uint64_t id)
{
	struct fs_inode *n;

	pthread_mutex_lock(&t->lock);
	n = find_locked(t, dev, ino);
	if (n && !n->id)
		n->id = id;
	pthread_mutex_unlock(&t->lock);
}

void fs_itab_move_id(struct fs_itab *t, uint64_t dev, uint64_t ino,
		     uint64_t from, uint64_t to)
{
	struct fs_inode *n;

	pthread_mutex_lock(&t->lock);
	n = find_locked(t, dev, ino);
	if (n && n->id == from)
		n->id = to;
	pthread_mutex_unlock(&t->lock);
}

int fs_itab_first_link(struct fs_itab *t, struct fs_inode *n,
		       struct fs_inode **parent, char *name)
{
	int rc = -ESTALE;

	pthread_mutex_lock(&t->lock);
	if (n->links) {
		*parent = n->links->parent;
		(*parent)->refs++;
		snprintf(name, NAME_MAX + 1, "%s", n->links->name);
		rc = 0;
	}
	pthread_mutex_unlock(&t->lock);
	return rc;
}

void fs_itab_unref(struct fs_itab *t, struct fs_inode *n)
{
	pthread_mutex_lock(&t->lock);
	put_ref(t, n);
	pthread_mutex_unlock(&t->lock);
}

void fs_itab_handle_add(struct fs_itab *t, struct fs_handle *h)
{
	pthread_mutex_lock(&t->lock);
	h->refs = 1;
	h->prev = NULL;
	h->next = h->inode->handles;
	if (h->next)
		h->next->prev = h;
	h->inode->handles = h;
	h->inode->refs++;
	pthread_mutex_unlock(&t->lock);
}

unsigned int fs_itab_cached_handles(struct fs_itab *t, struct fs_inode *ino)
{
	struct fs_handle *h;
	unsigned int n = 0;

	pthread_mutex_lock(&t->lock);
	for (h = ino->handles; h; h = h->next)
		n += !h->direct;
	pthread_mutex_unlock(&t->lock);
	return n;
}

unsigned int fs_itab_handles_other(struct fs_itab *t, struct fs_inode *ino,
				   const struct fs_handle *h)
{
	unsigned int n = 0;

	pthread_mutex_lock(&t->lock);
	for (struct fs_handle *o = ino->handles; o; o = o->next)
		n += o != h && !o->pt;
	pthread_mutex_unlock(&t->lock);
	return n;
}

unsigned int fs_itab_handles(struct fs_itab *t, struct fs_inode *ino,
			     struct fs_handle **out, unsigned int max)
{
	unsigned int n = 0;

	pthread_mutex_lock(&t->lock);
	for (struct fs_handle *h = ino->handles; h && n < max; h = h->next) {
		h->refs++;
		out[n++] = h;
	}
	pthread_mutex_unlock(&t->lock);
	return n;
}

struct fs_handle *fs_itab_handle_any(struct fs_itab *t, struct fs_inode *ino)
{
	struct fs_handle *h;

	pthread_mutex_lock(&t->lock);
	for (h = ino->handles; h && h->id; h = h->next)
		;
	if (h)
		h->refs++;
	pthread_mutex_unlock(&t->lock);
	return h;
}

bool fs_itab_handle_put(struct fs_itab *t, struct fs_handle *h)
{
	bool last;

	pthread_mutex_lock(&t->lock);
	last = --h->refs == 0;
	if (last) {
		if (h->prev)
			h->prev->next = h->next;
		else
			h->inode->handles = h->next;
		if (h->next)
			h->next->prev = h->prev;
		put_ref(t, h->inode);
	}
	pthread_mutex_unlock(&t->lock);
	return last;
}

/* Move @n's open handles to the front of the list *@taken; @n keeps the
 * refs they held (dropped by the caller, outside any walk of the table). */
static void take_handles(struct fs_inode *n, struct fs_handle **taken)
{
	struct fs_handle *h, *next;

	for (h = n->handles; h; h = next) {
		next = h->next;
		if (h->refs != 1) /* a borrower, yet no request runs */
			BUG("handle of inode %llu taken with %u refs",
			    (unsigned long long)n->ino, h->refs);
		h->refs = 0;
		h->prev = NULL;
		h->next = *taken;
		*taken = h;
	}
	n->handles = NULL;
}

struct fs_handle *fs_itab_handles_take(struct fs_itab *t)
{
	struct fs_handle *taken = NULL, *h;
	struct fs_inode *n;
	size_t i;

	pthread_mutex_lock(&t->lock);
	for (i = 0; i < t->nbuckets; i++)
		for (n = t->buckets[i]; n; n = n->hnext)
			take_handles(n, &taken);
	for (n = t->orphans; n; n = n->onext)
		take_handles(n, &taken);
	/* now that no walk is under way: the inodes may go */
	for (h = taken; h; h = h->next)
		put_ref(t, h->inode);
	pthread_mutex_unlock(&t->lock);
	return taken;
}

static bool same_time(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

bool fs_itab_keep_cache(struct fs_itab *t, struct fs_inode *ino,
			const struct stat *st)
{
	bool keep;

	pthread_mutex_lock(&t->lock);
	keep = ino->cache_known && ino->cache_size == st->st_size &&
	       same_time(&ino->cache_mtime, &st->st_mtim);
	ino->cache_known = true;
	ino->cache_size = st->st_size;
	ino->cache_mtime = st->st_mtim;
	pthread_mutex_unlock(&t->lock);
	return keep;
}

void fs_itab_cache_update(struct fs_itab *t, struct fs_inode *ino,
			  const struct stat *st)
{
	pthread_mutex_lock(&t->lock);
	if (ino->cache_known) {
		ino->cache_size = st->st_size;
		ino->cache_mtime = st->st_mtim;
	}
	pthread_mutex_unlock(&t->lock);
}

void fs_itab_assert_sane(struct fs_itab *t)
{
	size_t i, count = 0;

	pthread_mutex_lock(&t->lock);
	for (i = 0; i < t->nbuckets; i++) {
		struct fs_inode *n;

		for (n = t->buckets[i]; n; n = n->hnext) {
			struct fs_link *l, *m;

			count++;
			if (find_locked(t, n->dev, n->ino) != n)
				BUG("key of inode %llu found twice",
				    (unsigned long long)n->ino);
			if (n != t->root && !n->nlookup && !n->refs)
				BUG("inode %llu kept with no lookup and no ref",
				    (unsigned long long)n->ino);
			for (l = n->links; l; l = l->next) {
				if (!l->parent->refs)
					BUG("parent of '%s' has no ref",
					    l->name);
				for (m = l->next; m; m = m->next)
					if (m->parent == l->parent &&
					    !strcmp(m->name, l->name))
						BUG("link '%s' twice", l->name);
			}
		}
	}
	if (count != t->count)
		BUG("inode count %zu, table says %zu", count, t->count);
	pthread_mutex_unlock(&t->lock);
}
