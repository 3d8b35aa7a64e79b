/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fsck.etcfs: checks one filesystem's keyspace against the invariants that
 * lib/fsck/check.h lists (what is checked, and what is repaired) and, with
 * --repair, applies the safe repairs, then checks again. Exit codes as fsck(8) defines them.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "fsck/check.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "meta/sb.h"
#include "progress.h"
#include "util/mem.h"

/* fsck(8) exit codes. */
#define FSCK_OK		 0
#define FSCK_CORRECTED	 1
#define FSCK_UNCORRECTED 4
#define FSCK_ERROR	 8
#define FSCK_USAGE	 16
#define FSCK_CANCELED	 32

/* Repair passes before giving up on what is left. */
#define MAX_PASSES 4

static const char *prog = "fsck.etcfs";

struct fsck {
	struct efs_cli_etcd etcd;
	const char *path;
	bool repair;
	bool no_changes;
	bool verbose;
	bool progress;
	bool progress_shown;
	uint64_t keys_shown; /* keys the progress display has counted */
	struct efs_cli_device dev;
	struct efs_etcd_sync *s;
	struct efs_meta_ns ns;
	char err[EFS_CLI_ERR_MAX];
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: %s [OPTIONS] DEVICE\n"
		"Checks the etcfs filesystem on DEVICE: the keyspace its superblock names, "
		"against\nthe invariants every writer keeps (names, link counts, the directory "
		"tree,\nlock holders, orphans, the inode counter, extents, allocation group maps and\n"
		"free space).\n"
		"\n"
		"  -r, --repair, -y, -p  repair what is safe to repair (all nodes unmounted)\n"
		"  -n                    check only, change nothing (the default)\n"
		"  -v, --verbose         say more, and show progress\n"
		"  -h, --help            this text\n"
		"  -V, --version         the version\n"
		"%s"
		"\n"
		"Read-only checks may run while nodes are mounted; the result may then include\n"
		"changes in flight. --repair refuses while any node is mounted.\n"
		"\n"
		"Exit status (fsck(8)): 0 no errors, 1 errors corrected, 4 errors left "
		"uncorrected,\n8 operational error, 16 usage error, 32 cancelled (Ctrl-C).\n",
		prog, efs_cli_etcd_usage());
}

static int parse_args(struct fsck *k, int argc, char **argv)
{
	enum { OPT_ETCD = 0x200 };
	static const struct option longopts[] = {
		EFS_CLI_ETCD_LONGOPTS(OPT_ETCD),
		{"repair", no_argument, NULL, 'r'},
		{"verbose", no_argument, NULL, 'v'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	int opt, idx, r;

	while ((opt = getopt_long(argc, argv, "rypanvhV", longopts, &idx)) != -1) {
		switch (opt) {
		case OPT_ETCD:
			r = efs_cli_etcd_option(&k->etcd, longopts[idx].name, optarg, k->err,
						sizeof(k->err));
			if (r < 0)
				return r;
			break;
		case 'r':
		case 'y':
		case 'p':
		case 'a':
			k->repair = true;
			break;
		case 'n':
			k->no_changes = true;
			break;
		case 'v':
			k->verbose = true;
			break;
		case 'h':
			usage(stdout);
			exit(FSCK_OK);
		case 'V':
			printf("%s %s\n", prog, ETCFS_VERSION);
			exit(FSCK_OK);
		default:
			snprintf(k->err, sizeof(k->err), "try '%s --help'", prog);
			return -EINVAL;
		}
	}
	if (k->repair && k->no_changes) {
		snprintf(k->err, sizeof(k->err), "--repair and -n exclude each other");
		return -EINVAL;
	}
	if (optind + 1 != argc) {
		snprintf(k->err, sizeof(k->err), "%s; try '%s --help'",
			 optind >= argc ? "missing DEVICE" : "too many arguments", prog);
		return -EINVAL;
	}
	k->path = argv[optind];
	return efs_cli_etcd_finish(&k->etcd, k->err, sizeof(k->err));
}

static void progress_cb(uint64_t keys, void *arg)
{
	struct fsck *k = arg;

	progress_add(keys - k->keys_shown);
	k->keys_shown = keys;
	k->progress_shown = true;
}

/* Counts the filesystem's keys (one count-only Range) for the bar's total
 * and time left; 0 (no total) when the count fails. */
static uint64_t progress_total(struct fsck *k)
{
	struct efs_meta_range rg;
	char err[EFS_CLI_ERR_MAX];
	int64_t n = 0;

	if (efs_meta_range_fs(&k->ns, &rg) < 0 ||
	    efs_cli_range_count(k->s, &rg, &n, err, sizeof(err)) < 0 || n < 0)
		return 0;
	return (uint64_t)n;
}

static void progress_end(struct fsck *k)
{
	char sum[64];

	snprintf(sum, sizeof(sum), "%" PRIu64 " keys read", k->keys_shown);
	progress_done(k->progress_shown ? sum : NULL);
	k->progress_shown = false;
	k->keys_shown = 0;
}

static const char *severity_word(enum efs_check_severity s)
{
	switch (s) {
	case EFS_CHECK_ERROR:
		return "error";
	case EFS_CHECK_WARNING:
		return "warning";
	default:
		return "note";
	}
}

/* Prints the findings of one pass; |after_repair| says what happened. */
static void print_findings(const struct fsck *k, const struct efs_check_report *rep,
			   bool after_repair)
{
	for (size_t i = 0; i < rep->n_findings; i++) {
		const struct efs_check_finding *f = &rep->findings[i];

		/* Notes that carry a repair are actions: always shown. */
		if (f->severity == EFS_CHECK_NOTE && !k->verbose && !f->repair)
			continue;
		printf("%s [%s]: %s\n", severity_word(f->severity), efs_check_inv_name(f->inv),
		       f->message);
		if (f->severity != EFS_CHECK_ERROR && !f->repair)
			continue; /* a warning: nothing to do */
		if (!after_repair) {
			if (f->repair)
				printf("  --repair would %s\n", f->repair);
			else
				printf("  no safe repair: left as it is\n");
		} else if (f->state == EFS_CHECK_REPAIRED) {
			printf("  repaired: %s\n", f->repair);
		} else if (f->state == EFS_CHECK_REPAIR_FAILED) {
			printf("  %s\n", f->repair_message ? f->repair_message : "not repaired");
		} else {
			printf("  left as it is: no safe repair\n");
		}
	}
}

static int check(struct fsck *k, struct efs_check_report **ret)
{
	struct efs_check_opts o = {
		.progress = k->progress ? progress_cb : NULL,
		.progress_arg = k,
	};
	int r;

	if (k->progress)
		progress_start("fsck: reading keys", progress_total(k));
	r = efs_check_run(k->s, &k->ns, &o, ret, k->err, sizeof(k->err));
	progress_end(k);
	return r;
}

static bool has_open_repairs(const struct efs_check_report *rep)
{
	for (size_t i = 0; i < rep->n_findings; i++)
		if (rep->findings[i].state == EFS_CHECK_OPEN && rep->findings[i].repair &&
		    rep->findings[i].n_ops)
			return true;
	return false;
}

static int run(struct fsck *k)
{
	struct efs_check_report *rep = NULL;
	Etcfs__FsInfo *fi = NULL;
	struct efs_sb sb;
	unsigned flags = 0;
	size_t repaired = 0; /* errors repaired */
	bool changed = false; /* any repair committed */
	int r, code;

	r = efs_cli_device_open(k->path, false, &k->dev, k->err, sizeof(k->err));
	if (r < 0)
		return FSCK_ERROR;
	r = efs_cli_etcd_connect(&k->etcd, &k->s, k->err, sizeof(k->err));
	if (r < 0)
		return FSCK_ERROR;
	r = efs_cli_check_fs(k->s, &k->dev, &sb, &flags, &fi, k->err, sizeof(k->err));
	if (r < 0)
		/* A device that disagrees with its keyspace is damage fsck
		 * cannot mend; anything else keeps it from checking at all. */
		return r == -EUCLEAN ? FSCK_UNCORRECTED : FSCK_ERROR;
	efs_meta_record_free(fi);
	r = efs_meta_ns_init(&k->ns, sb.name);
	if (r < 0) {
		snprintf(k->err, sizeof(k->err), "invalid filesystem name in the superblock");
		return FSCK_ERROR;
	}
	if (k->verbose)
		printf("checking filesystem %s on %s\n", sb.name, k->path);
	r = check(k, &rep);
	if (r < 0)
		return FSCK_ERROR;
	if (k->verbose)
		printf("read %" PRIu64 " keys at revision %" PRId64 ": %" PRIu64
		       " inodes, %" PRIu64 " directory entries\n",
		       rep->keys, rep->revision, rep->inodes, rep->dirents);
	if (rep->n_mounted) {
		if (k->repair) {
			snprintf(k->err, sizeof(k->err),
				 "node %s is mounted%s; unmount all nodes first (nothing changed)",
				 rep->mounted[0], rep->n_mounted > 1 ? " (and others)" : "");
			efs_check_report_free(rep);
			return FSCK_ERROR;
		}
		fprintf(stderr,
			"%s: warning: node %s%s mounted; the result may include changes in "
			"flight\n",
			prog, rep->mounted[0], rep->n_mounted > 1 ? " and others are" : " is");
	}
	if (!k->repair) {
		print_findings(k, rep, false);
		code = rep->errors ? FSCK_UNCORRECTED : FSCK_OK;
		goto out;
	}
	for (int pass = 1; pass <= MAX_PASSES; pass++) {
		struct efs_check_report *again = NULL;

		if (!has_open_repairs(rep)) {
			if (pass > 1 || rep->n_findings)
				print_findings(k, rep, true);
			break;
		}
		r = efs_check_repair(k->s, rep);
		if (r == -EBUSY) {
			snprintf(k->err, sizeof(k->err),
				 "node %s is mounted; unmount all nodes first", rep->mounted[0]);
			efs_check_report_free(rep);
			return FSCK_ERROR;
		}
		if (r < 0) {
			snprintf(k->err, sizeof(k->err), "repairing: %s", strerror(-r));
			efs_check_report_free(rep);
			return FSCK_ERROR;
		}
		for (size_t i = 0; i < rep->n_findings; i++)
			if (rep->findings[i].state == EFS_CHECK_REPAIRED &&
			    rep->findings[i].severity == EFS_CHECK_ERROR)
				repaired++;
		changed |= r > 0;
		if (pass > 1 && k->verbose)
			printf("pass %d:\n", pass);
		print_findings(k, rep, true);
		r = check(k, &again);
		if (r < 0) {
			efs_check_report_free(rep);
			return FSCK_ERROR;
		}
		efs_check_report_free(rep);
		rep = again;
		if (rep->n_mounted) {
			snprintf(k->err, sizeof(k->err),
				 "node %s mounted during the repair; stopped", rep->mounted[0]);
			efs_check_report_free(rep);
			return FSCK_ERROR;
		}
		if (r == 0 && !rep->errors)
			break;
		if (pass == MAX_PASSES)
			print_findings(k, rep, false);
	}
	if (rep->errors)
		code = FSCK_UNCORRECTED;
	else
		code = changed ? FSCK_CORRECTED : FSCK_OK;
out:
	if (code == FSCK_OK)
		printf("%s: clean, %" PRIu64 " inodes, %" PRIu64 " directory entries\n", sb.name,
		       rep->inodes, rep->dirents);
	else if (code == FSCK_CORRECTED)
		printf("%s: %zu error%s corrected; the filesystem is now clean\n", sb.name,
		       repaired, repaired == 1 ? "" : "s");
	else if (k->repair)
		printf("%s: %zu error%s corrected, %zu left uncorrected\n", sb.name, repaired,
		       repaired == 1 ? "" : "s", rep->errors);
	else
		printf("%s: %zu error%s left uncorrected (run with --repair to fix what is "
		       "safe)\n",
		       sb.name, rep->errors, rep->errors == 1 ? "" : "s");
	efs_check_report_free(rep);
	return code;
}

/*
 * Ctrl-C ends the check at once (fsck(8)'s 32). Each repair is one
 * transaction, so stopping between or during them leaves every finding
 * either repaired or untouched.
 */
static void on_signal(int sig)
{
	static const char msg[] = "\nfsck.etcfs: cancelled\n";

	(void)sig;
	(void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
	_exit(FSCK_CANCELED);
}

int main(int argc, char **argv)
{
	struct sigaction sa = {.sa_handler = on_signal};
	struct fsck k = {.dev = {.fd = -1}};
	int r, code;

	r = efs_cli_etcd_defaults(&k.etcd, k.err, sizeof(k.err));
	if (r < 0) {
		efs_cli_print_err(prog, r, k.err);
		efs_cli_etcd_free(&k.etcd);
		return FSCK_ERROR;
	}
	r = parse_args(&k, argc, argv);
	if (r < 0) {
		efs_cli_print_err(prog, r, k.err);
		efs_cli_etcd_free(&k.etcd);
		return FSCK_USAGE;
	}
	k.progress = k.verbose || isatty(STDERR_FILENO);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	code = run(&k);
	fflush(stdout);
	if (code == FSCK_ERROR || (code == FSCK_UNCORRECTED && k.err[0]))
		efs_cli_print_err(prog, -EIO, k.err);
	efs_etcd_sync_close(k.s);
	efs_cli_device_close(&k.dev);
	efs_cli_etcd_free(&k.etcd);
	return code;
}
