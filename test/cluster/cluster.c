/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cluster fixture of cluster.h. Every process it starts is a child
 * stopped by PID; each daemon runs in the foreground (-f) with its stderr
 * in its own log file, and dies with the test program (PR_SET_PDEATHSIG:
 * SIGTERM, so that it still leaves cleanly).
 *
 * The watchdog is a thread that sleeps until the armed bound passes. It
 * never touches a mount point (a stat of a hung mount hangs too): it
 * reads the connection's "waiting" count and writes its "abort" file in
 * the fusectl filesystem, which the fixture mounts when it is not.
 */
#include "cluster.h"
#include "proc.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FUSECTL		"/sys/fs/fuse/connections"
#define MOUNT_WAIT_MS	30000
#define EXIT_WAIT_MS	30000
#define RUN_TIMEOUT_MS	120000
#define FS_NAME		"clusterfs"
#define NETNS_DIR	"/run/netns"
#define NETNS_PREFIX	"efs-cl-" /* + "<pid>-<node>" */
#define VETH_PREFIX	"ecl"	  /* + "<pid>n<node>": the host side */
#define NS_VETH		"veth0"	  /* the side in the namespace */
#define IP_TIMEOUT_MS	20000

jmp_buf *efs_cl_jmp;
char efs_cl_msg[8192];

struct efs_cl_wd {
	struct efs_cl *c;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t deadline_ms; /* 0: disarmed */
	char what[160];
	char hung[12288];
	char ctl[PATH_MAX]; /* etcfsctl */
	bool stop;
};

void efs_cl_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(efs_cl_msg, sizeof(efs_cl_msg), fmt, ap);
	va_end(ap);
	if (!efs_cl_jmp) {
		fprintf(stderr, "cluster fixture: %s\n", efs_cl_msg);
		abort();
	}
	longjmp(*efs_cl_jmp, 1);
}

void efs_cl_fail_at(const char *file, int line, const char *cond, const char *fmt, ...)
{
	char what[6000];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	efs_cl_fail("%s:%d: %s (failed: %s)", file, line, what, cond);
}

uint64_t efs_cl_now_ms(void)
{
	return efs_tp_now_ms();
}

void efs_cl_sleep_ms(unsigned ms)
{
	efs_tp_sleep_ms(ms);
}

static const char *build_root(void)
{
	const char *root = efs_tp_build_root();

	if (!root)
		efs_cl_fail("ETCFS_BUILD_ROOT is not set and the build root cannot be found "
			    "from /proc/self/exe");
	return root;
}

static void command_path(const char *cmd, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s/etcfsd/%s", build_root(), cmd);

	if (n <= 0 || (size_t)n >= size)
		efs_cl_fail("path of %s too long", cmd);
}

void efs_cl_log_tail(struct efs_cl *c, int i, char *buf, size_t max)
{
	efs_tp_file_tail(c->node[i].log, buf, max);
}

/*
 * The FUSE connection mounted last on |dir| (an absolute path): the minor
 * number of its device, from /proc/self/mountinfo; 0 when |dir| is not a
 * FUSE mount. Never touches the mount itself.
 */
static unsigned fuse_conn(const char *dir)
{
	FILE *fp = fopen("/proc/self/mountinfo", "re");
	char line[4096];
	unsigned conn = 0;

	if (!fp)
		return 0;
	/* "id parent maj:min root mountpoint opts [optional...] - fstype source superopts" */
	while (fgets(line, sizeof(line), fp)) {
		char mp[PATH_MAX], fstype[64], *sep;
		unsigned maj, min;

		if (sscanf(line, "%*s %*s %u:%u %*s %4095s", &maj, &min, mp) != 3)
			continue;
		if (strcmp(mp, dir) != 0)
			continue;
		sep = strstr(line, " - ");
		if (!sep || sscanf(sep + 3, "%63s", fstype) != 1)
			continue;
		conn = strncmp(fstype, "fuse", 4) == 0 ? min : 0;
	}
	fclose(fp);
	return conn;
}

static bool fusectl_is_mounted(void)
{
	FILE *fp = fopen("/proc/self/mountinfo", "re");
	char line[4096];
	bool found = false;

	if (!fp)
		return false;
	while (!found && fgets(line, sizeof(line), fp))
		found = strstr(line, " " FUSECTL " ") && strstr(line, " - fusectl ");
	fclose(fp);
	return found;
}

/* Writes "1" to the abort file of connection |conn|; its waiting count
 * before, or -1 when the connection is not there. */
static int abort_conn(unsigned conn, bool only_waiting)
{
	char path[128], buf[32];
	int fd, waiting = -1;
	ssize_t n;

	snprintf(path, sizeof(path), FUSECTL "/%u/waiting", conn);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n > 0) {
		buf[n] = '\0';
		waiting = atoi(buf);
	}
	if (only_waiting && waiting <= 0)
		return waiting;
	snprintf(path, sizeof(path), FUSECTL "/%u/abort", conn);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (write(fd, "1", 1) != 1)
			waiting = -1;
		close(fd);
	}
	return waiting;
}

/* Who holds and who waits for which lock (etcfsctl locks), into |keys|;
 * the watchdog cannot fail the check, so a failure is only reported. */
static void dump_locks(struct efs_cl_wd *wd, char *keys, size_t size)
{
	const char *args[] = {"locks", "--name", FS_NAME, "--recall-bound",
			      EFS_CL_RECALL_BOUND_S, NULL};
	char out[3500];
	int r;

	r = efs_tp_run_tool(wd->ctl, "etcfsctl", wd->c->endpoints, args, out, sizeof(out), 15000);
	snprintf(keys, size, "\netcfsctl locks then (exit %d):\n%s", r, out);
}

/* The kernel stacks of a daemon's threads that wait in the kernel for
 * something other than their event loop, futexes or FUSE requests to
 * read: where an invalidation (or any system call) hangs. */
static void dump_stacks(const struct efs_cl_node *nd, char *out, size_t size)
{
	char path[320], comm[64], stack[2048];
	struct dirent *de;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)nd->pid);
	dir = opendir(path);
	if (!dir)
		return;
	while ((de = readdir(dir))) {
		size_t used = strlen(out);
		char *nl;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/stack", (int)nd->pid, de->d_name);
		efs_tp_file_tail(path, stack, sizeof(stack));
		if (!stack[0] || strstr(stack, "futex_wait") || strstr(stack, "ep_poll") ||
		    strstr(stack, "fuse_dev_do_read") || strstr(stack, "do_sys_poll"))
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)nd->pid, de->d_name);
		efs_tp_file_tail(path, comm, sizeof(comm));
		if ((nl = strchr(comm, '\n')))
			*nl = '\0';
		snprintf(out + used, size - used, "%s thread %s (%s):\n%.600s", nd->id, de->d_name,
			 comm, stack);
	}
	closedir(dir);
}

/* The watchdog: aborts the connections with requests waiting once the
 * deadline passes, and says which. */
static void *wd_main(void *arg)
{
	struct efs_cl_wd *wd = arg;
	static char keys[8192];

	pthread_mutex_lock(&wd->mu);
	while (!wd->stop) {
		uint64_t now = efs_cl_now_ms();

		if (!wd->deadline_ms || now < wd->deadline_ms) {
			struct timespec ts;
			uint64_t wait = wd->deadline_ms ? wd->deadline_ms - now : 1000;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += (time_t)(wait / 1000);
			ts.tv_nsec += (long)(wait % 1000) * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&wd->cv, &wd->mu, &ts);
			continue;
		}
		/* The bound passed: first the holder and recall keys, which
		 * say who waits for whom, then abort. */
		wd->deadline_ms = 0;
		dump_locks(wd, keys, sizeof(keys));
		snprintf(keys + strlen(keys), sizeof(keys) - strlen(keys),
			 "kernel stacks of daemon threads blocked elsewhere:\n");
		for (int i = 0; i < wd->c->n; i++)
			if (wd->c->node[i].pid)
				dump_stacks(&wd->c->node[i], keys, sizeof(keys));
		for (int i = 0; i < wd->c->n; i++) {
			struct efs_cl_node *nd = &wd->c->node[i];
			size_t used = strlen(wd->hung);
			int waiting;

			if (!nd->conn)
				continue;
			waiting = abort_conn(nd->conn, true);
			if (waiting > 0)
				nd->aborted = true;
			if (waiting > 0)
				snprintf(wd->hung + used, sizeof(wd->hung) - used,
					 "%s%s (%s) hung with %d FUSE requests waiting after the "
					 "bound of %s: connection %u aborted",
					 used ? "; " : "", nd->mnt, nd->id, waiting, wd->what,
					 nd->conn);
		}
		if (!wd->hung[0])
			snprintf(wd->hung, sizeof(wd->hung),
				 "the bound of %s passed with no FUSE request waiting", wd->what);
		snprintf(wd->hung + strlen(wd->hung), sizeof(wd->hung) - strlen(wd->hung), "%s",
			 keys);
	}
	pthread_mutex_unlock(&wd->mu);
	return NULL;
}

void efs_cl_bound(struct efs_cl *c, uint64_t ms, const char *what)
{
	struct efs_cl_wd *wd = c->wd;

	if (!wd)
		return;
	pthread_mutex_lock(&wd->mu);
	wd->deadline_ms = ms ? efs_cl_now_ms() + ms : 0;
	if (ms) {
		snprintf(wd->what, sizeof(wd->what), "%s", what ? what : "?");
		wd->hung[0] = '\0';
	}
	pthread_cond_signal(&wd->cv);
	pthread_mutex_unlock(&wd->mu);
}

const char *efs_cl_hung(struct efs_cl *c)
{
	static char copy[12288];

	if (!c->wd)
		return "";
	pthread_mutex_lock(&c->wd->mu);
	snprintf(copy, sizeof(copy), "%s", c->wd->hung);
	pthread_mutex_unlock(&c->wd->mu);
	return copy;
}

static void wd_start(struct efs_cl *c)
{
	struct efs_cl_wd *wd = calloc(1, sizeof(*wd));

	if (!wd)
		efs_cl_fail("out of memory");
	wd->c = c;
	command_path("etcfsctl", wd->ctl, sizeof(wd->ctl));
	pthread_mutex_init(&wd->mu, NULL);
	pthread_cond_init(&wd->cv, NULL);
	if (pthread_create(&wd->thread, NULL, wd_main, wd) != 0) {
		free(wd);
		efs_cl_fail("cannot start the watchdog thread");
	}
	c->wd = wd;
}

static void wd_stop(struct efs_cl *c)
{
	struct efs_cl_wd *wd = c->wd;

	if (!wd)
		return;
	pthread_mutex_lock(&wd->mu);
	wd->stop = true;
	pthread_cond_signal(&wd->cv);
	pthread_mutex_unlock(&wd->mu);
	pthread_join(wd->thread, NULL);
	pthread_mutex_destroy(&wd->mu);
	pthread_cond_destroy(&wd->cv);
	free(wd);
	c->wd = NULL;
}

/* ---- Network namespaces ---- */

static const char *ip_path(void)
{
	static const char *const cands[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};

	for (size_t k = 0; k < sizeof(cands) / sizeof(cands[0]); k++)
		if (access(cands[k], X_OK) == 0)
			return cands[k];
	return NULL;
}

/* Runs "ip |arg1| ..." (NULL-terminated): its exit status (-1 when it
 * could not run, -2 at the bound), its output in |out|. */
static int ip_runv(char *out, size_t size, const char *arg1, va_list ap)
{
	const char *argv[32], *ip = ip_path();
	int n;

	argv[0] = "ip";
	argv[1] = arg1;
	n = efs_tp_collect_args(argv + 2, 30, ap);
	if (!ip || n < 0) {
		snprintf(out, size, "%s", ip ? "too many arguments" : "no ip command (iproute2)");
		return -1;
	}
	return efs_tp_run_capture(ip, argv, out, size, IP_TIMEOUT_MS);
}

static int ip_run(char *out, size_t size, const char *arg1, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg1);
	r = ip_runv(out, size, arg1, ap);
	va_end(ap);
	return r;
}

/* The same, failing the check when ip does not exit 0. */
static void ip_must(const char *arg1, ...)
{
	char out[2048];
	va_list ap;
	int r;

	va_start(ap, arg1);
	r = ip_runv(out, sizeof(out), arg1, ap);
	va_end(ap);
	if (r != 0)
		efs_cl_fail("ip %s ... exited %d: %s", arg1, r, out);
}

/* The link address of node |i|'s veth end: |side| 0 the host's, 1 the
 * namespace's. Locally administered, unique per test process and node. */
static void veth_mac(int i, int side, char *buf, size_t size)
{
	unsigned pid = (unsigned)getpid();

	snprintf(buf, size, "02:ec:%02x:%02x:%02x:%02x", (pid >> 16) & 0xff, (pid >> 8) & 0xff,
		 pid & 0xff, (unsigned)((i + 1) << 1 | side) & 0xff);
}

/* Both ends know each other's link address for good: no neighbour
 * resolution, so a cut link loses packets silently (a failed resolution
 * would report "host unreachable" to the sender). */
static void neigh_pin(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];
	char mac_h[24], mac_n[24];

	veth_mac(i, 0, mac_h, sizeof(mac_h));
	veth_mac(i, 1, mac_n, sizeof(mac_n));
	ip_must("neigh", "replace", nd->ns_addr, "lladdr", mac_n, "dev", nd->veth, "nud",
		"permanent", (const char *)NULL);
	ip_must("-n", nd->netns, "neigh", "replace", nd->host_addr, "lladdr", mac_h, "dev",
		NS_VETH, "nud", "permanent", (const char *)NULL);
}

/* The pid in a name "<prefix><digits><sep>..." when it is not running
 * (a leftover of a dead test process), else 0. */
static long dead_owner(const char *name, const char *prefix, char sep)
{
	size_t len = strlen(prefix);
	char *end;
	long pid;

	if (strncmp(name, prefix, len) != 0 || !isdigit((unsigned char)name[len]))
		return 0;
	pid = strtol(name + len, &end, 10);
	if (*end != sep || !isdigit((unsigned char)end[1]) || pid <= 0 || pid == (long)getpid())
		return 0;
	while (isdigit((unsigned char)*++end))
		;
	if (*end)
		return 0;
	return kill((pid_t)pid, 0) < 0 && errno == ESRCH ? pid : 0;
}

/* Removes the veths and namespaces that test processes no longer running
 * left (killed before their stop). */
static void sweep_leftovers(void)
{
	struct dirent *de;
	char out[512];
	DIR *d;

	if ((d = opendir("/sys/class/net"))) {
		while ((de = readdir(d)))
			if (dead_owner(de->d_name, VETH_PREFIX, 'n'))
				ip_run(out, sizeof(out), "link", "del", de->d_name,
				       (const char *)NULL);
		closedir(d);
	}
	if ((d = opendir(NETNS_DIR))) {
		while ((de = readdir(d)))
			if (dead_owner(de->d_name, NETNS_PREFIX, '-'))
				ip_run(out, sizeof(out), "netns", "del", de->d_name,
				       (const char *)NULL);
		closedir(d);
	}
}

/* Whether 10.|a|.|b|.0/24 overlaps a route of the host's main table
 * (another test's veths among them). */
static bool subnet_taken(unsigned a, unsigned b)
{
	uint32_t net = htonl(10u << 24 | a << 16 | b << 8), mask24 = htonl(0xffffff00u);
	FILE *fp = fopen("/proc/net/route", "re");
	char line[256];
	bool taken = false;

	if (!fp)
		return false;
	/* Destination and Mask are the raw network-order words, in hex. */
	while (!taken && fgets(line, sizeof(line), fp)) {
		unsigned dst, gw, flags, refcnt, use, metric, mask;
		char ifname[32];

		if (sscanf(line, "%31s %x %x %x %u %u %u %x", ifname, &dst, &gw, &flags, &refcnt,
			   &use, &metric, &mask) != 8 || mask == 0)
			continue;
		taken = (dst & mask & mask24) == (net & mask & mask24);
	}
	fclose(fp);
	return taken;
}

/* Every node's namespace and veth pair: node i gets 10.a.b.4i/30, .4i+1
 * on the host side, .4i+2 in its namespace. */
static void netns_setup(struct efs_cl *c)
{
	unsigned pid = (unsigned)getpid(), a = 0, b = 0;
	bool found = false;

	if (!ip_path())
		efs_cl_fail("no ip command (iproute2): the nodes' network namespaces need it");
	sweep_leftovers();
	for (unsigned k = 0; k < 512 && !found; k++) {
		unsigned x = (pid + k * 97) % 32768;

		a = 128 + x / 256;
		b = x % 256;
		found = !subnet_taken(a, b);
	}
	if (!found)
		efs_cl_fail("no free 10.x.y.0/24 for the nodes' veths");
	for (int i = 0; i < c->n; i++) {
		struct efs_cl_node *nd = &c->node[i];
		char mac_h[24], mac_n[24], cidr[24];

		snprintf(nd->netns, sizeof(nd->netns), NETNS_PREFIX "%u-%d", pid, i + 1);
		snprintf(nd->veth, sizeof(nd->veth), VETH_PREFIX "%un%d", pid, i + 1);
		snprintf(nd->host_addr, sizeof(nd->host_addr), "10.%u.%u.%d", a, b, 4 * i + 1);
		snprintf(nd->ns_addr, sizeof(nd->ns_addr), "10.%u.%u.%d", a, b, 4 * i + 2);
		veth_mac(i, 0, mac_h, sizeof(mac_h));
		veth_mac(i, 1, mac_n, sizeof(mac_n));
		ip_must("netns", "add", nd->netns, (const char *)NULL);
		nd->netns_made = true;
		ip_must("link", "add", nd->veth, "address", mac_h, "type", "veth", "peer", "name",
			NS_VETH, "address", mac_n, "netns", nd->netns, (const char *)NULL);
		nd->veth_made = true;
		snprintf(cidr, sizeof(cidr), "%s/30", nd->host_addr);
		ip_must("addr", "add", cidr, "dev", nd->veth, (const char *)NULL);
		ip_must("link", "set", nd->veth, "up", (const char *)NULL);
		snprintf(cidr, sizeof(cidr), "%s/30", nd->ns_addr);
		ip_must("-n", nd->netns, "addr", "add", cidr, "dev", NS_VETH, (const char *)NULL);
		ip_must("-n", nd->netns, "link", "set", NS_VETH, "up", (const char *)NULL);
		ip_must("-n", nd->netns, "link", "set", "lo", "up", (const char *)NULL);
		neigh_pin(c, i);
	}
}

/* Node |i|'s etcd endpoints: every member's client port on its veth's
 * host side. */
static void netns_endpoints(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];
	size_t used = 0;

	nd->endpoints[0] = '\0';
	for (int m = 0; m < efs_harness_members(c->etcd); m++)
		used += (size_t)snprintf(nd->endpoints + used, sizeof(nd->endpoints) - used,
					 "%shttp://%s:%d", m ? "," : "", nd->host_addr,
					 efs_harness_client_port(c->etcd, m));
	if (used >= sizeof(nd->endpoints))
		efs_cl_fail("endpoints of %s too long", nd->id);
}

/* Removes every namespace and veth made; false (the reason in |why|) when
 * one would not go. */
static bool netns_teardown(struct efs_cl *c, char *why, size_t size)
{
	bool clean = true;
	char out[512];

	for (int i = 0; i < c->n; i++) {
		struct efs_cl_node *nd = &c->node[i];

		/* The veth first: the pair goes at once, not when the kernel
		 * gets round to destroying the namespace. */
		if (nd->veth_made && ip_run(out, sizeof(out), "link", "del", nd->veth,
					    (const char *)NULL) != 0) {
			snprintf(why, size, "ip link del %s: %.200s", nd->veth, out);
			clean = false;
		}
		nd->veth_made = false;
		if (nd->netns_made && ip_run(out, sizeof(out), "netns", "del", nd->netns,
					     (const char *)NULL) != 0) {
			snprintf(why, size, "ip netns del %s: %.200s", nd->netns, out);
			clean = false;
		}
		nd->netns_made = false;
		nd->cut = false;
	}
	return clean;
}

void efs_cl_cut(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];

	if (!nd->veth_made)
		efs_cl_fail("%s has no network namespace of its own (opts.netns)", nd->id);
	ip_must("link", "set", nd->veth, "down", (const char *)NULL);
	nd->cut = true;
}

void efs_cl_restore(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];

	if (!nd->veth_made)
		efs_cl_fail("%s has no network namespace of its own (opts.netns)", nd->id);
	ip_must("link", "set", nd->veth, "up", (const char *)NULL);
	/* Taking the host side down dropped its neighbour entries. */
	neigh_pin(c, i);
	nd->cut = false;
}

/* Enters node |nd|'s network namespace in this thread: the descriptor to
 * come back with (ns_leave), -2 when it has none, -1 on failure. */
static int ns_enter(const struct efs_cl_node *nd)
{
	char path[96];
	int back, fd;

	if (!nd->netns[0])
		return -2;
	snprintf(path, sizeof(path), NETNS_DIR "/%s", nd->netns);
	back = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (back < 0 || fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
		if (back >= 0)
			close(back);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return back;
}

static void ns_leave(int back)
{
	if (back < 0)
		return;
	/* A thread left in a node's namespace would reach no etcd: stop. */
	if (setns(back, CLONE_NEWNET) < 0) {
		fprintf(stderr, "cluster fixture: cannot return to the host's network "
				"namespace: %s\n",
			strerror(errno));
		abort();
	}
	close(back);
}

void efs_cl_spawned(struct efs_cl *c, pid_t pid)
{
	for (size_t k = 0; k < sizeof(c->spawned) / sizeof(c->spawned[0]); k++) {
		if (!c->spawned[k]) {
			c->spawned[k] = pid;
			return;
		}
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	efs_cl_fail("more than %zu children of a check",
		    sizeof(c->spawned) / sizeof(c->spawned[0]));
}

void efs_cl_reaped(struct efs_cl *c, pid_t pid)
{
	for (size_t k = 0; k < sizeof(c->spawned) / sizeof(c->spawned[0]); k++)
		if (c->spawned[k] == pid)
			c->spawned[k] = 0;
}

void efs_cl_kill_spawned(struct efs_cl *c)
{
	for (size_t k = 0; k < sizeof(c->spawned) / sizeof(c->spawned[0]); k++) {
		if (!c->spawned[k])
			continue;
		/* A FUSE request waits killably: SIGKILL ends it. */
		kill(c->spawned[k], SIGKILL);
		waitpid(c->spawned[k], NULL, 0);
		c->spawned[k] = 0;
	}
}

void efs_cl_setargs(struct efs_cl *c, int i, const char *const *args)
{
	struct efs_cl_node *nd = &c->node[i];

	nd->nargs = 0;
	for (int k = 0; args && args[k]; k++) {
		if (k == EFS_CL_MAX_ARGS)
			efs_cl_fail("more than %d extra arguments for %s", EFS_CL_MAX_ARGS, nd->id);
		snprintf(nd->args[k], sizeof(nd->args[k]), "%s", args[k]);
		nd->nargs = k + 1;
	}
}

void efs_cl_setenv(struct efs_cl *c, int i, const char *name, const char *value)
{
	struct efs_cl_node *nd = &c->node[i];
	size_t len = strlen(name);

	for (int k = 0; k < nd->nenv; k++) {
		if (strncmp(nd->env[k], name, len) == 0 && nd->env[k][len] == '=') {
			memmove(nd->env[k], nd->env[k + 1],
				sizeof(nd->env[0]) * (size_t)(nd->nenv - k - 1));
			nd->nenv--;
			break;
		}
	}
	if (!value)
		return;
	if (nd->nenv == EFS_CL_MAX_ENV)
		efs_cl_fail("too many environment entries for %s", nd->id);
	snprintf(nd->env[nd->nenv++], sizeof(nd->env[0]), "%s=%s", name, value);
}

double efs_cl_metric(struct efs_cl *c, int i, const char *sample)
{
	struct efs_cl_node *nd = &c->node[i];
	double v;

	int back, r;

	if (!nd->pid || !nd->metrics[0])
		return -1;
	/* From inside its namespace: reachable while its link is cut. */
	back = ns_enter(nd);
	if (back == -1)
		return -1;
	r = efs_tp_metric(nd->metrics, sample, &v);
	ns_leave(back);
	return r < 0 ? -1 : v;
}

char *efs_cl_metrics_text(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];
	char *body;
	int back, r;

	if (!nd->pid || !nd->metrics[0])
		return NULL;
	back = ns_enter(nd);
	if (back == -1)
		return NULL;
	r = efs_tp_metrics_get(nd->metrics, &body);
	ns_leave(back);
	return r < 0 ? NULL : body;
}

void efs_cl_mount(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];
	char daemon[PATH_MAX], ttl[32], tail[4096], metrics[32];
	const char *argv[48];
	int argc = 0, st, logfd;
	uint64_t deadline;
	off_t log_start;
	struct stat sb;
	pid_t pid;

	if (nd->pid)
		efs_cl_fail("%s is already running", nd->id);
	command_path("etcfsd", daemon, sizeof(daemon));
	snprintf(ttl, sizeof(ttl), "%d", c->opts.session_ttl);
	argv[argc++] = daemon;
	argv[argc++] = "-f";
	argv[argc++] = "--endpoints";
	argv[argc++] = nd->netns[0] ? nd->endpoints : c->endpoints;
	argv[argc++] = "--node-id";
	argv[argc++] = nd->id;
	argv[argc++] = "--session-ttl";
	argv[argc++] = ttl;
	/* In a namespace, on its veth's address: the host (etcfsctl members)
	 * reaches it through the veth, and efs_cl_metric() from inside the
	 * namespace, where it stays reachable while the link is cut. */
	snprintf(metrics, sizeof(metrics), "%s:0", nd->netns[0] ? nd->ns_addr : "127.0.0.1");
	argv[argc++] = "--metrics-addr";
	argv[argc++] = metrics;
	for (int k = 0; c->opts.mount_args && c->opts.mount_args[k]; k++) {
		if (argc > 40 - EFS_CL_MAX_ARGS)
			efs_cl_fail("too many daemon arguments");
		argv[argc++] = c->opts.mount_args[k];
	}
	for (int k = 0; k < nd->nargs; k++)
		argv[argc++] = nd->args[k];
	argv[argc++] = c->image;
	argv[argc++] = nd->mnt;
	argv[argc] = NULL;

	logfd = open(nd->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (logfd < 0)
		efs_cl_fail("cannot open %s: %s", nd->log, strerror(errno));
	log_start = lseek(logfd, 0, SEEK_END);
	dprintf(logfd, "--- cluster fixture: mounting %s at %s ---\n", nd->id, nd->mnt);
	log_start = lseek(logfd, 0, SEEK_END);
	pid = fork();
	if (pid < 0)
		efs_cl_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (null >= 0)
			dup2(null, STDIN_FILENO);
		dup2(logfd, STDOUT_FILENO);
		dup2(logfd, STDERR_FILENO);
		for (int k = 0; k < nd->nenv; k++)
			putenv(nd->env[k]);
		/* Only the network namespace: the mount stays the host's. */
		if (nd->netns[0]) {
			char path[96];
			int nsfd;

			snprintf(path, sizeof(path), NETNS_DIR "/%s", nd->netns);
			nsfd = open(path, O_RDONLY | O_CLOEXEC);
			if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) < 0) {
				dprintf(logfd, "cluster fixture: entering %s: %s\n", path,
					strerror(errno));
				_exit(127);
			}
			close(nsfd);
		}
		execv(daemon, (char *const *)argv);
		dprintf(logfd, "cluster fixture: exec %s: %s\n", daemon, strerror(errno));
		_exit(127);
	}
	close(logfd);
	nd->pid = pid;
	nd->aborted = false;

	deadline = efs_cl_now_ms() + MOUNT_WAIT_MS;
	for (;;) {
		if (waitpid(pid, &st, WNOHANG) == pid) {
			nd->pid = 0;
			efs_tp_file_tail(nd->log, tail, sizeof(tail));
			efs_cl_fail("%s exited during mount (%s %d); log:\n%s", nd->id,
				    WIFEXITED(st) ? "status" : "signal",
				    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), tail);
		}
		nd->conn = fuse_conn(nd->mnt);
		/* Only stat the mount once the daemon says it is ready. */
		if (nd->conn && efs_tp_logged_ready(nd->log, log_start) && stat(nd->mnt, &sb) == 0) {
			efs_tp_metrics_addr(nd->log, log_start, nd->metrics, sizeof(nd->metrics));
			break;
		}
		if (efs_cl_now_ms() >= deadline) {
			efs_tp_file_tail(nd->log, tail, sizeof(tail));
			efs_cl_fail("%s did not answer within %d ms; log:\n%s", nd->mnt,
				    MOUNT_WAIT_MS, tail);
		}
		efs_cl_sleep_ms(20);
	}
}

bool efs_cl_alive(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];
	int st;

	if (!nd->pid)
		return false;
	if (waitpid(nd->pid, &st, WNOHANG) == nd->pid) {
		nd->pid = 0;
		return false;
	}
	return nd->conn && !nd->aborted && fuse_conn(nd->mnt) == nd->conn;
}

/* Stops node |i| whatever state it is in; false with a reason in |why|
 * when it did not leave cleanly. */
static bool node_down(struct efs_cl *c, int i, char *why, size_t why_size)
{
	struct efs_cl_node *nd = &c->node[i];
	bool clean = true;
	int st;

	why[0] = '\0';
	if (nd->pid) {
		if (waitpid(nd->pid, &st, WNOHANG) == nd->pid) {
			snprintf(why, why_size, "%s had exited (%s %d)", nd->id,
				 WIFEXITED(st) ? "status" : "signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			nd->pid = 0;
			clean = false;
		} else if (efs_tp_fusermount(nd->mnt, false) != 0) {
			snprintf(why, why_size, "fusermount3 -u %s failed", nd->mnt);
			kill(nd->pid, SIGTERM);
			clean = false;
		}
		if (nd->pid && efs_tp_wait_pid(nd->pid, &st, EXIT_WAIT_MS) != 1) {
			snprintf(why, why_size, "%s did not exit within %d ms", nd->id,
				 EXIT_WAIT_MS);
			kill(nd->pid, SIGKILL);
			waitpid(nd->pid, &st, 0);
			clean = false;
		} else if (nd->pid && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
			snprintf(why, why_size, "%s exited with %s %d", nd->id,
				 WIFEXITED(st) ? "status" : "signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			clean = false;
		}
		nd->pid = 0;
	}
	if (fuse_conn(nd->mnt)) {
		/* A dead or aborted mount: abort what waits, then detach it. */
		abort_conn(fuse_conn(nd->mnt), false);
		efs_tp_fusermount(nd->mnt, true);
	}
	nd->conn = 0;
	nd->aborted = false;
	return clean;
}

bool efs_cl_down(struct efs_cl *c, int i)
{
	char why[512];

	return node_down(c, i, why, sizeof(why));
}

void efs_cl_unmount(struct efs_cl *c, int i)
{
	char why[512], tail[4096];

	if (!c->node[i].pid)
		efs_cl_fail("%s is not running", c->node[i].id);
	if (!node_down(c, i, why, sizeof(why))) {
		efs_tp_file_tail(c->node[i].log, tail, sizeof(tail));
		efs_cl_fail("unmount of %s: %s; log:\n%s", c->node[i].id, why, tail);
	}
}

void efs_cl_terminate(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];
	char tail[4096];
	int st, r;

	if (!nd->pid)
		efs_cl_fail("%s is not running", nd->id);
	kill(nd->pid, SIGTERM);
	r = efs_tp_wait_pid(nd->pid, &st, EXIT_WAIT_MS);
	if (r != 1) {
		efs_tp_file_tail(nd->log, tail, sizeof(tail));
		efs_cl_fail("%s did not exit within %d ms of SIGTERM; log:\n%s", nd->id,
			    EXIT_WAIT_MS, tail);
	}
	nd->pid = 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || fuse_conn(nd->mnt)) {
		efs_tp_file_tail(nd->log, tail, sizeof(tail));
		efs_cl_fail("%s left after SIGTERM with %s %d%s; log:\n%s", nd->id,
			    WIFEXITED(st) ? "status" : "signal",
			    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
			    fuse_conn(nd->mnt) ? ", still mounted" : "", tail);
	}
	nd->conn = 0;
}

void efs_cl_kill(struct efs_cl *c, int i)
{
	struct efs_cl_node *nd = &c->node[i];
	int st;

	if (!nd->pid)
		efs_cl_fail("%s is not running", nd->id);
	kill(nd->pid, SIGKILL);
	waitpid(nd->pid, &st, 0);
	nd->pid = 0;
	abort_conn(nd->conn, false);
	efs_tp_fusermount(nd->mnt, true);
	nd->conn = 0;
	if (fuse_conn(nd->mnt))
		efs_cl_fail("%s still mounted after kill", nd->mnt);
}

void efs_cl_sync_all(struct efs_cl *c)
{
	for (int i = 0; i < c->n; i++) {
		int fd = open(c->node[i].mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (fd >= 0) {
			syncfs(fd);
			close(fd);
		}
	}
	efs_cl_sleep_ms(1200);
}

unsigned long long efs_cl_free_bytes(struct efs_cl *c)
{
	struct statvfs sv;

	if (statvfs(c->node[0].mnt, &sv) != 0)
		efs_cl_fail("statvfs %s: %s", c->node[0].mnt, strerror(errno));
	return (unsigned long long)sv.f_bfree * sv.f_frsize;
}

unsigned long long efs_cl_wait_free(struct efs_cl *c, unsigned long long want, uint64_t ms,
				    const char *what)
{
	uint64_t t0 = efs_cl_now_ms();
	unsigned long long f;

	while ((f = efs_cl_free_bytes(c)) < want && efs_cl_now_ms() - t0 < ms)
		efs_cl_sleep_ms(200);
	if (f < want)
		efs_cl_fail("%s: %llu bytes free after %llu ms, %llu expected", what, f,
			    (unsigned long long)(efs_cl_now_ms() - t0), want);
	return efs_cl_now_ms() - t0;
}

const char *efs_cl_path(struct efs_cl *c, int i, const char *rel, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s/%s", c->node[i].mnt, rel);

	if (n <= 0 || (size_t)n >= size)
		efs_cl_fail("path %s too long", rel);
	return buf;
}

const char *efs_cl_dpath(struct efs_cl *c, int i, const char *dir, const char *name)
{
	static char ring[8][600];
	static unsigned next;
	char rel[400];
	char *buf = ring[next++ % 8];

	snprintf(rel, sizeof(rel), "%s/%s", dir, name);
	return efs_cl_path(c, i, rel, buf, sizeof(ring[0]));
}

void efs_cl_child_run(void (*fn)(void *arg), void *arg, int report_fd)
{
	jmp_buf jb;

	efs_cl_jmp = &jb;
	if (setjmp(jb)) {
		ssize_t w = write(report_fd, efs_cl_msg, strlen(efs_cl_msg));

		(void)w;
		_exit(1);
	}
	fn(arg);
	_exit(0);
}

int efs_cl_run(struct efs_cl *c, char *out, size_t out_size, const char *cmd, ...)
{
	char path[PATH_MAX];
	const char *args[56];
	va_list ap;
	int n, r;

	va_start(ap, cmd);
	n = efs_tp_collect_args(args, 56, ap);
	va_end(ap);
	if (n < 0)
		efs_cl_fail("too many arguments for %s", cmd);
	command_path(cmd, path, sizeof(path));
	r = efs_tp_run_tool(path, cmd, c->endpoints, args, out, out_size, RUN_TIMEOUT_MS);
	if (r == -3)
		efs_cl_fail("too many arguments for %s", cmd);
	if (r == -2)
		efs_cl_fail("%s did not finish within %d ms; output:\n%s", cmd, RUN_TIMEOUT_MS,
			    out ? out : "");
	return r;
}

void efs_cl_start(struct efs_cl *c, const struct efs_cl_opts *o)
{
	struct efs_harness_opts ho = {0};
	char out[8192];
	int fd, r;

	memset(c, 0, sizeof(*c));
	if (o)
		c->opts = *o;
	if (!c->opts.nodes)
		c->opts.nodes = 3;
	if (!c->opts.members)
		c->opts.members = 3;
	if (!c->opts.session_ttl)
		c->opts.session_ttl = 2;
	if (!c->opts.image)
		c->opts.image = 512ull << 20;
	if (c->opts.nodes > EFS_CL_MAX_NODES)
		efs_cl_fail("at most %d nodes", EFS_CL_MAX_NODES);
	c->n = c->opts.nodes;

	if (!fusectl_is_mounted()) {
		/* Opening /dev/fuse loads the module (and with it fusectl) on a
		 * fresh machine where no FUSE mount ran yet. */
		fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
		if (fd >= 0)
			close(fd);
		if (mount("none", FUSECTL, "fusectl", 0, NULL) < 0)
			efs_cl_fail("mount -t fusectl none " FUSECTL ": %s", strerror(errno));
		c->fusectl_mounted = true;
	}
	wd_start(c);

	ho.members = c->opts.members;
	if (c->opts.netns) {
		/* Veths first: etcd binds their host sides' addresses. */
		static const char *addrs[EFS_CL_MAX_NODES + 1];

		for (int i = 0; i < c->n; i++)
			snprintf(c->node[i].id, sizeof(c->node[i].id), "node%d", i + 1);
		netns_setup(c);
		for (int i = 0; i < c->n; i++)
			addrs[i] = c->node[i].host_addr;
		addrs[c->n] = NULL;
		ho.extra_client_addrs = addrs;
	}
	r = efs_harness_start(&c->etcd, &ho);
	if (r < 0)
		efs_cl_fail("etcd harness start: %s", strerror(-r));
	snprintf(c->endpoints, sizeof(c->endpoints), "%s", efs_harness_endpoints(c->etcd));
	for (int i = 0; c->opts.netns && i < c->n; i++)
		netns_endpoints(c, i);

	snprintf(c->dir, sizeof(c->dir), "/tmp/etcfs-cluster-XXXXXX");
	if (!mkdtemp(c->dir))
		efs_cl_fail("mkdtemp: %s", strerror(errno));
	snprintf(c->image, sizeof(c->image), "%s/disk.img", c->dir);
	fd = open(c->image, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		efs_cl_fail("create %s: %s", c->image, strerror(errno));
	r = ftruncate(fd, (off_t)c->opts.image);
	close(fd);
	if (r < 0)
		efs_cl_fail("truncate %s: %s", c->image, strerror(errno));
	for (int i = 0; i < c->n; i++) {
		struct efs_cl_node *nd = &c->node[i];

		snprintf(nd->id, sizeof(nd->id), "node%d", i + 1);
		snprintf(nd->mnt, sizeof(nd->mnt), "%s/mnt%d", c->dir, i + 1);
		snprintf(nd->log, sizeof(nd->log), "%s/%s.log", c->dir, nd->id);
		if (mkdir(nd->mnt, 0755) < 0)
			efs_cl_fail("mkdir %s: %s", nd->mnt, strerror(errno));
	}
	r = efs_cl_run(c, out, sizeof(out), "mkfs.etcfs", "--name", FS_NAME, c->image,
		       (const char *)NULL);
	if (r != 0)
		efs_cl_fail("mkfs.etcfs failed (%d):\n%s", r, out);
	for (int i = 0; i < c->n; i++)
		efs_cl_mount(c, i);
}

bool efs_cl_stop(struct efs_cl *c)
{
	char why[512], problems[2048] = "";
	bool clean = true;

	efs_cl_kill_spawned(c);
	for (int i = 0; i < c->n; i++) {
		if (!node_down(c, i, why, sizeof(why))) {
			size_t used = strlen(problems);

			snprintf(problems + used, sizeof(problems) - used, "%s%s",
				 used ? "; " : "", why);
			clean = false;
		}
	}
	wd_stop(c);
	/* ETCFS_CLUSTER_LOGS=DIR keeps the daemons' logs (for debugging). */
	if (getenv("ETCFS_CLUSTER_LOGS") && c->dir[0]) {
		for (int i = 0; i < c->n; i++) {
			char dst[PATH_MAX];
			const char *argv[] = {"cp", c->node[i].log, dst, NULL};

			snprintf(dst, sizeof(dst), "%s/%s.log", getenv("ETCFS_CLUSTER_LOGS"),
				 c->node[i].id);
			efs_tp_run_quiet(argv);
		}
	}
	c->etcd = efs_harness_free(c->etcd);
	if (!netns_teardown(c, why, sizeof(why))) {
		size_t used = strlen(problems);

		snprintf(problems + used, sizeof(problems) - used, "%s%s", used ? "; " : "", why);
		clean = false;
	}
	if (c->dir[0]) {
		efs_tp_rm_tree(c->dir);
		c->dir[0] = '\0';
	}
	if (c->fusectl_mounted) {
		umount2(FUSECTL, MNT_DETACH);
		c->fusectl_mounted = false;
	}
	if (!clean)
		snprintf(efs_cl_msg, sizeof(efs_cl_msg), "%s", problems);
	return clean;
}
