/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "etcd/txn.h"
#include "util/mem.h"

#include "../support/leak.h"

TestSuite(txn, .fini = efs_mem_fail_reset, .timeout = 60);

#define S(s) (s), (sizeof(s) - 1)

static struct efs_etcd_txn *txn_new(size_t max_ops)
{
	struct efs_etcd_txn *t = NULL;

	cr_assert_eq(efs_etcd_txn_new(&t, max_ops), 0);
	cr_assert_not_null(t);
	return t;
}

/* Packs the request and unpacks it again with the system allocator, as
 * etcd would see it. */
static Etcdserverpb__TxnRequest *round_trip(struct efs_etcd_txn *t)
{
	Etcdserverpb__TxnRequest *req = efs_etcd_txn_request(t);
	size_t len = etcdserverpb__txn_request__get_packed_size(req);
	uint8_t *buf = malloc(len ? len : 1);
	Etcdserverpb__TxnRequest *back;

	cr_assert_eq(etcdserverpb__txn_request__pack(req, buf), len);
	back = etcdserverpb__txn_request__unpack(NULL, len, buf);
	free(buf);
	cr_assert_not_null(back);
	return back;
}

static void assert_bytes(ProtobufCBinaryData d, const char *s, size_t n)
{
	cr_assert_eq(d.len, n, "length %zu, want %zu", d.len, n);
	if (n)
		cr_assert_eq(memcmp(d.data, s, n), 0);
}

/* Packed bytes of the request, to show a rejected add changed nothing. */
static size_t packed(struct efs_etcd_txn *t, uint8_t *buf, size_t size)
{
	Etcdserverpb__TxnRequest *req = efs_etcd_txn_request(t);
	size_t len = etcdserverpb__txn_request__get_packed_size(req);

	cr_assert_leq(len, size);
	etcdserverpb__txn_request__pack(req, buf);
	return len;
}

/* ---- Compares ---- */

Test(txn, every_compare_target_and_result_round_trips)
{
	static const int results[] = {EFS_ETCD_CMP_EQUAL, EFS_ETCD_CMP_GREATER, EFS_ETCD_CMP_LESS,
				      EFS_ETCD_CMP_NOT_EQUAL};
	static const int targets[] = {EFS_ETCD_CMP_VERSION, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_MOD,
				      EFS_ETCD_CMP_VALUE, EFS_ETCD_CMP_LEASE};
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__TxnRequest *back;
	size_t n = 0;

	for (size_t ti = 0; ti < 5; ti++) {
		for (size_t ri = 0; ri < 4; ri++) {
			struct efs_etcd_cmp c = {
				.target = targets[ti],
				.result = results[ri],
				.key = "key",
				.key_len = 3,
				.range_end = ri & 1 ? "kez" : NULL,
				.range_end_len = ri & 1 ? 3 : 0,
				.num = (int64_t)(ti * 10 + ri) - 5, /* includes 0 and < 0 */
				.value = "val",
				.value_len = ri,
			};

			cr_assert_eq(efs_etcd_txn_compare_ex(t, &c), 0);
			n++;
		}
	}
	back = round_trip(t);
	cr_assert_eq(back->n_compare, n);
	for (size_t ti = 0, i = 0; ti < 5; ti++) {
		for (size_t ri = 0; ri < 4; ri++, i++) {
			const Etcdserverpb__Compare *c = back->compare[i];
			int64_t num = (int64_t)(ti * 10 + ri) - 5;

			cr_assert_eq((int)c->target, targets[ti]);
			cr_assert_eq((int)c->result, results[ri]);
			assert_bytes(c->key, S("key"));
			if (ri & 1)
				assert_bytes(c->range_end, S("kez"));
			else
				cr_assert_eq(c->range_end.len, 0);
			switch (targets[ti]) {
			case EFS_ETCD_CMP_VERSION:
				cr_assert_eq(c->target_union_case,
					     ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION);
				cr_assert_eq(c->version, num);
				break;
			case EFS_ETCD_CMP_CREATE:
				cr_assert_eq(c->target_union_case,
					     ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION);
				cr_assert_eq(c->create_revision, num);
				break;
			case EFS_ETCD_CMP_MOD:
				cr_assert_eq(c->target_union_case,
					     ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION);
				cr_assert_eq(c->mod_revision, num);
				break;
			case EFS_ETCD_CMP_VALUE:
				cr_assert_eq(c->target_union_case,
					     ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE);
				assert_bytes(c->value, "val", ri);
				break;
			case EFS_ETCD_CMP_LEASE:
				cr_assert_eq(c->target_union_case,
					     ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE);
				cr_assert_eq(c->lease, num);
				break;
			}
		}
	}
	etcdserverpb__txn_request__free_unpacked(back, NULL);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, compare_helpers_build_the_usual_guards)
{
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__TxnRequest *back;

	/* "Absent" is VERSION EQUAL 0; the zero must still be on the wire
	 * with its oneof case. */
	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_VERSION, EFS_ETCD_CMP_EQUAL, S("k"), 0),
		     0);
	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, S("k"), 77), 0);
	cr_assert_eq(efs_etcd_txn_compare_value(t, EFS_ETCD_CMP_NOT_EQUAL, S("k"), S("v")), 0);
	back = round_trip(t);
	cr_assert_eq(back->n_compare, 3);
	cr_assert_eq(back->compare[0]->target_union_case,
		     ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION);
	cr_assert_eq(back->compare[0]->version, 0);
	cr_assert_eq(back->compare[1]->mod_revision, 77);
	cr_assert_eq(back->compare[2]->result, ETCDSERVERPB__COMPARE__COMPARE_RESULT__NOT_EQUAL);
	assert_bytes(back->compare[2]->value, S("v"));
	etcdserverpb__txn_request__free_unpacked(back, NULL);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, invalid_compares_are_einval_and_change_nothing)
{
	struct efs_etcd_txn *t = txn_new(0);
	struct efs_etcd_cmp c = {.target = EFS_ETCD_CMP_MOD, .key = "k", .key_len = 1};

	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_VERSION, EFS_ETCD_CMP_EQUAL, "", 0, 0),
		     -EINVAL);
	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_VALUE, EFS_ETCD_CMP_EQUAL, S("k"), 0),
		     -EINVAL);
	c.target = (enum efs_etcd_cmp_target)5;
	cr_assert_eq(efs_etcd_txn_compare_ex(t, &c), -EINVAL);
	c.target = EFS_ETCD_CMP_MOD;
	c.result = (enum efs_etcd_cmp_result)4;
	cr_assert_eq(efs_etcd_txn_compare_ex(t, &c), -EINVAL);
	c.result = (enum efs_etcd_cmp_result)-1;
	cr_assert_eq(efs_etcd_txn_compare_ex(t, &c), -EINVAL);
	cr_assert_eq(efs_etcd_txn_request(t)->n_compare, 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

/* ---- Operations ---- */

Test(txn, put_with_every_option_round_trips)
{
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__TxnRequest *back;
	const Etcdserverpb__PutRequest *q;

	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("a"), S("1"), 0x1234), 0);
	p.key.data = (uint8_t *)"b";
	p.key.len = 1;
	p.value.data = (uint8_t *)"\0\xff";
	p.value.len = 2;
	p.lease = 9;
	p.prev_kv = 1;
	cr_assert_eq(efs_etcd_txn_put_req(t, EFS_ETCD_TXN_SUCCESS, &p), 0);
	p = (Etcdserverpb__PutRequest)ETCDSERVERPB__PUT_REQUEST__INIT;
	p.key.data = (uint8_t *)"c";
	p.key.len = 1;
	p.ignore_value = 1;
	p.ignore_lease = 1;
	cr_assert_eq(efs_etcd_txn_put_req(t, EFS_ETCD_TXN_FAILURE, &p), 0);

	back = round_trip(t);
	cr_assert_eq(back->n_success, 2);
	cr_assert_eq(back->n_failure, 1);
	cr_assert_eq(back->success[0]->request_case, ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT);
	q = back->success[0]->request_put;
	assert_bytes(q->key, S("a"));
	assert_bytes(q->value, S("1"));
	cr_assert_eq(q->lease, 0x1234);
	cr_assert(!q->prev_kv && !q->ignore_value && !q->ignore_lease);
	q = back->success[1]->request_put;
	assert_bytes(q->key, S("b"));
	assert_bytes(q->value, "\0\xff", 2);
	cr_assert_eq(q->lease, 9);
	cr_assert(q->prev_kv);
	q = back->failure[0]->request_put;
	assert_bytes(q->key, S("c"));
	cr_assert_eq(q->value.len, 0);
	cr_assert(q->ignore_value && q->ignore_lease && !q->prev_kv);
	etcdserverpb__txn_request__free_unpacked(back, NULL);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, puts_that_etcd_would_refuse_are_einval)
{
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;

	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, "", 0, S("v"), 0), -EINVAL);
	p.key.data = (uint8_t *)"k";
	p.key.len = 1;
	p.ignore_value = 1;
	p.value.data = (uint8_t *)"v";
	p.value.len = 1;
	cr_assert_eq(efs_etcd_txn_put_req(t, EFS_ETCD_TXN_SUCCESS, &p), -EINVAL);
	p.value.len = 0;
	p.ignore_lease = 1;
	p.lease = 5;
	cr_assert_eq(efs_etcd_txn_put_req(t, EFS_ETCD_TXN_SUCCESS, &p), -EINVAL);
	cr_assert_eq(efs_etcd_txn_put(t, (enum efs_etcd_txn_branch)2, S("k"), S("v"), 0),
		     -EINVAL);
	cr_assert_eq(efs_etcd_txn_request(t)->n_success, 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, range_with_every_option_round_trips)
{
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__RangeRequest r = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__TxnRequest *back;
	const Etcdserverpb__RangeRequest *q;

	r.key.data = (uint8_t *)"a";
	r.key.len = 1;
	r.range_end.data = (uint8_t *)"b";
	r.range_end.len = 1;
	r.limit = 10;
	r.revision = 100;
	r.sort_order = ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__DESCEND;
	r.sort_target = ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__MOD;
	r.serializable = 1;
	r.keys_only = 1;
	r.count_only = 1;
	r.min_mod_revision = 1;
	r.max_mod_revision = 2;
	r.min_create_revision = 3;
	r.max_create_revision = 4;
	cr_assert_eq(efs_etcd_txn_range_req(t, EFS_ETCD_TXN_FAILURE, &r), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, S("x"), NULL, 0), 0);
	cr_assert_eq(efs_etcd_txn_range_keys(t, EFS_ETCD_TXN_SUCCESS, S("y"), S("z")), 0);
	back = round_trip(t);
	cr_assert_eq(back->n_failure, 1);
	q = back->failure[0]->request_range;
	cr_assert_eq(back->failure[0]->request_case,
		     ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE);
	assert_bytes(q->key, S("a"));
	assert_bytes(q->range_end, S("b"));
	cr_assert_eq(q->limit, 10);
	cr_assert_eq(q->revision, 100);
	cr_assert_eq(q->sort_order, ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__DESCEND);
	cr_assert_eq(q->sort_target, ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__MOD);
	cr_assert(q->serializable && q->keys_only && q->count_only);
	cr_assert_eq(q->min_mod_revision, 1);
	cr_assert_eq(q->max_mod_revision, 2);
	cr_assert_eq(q->min_create_revision, 3);
	cr_assert_eq(q->max_create_revision, 4);
	q = back->success[0]->request_range;
	assert_bytes(q->key, S("x"));
	cr_assert_eq(q->range_end.len, 0);
	cr_assert_eq(q->limit, 0);
	cr_assert_not(q->keys_only);
	q = back->success[1]->request_range;
	assert_bytes(q->key, S("y"));
	assert_bytes(q->range_end, S("z"));
	cr_assert(q->keys_only);
	etcdserverpb__txn_request__free_unpacked(back, NULL);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, ranges_etcd_would_refuse_are_einval)
{
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__RangeRequest r = ETCDSERVERPB__RANGE_REQUEST__INIT;

	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, "", 0, NULL, 0), -EINVAL);
	r.key.data = (uint8_t *)"a";
	r.key.len = 1;
	r.sort_order = (Etcdserverpb__RangeRequest__SortOrder)3;
	cr_assert_eq(efs_etcd_txn_range_req(t, EFS_ETCD_TXN_SUCCESS, &r), -EINVAL);
	r.sort_order = ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__NONE;
	r.sort_target = (Etcdserverpb__RangeRequest__SortTarget)5;
	cr_assert_eq(efs_etcd_txn_range_req(t, EFS_ETCD_TXN_SUCCESS, &r), -EINVAL);
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, "", 0, NULL, 0, false), -EINVAL);
	cr_assert_eq(efs_etcd_txn_request(t)->n_success, 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, delete_range_with_prev_kv_round_trips)
{
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__TxnRequest *back;
	const Etcdserverpb__DeleteRangeRequest *q;

	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, S("d/"), S("d0"), true), 0);
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, S("e"), NULL, 0, false), 0);
	back = round_trip(t);
	cr_assert_eq(back->success[0]->request_case,
		     ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE);
	q = back->success[0]->request_delete_range;
	assert_bytes(q->key, S("d/"));
	assert_bytes(q->range_end, S("d0"));
	cr_assert(q->prev_kv);
	q = back->success[1]->request_delete_range;
	assert_bytes(q->key, S("e"));
	cr_assert_eq(q->range_end.len, 0);
	cr_assert(!q->prev_kv);
	etcdserverpb__txn_request__free_unpacked(back, NULL);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, builder_copies_every_byte_string)
{
	struct efs_etcd_txn *t = txn_new(0);
	char key[4] = "key", val[4] = "val", end[4] = "kez";
	Etcdserverpb__TxnRequest *back;

	cr_assert_eq(efs_etcd_txn_compare_value(t, EFS_ETCD_CMP_EQUAL, key, 3, val, 3), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key, 3, val, 3, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, key, 3, end, 3), 0);
	memset(key, 'X', 3);
	memset(val, 'Y', 3);
	memset(end, 'Z', 3);
	back = round_trip(t);
	assert_bytes(back->compare[0]->key, S("key"));
	assert_bytes(back->compare[0]->value, S("val"));
	assert_bytes(back->success[0]->request_put->key, S("key"));
	assert_bytes(back->success[0]->request_put->value, S("val"));
	assert_bytes(back->failure[0]->request_range->range_end, S("kez"));
	etcdserverpb__txn_request__free_unpacked(back, NULL);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, copied_request_does_not_share_the_callers_unknown_fields)
{
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	ProtobufCMessageUnknownField uf = {.tag = 99,
					   .wire_type = PROTOBUF_C_WIRE_TYPE_VARINT,
					   .len = 1,
					   .data = (uint8_t *)"\x01"};

	p.key.data = (uint8_t *)"k";
	p.key.len = 1;
	p.base.n_unknown_fields = 1;
	p.base.unknown_fields = &uf;
	cr_assert_eq(efs_etcd_txn_put_req(t, EFS_ETCD_TXN_SUCCESS, &p), 0);
	cr_assert_eq(efs_etcd_txn_request(t)->success[0]->request_put->base.n_unknown_fields, 0);
	cr_assert_null(efs_etcd_txn_request(t)->success[0]->request_put->base.unknown_fields);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, nested_txn_round_trips_with_its_own_compares_and_branches)
{
	struct efs_etcd_txn *t = txn_new(0), *child, *grand;
	Etcdserverpb__TxnRequest *back;
	const Etcdserverpb__TxnRequest *c, *g;

	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_VERSION, EFS_ETCD_CMP_GREATER, S("p"), 0),
		     0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("a"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &child), 0);
	cr_assert_eq(
		efs_etcd_txn_compare(child, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, S("l"), 42), 0);
	cr_assert_eq(efs_etcd_txn_put(child, EFS_ETCD_TXN_SUCCESS, S("b"), S("2"), 42), 0);
	cr_assert_eq(efs_etcd_txn_range(child, EFS_ETCD_TXN_FAILURE, S("b"), NULL, 0), 0);
	cr_assert_eq(efs_etcd_txn_nested(child, EFS_ETCD_TXN_FAILURE, &grand), 0);
	cr_assert_eq(efs_etcd_txn_delete(grand, EFS_ETCD_TXN_SUCCESS, S("z"), NULL, 0, true), 0);
	/* The parent can still grow after the child was attached. */
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("c"), S("3"), 0), 0);
	cr_assert_eq(efs_etcd_txn_request(child)->n_success, 1);

	back = round_trip(t);
	cr_assert_eq(back->n_success, 3);
	cr_assert_eq(back->success[1]->request_case, ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN);
	c = back->success[1]->request_txn;
	cr_assert_eq(c->n_compare, 1);
	cr_assert_eq(c->compare[0]->lease, 42);
	cr_assert_eq(c->n_success, 1);
	assert_bytes(c->success[0]->request_put->key, S("b"));
	cr_assert_eq(c->success[0]->request_put->lease, 42);
	cr_assert_eq(c->n_failure, 2);
	cr_assert_eq(c->failure[0]->request_case, ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE);
	cr_assert_eq(c->failure[1]->request_case, ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN);
	g = c->failure[1]->request_txn;
	cr_assert_eq(g->n_success, 1);
	assert_bytes(g->success[0]->request_delete_range->key, S("z"));
	assert_bytes(back->success[2]->request_put->key, S("c"));
	etcdserverpb__txn_request__free_unpacked(back, NULL);
	/* Freeing a nested builder is a no-op; the root frees everything. */
	cr_assert_null(efs_etcd_txn_free(child));
	cr_assert_null(efs_etcd_txn_free(t));
	cr_assert_null(efs_etcd_txn_free(NULL));
	efs_test_assert_no_leaks();
}

Test(txn, many_large_ops_grow_the_arena_and_all_survive)
{
	struct efs_etcd_txn *t = txn_new(0);
	Etcdserverpb__TxnRequest *back;
	static char big[100000];
	char key[16];

	memset(big, 'v', sizeof(big));
	for (int i = 0; i < EFS_ETCD_TXN_MAX_OPS; i++) {
		int n = snprintf(key, sizeof(key), "k%03d", i);

		cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key, (size_t)n, big,
					      (size_t)(i * 700 + 1), i),
			     0);
	}
	back = round_trip(t);
	cr_assert_eq(back->n_success, EFS_ETCD_TXN_MAX_OPS);
	for (int i = 0; i < EFS_ETCD_TXN_MAX_OPS; i++) {
		const Etcdserverpb__PutRequest *q = back->success[i]->request_put;

		snprintf(key, sizeof(key), "k%03d", i);
		assert_bytes(q->key, key, 4);
		cr_assert_eq(q->value.len, (size_t)(i * 700 + 1));
		cr_assert_eq(q->value.data[q->value.len - 1], 'v');
		cr_assert_eq(q->lease, i);
	}
	etcdserverpb__txn_request__free_unpacked(back, NULL);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

/* ---- Limits ---- */

Test(txn, default_limit_is_128_ops_per_branch_and_compares)
{
	struct efs_etcd_txn *t = txn_new(0);
	uint8_t before[8192], after[8192];
	size_t lb, la;
	char key[16];

	for (int i = 0; i < 128; i++) {
		size_t kl = (size_t)snprintf(key, sizeof(key), "k%d", i);
		int err;

		cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key, kl, "", 0, 0), 0);
		cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_FAILURE, key, kl, "", 0, 0), 0);
		err = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_LESS, key, kl, 5);
		cr_assert_eq(err, 0);
	}
	lb = packed(t, before, sizeof(before));
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("x"), S("1"), 0), -E2BIG);
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_FAILURE, S("x"), NULL, 0, false), -E2BIG);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, S("x"), NULL, 0), -E2BIG);
	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_LESS, S("x"), 5),
		     -E2BIG);
	la = packed(t, after, sizeof(after));
	cr_assert_eq(la, lb);
	cr_assert_eq(memcmp(before, after, la), 0);
	cr_assert_eq(efs_etcd_txn_request(t)->n_success, 128);
	cr_assert_eq(efs_etcd_txn_request(t)->n_compare, 128);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, configured_limit_applies)
{
	struct efs_etcd_txn *t = txn_new(2);

	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, S("a"), NULL, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, S("b"), NULL, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, S("c"), NULL, 0), -E2BIG);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, S("c"), NULL, 0), 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, nested_txns_share_the_op_budget_of_their_ancestors)
{
	struct efs_etcd_txn *t = txn_new(4), *child, *grand;

	/* Root size 2 leaves 2 for the child. */
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("a"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &child), 0);
	cr_assert_eq(efs_etcd_txn_put(child, EFS_ETCD_TXN_SUCCESS, S("b"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(child, EFS_ETCD_TXN_SUCCESS, S("c"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(child, EFS_ETCD_TXN_SUCCESS, S("d"), S("1"), 0), -E2BIG);
	cr_assert_eq(efs_etcd_txn_compare(child, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, S("d"), 1),
		     0);
	cr_assert_eq(efs_etcd_txn_compare(child, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, S("d"), 1),
		     0);
	cr_assert_eq(efs_etcd_txn_compare(child, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, S("d"), 1),
		     -E2BIG);
	/* Growing the root's size to 3 would leave the full child only 1. */
	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, S("d"), 1), 0);
	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, S("d"), 1), 0);
	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, S("d"), 1),
		     -E2BIG);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, S("x"), NULL, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, S("x"), NULL, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, S("x"), NULL, 0), -E2BIG);
	/* A grandchild inside the full child has no budget left at all, but
	 * an empty txn has size 0. */
	cr_assert_eq(efs_etcd_txn_nested(child, EFS_ETCD_TXN_FAILURE, &grand), 0);
	cr_assert_eq(efs_etcd_txn_range(grand, EFS_ETCD_TXN_SUCCESS, S("y"), NULL, 0), -E2BIG);
	cr_assert_eq(efs_etcd_txn_request(child)->n_failure, 1);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

/* ---- Duplicate keys ---- */

Test(txn, putting_the_same_key_twice_in_a_branch_is_einval)
{
	struct efs_etcd_txn *t = txn_new(0);
	uint8_t before[256], after[256];
	size_t lb;

	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("k"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("k2"), S("1"), 0), 0);
	lb = packed(t, before, sizeof(before));
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("k"), S("2"), 0), -EINVAL);
	cr_assert_eq(packed(t, after, sizeof(after)), lb);
	cr_assert_eq(memcmp(before, after, lb), 0);
	/* The other branch is a different request. */
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_FAILURE, S("k"), S("2"), 0), 0);
	/* Reads of a put key are fine. */
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, S("k"), NULL, 0), 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, putting_a_key_the_branch_deletes_is_einval_in_either_order)
{
	struct efs_etcd_txn *t = txn_new(0);

	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, S("d/"), S("d0"), false), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("d/x"), S("1"), 0), -EINVAL);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("d/"), S("1"), 0), -EINVAL);
	/* range_end is exclusive. */
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("d0"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("d"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_FAILURE, S("s"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_FAILURE, S("s"), NULL, 0, false), -EINVAL);
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_FAILURE, S("r"), S("t"), false), -EINVAL);
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_FAILURE, S("s\0"), S("t"), false), 0);
	/* Two overlapping deletes are not a conflict for etcd. */
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_FAILURE, S("s\0"), S("t"), false), 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, delete_to_the_end_of_keyspace_does_not_conflict_as_in_etcd)
{
	struct efs_etcd_txn *t = txn_new(0);

	/* etcd's interval [key, "\0") is empty, so it accepts this. */
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, S("a"), "\0", 1, false), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("b"), S("1"), 0), 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, nested_success_and_failure_may_put_the_same_key)
{
	struct efs_etcd_txn *t = txn_new(0), *c;

	cr_assert_eq(efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &c), 0);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_SUCCESS, S("k"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_FAILURE, S("k"), S("2"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_FAILURE, S("k"), S("3"), 0), -EINVAL);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, duplicates_inside_a_nested_branch_are_einval)
{
	struct efs_etcd_txn *t = txn_new(0), *c, *g;

	cr_assert_eq(efs_etcd_txn_nested(t, EFS_ETCD_TXN_FAILURE, &c), 0);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_SUCCESS, S("k"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_SUCCESS, S("k"), S("2"), 0), -EINVAL);
	cr_assert_eq(efs_etcd_txn_delete(c, EFS_ETCD_TXN_SUCCESS, S("a"), S("z"), false), -EINVAL);
	cr_assert_eq(efs_etcd_txn_nested(c, EFS_ETCD_TXN_SUCCESS, &g), 0);
	cr_assert_eq(efs_etcd_txn_delete(g, EFS_ETCD_TXN_SUCCESS, S("m"), NULL, 0, false), 0);
	cr_assert_eq(efs_etcd_txn_put(g, EFS_ETCD_TXN_SUCCESS, S("m"), S("2"), 0), -EINVAL);
	cr_assert_eq(efs_etcd_txn_request(c)->n_success, 2);
	cr_assert_eq(efs_etcd_txn_request(g)->n_success, 1);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, nested_puts_conflict_with_the_parents_puts_and_deletes)
{
	struct efs_etcd_txn *t = txn_new(0), *c;

	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("p"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, S("d"), NULL, 0, false), 0);
	cr_assert_eq(efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &c), 0);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_SUCCESS, S("p"), S("2"), 0), -EINVAL);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_FAILURE, S("p"), S("2"), 0), -EINVAL);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_FAILURE, S("d"), S("2"), 0), -EINVAL);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_FAILURE, S("q"), S("2"), 0), 0);
	/* And the other way round: a parent put after the nested one. */
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("q"), S("1"), 0), -EINVAL);
	/* A parent put of a key a nested delete covers. */
	cr_assert_eq(efs_etcd_txn_delete(c, EFS_ETCD_TXN_SUCCESS, S("x"), S("y"), false), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, S("xa"), S("1"), 0), -EINVAL);
	/* The parent's other branch is unaffected. */
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_FAILURE, S("xa"), S("1"), 0), 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

Test(txn, sibling_nested_txns_conflict_as_etcd_orders_them)
{
	struct efs_etcd_txn *t = txn_new(0), *a, *b, *c;

	cr_assert_eq(efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &a), 0);
	cr_assert_eq(efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &b), 0);
	cr_assert_eq(efs_etcd_txn_put(a, EFS_ETCD_TXN_SUCCESS, S("k"), S("1"), 0), 0);
	cr_assert_eq(efs_etcd_txn_put(b, EFS_ETCD_TXN_FAILURE, S("k"), S("1"), 0), -EINVAL);
	cr_assert_eq(efs_etcd_txn_delete(a, EFS_ETCD_TXN_FAILURE, S("m"), NULL, 0, false), 0);
	cr_assert_eq(efs_etcd_txn_put(b, EFS_ETCD_TXN_SUCCESS, S("m"), S("1"), 0), -EINVAL);
	/* etcd only checks a nested put against the deletes of earlier
	 * siblings, so a later sibling may delete what an earlier one put. */
	cr_assert_eq(efs_etcd_txn_delete(b, EFS_ETCD_TXN_SUCCESS, S("k"), NULL, 0, false), 0);
	/* Deeper nesting is flattened into the branch. */
	cr_assert_eq(efs_etcd_txn_nested(b, EFS_ETCD_TXN_SUCCESS, &c), 0);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_FAILURE, S("k"), S("1"), 0), -EINVAL);
	cr_assert_eq(efs_etcd_txn_put(c, EFS_ETCD_TXN_FAILURE, S("n"), S("1"), 0), 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}

/* ---- Differential check against etcd's checkIntervals ---- */

/*
 * A literal port of etcd's v3rpc checkIntervals (maps and interval tree
 * replaced by arrays) over a model tree built alongside a builder. Random
 * small transactions over a three-letter alphabet then show that the
 * builder rejects exactly the adds that make etcd answer "duplicate key
 * given in txn request".
 */
#define MODEL_NODES 32
#define MODEL_OPS   12
#define MODEL_SET   256

enum model_kind { M_PUT, M_DEL, M_TXN };

struct model_op {
	enum model_kind kind;
	char key[4];
	char end[4];
	size_t end_len;
	int child;
};

struct model_node {
	struct model_op ops[2][MODEL_OPS];
	int n[2];
	struct efs_etcd_txn *b;
};

/* Go's adt.StringAffineComparable: bytewise, but "" is +infinity. */
static int affine_cmp(const char *a, size_t al, const char *b, size_t bl)
{
	size_t m = al < bl ? al : bl;
	int c;

	if (al == 0)
		return bl == 0 ? 0 : 1;
	if (bl == 0)
		return -1;
	c = memcmp(a, b, m);
	if (c)
		return c;
	return (al > bl) - (al < bl);
}

struct model_iv {
	char b[4];
	size_t bl;
	char e[5];
	size_t el;
};

struct model_set {
	char puts[MODEL_SET][4];
	int nputs;
	struct model_iv dels[MODEL_SET];
	int ndels;
};

static bool set_has(const struct model_set *s, const char *k)
{
	for (int i = 0; i < s->nputs; i++)
		if (strcmp(s->puts[i], k) == 0)
			return true;
	return false;
}

static void set_add(struct model_set *s, const char *k)
{
	if (!set_has(s, k)) {
		cr_assert_lt(s->nputs, MODEL_SET);
		strcpy(s->puts[s->nputs++], k);
	}
}

/* adt.Interval.Compare of the point [k, k+"\0") with each delete. */
static bool set_dels_hit(const struct model_set *s, const char *k)
{
	size_t kl = strlen(k);
	char kz[5];

	memcpy(kz, k, kl);
	kz[kl] = '\0';
	for (int i = 0; i < s->ndels; i++) {
		const struct model_iv *v = &s->dels[i];

		if (affine_cmp(k, kl, v->b, v->bl) < 0 && affine_cmp(kz, kl + 1, v->b, v->bl) <= 0)
			continue;
		if (affine_cmp(k, kl, v->e, v->el) >= 0)
			continue;
		return true;
	}
	return false;
}

static void set_add_del(struct model_set *s, const struct model_iv *v)
{
	cr_assert_lt(s->ndels, MODEL_SET);
	s->dels[s->ndels++] = *v;
}

/* checkIntervals(reqs) for branch |br| of |node|: true on a duplicate;
 * otherwise *out receives the branch's puts and deletes. */
static bool model_check(struct model_node *nodes, int node, int br, struct model_set *out)
{
	struct model_node *nd = &nodes[node];
	struct model_set *acc = calloc(1, sizeof(*acc));
	bool bad = false;

	cr_assert_not_null(acc);
	out->nputs = 0;
	out->ndels = 0;
	for (int i = 0; i < nd->n[br]; i++) {
		const struct model_op *o = &nd->ops[br][i];
		struct model_iv v = {.bl = strlen(o->key)};

		if (o->kind != M_DEL)
			continue;
		memcpy(v.b, o->key, v.bl);
		if (o->end_len) {
			memcpy(v.e, o->end, o->end_len);
			v.el = o->end_len;
		} else {
			memcpy(v.e, o->key, v.bl);
			v.e[v.bl] = '\0';
			v.el = v.bl + 1;
		}
		set_add_del(out, &v);
	}
	for (int i = 0; i < nd->n[br] && !bad; i++) {
		const struct model_op *o = &nd->ops[br][i];
		struct model_set *th, *el;

		if (o->kind != M_TXN)
			continue;
		th = calloc(1, sizeof(*th));
		el = calloc(1, sizeof(*el));
		cr_assert(th && el);
		bad = model_check(nodes, o->child, 0, th) || model_check(nodes, o->child, 1, el);
		for (int j = 0; j < th->nputs && !bad; j++) {
			bad = set_has(acc, th->puts[j]) || set_dels_hit(out, th->puts[j]);
			set_add(acc, th->puts[j]);
		}
		for (int j = 0; j < el->nputs && !bad; j++) {
			bad = (set_has(acc, el->puts[j]) && !set_has(th, el->puts[j])) ||
			      set_dels_hit(out, el->puts[j]);
			set_add(acc, el->puts[j]);
		}
		for (int j = 0; j < th->ndels; j++)
			set_add_del(out, &th->dels[j]);
		for (int j = 0; j < el->ndels; j++)
			set_add_del(out, &el->dels[j]);
		free(th);
		free(el);
	}
	for (int i = 0; i < nd->n[br] && !bad; i++) {
		const struct model_op *o = &nd->ops[br][i];

		if (o->kind != M_PUT)
			continue;
		bad = set_has(acc, o->key) || set_dels_hit(out, o->key);
		set_add(acc, o->key);
	}
	memcpy(out->puts, acc->puts, sizeof(acc->puts));
	out->nputs = acc->nputs;
	free(acc);
	return bad;
}

static bool model_rejects(struct model_node *nodes)
{
	struct model_set *s = calloc(1, sizeof(*s));
	bool bad;

	cr_assert_not_null(s);
	bad = model_check(nodes, 0, 0, s) || model_check(nodes, 0, 1, s);
	free(s);
	return bad;
}

static void random_key(char k[4], unsigned *seed)
{
	int len = rand_r(seed) % 2 + 1;

	for (int i = 0; i < len; i++)
		k[i] = "abc"[rand_r(seed) % 3];
	k[len] = '\0';
}

/* Adds a random op to a random node of the model and of the builder;
 * returns the builder's answer. */
static int random_add(struct model_node *nodes, int *nnodes, unsigned *seed,
		      struct model_op **ret_op, int **ret_count)
{
	int ni = rand_r(seed) % *nnodes, br = rand_r(seed) % 2;
	struct model_node *nd = &nodes[ni];
	struct model_op *o;
	struct efs_etcd_txn *child;
	int err, mode;

	if (nd->n[br] >= MODEL_OPS)
		return 1;
	o = &nd->ops[br][nd->n[br]];
	memset(o, 0, sizeof(*o));
	o->kind = (enum model_kind)(rand_r(seed) % 3);
	if (o->kind == M_TXN && *nnodes >= MODEL_NODES)
		o->kind = M_PUT;
	random_key(o->key, seed);
	switch (o->kind) {
	case M_PUT:
		err = efs_etcd_txn_put(nd->b, br, o->key, strlen(o->key), "v", 1, 0);
		break;
	case M_DEL:
		mode = rand_r(seed) % 3;
		if (mode == 1) {
			random_key(o->end, seed);
			o->end_len = strlen(o->end);
		} else if (mode == 2) {
			o->end_len = 1; /* "\0": to the end */
		}
		err = efs_etcd_txn_delete(nd->b, br, o->key, strlen(o->key), o->end, o->end_len,
					  false);
		break;
	default:
		o->child = *nnodes;
		memset(&nodes[*nnodes], 0, sizeof(nodes[0]));
		err = efs_etcd_txn_nested(nd->b, br, &child);
		if (err == 0)
			nodes[(*nnodes)++].b = child;
		break;
	}
	nd->n[br]++;
	*ret_op = o;
	*ret_count = &nd->n[br];
	return err;
}

Test(txn, duplicate_checks_agree_with_a_port_of_etcds_check_intervals)
{
	static struct model_node nodes[MODEL_NODES];
	unsigned seed = 20260;
	long adds = 0, rejected = 0;

	for (int round = 0; round < 3000; round++) {
		int nnodes = 1, steps = rand_r(&seed) % 14 + 1;

		memset(nodes, 0, sizeof(nodes));
		nodes[0].b = txn_new(0);
		for (int s = 0; s < steps; s++) {
			struct model_op *o;
			int *count;
			int err = random_add(nodes, &nnodes, &seed, &o, &count);
			bool bad;

			if (err == 1)
				continue;
			bad = model_rejects(nodes);
			cr_assert(err == 0 || err == -EINVAL, "round %d: error %d", round, err);
			cr_assert_eq(err == -EINVAL, bad, "round %d step %d: builder %d, etcd %s",
				     round, s, err, bad ? "rejects" : "accepts");
			adds++;
			if (bad) {
				(*count)--;
				rejected++;
			}
		}
		efs_etcd_txn_free(nodes[0].b);
	}
	/* The random mix must exercise both answers. */
	cr_assert_gt(rejected, adds / 50);
	cr_assert_lt(rejected, adds / 2);
	efs_test_assert_no_leaks();
}

/* ---- Responses ---- */

Test(txn, response_accessors_check_index_and_kind)
{
	Etcdserverpb__RangeResponse rr = ETCDSERVERPB__RANGE_RESPONSE__INIT;
	Etcdserverpb__PutResponse pr = ETCDSERVERPB__PUT_RESPONSE__INIT;
	Etcdserverpb__DeleteRangeResponse dr = ETCDSERVERPB__DELETE_RANGE_RESPONSE__INIT;
	Etcdserverpb__TxnResponse tr = ETCDSERVERPB__TXN_RESPONSE__INIT;
	Etcdserverpb__ResponseOp ops[6], *opp[6];
	Etcdserverpb__TxnResponse resp = ETCDSERVERPB__TXN_RESPONSE__INIT;
	Etcdserverpb__TxnResponse *back;
	Etcdserverpb__RangeResponse *r = NULL;
	Etcdserverpb__PutResponse *p = NULL;
	Etcdserverpb__DeleteRangeResponse *d = NULL;
	Etcdserverpb__TxnResponse *x = NULL;
	uint8_t buf[256];
	size_t len;

	for (int i = 0; i < 6; i++) {
		etcdserverpb__response_op__init(&ops[i]);
		opp[i] = &ops[i];
	}
	rr.count = 3;
	dr.deleted = 2;
	tr.succeeded = 1;
	ops[0].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE;
	ops[0].response_range = &rr;
	ops[1].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT;
	ops[1].response_put = &pr;
	ops[2].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_DELETE_RANGE;
	ops[2].response_delete_range = &dr;
	ops[3].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_TXN;
	ops[3].response_txn = &tr;
	/* ops[4]: no member set, as a newer server's unknown kind decodes. */
	ops[5].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT;
	ops[5].response_put = NULL;
	resp.n_responses = 6;
	resp.responses = opp;

	/* Through the wire for the first five (a NULL member cannot be packed). */
	resp.n_responses = 5;
	len = etcdserverpb__txn_response__get_packed_size(&resp);
	cr_assert_leq(len, sizeof(buf));
	etcdserverpb__txn_response__pack(&resp, buf);
	back = etcdserverpb__txn_response__unpack(NULL, len, buf);
	cr_assert_not_null(back);
	resp.n_responses = 6;

	cr_assert_eq(efs_etcd_txn_resp_range(back, 0, &r), 0);
	cr_assert_eq(r->count, 3);
	cr_assert_eq(efs_etcd_txn_resp_put(back, 1, &p), 0);
	cr_assert_not_null(p);
	cr_assert_eq(efs_etcd_txn_resp_delete(back, 2, &d), 0);
	cr_assert_eq(d->deleted, 2);
	cr_assert_eq(efs_etcd_txn_resp_txn(back, 3, &x), 0);
	cr_assert(x->succeeded);

	r = (Etcdserverpb__RangeResponse *)buf;
	cr_assert_eq(efs_etcd_txn_resp_range(back, 1, &r), -EBADMSG);
	cr_assert_eq(r, (Etcdserverpb__RangeResponse *)buf);
	cr_assert_eq(efs_etcd_txn_resp_put(back, 0, &p), -EBADMSG);
	cr_assert_eq(efs_etcd_txn_resp_delete(back, 3, &d), -EBADMSG);
	cr_assert_eq(efs_etcd_txn_resp_txn(back, 2, &x), -EBADMSG);
	cr_assert_eq(efs_etcd_txn_resp_put(back, 4, &p), -EBADMSG);
	cr_assert_eq(efs_etcd_txn_resp_range(back, 5, &r), -ERANGE);
	cr_assert_eq(efs_etcd_txn_resp_txn(back, SIZE_MAX, &x), -ERANGE);
	etcdserverpb__txn_response__free_unpacked(back, NULL);

	cr_assert_eq(efs_etcd_txn_resp_put(&resp, 5, &p), -EBADMSG);
	resp.responses[0] = NULL;
	cr_assert_eq(efs_etcd_txn_resp_range(&resp, 0, &r), -EBADMSG);
	efs_test_assert_no_leaks();
}

/* ---- Failmalloc ---- */

/* A builder scenario touching every allocation path: the first chunk,
 * array growth, an item larger than a chunk, nested builders. Returns the
 * first error; |t| is left for the caller to inspect and free. */
static int txn_scenario(struct efs_etcd_txn **ret)
{
	static char big[70000];
	struct efs_etcd_txn *t, *c;
	char key[16];
	int err;

	err = efs_etcd_txn_new(&t, 0);
	if (err < 0)
		return err;
	*ret = t;
	for (int i = 0; i < 10; i++) {
		int n = snprintf(key, sizeof(key), "key/%d", i);

		err = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_LESS, key, (size_t)n,
					   i);
		if (err < 0)
			return err;
		err = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key, (size_t)n, "v", 1, 0);
		if (err < 0)
			return err;
	}
	err = efs_etcd_txn_compare_value(t, EFS_ETCD_CMP_EQUAL, S("big"), big, sizeof(big));
	if (err < 0)
		return err;
	err = efs_etcd_txn_nested(t, EFS_ETCD_TXN_FAILURE, &c);
	if (err < 0)
		return err;
	err = efs_etcd_txn_delete(c, EFS_ETCD_TXN_SUCCESS, S("d/"), S("d0"), true);
	if (err < 0)
		return err;
	err = efs_etcd_txn_range(c, EFS_ETCD_TXN_FAILURE, S("r"), NULL, 0);
	if (err < 0)
		return err;
	return efs_etcd_txn_put(t, EFS_ETCD_TXN_FAILURE, S("after"), big, 10, 0);
}

Test(txn, failmalloc_sweep_gives_enomem_at_every_allocation_and_stays_usable)
{
	struct efs_etcd_txn *t = NULL;
	long count;

	efs_mem_fail_after(-1);
	cr_assert_eq(txn_scenario(&t), 0);
	count = efs_mem_count();
	efs_etcd_txn_free(t);
	cr_assert_geq(count, 4, "scenario made only %ld allocations", count);
	for (long i = 0; i < count; i++) {
		Etcdserverpb__TxnRequest *back;

		t = NULL;
		efs_mem_fail_after(i);
		cr_assert_eq(txn_scenario(&t), -ENOMEM, "allocation %ld", i);
		efs_mem_fail_reset();
		if (!t) {
			cr_assert_eq(i, 0);
			continue;
		}
		/* What was built before the failure is intact and still
		 * accepts additions. */
		cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_FAILURE, S("z"), S("1"), 0), 0);
		back = round_trip(t);
		cr_assert_geq(back->n_failure, 1);
		etcdserverpb__txn_request__free_unpacked(back, NULL);
		efs_etcd_txn_free(t);
	}
	efs_mem_fail_after(count);
	cr_assert_eq(txn_scenario(&t), 0);
	efs_etcd_txn_free(t);
	efs_test_assert_no_leaks();
}
