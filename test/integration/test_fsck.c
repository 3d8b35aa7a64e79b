/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fsck.etcfs against a real etcd: a filesystem made by the build's
 * mkfs.etcfs on a sparse image, a small tree written directly in etcd
 * following docs/FORMAT.md section 4, then one corruption per check. Each
 * must be found (exit 4, nothing changed), repaired by --repair (exit 1)
 * and clean afterwards (exit 0); the checks without a safe repair stay at
 * exit 4; --repair is refused while a node is mounted (exit 8).
 *
 * "Nothing changed" is etcd's store revision: this test's etcd has no
 * other writer, and every write moves it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "etcd/sync.h"
#include "fsck/check.h"
#include "harness.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "space/runs.h"
#include "util/mem.h"
#include "etcfs.pb-c.h"
#include "rpc.pb-c.h"

#include "../support/leak.h"

#define FSNAME "fscktest"
/* Inodes of the populated tree (the counter is moved past them). */
#define INO_A	   10 /* /a */
#define INO_F	   11 /* /f */
#define INO_G	   12 /* /a/g, also /h */
#define INO_B	   13 /* /a/b */
#define INO_S	   14 /* /a/s, a symlink */

static struct efs_harness *h;
static struct efs_etcd_sync *s;
static struct efs_meta_ns ns;
static char img[128];

/* ---- Commands ---- */

/* Runs |argv| with stdout and stderr captured in *|out| (efs_mem);
 * returns its exit status (-1 when it did not exit normally). */
static int run(char *const argv[], char **out)
{
	char path[] = "/tmp/fscktest-out-XXXXXX";
	int fd = mkstemp(path), status;
	pid_t pid;
	off_t len;

	cr_assert_geq(fd, 0);
	unlink(path);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(fd, 1);
		dup2(fd, 2);
		execv(argv[0], argv);
		_exit(127);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	len = lseek(fd, 0, SEEK_END);
	*out = efs_mem_calloc(1, (size_t)len + 1);
	cr_assert_not_null(*out);
	cr_assert_eq(pread(fd, *out, (size_t)len, 0), len);
	close(fd);
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void tool(const char *name, char *buf, size_t size)
{
	const char *root = getenv("ETCFS_BUILD_ROOT");

	cr_assert_not_null(root, "ETCFS_BUILD_ROOT is not set (run through meson test)");
	snprintf(buf, size, "%s/etcfsd/%s", root, name);
}

/* fsck.etcfs [|opt|] [|opt2|] on the image; the output goes to *|out|
 * unless NULL. */
static int fsck2(const char *opt, const char *opt2, char **out)
{
	char bin[512], ep[256], *o = NULL;
	char *argv[8];
	int n = 0, code;

	tool("fsck.etcfs", bin, sizeof(bin));
	snprintf(ep, sizeof(ep), "--endpoints=%s", efs_harness_endpoints(h));
	argv[n++] = bin;
	argv[n++] = ep;
	if (opt)
		argv[n++] = (char *)opt;
	if (opt2)
		argv[n++] = (char *)opt2;
	argv[n++] = img;
	argv[n] = NULL;
	code = run(argv, &o);
	if (out)
		*out = o;
	else
		efs_mem_free(o);
	return code;
}

static int fsck(const char *opt, char **out)
{
	return fsck2(opt, NULL, out);
}

/* ---- Keys ---- */

static int64_t revision(void)
{
	Etcdserverpb__StatusResponse *st = NULL;
	int64_t rev;

	cr_assert_eq(efs_etcd_sync_status(s, &st), 0);
	rev = st->header->revision;
	protobuf_c_message_free_unpacked(&st->base, efs_mem_protobuf());
	return rev;
}

static void put_raw(const struct efs_meta_key *k, const void *v, size_t len, int64_t lease)
{
	cr_assert_eq(efs_etcd_sync_put(s, k->buf, k->len, v, len, lease, NULL), 0);
}

static void put_msg(const struct efs_meta_key *k, const ProtobufCMessage *m, int64_t lease)
{
	ProtobufCBinaryData b;

	cr_assert_eq(efs_meta_pack(m, &b), 0);
	put_raw(k, b.data, b.len, lease);
	efs_mem_free(b.data);
}

static bool exists(const struct efs_meta_key *k)
{
	int r = efs_etcd_sync_get(s, k->buf, k->len, NULL, NULL);

	cr_assert(r == 0 || r == -ENOENT, "get: %d", r);
	return r == 0;
}

static void del(const struct efs_meta_key *k)
{
	int64_t n = 0;

	cr_assert_eq(efs_etcd_sync_delete(s, k->buf, k->len, false, &n), 0);
	cr_assert_eq(n, 1);
}

static struct efs_meta_key inode_key(uint64_t ino)
{
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_key_inode(&ns, ino, &k), 0);
	return k;
}

static struct efs_meta_key dirent_key(uint64_t parent, const char *name)
{
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_key_dirent(&ns, parent, name, strlen(name), &k), 0);
	return k;
}

static void put_inode(uint64_t ino, uint32_t mode, uint32_t nlink, uint64_t parent)
{
	Etcfs__Inode in = ETCFS__INODE__INIT;
	struct efs_meta_key k = inode_key(ino);
	const char *reason = NULL;

	in.mode = mode;
	in.nlink = nlink;
	in.parent = parent;
	in.atime_ns = in.mtime_ns = in.ctime_ns = in.btime_ns = 1700000000000000000;
	if (S_ISLNK(mode)) {
		in.symlink.data = (uint8_t *)"target";
		in.symlink.len = 6;
		in.size = 6;
	}
	cr_assert_eq(efs_meta_inode_check(&in, &reason), 0, "test inode: %s", reason);
	put_msg(&k, &in.base, 0);
}

static Etcfs__Inode *get_inode(uint64_t ino)
{
	struct efs_meta_key k = inode_key(ino);
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__Inode *in = NULL;

	cr_assert_eq(efs_etcd_sync_get(s, k.buf, k.len, &kv, NULL), 0, "no inode %" PRIu64, ino);
	cr_assert_eq(efs_meta_inode_decode(kv->value.data, kv->value.len, &in, NULL), 0);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	return in;
}

static void put_dirent(uint64_t parent, const char *name, uint64_t ino, uint32_t type)
{
	Etcfs__Dirent de = ETCFS__DIRENT__INIT;
	struct efs_meta_key k = dirent_key(parent, name);

	de.ino = ino;
	de.type = type;
	put_msg(&k, &de.base, 0);
}

static Etcfs__Dirent *get_dirent(uint64_t parent, const char *name)
{
	struct efs_meta_key k = dirent_key(parent, name);
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__Dirent *de = NULL;

	cr_assert_eq(efs_etcd_sync_get(s, k.buf, k.len, &kv, NULL), 0, "no entry %s", name);
	cr_assert_eq(efs_meta_dirent_decode(kv->value.data, kv->value.len, &de, NULL), 0);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	return de;
}

static void put_counter(uint64_t next)
{
	Etcfs__InoCounter c = ETCFS__INO_COUNTER__INIT;
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_key_ino_counter(&ns, &k), 0);
	c.next = next;
	put_msg(&k, &c.base, 0);
}

static int64_t grant(int64_t ttl)
{
	Etcdserverpb__LeaseGrantRequest req = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	Etcdserverpb__LeaseGrantResponse *resp;
	ProtobufCMessage *m;
	int64_t id;

	req.ttl = ttl;
	cr_assert_eq(efs_etcd_sync_call(s, EFS_ETCD_LEASE_GRANT, &req.base, &m, NULL), 0);
	resp = (Etcdserverpb__LeaseGrantResponse *)m;
	id = resp->id;
	protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
	return id;
}

static struct efs_meta_key holder_key(uint64_t ino, int mode, const char *node)
{
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_key_holder(&ns, ino, mode, node, &k), 0);
	return k;
}

static void put_holder(uint64_t ino, int mode, const char *node, int64_t lease)
{
	Etcfs__LockHolder lh = ETCFS__LOCK_HOLDER__INIT;
	struct efs_meta_key k = holder_key(ino, mode, node);

	lh.node = (char *)node;
	lh.mode = (uint32_t)mode;
	lh.session_generation = 1;
	lh.token = 7;
	lh.lease_id = lease ? lease : 0x1234;
	put_msg(&k, &lh.base, lease);
}

static struct efs_meta_key node_key(const char *node)
{
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_key_node(&ns, node, &k), 0);
	return k;
}

static void put_node(const char *node, int64_t lease)
{
	Etcfs__NodeInfo ni = ETCFS__NODE_INFO__INIT;
	struct efs_meta_key k = node_key(node);

	ni.machine_id = (char *)"0123456789abcdef0123456789abcdef";
	ni.hostname = (char *)"host";
	ni.pid = 4242;
	ni.version = (char *)"test";
	ni.lease_id = lease ? lease : 0x1234;
	ni.session_generation = 1;
	put_msg(&k, &ni.base, lease);
}

/* ---- Fixture ---- */

static void setup(void)
{
	struct efs_harness_opts o = {.members = 1};
	struct efs_etcd_opts eo = {0};
	char bin[512], ep[256], *out = NULL;
	char *argv[] = {bin, ep, (char *)"--name", (char *)FSNAME, img, NULL};
	int fd, code;

	cr_assert_eq(efs_harness_start(&h, &o), 0, "cannot start etcd");
	eo.endpoints = efs_harness_endpoints(h);
	cr_assert_eq(efs_etcd_sync_new(&s, &eo), 0);
	cr_assert_eq(efs_meta_ns_init(&ns, FSNAME), 0);
	snprintf(img, sizeof(img), "/tmp/fscktest-%d.img", (int)getpid());
	fd = open(img, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, 64 << 20), 0);
	close(fd);
	tool("mkfs.etcfs", bin, sizeof(bin));
	snprintf(ep, sizeof(ep), "--endpoints=%s", efs_harness_endpoints(h));
	code = run(argv, &out);
	cr_assert_eq(code, 0, "mkfs.etcfs exited %d:\n%s", code, out);
	efs_mem_free(out);
}

static void teardown(void)
{
	s = efs_etcd_sync_free(s);
	h = efs_harness_free(h);
	if (img[0])
		unlink(img);
}

/*
 * The tree: / holds lost+found, a (dir), f (file), h (a second name of
 * a/g); a holds g, b (dir) and s (symlink). Written as a node would.
 */
static void populate(void)
{
	put_inode(EFS_META_ROOT_INO, S_IFDIR | 0755, 4, EFS_META_ROOT_INO);
	put_inode(INO_A, S_IFDIR | 0755, 3, EFS_META_ROOT_INO);
	put_inode(INO_F, S_IFREG | 0644, 1, 0);
	put_inode(INO_G, S_IFREG | 0644, 2, 0);
	put_inode(INO_B, S_IFDIR | 0755, 2, INO_A);
	put_inode(INO_S, S_IFLNK | 0777, 1, 0);
	put_dirent(EFS_META_ROOT_INO, "a", INO_A, DT_DIR);
	put_dirent(EFS_META_ROOT_INO, "f", INO_F, DT_REG);
	put_dirent(EFS_META_ROOT_INO, "h", INO_G, DT_REG);
	put_dirent(INO_A, "g", INO_G, DT_REG);
	put_dirent(INO_A, "b", INO_B, DT_DIR);
	put_dirent(INO_A, "s", INO_S, DT_LNK);
	put_counter(1024);
}

/* Found without --repair (exit 4, each of |what| in the output, nothing
 * written); then --repair (exit 1), and a clean check (exit 0). */
#define found_and_repaired(...) found_and_repaired_v((const char *const[]){__VA_ARGS__, NULL})
static void found_and_repaired_v(const char *const *what)
{
	int64_t rev = revision();
	char *out = NULL;
	int code;

	code = fsck(NULL, &out);
	cr_assert_eq(code, 4, "fsck exited %d, not 4:\n%s", code, out);
	for (size_t i = 0; what[i]; i++)
		cr_assert_not_null(strstr(out, what[i]), "'%s' not in:\n%s", what[i], out);
	cr_assert_not_null(strstr(out, "--repair would"), "no repair offered:\n%s", out);
	efs_mem_free(out);
	cr_assert_eq(revision(), rev, "a check without --repair wrote to etcd");
	code = fsck("-n", NULL);
	cr_assert_eq(code, 4);
	cr_assert_eq(revision(), rev, "fsck -n wrote to etcd");

	code = fsck("--repair", &out);
	cr_assert_eq(code, 1, "fsck --repair exited %d, not 1:\n%s", code, out);
	cr_assert_not_null(strstr(out, "repaired"), "%s", out);
	efs_mem_free(out);
	code = fsck(NULL, &out);
	cr_assert_eq(code, 0, "second fsck exited %d, not 0:\n%s", code, out);
	efs_mem_free(out);
}

/* Found (exit 4) and left alone by --repair (exit 4, nothing written). */
static void found_not_repaired(const char *what)
{
	int64_t rev = revision();
	char *out = NULL;
	int code;

	code = fsck(NULL, &out);
	cr_assert_eq(code, 4, "fsck exited %d, not 4:\n%s", code, out);
	cr_assert_not_null(strstr(out, what), "'%s' not in:\n%s", what, out);
	efs_mem_free(out);
	code = fsck("--repair", &out);
	cr_assert_eq(code, 4, "fsck --repair exited %d, not 4:\n%s", code, out);
	efs_mem_free(out);
	cr_assert_eq(revision(), rev, "fsck wrote to etcd");
}

static void finish(void)
{
	teardown();
}

TestSuite(fsck, .init = setup, .fini = teardown, .timeout = 60);

Test(fsck, fresh_and_populated_are_clean)
{
	char *out = NULL;
	int code;

	code = fsck(NULL, &out);
	cr_assert_eq(code, 0, "fresh filesystem: exit %d:\n%s", code, out);
	efs_mem_free(out);
	populate();
	code = fsck("-v", &out);
	cr_assert_eq(code, 0, "populated filesystem: exit %d:\n%s", code, out);
	cr_assert_not_null(strstr(out, "clean, 7 inodes"), "%s", out);
	efs_mem_free(out);
	code = fsck("--repair", NULL);
	cr_assert_eq(code, 0);
	cr_assert_eq(fsck("--bogus", NULL), 16);
	cr_assert_eq(fsck2("--repair", "-n", NULL), 16);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, dangling_dirent)
{
	struct efs_meta_key k = dirent_key(INO_A, "ghost");

	populate();
	put_dirent(INO_A, "ghost", 500, DT_REG);
	found_and_repaired("names inode 500, which does not exist");
	cr_assert(!exists(&k));
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, wrong_file_nlink)
{
	Etcfs__Inode *in;

	populate();
	put_inode(INO_G, S_IFREG | 0644, 5, 0);
	found_and_repaired("has link count 5, but 2 names name it");
	in = get_inode(INO_G);
	cr_assert_eq(in->nlink, 2);
	efs_meta_record_free(in);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, wrong_dir_nlink)
{
	Etcfs__Inode *in;

	populate();
	put_inode(INO_A, S_IFDIR | 0755, 7, EFS_META_ROOT_INO);
	found_and_repaired("has link count 7, but with 1 subdirectory it should be 3");
	in = get_inode(INO_A);
	cr_assert_eq(in->nlink, 3);
	efs_meta_record_free(in);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, unreferenced_inode_goes_to_lost_found)
{
	Etcfs__Dirent *de;
	Etcfs__Inode *in;

	populate();
	put_inode(600, S_IFREG | 0600, 3, 0);
	put_inode(601, S_IFDIR | 0700, 2, INO_A);
	found_and_repaired("inode 600 (link count 3) has no name in any directory");
	de = get_dirent(2, "#600");
	cr_assert_eq(de->ino, 600);
	cr_assert_eq(de->type, DT_REG);
	efs_meta_record_free(de);
	in = get_inode(600);
	cr_assert_eq(in->nlink, 1);
	efs_meta_record_free(in);
	de = get_dirent(2, "#601");
	cr_assert_eq(de->type, DT_DIR);
	efs_meta_record_free(de);
	in = get_inode(601);
	cr_assert_eq(in->parent, 2);
	efs_meta_record_free(in);
	in = get_inode(2);
	cr_assert_eq(in->nlink, 3, "lost+found counts its new subdirectory");
	efs_meta_record_free(in);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, directory_cycle)
{
	Etcfs__Inode *in;

	populate();
	put_inode(700, S_IFDIR | 0755, 3, 701);
	put_inode(701, S_IFDIR | 0755, 3, 700);
	put_dirent(700, "x", 701, DT_DIR);
	put_dirent(701, "y", 700, DT_DIR);
	found_and_repaired("name each other in a cycle");
	/* The smaller inode moved to lost+found, with the other below it. */
	{
		struct efs_meta_key k = dirent_key(701, "y");

		cr_assert(!exists(&k));
	}
	in = get_inode(700);
	cr_assert_eq(in->parent, 2);
	cr_assert_eq(in->nlink, 3);
	efs_meta_record_free(in);
	in = get_inode(701);
	cr_assert_eq(in->parent, 700);
	cr_assert_eq(in->nlink, 2);
	efs_meta_record_free(in);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, wrong_parent_pointer)
{
	Etcfs__Inode *in;

	populate();
	put_inode(INO_B, S_IFDIR | 0755, 2, EFS_META_ROOT_INO);
	found_and_repaired("says its parent is inode 1, but it is named in directory /a");
	in = get_inode(INO_B);
	cr_assert_eq(in->parent, INO_A);
	efs_meta_record_free(in);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, wrong_dirent_type)
{
	Etcfs__Dirent *de;

	populate();
	put_dirent(INO_A, "s", INO_S, DT_REG);
	found_and_repaired("says it names a file, but inode 14 is a symlink");
	de = get_dirent(INO_A, "s");
	cr_assert_eq(de->type, DT_LNK);
	efs_meta_record_free(de);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, holder_without_lease)
{
	struct efs_meta_key k = holder_key(INO_F, EFS_META_LOCK_EXCLUSIVE, "node1");
	struct efs_meta_key n = node_key("node2");

	populate();
	put_holder(INO_F, EFS_META_LOCK_EXCLUSIVE, "node1", 0);
	put_node("node2", 0);
	found_and_repaired("is not attached to a lease");
	cr_assert(!exists(&k));
	cr_assert(!exists(&n));
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, exclusive_and_shared_holders_reported_only)
{
	int64_t l1, l2;

	populate();
	l1 = grant(60);
	l2 = grant(60);
	put_holder(INO_F, EFS_META_LOCK_EXCLUSIVE, "node1", l1);
	put_holder(INO_F, EFS_META_LOCK_SHARED, "node2", l2);
	found_not_repaired("has an exclusive holder, node node1, together with other holders: "
			   "node2 (shared)");
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, xattr_of_missing_inode)
{
	struct efs_meta_key k;

	populate();
	cr_assert_eq(efs_meta_key_xattr(&ns, 800, "user.a", 6, &k), 0);
	put_raw(&k, "value", 5, 0);
	found_and_repaired("extended attributes of inode 800, which does not exist");
	cr_assert(!exists(&k));
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, ino_counter_too_low)
{
	populate();
	put_counter(5);
	found_and_repaired("inode 14 exists");
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, undecodable_records)
{
	struct efs_meta_key d = dirent_key(INO_A, "junk");
	struct efs_meta_key i = inode_key(900);
	struct efs_meta_key u;
	Etcfs__Dirent *de;

	populate();
	/* A dirent that does not parse (its target then has no name) and an
	 * inode record that does not parse. */
	put_raw(&d, "\xff\xff\xff\xff", 4, 0);
	put_inode(901, S_IFREG | 0644, 1, 0);
	put_raw(&i, "\x08", 1, 0);
	/* A key of no etcfs family inside the prefix. */
	cr_assert_lt(ns.len + 3, sizeof(u.buf));
	memcpy(u.buf, ns.prefix, ns.len);
	memcpy(u.buf + ns.len, "zzz", 3);
	u.len = ns.len + 3;
	put_raw(&u, "x", 1, 0);
	found_and_repaired("directory entry \"junk\" in directory inode 10 cannot be decoded",
			   "inode record of inode 900 cannot be decoded",
			   "key zzz is not a key of any etcfs family",
			   "file inode 901 (link count 1) has no name in any directory");
	cr_assert(!exists(&d));
	cr_assert(!exists(&i));
	cr_assert(!exists(&u));
	de = get_dirent(2, "#901");
	efs_meta_record_free(de);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, missing_lost_found_is_created)
{
	struct efs_meta_key lf = dirent_key(EFS_META_ROOT_INO, "lost+found");
	struct efs_meta_key two = inode_key(2);
	Etcfs__Dirent *de;
	Etcfs__Inode *in;

	populate();
	del(&lf);
	del(&two);
	put_inode(EFS_META_ROOT_INO, S_IFDIR | 0755, 3, EFS_META_ROOT_INO);
	found_and_repaired("there is no /lost+found");
	de = get_dirent(EFS_META_ROOT_INO, "lost+found");
	cr_assert_eq(de->type, DT_DIR);
	cr_assert_geq(de->ino, 1024, "a fresh inode number, from the counter");
	in = get_inode(de->ino);
	cr_assert_eq(in->mode, S_IFDIR | 0700);
	cr_assert_eq(in->parent, EFS_META_ROOT_INO);
	efs_meta_record_free(in);
	efs_meta_record_free(de);
	in = get_inode(EFS_META_ROOT_INO);
	cr_assert_eq(in->nlink, 4);
	efs_meta_record_free(in);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, unnamed_lost_found_is_relinked)
{
	struct efs_meta_key lf = dirent_key(EFS_META_ROOT_INO, "lost+found");
	Etcfs__Dirent *de;

	populate();
	del(&lf);
	found_and_repaired("/lost+found is missing");
	de = get_dirent(EFS_META_ROOT_INO, "lost+found");
	cr_assert_eq(de->ino, 2);
	efs_meta_record_free(de);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, repair_refused_while_mounted)
{
	struct efs_meta_key k = dirent_key(INO_A, "ghost");
	char *out = NULL;
	int64_t rev;
	int code;

	populate();
	put_dirent(INO_A, "ghost", 500, DT_REG);
	put_node("node1", grant(60));
	rev = revision();
	code = fsck(NULL, &out);
	cr_assert_eq(code, 4, "exit %d:\n%s", code, out);
	cr_assert_not_null(strstr(out, "may include changes in flight"), "%s", out);
	efs_mem_free(out);
	code = fsck("--repair", &out);
	cr_assert_eq(code, 8, "exit %d:\n%s", code, out);
	cr_assert_not_null(strstr(out, "node node1 is mounted; unmount all nodes first"), "%s",
			   out);
	efs_mem_free(out);
	cr_assert_eq(revision(), rev, "a refused repair wrote to etcd");
	cr_assert(exists(&k));
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, not_an_etcfs_device)
{
	int fd = open(img, O_WRONLY | O_CLOEXEC);
	char zero[4096] = {0};

	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, zero, sizeof(zero), 0), (ssize_t)sizeof(zero));
	close(fd);
	cr_assert_eq(fsck(NULL, NULL), 8);
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, unlinked_inode_without_orphan_record_is_deleted)
{
	struct efs_meta_key i = inode_key(950), x;

	populate();
	put_inode(950, S_IFREG | 0644, 0, 0);
	cr_assert_eq(efs_meta_key_xattr(&ns, 950, "user.a", 6, &x), 0);
	put_raw(&x, "v", 1, 0);
	found_and_repaired("file inode 950 has link count 0, no name and no orphan or reclaim "
			   "record");
	cr_assert(!exists(&i));
	cr_assert(!exists(&x));
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, orphan_record_of_linked_inode)
{
	Etcfs__Orphan o = ETCFS__ORPHAN__INIT;
	struct efs_meta_key k;

	populate();
	cr_assert_eq(efs_meta_key_orphan(&ns, INO_F, &k), 0);
	o.since_ns = 1;
	put_msg(&k, &o.base, 0);
	found_and_repaired("orphan record of inode 11, which still has link count 1");
	cr_assert(!exists(&k));
	finish();
	efs_test_assert_no_leaks();
}

Test(fsck, group_free_count)
{
	Etcfs__AgFree af = ETCFS__AG_FREE__INIT;
	struct efs_meta_key k;

	populate();
	cr_assert_eq(efs_meta_key_ag(&ns, 3, EFS_META_K_AG_FREE, &k), 0);
	af.free_blocks = 7;
	put_msg(&k, &af.base, 0);
	found_and_repaired("allocation group 3's free count is 7, but its free map holds 256 free "
			   "blocks");
	finish();
	efs_test_assert_no_leaks();
}

/* Several corruptions whose repairs depend on each other: lost+found must
 * be created before anything is linked into it, link counts follow. */
Test(fsck, many_at_once)
{
	struct efs_meta_key lf = dirent_key(EFS_META_ROOT_INO, "lost+found");
	struct efs_meta_key two = inode_key(2);
	struct efs_meta_key junk = dirent_key(EFS_META_ROOT_INO, "junk");
	Etcfs__Dirent *de;
	Etcfs__Inode *in;
	uint64_t lfino;

	populate();
	del(&lf);
	del(&two);
	put_inode(700, S_IFDIR | 0755, 3, 701);
	put_inode(701, S_IFDIR | 0755, 3, 700);
	put_dirent(700, "x", 701, DT_DIR);
	put_dirent(701, "y", 700, DT_DIR);
	put_inode(600, S_IFREG | 0600, 1, 0);
	put_dirent(INO_B, "ghost", 500, DT_REG);
	put_raw(&junk, "\xff", 1, 0);
	put_inode(INO_A, S_IFDIR | 0755, 9, EFS_META_ROOT_INO);
	found_and_repaired("there is no /lost+found", "name each other in a cycle",
			   "inode 600 (link count 1) has no name", "names inode 500",
			   "cannot be decoded", "has link count 9");
	de = get_dirent(EFS_META_ROOT_INO, "lost+found");
	lfino = de->ino;
	efs_meta_record_free(de);
	de = get_dirent(lfino, "#600");
	efs_meta_record_free(de);
	de = get_dirent(lfino, "#700");
	efs_meta_record_free(de);
	in = get_inode(lfino);
	cr_assert_eq(in->nlink, 3);
	efs_meta_record_free(in);
	in = get_inode(EFS_META_ROOT_INO);
	cr_assert_eq(in->nlink, 4);
	efs_meta_record_free(in);
	finish();
	efs_test_assert_no_leaks();
}

/* The library: a change between the check and the repair, or a node that
 * mounts meanwhile, makes that repair fail instead of overwriting. */
Test(fsck, concurrent_change_aborts_repair)
{
	struct efs_meta_key ghost = dirent_key(INO_A, "ghost");
	struct efs_check_report *rep = NULL;
	char err[256];
	Etcfs__Inode *in;
	size_t nlink_f = SIZE_MAX, ghost_f = SIZE_MAX;

	populate();
	put_inode(INO_G, S_IFREG | 0644, 5, 0);
	put_dirent(INO_A, "ghost", 500, DT_REG);
	cr_assert_eq(efs_check_run(s, &ns, NULL, &rep, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(rep->errors, 2);
	for (size_t i = 0; i < rep->n_findings; i++) {
		if (strstr(rep->findings[i].message, "link count 5"))
			nlink_f = i;
		if (strstr(rep->findings[i].message, "ghost"))
			ghost_f = i;
	}
	cr_assert_neq(nlink_f, SIZE_MAX);
	cr_assert_neq(ghost_f, SIZE_MAX);
	/* Someone changes the inode, then a node mounts. */
	put_inode(INO_G, S_IFREG | 0644, 6, 0);
	put_node("node9", grant(60));
	cr_assert_eq(efs_check_repair(s, rep), 0);
	cr_assert_eq(rep->findings[nlink_f].state, EFS_CHECK_REPAIR_FAILED);
	cr_assert_eq(rep->findings[ghost_f].state, EFS_CHECK_REPAIR_FAILED);
	cr_assert_not_null(rep->findings[ghost_f].repair_message);
	in = get_inode(INO_G);
	cr_assert_eq(in->nlink, 6, "the concurrent change was overwritten");
	efs_meta_record_free(in);
	cr_assert(exists(&ghost));
	rep = efs_check_report_free(rep);
	/* Checked again, the mounted node refuses repairs outright. */
	cr_assert_eq(efs_check_run(s, &ns, NULL, &rep, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(rep->n_mounted, 1);
	cr_assert_str_eq(rep->mounted[0], "node9");
	cr_assert_eq(efs_check_repair(s, rep), -EBUSY);
	rep = efs_check_report_free(rep);
	finish();
	efs_test_assert_no_leaks();
}

/* ---- Space (invariants 1 and 2) ---- */

/*
 * The test image: 64 MiB of 4 KiB blocks, data area [256, 16384), groups
 * of 256 blocks, group g at device block 256 + 256 * g.
 */
#define DS	 256
#define AGB	 256
#define DEV_END	 16384
#define GRP(g)	 (DS + AGB * (uint64_t)(g))

/* A regular file |ino| of |size| bytes named "f<ino>" in the root. */
static void put_file(uint64_t ino, uint64_t size, uint32_t nlink)
{
	Etcfs__Inode in = ETCFS__INODE__INIT;
	struct efs_meta_key k = inode_key(ino);
	char name[32];

	in.mode = S_IFREG | 0644;
	in.nlink = nlink;
	in.size = size;
	in.atime_ns = in.mtime_ns = in.ctime_ns = in.btime_ns = 1700000000000000000;
	put_msg(&k, &in.base, 0);
	put_counter(1024);
	if (nlink) {
		snprintf(name, sizeof(name), "f%" PRIu64, ino);
		put_dirent(EFS_META_ROOT_INO, name, ino, DT_REG);
	}
}

/* e/<ino><chunk> holding |n| extents {file block, device block, count, flags}. */
static void put_chunk(uint64_t ino, uint64_t chunk, size_t n, const uint64_t (*x)[4])
{
	Etcfs__ExtentChunk ch = ETCFS__EXTENT_CHUNK__INIT;
	Etcfs__Extent ex[8], *ep[8];
	struct efs_meta_key k;

	cr_assert_leq(n, 8);
	for (size_t i = 0; i < n; i++) {
		etcfs__extent__init(&ex[i]);
		ex[i].file_block = x[i][0];
		ex[i].dev_block = x[i][1];
		ex[i].count = x[i][2];
		ex[i].flags = (uint32_t)x[i][3];
		ep[i] = &ex[i];
	}
	ch.extents = ep;
	ch.n_extents = n;
	cr_assert_eq(efs_meta_key_extent(&ns, ino, chunk, &k), 0);
	put_msg(&k, &ch.base, 0);
}

/* Group |g|'s map as runs, and its free count. */
static void get_map(uint32_t g, struct efs_runs *runs, uint64_t *count)
{
	struct efs_meta_key k;
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__AgMap *m = NULL;
	Etcfs__AgFree *af = NULL;

	cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_MAP, &k), 0);
	cr_assert_eq(efs_etcd_sync_get(s, k.buf, k.len, &kv, NULL), 0);
	cr_assert_eq(efs_meta_ag_map_decode(kv->value.data, kv->value.len, &m, NULL), 0);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	cr_assert_eq(m->group_blocks, AGB);
	for (size_t i = 0; i < m->n_free; i++)
		cr_assert_eq(efs_runs_add(runs, m->free[i]->start, m->free[i]->len), 0);
	efs_meta_record_free(m);
	cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_FREE, &k), 0);
	cr_assert_eq(efs_etcd_sync_get(s, k.buf, k.len, &kv, NULL), 0);
	cr_assert_eq(efs_meta_ag_free_decode(kv->value.data, kv->value.len, &af, NULL), 0);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	*count = af->free_blocks;
	efs_meta_record_free(af);
}

static void put_map(uint32_t g, const struct efs_runs *runs, uint64_t count)
{
	Etcfs__AgMap m = ETCFS__AG_MAP__INIT;
	Etcfs__AgFree af = ETCFS__AG_FREE__INIT;
	Etcfs__Run rv[64], *rp[64];
	struct efs_meta_key k;

	cr_assert_leq(runs->n, 64);
	for (size_t i = 0; i < runs->n; i++) {
		etcfs__run__init(&rv[i]);
		rv[i].start = runs->v[i].start;
		rv[i].len = runs->v[i].len;
		rp[i] = &rv[i];
	}
	m.free = rp;
	m.n_free = runs->n;
	m.group_blocks = AGB;
	cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_MAP, &k), 0);
	put_msg(&k, &m.base, 0);
	af.free_blocks = count;
	cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_FREE, &k), 0);
	put_msg(&k, &af.base, 0);
}

/* Takes device blocks [dev, dev + count) out of their groups' maps (as an
 * allocation does), keeping each free count equal to its map's sum. */
static void take_blocks(uint64_t dev, uint64_t count)
{
	while (count) {
		uint32_t g = (uint32_t)((dev - DS) / AGB);
		uint64_t n = GRP(g + 1) - dev < count ? GRP(g + 1) - dev : count;
		struct efs_runs runs = {0}, cut = {0};
		uint64_t free_blocks;

		get_map(g, &runs, &free_blocks);
		cr_assert_eq(efs_runs_subtract(&runs, dev - GRP(g), n, &cut), 0);
		cr_assert_eq(efs_runs_total(&cut), n, "blocks %" PRIu64 "+%" PRIu64 " not free",
			     dev, n);
		put_map(g, &runs, efs_runs_total(&runs));
		efs_runs_done(&runs);
		efs_runs_done(&cut);
		dev += n;
		count -= n;
	}
}

/* Asserts group |g|'s free count equals its map's sum, and whether block
 * |rel| (group-relative) is free. */
static void assert_group(uint32_t g, uint64_t rel, bool free_)
{
	struct efs_runs runs = {0};
	uint64_t count;

	get_map(g, &runs, &count);
	cr_assert_eq(count, efs_runs_total(&runs), "group %" PRIu32 ": count %" PRIu64
		     " but the map holds %" PRIu64, g, count, efs_runs_total(&runs));
	cr_assert_eq(efs_runs_overlaps(&runs, rel, 1), free_, "group %" PRIu32 " block %" PRIu64,
		     g, rel);
	efs_runs_done(&runs);
}

static void put_intent(uint32_t g, const char *node, uint64_t seq, uint64_t start, uint64_t len)
{
	Etcfs__FreeIntent fi = ETCFS__FREE_INTENT__INIT;
	Etcfs__Run r = ETCFS__RUN__INIT, *rp = &r;
	struct efs_meta_key k;

	r.start = start;
	r.len = len;
	fi.runs = &rp;
	fi.n_runs = 1;
	fi.ino = 99;
	cr_assert_eq(efs_meta_key_free_intent(&ns, g, node, 1, seq, &k), 0);
	put_msg(&k, &fi.base, 0);
}

/*
 * Files whose extents were taken from the maps (one across a group
 * boundary, one in two chunks, a preallocated extent beyond the size, an
 * inode being reclaimed) and a pending free intent: no finding.
 */
Test(fsck, space_consistent_is_clean)
{
	Etcfs__Reclaim rc = ETCFS__RECLAIM__INIT;
	struct efs_meta_key k;
	char *out = NULL;
	int code;

	put_file(20, 10 * 4096, 1);
	put_chunk(20, 0, 2, (const uint64_t[][4]){{0, GRP(1), 4, 0}, {4, GRP(3) - 3, 6, 0}});
	take_blocks(GRP(1), 4);
	take_blocks(GRP(3) - 3, 6);
	put_file(21, 257 * 4096 - 100, 1);
	put_chunk(21, 0, 1, (const uint64_t[][4]){{0, GRP(5) + 7, 2, 0}});
	put_chunk(21, 256, 1, (const uint64_t[][4]){{256, GRP(62) + 1, 1, 0}});
	take_blocks(GRP(5) + 7, 2);
	take_blocks(GRP(62) + 1, 1);
	put_file(22, 0, 1);
	put_chunk(22, 0, 1, (const uint64_t[][4]){{0, GRP(6), 3, EFS_META_EXTENT_F_PREALLOC}});
	take_blocks(GRP(6), 3);
	put_file(23, 5 * 4096, 0);
	cr_assert_eq(efs_meta_key_reclaim(&ns, 23, &k), 0);
	rc.since_ns = 1;
	put_msg(&k, &rc.base, 0);
	put_chunk(23, 0, 1, (const uint64_t[][4]){{0, GRP(7) + 100, 5, 0}});
	take_blocks(GRP(7) + 100, 5);
	put_intent(10, "node1", 1, 5, 3);
	take_blocks(GRP(10) + 5, 3);
	code = fsck(NULL, &out);
	cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
	efs_mem_free(out);
	finish();
	efs_test_assert_no_leaks();
}

/* (a) Two files share device blocks: invariant 2, reported only. */
Test(fsck, space_overlapping_extents)
{
	char *out = NULL;

	put_file(30, 8 * 4096, 1);
	put_file(31, 4 * 4096, 1);
	put_chunk(30, 0, 1, (const uint64_t[][4]){{0, GRP(2) + 10, 8, 0}});
	put_chunk(31, 0, 1, (const uint64_t[][4]){{0, GRP(2) + 16, 4, 0}});
	take_blocks(GRP(2) + 10, 10);
	found_not_repaired("device blocks 784-785 are used by two extents: file /f30 (inode "
			   "30), chunk 0, file blocks 0-7; and file /f31 (inode 31), chunk 0, "
			   "file blocks 0-3");
	cr_assert_eq(fsck(NULL, &out), 4);
	cr_assert_null(strstr(out, "leaked"), "%s", out);
	cr_assert_null(strstr(out, "free in the group's map"), "%s", out);
	efs_mem_free(out);
	finish();
	efs_test_assert_no_leaks();
}

/* (b) A block free in its map and used by a file: the file keeps it. */
Test(fsck, space_free_and_used)
{
	put_file(40, 3 * 4096, 1);
	put_chunk(40, 0, 1, (const uint64_t[][4]){{0, GRP(4) + 20, 3, 0}});
	take_blocks(GRP(4) + 20, 2);
	found_and_repaired("allocation group 4: 1 block is free in the group's map but used by a "
			   "file (a new file could be given it): device block 1302 (file "
			   "/f40 (inode 40), chunk 0, file blocks 0-2)",
			   "take it out of the group's free map (the file keeps it) and set "
			   "its free count to 253");
	assert_group(4, 22, false);
	finish();
	efs_test_assert_no_leaks();
}

/* (c) Blocks no map, intent or extent accounts for: freed again. */
Test(fsck, space_leaked_blocks)
{
	take_blocks(GRP(9) + 30, 4);
	found_and_repaired("allocation group 9: 4 blocks are neither free in the group's map, "
			   "nor in a free intent, nor used by any file (leaked): device blocks "
			   "2590-2593",
			   "put them back into the group's free map and set its free count to "
			   "256");
	assert_group(9, 30, true);
	assert_group(9, 33, true);
	finish();
	efs_test_assert_no_leaks();
}

/* (b) and (c) in one group, and a free count that was wrong besides: two
 * repairs of the same map, one after the other. */
Test(fsck, space_free_used_and_leaked_in_one_group)
{
	struct efs_runs runs = {0};
	uint64_t count;

	put_file(41, 2 * 4096, 1);
	put_chunk(41, 0, 1, (const uint64_t[][4]){{0, GRP(11), 2, 0}});
	take_blocks(GRP(11) + 200, 6);
	get_map(11, &runs, &count);
	put_map(11, &runs, 17);
	efs_runs_done(&runs);
	found_and_repaired("allocation group 11: 2 blocks are free in the group's map but used "
			   "by a file",
			   "allocation group 11: 6 blocks are neither free",
			   "set its free count to 254");
	assert_group(11, 0, false);
	assert_group(11, 1, false);
	assert_group(11, 2, true);
	assert_group(11, 200, true);
	get_map(11, &runs, &count);
	cr_assert_eq(count, 254);
	efs_runs_done(&runs);
	finish();
	efs_test_assert_no_leaks();
}

/* (d) A free intent of blocks already free, and one of blocks in use. */
Test(fsck, space_free_intent_double_free)
{
	char *out = NULL;

	put_intent(12, "node1", 1, 40, 2);
	put_file(42, 4096, 1);
	put_chunk(42, 0, 1, (const uint64_t[][4]){{0, GRP(13) + 3, 1, 0}});
	take_blocks(GRP(13) + 3, 1);
	put_intent(13, "node2", 7, 3, 1);
	found_not_repaired("allocation group 12: 2 blocks are in a free intent but already free "
			   "in the group's map (a double free pending): device blocks 3368-3369 "
			   "(the free intent of node node1 (session 1, sequence 1))");
	cr_assert_eq(fsck(NULL, &out), 4);
	cr_assert_not_null(strstr(out, "allocation group 13: 1 block is in a free intent but "
				       "still used by a file"),
			   "%s", out);
	efs_mem_free(out);
	finish();
	efs_test_assert_no_leaks();
}

/* (e) An extent outside the data area, and one reaching into the next
 * chunk of its file. */
Test(fsck, space_extent_outside_data_area)
{
	char *out = NULL;

	put_file(43, 4 * 4096, 1);
	put_chunk(43, 0, 1, (const uint64_t[][4]){{0, 10, 4, 0}});
	put_file(44, 300 * 4096, 1);
	put_chunk(44, 0, 1, (const uint64_t[][4]){{250, GRP(20), 10, 0}});
	put_chunk(44, 256, 1, (const uint64_t[][4]){{256, GRP(21), 1, 0}});
	take_blocks(GRP(20), 10);
	take_blocks(GRP(21), 1);
	found_not_repaired("the extent of file /f43 (inode 43), chunk 0, file blocks 0-3 uses "
			   "device blocks 10-13, outside the data area (device blocks "
			   "256-16383)");
	cr_assert_eq(fsck(NULL, &out), 4);
	cr_assert_not_null(strstr(out, "extent chunk 0 of inode 44 holds an extent (file /f44 "
				       "(inode 44), chunk 0, file blocks 250-259) that reaches "
				       "into the next chunk, which starts at file block 256"),
			   "%s", out);
	efs_mem_free(out);
	finish();
	efs_test_assert_no_leaks();
}

/* An extent chunk that does not decode hides the blocks it uses: leaked
 * blocks are reported but not freed. */
Test(fsck, space_leak_not_freed_while_a_chunk_is_unreadable)
{
	struct efs_meta_key k;
	char *out = NULL;

	put_file(45, 4096, 1);
	cr_assert_eq(efs_meta_key_extent(&ns, 45, 0, &k), 0);
	put_raw(&k, "\xff\xff", 2, 0);
	take_blocks(GRP(14), 1);
	found_not_repaired("allocation group 14: 1 block is neither free in the group's map, nor "
			   "in a free intent, nor used by any file (leaked): device block 3840; "
			   "not freed because extent chunk 0 of inode 45 cannot be decoded");
	cr_assert_eq(fsck(NULL, &out), 4);
	cr_assert_null(strstr(out, "--repair would put"), "%s", out);
	efs_mem_free(out);
	assert_group(14, 0, false);
	finish();
	efs_test_assert_no_leaks();
}

/* Invariant 5: extents beyond the size are cut (preallocated ones stay) and
 * the blocks cut off go back to the maps. */
Test(fsck, extents_beyond_size_are_cut)
{
	struct efs_meta_key k0, k256;
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__ExtentChunk *ch = NULL;

	put_file(46, 2 * 4096, 1);
	put_chunk(46, 0, 3,
		  (const uint64_t[][4]){{0, GRP(15), 3, 0},
					{3, GRP(15) + 10, 2, 0},
					{10, GRP(15) + 20, 1, EFS_META_EXTENT_F_PREALLOC}});
	put_chunk(46, 256, 1, (const uint64_t[][4]){{256, GRP(16), 4, 0}});
	take_blocks(GRP(15), 3);
	take_blocks(GRP(15) + 10, 2);
	take_blocks(GRP(15) + 20, 1);
	take_blocks(GRP(16), 4);
	found_and_repaired("file /f46 (inode 46) has extents up to block 5 in chunk 0, but its "
			   "size 8192 bytes covers 2 blocks",
			   "has extents up to block 260 in chunk 256",
			   "allocation group 15: 3 blocks are used only beyond a file's size",
			   "allocation group 16: 4 blocks are used only beyond a file's size");
	cr_assert_eq(efs_meta_key_extent(&ns, 46, 0, &k0), 0);
	cr_assert_eq(efs_meta_key_extent(&ns, 46, 256, &k256), 0);
	cr_assert(!exists(&k256));
	cr_assert_eq(efs_etcd_sync_get(s, k0.buf, k0.len, &kv, NULL), 0);
	cr_assert_eq(efs_meta_extent_chunk_decode(kv->value.data, kv->value.len, &ch, NULL), 0);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	cr_assert_eq(ch->n_extents, 2);
	cr_assert_eq(ch->extents[0]->count, 2);
	cr_assert_eq(ch->extents[1]->flags, EFS_META_EXTENT_F_PREALLOC);
	efs_meta_record_free(ch);
	assert_group(15, 1, false);
	assert_group(15, 2, true);
	assert_group(15, 10, true);
	assert_group(15, 11, true);
	assert_group(15, 20, false);
	assert_group(16, 3, true);
	finish();
	efs_test_assert_no_leaks();
}

/* A map changed between the check and the repair: the map patch fails
 * instead of overwriting the change. */
Test(fsck, space_repair_aborts_on_map_change)
{
	struct efs_check_report *rep = NULL;
	char err[256];

	take_blocks(GRP(17) + 5, 2);
	cr_assert_eq(efs_check_run(s, &ns, NULL, &rep, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(rep->errors, 1);
	cr_assert_not_null(strstr(rep->findings[0].message, "(leaked)"), "%s",
			   rep->findings[0].message);
	take_blocks(GRP(17) + 100, 1); /* as a node allocating meanwhile would */
	cr_assert_eq(efs_check_repair(s, rep), 0);
	cr_assert_eq(rep->findings[0].state, EFS_CHECK_REPAIR_FAILED);
	cr_assert_not_null(strstr(rep->findings[0].repair_message, "changed since the check"),
			   "%s", rep->findings[0].repair_message);
	rep = efs_check_report_free(rep);
	assert_group(17, 5, false);
	assert_group(17, 100, false);
	finish();
	efs_test_assert_no_leaks();
}
