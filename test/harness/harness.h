/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/*
 * The etcd test harness: starts real etcd members (from the etcd-server
 * package, /usr/bin/etcd or $ETCFS_ETCD) for the integration tests, the
 * benches and the CLI test/harness/etcd-harness. Nothing here talks to an
 * etcd the user already runs. etcdctl ($ETCFS_ETCDCTL, /usr/bin/etcdctl)
 * and openssl ($ETCFS_OPENSSL, /usr/bin/openssl) run with a clean ETCD_*
 * and ETCDCTL_* environment, so a sourced CLI env file changes nothing.
 *
 * A harness is one cluster of 1 or 3 members on free ports of one local
 * address, with data directories under /dev/shm/etcfs-harness-<pid>-<n>/
 * (tmpfs). Each member has a client URL (https:// when TLS is on), a
 * plaintext peer URL and a plaintext metrics URL (--listen-metrics-urls) that
 * the harness itself uses for health and leader checks, so those never need
 * TLS or credentials.
 *
 * Lifetime: every process the harness starts is stopped by PID in
 * efs_harness_free(). Members also die with the process that started them
 * (PR_SET_PDEATHSIG): note that Linux delivers it when the *thread* that
 * forked exits, so start and restart from a thread that outlives the harness
 * (the main thread, or Criterion's .init/test body). An atexit handler frees
 * harnesses that are still live at exit(), and each start removes stale
 * /dev/shm/etcfs-harness-<pid>-* directories whose process is gone.
 *
 * Criterion forks per test: start the cluster in .init (or the test body),
 * free it in .fini. Harness memory comes from plain malloc, not efs_mem_*,
 * so failure injection armed by a test never hits the harness.
 *
 * Not thread-safe: one thread uses a harness at a time. Functions return 0
 * (or an index) on success and -errno on failure; failures of start and
 * restart also print a clear message on stderr, with the tail of the
 * member's log when etcd itself failed.
 */

#define EFS_HARNESS_MAX_MEMBERS 3

/* User names the harness creates when auth is on. */
#define EFS_HARNESS_ROOT_USER "root"

/*
 * Start options. A zero-initialised struct is valid and gives one member on
 * 127.0.0.1, plaintext, no auth, no auto-compaction, etcd's default quota,
 * heartbeat and election timeout, and --unsafe-no-fsync (data is on tmpfs
 * anyway; set |fsync| to keep etcd's fsyncs, e.g. for a bench that quotes
 * commit costs). Strings are borrowed for the duration of efs_harness_start().
 */
struct efs_harness_opts {
	/* 1 or 3 (0 means 1). */
	int members;
	/*
	 * Local IPv4 or IPv6 address every member listens on, client, peer and
	 * metrics alike (NULL: 127.0.0.1). Use an address of a veth in a test
	 * network namespace to make the cluster reachable from there.
	 */
	const char *listen_addr;
	/*
	 * More IPv4 addresses (NULL-terminated, at most 4, or NULL) on which
	 * every member also serves clients, on the same port as on
	 * |listen_addr| (peers and metrics stay on |listen_addr| alone): one
	 * cluster reachable from the host's loopback and from several network
	 * namespaces, each through its veth's host-side address. The
	 * addresses must exist when the harness starts. Not with |detached|.
	 */
	const char *const *extra_client_addrs;
	/*
	 * Periodic auto-compaction (--auto-compaction-mode=periodic); the
	 * retention is |auto_compaction_retention| (NULL: "1h").
	 */
	bool auto_compaction;
	const char *auto_compaction_retention;
	/* --quota-backend-bytes when > 0. */
	long long quota_bytes;
	/*
	 * Client TLS with a throwaway CA made by the openssl CLI. The server
	 * certificate names IP:127.0.0.1, DNS:localhost and |listen_addr|. A
	 * client certificate (CN |client_cert_cn|, NULL: "etcfs-client") is
	 * always made; |client_cert_auth| makes etcd require it
	 * (--client-cert-auth). With auth on as well, etcd takes the CN of a
	 * client certificate as the user name when a request carries no token,
	 * so the default CN names no user. Peers stay plaintext.
	 */
	bool tls;
	bool client_cert_auth;
	const char *client_cert_cn;
	/*
	 * Auth: after start the harness creates user "root" with password
	 * |root_password| (NULL: "etcfs-root-pw") and enables auth. When
	 * |user| is set it also creates that user with |user_password| (NULL:
	 * "etcfs-user-pw") and a role "etcfs-rw" granting readwrite on the keys
	 * under |user_prefix| (NULL: all keys).
	 */
	bool auth;
	const char *root_password;
	const char *user;
	const char *user_password;
	const char *user_prefix;
	/* --auth-token-ttl in seconds (simple tokens) when > 0. */
	int auth_token_ttl_s;
	/*
	 * --heartbeat-interval and --election-timeout in ms when > 0. 50/500
	 * makes elections after a kill or pause about twice as fast as etcd's
	 * 100/1000, but also lowers the smallest lease TTL etcd grants.
	 */
	int heartbeat_ms;
	int election_ms;
	/* Keep etcd's fsyncs (default: --unsafe-no-fsync). */
	bool fsync;
	/* NULL-terminated extra etcd arguments appended to each member, or NULL. */
	const char *const *extra_args;
	/* Bound on the whole start, in ms (0: 20000). */
	int start_timeout_ms;
	/*
	 * For the CLI only: members do not die with this process (no
	 * PDEATHSIG, own session), data directories are named
	 * /dev/shm/etcfs-harness-detached-<pid>-<n>/ so that no sweep removes
	 * them, and efs_harness_detach() may hand the cluster over to a state
	 * directory.
	 */
	bool detached;
};

enum efs_harness_member_state {
	EFS_HARNESS_RUNNING,
	EFS_HARNESS_PAUSED,
	EFS_HARNESS_DEAD,
};

struct efs_harness;

/*
 * Starts a cluster as |opts| (NULL: defaults) says and waits, within the
 * start timeout, until every member answers /health with true, a leader
 * exists, and auth (if asked) is set up. Port collisions with other
 * processes (EADDRINUSE between picking a free port and etcd binding it)
 * are retried with fresh ports a few times. On success *|ret_h| is the new
 * harness; on failure nothing is left running or on disk. Errors: -EINVAL
 * (bad options), -ENOENT (etcd or openssl missing), -EADDRINUSE,
 * -ETIMEDOUT, -EIO (a member exited or a setup command failed), -ENOMEM.
 */
int efs_harness_start(struct efs_harness **ret_h, const struct efs_harness_opts *opts);

/*
 * Stops every member by PID (SIGCONT for paused ones, then SIGTERM one after
 * the other, SIGKILL for what is left after 3 s in all, reaped) and removes
 * the data, log and certificate directories. In a forked child of the
 * process that started |h| it only frees memory. Accepts NULL; returns NULL.
 */
struct efs_harness *efs_harness_free(struct efs_harness *h);

/* Number of members. */
int efs_harness_members(const struct efs_harness *h);
/* Comma-separated client URLs of all members ("https://..." with TLS). */
const char *efs_harness_endpoints(const struct efs_harness *h);
/* The client port of member |i| (on every client address), -EINVAL out of range. */
int efs_harness_client_port(const struct efs_harness *h, int i);
/* Client URL, peer URL, metrics URL of member |i| (NULL if out of range). */
const char *efs_harness_member_url(const struct efs_harness *h, int i);
const char *efs_harness_peer_url(const struct efs_harness *h, int i);
const char *efs_harness_metrics_url(const struct efs_harness *h, int i);
/* "host:port" of member |i|'s client listener, without scheme. */
const char *efs_harness_member_hostport(const struct efs_harness *h, int i);
/* PID of member |i|, or -ESRCH when it is dead, -EINVAL out of range. */
pid_t efs_harness_pid(const struct efs_harness *h, int i);
enum efs_harness_member_state efs_harness_state(const struct efs_harness *h, int i);
/* The harness directory (holds m<i>/ data dirs, m<i>.log, tls/). */
const char *efs_harness_dir(const struct efs_harness *h);
/* Path of member |i|'s etcd log file. */
const char *efs_harness_log_path(const struct efs_harness *h, int i);

/* TLS file paths (PEM), NULL when TLS is off. */
const char *efs_harness_cacert(const struct efs_harness *h);
const char *efs_harness_client_cert(const struct efs_harness *h);
const char *efs_harness_client_key(const struct efs_harness *h);
/* Root and test-user credentials, NULL when auth (or the user) is off. */
const char *efs_harness_root_password(const struct efs_harness *h);
const char *efs_harness_user(const struct efs_harness *h);
const char *efs_harness_user_password(const struct efs_harness *h);

/*
 * Index of the current leader: the one running (not paused) member whose
 * metrics say etcd_server_is_leader 1. -ENOENT when none does, -EAGAIN when
 * more than one does (an old leader that has not stepped down yet). Asks
 * each running member once, bounded by 2 s per member.
 */
int efs_harness_leader(struct efs_harness *h);
/*
 * Index of a running member that is not the leader and knows a leader
 * (etcd_server_has_leader 1), -ENOENT if there is none.
 */
int efs_harness_follower(struct efs_harness *h);
/* Polls efs_harness_leader() until it gives an index; -ETIMEDOUT. */
int efs_harness_wait_leader(struct efs_harness *h, int timeout_ms);
/*
 * Waits until running member |i| answers /health with true (it has a
 * leader and serves); -ETIMEDOUT, -ESRCH if it is dead, -EBUSY if paused.
 */
int efs_harness_wait_member(struct efs_harness *h, int i, int timeout_ms);

/*
 * Fault injection on member |i|. kill: SIGKILL and reap (-ESRCH when
 * already dead). stop: SIGTERM, SIGKILL after 3 s, reap. pause: SIGSTOP,
 * then waits until every thread of the member is stopped (/proc state T),
 * so that it answers nothing once pause returns (-EALREADY when paused).
 * resume: SIGCONT, then waits until no thread is stopped any more
 * (-EALREADY when running). Both wait at most 3 s (-ETIMEDOUT; the member
 * counts as paused, or running, all the same) and return -ESRCH when the
 * member dies meanwhile.
 * restart: starts a dead member again with the same ports, flags and data
 * directory and waits until it serves (-EBUSY when it is not dead; -EIO,
 * with its log tail on stderr, when it exits, e.g. because another process
 * took its port meanwhile, which is retried a few times first; -ETIMEDOUT).
 * A paused member can be killed directly; stop resumes it first.
 */
int efs_harness_kill(struct efs_harness *h, int i);
int efs_harness_stop(struct efs_harness *h, int i);
int efs_harness_pause(struct efs_harness *h, int i);
int efs_harness_resume(struct efs_harness *h, int i);
int efs_harness_restart(struct efs_harness *h, int i);

/*
 * Runs etcdctl (ETCDCTL_API=3) against the running members, with the
 * harness's TLS flags, timeouts and, when auth is on, root's credentials,
 * followed by the NULL-terminated arguments. Later flags win, so an
 * argument may override --cacert, --cert, --key (e.g. "--cert=" for none)
 * or the timeouts; an --endpoints argument replaces the harness's list (it
 * would otherwise add to it), e.g. "--endpoints=" + efs_harness_member_url()
 * to ask one member alone. Returns etcdctl's exit status (0 on success, >0
 * on failure) or -errno when it could not be run or took longer than 15 s
 * (-ETIMEDOUT, the process is killed), -ESRCH when no member
 * is running. If |ret_out| is not NULL, it receives etcdctl's stdout and
 * stderr, NUL-terminated (free() it), whenever the return is >= 0.
 */
int efs_harness_etcdctl(struct efs_harness *h, char **ret_out, ...)
	__attribute__((sentinel));
/*
 * The same as |user|:|password|; |user| NULL runs it anonymously (no
 * credentials, still with the client certificate when TLS is on).
 */
int efs_harness_etcdctl_as(struct efs_harness *h, const char *user, const char *password,
			   char **ret_out, ...) __attribute__((sentinel));
/* The same with an argument vector of |argc| entries. */
int efs_harness_etcdctlv(struct efs_harness *h, const char *user, const char *password,
			 char **ret_out, int argc, const char *const *argv);

/*
 * Reads the value of an unlabelled gauge or counter |name| (e.g.
 * "etcd_server_is_leader") from member |i|'s /metrics into *|ret_value|.
 * -ENOENT when the metric is absent, -ECONNREFUSED/-ETIMEDOUT/-EIO when the
 * member does not answer, -EBUSY when it is paused, -ESRCH when dead.
 */
int efs_harness_metric(struct efs_harness *h, int i, const char *name, double *ret_value);

/*
 * CLI support. detach writes the cluster's state (options, ports, PIDs,
 * paths) to |state_dir|/state and an env file |state_dir|/env with
 * ETCD_ENDPOINTS=... lines, then frees |h| without stopping anything;
 * only for a harness started with opts.detached (-EINVAL otherwise).
 * attach reads such a state directory back into a harness whose members are
 * not our children: kill/stop/pause/resume/leader work on them (a PID whose
 * command line no longer names the member's data directory counts as dead),
 * restart starts a detached member, and efs_harness_free() stops them all
 * and removes the directories and the state files. -ENOENT when there is no
 * state, -EBADMSG when it cannot be parsed.
 */
int efs_harness_detach(struct efs_harness *h, const char *state_dir);
/*
 * The env file's text (lines KEY=value, shell-quoted where needed):
 * ETCD_ENDPOINTS, ETCDCTL_API, ETCDCTL_ENDPOINTS, with TLS ETCD_CACERT,
 * ETCD_CERT, ETCD_KEY and their ETCDCTL_* twins, with auth ETCD_USER,
 * ETCD_PASSWORD and ETCDCTL_USER. *|ret_text| is malloc'ed (free()).
 */
int efs_harness_env_text(const struct efs_harness *h, char **ret_text);
int efs_harness_attach(struct efs_harness **ret_h, const char *state_dir);
