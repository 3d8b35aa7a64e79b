/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/sync.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "etcd/kv.h"
#include "util/log.h"
#include "util/mem.h"

struct efs_etcd_sync {
	uv_loop_t loop;
	struct efs_etcd *c;
	/* The call being waited for; the callback fills these in. */
	bool done;
	ProtobufCMessage *resp;
	struct efs_etcd_sync_info last;
	char msg[1024];
	bool client_closed;
};

static void sync_call_cb(struct efs_etcd_result *r, void *arg)
{
	struct efs_etcd_sync *s = arg;

	s->last.err = r->err;
	s->last.grpc_status = r->grpc_status;
	s->last.outcome_unknown = r->outcome_unknown;
	snprintf(s->msg, sizeof(s->msg), "%s", r->err ? r->message : "");
	if (r->err == 0) {
		s->resp = r->resp;
		r->resp = NULL;
	}
	s->done = true;
}

int efs_etcd_sync_new(struct efs_etcd_sync **ret, const struct efs_etcd_opts *opts)
{
	struct efs_etcd_sync *s;
	int r;

	s = efs_mem_calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	r = uv_loop_init(&s->loop);
	if (r < 0)
		goto out_free;
	r = efs_etcd_new(&s->c, &s->loop, opts);
	if (r < 0)
		goto out_close_loop;
	*ret = s;
	return 0;
out_close_loop:
	/* The client failed before creating handles, but it may have created
	 * some and closed them: let their close callbacks run. */
	uv_run(&s->loop, UV_RUN_DEFAULT);
	uv_loop_close(&s->loop);
out_free:
	efs_mem_free(s);
	return r;
}

static void client_closed_cb(void *arg)
{
	struct efs_etcd_sync *s = arg;

	s->client_closed = true;
}

static void close_leftover(uv_handle_t *h, void *arg)
{
	unsigned *n = arg;

	if (!uv_is_closing(h)) {
		efs_log_debug("etcd sync: handle %s still open at close",
			      uv_handle_type_name(uv_handle_get_type(h)));
		uv_close(h, NULL);
		(*n)++;
	}
}

int efs_etcd_sync_close(struct efs_etcd_sync *s)
{
	unsigned leftover = 0;
	int r = 0;

	if (!s)
		return 0;
	efs_etcd_free(s->c, client_closed_cb, s);
	s->c = NULL;
	/* UV_RUN_ONCE rather than DEFAULT: a handle the client forgot must not
	 * keep us here forever. */
	while (!s->client_closed && uv_loop_alive(&s->loop))
		uv_run(&s->loop, UV_RUN_ONCE);
	uv_run(&s->loop, UV_RUN_NOWAIT);
	if (uv_loop_close(&s->loop) == UV_EBUSY) {
		uv_walk(&s->loop, close_leftover, &leftover);
		uv_run(&s->loop, UV_RUN_DEFAULT);
		r = -EBUSY;
		if (uv_loop_close(&s->loop) < 0)
			efs_log_debug("etcd sync: loop still busy after closing %u handles",
				      leftover);
	}
	if (!s->client_closed && r == 0)
		r = -EBUSY;
	efs_mem_free(s);
	return r;
}

struct efs_etcd_sync *efs_etcd_sync_free(struct efs_etcd_sync *s)
{
	(void)efs_etcd_sync_close(s);
	return NULL;
}

struct efs_etcd *efs_etcd_sync_client(struct efs_etcd_sync *s)
{
	return s->c;
}

int efs_etcd_sync_call(struct efs_etcd_sync *s, enum efs_etcd_method method,
		       const ProtobufCMessage *req, ProtobufCMessage **ret_resp,
		       char **ret_err_message)
{
	int r;

	s->done = false;
	s->resp = NULL;
	s->msg[0] = '\0';
	s->last = (struct efs_etcd_sync_info){.grpc_status = -1};
	r = efs_etcd_call(s->c, method, req, NULL, sync_call_cb, s, NULL);
	if (r < 0) {
		s->last.err = r;
		snprintf(s->msg, sizeof(s->msg), "cannot start %s: %s",
			 efs_etcd_method_name(method), strerror(-r));
		goto out_err;
	}
	while (!s->done) {
		if (!uv_run(&s->loop, UV_RUN_ONCE) && !s->done) {
			/* Nothing left to wake the loop, yet the callback has
			 * not run: the client broke its contract. */
			r = -EPROTO;
			s->last.err = r;
			snprintf(s->msg, sizeof(s->msg), "%s never completed",
				 efs_etcd_method_name(method));
			goto out_err;
		}
	}
	r = s->last.err;
	if (r < 0)
		goto out_err;
	if (ret_resp)
		*ret_resp = s->resp;
	else
		protobuf_c_message_free_unpacked(s->resp, efs_mem_protobuf());
	s->resp = NULL;
	return 0;
out_err:
	if (ret_err_message)
		*ret_err_message = efs_mem_strdup(s->msg);
	return r;
}

void efs_etcd_sync_last_result(const struct efs_etcd_sync *s, struct efs_etcd_sync_info *ret)
{
	*ret = s->last;
}

const char *efs_etcd_sync_last_message(const struct efs_etcd_sync *s)
{
	return s->msg;
}

int efs_etcd_sync_get(struct efs_etcd_sync *s, const void *key, size_t keylen,
		      Mvccpb__KeyValue **ret_kv, int64_t *ret_revision)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeResponse *resp;
	ProtobufCMessage *m;
	int r;

	r = efs_etcd_range_fill(&req, key, keylen, NULL, NULL);
	if (r < 0)
		return r;
	r = efs_etcd_sync_call(s, EFS_ETCD_RANGE, &req.base, &m, NULL);
	if (r < 0)
		return r;
	resp = (Etcdserverpb__RangeResponse *)m;
	if (ret_revision)
		*ret_revision = resp->header ? resp->header->revision : 0;
	if (resp->n_kvs == 0) {
		r = -ENOENT;
		goto out_free;
	}
	if (ret_kv) {
		/* Detach the kv so that freeing the response leaves it. */
		*ret_kv = resp->kvs[0];
		resp->kvs[0] = NULL;
		memmove(resp->kvs, resp->kvs + 1, (resp->n_kvs - 1) * sizeof(*resp->kvs));
		resp->n_kvs--;
	}
out_free:
	protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
	return r;
}

int efs_etcd_sync_put(struct efs_etcd_sync *s, const void *key, size_t keylen, const void *value,
		      size_t vallen, int64_t lease, int64_t *ret_revision)
{
	Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__PutResponse *resp;
	ProtobufCMessage *m;
	int r;

	if (!key || keylen == 0 || (vallen && !value))
		return -EINVAL;
	req.key.data = (uint8_t *)key;
	req.key.len = keylen;
	req.value.data = (uint8_t *)value;
	req.value.len = vallen;
	req.lease = lease;
	r = efs_etcd_sync_call(s, EFS_ETCD_PUT, &req.base, &m, NULL);
	if (r < 0)
		return r;
	resp = (Etcdserverpb__PutResponse *)m;
	if (ret_revision)
		*ret_revision = resp->header ? resp->header->revision : 0;
	protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
	return 0;
}

int efs_etcd_sync_delete(struct efs_etcd_sync *s, const void *key, size_t keylen, bool prefix,
			 int64_t *ret_deleted)
{
	Etcdserverpb__DeleteRangeRequest req = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	Etcdserverpb__RangeRequest rr = ETCDSERVERPB__RANGE_REQUEST__INIT;
	struct efs_etcd_range_opts ro = {.prefix = prefix};
	ProtobufCMessage *m;
	uint8_t *pbuf = NULL;
	int r;

	if (!key || keylen == 0)
		return -EINVAL;
	if (prefix) {
		pbuf = efs_mem_malloc(keylen);
		if (!pbuf)
			return -ENOMEM;
	}
	/* The range fill computes the prefix end for us. */
	r = efs_etcd_range_fill(&rr, key, keylen, &ro, pbuf);
	if (r < 0)
		goto out_free_pbuf;
	req.key = rr.key;
	req.range_end = rr.range_end;
	r = efs_etcd_sync_call(s, EFS_ETCD_DELETE_RANGE, &req.base, &m, NULL);
	if (r < 0)
		goto out_free_pbuf;
	if (ret_deleted)
		*ret_deleted = ((Etcdserverpb__DeleteRangeResponse *)m)->deleted;
	protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
out_free_pbuf:
	efs_mem_free(pbuf);
	return r;
}

/* Runs one call whose whole response is the result: stored in |ret_resp|
 * (a pointer to the response type's pointer) when that is not NULL. */
static int sync_call_out(struct efs_etcd_sync *s, enum efs_etcd_method method,
			 const ProtobufCMessage *req, void *ret_resp)
{
	ProtobufCMessage *m;
	int r;

	r = efs_etcd_sync_call(s, method, req, ret_resp ? &m : NULL, NULL);
	/* Through memcpy, since |ret_resp| is not a ProtobufCMessage ** but a
	 * T ** of the method's response type. */
	if (r == 0 && ret_resp)
		memcpy(ret_resp, &m, sizeof(m));
	return r;
}

int efs_etcd_sync_txn(struct efs_etcd_sync *s, const Etcdserverpb__TxnRequest *req,
		      Etcdserverpb__TxnResponse **ret_resp)
{
	if (!req)
		return -EINVAL;
	return sync_call_out(s, EFS_ETCD_TXN, &req->base, ret_resp);
}

int efs_etcd_sync_status(struct efs_etcd_sync *s, Etcdserverpb__StatusResponse **ret_resp)
{
	Etcdserverpb__StatusRequest req = ETCDSERVERPB__STATUS_REQUEST__INIT;

	return sync_call_out(s, EFS_ETCD_STATUS, &req.base, ret_resp);
}

int efs_etcd_sync_member_list(struct efs_etcd_sync *s,
			      Etcdserverpb__MemberListResponse **ret_resp)
{
	Etcdserverpb__MemberListRequest req = ETCDSERVERPB__MEMBER_LIST_REQUEST__INIT;

	return sync_call_out(s, EFS_ETCD_MEMBER_LIST, &req.base, ret_resp);
}
