/* SPDX-License-Identifier: Apache-2.0 */
#include "meta/records.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>

#include "meta/keys.h"
#include "util/mem.h"

int efs_meta_pack(const ProtobufCMessage *msg, ProtobufCBinaryData *ret)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf = efs_mem_malloc(len ? len : 1);

	if (!buf)
		return -ENOMEM;
	protobuf_c_message_pack(msg, buf);
	ret->data = buf;
	ret->len = len;
	return 0;
}

int efs_meta_txn_put(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
		     const struct efs_meta_key *k, const ProtobufCMessage *msg, int64_t lease)
{
	ProtobufCBinaryData b;
	int r = efs_meta_pack(msg, &b);

	if (r < 0)
		return r;
	r = efs_etcd_txn_put(t, branch, k->buf, k->len, b.data, b.len, lease);
	efs_mem_free(b.data);
	return r;
}

void efs_meta_record_free(void *msg)
{
	if (msg)
		protobuf_c_message_free_unpacked(msg, efs_mem_protobuf());
}

/*
 * protobuf-c's unpack returns NULL both for bad bytes and for a failed
 * allocation; this allocator remembers the latter, so that a decoder can
 * answer -ENOMEM rather than call good data corrupt.
 */
struct track {
	bool failed;
};

static void *track_alloc(void *data, size_t size)
{
	struct track *t = data;
	void *p = efs_mem_malloc(size);

	if (!p)
		t->failed = true;
	return p;
}

static void track_free(void *data, void *p)
{
	efs_mem_free(p);
}

typedef int (*check_fn)(const void *msg, const char **reason);

static int decode(const ProtobufCMessageDescriptor *desc, check_fn check, const uint8_t *buf,
		  size_t len, void **ret, const char **reason)
{
	struct track t = {false};
	ProtobufCAllocator alloc = {track_alloc, track_free, &t};
	ProtobufCMessage *m;
	const char *why = NULL;
	int r;

	m = protobuf_c_message_unpack(desc, &alloc, len, buf);
	if (!m) {
		if (t.failed) {
			why = "out of memory";
			r = -ENOMEM;
		} else {
			why = "not a valid protobuf message";
			r = -EBADMSG;
		}
		goto out;
	}
	r = check ? check(m, &why) : 0;
	if (r < 0) {
		protobuf_c_message_free_unpacked(m, &alloc);
		goto out;
	}
	*ret = m;
out:
	if (reason)
		*reason = why;
	return r;
}

static int bad(const char **reason, const char *why)
{
	*reason = why;
	return -EUCLEAN;
}

static bool is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

/* A string field that must be a valid node id. */
static bool node_ok(const char *s)
{
	return efs_meta_node_is_valid(s);
}

/* ---- Checks ---- */

int efs_meta_fsinfo_check(const Etcfs__FsInfo *fi, const char **reason)
{
	static const uint8_t zero[16];
	uint64_t blocks, data;

	if (fi->uuid.len != 16)
		return bad(reason, "fs info: uuid is not 16 bytes");
	if (memcmp(fi->uuid.data, zero, 16) == 0)
		return bad(reason, "fs info: uuid is all zeroes");
	if (!efs_meta_fsname_is_valid(fi->name))
		return bad(reason, "fs info: invalid filesystem name");
	if (!is_pow2(fi->block_size) || fi->block_size < 1024 || fi->block_size > 65536)
		return bad(reason, "fs info: block size is not a power of two in 1024..65536");
	if (fi->format_version == 0)
		return bad(reason, "fs info: format version 0");
	if (fi->data_start == 0)
		return bad(reason, "fs info: data area starts at block 0 (the superblock)");
	blocks = fi->device_size / fi->block_size;
	if (blocks <= fi->data_start)
		return bad(reason, "fs info: device smaller than its reserved area");
	if (fi->inode_limit == 0)
		return bad(reason, "fs info: inode limit 0");
	if (fi->ag_blocks == 0 || fi->ag_count == 0)
		return bad(reason, "fs info: no allocation groups");
	data = blocks - fi->data_start;
	/* Every group but the last is full: ag_count == ceil(data / ag_blocks). */
	if ((data - 1) / fi->ag_blocks + 1 != fi->ag_count)
		return bad(reason, "fs info: allocation groups do not match the data area");
	return 0;
}

int efs_meta_inode_check(const Etcfs__Inode *in, const char **reason)
{
	uint32_t type = in->mode & S_IFMT;
	bool dir = type == S_IFDIR;

	if (efs_meta_dt_from_mode(in->mode) == DT_UNKNOWN)
		return bad(reason, "inode: mode has no valid file type");
	if (in->mode & ~(uint32_t)(S_IFMT | 07777))
		return bad(reason, "inode: unknown mode bits");
	if (in->nlink > EFS_META_LINK_MAX)
		return bad(reason, "inode: link count beyond the maximum");
	if (dir && in->nlink == 1)
		return bad(reason, "inode: directory with one link");
	if (dir && in->parent == 0)
		return bad(reason, "inode: directory without a parent");
	if (!dir && in->parent != 0)
		return bad(reason, "inode: parent set on a non-directory");
	if (type == S_IFLNK) {
		if (in->symlink.len == 0 || in->symlink.len > EFS_META_SYMLINK_MAX)
			return bad(reason, "inode: symlink target empty or too long");
		if (memchr(in->symlink.data, '\0', in->symlink.len))
			return bad(reason, "inode: symlink target holds a NUL");
		if (in->size != in->symlink.len)
			return bad(reason, "inode: symlink size differs from its target");
	} else if (in->symlink.len != 0) {
		return bad(reason, "inode: symlink target on a non-symlink");
	}
	if (type != S_IFCHR && type != S_IFBLK && in->rdev != 0)
		return bad(reason, "inode: device number on a non-device");
	if (in->size > (uint64_t)INT64_MAX)
		return bad(reason, "inode: size beyond 2^63-1");
	if (in->flags & ~EFS_META_INODE_F_KNOWN)
		return bad(reason, "inode: unknown flags");
	if (in->xattr_count == 0 && in->xattr_bytes != 0)
		return bad(reason, "inode: xattr bytes without xattrs");
	return 0;
}

static bool dt_is_valid(uint32_t t)
{
	switch (t) {
	case DT_REG:
	case DT_DIR:
	case DT_LNK:
	case DT_CHR:
	case DT_BLK:
	case DT_FIFO:
	case DT_SOCK:
		return true;
	default:
		return false;
	}
}

int efs_meta_dirent_check(const Etcfs__Dirent *de, const char **reason)
{
	if (de->ino == 0)
		return bad(reason, "dirent: names inode 0");
	if (!dt_is_valid(de->type))
		return bad(reason, "dirent: invalid type");
	return 0;
}

unsigned efs_meta_dt_from_mode(uint32_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return DT_REG;
	case S_IFDIR:
		return DT_DIR;
	case S_IFLNK:
		return DT_LNK;
	case S_IFCHR:
		return DT_CHR;
	case S_IFBLK:
		return DT_BLK;
	case S_IFIFO:
		return DT_FIFO;
	case S_IFSOCK:
		return DT_SOCK;
	default:
		return DT_UNKNOWN;
	}
}

static int check_fsinfo(const void *m, const char **reason)
{
	return efs_meta_fsinfo_check(m, reason);
}

static int check_inode(const void *m, const char **reason)
{
	return efs_meta_inode_check(m, reason);
}

static int check_dirent(const void *m, const char **reason)
{
	return efs_meta_dirent_check(m, reason);
}

static int check_nodeinfo(const void *m, const char **reason)
{
	const Etcfs__NodeInfo *n = m;

	if (n->machine_id[0] == '\0')
		return bad(reason, "node: no machine id");
	if (n->pid <= 0)
		return bad(reason, "node: invalid pid");
	if (n->lease_id == 0)
		return bad(reason, "node: no session lease");
	return 0;
}

static bool mode_ok(uint32_t mode)
{
	return mode == EFS_META_LOCK_SHARED || mode == EFS_META_LOCK_EXCLUSIVE;
}

static int check_holder(const void *m, const char **reason)
{
	const Etcfs__LockHolder *h = m;

	if (!node_ok(h->node))
		return bad(reason, "lock holder: invalid node id");
	if (!mode_ok(h->mode))
		return bad(reason, "lock holder: invalid mode");
	if (h->lease_id == 0)
		return bad(reason, "lock holder: no session lease");
	return 0;
}

static int check_waiter(const void *m, const char **reason)
{
	const Etcfs__LockWaiter *w = m;

	if (!node_ok(w->node))
		return bad(reason, "lock waiter: invalid node id");
	if (!mode_ok(w->mode))
		return bad(reason, "lock waiter: invalid mode");
	return 0;
}

static int check_openref(const void *m, const char **reason)
{
	const Etcfs__OpenRef *o = m;

	if (!node_ok(o->node))
		return bad(reason, "open reference: invalid node id");
	return 0;
}

static int check_reclaim(const void *m, const char **reason)
{
	const Etcfs__Reclaim *rc = m;

	if (rc->node[0] != '\0' && !node_ok(rc->node))
		return bad(reason, "reclaim: invalid node id");
	return 0;
}

static int check_ino_counter(const void *m, const char **reason)
{
	const Etcfs__InoCounter *c = m;

	if (c->next <= EFS_META_ROOT_INO)
		return bad(reason, "inode counter: next inode is not past the root");
	return 0;
}

static int check_ag_owner(const void *m, const char **reason)
{
	const Etcfs__AgOwner *o = m;

	if (!node_ok(o->node))
		return bad(reason, "group owner: invalid node id");
	if (o->lease_id == 0)
		return bad(reason, "group owner: no session lease");
	return 0;
}

/*
 * Runs must be non-empty, sorted, non-overlapping, and inside |limit|
 * blocks (0: no limit); |strict| also refuses adjacent runs (a free map
 * keeps them merged).
 */
static int check_runs(Etcfs__Run *const *runs, size_t n, uint64_t limit, bool strict,
		      const char **reason, const char *who)
{
	uint64_t prev_end = 0;

	for (size_t i = 0; i < n; i++) {
		const Etcfs__Run *r = runs[i];

		if (r->len == 0)
			return bad(reason, who);
		if (r->start + r->len < r->start)
			return bad(reason, who);
		if (limit && r->start + r->len > limit)
			return bad(reason, who);
		if (i > 0 && (r->start < prev_end || (strict && r->start == prev_end)))
			return bad(reason, who);
		prev_end = r->start + r->len;
	}
	return 0;
}

static int check_ag_map(const void *m, const char **reason)
{
	const Etcfs__AgMap *map = m;

	if (map->group_blocks == 0)
		return bad(reason, "group map: empty group");
	return check_runs(map->free, map->n_free, map->group_blocks, true, reason,
			  "group map: runs empty, unsorted, overlapping, adjacent or outside the group");
}

static int check_free_intent(const void *m, const char **reason)
{
	const Etcfs__FreeIntent *fi = m;

	if (fi->n_runs == 0)
		return bad(reason, "free intent: no blocks");
	return check_runs(fi->runs, fi->n_runs, 0, false, reason,
			  "free intent: runs empty, unsorted or overlapping");
}

static int check_extent_chunk(const void *m, const char **reason)
{
	const Etcfs__ExtentChunk *c = m;
	uint64_t prev_end = 0;

	for (size_t i = 0; i < c->n_extents; i++) {
		const Etcfs__Extent *e = c->extents[i];

		if (e->count == 0)
			return bad(reason, "extent chunk: empty extent");
		if (e->file_block + e->count < e->file_block || e->dev_block + e->count < e->dev_block)
			return bad(reason, "extent chunk: extent wraps around");
		if (i > 0 && e->file_block < prev_end)
			return bad(reason, "extent chunk: extents unsorted or overlapping");
		prev_end = e->file_block + e->count;
	}
	return 0;
}

static int check_plocks(const void *m, const char **reason)
{
	const Etcfs__ByteRangeLocks *l = m;

	for (size_t i = 0; i < l->n_locks; i++) {
		const Etcfs__ByteRangeLock *b = l->locks[i];

		if (b->start > b->end)
			return bad(reason, "byte-range lock: start after end");
		if (b->type != F_RDLCK && b->type != F_WRLCK)
			return bad(reason, "byte-range lock: invalid type");
		if (b->kind < EFS_META_PLOCK_POSIX || b->kind > EFS_META_PLOCK_FLOCK)
			return bad(reason, "byte-range lock: invalid kind");
	}
	return 0;
}

/* ---- Decoders ---- */

int efs_meta_fsinfo_decode(const uint8_t *buf, size_t len, Etcfs__FsInfo **ret,
			   const char **reason)
{
	return decode(&etcfs__fs_info__descriptor, check_fsinfo, buf, len, (void **)ret, reason);
}

int efs_meta_inode_decode(const uint8_t *buf, size_t len, Etcfs__Inode **ret, const char **reason)
{
	return decode(&etcfs__inode__descriptor, check_inode, buf, len, (void **)ret, reason);
}

int efs_meta_dirent_decode(const uint8_t *buf, size_t len, Etcfs__Dirent **ret,
			   const char **reason)
{
	return decode(&etcfs__dirent__descriptor, check_dirent, buf, len, (void **)ret, reason);
}

int efs_meta_nodeinfo_decode(const uint8_t *buf, size_t len, Etcfs__NodeInfo **ret,
			     const char **reason)
{
	return decode(&etcfs__node_info__descriptor, check_nodeinfo, buf, len, (void **)ret,
		      reason);
}

int efs_meta_generation_decode(const uint8_t *buf, size_t len, Etcfs__Generation **ret,
			       const char **reason)
{
	return decode(&etcfs__generation__descriptor, NULL, buf, len, (void **)ret, reason);
}

int efs_meta_holder_decode(const uint8_t *buf, size_t len, Etcfs__LockHolder **ret,
			   const char **reason)
{
	return decode(&etcfs__lock_holder__descriptor, check_holder, buf, len, (void **)ret,
		      reason);
}

int efs_meta_waiter_decode(const uint8_t *buf, size_t len, Etcfs__LockWaiter **ret,
			   const char **reason)
{
	return decode(&etcfs__lock_waiter__descriptor, check_waiter, buf, len, (void **)ret,
		      reason);
}

int efs_meta_openref_decode(const uint8_t *buf, size_t len, Etcfs__OpenRef **ret,
			    const char **reason)
{
	return decode(&etcfs__open_ref__descriptor, check_openref, buf, len, (void **)ret,
		      reason);
}

int efs_meta_orphan_decode(const uint8_t *buf, size_t len, Etcfs__Orphan **ret,
			   const char **reason)
{
	return decode(&etcfs__orphan__descriptor, NULL, buf, len, (void **)ret, reason);
}

int efs_meta_reclaim_decode(const uint8_t *buf, size_t len, Etcfs__Reclaim **ret,
			    const char **reason)
{
	return decode(&etcfs__reclaim__descriptor, check_reclaim, buf, len, (void **)ret,
		      reason);
}

int efs_meta_ino_counter_decode(const uint8_t *buf, size_t len, Etcfs__InoCounter **ret,
				const char **reason)
{
	return decode(&etcfs__ino_counter__descriptor, check_ino_counter, buf, len, (void **)ret,
		      reason);
}

int efs_meta_renameseq_decode(const uint8_t *buf, size_t len, Etcfs__RenameSeq **ret,
			      const char **reason)
{
	return decode(&etcfs__rename_seq__descriptor, NULL, buf, len, (void **)ret, reason);
}

int efs_meta_ag_owner_decode(const uint8_t *buf, size_t len, Etcfs__AgOwner **ret,
			     const char **reason)
{
	return decode(&etcfs__ag_owner__descriptor, check_ag_owner, buf, len, (void **)ret,
		      reason);
}

int efs_meta_ag_map_decode(const uint8_t *buf, size_t len, Etcfs__AgMap **ret,
			   const char **reason)
{
	return decode(&etcfs__ag_map__descriptor, check_ag_map, buf, len, (void **)ret, reason);
}

int efs_meta_ag_free_decode(const uint8_t *buf, size_t len, Etcfs__AgFree **ret,
			    const char **reason)
{
	return decode(&etcfs__ag_free__descriptor, NULL, buf, len, (void **)ret, reason);
}

uint64_t efs_meta_ag_free_sum(const Etcdserverpb__TxnResponse *resp)
{
	uint64_t sum = 0;

	for (size_t i = 0; resp && i < resp->n_responses; i++) {
		Etcdserverpb__RangeResponse *rr = NULL;
		Etcfs__AgFree *af = NULL;

		if (efs_etcd_txn_resp_range(resp, i, &rr) < 0 || rr->n_kvs == 0)
			continue;
		if (efs_meta_ag_free_decode(rr->kvs[0]->value.data, rr->kvs[0]->value.len, &af,
					    NULL) == 0) {
			sum += af->free_blocks;
			efs_meta_record_free(af);
		}
	}
	return sum;
}

int efs_meta_free_intent_decode(const uint8_t *buf, size_t len, Etcfs__FreeIntent **ret,
				const char **reason)
{
	return decode(&etcfs__free_intent__descriptor, check_free_intent, buf, len, (void **)ret,
		      reason);
}

int efs_meta_extent_chunk_decode(const uint8_t *buf, size_t len, Etcfs__ExtentChunk **ret,
				 const char **reason)
{
	return decode(&etcfs__extent_chunk__descriptor, check_extent_chunk, buf, len,
		      (void **)ret, reason);
}

int efs_meta_plocks_decode(const uint8_t *buf, size_t len, Etcfs__ByteRangeLocks **ret,
			   const char **reason)
{
	return decode(&etcfs__byte_range_locks__descriptor, check_plocks, buf, len, (void **)ret,
		      reason);
}

/* ---- struct stat ---- */

int64_t efs_meta_ns_from_timespec(const struct timespec *ts)
{
	const int64_t max_s = INT64_MAX / 1000000000 - 1;

	if (ts->tv_sec > max_s)
		return INT64_MAX;
	if (ts->tv_sec < -max_s)
		return INT64_MIN;
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

struct timespec efs_meta_timespec_from_ns(int64_t ns)
{
	struct timespec ts;
	int64_t s = ns / 1000000000, r = ns % 1000000000;

	if (r < 0) {
		r += 1000000000;
		s -= 1;
	}
	ts.tv_sec = (time_t)s;
	ts.tv_nsec = (long)r;
	return ts;
}

void efs_meta_inode_to_stat(const Etcfs__Inode *in, uint64_t ino, uint32_t blksize,
			    struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = (ino_t)ino;
	st->st_mode = (mode_t)in->mode;
	st->st_nlink = (nlink_t)in->nlink;
	st->st_uid = (uid_t)in->uid;
	st->st_gid = (gid_t)in->gid;
	st->st_rdev = (dev_t)in->rdev;
	st->st_size = (off_t)in->size;
	st->st_blksize = (blksize_t)blksize;
	st->st_blocks = (blkcnt_t)in->blocks;
	st->st_atim = efs_meta_timespec_from_ns(in->atime_ns);
	st->st_mtim = efs_meta_timespec_from_ns(in->mtime_ns);
	st->st_ctim = efs_meta_timespec_from_ns(in->ctime_ns);
}

void efs_meta_inode_from_stat(Etcfs__Inode *in, const struct stat *st)
{
	in->mode = (uint32_t)st->st_mode;
	in->uid = (uint32_t)st->st_uid;
	in->gid = (uint32_t)st->st_gid;
	in->nlink = (uint32_t)st->st_nlink;
	in->size = (uint64_t)st->st_size;
	in->blocks = (uint64_t)st->st_blocks;
	in->rdev = (uint64_t)st->st_rdev;
	in->atime_ns = efs_meta_ns_from_timespec(&st->st_atim);
	in->mtime_ns = efs_meta_ns_from_timespec(&st->st_mtim);
	in->ctime_ns = efs_meta_ns_from_timespec(&st->st_ctim);
}
