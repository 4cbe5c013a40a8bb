// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* Out-of-band QP connect (docs/out-of-band-connect.md), as ibv_rc_pingpong
 * and perftest without -R do it: two processes exchange QPN, PSN, GID, rkey
 * and address over their own socket and move their QPs through INIT, RTR
 * and RTS with ibv_modify_qp; nothing else connects them. Then a Send
 * posted right after the RTS request (before the stream can be up, so it
 * waits in the send queue), an RDMA Write and an RDMA Read, every octet
 * checked, and a Send after the peer destroyed its QP.
 *
 * Then the failures, in one process: a peer GID whose port refuses
 * connections (this end connects: ERR, IBV_EVENT_QP_FATAL, posted WRs
 * flushed), a listener with no such QP (it refuses the MPA Request), and a
 * peer that never connects (this end waits: the same after
 * SIWX_OOB_TIMEOUT_MS, which CTest sets to 3000). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qp_util.h"
#include "verbs_test.h"

enum { kBufSize = 1 << 16, kMsg = 4096, kSendOff = 0, kRecvOff = 8192, kWriteOff = 16384,
       kReadSrcOff = 32768, kReadDstOff = 49152 };

struct dest {
	uint32_t qpn;
	uint32_t psn;
	uint32_t rkey;
	uint64_t addr;
	union ibv_gid gid;
};

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
};

static void xfer(int fd, void *data, size_t len, int out)
{
	uint8_t *p = data;
	while (len > 0) {
		ssize_t n = out ? write(fd, p, len) : read(fd, p, len);
		CHECK(n > 0);
		p += n;
		len -= (size_t)n;
	}
}

static void barrier(int fd)
{
	char c = 'b';
	xfer(fd, &c, 1, 1);
	xfer(fd, &c, 1, 0);
}

static void open_side(struct side *s)
{
	s->ctx = open_siwx("lo");
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd != NULL);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	CHECK(s->cq != NULL);
	s->buf = calloc(1, kBufSize);
	CHECK(s->buf != NULL);
	s->mr = ibv_reg_mr(s->pd, s->buf, kBufSize,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ);
	CHECK(s->mr != NULL);
	s->qp = create_rc_qp(s->pd, s->cq, s->cq, NULL, 16, 1, 0);
	struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				   .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						      IBV_ACCESS_REMOTE_READ};
	CHECK_EQ(ibv_modify_qp(s->qp, &attr,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS),
		 0);
}

static void close_side(struct side *s)
{
	CHECK_EQ(ibv_destroy_qp(s->qp), 0);
	CHECK_EQ(ibv_dereg_mr(s->mr), 0);
	CHECK_EQ(ibv_destroy_cq(s->cq), 0);
	CHECK_EQ(ibv_dealloc_pd(s->pd), 0);
	CHECK_EQ(ibv_close_device(s->ctx), 0);
	free(s->buf);
}

enum step { kBoth, kRtrOnly, kRtsOnly };

/* What ibv_rc_pingpong's pp_connect_ctx does, with the GRH that -g adds:
 * RTR, then RTS, or only one of them. */
static int connect_qp_to(struct ibv_qp *qp, const struct dest *peer, enum step step)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer->qpn,
		.rq_psn = peer->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {.is_global = 1, .dlid = 0, .sl = 0, .port_num = 1,
			    .grh = {.dgid = peer->gid, .hop_limit = 1, .sgid_index = 0}},
	};
	if (step != kRtsOnly) {
		int rc = ibv_modify_qp(qp, &attr,
				       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
		if (rc != 0 || step == kRtrOnly)
			return rc;
	}
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = 1;
	attr.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &attr,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int connect_qp(struct ibv_qp *qp, const struct dest *peer)
{
	return connect_qp_to(qp, peer, kBoth);
}

static void post(struct side *s, enum ibv_wr_opcode op, uint32_t off, uint32_t len,
		 const struct dest *peer, uint32_t remote_off, uint64_t wr_id)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + off), .length = len,
			      .lkey = s->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad = NULL;
	if (peer != NULL) {
		wr.wr.rdma.remote_addr = peer->addr + remote_off;
		wr.wr.rdma.rkey = peer->rkey;
	}
	CHECK_EQ(ibv_post_send(s->qp, &wr, &bad), 0);
}

static void post_recv(struct side *s, uint32_t off, uint32_t len, uint64_t wr_id)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + off), .length = len,
			      .lkey = s->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *bad = NULL;
	CHECK_EQ(ibv_post_recv(s->qp, &wr, &bad), 0);
}

/* One completion with this wr_id and status. */
static void expect_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status)
{
	struct ibv_wc wc;
	CHECK_EQ(poll_n(cq, &wc, 1), 1);
	if (wc.wr_id != wr_id || wc.status != status)
		fprintf(stderr, "completion wr_id %llu status %s, expected %llu %s\n",
			(unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
			(unsigned long long)wr_id, ibv_wc_status_str(status));
	CHECK_EQ_U64(wc.wr_id, wr_id);
	CHECK_EQ(wc.status, status);
}

/* The peer destroyed its QP. On InfiniBand nothing acknowledges a Send any
 * more: it waits out the transport timeout of the RTS attributes (timeout
 * 14, retry_cnt 7: 8 x 4.096 us x 2^14, 537 ms) and fails with retry count
 * exceeded, and the QP is in error. A QP connected out of band does the
 * same; flushed at once, such a Send failed ibv_srq_pingpong -q 4, which
 * posts Sends its peer never takes and polls their completions together
 * with its last message. A later Send flushes at once. */
static void send_after_peer_destroyed(struct side *s)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK_EQ(ibv_query_qp(s->qp, &attr, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT, &init), 0);
	CHECK_EQ(attr.timeout, 14);
	CHECK_EQ(attr.retry_cnt, 7);
	wait_state(s->qp, IBV_QPS_ERR);
	const long long posted = now_ms();
	post(s, IBV_WR_SEND, kSendOff, 16, NULL, 0, 5);
	expect_wc(s->cq, 5, IBV_WC_RETRY_EXC_ERR);
	CHECK(now_ms() - posted >= 536);
	post(s, IBV_WR_SEND, kSendOff, 16, NULL, 0, 6);
	expect_wc(s->cq, 6, IBV_WC_WR_FLUSH_ERR);
}

/* Both processes: `first` is the one that writes and reads. */
static void run_peer(int fd, int first)
{
	struct side s;
	open_side(&s);
	const uint32_t seed = first ? 1 : 2;
	fill_pattern(s.buf + kSendOff, kMsg, seed);
	fill_pattern(s.buf + kReadSrcOff, kMsg, seed + 10);
	post_recv(&s, kRecvOff, kMsg, 100);
	/* The second side also takes the first side's last Send: posted now,
	 * since a Send finding no receive ends an iWARP stream (no RNR). */
	if (!first)
		post_recv(&s, kRecvOff + kMsg, kMsg, 101);

	struct dest me = {.qpn = s.qp->qp_num, .psn = 1, .rkey = s.mr->rkey,
			  .addr = (uintptr_t)s.buf};
	CHECK_EQ(ibv_query_gid(s.ctx, 1, 0, &me.gid), 0);
	struct dest peer;
	if (first) {
		xfer(fd, &me, sizeof(me), 1);
		xfer(fd, &peer, sizeof(peer), 0);
	} else {
		xfer(fd, &peer, sizeof(peer), 0);
		xfer(fd, &me, sizeof(me), 1);
	}
	CHECK_EQ(connect_qp(s.qp, &peer), 0);

	/* Posted at once: the stream may not be up yet; the Send waits. */
	post(&s, IBV_WR_SEND, kSendOff, kMsg, NULL, 0, 1);
	struct ibv_wc wc[2];
	CHECK_EQ(poll_n(s.cq, wc, 2), 2);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(wc[i].status, IBV_WC_SUCCESS);
		if (wc[i].wr_id == 100) {
			CHECK_EQ(wc[i].opcode, IBV_WC_RECV);
			CHECK_EQ(wc[i].byte_len, kMsg);
		} else {
			CHECK_EQ_U64(wc[i].wr_id, 1);
		}
	}
	CHECK_EQ(check_pattern(s.buf + kRecvOff, kMsg, first ? 2 : 1), -1);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK_EQ(ibv_query_qp(s.qp, &attr, IBV_QP_STATE, &init), 0);
	CHECK_EQ(attr.qp_state, IBV_QPS_RTS);

	/* RDMA Write into the peer, then RDMA Read from it. */
	if (first) {
		fill_pattern(s.buf + kSendOff, kMsg, 7);
		post(&s, IBV_WR_RDMA_WRITE, kSendOff, kMsg, &peer, kWriteOff, 2);
		expect_wc(s.cq, 2, IBV_WC_SUCCESS);
		post(&s, IBV_WR_RDMA_READ, kReadDstOff, kMsg, &peer, kReadSrcOff, 3);
		expect_wc(s.cq, 3, IBV_WC_SUCCESS);
		CHECK_EQ(check_pattern(s.buf + kReadDstOff, kMsg, 2 + 10), -1);
		/* A Send after the Write: its arrival says the Write is placed. */
		post(&s, IBV_WR_SEND, kSendOff, 16, NULL, 0, 4);
		expect_wc(s.cq, 4, IBV_WC_SUCCESS);
	} else {
		expect_wc(s.cq, 101, IBV_WC_SUCCESS);
		CHECK_EQ(check_pattern(s.buf + kWriteOff, kMsg, 7), -1);
	}
	barrier(fd);
	/* The second side destroys its QP first. */
	if (first)
		send_after_peer_destroyed(&s);
	close_side(&s);
}

/* A QP armed for a peer that is not there: the connect fails, or the peer
 * never comes; ERR, IBV_EVENT_QP_FATAL, every WR flushed. */
static void expect_failure(const struct dest *peer)
{
	struct side s;
	open_side(&s);
	post_recv(&s, kRecvOff, kMsg, 200);
	CHECK_EQ(connect_qp_to(s.qp, peer, kRtrOnly), 0);
	/* The connect may have failed already (a refusal on loopback is fast):
	 * then the QP is in ERR and the move to RTS is EINVAL. */
	const int rts = connect_qp_to(s.qp, peer, kRtsOnly);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	if (rts != 0) {
		CHECK_EQ(rts, EINVAL);
		CHECK_EQ(ibv_query_qp(s.qp, &attr, IBV_QP_STATE, &init), 0);
		CHECK_EQ(attr.qp_state, IBV_QPS_ERR);
	}
	/* Queued behind the connect, or flushed at once in ERR. */
	post(&s, IBV_WR_SEND, kSendOff, kMsg, NULL, 0, 201);
	struct ibv_async_event event;
	wait_async_event(s.ctx, &event);
	CHECK_EQ(event.event_type, IBV_EVENT_QP_FATAL);
	CHECK(event.element.qp == s.qp);
	ibv_ack_async_event(&event);
	struct ibv_wc wc[2];
	CHECK_EQ(poll_n(s.cq, wc, 2), 2);
	CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
	CHECK_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
	CHECK_EQ(ibv_query_qp(s.qp, &attr, IBV_QP_STATE, &init), 0);
	CHECK_EQ(attr.qp_state, IBV_QPS_ERR);
	close_side(&s);
}

static void failures(void)
{
	struct side probe;
	open_side(&probe);
	union ibv_gid mine;
	CHECK_EQ(ibv_query_gid(probe.ctx, 1, 0, &mine), 0);
	close_side(&probe);
	const uint16_t my_port = (uint16_t)(mine.raw[8] << 8 | mine.raw[9]);

	/* A port above ours (so this end connects) that refuses: bound, never
	 * listening. */
	int holder = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(holder >= 0);
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	uint16_t port = 0;
	for (uint32_t p = 65535; p > my_port; p--) {
		in.sin_port = htons((uint16_t)p);
		if (bind(holder, (struct sockaddr *)&in, sizeof(in)) == 0) {
			port = (uint16_t)p;
			break;
		}
	}
	CHECK(port != 0);
	struct dest refusing = {.qpn = 1, .psn = 1, .gid = mine};
	refusing.gid.raw[8] = (uint8_t)(port >> 8);
	refusing.gid.raw[9] = (uint8_t)port;
	expect_failure(&refusing);
	close(holder);

	/* Our own listener, for a QP number no QP has: this end connects (its
	 * QPN is smaller), the listener refuses (MPA Reply with R = 1). */
	struct dest absent = {.qpn = 0xffffff, .psn = 1, .gid = mine};
	expect_failure(&absent);

	/* Port 1 is below ours: this end waits, and no one ever connects. */
	struct dest silent = {.qpn = 1, .psn = 1, .gid = mine};
	silent.gid.raw[8] = 0;
	silent.gid.raw[9] = 1;
	expect_failure(&silent);
}

int main(void)
{
	int fds[2];
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
	/* Before any verbs call: the child opens its own device context. */
	pid_t child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		close(fds[0]);
		run_peer(fds[1], 0);
		_exit(0);
	}
	close(fds[1]);
	run_peer(fds[0], 1);
	int status = 0;
	CHECK_EQ(waitpid(child, &status, 0), child);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(fds[0]);

	failures();
	printf("qp_oob: connected out of band, Send/Write/Read checked; refused and silent peers "
	       "fail the QP\n");
	return 0;
}
