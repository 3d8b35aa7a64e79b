/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The operation engine of fs-int.h that every handler runs through: the
 * steps (session, locks, loads, plan, prepare, build, commit, outcome),
 * the node-local mutexes and ready queue, inode numbers and the inode
 * limit, and the helpers that plans and builds use.
 */
#include "fs/fs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "etcd/keys.h"
#include "etcd/kv.h"
#include "fs/fs-int.h"
#include "meta/records.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"


/* Engine resume points after a wait on the ready queue. */
enum {
	RESUME_ACQUIRE = 1,
	RESUME_PREPARE,
	/* After a wait for the batch of delegated changes (batch.c). */
	RESUME_LOAD,
	RESUME_OP_PREPARE,
	RESUME_BUILD,
};

static void step_session(struct efs_fs_op *op);
static void step_acquire(struct efs_fs_op *op);
static void step_load(struct efs_fs_op *op);
static void step_loaded(struct efs_fs_op *op);
static void step_prepare(struct efs_fs_op *op);
static void step_op_prepare(struct efs_fs_op *op);
static void step_build(struct efs_fs_op *op);

/* ---- Small helpers ---- */

int64_t efs_fs_now(void)
{
	return (int64_t)efs_clock_real_ns();
}

Etcfs__Inode *efs_fs_rec_dup(const Etcfs__Inode *rec)
{
	ProtobufCBinaryData b;
	Etcfs__Inode *ret;

	if (efs_meta_pack(&rec->base, &b) < 0)
		return NULL;
	ret = etcfs__inode__unpack(efs_mem_protobuf(), b.len, b.data);
	efs_mem_free(b.data);
	return ret;
}

void efs_fs_count_txn(struct efs_fs *fs, enum efs_fs_origin origin, enum efs_fs_outcome oc)
{
	efs_counter_inc(fs->m_txns[origin][oc]);
}

enum efs_fs_outcome efs_fs_txn_outcome(struct efs_fs *fs, enum efs_fs_origin origin,
				       const struct efs_etcd_result *r,
				       const Etcdserverpb__TxnResponse *resp)
{
	enum efs_fs_outcome oc;

	if (r->err)
		oc = r->outcome_unknown || r->err == -ETIMEDOUT ? EFS_FS_TXN_UNKNOWN
								 : EFS_FS_TXN_ERROR;
	else
		oc = resp->succeeded ? EFS_FS_TXN_OK : EFS_FS_TXN_CONFLICT;
	efs_fs_count_txn(fs, origin, oc);
	return oc;
}

static void count_lock_txns(struct efs_fs *fs)
{
	struct efs_lockcache_stats st;
	uint64_t txns;

	if (!fs->lc)
		return;
	/* Acquisitions are counted where they finish (one transaction per
	 * request that needed etcd); releases here, from the cache's stats. */
	efs_lockcache_get_stats(fs->lc, &st);
	txns = st.release_txns;
	if (txns > fs->lock_txns_seen) {
		efs_counter_add(fs->m_txns[EFS_FS_ORIG_LOCK][EFS_FS_TXN_OK], txns - fs->lock_txns_seen);
		fs->lock_txns_seen = txns;
	}
	if (st.txn_retries > fs->lock_retries_seen) {
		efs_counter_add(fs->m_txns[EFS_FS_ORIG_LOCK][EFS_FS_TXN_CONFLICT],
				st.txn_retries - fs->lock_retries_seen);
		fs->lock_retries_seen = st.txn_retries;
	}
}

int efs_fs_read_txn(struct efs_fs *fs, struct efs_etcd_txn *t, int r, efs_etcd_txn_cb cb,
		    void *arg)
{
	if (r == 0)
		r = efs_etcd_txn(fs->c, efs_etcd_txn_request(t), NULL, cb, arg);
	efs_etcd_txn_free(t);
	return r;
}

int efs_fs_txn_read_inode(struct efs_fs *fs, struct efs_etcd_txn *t, uint64_t ino)
{
	struct efs_meta_key k;
	int r = efs_meta_key_inode(&fs->ns, ino, &k);

	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0);
	return r;
}

/* ---- Pure helpers: operation ids ---- */

int efs_fs_opid_encode(uint8_t *buf, const char *node, uint64_t generation, uint64_t seq)
{
	size_t n;

	if (!efs_meta_node_is_valid(node))
		return -EINVAL;
	n = strlen(node);
	memcpy(buf, node, n);
	buf[n] = 0;
	efs_etcd_be64_put(buf + n + 1, generation);
	efs_etcd_be64_put(buf + n + 9, seq);
	return (int)(n + 17);
}

int efs_fs_opid_decode(const uint8_t *buf, size_t len, char *node, uint64_t *generation,
		       uint64_t *seq)
{
	const uint8_t *z;
	size_t n;

	if (!buf || len < 18)
		return -EINVAL;
	z = memchr(buf, 0, len);
	if (!z)
		return -EINVAL;
	n = (size_t)(z - buf);
	if (n == 0 || n > EFS_META_NODE_MAX || len != n + 17)
		return -EINVAL;
	memcpy(node, buf, n);
	node[n] = 0;
	if (!efs_meta_node_is_valid(node))
		return -EINVAL;
	*generation = efs_etcd_be64_get(buf + n + 1);
	*seq = efs_etcd_be64_get(buf + n + 9);
	return 0;
}

bool efs_fs_opid_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	return alen > 0 && alen == blen && memcmp(a, b, alen) == 0;
}

/* ---- Reply helpers ---- */

uint64_t efs_fs_cache_bound(uint64_t cache_ns, uint64_t now, uint64_t deadline, int64_t ttl_s)
{
	/* Without the TTL: the cache timeout is TTL/4, so TTL/2 is twice it. */
	uint64_t half = ttl_s > 0 ? (uint64_t)ttl_s * EFS_NSEC_PER_SEC / 2 : 2 * cache_ns;

	if (deadline <= now || deadline - now <= half)
		return 0;
	return deadline - now - half < cache_ns ? deadline - now - half : cache_ns;
}

double efs_fs_attr_timeout(struct efs_fs *fs, uint64_t ino)
{
	uint64_t t, now;

	if (!fs->cache_timeout_ms || !efs_session_is_active(fs->s))
		return 0;
	if (!efs_lock_may_cache(fs->lc, ino))
		return 0;
	now = efs_clock_mono_ns();
	t = efs_fs_cache_bound((uint64_t)fs->cache_timeout_ms * EFS_NSEC_PER_MSEC, now,
			       efs_session_deadline_ns(fs->s), efs_session_ttl_s(fs->s));
	if (!t)
		return 0;
	efs_lock_note_kernel_cache(fs->lc, ino, now + t);
	return (double)t / EFS_NSEC_PER_SEC;
}

double efs_fs_setattr_timeout(struct efs_fs *fs, uint64_t ino, uint32_t mode)
{
	if (!fs->setattr_versioned || !(S_ISREG(mode) || S_ISDIR(mode)))
		return EFS_FS_UNVERSIONED_ATTR_TIMEOUT;
	return efs_fs_attr_timeout(fs, ino);
}

bool efs_fs_kernel_versions_setattr(const char *release)
{
	unsigned long major, minor;
	char *end;

	if (!release)
		return false;
	major = strtoul(release, &end, 10);
	if (end == release || *end != '.')
		return false;
	release = end + 1;
	minor = strtoul(release, &end, 10);
	if (end == release)
		return false;
	return major > 6 || (major == 6 && minor >= 16);
}

void efs_fs_reply_attr(struct efs_fs_op *op, uint64_t ino, const Etcfs__Inode *rec)
{
	struct stat st;

	efs_meta_inode_to_stat(rec, ino, op->fs->blksize, &st);
	efs_fs_rq_attr(op->rq, &st, efs_fs_attr_timeout(op->fs, ino));
}

/* ---- Operation records ---- */

static struct efs_fs_op *op_alloc(struct efs_fs *fs, struct efs_fs_rq *rq,
				   const struct efs_fs_opdesc *d)
{
	struct efs_fs_op *op = efs_mem_calloc(1, d->size > sizeof(*op) ? d->size : sizeof(*op));

	if (!op)
		return NULL;
	op->fs = fs;
	op->rq = rq ? rq : &op->own_rq;
	op->d = d;
	fs->inflight++;
	op->born_ns = efs_clock_mono_ns();
	efs_list_add_tail(&fs->ops, &op->live);
	return op;
}

void efs_fs_log_inflight(struct efs_fs *fs)
{
	uint64_t now = efs_clock_mono_ns();
	struct efs_list *n;

	efs_list_for_each(n, &fs->ops) {
		struct efs_fs_op *op = efs_list_entry(n, struct efs_fs_op, live);

		efs_log_warn("fs: in flight for %.1f s: %s on inode %llu (loads %d, step %d%s%s%s, "
			     "%zu locks)",
			     (double)(now - op->born_ns) / 1e9, efs_fs_op_names[op->d->code],
			     (unsigned long long)op->ino, op->loads_done, op->state,
			     op->lock_waiting ? ", waits for a lock" : "",
			     op->mx_wait ? ", waits for an inode's mutex" : "",
			     op->lock_pinned ? ", locks pinned" : "", op->nslots);
		if (op->mx_wait && op->mx_wait->mx_owner)
			efs_log_warn("fs:   the mutex of inode %llu is held by %s on inode %llu",
				     (unsigned long long)op->mx_wait->ino,
				     efs_fs_op_names[op->mx_wait->mx_owner->d->code],
				     (unsigned long long)op->mx_wait->mx_owner->ino);
	}
}

static void op_caller(struct efs_fs_op *op)
{
	if (op->rq->req) {
		const struct fuse_ctx *ctx = fuse_req_ctx(op->rq->req);

		op->uid = ctx->uid;
		op->gid = ctx->gid;
		op->umask = ctx->umask;
	}
}

struct efs_fs_op *efs_fs_op_new(struct efs_fs *fs, fuse_req_t req, const struct efs_fs_opdesc *d)
{
	struct efs_fs_op *op = op_alloc(fs, NULL, d);

	if (!op)
		return NULL;
	efs_fs_rq_start(&op->own_rq, fs, req, d->code);
	op_caller(op);
	return op;
}

struct efs_fs_op *efs_fs_op_new_for(struct efs_fs *fs, struct efs_fs_rq *rq,
				    const struct efs_fs_opdesc *d)
{
	struct efs_fs_op *op = op_alloc(fs, rq, d);

	if (op)
		op_caller(op);
	return op;
}

struct efs_fs_op *efs_fs_op_start(fuse_req_t req, const struct efs_fs_opdesc *d, uint64_t ino)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_op *op = efs_fs_op_new(fs, req, d);

	if (!op) {
		efs_fs_reply_now(fs, req, d->code, -ENOMEM);
		return NULL;
	}
	op->ino = ino;
	return op;
}

int efs_fs_no_build(struct efs_fs_op *op)
{
	(void)op;
	return -EIO;
}

void efs_fs_no_done(struct efs_fs_op *op)
{
	(void)op;
}

/*
 * A node with a file open for writing never takes its lock shared. The
 * kernel keeps the page of a write through the page cache locked while
 * the write waits for us (a partial page not yet read), and a shared hold
 * the write must upgrade can be recalled meanwhile: its release must drop
 * the kernel's pages first, which waits for that page, which waits for
 * the write, which waits for the upgrade. So every shared want on such a
 * file asks for the exclusive lock, and (file/lockops.c) a recall for
 * shared access releases it instead of downgrading it.
 */
enum efs_lock_mode efs_fs_lock_mode(struct efs_fs *fs, uint64_t ino, enum efs_lock_mode mode)
{
	const struct efs_fs_inode *in;

	if (mode != EFS_LOCK_SHARED)
		return mode;
	in = efs_fs_ifind(fs, ino);
	return in && in->wopens > 0 ? EFS_LOCK_EXCLUSIVE : mode;
}

void efs_fs_ok_done(struct efs_fs_op *op)
{
	efs_fs_rq_err(op->rq, 0);
}

int efs_fs_plan_shared(struct efs_fs_op *op, const Etcfs__Inode **ret)
{
	if (op->loads_done == 0) {
		int r = efs_fs_want(op, op->ino, EFS_LOCK_SHARED);

		return r < 0 ? r : 0;
	}
	*ret = efs_fs_rec(op, op->ino);
	return *ret ? 1 : EFS_FS_GONE;
}

static void reset_out(struct efs_fs_op *op)
{
	for (size_t i = 0; i < op->nout; i++)
		efs_mem_free(op->out[i].val.data);
	op->nout = 0;
	op->check_ino = 0;
	op->txn = efs_etcd_txn_free(op->txn);
}

static void free_rresp(struct efs_fs_op *op)
{
	if (op->rresp)
		protobuf_c_message_free_unpacked(&op->rresp->base, efs_mem_protobuf());
	op->rresp = NULL;
	if (op->rresp1)
		protobuf_c_message_free_unpacked(&op->rresp1->base, efs_mem_protobuf());
	op->rresp1 = NULL;
	for (size_t i = 0; i < op->nkv; i++) {
		op->kv[i].found = false;
		op->kv[i].kvs = NULL;
		op->kv[i].nkvs = 0;
		op->kv[i].val = NULL;
		op->kv[i].val_len = 0;
	}
}

/* ---- Node-local mutexes ---- */

static void ready_push(struct efs_fs_op *op, int state);

static struct efs_fs_slot *slot_of(struct efs_fs_op *op, uint64_t ino)
{
	for (size_t i = 0; i < op->nslots; i++)
		if (op->slots[i].ino == ino)
			return &op->slots[i];
	return NULL;
}

/* True when |op| must hold the node-local mutex of slot |sl|. */
static bool slot_wants_mx(const struct efs_fs_op *op, const struct efs_fs_slot *sl)
{
	return op->d->mx_all || (op->d->mutates && sl->mode == EFS_LOCK_EXCLUSIVE);
}

static void mx_release(struct efs_fs_op *op, struct efs_fs_slot *sl)
{
	struct efs_fs_inode *in = sl->in;
	struct efs_fs_op *w;

	if (!sl->mx)
		return;
	sl->mx = false;
	in->mx_owner = NULL;
	if (efs_list_empty(&in->mx_waiters))
		return;
	w = efs_list_entry(efs_list_pop(&in->mx_waiters), struct efs_fs_op, mx_link);
	w->mx_wait = NULL;
	in->mx_owner = w;
	struct efs_fs_slot *ws = slot_of(w, in->ino);
	if (ws)
		ws->mx = true;
	ready_push(w, RESUME_ACQUIRE);
}

static void mx_release_all(struct efs_fs_op *op)
{
	for (size_t i = 0; i < op->nslots; i++)
		mx_release(op, &op->slots[i]);
}

/*
 * A publication writes back what a lock covers, and a release of that lock
 * waits for it: it must never wait for a mutex whose owner waits for a
 * lock, since that lock may be one a peer pins until our release is done
 * (the peer's older acquisition waits for the lock the publication serves;
 * the give-way rule of the lock cache sees pins, not mutexes). So the
 * owner gives its mutexes up and takes everything again (lock_cb), and so
 * does every operation ahead of it in the chain of mutex waits (an owner
 * waiting for a mutex of another) that waits for a lock.
 */
static bool mx_writeback(const struct efs_fs_op *op)
{
	return (op->lock_flags & EFS_LOCK_F_WRITEBACK) != 0;
}

static void mx_owner_yield(struct efs_fs_op *owner)
{
	for (int hops = 0; owner && hops < 64; hops++) {
		if (owner->lock_waiting && !owner->mx_yield) {
			owner->mx_yield = true;
			efs_counter_inc(owner->fs->m_mx_yields);
			efs_log_debug("fs: %s on inode %" PRIu64 " gives its mutexes up while it "
				      "waits for a lock: a publication waits for one",
				      efs_fs_op_names[owner->d->code], owner->ino);
			efs_lock_cancel(owner->fs->lc, &owner->lr);
		}
		owner = owner->mx_wait ? owner->mx_wait->mx_owner : NULL;
	}
}

/* Whether a publication waits for a mutex |op| holds, directly or through
 * operations that hold mutexes of their own while they wait for one of
 * |op|'s. |depth| bounds the walk (mutexes are taken in inode order, so
 * the waits form no cycle; the bound only guards the stack). */
static bool mx_wanted_by_writeback_at(const struct efs_fs_op *op, int depth)
{
	if (depth > 16)
		return false;
	for (size_t i = 0; i < op->nslots; i++) {
		const struct efs_fs_slot *sl = &op->slots[i];
		struct efs_list *w;

		if (!sl->mx)
			continue;
		efs_list_for_each(w, &sl->in->mx_waiters) {
			const struct efs_fs_op *x = efs_list_entry(w, struct efs_fs_op, mx_link);

			if (mx_writeback(x) || mx_wanted_by_writeback_at(x, depth + 1))
				return true;
		}
	}
	return false;
}

static bool mx_wanted_by_writeback(const struct efs_fs_op *op)
{
	return mx_wanted_by_writeback_at(op, 0);
}

/* Takes the mutexes of the exclusive slots in inode order: EFS_FS_CONT, or
 * EFS_FS_WAIT (queued; resumed with RESUME_ACQUIRE). An operation waits
 * only while every mutex it holds is below the one it waits for. */
static int mx_acquire(struct efs_fs_op *op)
{
	for (size_t i = 0; i < op->nslots; i++) {
		struct efs_fs_slot *sl = &op->slots[i];
		struct efs_fs_inode *in = sl->in;

		if (!slot_wants_mx(op, sl) || sl->mx)
			continue;
		if (!in->mx_owner) {
			in->mx_owner = op;
			sl->mx = true;
			continue;
		}
		for (size_t j = i + 1; j < op->nslots; j++)
			if (op->slots[j].mx) {
				mx_release_all(op);
				break;
			}
		op->mx_wait = in;
		efs_list_add_tail(&in->mx_waiters, &op->mx_link);
		/* A publication, or one it waits for through this chain. */
		if (mx_writeback(op) || mx_wanted_by_writeback(op))
			mx_owner_yield(in->mx_owner);
		return EFS_FS_WAIT;
	}
	return EFS_FS_CONT;
}

static void mx_cancel_wait(struct efs_fs_op *op)
{
	if (!op->mx_wait)
		return;
	efs_list_del(&op->mx_link);
	op->mx_wait = NULL;
}

/* ---- Ready queue ---- */

static void run_ready(struct efs_fs_op *op)
{
	int st = op->state;

	op->state = 0;
	if (st == RESUME_ACQUIRE)
		step_acquire(op);
	else if (st == RESUME_PREPARE)
		step_prepare(op);
	else if (st == RESUME_LOAD)
		step_load(op);
	else if (st == RESUME_OP_PREPARE)
		step_op_prepare(op);
	else if (st == RESUME_BUILD)
		step_build(op);
}

static void idle_cb(uv_idle_t *h)
{
	struct efs_fs *fs = h->data;
	struct efs_list list, *n;

	/* Only what is ready now: what these make ready runs next time. */
	efs_list_init(&list);
	efs_list_splice_tail(&list, &fs->ready);
	uv_idle_stop(h);
	while ((n = efs_list_pop(&list)))
		run_ready(efs_list_entry(n, struct efs_fs_op, qlink));
}

static void ready_push(struct efs_fs_op *op, int state)
{
	struct efs_fs *fs = op->fs;

	op->state = state;
	efs_list_add_tail(&fs->ready, &op->qlink);
	uv_idle_start(fs->idle, idle_cb);
}

void efs_fs_op_batch_resume(struct efs_fs_op *op)
{
	ready_push(op, op->state);
}

/* Waits for the batch of delegated changes, if any, before reading or
 * committing: true when |op| waits (resumed at |state|). */
static bool batch_wait(struct efs_fs_op *op, int state)
{
	op->state = state;
	if (efs_fs_batch_wait_op(op))
		return true;
	op->state = 0;
	return false;
}

/* ---- Retries after a transient failure ---- */

/*
 * True while a transient failure may be retried: |tries| (this one
 * counted) within EFS_FS_RETRY_MAX, or, past it, while the operation is
 * younger than the session's quorum-loss bound. etcd answers some
 * failures at once through an election, so a count alone could be spent
 * in milliseconds while a member was merely paused; the session's own
 * bound already says how long an operation waits for etcd.
 */
static bool may_retry(const struct efs_fs_op *op, int tries)
{
	uint64_t window_ms;

	if (tries <= EFS_FS_RETRY_MAX)
		return true;
	window_ms = op->fs->s ? efs_session_quorum_loss_ms(op->fs->s) : 0;
	return efs_clock_mono_ns() - op->rq->start_ns < window_ms * EFS_NSEC_PER_MSEC;
}

static void retry_timer_cb(uv_timer_t *t)
{
	struct efs_fs *fs = t->data;
	uint64_t now = efs_clock_mono_ns();
	struct efs_list *n;

	while ((n = efs_list_first(&fs->delayed))) {
		struct efs_fs_op *op = efs_list_entry(n, struct efs_fs_op, qlink);

		if (op->wake_ns > now + EFS_NSEC_PER_MSEC / 2) {
			uv_timer_start(t, retry_timer_cb,
				       (op->wake_ns - now + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC,
				       0);
			return;
		}
		efs_list_del(n);
		op->retry_step(op);
	}
}

/*
 * Goes on with |step| after a transient failure: at once the first time,
 * then after a backoff doubling from EFS_FS_BACKOFF_MIN_MS to
 * EFS_FS_BACKOFF_MAX_MS, so that a failure etcd answers at once (an
 * election) is retried across the pause instead of within milliseconds.
 */
static void retry_later(struct efs_fs_op *op, void (*step)(struct efs_fs_op *op))
{
	struct efs_fs *fs = op->fs;
	struct efs_list *n;
	uint64_t ms;
	int shift;

	if (op->backoffs++ == 0 || !fs->retry_timer) {
		step(op);
		return;
	}
	shift = op->backoffs - 2 < 6 ? op->backoffs - 2 : 6;
	ms = (uint64_t)EFS_FS_BACKOFF_MIN_MS << shift;
	if (ms > EFS_FS_BACKOFF_MAX_MS)
		ms = EFS_FS_BACKOFF_MAX_MS;
	op->retry_step = step;
	op->wake_ns = efs_clock_mono_ns() + ms * EFS_NSEC_PER_MSEC;
	efs_list_for_each(n, &fs->delayed)
		if (efs_list_entry(n, struct efs_fs_op, qlink)->wake_ns > op->wake_ns)
			break;
	efs_list_insert_before(n, &op->qlink);
	if (efs_list_first(&fs->delayed) == &op->qlink)
		uv_timer_start(fs->retry_timer, retry_timer_cb, ms, 0);
}

/* ---- Commit outcomes, to the descriptor's hook ---- */

static void report_outcome(struct efs_fs_op *op, enum efs_fs_commit oc, int64_t rev)
{
	if (op->nride) {
		efs_lock_ride_outcome(op->fs->lc, op->ride, op->nride,
				      oc == EFS_FS_COMMITTED ? EFS_LOCK_TXN_COMMITTED
				      : oc == EFS_FS_FAILED  ? EFS_LOCK_TXN_FAILED
							     : EFS_LOCK_TXN_UNKNOWN,
				      rev);
		op->nride = 0;
	}
	if (op->d->outcome)
		op->d->outcome(op, oc, rev);
	op->commit_resp = NULL;
}

/* ---- Finish ---- */

void efs_fs_op_note(struct efs_fs_op *op, int err, const char *what, const char *msg)
{
	op->last_err = err;
	snprintf(op->last_why, sizeof(op->last_why), "%s: %s", what,
		 msg && *msg ? msg : strerror(err < 0 ? -err : err));
}

/*
 * The warning of an EIO answer: the errno says nothing to the caller, and
 * a burst of them (a retry budget spent during an etcd pause) must be
 * readable from the log alone. At most EFS_FS_EIO_LOG_PER_S a second; the
 * rest are counted and the count is logged with the next one.
 */
static void explain_eio(struct efs_fs_op *op, const char *func, int line)
{
	struct efs_fs *fs = op->fs;
	uint64_t now = efs_clock_mono_ns();

	if (now - fs->eio_win_ns >= 1000000000ull) {
		if (fs->eio_quiet)
			efs_log_warn("fs: %llu more EIO answers in the last second, not logged",
				     (unsigned long long)fs->eio_quiet);
		fs->eio_win_ns = now;
		fs->eio_logged = 0;
		fs->eio_quiet = 0;
	}
	if (fs->eio_logged >= EFS_FS_EIO_LOG_PER_S) {
		fs->eio_quiet++;
		return;
	}
	fs->eio_logged++;
	efs_log_warn("fs: %s%s of inode %llu: EIO from %s:%d after %d retries, %d conflicts, "
		     "%d replans, %d read retries in %llu ms; last failure: %s",
		     efs_fs_op_names[op->d->code], op->rq->req ? "" : " (internal)",
		     (unsigned long long)op->ino, func, line, op->retries, op->conflicts,
		     op->replans, op->read_tries,
		     (unsigned long long)((now - op->rq->start_ns) / EFS_NSEC_PER_MSEC),
		     op->last_why[0] ? op->last_why : "none seen");
}

void efs_fs_op_finish_at(struct efs_fs_op *op, int err, const char *func, int line)
{
	struct efs_fs *fs = op->fs;

	if (err == -EIO)
		explain_eio(op, func, line);
	if (!op->handed_on && op->rq->req && !efs_fs_rq_replied(op->rq)) {
		/* 0: a path that did not answer (a record that could not be
		 * decoded): never leave the kernel hanging. */
		if (err == 0)
			efs_log_warn("fs: %s ended without an answer: EIO",
				     efs_fs_op_names[op->rq->code]);
		efs_fs_rq_err(op->rq, err < 0 ? err : -EIO);
	}
	if (op->granted) {
		/* An outcome never settled may have committed the holder key:
		 * keep the lock held then (a lock on an inode that may not exist
		 * is harmless and goes idle), never leak the key to peers. */
		efs_lock_grant_committed(fs->lc, op->new_ino, op->unsettled);
		op->granted = false;
	}
	if (op->creating) {
		fs->icreating--;
		if (op->committed)
			fs->icount++;
	}
	if (op->d->release)
		op->d->release(op);
	mx_cancel_wait(op);
	mx_release_all(op);
	if (op->lock_pinned) {
		efs_lock_put(fs->lc, &op->lr);
		op->lock_pinned = false;
	}
	for (size_t i = 0; i < op->nslots; i++)
		if (op->slots[i].in)
			efs_fs_iput(fs, op->slots[i].in);
	if (op->newin)
		efs_fs_iput(fs, op->newin);
	reset_out(op);
	free_rresp(op);
	if (op->priv_free)
		op->priv_free(op);
	efs_mem_free(op->priv);
	count_lock_txns(fs);
	fs->inflight--;
	efs_list_del(&op->live);
	efs_mem_free(op);
}

/* ---- Plan helpers ---- */

int efs_fs_want(struct efs_fs_op *op, uint64_t ino, enum efs_lock_mode mode)
{
	return efs_fs_want_exact(op, ino, efs_fs_lock_mode(op->fs, ino, mode));
}

int efs_fs_want_exact(struct efs_fs_op *op, uint64_t ino, enum efs_lock_mode mode)
{
	size_t i;

	if (ino == 0)
		return -EINVAL;
	for (i = 0; i < op->nslots; i++) {
		if (op->slots[i].ino == ino) {
			if (mode > op->slots[i].mode)
				op->slots[i].mode = mode;
			return 0;
		}
		if (op->slots[i].ino > ino)
			break;
	}
	if (op->nslots == EFS_LOCK_REQ_MAX)
		return -E2BIG;
	memmove(&op->slots[i + 1], &op->slots[i], (op->nslots - i) * sizeof(op->slots[0]));
	memset(&op->slots[i], 0, sizeof(op->slots[i]));
	op->slots[i].ino = ino;
	op->slots[i].mode = mode;
	op->nslots++;
	return 0;
}

struct efs_fs_kv *efs_fs_want_kv(struct efs_fs_op *op)
{
	struct efs_fs_kv *kv;

	if (op->nkv == EFS_FS_KV_MAX)
		return NULL;
	kv = &op->kv[op->nkv++];
	memset(kv, 0, sizeof(*kv));
	return kv;
}

int efs_fs_want_keys(struct efs_fs_op *op, enum efs_meta_family family, uint64_t ino,
		     int64_t limit)
{
	struct efs_meta_range rg;
	struct efs_fs_kv *kv;
	int r;

	r = efs_meta_range_ino(&op->fs->ns, family, ino, &rg);
	if (r < 0)
		return r;
	kv = efs_fs_want_kv(op);
	if (!kv)
		return -E2BIG;
	kv->key = rg.key;
	kv->end = rg.end;
	kv->limit = limit;
	kv->keys_only = true;
	return (int)op->nkv;
}

const Etcfs__Inode *efs_fs_rec(const struct efs_fs_op *op, uint64_t ino)
{
	for (size_t i = 0; i < op->nslots; i++)
		if (op->slots[i].ino == ino && op->slots[i].in)
			return op->slots[i].in->gone ? NULL : op->slots[i].in->rec;
	return NULL;
}

int64_t efs_fs_rec_rev(const struct efs_fs_op *op, uint64_t ino)
{
	for (size_t i = 0; i < op->nslots; i++)
		if (op->slots[i].ino == ino && op->slots[i].in)
			return op->slots[i].in->mod_rev;
	return 0;
}

/* ---- Build helpers ---- */

int efs_fs_op_txn(struct efs_fs_op *op)
{
	if (op->txn)
		return 0;
	return efs_etcd_txn_new(&op->txn, 0);
}

static int ensure_opid(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	int r;

	if (op->op_id_len)
		return 0;
	r = efs_fs_opid_encode(op->op_id, efs_session_node(fs->s), efs_session_generation(fs->s),
			       ++fs->seq);
	if (r < 0)
		return r;
	op->op_id_len = (size_t)r;
	return 0;
}

int efs_fs_put_inode(struct efs_fs_op *op, uint64_t ino, Etcfs__Inode *rec, bool is_new)
{
	struct efs_fs_out *o;
	const char *reason = NULL;
	ProtobufCBinaryData saved = rec->op_id;
	int r;

	if (op->nout == EFS_FS_OUT_MAX)
		return -E2BIG;
	r = ensure_opid(op);
	if (r < 0)
		return r;
	r = efs_meta_inode_check(rec, &reason);
	if (r < 0) {
		efs_log_debug("fs: refusing to write inode %llu: %s", (unsigned long long)ino,
			      reason);
		return -EIO;
	}
	o = &op->out[op->nout];
	memset(o, 0, sizeof(*o));
	rec->op_id.data = op->op_id;
	rec->op_id.len = op->op_id_len;
	r = efs_meta_pack(&rec->base, &o->val);
	rec->op_id = saved;
	if (r < 0)
		return r;
	o->ino = ino;
	o->is_new = is_new;
	o->mod_rev = is_new ? 0 : efs_fs_rec_rev(op, ino);
	if (!op->check_ino)
		op->check_ino = ino;
	op->nout++;
	return 0;
}

int efs_fs_del_inode(struct efs_fs_op *op, uint64_t ino)
{
	struct efs_fs_out *o;

	if (op->nout == EFS_FS_OUT_MAX)
		return -E2BIG;
	o = &op->out[op->nout++];
	memset(o, 0, sizeof(*o));
	o->ino = ino;
	o->del = true;
	o->mod_rev = efs_fs_rec_rev(op, ino);
	return 0;
}

int efs_fs_put_dirent(struct efs_fs_op *op, uint64_t parent, const char *name, size_t len,
		      uint64_t ino, uint32_t type, bool must_be_new, int64_t mod_rev)
{
	Etcfs__Dirent de = ETCFS__DIRENT__INIT;
	struct efs_meta_key k;
	ProtobufCBinaryData b;
	int r;

	r = efs_fs_op_txn(op);
	if (r < 0)
		return r;
	r = ensure_opid(op);
	if (r < 0)
		return r;
	r = efs_meta_key_dirent(&op->fs->ns, parent, name, len, &k);
	if (r < 0)
		return r;
	de.ino = ino;
	de.type = type;
	de.op_id.data = op->op_id;
	de.op_id.len = op->op_id_len;
	r = efs_meta_pack(&de.base, &b);
	if (r < 0)
		return r;
	if (must_be_new && !op->has_vkey &&
	    (op->d->new_inode || op->d->code == EFS_FS_OP_LINK)) {
		op->vkey = k;
		op->has_vkey = true;
	}
	if (must_be_new)
		r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL, k.buf,
					 k.len, 0);
	else
		r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf,
					 k.len, mod_rev);
	if (r == 0)
		r = efs_etcd_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, b.data, b.len, 0);
	efs_mem_free(b.data);
	return r;
}

int efs_fs_del_dirent(struct efs_fs_op *op, uint64_t parent, const char *name, size_t len,
		      int64_t mod_rev)
{
	struct efs_meta_key k;
	int r;

	r = efs_fs_op_txn(op);
	if (r < 0)
		return r;
	r = efs_meta_key_dirent(&op->fs->ns, parent, name, len, &k);
	if (r < 0)
		return r;
	r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
				 mod_rev);
	if (r == 0)
		r = efs_etcd_txn_delete(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
					false);
	return r;
}

int efs_fs_del_family(struct efs_fs_op *op, enum efs_meta_family fam, uint64_t ino)
{
	struct efs_meta_range rg;
	int r;

	r = efs_meta_range_ino(&op->fs->ns, fam, ino, &rg);
	if (r < 0)
		return r;
	return efs_etcd_txn_delete(op->txn, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len,
				   rg.end.buf, rg.end.len, false);
}

/* ---- Steps ---- */

void efs_fs_op_run(struct efs_fs_op *op)
{
	step_session(op);
}

static void session_ready(struct efs_fs_op *op)
{
	int r;

	if (!op->planned) {
		op->planned = true;
		r = op->d->plan(op);
		if (r < 0 || r == EFS_FS_DONE) {
			efs_fs_op_finish(op, r < 0 ? r : 0);
			return;
		}
	}
	step_acquire(op);
}

static void session_cb(struct efs_session_waiter *w, int status, bool generation_changed)
{
	struct efs_fs_op *op = w->arg;

	(void)generation_changed;
	if (status < 0) {
		efs_fs_op_note(op, status, "session wait", NULL);
		efs_fs_op_finish(op, -EIO);
		return;
	}
	op->after_session(op);
}

/* Goes on with |then| once the session is ACTIVE (now, when it is): 0, or
 * -EIO when it cannot be waited for. */
static int session_then(struct efs_fs_op *op, void (*then)(struct efs_fs_op *op))
{
	int r;

	op->after_session = then;
	r = efs_session_wait(op->fs->s, &op->sw, session_cb, op);
	if (r < 0) {
		efs_fs_op_note(op, r, "session wait refused", NULL);
		return -EIO;
	}
	if (r == 1)
		then(op);
	return 0;
}

static void step_session(struct efs_fs_op *op)
{
	if (session_then(op, session_ready) < 0)
		efs_fs_op_finish(op, -EIO);
}

static void lock_cb(struct efs_lock_req *req, int status);
static void op_interrupt(fuse_req_t req, void *arg);

static bool slots_covered(const struct efs_fs_op *op)
{
	for (size_t i = 0; i < op->nslots; i++) {
		const struct efs_fs_slot *sl = &op->slots[i];

		if (!sl->in || sl->locked < sl->mode)
			return false;
		if (slot_wants_mx(op, sl) && !sl->mx)
			return false;
	}
	return true;
}

static void step_acquire(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	int r;

	for (size_t i = 0; i < op->nslots; i++) {
		if (!op->slots[i].in) {
			op->slots[i].in = efs_fs_iget(fs, op->slots[i].ino);
			if (!op->slots[i].in) {
				efs_fs_op_finish(op, -ENOMEM);
				return;
			}
			op->slots[i].in->refs++;
		}
	}
	if ((op->d->mutates || op->d->mx_all) && mx_acquire(op) == EFS_FS_WAIT) {
		/* Never hold lock pins while waiting on a node-local mutex. */
		if (op->lock_pinned) {
			efs_lock_put(fs->lc, &op->lr);
			op->lock_pinned = false;
			for (size_t i = 0; i < op->nslots; i++)
				op->slots[i].locked = EFS_LOCK_NONE;
		}
		return;
	}
	if (op->lock_pinned) {
		efs_lock_put(fs->lc, &op->lr);
		op->lock_pinned = false;
	}
	memset(&op->lr, 0, sizeof(op->lr));
	op->lr.n = op->nslots;
	for (size_t i = 0; i < op->nslots; i++) {
		op->lr.ino[i] = op->slots[i].ino;
		op->lr.mode[i] = op->slots[i].mode;
		op->held_before[i] = efs_lock_held(fs->lc, op->slots[i].ino);
	}
	/* A recall of a lock it pinned while it waits for another ends the
	 * acquisition (-EAGAIN, lock_cb): the release may need a mutex held
	 * here (a file's publication takes the file's). */
	op->lr.flags = op->lock_flags | EFS_LOCK_F_RESTART;
	/* Holding node-local mutexes, it must not wait for a drain: an
	 * operation pinning the lock may be waiting for one of them (a
	 * publication the fsync under that pin waits for). */
	for (size_t i = 0; i < op->nslots; i++)
		if (op->slots[i].mx)
			op->lr.flags |= EFS_LOCK_F_NESTED;
	op->lr.cb = lock_cb;
	op->lr.arg = op;
	if (op->nslots == 0) {
		lock_cb(&op->lr, 0);
		return;
	}
	r = efs_lock_acquire(fs->lc, &op->lr);
	if (r < 0) {
		efs_fs_op_note(op, r, "lock acquisition", NULL);
		efs_fs_op_finish(op, r == -EINTR ? -EINTR : -EIO);
		return;
	}
	if (r == 1) {
		lock_cb(&op->lr, 0);
		return;
	}
	op->lock_waiting = true;
	/* A publication queued on one of its mutexes meanwhile. */
	if (mx_wanted_by_writeback(op))
		mx_owner_yield(op);
	/* Last: libfuse calls it inline when the kernel interrupted already
	 * (the cancel's callback runs later, from the loop). */
	if (op->rq && op->rq->req && !op->intr_set) {
		op->intr_set = true;
		fuse_req_interrupt_func(op->rq->req, op_interrupt, op);
	}
}

/*
 * FUSE_INTERRUPT (on the loop, which reads the session): a lock wait ends
 * with -EINTR (lock_cb); registered only while the wait lasts.
 */
static void op_interrupt(fuse_req_t req, void *arg)
{
	struct efs_fs_op *op = arg;

	(void)req;
	if (op->lock_waiting)
		efs_lock_cancel(op->fs->lc, &op->lr);
}

static void yield_released(void *arg, int status)
{
	(void)status; /* a lost session fails the next acquisition */
	ready_push(arg, RESUME_ACQUIRE);
}

/* An acquisition that gives way drops its mutexes and its slots' locks:
 * it takes them all again from step_acquire, in order. */
static void acquire_drop(struct efs_fs_op *op)
{
	mx_release_all(op);
	for (size_t i = 0; i < op->nslots; i++)
		op->slots[i].locked = EFS_LOCK_NONE;
}

/*
 * The acquisition gave way to a recall of a lock it had pinned: drop the
 * mutexes too, wait until that release is done (it may publish under one
 * of them), then take the locks again (step_acquire, in inode order).
 */
static void lock_yield(struct efs_fs_op *op, const struct efs_lock_req *req)
{
	struct efs_fs *fs = op->fs;
	int r;

	acquire_drop(op);
	r = efs_lock_release_now(fs->lc, req->yield_ino, req->yield_to, yield_released, op);
	if (r == 1) {
		ready_push(op, RESUME_ACQUIRE);
	} else if (r < 0) {
		efs_fs_op_note(op, r, "lock release for a recall", NULL);
		efs_fs_op_finish(op, -EIO);
	}
}

static void lock_cb(struct efs_lock_req *req, int status)
{
	struct efs_fs_op *op = req->arg;
	struct efs_fs *fs = op->fs;

	op->lock_waiting = false;
	if (op->intr_set) {
		/* Only the wait is interruptible; the record may go before the
		 * reply (handed on), so the callback must not outlive it. */
		op->intr_set = false;
		fuse_req_interrupt_func(op->rq->req, NULL, NULL);
	}
	if (status == -EAGAIN) {
		op->mx_yield = false;
		lock_yield(op, req);
		return;
	}
	if (op->mx_yield) {
		op->mx_yield = false;
		if (status == -EINTR) {
			/* Cancelled for a publication (mx_owner_yield): it
			 * takes the mutex now; we queue behind it. */
			acquire_drop(op);
			ready_push(op, RESUME_ACQUIRE);
			return;
		}
	}
	if (status < 0) {
		efs_fs_op_note(op, status, "lock wait", NULL);
		efs_fs_op_finish(op, status == -EINTR ? -EINTR : -EIO);
		return;
	}
	op->lock_pinned = op->nslots > 0;
	for (size_t i = 0; i < op->nslots; i++) {
		if (op->held_before[i] < op->slots[i].mode) {
			efs_fs_count_txn(fs, EFS_FS_ORIG_LOCK, EFS_FS_TXN_OK);
			break;
		}
	}
	for (size_t i = 0; i < op->nslots; i++) {
		struct efs_fs_slot *sl = &op->slots[i];
		const Mvccpb__KeyValue *kv = req->recs[i];

		sl->locked = sl->mode;
		if (kv) {
			Etcfs__Inode *rec = NULL;
			const char *reason = NULL;

			if (efs_meta_inode_decode(kv->value.data, kv->value.len, &rec, &reason) == 0)
				efs_fs_inode_set(fs, sl->in, rec, kv->mod_revision, true);
			else
				sl->in->epoch = 0;
		} else if (op->held_before[i] < sl->mode) {
			/* Newly taken without a record: read it in the load step. */
			sl->in->epoch = 0;
		}
	}
	step_load(op);
}

static void load_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg);
static void load1_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg);

static void fill_range(Etcdserverpb__RangeRequest *rq, const struct efs_fs_kv *kv)
{
	rq->key.data = (uint8_t *)kv->key.buf;
	rq->key.len = kv->key.len;
	if (kv->end.len) {
		rq->range_end.data = (uint8_t *)kv->end.buf;
		rq->range_end.len = kv->end.len;
	}
	rq->limit = kv->limit;
	rq->keys_only = kv->keys_only;
	rq->count_only = kv->count_only;
}

static bool slot_needs_load(struct efs_fs_op *op, const struct efs_fs_slot *sl)
{
	if (op->force_load || (op->verify && sl->ino == op->check_ino))
		return true;
	return !efs_fs_inode_valid(op->fs, sl->in);
}

/*
 * Reads the op's keys and the inode records it lacks: one Range when there
 * is a single key (the client retries Range by itself, and a dropped Txn
 * reply then always belongs to a mutation), else one read-only Txn (one
 * snapshot for all of them), retried here after an unknown outcome since
 * it changes nothing.
 */
static void step_load(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	struct efs_etcd_txn *t = NULL;
	struct efs_fs_kv one;
	size_t n = 0;
	int r;

	free_rresp(op);
	for (size_t i = 0; i < op->nslots; i++) {
		op->slots[i].loading = slot_needs_load(op, &op->slots[i]);
		n += op->slots[i].loading;
	}
	n += op->nkv;
	op->nkv_loaded = op->nkv;
	if (n == 0) {
		op->loads_done++;
		op->force_load = false;
		step_loaded(op);
		return;
	}
	/* etcd must hold every change answered before this read. */
	if (batch_wait(op, RESUME_LOAD))
		return;
	if (n == 1) {
		struct efs_etcd_range_opts o = {0};

		r = 0;
		if (op->nkv) {
			one = op->kv[0];
		} else {
			memset(&one, 0, sizeof(one));
			for (size_t i = 0; i < op->nslots && r == 0; i++)
				if (op->slots[i].loading)
					r = efs_meta_key_inode(&fs->ns, op->slots[i].ino, &one.key);
		}
		o.range_end = one.end.len ? one.end.buf : NULL;
		o.range_end_len = one.end.len;
		o.limit = one.limit;
		o.keys_only = one.keys_only;
		o.count_only = one.count_only;
		if (r == 0)
			r = efs_etcd_range(fs->c, one.key.buf, one.key.len, &o, NULL, load1_cb, op);
		if (r < 0) {
			efs_fs_op_note(op, r, "read not sent", NULL);
			efs_fs_op_finish(op, -EIO);
		}
		return;
	}
	r = efs_etcd_txn_new(&t, 0);
	for (size_t i = 0; r == 0 && i < op->nkv; i++) {
		Etcdserverpb__RangeRequest rq = ETCDSERVERPB__RANGE_REQUEST__INIT;

		fill_range(&rq, &op->kv[i]);
		r = efs_etcd_txn_range_req(t, EFS_ETCD_TXN_SUCCESS, &rq);
	}
	for (size_t i = 0; r == 0 && i < op->nslots; i++)
		if (op->slots[i].loading)
			r = efs_fs_txn_read_inode(fs, t, op->slots[i].ino);
	r = efs_fs_read_txn(fs, t, r, load_cb, op);
	if (r < 0) {
		efs_fs_op_note(op, r, "read not sent", NULL);
		efs_fs_op_finish(op, r == -ENOMEM ? -ENOMEM : -EIO);
	}
}

/* Applies the ranges of one load, in step_load's order. */
/* True when |in| holds a trusted record newer than what a read at
 * revision |rev| returned (a mutation of this node committed meanwhile). */
static bool cache_is_newer(struct efs_fs *fs, struct efs_fs_inode *in, int64_t rev)
{
	return efs_fs_inode_valid(fs, in) && rev > 0 && in->mod_rev > rev;
}

static void load_parse(struct efs_fs_op *op, Etcdserverpb__RangeResponse **rrs, size_t n,
		       int64_t rev)
{
	struct efs_fs *fs = op->fs;
	size_t idx = 0;

	for (size_t i = 0; i < op->nkv; i++, idx++) {
		Etcdserverpb__RangeResponse *rr = idx < n ? rrs[idx] : NULL;
		struct efs_fs_kv *kv = &op->kv[i];

		if (!rr)
			goto bad;
		kv->kvs = rr->kvs;
		kv->nkvs = rr->n_kvs;
		kv->count = rr->count;
		kv->found = rr->n_kvs > 0 || (kv->count_only && rr->count > 0);
		if (rr->n_kvs > 0) {
			kv->mod_rev = rr->kvs[0]->mod_revision;
			kv->create_rev = rr->kvs[0]->create_revision;
			kv->val = rr->kvs[0]->value.data;
			kv->val_len = rr->kvs[0]->value.len;
		}
	}
	for (size_t i = 0; i < op->nslots; i++) {
		struct efs_fs_slot *sl = &op->slots[i];
		Etcdserverpb__RangeResponse *rr;
		bool trusted;

		if (!sl->loading)
			continue;
		rr = idx < n ? rrs[idx] : NULL;
		idx++;
		if (!rr)
			goto bad;
		trusted = efs_lock_held(fs->lc, sl->ino) != EFS_LOCK_NONE;
		if (cache_is_newer(fs, sl->in, rr->n_kvs ? rr->kvs[0]->mod_revision : rev))
			continue;
		if (rr->n_kvs == 0) {
			efs_fs_inode_set(fs, sl->in, NULL, 0, trusted);
		} else {
			Etcfs__Inode *rec = NULL;
			const char *reason = NULL;

			if (efs_meta_inode_decode(rr->kvs[0]->value.data, rr->kvs[0]->value.len,
						  &rec, &reason) < 0) {
				efs_log_warn("fs: inode %llu: bad record: %s",
					     (unsigned long long)sl->ino, reason ? reason : "?");
				efs_fs_op_finish(op, -EIO);
				return;
			}
			efs_fs_inode_set(fs, sl->in, rec, rr->kvs[0]->mod_revision, trusted);
		}
	}
	op->loads_done++;
	op->load_rev = rev;
	op->force_load = false;
	op->read_tries = 0;
	step_loaded(op);
	return;
bad:
	efs_fs_op_note(op, -EBADMSG, "read", "fewer ranges in the reply than asked");
	efs_fs_op_finish(op, -EIO);
}

static void load_again(struct efs_fs_op *op)
{
	if (session_then(op, step_load) < 0)
		efs_fs_op_finish(op, -EIO);
}

/*
 * A read that failed for a transient reason is sent again — but while the
 * session is not ACTIVE (etcd unreachable, a quorum loss) the retry first
 * waits for the session, so that the quorum-loss bound (efs_session_wait:
 * EIO after --quorum-timeout) applies to reads in flight too instead of
 * every retry running to its own deadline.
 */
static bool read_retry(struct efs_fs_op *op, const struct efs_etcd_result *r)
{
	if (!(r->outcome_unknown || r->err == -ETIMEDOUT || r->err == -ECONNRESET ||
	      r->err == -EAGAIN || r->err == -ENOTCONN))
		return false;
	if (!may_retry(op, ++op->read_tries))
		return false;
	efs_counter_inc(op->fs->m_retries);
	efs_log_debug("fs: %s: read failed (%s), again", efs_fs_op_names[op->d->code],
		      r->message);
	retry_later(op, load_again);
	return true;
}

/* A load that failed is sent again or ends the operation: true then. */
static bool load_failed(struct efs_fs_op *op, const struct efs_etcd_result *r)
{
	if (!r->err)
		return false;
	efs_fs_op_note(op, r->err, "read", r->message);
	if (read_retry(op, r))
		return true;
	efs_log_debug("fs: %s: read failed: %s", efs_fs_op_names[op->d->code], r->message);
	efs_fs_op_finish(op, -EIO);
	return true;
}

static void load1_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct efs_fs_op *op = arg;

	if (load_failed(op, r))
		return;
	r->resp = NULL;
	op->rresp1 = resp;
	load_parse(op, &resp, 1, resp->header ? resp->header->revision : 0);
}

static void load_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct efs_fs_op *op = arg;
	Etcdserverpb__RangeResponse *rrs[EFS_FS_KV_MAX + EFS_LOCK_REQ_MAX];
	size_t n = 0;

	if (load_failed(op, r))
		return;
	r->resp = NULL;
	op->rresp = resp;
	for (size_t i = 0; i < resp->n_responses && n < EFS_FS_KV_MAX + EFS_LOCK_REQ_MAX; i++) {
		if (efs_etcd_txn_resp_range(resp, i, &rrs[n]) < 0)
			break;
		n++;
	}
	load_parse(op, rrs, n, resp->header ? resp->header->revision : 0);
}

/*
 * The caches take the records |op| wrote, at revision |rev|; |batched|: at
 * the revisions they had (the batch's compares expect those until it
 * commits, batch.c), each lock the batch compares pinned until then.
 */
static void apply_out(struct efs_fs_op *op, int64_t rev, bool batched)
{
	struct efs_fs *fs = op->fs;
	bool oref = batched && op->d->code == EFS_FS_OP_CREATE && fs->reclaim_priv;

	for (size_t i = 0; i < op->nout; i++) {
		struct efs_fs_out *o = &op->out[i];
		struct efs_fs_inode *in = efs_fs_iget(fs, o->ino);
		Etcfs__Inode *rec = NULL;

		if (!in)
			continue;
		in->refs++;
		if (batched) {
			if (efs_meta_inode_decode(o->val.data, o->val.len, &rec, NULL) == 0)
				efs_fs_inode_set(fs, in, rec, o->is_new ? 0 : o->mod_rev, true);
			else
				in->epoch = 0;
			/* The operation's own pins hold the locks exclusively now. */
			efs_fs_batch_note(op, o->ino, o->is_new, efs_lock_pin_held(fs->lc, o->ino),
					  oref && o->ino == op->new_ino);
		} else if (o->del) {
			efs_fs_inode_dropped(fs, o->ino);
			efs_fs_inode_set(fs, in, NULL, rev, true);
			efs_lock_forget(fs->lc, o->ino);
			fs->icount--;
		} else if (efs_fs_inode_valid(fs, in) && in->rec && in->mod_rev > rev) {
			/* Settled after an unknown outcome: the load read a newer
			 * record (a peer rewrote it since), keep that one. */
		} else if (efs_meta_inode_decode(o->val.data, o->val.len, &rec, NULL) == 0) {
			efs_fs_inode_set(fs, in, rec, rev, true);
		} else {
			in->epoch = 0;
		}
		efs_fs_iput(fs, in);
	}
}

/* |rev| 0 and |batched|: the changes joined the batch of delegated changes
 * instead of a commit. */
static void op_done(struct efs_fs_op *op, int64_t rev, bool batched)
{
	op->commit_rev = rev;
	op->committed = true;
	report_outcome(op, EFS_FS_COMMITTED, rev);
	/* The new inode's lock first: its record, written under that grant,
	 * is cached under it (a record set before the grant would be
	 * trusted under none, and read again by the next operation). */
	if (op->granted) {
		efs_lock_grant_committed(op->fs->lc, op->new_ino, true);
		op->granted = false;
	}
	apply_out(op, rev, batched);
	op->d->done(op);
	efs_fs_op_finish(op, 0);
}

/* True when the verify read of the new name found a dirent with our op id. */
static bool vkv_is_ours(const struct efs_fs_op *op)
{
	const struct efs_fs_kv *kv;
	Etcfs__Dirent *de = NULL;
	bool ours;

	if (!op->vkv || op->nkv_loaded < op->vkv)
		return false;
	kv = &op->kv[op->vkv - 1];
	if (!kv->found || efs_meta_dirent_decode(kv->val, kv->val_len, &de, NULL) < 0)
		return false;
	ours = efs_fs_opid_equal(de->op_id.data, de->op_id.len, op->op_id, op->op_id_len);
	efs_meta_record_free(de);
	return ours;
}

static void step_loaded(struct efs_fs_op *op)
{
	int r;

	if (op->verify) {
		struct efs_fs_slot *sl = slot_of(op, op->check_ino);
		const Etcfs__Inode *rec = sl && sl->in && !sl->in->gone ? sl->in->rec : NULL;

		op->verify = false;
		op->unsettled = false;
		if (rec && efs_fs_opid_equal(rec->op_id.data, rec->op_id.len, op->op_id,
					     op->op_id_len)) {
			op_done(op, sl->in->mod_rev, false);
			return;
		}
		if (vkv_is_ours(op)) {
			op_done(op, op->kv[op->vkv - 1].mod_rev, false);
			return;
		}
		report_outcome(op, EFS_FS_FAILED, 0);
		if (op->granted) {
			efs_lock_grant_committed(op->fs->lc, op->new_ino, false);
			op->granted = false;
		}
	}
	r = op->d->plan(op);
	if (r < 0 || r == EFS_FS_DONE) {
		efs_fs_op_finish(op, r < 0 ? r : 0);
		return;
	}
	if (!slots_covered(op)) {
		if (++op->replans > EFS_FS_RETRY_MAX) {
			efs_fs_op_note(op, -EAGAIN, "plan",
				       "the inodes to lock kept changing after each load");
			efs_fs_op_finish(op, -EIO);
			return;
		}
		step_acquire(op);
		return;
	}
	if (op->nkv_loaded < op->nkv) {
		step_load(op);
		return;
	}
	step_prepare(op);
}

/* ---- Inode numbers and the inode limit ---- */

/* Empties a wait queue and resumes each of its operations at the prepare
 * step with |err|; |counted|: the inode count they waited for is known. */
static void queue_wake(struct efs_list *q, int err, bool counted)
{
	struct efs_list list, *n;

	efs_list_init(&list);
	efs_list_splice_tail(&list, q);
	while ((n = efs_list_pop(&list))) {
		struct efs_fs_op *op = efs_list_entry(n, struct efs_fs_op, qlink);

		op->wait_err = err;
		if (counted)
			op->counted = true;
		ready_push(op, RESUME_PREPARE);
	}
}

static void ino_wake(struct efs_fs *fs, int err)
{
	queue_wake(&fs->ino_waiters, err, false);
}

struct ino_reserve {
	struct efs_fs *fs;
	int tries;
	uint64_t next;
};

static void ino_read(struct ino_reserve *ir);

/* Ends the reservation |ir| and wakes its waiters with |err|. */
static void ino_finish(struct ino_reserve *ir, int err)
{
	struct efs_fs *fs = ir->fs;

	fs->ino_busy = false;
	efs_mem_free(ir);
	ino_wake(fs, err);
}

static void ino_txn_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct ino_reserve *ir = arg;
	struct efs_fs *fs = ir->fs;
	enum efs_fs_outcome oc = efs_fs_txn_outcome(fs, EFS_FS_ORIG_INO, r, resp);

	if (r->err) {
		/* After an unknown outcome the block may be ours or not: numbers
		 * are never reused, so simply reserve again. */
		if (r->outcome_unknown && ++ir->tries < EFS_FS_RETRY_MAX) {
			efs_counter_inc(fs->m_retries);
			ino_read(ir);
			return;
		}
		goto fail;
	}
	if (oc == EFS_FS_TXN_CONFLICT) {
		if (++ir->tries < EFS_FS_RETRY_MAX) {
			ino_read(ir);
			return;
		}
		goto fail;
	}
	fs->ino_next = ir->next;
	fs->ino_end = ir->next + fs->ino_batch;
	ino_finish(ir, 0);
	return;
fail:
	ino_finish(ir, -EIO);
}

static void ino_read_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct ino_reserve *ir = arg;
	struct efs_fs *fs = ir->fs;
	Etcfs__InoCounter *ctr = NULL;
	Etcfs__InoCounter nc = ETCFS__INO_COUNTER__INIT;
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key k;
	int64_t rev;
	int e;

	if (r->err || resp->n_kvs == 0)
		goto fail;
	if (efs_meta_ino_counter_decode(resp->kvs[0]->value.data, resp->kvs[0]->value.len, &ctr,
					NULL) < 0)
		goto fail;
	rev = resp->kvs[0]->mod_revision;
	ir->next = ctr->next < 3 ? 3 : ctr->next;
	efs_meta_record_free(ctr);
	nc.next = ir->next + fs->ino_batch;
	e = efs_meta_key_ino_counter(&fs->ns, &k);
	if (e == 0)
		e = efs_etcd_txn_new(&t, 0);
	if (e == 0)
		e = efs_session_guard(fs->s, t);
	if (e == 0)
		e = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
					 rev);
	if (e == 0)
		e = efs_meta_txn_put(t, EFS_ETCD_TXN_SUCCESS, &k, &nc.base, 0);
	if (e == 0)
		e = efs_etcd_txn(fs->c, efs_etcd_txn_request(t), NULL, ino_txn_cb, ir);
	efs_etcd_txn_free(t);
	if (e < 0)
		goto fail;
	return;
fail:
	efs_log_debug("fs: cannot reserve inode numbers: %s", r->err ? r->message : "bad counter");
	ino_finish(ir, -EIO);
}

static void ino_read(struct ino_reserve *ir)
{
	struct efs_fs *fs = ir->fs;
	struct efs_meta_key k;
	int r;

	r = efs_meta_key_ino_counter(&fs->ns, &k);
	if (r == 0)
		r = efs_etcd_range(fs->c, k.buf, k.len, NULL, NULL, ino_read_cb, ir);
	if (r < 0)
		ino_finish(ir, -EIO);
}

/* EFS_FS_CONT with op->new_ino set, or EFS_FS_WAIT (queued). */
static int ino_alloc(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	struct ino_reserve *ir;

	if (fs->ino_next < fs->ino_end) {
		op->new_ino = fs->ino_next++;
		return EFS_FS_CONT;
	}
	efs_list_add_tail(&fs->ino_waiters, &op->qlink);
	if (fs->ino_busy)
		return EFS_FS_WAIT;
	ir = efs_mem_calloc(1, sizeof(*ir));
	if (!ir) {
		ino_wake(fs, -ENOMEM);
		return EFS_FS_WAIT;
	}
	ir->fs = fs;
	fs->ino_busy = true;
	ino_read(ir);
	return EFS_FS_WAIT;
}

static void count_wake(struct efs_fs *fs, int err)
{
	queue_wake(&fs->count_waiters, err, true);
}

static void count_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct efs_fs *fs = arg;

	fs->count_busy = false;
	if (r->err) {
		count_wake(fs, -EIO);
		return;
	}
	fs->icount = resp->count;
	fs->count_known = true;
	fs->icount_ns = efs_clock_mono_ns();
	count_wake(fs, 0);
}

int efs_fs_count_inodes(struct efs_fs *fs, efs_etcd_range_cb cb, void *arg)
{
	struct efs_meta_range rg;
	struct efs_etcd_range_opts o = {0};
	int r;

	r = efs_meta_range_family(&fs->ns, EFS_META_K_INODE, &rg);
	if (r < 0)
		return r;
	o.range_end = rg.end.buf;
	o.range_end_len = rg.end.len;
	o.count_only = true;
	return efs_etcd_range(fs->c, rg.key.buf, rg.key.len, &o, NULL, cb, arg);
}

/* EFS_FS_CONT when a new inode fits under the limit, EFS_FS_WAIT while
 * counting, -ENOSPC. */
static int count_check(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	uint64_t limit = fs->fi->inode_limit;
	/* This node's estimate: the count read last, moved by its own creates
	 * and deletes only. It falls below zero when the node deleted more of
	 * its peers' inodes than the count knew of: read it again then. */
	int64_t used = fs->icount + fs->icreating;
	int r;

	if (!limit)
		return EFS_FS_CONT;
	if (!op->counted &&
	    (!fs->count_known || used < 0 || (uint64_t)used + 1 + EFS_FS_INODE_SLACK > limit)) {
		/* The count must see the inodes of creates answered already:
		 * it is read after the batch of delegated changes. */
		if (!fs->count_busy && batch_wait(op, RESUME_PREPARE))
			return EFS_FS_WAIT;
		efs_list_add_tail(&fs->count_waiters, &op->qlink);
		if (fs->count_busy)
			return EFS_FS_WAIT;
		r = efs_fs_count_inodes(fs, count_cb, fs);
		if (r < 0) {
			count_wake(fs, -EIO);
			return EFS_FS_WAIT;
		}
		fs->count_busy = true;
		return EFS_FS_WAIT;
	}
	if (used >= 0 && (uint64_t)used + 1 > limit) {
		efs_log_debug("fs: %s: the inode limit %llu is reached (%lld counted, %lld being "
			      "made)",
			      efs_fs_op_names[op->d->code], (unsigned long long)limit,
			      (long long)fs->icount, (long long)fs->icreating);
		return -ENOSPC;
	}
	return EFS_FS_CONT;
}

static void step_prepare(struct efs_fs_op *op)
{
	int r;

	if (op->wait_err) {
		efs_fs_op_note(op, op->wait_err, "inode numbers or count", NULL);
		efs_fs_op_finish(op, op->wait_err);
		return;
	}
	if (op->d->mutates && op->fs->read_only) {
		efs_fs_op_finish(op, -EROFS);
		return;
	}
	if (op->d->grows && efs_capacity_check_growth(op->fs->cap) < 0) {
		efs_log_debug("fs: %s: etcd's space is low: ENOSPC", efs_fs_op_names[op->d->code]);
		efs_fs_op_finish(op, -ENOSPC);
		return;
	}
	if (op->d->new_inode && !op->creating) {
		r = count_check(op);
		if (r == EFS_FS_WAIT)
			return;
		if (r < 0) {
			efs_fs_op_finish(op, r);
			return;
		}
		op->creating = true;
		op->fs->icreating++;
	}
	if (op->d->new_inode && !op->new_ino) {
		r = ino_alloc(op);
		if (r == EFS_FS_WAIT)
			return;
	}
	if (op->d->new_inode && !op->newin) {
		/* Pinned so that the committed record stays cached for the reply. */
		op->newin = efs_fs_iget(op->fs, op->new_ino);
		if (!op->newin) {
			efs_fs_op_finish(op, -ENOMEM);
			return;
		}
		op->newin->refs++;
	}
	step_op_prepare(op);
}

/* The descriptor's own prepare, then the build. */
static void step_op_prepare(struct efs_fs_op *op)
{
	int r;

	if (op->d->prepare) {
		/* Preparations read etcd (listings) or start commits of
		 * their own (a publication's allocations): after the batch. */
		if (batch_wait(op, RESUME_OP_PREPARE))
			return;
		r = op->d->prepare(op);
		if (r == EFS_FS_WAIT)
			return;
		if (r < 0 || r == EFS_FS_DONE) {
			efs_fs_op_finish(op, r < 0 ? r : 0);
			return;
		}
	}
	step_build(op);
}

void efs_fs_op_resume_prepare_at(struct efs_fs_op *op, int err, const char *func, int line)
{
	if (err < 0) {
		efs_fs_op_finish_at(op, err, func, line);
		return;
	}
	step_op_prepare(op);
}

void efs_fs_op_restart(struct efs_fs_op *op)
{
	if (op->granted) {
		efs_lock_grant_committed(op->fs->lc, op->new_ino, false); /* never sent */
		op->granted = false;
	}
	if (++op->conflicts > EFS_FS_RETRY_MAX) {
		efs_fs_op_note(op, -EAGAIN, "restart", "retries spent");
		efs_fs_op_finish(op, -EIO);
		return;
	}
	efs_counter_inc(op->fs->m_retries);
	op->force_load = true;
	step_session(op);
}

/* ---- Commit ---- */

static void commit_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct efs_fs_op *op = arg;
	struct efs_fs *fs = op->fs;
	enum efs_fs_outcome oc = efs_fs_txn_outcome(fs, op->d->origin, r, resp);

	if (r->err) {
		efs_capacity_note_error(fs->cap, r->err);
		efs_fs_op_note(op, r->err,
			       oc == EFS_FS_TXN_UNKNOWN ? "commit, outcome unknown" : "commit",
			       r->message);
		if (oc == EFS_FS_TXN_UNKNOWN) {
			efs_counter_inc(fs->m_retries);
			op->unsettled = true;
			/* Its names may have changed or not: a listing of a
			 * directory it holds read from now on (its retry may
			 * give the directory up meanwhile) cannot tell, so none
			 * makes a name cache whole. */
			for (size_t i = 0; i < op->nslots; i++) {
				struct efs_fs_inode *in = op->slots[i].in;

				if (in && in->rec && S_ISDIR(in->rec->mode)) {
					in->rmseq++;
					in->mseq++;
				}
			}
			report_outcome(op, EFS_FS_UNKNOWN, 0);
			if (!may_retry(op, ++op->retries)) {
				efs_fs_op_finish(op, -EIO);
				return;
			}
			op->verify = op->check_ino != 0;
			if (op->verify && op->has_vkey && !op->vkv) {
				struct efs_fs_kv *kv = efs_fs_want_kv(op);

				if (kv) {
					kv->key = op->vkey;
					op->vkv = op->nkv;
				}
			}
			op->force_load = true;
			retry_later(op, step_session);
			return;
		}
		report_outcome(op, EFS_FS_FAILED, 0);
		if ((r->err == -EBUSY || r->err == -EAGAIN) && may_retry(op, ++op->retries)) {
			/* Refused before it applied (etcd's apply backlog): again. */
			if (op->granted) {
				efs_lock_grant_committed(fs->lc, op->new_ino, false);
				op->granted = false;
			}
			efs_counter_inc(fs->m_retries);
			op->force_load = true;
			retry_later(op, step_session);
			return;
		}
		/* The caller gets an errno that says little: say why here. */
		efs_log_warn("fs: %s: transaction failed after %d tries: %s (%s)",
			     efs_fs_op_names[op->d->code], op->retries, r->message,
			     r->err == -ENOSPC ? "ENOSPC" : "EIO");
		efs_fs_op_finish(op, r->err == -ENOSPC ? -ENOSPC : -EIO);
		return;
	}
	if (oc == EFS_FS_TXN_CONFLICT) {
		efs_fs_op_note(op, -EAGAIN, "commit", "a compare failed");
		efs_counter_inc(fs->m_retries);
		report_outcome(op, EFS_FS_FAILED, 0);
		if (op->granted) {
			efs_lock_grant_committed(fs->lc, op->new_ino, false);
			op->granted = false;
		}
		if (++op->conflicts > EFS_FS_RETRY_MAX) {
			efs_fs_op_finish(op, -EIO);
			return;
		}
		op->force_load = true;
		step_session(op);
		return;
	}
	op->commit_resp = resp; /* for the outcome hook (report_outcome clears it) */
	op_done(op, resp->header ? resp->header->revision : 0, false);
}

static int add_guards(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	int r;

	r = efs_session_guard(fs->s, op->txn);
	if (r < 0)
		return r;
	for (size_t i = 0; i < op->nslots; i++) {
		if (op->slots[i].mode != EFS_LOCK_EXCLUSIVE)
			continue;
		r = efs_lock_guard(fs->lc, op->txn, op->slots[i].ino, EFS_LOCK_EXCLUSIVE);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < op->nout; i++) {
		struct efs_fs_out *o = &op->out[i];
		struct efs_meta_key k;

		r = efs_meta_key_inode(&fs->ns, o->ino, &k);
		if (r < 0)
			return r;
		if (o->is_new)
			r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL,
						 k.buf, k.len, 0);
		else
			r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL,
						 k.buf, k.len, o->mod_rev);
		if (r < 0)
			return r;
		if (o->del)
			r = efs_etcd_txn_delete(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL,
						0, false);
		else
			r = efs_etcd_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len,
					     o->val.data, o->val.len, 0);
		if (r < 0)
			return r;
	}
	if (op->d->new_inode && op->new_ino) {
		r = efs_lock_grant_in_txn(fs->lc, op->txn, op->new_ino);
		if (r < 0)
			return r;
		op->granted = true;
	}
	return 0;
}

static void step_seal(struct efs_fs_op *op);
static void step_send(struct efs_fs_op *op);

static void step_build(struct efs_fs_op *op)
{
	int r;

	op->batched = false;
	if (op->d->mutates) {
		/* A change decided under held exclusive locks joins the batch;
		 * any other commit goes after it, built with the revisions its
		 * commit leaves (the records it compares may be in it). */
		op->batched = efs_fs_batch_eligible(op);
		if (!op->batched && batch_wait(op, RESUME_BUILD))
			return;
	}
	reset_out(op);
	if (op->d->mutates) {
		r = efs_fs_op_txn(op);
		if (r < 0) {
			efs_fs_op_finish(op, r);
			return;
		}
	}
	r = op->d->build(op);
	if (r == EFS_FS_WAIT) {
		/* A build never waits (prepare does). */
		efs_log_err("fs: %s: build asked to wait", efs_fs_op_names[op->d->code]);
#if EFS_FAULT_HOOKS
		abort(); /* test builds: a bug to find, not to survive */
#endif
		r = -EIO;
	}
	if (r < 0 || r == EFS_FS_DONE) {
		efs_fs_op_finish(op, r < 0 ? r : 0);
		return;
	}
	step_seal(op);
}

/* The descriptor's seal (it may wait), then the guards and the commit. */
static void step_seal(struct efs_fs_op *op)
{
	int r;

	if (op->d->seal) {
		r = op->d->seal(op);
		if (r == EFS_FS_WAIT)
			return;
		if (r < 0) {
			report_outcome(op, EFS_FS_FAILED, 0);
			efs_fs_op_finish(op, r);
			return;
		}
	}
	step_send(op);
}

void efs_fs_op_resume_seal_at(struct efs_fs_op *op, int err, const char *func, int line)
{
	if (err < 0) {
		report_outcome(op, EFS_FS_FAILED, 0);
		efs_fs_op_finish_at(op, err, func, line);
		return;
	}
	step_seal(op);
}

/* Guards, the idle releases riding along, and the commit. */
static void step_send(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	int r;

	r = add_guards(op);
	if (r < 0)
		efs_fs_op_note(op, r, "guards", r == -ENOLCK ? "a lock was lost" : NULL);
	if ((r == -ENOLCK || r == -EIO) && may_retry(op, op->retries + 1)) {
		/* A lock or the session went (a loss, a recall) between the
		 * acquisition and now: wait for the session and lock again. */
		if (op->granted) {
			efs_lock_grant_committed(fs->lc, op->new_ino, false);
			op->granted = false;
		}
		/* The built transaction is dropped: a data contribution ends
		 * (its fdatasync and allocator part are redone on rebuild). */
		report_outcome(op, EFS_FS_FAILED, 0);
		op->retries++;
		op->force_load = true;
		retry_later(op, step_session);
		return;
	}
	if (r < 0) {
		report_outcome(op, EFS_FS_FAILED, 0);
		efs_log_debug("fs: %s: cannot build the transaction: %d",
			      efs_fs_op_names[op->d->code], r);
		efs_fs_op_finish(op, r == -ENOLCK ? -EIO : r == -ENOMEM ? -ENOMEM : -EIO);
		return;
	}
	if (op->batched) {
		r = efs_fs_batch_add(op);
		if (r == 0) {
			op_done(op, 0, true);
			return;
		}
		if (op->granted) {
			efs_lock_grant_committed(fs->lc, op->new_ino, false); /* never sent */
			op->granted = false;
		}
		if (r == -ENOMEM) {
			efs_fs_op_finish(op, -ENOMEM);
			return;
		}
		if (r == -EINVAL)
			op->no_batch = true; /* not batchable: it commits alone */
		/* Full or in flight: build again once it is gone (then
		 * joining the next batch, or committing alone). */
		op->batched = false;
		if (!batch_wait(op, RESUME_BUILD))
			step_build(op);
		return;
	}
	/* Last, after the guards: idle releases ride what goes out anyway. */
	r = efs_lock_ride_idle(fs->lc, op->txn, op->ride, EFS_LOCK_RIDE_MAX);
	op->nride = r > 0 ? (size_t)r : 0;
	r = efs_etcd_txn(fs->c, efs_etcd_txn_request(op->txn), NULL, commit_cb, op);
	if (r < 0) {
		efs_fs_op_note(op, r, "commit not sent", NULL);
		report_outcome(op, EFS_FS_FAILED, 0);
		efs_fs_op_finish(op, -EIO);
		return;
	}
}
