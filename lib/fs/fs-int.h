/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Internals of lib/fs (tests may include this): struct efs_fs, the inode
 * cache, the operation record and the step engine every handler composes,
 * and the pure helpers (operation ids, timestamp and mode rules, readdir
 * cookies, xattr name rules) that the unit suite checks.
 *
 * The engine (engine.c) runs every operation through the same steps:
 *   session   wait for an ACTIVE session (efs_session_wait), else EIO;
 *   plan      the operation names the inodes it needs and their lock modes,
 *             and the extra keys it must read (dirents, xattrs, ...);
 *   mutex     mutations take a node-local mutex per inode they rewrite, in
 *             inode number order, so that two operations of this node never
 *             build transactions from the same cached mod_revision (and so
 *             that "op_id is mine" on an inode record is conclusive);
 *   lock      one efs_lock_req for the whole set (cached locks: no etcd);
 *   load      one read-only transaction for the extra keys and for every
 *             inode record not valid in the cache; then plan again: a plan
 *             that grew (unlink learns the child) goes back to mutex/lock;
 *   build     the operation computes the new records and the transaction;
 *   commit    one transaction; on a compare failure: reload and rebuild
 *             (bounded); on an unknown outcome: reload and treat "op_id is
 *             mine" on the first rewritten inode as applied;
 *   finish    update the cache, send exactly one reply, free the record.
 * Everything runs on the loop thread.
 */

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "etcd/etcd.h"
#include "etcd/kv.h"
#include "etcd/txn.h"
#include "maint/capacity.h"
#include "fs/fs.h"
#include "lock/lock.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "util/list.h"
#include "util/metrics.h"
#include "etcfs.pb-c.h"

/* ---- Constants ---- */

/* Transaction attempts after compare failures. A transient failure (an
 * unknown outcome, a refusal before proposing, a lock or the session lost
 * between acquisition and commit, a failed read) is retried at least this
 * often and, past it, for as long as the session's quorum-loss bound from
 * the operation's start (a pause of etcd is a wait, not an error), after a
 * backoff doubling from EFS_FS_BACKOFF_MIN_MS to EFS_FS_BACKOFF_MAX_MS. */
#define EFS_FS_RETRY_MAX 8
#define EFS_FS_BACKOFF_MIN_MS 10
#define EFS_FS_BACKOFF_MAX_MS 500
/* EIO answers a second whose cause is logged (the rest are counted). */
#define EFS_FS_EIO_LOG_PER_S 10
/* Keys one operation reads besides inode records. */
#define EFS_FS_KV_MAX 6
/* Inode records one operation rewrites or creates. */
#define EFS_FS_OUT_MAX EFS_LOCK_REQ_MAX
/* Bytes of an operation id: node, NUL, generation, sequence. */
#define EFS_FS_OPID_MAX (EFS_META_NODE_MAX + 1 + 8 + 8)
/* Dirents read per directory page, and most entries readdirplus prepares
 * at once: their shared locks go out EFS_LOCK_REQ_MAX per transaction, all
 * at once, so a directory of a few hundred names costs one page read and
 * one round of lock transactions (which bring the records) rather than a
 * sequence of them. */
#define EFS_FS_DIR_PAGE 256
/* Inode records read per readdirplus transaction (etcd's op cap is 128). */
#define EFS_FS_PLUS_BATCH 100
/* Statfs answers are reused this long. */
#define EFS_FS_STATFS_CACHE_NS (1000ull * 1000 * 1000)
/* Recount inodes before each create once within this many of the limit. */
#define EFS_FS_INODE_SLACK 1000

/* FUSE operations, for metrics (names in efs_fs_op_names). */
enum efs_fs_opcode {
	EFS_FS_OP_INIT = 0,
	EFS_FS_OP_LOOKUP,
	EFS_FS_OP_FORGET,
	EFS_FS_OP_GETATTR,
	EFS_FS_OP_SETATTR,
	EFS_FS_OP_READLINK,
	EFS_FS_OP_MKNOD,
	EFS_FS_OP_MKDIR,
	EFS_FS_OP_UNLINK,
	EFS_FS_OP_RMDIR,
	EFS_FS_OP_SYMLINK,
	EFS_FS_OP_RENAME,
	EFS_FS_OP_LINK,
	EFS_FS_OP_OPEN,
	EFS_FS_OP_READ,
	EFS_FS_OP_RELEASE,
	EFS_FS_OP_OPENDIR,
	EFS_FS_OP_READDIR,
	EFS_FS_OP_READDIRPLUS,
	EFS_FS_OP_RELEASEDIR,
	EFS_FS_OP_FSYNCDIR,
	EFS_FS_OP_STATFS,
	EFS_FS_OP_SETXATTR,
	EFS_FS_OP_GETXATTR,
	EFS_FS_OP_LISTXATTR,
	EFS_FS_OP_REMOVEXATTR,
	EFS_FS_OP_CREATE,
	EFS_FS_OP_RECLAIM, /* internal: last close of an unlinked inode */
	EFS_FS_OP_ATIME,   /* internal: relatime update after a read */
	EFS_FS_OP_WRITE,
	EFS_FS_OP_FLUSH,
	EFS_FS_OP_FSYNC,
	EFS_FS_OP_FALLOCATE,
	EFS_FS_OP_LSEEK,
	EFS_FS_OP_COPY_FILE_RANGE,
	EFS_FS_OP_GETLK,
	EFS_FS_OP_SETLK,
	EFS_FS_OP_FLOCK,
	EFS_FS_OP_PUBLISH, /* internal: deferred publication of data and fields */
	EFS_FS_NOPS,
};

/* Who sent an etcd transaction (etcfs_etcd_txns_total{origin}). */
enum efs_fs_origin {
	EFS_FS_ORIG_CREATE = 0,
	EFS_FS_ORIG_MKDIR,
	EFS_FS_ORIG_MKNOD,
	EFS_FS_ORIG_SYMLINK,
	EFS_FS_ORIG_LINK,
	EFS_FS_ORIG_UNLINK,
	EFS_FS_ORIG_RMDIR,
	EFS_FS_ORIG_RENAME,
	EFS_FS_ORIG_SETATTR,
	EFS_FS_ORIG_XATTR,
	EFS_FS_ORIG_INO,
	EFS_FS_ORIG_LOCK,
	EFS_FS_ORIG_RECLAIM,
	EFS_FS_ORIG_ATIME,
	EFS_FS_ORIG_PUBLISH,   /* sweep, fsync, buffer limits, lock release */
	EFS_FS_ORIG_TRUNCATE,  /* setattr with a size */
	EFS_FS_ORIG_FALLOCATE,
	EFS_FS_ORIG_PLOCK,     /* fcntl and flock locks */
	EFS_FS_ORIG_SPACE,     /* group claims, free-intent folds, reclaim batches */
	EFS_FS_ORIG_OPENREF,   /* open references of their own (reclaim.c) */
	EFS_FS_NORIGINS,
};

enum efs_fs_outcome {
	EFS_FS_TXN_OK = 0,
	EFS_FS_TXN_CONFLICT,
	EFS_FS_TXN_ERROR,
	EFS_FS_TXN_UNKNOWN,
	EFS_FS_NOUTCOMES,
};

extern const char *const efs_fs_op_names[EFS_FS_NOPS];

/* ---- Requests and replies (reply.c) ---- */

/*
 * The request base: one per kernel request, embedded in the record that
 * serves it or shared by the records it passes through. Started once
 * (counts the request); answered once through efs_fs_rq_* (counts an
 * error and the latency, turns a negative errno into the reply), from any
 * thread. The record's owner frees its bookkeeping on the loop afterwards.
 */
struct efs_fs_rq {
	struct efs_fs *fs;
	fuse_req_t req; /* NULL: internal, no one to answer */
	enum efs_fs_opcode code;
	uint64_t start_ns;
	atomic_bool replied;
};

void efs_fs_rq_start(struct efs_fs_rq *rq, struct efs_fs *fs, fuse_req_t req,
		     enum efs_fs_opcode code);
bool efs_fs_rq_replied(const struct efs_fs_rq *rq);
/* |err|: 0 (success) or a negative errno. */
void efs_fs_rq_err(struct efs_fs_rq *rq, int err);
/* These return libfuse's result, or -EALREADY when nothing was sent. */
int efs_fs_rq_entry(struct efs_fs_rq *rq, const struct fuse_entry_param *e);
int efs_fs_rq_create(struct efs_fs_rq *rq, const struct fuse_entry_param *e,
		     const struct fuse_file_info *fi);
int efs_fs_rq_open(struct efs_fs_rq *rq, const struct fuse_file_info *fi);
void efs_fs_rq_attr(struct efs_fs_rq *rq, const struct stat *st, double timeout);
void efs_fs_rq_buf(struct efs_fs_rq *rq, const void *buf, size_t size);
void efs_fs_rq_write(struct efs_fs_rq *rq, size_t count);
void efs_fs_rq_statfs(struct efs_fs_rq *rq, const struct statvfs *st);
void efs_fs_rq_readlink(struct efs_fs_rq *rq, const char *link);
void efs_fs_rq_xattr(struct efs_fs_rq *rq, size_t size);
void efs_fs_rq_lock(struct efs_fs_rq *rq, const struct flock *fl);
void efs_fs_rq_lseek(struct efs_fs_rq *rq, off_t off);
void efs_fs_rq_none(struct efs_fs_rq *rq);
/* Starts and answers a request in one (refused before any record). */
void efs_fs_reply_now(struct efs_fs *fs, fuse_req_t req, enum efs_fs_opcode code, int err);
/* The same for a write-like request: |err| < 0, or 0 bytes written. */
void efs_fs_reply_write_now(struct efs_fs *fs, fuse_req_t req, enum efs_fs_opcode code, int err);

/* ---- Inode cache ---- */

struct efs_fs_op;

/* Names of one directory looked up under its lock (ino 0: negative). */
struct efs_fs_dent {
	struct efs_fs_dent *next;
	uint64_t ino;
	uint32_t type;
	size_t len;
	char name[]; /* |len| bytes, NUL-terminated */
};

struct efs_fs_dcache {
	uint64_t gen; /* the directory's lock grant when filled */
	size_t n, nbuckets;
	struct efs_fs_dent **b;
	/* Every name of the directory is here (a listing read whole under
	 * this grant, kept up to date by this node's own changes since): a
	 * name not found is absent, with no etcd read. */
	bool complete;
	size_t ahead_from; /* the bucket the next read ahead starts at */
	/* Names whose locks a read ahead found not free (a peer holds them):
	 * left to the lookups that want them. */
	uint64_t busy[8];
	size_t nbusy;
};
#define EFS_FS_AHEAD_BUSY 8

/* Most names cached per directory. A full cache takes no more names and
 * stops being complete; it is not emptied (a directory larger than this
 * keeps the names it has, and the rest are read from etcd). */
#define EFS_FS_DCACHE_MAX (1u << 17)

/*
 * One cached inode. |rec| is trusted only while this node still holds the
 * very grant of the inode's lock it was read (or written) under, and
 * |epoch| equals the fs's (a lost session bumps it): see
 * efs_fs_inode_valid(). The entry lives while the kernel references it
 * (|nlookup|), a handle has it open (|opens|) or an operation uses it
 * (|refs|).
 */
struct efs_fs_inode {
	uint64_t ino;
	struct efs_fs_inode *hnext; /* hash chain */
	Etcfs__Inode *rec;	    /* NULL: not loaded; owned */
	int64_t mod_rev;	    /* of i/<ino> when |rec| was read or written */
	uint64_t epoch;		    /* fs epoch of |rec|; 0: never valid */
	uint64_t grant;		    /* lock grant |rec| was filled under; 0: none */
	uint64_t nocaps_grant;	    /* grant under which it had no security.capability */
	uint32_t caps_setting;	    /* setxattrs of it by this node between build and end */
	uint64_t caps_seq;	    /* bumped as each of those starts and ends */
	bool gone;		    /* i/<ino> does not exist (as of |epoch|) */
	uint64_t nlookup;	    /* kernel references */
	uint32_t opens;		    /* open handles */
	uint32_t wopens;	    /* ... of them open for writing (kept by file/) */
	uint32_t refs;		    /* operations using the entry */
	/* The handles of them opened under fs epoch |live_epoch|: after a
	 * lost session only those still count (efs_fs_live_opens). */
	uint32_t live_opens;
	/* Opens between their lock and their handle (the open reference's
	 * commit): they count as open, so that an unlink of this node in
	 * that window keeps the file as an orphan. */
	uint32_t opening;
	uint64_t live_epoch;
	uint64_t mseq;		    /* bumped by each name change this node makes */
	uint64_t rmseq;		    /* ... of them, those not only adding a name */
	/* This node's open reference r/<ino><node> (reclaim.c): the fs epoch
	 * it was put under (0: none; a lost session took it with the lease)
	 * and the revision that put it (its drop compares it). */
	uint64_t oref_epoch;
	int64_t oref_rev;
	/* A put whose outcome is unknown (oref_epoch set, oref_rev 0): not
	 * held, but its drop runs anyway when the entry is freed. */
	bool oref_unsure;
	bool orphan_seen;	    /* an o/<ino> put was seen (reclaim.c's watch) */
	bool atime_busy;	    /* a relatime update is in flight */
	struct efs_fs_dcache *dc;   /* directories: names, valid under the lock */
	uint64_t dc_fill_grant;	    /* directories: the grant a listing read for lookups was sent under */
	uint64_t dc_void_grant;	    /* ... and the grant its voided reads count under */
	unsigned dc_voids;	    /* listings for lookups voided under dc_void_grant */
	unsigned ahead_inflight;    /* directories: read-ahead lock requests in flight */
	struct efs_fs_knames *kn;   /* directories: names the kernel may cache (lockops.c) */
	/* The grant under which a read's GETATTR last passed a drain
	 * (attr.c: at most one per grant, so that readers cannot starve a
	 * recall). */
	uint64_t rd_pass_grant;
	struct efs_fs_data *data;   /* regular files: data state (fs/data.h), holds a ref */
	/* On fs->kpages: the kernel may hold pages of it (fs.c). */
	struct efs_list klink;
	/* The last name this node handed the kernel for it (a non-directory):
	 * its parent, the name's hash, the parent's lock grant then, and the
	 * ESTALE answers given since (lockops.c, efs_fs_kalias_check). */
	uint64_t kal_parent, kal_name, kal_grant;
	uint8_t kal_estales;
	/* Node-local mutex of mutations (see the engine above). */
	struct efs_fs_op *mx_owner;
	struct efs_list mx_waiters; /* FIFO of operations (op->mx_link) */
	bool batched; /* a delegated change of it waits in the batch (batch.c) */
	bool batch_lost; /* ... and that batch failed: fsync answers EIO */
};

/* ---- Open handles ---- */

struct efs_fs_dirent_ent {
	char *name; /* NUL-terminated, efs_mem */
	uint64_t ino;
	uint32_t type; /* DT_* */
	bool has_attr; /* readdirplus: |st| filled */
	bool sent;     /* handed to the kernel (with its offset) by this handle */
	struct stat st;
	/* The directory's mseq and lock grant when the page holding this entry
	 * was asked for: readdirplus lets the kernel cache the entry only while
	 * both are unchanged. */
	uint64_t dir_mseq, dir_gen;
};

struct efs_fs_handle {
	uint64_t ino;
	uint64_t epoch; /* fs epoch at open: later operations fail EIO after a loss */
	bool dir;
	/* Directories: entries read so far, in name order; position p (the
	 * cookie) is "." for 0, ".." for 1, ents[p - 2] afterwards. */
	struct efs_fs_dirent_ent *ents;
	size_t nents, cap;
	bool complete; /* every entry after the last one has been read */
	bool dc_put;   /* every entry read so far went into the name cache */
	uint64_t parent; /* ".." */
	/* Files (fs/data.h): open flags, and what the data path (file/) and
	 * plock.c keep. */
	int oflags;
	bool writable, append, direct;
	bool plocked;	     /* took fcntl locks (dropped on flush) */
	bool flocked;	     /* took a flock lock (dropped on release) */
	void *dpriv;	     /* the data path's per-handle state */
	struct efs_list link; /* fs->handles */
};

/* ---- The filesystem ---- */

/* How many modules may register inode hooks (struct efs_fs_inode_hooks). */
#define EFS_FS_NIHOOKS 4

struct efs_fs {
	uv_loop_t *loop;
	struct efs_etcd *c;
	struct efs_session *s;
	struct efs_lockcache *lc;
	struct efs_metrics *m;
	struct efs_capacity *cap; /* may be NULL */
	/* Data path (fs/data.h, fs/alloc.h, dev/iopool.h); NULL/-1 without a
	 * device (tests of the namespace alone). */
	int dev_fd;
	bool dev_direct;
	struct efs_iopool *pool;
	struct efs_alloc *alloc;
	uint32_t flush_interval_ms;
	void *data_priv;    /* file/: publisher and sweep */
	/* The modules that hang state on inodes and handles (efs_fs_ihooks_add). */
	const struct efs_fs_inode_hooks *ihooks[EFS_FS_NIHOOKS];
	void *reclaim_priv; /* reclaim.c */
	uint32_t dead_grace_ms; /* what a dead node's orphans wait (0: at once) */
	/* A publication of everything for a request (efs_fs_publish_all), and
	 * a leave that waits for it to end. */
	void (*pub_cb)(int status, void *arg);
	void *pub_arg;
	struct leave_state *leave_next;
	void *plock_priv;   /* plock.c */
	void *maint_priv;   /* maint.c */
	struct efs_meta_ns ns;
	Etcfs__FsInfo *fi; /* copy (efs_meta_fsinfo_decode of its packing) */
	uint32_t blksize;
	bool read_only;
	bool noatime;
	bool cow; /* -o cow: overwrites never go in place */
	bool posix_acl; /* FUSE_CAP_POSIX_ACL granted at init */
	uint32_t cache_timeout_ms;
	/* The kernel gives a SETATTR reply no timeout when an invalidation
	 * of the inode came after the request left (Linux 6.16 on): such
	 * replies may then keep theirs (efs_fs_setattr_timeout). */
	bool setattr_versioned;
	uint32_t ino_batch;
	struct fuse_session *se;
	struct efs_inval *inval; /* kernel invalidations (kchan/inval.h), with |se| */
	struct efs_list dinvals; /* directories' invalidations in flight (lockops.c) */
	struct efs_list readpins; /* locks kept from a read's GETATTR to its READ (attr.c) */
	size_t nreadpins;
	uint64_t readpin_seq;

	uint64_t epoch; /* bumped when the session is lost */
	uint64_t inflight;
	struct efs_list ops; /* the operations in flight (efs_fs_op.live) */
	uint64_t seq; /* operation sequence of op ids */

	/* Inode cache. */
	/* Inodes whose locks and records were taken ahead of their lookups,
	 * referenced so that the records stay (a ring, the oldest let go). */
	struct efs_fs_inode **ahead;
	size_t ahead_pos;
	struct efs_fs_inode **htab;
	size_t hsize, ninodes;

	/* Open handles (to fail them after a loss). */
	struct efs_list handles; /* efs_fs_handle.link */

	/* Inode number reservation: [ino_next, ino_end) is ours. */
	uint64_t ino_next, ino_end;
	bool ino_busy;
	struct efs_list ino_waiters; /* operations (op->qlink) */

	/* Inode count estimate (FORMAT.md section 4). */
	bool count_known;
	bool count_busy;
	int64_t icount;
	int64_t icreating; /* creates between the limit check and their end */
	uint64_t icount_ns;
	struct efs_list count_waiters; /* operations (op->qlink) */

	/* Statfs cache. */
	uint64_t statfs_ns;
	uint64_t free_blocks;

	/* Operations ready to continue (mutex hand-over), run from |idle|. */
	struct efs_list ready; /* operations (op->qlink) */
	uv_idle_t *idle;
	/* Operations backing off before a retry (op->qlink), by wake time,
	 * resumed by |retry_timer|. */
	struct efs_list delayed;
	uv_timer_t *retry_timer;

	/* Lock cache stats already counted into the "lock" origin. */
	uint64_t lock_txns_seen, lock_retries_seen;

	/* Metrics. */
	struct efs_counter *m_ops[EFS_FS_NOPS];
	struct efs_counter *m_errs[EFS_FS_NOPS];
	struct efs_histogram *m_lat[EFS_FS_NOPS];
	struct efs_counter *m_txns[EFS_FS_NORIGINS][EFS_FS_NOUTCOMES];
	struct efs_counter *m_retries;
	struct efs_counter *m_susp_invals;
	struct efs_gauge *m_susp_inval_ms;
	/* Names answered ESTALE for an alias, until the kernel asks about
	 * the old name (lockops.c): parent, old name's hash, inode. */
	struct {
		uint64_t parent, name, ino;
	} kal_ring[16];
	unsigned kal_next;
	struct efs_counter *m_kal_estales;
	struct efs_counter *m_mx_yields;
	struct efs_counter *m_lookup_cached; /* lookups the name cache answered */
	struct efs_counter *m_lookup_read;   /* lookups that read the dirent */
	/* The invalidations of the last suspension (fs.c). */
	uint64_t susp_pending, susp_count, susp_start_ns;
	/* Inodes whose pages the kernel may cache, least recently filled
	 * first (efs_fs_note_kpages), at most |max_kpages| of them. */
	struct efs_list kpages;
	uint64_t nkpages, max_kpages;
	struct efs_gauge *m_kpages;
	struct efs_counter *m_kpages_evicted;

	/* EIO answers explained in the log (explain_eio): at most
	 * EFS_FS_EIO_LOG_PER_S per second, the rest counted. */
	uint64_t eio_win_ns;
	unsigned eio_logged;
	uint64_t eio_quiet;

	/* Delegated namespace changes (batch.c, -o delegate). */
	bool delegate;
	uint32_t batch_ms;	    /* a batch goes this long after its first change */
	struct efs_fs_batch *batch;
	int batch_err;		    /* a failed batch: the next sync's answer */
	uint64_t batch_off_until;   /* monotonic ns: no delegation before */
	struct efs_counter *m_batches, *m_batch_ops, *m_batch_failures;
};

/* ---- Operation records ---- */

/* One key (or range) the load step reads. */
struct efs_fs_kv {
	struct efs_meta_key key;
	struct efs_meta_key end; /* end.len 0: the key alone */
	int64_t limit;		 /* ranges: 0 all */
	bool keys_only;
	bool count_only;
	/* Results (borrowed from the op's last read response). */
	bool found;
	int64_t mod_rev;
	int64_t create_rev;
	const uint8_t *val;
	size_t val_len;
	int64_t count;
	Mvccpb__KeyValue **kvs; /* ranges */
	size_t nkvs;
};

/* An inode record the transaction writes. */
struct efs_fs_out {
	uint64_t ino;
	bool is_new; /* compare create_revision == 0 instead of mod_revision */
	bool del;    /* delete the record (last link) */
	int64_t mod_rev;
	ProtobufCBinaryData val; /* packed record (efs_mem) */
};

struct efs_fs_slot {
	uint64_t ino;
	enum efs_lock_mode mode;
	struct efs_fs_inode *in; /* ref held */
	bool mx;		 /* holds the inode's mutex */
	enum efs_lock_mode locked; /* mode pinned by the last acquisition */
	bool loading;		 /* read by the current load */
};

struct efs_fs_opdesc;

/* Results of plan/build: go on, wait (the op resumes itself), or stop. */
#define EFS_FS_CONT 0
#define EFS_FS_WAIT 1
#define EFS_FS_DONE 2

/* The answer when the inode a request names has no record any more. The
 * kernel reached it through a dentry it resolved before the name went (an
 * unlink, or a rename over it, here or on a peer, while the system call was
 * between its walk and its request). ENOENT would tell the caller that a
 * name which never stopped existing is missing; on ESTALE the path system
 * calls (open, stat, chmod, truncate, the xattr calls...) walk once more with
 * fresh lookups and act on what the name holds now. */
#define EFS_FS_GONE (-ESTALE)

struct efs_fs_op {
	struct efs_fs *fs;
	/* The request it answers: |own_rq|, or the data request's it
	 * prepares (efs_fs_op_new_for). Its req is NULL for internal
	 * operations. */
	struct efs_fs_rq *rq;
	struct efs_fs_rq own_rq;
	const struct efs_fs_opdesc *d;
	int retries;	/* transient failures retried (may_retry) */
	int conflicts;	/* compare failures and restarts (at most EFS_FS_RETRY_MAX) */
	int replans;
	bool handed_on;	  /* another record answers the request */
	bool verify;	  /* after an unknown outcome: check op_id first */
	bool force_load;  /* reload every record (after a conflict) */
	bool granted;	  /* efs_lock_grant_in_txn done for |new_ino| */
	bool unsettled;	  /* a transaction's outcome is unknown and not yet settled */
	bool lock_pinned;
	bool lock_waiting; /* efs_lock_acquire waits (FUSE_INTERRUPT cancels it) */
	bool mx_yield;	   /* that wait was cancelled to give its mutexes up */
	bool intr_set;	   /* its interrupt callback is registered */
	int state;	  /* engine step to resume at after a wait */
	int wait_err;	  /* error handed to a waiter */
	bool planned;	  /* plan ran once */
	bool counted;	  /* the inode count was read for this create */
	bool creating;	  /* counted in fs->icreating */
	bool batched;	  /* its changes joined the batch instead of a commit (batch.c) */
	bool no_batch;	  /* the batch refused it: it commits alone */
	bool committed;	  /* the transaction applied */
	int loads_done;
	size_t nkv_loaded; /* kv entries the last load covered */

	struct efs_session_waiter sw;
	void (*after_session)(struct efs_fs_op *op); /* the step |sw| resumes */
	struct efs_lock_req lr;
	unsigned lock_flags; /* EFS_LOCK_F_* of its lock requests */
	enum efs_lock_mode held_before[EFS_LOCK_REQ_MAX];
	/* Idle locks whose releases ride its transaction (early cancel):
	 * their outcome is told with the operation's (report_outcome). */
	size_t nride;
	uint64_t ride[EFS_LOCK_RIDE_MAX];

	/* Inodes of the plan, in inode number order, deduplicated. */
	size_t nslots;
	struct efs_fs_slot slots[EFS_LOCK_REQ_MAX];
	/* Extra reads. */
	size_t nkv;
	struct efs_fs_kv kv[EFS_FS_KV_MAX];
	Etcdserverpb__TxnResponse *rresp; /* last load (owned) */
	Etcdserverpb__RangeResponse *rresp1; /* last single-key load (owned) */
	int read_tries;
	int backoffs;	  /* transient failures retried (retry_later) */
	uint64_t wake_ns; /* on fs->delayed: when it goes on */
	void (*retry_step)(struct efs_fs_op *op); /* what it goes on with then */
	/* The last failure a step saw (an etcd error, a lock or session
	 * status), for the warning an EIO answer logs. */
	int last_err;
	char last_why[96];

	/* Transaction being built and its inode writes. */
	struct efs_etcd_txn *txn;
	size_t nout;
	struct efs_fs_out out[EFS_FS_OUT_MAX];
	uint64_t check_ino; /* inode whose op_id tells "applied" */
	/* The new name a create-like operation or link writes: after an
	 * unknown outcome its dirent is read too (kv[vkv - 1]), and our op_id
	 * on it also tells "applied" (a peer may rewrite check_ino since). */
	struct efs_meta_key vkey;
	bool has_vkey;
	size_t vkv;
	int64_t commit_rev;
	int64_t load_rev; /* the revision of the last load (for logs) */
	/* During the COMMITTED outcome hook: the commit's response (borrowed;
	 * NULL when the outcome was settled after an unknown one). */
	const Etcdserverpb__TxnResponse *commit_resp;

	uint8_t op_id[EFS_FS_OPID_MAX];
	size_t op_id_len;

	/* Queues: mutex waiters, ready list, ino/count waiters. */
	struct efs_list mx_link;      /* on mx_wait->mx_waiters */
	struct efs_fs_inode *mx_wait; /* inode waited on */
	struct efs_list qlink;	      /* the ready list or an ino/count wait */
	struct efs_list live;	      /* fs->ops: every operation in flight */
	uint64_t born_ns;	      /* when it started (efs_fs_log_inflight) */

	/* The inode the operation is about (the parent for namespace
	 * operations); the rest of an operation's arguments live in its own
	 * record (efs_fs_opdesc's size). */
	uint64_t ino;
	/* The caller's credentials (none for internal operations). */
	uid_t uid;
	gid_t gid;
	mode_t umask;

	/* Create-like operations: the engine reserves the inode number. */
	uint64_t new_ino;
	struct efs_fs_inode *newin; /* its cache entry (ref held) */
	void *priv;	     /* per-operation scratch (efs_mem) */
	void *hook_state;    /* state of the descriptor's hooks (the publisher's) */
	/* Called last, once the op's locks and mutexes are let go: frees
	 * what |priv| points to, or tells whoever started the op it is over. */
	void (*priv_free)(struct efs_fs_op *op);
};

/*
 * What an operation plugs into the engine. |plan| fills slots and kv
 * (efs_fs_want, efs_fs_want_kv) and may answer now (EFS_FS_DONE after
 * replying, or a negative errno); it runs before the first load and after
 * every load. |prepare| (optional) runs once the locks are held and the
 * records loaded, before every build (again before each rebuild): the one
 * step that may wait (EFS_FS_WAIT, resumed with efs_fs_op_resume_prepare)
 * for what the build needs and the plan cannot read (the map token, a
 * device fdatasync, a range lock, an extent map, an ancestor walk, a
 * listing's pages); EFS_FS_CONT goes on to build, EFS_FS_DONE (after
 * replying) or a negative errno ends the operation. |build| never waits:
 * it adds the operation's part of the transaction (the engine adds the
 * guards and the inode writes of op->out) and returns EFS_FS_CONT, or
 * answers (EFS_FS_DONE) for read-only operations, or fails. |done|
 * replies after a commit (the cache already holds op->out).
 */
/*
 * What the generic layer tells the modules that hang state on its inodes
 * and handles (the data path, reclaim, the directories' lock ops), so that
 * it never names them: |reloaded| after the engine replaced in->rec with
 * a record read from etcd (pending fields go back into the merged view),
 * |dropped| once an inode's last link and last handle are gone and its
 * keys were deleted or handed to a reclaim record (forget its in-core
 * state, giving back only allocations known unpublished), |freed| when
 * the inode cache frees |in| (free what hangs on it), |handle_freed| when
 * an open handle of a regular file goes (before the open count drops).
 * Any may be NULL. Registered with efs_fs_ihooks_add(), called in the
 * order of the table (of registration, unless one was removed).
 */
struct efs_fs_inode_hooks {
	void (*reloaded)(struct efs_fs *fs, struct efs_fs_inode *in);
	void (*dropped)(struct efs_fs *fs, uint64_t ino);
	void (*freed)(struct efs_fs *fs, struct efs_fs_inode *in);
	void (*handle_freed)(struct efs_fs *fs, struct efs_fs_handle *h);
};

/* Registers |h| (at most EFS_FS_NIHOOKS tables: more is a bug, which
 * asserts) and unregisters it. */
void efs_fs_ihooks_add(struct efs_fs *fs, const struct efs_fs_inode_hooks *h);
void efs_fs_ihooks_del(struct efs_fs *fs, const struct efs_fs_inode_hooks *h);

/* Outcomes of an operation's commit attempt (efs_fs_opdesc's outcome). */
enum efs_fs_commit {
	EFS_FS_COMMITTED = 0,
	EFS_FS_FAILED,
	EFS_FS_UNKNOWN,
};

struct efs_fs_opdesc {
	enum efs_fs_opcode code;
	/* The size of the operation's record: a struct that begins with
	 * struct efs_fs_op and carries the operation's own arguments and
	 * results (libuv's request pattern); 0 for the base alone. */
	size_t size;
	enum efs_fs_origin origin;
	bool mutates;
	bool new_inode; /* reserves an inode number and checks the limit */
	bool grows;	/* adds metadata: refused while etcd is near its quota */
	/* Takes the node-local mutex of every planned inode, shared or not
	 * (open: so that it never overlaps an unlink of this node, which
	 * decides between delete and orphan from the open count). */
	bool mx_all;
	int (*plan)(struct efs_fs_op *op);
	int (*prepare)(struct efs_fs_op *op);
	int (*build)(struct efs_fs_op *op);
	/* Optional: runs after every build, before the guards are added and
	 * the transaction goes out; the one step after the build that may
	 * wait (EFS_FS_WAIT, resumed with efs_fs_op_resume_seal) for what
	 * must be durable before the transaction can commit and that must
	 * cover exactly what the build took (the publication's device
	 * fdatasync: writes completed after its snapshot are not in it, so
	 * they need not be covered). EFS_FS_CONT sends; a negative errno
	 * ends the operation after a FAILED outcome (nothing was sent). */
	int (*seal)(struct efs_fs_op *op);
	/* Optional (-o delegate, batch.c): whether the built operation may
	 * join the batch of delegated changes instead of committing, given
	 * that it holds its locks exclusively (the operation's own
	 * condition: a create knows every name of its directory). NULL:
	 * never. */
	bool (*batchable)(struct efs_fs_op *op);
	void (*done)(struct efs_fs_op *op);
	/* Optional. Each commit attempt's outcome: COMMITTED (|rev| the
	 * revision) and FAILED end the attempt (FAILED: not applied; a
	 * rebuild may follow); UNKNOWN is followed by COMMITTED or FAILED
	 * once the engine has verified by op id. */
	void (*outcome)(struct efs_fs_op *op, enum efs_fs_commit oc, int64_t rev);
	/* Optional: the operation is being freed (op->hook_state is the
	 * hooks' to release). */
	void (*release)(struct efs_fs_op *op);
};

/* ---- Engine (engine.c) ---- */

/* A new record for |req| (NULL: internal), started with efs_fs_op_run.
 * NULL on ENOMEM (the caller replies ENOMEM). */
struct efs_fs_op *efs_fs_op_new(struct efs_fs *fs, fuse_req_t req, const struct efs_fs_opdesc *d);
/* An operation that answers |rq|, a request another record started (a
 * data request it prepares): counted there, not again. */
struct efs_fs_op *efs_fs_op_new_for(struct efs_fs *fs, struct efs_fs_rq *rq,
				    const struct efs_fs_opdesc *d);
/* efs_fs_op_new for the request's filesystem with op->ino = |ino|; on
 * ENOMEM it counts the error, replies ENOMEM and returns NULL. */
struct efs_fs_op *efs_fs_op_start(fuse_req_t req, const struct efs_fs_opdesc *d, uint64_t ino);
/* For descriptors with nothing to build (-EIO: plan answers) or to do after a commit. */
int efs_fs_no_build(struct efs_fs_op *op);
void efs_fs_no_done(struct efs_fs_op *op);
/* A |done| that replies success without data. */
void efs_fs_ok_done(struct efs_fs_op *op);
/* Plans a shared lock on op->ino (0, or a negative errno) before the first
 * load; after it 1 with *|ret| the record, or EFS_FS_GONE. */
int efs_fs_plan_shared(struct efs_fs_op *op, const Etcfs__Inode **ret);
/* Starts the steps; every outcome ends in efs_fs_op_finish. */
void efs_fs_op_run(struct efs_fs_op *op);
/* Replies |err| (a negative errno; 0: the operation replied already) if no
 * reply was sent, releases everything and frees |op|. An EIO is logged as
 * a warning (rate-limited) with the operation, its inode, the call site
 * (|func|, |line|: the macro passes the caller's), its retries and the
 * last failure it saw: EIO alone tells the caller nothing. */
void efs_fs_op_finish_at(struct efs_fs_op *op, int err, const char *func, int line);
#define efs_fs_op_finish(op, err) efs_fs_op_finish_at((op), (err), __func__, __LINE__)
/* Resumes an operation whose prepare returned EFS_FS_WAIT: prepare runs
 * again; |err| < 0 ends the operation with that error instead. */
void efs_fs_op_resume_prepare_at(struct efs_fs_op *op, int err, const char *func, int line);
#define efs_fs_op_resume_prepare(op, err)                                                      \
	efs_fs_op_resume_prepare_at((op), (err), __func__, __LINE__)
/* Resumes an operation whose seal returned EFS_FS_WAIT: seal runs again;
 * |err| < 0 drops the built transaction (a FAILED outcome) and ends the
 * operation with that error. */
void efs_fs_op_resume_seal_at(struct efs_fs_op *op, int err, const char *func, int line);
#define efs_fs_op_resume_seal(op, err) efs_fs_op_resume_seal_at((op), (err), __func__, __LINE__)
/* Records why a step failed (|err|, |what|, etcd's |msg| or NULL), for the
 * warning of an EIO that follows. */
void efs_fs_op_note(struct efs_fs_op *op, int err, const char *what, const char *msg);
/* Instead of resuming a waiting prepare: starts over from the session step
 * with every record reloaded and planned again (what a compare failure
 * does), as a retry; -EIO once the retries are spent. */
void efs_fs_op_restart(struct efs_fs_op *op);

/* Plan helpers: add inode |ino| with lock |mode| (deduplicated, strongest
 * mode wins), and a key to read. -E2BIG beyond the bounds. */
int efs_fs_want(struct efs_fs_op *op, uint64_t ino, enum efs_lock_mode mode);
/* ... in exactly |mode|, without efs_fs_lock_mode's promotion (a data
 * request that settled its mode itself). */
int efs_fs_want_exact(struct efs_fs_op *op, uint64_t ino, enum efs_lock_mode mode);
/* The mode to ask for |ino| when |mode| is wanted: exclusive instead of
 * shared on a file this node has open for writing (engine.c says why). */
enum efs_lock_mode efs_fs_lock_mode(struct efs_fs *fs, uint64_t ino, enum efs_lock_mode mode);
struct efs_fs_kv *efs_fs_want_kv(struct efs_fs_op *op);
/* Reads the keys of |family| under inode |ino| (names only), at most
 * |limit| (0: all): the read's 1-based index in op->kv, or a negative
 * errno (-E2BIG beyond the bound). */
int efs_fs_want_keys(struct efs_fs_op *op, enum efs_meta_family family, uint64_t ino,
		     int64_t limit);
/* The cached record of a planned inode (NULL: it does not exist). */
const Etcfs__Inode *efs_fs_rec(const struct efs_fs_op *op, uint64_t ino);
int64_t efs_fs_rec_rev(const struct efs_fs_op *op, uint64_t ino);
/* Adds an inode write to op->out: |rec| is packed with the op id set. */
int efs_fs_put_inode(struct efs_fs_op *op, uint64_t ino, Etcfs__Inode *rec, bool is_new);
int efs_fs_del_inode(struct efs_fs_op *op, uint64_t ino);
/* Dirent helpers for build. */
int efs_fs_put_dirent(struct efs_fs_op *op, uint64_t parent, const char *name, size_t len,
		      uint64_t ino, uint32_t type, bool must_be_new, int64_t mod_rev);
int efs_fs_del_dirent(struct efs_fs_op *op, uint64_t parent, const char *name, size_t len,
		      int64_t mod_rev);
/* Starts the operation's transaction if it has none. 0 or -ENOMEM. */
int efs_fs_op_txn(struct efs_fs_op *op);
/* Deletes every key of |fam| of inode |ino| in the transaction. */
int efs_fs_del_family(struct efs_fs_op *op, enum efs_meta_family fam, uint64_t ino);
/* Deletes every key of a removed inode besides i/ (xattrs, holders,
 * extents, orphan) in the transaction. A regular file with data (|rec|'s
 * size or blocks, or a data state on this node) keeps its extent chunks
 * and gets a reclaim record instead, when the data path is built
 * (reclaim.c). */
int efs_fs_drop_inode_keys(struct efs_fs_op *op, uint64_t ino, const Etcfs__Inode *rec);

/* Reply helpers: fill a fuse_entry_param / attr reply from a record, with
 * kernel timeouts only under a held lock that is not being given up (the
 * entry of |name| in |parent| is recorded for the parent's lock ops). */
/*
 * A positive lookup of |name| in |parent| is about to hand out |ino|
 * (record |rec|): -ESTALE when the kernel may still hold the file under
 * another name there from before the directory's lock changed hands (a
 * peer renamed it meanwhile), at most twice per such name, else 0. Also
 * clears what an earlier ESTALE left for |name| (call it for every
 * lookup, |ino| 0 for a negative one).
 */
int efs_fs_kalias_check(struct efs_fs *fs, uint64_t parent, const char *name, size_t len,
			uint64_t ino, const Etcfs__Inode *rec);
/* |versioned|: the reply of a lookup or readdirplus, whose attributes the
 * kernel checks against the version it took before the request (not a
 * create, mkdir, mknod, symlink or link reply). */
void efs_fs_fill_entry(struct efs_fs *fs, uint64_t parent, const char *name, size_t len,
		       uint64_t ino, const Etcfs__Inode *rec, bool versioned,
		       struct fuse_entry_param *e);
double efs_fs_attr_timeout(struct efs_fs *fs, uint64_t ino);
/*
 * The attribute timeout of a SETATTR reply where the kernel applies it
 * without its version check (the one that drops a reply older than an
 * invalidation of the inode; before Linux 6.16): it can be applied after
 * our release's invalidation ran, so it carries no timeout: 0. An entry of an inode the
 * kernel creates for the reply is applied unversioned too; those keep
 * their timeout, and a release's invalidation that finds no inode while
 * the reply's reference is counted is issued again until the kernel has
 * created it (efs_inval_set_referenced).
 */
#define EFS_FS_UNVERSIONED_ATTR_TIMEOUT 0.0
/*
 * The attribute timeout of a SETATTR reply on an inode of |mode|:
 * efs_fs_attr_timeout's where the kernel versions these replies and the
 * inode is a file or a directory, else EFS_FS_UNVERSIONED_ATTR_TIMEOUT
 * (other kinds keep the zero timeout: nothing measured needs more).
 */
double efs_fs_setattr_timeout(struct efs_fs *fs, uint64_t ino, uint32_t mode);
/*
 * True when a kernel of release |release| (uname -r) drops the timeout of
 * a SETATTR reply that an invalidation of the inode overtook, as it does
 * for lookups and GETATTR (Linux commit 69efbff69f89, in 6.16): a release
 * at or after 6.16. Stable backports are not recognised (false).
 */
bool efs_fs_kernel_versions_setattr(const char *release);
void efs_fs_reply_entry(struct efs_fs_op *op, uint64_t parent, const char *name, size_t len,
			uint64_t ino, const Etcfs__Inode *rec, bool versioned);
void efs_fs_reply_attr(struct efs_fs_op *op, uint64_t ino, const Etcfs__Inode *rec);
/* Wall clock now, nanoseconds. */
int64_t efs_fs_now(void);
/* A deep copy of |rec| (efs_mem through protobuf). NULL on ENOMEM. */
Etcfs__Inode *efs_fs_rec_dup(const Etcfs__Inode *rec);
/* Counts one transaction of |origin| with outcome |oc|. */
void efs_fs_count_txn(struct efs_fs *fs, enum efs_fs_origin origin, enum efs_fs_outcome oc);
/* A mutation's reply (|r|, |resp| when there was no error), classified
 * and counted under |origin|: an error whose outcome is unknown (a lost
 * reply, a timeout) is UNKNOWN, any other error ERROR, failed compares
 * CONFLICT. */
enum efs_fs_outcome efs_fs_txn_outcome(struct efs_fs *fs, enum efs_fs_origin origin,
				       const struct efs_etcd_result *r,
				       const Etcdserverpb__TxnResponse *resp);
/* Counts the inode records (count-only range over i/). */
int efs_fs_count_inodes(struct efs_fs *fs, efs_etcd_range_cb cb, void *arg);
/* Sends the read-only transaction |t| (ranges only) unless |r|, the
 * result of building it, is an error, and frees |t|; |cb| runs once, as
 * for efs_etcd_txn, when it went out. Returns |r| or the send's error. */
int efs_fs_read_txn(struct efs_fs *fs, struct efs_etcd_txn *t, int r, efs_etcd_txn_cb cb,
		    void *arg);
/* Adds a read of inode |ino|'s record to |t|. */
int efs_fs_txn_read_inode(struct efs_fs *fs, struct efs_etcd_txn *t, uint64_t ino);

/* ---- Inode cache (inode.c) ---- */

int efs_fs_icache_init(struct efs_fs *fs);
void efs_fs_icache_done(struct efs_fs *fs);
/* Finds or creates the entry of |ino| (NULL: ENOMEM). */
struct efs_fs_inode *efs_fs_iget(struct efs_fs *fs, uint64_t ino);
struct efs_fs_inode *efs_fs_ifind(struct efs_fs *fs, uint64_t ino);
/* A read or write reply may have filled |in|'s pages in the kernel: it
 * becomes the most recent page-cached inode; past the cap the least
 * recent one's pages are dropped, and while the session is not ACTIVE
 * its own are dropped at once (fs.c). */
void efs_fs_note_kpages(struct efs_fs *fs, struct efs_fs_inode *in);
/* |in| is freed: off the page-cached list. */
void efs_fs_forget_kpages(struct efs_fs *fs, struct efs_fs_inode *in);
/* The session suspends: every page-cached inode's pages are dropped. */
void efs_fs_kpages_drop_all(struct efs_fs *fs);
/* Drops an operation reference; frees the entry when nothing holds it. */
void efs_fs_iput(struct efs_fs *fs, struct efs_fs_inode *in);
/* True when |in|'s record may be used now (lock held, same epoch). */
bool efs_fs_inode_valid(const struct efs_fs *fs, const struct efs_fs_inode *in);
/*
 * Caches filled under an inode's lock (names, listings, the extent map,
 * the page cache decision) store the grant id the lock was held under when
 * they were filled, and are valid only while that same grant is held: a
 * release, a recall or a session loss in between ends it.
 */
uint64_t efs_fs_grant(const struct efs_fs *fs, const struct efs_fs_inode *in);
bool efs_fs_grant_current(const struct efs_fs *fs, const struct efs_fs_inode *in, uint64_t grant);
/* Replaces the cached record (takes ownership of |rec|, NULL: gone). */
void efs_fs_inode_set(struct efs_fs *fs, struct efs_fs_inode *in, Etcfs__Inode *rec,
		      int64_t mod_rev, bool trusted);
/* Tells the inode cache's clients that |ino| was dropped (see the hooks). */
void efs_fs_inode_dropped(struct efs_fs *fs, uint64_t ino);
/*
 * The directory name cache: answers lookups with no etcd read while this
 * node holds the directory's lock (other nodes change names only under an
 * exclusive lock, which recalls ours). get: 1 (|*ino| set, 0 for a known
 * absent name, also any name missing from a complete cache) or 0 (not
 * cached). put with |ino| 0 records an absent name (false: not stored). This node's own
 * changes put what they committed (creates, unlinks) or forget the names
 * they touch and the completeness (links, renames, an unsettled outcome).
 * current: whether names read under grant |gen| when the directory's
 * mseq was |mseq| may be put now (the same grant, no name change of this
 * node since, none in flight). set_complete: a listing read from its first
 * page to its last, every page current under one grant and mseq, is all
 * there (its names put first).
 */
int efs_fs_dcache_get(struct efs_fs *fs, struct efs_fs_inode *dir, const char *name, size_t len,
		      uint64_t *ino, uint32_t *type);
bool efs_fs_dcache_put(struct efs_fs *fs, struct efs_fs_inode *dir, const char *name, size_t len,
		       uint64_t ino, uint32_t type);
void efs_fs_dcache_forget(struct efs_fs *fs, uint64_t dir, const char *name, size_t len);
void efs_fs_dcache_incomplete(struct efs_fs *fs, uint64_t dir);
/* The directory |dir|'s record is trusted under its lock's grant |gen|. */
bool efs_fs_dir_current(struct efs_fs *fs, struct efs_fs_inode *dir, uint64_t gen);
bool efs_fs_dcache_current(struct efs_fs *fs, struct efs_fs_inode *dir, uint64_t gen,
			   uint64_t mseq);
void efs_fs_dcache_set_complete(struct efs_fs *fs, struct efs_fs_inode *dir);
bool efs_fs_dcache_complete(struct efs_fs *fs, struct efs_fs_inode *dir);
/*
 * Reads the names of |dir| (locked by the caller's operation) into its
 * name cache in the background, once per grant: a directory of up to 8,192
 * names becomes complete, so that the lookups after a first one, present
 * names and missing ones, need no etcd read of their own (dir.c).
 */
void efs_fs_dcache_fill(struct efs_fs *fs, struct efs_fs_inode *dir);
/*
 * Takes, in the background, shared locks and records of up to 32 names of
 * |dir| not held yet besides |child| (which the caller's lookup locks
 * itself): for a complete name cache of at least 32 names, so that a stat
 * of every file costs a transaction per 32 files rather than per file.
 * Only locks free to take now (EFS_LOCK_F_TRY): a peer's lock is never
 * recalled for it (dir.c).
 */
void efs_fs_read_ahead(struct efs_fs *fs, struct efs_fs_inode *dir, uint64_t child);
/* Keeps |in| (a reference) among the last EFS_FS_AHEAD_MAX inodes read ahead. */
void efs_fs_ahead_keep(struct efs_fs *fs, struct efs_fs_inode *in);
#define EFS_FS_AHEAD_MAX 4096
/* A directory this node just made: empty, and complete under its grant. */
void efs_fs_dcache_new_empty(struct efs_fs *fs, struct efs_fs_inode *dir);
void efs_fs_dcache_clear(struct efs_fs_inode *dir);

/*
 * Lock ops (lockops.c): the kinds of inode locks, the ops of directories,
 * and the names each directory handed to the kernel with an entry timeout
 * (invalidated one by one when the directory's lock goes).
 */
enum efs_fs_lock_kind {
	EFS_FS_LOCK_OTHER = 0,	/* an inode not cached here: no ops */
	EFS_FS_LOCK_FILE = 1,	/* the data path's ops (file/lockops.c) */
	EFS_FS_LOCK_DIR = 2,
	EFS_FS_LOCK_SPECIAL = 3, /* symlinks, devices, FIFOs, sockets (file/lockops.c) */
};
/* Most names recorded per directory; beyond, entries get no timeout. */
#define EFS_FS_KNAMES_MAX 4096
void efs_fs_lockops_init(struct efs_fs *fs);
void efs_fs_lockops_kernel_gone(struct efs_fs *fs);

/*
 * Read pins (attr.c). read(2) asks the kernel's size (a GETATTR carrying
 * the file handle, when its attributes are stale) and then the pages (a
 * READ), and cuts the data at that size: the READ cannot move the size
 * up. So the GETATTR's reply, and an open for reading (whose read comes
 * next), keep the inode's lock pinned until the same thread's next
 * GETATTR with a handle or READ of the inode has pinned it, its FLUSH of
 * the inode, the handle's release, or EFS_FS_READPIN_MS: the size and
 * the pages of one read come from one grant.
 */
#define EFS_FS_READPIN_MS 50
/* Pins |ino|'s lock, which |held| pins, for |pid|'s read through |fh|. */
void efs_fs_readpin_take(struct efs_fs *fs, const struct efs_lock_req *held, uint64_t ino,
			 uint32_t pid, uint64_t fh);
/* Drops the pins of |ino| taken for |pid| (0: any) through |fh| (0: any). */
/* ... only those taken up to read pin sequence |seq| (attr.c). */
void efs_fs_readpins_drop_upto(struct efs_fs *fs, uint64_t ino, uint32_t pid, uint64_t fh,
			       uint64_t seq);
void efs_fs_readpins_drop(struct efs_fs *fs, uint64_t ino, uint32_t pid, uint64_t fh);
/* Drops every read pin (teardown). */
void efs_fs_readpins_drop_all(struct efs_fs *fs);
void efs_fs_lockops_done(struct efs_fs *fs);
/* The entry timeout for |name| in |parent| (0 without the parent's lock,
 * or when the name cannot be recorded); records the name. */
double efs_fs_entry_timeout(struct efs_fs *fs, uint64_t parent, const char *name, size_t len);
size_t efs_fs_knames_count(const struct efs_fs_inode *dir);
/* Fault-hook builds: a setxattr of this name force-releases the inode's
 * lock ("0") or downgrades it ("1"); true when |name| was the hook's (the
 * request is answered). */
#define EFS_FS_FAULT_RELEASE_XATTR "user.etcfs.fault.release"
bool efs_fs_fault_release(fuse_req_t req, uint64_t ino, const char *name, const char *value,
			  size_t size);

/* Kernel references: +1 per entry reply, -n per forget. */
void efs_fs_inode_ref_kernel(struct efs_fs *fs, uint64_t ino);
void efs_fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
void efs_fs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);

/* ---- Handlers (ns.c, attr.c, dir.c, xattr.c; the data path's are in data.h) ---- */

void efs_fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
void efs_fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void efs_fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		    struct fuse_file_info *fi);
void efs_fs_readlink(fuse_req_t req, fuse_ino_t ino);
void efs_fs_statfs(fuse_req_t req, fuse_ino_t ino);

void efs_fs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev);
void efs_fs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
void efs_fs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name);
void efs_fs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		   struct fuse_file_info *fi);
void efs_fs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname);
void efs_fs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void efs_fs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void efs_fs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		   const char *newname, unsigned int flags);
/*
 * Relatime: after a read or readdir of |ino| whose record is |rec|,
 * writes atime = now in the background (exclusive lock, one transaction)
 * when atime is not after mtime or ctime, or is a day old; nothing under
 * noatime or read-only. efs_fs_atime_due is the pure rule.
 */
void efs_fs_touch_atime(struct efs_fs *fs, uint64_t ino, const Etcfs__Inode *rec);
bool efs_fs_atime_due(const Etcfs__Inode *rec, int64_t now);
/*
 * Starts the reclaim of an unlinked inode whose last handle on this node
 * closed: under the inode's exclusive lock it drops this node's open
 * reference and, when no other node holds one (compared in the same
 * transaction), deletes the inode and leaves a reclaim record.
 */
void efs_fs_reclaim(struct efs_fs *fs, uint64_t ino);
/* The same for an orphan a pass found with no reference left whose
 * unlinker may still be alive: a directory is left alone (directories
 * keep the local rule: only their unlinker's end frees them). */
void efs_fs_reclaim_file(struct efs_fs *fs, uint64_t ino);
/* The next reclaim pass reads every orphan again (a lost session took
 * this node's references and left handles that no longer count). */
void efs_fs_reclaim_rescan(struct efs_fs *fs);
/* This node's handles on |in| opened under the current session. */
uint32_t efs_fs_live_opens(const struct efs_fs *fs, const struct efs_fs_inode *in);

/*
 * Open references (reclaim.c; docs/DESIGN.md "Open files across nodes").
 * held: this node's r/<ino><node> exists under the current session.
 * put_txn: adds its put (on the session lease) to |t|'s success branch;
 * the caller sets |in|->oref_epoch/oref_rev once |t| committed
 * (efs_fs_oref_set). take: the same as a transaction of its own
 * (session guard), |cb| runs once with 0 or -EIO (not if it returns an
 * error, nor once efs_fs_reclaim_done has detached it at unmount). cmp_alone: compares in |t| that no other node holds a
 * reference on |ino|. count: this node's and other nodes' references on
 * |ino| in a keys-only read of the r/<ino> range (keys of another inode
 * are ignored).
 */
bool efs_fs_oref_held(const struct efs_fs *fs, const struct efs_fs_inode *in);
int efs_fs_oref_put_txn(struct efs_fs *fs, struct efs_etcd_txn *t, uint64_t ino);
void efs_fs_oref_set(struct efs_fs *fs, uint64_t ino, int64_t rev);
/* A take's put whose outcome is unknown: the entry's drop still runs. */
void efs_fs_oref_set_unsure(struct efs_fs *fs, uint64_t ino);
int efs_fs_oref_take(struct efs_fs *fs, uint64_t ino, void (*cb)(void *arg, int status),
		     void *arg);
int efs_fs_oref_cmp_alone(struct efs_fs *fs, struct efs_etcd_txn *t, uint64_t ino);
void efs_fs_oref_count(struct efs_fs *fs, const struct efs_fs_kv *kv, uint64_t ino, bool *mine,
		       size_t *others);

void efs_fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void efs_fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi);
void efs_fs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			struct fuse_file_info *fi);
void efs_fs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void efs_fs_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);

void efs_fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
		     size_t size, int flags);
void efs_fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void efs_fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void efs_fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

/* Handles (attr.c). */
struct efs_fs_handle *efs_fs_handle_new(struct efs_fs *fs, uint64_t ino, bool dir);
void efs_fs_handle_free(struct efs_fs *fs, struct efs_fs_handle *h);
/* -EIO when the handle predates a lost session, else 0. */
int efs_fs_handle_check(const struct efs_fs *fs, const struct efs_fs_handle *h);
/* The handle stored in |fi| (NULL without one). */
static inline struct efs_fs_handle *efs_fs_fh_of(const struct fuse_file_info *fi)
{
	return fi ? (struct efs_fs_handle *)(uintptr_t)fi->fh : NULL;
}

/* ---- Pure helpers (unit-tested) ---- */

/*
 * Operation ids (FORMAT.md section 4): |node| NUL |generation| BE64
 * |seq| BE64 into |buf| (EFS_FS_OPID_MAX bytes). Returns the length, or
 * -EINVAL for an invalid node id.
 */
int efs_fs_opid_encode(uint8_t *buf, const char *node, uint64_t generation, uint64_t seq);
/* Parses an op id; |node| gets EFS_META_NODE_MAX + 1 bytes. -EINVAL. */
int efs_fs_opid_decode(const uint8_t *buf, size_t len, char *node, uint64_t *generation,
		       uint64_t *seq);
/* True when |a| and |b| are the same non-empty id. */
bool efs_fs_opid_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

/*
 * setattr on |rec| (FUSE_SET_ATTR_* in |to_set|, values in |attr|) at
 * wall time |now|: mode (type bits kept), uid/gid (clearing S_ISUID, and
 * S_ISGID when group-executable, on non-directories unless the mode is set
 * in the same request), size, atime/mtime (explicit or *_NOW), ctime
 * (explicit, else |now| whenever anything changed). Returns 0, or
 * -EINVAL (size on a non-regular file: -EISDIR for directories).
 */
int efs_fs_setattr_apply(Etcfs__Inode *rec, const struct stat *attr, int to_set, int64_t now);

/*
 * Owner and mode of a new inode in |parent| (set-group-ID directories
 * give their group, and directories inherit S_ISGID); |mode| holds the
 * type and permission bits asked for, |umask| is applied unless
 * |dont_mask|.
 */
void efs_fs_new_owner(const Etcfs__Inode *parent, uid_t uid, gid_t gid, mode_t mode,
		      mode_t umask, bool apply_umask, uint32_t *ret_mode, uint32_t *ret_uid,
		      uint32_t *ret_gid);

/*
 * How long (ns) the kernel may cache an answer given at mono time |now|:
 * |cache_ns|, but never past the point where the session would suspend
 * (lease |deadline| - TTL/2; |ttl_s| 0: unknown, TTL/2 is then taken as
 * 2 * |cache_ns|, the cache timeout being TTL/4). 0 when that point has
 * passed: a loop lagging behind its renewals never lets kernel caches
 * outlive the locks.
 */
uint64_t efs_fs_cache_bound(uint64_t cache_ns, uint64_t now, uint64_t deadline, int64_t ttl_s);

/*
 * Readdir positions: "." is 0, ".." 1, entry i is i + 2. For a request at
 * |off| with |nents| entries known, returns the entry index to emit next
 * (-1 for ".", -2 for ".."), or nents when more must be read.
 */
long efs_fs_dir_index(off_t off, size_t nents);

/*
 * Xattr rules: 0, -EPERM (trusted.* by a non-root caller, for set and
 * remove), -ENODATA (trusted.* read by a non-root caller), -E2BIG (a
 * value over EFS_META_XATTR_VALUE_MAX), -ERANGE/-EINVAL (bad name).
 * |write| is set/remove.
 */
int efs_fs_xattr_check(const char *name, size_t value_len, uid_t uid, bool write);

/*
 * Removes |ino|'s security.capability, if it has one, under the inode's
 * exclusive lock, as a write must (the kernel does it before a write
 * through the page cache, not on a direct_io handle), for the request
 * |rq| (the write's: its lock wait ends on FUSE_INTERRUPT, and a failure
 * is answered through it). |cb| gets 0 (removed or there was none) or a
 * negative errno, once the operation has let its locks and mutexes go; 0
 * when started, else a negative errno (then |cb| is never called).
 */
int efs_fs_xattr_kill_caps(struct efs_fs *fs, struct efs_fs_rq *rq, uint64_t ino,
			   void (*cb)(void *arg, int err), void *arg);
/* True while |in| is known to have no security.capability: the grant the
 * last look found none under is still held. */
bool efs_fs_known_no_caps(const struct efs_fs *fs, const struct efs_fs_inode *in);

/*
 * POSIX ACLs in the posix_acl_xattr format. efs_fs_acl_to_mode: the
 * permission bits an access ACL implies (the mask stands for the group
 * when present) and whether it says no more than the mode. acl_chmod:
 * rewrites an access ACL in place after a chmod to |mode|. acl_inherit: a
 * copy of the parent's default ACL becomes the new inode's access ACL,
 * masked by the create |mode| whose permission bits it then rewrites;
 * returns 1 when the result must be stored, 0 when the mode says it all.
 * -EINVAL for a malformed ACL.
 */
int efs_fs_acl_to_mode(const uint8_t *v, size_t len, uint32_t *perm, bool *minimal);
int efs_fs_acl_chmod(uint8_t *v, size_t len, uint32_t mode);
int efs_fs_acl_inherit(uint8_t *v, size_t len, uint32_t *mode);

/*
 * access(2) on a record for a caller (|uid|, |gid|, supplementary
 * |groups|): 0 or -EACCES. |mask| is F_OK or R_OK|W_OK|X_OK.
 */
int efs_fs_access_check(const Etcfs__Inode *rec, int mask, uid_t uid, gid_t gid,
			const gid_t *groups, size_t ngroups);

/* ---- Delegated namespace changes (batch.c) ---- */

struct efs_fs_batch;
int efs_fs_batch_init(struct efs_fs *fs);
void efs_fs_batch_free(struct efs_fs *fs);
/* Stops the batch's timers (efs_fs_abandon: the loop's clients are gone). */
void efs_fs_batch_abandon(struct efs_fs *fs);
/* Whether a batch collects changes or is in flight: every other etcd
 * read or commit of the fs waits for it (efs_fs_batch_wait_op). */
bool efs_fs_batch_busy(const struct efs_fs *fs);
/* Whether |op|, built now, may join the batch instead of committing. */
bool efs_fs_batch_eligible(const struct efs_fs_op *op);
/* Merges |op|'s built transaction (guards included) into the batch: 0,
 * -E2BIG (the batch is full and was sent: wait for it and build again),
 * -EAGAIN (in flight: the same), -EINVAL (not batchable), -ENOMEM. */
int efs_fs_batch_add(struct efs_fs_op *op);
/* Records that the batch changed |ino| (|pin|: its new lock's pin, taken
 * over; |oref|: its open reference rides the batch). */
int efs_fs_batch_note(struct efs_fs_op *op, uint64_t ino, bool is_new, void *pin, bool oref);
/* 0: no batch; 1: |op| waits (efs_fs_op_batch_resume once it ended). */
int efs_fs_batch_wait_op(struct efs_fs_op *op);
/* The engine's resume of an operation that waited for a batch. */
void efs_fs_op_batch_resume(struct efs_fs_op *op);
/*
 * Makes every change answered so far durable: 1 when there is nothing to
 * wait for, 0 (|cb| later with 0 or -EIO), or a negative errno: -EIO once
 * after a batch failed (then no longer).
 */
int efs_fs_batch_sync(struct efs_fs *fs, void (*cb)(void *arg, int status), void *arg);
