/*
 * agent_probe.c - a raw ferry-agent client for it_agent.sh: sends requests
 * ferryfs itself never sends (paths that are not clean, paths through
 * symlinks) to a real agent over the network and prints each reply.
 *
 *   agent_probe HOST:PORT KEYFILE REQ...
 *
 * REQ is OP:PATH[:PATH2], OP one of
 *   create    OPEN PATH O_WRONLY|O_CREAT, 0644 (then CLOSE if it opened)
 *   trunc     OPEN PATH O_WRONLY|O_TRUNC
 *   read      OPEN PATH O_RDONLY, then PREAD of 64 bytes
 *   stat      STAT PATH
 *   mkdir     MKDIR PATH 0755
 *   unlink    UNLINK PATH
 *   rmdir     RMDIR PATH
 *   rename    RENAME PATH PATH2
 *   link      LINK PATH PATH2
 *   symlink   SYMLINK PATH -> "target"
 *   chmod     SETATTR (by path) mode 0777
 *   truncate  SETATTR (by path) size 0
 *   put       OPEN PATH O_WRONLY|O_CREAT, PUT of 5 bytes "owned" inline
 *
 * Prints one line per request: "OP PATH[ PATH2]: STATUS NAME" (0 or the
 * agent's -errno and its strerror). Exit 0 if every request got a reply,
 * 3 if the handshake failed (printed as "handshake: -errno NAME"), 2 on
 * a usage error, 1 if the connection broke.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"

static struct agent_conn conn;
static struct agent_buf req;
static uint32_t next_hid = 1;

/* Send req as @type, read the reply: its status; *res its result. */
static int exchange(uint16_t type, struct agent_rd *res, int *st)
{
	uint64_t seq = conn.seq_out;
	const uint8_t *p;
	uint16_t rtype;
	size_t len;
	int rc;

	if (!agent_buf_ok(&req))
		return -ENOMEM;
	rc = agent_send(&conn, type, req.p, req.len, NULL, 0);
	if (!rc)
		rc = agent_recv(&conn, &rtype, &p, &len);
	if (rc)
		return rc;
	*res = (struct agent_rd){ .p = p, .len = len };
	if (rtype != AGENT_T_REPLY || agent_get_u64(res) != seq)
		return -EPROTO;
	*st = (int32_t)agent_get_u32(res);
	return res->bad ? -EPROTO : 0;
}

static int open_file(const char *path, uint32_t flags, uint32_t *hid,
		     int *st)
{
	struct agent_rd res;

	*hid = next_hid++;
	req.len = 0;
	agent_put_u32(&req, *hid);
	agent_put_str(&req, path);
	agent_put_u32(&req, flags);
	agent_put_u32(&req, 0644);
	return exchange(AGENT_T_OPEN, &res, st);
}

static int close_file(uint32_t hid)
{
	struct agent_rd res;
	int st;

	req.len = 0;
	agent_put_u32(&req, hid);
	return exchange(AGENT_T_CLOSE, &res, &st);
}

static int setattr(const char *path, uint32_t set, uint32_t mode, int *st)
{
	struct agent_rd res;

	req.len = 0;
	agent_put_u32(&req, 0);
	agent_put_str(&req, path);
	agent_put_u32(&req, set);
	agent_put_u32(&req, mode);
	agent_put_u32(&req, 0);
	agent_put_u32(&req, 0);
	agent_put_u64(&req, 0);                 /* size */
	agent_put_u64(&req, 0);                 /* atime */
	agent_put_u32(&req, 0);
	agent_put_u64(&req, 0);                 /* mtime */
	agent_put_u32(&req, 0);
	return exchange(AGENT_T_SETATTR, &res, st);
}

/* One REQ; returns a transport error, else 0 with *st the status. */
static int probe(const char *op, const char *path, const char *path2,
		 int *st)
{
	struct agent_rd res;
	uint32_t hid;
	int rc;

	req.len = 0;
	if (!strcmp(op, "create") || !strcmp(op, "trunc") ||
	    !strcmp(op, "read") || !strcmp(op, "put")) {
		uint32_t fl = !strcmp(op, "read") ? O_RDONLY :
			      !strcmp(op, "trunc") ? O_WRONLY | O_TRUNC :
						     O_WRONLY | O_CREAT;

		rc = open_file(path, fl, &hid, st);
		if (rc || *st)
			return rc;
		if (!strcmp(op, "read")) {
			req.len = 0;
			agent_put_u32(&req, hid);
			agent_put_u64(&req, 0);
			agent_put_u32(&req, 64);
			rc = exchange(AGENT_T_PREAD, &res, st);
		} else if (!strcmp(op, "put")) {
			static const char data[] = "owned";
			unsigned char sha[32];

			EVP_Digest(data, 5, sha, NULL, EVP_sha256(), NULL);
			req.len = 0;
			agent_put_u32(&req, hid);
			agent_put_u64(&req, 0);
			agent_put_u32(&req, 5);
			agent_put_bytes(&req, sha, 32);
			agent_put_u32(&req, 1);
			agent_put_bytes(&req, data, 5);
			rc = exchange(AGENT_T_PUT, &res, st);
		}
		return rc ? rc : close_file(hid);
	}
	if (!strcmp(op, "stat") || !strcmp(op, "unlink") ||
	    !strcmp(op, "rmdir") || !strcmp(op, "mkdir")) {
		agent_put_str(&req, path);
		if (!strcmp(op, "mkdir"))
			agent_put_u32(&req, 0755);
		return exchange(!strcmp(op, "stat")    ? AGENT_T_STAT :
				!strcmp(op, "unlink")  ? AGENT_T_UNLINK :
				!strcmp(op, "rmdir")   ? AGENT_T_RMDIR :
							 AGENT_T_MKDIR,
				&res, st);
	}
	if (!strcmp(op, "rename") || !strcmp(op, "link")) {
		agent_put_str(&req, path);
		agent_put_str(&req, path2 ? path2 : "");
		if (!strcmp(op, "rename"))
			agent_put_u32(&req, 0);
		return exchange(!strcmp(op, "rename") ? AGENT_T_RENAME :
							AGENT_T_LINK,
				&res, st);
	}
	if (!strcmp(op, "symlink")) {
		agent_put_str(&req, "target");
		agent_put_str(&req, path);
		return exchange(AGENT_T_SYMLINK, &res, st);
	}
	if (!strcmp(op, "chmod"))
		return setattr(path, AGENT_SET_MODE, 0777, st);
	if (!strcmp(op, "truncate"))
		return setattr(path, AGENT_SET_SIZE, 0, st);
	fprintf(stderr, "agent_probe: unknown op '%s'\n", op);
	exit(2);
}

int main(int argc, char **argv)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
	struct agent_key key;
	char host[256], *colon;
	int fd, rc;

	if (argc < 3) {
		fprintf(stderr, "usage: agent_probe HOST:PORT KEYFILE "
				"OP:PATH[:PATH2]...\n");
		return 2;
	}
	snprintf(host, sizeof(host), "%s", argv[1]);
	colon = strrchr(host, ':');
	if (!colon)
		return 2;
	*colon = 0;
	rc = agent_key_load(argv[2], &key);
	if (rc) {
		fprintf(stderr, "agent_probe: key '%s': %s\n", argv[2],
			strerror(-rc));
		return 2;
	}
	if (getaddrinfo(host, colon + 1, &hints, &ai))
		return 2;
	fd = socket(ai->ai_family, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
		perror("agent_probe: connect");
		return 1;
	}
	freeaddrinfo(ai);
	rc = agent_handshake_client(fd, &key, false, &conn);
	if (rc) {
		printf("handshake: %d %s\n", rc, strerror(-rc));
		return 3;
	}
	for (int i = 3; i < argc; i++) {
		char *op = argv[i], *path = strchr(op, ':'), *path2;
		int st = 0;

		if (!path)
			return 2;
		*path++ = 0;
		path2 = strchr(path, ':');
		if (path2)
			*path2++ = 0;
		rc = probe(op, path, path2, &st);
		if (rc) {
			printf("%s %s%s%s: connection lost: %s\n", op, path,
			       path2 ? " " : "", path2 ? path2 : "",
			       strerror(-rc));
			return 1;
		}
		printf("%s %s%s%s: %d %s\n", op, path, path2 ? " " : "",
		       path2 ? path2 : "", st, st ? strerror(-st) : "ok");
	}
	agent_buf_release(&req);
	agent_conn_release(&conn);
	close(fd);
	return 0;
}
