/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mkfs.etcfs: formats a device and initialises its etcd keyspace, in the
 * order docs/FORMAT.md section 4 prescribes so that an interrupted mkfs is
 * never mountable: allocation groups first, then one transaction that
 * creates the counters, the root, lost+found and "sb" only while "sb" is
 * absent, then the device superblock and fdatasync.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "etcd/sync.h"
#include "etcd/txn.h"
#include "meta/layout.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "meta/sb.h"
#include "progress.h"
#include "util/clock.h"
#include "util/mem.h"

static const char *prog = "mkfs.etcfs";

#define FSNAME_DEFAULT "etcfs"
/* Operations per allocation-group transaction (etcd allows 128). */
#define AG_TXN_OPS 100

enum {
	OPT_ETCD = 0x100,
	OPT_NAME,
	OPT_BLOCK_SIZE,
	OPT_INODES,
	OPT_HELP,
	OPT_VERSION,
};

struct mkfs {
	struct efs_cli_etcd etcd;
	const char *name;
	uint32_t block_size;
	uint64_t inodes;
	bool force, quiet;
	const char *path;

	struct efs_cli_device dev;
	struct efs_etcd_sync *s;
	struct efs_meta_ns ns;
	struct efs_layout l;
	uint8_t uuid[16];
	int64_t now_ns;
	char err[EFS_CLI_ERR_MAX];
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: %s [OPTIONS] DEVICE\n"
		"\n"
		"Formats DEVICE (a block device or a regular file) as an etcfs filesystem and\n"
		"initialises its metadata in etcd under /etcfs/NAME/.\n"
		"\n"
		"  --name NAME          filesystem name, [A-Za-z0-9._-]{1,64} (default %s)\n"
		"  --block-size BYTES   power of two, %u..%u (default %u)\n"
		"  --inodes N           inode limit (default one per %llu KiB of data, at\n"
		"                       least %llu)\n"
		"  -f, --force          format even if DEVICE holds an etcfs superblock or NAME\n"
		"                       exists in etcd (its keys are deleted); refused while a\n"
		"                       node has it mounted\n"
		"  -q, --quiet          print nothing but errors\n"
		"  -h, --help           this text\n"
		"  -V, --version        print the version\n"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 formatted; 1 error (nothing written unless it says so).\n",
		prog, FSNAME_DEFAULT, EFS_SB_BLOCK_MIN, EFS_SB_BLOCK_MAX, EFS_SB_BLOCK_DEFAULT,
		EFS_LAYOUT_BYTES_PER_INODE >> 10, EFS_LAYOUT_INODES_MIN, efs_cli_etcd_usage());
}

static int parse_u64(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	if (!s[0] || s[0] == '-' || s[0] == '+')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	if (*end == 'k' || *end == 'K') {
		if (v > UINT64_MAX / 1024)
			return -EINVAL;
		v *= 1024;
		end++;
	}
	if (*end)
		return -EINVAL;
	*ret = v;
	return 0;
}

static const char *human(uint64_t bytes, char *buf, size_t size)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	double v = (double)bytes;
	unsigned u = 0;

	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, size, "%" PRIu64 " B", bytes);
	else
		snprintf(buf, size, "%.1f %s", v, units[u]);
	return buf;
}

static int make_uuid(uint8_t uuid[16])
{
	size_t got = 0;

	while (got < 16) {
		ssize_t n = getrandom(uuid + got, 16 - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		got += (size_t)n;
	}
	uuid[6] = (uint8_t)((uuid[6] & 0x0f) | 0x40); /* version 4 */
	uuid[8] = (uint8_t)((uuid[8] & 0x3f) | 0x80); /* RFC 4122 variant */
	return 0;
}

/* Packs |msg| and adds a put of |key| to |t|'s success branch. */
static int txn_put_msg(struct efs_etcd_txn *t, const struct efs_meta_key *key,
		       const ProtobufCMessage *msg)
{
	ProtobufCBinaryData v;
	int r;

	r = efs_meta_pack(msg, &v);
	if (r < 0)
		return r;
	r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key->buf, key->len, v.data, v.len, 0);
	efs_mem_free(v.data);
	return r;
}

/* Guards: "sb" absent (create revision 0) and no n/ key (a range compare
 * on an empty range compares against a zero key: true). */
static int txn_guard(struct mkfs *m, struct efs_etcd_txn *t)
{
	struct efs_meta_key sb;
	struct efs_meta_range nodes;
	struct efs_etcd_cmp c = {
		.target = EFS_ETCD_CMP_CREATE,
		.result = EFS_ETCD_CMP_EQUAL,
	};
	int r;

	r = efs_meta_key_sb(&m->ns, &sb);
	if (r == 0)
		r = efs_meta_range_family(&m->ns, EFS_META_K_NODE, &nodes);
	if (r < 0)
		return r;
	r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL, sb.buf, sb.len, 0);
	if (r < 0)
		return r;
	c.key = nodes.key.buf;
	c.key_len = nodes.key.len;
	c.range_end = nodes.end.buf;
	c.range_end_len = nodes.end.len;
	return efs_etcd_txn_compare_ex(t, &c);
}

/* Runs |t|; a failed compare is -EEXIST ("sb" appeared or a node mounted
 * meanwhile). */
static int txn_run(struct mkfs *m, struct efs_etcd_txn *t, const char *what)
{
	Etcdserverpb__TxnResponse *resp = NULL;
	int r;

	r = efs_etcd_sync_txn(m->s, efs_etcd_txn_request(t), &resp);
	if (r < 0) {
		const char *msg = efs_etcd_sync_last_message(m->s);

		snprintf(m->err, sizeof(m->err), "%s: etcd transaction failed: %s", what,
			 msg && msg[0] ? msg : strerror(-r));
		return r;
	}
	if (!resp->succeeded) {
		snprintf(m->err, sizeof(m->err),
			 "%s: filesystem %s was formatted or mounted by someone else meanwhile",
			 what, m->name);
		r = -EEXIST;
	}
	protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	return r;
}

/* Refuses a device that already holds an etcfs superblock (unless
 * --force), and one whose filesystem is mounted in any case. */
static int check_device(struct mkfs *m)
{
	struct efs_sb old;
	char why[EFS_CLI_ERR_MAX / 2], uuid[37];
	int r;

	r = efs_cli_read_sb(&m->dev, &old, NULL, why, sizeof(why));
	if (r == -ENODATA)
		return 0;
	if (r < 0 && r != -EUCLEAN && r != -EPROTONOSUPPORT) {
		snprintf(m->err, sizeof(m->err), "%s", why);
		return r;
	}
	if (r < 0) {
		if (m->force)
			return 0;
		snprintf(m->err, sizeof(m->err),
			 "%s (a damaged or unsupported etcfs superblock); use --force to format it "
			 "anyway",
			 why);
		return -EEXIST;
	}
	efs_sb_uuid_format(old.uuid, uuid);
	if (!m->force) {
		snprintf(m->err, sizeof(m->err),
			 "%s already holds etcfs filesystem %s (uuid %s); use --force to format it "
			 "anyway",
			 m->path, old.name, uuid);
		return -EEXIST;
	}
	if (strcmp(old.name, m->name)) {
		/* Another filesystem's device: its nodes must be gone too. */
		struct efs_meta_ns ns;
		char node[EFS_META_NODE_MAX + 1];
		int64_t n;

		if (efs_meta_ns_init(&ns, old.name) < 0)
			return 0;
		r = efs_cli_mounted_nodes(m->s, &ns, &n, node, m->err, sizeof(m->err));
		if (r < 0)
			return r;
		if (n > 0) {
			snprintf(m->err, sizeof(m->err),
				 "%s holds filesystem %s, which is mounted on node %s%s; unmount "
				 "it first",
				 m->path, old.name, node, n > 1 ? " and others" : "");
			return -EBUSY;
		}
	}
	return 0;
}

/* Refuses a keyspace with "sb" (unless --force) or with nodes; clears a
 * forced or half-made one. */
static int check_keyspace(struct mkfs *m)
{
	struct efs_meta_key sb;
	struct efs_meta_range all;
	Mvccpb__KeyValue *kv = NULL;
	char node[EFS_META_NODE_MAX + 1];
	int64_t nodes, keys, sb_mod = 0;
	struct efs_etcd_txn *t = NULL;
	int r;

	r = efs_cli_mounted_nodes(m->s, &m->ns, &nodes, node, m->err, sizeof(m->err));
	if (r < 0)
		return r;
	if (nodes > 0) {
		snprintf(m->err, sizeof(m->err),
			 "filesystem %s is mounted on node %s%s; unmount it first", m->name, node,
			 nodes > 1 ? " and others" : "");
		return -EBUSY;
	}
	r = efs_meta_key_sb(&m->ns, &sb);
	if (r < 0)
		return r;
	r = efs_etcd_sync_get(m->s, sb.buf, sb.len, &kv, NULL);
	if (r == 0) {
		Etcfs__FsInfo *fi = NULL;
		char uuid[37] = "?";

		sb_mod = kv->mod_revision;
		if (efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &fi, NULL) == 0 &&
		    fi->uuid.len == 16)
			efs_sb_uuid_format(fi->uuid.data, uuid);
		efs_meta_record_free(fi);
		protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
		if (!m->force) {
			snprintf(m->err, sizeof(m->err),
				 "filesystem %s already exists in etcd (uuid %s); use --force to "
				 "replace it",
				 m->name, uuid);
			return -EEXIST;
		}
	} else if (r != -ENOENT) {
		const char *msg = efs_etcd_sync_last_message(m->s);

		snprintf(m->err, sizeof(m->err), "cannot read filesystem %s from etcd: %s",
			 m->name, msg && msg[0] ? msg : strerror(-r));
		return r;
	}
	r = efs_meta_range_fs(&m->ns, &all);
	if (r < 0)
		return r;
	r = efs_cli_range_count(m->s, &all, &keys, m->err, sizeof(m->err));
	if (r < 0 || keys == 0)
		return r;
	if (!m->quiet)
		printf("%s: deleting %" PRId64 " keys under /etcfs/%s/ (%s)\n", prog, keys,
		       m->name, sb_mod ? "--force" : "no \"sb\": an interrupted mkfs");
	/* Delete only if "sb" is as we saw it and still nobody is mounted. */
	r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		return r;
	r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, sb.buf, sb.len, sb_mod);
	if (r == 0) {
		struct efs_meta_range nr;
		struct efs_etcd_cmp c = {.target = EFS_ETCD_CMP_CREATE,
					 .result = EFS_ETCD_CMP_EQUAL};

		r = efs_meta_range_family(&m->ns, EFS_META_K_NODE, &nr);
		c.key = nr.key.buf;
		c.key_len = nr.key.len;
		c.range_end = nr.end.buf;
		c.range_end_len = nr.end.len;
		if (r == 0)
			r = efs_etcd_txn_compare_ex(t, &c);
	}
	if (r == 0)
		r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, all.key.buf, all.key.len,
					all.end.buf, all.end.len, false);
	if (r == 0)
		r = txn_run(m, t, "clearing the old keys");
	efs_etcd_txn_free(t);
	return r;
}

/* Step 1: every group's map and free count, AG_TXN_OPS keys a txn. */
static int write_groups(struct mkfs *m)
{
	struct efs_etcd_txn *t = NULL;
	unsigned ops = 0;
	uint32_t done = 0;
	char sum[64];
	int r = 0;

	progress_start("mkfs: allocation groups", m->l.ag_count);
	for (uint32_t g = 0; g < m->l.ag_count; g++) {
		struct efs_layout_agmap map;
		Etcfs__AgFree fr;
		struct efs_meta_key kmap, kfree;

		if (!t) {
			r = efs_etcd_txn_new(&t, 0);
			if (r == 0)
				r = txn_guard(m, t);
			if (r < 0)
				break;
		}
		efs_layout_ag_map(&m->l, g, &map);
		efs_layout_ag_free(&m->l, g, &fr);
		r = efs_meta_key_ag(&m->ns, g, EFS_META_K_AG_MAP, &kmap);
		if (r == 0)
			r = efs_meta_key_ag(&m->ns, g, EFS_META_K_AG_FREE, &kfree);
		if (r == 0)
			r = txn_put_msg(t, &kmap, &map.map.base);
		if (r == 0)
			r = txn_put_msg(t, &kfree, &fr.base);
		if (r < 0)
			break;
		ops += 2;
		if (ops + 2 > AG_TXN_OPS || g + 1 == m->l.ag_count) {
			r = txn_run(m, t, "writing the allocation groups");
			t = efs_etcd_txn_free(t);
			ops = 0;
			if (r < 0)
				break;
			progress_add(g + 1 - done);
			done = g + 1;
		}
	}
	snprintf(sum, sizeof(sum), "%" PRIu32 " of %" PRIu32 " written", done, m->l.ag_count);
	progress_done(sum);
	efs_etcd_txn_free(t);
	if (r < 0 && !m->err[0])
		snprintf(m->err, sizeof(m->err), "writing the allocation groups: %s", strerror(-r));
	return r;
}

/* Steps 2 and 3: counters, root, lost+found and "sb", atomically. */
static int write_root(struct mkfs *m)
{
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key k;
	Etcfs__InoCounter ino = ETCFS__INO_COUNTER__INIT;
	Etcfs__RenameSeq rs = ETCFS__RENAME_SEQ__INIT;
	Etcfs__Inode root, lf;
	Etcfs__Dirent de;
	Etcfs__FsInfo fi;
	const char *why = NULL;
	int r;

	ino.next = EFS_LAYOUT_NEXT_INO;
	rs.seq = 0;
	efs_layout_root_inode((uint32_t)getuid(), (uint32_t)getgid(), m->now_ns, &root);
	efs_layout_lost_found_inode(m->now_ns, &lf);
	efs_layout_lost_found_dirent(&de);
	efs_layout_fsinfo(&m->l, m->uuid, m->name, m->now_ns, &fi);
	if (efs_meta_inode_check(&root, &why) < 0 || efs_meta_inode_check(&lf, &why) < 0 ||
	    efs_meta_dirent_check(&de, &why) < 0 || efs_meta_fsinfo_check(&fi, &why) < 0) {
		snprintf(m->err, sizeof(m->err), "internal error: an initial record is invalid: %s",
			 why ? why : "?");
		return -EUCLEAN;
	}
	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = txn_guard(m, t);
	if (r == 0)
		r = efs_meta_key_ino_counter(&m->ns, &k);
	if (r == 0)
		r = txn_put_msg(t, &k, &ino.base);
	if (r == 0)
		r = efs_meta_key_renameseq(&m->ns, &k);
	if (r == 0)
		r = txn_put_msg(t, &k, &rs.base);
	if (r == 0)
		r = efs_meta_key_inode(&m->ns, EFS_LAYOUT_ROOT_INO, &k);
	if (r == 0)
		r = txn_put_msg(t, &k, &root.base);
	if (r == 0)
		r = efs_meta_key_dirent(&m->ns, EFS_LAYOUT_ROOT_INO, EFS_LAYOUT_LOST_FOUND,
					strlen(EFS_LAYOUT_LOST_FOUND), &k);
	if (r == 0)
		r = txn_put_msg(t, &k, &de.base);
	if (r == 0)
		r = efs_meta_key_inode(&m->ns, EFS_LAYOUT_LOST_FOUND_INO, &k);
	if (r == 0)
		r = txn_put_msg(t, &k, &lf.base);
	if (r == 0)
		r = efs_meta_key_sb(&m->ns, &k);
	if (r == 0)
		r = txn_put_msg(t, &k, &fi.base);
	if (r == 0)
		r = txn_run(m, t, "creating the root");
	else
		snprintf(m->err, sizeof(m->err), "creating the root: %s", strerror(-r));
	efs_etcd_txn_free(t);
	return r;
}

/* Step 4: the superblock, made durable. */
static int write_sb(struct mkfs *m)
{
	struct efs_sb sb;
	char reason[EFS_SB_REASON_MAX];
	uint8_t *buf;
	size_t done = 0;
	int r;

	r = efs_layout_sb(&m->l, m->uuid, m->name, m->now_ns, &sb);
	if (r < 0)
		return r;
	buf = efs_mem_calloc(1, EFS_SB_SIZE);
	if (!buf)
		return -ENOMEM;
	r = efs_sb_encode(&sb, buf, reason, sizeof(reason));
	if (r < 0) {
		snprintf(m->err, sizeof(m->err), "internal error: superblock: %s", reason);
		goto out;
	}
	while (done < EFS_SB_SIZE) {
		ssize_t n = pwrite(m->dev.fd, buf + done, EFS_SB_SIZE - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			snprintf(m->err, sizeof(m->err), "%s: writing the superblock: %s", m->path,
				 strerror(-r));
			goto out;
		}
		done += (size_t)n;
	}
	if (fdatasync(m->dev.fd) < 0) {
		r = -errno;
		snprintf(m->err, sizeof(m->err), "%s: fdatasync: %s", m->path, strerror(-r));
	}
out:
	efs_mem_free(buf);
	return r;
}

static void print_summary(const struct mkfs *m)
{
	char uuid[37], h1[32], h2[32], h3[32];

	efs_sb_uuid_format(m->uuid, uuid);
	printf("%s: formatted %s\n"
	       "  uuid:       %s\n"
	       "  name:       %s (etcd keys under /etcfs/%s/)\n"
	       "  block size: %u\n"
	       "  size:       %" PRIu64 " bytes (%s); data area %" PRIu64 " blocks (%s) from "
	       "block %" PRIu64 "\n"
	       "  groups:     %" PRIu32 " of %" PRIu64 " blocks (%s)\n"
	       "  inodes:     %" PRIu64 "\n"
	       "  etcd:       %s\n",
	       prog, m->path, uuid, m->name, m->name, m->l.block_size, m->l.device_size,
	       human(m->l.device_size, h1, sizeof(h1)), m->l.data_blocks,
	       human(m->l.data_blocks * m->l.block_size, h2, sizeof(h2)), m->l.data_start,
	       m->l.ag_count, m->l.ag_blocks,
	       human(m->l.ag_blocks * m->l.block_size, h3, sizeof(h3)),
	       m->l.inode_limit, m->etcd.endpoints);
}

static int parse_args(struct mkfs *m, int argc, char **argv)
{
	static const struct option longopts[] = {
		EFS_CLI_ETCD_LONGOPTS(OPT_ETCD),
		{"name", required_argument, NULL, OPT_NAME},
		{"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
		{"inodes", required_argument, NULL, OPT_INODES},
		{"force", no_argument, NULL, 'f'},
		{"quiet", no_argument, NULL, 'q'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	uint64_t v;
	int opt, idx, r;

	for (;;) {
		idx = 0;
		opt = getopt_long(argc, argv, "fqhV", longopts, &idx);
		if (opt == -1)
			break;
		switch (opt) {
		case OPT_ETCD:
			r = efs_cli_etcd_option(&m->etcd, longopts[idx].name, optarg, m->err,
						sizeof(m->err));
			if (r < 0)
				return r;
			break;
		case OPT_NAME:
			if (!efs_meta_fsname_is_valid(optarg)) {
				snprintf(m->err, sizeof(m->err),
					 "invalid filesystem name '%s': 1 to %d characters of "
					 "[A-Za-z0-9._-], not '.' or '..'",
					 optarg, EFS_META_FSNAME_MAX);
				return -EINVAL;
			}
			m->name = optarg;
			break;
		case OPT_BLOCK_SIZE:
			if (parse_u64(optarg, &v) < 0 || v > UINT32_MAX || !v || (v & (v - 1)) ||
			    v < EFS_SB_BLOCK_MIN || v > EFS_SB_BLOCK_MAX) {
				snprintf(m->err, sizeof(m->err),
					 "invalid block size '%s': a power of two from %u to %u",
					 optarg, EFS_SB_BLOCK_MIN, EFS_SB_BLOCK_MAX);
				return -EINVAL;
			}
			m->block_size = (uint32_t)v;
			break;
		case OPT_INODES:
			if (parse_u64(optarg, &v) < 0 || v < 2 || v > EFS_LAYOUT_INODES_MAX) {
				snprintf(m->err, sizeof(m->err),
					 "invalid inode limit '%s': a number from 2 to %llu",
					 optarg, (unsigned long long)EFS_LAYOUT_INODES_MAX);
				return -EINVAL;
			}
			m->inodes = v;
			break;
		case 'f':
			m->force = true;
			break;
		case 'q':
			m->quiet = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("%s %s\n", prog, ETCFS_VERSION);
			exit(0);
		default:
			snprintf(m->err, sizeof(m->err), "try '%s --help'", prog);
			return -EINVAL;
		}
	}
	if (optind + 1 != argc) {
		snprintf(m->err, sizeof(m->err), "%s; try '%s --help'",
			 optind >= argc ? "missing DEVICE" : "too many arguments", prog);
		return -EINVAL;
	}
	m->path = argv[optind];
	return efs_cli_etcd_finish(&m->etcd, m->err, sizeof(m->err));
}

int main(int argc, char **argv)
{
	struct mkfs m = {
		.name = FSNAME_DEFAULT,
		.block_size = EFS_SB_BLOCK_DEFAULT,
		.dev = {.fd = -1},
	};
	char reason[EFS_LAYOUT_REASON_MAX];
	int r;

	r = efs_cli_etcd_defaults(&m.etcd, m.err, sizeof(m.err));
	if (r == 0)
		r = parse_args(&m, argc, argv);
	if (r < 0)
		goto out;
	r = efs_meta_ns_init(&m.ns, m.name);
	if (r < 0)
		goto out;
	r = efs_cli_device_open(m.path, true, &m.dev, m.err, sizeof(m.err));
	if (r < 0)
		goto out;
	r = efs_layout_compute(m.dev.size, m.block_size, m.inodes, &m.l, reason, sizeof(reason));
	if (r < 0) {
		snprintf(m.err, sizeof(m.err), "%s: %s", m.path, reason);
		goto out;
	}
	r = make_uuid(m.uuid);
	if (r < 0) {
		snprintf(m.err, sizeof(m.err), "cannot make a UUID: %s", strerror(-r));
		goto out;
	}
	m.now_ns = (int64_t)efs_clock_real_ns();
	r = efs_cli_etcd_connect(&m.etcd, &m.s, m.err, sizeof(m.err));
	if (r < 0)
		goto out;
	r = check_device(&m);
	if (r == 0)
		r = check_keyspace(&m);
	if (r == 0)
		r = write_groups(&m);
	if (r == 0)
		r = write_root(&m);
	if (r == 0)
		r = write_sb(&m);
	if (r == 0 && !m.quiet)
		print_summary(&m);
out:
	if (r < 0)
		efs_cli_print_err(prog, r, m.err);
	efs_etcd_sync_close(m.s);
	efs_cli_device_close(&m.dev);
	efs_cli_etcd_free(&m.etcd);
	return r < 0 ? 1 : 0;
}
