/*
 * main.c - the ferryfs command.
 *
 *   ferryfs [mount] REMOTE MOUNTPOINT [options]   run the daemon (fs_run)
 *   ferryfs status [MOUNTPOINT|FILE] [--json]      ask mounts (ctl.c), or
 *                                                  a file's state
 *   ferryfs flush MOUNTPOINT [--wait]
 *   ferryfs pause|resume MOUNTPOINT
 *
 * One clear line on stderr and a non-zero exit for anything wrong. The
 * replies of the control socket are read with jansson (status.c writes
 * them).
 */
#include <errno.h>
#include <jansson.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "fs.h"
#include "fs_i.h"
#include "log.h"

#define MAX_MOUNTS 64

/* The replies of the control socket, read with jansson (status.c writes
 * them): a number, a string, a boolean of an object, or -1, "", false
 * when it has no such member (or a number out of long long's range). */
static long long json_num(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);
	double d;

	if (json_is_integer(v))
		return (long long)json_integer_value(v);
	if (!json_is_real(v))
		return -1;
	/* a real out of long long's range (or NaN) converts to nothing
	 * defined: read as absent */
	d = json_real_value(v);
	return d > -0x1p63 && d < 0x1p63 ? (long long)d : -1;
}

static const char *json_str(const json_t *o, const char *key)
{
	const char *v = json_string_value(json_object_get(o, key));

	return v ? v : "";
}

static bool json_flag(const json_t *o, const char *key)
{
	return json_is_true(json_object_get(o, key));
}

static bool json_ok(const json_t *o)
{
	return json_flag(o, "ok");
}

/* Ask the mount at @mnt @cmd; *out is the reply parsed (caller owns it:
 * json_decref()), *text (if not NULL) the reply as sent (free()).
 * Errors: those of fs_ctl_call(), -EPROTO (not a JSON object). */
static int call(const char *mnt, const char *cmd, json_t **out, char **text)
{
	char *reply;
	int rc = fs_ctl_call(mnt, cmd, &reply);

	*out = NULL;
	if (text)
		*text = NULL;
	if (rc < 0)
		return rc;
	*out = json_loads(reply, 0, NULL);
	if (!json_is_object(*out)) {
		json_decref(*out);
		*out = NULL;
		free(reply);
		return -EPROTO;
	}
	if (text)
		*text = reply;
	else
		free(reply);
	return 0;
}

static void human_bytes(long long b, char *out, size_t size)
{
	const char *unit[] = { "B", "KB", "MB", "GB", "TB" };
	double v = (double)b;
	int i = 0;

	while (v >= 1000 && i < 4) {
		v /= 1000;
		i++;
	}
	snprintf(out, size, i ? "%.1f %s" : "%.0f %s", v, unit[i]);
}

/* The streams of a status reply: "state rate" per stream, one line. */
static void print_streams(const json_t *reply)
{
	const json_t *streams = json_object_get(reply, "streams"), *s;
	char rate[32];
	size_t i;

	if (!json_is_array(streams))
		return;
	printf("  streams:");
	json_array_foreach(streams, i, s) {
		human_bytes(json_num(s, "rate_bps"), rate, sizeof(rate));
		printf("%s %zu %s %s/s via %s", i ? "," : "", i,
		       json_str(s, "state"), rate, json_str(s, "via"));
	}
	printf("%s\n", json_array_size(streams) ? "" : " none");
}

/* The "conflict_paths" of a status reply, one line each. */
static void print_conflicts(const json_t *reply)
{
	const json_t *paths = json_object_get(reply, "conflict_paths"), *p;
	size_t i;

	json_array_foreach(paths, i, p)
		printf("    %s\n", json_string_value(p) ?
					   json_string_value(p) : "");
}

static void print_status(const json_t *reply)
{
	char pend[32], rd[32], wr[32], rate[32], resent[32];
	long long eta = json_num(reply, "eta_s");
	const char *mode = json_str(reply, "mode");
	const json_t *c;

	human_bytes(json_num(reply, "pending_bytes"), pend, sizeof(pend));
	human_bytes(json_num(reply, "remote_bytes_read"), rd, sizeof(rd));
	human_bytes(json_num(reply, "remote_bytes_written"), wr, sizeof(wr));
	printf("%s  (%s, %s)\n", json_str(reply, "mountpoint"),
	       json_str(reply, "remote"), mode);
	printf("  pending: %s in %lld files, %lld ops; paused: %s\n", pend,
	       json_num(reply, "pending_files"), json_num(reply, "pending_ops"),
	       json_flag(reply, "paused") ? "yes" : "no");
	if (!strcmp(mode, "write-back")) {
		human_bytes(json_num(reply, "rate_bps"), rate, sizeof(rate));
		human_bytes(json_num(reply, "resent_bytes"), resent,
			    sizeof(resent));
		if (json_flag(reply, "drained"))
			printf("  flush: everything is on the remote\n");
		else if (eta >= 0)
			printf("  flush: %s/s, about %lld s left\n", rate, eta);
		else
			printf("  flush: %s/s\n", rate);
		print_streams(reply);
		printf("  re-sent after the last crash: %s; operations given "
		       "up: %lld\n",
		       resent, json_num(reply, "failed_ops"));
	}
	printf("  errors: %lld, retries: %lld, conflicts: %lld\n",
	       json_num(reply, "errors"), json_num(reply, "retries"),
	       json_num(reply, "conflicts"));
	if (json_num(reply, "conflicts") > 0) {
		printf("  conflict copies (the local versions; newest "
		       "first):\n");
		print_conflicts(reply);
	}
	printf("  remote: %s read, %s written, %lld operations\n", rd, wr,
	       json_num(reply, "remote_ops"));
	if (json_is_object(c = json_object_get(reply, "cache"))) {
		char cb[32], cm[32], ra[32];
		long long hits = json_num(c, "hits"),
			  misses = json_num(c, "misses");

		human_bytes(json_num(c, "bytes"), cb, sizeof(cb));
		human_bytes(json_num(c, "max_bytes"), cm, sizeof(cm));
		human_bytes(json_num(c, "readahead_bytes"), ra, sizeof(ra));
		printf("  cache: %s of %s, hit rate %.0f%% (%lld of %lld "
		       "blocks), read-ahead %s\n",
		       cb, cm,
		       hits + misses ? 100.0 * (double)hits /
					       (double)(hits + misses)
				     : 0.0,
		       hits, hits + misses, ra);
	} else {
		printf("  cache: off: %s\n", json_str(reply, "cache_off"));
	}
}

/* One line of progress, rewritten in place on a terminal. */
static void print_progress(const json_t *reply)
{
	char pend[32], rate[32];
	long long eta = json_num(reply, "eta_s");

	human_bytes(json_num(reply, "pending_bytes"), pend, sizeof(pend));
	human_bytes(json_num(reply, "rate_bps"), rate, sizeof(rate));
	printf("\r\033[K  %s and %lld ops to go, %s/s", pend,
	       json_num(reply, "pending_ops"), rate);
	if (eta >= 0)
		printf(", about %lld s left", eta);
	fflush(stdout);
}

static int reach_err(const char *mnt, int rc)
{
	fprintf(stderr, "ferryfs: cannot reach the ferryfs mount at '%s': %s\n",
		mnt,
		rc == -ENOENT || rc == -ECONNREFUSED ? "not a ferryfs mount"
		: rc == -EPROTO ? "its reply is not JSON"
		: rc == -EPERM	? "its control socket is answered by another "
				  "user than the mount's owner or root: not "
				  "believed"
				: strerror(-rc));
	return 1;
}

/*
 * flush --wait: start the flush, then follow it (a progress line on a
 * terminal) until everything is on the remote. Exit 0 only then; 1 if the
 * journal failed, an operation was given up for good, or the flush is
 * paused with work pending (it would wait until someone resumed it).
 */
static int flush_wait(const char *mnt)
{
	bool tty = isatty(STDOUT_FILENO);
	json_t *reply;
	int rc = call(mnt, "flush", &reply, NULL), status = 1;

	if (rc < 0)
		return reach_err(mnt, rc);
	for (;;) {
		json_decref(reply);
		rc = call(mnt, "status", &reply, NULL);
		if (rc < 0)
			return reach_err(mnt, rc);
		if (!json_ok(reply)) {
			fprintf(stderr, "ferryfs: flush: %s\n",
				json_str(reply, "error"));
			goto out;
		}
		if (json_num(reply, "failed") != 0) {
			fprintf(stderr, "%sferryfs: flush: the journal failed "
					"(%s); see the log\n",
				tty ? "\n" : "",
				strerror((int)-json_num(reply, "failed")));
			goto out;
		}
		if (json_flag(reply, "drained"))
			break;
		if (json_flag(reply, "paused")) {
			fprintf(stderr, "%sferryfs: flush: the flush of '%s' is "
					"paused: nothing goes to the remote "
					"until 'ferryfs resume %s'\n",
				tty ? "\n" : "", mnt, mnt);
			goto out;
		}
		if (tty)
			print_progress(reply);
		usleep(tty ? 200000 : 20000);
	}
	if (tty)
		printf("\r\033[K");
	if (json_num(reply, "failed_ops") > 0) {
		fprintf(stderr, "ferryfs: flush: %lld operations were refused "
				"by the remote and given up (files in state "
				"'error'; see the log)\n",
			json_num(reply, "failed_ops"));
		goto out;
	}
	printf("%s: everything is on the remote\n", mnt);
	status = 0;
out:
	json_decref(reply);
	return status;
}

/* status of a file inside a mount: its user.ferryfs.state */
static int file_status(const char *path, bool json)
{
	char v[64];
	ssize_t n = getxattr(path, "user.ferryfs.state", v, sizeof(v) - 1);

	if (n < 0) {
		fprintf(stderr, "ferryfs: status: '%s': %s\n", path,
			errno == ENODATA || errno == ENOTSUP
				? "not in a ferryfs mount"
				: strerror(errno));
		return 1;
	}
	v[n] = '\0';
	if (json) {
		json_t *o = json_pack("{s:b, s:s, s:s}", "ok", 1, "path", path,
				      "state", v);
		char *text = o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;

		json_decref(o);
		if (!text) {
			fprintf(stderr, "ferryfs: status: '%s': the path is "
					"not UTF-8\n",
				path);
			return 1;
		}
		printf("%s\n", text);
		free(text);
	} else {
		printf("%s: %s\n", path, v);
	}
	return 0;
}

/* One command to one mount; prints the reply. Returns the exit status. */
static int ask(const char *mnt, const char *cmd, bool json)
{
	json_t *reply;
	char *text;
	int rc = call(mnt, cmd, &reply, &text), status = 1;
	bool live = !json && !strcmp(cmd, "status") && isatty(STDOUT_FILENO);
	int lines = 0;

	if (rc < 0)
		return reach_err(mnt, rc);
	if (json) {
		printf("%s\n", text);
		status = json_ok(reply) ? 0 : 1;
		goto out;
	}
	if (!json_ok(reply)) {
		fprintf(stderr, "ferryfs: %s: %s\n", cmd,
			json_str(reply, "error"));
		goto out;
	}
	if (!strcmp(cmd, "status")) {
		/* on a terminal: live while the flush goes on */
		for (;;) {
			print_status(reply);
			lines = json_is_object(json_object_get(reply, "cache"))
					? 8
					: 7;
			if (!live ||
			    strcmp(json_str(reply, "mode"), "write-back") ||
			    json_flag(reply, "drained") ||
			    json_flag(reply, "paused"))
				break;
			sleep(1);
			json_decref(reply);
			if (call(mnt, cmd, &reply, NULL) < 0 ||
			    !json_ok(reply))
				break;
			printf("\033[%dA\033[J", lines);
		}
	} else if (!strncmp(cmd, "flush", 5)) {
		printf("%s: %lld bytes and %lld operations pending\n", mnt,
		       json_num(reply, "pending_bytes"),
		       json_num(reply, "pending_ops"));
	} else {
		printf("%s: %sd\n", mnt, cmd);
	}
	status = 0;
out:
	json_decref(reply);
	free(text);
	return status;
}

/* Is @path the mount point of a ferryfs mount this process sees? */
static bool is_ferryfs_mount(const char *path)
{
	static char mounts[MAX_MOUNTS][4096];
	char *abs = realpath(path, NULL);
	int i, n;
	bool found = false;

	if (!abs)
		return false;
	n = fs_ctl_list(mounts, MAX_MOUNTS);
	for (i = 0; i < n && !found; i++)
		found = !strcmp(mounts[i], abs);
	free(abs);
	return found;
}

static int cli_ctl(int argc, char *argv[])
{
	const char *verb = argv[1], *mnt = NULL;
	bool json = false, wait = false;
	int i, status = 0;

	for (i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--json") && !strcmp(verb, "status")) {
			json = true;
		} else if (!strcmp(argv[i], "--wait") &&
			   !strcmp(verb, "flush")) {
			wait = true;
		} else if (argv[i][0] != '-' && !mnt) {
			mnt = argv[i];
		} else {
			fprintf(stderr, "ferryfs: %s: unexpected argument "
					"'%s' (try 'ferryfs --help')\n",
				verb, argv[i]);
			return 2;
		}
	}
	if (mnt && !strcmp(verb, "flush") && wait)
		return flush_wait(mnt);
	if (mnt && !strcmp(verb, "status") && !is_ferryfs_mount(mnt))
		return file_status(mnt, json);
	if (mnt)
		return ask(mnt, verb, json);
	if (strcmp(verb, "status")) {
		fprintf(stderr, "ferryfs: %s: missing MOUNTPOINT\n", verb);
		return 2;
	}
	{
		static char mounts[MAX_MOUNTS][4096];
		int n = fs_ctl_list(mounts, MAX_MOUNTS);

		if (n <= 0) {
			fprintf(stderr, "ferryfs: no ferryfs mount\n");
			return 1;
		}
		for (i = 0; i < n; i++)
			status |= ask(mounts[i], "status", json);
	}
	return status;
}

/*
 * glibc gives a thread's freed memory back to the system once the top of
 * its arena holds more than trim_threshold (dynamic, from 128 KiB), and
 * serves blocks above mmap_threshold with mmap: a flush stream through
 * libnfs allocates and frees a buffer of about a megabyte per WRITE, so
 * every one was faulted in and zeroed anew (page faults, clear_page,
 * madvise in the profile). Kept in the arenas, the flush of 1 GiB at
 * 1 Gbit/s over nfs:// took 5.5 cpu-s of the machine instead of 7.5-9.4
 * (tests/bench/RESULTS.md, 2026-12-05), for an RSS of ~65 MiB after it.
 */
static void malloc_keep(void)
{
	(void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
	(void)mallopt(M_TRIM_THRESHOLD, 128 << 20);
}

#ifdef FERRYFS_FUZZ
/* tests/fuzz/fuzz_ctl.c: what `ferryfs status` and `flush --wait` make
 * of a reply (fs_i.h); the printing goes to stdout, which the fuzzer
 * closes. 0, or -EPROTO for no JSON object, as call() says. */
int fs_cli_reply_fuzz(const char *text)
{
	json_t *reply = json_loads(text, 0, NULL);

	if (!json_is_object(reply)) {
		json_decref(reply);
		return -EPROTO;
	}
	if (json_ok(reply)) {
		print_status(reply);
		print_progress(reply);
	}
	json_decref(reply);
	return 0;
}
#endif

int main(int argc, char *argv[])
{
	struct fuse_args args;
	struct fs_opts o;
	char err[512];
	int status, rc;

	if (argc > 1 && (!strcmp(argv[1], "status") ||
			 !strcmp(argv[1], "flush") ||
			 !strcmp(argv[1], "pause") ||
			 !strcmp(argv[1], "resume")))
		return cli_ctl(argc, argv);

	rc = fs_opts_parse(argc, argv, &args, &o, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "ferryfs: %s\n", err[0] ? err : strerror(-rc));
		status = 2;
	} else if (o.show_help) {
		fs_usage("ferryfs");
		status = 0;
	} else if (o.show_version) {
		printf("ferryfs %s (libfuse %s)\n", FERRYFS_VERSION,
		       fuse_pkgversion());
		status = 0;
	} else {
		log_debug_enabled = o.debug;
		malloc_keep();
		status = fs_run(&args, &o);
	}
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	return status;
}
