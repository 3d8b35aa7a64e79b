/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Delegated namespace changes (-o delegate): creates decided under a
 * directory's exclusive lock, answered at once, committed in batches.
 *
 * A node that holds a directory's lock exclusively knows every name in it
 * and no other node may change them, so a create, mknod, mkdir or symlink
 * in it needs etcd only to make the change durable and visible, not to
 * decide it. Such an operation builds its transaction as usual (compares
 * and puts, the guards, the new inode's holder key), but instead of
 * sending it the engine merges it into the batch here, applies its
 * records to the caches and replies. The batch commits as one transaction
 * when it is full, a few milliseconds after its first change, or at once
 * when anything needs it durable or visible:
 *   - every other etcd read or commit of the fs (a load, a listing, any
 *     operation's own transaction, a publication) waits for the batch
 *     first, so commits stay in the order their operations ran and
 *     nothing reads etcd without the changes already answered;
 *   - every lock the batch's guards compare (the directory's, the new
 *     inode's) stays pinned until the batch
 *     commits, so none is released before it: a peer's recall sends the
 *     batch at once (efs_lockcache_set_wanted_fn) and waits for its
 *     commit, and no change joins it meanwhile (efs_lock_may_defer);
 *   - fsyncdir, an fsync (its publication waits as above), a sync request
 *     and a clean leave wait for it.
 * Merging: one compare per key and target, the first (what etcd holds
 * before the batch, as every merged operation saw it: the records it
 * changed keep their published revision in the cache until the batch
 * commits); one put per key, the last. Only one batch exists at a time:
 * while it is in flight, operations that would join it wait for it and
 * build again (the revisions they compare move with its commit).
 *
 * A crash loses the batch whole (a create no fsync asked for may vanish,
 * never half of one). A batch that fails (a lost lock or session, a
 * compare that no longer holds) drops what it carried from the caches;
 * the next fsync, fsyncdir or sync answers EIO, and delegation stays off
 * for EFS_FS_BATCH_OFF_MS.
 */
#include "fs/fs-int.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "etcd/kv.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timer.h"

#define BATCH_MAX EFS_ETCD_TXN_MAX_OPS
/* After a failed batch, operations commit one by one this long. */
#define EFS_FS_BATCH_OFF_MS 10000
/* Unknown outcome: the batch's first put is read back every VERIFY_MS, for
 * as long as the session's quorum-loss bound (at least VERIFY_MIN_MS). */
#define VERIFY_MS     100
#define VERIFY_MIN_MS 5000
/* A refusal that did not apply (etcd busy, a connection down): sent again
 * after a backoff doubling from RESEND_MS to RESEND_MAX_MS, for as long as
 * the same bound. */
#define RESEND_MS     10
#define RESEND_MAX_MS 500

struct bput {
	uint8_t *key;
	size_t klen;
	uint8_t *val;
	size_t vlen;
	int64_t lease;
};

struct bino {
	struct efs_fs_inode *in; /* a reference */
	void *pin;		 /* a new inode's lock (efs_lock_pin_held) */
	bool is_new;
	bool oref; /* a new file whose open reference rides the batch */
};

struct bwait {
	struct efs_list link;
	void (*cb)(void *arg, int status);
	void *arg;
};

struct efs_fs_batch {
	struct efs_fs *fs;
	size_t ncmp, nput, nino, nops;
	struct efs_etcd_cmp cmp[BATCH_MAX]; /* key and value owned (efs_mem) */
	struct bput put[BATCH_MAX];
	struct bino ino[BATCH_MAX];
	bool flying;
	bool calling; /* an etcd call of it is out (its callback is to come) */
	bool poisoned; /* a merge failed part way (ENOMEM): it must not commit */
	int tries;
	uint64_t first_ns;
	uint64_t unknown_ns; /* monotonic: when its outcome became unknown */
	uint64_t refused_ns; /* monotonic: its first refusal (not applied) */
	bool verifying;      /* the timer reads back (else it sends again) */
	bool was_unknown;    /* an earlier send's outcome was unknown */
	size_t vidx;	     /* the put read back: a record carrying an op id */
	struct efs_list waiters; /* struct bwait */
	struct efs_list opwait;	 /* operations (op->qlink) */
	uv_timer_t *timer;	 /* the send a few ms after the first change */
	uv_timer_t *vtimer;	 /* unknown outcome: the read-back's delay */
	int64_t epoch;		 /* fs epoch when the first change joined */
};

static void bsend(struct efs_fs_batch *b);
static void timer_cb(uv_timer_t *t);
static uint64_t settle_bound_ns(const struct efs_fs_batch *b);

bool efs_fs_batch_busy(const struct efs_fs *fs)
{
	const struct efs_fs_batch *b = fs->batch;

	return b && (b->nops > 0 || b->flying);
}

static void bclear(struct efs_fs_batch *b)
{
	for (size_t i = 0; i < b->ncmp; i++) {
		efs_mem_free((void *)b->cmp[i].key);
		efs_mem_free((void *)b->cmp[i].value);
	}
	for (size_t i = 0; i < b->nput; i++) {
		efs_mem_free(b->put[i].key);
		efs_mem_free(b->put[i].val);
	}
	b->ncmp = b->nput = b->nino = b->nops = 0;
	b->flying = false;
	b->poisoned = false;
	b->tries = 0;
	b->verifying = false;
	b->was_unknown = false;
	b->vidx = 0;
}

/* A peer recalls a lock: the batch may pin it, so it goes now rather than
 * at its timer (it commits within a round trip either way). */
static void lock_wanted(void *arg, uint64_t ino)
{
	struct efs_fs_batch *b = arg;

	/* From the lock cache's watch callback: sent from the loop, not
	 * from inside it (a failure unpins and runs callbacks). */
	(void)ino;
	if (b->nops && !b->flying)
		uv_timer_start(b->timer, timer_cb, 0, 0);
}

int efs_fs_batch_init(struct efs_fs *fs)
{
	struct efs_fs_batch *b = efs_mem_calloc(1, sizeof(*b));

	if (!b)
		return -ENOMEM;
	b->fs = fs;
	efs_list_init(&b->waiters);
	efs_list_init(&b->opwait);
	b->timer = efs_timer_new(fs->loop, b);
	b->vtimer = efs_timer_new(fs->loop, b);
	if (!b->timer || !b->vtimer) {
		efs_timer_free(b->timer);
		efs_timer_free(b->vtimer);
		efs_mem_free(b);
		return -ENOMEM;
	}
	fs->batch = b;
	efs_lockcache_set_wanted_fn(fs->lc, lock_wanted, b);
	return 0;
}

void efs_fs_batch_free(struct efs_fs *fs)
{
	struct efs_fs_batch *b = fs->batch;

	if (!b)
		return;
	efs_lockcache_set_wanted_fn(fs->lc, NULL, NULL);
	/* A clean leave waits for the batch (efs_fs_leave); one never sent
	 * is lost as a crash would lose it. */
	for (size_t i = 0; i < b->nino; i++) {
		efs_lock_unpin_held(fs->lc, b->ino[i].pin);
		efs_fs_iput(fs, b->ino[i].in);
	}
	while (!efs_list_empty(&b->waiters)) {
		struct efs_list *n = efs_list_pop(&b->waiters);

		efs_mem_free(efs_list_entry(n, struct bwait, link));
	}
	b->timer = efs_timer_free(b->timer);
	b->vtimer = efs_timer_free(b->vtimer);
	fs->batch = NULL;
	if (b->flying && !b->calling) {
		/* Waiting on a timer to send again or read back: no call
		 * will come back. */
		fs->inflight--;
		b->flying = false;
	}
	if (b->calling) {
		/* Its reply is still to come (the etcd client runs every
		 * callback, cancelled ones too): freed then. */
		b->fs = NULL;
		b->nino = 0;
		return;
	}
	bclear(b);
	efs_mem_free(b);
}

/* A batch whose fs was freed while it flew: its reply frees it. */
static bool orphaned(struct efs_fs_batch *b)
{
	if (b->fs)
		return false;
	bclear(b);
	efs_mem_free(b);
	return true;
}

/* ---- Joining ---- */

bool efs_fs_batch_eligible(const struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	struct efs_fs_batch *b = fs->batch;

	if (b && b->nops && (uint64_t)b->epoch != fs->epoch) {
		bsend(b); /* the session it was decided under is gone: it fails */
		return false;
	}
	if (!b || b->flying || !fs->delegate || op->no_batch || op->retries || op->conflicts || op->unsettled)
		return false;
	if (fs->batch_off_until && efs_clock_mono_ns() < fs->batch_off_until)
		return false;
	/* Only plain namespace and attribute changes: an operation with a
	 * preparation, a seal or an outcome hook (a truncate, a publication)
	 * has parts outside its transaction that its commit settles. */
	if (op->d->prepare || op->d->seal || op->d->outcome)
		return false;
	if (!op->d->batchable || !op->d->batchable((struct efs_fs_op *)op))
		return false;
	/* Decided under the exclusive lock of op->ino (the directory of a
	 * create), while no peer waits for it and no
	 * release of it is asked for (the batch pins it until it commits). */
	return efs_lock_may_defer(fs->lc, op->ino) && efs_session_is_active(fs->s);
}

static bool same_key(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	return alen == blen && memcmp(a, b, alen) == 0;
}

static bool has_cmp(const struct efs_fs_batch *b, const Etcdserverpb__Compare *c)
{
	for (size_t i = 0; i < b->ncmp; i++)
		if ((int)b->cmp[i].target == (int)c->target &&
		    same_key(b->cmp[i].key, b->cmp[i].key_len, c->key.data, c->key.len))
			return true;
	return false;
}

static struct bput *find_put(struct efs_fs_batch *b, const uint8_t *key, size_t len)
{
	for (size_t i = 0; i < b->nput; i++)
		if (same_key(b->put[i].key, b->put[i].klen, key, len))
			return &b->put[i];
	return NULL;
}

static int64_t cmp_num(const Etcdserverpb__Compare *c)
{
	switch (c->target_union_case) {
	case ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION:
		return c->version;
	case ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION:
		return c->create_revision;
	case ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION:
		return c->mod_revision;
	case ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE:
		return c->lease;
	default:
		return 0;
	}
}

static uint8_t *dup_bytes(const uint8_t *p, size_t len)
{
	uint8_t *d = efs_mem_malloc(len ? len : 1);

	if (d && len)
		memcpy(d, p, len);
	return d;
}

/*
 * Whether |req| fits the batch: only compares and puts of single keys,
 * and room for what it adds. -EINVAL: never batchable; -E2BIG: no room now.
 */
static int fits(struct efs_fs_batch *b, const Etcdserverpb__TxnRequest *req)
{
	size_t nc = 0, np = 0;

	if (req->n_failure)
		return -EINVAL;
	for (size_t i = 0; i < req->n_compare; i++) {
		const Etcdserverpb__Compare *c = req->compare[i];

		if (c->range_end.len)
			return -EINVAL;
		/* A key that must not exist yet, which the batch puts: the
		 * caches said otherwise. It commits alone and fails there. */
		if (c->target == ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE &&
		    cmp_num(c) == 0 && find_put(b, c->key.data, c->key.len))
			return -EINVAL;
		if (!has_cmp(b, c) && !find_put(b, c->key.data, c->key.len))
			nc++;
	}
	for (size_t i = 0; i < req->n_success; i++) {
		const Etcdserverpb__RequestOp *o = req->success[i];

		if (o->request_case != ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT ||
		    !o->request_put || o->request_put->prev_kv || o->request_put->ignore_value ||
		    o->request_put->ignore_lease)
			return -EINVAL;
		if (!find_put(b, o->request_put->key.data, o->request_put->key.len))
			np++;
	}
	if (b->ncmp + nc > BATCH_MAX || b->nput + np > BATCH_MAX || b->nino + EFS_FS_OUT_MAX > BATCH_MAX)
		return b->nops ? -E2BIG : -EINVAL;
	return 0;
}

static void timer_cb(uv_timer_t *t)
{
	struct efs_fs_batch *b = t->data;

	if (b->nops && !b->flying)
		bsend(b);
}

static int note_ino(struct efs_fs_batch *b, struct efs_fs_inode *in, bool is_new)
{
	for (size_t i = 0; i < b->nino; i++)
		if (b->ino[i].in == in)
			return (int)i;
	if (b->nino == BATCH_MAX)
		return -E2BIG; /* fits() keeps room: not reached */
	in->refs++;
	b->ino[b->nino].in = in;
	b->ino[b->nino].pin = NULL;
	b->ino[b->nino].is_new = is_new;
	b->ino[b->nino].oref = false;
	return (int)b->nino++;
}

int efs_fs_batch_add(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	struct efs_fs_batch *b = fs->batch;
	const Etcdserverpb__TxnRequest *req = efs_etcd_txn_request(op->txn);
	int r;

	if (!b || b->flying)
		return -EAGAIN;
	r = fits(b, req);
	if (r == -E2BIG)
		bsend(b); /* full: it goes, and this operation waits for it */
	if (r < 0)
		return r;
	for (size_t i = 0; i < req->n_compare; i++) {
		const Etcdserverpb__Compare *c = req->compare[i];
		struct efs_etcd_cmp *m;

		/* The first stays: what etcd holds before the batch. A key the
		 * batch puts already is the batch's own to decide (a holder key
		 * of a directory made in it, say): no compare. */
		if (has_cmp(b, c) || find_put(b, c->key.data, c->key.len))
			continue;
		m = &b->cmp[b->ncmp];
		*m = (struct efs_etcd_cmp){
			.target = (enum efs_etcd_cmp_target)c->target,
			.result = (enum efs_etcd_cmp_result)c->result,
			.key = dup_bytes(c->key.data, c->key.len),
			.key_len = c->key.len,
			.num = cmp_num(c),
		};
		if (c->target_union_case == ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE) {
			m->value = dup_bytes(c->value.data, c->value.len);
			m->value_len = c->value.len;
		}
		if (!m->key || (m->value_len && !m->value)) {
			efs_mem_free((void *)m->key);
			efs_mem_free((void *)m->value);
			goto nomem;
		}
		b->ncmp++;
	}
	for (size_t i = 0; i < req->n_success; i++) {
		const Etcdserverpb__PutRequest *p = req->success[i]->request_put;
		struct bput *m = find_put(b, p->key.data, p->key.len);
		uint8_t *v = dup_bytes(p->value.data, p->value.len);

		if (!v)
			goto nomem;
		if (m) {
			efs_mem_free(m->val); /* the last put wins */
		} else {
			m = &b->put[b->nput];
			m->key = dup_bytes(p->key.data, p->key.len);
			m->klen = p->key.len;
			if (!m->key) {
				efs_mem_free(v);
				goto nomem;
			}
			b->nput++;
		}
		m->val = v;
		m->vlen = p->value.len;
		m->lease = p->lease;
	}
	if (!b->nops) {
		/* Read back after an unknown outcome: a record this batch
		 * puts that carries an op id (an inode record), so that only
		 * the batch's own commit matches it. */
		for (size_t i = 0; i < op->nout; i++) {
			struct efs_meta_key k;
			struct bput *m;

			if (op->out[i].del || efs_meta_key_inode(&fs->ns, op->out[i].ino, &k) < 0)
				continue;
			m = find_put(b, k.buf, k.len);
			if (m) {
				b->vidx = (size_t)(m - b->put);
				break;
			}
		}
		b->first_ns = efs_clock_mono_ns();
		b->epoch = (int64_t)fs->epoch;
		uv_timer_start(b->timer, timer_cb, fs->batch_ms, 0);
	}
	b->nops++;
	efs_counter_inc(fs->m_batch_ops);
	return 0;
nomem:
	/* Part of this operation is in: the batch must not commit. */
	b->poisoned = true;
	if (!b->nops)
		b->nops = 1; /* so that it is sent, and fails, as a batch */
	bsend(b);
	return -ENOMEM;
}

int efs_fs_batch_note(struct efs_fs_op *op, uint64_t ino, bool is_new, void *pin, bool oref)
{
	struct efs_fs_batch *b = op->fs->batch;
	struct efs_fs_inode *in = efs_fs_ifind(op->fs, ino);
	int i;

	if (!b || !in) {
		efs_lock_unpin_held(op->fs->lc, pin);
		return -ENOENT;
	}
	i = note_ino(b, in, is_new);
	if (i < 0) {
		efs_lock_unpin_held(op->fs->lc, pin);
		return i;
	}
	if (pin) {
		if (b->ino[i].pin)
			efs_lock_unpin_held(op->fs->lc, pin); /* pinned already */
		else
			b->ino[i].pin = pin;
	}
	if (oref)
		b->ino[i].oref = true;
	in->batched = true;
	return 0;
}

/* ---- Waiting ---- */

int efs_fs_batch_wait_op(struct efs_fs_op *op)
{
	struct efs_fs_batch *b = op->fs->batch;

	if (!b || (!b->nops && !b->flying))
		return 0;
	efs_list_add_tail(&b->opwait, &op->qlink);
	if (!b->flying)
		bsend(b); /* someone waits: no point in waiting for the timer */
	return 1;
}

int efs_fs_batch_sync(struct efs_fs *fs, void (*cb)(void *arg, int status), void *arg)
{
	struct efs_fs_batch *b = fs->batch;
	struct bwait *w;

	if (!b || (!b->nops && !b->flying)) {
		int err = fs->batch_err;

		fs->batch_err = 0;
		return err ? err : 1;
	}
	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->cb = cb;
	w->arg = arg;
	efs_list_add_tail(&b->waiters, &w->link);
	if (!b->flying)
		bsend(b);
	return 0;
}

/* Wakes the operations and callbacks waiting for the batch just ended. */
static void wake(struct efs_fs_batch *b, int status)
{
	struct efs_list ws, ops, *n;

	efs_list_init(&ws);
	efs_list_init(&ops);
	efs_list_splice_tail(&ws, &b->waiters);
	efs_list_splice_tail(&ops, &b->opwait);
	while ((n = efs_list_pop(&ops)))
		efs_fs_op_batch_resume(efs_list_entry(n, struct efs_fs_op, qlink));
	while ((n = efs_list_pop(&ws))) {
		struct bwait *w = efs_list_entry(n, struct bwait, link);

		w->cb(w->arg, status);
		efs_mem_free(w);
	}
}

/* ---- Sending and the outcome ---- */

static void committed(struct efs_fs_batch *b, int64_t rev)
{
	struct efs_fs *fs = b->fs;

	for (size_t i = 0; i < b->nino; i++) {
		struct bino *bi = &b->ino[i];
		struct efs_fs_inode *in = bi->in;

		/* The records the batch put are the cached ones (nothing else
		 * wrote them meanwhile): they carry its revision now. */
		if (in->rec && in->epoch == fs->epoch)
			in->mod_rev = rev;
		if (bi->oref && in->oref_epoch == fs->epoch && !in->oref_rev && !in->oref_unsure)
			in->oref_rev = rev;
		in->batched = false;
		efs_lock_unpin_held(fs->lc, bi->pin);
		efs_fs_iput(fs, in);
	}
	efs_counter_inc(fs->m_batches);
	bclear(b);
	fs->inflight--;
	wake(b, 0);
}

/*
 * Drops from the caches what the failed batch carried. |maybe_applied|: its
 * outcome stayed unknown, so its new inodes' holder keys may exist: their
 * locks stay (released as any other, which deletes the keys).
 */
static void failed(struct efs_fs_batch *b, const char *why, bool maybe_applied)
{
	struct efs_fs *fs = b->fs;
	bool same_session = (uint64_t)b->epoch == fs->epoch;

	efs_log_err("fs: a batch of %zu delegated namespace changes failed (%s): they are "
		    "%s; operations commit one by one for %d s",
		    b->nops, why, maybe_applied ? "lost or not" : "lost",
		    EFS_FS_BATCH_OFF_MS / 1000);
	for (size_t i = 0; i < b->nino; i++) {
		struct bino *bi = &b->ino[i];
		struct efs_fs_inode *in = bi->in;

		in->batched = false;
		in->batch_lost = true; /* its fsyncs answer EIO from now on */
		efs_lock_unpin_held(fs->lc, bi->pin);
		/* Read again; and an operation that planned on the record and
		 * builds from it now conflicts on this revision (no record has
		 * it) and reads it again first. */
		in->epoch = 0;
		in->mod_rev = INT64_MAX;
		if (bi->is_new && !maybe_applied) {
			efs_fs_inode_set(fs, in, NULL, 0, false);
			if (same_session)
				efs_lock_forget(fs->lc, in->ino); /* no holder key was put */
			if (bi->oref)
				in->oref_epoch = 0;
		}
		if (in->dc) {
			efs_fs_dcache_clear(in);
			in->mseq++;
			in->rmseq++;
		}
		efs_fs_iput(fs, in);
	}
	efs_counter_inc(fs->m_batch_failures);
	fs->batch_err = -EIO;
	fs->batch_off_until = efs_clock_mono_ns() + (uint64_t)EFS_FS_BATCH_OFF_MS * 1000000ull;
	bclear(b);
	fs->inflight--;
	wake(b, -EIO);
}

static void vtimer_cb(uv_timer_t *t);

static void verify_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct efs_fs_batch *b = arg;

	b->calling = false;
	if (orphaned(b))
		return;
	if (r->err) {
		if (efs_clock_mono_ns() - b->unknown_ns > settle_bound_ns(b)) {
			failed(b, "its outcome stayed unknown", true);
			return;
		}
		uv_timer_start(b->vtimer, vtimer_cb, VERIFY_MS, 0);
		return;
	}
	if (resp->n_kvs == 1 && resp->kvs[0]->value.len == b->put[b->vidx].vlen &&
	    memcmp(resp->kvs[0]->value.data, b->put[b->vidx].val, b->put[b->vidx].vlen) == 0) {
		committed(b, resp->kvs[0]->mod_revision);
		return;
	}
	/* Not applied: sent again, as an operation would be (its compares
	 * still hold: the locks are pinned; should the first send apply
	 * late, the new one fails its compares and is read back). */
	if (efs_clock_mono_ns() - b->unknown_ns > settle_bound_ns(b)) {
		failed(b, "it did not apply", false);
		return;
	}
	b->verifying = false;
	uv_timer_start(b->vtimer, vtimer_cb, RESEND_MS, 0);
}

static void verify_send(struct efs_fs_batch *b)
{
	struct efs_etcd_range_opts o = {0};

	if (efs_etcd_range(b->fs->c, b->put[b->vidx].key, b->put[b->vidx].klen, &o, NULL, verify_cb,
			   b) < 0)
		uv_timer_start(b->vtimer, vtimer_cb, VERIFY_MS, 0);
	else
		b->calling = true;
}

static void vtimer_cb(uv_timer_t *t)
{
	struct efs_fs_batch *b = t->data;

	if (b->verifying) {
		verify_send(b);
		return;
	}
	/* Sent again after a refusal. */
	b->flying = false;
	b->fs->inflight--;
	bsend(b);
}

/* How long an outcome may stay unsettled: the session's quorum-loss bound. */
static uint64_t settle_bound_ns(const struct efs_fs_batch *b)
{
	uint64_t ms = efs_session_quorum_loss_ms(b->fs->s);

	return (ms < VERIFY_MIN_MS ? VERIFY_MIN_MS : ms) * 1000000ull;
}

static void send_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct efs_fs_batch *b = arg;
	struct efs_fs *fs = b->fs;
	enum efs_fs_outcome oc;

	b->calling = false;
	if (orphaned(b))
		return;
	oc = efs_fs_txn_outcome(fs, EFS_FS_ORIG_CREATE, r, resp);
	if (r->err) {
		efs_capacity_note_error(fs->cap, r->err);
		if (oc == EFS_FS_TXN_UNKNOWN) {
			/* Read back what it put: its outcome settles it. */
			efs_counter_inc(fs->m_retries);
			if (!b->was_unknown)
				b->unknown_ns = efs_clock_mono_ns();
			b->was_unknown = true;
			b->verifying = true;
			uv_timer_start(b->vtimer, vtimer_cb, VERIFY_MS, 0);
			return;
		}
		/* Not applied: sent again with a backoff while the session
		 * lasts and within the bound, as an operation's own commit
		 * would be retried. */
		if (!b->tries++)
			b->refused_ns = efs_clock_mono_ns();
		if ((uint64_t)b->epoch == fs->epoch &&
		    efs_clock_mono_ns() - b->refused_ns < settle_bound_ns(b)) {
			uint64_t ms = RESEND_MS << (b->tries < 6 ? b->tries - 1 : 5);

			efs_counter_inc(fs->m_retries);
			b->verifying = false;
			uv_timer_start(b->vtimer, vtimer_cb, ms > RESEND_MAX_MS ? RESEND_MAX_MS : ms, 0);
			return;
		}
		failed(b, r->message ? r->message : "etcd error", false);
		return;
	}
	if (oc == EFS_FS_TXN_CONFLICT) {
		if (b->was_unknown && !b->verifying) {
			/* The first send may have applied after all. */
			b->verifying = true;
			uv_timer_start(b->vtimer, vtimer_cb, 0, 0);
			return;
		}
		failed(b, "a compare no longer held", false);
		return;
	}
	committed(b, resp->header ? resp->header->revision : 0);
}

static void bsend(struct efs_fs_batch *b)
{
	struct efs_fs *fs = b->fs;
	struct efs_etcd_txn *t = NULL;
	int r;

	uv_timer_stop(b->timer);
	if (b->flying || !b->nops)
		return;
	b->flying = true;
	fs->inflight++; /* teardown waits for its answer */
	if ((uint64_t)b->epoch != fs->epoch) {
		failed(b, "the session was lost", false);
		return;
	}
	if (b->poisoned) {
		failed(b, "no memory to merge a change", false);
		return;
	}
	r = efs_etcd_txn_new(&t, 0);
	for (size_t i = 0; r == 0 && i < b->ncmp; i++)
		r = efs_etcd_txn_compare_ex(t, &b->cmp[i]);
	for (size_t i = 0; r == 0 && i < b->nput; i++)
		r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, b->put[i].key, b->put[i].klen,
				     b->put[i].val, b->put[i].vlen, b->put[i].lease);
	if (r == 0)
		r = efs_etcd_txn(fs->c, efs_etcd_txn_request(t), NULL, send_cb, b);
	if (r == 0)
		b->calling = true;
	efs_etcd_txn_free(t);
	if (r < 0) {
		char msg[64];

		snprintf(msg, sizeof(msg), "not sent: %s", strerror(-r));
		failed(b, msg, false);
	}
}

void efs_fs_batch_abandon(struct efs_fs *fs)
{
	struct efs_fs_batch *b = fs->batch;

	if (!b)
		return;
	uv_timer_stop(b->timer);
	uv_timer_stop(b->vtimer);
	efs_lockcache_set_wanted_fn(fs->lc, NULL, NULL);
}
