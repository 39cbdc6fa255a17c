/*
 * opts.c - the command line of ferryfs (see fs.h).
 *
 *   ferryfs [mount] REMOTE MOUNTPOINT [-f] [-d] [-s] [-o opt[,opt...]]
 *
 * The second form without "mount" is what mount.fuse3 runs for an fstab
 * line of type fuse.ferryfs. Our own options are taken out of the argument
 * list; libfuse's session options (allow_other, ro, max_read...) stay in it
 * and fuse_session_new() rejects any it does not know, with one line.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <fuse_opt.h>

#include "fs.h"
#include "fs_i.h"
#include "remote.h"

enum {
	KEY_HELP,
	KEY_VERSION,
	KEY_DEBUG,
	KEY_FOREGROUND,
	KEY_REMOTE_OPT,
};

#define OPT(t, field) { t, offsetof(struct fs_opts, field), 1 }
#define OPTV(t, field) { t, offsetof(struct fs_opts, field), 0 }

static const struct fuse_opt opt_spec[] = {
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_KEY("-d", KEY_DEBUG),
	FUSE_OPT_KEY("debug", KEY_DEBUG),
	FUSE_OPT_KEY("-f", KEY_FOREGROUND),
	/* the remote's own options (remote/throttle.c): passed to rmt_open */
	FUSE_OPT_KEY("remote_rate=", KEY_REMOTE_OPT),
	FUSE_OPT_KEY("remote_stream_rate=", KEY_REMOTE_OPT),
	FUSE_OPT_KEY("remote_latency=", KEY_REMOTE_OPT),
	FUSE_OPT_KEY("remote_fault=", KEY_REMOTE_OPT),
	FUSE_OPT_KEY("connections=", KEY_REMOTE_OPT),
	FUSE_OPT_KEY("credentials=", KEY_REMOTE_OPT), /* smb:// (smb.c) */
	OPT("-s", single_thread),
	OPT("clone_fd", clone_fd),
	OPTV("max_idle_threads=%u", max_idle_threads),
	OPTV("max_threads=%u", max_threads),
	OPTV("max_read=%u", max_read),
	OPTV("max_background=%u", max_background),
	OPTV("attr_timeout=%lf", attr_timeout),
	OPTV("entry_timeout=%lf", entry_timeout),
	OPTV("negative_timeout=%lf", negative_timeout),
	OPT("noallow_other", no_allow_other),
	OPT("no_direct_write", no_direct_write),
	OPT("passthrough", passthrough),
	OPTV("writeback=%s", s_writeback),
	OPTV("journal=%s", journal),
	OPTV("streams=%u", streams),
	OPTV("chunk_size=%s", s_chunk_size),
	OPTV("sync=%s", s_sync),
	OPTV("verify=%s", s_verify),
	OPTV("bwlimit=%s", s_bwlimit),
	OPTV("journal_max=%s", s_journal_max),
	OPT("adopt", adopt),
	OPTV("cache=%s", cache),
	OPTV("cache_max=%s", s_cache_max),
	OPT("cache_local", cache_local),
	OPTV("readahead=%u", readahead),
	OPTV("cache_ttl=%s", s_cache_ttl),
	OPTV("agent=%s", agent),
	OPTV("agent_key=%s", agent_key),
	OPT("agent_encrypt", agent_encrypt),
	FUSE_OPT_END
};

/* fuse_opt_parse() stores options at offsets of struct fs_opts in its data
 * pointer, so the options come first */
struct parse_ctx {
	struct fs_opts o;
	char *err;
	unsigned long errsize;
	int rc;
};

static int opt_proc(void *data, const char *arg, int key,
		    struct fuse_args *outargs)
{
	struct parse_ctx *c = data;
	struct fs_opts *o = &c->o;

	(void)outargs;
	switch (key) {
	case KEY_HELP:
		o->show_help = true;
		return 0;
	case KEY_VERSION:
		o->show_version = true;
		return 0;
	case KEY_DEBUG:
		o->debug = true;
		o->foreground = true;
		return 1; /* keep: libfuse then prints every request */
	case KEY_FOREGROUND:
		o->foreground = true;
		return 0;
	case KEY_REMOTE_OPT:
		if (fuse_opt_add_opt(&o->remote_opts, arg) < 0) {
			c->rc = -ENOMEM;
			return -1;
		}
		return 0;
	case FUSE_OPT_KEY_NONOPT: {
		char **slot = !o->remote       ? &o->remote
			      : !o->mountpoint ? &o->mountpoint
					       : NULL;

		if (!slot) {
			snprintf(c->err, c->errsize,
				 "unexpected argument '%s'", arg);
			c->rc = -EINVAL;
			return -1;
		}
		*slot = strdup(arg);
		if (!*slot) {
			c->rc = -ENOMEM;
			return -1;
		}
		return 0;
	}
	default:
		return 1;
	}
}

static int parse_size(const char *name, const char *s, unsigned long long *out,
		      char *err, unsigned long errsize)
{
	uint64_t v;

	if (rmt_parse_rate(s, &v) < 0) {
		snprintf(err, errsize, "bad %s '%s' (a number with K, M, G, "
			 "Ki, Mi or Gi)", name, s);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

/* The write-back options given as strings, into their values. */
static int parse_journal_opts(struct fs_opts *o, char *err,
			      unsigned long errsize)
{
	uint64_t v;

	o->writeback = true;
	if (o->s_writeback) {
		if (!strcmp(o->s_writeback, "off"))
			o->writeback = false;
		else if (strcmp(o->s_writeback, "on"))
			goto bad_writeback;
	}
	if (o->s_sync) {
		if (!strcmp(o->s_sync, "remote"))
			o->sync_remote = true;
		else if (strcmp(o->s_sync, "journal"))
			goto bad_sync;
	}
	if (o->s_verify) {
		if (!strcmp(o->s_verify, "readback"))
			o->verify = true;
		else if (strcmp(o->s_verify, "none"))
			goto bad_verify;
	}
	if (o->streams < 1 || o->streams > 64) {
		snprintf(err, errsize, "streams must be 1..64");
		return -EINVAL;
	}
	if (o->s_bwlimit && parse_size("bwlimit", o->s_bwlimit, &o->bwlimit,
					 err, errsize) < 0)
		return -EINVAL;
	if (o->s_journal_max &&
	    parse_size("journal_max", o->s_journal_max, &o->journal_max, err,
		       errsize) < 0)
		return -EINVAL;
	if (o->s_chunk_size) {
		if (rmt_parse_rate(o->s_chunk_size, &v) < 0 ||
		    v < (64u << 10) || v > (64u << 20) || (v & (v - 1))) {
			snprintf(err, errsize, "chunk_size must be a power of "
				 "two from 64Ki to 64Mi (e.g. 4Mi)");
			return -EINVAL;
		}
		o->chunk_size = (unsigned int)v;
	}
	if (o->s_cache_max &&
	    parse_size("cache_max", o->s_cache_max, &o->cache_max, err,
		       errsize) < 0)
		return -EINVAL;
	if (o->cache && !strcmp(o->cache, "off")) {
		o->no_cache = true;
	} else if (o->cache && !o->cache[0]) {
		snprintf(err, errsize, "cache= needs a directory or off");
		return -EINVAL;
	}
	if (o->readahead > 64) {
		snprintf(err, errsize, "readahead must be 0..64");
		return -EINVAL;
	}
	if (o->journal && !o->journal[0]) {
		snprintf(err, errsize, "journal= needs a directory");
		return -EINVAL;
	}
	if ((o->agent_key || o->agent_encrypt) && !o->agent) {
		snprintf(err, errsize, "agent_key= and agent_encrypt go with "
			 "agent=HOST:PORT");
		return -EINVAL;
	}
	if (o->agent && (!o->agent[0] || !strchr(o->agent, ':'))) {
		snprintf(err, errsize, "agent= needs HOST:PORT");
		return -EINVAL;
	}
	if (o->agent && !o->agent_key) {
		snprintf(err, errsize, "agent= needs agent_key=FILE (the key "
			 "ferry-agent was started with)");
		return -EINVAL;
	}
	if (o->agent && !o->writeback) {
		snprintf(err, errsize, "agent= flushes the journal: it needs "
			 "writeback=on");
		return -EINVAL;
	}
	return 0;
bad_writeback:
	snprintf(err, errsize, "writeback must be on or off");
	return -EINVAL;
bad_sync:
	snprintf(err, errsize, "sync must be journal or remote");
	return -EINVAL;
bad_verify:
	snprintf(err, errsize, "verify must be readback or none");
	return -EINVAL;
}

static int parse_into(struct parse_ctx *cp, int argc, char *argv[],
		      struct fuse_args *args)
{
	struct fs_opts *o = &cp->o;
	char *err = cp->err;
	unsigned long errsize = cp->errsize;
	int i;

	o->attr_timeout = 1.0;
	o->entry_timeout = 1.0;
	o->negative_timeout = 1.0;
	o->max_threads = 16;
	o->max_read = FS_MAX_READ;
	o->max_background = FS_MAX_BACKGROUND;
	o->max_idle_threads = 8;
	o->streams = 4;
	o->readahead = 4;
	if (errsize)
		err[0] = '\0';

	args->argc = 0;
	args->argv = NULL;
	args->allocated = 0;
	for (i = 0; i < argc; i++) {
		/* the "mount" verb is optional: "ferryfs mount R M" */
		if (i == 1 && !strcmp(argv[i], "mount"))
			continue;
		if (fuse_opt_add_arg(args, argv[i]) < 0)
			return -ENOMEM;
	}
	if (fuse_opt_parse(args, cp, opt_spec, opt_proc) < 0) {
		if (!cp->rc) {
			/* fuse_opt_parse already printed its reason */
			snprintf(err, errsize, "cannot parse the options");
			cp->rc = -EINVAL;
		}
		return cp->rc;
	}
	if (o->show_help || o->show_version)
		return 0;
	if (!o->remote || !o->mountpoint) {
		snprintf(err, errsize, "%s",
			 !o->remote ? "missing REMOTE and MOUNTPOINT "
				      "(try 'ferryfs --help')"
				    : "missing MOUNTPOINT (try 'ferryfs --help')");
		return -EINVAL;
	}
	if (o->s_cache_ttl) {
		/* attributes between opens: the kernel keeps them (and the
		 * names) this long; every open still asks the share */
		char *end;
		double v = strtod(o->s_cache_ttl, &end);

		if (end == o->s_cache_ttl || *end || !(v >= 0 && v <= 86400)) {
			snprintf(err, errsize, "cache_ttl must be 0 to 86400 "
				 "seconds");
			return -EINVAL;
		}
		o->attr_timeout = o->entry_timeout = v;
	}
	if (o->attr_timeout < 0 || o->entry_timeout < 0 ||
	    o->negative_timeout < 0) {
		snprintf(err, errsize, "timeouts must not be negative");
		return -EINVAL;
	}
	if (o->max_threads < 1 || o->max_threads > 1024) {
		snprintf(err, errsize, "max_threads must be 1..1024");
		return -EINVAL;
	}

	if (o->max_background < 1 || o->max_background > 1024) {
		snprintf(err, errsize, "max_background must be 1..1024");
		return -EINVAL;
	}
	if (o->max_read < 4096 || o->max_read > FS_MAX_WRITE) {
		snprintf(err, errsize, "max_read must be 4096..%u",
			 FS_MAX_WRITE);
		return -EINVAL;
	}

	if (parse_journal_opts(o, err, errsize) < 0)
		return -EINVAL;

	if (fuse_opt_add_arg(args, "-odefault_permissions") < 0 ||
	    fuse_opt_add_arg(args, "-osubtype=ferryfs") < 0)
		return -ENOMEM;
	{
		/* libfuse wants it as a mount option and in init() */
		char mr[32];

		snprintf(mr, sizeof(mr), "-omax_read=%u", o->max_read);
		if (fuse_opt_add_arg(args, mr) < 0)
			return -ENOMEM;
	}
	{
		char *esc = NULL, *fsname = NULL;
		int rc;

		/* fsname=REMOTE, with commas and backslashes escaped */
		if (fuse_opt_add_opt_escaped(&esc, o->remote) < 0)
			return -ENOMEM;
		rc = asprintf(&fsname, "-ofsname=%s", esc);
		free(esc);
		if (rc < 0)
			return -ENOMEM;
		rc = fuse_opt_add_arg(args, fsname);
		free(fsname);
		if (rc < 0)
			return -ENOMEM;
	}
	if (geteuid() == 0 && !o->no_allow_other &&
	    fuse_opt_add_arg(args, "-oallow_other") < 0)
		return -ENOMEM;
	return 0;
}

int fs_opts_parse(int argc, char *argv[], struct fuse_args *args,
		  struct fs_opts *o, char *err, unsigned long errsize)
{
	struct parse_ctx c = { .err = err, .errsize = errsize };
	int rc = parse_into(&c, argc, argv, args);

	*o = c.o;
	return rc;
}

void fs_opts_release(struct fs_opts *o)
{
	free(o->remote);
	free(o->mountpoint);
	free(o->remote_opts);
	free(o->journal);
	free(o->s_writeback);
	free(o->s_sync);
	free(o->s_verify);
	free(o->s_bwlimit);
	free(o->s_journal_max);
	free(o->s_chunk_size);
	free(o->cache);
	free(o->s_cache_max);
	free(o->s_cache_ttl);
	o->s_cache_ttl = NULL;
	free(o->agent);
	free(o->agent_key);
	o->agent = o->agent_key = NULL;
	o->cache = o->s_cache_max = NULL;
	o->journal = o->s_writeback = o->s_sync = o->s_verify = NULL;
	o->s_bwlimit = o->s_journal_max = o->s_chunk_size = NULL;
	o->remote = NULL;
	o->mountpoint = NULL;
	o->remote_opts = NULL;
}

void fs_usage(const char *progname)
{
	printf("usage: %s mount REMOTE MOUNTPOINT [options]\n"
	       "       %s REMOTE MOUNTPOINT [options]   (mount.fuse3, fstab)\n"
	       "       ferryfs status [MOUNTPOINT] [--json]\n"
	       "       ferryfs flush MOUNTPOINT [--wait]\n"
	       "       ferryfs pause|resume MOUNTPOINT\n"
	       "\n"
	       "Mount the share REMOTE (a mounted directory) at MOUNTPOINT.\n"
	       "\n"
	       "general options:\n"
	       "    -h, --help             print this help\n"
	       "    -V, --version          print the version\n"
	       "    -f                     stay in the foreground\n"
	       "    -d, -o debug           debug output (implies -f)\n"
	       "    -s                     single-threaded\n"
	       "\n"
	       "ferryfs options:\n"
	       "    -o attr_timeout=SEC    cache attributes for SEC (1)\n"
	       "    -o entry_timeout=SEC   cache names for SEC (1)\n"
	       "    -o negative_timeout=SEC  cache 'no such file' for SEC (1)\n"
	       "    -o noallow_other       as root, do not add allow_other\n"
	       "    -o no_direct_write     page-cache writes for write-only\n"
	       "                           opens too (slower; see README)\n"
	       "    -o passthrough         write-only copies of new files go\n"
	       "                           from the kernel into the journal\n"
	       "                           (Linux >= 6.9, root; see README)\n"
	       "    -o max_threads=N       at most N worker threads (16)\n"
	       "    -o max_idle_threads=N  keep N idle threads (8)\n"
	       "    -o max_read=BYTES      largest read the kernel asks for (512Ki:\n"
	       "                           a reply then fits a pipe and is spliced)\n"
	       "    -o max_background=N    FUSE requests the kernel keeps in flight\n"
	       "                           for read-ahead and write-back (64)\n"
	       "    -o clone_fd            one /dev/fuse fd per thread\n"
	       "    -o connections=N       connections to an nfs:// or smb://\n"
	       "                           remote (4)\n"
	       "    -o credentials=FILE    smb:// login (user, password,\n"
	       "                           domain; mode 0600)\n"
	       "\n"
	       "write-back (the journal; see README):\n"
	       "    -o writeback=on|off    on: writes land in a local journal and\n"
	       "                           reach the remote in the background (on);\n"
	       "                           off: every operation straight to the remote\n"
	       "    -o journal=DIR         the journal (/var/lib/ferryfs/journal/ID as\n"
	       "                           root, else $XDG_STATE_HOME/ferryfs/journal/ID)\n"
	       "    -o streams=N           parallel flush streams (4)\n"
	       "    -o chunk_size=SIZE     chunk of a new journal (4Mi)\n"
	       "    -o sync=journal|remote fsync: durable in the journal (journal), or\n"
	       "                           fsync and close wait for the remote (remote)\n"
	       "    -o bwlimit=RATE        cap the flush at RATE bytes/s\n"
	       "    -o journal_max=SIZE    bound the journal; writers wait for the flush\n"
	       "    -o adopt               bind the journal to this share although it\n"
	       "                           has no marker of it (a journal is refused\n"
	       "                           on a share without its marker)\n"
	       "    -o verify=readback     read every flushed chunk back and compare\n"
	       "    -o agent=HOST:PORT     flush through ferry-agent next to the share\n"
	       "    -o agent_key=FILE      the key ferry-agent was started with\n"
	       "    -o agent_encrypt       encrypt the agent's traffic too\n"
	       "\n"
	       "reads (the block cache; see README):\n"
	       "    -o cache=DIR|off       the block cache of files read from the\n"
	       "                           share (/var/lib/ferryfs/cache/ID as root)\n"
	       "    -o cache_max=SIZE      bound the cache (1/10 of its disk's free space)\n"
	       "    -o cache_local         cache a share on a local disk too (not\n"
	       "                           cached: it reads as fast as the cache)\n"
	       "    -o readahead=N         parallel read-ahead streams, 0 = off (4)\n"
	       "    -o cache_ttl=SEC       trust a file's attributes SEC between opens\n"
	       "                           (sets attr_timeout and entry_timeout; an\n"
	       "                           open always asks the share) (1)\n"
	       "\n"
	       "simulation aids (slow the remote down, to measure without a\n"
	       "network; RATE in bytes/s with K/M/G or Ki/Mi/Gi):\n"
	       "    -o remote_rate=RATE    all streams together\n"
	       "    -o remote_stream_rate=RATE  each stream (thread)\n"
	       "    -o remote_latency=DURATION  added to every remote call\n"
	       "    -o remote_fault=FILE   remote calls fail while FILE exists\n"
	       "\n"
	       "Run as root, ferryfs adds allow_other; it always adds\n"
	       "default_permissions (the kernel checks access) and\n"
	       "fsname=REMOTE,subtype=ferryfs.\n"
	       "\n"
	       "FUSE options:\n",
	       progname, progname);
	fuse_lowlevel_help();
}

char *fs_state_default(const char *kind, const char *id)
{
	/* FNV-1a of the share's id: one directory per share */
	unsigned long long h = 1469598103934665603ull;
	bool cache = !strcmp(kind, "cache");
	const char *base, *home, *sub = "";
	char *out = NULL;

	for (; *id; id++) {
		h ^= (unsigned char)*id;
		h *= 1099511628211ull;
	}
	if (geteuid() == 0) {
		base = "/var/lib";
	} else {
		base = getenv(cache ? "XDG_CACHE_HOME" : "XDG_STATE_HOME");
		if (!base || base[0] != '/') {
			home = getenv("HOME");
			if (!home || home[0] != '/')
				return NULL;
			base = home;
			sub = cache ? "/.cache" : "/.local/state";
		}
	}
	if (asprintf(&out, "%s%s/ferryfs/%s/%016llx", base, sub, kind, h) < 0)
		return NULL;
	return out;
}
