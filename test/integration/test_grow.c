/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Online growth (docs/DESIGN.md, "Online growth"): two nodes mounted on one
 * image fill it until ENOSPC; the image grows (truncate), etcfsctl grow
 * writes the larger geometry; both nodes write into the new space without
 * a remount, each saying in its log that it took the new groups; fsck is
 * clean after. The old last group was short (1.5 of 2 MiB), so the grow
 * also lengthens it. A shrink and a size the device does not have are
 * refused with a clear message, and nothing changes.
 * And a node whose device (a loop device over the image) has not grown yet
 * leaves the new groups alone and says so, until losetup -c shows it the
 * new size; the other node uses them at once. That node owns the short
 * last group, whose map the grow lengthened: it frees and writes in it
 * meanwhile and keeps it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "../support/mount.h"

/* 128.5 MiB: groups of 2 MiB, 64 of them, the last 1.5 MiB. */
#define IMG_SIZE  ((128ull << 20) + (512ull << 10))
#define GROW_SIZE (192ull << 20)
#define FILE_MIB  4

static struct efs_test_fs n1, n2;
static char loopdev[64]; /* node2's loop device, "" when none */

static void fini(void)
{
	if (n2.mnt[0])
		efs_test_fs_stop(&n2);
	if (loopdev[0]) {
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "losetup -d %s", loopdev);
		if (system(cmd) != 0)
			fprintf(stderr, "test_grow: %s failed\n", cmd);
		loopdev[0] = '\0';
	}
	efs_test_fs_stop(&n1);
}

TestSuite(grow, .fini = fini, .timeout = 150);

/* A second node on n1's etcd and image (or |device|, NULL: the image):
 * its own mount point and log. */
static void start_node2_on(const char *device)
{
	n2 = n1;
	if (device)
		snprintf(n2.image, sizeof(n2.image), "%s", device);
	n2.etcd = NULL;
	n2.daemon = 0;
	n2.dir[0] = '\0'; /* n1's stop removes the directory */
	n2.opts.node = "node2";
	n2.opts.metrics = false;
	snprintf(n2.mnt, sizeof(n2.mnt), "%s/mnt2", n1.dir);
	snprintf(n2.log, sizeof(n2.log), "%s/node2.log", n1.dir);
	cr_assert_eq(mkdir(n2.mnt, 0755), 0, "mkdir %s: %s", n2.mnt, strerror(errno));
	efs_test_fs_mount(&n2, NULL);
}

static void start_node2(void)
{
	start_node2_on(NULL);
}

/* Writes a file of FILE_MIB MiB on |mnt|: 0, or the errno that stopped it. */
static int write_file(const char *mnt, const char *name)
{
	static char buf[1 << 20];
	char path[512];
	int fd, err = 0;

	memset(buf, 'g', sizeof(buf));
	snprintf(path, sizeof(path), "%s/%s", mnt, name);
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0)
		return errno;
	/* A short write (space running out part way: the file's handle
	 * sends whole writes) is followed by the rest, whose write then
	 * tells why; errno is read only after a failed write. */
	for (int i = 0; i < FILE_MIB && !err; i++) {
		for (size_t done = 0; done < sizeof(buf) && !err;) {
			ssize_t n = write(fd, buf + done, sizeof(buf) - done);

			if (n < 0)
				err = errno;
			else if (n == 0)
				err = EIO;
			else
				done += (size_t)n;
		}
	}
	if (!err && fsync(fd) < 0)
		err = errno;
	if (close(fd) < 0 && !err)
		err = errno;
	if (err)
		unlink(path);
	return err;
}

/* The last |size| - 1 bytes of |path|, for failure messages. */
static const char *tail_of(const char *path, char *buf, size_t size)
{
	FILE *fp = fopen(path, "r");
	size_t n = 0;
	long len;

	buf[0] = '\0';
	if (!fp)
		return buf;
	fseek(fp, 0, SEEK_END);
	len = ftell(fp);
	fseek(fp, len > (long)size - 1 ? len - (long)size + 1 : 0, SEEK_SET);
	n = fread(buf, 1, size - 1, fp);
	buf[n] = '\0';
	fclose(fp);
	return buf;
}

/* Writes files on |mnt| until ENOSPC (or EAGAIN); returns how many fit. */
static int fill(const char *mnt, const char *prefix)
{
	char name[64];
	int n = 0, err;

	for (;; n++) {
		snprintf(name, sizeof(name), "%s%d", prefix, n);
		err = write_file(mnt, name);
		/* At the very end a write may also fail with EAGAIN (the
		 * publication's retries spent while space runs out). */
		if (err == ENOSPC || err == EAGAIN)
			return n;
		if (err) {
			static char t1[3000], t2[3000];

			cr_assert_fail("writing %s/%s: %s\nnode1:\n%s\nnode2:\n%s", mnt, name,
				       strerror(err), tail_of(n1.log, t1, sizeof(t1)),
				       n2.mnt[0] ? tail_of(n2.log, t2, sizeof(t2)) : "");
		}
		cr_assert_lt(n, 100, "%s never filled up", mnt);
	}
}

/* Retries a write of one more file for up to |ms|: 0 when it fit. */
static int write_soon(const char *mnt, const char *name, int ms)
{
	int err = ENOSPC;

	for (int waited = 0; waited <= ms; waited += 250) {
		err = write_file(mnt, name);
		if (err != ENOSPC && err != EAGAIN)
			return err;
		usleep(250 * 1000);
	}
	return err;
}

static bool file_has(const char *path, const char *needle)
{
	char line[2048];
	bool found = false;
	FILE *fp = fopen(path, "r");

	cr_assert(fp, "open %s", path);
	while (!found && fgets(line, sizeof(line), fp))
		found = strstr(line, needle) != NULL;
	fclose(fp);
	return found;
}

/* Grows the image to |size| bytes and runs etcfsctl grow --json on it,
 * which must succeed; its output goes to |out|. */
static void grow_image(uint64_t size, char *out, size_t out_size)
{
	int r;

	cr_assert_eq(truncate(n1.image, (off_t)size), 0, "truncate: %s", strerror(errno));
	r = efs_test_fs_run(&n1, out, out_size, "etcfsctl", "grow", "--json", n1.image, NULL);
	cr_assert_eq(r, 0, "grow to %" PRIu64 ": status %d:\n%s", size, r, out);
}

static bool wait_log(const char *path, const char *needle, int ms);

Test(grow, two_nodes_fill_grow_and_write_on)
{
	struct efs_test_fs_opts o = {.image_size = IMG_SIZE, .session_ttl = 3};
	static char t1[3000], t2[3000];
	char out[8192];
	struct statvfs sv1, sv2;
	int r, a, b;

	efs_test_fs_start(&n1, &o);
	start_node2();

	a = fill(n1.mnt, "a");
	b = fill(n2.mnt, "b");
	cr_log_info("full after %d + %d files of %d MiB", a, b, FILE_MIB);
	cr_assert_geq(a + b, 20, "only %d files fit in %llu bytes", a + b,
		      (unsigned long long)IMG_SIZE);

	/* A grow beyond the device, and a shrink, change nothing. */
	r = efs_test_fs_run(&n1, out, sizeof(out), "etcfsctl", "grow", n1.image, "192M", NULL);
	cr_assert_eq(r, 4, "grow beyond the device: status %d:\n%s", r, out);
	cr_assert(strstr(out, "grow the device first"), "%s", out);
	r = efs_test_fs_run(&n1, out, sizeof(out), "etcfsctl", "grow", n1.image, "100M", NULL);
	cr_assert_eq(r, 4, "shrink: status %d:\n%s", r, out);
	cr_assert(strstr(out, "refusing to shrink"), "%s", out);
	r = efs_test_fs_run(&n1, out, sizeof(out), "etcfsctl", "grow", n1.image, NULL);
	cr_assert_eq(r, 0, "grow to the same size: status %d:\n%s", r, out);
	cr_assert(strstr(out, "nothing to do"), "%s", out);

	/* First a growth inside the short last group: no new group, the
	 * last one lengthened to a whole 2 MiB. */
	grow_image(129ull << 20, out, sizeof(out));
	cr_assert(strstr(out, "\"ag_count\":64"), "%s", out);
	cr_assert(wait_log(n1.log, "(64 groups, was 64)", 10000), "node1 kept the short group");
	cr_assert(wait_log(n2.log, "(64 groups, was 64)", 10000), "node2 kept the short group");

	grow_image(GROW_SIZE, out, sizeof(out));
	cr_assert(strstr(out, "\"grown\":true"), "%s", out);
	cr_assert(strstr(out, "\"ag_count\":96"), "%s", out);

	/* Both nodes write on within seconds, in the new groups. */
	r = write_soon(n1.mnt, "after1", 15000);
	cr_assert_eq(r, 0, "node1 after the grow: %s\nnode1:\n%s\nnode2:\n%s", strerror(r),
		     tail_of(n1.log, t1, sizeof(t1)), tail_of(n2.log, t2, sizeof(t2)));
	r = write_soon(n2.mnt, "after2", 15000);
	cr_assert_eq(r, 0, "node2 after the grow: %s\nnode1:\n%s\nnode2:\n%s", strerror(r),
		     tail_of(n1.log, t1, sizeof(t1)), tail_of(n2.log, t2, sizeof(t2)));
	cr_assert_eq(fill(n1.mnt, "c") >= 4, true, "node1 wrote little after the grow");
	cr_assert(file_has(n1.log, "(96 groups, was 64)"), "node1's log");
	cr_assert(file_has(n2.log, "(96 groups, was 64)"), "node2's log");
	/* statfs counts the new groups. */
	cr_assert_eq(statvfs(n1.mnt, &sv1), 0);
	cr_assert_eq(statvfs(n2.mnt, &sv2), 0);
	cr_assert_gt((uint64_t)sv1.f_blocks * sv1.f_frsize, 160ull << 20);
	cr_assert_gt((uint64_t)sv2.f_blocks * sv2.f_frsize, 160ull << 20);

	r = efs_test_fs_run(&n1, out, sizeof(out), "etcfsctl", "grow", n1.image, "100M", NULL);
	cr_assert_eq(r, 4, "shrink after the grow: status %d:\n%s", r, out);
	cr_assert(strstr(out, "refusing to shrink"), "%s", out);

	efs_test_fs_unmount(&n2);
	efs_test_fs_unmount(&n1);
	r = efs_test_fs_run(&n1, out, sizeof(out), "fsck.etcfs", "-n", n1.image, NULL);
	cr_assert_eq(r, 0, "fsck.etcfs -n after the grow: status %d:\n%s", r, out);
	/* The superblock took the new size: a fresh mount accepts it. */
	efs_test_fs_mount(&n1, NULL);
	snprintf(out, sizeof(out), "%s/c0", n1.mnt);
	cr_assert_eq(unlink(out), 0, "unlink %s: %s", out, strerror(errno));
	r = write_soon(n1.mnt, "remounted", 10000);
	cr_assert_eq(r, 0, "a write after the remount: %s", strerror(r));
	cr_assert_not(file_has(n1.log, "DOUBLE FREE"));
	cr_assert_not(file_has(n2.log, "DOUBLE FREE"));
}

/* The output of |cmd| (one line, newline dropped) into |out|. */
static int run_line(const char *cmd, char *out, size_t size)
{
	FILE *p = popen(cmd, "r");
	int st;

	out[0] = '\0';
	if (!p)
		return -1;
	if (fgets(out, (int)size, p))
		out[strcspn(out, "\n")] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool wait_log(const char *path, const char *needle, int ms)
{
	for (int waited = 0; waited <= ms; waited += 100) {
		if (file_has(path, needle))
			return true;
		usleep(100 * 1000);
	}
	return false;
}

Test(grow, a_node_whose_device_has_not_grown_waits_for_it)
{
	struct efs_test_fs_opts o = {.image_size = IMG_SIZE, .session_ttl = 3};
	static char t2[3000];
	char out[8192], cmd[600], path[600];
	int r;

	efs_test_fs_start(&n1, &o);
	snprintf(cmd, sizeof(cmd), "losetup -f --show --direct-io=on %s", n1.image);
	cr_assert_eq(run_line(cmd, loopdev, sizeof(loopdev)), 0, "losetup: %s", loopdev);
	cr_assert(!strncmp(loopdev, "/dev/loop", 9), "losetup said '%s'", loopdev);
	start_node2_on(loopdev);
	/* node2 fills the filesystem, so it owns the short last group too. */
	cr_assert_geq(fill(n2.mnt, "b"), 20);
	cr_assert(file_has(n2.log, "claimed group 63 "), "node2 does not own group 63:\n%s",
		  tail_of(n2.log, t2, sizeof(t2)));

	cr_assert_eq(truncate(n1.image, (off_t)GROW_SIZE), 0, "truncate: %s", strerror(errno));
	r = efs_test_fs_run(&n1, out, sizeof(out), "etcfsctl", "grow", n1.image, NULL);
	cr_assert_eq(r, 0, "grow: status %d:\n%s", r, out);
	cr_assert(wait_log(n1.log, "allocating in the new groups", 10000), "node1 took no groups");
	cr_assert(wait_log(n2.log, "leaving groups 64-95 alone until it sees the new size", 10000),
		  "node2 did not say it waits:\n%s", tail_of(n2.log, t2, sizeof(t2)));
	cr_assert_eq(write_file(n1.mnt, "n1-after"), 0, "node1 after the grow");
	cr_assert_not(file_has(n2.log, "allocating in the new groups"),
		      "node2 took the new groups before its device grew");
	/* node2 frees and writes again in its old groups, the lengthened
	 * last one among them, and keeps them all. */
	for (int i = 0; i < 8; i++) {
		snprintf(path, sizeof(path), "%s/b%d", n2.mnt, i);
		cr_assert_eq(unlink(path), 0, "unlink %s: %s", path, strerror(errno));
	}
	r = write_soon(n2.mnt, "before", 10000);
	cr_assert_eq(r, 0, "node2 before its device grew: %s\n%s", strerror(r),
		     tail_of(n2.log, t2, sizeof(t2)));
	cr_assert(file_has(n2.log, "group 63 was lengthened to 512 blocks by a growth this node "
				   "has not taken yet"),
		  "node2 did not re-read its lengthened group:\n%s",
		  tail_of(n2.log, t2, sizeof(t2)));
	cr_assert_not(file_has(n2.log, "no longer ours"), "%s", tail_of(n2.log, t2, sizeof(t2)));
	cr_assert_not(file_has(n2.log, "expected"), "%s", tail_of(n2.log, t2, sizeof(t2)));
	/* Mounted again on the device that has not grown: the part it shows. */
	efs_test_fs_unmount(&n2);
	efs_test_fs_mount(&n2, NULL);
	cr_assert(file_has(n2.log, "this node's device has 134742016: using groups 0-63 until it "
				   "sees the whole size"),
		  "%s", tail_of(n2.log, t2, sizeof(t2)));
	r = write_soon(n2.mnt, "remounted", 10000);
	cr_assert_eq(r, 0, "node2 remounted on its small device: %s", strerror(r));

	snprintf(cmd, sizeof(cmd), "losetup -c %s", loopdev);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	cr_assert(wait_log(n2.log, "(96 groups, was 64)", 10000),
		  "node2 did not take the new groups after losetup -c:\n%s",
		  tail_of(n2.log, t2, sizeof(t2)));
	r = write_soon(n2.mnt, "after", 10000);
	cr_assert_eq(r, 0, "node2 after losetup -c: %s", strerror(r));
	cr_assert_not(file_has(n2.log, "DOUBLE FREE"));
	efs_test_fs_unmount(&n2);
	efs_test_fs_unmount(&n1);
	r = efs_test_fs_run(&n1, out, sizeof(out), "fsck.etcfs", "-n", n1.image, NULL);
	cr_assert_eq(r, 0, "fsck.etcfs -n: status %d:\n%s", r, out);
}

/* ---- The inode limit grows with the data area, or as --inodes says ---- */

#define FEW_INODES 16

/* Creates empty files "<prefix><n>" on |mnt| until one fails: how many fit,
 * and that failure's errno in |ret_err|. */
static int create_until_full(const char *mnt, const char *prefix, int max, int *ret_err)
{
	char path[512];
	int n, fd;

	*ret_err = 0;
	for (n = 0; n < max; n++) {
		snprintf(path, sizeof(path), "%s/%s%d", mnt, prefix, n);
		fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0) {
			*ret_err = errno;
			break;
		}
		close(fd);
	}
	return n;
}

/* Waits up to |ms| for statfs on |mnt| to show |want| inodes in all. */
static uint64_t wait_files(const char *mnt, uint64_t want, int ms)
{
	struct statvfs v = {0};

	for (int waited = 0; waited <= ms; waited += 100) {
		cr_assert_eq(statvfs(mnt, &v), 0, "statvfs %s: %s", mnt, strerror(errno));
		if (v.f_files == want)
			break;
		usleep(100 * 1000);
	}
	return v.f_files;
}

Test(grow, the_inode_limit_grows_with_the_data)
{
	struct efs_test_fs_opts o = {.image_size = 64ull << 20, .inodes = FEW_INODES};
	static char t1[3000];
	char out[8192];
	int n, err, r;

	efs_test_fs_start(&n1, &o);
	start_node2();
	/* The root and lost+found take two inodes. */
	n = create_until_full(n1.mnt, "f", 100, &err);
	cr_assert_eq(err, ENOSPC, "create %d: %s, expected ENOSPC", n, strerror(err));
	cr_assert_eq(n, FEW_INODES - 2);

	/* An explicit limit below the inodes in use is refused. */
	r = efs_test_fs_run(&n1, out, sizeof(out), "etcfsctl", "grow", "--inodes", "8",
			    n1.image, NULL);
	cr_assert_eq(r, 4, "grow --inodes 8: status %d:\n%s", r, out);
	cr_assert(strstr(out, "below the 16 inodes in use"), "%s", out);
	cr_assert_eq(wait_files(n1.mnt, FEW_INODES, 0), FEW_INODES);

	/* Twice the device, a little more than twice the data area: the
	 * limit follows the data (32 and a fraction), on both nodes. */
	grow_image(128ull << 20, out, sizeof(out));
	cr_assert(strstr(out, "\"old_inode_limit\":16,\"inode_limit\":32"), "%s", out);
	cr_assert_eq(wait_files(n1.mnt, 32, 10000), 32, "node1's statfs:\n%s",
		     tail_of(n1.log, t1, sizeof(t1)));
	cr_assert_eq(wait_files(n2.mnt, 32, 10000), 32, "node2's statfs");
	n = create_until_full(n2.mnt, "g", 100, &err);
	cr_assert_eq(err, ENOSPC, "create %d: %s, expected ENOSPC", n, strerror(err));
	cr_assert_eq(n, 32 - FEW_INODES, "%d more files under a limit of 32", n);

	/* --inodes at the same size changes the limit alone. */
	r = efs_test_fs_run(&n1, out, sizeof(out), "etcfsctl", "grow", "--inodes", "100",
			    n1.image, NULL);
	cr_assert_eq(r, 0, "grow --inodes 100: status %d:\n%s", r, out);
	cr_assert(strstr(out, "32 -> 100 inodes"), "%s", out);
	cr_assert_eq(wait_files(n1.mnt, 100, 10000), 100);
	n = create_until_full(n1.mnt, "h", 10, &err);
	cr_assert_eq(n, 10, "create past the old limit: %s", strerror(err));

	efs_test_fs_unmount(&n2);
	efs_test_fs_unmount(&n1);
	r = efs_test_fs_run(&n1, out, sizeof(out), "fsck.etcfs", "-n", n1.image, NULL);
	cr_assert_eq(r, 0, "fsck.etcfs -n: status %d:\n%s", r, out);
}
