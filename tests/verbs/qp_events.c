/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* Async events of live QPs through the stock libibverbs API under siwx-run
 * (ibv_get_async_event / ibv_ack_async_event), with the work completions
 * that go with them:
 *  - the peer resets the connection (RST): IBV_EVENT_QP_FATAL, flushes, and
 *    the stream's end reported to the CM's notify as an error;
 *  - a Read or Write with an invalid STag: IBV_EVENT_QP_ACCESS_ERR at the
 *    responder (RFC 5040 Remote Protection Error), REM_ACCESS_ERR and
 *    IBV_EVENT_QP_FATAL (the peer's Terminate) at the requester;
 *  - a Send without a posted receive: IBV_EVENT_QP_REQ_ERR at the receiver;
 *  - an lkey of another PD: LOC_PROT_ERR at the sender, IBV_EVENT_QP_FATAL
 *    at the peer;
 *  - an SRQ QP leaving its stream: IBV_EVENT_QP_LAST_WQE_REACHED;
 *  - ibv_destroy_qp takes back events nobody read and waits for read ones
 *    to be acknowledged. */
#define _GNU_SOURCE
#include "qp_util.h"

#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint8_t mem[8192];
	struct ibv_mr *mr;
};

static void side_open(struct side *s, struct ibv_srq *(*make_srq)(struct side *))
{
	s->ctx = open_siwx("lo");
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd != NULL);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	CHECK(s->cq != NULL);
	const int access =
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	s->mr = ibv_reg_mr(s->pd, s->mem, sizeof(s->mem), access);
	CHECK(s->mr != NULL);
	struct ibv_srq *srq = make_srq != NULL ? make_srq(s) : NULL;
	s->qp = create_rc_qp(s->pd, s->cq, s->cq, srq, 16, 2, 0);
	CHECK_EQ(modify_state(s->qp, IBV_QPS_INIT), 0);
}

static void side_close(struct side *s)
{
	struct ibv_srq *srq = s->qp->srq;
	CHECK_EQ(ibv_destroy_qp(s->qp), 0);
	if (srq != NULL)
		CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK_EQ(ibv_dereg_mr(s->mr), 0);
	CHECK_EQ(ibv_destroy_cq(s->cq), 0);
	CHECK_EQ(ibv_dealloc_pd(s->pd), 0);
	CHECK_EQ(ibv_close_device(s->ctx), 0);
}

static void post_recv(struct side *s, uint64_t wr_id)
{
	struct ibv_sge sge = {.addr = (uintptr_t)s->mem, .length = 64, .lkey = s->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *bad = NULL;
	CHECK_EQ(ibv_post_recv(s->qp, &wr, &bad), 0);
}

static void expect_event(struct side *s, enum ibv_event_type type)
{
	struct ibv_async_event event;
	wait_async_event(s->ctx, &event);
	if (event.event_type != type)
		fprintf(stderr, "got %s, want %s\n", ibv_event_type_str(event.event_type),
			ibv_event_type_str(type));
	CHECK_EQ(event.event_type, type);
	CHECK(event.element.qp == s->qp);
	ibv_ack_async_event(&event);
}

static int notify_count;
static int notify_event;
static int notify_error;
static void on_stream(uint64_t cookie, int event, int error)
{
	(void)cookie;
	__atomic_store_n(&notify_event, event, __ATOMIC_SEQ_CST);
	__atomic_store_n(&notify_error, error, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&notify_count, 1, __ATOMIC_SEQ_CST);
}

static void connect_sides(struct side *a, struct side *b, int tcp)
{
	struct siwx_stream_params params = default_params();
	bind_pair(a->qp, b->qp, tcp, &params);
}

/* The peer's RST: QP_FATAL, receives flushed, the CM told ECONNRESET. */
static void peer_reset(void)
{
	struct side a;
	side_open(&a, NULL);
	int fds[2];
	connected_fds(1, fds);
	struct siwx_stream_params params = default_params();
	struct siwx_stream_notify notify = {.event = on_stream, .cookie = 1};
	notify_count = 0;
	CHECK_EQ(bind_stream_fn()(a.qp, fds[0], &params, &notify), 0);
	post_recv(&a, 11);
	post_recv(&a, 12);
	struct linger linger = {.l_onoff = 1, .l_linger = 0};
	CHECK_EQ(setsockopt(fds[1], SOL_SOCKET, SO_LINGER, &linger, sizeof(linger)), 0);
	close(fds[1]);

	expect_event(&a, IBV_EVENT_QP_FATAL);
	struct ibv_wc wc[2];
	CHECK_EQ(poll_n(a.cq, wc, 2), 2);
	CHECK_EQ_U64(wc[0].wr_id, 11);
	CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
	CHECK_EQ_U64(wc[1].wr_id, 12);
	CHECK_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
	wait_state(a.qp, IBV_QPS_ERR);
	for (int i = 0; i < kWaitMs && __atomic_load_n(&notify_count, __ATOMIC_SEQ_CST) == 0; i++)
		usleep(1000);
	CHECK_EQ(notify_count, 1);
	CHECK_EQ(notify_event, SIWX_STREAM_EVENT_ERROR);
	CHECK_EQ(notify_error, ECONNRESET);
	CHECK(!async_pending(a.ctx, 20));
	CHECK_EQ(a.qp->events_completed, 1);
	side_close(&a);
	CHECK_EQ(notify_count, 1); /* reported once, not again at destroy */
	printf("qp_events: peer reset ok\n");
}

/* Our abortive disconnect: the peer sees the RST (QP_FATAL); we raise no
 * event, and our end counts as a local disconnect. */
static void local_abort(void)
{
	struct side a, b;
	side_open(&a, NULL);
	side_open(&b, NULL);
	int fds[2];
	connected_fds(1, fds);
	struct siwx_stream_params params = default_params();
	struct siwx_stream_notify notify = {.event = on_stream, .cookie = 2};
	notify_count = 0;
	CHECK_EQ(bind_stream_fn()(a.qp, fds[0], &params, NULL), 0);
	CHECK_EQ(bind_stream_fn()(b.qp, fds[1], &params, &notify), 0);
	CHECK_EQ(disconnect_stream_fn()(b.qp, 1), 0);
	expect_event(&a, IBV_EVENT_QP_FATAL);
	wait_state(a.qp, IBV_QPS_ERR);
	CHECK_EQ(state_of(b.qp), IBV_QPS_ERR);
	for (int i = 0; i < kWaitMs && __atomic_load_n(&notify_count, __ATOMIC_SEQ_CST) == 0; i++)
		usleep(1000);
	CHECK_EQ(notify_count, 1);
	CHECK_EQ(notify_event, SIWX_STREAM_EVENT_CLOSED);
	CHECK_EQ(notify_error, 0);
	CHECK(!async_pending(b.ctx, 20));
	side_close(&a);
	side_close(&b);
	printf("qp_events: local abort ok\n");
}

/* A Read of an invalid STag: the responder raises QP_ACCESS_ERR and sends a
 * Terminate; the requester's Read completes with REM_ACCESS_ERR and the
 * Terminate raises QP_FATAL there. */
static void remote_access_read(void)
{
	struct side a, b;
	side_open(&a, NULL);
	side_open(&b, NULL);
	connect_sides(&a, &b, 0);
	struct ibv_sge sge = {.addr = (uintptr_t)a.mem, .length = 32, .lkey = a.mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 21, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = (uintptr_t)b.mem;
	wr.wr.rdma.rkey = b.mr->rkey ^ 0xFF; /* another key: not a valid STag */
	struct ibv_send_wr *bad = NULL;
	CHECK_EQ(ibv_post_send(a.qp, &wr, &bad), 0);

	expect_event(&b, IBV_EVENT_QP_ACCESS_ERR);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(a.cq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 21);
	CHECK_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
	CHECK_EQ(wc.opcode, IBV_WC_RDMA_READ);
	CHECK_EQ(wc.qp_num, a.qp->qp_num);
	expect_event(&a, IBV_EVENT_QP_FATAL);
	wait_state(a.qp, IBV_QPS_ERR);
	wait_state(b.qp, IBV_QPS_ERR);
	side_close(&a);
	side_close(&b);
	printf("qp_events: remote access error (Read) ok\n");
}

/* A Write beyond the region: QP_ACCESS_ERR at the target. */
static void remote_access_write(void)
{
	struct side a, b;
	side_open(&a, NULL);
	side_open(&b, NULL);
	connect_sides(&a, &b, 1);
	struct ibv_sge sge = {.addr = (uintptr_t)a.mem, .length = 64, .lkey = a.mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 31, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE};
	wr.wr.rdma.remote_addr = (uintptr_t)b.mem + sizeof(b.mem) - 32;
	wr.wr.rdma.rkey = b.mr->rkey;
	struct ibv_send_wr *bad = NULL;
	CHECK_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
	expect_event(&b, IBV_EVENT_QP_ACCESS_ERR);
	expect_event(&a, IBV_EVENT_QP_FATAL);
	wait_state(a.qp, IBV_QPS_ERR);
	side_close(&a);
	side_close(&b);
	printf("qp_events: remote access error (Write) ok\n");
}

/* A Send without a posted receive (RFC 5041 untagged buffer error). */
static void no_receive(void)
{
	struct side a, b;
	side_open(&a, NULL);
	side_open(&b, NULL);
	connect_sides(&a, &b, 0);
	struct ibv_send_wr wr = {.wr_id = 41, .opcode = IBV_WR_SEND};
	struct ibv_send_wr *bad = NULL;
	CHECK_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
	expect_event(&b, IBV_EVENT_QP_REQ_ERR);
	expect_event(&a, IBV_EVENT_QP_FATAL);
	side_close(&a);
	side_close(&b);
	printf("qp_events: Send without a receive ok\n");
}

/* An lkey of another PD: the WR fails locally with LOC_PROT_ERR and the
 * stream ends with our Terminate, which the peer reports as QP_FATAL. */
static void wrong_pd(void)
{
	struct side a, b;
	side_open(&a, NULL);
	side_open(&b, NULL);
	connect_sides(&a, &b, 0);
	struct ibv_pd *other = ibv_alloc_pd(a.ctx);
	CHECK(other != NULL);
	uint8_t buf[64];
	struct ibv_mr *mr = ibv_reg_mr(other, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	post_recv(&b, 51);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 52, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad = NULL;
	CHECK_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(a.cq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 52);
	CHECK_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
	CHECK_EQ(wc.opcode, IBV_WC_SEND);
	expect_event(&b, IBV_EVENT_QP_FATAL);
	CHECK_EQ(poll_n(b.cq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 51);
	CHECK_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
	wait_state(a.qp, IBV_QPS_ERR);
	CHECK(!async_pending(a.ctx, 20));
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(ibv_dealloc_pd(other), 0);
	side_close(&a);
	side_close(&b);
	printf("qp_events: lkey of another PD ok\n");
}

static struct ibv_srq *make_srq(struct side *s)
{
	struct ibv_srq_init_attr attr = {.attr = {.max_wr = 8, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(s->pd, &attr);
	CHECK(srq != NULL);
	return srq;
}

/* An SRQ QP whose stream ends: QP_LAST_WQE_REACHED; the SRQ's WRs stay. */
static void srq_last_wqe(void)
{
	struct side a;
	side_open(&a, make_srq);
	int fds[2];
	connected_fds(0, fds);
	struct siwx_stream_params params = default_params();
	CHECK_EQ(bind_stream_fn()(a.qp, fds[0], &params, NULL), 0);
	struct ibv_sge sge = {.addr = (uintptr_t)a.mem, .length = 64, .lkey = a.mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 61, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *bad = NULL;
	CHECK_EQ(ibv_post_srq_recv(a.qp->srq, &rwr, &bad), 0);
	close(fds[1]);
	expect_event(&a, IBV_EVENT_QP_LAST_WQE_REACHED);
	wait_state(a.qp, IBV_QPS_ERR);
	CHECK(stays_empty(a.cq, 20)); /* shared receives are not flushed */
	side_close(&a);
	printf("qp_events: SRQ last WQE ok\n");
}

struct acker {
	struct ibv_async_event event;
	int acked;
};

static void *ack_later(void *arg)
{
	struct acker *acker = arg;
	usleep(200 * 1000);
	__atomic_store_n(&acker->acked, 1, __ATOMIC_SEQ_CST);
	ibv_ack_async_event(&acker->event);
	return NULL;
}

/* Destroy takes back an event nobody read; one that was read is waited for
 * until it is acknowledged (as destroy_cq waits for CQ events). */
static void destroy_with_events(void)
{
	struct side a, b;
	side_open(&a, NULL);
	side_open(&b, NULL);
	connect_sides(&a, &b, 1); /* TCP: the abort is a RST */
	CHECK_EQ(disconnect_stream_fn()(b.qp, 1), 0);
	CHECK(async_pending(a.ctx, kWaitMs)); /* QP_FATAL, not read */
	wait_state(a.qp, IBV_QPS_ERR);
	CHECK_EQ(ibv_destroy_qp(a.qp), 0);
	CHECK(!async_pending(a.ctx, 0));
	a.qp = create_rc_qp(a.pd, a.cq, a.cq, NULL, 16, 2, 0);
	CHECK_EQ(modify_state(a.qp, IBV_QPS_INIT), 0);
	CHECK_EQ(ibv_destroy_qp(b.qp), 0);
	b.qp = create_rc_qp(b.pd, b.cq, b.cq, NULL, 16, 2, 0);
	CHECK_EQ(modify_state(b.qp, IBV_QPS_INIT), 0);

	connect_sides(&a, &b, 1); /* TCP: the abort is a RST */
	CHECK_EQ(disconnect_stream_fn()(b.qp, 1), 0);
	struct acker acker = {.acked = 0};
	wait_async_event(a.ctx, &acker.event);
	CHECK_EQ(acker.event.event_type, IBV_EVENT_QP_FATAL);
	CHECK(acker.event.element.qp == a.qp);
	pthread_t thread;
	CHECK_EQ(pthread_create(&thread, NULL, ack_later, &acker), 0);
	CHECK_EQ(ibv_destroy_qp(a.qp), 0);
	CHECK_EQ(__atomic_load_n(&acker.acked, __ATOMIC_SEQ_CST), 1);
	CHECK_EQ(pthread_join(thread, NULL), 0);
	a.qp = create_rc_qp(a.pd, a.cq, a.cq, NULL, 16, 2, 0);
	side_close(&a);
	side_close(&b);
	printf("qp_events: destroy with events ok\n");
}

int main(void)
{
	peer_reset();
	local_abort();
	remote_access_read();
	remote_access_write();
	no_receive();
	wrong_pd();
	srq_last_wqe();
	destroy_with_events();
	return 0;
}
