/*
 * test_fs.c - unit tests of fs/: the inode table (fs_i.h), the command
 * line (fs_opts_parse) and the control socket's directory of a user's
 * daemon (fs_ctl_start() in a child as uid 65534). No mount: mount-level
 * tests live in tests/it/ (it_ctl_dir.sh: root's directory).
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include <dirent.h>
#include <ftw.h>
#include <grp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "fs.h"
#include "fs_i.h"

#include "test_util.h"

static struct stat mkst(uint64_t ino, mode_t type)
{
	struct stat st;

	memset(&st, 0, sizeof(st));
	st.st_dev = 7;
	st.st_ino = ino;
	st.st_mode = type | 0755;
	return st;
}

static int setup(void **state)
{
	struct stat root = mkst(2, S_IFDIR);
	struct fs_itab *t;

	assert_rc_ok(fs_itab_new(&root, &t));
	*state = t;
	return 0;
}

static int teardown(void **state)
{
	fs_itab_free(*state);
	return 0;
}

static void assert_path(struct fs_itab *t, struct fs_inode *n,
			const char *name, const char *want)
{
	char buf[PATH_MAX];

	assert_rc_ok(fs_itab_path(t, n, name, buf, sizeof(buf)));
	assert_string_equal(buf, want);
}

static void test_fs__lookup_builds_paths(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *a, *b, *again;
	struct stat sa = mkst(10, S_IFDIR), sb = mkst(11, S_IFREG);

	assert_path(t, root, NULL, "");
	assert_path(t, root, "x", "x");
	assert_rc_ok(fs_itab_lookup(t, root, "a", &sa, 1, &a));
	assert_rc_ok(fs_itab_lookup(t, a, "b", &sb, 1, &b));
	fs_itab_assert_sane(t);
	assert_path(t, a, NULL, "a");
	assert_path(t, b, NULL, "a/b");
	assert_path(t, a, "c", "a/c");
	assert_rc_ok(fs_itab_lookup(t, root, "a", &sa, 1, &again));
	assert_ptr_equal(again, a);
	assert_int_equal(a->nlookup, 2);
	assert_int_equal(fs_itab_count(t), 3);
	assert_ptr_equal(fs_itab_find(t, 7, 11), b);
	assert_null(fs_itab_find(t, 7, 99));
	fs_itab_assert_sane(t);
}

/* write-back: paths are relative to the nearest inode the journal knows */
static void test_fs__path_rel_stops_at_journal_id(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *a, *b, *c, *parent;
	struct stat sa = mkst(10, S_IFDIR), sb = mkst(11, S_IFDIR),
		    sc = mkst(12, S_IFREG);
	char buf[PATH_MAX], name[NAME_MAX + 1];
	uint64_t base;

	assert_rc_ok(fs_itab_lookup(t, root, "a", &sa, 1, &a));
	assert_rc_ok(fs_itab_lookup(t, a, "b", &sb, 1, &b));
	assert_rc_ok(fs_itab_lookup(t, b, "c", &sc, 1, &c));
	/* no ids: from the root, base 0 */
	assert_rc_ok(fs_itab_path_rel(t, c, NULL, buf, sizeof(buf), &base));
	assert_string_equal(buf, "a/b/c");
	assert_int_equal(base, 0);
	/* the root and a known */
	assert_rc_ok(fs_itab_set_id(t, root, 1));
	assert_rc_ok(fs_itab_set_id(t, a, 42));
	assert_int_equal(fs_itab_id(t, a), 42);
	assert_rc_ok(fs_itab_path_rel(t, c, "x", buf, sizeof(buf), &base));
	assert_string_equal(buf, "b/c/x");
	assert_int_equal(base, 42);
	/* an inode with an id is its own base */
	assert_rc_ok(fs_itab_path_rel(t, a, NULL, buf, sizeof(buf), &base));
	assert_string_equal(buf, "");
	assert_int_equal(base, 42);
	/* fs_itab_path ignores ids */
	assert_path(t, c, NULL, "a/b/c");
	/* an id is set once */
	assert_rc_ok(fs_itab_set_id(t, a, 42));
	assert_int_equal(fs_itab_set_id(t, a, 43), -ESTALE);
	/* by key, only where none is set */
	fs_itab_set_id_by_key(t, 7, 11, 50);
	fs_itab_set_id_by_key(t, 7, 10, 51);
	assert_int_equal(fs_itab_id(t, b), 50);
	assert_int_equal(fs_itab_id(t, a), 42);
	fs_itab_set_id_by_key(t, 7, 99, 52); /* unknown: nothing */
	/* the first link, with a ref on the parent */
	assert_rc_ok(fs_itab_first_link(t, c, &parent, name));
	assert_ptr_equal(parent, b);
	assert_string_equal(name, "c");
	fs_itab_unref(t, parent);
	fs_itab_assert_sane(t);
}

static void test_fs__forget_frees_child_then_parent(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *a, *b;
	struct stat sa = mkst(10, S_IFDIR), sb = mkst(11, S_IFREG);

	assert_rc_ok(fs_itab_lookup(t, root, "a", &sa, 1, &a));
	assert_rc_ok(fs_itab_lookup(t, a, "b", &sb, 1, &b));
	/* the kernel may forget the parent first: the child pins it */
	fs_itab_forget(t, a, 1);
	fs_itab_assert_sane(t);
	assert_int_equal(fs_itab_count(t), 3);
	assert_path(t, b, NULL, "a/b");
	fs_itab_forget(t, b, 1);
	fs_itab_assert_sane(t);
	assert_int_equal(fs_itab_count(t), 1);
}

static void test_fs__hard_links_and_unlink(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *x, *y;
	struct stat sf = mkst(20, S_IFREG);
	char buf[PATH_MAX];

	assert_rc_ok(fs_itab_lookup(t, root, "one", &sf, 1, &x));
	assert_rc_ok(fs_itab_lookup(t, root, "two", &sf, 1, &y));
	assert_ptr_equal(x, y);
	assert_path(t, x, NULL, "two"); /* the latest name first */
	fs_itab_unlink(t, root, "two", 7, 20);
	fs_itab_assert_sane(t);
	assert_path(t, x, NULL, "one");
	fs_itab_unlink(t, root, "one", 7, 20);
	fs_itab_assert_sane(t);
	assert_int_equal(fs_itab_path(t, x, NULL, buf, sizeof(buf)), -ESTALE);
	/* still known to the kernel: alive until forgotten */
	assert_int_equal(fs_itab_count(t), 2);
	fs_itab_forget(t, x, 2);
	assert_int_equal(fs_itab_count(t), 1);
	fs_itab_assert_sane(t);
}

static void test_fs__rename_moves_subtree(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *d, *e, *f, *g;
	struct stat sd = mkst(30, S_IFDIR), se = mkst(31, S_IFDIR),
		    sf = mkst(32, S_IFREG), sg = mkst(33, S_IFREG);

	assert_rc_ok(fs_itab_lookup(t, root, "d", &sd, 1, &d));
	assert_rc_ok(fs_itab_lookup(t, root, "e", &se, 1, &e));
	assert_rc_ok(fs_itab_lookup(t, d, "f", &sf, 1, &f));
	assert_rc_ok(fs_itab_lookup(t, e, "g", &sg, 1, &g));
	assert_rc_ok(fs_itab_rename(t, root, "d", &sd, e, "d2", NULL, false));
	fs_itab_assert_sane(t);
	assert_path(t, f, NULL, "e/d2/f");
	/* over an existing name: the old object loses it */
	assert_rc_ok(fs_itab_rename(t, d, "f", &sf, e, "g", &sg, false));
	fs_itab_assert_sane(t);
	assert_path(t, f, NULL, "e/g");
	{
		char buf[PATH_MAX];

		assert_int_equal(fs_itab_path(t, g, NULL, buf, sizeof(buf)),
				 -ESTALE);
	}
	/* exchange swaps */
	{
		struct stat sz = mkst(34, S_IFDIR);
		struct fs_inode *z;

		assert_rc_ok(fs_itab_lookup(t, root, "z", &sz, 1, &z));
		assert_rc_ok(fs_itab_rename(t, root, "z", &sz, e, "d2", &sd,
					    true));
		fs_itab_assert_sane(t);
		assert_path(t, d, NULL, "z");
		assert_path(t, z, NULL, "e/d2");
		assert_path(t, f, NULL, "e/g");
		assert_path(t, d, "x", "z/x");
	}
}

/* A LOOKUP answered from before a rename or unlink of the object it found
 * does not give the object its old name back: -EAGAIN, nothing changed */
static void test_fs__lookup_since_a_move_asks_again(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *a, *b, *f, *x;
	struct stat sa = mkst(40, S_IFDIR), sb = mkst(41, S_IFDIR),
		    sf = mkst(42, S_IFREG), sx = mkst(43, S_IFREG);
	uint64_t since;

	assert_rc_ok(fs_itab_lookup(t, root, "a", &sa, 1, &a));
	assert_rc_ok(fs_itab_lookup(t, root, "b", &sb, 1, &b));
	assert_rc_ok(fs_itab_lookup(t, b, "f", &sf, 1, &f));
	/* "b/f is f" asked before the rename b/f -> a/f, recorded after */
	since = fs_itab_moves(t);
	assert_rc_ok(fs_itab_rename(t, b, "f", &sf, a, "f", NULL, false));
	assert_int_equal(fs_itab_lookup_since(t, b, "f", &sf, 1, since, &x),
			 -EAGAIN);
	fs_itab_assert_sane(t);
	assert_path(t, f, NULL, "a/f");
	/* asked again after it: taken */
	since = fs_itab_moves(t);
	assert_rc_ok(fs_itab_lookup_since(t, a, "f", &sf, 1, since, &x));
	assert_ptr_equal(x, f);
	fs_itab_forget(t, f, 1);
	/* a move of another object does not matter */
	assert_rc_ok(fs_itab_lookup(t, root, "x", &sx, 1, &x));
	since = fs_itab_moves(t);
	assert_rc_ok(fs_itab_rename(t, root, "x", &sx, b, "x", NULL, false));
	assert_rc_ok(fs_itab_lookup_since(t, a, "f", &sf, 1, since, &x));
	assert_ptr_equal(x, f);
	fs_itab_forget(t, f, 1);
	/* an unlink of f does */
	since = fs_itab_moves(t);
	fs_itab_unlink(t, a, "f", sf.st_dev, sf.st_ino);
	assert_int_equal(fs_itab_lookup_since(t, a, "f", &sf, 1, since, &x),
			 -EAGAIN);
	assert_rc_ok(fs_itab_lookup_since(t, a, "f", &sf, 1, FS_ITAB_ANY,
					  &x));
	assert_path(t, f, NULL, "a/f");
	fs_itab_assert_sane(t);
}

static void test_fs__reused_ino_of_other_type_is_new_inode(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *a, *b;
	struct stat sf = mkst(40, S_IFREG), sd = mkst(40, S_IFDIR);

	assert_rc_ok(fs_itab_lookup(t, root, "a", &sf, 1, &a));
	assert_rc_ok(fs_itab_lookup(t, root, "a", &sd, 1, &b));
	assert_ptr_not_equal(a, b);
	assert_ptr_equal(fs_itab_find(t, 7, 40), b);
	fs_itab_forget(t, a, 1);
	fs_itab_forget(t, b, 1);
	fs_itab_assert_sane(t);
}

static void test_fs__path_too_long(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *n = fs_itab_root(t);
	char name[200], buf[PATH_MAX];
	uint64_t i;

	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	for (i = 0; i < 30; i++) {
		struct stat st = mkst(100 + i, S_IFDIR);

		assert_rc_ok(fs_itab_lookup(t, n, name, &st, 1, &n));
	}
	assert_int_equal(fs_itab_path(t, n, NULL, buf, sizeof(buf)),
			 -ENAMETOOLONG);
	fs_itab_assert_sane(t);
}

static void test_fs__many_inodes_grow_table(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *n;
	char name[32];
	uint64_t i;

	for (i = 0; i < 5000; i++) {
		struct stat st = mkst(1000 + i, S_IFREG);

		snprintf(name, sizeof(name), "f%llu", (unsigned long long)i);
		assert_rc_ok(fs_itab_lookup(t, root, name, &st, 1, &n));
	}
	assert_int_equal(fs_itab_count(t), 5001);
	fs_itab_assert_sane(t);
	for (i = 0; i < 5000; i++) {
		n = fs_itab_find(t, 7, 1000 + i);
		assert_non_null(n);
		fs_itab_forget(t, n, 1);
	}
	assert_int_equal(fs_itab_count(t), 1);
	fs_itab_assert_sane(t);
}

static void test_fs__handles_pin_inode(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *x;
	struct stat sf = mkst(50, S_IFREG);
	struct fs_handle h = { 0 }, *b;

	assert_rc_ok(fs_itab_lookup(t, root, "x", &sf, 1, &x));
	h.inode = x;
	fs_itab_handle_add(t, &h);
	b = fs_itab_handle_any(t, x);
	assert_ptr_equal(b, &h);
	assert_false(fs_itab_handle_put(t, b));
	fs_itab_forget(t, x, 1);
	assert_int_equal(fs_itab_count(t), 2); /* the open handle pins it */
	assert_true(fs_itab_handle_put(t, &h));
	assert_int_equal(fs_itab_count(t), 1);
	fs_itab_assert_sane(t);
}

/* the end of a session: the handles the kernel never released */
static void test_fs__handles_take_all(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *d, *x, *y, *o, *od;
	struct stat sd = mkst(60, S_IFDIR), sx = mkst(61, S_IFREG),
		    sy = mkst(62, S_IFREG), so = mkst(63, S_IFREG),
		    sod = mkst(63, S_IFDIR);
	struct fs_handle h[4] = { { 0 } }, *l;
	bool seen[4] = { false };
	int i, n = 0;

	assert_null(fs_itab_handles_take(t));
	assert_rc_ok(fs_itab_lookup(t, root, "d", &sd, 1, &d));
	assert_rc_ok(fs_itab_lookup(t, d, "x", &sx, 1, &x));
	assert_rc_ok(fs_itab_lookup(t, root, "y", &sy, 1, &y));
	assert_rc_ok(fs_itab_lookup(t, root, "o", &so, 1, &o));
	h[0].inode = x;
	h[1].inode = y;
	h[2].inode = y;
	h[3].inode = o;
	for (i = 0; i < 4; i++)
		fs_itab_handle_add(t, &h[i]);
	fs_itab_forget(t, x, 1); /* x pinned by its handle, d by x */
	fs_itab_forget(t, d, 1);
	/* the share reused o's number for a directory: o is an orphan */
	assert_rc_ok(fs_itab_lookup(t, root, "o", &sod, 1, &od));
	assert_ptr_not_equal(o, od);
	assert_int_equal(fs_itab_count(t), 5);
	fs_itab_assert_sane(t);

	for (l = fs_itab_handles_take(t); l; l = l->next, n++) {
		assert_true(l >= h && l < h + 4);
		assert_false(seen[l - h]);
		seen[l - h] = true;
		assert_int_equal(l->refs, 0);
	}
	assert_int_equal(n, 4);
	assert_int_equal(fs_itab_count(t), 3); /* d and x went */
	assert_null(fs_itab_find(t, 7, 60));
	assert_null(fs_itab_find(t, 7, 61));
	assert_null(fs_itab_handle_any(t, y));
	assert_null(fs_itab_handles_take(t));
	fs_itab_assert_sane(t);
	fs_itab_forget(t, o, 1); /* frees the orphan: its handle ref is gone */
	fs_itab_forget(t, y, 1);
	fs_itab_forget(t, od, 1);
	assert_int_equal(fs_itab_count(t), 1);
	fs_itab_assert_sane(t);
}

static void test_fs__keep_cache_close_to_open(void **state)
{
	struct fs_itab *t = *state;
	struct fs_inode *root = fs_itab_root(t), *x;
	struct stat sf = mkst(60, S_IFREG);

	assert_rc_ok(fs_itab_lookup(t, root, "x", &sf, 1, &x));
	sf.st_size = 10;
	assert_false(fs_itab_keep_cache(t, x, &sf)); /* first open */
	assert_true(fs_itab_keep_cache(t, x, &sf));
	sf.st_mtim.tv_nsec = 5;
	assert_false(fs_itab_keep_cache(t, x, &sf)); /* changed remotely */
	sf.st_size = 20;
	fs_itab_cache_update(t, x, &sf); /* our own write */
	assert_true(fs_itab_keep_cache(t, x, &sf));
	fs_itab_forget(t, x, 1);
}

/* --- options --------------------------------------------------------- */

static int parse(struct fuse_args *args, struct fs_opts *o, char *err,
		 int argc, ...)
{
	char *argv[16];
	va_list ap;
	int i;

	va_start(ap, argc);
	for (i = 0; i < argc; i++)
		argv[i] = va_arg(ap, char *);
	va_end(ap);
	return fs_opts_parse(argc, argv, args, o, err, 256);
}

static bool has_arg(const struct fuse_args *args, const char *want)
{
	int i;

	for (i = 0; i < args->argc; i++)
		if (!strcmp(args->argv[i], want))
			return true;
	return false;
}

static void test_fs__opts_mount_verb_and_defaults(void **state)
{
	struct fuse_args args;
	struct fs_opts o;
	char err[256];

	(void)state;
	assert_rc_ok(parse(&args, &o, err, 6, "ferryfs", "mount", "/srv/a,b",
			   "/mnt", "-o", "attr_timeout=2.5,ro"));
	assert_string_equal(o.remote, "/srv/a,b");
	assert_string_equal(o.mountpoint, "/mnt");
	assert_true(o.attr_timeout == 2.5);
	assert_true(o.entry_timeout == 1.0);
	assert_false(o.foreground);
	assert_true(has_arg(&args, "-odefault_permissions"));
	assert_true(has_arg(&args, "-osubtype=ferryfs"));
	assert_true(has_arg(&args, "-ofsname=/srv/a\\,b"));
	/* left for libfuse, in whatever form fuse_opt keeps it */
	assert_true(has_arg(&args, "-oro") || has_arg(&args, "ro"));
	assert_false(has_arg(&args, "attr_timeout=2.5"));
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
}

static void test_fs__opts_fstab_form_and_flags(void **state)
{
	struct fuse_args args;
	struct fs_opts o;
	char err[256];

	(void)state;
	assert_rc_ok(parse(&args, &o, err, 5, "ferryfs", "/srv", "/mnt", "-d",
			   "-s"));
	assert_string_equal(o.remote, "/srv");
	assert_true(o.debug);
	assert_true(o.foreground);
	assert_true(o.single_thread);
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
}

/* fuse_opt stores an int at a flag's offset: the flag is set and its
 * neighbours keep their values */
static void test_fs__opts_flags_keep_their_neighbours(void **state)
{
	struct fuse_args args;
	struct fs_opts o;
	char err[256];

	(void)state;
	assert_rc_ok(parse(&args, &o, err, 6, "ferryfs", "/srv", "/mnt", "-s",
			   "-o", "no_direct_write,noallow_other,agent=h:1,"
			   "agent_key=/k,agent_encrypt"));
	assert_true(o.single_thread);
	assert_false(o.show_help);
	assert_false(o.show_version);
	assert_true(o.no_direct_write);
	assert_true(o.no_allow_other);
	assert_int_equal(o.max_threads, 16);
	assert_true(o.agent_encrypt);
	assert_string_equal(o.agent, "h:1");
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
}

static void test_fs__opts_remote_options_go_to_the_remote(void **state)
{
	struct fuse_args args;
	struct fs_opts o;
	char err[256];

	(void)state;
	assert_rc_ok(parse(&args, &o, err, 5, "ferryfs", "/srv", "/mnt", "-o",
			   "remote_rate=110M,ro,remote_latency=1ms"));
	assert_non_null(o.remote_opts);
	assert_string_equal(o.remote_opts, "remote_rate=110M,remote_latency=1ms");
	assert_false(has_arg(&args, "remote_rate=110M"));
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
}

static void test_fs__opts_errors(void **state)
{
	struct fuse_args args;
	struct fs_opts o;
	char err[256];

	(void)state;
	assert_int_equal(parse(&args, &o, err, 2, "ferryfs", "/srv"), -EINVAL);
	assert_non_null(strstr(err, "MOUNTPOINT"));
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	assert_int_equal(parse(&args, &o, err, 4, "ferryfs", "a", "b", "c"),
			 -EINVAL);
	assert_non_null(strstr(err, "'c'"));
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	assert_int_equal(parse(&args, &o, err, 5, "ferryfs", "a", "b", "-o",
			       "max_threads=0"),
			 -EINVAL);
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	assert_rc_ok(parse(&args, &o, err, 2, "ferryfs", "--version"));
	assert_true(o.show_version);
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
}

static void test_fs__opts_writeback(void **state)
{
	struct fuse_args args;
	struct fs_opts o;
	char err[256];

	(void)state;
	assert_rc_ok(parse(&args, &o, err, 3, "ferryfs", "/srv", "/mnt"));
	assert_true(o.writeback);
	assert_int_equal(o.streams, 4);
	assert_false(o.sync_remote);
	assert_null(o.journal);
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	assert_rc_ok(parse(&args, &o, err, 5, "ferryfs", "/srv", "/mnt", "-o",
			   "writeback=off,journal=/j,streams=8,chunk_size=1Mi,"
			   "sync=remote,bwlimit=50M,journal_max=2Gi,"
			   "verify=readback"));
	assert_false(o.writeback);
	assert_string_equal(o.journal, "/j");
	assert_int_equal(o.streams, 8);
	assert_int_equal(o.chunk_size, 1u << 20);
	assert_true(o.sync_remote);
	assert_true(o.verify);
	assert_int_equal(o.bwlimit, 50000000);
	assert_int_equal(o.journal_max, 2ull << 30);
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	assert_int_equal(parse(&args, &o, err, 5, "ferryfs", "/srv", "/mnt",
			       "-o", "writeback=maybe"),
			 -EINVAL);
	assert_non_null(strstr(err, "writeback"));
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	assert_int_equal(parse(&args, &o, err, 5, "ferryfs", "/srv", "/mnt",
			       "-o", "chunk_size=3M"),
			 -EINVAL);
	assert_non_null(strstr(err, "power of two"));
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	assert_int_equal(parse(&args, &o, err, 5, "ferryfs", "/srv", "/mnt",
			       "-o", "streams=0"),
			 -EINVAL);
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	assert_int_equal(parse(&args, &o, err, 5, "ferryfs", "/srv", "/mnt",
			       "-o", "bwlimit=fast"),
			 -EINVAL);
	assert_non_null(strstr(err, "bwlimit"));
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
}

/* --- the control socket's directory (ctl.c invariant 4) ----------------- */

#define OTHER_UID 65534

static int ctl_handler(void *arg, const char *cmd, char **reply)
{
	(void)arg;
	(void)cmd;
	*reply = fs_reply_ok();
	return *reply ? 0 : -ENOMEM;
}

#define CHILD_CHECK(cond)                                                  \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "child: %s:%d: %s\n", __FILE__,    \
				__LINE__, #cond);                          \
			_exit(1);                                          \
		}                                                          \
	} while (0)

/* count of ctl-*.sock in @dir, -1 if it cannot be read */
static int sockets_in(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += !strncmp(e->d_name, "ctl-", 4);
	closedir(d);
	return n;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
		    struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

/*
 * A user's daemon (uid 65534 here): with XDG_RUNTIME_DIR its own 0700
 * directory, the socket goes in $XDG_RUNTIME_DIR/ferryfs, made 0700 and
 * the user's, and is gone after fs_ctl_stop(); a $XDG_RUNTIME_DIR/ferryfs
 * made by someone else (root) first is refused with the reason. Uses "/"
 * as the mount point: it is in mountinfo, which is all fs_ctl_start()
 * asks of it.
 */
static void test_fs__ctl_dir_user(void **state)
{
	char good[] = "/tmp/test_fs_ctl.XXXXXX", bad[] = "/tmp/test_fs_ctl.XXXXXX";
	char sub[PATH_MAX];
	pid_t pid;
	int status;

	(void)state;
	if (geteuid() != 0)
		skip();
	assert_non_null(mkdtemp(good));
	assert_non_null(mkdtemp(bad));
	snprintf(sub, sizeof(sub), "%s/ferryfs", bad);
	assert_int_equal(mkdir(sub, 0700), 0); /* root's */
	assert_int_equal(chown(good, OTHER_UID, OTHER_UID), 0);
	assert_int_equal(chown(bad, OTHER_UID, OTHER_UID), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct fs_ctl *c;
		char why[PATH_MAX + 128], dir[PATH_MAX];
		struct stat st;

		CHILD_CHECK(setgroups(0, NULL) == 0);
		CHILD_CHECK(setgid(OTHER_UID) == 0);
		CHILD_CHECK(setuid(OTHER_UID) == 0);
		setenv("XDG_RUNTIME_DIR", good, 1);
		CHILD_CHECK(fs_ctl_start("/", ctl_handler, NULL, &c, why,
					 sizeof(why)) == 0);
		snprintf(dir, sizeof(dir), "%s/ferryfs", good);
		CHILD_CHECK(lstat(dir, &st) == 0 && S_ISDIR(st.st_mode));
		CHILD_CHECK((st.st_mode & 07777) == 0700);
		CHILD_CHECK(st.st_uid == OTHER_UID);
		CHILD_CHECK(sockets_in(dir) == 1);
		fs_ctl_stop(c);
		CHILD_CHECK(sockets_in(dir) == 0);

		setenv("XDG_RUNTIME_DIR", bad, 1);
		CHILD_CHECK(fs_ctl_start("/", ctl_handler, NULL, &c, why,
					 sizeof(why)) == -EPERM);
		CHILD_CHECK(strstr(why, "is owned by uid 0, not by uid 65534"));
		fprintf(stderr, "child: refused: %s\n", why);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	nftw(good, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	nftw(bad, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
		T(test_fs__lookup_builds_paths),
		T(test_fs__forget_frees_child_then_parent),
		T(test_fs__hard_links_and_unlink),
		T(test_fs__rename_moves_subtree),
		T(test_fs__lookup_since_a_move_asks_again),
		T(test_fs__reused_ino_of_other_type_is_new_inode),
		T(test_fs__path_too_long),
		T(test_fs__many_inodes_grow_table),
		T(test_fs__handles_pin_inode),
		T(test_fs__handles_take_all),
		T(test_fs__keep_cache_close_to_open),
		T(test_fs__path_rel_stops_at_journal_id),
		cmocka_unit_test(test_fs__opts_writeback),
		cmocka_unit_test(test_fs__opts_mount_verb_and_defaults),
		cmocka_unit_test(test_fs__opts_fstab_form_and_flags),
		cmocka_unit_test(test_fs__opts_flags_keep_their_neighbours),
		cmocka_unit_test(test_fs__opts_remote_options_go_to_the_remote),
		cmocka_unit_test(test_fs__opts_errors),
		cmocka_unit_test(test_fs__ctl_dir_user),
#undef T
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
