/*
 * sys.h - the syscall wrapper layer: every function returns 0 (or a byte
 * count) on success and -errno on failure. Code above this layer never reads
 * errno. Short reads/writes are retried, EINTR is retried.
 */
#ifndef FERRYFS_SYS_H
#define FERRYFS_SYS_H

#include <stddef.h>
#include <sys/types.h>

/* Write all of buf at off; returns len or -errno. */
ssize_t sys_pwrite_all(int fd, const void *buf, size_t len, off_t off);

/* Read up to len bytes at off, retrying short reads until EOF;
 * returns the byte count (< len only at EOF) or -errno. */
ssize_t sys_pread_all(int fd, void *buf, size_t len, off_t off);

/* close() that keeps errno intact for no one: returns 0 or -errno. */
int sys_close(int fd);

/* fsync the directory that holds path (after a rename into it). */
int sys_fsync_dir(const char *dir);

/* mkdir -p of the parents of @path (not @path itself), @mode for the
 * ones made here. Errors: -ENAMETOOLONG, mkdir's. */
int sys_mkdir_parents(const char *path, mode_t mode);

/* flock(LOCK_EX) of @fd, waiting up to @wait_ms for a holder to let go
 * (a daemon still exiting after its unmount). 0, -EBUSY, or -errno. */
int sys_lock_wait(int fd, int wait_ms);
#define SYS_LOCK_WAIT_MS 5000 /* the journal's and the cache's directory */

#endif
