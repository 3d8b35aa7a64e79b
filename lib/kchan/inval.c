/* SPDX-License-Identifier: Apache-2.0 */
#include "kchan/inval.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "util/clock.h"
#include "util/mem.h"

/*
 * Queues, each with threads of its own: the two classes, and within the
 * gating class the inode invalidations apart from the entry ones. An
 * entry invalidation takes the directory's lock, which the kernel may
 * hold for as long as a request on the directory waits (a create waiting
 * for a peer's directory lock): a few of those must not hold up a file's
 * release, whose inode invalidation waits only for pages that requests
 * the lock cache lets through (EFS_LOCK_F_PAGES) are holding.
 */
#define NQUEUES	       3
#define Q_GATING_INODE 2

struct inval_class;

struct worker_arg {
	struct efs_inval *iv;
	struct inval_class *c;
};

struct inval_class {
	pthread_cond_t cond;		   /* signalled when |head| grows or on stop */
	struct efs_list queue; /* of requests (link); protected by efs_inval.mu */
	pthread_t *threads;
	struct worker_arg *args;
	unsigned nthreads; /* started */
};

struct efs_inval {
	uv_async_t async; /* completions and thread exits reach the loop here */
	uv_loop_t *loop;
	pthread_mutex_t mu;
	struct inval_class cls[NQUEUES];
	struct efs_list done;			     /* protected by mu */
	struct fuse_session *se;		     /* protected by mu */
	bool stopping;				     /* protected by mu */
	unsigned live;				     /* threads running; protected by mu */
	/* loop thread only */
	bool joined;
	bool closing;
	bool free_on_close;
	void (*stop_done)(void *arg);
	void *stop_arg;
	bool (*referenced)(void *arg, uint64_t ino);
	void *ref_arg;
	struct efs_inval_stats stats;
};

#if EFS_FAULT_HOOKS
static atomic_bool fault_no_kernel;

void efs_inval_fault_no_kernel(bool off)
{
	atomic_store(&fault_no_kernel, off);
}

static bool kernel_told(void)
{
	return !atomic_load(&fault_no_kernel);
}
#else
static bool kernel_told(void)
{
	return true;
}
#endif

static int issue(struct fuse_session *se, struct efs_inval_req *req)
{
	int r;

	if (!se)
		return -ENOTCONN;
	if (!kernel_told())
		return 0;
	switch (req->kind) {
	case EFS_INVAL_INODE:
		if (req->absent_tries) {
			/* Give the requester the reply is for time to run. */
			struct timespec ts = {0, EFS_INVAL_ABSENT_RETRY_US * 1000L};

			nanosleep(&ts, NULL);
		}
		r = fuse_lowlevel_notify_inval_inode(se, req->ino, req->off, req->len);
		req->absent = r == -ENOENT;
		break;
	case EFS_INVAL_ENTRY:
		r = fuse_lowlevel_notify_inval_entry(se, req->ino, req->name_copy, req->name_len);
		break;
	case EFS_INVAL_DELETE:
		r = fuse_lowlevel_notify_delete(se, req->ino, req->child, req->name_copy,
						req->name_len);
		break;
	default:
		r = -EINVAL;
		break;
	}
	/* The kernel had nothing cached: nothing left to invalidate. */
	if (r == -ENOENT)
		r = 0;
	return r;
}

static void push_done_locked(struct efs_inval *iv, struct efs_inval_req *req)
{
	efs_list_add_tail(&iv->done, &req->link);
}

static void *worker(void *p)
{
	struct efs_inval *iv = ((struct worker_arg *)p)->iv;
	struct inval_class *c = ((struct worker_arg *)p)->c;
	struct efs_inval_req *req;
	struct fuse_session *se;

	pthread_mutex_lock(&iv->mu);
	for (;;) {
		while (!iv->stopping && efs_list_empty(&c->queue))
			pthread_cond_wait(&c->cond, &iv->mu);
		if (iv->stopping)
			break;
		req = efs_list_entry(efs_list_pop(&c->queue), struct efs_inval_req, link);
		se = iv->se;
		pthread_mutex_unlock(&iv->mu);

		req->status = issue(se, req);

		pthread_mutex_lock(&iv->mu);
		push_done_locked(iv, req);
		uv_async_send(&iv->async);
	}
	iv->live--;
	pthread_mutex_unlock(&iv->mu);
	uv_async_send(&iv->async);
	return NULL;
}

static void join_all(struct efs_inval *iv)
{
	for (int k = 0; k < NQUEUES; k++) {
		for (unsigned i = 0; i < iv->cls[k].nthreads; i++)
			pthread_join(iv->cls[k].threads[i], NULL);
		iv->cls[k].nthreads = 0;
	}
	iv->joined = true;
}

static void release(struct efs_inval *iv)
{
	for (int k = 0; k < NQUEUES; k++) {
		pthread_cond_destroy(&iv->cls[k].cond);
		efs_mem_free(iv->cls[k].threads);
		efs_mem_free(iv->cls[k].args);
	}
	pthread_mutex_destroy(&iv->mu);
	efs_mem_free(iv);
}

static void on_closed(uv_handle_t *h)
{
	struct efs_inval *iv = h->data;
	void (*done)(void *) = iv->stop_done;
	void *darg = iv->stop_arg;

	if (iv->free_on_close) {
		release(iv);
		return;
	}
	iv->closing = false;
	iv->async.data = NULL; /* marks "closed" for efs_inval_free */
	if (done)
		done(darg);
}

const char *efs_inval_req_pending_name(const struct efs_inval_req *req)
{
	return req->name_copy; /* freed and cleared on the loop as it finishes */
}

/* The queue of |req|: the gating class keeps inode invalidations apart. */
static struct inval_class *queue_of(struct efs_inval *iv, const struct efs_inval_req *req)
{
	if (req->cls == EFS_INVAL_GATING && req->kind == EFS_INVAL_INODE)
		return &iv->cls[Q_GATING_INODE];
	return &iv->cls[req->cls];
}

/* Issues an INODE request that found no inode again while the daemon
 * counts kernel references to it (efs_inval_set_referenced): true when
 * queued again. */
static bool absent_again(struct efs_inval *iv, struct efs_inval_req *req)
{
	struct inval_class *c = queue_of(iv, req);
	bool queued = false;

	if (req->kind != EFS_INVAL_INODE || !req->absent || req->status != 0 || !iv->referenced ||
	    !iv->referenced(iv->ref_arg, req->ino))
		return false;
	pthread_mutex_lock(&iv->mu);
	if (!iv->stopping) {
		req->absent = false;
		req->absent_tries++;
		efs_list_add_tail(&c->queue, &req->link);
		pthread_cond_signal(&c->cond);
		queued = true;
	}
	pthread_mutex_unlock(&iv->mu);
	if (queued)
		iv->stats.absent_retries++;
	return queued;
}

static void finish(struct efs_inval *iv, struct efs_inval_req *req)
{
	uint64_t ns = efs_clock_mono_ns() - req->submit_ns;

	if (absent_again(iv, req))
		return;

	efs_mem_free(req->name_copy);
	req->name_copy = NULL;
	iv->stats.pending--;
	if (req->status == 0)
		iv->stats.done++;
	else
		iv->stats.failed++;
	if (ns > iv->stats.max_ns)
		iv->stats.max_ns = ns;
	req->cb(req, req->status);
}

static void on_async(uv_async_t *h)
{
	struct efs_inval *iv = h->data;
	struct efs_list list, *n;
	bool all_exited;

	efs_list_init(&list);
	pthread_mutex_lock(&iv->mu);
	efs_list_splice_tail(&list, &iv->done);
	all_exited = iv->stopping && iv->live == 0;
	pthread_mutex_unlock(&iv->mu);

	while ((n = efs_list_pop(&list)))
		finish(iv, efs_list_entry(n, struct efs_inval_req, link));
	if (all_exited && !iv->joined && !iv->closing) {
		join_all(iv);
		iv->closing = true;
		uv_close((uv_handle_t *)&iv->async, on_closed);
	}
}

static int start_threads(struct efs_inval *iv, struct inval_class *c, unsigned n)
{
	sigset_t all, old;
	int r = 0;

	c->threads = efs_mem_calloc(n, sizeof(*c->threads));
	c->args = efs_mem_calloc(n, sizeof(*c->args));
	if (!c->threads || !c->args)
		return -ENOMEM;
	/* Signals belong to the loop thread (uv_signal). */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (unsigned i = 0; i < n; i++) {
		struct worker_arg *wa = &c->args[i];

		wa->iv = iv;
		wa->c = c;
		pthread_mutex_lock(&iv->mu);
		iv->live++;
		pthread_mutex_unlock(&iv->mu);
		r = -pthread_create(&c->threads[i], NULL, worker, wa);
		if (r < 0) {
			pthread_mutex_lock(&iv->mu);
			iv->live--;
			pthread_mutex_unlock(&iv->mu);
			break;
		}
		c->nthreads++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return r;
}

int efs_inval_new(struct efs_inval **ret, uv_loop_t *loop, const struct efs_inval_opts *o)
{
	unsigned n[NQUEUES] = {4, 1, 2};
	struct efs_inval *iv;
	int r;

	if (o && o->gating_threads)
		n[EFS_INVAL_GATING] = o->gating_threads;
	if (o && o->best_effort_threads)
		n[EFS_INVAL_BEST_EFFORT] = o->best_effort_threads;

	iv = efs_mem_calloc(1, sizeof(*iv));
	if (!iv)
		return -ENOMEM;
	iv->loop = loop;
	pthread_mutex_init(&iv->mu, NULL);
	efs_list_init(&iv->done);
	for (int k = 0; k < NQUEUES; k++) {
		pthread_cond_init(&iv->cls[k].cond, NULL);
		efs_list_init(&iv->cls[k].queue);
	}
	r = uv_async_init(loop, &iv->async, on_async);
	if (r < 0) {
		release(iv);
		return r;
	}
	iv->async.data = iv;
	for (int k = 0; k < NQUEUES; k++) {
		r = start_threads(iv, &iv->cls[k], n[k]);
		if (r < 0)
			goto out_stop;
	}
	*ret = iv;
	return 0;

out_stop:
	efs_inval_free(iv);
	return r;
}

void efs_inval_set_session(struct efs_inval *iv, struct fuse_session *se)
{
	pthread_mutex_lock(&iv->mu);
	iv->se = se;
	pthread_mutex_unlock(&iv->mu);
}

void efs_inval_set_referenced(struct efs_inval *iv, bool (*referenced)(void *arg, uint64_t ino),
			      void *arg)
{
	iv->referenced = referenced;
	iv->ref_arg = arg;
}

int efs_inval_release_status(int status)
{
	if (status == -ENODEV || status == -EBADF || status == -ENOTCONN ||
	    status == -ECANCELED || status == -ENOSYS)
		return 0;
	return status;
}

int efs_inval_submit(struct efs_inval *iv, struct efs_inval_req *req)
{
	struct inval_class *c;
	int r = 0;

	if (!req->cb || (unsigned)req->cls > EFS_INVAL_BEST_EFFORT)
		return -EINVAL;
	if (req->kind != EFS_INVAL_INODE && (!req->name || !req->name_len))
		return -EINVAL;
	req->name_copy = NULL;
	if (req->kind != EFS_INVAL_INODE) {
		req->name_copy = efs_mem_malloc(req->name_len + 1);
		if (!req->name_copy)
			return -ENOMEM;
		memcpy(req->name_copy, req->name, req->name_len);
		req->name_copy[req->name_len] = '\0';
	}
	req->status = 0;
	req->absent = false;
	req->absent_tries = 0;
	req->link.next = req->link.prev = NULL;
	req->submit_ns = efs_clock_mono_ns();
	c = queue_of(iv, req);

	pthread_mutex_lock(&iv->mu);
	if (iv->stopping) {
		r = -ESHUTDOWN;
	} else {
		efs_list_add_tail(&c->queue, &req->link);
		pthread_cond_signal(&c->cond);
	}
	pthread_mutex_unlock(&iv->mu);
	if (r < 0) {
		efs_mem_free(req->name_copy);
		req->name_copy = NULL;
		return r;
	}
	iv->stats.submitted++;
	iv->stats.pending++;
	return 0;
}

/* Moves every queued request to the done list as cancelled (mu held). */
static void cancel_queued_locked(struct efs_inval *iv)
{
	for (int k = 0; k < NQUEUES; k++) {
		struct inval_class *c = &iv->cls[k];
		struct efs_list *n;

		while ((n = efs_list_pop(&c->queue))) {
			struct efs_inval_req *req = efs_list_entry(n, struct efs_inval_req, link);

			req->status = -ECANCELED;
			push_done_locked(iv, req);
		}
	}
}

static void begin_stop(struct efs_inval *iv)
{
	pthread_mutex_lock(&iv->mu);
	if (!iv->stopping) {
		iv->stopping = true;
		cancel_queued_locked(iv);
		for (int k = 0; k < NQUEUES; k++)
			pthread_cond_broadcast(&iv->cls[k].cond);
	}
	pthread_mutex_unlock(&iv->mu);
}

void efs_inval_stop(struct efs_inval *iv, void (*done)(void *arg), void *arg)
{
	iv->stop_done = done;
	iv->stop_arg = arg;
	begin_stop(iv);
	/* The async callback delivers the cancellations and joins. */
	uv_async_send(&iv->async);
}

struct efs_inval *efs_inval_free(struct efs_inval *iv)
{
	struct efs_list *n;

	if (!iv)
		return NULL;
	if (!iv->closing && !iv->async.data) {
		/* Stopped and closed: memory only. */
		release(iv);
		return NULL;
	}
	begin_stop(iv);
	if (!iv->joined)
		join_all(iv);
	pthread_mutex_lock(&iv->mu);
	while ((n = efs_list_pop(&iv->done))) {
		struct efs_inval_req *req = efs_list_entry(n, struct efs_inval_req, link);

		efs_mem_free(req->name_copy);
		req->name_copy = NULL;
	}
	pthread_mutex_unlock(&iv->mu);
	iv->stop_done = NULL;
	iv->free_on_close = true;
	if (!iv->closing) {
		iv->closing = true;
		uv_close((uv_handle_t *)&iv->async, on_closed);
	}
	return NULL;
}

void efs_inval_get_stats(const struct efs_inval *iv, struct efs_inval_stats *ret)
{
	*ret = iv->stats;
}
