/* SPDX-License-Identifier: Apache-2.0 */
#include "progress.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BAR_WIDTH   30
#define REDRAW_NS   100000000ull /* a bar redraw at most every 100 ms */
#define QUIET_NS    1000000000ull /* plain lines only after the first second */

enum mode { MODE_OFF, MODE_PLAIN, MODE_TTY };

static struct {
	const char *label;
	uint64_t total, done;
	uint64_t start_ns, drawn_ns;
	unsigned tenth; /* plain mode: tenths reported */
	enum mode mode;
	bool active, bar_shown;
} P;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static enum mode pick_mode(void)
{
	const char *e = getenv("ETCFS_PROGRESS");

	if (e && !strcmp(e, "off"))
		return MODE_OFF;
	if (e && !strcmp(e, "plain"))
		return MODE_PLAIN;
	if (e && !strcmp(e, "tty"))
		return MODE_TTY;
	return isatty(STDERR_FILENO) ? MODE_TTY : MODE_PLAIN;
}

/* "1m05s", "12s", "--". */
static void fmt_secs(double s, char *buf, size_t size)
{
	if (s < 0 || s > 360000)
		snprintf(buf, size, "--");
	else if (s >= 60)
		snprintf(buf, size, "%um%02us", (unsigned)(s / 60), (unsigned)s % 60);
	else
		snprintf(buf, size, "%us", (unsigned)s);
}

static void draw_bar(uint64_t t)
{
	double el = (double)(t - P.start_ns) / 1e9;
	double rate = el > 0 ? (double)P.done / el : 0;
	char left[16], bar[BAR_WIDTH + 1];
	unsigned fill = 0;

	if (P.total) {
		fill = (unsigned)((double)P.done * BAR_WIDTH / (double)P.total);
		if (fill > BAR_WIDTH)
			fill = BAR_WIDTH;
	}
	memset(bar, '#', fill);
	memset(bar + fill, '.', BAR_WIDTH - fill);
	bar[BAR_WIDTH] = '\0';
	fmt_secs(rate > 0 && P.total >= P.done ? (double)(P.total - P.done) / rate : -1, left,
		 sizeof(left));
	if (P.total)
		fprintf(stderr, "\r%s [%s] %3u%% %.0f/s, %s left ", P.label, bar,
			(unsigned)(P.done * 100 / P.total), rate, left);
	else
		fprintf(stderr, "\r%s %" PRIu64 " done, %.0f/s ", P.label, P.done, rate);
	fflush(stderr);
	P.bar_shown = true;
	P.drawn_ns = t;
}

void progress_start(const char *label, uint64_t total)
{
	memset(&P, 0, sizeof(P));
	P.label = label;
	P.total = total;
	P.start_ns = now_ns();
	P.mode = pick_mode();
	P.active = true;
}

void progress_add(uint64_t n)
{
	uint64_t t;

	if (!P.active)
		return;
	P.done += n;
	if (P.mode == MODE_OFF)
		return;
	t = now_ns();
	if (P.mode == MODE_TTY) {
		if (t - P.drawn_ns >= REDRAW_NS)
			draw_bar(t);
		return;
	}
	if (!P.total || t - P.start_ns < QUIET_NS)
		return;
	if (P.done * 10 / P.total > P.tenth) {
		char left[16];
		double el = (double)(t - P.start_ns) / 1e9;
		double rate = el > 0 ? (double)P.done / el : 0;

		P.tenth = P.done >= P.total ? 10 : (unsigned)(P.done * 10 / P.total);
		fmt_secs(rate > 0 && P.total >= P.done ? (double)(P.total - P.done) / rate : -1,
			 left, sizeof(left));
		fprintf(stderr, "%s: %u%% (%" PRIu64 " of %" PRIu64 ", %.0f/s, %s left)\n",
			P.label, P.tenth * 10, P.done, P.total, rate, left);
	}
}

void progress_done(const char *summary)
{
	double el;

	if (!P.active)
		return;
	el = (double)(now_ns() - P.start_ns) / 1e9;
	if (P.bar_shown)
		fprintf(stderr, "\r%*s\r", BAR_WIDTH + 60, "");
	/* Quick work stays quiet: nothing was shown, nothing to sum up. */
	if (summary && (P.bar_shown || P.tenth || el >= 1.0))
		fprintf(stderr, "%s: %s (%" PRIu64 " in %.1f s)\n", P.label, summary, P.done, el);
	fflush(stderr);
	P.active = false;
}
