/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* Data between two QPs through the stock libibverbs API under siwx-run:
 * each QP on its own device context (two engines, as two processes would
 * have), connected by a socketpair or loopback TCP handed to both with the
 * provider's siwx_qp_bind_stream(). Send, RDMA Write and RDMA Read of 0, 1,
 * 4099 octets and 1 MiB with SGE lists, under several stream parameter
 * sets (CRC on/off, markers, RFC 6581 RTR); Local Invalidate, the refused
 * Send with Invalidate of a memory region, inline data, fences, long WR lists with selective signalling,
 * solicited events, and completion channels (ibv_req_notify_cq,
 * ibv_get_cq_event, ibv_ack_cq_events). */
#define _GNU_SOURCE
#include "qp_util.h"

#include <poll.h>
#include <unistd.h>

enum {
	kMiB = 1 << 20,
	kRegion = 4 * kMiB, /* per side: src at 0, dst at 2 MiB */
	kDst = 2 * kMiB,
	kQueue = 64,
};

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *scq;
	struct ibv_cq *rcq; /* on `channel` */
	struct ibv_qp *qp;
	uint8_t *mem;
	struct ibv_mr *mr;
};

static void side_open(struct side *s)
{
	memset(s, 0, sizeof(*s));
	s->ctx = open_siwx("lo");
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd != NULL);
	s->channel = ibv_create_comp_channel(s->ctx);
	CHECK(s->channel != NULL);
	s->scq = ibv_create_cq(s->ctx, 4 * kQueue, NULL, NULL, 0);
	s->rcq = ibv_create_cq(s->ctx, 4 * kQueue, s, s->channel, 0);
	CHECK(s->scq != NULL && s->rcq != NULL);
	s->mem = malloc(kRegion);
	CHECK(s->mem != NULL);
	const int access =
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	s->mr = ibv_reg_mr(s->pd, s->mem, kRegion, access);
	CHECK(s->mr != NULL);
}

static void side_qp(struct side *s)
{
	s->qp = create_rc_qp(s->pd, s->scq, s->rcq, NULL, kQueue, 4, 256);
	CHECK_EQ(modify_state(s->qp, IBV_QPS_INIT), 0);
}

static void side_close(struct side *s)
{
	if (s->qp != NULL)
		CHECK_EQ(ibv_destroy_qp(s->qp), 0);
	CHECK_EQ(ibv_dereg_mr(s->mr), 0);
	free(s->mem);
	CHECK_EQ(ibv_destroy_cq(s->scq), 0);
	CHECK_EQ(ibv_destroy_cq(s->rcq), 0);
	CHECK_EQ(ibv_destroy_comp_channel(s->channel), 0);
	CHECK_EQ(ibv_dealloc_pd(s->pd), 0);
	CHECK_EQ(ibv_close_device(s->ctx), 0);
}

/* `size` octets at `base` split into `n` SGEs of uneven lengths. */
static void split(struct side *s, uint64_t base, uint32_t size, struct ibv_sge *sge, int n)
{
	uint64_t at = base;
	for (int i = 0; i < n; i++) {
		uint32_t len = size / (uint32_t)n + ((uint32_t)i < size % (uint32_t)n ? 1 : 0);
		sge[i].addr = (uintptr_t)s->mem + at;
		sge[i].length = len;
		sge[i].lkey = s->mr->lkey;
		at += len;
	}
}

static void expect_wc(const struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_opcode opcode,
		      uint32_t byte_len, uint32_t qp_num)
{
	CHECK_EQ_U64(wc->wr_id, wr_id);
	CHECK_EQ(wc->status, IBV_WC_SUCCESS);
	CHECK_EQ(wc->opcode, opcode);
	CHECK_EQ(wc->byte_len, byte_len);
	CHECK_EQ(wc->qp_num, qp_num);
}

static void post_recv_split(struct side *s, uint64_t wr_id, uint32_t size, int n)
{
	struct ibv_sge sge[4];
	split(s, kDst, size, sge, n);
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = sge, .num_sge = n};
	struct ibv_recv_wr *bad = NULL;
	CHECK_EQ(ibv_post_recv(s->qp, &wr, &bad), 0);
}

static void post_send_wr(struct side *s, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	CHECK_EQ(ibv_post_send(s->qp, wr, &bad), 0);
}

/* A sends `size` octets in 4 SGEs into B's receive of 3 SGEs. */
static void send_case(struct side *a, struct side *b, uint32_t size, uint32_t seed)
{
	fill_pattern(a->mem, size, seed);
	memset(b->mem + kDst, 0xEE, size + 64);
	post_recv_split(b, 1000 + seed, size, 3);
	struct ibv_sge sge[4];
	split(a, 0, size, sge, 4);
	struct ibv_send_wr wr = {.wr_id = 2000 + seed, .sg_list = sge, .num_sge = 4,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	post_send_wr(a, &wr);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(a->scq, &wc, 1), 1);
	expect_wc(&wc, 2000 + seed, IBV_WC_SEND, size, a->qp->qp_num);
	CHECK_EQ(poll_n(b->rcq, &wc, 1), 1);
	expect_wc(&wc, 1000 + seed, IBV_WC_RECV, size, b->qp->qp_num);
	CHECK_EQ(wc.wc_flags, 0);
	CHECK_EQ(check_pattern(b->mem + kDst, size, seed), -1);
	CHECK_EQ(b->mem[kDst + size], 0xEE); /* nothing past the message */
}

/* A writes `size` octets from 2 SGEs into B's region; a zero-length Send
 * behind it tells B the Write was placed (RFC 5040 5.5: in order). */
static void write_case(struct side *a, struct side *b, uint32_t size, uint32_t seed)
{
	fill_pattern(a->mem, size, seed);
	memset(b->mem + kDst, 0xEE, size + 64);
	post_recv_split(b, 3000 + seed, 0, 1);
	struct ibv_sge sge[2];
	split(a, 0, size, sge, 2);
	struct ibv_send_wr marker = {.wr_id = 4001, .opcode = IBV_WR_SEND};
	struct ibv_send_wr wr = {.wr_id = 4000 + seed, .next = &marker, .sg_list = sge,
				 .num_sge = 2, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = (uintptr_t)b->mem + kDst;
	wr.wr.rdma.rkey = b->mr->rkey;
	post_send_wr(a, &wr);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(a->scq, &wc, 1), 1);
	expect_wc(&wc, 4000 + seed, IBV_WC_RDMA_WRITE, size, a->qp->qp_num);
	CHECK_EQ(poll_n(b->rcq, &wc, 1), 1);
	expect_wc(&wc, 3000 + seed, IBV_WC_RECV, 0, b->qp->qp_num);
	CHECK_EQ(check_pattern(b->mem + kDst, size, seed), -1);
	CHECK_EQ(b->mem[kDst + size], 0xEE);
}

/* A reads `size` octets of B's region into one local SGE (max_sge_rd 1). */
static void read_case(struct side *a, struct side *b, uint32_t size, uint32_t seed)
{
	fill_pattern(b->mem, size, seed);
	memset(a->mem + kDst, 0xEE, size + 64);
	struct ibv_sge sge = {.addr = (uintptr_t)a->mem + kDst, .length = size,
			      .lkey = a->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 5000 + seed, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = (uintptr_t)b->mem;
	wr.wr.rdma.rkey = b->mr->rkey;
	post_send_wr(a, &wr);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(a->scq, &wc, 1), 1);
	expect_wc(&wc, 5000 + seed, IBV_WC_RDMA_READ, size, a->qp->qp_num);
	CHECK_EQ(check_pattern(a->mem + kDst, size, seed), -1);
	CHECK_EQ(a->mem[kDst + size], 0xEE);
	CHECK(stays_empty(b->rcq, 0)); /* the responder completes nothing */
}

static const uint32_t kSizes[] = {0, 1, 4099, kMiB};

static void traffic(struct side *a, struct side *b)
{
	uint32_t seed = 1;
	for (size_t i = 0; i < sizeof(kSizes) / sizeof(kSizes[0]); i++) {
		send_case(a, b, kSizes[i], seed++);
		send_case(b, a, kSizes[i], seed++);
		write_case(a, b, kSizes[i], seed++);
		write_case(b, a, kSizes[i], seed++);
		read_case(a, b, kSizes[i], seed++);
		read_case(b, a, kSizes[i], seed++);
	}
}

/* Completion channels: an armed CQ reports through ibv_get_cq_event; a
 * solicited-only arm ignores an unsolicited Send and fires for a solicited
 * one. */
static void channels(struct side *a, struct side *b)
{
	struct ibv_send_wr wr = {.wr_id = 1, .opcode = IBV_WR_SEND};
	struct pollfd pfd = {.fd = b->channel->fd, .events = POLLIN};
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	struct ibv_wc wc;

	post_recv_split(b, 61, 0, 1);
	CHECK_EQ(ibv_req_notify_cq(b->rcq, 0), 0);
	post_send_wr(a, &wr);
	CHECK_EQ(poll(&pfd, 1, kWaitMs), 1);
	CHECK_EQ(ibv_get_cq_event(b->channel, &ev_cq, &ev_ctx), 0);
	CHECK(ev_cq == b->rcq);
	CHECK(ev_ctx == b);
	ibv_ack_cq_events(ev_cq, 1);
	CHECK_EQ(ibv_poll_cq(b->rcq, 1, &wc), 1);
	expect_wc(&wc, 61, IBV_WC_RECV, 0, b->qp->qp_num);

	post_recv_split(b, 62, 0, 1);
	post_recv_split(b, 63, 0, 1);
	CHECK_EQ(ibv_req_notify_cq(b->rcq, 1), 0);
	post_send_wr(a, &wr);
	CHECK_EQ(poll_n(b->rcq, &wc, 1), 1);
	expect_wc(&wc, 62, IBV_WC_RECV, 0, b->qp->qp_num);
	CHECK_EQ(poll(&pfd, 1, 100), 0); /* unsolicited: no event */
	wr.send_flags = IBV_SEND_SOLICITED;
	post_send_wr(a, &wr);
	CHECK_EQ(poll(&pfd, 1, kWaitMs), 1);
	CHECK_EQ(ibv_get_cq_event(b->channel, &ev_cq, &ev_ctx), 0);
	CHECK(ev_cq == b->rcq);
	ibv_ack_cq_events(ev_cq, 1);
	CHECK_EQ(ibv_poll_cq(b->rcq, 1, &wc), 1);
	expect_wc(&wc, 63, IBV_WC_RECV, 0, b->qp->qp_num);
	/* Drain A's unsignaled Sends' bookkeeping: nothing was signaled. */
	CHECK(stays_empty(a->scq, 0));
}

/* Inline data is copied at post time: changing the buffer after the post
 * does not change what arrives. */
static void inline_send(struct side *a, struct side *b)
{
	uint8_t local[200];
	fill_pattern(local, sizeof(local), 77);
	struct ibv_sge sge[2] = {{.addr = (uintptr_t)local, .length = 150, .lkey = 0},
				 {.addr = (uintptr_t)local + 150, .length = 50, .lkey = 0}};
	post_recv_split(b, 71, sizeof(local), 1);
	struct ibv_send_wr wr = {.wr_id = 72, .sg_list = sge, .num_sge = 2, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED};
	post_send_wr(a, &wr);
	memset(local, 0, sizeof(local));
	struct ibv_wc wc;
	CHECK_EQ(poll_n(b->rcq, &wc, 1), 1);
	expect_wc(&wc, 71, IBV_WC_RECV, sizeof(local), b->qp->qp_num);
	CHECK_EQ(check_pattern(b->mem + kDst, sizeof(local), 77), -1);
	CHECK_EQ(poll_n(a->scq, &wc, 1), 1);
	expect_wc(&wc, 72, IBV_WC_SEND, sizeof(local), a->qp->qp_num);

	/* An inline RDMA Write as well. */
	fill_pattern(local, 100, 78);
	struct ibv_send_wr write = {.wr_id = 73, .sg_list = sge, .num_sge = 1,
				    .opcode = IBV_WR_RDMA_WRITE,
				    .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED};
	sge[0].length = 100;
	write.wr.rdma.remote_addr = (uintptr_t)b->mem + kDst;
	write.wr.rdma.rkey = b->mr->rkey;
	struct ibv_send_wr marker = {.wr_id = 74, .opcode = IBV_WR_SEND};
	write.next = &marker;
	post_recv_split(b, 75, 0, 1);
	post_send_wr(a, &write);
	memset(local, 0, sizeof(local));
	CHECK_EQ(poll_n(b->rcq, &wc, 1), 1);
	expect_wc(&wc, 75, IBV_WC_RECV, 0, b->qp->qp_num);
	CHECK_EQ(check_pattern(b->mem + kDst, 100, 78), -1);
	CHECK_EQ(poll_n(a->scq, &wc, 1), 1);
	expect_wc(&wc, 73, IBV_WC_RDMA_WRITE, 100, a->qp->qp_num);
}

/* Local Invalidate of one of A's own STags completes as LOCAL_INV (a peer's
 * Send with Invalidate is refused: remote_invalidation_refused). */
static void local_invalidation(struct side *a)
{
	uint8_t *extra = malloc(4096);
	CHECK(extra != NULL);
	struct ibv_wc wc;
	struct ibv_mr *local = ibv_reg_mr(a->pd, extra, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(local != NULL);
	struct ibv_send_wr inv = {.wr_id = 83, .opcode = IBV_WR_LOCAL_INV,
				  .send_flags = IBV_SEND_SIGNALED};
	inv.invalidate_rkey = local->lkey;
	post_send_wr(a, &inv);
	CHECK_EQ(poll_n(a->scq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 83);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.opcode, IBV_WC_LOCAL_INV);
	CHECK_EQ(ibv_dereg_mr(local), 0);
	free(extra);
}

/* One post of 40 WRs (more than a batch) with every 8th signaled: only
 * those complete, in order; a fenced Send waits for the Read before it. */
static void lists_and_fence(struct side *a, struct side *b)
{
	enum { kList = 40 };
	struct ibv_send_wr wrs[kList];
	struct ibv_sge sge[kList];
	memset(wrs, 0, sizeof(wrs));
	for (int i = 0; i < kList; i++) {
		post_recv_split(b, 100 + (uint64_t)i, 8, 1);
		split(a, (uint64_t)i * 8, 8, &sge[i], 1);
		wrs[i].wr_id = 200 + (uint64_t)i;
		wrs[i].sg_list = &sge[i];
		wrs[i].num_sge = 1;
		wrs[i].opcode = IBV_WR_SEND;
		wrs[i].send_flags = (i % 8 == 7) ? IBV_SEND_SIGNALED : 0;
		wrs[i].next = i + 1 < kList ? &wrs[i + 1] : NULL;
	}
	fill_pattern(a->mem, kList * 8, 91);
	post_send_wr(a, wrs);
	struct ibv_wc wc[kList];
	CHECK_EQ(poll_n(b->rcq, wc, kList), kList);
	for (int i = 0; i < kList; i++)
		expect_wc(&wc[i], 100 + (uint64_t)i, IBV_WC_RECV, 8, b->qp->qp_num);
	CHECK_EQ(poll_n(a->scq, wc, kList / 8), kList / 8);
	for (int i = 0; i < kList / 8; i++)
		expect_wc(&wc[i], 200 + (uint64_t)(i * 8 + 7), IBV_WC_SEND, 8, a->qp->qp_num);
	CHECK(stays_empty(a->scq, 20));

	fill_pattern(b->mem, 64 * 1024, 92);
	struct ibv_sge rsge = {.addr = (uintptr_t)a->mem + kDst, .length = 64 * 1024,
			       .lkey = a->mr->lkey};
	struct ibv_send_wr fenced = {.wr_id = 302, .opcode = IBV_WR_SEND,
				     .send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE};
	struct ibv_send_wr read = {.wr_id = 301, .next = &fenced, .sg_list = &rsge, .num_sge = 1,
				   .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED};
	read.wr.rdma.remote_addr = (uintptr_t)b->mem;
	read.wr.rdma.rkey = b->mr->rkey;
	post_recv_split(b, 303, 0, 1);
	post_send_wr(a, &read);
	CHECK_EQ(poll_n(a->scq, wc, 2), 2);
	expect_wc(&wc[0], 301, IBV_WC_RDMA_READ, 64 * 1024, a->qp->qp_num);
	expect_wc(&wc[1], 302, IBV_WC_SEND, 0, a->qp->qp_num);
	CHECK_EQ(check_pattern(a->mem + kDst, 64 * 1024, 92), -1);
	CHECK_EQ(poll_n(b->rcq, wc, 1), 1);
	expect_wc(&wc[0], 303, IBV_WC_RECV, 0, b->qp->qp_num);
}

/* Both QPs move to ERR after an orderly disconnect; receives still posted
 * are flushed; no async event is raised for an orderly close. */
static void orderly_end(struct side *a, struct side *b)
{
	post_recv_split(b, 401, 8, 1);
	post_recv_split(a, 402, 8, 1);
	CHECK_EQ(disconnect_stream_fn()(a->qp, 0), 0);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(b->rcq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 401);
	CHECK_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
	CHECK_EQ(poll_n(a->rcq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 402);
	CHECK_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK_EQ(ibv_query_qp(a->qp, &attr, IBV_QP_STATE, &init), 0);
	CHECK_EQ(attr.qp_state, IBV_QPS_ERR);
	CHECK_EQ(ibv_query_qp(b->qp, &attr, IBV_QP_STATE, &init), 0);
	CHECK_EQ(attr.qp_state, IBV_QPS_ERR);
	CHECK(!async_pending(a->ctx, 50));
	CHECK(!async_pending(b->ctx, 0));
}

struct config {
	const char *name;
	int tcp;
	int crc;
	int markers_ab; /* markers in what A sends */
	int markers_ba; /* markers in what B sends */
	int rtr;	/* 0, or the RTR message + 1 (A sends it, B awaits it) */
};

static void run(const struct config *c, int full)
{
	struct side a, b;
	side_open(&a);
	side_open(&b);
	side_qp(&a);
	side_qp(&b);
	struct siwx_stream_params pa = default_params();
	pa.crc = (uint8_t)c->crc;
	pa.tx_markers = (uint8_t)c->markers_ab;
	pa.rx_markers = (uint8_t)c->markers_ba;
	struct siwx_stream_params pb = pa;
	pb.tx_markers = pa.rx_markers;
	pb.rx_markers = pa.tx_markers;
	if (c->rtr != 0) {
		pa.rtr_role = SIWX_RTR_ROLE_SEND;
		pa.rtr_message = (uint8_t)(c->rtr - 1);
		pb.rtr_role = SIWX_RTR_ROLE_AWAIT;
		pb.rtr_accept_mask = (uint8_t)(1u << (c->rtr - 1));
	}
	int fds[2];
	connected_fds(c->tcp, fds);
	CHECK_EQ(bind_stream_fn()(a.qp, fds[0], &pa, NULL), 0);
	CHECK_EQ(bind_stream_fn()(b.qp, fds[1], &pb, NULL), 0);

	traffic(&a, &b);
	if (full) {
		channels(&a, &b);
		inline_send(&a, &b);
		local_invalidation(&a);
		lists_and_fence(&a, &b);
	}
	orderly_end(&a, &b);
	side_close(&a);
	side_close(&b);
	printf("qp_data: %s ok\n", c->name);
}

/* A memory region is valid on every QP of its PD, so a peer cannot
 * invalidate it (RFC 5040 8.1.1 rule 7; 5.3: "issue a Terminate Message
 * with the STag Cannot be Invalidated Terminate Error Code"). B refuses A's
 * Send with Invalidate with that Terminate: B's receive completes with
 * REM_INV_REQ_ERR and an access error event, A's QP gets the fatal event,
 * and the region stays registered (deregistered at close). */
static void remote_invalidation_refused(void)
{
	struct side a, b;
	side_open(&a);
	side_open(&b);
	side_qp(&a);
	side_qp(&b);
	struct siwx_stream_params p = default_params();
	int fds[2];
	connected_fds(0, fds);
	CHECK_EQ(bind_stream_fn()(a.qp, fds[0], &p, NULL), 0);
	CHECK_EQ(bind_stream_fn()(b.qp, fds[1], &p, NULL), 0);
	post_recv_split(&b, 81, 16, 1);
	struct ibv_sge sge;
	split(&a, 0, 16, &sge, 1);
	struct ibv_send_wr wr = {.wr_id = 82, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND_WITH_INV, .send_flags = IBV_SEND_SIGNALED};
	wr.invalidate_rkey = b.mr->rkey;
	post_send_wr(&a, &wr);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(b.rcq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 81);
	CHECK_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
	struct ibv_async_event event;
	wait_async_event(b.ctx, &event);
	CHECK_EQ(event.event_type, IBV_EVENT_QP_ACCESS_ERR);
	ibv_ack_async_event(&event);
	wait_async_event(a.ctx, &event);
	CHECK_EQ(event.event_type, IBV_EVENT_QP_FATAL);
	ibv_ack_async_event(&event);
	side_close(&a);
	side_close(&b);
	printf("qp_data: Send with Invalidate of a memory region refused ok\n");
}

int main(void)
{
	static const struct config configs[] = {
		{"socketpair, CRC", 0, 1, 0, 0, 0},
		{"TCP, CRC", 1, 1, 0, 0, 0},
		{"TCP, no CRC, markers both ways", 1, 0, 1, 1, 0},
		{"TCP, CRC, markers one way", 1, 1, 1, 0, 0},
		{"TCP, RTR zero-length Write", 1, 1, 0, 0, 1 + SIWX_RTR_MESSAGE_WRITE},
		{"socketpair, RTR zero-length Read", 0, 1, 0, 0, 1 + SIWX_RTR_MESSAGE_READ},
		{"socketpair, RTR zero-length Send", 0, 0, 0, 0, 1 + SIWX_RTR_MESSAGE_SEND},
	};
	for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++)
		run(&configs[i], i < 2);
	remote_invalidation_refused();
	return 0;
}
