/* SPDX-License-Identifier: Apache-2.0 */
#include "kchan/fuseio.h"

#include <errno.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* Open requests awaiting their reply; more in flight at once than this
 * only lose the flag on the oldest. */
#define RING 256

struct noted {
	int fd;
	uint32_t opcode;
	uint64_t unique;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct noted ring[RING];
static size_t ring_next;
/* Entries of |ring| in use: every reply checks this first, and only the
 * rare reply while an open is pending takes the mutex (replies come from
 * the loop and from the I/O workers at once). */
static atomic_uint pending;
static atomic_ulong patched;

static void note(int fd, uint32_t opcode, uint64_t unique)
{
	pthread_mutex_lock(&mu);
	if (!ring[ring_next].opcode)
		atomic_fetch_add_explicit(&pending, 1, memory_order_relaxed);
	ring[ring_next] = (struct noted){.fd = fd, .opcode = opcode, .unique = unique};
	ring_next = (ring_next + 1) % RING;
	pthread_mutex_unlock(&mu);
}

/* The opcode noted for (fd, unique), forgotten now; 0 when none. A reply
 * never races its own request's note: the kernel sends the request (read
 * hook, which notes it) before anyone can reply to it. */
static uint32_t take(int fd, uint64_t unique)
{
	uint32_t op = 0;

	if (!atomic_load_explicit(&pending, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < RING; i++) {
		if (ring[i].opcode && ring[i].fd == fd && ring[i].unique == unique) {
			op = ring[i].opcode;
			ring[i].opcode = 0;
			atomic_fetch_sub_explicit(&pending, 1, memory_order_relaxed);
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return op;
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t r = read(fd, buf, len);
	struct fuse_in_header h;

	(void)userdata;
	if (r >= (ssize_t)sizeof(h)) {
		memcpy(&h, buf, sizeof(h));
		if (h.opcode == FUSE_OPEN || h.opcode == FUSE_CREATE)
			note(fd, h.opcode, h.unique);
	}
	return r;
}

/* Sets FOPEN_PARALLEL_DIRECT_WRITES in a successful reply to |opcode| whose
 * open flags have FOPEN_DIRECT_IO. libfuse sends the header and the reply's
 * struct in one iovec each; any other layout is left alone. */
static void patch(struct iovec *iov, int count, uint32_t opcode)
{
	size_t off = opcode == FUSE_CREATE ? sizeof(struct fuse_entry_out) : 0;
	uint8_t *base;
	uint32_t flags;

	if (count != 2 || iov[0].iov_len != sizeof(struct fuse_out_header) ||
	    iov[1].iov_len != off + sizeof(struct fuse_open_out))
		return;
	base = (uint8_t *)iov[1].iov_base + off + offsetof(struct fuse_open_out, open_flags);
	memcpy(&flags, base, sizeof(flags));
	if (!(flags & FOPEN_DIRECT_IO))
		return;
	flags |= FOPEN_PARALLEL_DIRECT_WRITES;
	memcpy(base, &flags, sizeof(flags));
	atomic_fetch_add_explicit(&patched, 1, memory_order_relaxed);
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	struct fuse_out_header h;

	(void)userdata;
	if (count > 0 && iov[0].iov_len >= sizeof(h)) {
		memcpy(&h, iov[0].iov_base, sizeof(h));
		/* unique 0 is a notification, never a reply. */
		if (h.unique != 0) {
			uint32_t op = take(fd, h.unique);

			if (op && h.error == 0)
				patch(iov, count, op);
		}
	}
	return writev(fd, iov, count);
}

int efs_fuseio_install(struct fuse_session *se)
{
	static const struct fuse_custom_io io = {
		.read = io_read,
		.writev = io_writev,
	};
	int fd = fuse_session_fd(se);

	if (fd < 0)
		return -EBADF;
	return fuse_session_custom_io(se, &io, fd) == 0 ? 0 : -EINVAL;
}

unsigned long efs_fuseio_parallel_opens(void)
{
	return atomic_load_explicit(&patched, memory_order_relaxed);
}
