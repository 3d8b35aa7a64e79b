/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reclaimer (fs/data.h, "Reclaim"): frees the extent chunks of dropped
 * inodes in resumable batches. A pass reads every rc/ record (and n/ to
 * tell dead nodes), and works through the records of this node and the
 * adoptable ones, one at a time: read up to RC_CHUNKS chunk keys from the
 * record's next_chunk, then one transaction under the allocator's map
 * token that deletes them (comparing their mod_revisions), frees their
 * device runs (efs_alloc_txn_free) and advances rc/<ino> (taking it over:
 * node = this node) or deletes it once no chunk is left. The first pass
 * also turns orphans whose opener is gone into reclaims, through the
 * engine's reclaim operation (efs_fs_reclaim: lock, nlink and open checks,
 * i/ and xattr deletes, rc/ put).
 *
 * An unknown outcome is settled by reading the first chunk key of the
 * batch back: gone means applied (chunk keys of a reclaimed inode are only
 * deleted by its reclaimer). A compare failure or an error ends the pass;
 * a later pass (a second later) starts over from etcd.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "alloc/alloc.h"
#include "etcd/watch.h"
#include "fs/data.h"
#include "meta/records.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timer.h"

#define RC_CHUNKS   8	 /* chunk keys per batch */
#define RC_OPS_MAX  110	 /* compares/ops budget of one batch */
#define RC_RETRY_MS 1000 /* after a failed pass */
#define RC_KICK_MS  10	 /* coalesces kicks */
#define OREF_DROP_MS	   20	/* a freed inode's reference drop waits for others */
#define OREF_DROP_BATCH	   64	/* ... or goes once this many wait (one nested txn each) */
#define OREF_DROP_INFLIGHT 2	/* drop batches in flight */
#define OREF_DROP_RETRY_MS 1000 /* after a failed drop batch */

struct rc;

/* One etcd call or allocator wait; |rc| is cleared when the reclaimer goes. */
struct rc_call {
	struct rc *rc;
	struct efs_alloc_txn *at; /* allocator waits */
};

struct rc_rec {
	uint64_t ino;
	int64_t mod_rev;
	Etcfs__Reclaim *rec; /* decoded */
};

struct rc {
	struct efs_fs *fs;
	uv_timer_t *timer;
	bool busy;	     /* a pass runs */
	bool again;	     /* kicked during the pass */
	bool orphans_done;   /* the start's orphan scan ran */
	uint64_t pending;    /* records seen by the last pass, minus finished */
	uint64_t freed;	     /* blocks freed so far */
	struct rc_call *call; /* in flight */
	/* The pass. */
	Etcdserverpb__TxnResponse *list; /* rc/, n/ (and o/) ranges, owned */
	struct rc_rec *recs;
	size_t nrecs, irec;
	/* The batch. */
	Etcdserverpb__RangeResponse *chunks; /* owned (from its txn response) */
	Etcdserverpb__TxnResponse *chunks_resp;
	size_t nchunks;
	struct efs_runs runs;
	uint64_t next_chunk;
	bool exhausted;
	struct efs_alloc_txn *at;
	bool at_granted; /* |at| holds the map token (else it waits for it) */
	uint64_t *bad; /* inodes whose reclaim failed for good in this process */
	size_t nbad;
	/* The o/ watch: an unlink elsewhere orphaned an inode this node may
	 * hold a reference on (the request to drop it). */
	struct efs_etcd_watch_stream *ows;
	struct efs_etcd_watcher *ow;
	uv_timer_t *grace_timer; /* a dead node's orphans: adopted after the grace */
	uint64_t death_ms; /* loop time of the last session end seen (0: none) */
	/* Open references: transactions in flight outside the engine, and
	 * the drops waiting for their batch (see drop_queue). */
	struct oref_call *orefs;
	struct oref_drop_ent *drops;
	size_t ndrops, cdrops;
	unsigned drop_batches; /* in flight */
	uv_timer_t *drop_timer;
};

static void pass_end(struct rc *rc, bool failed);
static void orphan_watch_start(struct rc *rc, int64_t from);
static void grace_cb(uv_timer_t *t);
static void rec_next(struct rc *rc);
static void batch_read(struct rc *rc);

static struct rc *rc_of(const struct efs_fs *fs)
{
	return fs->reclaim_priv;
}

/* ---- Calls ---- */

static struct rc_call *call_new(struct rc *rc)
{
	struct rc_call *c = efs_mem_calloc(1, sizeof(*c));

	if (c) {
		c->rc = rc;
		rc->call = c;
	}
	return c;
}

/* The call's callback runs: detach it. NULL when the reclaimer is gone. */
static struct rc *call_done(struct rc_call *c)
{
	struct rc *rc = c->rc;

	if (rc && rc->call == c)
		rc->call = NULL;
	return rc;
}

/* call_done for a reply callback's |arg|, which it frees. */
static struct rc *call_end(void *arg)
{
	struct rc_call *c = arg;
	struct rc *rc = call_done(c);

	efs_mem_free(c);
	return rc;
}

static int rc_send(struct rc *rc, struct efs_etcd_txn *t, efs_etcd_txn_cb cb)
{
	struct rc_call *c = call_new(rc);
	int r;

	if (!c) {
		efs_etcd_txn_free(t);
		return -ENOMEM;
	}
	r = efs_etcd_txn(rc->fs->c, efs_etcd_txn_request(t), NULL, cb, c);
	efs_etcd_txn_free(t);
	if (r < 0) {
		rc->call = NULL;
		efs_mem_free(c);
	}
	return r;
}

/* ---- Reclaim record put (in the dropping transaction) ---- */

int efs_fs_drop_inode_keys(struct efs_fs_op *op, uint64_t ino, const Etcfs__Inode *rec)
{
	struct efs_meta_key k;
	bool reclaim = false;
	int r;

	r = efs_fs_op_txn(op);
	if (r < 0)
		return r;
	/* Also for a file this node has data state for: a truncate or a
	 * publication in parts may have left chunks behind a record that
	 * says size 0 (the reclaimer deletes an empty record at once). */
	if (op->fs->alloc && rec && S_ISREG(rec->mode)) {
		struct efs_fs_inode *in = efs_fs_ifind(op->fs, ino);

		reclaim = rec->size || rec->blocks || (in && in->data);
	}
	r = efs_fs_del_family(op, EFS_META_K_XATTR, ino);
	if (r == 0 && !reclaim)
		r = efs_fs_del_family(op, EFS_META_K_EXTENT, ino);
	if (r == 0 && reclaim)
		r = efs_fs_reclaim_put(op, ino);
	if (r == 0)
		r = efs_lock_drop_in_txn(op->fs->lc, op->txn, ino);
	if (r == 0)
		r = efs_meta_key_orphan(&op->fs->ns, ino, &k);
	if (r == 0)
		r = efs_etcd_txn_delete(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
					false);
	return r;
}

int efs_fs_reclaim_put(struct efs_fs_op *op, uint64_t ino)
{
	Etcfs__Reclaim rec = ETCFS__RECLAIM__INIT;
	const Etcfs__Inode *in = efs_fs_rec(op, ino);
	struct efs_meta_key k;
	int r;

	if (!op->txn)
		return -EINVAL;
	rec.since_ns = efs_fs_now();
	rec.next_chunk = 0;
	rec.node = (char *)efs_session_node(op->fs->s);
	rec.blocks_left = in ? in->blocks : 0;
	r = efs_meta_key_reclaim(&op->fs->ns, ino, &k);
	if (r < 0)
		return r;
	return efs_meta_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, &k, &rec.base, 0);
}

/* ---- Pass ---- */

static bool is_bad(const struct rc *rc, uint64_t ino)
{
	for (size_t i = 0; i < rc->nbad; i++)
		if (rc->bad[i] == ino)
			return true;
	return false;
}

static void mark_bad(struct rc *rc, uint64_t ino)
{
	uint64_t *v = efs_mem_realloc(rc->bad, (rc->nbad + 1) * sizeof(*v));

	if (v) {
		v[rc->nbad++] = ino;
		rc->bad = v;
	}
}

static void batch_clear(struct rc *rc)
{
	if (rc->chunks_resp)
		protobuf_c_message_free_unpacked(&rc->chunks_resp->base, efs_mem_protobuf());
	rc->chunks_resp = NULL;
	rc->chunks = NULL;
	rc->nchunks = 0;
	efs_runs_done(&rc->runs);
	rc->exhausted = false;
}

static void pass_clear(struct rc *rc)
{
	batch_clear(rc);
	for (size_t i = 0; i < rc->nrecs; i++)
		efs_meta_record_free(rc->recs[i].rec);
	efs_mem_free(rc->recs);
	rc->recs = NULL;
	rc->nrecs = rc->irec = 0;
	if (rc->list)
		protobuf_c_message_free_unpacked(&rc->list->base, efs_mem_protobuf());
	rc->list = NULL;
}

static void timer_cb(uv_timer_t *t);

static void pass_end(struct rc *rc, bool failed)
{
	pass_clear(rc);
	rc->busy = false;
	if (failed)
		uv_timer_start(rc->timer, timer_cb, RC_RETRY_MS, 0);
	else if (rc->again)
		uv_timer_start(rc->timer, timer_cb, RC_KICK_MS, 0);
	rc->again = false;
}

/* Is |node| alive (its n/ key in the pass's n/ range)? */
static bool node_alive(struct rc *rc, const char *node, uint64_t *gen)
{
	Etcdserverpb__RangeResponse *nodes = NULL;

	if (efs_etcd_txn_resp_range(rc->list, 1, &nodes) < 0)
		return true;
	for (size_t i = 0; i < nodes->n_kvs; i++) {
		struct efs_meta_key_info ki;
		Etcfs__NodeInfo *ni = NULL;

		if (efs_meta_key_parse(&rc->fs->ns, nodes->kvs[i]->key.data,
				       nodes->kvs[i]->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_NODE || strcmp(ki.node, node))
			continue;
		if (gen) {
			*gen = 0;
			if (efs_meta_nodeinfo_decode(nodes->kvs[i]->value.data,
						     nodes->kvs[i]->value.len, &ni, NULL) == 0) {
				*gen = ni->session_generation;
				efs_meta_record_free(ni);
			}
		}
		return true;
	}
	return false;
}

/* How many open references the pass's r/ read (range 3) shows on |ino|:
 * this node's (|mine|) and others'. */
static void pass_refs(struct rc *rc, uint64_t ino, bool *mine, size_t *others)
{
	Etcdserverpb__RangeResponse *refs = NULL;
	const char *me = efs_session_node(rc->fs->s);

	*mine = false;
	*others = 0;
	if (efs_etcd_txn_resp_range(rc->list, 3, &refs) < 0) {
		*others = 1; /* unknown: leave it */
		return;
	}
	for (size_t i = 0; i < refs->n_kvs; i++) {
		struct efs_meta_key_info ki;

		if (efs_meta_key_parse(&rc->fs->ns, refs->kvs[i]->key.data,
				       refs->kvs[i]->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_OPEN || ki.ino != ino)
			continue;
		if (!strcmp(ki.node, me))
			*mine = true;
		else
			(*others)++;
	}
}

/*
 * How long orphans without references must still wait: until the grace
 * has passed since the last session end this node saw (a dead opener may
 * have held such a file exclusively with writes into its preallocated
 * blocks still queued). One time for every node: a death may be any
 * orphan's opener, since a reference gone with its lease names nobody
 * any more. The node's own start does not wait, as before: a previous
 * process of this node cut off rather than dead is not told apart here
 * (the allocator checks its pid; left open).
 */
static uint64_t adopt_wait_ms(const struct rc *rc)
{
	uint64_t now = uv_now(rc->fs->loop);
	uint64_t end = rc->death_ms + rc->fs->dead_grace_ms;

	return rc->death_ms && end > now ? end - now : 0;
}

/*
 * Orphans nobody holds open any more: handed to the engine's reclaim
 * operation, which checks the open references again under the inode's
 * lock. An orphan with another node's reference is that node's to turn
 * into a reclaim record (at its last close, or when the o/ watch asks it
 * to drop a cached reference), or ours once its lease is gone.
 */
static void scan_orphans(struct rc *rc)
{
	struct efs_fs *fs = rc->fs;
	Etcdserverpb__RangeResponse *orph = NULL;

	uint64_t wait = adopt_wait_ms(rc);
	bool deferred = false;

	if (efs_etcd_txn_resp_range(rc->list, 2, &orph) < 0)
		return;
	for (size_t i = 0; i < orph->n_kvs; i++) {
		const Mvccpb__KeyValue *kv = orph->kvs[i];
		struct efs_meta_key_info ki;
		struct efs_fs_inode *in;
		size_t others;
		bool mine;

		if (efs_meta_key_parse(&fs->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_ORPHAN)
			continue;
		pass_refs(rc, ki.ino, &mine, &others);
		in = efs_fs_ifind(fs, ki.ino);
		if (in)
			in->orphan_seen = true;
		if (others || efs_fs_live_opens(fs, in) > 0)
			continue;
		if (wait) {
			deferred = true;
			continue;
		}
		{
			char node[EFS_META_NODE_MAX + 1] = "?";
			Etcfs__Orphan *o = NULL;
			uint64_t gen = 0, seq, lgen = 0;
			bool gone = false;

			/* Its unlinker's session gone (main's rule, which a
			 * directory, with no references, still needs). */
			if (efs_meta_orphan_decode(kv->value.data, kv->value.len, &o, NULL) == 0 &&
			    efs_fs_opid_decode(o->op_id.data, o->op_id.len, node, &gen, &seq) == 0) {
				if (!strcmp(node, efs_session_node(fs->s)))
					gone = gen != efs_session_generation(fs->s);
				else
					gone = !node_alive(rc, node, &lgen) || (lgen && lgen != gen);
			} else {
				snprintf(node, sizeof(node), "?");
			}
			efs_meta_record_free(o);
			/* "of N": the node whose unlink orphaned it. */
			efs_log_info("reclaim: orphan inode %" PRIu64 " of %s (%s) adopted",
				     ki.ino, node,
				     gone ? "its unlinker's session ended" : "no opener left");
			if (gone)
				efs_fs_reclaim(fs, ki.ino);
			else
				efs_fs_reclaim_file(fs, ki.ino);
		}
	}
	/* Read again once the grace is over (a later death restarts it). */
	if (deferred)
		uv_timer_start(rc->grace_timer, grace_cb, wait, 0);
}

/* The first range of a read's reply, the reply kept in *|keep|; NULL
 * after a failed read, which ends the pass. */
static Etcdserverpb__RangeResponse *read_result(struct rc *rc, struct efs_etcd_result *r,
						Etcdserverpb__TxnResponse *resp,
						Etcdserverpb__TxnResponse **keep, const char *what)
{
	Etcdserverpb__RangeResponse *rr = NULL;

	if (r->err < 0 || efs_etcd_txn_resp_range(resp, 0, &rr) < 0) {
		efs_log_warn("reclaim: reading %s failed: %s", what, r->message);
		pass_end(rc, true);
		return NULL;
	}
	*keep = resp;
	r->resp = NULL;
	return rr;
}

static void list_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct rc *rc = call_end(arg);
	Etcdserverpb__RangeResponse *rr;
	const char *me;

	if (!rc)
		return;
	rr = read_result(rc, r, resp, &rc->list, "reclaim records");
	if (!rr)
		return;
	me = efs_session_node(rc->fs->s);
	rc->recs = efs_mem_calloc(rr->n_kvs ? rr->n_kvs : 1, sizeof(*rc->recs));
	if (!rc->recs) {
		pass_end(rc, true);
		return;
	}
	for (size_t i = 0; i < rr->n_kvs; i++) {
		const Mvccpb__KeyValue *kv = rr->kvs[i];
		struct efs_meta_key_info ki;
		Etcfs__Reclaim *rec = NULL;
		const char *why = NULL;

		if (efs_meta_key_parse(&rc->fs->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_RECLAIM)
			continue;
		if (efs_meta_reclaim_decode(kv->value.data, kv->value.len, &rec, &why) < 0) {
			efs_log_err("reclaim: rc/%" PRIu64 " does not decode (%s)", ki.ino,
				    why ? why : "?");
			continue;
		}
		if (is_bad(rc, ki.ino) ||
		    (rec->node[0] && strcmp(rec->node, me) && node_alive(rc, rec->node, NULL))) {
			efs_meta_record_free(rec);
			continue;
		}
		rc->recs[rc->nrecs].ino = ki.ino;
		rc->recs[rc->nrecs].mod_rev = kv->mod_revision;
		rc->recs[rc->nrecs].rec = rec;
		rc->nrecs++;
	}
	rc->pending = rc->nrecs;
	if (!rc->orphans_done) {
		/* The watch starts right after the list's revision: no orphan
		 * put between the two goes unseen. */
		rc->orphans_done = true;
		orphan_watch_start(rc, rc->list->header ? rc->list->header->revision + 1 : 0);
		scan_orphans(rc);
	}
	rec_next(rc);
}

static void pass_start(struct rc *rc)
{
	struct efs_fs *fs = rc->fs;
	struct efs_meta_range rg;
	struct efs_etcd_txn *t = NULL;
	int r;

	if (rc->busy) {
		rc->again = true;
		return;
	}
	if (!efs_session_is_active(fs->s)) {
		uv_timer_start(rc->timer, timer_cb, RC_RETRY_MS, 0);
		return;
	}
	rc->busy = true;
	rc->again = false;
	/* No o/ watch: this pass reads every orphan and starts it. */
	if (!rc->ow)
		rc->orphans_done = false;
	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_meta_range_family(&fs->ns, EFS_META_K_RECLAIM, &rg);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len, rg.end.buf,
				       rg.end.len);
	if (r == 0)
		r = efs_meta_range_family(&fs->ns, EFS_META_K_NODE, &rg);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len, rg.end.buf,
				       rg.end.len);
	if (r == 0 && !rc->orphans_done)
		r = efs_meta_range_family(&fs->ns, EFS_META_K_ORPHAN, &rg);
	if (r == 0 && !rc->orphans_done)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len, rg.end.buf,
				       rg.end.len);
	if (r == 0 && !rc->orphans_done)
		r = efs_meta_range_family(&fs->ns, EFS_META_K_OPEN, &rg);
	if (r == 0 && !rc->orphans_done)
		r = efs_etcd_txn_range_keys(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len,
					    rg.end.buf, rg.end.len);
	if (r == 0) {
		r = rc_send(rc, t, list_cb);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	if (r < 0) {
		efs_log_warn("reclaim: starting a pass: %s", strerror(-r));
		pass_end(rc, true);
	}
}

static void timer_cb(uv_timer_t *t)
{
	struct rc *rc = t->data;

	if (rc)
		pass_start(rc);
}

/* ---- Batches ---- */

static void rec_next(struct rc *rc)
{
	if (rc->irec >= rc->nrecs) {
		pass_end(rc, false);
		return;
	}
	rc->next_chunk = rc->recs[rc->irec].rec->next_chunk;
	batch_read(rc);
}

/* The batch committed: advance. */
static void batch_applied(struct rc *rc, int64_t rev)
{
	struct rc_rec *rr = &rc->recs[rc->irec];
	uint64_t blocks = efs_runs_total(&rc->runs);
	uint64_t sect = blocks * (rc->fs->blksize / 512);

	rc->freed += blocks;
	if (rc->exhausted) {
		efs_log_debug("reclaim: inode %" PRIu64 " reclaimed", rr->ino);
		rc->irec++;
		if (rc->pending)
			rc->pending--;
		batch_clear(rc);
		rec_next(rc);
		return;
	}
	rr->mod_rev = rev;
	rr->rec->next_chunk = rc->next_chunk;
	rr->rec->blocks_left = rr->rec->blocks_left > sect ? rr->rec->blocks_left - sect : 0;
	batch_clear(rc);
	batch_read(rc);
}

/* The batch's allocator contribution ends with |oc| (|rev|: the commit's
 * revision): the batch no longer holds it nor the map token. */
static void batch_settle(struct rc *rc, enum efs_alloc_outcome oc, int64_t rev)
{
	struct efs_alloc_txn *at = rc->at;

	rc->at = NULL;
	rc->at_granted = false;
	efs_alloc_txn_end(at, oc, rev);
}

/* The batch did not apply (or cannot be known to have): its contribution
 * ends as FAILED, which makes the allocator re-read its maps (a freed
 * block then stays used until fsck: no corruption), and the pass ends. */
static void batch_failed(struct rc *rc)
{
	batch_settle(rc, EFS_ALLOC_FAILED, 0);
	pass_end(rc, true);
}

static void verify_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct rc *rc = call_end(arg);
	Etcdserverpb__RangeResponse *rr = NULL;

	if (!rc)
		return;
	if (r->err < 0 || efs_etcd_txn_resp_range(resp, 0, &rr) < 0) {
		/* Still unknown: leave the contribution unsettled is not allowed;
		 * re-reading later is done by a new verify. */
		efs_log_warn("reclaim: verifying a batch failed: %s", r->message);
		batch_failed(rc);
		return;
	}
	if (rr->n_kvs != 0) {
		batch_failed(rc);
		return;
	}
	batch_settle(rc, EFS_ALLOC_COMMITTED, resp->header ? resp->header->revision : 0);
	/* The record's mod_revision is unknown: start a fresh pass. */
	rc->freed += efs_runs_total(&rc->runs);
	pass_end(rc, false);
	rc->again = false;
	uv_timer_start(rc->timer, timer_cb, 0, 0);
}

static void commit_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct rc *rc = call_end(arg);
	enum efs_fs_outcome oc;
	struct efs_fs *fs;

	if (!rc)
		return;
	fs = rc->fs;
	oc = efs_fs_txn_outcome(fs, EFS_FS_ORIG_RECLAIM, r, resp);
	if (oc == EFS_FS_TXN_UNKNOWN) {
		struct efs_etcd_txn *t = NULL;
		struct efs_meta_key k;
		const uint8_t *vk;
		size_t vlen;
		int e = 0;

		efs_alloc_txn_end(rc->at, EFS_ALLOC_UNKNOWN, 0);
		if (rc->nchunks > 0) {
			/* The first chunk deleted tells whether it applied. */
			vk = rc->chunks->kvs[0]->key.data;
			vlen = rc->chunks->kvs[0]->key.len;
		} else {
			/* A batch without chunks deletes the record itself. */
			e = efs_meta_key_reclaim(&fs->ns, rc->recs[rc->irec].ino, &k);
			vk = k.buf;
			vlen = k.len;
		}
		if (e == 0)
			e = efs_etcd_txn_new(&t, 0);
		if (e == 0)
			e = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, vk, vlen, NULL, 0);
		if (e == 0) {
			e = rc_send(rc, t, verify_cb);
			t = NULL;
		}
		efs_etcd_txn_free(t);
		if (e < 0)
			batch_failed(rc); /* cannot verify now */
		return;
	}
	if (oc != EFS_FS_TXN_OK) {
		if (oc == EFS_FS_TXN_ERROR)
			efs_log_warn("reclaim: batch of inode %" PRIu64 " failed: %s",
				     rc->recs[rc->irec].ino, r->message);
		batch_failed(rc);
		return;
	}
	efs_alloc_txn_result(rc->at, resp);
	batch_settle(rc, EFS_ALLOC_COMMITTED, resp->header ? resp->header->revision : 0);
	batch_applied(rc, resp->header ? resp->header->revision : 0);
}

/* Builds and sends the batch's transaction (the map token is held). */
static int batch_send(struct rc *rc)
{
	struct efs_fs *fs = rc->fs;
	struct rc_rec *rr = &rc->recs[rc->irec];
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key k;
	int r;

	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_session_guard(fs->s, t);
	for (size_t i = 0; r == 0 && i < rc->nchunks; i++) {
		const Mvccpb__KeyValue *kv = rc->chunks->kvs[i];

		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, kv->key.data,
					 kv->key.len, kv->mod_revision);
		if (r == 0)
			r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, kv->key.data, kv->key.len,
						NULL, 0, false);
	}
	if (r == 0)
		r = efs_meta_key_reclaim(&fs->ns, rr->ino, &k);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
					 rr->mod_rev);
	if (r == 0 && rc->exhausted) {
		r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0, false);
	} else if (r == 0) {
		Etcfs__Reclaim nrec = *rr->rec;
		uint64_t sect = efs_runs_total(&rc->runs) * (fs->blksize / 512);

		nrec.next_chunk = rc->next_chunk;
		nrec.node = (char *)efs_session_node(fs->s);
		nrec.blocks_left = nrec.blocks_left > sect ? nrec.blocks_left - sect : 0;
		r = efs_meta_txn_put(t, EFS_ETCD_TXN_SUCCESS, &k, &nrec.base, 0);
	}
	if (r == 0)
		r = efs_alloc_txn_free(rc->at, &rc->runs, rr->ino);
	if (r == 0)
		r = efs_alloc_txn_build(rc->at, t);
	if (r == 0) {
		r = rc_send(rc, t, commit_cb);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	return r;
}

static void begin_cb(int status, void *arg)
{
	struct rc_call *c = arg;
	struct rc *rc = call_done(c);
	struct efs_alloc_txn *at = c->at;
	int r;

	efs_mem_free(c);
	if (!rc) {
		/* The reclaimer went while this waited for the token. */
		if (status == 0 && at)
			efs_alloc_txn_end(at, EFS_ALLOC_FAILED, 0);
		return;
	}
	if (status < 0) {
		rc->at = NULL;
		rc->at_granted = false;
		pass_end(rc, true);
		return;
	}
	rc->at_granted = true;
	r = batch_send(rc);
	if (r < 0) {
		struct efs_alloc_txn *t = rc->at;

		if (r == -EUCLEAN) {
			efs_log_err("reclaim: inode %" PRIu64 " frees blocks already free: "
				    "its reclaim stops here (run fsck)",
				    rc->recs[rc->irec].ino);
			mark_bad(rc, rc->recs[rc->irec].ino);
		} else {
			efs_log_warn("reclaim: building a batch of inode %" PRIu64 ": %s",
				     rc->recs[rc->irec].ino, strerror(-r));
		}
		rc->at = NULL;
		rc->at_granted = false;
		efs_alloc_txn_end(t, EFS_ALLOC_FAILED, 0);
		pass_end(rc, true);
	}
}

/* Rough count of the groups a run list touches (for the op budget). */
static size_t groups_touched(const struct efs_fs *fs, const struct efs_runs *runs)
{
	uint64_t agb = fs->fi->ag_blocks ? fs->fi->ag_blocks : 1;
	size_t n = 0;

	for (size_t i = 0; i < runs->n; i++)
		n += (size_t)((runs->v[i].len + agb - 1) / agb) + 1;
	return n;
}

static void chunks_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct rc *rc = call_end(arg);
	Etcdserverpb__RangeResponse *rr;
	struct rc_call *bc;
	size_t n;
	int e;

	if (!rc)
		return;
	rr = read_result(rc, r, resp, &rc->chunks_resp, "chunks");
	if (!rr)
		return;
	rc->chunks = rr;
	/* Take chunks while the transaction stays within budget. */
	for (n = 0; n < rr->n_kvs; n++) {
		const Mvccpb__KeyValue *kv = rr->kvs[n];
		struct efs_meta_key_info ki;
		Etcfs__ExtentChunk *ch = NULL;
		const char *why = NULL;
		struct efs_runs save = {0};

		if (efs_meta_key_parse(&rc->fs->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_EXTENT ||
		    efs_meta_extent_chunk_decode(kv->value.data, kv->value.len, &ch, &why) < 0) {
			efs_log_err("reclaim: inode %" PRIu64 ": bad extent chunk (%s); "
				    "its reclaim stops here (run fsck)",
				    rc->recs[rc->irec].ino, why ? why : "bad key");
			mark_bad(rc, rc->recs[rc->irec].ino);
			rc->irec++;
			batch_clear(rc);
			rec_next(rc);
			return;
		}
		e = efs_runs_append(&save, &rc->runs);
		for (size_t i = 0; e == 0 && i < ch->n_extents; i++)
			e = efs_runs_add(&rc->runs, ch->extents[i]->dev_block,
					 ch->extents[i]->count);
		efs_meta_record_free(ch);
		if (e == 0 && n > 0 && 2 * (n + 1) + 4 + 4 * groups_touched(rc->fs, &rc->runs) >
					       RC_OPS_MAX) {
			/* Over budget: this chunk waits for the next batch. */
			efs_runs_done(&rc->runs);
			rc->runs = save;
			rc->next_chunk = ki.num;
			break;
		}
		efs_runs_done(&save);
		if (e < 0) {
			pass_end(rc, true);
			return;
		}
		rc->next_chunk = ki.num + 1;
	}
	rc->nchunks = n;
	rc->exhausted = n == rr->n_kvs && !rr->more;
	if (n == 0) {
		/* No chunk left: the record alone goes. */
		rc->exhausted = true;
	}
	bc = call_new(rc);
	if (!bc) {
		pass_end(rc, true);
		return;
	}
	e = efs_alloc_txn_begin(rc->fs->alloc, &bc->at, begin_cb, bc);
	rc->at = bc->at;
	if (e == 1) {
		begin_cb(0, bc);
	} else if (e < 0) {
		rc->call = NULL;
		rc->at = NULL;
		rc->at_granted = false;
		efs_mem_free(bc);
		pass_end(rc, true);
	}
}

static void batch_read(struct rc *rc)
{
	struct efs_fs *fs = rc->fs;
	struct rc_rec *rr = &rc->recs[rc->irec];
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	struct efs_meta_range rg;
	struct efs_meta_key k;
	struct efs_etcd_txn *t = NULL;
	int r;

	if (!efs_session_is_active(fs->s)) {
		pass_end(rc, true);
		return;
	}
	r = efs_meta_range_ino(&fs->ns, EFS_META_K_EXTENT, rr->ino, &rg);
	if (r == 0)
		r = efs_meta_key_extent(&fs->ns, rr->ino, rc->next_chunk, &k);
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r == 0) {
		req.key.data = k.buf;
		req.key.len = k.len;
		req.range_end.data = rg.end.buf;
		req.range_end.len = rg.end.len;
		req.limit = RC_CHUNKS;
		r = efs_etcd_txn_range_req(t, EFS_ETCD_TXN_SUCCESS, &req);
	}
	if (r == 0) {
		r = rc_send(rc, t, chunks_cb);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	if (r < 0) {
		efs_log_warn("reclaim: reading chunks of inode %" PRIu64 ": %s", rr->ino,
			     strerror(-r));
		pass_end(rc, true);
	}
}

/* ---- Lifecycle ---- */

static void grace_cb(uv_timer_t *t)
{
	struct rc *rc = t->data;

	if (!rc)
		return;
	rc->orphans_done = false;
	efs_fs_reclaim_kick(rc->fs);
}

/*
 * Another node's session ended: a pass adopts its interrupted reclaim
 * records now, and the orphans it alone held open (its open references
 * went with its lease) once the dead-node grace has passed: it may have
 * held such a file exclusively, with writes into its preallocated blocks
 * still queued below it, and those blocks must not be handed out before.
 */
static void peer_gone(void *arg, const char *node)
{
	struct efs_fs *fs = arg;
	struct rc *rc = rc_of(fs);

	if (!rc)
		return;
	efs_log_info("reclaim: node %s's session ended: adopting what it left", node);
	rc->death_ms = uv_now(fs->loop);
	efs_fs_reclaim_kick(fs);
	uv_timer_start(rc->grace_timer, grace_cb, fs->dead_grace_ms, 0);
}

/* ---- The o/ watch ---- */

/* An unlink (here or elsewhere) orphaned |ino|: a reference this node
 * keeps only cached goes now, and the last close here drops the one in
 * use (efs_fs_release). */
static void orphan_put(struct rc *rc, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind(rc->fs, ino);

	if (!in)
		return;
	in->orphan_seen = true;
	if (efs_fs_live_opens(rc->fs, in) == 0 && efs_fs_oref_held(rc->fs, in))
		efs_fs_reclaim(rc->fs, ino);
}

static void orphan_watch_cb(struct efs_etcd_watcher *w, int status,
			    const struct efs_etcd_watch_update *u, void *arg)
{
	struct rc *rc = arg;

	(void)w;
	(void)status;
	if (u->kind == EFS_ETCD_WATCH_EVENTS) {
		for (size_t i = 0; i < u->n_events; i++) {
			const Mvccpb__Event *ev = u->events[i];
			struct efs_meta_key_info ki;

			if (ev->type != MVCCPB__EVENT__EVENT_TYPE__PUT || !ev->kv ||
			    efs_meta_key_parse(&rc->fs->ns, ev->kv->key.data, ev->kv->key.len,
					       &ki) < 0 ||
			    ki.family != EFS_META_K_ORPHAN)
				continue;
			orphan_put(rc, ki.ino);
		}
		return;
	}
	if (u->kind != EFS_ETCD_WATCH_COMPACTED && u->kind != EFS_ETCD_WATCH_CANCELED)
		return;
	/* Events may be lost: the next pass reads every orphan (and starts
	 * the watch again). */
	rc->ow = efs_etcd_watcher_free(rc->ow);
	rc->orphans_done = false;
	efs_fs_reclaim_kick(rc->fs);
}

static void orphan_watch_start(struct rc *rc, int64_t from)
{
	struct efs_meta_range rg;
	struct efs_etcd_watch_opts o = {0};
	int r;

	if (rc->ow)
		return;
	r = efs_meta_range_family(&rc->fs->ns, EFS_META_K_ORPHAN, &rg);
	if (r == 0 && !rc->ows)
		r = efs_etcd_watch_stream_new(&rc->ows, rc->fs->c, EFS_ETCD_CH_BULK);
	if (r == 0) {
		o.key = rg.key.buf;
		o.key_len = rg.key.len;
		o.range_end = rg.end.buf;
		o.range_end_len = rg.end.len;
		o.no_delete = true;
		o.start_revision = from;
		r = efs_etcd_watcher_new(&rc->ow, rc->ows, &o, orphan_watch_cb, rc);
	}
	if (r < 0)
		efs_log_warn("reclaim: cannot watch the orphans: %s", strerror(-r));
}

/* ---- Open references ---- */

bool efs_fs_oref_held(const struct efs_fs *fs, const struct efs_fs_inode *in)
{
	return in && in->oref_epoch != 0 && in->oref_epoch == fs->epoch && !in->oref_unsure;
}

int efs_fs_oref_put_txn(struct efs_fs *fs, struct efs_etcd_txn *t, uint64_t ino)
{
	Etcfs__OpenRef o = ETCFS__OPEN_REF__INIT;
	struct efs_meta_key k;
	int r;

	r = efs_meta_key_open(&fs->ns, ino, efs_session_node(fs->s), &k);
	if (r < 0)
		return r;
	o.node = (char *)efs_session_node(fs->s);
	o.session_generation = efs_session_generation(fs->s);
	o.count = 1;
	return efs_meta_txn_put(t, EFS_ETCD_TXN_SUCCESS, &k, &o.base, efs_session_lease_id(fs->s));
}

void efs_fs_oref_set(struct efs_fs *fs, uint64_t ino, int64_t rev)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);

	if (!in)
		return;
	in->oref_epoch = fs->epoch;
	in->oref_rev = rev;
	in->oref_unsure = false;
}

void efs_fs_oref_set_unsure(struct efs_fs *fs, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);

	if (!in || efs_fs_oref_held(fs, in))
		return;
	in->oref_epoch = fs->epoch;
	in->oref_rev = 0;
	in->oref_unsure = true;
}

/*
 * An open-reference transaction sent outside the engine: a take (one
 * open's put) or a batch of drops. It counts in no operation, so it sits
 * on rc->orefs until its reply: efs_fs_reclaim_done detaches it (|rc|
 * NULL) and its callback, which the etcd client still runs (with
 * -ECANCELED when the client goes), then only frees it.
 */
struct oref_drop_ent {
	uint64_t ino;
	int64_t rev; /* the put's revision (0: unsure whether it applied) */
};

struct oref_call {
	struct oref_call *next, *prev; /* on rc->orefs */
	struct rc *rc;		       /* NULL: detached */
	/* A take. */
	uint64_t ino;
	uint64_t epoch;
	int tries;
	void (*cb)(void *arg, int status);
	void *arg;
	/* A drop batch. */
	struct oref_drop_ent *ents;
	size_t nents;
};

static struct oref_call *oref_call_new(struct rc *rc)
{
	struct oref_call *c = efs_mem_calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->rc = rc;
	c->next = rc->orefs;
	if (rc->orefs)
		rc->orefs->prev = c;
	rc->orefs = c;
	return c;
}

/* Takes |c| off its reclaimer's list and frees it. */
static void oref_call_free(struct oref_call *c)
{
	if (c->rc) {
		if (c->prev)
			c->prev->next = c->next;
		else
			c->rc->orefs = c->next;
		if (c->next)
			c->next->prev = c->prev;
	}
	efs_mem_free(c->ents);
	efs_mem_free(c);
}

/* efs_fs_reclaim_done: every call in flight forgets the file system. */
static void oref_calls_detach(struct rc *rc)
{
	struct oref_call *c = rc->orefs;

	while (c) {
		struct oref_call *n = c->next;

		c->rc = NULL;
		c->next = c->prev = NULL;
		c = n;
	}
	rc->orefs = NULL;
}

static int oref_send(struct oref_call *c);

static void oref_take_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct oref_call *c = arg;
	struct efs_fs *fs;
	enum efs_fs_outcome oc;
	int status = 0;

	if (!c->rc) {
		oref_call_free(c);
		return;
	}
	fs = c->rc->fs;
	oc = efs_fs_txn_outcome(fs, EFS_FS_ORIG_OPENREF, r, resp);
	if (oc == EFS_FS_TXN_UNKNOWN && ++c->tries < 3 && oref_send(c) == 0)
		return; /* a put again is harmless */
	if (oc == EFS_FS_TXN_OK && c->epoch == fs->epoch) {
		efs_fs_oref_set(fs, c->ino, resp->header ? resp->header->revision : 0);
	} else {
		status = -EIO;
		/* The put may have applied: its drop must still run. */
		if (oc == EFS_FS_TXN_UNKNOWN && c->epoch == fs->epoch)
			efs_fs_oref_set_unsure(fs, c->ino);
	}
	c->cb(c->arg, status);
	oref_call_free(c);
}

static int oref_send(struct oref_call *c)
{
	struct efs_fs *fs = c->rc->fs;
	struct efs_etcd_txn *t = NULL;
	int r;

	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_session_guard(fs->s, t);
	if (r == 0)
		r = efs_fs_oref_put_txn(fs, t, c->ino);
	if (r == 0)
		r = efs_etcd_txn(fs->c, efs_etcd_txn_request(t), NULL, oref_take_cb, c);
	efs_etcd_txn_free(t);
	return r;
}

int efs_fs_oref_take(struct efs_fs *fs, uint64_t ino, void (*cb)(void *arg, int status),
		     void *arg)
{
	struct rc *rc = rc_of(fs);
	struct oref_call *c;
	int r;

	if (!rc)
		return -EIO;
	c = oref_call_new(rc);
	if (!c)
		return -ENOMEM;
	c->ino = ino;
	c->epoch = fs->epoch;
	c->cb = cb;
	c->arg = arg;
	/* A drop of an unsure put still waiting to go would remove this one:
	 * the put supersedes it (its own drop goes when the inode does). */
	for (size_t i = 0; i < rc->ndrops; i++) {
		if (rc->drops[i].ino == ino && rc->drops[i].rev == 0)
			rc->drops[i--] = rc->drops[--rc->ndrops];
	}
	r = oref_send(c);
	if (r < 0)
		oref_call_free(c);
	return r;
}

int efs_fs_oref_cmp_alone(struct efs_fs *fs, struct efs_etcd_txn *t, uint64_t ino)
{
	struct efs_meta_range rg;
	struct efs_meta_key k, after;
	struct efs_etcd_cmp c = {0};
	int r;

	r = efs_meta_range_ino(&fs->ns, EFS_META_K_OPEN, ino, &rg);
	if (r == 0)
		r = efs_meta_key_open(&fs->ns, ino, efs_session_node(fs->s), &k);
	if (r < 0)
		return r;
	if (k.len + 1 > sizeof(after.buf))
		return -EINVAL;
	/* Node ids sort after the inode: every key but ours is below it or
	 * at or above our key followed by a zero byte. */
	after = k;
	after.buf[after.len++] = 0;
	c.target = EFS_ETCD_CMP_CREATE;
	c.result = EFS_ETCD_CMP_EQUAL;
	c.num = 0;
	c.key = rg.key.buf;
	c.key_len = rg.key.len;
	c.range_end = k.buf;
	c.range_end_len = k.len;
	r = efs_etcd_txn_compare_ex(t, &c);
	if (r < 0)
		return r;
	c.key = after.buf;
	c.key_len = after.len;
	c.range_end = rg.end.buf;
	c.range_end_len = rg.end.len;
	return efs_etcd_txn_compare_ex(t, &c);
}

void efs_fs_oref_count(struct efs_fs *fs, const struct efs_fs_kv *kv, uint64_t ino, bool *mine,
		       size_t *others)
{
	const char *me = efs_session_node(fs->s);

	*mine = false;
	*others = 0;
	for (size_t i = 0; kv && i < kv->nkvs; i++) {
		struct efs_meta_key_info ki;

		if (efs_meta_key_parse(&fs->ns, kv->kvs[i]->key.data, kv->kvs[i]->key.len, &ki) <
			    0 ||
		    ki.family != EFS_META_K_OPEN || ki.ino != ino)
			continue;
		if (!strcmp(ki.node, me))
			*mine = true;
		else
			(*others)++;
	}
}

/*
 * The inode leaves the cache: its cached reference goes, unless the
 * session that put it is gone (the lease took it). Drops wait up to
 * OREF_DROP_MS, or until OREF_DROP_BATCH are queued, and go together in
 * one transaction: the session guard, then one nested transaction per
 * reference comparing the revision that put it (so it never removes the
 * put of a later open; an unsure put, revision 0, is deleted as is) and
 * reading o/<ino> in either branch, since an unlink elsewhere may have
 * found the reference and left an orphan that this drop leaves
 * unreferenced: an orphan found goes to the reclaim operation, which
 * reads the references again under the inode's lock. At most
 * OREF_DROP_INFLIGHT batches are in flight; a batch whose outcome is not
 * known, or that could not go, is queued again (a drop that finds its key
 * gone does nothing).
 */
static void drop_flush(struct rc *rc);

static void drop_timer_cb(uv_timer_t *t)
{
	struct rc *rc = t->data;

	if (rc)
		drop_flush(rc);
}

static void drop_arm(struct rc *rc, uint64_t ms)
{
	if (!uv_is_active((uv_handle_t *)rc->drop_timer))
		uv_timer_start(rc->drop_timer, drop_timer_cb, ms, 0);
}

static bool drop_add(struct rc *rc, uint64_t ino, int64_t rev)
{
	if (rc->ndrops == rc->cdrops) {
		size_t n = rc->cdrops ? 2 * rc->cdrops : OREF_DROP_BATCH;
		struct oref_drop_ent *d = efs_mem_realloc(rc->drops, n * sizeof(*d));

		if (!d) {
			efs_log_warn("reclaim: open reference of inode %" PRIu64
				     " kept until the session ends: %s",
				     ino, strerror(ENOMEM));
			return false;
		}
		rc->drops = d;
		rc->cdrops = n;
	}
	rc->drops[rc->ndrops].ino = ino;
	rc->drops[rc->ndrops].rev = rev;
	rc->ndrops++;
	return true;
}

static void drop_queue(struct rc *rc, uint64_t ino, int64_t rev)
{
	if (!drop_add(rc, ino, rev))
		return;
	if (rc->ndrops >= OREF_DROP_BATCH)
		drop_flush(rc);
	else
		drop_arm(rc, OREF_DROP_MS);
}

static void drop_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct oref_call *c = arg;
	struct rc *rc = c->rc;
	enum efs_fs_outcome oc;

	if (!rc) {
		oref_call_free(c);
		return;
	}
	rc->drop_batches--;
	oc = efs_fs_txn_outcome(rc->fs, EFS_FS_ORIG_OPENREF, r, resp);
	if (oc == EFS_FS_TXN_OK) {
		for (size_t i = 0; i < c->nents; i++) {
			Etcdserverpb__TxnResponse *in = NULL;
			Etcdserverpb__RangeResponse *rr = NULL;

			if (efs_etcd_txn_resp_txn(resp, i, &in) < 0)
				continue;
			if (efs_etcd_txn_resp_range(in, in->succeeded ? 1 : 0, &rr) == 0 &&
			    rr->n_kvs > 0)
				efs_fs_reclaim(rc->fs, c->ents[i].ino);
		}
	} else if (oc == EFS_FS_TXN_CONFLICT) {
		/* The session is gone: its lease took the references. */
	} else if (efs_session_is_active(rc->fs->s)) {
		efs_log_warn("reclaim: dropping %zu open references failed (%s): again later",
			     c->nents, strerror(r->err ? -r->err : EIO));
		for (size_t i = 0; i < c->nents; i++)
			drop_add(rc, c->ents[i].ino, c->ents[i].rev);
		uv_timer_stop(rc->drop_timer);
		drop_arm(rc, OREF_DROP_RETRY_MS);
	}
	oref_call_free(c);
	if (rc->ndrops && !uv_is_active((uv_handle_t *)rc->drop_timer))
		drop_flush(rc);
}

/* One batch of the first queued drops: 0, or -errno with the queue kept. */
static int drop_send(struct rc *rc)
{
	struct efs_fs *fs = rc->fs;
	size_t n = rc->ndrops < OREF_DROP_BATCH ? rc->ndrops : OREF_DROP_BATCH;
	struct efs_etcd_txn *t = NULL;
	struct oref_call *c;
	int r;

	c = oref_call_new(rc);
	if (!c)
		return -ENOMEM;
	c->ents = efs_mem_calloc(n, sizeof(*c->ents));
	r = c->ents ? efs_etcd_txn_new(&t, 0) : -ENOMEM;
	if (r == 0)
		r = efs_session_guard(fs->s, t);
	for (size_t i = 0; r == 0 && i < n; i++) {
		const struct oref_drop_ent *e = &rc->drops[i];
		struct efs_etcd_txn *in = NULL;
		struct efs_meta_key k, ok;

		r = efs_meta_key_open(&fs->ns, e->ino, efs_session_node(fs->s), &k);
		if (r == 0)
			r = efs_meta_key_orphan(&fs->ns, e->ino, &ok);
		if (r == 0)
			r = efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &in);
		if (r == 0 && e->rev)
			r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf,
						 k.len, e->rev);
		if (r == 0)
			r = efs_etcd_txn_delete(in, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
						false);
		if (r == 0)
			r = efs_etcd_txn_range(in, EFS_ETCD_TXN_SUCCESS, ok.buf, ok.len, NULL, 0);
		if (r == 0 && e->rev)
			r = efs_etcd_txn_range(in, EFS_ETCD_TXN_FAILURE, ok.buf, ok.len, NULL, 0);
		if (r == 0)
			c->ents[c->nents++] = *e;
	}
	if (r == 0)
		r = efs_etcd_txn(fs->c, efs_etcd_txn_request(t), NULL, drop_cb, c);
	efs_etcd_txn_free(t);
	if (r < 0) {
		oref_call_free(c);
		return r;
	}
	rc->drop_batches++;
	memmove(rc->drops, rc->drops + n, (rc->ndrops - n) * sizeof(*rc->drops));
	rc->ndrops -= n;
	return 0;
}

static void drop_flush(struct rc *rc)
{
	uv_timer_stop(rc->drop_timer);
	if (!efs_session_is_active(rc->fs->s)) {
		rc->ndrops = 0; /* the session's end takes them with its lease */
		return;
	}
	while (rc->ndrops && rc->drop_batches < OREF_DROP_INFLIGHT) {
		int r = drop_send(rc);

		if (r < 0) {
			efs_log_warn("reclaim: cannot drop %zu open references (%s): again later",
				     rc->ndrops, strerror(-r));
			drop_arm(rc, OREF_DROP_RETRY_MS);
			return;
		}
	}
	/* The rest goes when a batch in flight ends (drop_cb). */
}

static void inode_freed(struct efs_fs *fs, struct efs_fs_inode *in)
{
	struct rc *rc = rc_of(fs);
	bool unsure = in->oref_unsure && in->oref_epoch == fs->epoch;

	if (!rc || (!efs_fs_oref_held(fs, in) && !unsure) || !efs_session_is_active(fs->s))
		return;
	drop_queue(rc, in->ino, unsure ? 0 : in->oref_rev);
	in->oref_epoch = 0;
	in->oref_unsure = false;
}

/* An inode deleted for good may have left a reclaim record to work on. */
static void inode_dropped(struct efs_fs *fs, uint64_t ino)
{
	efs_fs_reclaim_kick(fs);
}

static const struct efs_fs_inode_hooks reclaim_inode_hooks = {
	.dropped = inode_dropped,
	.freed = inode_freed,
};

int efs_fs_reclaim_init(struct efs_fs *fs)
{
	struct rc *rc = efs_mem_calloc(1, sizeof(*rc));

	if (!rc)
		return -ENOMEM;
	rc->fs = fs;
	rc->timer = efs_timer_new(fs->loop, rc);
	rc->grace_timer = efs_timer_new(fs->loop, rc);
	rc->drop_timer = efs_timer_new(fs->loop, rc);
	if (!rc->timer || !rc->grace_timer || !rc->drop_timer) {
		rc->timer = efs_timer_free(rc->timer);
		rc->grace_timer = efs_timer_free(rc->grace_timer);
		rc->drop_timer = efs_timer_free(rc->drop_timer);
		efs_mem_free(rc);
		return -ENOMEM;
	}
	fs->reclaim_priv = rc;
	efs_fs_ihooks_add(fs, &reclaim_inode_hooks);
	if (fs->lc)
		efs_lockcache_set_peer_gone_cb(fs->lc, peer_gone, fs);
	/* The first pass: its map transactions wait behind the allocator's
	 * start (which holds the map token until its groups are loaded). */
	uv_timer_start(rc->timer, timer_cb, 0, 0);
	return 0;
}

void efs_fs_reclaim_kick(struct efs_fs *fs)
{
	struct rc *rc = rc_of(fs);

	if (!rc)
		return;
	if (rc->busy) {
		rc->again = true;
		return;
	}
	if (!uv_is_active((uv_handle_t *)rc->timer))
		uv_timer_start(rc->timer, timer_cb, RC_KICK_MS, 0);
}

uint64_t efs_fs_reclaim_pending(const struct efs_fs *fs)
{
	const struct rc *rc = rc_of(fs);

	return rc ? rc->pending : 0;
}

void efs_fs_reclaim_abandon(struct efs_fs *fs)
{
	struct rc *rc = rc_of(fs);

	if (rc && rc->timer)
		uv_timer_stop(rc->timer);
	if (rc && rc->grace_timer)
		uv_timer_stop(rc->grace_timer);
	if (rc && rc->drop_timer)
		uv_timer_stop(rc->drop_timer);
	if (rc)
		rc->ow = efs_etcd_watcher_free(rc->ow);
	if (rc && fs->lc)
		efs_lockcache_set_peer_gone_cb(fs->lc, NULL, NULL);
}

void efs_fs_reclaim_done(struct efs_fs *fs)
{
	struct rc *rc = rc_of(fs);

	if (!rc)
		return;
	efs_fs_ihooks_del(fs, &reclaim_inode_hooks);
	if (fs->lc)
		efs_lockcache_set_peer_gone_cb(fs->lc, NULL, NULL);
	if (rc->at && !rc->at_granted) {
		/* Waiting for the map token: the allocator, freed right after
		 * this (efs_fs_free frees the reclaimer, the publisher, then the
		 * allocator, with no loop turn in between), frees the waiting
		 * contribution; its callback never runs, so its record goes now. */
		efs_mem_free(rc->call);
		rc->call = NULL;
	} else if (rc->at) {
		/* A batch in flight: give the token back now (the allocator is
		 * going away; whatever the batch did, etcd stays consistent). */
		efs_alloc_txn_end(rc->at, EFS_ALLOC_FAILED, 0);
	}
	rc->at = NULL;
	rc->at_granted = false;
	if (rc->call) {
		/* Its callback finds no reclaimer and only frees itself. */
		rc->call->rc = NULL;
		rc->call = NULL;
	}
	rc->timer = efs_timer_free(rc->timer);
	rc->grace_timer = efs_timer_free(rc->grace_timer);
	rc->drop_timer = efs_timer_free(rc->drop_timer);
	/* Takes and drops in flight: their callbacks only free them. Drops
	 * still queued are left to the lease, which the leave deletes. */
	oref_calls_detach(rc);
	efs_mem_free(rc->drops);
	rc->ow = efs_etcd_watcher_free(rc->ow);
	rc->ows = efs_etcd_watch_stream_free(rc->ows);
	pass_clear(rc);
	efs_mem_free(rc->bad);
	efs_mem_free(rc);
	fs->reclaim_priv = NULL;
}

/* ---- The reclaim of an unlinked inode at its last close ---- */

/* The reclaim operation: the r/<ino> read and what it found. */
struct rc_op {
	struct efs_fs_op op;
	int oref_kv;	/* 1-based: the inode's open references */
	bool mine;	/* ... this node's among them */
	size_t others;	/* ... and other nodes' */
	bool files_only; /* efs_fs_reclaim_file */
};

static int rc_plan(struct efs_fs_op *op)
{
	struct rc_op *ro = (struct rc_op *)op;
	const Etcfs__Inode *rec;
	struct efs_fs_inode *in;
	int r;

	if (op->loads_done == 0) {
		r = efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
		if (r < 0)
			return r;
		r = efs_fs_want_keys(op, EFS_META_K_OPEN, op->ino, 0);
		if (r < 0)
			return r;
		ro->oref_kv = r;
		return EFS_FS_CONT;
	}
	rec = efs_fs_rec(op, op->ino);
	in = efs_fs_ifind(op->fs, op->ino);
	if (!rec && op->fs->data_priv) {
		/* Gone: a retry after an unknown outcome found our delete
		 * applied (no apply_out runs then). */
		efs_fs_inode_dropped(op->fs, op->ino);
	}
	efs_fs_oref_count(op->fs, &op->kv[ro->oref_kv - 1], op->ino, &ro->mine, &ro->others);
	if (in && !ro->mine)
		in->oref_epoch = 0; /* a drop of ours applied, or none was put */
	if (!rec || rec->nlink != 0 || efs_fs_live_opens(op->fs, in) > 0)
		return EFS_FS_DONE;
	if (ro->files_only && S_ISDIR(rec->mode))
		return EFS_FS_DONE;
	if (ro->others && !ro->mine)
		return EFS_FS_DONE; /* theirs to finish */
	return EFS_FS_CONT;
}

/*
 * Another node still holds a reference: only ours goes, comparing that
 * theirs are still there (else the last reference would go without
 * anyone reclaiming: a conflict plans again and reclaims). Otherwise the
 * inode goes, with ours, comparing that no other node holds one.
 */
static int rc_build(struct efs_fs_op *op)
{
	struct rc_op *ro = (struct rc_op *)op;
	const struct efs_fs_kv *kv = &op->kv[ro->oref_kv - 1];
	struct efs_meta_key k;
	int r;

	op->check_ino = 0; /* nothing to re-read: a retry plans again */
	r = efs_fs_op_txn(op);
	if (r == 0 && ro->mine)
		r = efs_meta_key_open(&op->fs->ns, op->ino, efs_session_node(op->fs->s), &k);
	if (r == 0 && ro->mine)
		r = efs_etcd_txn_delete(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
					false);
	if (r < 0 || ro->others) {
		for (size_t i = 0; r == 0 && i < kv->nkvs; i++)
			r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL,
						 kv->kvs[i]->key.data, kv->kvs[i]->key.len,
						 kv->kvs[i]->mod_revision);
		return r;
	}
	r = efs_fs_oref_cmp_alone(op->fs, op->txn, op->ino);
	if (r == 0)
		r = efs_fs_del_inode(op, op->ino);
	if (r == 0)
		r = efs_fs_drop_inode_keys(op, op->ino, efs_fs_rec(op, op->ino));
	return r;
}

static void rc_done(struct efs_fs_op *op)
{
	struct efs_fs_inode *in = efs_fs_ifind(op->fs, op->ino);

	if (in)
		in->oref_epoch = 0;
}

static const struct efs_fs_opdesc reclaim_desc = {
	.code = EFS_FS_OP_RECLAIM,
	.size = sizeof(struct rc_op),
	.origin = EFS_FS_ORIG_RECLAIM,
	.mutates = true,
	.plan = rc_plan,
	.build = rc_build,
	.done = rc_done,
};

static void reclaim_start(struct efs_fs *fs, uint64_t ino, bool files_only)
{
	struct efs_fs_op *op = efs_fs_op_new(fs, NULL, &reclaim_desc);

	if (!op) {
		efs_log_warn("fs: no memory to reclaim inode %llu; fsck will",
			     (unsigned long long)ino);
		return;
	}
	op->ino = ino;
	((struct rc_op *)op)->files_only = files_only;
	efs_fs_op_run(op);
}

void efs_fs_reclaim(struct efs_fs *fs, uint64_t ino)
{
	reclaim_start(fs, ino, false);
}

void efs_fs_reclaim_file(struct efs_fs *fs, uint64_t ino)
{
	reclaim_start(fs, ino, true);
}

void efs_fs_reclaim_rescan(struct efs_fs *fs)
{
	struct rc *rc = rc_of(fs);

	if (!rc)
		return;
	rc->orphans_done = false;
	efs_fs_reclaim_kick(fs);
}
