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
	const char *listen;    /* "ADDR:PORT", "[v6]:PORT" or ":PORT" */
	const char *key_file;  /* the shared key (agent_key_load()) */
	bool encrypt;          /* refuse sessions without encryption */
	unsigned int max_conns; /* 0 = 64 */
};

/* Open the root, load the key and listen. Errors are logged to stderr.
 * Caller owns *out; free with agent_server_free(). */
int agent_server_new(const struct agent_server_config *cfg,
		     struct agent_server **out);
/* Accept and serve connections (a thread each) until an accept error. */
int agent_server_run(struct agent_server *s);
void agent_server_free(struct agent_server *s);

#endif
