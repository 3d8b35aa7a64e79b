/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Open files across nodes: the cluster checks of openref.h. Space is
 * measured with statvfs on node1 (etcfs sums every group's free count,
 * cached for a second), so "pinned" means the free count did not grow by
 * the file's size, and "back" that it did within a bound.
 */
#include "openref.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define FILE_BLOCKS 64		/* of 64 KiB: 4 MiB */
#define BLK	    65536
#define BACK_MS	    15000	/* a close (or a drop) to free space seen */

static const char *path_of(struct efs_cl *c, int i, const char *dir, const char *name)
{
	static char ring[8][512];
	static unsigned next;
	char rel[400];
	char *buf = ring[next++ % 8];

	snprintf(rel, sizeof(rel), "%s/%s", dir, name);
	return efs_cl_path(c, i, rel, buf, sizeof(ring[0]));
}

static unsigned long long free_bytes(struct efs_cl *c)
{
	struct statvfs sv;

	CL_CHECK(statvfs(c->node[0].mnt, &sv) == 0, "statvfs: %s", strerror(errno));
	return (unsigned long long)sv.f_bfree * sv.f_frsize;
}

/* A file of FILE_BLOCKS blocks of |fill| on node |i|, synced; its
 * descriptor (read-write), or closed when |keep| is false (-1). */
static int make_file(struct efs_cl *c, int i, const char *path, char fill, bool keep)
{
	static char blk[BLK];
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	CL_CHECK(fd >= 0, "create %s: %s", path, strerror(errno));
	memset(blk, fill, sizeof(blk));
	for (int k = 0; k < FILE_BLOCKS; k++)
		CL_CHECK(write(fd, blk, sizeof(blk)) == (ssize_t)sizeof(blk), "write: %s",
			 strerror(errno));
	CL_CHECK(fsync(fd) == 0, "fsync on node%d: %s", i + 1, strerror(errno));
	if (keep)
		return fd;
	close(fd);
	return -1;
}

/* Waits up to |ms| for the free count to reach |want|; the time taken. */
static unsigned long long wait_free(struct efs_cl *c, unsigned long long want, uint64_t ms,
				    const char *what)
{
	uint64_t t0 = efs_cl_now_ms();
	unsigned long long f;

	while ((f = free_bytes(c)) < want && efs_cl_now_ms() - t0 < ms)
		efs_cl_sleep_ms(200);
	CL_CHECK(f >= want, "%s: %llu bytes free after %llu ms, %llu expected", what, f,
		 (unsigned long long)(efs_cl_now_ms() - t0), want);
	return efs_cl_now_ms() - t0;
}

static void sync_all(struct efs_cl *c)
{
	for (int i = 0; i < c->n; i++) {
		int fd = open(c->node[i].mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (fd >= 0) {
			syncfs(fd);
			close(fd);
		}
	}
	efs_cl_sleep_ms(1200); /* statfs caches the group counts for a second */
}

void efs_oref_open_elsewhere(struct efs_cl *c, const char *dir)
{
	static char got[BLK], blk[BLK];
	unsigned long long base, pinned;
	uint64_t took;
	int fd;

	sync_all(c);
	base = free_bytes(c);
	fd = make_file(c, 1, path_of(c, 1, dir, "f"), 'a', true);
	CL_CHECK(unlink(path_of(c, 0, dir, "f")) == 0, "node1 unlink: %s", strerror(errno));
	CL_CHECK(access(path_of(c, 2, dir, "f"), F_OK) != 0 && errno == ENOENT,
		 "node3 still sees f after node1's unlink");
	/* node2 keeps reading the same bytes, and writing. */
	for (int k = 0; k < FILE_BLOCKS; k += 7) {
		CL_CHECK(pread(fd, got, sizeof(got), (off_t)k * BLK) == (ssize_t)sizeof(got),
			 "node2 reads block %d of the unlinked file: %s", k, strerror(errno));
		CL_CHECK(got[0] == 'a' && got[BLK - 1] == 'a', "node2 reads block %d wrong", k);
	}
	memset(blk, 'b', sizeof(blk));
	CL_CHECK(pwrite(fd, blk, sizeof(blk), 3 * BLK) == (ssize_t)sizeof(blk),
		 "node2 writes the unlinked file: %s", strerror(errno));
	CL_CHECK(fsync(fd) == 0, "node2 fsync of the unlinked file: %s", strerror(errno));
	CL_CHECK(pread(fd, got, sizeof(got), 3 * BLK) == (ssize_t)sizeof(got) && got[0] == 'b',
		 "node2 reads its write back wrong");
	/* Its space is not handed out meanwhile. */
	sync_all(c);
	pinned = free_bytes(c);
	CL_CHECK(pinned + (unsigned long long)FILE_BLOCKS * BLK / 2 <= base,
		 "the open file's space came back while node2 has it open (%llu free, %llu "
		 "before)",
		 pinned, base);
	CL_CHECK(pread(fd, got, sizeof(got), 10 * BLK) == (ssize_t)sizeof(got) && got[0] == 'a',
		 "node2 reads block 10 wrong after the sync");
	close(fd);
	took = wait_free(c, base - BLK * 2, BACK_MS, "after node2's close");
	printf("# open elsewhere: space back %llu ms after the close\n",
	       (unsigned long long)took);
}

void efs_oref_cached_reference(struct efs_cl *c, const char *dir)
{
	static char got[16];
	unsigned long long base;
	uint64_t took;
	int fd;

	sync_all(c);
	base = free_bytes(c);
	make_file(c, 1, path_of(c, 1, dir, "g"), 'c', false);
	/* node2 opens and closes it again: its reference stays cached. */
	fd = open(path_of(c, 1, dir, "g"), O_RDONLY | O_CLOEXEC);
	CL_CHECK(fd >= 0 && read(fd, got, sizeof(got)) == (ssize_t)sizeof(got),
		 "node2 reads g: %s", strerror(errno));
	close(fd);
	CL_CHECK(unlink(path_of(c, 0, dir, "g")) == 0, "node1 unlink: %s", strerror(errno));
	took = wait_free(c, base - BLK * 2, BACK_MS, "a cached reference on node2");
	printf("# cached reference: space back %llu ms after the unlink\n",
	       (unsigned long long)took);
}

void efs_oref_killed_opener(struct efs_cl *c, const char *dir, unsigned grace_s)
{
	static char got[BLK];
	unsigned long long base;
	uint64_t took, t_kill;
	int fd;

	sync_all(c);
	base = free_bytes(c);
	fd = make_file(c, 1, path_of(c, 1, dir, "k"), 'k', true);
	CL_CHECK(unlink(path_of(c, 0, dir, "k")) == 0, "node1 unlink: %s", strerror(errno));
	CL_CHECK(pread(fd, got, sizeof(got), 0) == (ssize_t)sizeof(got) && got[0] == 'k',
		 "node2 reads the unlinked file: %s", strerror(errno));
	efs_cl_kill(c, 1);
	t_kill = efs_cl_now_ms();
	close(fd);
	efs_cl_sleep_ms(500);
	sync_all(c);
	CL_CHECK(free_bytes(c) + (unsigned long long)FILE_BLOCKS * BLK / 2 <= base,
		 "the file's space came back right after its opener's kill");
	took = wait_free(c, base - BLK * 2,
			 (uint64_t)(c->opts.session_ttl ? c->opts.session_ttl : 2) * 1000 +
				 grace_s * 1000 + BACK_MS,
			 "after the opener's kill");
	printf("# killed opener: space back %llu ms after the kill (grace %u s)\n",
	       (unsigned long long)(efs_cl_now_ms() - t_kill), grace_s);
	(void)took;
	efs_cl_down(c, 1);
	efs_cl_mount(c, 1);
}
