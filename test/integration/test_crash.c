/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The crash test: kill -9 of etcfsd during a write load, mount again, and
 * every byte that fsync acknowledged is there; fsck is clean once reclaim ran;
 * no space leaked.
 *
 * A writer child appends fixed-size records (a sequence number, the file,
 * a payload derived from both and a checksum) round-robin to several files
 * of the mount, fsyncs every file each k records and, after each
 * successful round of fsyncs, writes the acknowledged count to a file
 * OUTSIDE the mount (in the fixture's directory) and fdatasyncs it. The
 * test kills etcfsd at a seeded random moment (0.5 to 3 s), then the
 * writer, mounts again and checks every acknowledged record, waits
 * (bounded) until etcd holds no rc/ or o/ key, unmounts, runs fsck.etcfs
 * (exit 0 expected) and mounts again for the next round. Three rounds per
 * Test, each with its own seed (ETCFS_TEST_SEED gives the first; every
 * failure message names the round's seed). At the end everything is
 * deleted and the free space must come back to its value after mkfs.
 *
 * The "churn" variant adds a truncate/punch/fallocate-heavy load on other
 * files of the same writer (nothing of it is acknowledged: it is there to
 * have frees, reclaim and partial blocks in flight at the kill).
 *
 * Built with -DDATA_LOCAL=1 it runs on a private ext4 (no daemon to kill:
 * only the writer is killed; e2fsck -fn replaces fsck.etcfs), which checks
 * the test's own logic.
 */
#include "../support/datamodel.h"

#include <linux/falloc.h>
#include <sys/mman.h>

#define NF	 4	/* record files */
#define RS	 1000	/* record size: unaligned on purpose */
#define MAX_RECS 40000	/* per round: 40 MB of records */
#define ROUNDS	 3

TestSuite(crash, .fini = env_stop, .timeout = 300);

/* Fills |rec| with record |seq| (file seq % NF, slot seq / NF). */
static void make_rec(uint8_t *rec, uint64_t seq)
{
	uint64_t s = seq * 0x2545f4914f6cdd1dull + 17, h;
	uint32_t file = (uint32_t)(seq % NF), len = RS;

	memcpy(rec, &seq, 8);
	memcpy(rec + 8, &file, 4);
	memcpy(rec + 12, &len, 4);
	rnd_fill(&s, rec + 16, RS - 24);
	h = fnv64(rec, RS - 8);
	memcpy(rec + RS - 8, &h, 8);
}

/* Exit codes of the writer: 0 when it failed after the kill, else the stage. */
enum { WR_OK = 0, WR_OPEN = 10, WR_WRITE, WR_FSYNC, WR_ACK, WR_CHURN };

/* Set by the test (shared with the writer) just before it kills etcfsd. */
static volatile int *kill_issued;

/*
 * A failed or short call of the writer: the end of the writer (exit 0) once
 * the kill was issued (a request the daemon had not answered may then fail
 * in any way: ENOTCONN, ECONNABORTED, a short count, ...), a failure (exit
 * |stage|) before: the daemon alive never fails one.
 */
static void wr_failed(int stage)
{
	if (*kill_issued)
		_exit(WR_OK);
	_exit(stage);
}

static void churn_once(int fd, uint64_t *r, const uint8_t *pat)
{
	uint64_t p = rnd_next(r) % 6, off = rnd_range(r, 0, 8u << 20), len = rnd_range(r, 1, 262144);
	int rc;

	switch (p) {
	case 0:
	case 1:
		rc = pwrite(fd, pat, len, (off_t)off) < 0 ? -1 : 0;
		break;
	case 2:
		rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
			       (off_t)len);
		break;
	case 3:
		rc = ftruncate(fd, (off_t)off);
		break;
	case 4:
		rc = fallocate(fd, rnd_next(r) % 2 ? FALLOC_FL_KEEP_SIZE : 0, (off_t)off,
			       (off_t)len);
		break;
	default:
		rc = rnd_next(r) % 2 ? fdatasync(fd) : fsync(fd);
		break;
	}
	if (rc < 0)
		wr_failed(WR_CHURN);
}

/* The writer: never returns. */
static void writer(const char *dir, const char *ack_path, unsigned k, bool churn, uint64_t seed)
{
	char path[PATH_MAX + 96];
	uint8_t rec[RS], *pat = malloc(262144);
	int fds[NF], cfd[2] = {-1, -1}, ack;
	uint64_t r = seed;

	if (!pat)
		_exit(WR_OPEN);
	rnd_fill(&r, pat, 262144);
	for (int i = 0; i < NF; i++) {
		snprintf(path, sizeof(path), "%s/rec%d", dir, i);
		fds[i] = open(path, O_WRONLY | O_CLOEXEC);
		if (fds[i] < 0)
			wr_failed(WR_OPEN);
	}
	for (int i = 0; churn && i < 2; i++) {
		snprintf(path, sizeof(path), "%s/churn%d", dir, i);
		cfd[i] = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		if (cfd[i] < 0)
			wr_failed(WR_OPEN);
	}
	ack = open(ack_path, O_WRONLY | O_CLOEXEC);
	if (ack < 0)
		_exit(WR_ACK);
	for (uint64_t seq = 0;; seq++) {
		if (seq == MAX_RECS)
			for (;;)
				pause();
		make_rec(rec, seq);
		if (pwrite(fds[seq % NF], rec, RS, (off_t)(seq / NF) * RS) != RS)
			wr_failed(WR_WRITE);
		if (churn && seq % 3 == 0)
			churn_once(cfd[seq % 2], &r, pat);
		if ((seq + 1) % k == 0) {
			uint64_t acked = seq + 1;

			for (int i = 0; i < NF; i++)
				if ((i % 2 ? fdatasync(fds[i]) : fsync(fds[i])) < 0)
					wr_failed(WR_FSYNC);
			if (pwrite(ack, &acked, 8, 0) != 8 || fdatasync(ack) < 0)
				_exit(WR_ACK);
		}
	}
}

static uint64_t read_ack(const char *path)
{
	uint64_t v = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
	cr_assert_eq(pread(fd, &v, 8, 0), 8, "read %s", path);
	close(fd);
	return v;
}

/* The directory outside the mount where acknowledgements go. */
static const char *outside_dir(void)
{
#ifdef DATA_LOCAL
	return env.dir;
#else
	return env.f.dir;
#endif
}

static void fsck_clean(uint64_t seed, int round)
{
	char out[16384];
	int rc;

#ifdef DATA_LOCAL
	rc = shell(out, sizeof(out), "e2fsck -fn %s 2>&1", env.image);
#else
	rc = run_fsck(out, sizeof(out));
#endif
	cr_assert_eq(rc, 0, "round %d (ETCFS_TEST_SEED=%" PRIu64 "): fsck after the crash: exit %d\n%s",
		     round, seed, rc, out);
}

static void unmount_only(void)
{
	cr_assert_eq(chdir("/"), 0);
#ifdef DATA_LOCAL
	env_unmount();
#else
	efs_test_fs_unmount(&env.f);
#endif
}

static void mount_again(void)
{
#ifdef DATA_LOCAL
	env_mount();
#else
	efs_test_fs_mount(&env.f, NULL);
#endif
}

static void one_round(int round, uint64_t seed, bool churn)
{
	static const unsigned ks[] = {1, 4, 16};
	char dir[PATH_MAX + 32], path[PATH_MAX + 64], ack_path[600];
	uint64_t r = seed, acked, delay, zero = 0;
	unsigned k = ks[rnd_next(&r) % 3];
	uint8_t rec[RS], got[RS];
	int fd, st;
	pid_t kid;

	snprintf(dir, sizeof(dir), "%s/round%d", env.root, round);
	cr_assert_eq(mkdir(dir, 0755), 0, "mkdir %s: %s", dir, strerror(errno));
	for (int i = 0; i < NF; i++) {
		snprintf(path, sizeof(path), "%s/rec%d", dir, i);
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
		cr_assert_eq(fsync(fd), 0);
		close(fd);
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY);
	cr_assert_geq(fd, 0);
	cr_assert_eq(fsync(fd), 0, "fsync of a directory: %s", strerror(errno));
	close(fd);
	snprintf(ack_path, sizeof(ack_path), "%s/ack%d", outside_dir(), round);
	fd = open(ack_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, &zero, 8, 0), 8);
	cr_assert_eq(fsync(fd), 0);
	close(fd);

	if (!kill_issued) {
		void *m = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
			       -1, 0);

		cr_assert_neq(m, MAP_FAILED, "mmap: %s", strerror(errno));
		kill_issued = m;
	}
	*kill_issued = 0;
	kid = fork();
	cr_assert_geq(kid, 0);
	if (kid == 0)
		writer(dir, ack_path, k, churn, seed ^ 0x5555);
	delay = rnd_range(&r, 500, 3000);
	nap_ms((unsigned)delay);
	/* A writer that stopped by itself failed. */
	cr_assert_eq(waitpid(kid, &st, WNOHANG), 0,
		     "round %d (ETCFS_TEST_SEED=%" PRIu64 "): the writer stopped before the kill "
		     "(exit %d, stage code)",
		     round, seed, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	*kill_issued = 1;
	__sync_synchronize();
#ifndef DATA_LOCAL
	efs_test_fs_kill(&env.f);
#endif
	kill(kid, SIGKILL);
	cr_assert_eq(waitpid(kid, &st, 0), kid);
	cr_assert(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == WR_OK),
		  "round %d (ETCFS_TEST_SEED=%" PRIu64 "): the writer failed at stage %d", round,
		  seed, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	acked = read_ack(ack_path);
	cr_assert_gt(acked, 0,
		     "round %d (ETCFS_TEST_SEED=%" PRIu64 "): nothing acknowledged in %" PRIu64
		     " ms (fsync every %u records)",
		     round, seed, delay, k);
#ifdef DATA_LOCAL
	env_remount();
#else
	mount_again();
#endif

	/* Every acknowledged record is intact. */
	for (int i = 0; i < NF; i++) {
		uint64_t n = acked / NF + (acked % NF > (uint64_t)i ? 1 : 0);
		struct stat sb;

		snprintf(path, sizeof(path), "%s/rec%d", dir, i);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		cr_assert_geq(fd, 0, "round %d (ETCFS_TEST_SEED=%" PRIu64 "): open %s: %s", round,
			      seed, path, strerror(errno));
		cr_assert_eq(fstat(fd, &sb), 0);
		cr_assert_geq((uint64_t)sb.st_size, n * RS,
			      "round %d (ETCFS_TEST_SEED=%" PRIu64 "): rec%d has %jd bytes, %" PRIu64
			      " records of %d acknowledged",
			      round, seed, i, (intmax_t)sb.st_size, n, RS);
		for (uint64_t slot = 0; slot < n; slot++) {
			uint64_t seq = slot * NF + (uint64_t)i, h;

			make_rec(rec, seq);
			cr_assert_eq(pread_all(fd, got, RS, (off_t)(slot * RS)), RS);
			memcpy(&h, got + RS - 8, 8);
			cr_assert(memcmp(rec, got, RS) == 0,
				  "round %d (ETCFS_TEST_SEED=%" PRIu64 "): acknowledged record %" PRIu64
				  " (rec%d slot %" PRIu64 ") lost or torn (checksum %s; %" PRIu64
				  " acknowledged, killed after %" PRIu64 " ms, fsync every %u)",
				  round, seed, seq, i, slot,
				  h == fnv64(got, RS - 8) ? "fine: stale" : "bad", acked, delay, k);
		}
		close(fd);
	}

#ifndef DATA_LOCAL
	{
		long rc, o;

		cr_assert(wait_no_reclaim(30000, &rc, &o),
			  "round %d (ETCFS_TEST_SEED=%" PRIu64 "): %ld rc/ and %ld o/ keys 30 s after "
			  "the remount",
			  round, seed, rc, o);
	}
#endif
	unmount_only();
	fsck_clean(seed, round);
	mount_again();
}

static int rm_tree(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	/* The root and lost+found stay (fsck wants lost+found). */
	if (ftw->level == 0 || strstr(path, "/lost+found") == path + strlen(env.root))
		return 0;
	return type == FTW_DP ? rmdir(path) : unlink(path);
}

static void crash_rounds(bool churn)
{
	uint64_t seed = test_seed(), free0, bfree, fresh, end;

	env_start(0, NULL);
	sync();
	env_space(&free0, NULL);
	for (int round = 0; round < ROUNDS; round++)
		one_round(round, seed + (uint64_t)round, churn);

	/* No space leaked: delete everything, the free space comes back. */
	cr_assert_eq(nftw(env.root, rm_tree, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT), 0,
		     "removing the tree: %s", strerror(errno));
	end = mono_ms() + 30000;
	for (;;) {
		env_space(&bfree, NULL);
		if (bfree >= free0 || mono_ms() >= end)
			break;
		nap_ms(200);
	}
#ifdef DATA_LOCAL
	/* ext4 finishes its lazy initialisation meanwhile: it may gain blocks. */
	if (bfree > free0)
		free0 = bfree;
#endif
#ifndef DATA_LOCAL
	{
		long rc, o;

		cr_assert(wait_no_reclaim(30000, &rc, &o),
			  "(ETCFS_TEST_SEED=%" PRIu64 ") %ld rc/ and %ld o/ keys 30 s after deleting "
			  "everything",
			  seed, rc, o);
	}
#endif
	/* fsck first: its leaked-block check says more than statfs. */
	unmount_only();
	fsck_clean(seed, ROUNDS);
	/* And what a fresh mount reports. */
	mount_again();
	env_space(&fresh, NULL);
	unmount_only();
	cr_assert(bfree == free0 && fresh == free0,
		  "(ETCFS_TEST_SEED=%" PRIu64 ") free space 30 s after deleting everything: %" PRIu64
		  " (%" PRId64 " blocks of 4 KiB missing), after a remount %" PRIu64 " (%" PRId64
		  " missing); before the rounds %" PRIu64,
		  seed, bfree, ((int64_t)free0 - (int64_t)bfree) / 4096, fresh,
		  ((int64_t)free0 - (int64_t)fresh) / 4096, free0);
	env_stop();
}

Test(crash, append_kill)
{
	crash_rounds(false);
	efs_test_assert_no_leaks();
}

Test(crash, churn_kill)
{
	crash_rounds(true);
	efs_test_assert_no_leaks();
}
