// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// cm::Core, MPA startup: driving the negotiator over the socket, the
// Request, Reply, reject and failure outcomes, and the Terminate of RFC 6581
// 9.1/9.2. What follows a successful exchange is in cm_stream.cc.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>

#include "common/wire/fpdu.h"
#include "common/wire/terminate.h"
#include "common/util/log.h"
#include "rdmacm-ext/cm_core.h"
#include "rdmacm-ext/cm_core_internal.h"
#include "rdmacm-ext/cm_devices.h"

namespace siwx::cm {
namespace {

// The Reply/Request/Rtr frame with the largest private data.
constexpr std::size_t kMaxStartupFrame = mpa::kStartupHeaderSize + mpa::kMaxPrivateDataLength;

std::string_view OnOff(bool b) { return b ? "on" : "off"; }

siwx_cm_failure FailureCode(mpa::StartupFailure f) {
  switch (f) {
    case mpa::StartupFailure::kNone: return SIWX_CM_FAILURE_NONE;
    case mpa::StartupFailure::kBadKey: return SIWX_CM_FAILURE_BAD_KEY;
    case mpa::StartupFailure::kBadRevision: return SIWX_CM_FAILURE_BAD_REVISION;
    case mpa::StartupFailure::kPrivateDataTooLong: return SIWX_CM_FAILURE_PRIVATE_DATA_TOO_LONG;
    case mpa::StartupFailure::kMissingIrdOrd: return SIWX_CM_FAILURE_MISSING_IRD_ORD;
    case mpa::StartupFailure::kInitiatorInitiator: return SIWX_CM_FAILURE_INITIATOR_INITIATOR;
    case mpa::StartupFailure::kUnexpectedFrame: return SIWX_CM_FAILURE_UNEXPECTED_FRAME;
    case mpa::StartupFailure::kRevisionMismatch: return SIWX_CM_FAILURE_REVISION_MISMATCH;
    case mpa::StartupFailure::kEnhancedMismatch: return SIWX_CM_FAILURE_ENHANCED_MISMATCH;
    case mpa::StartupFailure::kRtrCrcMismatch: return SIWX_CM_FAILURE_RTR_CRC_MISMATCH;
    case mpa::StartupFailure::kCrcRefused: return SIWX_CM_FAILURE_CRC_REFUSED;
    case mpa::StartupFailure::kMarkersRefused: return SIWX_CM_FAILURE_MARKERS_REFUSED;
    case mpa::StartupFailure::kInsufficientIrd: return SIWX_CM_FAILURE_INSUFFICIENT_IRD;
    case mpa::StartupFailure::kNoMatchingRtr: return SIWX_CM_FAILURE_NO_MATCHING_RTR;
    case mpa::StartupFailure::kTimeout:
    case mpa::StartupFailure::kFirstFpduTimeout: return SIWX_CM_FAILURE_TIMEOUT;
    case mpa::StartupFailure::kConnectionClosed: return SIWX_CM_FAILURE_CONNECTION_CLOSED;
    case mpa::StartupFailure::kEnhancedUnsupported: return SIWX_CM_FAILURE_ENHANCED_UNSUPPORTED;
  }
  return SIWX_CM_FAILURE_NONE;
}

}  // namespace

// ---- MPA startup ----

int Core::FlushNegotiatorOutput(CmId* id) {
  mpa::MpaNegotiator& n = *id->mpa.negotiator;
  while (!n.PendingOutput().empty()) {
    const net::IoResult r = net::SendSome(id->fd, n.PendingOutput());
    if (r.status == net::IoStatus::kWouldBlock) return 0;
    if (r.status != net::IoStatus::kOk) return r.error != 0 ? r.error : EPIPE;
    n.ConsumeOutput(r.bytes);
  }
  return 0;
}

void Core::Drive(CmId* id, bool hangup) {
  const std::uint64_t handle = id->handle;
  auto alive = [&] {
    const auto it = by_handle_.find(handle);
    return it != by_handle_.end() && it->second == id && id->mpa.negotiator != nullptr &&
           id->fd >= 0;
  };
  if (!alive()) return;
  const mpa::MpaTime now = NowMpa(Clock::now());
  mpa::MpaNegotiator& n = *id->mpa.negotiator;

  bool lost = FlushNegotiatorOutput(id) != 0;
  // Read startup frames only while one is expected; never past its end
  // (peek, feed, then consume exactly what the negotiator took).
  while (!lost && ExpectsFrames(n)) {
    std::array<std::uint8_t, kMaxStartupFrame> buf;
    const net::IoResult r = net::Peek(id->fd, buf);
    if (r.status == net::IoStatus::kWouldBlock) break;
    if (r.status != net::IoStatus::kOk) {
      lost = true;
      break;
    }
    const std::size_t consumed = n.Feed(now, ByteSpan(buf.data(), r.bytes));
    if (consumed > 0) {
      const net::IoResult d = net::Discard(id->fd, consumed);
      if (d.status != net::IoStatus::kOk) lost = true;
    }
    ProcessNegotiatorEvents(id);
    if (!alive()) return;
    if (consumed == 0) break;
  }
  if (!alive()) return;
  if (lost || (hangup && n.state() != mpa::NegotiatorState::kFullOperation &&
               n.state() != mpa::NegotiatorState::kAwaitingFirstFpdu)) {
    n.OnConnectionClosed();
    ProcessNegotiatorEvents(id);
    if (!alive()) return;
  }
  if (id->state == IdState::kFlushing) {
    if (FlushNegotiatorOutput(id) != 0) {
      // The peer went away right after MPA completed.
      FailFlushing(id, ECONNRESET, "connection lost while sending the last startup frame");
      return;
    }
    if (id->mpa.negotiator->PendingOutput().empty()) {
      FinishHandover(id);
      return;
    }
    if (hangup) {
      // The peer closed its end before taking our last startup frame. The
      // hangup stays signalled (epoll is level-triggered): waiting on would
      // wake this loop for ever.
      FailFlushing(id, ECONNRESET, "the peer closed before taking the last startup frame");
      return;
    }
  }
  UpdateInterest(id);
}

void Core::FailFlushing(CmId* id, int error, const char* why) {
  id->failure = why;
  id->failure_code =
      error == ETIMEDOUT ? SIWX_CM_FAILURE_TIMEOUT : SIWX_CM_FAILURE_CONNECTION_CLOSED;
  SIWX_LOG(kInfo, "CEP[%llu] %s", static_cast<unsigned long long>(id->handle), why);
  id->mpa.flush_deadline.reset();
  id->state = IdState::kFailed;
  id->mpa.negotiator.reset();
  CloseSocket(id, true);
  Post(id, error == ETIMEDOUT ? RDMA_CM_EVENT_UNREACHABLE : RDMA_CM_EVENT_CONNECT_ERROR, -error);
}

void Core::ProcessNegotiatorEvents(CmId* id) {
  const std::uint64_t handle = id->handle;
  while (true) {
    const auto it = by_handle_.find(handle);
    if (it == by_handle_.end() || it->second != id || id->mpa.negotiator == nullptr) return;
    std::optional<mpa::NegotiatorEvent> ev = id->mpa.negotiator->NextEvent();
    if (!ev) return;
    switch (ev->type) {
      case mpa::NegotiatorEventType::kRequestReceived: OnRequestReceived(id); break;
      case mpa::NegotiatorEventType::kEstablished: OnMpaEstablished(id); break;
      case mpa::NegotiatorEventType::kRejected: OnMpaRejected(id, *ev); break;
      case mpa::NegotiatorEventType::kFailed: OnMpaFailed(id, *ev); break;
    }
  }
}

void Core::OnRequestReceived(CmId* id) {
  CmId* listener = id->listener;
  if (listener == nullptr) {  // cannot happen: hidden ids always have their listener
    CloseSocket(id, true);
    DestroyLocked(id);
    return;
  }
  const mpa::StartupOffer& offer = id->mpa.negotiator->offer();
  const DeviceLimits limits = DeviceRegistry::Get().LimitsOf(id->pub.verbs);
  // What the application can pass straight to rdma_accept: our IRD need not
  // exceed the peer's ORD, our ORD must not exceed its IRD (RFC 6581 9.1).
  std::uint32_t ird = limits.max_ird;
  std::uint32_t ord = limits.max_ord;
  // Without the RFC 6581 word nothing is known of the peer: offer the
  // device limits, as Linux iWARP drivers report them for such peers; the
  // ULP's own agreement goes in rdma_accept's conn_param.
  if (offer.ird_ord) {
    if (offer.ird_ord->ord != mpa::kIrdOrdNotNegotiated) {
      ird = std::min(ird, std::uint32_t{offer.ird_ord->ord});
    }
    if (offer.ird_ord->ird != mpa::kIrdOrdNotNegotiated) {
      ord = std::min(ord, std::uint32_t{offer.ird_ord->ird});
    }
  }
  id->mpa.request_ird = ClampU8(ird);
  id->mpa.request_ord = ClampU8(ord);
  // From here the connection waits for the application: it takes a
  // backlog slot until rdma_accept or rdma_reject.
  id->backlog_slot = true;
  ++listener->listen.pending;
  // One half-open connection fewer: a pause for it is over.
  ResumeAfterHalfOpenPause(listener);
  UpdateInterest(listener);
  if (listener->sync) {
    int err = 0;
    id->channel = NewChannel(true, &err);
    id->sync = id->channel != nullptr;
  } else {
    id->channel = listener->channel;
  }
  id->pub.channel = id->channel != nullptr ? &id->channel->pub : nullptr;
  id->state = IdState::kRequestPending;
  SIWX_LOG(kDebug, "CEP[%llu] MPA Request: %s, %zu octets of private data",
           static_cast<unsigned long long>(id->handle),
           std::string(mpa::MpaDialectName(offer.dialect)).c_str(), offer.private_data.size());
  if (Post(id, RDMA_CM_EVENT_CONNECT_REQUEST, 0, offer.private_data, ird, ord) == nullptr) {
    // Nobody can see the request: refuse it.
    (void)id->mpa.negotiator->Reject({});
    MoveToLinger(id, id->mpa.negotiator->PendingOutput());
    DestroyLocked(id);
  }
}

void Core::LogEstablished(const CmId* id) {
  if (!log::Enabled(log::Level::kInfo)) return;
  const mpa::NegotiatedParams& p = id->mpa.negotiated;
  std::string rtr = "no RTR";
  if (p.peer_to_peer) {
    rtr = id->role == mpa::MpaRole::kInitiator
              ? "peer-to-peer, sends " + std::string(mpa::RtrTypeName(p.rtr)) + " RTR"
              : "peer-to-peer, awaits the RTR";
  } else if (p.dialect == mpa::MpaDialect::kV1Rtr) {
    rtr = "Rtr frame";
  }
  net::SockAddr peer;
  const auto parsed = net::SockAddr::From(&id->pub.route.addr.dst_addr);
  if (parsed) peer = *parsed;
  SIWX_LOG(kInfo,
           "CEP[%llu] %s with %s: %s, Rev %u, CRC %s, markers tx %s rx %s, large FPDUs %s, "
           "IRD %u ORD %u%s, %s",
           static_cast<unsigned long long>(id->handle),
           id->role == mpa::MpaRole::kInitiator ? "connected as Initiator"
                                                : "accepted as Responder",
           peer.ToString().c_str(), std::string(mpa::MpaDialectName(p.dialect)).c_str(),
           static_cast<unsigned>(p.revision), std::string(OnOff(p.crc)).c_str(),
           std::string(OnOff(p.markers_tx)).c_str(), std::string(OnOff(p.markers_rx)).c_str(),
           std::string(OnOff(p.large_fpdus)).c_str(), static_cast<unsigned>(p.ird),
           static_cast<unsigned>(p.ord),
           p.ird_ord_exchanged ? " (exchanged)" : "", rtr.c_str());
}

void Core::OnMpaEstablished(CmId* id) {
  id->mpa.done = true;
  id->mpa.negotiated = id->mpa.negotiator->params();
  LogEstablished(id);
  id->state = IdState::kFlushing;
  id->mpa.flush_deadline = Clock::now() + id->options.mpa_timeout;
  ArmTimers(id);
  // Drive() writes what is left (the Reply, or the Rtr frame) and then
  // calls FinishHandover().
}

void Core::OnMpaRejected(CmId* id, const mpa::NegotiatorEvent& ev) {
  id->mpa.negotiated = id->mpa.negotiator->params();
  id->failure = ev.reason;
  id->failure_code = ev.by_peer ? SIWX_CM_FAILURE_REJECTED : FailureCode(ev.failure);
  if (ev.by_peer) {
    // RFC 5044 7.1.2 rule 3: MPA is over; the ULP closes the connection.
    SIWX_LOG(kInfo, "CEP[%llu] rejected by the peer (%zu octets of private data)",
             static_cast<unsigned long long>(id->handle),
             id->mpa.negotiated.peer_private_data.size());
    CloseSocket(id, false);
    id->mpa.negotiator.reset();
    id->state = IdState::kRejected;
    Post(id, RDMA_CM_EVENT_REJECTED, -ECONNREFUSED, id->mpa.negotiated.peer_private_data);
    return;
  }
  // Our own policy refused the Request (CRC or markers) before the
  // application saw it: send the Reject, then let the connection go.
  SIWX_LOG(kInfo, "CEP[%llu] refused an MPA Request: %s",
           static_cast<unsigned long long>(id->handle), ev.reason.c_str());
  MoveToLinger(id, id->mpa.negotiator->PendingOutput());
  if (id->hidden) {
    DestroyLocked(id);
    return;
  }
  id->mpa.negotiator.reset();
  id->state = IdState::kRejected;
}

void Core::SendTerminate(CmId* id, mpa::MpaError error) {
  // RFC 6581 9.1/9.2: the accepting Reply has fixed the framing, so the
  // Terminate (layer LLP, type MPA, this code) goes out as an FPDU.
  const std::optional<rdmap::TerminateCause> cause = rdmap::TerminateCauseFromMpaError(error);
  if (!cause || id->fd < 0) return;
  const rdmap::TerminateHeader header = rdmap::MakeTerminate(*cause);
  std::array<std::uint8_t, 128> ulpdu{};
  // The Terminate is the first message on queue 2: MSN 1 (RFC 5040 5.3).
  const rdmap::EncodeResult enc = rdmap::EncodeTerminateMessage(header, 1, ulpdu);
  if (enc.status != rdmap::EncodeStatus::kOk) return;
  const mpa::NegotiatedParams& p = id->mpa.negotiator->params();
  mpa::FpduFramer framer(mpa::FpduFramingConfig{p.crc, p.markers_tx, 0});
  auto frame = std::make_unique<mpa::FpduFrame>();
  if (framer.Frame(ByteSpan(ulpdu.data(), enc.length), {}, *frame) != mpa::FrameStatus::kOk) return;
  std::vector<std::uint8_t> wire;
  for (const mpa::IoSlice& s : frame->slices()) wire.insert(wire.end(), s.base, s.base + s.len);
  // Best effort: a few dozen octets into a fresh socket buffer.
  (void)net::SendSome(id->fd, wire);
}

void Core::OnMpaFailed(CmId* id, const mpa::NegotiatorEvent& ev) {
  id->mpa.negotiated = id->mpa.negotiator->params();
  id->mpa.error = ev.error;
  id->failure = ev.reason;
  id->failure_code = FailureCode(ev.failure);
  if (ev.send_terminate) SendTerminate(id, ev.error);
  const bool hidden = id->hidden;
  const bool was_pending = id->state == IdState::kRequestPending;
  SIWX_LOG(kInfo, "CEP[%llu] MPA startup failed (%s): %s",
           static_cast<unsigned long long>(id->handle),
           std::string(mpa::StartupFailureName(ev.failure)).c_str(), ev.reason.c_str());
  CloseSocket(id, true);
  id->mpa.negotiator.reset();
  id->state = IdState::kFailed;
  if (id->role == mpa::MpaRole::kResponder) {
    if (hidden) {
      // Never seen by the application: nothing to report, keep listening.
      DestroyLocked(id);
      return;
    }
    if (was_pending) {
      // The application still holds the request; rdma_accept will say so.
      id->peer_gone = true;
      ReleaseBacklogSlot(id);
      return;
    }
  }
  rdma_cm_event_type type = RDMA_CM_EVENT_CONNECT_ERROR;
  int status = -EPROTO;
  switch (ev.failure) {
    case mpa::StartupFailure::kTimeout:
    case mpa::StartupFailure::kFirstFpduTimeout:
      type = RDMA_CM_EVENT_UNREACHABLE;
      status = -ETIMEDOUT;
      break;
    case mpa::StartupFailure::kConnectionClosed:
      type = id->role == mpa::MpaRole::kInitiator ? RDMA_CM_EVENT_REJECTED
                                                  : RDMA_CM_EVENT_CONNECT_ERROR;
      status = -ECONNRESET;
      break;
    default: break;
  }
  Post(id, type, status);
}

}  // namespace siwx::cm
