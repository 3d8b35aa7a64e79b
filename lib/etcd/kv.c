/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/kv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "etcd/grpc.h"
#include "etcd/keys.h"
#include "util/mem.h"

/*
 * One heap record per call carries the typed callback through the untyped
 * efs_etcd_call() callback. Calling each callback through its own type
 * (rather than casting function pointers) keeps this well-defined C.
 */
union kv_cb {
	efs_etcd_range_cb range;
	efs_etcd_put_cb put;
	efs_etcd_delete_cb del;
	efs_etcd_txn_cb txn;
	efs_etcd_compact_cb compact;
	efs_etcd_status_cb status;
	efs_etcd_member_list_cb member_list;
	efs_etcd_authenticate_cb authenticate;
};

struct kv_call {
	enum efs_etcd_method method;
	union kv_cb cb; /* the member that |method| names */
	void *arg;
};

static void kv_call_done(struct efs_etcd_result *r, void *arg)
{
	struct kv_call k = *(struct kv_call *)arg;
	ProtobufCMessage *m = r->err ? NULL : r->resp;

	efs_mem_free(arg);
	switch (k.method) {
	case EFS_ETCD_RANGE:
		k.cb.range(r, (Etcdserverpb__RangeResponse *)m, k.arg);
		break;
	case EFS_ETCD_PUT:
		k.cb.put(r, (Etcdserverpb__PutResponse *)m, k.arg);
		break;
	case EFS_ETCD_DELETE_RANGE:
		k.cb.del(r, (Etcdserverpb__DeleteRangeResponse *)m, k.arg);
		break;
	case EFS_ETCD_TXN:
		k.cb.txn(r, (Etcdserverpb__TxnResponse *)m, k.arg);
		break;
	case EFS_ETCD_COMPACT:
		k.cb.compact(r, (Etcdserverpb__CompactionResponse *)m, k.arg);
		break;
	case EFS_ETCD_STATUS:
		k.cb.status(r, (Etcdserverpb__StatusResponse *)m, k.arg);
		break;
	case EFS_ETCD_MEMBER_LIST:
		k.cb.member_list(r, (Etcdserverpb__MemberListResponse *)m, k.arg);
		break;
	case EFS_ETCD_AUTHENTICATE:
		k.cb.authenticate(r, (Etcdserverpb__AuthenticateResponse *)m, k.arg);
		break;
	default:
		/* Only the methods above are ever started here. */
		break;
	}
}

/*
 * Starts |method| with |req|; |cb| is the member of the union that |method|
 * names, and it runs with |arg| unless this returns an error (-ENOMEM, or
 * efs_etcd_call()'s).
 */
static int kv_start(struct efs_etcd *c, enum efs_etcd_method method, const ProtobufCMessage *req,
		    const struct efs_etcd_callopts *co, union kv_cb cb, void *arg)
{
	struct kv_call *k = efs_mem_calloc(1, sizeof(*k));
	int r;

	if (!k)
		return -ENOMEM;
	k->method = method;
	k->cb = cb;
	k->arg = arg;
	r = efs_etcd_call(c, method, req, co, kv_call_done, k, NULL);
	if (r < 0)
		efs_mem_free(k);
	return r;
}

static int range_bounds(const void *key, size_t keylen, bool prefix, const void *range_end,
			size_t range_end_len, uint8_t *prefix_buf, ProtobufCBinaryData *ret_end)
{
	if (!key || keylen == 0)
		return -EINVAL;
	if (prefix && range_end)
		return -EINVAL;
	if (prefix) {
		ret_end->len = efs_etcd_prefix_end(key, keylen, prefix_buf);
		ret_end->data = prefix_buf;
	} else if (range_end) {
		if (range_end_len == 0)
			return -EINVAL;
		ret_end->len = range_end_len;
		ret_end->data = (uint8_t *)range_end;
	} else {
		ret_end->len = 0;
		ret_end->data = NULL;
	}
	return 0;
}

int efs_etcd_range_fill(Etcdserverpb__RangeRequest *req, const void *key, size_t keylen,
			const struct efs_etcd_range_opts *o, uint8_t *prefix_buf)
{
	static const struct efs_etcd_range_opts none;
	ProtobufCBinaryData end;
	int r;

	if (!o)
		o = &none;
	if (o->limit < 0 || o->revision < 0 || (o->prefix && !prefix_buf))
		return -EINVAL;
	r = range_bounds(key, keylen, o->prefix, o->range_end, o->range_end_len, prefix_buf,
			 &end);
	if (r < 0)
		return r;
	req->key.data = (uint8_t *)key;
	req->key.len = keylen;
	req->range_end = end;
	req->limit = o->limit;
	req->revision = o->revision;
	req->keys_only = o->keys_only;
	req->count_only = o->count_only;
	req->serializable = o->serializable;
	return 0;
}

int efs_etcd_range(struct efs_etcd *c, const void *key, size_t keylen,
		   const struct efs_etcd_range_opts *o, const struct efs_etcd_callopts *co,
		   efs_etcd_range_cb cb, void *arg)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	uint8_t *pbuf = NULL;
	int r;

	if (!cb || !key || keylen == 0)
		return -EINVAL;
	if (o && o->prefix) {
		pbuf = efs_mem_malloc(keylen);
		if (!pbuf)
			return -ENOMEM;
	}
	r = efs_etcd_range_fill(&req, key, keylen, o, pbuf);
	if (r < 0)
		goto out_free_pbuf;
	r = kv_start(c, EFS_ETCD_RANGE, &req.base, co, (union kv_cb){.range = cb}, arg);
out_free_pbuf:
	efs_mem_free(pbuf);
	return r;
}

int efs_etcd_put(struct efs_etcd *c, const void *key, size_t keylen, const void *value,
		 size_t vallen, const struct efs_etcd_put_opts *o,
		 const struct efs_etcd_callopts *co, efs_etcd_put_cb cb, void *arg)
{
	Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;

	if (!cb || !key || keylen == 0 || (vallen && !value))
		return -EINVAL;
	req.key.data = (uint8_t *)key;
	req.key.len = keylen;
	req.value.data = (uint8_t *)value;
	req.value.len = vallen;
	if (o) {
		req.lease = o->lease;
		req.prev_kv = o->prev_kv;
		req.ignore_value = o->ignore_value;
		req.ignore_lease = o->ignore_lease;
	}
	return kv_start(c, EFS_ETCD_PUT, &req.base, co, (union kv_cb){.put = cb}, arg);
}

int efs_etcd_delete(struct efs_etcd *c, const void *key, size_t keylen,
		    const struct efs_etcd_delete_opts *o, const struct efs_etcd_callopts *co,
		    efs_etcd_delete_cb cb, void *arg)
{
	Etcdserverpb__DeleteRangeRequest req = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	uint8_t *pbuf = NULL;
	int r;

	if (!cb || !key || keylen == 0)
		return -EINVAL;
	if (o && o->prefix) {
		pbuf = efs_mem_malloc(keylen);
		if (!pbuf)
			return -ENOMEM;
	}
	r = range_bounds(key, keylen, o && o->prefix, o ? o->range_end : NULL,
			 o ? o->range_end_len : 0, pbuf, &req.range_end);
	if (r < 0)
		goto out_free_pbuf;
	req.key.data = (uint8_t *)key;
	req.key.len = keylen;
	req.prev_kv = o && o->prev_kv;
	r = kv_start(c, EFS_ETCD_DELETE_RANGE, &req.base, co, (union kv_cb){.del = cb}, arg);
out_free_pbuf:
	efs_mem_free(pbuf);
	return r;
}

int efs_etcd_txn(struct efs_etcd *c, const Etcdserverpb__TxnRequest *req,
		 const struct efs_etcd_callopts *co, efs_etcd_txn_cb cb, void *arg)
{

	if (!cb || !req)
		return -EINVAL;
	return kv_start(c, EFS_ETCD_TXN, &req->base, co, (union kv_cb){.txn = cb}, arg);
}

int efs_etcd_compact(struct efs_etcd *c, int64_t revision, bool physical,
		     const struct efs_etcd_callopts *co, efs_etcd_compact_cb cb, void *arg)
{
	Etcdserverpb__CompactionRequest req = ETCDSERVERPB__COMPACTION_REQUEST__INIT;

	if (!cb || revision <= 0)
		return -EINVAL;
	req.revision = revision;
	req.physical = physical;
	return kv_start(c, EFS_ETCD_COMPACT, &req.base, co, (union kv_cb){.compact = cb}, arg);
}

int efs_etcd_status(struct efs_etcd *c, const struct efs_etcd_callopts *co,
		    efs_etcd_status_cb cb, void *arg)
{
	Etcdserverpb__StatusRequest req = ETCDSERVERPB__STATUS_REQUEST__INIT;

	if (!cb)
		return -EINVAL;
	return kv_start(c, EFS_ETCD_STATUS, &req.base, co, (union kv_cb){.status = cb}, arg);
}

int efs_etcd_member_list(struct efs_etcd *c, const struct efs_etcd_callopts *co,
			 efs_etcd_member_list_cb cb, void *arg)
{
	Etcdserverpb__MemberListRequest req = ETCDSERVERPB__MEMBER_LIST_REQUEST__INIT;

	if (!cb)
		return -EINVAL;
	return kv_start(c, EFS_ETCD_MEMBER_LIST, &req.base, co, (union kv_cb){.member_list = cb},
			arg);
}

int efs_etcd_authenticate(struct efs_etcd *c, const char *name, const char *password,
			  const struct efs_etcd_callopts *co, efs_etcd_authenticate_cb cb,
			  void *arg)
{
	Etcdserverpb__AuthenticateRequest req = ETCDSERVERPB__AUTHENTICATE_REQUEST__INIT;

	if (!cb || !name || !password)
		return -EINVAL;
	req.name = (char *)name;
	req.password = (char *)password;
	return kv_start(c, EFS_ETCD_AUTHENTICATE, &req.base, co,
			(union kv_cb){.authenticate = cb}, arg);
}

/* ---- Paged range ---- */

struct efs_etcd_paged {
	struct efs_etcd *c;
	struct efs_etcd_callopts co;
	bool has_co;
	/* Start key of the next page (owned), and the range end (owned; len 0
	 * for a single key). */
	uint8_t *key;
	size_t keylen;
	uint8_t *end;
	size_t endlen;
	int64_t page_size;
	/* 0 until the first page pins it (or the caller's revision). */
	int64_t revision;
	bool keys_only;
	bool serializable;
	unsigned npages;
	bool cancelled;
	struct efs_etcd_call *call; /* in flight, or NULL */
	efs_etcd_page_cb page_cb;
	efs_etcd_paged_done_cb done;
	void *arg;
	/* Collect mode: the first page's response, holding every kv so far. */
	Etcdserverpb__RangeResponse *all;
	size_t all_cap;
	char msg[256];
};

static void paged_free(struct efs_etcd_paged *p)
{
	if (p->all)
		protobuf_c_message_free_unpacked(&p->all->base, efs_mem_protobuf());
	efs_mem_free(p->key);
	efs_mem_free(p->end);
	efs_mem_free(p);
}

static void paged_finish(struct efs_etcd_paged *p, int err, int grpc_status, const char *message)
{
	struct efs_etcd_result fr = {
		.err = err,
		.grpc_status = grpc_status,
		.message = message ? message : "",
	};
	Etcdserverpb__RangeResponse *all = NULL;

	if (err == 0 && p->all) {
		all = p->all;
		p->all = NULL;
		all->more = false;
		all->count = (int64_t)all->n_kvs;
		if (all->header)
			all->header->revision = p->revision;
		fr.resp = &all->base;
	}
	p->done(&fr, all, p->arg);
	if (fr.resp)
		protobuf_c_message_free_unpacked(fr.resp, efs_mem_protobuf());
	paged_free(p);
}

static void paged_page_done(struct efs_etcd_result *r, void *arg);

static int paged_issue(struct efs_etcd_paged *p)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;

	req.key.data = p->key;
	req.key.len = p->keylen;
	req.range_end.data = p->end;
	req.range_end.len = p->endlen;
	req.limit = p->page_size;
	req.revision = p->revision;
	req.keys_only = p->keys_only;
	req.serializable = p->serializable;
	/* sort_order stays NONE: keys come back ascending anyway, and a sort
	 * makes etcd read the whole range for every page. */
	return efs_etcd_call(p->c, EFS_ETCD_RANGE, &req.base, p->has_co ? &p->co : NULL,
			     paged_page_done, p, &p->call);
}

/* Moves every kv of |page| to the end of p->all. */
static int paged_collect(struct efs_etcd_paged *p, Etcdserverpb__RangeResponse *page)
{
	size_t need = p->all->n_kvs + page->n_kvs;
	Mvccpb__KeyValue **kvs;

	if (need > p->all_cap) {
		size_t cap = p->all_cap ? p->all_cap : 16;

		while (cap < need)
			cap *= 2;
		kvs = efs_mem_realloc(p->all->kvs, cap * sizeof(*kvs));
		if (!kvs)
			return -ENOMEM;
		p->all->kvs = kvs;
		p->all_cap = cap;
	}
	memcpy(p->all->kvs + p->all->n_kvs, page->kvs, page->n_kvs * sizeof(*page->kvs));
	p->all->n_kvs = need;
	page->n_kvs = 0;
	return 0;
}

static bool is_compacted(const struct efs_etcd_result *r)
{
	return r->err == EFS_ETCD_ECOMPACTED;
}

static void paged_page_done(struct efs_etcd_result *r, void *arg)
{
	struct efs_etcd_paged *p = arg;
	Etcdserverpb__RangeResponse *page;
	Mvccpb__KeyValue *last;
	uint8_t *next;
	int err;

	p->call = NULL;
	if (r->err) {
		if (p->cancelled) {
			paged_finish(p, -ECANCELED, r->grpc_status, "paged range cancelled");
		} else if (p->npages > 0 && is_compacted(r)) {
			snprintf(p->msg, sizeof(p->msg),
				 "revision %lld was compacted while paging the range (after %u "
				 "pages); read it again at the latest revision (%s)",
				 (long long)p->revision, p->npages, r->message);
			paged_finish(p, r->err, r->grpc_status, p->msg);
		} else {
			paged_finish(p, r->err, r->grpc_status, r->message);
		}
		return;
	}
	page = (Etcdserverpb__RangeResponse *)r->resp;
	if (p->revision == 0 && page->header)
		p->revision = page->header->revision;
	p->npages++;
	last = page->n_kvs ? page->kvs[page->n_kvs - 1] : NULL;
	/* The next page starts right after the last key: last key + "\0". */
	if (page->more && last) {
		err = -ENOMEM;
		next = efs_mem_malloc(last->key.len + 1);
		if (!next)
			goto fail;
		memcpy(next, last->key.data, last->key.len);
		next[last->key.len] = 0;
		efs_mem_free(p->key);
		p->key = next;
		p->keylen = last->key.len + 1;
	}
	if (p->page_cb) {
		err = p->page_cb(page, p->revision, p->arg);
		if (err < 0)
			goto fail;
	} else if (!p->all) {
		p->all = page;
		p->all_cap = page->n_kvs;
		r->resp = NULL;
	} else {
		err = paged_collect(p, page);
		if (err < 0)
			goto fail;
	}
	if (p->cancelled) {
		paged_finish(p, -ECANCELED, -1, "paged range cancelled");
		return;
	}
	if (!page->more || !last) {
		paged_finish(p, 0, 0, "");
		return;
	}
	err = paged_issue(p);
	if (err < 0)
		goto fail;
	return;
fail:
	paged_finish(p, err, -1, strerror(-err));
}

int efs_etcd_range_paged(struct efs_etcd *c, const void *key, size_t keylen,
			 const struct efs_etcd_paged_opts *o, const struct efs_etcd_callopts *co,
			 efs_etcd_page_cb page_cb, efs_etcd_paged_done_cb done, void *arg,
			 struct efs_etcd_paged **ret)
{
	static const struct efs_etcd_paged_opts none;
	struct efs_etcd_paged *p;
	ProtobufCBinaryData end;
	uint8_t *pbuf = NULL;
	int r;

	if (!o)
		o = &none;
	if (!done || !key || keylen == 0 || o->page_size < 0 || o->revision < 0)
		return -EINVAL;
	r = -ENOMEM;
	p = efs_mem_calloc(1, sizeof(*p));
	if (!p)
		return r;
	if (o->prefix) {
		pbuf = efs_mem_malloc(keylen);
		if (!pbuf)
			goto out_free;
	}
	r = range_bounds(key, keylen, o->prefix, o->range_end, o->range_end_len, pbuf, &end);
	if (r < 0)
		goto out_free;
	r = -ENOMEM;
	p->key = efs_mem_memdup(key, keylen);
	if (!p->key)
		goto out_free;
	p->keylen = keylen;
	if (end.len) {
		p->end = efs_mem_memdup(end.data, end.len);
		if (!p->end)
			goto out_free;
		p->endlen = end.len;
	}
	p->c = c;
	if (co) {
		p->co = *co;
		p->has_co = true;
	}
	p->page_size = o->page_size ? o->page_size : EFS_ETCD_PAGE_SIZE_DEFAULT;
	p->revision = o->revision;
	p->keys_only = o->keys_only;
	p->serializable = o->serializable;
	p->page_cb = page_cb;
	p->done = done;
	p->arg = arg;
	r = paged_issue(p);
	if (r < 0)
		goto out_free;
	efs_mem_free(pbuf);
	if (ret)
		*ret = p;
	return 0;
out_free:
	efs_mem_free(pbuf);
	paged_free(p);
	return r;
}

void efs_etcd_paged_cancel(struct efs_etcd_paged *p)
{
	if (!p || p->cancelled)
		return;
	p->cancelled = true;
	if (p->call)
		efs_etcd_call_cancel(p->call);
}
