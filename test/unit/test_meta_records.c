/* SPDX-License-Identifier: Apache-2.0 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "util/mem.h"

TestSuite(meta_records, .fini = efs_mem_fail_reset, .timeout = 30);

static const uint8_t UUID[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static Etcfs__Inode good_file(void)
{
	Etcfs__Inode in = ETCFS__INODE__INIT;

	in.mode = S_IFREG | 0644;
	in.uid = 1000;
	in.gid = 100;
	in.nlink = 1;
	in.size = 12345;
	in.blocks = 32;
	in.atime_ns = 1700000000123456789;
	in.mtime_ns = 1700000001000000001;
	in.ctime_ns = 1700000002999999999;
	in.btime_ns = 1600000000000000000;
	in.generation = 7;
	return in;
}

static Etcfs__FsInfo good_fsinfo(void)
{
	Etcfs__FsInfo fi = ETCFS__FS_INFO__INIT;

	fi.uuid.data = (uint8_t *)UUID;
	fi.uuid.len = 16;
	fi.name = (char *)"fs1";
	fi.block_size = 4096;
	fi.device_size = 1ull << 30; /* 262144 blocks */
	fi.data_start = 16;
	fi.format_version = 1;
	fi.inode_limit = 1000;
	fi.created_ns = 5;
	fi.ag_blocks = 8192; /* 262128 data blocks: 31 full groups + 1 partial */
	fi.ag_count = 32;
	return fi;
}

/* Packs |msg| into a heap buffer the caller frees with efs_mem_free. */
static ProtobufCBinaryData pack(const void *msg)
{
	ProtobufCBinaryData b;

	cr_assert_eq(efs_meta_pack(msg, &b), 0);
	return b;
}

/* ---- Round trips ---- */

Test(meta_records, inode_round_trips_every_field)
{
	Etcfs__Inode in = good_file(), *out = NULL;
	ProtobufCBinaryData b;
	const char *why = "unset";

	in.mode = S_IFLNK | 0777;
	in.symlink.data = (uint8_t *)"../target";
	in.symlink.len = 9;
	in.size = 9;
	in.xattr_count = 2;
	in.xattr_bytes = 40;
	in.op_id.data = (uint8_t *)"op";
	in.op_id.len = 2;
	b = pack(&in);
	cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, &why), 0, "%s", why);
	cr_assert_null(why);
	cr_assert_eq(out->mode, in.mode);
	cr_assert_eq(out->uid, 1000);
	cr_assert_eq(out->gid, 100);
	cr_assert_eq(out->nlink, 1);
	cr_assert_eq(out->size, 9);
	cr_assert_eq(out->blocks, 32);
	cr_assert_eq(out->atime_ns, in.atime_ns);
	cr_assert_eq(out->mtime_ns, in.mtime_ns);
	cr_assert_eq(out->ctime_ns, in.ctime_ns);
	cr_assert_eq(out->btime_ns, in.btime_ns);
	cr_assert_eq(out->generation, 7);
	cr_assert_eq(out->symlink.len, 9);
	cr_assert_eq(memcmp(out->symlink.data, "../target", 9), 0);
	cr_assert_eq(out->xattr_count, 2);
	cr_assert_eq(out->xattr_bytes, 40);
	cr_assert_eq(out->op_id.len, 2);
	efs_meta_record_free(out);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

Test(meta_records, directory_and_device_inodes_round_trip)
{
	Etcfs__Inode in = good_file(), *out;
	ProtobufCBinaryData b;

	in.mode = S_IFDIR | 0755;
	in.nlink = 2;
	in.parent = 1;
	b = pack(&in);
	cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, NULL), 0);
	cr_assert_eq(out->parent, 1);
	efs_meta_record_free(out);
	efs_mem_free(b.data);

	in = good_file();
	in.mode = S_IFCHR | 0600;
	in.rdev = makedev(1, 3);
	b = pack(&in);
	cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, NULL), 0);
	cr_assert_eq(out->rdev, makedev(1, 3));
	efs_meta_record_free(out);
	efs_mem_free(b.data);

	/* An orphaned directory (rmdir'd while open) has no links. */
	in = good_file();
	in.mode = S_IFDIR | 0755;
	in.nlink = 0;
	in.parent = 5;
	b = pack(&in);
	cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, NULL), 0);
	efs_meta_record_free(out);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

Test(meta_records, empty_message_packs_to_zero_bytes_and_decodes_as_defaults)
{
	Etcfs__Generation g = ETCFS__GENERATION__INIT, *out;
	ProtobufCBinaryData b = pack(&g);

	cr_assert_eq(b.len, 0);
	cr_assert_not_null(b.data);
	cr_assert_eq(efs_meta_generation_decode(b.data, b.len, &out, NULL), 0);
	cr_assert_eq(out->generation, 0);
	efs_meta_record_free(out);
	efs_mem_free(b.data);
}

Test(meta_records, unknown_fields_from_a_newer_version_are_ignored)
{
	Etcfs__Dirent de = ETCFS__DIRENT__INIT, *out;
	ProtobufCBinaryData b;
	uint8_t buf[64];

	de.ino = 300;
	de.type = DT_REG;
	b = pack(&de);
	memcpy(buf, b.data, b.len);
	/* Field 100 (varint 5) and field 101 (bytes "hi"). */
	buf[b.len] = 0xa0;
	buf[b.len + 1] = 0x06;
	buf[b.len + 2] = 5;
	buf[b.len + 3] = 0xaa;
	buf[b.len + 4] = 0x06;
	buf[b.len + 5] = 2;
	buf[b.len + 6] = 'h';
	buf[b.len + 7] = 'i';
	cr_assert_eq(efs_meta_dirent_decode(buf, b.len + 8, &out, NULL), 0);
	cr_assert_eq(out->ino, 300);
	cr_assert_eq(out->type, DT_REG);
	efs_meta_record_free(out);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

Test(meta_records, garbage_is_ebadmsg_with_reason)
{
	static const uint8_t junk[] = {0x0a, 0x20, 'a'}; /* field 1 bytes, length past the end */
	static const uint8_t badtag[] = {0x00, 0x01};	 /* field number 0 */
	Etcfs__Inode *out = (Etcfs__Inode *)0x1;
	const char *why = NULL;

	cr_assert_eq(efs_meta_inode_decode(junk, sizeof(junk), &out, &why), -EBADMSG);
	cr_assert_str_eq(why, "not a valid protobuf message");
	cr_assert_eq(out, (Etcfs__Inode *)0x1, "output touched on failure");
	cr_assert_eq(efs_meta_inode_decode(badtag, sizeof(badtag), &out, &why), -EBADMSG);
	cr_assert_eq(efs_meta_fsinfo_decode(junk, sizeof(junk), (Etcfs__FsInfo **)&out, &why),
		     -EBADMSG);
	efs_test_assert_no_leaks();
}

/* ---- Inode validation ---- */

struct inode_case {
	const char *what;
	void (*mutate)(Etcfs__Inode *in);
	const char *word;
};

static void no_type(Etcfs__Inode *in)
{
	in->mode = 0644;
}
static void bad_type(Etcfs__Inode *in)
{
	in->mode = 0170000 | 0644;
}
static void extra_bits(Etcfs__Inode *in)
{
	in->mode |= 1u << 20;
}
static void too_many_links(Etcfs__Inode *in)
{
	in->nlink = EFS_META_LINK_MAX + 1;
}
static void dir_one_link(Etcfs__Inode *in)
{
	in->mode = S_IFDIR | 0755;
	in->nlink = 1;
	in->parent = 1;
}
static void dir_no_parent(Etcfs__Inode *in)
{
	in->mode = S_IFDIR | 0755;
	in->nlink = 2;
}
static void file_with_parent(Etcfs__Inode *in)
{
	in->parent = 3;
}
static void symlink_empty(Etcfs__Inode *in)
{
	in->mode = S_IFLNK | 0777;
	in->size = 0;
}
static void symlink_nul(Etcfs__Inode *in)
{
	in->mode = S_IFLNK | 0777;
	in->symlink.data = (uint8_t *)"a\0b";
	in->symlink.len = 3;
	in->size = 3;
}
static void symlink_size(Etcfs__Inode *in)
{
	in->mode = S_IFLNK | 0777;
	in->symlink.data = (uint8_t *)"abc";
	in->symlink.len = 3;
	in->size = 4;
}
static void symlink_long(Etcfs__Inode *in)
{
	static uint8_t big[EFS_META_SYMLINK_MAX + 1];

	memset(big, 'a', sizeof(big));
	in->mode = S_IFLNK | 0777;
	in->symlink.data = big;
	in->symlink.len = sizeof(big);
	in->size = sizeof(big);
}
static void target_on_file(Etcfs__Inode *in)
{
	in->symlink.data = (uint8_t *)"abc";
	in->symlink.len = 3;
}
static void rdev_on_file(Etcfs__Inode *in)
{
	in->rdev = 5;
}
static void huge_size(Etcfs__Inode *in)
{
	in->size = (uint64_t)INT64_MAX + 1;
}
static void unknown_flags(Etcfs__Inode *in)
{
	in->flags = 0x80;
}
static void xattr_bytes_alone(Etcfs__Inode *in)
{
	in->xattr_bytes = 10;
}

Test(meta_records, impossible_inodes_are_euclean_with_reason)
{
	static const struct inode_case cases[] = {
		{"no type", no_type, "type"},
		{"bad type", bad_type, "type"},
		{"extra mode bits", extra_bits, "mode bits"},
		{"too many links", too_many_links, "link count"},
		{"directory with one link", dir_one_link, "one link"},
		{"directory without parent", dir_no_parent, "parent"},
		{"file with parent", file_with_parent, "parent"},
		{"empty symlink", symlink_empty, "symlink"},
		{"symlink with NUL", symlink_nul, "NUL"},
		{"symlink size", symlink_size, "size"},
		{"symlink too long", symlink_long, "too long"},
		{"target on a file", target_on_file, "non-symlink"},
		{"rdev on a file", rdev_on_file, "device"},
		{"size beyond off_t", huge_size, "size"},
		{"unknown flags", unknown_flags, "flags"},
		{"xattr bytes without xattrs", xattr_bytes_alone, "xattr"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Etcfs__Inode in = good_file(), *out = NULL;
		ProtobufCBinaryData b;
		const char *why = NULL;

		cases[i].mutate(&in);
		cr_assert_eq(efs_meta_inode_check(&in, &why), -EUCLEAN, "%s", cases[i].what);
		b = pack(&in);
		cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, &why), -EUCLEAN, "%s",
			     cases[i].what);
		cr_assert_null(out);
		cr_assert(strstr(why, cases[i].word), "%s: \"%s\"", cases[i].what, why);
		efs_mem_free(b.data);
	}
	efs_test_assert_no_leaks();
}

/* ---- Other records ---- */

Test(meta_records, dirent_naming_inode_zero_or_bad_type_is_euclean)
{
	Etcfs__Dirent de = ETCFS__DIRENT__INIT, *out;
	ProtobufCBinaryData b;
	const char *why;
	const uint32_t bad_types[] = {DT_UNKNOWN, DT_WHT, 99};

	de.type = DT_DIR;
	b = pack(&de);
	cr_assert_eq(efs_meta_dirent_decode(b.data, b.len, &out, &why), -EUCLEAN);
	cr_assert(strstr(why, "inode 0"), "%s", why);
	efs_mem_free(b.data);
	de.ino = 2;
	for (size_t i = 0; i < 3; i++) {
		de.type = bad_types[i];
		b = pack(&de);
		cr_assert_eq(efs_meta_dirent_decode(b.data, b.len, &out, &why), -EUCLEAN);
		cr_assert(strstr(why, "type"), "%s", why);
		efs_mem_free(b.data);
	}
	efs_test_assert_no_leaks();
}

Test(meta_records, fsinfo_round_trip_and_each_bad_field)
{
	Etcfs__FsInfo fi = good_fsinfo(), *out;
	ProtobufCBinaryData b = pack(&fi);
	const char *why = NULL;
	static const uint8_t zero[16];

	cr_assert_eq(efs_meta_fsinfo_decode(b.data, b.len, &out, &why), 0, "%s", why);
	cr_assert_eq(memcmp(out->uuid.data, UUID, 16), 0);
	cr_assert_str_eq(out->name, "fs1");
	cr_assert_eq(out->ag_count, 32);
	efs_meta_record_free(out);
	efs_mem_free(b.data);

	for (int i = 0; i < 12; i++) {
		fi = good_fsinfo();
		switch (i) {
		case 0:
			fi.uuid.len = 15;
			break;
		case 1:
			fi.uuid.data = (uint8_t *)zero;
			break;
		case 2:
			fi.name = (char *)"a/b";
			break;
		case 3:
			fi.block_size = 4095;
			break;
		case 4:
			fi.block_size = 512;
			break;
		case 5:
			fi.format_version = 0;
			break;
		case 6:
			fi.data_start = 0;
			break;
		case 7:
			fi.device_size = 16 * 4096;
			break;
		case 8:
			fi.inode_limit = 0;
			break;
		case 9:
			fi.ag_count = 0;
			break;
		case 10:
			fi.ag_count = 33; /* one group too many */
			break;
		case 11:
			fi.ag_count = 31; /* the data area's tail in no group */
			break;
		}
		b = pack(&fi);
		out = NULL;
		cr_assert_eq(efs_meta_fsinfo_decode(b.data, b.len, &out, &why), -EUCLEAN,
			     "case %d", i);
		cr_assert_null(out);
		cr_assert(strncmp(why, "fs info:", 8) == 0, "case %d: %s", i, why);
		efs_mem_free(b.data);
	}
	efs_test_assert_no_leaks();
}

Test(meta_records, session_records_check_node_ids_modes_and_leases)
{
	Etcfs__LockHolder h = ETCFS__LOCK_HOLDER__INIT, *ho;
	Etcfs__LockWaiter w = ETCFS__LOCK_WAITER__INIT, *wo;
	Etcfs__NodeInfo n = ETCFS__NODE_INFO__INIT, *no;
	Etcfs__OpenRef o = ETCFS__OPEN_REF__INIT, *oo;
	Etcfs__AgOwner a = ETCFS__AG_OWNER__INIT, *ao;
	ProtobufCBinaryData b;
	const char *why;

	h.node = (char *)"n1";
	h.mode = EFS_META_LOCK_EXCLUSIVE;
	h.lease_id = 42;
	h.token = 9;
	b = pack(&h);
	cr_assert_eq(efs_meta_holder_decode(b.data, b.len, &ho, &why), 0);
	cr_assert_str_eq(ho->node, "n1");
	cr_assert_eq(ho->token, 9);
	efs_meta_record_free(ho);
	efs_mem_free(b.data);
	h.mode = 'Q';
	b = pack(&h);
	cr_assert_eq(efs_meta_holder_decode(b.data, b.len, &ho, &why), -EUCLEAN);
	efs_mem_free(b.data);
	h.mode = 'S';
	h.lease_id = 0;
	b = pack(&h);
	cr_assert_eq(efs_meta_holder_decode(b.data, b.len, &ho, &why), -EUCLEAN);
	cr_assert(strstr(why, "lease"), "%s", why);
	efs_mem_free(b.data);

	w.node = (char *)"bad node";
	w.mode = 'S';
	b = pack(&w);
	cr_assert_eq(efs_meta_waiter_decode(b.data, b.len, &wo, &why), -EUCLEAN);
	efs_mem_free(b.data);

	n.machine_id = (char *)"abcdef";
	n.hostname = (char *)"h";
	n.pid = 123;
	n.lease_id = 5;
	b = pack(&n);
	cr_assert_eq(efs_meta_nodeinfo_decode(b.data, b.len, &no, &why), 0);
	cr_assert_eq(no->pid, 123);
	efs_meta_record_free(no);
	efs_mem_free(b.data);
	n.pid = 0;
	b = pack(&n);
	cr_assert_eq(efs_meta_nodeinfo_decode(b.data, b.len, &no, &why), -EUCLEAN);
	efs_mem_free(b.data);

	b = pack(&o); /* empty node id */
	cr_assert_eq(efs_meta_openref_decode(b.data, b.len, &oo, &why), -EUCLEAN);
	efs_mem_free(b.data);

	a.node = (char *)"n1";
	b = pack(&a); /* no lease */
	cr_assert_eq(efs_meta_ag_owner_decode(b.data, b.len, &ao, &why), -EUCLEAN);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

Test(meta_records, counters_and_markers)
{
	Etcfs__InoCounter c = ETCFS__INO_COUNTER__INIT, *co;
	Etcfs__Reclaim rc = ETCFS__RECLAIM__INIT, *rco;
	Etcfs__Orphan orph = ETCFS__ORPHAN__INIT, *oo;
	Etcfs__RenameSeq rs = ETCFS__RENAME_SEQ__INIT, *rso;
	Etcfs__AgFree af = ETCFS__AG_FREE__INIT, *afo;
	ProtobufCBinaryData b;

	c.next = 1;
	b = pack(&c);
	cr_assert_eq(efs_meta_ino_counter_decode(b.data, b.len, &co, NULL), -EUCLEAN);
	efs_mem_free(b.data);
	c.next = 2;
	b = pack(&c);
	cr_assert_eq(efs_meta_ino_counter_decode(b.data, b.len, &co, NULL), 0);
	cr_assert_eq(co->next, 2);
	efs_meta_record_free(co);
	efs_mem_free(b.data);

	b = pack(&rc); /* no node: adoptable */
	cr_assert_eq(efs_meta_reclaim_decode(b.data, b.len, &rco, NULL), 0);
	efs_meta_record_free(rco);
	efs_mem_free(b.data);
	rc.node = (char *)"a b";
	b = pack(&rc);
	cr_assert_eq(efs_meta_reclaim_decode(b.data, b.len, &rco, NULL), -EUCLEAN);
	efs_mem_free(b.data);

	orph.since_ns = 3;
	b = pack(&orph);
	cr_assert_eq(efs_meta_orphan_decode(b.data, b.len, &oo, NULL), 0);
	cr_assert_eq(oo->since_ns, 3);
	efs_meta_record_free(oo);
	efs_mem_free(b.data);

	rs.seq = 77;
	b = pack(&rs);
	cr_assert_eq(efs_meta_renameseq_decode(b.data, b.len, &rso, NULL), 0);
	cr_assert_eq(rso->seq, 77);
	efs_meta_record_free(rso);
	efs_mem_free(b.data);

	af.free_blocks = 1000;
	b = pack(&af);
	cr_assert_eq(efs_meta_ag_free_decode(b.data, b.len, &afo, NULL), 0);
	cr_assert_eq(afo->free_blocks, 1000);
	efs_meta_record_free(afo);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

/* Decodes an AgMap of |n| runs (start, len pairs) in a group of |blocks|. */
static int map_decode(const uint64_t *pairs, size_t n, uint64_t blocks)
{
	Etcfs__AgMap map = ETCFS__AG_MAP__INIT, *out = NULL;
	Etcfs__Run runs[8], *ptrs[8];
	ProtobufCBinaryData b;
	int r;

	for (size_t i = 0; i < n; i++) {
		etcfs__run__init(&runs[i]);
		runs[i].start = pairs[2 * i];
		runs[i].len = pairs[2 * i + 1];
		ptrs[i] = &runs[i];
	}
	map.free = ptrs;
	map.n_free = n;
	map.group_blocks = blocks;
	b = pack(&map);
	r = efs_meta_ag_map_decode(b.data, b.len, &out, NULL);
	if (r == 0) {
		cr_assert_eq(out->n_free, n);
		for (size_t i = 0; i < n; i++)
			cr_assert_eq(out->free[i]->start, pairs[2 * i]);
	}
	efs_meta_record_free(out);
	efs_mem_free(b.data);
	return r;
}

Test(meta_records, free_map_runs_must_be_sorted_disjoint_and_inside)
{
	const uint64_t ok[] = {0, 10, 20, 5, 100, 924};
	const uint64_t unsorted[] = {20, 5, 0, 10};
	const uint64_t overlap[] = {0, 10, 5, 10};
	const uint64_t adjacent[] = {0, 10, 10, 10};
	const uint64_t outside[] = {1000, 25};
	const uint64_t empty[] = {5, 0};
	const uint64_t wrap[] = {UINT64_MAX - 1, 4};

	cr_assert_eq(map_decode(ok, 3, 1024), 0);
	cr_assert_eq(map_decode(ok, 0, 1024), 0, "a full group has no free runs");
	cr_assert_eq(map_decode(ok, 3, 0), -EUCLEAN);
	cr_assert_eq(map_decode(unsorted, 2, 1024), -EUCLEAN);
	cr_assert_eq(map_decode(overlap, 2, 1024), -EUCLEAN);
	cr_assert_eq(map_decode(adjacent, 2, 1024), -EUCLEAN);
	cr_assert_eq(map_decode(outside, 1, 1024), -EUCLEAN);
	cr_assert_eq(map_decode(empty, 1, 1024), -EUCLEAN);
	cr_assert_eq(map_decode(wrap, 1, UINT64_MAX), -EUCLEAN);
	efs_test_assert_no_leaks();
}

Test(meta_records, free_intent_needs_disjoint_runs)
{
	Etcfs__FreeIntent fi = ETCFS__FREE_INTENT__INIT, *out;
	Etcfs__Run r1 = ETCFS__RUN__INIT, r2 = ETCFS__RUN__INIT, *ptrs[2] = {&r1, &r2};
	ProtobufCBinaryData b;

	b = pack(&fi);
	cr_assert_eq(efs_meta_free_intent_decode(b.data, b.len, &out, NULL), -EUCLEAN);
	efs_mem_free(b.data);
	r1.start = 0;
	r1.len = 4;
	r2.start = 4; /* adjacent is fine in an intent */
	r2.len = 4;
	fi.runs = ptrs;
	fi.n_runs = 2;
	b = pack(&fi);
	cr_assert_eq(efs_meta_free_intent_decode(b.data, b.len, &out, NULL), 0);
	efs_meta_record_free(out);
	efs_mem_free(b.data);
	r2.start = 3;
	b = pack(&fi);
	cr_assert_eq(efs_meta_free_intent_decode(b.data, b.len, &out, NULL), -EUCLEAN);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

Test(meta_records, extent_chunk_must_be_sorted_and_disjoint)
{
	Etcfs__ExtentChunk c = ETCFS__EXTENT_CHUNK__INIT, *out;
	Etcfs__Extent e1 = ETCFS__EXTENT__INIT, e2 = ETCFS__EXTENT__INIT, *ptrs[2] = {&e1, &e2};
	ProtobufCBinaryData b;
	const char *why;

	e1.file_block = 0;
	e1.dev_block = 100;
	e1.count = 8;
	e2.file_block = 8;
	e2.dev_block = 500;
	e2.count = 1;
	e2.flags = EFS_META_EXTENT_F_PREALLOC;
	c.extents = ptrs;
	c.n_extents = 2;
	b = pack(&c);
	cr_assert_eq(efs_meta_extent_chunk_decode(b.data, b.len, &out, NULL), 0);
	cr_assert_eq(out->extents[1]->flags, EFS_META_EXTENT_F_PREALLOC);
	efs_meta_record_free(out);
	efs_mem_free(b.data);
	e2.file_block = 7;
	b = pack(&c);
	cr_assert_eq(efs_meta_extent_chunk_decode(b.data, b.len, &out, &why), -EUCLEAN);
	cr_assert(strstr(why, "overlapping"), "%s", why);
	efs_mem_free(b.data);
	e2.file_block = 8;
	e2.count = 0;
	b = pack(&c);
	cr_assert_eq(efs_meta_extent_chunk_decode(b.data, b.len, &out, &why), -EUCLEAN);
	efs_mem_free(b.data);
	e2.count = 2;
	e2.dev_block = UINT64_MAX;
	b = pack(&c);
	cr_assert_eq(efs_meta_extent_chunk_decode(b.data, b.len, &out, &why), -EUCLEAN);
	cr_assert(strstr(why, "wraps"), "%s", why);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

Test(meta_records, byte_range_locks_are_checked)
{
	Etcfs__ByteRangeLocks l = ETCFS__BYTE_RANGE_LOCKS__INIT, *out;
	Etcfs__ByteRangeLock one = ETCFS__BYTE_RANGE_LOCK__INIT, *ptrs[1] = {&one};
	ProtobufCBinaryData b;

	one.start = 0;
	one.end = UINT64_MAX;
	one.type = F_WRLCK;
	one.kind = EFS_META_PLOCK_OFD;
	l.locks = ptrs;
	l.n_locks = 1;
	b = pack(&l);
	cr_assert_eq(efs_meta_plocks_decode(b.data, b.len, &out, NULL), 0);
	efs_meta_record_free(out);
	efs_mem_free(b.data);
	one.start = 10;
	one.end = 9;
	b = pack(&l);
	cr_assert_eq(efs_meta_plocks_decode(b.data, b.len, &out, NULL), -EUCLEAN);
	efs_mem_free(b.data);
	one.end = 10;
	one.type = F_UNLCK;
	b = pack(&l);
	cr_assert_eq(efs_meta_plocks_decode(b.data, b.len, &out, NULL), -EUCLEAN);
	efs_mem_free(b.data);
	one.type = F_RDLCK;
	one.kind = 0;
	b = pack(&l);
	cr_assert_eq(efs_meta_plocks_decode(b.data, b.len, &out, NULL), -EUCLEAN);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

/* ---- struct stat ---- */

Test(meta_records, inode_to_stat_and_back)
{
	Etcfs__Inode in = good_file(), back = ETCFS__INODE__INIT;
	struct stat st;

	in.atime_ns = -1; /* one ns before the epoch */
	efs_meta_inode_to_stat(&in, 4242, 4096, &st);
	cr_assert_eq(st.st_ino, 4242);
	cr_assert_eq(st.st_mode, S_IFREG | 0644);
	cr_assert_eq(st.st_nlink, 1);
	cr_assert_eq(st.st_uid, 1000);
	cr_assert_eq(st.st_gid, 100);
	cr_assert_eq(st.st_size, 12345);
	cr_assert_eq(st.st_blocks, 32);
	cr_assert_eq(st.st_blksize, 4096);
	cr_assert_eq(st.st_atim.tv_sec, -1);
	cr_assert_eq(st.st_atim.tv_nsec, 999999999);
	cr_assert_eq(st.st_mtim.tv_sec, 1700000001);
	cr_assert_eq(st.st_mtim.tv_nsec, 1);
	cr_assert_eq(st.st_ctim.tv_nsec, 999999999);
	back.parent = 99;
	back.btime_ns = 5;
	efs_meta_inode_from_stat(&back, &st);
	cr_assert_eq(back.mode, in.mode);
	cr_assert_eq(back.uid, in.uid);
	cr_assert_eq(back.gid, in.gid);
	cr_assert_eq(back.nlink, in.nlink);
	cr_assert_eq(back.size, in.size);
	cr_assert_eq(back.blocks, in.blocks);
	cr_assert_eq(back.atime_ns, -1);
	cr_assert_eq(back.mtime_ns, in.mtime_ns);
	cr_assert_eq(back.ctime_ns, in.ctime_ns);
	cr_assert_eq(back.parent, 99, "fields stat lacks stay");
	cr_assert_eq(back.btime_ns, 5);
}

Test(meta_records, device_numbers_survive_stat_conversion)
{
	Etcfs__Inode in = good_file(), back = ETCFS__INODE__INIT;
	struct stat st;

	in.mode = S_IFBLK | 0660;
	in.rdev = makedev(259, 65536);
	efs_meta_inode_to_stat(&in, 2, 4096, &st);
	cr_assert_eq(major(st.st_rdev), 259);
	cr_assert_eq(minor(st.st_rdev), 65536);
	efs_meta_inode_from_stat(&back, &st);
	cr_assert_eq(back.rdev, in.rdev);
}

Test(meta_records, timespec_conversion_saturates_and_floors)
{
	struct timespec ts = {.tv_sec = -3, .tv_nsec = 500};
	struct timespec back;

	cr_assert_eq(efs_meta_ns_from_timespec(&ts), -2999999500);
	back = efs_meta_timespec_from_ns(-2999999500);
	cr_assert_eq(back.tv_sec, -3);
	cr_assert_eq(back.tv_nsec, 500);
	back = efs_meta_timespec_from_ns(INT64_MIN);
	cr_assert_geq(back.tv_nsec, 0);
	ts.tv_sec = (time_t)INT64_MAX / 2;
	cr_assert_eq(efs_meta_ns_from_timespec(&ts), INT64_MAX);
	ts.tv_sec = -(time_t)(INT64_MAX / 2);
	cr_assert_eq(efs_meta_ns_from_timespec(&ts), INT64_MIN);
}

Test(meta_records, dt_from_mode_covers_every_type)
{
	cr_assert_eq(efs_meta_dt_from_mode(S_IFREG | 0644), DT_REG);
	cr_assert_eq(efs_meta_dt_from_mode(S_IFDIR), DT_DIR);
	cr_assert_eq(efs_meta_dt_from_mode(S_IFLNK), DT_LNK);
	cr_assert_eq(efs_meta_dt_from_mode(S_IFCHR), DT_CHR);
	cr_assert_eq(efs_meta_dt_from_mode(S_IFBLK), DT_BLK);
	cr_assert_eq(efs_meta_dt_from_mode(S_IFIFO), DT_FIFO);
	cr_assert_eq(efs_meta_dt_from_mode(S_IFSOCK), DT_SOCK);
	cr_assert_eq(efs_meta_dt_from_mode(0), DT_UNKNOWN);
}

/* ---- Allocation failures ---- */

Test(meta_records, pack_reports_enomem_and_leaves_output)
{
	Etcfs__Inode in = good_file();
	ProtobufCBinaryData b = {77, (uint8_t *)0x1};

	efs_mem_fail_after(0);
	cr_assert_eq(efs_meta_pack(&in.base, &b), -ENOMEM);
	cr_assert_eq(b.len, 77);
	cr_assert_eq(b.data, (uint8_t *)0x1);
}

Test(meta_records, decode_sweeps_every_allocation_failure)
{
	Etcfs__Inode in = good_file(), *out;
	Etcfs__FsInfo fi = good_fsinfo(), *fo;
	ProtobufCBinaryData b, bf;
	const char *why;
	long count, fcount;

	in.mode = S_IFLNK | 0777;
	in.symlink.data = (uint8_t *)"target";
	in.symlink.len = 6;
	in.size = 6;
	in.op_id.data = (uint8_t *)"op-1";
	in.op_id.len = 4;
	b = pack(&in);
	bf = pack(&fi);

	efs_mem_fail_reset();
	cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, NULL), 0);
	count = efs_mem_count();
	efs_meta_record_free(out);
	efs_mem_fail_reset();
	cr_assert_eq(efs_meta_fsinfo_decode(bf.data, bf.len, &fo, NULL), 0);
	fcount = efs_mem_count();
	efs_meta_record_free(fo);
	cr_assert_geq(count, 3, "the sweep covers the message and its two byte fields");

	for (long i = 0; i < count; i++) {
		out = NULL;
		efs_mem_fail_after(i);
		cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, &why), -ENOMEM,
			     "failing allocation %ld", i);
		cr_assert_str_eq(why, "out of memory");
		cr_assert_null(out);
		efs_mem_fail_reset();
	}
	for (long i = 0; i < fcount; i++) {
		fo = NULL;
		efs_mem_fail_after(i);
		cr_assert_eq(efs_meta_fsinfo_decode(bf.data, bf.len, &fo, &why), -ENOMEM,
			     "failing allocation %ld", i);
		cr_assert_null(fo);
		efs_mem_fail_reset();
	}
	efs_mem_free(b.data);
	efs_mem_free(bf.data);
	efs_test_assert_no_leaks();
}

Test(meta_records, invalid_record_frees_everything)
{
	Etcfs__Inode in = good_file();
	Etcfs__Inode *out = NULL;
	ProtobufCBinaryData b;

	in.symlink.data = (uint8_t *)"x";
	in.symlink.len = 1; /* target on a regular file */
	in.op_id.data = (uint8_t *)"op";
	in.op_id.len = 2;
	b = pack(&in);
	cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, NULL), -EUCLEAN);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}

/*
 * Seeded byte mutations of a valid inode record: decode never crashes or
 * leaks, answers only 0, -EBADMSG or -EUCLEAN, and whatever it accepts
 * re-encodes to a record that decodes to the same fields.
 */
Test(meta_records, mutated_inode_bytes_decode_cleanly)
{
	Etcfs__Inode in = good_file();
	ProtobufCBinaryData b;
	unsigned seed = 4242;
	int seen_ok = 0, seen_bad = 0, seen_unclean = 0;

	in.mode = S_IFLNK | 0777;
	in.symlink.data = (uint8_t *)"some/target";
	in.symlink.len = 11;
	in.size = 11;
	b = pack(&in);
	for (int iter = 0; iter < 5000; iter++) {
		uint8_t buf[256];
		size_t len = b.len;
		Etcfs__Inode *out = NULL, *again = NULL;
		ProtobufCBinaryData re;
		int r;

		int edits = 1 + rand_r(&seed) % 3;

		memcpy(buf, b.data, b.len);
		for (int e = 0; e < edits; e++) {
			if (rand_r(&seed) % 4 == 0)
				len = (size_t)rand_r(&seed) % (b.len + 1);
			else if (len > 0)
				buf[(size_t)rand_r(&seed) % len] ^= (uint8_t)(1 + rand_r(&seed) % 255);
		}
		r = efs_meta_inode_decode(buf, len, &out, NULL);
		cr_assert(r == 0 || r == -EBADMSG || r == -EUCLEAN, "seed 4242 iter %d: %d", iter,
			  r);
		if (r == -EBADMSG)
			seen_bad++;
		if (r == -EUCLEAN)
			seen_unclean++;
		if (r < 0)
			continue;
		seen_ok++;
		re = pack(out);
		cr_assert_eq(efs_meta_inode_decode(re.data, re.len, &again, NULL), 0);
		cr_assert_eq(again->mode, out->mode);
		cr_assert_eq(again->size, out->size);
		cr_assert_eq(again->nlink, out->nlink);
		efs_meta_record_free(again);
		efs_meta_record_free(out);
		efs_mem_free(re.data);
	}
	cr_assert_gt(seen_ok, 0);
	cr_assert_gt(seen_bad, 0);
	cr_assert_gt(seen_unclean, 0);
	efs_mem_free(b.data);
	efs_test_assert_no_leaks();
}
