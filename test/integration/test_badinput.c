/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Mounts that must be refused: a device with no superblock, a corrupt one, one
 * with an unknown incompat feature, one whose UUID does not match its
 * keyspace, and etcd unreachable at mount. Each in the background (the parent
 * reports the child's error) and in the foreground: a clear message, exit
 * status 1, nothing mounted, and nothing written: the device's bytes, etcd's
 * revision, keys and leases are the same before and after. An unknown
 * read-only-compatible feature refuses a read-write mount the same way and
 * mounts with -o ro, where writes get EROFS.
 *
 * Then a real mount with etcd near its quota (--quota-backend-bytes 24 MiB
 * and etcfsd --etcd-quota to match), filled with junk keys outside the
 * filesystem: once the capacity monitor says LOW, and again once etcd's
 * own NOSPACE alarm is up, every growth operation fails with ENOSPC and
 * leaves nothing behind; freeing the space (delete, compact, defragment,
 * disarm) makes creates work again, and fsck finds the filesystem clean.
 * Last, the inode limit of mkfs --inodes: ENOSPC at the limit, statfs
 * agrees, an unlink makes room for one create.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "etcd/sync.h"
#include "harness.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "meta/sb.h"
#include "util/mem.h"

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

/* Sets read-only-compatible feature bit 61, which no version knows, in the
 * device's superblock (resealed) and in etcd's "sb" record alike: the two
 * agree, only the feature check speaks. */
static void unknown_ro_compat(uint8_t *sb)
{
	uint32_t crc;

	sb[136 + 7] |= 0x20; /* feature_ro_compat (little-endian at 136): bit 61 */
	crc = efs_crc32c(0, sb, EFS_SB_CRC_OFF);
	for (int i = 0; i < 4; i++)
		sb[EFS_SB_CRC_OFF + i] = (uint8_t)(crc >> (8 * i));
}

static void etcd_sb_ro_compat(uint64_t bits)
{
	struct efs_etcd_opts eo = {.endpoints = fs.endpoints};
	struct efs_etcd_sync *s;
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__FsInfo *fi = NULL;
	ProtobufCBinaryData v = {0};

	cr_assert_eq(efs_etcd_sync_new(&s, &eo), 0);
	cr_assert_eq(efs_meta_ns_init(&ns, "testfs"), 0);
	cr_assert_eq(efs_meta_key_sb(&ns, &k), 0);
	cr_assert_eq(efs_etcd_sync_get(s, k.buf, k.len, &kv, NULL), 0);
	cr_assert_eq(efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &fi, NULL), 0);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	fi->feature_ro_compat |= bits;
	cr_assert_eq(efs_meta_pack(&fi->base, &v), 0);
	cr_assert_eq(efs_etcd_sync_put(s, k.buf, k.len, v.data, v.len, 0, NULL), 0);
	efs_mem_free(v.data);
	efs_meta_record_free(fi);
	efs_etcd_sync_free(s);
}

/* An unknown ro_compat bit: a mount asked for read-write mounts read-only
 * (with a warning), and writes get EROFS. */
Test(badinput, unknown_ro_compat_feature_mounts_read_only)
{
	char path[PATH_MAX];
	struct statvfs sv;
	int fd;

	start();
	patch_superblock(fs.image, unknown_ro_compat);
	etcd_sb_ro_compat(1ull << 61);
	efs_test_fs_mount(&fs, NULL);
	cr_assert_eq(statvfs(fs.mnt, &sv), 0, "statvfs: %s", strerror(errno));
	cr_assert(sv.f_flag & ST_RDONLY, "the mount is not read-only");
	snprintf(path, sizeof(path), "%s/newfile", fs.mnt);
	fd = open(path, O_CREAT | O_WRONLY, 0644);
	cr_assert_eq(fd, -1, "a create on the read-only mount worked");
	cr_assert_eq(errno, EROFS, "create: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/lost+found", fs.mnt);
	cr_assert_eq(access(path, F_OK), 0, "lost+found: %s", strerror(errno));
	cr_assert_eq(mkdir(path, 0755), -1);
	efs_test_fs_unmount(&fs);
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

/* ---- etcd near its quota ---- */

#define QUOTA	   (24ull << 20)
#define JUNK_SIZE  (256 * 1024)
#define JUNK_PAUSE 60000 /* us between junk puts: etcd's quota check sees
			  * the size of its last backend commit (every 100 ms),
			  * so unpaced puts would overshoot it */

static struct efs_etcd_sync *junk_client(void)
{
	struct efs_etcd_opts eo = {0};
	struct efs_etcd_sync *s = NULL;

	eo.endpoints = fs.endpoints;
	cr_assert_eq(efs_etcd_sync_new(&s, &eo), 0);
	return s;
}

/* Status of the member: dbSize and the size in use, and whether the
 * NOSPACE alarm is listed. */
static void db_status(struct efs_etcd_sync *s, uint64_t *db, uint64_t *in_use, bool *alarm)
{
	Etcdserverpb__StatusResponse *st = NULL;
	int r = efs_etcd_sync_status(s, &st);

	cr_assert_eq(r, 0, "etcd Status: %s", strerror(-r));
	*db = (uint64_t)st->dbsize;
	*in_use = st->dbsizeinuse ? (uint64_t)st->dbsizeinuse : (uint64_t)st->dbsize;
	*alarm = false;
	for (size_t i = 0; i < st->n_errors; i++)
		if (strstr(st->errors[i], "NOSPACE"))
			*alarm = true;
	protobuf_c_message_free_unpacked(&st->base, efs_mem_protobuf());
}

/*
 * Writes 256 KiB junk values under "junk/", outside the filesystem's keys,
 * until the size in use reaches |in_use_pct| percent of the quota or dbSize
 * |db_pct| percent (both 0: until etcd refuses a put). Returns the error of
 * the last put (0 when the sizes were reached first).
 */
static int fill_junk(struct efs_etcd_sync *s, unsigned in_use_pct, unsigned db_pct, int *count)
{
	char *value = efs_mem_malloc(JUNK_SIZE);
	char key[32];
	uint64_t db, in_use;
	bool alarm;
	int r = 0, i;

	cr_assert_not_null(value);
	memset(value, 'j', JUNK_SIZE);
	for (i = 0; i < 400; i++) {
		if (in_use_pct) {
			db_status(s, &db, &in_use, &alarm);
			cr_assert(!alarm, "NOSPACE alarm while filling to %u%%", in_use_pct);
			if (in_use * 100 >= QUOTA * in_use_pct || db * 100 >= QUOTA * db_pct)
				break;
		}
		snprintf(key, sizeof(key), "junk/%05d", i);
		r = efs_etcd_sync_put(s, key, strlen(key), value, JUNK_SIZE, 0, NULL);
		if (r)
			break;
		usleep(JUNK_PAUSE);
	}
	efs_mem_free(value);
	*count = i;
	cr_assert(i < 400, "etcd took 100 MiB of junk with a %llu byte quota",
		  (unsigned long long)QUOTA);
	return r;
}

/* Deletes the junk, compacts physically at the resulting revision and
 * defragments: what an operator (or the maintenance node) does. */
static void free_junk(struct efs_etcd_sync *s)
{
	char rev[32], *out = NULL;
	int64_t deleted = 0;
	Mvccpb__KeyValue *kv = NULL;
	int64_t revision = 0;
	int r;

	r = efs_etcd_sync_delete(s, "junk/", 5, true, &deleted);
	cr_assert_eq(r, 0, "deleting the junk: %s", strerror(-r));
	cr_assert_gt(deleted, 0);
	r = efs_etcd_sync_get(s, "junk/", 5, &kv, &revision);
	cr_assert_eq(r, -ENOENT);
	snprintf(rev, sizeof(rev), "%lld", (long long)revision);
	r = efs_harness_etcdctl(fs.etcd, &out, "compact", rev, "--physical", NULL);
	cr_assert_eq(r, 0, "etcdctl compact %s: %d %s", rev, r, out ? out : "");
	free(out);
	out = NULL;
	r = efs_harness_etcdctl(fs.etcd, &out, "defrag", NULL);
	cr_assert_eq(r, 0, "etcdctl defrag: %d %s", r, out ? out : "");
	free(out);
}

/* Polls the daemon's gauge |name| until it reads |want| (bounded). */
static void wait_metric(const char *name, double want, int timeout_ms)
{
	uint64_t t0 = now_ms();
	double v;

	for (;;) {
		v = efs_test_fs_metric(&fs, name);
		if (v == want)
			return;
		cr_assert_lt(now_ms() - t0, (uint64_t)timeout_ms,
			     "%s is %g after %d ms, expected %g", name, v, timeout_ms, want);
		usleep(100000);
	}
}

static void path_in(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/d/%s", fs.mnt, name);
}

/* A directory d with files f0..f3 and a subdirectory sub. */
static void populate(void)
{
	char p[512];
	int fd;

	path_in(p, sizeof(p), "");
	cr_assert_eq(mkdir(p, 0755), 0, "mkdir %s: %s", p, strerror(errno));
	for (int i = 0; i < 4; i++) {
		char n[8];

		snprintf(n, sizeof(n), "f%d", i);
		path_in(p, sizeof(p), n);
		fd = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		cr_assert_geq(fd, 0, "create %s: %s", p, strerror(errno));
		close(fd);
	}
	path_in(p, sizeof(p), "sub");
	cr_assert_eq(mkdir(p, 0755), 0, "mkdir %s: %s", p, strerror(errno));
}

static bool same_time(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* |what| returned -1 with |err|, and d and d/f0 are as |d0| and |f00|. */
static void expect_refused_growth(int ret, int err, const char *what, const char *name,
				  const struct stat *d0, const struct stat *f00)
{
	struct stat d1, f01, st;
	char p[512];

	cr_assert(ret == -1 && errno == err, "%s: returned %d (%s), expected %s", what, ret,
		  ret == -1 ? strerror(errno) : "success", strerror(err));
	if (name) {
		path_in(p, sizeof(p), name);
		cr_assert(lstat(p, &st) == -1 && errno == ENOENT, "%s: %s exists after the failure",
			  what, name);
	}
	path_in(p, sizeof(p), "");
	cr_assert_eq(stat(p, &d1), 0);
	cr_assert_eq(d1.st_nlink, d0->st_nlink, "%s: directory nlink %ju -> %ju", what,
		     (uintmax_t)d0->st_nlink, (uintmax_t)d1.st_nlink);
	cr_assert(same_time(d1.st_mtim, d0->st_mtim) && same_time(d1.st_ctim, d0->st_ctim),
		  "%s: the directory's mtime or ctime moved", what);
	cr_assert_eq(d1.st_size, d0->st_size, "%s: directory size moved", what);
	path_in(p, sizeof(p), "f0");
	cr_assert_eq(stat(p, &f01), 0);
	cr_assert_eq(f01.st_nlink, f00->st_nlink, "%s: f0 nlink moved", what);
	cr_assert(same_time(f01.st_ctim, f00->st_ctim), "%s: f0 ctime moved", what);
}

/*
 * Every growth operation on d fails with |err| and leaves nothing behind:
 * no new name, the directory's nlink, size, mtime and ctime and f0's link
 * count and ctime unchanged, no xattr.
 */
static void expect_no_growth(int err)
{
	struct stat d0, f00;
	char p[512], q[512], v[8];
	int r;

	path_in(p, sizeof(p), "");
	cr_assert_eq(stat(p, &d0), 0);
	path_in(p, sizeof(p), "f0");
	cr_assert_eq(stat(p, &f00), 0);

	path_in(p, sizeof(p), "new");
	r = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
	if (r >= 0)
		close(r);
	expect_refused_growth(r < 0 ? -1 : 0, err, "create", "new", &d0, &f00);
	path_in(p, sizeof(p), "newdir");
	r = mkdir(p, 0755);
	expect_refused_growth(r, err, "mkdir", "newdir", &d0, &f00);
	path_in(p, sizeof(p), "fifo");
	r = mknod(p, S_IFIFO | 0644, 0);
	expect_refused_growth(r, err, "mknod", "fifo", &d0, &f00);
	path_in(p, sizeof(p), "sym");
	r = symlink("f0", p);
	expect_refused_growth(r, err, "symlink", "sym", &d0, &f00);
	path_in(p, sizeof(p), "f0");
	path_in(q, sizeof(q), "lnk");
	r = link(p, q);
	expect_refused_growth(r, err, "link", "lnk", &d0, &f00);
	r = setxattr(p, "user.quota", "v", 1, XATTR_CREATE);
	expect_refused_growth(r, err, "setxattr", NULL, &d0, &f00);
	cr_assert(getxattr(p, "user.quota", v, sizeof(v)) == -1 && errno == ENODATA,
		  "the xattr exists after the failed setxattr");
	path_in(p, sizeof(p), "f1");
	path_in(q, sizeof(q), "f1-renamed");
	r = rename(p, q);
	expect_refused_growth(r, err, "rename onto a new name", "f1-renamed", &d0, &f00);
	cr_assert_eq(access(p, F_OK), 0, "f1 is gone after the failed rename");
}

/* Unlink and rmdir of existing entries, then the directory has one link less. */
static void expect_removal_works(void)
{
	struct stat d0, d1;
	char p[512];

	path_in(p, sizeof(p), "");
	cr_assert_eq(stat(p, &d0), 0);
	path_in(p, sizeof(p), "f2");
	cr_assert_eq(unlink(p), 0, "unlink %s: %s", p, strerror(errno));
	path_in(p, sizeof(p), "sub");
	cr_assert_eq(rmdir(p), 0, "rmdir %s: %s", p, strerror(errno));
	path_in(p, sizeof(p), "");
	cr_assert_eq(stat(p, &d1), 0);
	cr_assert_eq(d1.st_nlink, d0.st_nlink - 1);
}

/* Creates work again within |timeout_ms|, then every other growth op. */
static void expect_growth_again(int timeout_ms)
{
	uint64_t t0 = now_ms();
	char p[512], q[512];
	int fd;

	path_in(p, sizeof(p), "new");
	for (;;) {
		fd = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd >= 0)
			break;
		cr_assert_eq(errno, ENOSPC, "create while recovering: %s", strerror(errno));
		cr_assert_lt(now_ms() - t0, (uint64_t)timeout_ms,
			     "creates still fail with ENOSPC %d ms after the space came back",
			     timeout_ms);
		usleep(200000);
	}
	close(fd);
	cr_log_info("creates work again %llu ms after the space came back",
		    (unsigned long long)(now_ms() - t0));
	path_in(p, sizeof(p), "newdir");
	cr_assert_eq(mkdir(p, 0755), 0, "mkdir: %s", strerror(errno));
	path_in(p, sizeof(p), "fifo");
	cr_assert_eq(mknod(p, S_IFIFO | 0644, 0), 0, "mknod: %s", strerror(errno));
	path_in(p, sizeof(p), "sym");
	cr_assert_eq(symlink("f0", p), 0, "symlink: %s", strerror(errno));
	path_in(p, sizeof(p), "f0");
	path_in(q, sizeof(q), "lnk");
	cr_assert_eq(link(p, q), 0, "link: %s", strerror(errno));
	cr_assert_eq(setxattr(p, "user.quota", "v", 1, XATTR_CREATE), 0, "setxattr: %s",
		     strerror(errno));
	path_in(p, sizeof(p), "f1");
	path_in(q, sizeof(q), "f1-renamed");
	cr_assert_eq(rename(p, q), 0, "rename: %s", strerror(errno));
}

static void unmount_and_fsck(void)
{
	char out[16384];
	int r;

	efs_test_fs_unmount(&fs);
	r = efs_test_fs_run(&fs, out, sizeof(out), "fsck.etcfs", "-n", fs.image, NULL);
	cr_assert_eq(r, 0, "fsck.etcfs -n: status %d:\n%s", r, out);
}

static void start_quota(void)
{
	struct efs_test_fs_opts o = {
		.image_size = 64ull << 20,
		.etcd_quota = QUOTA,
		.metrics = true,
	};

	efs_test_fs_start(&fs, &o);
	cr_assert_eq(efs_test_fs_metric(&fs, "etcfs_etcd_quota_bytes"), (double)QUOTA);
}

Test(badinput, etcd_space_low, .timeout = 180)
{
	struct efs_etcd_sync *s;
	uint64_t db, in_use;
	bool alarm;
	int n, r;

	start_quota();
	populate();
	wait_metric("etcfs_metadata_space_low", 0, 1000);
	s = junk_client();
	/* Past the guard's 80 % in use or 90 % dbSize, short of etcd's quota. */
	r = fill_junk(s, 82, 91, &n);
	cr_assert_eq(r, 0, "junk put %d: %s", n, strerror(-r));
	db_status(s, &db, &in_use, &alarm);
	cr_log_info("%d junk puts: dbSize %ju, in use %ju", n, (uintmax_t)db, (uintmax_t)in_use);
	/* The monitor asks every 5 s. */
	wait_metric("etcfs_metadata_space_low", 1, 20000);
	cr_assert_eq(efs_test_fs_metric(&fs, "etcfs_etcd_nospace_alarm"), 0);

	expect_no_growth(ENOSPC);
	expect_removal_works();
	/* etcd itself still accepts writes: only the guard refused. */
	db_status(s, &db, &in_use, &alarm);
	cr_assert(!alarm, "etcd raised NOSPACE");

	free_junk(s);
	expect_growth_again(20000);
	wait_metric("etcfs_metadata_space_low", 0, 1000);
	s = efs_etcd_sync_free(s);
	unmount_and_fsck();
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(badinput, etcd_nospace_alarm, .timeout = 180)
{
	struct efs_etcd_sync *s;
	uint64_t db, in_use;
	struct stat d0, d1;
	char p[512], *out = NULL;
	bool alarm;
	int n, r;

	start_quota();
	populate();
	s = junk_client();
	/* Past the guard, as a writer that ignores it would, until etcd refuses:
	 * its NOSPACE alarm is up then. */
	r = fill_junk(s, 0, 0, &n);
	cr_assert_eq(r, -ENOSPC, "junk put %d: %s, expected ENOSPC", n, strerror(-r));
	db_status(s, &db, &in_use, &alarm);
	cr_log_info("etcd refused junk put %d: dbSize %ju, in use %ju", n, (uintmax_t)db,
		    (uintmax_t)in_use);
	cr_assert(alarm, "etcd refused a put but lists no NOSPACE alarm");
	wait_metric("etcfs_etcd_nospace_alarm", 1, 20000);
	cr_assert_eq(efs_test_fs_metric(&fs, "etcfs_metadata_space_low"), 1);

	expect_no_growth(ENOSPC);
	/* Removals are no growth, but etcd refuses every transaction that
	 * writes a key while the alarm is up (the parent directory's record
	 * is rewritten): a clean ENOSPC, with nothing removed. */
	path_in(p, sizeof(p), "");
	cr_assert_eq(stat(p, &d0), 0);
	path_in(p, sizeof(p), "f2");
	r = unlink(p);
	cr_assert(r == -1 && errno == ENOSPC, "unlink under NOSPACE: %d (%s)", r,
		  r ? strerror(errno) : "success");
	cr_assert_eq(access(p, F_OK), 0, "f2 is gone after the failed unlink");
	path_in(p, sizeof(p), "sub");
	r = rmdir(p);
	cr_assert(r == -1 && errno == ENOSPC, "rmdir under NOSPACE: %d (%s)", r,
		  r ? strerror(errno) : "success");
	cr_assert_eq(access(p, F_OK), 0, "sub is gone after the failed rmdir");
	path_in(p, sizeof(p), "");
	cr_assert_eq(stat(p, &d1), 0);
	cr_assert_eq(d1.st_nlink, d0.st_nlink);
	cr_assert(same_time(d1.st_mtim, d0.st_mtim));
	/* Reads still work. */
	path_in(p, sizeof(p), "f3");
	cr_assert_eq(access(p, F_OK), 0);

	/* The operator's way out: free space, compact, defragment, disarm. */
	free_junk(s);
	r = efs_harness_etcdctl(fs.etcd, &out, "alarm", "disarm", NULL);
	cr_assert_eq(r, 0, "etcdctl alarm disarm: %d %s", r, out ? out : "");
	free(out);
	expect_growth_again(20000);
	wait_metric("etcfs_etcd_nospace_alarm", 0, 1000);
	expect_removal_works();
	s = efs_etcd_sync_free(s);
	unmount_and_fsck();
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

/* ---- The inode limit (mkfs --inodes) ---- */

#define INODES 12

static void wait_ffree(uint64_t want)
{
	uint64_t t0 = now_ms();
	struct statvfs v;

	for (;;) {
		cr_assert_eq(statvfs(fs.mnt, &v), 0, "statvfs: %s", strerror(errno));
		cr_assert_eq(v.f_files, INODES, "f_files %ju", (uintmax_t)v.f_files);
		if (v.f_ffree == want)
			break;
		cr_assert_lt(now_ms() - t0, 10000, "f_ffree %ju, expected %ju",
			     (uintmax_t)v.f_ffree, (uintmax_t)want);
		usleep(100000);
	}
	cr_assert_eq(v.f_favail, want);
}

Test(badinput, inode_limit)
{
	struct efs_test_fs_opts o = {.image_size = 64ull << 20, .inodes = INODES};
	struct stat r0, r1;
	char p[512], q[512];
	int fd, n;

	efs_test_fs_start(&fs, &o);
	/* The root and lost+found are two of them. */
	wait_ffree(INODES - 2);
	for (n = 0; n < INODES; n++) {
		snprintf(p, sizeof(p), "%s/f%d", fs.mnt, n);
		fd = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0)
			break;
		close(fd);
	}
	cr_assert(fd < 0 && errno == ENOSPC, "create %d: %s, expected ENOSPC", n,
		  fd < 0 ? strerror(errno) : "success");
	cr_assert_eq(n, INODES - 2, "%d files fit under a limit of %d inodes", n, INODES);
	wait_ffree(0);

	/* Nothing half-done, and every op that takes an inode is refused. */
	cr_assert_eq(stat(fs.mnt, &r0), 0);
	cr_assert(access(p, F_OK) == -1 && errno == ENOENT, "%s exists", p);
	snprintf(p, sizeof(p), "%s/dir", fs.mnt);
	cr_assert(mkdir(p, 0755) == -1 && errno == ENOSPC, "mkdir at the limit: %s",
		  strerror(errno));
	snprintf(p, sizeof(p), "%s/sym", fs.mnt);
	cr_assert(symlink("f0", p) == -1 && errno == ENOSPC, "symlink at the limit: %s",
		  strerror(errno));
	snprintf(p, sizeof(p), "%s/fifo", fs.mnt);
	cr_assert(mknod(p, S_IFIFO | 0644, 0) == -1 && errno == ENOSPC, "mknod at the limit: %s",
		  strerror(errno));
	cr_assert_eq(stat(fs.mnt, &r1), 0);
	cr_assert_eq(r1.st_nlink, r0.st_nlink);
	cr_assert(same_time(r1.st_mtim, r0.st_mtim));
	wait_ffree(0);

	/* A hard link takes no inode. */
	snprintf(p, sizeof(p), "%s/f0", fs.mnt);
	snprintf(q, sizeof(q), "%s/f0-link", fs.mnt);
	cr_assert_eq(link(p, q), 0, "link at the limit: %s", strerror(errno));

	/* Unlinking a file frees its inode: one create fits again. */
	snprintf(p, sizeof(p), "%s/f1", fs.mnt);
	cr_assert_eq(unlink(p), 0);
	wait_ffree(1);
	snprintf(p, sizeof(p), "%s/again", fs.mnt);
	fd = open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create after an unlink: %s", strerror(errno));
	close(fd);
	wait_ffree(0);
	snprintf(p, sizeof(p), "%s/again2", fs.mnt);
	cr_assert(open(p, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644) == -1 &&
			  errno == ENOSPC,
		  "second create after one unlink: %s", strerror(errno));
	unmount_and_fsck();
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}
