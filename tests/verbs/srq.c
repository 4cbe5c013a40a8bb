/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* Shared receive queues through the stock libibverbs API: create, query,
 * modify (limit), post, destroy, and the errors for bad arguments. */
#include "verbs_test.h"

static void fill_wrs(struct ibv_recv_wr *wrs, struct ibv_sge *sges, int count, int sge_per_wr,
		     uint32_t lkey, char *buffer)
{
	for (int i = 0; i < count; i++) {
		for (int s = 0; s < sge_per_wr; s++) {
			sges[i * sge_per_wr + s].addr = (uintptr_t)(buffer + 64 * (i * sge_per_wr + s));
			sges[i * sge_per_wr + s].length = 64;
			sges[i * sge_per_wr + s].lkey = lkey;
		}
		wrs[i].wr_id = 1000 + (uint64_t)i;
		wrs[i].sg_list = sge_per_wr > 0 ? &sges[i * sge_per_wr] : NULL;
		wrs[i].num_sge = sge_per_wr;
		wrs[i].next = (i + 1 < count) ? &wrs[i + 1] : NULL;
	}
}

int main(void)
{
	struct ibv_context *ctx = open_siwx("lo");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	static char buffer[64 * 64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buffer, sizeof(buffer), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	int cookie = 7;

	/* Create: srq_limit is ignored, the actual sizes come back. */
	struct ibv_srq_init_attr init = {
		.srq_context = &cookie,
		.attr = {.max_wr = 8, .max_sge = 2, .srq_limit = 5},
	};
	struct ibv_srq *srq = ibv_create_srq(pd, &init);
	CHECK(srq != NULL);
	CHECK(srq->context == ctx);
	CHECK(srq->pd == pd);
	CHECK(srq->srq_context == &cookie);
	CHECK_EQ(init.attr.max_wr, 8);
	CHECK_EQ(init.attr.max_sge, 2);

	struct ibv_srq_attr attr;
	memset(&attr, 0xAB, sizeof(attr));
	CHECK_EQ(ibv_query_srq(srq, &attr), 0);
	CHECK_EQ(attr.max_wr, 8);
	CHECK_EQ(attr.max_sge, 2);
	CHECK_EQ(attr.srq_limit, 0); /* not armed */

	/* Limit: arm, re-arm, disarm; above max_wr is refused and changes nothing. */
	attr.srq_limit = 4;
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
	CHECK_EQ(ibv_query_srq(srq, &attr), 0);
	CHECK_EQ(attr.srq_limit, 4);
	attr.srq_limit = 9;
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), EINVAL);
	CHECK_EQ(ibv_query_srq(srq, &attr), 0);
	CHECK_EQ(attr.srq_limit, 4);
	attr.srq_limit = 8;
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
	CHECK_EQ(ibv_query_srq(srq, &attr), 0);
	CHECK_EQ(attr.srq_limit, 8);
	attr.srq_limit = 0;
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
	CHECK_EQ(ibv_query_srq(srq, &attr), 0);
	CHECK_EQ(attr.srq_limit, 0);
	/* Resizing is not offered (no IBV_DEVICE_SRQ_RESIZE); unknown bits are invalid. */
	attr.max_wr = 16;
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EOPNOTSUPP);
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT), EOPNOTSUPP);
	CHECK_EQ(ibv_modify_srq(srq, &attr, 1 << 2), EINVAL);
	CHECK_EQ(ibv_query_srq(srq, &attr), 0);
	CHECK_EQ(attr.max_wr, 8);

	/* Posting: up to max_wr WRs fit; *bad_wr names the first one refused. */
	struct ibv_recv_wr wrs[10];
	struct ibv_sge sges[30];
	struct ibv_recv_wr *bad = NULL;
	fill_wrs(wrs, sges, 6, 2, mr->lkey, buffer);
	CHECK_EQ(ibv_post_srq_recv(srq, &wrs[0], &bad), 0);
	fill_wrs(wrs, sges, 3, 1, mr->lkey, buffer);
	bad = NULL;
	CHECK_EQ(ibv_post_srq_recv(srq, &wrs[0], &bad), ENOMEM); /* 6 + 2 fit, the 3rd not */
	CHECK(bad == &wrs[2]);

	/* Too many SGEs, negative counts, missing lists. */
	struct ibv_srq *srq2 = ibv_create_srq(pd, &(struct ibv_srq_init_attr){
						       .attr = {.max_wr = 4, .max_sge = 1}});
	CHECK(srq2 != NULL);
	fill_wrs(wrs, sges, 1, 2, mr->lkey, buffer);
	bad = NULL;
	CHECK_EQ(ibv_post_srq_recv(srq2, &wrs[0], &bad), EINVAL);
	CHECK(bad == &wrs[0]);
	fill_wrs(wrs, sges, 3, 1, mr->lkey, buffer);
	wrs[1].num_sge = -1;
	bad = NULL;
	CHECK_EQ(ibv_post_srq_recv(srq2, &wrs[0], &bad), EINVAL); /* the first one went in */
	CHECK(bad == &wrs[1]);
	fill_wrs(wrs, sges, 1, 1, mr->lkey, buffer);
	wrs[0].sg_list = NULL;
	bad = NULL;
	CHECK_EQ(ibv_post_srq_recv(srq2, &wrs[0], &bad), EINVAL);
	CHECK(bad == &wrs[0]);
	/* Zero SGEs is a valid (zero-length) receive. */
	fill_wrs(wrs, sges, 3, 0, mr->lkey, buffer);
	CHECK_EQ(ibv_post_srq_recv(srq2, &wrs[0], &bad), 0); /* 1 + 3 = max_wr */
	fill_wrs(wrs, sges, 1, 0, mr->lkey, buffer);
	bad = NULL;
	CHECK_EQ(ibv_post_srq_recv(srq2, &wrs[0], &bad), ENOMEM);
	CHECK(bad == &wrs[0]);

	/* Bad create arguments. */
	struct ibv_device_attr dev;
	CHECK_EQ(ibv_query_device(ctx, &dev), 0);
	CHECK_NULL_ERRNO(ibv_create_srq(pd, &(struct ibv_srq_init_attr){.attr = {.max_wr = 0}}),
			 EINVAL);
	CHECK_NULL_ERRNO(ibv_create_srq(pd, &(struct ibv_srq_init_attr){
						    .attr = {.max_wr = (uint32_t)dev.max_srq_wr + 1}}),
			 EINVAL);
	CHECK_NULL_ERRNO(ibv_create_srq(pd, &(struct ibv_srq_init_attr){
						    .attr = {.max_wr = 4,
							     .max_sge = (uint32_t)dev.max_srq_sge + 1}}),
			 EINVAL);

	/* The extended creator with only a PD is the plain one. */
	struct ibv_srq_init_attr_ex init_ex = {
		.attr = {.max_wr = 2, .max_sge = 1},
		.comp_mask = IBV_SRQ_INIT_ATTR_PD,
		.pd = pd,
	};
	struct ibv_srq *srq3 = ibv_create_srq_ex(ctx, &init_ex);
	CHECK(srq3 != NULL);
	CHECK_EQ(init_ex.attr.max_wr, 2);

	/* A PD with SRQs (and a registered MR) cannot go; teardown in order. */
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_destroy_srq(srq3), 0);
	CHECK_EQ(ibv_destroy_srq(srq2), 0);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY); /* the MR */
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), 0);

	/* Create and destroy many. */
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	for (int i = 0; i < 300; i++) {
		struct ibv_srq *s = ibv_create_srq(pd, &(struct ibv_srq_init_attr){
							       .attr = {.max_wr = 1 + i, .max_sge = i % 17}});
		CHECK(s != NULL);
		CHECK_EQ(ibv_destroy_srq(s), 0);
	}
	CHECK_EQ(ibv_dealloc_pd(pd), 0);
	CHECK_EQ(ibv_close_device(ctx), 0);
	printf("srq: ok\n");
	return 0;
}
