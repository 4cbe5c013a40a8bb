/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* Completion queues and completion channels through the stock libibverbs
 * API, and the async event fd. Completions themselves need QPs; here: the
 * objects, their bookkeeping, arming, empty polls, non-blocking channel and
 * async reads, and the errors for bad arguments. */
#define _GNU_SOURCE
#include "verbs_test.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

static int fd_is_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

int main(void)
{
	struct ibv_context *ctx = open_siwx("lo");
	int cookie = 42;

	CHECK_EQ(ctx->num_comp_vectors, 1);

	/* A channel: its own fd, no CQ yet. */
	struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
	CHECK(channel != NULL);
	CHECK(channel->context == ctx);
	CHECK(channel->fd >= 0);
	CHECK_EQ(channel->refcnt, 0);
	const int channel_fd = channel->fd;

	/* A CQ on it: libibverbs counts the reference. */
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, &cookie, channel, 0);
	CHECK(cq != NULL);
	CHECK(cq->context == ctx);
	CHECK(cq->channel == channel);
	CHECK(cq->cq_context == &cookie);
	CHECK(cq->cqe >= 16);
	CHECK_EQ(channel->refcnt, 1);
	CHECK_EQ(ibv_destroy_comp_channel(channel), EBUSY);

	/* Arming and polling an empty CQ. */
	CHECK_EQ(ibv_req_notify_cq(cq, 0), 0);
	CHECK_EQ(ibv_req_notify_cq(cq, 1), 0);
	struct ibv_wc wc[4];
	CHECK_EQ(ibv_poll_cq(cq, 4, wc), 0);
	CHECK_EQ(ibv_poll_cq(cq, 0, wc), 0);
	CHECK(ibv_poll_cq(cq, -1, wc) < 0);

	/* Nothing fired: a non-blocking channel has no event and says EAGAIN. */
	int flags = fcntl(channel->fd, F_GETFL);
	CHECK(flags >= 0);
	CHECK_EQ(fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK), 0);
	struct pollfd pfd = {.fd = channel->fd, .events = POLLIN};
	CHECK_EQ(poll(&pfd, 1, 0), 0);
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	errno = 0;
	CHECK_EQ(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), -1);
	CHECK_EQ(errno, EAGAIN);

	/* Not offered: resizing (libibverbs' dummy answers). */
	CHECK_EQ(ibv_resize_cq(cq, 32), EOPNOTSUPP);

	/* Many CQs on one channel, and CQs without a channel. */
	enum { kMany = 100 };
	struct ibv_cq *many[kMany];
	for (int i = 0; i < kMany; i++) {
		many[i] = ibv_create_cq(ctx, 1 + i, NULL, (i % 2) ? channel : NULL, 0);
		CHECK(many[i] != NULL);
		CHECK(many[i]->cqe >= 1 + i);
		CHECK(many[i]->channel == ((i % 2) ? channel : NULL));
		CHECK_EQ(ibv_req_notify_cq(many[i], i % 2), 0);
	}
	CHECK_EQ(channel->refcnt, 1 + kMany / 2);
	for (int i = 0; i < kMany; i++)
		CHECK_EQ(ibv_destroy_cq(many[i]), 0);
	CHECK_EQ(channel->refcnt, 1);

	/* Bad arguments. */
	CHECK_NULL_ERRNO(ibv_create_cq(ctx, 0, NULL, NULL, 0), EINVAL);
	CHECK_NULL_ERRNO(ibv_create_cq(ctx, -1, NULL, NULL, 0), EINVAL);
	struct ibv_device_attr attr;
	CHECK_EQ(ibv_query_device(ctx, &attr), 0);
	CHECK_NULL_ERRNO(ibv_create_cq(ctx, attr.max_cqe + 1, NULL, NULL, 0), EINVAL);
	CHECK_NULL_ERRNO(ibv_create_cq(ctx, 4, NULL, NULL, 1), EINVAL);  /* one vector only */
	CHECK_NULL_ERRNO(ibv_create_cq(ctx, 4, NULL, NULL, -1), EINVAL);
	/* A channel of another context. */
	struct ibv_context *other = open_siwx("lo");
	struct ibv_comp_channel *other_channel = ibv_create_comp_channel(other);
	CHECK(other_channel != NULL);
	CHECK(other_channel->fd != channel->fd);
	CHECK_NULL_ERRNO(ibv_create_cq(ctx, 4, NULL, other_channel, 0), EINVAL);
	CHECK_EQ(other_channel->refcnt, 0);
	CHECK_EQ(ibv_destroy_comp_channel(other_channel), 0);
	CHECK_EQ(ibv_close_device(other), 0);

	/* Teardown in the documented order releases the channel's fd. */
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(channel->refcnt, 0);
	CHECK_EQ(ibv_destroy_comp_channel(channel), 0);
	CHECK(!fd_is_open(channel_fd));

	/* The async event fd: present, pollable, empty. */
	CHECK(ctx->async_fd >= 0);
	flags = fcntl(ctx->async_fd, F_GETFL);
	CHECK_EQ(fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
	struct ibv_async_event event;
	errno = 0;
	CHECK_EQ(ibv_get_async_event(ctx, &event), -1);
	CHECK_EQ(errno, EAGAIN);
	const int async_fd = ctx->async_fd;

	/* Channels come and go without leaking descriptors. */
	for (int i = 0; i < 500; i++) {
		struct ibv_comp_channel *c = ibv_create_comp_channel(ctx);
		CHECK(c != NULL);
		struct ibv_cq *q = ibv_create_cq(ctx, 2, NULL, c, 0);
		CHECK(q != NULL);
		CHECK_EQ(ibv_destroy_cq(q), 0);
		CHECK_EQ(ibv_destroy_comp_channel(c), 0);
	}

	CHECK_EQ(ibv_close_device(ctx), 0);
	CHECK(!fd_is_open(async_fd)); /* libibverbs closed it */
	printf("cq: ok\n");
	return 0;
}
