/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hand-over check (space.h). node1 fills the device with fallocate,
 * one file per STEP bytes (one file across every group would not publish:
 * an extent chunk touching that many groups does not fit a transaction);
 * node2 and node3 stay idle and own groups with free space the whole time
 * (each writes 1 MiB first: it claims a group, or takes one back from
 * node1 when an earlier run left node1 every group; two groups of 8 MiB
 * hold more than the reserve and the last step, so filling the device
 * needs them). Without hand-over node1 stops at ENOSPC with their groups
 * still free; with it, it fills the device to within the reserve and one
 * step, and the idle nodes count the groups they gave. Then 1 MiB writes use what the reserve leaves; the operation that
 * finds the device full must fail within ENOSPC_BOUND_MS (a request
 * nobody answers costs about one session TTL, 2 s here).
 */
#include "space.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define STEP		(16ull << 20)
#define ENOSPC_BOUND_MS 6000

static const char *path_of(struct efs_cl *c, int i, const char *dir, char *buf, size_t size,
			   const char *name, int k)
{
	char rel[256];

	snprintf(rel, sizeof(rel), "%s/%s.%d", dir, name, k);
	return efs_cl_path(c, i, rel, buf, size);
}

/* One fallocate of STEP bytes in a new file: 0 or an errno; |ms| its time. */
static int fill_one(const char *path, uint64_t *ms)
{
	uint64_t t0 = efs_cl_now_ms();
	int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
	int err = 0;

	CL_CHECK(fd >= 0, "create %s: %s", path, strerror(errno));
	if (fallocate(fd, 0, 0, (off_t)STEP) != 0)
		err = errno;
	*ms = efs_cl_now_ms() - t0;
	CL_CHECK(close(fd) == 0, "close %s: %s", path, strerror(errno));
	return err;
}

/* 1 MiB writes (each made durable) into a new file until an error: the
 * bytes written; the error and the time of the failing one in |err|, |ms|. */
static uint64_t write_until_full(const char *path, uint64_t max, int *err, uint64_t *ms)
{
	static char buf[1 << 20];
	uint64_t wrote = 0, t0;
	int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);

	CL_CHECK(fd >= 0, "create %s: %s", path, strerror(errno));
	memset(buf, 'w', sizeof(buf));
	*err = 0;
	while (!*err && wrote < max) {
		t0 = efs_cl_now_ms();
		if (pwrite(fd, buf, sizeof(buf), (off_t)wrote) != sizeof(buf))
			*err = errno;
		else if (fdatasync(fd) != 0)
			*err = errno;
		*ms = efs_cl_now_ms() - t0;
		if (!*err)
			wrote += sizeof(buf);
	}
	close(fd);
	return wrote;
}

/* Groups node2 and node3 have handed over since they were mounted. */
static double groups_given(struct efs_cl *c)
{
	return efs_cl_metric(c, 1, "etcfs_space_groups_given_total") +
	       efs_cl_metric(c, 2, "etcfs_space_groups_given_total");
}

void efs_space_handover(struct efs_cl *c, const char *dir)
{
	char path[512];
	struct statvfs sv;
	struct stat st;
	uint64_t free0, got = 0, ms = 0, slowest = 0, wrote;
	double given, given0;
	int n = 0, err;

	/* node2 writes a little first, so that it owns a group even when an
	 * earlier run left every group to node1 (then node1 hands one over). */
	for (int i = 1; i <= 2; i++) {
		wrote = write_until_full(path_of(c, i, dir, path, sizeof(path), "seed", i), 1 << 20,
					 &err, &ms);
		CL_CHECK(wrote == 1 << 20, "node%d's write: %s", i + 1, strerror(err));
		CL_CHECK(efs_cl_metric(c, i, "etcfs_space_groups_owned") > 0,
			 "node%d owns no group to hand over", i + 1);
	}
	CL_CHECK(statvfs(c->node[0].mnt, &sv) == 0, "statvfs: %s", strerror(errno));
	free0 = (uint64_t)sv.f_bavail * sv.f_frsize;
	given0 = groups_given(c);
	for (;;) {
		err = fill_one(path_of(c, 0, dir, path, sizeof(path), "fill", n++), &ms);
		if (err)
			break;
		got += STEP;
		if (ms > slowest)
			slowest = ms;
		CL_CHECK(got <= free0 + STEP, "%" PRIu64 " bytes allocated with %" PRIu64 " free",
			 got, free0);
	}
	given = groups_given(c) - given0;
	printf("# node1 allocated %" PRIu64 " of %" PRIu64 " free bytes (slowest step %" PRIu64
	       " ms); the last step failed after %" PRIu64 " ms (%s); node2 and node3 gave "
	       "%.0f groups\n",
	       got, free0, slowest, ms, strerror(err), given);
	CL_CHECK(err == ENOSPC, "fallocate: %s", strerror(err));
	CL_CHECK(ms <= ENOSPC_BOUND_MS, "ENOSPC after %" PRIu64 " ms", ms);
	CL_CHECK(given >= 1, "no group was handed over");
	/* Everything but the reserve (1%) and the last step. */
	CL_CHECK(got + free0 / 50 + STEP >= free0, "node1 got only %" PRIu64 " of %" PRIu64
		 " free bytes", got, free0);

	wrote = write_until_full(path_of(c, 0, dir, path, sizeof(path), "tail", 0),
				 free0 / 50 + STEP, &err, &ms);
	printf("# then %" PRIu64 " bytes written; the write that failed took %" PRIu64
	       " ms (%s)\n",
	       wrote, ms, strerror(err));
	CL_CHECK(err == ENOSPC, "write: %s", strerror(err));
	CL_CHECK(ms <= ENOSPC_BOUND_MS, "ENOSPC after %" PRIu64 " ms", ms);

	/* What was written is there, seen from node3; then it goes. */
	CL_CHECK(stat(path_of(c, 2, dir, path, sizeof(path), "tail", 0), &st) == 0,
		 "stat on node3: %s", strerror(errno));
	CL_CHECK((uint64_t)st.st_size >= wrote, "node3 sees %lld of %" PRIu64 " bytes",
		 (long long)st.st_size, wrote);
	CL_CHECK(stat(path_of(c, 2, dir, path, sizeof(path), "fill", 0), &st) == 0 &&
			 (uint64_t)st.st_size == STEP,
		 "fill.0 on node3: %s", strerror(errno));
	for (int k = 0; k < n; k++) {
		path_of(c, 0, dir, path, sizeof(path), "fill", k);
		CL_CHECK(unlink(path) == 0 || (k == n - 1 && errno == ENOENT), "unlink %s: %s",
			 path, strerror(errno));
	}
	CL_CHECK(unlink(path_of(c, 0, dir, path, sizeof(path), "tail", 0)) == 0, "unlink: %s",
		 strerror(errno));
	for (int i = 1; i <= 2; i++)
		CL_CHECK(unlink(path_of(c, i, dir, path, sizeof(path), "seed", i)) == 0,
			 "unlink: %s", strerror(errno));
}
