/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcfsctl backup and restore on a real mount: a tree of files with known
 * contents is backed up while mounted, then rewritten and mostly deleted;
 * after an unmount and an emptied keyspace the backup is restored onto the
 * same image, and every file reads as it was at backup time, none of the
 * later ones exists, and fsck.etcfs finds nothing. Restore refuses a
 * keyspace that holds keys, a mounted device, and a backup that is
 * corrupt, truncated, not a backup at all, or well-formed but without its
 * blocks, writing nothing. A backup during which a file it copies is
 * overwritten (its old blocks freed), a file grows or an extent chunk
 * splits succeeds: the allocators hold what is freed while the backup's
 * pin exists, and the check after the copy tells a split from a free. A backup
 * taken while a writer overwrites, truncates and deletes the files it
 * copies and writes new ones restores exactly the backup-time contents,
 * and the space held meanwhile comes back once the backup ended; without
 * the hold (a fault hook) the same backup is refused or inexact. While
 * the backup's pin exists the writer's overwrites of mapped blocks go
 * copy-on-write, and in place again after. A node that does not answer
 * the backup's publication request gets the settle when it is mounted
 * -o cow, and fails the backup, named, when it may overwrite in place.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "harness.h"

#include "../support/mount.h"

static struct efs_test_fs fs;
static bool stopped; /* the daemon is SIGSTOPped: fini continues it */

static void fini(void)
{
	if (stopped && fs.daemon > 0)
		kill(fs.daemon, SIGCONT);
	stopped = false;
	efs_test_fs_stop(&fs);
}

TestSuite(backup, .fini = fini, .timeout = 120);

/* The tree: paths under the mount, sizes, and a seed for their bytes. */
struct file {
	const char *path;
	size_t size;
	unsigned seed;
};

static const char *const dirs[] = {"a", "a/b", "a/b/c", "d", "empty"};
static const struct file files[] = {
	{"zero", 0, 1},	       {"one", 1, 2},		  {"a/small", 4095, 3},
	{"a/block", 4096, 4},  {"a/b/mid", 100000, 5},	  {"a/b/c/big", 1 << 20, 6},
	{"d/odd", 12345, 7},   {"d/two-mib", 2 << 20, 8}, {"d/x", 77, 9},
	{"a/b/c/deep", 5000, 10},
};
#define NFILES (sizeof(files) / sizeof(files[0]))

static unsigned char byte_of(unsigned seed, size_t i)
{
	return (unsigned char)((i * 131 + seed * 17 + (i >> 12) * 7 + (i >> 9)) & 0xff);
}

static void path_in(const char *rel, char *buf, size_t size)
{
	snprintf(buf, size, "%s/%s", fs.mnt, rel);
}

static void write_file(const char *rel, size_t size, unsigned seed)
{
	char p[600];
	unsigned char *buf = malloc(size ? size : 1);
	int fd;

	cr_assert(buf);
	for (size_t i = 0; i < size; i++)
		buf[i] = byte_of(seed, i);
	path_in(rel, p, sizeof(p));
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	cr_assert(fd >= 0, "open %s: %s", p, strerror(errno));
	cr_assert_eq(write(fd, buf, size), (ssize_t)size, "write %s", p);
	cr_assert_eq(fsync(fd), 0, "fsync %s", p);
	close(fd);
	free(buf);
}

/* Whether |rel| has exactly the contents |size|, |seed| describe. */
static void check_file(const char *rel, size_t size, unsigned seed)
{
	char p[600];
	unsigned char *buf = malloc(size + 1);
	ssize_t n;
	int fd;

	cr_assert(buf);
	path_in(rel, p, sizeof(p));
	fd = open(p, O_RDONLY);
	cr_assert(fd >= 0, "open %s after restore: %s", p, strerror(errno));
	n = read(fd, buf, size + 1);
	if (n >= 0 && (size_t)n < size) {
		/* Reads may come back short; collect the rest. */
		ssize_t k;

		while ((size_t)n < size && (k = read(fd, buf + n, size + 1 - (size_t)n)) > 0)
			n += k;
	}
	close(fd);
	cr_assert_eq(n, (ssize_t)size, "%s: %zd bytes, expected %zu", rel, n, size);
	for (size_t i = 0; i < size; i++)
		cr_assert_eq(buf[i], byte_of(seed, i), "%s: byte %zu differs", rel, i);
	free(buf);
}

static void make_tree(void)
{
	char p[600];

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		path_in(dirs[i], p, sizeof(p));
		cr_assert_eq(mkdir(p, 0755), 0, "mkdir %s: %s", p, strerror(errno));
	}
	for (size_t i = 0; i < NFILES; i++)
		write_file(files[i].path, files[i].size, files[i].seed);
	path_in("a/link", p, sizeof(p));
	cr_assert_eq(symlink("b/mid", p), 0);
}

static int ctl(char *out, size_t size, const char *const *args)
{
	return efs_test_fs_runv(&fs, out, size, "etcfsctl", args);
}

static void clear_keyspace(void)
{
	char *out = NULL;
	int r = efs_harness_etcdctl(fs.etcd, &out, "del", "--prefix", "/etcfs/testfs/", NULL);

	cr_assert_eq(r, 0, "etcdctl del: %s", out ? out : "");
	free(out);
}

static void backup_to(const char *file)
{
	char out[8192];
	const char *args[] = {"backup", "--settle", "0", fs.image, file, NULL};
	int r = ctl(out, sizeof(out), args);

	cr_assert_eq(r, 0, "backup: %d: %s", r, out);
	cr_assert(strstr(out, "backup of testfs at revision"), "no summary: %s", out);
}

static void start_fs(void)
{
	struct efs_test_fs_opts o = {.image_size = 64 << 20};

	efs_test_fs_start(&fs, &o);
}

/* Mount options of a node that overwrites in place. */
static const char *const nocow_args[] = {"-o", "nocow", NULL};

Test(backup, restore_brings_back_the_tree_at_backup_time)
{
	char bk[400], out[8192], p[600], lk[64];
	struct stat st;
	ssize_t n;
	int r;

	int held;

	start_fs();
	make_tree();
	/* A file unlinked while open: an orphan at backup time, which the
	 * restore closes (its opener is not restored). */
	write_file("open-unlinked", 200000, 11);
	path_in("open-unlinked", p, sizeof(p));
	held = open(p, O_RDONLY);
	cr_assert(held >= 0);
	cr_assert_eq(unlink(p), 0);
	snprintf(bk, sizeof(bk), "%s/tree.etcfs-backup", fs.dir);
	backup_to(bk);
	close(held);
	cr_assert_eq(stat(bk, &st), 0);
	cr_assert_gt(st.st_size, (3 << 20) + 100000, "backup of %lld bytes lacks the blocks",
		     (long long)st.st_size);

	/* Move on: rewrite, delete, add. */
	write_file("a/b/c/big", 300000, 99);
	write_file("d/odd", 4096 * 3, 98);
	write_file("new-file", 50000, 97);
	for (const char *const *d = (const char *const[]){"d/two-mib", "a/small", "zero", NULL}; *d;
	     d++) {
		path_in(*d, p, sizeof(p));
		cr_assert_eq(unlink(p), 0, "unlink %s", p);
	}
	path_in("a/b/c/deep", p, sizeof(p));
	cr_assert_eq(unlink(p), 0);
	path_in("empty", p, sizeof(p));
	cr_assert_eq(rmdir(p), 0);

	/* While mounted, and while the keyspace holds the filesystem: refused. */
	{
		const char *args[] = {"restore", bk, fs.image, NULL};

		r = ctl(out, sizeof(out), args);
		cr_assert_eq(r, 1, "restore onto a mounted device: %d: %s", r, out);
		cr_assert(strstr(out, "mounted"), "%s", out);
	}
	efs_test_fs_unmount(&fs);
	{
		const char *args[] = {"restore", bk, fs.image, NULL};

		r = ctl(out, sizeof(out), args);
		cr_assert_eq(r, 1, "restore into a non-empty keyspace: %d: %s", r, out);
		cr_assert(strstr(out, "not empty"), "%s", out);
	}
	clear_keyspace();
	{
		const char *args[] = {"restore", bk, fs.image, NULL};

		r = ctl(out, sizeof(out), args);
		cr_assert_eq(r, 0, "restore: %d: %s", r, out);
		cr_assert(strstr(out, "restored testfs"), "no summary: %s", out);
		cr_assert(strstr(out, "1 unlinked open files closed"), "%s", out);
	}
	r = efs_test_fs_run(&fs, out, sizeof(out), "fsck.etcfs", fs.image, NULL);
	cr_assert_eq(r, 0, "fsck after restore: %d: %s", r, out);

	efs_test_fs_mount(&fs, NULL);
	for (size_t i = 0; i < NFILES; i++)
		check_file(files[i].path, files[i].size, files[i].seed);
	path_in("new-file", p, sizeof(p));
	cr_assert_eq(stat(p, &st), -1, "new-file exists after the restore");
	path_in("a/link", p, sizeof(p));
	n = readlink(p, lk, sizeof(lk) - 1);
	cr_assert_eq(n, 5);
	lk[n] = '\0';
	cr_assert_str_eq(lk, "b/mid");
	path_in("empty", p, sizeof(p));
	cr_assert_eq(stat(p, &st), 0);
	cr_assert(S_ISDIR(st.st_mode));
	/* The restored filesystem takes writes. */
	write_file("after-restore", 40000, 55);
	check_file("after-restore", 40000, 55);
	efs_test_fs_unmount(&fs);
	r = efs_test_fs_run(&fs, out, sizeof(out), "fsck.etcfs", fs.image, NULL);
	cr_assert_eq(r, 0, "fsck after writes on the restored filesystem: %d: %s", r, out);
}

/* Copies |src| to |dst|, flipping byte |flip| (-1: none) and keeping the
 * first |keep| bytes (0: all). */
static void copy_damaged(const char *src, const char *dst, long flip, long keep)
{
	FILE *in = fopen(src, "rb"), *o = fopen(dst, "wb");
	long i = 0;
	int c;

	cr_assert(in && o);
	while ((c = fgetc(in)) != EOF && (!keep || i < keep)) {
		if (i == flip)
			c ^= 0x10;
		fputc(c, o);
		i++;
	}
	fclose(in);
	fclose(o);
}

static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t n)
{
	crc = ~crc;
	while (n--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = crc & 1 ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
	}
	return ~crc;
}

static uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void wr64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/*
 * Rewrites backup |src| into |dst| without its DATA records, with a
 * trailer and checksums that match what is left: a well-formed
 * metadata-only copy, which restore must refuse all the same.
 */
static void strip_blocks(const char *src, const char *dst)
{
	FILE *in = fopen(src, "rb"), *o = fopen(dst, "wb");
	unsigned char *buf, *w;
	size_t len, pos = 160, metas = 0;
	long sz;

	cr_assert(in && o);
	fseek(in, 0, SEEK_END);
	sz = ftell(in);
	rewind(in);
	buf = malloc((size_t)sz);
	w = malloc((size_t)sz);
	cr_assert(buf && w);
	cr_assert_eq(fread(buf, 1, (size_t)sz, in), (size_t)sz);
	memcpy(w, buf, 160);
	len = 160;
	while (pos < (size_t)sz) {
		unsigned type = buf[pos];
		size_t rec = 8 + rd32(buf + pos + 4) + 4;

		if (type == 1 || type == 2) {
			memcpy(w + len, buf + pos, rec);
			len += rec;
			metas += type == 2;
		} else if (type == 0x7f) {
			unsigned char t[8 + 40 + 4] = {0x7f};
			uint32_t stream = crc32c(0, w, len);

			wr32(t + 4, 40);
			wr64(t + 8, metas);
			wr64(t + 32, len);
			wr32(t + 40, stream);
			wr32(t + 48, crc32c(0, t, 48));
			memcpy(w + len, t, sizeof(t));
			len += sizeof(t);
		}
		pos += rec;
	}
	cr_assert_eq(fwrite(w, 1, len, o), len);
	fclose(in);
	fclose(o);
	free(buf);
	free(w);
}

static void refused(const char *file, const char *why)
{
	char out[8192], *keys = NULL;
	const char *args[] = {"restore", file, fs.image, NULL};
	int r = ctl(out, sizeof(out), args);

	cr_assert_eq(r, 1, "restore of %s: %d: %s", file, r, out);
	cr_assert(strstr(out, why), "restore of %s: expected '%s' in: %s", file, why, out);
	cr_assert(strstr(out, "nothing was written"), "%s", out);
	r = efs_harness_etcdctl(fs.etcd, &keys, "get", "--prefix", "--keys-only",
				"/etcfs/testfs/", NULL);
	cr_assert_eq(r, 0);
	cr_assert(!keys || !strstr(keys, "/etcfs/testfs/"), "keys written: %s", keys);
	free(keys);
}

Test(backup, restore_refuses_a_damaged_backup_and_writes_nothing)
{
	char bk[400], bad[400];
	struct stat st;

	start_fs();
	make_tree();
	snprintf(bk, sizeof(bk), "%s/tree.etcfs-backup", fs.dir);
	backup_to(bk);
	efs_test_fs_unmount(&fs);
	clear_keyspace();
	cr_assert_eq(stat(bk, &st), 0);

	snprintf(bad, sizeof(bad), "%s/flipped", fs.dir);
	copy_damaged(bk, bad, (long)st.st_size / 2, 0); /* inside a DATA record */
	refused(bad, "checksum mismatch");
	snprintf(bad, sizeof(bad), "%s/flipped-meta", fs.dir);
	copy_damaged(bk, bad, 160 + 4096 + 40, 0); /* the first META record */
	refused(bad, "checksum mismatch");
	snprintf(bad, sizeof(bad), "%s/truncated", fs.dir);
	copy_damaged(bk, bad, -1, (long)st.st_size - 100);
	refused(bad, "truncated");
	snprintf(bad, sizeof(bad), "%s/header", fs.dir);
	copy_damaged(bk, bad, 100, 0);
	refused(bad, "header checksum");
	snprintf(bad, sizeof(bad), "%s/not-a-backup", fs.dir);
	copy_damaged(fs.image, bad, -1, 100000);
	refused(bad, "not an etcfs backup");
	snprintf(bad, sizeof(bad), "%s/metadata-only", fs.dir);
	strip_blocks(bk, bad);
	refused(bad, "lacks device blocks");

	/* A device holding another filesystem whose keyspace is here. */
	{
		char img2[400], out[8192];
		const char *args[] = {"restore", bk, img2, NULL};
		const char *fargs[] = {"restore", "--force", bk, img2, NULL};
		int fd, r;

		snprintf(img2, sizeof(img2), "%s/other.img", fs.dir);
		fd = open(img2, O_CREAT | O_WRONLY, 0644);
		cr_assert(fd >= 0 && ftruncate(fd, 64 << 20) == 0);
		close(fd);
		r = efs_test_fs_run(&fs, out, sizeof(out), "mkfs.etcfs", "--name", "other", img2,
				    NULL);
		cr_assert_eq(r, 0, "mkfs other: %s", out);
		r = ctl(out, sizeof(out), args);
		cr_assert_eq(r, 1, "restore over another filesystem: %d: %s", r, out);
		cr_assert(strstr(out, "another UUID"), "%s", out);
		r = ctl(out, sizeof(out), fargs);
		cr_assert_eq(r, 0, "restore --force: %d: %s", r, out);
	}
}

/* Runs a backup to |file| in a child with the fault hook's pause between
 * metadata and blocks; |during| runs meanwhile. The backup's exit status. */
static int backup_around(const char *file, const char *retries, void (*during)(void))
{
	struct timespec ts = {0, 400 * 1000000L};
	pid_t pid;
	int st;

	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		char out[8192];
		const char *args[] = {"backup", "--settle", "0", "--retries", retries,
				      fs.image, file, NULL};
		int r;

		setenv("ETCFS_FAULT_BACKUP_PAUSE_MS", "1500", 1);
		r = ctl(out, sizeof(out), args);
		fprintf(stderr, "%s", out);
		_exit(r < 0 ? 99 : r);
	}
	nanosleep(&ts, NULL);
	during();
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static void overwrite_hot(void)
{
	write_file("a/b/mid", 100000, 42);
}

static void grow_new(void)
{
	write_file("grown", 300000, 43);
}

/* Writes one block at every other file block from |from| to |to|
 * (exclusive), each fsynced: one extent each. */
static void sparse_blocks(const char *rel, unsigned from, unsigned to)
{
	unsigned char blk[4096];
	char p[600];
	int fd;

	path_in(rel, p, sizeof(p));
	fd = open(p, O_WRONLY | O_CREAT, 0644);
	cr_assert(fd >= 0, "open %s: %s", p, strerror(errno));
	for (unsigned b = from; b < to; b += 2) {
		memset(blk, (int)(b & 0xff), sizeof(blk));
		cr_assert_eq(pwrite(fd, blk, sizeof(blk), (off_t)b * 4096), (ssize_t)sizeof(blk));
		cr_assert_eq(fsync(fd), 0);
	}
	close(fd);
}

/* The chunk of "sparse" passes 64 extents and splits: half its extents
 * move to a new chunk key, none is freed. */
static void split_chunk(void)
{
	sparse_blocks("sparse", 120, 140);
}

Test(backup, a_backup_overlapping_an_overwrite_a_new_file_or_a_chunk_split_succeeds)
{
	char bk[400];
	struct stat st;

	start_fs();
	make_tree();
	snprintf(bk, sizeof(bk), "%s/overwritten.etcfs-backup", fs.dir);
	cr_assert_eq(backup_around(bk, "0", overwrite_hot), 0, "backup overlapping an overwrite");
	cr_assert_eq(stat(bk, &st), 0);
	snprintf(bk, sizeof(bk), "%s/grown.etcfs-backup", fs.dir);
	cr_assert_eq(backup_around(bk, "0", grow_new), 0, "backup overlapping a new file");
	cr_assert_eq(stat(bk, &st), 0);
	/* 60 one-block extents, then 10 more during the copy. */
	sparse_blocks("sparse", 0, 120);
	snprintf(bk, sizeof(bk), "%s/split.etcfs-backup", fs.dir);
	cr_assert_eq(backup_around(bk, "0", split_chunk), 0, "backup overlapping a chunk split");
	cr_assert_eq(stat(bk, &st), 0);
}

/* ---- Publishing first: the sync/ request ---- */

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A write the node buffers (a minute's flush interval, no fsync, the file
 * still open) is in a backup taken at once, without a settle: the backup
 * asked the node to publish and the node answered. */
Test(backup, a_backup_has_what_a_node_buffered_without_a_settle)
{
	static const char *const slow[] = {"--flush-interval", "60000", NULL};
	struct efs_test_fs_opts o = {.image_size = 64 << 20, .mount_args = slow};
	static unsigned char buf[100000];
	char bk[400], out[8192], p[600];
	const char *args[] = {"backup", "--settle", "0", fs.image, bk, NULL};
	int fd, r;

	efs_test_fs_start(&fs, &o);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = byte_of(21, i);
	path_in("buffered", p, sizeof(p));
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	cr_assert(fd >= 0, "open %s: %s", p, strerror(errno));
	cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	snprintf(bk, sizeof(bk), "%s/buffered.etcfs-backup", fs.dir);
	r = ctl(out, sizeof(out), args);
	close(fd);
	cr_assert_eq(r, 0, "backup: %d: %s", r, out);
	cr_assert_not(strstr(out, "did not answer"), "%s", out);
	cr_assert_not(strstr(out, "--settle"), "%s", out);

	efs_test_fs_unmount(&fs);
	clear_keyspace();
	{
		const char *rargs[] = {"restore", bk, fs.image, NULL};

		r = ctl(out, sizeof(out), rargs);
		cr_assert_eq(r, 0, "restore: %d: %s", r, out);
	}
	efs_test_fs_mount(&fs, NULL);
	check_file("buffered", sizeof(buf), 21);
	efs_test_fs_unmount(&fs);
	/* The request and the answer are gone; fsck knows the family. */
	r = efs_test_fs_run(&fs, out, sizeof(out), "fsck.etcfs", fs.image, NULL);
	cr_assert_eq(r, 0, "fsck: %d: %s", r, out);
}

/* A node mounted -o cow that never answers (stopped) costs the backup the
 * sync timeout and the settle, said on stderr, and the backup completes:
 * it cannot rewrite a block in place under the copy. */
Test(backup, a_cow_node_that_does_not_answer_gets_the_settle)
{
	static const char *const cow[] = {"-o", "cow", NULL};
	struct efs_test_fs_opts o = {.image_size = 64 << 20, .mount_args = cow};
	char bk[400], out[8192];
	const char *args[] = {"backup", "--sync-timeout", "1", "--settle", "0.5",
			      fs.image, bk, NULL};
	char *keys = NULL;
	double t0, took;
	int r;

	efs_test_fs_start(&fs, &o);
	make_tree();
	snprintf(bk, sizeof(bk), "%s/stopped.etcfs-backup", fs.dir);
	args[5] = fs.image;
	cr_assert_eq(kill(fs.daemon, SIGSTOP), 0);
	stopped = true;
	t0 = mono_s();
	r = ctl(out, sizeof(out), args);
	took = mono_s() - t0;
	cr_assert_eq(kill(fs.daemon, SIGCONT), 0);
	stopped = false;
	cr_assert_eq(r, 0, "backup: %d: %s", r, out);
	cr_assert(strstr(out, "node node1 did not answer the request to publish within 1.0 s"),
		  "%s", out);
	cr_assert(strstr(out, "waiting --settle 0.5 s for them instead"), "%s", out);
	cr_assert(took >= 1.5 && took < 20, "the backup took %.1f s", took);
	/* Running again, the node answers etcfsctl sync. */
	{
		const char *sargs[] = {"sync", fs.image, NULL};

		r = ctl(out, sizeof(out), sargs);
		cr_assert_eq(r, 0, "etcfsctl sync: %d: %s", r, out);
	}
	/* The request went with the backup. */
	r = efs_harness_etcdctl(fs.etcd, &keys, "get", "--prefix", "--keys-only",
				"/etcfs/testfs/sync/", NULL);
	cr_assert_eq(r, 0);
	cr_assert(!keys || !strstr(keys, "sync/"), "left behind: %s", keys);
	free(keys);
	efs_test_fs_unmount(&fs);
}

/* A stopped node that may overwrite in place (no -o cow) fails the
 * backup, named, rather than get the settle: nothing after the copy could
 * tell a block it rewrote meanwhile. Nothing is left behind: no backup
 * file, no pin, no request. */
Test(backup, a_node_that_overwrites_in_place_and_does_not_answer_fails_the_backup)
{
	char bk[400], out[8192];
	const char *args[] = {"backup", "--sync-timeout", "1", "--settle", "0.5",
			      fs.image, bk, NULL};
	char *keys = NULL;
	struct stat st;
	int r;

	{
		struct efs_test_fs_opts o = {.image_size = 64 << 20, .mount_args = nocow_args};

		efs_test_fs_start(&fs, &o);
	}
	make_tree();
	snprintf(bk, sizeof(bk), "%s/stopped.etcfs-backup", fs.dir);
	args[5] = fs.image;
	cr_assert_eq(kill(fs.daemon, SIGSTOP), 0);
	stopped = true;
	r = ctl(out, sizeof(out), args);
	cr_assert_eq(kill(fs.daemon, SIGCONT), 0);
	stopped = false;
	cr_assert_eq(r, 4, "backup: %d: %s", r, out);
	cr_assert(strstr(out, "node node1 may overwrite blocks in place"), "%s", out);
	cr_assert(strstr(out, "backup of testfs failed: 1 mounted node may overwrite in place"),
		  "%s", out);
	cr_assert_not(strstr(out, "--settle"), "%s", out);
	cr_assert_eq(stat(bk, &st), -1, "a backup file was left at %s", bk);
	r = efs_harness_etcdctl(fs.etcd, &keys, "get", "--prefix", "--keys-only",
				"/etcfs/testfs/", NULL);
	cr_assert_eq(r, 0);
	cr_assert(!keys || (!strstr(keys, "/sync/") && !strstr(keys, "pin/backup.")),
		  "left behind: %s", keys);
	free(keys);
	efs_test_fs_unmount(&fs);
}

/* ---- A backup under a writer that frees what it copies ---- */

#define NPOOL	  24
#define POOL_SIZE (96 * 1024)
#define CHURN_MS  2500

/* write_file for a child: no assertions, 0 or an errno. */
static int put_file(const char *path, size_t size, unsigned seed, int flags)
{
	unsigned char *buf = malloc(size ? size : 1);
	int fd, e = 0;

	if (!buf)
		return ENOMEM;
	for (size_t i = 0; i < size; i++)
		buf[i] = byte_of(seed, i);
	fd = open(path, O_WRONLY | O_CREAT | flags, 0644);
	if (fd < 0)
		e = errno;
	else if (write(fd, buf, size) != (ssize_t)size || fsync(fd) < 0)
		e = errno ? errno : EIO;
	if (fd >= 0)
		close(fd);
	free(buf);
	return e;
}

/*
 * The writer: until |stop| exists, over the pool files the backup copies,
 * in turn an overwrite (O_TRUNC), a truncate to one block, a delete, a new
 * file, and an in-place rewrite of the first two blocks (copy-on-write),
 * each fsynced. Exits 0, or 1 after printing what failed.
 */
static void churn(const char *stop)
{
	char p[600];
	int e = 0;

	for (unsigned i = 0; access(stop, F_OK) != 0; i++) {
		struct timespec ts = {0, 5 * 1000000L};
		unsigned k = (i * 7) % NPOOL;
		int fd;

		snprintf(p, sizeof(p), "%s/churn/p%02u", fs.mnt, k);
		switch (i % 5) {
		case 0:
			e = put_file(p, POOL_SIZE, 500 + i, O_TRUNC);
			break;
		case 1:
			e = truncate(p, 4096) < 0 && errno != ENOENT ? errno : 0;
			break;
		case 2:
			e = unlink(p) < 0 && errno != ENOENT ? errno : 0;
			break;
		case 3:
			snprintf(p, sizeof(p), "%s/churn/n%u", fs.mnt, i);
			e = put_file(p, 128 * 1024, 900 + i, O_TRUNC);
			break;
		default:
			fd = open(p, O_WRONLY);
			if (fd >= 0) {
				e = put_file(p, 8192, 700 + i, 0);
				close(fd);
			}
			break;
		}
		if (e) {
			fprintf(stderr, "churn: %s (step %u): %s\n", p, i, strerror(e));
			_exit(1);
		}
		nanosleep(&ts, NULL);
	}
	_exit(0);
}

static bool pin_exists(void)
{
	char *out = NULL;
	bool yes;
	int r = efs_harness_etcdctl(fs.etcd, &out, "get", "--prefix", "--keys-only",
				    "/etcfs/testfs/pin/backup.", NULL);

	yes = r == 0 && out && strstr(out, "pin/backup.");
	free(out);
	return yes;
}

/* The backup's pin was put again: its revision (the first put, before
 * the nodes were asked to publish, only stops in-place overwrites). */
static bool pin_revision_taken(void)
{
	char *out = NULL;
	bool yes;
	int r = efs_harness_etcdctl(fs.etcd, &out, "get", "--prefix", "-w", "json",
				    "/etcfs/testfs/pin/backup.", NULL);

	yes = r == 0 && out && strstr(out, "\"version\":2");
	free(out);
	return yes;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* Free bytes as statfs says. */
static uint64_t bfree(void)
{
	struct statvfs v;

	cr_assert_eq(statvfs(fs.mnt, &v), 0, "statvfs: %s", strerror(errno));
	return (uint64_t)v.f_bfree * v.f_frsize;
}

/* What a churned backup came to: its exit status and output, and the held
 * space seen while it ran (after the writer stopped) and after. */
struct churned {
	int status;
	char out[8192];
	double held;
	double inplace_during; /* in-place overwrites while the writer ran */
	uint64_t free_during, free_after;
};

/*
 * Makes the tree and the pool, starts a backup that pauses 6 s between
 * the metadata and the blocks, and runs the writer from when the backup's
 * revision is taken (so everything before it was written before)
 * for CHURN_MS. Then waits for the backup and, when |hold|, for the held
 * space to come back.
 */
static void churned_backup(const char *bk, bool hold, struct churned *c)
{
	char stop[400], outf[400], p[600];
	pid_t bpid, wpid;
	int st, i;
	FILE *f;
	size_t n;

	make_tree();
	path_in("churn", p, sizeof(p));
	cr_assert_eq(mkdir(p, 0755), 0);
	for (i = 0; i < NPOOL; i++) {
		snprintf(p, sizeof(p), "churn/p%02d", i);
		write_file(p, POOL_SIZE, 100 + (unsigned)i);
	}
	snprintf(stop, sizeof(stop), "%s/churn.stop", fs.dir);
	snprintf(outf, sizeof(outf), "%s/backup.out", fs.dir);
	bpid = fork();
	cr_assert(bpid >= 0);
	if (bpid == 0) {
		char out[8192];
		const char *args[] = {"backup", "--settle", "0", "--retries", "0",
				      fs.image, bk, NULL};
		int r;

		setenv("ETCFS_FAULT_BACKUP_PAUSE_MS", "6000", 1);
		r = ctl(out, sizeof(out), args);
		f = fopen(outf, "w");
		if (f) {
			fputs(out, f);
			fclose(f);
		}
		_exit(r < 0 ? 99 : r);
	}
	for (i = 0; i < 500 && !pin_revision_taken(); i++)
		sleep_ms(20);
	if (i == 500) {
		kill(bpid, SIGKILL);
		waitpid(bpid, &st, 0);
		cr_assert_fail("the backup took no revision within 10 s");
	}
	c->inplace_during = efs_test_fs_metric(&fs, "etcfs_data_inplace_writes_total");
	wpid = fork();
	cr_assert(wpid >= 0);
	if (wpid == 0)
		churn(stop);
	sleep_ms(CHURN_MS);
	f = fopen(stop, "w");
	cr_assert(f);
	fclose(f);
	cr_assert_eq(waitpid(wpid, &st, 0), wpid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer failed");
	cr_assert(pin_exists(), "the backup ended before the writer did: make its pause longer");
	c->inplace_during = efs_test_fs_metric(&fs, "etcfs_data_inplace_writes_total") -
			    c->inplace_during;
	sleep_ms(300);
	c->held = efs_test_fs_metric(&fs, "etcfs_space_held_bytes");
	c->free_during = bfree();
	cr_assert_eq(waitpid(bpid, &st, 0), bpid);
	cr_assert(WIFEXITED(st));
	c->status = WEXITSTATUS(st);
	f = fopen(outf, "r");
	cr_assert(f);
	n = fread(c->out, 1, sizeof(c->out) - 1, f);
	c->out[n] = '\0';
	fclose(f);
	c->free_after = c->free_during;
	if (!hold)
		return;
	/* The backup's pin is gone: the sweep (every 5 s) or the next map
	 * transaction releases what was held. */
	for (i = 0; i < 150 && efs_test_fs_metric(&fs, "etcfs_space_held_bytes") != 0; i++)
		sleep_ms(100);
	for (i = 0; i < 30; i++) {
		c->free_after = bfree();
		if (c->free_after > c->free_during)
			break;
		sleep_ms(100); /* statfs is cached for a second */
	}
}

/* Rewrites the first block of |rel| (mapped: in place when allowed). */
static void write_in_place(const char *rel, unsigned char v)
{
	unsigned char buf[4096];
	char p[600];
	int fd;

	memset(buf, v, sizeof(buf));
	path_in(rel, p, sizeof(p));
	fd = open(p, O_WRONLY);
	cr_assert(fd >= 0, "open %s: %s", p, strerror(errno));
	cr_assert_eq(pwrite(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	cr_assert_eq(fsync(fd), 0);
	close(fd);
}

/* Restores |bk| onto the image (unmounted, keyspace emptied), checks fsck
 * and mounts it. */
static void restore_from(const char *bk)
{
	const char *args[] = {"restore", bk, fs.image, NULL};
	char out[8192];
	int r;

	efs_test_fs_unmount(&fs);
	clear_keyspace();
	r = ctl(out, sizeof(out), args);
	cr_assert_eq(r, 0, "restore: %d: %s", r, out);
	r = efs_test_fs_run(&fs, out, sizeof(out), "fsck.etcfs", fs.image, NULL);
	cr_assert_eq(r, 0, "fsck after restore: %d: %s", r, out);
	efs_test_fs_mount(&fs, NULL);
}

Test(backup, a_backup_under_a_writer_freeing_its_blocks_restores_backup_time_contents,
     .timeout = 240)
{
	struct efs_test_fs_opts o = {.image_size = 128 << 20, .metrics = true,
				     .mount_args = nocow_args};
	struct churned c;
	char bk[400], p[600];
	struct stat st;

	efs_test_fs_start(&fs, &o);
	snprintf(bk, sizeof(bk), "%s/churned.etcfs-backup", fs.dir);
	churned_backup(bk, true, &c);
	cr_assert_eq(c.status, 0, "backup under the writer: %d: %s", c.status, c.out);
	cr_assert(strstr(c.out, "extent chunks dropped blocks during the copy"),
		  "the writer freed no copied block while the backup ran: %s", c.out);
	cr_log_info("held while the backup ran: %.0f bytes; statfs free %llu bytes then, %llu "
		    "after",
		    c.held, (unsigned long long)c.free_during, (unsigned long long)c.free_after);
	/* What was freed meanwhile was held, out of statfs, and came back. */
	cr_assert_gt(c.held, 0, "nothing was held while the backup ran");
	/* The writer's rewrites of mapped blocks went copy-on-write while
	 * the pin existed, and go in place again once it is gone. */
	cr_assert_eq(c.inplace_during, 0, "%.0f overwrites went in place under the backup",
		     c.inplace_during);
	{
		double n0 = efs_test_fs_metric(&fs, "etcfs_data_inplace_writes_total");
		int i;

		for (i = 0; i < 50; i++) {
			write_in_place("a/b/mid", 77);
			if (efs_test_fs_metric(&fs, "etcfs_data_inplace_writes_total") > n0)
				break;
			sleep_ms(100);
		}
		cr_assert_lt(i, 50, "no overwrite went in place 5 s after the backup ended");
	}
	cr_assert_eq(efs_test_fs_metric(&fs, "etcfs_space_held_bytes"), 0,
		     "blocks still held after the backup ended");
	cr_assert_geq((double)c.free_after - (double)c.free_during, c.held,
		      "statfs free bytes %llu during, %llu after; %.0f bytes were held",
		      (unsigned long long)c.free_during, (unsigned long long)c.free_after,
		      c.held);

	restore_from(bk);
	for (size_t i = 0; i < NFILES; i++)
		check_file(files[i].path, files[i].size, files[i].seed);
	for (int i = 0; i < NPOOL; i++) {
		snprintf(p, sizeof(p), "churn/p%02d", i);
		check_file(p, POOL_SIZE, 100 + (unsigned)i);
	}
	path_in("churn/n3", p, sizeof(p));
	cr_assert_eq(stat(p, &st), -1, "a file the writer made after the backup's revision");
}

/* The negative control: a node that does not hold (fault hook) reuses
 * blocks the backup still had to copy, and the check after the copy
 * refuses the backup. */
Test(backup, without_the_hold_the_check_after_the_copy_refuses_the_backup, .timeout = 240)
{
	struct efs_test_fs_opts o = {.image_size = 128 << 20, .metrics = true};
	struct churned c;
	char bk[400];
	struct stat st;

	setenv("ETCFS_FAULT_NO_BACKUP_HOLD", "1", 1);
	efs_test_fs_start(&fs, &o);
	unsetenv("ETCFS_FAULT_NO_BACKUP_HOLD");
	snprintf(bk, sizeof(bk), "%s/churned.etcfs-backup", fs.dir);
	churned_backup(bk, false, &c);
	cr_assert_eq(c.held, 0, "the fault hook did not turn the hold off");
	cr_assert_eq(c.status, 4, "backup without the hold: %d: %s", c.status, c.out);
	cr_assert(strstr(c.out, "in use again"), "%s", c.out);
	cr_assert_eq(stat(bk, &st), -1, "an inexact backup was left at %s", bk);
}
