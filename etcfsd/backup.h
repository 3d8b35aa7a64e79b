/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdint.h>

struct efs_etcd_sync;
struct efs_meta_ns;

/*
 * etcfsctl backup and restore (docs/FORMAT.md section 6 has the stream
 * format, docs/OPERATIONS.md the usage and exit codes).
 *
 * backup: copies one filesystem's metadata at one etcd revision (every key
 * of its prefix that rides no lease, except revision pins) and every device
 * block the extent chunks at that revision reference, with the device
 * superblock, into one versioned, checksummed, streamable file (or stdout).
 *
 * restore: checks a whole backup file (every checksum, the trailer's
 * totals, that every referenced block is in it) before writing anything,
 * refuses a non-empty keyspace and a mounted device, then writes the blocks
 * back to their offsets, puts the keys in transactions ("sb" last) and
 * writes the device superblock.
 *
 * Both take the etcd options of cli.h and return the process exit status
 * (EFS_BACKUP_EXIT_*). |prog| prefixes messages; argv[0] is the
 * subcommand's name, as getopt wants.
 */

enum {
	EFS_BACKUP_EXIT_OK = 0,
	EFS_BACKUP_EXIT_REFUSED = 1,   /* corrupt input, or a target that is in use */
	EFS_BACKUP_EXIT_USAGE = 2,
	EFS_BACKUP_EXIT_NOCONNECT = 3, /* etcd unreachable */
	EFS_BACKUP_EXIT_FAILED = 4,    /* I/O or etcd failed midway */
};

int efs_backup_cmd(const char *prog, int argc, char **argv);

/*
 * Asks every node mounted on filesystem |ns| (its n/ keys) to publish what
 * it buffers: puts sync/<id> on a lease of its own and waits up to
 * |timeout_ms| for each node's sync/<id>/<node> answer, then deletes the
 * request and the answers. Returns how many nodes did not answer "ok"
 * (each named on stderr), 0 when all did or none is mounted, 1 when the
 * request could not be made (said on stderr) or |timeout_ms| is 0.
 * A node that answers has stopped overwriting blocks in place, and stays
 * so while a pin/backup.* key exists. |ret_inplace| (may be NULL; set
 * also with |timeout_ms| 0, when nobody is asked) gets how many mounted
 * nodes did not answer and may overwrite in place (not mounted -o cow),
 * each named on stderr.
 */
int efs_backup_request_sync(const char *prog, struct efs_etcd_sync *s,
			    const struct efs_meta_ns *ns, uint32_t timeout_ms, uint32_t *ret_inplace);
int efs_restore_cmd(const char *prog, int argc, char **argv);
