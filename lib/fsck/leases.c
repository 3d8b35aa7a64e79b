/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Keys riding session leases (lock holders and recalls, open references,
 * byte-range locks, node records, group owners): whether their leases are
 * live, and whether an exclusive holder stands alone.
 */
#include "fsck/check-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/mem.h"
#include "rpc.pb-c.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static bool lease_live(const state_t *st, int64_t lease)
{
	const int64_t *p;

	if (lease == 0)
		return false;
	p = bsearch(&lease, st->leases, st->n_leases, sizeof(*st->leases), cmp_i64);
	return p && st->lease_live[p - st->leases];
}

int efs_check__query_leases(struct efs_etcd_sync *s, state_t *st, char *err, size_t err_size)
{
	size_t n = 0;

	for (size_t i = 0; i < st->n_keys; i++)
		if (st->keys[i].lease)
			n++;
	if (!n)
		return 0;
	st->leases = efs_mem_calloc(n, sizeof(*st->leases));
	st->lease_live = efs_mem_calloc(n, sizeof(*st->lease_live));
	if (!st->leases || !st->lease_live)
		return -ENOMEM;
	n = 0;
	for (size_t i = 0; i < st->n_keys; i++)
		if (st->keys[i].lease)
			st->leases[n++] = st->keys[i].lease;
	qsort(st->leases, n, sizeof(*st->leases), cmp_i64);
	st->n_leases = 0;
	for (size_t i = 0; i < n; i++)
		if (st->n_leases == 0 || st->leases[st->n_leases - 1] != st->leases[i])
			st->leases[st->n_leases++] = st->leases[i];
	for (size_t i = 0; i < st->n_leases; i++) {
		Etcdserverpb__LeaseTimeToLiveRequest req =
			ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;
		Etcdserverpb__LeaseTimeToLiveResponse *resp;
		ProtobufCMessage *m;
		char *msg = NULL;
		int r;

		req.id = st->leases[i];
		r = efs_etcd_sync_call(s, EFS_ETCD_LEASE_TIME_TO_LIVE, &req.base, &m, &msg);
		if (r == -ENOENT) {
			/* Some versions answer "lease not found" as an error. */
			efs_mem_free(msg);
			st->lease_live[i] = false;
			continue;
		}
		if (r < 0) {
			snprintf(err, err_size, "asking the TTL of lease %" PRIx64 ": %s",
				 (uint64_t)st->leases[i], msg ? msg : strerror(-r));
			efs_mem_free(msg);
			return r;
		}
		resp = (Etcdserverpb__LeaseTimeToLiveResponse *)m;
		st->lease_live[i] = resp->ttl >= 0;
		protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
	}
	return 0;
}

static void lease_key_desc(state_t *st, const struct key_ent *k, char *buf, size_t size)
{
	switch (k->family) {
	case EFS_META_K_HOLDER:
		snprintf(buf, size, "%s lock holder key of inode %" PRIu64 " for node %s",
			 k->mode == EFS_META_LOCK_EXCLUSIVE ? "exclusive" : "shared", k->ino,
			 k->node);
		break;
	case EFS_META_K_RECALL:
		snprintf(buf, size, "lock recall key of inode %" PRIu64 " for node %s", k->ino,
			 k->node);
		break;
	case EFS_META_K_OPEN:
		snprintf(buf, size, "open reference of inode %" PRIu64 " on node %s", k->ino,
			 k->node);
		break;
	case EFS_META_K_PLOCK:
		snprintf(buf, size, "byte-range lock record of inode %" PRIu64 " on node %s",
			 k->ino, k->node);
		break;
	case EFS_META_K_NODE:
		snprintf(buf, size, "node record of node %s", k->node);
		break;
	default:
		snprintf(buf, size, "owner key of allocation group %" PRIu32, k->group);
		break;
	}
}

void efs_check__stage_leases(state_t *st)
{
	struct efs_check_report *rep = st->rep;
	struct efs_check_finding *f;
	char desc[256];

	for (size_t i = 0; i < st->n_keys; i++) {
		struct key_ent *k = &st->keys[i];

		switch (k->family) {
		case EFS_META_K_HOLDER:
		case EFS_META_K_RECALL:
		case EFS_META_K_OPEN:
		case EFS_META_K_PLOCK:
		case EFS_META_K_NODE:
		case EFS_META_K_AG_OWNER:
			break;
		default:
			continue;
		}
		if (k->removed && !(k->family == EFS_META_K_NODE && k->bad))
			continue;
		if (lease_live(st, k->lease)) {
			if (k->family == EFS_META_K_NODE) {
				char **arr = efs_mem_realloc(rep->mounted, (rep->n_mounted + 1) *
									   sizeof(*arr));

				if (!arr) {
					st->err = -ENOMEM;
					return;
				}
				rep->mounted = arr;
				arr[rep->n_mounted] = efs_mem_strdup(k->node);
				if (!arr[rep->n_mounted]) {
					st->err = -ENOMEM;
					return;
				}
				rep->n_mounted++;
			}
			continue;
		}
		if (k->removed)
			continue;
		lease_key_desc(st, k, desc, sizeof(desc));
		if (k->lease == 0)
			f = efs_check__finding(
			    st, EFS_CHECK_INV_LOCKS, EFS_CHECK_ERROR,
			    "the %s is not attached to a lease, so it never goes away when "
			    "the node does",
			    desc);
		else
			f = efs_check__finding(st, EFS_CHECK_INV_LOCKS, EFS_CHECK_ERROR,
					       "the %s rides lease %" PRIx64 ", which has expired",
					       desc, (uint64_t)k->lease);
		efs_check__set_repair(st, f, "delete it");
		efs_check__op_del(st, f, k->key, k->keylen, k->mod);
		k->removed = true;
	}
}

/* Invariant 6: an exclusive holder excludes every other holder. */
void efs_check__stage_holders(state_t *st)
{
	for (size_t i = 0; i < st->n_keys && !st->err;) {
		size_t j = i, n = 0, x = NONE;
		char others[400];
		size_t o = 0;

		if (st->keys[i].family != EFS_META_K_HOLDER) {
			i++;
			continue;
		}
		/* Holder keys of one inode are adjacent (key order). */
		while (j < st->n_keys && st->keys[j].family == EFS_META_K_HOLDER &&
		       st->keys[j].ino == st->keys[i].ino)
			j++;
		others[0] = '\0';
		for (size_t k = i; k < j; k++) {
			if (st->keys[k].removed)
				continue;
			n++;
			if (st->keys[k].mode == EFS_META_LOCK_EXCLUSIVE && x == NONE) {
				x = k;
				continue;
			}
			if (o + 1 < sizeof(others))
				o += (size_t)snprintf(others + o, sizeof(others) - o, "%s%s (%s)",
						      o ? ", " : "", st->keys[k].node,
						      st->keys[k].mode == EFS_META_LOCK_EXCLUSIVE
							      ? "exclusive"
							      : "shared");
		}
		if (x != NONE && n > 1)
			efs_check__finding(
			    st, EFS_CHECK_INV_LOCKS, EFS_CHECK_ERROR,
			    "inode %" PRIu64 " has an exclusive holder, node %s, together with "
			    "other holders: %s. All ride live leases, so fsck does not choose "
			    "between them; the nodes' sessions must end",
			    st->keys[i].ino, st->keys[x].node, others);
		i = j;
	}
}
