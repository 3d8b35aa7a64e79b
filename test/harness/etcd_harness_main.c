/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcd-harness: the test harness as a command, for humans (the README quick
 * start), benches and scripts. It starts etcd members that outlive it,
 * records them in a state directory, and stops them by PID later.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static const char usage_text[] =
	"usage: etcd-harness COMMAND --state DIR [options]\n"
	"\n"
	"Runs a throwaway etcd (1 or 3 members, free ports, data on /dev/shm) that\n"
	"outlives this command; DIR records the PIDs. Never touches another etcd.\n"
	"\n"
	"commands:\n"
	"  start [options] [-- ETCD_ARGS...]  start a cluster, print ETCD_ENDPOINTS=...\n"
	"  stop                 stop every member by PID, remove data and DIR's files\n"
	"  status               one line per member: index pid state url leader\n"
	"  env                  print the env lines again (also in DIR/env)\n"
	"  leader               print the leader's index\n"
	"  kill|term|pause|resume|restart MEMBER\n"
	"                       fault injection; MEMBER is 0..2, leader, follower\n"
	"                       or dead (the first dead member, for restart)\n"
	"  etcdctl [--anon | --as USER:PASSWORD] -- ARGS...\n"
	"                       run etcdctl with the cluster's endpoints, TLS and root\n"
	"\n"
	"start options:\n"
	"  --members N          1 (default) or 3\n"
	"  --listen ADDR        local IP to listen on (default 127.0.0.1)\n"
	"  --tls                client TLS with a throwaway CA (openssl CLI)\n"
	"  --client-cert-auth   require client certificates (implies --tls)\n"
	"  --client-cn CN       client certificate CN (default etcfs-client)\n"
	"  --auth               create root and enable auth\n"
	"  --root-password PW   (default etcfs-root-pw)\n"
	"  --user U [--user-password PW] [--user-prefix P]\n"
	"                       also a non-root user with readwrite on prefix P\n"
	"  --auth-token-ttl S   simple token TTL in seconds\n"
	"  --quota BYTES        --quota-backend-bytes\n"
	"  --auto-compaction[=RETENTION]  periodic, default 1h\n"
	"  --heartbeat MS, --election MS\n"
	"  --fsync              keep fsync (default --unsafe-no-fsync)\n"
	"  --timeout MS         start timeout (default 20000)\n"
	"  --export             prefix env lines with 'export '\n"
	"\n"
	"--state may be replaced by $ETCFS_HARNESS_STATE.\n"
	"DIR/env holds the same KEY=value lines (ETCD_ENDPOINTS, ETCDCTL_*, ...).\n"
	"\n"
	"quick start:\n"
	"  eval \"$(etcd-harness start --export --state /tmp/etcfs-etcd)\"\n"
	"  etcdctl put k v        # ETCDCTL_API, ETCDCTL_ENDPOINTS... are exported\n"
	"  etcd-harness stop --state /tmp/etcfs-etcd\n";

enum {
	OPT_STATE = 256,
	OPT_MEMBERS,
	OPT_LISTEN,
	OPT_TLS,
	OPT_CCA,
	OPT_CN,
	OPT_AUTH,
	OPT_ROOTPW,
	OPT_USER,
	OPT_USERPW,
	OPT_USERPREFIX,
	OPT_TTL,
	OPT_QUOTA,
	OPT_AC,
	OPT_HB,
	OPT_EL,
	OPT_FSYNC,
	OPT_TIMEOUT,
	OPT_EXPORT,
	OPT_ANON,
	OPT_AS,
	OPT_HELP,
};

static const struct option long_opts[] = {
	{"state", required_argument, NULL, OPT_STATE},
	{"members", required_argument, NULL, OPT_MEMBERS},
	{"listen", required_argument, NULL, OPT_LISTEN},
	{"tls", no_argument, NULL, OPT_TLS},
	{"client-cert-auth", no_argument, NULL, OPT_CCA},
	{"client-cn", required_argument, NULL, OPT_CN},
	{"auth", no_argument, NULL, OPT_AUTH},
	{"root-password", required_argument, NULL, OPT_ROOTPW},
	{"user", required_argument, NULL, OPT_USER},
	{"user-password", required_argument, NULL, OPT_USERPW},
	{"user-prefix", required_argument, NULL, OPT_USERPREFIX},
	{"auth-token-ttl", required_argument, NULL, OPT_TTL},
	{"quota", required_argument, NULL, OPT_QUOTA},
	{"auto-compaction", optional_argument, NULL, OPT_AC},
	{"heartbeat", required_argument, NULL, OPT_HB},
	{"election", required_argument, NULL, OPT_EL},
	{"fsync", no_argument, NULL, OPT_FSYNC},
	{"timeout", required_argument, NULL, OPT_TIMEOUT},
	{"export", no_argument, NULL, OPT_EXPORT},
	{"anon", no_argument, NULL, OPT_ANON},
	{"as", required_argument, NULL, OPT_AS},
	{"help", no_argument, NULL, OPT_HELP},
	{NULL, 0, NULL, 0},
};

static int usage(int code)
{
	fputs(usage_text, code ? stderr : stdout);
	return code;
}

static bool parse_long(const char *s, long long min, long long max, long long *ret)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max) {
		fprintf(stderr, "etcd-harness: bad number '%s'\n", s);
		return false;
	}
	*ret = v;
	return true;
}

static void print_env(const char *text, bool export)
{
	const char *line = text;

	while (line && *line) {
		const char *nl = strchr(line, '\n');
		int len = nl ? (int)(nl - line) : (int)strlen(line);

		printf("%s%.*s\n", export ? "export " : "", len, line);
		line = nl ? nl + 1 : NULL;
	}
}

/* MEMBER: an index, "leader", "follower" or "dead" (the first dead one). */
static int resolve_member(struct efs_harness *h, const char *s)
{
	long long v;
	int r;

	if (!strcmp(s, "leader")) {
		r = efs_harness_wait_leader(h, 5000);
		if (r < 0)
			fprintf(stderr, "etcd-harness: no leader: %s\n", strerror(-r));
		return r;
	}
	if (!strcmp(s, "follower")) {
		r = efs_harness_follower(h);
		if (r < 0)
			fprintf(stderr, "etcd-harness: no follower: %s\n", strerror(-r));
		return r;
	}
	if (!strcmp(s, "dead")) {
		for (int i = 0; i < efs_harness_members(h); i++) {
			if (efs_harness_state(h, i) == EFS_HARNESS_DEAD)
				return i;
		}
		fprintf(stderr, "etcd-harness: no member is dead\n");
		return -ENOENT;
	}
	if (!parse_long(s, 0, efs_harness_members(h) - 1, &v))
		return -EINVAL;
	return (int)v;
}

static int attach(struct efs_harness **h, const char *state)
{
	int r = efs_harness_attach(h, state);

	if (r == -ENOENT)
		fprintf(stderr, "etcd-harness: no cluster recorded in %s\n", state);
	else if (r < 0)
		fprintf(stderr, "etcd-harness: cannot read %s/state: %s\n", state, strerror(-r));
	return r;
}

static int cmd_start(struct efs_harness_opts *o, const char *state, bool export)
{
	struct efs_harness *h, *old;
	char *env = NULL;
	int r;

	if (efs_harness_attach(&old, state) == 0) {
		bool alive = false;

		for (int i = 0; i < efs_harness_members(old); i++)
			alive |= efs_harness_pid(old, i) > 0;
		if (alive) {
			(void)efs_harness_detach(old, state);
			fprintf(stderr,
				"etcd-harness: a cluster recorded in %s is still running; "
				"stop it first\n",
				state);
			return 1;
		}
		/* A dead cluster's leftovers: remove its directories. */
		efs_harness_free(old);
	}
	o->detached = true;
	r = efs_harness_start(&h, o);
	if (r < 0) {
		fprintf(stderr, "etcd-harness: start failed: %s\n", strerror(-r));
		return 1;
	}
	r = efs_harness_env_text(h, &env);
	if (r == 0)
		r = efs_harness_detach(h, state);
	if (r < 0) {
		fprintf(stderr, "etcd-harness: cannot record the cluster in %s: %s\n", state,
			strerror(-r));
		efs_harness_free(h);
		free(env);
		return 1;
	}
	print_env(env, export);
	fprintf(stderr, "# etcd running; env in %s/env; stop with: etcd-harness stop --state %s\n",
		state, state);
	free(env);
	return 0;
}

static int cmd_status(struct efs_harness *h)
{
	int leader = efs_harness_leader(h), alive = 0;
	static const char *const names[] = {"running", "paused", "dead"};

	for (int i = 0; i < efs_harness_members(h); i++) {
		enum efs_harness_member_state st = efs_harness_state(h, i);
		pid_t pid = efs_harness_pid(h, i);

		alive += st != EFS_HARNESS_DEAD;
		printf("%d %d %s %s%s\n", i, pid > 0 ? (int)pid : 0, names[st],
		       efs_harness_member_url(h, i), i == leader ? " leader" : "");
	}
	return alive == efs_harness_members(h) ? 0 : 1;
}

static int cmd_fault(struct efs_harness *h, const char *cmd, const char *member)
{
	int i = resolve_member(h, member), r;

	if (i < 0)
		return 1;
	if (!strcmp(cmd, "kill"))
		r = efs_harness_kill(h, i);
	else if (!strcmp(cmd, "term"))
		r = efs_harness_stop(h, i);
	else if (!strcmp(cmd, "pause"))
		r = efs_harness_pause(h, i);
	else if (!strcmp(cmd, "resume"))
		r = efs_harness_resume(h, i);
	else
		r = efs_harness_restart(h, i);
	if (r < 0) {
		fprintf(stderr, "etcd-harness: %s %d: %s\n", cmd, i, strerror(-r));
		return 1;
	}
	printf("%d\n", i);
	return 0;
}

static int cmd_etcdctl(struct efs_harness *h, const char *as, bool anon, int argc,
		       char *const *argv)
{
	char *out = NULL, *user = NULL, *pw = NULL;
	int r;

	if (as) {
		user = strdup(as);
		if (!user)
			return 1;
		pw = strchr(user, ':');
		if (pw)
			*pw++ = '\0';
		r = efs_harness_etcdctlv(h, user, pw ? pw : "", &out, argc,
					 (const char *const *)argv);
	} else if (anon) {
		r = efs_harness_etcdctlv(h, NULL, NULL, &out, argc, (const char *const *)argv);
	} else {
		r = efs_harness_etcdctlv(h, efs_harness_root_password(h) ? "root" : NULL,
					 efs_harness_root_password(h), &out, argc,
					 (const char *const *)argv);
	}
	free(user);
	if (out)
		fputs(out, stdout);
	free(out);
	if (r < 0) {
		fprintf(stderr, "etcd-harness: etcdctl: %s\n", strerror(-r));
		return 1;
	}
	return r;
}

int main(int argc, char **argv)
{
	struct efs_harness_opts o = {0};
	const char *state = getenv("ETCFS_HARNESS_STATE"), *cmd, *as = NULL;
	const char *extra[33] = {NULL};
	bool export = false, anon = false;
	struct efs_harness *h;
	long long v;
	int c, r;

	if (argc < 2)
		return usage(2);
	cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help"))
		return usage(0);
	optind = 2;
	while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
		switch (c) {
		case OPT_STATE:
			state = optarg;
			break;
		case OPT_MEMBERS:
			if (!parse_long(optarg, 1, 3, &v))
				return 2;
			o.members = (int)v;
			break;
		case OPT_LISTEN:
			o.listen_addr = optarg;
			break;
		case OPT_CCA:
			o.client_cert_auth = true;
			o.tls = true;
			break;
		case OPT_TLS:
			o.tls = true;
			break;
		case OPT_CN:
			o.client_cert_cn = optarg;
			break;
		case OPT_AUTH:
			o.auth = true;
			break;
		case OPT_ROOTPW:
			o.root_password = optarg;
			break;
		case OPT_USER:
			o.user = optarg;
			break;
		case OPT_USERPW:
			o.user_password = optarg;
			break;
		case OPT_USERPREFIX:
			o.user_prefix = optarg;
			break;
		case OPT_TTL:
			if (!parse_long(optarg, 1, 1 << 30, &v))
				return 2;
			o.auth_token_ttl_s = (int)v;
			break;
		case OPT_QUOTA:
			if (!parse_long(optarg, 1, 1LL << 40, &v))
				return 2;
			o.quota_bytes = v;
			break;
		case OPT_AC:
			o.auto_compaction = true;
			o.auto_compaction_retention = optarg;
			break;
		case OPT_HB:
			if (!parse_long(optarg, 1, 100000, &v))
				return 2;
			o.heartbeat_ms = (int)v;
			break;
		case OPT_EL:
			if (!parse_long(optarg, 1, 1000000, &v))
				return 2;
			o.election_ms = (int)v;
			break;
		case OPT_FSYNC:
			o.fsync = true;
			break;
		case OPT_TIMEOUT:
			if (!parse_long(optarg, 1, 600000, &v))
				return 2;
			o.start_timeout_ms = (int)v;
			break;
		case OPT_EXPORT:
			export = true;
			break;
		case OPT_ANON:
			anon = true;
			break;
		case OPT_AS:
			as = optarg;
			break;
		case OPT_HELP:
			return usage(0);
		default:
			return usage(2);
		}
	}
	if (!state || !*state) {
		fprintf(stderr, "etcd-harness: --state DIR is required\n");
		return 2;
	}
	if (!strcmp(cmd, "start")) {
		int n = 0;

		for (int i = optind; i < argc; i++) {
			if (n == 32) {
				fprintf(stderr, "etcd-harness: too many etcd arguments\n");
				return 2;
			}
			extra[n++] = argv[i];
		}
		o.extra_args = n ? extra : NULL;
		return cmd_start(&o, state, export);
	}
	if (!strcmp(cmd, "stop")) {
		if (attach(&h, state) < 0)
			return 1;
		efs_harness_free(h);
		return 0;
	}
	if (attach(&h, state) < 0)
		return 1;
	if (!strcmp(cmd, "status")) {
		r = cmd_status(h);
	} else if (!strcmp(cmd, "env")) {
		char *env = NULL;

		r = efs_harness_env_text(h, &env) < 0;
		if (!r)
			print_env(env, export);
		free(env);
	} else if (!strcmp(cmd, "leader")) {
		r = efs_harness_leader(h);
		if (r >= 0)
			printf("%d\n", r);
		else
			fprintf(stderr, "etcd-harness: no single leader: %s\n", strerror(-r));
		r = r < 0;
	} else if (!strcmp(cmd, "kill") || !strcmp(cmd, "term") || !strcmp(cmd, "pause") ||
		   !strcmp(cmd, "resume") || !strcmp(cmd, "restart")) {
		if (optind + 1 != argc) {
			fprintf(stderr, "etcd-harness: %s needs one MEMBER\n", cmd);
			r = 2;
		} else {
			r = cmd_fault(h, cmd, argv[optind]);
		}
	} else if (!strcmp(cmd, "etcdctl")) {
		r = cmd_etcdctl(h, as, anon, argc - optind, argv + optind);
	} else {
		fprintf(stderr, "etcd-harness: unknown command '%s'\n", cmd);
		r = 2;
	}
	/* Record what changed (PIDs after restart, pause states). */
	if (efs_harness_detach(h, state) < 0) {
		fprintf(stderr, "etcd-harness: cannot update %s/state\n", state);
		return 1;
	}
	return r;
}
