/* SPDX-License-Identifier: Apache-2.0 */
#include "meta/keys.h"

#include <errno.h>
#include <string.h>

#include "etcd/keys.h"

/*
 * Family tags as they appear after the prefix. "i/" and "ino", "r/", "rc/"
 * and "renameseq" differ before any variable part, so the parser can tell
 * them apart by the tag alone.
 */
#define TAG_SB	      "sb"
#define TAG_INO_CTR   "ino"
#define TAG_RENAMESEQ "renameseq"
#define TAG_INODE     "i/"
#define TAG_DIRENT    "d/"
#define TAG_XATTR     "x/"
#define TAG_EXTENT    "e/"
#define TAG_HOLDER    "l/"
#define TAG_RECALL    "w/"
#define TAG_OPEN      "r/"
#define TAG_PLOCK     "p/"
#define TAG_NODE      "n/"
#define TAG_GEN	      "g/"
#define TAG_AG	      "ag/"
#define TAG_ORPHAN    "o/"
#define TAG_RECLAIM   "rc/"
#define TAG_MAINT     "maint"
#define TAG_PIN	      "pin/"
#define TAG_HANDOVER  "ho/"
#define TAG_SYNC      "sync/"
#define AG_OWNER      "/owner"
#define AG_MAP	      "/map"
#define AG_FREE	      "/free"
#define AG_FI	      "/fi/"

static bool ident_is_valid(const char *s, size_t max)
{
	size_t n = strnlen(s, max + 1);

	if (n == 0 || n > max)
		return false;
	if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

bool efs_meta_fsname_is_valid(const char *s)
{
	return s && ident_is_valid(s, EFS_META_FSNAME_MAX);
}

bool efs_meta_node_is_valid(const char *s)
{
	return s && ident_is_valid(s, EFS_META_NODE_MAX);
}

int efs_meta_name_check(const void *name, size_t len)
{
	const char *s = name;

	if (len > EFS_META_NAME_MAX)
		return -ENAMETOOLONG;
	if (len == 0 || !name)
		return -EINVAL;
	if (memchr(s, '/', len) || memchr(s, '\0', len))
		return -EINVAL;
	if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
		return -EINVAL;
	return 0;
}

int efs_meta_xattr_name_check(const void *name, size_t len)
{
	if (len > EFS_META_XATTR_NAME_MAX)
		return -ERANGE;
	if (len == 0 || !name || memchr(name, '\0', len))
		return -EINVAL;
	return 0;
}

int efs_meta_ns_init(struct efs_meta_ns *ns, const char *fsname)
{
	size_t n;

	if (!efs_meta_fsname_is_valid(fsname))
		return -EINVAL;
	n = strlen(fsname);
	memcpy(ns->name, fsname, n + 1);
	memcpy(ns->prefix, "/etcfs/", 7);
	memcpy(ns->prefix + 7, fsname, n);
	ns->prefix[7 + n] = '/';
	ns->len = 8 + n;
	return 0;
}

/* ---- Builders ---- */

/*
 * Every builder writes into a scratch key and copies it out only on
 * success, so that |ret| is untouched on failure. The capacity always
 * suffices (EFS_META_KEY_MAX covers the longest family), so -E2BIG from the
 * etcd builder would be a bug here; it is passed on rather than hidden.
 */
static void start(const struct efs_meta_ns *ns, struct efs_etcd_key *k, struct efs_meta_key *tmp,
		  const char *tag)
{
	efs_etcd_key_init(k, tmp->buf, sizeof(tmp->buf));
	efs_etcd_key_add(k, ns->prefix, ns->len);
	efs_etcd_key_add_str(k, tag);
}

static int finish(struct efs_etcd_key *k, struct efs_meta_key *tmp, struct efs_meta_key *ret)
{
	if (k->err)
		return k->err;
	ret->len = k->len;
	memcpy(ret->buf, tmp->buf, k->len);
	return 0;
}

static int fixed_key(const struct efs_meta_ns *ns, const char *tag, struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	start(ns, &k, &tmp, tag);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_sb(const struct efs_meta_ns *ns, struct efs_meta_key *ret)
{
	return fixed_key(ns, TAG_SB, ret);
}

int efs_meta_key_ino_counter(const struct efs_meta_ns *ns, struct efs_meta_key *ret)
{
	return fixed_key(ns, TAG_INO_CTR, ret);
}

int efs_meta_key_renameseq(const struct efs_meta_ns *ns, struct efs_meta_key *ret)
{
	return fixed_key(ns, TAG_RENAMESEQ, ret);
}

static int ino_key(const struct efs_meta_ns *ns, const char *tag, uint64_t ino,
		   struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	if (ino == 0)
		return -EINVAL;
	start(ns, &k, &tmp, tag);
	efs_etcd_key_add_u64(&k, ino);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_inode(const struct efs_meta_ns *ns, uint64_t ino, struct efs_meta_key *ret)
{
	return ino_key(ns, TAG_INODE, ino, ret);
}

int efs_meta_key_orphan(const struct efs_meta_ns *ns, uint64_t ino, struct efs_meta_key *ret)
{
	return ino_key(ns, TAG_ORPHAN, ino, ret);
}

int efs_meta_key_reclaim(const struct efs_meta_ns *ns, uint64_t ino, struct efs_meta_key *ret)
{
	return ino_key(ns, TAG_RECLAIM, ino, ret);
}

int efs_meta_key_dirent(const struct efs_meta_ns *ns, uint64_t parent, const void *name,
			size_t len, struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;
	int r;

	if (parent == 0)
		return -EINVAL;
	r = efs_meta_name_check(name, len);
	if (r < 0)
		return r;
	start(ns, &k, &tmp, TAG_DIRENT);
	efs_etcd_key_add_u64(&k, parent);
	efs_etcd_key_add(&k, name, len);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_xattr(const struct efs_meta_ns *ns, uint64_t ino, const void *name, size_t len,
		       struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;
	int r;

	if (ino == 0)
		return -EINVAL;
	r = efs_meta_xattr_name_check(name, len);
	if (r < 0)
		return r;
	start(ns, &k, &tmp, TAG_XATTR);
	efs_etcd_key_add_u64(&k, ino);
	efs_etcd_key_add(&k, name, len);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_extent(const struct efs_meta_ns *ns, uint64_t ino, uint64_t chunk,
			struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	if (ino == 0)
		return -EINVAL;
	start(ns, &k, &tmp, TAG_EXTENT);
	efs_etcd_key_add_u64(&k, ino);
	efs_etcd_key_add_u64(&k, chunk);
	return finish(&k, &tmp, ret);
}

static bool mode_is_valid(int mode)
{
	return mode == EFS_META_LOCK_SHARED || mode == EFS_META_LOCK_EXCLUSIVE;
}

int efs_meta_key_holder(const struct efs_meta_ns *ns, uint64_t ino, int mode, const char *node,
			struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;
	uint8_t m = (uint8_t)mode;

	if (ino == 0 || !mode_is_valid(mode) || !efs_meta_node_is_valid(node))
		return -EINVAL;
	start(ns, &k, &tmp, TAG_HOLDER);
	efs_etcd_key_add_u64(&k, ino);
	efs_etcd_key_add(&k, &m, 1);
	efs_etcd_key_add_str(&k, node);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_recall(const struct efs_meta_ns *ns, uint64_t ino, uint64_t seq,
			const char *node, struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	if (ino == 0 || !efs_meta_node_is_valid(node))
		return -EINVAL;
	start(ns, &k, &tmp, TAG_RECALL);
	efs_etcd_key_add_u64(&k, ino);
	efs_etcd_key_add_u64(&k, seq);
	efs_etcd_key_add_str(&k, node);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_open(const struct efs_meta_ns *ns, uint64_t ino, const char *node,
		      struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	if (ino == 0 || !efs_meta_node_is_valid(node))
		return -EINVAL;
	start(ns, &k, &tmp, TAG_OPEN);
	efs_etcd_key_add_u64(&k, ino);
	efs_etcd_key_add_str(&k, node);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_plock(const struct efs_meta_ns *ns, uint64_t ino, const char *node,
		       uint64_t owner, struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	if (ino == 0 || !efs_meta_node_is_valid(node))
		return -EINVAL;
	start(ns, &k, &tmp, TAG_PLOCK);
	efs_etcd_key_add_u64(&k, ino);
	efs_etcd_key_add_str(&k, node);
	efs_etcd_key_add_str(&k, "/");
	efs_etcd_key_add_u64(&k, owner);
	return finish(&k, &tmp, ret);
}

static int node_key(const struct efs_meta_ns *ns, const char *tag, const char *node,
		    struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	if (!efs_meta_node_is_valid(node))
		return -EINVAL;
	start(ns, &k, &tmp, tag);
	efs_etcd_key_add_str(&k, node);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_node(const struct efs_meta_ns *ns, const char *node, struct efs_meta_key *ret)
{
	return node_key(ns, TAG_NODE, node, ret);
}

int efs_meta_key_gen(const struct efs_meta_ns *ns, const char *node, struct efs_meta_key *ret)
{
	return node_key(ns, TAG_GEN, node, ret);
}

int efs_meta_key_maint(const struct efs_meta_ns *ns, struct efs_meta_key *ret)
{
	return fixed_key(ns, TAG_MAINT, ret);
}

int efs_meta_key_pin(const struct efs_meta_ns *ns, const char *name, struct efs_meta_key *ret)
{
	return node_key(ns, TAG_PIN, name, ret);
}

int efs_meta_key_handover(const struct efs_meta_ns *ns, const char *node,
			  struct efs_meta_key *ret)
{
	return node_key(ns, TAG_HANDOVER, node, ret);
}

int efs_meta_key_sync(const struct efs_meta_ns *ns, const char *id, struct efs_meta_key *ret)
{
	return node_key(ns, TAG_SYNC, id, ret);
}

int efs_meta_key_sync_ack(const struct efs_meta_ns *ns, const char *id, const char *node,
			  struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	if (!efs_meta_node_is_valid(id) || !efs_meta_node_is_valid(node))
		return -EINVAL;
	start(ns, &k, &tmp, TAG_SYNC);
	efs_etcd_key_add_str(&k, id);
	efs_etcd_key_add_str(&k, "/");
	efs_etcd_key_add_str(&k, node);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_ag(const struct efs_meta_ns *ns, uint32_t group, enum efs_meta_family family,
		    struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;
	const char *sub;

	switch (family) {
	case EFS_META_K_AG_OWNER:
		sub = AG_OWNER;
		break;
	case EFS_META_K_AG_MAP:
		sub = AG_MAP;
		break;
	case EFS_META_K_AG_FREE:
		sub = AG_FREE;
		break;
	default:
		return -EINVAL;
	}
	start(ns, &k, &tmp, TAG_AG);
	efs_etcd_key_add_u32(&k, group);
	efs_etcd_key_add_str(&k, sub);
	return finish(&k, &tmp, ret);
}

int efs_meta_key_free_intent(const struct efs_meta_ns *ns, uint32_t group, const char *node,
			     uint64_t session, uint64_t seq, struct efs_meta_key *ret)
{
	struct efs_meta_key tmp;
	struct efs_etcd_key k;

	if (!efs_meta_node_is_valid(node))
		return -EINVAL;
	start(ns, &k, &tmp, TAG_AG);
	efs_etcd_key_add_u32(&k, group);
	efs_etcd_key_add_str(&k, AG_FI);
	efs_etcd_key_add_str(&k, node);
	efs_etcd_key_add_str(&k, "/");
	efs_etcd_key_add_u64(&k, session);
	efs_etcd_key_add_u64(&k, seq);
	return finish(&k, &tmp, ret);
}

/* ---- Parser ---- */

/* A cursor over the untrusted key. */
struct cur {
	const uint8_t *p;
	size_t n;
};

static bool eat(struct cur *c, const char *lit)
{
	size_t l = strlen(lit);

	if (c->n < l || memcmp(c->p, lit, l) != 0)
		return false;
	c->p += l;
	c->n -= l;
	return true;
}

static bool eat_u64(struct cur *c, uint64_t *v)
{
	if (c->n < 8)
		return false;
	*v = efs_etcd_be64_get(c->p);
	c->p += 8;
	c->n -= 8;
	return true;
}

static bool eat_u32(struct cur *c, uint32_t *v)
{
	if (c->n < 4)
		return false;
	*v = efs_etcd_be32_get(c->p);
	c->p += 4;
	c->n -= 4;
	return true;
}

static bool eat_ino(struct cur *c, uint64_t *v)
{
	return eat_u64(c, v) && *v != 0;
}

/* Copies the next |len| bytes as a node id and checks it. */
static bool take_node(struct cur *c, size_t len, char out[EFS_META_NODE_MAX + 1])
{
	if (len > c->n || len > EFS_META_NODE_MAX)
		return false;
	memcpy(out, c->p, len);
	out[len] = '\0';
	if (strlen(out) != len || !efs_meta_node_is_valid(out))
		return false;
	c->p += len;
	c->n -= len;
	return true;
}

/* Node followed by '/' and |tail| fixed bytes: the node is everything up to
 * the '/' that precedes the tail (node ids hold no '/'). */
static bool take_node_slash(struct cur *c, size_t tail, char out[EFS_META_NODE_MAX + 1])
{
	size_t nlen;

	if (c->n < tail + 2)
		return false;
	nlen = c->n - tail - 1;
	if (c->p[nlen] != '/')
		return false;
	if (!take_node(c, nlen, out))
		return false;
	return eat(c, "/");
}

/* After "sync/": "<id>" (a request) or "<id>/<node>" (an answer). */
static int parse_sync(struct cur *c, struct efs_meta_key_info *info)
{
	const uint8_t *slash = memchr(c->p, '/', c->n);
	char id[EFS_META_NODE_MAX + 1];
	size_t idlen;

	if (!slash) {
		info->family = EFS_META_K_SYNC;
		return take_node(c, c->n, info->node) ? 0 : -EINVAL;
	}
	info->family = EFS_META_K_SYNC_ACK;
	idlen = (size_t)(slash - c->p);
	info->name = c->p;
	info->name_len = idlen;
	if (!take_node(c, idlen, id) || !eat(c, "/"))
		return -EINVAL;
	return take_node(c, c->n, info->node) ? 0 : -EINVAL;
}

static int parse_ag(struct cur *c, struct efs_meta_key_info *info)
{
	if (!eat_u32(c, &info->group))
		return -EINVAL;
	if (eat(c, AG_OWNER)) {
		info->family = EFS_META_K_AG_OWNER;
	} else if (eat(c, AG_MAP)) {
		info->family = EFS_META_K_AG_MAP;
	} else if (eat(c, AG_FREE)) {
		info->family = EFS_META_K_AG_FREE;
	} else if (eat(c, AG_FI)) {
		info->family = EFS_META_K_FREE_INTENT;
		if (!take_node_slash(c, 16, info->node) || !eat_u64(c, &info->session) ||
		    !eat_u64(c, &info->num))
			return -EINVAL;
	} else {
		return -EINVAL;
	}
	return 0;
}

static int parse_body(struct cur *c, struct efs_meta_key_info *info)
{
	uint8_t m;

	if (eat(c, TAG_INODE)) {
		info->family = EFS_META_K_INODE;
		return eat_ino(c, &info->ino) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_ORPHAN)) {
		info->family = EFS_META_K_ORPHAN;
		return eat_ino(c, &info->ino) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_RECLAIM)) {
		info->family = EFS_META_K_RECLAIM;
		return eat_ino(c, &info->ino) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_DIRENT) || eat(c, TAG_XATTR)) {
		bool dirent = c->p[-2] == 'd';

		info->family = dirent ? EFS_META_K_DIRENT : EFS_META_K_XATTR;
		if (!eat_ino(c, &info->ino))
			return -EINVAL;
		if ((dirent ? efs_meta_name_check(c->p, c->n)
			    : efs_meta_xattr_name_check(c->p, c->n)) < 0)
			return -EINVAL;
		info->name = c->p;
		info->name_len = c->n;
		c->p += c->n;
		c->n = 0;
		return 0;
	}
	if (eat(c, TAG_EXTENT)) {
		info->family = EFS_META_K_EXTENT;
		return eat_ino(c, &info->ino) && eat_u64(c, &info->num) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_HOLDER)) {
		info->family = EFS_META_K_HOLDER;
		if (!eat_ino(c, &info->ino) || c->n < 1)
			return -EINVAL;
		m = c->p[0];
		if (!mode_is_valid(m))
			return -EINVAL;
		info->mode = (char)m;
		c->p++;
		c->n--;
		return take_node(c, c->n, info->node) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_RECALL)) {
		info->family = EFS_META_K_RECALL;
		return eat_ino(c, &info->ino) && eat_u64(c, &info->num) &&
				       take_node(c, c->n, info->node)
			       ? 0
			       : -EINVAL;
	}
	if (eat(c, TAG_OPEN)) {
		info->family = EFS_META_K_OPEN;
		return eat_ino(c, &info->ino) && take_node(c, c->n, info->node) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_PLOCK)) {
		info->family = EFS_META_K_PLOCK;
		return eat_ino(c, &info->ino) && take_node_slash(c, 8, info->node) &&
				       eat_u64(c, &info->num)
			       ? 0
			       : -EINVAL;
	}
	if (eat(c, TAG_NODE) || eat(c, TAG_GEN)) {
		info->family = c->p[-2] == 'n' ? EFS_META_K_NODE : EFS_META_K_GEN;
		return take_node(c, c->n, info->node) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_AG))
		return parse_ag(c, info);
	if (eat(c, TAG_PIN)) {
		info->family = EFS_META_K_PIN;
		return take_node(c, c->n, info->node) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_HANDOVER)) {
		info->family = EFS_META_K_HANDOVER;
		return take_node(c, c->n, info->node) ? 0 : -EINVAL;
	}
	if (eat(c, TAG_SYNC))
		return parse_sync(c, info);
	if (eat(c, TAG_MAINT)) {
		info->family = EFS_META_K_MAINT;
		return 0;
	}
	if (eat(c, TAG_RENAMESEQ)) {
		info->family = EFS_META_K_RENAMESEQ;
		return 0;
	}
	if (eat(c, TAG_INO_CTR)) {
		info->family = EFS_META_K_INO_COUNTER;
		return 0;
	}
	if (eat(c, TAG_SB)) {
		info->family = EFS_META_K_SB;
		return 0;
	}
	return -EINVAL;
}

int efs_meta_key_parse(const struct efs_meta_ns *ns, const uint8_t *key, size_t len,
		       struct efs_meta_key_info *ret)
{
	struct efs_meta_key_info info;
	struct cur c = {key, len};
	int r;

	if (!key || !efs_etcd_key_has_prefix(key, len, ns->prefix, ns->len))
		return -EINVAL;
	c.p += ns->len;
	c.n -= ns->len;
	memset(&info, 0, sizeof(info));
	r = parse_body(&c, &info);
	if (r < 0)
		return r;
	/* Trailing bytes after a complete key: some other (future) family. */
	if (c.n != 0)
		return -EINVAL;
	*ret = info;
	return 0;
}

/* ---- Ranges ---- */

/* Makes |r| the prefix range of the key in |r->key|. */
static void prefix_range(struct efs_meta_range *r)
{
	r->end.len = efs_etcd_prefix_end(r->key.buf, r->key.len, r->end.buf);
}

static int prefix_of(const struct efs_meta_ns *ns, const char *tag, struct efs_meta_range *ret)
{
	struct efs_meta_range tmp;
	struct efs_etcd_key k;
	int r;

	start(ns, &k, &tmp.key, tag);
	r = finish(&k, &tmp.key, &tmp.key);
	if (r < 0)
		return r;
	prefix_range(&tmp);
	*ret = tmp;
	return 0;
}

int efs_meta_range_fs(const struct efs_meta_ns *ns, struct efs_meta_range *ret)
{
	return prefix_of(ns, "", ret);
}

static const char *family_tag(enum efs_meta_family family)
{
	switch (family) {
	case EFS_META_K_INODE:
		return TAG_INODE;
	case EFS_META_K_DIRENT:
		return TAG_DIRENT;
	case EFS_META_K_XATTR:
		return TAG_XATTR;
	case EFS_META_K_EXTENT:
		return TAG_EXTENT;
	case EFS_META_K_HOLDER:
		return TAG_HOLDER;
	case EFS_META_K_RECALL:
		return TAG_RECALL;
	case EFS_META_K_OPEN:
		return TAG_OPEN;
	case EFS_META_K_PLOCK:
		return TAG_PLOCK;
	case EFS_META_K_NODE:
		return TAG_NODE;
	case EFS_META_K_GEN:
		return TAG_GEN;
	case EFS_META_K_AG_OWNER:
	case EFS_META_K_AG_MAP:
	case EFS_META_K_AG_FREE:
	case EFS_META_K_FREE_INTENT:
		return TAG_AG;
	case EFS_META_K_ORPHAN:
		return TAG_ORPHAN;
	case EFS_META_K_RECLAIM:
		return TAG_RECLAIM;
	case EFS_META_K_PIN:
		return TAG_PIN;
	case EFS_META_K_HANDOVER:
		return TAG_HANDOVER;
	case EFS_META_K_SYNC:
	case EFS_META_K_SYNC_ACK:
		return TAG_SYNC;
	case EFS_META_K_SB:
	case EFS_META_K_INO_COUNTER:
	case EFS_META_K_RENAMESEQ:
	case EFS_META_K_MAINT:
		break;
	}
	return NULL;
}

int efs_meta_range_family(const struct efs_meta_ns *ns, enum efs_meta_family family,
			  struct efs_meta_range *ret)
{
	struct efs_meta_range tmp;
	const char *tag;
	int r;

	switch (family) {
	case EFS_META_K_SB:
		r = efs_meta_key_sb(ns, &tmp.key);
		break;
	case EFS_META_K_INO_COUNTER:
		r = efs_meta_key_ino_counter(ns, &tmp.key);
		break;
	case EFS_META_K_RENAMESEQ:
		r = efs_meta_key_renameseq(ns, &tmp.key);
		break;
	case EFS_META_K_MAINT:
		r = efs_meta_key_maint(ns, &tmp.key);
		break;
	default:
		tag = family_tag(family);
		return tag ? prefix_of(ns, tag, ret) : -EINVAL;
	}
	if (r < 0)
		return r;
	tmp.end.len = 0;
	*ret = tmp;
	return 0;
}

int efs_meta_range_ino(const struct efs_meta_ns *ns, enum efs_meta_family family, uint64_t ino,
		       struct efs_meta_range *ret)
{
	struct efs_meta_range tmp;
	struct efs_etcd_key k;
	int r;

	switch (family) {
	case EFS_META_K_DIRENT:
	case EFS_META_K_XATTR:
	case EFS_META_K_EXTENT:
	case EFS_META_K_HOLDER:
	case EFS_META_K_RECALL:
	case EFS_META_K_OPEN:
	case EFS_META_K_PLOCK:
		break;
	default:
		return -EINVAL;
	}
	if (ino == 0)
		return -EINVAL;
	start(ns, &k, &tmp.key, family_tag(family));
	efs_etcd_key_add_u64(&k, ino);
	r = finish(&k, &tmp.key, &tmp.key);
	if (r < 0)
		return r;
	prefix_range(&tmp);
	*ret = tmp;
	return 0;
}

int efs_meta_range_holders(const struct efs_meta_ns *ns, uint64_t ino, int mode,
			   struct efs_meta_range *ret)
{
	struct efs_meta_range tmp;
	struct efs_etcd_key k;
	uint8_t m = (uint8_t)mode;
	int r;

	if (ino == 0 || !mode_is_valid(mode))
		return -EINVAL;
	start(ns, &k, &tmp.key, TAG_HOLDER);
	efs_etcd_key_add_u64(&k, ino);
	efs_etcd_key_add(&k, &m, 1);
	r = finish(&k, &tmp.key, &tmp.key);
	if (r < 0)
		return r;
	prefix_range(&tmp);
	*ret = tmp;
	return 0;
}

int efs_meta_range_plocks_of_node(const struct efs_meta_ns *ns, uint64_t ino, const char *node,
				  struct efs_meta_range *ret)
{
	struct efs_meta_range tmp;
	struct efs_etcd_key k;
	int r;

	if (ino == 0 || !efs_meta_node_is_valid(node))
		return -EINVAL;
	start(ns, &k, &tmp.key, TAG_PLOCK);
	efs_etcd_key_add_u64(&k, ino);
	efs_etcd_key_add_str(&k, node);
	efs_etcd_key_add_str(&k, "/");
	r = finish(&k, &tmp.key, &tmp.key);
	if (r < 0)
		return r;
	prefix_range(&tmp);
	*ret = tmp;
	return 0;
}

int efs_meta_range_dirents_after(const struct efs_meta_ns *ns, uint64_t parent, const void *name,
				 size_t len, struct efs_meta_range *ret)
{
	struct efs_meta_range tmp;
	struct efs_meta_key pfx;
	size_t plen;
	int r;

	r = efs_meta_key_dirent(ns, parent, name, len, &tmp.key);
	if (r < 0)
		return r;
	/* The smallest key after "d/<parent><name>" is that key plus a NUL;
	 * no stored name holds a NUL, so this skips exactly |name|. */
	tmp.key.buf[tmp.key.len++] = '\0';
	plen = ns->len + strlen(TAG_DIRENT) + 8;
	memcpy(pfx.buf, tmp.key.buf, plen);
	tmp.end.len = efs_etcd_prefix_end(pfx.buf, plen, tmp.end.buf);
	*ret = tmp;
	return 0;
}

int efs_meta_range_handovers(const struct efs_meta_ns *ns, struct efs_meta_range *ret)
{
	return prefix_of(ns, TAG_HANDOVER, ret);
}

int efs_meta_range_syncs(const struct efs_meta_ns *ns, struct efs_meta_range *ret)
{
	return prefix_of(ns, TAG_SYNC, ret);
}

int efs_meta_range_sync_acks(const struct efs_meta_ns *ns, const char *id,
			     struct efs_meta_range *ret)
{
	struct efs_meta_range tmp;
	int r = efs_meta_key_sync(ns, id, &tmp.key);

	if (r < 0)
		return r;
	/* The request's key and a '/': its answers, not another id that
	 * starts alike (the answers' keys are longer, so this fits). */
	tmp.key.buf[tmp.key.len++] = '/';
	prefix_range(&tmp);
	*ret = tmp;
	return 0;
}

int efs_meta_range_pins(const struct efs_meta_ns *ns, struct efs_meta_range *ret)
{
	return prefix_of(ns, TAG_PIN, ret);
}

int efs_meta_range_backup_pins(const struct efs_meta_ns *ns, struct efs_meta_range *ret)
{
	return prefix_of(ns, TAG_PIN EFS_META_PIN_BACKUP, ret);
}

static int group_range(const struct efs_meta_ns *ns, uint32_t group, const char *sub,
		       struct efs_meta_range *ret)
{
	struct efs_meta_range tmp;
	struct efs_etcd_key k;
	int r;

	start(ns, &k, &tmp.key, TAG_AG);
	efs_etcd_key_add_u32(&k, group);
	efs_etcd_key_add_str(&k, sub);
	r = finish(&k, &tmp.key, &tmp.key);
	if (r < 0)
		return r;
	prefix_range(&tmp);
	*ret = tmp;
	return 0;
}

int efs_meta_range_group(const struct efs_meta_ns *ns, uint32_t group, struct efs_meta_range *ret)
{
	return group_range(ns, group, "/", ret);
}

int efs_meta_range_free_intents(const struct efs_meta_ns *ns, uint32_t group,
				struct efs_meta_range *ret)
{
	return group_range(ns, group, AG_FI, ret);
}
