/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mkfs.etcfs and etcfsctl df/status against a real etcd: the keys of
 * docs/FORMAT.md section 4, the superblock, the refusals (existing
 * superblock or keyspace, --force while a node is mounted), bad arguments
 * that write nothing, and the shared option sources (config file,
 * environment, command line).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "etcd/sync.h"
#include "meta/layout.h"
#include "harness.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "meta/sb.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

#define MiB (1ull << 20)

static struct efs_harness *h;
static struct efs_etcd_sync *s;
static char dir[256];
static char out[65536];

static void setup(void)
{
	struct efs_harness_opts o = {.members = 1};
	struct efs_etcd_opts eo;

	cr_assert_eq(efs_harness_start(&h, &o), 0, "cannot start etcd");
	eo = (struct efs_etcd_opts){.endpoints = efs_harness_endpoints(h),
				    .call_timeout_ms = 5000};
	cr_assert_eq(efs_etcd_sync_new(&s, &eo), 0);
	snprintf(dir, sizeof(dir), "/dev/shm/etcfs-test-mkfs-%d", (int)getpid());
	cr_assert_eq(mkdir(dir, 0700), 0, "%s: %s", dir, strerror(errno));
}

static void teardown(void)
{
	char cmd[512];

	s = efs_etcd_sync_free(s);
	h = efs_harness_free(h);
	if (dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "cannot remove %s\n", dir);
		dir[0] = '\0';
	}
}

/* The end of a test body: everything freed, then the leak check. */
static void finish(void)
{
	teardown();
	efs_test_assert_no_leaks();
}

/* Runs "<build>/<exe> <args>" with stderr merged; output in |out|. */
static int run(const char *exe, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int run(const char *exe, const char *fmt, ...)
{
	const char *root = getenv("ETCFS_BUILD_ROOT");
	char args[2048], cmd[4096];
	size_t n = 0;
	va_list ap;
	FILE *f;
	int st;

	cr_assert_not_null(root, "ETCFS_BUILD_ROOT is not set");
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "%s/etcfsd/%s %s 2>&1 </dev/null", root, exe, args);
	f = popen(cmd, "r");
	cr_assert_not_null(f);
	while (n + 1 < sizeof(out)) {
		size_t got = fread(out + n, 1, sizeof(out) - 1 - n, f);

		if (got == 0)
			break;
		n += got;
	}
	out[n] = '\0';
	st = pclose(f);
	cr_assert(WIFEXITED(st), "%s did not exit normally:\n%s", cmd, out);
	return WEXITSTATUS(st);
}

/* A sparse image of |size| bytes in the test directory. */
static const char *image(const char *name, uint64_t size)
{
	static char paths[8][512];
	static unsigned next;
	char *p = paths[next++ % 8];
	int fd;

	snprintf(p, 512, "%s/%s", dir, name);
	fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	cr_assert_geq(fd, 0, "%s: %s", p, strerror(errno));
	cr_assert_eq(ftruncate(fd, (off_t)size), 0);
	close(fd);
	return p;
}

static void read_block0(const char *path, uint8_t buf[EFS_SB_SIZE])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, buf, EFS_SB_SIZE, 0), EFS_SB_SIZE);
	close(fd);
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

static int64_t count_keys(const char *fsname)
{
	struct efs_meta_ns ns;
	struct efs_meta_range r;
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeResponse *resp = NULL;
	int64_t n;

	cr_assert_eq(efs_meta_ns_init(&ns, fsname), 0);
	cr_assert_eq(efs_meta_range_fs(&ns, &r), 0);
	req.key.data = r.key.buf;
	req.key.len = r.key.len;
	req.range_end.data = r.end.buf;
	req.range_end.len = r.end.len;
	req.count_only = true;
	cr_assert_eq(efs_etcd_sync_call(s, EFS_ETCD_RANGE, &req.base, (ProtobufCMessage **)&resp,
					NULL),
		     0);
	n = resp->count;
	efs_test_pb_free(resp);
	return n;
}

/* Reads key |k|; NULL when absent. */
static Mvccpb__KeyValue *get(const struct efs_meta_key *k)
{
	Mvccpb__KeyValue *kv = NULL;
	int r = efs_etcd_sync_get(s, k->buf, k->len, &kv, NULL);

	cr_assert(r == 0 || r == -ENOENT, "get: %d", r);
	return r == 0 ? kv : NULL;
}

static Etcfs__FsInfo *get_fsinfo(const char *fsname, int64_t *ret_mod)
{
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	Mvccpb__KeyValue *kv;
	Etcfs__FsInfo *fi = NULL;
	const char *why = NULL;

	cr_assert_eq(efs_meta_ns_init(&ns, fsname), 0);
	cr_assert_eq(efs_meta_key_sb(&ns, &k), 0);
	kv = get(&k);
	if (!kv)
		return NULL;
	cr_assert_eq(efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &fi, &why), 0, "%s",
		     why);
	if (ret_mod)
		*ret_mod = kv->mod_revision;
	efs_test_pb_free(kv);
	return fi;
}

/* The value after "<label>" on the output line that holds it. */
static const char *field(const char *label)
{
	const char *p = strstr(out, label);

	cr_assert_not_null(p, "no '%s' in:\n%s", label, out);
	p += strlen(label);
	while (*p == ' ')
		p++;
	return p;
}

static int64_t grant(int64_t ttl)
{
	Etcdserverpb__LeaseGrantRequest req = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	Etcdserverpb__LeaseGrantResponse *resp = NULL;
	int64_t id;

	req.ttl = ttl;
	cr_assert_eq(efs_etcd_sync_call(s, EFS_ETCD_LEASE_GRANT, &req.base,
					(ProtobufCMessage **)&resp, NULL),
		     0);
	id = resp->id;
	efs_test_pb_free(resp);
	return id;
}

static void lease_revoke(int64_t id)
{
	Etcdserverpb__LeaseRevokeRequest req = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
	Etcdserverpb__LeaseRevokeResponse *resp = NULL;

	req.id = id;
	cr_assert_eq(efs_etcd_sync_call(s, EFS_ETCD_LEASE_REVOKE, &req.base,
					(ProtobufCMessage **)&resp, NULL),
		     0);
	efs_test_pb_free(resp);
}

/* Puts n/<node> with a NodeInfo on a fresh lease, as a mounted node does. */
static int64_t put_node(const char *fsname, const char *node)
{
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	Etcfs__NodeInfo ni = ETCFS__NODE_INFO__INIT;
	ProtobufCBinaryData v;
	int64_t lease = grant(30);

	ni.machine_id = (char *)"0123456789abcdef0123456789abcdef";
	ni.hostname = (char *)"host-of-node";
	ni.pid = 4242;
	ni.version = (char *)"9.9.9";
	ni.wall_clock_ns = 1;
	ni.metrics_addr = (char *)"127.0.0.1:9123";
	ni.session_generation = 7;
	ni.lease_id = lease;
	ni.started_ns = 1764489600000000000;
	cr_assert_eq(efs_meta_ns_init(&ns, fsname), 0);
	cr_assert_eq(efs_meta_key_node(&ns, node, &k), 0);
	cr_assert_eq(efs_meta_pack(&ni.base, &v), 0);
	cr_assert_eq(efs_etcd_sync_put(s, k.buf, k.len, v.data, v.len, lease, NULL), 0);
	efs_mem_free(v.data);
	return lease;
}

static int mkfs(const char *args)
{
	return run("mkfs.etcfs", "--endpoints %s %s", efs_harness_endpoints(h), args);
}

static int dead_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

TestSuite(mkfs, .init = setup, .fini = teardown, .timeout = 120);
TestSuite(etcfsctl, .init = setup, .fini = teardown, .timeout = 120);

Test(mkfs, writes_the_documented_keys_and_a_matching_superblock)
{
	const char *img = image("a.img", 256 * MiB);
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	struct efs_layout l;
	struct efs_sb sb;
	Etcfs__FsInfo *fi;
	Mvccpb__KeyValue *kv;
	uint8_t buf[EFS_SB_SIZE];
	char reason[EFS_SB_REASON_MAX], uuid[37], args[600];
	int64_t sb_mod = 0, ag_max_mod = 0;
	const char *why = NULL;

	snprintf(args, sizeof(args), "--name fsa --inodes 5000 %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	cr_assert_eq(efs_layout_compute(256 * MiB, 4096, 5000, &l, NULL, 0), 0);

	/* The summary. */
	cr_assert(strstr(out, "formatted"), "%s", out);
	cr_assert_eq(strncmp(field("name:"), "fsa ", 4), 0, "%s", out);
	cr_assert_eq(strtoul(field("block size:"), NULL, 10), 4096, "%s", out);
	cr_assert_eq(strtoull(field("\n  size:"), NULL, 10), 256 * MiB, "%s", out);
	cr_assert_eq(strtoul(field("groups:"), NULL, 10), l.ag_count, "%s", out);
	cr_assert_eq(strtoull(field("inodes:"), NULL, 10), 5000, "%s", out);

	/* The device superblock decodes and matches etcd's "sb". */
	read_block0(img, buf);
	cr_assert_eq(efs_sb_decode(buf, sizeof(buf), &sb, NULL, reason, sizeof(reason)), 0, "%s",
		     reason);
	cr_assert_str_eq(sb.name, "fsa");
	cr_assert_eq(sb.block_size, 4096);
	cr_assert_eq(sb.data_start, l.data_start);
	cr_assert_eq(sb.device_size, 256 * MiB);
	cr_assert_eq(sb.inode_limit, 5000);
	efs_sb_uuid_format(sb.uuid, uuid);
	cr_assert_eq(strncmp(field("uuid:"), uuid, 36), 0, "summary uuid vs %s:\n%s", uuid, out);
	fi = get_fsinfo("fsa", &sb_mod);
	cr_assert_not_null(fi);
	cr_assert_eq(efs_sb_match_fsinfo(&sb, fi, reason, sizeof(reason)), 0, "%s", reason);
	cr_assert_eq(fi->ag_count, l.ag_count);
	cr_assert_eq(fi->ag_blocks, l.ag_blocks);
	cr_assert_eq(fi->inode_limit, 5000);
	efs_meta_record_free(fi);

	/* Exactly: two keys per group, ino, renameseq, i/1, i/2, the dirent, sb. */
	cr_assert_eq(count_keys("fsa"), 2 * (int64_t)l.ag_count + 6);
	cr_assert_eq(efs_meta_ns_init(&ns, "fsa"), 0);
	for (uint32_t g = 0; g < l.ag_count; g++) {
		Etcfs__AgMap *map = NULL;
		Etcfs__AgFree *fr = NULL;

		cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_MAP, &k), 0);
		kv = get(&k);
		cr_assert_not_null(kv, "no map for group %u", g);
		cr_assert_eq(efs_meta_ag_map_decode(kv->value.data, kv->value.len, &map, &why), 0);
		cr_assert_eq(map->n_free, 1);
		cr_assert_eq(map->free[0]->start, 0);
		cr_assert_eq(map->free[0]->len, efs_layout_group_blocks(&l, g));
		cr_assert_eq(map->group_blocks, efs_layout_group_blocks(&l, g));
		if (kv->mod_revision > ag_max_mod)
			ag_max_mod = kv->mod_revision;
		efs_meta_record_free(map);
		efs_test_pb_free(kv);
		cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_FREE, &k), 0);
		kv = get(&k);
		cr_assert_not_null(kv);
		cr_assert_eq(efs_meta_ag_free_decode(kv->value.data, kv->value.len, &fr, &why), 0);
		cr_assert_eq(fr->free_blocks, efs_layout_group_blocks(&l, g));
		efs_meta_record_free(fr);
		efs_test_pb_free(kv);
	}
	cr_assert_lt(ag_max_mod, sb_mod, "groups are written before sb");

	{
		Etcfs__InoCounter *ino = NULL;
		Etcfs__RenameSeq *rs = NULL;
		Etcfs__Inode *in = NULL;
		Etcfs__Dirent *de = NULL;

		cr_assert_eq(efs_meta_key_ino_counter(&ns, &k), 0);
		kv = get(&k);
		cr_assert_not_null(kv);
		cr_assert_eq(kv->mod_revision, sb_mod, "one transaction");
		cr_assert_eq(efs_meta_ino_counter_decode(kv->value.data, kv->value.len, &ino, &why),
			     0);
		cr_assert_eq(ino->next, 3);
		efs_meta_record_free(ino);
		efs_test_pb_free(kv);

		cr_assert_eq(efs_meta_key_renameseq(&ns, &k), 0);
		kv = get(&k);
		cr_assert_not_null(kv);
		cr_assert_eq(kv->mod_revision, sb_mod);
		cr_assert_eq(efs_meta_renameseq_decode(kv->value.data, kv->value.len, &rs, &why),
			     0);
		cr_assert_eq(rs->seq, 0);
		efs_meta_record_free(rs);
		efs_test_pb_free(kv);

		cr_assert_eq(efs_meta_key_inode(&ns, 1, &k), 0);
		kv = get(&k);
		cr_assert_not_null(kv);
		cr_assert_eq(kv->mod_revision, sb_mod);
		cr_assert_eq(efs_meta_inode_decode(kv->value.data, kv->value.len, &in, &why), 0);
		cr_assert_eq(in->mode, S_IFDIR | 0755);
		cr_assert_eq(in->uid, getuid());
		cr_assert_eq(in->gid, getgid());
		cr_assert_eq(in->nlink, 3);
		cr_assert_eq(in->parent, 1);
		cr_assert_eq(in->atime_ns, sb.created_ns);
		cr_assert_eq(in->mtime_ns, sb.created_ns);
		cr_assert_eq(in->ctime_ns, sb.created_ns);
		efs_meta_record_free(in);
		efs_test_pb_free(kv);

		cr_assert_eq(efs_meta_key_inode(&ns, 2, &k), 0);
		kv = get(&k);
		cr_assert_not_null(kv);
		cr_assert_eq(efs_meta_inode_decode(kv->value.data, kv->value.len, &in, &why), 0);
		cr_assert_eq(in->mode, S_IFDIR | 0700);
		cr_assert_eq(in->uid, 0);
		cr_assert_eq(in->gid, 0);
		cr_assert_eq(in->nlink, 2);
		cr_assert_eq(in->parent, 1);
		efs_meta_record_free(in);
		efs_test_pb_free(kv);

		cr_assert_eq(efs_meta_key_dirent(&ns, 1, "lost+found", 10, &k), 0);
		kv = get(&k);
		cr_assert_not_null(kv);
		cr_assert_eq(kv->mod_revision, sb_mod);
		cr_assert_eq(efs_meta_dirent_decode(kv->value.data, kv->value.len, &de, &why), 0);
		cr_assert_eq(de->ino, 2);
		cr_assert_eq(de->type, DT_DIR);
		efs_meta_record_free(de);
		efs_test_pb_free(kv);
	}
	finish();
}

Test(mkfs, many_groups_go_in_batches_and_a_default_name)
{
	/* 1 KiB blocks on 300 MiB: 4 MiB groups, 75 of them: 150 keys, two
	 * transactions at least. */
	const char *img = image("b.img", 300 * MiB);
	struct efs_layout l;
	Etcfs__FsInfo *fi;
	char args[600];

	snprintf(args, sizeof(args), "-q --block-size 1024 %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	cr_assert_str_empty(out, "-q prints nothing: %s", out);
	cr_assert_eq(efs_layout_compute(300 * MiB, 1024, 0, &l, NULL, 0), 0);
	cr_assert_gt(2 * l.ag_count, 100);
	fi = get_fsinfo("etcfs", NULL);
	cr_assert_not_null(fi, "the default name is etcfs");
	cr_assert_eq(fi->block_size, 1024);
	cr_assert_eq(fi->ag_count, l.ag_count);
	efs_meta_record_free(fi);
	cr_assert_eq(count_keys("etcfs"), 2 * (int64_t)l.ag_count + 6);
	finish();
}

Test(mkfs, refuses_a_second_mkfs_and_force_replaces)
{
	const char *img = image("c.img", 64 * MiB), *img2 = image("c2.img", 64 * MiB);
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	Etcfs__FsInfo *fi;
	uint8_t before[EFS_SB_SIZE], after[EFS_SB_SIZE];
	char args[600];
	int64_t mod1 = 0, mod2 = 0;

	snprintf(args, sizeof(args), "--name fsc %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	fi = get_fsinfo("fsc", &mod1);
	efs_meta_record_free(fi);
	read_block0(img, before);

	/* The same device again: it holds a superblock. */
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "already holds etcfs filesystem fsc"), "%s", out);
	cr_assert(strstr(out, "--force"), "%s", out);
	/* Another device, same name: the keyspace has "sb". */
	snprintf(args, sizeof(args), "--name fsc %s", img2);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "filesystem fsc already exists in etcd"), "%s", out);
	read_block0(img2, after);
	cr_assert(all_zero(after, sizeof(after)), "nothing written to the second device");
	fi = get_fsinfo("fsc", &mod2);
	efs_meta_record_free(fi);
	cr_assert_eq(mod1, mod2, "sb untouched");
	read_block0(img, after);
	cr_assert_eq(memcmp(before, after, EFS_SB_SIZE), 0);

	/* --force: a stray key of the old filesystem disappears, new uuid. */
	cr_assert_eq(efs_meta_ns_init(&ns, "fsc"), 0);
	cr_assert_eq(efs_meta_key_orphan(&ns, 77, &k), 0);
	cr_assert_eq(efs_etcd_sync_put(s, k.buf, k.len, "", 0, 0, NULL), 0);
	snprintf(args, sizeof(args), "--force --name fsc %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	cr_assert_null(get(&k), "--force deletes the old keys");
	fi = get_fsinfo("fsc", &mod2);
	cr_assert_gt(mod2, mod1);
	read_block0(img, after);
	cr_assert_neq(memcmp(before + 16, after + 16, 16), 0, "a new uuid");
	cr_assert_eq(memcmp(fi->uuid.data, after + 16, 16), 0);
	efs_meta_record_free(fi);
	finish();
}

Test(mkfs, force_is_refused_while_a_node_is_mounted)
{
	const char *img = image("d.img", 64 * MiB), *img2 = image("d2.img", 64 * MiB);
	uint8_t before[EFS_SB_SIZE], after[EFS_SB_SIZE];
	char args[600];
	int64_t lease, mod1 = 0, mod2 = 0, keys;
	Etcfs__FsInfo *fi;

	snprintf(args, sizeof(args), "--name fsd %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	fi = get_fsinfo("fsd", &mod1);
	efs_meta_record_free(fi);
	read_block0(img, before);
	lease = put_node("fsd", "node-1");
	keys = count_keys("fsd");

	snprintf(args, sizeof(args), "--force --name fsd %s", img);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "filesystem fsd is mounted on node node-1"), "%s", out);
	/* Through another device naming the same keyspace, too. */
	snprintf(args, sizeof(args), "--force --name fsd %s", img2);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "mounted on node node-1"), "%s", out);
	/* And formatting the mounted device under another name. */
	snprintf(args, sizeof(args), "--force --name other %s", img);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "holds filesystem fsd, which is mounted on node node-1"), "%s",
		  out);
	cr_assert_eq(count_keys("other"), 0);
	cr_assert_eq(count_keys("fsd"), keys, "nothing deleted");
	fi = get_fsinfo("fsd", &mod2);
	efs_meta_record_free(fi);
	cr_assert_eq(mod1, mod2);
	read_block0(img, after);
	cr_assert_eq(memcmp(before, after, EFS_SB_SIZE), 0, "superblock untouched");

	/* status lists the node. */
	cr_assert_eq(run("etcfsctl", "status --endpoints %s %s", efs_harness_endpoints(h), img),
		     0, "%s", out);
	cr_assert(strstr(out, "node-1"), "%s", out);
	cr_assert(strstr(out, "host-of-node"), "%s", out);
	cr_assert(strstr(out, " 4242 "), "%s", out);
	cr_assert(strstr(out, "9.9.9"), "%s", out);
	cr_assert(strstr(out, "127.0.0.1:9123"), "%s", out);
	cr_assert(strstr(out, "/30s"), "lease TTL: %s", out);
	cr_assert(strstr(out, "superblock matches"), "%s", out);

	/* Once the node is gone, --force works. */
	lease_revoke(lease);
	snprintf(args, sizeof(args), "--force --name fsd %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	fi = get_fsinfo("fsd", &mod2);
	efs_meta_record_free(fi);
	cr_assert_gt(mod2, mod1);
	finish();
}

Test(mkfs, an_interrupted_mkfs_is_cleared_without_force)
{
	const char *img = image("e.img", 64 * MiB);
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	struct efs_layout l;
	char args[600];

	/* Groups of a bigger earlier attempt, no "sb". */
	cr_assert_eq(efs_meta_ns_init(&ns, "fse"), 0);
	cr_assert_eq(efs_meta_key_ag(&ns, 9999, EFS_META_K_AG_FREE, &k), 0);
	cr_assert_eq(efs_etcd_sync_put(s, k.buf, k.len, "", 0, 0, NULL), 0);
	snprintf(args, sizeof(args), "--name fse %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	cr_assert(strstr(out, "interrupted mkfs"), "%s", out);
	cr_assert_null(get(&k));
	cr_assert_eq(efs_layout_compute(64 * MiB, 4096, 0, &l, NULL, 0), 0);
	cr_assert_eq(count_keys("fse"), 2 * (int64_t)l.ag_count + 6);
	finish();
}

Test(mkfs, bad_arguments_write_nothing)
{
	const char *img = image("f.img", 64 * MiB), *small = image("small.img", 2 * MiB - 4096);
	uint8_t buf[EFS_SB_SIZE];
	char args[600];

	snprintf(args, sizeof(args), "--name fsf --block-size 3000 %s", img);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "invalid block size '3000': a power of two"), "%s", out);
	snprintf(args, sizeof(args), "--name fsf --block-size 131072 %s", img);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	snprintf(args, sizeof(args), "--name fsf %s", small);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "device too small"), "%s", out);
	snprintf(args, sizeof(args), "--name 'a/b' %s", img);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "invalid filesystem name 'a/b'"), "%s", out);
	snprintf(args, sizeof(args), "--name .. %s", img);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	snprintf(args, sizeof(args), "--name fsf --inodes 1 %s", img);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "invalid inode limit"), "%s", out);
	cr_assert_eq(mkfs("--name fsf"), 1, "%s", out);
	cr_assert(strstr(out, "missing DEVICE"), "%s", out);
	cr_assert_eq(mkfs("--name fsf /dev/null"), 1, "%s", out);
	cr_assert(strstr(out, "neither a block device nor a regular file"), "%s", out);
	snprintf(args, sizeof(args), "--name fsf %s/none.img", dir);
	cr_assert_eq(mkfs(args), 1, "%s", out);
	cr_assert(strstr(out, "No such file"), "%s", out);
	cr_assert_eq(mkfs("--bogus x"), 1, "%s", out);

	/* etcd unreachable: a bounded wait, a clear error. */
	cr_assert_eq(run("mkfs.etcfs", "--endpoints 127.0.0.1:%d --dial-timeout 1 --name fsf %s",
			 dead_port(), img),
		     1, "%s", out);
	cr_assert(strstr(out, "etcd unreachable at http://127.0.0.1:"), "%s", out);

	read_block0(img, buf);
	cr_assert(all_zero(buf, sizeof(buf)), "nothing written to the device");
	read_block0(small, buf);
	cr_assert(all_zero(buf, sizeof(buf)));
	cr_assert_eq(count_keys("fsf"), 0, "nothing written to etcd");
	cr_assert_eq(mkfs("--help"), 0, "%s", out);
	cr_assert(strstr(out, "--block-size"), "%s", out);
	cr_assert(strstr(out, "--endpoints"), "%s", out);
	finish();
}

Test(mkfs, options_from_the_config_file_and_the_environment)
{
	const char *img = image("g.img", 64 * MiB);
	char conf[512], args[1024];
	FILE *f;

	snprintf(conf, sizeof(conf), "%s/etcfs.conf", dir);
	f = fopen(conf, "w");
	cr_assert_not_null(f);
	fprintf(f, "# test\n\n  endpoints = %s  \ndial-timeout = 3s\n", efs_harness_endpoints(h));
	fclose(f);
	/* The file alone. */
	snprintf(args, sizeof(args), "ETCFS_CONFIG=%s %s/etcfsd/mkfs.etcfs -q --name fsg %s", conf,
		 getenv("ETCFS_BUILD_ROOT"), img);
	cr_assert_eq(WEXITSTATUS(system(args)), 0);
	cr_assert_gt(count_keys("fsg"), 0);
	/* The environment beats the file, the command line beats both. */
	snprintf(args, sizeof(args),
		 "ETCFS_CONFIG=%s ETCFS_ENDPOINTS=127.0.0.1:%d %s/etcfsd/etcfsctl df --name fsg "
		 "--dial-timeout 1 >/dev/null 2>&1",
		 conf, dead_port(), getenv("ETCFS_BUILD_ROOT"));
	cr_assert_eq(WEXITSTATUS(system(args)), 3, "the environment wins over the file");
	snprintf(args, sizeof(args),
		 "ETCFS_CONFIG=%s ETCFS_ENDPOINTS=127.0.0.1:%d %s/etcfsd/etcfsctl df --name fsg "
		 "--endpoints %s >/dev/null 2>&1",
		 conf, dead_port(), getenv("ETCFS_BUILD_ROOT"), efs_harness_endpoints(h));
	cr_assert_eq(WEXITSTATUS(system(args)), 0, "the command line wins");
	/* A bad file is a clear error. */
	f = fopen(conf, "w");
	cr_assert_not_null(f);
	fprintf(f, "endpoints = %s\nfrobnicate = 1\n", efs_harness_endpoints(h));
	fclose(f);
	snprintf(args, sizeof(args), "ETCFS_CONFIG=%s", conf);
	cr_assert_eq(putenv(args), 0);
	cr_assert_eq(run("etcfsctl", "df --name fsg"), 2, "%s", out);
	cr_assert(strstr(out, "etcfs.conf:2: unknown key 'frobnicate'"), "%s", out);
	cr_assert_eq(run("mkfs.etcfs", "--name fsg2 %s", img), 1, "%s", out);
	cr_assert(strstr(out, "unknown key"), "%s", out);
	unsetenv("ETCFS_CONFIG");
	finish();
}

/*
 * etcfsctl locks marks a recall UNANSWERED past the same bound as the
 * daemons': 30 s, or --recall-bound SECONDS as given to them. Negative
 * control: with the bound fixed at 30 s, a recall queued 5 s ago is never
 * marked.
 */
Test(etcfsctl, locks_marks_a_recall_unanswered_past_the_recall_bound)
{
	const char *img = image("r.img", 256 * MiB);
	Etcfs__LockHolder lh = ETCFS__LOCK_HOLDER__INIT;
	Etcfs__LockWaiter lw = ETCFS__LOCK_WAITER__INIT;
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	ProtobufCBinaryData v;
	struct timespec now;
	char args[600];

	snprintf(args, sizeof(args), "--name fsr %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	cr_assert_eq(efs_meta_ns_init(&ns, "fsr"), 0);
	cr_assert_eq(clock_gettime(CLOCK_REALTIME, &now), 0);
	/* node-a holds inode 5 exclusively; node-b has waited for it 5 s. */
	lh.node = (char *)"node-a";
	lh.mode = EFS_META_LOCK_EXCLUSIVE;
	lh.granted_ns = ((int64_t)now.tv_sec - 60) * 1000000000 + now.tv_nsec;
	cr_assert_eq(efs_meta_key_holder(&ns, 5, EFS_META_LOCK_EXCLUSIVE, "node-a", &k), 0);
	cr_assert_eq(efs_meta_pack(&lh.base, &v), 0);
	cr_assert_eq(efs_etcd_sync_put(s, k.buf, k.len, v.data, v.len, 0, NULL), 0);
	efs_mem_free(v.data);
	lw.node = (char *)"node-b";
	lw.mode = EFS_META_LOCK_EXCLUSIVE;
	lw.since_ns = ((int64_t)now.tv_sec - 5) * 1000000000 + now.tv_nsec;
	cr_assert_eq(efs_meta_key_recall(&ns, 5, 1, "node-b", &k), 0);
	cr_assert_eq(efs_meta_pack(&lw.base, &v), 0);
	cr_assert_eq(efs_etcd_sync_put(s, k.buf, k.len, v.data, v.len, 0, NULL), 0);
	efs_mem_free(v.data);

	cr_assert_eq(run("etcfsctl", "locks --endpoints %s --name fsr", efs_harness_endpoints(h)),
		     0, "%s", out);
	cr_assert_null(strstr(out, "UNANSWERED"), "%s", out);
	cr_assert_eq(run("etcfsctl", "locks --endpoints %s --name fsr --recall-bound 2",
			 efs_harness_endpoints(h)),
		     1, "%s", out);
	cr_assert_not_null(strstr(out, "UNANSWERED"), "%s", out);
	cr_assert_eq(run("etcfsctl", "locks --json --endpoints %s --name fsr --recall-bound 2",
			 efs_harness_endpoints(h)),
		     1, "%s", out);
	cr_assert_not_null(strstr(out, "\"unanswered_after_s\":2"), "%s", out);
	cr_assert_eq(run("etcfsctl", "locks --endpoints %s --name fsr --recall-bound 0",
			 efs_harness_endpoints(h)),
		     2, "%s", out);
	cr_assert_eq(run("etcfsctl", "df --endpoints %s --name fsr --recall-bound 2",
			 efs_harness_endpoints(h)),
		     2, "%s", out);
	finish();
}

Test(etcfsctl, df_and_status)
{
	const char *img = image("h.img", 256 * MiB);
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	Etcfs__AgFree fr = ETCFS__AG_FREE__INIT;
	ProtobufCBinaryData v;
	struct efs_layout l;
	unsigned long long blocks, used, free_, inodes, iused, ifree;
	char args[600], name[32], uuid[37];
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb sb;
	const char *p;

	snprintf(args, sizeof(args), "--name fsh %s", img);
	cr_assert_eq(mkfs(args), 0, "%s", out);
	cr_assert_eq(efs_layout_compute(256 * MiB, 4096, 0, &l, NULL, 0), 0);

	/* Group 0 has 100 blocks in use. */
	cr_assert_eq(efs_meta_ns_init(&ns, "fsh"), 0);
	cr_assert_eq(efs_meta_key_ag(&ns, 0, EFS_META_K_AG_FREE, &k), 0);
	fr.free_blocks = efs_layout_group_blocks(&l, 0) - 100;
	cr_assert_eq(efs_meta_pack(&fr.base, &v), 0);
	cr_assert_eq(efs_etcd_sync_put(s, k.buf, k.len, v.data, v.len, 0, NULL), 0);
	efs_mem_free(v.data);

	cr_assert_eq(run("etcfsctl", "df --endpoints %s %s", efs_harness_endpoints(h), img), 0,
		     "%s", out);
	p = strchr(out, '\n');
	cr_assert_not_null(p, "%s", out);
	cr_assert(strstr(out, "Blocks") && strstr(out, "IFree"), "%s", out);
	cr_assert_eq(sscanf(p + 1, "%31s %*u %llu %llu %llu %*u%% %llu %llu %llu", name, &blocks,
			    &used, &free_, &inodes, &iused, &ifree),
		     7, "%s", out);
	cr_assert_str_eq(name, "fsh");
	cr_assert_eq(blocks, l.data_blocks);
	cr_assert_eq(used, 100);
	cr_assert_eq(free_, l.data_blocks - 100);
	cr_assert_eq(inodes, l.inode_limit);
	cr_assert_eq(iused, 2, "root and lost+found");
	cr_assert_eq(ifree, l.inode_limit - 2);

	cr_assert_eq(run("etcfsctl", "df -h --endpoints %s --name fsh", efs_harness_endpoints(h)),
		     0, "%s", out);
	cr_assert(strstr(out, " 255M "), "size in MiB: %s", out);
	cr_assert(strstr(out, " 400K "), "100 blocks used: %s", out);

	cr_assert_eq(run("etcfsctl", "df --endpoints %s --name nosuch", efs_harness_endpoints(h)),
		     4, "%s", out);
	cr_assert(strstr(out, "no filesystem nosuch"), "%s", out);
	cr_assert_eq(run("etcfsctl", "df --endpoints %s", efs_harness_endpoints(h)), 2, "%s", out);
	cr_assert_eq(run("etcfsctl", "df --endpoints 127.0.0.1:%d --dial-timeout 1 --name fsh",
			 dead_port()),
		     3, "%s", out);
	cr_assert(strstr(out, "etcd unreachable"), "%s", out);

	/* status, by name and by device. */
	read_block0(img, buf);
	cr_assert_eq(efs_sb_decode(buf, sizeof(buf), &sb, NULL, NULL, 0), 0);
	efs_sb_uuid_format(sb.uuid, uuid);
	cr_assert_eq(run("etcfsctl", "status --endpoints %s --name fsh", efs_harness_endpoints(h)),
		     0, "%s", out);
	cr_assert(strstr(out, "filesystem: fsh"), "%s", out);
	cr_assert(strstr(out, uuid), "%s", out);
	cr_assert_eq(strtoull(field("inode limit:"), NULL, 10), l.inode_limit, "%s", out);
	cr_assert_eq(strtoul(field("groups:"), NULL, 10), l.ag_count, "%s", out);
	cr_assert(strstr(out, "no node"), "%s", out);
	cr_assert_eq(run("etcfsctl", "status --endpoints %s %s", efs_harness_endpoints(h), img),
		     0, "%s", out);
	cr_assert(strstr(out, "superblock matches"), "%s", out);

	/* A device whose keyspace was formatted again from another device. */
	{
		const char *img2 = image("h2.img", 64 * MiB);
		int fd;

		snprintf(args, sizeof(args), "-q --force --name fsh %s", img2);
		cr_assert_eq(mkfs(args), 0, "%s", out);
		cr_assert_eq(run("etcfsctl", "status --endpoints %s %s", efs_harness_endpoints(h),
				 img),
			     4, "%s", out);
		cr_assert(strstr(out, "another filesystem"), "%s", out);
		/* A flipped bit in the superblock. */
		buf[200] ^= 1;
		fd = open(img2, O_WRONLY | O_CLOEXEC);
		cr_assert_geq(fd, 0);
		cr_assert_eq(pwrite(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
		close(fd);
		cr_assert_eq(run("etcfsctl", "df --endpoints %s %s", efs_harness_endpoints(h),
				 img2),
			     4, "%s", out);
		cr_assert(strstr(out, "checksum mismatch"), "%s", out);
		/* mkfs wants --force for a damaged superblock too. */
		snprintf(args, sizeof(args), "--name fsh2 %s", img2);
		cr_assert_eq(mkfs(args), 1, "%s", out);
		cr_assert(strstr(out, "damaged or unsupported"), "%s", out);
		snprintf(args, sizeof(args), "--force -q --name fsh2 %s", img2);
		cr_assert_eq(mkfs(args), 0, "%s", out);
	}

	/* A device whose keyspace is gone. */
	cr_assert_eq(efs_etcd_sync_delete(s, ns.prefix, ns.len, true, NULL), 0);
	cr_assert_eq(run("etcfsctl", "status --endpoints %s %s", efs_harness_endpoints(h), img),
		     4, "%s", out);
	cr_assert(strstr(out, "no \"sb\" record"), "%s", out);
	finish();
}

/* ---- TLS and auth, through the shared options ---- */

static void setup_secure(void)
{
	struct efs_harness_opts o = {
		.tls = true, .client_cert_auth = true, .auth = true, .user = "etcfs"};

	cr_assert_eq(efs_harness_start(&h, &o), 0, "cannot start etcd");
	snprintf(dir, sizeof(dir), "/dev/shm/etcfs-test-mkfs-%d", (int)getpid());
	cr_assert_eq(mkdir(dir, 0700), 0, "%s: %s", dir, strerror(errno));
}

TestSuite(secure, .init = setup_secure, .fini = teardown, .timeout = 120);

Test(secure, tls_client_cert_and_password_auth)
{
	const char *img = image("s.img", 64 * MiB);
	char tls[1536];

	snprintf(tls, sizeof(tls), "--endpoints %s --cacert %s --cert %s --key %s",
		 efs_harness_endpoints(h), efs_harness_cacert(h), efs_harness_client_cert(h),
		 efs_harness_client_key(h));
	/* A wrong password: refused, nothing written. */
	cr_assert_eq(run("mkfs.etcfs", "%s --user %s:wrong --name fss %s", tls, efs_harness_user(h),
			 img),
		     1, "%s", out);
	cr_assert(strstr(out, "refused our credentials"), "%s", out);
	/* The password from ETCFS_PASSWORD. */
	cr_assert_eq(setenv("ETCFS_PASSWORD", efs_harness_user_password(h), 1), 0);
	cr_assert_eq(run("mkfs.etcfs", "%s --user %s --name fss %s", tls, efs_harness_user(h), img),
		     0, "%s", out);
	cr_assert(strstr(out, "https://"), "%s", out);
	/* host:port endpoints become https:// with TLS options. */
	snprintf(tls, sizeof(tls), "--endpoints %s --cacert %s --cert %s --key %s",
		 efs_harness_member_hostport(h, 0), efs_harness_cacert(h),
		 efs_harness_client_cert(h), efs_harness_client_key(h));
	cr_assert_eq(run("etcfsctl", "df %s --user %s %s", tls, efs_harness_user(h), img), 0, "%s",
		     out);
	cr_assert(strstr(out, "fss "), "%s", out);
	unsetenv("ETCFS_PASSWORD");
	cr_assert_eq(run("etcfsctl", "status %s --user %s %s", tls, efs_harness_user(h), img), 2,
		     "%s", out);
	cr_assert(strstr(out, "needs a password"), "%s", out);
	/* --cert without --key. */
	cr_assert_eq(run("mkfs.etcfs", "--endpoints %s --cert %s %s", efs_harness_endpoints(h),
			 efs_harness_client_cert(h), img),
		     1, "%s", out);
	cr_assert(strstr(out, "--cert and --key go together"), "%s", out);
	finish();
}
