/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Mounts that must be refused (issue 3 section 4): a device with no
 * superblock, a corrupt one, one with an unknown incompat feature, one
 * whose UUID does not match its keyspace, and etcd unreachable at mount.
 * Each in the background (the parent reports the child's error) and in
 * the foreground: a clear message, exit status 1, nothing mounted, and
 * nothing written: the device's bytes, etcd's revision, keys and leases
 * are the same before and after.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "harness.h"
#include "meta/sb.h"

#include "../support/leak.h"
#include "../support/mount.h"

static struct efs_test_fs fs;

static void fini(void)
{
	efs_test_fs_stop(&fs);
}

TestSuite(badinput, .fini = fini, .timeout = 120);

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void start(void)
{
	struct efs_test_fs_opts o = {
		.image_size = 64ull << 20,
		.no_mount = true,
	};

	efs_test_fs_start(&fs, &o);
}

/* CRC32C of a whole file (the device "bytes" compared before and after). */
static uint32_t file_crc(const char *path)
{
	static char buf[1 << 20];
	uint32_t crc = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		crc = efs_crc32c(crc, buf, (size_t)n);
	cr_assert_eq(n, 0, "read %s: %s", path, strerror(errno));
	close(fd);
	return crc;
}

/*
 * What etcd holds: the store revision (any write moves it), every key and
 * value, and the leases (a session grants one before it writes).
 */
static char *etcd_snapshot(void)
{
	char *kv = NULL, *leases = NULL, *snap = NULL, *rev, *kvs;
	int r;

	r = efs_harness_etcdctl(fs.etcd, &kv, "get", "", "--from-key", "-w", "json", NULL);
	cr_assert_eq(r, 0, "etcdctl get: %d %s", r, kv ? kv : "");
	r = efs_harness_etcdctl(fs.etcd, &leases, "lease", "list", NULL);
	cr_assert_eq(r, 0, "etcdctl lease list: %d %s", r, leases ? leases : "");
	/* The header's raft term moves with an etcd restart; the rest must not. */
	rev = strstr(kv, "\"revision\":");
	kvs = strstr(kv, "\"kvs\":");
	cr_assert(rev && kvs, "unexpected etcdctl output: %s", kv);
	cr_assert_geq(asprintf(&snap, "%.*s\n%s\n%s", (int)strcspn(rev, ",}"), rev, kvs, leases),
		      0);
	free(kv);
	free(leases);
	return snap;
}

struct before {
	uint32_t crc;
	char *etcd;
};

static struct before snapshot(const char *device)
{
	struct before b = {.crc = file_crc(device), .etcd = etcd_snapshot()};

	return b;
}

static void assert_unchanged(struct before *b, const char *device)
{
	char *now = etcd_snapshot();

	cr_assert_eq(file_crc(device), b->crc, "%s changed", device);
	cr_assert_str_eq(now, b->etcd, "etcd changed:\nbefore:\n%s\nafter:\n%s", b->etcd, now);
	free(now);
	free(b->etcd);
	b->etcd = NULL;
}

/* Runs etcfsd on |device| in the background and with -f; both must refuse. */
static void expect_refused(const char *device, const char *why, const char *const *extra)
{
	for (int fg = 0; fg < 2; fg++) {
		const char *args[16];
		char out[16384];
		struct before b = snapshot(device);
		int n = 0, r;

		if (fg)
			args[n++] = "-f";
		args[n++] = "--node-id";
		args[n++] = "bad1";
		for (int i = 0; extra && extra[i]; i++)
			args[n++] = extra[i];
		args[n++] = device;
		args[n++] = fs.mnt;
		args[n] = NULL;
		r = efs_test_fs_runv(&fs, out, sizeof(out), "etcfsd", args);
		cr_assert_eq(r, 1, "etcfsd%s on %s: status %d, expected 1:\n%s", fg ? " -f" : "",
			     device, r, out);
		cr_assert(strstr(out, "etcfsd: ") && strstr(out, why),
			  "etcfsd%s: expected a message with \"%s\", got:\n%s", fg ? " -f" : "", why,
			  out);
		cr_assert(!efs_test_is_fuse_mount(fs.mnt), "%s got mounted", device);
		assert_unchanged(&b, device);
	}
}

static void patch_superblock(const char *device, void (*patch)(uint8_t *sb))
{
	uint8_t sb[EFS_SB_SIZE];
	int fd = open(device, O_RDWR | O_CLOEXEC);

	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, sb, sizeof(sb), 0), (ssize_t)sizeof(sb));
	patch(sb);
	cr_assert_eq(pwrite(fd, sb, sizeof(sb), 0), (ssize_t)sizeof(sb));
	close(fd);
}

Test(badinput, no_superblock)
{
	char blank[300];
	int fd;

	start();
	snprintf(blank, sizeof(blank), "%s/blank.img", fs.dir);
	fd = open(blank, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, 64 << 20), 0);
	close(fd);
	expect_refused(blank, "not an etcfs device", NULL);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

static void flip_byte(uint8_t *sb)
{
	/* Inside the name field: only the checksum can tell. */
	sb[40] ^= 0x20;
}

Test(badinput, corrupt_superblock)
{
	start();
	patch_superblock(fs.image, flip_byte);
	expect_refused(fs.image, "checksum mismatch", NULL);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

/* Sets an incompat feature bit no version knows and reseals the checksum. */
static void unknown_incompat(uint8_t *sb)
{
	uint32_t crc;

	sb[144 + 7] |= 0x40; /* feature_incompat (little-endian at 144): bit 62 */
	crc = efs_crc32c(0, sb, EFS_SB_CRC_OFF);
	for (int i = 0; i < 4; i++)
		sb[EFS_SB_CRC_OFF + i] = (uint8_t)(crc >> (8 * i));
}

Test(badinput, unknown_incompat_feature)
{
	char reason[EFS_SB_REASON_MAX];
	uint8_t sb[EFS_SB_SIZE];
	struct efs_sb dec;
	int fd;

	start();
	patch_superblock(fs.image, unknown_incompat);
	/* The patch is a valid superblock that only the feature check refuses. */
	fd = open(fs.image, O_RDONLY | O_CLOEXEC);
	cr_assert_eq(pread(fd, sb, sizeof(sb), 0), (ssize_t)sizeof(sb));
	close(fd);
	cr_assert_eq(efs_sb_decode(sb, sizeof(sb), &dec, NULL, reason, sizeof(reason)),
		     -EPROTONOSUPPORT, "%s", reason);
	expect_refused(fs.image, "unsupported incompatible features", NULL);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(badinput, uuid_does_not_match_keyspace)
{
	char other[300], out[8192];
	int fd, r;

	start();
	/* A second device formatted under the same name takes the keyspace over. */
	snprintf(other, sizeof(other), "%s/other.img", fs.dir);
	fd = open(other, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, 64 << 20), 0);
	close(fd);
	r = efs_test_fs_run(&fs, out, sizeof(out), "mkfs.etcfs", "--name", fs.opts.fsname,
			    "--force", other, NULL);
	cr_assert_eq(r, 0, "mkfs --force: %d\n%s", r, out);
	expect_refused(fs.image, "belongs to another filesystem", NULL);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(badinput, etcd_unreachable)
{
	static const char *const fast[] = {"--dial-timeout", "2", NULL};
	struct before b;
	uint64_t t0;
	int r;

	start();
	b.crc = file_crc(fs.image);
	b.etcd = etcd_snapshot();
	r = efs_harness_stop(fs.etcd, 0);
	cr_assert_eq(r, 0, "stopping etcd: %d", r);
	for (int fg = 0; fg < 2; fg++) {
		const char *args[] = {"--node-id", "bad1", fast[0], fast[1],
				      fg ? "-f" : "--log-level=info", fs.image, fs.mnt, NULL};
		char out[16384];

		t0 = now_ms();
		r = efs_test_fs_runv(&fs, out, sizeof(out), "etcfsd", args);
		cr_assert_eq(r, 1, "status %d:\n%s", r, out);
		cr_assert(strstr(out, "etcfsd: ") && strstr(out, "unreachable"), "message:\n%s",
			  out);
		/* The dial timeout bounds the wait (plus a start-up margin). */
		cr_assert_lt(now_ms() - t0, 6000, "took %llu ms",
			     (unsigned long long)(now_ms() - t0));
		cr_assert(!efs_test_is_fuse_mount(fs.mnt));
	}
	r = efs_harness_restart(fs.etcd, 0);
	cr_assert_eq(r, 0, "restarting etcd: %d", r);
	assert_unchanged(&b, fs.image);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}
