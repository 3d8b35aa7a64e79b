/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * What the user commands share (etcfsd, mkfs.etcfs, fsck.etcfs, etcfsctl):
 *  - the etcd connection options, with etcdctl's names: --endpoints,
 *    --cacert, --cert, --key, --user (USER[:PASSWORD]; a missing password
 *    comes from --password, ETCFS_PASSWORD, else the terminal),
 *    --dial-timeout, --command-timeout; defaults from
 *    /etc/etcfs/etcfs.conf (or $ETCFS_CONFIG; key = value lines, same
 *    names without dashes) and ETCFS_<NAME> variables (ETCFS_ENDPOINTS,
 *    ETCFS_DIAL_TIMEOUT, ...); command line wins, then the environment,
 *    then the file, then http://127.0.0.1:2379; etcfsd reads the same
 *    file and variables for every option of its own;
 *  - opening a device (block device or regular file), reading its
 *    superblock and checking it against its keyspace's "sb" record;
 *  - blocking keyspace scans (paged ranges, counts, mounted nodes).
 * Typical use: efs_cli_etcd_defaults(), efs_cli_etcd_option() per option
 * (EFS_CLI_ETCD_LONGOPTS for getopt_long), efs_cli_etcd_finish(), then
 * efs_cli_etcd_connect() (tools) or efs_cli_etcd_opts() (the daemon's own
 * client on its loop), efs_cli_etcd_free() at the end.
 * Errors are printed to stderr as "<prog>: <what>: <why>" by the caller
 * from the returned errno and |err| text.
 */

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd/etcd.h"
#include "etcd/sync.h"
#include "meta/sb.h"
#include "etcfs.pb-c.h"

#define EFS_CLI_ERR_MAX 512

/* The configuration file; the environment variable ETCFS_CONFIG names
 * another one (tests use it; a missing file is not an error). */
#define EFS_CLI_CONFIG_FILE "/etc/etcfs/etcfs.conf"

/* Defaults when neither the command line, the environment nor the file
 * says otherwise. */
#define EFS_CLI_ENDPOINTS_DEFAULT       "http://127.0.0.1:2379"
#define EFS_CLI_DIAL_TIMEOUT_DEFAULT_MS 10000
#define EFS_CLI_CMD_TIMEOUT_DEFAULT_MS  5000

/* Every string is owned (efs_mem) or NULL. */
struct efs_cli_etcd {
	char *endpoints; /* comma-separated URLs */
	char *cacert, *cert, *key;
	char *user, *password;
	uint32_t dial_timeout_ms; /* bounded wait for etcd at start (default 10 s) */
	uint32_t command_timeout_ms; /* deadline of each call (default 5 s) */
};

/*
 * Fills |e| (zeroed by this call: call it first) from the config file and
 * the environment (efs_cli_config_load with the etcd names). Config lines
 * are "key = value" with the option names (endpoints, cacert, cert, key,
 * user, password, dial-timeout, command-timeout); etcfsd's own keys
 * (efs_cli_daemon_keys) are skipped; blank lines and lines starting with
 * '#' are skipped. Errors: -EINVAL (a malformed line or unknown key, |err|
 * says FILE:LINE), -EACCES and other open/read errors of an existing file,
 * -ENOMEM. On error |e| may hold values: free it with efs_cli_etcd_free().
 */
int efs_cli_etcd_defaults(struct efs_cli_etcd *e, char *err, size_t err_size);
/* Zeroes |e| and sets the built-in defaults (no file, no environment). */
void efs_cli_etcd_init(struct efs_cli_etcd *e);

/*
 * One option from a file or the environment: |name| without dashes,
 * |value| its text. Returns 1 when taken, 0 for an unknown name, -EINVAL
 * with a reason in |err| (without the name), or another -errno.
 */
typedef int (*efs_cli_option_cb)(void *arg, const char *name, const char *value, char *err,
				 size_t err_size);
/* The configuration file to read: |override| (--config) when set, else
 * $ETCFS_CONFIG when set, else EFS_CLI_CONFIG_FILE. */
const char *efs_cli_config_path(const char *override);
/* The environment variable of option |name|: "ETCFS_" and the name in
 * capitals with '-' as '_' ("dial-timeout" -> ETCFS_DIAL_TIMEOUT). */
void efs_cli_env_name(const char *name, char *buf, size_t size);
/*
 * Reads the configuration file |path| ("key = value" lines, blank lines
 * and '#' comments skipped; a missing file is fine unless |must_exist|),
 * then the environment variable of each of |names| (NULL-terminated),
 * handing each setting to |cb| in that order, so that the environment
 * overrides the file; the command line, parsed after, overrides both.
 * Errors: -EINVAL with |err| naming "FILE:LINE: ..." (a line without '=',
 * an unknown key, a bad value) or "ETCFS_X: ..."; the file's open and read
 * errors; the callback's.
 */
int efs_cli_config_load(const char *path, bool must_exist, const char *const *names,
			efs_cli_option_cb cb, void *arg, char *err, size_t err_size);
/* The etcd option names, NULL-terminated. */
const char *const *efs_cli_etcd_names(void);
/* The keys etcfsd takes beyond the etcd ones (the tools skip them in the
 * shared file), NULL-terminated. */
extern const char *const efs_cli_daemon_keys[];

/*
 * Consumes one etcd option: |name| without leading dashes ("endpoints"),
 * |value| its argument. 1 when it was an etcd option, 0 when not, -EINVAL
 * for a bad value (|err| says why), -ENOMEM. Names: endpoints, cacert,
 * cert, key, user (USER or USER:PASSWORD), password, dial-timeout and
 * command-timeout (seconds, fractions allowed, an "s" or "ms" suffix
 * accepted as etcdctl's "2s").
 */
int efs_cli_etcd_option(struct efs_cli_etcd *e, const char *name, const char *value, char *err,
			size_t err_size);
/*
 * getopt_long entries for the etcd options, every one returning |val|:
 * the caller looks the name up with the long index and passes it to
 * efs_cli_etcd_option(), e.g.
 *   static const struct option lo[] = { EFS_CLI_ETCD_LONGOPTS(0x200), ... };
 *   case 0x200: efs_cli_etcd_option(&e, lo[idx].name, optarg, ...);
 */
#define EFS_CLI_ETCD_LONGOPTS(val)                                                         \
	{"endpoints", required_argument, NULL, (val)},                                     \
	{"cacert", required_argument, NULL, (val)},                                        \
	{"cert", required_argument, NULL, (val)},                                          \
	{"key", required_argument, NULL, (val)},                                           \
	{"user", required_argument, NULL, (val)},                                          \
	{"password", required_argument, NULL, (val)},                                      \
	{"dial-timeout", required_argument, NULL, (val)},                                  \
	{"command-timeout", required_argument, NULL, (val)}
/* The help text lines for the etcd options (for usage()). */
const char *efs_cli_etcd_usage(void);
/*
 * Completes |e| after the options: --cert and --key go together; a --user
 * without a password takes ETCFS_PASSWORD, else asks on the terminal, else
 * fails; endpoints given as host:port get http:// (https:// when a TLS
 * option is set). Idempotent. -EINVAL with |err|, -ENOMEM.
 */
int efs_cli_etcd_finish(struct efs_cli_etcd *e, char *err, size_t err_size);
/*
 * Builds client options pointing into |e| (call efs_cli_etcd_finish()
 * first; without it endpoints are normalised here too, and a missing
 * password is taken from ETCFS_PASSWORD or is -EINVAL). |e| must outlive
 * them; efs_cli_etcd_opts_free() frees what they own. -EINVAL, -ENOMEM.
 */
int efs_cli_etcd_opts(const struct efs_cli_etcd *e, struct efs_etcd_opts *ret);
void efs_cli_etcd_opts_free(struct efs_etcd_opts *o);
/* Frees the strings of |e| (the password is wiped first). */
void efs_cli_etcd_free(struct efs_cli_etcd *e);

/*
 * Connects a blocking client and checks that etcd answers within
 * dial_timeout_ms (a Status call on some endpoint): -ETIMEDOUT /
 * -ECONNREFUSED / ... with |err| "etcd unreachable at URLS: why".
 */
int efs_cli_etcd_connect(const struct efs_cli_etcd *e, struct efs_etcd_sync **ret, char *err,
			 size_t err_size);

/*
 * Reads the keys of |r| (an efs_meta_range; an empty end means its key
 * alone) in pages of EFS_CLI_PAGE keys, every page at the revision of the
 * first, calling |cb| with each key-value (borrowed for the call) in key
 * order; a non-zero return stops the scan and is returned. |keys_only|
 * leaves values out. Errors: the callback's, or the etcd error with |err|
 * saying so.
 */
#define EFS_CLI_PAGE 1000
int efs_cli_range_foreach(struct efs_etcd_sync *s, const struct efs_meta_range *r, bool keys_only,
			  int (*cb)(const Mvccpb__KeyValue *kv, void *arg), void *arg, char *err,
			  size_t err_size);
/* Counts the keys of |r| with a count-only Range. */
int efs_cli_range_count(struct efs_etcd_sync *s, const struct efs_meta_range *r, int64_t *ret,
			char *err, size_t err_size);
/*
 * Counts the n/ keys of |ns| (nodes holding a session: mounted). When there
 * is one, the first node id goes to |node| (EFS_META_NODE_MAX + 1 bytes,
 * may be NULL). Errors: the etcd error with |err|.
 */
int efs_cli_mounted_nodes(struct efs_etcd_sync *s, const struct efs_meta_ns *ns,
			  int64_t *ret_count, char *node, char *err, size_t err_size);

/* Prints "<prog>: <err>" to stderr, or "<prog>: <strerror(-errnum)>" when
 * |err| is empty. */
void efs_cli_print_err(const char *prog, int errnum, const char *err);

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
/* Closes |d| and zeroes it (fd -1). Accepts NULL, a zeroed struct and a
 * closed one. */
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

/* ---- Another node's /metrics ---- */

/* The most of an answer efs_cli_metrics_get reads. */
#define EFS_CLI_METRICS_MAX (8u << 20)

/* Connects to |addr| (numeric: no name lookup), waiting until |deadline_ns|
 * (monotonic): the socket, or -errno. */
int efs_cli_metrics_connect(const char *addr, uint64_t deadline_ns);

/*
 * GETs /metrics from |addr| on |fd| (efs_cli_metrics_connect; closed
 * here), reading by |deadline| at most EFS_CLI_METRICS_MAX bytes: *|ret| is
 * the NUL-terminated answer, headers included (efs_mem_free),
 * *|ret_first_ns| (may be NULL) when its first byte came. -errno;
 * -ECONNRESET when nothing came.
 */
int efs_cli_metrics_get(int fd, const char *addr, uint64_t deadline, char **ret,
			uint64_t *ret_first_ns);

/*
 * Measures the clock of the etcfsd whose /metrics is at |addr| within
 * |bound_ms|: *|ret_skew_s| is its clock minus ours (its
 * etcfs_clock_wall_seconds against our clock at the middle of the time
 * from our request to the answer's first byte), *|ret_err_s| half that
 * time (the error bound). Blocks. -errno with a reason in |why| (-EPROTO:
 * no such metric or no 200).
 */
int efs_cli_clock_probe(const char *addr, uint32_t bound_ms, double *ret_skew_s,
			double *ret_err_s, char *why, size_t why_size);
