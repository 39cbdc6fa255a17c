/* sys.c - syscall wrappers returning -errno (see sys.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sys.h"

ssize_t sys_pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	const char *p = buf;
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, p + done, len - done, off + (off_t)done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		done += (size_t)n;
	}
	return (ssize_t)done;
}

ssize_t sys_pread_all(int fd, void *buf, size_t len, off_t off)
{
	char *p = buf;
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, p + done, len - done, off + (off_t)done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

int sys_close(int fd)
{
	if (close(fd) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

int sys_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

int sys_mkdir_parents(const char *path, mode_t mode)
{
	char p[PATH_MAX];
	char *s;

	if (strlen(path) >= sizeof(p))
		return -ENAMETOOLONG;
	strcpy(p, path);
	for (s = p + 1; (s = strchr(s, '/')); s++) {
		*s = '\0';
		if (mkdir(p, mode) < 0 && errno != EEXIST)
			return -errno;
		*s = '/';
	}
	return 0;
}

int sys_lock_wait(int fd, int wait_ms)
{
	for (int waited = 0;; waited += 50) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		if (waited >= wait_ms)
			return -EBUSY;
		usleep(50 * 1000);
	}
}
