/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* Protection domains and memory registration through the stock libibverbs
 * API: every access flag combination rdma-core accepts, the iova variants,
 * and the errors for bad flags, lengths, addresses and busy PDs. */
#define _GNU_SOURCE
#include "verbs_test.h"

#include <sys/mman.h>
#include <unistd.h>

/* The flags the device implements (values of enum ibv_access_flags). */
static const unsigned int kBaseFlags[] = {
	IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
	IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_MW_BIND, IBV_ACCESS_ZERO_BASED,
};

static int valid_combination(unsigned int access)
{
	/* Remote write and remote atomic need local write (ibv_reg_mr(3)). */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return 0;
	return 1;
}

static void check_mr(struct ibv_mr *mr, struct ibv_pd *pd, void *addr, size_t length)
{
	CHECK(mr != NULL);
	CHECK(mr->context == pd->context);
	CHECK(mr->pd == pd);
	CHECK(mr->addr == addr);
	CHECK_EQ(mr->length, length);
	/* One STag serves local and remote access; STags 0..255 are never used. */
	CHECK_EQ(mr->lkey, mr->rkey);
	CHECK(mr->lkey > 255);
}

int main(void)
{
	struct ibv_context *ctx = open_siwx("lo");
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	const size_t length = 4 * page;
	unsigned char *buffer = aligned_alloc(page, length);
	CHECK(buffer != NULL);

	/* PDs. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	CHECK(pd->context == ctx);
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	CHECK(pd2 != NULL);
	CHECK(pd2->handle != pd->handle);
	CHECK_EQ(ibv_dealloc_pd(pd2), 0);
	for (int i = 0; i < 1000; i++) {
		struct ibv_pd *p = ibv_alloc_pd(ctx);
		CHECK(p != NULL);
		CHECK_EQ(ibv_dealloc_pd(p), 0);
	}

	/* Every combination of the implemented flags, alone and with the hint
	 * and optional flags that are accepted and ignored. */
	const unsigned int extras[] = {0, IBV_ACCESS_HUGETLB, IBV_ACCESS_RELAXED_ORDERING,
				       1u << 29 /* last optional bit */};
	int registered = 0, refused = 0;
	for (unsigned int combo = 0; combo < 64; combo++) {
		unsigned int access = 0;
		for (int bit = 0; bit < 6; bit++)
			if (combo & (1u << bit))
				access |= kBaseFlags[bit];
		for (size_t e = 0; e < sizeof(extras) / sizeof(extras[0]); e++) {
			const unsigned int flags = access | extras[e];
			errno = 0;
			struct ibv_mr *mr = ibv_reg_mr(pd, buffer, length, (int)flags);
			if (valid_combination(access)) {
				check_mr(mr, pd, buffer, length);
				CHECK_EQ(ibv_dereg_mr(mr), 0);
				registered++;
			} else {
				CHECK(mr == NULL);
				CHECK_EQ(errno, EINVAL);
				refused++;
			}
		}
	}
	/* 64 combinations; 24 have remote write or atomic without local write. */
	CHECK_EQ(registered, 40 * 4);
	CHECK_EQ(refused, 24 * 4);

	/* Flags that fail. */
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, buffer, length, IBV_ACCESS_ON_DEMAND), EOPNOTSUPP);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, buffer, length,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND), EOPNOTSUPP);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, buffer, length, 1 << 8), EINVAL);  /* undefined */
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, buffer, length, 1 << 19), EINVAL); /* undefined */
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, buffer, length, (int)(1u << 30)), EINVAL);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, buffer, length, IBV_ACCESS_REMOTE_WRITE), EINVAL);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, buffer, length, IBV_ACCESS_REMOTE_ATOMIC), EINVAL);

	/* Lengths and addresses. */
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, buffer, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	void *hole = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(hole != MAP_FAILED);
	CHECK_EQ(munmap((char *)hole + page, page), 0); /* second page unmapped */
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, hole, 2 * page, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	struct ibv_mr *mr = ibv_reg_mr(pd, hole, page, IBV_ACCESS_LOCAL_WRITE);
	check_mr(mr, pd, hole, page);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(munmap(hole, page), 0);
	/* Read-only memory: registering it for writing would let a peer's RDMA
	 * Write fault the process, so it fails with EFAULT as the kernel's page
	 * pinning for write does; registering it for remote reading works. */
	void *ro = mmap(NULL, 2 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(ro != MAP_FAILED);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, ro, 2 * page,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE), EFAULT);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, ro, page, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, ro, page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						      IBV_ACCESS_REMOTE_ATOMIC), EFAULT);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, ro, page, IBV_ACCESS_MW_BIND), EFAULT);
	mr = ibv_reg_mr(pd, ro, 2 * page, IBV_ACCESS_REMOTE_READ);
	check_mr(mr, pd, ro, 2 * page);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	mr = ibv_reg_mr(pd, ro, page, 0);
	check_mr(mr, pd, ro, page);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	/* Writable then read-only: the read-only half decides. */
	CHECK_EQ(mprotect(ro, page, PROT_READ | PROT_WRITE), 0);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, ro, 2 * page, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	mr = ibv_reg_mr(pd, ro, page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	check_mr(mr, pd, ro, page);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	/* No access at all: not even remote reading. */
	CHECK_EQ(mprotect(ro, 2 * page, PROT_NONE), 0);
	CHECK_NULL_ERRNO(ibv_reg_mr(pd, ro, page, IBV_ACCESS_REMOTE_READ), EFAULT);
	CHECK_EQ(munmap(ro, 2 * page), 0);
	/* An unaligned sub-range of a buffer registers as given. */
	mr = ibv_reg_mr(pd, buffer + 3, 100, IBV_ACCESS_REMOTE_READ);
	check_mr(mr, pd, buffer + 3, 100);
	CHECK_EQ(ibv_dereg_mr(mr), 0);

	/* iova variants: the provider gets the IOVA, libibverbs fills the rest. */
	mr = ibv_reg_mr_iova(pd, buffer, length, 0x10000, IBV_ACCESS_LOCAL_WRITE);
	check_mr(mr, pd, buffer, length);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	mr = ibv_reg_mr_iova2(pd, buffer, length, 0,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED);
	check_mr(mr, pd, buffer, length);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_NULL_ERRNO(ibv_reg_mr_iova2(pd, buffer, length, 0x1000, 1u << 8), EINVAL);
	/* An IOVA range that wraps the 64-bit TO space is refused. */
	CHECK_NULL_ERRNO(ibv_reg_mr_iova2(pd, buffer, length, UINT64_MAX - 10,
					  IBV_ACCESS_LOCAL_WRITE), EINVAL);

	/* Many regions at once have distinct keys. */
	enum { kMany = 512 };
	struct ibv_mr *many[kMany];
	for (int i = 0; i < kMany; i++) {
		many[i] = ibv_reg_mr(pd, buffer + (i % length), 1, IBV_ACCESS_LOCAL_WRITE);
		check_mr(many[i], pd, buffer + (i % length), 1);
		for (int j = 0; j < i; j++)
			CHECK(many[j]->lkey != many[i]->lkey);
	}

	/* A PD with registered memory cannot go. */
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	for (int i = 0; i < kMany; i++)
		CHECK_EQ(ibv_dereg_mr(many[i]), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), 0);

	/* Regions of one context are not visible in another one's PD. */
	struct ibv_context *other = open_siwx("lo");
	struct ibv_pd *other_pd = ibv_alloc_pd(other);
	CHECK(other_pd != NULL);
	mr = ibv_reg_mr(other_pd, buffer, length, IBV_ACCESS_LOCAL_WRITE);
	check_mr(mr, other_pd, buffer, length);
	CHECK(mr->context == other);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(ibv_dealloc_pd(other_pd), 0);
	CHECK_EQ(ibv_close_device(other), 0);

	free(buffer);
	CHECK_EQ(ibv_close_device(ctx), 0);
	printf("pd_mr: %d registrations, %d refusals\n", registered, refused);
	return 0;
}
