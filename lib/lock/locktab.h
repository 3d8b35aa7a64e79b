/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The lock table of the lock cache (lock.h), pure: no I/O, no clock of its
 * own. One entry per inode this node holds or is acquiring or releasing a
 * lock on, found by inode number (hash), kept in least-recently-used order
 * (an entry moves to the tail when used or unpinned), with pin counts, the
 * kernel-cache deadline of each lock, and the choice of which idle locks to
 * release in one batch.
 *
 * Removing a pinned entry (forget: the inode was deleted, or the session
 * was lost) detaches it from the table at once; it is freed when its last
 * pin goes, so that the operations holding pins keep valid pointers.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum efs_locktab_state {
	EFS_LOCKTAB_HELD = 0,  /* |mode| is held and usable */
	EFS_LOCKTAB_ACQUIRING, /* a transaction is taking or upgrading it */
	EFS_LOCKTAB_GRANTING,  /* a creating transaction carries its holder key */
	EFS_LOCKTAB_RELEASING, /* a transaction is deleting its holder key */
};

struct efs_locktab_entry {
	uint64_t ino;
	int mode; /* enum efs_lock_mode held in etcd (0 while first acquiring) */
	enum efs_locktab_state state;
	uint32_t pins;
	bool dead;		  /* detached: freed with its last pin */
	uint64_t last_used_ns;	  /* last pin, unpin or touch */
	uint64_t kcache_until_ns; /* the kernel may cache under it until then */
	uint64_t token;		  /* grant token written in the holder key */
	uint64_t grant;		  /* id of the current continuous hold (lock.h) */
	int64_t grant_rev;	  /* an etcd revision at or after its last grant */
	uint32_t pin_seq;	  /* pins ever taken (a preparation is void once it moves) */
	uint32_t prep_seq;	  /* pin_seq when the last preparation started */
	uint32_t xpin_seq;	  /* pins taken for exclusive access (lock.c) */
	uint64_t voided_ns;	  /* a preparation of this hold was voided by pins then */
	int64_t recall_floor;	  /* recall keys created before this revision were gone
				   * when it was granted (lock.c) */
	uint32_t prep_xseq;	  /* xpin_seq when the last preparation started */
	uint8_t kind;		  /* which ops the lock uses */
	uint8_t prep_to;	  /* the mode its last preparation was for */
	uint8_t rel_to;		  /* RELEASING: the mode it goes down to */
	bool prep;		  /* its ops (invalidate, sync) run: never selected */
	uint8_t prep_stage;	  /* ... 1: invalidate, 2: sync (for diagnostics) */
	bool prepared;		  /* its ops ran and nothing pinned it since */
	bool draining;		  /* no new cache hits: an upgrade waits for pins */
	bool recalled;		  /* a forced release waits: only writeback hits */
	bool inval_serving;	  /* its invalidate serves every request meanwhile */
	bool prep_keeps;	  /* pins do not void its preparation (the kind's ops) */
	bool rel_txn;		  /* its release rides a user's transaction (lock.c) */
	uint8_t rel_grants;	  /* ... and grants the lock to this many waiters */
	bool rel_early;		  /* rel_txn: an idle release riding another transaction */
	uint64_t granted_ns;	  /* when its current hold was granted (monotonic) */
	bool heat_noted;	  /* a peer's recall of this hold was noted (lock/heat.h) */
	bool hold_deferred;	  /* ... and waits for the minimum hold to end (lock.c) */
	void *owner;		  /* for the table's user (lock.c: waiting acquisitions) */
	/* private */
	struct efs_locktab_entry *hnext;
	struct efs_locktab_entry *lprev, *lnext;
};

struct efs_locktab {
	size_t max_cached; /* bound on entries (the release selection enforces it) */
	size_t count;	   /* entries in the table (dead ones excluded) */
	size_t nbuckets;   /* power of two */
	struct efs_locktab_entry **buckets;
	struct efs_locktab_entry lru;  /* list head: head.lnext is the oldest */
	struct efs_locktab_entry dead; /* detached entries still pinned */
};

/* What efs_locktab_select picks. */
struct efs_locktab_sel {
	uint64_t now;
	uint64_t idle_ns;   /* unpinned and unused this long */
	bool all;	    /* every unpinned held lock, idle or not (clean leave) */
	bool ignore_kcache; /* the kernel's caches were invalidated */
};

/* |max_cached| 0 means no bound. -ENOMEM. */
int efs_locktab_init(struct efs_locktab *t, size_t max_cached);
/* Frees every entry, dead ones included. */
void efs_locktab_done(struct efs_locktab *t);

/* The entry of |ino| or NULL. */
struct efs_locktab_entry *efs_locktab_find(const struct efs_locktab *t, uint64_t ino);

/* Adds an entry for |ino| (state ACQUIRING, mode 0, no pins, newest in LRU
 * order). -EEXIST, -ENOMEM. */
int efs_locktab_add(struct efs_locktab *t, uint64_t ino, uint64_t now,
		    struct efs_locktab_entry **ret);

/* Detaches |e|: freed now when unpinned, else at its last unpin. */
void efs_locktab_remove(struct efs_locktab *t, struct efs_locktab_entry *e);
/* Detaches every entry (as efs_locktab_remove). */
void efs_locktab_remove_all(struct efs_locktab *t);

void efs_locktab_pin(struct efs_locktab *t, struct efs_locktab_entry *e, uint64_t now);
/* Unpins; a dead entry is freed with its last pin (do not touch it after). */
void efs_locktab_unpin(struct efs_locktab *t, struct efs_locktab_entry *e, uint64_t now);
/* Marks |e| used now (newest in LRU order). */
void efs_locktab_touch(struct efs_locktab *t, struct efs_locktab_entry *e, uint64_t now);
/* The kernel may cache under |e| until |until_ns| (the later deadline wins). */
void efs_locktab_note_kcache(struct efs_locktab_entry *e, uint64_t until_ns);

/*
 * Chooses up to |max| held, unpinned entries to release, oldest first, into
 * |out|: those unused for sel->idle_ns, and while the table holds more than
 * max_cached entries also the oldest others until the excess is covered;
 * never one whose kernel-cache deadline is still ahead (unless
 * sel->ignore_kcache), nor one whose ops are running (|prep|). With sel->all, every unpinned held entry qualifies.
 * Returns the number chosen; the entries are left as they are.
 */
size_t efs_locktab_select(const struct efs_locktab *t, const struct efs_locktab_sel *sel,
			  struct efs_locktab_entry **out, size_t max);

/*
 * The earliest time after |now| at which an idle entry becomes eligible
 * (UINT64_MAX: none is waiting to be), for a timer.
 */
uint64_t efs_locktab_next_idle_ns(const struct efs_locktab *t, uint64_t idle_ns, uint64_t now);

/* Iteration over the table's entries in LRU order (oldest first): NULL at
 * the end. The entry returned may not be removed before calling next. */
struct efs_locktab_entry *efs_locktab_first(const struct efs_locktab *t);
struct efs_locktab_entry *efs_locktab_next(const struct efs_locktab *t,
					   const struct efs_locktab_entry *e);
