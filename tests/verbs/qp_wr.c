/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* The extended send API of ibv_wr_post(3) through the stock libibverbs API
 * under siwx-run: QPs made by ibv_create_qp_ex with send_ops_flags, work
 * posted with ibv_wr_start / builders / setters / ibv_wr_complete between
 * two QPs on their own contexts, connected over loopback TCP with the
 * provider's siwx_qp_bind_stream() (as qp_data.c does).
 *
 * Checked: creation (the served operations; EOPNOTSUPP for each one siwx
 * does not serve; no ibv_qp_ex without send_ops_flags), every served
 * operation with its data and completion (Send with an SGE list, RDMA Write,
 * RDMA Read, Local Invalidate, Send with Invalidate), inline data (copied in
 * the setter, so the buffer may change before ibv_wr_complete), a batch of
 * several operations in one region completing in order, ibv_wr_abort, two
 * threads sharing one QP's region, and the errors ibv_wr_complete returns
 * (with nothing of the failed batch posted): EINVAL for an operation not in
 * send_ops_flags, too many SGEs, inline data too long or on a Read, a setter
 * without a builder, an unserved builder, bad wr_flags, completing outside a
 * region and a QP not yet connected; ENOMEM for a batch larger than the send
 * queue. */
#define _GNU_SOURCE
#include "qp_util.h"

#include <pthread.h>
#include <unistd.h>

enum {
	kMiB = 1 << 20,
	kRegion = 4 * kMiB, /* per side: src at 0, dst at 2 MiB */
	kDst = 2 * kMiB,
	kQueue = 64,
	kSge = 4,
	kThreadBatches = 24,
};

static const uint64_t kAllServed = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV |
				   IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
				   IBV_QP_EX_WITH_LOCAL_INV;

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *scq;
	struct ibv_cq *rcq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	uint32_t max_inline;
	uint8_t *mem;
	struct ibv_mr *mr;
};

static struct ibv_qp *create_ex(struct side *s, uint64_t ops, uint32_t *max_inline)
{
	struct ibv_qp_init_attr_ex attr = {
		.send_cq = s->scq,
		.recv_cq = s->rcq,
		.cap = {.max_send_wr = kQueue,
			.max_recv_wr = kQueue,
			.max_send_sge = kSge,
			.max_recv_sge = kSge,
			.max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = s->pd,
		.send_ops_flags = ops,
	};
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp_ex(s->ctx, &attr);
	if (qp != NULL && max_inline != NULL)
		*max_inline = attr.cap.max_inline_data;
	return qp;
}

static void side_open(struct side *s, uint64_t ops)
{
	memset(s, 0, sizeof(*s));
	s->ctx = open_siwx("lo");
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd != NULL);
	s->scq = ibv_create_cq(s->ctx, 4 * kQueue, NULL, NULL, 0);
	s->rcq = ibv_create_cq(s->ctx, 4 * kQueue, NULL, NULL, 0);
	CHECK(s->scq != NULL && s->rcq != NULL);
	s->mem = malloc(kRegion);
	CHECK(s->mem != NULL);
	s->mr = ibv_reg_mr(s->pd, s->mem, kRegion,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ);
	CHECK(s->mr != NULL);
	s->qp = create_ex(s, ops, &s->max_inline);
	CHECK(s->qp != NULL);
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	CHECK(s->qpx != NULL);
	CHECK_EQ(modify_state(s->qp, IBV_QPS_INIT), 0);
}

static void side_close(struct side *s)
{
	CHECK_EQ(ibv_destroy_qp(s->qp), 0);
	CHECK_EQ(ibv_dereg_mr(s->mr), 0);
	free(s->mem);
	CHECK_EQ(ibv_destroy_cq(s->scq), 0);
	CHECK_EQ(ibv_destroy_cq(s->rcq), 0);
	CHECK_EQ(ibv_dealloc_pd(s->pd), 0);
	CHECK_EQ(ibv_close_device(s->ctx), 0);
}

static void post_recv(struct side *s, uint64_t wr_id, uint64_t offset, uint32_t size)
{
	struct ibv_sge sge = {.addr = (uintptr_t)s->mem + offset, .length = size,
			      .lkey = s->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *bad = NULL;
	CHECK_EQ(ibv_post_recv(s->qp, &wr, &bad), 0);
}

static void expect_wc(const struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_opcode opcode,
		      uint32_t byte_len)
{
	CHECK_EQ_U64(wc->wr_id, wr_id);
	CHECK_EQ(wc->status, IBV_WC_SUCCESS);
	CHECK_EQ(wc->opcode, opcode);
	if (opcode != IBV_WC_LOCAL_INV)
		CHECK_EQ(wc->byte_len, byte_len);
}

static void expect_one(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_opcode opcode,
		       uint32_t byte_len)
{
	struct ibv_wc wc;
	CHECK_EQ(poll_n(cq, &wc, 1), 1);
	expect_wc(&wc, wr_id, opcode, byte_len);
}

/* Creation: only the served operations; EOPNOTSUPP (as mlx5 and rxe answer)
 * for each other one, alone or with served ones. */
static void creation(void)
{
	struct side s;
	memset(&s, 0, sizeof(s));
	s.ctx = open_siwx("lo");
	s.pd = ibv_alloc_pd(s.ctx);
	s.scq = ibv_create_cq(s.ctx, kQueue, NULL, NULL, 0);
	s.rcq = s.scq;
	CHECK(s.pd != NULL && s.scq != NULL);
	static const uint64_t unserved[] = {
		IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_IMM,
		IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
		IBV_QP_EX_WITH_BIND_MW, IBV_QP_EX_WITH_TSO,
		1ULL << 12, /* IBV_QP_EX_WITH_ATOMIC_WRITE (rdma-core 44) */
		1ULL << 13, /* IBV_QP_EX_WITH_FLUSH (rdma-core 45) */
		1ULL << 40, /* no operation at all */
	};
	for (size_t i = 0; i < sizeof(unserved) / sizeof(unserved[0]); i++) {
		CHECK_NULL_ERRNO(create_ex(&s, unserved[i], NULL), EOPNOTSUPP);
		CHECK_NULL_ERRNO(create_ex(&s, kAllServed | unserved[i], NULL), EOPNOTSUPP);
	}
	/* Each served operation alone, all of them, and none. */
	uint64_t ok[] = {IBV_QP_EX_WITH_SEND, IBV_QP_EX_WITH_SEND_WITH_INV,
			 IBV_QP_EX_WITH_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_READ,
			 IBV_QP_EX_WITH_LOCAL_INV, kAllServed, 0};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint32_t max_inline = 0;
		struct ibv_qp *qp = create_ex(&s, ok[i], &max_inline);
		CHECK(qp != NULL);
		CHECK(max_inline >= 64);
		struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
		CHECK(qpx != NULL);
		CHECK(&qpx->qp_base == qp);
		CHECK(qpx->wr_start != NULL && qpx->wr_complete != NULL && qpx->wr_abort != NULL);
		CHECK_EQ(ibv_destroy_qp(qp), 0);
	}
	/* A QP made without send_ops_flags has no ibv_qp_ex. */
	struct ibv_qp *plain = create_rc_qp(s.pd, s.scq, s.scq, NULL, 4, 1, 0);
	CHECK(ibv_qp_to_qp_ex(plain) == NULL);
	CHECK_EQ(ibv_destroy_qp(plain), 0);
	CHECK_EQ(ibv_destroy_cq(s.scq), 0);
	CHECK_EQ(ibv_dealloc_pd(s.pd), 0);
	CHECK_EQ(ibv_close_device(s.ctx), 0);
	printf("qp_wr: creation and EOPNOTSUPP for unserved operations ok\n");
}

/* `size` octets at `offset` of s as `n` SGEs of uneven lengths. */
static void split(struct side *s, uint64_t offset, uint32_t size, struct ibv_sge *sge, int n)
{
	uint64_t at = offset;
	for (int i = 0; i < n; i++) {
		uint32_t len = size / (uint32_t)n + ((uint32_t)i < size % (uint32_t)n ? 1 : 0);
		sge[i].addr = (uintptr_t)s->mem + at;
		sge[i].length = len;
		sge[i].lkey = s->mr->lkey;
		at += len;
	}
}

/* One operation per region, each with its data checked. */
static void each_operation(struct side *a, struct side *b)
{
	struct ibv_sge sge[kSge];
	struct ibv_qp_ex *qx = a->qpx;

	/* Send of 4099 octets from an SGE list of 4. */
	fill_pattern(a->mem, 4099, 1);
	memset(b->mem + kDst, 0xEE, 4099 + 64);
	post_recv(b, 11, kDst, 8192);
	split(a, 0, 4099, sge, kSge);
	ibv_wr_start(qx);
	qx->wr_id = 12;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge_list(qx, kSge, sge);
	CHECK_EQ(ibv_wr_complete(qx), 0);
	expect_one(a->scq, 12, IBV_WC_SEND, 4099);
	expect_one(b->rcq, 11, IBV_WC_RECV, 4099);
	CHECK_EQ(check_pattern(b->mem + kDst, 4099, 1), -1);
	CHECK_EQ(b->mem[kDst + 4099], 0xEE);

	/* RDMA Write of 1 MiB, then a zero-length Send that says it is placed
	 * (RFC 5040 5.5: messages are processed in order). */
	fill_pattern(a->mem, kMiB, 2);
	memset(b->mem + kDst, 0xEE, kMiB + 64);
	post_recv(b, 21, kDst, 0);
	ibv_wr_start(qx);
	qx->wr_id = 22;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, b->mr->rkey, (uintptr_t)b->mem + kDst);
	ibv_wr_set_sge(qx, a->mr->lkey, (uintptr_t)a->mem, kMiB);
	qx->wr_id = 23;
	qx->wr_flags = 0;
	ibv_wr_send(qx);
	CHECK_EQ(ibv_wr_complete(qx), 0);
	expect_one(a->scq, 22, IBV_WC_RDMA_WRITE, kMiB);
	expect_one(b->rcq, 21, IBV_WC_RECV, 0);
	CHECK_EQ(check_pattern(b->mem + kDst, kMiB, 2), -1);
	CHECK_EQ(b->mem[kDst + kMiB], 0xEE);

	/* RDMA Read of 1 MiB of B's region. */
	fill_pattern(b->mem, kMiB, 3);
	memset(a->mem + kDst, 0xEE, kMiB + 64);
	ibv_wr_start(qx);
	qx->wr_id = 31;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(qx, b->mr->rkey, (uintptr_t)b->mem);
	ibv_wr_set_sge(qx, a->mr->lkey, (uintptr_t)a->mem + kDst, kMiB);
	CHECK_EQ(ibv_wr_complete(qx), 0);
	expect_one(a->scq, 31, IBV_WC_RDMA_READ, kMiB);
	CHECK_EQ(check_pattern(a->mem + kDst, kMiB, 3), -1);
	CHECK_EQ(a->mem[kDst + kMiB], 0xEE);
	CHECK(stays_empty(b->rcq, 0));

	/* Local Invalidate of one of A's own regions. */
	uint8_t *extra = malloc(4096);
	CHECK(extra != NULL);
	struct ibv_mr *local = ibv_reg_mr(a->pd, extra, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(local != NULL);
	ibv_wr_start(qx);
	qx->wr_id = 41;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(qx, local->lkey);
	CHECK_EQ(ibv_wr_complete(qx), 0);
	expect_one(a->scq, 41, IBV_WC_LOCAL_INV, 0);
	CHECK_EQ(ibv_dereg_mr(local), 0);
	free(extra);
	printf("qp_wr: send (SGE list), RDMA write, RDMA read, local invalidate ok\n");
}

/* Inline: the data is copied by the setter (ibv_wr_post(3)), so the source
 * may change before ibv_wr_complete. A Send from one buffer and an RDMA
 * Write from a list of three. */
static void inline_data(struct side *a, struct side *b)
{
	struct ibv_qp_ex *qx = a->qpx;
	uint8_t src[200];
	fill_pattern(src, sizeof(src), 5);
	memset(b->mem + kDst, 0xEE, 512);
	post_recv(b, 51, kDst, 512);
	ibv_wr_start(qx);
	qx->wr_id = 52;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, src, sizeof(src));
	memset(src, 0, sizeof(src));
	CHECK_EQ(ibv_wr_complete(qx), 0);
	expect_one(a->scq, 52, IBV_WC_SEND, sizeof(src));
	expect_one(b->rcq, 51, IBV_WC_RECV, sizeof(src));
	CHECK_EQ(check_pattern(b->mem + kDst, sizeof(src), 5), -1);
	CHECK_EQ(b->mem[kDst + sizeof(src)], 0xEE);

	uint8_t whole[100];
	fill_pattern(whole, sizeof(whole), 6);
	struct ibv_data_buf bufs[3] = {
		{whole, 10}, {whole + 10, 0}, {whole + 10, 90}};
	memset(b->mem + kDst, 0xEE, 512);
	post_recv(b, 61, kDst + 1024, 0);
	ibv_wr_start(qx);
	qx->wr_id = 62;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, b->mr->rkey, (uintptr_t)b->mem + kDst);
	ibv_wr_set_inline_data_list(qx, 3, bufs);
	memset(whole, 0, sizeof(whole));
	qx->wr_id = 63;
	qx->wr_flags = 0;
	ibv_wr_send(qx);
	CHECK_EQ(ibv_wr_complete(qx), 0);
	expect_one(a->scq, 62, IBV_WC_RDMA_WRITE, 100);
	expect_one(b->rcq, 61, IBV_WC_RECV, 0);
	CHECK_EQ(check_pattern(b->mem + kDst, 100, 6), -1);
	CHECK_EQ(b->mem[kDst + 100], 0xEE);
	printf("qp_wr: inline send and inline write from a list ok\n");
}

/* One region with 12 WRs of every kind; all complete, in order. */
static void batch(struct side *a, struct side *b)
{
	enum { kSends = 4, kChunk = 4096 };
	struct ibv_qp_ex *qx = a->qpx;
	fill_pattern(a->mem, 8 * kChunk, 7);
	fill_pattern(b->mem, kChunk, 8);
	memset(b->mem + kDst, 0xEE, 8 * kChunk);
	memset(a->mem + kDst, 0xEE, kChunk + 64);
	for (int i = 0; i < kSends; i++)
		post_recv(b, 700 + (uint64_t)i, kDst + (uint64_t)i * kChunk, kChunk);
	uint8_t *extra = malloc(4096);
	CHECK(extra != NULL);
	struct ibv_mr *local = ibv_reg_mr(a->pd, extra, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(local != NULL);

	ibv_wr_start(qx);
	qx->wr_flags = IBV_SEND_SIGNALED;
	for (int i = 0; i < kSends; i++) { /* Sends into B's buffers 0..3 */
		qx->wr_id = 800 + (uint64_t)i;
		ibv_wr_send(qx);
		ibv_wr_set_sge(qx, a->mr->lkey, (uintptr_t)a->mem + (uint64_t)i * kChunk, kChunk);
	}
	for (int i = kSends; i < 8; i++) { /* Writes into B's chunks 4..7 */
		qx->wr_id = 800 + (uint64_t)i;
		ibv_wr_rdma_write(qx, b->mr->rkey, (uintptr_t)b->mem + kDst + (uint64_t)i * kChunk);
		ibv_wr_set_sge(qx, a->mr->lkey, (uintptr_t)a->mem + (uint64_t)i * kChunk, kChunk);
	}
	qx->wr_id = 808;
	ibv_wr_rdma_read(qx, b->mr->rkey, (uintptr_t)b->mem);
	ibv_wr_set_sge(qx, a->mr->lkey, (uintptr_t)a->mem + kDst, kChunk);
	qx->wr_id = 809;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE; /* after the Read */
	ibv_wr_local_inv(qx, local->lkey);
	qx->wr_id = 810;
	qx->wr_flags = 0; /* unsignaled: no completion */
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, "x", 1);
	qx->wr_id = 811;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
	ibv_wr_send(qx);
	post_recv(b, 710, kDst + 9 * kChunk, 16);
	post_recv(b, 711, kDst + 10 * kChunk, 16);
	CHECK_EQ(ibv_wr_complete(qx), 0);

	struct ibv_wc wc[12];
	CHECK_EQ(poll_n(a->scq, wc, 11), 11);
	for (int i = 0; i < kSends; i++)
		expect_wc(&wc[i], 800 + (uint64_t)i, IBV_WC_SEND, kChunk);
	for (int i = kSends; i < 8; i++)
		expect_wc(&wc[i], 800 + (uint64_t)i, IBV_WC_RDMA_WRITE, kChunk);
	expect_wc(&wc[8], 808, IBV_WC_RDMA_READ, kChunk);
	expect_wc(&wc[9], 809, IBV_WC_LOCAL_INV, 0);
	expect_wc(&wc[10], 811, IBV_WC_SEND, 0);
	CHECK(stays_empty(a->scq, 0));
	CHECK_EQ(poll_n(b->rcq, wc, 6), 6);
	for (int i = 0; i < kSends; i++)
		expect_wc(&wc[i], 700 + (uint64_t)i, IBV_WC_RECV, kChunk);
	expect_wc(&wc[4], 710, IBV_WC_RECV, 1);
	expect_wc(&wc[5], 711, IBV_WC_RECV, 0);
	CHECK_EQ(check_pattern(b->mem + kDst, 8 * kChunk, 7), -1);
	CHECK_EQ(check_pattern(a->mem + kDst, kChunk, 8), -1);
	CHECK_EQ(b->mem[kDst + 9 * kChunk], 'x');
	CHECK_EQ(ibv_dereg_mr(local), 0);
	free(extra);
	printf("qp_wr: batch of 12 WRs in one region ok\n");
}

/* Nothing of an aborted or failed batch reaches the wire or a CQ: the next
 * good Send is the first thing B receives and A completes. */
static void expect_nothing_posted(struct side *a, struct side *b, uint64_t marker)
{
	post_recv(b, marker, kDst, 64);
	ibv_wr_start(a->qpx);
	a->qpx->wr_id = marker + 1;
	a->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(a->qpx);
	ibv_wr_set_inline_data(a->qpx, "ok", 2);
	CHECK_EQ(ibv_wr_complete(a->qpx), 0);
	expect_one(a->scq, marker + 1, IBV_WC_SEND, 2);
	expect_one(b->rcq, marker, IBV_WC_RECV, 2);
	CHECK(stays_empty(a->scq, 0));
	CHECK(stays_empty(b->rcq, 0));
}

/* A batch that starts with a good Send, then `bad` makes it fail. */
typedef void (*spoil_fn)(struct side *a, struct side *b);

static void good_send(struct side *a)
{
	a->qpx->wr_id = 901;
	a->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(a->qpx);
	ibv_wr_set_sge(a->qpx, a->mr->lkey, (uintptr_t)a->mem, 16);
}

static void spoil_op_not_requested(struct side *a, struct side *b)
{
	(void)a;
	/* B's QP was created with Send and RDMA Write only. */
	ibv_wr_rdma_read(b->qpx, a->mr->rkey, (uintptr_t)a->mem);
	ibv_wr_set_sge(b->qpx, b->mr->lkey, (uintptr_t)b->mem, 16);
}

static void spoil_too_many_sges(struct side *a, struct side *b)
{
	(void)b;
	struct ibv_sge sge[kSge + 1];
	split(a, 0, 100, sge, kSge + 1);
	ibv_wr_send(a->qpx);
	ibv_wr_set_sge_list(a->qpx, kSge + 1, sge);
}

static void spoil_inline_too_long(struct side *a, struct side *b)
{
	(void)b;
	ibv_wr_send(a->qpx);
	ibv_wr_set_inline_data(a->qpx, a->mem, a->max_inline + 1);
}

static void spoil_inline_read(struct side *a, struct side *b)
{
	ibv_wr_rdma_read(a->qpx, b->mr->rkey, (uintptr_t)b->mem);
	ibv_wr_set_inline_data(a->qpx, a->mem, 8);
}

static void spoil_setter_after_local_inv(struct side *a, struct side *b)
{
	(void)b;
	ibv_wr_local_inv(a->qpx, a->mr->lkey);
	ibv_wr_set_sge(a->qpx, a->mr->lkey, (uintptr_t)a->mem, 8);
}

static void spoil_unserved_builder(struct side *a, struct side *b)
{
	(void)b;
	ibv_wr_send_imm(a->qpx, 0x12345678);
	ibv_wr_set_sge(a->qpx, a->mr->lkey, (uintptr_t)a->mem, 8);
}

static void spoil_atomic(struct side *a, struct side *b)
{
	ibv_wr_atomic_fetch_add(a->qpx, b->mr->rkey, (uintptr_t)b->mem, 1);
	ibv_wr_set_sge(a->qpx, a->mr->lkey, (uintptr_t)a->mem, 8);
}

static void spoil_wr_flags(struct side *a, struct side *b)
{
	(void)b;
	a->qpx->wr_flags = IBV_SEND_IP_CSUM;
	ibv_wr_send(a->qpx);
	a->qpx->wr_flags = 0;
}

static void spoil_nested_start(struct side *a, struct side *b)
{
	(void)b;
	ibv_wr_start(a->qpx);
}

static void spoil_too_many_wrs(struct side *a, struct side *b)
{
	(void)b;
	for (int i = 0; i < kQueue; i++) { /* with good_send: kQueue + 1 */
		ibv_wr_send(a->qpx);
		ibv_wr_set_inline_data(a->qpx, "z", 1);
	}
}

static void errors(struct side *a, struct side *b)
{
	static const struct {
		const char *what;
		spoil_fn spoil;
		int on_b; /* the region is B's */
		int err;
	} cases[] = {
		{"operation not in send_ops_flags", spoil_op_not_requested, 1, EINVAL},
		{"too many SGEs", spoil_too_many_sges, 0, EINVAL},
		{"inline data too long", spoil_inline_too_long, 0, EINVAL},
		{"inline data on a Read", spoil_inline_read, 0, EINVAL},
		{"setter after Local Invalidate", spoil_setter_after_local_inv, 0, EINVAL},
		{"unserved builder (send with immediate)", spoil_unserved_builder, 0, EINVAL},
		{"unserved builder (atomic)", spoil_atomic, 0, EINVAL},
		{"wr_flags IBV_SEND_IP_CSUM", spoil_wr_flags, 0, EINVAL},
		{"ibv_wr_start inside a region", spoil_nested_start, 0, EINVAL},
		{"more WRs than the send queue holds", spoil_too_many_wrs, 0, ENOMEM},
	};
	uint64_t marker = 2000;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct side *owner = cases[i].on_b ? b : a;
		struct side *peer = cases[i].on_b ? a : b;
		ibv_wr_start(owner->qpx);
		good_send(owner);
		cases[i].spoil(a, b);
		int rc = ibv_wr_complete(owner->qpx);
		if (rc != cases[i].err) {
			fprintf(stderr, "qp_wr: %s: ibv_wr_complete returned %d, want %d\n",
				cases[i].what, rc, cases[i].err);
			exit(1);
		}
		expect_nothing_posted(owner, peer, marker);
		marker += 10;
		printf("qp_wr: %s: %s, nothing posted\n", cases[i].what, strerror(rc));
	}

	/* A setter before any builder. */
	ibv_wr_start(a->qpx);
	ibv_wr_set_sge(a->qpx, a->mr->lkey, (uintptr_t)a->mem, 8);
	CHECK_EQ(ibv_wr_complete(a->qpx), EINVAL);
	/* ibv_wr_complete outside a region. */
	CHECK_EQ(ibv_wr_complete(a->qpx), EINVAL);
	/* Abort: three Sends dropped; the region is free again afterwards. */
	ibv_wr_start(a->qpx);
	for (int i = 0; i < 3; i++)
		good_send(a);
	ibv_wr_abort(a->qpx);
	expect_nothing_posted(a, b, marker);
	printf("qp_wr: setter without builder, complete outside a region, abort ok\n");
}

/* A QP that is not connected yet takes no posts (ibv_post_send says EINVAL
 * too); an empty region is fine. */
static void not_connected(void)
{
	struct side s;
	side_open(&s, kAllServed);
	ibv_wr_start(s.qpx);
	CHECK_EQ(ibv_wr_complete(s.qpx), 0);
	ibv_wr_start(s.qpx);
	good_send(&s);
	CHECK_EQ(ibv_wr_complete(s.qpx), EINVAL);
	CHECK(stays_empty(s.scq, 0));
	/* Destroyed by the thread inside its region: the region goes with it. */
	ibv_wr_start(s.qpx);
	good_send(&s);
	side_close(&s);
	printf("qp_wr: QP before RTS: EINVAL ok; destroyed inside a region ok\n");
}

/* Two threads post through the same QP's region; every Send arrives once,
 * each thread's in its order. */
struct poster {
	struct side *a;
	uint8_t id;
};

static void *post_thread(void *arg)
{
	struct poster *p = arg;
	for (uint8_t seq = 0; seq < kThreadBatches; seq++) {
		uint8_t msg[2] = {p->id, seq};
		ibv_wr_start(p->a->qpx);
		p->a->qpx->wr_id = (uint64_t)p->id << 8 | seq;
		p->a->qpx->wr_flags = 0;
		ibv_wr_send(p->a->qpx);
		ibv_wr_set_inline_data(p->a->qpx, msg, sizeof(msg));
		CHECK_EQ(ibv_wr_complete(p->a->qpx), 0);
	}
	return NULL;
}

static void threads(struct side *a, struct side *b)
{
	for (int i = 0; i < 2 * kThreadBatches; i++)
		post_recv(b, 3000 + (uint64_t)i, kDst + (uint64_t)i * 16, 16);
	struct poster p[2] = {{a, 1}, {a, 2}};
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		CHECK_EQ(pthread_create(&t[i], NULL, post_thread, &p[i]), 0);
	for (int i = 0; i < 2; i++)
		CHECK_EQ(pthread_join(t[i], NULL), 0);
	struct ibv_wc wc[2 * kThreadBatches];
	CHECK_EQ(poll_n(b->rcq, wc, 2 * kThreadBatches), 2 * kThreadBatches);
	int next[3] = {0, 0, 0};
	for (int i = 0; i < 2 * kThreadBatches; i++) {
		expect_wc(&wc[i], 3000 + (uint64_t)i, IBV_WC_RECV, 2);
		const uint8_t *msg = b->mem + kDst + (uint64_t)i * 16;
		CHECK(msg[0] == 1 || msg[0] == 2);
		CHECK_EQ(msg[1], next[msg[0]]);
		next[msg[0]]++;
	}
	CHECK_EQ(next[1], kThreadBatches);
	CHECK_EQ(next[2], kThreadBatches);
	printf("qp_wr: two threads, %d regions each ok\n", kThreadBatches);
}

int main(void)
{
	creation();
	not_connected();

	struct side a, b;
	side_open(&a, kAllServed);
	side_open(&b, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE);
	struct siwx_stream_params params = default_params();
	bind_pair(a.qp, b.qp, 1, &params);
	each_operation(&a, &b);
	inline_data(&a, &b);
	batch(&a, &b);
	errors(&a, &b);
	threads(&a, &b);
	/* ibv_post_send still works on a QP with the extended API. */
	post_recv(&b, 4001, kDst, 16);
	struct ibv_send_wr wr = {.wr_id = 4002, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad = NULL;
	CHECK_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
	expect_one(a.scq, 4002, IBV_WC_SEND, 0);
	expect_one(b.rcq, 4001, IBV_WC_RECV, 0);
	side_close(&a);
	side_close(&b);

	/* Send with Invalidate: B's region is refused for remote invalidation
	 * (RFC 5040 8.1.1 rule 7, as qp_data.c checks with ibv_post_send), so
	 * the Send arrives as a REM_INV_REQ_ERR receive: the builder put the
	 * opcode and the STag on the wire. */
	side_open(&a, kAllServed);
	side_open(&b, kAllServed);
	bind_pair(a.qp, b.qp, 1, &params);
	post_recv(&b, 5001, kDst, 64);
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 5002;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(a.qpx, b.mr->rkey);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.mem, 16);
	CHECK_EQ(ibv_wr_complete(a.qpx), 0);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(b.rcq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 5001);
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
	printf("qp_wr: send with invalidate reaches the peer ok\n");
	return 0;
}
