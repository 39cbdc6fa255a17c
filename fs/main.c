/*
 * main.c - the ferryfs command: parse the command line, print help or the
 * version, or run the daemon (fs_run). One clear line on stderr and a
 * non-zero exit for anything wrong before the mount.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include "fs.h"
#include "log.h"

int main(int argc, char *argv[])
{
	struct fuse_args args;
	struct fs_opts o;
	char err[512];
	int status;
	int rc = fs_opts_parse(argc, argv, &args, &o, err, sizeof(err));

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
		status = fs_run(&args, &o);
	}
	fuse_opt_free_args(&args);
	fs_opts_release(&o);
	return status;
}
