/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fcntl and flock locks in etcd (plock.h): requests, the local table of
 * this node's owners, waits on a watch, flush and release.
 */
#include "fs/plock.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "etcd/kv.h"
#include "etcd/txn.h"
#include "etcd/watch.h"
#include "fs/fs-int.h"
#include "fs/plocktab.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

/* Watch failures one waiting request tolerates before answering EIO. */
#define PLK_WATCH_FAILS_MAX 8

/* One lock owner of this node on one inode, as last committed. */
struct plk_owner {
	struct plk_owner *next;
	uint64_t ino, owner;
	struct efs_plock_set posix, flock;
	int64_t rev;		 /* revision of the commit that wrote this state */
	uint64_t gen;		 /* session generation of that commit */
	struct efs_fs_handle *h; /* handle of its last fcntl lock (NULL: none) */
};

enum plk_kind {
	PLK_GETLK = 0,
	PLK_SETLK,
	PLK_FLOCK,
	PLK_DROP,
};

/* Release and flush may drop several owners: one callback at the end. */
struct plk_join {
	int pending;
	int err;
	void (*cb)(int status, void *arg);
	void *arg;
};

/* A join for |cb|, held (pending 1) until every drop it waits for has
 * started: the starter ends its hold with join_one. */
static struct plk_join *join_new(void (*cb)(int status, void *arg), void *arg)
{
	struct plk_join *j = efs_mem_calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->cb = cb;
	j->arg = arg;
	j->pending = 1;
	return j;
}

struct plk;

struct plk_req {
	struct plk *p; /* NULL once detached by efs_fs_plock_done */
	struct efs_fs *fs;
	struct efs_list link; /* p->reqs */
	struct efs_fs_rq base; /* req NULL: internal (drop) */
	enum plk_kind kind;
	uint64_t ino, owner;
	struct efs_fs_handle *h;
	bool flock_ns; /* the flock namespace (else fcntl) */
	uint64_t start, end;
	int type;
	int32_t pid;
	bool sleep;
	bool drop_posix, drop_flock; /* PLK_DROP */
	struct plk_join *join;	     /* PLK_DROP */
	int tries;
	int watch_fails;
	int64_t read_rev;
	struct efs_etcd_watcher *w;
	bool busy;	  /* an etcd call is in flight */
	bool in_sw;	  /* waiting for the session */
	bool interrupted; /* the kernel interrupted the request */
	bool lost;	  /* the session was lost meanwhile */
	struct efs_session_waiter sw;
	struct efs_plock_set nposix, nflock; /* the owner's new state */
	uint64_t start_ns;
};

struct plk {
	struct efs_fs *fs;
	struct plk_owner *owners;
	struct efs_list reqs; /* plk_req.link */
	struct efs_etcd_watch_stream *ws;
};

static void req_attempt(struct plk_req *rq);

/* ---- State ---- */

int efs_fs_plock_init(struct efs_fs *fs)
{
	struct plk *p;

	if (fs->plock_priv)
		return 0;
	p = efs_mem_calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->fs = fs;
	efs_list_init(&p->reqs);
	fs->plock_priv = p;
	return 0;
}

static struct plk *plk_get(struct efs_fs *fs)
{
	if (!fs->plock_priv && efs_fs_plock_init(fs) < 0)
		return NULL;
	return fs->plock_priv;
}

static struct plk_owner *owner_find(struct plk *p, uint64_t ino, uint64_t owner)
{
	for (struct plk_owner *o = p->owners; o; o = o->next) {
		if (o->ino == ino && o->owner == owner)
			return o;
	}
	return NULL;
}

static void owner_free(struct plk_owner *o)
{
	efs_plock_set_clear(&o->posix);
	efs_plock_set_clear(&o->flock);
	efs_mem_free(o);
}

static void owner_remove(struct plk *p, struct plk_owner *o)
{
	for (struct plk_owner **pp = &p->owners; *pp; pp = &(*pp)->next) {
		if (*pp == o) {
			*pp = o->next;
			owner_free(o);
			return;
		}
	}
}

static void owners_clear(struct plk *p)
{
	while (p->owners) {
		struct plk_owner *o = p->owners;

		p->owners = o->next;
		owner_free(o);
	}
}

/* True when |o| was written under an earlier session (its key went with
 * that lease even if efs_fs_plock_session_lost was not called). */
static bool owner_stale(const struct plk *p, const struct plk_owner *o)
{
	return o->gen != efs_session_generation(p->fs->s);
}

/* The live entry of (ino, owner), dropping a stale one. */
static struct plk_owner *owner_live(struct plk *p, uint64_t ino, uint64_t owner)
{
	struct plk_owner *o = owner_find(p, ino, owner);

	if (o && owner_stale(p, o)) {
		owner_remove(p, o);
		o = NULL;
	}
	return o;
}

/* ---- Requests ---- */

static struct plk_req *req_new(struct plk *p, fuse_req_t req, enum plk_kind kind,
			       enum efs_fs_opcode code, uint64_t ino)
{
	struct plk_req *rq = efs_mem_calloc(1, sizeof(*rq));

	if (!rq)
		return NULL;
	rq->p = p;
	rq->fs = p->fs;
	efs_fs_rq_start(&rq->base, p->fs, req, code);
	rq->kind = kind;
	rq->ino = ino;
	efs_list_add_head(&p->reqs, &rq->link);
	return rq;
}

static void req_unlink(struct plk_req *rq)
{
	struct plk *p = rq->p;

	if (!p)
		return;
	efs_list_del(&rq->link);
	rq->p = NULL;
}

static void req_free(struct plk_req *rq)
{
	efs_plock_set_clear(&rq->nposix);
	efs_plock_set_clear(&rq->nflock);
	efs_mem_free(rq);
}

static void join_one(struct plk_join *j, int status)
{
	if (status < 0 && j->err == 0)
		j->err = status;
	if (--j->pending > 0)
		return;
	j->cb(j->err, j->arg);
	efs_mem_free(j);
}

/* Answers |rq| with |err| (0: success for setlk/flock/drop; getlk replies
 * itself and passes 1) and frees it, unless an etcd call still holds it. */
static void req_finish(struct plk_req *rq, int err)
{
	struct efs_fs *fs = rq->fs;

	if (rq->w)
		rq->w = efs_etcd_watcher_free(rq->w);
	if (rq->in_sw && rq->p) {
		efs_session_wait_cancel(fs->s, &rq->sw);
		rq->in_sw = false;
	}
	/* |err| > 0: answered already. */
	if (err <= 0)
		efs_fs_rq_err(&rq->base, err);
	if (rq->join) {
		fs->inflight--;
		join_one(rq->join, err < 0 ? err : 0);
		rq->join = NULL;
	}
	req_unlink(rq);
	if (!rq->busy)
		req_free(rq);
}

/* After an etcd callback: false when |rq| must stop (detached and freed,
 * or answered EIO after a session loss). */
static bool req_back(struct plk_req *rq)
{
	rq->busy = false;
	if (!rq->p) {
		req_free(rq);
		return false;
	}
	if (rq->lost) {
		req_finish(rq, -EIO);
		return false;
	}
	return true;
}

/* Attempts after compare failures and errors. */
static void req_retry(struct plk_req *rq)
{
	if (++rq->tries > EFS_FS_RETRY_MAX * 4) {
		efs_log(EFS_LOG_WARN, "plock: inode %lu: giving up after %d attempts",
			(unsigned long)rq->ino, rq->tries);
		req_finish(rq, -EIO);
		return;
	}
	efs_counter_inc(rq->fs->m_retries);
	req_attempt(rq);
}

/* ---- Waiting ---- */

static void on_watch(struct efs_etcd_watcher *w, int status, const struct efs_etcd_watch_update *u,
		     void *arg)
{
	struct plk_req *rq = arg;

	(void)w;
	if (u->kind == EFS_ETCD_WATCH_CREATED || u->kind == EFS_ETCD_WATCH_PROGRESS)
		return;
	if (u->kind == EFS_ETCD_WATCH_EVENTS && u->n_events == 0)
		return;
	rq->w = efs_etcd_watcher_free(rq->w);
	if (u->kind == EFS_ETCD_WATCH_CANCELED && ++rq->watch_fails > PLK_WATCH_FAILS_MAX) {
		efs_log(EFS_LOG_WARN, "plock: inode %lu: watch failed: %d %s",
			(unsigned long)rq->ino, status, u->reason);
		req_finish(rq, -EIO);
		return;
	}
	/* Something changed (or must be re-read): try again. */
	req_attempt(rq);
}

static int req_wait(struct plk_req *rq)
{
	struct plk *p = rq->p;
	struct efs_meta_range range;
	struct efs_etcd_watch_opts o = {0};
	int r;

	if (rq->interrupted)
		return -EINTR;
	if (!p->ws) {
		r = efs_etcd_watch_stream_new(&p->ws, rq->fs->c, EFS_ETCD_CH_BULK);
		if (r < 0)
			return r;
	}
	r = efs_meta_range_ino(&rq->fs->ns, EFS_META_K_PLOCK, rq->ino, &range);
	if (r < 0)
		return r;
	o.key = range.key.buf;
	o.key_len = range.key.len;
	o.range_end = range.end.buf;
	o.range_end_len = range.end.len;
	o.start_revision = rq->read_rev + 1;
	return efs_etcd_watcher_new(&rq->w, p->ws, &o, on_watch, rq);
}

static void on_interrupt(fuse_req_t req, void *arg)
{
	struct plk_req *rq = arg;

	(void)req;
	rq->interrupted = true;
	/* Called by libfuse with a reference on |req|, so replying is safe;
	 * the inline call at registration never finds |rq| waiting. */
	if (rq->w)
		req_finish(rq, -EINTR);
}

/* ---- Records ---- */

static int set_from_record(const Etcfs__ByteRangeLocks *rec, struct efs_plock_set *posix,
			   struct efs_plock_set *flock)
{
	for (size_t i = 0; i < rec->n_locks; i++) {
		const Etcfs__ByteRangeLock *b = rec->locks[i];
		struct efs_plock_set *s = b->kind == EFS_META_PLOCK_FLOCK ? flock : posix;
		int r = efs_plock_set_append(s, b->start, b->end, (int)b->type, b->pid);

		if (r < 0)
			return r;
	}
	return 0;
}

static int pack_sets(struct efs_fs *fs, const struct efs_plock_set *posix,
		     const struct efs_plock_set *flock, ProtobufCBinaryData *ret)
{
	Etcfs__ByteRangeLocks rec = ETCFS__BYTE_RANGE_LOCKS__INIT;
	Etcfs__ByteRangeLock *locks, **ptrs;
	size_t n = posix->n + flock->n, k = 0;
	int r;

	locks = efs_mem_calloc(n ? n : 1, sizeof(*locks));
	ptrs = efs_mem_calloc(n ? n : 1, sizeof(*ptrs));
	if (!locks || !ptrs) {
		r = -ENOMEM;
		goto out;
	}
	for (int pass = 0; pass < 2; pass++) {
		const struct efs_plock_set *s = pass ? flock : posix;

		for (size_t i = 0; i < s->n; i++, k++) {
			Etcfs__ByteRangeLock init = ETCFS__BYTE_RANGE_LOCK__INIT;

			locks[k] = init;
			locks[k].start = s->v[i].start;
			locks[k].end = s->v[i].end;
			locks[k].type = (uint32_t)s->v[i].type;
			locks[k].kind = pass ? EFS_META_PLOCK_FLOCK : EFS_META_PLOCK_POSIX;
			locks[k].pid = s->v[i].pid;
			ptrs[k] = &locks[k];
		}
	}
	rec.n_locks = n;
	rec.locks = ptrs;
	rec.session_generation = efs_session_generation(fs->s);
	r = efs_meta_pack(&rec.base, ret);
out:
	efs_mem_free(locks);
	efs_mem_free(ptrs);
	return r;
}

static bool conflicts(const struct efs_plock *l, uint64_t start, uint64_t end, int type)
{
	return l->start <= end && start <= l->end && (type == F_WRLCK || l->type == F_WRLCK);
}

/* The local table's answer for a request of |owner|: the first conflicting
 * lock of another owner of this node, or NULL. */
static const struct efs_plock *local_conflict(struct plk *p, const struct plk_req *rq)
{
	const struct efs_plock *best = NULL;

	for (struct plk_owner *o = p->owners; o; o = o->next) {
		const struct efs_plock *c;

		if (o->ino != rq->ino || o->owner == rq->owner || owner_stale(p, o))
			continue;
		c = efs_plock_set_conflict(rq->flock_ns ? &o->flock : &o->posix, rq->start,
					   rq->end, rq->type);
		if (c && (!best || c->start < best->start))
			best = c;
	}
	return best;
}

static void reply_getlk(struct plk_req *rq, const struct efs_plock *c, bool ours)
{
	struct flock fl;

	memset(&fl, 0, sizeof(fl));
	fl.l_whence = SEEK_SET;
	if (c) {
		fl.l_type = (short)c->type;
		fl.l_start = (off_t)c->start;
		fl.l_len = (off_t)efs_plock_len(c->start, c->end);
		fl.l_pid = ours ? c->pid : 0;
	} else {
		fl.l_type = F_UNLCK;
		fl.l_start = (off_t)rq->start;
		fl.l_len = (off_t)efs_plock_len(rq->start, rq->end);
	}
	efs_fs_rq_lock(&rq->base, &fl);
	req_finish(rq, 1);
}

/* ---- Commit ---- */

static void commit_done(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct plk_req *rq = arg;
	struct efs_fs *fs = rq->fs;
	struct plk *p;
	struct plk_owner *o;
	int64_t rev;

	if (!req_back(rq))
		return;
	p = rq->p;
	if (efs_fs_txn_outcome(fs, EFS_FS_ORIG_PLOCK, r, resp) != EFS_FS_TXN_OK) {
		/* Retrying is safe: applying the request again to what is
		 * stored gives the same state. */
		req_retry(rq);
		return;
	}
	rev = resp->header ? resp->header->revision : 0;
	o = owner_live(p, rq->ino, rq->owner);
	if (o && o->rev > rev) {
		/* A later commit of this owner was seen first: it holds ours. */
		req_finish(rq, 0);
		return;
	}
	if (rq->nposix.n == 0 && rq->nflock.n == 0) {
		if (o)
			owner_remove(p, o);
		req_finish(rq, 0);
		return;
	}
	if (!o) {
		o = efs_mem_calloc(1, sizeof(*o));
		if (!o) {
			/* The lock is held in etcd; the local table misses it,
			 * which only costs the fast paths (flush then finds
			 * nothing to drop: the key stays until the session ends). */
			efs_log(EFS_LOG_WARN, "plock: out of memory for the local table");
			req_finish(rq, 0);
			return;
		}
		o->ino = rq->ino;
		o->owner = rq->owner;
		o->next = p->owners;
		p->owners = o;
	}
	/* The request's sets become the owner's (swap, no copy). */
	{
		struct efs_plock_set t = o->posix;

		o->posix = rq->nposix;
		rq->nposix = t;
		t = o->flock;
		o->flock = rq->nflock;
		rq->nflock = t;
	}
	o->rev = rev;
	o->gen = efs_session_generation(fs->s);
	if (rq->kind == PLK_SETLK && rq->type != F_UNLCK) {
		o->h = rq->h;
		if (rq->h)
			rq->h->plocked = true;
	}
	if (rq->kind == PLK_FLOCK && rq->type != F_UNLCK && rq->h)
		rq->h->flocked = true;
	if (o->posix.n == 0)
		o->h = NULL;
	req_finish(rq, 0);
}

static int commit(struct plk_req *rq, const struct efs_meta_range *range, bool existed,
		  const struct efs_meta_key *key)
{
	struct efs_fs *fs = rq->fs;
	struct efs_etcd_txn *t = NULL;
	struct efs_etcd_cmp cmp = {0};
	ProtobufCBinaryData val = {0};
	int r;

	r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		return r;
	r = efs_session_guard(fs->s, t);
	if (r < 0)
		goto out;
	cmp.target = EFS_ETCD_CMP_MOD;
	cmp.result = EFS_ETCD_CMP_LESS;
	cmp.key = range->key.buf;
	cmp.key_len = range->key.len;
	cmp.range_end = range->end.buf;
	cmp.range_end_len = range->end.len;
	cmp.num = rq->read_rev + 1;
	r = efs_etcd_txn_compare_ex(t, &cmp);
	if (r < 0)
		goto out;
	if (rq->nposix.n == 0 && rq->nflock.n == 0) {
		if (existed)
			r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, key->buf, key->len, NULL, 0,
						false);
	} else {
		r = pack_sets(fs, &rq->nposix, &rq->nflock, &val);
		if (r < 0)
			goto out;
		r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key->buf, key->len, val.data, val.len,
				     efs_session_lease_id(fs->s));
	}
	if (r < 0)
		goto out;
	r = efs_etcd_txn(fs->c, efs_etcd_txn_request(t), NULL, commit_done, rq);
	if (r == 0)
		rq->busy = true;
out:
	efs_mem_free(val.data);
	efs_etcd_txn_free(t);
	return r;
}

/* ---- Read and decide ---- */

static void read_done(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct plk_req *rq = arg;
	struct efs_fs *fs = rq->fs;
	const char *node;
	struct efs_meta_range range;
	struct efs_meta_key key;
	const struct efs_plock *best = NULL;
	struct efs_plock bestv;
	bool best_ours = false, existed = false;
	Etcfs__ByteRangeLocks *rec;
	int err;

	if (!req_back(rq))
		return;
	if (r->err < 0) {
		efs_log(EFS_LOG_WARN, "plock: inode %lu: read failed: %d", (unsigned long)rq->ino,
			r->err);
		req_finish(rq, -EIO);
		return;
	}
	node = efs_session_node(fs->s);
	rq->read_rev = resp->header ? resp->header->revision : 0;
	efs_plock_set_clear(&rq->nposix);
	efs_plock_set_clear(&rq->nflock);
	for (size_t i = 0; i < resp->n_kvs; i++) {
		const Mvccpb__KeyValue *kv = resp->kvs[i];
		struct efs_meta_key_info info;
		const char *reason = "";
		bool mine;

		if (efs_meta_key_parse(&fs->ns, kv->key.data, kv->key.len, &info) < 0 ||
		    info.family != EFS_META_K_PLOCK) {
			efs_log(EFS_LOG_WARN, "plock: inode %lu: ignoring a malformed key",
				(unsigned long)rq->ino);
			continue;
		}
		if (efs_meta_plocks_decode(kv->value.data, kv->value.len, &rec, &reason) < 0) {
			efs_log(EFS_LOG_WARN, "plock: inode %lu: ignoring a bad record: %s",
				(unsigned long)rq->ino, reason);
			continue;
		}
		mine = strcmp(info.node, node) == 0;
		if (mine && info.num == rq->owner) {
			/* The owner's own state as stored: the base of the new one. */
			existed = true;
			err = set_from_record(rec, &rq->nposix, &rq->nflock);
			efs_meta_record_free(rec);
			if (err < 0) {
				req_finish(rq, err == -ENOMEM ? -ENOMEM : -EIO);
				return;
			}
			continue;
		}
		if (rq->type != F_UNLCK) {
			for (size_t k = 0; k < rec->n_locks; k++) {
				const Etcfs__ByteRangeLock *b = rec->locks[k];
				struct efs_plock l = { .start = b->start, .end = b->end,
						       .type = (int)b->type, .pid = b->pid };

				if ((b->kind == EFS_META_PLOCK_FLOCK) != rq->flock_ns)
					continue;
				if (conflicts(&l, rq->start, rq->end, rq->type) &&
				    (!best || l.start < best->start)) {
					bestv = l;
					best = &bestv;
					best_ours = mine;
				}
			}
		}
		efs_meta_record_free(rec);
	}
	if (!existed) {
		/* Nothing stored for the owner: a local entry older than the
		 * read is gone (its lease ended). */
		struct plk_owner *o = owner_find(rq->p, rq->ino, rq->owner);

		if (o && o->rev < rq->read_rev)
			owner_remove(rq->p, o);
	}
	if (rq->kind == PLK_GETLK) {
		reply_getlk(rq, best, best_ours);
		return;
	}
	if (best) {
		if (!rq->sleep) {
			req_finish(rq, -EAGAIN);
			return;
		}
		err = req_wait(rq);
		if (err < 0)
			req_finish(rq, err);
		return;
	}
	/* Apply the request to the owner's stored state. */
	{
		struct efs_plock_set before_p = {0}, before_f = {0};
		bool same;

		err = efs_plock_set_copy(&before_p, &rq->nposix);
		if (err == 0)
			err = efs_plock_set_copy(&before_f, &rq->nflock);
		if (err == 0 && rq->kind == PLK_DROP) {
			if (rq->drop_posix)
				err = efs_plock_set_apply(&rq->nposix, 0, UINT64_MAX, F_UNLCK, 0);
			if (err == 0 && rq->drop_flock)
				err = efs_plock_set_apply(&rq->nflock, 0, UINT64_MAX, F_UNLCK, 0);
		} else if (err == 0) {
			err = efs_plock_set_apply(rq->flock_ns ? &rq->nflock : &rq->nposix, rq->start,
						  rq->end, rq->type, rq->pid);
		}
		same = err == 0 && efs_plock_set_equal(&before_p, &rq->nposix) &&
		       efs_plock_set_equal(&before_f, &rq->nflock);
		efs_plock_set_clear(&before_p);
		efs_plock_set_clear(&before_f);
		if (err < 0) {
			req_finish(rq, err);
			return;
		}
		if (same && rq->type == F_UNLCK) {
			/* Unlocking what is not held. */
			req_finish(rq, 0);
			return;
		}
		/* A lock already held as asked still commits, so that the local
		 * table records it and the handle is marked. */
	}
	err = efs_meta_range_ino(&fs->ns, EFS_META_K_PLOCK, rq->ino, &range);
	if (err == 0)
		err = efs_meta_key_plock(&fs->ns, rq->ino, node, rq->owner, &key);
	if (err == 0)
		err = commit(rq, &range, existed, &key);
	if (err == -EIO) {
		/* Not ACTIVE: wait for the session and start over. */
		req_retry(rq);
		return;
	}
	if (err < 0)
		req_finish(rq, err);
}

static void read_start(struct plk_req *rq)
{
	struct efs_meta_range range;
	struct efs_etcd_range_opts o = {0};
	int r;

	r = efs_meta_range_ino(&rq->fs->ns, EFS_META_K_PLOCK, rq->ino, &range);
	if (r == 0) {
		o.range_end = range.end.buf;
		o.range_end_len = range.end.len;
		r = efs_etcd_range(rq->fs->c, range.key.buf, range.key.len, &o, NULL, read_done,
				   rq);
	}
	if (r < 0) {
		req_finish(rq, r == -ESHUTDOWN ? -EIO : r);
		return;
	}
	rq->busy = true;
}

static void on_session(struct efs_session_waiter *w, int status, bool generation_changed)
{
	struct plk_req *rq = w->arg;

	(void)generation_changed;
	rq->in_sw = false;
	if (status < 0 || rq->lost) {
		req_finish(rq, -EIO);
		return;
	}
	read_start(rq);
}

/* One attempt: wait for an ACTIVE session (mutations), read, decide. */
static void req_attempt(struct plk_req *rq)
{
	int r;

	if (rq->lost) {
		req_finish(rq, -EIO);
		return;
	}
	if (rq->kind != PLK_GETLK) {
		rq->in_sw = true;
		r = efs_session_wait(rq->fs->s, &rq->sw, on_session, rq);
		if (r == 0)
			return;
		rq->in_sw = false;
		if (r < 0) {
			req_finish(rq, -EIO);
			return;
		}
	}
	read_start(rq);
}

/* ---- FUSE handlers ---- */

static struct efs_fs_handle *fh_of(struct fuse_file_info *fi)
{
	return fi ? (struct efs_fs_handle *)(uintptr_t)fi->fh : NULL;
}

/* Common start of getlk/setlk/flock: counts, checks the handle, builds the
 * request. NULL when it answered already. */
static struct plk_req *start(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
			     enum plk_kind kind, enum efs_fs_opcode code)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *h = fh_of(fi);
	struct plk *p;
	struct plk_req *rq;
	int err = 0;

	if (h && efs_fs_handle_check(fs, h) < 0)
		err = -EIO;
	else if (!(p = plk_get(fs)) || !(rq = req_new(p, req, kind, code, ino)))
		err = -ENOMEM;
	if (err < 0) {
		efs_fs_reply_now(fs, req, code, err);
		return NULL;
	}
	rq->h = h;
	rq->owner = fi ? fi->lock_owner : 0;
	return rq;
}

static int lock_span(struct plk_req *rq, const struct flock *lock)
{
	int r;

	if (lock->l_whence != SEEK_SET)
		return -EINVAL;
	r = efs_plock_span(lock->l_start, lock->l_len, &rq->start, &rq->end);
	if (r < 0)
		return r;
	/* libfuse turns the kernel's OFFSET_MAX end into l_len 0, and any
	 * end at or past OFFSET_MAX means "to EOF" for the kernel too. */
	if (rq->end >= (uint64_t)INT64_MAX)
		rq->end = UINT64_MAX;
	return 0;
}

void efs_fs_getlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock)
{
	struct plk_req *rq = start(req, ino, fi, PLK_GETLK, EFS_FS_OP_GETLK);
	const struct efs_plock *c;
	int r;

	if (!rq)
		return;
	rq->type = lock->l_type;
	r = lock_span(rq, lock);
	if (r == 0 && rq->type != F_RDLCK && rq->type != F_WRLCK)
		r = -EINVAL;
	if (r < 0) {
		req_finish(rq, r);
		return;
	}
	c = local_conflict(rq->p, rq);
	if (c) {
		reply_getlk(rq, c, true);
		return;
	}
	req_attempt(rq);
}

/* Sends a checked lock or unlock request on: a request that would wait
 * without |sleep| fails with EAGAIN at once when this node holds a
 * conflicting lock; a sleeping one can be interrupted. */
static void lock_go(struct plk_req *rq, bool sleep)
{
	rq->sleep = sleep && rq->type != F_UNLCK;
	if (rq->type != F_UNLCK && local_conflict(rq->p, rq) && !rq->sleep) {
		req_finish(rq, -EAGAIN);
		return;
	}
	if (rq->sleep)
		fuse_req_interrupt_func(rq->base.req, on_interrupt, rq);
	req_attempt(rq);
}

void efs_fs_setlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock,
		  int sleep)
{
	struct plk_req *rq = start(req, ino, fi, PLK_SETLK, EFS_FS_OP_SETLK);
	int r;

	if (!rq)
		return;
	rq->type = lock->l_type;
	rq->pid = lock->l_pid;
	r = lock_span(rq, lock);
	if (r == 0 && rq->type != F_RDLCK && rq->type != F_WRLCK && rq->type != F_UNLCK)
		r = -EINVAL;
	if (r < 0) {
		req_finish(rq, r);
		return;
	}
	lock_go(rq, sleep);
}

void efs_fs_flock(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op)
{
	struct plk_req *rq = start(req, ino, fi, PLK_FLOCK, EFS_FS_OP_FLOCK);
	int r = 0;

	if (!rq)
		return;
	rq->flock_ns = true;
	rq->start = 0;
	rq->end = UINT64_MAX;
	rq->pid = fuse_req_ctx(req)->pid;
	switch (op & ~LOCK_NB) {
	case LOCK_SH:
		rq->type = F_RDLCK;
		break;
	case LOCK_EX:
		rq->type = F_WRLCK;
		break;
	case LOCK_UN:
		rq->type = F_UNLCK;
		break;
	default:
		r = -EINVAL;
	}
	if (r < 0) {
		req_finish(rq, r);
		return;
	}
	lock_go(rq, !(op & LOCK_NB));
}

/* ---- Flush and release ---- */

static int drop_start(struct plk *p, struct plk_join *j, uint64_t ino, uint64_t owner,
		      bool posix, bool flock)
{
	struct plk_req *rq = req_new(p, NULL, PLK_DROP, EFS_FS_OP_FLUSH, ino);

	if (!rq)
		return -ENOMEM;
	rq->owner = owner;
	rq->type = F_UNLCK;
	rq->drop_posix = posix;
	rq->drop_flock = flock;
	rq->join = j;
	j->pending++;
	/* Counted until done: the daemon drains these before leaving. */
	rq->fs->inflight++;
	req_attempt(rq);
	return 0;
}

int efs_fs_plock_flush(struct efs_fs *fs, uint64_t ino, uint64_t lock_owner,
		       void (*cb)(int status, void *arg), void *arg)
{
	struct plk *p = fs->plock_priv;
	struct plk_owner *o;
	struct plk_join *j;
	int r;

	if (!p)
		return 1;
	o = owner_live(p, ino, lock_owner);
	if (!o || o->posix.n == 0)
		return 1;
	j = join_new(cb, arg);
	if (!j)
		return -ENOMEM;
	r = drop_start(p, j, ino, lock_owner, true, false);
	if (r < 0) {
		efs_mem_free(j);
		return r;
	}
	join_one(j, 0);
	return 0;
}

int efs_fs_plock_release(struct efs_fs *fs, struct efs_fs_handle *h, uint64_t lock_owner,
			 void (*cb)(int status, void *arg), void *arg)
{
	struct plk *p = fs->plock_priv;
	struct plk_join *j;
	struct efs_list *n;
	int r = 0, started = 0;

	if (!p || !h)
		return 1;
	j = join_new(cb, arg);
	if (!j)
		return -ENOMEM;
	for (struct plk_owner *o = p->owners; o; o = o->next) {
		bool by_owner = lock_owner != 0 && o->ino == h->ino && o->owner == lock_owner;
		bool by_handle = o->h == h && o->posix.n > 0;

		if (o->h == h)
			o->h = NULL;
		if (owner_stale(p, o))
			continue;
		if (!by_owner && !by_handle)
			continue;
		if (r == 0) {
			r = drop_start(p, j, o->ino, o->owner, true, by_owner);
			if (r == 0)
				started++;
		}
	}
	/* Requests issued in flight (a lock being taken through |h| when the
	 * release arrives) must not keep a pointer to it either. */
	efs_list_for_each(n, &p->reqs) {
		struct plk_req *rq = efs_list_entry(n, struct plk_req, link);

		if (rq->h == h)
			rq->h = NULL;
	}
	if (started == 0) {
		efs_mem_free(j);
		return r < 0 ? r : 1;
	}
	if (r < 0 && j->err == 0)
		j->err = r;
	join_one(j, 0);
	return 0;
}

/* ---- Session loss and teardown ---- */

void efs_fs_plock_session_lost(struct efs_fs *fs)
{
	struct plk *p = fs->plock_priv;
	struct efs_list *n, *tmp;

	if (!p)
		return;
	owners_clear(p);
	efs_list_for_each_safe(n, tmp, &p->reqs) {
		struct plk_req *rq = efs_list_entry(n, struct plk_req, link);

		if (rq->busy || rq->in_sw) {
			rq->lost = true;
			continue;
		}
		/* Waiting on a watch. */
		req_finish(rq, -EIO);
	}
}

void efs_fs_plock_done(struct efs_fs *fs)
{
	struct plk *p = fs->plock_priv;
	struct plk_req *rq;
	struct efs_list *n;

	if (!p)
		return;
	/* The stream frees its watchers without callbacks. */
	efs_list_for_each(n, &p->reqs)
		efs_list_entry(n, struct plk_req, link)->w = NULL;
	p->ws = efs_etcd_watch_stream_free(p->ws);
	while (!efs_list_empty(&p->reqs)) {
		rq = efs_list_entry(p->reqs.next, struct plk_req, link);
		if (rq->in_sw) {
			efs_session_wait_cancel(fs->s, &rq->sw);
			rq->in_sw = false;
		}
		if (rq->join) {
			/* The fs is going away (its handles are freed already):
			 * the drop's caller is not called back. */
			fs->inflight--;
			if (--rq->join->pending == 0)
				efs_mem_free(rq->join);
			rq->join = NULL;
		}
		req_finish(rq, -EIO);
	}
	owners_clear(p);
	efs_mem_free(p);
	fs->plock_priv = NULL;
}
