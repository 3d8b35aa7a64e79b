/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Txn builder, pure (no I/O): compares and success/failure operations,
 * nested transactions, all owned by one arena freed at once, yielding a
 * ready Etcdserverpb__TxnRequest for
 * efs_etcd_call(c, EFS_ETCD_TXN, &req->base, ...).
 *
 * etcd's own request checks (etcd v3rpc checkTxnRequest
 * and checkIntervals) are applied as each item is added, so a request that
 * leaves the builder is one etcd will not reject for its shape:
 *  - max(#compare, #success, #failure) <= max_ops (etcd --max-txn-ops,
 *    default 128), where a nested txn's budget is what its ancestors left
 *    over: -E2BIG;
 *  - a branch may not put a key twice, nor put a key one of its deletes
 *    covers (nested txns included; a nested txn's success and failure may
 *    put the same key, as only one runs): -EINVAL, etcd's "duplicate key
 *    given in txn request";
 *  - keys must be non-empty; a put with ignore_value may carry no value and
 *    one with ignore_lease no lease: -EINVAL.
 * A rejected or failed add (-ENOMEM) leaves the builder as it was.
 *
 * Every byte string is copied, so arguments may be freed once a call
 * returns. Builders live on the loop thread that uses them.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.pb-c.h"

/* etcd's --max-txn-ops default. */
#define EFS_ETCD_TXN_MAX_OPS 128

/* Values equal to etcd's Compare.CompareTarget and CompareResult. */
enum efs_etcd_cmp_target {
	EFS_ETCD_CMP_VERSION = 0,
	EFS_ETCD_CMP_CREATE = 1,
	EFS_ETCD_CMP_MOD = 2,
	EFS_ETCD_CMP_VALUE = 3,
	EFS_ETCD_CMP_LEASE = 4,
};

enum efs_etcd_cmp_result {
	EFS_ETCD_CMP_EQUAL = 0,
	EFS_ETCD_CMP_GREATER = 1,
	EFS_ETCD_CMP_LESS = 2,
	EFS_ETCD_CMP_NOT_EQUAL = 3,
};

enum efs_etcd_txn_branch {
	EFS_ETCD_TXN_SUCCESS = 0,
	EFS_ETCD_TXN_FAILURE = 1,
};

struct efs_etcd_txn;

/*
 * One comparison. |num| is the operand of VERSION, CREATE, MOD and LEASE;
 * |value|/|value_len| that of VALUE. With a non-empty |range_end| every key
 * in [key, range_end) must satisfy it ("\0": every key >= key).
 */
struct efs_etcd_cmp {
	enum efs_etcd_cmp_target target;
	enum efs_etcd_cmp_result result;
	const void *key;
	size_t key_len;
	const void *range_end;
	size_t range_end_len;
	int64_t num;
	const void *value;
	size_t value_len;
};

/* ---- Lifecycle ---- */

/*
 * Creates an empty builder. |max_ops| bounds the request as etcd's
 * --max-txn-ops does (0: EFS_ETCD_TXN_MAX_OPS). Errors: -ENOMEM.
 */
int efs_etcd_txn_new(struct efs_etcd_txn **ret, size_t max_ops);

/*
 * Frees a builder made by efs_etcd_txn_new() with everything it built
 * (nested builders and the request included). Accepts NULL; on a nested
 * builder it does nothing (its root owns it). Returns NULL.
 */
struct efs_etcd_txn *efs_etcd_txn_free(struct efs_etcd_txn *t);

/*
 * The request built so far, owned by |t|'s root builder and valid until it
 * is freed; later adds update it. For a nested builder, its own TxnRequest.
 */
Etcdserverpb__TxnRequest *efs_etcd_txn_request(struct efs_etcd_txn *t);

/* ---- Compares ---- */

/* Adds |c|. Errors: -EINVAL (empty key, target or result out of range),
 * -E2BIG, -ENOMEM. */
int efs_etcd_txn_compare_ex(struct efs_etcd_txn *t, const struct efs_etcd_cmp *c);

/* Adds "|target| of |key| <result> |num|" for VERSION, CREATE, MOD or
 * LEASE (VALUE: -EINVAL, use efs_etcd_txn_compare_value). */
int efs_etcd_txn_compare(struct efs_etcd_txn *t, enum efs_etcd_cmp_target target,
			 enum efs_etcd_cmp_result result, const void *key, size_t key_len,
			 int64_t num);

/* Adds "value of |key| <result> |value|". */
int efs_etcd_txn_compare_value(struct efs_etcd_txn *t, enum efs_etcd_cmp_result result,
			       const void *key, size_t key_len, const void *value,
			       size_t value_len);

/* ---- Operations ---- */

/*
 * Adds a copy of |req| (any of its options: lease, prev_kv, ignore_value,
 * ignore_lease) to |branch|. Errors: -EINVAL (bad branch, empty key,
 * ignore_value with a value, ignore_lease with a lease, duplicate key),
 * -E2BIG, -ENOMEM.
 */
int efs_etcd_txn_put_req(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			 const Etcdserverpb__PutRequest *req);

/* Adds a put of |key| = |value|, attached to |lease| (0: none, which also
 * detaches a lease the key had). */
int efs_etcd_txn_put(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch, const void *key,
		     size_t key_len, const void *value, size_t value_len, int64_t lease);

/* Adds a copy of |req| (limit, revision, sort, serializable, keys_only,
 * count_only, min/max revisions). Errors as efs_etcd_txn_put_req(). */
int efs_etcd_txn_range_req(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			   const Etcdserverpb__RangeRequest *req);

/* Adds a range read of [key, range_end) (|range_end_len| 0: the key alone). */
int efs_etcd_txn_range(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch, const void *key,
		       size_t key_len, const void *range_end, size_t range_end_len);
/* The same, keys only (no values). */
int efs_etcd_txn_range_keys(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			    const void *key, size_t key_len, const void *range_end,
			    size_t range_end_len);

/* Adds a copy of |req|. Errors as efs_etcd_txn_put_req() (a put of a key
 * this delete covers, already in the branch, is a duplicate). */
int efs_etcd_txn_delete_req(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			    const Etcdserverpb__DeleteRangeRequest *req);

/* Adds a delete of [key, range_end), returning the deleted pairs when
 * |prev_kv|. */
int efs_etcd_txn_delete(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			const void *key, size_t key_len, const void *range_end,
			size_t range_end_len, bool prev_kv);

/*
 * Adds an empty nested txn to |branch| and returns its builder in *ret.
 * The nested builder belongs to |t|'s root: it is freed with it, and what
 * is added to it is checked against the whole request. Errors: -EINVAL,
 * -E2BIG, -ENOMEM.
 */
int efs_etcd_txn_nested(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			struct efs_etcd_txn **ret);

/* ---- Responses ---- */

/*
 * The |i|th operation response of |resp| (the branch that ran, in order),
 * checked to be of the expected kind. Errors: -ERANGE (no such index:
 * e.g. the other branch ran), -EBADMSG (another kind, or missing). *ret is
 * borrowed from |resp|, untouched on error.
 */
int efs_etcd_txn_resp_range(const Etcdserverpb__TxnResponse *resp, size_t i,
			    Etcdserverpb__RangeResponse **ret);
int efs_etcd_txn_resp_put(const Etcdserverpb__TxnResponse *resp, size_t i,
			  Etcdserverpb__PutResponse **ret);
int efs_etcd_txn_resp_delete(const Etcdserverpb__TxnResponse *resp, size_t i,
			     Etcdserverpb__DeleteRangeResponse **ret);
int efs_etcd_txn_resp_txn(const Etcdserverpb__TxnResponse *resp, size_t i,
			  Etcdserverpb__TxnResponse **ret);
