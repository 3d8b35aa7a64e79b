/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device I/O pool on a private uv loop per test: round trips of random
 * data at random offsets on a real disk file (O_DIRECT) and on tmpfs
 * (buffered), the buffered fallback of efs_dev_open_data, 256 requests in
 * flight, alignment checks, the fence, fault injection, close with queued
 * requests, reads past the end of the file and fdatasync.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "dev/iopool.h"
#include "util/clock.h"
#include "util/mem.h"
#include "util/metrics.h"

#include "../support/leak.h"

TestSuite(iopool, .fini = efs_mem_fail_reset, .timeout = 20);

/* ---- Helpers ---- */

#define BLK EFS_IO_ALIGN

/* /var/tmp is on the real disk (O_DIRECT); /dev/shm is tmpfs. */
#define DISK_DIR "/var/tmp"
#define SHM_DIR	 "/dev/shm"

static uint64_t rng_state;

static void rng_seed(void)
{
	rng_state = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
	if (!rng_state)
		rng_state = 1;
	cr_log_info("seed %llu", (unsigned long long)rng_state);
}

static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void fill_random(void *buf, size_t len)
{
	unsigned char *b = buf;

	for (size_t i = 0; i < len; i++)
		b[i] = (unsigned char)rng();
}

/* A new file of |size| bytes in |dir|; its path goes to |path| (removed by
 * the caller). */
static void make_file(const char *dir, char *path, size_t path_len, off_t size)
{
	int fd;

	snprintf(path, path_len, "%s/efs-iopool-XXXXXX", dir);
	fd = mkstemp(path);
	cr_assert_geq(fd, 0, "mkstemp %s: %s", path, strerror(errno));
	cr_assert_eq(ftruncate(fd, size), 0, "ftruncate: %s", strerror(errno));
	close(fd);
}

/* Opens the file behind |fd| again (it is unlinked), buffered, read-write. */
static int reopen(int fd)
{
	char path[64];
	int fd2;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	fd2 = open(path, O_RDWR | O_CLOEXEC);
	cr_assert_geq(fd2, 0, "reopen %s: %s", path, strerror(errno));
	return fd2;
}

/* Per test: the loop, a file, its descriptor and the pool over it. */
struct fixture {
	uv_loop_t loop;
	char path[128];
	int fd;
	bool direct;
	struct efs_metrics *m;
	struct efs_iopool *p;
	int done_calls;
};

/* Opens a file in |dir| through efs_dev_open_data and starts a pool. */
static void fx_start(struct fixture *fx, const char *dir, off_t size, unsigned threads,
		     bool metrics)
{
	struct efs_iopool_opts o = {.threads = threads};
	int r;

	memset(fx, 0, sizeof(*fx));
	cr_assert_eq(uv_loop_init(&fx->loop), 0);
	make_file(dir, fx->path, sizeof(fx->path), size);
	fx->fd = efs_dev_open_data(fx->path, true, &fx->direct);
	/* Gone from the directory even if the test fails; the fd stays. */
	unlink(fx->path);
	cr_assert_geq(fx->fd, 0, "efs_dev_open_data %s: %d", fx->path, fx->fd);
	if (metrics) {
		cr_assert_eq(efs_metrics_new(&fx->m), 0);
		o.m = fx->m;
	}
	r = efs_iopool_new(&fx->p, &fx->loop, fx->fd, fx->direct, &o);
	cr_assert_eq(r, 0, "efs_iopool_new: %d", r);
	cr_assert_eq(efs_iopool_direct(fx->p), fx->direct);
}

static void fx_done_cb(void *arg)
{
	struct fixture *fx = arg;

	fx->done_calls++;
}

/* Closes the pool, runs the loop until done, frees everything. */
static void fx_stop(struct fixture *fx)
{
	int r = efs_iopool_close(fx->p, fx_done_cb, fx);

	cr_assert_eq(r, 0, "close: %d", r);
	cr_assert_eq(fx->done_calls, 0, "done ran inline");
	cr_assert_eq(efs_iopool_close(fx->p, fx_done_cb, fx), -EALREADY);
	uv_run(&fx->loop, UV_RUN_DEFAULT);
	cr_assert_eq(fx->done_calls, 1);
	fx->p = efs_iopool_free(fx->p);
	cr_assert_eq(uv_loop_close(&fx->loop), 0, "loop has handles left");
	close(fx->fd);
	fx->m = efs_metrics_free(fx->m);
}

/* A request plus what its callback saw. */
struct req {
	struct efs_io io;
	int calls;
	ssize_t res;
	uint64_t order; /* completion order, from 1 */
	unsigned char *want; /* expected contents (reads) */
};

static uint64_t completions;

static void req_cb(struct efs_io *io, ssize_t res)
{
	struct req *rq = io->arg;

	rq->calls++;
	rq->res = res;
	rq->order = ++completions;
}

static void req_init(struct req *rq, enum efs_io_op op, void *buf, size_t len, uint64_t off)
{
	memset(rq, 0, sizeof(*rq));
	rq->io.op = op;
	rq->io.buf = buf;
	rq->io.len = len;
	rq->io.off = off;
	rq->io.cb = req_cb;
	rq->io.arg = rq;
}

/* Submits one request, runs the loop until it is called back, returns res. */
static ssize_t run_one(struct fixture *fx, enum efs_io_op op, void *buf, size_t len,
		       uint64_t off)
{
	struct req rq;
	int r;

	req_init(&rq, op, buf, len, off);
	r = efs_iopool_submit(fx->p, &rq.io);
	cr_assert_eq(r, 0, "submit: %d", r);
	cr_assert_eq(rq.calls, 0, "callback ran inline");
	uv_run(&fx->loop, UV_RUN_DEFAULT);
	cr_assert_eq(rq.calls, 1);
	cr_assert_eq(efs_iopool_inflight(fx->p), 0);
	return rq.res;
}

static uint64_t counter(struct efs_metrics *m, const char *name, const char *op)
{
	char labels[32];

	snprintf(labels, sizeof(labels), "op=\"%s\"", op);
	return efs_counter_get(efs_metrics_counter(m, name, NULL, labels));
}

static uint64_t plain_counter(struct efs_metrics *m, const char *name)
{
	return efs_counter_get(efs_metrics_counter(m, name, NULL, NULL));
}

static double gauge(struct efs_metrics *m, const char *name)
{
	return efs_gauge_get(efs_metrics_gauge(m, name, NULL, NULL));
}

/*
 * Writes random data at random offsets, all in flight at once (one write
 * per 64 KiB slot, so none overlap), reads it all back at once and
 * compares. |aligned|: offsets, lengths and buffers on EFS_IO_ALIGN.
 */
static void round_trip(struct fixture *fx, bool aligned)
{
	enum { SLOTS = 64, SLOT = 64 * 1024 };
	struct req w[SLOTS], rd[SLOTS];
	unsigned char *wbuf[SLOTS], *rbuf[SLOTS];
	uint64_t bytes = 0;

	for (int i = 0; i < SLOTS; i++) {
		size_t len, sub, skew = aligned ? 0 : rng() % 64;

		if (aligned) {
			len = (1 + rng() % (SLOT / BLK - 1)) * BLK;
			sub = (rng() % (SLOT / BLK - len / BLK + 1)) * BLK;
		} else {
			len = 1 + rng() % (SLOT - 1);
			sub = rng() % (SLOT - len + 1);
		}
		wbuf[i] = efs_io_buf_alloc(len + skew);
		rbuf[i] = efs_io_buf_alloc(len + skew);
		cr_assert(wbuf[i] && rbuf[i]);
		cr_assert_eq((uintptr_t)wbuf[i] % BLK, 0, "efs_io_buf_alloc is not aligned");
		fill_random(wbuf[i] + skew, len);
		memset(rbuf[i], 0xa5, len + skew);
		req_init(&w[i], EFS_IO_WRITE, wbuf[i] + skew, len, (uint64_t)i * SLOT + sub);
		req_init(&rd[i], EFS_IO_READ, rbuf[i] + skew, len, (uint64_t)i * SLOT + sub);
		bytes += len;
	}
	for (int i = 0; i < SLOTS; i++)
		cr_assert_eq(efs_iopool_submit(fx->p, &w[i].io), 0);
	cr_assert_eq(efs_iopool_inflight(fx->p), SLOTS);
	uv_run(&fx->loop, UV_RUN_DEFAULT);
	for (int i = 0; i < SLOTS; i++) {
		cr_assert_eq(w[i].calls, 1, "write %d: %d callbacks", i, w[i].calls);
		cr_assert_eq(w[i].res, (ssize_t)w[i].io.len, "write %d: %zd", i, w[i].res);
		cr_assert_eq(efs_iopool_submit(fx->p, &rd[i].io), 0);
	}
	uv_run(&fx->loop, UV_RUN_DEFAULT);
	for (int i = 0; i < SLOTS; i++) {
		cr_assert_eq(rd[i].calls, 1);
		cr_assert_eq(rd[i].res, (ssize_t)rd[i].io.len, "read %d: %zd", i, rd[i].res);
		cr_assert(!memcmp(rd[i].io.buf, w[i].io.buf, rd[i].io.len),
			  "read %d differs from what was written", i);
		efs_io_buf_free(wbuf[i]);
		efs_io_buf_free(rbuf[i]);
	}
	if (fx->m) {
		cr_assert_eq(counter(fx->m, "etcfs_dev_ios_total", "write"), SLOTS);
		cr_assert_eq(counter(fx->m, "etcfs_dev_ios_total", "read"), SLOTS);
		cr_assert_eq(counter(fx->m, "etcfs_dev_bytes_total", "write"), bytes);
		cr_assert_eq(counter(fx->m, "etcfs_dev_bytes_total", "read"), bytes);
		cr_assert_eq(counter(fx->m, "etcfs_dev_errors_total", "write"), 0);
		cr_assert_eq(gauge(fx->m, "etcfs_dev_inflight"), 0);
	}
}

/* ---- Tests ---- */

Test(iopool, round_trip_direct_on_disk)
{
	struct fixture fx;

	rng_seed();
	fx_start(&fx, DISK_DIR, 4 << 20, 0, true);
	cr_assert(fx.direct, "O_DIRECT refused on %s (ext4 expected)", DISK_DIR);
	round_trip(&fx, true);
	fx_stop(&fx);
	efs_test_assert_no_leaks();
}

Test(iopool, round_trip_on_tmpfs)
{
	struct fixture fx;

	rng_seed();
	fx_start(&fx, SHM_DIR, 4 << 20, 4, true);
	round_trip(&fx, true);
	fx_stop(&fx);
	efs_test_assert_no_leaks();
}

Test(iopool, buffered_pool_takes_unaligned_requests)
{
	struct fixture fx;
	struct efs_iopool_opts o = {.threads = 3};
	int fd;

	rng_seed();
	fx_start(&fx, SHM_DIR, 4 << 20, 1, false);
	/* The same file, buffered. */
	fx.p = efs_iopool_free(fx.p);
	uv_run(&fx.loop, UV_RUN_DEFAULT);
	fd = reopen(fx.fd);
	close(fx.fd);
	fx.fd = fd;
	cr_assert_eq(efs_iopool_new(&fx.p, &fx.loop, fx.fd, false, &o), 0);
	cr_assert_not(efs_iopool_direct(fx.p));
	round_trip(&fx, false);
	fx_stop(&fx);
	efs_test_assert_no_leaks();
}

Test(iopool, open_falls_back_to_buffered)
{
	/* Character devices refuse O_DIRECT at open (EINVAL). */
	struct efs_iopool *p;
	uv_loop_t loop;
	bool direct = true;
	unsigned char *buf;
	struct req rq;
	int fd;

	fd = efs_dev_open_data("/dev/zero", false, &direct);
	cr_assert_geq(fd, 0, "open /dev/zero: %d", fd);
	cr_assert_not(direct);
	cr_assert_eq(efs_dev_open_data("/nonexistent/efs-iopool", true, &direct), -ENOENT);

	cr_assert_eq(uv_loop_init(&loop), 0);
	cr_assert_eq(efs_iopool_new(&p, &loop, fd, direct, NULL), 0);
	buf = efs_io_buf_alloc(3 * BLK);
	cr_assert_not_null(buf);
	memset(buf, 0x5a, 3 * BLK);
	req_init(&rq, EFS_IO_READ, buf + 1, 3 * BLK - 1, 12345);
	cr_assert_eq(efs_iopool_submit(p, &rq.io), 0);
	uv_run(&loop, UV_RUN_DEFAULT);
	cr_assert_eq(rq.calls, 1);
	cr_assert_eq(rq.res, 3 * BLK - 1);
	for (size_t i = 1; i < 3 * BLK; i++)
		cr_assert_eq(buf[i], 0, "byte %zu", i);
	cr_assert_eq(buf[0], 0x5a);
	efs_io_buf_free(buf);
	cr_assert_eq(efs_iopool_close(p, NULL, NULL), 0);
	uv_run(&loop, UV_RUN_DEFAULT);
	p = efs_iopool_free(p);
	cr_assert_eq(uv_loop_close(&loop), 0);
	close(fd);
	efs_test_assert_no_leaks();
}

Test(iopool, many_requests_in_flight)
{
	enum { N = 256 };
	struct fixture fx;
	struct req *rq = calloc(N, sizeof(*rq));
	unsigned char *buf = efs_io_buf_alloc((size_t)N * BLK);
	char *text;
	size_t len;

	cr_assert(rq && buf);
	rng_seed();
	fx_start(&fx, DISK_DIR, (off_t)N * BLK, 0, true);
	fill_random(buf, (size_t)N * BLK);
	for (int i = 0; i < N; i++) {
		req_init(&rq[i], i % 8 == 7 ? EFS_IO_SYNC : EFS_IO_WRITE, buf + (size_t)i * BLK,
			 BLK, (uint64_t)i * BLK);
		cr_assert_eq(efs_iopool_submit(fx.p, &rq[i].io), 0);
	}
	cr_assert_eq(efs_iopool_inflight(fx.p), N);
	cr_assert_eq(gauge(fx.m, "etcfs_dev_inflight"), N);
	for (int i = 0; i < N; i++)
		cr_assert_eq(rq[i].calls, 0, "callback %d ran inline", i);
	uv_run(&fx.loop, UV_RUN_DEFAULT);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(rq[i].calls, 1, "request %d: %d callbacks", i, rq[i].calls);
		cr_assert_eq(rq[i].res, rq[i].io.op == EFS_IO_SYNC ? 0 : BLK, "request %d: %zd",
			     i, rq[i].res);
	}
	cr_assert_eq(efs_iopool_inflight(fx.p), 0);
	cr_assert_eq(gauge(fx.m, "etcfs_dev_inflight_max"), N);
	cr_assert_eq(gauge(fx.m, "etcfs_dev_inflight"), 0);
	cr_assert_eq(counter(fx.m, "etcfs_dev_ios_total", "write"), N - N / 8);
	cr_assert_eq(counter(fx.m, "etcfs_dev_ios_total", "sync"), N / 8);
	cr_assert_eq(counter(fx.m, "etcfs_dev_bytes_total", "sync"), 0);
	cr_assert_eq(efs_histogram_count(efs_metrics_histogram(fx.m, "etcfs_dev_latency_seconds",
							       NULL, "op=\"write\"")),
		     N - N / 8);
	cr_assert_eq(efs_metrics_render(fx.m, &text, &len), 0);
	cr_assert_not_null(strstr(text, "etcfs_dev_inflight_max 256\n"), "%s", text);
	cr_assert_not_null(strstr(text, "etcfs_dev_ios_total{op=\"sync\"} 32\n"), "%s", text);
	efs_mem_free(text);
	fx_stop(&fx);
	efs_io_buf_free(buf);
	free(rq);
	efs_test_assert_no_leaks();
}

Test(iopool, misaligned_requests_are_refused_by_a_direct_pool)
{
	struct fixture fx;
	unsigned char *buf = efs_io_buf_alloc(4 * BLK);
	struct req rq;

	cr_assert_not_null(buf);
	fx_start(&fx, SHM_DIR, 1 << 20, 2, true);
	fx.p = efs_iopool_free(fx.p);
	uv_run(&fx.loop, UV_RUN_DEFAULT);
	/* The pool trusts its |direct| flag: alignment is checked on it. */
	cr_assert_eq(efs_iopool_new(&fx.p, &fx.loop, fx.fd, true, NULL), 0);
	cr_assert(efs_iopool_direct(fx.p));

	req_init(&rq, EFS_IO_WRITE, buf + 512, BLK, 0);
	cr_assert_eq(efs_iopool_submit(fx.p, &rq.io), -EINVAL, "misaligned buffer");
	req_init(&rq, EFS_IO_READ, buf, BLK + 512, 0);
	cr_assert_eq(efs_iopool_submit(fx.p, &rq.io), -EINVAL, "misaligned length");
	req_init(&rq, EFS_IO_WRITE, buf, BLK, 512);
	cr_assert_eq(efs_iopool_submit(fx.p, &rq.io), -EINVAL, "misaligned offset");
	req_init(&rq, EFS_IO_READ, buf, 0, 0);
	cr_assert_eq(efs_iopool_submit(fx.p, &rq.io), -EINVAL, "zero length");
	req_init(&rq, EFS_IO_READ, buf, BLK, 0);
	rq.io.op = EFS_IO_NOPS;
	cr_assert_eq(efs_iopool_submit(fx.p, &rq.io), -EINVAL, "bad op");
	req_init(&rq, EFS_IO_READ, buf, BLK, 0);
	rq.io.cb = NULL;
	cr_assert_eq(efs_iopool_submit(fx.p, &rq.io), -EINVAL, "no callback");
	cr_assert_eq(efs_iopool_inflight(fx.p), 0);
	uv_run(&fx.loop, UV_RUN_NOWAIT);
	cr_assert_eq(rq.calls, 0, "a refused request was called back");

	/* Aligned requests (and a SYNC, whose fields are unused) go through. */
	fill_random(buf, 4 * BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, 4 * BLK, 2 * BLK), 4 * BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_SYNC, buf + 1, 3, 7), 0);
	fx_stop(&fx);
	efs_io_buf_free(buf);
	efs_test_assert_no_leaks();
}

Test(iopool, fence_fails_writes_and_lets_reads_through)
{
	struct fixture fx;
	unsigned char *buf = efs_io_buf_alloc(2 * BLK), *rbuf = efs_io_buf_alloc(2 * BLK);
	static unsigned char first[BLK];

	cr_assert(buf && rbuf);
	rng_seed();
	fx_start(&fx, DISK_DIR, 1 << 20, 0, true);
	fill_random(buf, 2 * BLK);
	/* Random data may hold any byte, 0x77 too: compare whole blocks. */
	memcpy(first, buf, BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, 2 * BLK, 0), 2 * BLK);

	efs_iopool_set_fence(fx.p, true);
	memset(buf, 0x77, BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, 0), -EIO);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, 8 * BLK), -EIO);
	cr_assert_eq(run_one(&fx, EFS_IO_READ, rbuf, 2 * BLK, 0), 2 * BLK);
	/* The fenced write did not reach the file. */
	cr_assert(!memcmp(rbuf + BLK, buf + BLK, BLK));
	cr_assert(!memcmp(rbuf, first, BLK), "a fenced write reached the file");
	cr_assert_eq(counter(fx.m, "etcfs_dev_errors_total", "write"), 2);
	cr_assert_eq(counter(fx.m, "etcfs_dev_errors_total", "read"), 0);

	efs_iopool_set_fence(fx.p, false);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, 0), BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_READ, rbuf, BLK, 0), BLK);
	cr_assert_eq(rbuf[0], 0x77);
	fx_stop(&fx);
	efs_io_buf_free(buf);
	efs_io_buf_free(rbuf);
	efs_test_assert_no_leaks();
}

Test(iopool, a_write_deadline_refuses_writes_that_would_start_after_it)
{
	struct fixture fx;
	unsigned char *buf = efs_io_buf_alloc(BLK), *rbuf = efs_io_buf_alloc(BLK);

	cr_assert(buf && rbuf);
	fx_start(&fx, SHM_DIR, 1 << 20, 0, true);
	memset(buf, 0x11, BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, 0), BLK);

	/* A deadline ahead lets writes through; one passed refuses them. */
	efs_iopool_set_write_deadline(fx.p, efs_clock_mono_ns() + 60 * EFS_NSEC_PER_SEC);
	cr_assert_not(efs_iopool_fenced(fx.p));
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, BLK), BLK);
	efs_iopool_set_write_deadline(fx.p, efs_clock_mono_ns());
	cr_assert(efs_iopool_fenced(fx.p));
	memset(buf, 0x22, BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, 0), -EIO);
	cr_assert_eq(run_one(&fx, EFS_IO_READ, rbuf, BLK, 0), BLK, "reads go on");
	cr_assert_eq(rbuf[0], 0x11, "a refused write reached the file");
	cr_assert_eq(run_one(&fx, EFS_IO_SYNC, NULL, 0, 0), 0, "syncs go on");
	cr_assert_eq(plain_counter(fx.m, "etcfs_dev_fenced_writes_total"), 1);

	/* Cleared: writes go again, and the counter stays. */
	efs_iopool_set_write_deadline(fx.p, 0);
	cr_assert_not(efs_iopool_fenced(fx.p));
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, 0), BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_READ, rbuf, BLK, 0), BLK);
	cr_assert_eq(rbuf[0], 0x22);
	cr_assert_eq(plain_counter(fx.m, "etcfs_dev_fenced_writes_total"), 1);
	fx_stop(&fx);
	efs_io_buf_free(buf);
	efs_io_buf_free(rbuf);
	efs_test_assert_no_leaks();
}

Test(iopool, writes_submitted_before_a_refusal_never_start)
{
	enum { N = 200 };
	struct fixture fx;
	unsigned char *buf = efs_io_buf_alloc(BLK), *rbuf = efs_io_buf_alloc(BLK);
	struct req *rq = calloc(N, sizeof(*rq));
	int ok = 0, refused = 0;

	cr_assert(buf && rbuf && rq);
	fx_start(&fx, SHM_DIR, (off_t)(N + 1) * BLK, 1, true);
	memset(buf, 0x5a, BLK);
	/* One worker, many queued: the refusal comes while most still wait. */
	for (int i = 0; i < N; i++) {
		req_init(&rq[i], EFS_IO_WRITE, buf, BLK, (uint64_t)i * BLK);
		cr_assert_eq(efs_iopool_submit(fx.p, &rq[i].io), 0);
	}
	efs_iopool_refuse_submitted(fx.p);
	uv_run(&fx.loop, UV_RUN_DEFAULT);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(rq[i].calls, 1);
		if (rq[i].res == BLK) {
			ok++;
			continue;
		}
		cr_assert_eq(rq[i].res, -EIO, "write %d: %zd", i, rq[i].res);
		refused++;
		cr_assert_eq(run_one(&fx, EFS_IO_READ, rbuf, BLK, (uint64_t)i * BLK), BLK);
		cr_assert_neq(rbuf[0], 0x5a, "refused write %d reached the file", i);
	}
	cr_assert_gt(refused, 0, "every queued write ran before the refusal (%d)", ok);
	cr_assert_eq(plain_counter(fx.m, "etcfs_dev_fenced_writes_total"), (uint64_t)refused);
	/* Later submissions are not affected. */
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, (uint64_t)N * BLK), BLK);
	fx_stop(&fx);
	free(rq);
	efs_io_buf_free(buf);
	efs_io_buf_free(rbuf);
	efs_test_assert_no_leaks();
}

Test(iopool, fault_injection_fails_after_n_successes)
{
	enum { N = 20 };
	struct fixture fx;
	unsigned char *buf = efs_io_buf_alloc(BLK);
	struct req rq[N];
	int ok = 0, failed = 0;

	cr_assert_not_null(buf);
	fx_start(&fx, SHM_DIR, 1 << 20, 0, true);

	/* One at a time: exactly the first three succeed. */
	efs_iopool_fault(fx.p, EFS_IO_WRITE, 3, EIO);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, 0), i < 3 ? BLK : -EIO,
			     "write %d", i);
	/* Other ops are not affected. */
	cr_assert_eq(run_one(&fx, EFS_IO_READ, buf, BLK, 0), BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_SYNC, NULL, 0, 0), 0);

	/* Many at once on many workers: still exactly |after| succeed. */
	efs_iopool_fault(fx.p, EFS_IO_WRITE, 5, ENOSPC);
	for (int i = 0; i < N; i++) {
		req_init(&rq[i], EFS_IO_WRITE, buf, BLK, (uint64_t)i * BLK);
		cr_assert_eq(efs_iopool_submit(fx.p, &rq[i].io), 0);
	}
	uv_run(&fx.loop, UV_RUN_DEFAULT);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(rq[i].calls, 1);
		if (rq[i].res == BLK)
			ok++;
		else if (rq[i].res == -ENOSPC)
			failed++;
	}
	cr_assert_eq(ok, 5);
	cr_assert_eq(failed, N - 5);

	/* Cleared: writes work again. SYNC faults too, immediately with 0. */
	efs_iopool_fault(fx.p, EFS_IO_WRITE, 0, 0);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, BLK, 0), BLK);
	efs_iopool_fault(fx.p, EFS_IO_SYNC, 0, EIO);
	cr_assert_eq(run_one(&fx, EFS_IO_SYNC, NULL, 0, 0), -EIO);
	cr_assert_eq(counter(fx.m, "etcfs_dev_errors_total", "sync"), 1);
	cr_assert_eq(counter(fx.m, "etcfs_dev_errors_total", "write"), 3 + N - 5);
	efs_iopool_fault(fx.p, EFS_IO_SYNC, 0, 0);
	cr_assert_eq(run_one(&fx, EFS_IO_SYNC, NULL, 0, 0), 0);
	fx_stop(&fx);
	efs_io_buf_free(buf);
	efs_test_assert_no_leaks();
}

/* ---- Close ---- */

struct close_ctx {
	struct efs_iopool *p;
	int done_calls;
	uint64_t done_order; /* completions seen when done ran */
	int resubmit_res;
	struct req extra;
};

static void close_done(void *arg)
{
	struct close_ctx *c = arg;

	c->done_calls++;
	c->done_order = completions;
}

/* A callback that submits again while the pool closes. */
static void resubmit_cb(struct efs_io *io, ssize_t res)
{
	struct close_ctx *c = io->arg;

	c->resubmit_res = efs_iopool_submit(c->p, &c->extra.io);
	c->extra.res = res;
	c->extra.calls++;
	++completions;
}

Test(iopool, close_delivers_every_queued_request)
{
	enum { N = 200 };
	struct fixture fx;
	struct close_ctx c = {0};
	unsigned char *buf = efs_io_buf_alloc(N * BLK);
	struct req *rq = calloc(N, sizeof(*rq));
	struct req late, hook;

	cr_assert(buf && rq);
	completions = 0;
	/* One worker, so most requests are still queued at close. */
	fx_start(&fx, DISK_DIR, N * BLK, 1, false);
	c.p = fx.p;
	for (int i = 0; i < N; i++) {
		req_init(&rq[i], i % 2 ? EFS_IO_READ : EFS_IO_WRITE, buf + (size_t)i * BLK, BLK,
			 (uint64_t)i * BLK);
		cr_assert_eq(efs_iopool_submit(fx.p, &rq[i].io), 0);
	}
	req_init(&hook, EFS_IO_SYNC, NULL, 0, 0);
	hook.io.cb = resubmit_cb;
	hook.io.arg = &c;
	req_init(&c.extra, EFS_IO_SYNC, NULL, 0, 0);
	cr_assert_eq(efs_iopool_submit(fx.p, &hook.io), 0);

	cr_assert_eq(efs_iopool_close(fx.p, close_done, &c), 0);
	cr_assert_eq(efs_iopool_close(fx.p, close_done, &c), -EALREADY);
	req_init(&late, EFS_IO_READ, buf, BLK, 0);
	cr_assert_eq(efs_iopool_submit(fx.p, &late.io), -ESHUTDOWN);
	cr_assert_eq(c.done_calls, 0, "done ran inline");
	cr_assert_eq(efs_iopool_inflight(fx.p), N + 1);

	uv_run(&fx.loop, UV_RUN_DEFAULT);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(rq[i].calls, 1, "request %d: %d callbacks", i, rq[i].calls);
		cr_assert_eq(rq[i].res, BLK, "request %d: %zd", i, rq[i].res);
	}
	cr_assert_eq(c.extra.calls, 1);
	cr_assert_eq(c.resubmit_res, -ESHUTDOWN);
	cr_assert_eq(late.calls, 0);
	cr_assert_eq(c.done_calls, 1);
	cr_assert_eq(c.done_order, N + 1, "done ran before every callback");
	cr_assert_eq(efs_iopool_submit(fx.p, &late.io), -ESHUTDOWN);
	cr_assert_eq(efs_iopool_inflight(fx.p), 0);

	fx.p = efs_iopool_free(fx.p);
	cr_assert_eq(uv_loop_close(&fx.loop), 0);
	close(fx.fd);
	efs_io_buf_free(buf);
	free(rq);
	efs_test_assert_no_leaks();
}

Test(iopool, close_of_an_idle_pool_and_free_without_close)
{
	struct fixture fx;
	struct efs_iopool *q;

	fx_start(&fx, SHM_DIR, BLK, 2, true);
	/* A second pool freed without ever being closed: its handle goes. */
	cr_assert_eq(efs_iopool_new(&q, &fx.loop, fx.fd, false, NULL), 0);
	q = efs_iopool_free(q);
	cr_assert_null(q);
	cr_assert_null(efs_iopool_free(NULL));
	cr_assert_eq(efs_iopool_close(fx.p, fx_done_cb, &fx), 0);
	cr_assert_eq(fx.done_calls, 0);
	uv_run(&fx.loop, UV_RUN_DEFAULT);
	cr_assert_eq(fx.done_calls, 1);
	fx.p = efs_iopool_free(fx.p);
	cr_assert_eq(uv_loop_close(&fx.loop), 0);
	close(fx.fd);
	fx.m = efs_metrics_free(fx.m);
	efs_test_assert_no_leaks();
}

/* ---- End of file, SYNC ---- */

/*
 * The file is 3 blocks and 100 bytes: a read across the end gets what is
 * there and zeros after it, and counts its full length; a read wholly past
 * the end gets zeros.
 */
static void eof_reads(struct fixture *fx)
{
	const size_t size = 3 * BLK + 100;
	unsigned char *data = efs_io_buf_alloc(4 * BLK), *rbuf = efs_io_buf_alloc(4 * BLK);

	cr_assert(data && rbuf);
	fill_random(data, size);
	cr_assert_eq(pwrite(fx->fd, data, 4 * BLK, 0), 4 * BLK);
	cr_assert_eq(ftruncate(fx->fd, (off_t)size), 0);

	memset(rbuf, 0xa5, 4 * BLK);
	cr_assert_eq(run_one(fx, EFS_IO_READ, rbuf, 2 * BLK, 2 * BLK), 2 * BLK);
	cr_assert(!memcmp(rbuf, data + 2 * BLK, BLK + 100));
	for (size_t i = BLK + 100; i < 2 * BLK; i++)
		cr_assert_eq(rbuf[i], 0, "byte %zu past the end is %#x", i, rbuf[i]);

	memset(rbuf, 0xa5, 4 * BLK);
	cr_assert_eq(run_one(fx, EFS_IO_READ, rbuf, 4 * BLK, 16 * BLK), 4 * BLK);
	for (size_t i = 0; i < 4 * BLK; i++)
		cr_assert_eq(rbuf[i], 0, "byte %zu past the end is %#x", i, rbuf[i]);

	/* Whole file in one read. */
	memset(rbuf, 0xa5, 4 * BLK);
	cr_assert_eq(run_one(fx, EFS_IO_READ, rbuf, 4 * BLK, 0), 4 * BLK);
	cr_assert(!memcmp(rbuf, data, size));
	cr_assert_eq(rbuf[size], 0);
	cr_assert_eq(rbuf[4 * BLK - 1], 0);
	efs_io_buf_free(data);
	efs_io_buf_free(rbuf);
}

Test(iopool, read_past_end_of_file_zero_fills_direct)
{
	struct fixture fx;

	rng_seed();
	fx_start(&fx, DISK_DIR, 0, 2, false);
	cr_assert(fx.direct);
	eof_reads(&fx);
	fx_stop(&fx);
	efs_test_assert_no_leaks();
}

Test(iopool, read_past_end_of_file_zero_fills_buffered)
{
	struct fixture fx;
	struct efs_iopool_opts o = {.threads = 2};
	int fd;

	rng_seed();
	fx_start(&fx, SHM_DIR, 0, 2, false);
	fx.p = efs_iopool_free(fx.p);
	uv_run(&fx.loop, UV_RUN_DEFAULT);
	fd = reopen(fx.fd);
	close(fx.fd);
	fx.fd = fd;
	cr_assert_eq(efs_iopool_new(&fx.p, &fx.loop, fx.fd, false, &o), 0);
	eof_reads(&fx);
	fx_stop(&fx);
	efs_test_assert_no_leaks();
}

Test(iopool, sync_after_writes)
{
	struct fixture fx;
	unsigned char *buf = efs_io_buf_alloc(8 * BLK), *rbuf = efs_io_buf_alloc(8 * BLK);
	int fd2;

	cr_assert(buf && rbuf);
	rng_seed();
	fx_start(&fx, DISK_DIR, 1 << 20, 0, true);
	fill_random(buf, 8 * BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_WRITE, buf, 8 * BLK, 32 * BLK), 8 * BLK);
	cr_assert_eq(run_one(&fx, EFS_IO_SYNC, NULL, 0, 0), 0);
	cr_assert_eq(counter(fx.m, "etcfs_dev_ios_total", "sync"), 1);
	cr_assert_eq(counter(fx.m, "etcfs_dev_errors_total", "sync"), 0);
	/* Another descriptor sees the data. */
	fd2 = reopen(fx.fd);
	cr_assert_eq(pread(fd2, rbuf, 8 * BLK, 32 * BLK), 8 * BLK);
	cr_assert(!memcmp(rbuf, buf, 8 * BLK));
	close(fd2);
	fx_stop(&fx);
	efs_io_buf_free(buf);
	efs_io_buf_free(rbuf);
	efs_test_assert_no_leaks();
}

/* Whether every byte of |buf| is zero. */
static bool all_zero(const uint8_t *buf, size_t len)
{
	for (size_t k = 0; k < len; k++)
		if (buf[k])
			return false;
	return true;
}

/* A large buffer freed is handed out again (no fresh mapping to fault in),
 * zero-filled like a new one; sanitizer builds keep none. */
Test(iopool, large_buffers_are_reused_zero_filled)
{
	const size_t len = (1u << 20) + 4096; /* a 1 MiB read that is not aligned */
	uint8_t *a = efs_io_buf_alloc(len), *b;
	bool asan = false;

#if defined(__SANITIZE_ADDRESS__)
	asan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
	asan = true;
#endif
#endif
	cr_assert_not_null(a);
	cr_assert(all_zero(a, len));
	memset(a, 0xa5, len);
	efs_io_buf_free(a);
	b = efs_io_buf_alloc(1u << 20); /* an aligned 1 MiB read */
	cr_assert_not_null(b);
	cr_assert(all_zero(b, 1u << 20), "a reused buffer must come back zero-filled");
	if (asan)
		cr_log_info("sanitizer build: buffers are not kept, reuse not checked");
	else
		cr_assert_eq(b, a, "the freed 1 MiB buffer was not reused");
	efs_io_buf_free(b);
}

/* More large buffers freed at once than are kept, written over first:
 * whichever are kept, each comes back zero-filled. */
Test(iopool, many_large_buffers_come_back_zero_filled)
{
	enum { N = 32 };
	void *buf[N];

	for (int k = 0; k < N; k++) {
		buf[k] = efs_io_buf_alloc((size_t)1 << 20);
		cr_assert_not_null(buf[k]);
		memset(buf[k], 0xa5, (size_t)1 << 20);
	}
	for (int k = 0; k < N; k++)
		efs_io_buf_free(buf[k]);
	for (int k = 0; k < N; k++) {
		buf[k] = efs_io_buf_alloc((size_t)1 << 20);
		cr_assert(all_zero(buf[k], (size_t)1 << 20));
		memset(buf[k], 0x5a, (size_t)1 << 20);
	}
	for (int k = 0; k < N; k++)
		efs_io_buf_free(buf[k]);
}
