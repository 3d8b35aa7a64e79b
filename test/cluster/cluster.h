/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The cluster fixture: N etcfsd nodes mounting one sparse image at N mount
 * points over one etcd cluster (three members by default), all started and
 * stopped by PID by the test program, and a watchdog that bounds every
 * check: when a check's bound passes, every FUSE connection of the
 * cluster with requests waiting is aborted through the fusectl filesystem
 * (its callers then return ENOTCONN, which fails the check), the mount
 * that hung is named, and the nodes are mounted again for the next check.
 *
 * Failures do not return: efs_cl_fail() jumps back to the runner of the
 * check (efs_cl_jmp), which reports it as TAP "not ok", closes the
 * descriptors and stops the processes the check left behind.
 */

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

/* The nodes' --recall-bound: short, so that a recall left unanswered
 * shows in a node's log, and etcfsctl locks marks it, within a check. */
#define EFS_CL_RECALL_BOUND_S "3"

#define EFS_CL_MAX_NODES 4
#define EFS_CL_MAX_ENV	 4
#define EFS_CL_MAX_ARGS	 4

struct efs_cl_node {
	char id[32];
	char mnt[300];
	char log[300];
	pid_t pid;     /* etcfsd, 0 when not running */
	unsigned conn; /* fusectl connection (the mount's device minor), 0: none */
	bool aborted;  /* by the watchdog: mounted again before the next check */
	/* "NAME=VALUE" entries (fault hooks) given to the node's next mounts */
	char env[EFS_CL_MAX_ENV][96];
	int nenv;
	char metrics[64]; /* host:port of its /metrics (the mount's own port) */
	/* Extra etcfsd arguments of its next mounts (efs_cl_setargs) */
	char args[EFS_CL_MAX_ARGS][64];
	int nargs;
	/*
	 * With opts.netns: its network namespace (its /metrics listens on its
	 * veth's address there), the host side of its veth pair, both ends'
	 * addresses, the etcd endpoints as seen from there (the host side's
	 * address) and whether its link is cut.
	 */
	char netns[48];
	char veth[16];
	char host_addr[16];
	char ns_addr[16];
	char endpoints[512];
	bool netns_made, veth_made, cut;
};

struct efs_cl_opts {
	int nodes;	  /* 0: 3 */
	int members;	  /* etcd members (0: 3) */
	int session_ttl;  /* seconds (0: 2) */
	uint64_t image;	  /* bytes (0: 512 MiB, sparse) */
	const char *const *mount_args; /* extra etcfsd args for every node, NULL-terminated */
	/*
	 * Each node's etcfsd runs in a network namespace of its own
	 * ("efs-cl-<pid>-<node>"), joined to the host by a veth pair with a
	 * private /30, and reaches etcd (which serves clients on 127.0.0.1
	 * and on each veth's host side) only through it, so that
	 * efs_cl_cut() can cut it off. Only the network namespace: its mount
	 * is the host's.
	 */
	bool netns;
};

struct efs_cl {
	struct efs_harness *etcd;
	char dir[256];
	char image[300];
	char endpoints[512];
	int n;
	struct efs_cl_opts opts;
	struct efs_cl_node node[EFS_CL_MAX_NODES];
	bool fusectl_mounted; /* by us: unmounted again at stop */
	pid_t spawned[8];     /* children of a check (efs_cl_spawned) */
	struct efs_cl_wd *wd;
};

/* Where a failing check jumps to (set by the runner) and what it said. */
extern jmp_buf *efs_cl_jmp;
extern char efs_cl_msg[8192];

_Noreturn void efs_cl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define CL_CHECK(cond, ...)                                                                        \
	do {                                                                                       \
		if (!(cond))                                                                       \
			efs_cl_fail_at(__FILE__, __LINE__, #cond, __VA_ARGS__);                    \
	} while (0)

_Noreturn void efs_cl_fail_at(const char *file, int line, const char *cond, const char *fmt,
			      ...) __attribute__((format(printf, 4, 5)));

/* Starts etcd, formats the image and mounts every node. */
void efs_cl_start(struct efs_cl *c, const struct efs_cl_opts *o);
/* Unmounts every node and stops everything; safe after a partial start.
 * Returns false (with the reason in efs_cl_msg) when something did not
 * leave cleanly; everything is gone either way. */
bool efs_cl_stop(struct efs_cl *c);

/* Mounts node |i| (waits until it answers), with its env entries. */
void efs_cl_mount(struct efs_cl *c, int i);
/* Clean unmount of node |i| (fusermount3 -u); waits for the daemon to exit 0. */
void efs_cl_unmount(struct efs_cl *c, int i);
/* SIGTERM to node |i|'s daemon: it must unmount and exit 0 by itself. */
void efs_cl_terminate(struct efs_cl *c, int i);
/* kill -9 of node |i|, then fusermount3 -uz of its dead mount. */
void efs_cl_kill(struct efs_cl *c, int i);
/* Stops node |i| whatever state it is in (unmount, else SIGTERM, else
 * SIGKILL; a dead or hung mount is aborted and detached); false when it
 * did not leave cleanly. */
bool efs_cl_down(struct efs_cl *c, int i);
/* Sets (or with |value| NULL, clears) an environment entry of node |i|
 * for its next mounts. */
void efs_cl_setenv(struct efs_cl *c, int i, const char *name, const char *value);
/*
 * A child a check forked (one that must not exec, e.g. because it holds a
 * descriptor of a mount that may hang): efs_cl_kill_spawned() kills and
 * reaps every one not yet given back with efs_cl_reaped() (the runner
 * calls it when a check fails, and efs_cl_stop()).
 */
void efs_cl_spawned(struct efs_cl *c, pid_t pid);
void efs_cl_reaped(struct efs_cl *c, pid_t pid);
void efs_cl_kill_spawned(struct efs_cl *c);
/* Sets (|args| NULL-terminated, at most EFS_CL_MAX_ARGS) or with NULL
 * clears the extra etcfsd arguments of node |i|'s next mounts. */
void efs_cl_setargs(struct efs_cl *c, int i, const char *const *args);
/*
 * With opts.netns: cuts node |i| off (the host side of its veth goes
 * down; both sides know each other's link address permanently, so no
 * neighbour probe fails either: what either side sends is lost silently,
 * no reset, no unreachable, as in a real partition), and restores its
 * link. Its /metrics stays readable through efs_cl_metric() (read from
 * inside its namespace), its mount from the host; etcfsctl members (from
 * the host) cannot reach its /metrics while it is cut.
 */
void efs_cl_cut(struct efs_cl *c, int i);
void efs_cl_restore(struct efs_cl *c, int i);
/* Whether node |i| is mounted and its daemon alive (does not touch the mount). */
bool efs_cl_alive(struct efs_cl *c, int i);

/* "<mount point of node i>/<rel>" in |buf| (returned). */
const char *efs_cl_path(struct efs_cl *c, int i, const char *rel, char *buf, size_t size);
/* "<mount point of node i>/<dir>/<name>", from a ring of 8 buffers. */
const char *efs_cl_dpath(struct efs_cl *c, int i, const char *dir, const char *name);

/* In a child just forked by a check: runs fn(arg) with its failures
 * caught; a failure's message goes to |report_fd| and the child exits 1,
 * else it exits 0. */
_Noreturn void efs_cl_child_run(void (*fn)(void *arg), void *arg, int report_fd);

/*
 * Runs a command of the build (fsck.etcfs, etcfsctl) with --endpoints,
 * bounded (120 s); returns its exit status (-1 on a signal), output in |out|.
 */
int efs_cl_run(struct efs_cl *c, char *out, size_t out_size, const char *cmd, ...);

/*
 * Bounds what follows by |ms|: when it passes, every mount of the cluster
 * with FUSE requests waiting is aborted and named in efs_cl_hung(). 0
 * disarms. The bound of a check is armed by the runner.
 */
void efs_cl_bound(struct efs_cl *c, uint64_t ms, const char *what);
/* What the watchdog aborted under the bound armed last (empty: nothing). */
const char *efs_cl_hung(struct efs_cl *c);

/* Milliseconds of CLOCK_MONOTONIC, and a sleep. */
uint64_t efs_cl_now_ms(void);
void efs_cl_sleep_ms(unsigned ms);
/* The value of one sample line of node |i|'s /metrics, e.g.
 * "etcfs_takeover_cow_writes_total"; -1 when it has none or does not
 * answer (bounded: 5 s). */
double efs_cl_metric(struct efs_cl *c, int i, const char *sample);
/* The whole text of node |i|'s /metrics (to free()), or NULL. */
char *efs_cl_metrics_text(struct efs_cl *c, int i);
/* syncfs on every mounted node, then a wait past the second for which
 * etcfs caches the group counts statfs sums. */
void efs_cl_sync_all(struct efs_cl *c);
/* The free bytes node1's statvfs counts (every group's free count). */
unsigned long long efs_cl_free_bytes(struct efs_cl *c);
/* Waits up to |ms| for the free count to reach |want| (else fails, naming
 * |what|); the time taken. */
unsigned long long efs_cl_wait_free(struct efs_cl *c, unsigned long long want, uint64_t ms,
				    const char *what);
/* The last |max| bytes of node |i|'s log in |buf|. */
void efs_cl_log_tail(struct efs_cl *c, int i, char *buf, size_t max);
