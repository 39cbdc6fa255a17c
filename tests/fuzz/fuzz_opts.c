/*
 * fuzz_opts.c - libFuzzer target of the option and URL parsers: fs/opts.c
 * fs_opts_parse() (the command line, -o options through libfuse's
 * fuse_opt_parse()), remote/nfs.c and remote/smb.c parse_url() (through
 * their FERRYFS_FUZZ hooks, remote_i.h), remote/throttle.c
 * rmt_throttle_parse() and rmt_parse_rate(), remote/pool.c
 * rmt_pool_parse().
 *
 * Input: one byte that picks the parser, then its text (made a C string;
 * for fs_opts_parse() the words of argv, one a line, after "ferryfs").
 * Every parser must answer 0 or -errno and leave nothing behind (the
 * LeakSanitizer checks the releases). Built and run by tests/fuzz/fuzz.sh
 * opts.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fuse_opt.h>

#include "fs.h"
#include "log.h"
#include "remote_i.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define ARGV_MAX 64

static void quiet(enum fuse_log_level level, const char *fmt, va_list ap)
{
	(void)level;
	(void)fmt;
	(void)ap;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuse_set_log_func(quiet); /* the parsers log every refusal */
	return 0;
}

static void cmdline(char *text)
{
	char *argv[ARGV_MAX + 1], err[256], *save = NULL, *w;
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fs_opts o;
	int argc = 0;

	argv[argc++] = "ferryfs";
	for (w = strtok_r(text, "\n", &save); w && argc < ARGV_MAX;
	     w = strtok_r(NULL, "\n", &save))
		argv[argc++] = w;
	argv[argc] = NULL;
	if (fs_opts_parse(argc, argv, &args, &o, err, sizeof(err)) < 0 &&
	    !memchr(err, '\0', sizeof(err)))
		abort(); /* an error message without its NUL */
	fs_opts_release(&o);
	fuse_opt_free_args(&args);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rmt_throttle_opts t;
	char *text, *rest = NULL;
	unsigned int n;
	uint64_t rate;

	if (size < 1 || size > 8192)
		return 0;
	text = malloc(size);
	if (!text)
		return 0;
	memcpy(text, data + 1, size - 1);
	text[size - 1] = '\0';
	switch (data[0] % 6) {
	case 0:
		(void)rmt_nfs_parse_url_fuzz(text);
		break;
	case 1:
		(void)rmt_smb_parse_url_fuzz(text);
		break;
	case 2:
		memset(&t, 0, sizeof(t));
		if (rmt_throttle_parse(text, &t, &rest) == 0)
			rmt_throttle_opts_release(&t);
		free(rest);
		break;
	case 3:
		(void)rmt_parse_rate(text, &rate);
		break;
	case 4:
		if (rmt_pool_parse(text, &n, &rest) == 0 && rest && n == 0)
			abort(); /* rest given without the option */
		free(rest);
		break;
	default:
		cmdline(text);
		break;
	}
	free(text);
	return 0;
}
