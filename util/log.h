/*
 * log.h - the one logging front end of ferryfs.
 *
 * Every message goes through fuse_log(), so fuse_set_log_func() (the daemon
 * sends it to syslog once detached, tests capture it) redirects all of them.
 * Messages follow git style: lowercase, no final period, what failed first,
 * the subject quoted, then the errno text:
 *   LOG_ERR("cannot open remote '%s': %s", path, strerror(-rc));
 * Log where an error is handled, not at every layer it passes through.
 */
#ifndef FERRYFS_LOG_H
#define FERRYFS_LOG_H

#include <stdbool.h>
#include <stdlib.h>
#include <fuse_log.h>

/* LOG_DBG prints only while this is set (ferryfs -d sets it). */
extern bool log_debug_enabled;

/* Format one line ("ferryfs: " prefix, newline added) and emit it with a
 * single fuse_log() call, so lines of concurrent threads do not mix. */
void log_msg(enum fuse_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define LOG_ERR(...)  log_msg(FUSE_LOG_ERR, __VA_ARGS__)
#define LOG_WARN(...) log_msg(FUSE_LOG_WARNING, "warning: " __VA_ARGS__)
#define LOG_INFO(...) log_msg(FUSE_LOG_INFO, __VA_ARGS__)
#define LOG_DBG(...)                                           \
	do {                                                   \
		if (log_debug_enabled)                         \
			log_msg(FUSE_LOG_DEBUG, __VA_ARGS__);  \
	} while (0)

/* From now on send every message to syslog (the daemon, once detached). */
void log_to_syslog(void);

/* Set by log_to_syslog(): a helper process it starts logs there too. */
extern bool log_in_syslog;

/* "Impossible" internal state: log and abort (never for bad input). */
#define BUG(...)                                               \
	do {                                                   \
		log_msg(FUSE_LOG_ERR, "BUG: " __VA_ARGS__);    \
		abort();                                       \
	} while (0)

#endif
