/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Typed wrappers over efs_etcd_call() for the KV, Maintenance, Cluster and
 * Auth RPCs. They only build the request from plain arguments and hand the
 * callback the response with its real type; retries, deadlines and the
 * errno table are the client's (etcd.h).
 *
 * Common rules, as for efs_etcd_call(): every function runs on the client's
 * loop thread; when it returns an error the callback never runs, otherwise
 * the callback runs exactly once, later. Keys and values are byte strings
 * (|key|, |keylen|) and are copied before the function returns. |co| may be
 * NULL (default call options).
 *
 * Every callback gets the call's result |r| and |resp|, which is r->resp
 * with its real type when r->err == 0 and NULL otherwise. |resp| is freed
 * after the callback returns unless the callback takes ownership by setting
 * r->resp to NULL (then free it with protobuf_c_message_free_unpacked(msg,
 * efs_mem_protobuf())).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd/etcd.h"
#include "rpc.pb-c.h"

/* Default page size of efs_etcd_range_paged(). */
#define EFS_ETCD_PAGE_SIZE_DEFAULT 1000

/*
 * Which keys a Range or DeleteRange covers, besides |key| itself. At most
 * one of |prefix| and |range_end| may be set; neither means the one key.
 * |prefix| means every key starting with |key|; |range_end| is the exclusive
 * end as etcd takes it (a single "\0" byte: every key >= |key|).
 */
struct efs_etcd_range_opts {
	bool prefix;
	const void *range_end;
	size_t range_end_len;
	/* At most this many keys (0: no limit); the response's |more| says the
	 * range was cut and |count| still counts the whole range. */
	int64_t limit;
	/* Read at this store revision (0: the latest). */
	int64_t revision;
	bool keys_only;
	bool count_only;
	/* Served by the member the call reaches, without the leader: maybe
	 * stale, but it works on a minority and on learners. */
	bool serializable;
};

struct efs_etcd_put_opts {
	int64_t lease;    /* 0: no lease (a Put detaches any previous lease) */
	bool prev_kv;     /* return the previous key-value in the response */
	bool ignore_value; /* keep the current value (key must exist) */
	bool ignore_lease; /* keep the current lease (key must exist) */
};

struct efs_etcd_delete_opts {
	bool prefix;
	const void *range_end;
	size_t range_end_len;
	bool prev_kv; /* return the deleted key-values */
};

typedef void (*efs_etcd_range_cb)(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp,
				  void *arg);
typedef void (*efs_etcd_put_cb)(struct efs_etcd_result *r, Etcdserverpb__PutResponse *resp,
				void *arg);
typedef void (*efs_etcd_delete_cb)(struct efs_etcd_result *r,
				   Etcdserverpb__DeleteRangeResponse *resp, void *arg);
typedef void (*efs_etcd_txn_cb)(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp,
				void *arg);
typedef void (*efs_etcd_compact_cb)(struct efs_etcd_result *r,
				    Etcdserverpb__CompactionResponse *resp, void *arg);
typedef void (*efs_etcd_status_cb)(struct efs_etcd_result *r, Etcdserverpb__StatusResponse *resp,
				   void *arg);
typedef void (*efs_etcd_member_list_cb)(struct efs_etcd_result *r,
					Etcdserverpb__MemberListResponse *resp, void *arg);
typedef void (*efs_etcd_authenticate_cb)(struct efs_etcd_result *r,
					 Etcdserverpb__AuthenticateResponse *resp, void *arg);

/*
 * Fills |req| (which the caller has initialised with
 * ETCDSERVERPB__RANGE_REQUEST__INIT) from |key| and |o| (NULL: one key,
 * latest, linearizable). The request borrows |key|, |o|'s range end and
 * |prefix_buf| (at least |keylen| bytes, written with the prefix end; may be
 * NULL unless o->prefix), so they must outlive it. Used by the wrappers
 * below and by Txn builders that put a Range inside a transaction. Errors:
 * -EINVAL (empty key, both prefix and range_end, prefix without
 * |prefix_buf|, negative limit or revision).
 */
int efs_etcd_range_fill(Etcdserverpb__RangeRequest *req, const void *key, size_t keylen,
			const struct efs_etcd_range_opts *o, uint8_t *prefix_buf);

/*
 * Range: reads |key| (or the range |o| describes). Errors: -EINVAL (see
 * efs_etcd_range_fill), and those of efs_etcd_call().
 */
int efs_etcd_range(struct efs_etcd *c, const void *key, size_t keylen,
		   const struct efs_etcd_range_opts *o, const struct efs_etcd_callopts *co,
		   efs_etcd_range_cb cb, void *arg);

/*
 * Put: sets |key| to |value| (|vallen| may be 0). Errors: -EINVAL (empty
 * key), and those of efs_etcd_call().
 */
int efs_etcd_put(struct efs_etcd *c, const void *key, size_t keylen, const void *value,
		 size_t vallen, const struct efs_etcd_put_opts *o,
		 const struct efs_etcd_callopts *co, efs_etcd_put_cb cb, void *arg);

/* DeleteRange: deletes |key| or the range |o| describes. Errors: -EINVAL
 * (empty key, both prefix and range_end), and those of efs_etcd_call(). */
int efs_etcd_delete(struct efs_etcd *c, const void *key, size_t keylen,
		    const struct efs_etcd_delete_opts *o, const struct efs_etcd_callopts *co,
		    efs_etcd_delete_cb cb, void *arg);

/* Txn: sends |req| as is (borrowed; serialised before this returns). A
 * compare that fails is not an error: resp->succeeded is false. */
int efs_etcd_txn(struct efs_etcd *c, const Etcdserverpb__TxnRequest *req,
		 const struct efs_etcd_callopts *co, efs_etcd_txn_cb cb, void *arg);

/* Compact: drops history before |revision|; with |physical| the reply comes
 * only after the space was reclaimed on disk. Errors: -EINVAL (revision <=
 * 0), and those of efs_etcd_call(); compacting an already compacted revision
 * fails with the client's compacted errno. */
int efs_etcd_compact(struct efs_etcd *c, int64_t revision, bool physical,
		     const struct efs_etcd_callopts *co, efs_etcd_compact_cb cb, void *arg);

/* Maintenance Status of the member the call reaches (the channel's current
 * endpoint: use one client per endpoint to ask each member). */
int efs_etcd_status(struct efs_etcd *c, const struct efs_etcd_callopts *co,
		    efs_etcd_status_cb cb, void *arg);

/* Cluster MemberList, as the member the call reaches sees it. */
int efs_etcd_member_list(struct efs_etcd *c, const struct efs_etcd_callopts *co,
			 efs_etcd_member_list_cb cb, void *arg);

/* Auth Authenticate. The client authenticates by itself when its options
 * name a user; this is for tools and tests. Errors: -EINVAL (NULL name or
 * password), and those of efs_etcd_call(). */
int efs_etcd_authenticate(struct efs_etcd *c, const char *name, const char *password,
			  const struct efs_etcd_callopts *co, efs_etcd_authenticate_cb cb,
			  void *arg);

/* ---- Paged range ---- */

struct efs_etcd_paged_opts {
	/* The range, as in efs_etcd_range_opts. */
	bool prefix;
	const void *range_end;
	size_t range_end_len;
	/* Keys per Range call (0: EFS_ETCD_PAGE_SIZE_DEFAULT). */
	int64_t page_size;
	/* Revision to read at (0: the latest, pinned by the first page). */
	int64_t revision;
	bool keys_only;
	bool serializable;
};

/*
 * Called with each page in key order (borrowed for the call). |revision| is
 * the revision every page is read at. Return 0 to go on, or a negative errno
 * to stop: the paged range then ends with that error.
 */
typedef int (*efs_etcd_page_cb)(const Etcdserverpb__RangeResponse *page, int64_t revision,
				void *arg);

/*
 * Ends a paged range, exactly once. With a page callback |all| is NULL;
 * without one |all| holds every key-value of the range in key order, |more|
 * false and |count| the number of keys, and header.revision the pinned
 * revision. |all| is r->resp: take it by setting r->resp to NULL.
 * r->err is -ECANCELED after efs_etcd_paged_cancel(), the page callback's
 * error, or the failed call's error. If the pinned revision is compacted
 * between pages, r->err is the client's compacted errno and r->message says
 * the range must be read again at the latest revision.
 */
typedef void (*efs_etcd_paged_done_cb)(struct efs_etcd_result *r,
				       Etcdserverpb__RangeResponse *all, void *arg);

struct efs_etcd_paged;

/*
 * Reads |key| / |o|'s range in pages: each next page starts at the last key
 * + "\0", at the revision of the first page, with sort order NONE (sorting
 * would make etcd read the whole range per page). |page_cb| may be NULL to
 * collect the whole result instead. |ret| may be NULL; when not, it gets a
 * handle valid until |done| has run. Errors: -EINVAL (empty key, both prefix
 * and range_end, negative page size or revision), -ENOMEM, and those of
 * efs_etcd_call() for the first page.
 */
int efs_etcd_range_paged(struct efs_etcd *c, const void *key, size_t keylen,
			 const struct efs_etcd_paged_opts *o, const struct efs_etcd_callopts *co,
			 efs_etcd_page_cb page_cb, efs_etcd_paged_done_cb done, void *arg,
			 struct efs_etcd_paged **ret);

/* Stops a paged range that has not ended: its done callback runs later with
 * -ECANCELED. */
void efs_etcd_paged_cancel(struct efs_etcd_paged *p);
