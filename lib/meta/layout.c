/* SPDX-License-Identifier: Apache-2.0 */
#include "meta/layout.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void setreason(char *reason, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void setreason(char *reason, size_t size, const char *fmt, ...)
{
	va_list ap;

	if (!reason || !size)
		return;
	va_start(ap, fmt);
	vsnprintf(reason, size, fmt, ap);
	va_end(ap);
}

static bool is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

int efs_layout_compute(uint64_t device_size, uint32_t block_size, uint64_t inodes,
		       struct efs_layout *ret, char *reason, size_t reason_size)
{
	struct efs_layout l = {.block_size = block_size, .device_size = device_size};
	uint64_t blocks, data_bytes, ag_bytes, count;

	if (!is_pow2(block_size) || block_size < EFS_SB_BLOCK_MIN ||
	    block_size > EFS_SB_BLOCK_MAX) {
		setreason(reason, reason_size,
			  "block size %u is not a power of two between %u and %u", block_size,
			  EFS_SB_BLOCK_MIN, EFS_SB_BLOCK_MAX);
		return -EINVAL;
	}
	if (inodes && (inodes < 2 || inodes > EFS_LAYOUT_INODES_MAX)) {
		setreason(reason, reason_size, "inode limit %llu is not between 2 and %llu",
			  (unsigned long long)inodes, (unsigned long long)EFS_LAYOUT_INODES_MAX);
		return -EINVAL;
	}
	l.data_start = EFS_LAYOUT_RESERVED_BYTES / block_size;
	if (l.data_start == 0)
		l.data_start = 1;
	blocks = device_size / block_size;
	if (blocks <= l.data_start ||
	    (blocks - l.data_start) * block_size < EFS_LAYOUT_MIN_DATA_BYTES) {
		setreason(reason, reason_size,
			  "device too small: %llu bytes; etcfs needs at least %llu (%llu reserved "
			  "+ %llu of data)",
			  (unsigned long long)device_size,
			  (unsigned long long)(l.data_start * block_size +
					       EFS_LAYOUT_MIN_DATA_BYTES),
			  (unsigned long long)(l.data_start * block_size),
			  (unsigned long long)EFS_LAYOUT_MIN_DATA_BYTES);
		return -ENOSPC;
	}
	l.data_blocks = blocks - l.data_start;
	data_bytes = l.data_blocks * block_size;

	/* Largest power of two <= device_size / target, clamped (the device
	 * size, not the data area's, so that round sizes give round groups). */
	ag_bytes = EFS_LAYOUT_AG_MIN_BYTES;
	while (ag_bytes < EFS_LAYOUT_AG_MAX_BYTES &&
	       ag_bytes * 2 <= device_size / EFS_LAYOUT_AG_TARGET)
		ag_bytes *= 2;
	if (ag_bytes < block_size)
		ag_bytes = block_size;
	l.ag_blocks = ag_bytes / block_size;
	count = (l.data_blocks - 1) / l.ag_blocks + 1;
	if (count > UINT32_MAX) {
		setreason(reason, reason_size, "device too large: %llu allocation groups",
			  (unsigned long long)count);
		return -EFBIG;
	}
	l.ag_count = (uint32_t)count;

	if (inodes) {
		l.inode_limit = inodes;
	} else {
		l.inode_limit = data_bytes / EFS_LAYOUT_BYTES_PER_INODE;
		if (l.inode_limit < EFS_LAYOUT_INODES_MIN)
			l.inode_limit = EFS_LAYOUT_INODES_MIN;
	}
	*ret = l;
	if (reason && reason_size)
		reason[0] = '\0';
	return 0;
}

uint64_t efs_layout_group_blocks(const struct efs_layout *l, uint32_t g)
{
	if (g >= l->ag_count)
		return 0;
	if (g + 1 < l->ag_count)
		return l->ag_blocks;
	return l->data_blocks - (uint64_t)g * l->ag_blocks;
}

uint64_t efs_layout_group_start(const struct efs_layout *l, uint32_t g)
{
	return l->data_start + (uint64_t)g * l->ag_blocks;
}

uint64_t efs_layout_total_blocks(const struct efs_layout *l)
{
	return l->data_blocks;
}

void efs_layout_fsinfo(const struct efs_layout *l, const uint8_t uuid[16], const char *name,
		       int64_t now_ns, Etcfs__FsInfo *fi)
{
	etcfs__fs_info__init(fi);
	fi->uuid.data = (uint8_t *)uuid;
	fi->uuid.len = 16;
	fi->name = (char *)name;
	fi->block_size = l->block_size;
	fi->device_size = l->device_size;
	fi->data_start = l->data_start;
	fi->format_version = EFS_SB_FORMAT_VERSION;
	fi->feature_compat = 0;
	fi->feature_ro_compat = 0;
	fi->feature_incompat = 0;
	fi->inode_limit = l->inode_limit;
	fi->created_ns = now_ns;
	fi->ag_blocks = l->ag_blocks;
	fi->ag_count = l->ag_count;
}

int efs_layout_sb(const struct efs_layout *l, const uint8_t uuid[16], const char *name,
		  int64_t now_ns, struct efs_sb *sb)
{
	size_t n = strlen(name);

	if (n > EFS_META_FSNAME_MAX)
		return -EINVAL;
	memset(sb, 0, sizeof(*sb));
	sb->format_version = EFS_SB_FORMAT_VERSION;
	memcpy(sb->uuid, uuid, 16);
	memcpy(sb->name, name, n + 1);
	sb->block_size = l->block_size;
	sb->data_start = l->data_start;
	sb->device_size = l->device_size;
	sb->inode_limit = l->inode_limit;
	sb->created_ns = now_ns;
	return 0;
}

static void dir_inode(Etcfs__Inode *in, uint32_t perm, uint32_t uid, uint32_t gid,
		      uint32_t nlink, int64_t now_ns)
{
	etcfs__inode__init(in);
	in->mode = S_IFDIR | perm;
	in->uid = uid;
	in->gid = gid;
	in->nlink = nlink;
	in->parent = EFS_LAYOUT_ROOT_INO;
	in->atime_ns = now_ns;
	in->mtime_ns = now_ns;
	in->ctime_ns = now_ns;
	in->btime_ns = now_ns;
}

void efs_layout_root_inode(uint32_t uid, uint32_t gid, int64_t now_ns, Etcfs__Inode *in)
{
	dir_inode(in, 0755, uid, gid, 3, now_ns);
}

void efs_layout_lost_found_inode(int64_t now_ns, Etcfs__Inode *in)
{
	dir_inode(in, 0700, 0, 0, 2, now_ns);
}

void efs_layout_lost_found_dirent(Etcfs__Dirent *de)
{
	etcfs__dirent__init(de);
	de->ino = EFS_LAYOUT_LOST_FOUND_INO;
	de->type = DT_DIR;
}

void efs_layout_ag_map(const struct efs_layout *l, uint32_t g, struct efs_layout_agmap *ret)
{
	etcfs__ag_map__init(&ret->map);
	etcfs__run__init(&ret->run);
	ret->run.start = 0;
	ret->run.len = efs_layout_group_blocks(l, g);
	ret->runs[0] = &ret->run;
	ret->map.n_free = 1;
	ret->map.free = ret->runs;
	ret->map.group_blocks = ret->run.len;
}

void efs_layout_ag_free(const struct efs_layout *l, uint32_t g, Etcfs__AgFree *ret)
{
	etcfs__ag_free__init(ret);
	ret->free_blocks = efs_layout_group_blocks(l, g);
}
