/*
 * test_remote.c - unit tests of remote/: rmt_path_check() and the path
 * driver (remote/path.c) on a private temp dir.
 *
 * Each case gets a fresh mkdtemp() dir:
 *   <tmp>/root            the share, opened with rmt_open()
 *   <tmp>/outside/secret  a file no operation may reach or change
 * The confinement cases add symlinks in root that point out of it and check
 * after every step that nothing outside changed (assert_outside_sane()).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>

#include "remote.h"

#include "test_util.h"
#include "utf8.h"

#define SECRET "secret\n"

struct fx {
	char tmp[PATH_MAX]; /* mkdtemp(); removed by teardown */
	char root[PATH_MAX]; /* <tmp>/root, the share */
	char outside[PATH_MAX]; /* <tmp>/outside */
	char secret[PATH_MAX]; /* <tmp>/outside/secret */
	struct stat secret_st; /* lstat of secret after setup */
	bool secret_xattr; /* secret carries user.secret */
	struct rmt *r;
};

/* --- host-side helpers (plain syscalls, not through the remote) -------- */

static void host_path(char *buf, const char *dir, const char *rel)
{
	int n = snprintf(buf, PATH_MAX, "%s/%s", dir, rel);

	assert_true(n > 0 && n < PATH_MAX);
}

static void host_write(const char *path, const char *data)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, strlen(data)), strlen(data));
	assert_int_equal(close(fd), 0);
}

static bool host_exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

static int rm_one(const char *path, const struct stat *st, int type,
		  struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (type == FTW_DP)
		return rmdir(path);
	return unlink(path);
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

/* Nothing in <tmp>/outside, nor <tmp> itself, changed since setup. */
static void assert_outside_sane(const struct fx *fx)
{
	const struct stat *a = &fx->secret_st;
	char buf[64] = { 0 };
	struct stat b;
	int fd;

	assert_int_equal(lstat(fx->secret, &b), 0);
	assert_int_equal(a->st_ino, b.st_ino);
	assert_int_equal(a->st_mode, b.st_mode);
	assert_int_equal(a->st_uid, b.st_uid);
	assert_int_equal(a->st_gid, b.st_gid);
	assert_int_equal(a->st_nlink, b.st_nlink);
	assert_int_equal(a->st_size, b.st_size);
	assert_int_equal(a->st_mtim.tv_sec, b.st_mtim.tv_sec);
	assert_int_equal(a->st_mtim.tv_nsec, b.st_mtim.tv_nsec);
	assert_int_equal(a->st_ctim.tv_sec, b.st_ctim.tv_sec);
	assert_int_equal(a->st_ctim.tv_nsec, b.st_ctim.tv_nsec);
	fd = open(fx->secret, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, buf, sizeof(buf) - 1), strlen(SECRET));
	close(fd);
	assert_string_equal(buf, SECRET);
	if (fx->secret_xattr) {
		memset(buf, 0, sizeof(buf));
		assert_int_equal(getxattr(fx->secret, "user.secret", buf,
					  sizeof(buf)),
				 1);
		assert_string_equal(buf, "s");
	}
	assert_int_equal(count_entries(fx->outside), 1);
	assert_int_equal(count_entries(fx->tmp), 2); /* root, outside */
}

/* --- remote-side helpers ----------------------------------------------- */

static void put_file(struct rmt *r, const char *path, const void *data,
		     size_t len)
{
	struct rmt_file *f;

	assert_rc_ok(
		rmt_file_open(r, path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f));
	assert_int_equal(rmt_file_pwrite(f, data, len, 0), len);
	assert_rc_ok(rmt_file_close(f));
}

static void assert_file_is(struct rmt *r, const char *path, const char *want)
{
	size_t len = strlen(want);
	char *buf = calloc(1, len + 16);
	struct rmt_file *f;

	assert_non_null(buf);
	assert_rc_ok(rmt_file_open(r, path, O_RDONLY, 0, &f));
	assert_int_equal(rmt_file_pread(f, buf, len + 16, 0), len);
	assert_memory_equal(buf, want, len);
	assert_rc_ok(rmt_file_close(f));
	free(buf);
}

static mode_t mode_of(struct rmt *r, const char *path)
{
	struct stat st;

	assert_rc_ok(rmt_stat(r, path, &st));
	return st.st_mode;
}

/* --- fixtures ---------------------------------------------------------- */

static int setup(void **state)
{
	struct fx *fx = calloc(1, sizeof(*fx));

	assert_non_null(fx);
	strcpy(fx->tmp, "/tmp/ferryfs-test-remote-XXXXXX");
	assert_non_null(mkdtemp(fx->tmp));
	host_path(fx->root, fx->tmp, "root");
	host_path(fx->outside, fx->tmp, "outside");
	host_path(fx->secret, fx->outside, "secret");
	assert_int_equal(mkdir(fx->root, 0755), 0);
	assert_int_equal(mkdir(fx->outside, 0755), 0);
	host_write(fx->secret, SECRET);
	fx->secret_xattr = setxattr(fx->secret, "user.secret", "s", 1, 0) == 0;
	assert_int_equal(lstat(fx->secret, &fx->secret_st), 0);
	assert_rc_ok(rmt_open(fx->root, NULL, &fx->r));
	*state = fx;
	return 0;
}

/* setup() plus symlinks in root that lead out of it. */
static int setup_links(void **state)
{
	static const char *const links[][2] = {
		{ "toroot", "/" },
		{ "up", "../outside" },
		{ "rel", "../outside/secret" },
		{ "dotdot", ".." },
	};
	char path[PATH_MAX];
	struct fx *fx;
	size_t i;

	setup(state);
	fx = *state;
	for (i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
		host_path(path, fx->root, links[i][0]);
		assert_int_equal(symlink(links[i][1], path), 0);
	}
	host_path(path, fx->root, "abs");
	assert_int_equal(symlink(fx->secret, path), 0);
	return 0;
}

static int teardown(void **state)
{
	struct fx *fx = *state;

	rmt_close(fx->r);
	assert_int_equal(nftw(fx->tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
	free(fx);
	return 0;
}

/* --- rmt_path_check ---------------------------------------------------- */

static void test_remote__path_check_accepts(void **state)
{
	(void)state;
	assert_int_equal(rmt_path_check(""), 0);
	assert_int_equal(rmt_path_check("a"), 0);
	assert_int_equal(rmt_path_check("a/b"), 0);
	assert_int_equal(rmt_path_check("a/b/c.d"), 0);
	assert_int_equal(rmt_path_check("..."), 0);
	assert_int_equal(rmt_path_check(".a/..b/c.."), 0);
	assert_int_equal(rmt_path_check("a b/\t"), 0);
}

/* utf8_get(): SMB's name check (EILSEQ) and the journal's case folding
 * read names with it; utf8_put() writes what it read */
static void test_remote__utf8(void **state)
{
	static const struct {
		const char *s;
		int32_t c;
		size_t len;
	} cases[] = {
		{ "a", 'a', 1 },
		{ "\xc3\xa9", 0xe9, 2 },
		{ "\xe2\xb1\xaf", 0x2c6f, 3 },
		{ "\xf0\x9f\x98\x80", 0x1f600, 4 },
		{ "\xf4\x8f\xbf\xbf", 0x10ffff, 4 },
		{ "\xc0\xaf", -1, 1 },         /* overlong "/" */
		{ "\xe0\x80\xaf", -1, 1 },     /* overlong */
		{ "\xed\xa0\x80", -1, 1 },     /* surrogate U+D800 */
		{ "\xf4\x90\x80\x80", -1, 1 }, /* U+110000 */
		{ "\xc3", -1, 1 },             /* cut short */
		{ "\xc3(", -1, 1 },            /* no continuation */
		{ "\x80", -1, 1 },             /* a lone continuation */
		{ "\xff", -1, 1 },
	};
	unsigned char out[4];
	size_t len;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const unsigned char *u = (const unsigned char *)cases[i].s;
		int32_t c = utf8_get(u, strlen(cases[i].s), &len);

		assert_int_equal(c, cases[i].c);
		assert_int_equal(len, cases[i].len);
		if (c >= 0) {
			assert_int_equal(utf8_put(out, c), len);
			assert_memory_equal(out, u, len);
		}
	}
}

static void test_remote__path_check_refuses(void **state)
{
	static const char *const bad[] = {
		"/a",	 "/",	"a//b", "a/",	".",   "..", "a/../b",
		"a/./b", "./a", "a/..", "../a", "a/.", "//",
	};
	char name[NAME_MAX + 2];
	char *longpath;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (rmt_path_check(bad[i]) != -EINVAL)
			fail_msg("rmt_path_check(\"%s\") accepted", bad[i]);
	}
	assert_int_equal(rmt_path_check(NULL), -EINVAL);

	memset(name, 'x', NAME_MAX);
	name[NAME_MAX] = '\0';
	assert_int_equal(rmt_path_check(name), 0);
	name[NAME_MAX] = 'x';
	name[NAME_MAX + 1] = '\0';
	assert_int_equal(rmt_path_check(name), -ENAMETOOLONG);

	longpath = malloc(PATH_MAX + 1);
	assert_non_null(longpath);
	for (i = 0; i < PATH_MAX; i++)
		longpath[i] = (i % 2) ? '/' : 'a';
	longpath[PATH_MAX] = '\0';
	assert_int_equal(rmt_path_check(longpath), -ENAMETOOLONG);
	free(longpath);
}

/* remote.c refuses bad paths before the driver sees them. */
static void test_remote__bad_paths_refused_by_every_op(void **state)
{
	struct fx *fx = *state;
	struct rmt_setattr sa = { .set = RMT_SET_MODE, .mode = 0777 };
	char abs[PATH_MAX], buf[16];
	struct rmt_file *f = (void *)1;
	struct stat st;

	host_path(abs, fx->outside, "x");
	assert_rc_err(rmt_stat(fx->r, "..", &st), EINVAL);
	assert_rc_err(rmt_stat(fx->r, abs, &st), EINVAL);
	assert_rc_err(rmt_mkdir(fx->r, abs, 0755), EINVAL);
	assert_rc_err(rmt_mkdir(fx->r, "../x", 0755), EINVAL);
	assert_rc_err(rmt_file_open(fx->r, "../outside/secret", O_RDWR, 0, &f),
		      EINVAL);
	assert_null(f);
	assert_rc_err(rmt_file_open(fx->r, abs, O_RDWR | O_CREAT, 0644, &f),
		      EINVAL);
	assert_rc_err(rmt_setattr(fx->r, "../outside/secret", NULL, &sa),
		      EINVAL);
	assert_rc_err(rmt_setattr(fx->r, NULL, NULL, &sa), EINVAL);
	assert_rc_err(rmt_rename(fx->r, "../outside/secret", "s", 0), EINVAL);
	assert_rc_err(rmt_link(fx->r, "../outside/secret", "s"), EINVAL);
	assert_rc_err(rmt_symlink(fx->r, "x", "../outside/l"), EINVAL);
	assert_rc_err(rmt_readlink(fx->r, "a/", buf, sizeof(buf)), EINVAL);
	assert_rc_err(rmt_unlink(fx->r, "../outside/secret"), EINVAL);
	assert_outside_sane(fx);
}

/* --- rmt_open ---------------------------------------------------------- */

static void test_remote__open_errors(void **state)
{
	struct fx *fx = *state;
	struct rmt *r = (void *)1;
	char path[PATH_MAX];

	host_path(path, fx->tmp, "missing");
	assert_rc_err(rmt_open(path, NULL, &r), ENOENT);
	assert_null(r);
	assert_rc_err(rmt_open(fx->secret, NULL, &r), ENOTDIR);
	assert_rc_err(rmt_open("ftp://x/y", NULL, &r), EPROTONOSUPPORT);
	assert_rc_err(rmt_open("", NULL, &r), EINVAL);
	assert_rc_err(rmt_open(fx->root, "bogus=1", &r), EINVAL);
	assert_null(r);
	rmt_close(NULL);
}

/* smb:// refusals that need no server (remote/smb.c) */
static void test_remote__smb_open_refusals(void **state)
{
	struct fx *fx = *state;
	struct rmt *r = (void *)1;
	char cred[PATH_MAX], opt[PATH_MAX + 16];
	FILE *f;

	assert_rc_err(rmt_open("smb://x/y", NULL, &r), EINVAL); /* no user */
	assert_null(r);
	assert_rc_err(rmt_open("smb://u:pw@x/y", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("smb://u@x", NULL, &r), EINVAL); /* no share */
	assert_rc_err(rmt_open("smb://u@x/y/../z", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("smb://u@x/y%20", NULL, &r), EINVAL);
	assert_rc_err(rmt_open("smb://u@x/y", "bogus=1", &r), EINVAL);
	host_path(cred, fx->tmp, "no-such-cred");
	snprintf(opt, sizeof(opt), "credentials=%s", cred);
	assert_rc_err(rmt_open("smb://u@x/y", opt, &r), ENOENT);
	/* readable by others: refused before any connection */
	host_path(cred, fx->tmp, "cred");
	f = fopen(cred, "w");
	assert_non_null(f);
	fputs("username = u\npassword = secret\n", f);
	fclose(f);
	assert_int_equal(chmod(cred, 0644), 0);
	snprintf(opt, sizeof(opt), "credentials=%s", cred);
	assert_rc_err(rmt_open("smb://u@x/y", opt, &r), EACCES);
	assert_int_equal(chmod(cred, 0640), 0);
	assert_rc_err(rmt_open("smb://u@x/y", opt, &r), EACCES);
	assert_null(r);
	unlink(cred);
}

static void test_remote__open_id_and_caps(void **state)
{
	struct fx *fx = *state;
	char real[PATH_MAX], via[PATH_MAX], id[PATH_MAX + 8];
	unsigned int caps = rmt_caps(fx->r);
	struct rmt *r;

	assert_non_null(realpath(fx->root, real));
	snprintf(id, sizeof(id), "path:%s", real);
	assert_string_equal(rmt_id(fx->r), id);
	assert_true(caps & RMT_CAP_THREADSAFE);
	assert_true(caps & RMT_CAP_FD);
	/* /tmp is a local disk's (or tmpfs): reads skip the block cache,
	 * close(2) reports nothing late */
	assert_true(caps & RMT_CAP_LOCAL);
	assert_false(caps & RMT_CAP_CLOSE_ERRORS);

	/* a non-canonical spelling names the same share */
	host_path(via, fx->tmp, "outside/../root/");
	assert_rc_ok(rmt_open(via, "", &r));
	assert_string_equal(rmt_id(r), id);
	rmt_close(r);
}

/* --- confinement ------------------------------------------------------- */

static void test_remote__symlink_is_data(void **state)
{
	struct fx *fx = *state;
	char buf[PATH_MAX];
	struct stat st;

	assert_true(S_ISLNK(mode_of(fx->r, "toroot")));
	assert_true(S_ISLNK(mode_of(fx->r, "up")));
	assert_true(S_ISLNK(mode_of(fx->r, "rel")));
	assert_true(S_ISLNK(mode_of(fx->r, "abs")));
	assert_true(S_ISLNK(mode_of(fx->r, "dotdot")));
	assert_rc_ok(rmt_stat(fx->r, "rel", &st));
	assert_int_equal(st.st_size, strlen("../outside/secret"));

	assert_int_equal(rmt_readlink(fx->r, "toroot", buf, sizeof(buf)), 1);
	assert_string_equal(buf, "/");
	assert_int_equal(rmt_readlink(fx->r, "up", buf, sizeof(buf)),
			 strlen("../outside"));
	assert_string_equal(buf, "../outside");
	assert_rc_ok(rmt_readlink(fx->r, "abs", buf, sizeof(buf)));
	assert_string_equal(buf, fx->secret);
	assert_outside_sane(fx);
}

static void test_remote__symlink_blocks_descent(void **state)
{
	struct fx *fx = *state;
	struct rmt_setattr sa = { .set = RMT_SET_MODE, .mode = 0777 };
	char buf[PATH_MAX], escape[PATH_MAX], name[64];
	struct rmt_file *f;
	struct stat st;

	/* a name that must not appear in / */
	snprintf(name, sizeof(name), "ferryfs-escape-%s",
		 strrchr(fx->tmp, '-') + 1);
	host_path(escape, "", name);

	assert_rc_err(rmt_stat(fx->r, "toroot/etc", &st), ELOOP);
	assert_rc_err(rmt_stat(fx->r, "up/secret", &st), ELOOP);
	assert_rc_err(rmt_stat(fx->r, "dotdot/outside", &st), ELOOP);
	assert_rc_err(rmt_file_open(fx->r, "up/secret", O_RDONLY, 0, &f),
		      ELOOP);
	assert_rc_err(rmt_file_open(fx->r, "toroot/etc/passwd", O_RDONLY, 0,
				    &f),
		      ELOOP);
	assert_rc_err(rmt_file_open(fx->r, "up/new", O_RDWR | O_CREAT, 0644,
				    &f),
		      ELOOP);
	assert_rc_err(rmt_readdir(fx->r, "up", NULL, NULL), ELOOP);
	assert_rc_err(rmt_readdir(fx->r, "toroot", NULL, NULL), ELOOP);
	assert_rc_err(rmt_readdir(fx->r, "dotdot", NULL, NULL), ELOOP);
	assert_rc_err(rmt_mkdir(fx->r, "up/x", 0755), ELOOP);
	snprintf(buf, sizeof(buf), "toroot/%s", name);
	assert_rc_err(rmt_mkdir(fx->r, buf, 0755), ELOOP);
	assert_rc_err(rmt_mknod(fx->r, buf, S_IFIFO | 0644, 0), ELOOP);
	assert_rc_err(rmt_symlink(fx->r, "x", buf), ELOOP);
	assert_false(host_exists(escape));
	assert_rc_err(rmt_unlink(fx->r, "up/secret"), ELOOP);
	assert_rc_err(rmt_rmdir(fx->r, "dotdot/outside"), ELOOP);
	assert_rc_err(rmt_rename(fx->r, "up/secret", "stolen", 0), ELOOP);
	put_file(fx->r, "mine", "m", 1);
	assert_rc_err(rmt_rename(fx->r, "mine", "up/secret", 0), ELOOP);
	assert_rc_err(rmt_rename(fx->r, "mine", "up/secret",
				 RMT_RENAME_EXCHANGE),
		      ELOOP);
	assert_rc_err(rmt_link(fx->r, "up/secret", "stolen"), ELOOP);
	assert_rc_err(rmt_link(fx->r, "mine", "up/mine"), ELOOP);
	assert_rc_err(rmt_readlink(fx->r, "up/secret", buf, sizeof(buf)),
		      ELOOP);
	assert_rc_err(rmt_setattr(fx->r, "up/secret", NULL, &sa), ELOOP);
	if (rmt_caps(fx->r) & RMT_CAP_XATTR) {
		assert_rc_err(rmt_getxattr(fx->r, "up/secret", "user.secret",
					   buf, sizeof(buf)),
			      ELOOP);
		assert_rc_err(rmt_setxattr(fx->r, "up/secret", "user.x", "1", 1,
					   0),
			      ELOOP);
		assert_rc_err(rmt_listxattr(fx->r, "up/secret", buf,
					    sizeof(buf)),
			      ELOOP);
		assert_rc_err(rmt_removexattr(fx->r, "up/secret",
					      "user.secret"),
			      ELOOP);
	}
	assert_false(host_exists(escape));
	assert_outside_sane(fx);
}

/* Operations on a symlink itself act on the link, never on its target. */
static void test_remote__outside_file_untouched(void **state)
{
	static const char *const links[] = { "rel", "abs" };
	struct fx *fx = *state;
	struct rmt_setattr sa;
	struct rmt_file *f;
	struct stat st;
	char buf[256];
	size_t i;

	for (i = 0; i < 2; i++) {
		const char *l = links[i];

		assert_rc_err(rmt_file_open(fx->r, l, O_RDONLY, 0, &f), ELOOP);
		assert_rc_err(rmt_file_open(fx->r, l, O_RDWR | O_TRUNC, 0, &f),
			      ELOOP);
		assert_rc_err(rmt_file_open(fx->r, l, O_WRONLY | O_CREAT, 0644,
					    &f),
			      ELOOP);
		assert_true(rmt_file_open(fx->r, l, O_WRONLY | O_CREAT | O_EXCL,
					  0644, &f) < 0);
		assert_rc_err(rmt_readdir(fx->r, l, NULL, NULL), ELOOP);
		assert_outside_sane(fx);

		sa = (struct rmt_setattr){ .set = RMT_SET_MODE, .mode = 0777 };
		assert_rc_err(rmt_setattr(fx->r, l, NULL, &sa), EOPNOTSUPP);
		sa = (struct rmt_setattr){ .set = RMT_SET_SIZE, .size = 0 };
		assert_rc_err(rmt_setattr(fx->r, l, NULL, &sa), EINVAL);
		sa = (struct rmt_setattr){
			.set = RMT_SET_ATIME | RMT_SET_MTIME,
			.atime = { 1000, 1 },
			.mtime = { 2000, 2 },
		};
		assert_rc_ok(rmt_setattr(fx->r, l, NULL, &sa));
		assert_rc_ok(rmt_stat(fx->r, l, &st));
		assert_true(S_ISLNK(st.st_mode));
		assert_int_equal(st.st_mtim.tv_sec, 2000);
		assert_int_equal(st.st_mtim.tv_nsec, 2);
		sa = (struct rmt_setattr){ .set = RMT_SET_UID | RMT_SET_GID,
					   .uid = geteuid(),
					   .gid = getegid() };
		if (geteuid() == 0) {
			sa.uid = 4242;
			sa.gid = 4343;
		}
		assert_rc_ok(rmt_setattr(fx->r, l, NULL, &sa));
		assert_rc_ok(rmt_stat(fx->r, l, &st));
		assert_int_equal(st.st_uid, sa.uid);
		assert_int_equal(st.st_gid, sa.gid);
		assert_outside_sane(fx);

		if (rmt_caps(fx->r) & RMT_CAP_XATTR) {
			/* user.* is not allowed on a symlink: the kernel says
			 * so about the link, never shows the target's */
			assert_rc_err(rmt_getxattr(fx->r, l, "user.secret", buf,
						   sizeof(buf)),
				      ENODATA);
			assert_rc_err(rmt_setxattr(fx->r, l, "user.x", "1", 1,
						   0),
				      EPERM);
			assert_true(rmt_removexattr(fx->r, l, "user.secret") <
				    0);
			memset(buf, 0, sizeof(buf));
			assert_true(rmt_listxattr(fx->r, l, buf, sizeof(buf)) >=
				    0);
			assert_null(memmem(buf, sizeof(buf), "user.secret",
					   sizeof("user.secret")));
			assert_outside_sane(fx);
		}

		/* a hard link to a symlink is a second symlink */
		assert_rc_ok(rmt_link(fx->r, l, "hard"));
		assert_true(S_ISLNK(mode_of(fx->r, "hard")));
		assert_rc_ok(rmt_rename(fx->r, l, "moved", 0));
		assert_rc_ok(rmt_rename(fx->r, "moved", l, 0));
		assert_rc_ok(rmt_unlink(fx->r, "hard"));
		assert_outside_sane(fx);
	}
	assert_rc_ok(rmt_unlink(fx->r, "rel"));
	assert_rc_ok(rmt_unlink(fx->r, "up"));
	assert_rc_ok(rmt_unlink(fx->r, "toroot"));
	assert_rc_err(rmt_rmdir(fx->r, "dotdot"), ENOTDIR);
	assert_outside_sane(fx);
}

/* --- files ------------------------------------------------------------- */

static void test_remote__create_write_read_stat(void **state)
{
	struct fx *fx = *state;
	char buf[32] = { 0 };
	struct rmt_file *f;
	struct stat st, st2;

	assert_rc_ok(
		rmt_file_open(fx->r, "f", O_RDWR | O_CREAT | O_EXCL, 0640, &f));
	assert_int_equal(rmt_file_pwrite(f, "hello world", 11, 0), 11);
	assert_int_equal(rmt_file_pwrite(f, "W", 1, 6), 1);
	assert_int_equal(rmt_file_pread(f, buf, sizeof(buf), 0), 11);
	assert_string_equal(buf, "hello World");
	assert_int_equal(rmt_file_pread(f, buf, sizeof(buf), 11), 0);
	assert_int_equal(rmt_file_pread(f, buf, sizeof(buf), 100), 0);
	assert_rc_ok(rmt_file_stat(f, &st));
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0640);
	assert_int_equal(st.st_size, 11);
	assert_rc_ok(rmt_file_fsync(f, false));
	assert_rc_ok(rmt_file_fsync(f, true));
	assert_true(rmt_file_fd(f) >= 0);
	assert_rc_ok(rmt_file_close(f));
	assert_int_equal(rmt_file_close(NULL), 0);

	assert_rc_ok(rmt_stat(fx->r, "f", &st2));
	assert_int_equal(st.st_ino, st2.st_ino);
	assert_int_equal(st2.st_size, 11);
	assert_rc_ok(rmt_stat(fx->r, "", &st2));
	assert_true(S_ISDIR(st2.st_mode));
	assert_rc_err(rmt_stat(fx->r, "missing", &st2), ENOENT);
	assert_rc_err(rmt_stat(fx->r, "f/x", &st2), ENOTDIR);

	assert_rc_ok(rmt_mkdir(fx->r, "d", 0755));
	put_file(fx->r, "d/g", "deep", 4);
	assert_file_is(fx->r, "d/g", "deep");
}

static void test_remote__open_flags(void **state)
{
	struct fx *fx = *state;
	struct rmt_file *f;
	char buf[32] = { 0 };

	put_file(fx->r, "f", "hello world", 11);
	assert_rc_err(rmt_file_open(fx->r, "f", O_RDWR | O_CREAT | O_EXCL, 0644,
				    &f),
		      EEXIST);
	assert_rc_err(rmt_file_open(fx->r, "missing", O_RDONLY, 0, &f), ENOENT);
	assert_rc_err(rmt_file_open(fx->r, "nodir/f", O_RDWR | O_CREAT, 0644,
				    &f),
		      ENOENT);
	assert_rc_err(rmt_file_open(fx->r, "f/x", O_RDONLY, 0, &f), ENOTDIR);
	assert_rc_err(rmt_file_open(fx->r, "", O_RDONLY, 0, &f), EISDIR);
	assert_rc_ok(rmt_mkdir(fx->r, "d", 0755));
	assert_rc_err(rmt_file_open(fx->r, "d", O_RDONLY, 0, &f), EISDIR);
	assert_rc_err(rmt_file_open(fx->r, "d", O_RDWR, 0, &f), EISDIR);
	assert_rc_err(rmt_file_open(fx->r, "f", O_ACCMODE, 0, &f), EINVAL);

	/* a fifo is refused at once, without waiting for a writer */
	assert_rc_ok(rmt_mknod(fx->r, "fifo", S_IFIFO | 0644, 0));
	assert_rc_err(rmt_file_open(fx->r, "fifo", O_RDONLY, 0, &f), EINVAL);
	assert_rc_err(rmt_file_open(fx->r, "fifo", O_WRONLY, 0, &f), EINVAL);

	/* O_WRONLY still reads (fs/ reads through write handles) */
	assert_rc_ok(rmt_file_open(fx->r, "f", O_WRONLY, 0, &f));
	assert_int_equal(rmt_file_pread(f, buf, 5, 0), 5);
	assert_memory_equal(buf, "hello", 5);
	assert_rc_ok(rmt_file_close(f));

	/* O_APPEND is ignored: offsets are explicit */
	assert_rc_ok(rmt_file_open(fx->r, "f", O_WRONLY | O_APPEND, 0, &f));
	assert_int_equal(rmt_file_pwrite(f, "HELLO", 5, 0), 5);
	assert_rc_ok(rmt_file_close(f));
	assert_file_is(fx->r, "f", "HELLO world");

	/* O_TRUNC */
	assert_rc_ok(rmt_file_open(fx->r, "f", O_RDWR | O_TRUNC, 0, &f));
	assert_int_equal(rmt_file_pread(f, buf, sizeof(buf), 0), 0);
	assert_rc_ok(rmt_file_close(f));

	/* flags outside the contract are dropped, not passed on */
	assert_rc_ok(rmt_file_open(fx->r, "f", O_RDWR | O_NONBLOCK | O_ASYNC, 0,
				   &f));
	assert_int_equal(fcntl(rmt_file_fd(f), F_GETFL) &
				 (O_NONBLOCK | O_ASYNC | O_APPEND),
			 0);
	assert_rc_ok(rmt_file_close(f));

	/* the create mode is masked to permission bits */
	assert_rc_ok(rmt_file_open(fx->r, "g", O_WRONLY | O_CREAT,
				   S_IFREG | 0600, &f));
	assert_rc_ok(rmt_file_close(f));
	assert_int_equal(mode_of(fx->r, "g"), S_IFREG | 0600);
}

static void test_remote__setattr_size_and_times(void **state)
{
	struct fx *fx = *state;
	struct rmt_setattr sa;
	struct timespec before, after;
	struct stat st, st2;

	put_file(fx->r, "f", "hello world", 11);

	sa = (struct rmt_setattr){ .set = RMT_SET_SIZE, .size = 5 };
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	assert_file_is(fx->r, "f", "hello");
	sa.size = 4096;
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	assert_rc_ok(rmt_stat(fx->r, "f", &st));
	assert_int_equal(st.st_size, 4096);

	/* size is applied before times, so the set mtime stays */
	sa = (struct rmt_setattr){
		.set = RMT_SET_SIZE | RMT_SET_ATIME | RMT_SET_MTIME,
		.size = 10,
		.atime = { 1000000000, 111 },
		.mtime = { 1200000000, 222 },
	};
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	assert_rc_ok(rmt_stat(fx->r, "f", &st));
	assert_int_equal(st.st_size, 10);
	assert_int_equal(st.st_atim.tv_sec, 1000000000);
	assert_int_equal(st.st_atim.tv_nsec, 111);
	assert_int_equal(st.st_mtim.tv_sec, 1200000000);
	assert_int_equal(st.st_mtim.tv_nsec, 222);

	/* an unset time is left alone */
	sa = (struct rmt_setattr){ .set = RMT_SET_MTIME,
				   .mtime = { 1300000000, 0 } };
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	assert_rc_ok(rmt_stat(fx->r, "f", &st2));
	assert_int_equal(st2.st_atim.tv_sec, 1000000000);
	assert_int_equal(st2.st_atim.tv_nsec, 111);
	assert_int_equal(st2.st_mtim.tv_sec, 1300000000);

	/* UTIME_NOW passes through */
	clock_gettime(CLOCK_REALTIME, &before);
	sa = (struct rmt_setattr){ .set = RMT_SET_MTIME,
				   .mtime = { 0, UTIME_NOW } };
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	clock_gettime(CLOCK_REALTIME, &after);
	assert_rc_ok(rmt_stat(fx->r, "f", &st2));
	assert_in_range(st2.st_mtim.tv_sec, before.tv_sec - 1,
			after.tv_sec + 1);
	assert_int_equal(st2.st_atim.tv_sec, 1000000000);

	/* times of a directory and of the root */
	assert_rc_ok(rmt_mkdir(fx->r, "d", 0755));
	sa = (struct rmt_setattr){ .set = RMT_SET_MTIME,
				   .mtime = { 1400000000, 5 } };
	assert_rc_ok(rmt_setattr(fx->r, "d", NULL, &sa));
	assert_rc_ok(rmt_setattr(fx->r, "", NULL, &sa));
	assert_rc_ok(rmt_stat(fx->r, "d", &st));
	assert_int_equal(st.st_mtim.tv_sec, 1400000000);
	assert_rc_ok(rmt_stat(fx->r, "", &st));
	assert_int_equal(st.st_mtim.tv_sec, 1400000000);

	/* size of what is not a regular file */
	sa = (struct rmt_setattr){ .set = RMT_SET_SIZE, .size = 0 };
	assert_rc_err(rmt_setattr(fx->r, "d", NULL, &sa), EISDIR);
	assert_rc_err(rmt_setattr(fx->r, "missing", NULL, &sa), ENOENT);
}

/* Mode and owner in one call: the setuid and setgid bits asked stay,
 * though a chown clears them, even root's (remote.h: owner before mode).
 * A replay's FINISH sets both at once. */
static void test_remote__setattr_owner_keeps_setgid(void **state)
{
	struct fx *fx = *state;
	struct rmt_setattr sa = { .set = RMT_SET_MODE | RMT_SET_UID |
					  RMT_SET_GID,
				  .mode = 02755,
				  .uid = geteuid(),
				  .gid = getegid() };
	struct rmt_file *f;

	put_file(fx->r, "f", "x", 1);
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	assert_int_equal(mode_of(fx->r, "f"), S_IFREG | 02755);

	sa.mode = 04711;
	assert_rc_ok(rmt_file_open(fx->r, "f", O_WRONLY, 0, &f));
	assert_rc_ok(rmt_setattr(fx->r, NULL, f, &sa));
	assert_rc_ok(rmt_file_close(f));
	assert_int_equal(mode_of(fx->r, "f"), S_IFREG | 04711);
}

static void test_remote__setattr_mode_and_owner(void **state)
{
	struct fx *fx = *state;
	struct rmt_setattr sa;
	uid_t uid = geteuid();
	gid_t gid = getegid();
	struct stat st;

	put_file(fx->r, "f", "x", 1);
	assert_rc_ok(rmt_mkdir(fx->r, "d", 0755));
	assert_rc_ok(rmt_symlink(fx->r, "f", "l"));

	sa = (struct rmt_setattr){ .set = RMT_SET_MODE, .mode = 0604 };
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	assert_int_equal(mode_of(fx->r, "f"), S_IFREG | 0604);
	sa.mode = 01750;
	assert_rc_ok(rmt_setattr(fx->r, "d", NULL, &sa));
	assert_int_equal(mode_of(fx->r, "d"), S_IFDIR | 01750);
	sa.mode = 0700;
	assert_rc_err(rmt_setattr(fx->r, "l", NULL, &sa), EOPNOTSUPP);
	assert_int_equal(mode_of(fx->r, "f"), S_IFREG | 0604);

	if (uid == 0) {
		uid = 4242;
		gid = 4343;
	}
	sa = (struct rmt_setattr){ .set = RMT_SET_UID, .uid = uid };
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	assert_rc_ok(rmt_stat(fx->r, "f", &st));
	assert_int_equal(st.st_uid, uid);
	assert_int_equal(st.st_gid, getegid());
	sa = (struct rmt_setattr){ .set = RMT_SET_GID, .gid = gid };
	assert_rc_ok(rmt_setattr(fx->r, "f", NULL, &sa));
	assert_rc_ok(rmt_stat(fx->r, "f", &st));
	assert_int_equal(st.st_uid, uid);
	assert_int_equal(st.st_gid, gid);

	/* a symlink's owner is its own */
	sa = (struct rmt_setattr){ .set = RMT_SET_UID | RMT_SET_GID,
				   .uid = geteuid(),
				   .gid = getegid() };
	assert_rc_ok(rmt_setattr(fx->r, "l", NULL, &sa));
	assert_rc_ok(rmt_stat(fx->r, "f", &st));
	assert_int_equal(st.st_uid, uid);
}

/* With a file, path may be NULL: an unlinked but open file. */
static void test_remote__setattr_by_file(void **state)
{
	struct fx *fx = *state;
	struct rmt_setattr sa = {
		.set = RMT_SET_SIZE | RMT_SET_MODE | RMT_SET_UID |
		       RMT_SET_ATIME | RMT_SET_MTIME,
		.size = 100,
		.mode = 0600,
		.uid = geteuid(),
		.atime = { 0, UTIME_NOW },
		.mtime = { 1234567890, 42 },
	};
	struct rmt_file *f;
	struct stat st;

	assert_rc_ok(rmt_file_open(fx->r, "f", O_RDWR | O_CREAT, 0644, &f));
	assert_rc_ok(rmt_unlink(fx->r, "f"));
	assert_rc_ok(rmt_setattr(fx->r, NULL, f, &sa));
	assert_rc_ok(rmt_file_stat(f, &st));
	assert_int_equal(st.st_size, 100);
	assert_int_equal(st.st_mode, S_IFREG | 0600);
	assert_int_equal(st.st_mtim.tv_sec, 1234567890);
	assert_int_equal(st.st_mtim.tv_nsec, 42);
	assert_int_equal(st.st_nlink, 0);
	assert_rc_ok(rmt_file_close(f));
}

/* --- names ------------------------------------------------------------- */

static void test_remote__rename(void **state)
{
	struct fx *fx = *state;

	put_file(fx->r, "a", "AAA", 3);
	put_file(fx->r, "b", "BB", 2);
	assert_rc_err(rmt_rename(fx->r, "a", "b", RMT_RENAME_NOREPLACE),
		      EEXIST);
	assert_file_is(fx->r, "a", "AAA");
	assert_file_is(fx->r, "b", "BB");

	assert_rc_ok(rmt_rename(fx->r, "a", "b", RMT_RENAME_EXCHANGE));
	assert_file_is(fx->r, "a", "BB");
	assert_file_is(fx->r, "b", "AAA");

	assert_rc_ok(rmt_rename(fx->r, "a", "b", 0));
	assert_file_is(fx->r, "b", "BB");
	assert_rc_err(rmt_stat(fx->r, "a", &(struct stat){ 0 }), ENOENT);

	assert_rc_ok(rmt_mkdir(fx->r, "d", 0755));
	assert_rc_ok(rmt_rename(fx->r, "b", "d/c", RMT_RENAME_NOREPLACE));
	assert_file_is(fx->r, "d/c", "BB");
	assert_rc_ok(rmt_rename(fx->r, "d", "e", 0));
	assert_file_is(fx->r, "e/c", "BB");

	assert_rc_err(rmt_rename(fx->r, "missing", "x", 0), ENOENT);
	assert_rc_err(rmt_rename(fx->r, "e/c", "x",
				 RMT_RENAME_NOREPLACE | RMT_RENAME_EXCHANGE),
		      EINVAL);
	assert_rc_err(rmt_rename(fx->r, "e/c", "x", RMT_RENAME_EXCHANGE),
		      ENOENT);
	assert_rc_err(rmt_rename(fx->r, "e/c", "", 0), EBUSY);
}

static void test_remote__link_unlink(void **state)
{
	struct fx *fx = *state;
	struct stat a, b;

	put_file(fx->r, "a", "AAA", 3);
	assert_rc_ok(rmt_mkdir(fx->r, "d", 0755));
	assert_rc_ok(rmt_link(fx->r, "a", "d/b"));
	assert_rc_ok(rmt_stat(fx->r, "a", &a));
	assert_rc_ok(rmt_stat(fx->r, "d/b", &b));
	assert_int_equal(a.st_ino, b.st_ino);
	assert_int_equal(b.st_nlink, 2);
	assert_rc_err(rmt_link(fx->r, "a", "d/b"), EEXIST);
	assert_rc_err(rmt_link(fx->r, "missing", "c"), ENOENT);
	assert_rc_err(rmt_link(fx->r, "d", "dd"), EPERM);

	assert_rc_ok(rmt_unlink(fx->r, "a"));
	assert_rc_ok(rmt_stat(fx->r, "d/b", &b));
	assert_int_equal(b.st_nlink, 1);
	assert_file_is(fx->r, "d/b", "AAA");
	assert_rc_err(rmt_unlink(fx->r, "a"), ENOENT);
	assert_rc_err(rmt_unlink(fx->r, "d"), EISDIR);
	assert_rc_err(rmt_unlink(fx->r, ""), EISDIR);
}

static void test_remote__mkdir_rmdir(void **state)
{
	struct fx *fx = *state;

	assert_rc_ok(rmt_mkdir(fx->r, "d", 0750));
	assert_int_equal(mode_of(fx->r, "d"), S_IFDIR | 0750);
	assert_rc_err(rmt_mkdir(fx->r, "d", 0755), EEXIST);
	assert_rc_err(rmt_mkdir(fx->r, "", 0755), EEXIST);
	assert_rc_err(rmt_mkdir(fx->r, "x/y", 0755), ENOENT);
	assert_rc_ok(rmt_mkdir(fx->r, "d/e", 0755));
	put_file(fx->r, "d/e/f", "", 0);
	assert_rc_err(rmt_rmdir(fx->r, "d"), ENOTEMPTY);
	assert_rc_err(rmt_rmdir(fx->r, "d/e/f"), ENOTDIR);
	assert_rc_err(rmt_rmdir(fx->r, ""), EBUSY);
	assert_rc_ok(rmt_unlink(fx->r, "d/e/f"));
	assert_rc_ok(rmt_rmdir(fx->r, "d/e"));
	assert_rc_ok(rmt_rmdir(fx->r, "d"));
	assert_rc_err(rmt_rmdir(fx->r, "d"), ENOENT);
}

static void test_remote__mknod(void **state)
{
	struct fx *fx = *state;

	assert_rc_ok(rmt_mknod(fx->r, "fifo", S_IFIFO | 0640, 0));
	assert_int_equal(mode_of(fx->r, "fifo"), S_IFIFO | 0640);
	assert_rc_ok(rmt_mknod(fx->r, "sock", S_IFSOCK | 0600, 0));
	assert_int_equal(mode_of(fx->r, "sock"), S_IFSOCK | 0600);
	assert_rc_err(rmt_mknod(fx->r, "fifo", S_IFIFO | 0640, 0), EEXIST);
	assert_rc_err(rmt_mknod(fx->r, "null", S_IFCHR | 0666, makedev(1, 3)),
		      EPERM);
	assert_rc_err(rmt_mknod(fx->r, "blk", S_IFBLK | 0600, makedev(7, 0)),
		      EPERM);
	assert_rc_err(rmt_mknod(fx->r, "reg", S_IFREG | 0600, 0), EPERM);
	assert_rc_err(rmt_stat(fx->r, "null", &(struct stat){ 0 }), ENOENT);
	assert_rc_err(rmt_stat(fx->r, "blk", &(struct stat){ 0 }), ENOENT);
}

static void test_remote__symlink_readlink(void **state)
{
	struct fx *fx = *state;
	char buf[16];

	assert_rc_ok(rmt_symlink(fx->r, "../../etc/passwd", "a"));
	assert_rc_ok(rmt_symlink(fx->r, "/abs/olute", "b"));
	assert_rc_ok(rmt_symlink(fx->r, "dangling", "c"));
	assert_rc_err(rmt_symlink(fx->r, "x", "c"), EEXIST);
	assert_rc_err(rmt_symlink(fx->r, "", "e"), ENOENT);

	/* "../../etc/passwd" is 16 bytes: with its NUL it does not fit */
	assert_rc_err(rmt_readlink(fx->r, "a", buf, sizeof(buf)), ENAMETOOLONG);
	assert_int_equal(rmt_readlink(fx->r, "b", buf, sizeof(buf)), 10);
	assert_string_equal(buf, "/abs/olute");
	assert_int_equal(rmt_readlink(fx->r, "b", buf, 11), 10);
	assert_string_equal(buf, "/abs/olute");
	assert_rc_err(rmt_readlink(fx->r, "b", buf, 10), ENAMETOOLONG);
	assert_rc_err(rmt_readlink(fx->r, "b", buf, 0), EINVAL);
	assert_int_equal(rmt_readlink(fx->r, "c", buf, sizeof(buf)), 8);
	assert_string_equal(buf, "dangling");

	put_file(fx->r, "f", "", 0);
	assert_rc_err(rmt_readlink(fx->r, "f", buf, sizeof(buf)), EINVAL);
	assert_rc_err(rmt_readlink(fx->r, "", buf, sizeof(buf)), EINVAL);
	assert_rc_err(rmt_readlink(fx->r, "missing", buf, sizeof(buf)), ENOENT);
	/* creating through a dangling symlink creates nothing */
	assert_rc_err(rmt_mkdir(fx->r, "c", 0755), EEXIST);
	assert_rc_err(rmt_file_open(fx->r, "c", O_RDWR | O_CREAT, 0644,
				    &(struct rmt_file *){ NULL }),
		      ELOOP);
	assert_rc_err(rmt_stat(fx->r, "dangling", &(struct stat){ 0 }), ENOENT);
}

struct listing {
	int n;
	char names[8][16];
	struct stat st[8];
	int stop_after; /* stop with -ECANCELED after this many; 0: never */
};

static int collect(const char *name, const struct stat *st, void *arg)
{
	struct listing *ls = arg;

	if (ls->n >= 8)
		return -EOVERFLOW;
	snprintf(ls->names[ls->n], sizeof(ls->names[0]), "%s", name);
	if (st)
		ls->st[ls->n] = *st;
	ls->n++;
	if (ls->stop_after && ls->n >= ls->stop_after)
		return -ECANCELED;
	return 0;
}

static const struct stat *find(const struct listing *ls, const char *name)
{
	int i;

	for (i = 0; i < ls->n; i++)
		if (!strcmp(ls->names[i], name))
			return &ls->st[i];
	fail_msg("'%s' not listed", name);
	return NULL;
}

static void test_remote__readdir(void **state)
{
	struct fx *fx = *state;
	struct listing ls = { 0 };

	assert_rc_ok(rmt_readdir(fx->r, "", collect, &ls));
	assert_int_equal(ls.n, 0);

	assert_rc_ok(rmt_mkdir(fx->r, "d", 0755));
	put_file(fx->r, "d/file", "12345", 5);
	assert_rc_ok(rmt_mkdir(fx->r, "d/sub", 0700));
	assert_rc_ok(rmt_symlink(fx->r, "file", "d/link"));
	assert_rc_ok(rmt_mknod(fx->r, "d/fifo", S_IFIFO | 0600, 0));

	assert_rc_ok(rmt_readdir(fx->r, "d", collect, &ls));
	assert_int_equal(ls.n, 4);
	assert_true(S_ISREG(find(&ls, "file")->st_mode));
	assert_int_equal(find(&ls, "file")->st_size, 5);
	assert_int_equal(find(&ls, "sub")->st_mode, S_IFDIR | 0700);
	assert_true(S_ISLNK(find(&ls, "link")->st_mode));
	assert_int_equal(find(&ls, "link")->st_size, 4);
	assert_true(S_ISFIFO(find(&ls, "fifo")->st_mode));

	memset(&ls, 0, sizeof(ls));
	assert_rc_ok(rmt_readdir(fx->r, "", collect, &ls));
	assert_int_equal(ls.n, 1);
	assert_string_equal(ls.names[0], "d");

	memset(&ls, 0, sizeof(ls));
	ls.stop_after = 2;
	assert_rc_err(rmt_readdir(fx->r, "d", collect, &ls), ECANCELED);
	assert_int_equal(ls.n, 2);

	assert_rc_err(rmt_readdir(fx->r, "d/file", collect, &ls), ENOTDIR);
	assert_rc_err(rmt_readdir(fx->r, "d/link", collect, &ls), ELOOP);
	assert_rc_err(rmt_readdir(fx->r, "missing", collect, &ls), ENOENT);
}

static void test_remote__xattr(void **state)
{
	struct fx *fx = *state;
	char buf[64] = { 0 };
	ssize_t n;
	int rc;

	if (!(rmt_caps(fx->r) & RMT_CAP_XATTR))
		skip();
	put_file(fx->r, "f", "", 0);
	rc = rmt_setxattr(fx->r, "f", "user.k", "value", 5, 0);
	if (rc == -EOPNOTSUPP)
		skip();
	assert_rc_ok(rc);
	assert_int_equal(rmt_getxattr(fx->r, "f", "user.k", NULL, 0), 5);
	assert_int_equal(rmt_getxattr(fx->r, "f", "user.k", buf, sizeof(buf)),
			 5);
	assert_memory_equal(buf, "value", 5);
	assert_rc_err(rmt_getxattr(fx->r, "f", "user.k", buf, 2), ERANGE);
	assert_rc_err(rmt_getxattr(fx->r, "f", "user.none", buf, sizeof(buf)),
		      ENODATA);
	assert_rc_err(rmt_setxattr(fx->r, "f", "user.k", "v", 1, XATTR_CREATE),
		      EEXIST);
	assert_rc_err(rmt_setxattr(fx->r, "f", "user.j", "v", 1, XATTR_REPLACE),
		      ENODATA);
	assert_rc_ok(rmt_setxattr(fx->r, "f", "user.j", "", 0, XATTR_CREATE));

	n = rmt_listxattr(fx->r, "f", NULL, 0);
	assert_true(n >= (ssize_t)sizeof("user.k") + (ssize_t)sizeof("user.j"));
	memset(buf, 0, sizeof(buf));
	assert_int_equal(rmt_listxattr(fx->r, "f", buf, sizeof(buf)), n);
	assert_non_null(memmem(buf, (size_t)n, "user.k", sizeof("user.k")));
	assert_non_null(memmem(buf, (size_t)n, "user.j", sizeof("user.j")));
	assert_rc_err(rmt_listxattr(fx->r, "f", buf, 1), ERANGE);

	assert_rc_ok(rmt_removexattr(fx->r, "f", "user.k"));
	assert_rc_err(rmt_getxattr(fx->r, "f", "user.k", buf, sizeof(buf)),
		      ENODATA);
	assert_rc_err(rmt_removexattr(fx->r, "f", "user.k"), ENODATA);

	/* directories and the root carry them too */
	assert_rc_ok(rmt_mkdir(fx->r, "d", 0755));
	assert_rc_ok(rmt_setxattr(fx->r, "d", "user.d", "1", 1, 0));
	assert_int_equal(rmt_getxattr(fx->r, "d", "user.d", buf, sizeof(buf)),
			 1);
	assert_rc_ok(rmt_setxattr(fx->r, "", "user.root", "r", 1, 0));
	assert_int_equal(rmt_getxattr(fx->r, "", "user.root", buf, sizeof(buf)),
			 1);
	assert_rc_err(rmt_getxattr(fx->r, "missing", "user.k", buf,
				   sizeof(buf)),
		      ENOENT);
}

static void test_remote__statfs(void **state)
{
	struct fx *fx = *state;
	struct statvfs a, b;

	assert_rc_ok(rmt_statfs(fx->r, &a));
	assert_int_equal(statvfs(fx->root, &b), 0);
	assert_true(a.f_bsize > 0);
	assert_int_equal(a.f_bsize, b.f_bsize);
	assert_int_equal(a.f_blocks, b.f_blocks);
	assert_int_equal(a.f_fsid, b.f_fsid);
	assert_int_equal(a.f_namemax, b.f_namemax);
}

static void fill_pattern(unsigned char *buf, size_t len, unsigned int seed)
{
	size_t i;

	for (i = 0; i < len; i++)
		buf[i] = (unsigned char)((i * 131u + seed) ^ (i >> 9));
}

static void test_remote__copy(void **state)
{
	struct fx *fx = *state;
	size_t len = (3u << 20) + 123;
	unsigned char *src = malloc(len), *got = malloc(len + 64);
	struct rmt_file *in, *out, *other_f;
	struct rmt *other;

	assert_non_null(src);
	assert_non_null(got);
	fill_pattern(src, len, 7);
	put_file(fx->r, "src", src, len);

	assert_rc_ok(rmt_file_open(fx->r, "src", O_RDONLY, 0, &in));
	assert_rc_ok(
		rmt_file_open(fx->r, "dst", O_WRONLY | O_CREAT, 0644, &out));
	assert_int_equal(rmt_file_copy(in, 0, out, 0, len), len);
	assert_int_equal(rmt_file_pread(out, got, len + 64, 0), len);
	assert_memory_equal(got, src, len);

	/* at offsets, and short only at the source's EOF */
	assert_int_equal(rmt_file_copy(in, 5, out, 1000, 4000), 4000);
	assert_int_equal(rmt_file_pread(out, got, 4000, 1000), 4000);
	assert_memory_equal(got, src + 5, 4000);
	assert_int_equal(rmt_file_copy(in, (off_t)len - 10, out, 0, 100), 10);
	assert_int_equal(rmt_file_pread(out, got, 10, 0), 10);
	assert_memory_equal(got, src + len - 10, 10);
	assert_int_equal(rmt_file_copy(in, (off_t)len, out, 0, 100), 0);
	assert_int_equal(rmt_file_copy(in, 0, out, 0, 0), 0);

	/* files of two shares do not mix */
	assert_rc_ok(rmt_open(fx->root, NULL, &other));
	assert_rc_ok(rmt_file_open(other, "src", O_RDONLY, 0, &other_f));
	assert_rc_err(rmt_file_copy(other_f, 0, out, 0, 10), EXDEV);
	assert_rc_ok(rmt_file_close(other_f));
	rmt_close(other);

	assert_rc_ok(rmt_file_close(in));
	assert_rc_ok(rmt_file_close(out));
	free(src);
	free(got);
}

static void test_remote__seek_data_hole(void **state)
{
	struct fx *fx = *state;
	const off_t far = 1 << 20;
	char block[4096];
	struct rmt_file *f;
	off_t size = far + (off_t)sizeof(block), hole;

	memset(block, 'x', sizeof(block));
	assert_rc_ok(
		rmt_file_open(fx->r, "sparse", O_RDWR | O_CREAT, 0644, &f));
	assert_int_equal(rmt_file_pwrite(f, block, sizeof(block), 0),
			 sizeof(block));
	assert_int_equal(rmt_file_pwrite(f, block, sizeof(block), far),
			 sizeof(block));

	assert_int_equal(rmt_file_seek(f, 0, SEEK_DATA), 0);
	hole = rmt_file_seek(f, 0, SEEK_HOLE);
	assert_in_range(hole, sizeof(block), size);
	if (hole < size) /* the file system keeps holes */
		assert_int_equal(rmt_file_seek(f, hole, SEEK_DATA), far);
	assert_int_equal(rmt_file_seek(f, far, SEEK_HOLE), size);
	assert_rc_err(rmt_file_seek(f, size, SEEK_DATA), ENXIO);
	assert_rc_err(rmt_file_seek(f, size + 1, SEEK_HOLE), ENXIO);
	assert_rc_err(rmt_file_seek(f, 0, SEEK_SET), EINVAL);
	assert_rc_ok(rmt_file_close(f));
}

static void test_remote__fallocate(void **state)
{
	struct fx *fx = *state;
	char buf[8192], zero[4096] = { 0 };
	struct rmt_file *f;
	struct stat st;
	int rc;

	memset(buf, 'y', sizeof(buf));
	assert_rc_ok(rmt_file_open(fx->r, "f", O_RDWR | O_CREAT, 0644, &f));
	assert_int_equal(rmt_file_pwrite(f, buf, sizeof(buf), 0), sizeof(buf));
	rc = rmt_file_fallocate(f, FALLOC_FL_KEEP_SIZE, 0, 1 << 20);
	if (rc == -EOPNOTSUPP) {
		rmt_file_close(f);
		skip();
	}
	assert_rc_ok(rc);
	assert_rc_ok(rmt_file_stat(f, &st));
	assert_int_equal(st.st_size, sizeof(buf));
	assert_true(st.st_blocks * 512 >= 1 << 20);

	assert_rc_ok(rmt_file_fallocate(f, 0, 0, 3 * 4096));
	assert_rc_ok(rmt_file_stat(f, &st));
	assert_int_equal(st.st_size, 3 * 4096);

	rc = rmt_file_fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				0, 4096);
	if (rc != -EOPNOTSUPP) {
		assert_rc_ok(rc);
		assert_int_equal(rmt_file_pread(f, buf, 4096, 0), 4096);
		assert_memory_equal(buf, zero, 4096);
	}
	assert_rc_err(rmt_file_fallocate(f, 0, -1, 10), EINVAL);
	assert_rc_ok(rmt_file_close(f));
}

/* --- leases ------------------------------------------------------------ */

struct leased_op {
	struct rmt *r;
	bool truncate; /* else open for writing */
	int rc;
	pthread_t th;
};

static void *leased_run(void *arg)
{
	struct leased_op *op = arg;
	struct rmt_setattr sa = { .set = RMT_SET_SIZE, .size = 1 };
	struct rmt_file *f;

	if (op->truncate) {
		op->rc = rmt_setattr(op->r, "leased", NULL, &sa);
	} else {
		op->rc = rmt_file_open(op->r, "leased", O_WRONLY, 0, &f);
		if (op->rc == 0)
			op->rc = rmt_file_close(f);
	}
	return NULL;
}

/*
 * A process next to the share (Samba) may hold a lease: opening for
 * writing then waits for the lease break, as open(2) does, instead of
 * failing with -EWOULDBLOCK.
 */
static void test_remote__open_waits_for_lease_break(void **state)
{
	struct fx *fx = *state;
	struct leased_op op = { .r = fx->r };
	char path[PATH_MAX];
	int fd, i, n;

	put_file(fx->r, "leased", "abc", 3);
	host_path(path, fx->root, "leased");
	signal(SIGIO, SIG_IGN); /* the lease break notice */
	for (i = 0; i < 2; i++) {
		op.truncate = i == 1;
		fd = open(path, O_RDONLY | O_CLOEXEC);
		assert_true(fd >= 0);
		if (fcntl(fd, F_SETLEASE, F_RDLCK) < 0) {
			close(fd);
			skip();
		}
		assert_int_equal(pthread_create(&op.th, NULL, leased_run, &op),
				 0);
		/* a pending break shows as F_UNLCK; then give the lease up */
		for (n = 0; n < 5000; n++) {
			if (fcntl(fd, F_GETLEASE) != F_RDLCK)
				break;
			usleep(1000);
		}
		assert_true(n < 5000);
		assert_int_equal(fcntl(fd, F_SETLEASE, F_UNLCK), 0);
		close(fd);
		assert_int_equal(pthread_join(op.th, NULL), 0);
		assert_rc_ok(op.rc);
	}
	signal(SIGIO, SIG_DFL);
	assert_file_is(fx->r, "leased", "a");
}

/* --- threads ----------------------------------------------------------- */

struct worker {
	struct rmt *r;
	int id;
	int errors;
	pthread_t th;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	char name[32], done[32], buf[4096], got[4096];
	struct rmt_file *f;
	struct stat st;
	int i;

	for (i = 0; i < 100; i++) {
		snprintf(name, sizeof(name), "w%d/f%d", w->id, i);
		snprintf(done, sizeof(done), "w%d/g%d", w->id, i);
		memset(buf, 'a' + w->id, sizeof(buf));
		if (rmt_file_open(w->r, name, O_RDWR | O_CREAT | O_EXCL, 0644,
				  &f) < 0) {
			w->errors++;
			continue;
		}
		if (rmt_file_pwrite(f, buf, sizeof(buf), 0) != sizeof(buf) ||
		    rmt_file_pread(f, got, sizeof(got), 0) != sizeof(got) ||
		    memcmp(buf, got, sizeof(buf)))
			w->errors++;
		if (rmt_file_close(f) < 0 ||
		    rmt_rename(w->r, name, done, RMT_RENAME_NOREPLACE) < 0 ||
		    rmt_stat(w->r, done, &st) < 0 || st.st_size != 4096 ||
		    rmt_stat(w->r, "", &st) < 0 || rmt_unlink(w->r, done) < 0)
			w->errors++;
	}
	return NULL;
}

static void test_remote__threads_share_one_remote(void **state)
{
	struct fx *fx = *state;
	struct worker w[4];
	struct listing ls = { 0 };
	char name[16];
	int i;

	for (i = 0; i < 4; i++) {
		snprintf(name, sizeof(name), "w%d", i);
		assert_rc_ok(rmt_mkdir(fx->r, name, 0755));
		w[i] = (struct worker){ .r = fx->r, .id = i };
		assert_int_equal(pthread_create(&w[i].th, NULL, work, &w[i]),
				 0);
	}
	for (i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(w[i].th, NULL), 0);
		assert_int_equal(w[i].errors, 0);
		snprintf(name, sizeof(name), "w%d", i);
		assert_rc_ok(rmt_readdir(fx->r, name, collect, &ls));
		assert_int_equal(ls.n, 0);
	}
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
#define TL(name) cmocka_unit_test_setup_teardown(name, setup_links, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_remote__path_check_accepts),
		cmocka_unit_test(test_remote__path_check_refuses),
		cmocka_unit_test(test_remote__utf8),
		T(test_remote__bad_paths_refused_by_every_op),
		T(test_remote__open_errors),
		T(test_remote__smb_open_refusals),
		T(test_remote__open_id_and_caps),
		TL(test_remote__symlink_is_data),
		TL(test_remote__symlink_blocks_descent),
		TL(test_remote__outside_file_untouched),
		T(test_remote__create_write_read_stat),
		T(test_remote__open_flags),
		T(test_remote__setattr_size_and_times),
		T(test_remote__setattr_mode_and_owner),
		T(test_remote__setattr_owner_keeps_setgid),
		T(test_remote__setattr_by_file),
		T(test_remote__rename),
		T(test_remote__link_unlink),
		T(test_remote__mkdir_rmdir),
		T(test_remote__mknod),
		T(test_remote__symlink_readlink),
		T(test_remote__readdir),
		T(test_remote__xattr),
		T(test_remote__statfs),
		T(test_remote__copy),
		T(test_remote__seek_data_hole),
		T(test_remote__fallocate),
		T(test_remote__open_waits_for_lease_break),
		T(test_remote__threads_share_one_remote),
	};

	umask(022);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
