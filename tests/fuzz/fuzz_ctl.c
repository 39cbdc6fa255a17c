/*
 * fuzz_ctl.c - libFuzzer target of the control socket's protocol (fs/ctl.c
 * invariants, "Protocol"): both of its reading sides, fed through a pipe
 * as a peer's bytes would come through the socket.
 *
 * Input: one byte that picks the side, then the bytes the peer sends.
 *  0: the daemon's: fs_ctl_read_line() into the 128-byte buffer of
 *     serve_one(), then fs_ctl_parse() of the line (the dispatch of
 *     ops.c ctl_handle() and wb.c fs_wb_ctl()).
 *  1: the client's: fs_ctl_read_reply(), then what `ferryfs status` and
 *     `flush --wait` make of the reply (main.c, fs_cli_reply_fuzz():
 *     jansson and the printers, stdout closed).
 * Built and run by tests/fuzz/fuzz.sh ctl.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include "fs_i.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A pipe holding @len bytes of @p, its write end closed: the read end. */
static int feed(const uint8_t *p, size_t len)
{
	int fds[2];

	if (pipe2(fds, O_CLOEXEC) < 0)
		abort();
	if (len && write(fds[1], p, len) != (ssize_t)len)
		abort(); /* max_len is below a pipe's 64 KiB */
	close(fds[1]);
	return fds[0];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *reply, *line;
	int fd, n;

	if (size < 1 || size > 16384)
		return 0;
	fd = feed(data + 1, size - 1);
	if (data[0] & 1) {
		n = fs_ctl_read_reply(fd, &reply);
		if (n >= 0) {
			if (strlen(reply) > (size_t)n)
				abort();
			(void)fs_cli_reply_fuzz(reply);
			free(reply);
		}
	} else {
		/* exactly serve_one()'s buffer, on the heap for ASan */
		line = malloc(128);
		if (!line)
			abort();
		n = fs_ctl_read_line(fd, line, 128);
		if (n > 0) {
			enum fs_ctl_cmd c = fs_ctl_parse(line);

			if (strlen(line) > 127 ||
			    (c != FS_CTL_UNKNOWN && strlen(line) > 6))
				abort();
		}
		free(line);
	}
	close(fd);
	return 0;
}
