/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Codecs of the values stored under the keys of meta/keys.h: the protobuf
 * messages of proto/etcfs.proto, packed and unpacked with the efs_mem
 * allocator, and checked on decode so that the rest of the daemon never
 * sees a record that breaks its own invariants. Pure: no I/O.
 *
 * Decoders return 0 and a new message (free it with efs_meta_record_free),
 * or: -EBADMSG when the bytes are not a message of that type (truncated,
 * bad wire data), -EUCLEAN when they are but its contents are impossible
 * (an inode mode of no known type, a directory with one link, a dirent
 * naming inode 0, ...), -ENOMEM. |reason|, when not NULL, receives a static
 * string saying what was wrong (NULL on success); outputs are set only on
 * success. Fields added by later versions are ignored (proto3).
 */

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <protobuf-c/protobuf-c.h>

#include "etcfs.pb-c.h"
#include "etcd/txn.h"
#include "meta/keys.h"

/* Largest link count (link(2) and mkdir(2) answer EMLINK beyond it). */
#define EFS_META_LINK_MAX 65000
/* Longest inline symlink target (PATH_MAX - 1). */
#define EFS_META_SYMLINK_MAX 4095
/* Longest xattr value. */
#define EFS_META_XATTR_VALUE_MAX 65536

/* Inode.flags: none defined yet; unknown bits are refused on decode. */
#define EFS_META_INODE_F_KNOWN 0u
/* Extent.flags. */
#define EFS_META_EXTENT_F_PREALLOC 0x1u /* fallocate'd, reads as zeroes */
/* ByteRangeLock.kind. */
#define EFS_META_PLOCK_POSIX 1
#define EFS_META_PLOCK_OFD   2
#define EFS_META_PLOCK_FLOCK 3

/*
 * Packs |msg| into a new efs_mem buffer (ret->data, freed with
 * efs_mem_free; an empty message gives len 0 and a non-NULL data).
 * -ENOMEM; |ret| untouched on failure.
 */
int efs_meta_pack(const ProtobufCMessage *msg, ProtobufCBinaryData *ret);

/* Adds to |branch| of |t| a put of key |k| = |msg| packed, attached to
 * |lease| (0: none). -ENOMEM, or efs_etcd_txn_put's errors. */
int efs_meta_txn_put(struct efs_etcd_txn *t, enum efs_etcd_txn_branch branch,
		     const struct efs_meta_key *k, const ProtobufCMessage *msg, int64_t lease);

/* Frees a message returned by a decoder. Accepts NULL. */
void efs_meta_record_free(void *msg);

/* ---- Decoders (see above for the contract) ---- */

int efs_meta_fsinfo_decode(const uint8_t *buf, size_t len, Etcfs__FsInfo **ret,
			   const char **reason);
int efs_meta_inode_decode(const uint8_t *buf, size_t len, Etcfs__Inode **ret, const char **reason);
int efs_meta_dirent_decode(const uint8_t *buf, size_t len, Etcfs__Dirent **ret,
			   const char **reason);
int efs_meta_nodeinfo_decode(const uint8_t *buf, size_t len, Etcfs__NodeInfo **ret,
			     const char **reason);
int efs_meta_generation_decode(const uint8_t *buf, size_t len, Etcfs__Generation **ret,
			       const char **reason);
int efs_meta_holder_decode(const uint8_t *buf, size_t len, Etcfs__LockHolder **ret,
			   const char **reason);
int efs_meta_waiter_decode(const uint8_t *buf, size_t len, Etcfs__LockWaiter **ret,
			   const char **reason);
int efs_meta_openref_decode(const uint8_t *buf, size_t len, Etcfs__OpenRef **ret,
			    const char **reason);
int efs_meta_orphan_decode(const uint8_t *buf, size_t len, Etcfs__Orphan **ret,
			   const char **reason);
int efs_meta_reclaim_decode(const uint8_t *buf, size_t len, Etcfs__Reclaim **ret,
			    const char **reason);
int efs_meta_ino_counter_decode(const uint8_t *buf, size_t len, Etcfs__InoCounter **ret,
				const char **reason);
int efs_meta_renameseq_decode(const uint8_t *buf, size_t len, Etcfs__RenameSeq **ret,
			      const char **reason);
int efs_meta_ag_owner_decode(const uint8_t *buf, size_t len, Etcfs__AgOwner **ret,
			     const char **reason);
int efs_meta_ag_map_decode(const uint8_t *buf, size_t len, Etcfs__AgMap **ret,
			   const char **reason);
int efs_meta_ag_free_decode(const uint8_t *buf, size_t len, Etcfs__AgFree **ret,
			    const char **reason);
/* The free blocks of every ag/<g>/free record a transaction's range reads
 * returned (each response a range of one key; others and undecodable
 * records add nothing). */
uint64_t efs_meta_ag_free_sum(const Etcdserverpb__TxnResponse *resp);
int efs_meta_free_intent_decode(const uint8_t *buf, size_t len, Etcfs__FreeIntent **ret,
				const char **reason);
int efs_meta_extent_chunk_decode(const uint8_t *buf, size_t len, Etcfs__ExtentChunk **ret,
				 const char **reason);
int efs_meta_plocks_decode(const uint8_t *buf, size_t len, Etcfs__ByteRangeLocks **ret,
			   const char **reason);

/* ---- Checks shared with the writers ---- */

/*
 * The checks the decoders apply, for a message built in memory before it is
 * written: 0 or -EUCLEAN with |reason| set.
 */
int efs_meta_fsinfo_check(const Etcfs__FsInfo *fi, const char **reason);
int efs_meta_inode_check(const Etcfs__Inode *in, const char **reason);
int efs_meta_dirent_check(const Etcfs__Dirent *de, const char **reason);

/* DT_* for an inode mode's type, DT_UNKNOWN (0) for none. */
unsigned efs_meta_dt_from_mode(uint32_t mode);

/* ---- struct stat ---- */

/*
 * Fills |st| from inode |ino|'s record (every field of struct stat; times
 * with nanoseconds; st_blksize is |blksize|). Cannot fail.
 */
void efs_meta_inode_to_stat(const Etcfs__Inode *in, uint64_t ino, uint32_t blksize,
			    struct stat *st);

/*
 * Copies mode, uid, gid, nlink, size, blocks, rdev and a/m/ctime from |st|
 * into |in|; the fields struct stat lacks (btime, parent, symlink,
 * generation, flags, xattr accounting, op_id) are left as they were.
 */
void efs_meta_inode_from_stat(Etcfs__Inode *in, const struct stat *st);

/* Nanoseconds since the epoch <-> timespec (floor, so that negative times
 * keep 0 <= tv_nsec < 1e9). */
int64_t efs_meta_ns_from_timespec(const struct timespec *ts);
struct timespec efs_meta_timespec_from_ns(int64_t ns);
