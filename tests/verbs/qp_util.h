// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* Helpers for the QP verbs tests: RC QPs on the public libibverbs API, moved
 * to INIT/RTR with ibv_modify_qp, and connected to each other the way the
 * connection manager does it, through the provider's siwx_qp_bind_stream()
 * found with dlsym() (providers/siwx/siwxdv.h). No MPA exchange happens: the
 * test hands both ends the same negotiated parameters, as two CMs that
 * agreed on them would. */
#ifndef SIWX_TESTS_VERBS_QP_UTIL_H_
#define SIWX_TESTS_VERBS_QP_UTIL_H_

#include "providers/siwx/siwxdv.h"
#include "verbs_test.h"

enum { kWaitMs = 20000 };

/* The provider's handover functions (the test fails if they are missing). */
siwx_qp_bind_stream_fn bind_stream_fn(void);
siwx_qp_disconnect_stream_fn disconnect_stream_fn(void);
siwx_qp_lookup_fn qp_lookup_fn(void);

/* A connected pair of stream sockets: a socketpair, or loopback TCP. */
void connected_fds(int tcp, int fds[2]);

/* An RC QP with these capacities (srq may be NULL); fails the test if the
 * provider refuses it. */
struct ibv_qp *create_rc_qp(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq,
			    struct ibv_srq *srq, uint32_t max_wr, uint32_t max_sge,
			    uint32_t max_inline);

/* ibv_modify_qp to `state` with only IBV_QP_STATE (plus the rdma_cm INIT
 * attributes for INIT); returns its result. */
int modify_state(struct ibv_qp *qp, enum ibv_qp_state state);

/* Default negotiated parameters: CRC on, no markers, IRD = ORD = 8. */
struct siwx_stream_params default_params(void);

/* Binds a and b to the two ends of a new connection with `params` (b gets
 * the mirrored marker directions). Both QPs must be in INIT or RTR. */
void bind_pair(struct ibv_qp *a, struct ibv_qp *b, int tcp,
	       const struct siwx_stream_params *params);

/* The QP's state (ibv_query_qp). */
enum ibv_qp_state state_of(struct ibv_qp *qp);

/* Waits up to kWaitMs for the QP to reach `state`; fails the test if not. */
void wait_state(struct ibv_qp *qp, enum ibv_qp_state state);

/* CLOCK_MONOTONIC in milliseconds. */
long long now_ms(void);

/* Polls `cq` until `n` completions arrived or kWaitMs passed; returns how
 * many were stored in wc. */
int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n);

/* True if nothing arrives on `cq` for `ms` milliseconds. */
int stays_empty(struct ibv_cq *cq, int ms);

/* Waits up to kWaitMs for one async event on ctx and reads it into *event
 * (the caller acknowledges it). Fails the test on timeout. */
void wait_async_event(struct ibv_context *ctx, struct ibv_async_event *event);

/* True if ctx's async fd has an event within `ms` milliseconds. */
int async_pending(struct ibv_context *ctx, int ms);

/* Fills `len` octets with a pattern that depends on seed and position. */
void fill_pattern(uint8_t *buf, size_t len, uint32_t seed);
/* Index of the first octet that differs from the pattern, or -1. */
long check_pattern(const uint8_t *buf, size_t len, uint32_t seed);

#endif /* SIWX_TESTS_VERBS_QP_UTIL_H_ */
