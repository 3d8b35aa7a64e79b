/* SPDX-License-Identifier: Apache-2.0 */
#include "lock/heat.h"

#include <string.h>

static size_t slot_of(uint64_t ino)
{
	/* Fibonacci hashing: consecutive inode numbers spread over the slots. */
	return (size_t)((ino * 0x9E3779B97F4A7C15ull) >> 55) & (EFS_HEAT_SLOTS - 1);
}

static const struct efs_heat_slot *find(const struct efs_heat *h, uint64_t ino)
{
	const struct efs_heat_slot *sl = &h->slots[slot_of(ino)];

	return sl->ino == ino ? sl : NULL;
}

void efs_heat_init(struct efs_heat *h, uint64_t max_hold_ns, uint32_t contended_recalls)
{
	memset(h, 0, sizeof(*h));
	h->max_hold_ns = max_hold_ns;
	h->contended_recalls = contended_recalls;
}

static uint64_t start_hold(const struct efs_heat *h)
{
	return h->max_hold_ns < EFS_HEAT_HOLD_START_NS ? h->max_hold_ns : EFS_HEAT_HOLD_START_NS;
}

uint64_t efs_heat_hold_ns(const struct efs_heat *h, uint64_t ino)
{
	const struct efs_heat_slot *sl = find(h, ino);

	return sl ? sl->hold_ns : start_hold(h);
}

/* |ino|'s slot; a new inode, or another one's slot, starts afresh. */
static struct efs_heat_slot *claim(struct efs_heat *h, uint64_t ino, uint64_t now)
{
	struct efs_heat_slot *sl = &h->slots[slot_of(ino)];

	if (sl->ino != ino) {
		memset(sl, 0, sizeof(*sl));
		sl->ino = ino;
		sl->hold_ns = start_hold(h);
		sl->rate_start_ns = now;
	}
	return sl;
}

void efs_heat_note_recall(struct efs_heat *h, uint64_t ino, uint64_t granted_ns, uint64_t now,
			  bool busy)
{
	struct efs_heat_slot *sl = claim(h, ino, now);
	uint64_t window;

	window = 2 * sl->hold_ns > EFS_HEAT_WINDOW_MIN_NS ? 2 * sl->hold_ns : EFS_HEAT_WINDOW_MIN_NS;
	if (now > granted_ns + window) {
		/* Recalled later than the window: peers want it less often
		 * than the hold would matter. */
		sl->hold_ns /= 2;
		if (sl->hold_ns < EFS_HEAT_HOLD_FLOOR_NS)
			sl->hold_ns = 0;
	} else if (busy) {
		/* Recalled soon while this node still used it: the hold was
		 * too short to let its operations run together. */
		sl->hold_ns = sl->hold_ns ? 2 * sl->hold_ns : start_hold(h);
		if (sl->hold_ns > h->max_hold_ns)
			sl->hold_ns = h->max_hold_ns;
	}
	if (now - sl->rate_start_ns >= EFS_HEAT_RATE_NS) {
		sl->rate_start_ns = now;
		sl->rate_recalls = 0;
	}
	sl->rate_recalls++;
	if (h->contended_recalls &&
	    (sl->rate_recalls >= h->contended_recalls || now < sl->contended_until_ns))
		sl->contended_until_ns = now + EFS_HEAT_CONTENDED_NS;
}

void efs_heat_mark_contended(struct efs_heat *h, uint64_t ino, uint64_t now)
{
	struct efs_heat_slot *sl;

	if (!h->contended_recalls)
		return;
	sl = claim(h, ino, now);
	sl->contended_until_ns = now + EFS_HEAT_CONTENDED_NS;
}

bool efs_heat_contended(const struct efs_heat *h, uint64_t ino, uint64_t now)
{
	const struct efs_heat_slot *sl = find(h, ino);

	return sl && h->contended_recalls && now < sl->contended_until_ns;
}

uint64_t efs_heat_recall_due(const struct efs_heat *h, uint64_t ino, uint64_t granted_ns,
			     uint64_t last_used_ns, bool pinned, uint64_t now)
{
	uint64_t hold = efs_heat_hold_ns(h, ino);
	uint64_t due = granted_ns + hold, idle = last_used_ns + EFS_HEAT_IDLE_GAP_NS;

	if (!hold || efs_heat_contended(h, ino, now))
		return 0;
	if (!pinned && idle < due)
		due = idle;
	return due;
}

uint64_t efs_heat_count_contended(const struct efs_heat *h, uint64_t now)
{
	uint64_t n = 0;

	for (size_t i = 0; i < EFS_HEAT_SLOTS; i++)
		if (h->slots[i].ino && efs_heat_contended(h, h->slots[i].ino, now))
			n++;
	return n;
}
