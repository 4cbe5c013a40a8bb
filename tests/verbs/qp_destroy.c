/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* ibv_destroy_qp with completions of the QP still queued in its CQs: after
 * it returns, ibv_poll_cq gives only the other QPs' entries, in their order
 * (libfabric's verbs provider relies on this, as mlx5 behaves). An SRQ QP's
 * receive completions are the exception: they return SRQ WRs and stay.
 *
 * Two QPs x and y on one context share their CQs; each is connected to its
 * own peer QP on a second context. The test knows what is queued without
 * polling: each peer ends its Sends with an RDMA Read of its QP's memory,
 * and a QP handles inbound messages in order, so the Read's completion at
 * the peer means the QP has completed the receives of the Sends before it.
 * Flush completions are queued by the time ibv_modify_qp to ERR returns, and
 * a send posted in ERR is flushed by ibv_post_send itself. */
#define _GNU_SOURCE
#include "qp_util.h"

enum { kSize = 64, kRegion = 16 * kSize, kDepth = 64 };

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint8_t *mem;
	struct ibv_mr *mr;
};

static void end_open(struct end *e)
{
	e->ctx = open_siwx("lo");
	e->pd = ibv_alloc_pd(e->ctx);
	CHECK(e->pd != NULL);
	e->mem = calloc(1, kRegion);
	CHECK(e->mem != NULL);
	e->mr = ibv_reg_mr(e->pd, e->mem, kRegion,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(e->mr != NULL);
}

static void end_close(struct end *e)
{
	CHECK_EQ(ibv_dereg_mr(e->mr), 0);
	free(e->mem);
	CHECK_EQ(ibv_dealloc_pd(e->pd), 0);
	CHECK_EQ(ibv_close_device(e->ctx), 0);
}

static struct ibv_sge sge_at(struct end *e, int slot)
{
	struct ibv_sge sge = {.addr = (uintptr_t)e->mem + (size_t)slot * kSize,
			      .length = kSize,
			      .lkey = e->mr->lkey};
	return sge;
}

static void post_recv(struct ibv_qp *qp, struct end *e, uint64_t wr_id, int slot)
{
	struct ibv_sge sge = sge_at(e, slot);
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *bad = NULL;
	CHECK_EQ(ibv_post_recv(qp, &wr, &bad), 0);
}

static void post_srq_recv(struct ibv_srq *srq, struct end *e, uint64_t wr_id, int slot)
{
	struct ibv_sge sge = sge_at(e, slot);
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *bad = NULL;
	CHECK_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
}

static void post_send(struct ibv_qp *qp, struct end *e, uint64_t wr_id, int signaled)
{
	struct ibv_sge sge = sge_at(e, 0);
	struct ibv_send_wr wr = {.wr_id = wr_id,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = signaled ? IBV_SEND_SIGNALED : 0};
	struct ibv_send_wr *bad = NULL;
	CHECK_EQ(ibv_post_send(qp, &wr, &bad), 0);
}

/* The peer sends `sends` messages to its QP, then reads one slot of the QP's
 * memory and waits for that Read: the QP has then queued the receive
 * completions of those Sends. */
static void peer_sends_then_reads(struct ibv_qp *peer, struct ibv_cq *peer_cq, struct end *pe,
				  struct end *qe, int sends)
{
	for (int i = 0; i < sends; i++)
		post_send(peer, pe, 800 + (uint64_t)i, 0);
	struct ibv_sge sge = sge_at(pe, 1);
	struct ibv_send_wr wr = {.wr_id = 899,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = (uintptr_t)qe->mem;
	wr.wr.rdma.rkey = qe->mr->rkey;
	struct ibv_send_wr *bad = NULL;
	CHECK_EQ(ibv_post_send(peer, &wr, &bad), 0);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(peer_cq, &wc, 1), 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ_U64(wc.wr_id, 899);
}

static struct ibv_qp *ready_qp(struct end *e, struct ibv_cq *scq, struct ibv_cq *rcq,
			       struct ibv_srq *srq)
{
	struct ibv_qp *qp = create_rc_qp(e->pd, scq, rcq, srq, kDepth / 4, 1, 0);
	CHECK_EQ(modify_state(qp, IBV_QPS_INIT), 0);
	return qp;
}

struct expected {
	uint64_t wr_id;
	uint32_t qp_num;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
};

/* Polls `cq` and checks it gives exactly `want`, in order, then nothing. */
static void expect_entries(struct ibv_cq *cq, const struct expected *want, int n)
{
	struct ibv_wc wc[8];
	CHECK(n <= 8);
	CHECK_EQ(ibv_poll_cq(cq, 8, wc), n);
	for (int i = 0; i < n; i++) {
		CHECK_EQ_U64(wc[i].wr_id, want[i].wr_id);
		CHECK_EQ(wc[i].qp_num, want[i].qp_num);
		CHECK_EQ(wc[i].status, want[i].status);
		if (want[i].status == IBV_WC_SUCCESS)
			CHECK_EQ(wc[i].opcode, want[i].opcode);
	}
	CHECK(stays_empty(cq, 50));
}

/* x and y with their own receive queues, a send CQ and a receive CQ. */
static void destroy_drops_all_entries(void)
{
	struct end a, b;
	end_open(&a);
	end_open(&b);
	struct ibv_cq *scq = ibv_create_cq(a.ctx, kDepth, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(a.ctx, kDepth, NULL, NULL, 0);
	struct ibv_cq *peer_cq = ibv_create_cq(b.ctx, kDepth, NULL, NULL, 0);
	CHECK(scq != NULL && rcq != NULL && peer_cq != NULL);
	struct ibv_qp *x = ready_qp(&a, scq, rcq, NULL);
	struct ibv_qp *y = ready_qp(&a, scq, rcq, NULL);
	struct ibv_qp *px = ready_qp(&b, peer_cq, peer_cq, NULL);
	struct ibv_qp *py = ready_qp(&b, peer_cq, peer_cq, NULL);
	struct siwx_stream_params params = default_params();
	bind_pair(x, px, 0, &params);
	bind_pair(y, py, 0, &params);

	for (int i = 0; i < 3; i++) {
		post_recv(x, &a, 100 + (uint64_t)i, 2 + i);
		post_recv(y, &a, 200 + (uint64_t)i, 5 + i);
	}
	peer_sends_then_reads(px, peer_cq, &b, &a, 2); /* 100, 101 */
	peer_sends_then_reads(py, peer_cq, &b, &a, 2); /* 200, 201 */
	CHECK_EQ(modify_state(x, IBV_QPS_ERR), 0);   /* flushes 102 */
	post_send(x, &a, 110, 1);                     /* flushed at once */
	CHECK_EQ(modify_state(y, IBV_QPS_ERR), 0);   /* flushes 202 */
	post_send(y, &a, 210, 1);
	post_send(x, &a, 111, 1);

	const uint32_t y_num = y->qp_num;
	CHECK_EQ(ibv_destroy_qp(x), 0);
	const struct expected sends[] = {{210, y_num, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND}};
	expect_entries(scq, sends, 1);
	const struct expected recvs[] = {{200, y_num, IBV_WC_SUCCESS, IBV_WC_RECV},
					 {201, y_num, IBV_WC_SUCCESS, IBV_WC_RECV},
					 {202, y_num, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV}};
	expect_entries(rcq, recvs, 3);

	CHECK_EQ(ibv_destroy_qp(y), 0);
	CHECK_EQ(ibv_destroy_qp(px), 0);
	CHECK_EQ(ibv_destroy_qp(py), 0);
	CHECK_EQ(ibv_destroy_cq(scq), 0);
	CHECK_EQ(ibv_destroy_cq(rcq), 0);
	CHECK_EQ(ibv_destroy_cq(peer_cq), 0);
	end_close(&a);
	end_close(&b);
	printf("qp_destroy: a destroyed QP's completions are gone, the other's stay\n");
}

/* x and y on one SRQ and one CQ for both directions. */
static void destroy_keeps_srq_receives(void)
{
	struct end a, b;
	end_open(&a);
	end_open(&b);
	struct ibv_cq *cq = ibv_create_cq(a.ctx, kDepth, NULL, NULL, 0);
	struct ibv_cq *peer_cq = ibv_create_cq(b.ctx, kDepth, NULL, NULL, 0);
	CHECK(cq != NULL && peer_cq != NULL);
	struct ibv_srq_init_attr srq_attr = {.attr = {.max_wr = 8, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(a.pd, &srq_attr);
	CHECK(srq != NULL);
	struct ibv_qp *x = ready_qp(&a, cq, cq, srq);
	struct ibv_qp *y = ready_qp(&a, cq, cq, srq);
	struct ibv_qp *px = ready_qp(&b, peer_cq, peer_cq, NULL);
	struct ibv_qp *py = ready_qp(&b, peer_cq, peer_cq, NULL);
	struct siwx_stream_params params = default_params();
	bind_pair(x, px, 0, &params);
	bind_pair(y, py, 0, &params);

	for (int i = 0; i < 4; i++)
		post_srq_recv(srq, &a, 300 + (uint64_t)i, 2 + i);
	/* One after the other, so x takes 300 and 301 and y takes 302. */
	peer_sends_then_reads(px, peer_cq, &b, &a, 2);
	peer_sends_then_reads(py, peer_cq, &b, &a, 1);
	CHECK_EQ(modify_state(x, IBV_QPS_ERR), 0); /* SRQ WRs are not flushed */
	post_send(x, &a, 110, 1);

	const uint32_t x_num = x->qp_num;
	const uint32_t y_num = y->qp_num;
	CHECK_EQ(ibv_destroy_qp(x), 0);
	const struct expected left[] = {{300, x_num, IBV_WC_SUCCESS, IBV_WC_RECV},
					{301, x_num, IBV_WC_SUCCESS, IBV_WC_RECV},
					{302, y_num, IBV_WC_SUCCESS, IBV_WC_RECV}};
	expect_entries(cq, left, 3);

	CHECK_EQ(ibv_destroy_qp(y), 0);
	CHECK_EQ(ibv_destroy_qp(px), 0);
	CHECK_EQ(ibv_destroy_qp(py), 0);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_destroy_cq(peer_cq), 0);
	end_close(&a);
	end_close(&b);
	printf("qp_destroy: an SRQ QP's receive completions stay, its send completions go\n");
}

int main(void)
{
	destroy_drops_all_entries();
	destroy_keeps_srq_receives();
	return 0;
}
