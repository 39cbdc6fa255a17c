/*
 * crash.c - named crash points (crash.h): FERRYFS_CRASH_AT=NAME[:N] makes
 * the N-th hit of CRASH_POINT(NAME) a SIGKILL of this process.
 *
 * Built into its own small library (crash) so that ferry-agent, which does
 * not link util (libfuse), has it too. Empty unless FERRYFS_CRASH_POINTS.
 */
#include "crash.h"

#ifdef FERRYFS_CRASH_POINTS
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char want[64];      /* the point asked for; "" for none */
static long want_hit = 1;  /* which hit of it kills */
static atomic_long hits;   /* hits of want so far */

static void load(void)
{
	const char *e = getenv("FERRYFS_CRASH_AT");
	const char *colon;
	size_t n;

	if (!e || !*e)
		return;
	colon = strchr(e, ':');
	n = colon ? (size_t)(colon - e) : strlen(e);
	if (n >= sizeof(want))
		return;
	memcpy(want, e, n);
	want[n] = 0;
	if (colon) {
		want_hit = strtol(colon + 1, NULL, 10);
		if (want_hit < 1)
			want_hit = 1;
	}
}

void crash_point(const char *name)
{
	pthread_once(&once, load);
	if (!want[0] || strcmp(name, want) != 0)
		return;
	if (atomic_fetch_add(&hits, 1) + 1 == want_hit) {
		kill(getpid(), SIGKILL);
		pause(); /* the signal is on its way */
	}
}
#else
/* ISO C wants a translation unit to declare something */
typedef int crash_points_compiled_out;
#endif
