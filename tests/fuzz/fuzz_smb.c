/*
 * fuzz_smb.c - libFuzzer target of the smb driver's worker protocol
 * (remote/smb.c, "Worker processes": struct req and its paths one way,
 * struct rep and its data the other), its two decoding ends fed the
 * input through a socketpair as the peer process would write it.
 *
 * Input: one byte that picks the end (low 2 bits), then the peer's bytes.
 *  0: the worker reading its conf (recv_conf());
 *  1: the worker reading requests (worker_read_req(): lengths checked,
 *     paths made into URLs), up to 64 of them;
 *  2: the parent reading a reply into a struct stat (exchange());
 *  3: the parent reading a READDIR reply and walking its listing
 *     (exchange(), listing_walk()).
 * Through the FERRYFS_FUZZ hooks of smb.c (remote_i.h). Built and run by
 * tests/fuzz/fuzz.sh smb.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "remote_i.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

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
	fuse_set_log_func(quiet);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];

	if (size < 1 || size > 65536)
		return 0;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	/* the peer's bytes, then its end of stream; its end stays open for
	 * the parent's request to be sent */
	if (size > 1 && write(sv[1], data + 1, size - 1) != (ssize_t)(size - 1))
		abort(); /* max_len is below the socket's buffer */
	shutdown(sv[1], SHUT_WR);
	switch (data[0] & 3) {
	case 0:
		(void)rmt_smb_worker_fuzz(sv[0], true, NULL);
		break;
	case 1:
		(void)rmt_smb_worker_fuzz(sv[0], false, "smb://host/share");
		break;
	case 2:
		(void)rmt_smb_reply_fuzz(sv[0], false);
		break;
	default:
		(void)rmt_smb_reply_fuzz(sv[0], true);
		break;
	}
	close(sv[0]);
	close(sv[1]);
	return 0;
}
