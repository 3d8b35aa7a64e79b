/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The data path suite: file contents on a real etcfs mount, each Test on its
 * own mount (test/support/datamodel.h).
 *
 *  - random: a seeded random data-integrity run against an in-memory model
 *    (buffered and O_DIRECT writes, reads, truncates, every fallocate mode,
 *    mmap writes, fsync), then the restart test: unmount, mount, compare
 *    every byte, the sizes and SEEK_DATA/SEEK_HOLE against the model. The
 *    seed comes from ETCFS_TEST_SEED (else the clock) and every failure
 *    message carries it: ETCFS_TEST_SEED=<seed> ./test_data --filter
 *    'data/random' replays the run.
 *  - large_sparse: files beyond 4 GiB, sparse, read back after a restart.
 *  - append, sync_kill, copy_range: O_APPEND from two processes, O_SYNC and
 *    O_DSYNC writes surviving a kill -9 of the daemon, copy_file_range.
 *  - unlink_open: data readable through a descriptor after unlink; after
 *    the last close the space comes back and etcd keeps no rc/ or o/ key.
 *  - killpriv: setuid/setgid cleared by a write of another user.
 *  - enospc: a small device filled to ENOSPC, nothing half-written, the
 *    reserve for overwrites and deletes, free space back after deletes.
 *  - dev_error: injected device write errors (ETCFS_FAULT_DEV, fault hooks
 *    builds) give EIO and the mount stays up.
 *  - unsettled_drop: a publication whose outcome stays unknown
 *    (ETCFS_FAULT_PUB_UNSETTLED, fault hooks builds), the file unlinked and
 *    another written at once: fsck finds no block both free and used, no
 *    double free, and the other file's data is intact.
 *  - mem_map, mem_settle: allocations failing (ETCFS_FAULT_MEM, fault hooks
 *    builds) while a completed write is mapped (a sweep over each of its
 *    allocations) and while a committed publication settles the pending
 *    runs: fsck stays clean and the data reads back after a remount.
 *  - in-place overwrites: overwrites of mapped blocks go in place (counter,
 *    no new extent chunk, bytes back after a remount, fsck clean), an
 *    fsync after them flushes the device, a read racing one is never torn
 *    (checked to fail with the read guard taken out), and -o cow keeps
 *    them copy-on-write.
 *
 * Every expectation was first checked on ext4: build with -DDATA_LOCAL=1
 * (e.g. gcc -DDATA_LOCAL=1 -I<build> -Itest/support test_data.c
 * -lcriterion) to run the suite on a private ext4 loop mount (root
 * needed); the etcd and daemon checks are etcfs-only.
 */
#include "../support/datamodel.h"
#include "fs/fs-int.h"

#include <linux/falloc.h>
#include <stdatomic.h>
#include <sys/xattr.h>
#include <sys/utsname.h>
#include <dirent.h>
#include <sys/statvfs.h>

#define MiB (1024u * 1024u)
#define BLK 4096u

TestSuite(data, .fini = env_stop, .timeout = 300);

/* A call's result must be |want|; the message names the call and errno. */
#define IO_EQ(expr, want)                                                               \
	do {                                                                            \
		ssize_t r_ = (ssize_t)(expr);                                           \
		int e_ = errno;                                                         \
		cr_assert_eq(r_, (ssize_t)(want), "%s: %zd, expected %zd (%s)%s", #expr,  \
			     r_, (ssize_t)(want), r_ < 0 ? strerror(e_) : "short", env_why()); \
	} while (0)

/* ==== random: the seeded model test ==== */

#define NFILES	    3
#define MAXSZ	    (16u * MiB)
#define NOPS	    6000
#define RECENT	    12

struct mfile {
	char path[PATH_MAX];
	char name[32];	 /* for messages */
	int fd;		 /* buffered, O_RDWR */
	int dfd;	 /* O_DIRECT, O_RDWR */
	uint8_t *m;	 /* MAXSZ + slack bytes; zero beyond size */
	uint64_t size;
	uint8_t *hole;	 /* per block: 1 when the block must be a hole */
};

static uint64_t seed;
static int opno;
static char recent[RECENT][200];

__attribute__((format(printf, 1, 2))) static void note(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(recent[opno % RECENT], sizeof(recent[0]), fmt, ap);
	va_end(ap);
}

static const char *recent_ops(void)
{
	static char buf[RECENT * 210];
	size_t used = 0;

	buf[0] = '\0';
	for (int i = opno - RECENT + 1; i <= opno; i++) {
		if (i < 0)
			continue;
		used += (size_t)snprintf(buf + used, sizeof(buf) - used, "  #%d %s\n", i,
					 recent[i % RECENT]);
		if (used >= sizeof(buf))
			break;
	}
	return buf;
}

#define DFAIL(...)                                                                       \
	do {                                                                             \
		char m_[600];                                                            \
		snprintf(m_, sizeof(m_), __VA_ARGS__);                                   \
		cr_assert_fail("random (ETCFS_TEST_SEED=%" PRIu64 ") op %d: %s%s\nrecent ops:\n%s", \
			       seed, opno, m_, env_why(), recent_ops());                 \
	} while (0)
#define DCHECK(cond, ...)                  \
	do {                               \
		if (!(cond))               \
			DFAIL(__VA_ARGS__); \
	} while (0)

static void mark(struct mfile *f, uint64_t off, uint64_t len, uint8_t v, bool whole_only)
{
	uint64_t b0, b1;

	if (len == 0)
		return;
	if (whole_only) {
		b0 = (off + BLK - 1) / BLK;
		b1 = (off + len) / BLK; /* exclusive */
	} else {
		b0 = off / BLK;
		b1 = (off + len + BLK - 1) / BLK;
	}
	for (uint64_t b = b0; b < b1 && b < MAXSZ / BLK + 1; b++)
		f->hole[b] = v;
}

/* Compares [off, off + len) of the file with the model (len may pass EOF). */
static void check_range(struct mfile *f, uint8_t *buf, uint64_t off, uint64_t len, int fd,
			const char *what)
{
	uint64_t want = off >= f->size ? 0 : (off + len > f->size ? f->size - off : len);
	ssize_t n = pread_all(fd, buf, len, (off_t)off);

	DCHECK(n >= 0, "%s: pread %s [%" PRIu64 ", +%" PRIu64 "): %s", what, f->name, off, len,
	       strerror(errno));
	DCHECK((uint64_t)n == want,
	       "%s: pread %s [%" PRIu64 ", +%" PRIu64 "): %zd bytes, expected %" PRIu64
	       " (size %" PRIu64 ")",
	       what, f->name, off, len, n, want, f->size);
	if (memcmp(buf, f->m + off, want) != 0) {
		uint64_t i = 0;

		while (buf[i] == f->m[off + i])
			i++;
		DFAIL("%s: %s differs at byte %" PRIu64 " (block %" PRIu64 "): read 0x%02x, "
		      "expected 0x%02x (read [%" PRIu64 ", +%" PRIu64 "), size %" PRIu64 ")",
		      what, f->name, off + i, (off + i) / BLK, buf[i], f->m[off + i], off, len,
		      f->size);
	}
}

/* Every byte, the size, and SEEK_DATA/SEEK_HOLE against the model. */
static void check_whole(struct mfile *f, uint8_t *buf, const char *what)
{
	struct stat st;
	int fd = open(f->path, O_RDONLY | O_CLOEXEC);
	off_t pos = 0;

	DCHECK(fd >= 0, "%s: open %s: %s", what, f->name, strerror(errno));
	DCHECK(fstat(fd, &st) == 0, "%s: fstat: %s", what, strerror(errno));
	DCHECK((uint64_t)st.st_size == f->size, "%s: %s has size %jd, expected %" PRIu64, what,
	       f->name, (intmax_t)st.st_size, f->size);
	for (uint64_t off = 0; off < f->size + MiB; off += 4 * MiB)
		check_range(f, buf, off, 4 * MiB, fd, what);

	/* Holes read as zero in the model; no punched block inside data. */
	while ((uint64_t)pos < f->size) {
		off_t d = lseek(fd, pos, SEEK_DATA), h;

		if (d < 0) {
			DCHECK(errno == ENXIO, "%s: SEEK_DATA %jd of %s: %s", what, (intmax_t)pos,
			       f->name, strerror(errno));
			d = (off_t)f->size;
		}
		DCHECK(d >= pos && (uint64_t)d <= f->size,
		       "%s: SEEK_DATA %jd of %s gave %jd (size %" PRIu64 ")", what, (intmax_t)pos,
		       f->name, (intmax_t)d, f->size);
		DCHECK(all_zero(f->m + pos, (size_t)(d - pos)),
		       "%s: %s: [%jd, %jd) reported as a hole holds data in the model", what,
		       f->name, (intmax_t)pos, (intmax_t)d);
		if ((uint64_t)d >= f->size)
			break;
		h = lseek(fd, d, SEEK_HOLE);
		DCHECK(h > d && (uint64_t)h <= f->size,
		       "%s: SEEK_HOLE %jd of %s gave %jd (size %" PRIu64 "): %s", what,
		       (intmax_t)d, f->name, (intmax_t)h, f->size, h < 0 ? strerror(errno) : "");
		for (uint64_t b = ((uint64_t)d + BLK - 1) / BLK; (b + 1) * BLK <= (uint64_t)h; b++)
			DCHECK(!f->hole[b],
			       "%s: %s: SEEK_DATA/SEEK_HOLE report data [%jd, %jd) over block %" PRIu64
			       ", a punched or truncated hole",
			       what, f->name, (intmax_t)d, (intmax_t)h, b);
		pos = h;
	}
	close(fd);
}

static uint64_t pick_len(uint64_t *r)
{
	uint64_t p = rnd_next(r) % 100;

	if (p < 65)
		return rnd_range(r, 1, 16384);
	if (p < 88)
		return rnd_range(r, 16384, 256 * 1024);
	if (p < 97)
		return rnd_range(r, 256 * 1024, MiB);
	return rnd_range(r, MiB, 5 * MiB / 2);
}

/* An offset for |len| bytes: near the end of the file half of the time. */
static uint64_t pick_off(uint64_t *r, struct mfile *f, uint64_t len)
{
	uint64_t lim = MAXSZ - len, off;

	if (rnd_next(r) % 2 && f->size > 0) {
		uint64_t lo = f->size > 64 * 1024 ? f->size - 64 * 1024 : 0;

		off = rnd_range(r, lo, f->size + 64 * 1024);
	} else {
		off = rnd_range(r, 0, lim);
	}
	return off > lim ? lim : off;
}

static void model_write(struct mfile *f, const uint8_t *data, uint64_t off, uint64_t len)
{
	memcpy(f->m + off, data, len);
	if (off + len > f->size)
		f->size = off + len;
	mark(f, off, len, 0, false);
}

static void model_truncate(struct mfile *f, uint64_t ns)
{
	if (ns < f->size)
		memset(f->m + ns, 0, f->size - ns);
	f->size = ns;
	/* Blocks wholly beyond the new end are freed. */
	mark(f, (ns + BLK - 1) / BLK * BLK, MAXSZ + BLK - (ns + BLK - 1) / BLK * BLK, 1, true);
}

static void fall(struct mfile *f, int mode, uint64_t off, uint64_t len, const char *name)
{
	int r = fallocate(f->fd, mode, (off_t)off, (off_t)len);

	DCHECK(r == 0, "fallocate %s %s [%" PRIu64 ", +%" PRIu64 "): %s", name, f->name, off, len,
	       strerror(errno));
}

static void op_once(struct mfile *files, uint64_t *r, uint8_t *data, uint8_t *dbuf,
		    uint8_t *rbuf)
{
	struct mfile *f = &files[rnd_next(r) % NFILES];
	uint64_t p = rnd_next(r) % 100, off, len;
	ssize_t n;

	if (p < 25) { /* buffered write */
		len = pick_len(r);
		off = pick_off(r, f, len);
		rnd_fill(r, data, len);
		note("pwrite %s [%" PRIu64 ", +%" PRIu64 ")", f->name, off, len);
		n = pwrite_all(f->fd, data, len, (off_t)off);
		DCHECK((uint64_t)n == len, "pwrite: %zd of %" PRIu64 ": %s", n, len, strerror(errno));
		model_write(f, data, off, len);
	} else if (p < 37) { /* O_DIRECT write */
		len = rnd_range(r, 1, 64) * BLK;
		off = pick_off(r, f, len) / BLK * BLK;
		rnd_fill(r, dbuf, len);
		note("direct pwrite %s [%" PRIu64 ", +%" PRIu64 ")", f->name, off, len);
		n = pwrite_all(f->dfd, dbuf, len, (off_t)off);
		DCHECK((uint64_t)n == len, "O_DIRECT pwrite: %zd of %" PRIu64 ": %s", n, len,
		       strerror(errno));
		model_write(f, dbuf, off, len);
	} else if (p < 57) { /* read and compare */
		len = rnd_next(r) % 10 ? rnd_range(r, 1, 256 * 1024) : rnd_range(r, 1, 3 * MiB);
		off = rnd_range(r, 0, f->size + 64 * 1024);
		if (off + len > MAXSZ + MiB)
			off = MAXSZ + MiB - len;
		if (rnd_next(r) % 4 == 0) { /* through the O_DIRECT descriptor */
			off = off / BLK * BLK;
			len = (len + BLK - 1) / BLK * BLK;
			note("direct pread %s [%" PRIu64 ", +%" PRIu64 ")", f->name, off, len);
			check_range(f, dbuf, off, len, f->dfd, "direct read");
		} else {
			note("pread %s [%" PRIu64 ", +%" PRIu64 ")", f->name, off, len);
			check_range(f, rbuf, off, len, f->fd, "read");
		}
	} else if (p < 63) { /* truncate */
		uint64_t ns = rnd_next(r) % 2 ? rnd_range(r, 0, f->size)
					      : rnd_range(r, f->size, MAXSZ);

		if (rnd_next(r) % 3 == 0)
			ns = ns / BLK * BLK;
		note("ftruncate %s %" PRIu64 " (from %" PRIu64 ")", f->name, ns, f->size);
		DCHECK(ftruncate(f->fd, (off_t)ns) == 0, "ftruncate: %s", strerror(errno));
		model_truncate(f, ns);
	} else if (p < 67) { /* fallocate default */
		len = pick_len(r);
		off = pick_off(r, f, len);
		note("fallocate 0 %s [%" PRIu64 ", +%" PRIu64 ")", f->name, off, len);
		fall(f, 0, off, len, "default");
		if (off + len > f->size)
			f->size = off + len;
		mark(f, off, len, 0, false);
	} else if (p < 70) { /* fallocate KEEP_SIZE */
		len = pick_len(r);
		off = pick_off(r, f, len);
		note("fallocate KEEP_SIZE %s [%" PRIu64 ", +%" PRIu64 ")", f->name, off, len);
		fall(f, FALLOC_FL_KEEP_SIZE, off, len, "KEEP_SIZE");
		mark(f, off, len, 0, false);
	} else if (p < 77) { /* punch */
		len = rnd_next(r) % 2 ? pick_len(r) : rnd_range(r, 1, 16) * BLK;
		off = pick_off(r, f, len);
		if (rnd_next(r) % 2)
			off = off / BLK * BLK;
		note("punch %s [%" PRIu64 ", +%" PRIu64 ")", f->name, off, len);
		fall(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len, "PUNCH_HOLE|KEEP_SIZE");
		if (off < f->size)
			memset(f->m + off, 0, (off + len > f->size ? f->size : off + len) - off);
		mark(f, off, len, 1, true);
	} else if (p < 81) { /* zero range */
		len = pick_len(r);
		off = pick_off(r, f, len);
		note("zero range %s [%" PRIu64 ", +%" PRIu64 ")", f->name, off, len);
		fall(f, FALLOC_FL_ZERO_RANGE, off, len, "ZERO_RANGE");
		if (off < f->size)
			memset(f->m + off, 0, (off + len > f->size ? f->size : off + len) - off);
		if (off + len > f->size)
			f->size = off + len;
		mark(f, off, len, 0, false);
	} else if (p < 92) { /* mmap write */
		uint64_t moff, mlen;
		uint8_t *map;

		if (f->size == 0)
			return;
		off = rnd_range(r, 0, f->size - 1);
		len = rnd_range(r, 1, f->size - off < 256 * 1024 ? f->size - off : 256 * 1024);
		moff = off / 4096 * 4096;
		mlen = off + len - moff;
		note("mmap write %s [%" PRIu64 ", +%" PRIu64 ") size %" PRIu64, f->name, off, len,
		     f->size);
		map = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, (off_t)moff);
		DCHECK(map != MAP_FAILED, "mmap: %s", strerror(errno));
		DCHECK(memcmp(map + (off - moff), f->m + off, len) == 0,
		       "mmap of %s [%" PRIu64 ", +%" PRIu64 ") differs from the model before the write",
		       f->name, off, len);
		rnd_fill(r, data, len);
		memcpy(map + (off - moff), data, len);
		DCHECK(msync(map, mlen, MS_SYNC) == 0, "msync: %s", strerror(errno));
		DCHECK(munmap(map, mlen) == 0, "munmap: %s", strerror(errno));
		model_write(f, data, off, len);
	} else if (p < 96) { /* fsync, fdatasync */
		bool data_only = rnd_next(r) % 2;

		note("%s %s", data_only ? "fdatasync" : "fsync", f->name);
		DCHECK((data_only ? fdatasync(f->fd) : fsync(f->fd)) == 0, "fsync: %s",
		       strerror(errno));
	} else { /* size check */
		struct stat st;

		note("fstat %s", f->name);
		DCHECK(fstat(f->dfd, &st) == 0, "fstat: %s", strerror(errno));
		DCHECK((uint64_t)st.st_size == f->size, "fstat: size %jd, expected %" PRIu64,
		       (intmax_t)st.st_size, f->size);
	}
}

/* The model run: |nops| seeded random operations on NFILES files, every
 * byte compared before and after a clean remount; |before_remount| (may
 * be NULL) runs just before it. */
static void model_run(int nops, void (*before_remount)(void))
{
	struct mfile files[NFILES];
	uint8_t *data, *rbuf, *dbuf;
	uint64_t r;

	r = seed;
	opno = 0;
	data = malloc(4 * MiB);
	rbuf = malloc(4 * MiB);
	cr_assert(data && rbuf);
	cr_assert_eq(posix_memalign((void **)&dbuf, 4096, 4 * MiB), 0);
	for (int i = 0; i < NFILES; i++) {
		char name[32];

		snprintf(name, sizeof(name), "model%d", i);
		snprintf(files[i].name, sizeof(files[i].name), "%s", name);
		env_path(files[i].path, sizeof(files[i].path), name);
		files[i].fd = open(files[i].path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		cr_assert_geq(files[i].fd, 0, "create %s: %s", files[i].path, strerror(errno));
		files[i].dfd = open(files[i].path, O_RDWR | O_DIRECT | O_CLOEXEC);
		cr_assert_geq(files[i].dfd, 0, "open O_DIRECT %s: %s", files[i].path,
			      strerror(errno));
		files[i].m = calloc(1, MAXSZ + 2 * MiB);
		files[i].hole = malloc(MAXSZ / BLK + 2);
		cr_assert(files[i].m && files[i].hole);
		memset(files[i].hole, 1, MAXSZ / BLK + 2);
		files[i].size = 0;
	}
	for (opno = 0; opno < nops; opno++)
		op_once(files, &r, data, dbuf, rbuf);
	for (int i = 0; i < NFILES; i++) {
		IO_EQ(close(files[i].dfd), 0);
		IO_EQ(close(files[i].fd), 0);
		check_whole(&files[i], rbuf, "before the restart");
	}
	if (before_remount)
		before_remount();
	note("restart");
	env_remount();
	for (int i = 0; i < NFILES; i++) {
		check_whole(&files[i], rbuf, "after the restart");
		free(files[i].m);
		free(files[i].hole);
	}
	free(data);
	free(rbuf);
	free(dbuf);
}

Test(data, random)
{
	seed = test_seed();
	env_start(0, NULL);
	model_run(NOPS, NULL);
	env_stop();
	efs_test_assert_no_leaks();
}

/* ==== large_sparse: beyond 4 GiB ==== */

Test(data, large_sparse)
{
	static const char msg[] = "beyond four gibibytes";
	const off_t at = (5ll << 30) + 123, at2 = (4ll << 30) - 100;
	char path[PATH_MAX], buf[8192], pat[8192];
	uint64_t pr = 42;
	struct stat st;
	int fd;
	off_t d;

	env_start(0, NULL);
	env_path(path, sizeof(path), "sparse");
	rnd_fill(&pr, pat, sizeof(pat));
	for (int round = 0; round < 2; round++) {
		fd = open(path, round ? O_RDONLY : O_RDWR | O_CREAT | O_EXCL, 0644);
		cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
		if (round == 0) {
			cr_assert_eq(pwrite(fd, msg, sizeof(msg), at), (ssize_t)sizeof(msg),
				     "pwrite at 5 GiB + 123: %s", strerror(errno));
			/* Across the 4 GiB boundary. */
			cr_assert_eq(pwrite(fd, pat, sizeof(pat), at2), (ssize_t)sizeof(pat),
				     "pwrite across 4 GiB: %s", strerror(errno));
			cr_assert_eq(fsync(fd), 0, "fsync: %s", strerror(errno));
		}
		cr_assert_eq(fstat(fd, &st), 0);
		cr_assert_eq(st.st_size, at + (off_t)sizeof(msg), "round %d: size %jd", round,
			     (intmax_t)st.st_size);
		cr_assert_leq(st.st_blocks * 512, 1 << 20,
			      "round %d: st_blocks %jd for 12 KiB of data in a sparse file", round,
			      (intmax_t)st.st_blocks);
		memset(buf, 0x55, sizeof(buf));
		IO_EQ(pread(fd, buf, sizeof(msg), at), (ssize_t)sizeof(msg));
		cr_assert_eq(memcmp(buf, msg, sizeof(msg)), 0, "round %d: data at 5 GiB", round);
		IO_EQ(pread(fd, buf, sizeof(pat), at2), (ssize_t)sizeof(pat));
		cr_assert_eq(memcmp(buf, pat, sizeof(pat)), 0, "round %d: data across 4 GiB",
			     round);
		/* Holes read as zeros: the start, after the 4 GiB write, before 5 GiB. */
		for (int k = 0; k < 3; k++) {
			off_t h = k == 0 ? 0 : k == 1 ? at2 + (off_t)sizeof(pat) + 4096 : at - 4000;

			memset(buf, 0x55, sizeof(buf));
			cr_assert_eq(pread(fd, buf, 3000, h), 3000, "pread hole at %jd: %s",
				     (intmax_t)h, strerror(errno));
			cr_assert(all_zero((uint8_t *)buf, 3000), "round %d: hole at %jd not zero",
				  round, (intmax_t)h);
		}
		d = lseek(fd, 0, SEEK_DATA);
		cr_assert(d >= 0 && d <= at2 && d > at2 - 65536,
			  "round %d: SEEK_DATA 0 gave %jd, expected the block of %jd", round,
			  (intmax_t)d, (intmax_t)at2);
		d = lseek(fd, at2 + 3 * 4096, SEEK_DATA);
		cr_assert(d >= 0 && d <= at && d > at - 65536,
			  "round %d: SEEK_DATA after 4 GiB gave %jd, expected the block of %jd",
			  round, (intmax_t)d, (intmax_t)at);
		d = lseek(fd, 0, SEEK_HOLE);
		cr_assert(d >= 0 && d < at2, "round %d: SEEK_HOLE 0 gave %jd", round, (intmax_t)d);
		close(fd);
		if (round == 0)
			env_remount();
	}
	env_stop();
	efs_test_assert_no_leaks();
}

/* ==== append, sync_kill, copy_range ==== */

#define REC	  100
#define NREC	  400

static void make_rec(char *rec, int who, int i)
{
	uint64_t h;

	memset(rec, 'a' + who, REC);
	snprintf(rec, 24, "P%d-%06d", who, i);
	h = fnv64(rec, REC - 17);
	snprintf(rec + REC - 17, 18, "%016" PRIx64, h);
	rec[REC - 1] = '\n';
}

Test(data, append)
{
	char path[PATH_MAX], rec[REC + 1], *all;
	int seen[2][NREC] = {{0}}, last[2] = {-1, -1};
	pid_t kids[2];
	struct stat st;
	int fd, fd2;

	env_start(0, NULL);
	env_path(path, sizeof(path), "log");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(fd, 0);
	close(fd);
	for (int k = 0; k < 2; k++) {
		kids[k] = fork();
		cr_assert_geq(kids[k], 0);
		if (kids[k] == 0) {
			int cfd = open(path, O_WRONLY | O_APPEND);

			if (cfd < 0)
				_exit(2);
			for (int i = 0; i < NREC; i++) {
				make_rec(rec, k, i);
				if (write(cfd, rec, REC) != REC)
					_exit(3);
			}
			_exit(close(cfd) == 0 ? 0 : 4);
		}
	}
	for (int k = 0; k < 2; k++) {
		int s;

		cr_assert_eq(waitpid(kids[k], &s, 0), kids[k]);
		cr_assert(WIFEXITED(s) && WEXITSTATUS(s) == 0, "appender %d failed (status %d)", k,
			  s);
	}
	/* Two descriptors of one process, interleaved. */
	fd = open(path, O_WRONLY | O_APPEND);
	fd2 = open(path, O_WRONLY | O_APPEND);
	cr_assert(fd >= 0 && fd2 >= 0);
	for (int i = 0; i < 50; i++) {
		make_rec(rec, i % 2, NREC + i);
		cr_assert_eq(write(i % 2 ? fd2 : fd, rec, REC), REC, "append %d: %s", i,
			     strerror(errno));
	}
	close(fd);
	close(fd2);

	for (int round = 0; round < 2; round++) {
		fd = open(path, O_RDONLY);
		cr_assert_geq(fd, 0);
		cr_assert_eq(fstat(fd, &st), 0);
		cr_assert_eq(st.st_size, (off_t)(2 * NREC + 50) * REC,
			     "round %d: size %jd, expected %d records", round,
			     (intmax_t)st.st_size, 2 * NREC + 50);
		all = malloc((size_t)st.st_size);
		cr_assert_not_null(all);
		IO_EQ(pread_all(fd, all, (size_t)st.st_size, 0), st.st_size);
		close(fd);
		memset(seen, 0, sizeof(seen));
		last[0] = last[1] = -1;
		for (int j = 0; j < 2 * NREC; j++) {
			char *p = all + (size_t)j * REC;
			int who, i;

			cr_assert_eq(sscanf(p, "P%d-%d", &who, &i), 2, "round %d: record %d garbled",
				     round, j);
			cr_assert(who >= 0 && who < 2 && i >= 0 && i < NREC,
				  "round %d: record %d out of range", round, j);
			make_rec(rec, who, i);
			cr_assert_eq(memcmp(p, rec, REC), 0, "round %d: record %d (P%d-%d) torn",
				     round, j, who, i);
			cr_assert_eq(seen[who][i], 0, "round %d: record P%d-%d twice", round, who, i);
			cr_assert_gt(i, last[who], "round %d: P%d records out of order", round, who);
			seen[who][i] = 1;
			last[who] = i;
		}
		for (int i = 0; i < 50; i++) {
			make_rec(rec, i % 2, NREC + i);
			cr_assert_eq(memcmp(all + (size_t)(2 * NREC + i) * REC, rec, REC), 0,
				     "round %d: interleaved record %d", round, i);
		}
		free(all);
		if (round == 0)
			env_remount();
	}
	env_stop();
	efs_test_assert_no_leaks();
}

/*
 * O_SYNC and O_DSYNC writes are durable when they return: written, then
 * the daemon is killed (no fsync, no close) and the mount made again.
 */
Test(data, sync_kill)
{
	static const int flags[2] = {O_SYNC, O_DSYNC};
	char path[2][PATH_MAX], *buf[2], *got;
	const size_t len = 300 * 1024 + 77;
	uint64_t r = 7;
	int fd[2];

	env_start(0, NULL);
	got = malloc(len);
	cr_assert_not_null(got);
	for (int k = 0; k < 2; k++) {
		env_path(path[k], sizeof(path[k]), k ? "dsync" : "sync");
		buf[k] = malloc(len);
		cr_assert_not_null(buf[k]);
		rnd_fill(&r, buf[k], len);
		fd[k] = open(path[k], O_RDWR | O_CREAT | O_EXCL | flags[k], 0644);
		cr_assert_geq(fd[k], 0, "open %s: %s", path[k], strerror(errno));
		/* Three unaligned pieces, the last one first. */
		IO_EQ(pwrite_all(fd[k], buf[k] + 200000, len - 200000, 200000), len - 200000);
		IO_EQ(pwrite_all(fd[k], buf[k], 100001, 0), 100001);
		IO_EQ(pwrite_all(fd[k], buf[k] + 100001, 99999, 100001), 99999);
	}
#ifdef DATA_LOCAL
	for (int k = 0; k < 2; k++)
		close(fd[k]);
	env_remount();
#else
	efs_test_fs_kill(&env.f);
	for (int k = 0; k < 2; k++)
		close(fd[k]);
	efs_test_fs_mount(&env.f, NULL);
#endif
	for (int k = 0; k < 2; k++) {
		int rfd = open(path[k], O_RDONLY);
		struct stat st;

		cr_assert_geq(rfd, 0, "open %s after the kill: %s", path[k], strerror(errno));
		cr_assert_eq(fstat(rfd, &st), 0);
		cr_assert_eq(st.st_size, (off_t)len, "%s: size %jd after the kill, expected %zu",
			     k ? "O_DSYNC" : "O_SYNC", (intmax_t)st.st_size, len);
		IO_EQ(pread_all(rfd, got, len, 0), (ssize_t)len);
		cr_assert_eq(memcmp(got, buf[k], len), 0, "%s data lost after the kill",
			     k ? "O_DSYNC" : "O_SYNC");
		close(rfd);
		free(buf[k]);
	}
	free(got);
	env_stop();
	efs_test_assert_no_leaks();
}

/* copy_file_range until |len| bytes are copied or EOF: the count. */
static int64_t copy_all(int in, off_t oin, int out, off_t oout, size_t len)
{
	int64_t done = 0;

	while ((size_t)done < len) {
		ssize_t n = copy_file_range(in, &oin, out, &oout, len - (size_t)done, 0);

		if (n < 0) {
			cr_assert_fail("copy_file_range: %s", strerror(errno));
		}
		if (n == 0)
			break;
		done += n;
	}
	return done;
}

Test(data, copy_range)
{
	const size_t ssz = 3 * MiB + 1234;
	uint8_t *src, *dst, *got;
	char ps[PATH_MAX], pd[PATH_MAX];
	size_t dsz = 0, ssz2 = ssz;
	uint64_t r = 99;
	struct stat st;
	int s, d;

	env_start(0, NULL);
	src = calloc(1, 8 * MiB);
	dst = calloc(1, 8 * MiB);
	got = malloc(8 * MiB);
	cr_assert(src && dst && got);
	rnd_fill(&r, src, ssz);
	env_path(ps, sizeof(ps), "src");
	env_path(pd, sizeof(pd), "dst");
	s = open(ps, O_RDWR | O_CREAT | O_EXCL, 0644);
	d = open(pd, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert(s >= 0 && d >= 0);
	IO_EQ(pwrite_all(s, src, ssz, 0), (ssize_t)ssz);
	IO_EQ(fsync(s), 0);

	/* Whole file, block-aligned, across files. */
	cr_assert_eq(copy_all(s, 0, d, 0, ssz), (int64_t)ssz);
	memcpy(dst, src, ssz);
	dsz = ssz;
	/* Unaligned, overwriting and extending. */
	cr_assert_eq(copy_all(s, 1000, d, 2 * MiB + 777, 3 * MiB / 2),
		     (int64_t)(3 * MiB / 2));
	memcpy(dst + 2 * MiB + 777, src + 1000, 3 * MiB / 2);
	dsz = 2 * MiB + 777 + 3 * MiB / 2;
	/* Within one file, non-overlapping, extending it. */
	cr_assert_eq(copy_all(s, 4096, s, 5 * MiB, 100000), 100000);
	memcpy(src + 5 * MiB, src + 4096, 100000);
	ssz2 = 5 * MiB + 100000;
	/* Past the end: nothing. */
	cr_assert_eq(copy_all(s, (off_t)ssz2 + 10, d, 0, 4096), 0);
	/* Short at the end of the source. */
	cr_assert_eq(copy_all(s, (off_t)ssz2 - 500, d, 100, 4096), 500);
	memcpy(dst + 100, src + ssz2 - 500, 500);

	for (int round = 0; round < 2; round++) {
		for (int k = 0; k < 2; k++) {
			int fd = open(k ? pd : ps, O_RDONLY);
			size_t want = k ? dsz : ssz2;

			cr_assert_geq(fd, 0);
			cr_assert_eq(fstat(fd, &st), 0);
			cr_assert_eq(st.st_size, (off_t)want, "round %d: %s size %jd, expected %zu",
				     round, k ? "dst" : "src", (intmax_t)st.st_size, want);
			IO_EQ(pread_all(fd, got, 8 * MiB, 0), (ssize_t)want);
			cr_assert_eq(memcmp(got, k ? dst : src, want), 0,
				     "round %d: %s differs after copy_file_range", round,
				     k ? "dst" : "src");
			close(fd);
		}
		if (round == 0) {
			close(s);
			close(d);
			env_remount();
		}
	}
	free(src);
	free(dst);
	free(got);
	env_stop();
	efs_test_assert_no_leaks();
}

/* ==== unlink_open ==== */

/* Waits (bounded) until free space is at least |want|; the last value. */
static uint64_t wait_free(uint64_t want, unsigned ms)
{
	uint64_t end = mono_ms() + ms, bfree;

	for (;;) {
		env_space(&bfree, NULL);
		if (bfree >= want || mono_ms() >= end)
			return bfree;
		nap_ms(100);
	}
}

Test(data, unlink_open)
{
	const size_t len = 8 * MiB + 5;
	char path[PATH_MAX];
	uint8_t *buf, *got;
	uint64_t r = 5, b0, b1, b2;
	struct stat st;
	int fd;

	env_start(0, NULL);
	buf = malloc(len);
	got = malloc(len);
	cr_assert(buf && got);
	rnd_fill(&r, buf, len);
	sync();
	env_space(&b0, NULL);
	env_path(path, sizeof(path), "doomed");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(fd, 0);
	IO_EQ(pwrite_all(fd, buf, len, 0), (ssize_t)len);
	IO_EQ(fsync(fd), 0);
	/* statfs may lag (a cached answer): give it a few seconds. */
	for (uint64_t end = mono_ms() + 5000;; nap_ms(100)) {
		env_space(&b1, NULL);
		if (b1 + 8 * MiB <= b0 || mono_ms() >= end)
			break;
	}
	cr_assert_leq(b1 + 8 * MiB, b0,
		      "8 MiB written and fsynced: statfs free %" PRIu64 " -> %" PRIu64
		      " bytes 5 s later", b0, b1);
	IO_EQ(unlink(path), 0);
	cr_assert_eq(access(path, F_OK), -1);
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq(st.st_nlink, 0);
	/* Still readable and writable through the descriptor. */
	IO_EQ(pread_all(fd, got, len, 0), (ssize_t)len);
	cr_assert_eq(memcmp(got, buf, len), 0, "data of the unlinked file differs");
	IO_EQ(pwrite_all(fd, buf, 4096, (off_t)len), 4096);
	IO_EQ(pread_all(fd, got, 4096, (off_t)len), 4096);
	cr_assert_eq(memcmp(got, buf, 4096), 0);
	env_space(&b2, NULL);
	cr_assert_leq(b2 + 8 * MiB, b0, "space freed while the file is still open");
	IO_EQ(close(fd), 0);

	b2 = wait_free(b0, 20000);
	cr_assert_geq(b2, b0,
		      "free space not returned 20 s after the last close: %" PRIu64
		      " before the file, %" PRIu64 " now",
		      b0, b2);
#ifndef DATA_LOCAL
	{
		long rc, o;

		cr_assert(wait_no_reclaim(20000, &rc, &o),
			  "etcd still holds %ld rc/ and %ld o/ keys 20 s after the last close",
			  rc, o);
	}
#endif
	free(buf);
	free(got);
	env_stop();
	efs_test_assert_no_leaks();
}

/* ==== killpriv ==== */

Test(data, killpriv)
{
	char path[PATH_MAX];
	struct stat st;
	int fd, s;
	pid_t kid;

	env_start(0, NULL);
	env_path(path, sizeof(path), "suid");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(fd, 0);
	IO_EQ(write(fd, "root data", 9), 9);
	close(fd);
	cr_assert_eq(chmod(env.root, 0777), 0);
	for (int mode = 0; mode < 2; mode++) { /* write, then truncate */
		cr_assert_eq(chmod(path, 06777), 0);
		cr_assert_eq(stat(path, &st), 0);
		cr_assert_eq(st.st_mode & 07777, 06777);
		kid = fork();
		cr_assert_geq(kid, 0);
		if (kid == 0) {
			int cfd;

			if (chdir(env.root) < 0 || setgroups(0, NULL) < 0 || setgid(65534) < 0 ||
			    setuid(65534) < 0)
				_exit(2);
			cfd = open("suid", O_WRONLY);
			if (cfd < 0)
				_exit(3);
			if (mode == 0 && pwrite(cfd, "user", 4, 2) != 4)
				_exit(4);
			if (mode == 1 && ftruncate(cfd, 3) < 0)
				_exit(5);
			_exit(close(cfd) == 0 ? 0 : 6);
		}
		cr_assert_eq(waitpid(kid, &s, 0), kid);
		cr_assert(WIFEXITED(s) && WEXITSTATUS(s) == 0, "%s as uid 65534 failed (step %d)",
			  mode ? "ftruncate" : "write", WEXITSTATUS(s));
		cr_assert_eq(stat(path, &st), 0);
		cr_assert_eq(st.st_mode & 07777, 0777,
			     "mode %04o after a %s by another user, expected 0777",
			     st.st_mode & 07777, mode ? "truncate" : "write");
	}
	env_remount();
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0777, "mode %04o after the restart", st.st_mode & 07777);
	env_stop();
	efs_test_assert_no_leaks();
}

/*
 * A write removes the file's capabilities (security.capability), as on any
 * Linux filesystem, for every writer, root too. Through the page cache the
 * kernel does it (a REMOVEXATTR before the write); a direct_io handle
 * (O_DIRECT, O_APPEND) leaves it to the daemon. Other xattrs stay.
 */
#define XATTR_TXNS "etcfs_etcd_txns_total{origin=\"xattr\",outcome=\"ok\"}"
#define RANGES	   "etcfs_etcd_rpc_seconds_count{method=\"Range\"}"

Test(data, writes_remove_file_capabilities)
{
	/* vfs_cap_data, revision 2, effective, CAP_NET_BIND_SERVICE. */
	static const uint8_t cap[20] = {0x01, 0x00, 0x00, 0x02, 0x00, 0x04};
	static const struct {
		const char *name;
		int flags;
	} how[] = {
		{"page-cache", O_WRONLY},
		{"direct", O_WRONLY | O_DIRECT},
		{"append", O_WRONLY | O_APPEND},
		{"append-direct", O_RDWR | O_APPEND | O_DIRECT},
	};
	char path[PATH_MAX], buf[64];
	void *blk = NULL;
	double txns, ranges;
	int fd;

	env_start(0, NULL);
	cr_assert_eq(posix_memalign(&blk, 4096, 4096), 0);
	memset(blk, 'w', 4096);
	for (size_t i = 0; i < sizeof(how) / sizeof(how[0]); i++) {
		env_path(path, sizeof(path), how[i].name);
		fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0755);
		cr_assert_geq(fd, 0);
		IO_EQ(pwrite(fd, blk, 4096, 0), 4096);
		IO_EQ(close(fd), 0);
		IO_EQ(setxattr(path, "security.capability", cap, sizeof(cap), 0), 0);
		IO_EQ(setxattr(path, "user.keep", "k", 1, 0), 0);
		IO_EQ(getxattr(path, "security.capability", buf, sizeof(buf)), (ssize_t)sizeof(cap));
		/* Opening is not writing: the capability stays. */
		fd = open(path, how[i].flags);
		cr_assert_geq(fd, 0, "open %s: %s", how[i].name, strerror(errno));
		IO_EQ(getxattr(path, "security.capability", buf, sizeof(buf)), (ssize_t)sizeof(cap));
		txns = efs_test_fs_metric(&env.f, XATTR_TXNS);
		IO_EQ(pwrite(fd, blk, 4096, 0), 4096);
		cr_assert(getxattr(path, "security.capability", buf, sizeof(buf)) < 0 &&
				  errno == ENODATA,
			  "%s write: security.capability is still there", how[i].name);
		IO_EQ(getxattr(path, "user.keep", buf, sizeof(buf)), 1);
		/* The next writes have nothing to remove, and know it without
		 * asking etcd (20 writes, a read each if they asked). */
		ranges = efs_test_fs_metric(&env.f, RANGES);
		for (int w = 0; w < 20; w++)
			IO_EQ(pwrite(fd, blk, 4096, 4096), 4096);
		cr_assert_lt(efs_test_fs_metric(&env.f, RANGES) - ranges, 5,
			     "%s: %.0f etcd reads for 20 writes", how[i].name,
			     efs_test_fs_metric(&env.f, RANGES) - ranges);
		IO_EQ(close(fd), 0);
		cr_assert_eq(efs_test_fs_metric(&env.f, XATTR_TXNS) - txns, 1,
			     "%s: %.0f xattr commits for two writes, expected the one removal",
			     how[i].name, efs_test_fs_metric(&env.f, XATTR_TXNS) - txns);
	}
	env_remount();
	for (size_t i = 0; i < sizeof(how) / sizeof(how[0]); i++) {
		struct stat st;

		env_path(path, sizeof(path), how[i].name);
		cr_assert(getxattr(path, "security.capability", buf, sizeof(buf)) < 0 &&
				  errno == ENODATA,
			  "%s: security.capability is back after a remount", how[i].name);
		IO_EQ(getxattr(path, "user.keep", buf, sizeof(buf)), 1);
		cr_assert_eq(stat(path, &st), 0);
		cr_assert_eq(st.st_size, how[i].flags & O_APPEND ? 22 * 4096 : 2 * 4096,
			     "%s: size %lld", how[i].name, (long long)st.st_size);
	}
	free(blk);
	env_stop();
	efs_test_assert_no_leaks();
}

/* ==== enospc ==== */

static void fill_file(int fd, const uint8_t *pat, size_t chunk, uint64_t *size)
{
	for (;;) {
		ssize_t n = pwrite(fd, pat + (*size % MiB), chunk, (off_t)*size);

		if (n < 0) {
			cr_assert_eq(errno, ENOSPC, "filling: %s at %" PRIu64 ", expected ENOSPC",
				     strerror(errno), *size);
			return;
		}
		cr_assert_gt(n, 0);
		*size += (uint64_t)n;
	}
}

Test(data, enospc)
{
	char pbig[PATH_MAX], pother[PATH_MAX], pvic[PATH_MAX];
	uint64_t free0, avail0, bfree, bavail, size = 0, r = 11;
	uint8_t *pat, *got;
	struct stat st;
	int big, other, vic;

	env_start(96ull << 20, NULL);
	pat = malloc(2 * MiB);
	got = malloc(2 * MiB);
	cr_assert(pat && got);
	rnd_fill(&r, pat, 2 * MiB);
	env_space(&free0, &avail0);
	cr_assert_gt(avail0, 48 * MiB, "a 96 MiB device has only %" PRIu64 " bytes available",
		     avail0);

	env_path(pother, sizeof(pother), "other");
	env_path(pvic, sizeof(pvic), "victim");
	env_path(pbig, sizeof(pbig), "big");
	other = open(pother, O_RDWR | O_CREAT | O_EXCL, 0644);
	vic = open(pvic, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert(other >= 0 && vic >= 0);
	for (int i = 0; i < 8; i++) {
		IO_EQ(pwrite_all(other, pat, MiB, (off_t)i * MiB), (ssize_t)MiB);
		IO_EQ(pwrite_all(vic, pat, MiB, (off_t)i * MiB), (ssize_t)MiB);
	}
	IO_EQ(fsync(other), 0);
	IO_EQ(fsync(vic), 0);
	close(other);

	big = open(pbig, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(big, 0);
	fill_file(big, pat, MiB, &size);
	fill_file(big, pat, 4096, &size);
	fill_file(big, pat, 1, &size);
	cr_assert_eq(fsync(big), 0, "fsync after ENOSPC: %s%s", strerror(errno), env_why());
	cr_assert_eq(fstat(big, &st), 0);
	cr_assert_eq((uint64_t)st.st_size, size,
		     "after ENOSPC the size is %jd, the writes reported %" PRIu64,
		     (intmax_t)st.st_size, size);
	cr_assert_gt(size, 30 * MiB, "ENOSPC after only %" PRIu64 " bytes", size);
	env_space(&bfree, &bavail);
	cr_assert_lt(bavail, 256 * 1024,
		     "full: statfs still shows %" PRIu64 " bytes available (%" PRIu64 " free)",
		     bavail, bfree);
	/* The content up to the size is what was written. */
	for (uint64_t off = 0; off < size; off += MiB) {
		size_t n = size - off < MiB ? (size_t)(size - off) : MiB;

		IO_EQ(pread_all(big, got, n, (off_t)off), (ssize_t)n);
		cr_assert_eq(memcmp(got, pat + (off % MiB), n), 0,
			     "the full file differs in [%" PRIu64 ", +%zu)", off, n);
	}

	/* The reserve: overwriting written blocks of a full filesystem works. */
	rnd_fill(&r, pat + MiB, MiB);
	cr_assert_eq(pwrite_all(vic, pat + MiB, MiB, MiB), (ssize_t)MiB,
		     "overwrite on a full filesystem: %s", strerror(errno));
	cr_assert_eq(pwrite_all(vic, pat + MiB, 5000, 3 * MiB + 1000), 5000,
		     "unaligned overwrite on a full filesystem: %s", strerror(errno));
	cr_assert_eq(fsync(vic), 0, "fsync of an overwrite on a full filesystem: %s",
		     strerror(errno));
	IO_EQ(pread_all(vic, got, MiB, MiB), (ssize_t)MiB);
	cr_assert_eq(memcmp(got, pat + MiB, MiB), 0, "overwrite on a full filesystem differs");
	IO_EQ(pread_all(vic, got, 5000, 3 * MiB + 1000), 5000);
	cr_assert_eq(memcmp(got, pat + MiB, 5000), 0);

	/* Deleting works and gives the space back. */
	cr_assert_eq(unlink(pother), 0, "unlink on a full filesystem: %s", strerror(errno));
	env_space(NULL, &bavail);
	{
		uint64_t end = mono_ms() + 20000;

		while (bavail < 7 * MiB && mono_ms() < end) {
			nap_ms(100);
			env_space(NULL, &bavail);
		}
	}
	cr_assert_geq(bavail, 7 * MiB, "only %" PRIu64 " bytes available after deleting 8 MiB",
		      bavail);
	cr_assert_eq(pwrite_all(big, pat, MiB, (off_t)size), (ssize_t)MiB,
		     "write after a delete freed space: %s", strerror(errno));
	IO_EQ(fsync(big), 0);
	close(big);
	close(vic);

	IO_EQ(unlink(pbig), 0);
	IO_EQ(unlink(pvic), 0);
	bfree = wait_free(free0, 20000);
	cr_assert_eq(bfree, free0,
		     "free space after deleting everything: %" PRIu64 ", at mkfs %" PRIu64, bfree,
		     free0);
	env_remount();
	env_space(&bfree, NULL);
	cr_assert_eq(bfree, free0, "free space after the restart: %" PRIu64 ", at mkfs %" PRIu64,
		     bfree, free0);
	free(pat);
	free(got);
	env_stop();
	efs_test_assert_no_leaks();
}

/* ==== dev_error (etcfs with fault hooks) ==== */

#if !defined(DATA_LOCAL) && EFS_FAULT_HOOKS
Test(data, dev_error)
{
	char good[PATH_MAX], bad[PATH_MAX], buf[65536], got[65536];
	uint64_t r = 3;
	bool eio = false;
	struct stat st;
	int fd;

	env_start(0, NULL);
	rnd_fill(&r, buf, sizeof(buf));
	env_path(good, sizeof(good), "good");
	env_path(bad, sizeof(bad), "bad");
	fd = open(good, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(fd, 0);
	IO_EQ(pwrite_all(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	IO_EQ(fsync(fd), 0);
	close(fd);

	/* Every device write fails from the mount on (reads go on). */
	cr_assert_eq(chdir("/"), 0);
	efs_test_fs_unmount(&env.f);
	cr_assert_eq(setenv("ETCFS_FAULT_DEV", "write:0:5", 1), 0);
	efs_test_fs_mount(&env.f, NULL);
	unsetenv("ETCFS_FAULT_DEV");

	fd = open(bad, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(fd, 0, "create with a failing device: %s", strerror(errno));
	for (int i = 0; i < 4 && !eio; i++) {
		ssize_t n = pwrite(fd, buf, sizeof(buf), (off_t)i * (off_t)sizeof(buf));

		if (n < 0) {
			cr_assert_eq(errno, EIO, "write to a failing device: %s, expected EIO",
				     strerror(errno));
			eio = true;
		}
	}
	if (!eio) {
		int e = fsync(fd) < 0 ? errno : 0;

		cr_assert_eq(e, EIO, "fsync after writes to a failing device: %s, expected EIO",
			     e ? strerror(e) : "success");
		eio = true;
	}
	close(fd);
	/* Overwriting the good file fails too, and leaves its data intact. */
	fd = open(good, O_RDWR);
	cr_assert_geq(fd, 0);
	{
		ssize_t n = pwrite(fd, buf + 1, 4096, 0);
		int e = n < 0 ? errno : (fsync(fd) < 0 ? errno : 0);

		cr_assert_eq(e, EIO, "overwrite on a failing device: %s, expected EIO",
			     e ? strerror(e) : "success");
	}
	close(fd);
	/* The mount stays up: stat, readdir, reads of other data. */
	cr_assert_eq(stat(good, &st), 0, "stat after a device error: %s", strerror(errno));
	cr_assert_eq(st.st_size, (off_t)sizeof(buf));
	fd = open(good, O_RDONLY);
	cr_assert_geq(fd, 0, "open after a device error: %s", strerror(errno));
	cr_assert_eq(pread_all(fd, got, sizeof(got), 0), (ssize_t)sizeof(got),
		     "read after a device error: %s", strerror(errno));
	cr_assert_eq(memcmp(got, buf, sizeof(buf)), 0, "data of the good file changed");
	close(fd);
	{
		DIR *d = opendir(env.root);

		cr_assert_not_null(d, "opendir after a device error: %s", strerror(errno));
		closedir(d);
	}
	efs_test_fs_unmount(&env.f);
	/* And without the fault, the file system is whole. */
	efs_test_fs_mount(&env.f, NULL);
	fd = open(good, O_RDONLY);
	cr_assert_geq(fd, 0);
	IO_EQ(pread_all(fd, got, sizeof(got), 0), (ssize_t)sizeof(got));
	cr_assert_eq(memcmp(got, buf, sizeof(buf)), 0, "good file after the remount");
	close(fd);
	cr_assert_eq(chdir("/"), 0);
	efs_test_fs_unmount(&env.f);
	{
		char out[8192];
		int rc = run_fsck(out, sizeof(out));

		cr_assert_eq(rc, 0, "fsck after device errors: exit %d\n%s", rc, out);
	}
	env_stop();
	efs_test_assert_no_leaks();
}
#endif

/* ==== unsettled_drop (etcfs with fault hooks) ==== */

#if !defined(DATA_LOCAL) && EFS_FAULT_HOOKS
/*
 * The first publication transaction's reply is lost (etcd applies it) and
 * its outcome stays unknown to the data path: the state is discarded.
 * Unlinking the file then drops the inode: the blocks of that publication
 * may be extents in etcd (the reclaim record frees them), so they must not
 * go back to the allocator as unpublished, or the next file written could
 * get them and the reclaim free them under it: fsck would find blocks free
 * in their map and used by an extent.
 *
 * This passes without the data path's guard (efs_file_pub_release) too: the
 * discarded state is freed as soon as it is idle, before the drop, and the
 * allocator allocates nothing from a group whose map an unknown outcome
 * made stale until it re-read it. It keeps the whole sequence covered.
 */
Test(data, unsettled_drop)
{
	const size_t len = MiB;
	char pa[PATH_MAX], pb[PATH_MAX], out[16384];
	uint8_t *buf, *got;
	uint64_t r = 11;
	long rc, o;
	int fa, fb, e, st;

	env_start(0, NULL);
	buf = malloc(len);
	got = malloc(len);
	cr_assert(buf && got);
	rnd_fill(&r, buf, len);
	cr_assert_eq(chdir("/"), 0);
	efs_test_fs_unmount(&env.f);
	cr_assert_eq(setenv("ETCFS_FAULT_PUB_UNSETTLED", "1", 1), 0);
	efs_test_fs_mount(&env.f, NULL);
	unsetenv("ETCFS_FAULT_PUB_UNSETTLED");

	env_path(pa, sizeof(pa), "a");
	env_path(pb, sizeof(pb), "b");
	/* b exists before a is dropped, so that its first write follows the
	 * drop at once (a create is no publication). */
	fb = open(pb, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(fb, 0, "create b: %s", strerror(errno));
	fa = open(pa, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(fa, 0, "create a: %s", strerror(errno));
	IO_EQ(pwrite_all(fa, buf, len, 0), (ssize_t)len);
	/* Publication #1 carries a's data: its reply is dropped and its
	 * outcome never settles, so the fsync cannot succeed. */
	e = fsync(fa) < 0 ? errno : 0;
	cr_assert_eq(e, EIO, "fsync of a publication left unsettled: %s, expected EIO",
		     e ? strerror(e) : "success");
	close(fa);
	IO_EQ(unlink(pa), 0);
	IO_EQ(pwrite_all(fb, buf, len, 0), (ssize_t)len);
	IO_EQ(fsync(fb), 0);
	close(fb);
	cr_assert(wait_no_reclaim(20000, &rc, &o),
		  "etcd still holds %ld rc/ and %ld o/ keys 20 s after the unlink", rc, o);

	cr_assert_eq(chdir("/"), 0);
	efs_test_fs_unmount(&env.f);
	st = run_fsck(out, sizeof(out));
	cr_assert_eq(st, 0, "fsck after an unsettled publication and a drop: exit %d\n%s", st,
		     out);
	cr_assert_null(strstr(out, "double free"), "fsck reports a double free:\n%s", out);
	/* b's data survived (its blocks are its own). */
	efs_test_fs_mount(&env.f, NULL);
	fb = open(pb, O_RDONLY);
	cr_assert_geq(fb, 0, "open b after the remount: %s", strerror(errno));
	IO_EQ(pread_all(fb, got, len, 0), (ssize_t)len);
	cr_assert_eq(memcmp(got, buf, len), 0, "data of b after the remount");
	close(fb);
	free(buf);
	free(got);
	env_stop();
	efs_test_assert_no_leaks();
}
#endif

#ifndef DATA_LOCAL
/* Unmounts (etcfsd must exit 0: under ASan, no report) and runs fsck: no
 * block both free and used, none leaked, no double free. */
static void unmount_fsck_clean(const char *when)
{
	char out[16384];
	int st;

	cr_assert_eq(chdir("/"), 0);
	efs_test_fs_unmount(&env.f);
	st = run_fsck(out, sizeof(out));
	cr_assert_eq(st, 0, "fsck %s: exit %d\n%s", when, st, out);
	cr_assert_null(strstr(out, "double free"), "fsck %s reports a double free:\n%s", when, out);
}

static uint8_t *blk_alloc(size_t n)
{
	void *p = NULL;

	cr_assert_eq(posix_memalign(&p, BLK, n * BLK), 0);
	return p;
}
#endif

/* ==== mem_map, mem_settle: allocation failures (etcfs with fault hooks) ==== */

#if !defined(DATA_LOCAL) && EFS_FAULT_HOOKS
/* How many lines of the daemon's log (all its mounts) contain |what|. */
static int log_lines(const char *what)
{
	FILE *f = fopen(env.f.log, "r");
	char line[1024];
	int n = 0;

	cr_assert_not_null(f, "open %s: %s", env.f.log, strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (strstr(line, what))
			n++;
	fclose(f);
	return n;
}

/* The path of file m<i> of the mapping sweep. */
static const char *map_path(char *buf, size_t size, int i)
{
	char name[16];

	snprintf(name, sizeof(name), "m%d", i);
	return env_path(buf, size, name);
}

/* Mounts again with ETCFS_FAULT_MEM=|site| in etcfsd's environment. */
static void remount_fault_mem(const char *site)
{
	cr_assert_eq(chdir("/"), 0);
	efs_test_fs_unmount(&env.f);
	cr_assert_eq(setenv("ETCFS_FAULT_MEM", site, 1), 0);
	efs_test_fs_mount(&env.f, NULL);
	unsetenv("ETCFS_FAULT_MEM");
}

#define MAP_FILES 64

/*
 * Failmalloc sweep over the mapping of a completed write (wb_apply): file
 * mN gets one block, written with O_DIRECT into a fresh file (an empty
 * map and no pending runs: the shape in which mapping needs memory), and
 * the Nth mapping fails from its Nth allocation on (ETCFS_FAULT_MEM=map),
 * until one runs through. A failed write may fail, but must not leave a
 * block mapped and unrecorded (published as used by nobody: fsck finds it
 * free and used) nor give back a mapped one: fsck is clean, every write
 * that succeeded reads back after a remount, a failed one reads as its
 * own data or zeros, never another file's.
 *
 * Fails without the room reserved before mapping (wb_apply ignoring the
 * pending list's insert failure).
 */
Test(data, mem_map)
{
	char path[PATH_MAX];
	bool ok[MAP_FILES] = {0};
	uint8_t *buf = blk_alloc(1), *got = blk_alloc(1);
	int n, nfail = 0, fd;

	env_start(0, NULL);
	remount_fault_mem("map");
	for (n = 0; n < MAP_FILES && !log_lines("map: sweep complete"); n++) {
		map_path(path, sizeof(path), n);
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0644);
		cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
		memset(buf, 'A' + n % 26, BLK);
		ok[n] = pwrite(fd, buf, BLK, 0) == (ssize_t)BLK;
		nfail += !ok[n];
		if (ok[n])
			IO_EQ(fsync(fd), 0);
		close(fd);
	}
	cr_assert(log_lines("map: sweep complete"),
		  "the sweep did not complete within %d writes", MAP_FILES);
	cr_assert_gt(nfail, 0, "no write failed: the sweep injected nothing");
	cr_assert(ok[n - 1], "the write that completed the sweep failed");
	unmount_fsck_clean("after the mapping sweep");

	efs_test_fs_mount(&env.f, NULL);
	for (int i = 0; i < n; i++) {
		ssize_t r;

		map_path(path, sizeof(path), i);
		fd = open(path, O_RDONLY);
		cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
		memset(buf, 'A' + i % 26, BLK);
		r = pread_all(fd, got, BLK, 0);
		close(fd);
		if (ok[i])
			cr_assert(r == BLK && memcmp(got, buf, BLK) == 0,
				  "m%d (its write succeeded): read %zd bytes, not its data", i, r);
		else
			cr_assert(r <= 0 || memcmp(got, buf, (size_t)r) == 0 || all_zero(got, (size_t)r),
				  "m%d (its write failed) holds bytes of another file", i);
	}
	unmount_fsck_clean("after the remount");
	free(buf);
	free(got);
	env_stop();
	efs_test_assert_no_leaks();
}

#define SETTLE_BLOCKS 16

/* Writes block |b| of |fd| (O_DIRECT) with |v| and records it in |model|. */
static void settle_write(int fd, uint8_t *buf, uint8_t *model, int b, uint8_t v)
{
	memset(buf, v, BLK);
	IO_EQ(pwrite(fd, buf, BLK, (off_t)b * BLK), (ssize_t)BLK);
	memset(model + (size_t)b * BLK, v, BLK);
}

/* Reads |path| back whole and compares it with |model| (|nb| blocks). */
static void settle_check(const char *path, const uint8_t *model, int nb, const char *when)
{
	uint8_t *got = malloc((size_t)nb * BLK);
	int fd = open(path, O_RDONLY);

	cr_assert(got && fd >= 0, "open %s %s: %s", path, when, strerror(errno));
	IO_EQ(pread_all(fd, got, (size_t)nb * BLK, 0), (ssize_t)nb * BLK);
	for (int b = 0; b < nb; b++)
		cr_assert_eq(memcmp(got + (size_t)b * BLK, model + (size_t)b * BLK, BLK), 0,
			     "%s block %d %s: not the data last written there", path, b, when);
	close(fd);
	free(got);
}

/*
 * A committed publication settles the inode's pending runs: its
 * allocations leave |apend|, its frees leave |fpend|. With every
 * allocation failing there (ETCFS_FAULT_MEM=settle), nothing may change:
 * snap_build reserved the room. The settle here removes 8 freed runs from
 * a list holding exactly 8 (the old blocks of the 8 odd blocks of a
 * contiguous file), where a removal without room needs memory; left in
 * |fpend|, those frees would be published again (a double free, or a free
 * of blocks given to another file since). Then more overwrites, another
 * file, the first one unlinked: every fsync succeeds, the data reads back
 * after a remount and fsck is clean.
 *
 * Fails without the room reserved by snap_build (the removals' failures
 * ignored). The flush interval is long so that only the fsyncs publish:
 * a sweep in the middle of the 8 overwrites would split them.
 */
Test(data, mem_settle)
{
	static const char *const margs[] = {"-o", "allow_other", "--flush-interval", "600000",
					    NULL};
	const size_t len = (size_t)SETTLE_BLOCKS * BLK;
	char pa[PATH_MAX], pb[PATH_MAX];
	uint8_t *buf = blk_alloc(SETTLE_BLOCKS), *ma = malloc(len), *mb = malloc(len);
	long rc, o;
	int fa, fb;

	cr_assert(ma && mb);
	env_start(0, margs);
	remount_fault_mem("settle");
	env_path(pa, sizeof(pa), "a");
	env_path(pb, sizeof(pb), "b");
	fa = open(pa, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0644);
	cr_assert_geq(fa, 0, "create a: %s", strerror(errno));
	memset(buf, 'a', len);
	memset(ma, 'a', len);
	IO_EQ(pwrite(fa, buf, len, 0), (ssize_t)len);
	IO_EQ(fsync(fa), 0);
	for (int b = 1; b < SETTLE_BLOCKS; b += 2)
		settle_write(fa, buf, ma, b, 'o');
	IO_EQ(fsync(fa), 0);
	/* Blocks freed by that commit may be allocated again now. */
	fb = open(pb, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0644);
	cr_assert_geq(fb, 0, "create b: %s", strerror(errno));
	for (int b = 0; b < SETTLE_BLOCKS; b++)
		settle_write(fb, buf, mb, b, (uint8_t)('B' + b));
	IO_EQ(fsync(fb), 0);
	for (int b = 0; b < SETTLE_BLOCKS; b += 2)
		settle_write(fa, buf, ma, b, 'e');
	IO_EQ(fsync(fa), 0);
	close(fa);
	close(fb);
	settle_check(pa, ma, SETTLE_BLOCKS, "before the remount");
	settle_check(pb, mb, SETTLE_BLOCKS, "before the remount");
	cr_assert_eq(log_lines("allocations fail in section 'settle'"), 1, "hook not armed");
	cr_assert_eq(log_lines("failed settling a publication"), 0,
		     "settling a committed publication tried to allocate");
	unmount_fsck_clean("after overwrites settled without memory");

	efs_test_fs_mount(&env.f, NULL);
	settle_check(pa, ma, SETTLE_BLOCKS, "after the remount");
	settle_check(pb, mb, SETTLE_BLOCKS, "after the remount");
	IO_EQ(unlink(pa), 0);
	cr_assert(wait_no_reclaim(20000, &rc, &o),
		  "etcd still holds %ld rc/ and %ld o/ keys 20 s after the unlink", rc, o);
	settle_check(pb, mb, SETTLE_BLOCKS, "after a's reclaim");
	unmount_fsck_clean("after a's reclaim");
	free(buf);
	free(ma);
	free(mb);
	env_stop();
	efs_test_assert_no_leaks();
}
#endif

/* ==== atime_holder: only an exclusive holder writes atime ==== */

#ifndef DATA_LOCAL
/*
 * Relatime with releasable locks: a read on the node that holds the file
 * exclusive (it just wrote it) moves atime; after a remount the node holds
 * nothing, a read takes the lock shared, and atime stays, since writing it
 * would take the exclusive lock (a recall of every peer's shared lock on
 * each read). Fails on the old rule, which upgraded to write atime.
 */
Test(data, atime_holder)
{
	struct timespec ts[2] = {{1000000000, 0}, {0, UTIME_OMIT}};
	char path[PATH_MAX], b[16] = {0};
	struct stat st;
	int fd;

	env_start(0, NULL);
	env_path(path, sizeof(path), "f");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	IO_EQ(pwrite(fd, "0123456789", 10, 0), 10);
	IO_EQ(futimens(fd, ts), 0);
	/* Held exclusive: the read writes atime (relatime: atime <= mtime). */
	IO_EQ(pread(fd, b, sizeof(b), 0), 10);
	IO_EQ(fstat(fd, &st), 0);
	cr_assert_gt(st.st_atim.tv_sec, 1000000000, "a read under the exclusive lock did not "
		     "move atime");
	IO_EQ(futimens(fd, ts), 0);
	IO_EQ(fsync(fd), 0);
	IO_EQ(close(fd), 0);
	env_remount();
	fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "open: %s", strerror(errno));
	IO_EQ(pread(fd, b, sizeof(b), 0), 10);
	IO_EQ(close(fd), 0);
	nap_ms(300); /* an atime write would be asynchronous */
	IO_EQ(stat(path, &st), 0);
	cr_assert_eq(st.st_atim.tv_sec, 1000000000, "a read under a shared lock wrote atime "
		     "(%jd)", (intmax_t)st.st_atim.tv_sec);
	env_stop();
	efs_test_assert_no_leaks();
}
#endif

/* ==== every request counted once, answered once ==== */

#ifndef DATA_LOCAL
static double metric_of(const char *family, const char *op)
{
	char sample[128];

	snprintf(sample, sizeof(sample), "%s{op=\"%s\"}", family, op);
	return efs_test_fs_metric(&env.f, sample);
}

/*
 * Each kernel request is counted once when it arrives and its latency once
 * when it is answered, through the one reply place: after a workload that
 * takes the fast paths, the engine, the data path handing requests to the
 * engine, multi-step truncates and refused requests, every operation's
 * request count equals its latency count, and internal operations (the
 * publisher, atime, reclaim) count as no FUSE request at all.
 */
Test(data, every_request_counted_and_answered_once)
{
	static const char *const ops[] = {
		"lookup", "getattr", "setattr", "open", "read", "write", "flush", "release",
		"fsync", "create", "unlink", "mkdir", "rmdir", "opendir", "releasedir",
		"fallocate", "lseek", "copy_file_range", "statfs", "setxattr", "getxattr",
	};
	static const char *const internal[] = {"publish", "atime", "reclaim"};
	char path[PATH_MAX], path2[PATH_MAX], dir[PATH_MAX], buf[8192];
	struct statvfs sv;
	struct stat st;
	uint64_t end;
	bool equal = false;
	int fd, fd2, ro;

	env_start(0, NULL);
	env_path(path, sizeof(path), "f");
	env_path(path2, sizeof(path2), "g");
	env_path(dir, sizeof(dir), "d");
	IO_EQ(mkdir(dir, 0755), 0);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	memset(buf, 'x', sizeof(buf));
	for (int i = 0; i < 64; i++)
		IO_EQ(pwrite(fd, buf, sizeof(buf), (off_t)i * 65536), (ssize_t)sizeof(buf));
	IO_EQ(fsync(fd), 0);
	IO_EQ(ftruncate(fd, 3 * 65536 + 100), 0); /* a truncate in steps */
	IO_EQ(fallocate(fd, 0, 0, 1 << 20), 0);
	IO_EQ(lseek(fd, 0, SEEK_DATA), 0);
	IO_EQ(pread(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	fd2 = open(path2, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd2, 0, "create: %s", strerror(errno));
	IO_EQ(copy_file_range(fd, NULL, fd2, NULL, 65536, 0), 65536);
	IO_EQ(fstat(fd, &st), 0);
	IO_EQ(fchmod(fd, 0600), 0);
	IO_EQ(setxattr(path, "user.k", "v", 1, 0), 0);
	IO_EQ(getxattr(path, "user.k", buf, sizeof(buf)), 1);
	IO_EQ(statvfs(path, &sv), 0);
	/* Failed requests, counted as errors: one the data path answers,
	 * one the engine does. */
	ro = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(ro, 0);
	cr_assert(lseek(ro, 100 << 20, SEEK_DATA) < 0 && errno == ENXIO);
	cr_assert(getxattr(path, "user.none", buf, sizeof(buf)) < 0 && errno == ENODATA);
	cr_assert(stat(dir, &st) == 0 && rmdir(dir) == 0);
	cr_assert(stat(dir, &st) < 0 && errno == ENOENT);
	IO_EQ(close(ro), 0);
	IO_EQ(close(fd2), 0);
	IO_EQ(close(fd), 0);
	IO_EQ(unlink(path2), 0);
	{
		DIR *dp = opendir(env.root);

		cr_assert_not_null(dp);
		while (readdir(dp))
			;
		closedir(dp);
	}
	/* Releases are answered after close returns: wait for the counts. */
	end = mono_ms() + 5000;
	while (!equal && mono_ms() < end) {
		equal = true;
		for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]) && equal; i++)
			equal = metric_of("etcfs_fuse_ops_total", ops[i]) ==
				metric_of("etcfs_fuse_op_seconds_count", ops[i]);
		if (!equal)
			nap_ms(50);
	}
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		double n = metric_of("etcfs_fuse_ops_total", ops[i]);
		double t = metric_of("etcfs_fuse_op_seconds_count", ops[i]);

		cr_assert_gt(n, 0, "no %s request was counted", ops[i]);
		cr_assert_eq(n, t, "%s: %.0f requests counted, %.0f latencies recorded", ops[i], n,
			     t);
	}
	cr_assert_geq(metric_of("etcfs_fuse_errors_total", "lseek"), 1);
	cr_assert_geq(metric_of("etcfs_fuse_errors_total", "getxattr"), 1);
	for (size_t i = 0; i < sizeof(internal) / sizeof(internal[0]); i++)
		cr_assert_eq(metric_of("etcfs_fuse_ops_total", internal[i]), 0,
			     "internal %s operations counted as FUSE requests", internal[i]);
	env_stop();
	efs_test_assert_no_leaks();
}
#endif

/* ==== recall: locks force-released under a write load (fault hooks) ==== */

#if !defined(DATA_LOCAL) && EFS_FAULT_HOOKS
/*
 * ETCFS_FAULT_RECALL makes the daemon force-release (or downgrade) the
 * exclusive lock of every file it writes every 1..15 ms, through the entry
 * point a peer's recall calls, while the model run goes on (buffered and
 * O_DIRECT writes in flight, truncates, punches, shared mmap writes with
 * dirty pages, fsyncs) and an O_APPEND writer appends numbered records to
 * another file. Each release publishes the file's state first and the
 * next operation takes the lock anew and reloads it from etcd: the model
 * must read back exactly, before and after a remount, and every record
 * must be there once, in order. Negative control: a lock ops sync that
 * publishes nothing makes the first read after a release miss writes.
 */
#define RECALL_NOPS 2000
#define REC_MAX	    9000

static struct appender {
	char path[PATH_MAX];
	pthread_t th;
	int n;	 /* records written */
	int err; /* errno of a failure */
	atomic_bool stop;
} app;

static size_t rec_len(int i)
{
	return 1 + (size_t)(((uint32_t)i * 2654435761u) % REC_MAX);
}

static void rec_fill(int i, uint8_t *buf, size_t len)
{
	uint64_t s = 0x5eed0000u + (uint64_t)i;

	rnd_fill(&s, buf, len);
}

static void *append_main(void *arg)
{
	int fd = open(app.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	uint8_t *buf = malloc(REC_MAX);

	(void)arg;
	if (fd < 0 || !buf) {
		app.err = fd < 0 ? errno : ENOMEM;
		free(buf);
		return NULL;
	}
	while (!atomic_load(&app.stop) && app.n < 50000) {
		size_t len = rec_len(app.n);
		ssize_t w;

		rec_fill(app.n, buf, len);
		w = write(fd, buf, len);
		if (w != (ssize_t)len) {
			app.err = w < 0 ? errno : EIO;
			break;
		}
		app.n++;
		if (app.n % 64 == 0 && fsync(fd) < 0) {
			app.err = errno;
			break;
		}
	}
	if (close(fd) < 0 && !app.err)
		app.err = errno;
	free(buf);
	return NULL;
}

/* The appended file holds records 0..n-1, each once, in order. */
static void check_appended(const char *when)
{
	uint8_t *want = malloc(REC_MAX), *got = malloc(REC_MAX);
	uint64_t off = 0;
	struct stat st;
	int fd = open(app.path, O_RDONLY | O_CLOEXEC);

	cr_assert(want && got);
	cr_assert_geq(fd, 0, "open %s %s: %s", app.path, when, strerror(errno));
	for (int i = 0; i < app.n; i++) {
		size_t len = rec_len(i);

		rec_fill(i, want, len);
		IO_EQ(pread_all(fd, got, len, (off_t)off), (ssize_t)len);
		cr_assert_eq(memcmp(got, want, len), 0,
			     "appended record %d of %d at offset %" PRIu64 " differs %s", i,
			     app.n, off, when);
		off += len;
	}
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq((uint64_t)st.st_size, off, "appended file: size %jd, records end at %" PRIu64
		     " %s", (intmax_t)st.st_size, off, when);
	close(fd);
	free(want);
	free(got);
}

/* Before the remount: the appender stops, its file is checked, and the
 * forced releases are shown to have happened. */
static void recall_quiesce(void)
{
	double forced = 0, preps = 0;
	uint64_t end = mono_ms() + 5000;

	atomic_store(&app.stop, true);
	cr_assert_eq(pthread_join(app.th, NULL), 0);
	cr_assert_eq(app.err, 0, "O_APPEND writer after %d records: %s", app.n,
		     strerror(app.err));
	cr_assert_gt(app.n, 0, "the O_APPEND writer wrote nothing");
	check_appended("under forced releases");
	/* The daemon copies its lock counters into the registry every tick. */
	do {
		forced = efs_test_fs_metric(&env.f, "etcfs_lock_forced_total");
		preps = efs_test_fs_metric(&env.f, "etcfs_lock_preps_total");
		if (forced >= 20)
			break;
		nap_ms(100);
	} while (mono_ms() < end);
	cr_assert_geq(forced, 20, "only %.0f forced releases happened (preps %.0f)", forced,
		      preps);
	/* Releases run their preparations; one may serve several forced
	 * releases (waits for one inode coalesce, a release that rides its
	 * publication needs no second preparation, and a prepared downgrade
	 * stays valid while only reads use the lock), so fewer preparations
	 * than forced releases is right, but not far fewer. */
	cr_assert_geq(preps * 4, forced, "releases without a preparation: %.0f preps, %.0f forced",
		      preps, forced);
	cr_log_info("recall: %.0f forced releases, %.0f preparations, %d appended records",
		    forced, preps, app.n);
}

/*
 * Times set while the lock may be draining: each round dirties the file
 * (a write: pending mtime), sets both times with futimens and reads them
 * back, then once more after a release is likely to have published.
 * Catches a setattr that a drain lets through the engine while pending
 * fields of the data state later put the old times back.
 */
static void times_under_recall(void)
{
	char path[PATH_MAX];
	struct stat st;
	int fd;

	env_path(path, sizeof(path), "times");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
	for (int i = 0; i < 400; i++) {
		struct timespec ts[2] = {{1000000000 + i, 0}, {1100000000 + i, 0}};

		IO_EQ(pwrite(fd, "x", 1, (off_t)i), 1);
		IO_EQ(futimens(fd, ts), 0);
		IO_EQ(fstat(fd, &st), 0);
		cr_assert(st.st_mtim.tv_sec == ts[1].tv_sec && st.st_atim.tv_sec == ts[0].tv_sec,
			  "round %d: times %jd/%jd after futimens, expected %jd/%jd", i,
			  (intmax_t)st.st_atim.tv_sec, (intmax_t)st.st_mtim.tv_sec,
			  (intmax_t)ts[0].tv_sec, (intmax_t)ts[1].tv_sec);
		if (i % 16 == 15) {
			nap_ms(20); /* a forced release publishes meanwhile */
			IO_EQ(stat(path, &st), 0);
			cr_assert_eq(st.st_mtim.tv_sec, ts[1].tv_sec,
				     "round %d: mtime %jd after a release, expected %jd", i,
				     (intmax_t)st.st_mtim.tv_sec, (intmax_t)ts[1].tv_sec);
		}
	}
	IO_EQ(close(fd), 0);
}

/*
 * Names changed while directory locks are force-released too: each round
 * creates a name, looks it up, renames it, looks up both names (one now
 * absent: a negative entry), and unlinks it. Every answer must match what
 * the round did: a stale entry the kernel kept past a release, or a request
 * a release held back for good (the kernel holds the directory's lock while
 * it waits), shows as a wrong answer or a hang.
 */
static void names_under_recall(void)
{
	char dir[PATH_MAX], a[PATH_MAX + 16], b[PATH_MAX + 16];
	struct stat st;
	int fd;

	env_path(dir, sizeof(dir), "names");
	IO_EQ(mkdir(dir, 0755), 0);
	for (int i = 0; i < 300; i++) {
		snprintf(a, sizeof(a), "%s/a%d", dir, i % 7);
		snprintf(b, sizeof(b), "%s/b%d", dir, i % 7);
		cr_assert(stat(a, &st) < 0 && errno == ENOENT, "round %d: %s exists before its "
			  "create", i, a);
		fd = open(a, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		cr_assert_geq(fd, 0, "round %d: create %s: %s", i, a, strerror(errno));
		IO_EQ(close(fd), 0);
		IO_EQ(stat(a, &st), 0);
		IO_EQ(rename(a, b), 0);
		cr_assert(stat(a, &st) < 0 && errno == ENOENT, "round %d: %s still there after "
			  "its rename", i, a);
		IO_EQ(stat(b, &st), 0);
		IO_EQ(unlink(b), 0);
		cr_assert(stat(b, &st) < 0 && errno == ENOENT, "round %d: %s still there after "
			  "its unlink", i, b);
		if (i % 50 == 49)
			nap_ms(30); /* a release of the directory meanwhile */
	}
	IO_EQ(rmdir(dir), 0);
}

/* The fs's count of FUSE requests of |op|. */
static double op_count(const char *op)
{
	char sample[96];

	snprintf(sample, sizeof(sample), "etcfs_fuse_ops_total{op=\"%s\"}", op);
	return efs_test_fs_metric(&env.f, sample);
}

/*
 * A forced release (or downgrade) of a file written since its last
 * publication publishes and gives the lock up in one transaction: counted
 * by etcfs_lock_releases_in_publication_total, with the data there after
 * a remount. The flush interval is long, so only the release publishes.
 * Negative control: with efs_lock_release_in_txn answering 0, the count
 * stays put.
 */
Test(data, release_rides_its_publication)
{
	static const char *const args[] = {"-o", "allow_other", "--flush-interval", "600000",
					   NULL};
	static const char to[2] = {'0', '1'};
	char path[PATH_MAX], b[8192], want[8192];
	struct stat st;
	int fd;

	env_start(0, args);
	env_path(path, sizeof(path), "f");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	for (int i = 0; i < 2; i++) {
		double in0 = efs_test_fs_metric(&env.f, "etcfs_lock_releases_in_publication_total");
		double f0 = efs_test_fs_metric(&env.f, "etcfs_lock_forced_total");
		double in1 = in0;

		memset(want + i * 4096, 'a' + i, 4096);
		IO_EQ(pwrite(fd, want + i * 4096, 4096, i * 4096), 4096);
		IO_EQ(setxattr(path, "user.etcfs.fault.release", &to[i], 1, 0), 0);
		for (int k = 0; k < 500; k++) {
			if (efs_test_fs_metric(&env.f, "etcfs_lock_forced_total") > f0)
				break;
			nap_ms(10);
		}
		cr_assert_gt(efs_test_fs_metric(&env.f, "etcfs_lock_forced_total"), f0,
			     "the forced release (to %c) never ended", to[i]);
		in1 = efs_test_fs_metric(&env.f, "etcfs_lock_releases_in_publication_total");
		cr_assert_eq(in1, in0 + 1, "the %s did not ride its publication (%.0f -> %.0f)",
			     i ? "downgrade" : "release", in0, in1);
	}
	IO_EQ(close(fd), 0);
	env_remount();
	IO_EQ(stat(path, &st), 0);
	cr_assert_eq(st.st_size, 8192);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "open: %s", strerror(errno));
	IO_EQ(pread(fd, b, sizeof(b), 0), 8192);
	cr_assert(memcmp(b, want, sizeof(b)) == 0, "the published data differs");
	IO_EQ(close(fd), 0);
	env_stop();
	efs_test_assert_no_leaks();
}

/*
 * A forced release of a directory's lock drops what the kernel caches
 * under it: its attributes and every name it looked up, positive and
 * negative (the directory inode's own invalidation would not drop those).
 * Observed through the lookups the kernel sends again: none while the
 * entries are cached, one per name after the release. The entry timeout
 * is 1 s, so a round counts only if it ran well within it. Negative
 * control: without the directory's lock ops, no lookup comes after the
 * release.
 */
Test(data, dir_release_drops_kernel_entries)
{
	char dir[PATH_MAX], x[PATH_MAX + 8], y[PATH_MAX + 8];
	double l0, l1, l2, forced0;
	struct stat st;
	bool seen = false;
	int fd;

	env_start(0, NULL);
	env_path(dir, sizeof(dir), "d");
	IO_EQ(mkdir(dir, 0755), 0);
	snprintf(x, sizeof(x), "%s/x", dir);
	snprintf(y, sizeof(y), "%s/y", dir);
	fd = open(y, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create %s: %s", y, strerror(errno));
	IO_EQ(close(fd), 0);
	for (int round = 0; round < 20 && !seen; round++) {
		uint64_t t0;

		nap_ms(1200); /* every earlier entry timed out */
		t0 = mono_ms();
		cr_assert(stat(x, &st) < 0 && errno == ENOENT);
		IO_EQ(stat(y, &st), 0);
		l0 = op_count("lookup");
		cr_assert(stat(x, &st) < 0 && errno == ENOENT);
		IO_EQ(stat(y, &st), 0);
		l1 = op_count("lookup");
		if (l1 != l0 || mono_ms() - t0 > 300)
			continue; /* not cached, or too slow to tell */
		forced0 = efs_test_fs_metric(&env.f, "etcfs_lock_forced_total");
		IO_EQ(setxattr(dir, "user.etcfs.fault.release", "0", 1, 0), 0);
		/* The invalidations run before the release's transaction. */
		for (int i = 0; i < 40; i++) {
			if (efs_test_fs_metric(&env.f, "etcfs_lock_forced_total") > forced0)
				break;
			nap_ms(10);
		}
		cr_assert(stat(x, &st) < 0 && errno == ENOENT);
		IO_EQ(stat(y, &st), 0);
		l2 = op_count("lookup");
		if (mono_ms() - t0 > 700)
			continue; /* the entries might have timed out by themselves */
		cr_assert_geq(l2, l1 + 2, "after a forced release of the directory the kernel "
			      "still answered from its entries (%.0f lookups before, %.0f after)",
			      l1, l2);
		seen = true;
	}
	cr_assert(seen, "no round ran within the entry timeout");
	env_stop();
	efs_test_assert_no_leaks();
}

static void force_release(const char *path);

/*
 * Before Linux 6.16 the kernel applies a SETATTR reply without the version
 * check that drops a reply older than an invalidation; such a reply can
 * land after our release invalidated, so there it carries no attribute
 * timeout and the next stat asks us. From 6.16 on the kernel gives such a
 * late reply no timeout itself, so the reply keeps ours: the stat after a
 * chmod is the kernel's, and after a release of the lock (whose
 * invalidation ends what the kernel cached) the next stat asks us again.
 * A GETATTR reply is versioned and keeps its timeout. Each round runs
 * within the timeout, or is not counted.
 */
Test(data, setattr_replies_keep_a_timeout_only_where_the_kernel_versions_them)
{
	char path[PATH_MAX];
	struct utsname u;
	struct stat st;
	double g0, g1, g2, g3;
	bool seen = false, versioned;
	int fd;

	cr_assert_eq(uname(&u), 0);
	versioned = efs_fs_kernel_versions_setattr(u.release);
	env_start(0, NULL);
	env_path(path, sizeof(path), "f");
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
	IO_EQ(close(fd), 0);
	for (int round = 0; round < 20 && !seen; round++) {
		mode_t want = round % 2 ? 0600 : 0640;
		uint64_t t0 = mono_ms();

		IO_EQ(chmod(path, want), 0);
		g0 = op_count("getattr");
		IO_EQ(stat(path, &st), 0);
		g1 = op_count("getattr");
		IO_EQ(stat(path, &st), 0);
		g2 = op_count("getattr");
		if (mono_ms() - t0 > 300)
			continue; /* slower than the timeout: proves nothing */
		cr_assert_eq(st.st_mode & 0777, want);
		if (versioned) {
			cr_assert_eq(g1, g0, "kernel %s: the stat after a chmod asked the daemon "
				     "(the SETATTR reply had no timeout)", u.release);
			force_release(path);
			IO_EQ(stat(path, &st), 0);
			g3 = op_count("getattr");
			cr_assert_eq(st.st_mode & 0777, want);
			cr_assert_geq(g3, g2 + 1, "kernel %s: the stat after the lock's release "
				      "was answered from the SETATTR reply", u.release);
		} else {
			cr_assert_geq(g1, g0 + 1, "the stat after a chmod was answered by the "
				      "kernel from the SETATTR reply");
		}
		cr_assert_eq(g2, g1, "a GETATTR reply was not cached");
		seen = true;
	}
	cr_assert(seen, "no round ran within the attribute timeout");
	env_stop();
	efs_test_assert_no_leaks();
}

/* Forces the release of |path|'s lock and waits until it is done. */
static void force_release(const char *path)
{
	double f0 = efs_test_fs_metric(&env.f, "etcfs_lock_forced_total");

	IO_EQ(setxattr(path, "user.etcfs.fault.release", "0", 1, 0), 0);
	for (int k = 0; k < 500; k++) {
		if (efs_test_fs_metric(&env.f, "etcfs_lock_forced_total") > f0)
			return;
		nap_ms(10);
	}
	cr_assert_fail("the forced release of %s never ended", path);
}

/*
 * read(2) asks the size through the handle (a GETATTR, when the kernel's
 * attributes are stale) and then the pages (a READ), and cuts the pages
 * at that size: the GETATTR's reply keeps the file's lock pinned until
 * the thread's READ, its FLUSH or next GETATTR, or EFS_FS_READPIN_MS
 * (50 ms), so that no release comes between the two. lseek(SEEK_END)
 * sends that GETATTR and no READ: a forced release right after it waits
 * for the pin, and so does a stat that must ask the daemon (it waits for
 * the release). Before the pin, such a stat took two etcd round trips.
 */
Test(data, a_reads_getattr_keeps_the_lock_until_its_read)
{
	char path[PATH_MAX], buf[4096];
	struct statx stx;
	uint64_t least = UINT64_MAX;
	int fd;

	env_start(0, NULL);
	env_path(path, sizeof(path), "f");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
	memset(buf, 'x', sizeof(buf));
	IO_EQ(pwrite(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	IO_EQ(close(fd), 0);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
	for (int round = 0; round < 3; round++) {
		uint64_t t0, waited;

		/* The release invalidates the kernel's attributes. */
		force_release(path);
		IO_EQ(lseek(fd, 0, SEEK_END), (off_t)sizeof(buf));
		IO_EQ(setxattr(path, "user.etcfs.fault.release", "0", 1, 0), 0);
		t0 = mono_ms();
		IO_EQ(statx(AT_FDCWD, path, AT_STATX_FORCE_SYNC, STATX_SIZE, &stx), 0);
		waited = mono_ms() - t0;
		cr_assert_eq(stx.stx_size, sizeof(buf));
		if (waited < least)
			least = waited;
	}
	cr_assert_geq(least, 35, "a stat right after a read's GETATTR and a forced release "
		      "took only %" PRIu64 " ms: the release did not wait for the read's pin",
		      least);
	IO_EQ(close(fd), 0);
	env_stop();
	efs_test_assert_no_leaks();
}

Test(data, recall)
{
	seed = test_seed();
	env_start(0, NULL);
	cr_assert_eq(chdir("/"), 0);
	efs_test_fs_unmount(&env.f);
	cr_assert_eq(setenv("ETCFS_FAULT_RECALL", "15", 1), 0);
	efs_test_fs_mount(&env.f, NULL);
	unsetenv("ETCFS_FAULT_RECALL");
	memset(&app, 0, sizeof(app));
	env_path(app.path, sizeof(app.path), "appended");
	cr_assert_eq(pthread_create(&app.th, NULL, append_main, NULL), 0);
	times_under_recall();
	names_under_recall();
	model_run(RECALL_NOPS, recall_quiesce);
	check_appended("after the remount");
	env_stop();
	efs_test_assert_no_leaks();
}

/* ==== O_DIRECT writers of one file reach the daemon together ==== */

struct pwriter {
	int fd;
	int id;
	int err;
};

static void *pwriter_main(void *arg)
{
	struct pwriter *w = arg;
	void *buf = NULL;

	if (posix_memalign(&buf, 4096, 4096) != 0) {
		w->err = ENOMEM;
		return NULL;
	}
	memset(buf, 'a' + w->id, 4096);
	for (int i = 0; i < 300 && !w->err; i++) {
		off_t off = (off_t)(((unsigned)i * 7919u + (unsigned)w->id * 131u) % 1024u) * 4096;

		if (pwrite(w->fd, buf, 4096, off) != 4096)
			w->err = errno ? errno : EIO;
	}
	free(buf);
	return NULL;
}

/*
 * The kernel serialises O_DIRECT writes of one file on its inode lock
 * unless the open reply says FOPEN_PARALLEL_DIRECT_WRITES (which libfuse
 * 3.14 cannot say: kchan/fuseio patches it in). Four threads overwriting
 * a 4 MiB file then have more than one write in the daemon at once;
 * serialised, never more than one.
 */
Test(data, direct_writers_of_one_file_run_in_parallel)
{
	char path[PATH_MAX];
	struct pwriter w[4];
	pthread_t t[4];
	void *buf = NULL;
	int fd;

	env_start(0, NULL);
	env_path(path, sizeof(path), "par");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	cr_assert_eq(posix_memalign(&buf, 4096, 1 << 20), 0);
	memset(buf, 'z', 1 << 20);
	for (int i = 0; i < 4; i++) /* laid out first: no write extends the file */
		IO_EQ(pwrite(fd, buf, 1 << 20, (off_t)i << 20), 1 << 20);
	free(buf);
	for (int i = 0; i < 4; i++) {
		w[i] = (struct pwriter){.fd = fd, .id = i};
		cr_assert_eq(pthread_create(&t[i], NULL, pwriter_main, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(w[i].err, 0, "writer %d: %s", i, strerror(w[i].err));
	}
	IO_EQ(fsync(fd), 0);
	IO_EQ(close(fd), 0);
	cr_assert_geq(efs_test_fs_metric(&env.f, "etcfs_data_writes_inflight_max"), 2,
		      "O_DIRECT writes of one file reached the daemon one at a time");
	env_stop();
	efs_test_assert_no_leaks();
}

/*
 * A preallocation published with no write since the last device sync:
 * nothing to sync, and test builds' check that every published block's
 * write was synced must not take the preallocated blocks for unsynced
 * data (it aborted the daemon here once).
 */
Test(data, fallocate_after_a_sync_publishes_without_a_sync)
{
	char path[PATH_MAX], buf[4096];
	int fd;

	env_start(0, NULL);
	env_path(path, sizeof(path), "pre");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	memset(buf, 'p', sizeof(buf));
	IO_EQ(pwrite(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	IO_EQ(fsync(fd), 0);
	IO_EQ(fallocate(fd, 0, 1 << 20, 1 << 20), 0);
	IO_EQ(fsync(fd), 0);
	IO_EQ(pread(fd, buf, sizeof(buf), 1 << 20), (ssize_t)sizeof(buf));
	cr_assert_eq(buf[0], 0);
	IO_EQ(close(fd), 0);
	env_stop();
	efs_test_assert_no_leaks();
}

/*
 * A read that one device read fills (holes in it are zeroed before the
 * read goes out) is answered from the I/O worker, with no trip through
 * the loop; one that takes two device reads is answered from the loop.
 * Both return the file's bytes.
 */
Test(data, reads_answered_from_the_worker)
{
	char path[PATH_MAX];
	double before, after;
	uint8_t *buf = NULL;
	int fd;

	env_start(0, NULL);
	env_path(path, sizeof(path), "wr");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	cr_assert_eq(posix_memalign((void **)&buf, 4096, 135168), 0);
	memset(buf, 'w', 65536);
	IO_EQ(pwrite(fd, buf, 65536, 0), 65536);
	IO_EQ(pwrite(fd, buf, 4096, 131072), 4096); /* a hole at 64-128 KiB */
	IO_EQ(fsync(fd), 0);
	before = efs_test_fs_metric(&env.f, "etcfs_data_worker_read_replies_total");
	for (int i = 0; i < 8; i++) {
		memset(buf, 0, 4096);
		IO_EQ(pread(fd, buf, 4096, (off_t)i * 4096), 4096);
		cr_assert_eq(buf[0], 'w');
		cr_assert_eq(buf[4095], 'w');
	}
	after = efs_test_fs_metric(&env.f, "etcfs_data_worker_read_replies_total");
	cr_assert_geq(after - before, 8, "reads of mapped blocks: %.0f answered from the worker",
		      after - before);
	memset(buf, 'x', 135168);
	IO_EQ(pread(fd, buf, 135168, 0), 135168); /* data, hole, data: two device reads */
	cr_assert_eq(buf[65535], 'w');
	cr_assert_eq(buf[65536], 0);
	cr_assert_eq(buf[131072], 'w');
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_data_worker_read_replies_total"), after,
		     "a read of two device reads was answered from the worker");
	free(buf);
	IO_EQ(close(fd), 0);
	env_stop();
	efs_test_assert_no_leaks();
}
#endif

#ifndef DATA_LOCAL
/* ==== In-place overwrites ==== */

#define IP_BLOCKS 256 /* a 1 MiB file */

/* Writes the file "ip" (IP_BLOCKS blocks of 'a' + block % 7) with one
 * O_DIRECT pwrite and fsyncs it; |model| gets its bytes. Returns the
 * O_DIRECT descriptor. */
static int ip_file(uint8_t *model)
{
	char path[PATH_MAX];
	int fd;

	env_path(path, sizeof(path), "ip");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	for (unsigned b = 0; b < IP_BLOCKS; b++)
		memset(model + (size_t)b * BLK, 'a' + (int)(b % 7), BLK);
	IO_EQ(pwrite(fd, model, (size_t)IP_BLOCKS * BLK, 0), (ssize_t)IP_BLOCKS * BLK);
	IO_EQ(fsync(fd), 0);
	return fd;
}

/* 64 one-block O_DIRECT overwrites at scattered blocks, and a partial
 * write of 100 bytes inside block 9 through a buffered descriptor (its
 * block is read, merged and written whole), all mirrored in |model|. */
static void ip_overwrite(int fd, uint8_t *model, uint8_t v)
{
	char path[PATH_MAX];
	uint8_t *buf = blk_alloc(1);
	int bfd;

	for (unsigned i = 0; i < 64; i++) {
		unsigned b = (i * 37 + 11) % IP_BLOCKS;

		memset(buf, v + (int)(i % 5), BLK);
		IO_EQ(pwrite(fd, buf, BLK, (off_t)b * BLK), (ssize_t)BLK);
		memcpy(model + (size_t)b * BLK, buf, BLK);
	}
	env_path(path, sizeof(path), "ip");
	bfd = open(path, O_RDWR | O_CLOEXEC);
	cr_assert_geq(bfd, 0, "open: %s", strerror(errno));
	memset(buf, 'P', 100);
	IO_EQ(pwrite(bfd, buf, 100, 9 * BLK + 50), 100);
	memcpy(model + 9 * BLK + 50, buf, 100);
	IO_EQ(close(bfd), 0);
	free(buf);
}

static void ip_check(int fd, const uint8_t *model, const char *when)
{
	uint8_t *got = blk_alloc(IP_BLOCKS);

	IO_EQ(pread(fd, got, (size_t)IP_BLOCKS * BLK, 0), (ssize_t)IP_BLOCKS * BLK);
	for (size_t i = 0; i < (size_t)IP_BLOCKS * BLK; i++)
		cr_assert_eq(got[i], model[i], "%s: byte %zu is %#x, expected %#x", when, i,
			     got[i], model[i]);
	free(got);
}

/*
 * Overwrites of a published file's blocks go in place: the counter
 * moves, no extent chunk is added (the map does not change), the bytes
 * (also a partial block, merged) read back before and after a remount,
 * fsck is clean. An fsync after nothing but in-place overwrites still
 * flushes the device (the publication interval is a minute here, so only
 * the fsync can have), and one with nothing written since does not.
 */
Test(data, overwrites_of_mapped_blocks_go_in_place_and_fsync_flushes_them)
{
	/* In place is the default: no -o nocow. */
	static const char *const args[] = {"-o", "allow_other", "--flush-interval", "60000",
					   NULL};
	uint8_t *model = blk_alloc(IP_BLOCKS);
	double n0, s0, s1;
	long chunks;
	int fd;

	env_start(0, args);
	fd = ip_file(model);
	chunks = etcd_count("e/");
	n0 = efs_test_fs_metric(&env.f, "etcfs_data_inplace_writes_total");
	ip_overwrite(fd, model, 'A');
	cr_assert_geq(efs_test_fs_metric(&env.f, "etcfs_data_inplace_writes_total") - n0, 65,
		      "in-place overwrites: %.0f of 65",
		      efs_test_fs_metric(&env.f, "etcfs_data_inplace_writes_total") - n0);
	s0 = efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total");
	IO_EQ(fsync(fd), 0);
	s1 = efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total");
	cr_assert_geq(s1 - s0, 1, "the fsync after in-place overwrites flushed nothing");
	IO_EQ(fsync(fd), 0);
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total"), s1,
		     "an fsync with nothing written since flushed the device");
	cr_assert_eq(etcd_count("e/"), chunks, "in-place overwrites changed the extent chunks");
	ip_check(fd, model, "after in-place overwrites");
	IO_EQ(close(fd), 0);
	unmount_fsck_clean("after in-place overwrites");
	efs_test_fs_mount(&env.f, NULL);
	{
		char path[PATH_MAX];

		fd = open(env_path(path, sizeof(path), "ip"), O_RDONLY | O_DIRECT | O_CLOEXEC);
		cr_assert_geq(fd, 0, "open: %s", strerror(errno));
	}
	ip_check(fd, model, "after a remount");
	IO_EQ(close(fd), 0);
	free(model);
	env_stop();
	efs_test_assert_no_leaks();
}

/* Block |b| of the "ip" file through |fd|, all bytes |v| (|buf|: one
 * aligned block), mirrored in |model|. */
static void ip_put(int fd, uint8_t *model, uint8_t *buf, unsigned b, int v)
{
	memset(buf, v, BLK);
	IO_EQ(pwrite(fd, buf, BLK, (off_t)b * BLK), (ssize_t)BLK);
	memcpy(model + (size_t)b * BLK, buf, BLK);
}

/* Opens "ip" again with O_DIRECT (the device, not the page cache) and
 * checks its first |nb| blocks against |model|. */
static void ip_reopen_check(const uint8_t *model, unsigned nb, const char *when)
{
	char path[PATH_MAX];
	uint8_t *got = blk_alloc(nb);
	int fd = open(env_path(path, sizeof(path), "ip"), O_RDONLY | O_DIRECT | O_CLOEXEC);

	cr_assert_geq(fd, 0, "open: %s", strerror(errno));
	IO_EQ(pread(fd, got, (size_t)nb * BLK, 0), (ssize_t)nb * BLK);
	for (unsigned b = 0; b < nb; b++)
		cr_assert(memcmp(got + (size_t)b * BLK, model + (size_t)b * BLK, BLK) == 0,
			  "block %u %s is not what was written", b, when);
	free(got);
	IO_EQ(close(fd), 0);
}

/* fdatasync after in-place overwrites needs no publication (only the
 * times changed): a device flush alone answers it, as it does an O_DSYNC
 * write in place, and what they covered survives a kill -9. An
 * fdatasync that extends the file publishes its size. */
Test(data, an_fdatasync_after_in_place_overwrites_is_a_device_flush_alone)
{
	static const char *const args[] = {"-o", "allow_other", "--flush-interval", "60000",
					   NULL};
	uint8_t *model = blk_alloc(IP_BLOCKS + 1), *buf = blk_alloc(1);
	char path[PATH_MAX];
	double p0, s0, f0;
	int fd;

	env_start(0, args);
	fd = ip_file(model);
	p0 = efs_test_fs_metric(&env.f, "etcfs_data_published_inodes_total");
	s0 = efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total");
	f0 = efs_test_fs_metric(&env.f, "etcfs_data_fsyncs_total");
	for (unsigned i = 0; i < 8; i++) {
		ip_put(fd, model, buf, (i * 5 + 3) % IP_BLOCKS, 'K' + (int)i);
		IO_EQ(fdatasync(fd), 0);
	}
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_data_fsyncs_total") - f0, 8);
	cr_assert_geq(efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total") - s0, 8,
		      "8 fdatasyncs after in-place overwrites flushed the device %.0f times",
		      efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total") - s0);
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_data_published_inodes_total"), p0,
		     "an fdatasync after in-place overwrites published the inode");
	/* O_DSYNC writes in place: the same flush alone per write. */
	{
		int dfd = open(env_path(path, sizeof(path), "ip"),
			       O_RDWR | O_DIRECT | O_DSYNC | O_CLOEXEC);

		cr_assert_geq(dfd, 0, "open O_DSYNC: %s", strerror(errno));
		s0 = efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total");
		for (unsigned i = 0; i < 4; i++)
			ip_put(dfd, model, buf, (i * 7 + 1) % IP_BLOCKS, 'k' + (int)i);
		IO_EQ(close(dfd), 0);
		cr_assert_geq(efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total") - s0, 4,
			      "4 O_DSYNC writes in place flushed the device %.0f times",
			      efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total") - s0);
		cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_data_published_inodes_total"), p0,
			     "an O_DSYNC write in place published the inode");
	}
	/* Past the end: the size must be published before it answers. */
	memset(buf, 'Z', BLK);
	IO_EQ(pwrite(fd, buf, BLK, (off_t)IP_BLOCKS * BLK), (ssize_t)BLK);
	memcpy(model + (size_t)IP_BLOCKS * BLK, buf, BLK);
	IO_EQ(fdatasync(fd), 0);
	cr_assert_gt(efs_test_fs_metric(&env.f, "etcfs_data_published_inodes_total"), p0,
		     "an fdatasync that extended the file published nothing");
	IO_EQ(close(fd), 0);
	/* What the fdatasyncs acknowledged is on the device. */
	efs_test_fs_kill(&env.f);
	efs_test_fs_mount(&env.f, NULL);
	ip_reopen_check(model, IP_BLOCKS + 1, "after a kill -9 (fdatasync acknowledged it)");
	free(buf);
	free(model);
	unmount_fsck_clean("after fdatasyncs and a kill -9");
	env_stop();
	efs_test_assert_no_leaks();
}

/*
 * Whole-block overwrites in place on an O_DIRECT descriptor are answered
 * by the I/O worker as their device write returns; the loop's completion
 * follows (30 ms later here, by a fault hook). What the answer lets
 * through must find the write done: a utimensat right after each write
 * keeps its time (the write's own time was set before it went out, not
 * at the completion), an fdatasync flushes the device, a close does not
 * free what the completion uses, an fsync of a clean file flushes too.
 * A write that reaches past the end, or an O_DSYNC one, is answered by
 * the loop.
 */
Test(data, in_place_direct_overwrites_are_answered_from_the_worker)
{
	static const char *const args[] = {"-o", "allow_other", "--flush-interval", "60000",
					   NULL};
	uint8_t *model = blk_alloc(IP_BLOCKS + 1), *buf = blk_alloc(2);
	char path[PATH_MAX];
	double w0, w1, s0;
	int fd, dfd;

#if EFS_FAULT_HOOKS
	/* The loop hears of each completion 30 ms after the worker's
	 * answer: what follows the answer then always reaches it first. */
	cr_assert_eq(setenv("ETCFS_FAULT_IO_LATE_MS", "30", 1), 0);
#endif
	env_start(0, args);
	unsetenv("ETCFS_FAULT_IO_LATE_MS");
	fd = ip_file(model);
	w0 = efs_test_fs_metric(&env.f, "etcfs_data_worker_write_replies_total");
	for (unsigned i = 0; i < 32; i++) {
		struct timespec ts[2] = {{.tv_sec = 1000000 + i, .tv_nsec = 0},
					 {.tv_sec = 2000000 + i, .tv_nsec = 0}};
		struct statx stx;
		unsigned b = (i * 37 + 5) % IP_BLOCKS;

		ip_put(fd, model, buf, b, 'A' + (int)(i % 26));
		cr_assert_eq(futimens(fd, ts), 0, "futimens: %s", strerror(errno));
		/* The read waits for the write's completion (it overlaps the
		 * in-place span), so the forced statx after it (the daemon,
		 * not the kernel's cache) sees what the completion left. */
		IO_EQ(pread(fd, buf + BLK, BLK, (off_t)b * BLK), (ssize_t)BLK);
		cr_assert(memcmp(buf + BLK, model + (size_t)b * BLK, BLK) == 0,
			  "write %u: a read right after it does not see it", i);
		cr_assert_eq(statx(fd, "", AT_EMPTY_PATH | AT_STATX_FORCE_SYNC, STATX_MTIME, &stx), 0,
			     "statx: %s", strerror(errno));
		cr_assert_eq(stx.stx_mtime.tv_sec, 2000000 + (int64_t)i,
			     "write %u: the mtime set right after it is %lld once it completed", i,
			     (long long)stx.stx_mtime.tv_sec);
	}
	w1 = efs_test_fs_metric(&env.f, "etcfs_data_worker_write_replies_total");
	cr_assert_eq(w1 - w0, 32, "32 whole-block overwrites in place: %.0f answered by the worker",
		     w1 - w0);
	s0 = efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total");
	for (unsigned i = 0; i < 4; i++) {
		ip_put(fd, model, buf, (i * 11 + 2) % IP_BLOCKS, 'q' + (int)i);
		IO_EQ(fdatasync(fd), 0);
	}
	cr_assert_geq(efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total") - s0, 4,
		      "4 fdatasyncs after writes the worker answered flushed %.0f times",
		      efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total") - s0);
	/* A close right after an answered write: its release may reach the
	 * daemon before the write's completion, which must not use the
	 * released handle then (the sanitizer build checks). */
	for (unsigned i = 0; i < 4; i++) {
		int cfd = open(env_path(path, sizeof(path), "ip"), O_RDWR | O_DIRECT | O_CLOEXEC);

		cr_assert_geq(cfd, 0, "open: %s", strerror(errno));
		ip_put(cfd, model, buf, 21 + i, 'C' + (int)i);
		IO_EQ(close(cfd), 0);
	}
	/* An fsync with nothing to publish still flushes the device when a
	 * write landed since the last flush: a publication may have flushed
	 * before a write it covered landed (the write changed the version
	 * when it went out), and a clean file then proves nothing. */
	{
		int ofd = open(env_path(path, sizeof(path), "other"),
			       O_RDWR | O_CREAT | O_CLOEXEC, 0644);

		cr_assert_geq(ofd, 0, "create: %s", strerror(errno));
		IO_EQ(fsync(ofd), 0);
		ip_put(fd, model, buf, 33, 'F');
		s0 = efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total");
		IO_EQ(fsync(ofd), 0);
		cr_assert_geq(efs_test_fs_metric(&env.f, "etcfs_data_device_syncs_total") - s0, 1,
			      "an fsync with nothing to publish after a write answered by the "
			      "worker did not flush the device");
		IO_EQ(close(ofd), 0);
	}
	w1 = efs_test_fs_metric(&env.f, "etcfs_data_worker_write_replies_total");
	/* Answered by the loop: two blocks of which the second is past the
	 * end, and O_DSYNC. */
	memset(buf, 'E', 2 * BLK);
	IO_EQ(pwrite(fd, buf, 2 * BLK, (off_t)(IP_BLOCKS - 1) * BLK), (ssize_t)(2 * BLK));
	memcpy(model + (size_t)(IP_BLOCKS - 1) * BLK, buf, 2 * BLK);
	dfd = open(env_path(path, sizeof(path), "ip"), O_RDWR | O_DIRECT | O_DSYNC | O_CLOEXEC);
	cr_assert_geq(dfd, 0, "open O_DSYNC: %s", strerror(errno));
	ip_put(dfd, model, buf, 9, 'S');
	IO_EQ(close(dfd), 0);
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_data_worker_write_replies_total"), w1,
		     "a write past the end or an O_DSYNC write was answered by the worker");
	IO_EQ(close(fd), 0);
	/* What fdatasync and O_DSYNC acknowledged, and what a clean unmount
	 * wrote, is all there. */
	efs_test_fs_unmount(&env.f);
	efs_test_fs_mount(&env.f, NULL);
	ip_reopen_check(model, IP_BLOCKS + 1, "after a remount");
	free(buf);
	free(model);
	unmount_fsck_clean("after writes answered from the worker");
	env_stop();
	efs_test_assert_no_leaks();
}

#define TORN_BLOCKS 16
#define TORN_MS	    1500

/* The rewriting thread: its buffer (the caller's), how far it got. */
struct torn_writer {
	atomic_bool stop;
	uint8_t *buf;
	int fd, err;
	unsigned writes;
};

/* Rewrites the whole file, each time with one byte value, until stopped. */
static void *torn_writer_main(void *arg)
{
	struct torn_writer *w = arg;

	for (unsigned i = 1; !atomic_load(&w->stop) && !w->err; i++) {
		memset(w->buf, (int)(i % 251) + 1, TORN_BLOCKS * BLK);
		if (pwrite(w->fd, w->buf, TORN_BLOCKS * BLK, 0) != TORN_BLOCKS * BLK)
			w->err = errno ? errno : EIO;
		w->writes++;
	}
	return NULL;
}

/*
 * A read racing an in-place overwrite of the same blocks sees the blocks
 * all old or all new, as it did under copy-on-write: one thread rewrites
 * a 64 KiB file with O_DIRECT, each time with one byte value, while this
 * one reads it whole with O_DIRECT; every read must hold one value.
 */
Test(data, a_read_racing_an_in_place_overwrite_is_never_torn)
{
	static const char *const nocow_args[] = {"-o", "allow_other,nocow", NULL};
	char path[PATH_MAX];
	struct torn_writer w = {0};
	uint8_t *buf = blk_alloc(TORN_BLOCKS);
	double n0;
	uint64_t end;
	unsigned reads = 0;
	pthread_t t;
	int fd;

	int gap;

	env_start(0, nocow_args);
	env_path(path, sizeof(path), "torn");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	env_path(path, sizeof(path), "gap");
	gap = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644);
	cr_assert_geq(gap, 0, "create: %s", strerror(errno));
	/* Blocks written in turn with another file's: an extent per block,
	 * so that each rewrite and each read is many device I/Os at once. */
	memset(buf, 1, TORN_BLOCKS * BLK);
	for (int b = 0; b < TORN_BLOCKS; b++) {
		IO_EQ(pwrite(fd, buf, BLK, (off_t)b * BLK), (ssize_t)BLK);
		IO_EQ(pwrite(gap, buf, BLK, (off_t)b * BLK), (ssize_t)BLK);
	}
	IO_EQ(fsync(fd), 0);
	IO_EQ(close(gap), 0);
	n0 = efs_test_fs_metric(&env.f, "etcfs_data_inplace_writes_total");
	w.fd = fd;
	w.buf = blk_alloc(TORN_BLOCKS);
	cr_assert_eq(pthread_create(&t, NULL, torn_writer_main, &w), 0);
	end = mono_ms() + TORN_MS;
	while (mono_ms() < end) {
		ssize_t r = pread(fd, buf, TORN_BLOCKS * BLK, 0);

		if (r != TORN_BLOCKS * BLK)
			break;
		reads++;
		for (size_t i = 1; i < TORN_BLOCKS * BLK; i++)
			if (buf[i] != buf[0]) {
				atomic_store(&w.stop, true);
				pthread_join(t, NULL);
				cr_assert_fail("read %u: byte %zu is %u, byte 0 is %u (a torn read)",
					       reads, i, buf[i], buf[0]);
			}
	}
	atomic_store(&w.stop, true);
	pthread_join(t, NULL);
	cr_assert_eq(w.err, 0, "writer: %s", strerror(w.err));
	cr_assert_gt(reads, 10, "only %u reads", reads);
	cr_log_info("%u reads, %u writes, %.0f in place", reads, w.writes,
		    efs_test_fs_metric(&env.f, "etcfs_data_inplace_writes_total") - n0);
	cr_assert_gt(efs_test_fs_metric(&env.f, "etcfs_data_inplace_writes_total"), n0,
		     "no overwrite went in place");
	IO_EQ(close(fd), 0);
	free(w.buf);
	free(buf);
	env_stop();
	efs_test_assert_no_leaks();
}

/* On a default mount (copy-on-write) the same overwrites go to fresh
 * blocks: the counter stays 0 and the bytes read back. */
/* ==== The tail block ==== */

#define TB_MAX (256u * 1024)

/* Reads the whole file through an O_DIRECT descriptor (the device, not
 * the kernel's pages) and compares it with |model| (|size| bytes). */
static void tb_check(const char *path, const uint8_t *model, size_t size, const char *when)
{
	size_t span = (size + BLK - 1) / BLK * BLK;
	uint8_t *got = blk_alloc(span / BLK ? span / BLK : 1);
	struct stat st;
	int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);

	cr_assert_geq(fd, 0, "open: %s", strerror(errno));
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq((size_t)st.st_size, size, "%s: size %lld, expected %zu", when,
		     (long long)st.st_size, size);
	IO_EQ(pread(fd, got, span, 0), (ssize_t)size);
	for (size_t i = 0; i < size; i++)
		cr_assert_eq(got[i], model[i], "%s: byte %zu is %#x, expected %#x", when, i, got[i],
			     model[i]);
	IO_EQ(close(fd), 0);
	free(got);
}

/*
 * Appends in pieces that are not block-aligned (tar's records) merge the
 * block the previous piece ended in from that piece's copy instead of a
 * device read, and never from a copy that something changed since: a
 * truncate into the block (the bytes it cut must stay zero when the file
 * grows again), a punched hole in it, a write through another descriptor.
 * The bytes are checked through the device after every change.
 */
Test(data, unaligned_appends_merge_the_last_block_without_reading_it)
{
	uint8_t *model = calloc(1, TB_MAX), *piece = malloc(20000);
	char path[PATH_MAX];
	double hits0, hits;
	unsigned tb_seed = 7, appends = 0;
	size_t size = 0;
	int fd, fd2;

	cr_assert(model && piece);
	env_start(0, NULL);
	env_path(path, sizeof(path), "tb");
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	fd2 = open(path, O_RDWR | O_CLOEXEC);
	cr_assert_geq(fd2, 0, "open: %s", strerror(errno));
	hits0 = efs_test_fs_metric(&env.f, "etcfs_data_tail_block_hits_total");
	for (int step = 0; step < 40; step++) {
		size_t n = 1 + rand_r(&tb_seed) % 12000;
		char what[64];

		if (size + n > TB_MAX - 2 * BLK)
			break;
		for (size_t i = 0; i < n; i++)
			piece[i] = (uint8_t)('a' + (step + i) % 26);
		IO_EQ(pwrite(fd, piece, n, (off_t)size), (ssize_t)n);
		memcpy(model + size, piece, n);
		size += n;
		appends++;
		snprintf(what, sizeof(what), "after append %d", step);
		if (step % 4 == 1 && size % BLK > 200) {
			/* Cut into the last block, then grow past the cut. */
			size_t cut = size - 100;

			IO_EQ(ftruncate(fd, (off_t)cut), 0);
			memset(model + cut, 0, size - cut);
			size = cut;
			snprintf(what, sizeof(what), "after a truncate at step %d", step);
		} else if (step % 4 == 2 && size % BLK > 300) {
			/* A hole punched in the last block, below the end. */
			off_t at = (off_t)(size - size % BLK + 100);

			IO_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, 150), 0);
			memset(model + at, 0, 150);
			snprintf(what, sizeof(what), "after a punch at step %d", step);
		} else if (step % 4 == 3 && size % BLK > 50) {
			/* Another descriptor writes into the last block. */
			off_t at = (off_t)(size - size % BLK + 10);

			IO_EQ(pwrite(fd2, "ZZZZ", 4, at), 4);
			memcpy(model + at, "ZZZZ", 4);
			snprintf(what, sizeof(what), "after a write through fd2 at step %d", step);
		}
		tb_check(path, model, size, what);
	}
	/* Grow by truncation: whatever was cut or punched reads as zeroes. */
	IO_EQ(ftruncate(fd, (off_t)(size + 3 * BLK)), 0);
	size += 3 * BLK;
	tb_check(path, model, size, "after growing");
	IO_EQ(fsync(fd), 0);
	hits = efs_test_fs_metric(&env.f, "etcfs_data_tail_block_hits_total") - hits0;
	/* Every append right after an append that ended inside a block
	 * merges from the copy (at least the steps with no change between:
	 * about half of them). */
	cr_assert_geq(hits, appends / 4, "%.0f of %u appends merged the kept block", hits,
		      appends);
	IO_EQ(close(fd2), 0);
	IO_EQ(close(fd), 0);
	env_stop();
	free(model);
	free(piece);
	efs_test_assert_no_leaks();
}

/* -o cow: every overwrite copy-on-write, and the blocks they free join
 * the quarantine at their publication's commit (no node died: the
 * death hold lets them go at once, proven by the reads of n/ and g/ in
 * the same transaction). */
Test(data, a_cow_mount_overwrites_copy_on_write)
{
	static const char *const args[] = {"-o", "allow_other,cow", NULL};
	uint8_t *model = blk_alloc(IP_BLOCKS);
	int fd;

	env_start(0, args);
	fd = ip_file(model);
	ip_overwrite(fd, model, 'A');
	IO_EQ(fsync(fd), 0);
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_data_inplace_writes_total"), 0,
		     "an overwrite went in place on a -o cow mount");
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_space_death_hold_waits_total"), 0,
		     "blocks freed with no node dead waited for the death hold");
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_space_death_held_bytes"), 0,
		     "blocks freed with no node dead are held");
	ip_check(fd, model, "after copy-on-write overwrites");
	IO_EQ(close(fd), 0);
	free(model);
	unmount_fsck_clean("after copy-on-write overwrites");
	env_stop();
	efs_test_assert_no_leaks();
}

/* ==== Delegated creates (-o delegate) ==== */

static void touch_new(const char *rel)
{
	char path[PATH_MAX];
	int fd = open(env_path(path, sizeof(path), rel), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC,
		      0644);

	cr_assert_geq(fd, 0, "create %s: %s", rel, strerror(errno));
	IO_EQ(close(fd), 0);
}

static bool exists_rel(const char *rel, struct stat *st)
{
	char path[PATH_MAX];

	return lstat(env_path(path, sizeof(path), rel), st) == 0;
}

#if EFS_FAULT_HOOKS
/*
 * An empty directory whose lock went and came back has no name cache:
 * the listing read for its first lookup puts no name, and must still make
 * the cache whole, or no create in it is delegated again under that grant
 * (seen with two nodes, each creating in a directory of its own: half the
 * creates committed one by one, each after a read of its name).
 */
Test(data, delegation_resumes_in_an_empty_directory_after_its_lock_went)
{
	static const char *const args[] = {"-o", "allow_other,delegate", NULL};
	char rel[64], path[PATH_MAX];
	double ops;

	env_start(0, args);
	cr_assert_eq(mkdir(env_path(path, sizeof(path), "e"), 0755), 0, "mkdir: %s",
		     strerror(errno));
	IO_EQ(setxattr(path, "user.etcfs.fault.release", "0", 1, 0), 0);
	ops = efs_test_fs_metric(&env.f, "etcfs_delegated_ops_total");
	for (int i = 0; i < 50; i++) {
		snprintf(rel, sizeof(rel), "e/f%02d", i);
		touch_new(rel);
	}
	ops = efs_test_fs_metric(&env.f, "etcfs_delegated_ops_total") - ops;
	cr_assert_geq(ops, 40, "only %.0f of 50 creates in the emptied directory were delegated",
		      ops);
	env_stop();
	efs_test_assert_no_leaks();
}
#endif

/*
 * Creates and mkdirs under a directory this node holds join a batch
 * instead of committing one by one (the batch's timer is a minute here,
 * so only a full batch, fsync and fsyncdir commit it); an fsync of a file
 * in a tree made in the batch makes the whole path durable, fsyncdir the
 * names before it; a kill -9 loses at most names no fsync asked for, and
 * fsck finds nothing wrong.
 */
Test(data, delegated_creates_commit_in_batches_and_fsync_makes_them_durable)
{
	static const char *const args[] = {"-o", "allow_other,delegate", "--delegate-batch-ms",
					   "60000", NULL};
	char rel[64], path[PATH_MAX];
	struct stat st;
	double ops, batches;
	int fd, late = 0, seen = 0;

	env_start(0, args);
	cr_assert_eq(mkdir(env_path(path, sizeof(path), "d"), 0755), 0, "mkdir: %s",
		     strerror(errno));
	for (int i = 0; i < 300; i++) {
		snprintf(rel, sizeof(rel), "d/f%03d", i);
		touch_new(rel);
	}
	ops = efs_test_fs_metric(&env.f, "etcfs_delegated_ops_total");
	batches = efs_test_fs_metric(&env.f, "etcfs_delegated_batches_total");
	cr_assert_geq(ops, 300, "only %.0f of 300 creates were delegated", ops);
	/* A create merges 2 compares and 4 puts (the directory's record once
	 * per batch): a batch of etcd's 128 operations holds 30 of them. */
	cr_assert_leq(batches, 300 / 20, "%.0f batches for %.0f delegated changes", batches, ops);
	cr_assert_eq(efs_test_fs_metric(&env.f, "etcfs_delegated_batch_failures_total"), 0);

	/* fsync of a file in a tree made in the batch: the path is durable. */
	cr_assert_eq(mkdir(env_path(path, sizeof(path), "x"), 0755), 0);
	cr_assert_eq(mkdir(env_path(path, sizeof(path), "x/y"), 0755), 0);
	fd = open(env_path(path, sizeof(path), "x/y/f"), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC,
		  0644);
	cr_assert_geq(fd, 0, "create x/y/f: %s", strerror(errno));
	IO_EQ(write(fd, "durable", 7), 7);
	IO_EQ(fsync(fd), 0);
	IO_EQ(close(fd), 0);
	/* fsyncdir: the names before it are durable. */
	for (int i = 0; i < 20; i++) {
		snprintf(rel, sizeof(rel), "d/g%02d", i);
		touch_new(rel);
	}
	fd = open(env_path(path, sizeof(path), "d"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	IO_EQ(fsync(fd), 0);
	IO_EQ(close(fd), 0);
	/* No fsync asks for these. */
	for (int i = 0; i < 10; i++) {
		snprintf(rel, sizeof(rel), "d/late%02d", i);
		touch_new(rel);
	}
	efs_test_fs_kill(&env.f);
	efs_test_fs_mount(&env.f, NULL);

	fd = open(env_path(path, sizeof(path), "x/y/f"), O_RDONLY | O_CLOEXEC);
	cr_assert_geq(fd, 0, "x/y/f, fsynced, is gone after a kill -9: %s", strerror(errno));
	{
		char buf[16] = {0};

		IO_EQ(read(fd, buf, sizeof(buf)), 7);
		cr_assert(memcmp(buf, "durable", 7) == 0, "x/y/f holds '%s'", buf);
	}
	IO_EQ(close(fd), 0);
	for (int i = 0; i < 300; i++) {
		snprintf(rel, sizeof(rel), "d/f%03d", i);
		cr_assert(exists_rel(rel, &st) && S_ISREG(st.st_mode),
			  "%s, made before an fsync, is gone after a kill -9", rel);
	}
	for (int i = 0; i < 20; i++) {
		snprintf(rel, sizeof(rel), "d/g%02d", i);
		cr_assert(exists_rel(rel, &st) && S_ISREG(st.st_mode),
			  "%s, made before an fsyncdir, is gone after a kill -9", rel);
	}
	/* The names no fsync asked for: each is there whole or not at all. */
	for (int i = 0; i < 10; i++) {
		snprintf(rel, sizeof(rel), "d/late%02d", i);
		if (exists_rel(rel, &st)) {
			cr_assert(S_ISREG(st.st_mode) && st.st_nlink == 1, "%s is half made", rel);
			late++;
		}
	}
	{
		DIR *dir = opendir(env_path(path, sizeof(path), "d"));
		struct dirent *de;

		cr_assert_not_null(dir, "opendir: %s", strerror(errno));
		while ((de = readdir(dir)))
			seen += de->d_name[0] != '.';
		closedir(dir);
	}
	cr_assert_eq(seen, 320 + late, "d lists %d names, %d expected", seen, 320 + late);
	unmount_fsck_clean("after delegated creates and a kill -9");
	env_stop();
	efs_test_assert_no_leaks();
}
#endif
