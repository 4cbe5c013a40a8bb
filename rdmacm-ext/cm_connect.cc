// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// cm::Core, connection setup: the active side's TCP connect, rdma_connect,
// rdma_accept, rdma_reject, rdma_establish, rdma_disconnect,
// rdma_get_request, rdma_notify and rdma_set_option.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/util/log.h"
#include "rdmacm-ext/cm_core.h"
#include "rdmacm-ext/cm_core_internal.h"
#include "rdmacm-ext/cm_devices.h"
#include "rdmacm-ext/stream_handover.h"

namespace siwx::cm {
namespace {

// rdma_conn_param read depths: RDMA_MAX_* (255) means "the device limit";
// anything else is clamped to it (libfabric passes 255, stock librdmacm
// would refuse other values above the limit).
std::uint16_t ClampDepth(std::uint8_t asked, std::uint32_t device_max, bool is_max) {
  const std::uint32_t limit = std::min<std::uint32_t>(device_max, mpa::kMaxIrdOrd - 1);
  if (is_max) return static_cast<std::uint16_t>(limit);
  return static_cast<std::uint16_t>(std::min<std::uint32_t>(asked, limit));
}

// The rdma_cm event for a TCP-level connect failure (the Linux iw_cm
// mapping, with routing failures as UNREACHABLE).
rdma_cm_event_type EventForConnectError(int error) {
  switch (error) {
    case ECONNREFUSED:
    case ECONNRESET: return RDMA_CM_EVENT_REJECTED;
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EHOSTDOWN:
    case ENETDOWN: return RDMA_CM_EVENT_UNREACHABLE;
    default: return RDMA_CM_EVENT_CONNECT_ERROR;
  }
}

}  // namespace

// ---- Active side ----

void Core::FailConnect(CmId* id, int error) {
  id->failure = std::string("TCP connect failed: ") + std::strerror(error);
  id->failure_code = SIWX_CM_FAILURE_TCP_CONNECT;
  SIWX_LOG(kInfo, "CEP[%llu] %s", static_cast<unsigned long long>(id->handle), id->failure.c_str());
  CloseSocket(id, true);
  id->connect_deadline.reset();
  id->mpa.negotiator.reset();
  id->state = IdState::kFailed;
  Post(id, EventForConnectError(error), -error);
}

void Core::StartInitiatorMpa(CmId* id) {
  id->connect_deadline.reset();
  net::SockAddr local;
  if (net::LocalAddress(id->fd, &local) == 0) {
    std::memcpy(&id->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
  }
  id->mpa.negotiator = std::make_unique<mpa::MpaNegotiator>(
      MakeNegotiatorConfig(id->options, mpa::MpaRole::kInitiator, id->mpa.ird, id->mpa.ord));
  const mpa::NegotiatorStatus s = id->mpa.negotiator->Start(NowMpa(Clock::now()), id->private_data);
  if (s != mpa::NegotiatorStatus::kOk) {
    // Connect() checked the same configuration; this is only a safety net.
    id->failure = std::string("MPA Request refused: ") + std::string(mpa::NegotiatorStatusName(s));
    CloseSocket(id, true);
    id->mpa.negotiator.reset();
    id->state = IdState::kFailed;
    Post(id, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL);
    return;
  }
  ArmTimers(id);
  id->state = IdState::kMpaStartup;
  Drive(id, false);
}

// ---- Connection setup ----

int Core::Connect(rdma_cm_id* pub, const rdma_conn_param* param) {
  bool sync;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr || id->state != IdState::kRouteResolved) return EINVAL;
    const DeviceLimits limits = DeviceRegistry::Get().LimitsOf(id->pub.verbs);
    id->mpa.ird = ClampDepth(param ? param->responder_resources : 0, limits.max_ird,
                         param == nullptr || param->responder_resources == RDMA_MAX_RESP_RES);
    id->mpa.ord = ClampDepth(param ? param->initiator_depth : 0, limits.max_ord,
                         param == nullptr || param->initiator_depth == RDMA_MAX_INIT_DEPTH);
    id->private_data.clear();
    if (param != nullptr && param->private_data != nullptr && param->private_data_len > 0) {
      const auto* p = static_cast<const std::uint8_t*>(param->private_data);
      id->private_data.assign(p, p + param->private_data_len);
    }
    id->conn_qp_num = param != nullptr ? param->qp_num : 0;
    // Check the Request the negotiator would build before anything goes out.
    {
      mpa::MpaNegotiator probe(
          MakeNegotiatorConfig(id->options, mpa::MpaRole::kInitiator, id->mpa.ird, id->mpa.ord));
      if (probe.Start(mpa::MpaTime::zero(), id->private_data) != mpa::NegotiatorStatus::kOk) {
        return EINVAL;
      }
    }
    if (id->fd < 0) return EINVAL;  // resolve_addr always leaves a socket
    id->role = mpa::MpaRole::kInitiator;
    id->started = true;
    id->mpa.done = false;
    id->mpa.error = mpa::MpaError::kNone;
    id->failure.clear();
    id->failure_code = SIWX_CM_FAILURE_NONE;
    if (id->tos) (void)net::SetTos(id->fd, id->pub.route.addr.src_addr.sa_family, *id->tos);
    (void)net::SetNoDelay(id->fd);
    // As Linux siw does for each socket it connects: the connection's
    // TIME_WAIT then never keeps a later listener from this port. Set after
    // the bind, so a port-0 bind still took a port nobody uses.
    (void)net::SetReuseAddr(id->fd, true);
    const std::optional<net::SockAddr> dst = net::SockAddr::From(&id->pub.route.addr.dst_addr);
    const int rc = dst ? net::ConnectTo(id->fd, *dst) : EINVAL;
    sync = id->sync;
    if (rc == 0) {
      // Connected at once (loopback can be): the MPA Request's deadline runs.
      StartInitiatorMpa(id);
    } else if (rc == EINPROGRESS) {
      id->state = IdState::kTcpConnecting;
      id->connect_deadline = Clock::now() + id->options.connect_timeout;
      ArmTimers(id);
      UpdateInterest(id);
    } else {
      FailConnect(id, rc);
    }
    WakeForTimers();
  }
  return sync ? WaitSync(pub) : 0;
}

int Core::Accept(rdma_cm_id* pub, const rdma_conn_param* param) {
  bool sync;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return EINVAL;
    if (id->peer_gone) return ECONNRESET;
    if (id->state != IdState::kRequestPending || id->mpa.negotiator == nullptr) return EINVAL;
    const DeviceLimits limits = DeviceRegistry::Get().LimitsOf(id->pub.verbs);
    if (param == nullptr) {
      id->mpa.ird = id->mpa.request_ird;
      id->mpa.ord = id->mpa.request_ord;
    } else {
      id->mpa.ird = ClampDepth(param->responder_resources, limits.max_ird,
                           param->responder_resources == RDMA_MAX_RESP_RES);
      id->mpa.ord = ClampDepth(param->initiator_depth, limits.max_ord,
                           param->initiator_depth == RDMA_MAX_INIT_DEPTH);
    }
    ByteSpan pd;
    if (param != nullptr && param->private_data != nullptr) {
      pd = ByteSpan(static_cast<const std::uint8_t*>(param->private_data), param->private_data_len);
    }
    id->target_qp_num.reset();
    if (id->pub.qp == nullptr && param != nullptr && param->qp_num != 0 &&
        id->pub.verbs != nullptr) {
      // Checked now for a clear EINVAL, bound later by number (the QP may
      // be destroyed in between; the bind then fails cleanly).
      const ProviderHandover& provider = GetProviderHandover();
      if (provider.lookup != nullptr) {
        if (provider.lookup(id->pub.verbs, param->qp_num) == nullptr) return EINVAL;
        id->target_qp_num = param->qp_num;
      }
    }
    mpa::NegotiatorStatus s =
        id->mpa.negotiator->Accept(NowMpa(Clock::now()), pd, id->mpa.ird, id->mpa.ord);
    if (s == mpa::NegotiatorStatus::kInvalidArgument && id->mpa.ird == 0) {
      // Only a Read RTR to grant and no inbound Read slot: one is needed.
      id->mpa.ird = 1;
      s = id->mpa.negotiator->Accept(NowMpa(Clock::now()), pd, id->mpa.ird, id->mpa.ord);
    }
    if (s != mpa::NegotiatorStatus::kOk) return EINVAL;
    ArmTimers(id);
    ReleaseBacklogSlot(id);
    id->state = IdState::kMpaStartup;
    sync = id->sync;
    ProcessNegotiatorEvents(id);
    Drive(id, false);
    WakeForTimers();
  }
  return sync ? WaitSync(pub) : 0;
}

int Core::Reject(rdma_cm_id* pub, const void* private_data, std::uint8_t len) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  if (id->peer_gone) return 0;  // nothing left to reject
  if (id->state != IdState::kRequestPending || id->mpa.negotiator == nullptr) return EINVAL;
  ByteSpan pd;
  if (private_data != nullptr) pd = ByteSpan(static_cast<const std::uint8_t*>(private_data), len);
  // A v2 reject carries IRD/ORD 0: no resources offered.
  if (id->mpa.negotiator->Reject(pd) != mpa::NegotiatorStatus::kOk) return EINVAL;
  ReleaseBacklogSlot(id);
  // RFC 5044 7.1.2 rule 2: MPA exits after the Reject; we close the TCP
  // connection once the Reply is out and the peer has seen it.
  MoveToLinger(id, id->mpa.negotiator->PendingOutput());
  id->mpa.negotiator.reset();
  id->state = IdState::kRejected;
  return 0;
}

int Core::Establish(rdma_cm_id* pub) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr || id->pub.qp != nullptr || id->state != IdState::kAwaitEstablish) {
    return EINVAL;
  }
  std::optional<std::uint32_t> qp_num;
  const ProviderHandover& provider = GetProviderHandover();
  if (provider.lookup != nullptr && id->pub.verbs != nullptr) {
    if (provider.lookup(id->pub.verbs, id->conn_qp_num) == nullptr) return EINVAL;
    qp_num = id->conn_qp_num;
  }
  if (id->fd < 0) return ECONNRESET;  // the peer left after CONNECT_RESPONSE
  // CONNECT_RESPONSE stood in for ESTABLISHED (as on InfiniBand, where
  // rdma_establish raises no further event); a failed handover still says so.
  BindAndEstablish(id, qp_num, false);
  if (id->state != IdState::kEstablished) return ECONNRESET;
  return 0;
}

int Core::Disconnect(rdma_cm_id* pub) {
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return EINVAL;
    switch (id->state) {
      case IdState::kEstablished:
      case IdState::kAwaitEstablish: break;
      case IdState::kDisconnected: return 0;
      default: return EINVAL;
    }
    if (id->stream.bound) {
      EndBoundStream(id, false);
    } else if (id->fd >= 0) {
      // CM-only: FIN now, close when the peer answers with its own.
      net::ShutdownWrite(id->fd);
      MoveToLinger(id, {});
    }
    id->stream.disconnect_posted = true;
    id->state = IdState::kDisconnected;
    Post(id, RDMA_CM_EVENT_DISCONNECTED, 0);
    if (!id->sync) return 0;
  }
  // As librdmacm: a synchronous id returns with its DISCONNECTED in
  // id->event, so that no later call finds it instead of its own event.
  return WaitSync(pub);
}

int Core::GetRequest(rdma_cm_id* listen, rdma_cm_id** out) {
  if (out == nullptr) return EINVAL;
  rdma_event_channel* channel;
  {
    std::lock_guard lock(mu_);
    CmId* l = FindId(listen);
    if (l == nullptr || !l->sync || l->channel == nullptr) return EINVAL;
    DropSyncEvent(l);
    channel = &l->channel->pub;
  }
  rdma_cm_event* ev = nullptr;
  int rc = GetEvent(channel, &ev);
  if (rc != 0) return rc;
  std::optional<ibv_qp_init_attr> qp_attr;
  {
    std::lock_guard lock(mu_);
    CmId* l = FindId(listen);
    if (l == nullptr) return EINVAL;
    if (ev->event == RDMA_CM_EVENT_REJECTED) rc = ECONNREFUSED;
    else if (ev->status != 0) rc = ev->status < 0 ? -ev->status : ev->status;
    else if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) rc = EINVAL;
    if (rc != 0) {
      l->pub.event = ev;
      return rc;
    }
    qp_attr = l->ep_qp_init_attr;
  }
  if (qp_attr) {
    ibv_qp_init_attr_ex attr_ex{};
    std::memcpy(&attr_ex, &*qp_attr, sizeof(*qp_attr));
    attr_ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    attr_ex.pd = listen->pd;
    rc = CreateQpEx(ev->id, &attr_ex);
    if (rc != 0) {
      std::lock_guard lock(mu_);
      if (CmId* l = FindId(listen)) l->pub.event = ev;
      return rc;
    }
  }
  std::lock_guard lock(mu_);
  *out = ev->id;
  if (CmId* child = FindId(ev->id)) child->pub.event = ev;
  return 0;
}

int Core::Notify(rdma_cm_id* pub) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  // iWARP has no CM state to nudge (the kernel answers 0 for non-IB).
  return id->state == IdState::kEstablished || id->state == IdState::kAwaitEstablish ? 0 : EINVAL;
}

int Core::SetOption(rdma_cm_id* pub, int level, int optname, const void* value,
                    std::size_t len) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr || value == nullptr) return EINVAL;
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS: {
        if (len != sizeof(std::uint8_t)) return EINVAL;
        std::uint8_t tos;
        std::memcpy(&tos, value, sizeof(tos));
        id->tos = tos;
        if (id->fd >= 0) (void)net::SetTos(id->fd, id->pub.route.addr.src_addr.sa_family, tos);
        return 0;
      }
      case RDMA_OPTION_ID_REUSEADDR: {
        if (len != sizeof(int)) return EINVAL;
        int on;
        std::memcpy(&on, value, sizeof(on));
        if (id->state != IdState::kIdle) return EINVAL;  // before the bind, as the kernel CM
        id->reuseaddr = on != 0;
        return 0;
      }
      case RDMA_OPTION_ID_AFONLY: {
        if (len != sizeof(int)) return EINVAL;
        int on;
        std::memcpy(&on, value, sizeof(on));
        if (id->state != IdState::kIdle) return EINVAL;
        id->afonly = on != 0;
        return 0;
      }
      default: break;
    }
  }
  // RDMA_OPTION_ID_ACK_TIMEOUT and RDMA_OPTION_IB_PATH configure the
  // InfiniBand CM; TCP has its own retransmission and routing.
  SIWX_LOG(kDebug, "CEP[%llu] rdma_set_option level %d name %d: not supported over iWARP (ENOSYS)",
           static_cast<unsigned long long>(id->handle), level, optname);
  return ENOSYS;
}

}  // namespace siwx::cm
