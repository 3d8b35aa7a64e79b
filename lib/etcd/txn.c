/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/txn.h"

#include <errno.h>
#include <stdalign.h>
#include <string.h>

#include "util/mem.h"

/*
 * The arena is a list of chunks; nothing in it is freed before the root
 * builder is. Arrays that grow are copied into a new, twice as large piece
 * and the old piece is abandoned, which costs at most as much again as the
 * final array. Chunks start small (most transactions hold a few short keys)
 * and double up to a ceiling; a larger item gets a chunk of its own.
 */
#define CHUNK_MIN 512
#define CHUNK_MAX 65536

struct chunk {
	struct chunk *next;
	size_t cap;
	size_t used;
	max_align_t data[];
};

struct efs_etcd_txn {
	Etcdserverpb__TxnRequest req;
	size_t cap_compare;
	size_t cap_success;
	size_t cap_failure;
	struct efs_etcd_txn *root; /* itself for a root builder */
	/* Root only. */
	struct chunk *chunks;
	size_t max_ops;
};

static void *arena_alloc(struct efs_etcd_txn *t, size_t size)
{
	struct efs_etcd_txn *root = t->root;
	struct chunk *c = root->chunks;
	const size_t a = alignof(max_align_t);
	unsigned char *p;

	if (size > SIZE_MAX / 2)
		return NULL;
	size = (size + a - 1) / a * a;
	if (!c || c->cap - c->used < size) {
		size_t cap = c ? c->cap * 2 : CHUNK_MIN;

		if (cap > CHUNK_MAX)
			cap = CHUNK_MAX;
		if (cap < size)
			cap = size;
		c = efs_mem_malloc(sizeof(*c) + cap);
		if (!c)
			return NULL;
		c->cap = cap;
		c->used = 0;
		c->next = root->chunks;
		root->chunks = c;
	}
	p = (unsigned char *)c->data + c->used;
	c->used += size;
	return p;
}

static int arena_bytes(struct efs_etcd_txn *t, const void *p, size_t n, ProtobufCBinaryData *out)
{
	uint8_t *d = NULL;

	if (n > 0) {
		d = arena_alloc(t, n);
		if (!d)
			return -ENOMEM;
		memcpy(d, p, n);
	}
	out->data = d;
	out->len = n;
	return 0;
}

/* Returns an array with room for one more |esz|-byte element than the
 * |n| in |old|: |old| itself while it has room, else a copy twice as large
 * (and *cap updated). NULL on -ENOMEM, |old| and *cap untouched. */
static void *arena_grow(struct efs_etcd_txn *t, void *old, size_t n, size_t *cap, size_t esz)
{
	size_t ncap;
	void *a;

	if (n < *cap)
		return old;
	ncap = *cap ? *cap * 2 : 4;
	a = arena_alloc(t, ncap * esz);
	if (!a)
		return NULL;
	if (n)
		memcpy(a, old, n * esz);
	*cap = ncap;
	return a;
}

int efs_etcd_txn_new(struct efs_etcd_txn **ret, size_t max_ops)
{
	struct efs_etcd_txn *t = efs_mem_calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	etcdserverpb__txn_request__init(&t->req);
	t->root = t;
	t->max_ops = max_ops ? max_ops : EFS_ETCD_TXN_MAX_OPS;
	*ret = t;
	return 0;
}

struct efs_etcd_txn *efs_etcd_txn_free(struct efs_etcd_txn *t)
{
	struct chunk *c, *next;

	if (!t || t->root != t)
		return NULL;
	for (c = t->chunks; c; c = next) {
		next = c->next;
		efs_mem_free(c);
	}
	efs_mem_free(t);
	return NULL;
}

Etcdserverpb__TxnRequest *efs_etcd_txn_request(struct efs_etcd_txn *t)
{
	return &t->req;
}

/* ---- etcd's checks ---- */

/*
 * checkTxnRequest: a txn's size is max(#compare, #success, #failure) and a
 * nested txn may use what its ancestors left of the budget.
 */
static int check_size(const Etcdserverpb__TxnRequest *r, size_t budget)
{
	size_t opc = r->n_compare;

	if (opc < r->n_success)
		opc = r->n_success;
	if (opc < r->n_failure)
		opc = r->n_failure;
	if (opc > budget)
		return -E2BIG;
	for (int b = 0; b < 2; b++) {
		Etcdserverpb__RequestOp **ops = b ? r->failure : r->success;
		size_t n = b ? r->n_failure : r->n_success;

		for (size_t i = 0; i < n; i++) {
			int err;

			if (ops[i]->request_case != ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN)
				continue;
			err = check_size(ops[i]->request_txn, budget - opc);
			if (err < 0)
				return err;
		}
	}
	return 0;
}

static int bytes_cmp(const ProtobufCBinaryData *a, const ProtobufCBinaryData *b)
{
	size_t n = a->len < b->len ? a->len : b->len;
	int c = n ? memcmp(a->data, b->data, n) : 0;

	if (c != 0)
		return c;
	return (a->len > b->len) - (a->len < b->len);
}

/*
 * etcd builds delete intervals with adt.NewStringAffineInterval(key,
 * range_end): [key, range_end) compared as plain strings, so the "\0"
 * range_end ("to the end") makes an empty interval there and never
 * conflicts. We mirror that rather than reject what etcd accepts.
 */
static bool del_covers(const Etcdserverpb__DeleteRangeRequest *d, const ProtobufCBinaryData *k)
{
	if (d->range_end.len == 0)
		return bytes_cmp(&d->key, k) == 0;
	return bytes_cmp(&d->key, k) <= 0 && bytes_cmp(k, &d->range_end) < 0;
}

static bool tree_has_put(const Etcdserverpb__RequestOp *op, const ProtobufCBinaryData *k);
static bool tree_del_covers(const Etcdserverpb__RequestOp *op, const ProtobufCBinaryData *k);

static bool list_has_put(Etcdserverpb__RequestOp *const *ops, size_t n,
			 const ProtobufCBinaryData *k)
{
	for (size_t i = 0; i < n; i++)
		if (tree_has_put(ops[i], k))
			return true;
	return false;
}

/* True when |op| or a txn nested in it (either branch) puts |k|. */
static bool tree_has_put(const Etcdserverpb__RequestOp *op, const ProtobufCBinaryData *k)
{
	const Etcdserverpb__TxnRequest *r = op->request_txn;

	switch (op->request_case) {
	case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT:
		return bytes_cmp(&op->request_put->key, k) == 0;
	case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN:
		return list_has_put(r->success, r->n_success, k) ||
		       list_has_put(r->failure, r->n_failure, k);
	default:
		return false;
	}
}

static bool list_del_covers(Etcdserverpb__RequestOp *const *ops, size_t n,
			    const ProtobufCBinaryData *k)
{
	for (size_t i = 0; i < n; i++)
		if (tree_del_covers(ops[i], k))
			return true;
	return false;
}

/* True when |op| or a txn nested in it (either branch) deletes |k|. */
static bool tree_del_covers(const Etcdserverpb__RequestOp *op, const ProtobufCBinaryData *k)
{
	const Etcdserverpb__TxnRequest *r = op->request_txn;

	switch (op->request_case) {
	case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE:
		return del_covers(op->request_delete_range, k);
	case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN:
		return list_del_covers(r->success, r->n_success, k) ||
		       list_del_covers(r->failure, r->n_failure, k);
	default:
		return false;
	}
}

static bool is_txn(const Etcdserverpb__RequestOp *op)
{
	return op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN;
}

static bool is_del(const Etcdserverpb__RequestOp *op)
{
	return op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
}

/*
 * A put |k| found inside the |j|th op (a nested txn) of |ops|: etcd's
 * checkIntervals compares it with the puts of the nested txns before it
 * and with the deletes of this level and of the nested txns before it.
 */
static bool nested_put_conflicts(Etcdserverpb__RequestOp *const *ops, size_t nops, size_t j,
				 const ProtobufCBinaryData *k)
{
	for (size_t i = 0; i < nops; i++) {
		if (is_del(ops[i]) && del_covers(ops[i]->request_delete_range, k))
			return true;
		if (i < j && is_txn(ops[i]) &&
		    (tree_has_put(ops[i], k) || tree_del_covers(ops[i], k)))
			return true;
	}
	return false;
}

/* Walks every put nested in |list| (both branches, any depth). */
static bool nested_puts_conflict(Etcdserverpb__RequestOp *const *ops, size_t nops, size_t j,
				 Etcdserverpb__RequestOp *const *list, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const Etcdserverpb__RequestOp *op = list[i];
		const Etcdserverpb__TxnRequest *r = op->request_txn;

		if (op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT) {
			if (nested_put_conflicts(ops, nops, j, &op->request_put->key))
				return true;
		} else if (is_txn(op)) {
			if (nested_puts_conflict(ops, nops, j, r->success, r->n_success) ||
			    nested_puts_conflict(ops, nops, j, r->failure, r->n_failure))
				return true;
		}
	}
	return false;
}

/*
 * etcd's checkIntervals for one branch, without its maps: true when the
 * branch holds a "duplicate key given in txn request".
 */
static bool branch_has_duplicate(Etcdserverpb__RequestOp *const *ops, size_t n)
{
	for (size_t j = 0; j < n; j++) {
		const Etcdserverpb__TxnRequest *r = ops[j]->request_txn;

		if (!is_txn(ops[j]))
			continue;
		if (branch_has_duplicate(r->success, r->n_success) ||
		    branch_has_duplicate(r->failure, r->n_failure))
			return true;
		if (nested_puts_conflict(ops, n, j, r->success, r->n_success) ||
		    nested_puts_conflict(ops, n, j, r->failure, r->n_failure))
			return true;
	}
	for (size_t j = 0; j < n; j++) {
		const ProtobufCBinaryData *k;

		if (ops[j]->request_case != ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT)
			continue;
		k = &ops[j]->request_put->key;
		for (size_t i = 0; i < n; i++) {
			const Etcdserverpb__RequestOp *o = ops[i];

			if (is_txn(o) && (tree_has_put(o, k) || tree_del_covers(o, k)))
				return true;
			if (is_del(o) && del_covers(o->request_delete_range, k))
				return true;
			if (i < j &&
			    o->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT &&
			    bytes_cmp(&o->request_put->key, k) == 0)
				return true;
		}
	}
	return false;
}

static bool list_has_txn(Etcdserverpb__RequestOp *const *ops, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (is_txn(ops[i]))
			return true;
	return false;
}

/*
 * The common case of a root without nested transactions, where the last of
 * the |n| ops of a branch was just added to a request that passed before:
 * only that op can make a duplicate, so it is checked against the others
 * (linear, where check_root is quadratic per op: a 120-operation
 * publication spent a quarter of the daemon's time here).
 */
static int check_flat(const struct efs_etcd_txn *root, Etcdserverpb__RequestOp *const *ops,
		      size_t n)
{
	const Etcdserverpb__RequestOp *op = ops[n - 1];
	int err = check_size(&root->req, root->max_ops);

	if (err < 0)
		return err;
	for (size_t i = 0; i + 1 < n; i++) {
		const Etcdserverpb__RequestOp *o = ops[i];

		if (op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT) {
			const ProtobufCBinaryData *k = &op->request_put->key;

			if (is_del(o) && del_covers(o->request_delete_range, k))
				return -EINVAL;
			if (o->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT &&
			    bytes_cmp(&o->request_put->key, k) == 0)
				return -EINVAL;
		} else if (is_del(op) &&
			   o->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT &&
			   del_covers(op->request_delete_range, &o->request_put->key)) {
			return -EINVAL;
		}
	}
	return 0;
}

/* Checks the whole request from the root, as etcd will. */
static int check_root(const struct efs_etcd_txn *root)
{
	const Etcdserverpb__TxnRequest *r = &root->req;
	int err = check_size(r, root->max_ops);

	if (err < 0)
		return err;
	if (branch_has_duplicate(r->success, r->n_success) ||
	    branch_has_duplicate(r->failure, r->n_failure))
		return -EINVAL;
	return 0;
}

/* ---- Compares ---- */

int efs_etcd_txn_compare_ex(struct efs_etcd_txn *t, const struct efs_etcd_cmp *c)
{
	Etcdserverpb__Compare **arr, *cmp;
	int err;

	if (c->key_len == 0 || (unsigned)c->target > EFS_ETCD_CMP_LEASE ||
	    (unsigned)c->result > EFS_ETCD_CMP_NOT_EQUAL)
		return -EINVAL;
	arr = arena_grow(t, t->req.compare, t->req.n_compare, &t->cap_compare, sizeof(*arr));
	if (!arr)
		return -ENOMEM;
	t->req.compare = arr;
	cmp = arena_alloc(t, sizeof(*cmp));
	if (!cmp)
		return -ENOMEM;
	etcdserverpb__compare__init(cmp);
	cmp->target = (Etcdserverpb__Compare__CompareTarget)c->target;
	cmp->result = (Etcdserverpb__Compare__CompareResult)c->result;
	if (arena_bytes(t, c->key, c->key_len, &cmp->key) < 0 ||
	    arena_bytes(t, c->range_end, c->range_end_len, &cmp->range_end) < 0)
		return -ENOMEM;
	/* The oneof case must name the member, or protobuf-c sends nothing
	 * and etcd compares against 0. */
	switch (c->target) {
	case EFS_ETCD_CMP_VERSION:
		cmp->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION;
		cmp->version = c->num;
		break;
	case EFS_ETCD_CMP_CREATE:
		cmp->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
		cmp->create_revision = c->num;
		break;
	case EFS_ETCD_CMP_MOD:
		cmp->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
		cmp->mod_revision = c->num;
		break;
	case EFS_ETCD_CMP_VALUE:
		cmp->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
		if (arena_bytes(t, c->value, c->value_len, &cmp->value) < 0)
			return -ENOMEM;
		break;
	case EFS_ETCD_CMP_LEASE:
		cmp->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE;
		cmp->lease = c->num;
		break;
	}
	t->req.compare[t->req.n_compare++] = cmp;
	/* A compare never makes a key duplicate: only the sizes can break. */
	err = check_size(&t->root->req, t->root->max_ops);
	if (err < 0)
		t->req.n_compare--;
	return err;
}

int efs_etcd_txn_compare(struct efs_etcd_txn *t, enum efs_etcd_cmp_target target,
			 enum efs_etcd_cmp_result result, const void *key, size_t key_len,
			 int64_t num)
{
	struct efs_etcd_cmp c = {
		.target = target,
		.result = result,
		.key = key,
		.key_len = key_len,
		.num = num,
	};

	if (target == EFS_ETCD_CMP_VALUE)
		return -EINVAL;
	return efs_etcd_txn_compare_ex(t, &c);
}

int efs_etcd_txn_compare_value(struct efs_etcd_txn *t, enum efs_etcd_cmp_result result,
			       const void *key, size_t key_len, const void *value,
			       size_t value_len)
{
	struct efs_etcd_cmp c = {
		.target = EFS_ETCD_CMP_VALUE,
		.result = result,
		.key = key,
		.key_len = key_len,
		.value = value,
		.value_len = value_len,
	};

	return efs_etcd_txn_compare_ex(t, &c);
}

/* ---- Operations ---- */

/* Allocates an op for |branch| with room reserved to append it. */
static int op_new(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
		  Etcdserverpb__RequestOp **ret)
{
	Etcdserverpb__RequestOp **arr, *op;

	if (branch == EFS_ETCD_TXN_SUCCESS) {
		arr = arena_grow(t, t->req.success, t->req.n_success, &t->cap_success,
				 sizeof(*arr));
		if (!arr)
			return -ENOMEM;
		t->req.success = arr;
	} else if (branch == EFS_ETCD_TXN_FAILURE) {
		arr = arena_grow(t, t->req.failure, t->req.n_failure, &t->cap_failure,
				 sizeof(*arr));
		if (!arr)
			return -ENOMEM;
		t->req.failure = arr;
	} else {
		return -EINVAL;
	}
	op = arena_alloc(t, sizeof(*op));
	if (!op)
		return -ENOMEM;
	etcdserverpb__request_op__init(op);
	*ret = op;
	return 0;
}

/* Appends |op| (room reserved by op_new) and keeps it only if the whole
 * request still passes etcd's checks. */
static int op_commit(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
		     Etcdserverpb__RequestOp *op)
{
	size_t *n = branch == EFS_ETCD_TXN_SUCCESS ? &t->req.n_success : &t->req.n_failure;
	Etcdserverpb__RequestOp **ops =
		branch == EFS_ETCD_TXN_SUCCESS ? t->req.success : t->req.failure;
	int err;

	ops[(*n)++] = op;
	if (t == t->root && !is_txn(op) && !list_has_txn(ops, *n - 1))
		err = check_flat(t, ops, *n);
	else
		err = check_root(t->root);
	if (err < 0)
		(*n)--;
	return err;
}

/* A copy of a caller's message must not share its unknown fields. */
static void base_reset(ProtobufCMessage *base, const ProtobufCMessageDescriptor *d)
{
	base->descriptor = d;
	base->n_unknown_fields = 0;
	base->unknown_fields = NULL;
}

int efs_etcd_txn_put_req(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			 const Etcdserverpb__PutRequest *req)
{
	Etcdserverpb__RequestOp *op;
	Etcdserverpb__PutRequest *p;
	int err;

	/* etcd's checkPutRequest. */
	if (req->key.len == 0 || (req->ignore_value && req->value.len != 0) ||
	    (req->ignore_lease && req->lease != 0))
		return -EINVAL;
	err = op_new(t, branch, &op);
	if (err < 0)
		return err;
	p = arena_alloc(t, sizeof(*p));
	if (!p)
		return -ENOMEM;
	*p = *req;
	base_reset(&p->base, &etcdserverpb__put_request__descriptor);
	if (arena_bytes(t, req->key.data, req->key.len, &p->key) < 0 ||
	    arena_bytes(t, req->value.data, req->value.len, &p->value) < 0)
		return -ENOMEM;
	op->request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	op->request_put = p;
	return op_commit(t, branch, op);
}

int efs_etcd_txn_put(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch, const void *key,
		     size_t key_len, const void *value, size_t value_len, int64_t lease)
{
	Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;

	req.key.data = (uint8_t *)key;
	req.key.len = key_len;
	req.value.data = (uint8_t *)value;
	req.value.len = value_len;
	req.lease = lease;
	return efs_etcd_txn_put_req(t, branch, &req);
}

int efs_etcd_txn_range_req(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			   const Etcdserverpb__RangeRequest *req)
{
	Etcdserverpb__RequestOp *op;
	Etcdserverpb__RangeRequest *r;
	int err;

	/* etcd's checkRangeRequest. */
	if (req->key.len == 0 ||
	    (unsigned)req->sort_order > ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__DESCEND ||
	    (unsigned)req->sort_target > ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__VALUE)
		return -EINVAL;
	err = op_new(t, branch, &op);
	if (err < 0)
		return err;
	r = arena_alloc(t, sizeof(*r));
	if (!r)
		return -ENOMEM;
	*r = *req;
	base_reset(&r->base, &etcdserverpb__range_request__descriptor);
	if (arena_bytes(t, req->key.data, req->key.len, &r->key) < 0 ||
	    arena_bytes(t, req->range_end.data, req->range_end.len, &r->range_end) < 0)
		return -ENOMEM;
	op->request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
	op->request_range = r;
	return op_commit(t, branch, op);
}

static int range_of(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch, const void *key,
		    size_t key_len, const void *range_end, size_t range_end_len, bool keys_only)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;

	req.key.data = (uint8_t *)key;
	req.key.len = key_len;
	req.range_end.data = (uint8_t *)range_end;
	req.range_end.len = range_end_len;
	req.keys_only = keys_only;
	return efs_etcd_txn_range_req(t, branch, &req);
}

int efs_etcd_txn_range(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch, const void *key,
		       size_t key_len, const void *range_end, size_t range_end_len)
{
	return range_of(t, branch, key, key_len, range_end, range_end_len, false);
}

int efs_etcd_txn_range_keys(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			    const void *key, size_t key_len, const void *range_end,
			    size_t range_end_len)
{
	return range_of(t, branch, key, key_len, range_end, range_end_len, true);
}

int efs_etcd_txn_delete_req(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			    const Etcdserverpb__DeleteRangeRequest *req)
{
	Etcdserverpb__RequestOp *op;
	Etcdserverpb__DeleteRangeRequest *d;
	int err;

	if (req->key.len == 0)
		return -EINVAL;
	err = op_new(t, branch, &op);
	if (err < 0)
		return err;
	d = arena_alloc(t, sizeof(*d));
	if (!d)
		return -ENOMEM;
	*d = *req;
	base_reset(&d->base, &etcdserverpb__delete_range_request__descriptor);
	if (arena_bytes(t, req->key.data, req->key.len, &d->key) < 0 ||
	    arena_bytes(t, req->range_end.data, req->range_end.len, &d->range_end) < 0)
		return -ENOMEM;
	op->request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
	op->request_delete_range = d;
	return op_commit(t, branch, op);
}

int efs_etcd_txn_delete(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			const void *key, size_t key_len, const void *range_end,
			size_t range_end_len, bool prev_kv)
{
	Etcdserverpb__DeleteRangeRequest req = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;

	req.key.data = (uint8_t *)key;
	req.key.len = key_len;
	req.range_end.data = (uint8_t *)range_end;
	req.range_end.len = range_end_len;
	req.prev_kv = prev_kv;
	return efs_etcd_txn_delete_req(t, branch, &req);
}

int efs_etcd_txn_nested(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
			struct efs_etcd_txn **ret)
{
	Etcdserverpb__RequestOp *op;
	struct efs_etcd_txn *child;
	int err;

	err = op_new(t, branch, &op);
	if (err < 0)
		return err;
	child = arena_alloc(t, sizeof(*child));
	if (!child)
		return -ENOMEM;
	memset(child, 0, sizeof(*child));
	etcdserverpb__txn_request__init(&child->req);
	child->root = t->root;
	op->request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN;
	op->request_txn = &child->req;
	err = op_commit(t, branch, op);
	if (err < 0)
		return err;
	*ret = child;
	return 0;
}

/* ---- Responses ---- */

static int resp_op(const Etcdserverpb__TxnResponse *resp, size_t i,
		   Etcdserverpb__ResponseOp__ResponseCase want,
		   const Etcdserverpb__ResponseOp **ret)
{
	const Etcdserverpb__ResponseOp *op;

	if (i >= resp->n_responses)
		return -ERANGE;
	op = resp->responses[i];
	if (!op || op->response_case != want)
		return -EBADMSG;
	*ret = op;
	return 0;
}

int efs_etcd_txn_resp_range(const Etcdserverpb__TxnResponse *resp, size_t i,
			    Etcdserverpb__RangeResponse **ret)
{
	const Etcdserverpb__ResponseOp *op;
	int err = resp_op(resp, i, ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE, &op);

	if (err < 0)
		return err;
	if (!op->response_range)
		return -EBADMSG;
	*ret = op->response_range;
	return 0;
}

int efs_etcd_txn_resp_put(const Etcdserverpb__TxnResponse *resp, size_t i,
			  Etcdserverpb__PutResponse **ret)
{
	const Etcdserverpb__ResponseOp *op;
	int err = resp_op(resp, i, ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT, &op);

	if (err < 0)
		return err;
	if (!op->response_put)
		return -EBADMSG;
	*ret = op->response_put;
	return 0;
}

int efs_etcd_txn_resp_delete(const Etcdserverpb__TxnResponse *resp, size_t i,
			     Etcdserverpb__DeleteRangeResponse **ret)
{
	const Etcdserverpb__ResponseOp *op;
	int err = resp_op(resp, i, ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_DELETE_RANGE, &op);

	if (err < 0)
		return err;
	if (!op->response_delete_range)
		return -EBADMSG;
	*ret = op->response_delete_range;
	return 0;
}

int efs_etcd_txn_resp_txn(const Etcdserverpb__TxnResponse *resp, size_t i,
			  Etcdserverpb__TxnResponse **ret)
{
	const Etcdserverpb__ResponseOp *op;
	int err = resp_op(resp, i, ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_TXN, &op);

	if (err < 0)
		return err;
	if (!op->response_txn)
		return -EBADMSG;
	*ret = op->response_txn;
	return 0;
}
