/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
#define _GNU_SOURCE
#include "qp_util.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void *provider_symbol(const char *name)
{
	/* The provider is a dependency of the preloaded shim: global scope. */
	void *fn = dlsym(RTLD_DEFAULT, name);
	if (fn == NULL) {
		fprintf(stderr, "%s is not exported by the provider (run under siwx-run)\n", name);
		exit(1);
	}
	return fn;
}

siwx_qp_bind_stream_fn bind_stream_fn(void)
{
	return (siwx_qp_bind_stream_fn)provider_symbol("siwx_qp_bind_stream");
}

siwx_qp_disconnect_stream_fn disconnect_stream_fn(void)
{
	return (siwx_qp_disconnect_stream_fn)provider_symbol("siwx_qp_disconnect_stream");
}

siwx_qp_lookup_fn qp_lookup_fn(void)
{
	return (siwx_qp_lookup_fn)provider_symbol("siwx_qp_lookup");
}

void connected_fds(int tcp, int fds[2])
{
	if (!tcp) {
		CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
		return;
	}
	int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(listener >= 0);
	struct sockaddr_in addr = {.sin_family = AF_INET,
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(addr);
	CHECK_EQ(bind(listener, (struct sockaddr *)&addr, len), 0);
	CHECK_EQ(listen(listener, 1), 0);
	CHECK_EQ(getsockname(listener, (struct sockaddr *)&addr, &len), 0);
	fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fds[0] >= 0);
	CHECK_EQ(connect(fds[0], (struct sockaddr *)&addr, len), 0);
	fds[1] = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
	CHECK(fds[1] >= 0);
	close(listener);
}

struct ibv_qp *create_rc_qp(struct ibv_pd *pd, struct ibv_cq *send_cq, struct ibv_cq *recv_cq,
			    struct ibv_srq *srq, uint32_t max_wr, uint32_t max_sge,
			    uint32_t max_inline)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = send_cq,
		.recv_cq = recv_cq,
		.srq = srq,
		.cap = {.max_send_wr = max_wr,
			.max_recv_wr = max_wr,
			.max_send_sge = max_sge,
			.max_recv_sge = max_sge,
			.max_inline_data = max_inline},
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	CHECK(qp != NULL);
	return qp;
}

int modify_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr = {.qp_state = state};
	int mask = IBV_QP_STATE;

	if (state == IBV_QPS_INIT) {
		/* What rdma_init_qp_attr() gives for INIT on iWARP. */
		attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		attr.port_num = 1;
		mask |= IBV_QP_ACCESS_FLAGS | IBV_QP_PORT;
	}
	return ibv_modify_qp(qp, &attr, mask);
}

struct siwx_stream_params default_params(void)
{
	struct siwx_stream_params p = {
		.size = sizeof(p),
		.mpa_dialect = SIWX_MPA_DIALECT_V2,
		.mpa_revision = 2,
		.crc = 1,
		.ird = 8,
		.ord = 8,
	};
	return p;
}

void bind_pair(struct ibv_qp *a, struct ibv_qp *b, int tcp,
	       const struct siwx_stream_params *params)
{
	int fds[2];
	connected_fds(tcp, fds);
	struct siwx_stream_params pa = *params;
	struct siwx_stream_params pb = *params;
	/* Directions are named from each end. */
	pb.tx_markers = params->rx_markers;
	pb.rx_markers = params->tx_markers;
	siwx_qp_bind_stream_fn bind = bind_stream_fn();
	CHECK_EQ(bind(a, fds[0], &pa, NULL), 0);
	CHECK_EQ(bind(b, fds[1], &pb, NULL), 0);
}

enum ibv_qp_state state_of(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK_EQ(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init), 0);
	return attr.qp_state;
}

void wait_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
	for (int i = 0; i < kWaitMs && state_of(qp) != state; i++)
		usleep(1000);
	CHECK_EQ(state_of(qp), state);
}

long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	const long long deadline = now_ms() + kWaitMs;
	while (got < n && now_ms() < deadline) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		CHECK(r >= 0);
		got += r;
		if (r == 0)
			usleep(100);
	}
	return got;
}

int stays_empty(struct ibv_cq *cq, int ms)
{
	struct ibv_wc wc;
	usleep((useconds_t)ms * 1000);
	return ibv_poll_cq(cq, 1, &wc) == 0;
}

int async_pending(struct ibv_context *ctx, int ms)
{
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	return poll(&pfd, 1, ms) == 1;
}

void wait_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	CHECK(async_pending(ctx, kWaitMs));
	CHECK_EQ(ibv_get_async_event(ctx, event), 0);
}

void fill_pattern(uint8_t *buf, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)((i * 131 + seed * 29 + (i >> 8) * 7) & 0xFF);
}

long check_pattern(const uint8_t *buf, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != (uint8_t)((i * 131 + seed * 29 + (i >> 8) * 7) & 0xFF))
			return (long)i;
	return -1;
}
