/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* twohost_traffic: verified RDMA traffic between two hosts over rdma_cm, for
 * the two-host tests (tests/twohost/). Every octet that arrives is checked
 * against the pattern it was sent with, and every work request must come
 * back as exactly one completion with the expected wr_id, opcode, status and
 * length.
 *
 * The client drives rounds; round i with size s:
 *   client -> server  Send DATA(i): 16-octet header + s octets
 *   client -> server  RDMA Write of s octets into the server's write area
 *   client -> server  Send WRITE_DONE(i): header only (the Write is placed
 *                     before it, RFC 5040 5.5); the server checks the area
 *   server -> client  Send REPLY(i): header + s octets; the server has
 *                     filled its read area for round i
 *   client <- server  RDMA Read of s octets from the read area
 * The server's area address and STag travel in the connection's private data.
 *
 * Fault mode (--fault): the run is expected to break (the peer killed, an
 * RST, a partition, a bit flip under CRC). The first sign of it — an error
 * completion, a QP async event, an rdma_cm event, or no progress for
 * --stall-ms (then the program calls rdma_disconnect, as an application that
 * gives up would) — starts the clock. From then on the program posts nothing
 * and waits until every outstanding work request has completed and
 * RDMA_CM_EVENT_DISCONNECTED has arrived; both must happen within --bound-ms
 * (default 10000: siwx's teardown bound) plus --slack-ms (default 2000, for
 * scheduling on a loaded machine). A successful completion after the fault is
 * allowed (it was done before), and its data is still checked.
 *
 * --tolerate-corruption counts octets that differ from the pattern instead
 * of failing (the CRC-off bit-flip run, which documents what happens).
 *
 * --connections N runs N connections one after the other, --rounds each.
 * The server then checks that its open fds, threads and heap in use are
 * not above what it had after the first connection (which opened the
 * device), --settle-ms after the last one.
 *
 * Output: "twohost_traffic: progress rounds=N" lines, and one result line:
 *   twohost_traffic: result side=... rounds=... transfers=... verified_octets=...
 *   corrupt_octets=... fault=<reason|none> fault_at_ms=... flushed=...
 *   flush_ms=... disconnected_ms=... disconnected_at_ms=...
 * (times in CLOCK_REALTIME milliseconds, or relative to the fault).
 * Exit status 0 when every check held. One thread. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#include "verbs_test.h"

enum {
	kHeader = 16,
	kRecvSlots = 4,
	kMagic = 0x73697778, /* "siwx" */
	kDepth = 16,
};

enum kind { kData = 1, kWriteDone = 2, kReply = 3 };

/* wr_id: kind of WR in the top byte, round or slot below. */
enum wr_type { kWrSendData = 1, kWrWrite, kWrSendDone, kWrSendReply, kWrRead, kWrRecv };
#define WR_ID(type, n) (((uint64_t)(type) << 56) | (uint64_t)(n))
#define WR_TYPE(id) ((int)((id) >> 56))
#define WR_N(id) ((id) & ((1ull << 56) - 1))

struct options {
	int server;
	const char *addr;
	const char *port;
	long rounds; /* 0: until a fault or --seconds */
	size_t max_size;
	int fault;
	long stall_ms;
	long bound_ms;
	long slack_ms;
	long seconds;
	long connections;
	long settle_ms;
	int tolerate_corruption;
	const char *pid_file;
};

struct remote_area {
	uint64_t addr;
	uint32_t rkey;
	uint32_t max_size;
};

struct side {
	struct options o;
	struct rdma_event_channel *ec;
	struct rdma_cm_id *listen_id;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	uint8_t *mem;
	size_t mem_size;
	struct ibv_mr *mr;
	struct remote_area peer;
	/* Areas inside mem. */
	uint8_t *send_src, *write_src, *recv_slots, *write_dst, *read_src, *read_dst;
	long outstanding_sends;
	long outstanding_recvs;
	long rounds;
	long transfers;
	unsigned long long verified;
	unsigned long long corrupt;
	long long last_progress_ms;
	/* Fault bookkeeping. */
	const char *fault;
	long long fault_at_ms;
	long flushed;
	long long flushed_at_ms;
	long long disconnected_at_ms;
	int disconnected;
	int finished; /* every round done: what follows is the orderly end */
	long long flush_ms;
	long long disconnected_ms;
	long round_base; /* rounds of the earlier connections */
	struct rdma_cm_event *pending_request; /* the next connection's, not acked yet */
};

static const char *side_name(const struct side *s) { return s->o.server ? "server" : "client"; }

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

__attribute__((format(printf, 2, 3), noreturn))
static void fail(struct side *s, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "twohost_traffic: %s: FAIL: ", side_name(s));
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1);
}

static uint8_t pattern_byte(uint32_t seed, size_t i)
{
	return (uint8_t)((i * 131 + seed * 29 + (i >> 8) * 7 + (seed >> 8)) & 0xFF);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pattern_byte(seed, i);
}

/* Checks n octets against the pattern; counts them as verified. */
static void verify(struct side *s, const uint8_t *p, size_t n, uint32_t seed, const char *what,
		   long round)
{
	unsigned long long bad = 0;
	long first = -1;
	for (size_t i = 0; i < n; i++) {
		if (p[i] != pattern_byte(seed, i)) {
			if (first < 0)
				first = (long)i;
			bad++;
		}
	}
	if (bad != 0) {
		if (!s->o.tolerate_corruption)
			fail(s, "%s of round %ld: %llu of %zu octets differ, first at %ld (got 0x%02x want 0x%02x)",
			     what, round, bad, n, first, p[first], pattern_byte(seed, (size_t)first));
		printf("twohost_traffic: corruption %s round=%ld octets=%llu first=%ld\n", what, round, bad,
		       first);
		s->corrupt += bad;
	}
	s->verified += n - bad;
	s->transfers++;
}

/* Message size of round i: small, MTU-sized, odd and the largest, in turn. */
static size_t round_size(const struct side *s, long i)
{
	static const size_t sizes[] = {1, 100, 1448, 4096, 9000, 65536, 0, 777, 31337};
	size_t n = sizes[i % (long)(sizeof(sizes) / sizeof(sizes[0]))];
	if (n == 0 || n > s->o.max_size)
		n = s->o.max_size;
	return n;
}

static uint32_t seed_of(long round, int part) { return (uint32_t)(round * 4 + part); }

static void put_header(uint8_t *p, uint32_t kind, uint32_t round, uint32_t size)
{
	const uint32_t v[4] = {kMagic, kind, round, size};
	memcpy(p, v, sizeof(v));
}

static void post_recv(struct side *s, int slot)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(s->recv_slots + (size_t)slot * (kHeader + s->o.max_size)),
			      .length = (uint32_t)(kHeader + s->o.max_size),
			      .lkey = s->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = WR_ID(kWrRecv, slot), .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *bad = NULL;
	if (ibv_post_recv(s->id->qp, &wr, &bad) != 0)
		fail(s, "ibv_post_recv: %s", strerror(errno));
	s->outstanding_recvs++;
}

static void post_send(struct side *s, uint64_t wr_id, enum ibv_wr_opcode opcode, void *addr,
		      uint32_t len, uint64_t remote_addr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = s->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = opcode,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad = NULL;
	if (ibv_post_send(s->id->qp, &wr, &bad) != 0)
		fail(s, "ibv_post_send: %s", strerror(errno));
	s->outstanding_sends++;
}

static void set_fault(struct side *s, const char *reason)
{
	static char token[64];
	if (s->fault != NULL || s->finished)
		return;
	/* One word, for the result line. */
	snprintf(token, sizeof(token), "%s", reason);
	for (char *c = token; *c != '\0'; c++)
		if (*c == ' ')
			*c = '_';
	s->fault = token;
	s->fault_at_ms = now_ms();
	printf("twohost_traffic: %s: fault %s at_ms=%lld\n", side_name(s), reason, s->fault_at_ms);
	fflush(stdout);
	if (!s->o.fault)
		fail(s, "unexpected fault: %s after %ld rounds", reason, s->rounds);
}

/* Drains the CM channel (non-blocking) and the QP's async events. */
static void check_events(struct side *s)
{
	struct rdma_cm_event *ev;
	while (rdma_get_cm_event(s->ec, &ev) == 0) {
		const enum rdma_cm_event_type type = ev->event;
		if (type == RDMA_CM_EVENT_CONNECT_REQUEST && s->o.server && s->pending_request == NULL &&
		    s->o.connections > 1) {
			s->pending_request = ev; /* the next connection, early */
			continue;
		}
		rdma_ack_cm_event(ev);
		if (type == RDMA_CM_EVENT_DISCONNECTED) {
			if (!s->disconnected) {
				s->disconnected = 1;
				s->disconnected_at_ms = now_ms();
			}
			if (s->fault == NULL && s->o.fault)
				set_fault(s, "disconnected");
		} else if (type != RDMA_CM_EVENT_TIMEWAIT_EXIT) {
			if (s->o.fault)
				set_fault(s, rdma_event_str(type));
			else
				fail(s, "unexpected rdma_cm event %s", rdma_event_str(type));
		}
	}
	struct ibv_async_event aev;
	while (s->id != NULL && ibv_get_async_event(s->id->verbs, &aev) == 0) {
		const enum ibv_event_type type = aev.event_type;
		ibv_ack_async_event(&aev);
		printf("twohost_traffic: %s: async event %s\n", side_name(s), ibv_event_type_str(type));
		if (type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR ||
		    type == IBV_EVENT_QP_ACCESS_ERR || type == IBV_EVENT_COMM_EST) {
			if (type != IBV_EVENT_COMM_EST)
				set_fault(s, ibv_event_type_str(type));
		}
	}
}

static void make_nonblocking(int fd)
{
	const int flags = fcntl(fd, F_GETFL);
	CHECK(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0);
}

/* The next completion, or 0 with *wc untouched when `ms` passed without one
 * (events are checked meanwhile). */
static int next_completion(struct side *s, struct ibv_wc *wc, long ms)
{
	const long long until = now_ms() + ms;
	for (;;) {
		const int n = ibv_poll_cq(s->cq, 1, wc);
		if (n < 0)
			fail(s, "ibv_poll_cq: %d", n);
		if (n == 1) {
			if (WR_TYPE(wc->wr_id) == kWrRecv)
				s->outstanding_recvs--;
			else
				s->outstanding_sends--;
			s->last_progress_ms = now_ms();
			return 1;
		}
		check_events(s);
		if (now_ms() >= until)
			return 0;
		struct timespec pause = {0, 200 * 1000};
		nanosleep(&pause, NULL);
	}
}

/* One completion that must be a success of `type` (and `n`, unless -1). */
static int expect(struct side *s, const struct ibv_wc *wc, int type, long n, enum ibv_wc_opcode opcode,
		  uint32_t byte_len)
{
	if (wc->status != IBV_WC_SUCCESS) {
		printf("twohost_traffic: %s: completion wr type %d n %llu: %s\n", side_name(s),
		       WR_TYPE(wc->wr_id), (unsigned long long)WR_N(wc->wr_id), ibv_wc_status_str(wc->status));
		set_fault(s, "error completion");
		return 0;
	}
	if (WR_TYPE(wc->wr_id) != type || (n >= 0 && (long)WR_N(wc->wr_id) != n) || wc->opcode != opcode)
		fail(s, "completion out of order or wrong: wr type %d n %llu opcode %d; want type %d n %ld opcode %d",
		     WR_TYPE(wc->wr_id), (unsigned long long)WR_N(wc->wr_id), wc->opcode, type, n, opcode);
	/* byte_len is defined for receives and RDMA Reads only. */
	if (opcode == IBV_WC_RDMA_READ && wc->byte_len != byte_len)
		fail(s, "RDMA Read of %u octets, want %u", wc->byte_len, byte_len);
	return 1;
}

/* Waits for the next completion in the normal flow; 0 on a fault. */
static int wait_completion(struct side *s, struct ibv_wc *wc)
{
	const long stall = s->o.stall_ms > 0 ? s->o.stall_ms : 60000;
	for (;;) {
		if (s->fault != NULL)
			return 0;
		if (next_completion(s, wc, 100))
			return 1;
		if (now_ms() - s->last_progress_ms >= stall) {
			if (!s->o.fault)
				fail(s, "no completion for %ld ms", stall);
			set_fault(s, "stall");
			rdma_disconnect(s->id);
			return 0;
		}
	}
}

/* A receive completion's header, checked. Returns the message kind. */
static uint32_t check_header(struct side *s, const struct ibv_wc *wc, uint32_t want_kind, long round,
			     uint32_t *size, uint8_t **body)
{
	uint8_t *slot = s->recv_slots + WR_N(wc->wr_id) * (kHeader + s->o.max_size);
	uint32_t v[4];
	if (wc->byte_len < kHeader)
		fail(s, "receive of %u octets, shorter than a header", wc->byte_len);
	memcpy(v, slot, sizeof(v));
	if (v[0] != kMagic || v[1] != want_kind || v[2] != (uint32_t)round) {
		if (s->o.tolerate_corruption) {
			printf("twohost_traffic: corruption header round=%ld\n", round);
			s->corrupt += kHeader;
			return 0;
		}
		fail(s, "header magic 0x%x kind %u round %u; want kind %u round %ld", v[0], v[1], v[2], want_kind,
		     round);
	}
	*size = v[3];
	*body = slot + kHeader;
	if (wc->byte_len != kHeader + (want_kind == kWriteDone ? 0 : v[3]))
		fail(s, "message of round %ld: %u octets, want %u", round, wc->byte_len,
		     kHeader + (want_kind == kWriteDone ? 0 : v[3]));
	return v[1];
}

static void progress_line(struct side *s)
{
	if (s->rounds % 20 == 0) {
		printf("twohost_traffic: progress rounds=%ld\n", s->rounds);
		fflush(stdout);
	}
}

static void client_rounds(struct side *s)
{
	const long long end = s->o.seconds > 0 ? now_ms() + s->o.seconds * 1000 : 0;
	for (long done = 0; s->o.rounds == 0 || done < s->o.rounds; done++) {
		if (end != 0 && now_ms() >= end)
			break;
		const long i = s->round_base + done;
		const size_t n = round_size(s, i);
		struct ibv_wc wc;
		put_header(s->send_src, kData, (uint32_t)i, (uint32_t)n);
		fill(s->send_src + kHeader, n, seed_of(i, 0));
		fill(s->write_src, n, seed_of(i, 1));
		post_send(s, WR_ID(kWrSendData, i), IBV_WR_SEND, s->send_src, (uint32_t)(kHeader + n), 0, 0);
		post_send(s, WR_ID(kWrWrite, i), IBV_WR_RDMA_WRITE, s->write_src, (uint32_t)n, s->peer.addr,
			  s->peer.rkey);
		put_header(s->send_src + kHeader + s->o.max_size, kWriteDone, (uint32_t)i, (uint32_t)n);
		post_send(s, WR_ID(kWrSendDone, i), IBV_WR_SEND, s->send_src + kHeader + s->o.max_size, kHeader, 0,
			  0);
		/* Three send completions in order, then the reply. */
		const int types[3] = {kWrSendData, kWrWrite, kWrSendDone};
		const enum ibv_wc_opcode ops[3] = {IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_SEND};
		int got_reply = 0;
		for (int k = 0; k < 3 || !got_reply;) {
			if (!wait_completion(s, &wc))
				return;
			if (WR_TYPE(wc.wr_id) == kWrRecv) {
				if (wc.status != IBV_WC_SUCCESS) {
					expect(s, &wc, kWrRecv, -1, IBV_WC_RECV, 0);
					return;
				}
				uint32_t size;
				uint8_t *body;
				if (check_header(s, &wc, kReply, i, &size, &body) != 0) {
					if (size != n)
						fail(s, "reply of round %ld carries %u octets, want %zu", i, size, n);
					verify(s, body, n, seed_of(i, 2), "reply", i);
				}
				post_recv(s, (int)WR_N(wc.wr_id));
				got_reply = 1;
				continue;
			}
			if (k >= 3)
				fail(s, "extra send completion wr type %d", WR_TYPE(wc.wr_id));
			if (!expect(s, &wc, types[k], i, ops[k], 0))
				return;
			k++;
		}
		post_send(s, WR_ID(kWrRead, i), IBV_WR_RDMA_READ, s->read_dst, (uint32_t)n,
			  s->peer.addr + s->o.max_size, s->peer.rkey);
		if (!wait_completion(s, &wc))
			return;
		if (!expect(s, &wc, kWrRead, i, IBV_WC_RDMA_READ, (uint32_t)n))
			return;
		verify(s, s->read_dst, n, seed_of(i, 3), "read", i);
		s->rounds++;
		progress_line(s);
	}
}

static void server_rounds(struct side *s)
{
	long expected_round = s->round_base;
	long replies_done = s->round_base;
	for (;;) {
		if (s->o.rounds != 0 && s->rounds == s->round_base + s->o.rounds)
			return; /* the client disconnects next */
		struct ibv_wc wc;
		if (!wait_completion(s, &wc))
			return;
		if (WR_TYPE(wc.wr_id) == kWrSendReply) {
			if (!expect(s, &wc, kWrSendReply, replies_done, IBV_WC_SEND, 0))
				return;
			replies_done++;
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			expect(s, &wc, kWrRecv, -1, IBV_WC_RECV, 0);
			return;
		}
		uint32_t v[4];
		memcpy(v, s->recv_slots + WR_N(wc.wr_id) * (kHeader + s->o.max_size), sizeof(v));
		const uint32_t kind = v[1];
		uint32_t size = 0;
		uint8_t *body = NULL;
		if (kind == kData) {
			if (check_header(s, &wc, kData, expected_round, &size, &body) != 0) {
				if (size > s->o.max_size)
					fail(s, "round %ld: size %u above the maximum", expected_round, size);
				verify(s, body, size, seed_of(expected_round, 0), "send", expected_round);
			}
			post_recv(s, (int)WR_N(wc.wr_id));
		} else {
			if (check_header(s, &wc, kWriteDone, expected_round, &size, &body) != 0) {
				if (size > s->o.max_size)
					fail(s, "round %ld: size %u above the maximum", expected_round, size);
				verify(s, s->write_dst, size, seed_of(expected_round, 1), "write", expected_round);
			}
			post_recv(s, (int)WR_N(wc.wr_id));
			/* The previous reply's source is free: the client had
			 * all of it before it started this round. */
			fill(s->read_src, size, seed_of(expected_round, 3));
			put_header(s->send_src, kReply, (uint32_t)expected_round, size);
			fill(s->send_src + kHeader, size, seed_of(expected_round, 2));
			post_send(s, WR_ID(kWrSendReply, expected_round), IBV_WR_SEND, s->send_src, kHeader + size, 0,
				  0);
			expected_round++;
			s->rounds++;
			progress_line(s);
		}
	}
}

/* After a fault (or the end): every outstanding WR completes, and
 * DISCONNECTED arrives, within the bound. */
static void wind_down(struct side *s)
{
	const long long start = s->fault != NULL ? s->fault_at_ms : now_ms();
	const long long limit = start + s->o.bound_ms + s->o.slack_ms + 20000;
	while ((s->outstanding_sends + s->outstanding_recvs > 0 || !s->disconnected) && now_ms() < limit) {
		struct ibv_wc wc;
		if (s->outstanding_sends + s->outstanding_recvs == 0) {
			check_events(s);
			struct timespec pause = {0, 1000 * 1000};
			nanosleep(&pause, NULL);
			continue;
		}
		if (!next_completion(s, &wc, 100))
			continue;
		if (wc.status == IBV_WC_SUCCESS) {
			/* Done before the fault; a receive's data is still checked. */
			if (WR_TYPE(wc.wr_id) == kWrRecv && s->fault != NULL) {
				uint32_t v[4];
				memcpy(v, s->recv_slots + WR_N(wc.wr_id) * (kHeader + s->o.max_size), sizeof(v));
				printf("twohost_traffic: %s: receive completed after the fault (kind %u round %u)\n",
				       side_name(s), v[1], v[2]);
			}
			continue;
		}
		if (s->fault == NULL) {
			if (s->finished && wc.status == IBV_WC_WR_FLUSH_ERR && WR_TYPE(wc.wr_id) == kWrRecv) {
				s->flushed++; /* the spare receives at the end of a clean run */
				continue;
			}
			if (s->finished)
				fail(s, "a send WR completed with %s at the orderly end", ibv_wc_status_str(wc.status));
			set_fault(s, "error completion");
		}
		s->flushed++;
		if (s->outstanding_sends + s->outstanding_recvs == 0)
			s->flushed_at_ms = now_ms();
	}
	if (s->outstanding_sends + s->outstanding_recvs > 0)
		fail(s, "%ld send and %ld receive WRs never completed (%lld ms after %s)", s->outstanding_sends,
		     s->outstanding_recvs, now_ms() - start, s->fault != NULL ? s->fault : "the end");
	if (!s->disconnected)
		fail(s, "no DISCONNECTED %lld ms after %s", now_ms() - start, s->fault != NULL ? s->fault : "the end");
	if (s->flushed_at_ms == 0)
		s->flushed_at_ms = now_ms();
}

static void setup_qp(struct side *s, struct rdma_cm_id *id)
{
	s->pd = ibv_alloc_pd(id->verbs);
	CHECK(s->pd != NULL);
	s->cq = ibv_create_cq(id->verbs, 4 * kDepth, NULL, NULL, 0);
	CHECK(s->cq != NULL);
	struct ibv_qp_init_attr attr = {.send_cq = s->cq,
					.recv_cq = s->cq,
					.cap = {.max_send_wr = kDepth,
						.max_recv_wr = kDepth,
						.max_send_sge = 1,
						.max_recv_sge = 1},
					.qp_type = IBV_QPT_RC};
	if (rdma_create_qp(id, s->pd, &attr) != 0)
		fail(s, "rdma_create_qp: %s", strerror(errno));
	s->mem_size = 2 * (kHeader + s->o.max_size) + s->o.max_size +
		      kRecvSlots * (kHeader + s->o.max_size) + 3 * s->o.max_size;
	s->mem = calloc(1, s->mem_size);
	CHECK(s->mem != NULL);
	s->mr = ibv_reg_mr(s->pd, s->mem, s->mem_size,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(s->mr != NULL);
	uint8_t *p = s->mem;
	s->send_src = p;
	p += 2 * (kHeader + s->o.max_size);
	s->write_src = p;
	p += s->o.max_size;
	s->recv_slots = p;
	p += kRecvSlots * (kHeader + s->o.max_size);
	s->write_dst = p; /* write_dst and read_src adjacent: one remote area */
	p += s->o.max_size;
	s->read_src = p;
	p += s->o.max_size;
	s->read_dst = p;
	for (int i = 0; i < kRecvSlots; i++)
		post_recv(s, i);
}

static struct rdma_cm_event *wait_cm_event(struct side *s, enum rdma_cm_event_type want, long ms)
{
	const long long until = now_ms() + ms;
	struct rdma_cm_event *ev;
	while (now_ms() < until) {
		if (rdma_get_cm_event(s->ec, &ev) == 0) {
			if (ev->event != want)
				fail(s, "rdma_cm event %s (status %d), want %s", rdma_event_str(ev->event), ev->status,
				     rdma_event_str(want));
			return ev;
		}
		struct timespec pause = {0, 1000 * 1000};
		nanosleep(&pause, NULL);
	}
	fail(s, "no %s within %ld ms", rdma_event_str(want), ms);
	return NULL;
}

static struct addrinfo *resolve(struct side *s)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	struct addrinfo *res = NULL;
	if (s->o.server)
		hints.ai_flags = AI_PASSIVE;
	const int err = getaddrinfo(s->o.addr, s->o.port, &hints, &res);
	if (err != 0)
		fail(s, "getaddrinfo %s port %s: %s", s->o.addr, s->o.port, gai_strerror(err));
	return res;
}

static void listen_server(struct side *s)
{
	struct addrinfo *res = resolve(s);
	CHECK(rdma_create_id(s->ec, &s->listen_id, NULL, RDMA_PS_TCP) == 0);
	if (rdma_bind_addr(s->listen_id, res->ai_addr) != 0)
		fail(s, "rdma_bind_addr %s: %s", s->o.addr, strerror(errno));
	freeaddrinfo(res);
	/* Room for a burst of connection attempts (the connections test). */
	CHECK(rdma_listen(s->listen_id, 1024) == 0);
	printf("twohost_traffic: server: listening\n");
	fflush(stdout);
}

static void serve_one(struct side *s)
{
	struct rdma_cm_event *ev = s->pending_request;
	s->pending_request = NULL;
	if (ev == NULL)
		ev = wait_cm_event(s, RDMA_CM_EVENT_CONNECT_REQUEST, 120000);
	s->id = ev->id;
	rdma_ack_cm_event(ev);
	setup_qp(s, s->id);
	struct remote_area area = {.addr = (uintptr_t)s->write_dst,
				   .rkey = s->mr->rkey,
				   .max_size = (uint32_t)s->o.max_size};
	struct rdma_conn_param param = {.private_data = &area,
					.private_data_len = sizeof(area),
					.responder_resources = 4,
					.initiator_depth = 4};
	if (rdma_accept(s->id, &param) != 0)
		fail(s, "rdma_accept: %s", strerror(errno));
	ev = wait_cm_event(s, RDMA_CM_EVENT_ESTABLISHED, 30000);
	rdma_ack_cm_event(ev);
	make_nonblocking(s->id->verbs->async_fd);
	s->last_progress_ms = now_ms();
	server_rounds(s);
}

static void connect_one(struct side *s)
{
	struct addrinfo *res = resolve(s);
	CHECK(rdma_create_id(s->ec, &s->id, NULL, RDMA_PS_TCP) == 0);
	if (rdma_resolve_addr(s->id, NULL, res->ai_addr, 5000) != 0)
		fail(s, "rdma_resolve_addr %s: %s", s->o.addr, strerror(errno));
	freeaddrinfo(res);
	rdma_ack_cm_event(wait_cm_event(s, RDMA_CM_EVENT_ADDR_RESOLVED, 10000));
	CHECK(rdma_resolve_route(s->id, 5000) == 0);
	rdma_ack_cm_event(wait_cm_event(s, RDMA_CM_EVENT_ROUTE_RESOLVED, 10000));
	setup_qp(s, s->id);
	struct rdma_conn_param param = {.responder_resources = 4, .initiator_depth = 4, .retry_count = 7};
	if (rdma_connect(s->id, &param) != 0)
		fail(s, "rdma_connect: %s", strerror(errno));
	struct rdma_cm_event *ev = wait_cm_event(s, RDMA_CM_EVENT_ESTABLISHED, 60000);
	if (ev->param.conn.private_data_len < sizeof(s->peer))
		fail(s, "private data of %u octets, want %zu", ev->param.conn.private_data_len, sizeof(s->peer));
	memcpy(&s->peer, ev->param.conn.private_data, sizeof(s->peer));
	rdma_ack_cm_event(ev);
	if (s->peer.max_size < s->o.max_size)
		fail(s, "the server's areas hold %u octets, want %zu", s->peer.max_size, s->o.max_size);
	make_nonblocking(s->id->verbs->async_fd);
	if (s->o.connections <= 1)
		printf("twohost_traffic: client: connected\n");
	fflush(stdout);
	s->last_progress_ms = now_ms();
	client_rounds(s);
}

/* After the rounds of one connection: the fault checks, the wind-down,
 * and the connection's resources released. */
static void end_connection(struct side *s)
{
	if (s->fault == NULL) {
		if (s->o.fault && (s->o.rounds == 0 || s->rounds < s->round_base + s->o.rounds))
			fail(s, "no fault seen in %ld rounds", s->rounds);
		/* A clean end: the client disconnects, the server sees it. */
		s->finished = 1;
		if (!s->o.server) {
			rdma_disconnect(s->id);
		}
	}
	wind_down(s);
	s->flush_ms = s->fault != NULL ? s->flushed_at_ms - s->fault_at_ms : 0;
	s->disconnected_ms = s->fault != NULL ? s->disconnected_at_ms - s->fault_at_ms : 0;
	if (s->fault != NULL) {
		const long long limit = s->o.bound_ms + s->o.slack_ms;
		if (s->flush_ms > limit || s->disconnected_ms > limit)
			fail(s, "teardown took %lld ms to flush and %lld ms to DISCONNECTED, bound %ld ms + %ld ms slack",
			     s->flush_ms, s->disconnected_ms, s->o.bound_ms, s->o.slack_ms);
	}
	if (s->o.server && s->o.rounds != 0 && s->fault == NULL && s->rounds != s->round_base + s->o.rounds)
		fail(s, "%ld rounds, want %ld", s->rounds - s->round_base, s->o.rounds);
	if (s->fault != NULL && s->o.connections > 1)
		fail(s, "a fault (%s) in connection %ld of %ld", s->fault, s->round_base / s->o.rounds + 1,
		     s->o.connections);
	rdma_destroy_qp(s->id);
	ibv_dereg_mr(s->mr);
	free(s->mem);
	ibv_destroy_cq(s->cq);
	ibv_dealloc_pd(s->pd);
	rdma_destroy_id(s->id);
	s->id = NULL;
	s->outstanding_sends = s->outstanding_recvs = 0;
	s->disconnected = 0;
	s->finished = 0;
	s->flushed_at_ms = 0;
}

/* What a process holds that a connection must give back. */
struct usage_sample {
	long fds;
	long threads;
	long long heap_in_use;
};

static struct usage_sample sample_usage(void)
{
	struct usage_sample u = {0};
	DIR *dir = opendir("/proc/self/fd");
	if (dir != NULL) {
		for (struct dirent *e; (e = readdir(dir)) != NULL;)
			if (e->d_name[0] != '.')
				u.fds++;
		closedir(dir);
	}
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	while (f != NULL && fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "Threads:", 8) == 0)
			u.threads = atol(line + 8);
	if (f != NULL)
		fclose(f);
	u.heap_in_use = (long long)mallinfo2().uordblks;
	return u;
}

/* After the last connection and --settle-ms for the connection manager to
 * drop the silent and garbage ones: nothing above the baseline (heap within
 * 1 MiB: allocator state). The baseline may hold one fd more than the
 * steady state: the client's next connection can already be in the
 * connection manager when the first one ends. */
static void check_usage(struct side *s, const struct usage_sample *baseline)
{
	struct timespec pause = {s->o.settle_ms / 1000, (s->o.settle_ms % 1000) * 1000000};
	nanosleep(&pause, NULL);
	check_events(s);
	const struct usage_sample now = sample_usage();
	printf("twohost_traffic: usage after the first connection: %ld fds, %ld threads, %lld heap octets; "
	       "at the end: %ld fds, %ld threads, %lld heap octets\n",
	       baseline->fds, baseline->threads, baseline->heap_in_use, now.fds, now.threads, now.heap_in_use);
	fflush(stdout);
	if (now.fds > baseline->fds || now.threads > baseline->threads ||
	    now.heap_in_use > baseline->heap_in_use + (1 << 20))
		fail(s, "resources not back to the baseline");
}

static void usage(void)
{
	fprintf(stderr,
		"usage: twohost_traffic --server|--client ADDR PORT [--rounds N] [--max-size OCTETS]\n"
		"  [--seconds S] [--fault] [--stall-ms MS] [--bound-ms MS] [--slack-ms MS]\n"
		"  [--tolerate-corruption] [--connections N [--settle-ms MS]] [--pid-file PATH]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct side s = {.o = {.rounds = 100,
			       .max_size = 256 * 1024,
			       .bound_ms = 10000,
			       .slack_ms = 2000}};
	int i = 1;
	if (argc < 4)
		usage();
	if (strcmp(argv[i], "--server") == 0)
		s.o.server = 1;
	else if (strcmp(argv[i], "--client") != 0)
		usage();
	s.o.addr = argv[++i];
	s.o.port = argv[++i];
	for (i++; i < argc; i++) {
		const char *opt = argv[i];
		if (strcmp(opt, "--fault") == 0) {
			s.o.fault = 1;
			continue;
		}
		if (strcmp(opt, "--tolerate-corruption") == 0) {
			s.o.tolerate_corruption = 1;
			continue;
		}
		if (i + 1 >= argc)
			usage();
		const char *v = argv[++i];
		if (strcmp(opt, "--rounds") == 0)
			s.o.rounds = atol(v);
		else if (strcmp(opt, "--max-size") == 0)
			s.o.max_size = (size_t)atol(v);
		else if (strcmp(opt, "--seconds") == 0)
			s.o.seconds = atol(v);
		else if (strcmp(opt, "--stall-ms") == 0)
			s.o.stall_ms = atol(v);
		else if (strcmp(opt, "--bound-ms") == 0)
			s.o.bound_ms = atol(v);
		else if (strcmp(opt, "--slack-ms") == 0)
			s.o.slack_ms = atol(v);
		else if (strcmp(opt, "--connections") == 0)
			s.o.connections = atol(v);
		else if (strcmp(opt, "--settle-ms") == 0)
			s.o.settle_ms = atol(v);
		else if (strcmp(opt, "--pid-file") == 0)
			s.o.pid_file = v;
		else
			usage();
	}
	if (s.o.max_size < 1 || s.o.max_size > (64u << 20))
		usage();
	if (s.o.pid_file != NULL) {
		FILE *f = fopen(s.o.pid_file, "w");
		CHECK(f != NULL);
		fprintf(f, "%d\n", (int)getpid());
		fclose(f);
	}
	s.ec = rdma_create_event_channel();
	if (s.ec == NULL)
		fail(&s, "rdma_create_event_channel: %s (run under siwx-run)", strerror(errno));
	make_nonblocking(s.ec->fd);
	if (s.o.connections < 1)
		s.o.connections = 1;
	if (s.o.connections > 1 && s.o.rounds == 0)
		usage();
	if (s.o.server)
		listen_server(&s);
	struct usage_sample baseline = {0};
	for (long c = 0; c < s.o.connections; c++) {
		s.round_base = c * s.o.rounds;
		if (s.o.server)
			serve_one(&s);
		else
			connect_one(&s);
		end_connection(&s);
		/* The first connection opened the device (its progress thread,
		 * the provider's tables): what stays after it is the baseline. */
		if (c == 0 && s.o.connections > 1 && s.o.server) {
			baseline = sample_usage();
			printf("twohost_traffic: server: baseline taken\n");
			fflush(stdout);
		}
	}
	printf("twohost_traffic: result side=%s rounds=%ld transfers=%ld verified_octets=%llu corrupt_octets=%llu "
	       "fault=%s fault_at_ms=%lld flushed=%ld flush_ms=%lld disconnected_ms=%lld disconnected_at_ms=%lld "
	       "connections=%ld\n",
	       side_name(&s), s.rounds, s.transfers, s.verified, s.corrupt, s.fault != NULL ? s.fault : "none",
	       s.fault_at_ms, s.flushed, s.flush_ms, s.disconnected_ms, s.disconnected_at_ms, s.o.connections);
	fflush(stdout);
	if (s.o.server && s.o.connections > 1)
		check_usage(&s, &baseline);
	if (s.listen_id != NULL)
		rdma_destroy_id(s.listen_id);
	rdma_destroy_event_channel(s.ec);
	return 0;
}
