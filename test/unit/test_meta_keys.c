/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "etcd/keys.h"
#include "meta/keys.h"
#include "util/mem.h"

TestSuite(meta_keys, .fini = efs_mem_fail_reset, .timeout = 30);

static struct efs_meta_ns ns;

static void ns_setup(void)
{
	cr_assert_eq(efs_meta_ns_init(&ns, "fs1"), 0);
}

static int key_cmp(const struct efs_meta_key *a, const struct efs_meta_key *b)
{
	return efs_etcd_key_cmp(a->buf, a->len, b->buf, b->len);
}

static bool in_range(const struct efs_meta_key *k, const struct efs_meta_range *r)
{
	if (efs_etcd_key_cmp(k->buf, k->len, r->key.buf, r->key.len) < 0)
		return false;
	if (r->end.len == 0)
		return key_cmp(k, &r->key) == 0;
	if (r->end.len == 1 && r->end.buf[0] == 0)
		return true;
	return efs_etcd_key_cmp(k->buf, k->len, r->end.buf, r->end.len) < 0;
}

static struct efs_meta_key_info parse_ok(const struct efs_meta_key *k)
{
	struct efs_meta_key_info info;

	cr_assert_eq(efs_meta_key_parse(&ns, k->buf, k->len, &info), 0, "key did not parse");
	return info;
}

/* ---- Names and identifiers ---- */

Test(meta_keys, fsname_accepts_the_portable_set_up_to_64_bytes)
{
	char name[66];

	cr_assert(efs_meta_fsname_is_valid("fs-1.prod_A"));
	memset(name, 'a', 64);
	name[64] = '\0';
	cr_assert(efs_meta_fsname_is_valid(name));
	name[64] = 'a';
	name[65] = '\0';
	cr_assert_not(efs_meta_fsname_is_valid(name));
	cr_assert_not(efs_meta_fsname_is_valid(""));
	cr_assert_not(efs_meta_fsname_is_valid("."));
	cr_assert_not(efs_meta_fsname_is_valid(".."));
	cr_assert_not(efs_meta_fsname_is_valid("a/b"));
	cr_assert_not(efs_meta_fsname_is_valid("a b"));
	cr_assert_not(efs_meta_fsname_is_valid("é"));
	cr_assert_not(efs_meta_fsname_is_valid(NULL));
}

Test(meta_keys, ns_init_builds_the_prefix_and_refuses_bad_names)
{
	struct efs_meta_ns n;

	cr_assert_eq(efs_meta_ns_init(&n, "prod"), 0);
	cr_assert_eq(n.len, strlen("/etcfs/prod/"));
	cr_assert_eq(memcmp(n.prefix, "/etcfs/prod/", n.len), 0);
	cr_assert_str_eq(n.name, "prod");
	memset(&n, 0x5a, sizeof(n));
	cr_assert_eq(efs_meta_ns_init(&n, "a/b"), -EINVAL);
	cr_assert_eq(n.len, (size_t)0x5a5a5a5a5a5a5a5aull, "ns touched on failure");
}

Test(meta_keys, node_id_accepts_64_bytes_and_refuses_65)
{
	char node[66];

	memset(node, 'n', 65);
	node[64] = '\0';
	cr_assert(efs_meta_node_is_valid(node));
	node[64] = 'n';
	node[65] = '\0';
	cr_assert_not(efs_meta_node_is_valid(node));
	cr_assert_not(efs_meta_node_is_valid(""));
	cr_assert_not(efs_meta_node_is_valid("a/b"));
	cr_assert_not(efs_meta_node_is_valid("a:b"));
	cr_assert(efs_meta_node_is_valid("host-1.example_com"));
}

Test(meta_keys, name_check_edges)
{
	char name[257];

	memset(name, 'x', sizeof(name));
	cr_assert_eq(efs_meta_name_check(name, 255), 0);
	cr_assert_eq(efs_meta_name_check(name, 256), -ENAMETOOLONG);
	cr_assert_eq(efs_meta_name_check(name, 0), -EINVAL);
	cr_assert_eq(efs_meta_name_check("a/b", 3), -EINVAL);
	cr_assert_eq(efs_meta_name_check("a\0b", 3), -EINVAL);
	cr_assert_eq(efs_meta_name_check(".", 1), -EINVAL);
	cr_assert_eq(efs_meta_name_check("..", 2), -EINVAL);
	cr_assert_eq(efs_meta_name_check("...", 3), 0);
	cr_assert_eq(efs_meta_name_check(".a", 2), 0);
	cr_assert_eq(efs_meta_name_check("\xff\x01 ", 3), 0, "any other byte is allowed");
	/* Too long wins over a bad byte, as the kernel reports it. */
	name[10] = '/';
	cr_assert_eq(efs_meta_name_check(name, 256), -ENAMETOOLONG);
}

Test(meta_keys, xattr_name_check_allows_slash_and_refuses_nul_and_length)
{
	char name[257];

	memset(name, 'x', sizeof(name));
	cr_assert_eq(efs_meta_xattr_name_check("user.a/b", 8), 0);
	cr_assert_eq(efs_meta_xattr_name_check(name, 255), 0);
	cr_assert_eq(efs_meta_xattr_name_check(name, 256), -ERANGE);
	cr_assert_eq(efs_meta_xattr_name_check("user.\0", 6), -EINVAL);
	cr_assert_eq(efs_meta_xattr_name_check("", 0), -EINVAL);
}

/* ---- Round trips ---- */

Test(meta_keys, single_keys_round_trip, .init = ns_setup)
{
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_key_sb(&ns, &k), 0);
	cr_assert_eq(k.len, strlen("/etcfs/fs1/sb"));
	cr_assert_eq(memcmp(k.buf, "/etcfs/fs1/sb", k.len), 0);
	cr_assert_eq(parse_ok(&k).family, EFS_META_K_SB);
	cr_assert_eq(efs_meta_key_ino_counter(&ns, &k), 0);
	cr_assert_eq(memcmp(k.buf, "/etcfs/fs1/ino", k.len), 0);
	cr_assert_eq(parse_ok(&k).family, EFS_META_K_INO_COUNTER);
	cr_assert_eq(efs_meta_key_renameseq(&ns, &k), 0);
	cr_assert_eq(memcmp(k.buf, "/etcfs/fs1/renameseq", k.len), 0);
	cr_assert_eq(parse_ok(&k).family, EFS_META_K_RENAMESEQ);
}

Test(meta_keys, inode_orphan_reclaim_round_trip_big_endian, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_key_info info;
	const uint64_t inos[] = {1, 258, UINT64_MAX, 0x0102030405060708ull};

	cr_assert_eq(efs_meta_key_inode(&ns, 258, &k), 0);
	cr_assert_eq(k.len, 21);
	cr_assert_eq(memcmp(k.buf, "/etcfs/fs1/i/\0\0\0\0\0\0\1\2", 21), 0);
	for (size_t i = 0; i < sizeof(inos) / sizeof(inos[0]); i++) {
		cr_assert_eq(efs_meta_key_inode(&ns, inos[i], &k), 0);
		info = parse_ok(&k);
		cr_assert_eq(info.family, EFS_META_K_INODE);
		cr_assert_eq(info.ino, inos[i]);
		cr_assert_eq(efs_meta_key_orphan(&ns, inos[i], &k), 0);
		info = parse_ok(&k);
		cr_assert_eq(info.family, EFS_META_K_ORPHAN);
		cr_assert_eq(info.ino, inos[i]);
		cr_assert_eq(efs_meta_key_reclaim(&ns, inos[i], &k), 0);
		info = parse_ok(&k);
		cr_assert_eq(info.family, EFS_META_K_RECLAIM);
		cr_assert_eq(info.ino, inos[i]);
	}
}

Test(meta_keys, dirent_round_trips_names_of_every_length, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_key_info info;
	char name[255];

	for (size_t len = 1; len <= 255; len++) {
		for (size_t i = 0; i < len; i++)
			name[i] = (char)(1 + (i * 7 + len) % 255); /* bytes 1..255 */
		for (size_t i = 0; i < len; i++)
			if (name[i] == '/' || name[i] == '\0')
				name[i] = 'q';
		if (len <= 2 && name[0] == '.')
			name[0] = 'd';
		cr_assert_eq(efs_meta_key_dirent(&ns, 77, name, len, &k), 0, "len %zu", len);
		info = parse_ok(&k);
		cr_assert_eq(info.family, EFS_META_K_DIRENT);
		cr_assert_eq(info.ino, 77);
		cr_assert_eq(info.name_len, len);
		cr_assert_eq(memcmp(info.name, name, len), 0);
		cr_assert_eq(info.name, k.buf + k.len - len, "name borrowed from the key");
	}
}

Test(meta_keys, dirent_builder_refuses_bad_names_and_keeps_key, .init = ns_setup)
{
	struct efs_meta_key k;
	char name[256];

	memset(name, 'a', sizeof(name));
	k.len = 12345;
	cr_assert_eq(efs_meta_key_dirent(&ns, 1, name, 256, &k), -ENAMETOOLONG);
	cr_assert_eq(efs_meta_key_dirent(&ns, 1, "a/b", 3, &k), -EINVAL);
	cr_assert_eq(efs_meta_key_dirent(&ns, 1, "a\0b", 3, &k), -EINVAL);
	cr_assert_eq(efs_meta_key_dirent(&ns, 1, "", 0, &k), -EINVAL);
	cr_assert_eq(efs_meta_key_dirent(&ns, 1, ".", 1, &k), -EINVAL);
	cr_assert_eq(efs_meta_key_dirent(&ns, 1, "..", 2, &k), -EINVAL);
	cr_assert_eq(efs_meta_key_dirent(&ns, 0, "a", 1, &k), -EINVAL);
	cr_assert_eq(k.len, 12345, "key touched on failure");
	cr_assert_eq(efs_meta_key_dirent(&ns, 1, name, 255, &k), 0);
}

Test(meta_keys, xattr_round_trips_with_slash_in_name, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_key_info info;

	cr_assert_eq(efs_meta_key_xattr(&ns, 9, "user.a/b", 8, &k), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_XATTR);
	cr_assert_eq(info.ino, 9);
	cr_assert_eq(info.name_len, 8);
	cr_assert_eq(memcmp(info.name, "user.a/b", 8), 0);
	cr_assert_eq(efs_meta_key_xattr(&ns, 0, "user.a", 6, &k), -EINVAL);
	cr_assert_eq(efs_meta_key_xattr(&ns, 9, "", 0, &k), -EINVAL);
}

Test(meta_keys, extent_round_trip, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_key_info info;

	cr_assert_eq(efs_meta_key_extent(&ns, 5, 0, &k), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_EXTENT);
	cr_assert_eq(info.ino, 5);
	cr_assert_eq(info.num, 0);
	cr_assert_eq(efs_meta_key_extent(&ns, 5, UINT64_MAX, &k), 0);
	cr_assert_eq(parse_ok(&k).num, UINT64_MAX);
}

Test(meta_keys, holder_recall_open_round_trip, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_key_info info;
	char node[65];

	memset(node, 'N', 64);
	node[64] = '\0';
	cr_assert_eq(efs_meta_key_holder(&ns, 3, EFS_META_LOCK_EXCLUSIVE, node, &k), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_HOLDER);
	cr_assert_eq(info.ino, 3);
	cr_assert_eq(info.mode, 'X');
	cr_assert_str_eq(info.node, node);
	cr_assert_eq(efs_meta_key_holder(&ns, 3, EFS_META_LOCK_SHARED, "n1", &k), 0);
	cr_assert_eq(parse_ok(&k).mode, 'S');
	cr_assert_eq(efs_meta_key_holder(&ns, 3, 'Q', "n1", &k), -EINVAL);
	cr_assert_eq(efs_meta_key_holder(&ns, 3, 'S', "bad/node", &k), -EINVAL);

	cr_assert_eq(efs_meta_key_recall(&ns, 3, 0x1122334455667788ull, "n-2", &k), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_RECALL);
	cr_assert_eq(info.ino, 3);
	cr_assert_eq(info.num, 0x1122334455667788ull);
	cr_assert_str_eq(info.node, "n-2");

	cr_assert_eq(efs_meta_key_open(&ns, 4, "n.3", &k), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_OPEN);
	cr_assert_eq(info.ino, 4);
	cr_assert_str_eq(info.node, "n.3");
	cr_assert_eq(efs_meta_key_open(&ns, 4, "", &k), -EINVAL);
}

Test(meta_keys, plock_round_trip_with_slash_bytes_in_owner, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_key_info info;
	uint64_t owner = 0x2f2f2f2f2f2f2f2full; /* eight '/' bytes */

	cr_assert_eq(efs_meta_key_plock(&ns, 10, "node", owner, &k), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_PLOCK);
	cr_assert_eq(info.ino, 10);
	cr_assert_eq(info.num, owner);
	cr_assert_str_eq(info.node, "node");
}

Test(meta_keys, node_and_generation_round_trip, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_key_info info;

	cr_assert_eq(efs_meta_key_node(&ns, "host1", &k), 0);
	cr_assert_eq(memcmp(k.buf, "/etcfs/fs1/n/host1", k.len), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_NODE);
	cr_assert_str_eq(info.node, "host1");
	cr_assert_eq(efs_meta_key_gen(&ns, "host1", &k), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_GEN);
	cr_assert_str_eq(info.node, "host1");
	cr_assert_eq(efs_meta_key_node(&ns, "..", &k), -EINVAL);
}

/* |k| is the key |text|, of |family| with |node| (as the parser says). */
static struct efs_meta_key_info assert_key_is(const struct efs_meta_key *k, const char *text,
					      enum efs_meta_family family, const char *node)
{
	struct efs_meta_key_info info;

	cr_assert_eq(k->len, strlen(text));
	cr_assert_eq(memcmp(k->buf, text, k->len), 0);
	info = parse_ok(k);
	cr_assert_eq(info.family, family);
	cr_assert_str_eq(info.node, node);
	return info;
}

Test(meta_keys, handover_request_round_trips_and_has_its_own_range, .init = ns_setup)
{
	struct efs_meta_key k, n;
	struct efs_meta_range r;

	cr_assert_eq(efs_meta_key_handover(&ns, "host1", &k), 0);
	(void)assert_key_is(&k, "/etcfs/fs1/ho/host1", EFS_META_K_HANDOVER, "host1");
	cr_assert_eq(efs_meta_key_handover(&ns, "a/b", &k), -EINVAL);
	cr_assert_eq(efs_meta_range_handovers(&ns, &r), 0);
	cr_assert_eq(efs_meta_key_handover(&ns, "host1", &k), 0);
	cr_assert(memcmp(k.buf, r.key.buf, r.key.len) == 0);
	cr_assert_eq(efs_meta_key_node(&ns, "host1", &n), 0);
	cr_assert(memcmp(n.buf, r.key.buf, r.key.len) != 0, "n/ is outside ho/");
}

Test(meta_keys, sync_request_and_answer_round_trip_and_have_their_ranges, .init = ns_setup)
{
	struct efs_meta_key k, a, n;
	struct efs_meta_key_info info;
	struct efs_meta_range all, acks;

	cr_assert_eq(efs_meta_key_sync(&ns, "backup.12", &k), 0);
	(void)assert_key_is(&k, "/etcfs/fs1/sync/backup.12", EFS_META_K_SYNC, "backup.12");
	cr_assert_eq(efs_meta_key_sync_ack(&ns, "backup.12", "host1", &a), 0);
	info = assert_key_is(&a, "/etcfs/fs1/sync/backup.12/host1", EFS_META_K_SYNC_ACK, "host1");
	cr_assert_eq(info.name_len, strlen("backup.12"));
	cr_assert_eq(memcmp(info.name, "backup.12", info.name_len), 0);
	cr_assert_eq(efs_meta_key_sync(&ns, "a/b", &k), -EINVAL);
	cr_assert_eq(efs_meta_key_sync_ack(&ns, "a/b", "host1", &k), -EINVAL);
	cr_assert_eq(efs_meta_key_sync_ack(&ns, "b", "..", &k), -EINVAL);
	cr_assert_eq(efs_meta_range_syncs(&ns, &all), 0);
	cr_assert_eq(efs_meta_range_sync_acks(&ns, "backup.12", &acks), 0);
	cr_assert(memcmp(a.buf, acks.key.buf, acks.key.len) == 0);
	cr_assert(memcmp(a.buf, all.key.buf, all.key.len) == 0);
	/* The request itself is outside its answers' range. */
	cr_assert(efs_meta_key_sync(&ns, "backup.12", &k) == 0 &&
		  (k.len < acks.key.len || memcmp(k.buf, acks.key.buf, acks.key.len) != 0));
	/* Another request's answers too ("backup.123" starts like "backup.12"). */
	cr_assert_eq(efs_meta_key_sync_ack(&ns, "backup.123", "host1", &n), 0);
	cr_assert(memcmp(n.buf, acks.key.buf, acks.key.len) != 0);
	/* Malformed: an empty id or node, a third part. */
	for (size_t i = 0; i < 3; i++) {
		static const char *const bad[] = {"/etcfs/fs1/sync/", "/etcfs/fs1/sync//h",
						  "/etcfs/fs1/sync/a/b/c"};
		struct efs_meta_key_info bi;

		cr_assert_eq(efs_meta_key_parse(&ns, (const uint8_t *)bad[i], strlen(bad[i]),
						&bi),
			     -EINVAL, "%s", bad[i]);
	}
}

/* The allocators' hold reads this range: every backup pin, no other pin. */
Test(meta_keys, backup_pin_range_covers_backup_pins_only, .init = ns_setup)
{
	static const char *const in[] = {"backup.1.2", "backup.12345.1700000000", "backup."};
	static const char *const out[] = {"backup", "backupx.1", "maint.1", "a", "backuo.9"};
	struct efs_meta_range r;
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_range_backup_pins(&ns, &r), 0);
	for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
		cr_assert_eq(efs_meta_key_pin(&ns, in[i], &k), 0, "%s", in[i]);
		cr_assert(in_range(&k, &r), "pin/%s is outside the range", in[i]);
	}
	for (size_t i = 0; i < sizeof(out) / sizeof(out[0]); i++) {
		cr_assert_eq(efs_meta_key_pin(&ns, out[i], &k), 0, "%s", out[i]);
		cr_assert(!in_range(&k, &r), "pin/%s is inside the range", out[i]);
	}
}

Test(meta_keys, group_keys_round_trip, .init = ns_setup)
{
	const enum efs_meta_family fams[] = {EFS_META_K_AG_OWNER, EFS_META_K_AG_MAP,
					     EFS_META_K_AG_FREE};
	struct efs_meta_key k;
	struct efs_meta_key_info info;

	for (size_t i = 0; i < 3; i++) {
		cr_assert_eq(efs_meta_key_ag(&ns, 0x2f2f2f2f, fams[i], &k), 0);
		info = parse_ok(&k);
		cr_assert_eq(info.family, fams[i]);
		cr_assert_eq(info.group, 0x2f2f2f2f);
	}
	cr_assert_eq(efs_meta_key_ag(&ns, 1, EFS_META_K_INODE, &k), -EINVAL);
	cr_assert_eq(efs_meta_key_free_intent(&ns, 7, "nd", 0x2f00000000000001ull, 42, &k), 0);
	info = parse_ok(&k);
	cr_assert_eq(info.family, EFS_META_K_FREE_INTENT);
	cr_assert_eq(info.group, 7);
	cr_assert_str_eq(info.node, "nd");
	cr_assert_eq(info.session, 0x2f00000000000001ull);
	cr_assert_eq(info.num, 42);
	cr_assert_eq(efs_meta_key_free_intent(&ns, 7, "n/d", 1, 1, &k), -EINVAL);
}

/* ---- Order ---- */

Test(meta_keys, numeric_order_is_key_order, .init = ns_setup)
{
	const uint64_t v[] = {1, 2, 255, 256, 257, 65535, 65536, 1ull << 32, UINT64_MAX - 1,
			      UINT64_MAX};
	const size_t n = sizeof(v) / sizeof(v[0]);
	struct efs_meta_key a, b;

	for (size_t i = 0; i + 1 < n; i++) {
		cr_assert_eq(efs_meta_key_inode(&ns, v[i], &a), 0);
		cr_assert_eq(efs_meta_key_inode(&ns, v[i + 1], &b), 0);
		cr_assert_lt(key_cmp(&a, &b), 0, "inode %llu !< %llu", (unsigned long long)v[i],
			     (unsigned long long)v[i + 1]);
		cr_assert_eq(efs_meta_key_extent(&ns, 9, v[i], &a), 0);
		cr_assert_eq(efs_meta_key_extent(&ns, 9, v[i + 1], &b), 0);
		cr_assert_lt(key_cmp(&a, &b), 0);
		cr_assert_eq(efs_meta_key_recall(&ns, 9, v[i], "zzz", &a), 0);
		cr_assert_eq(efs_meta_key_recall(&ns, 9, v[i + 1], "a", &b), 0);
		cr_assert_lt(key_cmp(&a, &b), 0, "recalls sort by sequence before node");
		cr_assert_eq(efs_meta_key_ag(&ns, (uint32_t)v[i], EFS_META_K_AG_MAP, &a), 0);
		if (v[i + 1] <= UINT32_MAX) {
			cr_assert_eq(efs_meta_key_ag(&ns, (uint32_t)v[i + 1], EFS_META_K_AG_MAP, &b),
				     0);
			cr_assert_lt(key_cmp(&a, &b), 0);
		}
	}
	/* Dirents of a lower parent sort before any name of a higher one. */
	cr_assert_eq(efs_meta_key_dirent(&ns, 255, "\xff\xff", 2, &a), 0);
	cr_assert_eq(efs_meta_key_dirent(&ns, 256, "\x01", 1, &b), 0);
	cr_assert_lt(key_cmp(&a, &b), 0);
	/* Names in byte order, shorter first. */
	cr_assert_eq(efs_meta_key_dirent(&ns, 256, "a", 1, &a), 0);
	cr_assert_eq(efs_meta_key_dirent(&ns, 256, "ab", 2, &b), 0);
	cr_assert_lt(key_cmp(&a, &b), 0);
	/* Shared holders sort before exclusive ones. */
	cr_assert_eq(efs_meta_key_holder(&ns, 256, 'S', "zz", &a), 0);
	cr_assert_eq(efs_meta_key_holder(&ns, 256, 'X', "aa", &b), 0);
	cr_assert_lt(key_cmp(&a, &b), 0);
}

/* ---- Malformed keys ---- */

Test(meta_keys, parse_refuses_other_filesystems_and_unknown_families, .init = ns_setup)
{
	struct efs_meta_ns other;
	struct efs_meta_key k;
	struct efs_meta_key_info info;

	memset(&info, 0x77, sizeof(info));
	cr_assert_eq(efs_meta_ns_init(&other, "fs10"), 0);
	cr_assert_eq(efs_meta_key_inode(&other, 5, &k), 0);
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);
	cr_assert_eq(efs_meta_key_parse(&ns, (const uint8_t *)"/etcfs/fs1/zz", 13, &info), -EINVAL);
	cr_assert_eq(efs_meta_key_parse(&ns, (const uint8_t *)"/etcfs/fs1/", 11, &info), -EINVAL);
	cr_assert_eq(efs_meta_key_parse(&ns, (const uint8_t *)"/etcfs/fs1", 10, &info), -EINVAL);
	cr_assert_eq(efs_meta_key_parse(&ns, (const uint8_t *)"", 0, &info), -EINVAL);
	cr_assert_eq(efs_meta_key_parse(&ns, NULL, 0, &info), -EINVAL);
	cr_assert_eq(info.ino, 0x7777777777777777ull, "info touched on failure");
}

/* Builds one key of every fixed-length family and checks that every
 * truncation and every extension by one byte is refused. */
Test(meta_keys, parse_refuses_truncated_and_extended_fixed_keys, .init = ns_setup)
{
	struct efs_meta_key keys[10];
	struct efs_meta_key_info info;
	size_t n = 0;

	cr_assert_eq(efs_meta_key_sb(&ns, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_ino_counter(&ns, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_renameseq(&ns, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_inode(&ns, 300, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_orphan(&ns, 300, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_reclaim(&ns, 300, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_extent(&ns, 300, 4, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_ag(&ns, 3, EFS_META_K_AG_OWNER, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_ag(&ns, 3, EFS_META_K_AG_MAP, &keys[n++]), 0);
	cr_assert_eq(efs_meta_key_ag(&ns, 3, EFS_META_K_AG_FREE, &keys[n++]), 0);
	for (size_t i = 0; i < n; i++) {
		struct efs_meta_key k = keys[i];

		for (size_t len = 0; len < k.len; len++) {
			int r = efs_meta_key_parse(&ns, k.buf, len, &info);

			/* No proper prefix of a fixed-length key is a key
			 * ("i" is neither "i/" nor "ino"). */
			cr_assert_eq(r, -EINVAL, "key %zu truncated to %zu parsed", i, len);
		}
		k.buf[k.len++] = 'x';
		cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL,
			     "key %zu with a trailing byte parsed", i);
	}
}

Test(meta_keys, parse_refuses_truncated_variable_keys, .init = ns_setup)
{
	struct efs_meta_key keys[8];
	struct efs_meta_key_info info;
	size_t fixed[8];
	size_t n = 0;
	size_t p = ns.len;

	cr_assert_eq(efs_meta_key_dirent(&ns, 2, "name", 4, &keys[n]), 0);
	fixed[n++] = p + 2 + 8 + 1;
	cr_assert_eq(efs_meta_key_xattr(&ns, 2, "user.x", 6, &keys[n]), 0);
	fixed[n++] = p + 2 + 8 + 1;
	cr_assert_eq(efs_meta_key_holder(&ns, 2, 'X', "nd", &keys[n]), 0);
	fixed[n++] = p + 2 + 8 + 1 + 1;
	cr_assert_eq(efs_meta_key_recall(&ns, 2, 9, "nd", &keys[n]), 0);
	fixed[n++] = p + 2 + 16 + 1;
	cr_assert_eq(efs_meta_key_open(&ns, 2, "nd", &keys[n]), 0);
	fixed[n++] = p + 2 + 8 + 1;
	cr_assert_eq(efs_meta_key_plock(&ns, 2, "nd", 5, &keys[n]), 0);
	fixed[n] = keys[n].len;
	n++;
	cr_assert_eq(efs_meta_key_free_intent(&ns, 2, "nd", 5, 6, &keys[n]), 0);
	fixed[n] = keys[n].len;
	n++;
	cr_assert_eq(efs_meta_key_node(&ns, "nd", &keys[n]), 0);
	fixed[n++] = p + 2 + 1;
	for (size_t i = 0; i < n; i++)
		for (size_t len = 0; len < fixed[i]; len++)
			cr_assert_eq(efs_meta_key_parse(&ns, keys[i].buf, len, &info), -EINVAL,
				     "key %zu truncated to %zu parsed", i, len);
}

Test(meta_keys, parse_refuses_inode_zero_bad_mode_and_bad_names, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_key_info info;

	cr_assert_eq(efs_meta_key_inode(&ns, 0, &k), -EINVAL);
	cr_assert_eq(efs_meta_key_inode(&ns, 1, &k), 0);
	memset(k.buf + k.len - 8, 0, 8);
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);

	cr_assert_eq(efs_meta_key_holder(&ns, 1, 'S', "nd", &k), 0);
	k.buf[k.len - 3] = 'Q';
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);

	cr_assert_eq(efs_meta_key_dirent(&ns, 1, "ab", 2, &k), 0);
	k.buf[k.len - 1] = '/';
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);
	k.buf[k.len - 1] = '\0';
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);
	k.buf[k.len - 1] = '.';
	k.buf[k.len - 2] = '.';
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);

	cr_assert_eq(efs_meta_key_node(&ns, "ab", &k), 0);
	k.buf[k.len - 1] = ' ';
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);
	k.buf[k.len - 1] = '\0';
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);

	cr_assert_eq(efs_meta_key_plock(&ns, 1, "nd", 5, &k), 0);
	k.buf[k.len - 9] = 'x'; /* the '/' before the owner */
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &info), -EINVAL);
}

Test(meta_keys, longest_key_fits, .init = ns_setup)
{
	struct efs_meta_ns big;
	struct efs_meta_key k;
	char fs[65], name[255];

	memset(fs, 'f', 64);
	fs[64] = '\0';
	memset(name, 'n', sizeof(name));
	cr_assert_eq(efs_meta_ns_init(&big, fs), 0);
	cr_assert_eq(efs_meta_key_dirent(&big, UINT64_MAX, name, 255, &k), 0);
	cr_assert_leq(k.len, EFS_META_KEY_MAX);
	cr_assert_eq(efs_meta_key_xattr(&big, UINT64_MAX, name, 255, &k), 0);
}

/* ---- Ranges ---- */

#define NKEYS 64

struct keyset {
	size_t n;
	struct efs_meta_key k[NKEYS];
};

static void add(struct keyset *s, int r)
{
	cr_assert_eq(r, 0);
	s->n++;
	cr_assert_leq(s->n, NKEYS);
}

/* A mix of every family around the inodes 255, 256, 257 and groups 1, 2,
 * plus keys of filesystems whose names share a prefix with "fs1". */
static void fill(struct keyset *s)
{
	struct efs_meta_ns other;
	const uint64_t inos[] = {255, 256, 257};

	s->n = 0;
	add(s, efs_meta_key_sb(&ns, &s->k[s->n]));
	add(s, efs_meta_key_ino_counter(&ns, &s->k[s->n]));
	add(s, efs_meta_key_renameseq(&ns, &s->k[s->n]));
	for (size_t i = 0; i < 3; i++) {
		uint64_t ino = inos[i];

		add(s, efs_meta_key_inode(&ns, ino, &s->k[s->n]));
		add(s, efs_meta_key_dirent(&ns, ino, "a", 1, &s->k[s->n]));
		add(s, efs_meta_key_dirent(&ns, ino, "b", 1, &s->k[s->n]));
		add(s, efs_meta_key_dirent(&ns, ino, "b\xff", 2, &s->k[s->n]));
		add(s, efs_meta_key_xattr(&ns, ino, "user.a", 6, &s->k[s->n]));
		add(s, efs_meta_key_extent(&ns, ino, 0, &s->k[s->n]));
		add(s, efs_meta_key_holder(&ns, ino, 'S', "n1", &s->k[s->n]));
		add(s, efs_meta_key_holder(&ns, ino, 'X', "n2", &s->k[s->n]));
		add(s, efs_meta_key_recall(&ns, ino, 1, "n1", &s->k[s->n]));
		add(s, efs_meta_key_open(&ns, ino, "n1", &s->k[s->n]));
		add(s, efs_meta_key_plock(&ns, ino, "a", 1, &s->k[s->n]));
		add(s, efs_meta_key_plock(&ns, ino, "ab", 1, &s->k[s->n]));
		add(s, efs_meta_key_orphan(&ns, ino, &s->k[s->n]));
		add(s, efs_meta_key_reclaim(&ns, ino, &s->k[s->n]));
	}
	add(s, efs_meta_key_node(&ns, "n1", &s->k[s->n]));
	add(s, efs_meta_key_gen(&ns, "n1", &s->k[s->n]));
	add(s, efs_meta_key_handover(&ns, "n1", &s->k[s->n]));
	add(s, efs_meta_key_sync(&ns, "b1", &s->k[s->n]));
	add(s, efs_meta_key_sync_ack(&ns, "b1", "n1", &s->k[s->n]));
	for (uint32_t g = 1; g <= 2; g++) {
		add(s, efs_meta_key_ag(&ns, g, EFS_META_K_AG_OWNER, &s->k[s->n]));
		add(s, efs_meta_key_ag(&ns, g, EFS_META_K_AG_MAP, &s->k[s->n]));
		add(s, efs_meta_key_ag(&ns, g, EFS_META_K_AG_FREE, &s->k[s->n]));
		add(s, efs_meta_key_free_intent(&ns, g, "n1", 1, 1, &s->k[s->n]));
	}
	cr_assert_eq(efs_meta_ns_init(&other, "fs10"), 0);
	add(s, efs_meta_key_inode(&other, 256, &s->k[s->n]));
	cr_assert_eq(efs_meta_ns_init(&other, "fs"), 0);
	add(s, efs_meta_key_sb(&other, &s->k[s->n]));
}

/* Checks that |r| selects exactly the keys of |s| for which |want| holds. */
static void check_range(const struct keyset *s, const struct efs_meta_range *r,
			bool (*want)(const struct efs_meta_key *k, const void *arg), const void *arg,
			const char *what)
{
	size_t hits = 0;

	for (size_t i = 0; i < s->n; i++) {
		bool w = want(&s->k[i], arg);

		cr_assert_eq(in_range(&s->k[i], r), w, "%s: key %zu %s", what, i,
			     w ? "missing" : "selected wrongly");
		hits += w;
	}
	cr_assert_gt(hits, 0, "%s: the case selects nothing", what);
}

struct fam_ino {
	enum efs_meta_family family;
	uint64_t ino;
};

static bool is_fam_ino(const struct efs_meta_key *k, const void *arg)
{
	const struct fam_ino *f = arg;
	struct efs_meta_key_info info;

	if (efs_meta_key_parse(&ns, k->buf, k->len, &info) < 0)
		return false;
	return info.family == f->family && (f->ino == 0 || info.ino == f->ino);
}

static bool is_ag(const struct efs_meta_key *k, const void *arg)
{
	struct efs_meta_key_info info;

	if (efs_meta_key_parse(&ns, k->buf, k->len, &info) < 0)
		return false;
	return info.family >= EFS_META_K_AG_OWNER && info.family <= EFS_META_K_FREE_INTENT;
}

static bool is_ours(const struct efs_meta_key *k, const void *arg)
{
	struct efs_meta_key_info info;

	return efs_meta_key_parse(&ns, k->buf, k->len, &info) == 0;
}

Test(meta_keys, per_inode_ranges_select_exactly_that_inode, .init = ns_setup)
{
	const enum efs_meta_family fams[] = {EFS_META_K_DIRENT, EFS_META_K_XATTR,
					     EFS_META_K_EXTENT, EFS_META_K_HOLDER,
					     EFS_META_K_RECALL, EFS_META_K_OPEN,
					     EFS_META_K_PLOCK};
	struct keyset s;
	struct efs_meta_range r;

	fill(&s);
	for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
		for (uint64_t ino = 255; ino <= 257; ino++) {
			struct fam_ino f = {fams[i], ino};

			cr_assert_eq(efs_meta_range_ino(&ns, fams[i], ino, &r), 0);
			check_range(&s, &r, is_fam_ino, &f, "per-inode");
		}
	}
	cr_assert_eq(efs_meta_range_ino(&ns, EFS_META_K_INODE, 1, &r), -EINVAL);
	cr_assert_eq(efs_meta_range_ino(&ns, EFS_META_K_DIRENT, 0, &r), -EINVAL);
}

Test(meta_keys, family_ranges_select_exactly_that_family, .init = ns_setup)
{
	struct keyset s;
	struct efs_meta_range r;

	fill(&s);
	for (int f = EFS_META_K_SB; f <= EFS_META_K_RENAMESEQ; f++) {
		struct fam_ino fi = {(enum efs_meta_family)f, 0};

		cr_assert_eq(efs_meta_range_family(&ns, (enum efs_meta_family)f, &r), 0);
		if (f >= EFS_META_K_AG_OWNER && f <= EFS_META_K_FREE_INTENT)
			check_range(&s, &r, is_ag, NULL, "ag family");
		else
			check_range(&s, &r, is_fam_ino, &fi, "family");
	}
	cr_assert_eq(efs_meta_range_family(&ns, (enum efs_meta_family)0, &r), -EINVAL);
	cr_assert_eq(efs_meta_range_fs(&ns, &r), 0);
	check_range(&s, &r, is_ours, NULL, "whole fs");
}

static bool is_x_holder_256(const struct efs_meta_key *k, const void *arg)
{
	struct efs_meta_key_info info;

	return efs_meta_key_parse(&ns, k->buf, k->len, &info) == 0 &&
	       info.family == EFS_META_K_HOLDER && info.ino == 256 && info.mode == 'X';
}

static bool is_plock_a_256(const struct efs_meta_key *k, const void *arg)
{
	struct efs_meta_key_info info;

	return efs_meta_key_parse(&ns, k->buf, k->len, &info) == 0 &&
	       info.family == EFS_META_K_PLOCK && info.ino == 256 && strcmp(info.node, "a") == 0;
}

static bool is_group_2(const struct efs_meta_key *k, const void *arg)
{
	struct efs_meta_key_info info;
	bool fi_only = arg != NULL;

	return efs_meta_key_parse(&ns, k->buf, k->len, &info) == 0 && info.group == 2 &&
	       info.family >= EFS_META_K_AG_OWNER && info.family <= EFS_META_K_FREE_INTENT &&
	       (!fi_only || info.family == EFS_META_K_FREE_INTENT);
}

static bool is_dirent_256_after_a(const struct efs_meta_key *k, const void *arg)
{
	struct efs_meta_key_info info;

	return efs_meta_key_parse(&ns, k->buf, k->len, &info) == 0 &&
	       info.family == EFS_META_K_DIRENT && info.ino == 256 &&
	       !(info.name_len == 1 && info.name[0] == 'a');
}

Test(meta_keys, narrow_ranges_select_exactly, .init = ns_setup)
{
	struct keyset s;
	struct efs_meta_range r;
	static const int one = 1;

	fill(&s);
	cr_assert_eq(efs_meta_range_holders(&ns, 256, 'X', &r), 0);
	check_range(&s, &r, is_x_holder_256, NULL, "exclusive holders");
	cr_assert_eq(efs_meta_range_holders(&ns, 256, 'Z', &r), -EINVAL);
	cr_assert_eq(efs_meta_range_plocks_of_node(&ns, 256, "a", &r), 0);
	check_range(&s, &r, is_plock_a_256, NULL, "plocks of node a (not ab)");
	cr_assert_eq(efs_meta_range_group(&ns, 2, &r), 0);
	check_range(&s, &r, is_group_2, NULL, "group 2");
	cr_assert_eq(efs_meta_range_free_intents(&ns, 2, &r), 0);
	check_range(&s, &r, is_group_2, &one, "free intents of group 2");
	cr_assert_eq(efs_meta_range_dirents_after(&ns, 256, "a", 1, &r), 0);
	check_range(&s, &r, is_dirent_256_after_a, NULL, "dirents after a");
	cr_assert_eq(efs_meta_range_dirents_after(&ns, 256, "a/", 2, &r), -EINVAL);
}

Test(meta_keys, builders_do_not_allocate, .init = ns_setup)
{
	struct efs_meta_key k;
	struct efs_meta_range r;

	efs_mem_fail_after(0);
	cr_assert_eq(efs_meta_key_dirent(&ns, 2, "x", 1, &k), 0);
	cr_assert_eq(efs_meta_range_ino(&ns, EFS_META_K_DIRENT, 2, &r), 0);
	cr_assert_eq(efs_meta_range_dirents_after(&ns, 2, "x", 1, &r), 0);
	cr_assert_eq(efs_meta_key_parse(&ns, k.buf, k.len, &(struct efs_meta_key_info){0}), 0);
	cr_assert_eq(efs_mem_count(), 0);
	efs_test_assert_no_leaks();
}

/* ---- Canonical form ---- */

/* Rebuilds the key |info| describes. */
static int rebuild(const struct efs_meta_key_info *info, struct efs_meta_key *k)
{
	switch (info->family) {
	case EFS_META_K_SB:
		return efs_meta_key_sb(&ns, k);
	case EFS_META_K_INO_COUNTER:
		return efs_meta_key_ino_counter(&ns, k);
	case EFS_META_K_RENAMESEQ:
		return efs_meta_key_renameseq(&ns, k);
	case EFS_META_K_MAINT:
		return efs_meta_key_maint(&ns, k);
	case EFS_META_K_PIN:
		return efs_meta_key_pin(&ns, info->node, k);
	case EFS_META_K_HANDOVER:
		return efs_meta_key_handover(&ns, info->node, k);
	case EFS_META_K_SYNC:
		return efs_meta_key_sync(&ns, info->node, k);
	case EFS_META_K_SYNC_ACK: {
		char id[EFS_META_NODE_MAX + 1];

		if (info->name_len > EFS_META_NODE_MAX)
			return -EINVAL;
		memcpy(id, info->name, info->name_len);
		id[info->name_len] = '\0';
		return efs_meta_key_sync_ack(&ns, id, info->node, k);
	}
	case EFS_META_K_INODE:
		return efs_meta_key_inode(&ns, info->ino, k);
	case EFS_META_K_ORPHAN:
		return efs_meta_key_orphan(&ns, info->ino, k);
	case EFS_META_K_RECLAIM:
		return efs_meta_key_reclaim(&ns, info->ino, k);
	case EFS_META_K_DIRENT:
		return efs_meta_key_dirent(&ns, info->ino, info->name, info->name_len, k);
	case EFS_META_K_XATTR:
		return efs_meta_key_xattr(&ns, info->ino, info->name, info->name_len, k);
	case EFS_META_K_EXTENT:
		return efs_meta_key_extent(&ns, info->ino, info->num, k);
	case EFS_META_K_HOLDER:
		return efs_meta_key_holder(&ns, info->ino, info->mode, info->node, k);
	case EFS_META_K_RECALL:
		return efs_meta_key_recall(&ns, info->ino, info->num, info->node, k);
	case EFS_META_K_OPEN:
		return efs_meta_key_open(&ns, info->ino, info->node, k);
	case EFS_META_K_PLOCK:
		return efs_meta_key_plock(&ns, info->ino, info->node, info->num, k);
	case EFS_META_K_NODE:
		return efs_meta_key_node(&ns, info->node, k);
	case EFS_META_K_GEN:
		return efs_meta_key_gen(&ns, info->node, k);
	case EFS_META_K_AG_OWNER:
	case EFS_META_K_AG_MAP:
	case EFS_META_K_AG_FREE:
		return efs_meta_key_ag(&ns, info->group, info->family, k);
	case EFS_META_K_FREE_INTENT:
		return efs_meta_key_free_intent(&ns, info->group, info->node, info->session,
						info->num, k);
	}
	return -EINVAL;
}

/*
 * Seeded mutations of keys of every family (changed bytes, truncations,
 * extensions): whatever parses must rebuild to exactly the same bytes, so
 * no two byte strings ever mean the same key and nothing the parser
 * accepts is outside the schema.
 */
Test(meta_keys, every_accepted_key_is_canonical, .init = ns_setup)
{
	static const uint8_t bytes[] = {0, 1, '/', '.', 'S', 'X', 'a', 'z', 0x7f, 0xff};
	struct keyset s;
	unsigned seed = 12345;
	long accepted = 0;

	fill(&s);
	for (int iter = 0; iter < 20000; iter++) {
		struct efs_meta_key k = s.k[(size_t)rand_r(&seed) % s.n], back;
		struct efs_meta_key_info info;
		int edits = 1 + rand_r(&seed) % 3;

		for (int e = 0; e < edits; e++) {
			size_t pos = (size_t)rand_r(&seed) % (k.len + 1);

			switch (rand_r(&seed) % 3) {
			case 0:
				if (pos < k.len)
					k.buf[pos] = bytes[(size_t)rand_r(&seed) % sizeof(bytes)];
				break;
			case 1:
				k.len = pos;
				break;
			default:
				if (k.len < sizeof(k.buf))
					k.buf[k.len++] = bytes[(size_t)rand_r(&seed) % sizeof(bytes)];
				break;
			}
		}
		if (efs_meta_key_parse(&ns, k.buf, k.len, &info) < 0)
			continue;
		accepted++;
		cr_assert_eq(rebuild(&info, &back), 0, "seed 12345 iter %d: accepted key rebuilds",
			     iter);
		cr_assert_eq(key_cmp(&back, &k), 0, "seed 12345 iter %d: not canonical", iter);
	}
	cr_assert_gt(accepted, 1000, "the mutations must also produce valid keys");
}
