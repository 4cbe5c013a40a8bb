// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Queue pairs: verbs objects over engine::Qp (common/engine/qp.h), which
// holds the iWARP semantics; this file only translates.
//
// Creation (ibv_create_qp(3), ibv_create_qp_ex(3)): RC only (RFC 5040 has no
// datagram service), a send CQ and a receive CQ (receive completions of an
// SRQ QP go to its receive CQ too), capacities within the device limits. The
// QP takes a unit of the device's QP budget and a `users` count on its PD,
// CQs and SRQ, which refuse destruction while it lives. ibv_create_qp fills
// nothing itself, so CreateQp sets every field ibv_cmd_create_qp would.
// The capacities written back are the ones in force: the requested ones,
// except that a QP without an SRQ has room for at least one receive WR, an
// SRQ QP reports 0 receive WRs and SGEs (it has no receive queue), and every
// QP takes the device's maximum inline size, which costs nothing (each WR
// record has room for it) and is what kernel siw reports; ibv_create_qp(3)
// allows more than asked. libfabric's verbs provider sizes inject_size on
// iWARP from the first value a create returns, and asks for 2.
//
// States (ibv_modify_qp(3) on an iWARP device; qp_state.h has the table):
// RESET -> INIT -> RTR as usual. RTS is entered when the connection manager
// binds the MPA-negotiated stream (siwx_qp_bind_stream, stream.cc), as an
// iWARP QP moves to RTS when iw_cm hands it its connection. A modify to RTS
// from RTR before that is accepted and changes nothing: librdmacm-driven
// applications that create their own QP (rping -q) move it to RTS before
// rdma_establish()/rdma_accept() binds the stream; the bind then moves it.
// SQD is the graceful close (FIN after queued work), ERR flushes and resets
// the connection, RESET discards everything. IBV_QP_CUR_STATE must name the
// current state.
//
// Attributes: IBV_QP_ACCESS_FLAGS (remote read/write/atomic, MW bind), the
// IRD/ORD attributes, the timeout and the retry count are recorded and
// reported by query_qp; IBV_QP_PORT must be port 1. The other InfiniBand
// path attributes (P_Key index, Q_Key, path MTU, PSNs, RNR timer, alternate
// path, migration state, SQD notification) mean nothing on iWARP and are
// ignored, as kernel siw ignores them; the AV and destination QPN arm the
// out-of-band connect (oob.cc), and for QPs so connected the timeout and
// retry count bound how long sends wait once the peer ended its QP
// (engine::Qp::SetIbRetryTimeout). Resizing (IBV_QP_CAP) is not offered
// and mask bits past IBV_QP_DEST_QPN (rate limit, ...) are EOPNOTSUPP, as
// ibv_cmd_modify_qp answers. Any invalid attribute fails the whole call with
// nothing changed.
//
// Posting: ibv_send_wr/ibv_recv_wr lists become engine work requests (the
// ibv_wr_* API of ibv_create_qp_ex QPs is in qp_ex.cc).
// SEND, SEND_WITH_INV, RDMA_WRITE, RDMA_READ and LOCAL_INV are served; the
// immediate-data opcodes, atomics, BIND_MW, TSO and driver opcodes are EINVAL,
// as the rdma-core siw provider answers. Flags FENCE, SIGNALED, SOLICITED and
// INLINE; any other flag is EINVAL. Inline data is copied at post time (the
// lkeys are not used) up to max_inline_data. Errors are returned, not set in
// errno: ENOMEM when the queue is full, EINVAL for anything wrong with a WR
// or for a QP whose state does not take posts (send: before RTS; receive: in
// RESET, or a QP with an SRQ). *bad_wr is the first WR not posted; the ones
// before it are posted.
//
// Destruction (ibv_destroy_qp(3)) is safe while the progress thread runs:
// the QP leaves the context's qp_num map first (no more async events for it),
// the engine QP is destroyed (when that returns no engine thread touches its
// buffers or CQs), its completions still queued are removed from its CQs
// (RemoveQueuedCompletions says which and why), unread async events about
// it are taken back and read ones awaited (as destroy_cq does), and the CM
// hears that its stream ended.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>

#include "common/wire/terminate.h"
#include "common/util/log.h"
#include "providers/siwx/oob.h"
#include "providers/siwx/provider.h"

namespace siwx::provider {
namespace {

static_assert(static_cast<int>(engine::QpState::kReset) == IBV_QPS_RESET);
static_assert(static_cast<int>(engine::QpState::kInit) == IBV_QPS_INIT);
static_assert(static_cast<int>(engine::QpState::kRtr) == IBV_QPS_RTR);
static_assert(static_cast<int>(engine::QpState::kRts) == IBV_QPS_RTS);
static_assert(static_cast<int>(engine::QpState::kClosing) == IBV_QPS_SQD);
static_assert(static_cast<int>(engine::QpState::kTerminate) == IBV_QPS_SQE);
static_assert(static_cast<int>(engine::QpState::kError) == IBV_QPS_ERR);
static_assert(static_cast<unsigned>(engine::kSendFence) ==
              static_cast<unsigned>(IBV_SEND_FENCE));
static_assert(static_cast<unsigned>(engine::kSendSignaled) ==
              static_cast<unsigned>(IBV_SEND_SIGNALED));
static_assert(static_cast<unsigned>(engine::kSendSolicited) ==
              static_cast<unsigned>(IBV_SEND_SOLICITED));
static_assert(static_cast<unsigned>(engine::kSendInline) ==
              static_cast<unsigned>(IBV_SEND_INLINE));
static_assert(static_cast<int>(engine::AsyncEventType::kQpFatal) == IBV_EVENT_QP_FATAL);
static_assert(static_cast<int>(engine::AsyncEventType::kQpRequestError) == IBV_EVENT_QP_REQ_ERR);
static_assert(static_cast<int>(engine::AsyncEventType::kQpAccessError) ==
              IBV_EVENT_QP_ACCESS_ERR);
static_assert(static_cast<int>(engine::AsyncEventType::kQpLastWqeReached) ==
              IBV_EVENT_QP_LAST_WQE_REACHED);

// Mask bits ibv_cmd_modify_qp passes on (IBV_QP_STATE .. IBV_QP_DEST_QPN).
constexpr int kStandardAttrBits = (IBV_QP_DEST_QPN << 1) - 1;
// The access rights a QP can enable for inbound operations.
constexpr unsigned int kQpAccessBits = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                       IBV_ACCESS_MW_BIND;
// Send WRs are converted and handed to the engine this many at a time.
constexpr std::size_t kPostBatch = 8;

// The async events that name a QP (purged on destroy).
const std::initializer_list<ibv_event_type> kQpEventTypes = {
    IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_QP_LAST_WQE_REACHED, IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED};

// The value an application stored in an enum field, read without loading
// the enum type: C lets any int in, and C++ may assume only the enumerators'
// range (UBSan's -fsanitize=enum checks exactly that).
template <typename Enum>
std::uint32_t RawValue(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(std::uint32_t));
  std::uint32_t value;
  std::memcpy(&value, &field, sizeof(value));
  return value;
}

// The create checks: 0 or the errno ibv_create_qp fails with.
int CheckInitAttr(ibv_context* context, const ibv_qp_init_attr& attr) {
  // iWARP has reliable connected QPs only (RFC 5040 defines no datagrams);
  // kernel siw's siw_create_qp answers EOPNOTSUPP too.
  if (const std::uint32_t type = RawValue(attr.qp_type); type != IBV_QPT_RC) {
    const char* name = type == IBV_QPT_UD ? "UD" : type == IBV_QPT_UC ? "UC" : "other than RC";
    SIWX_LOG(kDebug, "ibv_create_qp: QP type %s: iWARP has reliable connected QPs only "
             "(EOPNOTSUPP)", name);
    return EOPNOTSUPP;
  }
  // Receive completions, also those of an SRQ, go to the receive CQ.
  if (attr.send_cq == nullptr || attr.recv_cq == nullptr) return EINVAL;
  if (attr.send_cq->context != context || attr.recv_cq->context != context ||
      (attr.srq != nullptr && attr.srq->context != context)) {
    return EINVAL;
  }
  const ibv_qp_cap& cap = attr.cap;
  if (cap.max_send_wr == 0 || cap.max_send_wr > DeviceLimits::kMaxQpWr ||
      cap.max_send_sge > DeviceLimits::kMaxSge || cap.max_inline_data > DeviceLimits::kMaxInlineData) {
    return EINVAL;
  }
  // ibv_create_qp(3): max_recv_wr and max_recv_sge are ignored with an SRQ.
  if (attr.srq == nullptr &&
      (cap.max_recv_wr > DeviceLimits::kMaxQpWr || cap.max_recv_sge > DeviceLimits::kMaxSge)) {
    return EINVAL;
  }
  return 0;
}

int ErrnoOf(engine::PostStatus status) {
  return status == engine::PostStatus::kQueueFull ? ENOMEM : EINVAL;
}

// Releases what CreateQp took, in reverse.
void ReleaseQp(Qp* qp) {
  if (qp->srq != nullptr) qp->srq->users.fetch_sub(1);
  qp->recv_cq->users.fetch_sub(1);
  qp->send_cq->users.fetch_sub(1);
  qp->pd->users.fetch_sub(1);
  ReturnBudget(qp->context->state->device->qp_count);
  pthread_cond_destroy(&qp->vqp.qp.cond);
  pthread_mutex_destroy(&qp->vqp.qp.mutex);
  DisableSendApi(qp);
  delete qp->shared;
  delete qp;
}

ibv_qp* CreateEngineQp(ibv_pd* ibpd, ibv_qp_init_attr* attr) {
  Pd* pd = ToSiwx(ibpd);
  Context* context = ToSiwx(ibpd->context);
  ContextState* state = context->state;
  Device* device = state->device;
  if (!TakeBudget(device->qp_count, DeviceLimits::kMaxQp)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* qp = new (std::nothrow) Qp();
  auto* shared = new (std::nothrow) QpShared();
  if (qp == nullptr || shared == nullptr) {
    delete qp;
    delete shared;
    ReturnBudget(device->qp_count);
    errno = ENOMEM;
    return nullptr;
  }
  Cq* send_cq = ToSiwx(attr->send_cq);
  Cq* recv_cq = ToSiwx(attr->recv_cq);
  Srq* srq = attr->srq != nullptr ? ToSiwx(attr->srq) : nullptr;

  engine::QpConfig config;
  config.pd = pd->id;
  config.send_cq = send_cq->queue;
  config.recv_cq = recv_cq->queue;
  config.srq = srq != nullptr ? srq->queue : nullptr;
  config.sq_caps = {attr->cap.max_send_wr, attr->cap.max_send_sge, DeviceLimits::kMaxInlineData};
  if (srq == nullptr) {
    // A receive queue needs room for one WR; an application that asked for
    // none gets one (the caps written back say so).
    config.rq_caps = {std::max<std::uint32_t>(attr->cap.max_recv_wr, 1), attr->cap.max_recv_sge,
                      0};
  }
  config.sq_sig_all = attr->sq_sig_all != 0;
  config.max_ird = DeviceLimits::kMaxIrd;
  config.max_ord = DeviceLimits::kMaxOrd;

  engine::CreateQpStatus status = engine::CreateQpStatus::kNoResources;
  try {
    shared->engine = state->engine->CreateQp(config, &status);
  } catch (...) {
    shared->engine.reset();
    status = engine::CreateQpStatus::kNoResources;
  }
  if (shared->engine == nullptr) {
    delete shared;
    delete qp;
    ReturnBudget(device->qp_count);
    errno = status == engine::CreateQpStatus::kInvalidConfig ? EINVAL : ENOMEM;
    return nullptr;
  }

  qp->context = context;
  qp->pd = pd;
  qp->send_cq = send_cq;
  qp->recv_cq = recv_cq;
  qp->srq = srq;
  qp->shared = shared;
  ibv_qp& ib = qp->vqp.qp;
  ib.context = ibpd->context;
  ib.qp_context = attr->qp_context;
  ib.pd = ibpd;
  ib.send_cq = attr->send_cq;
  ib.recv_cq = attr->recv_cq;
  ib.srq = attr->srq;
  ib.qp_num = shared->engine->qp_num();
  ib.handle = ib.qp_num;
  ib.state = IBV_QPS_RESET;
  ib.qp_type = IBV_QPT_RC;
  ib.events_completed = 0;
  pthread_mutex_init(&ib.mutex, nullptr);
  pthread_cond_init(&ib.cond, nullptr);
  qp->vqp.comp_mask = 0;
  qp->vqp.xrcd = nullptr;

  bool registered = false;
  try {
    std::lock_guard<std::mutex> lock(state->qp_mutex);
    registered = state->qps.emplace(ib.qp_num, qp).second;
  } catch (...) {
    registered = false;
  }
  pd->users.fetch_add(1);
  send_cq->users.fetch_add(1);
  recv_cq->users.fetch_add(1);
  if (srq != nullptr) srq->users.fetch_add(1);
  if (!registered) {
    shared->engine->Destroy();
    ReleaseQp(qp);
    errno = ENOMEM;
    return nullptr;
  }

  attr->cap.max_inline_data = config.sq_caps.max_inline_data;
  if (srq != nullptr) {
    attr->cap.max_recv_wr = 0;
    attr->cap.max_recv_sge = 0;
  } else {
    attr->cap.max_recv_wr = config.rq_caps.max_wr;
  }
  SIWX_LOG(kDebug, "%s: QP %u created (sq %u wr, rq %u wr%s)", ibpd->context->device->name,
           ib.qp_num, attr->cap.max_send_wr, attr->cap.max_recv_wr,
           srq != nullptr ? ", SRQ" : "");
  return &ib;
}

// The InfiniBand transport timeout (ibv_modify_qp(3)): the local ACK timeout
// 4.096 us x 2^timeout, tried retry_cnt + 1 times; timeout 0 waits for ever
// (zero here). The fields are 5 and 3 bits wide; larger values count as
// their maximum.
std::chrono::nanoseconds IbRetryTimeout(std::uint8_t timeout, std::uint8_t retry_cnt) {
  if (timeout == 0) return std::chrono::nanoseconds::zero();
  const std::int64_t ack_timeout_ns = std::int64_t{4096} << std::min<int>(timeout, 31);
  return std::chrono::nanoseconds(ack_timeout_ns * (std::min<int>(retry_cnt, 7) + 1));
}

// The checks of modify_qp that need no state: 0 or the errno.
int CheckModifyAttr(const ibv_qp_attr& attr, int attr_mask) {
  if ((attr_mask & ~kStandardAttrBits) != 0) return EOPNOTSUPP;
  // Resizing: the device does not advertise IBV_DEVICE_RESIZE_MAX_WR.
  if ((attr_mask & IBV_QP_CAP) != 0) return EOPNOTSUPP;
  // IBV_QPS_UNKNOWN and anything else past ERR is no state to be in.
  if ((attr_mask & IBV_QP_STATE) != 0 && RawValue(attr.qp_state) > IBV_QPS_ERR) return EINVAL;
  if ((attr_mask & IBV_QP_CUR_STATE) != 0 && RawValue(attr.cur_qp_state) > IBV_QPS_ERR) {
    return EINVAL;
  }
  if ((attr_mask & IBV_QP_PORT) != 0 && attr.port_num != 1) return EINVAL;
  if ((attr_mask & IBV_QP_ACCESS_FLAGS) != 0 &&
      (static_cast<unsigned int>(attr.qp_access_flags) & ~kQpAccessBits) != 0) {
    return EINVAL;
  }
  if ((attr_mask & IBV_QP_MAX_QP_RD_ATOMIC) != 0 && attr.max_rd_atomic > DeviceLimits::kMaxOrd) {
    return EINVAL;
  }
  if ((attr_mask & IBV_QP_MAX_DEST_RD_ATOMIC) != 0 &&
      attr.max_dest_rd_atomic > DeviceLimits::kMaxIrd) {
    return EINVAL;
  }
  return 0;
}

// One send WR as an engine record: 0 or EINVAL.
// `out` may hold an earlier WR: every field that matters is set (the SGEs
// past num_sge and the inline octets past inline_length are never read).
int ToEngine(const ibv_send_wr& wr, engine::SendWorkRequest* out) {
  if ((wr.send_flags & ~engine::kAllSendFlags) != 0) return EINVAL;
  if (wr.num_sge < 0 || (wr.num_sge > 0 && wr.sg_list == nullptr)) return EINVAL;
  out->wr_id = wr.wr_id;
  out->flags = wr.send_flags;
  out->num_sge = 0;
  out->remote_addr = 0;
  out->rkey = 0;
  out->invalidate_stag = 0;
  out->imm_data = 0;
  out->inline_length = 0;
  bool payload = true;
  switch (RawValue(wr.opcode)) {
    case IBV_WR_SEND:
      out->opcode = engine::SendOpcode::kSend;
      break;
    case IBV_WR_SEND_WITH_INV:
      out->opcode = engine::SendOpcode::kSendWithInvalidate;
      out->invalidate_stag = wr.invalidate_rkey;
      break;
    case IBV_WR_RDMA_WRITE:
      out->opcode = engine::SendOpcode::kRdmaWrite;
      out->remote_addr = wr.wr.rdma.remote_addr;
      out->rkey = wr.wr.rdma.rkey;
      break;
    case IBV_WR_RDMA_READ:
      // Inline stays in the flags: the engine refuses it for a Read.
      out->opcode = engine::SendOpcode::kRdmaRead;
      out->remote_addr = wr.wr.rdma.remote_addr;
      out->rkey = wr.wr.rdma.rkey;
      payload = false;
      break;
    case IBV_WR_LOCAL_INV:
      out->opcode = engine::SendOpcode::kLocalInvalidate;
      out->invalidate_stag = wr.invalidate_rkey;
      out->flags &= ~static_cast<std::uint32_t>(engine::kSendInline);  // nothing to copy
      return 0;
    default:
      // Immediate data, atomics, memory windows, TSO, driver opcodes.
      return EINVAL;
  }
  if (payload && (wr.send_flags & IBV_SEND_INLINE) != 0) {
    // Copied now, so the application may reuse its buffers at once; the
    // SGEs' lkeys are not checked (ibv_post_send(3)).
    std::size_t total = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      total += wr.sg_list[i].length;
      if (total > engine::kMaxInlineData) return EINVAL;
    }
    std::size_t at = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      const ibv_sge& sge = wr.sg_list[i];
      if (sge.length == 0) continue;
      std::memcpy(out->inline_data.data() + at, reinterpret_cast<const void*>(sge.addr),
                  sge.length);
      at += sge.length;
    }
    out->inline_length = static_cast<std::uint32_t>(total);
    out->num_sge = 0;
    return 0;
  }
  if (static_cast<std::uint32_t>(wr.num_sge) > engine::kMaxSge) return EINVAL;
  out->num_sge = static_cast<std::uint32_t>(wr.num_sge);
  for (int i = 0; i < wr.num_sge; ++i) {
    out->sge[static_cast<std::size_t>(i)] = {wr.sg_list[i].addr, wr.sg_list[i].length,
                                             wr.sg_list[i].lkey};
  }
  return 0;
}

// The stream end the CM still waits for, taken (at most once per stream).
std::optional<siwx_stream_notify> TakeNotify(QpShared& shared) {
  std::lock_guard<std::mutex> lock(shared.mutex);
  if (!shared.notify_pending) return std::nullopt;
  shared.notify_pending = false;
  return shared.notify;
}

// How a stream ended, for the CM: an error if a Terminate went either way
// or the connection failed, an orderly close otherwise (FIN, or a local
// disconnect). Returns the siwx_stream_event and sets *error.
int StreamEndOf(const engine::Qp& qp, int* error) {
  const engine::QpAttributes a = qp.Query();
  // The engine logged the Terminate (at info) when it was sent or arrived.
  if (a.terminate_received) {
    *error = ECONNABORTED;
    return SIWX_STREAM_EVENT_ERROR;
  }
  if (a.terminate_sent) {
    *error = EPROTO;
    return SIWX_STREAM_EVENT_ERROR;
  }
  if (a.local_error) {
    *error = ECONNRESET;
    return SIWX_STREAM_EVENT_ERROR;
  }
  *error = 0;
  return SIWX_STREAM_EVENT_CLOSED;
}

// Called once the engine QP is destroyed, so it pushes nothing more.
// After ibv_destroy_qp no completion of the QP may come out of ibv_poll_cq,
// as with mlx5, which cleans its CQs of a destroyed QP's entries.
// libfabric's verbs provider (vrb_ep_close) counts on it: right after
// destroying the QP it keeps what the CQs still hold for later reads and
// makes flush completions for the receives it still has listed. A successful
// receive left in our CQ would reach ofi_rxm instead, which reposts the
// buffer on the endpoint that is gone (the fi_pingpong -e rdm crash).
// An SRQ QP's receive completions stay: they return SRQ WRs, which outlive
// the QP, and dropping them would lose those buffers for the application
// for good (the completion needs nothing of the QP to be handled).
void RemoveQueuedCompletions(const Qp& qp) {
  const engine::QpEntries which =
      qp.srq != nullptr ? engine::QpEntries::kAllButReceives : engine::QpEntries::kAll;
  const std::uint32_t qp_num = qp.vqp.qp.qp_num;
  std::size_t removed = qp.send_cq->queue->RemoveQp(qp_num, which);
  if (qp.recv_cq != qp.send_cq) removed += qp.recv_cq->queue->RemoveQp(qp_num, which);
  if (removed > 0) {
    SIWX_QP_LOG(kDebug, qp_num, "%zu queued completions removed on destroy", removed);
  }
}

}  // namespace

Qp* FindQp(Context* context, std::uint32_t qp_num) {
  ContextState* state = context->state;
  if (state == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(state->qp_mutex);
  const auto it = state->qps.find(qp_num);
  return it == state->qps.end() ? nullptr : it->second;
}

void OnEngineEvent(Context* context, const engine::AsyncEvent& event) {
  ContextState* state = context->state;
  if (state == nullptr) return;
  if (event.type == engine::AsyncEventType::kStreamClosed) {
    std::shared_ptr<engine::Qp> engine_qp;
    std::optional<siwx_stream_notify> notify;
    {
      std::lock_guard<std::mutex> lock(state->qp_mutex);
      const auto it = state->qps.find(event.qp_num);
      if (it == state->qps.end()) return;  // being destroyed: DestroyQp reports it
      engine_qp = it->second->shared->engine;
      notify = TakeNotify(*it->second->shared);
    }
    if (notify && notify->event != nullptr) {
      int error = 0;
      const int what = StreamEndOf(*engine_qp, &error);
      notify->event(notify->cookie, what, error);  // outside our locks (siwxdv.h)
    }
    return;
  }
  // Under qp_mutex, so DestroyQp (which removes the QP from the map first)
  // knows no event about it is posted after that.
  std::lock_guard<std::mutex> lock(state->qp_mutex);
  const auto it = state->qps.find(event.qp_num);
  if (it == state->qps.end()) return;
  Qp* qp = it->second;
  qp->events_posted.fetch_add(1);
  PostAsyncEvent(context, reinterpret_cast<std::uintptr_t>(&qp->vqp.qp),
                 static_cast<ibv_event_type>(event.type));
}

ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) noexcept {
  if (attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (int error = CheckInitAttr(pd->context, *attr); error != 0) {
    errno = error;
    return nullptr;
  }
  return CreateEngineQp(pd, attr);
}

ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr) noexcept {
  if (attr == nullptr || (attr->comp_mask & IBV_QP_INIT_ATTR_PD) == 0 || attr->pd == nullptr ||
      attr->pd->context != context) {
    errno = EINVAL;
    return nullptr;
  }
  // The ibv_wr_* send API is offered (qp_ex.cc); creation flags, XRC
  // domains, RSS and the other extensions are not.
  constexpr std::uint32_t kOffered = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if ((attr->comp_mask & ~kOffered) != 0) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  const bool send_api = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
  if (send_api) {
    if (int error = CheckSendOpsFlags(attr->send_ops_flags); error != 0) {
      errno = error;
      return nullptr;
    }
  }
  ibv_qp_init_attr basic{};
  basic.qp_context = attr->qp_context;
  basic.send_cq = attr->send_cq;
  basic.recv_cq = attr->recv_cq;
  basic.srq = attr->srq;
  basic.cap = attr->cap;
  std::memcpy(&basic.qp_type, &attr->qp_type, sizeof(basic.qp_type));  // any value: checked later
  basic.sq_sig_all = attr->sq_sig_all;
  ibv_qp* qp = CreateQp(attr->pd, &basic);
  if (qp == nullptr) return nullptr;
  if (send_api) {
    if (int error = EnableSendApi(ToSiwx(qp), attr->send_ops_flags, basic.cap); error != 0) {
      DestroyQp(qp);
      errno = error;
      return nullptr;
    }
  }
  attr->cap = basic.cap;
  return qp;
}

int ModifyQp(ibv_qp* ibqp, ibv_qp_attr* attr, int attr_mask) noexcept {
  if (attr_mask == 0) return 0;
  if (attr == nullptr) return EINVAL;
  if (int error = CheckModifyAttr(*attr, attr_mask); error != 0) return error;
  if (int error = oob::CheckModify(ToSiwx(ibqp), *attr, attr_mask); error != 0) return error;
  QpShared& shared = *ToSiwx(ibqp)->shared;
  engine::Qp& engine_qp = *shared.engine;
  if ((attr_mask & IBV_QP_STATE) != 0) {
    const auto target = static_cast<engine::QpState>(RawValue(attr->qp_state));
    std::optional<engine::QpState> expected;
    if ((attr_mask & IBV_QP_CUR_STATE) != 0) {
      expected = static_cast<engine::QpState>(RawValue(attr->cur_qp_state));
    }
    const engine::QpState now = engine_qp.state();
    if (target == engine::QpState::kRts && now == engine::QpState::kRtr) {
      // RTS waits for the stream (see the top of this file).
      if (expected && *expected != now) return EINVAL;
      oob::OnRtsRequested(ToSiwx(ibqp));
    } else if (target == engine::QpState::kRts && now == engine::QpState::kRts &&
               expected == engine::QpState::kRtr) {
      // The out-of-band stream came up before the application's RTS.
    } else {
      engine::QpStatus status;
      try {
        status = engine_qp.Modify(target, expected);
      } catch (...) {
        return ENOMEM;
      }
      if (status != engine::QpStatus::kOk) return EINVAL;
      if (target == engine::QpState::kRtr) oob::OnRtr(ToSiwx(ibqp), *attr, attr_mask);
      if (target == engine::QpState::kReset) oob::Release(shared);
    }
  }
  std::lock_guard<std::mutex> lock(shared.mutex);
  if ((attr_mask & IBV_QP_ACCESS_FLAGS) != 0) {
    shared.access_flags = static_cast<unsigned int>(attr->qp_access_flags);
  }
  if ((attr_mask & IBV_QP_MAX_QP_RD_ATOMIC) != 0) shared.max_rd_atomic = attr->max_rd_atomic;
  if ((attr_mask & IBV_QP_MAX_DEST_RD_ATOMIC) != 0) {
    shared.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  }
  if ((attr_mask & (IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT)) != 0) {
    if ((attr_mask & IBV_QP_TIMEOUT) != 0) shared.timeout = attr->timeout;
    if ((attr_mask & IBV_QP_RETRY_CNT) != 0) shared.retry_cnt = attr->retry_cnt;
    engine_qp.SetIbRetryTimeout(IbRetryTimeout(shared.timeout, shared.retry_cnt));
  }
  return 0;
}

int QueryQp(ibv_qp* ibqp, ibv_qp_attr* attr, int /*attr_mask*/,
            ibv_qp_init_attr* init_attr) noexcept {
  // attr_mask is a hint (ibv_query_qp(3)); everything is filled.
  if (attr == nullptr || init_attr == nullptr) return EINVAL;
  Qp* qp = ToSiwx(ibqp);
  const engine::QpAttributes a = qp->shared->engine->Query();
  *attr = ibv_qp_attr{};
  attr->qp_state = static_cast<ibv_qp_state>(a.state);
  attr->cur_qp_state = attr->qp_state;
  {
    Device* device = qp->context->state->device;
    std::lock_guard<std::mutex> lock(device->mutex);
    attr->path_mtu = static_cast<ibv_mtu>(IbMtuFromBytes(device->port.mtu));
  }
  attr->cap.max_send_wr = a.sq_caps.max_wr;
  attr->cap.max_send_sge = a.sq_caps.max_sge;
  attr->cap.max_inline_data = a.sq_caps.max_inline_data;
  attr->cap.max_recv_wr = a.has_srq ? 0 : a.rq_caps.max_wr;
  attr->cap.max_recv_sge = a.has_srq ? 0 : a.rq_caps.max_sge;
  attr->port_num = 1;
  {
    std::lock_guard<std::mutex> lock(qp->shared->mutex);
    attr->qp_access_flags = qp->shared->access_flags;
    attr->max_rd_atomic = qp->shared->max_rd_atomic;
    attr->max_dest_rd_atomic = qp->shared->max_dest_rd_atomic;
    attr->timeout = qp->shared->timeout;
    attr->retry_cnt = qp->shared->retry_cnt;
  }
  if (a.bound) {
    // The negotiated depths (RFC 6581 IRD/ORD) are what is in force.
    attr->max_rd_atomic = static_cast<std::uint8_t>(std::min<std::uint32_t>(a.params.ord, 255));
    attr->max_dest_rd_atomic =
        static_cast<std::uint8_t>(std::min<std::uint32_t>(a.params.ird, 255));
  }
  attr->sq_draining = a.state == engine::QpState::kClosing && a.sq_outstanding > 0 ? 1 : 0;

  *init_attr = ibv_qp_init_attr{};
  init_attr->qp_context = ibqp->qp_context;
  init_attr->send_cq = ibqp->send_cq;
  init_attr->recv_cq = ibqp->recv_cq;
  init_attr->srq = ibqp->srq;
  init_attr->cap = attr->cap;
  init_attr->qp_type = IBV_QPT_RC;
  init_attr->sq_sig_all = a.sq_sig_all ? 1 : 0;
  return 0;
}

int DestroyQp(ibv_qp* ibqp) noexcept {
  Qp* qp = ToSiwx(ibqp);
  if (Inherited(qp->context)) return 0;  // forgotten (provider.h, fork())
  ContextState* state = qp->context->state;
  {
    std::lock_guard<std::mutex> lock(state->qp_mutex);
    state->qps.erase(ibqp->qp_num);
  }
  QpShared& shared = *qp->shared;
  try {
    shared.engine->Destroy();
  } catch (...) {
    // Only the detach command's allocation can fail; the engine still
    // marked the QP destroyed, so nothing new starts on it.
    SIWX_QP_LOG(kError, ibqp->qp_num, "out of memory while destroying it");
  }
  RemoveQueuedCompletions(*qp);
  oob::Release(shared);
  if (std::optional<siwx_stream_notify> notify = TakeNotify(shared);
      notify && notify->event != nullptr) {
    notify->event(notify->cookie, SIWX_STREAM_EVENT_ERROR, ECONNABORTED);
  }
  const std::size_t purged =
      PurgeAsyncEvents(qp->context, reinterpret_cast<std::uintptr_t>(ibqp), kQpEventTypes);
  WaitForAcks(&ibqp->mutex, &ibqp->cond, &ibqp->events_completed,
              qp->events_posted.load() - static_cast<std::uint32_t>(purged));
  SIWX_QP_LOG(kDebug, ibqp->qp_num, "destroyed");
  ReleaseQp(qp);
  return 0;
}

int PostSend(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept {
  if (Inherited(ToSiwx(ibqp)->context)) {
    if (bad_wr != nullptr) *bad_wr = wr;
    return EPERM;
  }
  engine::Qp& engine_qp = *ToSiwx(ibqp)->shared->engine;
  std::array<engine::SendWorkRequest, kPostBatch> records;
  std::array<ibv_send_wr*, kPostBatch> batch_wrs;
  ibv_send_wr* current = wr;
  while (current != nullptr) {
    std::size_t n = 0;
    int error = 0;
    while (current != nullptr && n < kPostBatch) {
      error = ToEngine(*current, &records[n]);
      if (error != 0) break;
      batch_wrs[n++] = current;
      current = current->next;
    }
    if (n > 0) {
      std::size_t posted = 0;
      engine::PostStatus status;
      try {
        status = engine_qp.PostSend(std::span<const engine::SendWorkRequest>(records.data(), n),
                                    &posted);
      } catch (...) {
        status = engine::PostStatus::kQueueFull;  // out of memory: "not enough resources"
      }
      if (status != engine::PostStatus::kOk) {
        if (bad_wr != nullptr) *bad_wr = batch_wrs[std::min(posted, n - 1)];
        return ErrnoOf(status);
      }
    }
    if (error != 0) {
      if (bad_wr != nullptr) *bad_wr = current;
      return error;
    }
  }
  return 0;
}

int PostRecv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept {
  if (Inherited(ToSiwx(ibqp)->context)) {
    if (bad_wr != nullptr) *bad_wr = wr;
    return EPERM;
  }
  engine::Qp& engine_qp = *ToSiwx(ibqp)->shared->engine;
  const std::uint32_t max_sge = engine_qp.config().rq_caps.max_sge;
  engine::ReceiveWorkRequest record;
  for (ibv_recv_wr* current = wr; current != nullptr; current = current->next) {
    int error = ToEngine(*current, max_sge, &record);
    if (error == 0) {
      engine::PostStatus status;
      try {
        // kInvalidState for RESET and for a QP with an SRQ (ibv_post_recv(3):
        // use ibv_post_srq_recv).
        status = engine_qp.PostRecv(record);
      } catch (...) {
        status = engine::PostStatus::kQueueFull;
      }
      if (status != engine::PostStatus::kOk) error = ErrnoOf(status);
    }
    if (error != 0) {
      if (bad_wr != nullptr) *bad_wr = current;
      return error;
    }
  }
  return 0;
}

}  // namespace siwx::provider
