/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The checker's table of key families (lib/fsck/load.c): every family of
 * meta/keys.h has a row, and a key or value that does not parse is a
 * finding. The keys are fed to efs_check__load_kv one by one, into a state
 * built as efs_check_run builds it, without etcd.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "fsck/check-int.h"
#include "meta/keys.h"
#include "util/mem.h"
#include "kv.pb-c.h"

TestSuite(fsck_keys, .fini = efs_mem_fail_reset, .timeout = 30);

/* Not a protobuf message: a field tag whose varint never ends. */
static const uint8_t garbage[] = {0xff};

/* A report and its state, set up as efs_check_run sets them up. */
static struct efs_check_report *report_new(void)
{
	struct efs_check_report *rep = efs_mem_calloc(1, sizeof(*rep));
	state_t *st = efs_mem_calloc(1, sizeof(*st));

	cr_assert(rep && st);
	rep->priv = st;
	st->rep = rep;
	st->blind = NONE;
	cr_assert_eq(efs_meta_ns_init(&st->ns, "fs1"), 0);
	return rep;
}

static int load(state_t *st, const void *key, size_t keylen, const void *val, size_t vallen)
{
	Mvccpb__KeyValue kv = MVCCPB__KEY_VALUE__INIT;

	kv.key.data = (uint8_t *)key;
	kv.key.len = keylen;
	kv.value.data = (uint8_t *)val;
	kv.value.len = vallen;
	kv.mod_revision = 7;
	return efs_check__load_kv(st, &kv);
}

/* A well-formed key of family |f|. */
static void key_of(const struct efs_meta_ns *ns, enum efs_meta_family f, struct efs_meta_key *k)
{
	int r = -EINVAL;

	switch (f) {
	case EFS_META_K_SB:
		r = efs_meta_key_sb(ns, k);
		break;
	case EFS_META_K_INODE:
		r = efs_meta_key_inode(ns, 5, k);
		break;
	case EFS_META_K_DIRENT:
		r = efs_meta_key_dirent(ns, EFS_META_ROOT_INO, "a", 1, k);
		break;
	case EFS_META_K_XATTR:
		r = efs_meta_key_xattr(ns, 5, "user.a", 6, k);
		break;
	case EFS_META_K_EXTENT:
		r = efs_meta_key_extent(ns, 5, 0, k);
		break;
	case EFS_META_K_HOLDER:
		r = efs_meta_key_holder(ns, 5, EFS_META_LOCK_SHARED, "n1", k);
		break;
	case EFS_META_K_RECALL:
		r = efs_meta_key_recall(ns, 5, 1, "n1", k);
		break;
	case EFS_META_K_OPEN:
		r = efs_meta_key_open(ns, 5, "n1", k);
		break;
	case EFS_META_K_PLOCK:
		r = efs_meta_key_plock(ns, 5, "n1", 3, k);
		break;
	case EFS_META_K_NODE:
		r = efs_meta_key_node(ns, "n1", k);
		break;
	case EFS_META_K_GEN:
		r = efs_meta_key_gen(ns, "n1", k);
		break;
	case EFS_META_K_AG_OWNER:
	case EFS_META_K_AG_MAP:
	case EFS_META_K_AG_FREE:
		r = efs_meta_key_ag(ns, 0, f, k);
		break;
	case EFS_META_K_FREE_INTENT:
		r = efs_meta_key_free_intent(ns, 0, "n1", 2, 1, k);
		break;
	case EFS_META_K_ORPHAN:
		r = efs_meta_key_orphan(ns, 5, k);
		break;
	case EFS_META_K_RECLAIM:
		r = efs_meta_key_reclaim(ns, 5, k);
		break;
	case EFS_META_K_INO_COUNTER:
		r = efs_meta_key_ino_counter(ns, k);
		break;
	case EFS_META_K_RENAMESEQ:
		r = efs_meta_key_renameseq(ns, k);
		break;
	case EFS_META_K_MAINT:
		r = efs_meta_key_maint(ns, k);
		break;
	case EFS_META_K_PIN:
		r = efs_meta_key_pin(ns, "p1", k);
		break;
	case EFS_META_K_HANDOVER:
		r = efs_meta_key_handover(ns, "n1", k);
		break;
	case EFS_META_K_SYNC:
		r = efs_meta_key_sync(ns, "b1", k);
		break;
	case EFS_META_K_SYNC_ACK:
		r = efs_meta_key_sync_ack(ns, "b1", "n1", k);
		break;
	}
	cr_assert_eq(r, 0, "no key built for family %d", (int)f);
}

/* Loads a well-formed key of family |f| whose value is not a record. */
static void load_garbage(state_t *st, enum efs_meta_family f)
{
	struct efs_meta_key key;

	key_of(&st->ns, f, &key);
	cr_assert_eq(load(st, key.buf, key.len, garbage, sizeof(garbage)), 0, "family %d", (int)f);
	cr_assert_eq(st->err, 0);
}

Test(fsck_keys, every_family_has_a_row_with_a_name_and_a_handler)
{
	struct efs_meta_ns ns;
	struct efs_meta_range range;
	int f;

	cr_assert_eq(efs_meta_ns_init(&ns, "fs1"), 0);
	/* The families are 1.. as far as meta/keys.h knows them (it gives each
	 * a range), so a family added there without a row fails here. */
	for (f = EFS_META_K_SB; efs_meta_range_family(&ns, f, &range) == 0; f++) {
		const struct efs_check__family *row = efs_check__family_of(f);

		cr_assert_not_null(row, "family %d has no row", f);
		cr_assert_eq(row->family, (enum efs_meta_family)f);
		cr_assert(row->name && row->name[0], "family %d has no name", f);
		cr_assert_not_null(row->load, "family %d has no handler", f);
	}
	cr_assert_gt(f, EFS_META_K_SYNC_ACK, "the families end before EFS_META_K_SYNC_ACK (%d)",
		     f);
	cr_assert_null(efs_check__family_of(f));
}

Test(fsck_keys, unknown_families_have_no_row)
{
	cr_assert_null(efs_check__family_of((enum efs_meta_family)0));
	cr_assert_null(efs_check__family_of((enum efs_meta_family)(EFS_META_K_SYNC_ACK + 1)));
	cr_assert_null(efs_check__family_of((enum efs_meta_family)1000));
	cr_assert_null(efs_check__family_of((enum efs_meta_family)-1));
}

static const char *name_of(enum efs_meta_family f)
{
	const struct efs_check__family *row = efs_check__family_of(f);

	cr_assert_not_null(row, "family %d has no row", (int)f);
	return row->name;
}

Test(fsck_keys, rows_keep_the_names_of_the_messages)
{
	cr_assert_str_eq(name_of(EFS_META_K_INODE), "inode record");
	cr_assert_str_eq(name_of(EFS_META_K_SB), "filesystem record (sb)");
	cr_assert_str_eq(name_of(EFS_META_K_PLOCK), "byte-range lock record");
	cr_assert_str_eq(name_of(EFS_META_K_PIN), "revision pin");
}

Test(fsck_keys, a_key_of_no_family_is_a_finding_whose_repair_deletes_it)
{
	static const char *const bad[] = {
	    "/etcfs/fs1/zz",	 /* no such family */
	    "/etcfs/fs1/sbx",	 /* trailing bytes */
	    "/etcfs/fs1/i/",	 /* truncated inode number */
	    "/etcfs/fs2/sb",	 /* another filesystem's prefix */
	    "/etcfs/fs1/n/a b", /* a bad node id */
	};
	struct efs_check_report *rep = report_new();
	state_t *st = rep->priv;
	struct efs_meta_key_info ki;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct efs_check_finding *f;

		cr_assert_lt(efs_meta_key_parse(&st->ns, (const uint8_t *)bad[i], strlen(bad[i]),
						&ki),
			     0, "%s parses", bad[i]);
		cr_assert_eq(load(st, bad[i], strlen(bad[i]), garbage, sizeof(garbage)), 0);
		cr_assert_eq(st->err, 0);
		cr_assert_eq(rep->n_findings, i + 1);
		f = &rep->findings[i];
		cr_assert_eq(f->inv, EFS_CHECK_INV_RECORD);
		cr_assert_eq(f->severity, EFS_CHECK_ERROR);
		cr_assert(strstr(f->message, "is not a key of any etcfs family"), "%s", f->message);
		cr_assert_str_eq(f->repair, "delete it");
		cr_assert_eq(f->n_ops, 1);
		cr_assert_eq(f->ops[0].kind, OP_DEL);
		cr_assert_eq(f->ops[0].mod, 7);
		cr_assert_eq(f->ops[0].key.len, strlen(bad[i]));
		cr_assert_eq(memcmp(f->ops[0].key.buf, bad[i], strlen(bad[i])), 0);
	}
	cr_assert_str_eq(rep->findings[0].message,
			 "key zz is not a key of any etcfs family (format version 1)");
	cr_assert_str_eq(rep->findings[1].message,
			 "key sbx is not a key of any etcfs family (format version 1)");
	cr_assert_eq(st->n_keys, 0);
	cr_assert_eq(st->n_inos, 0);
	efs_check_report_free(rep);
	efs_test_assert_no_leaks();
}

/* What loading a value that is not a record of the family leaves behind. */
struct bad_value {
	enum efs_meta_family family;
	bool finding;	    /* reported here (else by a later stage, or never) */
	const char *repair; /* NULL: none decided here */
	bool key;	    /* kept in |keys|, marked bad */
};

static const struct bad_value bad_values[] = {
    {EFS_META_K_SB, true, NULL, false},
    {EFS_META_K_INODE, true,
     "delete it (names that point to it are then removed, and its other keys with it)", false},
    {EFS_META_K_DIRENT, true, "delete it", false},
    {EFS_META_K_XATTR, false, NULL, false},
    {EFS_META_K_EXTENT, true, NULL, true},
    {EFS_META_K_HOLDER, true, "delete it", true},
    {EFS_META_K_RECALL, true, "delete it", true},
    {EFS_META_K_OPEN, true, "delete it", true},
    {EFS_META_K_PLOCK, true, "delete it", true},
    {EFS_META_K_NODE, true, "delete it", true},
    {EFS_META_K_GEN, true, NULL, false},
    {EFS_META_K_AG_OWNER, true, "delete it", true},
    {EFS_META_K_AG_MAP, true, NULL, true},
    {EFS_META_K_AG_FREE, false, NULL, true},
    {EFS_META_K_FREE_INTENT, true, NULL, true},
    {EFS_META_K_ORPHAN, false, NULL, true},
    {EFS_META_K_RECLAIM, false, NULL, true},
    {EFS_META_K_INO_COUNTER, true, NULL, false},
    {EFS_META_K_RENAMESEQ, true,
     "rewrite it as sequence 0 (any value works: renames compare its revision)", false},
    {EFS_META_K_MAINT, false, NULL, false},
    {EFS_META_K_PIN, false, NULL, false},
    {EFS_META_K_HANDOVER, false, NULL, false},
    {EFS_META_K_SYNC, false, NULL, false},
    {EFS_META_K_SYNC_ACK, false, NULL, false},
};

Test(fsck_keys, a_value_that_does_not_decode_is_a_clean_finding)
{
	size_t n = sizeof(bad_values) / sizeof(bad_values[0]);

	cr_assert_eq(n, EFS_META_K_SYNC_ACK, "a family is missing from bad_values");
	for (size_t i = 0; i < n; i++) {
		const struct bad_value *bv = &bad_values[i];
		const struct efs_check__family *row = efs_check__family_of(bv->family);
		struct efs_check_report *rep = report_new();
		state_t *st = rep->priv;

		cr_assert_not_null(row);
		load_garbage(st, bv->family);
		cr_assert_eq(rep->n_findings, bv->finding ? 1 : 0, "%s", row->name);
		if (bv->finding) {
			const struct efs_check_finding *f = &rep->findings[0];

			cr_assert_eq(f->inv, EFS_CHECK_INV_RECORD);
			cr_assert_eq(f->severity, EFS_CHECK_ERROR);
			cr_assert_eq(strncmp(f->message, row->name, strlen(row->name)), 0, "%s",
				     f->message);
			cr_assert(strstr(f->message, " cannot be decoded: not a valid record"),
				  "%s", f->message);
			if (bv->repair) {
				cr_assert_str_eq(f->repair, bv->repair);
				cr_assert_eq(f->n_ops, 1, "%s", row->name);
			} else {
				cr_assert_null(f->repair, "%s: %s", row->name, f->repair);
				cr_assert_eq(f->n_ops, 0, "%s", row->name);
			}
		}
		cr_assert_eq(st->n_keys, bv->key || bv->family == EFS_META_K_XATTR ? 1 : 0, "%s",
			     row->name);
		if (bv->key)
			cr_assert(st->keys[0].bad, "%s", row->name);
		cr_assert_eq(st->n_inos, 0);
		cr_assert_eq(st->n_des, 0);
		efs_check_report_free(rep);
	}
	efs_test_assert_no_leaks();
}

Test(fsck_keys, messages_name_the_record)
{
	struct efs_check_report *rep = report_new();
	state_t *st = rep->priv;

	load_garbage(st, EFS_META_K_INODE);
	load_garbage(st, EFS_META_K_DIRENT);
	load_garbage(st, EFS_META_K_NODE);
	cr_assert_eq(rep->n_findings, 3);
	cr_assert_str_eq(rep->findings[0].message,
			 "inode record of inode 5 cannot be decoded: not a valid record");
	cr_assert_str_eq(rep->findings[1].message,
			 "directory entry \"a\" in directory inode 1 cannot be decoded: "
			 "not a valid record");
	cr_assert_str_eq(rep->findings[2].message,
			 "node record n/n1 cannot be decoded: not a valid record");
	/* An inode record that does not decode still used its number. */
	cr_assert_eq(st->max_ino, 5);
	cr_assert(st->keys[0].removed);
	efs_check_report_free(rep);
	efs_test_assert_no_leaks();
}

Test(fsck_keys, shared_handlers_keep_their_families_apart)
{
	struct efs_check_report *rep = report_new();
	state_t *st = rep->priv;

	/* Extent chunks and free intents that do not decode blind the leak
	 * check; orphan records tell an unparsable value (b = 0) apart. */
	load_garbage(st, EFS_META_K_EXTENT);
	cr_assert_eq(st->blind, 0);
	load_garbage(st, EFS_META_K_ORPHAN);
	cr_assert_eq(st->n_keys, 2);
	cr_assert_eq(st->keys[1].family, EFS_META_K_ORPHAN);
	cr_assert(st->keys[1].bad);
	cr_assert_eq(st->keys[1].b, 0);
	cr_assert_not(st->keys[1].removed);
	load_garbage(st, EFS_META_K_INO_COUNTER);
	cr_assert(st->counter_present && st->counter_bad);
	cr_assert_eq(st->counter_mod, 7);
	efs_check_report_free(rep);
	efs_test_assert_no_leaks();
}

Test(fsck_keys, an_empty_value_of_any_family_does_not_crash)
{
	for (int f = EFS_META_K_SB; f <= EFS_META_K_SYNC_ACK; f++) {
		struct efs_check_report *rep = report_new();
		state_t *st = rep->priv;
		struct efs_meta_key key;

		key_of(&st->ns, (enum efs_meta_family)f, &key);
		cr_assert_eq(load(st, key.buf, key.len, "", 0), 0);
		cr_assert_eq(st->err, 0);
		for (size_t i = 0; i < rep->n_findings; i++)
			cr_assert_not_null(rep->findings[i].message);
		efs_check_report_free(rep);
	}
	efs_test_assert_no_leaks();
}

Test(fsck_keys, allocation_failures_are_reported_not_crashes)
{
	for (int f = EFS_META_K_SB; f <= EFS_META_K_SYNC_ACK; f++) {
		for (long n = 0;; n++) {
			struct efs_check_report *rep = report_new();
			state_t *st = rep->priv;
			struct efs_meta_key key;
			unsigned long failures = efs_mem_failures();
			bool failed;
			int r;

			key_of(&st->ns, (enum efs_meta_family)f, &key);
			efs_mem_fail_after(n);
			r = load(st, key.buf, key.len, garbage, sizeof(garbage));
			if (!r)
				r = st->err;
			failed = efs_mem_failures() != failures;
			efs_mem_fail_reset();
			efs_check_report_free(rep);
			if (!failed) {
				cr_assert_eq(r, 0, "family %d: %d", f, r);
				break;
			}
			cr_assert_eq(r, -ENOMEM, "family %d, allocation %ld: %d", f, n, r);
		}
	}
	efs_test_assert_no_leaks();
}
