/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * One intrusive doubly linked list for every queue and set of records (in
 * the manner of libuv's uv__queue and the kernel's list_head): a record
 * embeds a struct efs_list node per list it can be on; a list is a head
 * node, initialized empty. Every operation is O(1) except walks. A node
 * not on a list has next == NULL (a zeroed record is unlinked), and
 * efs_list_del of an unlinked node does nothing, so a record can be taken
 * off "whatever list it is on" without knowing whether it is on one.
 */

#include <stdbool.h>
#include <stddef.h>

struct efs_list {
	struct efs_list *next, *prev;
};

/* The record of type |type| whose member |member| is node |n|. */
#define efs_list_entry(n, type, member) ((type *)(void *)((char *)(n) - offsetof(type, member)))

static inline void efs_list_init(struct efs_list *head)
{
	head->next = head->prev = head;
}

static inline bool efs_list_empty(const struct efs_list *head)
{
	return head->next == head;
}

/* Whether node |n| is on a list. */
static inline bool efs_list_linked(const struct efs_list *n)
{
	return n->next != NULL;
}

static inline void efs_list_insert_before(struct efs_list *at, struct efs_list *n)
{
	n->prev = at->prev;
	n->next = at;
	at->prev->next = n;
	at->prev = n;
}

/* Appends |n| (FIFO order: efs_list_first is the oldest). */
static inline void efs_list_add_tail(struct efs_list *head, struct efs_list *n)
{
	efs_list_insert_before(head, n);
}

static inline void efs_list_add_head(struct efs_list *head, struct efs_list *n)
{
	efs_list_insert_before(head->next, n);
}

/* Takes |n| off its list; an unlinked node is left as it is. */
static inline void efs_list_del(struct efs_list *n)
{
	if (!n->next)
		return;
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->next = n->prev = NULL;
}

/* The first node, or NULL when empty. */
static inline struct efs_list *efs_list_first(const struct efs_list *head)
{
	return efs_list_empty(head) ? NULL : head->next;
}

/* Takes the first node off and returns it, or NULL when empty. */
static inline struct efs_list *efs_list_pop(struct efs_list *head)
{
	struct efs_list *n = efs_list_first(head);

	if (n)
		efs_list_del(n);
	return n;
}

/* Moves every node of |from| to the end of |to|; |from| ends empty. */
static inline void efs_list_splice_tail(struct efs_list *to, struct efs_list *from)
{
	if (efs_list_empty(from))
		return;
	from->next->prev = to->prev;
	to->prev->next = from->next;
	from->prev->next = to;
	to->prev = from->prev;
	efs_list_init(from);
}

/* Walks |head| with |n|; |tmp| keeps the next node, so |n| may be taken
 * off (not others) during the walk. */
#define efs_list_for_each_safe(n, tmp, head)                                                       \
	for ((n) = (head)->next, (tmp) = (n)->next; (n) != (head); (n) = (tmp), (tmp) = (n)->next)

/* Walks |head| with |n| (no node may be taken off during the walk). */
#define efs_list_for_each(n, head) for ((n) = (head)->next; (n) != (head); (n) = (n)->next)
