/* log.c - line formatting and the debug switch behind log.h. */
#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>
/* log.h's level macros take syslog's names: keep the numbers we need */
static const int syslog_opts = LOG_PID, syslog_facility = LOG_DAEMON;
#undef LOG_ERR
#undef LOG_INFO

#include "log.h"

bool log_debug_enabled;
bool log_in_syslog;

void log_msg(enum fuse_log_level level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fuse_log(level, "ferryfs: %s\n", line);
}

static void syslog_func(enum fuse_log_level level, const char *fmt, va_list ap)
{
	vsyslog((int)level, fmt, ap);
}

void log_to_syslog(void)
{
	openlog("ferryfs", syslog_opts, syslog_facility);
	fuse_set_log_func(syslog_func);
	log_in_syslog = true;
}
