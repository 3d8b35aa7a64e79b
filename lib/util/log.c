/* SPDX-License-Identifier: Apache-2.0 */
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum efs_log_level cur_level = EFS_LOG_INFO;

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

void efs_logv(enum efs_log_level level, const char *fmt, va_list ap)
{
	static const char *const tag[8] = {"", "", "", "error", "warning", "", "info", "debug"};
	char line[2048];
	struct timespec ts;
	struct tm tm;
	int n, m;

	if (level > cur_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld %s: ", tm.tm_hour, tm.tm_min,
		     tm.tm_sec, ts.tv_nsec / 1000000, tag[level & 7]);
	if (n < 0)
		return;
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	if (m < 0)
		return;
	n += m;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
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
