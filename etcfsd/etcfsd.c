/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcfsd: the per-host daemon, one per host and filesystem.
 *
 * Start: the identity check runs first with a blocking client (nothing is
 * written before the device and its keyspace agree), then everything lives
 * on one libuv loop: the asynchronous etcd client, the session, the lock
 * cache, the metrics server, the filesystem and the FUSE session pumped by
 * lib/kchan/fuseloop. Without -f the process forks before any loop or thread
 * exists; the child does all the work and tells the waiting parent through a
 * pipe either "ready" (mounted, and the kernel's INIT answered) or the error text, and
 * the parent exits 0 or 1 with it.
 *
 * Leave (SIGTERM, SIGINT, or the kernel ending the session on umount):
 * stop reading requests, let the ones in flight finish (bounded), release
 * every lock, revoke the session lease, unmount, free, exit 0. A start
 * that fails after the session was registered leaves the same way.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <uv.h>

#include "cli.h"
#include "alloc/alloc.h"
#include "config.h"
#include "etcd/etcd.h"
#include "etcd/kv.h"
#include "etcd/sync.h"
#include "etcd/txn.h"
#include "etcd/watch.h"
#include "maint/capacity.h"
#include "fs/fs.h"
#include "dev/iopool.h"
#include "maint/maint.h"
#include "kchan/fuseio.h"
#include "kchan/fuseloop.h"
#include "kchan/inval.h"
#include "lock/lock.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "meta/sb.h"
#include "util/clock.h"
#include "util/httpd.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/metrics.h"

static const char *prog = "etcfsd";

/* Bounds of the leave: in-flight requests, then the whole leave. */
#define DRAIN_TIMEOUT_MS 10000
#define LEAVE_TIMEOUT_MS 20000
/* The mount must answer stat() within this at start. */
#define READY_TIMEOUT_MS 30000
/* Loop lag probe. */
#define LAG_INTERVAL_MS 100
/* Space and inode usage poll (etcfs_fs_* gauges). */
#define USAGE_INTERVAL_MS 30000
/* Publication requests answered by one publication (more wait for the next). */
#define SYNC_IDS_MAX 16
#define BK_PROBE_MS 1000 /* the backup guard's reads of pin/backup. */
/* Allocation groups' free counts read per transaction by the poll. */
#define USAGE_GROUPS_PER_TXN 100
/* etcd client counters exported (register_metrics, sync_counters). */
#define EFS_NETCD_COUNTERS 7

enum phase {
	PH_STARTING, /* session registering */
	PH_MOUNTING, /* mounted, waiting for the first stat() to answer */
	PH_RUNNING,
	PH_LEAVING,
	PH_DONE,
};

struct stat_counters {
	struct efs_counter *c;
	uint64_t last;
};

struct state_gauge {
	struct daemon *d;
	enum efs_session_state st;
};

/* Lock cache counters exported (register_metrics, sync_counters). */
#define EFS_NLOCK_COUNTERS 19

struct daemon {
	/* options */
	struct efs_cli_etcd etcd_cfg;
	char *device;	  /* realpath */
	char *mountpoint; /* realpath */
	char node[EFS_META_NODE_MAX + 1];
	int64_t session_ttl_s;
	uint32_t quorum_timeout_ms; /* --quorum-timeout (0: the session default) */
	uint64_t etcd_quota;	     /* --etcd-quota (0: etcd's default, 2 GiB) */
	char *metrics_addr;  /* owned */
	char *user_fuse_opts; /* -o text to pass to libfuse (without ours) */
	char *fsname_opt;     /* fsname= given by the user, or NULL */
	char *subtype_opt;    /* subtype= given by the user, or NULL */
	bool foreground;
	bool log_level_set;
	bool read_only;
	bool ro_forced; /* read-only because of unknown ro_compat features */
	bool noatime;
	bool cow; /* -o cow; -o nocow (the default): overwrites in place */
	bool delegate; /* -o delegate: creates committed in batches (fs/batch.c) */
	char *log_file; /* owned */

	struct efs_capacity *capacity;
	struct efs_maint *maint; /* etcd compaction when elected (not with -o ro) */
	uint32_t compact_interval_ms;
	int64_t compact_retain;

	/* the start handshake with the parent (background mode) */
	int ready_fd;
	bool ready;

	/* what the sync check found */
	struct efs_cli_device dev;
	bool dev_open;
	int data_fd; /* the device for data I/O (O_DIRECT where possible), -1: none */
	bool data_direct;
	uint32_t flush_interval_ms;
	uint32_t batch_ms; /* --delegate-batch-ms */
	uint32_t recall_bound_s;
	uint32_t max_cached_files; /* --max-cached-files (0: the fs default) */
	uint32_t max_hold_ms;	    /* efs_lockcache_opts values (0: the default) */
	uint32_t contended_recalls;
	uint32_t dead_grace_s; /* --dead-grace (0: the default) */
	bool cache_timeout_set;	  /* --cache-timeout given */
	uint32_t cache_timeout_ms;
	uint32_t io_threads;
	struct efs_sb sb;
	unsigned sb_flags;
	Etcfs__FsInfo *fi;
	struct efs_meta_ns ns;

	/* the loop and its residents */
	uv_loop_t loop;
	bool loop_init;
	struct efs_etcd *etcd;
	bool etcd_freed;
	struct efs_metrics *metrics;
	struct efs_httpd *httpd;
	bool httpd_stopped;
	struct efs_session *session;
	struct efs_lockcache *locks;
	struct efs_fs *fs;
	struct fuse_session *se;
	bool mounted;
	struct efs_fuseloop *fl;

	uv_signal_t sig_term, sig_int;
	uv_timer_t lag_timer;
	uv_timer_t drain_timer;
	uv_timer_t leave_timer;
	uv_timer_t ready_timer;
	uv_timer_t teardown_timer;
	bool handles_init;
	uv_timer_t ready_poll;

	enum phase phase;
	bool want_leave;
	const char *leave_reason;
	uint64_t drain_start_ms;
	int exit_code;

	/* metrics owned here */
	struct efs_histogram *m_lag;
	struct efs_histogram *m_recall_wait; /* our recall key created -> grant */
	struct efs_histogram *m_handover;    /* a peer's forced release asked -> done */
	struct efs_gauge *m_lag_last;
	struct stat_counters m_sess[5];
	struct stat_counters m_etcd[EFS_NETCD_COUNTERS];
	struct efs_histogram *m_rpc[EFS_ETCD_NMETHODS];
	struct efs_counter *m_rpc_err[EFS_ETCD_NMETHODS];

	/* the usage poll (loop thread only) */
	uv_timer_t usage_timer;
	bool usage_busy;
	uint32_t usage_next_group;
	uint64_t usage_free_sum;
	uint64_t usage_free_blocks; /* of the last complete poll */
	int64_t usage_inodes;	    /* of the last complete poll, -1: none yet */
	uint64_t usage_done_ns;	    /* mono time of the last complete poll */
	struct skew_round *skew;    /* the clock probe in flight, or NULL */
	/* publication requests (sync/<id>; loop thread only) */
	struct efs_etcd_watch_stream *sync_ws;
	struct efs_etcd_watcher *sync_w;
	bool sync_busy; /* a publication for the requests in sync_cur runs */
	uint32_t sync_ncur, sync_nnext;
	char sync_cur[SYNC_IDS_MAX][EFS_META_NODE_MAX + 1];
	char sync_next[SYNC_IDS_MAX][EFS_META_NODE_MAX + 1];
	/* The backup guard: in-place overwrites stopped (one
	 * efs_fs_inplace_stop held) from a publication request until a read
	 * of pin/backup. issued after the last request finds none. */
	bool bk_guard;
	bool bk_probe_busy;
	uint64_t bk_gen; /* bumped by every request and the start */
	uint64_t bk_probe_gen; /* bk_gen when the read in flight was sent */
	uv_timer_t bk_timer;
	double skew_s;		    /* this node's clock minus the cluster's median */
	uint32_t skew_peers;	    /* peers the last round measured */
	struct stat_counters m_lock[EFS_NLOCK_COUNTERS];
	struct efs_counter *m_fuse_requests;
	uint64_t fuse_requests_last;
	struct state_gauge state_gauges[6];
	uint64_t lag_prev_ms;
};

/* ---- Service manager notifications (sd_notify protocol, no libsystemd) ---- */

/*
 * $NOTIFY_SOCKET names an AF_UNIX datagram socket (a path, or an abstract
 * name written with a leading '@'); each message is one datagram of
 * newline-separated VAR=VALUE lines (sd_notify(3)). Opened once at start
 * (before the fork: the child keeps it); without the variable every
 * notification is a no-op. Loop thread only after start.
 */
static struct {
	int fd;
	struct sockaddr_un addr;
	socklen_t len;
	uint64_t watchdog_ms; /* $WATCHDOG_USEC / 2000: send WATCHDOG=1 this often */
	uint64_t watchdog_last_ms;
} notify_sock = {.fd = -1};

static void notify_open(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	const char *wd = getenv("WATCHDOG_USEC");
	const char *wd_pid = getenv("WATCHDOG_PID");
	size_t n;

	if (!path || !path[0] || (path[0] != '/' && path[0] != '@'))
		return;
	n = strlen(path);
	if (n >= sizeof(notify_sock.addr.sun_path))
		return;
	notify_sock.addr.sun_family = AF_UNIX;
	memcpy(notify_sock.addr.sun_path, path, n);
	if (path[0] == '@')
		notify_sock.addr.sun_path[0] = '\0';
	notify_sock.len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
				      (path[0] == '/' ? 1 : 0));
	notify_sock.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (wd && wd[0] && (!wd_pid || strtol(wd_pid, NULL, 10) == (long)getpid())) {
		unsigned long long us = strtoull(wd, NULL, 10);

		if (us >= 2000)
			notify_sock.watchdog_ms = us / 2000;
	}
}

/* Sends one notification ("READY=1\nSTATUS=..."); best effort. */
static void notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void notify(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	int n;

	if (notify_sock.fd < 0)
		return;
	va_start(ap, fmt);
	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (n <= 0)
		return;
	if ((size_t)n >= sizeof(msg))
		n = sizeof(msg) - 1;
	if (sendto(notify_sock.fd, msg, (size_t)n, MSG_NOSIGNAL,
		   (const struct sockaddr *)&notify_sock.addr, notify_sock.len) < 0)
		efs_log_debug("sd_notify: %s", strerror(errno));
}

/* ---- Messages ---- */

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: %s [options] DEVICE MOUNTPOINT\n"
		"Mounts the etcfs filesystem on DEVICE (a block device or a regular file)\n"
		"at MOUNTPOINT. Without -f it returns once the mount answers and keeps\n"
		"serving in the background.\n"
		"\n"
		"Options:\n"
		"  -f, --foreground         stay in the foreground (logs on stderr)\n"
		"  --node-id ID             this node's name (default: the hostname,\n"
		"                           reduced to [A-Za-z0-9._-])\n"
		"  --session-ttl SECONDS    session lease TTL (default 2)\n"
		"  --quorum-timeout SECONDS how long operations wait for etcd while the\n"
		"                           session is suspended before failing with EIO\n"
		"                           (default 30)\n"
		"  --etcd-quota SIZE        the etcd cluster's --quota-backend-bytes\n"
		"                           (bytes, or with K/M/G; default 2G): metadata\n"
		"                           growth is refused with ENOSPC near it\n"
		"  --flush-interval MS      publish written extents, sizes and times at\n"
		"                           least this often (default 1000; fsync and\n"
		"                           O_SYNC publish at once)\n"
		"  --delegate-batch-ms MS   with -o delegate: a batch of creates commits\n"
		"                           this long after its first change at the latest\n"
		"                           (default 20; fsync, fsyncdir and a peer's recall\n"
		"                           commit it at once)\n"
		"  --io-threads N           device I/O worker threads (default 16)\n"
		"  --cache-timeout MS       how long the kernel may cache entries and\n"
		"                           attributes under a held lock (0 to TTL/4 s;\n"
		"                           default TTL/4, at most 1000)\n"
		"  --max-cached-files N     files whose pages the kernel may cache at once\n"
		"                           (16 to 4194304; default 16384): a suspended\n"
		"                           session drops them all before its deadline\n"
		"  --recall-bound SECONDS   log and count (etcfs_lock_recalls_unanswered_total)\n"
		"                           a peer's recall this node has not answered\n"
		"                           after this long (default 30)\n"
		"  --max-hold MS            the longest minimum hold of a lock peers recall\n"
		"                           while it is in use (0 to 1000; 0: none; default 20)\n"
		"  --contended-recalls N    recalls of one lock within 1 s that make it\n"
		"                           contended: no hold, no kernel caching (0: never;\n"
		"                           default 16)\n"
		"  --dead-grace SECONDS     a dead node's groups, free intents and files\n"
		"                           taken over wait this long before reuse (default\n"
		"                           300; groups handed back at a clean leave and a\n"
		"                           restart's own groups do not wait)\n"
		"  --compact-interval SECONDS  when elected, compact etcd's history this\n"
		"                           often (default 60)\n"
		"  --compact-retain N       revisions kept behind the current one\n"
		"                           (default 1000)\n"
		"  --metrics-addr HOST:PORT serve Prometheus metrics on /metrics\n"
		"                           (\":PORT\" listens on 127.0.0.1; port 0 picks one)\n"
		"  -o OPT[,OPT...]          mount options: ro, rw, noatime, cow, allow_other,\n"
		"                           nosuid, nodev, noexec, fsname=, subtype=, ... (passed\n"
		"                           to FUSE; default_permissions is always on); cow:\n"
		"                           overwrites go to fresh blocks, never in place\n"
		"                           (default nocow: overwrites in place); delegate:\n"
		"                           creates in a directory this node holds are\n"
		"                           answered at once and committed in batches\n"
		"                           (durable at fsync/fsyncdir; default nodelegate)\n"
		"  --log-level LEVEL        err, warn, info (default), debug\n"
		"  --log-file FILE          append logs to FILE once in the background\n"
		"                           (default: discarded)\n"
		"  --config FILE            read settings from FILE instead of\n"
		"                           $ETCFS_CONFIG or " EFS_CLI_CONFIG_FILE "\n"
		"                           (which may be missing; FILE must exist)\n"
		"  -h, --help               this text\n"
		"  -V, --version            print the version\n"
		"\n"
		"%s"
		"\n",
		prog, efs_cli_etcd_usage());
	fputs("Every option above except --config, --help and --version may be set in\n"
		"the configuration file as 'name = value' (the long name without dashes:\n"
		"'session-ttl = 5', 'foreground = yes', 'options = noatime' for -o) and\n"
		"in the environment as ETCFS_<NAME> (ETCFS_SESSION_TTL=5,\n"
		"ETCFS_METRICS_ADDR=:9436). Precedence: command line, then environment,\n"
		"then file, then the defaults. An unknown key or a bad value in the file\n"
		"is an error naming FILE:LINE.\n"
		"\n"
		"Under systemd: with $NOTIFY_SOCKET set (Type=notify) etcfsd sends\n"
		"READY=1 once the mount serves, STATUS= lines and STOPPING=1 when it\n"
		"leaves (MAINPID= when it forks; run it with -f under systemd); with\n"
		"$WATCHDOG_USEC, WATCHDOG=1 from its event loop. When stderr is the\n"
		"journal ($JOURNAL_STREAM) log lines carry <N> priority prefixes.\n"
		"--metrics-addr also serves /healthz (200 while the event loop runs)\n"
		"and /readyz (200 only while the mount serves with an active session,\n"
		"503 and the reason otherwise).\n"
		"\n"
		"SIGTERM, SIGINT or umount leave cleanly: locks are released and the\n"
		"session lease revoked, so other nodes proceed at once.\n",
	      out);
}

/*
 * A start failure: to the waiting parent in background mode (which prints
 * it), to stderr otherwise. Only the first one is reported.
 */
static void report_error(struct daemon *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void report_error(struct daemon *d, const char *fmt, ...)
{
	char msg[EFS_CLI_ERR_MAX + 256];
	va_list ap;
	int n;

	if (d->ready)
		return;
	va_start(ap, fmt);
	n = vsnprintf(msg, sizeof(msg) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof(msg) - 2)
		n = sizeof(msg) - 2;
	notify("STATUS=failed to start: %.*s", n, msg);
	if (d->ready_fd >= 0) {
		(void)!write(d->ready_fd, msg, (size_t)n);
		close(d->ready_fd);
		d->ready_fd = -1;
	} else {
		fprintf(stderr, "%s: %s\n", prog, msg);
	}
	d->ready = true; /* nothing more to report */
	d->exit_code = 1;
}

/* The mount answers: release the parent and detach from its terminal. */
static void report_ready(struct daemon *d)
{
	int null;

	if (d->ready)
		return;
	d->ready = true;
	if (d->ready_fd < 0)
		return;
	(void)!write(d->ready_fd, "ok", 2);
	close(d->ready_fd);
	d->ready_fd = -1;
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		close(null);
	}
	if (d->log_file) {
		int fd = open(d->log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);

		if (fd >= 0) {
			dup2(fd, STDERR_FILENO);
			close(fd);
		}
	}
	efs_log_detect_journal();
}

/*
 * Background mode: the parent waits for the child's word and exits with
 * it; the child returns and carries on. Runs before any thread or loop
 * exists, so the child inherits nothing half-made.
 */
static int daemonize(struct daemon *d)
{
	char msg[EFS_CLI_ERR_MAX + 256];
	size_t len = 0;
	int p[2], st;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0) {
		fprintf(stderr, "%s: pipe: %s\n", prog, strerror(errno));
		return -errno;
	}
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "%s: fork: %s\n", prog, strerror(errno));
		close(p[0]);
		close(p[1]);
		return -errno;
	}
	if (pid == 0) {
		close(p[0]);
		d->ready_fd = p[1];
		setsid();
		return 0;
	}
	close(p[1]);
	for (;;) {
		ssize_t n = read(p[0], msg + len, sizeof(msg) - 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		if (len == sizeof(msg) - 1)
			break;
	}
	close(p[0]);
	msg[len] = '\0';
	if (strcmp(msg, "ok") == 0)
		exit(0);
	if (len) {
		fprintf(stderr, "%s: %s\n", prog, msg);
		/* The child exits right after reporting. */
		waitpid(pid, &st, 0);
		exit(1);
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(st))
		fprintf(stderr, "%s: the daemon died during start (signal %d)\n", prog,
			WTERMSIG(st));
	else
		fprintf(stderr, "%s: the daemon exited during start (status %d)\n", prog,
			WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	exit(1);
}

/* ---- Options ---- */

/* The hostname reduced to a valid node id. */
static void default_node(char out[EFS_META_NODE_MAX + 1])
{
	char host[256] = "";
	size_t n = 0;

	if (gethostname(host, sizeof(host) - 1) < 0)
		host[0] = '\0';
	host[sizeof(host) - 1] = '\0';
	for (const char *p = host; *p && n < EFS_META_NODE_MAX; p++) {
		char c = *p;
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			  c == '.' || c == '_' || c == '-';

		out[n++] = ok ? c : '-';
	}
	out[n] = '\0';
	if (!efs_meta_node_is_valid(out))
		snprintf(out, EFS_META_NODE_MAX + 1, "node");
}

/* Appends "opt" to the comma-separated list *|list|. */
static int opt_append(char **list, const char *opt, size_t len)
{
	size_t old = *list ? strlen(*list) : 0;
	char *n = efs_mem_realloc(*list, old + len + 2);

	if (!n)
		return -ENOMEM;
	if (old)
		n[old++] = ',';
	memcpy(n + old, opt, len);
	n[old + len] = '\0';
	*list = n;
	return 0;
}

static bool opt_is(const char *opt, size_t len, const char *name)
{
	return strlen(name) == len && memcmp(opt, name, len) == 0;
}

static bool opt_has_prefix(const char *opt, size_t len, const char *prefix)
{
	size_t pl = strlen(prefix);

	return len >= pl && memcmp(opt, prefix, pl) == 0;
}

/*
 * One -o argument. What the filesystem needs to know (ro, noatime) is
 * noted and still handed to FUSE (it sets the kernel's mount flags);
 * mount(8)'s own options are dropped; the rest goes to libfuse, which
 * rejects what it does not know.
 */
static int parse_mount_opts(struct daemon *d, const char *arg)
{
	static const char *const ignored[] = {"defaults", "_netdev", "nofail", "auto", "noauto",
					      "user",	  "users",   "nouser", "owner", "group",
					      "default_permissions"};
	const char *p = arg;
	int r;

	while (*p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		bool skip = len == 0;

		for (size_t i = 0; !skip && i < sizeof(ignored) / sizeof(ignored[0]); i++)
			skip = opt_is(p, len, ignored[i]);
		if (!skip && (opt_has_prefix(p, len, "x-") || opt_has_prefix(p, len, "comment=")))
			skip = true;
		if (!skip && opt_is(p, len, "ro"))
			d->read_only = true;
		else if (!skip && opt_is(p, len, "rw"))
			d->read_only = false;
		else if (!skip && opt_is(p, len, "noatime"))
			d->noatime = true;
		else if (!skip && (opt_is(p, len, "atime") || opt_is(p, len, "relatime") ||
				   opt_is(p, len, "strictatime")))
			d->noatime = false;
		if (!skip && (opt_is(p, len, "cow") || opt_is(p, len, "nocow"))) {
			/* Ours alone: FUSE would reject it. */
			d->cow = opt_is(p, len, "cow");
			skip = true;
		}
		if (!skip && (opt_is(p, len, "delegate") || opt_is(p, len, "nodelegate"))) {
			d->delegate = opt_is(p, len, "delegate");
			skip = true;
		}
		if (!skip && opt_has_prefix(p, len, "fsname=")) {
			efs_mem_free(d->fsname_opt);
			d->fsname_opt = efs_mem_strndup(p, len);
			if (!d->fsname_opt)
				return -ENOMEM;
			skip = true;
		} else if (!skip && opt_has_prefix(p, len, "subtype=")) {
			efs_mem_free(d->subtype_opt);
			d->subtype_opt = efs_mem_strndup(p, len);
			if (!d->subtype_opt)
				return -ENOMEM;
			skip = true;
		}
		if (!skip) {
			r = opt_append(&d->user_fuse_opts, p, len);
			if (r < 0)
				return r;
		}
		p += len;
		if (*p == ',')
			p++;
	}
	return 0;
}

enum {
	OPT_NODE_ID = 0x100,
	OPT_SESSION_TTL,
	OPT_QUORUM_TIMEOUT,
	OPT_ETCD_QUOTA,
	OPT_METRICS_ADDR,
	OPT_LOG_LEVEL,
	OPT_LOG_FILE,
	OPT_FLUSH_INTERVAL,
	OPT_BATCH_MS,
	OPT_RECALL_BOUND,
	OPT_MAX_CACHED_FILES,
	OPT_MAX_HOLD,
	OPT_CONTENDED_RECALLS,
	OPT_DEAD_GRACE,
	OPT_CACHE_TIMEOUT,
	OPT_IO_THREADS,
	OPT_COMPACT_INTERVAL,
	OPT_COMPACT_RETAIN,
	OPT_CONFIG,
	OPT_ETCD, /* every etcd option: the name comes from the table */
};

/*
 * Every option. Those with an argument, and --foreground, may also come
 * from the configuration file (the name as key) and from ETCFS_<NAME>;
 * --config, --help and --version only from the command line. -o is
 * "options" there (and --options here).
 */
static const struct option longopts[] = {
	{"foreground", no_argument, NULL, 'f'},
	{"help", no_argument, NULL, 'h'},
	{"version", no_argument, NULL, 'V'},
	{"config", required_argument, NULL, OPT_CONFIG},
	{"options", required_argument, NULL, 'o'},
	{"node-id", required_argument, NULL, OPT_NODE_ID},
	{"session-ttl", required_argument, NULL, OPT_SESSION_TTL},
	{"quorum-timeout", required_argument, NULL, OPT_QUORUM_TIMEOUT},
	{"etcd-quota", required_argument, NULL, OPT_ETCD_QUOTA},
	{"metrics-addr", required_argument, NULL, OPT_METRICS_ADDR},
	{"log-level", required_argument, NULL, OPT_LOG_LEVEL},
	{"log-file", required_argument, NULL, OPT_LOG_FILE},
	{"flush-interval", required_argument, NULL, OPT_FLUSH_INTERVAL},
	{"delegate-batch-ms", required_argument, NULL, OPT_BATCH_MS},
	{"recall-bound", required_argument, NULL, OPT_RECALL_BOUND},
	{"max-cached-files", required_argument, NULL, OPT_MAX_CACHED_FILES},
	{"max-hold", required_argument, NULL, OPT_MAX_HOLD},
	{"contended-recalls", required_argument, NULL, OPT_CONTENDED_RECALLS},
	{"dead-grace", required_argument, NULL, OPT_DEAD_GRACE},
	{"cache-timeout", required_argument, NULL, OPT_CACHE_TIMEOUT},
	{"io-threads", required_argument, NULL, OPT_IO_THREADS},
	{"compact-interval", required_argument, NULL, OPT_COMPACT_INTERVAL},
	{"compact-retain", required_argument, NULL, OPT_COMPACT_RETAIN},
	{"endpoints", required_argument, NULL, OPT_ETCD},
	{"cacert", required_argument, NULL, OPT_ETCD},
	{"cert", required_argument, NULL, OPT_ETCD},
	{"key", required_argument, NULL, OPT_ETCD},
	{"user", required_argument, NULL, OPT_ETCD},
	{"password", required_argument, NULL, OPT_ETCD},
	{"dial-timeout", required_argument, NULL, OPT_ETCD},
	{"command-timeout", required_argument, NULL, OPT_ETCD},
	{NULL, 0, NULL, 0},
};

#define NLONGOPTS (sizeof(longopts) / sizeof(longopts[0]) - 1)

static void opt_err(char *err, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void opt_err(char *err, size_t size, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, size, fmt, ap);
	va_end(ap);
}

/* An integer option's value in [lo, hi] (|what|: "seconds", "a number"):
 * 0, or -EINVAL with the reason in |err|. */
static int int_opt(const char *arg, const char *what, long long lo, long long hi,
		   long long *ret, char *err, size_t err_size)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(arg, &end, 10);
	if (errno || end == arg || *end || v < lo || v > hi) {
		opt_err(err, err_size, "'%s': %s from %lld to %lld", arg, what, lo, hi);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

/* "1/yes/true/on" or "0/no/false/off" (a switch from the file or the
 * environment): 0, or -EINVAL. */
static int bool_opt(const char *arg, bool *ret, char *err, size_t err_size)
{
	static const char *const yes[] = {"1", "yes", "true", "on"};
	static const char *const no[] = {"0", "no", "false", "off"};

	for (size_t i = 0; i < 4; i++) {
		if (!strcasecmp(arg, yes[i]) || !strcasecmp(arg, no[i])) {
			*ret = !strcasecmp(arg, yes[i]);
			return 0;
		}
	}
	opt_err(err, err_size, "'%s': use yes or no", arg);
	return -EINVAL;
}

static int set_owned(char **dst, const char *val)
{
	char *v = efs_mem_strdup(val);

	if (!v)
		return -ENOMEM;
	efs_mem_free(*dst);
	*dst = v;
	return 0;
}

/*
 * Applies option |c| (its getopt value) named |name| with |arg| (NULL for
 * a switch given on the command line), wherever it came from: 0, or
 * -EINVAL with the reason in |err|, or -ENOMEM.
 */
static int apply_opt(struct daemon *d, int c, const char *name, const char *arg, char *err,
		     size_t err_size)
{
	enum efs_log_level level;
	long long num;
	bool b;
	int r;

	switch (c) {
	case 'f':
		if (!arg) {
			d->foreground = true;
			return 0;
		}
		if (bool_opt(arg, &b, err, err_size) < 0)
			return -EINVAL;
		d->foreground = b;
		return 0;
	case 'o':
		r = parse_mount_opts(d, arg);
		if (r < 0)
			opt_err(err, err_size, "'%s': %s", arg, strerror(-r));
		return r;
	case OPT_NODE_ID:
		if (!efs_meta_node_is_valid(arg)) {
			opt_err(err, err_size, "'%s': use 1 to %d characters of [A-Za-z0-9._-]",
				arg, EFS_META_NODE_MAX);
			return -EINVAL;
		}
		snprintf(d->node, sizeof(d->node), "%s", arg);
		return 0;
	case OPT_SESSION_TTL:
		if (int_opt(arg, "seconds", 1, 3600, &num, err, err_size) < 0)
			return -EINVAL;
		d->session_ttl_s = num;
		return 0;
	case OPT_QUORUM_TIMEOUT:
		if (int_opt(arg, "seconds", 1, 86400, &num, err, err_size) < 0)
			return -EINVAL;
		d->quorum_timeout_ms = (uint32_t)num * 1000u;
		return 0;
	case OPT_ETCD_QUOTA: {
		char *end;
		unsigned long long v;
		unsigned shift = 0;

		errno = 0;
		v = strtoull(arg, &end, 10);
		if (*end == 'K' || *end == 'k')
			shift = 10;
		else if (*end == 'M' || *end == 'm')
			shift = 20;
		else if (*end == 'G' || *end == 'g')
			shift = 30;
		if (shift)
			end++;
		if (errno || end == arg || *end || arg[0] == '-' || v == 0 ||
		    v > (UINT64_C(1) << 40) >> shift) {
			opt_err(err, err_size, "'%s': a size from 1 to 1T (K, M, G suffixes)", arg);
			return -EINVAL;
		}
		d->etcd_quota = (uint64_t)v << shift;
		return 0;
	}
	case OPT_METRICS_ADDR:
		return set_owned(&d->metrics_addr, arg);
	case OPT_CACHE_TIMEOUT:
		if (int_opt(arg, "milliseconds", 0, 1000, &num, err, err_size) < 0)
			return -EINVAL;
		d->cache_timeout_ms = (uint32_t)num;
		d->cache_timeout_set = true;
		return 0;
	case OPT_MAX_CACHED_FILES:
		if (int_opt(arg, "files", 16, 1 << 22, &num, err, err_size) < 0)
			return -EINVAL;
		d->max_cached_files = (uint32_t)num;
		return 0;
	case OPT_RECALL_BOUND:
		if (int_opt(arg, "seconds", 1, 3600, &num, err, err_size) < 0)
			return -EINVAL;
		d->recall_bound_s = (uint32_t)num;
		return 0;
	case OPT_MAX_HOLD:
		if (int_opt(arg, "milliseconds", 0, 1000, &num, err, err_size) < 0)
			return -EINVAL;
		d->max_hold_ms = num ? (uint32_t)num : EFS_LOCK_HOLD_OFF;
		return 0;
	case OPT_CONTENDED_RECALLS:
		if (int_opt(arg, "a number", 0, 100000, &num, err, err_size) < 0)
			return -EINVAL;
		d->contended_recalls = num ? (uint32_t)num : EFS_LOCK_HOLD_OFF;
		return 0;
	case OPT_DEAD_GRACE:
		if (int_opt(arg, "seconds", 1, 86400, &num, err, err_size) < 0)
			return -EINVAL;
		d->dead_grace_s = (uint32_t)num;
		return 0;
	case OPT_FLUSH_INTERVAL:
		if (int_opt(arg, "a number", 10, 600000, &num, err, err_size) < 0)
			return -EINVAL;
		d->flush_interval_ms = (uint32_t)num;
		return 0;
	case OPT_BATCH_MS:
		if (int_opt(arg, "a number", 1, 600000, &num, err, err_size) < 0)
			return -EINVAL;
		d->batch_ms = (uint32_t)num;
		return 0;
	case OPT_IO_THREADS:
		if (int_opt(arg, "a number", 1, 256, &num, err, err_size) < 0)
			return -EINVAL;
		d->io_threads = (uint32_t)num;
		return 0;
	case OPT_COMPACT_INTERVAL:
		if (int_opt(arg, "a number", 1, 86400, &num, err, err_size) < 0)
			return -EINVAL;
		d->compact_interval_ms = (uint32_t)num * 1000u;
		return 0;
	case OPT_COMPACT_RETAIN:
		if (int_opt(arg, "a number", 1, 1000000000, &num, err, err_size) < 0)
			return -EINVAL;
		d->compact_retain = num;
		return 0;
	case OPT_LOG_LEVEL:
		if (efs_log_parse_level(arg, &level) < 0) {
			opt_err(err, err_size, "'%s': use err, warn, info or debug", arg);
			return -EINVAL;
		}
		efs_log_set_level(level);
		d->log_level_set = true;
		return 0;
	case OPT_LOG_FILE:
		return set_owned(&d->log_file, arg);
	case OPT_ETCD:
		r = efs_cli_etcd_option(&d->etcd_cfg, name, arg, err, err_size);
		if (r == 0) {
			opt_err(err, err_size, "invalid value");
			return -EINVAL;
		}
		return r < 0 ? r : 0;
	default:
		opt_err(err, err_size, "not an option");
		return -EINVAL;
	}
}

/* A setting of the file or the environment: see efs_cli_option_cb. */
static int config_option(void *arg, const char *name, const char *value, char *err,
			 size_t err_size)
{
	for (size_t i = 0; i < NLONGOPTS; i++) {
		int c = longopts[i].val;
		int r;

		if (strcmp(longopts[i].name, name))
			continue;
		if (c == 'h' || c == 'V' || c == OPT_CONFIG)
			return 0;
		r = apply_opt(arg, c, name, value, err, err_size);
		return r < 0 ? r : 1;
	}
	return 0;
}

/* The names the environment may set (ETCFS_<NAME>), NULL-terminated. */
static const char *const *env_names(void)
{
	static const char *names[NLONGOPTS + 1];
	size_t n = 0;

	if (names[0])
		return names;
	for (size_t i = 0; i < NLONGOPTS; i++) {
		int c = longopts[i].val;

		if (c != 'h' && c != 'V' && c != OPT_CONFIG)
			names[n++] = longopts[i].name;
	}
	names[n] = NULL;
	return names;
}

/* The --config argument, looked for before anything else is parsed. */
static const char *find_config_arg(int argc, char **argv)
{
	const char *path = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			break;
		if (!strcmp(argv[i], "--config") && i + 1 < argc)
			path = argv[++i];
		else if (!strncmp(argv[i], "--config=", 9))
			path = argv[i] + 9;
	}
	return path;
}

/* 0 to go on, 1 to exit 0 now (help, version), -EINVAL after a message. */
static int parse_args(struct daemon *d, int argc, char **argv)
{
	const char *config = find_config_arg(argc, argv);
	char err[EFS_CLI_ERR_MAX + 128];
	int c, idx, r;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 1;
		}
		if (!strcmp(argv[i], "--"))
			break;
	}
	/* The file, then the environment; the command line below wins. */
	efs_cli_etcd_init(&d->etcd_cfg);
	err[0] = '\0';
	r = efs_cli_config_load(efs_cli_config_path(config), config != NULL, env_names(),
				config_option, d, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "%s: %s\n", prog, err[0] ? err : strerror(-r));
		return -EINVAL;
	}
	while ((c = getopt_long(argc, argv, "fhVo:", longopts, &idx)) != -1) {
		const char *name = NULL;

		switch (c) {
		case 'h':
			usage(stdout);
			return 1;
		case 'V':
			printf("etcfsd %s\n", ETCFS_VERSION);
			return 1;
		case OPT_CONFIG:
			continue;
		case '?':
			usage(stderr);
			return -EINVAL;
		case 'f':
			name = "foreground";
			break;
		case 'o':
			name = "o";
			break;
		default:
			for (size_t i = 0; i < NLONGOPTS && !name; i++)
				if (longopts[i].val == c)
					name = longopts[i].name;
			if (c == OPT_ETCD)
				name = longopts[idx].name;
			break;
		}
		err[0] = '\0';
		r = apply_opt(d, c, name, c == 'f' ? NULL : optarg, err, sizeof(err));
		if (r < 0) {
			fprintf(stderr, "%s: %s%s: %s\n", prog, strlen(name) > 1 ? "--" : "-", name,
				err[0] ? err : strerror(-r));
			return -EINVAL;
		}
	}
	if (argc - optind != 2) {
		fprintf(stderr, "%s: expected DEVICE and MOUNTPOINT\n", prog);
		usage(stderr);
		return -EINVAL;
	}
	if (!d->node[0])
		default_node(d->node);
	/* Resolved now: the background daemon changes to / before serving. */
	d->device = realpath(argv[optind], NULL);
	if (!d->device) {
		fprintf(stderr, "%s: %s: %s\n", prog, argv[optind], strerror(errno));
		return -EINVAL;
	}
	d->mountpoint = realpath(argv[optind + 1], NULL);
	if (!d->mountpoint) {
		fprintf(stderr, "%s: mount point %s: %s\n", prog, argv[optind + 1],
			strerror(errno));
		return -EINVAL;
	}
	return 0;
}

/* ---- The identity check (blocking, before the loop) ---- */

static char *fuse_opt_string(struct daemon *d);

/*
 * libfuse parses the options only when the session is made, which is
 * after the node registered; a session without handlers, made and dropped
 * here, rejects a bad option before anything happens (libfuse names it on
 * stderr).
 */
static int check_fuse_opts(struct daemon *d)
{
	static const struct fuse_lowlevel_ops none;
	struct fuse_session *se;
	struct fuse_args args;
	char *fargv[4];
	char *opts;

	opts = fuse_opt_string(d);
	if (!opts) {
		report_error(d, "mount options: %s", strerror(ENOMEM));
		return -ENOMEM;
	}
	fargv[0] = (char *)prog;
	fargv[1] = (char *)"-o";
	fargv[2] = opts;
	fargv[3] = NULL;
	args = (struct fuse_args)FUSE_ARGS_INIT(3, fargv);
	se = fuse_session_new(&args, &none, sizeof(none), NULL);
	fuse_opt_free_args(&args);
	if (!se) {
		report_error(d, "invalid mount options '%s'", opts);
		efs_mem_free(opts);
		return -EINVAL;
	}
	fuse_session_destroy(se);
	efs_mem_free(opts);
	return 0;
}

static int check_device(struct daemon *d)
{
	struct efs_etcd_sync *s = NULL;
	char err[EFS_CLI_ERR_MAX];
	int r;

	err[0] = '\0';
	r = efs_cli_device_open(d->device, !d->read_only, &d->dev, err, sizeof(err));
	if (r < 0) {
		report_error(d, "%s", err[0] ? err : strerror(-r));
		return r;
	}
	d->dev_open = true;

	err[0] = '\0';
	r = efs_cli_etcd_connect(&d->etcd_cfg, &s, err, sizeof(err));
	if (r < 0) {
		report_error(d, "%s", err[0] ? err : strerror(-r));
		return r;
	}
	err[0] = '\0';
	r = efs_cli_check_fs(s, &d->dev, &d->sb, &d->sb_flags, &d->fi, err, sizeof(err));
	efs_etcd_sync_free(s);
	if (r < 0) {
		report_error(d, "%s", err[0] ? err : strerror(-r));
		return r;
	}
	if ((d->sb_flags & EFS_SB_MOUNT_READ_ONLY) && !d->read_only) {
		/* Reading is safe, writing may not be: as ext4 would with -o ro. */
		efs_log_warn("%s: the filesystem has read-only-compatible features this "
			     "version does not know: mounting it read-only",
			     d->device);
		d->read_only = true;
		d->ro_forced = true;
	}
	r = efs_meta_ns_init(&d->ns, d->sb.name);
	if (r < 0) {
		report_error(d, "%s: invalid filesystem name '%s'", d->device, d->sb.name);
		return r;
	}
	/* A second descriptor for data, O_DIRECT where the device takes it:
	 * file data bypasses this host's page cache, so what a peer writes to
	 * the shared device is what this node reads. */
	r = efs_dev_open_data(d->device, !d->read_only, &d->data_direct);
	if (r < 0) {
		report_error(d, "%s: %s", d->device, strerror(-r));
		return r;
	}
	d->data_fd = r;
	return check_fuse_opts(d);
}

/* ---- Metrics ---- */

static double gauge_session_state(void *arg)
{
	struct state_gauge *g = arg;

	if (!g->d->session)
		return g->st == EFS_SESSION_CLOSED;
	return efs_session_state(g->d->session) == g->st;
}

static double gauge_session_generation(void *arg)
{
	struct daemon *d = arg;

	return d->session ? (double)efs_session_generation(d->session) : 0;
}

static double gauge_renew_max_gap(void *arg)
{
	struct daemon *d = arg;
	struct efs_session_stats st;

	if (!d->session)
		return 0;
	efs_session_get_stats(d->session, &st);
	return (double)st.renew_max_gap_ns / 1e9;
}

/* The lock cache's stats (all 0 before it exists). */
static struct efs_lockcache_stats lock_stats(const struct daemon *d)
{
	struct efs_lockcache_stats st = {0};

	if (d->locks)
		efs_lockcache_get_stats(d->locks, &st);
	return st;
}

static double gauge_locks_held(void *arg)
{
	return (double)lock_stats(arg).held;
}

static double gauge_locks_contended(void *arg)
{
	return (double)lock_stats(arg).contended;
}

static double gauge_inflight(void *arg)
{
	struct daemon *d = arg;

	return d->fs ? (double)efs_fs_inflight(d->fs) : 0;
}

/* The wall clock, read when /metrics is rendered: etcfsctl members takes
 * the middle of its request as the local time to compare it with. */
static double gauge_wall_clock(void *arg)
{
	return (double)efs_clock_real_ns() / 1e9;
}

static double gauge_pending_bytes(void *arg)
{
	struct daemon *d = arg;

	return d->fs ? (double)efs_fs_pending_bytes(d->fs) : 0;
}

static double gauge_clock_skew(void *arg)
{
	return ((struct daemon *)arg)->skew_s;
}

static double gauge_clock_skew_peers(void *arg)
{
	return (double)((struct daemon *)arg)->skew_peers;
}

static void on_recall_wait(void *arg, uint64_t ns)
{
	struct daemon *d = arg;

	efs_histogram_observe_ns(d->m_recall_wait, ns);
}

static void on_etcd_call(void *arg, enum efs_etcd_method m, uint64_t ns, int err)
{
	struct daemon *d = arg;

	if ((unsigned)m >= EFS_ETCD_NMETHODS)
		return;
	efs_histogram_observe_ns(d->m_rpc[m], ns);
	if (err)
		efs_counter_inc(d->m_rpc_err[m]);
}

static double gauge_blocks_total(void *arg)
{
	struct daemon *d = arg;
	const Etcfs__FsInfo *fi = d->fi;

	if (!fi || !fi->block_size || fi->device_size / fi->block_size <= fi->data_start)
		return 0;
	return (double)(fi->device_size / fi->block_size - fi->data_start);
}

static double gauge_block_size(void *arg)
{
	struct daemon *d = arg;

	return d->fi ? (double)d->fi->block_size : 0;
}

static double gauge_blocks_free(void *arg)
{
	return (double)((struct daemon *)arg)->usage_free_blocks;
}

static double gauge_inodes_limit(void *arg)
{
	struct daemon *d = arg;

	if (d->fs)
		return (double)efs_fs_inode_limit(d->fs);
	return d->fi ? (double)d->fi->inode_limit : 0;
}

static double gauge_inodes_used(void *arg)
{
	struct daemon *d = arg;

	return d->usage_inodes < 0 ? 0 : (double)d->usage_inodes;
}

static double gauge_usage_age(void *arg)
{
	struct daemon *d = arg;

	if (!d->usage_done_ns)
		return -1;
	return (double)(efs_clock_mono_ns() - d->usage_done_ns) / 1e9;
}

/*
 * The usage poll: the free counts of every allocation group (ag/<g>/free,
 * a hundred per read transaction), then a count-only range of the inode
 * records; the gauges change only when both are read. What statfs (df)
 * computes on demand, here on a timer so that alerts need no df. A failed
 * read ends the round; the next tick starts another.
 */
static void usage_next(struct daemon *d);
static void skew_start(struct daemon *d);

static bool usage_can_run(const struct daemon *d)
{
	return d->phase == PH_RUNNING && d->etcd && !d->etcd_freed && d->fi;
}

static void usage_count_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp,
			   void *arg)
{
	struct daemon *d = arg;

	d->usage_busy = false;
	if (r->err || !resp)
		return;
	d->usage_inodes = resp->count;
	d->usage_free_blocks = d->usage_free_sum;
	d->usage_done_ns = efs_clock_mono_ns();
	if (usage_can_run(d))
		skew_start(d);
}

static void usage_ag_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct daemon *d = arg;

	if (r->err || !resp || !usage_can_run(d)) {
		d->usage_busy = false;
		return;
	}
	d->usage_free_sum += efs_meta_ag_free_sum(resp);
	usage_next(d);
}

static void usage_next(struct daemon *d)
{
	struct efs_etcd_txn *t = NULL;
	int r;

	if (d->usage_next_group >= d->fi->ag_count) {
		struct efs_meta_range range;

		r = efs_meta_range_family(&d->ns, EFS_META_K_INODE, &range);
		if (r == 0)
			r = efs_etcd_range(d->etcd, range.key.buf, range.key.len,
					   &(struct efs_etcd_range_opts){
						   .range_end = range.end.buf,
						   .range_end_len = range.end.len,
						   .count_only = true,
					   },
					   NULL, usage_count_cb, d);
		if (r < 0)
			d->usage_busy = false;
		return;
	}
	r = efs_etcd_txn_new(&t, 0);
	for (uint32_t n = 0; r == 0 && n < USAGE_GROUPS_PER_TXN &&
			     d->usage_next_group < d->fi->ag_count;
	     n++) {
		struct efs_meta_key k;

		r = efs_meta_key_ag(&d->ns, d->usage_next_group++, EFS_META_K_AG_FREE, &k);
		if (r == 0)
			r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0);
	}
	if (r == 0)
		r = efs_etcd_txn(d->etcd, efs_etcd_txn_request(t), NULL, usage_ag_cb, d);
	efs_etcd_txn_free(t);
	if (r < 0)
		d->usage_busy = false;
}

/*
 * The clock skew, after each usage poll: the metrics addresses of the
 * other nodes' session records (n/), each node's clock read from its
 * /metrics in a worker (efs_cli_clock_probe, SKEW_PROBE_MS each), and this
 * node's clock minus the median of every clock measured, ours included.
 * The median lets one wrong clock among three show on that node alone;
 * with two nodes each shows half the difference, with the other's sign.
 * Without a peer that answers it is 0 (the node is the cluster).
 */
#define SKEW_PROBE_MS  1000
#define SKEW_PEERS_MAX 8

struct skew_round {
	uv_work_t work;
	struct daemon *d;
	uint32_t n, measured;
	char addr[SKEW_PEERS_MAX][128];
	double offs[SKEW_PEERS_MAX + 1]; /* peer minus us, then 0 for us */
};

static void skew_work(uv_work_t *w)
{
	struct skew_round *sr = w->data;
	char why[96];

	for (uint32_t i = 0; i < sr->n; i++) {
		double s, err;

		if (efs_cli_clock_probe(sr->addr[i], SKEW_PROBE_MS, &s, &err, why, sizeof(why)) ==
		    0)
			sr->offs[sr->measured++] = s;
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void skew_done(uv_work_t *w, int status)
{
	struct skew_round *sr = w->data;
	struct daemon *d = sr->d;
	uint32_t n = sr->measured + 1;
	double med;

	d->skew = NULL;
	if (status == 0) {
		sr->offs[sr->measured] = 0;
		qsort(sr->offs, n, sizeof(sr->offs[0]), cmp_double);
		med = n % 2 ? sr->offs[n / 2] : (sr->offs[n / 2 - 1] + sr->offs[n / 2]) / 2;
		d->skew_s = -med;
		d->skew_peers = sr->measured;
	}
	efs_mem_free(sr);
}

static void skew_nodes_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp,
			  void *arg)
{
	struct daemon *d = arg;
	struct skew_round *sr;

	if (r->err || !resp || !usage_can_run(d) || d->skew)
		return;
	sr = efs_mem_calloc(1, sizeof(*sr));
	if (!sr)
		return;
	for (size_t i = 0; i < resp->n_kvs && sr->n < SKEW_PEERS_MAX; i++) {
		const Mvccpb__KeyValue *kv = resp->kvs[i];
		struct efs_meta_key_info info;
		Etcfs__NodeInfo *ni = NULL;

		if (efs_meta_key_parse(&d->ns, kv->key.data, kv->key.len, &info) < 0 ||
		    info.family != EFS_META_K_NODE || !strcmp(info.node, d->node) ||
		    efs_meta_nodeinfo_decode(kv->value.data, kv->value.len, &ni, NULL) < 0)
			continue;
		if (ni->metrics_addr && ni->metrics_addr[0] &&
		    strlen(ni->metrics_addr) < sizeof(sr->addr[0]))
			snprintf(sr->addr[sr->n++], sizeof(sr->addr[0]), "%s", ni->metrics_addr);
		efs_meta_record_free(ni);
	}
	sr->d = d;
	sr->work.data = sr;
	if (!sr->n) {
		d->skew_s = 0;
		d->skew_peers = 0;
		efs_mem_free(sr);
		return;
	}
	if (uv_queue_work(&d->loop, &sr->work, skew_work, skew_done) < 0) {
		efs_mem_free(sr);
		return;
	}
	d->skew = sr;
}

static void skew_start(struct daemon *d)
{
	struct efs_meta_range range;

	if (d->skew || efs_meta_range_family(&d->ns, EFS_META_K_NODE, &range) < 0)
		return;
	(void)efs_etcd_range(d->etcd, range.key.buf, range.key.len,
			     &(struct efs_etcd_range_opts){
				     .range_end = range.end.buf,
				     .range_end_len = range.end.len,
			     },
			     NULL, skew_nodes_cb, d);
}

/*
 * Publication requests: etcfsctl backup (and sync) puts sync/<id> on its
 * lease; every node that watches publishes every dirty inode and answers
 * with sync/<id>/<node> on its session lease ("ok", or "error: ..."). A
 * request that arrives while a publication for others runs waits for the
 * next one, which starts when that one ends: an answer covers every write
 * completed before the node saw the request. A watcher lost to a cancel or
 * a compaction is made again by the usage tick; requests meanwhile go
 * unanswered, and a backup fails on them unless this node mounted -o cow
 * (it could overwrite in place under the copy), else waits its settle.
 */
static void sync_round(struct daemon *d);
static void bk_probe(struct daemon *d);
static void bk_guard_on(struct daemon *d);

static void bk_guard_on(struct daemon *d)
{
	if (!d->fs)
		return;
	d->bk_gen++;
	if (!d->bk_guard)
		efs_fs_inplace_stop(d->fs);
	d->bk_guard = true;
}

static void on_bk_tick(uv_timer_t *t)
{
	bk_probe(t->data);
}

static void bk_probe_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct daemon *d = arg;
	uint64_t gen = d->bk_probe_gen;

	d->bk_probe_busy = false;
	if (!d->bk_guard || !d->fs || d->phase != PH_RUNNING)
		return;
	if (!r->err && resp && resp->count == 0 && gen == d->bk_gen && !d->sync_busy) {
		efs_fs_inplace_allow(d->fs);
		d->bk_guard = false;
		efs_log_debug("sync: no backup pin: overwrites go in place again");
		return;
	}
	if (r->err)
		efs_log_warn("sync: reading backup pins: %s (retried)", strerror(-r->err));
	uv_timer_start(&d->bk_timer, on_bk_tick, BK_PROBE_MS, 0);
}

/* While the guard is on, reads pin/backup. (keys counted, none sent),
 * again every BK_PROBE_MS until it finds none. */
static void bk_probe(struct daemon *d)
{
	struct efs_meta_range rg;
	int r;

	if (!d->bk_guard || d->bk_probe_busy || !d->etcd || d->etcd_freed ||
	    d->phase != PH_RUNNING)
		return;
	uv_timer_stop(&d->bk_timer);
	r = efs_meta_range_backup_pins(&d->ns, &rg);
	if (r == 0)
		r = efs_etcd_range(d->etcd, rg.key.buf, rg.key.len,
				   &(struct efs_etcd_range_opts){.range_end = rg.end.buf,
								 .range_end_len = rg.end.len,
								 .count_only = true},
				   NULL, bk_probe_cb, d);
	if (r < 0) {
		efs_log_warn("sync: reading backup pins: %s (retried)", strerror(-r));
		uv_timer_start(&d->bk_timer, on_bk_tick, BK_PROBE_MS, 0);
		return;
	}
	d->bk_probe_gen = d->bk_gen;
	d->bk_probe_busy = true;
}

static void sync_ack_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	(void)resp;
	(void)arg;
	if (r->err)
		efs_log_warn("sync: answering a publication request: %s", strerror(-r->err));
}

static void sync_published(int status, void *arg)
{
	struct daemon *d = arg;
	char val[96] = "ok";

	d->sync_busy = false;
	if (status < 0) {
		snprintf(val, sizeof(val), "error: %s", strerror(-status));
		efs_log_warn("sync: publishing for a request failed: %s", strerror(-status));
	}
	/* Only while the request exists: an answer after the requester gave
	 * up and deleted it would stay until our session ends. */
	for (uint32_t i = 0; i < d->sync_ncur && d->etcd && !d->etcd_freed && d->session; i++) {
		struct efs_etcd_txn *t = NULL;
		struct efs_meta_key k, ack;
		int r = efs_meta_key_sync(&d->ns, d->sync_cur[i], &k);

		if (r == 0)
			r = efs_meta_key_sync_ack(&d->ns, d->sync_cur[i], d->node, &ack);
		if (r == 0)
			r = efs_etcd_txn_new(&t, 0);
		if (r == 0)
			r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_VERSION, EFS_ETCD_CMP_GREATER, k.buf,
						 k.len, 0);
		if (r == 0)
			r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, ack.buf, ack.len, val,
					     strlen(val), efs_session_lease_id(d->session));
		if (r == 0)
			r = efs_etcd_txn(d->etcd, efs_etcd_txn_request(t), NULL, sync_ack_cb, d);
		efs_etcd_txn_free(t);
		if (r < 0)
			efs_log_warn("sync: answering request %s: %s", d->sync_cur[i],
				     strerror(-r));
	}
	d->sync_ncur = 0;
	bk_probe(d);
	sync_round(d);
}

/* The in-place overwrites in flight have ended: publish. */
static void sync_drained(void *arg)
{
	struct daemon *d = arg;
	int r;

	if (!d->fs || d->phase != PH_RUNNING) {
		sync_published(-ESHUTDOWN, d);
		return;
	}
	r = efs_fs_publish_all(d->fs, sync_published, d);
	if (r != 0)
		sync_published(r == 1 ? 0 : r, d);
}

/*
 * A request may come from a backup, which then copies the blocks of its
 * revision: before the answer, overwrites stop going in place and those
 * in flight end (the answer promises that no block the backup may copy
 * is rewritten in place while its pin exists); they go in place again
 * once a read after the last request finds no backup pin (bk_probe).
 */
static void sync_round(struct daemon *d)
{
	int r;

	if (d->sync_busy || !d->sync_nnext || !d->fs || d->phase != PH_RUNNING)
		return;
	memcpy(d->sync_cur, d->sync_next, sizeof(d->sync_cur[0]) * d->sync_nnext);
	d->sync_ncur = d->sync_nnext;
	d->sync_nnext = 0;
	d->sync_busy = true;
	bk_guard_on(d);
	r = efs_fs_inplace_drain(d->fs, sync_drained, d);
	if (r == 1)
		sync_drained(d);
	else if (r < 0)
		sync_published(r, d);
}

/* One event on sync/: a new request joins those the next publication
 * answers. */
static void sync_requested(struct daemon *d, const Mvccpb__Event *ev)
{
	struct efs_meta_key_info ki;

	if (!ev->kv || ev->type != MVCCPB__EVENT__EVENT_TYPE__PUT ||
	    efs_meta_key_parse(&d->ns, ev->kv->key.data, ev->kv->key.len, &ki) < 0 ||
	    ki.family != EFS_META_K_SYNC)
		return;
	for (uint32_t j = 0; j < d->sync_nnext; j++)
		if (!strcmp(d->sync_next[j], ki.node))
			return;
	if (d->sync_nnext == SYNC_IDS_MAX) {
		efs_log_warn("sync: more than %d publication requests waiting; %s is not answered",
			     SYNC_IDS_MAX, ki.node);
		return;
	}
	memcpy(d->sync_next[d->sync_nnext++], ki.node, sizeof(ki.node));
}

static void sync_watch_cb(struct efs_etcd_watcher *w, int status,
			  const struct efs_etcd_watch_update *u, void *arg)
{
	struct daemon *d = arg;

	(void)status;
	if (u->kind == EFS_ETCD_WATCH_EVENTS) {
		for (size_t i = 0; i < u->n_events; i++)
			sync_requested(d, u->events[i]);
		sync_round(d);
	} else if (u->kind == EFS_ETCD_WATCH_CANCELED || u->kind == EFS_ETCD_WATCH_COMPACTED) {
		d->sync_w = efs_etcd_watcher_free(w); /* made again by the usage tick */
	}
}

static void sync_watch_start(struct daemon *d)
{
	struct efs_meta_range rg;
	int r;

	if (d->sync_w || !usage_can_run(d))
		return;
	r = efs_meta_range_syncs(&d->ns, &rg);
	if (r == 0 && !d->sync_ws)
		r = efs_etcd_watch_stream_new(&d->sync_ws, d->etcd, EFS_ETCD_CH_BULK);
	if (r == 0)
		r = efs_etcd_watcher_new(&d->sync_w, d->sync_ws,
					 &(struct efs_etcd_watch_opts){.key = rg.key.buf,
								       .key_len = rg.key.len,
								       .prefix = true,
								       .no_delete = true},
					 sync_watch_cb, d);
	if (r < 0)
		efs_log_warn("sync: watching publication requests: %s (retried)", strerror(-r));
}

static void on_usage_tick(uv_timer_t *t)
{
	struct daemon *d = t->data;

	sync_watch_start(d);
	if (d->usage_busy || !usage_can_run(d))
		return;
	d->usage_busy = true;
	d->usage_next_group = 0;
	d->usage_free_sum = 0;
	usage_next(d);
}

/* /healthz: answered on the loop, so the loop runs; says what it does. */
static int probe_healthz(void *arg, char *why, size_t size)
{
	static const char *const phases[] = {"starting", "mounting", "serving", "leaving",
					     "stopped"};
	struct daemon *d = arg;

	snprintf(why, size, "ok: event loop running (%s, last loop lag %.3f s)",
		 phases[d->phase], efs_gauge_get(d->m_lag_last));
	return 200;
}

/* /readyz: 200 only while the mount serves with an ACTIVE session. */
static int probe_readyz(void *arg, char *why, size_t size)
{
	struct daemon *d = arg;
	enum efs_session_state st;

	switch (d->phase) {
	case PH_STARTING:
		snprintf(why, size, "not ready: starting (registering node %s with etcd)",
			 d->node);
		return 503;
	case PH_MOUNTING:
		snprintf(why, size, "not ready: starting (mounting %s)", d->mountpoint);
		return 503;
	case PH_LEAVING:
	case PH_DONE:
		snprintf(why, size, "not ready: stopping (unmounting %s)", d->mountpoint);
		return 503;
	case PH_RUNNING:
		break;
	}
	st = d->session ? efs_session_state(d->session) : EFS_SESSION_CLOSED;
	if (st == EFS_SESSION_ACTIVE) {
		snprintf(why, size, "ready: serving %s as node %s", d->mountpoint, d->node);
		return 200;
	}
	if (st == EFS_SESSION_SUSPENDED)
		snprintf(why, size,
			 "not ready: session suspended (etcd unreachable), operations wait");
	else
		snprintf(why, size, "not ready: session %s, operations fail",
			 efs_session_state_name(st));
	return 503;
}

static void on_handover(void *arg, uint64_t ns)
{
	struct daemon *d = arg;

	efs_histogram_observe_ns(d->m_handover, ns);
}

static void register_metrics(struct daemon *d)
{
	static const char *const sess_names[5][2] = {
		{"etcfs_session_suspends_total", "Entries into SUSPENDED (no renewal acknowledged)"},
		{"etcfs_session_resumes_total", "Suspensions that ended with the lease alive"},
		{"etcfs_session_losses_total", "Sessions lost (lease gone)"},
		{"etcfs_session_registrations_total", "Sessions registered"},
		{"etcfs_session_waits_failed_total", "Operations failed with EIO waiting for the session"},
	};
	static const char *const lock_names[EFS_NLOCK_COUNTERS][2] = {
		{"etcfs_lock_acquires_total", "Lock acquisitions that needed etcd"},
		{"etcfs_lock_cache_hits_total", "Lock acquisitions served from the lock cache"},
		{"etcfs_lock_waits_total", "Lock acquisitions that waited for another holder"},
		{"etcfs_lock_releases_total", "Locks released"},
		{"etcfs_lock_release_txns_total", "Transactions that released locks"},
		{"etcfs_lock_releases_in_publication_total",
		 "Locks released (or downgraded) by the transaction that published what they "
		 "covered"},
		{"etcfs_lock_txn_retries_total", "Lock transactions retried"},
		{"etcfs_lock_forced_total", "Forced releases and downgrades completed (recalls)"},
		{"etcfs_lock_preps_total", "Release preparations run (invalidate, then sync)"},
		{"etcfs_lock_upgrade_yields_total", "Blocked upgrades that gave their shared hold up"},
		{"etcfs_lock_recalls_total", "Recall keys of other nodes answered"},
		{"etcfs_lock_acquire_yields_total",
		 "Acquisitions that gave their pins up to a recall and started again"},
		{"etcfs_lock_recalls_unanswered_total",
		 "Recalls of other nodes this node had not answered after the wait bound"},
		{"etcfs_peer_session_ends_total", "Other nodes' sessions seen ending"},
		{"etcfs_takeover_marked_inodes_total",
		 "Inodes a node held exclusively when its session ended (written copy-on-write "
		 "for the grace period)"},
		{"etcfs_takeover_cow_writes_total",
		 "Writes into preallocated blocks sent copy-on-write after a takeover"},
		{"etcfs_lock_recalls_deferred_total",
		 "Recalls of other nodes answered only once the lock's minimum hold ended"},
		{"etcfs_lock_releases_early_total",
		 "Idle locks released by a transaction the node sent anyway (early cancel)"},
		{"etcfs_lock_direct_grants_total",
		 "Waiters granted a lock by the transaction that released it"},
	};
	static const char *const etcd_names[EFS_NETCD_COUNTERS][2] = {
		{"etcfs_etcd_calls_total", "etcd unary calls started"},
		{"etcfs_etcd_calls_failed_total", "etcd unary calls that failed"},
		{"etcfs_etcd_call_retries_total", "etcd call attempts retried"},
		{"etcfs_etcd_reconnects_total", "Connections to etcd made again after one was lost"},
		{"etcfs_etcd_watch_reconnects_total",
		 "Watch streams opened again after one ended (lost connection, failover)"},
		{"etcfs_etcd_sent_bytes_total", "Bytes sent to etcd"},
		{"etcfs_etcd_received_bytes_total", "Bytes received from etcd"},
	};
	static const char *const state_labels[6] = {
		"state=\"starting\"",  "state=\"active\"", "state=\"suspended\"",
		"state=\"expired\"",   "state=\"gone\"",   "state=\"closed\"",
	};
	struct efs_metrics *m = d->metrics;
	char labels[128];

	snprintf(labels, sizeof(labels), "version=\"%s\"", ETCFS_VERSION);
	efs_gauge_set(efs_metrics_gauge(m, "etcfs_build_info", "etcfs version", labels), 1);
	d->m_recall_wait = efs_metrics_histogram(
		m, "etcfs_lock_recall_wait_seconds",
		"Waits for another node's lock: from our recall key's creation to the grant", NULL);
	d->m_handover = efs_metrics_histogram(
		m, "etcfs_lock_handover_seconds",
		"Forced releases for other nodes' recalls: from the request to the release's reply "
		"(how long this node held a lock others asked for)",
		NULL);
	d->m_lag = efs_metrics_histogram(m, "etcfs_loop_lag_seconds",
					 "Lateness of a 100 ms loop timer (loop lag)", NULL);
	d->m_lag_last = efs_metrics_gauge(m, "etcfs_loop_lag_last_seconds",
					  "Lateness of the last 100 ms loop timer tick", NULL);
	efs_capacity_register_metrics(&d->capacity, m);
	for (int i = 0; i < 6; i++) {
		d->state_gauges[i].d = d;
		d->state_gauges[i].st = (enum efs_session_state)i;
		efs_metrics_gauge_fn(m, "etcfs_session_state",
				     "Session state (1 for the current one)", state_labels[i],
				     gauge_session_state, &d->state_gauges[i]);
	}
	efs_metrics_gauge_fn(m, "etcfs_session_generation", "Fencing generation of the session",
			     NULL, gauge_session_generation, d);
	efs_metrics_gauge_fn(m, "etcfs_session_renew_max_gap_seconds",
			     "Longest gap between acknowledged lease renewals", NULL,
			     gauge_renew_max_gap, d);
	for (int i = 0; i < 5; i++)
		d->m_sess[i].c = efs_metrics_counter(m, sess_names[i][0], sess_names[i][1], NULL);
	efs_metrics_gauge_fn(m, "etcfs_lock_cache_held", "Locks held in the lock cache", NULL,
			     gauge_locks_held, d);
	efs_metrics_gauge_fn(m, "etcfs_lock_contended",
			     "Locks recalled so often that they get no hold and no kernel caching",
			     NULL, gauge_locks_contended, d);
	for (int i = 0; i < EFS_NLOCK_COUNTERS; i++)
		d->m_lock[i].c = efs_metrics_counter(m, lock_names[i][0], lock_names[i][1], NULL);
	for (int i = 0; i < EFS_NETCD_COUNTERS; i++)
		d->m_etcd[i].c = efs_metrics_counter(m, etcd_names[i][0], etcd_names[i][1], NULL);
	for (int i = 0; i < EFS_ETCD_NMETHODS; i++) {
		snprintf(labels, sizeof(labels), "method=\"%s\"",
			 efs_etcd_method_name((enum efs_etcd_method)i));
		d->m_rpc[i] = efs_metrics_histogram(
			m, "etcfs_etcd_rpc_seconds",
			"etcd unary calls: time from the call to its result, retries included, by "
			"method",
			labels);
		d->m_rpc_err[i] = efs_metrics_counter(m, "etcfs_etcd_rpc_errors_total",
						      "etcd unary calls that failed, by method",
						      labels);
	}
	efs_metrics_gauge_fn(m, "etcfs_fs_blocks_total", "Blocks of the data area", NULL,
			     gauge_blocks_total, d);
	efs_metrics_gauge_fn(m, "etcfs_fs_blocks_free",
			     "Free blocks in the published group maps (polled every 30 s)", NULL,
			     gauge_blocks_free, d);
	efs_metrics_gauge_fn(m, "etcfs_fs_block_size_bytes", "Block size", NULL,
			     gauge_block_size, d);
	efs_metrics_gauge_fn(m, "etcfs_fs_inodes_limit", "Inodes the filesystem allows (statfs files)",
			     NULL, gauge_inodes_limit, d);
	efs_metrics_gauge_fn(m, "etcfs_fs_inodes_used", "Inode records in etcd (polled every 30 s)",
			     NULL, gauge_inodes_used, d);
	efs_metrics_gauge_fn(m, "etcfs_fs_usage_age_seconds",
			     "Age of the last complete space and inode poll (-1: none yet)", NULL,
			     gauge_usage_age, d);
	d->m_fuse_requests = efs_metrics_counter(m, "etcfs_fuse_requests_received_total",
						 "FUSE requests read from the kernel", NULL);
	efs_metrics_gauge_fn(m, "etcfs_fs_inflight_ops", "FUSE operations in flight", NULL,
			     gauge_inflight, d);
	efs_metrics_gauge_fn(m, "etcfs_clock_wall_seconds",
			     "The node's wall clock (CLOCK_REALTIME) when /metrics was served, in "
			     "seconds since the epoch",
			     NULL, gauge_wall_clock, NULL);
	efs_metrics_gauge_fn(m, "etcfs_data_pending_bytes",
			     "Bytes of blocks allocated for writes and not yet published (lost "
			     "with this node if it dies now)",
			     NULL, gauge_pending_bytes, d);
	efs_metrics_gauge_fn(m, "etcfs_clock_skew_seconds",
			     "This node's wall clock minus the median of the cluster's (its own and "
			     "every peer's read from their /metrics after each usage poll; 0 "
			     "without a peer)",
			     NULL, gauge_clock_skew, d);
	efs_metrics_gauge_fn(m, "etcfs_clock_skew_peers",
			     "Peers whose clocks the last skew measurement read", NULL,
			     gauge_clock_skew_peers, d);
}

static void counter_sync(struct stat_counters *sc, uint64_t now)
{
	if (now > sc->last)
		efs_counter_add(sc->c, now - sc->last);
	sc->last = now;
}

/* Copies the session and lock counters into the registry (every tick). */
static void sync_counters(struct daemon *d)
{
	if (d->session) {
		struct efs_session_stats s;

		efs_session_get_stats(d->session, &s);
		counter_sync(&d->m_sess[0], s.suspends);
		counter_sync(&d->m_sess[1], s.resumes);
		counter_sync(&d->m_sess[2], s.losses);
		counter_sync(&d->m_sess[3], s.registrations);
		counter_sync(&d->m_sess[4], s.waits_failed);
	}
	if (d->locks) {
		struct efs_lockcache_stats l;

		efs_lockcache_get_stats(d->locks, &l);
		counter_sync(&d->m_lock[0], l.acquires);
		counter_sync(&d->m_lock[1], l.hits);
		counter_sync(&d->m_lock[2], l.waits);
		counter_sync(&d->m_lock[3], l.releases);
		counter_sync(&d->m_lock[4], l.release_txns);
		counter_sync(&d->m_lock[5], l.releases_in_txn);
		counter_sync(&d->m_lock[6], l.txn_retries);
		counter_sync(&d->m_lock[7], l.forced);
		counter_sync(&d->m_lock[8], l.preps);
		counter_sync(&d->m_lock[9], l.upgrade_yields);
		counter_sync(&d->m_lock[10], l.recalls);
		counter_sync(&d->m_lock[11], l.acq_yields);
		counter_sync(&d->m_lock[12], l.recalls_unanswered);
		counter_sync(&d->m_lock[13], l.peer_deaths);
		counter_sync(&d->m_lock[14], l.takeover_marked);
		counter_sync(&d->m_lock[15], l.takeover_cow);
		counter_sync(&d->m_lock[16], l.recalls_deferred);
		counter_sync(&d->m_lock[17], l.releases_early);
		counter_sync(&d->m_lock[18], l.direct_grants);
	}
	if (d->etcd && !d->etcd_freed) {
		struct efs_etcd_stats e;

		efs_etcd_get_stats(d->etcd, &e);
		counter_sync(&d->m_etcd[0], e.calls_started);
		counter_sync(&d->m_etcd[1], e.calls_failed);
		counter_sync(&d->m_etcd[2], e.calls_retried);
		counter_sync(&d->m_etcd[3], e.reconnects);
		counter_sync(&d->m_etcd[4], efs_etcd_watch_reopens());
		counter_sync(&d->m_etcd[5], e.bytes_sent);
		counter_sync(&d->m_etcd[6], e.bytes_received);
	}
	if (d->fl) {
		uint64_t n = efs_fuseloop_requests(d->fl);

		if (n > d->fuse_requests_last)
			efs_counter_add(d->m_fuse_requests, n - d->fuse_requests_last);
		d->fuse_requests_last = n;
	}
}

/*
 * A repeating timer: libuv schedules the next tick at the loop time of
 * this one plus the interval, so how much later it actually runs is the
 * time the loop spent elsewhere.
 */
static void on_lag_tick(uv_timer_t *t)
{
	struct daemon *d = t->data;
	uint64_t now_ns = uv_hrtime();
	uint64_t expected = (d->lag_prev_ms + LAG_INTERVAL_MS) * EFS_NSEC_PER_MSEC;
	uint64_t late_ns = now_ns > expected ? now_ns - expected : 0;

	efs_histogram_observe_ns(d->m_lag, late_ns);
	efs_gauge_set(d->m_lag_last, (double)late_ns / 1e9);
	d->lag_prev_ms = uv_now(&d->loop);
	sync_counters(d);
	if (notify_sock.watchdog_ms &&
	    d->lag_prev_ms - notify_sock.watchdog_last_ms >= notify_sock.watchdog_ms) {
		notify_sock.watchdog_last_ms = d->lag_prev_ms;
		notify("WATCHDOG=1");
	}
}

/* ---- Teardown ---- */

static void teardown(struct daemon *d);

static void on_handle_closed(uv_handle_t *h)
{
	(void)h;
}

static void on_etcd_freed(void *arg)
{
	struct daemon *d = arg;

	d->etcd = NULL;
}

static void on_httpd_stopped(void *arg)
{
	struct daemon *d = arg;

	d->httpd_stopped = true;
}

static void stop_maint(struct daemon *d);

/*
 * Unmounts and frees everything on the loop. The loop then runs out of
 * handles and main() returns. Whatever was not left cleanly (locks,
 * the lease) expires with the session TTL.
 */
static void teardown(struct daemon *d)
{
	if (d->phase == PH_DONE)
		return;
	d->phase = PH_DONE;
	if (!d->ready)
		report_error(d, "interrupted during start");
	sync_counters(d);

	if (d->handles_init) {
		uv_close((uv_handle_t *)&d->sig_term, on_handle_closed);
		uv_close((uv_handle_t *)&d->sig_int, on_handle_closed);
		uv_close((uv_handle_t *)&d->lag_timer, on_handle_closed);
		uv_close((uv_handle_t *)&d->drain_timer, on_handle_closed);
		uv_close((uv_handle_t *)&d->leave_timer, on_handle_closed);
		uv_close((uv_handle_t *)&d->ready_timer, on_handle_closed);
		uv_close((uv_handle_t *)&d->ready_poll, on_handle_closed);
		uv_close((uv_handle_t *)&d->teardown_timer, on_handle_closed);
		uv_close((uv_handle_t *)&d->usage_timer, on_handle_closed);
		uv_close((uv_handle_t *)&d->bk_timer, on_handle_closed);
		d->handles_init = false;
	}
	if (d->fl) {
		efs_fuseloop_close(d->fl, NULL, NULL);
		d->fl = NULL;
	}
	if (d->se) {
		if (d->mounted) {
			/* Closes /dev/fuse first: requests still queued fail ENOTCONN. */
			fuse_session_unmount(d->se);
			d->mounted = false;
		}
	}
	if (d->fs && efs_fs_inflight(d->fs) > 0) {
		/*
		 * Operations still hold continuations into the fs: freeing it
		 * would leave them dangling. The process exits right after;
		 * the kernel already failed their requests.
		 */
		efs_log_warn("%" PRIu64 " operations still in flight at exit; not freeing the "
			     "filesystem state",
			     efs_fs_inflight(d->fs));
		efs_fs_abandon(d->fs);
		if (d->se) {
			efs_fs_set_fuse(d->fs, NULL);
			fuse_session_destroy(d->se);
			d->se = NULL;
		}
		d->fs = NULL;
	}
	if (d->se) {
		/* The invalidation threads stop before the session goes. */
		if (d->fs)
			efs_fs_set_fuse(d->fs, NULL);
		/* Runs the fs's destroy handler (userdata) if INIT was seen. */
		fuse_session_destroy(d->se);
		d->se = NULL;
	}
	d->fs = efs_fs_free(d->fs);
	stop_maint(d);
	d->capacity = efs_capacity_free(d->capacity);
	d->locks = efs_lockcache_free(d->locks);
	d->session = efs_session_free(d->session);
	if (d->httpd) {
		efs_httpd_stop(d->httpd, on_httpd_stopped, d);
		d->httpd = NULL;
	}
	d->sync_ws = efs_etcd_watch_stream_free(d->sync_ws);
	d->sync_w = NULL; /* freed with its stream */
	if (d->etcd && !d->etcd_freed) {
		d->etcd_freed = true;
		efs_etcd_free(d->etcd, on_etcd_freed, d);
	}
}

static void on_teardown_timer(uv_timer_t *t)
{
	teardown(t->data);
}

/*
 * Teardown frees the session, the lock cache and the etcd client, so it
 * never runs inside one of their callbacks: it is deferred to a timer of
 * its own.
 */
static void schedule_teardown(struct daemon *d)
{
	if (!d->handles_init) {
		teardown(d);
		return;
	}
	uv_timer_start(&d->teardown_timer, on_teardown_timer, 0, 0);
}

/* ---- Clean leave ---- */

static void leave_finish(struct daemon *d, const char *what, int status)
{
	if (status < 0)
		efs_log_warn("%s: %s", what, strerror(-status));
	schedule_teardown(d);
}

static void on_session_left(struct efs_session *s, int status, void *arg)
{
	struct daemon *d = arg;

	(void)s;
	if (d->phase != PH_LEAVING)
		return;
	if (status == 0)
		efs_log_info("session of node %s left; lease revoked", d->node);
	leave_finish(d, "leaving the session (its lease expires by itself)", status);
}

static void leave_session(struct daemon *d)
{
	enum efs_session_state st;
	int r;

	stop_maint(d);
	if (!d->session) {
		schedule_teardown(d);
		return;
	}
	st = efs_session_state(d->session);
	if (st == EFS_SESSION_CLOSED || st == EFS_SESSION_STARTING) {
		schedule_teardown(d);
		return;
	}
	r = efs_session_leave(d->session, on_session_left, d);
	if (r < 0)
		leave_finish(d, "leaving the session (its lease expires by itself)", r);
}

static void on_locks_released(int status, void *arg)
{
	struct daemon *d = arg;

	if (d->phase != PH_LEAVING)
		return;
	if (status < 0)
		efs_log_warn("releasing locks: %s (they go with the session lease)",
			     strerror(-status));
	leave_session(d);
}

static void release_locks(struct daemon *d)
{
	int r;

	if (!d->locks) {
		leave_session(d);
		return;
	}
	r = efs_lockcache_release_all(d->locks, on_locks_released, d);
	if (r < 0) {
		efs_log_warn("releasing locks: %s (they go with the session lease)",
			     strerror(-r));
		leave_session(d);
	} else if (r == 1) {
		leave_session(d);
	}
}

static void on_io_stopped(void *arg)
{
	struct daemon *d = arg;

	if (d->phase != PH_LEAVING)
		return;
	release_locks(d);
}

static void on_fs_left(int status, void *arg)
{
	struct daemon *d = arg;
	int r;

	if (d->phase != PH_LEAVING)
		return;
	if (status < 0)
		efs_log_warn("publishing data at unmount: %s (unpublished writes since the last "
			     "fsync are lost)",
			     strerror(-status));
	/* The device pool drains before the locks go: no write of this node
	 * may land after a peer could take the blocks over. */
	r = efs_fs_stop_io(d->fs, on_io_stopped, d);
	if (r != 0)
		release_locks(d);
}

/* Publishes every dirty file and hands the allocation groups back, with
 * the locks still held. */
static void leave_fs(struct daemon *d)
{
	int r = d->fs ? efs_fs_leave(d->fs, on_fs_left, d) : 1;

	if (r == 1)
		on_fs_left(0, d);
	else if (r < 0)
		on_fs_left(r, d);
}

static void on_drain_tick(uv_timer_t *t)
{
	struct daemon *d = t->data;
	uint64_t n = d->fs ? efs_fs_inflight(d->fs) : 0;

	if (n > 0 && uv_now(&d->loop) - d->drain_start_ms < DRAIN_TIMEOUT_MS)
		return;
	uv_timer_stop(t);
	if (n > 0) {
		efs_log_warn("%" PRIu64 " operations still in flight after %d ms; leaving anyway",
			     n, DRAIN_TIMEOUT_MS);
		efs_fs_log_inflight(d->fs);
	}
	/*
	 * Unmount before the locks go: the kernel may still answer from
	 * entries and attributes it cached under them (up to the cache
	 * timeout), and a peer could take a lock the moment its holder key is
	 * deleted. Closing /dev/fuse ends those caches at once.
	 */
	if (d->fl) {
		efs_fuseloop_close(d->fl, NULL, NULL);
		d->fl = NULL;
	}
	if (d->se && d->mounted) {
		fuse_session_unmount(d->se);
		d->mounted = false;
	}
	leave_fs(d);
}

static void on_leave_timeout(uv_timer_t *t)
{
	struct daemon *d = t->data;

	efs_log_warn("clean leave did not finish within %d ms; exiting (locks and lease expire "
		     "with the session TTL)",
		     LEAVE_TIMEOUT_MS);
	schedule_teardown(d);
}

/*
 * Starts the clean leave. Requests stop being read (the kernel queues new
 * ones; they fail when /dev/fuse closes at unmount) while those in flight
 * finish and reply.
 */
static void begin_leave(struct daemon *d, const char *reason)
{
	if (d->phase == PH_LEAVING || d->phase == PH_DONE)
		return;
	if (d->phase == PH_STARTING) {
		/* The session start is in flight: leave once it ends. */
		d->want_leave = true;
		d->leave_reason = reason;
		uv_timer_start(&d->leave_timer, on_leave_timeout, LEAVE_TIMEOUT_MS, 0);
		return;
	}
	efs_log_info("%s: leaving (node %s, %s)", reason, d->node, d->mountpoint);
	uv_timer_stop(&d->usage_timer);
	uv_timer_stop(&d->bk_timer);
	notify("STOPPING=1\nSTATUS=stopping (%s): releasing locks, unmounting %s", reason,
	       d->mountpoint);
	if (!d->ready)
		report_error(d, "interrupted during start (%s)", reason);
	d->phase = PH_LEAVING;
	efs_fuseloop_pause(d->fl, true);
	uv_timer_stop(&d->ready_timer);
	uv_timer_start(&d->leave_timer, on_leave_timeout, LEAVE_TIMEOUT_MS, 0);
	d->drain_start_ms = uv_now(&d->loop);
	uv_timer_start(&d->drain_timer, on_drain_tick, 0, 10);
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;

	begin_leave(d, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void on_fuse_exit(struct efs_fuseloop *fl, int status, void *arg)
{
	struct daemon *d = arg;

	(void)fl;
	if (status < 0)
		efs_log_err("FUSE session failed: %s", strerror(-status));
	/* The kernel ended the session: nothing is mounted any more. */
	if (status == 0 && d->phase == PH_RUNNING)
		begin_leave(d, "unmounted");
	else
		begin_leave(d, "FUSE session ended");
}

/* ---- Start ---- */

#if EFS_FAULT_HOOKS
/*
 * Tests arm the client's fault hook through the environment:
 * ETCFS_FAULT_DROP_REPLY=METHOD:N (METHOD one of Txn, Range, Put) drops the
 * reply of the Nth such call counted from the moment the mount is ready.
 */
static void arm_fault_hooks(struct daemon *d)
{
	static const struct {
		const char *name;
		enum efs_etcd_method method;
	} methods[] = {{"Txn", EFS_ETCD_TXN}, {"Range", EFS_ETCD_RANGE}, {"Put", EFS_ETCD_PUT}};
	const char *v = getenv("ETCFS_FAULT_DROP_REPLY");
	const char *colon;
	char *end;
	unsigned long n;

	if (!v || !*v)
		return;
	colon = strchr(v, ':');
	if (colon) {
		errno = 0;
		n = strtoul(colon + 1, &end, 10);
		for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
			if (strlen(methods[i].name) != (size_t)(colon - v) ||
			    strncmp(v, methods[i].name, (size_t)(colon - v)) || errno || *end ||
			    n == 0 || n > UINT32_MAX)
				continue;
			efs_log_warn("fault hook: dropping the reply of %s call #%lu", methods[i].name,
				     n);
			efs_etcd_fault_drop_reply(d->etcd, methods[i].method, (unsigned)n);
			return;
		}
	}
	efs_log_err("ETCFS_FAULT_DROP_REPLY='%s' ignored: expected Txn:N, Range:N or Put:N", v);
}

/* Reads a fault-hook variable of the environment as a number from 1 to
 * |max|; 0 when unset, empty or not such a number (that is logged). */
static unsigned long fault_env(const char *name, unsigned long max)
{
	const char *v = getenv(name);
	unsigned long n;
	char *end;

	if (!v || !*v)
		return 0;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (errno || *end || n == 0 || n > max) {
		efs_log_err("%s='%s' ignored: expected a number from 1 to %lu", name, v, max);
		return 0;
	}
	return n;
}

/*
 * The hooks that must be armed before the lock cache opens its watches
 * (tests of several nodes):
 * ETCFS_FAULT_WATCH_DELAY_MS=N holds every watch event N ms before this
 * node sees it (recalls, holder deletions, lock waits), so that a test
 * cannot pass on the timing of one node's watch;
 * ETCFS_FAULT_NO_RECALL=1 leaves other nodes' recall keys unanswered (the
 * negative control of the recall tests);
 * ETCFS_FAULT_NO_INVAL=1 tells the kernel of no invalidation (the negative
 * control of the visibility tests: what it cached goes stale).
 */
static void arm_early_fault_hooks(struct daemon *d)
{
	unsigned long ms = fault_env("ETCFS_FAULT_WATCH_DELAY_MS", 60000);

	if (ms) {
		efs_log_warn("fault hook: watch events delayed by %lu ms", ms);
		efs_etcd_fault_watch_delay(d->etcd, (uint32_t)ms);
	}
	if (fault_env("ETCFS_FAULT_NO_RECALL", 1)) {
		efs_log_warn("fault hook: recall keys of other nodes are not answered");
		efs_lockcache_fault_no_recall(d->locks, true);
	}
	if (fault_env("ETCFS_FAULT_NO_INVAL", 1)) {
		efs_log_warn("fault hook: the kernel is told of no invalidation");
		efs_inval_fault_no_kernel(true);
	}
}
#else
static void arm_fault_hooks(struct daemon *d)
{
	(void)d;
}

static void arm_early_fault_hooks(struct daemon *d)
{
	(void)d;
}
#endif

static void on_capacity_state(struct efs_capacity *cap, enum efs_capacity_state old,
			      enum efs_capacity_state new_state, void *arg)
{
	struct efs_capacity_stats st;

	(void)old;
	(void)arg;
	efs_capacity_get_stats(cap, &st);
	if (new_state == EFS_CAPACITY_OK)
		efs_log_info("etcd has room again (%" PRIu64 " of %" PRIu64 " bytes in use): "
			     "metadata growth allowed",
			     st.in_use, st.quota);
	else
		efs_log_warn("etcd is %s (%" PRIu64 " bytes in use, database %" PRIu64
			     " of quota %" PRIu64 "): creates and other metadata growth fail "
			     "with ENOSPC, deletes still work; compact and defragment etcd%s",
			     new_state == EFS_CAPACITY_FULL ? "full (NOSPACE alarm)" : "nearly full",
			     st.in_use, st.db_size, st.quota,
			     new_state == EFS_CAPACITY_FULL ? ", then run 'etcdctl alarm disarm'"
							    : "");
}

/*
 * The mount is ready once the kernel's INIT request has been answered: it is
 * the first request of every FUSE session, and after its reply the kernel
 * sends the filesystem's requests. Nothing in this process touches its own
 * mount point: a daemon that stat()s itself and then crashes leaves a thread
 * in D state on its own dead mount and can never exit.
 */
static void on_ready_poll(uv_timer_t *t)
{
	struct daemon *d = t->data;

	if (d->phase != PH_MOUNTING || !d->fl || efs_fuseloop_requests(d->fl) == 0)
		return;
	uv_timer_stop(&d->ready_poll);
	uv_timer_stop(&d->ready_timer);
	d->phase = PH_RUNNING;
	efs_log_info("mounted %s (%s) on %s as node %s, session generation %" PRIu64 " (pid %d)",
		     d->sb.name, d->device, d->mountpoint, d->node,
		     efs_session_generation(d->session), (int)getpid());
	arm_fault_hooks(d);
	bk_probe(d);
	uv_timer_start(&d->usage_timer, on_usage_tick, 0, USAGE_INTERVAL_MS);
	/* In the background the service manager knows the parent's pid:
	 * name the child that serves. */
	if (d->ready_fd >= 0)
		notify("READY=1\nMAINPID=%d\nSTATUS=serving %s as node %s", (int)getpid(),
		       d->mountpoint, d->node);
	else
		notify("READY=1\nSTATUS=serving %s as node %s", d->mountpoint, d->node);
	report_ready(d);
}

static void on_ready_timeout(uv_timer_t *t)
{
	struct daemon *d = t->data;

	report_error(d, "%s: the new mount did not answer within %d s", d->mountpoint,
		     READY_TIMEOUT_MS / 1000);
	begin_leave(d, "start failed");
}

/* etcd maintenance (compaction) by the elected node; best effort. */
static void start_maint(struct daemon *d)
{
	struct efs_maint_opts mo = {
		.interval_ms = d->compact_interval_ms,
		.retain_revs = d->compact_retain,
		.capacity = d->capacity,
	};
	int r;

	if (d->read_only)
		return;
	r = efs_maint_new(&d->maint, &d->loop, d->etcd, d->session, &d->ns, d->metrics, &mo);
	if (r == 0)
		r = efs_maint_start(d->maint);
	if (r < 0)
		efs_log_warn("etcd maintenance not started: %s (compact etcd by hand, see "
			     "docs/OPERATIONS.md)",
			     strerror(-r));
}

static void stop_maint(struct daemon *d)
{
	d->maint = efs_maint_free(d->maint);
}

static void on_session_state(struct efs_session *s, enum efs_session_state old,
			     enum efs_session_state new_state, void *arg)
{
	struct daemon *d = arg;

	(void)s;
	if (new_state == EFS_SESSION_ACTIVE && old != EFS_SESSION_STARTING)
		efs_log_info("session %s -> %s", efs_session_state_name(old),
			     efs_session_state_name(new_state));
	else if (new_state != EFS_SESSION_ACTIVE && new_state != EFS_SESSION_CLOSED)
		efs_log_warn("session %s -> %s", efs_session_state_name(old),
			     efs_session_state_name(new_state));
	if (d->fs)
		efs_fs_session_changed(d->fs, old, new_state);
	efs_maint_session_changed(d->maint);
	if (d->phase == PH_RUNNING) {
		if (new_state == EFS_SESSION_ACTIVE)
			notify("STATUS=serving %s as node %s", d->mountpoint, d->node);
		else if (new_state == EFS_SESSION_SUSPENDED)
			notify("STATUS=suspended: etcd unreachable, operations wait (node %s, %s)",
			       d->node, d->mountpoint);
		else
			notify("STATUS=session %s: operations fail until unmounted (node %s, %s)",
			       efs_session_state_name(new_state), d->node, d->mountpoint);
	}
	if (new_state == EFS_SESSION_CLOSED && d->phase == PH_RUNNING)
		efs_log_err("the session closed for good; operations fail until unmounted");
}

/* The -o text handed to libfuse. */
static char *fuse_opt_string(struct daemon *d)
{
	char fsname[EFS_META_FSNAME_MAX + 32];
	char *s = NULL;
	int r;

	snprintf(fsname, sizeof(fsname), "fsname=etcfs:%s", d->sb.name);
	r = opt_append(&s, "default_permissions", strlen("default_permissions"));
	if (!r) {
		const char *f = d->fsname_opt ? d->fsname_opt : fsname;

		r = opt_append(&s, f, strlen(f));
	}
	if (!r) {
		const char *st = d->subtype_opt ? d->subtype_opt : "subtype=etcfs";

		r = opt_append(&s, st, strlen(st));
	}
	if (!r && d->user_fuse_opts)
		r = opt_append(&s, d->user_fuse_opts, strlen(d->user_fuse_opts));
	if (!r && d->ro_forced)
		r = opt_append(&s, "ro", strlen("ro"));
	if (r) {
		efs_mem_free(s);
		return NULL;
	}
	return s;
}

static int mount_fuse(struct daemon *d)
{
	uint32_t grace_ms = d->dead_grace_s ? d->dead_grace_s * 1000 : EFS_ALLOC_DEAD_GRACE_MS;
	struct efs_lockcache_opts lo = {
		.ns = &d->ns,
		.recall_bound_ms = d->recall_bound_s * 1000,
		.max_hold_ms = d->max_hold_ms,
		.contended_recalls = d->contended_recalls,
		.takeover_grace_ms = grace_ms,
	};
	struct efs_fs_opts fo = {
		.ns = &d->ns,
		.sb = &d->sb,
		.fi = d->fi,
		.read_only = d->read_only,
		.noatime = d->noatime,
		.cow = d->cow,
		.delegate = d->delegate,
		.batch_ms = d->batch_ms,
		.dev_fd = d->data_fd,
		.dev_direct = d->data_direct,
		.io_threads = d->io_threads,
		.flush_interval_ms = d->flush_interval_ms,
		.dead_grace_ms = grace_ms,
		.max_cached_files = d->max_cached_files,
		/* Kernel caches granted before a suspension must time out before
		 * the lease deadline: a quarter of the TTL, at most 1 s. */
		.cache_timeout_ms = (uint32_t)(d->session_ttl_s >= 4 ? 1000
					       : (d->session_ttl_s ? d->session_ttl_s : 2) * 250),
	};
	if (d->cache_timeout_set) {
		/* Never past the bound above: a suspension must outlast it. */
		if (d->cache_timeout_ms < fo.cache_timeout_ms)
			fo.cache_timeout_ms = d->cache_timeout_ms;
		if (!fo.cache_timeout_ms)
			fo.cache_timeout_ms = EFS_FS_NO_KERNEL_CACHE;
	}
	char *opts = NULL;
	char *fargv[4];
	struct fuse_args args;
	int r;

	r = efs_lockcache_new(&d->locks, &d->loop, d->etcd, d->session, &lo);
	if (r < 0) {
		report_error(d, "lock cache: %s", strerror(-r));
		return r;
	}
	if (d->m_recall_wait)
		efs_lockcache_set_recall_wait_cb(d->locks, on_recall_wait, d);
	if (d->m_handover)
		efs_lockcache_set_handover_cb(d->locks, on_handover, d);
	arm_early_fault_hooks(d);
	r = efs_fs_new(&d->fs, &d->loop, d->etcd, d->session, d->locks, d->metrics, &fo);
	if (r < 0) {
		report_error(d, "filesystem state: %s", strerror(-r));
		return r;
	}
	efs_fs_set_capacity(d->fs, d->capacity);
	/* A backup that listed the nodes before ours registered never asks
	 * us: no in-place overwrite until a read shows no backup pin (the
	 * first once the mount serves). */
	bk_guard_on(d);

	opts = fuse_opt_string(d);
	if (!opts) {
		report_error(d, "mount options: %s", strerror(ENOMEM));
		return -ENOMEM;
	}
	fargv[0] = (char *)prog;
	fargv[1] = (char *)"-o";
	fargv[2] = opts;
	fargv[3] = NULL;
	args = (struct fuse_args)FUSE_ARGS_INIT(3, fargv);
	d->se = fuse_session_new(&args, efs_fs_ops(), sizeof(struct fuse_lowlevel_ops), d->fs);
	fuse_opt_free_args(&args);
	if (!d->se) {
		/* libfuse said why on stderr ("unknown option", ...). */
		report_error(d, "cannot start a FUSE session with options '%s'", opts);
		efs_mem_free(opts);
		return -EINVAL;
	}
	efs_log_debug("FUSE options: %s", opts);
	efs_mem_free(opts);
	if (fuse_session_mount(d->se, d->mountpoint) != 0) {
		report_error(d, "cannot mount on %s (see the FUSE message above)", d->mountpoint);
		return -EIO;
	}
	d->mounted = true;
	r = efs_fuseio_install(d->se);
	if (r < 0)
		efs_log_warn("FUSE: custom I/O refused (%s): O_DIRECT writers of one file "
			     "stay serialised by the kernel",
			     strerror(-r));
	efs_fs_set_fuse(d->fs, d->se);
	r = efs_fuseloop_start(&d->fl, &d->loop, d->se, on_fuse_exit, d);
	if (r < 0) {
		report_error(d, "polling /dev/fuse: %s", strerror(-r));
		return r;
	}
	return 0;
}

static void on_session_started(struct efs_session *s, int status, void *arg)
{
	struct daemon *d = arg;
	int r;

	(void)s;
	if (status < 0) {
		report_error(d, "registering node %s: %s", d->node,
			     status == -EBUSY ? "node id in use (another etcfsd runs with it)"
					      : strerror(-status));
		schedule_teardown(d);
		return;
	}
	efs_log_info("session registered: node %s, lease %" PRIx64 ", generation %" PRIu64,
		     d->node, (uint64_t)efs_session_lease_id(d->session),
		     efs_session_generation(d->session));
	d->phase = PH_MOUNTING;
	if (d->want_leave) {
		begin_leave(d, d->leave_reason);
		return;
	}
	r = mount_fuse(d);
	if (r < 0) {
		begin_leave(d, "start failed");
		return;
	}
	start_maint(d);
	uv_timer_start(&d->ready_poll, on_ready_poll, 1, 2);
	uv_timer_start(&d->ready_timer, on_ready_timeout, READY_TIMEOUT_MS, 0);
}

static int start_loop(struct daemon *d)
{
	struct efs_etcd_opts eo;
	struct efs_session_opts so = {
		.ns = &d->ns,
		.node = d->node,
		.ttl_s = d->session_ttl_s,
		.quorum_loss_ms = d->quorum_timeout_ms,
		.cow = d->cow || d->read_only, /* a read-only node writes nothing */
	};
	int r;

	r = uv_loop_init(&d->loop);
	if (r < 0) {
		report_error(d, "event loop: %s", uv_strerror(r));
		return r;
	}
	d->loop_init = true;
	uv_signal_init(&d->loop, &d->sig_term);
	uv_signal_init(&d->loop, &d->sig_int);
	uv_timer_init(&d->loop, &d->lag_timer);
	uv_timer_init(&d->loop, &d->drain_timer);
	uv_timer_init(&d->loop, &d->leave_timer);
	uv_timer_init(&d->loop, &d->ready_timer);
	uv_timer_init(&d->loop, &d->ready_poll);
	uv_timer_init(&d->loop, &d->teardown_timer);
	uv_timer_init(&d->loop, &d->usage_timer);
	d->usage_timer.data = d;
	uv_timer_init(&d->loop, &d->bk_timer);
	d->bk_timer.data = d;
	d->usage_inodes = -1;
	d->teardown_timer.data = d;
	d->sig_term.data = d->sig_int.data = d;
	d->lag_timer.data = d->drain_timer.data = d->leave_timer.data = d->ready_timer.data = d;
	d->ready_poll.data = d;
	d->handles_init = true;
	uv_signal_start(&d->sig_term, on_signal, SIGTERM);
	uv_signal_start(&d->sig_int, on_signal, SIGINT);

	r = efs_metrics_new(&d->metrics);
	if (r < 0) {
		report_error(d, "metrics: %s", strerror(-r));
		return r;
	}
	register_metrics(d);
	if (d->metrics_addr) {
		r = efs_httpd_start(&d->httpd, &d->loop, d->metrics_addr, d->metrics);
		if (r < 0) {
			report_error(d, "--metrics-addr %s: %s", d->metrics_addr, strerror(-r));
			return r;
		}
		efs_httpd_set_probes(d->httpd, probe_healthz, probe_readyz, d);
		/* The test fixture reads this line. */
		efs_log_info("metrics: listening on http://%s/metrics", efs_httpd_address(d->httpd));
		so.metrics_addr = efs_httpd_address(d->httpd);
	}
	d->lag_prev_ms = uv_now(&d->loop);
	uv_timer_start(&d->lag_timer, on_lag_tick, LAG_INTERVAL_MS, LAG_INTERVAL_MS);

	r = efs_cli_etcd_opts(&d->etcd_cfg, &eo);
	if (r < 0) {
		report_error(d, "etcd options: %s", strerror(-r));
		return r;
	}
	r = efs_etcd_new(&d->etcd, &d->loop, &eo);
	efs_cli_etcd_opts_free(&eo);
	if (r < 0) {
		report_error(d, "etcd client: %s", strerror(-r));
		return r;
	}
	efs_etcd_set_call_observer(d->etcd, on_etcd_call, d);
	r = efs_capacity_new(&d->capacity, &d->loop, d->etcd,
			     &(struct efs_capacity_opts){.quota_bytes = d->etcd_quota,
							 .state_cb = on_capacity_state,
							 .arg = d});
	if (r < 0) {
		report_error(d, "etcd capacity monitor: %s", strerror(-r));
		return r;
	}
	r = efs_session_start(&d->session, &d->loop, d->etcd, &so, on_session_state,
			      on_session_started, d);
	if (r < 0) {
		d->session = NULL;
		report_error(d, "registering node %s: %s", d->node, strerror(-r));
		return r;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct daemon *d;
	int r, code;

	signal(SIGPIPE, SIG_IGN);
	d = efs_mem_calloc(1, sizeof(*d));
	if (!d) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return 1;
	}
	d->ready_fd = -1;
	d->data_fd = -1;
	r = parse_args(d, argc, argv);
	if (r != 0) {
		code = r > 0 ? 0 : 2;
		goto out_free;
	}
	efs_log_detect_journal();
	notify_open();
	if (!d->foreground) {
		if (daemonize(d) < 0) {
			code = 1;
			goto out_free;
		}
		/*
		 * Errors reach the user through the parent; before the mount
		 * is ready only warnings share its terminal, unless logs go to
		 * a file (then from the start).
		 */
		if (d->log_file) {
			int fd = open(d->log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);

			if (fd >= 0) {
				dup2(fd, STDERR_FILENO);
				close(fd);
			}
			efs_log_detect_journal();
		} else if (!d->log_level_set) {
			efs_log_set_level(EFS_LOG_WARN);
		}
	}

	code = 1;
	if (check_device(d) < 0)
		goto out_free;
	if (!d->foreground && chdir("/") < 0)
		efs_log_warn("chdir /: %s", strerror(errno));
	r = start_loop(d);
	if (r < 0)
		schedule_teardown(d);
	else
		d->phase = PH_STARTING;
	uv_run(&d->loop, UV_RUN_DEFAULT);
	code = d->exit_code;
	if (d->ready && code == 0)
		efs_log_info("stopped");

out_free:
	if (d->loop_init) {
		/* Everything closed itself; a handle left open is a bug elsewhere. */
		if (uv_loop_close(&d->loop) == UV_EBUSY)
			efs_log_debug("event loop: handles still open at exit");
	}
	/* The server that rendered them is closed by now. */
	d->metrics = efs_metrics_free(d->metrics);
	if (d->fi)
		efs_meta_record_free(d->fi);
	if (d->dev_open)
		efs_cli_device_close(&d->dev);
	if (d->data_fd >= 0)
		close(d->data_fd);
	efs_cli_etcd_free(&d->etcd_cfg);
	efs_mem_free(d->user_fuse_opts);
	efs_mem_free(d->metrics_addr);
	efs_mem_free(d->log_file);
	efs_mem_free(d->fsname_opt);
	efs_mem_free(d->subtype_opt);
	free(d->device);
	free(d->mountpoint);
	if (d->ready_fd >= 0)
		report_error(d, "exited during start");
	efs_mem_free(d);
	return code;
}
