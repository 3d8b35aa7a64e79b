/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The node's lock cache: per-inode shared and exclusive locks held as
 * holder keys l/<ino><mode><node> on the session lease, cached after the
 * operation that took them and reused with no etcd traffic until released
 * (idle, over the cache bound, forced by efs_lock_release_now, which a
 * peer's recall calls, or at a clean leave).
 *
 * The lock is the node's, not an operation's: every operation on this node
 * that needs inode I in mode M shares the node's hold. An operation pins
 * what it acquired (efs_lock_req) until efs_lock_put; a pinned lock is
 * never released.
 *
 * Acquire is one transaction: compares that no conflicting holder and no
 * recall key exist (shared: no exclusive holder; exclusive: no holder of
 * another node at all) plus the session guard; success puts the holder key
 * and reads the inode record i/<ino> (so that a lock and a fresh record
 * arrive together); failure puts a recall key and reads the holders, then
 * watches them until the lock can be taken (arrival order by recall seq).
 * Upgrade shared -> exclusive deletes our shared key and puts the exclusive
 * one in the same transaction (compares: no other holder at all). Several
 * inodes not yet held are first tried in one transaction (all or nothing);
 * if that fails they are acquired one by one in inode number order.
 *
 * Recall keys w/<ino><seq><node> carry as |seq| the highest etcd revision
 * this node has read; waiters are served in the order etcd created their
 * recall keys (an acquire compares that every recall key of the inode was
 * created no earlier than its own), which is arrival order. A waiter's
 * recall key is deleted when it gets the lock, is cancelled or times out.
 *
 * Kernel caching: the fs layer may hand the kernel nonzero entry/attr
 * timeouts only for inodes this node holds a lock on, and records each
 * grant with efs_lock_note_kernel_cache(); a lock is never released idle
 * before the last kernel cache it granted has timed out (so an idle
 * release needs no invalidation), and a release that cannot wait (a
 * forced release, which is what a recall calls, or a clean leave) runs
 * the invalidate hook of the lock's ops first.
 *
 * Grants: every continuous hold of a lock has a grant id, nonzero and
 * never reused by this lock cache. A cache filled under a lock (the inode
 * record, names, the extent map, the kernel page cache decision) stores
 * the grant it was filled under and is valid only while efs_lock_grant()
 * returns that same id. An in-place upgrade from shared to exclusive keeps
 * the grant (the hold never lapsed); a release, a downgrade, a session
 * loss and an upgrade that had to give the shared hold up end it.
 *
 * Ops: the user registers callbacks per kind of lock (the GFS2 glock
 * operations, OCFS2's lock resource ops): before a lock goes (or goes down
 * to shared) the lock cache waits until no operation pins it, then calls
 * |invalidate| (drop every cache the lock allowed) and |sync| (publish
 * what the lock covers), and releases it only if nothing pinned it
 * meanwhile (else it prepares again). A pin means only "an operation is in
 * flight under this lock"; state such as an open handle or dirty data is
 * published by |sync|, never held as a pin.
 *
 * Forced releases (efs_lock_release_now) drain the lock: from the moment
 * one is asked for until the lock is released or downgraded, only
 * requests marked |writeback| are served from the cache; every other
 * acquisition of the inode waits for the release and then takes the lock
 * anew. So a steady stream of operations cannot starve a recall, and what
 * the release prepares (the kernel's dirty pages written back while
 * |invalidate| runs, the publication |sync| starts: EFS_LOCK_F_WRITEBACK)
 * can still take the lock, as can requests the kernel waits for with pages
 * locked (EFS_LOCK_F_PAGES: the invalidation waits for those pages) and
 * requests of operations that pin other locks already (EFS_LOCK_F_NESTED,
 * or an acquisition of several inodes part of which it holds). The drain
 * bounds what else can void a preparation, except for kinds whose ops are
 * |serve_while_invalidating|: every request is served while their
 * |invalidate| runs. Page-cache I/O can still delay a release for as long
 * as it comes without a gap. A preparation that fails ends the drain until
 * the next attempt.
 *
 * Acquiring several locks: an acquisition takes its inodes in inode
 * number order and pins each as it gets it. If a lock it pinned is
 * recalled while it still waits for a later one, it gives every pin and
 * its recall key up, waits until that release is done and starts again
 * (-EAGAIN to the caller with EFS_LOCK_F_RESTART): the node that recalled
 * may hold the lock it waits for, and a waiting operation never delays a
 * recall. Ordered pins alone would not do: a peer's cached, unpinned lock
 * answers a recall only once the kernel lets its invalidation through,
 * and the kernel may hold a directory's lock across the very request that
 * waits for us.
 *
 * Upgrades never deadlock two nodes: an upgrade that finds another holder
 * stops granting new local cache hits on the inode, waits for its pins to
 * go and for the kernel caches granted under the shared hold to expire,
 * then gives its shared hold up in the same transaction that queues its
 * recall key, so the older recall key wins and the other waits behind it.
 *
 * Callback rule (libuv's): a function taking a callback returns an error
 * now (callback never runs), 1 when done now (callback never runs), or 0
 * and the callback runs exactly once later, never inline.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/txn.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "rpc.pb-c.h"

struct efs_lockcache;

enum efs_lock_mode {
	EFS_LOCK_NONE = 0,
	EFS_LOCK_SHARED = 1,
	EFS_LOCK_EXCLUSIVE = 2,
};

/* Most inodes one request locks at once: a rename over an existing target
 * needs four (two parents, the moved inode, the replaced inode);
 * readdirplus takes shared locks on up to this many entries in one
 * transaction (2 compares and 2 operations each, inside etcd's 128). */
#define EFS_LOCK_REQ_MAX 32

/* The request writes back what the lock covers (a publication, the
 * kernel's writeback of dirty pages): served from the cache also while a
 * forced release drains the lock (see Forced releases above). */
#define EFS_LOCK_F_WRITEBACK 0x1u
/* The caller pins other locks for the same operation already, or holds
 * something an operation under a pin may wait for (the filesystem's
 * node-local mutexes): a drain never makes it wait, so that no operation
 * waits for a drain that waits for it. */
#define EFS_LOCK_F_NESTED 0x2u
/* The kernel holds page locks while it waits for the request (a read or
 * write through the page cache): served while draining, because the
 * release's |invalidate| waits for those pages, so holding the request
 * back would wait for itself. */
#define EFS_LOCK_F_PAGES 0x4u
/* When a lock the acquisition pinned already is recalled while it still
 * waits for another (see Acquiring several locks above), end it with
 * -EAGAIN and name that lock in |yield_ino| / |yield_to|, instead of
 * starting again inside: for a caller that holds something the release
 * may need (a node-local mutex the release's publication takes). It drops
 * that, waits for the release (efs_lock_release_now with |yield_to|), and
 * acquires again. */
#define EFS_LOCK_F_RESTART 0x8u
/* Only locks free to take now: one transaction that takes them all when no
 * other node holds any of them in a conflicting mode and none is waited
 * for; otherwise -EWOULDBLOCK, with no recall sent and no wait (also when
 * the session is not active, or another acquisition or release of this
 * node is on one of them). For speculative locks (taken ahead of the
 * lookups that will want them), which must never take a lock from a peer. */
#define EFS_LOCK_F_TRY 0x10u

struct efs_lock_req;
/*
 * Acquisition finished: 0 (every inode held, pinned), or -EIO (session
 * lost or not active past the wait bound), -EINTR (cancelled), -EAGAIN
 * (EFS_LOCK_F_RESTART: it gave way to a recall), -EWOULDBLOCK (the
 * same value as -EAGAIN; EFS_LOCK_F_TRY: not free now), another negative
 * errno.
 * On error nothing stays pinned. For each inode whose lock
 * was newly taken, |recs[i]| holds the i/<ino> record read in the same
 * transaction (a KeyValue owned by the request until efs_lock_put; NULL
 * when the inode does not exist, or when the lock was already cached).
 * On success |grant[i]| is the grant id the lock of |ino[i]| is held
 * under (see Grants above).
 */
typedef void (*efs_lock_cb)(struct efs_lock_req *req, int status);

struct efs_lock_req {
	/* filled by the caller before efs_lock_acquire */
	size_t n;
	uint64_t ino[EFS_LOCK_REQ_MAX];
	enum efs_lock_mode mode[EFS_LOCK_REQ_MAX];
	efs_lock_cb cb;
	void *arg;
	unsigned flags; /* EFS_LOCK_F_* */
	/* results */
	const Mvccpb__KeyValue *recs[EFS_LOCK_REQ_MAX];
	uint64_t grant[EFS_LOCK_REQ_MAX];
	uint64_t yield_ino;	       /* -EAGAIN (EFS_LOCK_F_RESTART): the recalled lock */
	enum efs_lock_mode yield_to; /* ... and the mode its release goes to */
	/* private */
	void *priv;
};

struct efs_lockcache_opts {
	const struct efs_meta_ns *ns;
	size_t max_cached;	  /* locks kept (0: 65536, so that a walk of a large tree
				   * stays cached; idle ones go after |idle_ms|) */
	uint32_t idle_ms;	  /* release a lock unused this long (0: 30000: peers take
				   * it by recall meanwhile; a walk of a large tree
				   * stays cached between passes) */
	size_t release_batch;	  /* holder keys deleted per transaction (0: 64) */
	uint32_t wait_timeout_ms; /* give up a conflicting acquire with -ETIMEDOUT
				   * (0: never) */
	uint32_t recall_bound_ms; /* a peer's recall this node has not answered
				   * after this long is logged and counted
				   * (0: 30000) */
	uint32_t takeover_grace_ms; /* copy-on-write only, after a peer's session
				     * ended holding an inode exclusively
				     * (lock/deaths.h; 0: 60000) */
	uint32_t max_hold_ms;	    /* the adaptive minimum hold of a lock a peer
				     * recalls never grows past this (lock/heat.h; 0:
				     * EFS_LOCK_HOLD_DEFAULT_MS, EFS_LOCK_HOLD_OFF: no
				     * hold, recalls are answered at once) */
	uint32_t contended_recalls; /* recalls of one lock within 1 s that make it
				     * contended: no hold, nothing cached by the
				     * kernel, for 2 s after its last recall (0:
				     * EFS_LOCK_CONTENDED_DEFAULT, EFS_LOCK_HOLD_OFF:
				     * never) */
};

/* efs_lockcache_opts.max_hold_ms and .contended_recalls: off. */
#define EFS_LOCK_HOLD_OFF	   UINT32_MAX
#define EFS_LOCK_HOLD_DEFAULT_MS   20
#define EFS_LOCK_CONTENDED_DEFAULT 16

/* Kinds of lock, each with its own ops; a lock is of kind 0 until
 * efs_lock_set_kind says otherwise. */
#define EFS_LOCK_KINDS 4

/* Completion of an ops callback: 0, or a negative errno (the lock is then
 * kept and the release tried again later). May be called inline. */
typedef void (*efs_lock_done_cb)(void *darg, int status);

/*
 * What the lock cache asks of its user before a lock of this kind is
 * released (|to| NONE) or downgraded from exclusive (|to| SHARED). Both
 * run on the loop, only while no operation pins the lock, and each calls
 * |done| exactly once. Operations may still take the lock (cache hits)
 * while they run; the release then waits for their pins and asks again.
 * Either may be NULL (nothing to do).
 */
struct efs_lock_ops {
	/* Drop every cache filled under the lock that |to| no longer
	 * allows: the kernel's pages, attributes and entries of |ino| and
	 * the node's own caches. */
	void (*invalidate)(void *arg, uint64_t ino, enum efs_lock_mode to, efs_lock_done_cb done,
			   void *darg);
	/* Publish what the lock covers (buffered extents, size, times,
	 * deferred attributes) so that the next holder sees it. */
	void (*sync)(void *arg, uint64_t ino, enum efs_lock_mode to, efs_lock_done_cb done,
		     void *darg);
	/* Whether the kernel may cache under the lock of |ino| beyond the
	 * timeouts noted with efs_lock_note_kernel_cache (the page cache
	 * of an open file): then |invalidate| runs before every release,
	 * idle ones included. NULL: never. */
	bool (*cached)(void *arg, uint64_t ino);
	/* The kernel may hold a lock of its own while it waits for any
	 * request on the inode, and |invalidate| waits for that lock (the
	 * kernel takes a directory's lock to drop one of its entries): while
	 * |invalidate| runs every request is served, and requests served
	 * during the preparation do not void it. Replies under a lock being
	 * prepared carry no kernel caching (efs_lock_may_cache), so this is
	 * only for kinds whose |sync| has nothing an operation leaves
	 * behind to publish (every change commits in its own transaction). */
	bool serve_while_invalidating;
	/* Whether a shared hold of |ino| must not be kept: a recall for
	 * shared access then releases the lock wholly instead of downgrading
	 * it. NULL: a downgrade is always allowed. */
	bool (*no_shared)(void *arg, uint64_t ino);
};

/* Says which kind (< EFS_LOCK_KINDS) the lock of |ino| is, asked when its
 * release is prepared (the lock cache never learns what an inode is). */
typedef unsigned (*efs_lock_kind_fn)(void *arg, uint64_t ino);

int efs_lockcache_new(struct efs_lockcache **ret, uv_loop_t *loop, struct efs_etcd *c,
		      struct efs_session *s, const struct efs_lockcache_opts *o);

/*
 * Releases every lock (batched deletes) for a clean leave; |done| runs
 * once with 0 or the first error. Locks pinned by operations are released
 * once unpinned.
 */
int efs_lockcache_release_all(struct efs_lockcache *lc, void (*done)(int status, void *arg),
			      void *arg);
/*
 * The session was lost (GONE): every holder key vanished with the lease.
 * Forget every lock at once (no etcd traffic); pinned operations keep
 * their pins but efs_lock_guard() on them fails from now on.
 */
void efs_lockcache_forget_all(struct efs_lockcache *lc);
/* Registers |ops| (borrowed, must outlive |lc|) for locks of |kind|;
 * NULL removes them. -EINVAL for a kind out of range. */
int efs_lockcache_set_ops(struct efs_lockcache *lc, unsigned kind, const struct efs_lock_ops *ops,
			  void *arg);
/* Registers the kind classifier (NULL: every lock is of the kind set by
 * efs_lock_set_kind, else 0); a kind set with efs_lock_set_kind wins. */
void efs_lockcache_set_kind_fn(struct efs_lockcache *lc, efs_lock_kind_fn fn, void *arg);
/*
 * A peer's recall of |ino| arrived while the lock is pinned: whatever pins
 * it without waiting for anything (a batch of delegated changes, fs/batch.c)
 * should let go soon. Called on the loop; it must not release locks. NULL:
 * nothing to tell.
 */
typedef void (*efs_lock_wanted_fn)(void *arg, uint64_t ino);
void efs_lockcache_set_wanted_fn(struct efs_lockcache *lc, efs_lock_wanted_fn fn, void *arg);
/* Frees |lc|: callers drain their operations first; acquisitions still
 * pending are dropped without a callback. Holder keys stay in etcd (they
 * go with the session lease). Free the lock cache before its session.
 * Accepts NULL; returns NULL. */
struct efs_lockcache *efs_lockcache_free(struct efs_lockcache *lc);

/* Acquire the locks of |req| (see the callback rule above). */
int efs_lock_acquire(struct efs_lockcache *lc, struct efs_lock_req *req);
/*
 * Pins the locks of |req| for a caller that pins each of them already,
 * through |held| (acquired, not yet put), in at least the mode |req| asks:
 * a second pin that outlives the first (an operation handing its inode
 * over to the request it served). It is always served at once, also while
 * an upgrade or a forced release drains the lock: the pin of |held| keeps
 * the lock from going meanwhile, so the drain waits for it anyway. 1 (the
 * callback is never called; efs_lock_put |req| later), -EIO when the
 * session was lost since, -EINVAL when |held| does not cover |req|.
 */
int efs_lock_acquire_under(struct efs_lockcache *lc, const struct efs_lock_req *held,
			   struct efs_lock_req *req);
/* Cancels a waiting acquisition: its callback runs with -EINTR (later). */
void efs_lock_cancel(struct efs_lockcache *lc, struct efs_lock_req *req);
/*
 * Ends at once, without its callback, an acquisition efs_lock_acquire has
 * just queued (it returned 0) before the loop ran again: nothing was sent
 * or pinned yet, so |req| may be freed right after. -EBUSY when it has
 * moved on (then cancel it and wait for its callback).
 */
int efs_lock_withdraw(struct efs_lockcache *lc, struct efs_lock_req *req);
/* Unpins what |req| acquired; the locks stay cached. */
void efs_lock_put(struct efs_lockcache *lc, struct efs_lock_req *req);
/*
 * A cache hit for a change made at once on the loop, with no request to
 * pin (a deferred setattr): true when |ino| is held in |mode| or above and
 * a plain request would be served from the cache now; it then counts as a
 * pin taken and dropped, so that a release being prepared meanwhile
 * prepares again. False otherwise: take the lock with a request.
 */
bool efs_lock_touch(struct efs_lockcache *lc, uint64_t ino, enum efs_lock_mode mode);
/*
 * A change only an exclusive holder may make (one the lock's |sync|
 * publishes) was just made under a pin of a lower mode, such as a read's
 * atime while the lock is held exclusive: it counts as an exclusive use,
 * so that a downgrade being prepared or prepared meanwhile (which only
 * exclusive uses void) prepares again and publishes it.
 */
void efs_lock_note_change(struct efs_lockcache *lc, uint64_t ino);

/* The mode this node holds on |ino| now (NONE when none or being
 * released/recalled, or while the session is not ACTIVE: then the kernel
 * must get zero timeouts). */
enum efs_lock_mode efs_lock_held(const struct efs_lockcache *lc, uint64_t ino);
/* Whether the kernel may be handed nonzero timeouts under the lock of
 * |ino| now: it is held, no forced release of it is asked for, no peer's
 * recall of it waits for its minimum hold to end, it is not contended
 * (recalled again and again: lock/heat.h), and no release whose
 * preparation pins do not void (serve_while_invalidating) is being
 * prepared or prepared. */
bool efs_lock_may_cache(const struct efs_lockcache *lc, uint64_t ino);
/*
 * Whether a change under the exclusive hold of |ino| may be decided now
 * and committed later (delegation: the change's transaction waits in a
 * batch, the lock pinned until it commits): held exclusively, no peer's
 * recall waiting on it, no release of it asked for or being prepared.
 * Unlike efs_lock_may_cache, a lock recently contended qualifies: a
 * recall arriving meanwhile waits only for the batch.
 */
bool efs_lock_may_defer(const struct efs_lockcache *lc, uint64_t ino);

/*
 * Whether a write of |ino| under the lock held now may go in place (into
 * preallocated blocks): not while a peer whose session ended holding
 * |ino| exclusively may still land a queued device write (its grace
 * period), nor when |ino| is not held exclusively. 1: in place; 0:
 * copy-on-write; -EINPROGRESS: the peers' session ends up to the grant
 * are still being read (lock/deaths.h) and |cb| runs once, later, with
 * the answer; -ENOMEM.
 */
typedef void (*efs_lock_inplace_cb)(void *arg, bool inplace);
int efs_lock_inplace_check(struct efs_lockcache *lc, uint64_t ino, efs_lock_inplace_cb cb,
			   void *arg);

/*
 * Until when blocks freed by a transaction committed at |rev| must stay
 * unallocated because a peer whose session ended may still land an
 * in-place write in them: lock/deaths.h efs_deaths_free_hold.
 */
uint64_t efs_lock_free_hold(struct efs_lockcache *lc, int64_t rev,
			    const Etcdserverpb__RangeResponse *nodes,
			    const Etcdserverpb__RangeResponse *gens);

/* The grant id under which this node holds |ino| now; 0 when
 * efs_lock_held() is NONE. */
uint64_t efs_lock_grant(const struct efs_lockcache *lc, uint64_t ino);

/* Sets the kind (< EFS_LOCK_KINDS) of |ino|'s lock, whose ops it uses from
 * now on; a no-op when this node has no entry for |ino|. */
void efs_lock_set_kind(struct efs_lockcache *lc, uint64_t ino, unsigned kind);

typedef void (*efs_lock_release_cb)(void *arg, int status);
/*
 * Gives the lock of |ino| up now (|to| NONE) or downgrades an exclusive
 * hold to shared (|to| SHARED): the entry point a recall calls, and what
 * tests call to force a release between operations. It waits for the
 * lock's pins to go, runs the ops (invalidate, then sync), and deletes
 * (or replaces) the holder key; |done| runs once, never inline, with 0
 * once the lock is no longer held in a mode above |to|, or -EIO when the
 * session was lost first. Returns 1 (done never runs) when nothing is to
 * do (not held, or not above |to|), 0, or -EINVAL/-ENOMEM.
 */
int efs_lock_release_now(struct efs_lockcache *lc, uint64_t ino, enum efs_lock_mode to,
			 efs_lock_release_cb done, void *arg);

/*
 * From within the |sync| op of |ino|'s release (or downgrade) being
 * prepared: adds to |t| what the release does (delete the holder key; a
 * downgrade also puts the shared one), so that the transaction that
 * publishes what the lock covers also gives the lock up, one commit
 * instead of two. Only while nothing but the caller's one pin has taken
 * the lock since the preparation began (its invalidation stands, nothing
 * else was buffered or cached) and the transaction has room; from then
 * on no acquisition is served from the entry until the outcome is told.
 * Returns 1 (added: tell the outcome with efs_lock_release_in_txn_outcome,
 * exactly once), 0 (not now: the release follows in its own transaction
 * as before), or a negative errno. Called again for a rebuild of the same
 * transaction it adds the same operations again.
 */
int efs_lock_release_in_txn(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino);

enum efs_lock_txn_outcome {
	EFS_LOCK_TXN_COMMITTED, /* the lock went down with it */
	EFS_LOCK_TXN_FAILED,	/* not applied: still held, usable again */
	/* Not known (or the transaction was never answered): the lock cache
	 * settles the holder keys itself, so the lock ends up released (or
	 * downgraded) either way; a caller that retries takes it anew. */
	EFS_LOCK_TXN_UNKNOWN,
};
/* What became of a transaction efs_lock_release_in_txn added to (|rev|:
 * its revision when COMMITTED). */
void efs_lock_release_in_txn_outcome(struct efs_lockcache *lc, uint64_t ino,
				     enum efs_lock_txn_outcome oc, int64_t rev);

/* At most this many idle releases ride one transaction. */
#define EFS_LOCK_RIDE_MAX 8

/*
 * Early cancel: adds to |t|, a transaction this node sends anyway and
 * that carries the session guard, the holder-key deletes of up to |max|
 * (at most EFS_LOCK_RIDE_MAX) idle locks due for release now or nearly
 * (within the next tick, or unused for three quarters of the idle time):
 * held, unpinned, with no local acquisition or forced
 * release waiting for them, no kernel cache still valid under them, and
 * whose ops either need not run or ran since the lock was last used
 * (nothing is released before its caches and dirty data were dealt
 * with). Their inode numbers go to |ret_ino|, and no acquisition is
 * served from them until the outcome is told, exactly once, with
 * efs_lock_ride_outcome. Add them last: they stop at the transaction's
 * operation limit. Returns how many rode (0: none), or -EINVAL.
 */
int efs_lock_ride_idle(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t *ret_ino,
		       size_t max);
/* What became of the transaction the releases of the |n| inodes |ino|
 * rode (efs_lock_ride_idle), as for efs_lock_release_in_txn_outcome:
 * committed, they are released; failed, they are held again and go the
 * usual way; unknown, the lock cache settles their holder keys. */
void efs_lock_ride_outcome(struct efs_lockcache *lc, const uint64_t *ino, size_t n,
			   enum efs_lock_txn_outcome oc, int64_t rev);

/*
 * Adds to |t| a compare that this node's holder key for |ino| in |mode|
 * still exists on the session lease (1 compare: the key's lease equals the
 * session's; an exclusive hold satisfies a shared |mode| and the compare
 * is then on the exclusive key). -ENOLCK when this node does not hold it
 * (or the session is not ACTIVE), -E2BIG when |t| is full.
 */
int efs_lock_guard(const struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino,
		   enum efs_lock_mode mode);

/*
 * A new inode: puts an exclusive holder key for |ino| into |t|'s success
 * branch (the creating transaction, which carries the session guard; 1
 * op) so that the creator holds it from birth at no extra commit. After
 * the transaction commits, call efs_lock_grant_committed(..., true); when
 * it did not, (..., false); after an unknown outcome, settle it first (the
 * re-read of section 4's operation ids) and pass what it found, since a
 * holder key forgotten here would block other nodes until the session
 * ends. The lock is not usable
 * (efs_lock_held: NONE) until then, and it is not pinned afterwards.
 * -EEXIST when this node has an entry for |ino| already, -EIO when the
 * session is not ACTIVE.
 */
int efs_lock_grant_in_txn(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino);
void efs_lock_grant_committed(struct efs_lockcache *lc, uint64_t ino, bool committed);

/*
 * Pins the exclusive hold of |ino| without a request, for changes under it
 * that no transaction carries yet (a new inode whose creating transaction
 * waits in a batch): while pinned, the lock is never released, idle or
 * not. Returns the pin for efs_lock_unpin_held, or NULL when |ino| is not
 * held exclusively now.
 */
void *efs_lock_pin_held(struct efs_lockcache *lc, uint64_t ino);
/* Drops a pin of efs_lock_pin_held (accepts NULL). */
void efs_lock_unpin_held(struct efs_lockcache *lc, void *pin);

/*
 * An inode was deleted (last link gone, record removed) by a transaction
 * that also deleted its holder keys: forget its lock without etcd traffic.
 * Add the deletes with efs_lock_drop_in_txn (1 op: the l/<ino> range).
 */
int efs_lock_drop_in_txn(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino);
void efs_lock_forget(struct efs_lockcache *lc, uint64_t ino);

/* The kernel may cache entries/attributes of |ino| until |until_ns| (mono);
 * the lock is not released idle before that. */
void efs_lock_note_kernel_cache(struct efs_lockcache *lc, uint64_t ino, uint64_t until_ns);
/* The latest deadline noted with efs_lock_note_kernel_cache for the lock of
 * |ino| while this node has its entry (0: none, or no entry). */
uint64_t efs_lock_kernel_cache_until(const struct efs_lockcache *lc, uint64_t ino);

struct efs_lockcache_stats {
	uint64_t held;		/* locks cached now (entries being acquired included) */
	uint64_t acquires;	/* acquisitions that needed etcd */
	uint64_t hits;		/* acquisitions served from the cache */
	uint64_t waits;		/* acquisitions that had to wait for a holder */
	uint64_t releases;	/* locks released */
	uint64_t release_txns;	/* transactions that released them */
	uint64_t releases_in_txn; /* releases that rode their publication's transaction */
	uint64_t txn_retries;	/* acquire transactions retried */
	uint64_t forced;	/* forced releases and downgrades completed */
	uint64_t preps;		/* ops preparations run (invalidate + sync) */
	uint64_t upgrade_yields; /* upgrades that gave their shared hold up */
	uint64_t recalls;	/* recall keys of other nodes answered (forced releases asked) */
	uint64_t acq_yields;	/* acquisitions that gave their pins up to a recall */
	uint64_t recalls_unanswered; /* recalls still not answered after the wait bound
				      * (or 30 s): each logged once */
	uint64_t peer_deaths;	     /* other nodes' sessions seen ending (lock/deaths.h) */
	uint64_t takeover_marked;    /* inodes they held exclusively, marked copy-on-write */
	uint64_t takeover_cow;	     /* writes sent copy-on-write instead of in place */
	uint64_t recalls_deferred;   /* recalls answered only once the minimum hold ended */
	uint64_t contended;	     /* locks contended now (a gauge) */
	uint64_t releases_early;     /* idle releases that rode another transaction */
	uint64_t direct_grants;	     /* waiters granted a lock by its releasing txn */
	uint64_t grants_returned;    /* locks granted after their wait ended, given back */
	uint64_t stray_recalls;      /* recall keys of ours no acquisition owned, deleted */
};
void efs_lockcache_get_stats(const struct efs_lockcache *lc, struct efs_lockcache_stats *ret);

/*
 * Called on the loop each time an acquisition that waited behind a peer's
 * holder key is granted: |ns| from the moment its recall key was known to
 * exist (the reply of the transaction that created it) to the grant, the
 * recall latency a waiter sees. |cb| NULL: none.
 */
typedef void (*efs_lock_recall_wait_cb)(void *arg, uint64_t ns);
void efs_lockcache_set_recall_wait_cb(struct efs_lockcache *lc, efs_lock_recall_wait_cb cb,
				      void *arg);
/*
 * Called on the loop when a forced release or downgrade (a recall of
 * another node, efs_lock_release_now) completes, with the time from its
 * request to its release transaction's reply: how long this node held a
 * lock others asked for (the handover). |cb| NULL: none.
 */
void efs_lockcache_set_handover_cb(struct efs_lockcache *lc, efs_lock_recall_wait_cb cb,
				   void *arg);

/*
 * Called on the loop when another node's session has ended (its node key
 * went with its lease) and the locks it held were read: survivors adopt
 * what it left (orphans, reclaim records). |cb| NULL: none.
 */
typedef void (*efs_lock_peer_gone_cb)(void *arg, const char *node);
void efs_lockcache_set_peer_gone_cb(struct efs_lockcache *lc, efs_lock_peer_gone_cb cb,
				    void *arg);

/* Fault hook (EFS_FAULT_HOOKS; negative controls in tests): while |off|,
 * recall keys of other nodes are noted but never answered. */
void efs_lockcache_fault_no_recall(struct efs_lockcache *lc, bool off);
/* Fault hook (EFS_FAULT_HOOKS; negative controls in tests): while |off|,
 * releases never grant the lock to a waiter (two commits per handover). */
void efs_lockcache_fault_no_grant(struct efs_lockcache *lc, bool off);
