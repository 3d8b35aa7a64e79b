/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The data path of regular files (fs/data.h): per-inode data states, the
 * file handlers, the publisher and the glue to the allocator, the extent
 * maps and the device pool.
 *
 * Shape (details next to each part):
 *  - struct efs_fs_data (in->data) is created by the first open, create or
 *    request that needs the inode's data. It holds the extent map loaded
 *    from e/<ino> under the inode's lock (valid while the lock grant
 *    and the fs epoch are those of the load), the runs allocated, written
 *    and mapped but not yet published (|apend|, sorted and merged), the
 *    published runs buried by later writes or punches and not yet freed in
 *    etcd (|fpend|), the record fields changed and not yet published
 *    (|pf| and the p_* values; in->rec is always the merged record), a
 *    version |ver| bumped by every change and the version last published
 *    completely (|ver_pub|: the state is dirty while they differ).
 *  - Every request first makes sure that the node holds the inode's lock
 *    in the mode it needs and that the state is valid ("prepare"): when
 *    the lock is cached, the record trusted and the map valid, it pins the
 *    lock with a cache hit and goes on at once (the fast path); otherwise
 *    an engine operation acquires the lock and loads the record, its build
 *    loads the map when needed, and then hands the request over to the
 *    same continuation.
 *  - Writes go copy-on-write to fresh blocks (in place only into
 *    preallocated extents), under a block-range lock of the state that
 *    serialises overlapping writes, truncates and punches (and with them
 *    partial-block read-merge-write); the map is updated on completion.
 *  - Publication is an engine operation (EFS_FS_OP_PUBLISH), one at a time:
 *    it takes the allocator's map token, fdatasyncs the device, snapshots
 *    the dirty chunks, allocations and frees of up to EFS_LOCK_REQ_MAX
 *    dirty inodes (within etcd's 128 operations) and commits them with
 *    the merged records. Truncates publish their inode in their own
 *    operation with the same code. A publication starts when a full
 *    batch is dirty (KICK_*; counted again when the running one ends, so
 *    batches stay full), on the interval sweep, or when something waits
 *    (fsync, O_SYNC, a buffer limit: those inodes are "urgent"). Writes
 *    wait only at node-wide bounds (dirty chunks, dirty inodes) or when
 *    one inode holds too many buried blocks (WAIT_FPEND_BLOCKS).
 *  - ENOSPC on a write step: the inode's pending frees are published and
 *    the step retried, then retried in halves (a large overwrite needs
 *    its new blocks before the old ones are freed; the reserve may be
 *    smaller than one request); pieces already written give a short
 *    write.
 *  - Known limits: an inode whose changes exceed one transaction is
 *    published in parts whose frees wait for the part that completes its
 *    chunk changes; if it is dropped (unlinked and closed) in between,
 *    those buried blocks stay allocated (fsck reports them). A state whose
 *    publication outcome stays unknown is discarded and that
 *    publication's allocations and frees leave its pending runs: they may
 *    be extents in etcd, or freed, so nothing gives them back to the
 *    allocator nor frees them again (leaked in memory until restart; free
 *    in etcd unless published).
 *
 * Everything runs on the loop thread.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc/alloc.h"
#include "dev/iopool.h"
#include "fs/data.h"
#include "fs/file/rangelock.h"
#include "space/extmap.h"
#include "space/runs.h"
#include "util/list.h"

/* ---- Limits ---- */

/* Operations and compares one publication puts in a transaction (etcd's
 * cap is 128; the rest is margin for estimates). */
#define PUB_BUDGET 120
/* Dirty chunks of one inode that start a publication now (about what one
 * transaction holds with the allocator's contribution). Writes do not wait
 * on one inode's count: an inode with more is published in parts, several
 * transactions back to back (see snap_build). */
#define KICK_CHUNKS 96
/* Dirty chunks of the node (counted on the dirty list) that start a
 * publication now, and beyond which writes wait: the memory bound of the
 * pending extent state. */
#define KICK_NODE_CHUNKS 110
#define WAIT_NODE_CHUNKS 65536
/* Buried blocks of one inode beyond which its writes wait for a complete
 * publication: an inode published in parts frees its buried blocks only
 * with the part that completes it (a crash or a drop in between leaks
 * them), and they are space the filesystem does not have meanwhile. */
#define WAIT_FPEND_BLOCKS 16384
/* Dirty inodes of the node that start a publication now, and beyond which
 * writes wait. */
#define KICK_INODES 4096
#define WAIT_INODES 8192
/* Largest step of copy_file_range. */
#define CFR_STEP (1u << 20)

/* Pending record fields. */
#define PF_SIZE	  0x01u
#define PF_BLOCKS 0x02u
#define PF_MTIME  0x04u
#define PF_CTIME  0x08u
#define PF_ATIME  0x10u
#define PF_MODE	  0x20u
#define PF_UID	  0x40u
#define PF_GID	  0x80u

struct dsnap;
struct dreq;

/* A waiter for the publication of version |ver| (on the state's fw). */
struct fwait {
	struct efs_list link;
	uint64_t ver;
	void (*cb)(void *arg, int err);
	void *arg;
};

/* An engine operation waiting for the map load. */
struct lwait {
	struct efs_list link; /* on the state's lw */
	struct efs_fs_op *op;
};

struct efs_fs_data {
	struct efs_fs *fs;
	struct efs_fs_inode *in; /* ref held */
	uint64_t ino;
	uint64_t sid; /* state id: handles of a discarded state fail */
	struct efs_extmap *map;
	uint64_t map_gen, map_epoch;
	bool loading;
	struct efs_list lw; /* struct lwait, newest first */
	struct efs_runs apend; /* allocated, written, mapped, unpublished */
	struct efs_runs fpend; /* published (or in flight), buried, not freed */
	unsigned pf;
	uint64_t p_size, p_blocks;
	int64_t p_atime, p_mtime, p_ctime;
	uint32_t p_mode, p_uid, p_gid;
	uint64_t ver, ver_pub;
	bool listed; /* on the dirty list */
	size_t nd_acct; /* dirty chunks counted in struct dctl's nchunks */
	bool urgent; /* wanted by an fsync, a buffer limit */
	struct efs_fs_data *dnext, *dprev;
	int err;     /* latched publication error */
	/* The last block of the last write that ended inside it, as the
	 * device has it (handlers.c, tail_copy): valid while the state's
	 * version and map are those it was kept under. */
	uint8_t *tail; /* aligned, one block; freed with the last writer */
	bool tail_ok;
	uint64_t tail_blk, tail_ver, tail_gen, tail_epoch;
	bool broken; /* discarded: requests fail, reloaded on next use */
	bool dropped;
	uint32_t writers; /* handles open for writing (no lock pin: lockops.c) */
	uint32_t nref; /* requests, writes and snapshots in flight */
	struct efs_rangelock ranges;
	struct efs_list fw; /* struct fwait, newest first */
	struct dsnap *snap; /* in-flight publication of this inode */
	uint64_t cache_gen, cache_epoch; /* page cache valid under this hold */
	bool cache_ok;
	uint64_t last_dblk; /* allocation goal */
	/* In-place overwrites in flight (struct wb), device reads in flight
	 * (struct rb) and reads waiting for an in-place overwrite they
	 * overlap (struct rdefer): a read never sees a block half rewritten
	 * in place, as it never saw one under copy-on-write. */
	struct efs_list ipw, rds, rdefer;
};

/* The publisher (fs->data_priv). */
struct dctl {
	struct efs_fs *fs;
	uv_timer_t *sweep;
	uv_timer_t *kick;
	struct efs_fs_data *dhead; /* dirty states */
	size_t ndirty;
	size_t nchunks; /* dirty chunks of the listed states (as last counted) */
	struct efs_fs_op *running;
	bool again;
	bool stalled; /* the last publication found nothing it could publish */
	uint64_t sid_seq;
	/* Device writes completed (sync ordering): counted on the I/O worker
	 * as each write returns, before anything answers it, so that an
	 * fdatasync after a write the worker answered finds it counted. */
	_Atomic uint64_t writes_done;
	/* |writes_done| when the last fdatasync that finished was issued:
	 * every write completed up to then is durable. */
	uint64_t synced_mark;
	/* The device flush (efs_file_dev_sync): its waiters (struct dswait,
	 * oldest first), the flush in flight and the |writes_done| it covers. */
	struct efs_list ds_waiters;
	struct efs_io ds_io;
	bool ds_busy;
	uint64_t ds_mark;
	struct efs_list bp_waiters; /* writes waiting on buffer limits (dreq.bp_link) */
	void (*sync_cb)(int status, void *arg);
	void *sync_arg;
	int sync_err;
	uint32_t fault_unsettled_nth; /* fault hook (ETCFS_FAULT_PUB_UNSETTLED) */
	int fault_mem_site;	      /* fault hook (ETCFS_FAULT_MEM): enum efs_file_fault_mem */
	long fault_mem_from;	      /* the next run fails allocations from this index */
	bool fault_mem_on;	      /* inside the section: injection armed */
	struct efs_list linvals;      /* kernel invalidations releases wait for */
	uv_timer_t *frecall;	      /* fault hook (ETCFS_FAULT_RECALL) */
	uint32_t frecall_ms;
	uint64_t frecall_rng;
	/* Test builds: runs mapped by copy-on-write writes that no finished
	 * fdatasync covers yet, each with |writes_done| at its mapping
	 * (efs_file_synchk_*; unused in other builds). */
	struct synchk {
		uint64_t start, len, seq;
	} *unsynced;
	size_t nunsynced, unsynced_cap;
	/* Write requests in the daemon now, and the most at once (writers
	 * of one file reach it together only when the kernel lets them:
	 * FOPEN_PARALLEL_DIRECT_WRITES). */
	uint64_t writes_inflight, writes_inflight_max;
	struct efs_gauge *g_writes_max;
	struct efs_gauge *g_dirty;
	struct efs_counter *c_txns, *c_inodes, *c_fsyncs, *c_wbytes, *c_rbytes, *c_syncs;
	struct efs_counter *c_wreplies; /* reads answered from the I/O worker */
	struct efs_counter *c_wwreplies; /* writes answered from the I/O worker */
	struct efs_counter *c_tail_hits; /* edge blocks not read (tail_take) */
	struct efs_counter *c_inplace;	/* overwrites of mapped blocks done in place */
	/* In-place overwrites: stopped while > 0 (efs_fs_inplace_stop), the
	 * number in flight, and who waits for it to reach 0. */
	uint32_t inplace_stops;
	uint64_t inplace_inflight;
	void (*inplace_drain_cb)(void *arg);
	void *inplace_drain_arg;
	struct efs_histogram *h_pub;
	struct efs_histogram *h_batch; /* inodes per committed publication */
};

/* One inode of a publication. */
struct dsnap {
	struct efs_fs_data *d; /* nref held */
	bool included;	       /* in the current attempt */
	bool tried;	       /* in some attempt */
	bool partial;
	bool rel; /* its lock's release rides the transaction (efs_lock_release_in_txn) */
	uint64_t ver;
	struct efs_extmap_change *ch;
	size_t nch;
	struct efs_runs use, freed;
};

/* op->hook_state of a publishing operation (sweep, fsync, truncate). */
struct dpub {
	struct efs_fs *fs;
	struct efs_alloc_txn *t;
	bool synced, syncing; /* the current snapshot's fdatasync */
	bool dev_err; /* the fdatasync or the allocator's begin failed */
	bool left_partial; /* a committed inode was published only in part */
	bool unknown;
	bool fault_unsettled; /* fault hook: its verdict after an unknown is not heard */
	bool committed;
	bool publisher; /* the one sweep operation (struct dctl's running) */
	uint64_t start_ns;
	size_t n;
	struct dsnap s[EFS_LOCK_REQ_MAX];
	struct dreq *trunc; /* truncate: its request */
};

/* ---- Request contexts ---- */

enum rkind {
	RK_OPEN = 0,
	RK_READ,
	RK_WRITE,
	RK_FSYNC,
	RK_FALLOC,
	RK_LSEEK,
	RK_CFR,
	RK_SETATTR,
	RK_NKINDS,
};

struct dreq {
	struct efs_fs *fs;
	/* The kernel request (counted when the record is made, answered
	 * once, by this record or by an engine operation preparing it). */
	struct efs_fs_rq rq;
	enum rkind kind;
	bool handed;  /* the prepare operation handed the request over */
	bool tr_more; /* truncate: a step was published already */
	/* Current inode being prepared / worked on. */
	uint64_t ino;
	enum efs_lock_mode mode;
	struct efs_fs_data *d; /* nref held */
	struct efs_fs_handle *h;
	struct efs_lock_req lr;
	bool pinned;
	unsigned lock_flags; /* EFS_LOCK_F_WRITEBACK, _PAGES (lock.h) */
	void (*cont)(struct dreq *r);
	struct efs_list bp_link; /* on the ctl's bp_waiters */
	/* Arguments. */
	size_t size;
	off_t off;
	char *data; /* bytes to write (efs_mem): the caller's copy, a copy step */
	size_t doff; /* offset in |data| of the current step */
	bool append;
	bool sync;
	int wflags; /* write: the open flags and the write's own (O_SYNC, O_DSYNC) */
	bool nospc_pub; /* ENOSPC: this step already waited for a publication */
	/* write: the worker may answer it (wr_early), and its times and
	 * version were changed before it went out (not at the answer). */
	bool early, early_attrs;
	bool caps_done; /* write: security.capability removed (or none) */
	int fmode; /* fallocate mode, lseek whence, fsync datasync */
	off_t len;
	struct fuse_file_info fi;
	struct stat attr;
	int to_set;
	/* copy_file_range: the source (the destination is the main inode). */
	uint64_t ino_in, ino_out;
	struct efs_fs_data *d_in;
	struct efs_lock_req lr_in;
	bool pinned_in;
	off_t off_in;
	size_t total; /* bytes copied so far */
	int phase;
	/* Work. */
	struct efs_rangelock_req rl;
	uint8_t *buf;	   /* aligned */
	uint8_t *edge[2];  /* partial head/tail blocks (aligned) */
	/* write: the aligned block buffer the kernel's bytes were copied
	 * into, at |wbuf_head| (r->data points there); a step that writes
	 * them all at that offset sends it to the device as it is. */
	uint8_t *wbuf;
	uint64_t wbuf_head;
	uint64_t b0, nb;   /* block range */
	size_t wbytes;	   /* bytes of the current write step */
	off_t woff;	   /* offset of the current write step */
	int err;
};

/* Per-handle state: the id of the data state it was opened against. */
struct hpriv {
	uint64_t sid;
};

/* ---- The data state (state.c) ---- */

bool efs_file_state_dirty(const struct efs_fs_data *d);
void efs_file_dlist_add(struct efs_fs_data *d);
void efs_file_dlist_del(struct efs_fs_data *d);
void efs_file_dacct(struct efs_fs_data *d);
size_t efs_file_dacct_all(struct dctl *c);
void efs_file_fw_fail_all(struct efs_fs_data *d, int err);
void efs_file_fw_wake(struct efs_fs_data *d, uint64_t upto, int err);
void efs_file_state_free(struct efs_fs_data *d);
bool efs_file_state_busy(const struct efs_fs_data *d);
bool efs_file_state_idle(const struct efs_fs_data *d);
void efs_file_state_maybe_free(struct efs_fs_data *d);
void efs_file_state_check_clean(struct efs_fs_data *d);
struct efs_fs_data *efs_file_state_get(struct efs_fs *fs, struct efs_fs_inode *in);
bool efs_file_map_valid(const struct efs_fs *fs, const struct efs_fs_data *d);
void efs_file_state_changed(struct efs_fs_data *d);
void efs_file_pf_set_size(struct efs_fs_data *d, uint64_t size);
void efs_file_pf_set_blocks(struct efs_fs_data *d);
void efs_file_pf_set_mctime(struct efs_fs_data *d, int64_t now);
void efs_file_pf_from_rec(struct efs_fs_data *d, int to_set);
int efs_file_map_load(struct efs_fs_op *op, struct efs_fs_data *d);
int efs_file_pend_reserve(struct efs_fs_data *d, struct efs_runs *list, size_t more);
void efs_file_state_discard(struct efs_fs_data *d);

/*
 * Fault hook (EFS_FAULT_HOOKS builds; tests): ETCFS_FAULT_MEM=SITE makes
 * the allocations (efs_mem) inside one section of the data path fail, the
 * way efs_mem_fail_after does: an allocation and every later one of the
 * section. The sections, bracketed by efs_file_fault_mem_enter and _leave
 * (no-ops unless armed for that site, and in other builds):
 *  - map: the mapping of a completed write (wb_apply), as a sweep: its
 *    Nth run fails from allocation N on, counted from 0, until a run
 *    attempts no more than N allocations ("sweep complete" in the log);
 *  - settle: a committed publication settling an inode's pending runs:
 *    every allocation fails, every time (nothing there may allocate).
 */
enum efs_file_fault_mem {
	EFS_FILE_FAULT_MEM_NONE = 0,
	EFS_FILE_FAULT_MEM_MAP,
	EFS_FILE_FAULT_MEM_SETTLE,
};
void efs_file_fault_mem_enter(struct dctl *c, enum efs_file_fault_mem site);
void efs_file_fault_mem_leave(struct dctl *c, enum efs_file_fault_mem site);

/*
 * Test builds check the publication's durability rule: a committed
 * publication never maps a block whose write no finished fdatasync covers
 * (it would point at bytes a power loss could take back). _mapped records
 * the runs of a completed copy-on-write write, _synced forgets those a
 * finished sync issued at |mark| covers, _commit aborts on a violation.
 * No-ops in other builds.
 */
void efs_file_synchk_mapped(struct dctl *c, const struct efs_runs *r);
void efs_file_synchk_synced(struct dctl *c, uint64_t mark);
void efs_file_synchk_commit(struct dctl *c, uint64_t ino, const struct efs_runs *use);

/* Counts a write request in (+1) or out (-1) of the daemon. */
void efs_file_writes_inflight(struct efs_fs *fs, int delta);

/* ---- Block I/O and the map (blockio.c) ---- */

/*
 * Reads file blocks [fblk, fblk + n) of |d| into |buf| (n blocks, aligned):
 * holes and preallocated extents give zeroes. 1 when done now (no device
 * read), 0 (|cb| later with 0 or -EIO), or a negative errno. The _w form
 * also calls |wcb| on the I/O worker as soon as the buffer is complete,
 * when a single device read fills it (then |cb| follows on the loop).
 */
int efs_file_read_blocks(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			 void (*cb)(void *arg, int err), void *arg);
int efs_file_read_blocks_w(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			   void (*cb)(void *arg, int err), void (*wcb)(void *arg), void *arg);
int efs_file_bury(struct efs_fs_data *d, const struct efs_runs *buried);
int efs_file_write_blocks(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			  uint32_t xflags, void (*cb)(void *arg, int err), void *arg);
/* The same; |wcb| runs on the I/O worker as soon as the write is on the
 * device when it went in place over written blocks in one device write
 * (then |cb| follows on the loop; never for copy-on-write, whose blocks
 * are found only once |cb|'s mapping is done). */
int efs_file_write_blocks_w(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			    uint32_t xflags, void (*cb)(void *arg, int err),
			    void (*wcb)(void *arg), void *arg);

/* ---- Requests and prepare (request.c) ---- */

struct dreq *efs_file_dreq_new(fuse_req_t req, enum rkind kind, enum efs_fs_opcode code,
			       uint64_t ino);
/* efs_file_dreq_new once the handler checked its arguments: |err| < 0
 * answers |req| with it instead (NULL, as on ENOMEM). */
struct dreq *efs_file_dreq_checked(fuse_req_t req, int err, enum rkind kind,
				   enum efs_fs_opcode code, uint64_t ino);
void efs_file_dreq_end(struct dreq *r, int err);
bool efs_file_state_ready(struct efs_fs *fs, uint64_t ino, enum efs_lock_mode mode);
void efs_file_prep(struct dreq *r, enum efs_lock_mode mode, void (*cont)(struct dreq *r));
/* The engine's plan step of an operation on regular file |ino|: asks for
 * its lock in |mode|, then -ENOENT, -EISDIR or -EINVAL unless it is one. */
int efs_file_plan_regular(struct efs_fs_op *op, uint64_t ino, enum efs_lock_mode mode);
void efs_file_prep_engine(struct dreq *r);
unsigned efs_file_lock_flags(const struct dreq *r);

/* ---- File handlers (handlers.c) ---- */

int efs_file_handle_ok(struct efs_fs *fs, struct efs_fs_handle *h);
void efs_file_bp_resume(struct efs_fs *fs);
void efs_file_write_step(struct dreq *r);
int efs_file_fsync_wait(struct efs_fs_data *d, void (*cb)(void *arg, int err), void *arg);
/*
 * A device flush covering every write completed by now (|writes_done|):
 * 1 when a finished one covers them already, 0 when |done|(arg, err) runs
 * later (err -EIO when the flush failed), -EIO when it cannot be issued,
 * -ENOMEM. One flush is in flight at a time and answers every waiter that
 * came before it was issued; publications (their seal), fdatasync and
 * O_DSYNC writes share it.
 */
int efs_file_dev_sync(struct efs_fs *fs, void (*done)(void *arg, int err), void *arg);
/* Waits until every change of |d| made so far is published (a release's
 * sync; a latched error of an earlier publication is left to fsync): 1
 * (nothing to publish), 0 (|cb| later with the publication's status), or
 * a negative errno. */
int efs_file_publish_wait(struct efs_fs_data *d, void (*cb)(void *arg, int err), void *arg);

/* ---- The lock ops of regular files (lockops.c) ---- */

/* Registers the ops and the kind classifier with the lock cache (and arms
 * the ETCFS_FAULT_RECALL hook); _done unregisters them. */
void efs_file_lockops_init(struct dctl *c);
void efs_file_lockops_done(struct dctl *c);
/* The kernel channel stopped: invalidations releases wait for complete. */
void efs_file_kernel_gone(struct dctl *c);
void efs_file_fsync_done(void *arg, int err);

/* ---- The publisher (publish.c) ---- */

/* The two halves of a publication's engine steps (an operation whose
 * hook_state is |P|): prepare takes the map token and fdatasyncs the
 * device, waiting as needed; build snapshots the inodes and adds them
 * and the allocator's contribution to the transaction, without waiting. */
int efs_file_pub_prepare(struct efs_fs_op *op, struct dpub *P);
int efs_file_pub_build(struct efs_fs_op *op, struct dpub *P);
int efs_file_pub_seal(struct efs_fs_op *op, struct dpub *P);
/* The outcome and release hooks of every publishing descriptor. */
void efs_file_pub_outcome(struct efs_fs_op *op, enum efs_fs_commit oc, int64_t rev);
void efs_file_pub_release(struct efs_fs_op *op);
/* The inode cache's hooks (fs-int.h): pending fields re-applied to a
 * reloaded record; a dropped inode's state forgotten. */
void efs_file_state_reloaded(struct efs_fs *fs, struct efs_fs_inode *in);
void efs_file_state_dropped(struct efs_fs *fs, uint64_t ino);
void efs_file_pub_kick(struct efs_fs *fs);

/* ---- fallocate and copy_file_range (range.c) ---- */

void efs_file_cfr_next(struct dreq *r);

static inline struct dctl *efs_file_ctl_of(struct efs_fs *fs)
{
	return fs->data_priv;
}

static inline struct efs_fs_handle *efs_file_fh_of(const struct fuse_file_info *fi)
{
	return fi ? (struct efs_fs_handle *)(uintptr_t)fi->fh : NULL;
}
