/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * A blocking etcd client for short-lived tools (mkfs, fsck, etcfsctl). It
 * owns a private libuv loop and an efs_etcd client on it, and each call runs
 * that loop until its callback has fired. Never use it from code that runs
 * on another loop: it would block that loop for a whole call deadline.
 *
 * Not thread-safe; one thread uses one handle. Errors are -errno as in
 * etcd.h; a call's deadline is the client's call_timeout_ms, so every call
 * returns within it (plus reconnect backoff already bounded by it).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd/etcd.h"
#include "kv.pb-c.h"
#include "rpc.pb-c.h"

struct efs_etcd_sync;

/*
 * Creates a loop and a client from |opts| (copied by the client). Nothing
 * connects until the first call. Errors: those of efs_etcd_new(), the
 * loop's (-errno), -ENOMEM.
 */
int efs_etcd_sync_new(struct efs_etcd_sync **ret, const struct efs_etcd_opts *opts);

/*
 * Closes the client, runs the loop until every handle is closed and closes
 * the loop. Returns 0, or -EBUSY when handles were still open on the loop
 * afterwards (a leak in the client: they are closed here so that nothing
 * leaks, and the loop is closed anyway). Accepts NULL.
 */
int efs_etcd_sync_close(struct efs_etcd_sync *s);

/* efs_etcd_sync_close() for cleanup paths; returns NULL. */
struct efs_etcd_sync *efs_etcd_sync_free(struct efs_etcd_sync *s);

/* The client, for efs_etcd_get_stats() and the like (not for calls: those
 * would need the loop run). */
struct efs_etcd *efs_etcd_sync_client(struct efs_etcd_sync *s);

/*
 * Runs one unary call and waits for it. On success returns 0 and, when
 * |ret_resp| is not NULL, stores the response there (the caller owns it: free
 * it with protobuf_c_message_free_unpacked(msg, efs_mem_protobuf())).
 * On failure returns the call's -errno, and when |ret_err_message| is not
 * NULL stores a copy of the error text there (caller frees it with
 * efs_mem_free(); NULL if even that copy could not be made). A failed call's
 * other details stay readable through efs_etcd_sync_last_result(). Errors:
 * those of efs_etcd_call() and of the call itself.
 */
int efs_etcd_sync_call(struct efs_etcd_sync *s, enum efs_etcd_method method,
		       const ProtobufCMessage *req, ProtobufCMessage **ret_resp,
		       char **ret_err_message);

/* Details of the last call: the gRPC status (-1 below gRPC) and whether a
 * failed mutation may have been applied. */
struct efs_etcd_sync_info {
	int err;
	int grpc_status;
	bool outcome_unknown;
};
void efs_etcd_sync_last_result(const struct efs_etcd_sync *s, struct efs_etcd_sync_info *ret);

/* The text of the last failed call ("" after a success); valid until the next
 * call on |s|. */
const char *efs_etcd_sync_last_message(const struct efs_etcd_sync *s);

/*
 * Reads one key (linearizable). On success stores the key-value in |ret_kv|
 * (caller owns it; free with protobuf_c_message_free_unpacked) when not
 * NULL, and the store revision of the read in |ret_revision| when not NULL.
 * Errors: -ENOENT (no such key; |ret_revision| is still set), -EINVAL (empty
 * key), and those of efs_etcd_sync_call().
 */
int efs_etcd_sync_get(struct efs_etcd_sync *s, const void *key, size_t keylen,
		      Mvccpb__KeyValue **ret_kv, int64_t *ret_revision);

/* Puts |key| = |value| with |lease| (0: none); stores the revision of the
 * write in |ret_revision| when not NULL. Errors: those of
 * efs_etcd_sync_call(). */
int efs_etcd_sync_put(struct efs_etcd_sync *s, const void *key, size_t keylen, const void *value,
		      size_t vallen, int64_t lease, int64_t *ret_revision);

/* Deletes |key|, or every key under it when |prefix|; stores the number of
 * keys deleted in |ret_deleted| when not NULL. */
int efs_etcd_sync_delete(struct efs_etcd_sync *s, const void *key, size_t keylen, bool prefix,
			 int64_t *ret_deleted);

/* Runs |req|; the response (caller owns it) goes to |ret_resp| when not NULL.
 * A failed compare is a success with resp->succeeded false. */
int efs_etcd_sync_txn(struct efs_etcd_sync *s, const Etcdserverpb__TxnRequest *req,
		      Etcdserverpb__TxnResponse **ret_resp);

/* Maintenance Status of the member the client talks to. */
int efs_etcd_sync_status(struct efs_etcd_sync *s, Etcdserverpb__StatusResponse **ret_resp);

/* Cluster MemberList. */
int efs_etcd_sync_member_list(struct efs_etcd_sync *s,
			      Etcdserverpb__MemberListResponse **ret_resp);
