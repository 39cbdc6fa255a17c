/*
 * ready.c - telling a service manager how the mount is (Type=notify).
 *
 * When NOTIFY_SOCKET is set (systemd started us as a Type=notify service,
 * e.g. `ferryfs mount -f ...` in a unit), fs_run() starts one thread here
 * after the control socket, just before the session loop:
 *
 *   1. it stat()s the mount point. The kernel holds that GETATTR until the
 *      loop has answered FUSE_INIT and then our getattr: when stat()
 *      returns, the mount answers. Only then READY=1 (with a STATUS= line,
 *      and MAINPID= when daemonized, since the pid systemd forked has
 *      exited then; that needs NotifyAccess=all in the unit);
 *   2. every FS_READY_STATUS_S seconds, STATUS= with what is pending
 *      (fs_status_get(): counters only, no journal scan), sent only when
 *      the line changed;
 *   3. fs_ready_stopping(), when the loop has returned: STOPPING=1 and a
 *      last STATUS=, then the thread ends; fs_ready_free() joins it after
 *      the unmount (a stat() still waiting on a mount that never served
 *      fails with ENOTCONN once the session's fd is closed).
 *
 * Without NOTIFY_SOCKET nothing starts and every call is a no-op. A
 * message that cannot be sent costs a debug line, never the mount.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "fs.h"
#include "fs_i.h"
#include "log.h"
#include "notify.h"

#define FS_READY_STATUS_S 5

struct fs_ready {
	struct fs *fs; /* immutable */
	bool daemonized; /* immutable: send MAINPID= with READY=1 */
	pthread_t thr; /* immutable */
	pthread_mutex_t lock;
	pthread_cond_t cond; /* signalled by fs_ready_stopping() */
	bool stop; /* protected by lock */
	char last[256]; /* the last STATUS= line; the thread only */
};

/* The STATUS= value: mode, pending bytes, files and operations. */
static void status_line(struct fs *fs, char *buf, size_t size)
{
	struct fs_status st;

	if (fs_status_get(fs, &st) < 0) {
		snprintf(buf, size, "status unknown: out of memory");
		return;
	}
	if (!fs->jnl)
		snprintf(buf, size,
			 "write-through: nothing pending, %llu "
			 "remote operations",
			 (unsigned long long)st.remote_ops);
	else
		snprintf(buf, size,
			 "write-back: %llu bytes in %llu files pending "
			 "(%llu ops)%s%s%s",
			 (unsigned long long)st.pending_bytes,
			 (unsigned long long)st.pending_files,
			 (unsigned long long)st.pending_ops,
			 st.paused ? ", flush paused" : "",
			 st.failed ? ", journal failed: " : "",
			 st.failed ? strerror(-st.failed) : "");
	fs_status_release(&st);
}

static void send_msg(const char *what, int rc)
{
	if (rc < 0)
		LOG_DBG("cannot tell the service manager %s: %s", what,
			strerror(-rc));
}

static void *ready_main(void *arg)
{
	struct fs_ready *r = arg;
	struct timespec t;
	struct stat st;
	char line[256];

	/* 1: wait for the mount to answer */
	if (r->fs->mnt_abs && stat(r->fs->mnt_abs, &st) < 0 &&
	    errno == ENOTCONN)
		return NULL; /* the session ended before it served */
	status_line(r->fs, r->last, sizeof(r->last));
	/* under the lock: never a READY=1 after fs_ready_stopping()'s
	 * STOPPING=1 */
	pthread_mutex_lock(&r->lock);
	if (!r->stop && r->daemonized)
		send_msg("READY=1", notify_sendf("READY=1\nMAINPID=%d\n"
						 "STATUS=%s",
						 (int)getpid(), r->last));
	else if (!r->stop)
		send_msg("READY=1",
			 notify_sendf("READY=1\nSTATUS=%s", r->last));
	/* 2: STATUS= now and then */
	while (!r->stop) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		t.tv_sec += FS_READY_STATUS_S;
		while (!r->stop &&
		       pthread_cond_timedwait(&r->cond, &r->lock, &t) == 0)
			;
		if (r->stop)
			break;
		pthread_mutex_unlock(&r->lock);
		status_line(r->fs, line, sizeof(line));
		pthread_mutex_lock(&r->lock);
		if (!r->stop && strcmp(line, r->last)) {
			snprintf(r->last, sizeof(r->last), "%s", line);
			send_msg("STATUS=", notify_sendf("STATUS=%s", line));
		}
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

int fs_ready_start(struct fs *fs)
{
	struct fs_ready *r;
	pthread_condattr_t ca;
	int rc;

	if (!notify_enabled())
		return 0;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->fs = fs;
	r->daemonized = !fs->o->foreground;
	pthread_mutex_init(&r->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r->cond, &ca);
	pthread_condattr_destroy(&ca);
	rc = -pthread_create(&r->thr, NULL, ready_main, r);
	if (rc < 0) {
		pthread_cond_destroy(&r->cond);
		pthread_mutex_destroy(&r->lock);
		free(r);
		return rc;
	}
	fs->ready = r;
	return 0;
}

void fs_ready_stopping(struct fs *fs)
{
	struct fs_ready *r = fs->ready;
	char line[256];

	if (!r)
		return;
	status_line(fs, line, sizeof(line));
	pthread_mutex_lock(&r->lock);
	r->stop = true;
	pthread_cond_signal(&r->cond);
	send_msg("STOPPING=1",
		 notify_sendf("STOPPING=1\nSTATUS=stopping, %s", line));
	pthread_mutex_unlock(&r->lock);
}

void fs_ready_free(struct fs *fs)
{
	struct fs_ready *r = fs->ready;

	if (!r)
		return;
	pthread_join(r->thr, NULL);
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
	free(r);
	fs->ready = NULL;
}
