/* SPDX-License-Identifier: Apache-2.0 */
#include "dev/iopool.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/mem.h"

#define DEFAULT_THREADS 16
#define MAX_THREADS	1024

/* Fault injection for one op; protected by efs_iopool.fault_mu. */
struct fault {
	uint64_t after; /* requests still let through */
	int err;	/* positive errno; 0: off */
	uint64_t gen;	/* bumped by every efs_iopool_fault */
};

struct op_metrics {
	struct efs_counter *ios;
	struct efs_counter *errors;
	struct efs_counter *bytes;
	struct efs_histogram *latency;
};

struct efs_iopool {
	uv_loop_t *loop;
	int fd;
	bool direct;

	/* Workers; |started| of |nthreads| were created. */
	pthread_t *threads;
	unsigned nthreads;
	unsigned started;

	/* The submission FIFO, protected by |mu|. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct efs_list queue; /* of efs_io (link) */
	unsigned idle; /* workers waiting on |cv| */
	bool stopping; /* workers exit once the queue is empty */

	/* Completions not yet delivered, protected by |done_mu|. */
	pthread_mutex_t done_mu;
	struct efs_list completed; /* of efs_io (link) */
	/* Wakes the loop for completions; separately allocated so that a
	 * pool freed without close can leave its closing to the loop. */
	uv_async_t *async;

	atomic_bool fenced;
	/* Mono ns from which no pwrite starts (0: none); see
	 * efs_iopool_set_write_deadline. */
	_Atomic uint64_t write_deadline;
	/* Writes of an older submission epoch never start. */
	_Atomic uint64_t min_epoch;
	uint64_t submit_epoch; /* loop thread */
	atomic_bool fault_armed; /* some op has a fault set: take fault_mu */
	atomic_uint fault_late_ms; /* efs_iopool_fault_late */
	pthread_mutex_t fault_mu;
	struct fault fault[EFS_IO_NOPS];

	/* Loop thread only. */
	uint64_t inflight;
	uint64_t inflight_max;
	bool closing;  /* efs_iopool_close was called */
	bool finished; /* workers joined and the async closing */
	bool closed;   /* the async is closed (done was called) */
	void (*done)(void *arg);
	void *done_arg;

	struct efs_gauge *g_inflight;
	struct efs_gauge *g_inflight_max;
	struct efs_counter *fenced_writes;
	struct op_metrics om[EFS_IO_NOPS];
};

static const char *const op_labels[EFS_IO_NOPS] = {
	[EFS_IO_READ] = "op=\"read\"",
	[EFS_IO_WRITE] = "op=\"write\"",
	[EFS_IO_SYNC] = "op=\"sync\"",
};

/* Opens |path| with |flags| and O_CLOEXEC; returns the fd or -errno. */
static int open_flags(const char *path, int flags)
{
	int fd;

	do
		fd = open(path, flags | O_CLOEXEC);
	while (fd < 0 && errno == EINTR);
	return fd < 0 ? -errno : fd;
}

/*
 * Some file systems accept O_DIRECT at open and refuse it at the first
 * transfer: one aligned block read from offset 0 finds out. Returns false
 * only when that read fails with EINVAL.
 */
static bool direct_works(int fd)
{
	void *buf = efs_io_buf_alloc(EFS_IO_ALIGN);
	ssize_t n;

	if (!buf)
		return true; /* cannot tell; the transfers will say */
	do
		n = pread(fd, buf, EFS_IO_ALIGN, 0);
	while (n < 0 && errno == EINTR);
	n = n < 0 ? -errno : n;
	efs_io_buf_free(buf);
	return n != -EINVAL;
}

int efs_dev_open_data(const char *path, bool rw, bool *direct)
{
	int mode = rw ? O_RDWR : O_RDONLY;
	int fd;

	if (!path || !direct)
		return -EINVAL;
	fd = open_flags(path, mode | O_DIRECT);
	if (fd >= 0) {
		if (direct_works(fd)) {
			*direct = true;
			return fd;
		}
		close(fd);
	} else if (fd != -EINVAL) {
		return fd;
	}
	fd = open_flags(path, mode);
	if (fd < 0)
		return fd;
	*direct = false;
	return fd;
}

/*
 * Freed large buffers are kept for reuse, at most IOBUF_KEEP of them and
 * IOBUF_KEEP_BYTES in all. A large allocation is a fresh mapping whose
 * every page faults in on first touch (the zero-fill here, or the device
 * read) and is unmapped again at free: a 1 MiB read paid more for that
 * than for its device I/O and the copy to the kernel together, on the loop
 * thread. Sizes from IOBUF_MIN (glibc's default mmap threshold) up are
 * rounded to a multiple of it so that the common sizes match; smaller
 * buffers go back to malloc, which recycles them itself. Sanitizer builds
 * keep nothing, so that a use after free of an I/O buffer stays visible.
 */
#define IOBUF_MIN	 ((size_t)128 << 10)
#define IOBUF_KEEP	 8
#define IOBUF_KEEP_BYTES ((size_t)8 << 20)
#if defined(__SANITIZE_ADDRESS__)
#define IOBUF_KEEP_ON false
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IOBUF_KEEP_ON false
#endif
#endif
#ifndef IOBUF_KEEP_ON
#define IOBUF_KEEP_ON true
#endif

/* Protected by iobuf_mu; oldest first. */
static pthread_mutex_t iobuf_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	void *buf;
	size_t size; /* malloc_usable_size */
} iobuf_kept[IOBUF_KEEP];
static size_t iobuf_nkept, iobuf_bytes;

static void iobuf_drop_locked(size_t k)
{
	iobuf_bytes -= iobuf_kept[k].size;
	memmove(&iobuf_kept[k], &iobuf_kept[k + 1], (iobuf_nkept - k - 1) * sizeof(iobuf_kept[0]));
	iobuf_nkept--;
}

/* A kept buffer of at least |size| bytes and not much more (a quarter and
 * one rounding step: a 1 MiB read and one that is not block-aligned share
 * their buffers), or NULL. */
static void *iobuf_take(size_t size)
{
	void *buf = NULL;

	if (!IOBUF_KEEP_ON || size < IOBUF_MIN)
		return NULL;
	pthread_mutex_lock(&iobuf_mu);
	for (size_t k = iobuf_nkept; k-- > 0;) {
		if (iobuf_kept[k].size >= size &&
		    iobuf_kept[k].size - size <= size / 4 + IOBUF_MIN) {
			buf = iobuf_kept[k].buf;
			iobuf_drop_locked(k);
			break;
		}
	}
	pthread_mutex_unlock(&iobuf_mu);
	return buf;
}

/* Keeps |buf| for reuse (true), making room by freeing the oldest kept;
 * false when it is not kept (small, or larger than the whole allowance). */
static bool iobuf_keep(void *buf)
{
	size_t size = malloc_usable_size(buf);
	void *old[IOBUF_KEEP];
	size_t nold = 0;

	if (!IOBUF_KEEP_ON || size < IOBUF_MIN || size > IOBUF_KEEP_BYTES)
		return false;
	pthread_mutex_lock(&iobuf_mu);
	while (iobuf_nkept == IOBUF_KEEP || iobuf_bytes + size > IOBUF_KEEP_BYTES) {
		old[nold++] = iobuf_kept[0].buf;
		iobuf_drop_locked(0);
	}
	iobuf_kept[iobuf_nkept].buf = buf;
	iobuf_kept[iobuf_nkept++].size = size;
	iobuf_bytes += size;
	pthread_mutex_unlock(&iobuf_mu);
	while (nold)
		free(old[--nold]);
	return true;
}

/* Sanitizer builds fill a buffer handed out unzeroed with 0xa5: a path
 * that sent bytes it never wrote (a hole, past the end of file) then
 * shows them in the tests, where a fresh mapping would have been zero. */
#define IOBUF_POISON (!IOBUF_KEEP_ON)

static void *iobuf_get(size_t len)
{
	size_t size = len ? len : 1;
	void *buf;

	if (size >= IOBUF_MIN)
		size = (size + IOBUF_MIN - 1) / IOBUF_MIN * IOBUF_MIN;
	buf = iobuf_take(size);
	if (!buf && posix_memalign(&buf, EFS_IO_ALIGN, size) != 0)
		return NULL;
	return buf;
}

void *efs_io_buf_alloc(size_t len)
{
	void *buf = iobuf_get(len);

	if (buf)
		memset(buf, 0, len);
	return buf;
}

void *efs_io_buf_get(size_t len)
{
	void *buf = iobuf_get(len);

	if (buf && IOBUF_POISON)
		memset(buf, 0xa5, len);
	return buf;
}

void efs_io_buf_free(void *buf)
{
	if (buf && iobuf_keep(buf))
		return;
	free(buf);
}

/*
 * Fault injection, worker side. Returns -err when |op| must fail now, else
 * 0; *ret_gen is set to the fault generation when a let-through slot was
 * taken (so that a request that then fails by itself gives it back), or
 * to 0.
 */
static int fault_take(struct efs_iopool *p, enum efs_io_op op, uint64_t *ret_gen)
{
	struct fault *f = &p->fault[op];
	int r = 0;

	*ret_gen = 0;
	if (!atomic_load_explicit(&p->fault_armed, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&p->fault_mu);
	if (f->err) {
		if (f->after == 0) {
			r = -f->err;
		} else {
			f->after--;
			*ret_gen = f->gen;
		}
	}
	pthread_mutex_unlock(&p->fault_mu);
	return r;
}

/* Gives back the slot a request took and that did not succeed. */
static void fault_give_back(struct efs_iopool *p, enum efs_io_op op, uint64_t gen)
{
	pthread_mutex_lock(&p->fault_mu);
	if (p->fault[op].gen == gen && p->fault[op].err)
		p->fault[op].after++;
	pthread_mutex_unlock(&p->fault_mu);
}

/*
 * Reads the whole of |len| bytes. A read that ends at the end of the file
 * zero-fills the rest and still counts the full length; an O_DIRECT read
 * only comes back short at the end of the file, and one that ends inside
 * a block cannot be continued (the offset would be misaligned), so it too
 * is the end.
 */
static ssize_t do_read(struct efs_iopool *p, struct efs_io *io)
{
	char *buf = io->buf;
	size_t done = 0;

	while (done < io->len) {
		ssize_t n = pread(p->fd, buf + done, io->len - done, (off_t)(io->off + done));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
		if (p->direct && done % EFS_IO_ALIGN)
			break;
	}
	if (done < io->len)
		memset(buf + done, 0, io->len - done);
	return (ssize_t)io->len;
}

/* Whether a pwrite may not start now: the fence is up, or the write
 * deadline has passed. */
static bool write_fenced(struct efs_iopool *p)
{
	uint64_t dl;

	if (atomic_load_explicit(&p->fenced, memory_order_acquire))
		return true;
	dl = atomic_load_explicit(&p->write_deadline, memory_order_acquire);
	if (!dl)
		return false;
	return efs_clock_mono_ns() >= dl;
}

/* Writes the whole of |len| bytes, checking the fence before each pwrite. */
static ssize_t do_write(struct efs_iopool *p, struct efs_io *io)
{
	const char *buf = io->buf;
	size_t done = 0;

	while (done < io->len) {
		ssize_t n;

		if (write_fenced(p) ||
		    io->epoch < atomic_load_explicit(&p->min_epoch, memory_order_acquire)) {
			io->fenced = true;
			return -EIO;
		}
		n = pwrite(p->fd, buf + done, io->len - done, (off_t)(io->off + done));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		done += (size_t)n;
	}
	return (ssize_t)io->len;
}

static ssize_t do_sync(struct efs_iopool *p)
{
	int r;

	do
		r = fdatasync(p->fd);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : 0;
}

static ssize_t run_io(struct efs_iopool *p, struct efs_io *io)
{
	uint64_t gen;
	ssize_t res;

	res = fault_take(p, io->op, &gen);
	if (res < 0)
		return res;
	switch (io->op) {
	case EFS_IO_READ:
		res = do_read(p, io);
		break;
	case EFS_IO_WRITE:
		res = do_write(p, io);
		break;
	default:
		res = do_sync(p);
		break;
	}
	if (res < 0 && gen)
		fault_give_back(p, io->op, gen);
	return res;
}

static void *worker(void *arg)
{
	struct efs_iopool *p = arg;

	for (;;) {
		struct efs_list *n;
		struct efs_io *io;

		pthread_mutex_lock(&p->mu);
		while (efs_list_empty(&p->queue) && !p->stopping) {
			p->idle++;
			pthread_cond_wait(&p->cv, &p->mu);
			p->idle--;
		}
		n = efs_list_pop(&p->queue);
		pthread_mutex_unlock(&p->mu);
		if (!n)
			break;

		io = efs_list_entry(n, struct efs_io, link);
		io->res = run_io(p, io);
		if (io->wcb) {
			unsigned late = atomic_load_explicit(&p->fault_late_ms,
							     memory_order_relaxed);

			io->wcb(io, io->res);
			if (late)
				usleep(late * 1000u);
		}
		/* From here on start_ns holds the latency (submit to done). */
		io->start_ns = efs_clock_mono_ns() - io->start_ns;

		pthread_mutex_lock(&p->done_mu);
		efs_list_add_tail(&p->completed, &io->link);
		pthread_mutex_unlock(&p->done_mu);
		uv_async_send(p->async);
	}
	return NULL;
}

/* Tells the workers to leave once the queue is empty, and joins them. */
static void stop_workers(struct efs_iopool *p)
{
	pthread_mutex_lock(&p->mu);
	p->stopping = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->started; i++)
		pthread_join(p->threads[i], NULL);
	p->started = 0;
}

static void async_closed(uv_handle_t *h)
{
	struct efs_iopool *p = h->data;
	void (*done)(void *arg);

	efs_mem_free(h);
	if (!p)
		return;
	p->async = NULL;
	p->closed = true;
	done = p->done;
	if (done)
		done(p->done_arg);
}

/* Every callback is delivered: join the workers and close the async. */
static void finish_close(struct efs_iopool *p)
{
	p->finished = true;
	stop_workers(p);
	uv_close((uv_handle_t *)p->async, async_closed);
}

static void deliver(struct efs_iopool *p, struct efs_io *io)
{
	struct op_metrics *om = &p->om[io->op];
	ssize_t res = io->res;

	efs_counter_inc(om->ios);
	if (res < 0)
		efs_counter_inc(om->errors);
	if (io->fenced)
		efs_counter_inc(p->fenced_writes);
	else
		efs_counter_add(om->bytes, (uint64_t)res);
	efs_histogram_observe_ns(om->latency, io->start_ns);
	p->inflight--;
	if (p->inflight == 0 && !p->closing)
		uv_unref((uv_handle_t *)p->async);
	io->cb(io, res);
}

static void async_cb(uv_async_t *h)
{
	struct efs_iopool *p = h->data;
	struct efs_list batch, *n;

	efs_list_init(&batch);
	pthread_mutex_lock(&p->done_mu);
	efs_list_splice_tail(&batch, &p->completed);
	pthread_mutex_unlock(&p->done_mu);

	while ((n = efs_list_pop(&batch)))
		deliver(p, efs_list_entry(n, struct efs_io, link));
	efs_gauge_set(p->g_inflight, (double)p->inflight);
	if (p->closing && p->inflight == 0 && !p->finished)
		finish_close(p);
}

static void register_metrics(struct efs_iopool *p, struct efs_metrics *m)
{
	if (!m)
		return;
	p->g_inflight = efs_metrics_gauge(m, "etcfs_dev_inflight",
					  "Device requests submitted and not yet completed", NULL);
	p->g_inflight_max = efs_metrics_gauge(m, "etcfs_dev_inflight_max",
					      "Highest number of device requests in flight", NULL);
	p->fenced_writes = efs_metrics_counter(
		m, "etcfs_dev_fenced_writes_total",
		"Device writes refused by the fence or the write deadline (session suspended)",
		NULL);
	for (int op = 0; op < EFS_IO_NOPS; op++) {
		struct op_metrics *om = &p->om[op];

		om->ios = efs_metrics_counter(m, "etcfs_dev_ios_total",
					      "Device requests completed", op_labels[op]);
		om->errors = efs_metrics_counter(m, "etcfs_dev_errors_total",
						 "Device requests that failed", op_labels[op]);
		om->bytes = efs_metrics_counter(m, "etcfs_dev_bytes_total",
						"Bytes transferred by device requests",
						op_labels[op]);
		om->latency = efs_metrics_histogram(m, "etcfs_dev_latency_seconds",
						    "Device request latency, submit to completion",
						    op_labels[op]);
	}
}

/* Starts the workers with every signal blocked: the loop handles them. */
static int start_workers(struct efs_iopool *p)
{
	sigset_t all, old;
	int r = 0;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (unsigned i = 0; i < p->nthreads; i++) {
		r = -pthread_create(&p->threads[i], NULL, worker, p);
		if (r < 0)
			break;
		p->started++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return r;
}

int efs_iopool_new(struct efs_iopool **ret, uv_loop_t *loop, int fd, bool direct,
		   const struct efs_iopool_opts *o)
{
	unsigned nthreads = o && o->threads ? o->threads : DEFAULT_THREADS;
	struct efs_iopool *p;
	int r;

	if (!ret || !loop || fd < 0 || nthreads > MAX_THREADS)
		return -EINVAL;
	p = efs_mem_calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->loop = loop;
	p->fd = fd;
	p->direct = direct;
	p->nthreads = nthreads;
	atomic_init(&p->fenced, false);
	atomic_init(&p->write_deadline, 0);
	atomic_init(&p->min_epoch, 0);
	atomic_init(&p->fault_armed, false);
	atomic_init(&p->fault_late_ms, 0);
	r = -ENOMEM;
	p->threads = efs_mem_calloc(nthreads, sizeof(*p->threads));
	if (!p->threads)
		goto out_free;
	p->async = efs_mem_malloc(sizeof(*p->async));
	if (!p->async)
		goto out_free_threads;
	r = uv_async_init(loop, p->async, async_cb);
	if (r < 0)
		goto out_free_async;
	p->async->data = p;
	/* Like a libuv request, the pool keeps the loop alive only while
	 * something is in flight. */
	uv_unref((uv_handle_t *)p->async);
	efs_list_init(&p->queue);
	efs_list_init(&p->completed);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	pthread_mutex_init(&p->done_mu, NULL);
	pthread_mutex_init(&p->fault_mu, NULL);
	r = start_workers(p);
	if (r < 0)
		goto out_stop;
	register_metrics(p, o ? o->m : NULL);
	*ret = p;
	return 0;

out_stop:
	stop_workers(p);
	pthread_mutex_destroy(&p->fault_mu);
	pthread_mutex_destroy(&p->done_mu);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	p->async->data = NULL;
	uv_close((uv_handle_t *)p->async, async_closed);
	p->async = NULL;
	goto out_free_threads;
out_free_async:
	efs_mem_free(p->async);
out_free_threads:
	efs_mem_free(p->threads);
out_free:
	efs_mem_free(p);
	return r;
}

static bool is_aligned(uint64_t v)
{
	return v % EFS_IO_ALIGN == 0;
}

int efs_iopool_submit(struct efs_iopool *p, struct efs_io *io)
{
	bool wake;

	if (!p || !io || !io->cb || (unsigned)io->op >= EFS_IO_NOPS)
		return -EINVAL;
	if (p->closing)
		return -ESHUTDOWN;
	if (io->op != EFS_IO_SYNC) {
		if (!io->buf || io->len == 0 || io->len > SSIZE_MAX ||
		    io->off > (uint64_t)INT64_MAX - io->len)
			return -EINVAL;
		if (p->direct && (!is_aligned((uintptr_t)io->buf) || !is_aligned(io->len) ||
				  !is_aligned(io->off)))
			return -EINVAL;
	}
	io->res = 0;
	io->fenced = false;
	io->epoch = p->submit_epoch;
	io->start_ns = efs_clock_mono_ns();
	if (p->inflight++ == 0)
		uv_ref((uv_handle_t *)p->async);
	if (p->inflight > p->inflight_max) {
		p->inflight_max = p->inflight;
		efs_gauge_set(p->g_inflight_max, (double)p->inflight_max);
	}
	efs_gauge_set(p->g_inflight, (double)p->inflight);

	/* A worker is woken only when one sleeps (the busy ones take the
	 * queue's next before they would), and after the unlock, so that it
	 * does not wake only to wait for the mutex the loop still holds. */
	pthread_mutex_lock(&p->mu);
	efs_list_add_tail(&p->queue, &io->link);
	wake = p->idle > 0;
	pthread_mutex_unlock(&p->mu);
	if (wake)
		pthread_cond_signal(&p->cv);
	return 0;
}

uint64_t efs_iopool_inflight(const struct efs_iopool *p)
{
	return p ? p->inflight : 0;
}

void efs_iopool_set_fence(struct efs_iopool *p, bool fenced)
{
	atomic_store_explicit(&p->fenced, fenced, memory_order_release);
}

void efs_iopool_set_write_deadline(struct efs_iopool *p, uint64_t mono_ns)
{
	atomic_store_explicit(&p->write_deadline, mono_ns, memory_order_release);
}

void efs_iopool_refuse_submitted(struct efs_iopool *p)
{
	atomic_store_explicit(&p->min_epoch, ++p->submit_epoch, memory_order_release);
}

bool efs_iopool_fenced(struct efs_iopool *p)
{
	return write_fenced(p);
}

bool efs_iopool_direct(const struct efs_iopool *p)
{
	return p->direct;
}

void efs_iopool_fault(struct efs_iopool *p, enum efs_io_op op, uint64_t after, int err)
{
	bool armed = false;

	if ((unsigned)op >= EFS_IO_NOPS)
		return;
	if (err < 0)
		err = -err;
	pthread_mutex_lock(&p->fault_mu);
	p->fault[op].after = after;
	p->fault[op].err = err;
	p->fault[op].gen++;
	for (int i = 0; i < EFS_IO_NOPS; i++)
		armed = armed || p->fault[i].err != 0;
	atomic_store_explicit(&p->fault_armed, armed, memory_order_relaxed);
	pthread_mutex_unlock(&p->fault_mu);
}

void efs_iopool_fault_late(struct efs_iopool *p, unsigned ms)
{
	atomic_store_explicit(&p->fault_late_ms, ms, memory_order_relaxed);
}

int efs_iopool_close(struct efs_iopool *p, void (*done)(void *arg), void *arg)
{
	if (!p)
		return -EINVAL;
	if (p->closing)
		return -EALREADY;
	p->closing = true;
	p->done = done;
	p->done_arg = arg;
	/* The pending close keeps the loop alive until done runs. */
	uv_ref((uv_handle_t *)p->async);
	if (p->inflight == 0)
		finish_close(p);
	return 0;
}

struct efs_iopool *efs_iopool_free(struct efs_iopool *p)
{
	if (!p)
		return NULL;
	if (!p->finished) {
		/* Never closed: nothing may be in flight (see the header). */
		stop_workers(p);
		p->async->data = NULL;
		uv_close((uv_handle_t *)p->async, async_closed);
	} else if (!p->closed) {
		/* Closing but done has not run: let the close finish alone. */
		p->async->data = NULL;
	}
	pthread_mutex_destroy(&p->fault_mu);
	pthread_mutex_destroy(&p->done_mu);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	efs_mem_free(p->threads);
	efs_mem_free(p);
	return NULL;
}
