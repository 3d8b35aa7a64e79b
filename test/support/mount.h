/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * A real etcfs mount for integration tests: an etcd from test/harness (one
 * or three members), a sparse image file in a private temporary directory,
 * mkfs.etcfs, and etcfsd in the foreground (-f) as a child process started
 * and stopped by PID. Everything is removed by efs_test_fs_stop(): the
 * mount is unmounted (fusermount3 -u, then -uz after a crash), the daemon
 * and etcd are stopped by PID, the directory is deleted. The daemon and
 * commands are taken from ETCFS_BUILD_ROOT (set by meson's test env).
 * Failures abort the test with a Criterion assertion naming the step.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

struct efs_test_fs_opts {
	int members;		   /* etcd members (0: 1) */
	uint64_t image_size;	   /* bytes (0: 256 MiB, sparse) */
	const char *fsname;	   /* 0: "testfs" */
	const char *node;	   /* 0: "node1" */
	int session_ttl;	   /* seconds (0: daemon default) */
	uint64_t inodes;	   /* mkfs --inodes (0: default) */
	const char *const *mkfs_args;  /* extra mkfs.etcfs args, NULL-terminated */
	const char *const *mount_args; /* extra etcfsd args, NULL-terminated */
	bool metrics;		   /* pass --metrics-addr 127.0.0.1:0, read the
				    * bound address from the daemon's log */
	bool no_mount;		   /* stop after mkfs (bad-input tests) */
	uint64_t etcd_quota;	   /* etcd --quota-backend-bytes and etcfsd
				    * --etcd-quota, bytes (0: etcd's default) */
};

struct efs_test_fs {
	struct efs_harness *etcd;
	char dir[256];	      /* private temp directory */
	char image[300];      /* image file */
	char mnt[300];	      /* mount point */
	char endpoints[512];  /* client URLs, comma-separated */
	char log[300];	      /* daemon stderr log file */
	char metrics[128];    /* host:port of /metrics when asked */
	pid_t daemon;	      /* etcfsd pid, 0 when not running */
	struct efs_test_fs_opts opts;
};

/* Starts etcd, formats and mounts (waits until the mount answers stat()). */
void efs_test_fs_start(struct efs_test_fs *f, const struct efs_test_fs_opts *o);
/* Unmounts and stops everything; safe after a partial start. */
void efs_test_fs_stop(struct efs_test_fs *f);

/* Mounts again (after efs_test_fs_unmount or a kill); extra args may be NULL. */
void efs_test_fs_mount(struct efs_test_fs *f, const char *const *extra_args);
/* Clean unmount (fusermount3 -u) and waits for the daemon to exit 0. */
void efs_test_fs_unmount(struct efs_test_fs *f);
/* kill -9 of the daemon, then fusermount3 -uz of the dead mount. */
void efs_test_fs_kill(struct efs_test_fs *f);

/*
 * Runs a command of the build (mkfs.etcfs, fsck.etcfs, etcfsctl, etcfsd)
 * with the fixture's --endpoints prepended after argv[0]'s name, waits
 * (bounded, 120 s) and returns its exit status (or -1 on a signal);
 * stdout+stderr are captured into |out| (NUL-terminated, may be NULL).
 */
int efs_test_fs_run(struct efs_test_fs *f, char *out, size_t out_size, const char *cmd, ...);

/* The same with a NULL-terminated argument vector. */
int efs_test_fs_runv(struct efs_test_fs *f, char *out, size_t out_size, const char *cmd,
		     const char *const *args);

/* GETs /metrics and returns the value of one sample line, e.g.
 * "etcfs_etcd_txns_total{origin=\"create\",outcome=\"ok\"}"; -1 if absent. */
double efs_test_fs_metric(struct efs_test_fs *f, const char *sample);

/* The build directory (ETCFS_BUILD_ROOT, else found from the test binary). */
const char *efs_test_build_root(void);
/* <build>/etcfsd/<cmd> into |buf| (returned). */
const char *efs_test_command_path(const char *cmd, char *buf, size_t size);
/* True when the last mount on |dir| (an absolute path) is a FUSE mount. */
bool efs_test_is_fuse_mount(const char *dir);
