// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* Helpers for the verbs tests: C programs that use only the public
 * libibverbs API and run under siwx-run (CTest label "verbs").
 *
 * A failed check prints file, line, the expression and the values involved,
 * and exits with status 1; a program that reaches its end exits 0. */
#ifndef SIWX_TESTS_VERBS_VERBS_TEST_H_
#define SIWX_TESTS_VERBS_VERBS_TEST_H_

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: CHECK(%s) failed (errno %d: %s)\n", \
				__FILE__, __LINE__, #cond, errno, strerror(errno)); \
			exit(1);                                                 \
		}                                                                \
	} while (0)

#define CHECK_EQ(a, b)                                                           \
	do {                                                                     \
		long long va_ = (long long)(a);                                  \
		long long vb_ = (long long)(b);                                  \
		if (va_ != vb_) {                                                \
			fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %lld != %lld\n", \
				__FILE__, __LINE__, #a, #b, va_, vb_);           \
			exit(1);                                                 \
		}                                                                \
	} while (0)

#define CHECK_EQ_U64(a, b)                                                       \
	do {                                                                     \
		unsigned long long va_ = (unsigned long long)(a);                \
		unsigned long long vb_ = (unsigned long long)(b);                \
		if (va_ != vb_) {                                                \
			fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: 0x%llx != 0x%llx\n", \
				__FILE__, __LINE__, #a, #b, va_, vb_);           \
			exit(1);                                                 \
		}                                                                \
	} while (0)

/* A creator returned NULL and set errno to `err`. */
#define CHECK_NULL_ERRNO(expr, err)                                              \
	do {                                                                     \
		errno = 0;                                                       \
		void *p_ = (void *)(expr);                                       \
		if (p_ != NULL || errno != (err)) {                              \
			fprintf(stderr, "%s:%d: %s: want NULL/errno %d (%s), got %p/errno %d\n", \
				__FILE__, __LINE__, #expr, (err), strerror(err), p_, errno); \
			exit(1);                                                 \
		}                                                                \
	} while (0)

/* The siwx device for interface `ifname` ("lo" -> siwx_lo) from `list`. */
struct ibv_device *find_siwx_device(struct ibv_device **list, const char *ifname);

/* Opens siwx_<ifname>; the device list is freed before returning. */
struct ibv_context *open_siwx(const char *ifname);

/* The interface's hardware address, all zero if it has none. 0 on success. */
int interface_mac(const char *ifname, uint8_t mac[6]);

/* Calls fn(ifname, arg) for every interface with an IPv4 or IPv6 address
 * whose name fits a siwx device name; returns how many. */
int for_each_addressed_interface(void (*fn)(const char *ifname, void *arg), void *arg);

#endif /* SIWX_TESTS_VERBS_VERBS_TEST_H_ */
