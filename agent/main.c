/*
 * main.c - ferry-agent: serve a directory to ferryfs flushers (server.c).
 *
 *   ferry-agent --root DIR --listen ADDR:PORT --key-file FILE [--encrypt]
 *               [--max-conns N]
 *
 * Runs in the foreground and logs to stderr (a systemd unit or a
 * supervisor keeps it: dist/ferry-agent@.service). Under Type=notify
 * (NOTIFY_SOCKET set) it sends READY=1 once it listens.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "notify.h"
#include "server.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: ferry-agent --root DIR --listen ADDR:PORT "
		   "--key-file FILE [--encrypt] [--max-conns N]\n"
		   "  serves DIR to ferryfs mounts that flush through it "
		   "(-o agent=HOST:PORT,agent_key=FILE)\n");
}

/* Each stream is a connection and each file it writes an fd: the soft
 * limit (often 1024) is raised to the hard one, as far as allowed. */
static void nofile_raise(void)
{
	struct rlimit r;

	if (getrlimit(RLIMIT_NOFILE, &r) || r.rlim_cur >= r.rlim_max)
		return;
	r.rlim_cur = r.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &r))
		fprintf(stderr, "ferry-agent: cannot raise the limit of open "
				"files to %llu: %s\n",
			(unsigned long long)r.rlim_max, strerror(errno));
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "root", required_argument, NULL, 'r' },
		{ "listen", required_argument, NULL, 'l' },
		{ "key-file", required_argument, NULL, 'k' },
		{ "encrypt", no_argument, NULL, 'e' },
		{ "max-conns", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct agent_server_config cfg = { 0 };
	struct agent_server *s;
	int c, rc;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'r':
			cfg.root = optarg;
			break;
		case 'l':
			cfg.listen = optarg;
			break;
		case 'k':
			cfg.key_file = optarg;
			break;
		case 'e':
			cfg.encrypt = true;
			break;
		case 'm':
			cfg.max_conns = (unsigned int)strtoul(optarg, NULL, 10);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!cfg.root || !cfg.listen || !cfg.key_file || optind != argc) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	nofile_raise();
	rc = agent_server_new(&cfg, &s);
	if (rc)
		return 1;
	fprintf(stderr, "ferry-agent: serving '%s' on %s%s\n", cfg.root,
		cfg.listen, cfg.encrypt ? " (encrypted)" : "");
	/* the socket listens: a client's connect succeeds from now on */
	rc = notify_sendf("READY=1\nSTATUS=serving '%s' on %s%s", cfg.root,
			  cfg.listen, cfg.encrypt ? " (encrypted)" : "");
	if (rc < 0)
		fprintf(stderr, "ferry-agent: cannot tell the service manager "
				"that it is ready: %s\n",
			strerror(-rc));
	rc = agent_server_run(s);
	fprintf(stderr, "ferry-agent: cannot accept: %s\n", strerror(-rc));
	agent_server_free(s);
	return 1;
}
