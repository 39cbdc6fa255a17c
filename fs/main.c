/*
 * main.c - the ferryfs command.
 *
 *   ferryfs [mount] REMOTE MOUNTPOINT [options]   run the daemon (fs_run)
 *   ferryfs status [MOUNTPOINT|FILE] [--json]      ask mounts (ctl.c), or
 *                                                  a file's state
 *   ferryfs flush MOUNTPOINT [--wait]
 *   ferryfs pause|resume MOUNTPOINT
 *
 * One clear line on stderr and a non-zero exit for anything wrong.
 */
#include <errno.h>
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

/* The number after "key": in a flat JSON object, or -1. */
static long long json_num(const char *json, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\": ", key);
	p = strstr(json, pat);
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* The string after "key": (no escapes in our replies), or "". */
static void json_str(const char *json, const char *key, char *out,
		     size_t size)
{
	char pat[64];
	const char *p, *end;
	size_t n;

	out[0] = '\0';
	snprintf(pat, sizeof(pat), "\"%s\": \"", key);
	p = strstr(json, pat);
	if (!p)
		return;
	p += strlen(pat);
	end = strchr(p, '"');
	n = end ? (size_t)(end - p) : strlen(p);
	if (n >= size)
		n = size - 1;
	memcpy(out, p, n);
	out[n] = '\0';
}

static bool json_ok(const char *json)
{
	return strstr(json, "\"ok\": true") != NULL;
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
static void print_streams(const char *reply)
{
	const char *p = strstr(reply, "\"streams\": [");
	char state[32], rate[32], via[16];
	int i = 0;

	if (!p)
		return;
	printf("  streams:");
	while ((p = strstr(p, "{\"state\": \""))) {
		json_str(p, "state", state, sizeof(state));
		json_str(p, "via", via, sizeof(via));
		human_bytes(json_num(p, "rate_bps"), rate, sizeof(rate));
		printf("%s %d %s %s/s via %s", i ? "," : "", i, state, rate,
		       via);
		p++;
		i++;
	}
	printf("%s\n", i ? "" : " none");
}

/* The "conflict_paths" of a status reply, one line each (JSON strings:
 * the escapes wb.c makes are undone). */
static void print_conflicts(const char *reply)
{
	const char *p = strstr(reply, "\"conflict_paths\": [");

	if (!p)
		return;
	p += strlen("\"conflict_paths\": [");
	while (*p == '"') {
		printf("    ");
		for (p++; *p && *p != '"'; p++) {
			unsigned int c;

			if (*p == '\\' && p[1] == 'u' &&
			    sscanf(p + 2, "%4x", &c) == 1) {
				putchar((int)c);
				p += 5;
			} else if (*p == '\\' && p[1]) {
				putchar(*++p);
			} else {
				putchar(*p);
			}
		}
		putchar('\n');
		if (*p == '"')
			p++;
		if (*p == ',')
			p++;
	}
}

static void print_status(const char *reply)
{
	char mnt[4096], remote[4096], mode[64], pend[32], rd[32], wr[32],
		rate[32], resent[32];
	long long eta = json_num(reply, "eta_s");
	const char *c;

	json_str(reply, "mountpoint", mnt, sizeof(mnt));
	json_str(reply, "remote", remote, sizeof(remote));
	json_str(reply, "mode", mode, sizeof(mode));
	human_bytes(json_num(reply, "pending_bytes"), pend, sizeof(pend));
	human_bytes(json_num(reply, "remote_bytes_read"), rd, sizeof(rd));
	human_bytes(json_num(reply, "remote_bytes_written"), wr, sizeof(wr));
	printf("%s  (%s, %s)\n", mnt, remote, mode);
	printf("  pending: %s in %lld files, %lld ops; paused: %s\n", pend,
	       json_num(reply, "pending_files"), json_num(reply, "pending_ops"),
	       strstr(reply, "\"paused\": true") ? "yes" : "no");
	if (!strcmp(mode, "write-back")) {
		human_bytes(json_num(reply, "rate_bps"), rate, sizeof(rate));
		human_bytes(json_num(reply, "resent_bytes"), resent,
			    sizeof(resent));
		if (strstr(reply, "\"drained\": true"))
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
	if ((c = strstr(reply, "\"cache\": {"))) {
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
		char off[256];

		json_str(reply, "cache_off", off, sizeof(off));
		printf("  cache: off: %s\n", off);
	}
}

/* One line of progress, rewritten in place on a terminal. */
static void print_progress(const char *reply)
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
	char reply[8192], err[512];
	int rc = fs_ctl_call(mnt, "flush", reply, sizeof(reply));

	if (rc < 0)
		return reach_err(mnt, rc);
	for (;;) {
		rc = fs_ctl_call(mnt, "status", reply, sizeof(reply));
		if (rc < 0)
			return reach_err(mnt, rc);
		if (!json_ok(reply)) {
			json_str(reply, "error", err, sizeof(err));
			fprintf(stderr, "ferryfs: flush: %s\n", err);
			return 1;
		}
		if (json_num(reply, "failed") != 0) {
			fprintf(stderr, "%sferryfs: flush: the journal failed "
					"(%s); see the log\n",
				tty ? "\n" : "",
				strerror((int)-json_num(reply, "failed")));
			return 1;
		}
		if (strstr(reply, "\"drained\": true"))
			break;
		if (strstr(reply, "\"paused\": true")) {
			fprintf(stderr, "%sferryfs: flush: the flush of '%s' is "
					"paused: nothing goes to the remote "
					"until 'ferryfs resume %s'\n",
				tty ? "\n" : "", mnt, mnt);
			return 1;
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
		return 1;
	}
	printf("%s: everything is on the remote\n", mnt);
	return 0;
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
	if (json)
		printf("{\"ok\": true, \"path\": \"%s\", \"state\": \"%s\"}\n",
		       path, v);
	else
		printf("%s: %s\n", path, v);
	return 0;
}

/* One command to one mount; prints the reply. Returns the exit status. */
static int ask(const char *mnt, const char *cmd, bool json)
{
	char reply[8192], err[512];
	int rc = fs_ctl_call(mnt, cmd, reply, sizeof(reply));
	bool live = !json && !strcmp(cmd, "status") && isatty(STDOUT_FILENO);
	int lines = 0;

	if (rc < 0)
		return reach_err(mnt, rc);
	if (json) {
		printf("%s\n", reply);
		return json_ok(reply) ? 0 : 1;
	}
	if (!json_ok(reply)) {
		json_str(reply, "error", err, sizeof(err));
		fprintf(stderr, "ferryfs: %s: %s\n", cmd, err);
		return 1;
	}
	if (!strcmp(cmd, "status")) {
		/* on a terminal: live while the flush goes on */
		for (;;) {
			print_status(reply);
			lines = strstr(reply, "\"cache\": {") ? 8 : 7;
			if (!live || !strstr(reply, "\"mode\": \"write-back\"") ||
			    strstr(reply, "\"drained\": true") ||
			    strstr(reply, "\"paused\": true"))
				break;
			sleep(1);
			if (fs_ctl_call(mnt, cmd, reply, sizeof(reply)) < 0 ||
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
	return 0;
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
