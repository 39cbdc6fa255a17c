/*
 * crash.h - named crash points for the crash-consistency checker
 * (tests/crash/, issue 36).
 *
 *   CRASH_POINT("op_before_ack");
 *
 * Compiled in only with the CMake option FERRYFS_CRASH_POINTS=ON (the test
 * builds of scripts/test.sh); otherwise the macro expands to nothing that
 * runs, and release builds and packages have no crash points at all.
 *
 * When compiled in, the first hit of any point reads the environment once:
 * FERRYFS_CRASH_AT=NAME[:N] kills the process with SIGKILL at the N-th hit
 * (default 1) of the point NAME, counted over all threads; any other name
 * is counted by nobody. Without the variable every point is a no-op after
 * one relaxed load. The kill is kill(getpid(), SIGKILL): no handler, no
 * atexit, no buffered output, what kill -9 from outside would leave, but
 * at a moment of our choosing. tests/crash/README.md lists the points.
 *
 * Thread-safe; async-signal-safe it need not be (never called from one).
 */
#ifndef FERRYFS_CRASH_H
#define FERRYFS_CRASH_H

#ifdef FERRYFS_CRASH_POINTS
/* Count a hit of @name; SIGKILL ourselves if it is the one asked for. */
void crash_point(const char *name);
#define CRASH_POINT(name) crash_point(name)
#else
#define CRASH_POINT(name) ((void)0)
#endif

#endif /* FERRYFS_CRASH_H */
