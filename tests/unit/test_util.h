/*
 * test_util.h - what every cmocka unit test of ferryfs shares (include it
 * after <cmocka.h>).
 *
 * assert_rc_ok(expr): expr returns 0, a count, or -errno; fail with the
 * expression and strerror() on a negative value (LMDB mtest.c's CHECK()).
 * assert_rc_err(expr, err): expr returns exactly -err.
 */
#ifndef FERRYFS_TEST_UTIL_H
#define FERRYFS_TEST_UTIL_H

#include <string.h>

#define assert_rc_ok(expr)                                              \
	do {                                                            \
		long long rc_ = (long long)(expr);                      \
		if (rc_ < 0)                                            \
			fail_msg("%s: %s", #expr, strerror((int)-rc_)); \
	} while (0)

#define assert_rc_err(expr, err)                                              \
	do {                                                                  \
		long long rc_ = (long long)(expr);                            \
		if (rc_ != -(long long)(err))                                 \
			fail_msg("%s: want -%s, got %lld (%s)", #expr,        \
				 strerrorname_np(err), rc_,                   \
				 rc_ < 0 ? strerror((int)-rc_) : "no error"); \
	} while (0)

#endif
