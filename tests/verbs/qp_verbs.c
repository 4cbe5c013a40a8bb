/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* QP verbs without traffic, through the stock libibverbs API under siwx-run:
 * creation (every field, capacities written back, users of PD/CQ/SRQ), the
 * state machine as ibv_modify_qp drives it on an iWARP device (the rdma_cm
 * and InfiniBand attribute sets, IBV_QP_CUR_STATE, RTS waiting for the
 * stream, ERR flushing, RESET), ibv_query_qp, the errors of every verb for
 * bad arguments and wrong states, and the provider's stream handover
 * (siwx_qp_bind_stream and friends) found with dlsym(). */
#define _GNU_SOURCE
#include "qp_util.h"

#include <fcntl.h>
#include <stddef.h>
#include <sys/socket.h>
#include <unistd.h>

static int fd_is_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

static struct ibv_qp_attr query(struct ibv_qp *qp, struct ibv_qp_init_attr *init)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr scratch;
	memset(&attr, 0xA5, sizeof(attr));
	CHECK_EQ(ibv_query_qp(qp, &attr, IBV_QP_STATE, init != NULL ? init : &scratch), 0);
	return attr;
}

/* A stream end reported by the provider (siwx_stream_notify). */
static int notify_count;
static int notify_event;
static int notify_error;
static uint64_t notify_cookie;
static void on_stream(uint64_t cookie, int event, int error)
{
	__atomic_store_n(&notify_cookie, cookie, __ATOMIC_SEQ_CST);
	__atomic_store_n(&notify_event, event, __ATOMIC_SEQ_CST);
	__atomic_store_n(&notify_error, error, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&notify_count, 1, __ATOMIC_SEQ_CST);
}

static void creation(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *scq,
		     struct ibv_cq *rcq)
{
	int cookie = 7;
	struct ibv_qp_init_attr attr = {
		.qp_context = &cookie,
		.send_cq = scq,
		.recv_cq = rcq,
		.cap = {.max_send_wr = 8, .max_recv_wr = 0, .max_send_sge = 2, .max_recv_sge = 3,
			.max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	CHECK(qp != NULL);
	/* What ibv_cmd_create_qp would have filled. */
	CHECK(qp->context == ctx);
	CHECK(qp->qp_context == &cookie);
	CHECK(qp->pd == pd);
	CHECK(qp->send_cq == scq);
	CHECK(qp->recv_cq == rcq);
	CHECK(qp->srq == NULL);
	CHECK_EQ(qp->qp_type, IBV_QPT_RC);
	CHECK_EQ(qp->state, IBV_QPS_RESET);
	CHECK_EQ(qp->events_completed, 0);
	CHECK(qp->qp_num != 0);
	CHECK(qp->qp_num <= 0xFFFFFF);
	/* The capacities in force: a receive queue holds at least one WR, and
	 * inline data up to the device's 256 octets, as kernel siw reports. */
	CHECK_EQ(attr.cap.max_send_wr, 8);
	CHECK_EQ(attr.cap.max_recv_wr, 1);
	CHECK_EQ(attr.cap.max_send_sge, 2);
	CHECK_EQ(attr.cap.max_recv_sge, 3);
	CHECK_EQ(attr.cap.max_inline_data, 256);
	/* Made without send_ops_flags: no ibv_wr_* send API (qp_wr.c). */
	CHECK(ibv_qp_to_qp_ex(qp) == NULL);

	/* The QP uses the PD and both CQs. */
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_destroy_cq(scq), EBUSY);
	CHECK_EQ(ibv_destroy_cq(rcq), EBUSY);

	struct ibv_qp_init_attr init;
	struct ibv_qp_attr q = query(qp, &init);
	CHECK_EQ(q.qp_state, IBV_QPS_RESET);
	CHECK_EQ(q.cur_qp_state, IBV_QPS_RESET);
	CHECK_EQ(q.cap.max_send_wr, 8);
	CHECK_EQ(q.cap.max_recv_wr, 1);
	CHECK_EQ(q.cap.max_send_sge, 2);
	CHECK_EQ(q.cap.max_recv_sge, 3);
	CHECK_EQ(q.cap.max_inline_data, 256);
	CHECK_EQ(q.port_num, 1);
	CHECK_EQ(q.qp_access_flags, 0);
	CHECK_EQ(q.max_rd_atomic, 0);
	CHECK_EQ(q.max_dest_rd_atomic, 0);
	CHECK_EQ(q.dest_qp_num, 0);
	CHECK(init.qp_context == &cookie);
	CHECK(init.send_cq == scq);
	CHECK(init.recv_cq == rcq);
	CHECK(init.srq == NULL);
	CHECK_EQ(init.qp_type, IBV_QPT_RC);
	CHECK_EQ(init.sq_sig_all, 1);
	CHECK_EQ(init.cap.max_recv_wr, 1);
	CHECK_EQ(init.cap.max_inline_data, 256);
	CHECK_EQ(ibv_query_qp(qp, NULL, IBV_QP_STATE, &init), EINVAL);
	CHECK_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, NULL), EINVAL);

	CHECK_EQ(ibv_destroy_qp(qp), 0);

	/* ibv_create_qp_ex with the PD only: the same QP, caps written back. */
	struct ibv_qp_init_attr_ex attr_ex = {
		.send_cq = scq,
		.recv_cq = rcq,
		.cap = {.max_send_wr = 3, .max_recv_wr = 5, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};
	qp = ibv_create_qp_ex(ctx, &attr_ex);
	CHECK(qp != NULL);
	CHECK_EQ(attr_ex.cap.max_send_wr, 3);
	CHECK_EQ(attr_ex.cap.max_recv_wr, 5);
	CHECK_EQ(attr_ex.cap.max_inline_data, 256);
	CHECK(qp->pd == pd);
	CHECK_EQ(ibv_destroy_qp(qp), 0);
}

static void creation_errors(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	/* Receive completions of an SRQ QP go to its receive CQ: required. */
	struct ibv_srq_init_attr srq_attr = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(pd, &srq_attr);
	CHECK(srq != NULL);
	attr.srq = srq;
	attr.recv_cq = NULL;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);
	CHECK_EQ(ibv_destroy_srq(srq), 0);

	/* The wrong PD: one of another context, with this context's CQs. */
	struct ibv_context *other = open_siwx("lo");
	struct ibv_pd *other_pd = ibv_alloc_pd(other);
	CHECK(other_pd != NULL);
	attr.srq = NULL;
	attr.recv_cq = cq;
	CHECK_NULL_ERRNO(ibv_create_qp(other_pd, &attr), EINVAL);
	struct ibv_qp_init_attr_ex attr_ex = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = attr.cap,
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = other_pd,
	};
	/* (ibv_create_qp_ex with only IBV_QP_INIT_ATTR_PD is an inline call
	 * of ibv_create_qp(attr->pd): the PD's context decides.) */
	CHECK_NULL_ERRNO(ibv_create_qp_ex(ctx, &attr_ex), EINVAL);
	CHECK_EQ(ibv_dealloc_pd(other_pd), 0);
	CHECK_EQ(ibv_close_device(other), 0);

	/* Bad QP types: iWARP is reliable connected only. */
	attr.qp_type = IBV_QPT_XRC_SEND;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EOPNOTSUPP);
	attr.qp_type = IBV_QPT_RAW_PACKET;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EOPNOTSUPP);
	attr.qp_type = (enum ibv_qp_type)77;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EOPNOTSUPP);

	/* Many QPs at once have distinct numbers; destroying returns them. */
	enum { kMany = 64 };
	struct ibv_qp *many[kMany];
	attr.qp_type = IBV_QPT_RC;
	for (int i = 0; i < kMany; i++) {
		many[i] = ibv_create_qp(pd, &attr);
		CHECK(many[i] != NULL);
		for (int j = 0; j < i; j++)
			CHECK(many[i]->qp_num != many[j]->qp_num);
	}
	for (int i = 0; i < kMany; i++)
		CHECK_EQ(ibv_destroy_qp(many[i]), 0);
}

static void states(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr init_attr = {
		.send_cq = scq,
		.recv_cq = rcq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 2, .max_recv_sge = 2},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init_attr);
	CHECK(qp != NULL);
	uint8_t buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey};
	struct ibv_send_wr swr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND};
	struct ibv_recv_wr rwr[2] = {
		{.wr_id = 11, .next = &rwr[1], .sg_list = &sge, .num_sge = 1},
		{.wr_id = 12, .sg_list = &sge, .num_sge = 1},
	};
	struct ibv_send_wr *bad_send = NULL;
	struct ibv_recv_wr *bad_recv = NULL;
	struct ibv_qp_attr attr;

	/* RESET takes no WRs. */
	CHECK_EQ(ibv_post_send(qp, &swr, &bad_send), EINVAL);
	CHECK(bad_send == &swr);
	CHECK_EQ(ibv_post_recv(qp, &rwr[0], &bad_recv), EINVAL);
	CHECK(bad_recv == &rwr[0]);

	/* Mask 0 changes nothing and succeeds (kernel siw). */
	memset(&attr, 0, sizeof(attr));
	CHECK_EQ(ibv_modify_qp(qp, &attr, 0), 0);

	/* RESET -> INIT with what rdma_init_qp_attr() gives on iWARP. */
	CHECK_EQ(modify_state(qp, IBV_QPS_INIT), 0);
	CHECK_EQ(qp->state, IBV_QPS_INIT);
	CHECK_EQ(state_of(qp), IBV_QPS_INIT);
	CHECK_EQ(query(qp, NULL).qp_access_flags, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

	/* INIT takes receives, not sends. */
	CHECK_EQ(ibv_post_recv(qp, &rwr[0], &bad_recv), 0);
	bad_send = NULL;
	CHECK_EQ(ibv_post_send(qp, &swr, &bad_send), EINVAL);
	CHECK(bad_send == &swr);

	/* Invalid modifies fail as a whole: nothing changes. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_UNKNOWN;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL);
	attr.qp_state = IBV_QPS_RTR;
	attr.cur_qp_state = IBV_QPS_RTR; /* it is in INIT */
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE), EINVAL);
	attr.cur_qp_state = IBV_QPS_UNKNOWN;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE), EINVAL);
	attr.port_num = 2;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PORT), EINVAL);
	attr.port_num = 1;
	attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED; /* not a QP right */
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), EINVAL);
	attr.qp_access_flags = 1 << 30;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_ACCESS_FLAGS), EINVAL);
	attr.qp_access_flags = IBV_ACCESS_REMOTE_READ;
	attr.max_rd_atomic = 129; /* max_qp_init_rd_atom is 128 */
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_MAX_QP_RD_ATOMIC), EINVAL);
	attr.max_rd_atomic = 0;
	attr.max_dest_rd_atomic = 200;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_MAX_DEST_RD_ATOMIC), EINVAL);
	attr.max_dest_rd_atomic = 0;
	/* Resizing and rate limits are not offered. */
	attr.cap.max_send_wr = 8;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CAP), EOPNOTSUPP);
	attr.rate_limit = 1000;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_RATE_LIMIT), EOPNOTSUPP);
	CHECK_EQ(ibv_modify_qp(qp, &attr, 1 << 21), EOPNOTSUPP);
	CHECK_EQ(ibv_modify_qp(qp, NULL, IBV_QP_STATE), EINVAL);
	/* Transitions iWARP does not have from INIT. */
	attr.qp_state = IBV_QPS_RTS;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL);
	attr.qp_state = IBV_QPS_SQD;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL);
	attr.qp_state = IBV_QPS_SQE;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL);
	CHECK_EQ(qp->state, IBV_QPS_INIT);
	CHECK_EQ(state_of(qp), IBV_QPS_INIT);
	CHECK_EQ(query(qp, NULL).qp_access_flags, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

	/* INIT -> INIT with new rights; perftest's lone MIN_RNR_TIMER. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	attr.cur_qp_state = IBV_QPS_INIT;
	attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	attr.pkey_index = 0;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS |
						  IBV_QP_PKEY_INDEX | IBV_QP_PORT),
		 EINVAL); /* port_num 0 */
	attr.port_num = 1;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS |
						  IBV_QP_PKEY_INDEX | IBV_QP_PORT),
		 0);
	CHECK_EQ(query(qp, NULL).qp_access_flags, attr.qp_access_flags);
	attr.min_rnr_timer = 12;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_MIN_RNR_TIMER), 0);

	/* INIT -> RTR with an address vector needs a GRH: the port is
	 * Ethernet (as RoCE) and the peer's GID is how siwx finds it for an
	 * out-of-band connect (docs/out-of-band-connect.md, qp_oob.c). */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = 0x123456;
	attr.rq_psn = 77;
	attr.max_dest_rd_atomic = 4;
	attr.min_rnr_timer = 12;
	attr.ah_attr.dlid = 3;
	attr.ah_attr.port_num = 1;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
		 EINVAL);
	/* A GRH whose GID is not a siwx GID (an IPv6 address) names no peer. */
	attr.ah_attr.is_global = 1;
	memset(attr.ah_attr.grh.dgid.raw, 0, 16);
	attr.ah_attr.grh.dgid.raw[0] = 0xfe;
	attr.ah_attr.grh.dgid.raw[1] = 0x80;
	attr.ah_attr.grh.dgid.raw[15] = 1;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
		 EINVAL);
	CHECK_EQ(qp->state, IBV_QPS_INIT);
	/* The rest of the InfiniBand RC set, without an address vector (what
	 * a connection manager passes): the path attributes are ignored, the
	 * IRD is recorded. */
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PATH_MTU |
						  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
		 0);
	CHECK_EQ(qp->state, IBV_QPS_RTR);
	struct ibv_qp_attr q = query(qp, NULL);
	CHECK_EQ(q.qp_state, IBV_QPS_RTR);
	CHECK_EQ(q.max_dest_rd_atomic, 4);
	CHECK_EQ(q.dest_qp_num, 0); /* iWARP has no destination QPN */

	/* RTR takes receives, not sends. */
	rwr[1].wr_id = 13;
	CHECK_EQ(ibv_post_recv(qp, &rwr[1], &bad_recv), 0);
	CHECK_EQ(ibv_post_send(qp, &swr, &bad_send), EINVAL);

	/* RTR -> RTS with the InfiniBand RTS set: accepted, but an iWARP QP
	 * enters RTS when its stream is bound; until then it stays in RTR. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.cur_qp_state = IBV_QPS_RTR;
	attr.sq_psn = 5;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 6;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_SQ_PSN |
						  IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
		 0);
	q = query(qp, NULL);
	CHECK_EQ(q.qp_state, IBV_QPS_RTR);
	CHECK_EQ(q.max_rd_atomic, 6);
	CHECK_EQ(q.max_dest_rd_atomic, 4);
	attr.cur_qp_state = IBV_QPS_INIT;
	CHECK_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE), EINVAL);
	bad_send = NULL;
	CHECK_EQ(ibv_post_send(qp, &swr, &bad_send), EINVAL);
	CHECK(bad_send == &swr);

	/* ERR flushes: the receives posted in INIT and RTR complete with
	 * WR_FLUSH_ERR, in order; later posts complete the same way. */
	CHECK_EQ(modify_state(qp, IBV_QPS_ERR), 0);
	CHECK_EQ(qp->state, IBV_QPS_ERR);
	struct ibv_wc wc[4];
	CHECK_EQ(poll_n(rcq, wc, 3), 3);
	CHECK(stays_empty(rcq, 20));
	for (int i = 0; i < 3; i++) {
		CHECK_EQ_U64(wc[i].wr_id, 11 + i);
		CHECK_EQ(wc[i].status, IBV_WC_WR_FLUSH_ERR);
		CHECK_EQ(wc[i].opcode, IBV_WC_RECV);
		CHECK_EQ(wc[i].qp_num, qp->qp_num);
	}
	CHECK_EQ(ibv_post_send(qp, &swr, &bad_send), 0);
	CHECK_EQ(poll_n(scq, wc, 1), 1);
	CHECK_EQ_U64(wc[0].wr_id, 1);
	CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
	CHECK_EQ(wc[0].opcode, IBV_WC_SEND);
	CHECK_EQ(wc[0].qp_num, qp->qp_num);
	rwr[1].wr_id = 14;
	CHECK_EQ(ibv_post_recv(qp, &rwr[1], &bad_recv), 0);
	CHECK_EQ(poll_n(rcq, wc, 1), 1);
	CHECK_EQ_U64(wc[0].wr_id, 14);
	CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
	/* ERR goes nowhere but RESET (and ERR). */
	CHECK_EQ(modify_state(qp, IBV_QPS_ERR), 0);
	CHECK_EQ(modify_state(qp, IBV_QPS_INIT), EINVAL);
	CHECK_EQ(modify_state(qp, IBV_QPS_RTS), EINVAL);

	/* RESET drops everything without completions; the QP starts over. */
	CHECK_EQ(ibv_post_recv(qp, &rwr[1], &bad_recv), 0);
	CHECK_EQ(poll_n(rcq, wc, 1), 1);
	CHECK_EQ(modify_state(qp, IBV_QPS_RESET), 0);
	CHECK_EQ(state_of(qp), IBV_QPS_RESET);
	CHECK_EQ(modify_state(qp, IBV_QPS_INIT), 0);
	CHECK_EQ(ibv_post_recv(qp, &rwr[1], &bad_recv), 0);
	CHECK_EQ(modify_state(qp, IBV_QPS_RESET), 0);
	CHECK(stays_empty(rcq, 50));
	CHECK(stays_empty(scq, 0));

	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
}

/* post_send's checks that do not need the WR to run: in RTS (a bound
 * stream whose peer end stays silent), every bad WR fails with EINVAL at
 * the first bad one, the ones before it are posted, and a full queue is
 * ENOMEM. */
static void post_errors(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp *qp = create_rc_qp(pd, scq, rcq, NULL, 4, 2, 32);
	CHECK_EQ(modify_state(qp, IBV_QPS_INIT), 0);
	int fds[2];
	connected_fds(0, fds);
	struct siwx_stream_params params = default_params();
	CHECK_EQ(bind_stream_fn()(qp, fds[0], &params, NULL), 0);
	CHECK_EQ(state_of(qp), IBV_QPS_RTS);

	uint8_t buf[512];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	struct ibv_sge sges[3] = {
		{.addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey},
		{.addr = (uintptr_t)buf + 16, .length = 16, .lkey = mr->lkey},
		{.addr = (uintptr_t)buf + 32, .length = 16, .lkey = mr->lkey},
	};
	struct ibv_send_wr good = {.wr_id = 1, .sg_list = sges, .num_sge = 1,
				   .opcode = IBV_WR_SEND};
	struct ibv_send_wr bad = good;
	struct ibv_send_wr *bad_wr = NULL;

	/* Too many SGEs for the QP (max_send_sge 2); an RDMA Read names one
	 * Data Sink (max_sge_rd 1). */
	bad.num_sge = 3;
	CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
	CHECK(bad_wr == &bad);
	bad.num_sge = -1;
	CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
	bad = good;
	bad.opcode = IBV_WR_RDMA_READ;
	bad.num_sge = 2;
	CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
	bad = good;
	bad.sg_list = NULL;
	CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);

	/* Too much inline data (32 asked, the device's 256 in force), and
	 * inline on a Read. */
	bad = good;
	bad.send_flags = IBV_SEND_INLINE;
	sges[2].length = 225;
	bad.num_sge = 3; /* 257 octets */
	CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
	sges[2].length = 300;
	bad.num_sge = 3;
	CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
	sges[2].length = 16;
	bad.opcode = IBV_WR_RDMA_READ;
	bad.num_sge = 1;
	CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);

	/* Opcodes iWARP does not carry (RFC 5040 has no immediate data; the
	 * device offers no atomics or memory windows), and unknown flags. */
	const enum ibv_wr_opcode refused[] = {
		IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_ATOMIC_CMP_AND_SWP,
		IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_BIND_MW, IBV_WR_TSO, IBV_WR_DRIVER1,
		IBV_WR_ATOMIC_WRITE, (enum ibv_wr_opcode)99,
	};
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		bad = good;
		bad.opcode = refused[i];
		bad_wr = NULL;
		CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
		CHECK(bad_wr == &bad);
	}
	bad = good;
	bad.send_flags = IBV_SEND_IP_CSUM;
	CHECK_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);

	/* A list stops at the first bad WR; the ones before it are posted.
	 * The peer never reads: unsignaled Sends of 16 octets still complete
	 * locally once TCP took them, so only the count matters here. */
	struct ibv_send_wr list[3] = {good, good, good};
	list[0].next = &list[1];
	list[1].next = &list[2];
	list[1].opcode = IBV_WR_SEND_WITH_IMM;
	list[0].send_flags = IBV_SEND_SIGNALED;
	list[0].wr_id = 100;
	bad_wr = NULL;
	CHECK_EQ(ibv_post_send(qp, list, &bad_wr), EINVAL);
	CHECK(bad_wr == &list[1]);
	struct ibv_wc wc;
	CHECK_EQ(poll_n(scq, &wc, 1), 1);
	CHECK_EQ_U64(wc.wr_id, 100);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.opcode, IBV_WC_SEND);
	CHECK_EQ(wc.byte_len, 16);

	/* A full send queue: the peer does not read, so fill the socket with
	 * large unsignaled Writes first; then max_send_wr WRs are outstanding
	 * and the next post is ENOMEM. */
	enum { kBig = 1 << 20 };
	uint8_t *big = malloc(kBig);
	CHECK(big != NULL);
	struct ibv_mr *big_mr = ibv_reg_mr(pd, big, kBig, IBV_ACCESS_LOCAL_WRITE);
	CHECK(big_mr != NULL);
	struct ibv_sge big_sge = {.addr = (uintptr_t)big, .length = kBig, .lkey = big_mr->lkey};
	struct ibv_send_wr fill = {.wr_id = 200, .sg_list = &big_sge, .num_sge = 1,
				   .opcode = IBV_WR_RDMA_WRITE};
	fill.wr.rdma.remote_addr = 0x1000;
	fill.wr.rdma.rkey = 0x1234;
	int posted = 0;
	int rc = 0;
	while ((rc = ibv_post_send(qp, &fill, &bad_wr)) == 0 && posted < 1000)
		posted++;
	CHECK_EQ(rc, ENOMEM);
	CHECK(bad_wr == &fill);
	CHECK_EQ(posted, 4);

	/* Destroying a QP with a bound, busy stream is safe. */
	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(ibv_dereg_mr(big_mr), 0);
	free(big);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	close(fds[1]);
	/* Completions of the destroyed QP may remain: drain them. */
	struct ibv_wc drain[16];
	while (ibv_poll_cq(scq, 16, drain) > 0)
		;
}

static void srq_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_srq_init_attr srq_attr = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(pd, &srq_attr);
	CHECK(srq != NULL);
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.cap = {.max_send_wr = 2, .max_recv_wr = 99, .max_send_sge = 1, .max_recv_sge = 99},
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	CHECK(qp != NULL);
	CHECK(qp->srq == srq);
	/* ibv_create_qp(3): the receive caps are ignored with an SRQ. */
	CHECK_EQ(attr.cap.max_recv_wr, 0);
	CHECK_EQ(attr.cap.max_recv_sge, 0);
	CHECK_EQ(ibv_destroy_srq(srq), EBUSY);
	CHECK_EQ(modify_state(qp, IBV_QPS_INIT), 0);
	/* ibv_post_recv(3): post to the SRQ, not to the QP. */
	struct ibv_recv_wr rwr = {.wr_id = 1};
	struct ibv_recv_wr *bad_wr = NULL;
	CHECK_EQ(ibv_post_recv(qp, &rwr, &bad_wr), EINVAL);
	CHECK(bad_wr == &rwr);
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr q = query(qp, &init);
	CHECK(init.srq == srq);
	CHECK_EQ(q.cap.max_recv_wr, 0);
	CHECK_EQ(init.cap.max_recv_wr, 0);
	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
}

static void handover(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq)
{
	siwx_qp_bind_stream_fn bind = bind_stream_fn();
	siwx_qp_disconnect_stream_fn disconnect = disconnect_stream_fn();
	siwx_qp_lookup_fn lookup = qp_lookup_fn();
	struct siwx_stream_params params = default_params();
	struct ibv_qp *qp = create_rc_qp(pd, cq, cq, NULL, 4, 1, 0);
	int fds[2];
	connected_fds(0, fds);

	/* Lookup by number. */
	CHECK(lookup(ctx, qp->qp_num) == qp);
	CHECK_NULL_ERRNO(lookup(ctx, 0xFFFFFF), ENOENT);
	CHECK_NULL_ERRNO(lookup(NULL, qp->qp_num), EINVAL);

	/* A QP in RESET takes no stream; a failed bind leaves the fd open. */
	CHECK_EQ(bind(qp, fds[0], &params, NULL), EINVAL);
	CHECK(fd_is_open(fds[0]));
	CHECK_EQ(disconnect(qp, 0), EINVAL); /* nothing bound */
	CHECK_EQ(disconnect(NULL, 0), EINVAL);
	CHECK_EQ(modify_state(qp, IBV_QPS_INIT), 0);

	/* Bad arguments. */
	CHECK_EQ(bind(NULL, fds[0], &params, NULL), EINVAL);
	CHECK_EQ(bind(qp, fds[0], NULL, NULL), EINVAL);
	CHECK_EQ(bind(qp, -1, &params, NULL), EINVAL);
	int pipe_fds[2];
	CHECK_EQ(pipe(pipe_fds), 0);
	CHECK_EQ(bind(qp, pipe_fds[0], &params, NULL), EINVAL); /* not a socket */
	int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	CHECK(udp >= 0);
	CHECK_EQ(bind(qp, udp, &params, NULL), EINVAL); /* not a stream */
	CHECK(fd_is_open(pipe_fds[0]));
	CHECK(fd_is_open(udp));
	close(pipe_fds[0]);
	close(pipe_fds[1]);
	close(udp);
	struct siwx_stream_params p = params;
	p.size = 0;
	CHECK_EQ(bind(qp, fds[0], &p, NULL), EINVAL);
	p = params;
	p.rtr_role = 3;
	CHECK_EQ(bind(qp, fds[0], &p, NULL), EINVAL);
	p.rtr_role = SIWX_RTR_ROLE_SEND;
	p.rtr_message = 3;
	CHECK_EQ(bind(qp, fds[0], &p, NULL), EINVAL);
	p.rtr_role = SIWX_RTR_ROLE_AWAIT;
	p.rtr_accept_mask = 0;
	CHECK_EQ(bind(qp, fds[0], &p, NULL), EINVAL);
	p.rtr_accept_mask = 0x8;
	CHECK_EQ(bind(qp, fds[0], &p, NULL), EINVAL);
	p = params;
	p.tx_marker_grid_offset = 512; /* a position modulo 512 */
	CHECK_EQ(bind(qp, fds[0], &p, NULL), EINVAL);
	p = params;
	p.ird = 129; /* above max_qp_rd_atom */
	CHECK_EQ(bind(qp, fds[0], &p, NULL), EINVAL);
	p = params;
	p.max_ulpdu = 64; /* no Terminate fits */
	CHECK_EQ(bind(qp, fds[0], &p, NULL), EINVAL);
	CHECK(fd_is_open(fds[0]));
	CHECK_EQ(state_of(qp), IBV_QPS_INIT);

	/* A caller that knows only the first fields: the rest count as 0. */
	p = params;
	p.size = offsetof(struct siwx_stream_params, ird);
	p.ird = 0xDEAD; /* past `size`: not read */
	struct siwx_stream_notify notify = {.event = on_stream, .cookie = 0xC0FFEE};
	CHECK_EQ(bind(qp, fds[0], &p, &notify), 0);
	CHECK_EQ(state_of(qp), IBV_QPS_RTS);
	CHECK(!fd_is_open(fds[0])); /* the QP owns the connection now */
	struct ibv_qp_attr q = query(qp, NULL);
	CHECK_EQ(q.max_rd_atomic, 0);
	CHECK_EQ(q.max_dest_rd_atomic, 0);
	/* One stream per QP. */
	int more[2];
	connected_fds(0, more);
	CHECK_EQ(bind(qp, more[0], &params, NULL), EBUSY);
	CHECK(fd_is_open(more[0]));
	/* RTS -> RTS (attributes only) is fine. */
	CHECK_EQ(modify_state(qp, IBV_QPS_RTS), 0);

	/* The peer closes: an orderly end, reported once to the notify; the
	 * QP ends in ERR. */
	close(fds[1]);
	for (int i = 0; i < kWaitMs && __atomic_load_n(&notify_count, __ATOMIC_SEQ_CST) == 0; i++)
		usleep(1000);
	CHECK_EQ(__atomic_load_n(&notify_count, __ATOMIC_SEQ_CST), 1);
	CHECK_EQ_U64(notify_cookie, 0xC0FFEE);
	CHECK_EQ(notify_event, SIWX_STREAM_EVENT_CLOSED);
	CHECK_EQ(notify_error, 0);
	for (int i = 0; i < kWaitMs && state_of(qp) != IBV_QPS_ERR; i++)
		usleep(1000);
	CHECK_EQ(state_of(qp), IBV_QPS_ERR);
	/* ERR takes no stream; disconnecting a QP that already ended is a no-op. */
	CHECK_EQ(bind(qp, more[0], &params, NULL), EINVAL);
	CHECK_EQ(disconnect(qp, 0), 0);
	CHECK_EQ(disconnect(qp, 1), 0);

	/* After RESET the QP takes a new stream; an RTS requested in RTR takes
	 * effect at the bind. Destroying it reports the end of that stream. */
	CHECK_EQ(modify_state(qp, IBV_QPS_RESET), 0);
	CHECK_EQ(modify_state(qp, IBV_QPS_INIT), 0);
	CHECK_EQ(modify_state(qp, IBV_QPS_RTR), 0);
	CHECK_EQ(modify_state(qp, IBV_QPS_RTS), 0);
	CHECK_EQ(state_of(qp), IBV_QPS_RTR);
	notify.cookie = 0xBEEF;
	CHECK_EQ(bind(qp, more[0], &params, &notify), 0);
	CHECK_EQ(state_of(qp), IBV_QPS_RTS);
	q = query(qp, NULL);
	CHECK_EQ(q.max_rd_atomic, 8); /* the negotiated ORD and IRD */
	CHECK_EQ(q.max_dest_rd_atomic, 8);
	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(__atomic_load_n(&notify_count, __ATOMIC_SEQ_CST), 2);
	CHECK_EQ_U64(notify_cookie, 0xBEEF);
	CHECK_EQ(notify_event, SIWX_STREAM_EVENT_ERROR);
	CHECK_EQ(notify_error, ECONNABORTED);
	/* The raw end sees the connection go. */
	char c;
	CHECK_EQ(read(more[1], &c, 1), 0);
	close(more[1]);
	CHECK_NULL_ERRNO(lookup(ctx, 1), ENOENT);
}

int main(void)
{
	struct ibv_context *ctx = open_siwx("lo");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(scq != NULL && rcq != NULL);

	creation(ctx, pd, scq, rcq);
	creation_errors(ctx, pd, scq);
	states(pd, scq, rcq);
	post_errors(pd, scq, rcq);
	srq_qp(pd, scq);
	handover(ctx, pd, scq);

	/* Nothing holds the PD and CQs any more. */
	CHECK_EQ(ibv_destroy_cq(scq), 0);
	CHECK_EQ(ibv_destroy_cq(rcq), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), 0);
	CHECK_EQ(ibv_close_device(ctx), 0);
	printf("qp_verbs: ok\n");
	return 0;
}
