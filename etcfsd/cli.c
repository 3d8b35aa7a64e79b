/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the user commands share: the etcd connection options (config file,
 * environment, command line), the connection probe, opening a device and
 * checking its superblock against the keyspace it names.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "etcd/sync.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "util/clock.h"
#include "util/mem.h"

#define MIB (1024ull * 1024ull)

static void seterr(char *err, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t size, const char *fmt, ...)
{
	va_list ap;

	if (!err || !size)
		return;
	va_start(ap, fmt);
	vsnprintf(err, size, fmt, ap);
	va_end(ap);
}

void efs_cli_print_err(const char *prog, int errnum, const char *err)
{
	if (err && err[0])
		fprintf(stderr, "%s: %s\n", prog, err);
	else
		fprintf(stderr, "%s: %s\n", prog, strerror(errnum < 0 ? -errnum : errnum));
}

/* ---- etcd options ---- */

static const char usage_text[] =
	"etcd connection (the flag names of etcdctl):\n"
	"  --endpoints URLS         comma-separated client URLs (default\n"
	"                           " EFS_CLI_ENDPOINTS_DEFAULT "); host:port without a scheme is\n"
	"                           http://, or https:// when a TLS flag is given\n"
	"  --cacert FILE            CA bundle to verify the servers (TLS)\n"
	"  --cert FILE              client certificate (TLS client-cert auth)\n"
	"  --key FILE               client private key\n"
	"  --user USER[:PASS]       authenticate as USER (password: PASS, --password,\n"
	"                           ETCFS_PASSWORD, else asked on the terminal)\n"
	"  --password PASS          password for --user\n"
	"  --dial-timeout SECONDS   how long to wait for etcd to answer at start\n"
	"                           (default 10)\n"
	"  --command-timeout SECONDS  deadline of each call (default 5)\n"
	"Each option may also come from the environment, ETCFS_<NAME> (the name in\n"
	"capitals, '-' as '_': ETCFS_ENDPOINTS, ETCFS_DIAL_TIMEOUT), or from\n"
	EFS_CLI_CONFIG_FILE " ($ETCFS_CONFIG names another; 'name = value' lines\n"
	"with the option names without dashes, '#' comments). The command line\n"
	"wins, then the environment, then the file, then the defaults.\n";

const char *efs_cli_etcd_usage(void)
{
	return usage_text;
}

/* Seconds ("2", "0.5", "2s", "500ms") to milliseconds, 1 ms .. 1 day. */
static int parse_duration_ms(const char *s, uint32_t *ret)
{
	char *end;
	double v, scale = 1000.0;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s)
		return -EINVAL;
	if (!strcmp(end, "ms"))
		scale = 1.0;
	else if (*end && strcmp(end, "s"))
		return -EINVAL;
	v *= scale;
	if (!(v >= 1.0) || v > 86400000.0)
		return -EINVAL;
	*ret = (uint32_t)(v + 0.5);
	return 0;
}

static int set_str(char **dst, const char *val)
{
	char *v = efs_mem_strdup(val);

	if (!v)
		return -ENOMEM;
	efs_mem_free(*dst);
	*dst = v;
	return 0;
}

static void wipe_free(char **p)
{
	if (*p) {
		memset(*p, 0, strlen(*p));
		efs_mem_free(*p);
		*p = NULL;
	}
}

/* Puts |s|, a string just made (NULL: out of memory), in |*dst| in place of
 * the string there, unless it is empty: then frees it and says |empty| in
 * |err|. 0, -ENOMEM or -EINVAL (|*dst| untouched). */
static int take_nonempty(char **dst, char *s, const char *empty, char *err, size_t err_size)
{
	if (!s)
		return -ENOMEM;
	if (!s[0]) {
		efs_mem_free(s);
		seterr(err, err_size, "%s", empty);
		return -EINVAL;
	}
	efs_mem_free(*dst);
	*dst = s;
	return 0;
}

int efs_cli_etcd_option(struct efs_cli_etcd *e, const char *name, const char *value, char *err,
			size_t err_size)
{
	char **dst = NULL;

	if (!strcmp(name, "endpoints"))
		dst = &e->endpoints;
	else if (!strcmp(name, "cacert"))
		dst = &e->cacert;
	else if (!strcmp(name, "cert"))
		dst = &e->cert;
	else if (!strcmp(name, "key"))
		dst = &e->key;
	if (dst) {
		if (!value[0]) {
			seterr(err, err_size, "--%s needs a value", name);
			return -EINVAL;
		}
		return set_str(dst, value) < 0 ? -ENOMEM : 1;
	}
	if (!strcmp(name, "user")) {
		const char *colon = strchr(value, ':');
		int r;

		r = take_nonempty(&e->user,
				  colon ? efs_mem_strndup(value, (size_t)(colon - value))
					: efs_mem_strdup(value),
				  "--user needs a user name", err, err_size);
		if (r < 0)
			return r;
		if (colon) {
			wipe_free(&e->password);
			e->password = efs_mem_strdup(colon + 1);
			if (!e->password)
				return -ENOMEM;
		}
		return 1;
	}
	if (!strcmp(name, "password")) {
		char *pw = efs_mem_strdup(value);

		if (!pw)
			return -ENOMEM;
		wipe_free(&e->password);
		e->password = pw;
		return 1;
	}
	if (!strcmp(name, "dial-timeout") || !strcmp(name, "command-timeout")) {
		uint32_t *dst_ms = name[0] == 'd' ? &e->dial_timeout_ms : &e->command_timeout_ms;

		if (parse_duration_ms(value, dst_ms) < 0) {
			seterr(err, err_size,
			       "--%s wants seconds > 0 (e.g. 2, 0.5, 2s, 500ms), not '%s'", name,
			       value);
			return -EINVAL;
		}
		return 1;
	}
	return 0;
}

/* Strips leading and trailing blanks in place. */
static char *trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

/* The etcd option names (the configuration keys the tools take). */
static const char *const etcd_names[] = {"endpoints", "cacert",	     "cert",
					 "key",	      "user",	     "password",
					 "dial-timeout", "command-timeout", NULL};

/*
 * The keys only etcfsd takes: the tools sharing the file skip them, so that
 * one file serves every command; any other key is refused everywhere.
 * etcfsd's own table must name each of these (its config test checks that
 * a key of this list is taken).
 */
const char *const efs_cli_daemon_keys[] = {
	"foreground",	   "node-id",	       "session-ttl",	 "quorum-timeout",
	"etcd-quota",	   "metrics-addr",     "log-level",	 "log-file",
	"flush-interval",  "recall-bound",     "max-cached-files", "max-hold",
	"contended-recalls", "dead-grace",     "cache-timeout",	 "io-threads",
	"compact-interval", "compact-retain",  "options",	 NULL,
};

const char *efs_cli_config_path(const char *override)
{
	const char *path = getenv("ETCFS_CONFIG");

	if (override && override[0])
		return override;
	return path && path[0] ? path : EFS_CLI_CONFIG_FILE;
}

void efs_cli_env_name(const char *name, char *buf, size_t size)
{
	size_t n = 0;
	int w = snprintf(buf, size, "ETCFS_");

	if (w < 0 || (size_t)w >= size)
		return;
	n = (size_t)w;
	for (const char *p = name; *p && n + 1 < size; p++)
		buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
	buf[n] = '\0';
}

static int read_config(const char *path, bool must_exist, efs_cli_option_cb cb, void *arg,
		       char *err, size_t err_size)
{
	char line[4096], sub[EFS_CLI_ERR_MAX];
	unsigned lineno = 0;
	FILE *f;
	int r = 0;

	f = fopen(path, "re");
	if (!f) {
		if (errno == ENOENT && !must_exist)
			return 0;
		r = -errno;
		seterr(err, err_size, "%s: %s", path, strerror(-r));
		return r;
	}
	while (fgets(line, sizeof(line), f)) {
		char *eq, *k, *v;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			seterr(err, err_size, "%s:%u: line too long", path, lineno);
			r = -EINVAL;
			break;
		}
		k = trim(line);
		if (!k[0] || k[0] == '#')
			continue;
		eq = strchr(k, '=');
		if (!eq) {
			seterr(err, err_size, "%s:%u: expected 'key = value', not '%s'", path,
			       lineno, k);
			r = -EINVAL;
			break;
		}
		*eq = '\0';
		v = trim(eq + 1);
		k = trim(k);
		sub[0] = '\0';
		r = cb(arg, k, v, sub, sizeof(sub));
		if (r == 0) {
			seterr(err, err_size, "%s:%u: unknown key '%s'", path, lineno, k);
			r = -EINVAL;
			break;
		}
		if (r < 0) {
			if (r == -EINVAL)
				seterr(err, err_size, "%s:%u: %s: %s", path, lineno, k,
				       sub[0] ? sub : "invalid value");
			break;
		}
		r = 0;
	}
	if (r == 0 && ferror(f)) {
		r = -EIO;
		seterr(err, err_size, "%s: read error", path);
	}
	fclose(f);
	return r;
}

int efs_cli_config_load(const char *path, bool must_exist, const char *const *names,
			efs_cli_option_cb cb, void *arg, char *err, size_t err_size)
{
	char sub[EFS_CLI_ERR_MAX], env[96];
	int r;

	r = read_config(path, must_exist, cb, arg, err, err_size);
	if (r < 0)
		return r;
	for (size_t i = 0; names && names[i]; i++) {
		const char *v;

		efs_cli_env_name(names[i], env, sizeof(env));
		v = getenv(env);
		if (!v || !v[0])
			continue;
		sub[0] = '\0';
		r = cb(arg, names[i], v, sub, sizeof(sub));
		if (r <= 0) {
			seterr(err, err_size, "%s: %s", env, sub[0] ? sub : "invalid value");
			return r < 0 ? r : -EINVAL;
		}
	}
	return 0;
}

const char *const *efs_cli_etcd_names(void)
{
	return etcd_names;
}

/* The tools' view of the file: etcd keys taken, etcfsd's keys skipped. */
static int tool_option(void *arg, const char *name, const char *value, char *err,
		       size_t err_size)
{
	int r = efs_cli_etcd_option(arg, name, value, err, err_size);

	if (r != 0)
		return r;
	for (size_t i = 0; efs_cli_daemon_keys[i]; i++)
		if (!strcmp(name, efs_cli_daemon_keys[i]))
			return 1;
	return 0;
}

void efs_cli_etcd_init(struct efs_cli_etcd *e)
{
	*e = (struct efs_cli_etcd){
		.dial_timeout_ms = EFS_CLI_DIAL_TIMEOUT_DEFAULT_MS,
		.command_timeout_ms = EFS_CLI_CMD_TIMEOUT_DEFAULT_MS,
	};
}

int efs_cli_etcd_defaults(struct efs_cli_etcd *e, char *err, size_t err_size)
{
	efs_cli_etcd_init(e);
	return efs_cli_config_load(efs_cli_config_path(NULL), false, etcd_names, tool_option, e,
				   err, err_size);
}

/* Adds a scheme to endpoints given as host:port; drops empty items. */
static char *normalise_endpoints(const char *in, bool tls)
{
	size_t cap = strlen(in) * 2 + 16, len = 0;
	char *out = efs_mem_malloc(cap);
	const char *p = in;

	if (!out)
		return NULL;
	out[0] = '\0';
	while (*p) {
		size_t n = strcspn(p, ",");
		const char *scheme = "";

		while (n > 0 && isspace((unsigned char)*p)) {
			p++;
			n--;
		}
		while (n > 0 && isspace((unsigned char)p[n - 1]))
			n--;
		if (n > 0) {
			if (!memmem(p, n, "://", 3))
				scheme = tls ? "https://" : "http://";
			len += (size_t)snprintf(out + len, cap - len, "%s%s%.*s", len ? "," : "",
						scheme, (int)n, p);
		}
		p += strcspn(p, ",");
		if (*p == ',')
			p++;
	}
	return out;
}

static bool uses_tls(const struct efs_cli_etcd *e)
{
	return e->cacert || e->cert || e->key;
}

int efs_cli_etcd_finish(struct efs_cli_etcd *e, char *err, size_t err_size)
{
	int r;

	if (!!e->cert != !!e->key) {
		seterr(err, err_size, "--cert and --key go together");
		return -EINVAL;
	}
	if (e->password && !e->user) {
		seterr(err, err_size, "a password needs --user");
		return -EINVAL;
	}
	if (e->user && !e->password) {
		const char *pw = getenv("ETCFS_PASSWORD");

		if (!pw && isatty(STDIN_FILENO))
			pw = getpass("etcd password: ");
		if (!pw) {
			seterr(err, err_size,
			       "--user %s needs a password (USER:PASS, --password or "
			       "ETCFS_PASSWORD)",
			       e->user);
			return -EINVAL;
		}
		e->password = efs_mem_strdup(pw);
		if (!e->password)
			return -ENOMEM;
	}
	r = take_nonempty(&e->endpoints,
			  normalise_endpoints(e->endpoints ? e->endpoints : EFS_CLI_ENDPOINTS_DEFAULT,
					      uses_tls(e)),
			  "--endpoints is empty", err, err_size);
	if (r < 0)
		return r;
	if (!e->dial_timeout_ms)
		e->dial_timeout_ms = EFS_CLI_DIAL_TIMEOUT_DEFAULT_MS;
	if (!e->command_timeout_ms)
		e->command_timeout_ms = EFS_CLI_CMD_TIMEOUT_DEFAULT_MS;
	return 0;
}

int efs_cli_etcd_opts(const struct efs_cli_etcd *e, struct efs_etcd_opts *ret)
{
	const char *pw = e->password;
	char *endpoints;

	if (!!e->cert != !!e->key)
		return -EINVAL;
	if (e->user && !pw)
		pw = getenv("ETCFS_PASSWORD");
	if (e->user && !pw)
		return -EINVAL;
	endpoints = normalise_endpoints(e->endpoints ? e->endpoints : EFS_CLI_ENDPOINTS_DEFAULT,
					uses_tls(e));
	if (!endpoints)
		return -ENOMEM;
	if (!endpoints[0]) {
		efs_mem_free(endpoints);
		return -EINVAL;
	}
	*ret = (struct efs_etcd_opts){
		.endpoints = endpoints,
		.cacert = e->cacert,
		.cert = e->cert,
		.key = e->key,
		.user = e->user,
		.password = e->user ? pw : NULL,
		.call_timeout_ms = e->command_timeout_ms,
		/* One connection attempt never takes the whole dial budget, so
		 * that a dead first endpoint leaves time for the next. */
		.connect_timeout_ms = e->dial_timeout_ms && e->dial_timeout_ms < 2000
					      ? e->dial_timeout_ms
					      : 2000,
	};
	return 0;
}

void efs_cli_etcd_opts_free(struct efs_etcd_opts *o)
{
	if (!o)
		return;
	efs_mem_free((char *)o->endpoints);
	*o = (struct efs_etcd_opts){0};
}

void efs_cli_etcd_free(struct efs_cli_etcd *e)
{
	if (!e)
		return;
	efs_mem_free(e->endpoints);
	efs_mem_free(e->cacert);
	efs_mem_free(e->cert);
	efs_mem_free(e->key);
	efs_mem_free(e->user);
	wipe_free(&e->password);
	*e = (struct efs_cli_etcd){0};
}

/* Runs a Status call with |timeout_ms| as the call deadline on a throwaway
 * client, so that the dial timeout, not the command timeout, bounds it. */
static int probe(const struct efs_etcd_opts *base, uint32_t timeout_ms, char *why, size_t size)
{
	struct efs_etcd_opts o = *base;
	struct efs_etcd_sync *s = NULL;
	Etcdserverpb__StatusResponse *st = NULL;
	int r;

	o.call_timeout_ms = timeout_ms;
	r = efs_etcd_sync_new(&s, &o);
	if (r < 0) {
		snprintf(why, size, "%s", strerror(-r));
		return r;
	}
	r = efs_etcd_sync_status(s, &st);
	if (r < 0) {
		const char *m = efs_etcd_sync_last_message(s);

		snprintf(why, size, "%s", m && m[0] ? m : strerror(-r));
	} else {
		protobuf_c_message_free_unpacked(&st->base, efs_mem_protobuf());
	}
	efs_etcd_sync_close(s);
	return r;
}

int efs_cli_etcd_connect(const struct efs_cli_etcd *e, struct efs_etcd_sync **ret, char *err,
			 size_t err_size)
{
	struct efs_etcd_opts o;
	char why[EFS_CLI_ERR_MAX];
	int r;

	r = efs_cli_etcd_opts(e, &o);
	if (r < 0) {
		if (r == -EINVAL)
			seterr(err, err_size,
			       "bad etcd options (endpoints, --cert/--key, password)");
		return r;
	}
	r = probe(&o, e->dial_timeout_ms ? e->dial_timeout_ms : EFS_CLI_DIAL_TIMEOUT_DEFAULT_MS,
		  why, sizeof(why));
	if (r < 0) {
		if (r == -EACCES || r == -EPERM)
			seterr(err, err_size, "etcd at %s refused our credentials: %s",
			       o.endpoints, why);
		else
			seterr(err, err_size, "etcd unreachable at %s: %s", o.endpoints, why);
		goto out;
	}
	r = efs_etcd_sync_new(ret, &o);
	if (r < 0)
		seterr(err, err_size, "cannot create the etcd client: %s", strerror(-r));
out:
	efs_cli_etcd_opts_free(&o);
	return r;
}

/* ---- devices ---- */

int efs_cli_device_open(const char *path, bool writable, struct efs_cli_device *ret, char *err,
			size_t err_size)
{
	struct efs_cli_device d = {.fd = -1};
	struct stat st;
	int r;

	d.fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (d.fd < 0) {
		r = -errno;
		seterr(err, err_size, "%s: %s", path, strerror(-r));
		return r;
	}
	if (fstat(d.fd, &st) < 0) {
		r = -errno;
		seterr(err, err_size, "%s: %s", path, strerror(-r));
		goto out_close;
	}
	if (S_ISBLK(st.st_mode)) {
		uint64_t size;

		if (ioctl(d.fd, BLKGETSIZE64, &size) < 0) {
			r = -errno;
			seterr(err, err_size, "%s: cannot get the device size: %s", path,
			       strerror(-r));
			goto out_close;
		}
		d.size = size;
		d.is_block = true;
	} else if (S_ISREG(st.st_mode)) {
		d.size = (uint64_t)st.st_size;
	} else {
		r = -ENOTBLK;
		seterr(err, err_size, "%s: neither a block device nor a regular file", path);
		goto out_close;
	}
	if (d.size < MIB) {
		r = -EINVAL;
		seterr(err, err_size, "%s: too small (%llu bytes; at least 1 MiB)", path,
		       (unsigned long long)d.size);
		goto out_close;
	}
	d.path = efs_mem_strdup(path);
	if (!d.path) {
		r = -ENOMEM;
		goto out_close;
	}
	*ret = d;
	return 0;
out_close:
	close(d.fd);
	return r;
}

void efs_cli_device_close(struct efs_cli_device *d)
{
	if (!d)
		return;
	/* |path| is set only by a successful open: a zeroed struct (fd 0)
	 * never closes stdin. */
	if (d->path && d->fd >= 0)
		close(d->fd);
	efs_mem_free(d->path);
	*d = (struct efs_cli_device){.fd = -1};
}

int efs_cli_read_sb(const struct efs_cli_device *d, struct efs_sb *ret, unsigned *ret_flags,
		    char *err, size_t err_size)
{
	uint8_t *buf;
	char reason[EFS_SB_REASON_MAX];
	size_t got = 0;
	int r;

	buf = efs_mem_malloc(EFS_SB_SIZE);
	if (!buf)
		return -ENOMEM;
	while (got < EFS_SB_SIZE) {
		ssize_t n = pread(d->fd, buf + got, EFS_SB_SIZE - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			seterr(err, err_size, "%s: cannot read the superblock: %s", d->path,
			       strerror(-r));
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	r = efs_sb_decode(buf, got, ret, ret_flags, reason, sizeof(reason));
	if (r < 0)
		seterr(err, err_size, "%s: %s", d->path, reason);
out:
	efs_mem_free(buf);
	return r;
}

int efs_cli_check_fs(struct efs_etcd_sync *s, const struct efs_cli_device *d, struct efs_sb *sb,
		     unsigned *ret_flags, Etcfs__FsInfo **ret_fi, char *err, size_t err_size)
{
	struct efs_meta_ns ns;
	struct efs_meta_key key;
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__FsInfo *fi = NULL;
	const char *why = NULL;
	char reason[EFS_SB_REASON_MAX];
	int r;

	r = efs_cli_read_sb(d, sb, ret_flags, err, err_size);
	if (r < 0)
		return r;
	r = efs_meta_ns_init(&ns, sb->name);
	if (r == 0)
		r = efs_meta_key_sb(&ns, &key);
	if (r < 0) {
		seterr(err, err_size, "%s: superblock names an invalid filesystem '%s'", d->path,
		       sb->name);
		return -EUCLEAN;
	}
	r = efs_etcd_sync_get(s, key.buf, key.len, &kv, NULL);
	if (r == -ENOENT) {
		seterr(err, err_size,
		       "%s: filesystem '%s' has no \"sb\" record in etcd (not formatted, or "
		       "formatted against another etcd cluster)",
		       d->path, sb->name);
		return r;
	}
	if (r < 0) {
		const char *m = efs_etcd_sync_last_message(s);

		seterr(err, err_size, "cannot read filesystem '%s' from etcd: %s", sb->name,
		       m && m[0] ? m : strerror(-r));
		return r;
	}
	r = efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &fi, &why);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	if (r < 0) {
		if (r != -ENOMEM) {
			seterr(err, err_size,
			       "filesystem '%s': etcd's \"sb\" record is corrupt: %s", sb->name,
			       why ? why : strerror(-r));
			r = -EUCLEAN;
		}
		return r;
	}
	r = efs_sb_match_fsinfo(sb, fi, reason, sizeof(reason));
	if (r < 0) {
		seterr(err, err_size, "%s: %s", d->path, reason);
		efs_meta_record_free(fi);
		return r;
	}
	*ret_fi = fi;
	return 0;
}

/* ---- keyspace scans ---- */

static void etcd_err(struct efs_etcd_sync *s, int r, const char *what, char *err, size_t size)
{
	const char *m = efs_etcd_sync_last_message(s);

	seterr(err, size, "%s: %s", what, m && m[0] ? m : strerror(-r));
}

int efs_cli_range_foreach(struct efs_etcd_sync *s, const struct efs_meta_range *r, bool keys_only,
			  int (*cb)(const Mvccpb__KeyValue *kv, void *arg), void *arg, char *err,
			  size_t err_size)
{
	struct efs_meta_key start = r->key;
	int64_t rev = 0;
	int ret = 0;

	for (;;) {
		Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
		Etcdserverpb__RangeResponse *resp = NULL;
		bool more;

		req.key.data = start.buf;
		req.key.len = start.len;
		req.range_end.data = (uint8_t *)r->end.buf;
		req.range_end.len = r->end.len;
		req.limit = EFS_CLI_PAGE;
		req.revision = rev;
		req.keys_only = keys_only;
		ret = efs_etcd_sync_call(s, EFS_ETCD_RANGE, &req.base, (ProtobufCMessage **)&resp,
					 NULL);
		if (ret < 0) {
			etcd_err(s, ret, "etcd range read failed", err, err_size);
			return ret;
		}
		if (!rev && resp->header)
			rev = resp->header->revision;
		for (size_t i = 0; i < resp->n_kvs && ret == 0; i++)
			ret = cb(resp->kvs[i], arg);
		more = resp->more && resp->n_kvs > 0 && r->end.len > 0;
		if (more) {
			const Mvccpb__KeyValue *last = resp->kvs[resp->n_kvs - 1];

			if (last->key.len + 1 > sizeof(start.buf)) {
				ret = -EOVERFLOW;
				seterr(err, err_size, "key too long in range scan");
			} else {
				memcpy(start.buf, last->key.data, last->key.len);
				start.buf[last->key.len] = '\0';
				start.len = last->key.len + 1;
			}
		}
		protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
		if (ret != 0 || !more)
			return ret;
	}
}

int efs_cli_range_count(struct efs_etcd_sync *s, const struct efs_meta_range *r, int64_t *ret,
			char *err, size_t err_size)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeResponse *resp = NULL;
	int rc;

	req.key.data = (uint8_t *)r->key.buf;
	req.key.len = r->key.len;
	req.range_end.data = (uint8_t *)r->end.buf;
	req.range_end.len = r->end.len;
	req.count_only = true;
	rc = efs_etcd_sync_call(s, EFS_ETCD_RANGE, &req.base, (ProtobufCMessage **)&resp, NULL);
	if (rc < 0) {
		etcd_err(s, rc, "etcd count failed", err, err_size);
		return rc;
	}
	*ret = resp->count;
	protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	return 0;
}

int efs_cli_mounted_nodes(struct efs_etcd_sync *s, const struct efs_meta_ns *ns,
			  int64_t *ret_count, char *node, char *err, size_t err_size)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeResponse *resp = NULL;
	struct efs_meta_range range;
	int r;

	r = efs_meta_range_family(ns, EFS_META_K_NODE, &range);
	if (r < 0)
		return r;
	req.key.data = range.key.buf;
	req.key.len = range.key.len;
	req.range_end.data = range.end.buf;
	req.range_end.len = range.end.len;
	req.limit = 1;
	req.keys_only = true;
	r = efs_etcd_sync_call(s, EFS_ETCD_RANGE, &req.base, (ProtobufCMessage **)&resp, NULL);
	if (r < 0) {
		etcd_err(s, r, "cannot list the mounted nodes", err, err_size);
		return r;
	}
	*ret_count = resp->count;
	if (node) {
		struct efs_meta_key_info info;

		node[0] = '\0';
		if (resp->n_kvs && efs_meta_key_parse(ns, resp->kvs[0]->key.data,
						      resp->kvs[0]->key.len, &info) == 0)
			snprintf(node, EFS_META_NODE_MAX + 1, "%s", info.node);
		else if (resp->n_kvs)
			snprintf(node, EFS_META_NODE_MAX + 1, "?");
	}
	protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	return 0;
}

/* ---- Another node's /metrics ---- */

/* Connects to |addr| (numeric: no name lookup), waiting until |deadline_ns|
 * (monotonic): the socket, or -errno. */
int efs_cli_metrics_connect(const char *addr, uint64_t deadline_ns)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	char host[INET6_ADDRSTRLEN + 1];
	const char *colon, *start = addr;
	size_t len;
	int fd, r, soerr = 0;
	socklen_t sl = sizeof(soerr);

	if (addr[0] == '[') {
		start = addr + 1;
		colon = strstr(addr, "]:");
		len = colon ? (size_t)(colon - start) : 0;
		colon = colon ? colon + 1 : NULL;
	} else {
		colon = strrchr(addr, ':');
		len = colon ? (size_t)(colon - addr) : 0;
	}
	if (!colon || !len || len >= sizeof(host))
		return -EINVAL;
	memcpy(host, start, len);
	host[len] = '\0';
	if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
		return -EINVAL;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		freeaddrinfo(ai);
		return r;
	}
	r = connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 ? -errno : 0;
	freeaddrinfo(ai);
	if (r == -EINPROGRESS) {
		struct pollfd p = {.fd = fd, .events = POLLOUT};
		uint64_t now = efs_clock_mono_ns();

		r = now < deadline_ns ? poll(&p, 1, (int)((deadline_ns - now) / 1000000) + 1) : 0;
		if (r == 0)
			r = -ETIMEDOUT;
		else if (r < 0)
			r = -errno;
		else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
			r = -errno;
		else
			r = -soerr;
	}
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}

/*
 * GETs /metrics from |addr| on |fd| (efs_cli_metrics_connect; closed here), reading
 * by |deadline| at most EFS_CLI_METRICS_MAX bytes: *|ret| is the
 * NUL-terminated answer, headers included (efs_mem_free), *|ret_first_ns|
 * (may be NULL) when its first byte came. -errno; -ECONNRESET when nothing
 * came.
 */
int efs_cli_metrics_get(int fd, const char *addr, uint64_t deadline, char **ret,
			uint64_t *ret_first_ns)
{
	uint64_t t1 = 0;
	char *buf = NULL, *p;
	size_t len = 0, cap = 0;
	int r = 0;

	if (dprintf(fd, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr) < 0)
		r = -errno;
	while (r == 0) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		uint64_t now = efs_clock_mono_ns();
		ssize_t n;

		if (now >= deadline) {
			r = -ETIMEDOUT;
			break;
		}
		if (cap - len < 4096) {
			if (cap >= EFS_CLI_METRICS_MAX) {
				r = -EFBIG;
				break;
			}
			p = efs_mem_realloc(buf, cap ? cap * 2 : 65536);
			if (!p) {
				r = -ENOMEM;
				break;
			}
			buf = p;
			cap = cap ? cap * 2 : 65536;
		}
		n = poll(&pf, 1, (int)((deadline - now) / 1000000) + 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		if (n == 0)
			continue;
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			r = -errno;
		if (n <= 0)
			break;
		if (!t1)
			t1 = efs_clock_mono_ns();
		len += (size_t)n;
	}
	close(fd);
	if (r == 0 && !len)
		r = -ECONNRESET;
	if (r < 0) {
		efs_mem_free(buf);
		return r;
	}
	buf[len] = '\0';
	*ret = buf;
	if (ret_first_ns)
		*ret_first_ns = t1;
	return 0;
}

/*
 * Reads http://|addr|/metrics within |bound_ms| and measures the node's
 * clock (etcfs_clock_wall_seconds, read while the node renders its answer,
 * so between our send and the answer's first byte) against ours at the
 * middle of that interval.
 */
int efs_cli_clock_probe(const char *addr, uint32_t bound_ms, double *ret_skew_s,
			double *ret_err_s, char *why, size_t why_size)
{
	uint64_t t0, t1 = 0, deadline;
	int64_t t0_real;
	char *buf = NULL, *p;
	const char *bad = NULL;
	double node_s = 0, err_s;
	int fd, r;

	deadline = efs_clock_mono_ns() + (uint64_t)bound_ms * 1000000;
	fd = efs_cli_metrics_connect(addr, deadline);
	if (fd < 0) {
		snprintf(why, why_size, "metrics unreachable: %s", strerror(-fd));
		return fd;
	}
	t0 = efs_clock_mono_ns();
	t0_real = (int64_t)efs_clock_real_ns();
	r = efs_cli_metrics_get(fd, addr, deadline, &buf, &t1);
	if (r == 0) {
		if (strncmp(buf, "HTTP/1.", 7) || strncmp(buf + 8, " 200", 4))
			bad = "metrics answered no 200";
		else if (!(p = strstr(buf, "\netcfs_clock_wall_seconds ")))
			bad = "no etcfs_clock_wall_seconds (an older etcfsd?)";
		else
			node_s = strtod(p + strlen("\netcfs_clock_wall_seconds "), NULL);
	}
	efs_mem_free(buf);
	if (r < 0) {
		snprintf(why, why_size, "metrics unreachable: %s", strerror(-r));
		return r;
	}
	if (bad) {
		snprintf(why, why_size, "%s", bad);
		return -EPROTO;
	}
	err_s = (double)(t1 - t0) / 2e9;
	*ret_err_s = err_s;
	*ret_skew_s = node_s - ((double)t0_real / 1e9 + err_s);
	return 0;
}
