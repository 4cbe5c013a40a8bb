// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// cm::Core, stream handover: giving the established stream to the id's QP
// (stream_handover.h), ending it, and the provider's notifications of its
// end, which become DISCONNECTED.
#include <cerrno>
#include <cstring>

#include "common/util/log.h"
#include "rdmacm-ext/cm_core.h"
#include "rdmacm-ext/cm_core_internal.h"
#include "rdmacm-ext/stream_handover.h"

namespace siwx::cm {

// ---- Stream handover ----

void Core::FinishHandover(CmId* id) {
  id->mpa.flush_deadline.reset();
  id->mpa.negotiator.reset();
  if (id->role == mpa::MpaRole::kInitiator && id->pub.qp == nullptr && id->conn_qp_num != 0 &&
      id->pub.verbs != nullptr) {
    // The application created its QP itself: it moves it and calls
    // rdma_establish (the IB CONNECT_RESPONSE pattern rping -q uses).
    id->state = IdState::kAwaitEstablish;
    UpdateInterest(id);
    Post(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, id->mpa.negotiated.peer_private_data,
         id->mpa.negotiated.ird, id->mpa.negotiated.ord);
    return;
  }
  std::optional<std::uint32_t> qp_num = id->target_qp_num;
  if (id->pub.qp != nullptr) qp_num = id->own_qp_num;
  BindAndEstablish(id, qp_num, true);
}

void Core::BindAndEstablish(CmId* id, std::optional<std::uint32_t> qp_num,
                            bool post_established) {
  const ProviderHandover& provider = GetProviderHandover();
  if (qp_num && provider.bind != nullptr && id->pub.verbs != nullptr) {
    const siwx_stream_params params = MakeStreamParams(
        id->mpa.negotiated, id->role, static_cast<std::uint32_t>(id->options.mpa_timeout.count()));
    const siwx_stream_notify notify{&Core::OnStreamEvent, id->handle};
    SetInterest(id, 0);  // the QP owns readiness from now on
    const int rc = provider.bind(id->pub.verbs, *qp_num, id->fd, &params, &notify);
    if (rc != 0) {
      id->failure = std::string("the QP refused the stream: ") + std::strerror(rc);
      id->failure_code = SIWX_CM_FAILURE_HANDOVER;
      SIWX_LOG(kWarn, "CEP[%llu] %s", static_cast<unsigned long long>(id->handle),
               id->failure.c_str());
      CloseSocket(id, true);
      id->state = IdState::kFailed;
      Post(id, RDMA_CM_EVENT_CONNECT_ERROR, -rc);
      return;
    }
    id->fd = -1;
    id->registered = false;
    id->interest = 0;
    id->stream.bound = true;
    id->stream.qp_num = *qp_num;
  } else if (qp_num) {
    SIWX_LOG(kWarn, "CEP[%llu] the provider cannot take the stream (no siwx_qp_bind_stream_num): "
                    "the connection has no data path",
             static_cast<unsigned long long>(id->handle));
  }
  id->state = IdState::kEstablished;
  UpdateInterest(id);
  if (!post_established) return;
  const ByteSpan pd = id->role == mpa::MpaRole::kInitiator
                          ? ByteSpan(id->mpa.negotiated.peer_private_data)
                          : ByteSpan();
  Post(id, RDMA_CM_EVENT_ESTABLISHED, 0, pd, id->mpa.negotiated.ird, id->mpa.negotiated.ord);
}

void Core::EndBoundStream(CmId* id, bool abortive) {
  const ProviderHandover& provider = GetProviderHandover();
  if (!id->stream.bound || provider.disconnect == nullptr || id->pub.verbs == nullptr) return;
  // ENOENT: the QP, and with it the stream, is gone.
  const int rc = provider.disconnect(id->pub.verbs, id->stream.qp_num, abortive ? 1 : 0);
  if (rc != 0) {
    SIWX_LOG(kDebug, "CEP[%llu] ending the stream of QP %u returned %d",
             static_cast<unsigned long long>(id->handle), id->stream.qp_num, rc);
  }
}

void Core::PeerClosed(CmId* id, int error) {
  if (id->fd >= 0) {
    // Take what the peer still sent, then close (CM-only connections).
    (void)net::DrainInput(id->fd);
    CloseSocket(id, false);
  }
  if (!id->stream.disconnect_posted) {
    id->stream.disconnect_posted = true;
    id->state = IdState::kDisconnected;
    Post(id, RDMA_CM_EVENT_DISCONNECTED, -error);
  }
}

void Core::OnStreamEvent(std::uint64_t cookie, int event, int error) {
  Core& core = Get();
  std::lock_guard lock(core.notify_mu_);
  if (core.notify_wake_fd_ < 0) return;  // no ids left: nobody to tell
  core.notes_.push_back({cookie, event, error});
  net::SignalEventFd(core.notify_wake_fd_);
}

void Core::DrainStreamNotes() {
  std::vector<StreamNote> notes;
  {
    std::lock_guard lock(notify_mu_);
    notes.swap(notes_);
  }
  for (const StreamNote& n : notes) {
    const auto it = by_handle_.find(n.cookie);
    if (it == by_handle_.end()) continue;  // the id is gone
    CmId* id = it->second;
    if (!id->stream.bound) continue;
    SIWX_LOG(kDebug, "CEP[%llu] stream %s (errno %d)", static_cast<unsigned long long>(id->handle),
             n.event == SIWX_STREAM_EVENT_CLOSED ? "closed" : "failed", n.error);
    const int error = n.event == SIWX_STREAM_EVENT_CLOSED ? 0 : n.error;
    // The peer's last messages reach the CQ just before its close: an
    // application that polls the CQ empty and then reads this channel
    // (libfabric's ofi_rxm) would see DISCONNECTED first, destroy the QP and
    // lose them with it. So DISCONNECTED waits for them to be polled.
    if (!id->stream.disconnect_posted && HasUnpolledCompletions(id)) {
      id->stream.held_until = Clock::now() + kDisconnectHold;
      held_.insert(id->handle);
      id->stream.held_error = error;
      SIWX_LOG(kDebug, "CEP[%llu] DISCONNECTED held until the QP's completions are polled",
               static_cast<unsigned long long>(id->handle));
      continue;
    }
    PeerClosed(id, error);
  }
}

bool Core::HasUnpolledCompletions(CmId* id) {
  const ProviderHandover& provider = GetProviderHandover();
  if (provider.unpolled == nullptr || !id->stream.bound || id->pub.verbs == nullptr) {
    return false;
  }
  // By number: the application may destroy the QP with ibv_destroy_qp at
  // any time, and this runs on the CM's thread. A QP that is gone leaves
  // nothing to poll.
  std::uint32_t count = 0;
  return provider.unpolled(id->pub.verbs, id->stream.qp_num, &count) == 0 && count > 0;
}

void Core::ReleaseHeldDisconnects(TimePoint now) {
  // Handles, not pointers, as in OnTimers; a copy, as PeerClosed may
  // destroy ids.
  const std::vector<std::uint64_t> held(held_.begin(), held_.end());
  for (std::uint64_t handle : held) {
    const auto it = by_handle_.find(handle);
    if (it == by_handle_.end() || !it->second->stream.held_until) {
      held_.erase(handle);
      continue;
    }
    CmId* id = it->second;
    const bool expired = *id->stream.held_until <= now;
    if (!expired && !id->stream.disconnect_posted && HasUnpolledCompletions(id)) continue;
    if (expired) {
      SIWX_LOG(kDebug, "CEP[%llu] DISCONNECTED after %lld ms with completions still unpolled",
               static_cast<unsigned long long>(id->handle),
               static_cast<long long>(kDisconnectHold.count()));
    }
    id->stream.held_until.reset();
    held_.erase(handle);
    PeerClosed(id, id->stream.held_error);  // posts nothing after rdma_disconnect
  }
}

}  // namespace siwx::cm
