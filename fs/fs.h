/*
 * fs.h - the FUSE side of ferryfs: command line, options, the daemon.
 *
 * fs/ is the only module that includes <fuse_lowlevel.h>. It links journal/,
 * cache/ and remote/; nothing links fs/ but the ferryfs binary and tests.
 */
#ifndef FERRYFS_FS_H
#define FERRYFS_FS_H

#include <stdbool.h>

struct fuse_args;

/* What the command line asked for. Strings are malloc'ed; release with
 * fs_opts_release(). A flag fuse_opt sets (OPT() in opts.c) is an int:
 * fuse_opt stores an int there, which a bool field would overrun. */
struct fs_opts {
	char *remote;       /* REMOTE (first non-option argument) */
	char *mountpoint;   /* MOUNTPOINT (second) */
	char *remote_opts;  /* -o remote_*=...: for rmt_open(), or NULL */
	bool foreground;    /* -f */
	bool debug;         /* -d */
	int single_thread;  /* -s */
	bool show_help;     /* -h, --help */
	bool show_version;  /* -V, --version */
	double attr_timeout;     /* -o attr_timeout=SEC, default 1 */
	double entry_timeout;    /* -o entry_timeout=SEC, default 1 */
	double negative_timeout; /* -o negative_timeout=SEC, default 1 */
	int no_allow_other;      /* -o noallow_other: not even as root */
	int no_direct_write;     /* -o no_direct_write: write-only opens
				    through the page cache too */
	int passthrough;         /* -o passthrough: write-only copies of new
				    files straight into the journal (pt.c) */
	unsigned int max_threads;  /* -o max_threads=N, default 16 */
	unsigned int max_read;     /* -o max_read=BYTES: the largest read
				      the kernel sends (FS_MAX_READ) */
	unsigned int max_background; /* -o max_background=N: FUSE requests
					the kernel keeps in flight in the
					background, read-ahead's above all
					(FS_MAX_BACKGROUND) */
	int clone_fd;              /* -o clone_fd (libfuse's) */
	unsigned int max_idle_threads; /* -o max_idle_threads=N */
	/* write-back over the journal (journal/) */
	bool writeback;            /* -o writeback=on|off, default on */
	char *journal;             /* -o journal=DIR, or NULL: the default
				      (fs_state_default()) */
	unsigned int streams;      /* -o streams=N, default 4 */
	unsigned int chunk_size;   /* -o chunk_size=SIZE, 0: the journal's */
	bool sync_remote;          /* -o sync=remote (default sync=journal) */
	bool verify;               /* -o verify=readback */
	unsigned long long bwlimit;     /* -o bwlimit=RATE, 0: none */
	unsigned long long journal_max; /* -o journal_max=SIZE, 0: disk */
	int adopt;                 /* -o adopt: bind the journal to this
				      share even if it was bound to
				      another (bind.c) */
	/* reads: the block cache and read-ahead (cache/, fs/read.c) */
	char *cache;               /* -o cache=DIR, NULL: the default */
	bool no_cache;             /* -o cache=off */
	int cache_local;           /* -o cache_local: cache a share on a
				      local file system too (RMT_CAP_LOCAL) */
	unsigned long long cache_max; /* -o cache_max=SIZE, 0: the cache's */
	unsigned int readahead;    /* -o readahead=N streams, 0 = off (4) */
	char *s_cache_ttl;         /* -o cache_ttl=SEC: attr_timeout and
				      entry_timeout, as given */
	char *s_cache_max;
	/* ferry-agent next to the share (remote/agent.c) */
	char *agent;               /* -o agent=HOST:PORT, or NULL */
	char *agent_key;           /* -o agent_key=FILE */
	int agent_encrypt;         /* -o agent_encrypt */
	/* the strings behind the values above, as given (parse_into) */
	char *s_writeback, *s_sync, *s_verify, *s_bwlimit, *s_journal_max,
		*s_chunk_size;
};

/*
 * Parse argv (program name first; an optional "mount" verb after it) into
 * @o. Options meant for libfuse's session (allow_other, ro, fsname...) stay
 * in @args, to which the defaults ferryfs needs (default_permissions,
 * fsname=REMOTE, subtype=ferryfs, allow_other when root) are added.
 * Errors: -EINVAL with one line in @err (a missing argument, a bad value).
 * Caller releases @args with fuse_opt_free_args() and @o with
 * fs_opts_release().
 */
int fs_opts_parse(int argc, char *argv[], struct fuse_args *args,
		  struct fs_opts *o, char *err, unsigned long errsize);
void fs_opts_release(struct fs_opts *o);

/* The default directory of @kind ("journal" or "cache") for the share
 * whose rmt_id() is @id: /var/lib/ferryfs/KIND/<hash> as root, else
 * $XDG_STATE_HOME/ferryfs/journal/<hash> (~/.local/state when unset) or
 * $XDG_CACHE_HOME/ferryfs/cache/<hash> (~/.cache). Caller frees. NULL on
 * ENOMEM or without HOME. */
char *fs_state_default(const char *kind, const char *id);

/* Print the usage text (ferryfs's and libfuse's options) to stdout. */
void fs_usage(const char *progname);

/* Run the daemon: open the remote, mount, serve until unmounted. Returns
 * the process exit status (0 after a clean unmount). */
int fs_run(struct fuse_args *args, const struct fs_opts *o);

#endif
