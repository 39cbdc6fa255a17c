/*
 * server.h - ferry-agent's server (server.c), for its main (main.c) and the
 * tests. Not part of the wire protocol (agent.h).
 */
#ifndef FERRYFS_AGENT_SERVER_H
#define FERRYFS_AGENT_SERVER_H

#include <stdbool.h>

struct agent_server;

struct agent_server_config {
	const char *root;      /* the directory served */
	const char *listen;    /* "ADDR:PORT", "[v6]:PORT" or ":PORT" (port 0:
				  any free one, agent_server_port()); NULL:
				  no listener, agent_server_serve_fd() only */
	const char *key_file;  /* the shared key (agent_key_load()) */
	bool encrypt;          /* refuse sessions without encryption */
	unsigned int max_conns; /* 0 = 64 */
};

/* Open the root, load the key and listen. Errors are logged to stderr.
 * Caller owns *out; free with agent_server_free(). */
int agent_server_new(const struct agent_server_config *cfg,
		     struct agent_server **out);
/* Accept and serve connections (a thread each) until an accept error or
 * agent_server_stop(). Returns -errno. */
int agent_server_run(struct agent_server *s);
/* The port listened on, or -errno. */
int agent_server_port(const struct agent_server *s);
/* Make agent_server_run() return (-EINVAL); any thread may call it. */
void agent_server_stop(struct agent_server *s);
/* Serve one connected socket @fd (handshake, then requests until it ends)
 * in the calling thread; @fd is the server's from here on and closed
 * before it returns. -EBUSY if too many connections are in their
 * handshake (PRE_MAX, server.c). */
int agent_server_serve_fd(struct agent_server *s, int fd);
/* Ends every connection still served (shuts its socket down) and waits
 * for their threads, then frees. Call it after agent_server_run() has
 * returned. NULL is a no-op. */
void agent_server_free(struct agent_server *s);

#endif
