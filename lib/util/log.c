/* SPDX-License-Identifier: Apache-2.0 */
#include "log.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static enum efs_log_level cur_level = EFS_LOG_INFO;
/* Written by efs_log_detect_journal() before threads exist, read after. */
static bool to_journal;

void efs_log_set_level(enum efs_log_level level)
{
	cur_level = level;
}

enum efs_log_level efs_log_get_level(void)
{
	return cur_level;
}

int efs_log_parse_level(const char *s, enum efs_log_level *ret_level)
{
	static const struct {
		const char *name;
		enum efs_log_level level;
	} names[] = {
		{"err", EFS_LOG_ERR},     {"error", EFS_LOG_ERR}, {"warn", EFS_LOG_WARN},
		{"warning", EFS_LOG_WARN}, {"info", EFS_LOG_INFO}, {"debug", EFS_LOG_DEBUG},
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcmp(s, names[i].name) == 0) {
			*ret_level = names[i].level;
			return 0;
		}
	}
	return -EINVAL;
}

bool efs_log_stream_is_journal(const char *journal_stream, int fd)
{
	unsigned long long dev, ino;
	struct stat st;
	char tail;

	/* systemd sets JOURNAL_STREAM=DEV:INODE for a unit whose stderr or
	 * stdout is the journal (systemd.exec(5)); a redirected stderr (a log
	 * file, a terminal) no longer matches it. */
	if (!journal_stream || sscanf(journal_stream, "%llu:%llu%c", &dev, &ino, &tail) != 2)
		return false;
	if (fstat(fd, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

bool efs_log_detect_journal(void)
{
	to_journal = efs_log_stream_is_journal(getenv("JOURNAL_STREAM"), STDERR_FILENO);
	return to_journal;
}

void efs_log_set_journal(bool on)
{
	to_journal = on;
}

int efs_log_format(char *line, size_t size, bool journal, enum efs_log_level level,
		   const char *fmt, va_list ap)
{
	static const char *const tag[8] = {"", "", "", "error", "warning", "", "info", "debug"};
	struct timespec ts;
	struct tm tm;
	int n, m;

	if (size < 2)
		return -EINVAL;
	if (journal) {
		/* The journal stamps lines itself and reads the <N> prefix as
		 * the syslog priority (sd-daemon(3)). */
		n = snprintf(line, size, "<%d>", (int)level & 7);
	} else {
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = snprintf(line, size, "%02d:%02d:%02d.%03ld %s: ", tm.tm_hour, tm.tm_min,
			     tm.tm_sec, ts.tv_nsec / 1000000, tag[level & 7]);
	}
	if (n < 0)
		return -EINVAL;
	if ((size_t)n > size - 2)
		n = (int)size - 2;
	m = vsnprintf(line + n, size - (size_t)n - 1, fmt, ap);
	if (m < 0)
		return -EINVAL;
	n += m;
	if ((size_t)n > size - 2)
		n = (int)size - 2;
	line[n++] = '\n';
	line[n] = '\0';
	return n;
}

void efs_logv(enum efs_log_level level, const char *fmt, va_list ap)
{
	char line[2048];
	int n;

	if (level > cur_level)
		return;
	n = efs_log_format(line, sizeof(line), to_journal, level, fmt, ap);
	if (n < 0)
		return;
	/* One write per line keeps lines whole across threads. */
	(void)!write(STDERR_FILENO, line, (size_t)n);
}

void efs_log(enum efs_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	efs_logv(level, fmt, ap);
	va_end(ap);
}
