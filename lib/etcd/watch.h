/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Watches. A watch stream (struct efs_etcd_watch_stream) is one Watch
 * bidirectional stream on one channel carrying many watchers (struct
 * efs_etcd_watcher), each with a client-chosen non-zero id. Several streams
 * may be open on one client (lock traffic on the priority channel, the rest
 * on the bulk one).
 *
 * When the stream ends (member killed, connection lost, leaderless member with
 * hasleader) it is reopened with backoff, and every watcher is created again
 * from the revision after the last one it delivered, so the caller sees every
 * event once, in order. etcd checks the stream's auth token at each create; a
 * create refused with "invalid auth token" (an expired simple token on a
 * long-lived stream) is retried once after a unary call has made the client
 * renew its token, on a new stream that all watchers move to. A response split
 * into fragments is delivered as one update once its last fragment arrives;
 * revisions advance only after whole updates.
 *
 * Everything runs on the client's loop thread. Callbacks never run inline
 * from the call that registered them.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd/etcd.h"
#include "kv.pb-c.h"

struct efs_etcd_watch_stream;
struct efs_etcd_watcher;

enum efs_etcd_watch_kind {
	/* The watcher exists on the server (first creation only; resumes
	 * after a reconnect are silent). |revision| is the store revision;
	 * with start_revision 0 events begin after it. */
	EFS_ETCD_WATCH_CREATED = 1,
	/* One or more events of one or more revisions, in revision order. */
	EFS_ETCD_WATCH_EVENTS,
	/* A progress notice for this watcher: nothing in range changed up to
	 * |revision|. */
	EFS_ETCD_WATCH_PROGRESS,
	/* Final. The revision the watcher needs was compacted: events are
	 * lost, the caller must re-list (Range) and watch again from that
	 * Range's revision + 1. |compact_revision| is the oldest revision
	 * kept. Status EFS_ETCD_ECOMPACTED (-ESTALE, grpc.h). */
	EFS_ETCD_WATCH_COMPACTED,
	/* Final. The watcher ended: status 0 when the caller's cancel was
	 * confirmed; otherwise creation or the server failed it, with the
	 * errnos of grpc.c's table: -EPERM (permission denied), -EACCES
	 * (invalid auth token, old auth revision), -EINVAL (empty range,
	 * duplicate id), -ESHUTDOWN (the client is closing), -EIO (any other
	 * reason, in |reason|). */
	EFS_ETCD_WATCH_CANCELED,
};

/* Borrowed for the duration of the callback. */
struct efs_etcd_watch_update {
	enum efs_etcd_watch_kind kind;
	int64_t revision;          /* header revision of the (last) response */
	Mvccpb__Event *const *events;
	size_t n_events;
	int64_t compact_revision;  /* COMPACTED only */
	const char *reason;        /* cancel reason, "" if none; never NULL */
};

/*
 * Called for each update of a watcher. |status| is 0 except for the final
 * kinds above. After a final update the watcher is inert and the caller
 * must still efs_etcd_watcher_free it. The callback may free its watcher
 * or create others; it must not free the stream.
 */
typedef void (*efs_etcd_watch_cb)(struct efs_etcd_watcher *w, int status,
				  const struct efs_etcd_watch_update *u, void *arg);

/* Runs once; status 0, or -ECANCELED when the watcher ended first (or was
 * freed: then the callback still runs), or a Put error for a barrier. */
typedef void (*efs_etcd_watch_wait_cb)(struct efs_etcd_watcher *w, int status, void *arg);

struct efs_etcd_watch_opts {
	const void *key;       /* required; 1 or more bytes ("\0" for all) */
	size_t key_len;
	/* One key when NULL and !prefix; "\0" means all keys >= key. */
	const void *range_end;
	size_t range_end_len;
	bool prefix;           /* every key starting with |key| */
	int64_t start_revision; /* 0: from now on */
	bool prev_kv;
	bool progress_notify;
	bool no_put;           /* filters */
	bool no_delete;
};

/*
 * Opens a watch stream on |channel| of |c|. The HTTP/2 stream is opened at
 * once and reopened whenever it ends. Errors: -EINVAL, -ENOMEM, -ESHUTDOWN.
 */
int efs_etcd_watch_stream_new(struct efs_etcd_watch_stream **ret, struct efs_etcd *c,
			      enum efs_etcd_channel channel);

/*
 * Closes the stream and frees it and every watcher still on it (their
 * callbacks and pending waits do not run; watcher handles become invalid).
 * Must be called before the client is freed, never from a watch callback.
 * Accepts NULL; returns NULL.
 */
struct efs_etcd_watch_stream *efs_etcd_watch_stream_free(struct efs_etcd_watch_stream *ws);

/*
 * Creates a watcher on |ws|. Its CREATED update (or a CANCELED one when
 * etcd refuses it) arrives later. Errors: -EINVAL (no key, prefix and
 * range_end both set), -ENOMEM.
 */
int efs_etcd_watcher_new(struct efs_etcd_watcher **ret, struct efs_etcd_watch_stream *ws,
			 const struct efs_etcd_watch_opts *o, efs_etcd_watch_cb cb, void *arg);

/*
 * Asks etcd to cancel |w|; a CANCELED update with status 0 confirms it (no
 * events are delivered after this call). Returns 0, or -EALREADY when |w|
 * has ended or a cancel is pending.
 */
int efs_etcd_watcher_cancel(struct efs_etcd_watcher *w);

/*
 * Frees |w| at once (cancelling it on the server if still active); no
 * callback of |w| runs after this except its pending waits, which complete
 * with -ECANCELED. May be called from |w|'s own callback. Accepts NULL;
 * returns NULL.
 */
struct efs_etcd_watcher *efs_etcd_watcher_free(struct efs_etcd_watcher *w);

/* The id of |w| on its stream (non-zero), and the next revision it will
 * deliver (last delivered + 1; 0 before creation with start revision 0). */
int64_t efs_etcd_watcher_id(const struct efs_etcd_watcher *w);
int64_t efs_etcd_watcher_next_rev(const struct efs_etcd_watcher *w);

/*
 * Calls |cb| once |w| has delivered every event up to revision |rev|
 * (inclusive): when an update of revision >= |rev| has been delivered, or
 * at once (but later, not inline) when one already has been. Nothing makes
 * the revision advance by itself when no key in range changes: see
 * efs_etcd_watch_barrier. Errors: -EINVAL, -ENOMEM, -ECANCELED (ended).
 */
int efs_etcd_watch_wait_rev(struct efs_etcd_watcher *w, int64_t rev, efs_etcd_watch_wait_cb cb,
			    void *arg);

/*
 * A sync barrier: Puts |key| (a sentinel inside |w|'s range, value empty)
 * and waits until |w| has delivered that Put's event, so everything
 * committed before the barrier has been delivered too. Progress replies
 * alone cannot do this on etcd 3.4.23: a progress reply can run ahead of
 * events still queued for a lagging watcher. The sentinel's own
 * event is delivered to the watcher like any other. |w| must not filter
 * out puts. Errors: -EINVAL (no_put watcher), -ENOMEM, -ECANCELED.
 */
int efs_etcd_watch_barrier(struct efs_etcd_watcher *w, const void *key, size_t key_len,
			   efs_etcd_watch_wait_cb cb, void *arg);

/* Counters of a stream, for metrics and tests. */
struct efs_etcd_watch_stream_stats {
	uint64_t opens;        /* HTTP/2 streams opened (1 + reopens) */
	uint64_t responses;    /* WatchResponse messages handled */
	uint64_t fragments;    /* of those, with fragment=true */
	uint64_t events;       /* events delivered */
};
void efs_etcd_watch_stream_get_stats(const struct efs_etcd_watch_stream *ws,
				     struct efs_etcd_watch_stream_stats *ret);
/* Watch streams of this process opened again after one ended (a lost
 * connection, a failover), over all clients: for metrics. */
uint64_t efs_etcd_watch_reopens(void);

/*
 * Fault hook (compiled in when EFS_FAULT_HOOKS): every response received on
 * |ws| from now on is held for |ms| milliseconds and then handled, in
 * order; 0 turns it off (held ones are still delivered in order).
 */
void efs_etcd_watch_stream_fault_delay(struct efs_etcd_watch_stream *ws, uint32_t ms);
