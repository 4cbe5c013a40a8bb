// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// rsockets for siwx: connection setup, the data path, flow control and
// waiting. See rsocket.h for the design and docs/rsockets.md for the
// protocol; the C entry points are in rsocket_api.cc.
#include "rdmacm-ext/rsocket.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "common/transport/socket_ops.h"
#include "common/util/log.h"
#include "common/util/sanitizers.h"
#include "common/util/service_thread.h"

// The receive ring and the target SGL and iomap tables are written by the
// peer's RDMA Writes (the engine's receive thread places them) while we read
// them, and the length of a used-up SGL entry by us too: the protocol orders
// these accesses through the network (we advertise a buffer again only after
// reading it), which ThreadSanitizer cannot see. Our accesses to that memory
// are hidden from it; everything else stays checked.
#ifdef SIWX_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace siwx::rs {
namespace {

class PeerWrittenAccess {
 public:
#ifdef SIWX_TSAN
  PeerWrittenAccess() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~PeerWrittenAccess() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
#else
  PeerWrittenAccess() {}
  ~PeerWrittenAccess() {}  // not trivial: no unused-variable warning
#endif
  PeerWrittenAccess(const PeerWrittenAccess&) = delete;
  PeerWrittenAccess& operator=(const PeerWrittenAccess&) = delete;
};

constexpr std::uint32_t kCtrlReserve = 4;    // send slots kept for control messages
constexpr std::uint32_t kSpareRecvs = 32;    // receives beyond the credits we grant
constexpr std::uint32_t kMinQueue = 16;
constexpr std::uint32_t kMaxQueue = 0xFFFE;
constexpr std::uint32_t kSndLowat = 2048;    // stock: a send waits for this much ring
constexpr std::uint32_t kOverlapStart = 2048;  // first chunk of a large send
constexpr std::uint32_t kMaxTransfer = 65536;  // largest single RDMA Write
constexpr std::uint32_t kScratchSlot = 32;     // one message, SGE or iomap entry
constexpr int kWakeIntervalMs = 500;           // longest single sleep in a wait
constexpr int kTeardownMs = 5000;              // bound of the waits in shutdown
constexpr int kLingerMs = 2000;                // a closed QP waits this long for the peer

// wr_id: kind in bits 63:60, argument (slot or octets) in 31:0.
enum WrKind : std::uint64_t { kWrRecv = 1, kWrData = 2, kWrMsg = 3, kWrCtrl = 4, kWrDirect = 5 };
constexpr std::uint64_t MakeWrId(WrKind k, std::uint32_t arg) {
  return (std::uint64_t{k} << 60) | arg;
}
constexpr WrKind WrIdKind(std::uint64_t id) { return static_cast<WrKind>(id >> 60); }
constexpr std::uint32_t WrIdArg(std::uint64_t id) { return static_cast<std::uint32_t>(id); }

std::uint8_t* AllocZeroed(std::size_t len) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, len) != 0) return nullptr;
  std::memset(p, 0, len);
  return static_cast<std::uint8_t*>(p);
}

void SetNonBlocking(int fd) {
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

// The descriptor an rsocket's number is also wakes threads asleep on it.
void SignalWake(Socket& s) {
  if (s.waiters > 0 && s.index >= 0) transport::SignalEventFd(s.index);
}

void DrainWake(int fd) { transport::DrainEventFd(fd); }

// Close-on-exec whatever SOCK_CLOEXEC said (rfcntl reports the flag the
// application set): an rsocket means nothing after exec.
int NewIndexFd(int* fd) { return transport::CreateEventFd(true, fd); }

std::uint32_t SendRingFree(const Socket& s) { return s.sbuf_avail; }

std::uint8_t* ScratchSlot(Socket& s) {
  // A slot is reused only after sq_total newer WRs: by then its WR completed.
  const std::uint64_t slot = s.scratch_next++ % s.sq_total;
  return s.sbuf + s.sbuf_size + slot * kScratchSlot;
}

wire::Sge* SharedSgl(Socket& s) { return reinterpret_cast<wire::Sge*>(s.tables); }
std::uint8_t* SharedIomap(Socket& s, int i) {
  return s.tables + wire::kSglSize * wire::kSgeSize +
         static_cast<std::size_t>(i) * wire::kIomapSize;
}

void MarkBroken(Socket& s, int err) {
  if (s.phase != Phase::kConnected) return;
  if (!s.peer_gone && err != 0 && s.so_error == 0) s.so_error = err;
  s.peer_gone = true;
  s.readable = false;
  s.writable = false;
}

int PostSend(Socket& s, ibv_send_wr* wr) {
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(s.id->qp, wr, &bad);
  if (rc != 0) {
    MarkBroken(s, rc);
    return rc;
  }
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) ++s.sq_used;
  return 0;
}

// A 4-octet Send carrying `msg` in host byte order (as stock rsockets).
int PostMsg(Socket& s, std::uint32_t msg) {
  std::uint8_t* slot = ScratchSlot(s);
  std::memcpy(slot, &msg, sizeof(msg));
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(slot), wire::kMsgSize, s.smr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrMsg, msg);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  return PostSend(s, &wr);
}

// An RDMA Write of `len` scratch octets, then the Send of `msg`.
int PostWriteMsg(Socket& s, const std::uint8_t* src, std::uint32_t len, std::uint64_t raddr,
                 std::uint32_t rkey, std::uint32_t msg) {
  std::uint8_t* slot = ScratchSlot(s);
  std::memcpy(slot, src, len);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(slot), len, s.smr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrCtrl, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  const int rc = PostSend(s, &wr);
  return rc != 0 ? rc : PostMsg(s, msg);
}

int PostRecv(Socket& s, std::uint32_t slot) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(s.rbuf + s.rbuf_size + slot * wire::kMsgSize),
              wire::kMsgSize, s.rmr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = MakeWrId(kWrRecv, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(s.id->qp, &wr, &bad);
}

bool CtrlSlotsFree(const Socket& s, std::uint32_t n) { return s.sq_used + n <= s.sq_total; }

bool CanSendData(const Socket& s) {
  return s.phase == Phase::kConnected && s.writable && !s.peer_gone &&
         s.sq_used + 2 <= s.sq_size &&
         SendRingFree(s) >= std::min(kSndLowat, s.sbuf_size) && s.sseq_no != s.sseq_comp &&
         s.sgl[s.target_sge].length != 0;
}

// Grants receive credits and, when half of the receive ring is free again,
// advertises it by writing the peer's next target SGL entry.
void UpdateCredits(Socket& s) {
  for (int round = 0; round < 2; ++round) {
    if (s.phase != Phase::kConnected || s.peer_gone || s.peer_closed) return;
    const std::uint32_t half = s.rbuf_size / 2;
    const bool buffer = s.rbuf_avail >= half;
    const bool credits = static_cast<std::int16_t>(s.rseq_no - s.rseq_comp) >= 0;
    if ((!buffer && !credits) || !CtrlSlotsFree(s, 2)) return;
    s.rseq_comp = static_cast<std::uint16_t>(s.rseq_no + s.rq_size / 2);
    const std::uint32_t msg =
        wire::MakeMsg(wire::kOpSgl, static_cast<std::uint32_t>(s.rseq_no) + s.rq_size);
    int rc;
    if (buffer) {
      wire::Sge sge{reinterpret_cast<std::uintptr_t>(s.rbuf + s.rfree_offset), s.rmr->rkey, half};
      std::uint8_t enc[wire::kSgeSize];
      wire::EncodeSge(sge, s.swap, enc);
      const std::uint64_t entry =
          s.remote_sgl.addr + static_cast<std::uint64_t>(s.remote_sge) * wire::kSgeSize;
      rc = PostWriteMsg(s, enc, wire::kSgeSize, entry, s.remote_sgl.key, msg);
      if (rc != 0) return;
      s.rbuf_avail -= half;
      s.rfree_offset = (s.rfree_offset + half) % s.rbuf_size;
      s.remote_sge = (s.remote_sge + 1) % static_cast<int>(s.remote_sgl.length);
    } else {
      rc = PostMsg(s, msg);
      if (rc != 0) return;
    }
  }
}

// Entries we have used up are taken over from the shared table once an
// SGL message arrived: the Write that filled them was placed before it.
void RefreshSgl(Socket& s) {
  const PeerWrittenAccess hidden;
  wire::Sge* shared = SharedSgl(s);
  for (int i = 0; i < wire::kSglSize; ++i) {
    if (s.sgl[i].length != 0) continue;
    const wire::Sge fresh =
        wire::DecodeSge(reinterpret_cast<const std::uint8_t*>(&shared[i]));
    if (fresh.length != 0) s.sgl[i] = fresh;
  }
}

void HandleMsg(Socket& s, std::uint32_t msg) {
  const std::uint32_t arg = wire::MsgArg(msg);
  switch (wire::MsgOp(msg)) {
    case wire::kOpData:
      if (arg > s.rbuf_size - s.rqueued) {
        // More than it can have written: a broken or hostile peer.
        SIWX_LOG(kWarn, "rsocket %d: the peer announced %u more octets than its %u-octet "
                 "receive buffer can hold; closing the connection", s.index, arg, s.rbuf_size);
        MarkBroken(s, EPROTO);
        return;
      }
      if (arg != 0) {
        s.rmsg.push_back(arg);
        s.rqueued += arg;
      }
      break;
    case wire::kOpSgl:
      s.sseq_comp = static_cast<std::uint16_t>(arg);
      RefreshSgl(s);
      break;
    case wire::kOpIomapSgl: {
      const std::uint32_t i = arg & 0xFFFF;
      if (i < s.peer_iomaps.size()) {
        const PeerWrittenAccess hidden;
        s.peer_iomaps[i] = wire::DecodeIomap(SharedIomap(s, static_cast<int>(i)));
      }
      break;
    }
    case wire::kOpCtrl:
      if (arg == wire::kCtrlDisconnect) {
        s.peer_closed = true;
        s.readable = false;
        s.writable = false;
      } else if (arg == wire::kCtrlShutdown) {
        if (s.writable) {
          s.readable = false;
        } else {
          s.peer_closed = true;
          s.readable = false;
        }
      }
      break;
    default:
      break;  // reserved types: ignored, as stock does
  }
}

// Takes every completion off the CQ. Returns true if anything changed.
bool PollCq(Socket& s) {
  if (s.cq == nullptr) return false;
  bool changed = false;
  ibv_wc wc[16];
  for (;;) {
    const int n = ibv_poll_cq(s.cq, 16, wc);
    if (n <= 0) break;
    changed = true;
    for (int i = 0; i < n; ++i) {
      const WrKind kind = WrIdKind(wc[i].wr_id);
      if (kind == kWrRecv) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          // Flushed: the stream is gone. Data received before stays readable.
          s.stream_ended = true;
          MarkBroken(s, wc[i].status == IBV_WC_WR_FLUSH_ERR ? 0 : EIO);
          continue;
        }
        const std::uint32_t slot = WrIdArg(wc[i].wr_id);
        std::uint32_t msg;
        std::memcpy(&msg, s.rbuf + s.rbuf_size + slot * wire::kMsgSize, sizeof(msg));
        if (!s.peer_gone && PostRecv(s, slot) != 0) MarkBroken(s, EIO);
        HandleMsg(s, msg);
        continue;
      }
      if (s.sq_used > 0) --s.sq_used;
      if (kind == kWrData || kind == kWrDirect) s.sbuf_avail += WrIdArg(wc[i].wr_id);
      if (wc[i].status != IBV_WC_SUCCESS && wc[i].status != IBV_WC_WR_FLUSH_ERR) {
        SIWX_LOG(kInfo, "rsocket %d: send completion %s; the connection is closed", s.index,
                 ibv_wc_status_str(wc[i].status));
        MarkBroken(s, EIO);
      }
    }
  }
  return changed;
}

void DrainCqEvents(Socket& s) {
  if (s.cc == nullptr) return;
  ibv_cq* cq;
  void* ctx;
  while (ibv_get_cq_event(s.cc, &cq, &ctx) == 0) {
    s.cq_armed = false;
    if (++s.unacked_cq_events >= 64) {
      ibv_ack_cq_events(s.cq, s.unacked_cq_events);
      s.unacked_cq_events = 0;
    }
  }
}

int StatusErrno(int status, int fallback) { return status < 0 ? -status : fallback; }

void FailConnect(Socket& s, int err) {
  s.phase = Phase::kConnectError;
  s.so_error = err;
  SIWX_LOG(kInfo, "rsocket %d: connection failed: %s", s.index, std::strerror(err));
}

int CreateEndpoint(Socket& s);
void SaveConnData(Socket& s, const wire::ConnData& cd);
void FormatConnData(Socket& s, std::uint8_t out[wire::kConnDataSize]);

// ROUTE_RESOLVED: the verbs objects, then the Request with our conn data.
int StartConnect(Socket& s) {
  int rc = CreateEndpoint(s);
  if (rc != 0) return rc;
  std::uint8_t pd[wire::kConnDataSize];
  FormatConnData(s, pd);
  rdma_conn_param p{};
  p.private_data = pd;
  p.private_data_len = sizeof(pd);
  p.flow_control = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  p.responder_resources = 1;
  p.initiator_depth = 1;  // stock on iWARP: room for an RTR Read
  if (rdma_connect(s.id, &p) != 0) return errno;
  s.phase = Phase::kConnecting;
  return 0;
}

void SetConnected(Socket& s) {
  s.phase = Phase::kConnected;
  s.readable = true;
  s.writable = true;
}

// Processes the id's CM events without blocking. True if something changed.
bool ProcessCmEvents(Socket& s) {
  if (s.channel == nullptr || s.phase == Phase::kListening) return false;
  bool changed = false;
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(s.channel, &ev) == 0) {
    changed = true;
    const rdma_cm_event_type type = ev->event;
    const int status = ev->status;
    wire::ConnData cd;
    const bool cd_ok = type == RDMA_CM_EVENT_ESTABLISHED &&
                       wire::DecodeConnData(ev->param.conn.private_data,
                                            ev->param.conn.private_data_len, &cd) &&
                       cd.target_sgl.length != 0;
    rdma_ack_cm_event(ev);
    switch (type) {
      case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (s.phase != Phase::kResolvingAddr) break;
        if (rdma_resolve_route(s.id, 2000) != 0) {
          FailConnect(s, errno);
        } else {
          s.phase = Phase::kResolvingRoute;
        }
        break;
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
        if (s.phase != Phase::kResolvingRoute) break;
        if (const int rc = StartConnect(s); rc != 0) FailConnect(s, rc);
        break;
      case RDMA_CM_EVENT_ESTABLISHED:
        if (s.phase == Phase::kConnecting) {
          if (!cd_ok) {
            SIWX_LOG(kWarn, "rsocket %d: the peer's reply carries no rsocket connection data "
                     "(version 1, 40 octets): is it an rsocket?", s.index);
            FailConnect(s, ENOTSUP);
            (void)rdma_disconnect(s.id);
            s.cm_disconnected = true;
            break;
          }
          SaveConnData(s, cd);
          SetConnected(s);
        } else if (s.phase == Phase::kAccepting) {
          SetConnected(s);
        }
        break;
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_ERROR:
        if (s.phase < Phase::kConnected) FailConnect(s, StatusErrno(status, EHOSTUNREACH));
        break;
      case RDMA_CM_EVENT_UNREACHABLE:
        if (s.phase < Phase::kConnected) FailConnect(s, StatusErrno(status, ETIMEDOUT));
        break;
      case RDMA_CM_EVENT_REJECTED:
        if (s.phase < Phase::kConnected) FailConnect(s, ECONNREFUSED);
        break;
      case RDMA_CM_EVENT_CONNECT_ERROR:
        if (s.phase < Phase::kConnected) FailConnect(s, StatusErrno(status, ECONNREFUSED));
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
        if (s.phase == Phase::kConnected) {
          // Completions the stream delivered before its end come first.
          PollCq(s);
          if (!s.cm_disconnected) MarkBroken(s, 0);  // not our own rdma_disconnect
        } else if (s.phase != Phase::kConnectError && s.phase != Phase::kInit) {
          FailConnect(s, ECONNRESET);
        }
        break;
      default:
        break;
    }
  }
  return changed;
}

// A CONNECT_REQUEST on a listener: a new socket, accepted at once (as stock).
void HandleRequest(Socket& l, rdma_cm_id* id, const wire::ConnData& cd, bool cd_ok,
                   std::uint8_t responder_resources, std::uint8_t initiator_depth) {
  auto child = std::make_shared<Socket>();
  Socket& c = *child;
  c.domain = l.domain;
  c.fs_flags = l.fs_flags;
  c.fd_flags = l.fd_flags;
  c.sbuf_size = l.sbuf_size;
  c.rbuf_size = l.rbuf_size;
  c.sq_size = l.sq_size;
  c.rq_size = l.rq_size;
  c.inline_size = l.inline_size;
  c.iomap_size = l.iomap_size;
  c.so_opts = l.so_opts;
  c.tcp_opts = l.tcp_opts;
  c.keepalive_time = l.keepalive_time;
  c.id = id;
  int rc = 0;
  if (!cd_ok) {
    SIWX_LOG(kInfo, "rsocket %d: a connection request without rsocket connection data "
             "(version 1, 40 octets) was rejected", l.index);
    rc = EPROTO;
  }
  if (rc == 0) rc = NewIndexFd(&c.index);
  if (rc == 0) {
    c.channel = rdma_create_event_channel();
    if (c.channel == nullptr) rc = errno;
  }
  if (rc == 0 && rdma_migrate_id(id, c.channel) != 0) rc = errno;
  if (rc == 0) {
    SetNonBlocking(c.channel->fd);
    rc = CreateEndpoint(c);
  }
  if (rc == 0) {
    SaveConnData(c, cd);
    std::uint8_t pd[wire::kConnDataSize];
    FormatConnData(c, pd);
    rdma_conn_param p{};
    p.private_data = pd;
    p.private_data_len = sizeof(pd);
    p.responder_resources = responder_resources;
    p.initiator_depth = initiator_depth;
    if (rdma_accept(id, &p) != 0) rc = errno;
  }
  if (rc != 0) {
    if (c.phase == Phase::kInit) (void)rdma_reject(id, nullptr, 0);
    DestroySocket(c);
    return;
  }
  c.phase = Phase::kAccepting;
  l.accept_queue.push_back(std::move(child));
}

bool ProcessListenEvents(Socket& l) {
  if (l.channel == nullptr) return false;
  bool changed = false;
  rdma_cm_event* ev = nullptr;
  // Accepted connections the application has not taken yet count against
  // the backlog; beyond it requests wait in the CM (and its backlog applies).
  while (l.accept_queue.size() < static_cast<std::size_t>(l.backlog) &&
         rdma_get_cm_event(l.channel, &ev) == 0) {
    changed = true;
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(ev);
      continue;
    }
    rdma_cm_id* id = ev->id;
    wire::ConnData cd;
    const bool ok =
        wire::DecodeConnData(ev->param.conn.private_data, ev->param.conn.private_data_len, &cd) &&
        cd.target_sgl.length != 0;
    const std::uint8_t rr = ev->param.conn.responder_resources;
    const std::uint8_t id_depth = ev->param.conn.initiator_depth;
    rdma_ack_cm_event(ev);
    HandleRequest(l, id, cd, ok, rr, id_depth);
  }
  return changed;
}

std::uint32_t Clamp(std::uint32_t v, std::uint32_t lo, std::uint32_t hi) {
  return std::max(lo, std::min(v, hi));
}

int CreateEndpoint(Socket& s) {
  ibv_context* ctx = s.id->verbs;
  if (ctx == nullptr) return ENODEV;
  ibv_device_attr da{};
  if (ibv_query_device(ctx, &da) != 0) return ENODEV;
  const auto max_wr = static_cast<std::uint32_t>(std::max(da.max_qp_wr, 0));
  const auto max_cqe = static_cast<std::uint32_t>(std::max(da.max_cqe, 0));
  if (max_wr < kMinQueue + kSpareRecvs || max_cqe < 2 * (kMinQueue + kSpareRecvs)) return ENOMEM;
  s.sq_size = Clamp(s.sq_size, kMinQueue, std::min(kMaxQueue, max_wr - kCtrlReserve));
  s.rq_size = Clamp(s.rq_size, kMinQueue, std::min(kMaxQueue, max_wr - kSpareRecvs));
  s.sq_total = s.sq_size + kCtrlReserve;
  s.rq_total = s.rq_size + kSpareRecvs;
  if (s.sq_total + s.rq_total > max_cqe) {
    s.sq_size = s.rq_size = (max_cqe - kCtrlReserve - kSpareRecvs) / 2;
    s.sq_total = s.sq_size + kCtrlReserve;
    s.rq_total = s.rq_size + kSpareRecvs;
  }
  s.rbuf_size = std::max<std::uint32_t>(s.rbuf_size & ~1u, 2 * kSndLowat);
  s.sbuf_size = std::max<std::uint32_t>(s.sbuf_size, 2 * kSndLowat);

  s.pd = ibv_alloc_pd(ctx);
  if (s.pd == nullptr) return errno != 0 ? errno : ENOMEM;
  s.cc = ibv_create_comp_channel(ctx);
  if (s.cc == nullptr) return errno != 0 ? errno : ENOMEM;
  SetNonBlocking(s.cc->fd);
  s.cq = ibv_create_cq(ctx, static_cast<int>(s.sq_total + s.rq_total), &s, s.cc, 0);
  if (s.cq == nullptr) return errno != 0 ? errno : ENOMEM;
  ibv_qp_init_attr qa{};
  qa.qp_context = &s;
  qa.send_cq = s.cq;
  qa.recv_cq = s.cq;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1;
  qa.cap.max_send_wr = s.sq_total;
  qa.cap.max_recv_wr = s.rq_total;
  qa.cap.max_send_sge = 2;
  qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(s.id, s.pd, &qa) != 0) return errno;

  const std::size_t slen = s.sbuf_size + static_cast<std::size_t>(s.sq_total) * kScratchSlot;
  const std::size_t rlen = s.rbuf_size + static_cast<std::size_t>(s.rq_total) * wire::kMsgSize;
  const std::size_t tlen = wire::kSglSize * wire::kSgeSize +
                           static_cast<std::size_t>(s.iomap_size) * wire::kIomapSize;
  s.sbuf = AllocZeroed(slen);
  s.rbuf = AllocZeroed(rlen);
  s.tables = AllocZeroed(tlen);
  if (s.sbuf == nullptr || s.rbuf == nullptr || s.tables == nullptr) return ENOMEM;
  // ints: ibv_reg_mr is a macro that masks its argument with another enum.
  const int local = IBV_ACCESS_LOCAL_WRITE;
  const int remote = local | static_cast<int>(IBV_ACCESS_REMOTE_WRITE);
  s.smr = ibv_reg_mr(s.pd, s.sbuf, slen, local);
  s.rmr = ibv_reg_mr(s.pd, s.rbuf, rlen, remote);
  s.tmr = ibv_reg_mr(s.pd, s.tables, tlen, remote);
  if (s.smr == nullptr || s.rmr == nullptr || s.tmr == nullptr) return errno != 0 ? errno : ENOMEM;
  s.peer_iomaps.assign(static_cast<std::size_t>(s.iomap_size), wire::Iomap{});

  s.shead = 0;
  s.sbuf_avail = s.sbuf_size;
  s.roffset = 0;
  s.rfree_offset = s.rbuf_size / 2;
  s.rbuf_avail = s.rbuf_size / 2;
  s.rseq_comp = static_cast<std::uint16_t>(s.rq_size / 2);
  for (std::uint32_t i = 0; i < s.rq_total; ++i) {
    if (const int rc = PostRecv(s, i); rc != 0) return rc;
  }
  return 0;
}

void FormatConnData(Socket& s, std::uint8_t out[wire::kConnDataSize]) {
  wire::ConnData c;
  c.version = wire::kVersion;
  c.flags = wire::kFlagIomap | (wire::HostIsBigEndian() ? wire::kFlagNet : 0);
  c.credits = static_cast<std::uint16_t>(s.rq_size);
  c.target_iomap_size = wire::ScaleEncode(s.iomap_size);
  c.target_sgl = {reinterpret_cast<std::uintptr_t>(s.tables), s.tmr->rkey,
                  static_cast<std::uint32_t>(wire::kSglSize)};
  c.data_buf = {reinterpret_cast<std::uintptr_t>(s.rbuf), s.rmr->rkey, s.rbuf_size / 2};
  wire::EncodeConnData(c, out);
}

void SaveConnData(Socket& s, const wire::ConnData& cd) {
  s.remote_sgl = cd.target_sgl;
  s.remote_sge = 1 % static_cast<int>(std::max<std::uint32_t>(cd.target_sgl.length, 1));
  s.swap = ((cd.flags & wire::kFlagNet) != 0) != wire::HostIsBigEndian();
  if ((cd.flags & wire::kFlagIomap) != 0) {
    s.remote_iomap.addr = cd.target_sgl.addr + wire::kSgeSize * cd.target_sgl.length;
    s.remote_iomap.length = static_cast<std::uint32_t>(wire::ScaleDecode(cd.target_iomap_size));
    s.remote_iomap.key = cd.target_sgl.key;
  }
  s.sgl[0] = cd.data_buf;
  for (int i = 1; i < wire::kSglSize; ++i) s.sgl[i] = wire::Sge{};
  s.target_sge = 0;
  s.sseq_no = 0;
  s.sseq_comp = cd.credits;
}

}  // namespace

// ---- registry ---------------------------------------------------------------

namespace {
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_map<int, std::shared_ptr<Socket>>& Registry() {
  static auto* map = new std::unordered_map<int, std::shared_ptr<Socket>>;
  return *map;
}
}  // namespace

std::shared_ptr<Socket> Lookup(int index) {
  std::lock_guard lock(RegistryMutex());
  const auto it = Registry().find(index);
  return it == Registry().end() ? nullptr : it->second;
}

void Register(const std::shared_ptr<Socket>& s) {
  std::lock_guard lock(RegistryMutex());
  Registry()[s->index] = s;
}

std::shared_ptr<Socket> Unregister(int index) {
  std::lock_guard lock(RegistryMutex());
  const auto it = Registry().find(index);
  if (it == Registry().end()) return nullptr;
  auto s = std::move(it->second);
  Registry().erase(it);
  return s;
}

// ---- progress and waiting -----------------------------------------------------

bool Progress(Socket& s) {
  if (s.closed) return false;
  bool changed = false;
  if (s.phase == Phase::kListening) {
    changed = ProcessListenEvents(s);
  } else {
    // CM events first: messages of an accepted socket wait in the CQ until
    // ESTABLISHED has made it a connected one.
    changed = ProcessCmEvents(s);
    if (s.phase == Phase::kConnected) {
      changed |= PollCq(s);
      UpdateCredits(s);
    }
  }
  if (changed) SignalWake(s);
  return changed;
}

void ArmForWait(Socket& s) {
  if (s.cq != nullptr && s.phase == Phase::kConnected && !s.cq_armed) {
    if (ibv_req_notify_cq(s.cq, 0) == 0) s.cq_armed = true;
  }
}

int WaitFds(const Socket& s, pollfd* fds) {
  int n = 0;
  fds[n++] = {s.index, POLLIN, 0};
  if (s.channel != nullptr) fds[n++] = {s.channel->fd, POLLIN, 0};
  if (s.cc != nullptr && s.phase == Phase::kConnected) fds[n++] = {s.cc->fd, POLLIN, 0};
  return n;
}

void AfterWait(Socket& s, const pollfd* fds, int n) {
  for (int i = 0; i < n; ++i) {
    if (fds[i].revents == 0) continue;
    if (fds[i].fd == s.index) {
      DrainWake(s.index);
    } else if (s.cc != nullptr && fds[i].fd == s.cc->fd) {
      DrainCqEvents(s);
    }
  }
}

int WaitUntil(Socket& s, std::unique_lock<std::mutex>& lk, bool nonblock,
              const std::function<bool()>& ready, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (s.closed) return EBADF;
    Progress(s);
    if (ready()) return 0;
    if (nonblock) return EAGAIN;
    ArmForWait(s);
    Progress(s);
    if (ready()) return 0;
    int sleep_ms = kWakeIntervalMs;
    if (timeout_ms >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return ETIMEDOUT;
      sleep_ms = static_cast<int>(std::min<long long>(left, sleep_ms));
    }
    pollfd fds[3];
    const int n = WaitFds(s, fds);
    ++s.waiters;
    lk.unlock();
    (void)poll(fds, static_cast<nfds_t>(n), sleep_ms);
    lk.lock();
    --s.waiters;
    if (s.closed) return EBADF;
    AfterWait(s, fds, n);
  }
}

// ---- operations ----------------------------------------------------------------

int NewSocket(int domain, int type, std::shared_ptr<Socket>* out) {
  auto s = std::make_shared<Socket>();
  s->domain = domain;
  s->fs_flags = (type & SOCK_NONBLOCK) ? O_NONBLOCK : 0;
  s->fd_flags = (type & SOCK_CLOEXEC) ? FD_CLOEXEC : 0;
  s->sbuf_size = kDefaultBufferSize;
  s->rbuf_size = kDefaultBufferSize;
  s->sq_size = kDefaultQueueSize;
  s->rq_size = kDefaultQueueSize;
  s->inline_size = kDefaultInline;
  int rc = NewIndexFd(&s->index);
  if (rc == 0) {
    s->channel = rdma_create_event_channel();
    if (s->channel == nullptr) rc = errno != 0 ? errno : ENOMEM;
  }
  if (rc == 0) {
    SetNonBlocking(s->channel->fd);
    if (rdma_create_id(s->channel, &s->id, s.get(), RDMA_PS_TCP) != 0) rc = errno;
  }
  if (rc != 0) {
    DestroySocket(*s);
    return rc;
  }
  *out = std::move(s);
  return 0;
}

int Connect(Socket& s, std::unique_lock<std::mutex>& lk, const sockaddr* addr) {
  switch (s.phase) {
    case Phase::kInit:
      break;
    case Phase::kResolvingAddr:
    case Phase::kResolvingRoute:
    case Phase::kConnecting:
      if (s.fs_flags & O_NONBLOCK) {
        Progress(s);
        if (s.phase == Phase::kConnected) return EISCONN;
        if (s.phase == Phase::kConnectError) {
          const int e = s.so_error;
          s.so_error = 0;
          return e;
        }
        return EALREADY;
      }
      break;
    case Phase::kConnected:
    case Phase::kAccepting:
      return EISCONN;
    case Phase::kListening:
      return EINVAL;
    case Phase::kConnectError:
      return ECONNABORTED;
  }
  if (s.phase == Phase::kInit) {
    if (rdma_resolve_addr(s.id, nullptr, const_cast<sockaddr*>(addr), 2000) != 0) return errno;
    s.phase = Phase::kResolvingAddr;
  }
  const int rc = WaitUntil(s, lk, (s.fs_flags & O_NONBLOCK) != 0, [&] {
    return s.phase == Phase::kConnected || s.phase == Phase::kConnectError;
  }, -1);
  if (rc == EAGAIN) return EINPROGRESS;
  if (rc != 0) return rc;
  if (s.phase == Phase::kConnectError) {
    const int e = s.so_error;
    s.so_error = 0;
    return e;
  }
  return 0;
}

int Listen(Socket& s, int backlog) {
  if (s.phase == Phase::kListening) return 0;
  if (s.phase != Phase::kInit) return EINVAL;
  if (!s.bound) {
    sockaddr_storage any{};
    any.ss_family = static_cast<sa_family_t>(s.domain);
    if (rdma_bind_addr(s.id, reinterpret_cast<sockaddr*>(&any)) != 0) return errno;
    s.bound = true;
  }
  s.backlog = backlog > 0 ? std::min(backlog, 4096) : 128;
  if (rdma_listen(s.id, s.backlog) != 0) return errno;
  s.phase = Phase::kListening;
  return 0;
}

int Accept(Socket& l, std::unique_lock<std::mutex>& lk, std::shared_ptr<Socket>* out) {
  if (l.phase != Phase::kListening) return EINVAL;
  const int rc = WaitUntil(l, lk, (l.fs_flags & O_NONBLOCK) != 0,
                           [&] { return !l.accept_queue.empty(); }, -1);
  if (rc != 0) return rc;
  *out = std::move(l.accept_queue.front());
  l.accept_queue.pop_front();
  return 0;
}

// Waits (or not) for a socket still in connection setup; 0 once connected.
int AwaitConnected(Socket& s, std::unique_lock<std::mutex>& lk, bool nonblock) {
  if (s.phase == Phase::kConnected) return 0;
  if (s.phase == Phase::kInit || s.phase == Phase::kListening) return ENOTCONN;
  if (s.phase == Phase::kConnectError) return s.so_error != 0 ? s.so_error : ENOTCONN;
  const int rc = WaitUntil(s, lk, nonblock, [&] {
    return s.phase == Phase::kConnected || s.phase == Phase::kConnectError;
  }, -1);
  if (rc != 0) return rc;
  return s.phase == Phase::kConnected ? 0 : (s.so_error != 0 ? s.so_error : ENOTCONN);
}

namespace {

// Copies `len` octets from an iovec cursor.
struct IovCursor {
  const iovec* iov;
  int cnt;
  int i = 0;
  std::size_t off = 0;
  void Copy(std::uint8_t* dst, std::size_t len) {
    while (len > 0 && i < cnt) {
      const std::size_t n = std::min(len, iov[i].iov_len - off);
      std::memcpy(dst, static_cast<const std::uint8_t*>(iov[i].iov_base) + off, n);
      dst += n;
      len -= n;
      off += n;
      if (off == iov[i].iov_len) {
        ++i;
        off = 0;
      }
    }
  }
};

// Stages `len` octets in the send ring; fills one or two SGEs.
int StageInRing(Socket& s, IovCursor& src, std::uint32_t len, ibv_sge sge[2]) {
  const std::uint32_t to_end = s.sbuf_size - s.shead;
  const std::uint32_t first = std::min(len, to_end);
  src.Copy(s.sbuf + s.shead, first);
  sge[0] = {reinterpret_cast<std::uintptr_t>(s.sbuf + s.shead), first, s.smr->lkey};
  int n = 1;
  if (first < len) {
    src.Copy(s.sbuf, len - first);
    sge[1] = {reinterpret_cast<std::uintptr_t>(s.sbuf), len - first, s.smr->lkey};
    n = 2;
  }
  s.shead = (s.shead + len) % s.sbuf_size;
  s.sbuf_avail -= len;
  return n;
}

int PostRingWrite(Socket& s, ibv_sge* sge, int nsge, std::uint32_t len, WrKind kind,
                  std::uint64_t raddr, std::uint32_t rkey) {
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kind, len);
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return PostSend(s, &wr);
}

int SendError(const Socket& s) {
  if (s.phase != Phase::kConnected) return ENOTCONN;
  if (s.peer_gone || s.peer_closed) return ECONNRESET;
  return EPIPE;
}

// Waits until a message may be sent: 0 once one may, else the wait's errno
// or, for a socket that stopped being writable, SendError's.
int WaitToSend(Socket& s, std::unique_lock<std::mutex>& lk, bool nonblock) {
  const int rc = WaitUntil(s, lk, nonblock, [&] { return CanSendData(s) || !s.writable; }, -1);
  if (rc != 0) return rc;
  return s.writable ? 0 : SendError(s);
}

// Sends the iomap entries riomap queued for the peer.
int SendIomaps(Socket& s, std::unique_lock<std::mutex>& lk, bool nonblock) {
  for (LocalIomap& m : s.iomaps) {
    if (m.index < 0 || m.sent) continue;
    if (const int rc = WaitToSend(s, lk, nonblock); rc != 0) return rc;
    wire::Iomap e{m.offset, {reinterpret_cast<std::uintptr_t>(m.mr->addr), m.mr->rkey,
                             static_cast<std::uint32_t>(m.mr->length)}};
    std::uint8_t enc[wire::kIomapSize];
    wire::EncodeIomap(e, s.swap, enc);
    const int prc = PostWriteMsg(
        s, enc, wire::kIomapSize,
        s.remote_iomap.addr + static_cast<std::uint64_t>(m.index) * wire::kIomapSize,
        s.remote_iomap.key, wire::MakeMsg(wire::kOpIomapSgl, static_cast<std::uint32_t>(m.index)));
    if (prc != 0) return SendError(s);
    ++s.sseq_no;  // as stock: an iomap message takes a credit
    m.sent = true;
  }
  s.iomap_pending = false;
  return 0;
}

}  // namespace

ssize_t SendV(Socket& s, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt,
              int flags) {
  std::size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  const bool nonblock = (s.fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT);
  if (int rc = AwaitConnected(s, lk, nonblock); rc != 0) return -rc;
  if (total == 0) return 0;
  if (!s.writable) return -SendError(s);
  if (s.iomap_pending) {
    if (int rc = SendIomaps(s, lk, nonblock); rc != 0) return -rc;
  }
  IovCursor src{iov, iovcnt};
  std::size_t sent = 0;
  std::uint32_t chunk = kOverlapStart;
  int err = 0;
  while (sent < total) {
    if (!CanSendData(s)) {
      err = WaitToSend(s, lk, nonblock);
      if (err != 0) break;
    }
    std::size_t left = total - sent;
    std::uint32_t xfer;
    if (left > chunk) {
      xfer = chunk;
      if (chunk < kMaxTransfer) chunk <<= 1;
    } else {
      xfer = static_cast<std::uint32_t>(left);
    }
    wire::Sge& target = s.sgl[s.target_sge];
    xfer = std::min({xfer, s.sbuf_avail, target.length});
    ibv_sge sge[2];
    const int nsge = StageInRing(s, src, xfer, sge);
    const std::uint64_t raddr = target.addr;
    const std::uint32_t rkey = target.key;
    target.addr += xfer;
    target.length -= xfer;
    if (target.length == 0) {
      const PeerWrittenAccess hidden;
      SharedSgl(s)[s.target_sge].length = 0;  // let the refresh see the peer's next entry
      s.target_sge = (s.target_sge + 1) % wire::kSglSize;
    }
    ++s.sseq_no;
    if (PostRingWrite(s, sge, nsge, xfer, kWrData, raddr, rkey) != 0 ||
        PostMsg(s, wire::MakeMsg(wire::kOpData, xfer)) != 0) {
      err = SendError(s);
      break;
    }
    sent += xfer;
  }
  if (sent > 0) return static_cast<ssize_t>(sent);
  return -err;
}

ssize_t IoWrite(Socket& s, std::unique_lock<std::mutex>& lk, const void* buf, std::size_t count,
                std::uint64_t offset, int flags) {
  const bool nonblock = (s.fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT);
  if (int rc = AwaitConnected(s, lk, nonblock); rc != 0) return -rc;
  if (!s.writable) return -SendError(s);
  if (s.iomap_pending) {
    if (int rc = SendIomaps(s, lk, nonblock); rc != 0) return -rc;
  }
  const iovec one{const_cast<void*>(buf), count};
  IovCursor src{&one, 1};
  std::size_t sent = 0;
  std::uint32_t chunk = kOverlapStart;
  int err = 0;
  while (sent < count) {
    // The peer's mapping that holds `offset` (published by an IOMAP_SGL message).
    const wire::Iomap* map = nullptr;
    for (const wire::Iomap& m : s.peer_iomaps) {
      if (m.sge.length != 0 && offset >= m.offset && offset < m.offset + m.sge.length) {
        map = &m;
        break;
      }
    }
    if (map == nullptr) {
      err = EINVAL;  // no remote mapping covers this offset (yet)
      break;
    }
    if (!CanSendData(s)) {
      err = WaitToSend(s, lk, nonblock);
      if (err != 0) break;
      continue;  // the table may have changed while we waited
    }
    const std::size_t left = count - sent;
    std::uint32_t xfer;
    if (left > chunk) {
      xfer = chunk;
      if (chunk < kMaxTransfer) chunk <<= 1;
    } else {
      xfer = static_cast<std::uint32_t>(left);
    }
    xfer = static_cast<std::uint32_t>(
        std::min<std::uint64_t>({xfer, s.sbuf_avail, map->offset + map->sge.length - offset}));
    const std::uint64_t raddr = map->sge.addr + (offset - map->offset);
    const std::uint32_t rkey = map->sge.key;
    ibv_sge sge[2];
    const int nsge = StageInRing(s, src, xfer, sge);
    if (PostRingWrite(s, sge, nsge, xfer, kWrDirect, raddr, rkey) != 0) {
      err = SendError(s);
      break;
    }
    sent += xfer;
    offset += xfer;
  }
  if (sent > 0) return static_cast<ssize_t>(sent);
  return -err;
}

namespace {
std::size_t CopyOut(Socket& s, std::uint8_t* dst, std::size_t len, bool consume) {
  // The ring is refilled by the peer once we advertised it again.
  const PeerWrittenAccess hidden;
  std::size_t copied = 0;
  std::uint32_t off = s.roffset;
  for (std::size_t m = 0; copied < len && m < s.rmsg.size();) {
    const std::uint32_t avail = s.rmsg[m];
    const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::size_t>(len - copied, avail));
    const std::uint32_t first = std::min(n, s.rbuf_size - off);
    std::memcpy(dst + copied, s.rbuf + off, first);
    if (first < n) std::memcpy(dst + copied + first, s.rbuf, n - first);
    off = (off + n) % s.rbuf_size;
    copied += n;
    if (consume) {
      s.rbuf_avail += n;
      s.rqueued -= n;
      if (n == avail) {
        s.rmsg.pop_front();
        ++s.rseq_no;
      } else {
        s.rmsg.front() -= n;
      }
    } else {
      ++m;
    }
  }
  if (consume) s.roffset = off;
  return copied;
}
}  // namespace

ssize_t Recv(Socket& s, std::unique_lock<std::mutex>& lk, void* buf, std::size_t len, int flags) {
  const bool nonblock = (s.fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT);
  if (int rc = AwaitConnected(s, lk, nonblock); rc != 0) return -rc;
  if (len == 0) return 0;
  auto* dst = static_cast<std::uint8_t*>(buf);
  std::size_t copied = 0;
  int err = 0;
  do {
    if (s.rmsg.empty()) {
      // Non-blocking with MSG_WAITALL: what is there (as Linux TCP).
      err = WaitUntil(s, lk, nonblock, [&] { return !s.rmsg.empty() || !s.readable; }, -1);
      if (err != 0) break;
    }
    if (flags & MSG_PEEK) {
      copied = CopyOut(s, dst, len, false);
      break;
    }
    copied += CopyOut(s, dst + copied, len - copied, true);
    UpdateCredits(s);
  } while (copied < len && (flags & MSG_WAITALL) && (s.readable || !s.rmsg.empty()));
  if (copied > 0) return static_cast<ssize_t>(copied);
  if (err != 0) return -err;
  return 0;  // end of stream
}

int Shutdown(Socket& s, std::unique_lock<std::mutex>& lk, int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return EINVAL;
  if (s.phase != Phase::kConnected) return ENOTCONN;
  Progress(s);
  bool send_disconnect = false, send_shutdown = false;
  if (how == SHUT_RD || how == SHUT_RDWR) s.readable = false;
  if (how == SHUT_WR || how == SHUT_RDWR) {
    if (s.writable) {
      s.writable = false;
      if (s.readable) {
        send_shutdown = true;
      } else {
        send_disconnect = true;
      }
    }
  }
  if (!s.readable && !s.writable && !s.disconnect_sent) send_disconnect = true;
  if ((send_disconnect || send_shutdown) && !s.peer_gone && !s.peer_closed) {
    if (WaitUntil(s, lk, false, [&] { return CtrlSlotsFree(s, 1) || s.peer_gone; },
                  kTeardownMs) == 0 && !s.peer_gone) {
      (void)PostMsg(s, wire::MakeMsg(wire::kOpCtrl, send_disconnect ? wire::kCtrlDisconnect
                                                                     : wire::kCtrlShutdown));
    }
  }
  if (send_disconnect) s.disconnect_sent = true;
  // Everything posted leaves before the stream is closed (bounded).
  (void)WaitUntil(s, lk, false, [&] { return s.sq_used == 0 || s.peer_gone; }, kTeardownMs);
  // The peer closes first, or rclose disconnects after a bounded wait.
  if (!s.readable && !s.writable && !s.cm_disconnected && (s.peer_closed || s.peer_gone)) {
    (void)rdma_disconnect(s.id);
    s.cm_disconnected = true;
  }
  return 0;
}

void DestroySocket(Socket& s) {
  s.closed = true;
  for (auto& child : s.accept_queue) DestroySocket(*child);
  s.accept_queue.clear();
  if (s.id != nullptr && s.phase == Phase::kConnected && !s.cm_disconnected) {
    (void)rdma_disconnect(s.id);
    s.cm_disconnected = true;
  }
  if (s.channel != nullptr) {
    // Requests that arrived at a listener and were never accepted are refused.
    rdma_cm_event* ev = nullptr;
    SetNonBlocking(s.channel->fd);
    while (rdma_get_cm_event(s.channel, &ev) == 0) {
      rdma_cm_id* req = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : nullptr;
      rdma_ack_cm_event(ev);
      if (req != nullptr) {
        (void)rdma_reject(req, nullptr, 0);
        (void)rdma_destroy_id(req);
      }
    }
  }
  for (LocalIomap& m : s.iomaps) {
    if (m.mr != nullptr) ibv_dereg_mr(m.mr);
  }
  s.iomaps.clear();
  if (s.id != nullptr && s.id->qp != nullptr) rdma_destroy_qp(s.id);
  if (s.cq != nullptr) {
    DrainCqEvents(s);
    if (s.unacked_cq_events != 0) ibv_ack_cq_events(s.cq, s.unacked_cq_events);
    ibv_destroy_cq(s.cq);
    s.cq = nullptr;
  }
  if (s.cc != nullptr) {
    ibv_destroy_comp_channel(s.cc);
    s.cc = nullptr;
  }
  for (ibv_mr** mr : {&s.smr, &s.rmr, &s.tmr}) {
    if (*mr != nullptr) ibv_dereg_mr(*mr);
    *mr = nullptr;
  }
  std::free(s.sbuf);
  std::free(s.rbuf);
  std::free(s.tables);
  s.sbuf = s.rbuf = s.tables = nullptr;
  if (s.pd != nullptr) {
    ibv_dealloc_pd(s.pd);
    s.pd = nullptr;
  }
  if (s.id != nullptr) {
    (void)rdma_destroy_id(s.id);
    s.id = nullptr;
  }
  if (s.channel != nullptr) {
    rdma_destroy_event_channel(s.channel);
    s.channel = nullptr;
  }
  if (s.index >= 0) {
    close(s.index);
    s.index = -1;
  }
}

namespace {

// Sockets closed before their peer: the first end to close keeps its QP
// until the peer's DISCONNECT, the end of the stream or kLingerMs, as the
// kernel keeps a closed TCP socket. Destroying the QP at once would reset a
// connection that still drains, and a reset makes the peer's kernel drop
// what its engine has not read yet (our last writes: riostream's client,
// spinning on iomapped memory, lost them). One thread serves them all.
struct Lingerer {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Socket>> sockets;
  std::thread thread;
  pid_t owner = 0;  // the process the thread runs in (a forked child has none)
  bool stop = false;
};

Lingerer& Lingering() {
  static auto* l = new Lingerer;
  return *l;
}

void Disconnect(Socket& s) {
  if (!s.cm_disconnected) {
    (void)rdma_disconnect(s.id);
    s.cm_disconnected = true;
  }
}

void LingerLoop() {
  Lingerer& l = Lingering();
  std::unique_lock lock(l.mu);
  for (;;) {
    if (l.sockets.empty()) {
      l.cv.wait(lock, [&] { return l.stop || !l.sockets.empty(); });
    } else {
      l.cv.wait_for(lock, std::chrono::milliseconds(5), [&] { return l.stop; });
    }
    if (l.stop) return;
    std::vector<std::shared_ptr<Socket>> batch = l.sockets;
    lock.unlock();
    std::vector<Socket*> done;
    for (const auto& sp : batch) {
      Socket& s = *sp;
      std::lock_guard slock(s.mu);
      Progress(s);
      if (s.peer_closed || s.peer_gone || std::chrono::steady_clock::now() >= s.linger_deadline) {
        Disconnect(s);
        DestroySocket(s);
        done.push_back(&s);
      }
    }
    lock.lock();
    std::erase_if(l.sockets, [&](const auto& sp) {
      return std::find(done.begin(), done.end(), sp.get()) != done.end();
    });
  }
}

void StopLingering() {
  Lingerer& l = Lingering();
  if (l.owner != getpid()) return;  // a child of fork(): the thread is not here
  {
    std::lock_guard lock(l.mu);
    l.stop = true;
  }
  l.cv.notify_all();
  if (l.thread.joinable()) l.thread.join();
}

void Linger(const std::shared_ptr<Socket>& s) {
  Lingerer& l = Lingering();
  std::lock_guard lock(l.mu);
  if (l.stop) {
    DestroySocket(*s);  // exiting: nobody would serve it
    return;
  }
  if (l.owner != getpid()) {
    // First use, or a child of fork(): the parent's thread did not follow.
    if (l.owner == 0) std::atexit(StopLingering);
    // The parent's thread object: neither joinable nor detachable here; kept.
    if (l.thread.joinable()) new std::thread(std::move(l.thread));
    l.sockets.clear();
    l.thread = util::StartServiceThread("siwx-rs-linger", LingerLoop);
    l.owner = getpid();
  }
  l.sockets.push_back(s);
  l.cv.notify_all();
}

}  // namespace

int Close(const std::shared_ptr<Socket>& sp, std::unique_lock<std::mutex>& lk) {
  Socket& s = *sp;
  if (s.phase == Phase::kConnected && (s.readable || s.writable)) {
    (void)Shutdown(s, lk, SHUT_RDWR);
  }
  if (s.phase == Phase::kConnected && !s.cm_disconnected) {
    Progress(s);
    if (!s.peer_closed && !s.peer_gone) {
      s.linger_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLingerMs);
      lk.unlock();
      Linger(sp);
      return 0;
    }
    Disconnect(s);
  }
  DestroySocket(s);
  return 0;
}

short Revents(Socket& s, short events) {
  short rev = 0;
  switch (s.phase) {
    case Phase::kListening:
      if (!s.accept_queue.empty()) rev |= events & (POLLIN | POLLRDNORM);
      break;
    case Phase::kConnected:
      if (!s.rmsg.empty() || !s.readable) rev |= events & (POLLIN | POLLRDNORM);
      if (CanSendData(s)) rev |= events & (POLLOUT | POLLWRNORM);
      // Hang-up once the data that arrived before it is read: rstream -T a
      // takes POLLHUP for an error and would lose the peer's last transfer.
      if ((s.peer_gone || s.peer_closed) && s.rmsg.empty()) rev |= POLLHUP;
      if (s.so_error != 0 && s.so_error != ECONNRESET) rev |= POLLERR;
      break;
    case Phase::kConnectError:
      rev |= (events & (POLLIN | POLLOUT)) | POLLERR;
      break;
    default:
      break;
  }
  return rev;
}

}  // namespace siwx::rs
