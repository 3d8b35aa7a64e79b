/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * What the user commands share (etcfsd, mkfs.etcfs, fsck.etcfs, etcfsctl):
 *  - the etcd connection options, with etcdctl's names: --endpoints,
 *    --cacert, --cert, --key, --user (USER[:PASSWORD]; the password is
 *    asked on the terminal or read from ETCFS_PASSWORD when missing),
 *    --dial-timeout; defaults from /etc/etcfs/etcfs.conf (key = value
 *    lines, same names without dashes) and ETCFS_ENDPOINTS, ETCFS_CACERT,
 *    ETCFS_CERT, ETCFS_KEY, ETCFS_USER; command line wins, then the
 *    environment, then the file, then http://127.0.0.1:2379;
 *  - opening a device (block device or regular file), reading its
 *    superblock and checking it against its keyspace's "sb" record.
 * Errors are printed to stderr as "<prog>: <what>: <why>" by the caller
 * from the returned errno and |err| text.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd/etcd.h"
#include "etcd/sync.h"
#include "meta/sb.h"
#include "etcfs.pb-c.h"

#define EFS_CLI_ERR_MAX 512

struct efs_cli_etcd {
	char *endpoints; /* comma-separated URLs */
	char *cacert, *cert, *key;
	char *user, *password;
	uint32_t dial_timeout_ms; /* bounded wait for etcd at start (default 10 s) */
};

/* Fills |e| from the config file and the environment (call first). */
int efs_cli_etcd_defaults(struct efs_cli_etcd *e, char *err, size_t err_size);
/*
 * Consumes one etcd option: |name| without leading dashes ("endpoints"),
 * |value| its argument. 1 when it was an etcd option, 0 when not, -EINVAL
 * for a bad value (|err| says why).
 */
int efs_cli_etcd_option(struct efs_cli_etcd *e, const char *name, const char *value, char *err,
			size_t err_size);
/* The help text lines for the etcd options (for usage()). */
const char *efs_cli_etcd_usage(void);
/* Builds client options (pointers into |e| and |storage|; free with
 * efs_cli_etcd_opts_free). */
int efs_cli_etcd_opts(const struct efs_cli_etcd *e, struct efs_etcd_opts *ret);
void efs_cli_etcd_opts_free(struct efs_etcd_opts *o);
void efs_cli_etcd_free(struct efs_cli_etcd *e);

/*
 * Connects a blocking client and checks that etcd answers within
 * dial_timeout_ms (a Status call on some endpoint): -ETIMEDOUT /
 * -ECONNREFUSED / ... with |err| "etcd unreachable at URLS: why".
 */
int efs_cli_etcd_connect(const struct efs_cli_etcd *e, struct efs_etcd_sync **ret, char *err,
			 size_t err_size);

/* An open device. */
struct efs_cli_device {
	int fd;		   /* O_RDWR (or O_RDONLY) | O_CLOEXEC, not O_DIRECT */
	uint64_t size;	   /* bytes (BLKGETSIZE64 or st_size) */
	bool is_block;
	char *path;
};

/* Opens |path| (block device or regular file). -ENOENT, -EACCES, -ENOTBLK
 * (neither a block device nor a regular file), -EINVAL (smaller than 1 MiB). */
int efs_cli_device_open(const char *path, bool writable, struct efs_cli_device *ret, char *err,
			size_t err_size);
void efs_cli_device_close(struct efs_cli_device *d);
/* Reads and decodes the superblock: efs_sb_decode's errors with its reason
 * ("/dev/x: not an etcfs device", "superblock checksum mismatch", ...). */
int efs_cli_read_sb(const struct efs_cli_device *d, struct efs_sb *ret, unsigned *ret_flags,
		    char *err, size_t err_size);

/*
 * The whole mount-time identity check, nothing written: reads the
 * device's superblock, refuses unknown incompat features, reads "sb" from
 * the keyspace the superblock names and compares (efs_sb_match_fsinfo).
 * -ENODATA (not an etcfs device), -EUCLEAN (corrupt, or device and
 * keyspace disagree), -EPROTONOSUPPORT (unknown incompat feature or
 * version), -ENOENT (the keyspace has no "sb": not formatted, or
 * formatted against another etcd), -ESTALE (UUID or name mismatch), or
 * the etcd error. On success *ret_fi is a decoded record
 * (efs_meta_record_free).
 */
int efs_cli_check_fs(struct efs_etcd_sync *s, const struct efs_cli_device *d, struct efs_sb *sb,
		     unsigned *ret_flags, Etcfs__FsInfo **ret_fi, char *err, size_t err_size);
