/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* The argument checks of ibv_create_qp / ibv_create_qp_ex, which do not need
 * a working QP: each bad request fails with its errno. (Successful creation
 * and the other QP verbs are tested in qp_verbs.c, qp_data.c, qp_events.c.) */
#include "verbs_test.h"

static struct ibv_qp_init_attr good_rc(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	return attr;
}

int main(void)
{
	struct ibv_context *ctx = open_siwx("lo");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_device_attr dev;
	CHECK_EQ(ibv_query_device(ctx, &dev), 0);
	struct ibv_qp_init_attr attr;

	/* iWARP has reliable connected QPs only. */
	attr = good_rc(cq);
	attr.qp_type = IBV_QPT_UD;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EOPNOTSUPP);
	attr.qp_type = IBV_QPT_UC;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EOPNOTSUPP);

	/* CQs: a send CQ, and a receive CQ unless there is an SRQ. */
	attr = good_rc(cq);
	attr.send_cq = NULL;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);
	attr = good_rc(cq);
	attr.recv_cq = NULL;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);

	/* A CQ of another context. */
	struct ibv_context *other = open_siwx("lo");
	struct ibv_cq *other_cq = ibv_create_cq(other, 8, NULL, NULL, 0);
	CHECK(other_cq != NULL);
	attr = good_rc(cq);
	attr.recv_cq = other_cq;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);
	CHECK_EQ(ibv_destroy_cq(other_cq), 0);
	CHECK_EQ(ibv_close_device(other), 0);

	/* Capacities. */
	attr = good_rc(cq);
	attr.cap.max_send_wr = 0;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);
	attr = good_rc(cq);
	attr.cap.max_send_wr = dev.max_qp_wr + 1;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);
	attr = good_rc(cq);
	attr.cap.max_recv_wr = dev.max_qp_wr + 1;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);
	attr = good_rc(cq);
	attr.cap.max_send_sge = dev.max_sge + 1;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);
	attr = good_rc(cq);
	attr.cap.max_recv_sge = dev.max_sge + 1;
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);
	attr = good_rc(cq);
	attr.cap.max_inline_data = 257; /* the engine copies up to 256 octets inline */
	CHECK_NULL_ERRNO(ibv_create_qp(pd, &attr), EINVAL);

	/* Extended creation: send_ops_flags only with operations siwx serves
	 * (qp_wr.c covers the API), no other extension beyond the PD. */
	struct ibv_qp_init_attr_ex attr_ex = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
	};
	CHECK_NULL_ERRNO(ibv_create_qp_ex(ctx, &attr_ex), EOPNOTSUPP);
	attr_ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	CHECK_NULL_ERRNO(ibv_create_qp_ex(ctx, &attr_ex), EOPNOTSUPP);

	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), 0);
	CHECK_EQ(ibv_close_device(ctx), 0);
	printf("qp_args: ok\n");
	return 0;
}
