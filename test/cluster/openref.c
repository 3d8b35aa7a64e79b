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
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#define FILE_BLOCKS 64		/* of 64 KiB: 4 MiB */
#define BLK	    65536
#define BACK_MS	    15000	/* a close (or a drop) to free space seen */

/* Drop batches of references cached by earlier checks that may go out
 * while a check counts its own commits (the kernel forgets inodes under
 * the pressure of a create loop). */
#define OREF_DROP_SLACK 4

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

/* ---- Open references as etcd holds them (etcdctl) ---- */

static int b64val(char ch)
{
	if (ch >= 'A' && ch <= 'Z')
		return ch - 'A';
	if (ch >= 'a' && ch <= 'z')
		return ch - 'a' + 26;
	if (ch >= '0' && ch <= '9')
		return ch - '0' + 52;
	if (ch == '+')
		return 62;
	if (ch == '/')
		return 63;
	return -1;
}

/* Decodes base64 |in| (up to '"') into |out|; its length. */
static size_t b64dec(const char *in, unsigned char *out, size_t max)
{
	size_t n = 0;
	unsigned acc = 0;
	int bits = 0, v;

	for (; *in && *in != '"'; in++) {
		if ((v = b64val(*in)) < 0)
			continue;
		acc = (acc << 6) | (unsigned)v;
		bits += 6;
		if (bits >= 8 && n < max) {
			bits -= 8;
			out[n++] = (unsigned char)(acc >> bits);
		}
	}
	return n;
}

/* How many r/<ino><node> keys etcd holds for |ino| and node |i| (whose
 * id is c->node[i].id): the key ends in the tag, the inode big-endian
 * and the node id. */
static int count_refs_of(struct efs_cl *c, int i, uint64_t ino, bool any_ino);

static int count_refs(struct efs_cl *c, int i, uint64_t ino)
{
	return count_refs_of(c, i, ino, false);
}

/* ... of any inode when |any_ino|. */
static int count_refs_of(struct efs_cl *c, int i, uint64_t ino, bool any_ino)
{
	unsigned char pat[64], key[512];
	size_t plen = 0, idlen = strlen(c->node[i].id);
	char cmd[1024], *line = NULL;
	size_t cap = 0;
	int n = 0;
	FILE *f;

	pat[plen++] = 'r';
	pat[plen++] = '/';
	for (int b = 7; b >= 0; b--)
		pat[plen++] = (unsigned char)(ino >> (8 * b));
	memcpy(pat + plen, c->node[i].id, idlen);
	plen += idlen;
	snprintf(cmd, sizeof(cmd),
		 "ETCDCTL_API=3 etcdctl --endpoints=%s get '' --from-key --keys-only -w json "
		 "2>/dev/null | tr ',' '\\n'",
		 c->endpoints);
	f = popen(cmd, "r");
	CL_CHECK(f, "etcdctl: %s", strerror(errno));
	while (getline(&line, &cap, f) > 0) {
		char *k = strstr(line, "\"key\":\"");
		size_t kl;

		if (!k)
			continue;
		kl = b64dec(k + 7, key, sizeof(key));
		if (kl >= plen && !memcmp(key + kl - plen, pat, 2) &&
		    !memcmp(key + kl - idlen, c->node[i].id, idlen) &&
		    (any_ino || !memcmp(key + kl - plen, pat, plen)))
			n++;
	}
	free(line);
	CL_CHECK(pclose(f) == 0, "etcdctl get failed");
	return n;
}

static double openref_txns(struct efs_cl *c, int i)
{
	static const char *const oc[] = {"ok", "conflict", "error", "unknown"};
	double sum = 0;

	for (size_t k = 0; k < sizeof(oc) / sizeof(oc[0]); k++) {
		char sample[160];
		double v;

		snprintf(sample, sizeof(sample),
			 "etcfs_etcd_txns_total{origin=\"openref\",outcome=\"%s\"}", oc[k]);
		v = efs_cl_metric(c, i, sample);
		CL_CHECK(v >= 0, "node%d has no %s", i + 1, sample);
		sum += v;
	}
	return sum;
}

void efs_oref_open_elsewhere(struct efs_cl *c, const char *dir)
{
	static char got[BLK], blk[BLK];
	unsigned long long base, pinned;
	uint64_t took;
	int fd;

	efs_cl_sync_all(c);
	base = efs_cl_free_bytes(c);
	fd = make_file(c, 1, efs_cl_dpath(c, 1, dir, "f"), 'a', true);
	CL_CHECK(unlink(efs_cl_dpath(c, 0, dir, "f")) == 0, "node1 unlink: %s", strerror(errno));
	CL_CHECK(access(efs_cl_dpath(c, 2, dir, "f"), F_OK) != 0 && errno == ENOENT,
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
	efs_cl_sync_all(c);
	pinned = efs_cl_free_bytes(c);
	CL_CHECK(pinned + (unsigned long long)FILE_BLOCKS * BLK / 2 <= base,
		 "the open file's space came back while node2 has it open (%llu free, %llu "
		 "before)",
		 pinned, base);
	CL_CHECK(pread(fd, got, sizeof(got), 10 * BLK) == (ssize_t)sizeof(got) && got[0] == 'a',
		 "node2 reads block 10 wrong after the sync");
	close(fd);
	took = efs_cl_wait_free(c, base - BLK * 2, BACK_MS, "after node2's close");
	printf("# open elsewhere: space back %llu ms after the close\n",
	       (unsigned long long)took);
}

void efs_oref_cached_reference(struct efs_cl *c, const char *dir)
{
	static char got[16];
	struct stat st;
	unsigned long long base;
	uint64_t took;
	int fd;

	efs_cl_sync_all(c);
	base = efs_cl_free_bytes(c);
	make_file(c, 1, efs_cl_dpath(c, 1, dir, "g"), 'c', false);
	/* node2 opens and closes it again: its reference stays cached. */
	fd = open(efs_cl_dpath(c, 1, dir, "g"), O_RDONLY | O_CLOEXEC);
	CL_CHECK(fd >= 0 && read(fd, got, sizeof(got)) == (ssize_t)sizeof(got),
		 "node2 reads g: %s", strerror(errno));
	CL_CHECK(fstat(fd, &st) == 0, "fstat: %s", strerror(errno));
	close(fd);
	/* The reference outlives the close while node2 caches the inode
	 * (main put none: this fails there). */
	CL_CHECK(count_refs(c, 1, (uint64_t)st.st_ino) == 1,
		 "node2's reference on g is not kept after its close");
	CL_CHECK(unlink(efs_cl_dpath(c, 0, dir, "g")) == 0, "node1 unlink: %s", strerror(errno));
	took = efs_cl_wait_free(c, base - BLK * 2, BACK_MS, "a cached reference on node2");
	/* ... and goes once the unlink asked for it (o/ watch, or the drop
	 * when node2's kernel forgot the inode). */
	CL_CHECK(count_refs(c, 1, (uint64_t)st.st_ino) == 0,
		 "node2's cached reference on g is still there after the reclaim");
	printf("# cached reference: space back %llu ms after the unlink\n",
	       (unsigned long long)took);
}

void efs_oref_killed_opener(struct efs_cl *c, const char *dir, unsigned grace_s)
{
	static char got[BLK];
	unsigned long long base;
	uint64_t took, t_kill;
	int fd;

	efs_cl_sync_all(c);
	base = efs_cl_free_bytes(c);
	fd = make_file(c, 1, efs_cl_dpath(c, 1, dir, "k"), 'k', true);
	CL_CHECK(unlink(efs_cl_dpath(c, 0, dir, "k")) == 0, "node1 unlink: %s", strerror(errno));
	CL_CHECK(pread(fd, got, sizeof(got), 0) == (ssize_t)sizeof(got) && got[0] == 'k',
		 "node2 reads the unlinked file: %s", strerror(errno));
	efs_cl_kill(c, 1);
	t_kill = efs_cl_now_ms();
	close(fd);
	efs_cl_sleep_ms(500);
	efs_cl_sync_all(c);
	CL_CHECK(efs_cl_free_bytes(c) + (unsigned long long)FILE_BLOCKS * BLK / 2 <= base,
		 "the file's space came back right after its opener's kill");
	/* Past the lease (its references are gone) but inside the grace:
	 * still pinned, since the dead opener's writes may still land. */
	{
		uint64_t ttl_ms = (uint64_t)(c->opts.session_ttl ? c->opts.session_ttl : 2) * 1000;
		uint64_t at = t_kill + ttl_ms + 1000;

		if (efs_cl_now_ms() < at)
			efs_cl_sleep_ms((unsigned)(at - efs_cl_now_ms()));
		efs_cl_sync_all(c);
		CL_CHECK(efs_cl_now_ms() - t_kill < ttl_ms + grace_s * 1000,
			 "too slow to look inside the grace (%llu ms after the kill)",
			 (unsigned long long)(efs_cl_now_ms() - t_kill));
		CL_CHECK(efs_cl_free_bytes(c) + (unsigned long long)FILE_BLOCKS * BLK / 2 <= base,
			 "the file's space came back %llu ms after its opener's kill, inside "
			 "the lease and the grace",
			 (unsigned long long)(efs_cl_now_ms() - t_kill));
	}
	took = efs_cl_wait_free(c, base - BLK * 2,
			 (uint64_t)(c->opts.session_ttl ? c->opts.session_ttl : 2) * 1000 +
				 grace_s * 1000 + BACK_MS,
			 "after the opener's kill");
	printf("# killed opener: space back %llu ms after the kill (grace %u s)\n",
	       (unsigned long long)(efs_cl_now_ms() - t_kill), grace_s);
	(void)took;
	efs_cl_down(c, 1);
	efs_cl_mount(c, 1);
}

void efs_oref_first_open_races_unlink(struct efs_cl *c, const char *dir)
{
	static char got[BLK];
	int opened = 0;

	for (int it = 0; it < 8; it++) {
		char fill = (char)('A' + it);
		pid_t pid;
		int fd, st;

		make_file(c, 0, efs_cl_dpath(c, 0, dir, "race"), fill, false);
		pid = fork();
		CL_CHECK(pid >= 0, "fork: %s", strerror(errno));
		if (pid == 0) {
			usleep((useconds_t)it * 60000); /* 0 to 420 ms: either may win */
			_exit(unlink(efs_cl_dpath(c, 0, dir, "race")) == 0 ? 0 : 1);
		}
		/* node2's first open of it: the reference is taken by a commit
		 * of its own (not riding a create). */
		fd = open(efs_cl_dpath(c, 1, dir, "race"), O_RDONLY | O_CLOEXEC);
		CL_CHECK(fd >= 0 || errno == ENOENT, "node2 open: %s", strerror(errno));
		CL_CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			 "node1's unlink failed");
		if (fd < 0)
			continue;
		opened++;
		/* Blocks freed under node2 would be handed to this file. */
		make_file(c, 0, efs_cl_dpath(c, 0, dir, "filler"), 'z', false);
		for (int k = 0; k < FILE_BLOCKS; k += 9) {
			CL_CHECK(pread(fd, got, sizeof(got), (off_t)k * BLK) == (ssize_t)sizeof(got),
				 "node2 reads block %d of the file node1 unlinked: %s", k,
				 strerror(errno));
			CL_CHECK(got[0] == fill && got[BLK - 1] == fill,
				 "node2 reads '%c' in block %d, '%c' expected: the file was freed "
				 "while node2 had it open",
				 got[0], k, fill);
		}
		close(fd);
		CL_CHECK(unlink(efs_cl_dpath(c, 0, dir, "filler")) == 0, "unlink filler: %s",
			 strerror(errno));
	}
	printf("# first open racing an unlink: %d of 8 opens won\n", opened);
	CL_CHECK(opened > 0, "no open came before the unlink: nothing was checked");
}

/* Creates, writes (|len| bytes of |data|) and closes <prefix>%04d for
 * k < |n| on node |i|. */
static void create_files(struct efs_cl *c, int i, const char *dir, const char *prefix, int n,
			 const char *data, size_t len)
{
	for (int k = 0; k < n; k++) {
		char name[32];
		int fd;

		snprintf(name, sizeof(name), "%s%04d", prefix, k);
		fd = open(efs_cl_dpath(c, i, dir, name), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		CL_CHECK(fd >= 0, "create %s: %s", name, strerror(errno));
		CL_CHECK(write(fd, data, len) == (ssize_t)len, "write: %s", strerror(errno));
		close(fd);
	}
}

void efs_oref_create_loop_costs_nothing(struct efs_cl *c, const char *dir)
{
	static char blk[4096];
	double before, after;

	memset(blk, 'q', sizeof(blk));
	before = openref_txns(c, 0);
	create_files(c, 0, dir, "c", 100, blk, sizeof(blk));
	after = openref_txns(c, 0);
	printf("# create-write-close x100: %.0f openref commits\n", after - before);
	/* A create's reference rides its transaction: no commit of its own.
	 * The counter also counts drop batches, and the kernel may forget
	 * inodes an earlier check left cached meanwhile: a few batches, far
	 * below one commit per file, are those. */
	CL_CHECK(after - before <= OREF_DROP_SLACK,
		 "100 creates sent %.0f openref commits, none expected (at most %d drop batches)",
		 after - before, OREF_DROP_SLACK);
}

/* Drops the kernel's page cache, dentries and inodes (FUSE forgets; an
 * inode with cached pages stays under "2"): 0, or -errno. */
static int drop_caches(void)
{
	int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	int r = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, "3", 1) != 1)
		r = -errno;
	close(fd);
	return r;
}

/* Waits up to |ms| for node |i|'s openref commits to stop growing. */
static double settled_txns(struct efs_cl *c, int i, unsigned ms)
{
	double v = openref_txns(c, i), prev;

	do {
		prev = v;
		efs_cl_sleep_ms(300);
		v = openref_txns(c, i);
		ms = ms > 300 ? ms - 300 : 0;
	} while ((v != prev || ms > 0) && ms > 0);
	return v;
}

/* Opens, reads and closes each of the |nfiles| files on node |i|. */
static void read_each(struct efs_cl *c, int i, const char *dir, int nfiles)
{
	static char got[512];

	for (int k = 0; k < nfiles; k++) {
		char name[32];
		int fd;

		snprintf(name, sizeof(name), "t%04d", k);
		fd = open(efs_cl_dpath(c, i, dir, name), O_RDONLY | O_CLOEXEC);
		CL_CHECK(fd >= 0 && read(fd, got, sizeof(got)) == (ssize_t)sizeof(got),
			 "node%d reads %s: %s", i + 1, name, strerror(errno));
		close(fd);
	}
}

void efs_oref_forgotten_tree(struct efs_cl *c, const char *dir, int nfiles)
{
	static char blk[512];
	double t[5][2];

	memset(blk, 'w', sizeof(blk));
	for (int i = 0; i < 2; i++)
		t[0][i] = openref_txns(c, i);
	/* node1: creates (the reference rides them), then a re-open of
	 * each (cached reference). */
	create_files(c, 0, dir, "t", nfiles, blk, sizeof(blk));
	read_each(c, 0, dir, nfiles);
	t[1][0] = openref_txns(c, 0);
	/* Forgotten: node1's drops. */
	CL_CHECK(drop_caches() == 0, "drop_caches: %s", strerror(errno));
	t[2][0] = settled_txns(c, 0, 3000);
	t[2][1] = openref_txns(c, 1);
	printf("# node1 keeps %d open references after drop_caches\n",
	       count_refs_of(c, 0, 0, true));
	/* node2's first opens: a take each. */
	read_each(c, 1, dir, nfiles);
	CL_CHECK(drop_caches() == 0, "drop_caches: %s", strerror(errno));
	t[3][1] = settled_txns(c, 1, 3000);
	printf("# %d files: node1 openref commits %.0f (creates, re-opens) + %.0f (drops "
	       "after drop_caches); node2 %.0f (first opens, then drops after drop_caches)\n",
	       nfiles, t[1][0] - t[0][0], t[2][0] - t[1][0], t[3][1] - t[2][1]);
	CL_CHECK(t[1][0] - t[0][0] <= OREF_DROP_SLACK,
		 "node1's creates and re-opens sent %.0f openref commits (at most %d drop "
		 "batches of earlier files expected)",
		 t[1][0] - t[0][0], OREF_DROP_SLACK);
	CL_CHECK(t[2][0] - t[1][0] <= nfiles / 64 + 8,
		 "node1 sent %.0f drop commits for %d forgotten files: not batched",
		 t[2][0] - t[1][0], nfiles);
	CL_CHECK(t[3][1] - t[2][1] <= nfiles + nfiles / 64 + 8,
		 "node2 sent %.0f commits for %d first opens and their drops", t[3][1] - t[2][1],
		 nfiles);
}
