// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "rdmacm-ext/cm_core.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "common/wire/fpdu.h"
#include "common/wire/terminate.h"
#include "common/util/log.h"
#include "rdmacm-ext/cm_devices.h"
#include "rdmacm-ext/stream_handover.h"

namespace siwx::cm {
namespace {

constexpr std::uint64_t kWakeCookie = 0;
// How long a closing connection (after a reject or a local disconnect
// without a QP) waits for the peer's FIN before the socket is closed anyway.
constexpr auto kLingerTime = std::chrono::seconds(2);
// Listen backlog when the application passes 0 or less.
constexpr int kDefaultBacklog = 1024;
// The least TCP listen queue (see Listen).
constexpr int kMinKernelBacklog = 128;
// The Reply/Request/Rtr frame with the largest private data.
constexpr std::size_t kMaxStartupFrame = mpa::kStartupHeaderSize + mpa::kMaxPrivateDataLength;

mpa::MpaTime NowMpa(TimePoint t) {
  return std::chrono::duration_cast<mpa::MpaTime>(t.time_since_epoch());
}

TimePoint FromMpa(mpa::MpaTime t) {
  return TimePoint(std::chrono::duration_cast<Clock::duration>(t));
}

std::uint8_t ClampU8(std::uint32_t v) { return static_cast<std::uint8_t>(std::min<std::uint32_t>(v, 255)); }

// rdma_conn_param read depths: RDMA_MAX_* (255) means "the device limit";
// anything else is clamped to it (libfabric passes 255, stock librdmacm
// would refuse other values above the limit).
std::uint16_t ClampDepth(std::uint8_t asked, std::uint32_t device_max, bool is_max) {
  const std::uint32_t limit = std::min<std::uint32_t>(device_max, mpa::kMaxIrdOrd - 1);
  if (is_max) return static_cast<std::uint16_t>(limit);
  return static_cast<std::uint16_t>(std::min<std::uint32_t>(asked, limit));
}

bool ExpectsFrames(const mpa::MpaNegotiator& n) {
  const mpa::NegotiatorState s = n.state();
  return s == mpa::NegotiatorState::kAwaitingReply || s == mpa::NegotiatorState::kAwaitingRequest ||
         s == mpa::NegotiatorState::kAwaitingRtr;
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

std::string_view IdStateName(IdState s) {
  switch (s) {
    case IdState::kIdle: return "idle";
    case IdState::kBound: return "bound";
    case IdState::kAddrResolved: return "address resolved";
    case IdState::kRouteResolved: return "route resolved";
    case IdState::kListening: return "listening";
    case IdState::kTcpConnecting: return "TCP connecting";
    case IdState::kMpaStartup: return "MPA startup";
    case IdState::kRequestPending: return "request pending";
    case IdState::kFlushing: return "flushing";
    case IdState::kAwaitEstablish: return "awaiting rdma_establish";
    case IdState::kEstablished: return "established";
    case IdState::kDisconnected: return "disconnected";
    case IdState::kRejected: return "rejected";
    case IdState::kFailed: return "failed";
  }
  return "unknown";
}

Core& Core::Get() {
  // Never destroyed: ids may outlive static destructors at exit.
  static Core* core = [] {
    auto* c = new Core;
    pthread_atfork([] { Get().BeforeFork(); }, [] { Get().AfterForkInParent(); },
                   [] { Get().AfterForkInChild(); });
    return c;
  }();
  return *core;
}

// ---- fork() ----

void Core::BeforeFork() {
  lifecycle_mu_.lock();
  mu_.lock();
  notify_mu_.lock();
}

void Core::AfterForkInParent() {
  notify_mu_.unlock();
  mu_.unlock();
  lifecycle_mu_.unlock();
}

void Core::AfterForkInChild() {
  // Only this thread exists in the child. The parent's connections are the
  // parent's: drop the child's references to their sockets (closing a
  // duplicate sends nothing; the parent's socket stays open) and forget
  // every object, without freeing it, so inherited pointers read as before
  // and look unknown to every call. Channel fds stay open: the application
  // may still hold their numbers.
  for (auto& [pub, id] : ids_) net::Close(id->fd);
  for (auto& [handle, l] : lingers_) net::Close(l.fd);
  net::Close(epfd_);
  net::Close(wake_fd_);
  ids_.clear();
  by_handle_.clear();
  channels_.clear();
  events_.clear();
  lingers_.clear();
  half_open_.clear();
  notes_.clear();
  live_ids_ = 0;
  epfd_ = -1;
  wake_fd_ = -1;
  notify_wake_fd_ = -1;
  stop_ = false;
  // The CM thread does not exist here: forget it without joining (its
  // handle names a thread of the parent).
  new (&thread_) std::thread();
  notify_mu_.unlock();
  mu_.unlock();
  lifecycle_mu_.unlock();
}

// ---- Loop lifetime ----

int Core::EnsureLoop() {
  if (thread_.joinable()) return 0;
  int epfd = -1;
  int wake = -1;
  int rc = net::CreateEpoll(&epfd);
  if (rc == 0) rc = net::CreateEventFd(true, &wake);
  bool registered = false;
  if (rc == 0) rc = net::EpollUpdate(epfd, wake, net::kWantRead, kWakeCookie, &registered);
  if (rc != 0) {
    net::Close(epfd);
    net::Close(wake);
    return rc;
  }
  {
    std::lock_guard lock(mu_);
    epfd_ = epfd;
    wake_fd_ = wake;
    stop_ = false;
  }
  {
    std::lock_guard lock(notify_mu_);
    notify_wake_fd_ = wake;
  }
  thread_ = std::thread([this] { Run(); });
  return 0;
}

void Core::StopLoopIfIdle() {
  std::lock_guard life(lifecycle_mu_);
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    if (live_ids_ != 0) return;
    stop_ = true;
    net::SignalEventFd(wake_fd_);
  }
  thread_.join();
  std::lock_guard lock(mu_);
  {
    std::lock_guard note_lock(notify_mu_);
    notify_wake_fd_ = -1;
    notes_.clear();
  }
  for (auto& [handle, linger] : lingers_) net::Close(linger.fd);
  lingers_.clear();
  net::Close(epfd_);
  net::Close(wake_fd_);
  epfd_ = -1;
  wake_fd_ = -1;
}

void Core::Wake() {
  if (wake_fd_ >= 0) net::SignalEventFd(wake_fd_);
}

void Core::Run() {
  std::array<net::PollEvent, 64> events;
  for (;;) {
    int timeout_ms;
    int epfd;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      timeout_ms = NextTimeoutMs(Clock::now());
      epfd = epfd_;
    }
    const int n = net::EpollWait(epfd, events.data(), static_cast<int>(events.size()), timeout_ms);
    std::lock_guard lock(mu_);
    if (stop_) return;
    for (int i = 0; i < n; ++i) {
      if (events[i].cookie == kWakeCookie) {
        net::DrainEventFd(wake_fd_);
        continue;
      }
      HandleIo(events[i].cookie, events[i]);
    }
    DrainStreamNotes();
    OnTimers(Clock::now());
  }
}

// ---- Registries ----

CmId* Core::FindId(rdma_cm_id* pub) {
  const auto it = ids_.find(pub);
  return it == ids_.end() ? nullptr : it->second;
}

CmChannel* Core::FindChannel(rdma_event_channel* pub) {
  const auto it = channels_.find(pub);
  return it == channels_.end() ? nullptr : it->second;
}

bool Core::KnownId(rdma_cm_id* id) {
  std::lock_guard lock(mu_);
  return FindId(id) != nullptr;
}

CmChannel* Core::NewChannel(bool sync, int* err) {
  int fd = -1;
  *err = net::CreateEventFd(false, &fd);
  if (*err != 0) return nullptr;
  auto* ch = new CmChannel;
  ch->pub.fd = fd;
  ch->sync = sync;
  channels_[&ch->pub] = ch;
  return ch;
}

void Core::FreeChannel(CmChannel* ch) {
  for (CmEvent* ev : ch->queue) delete ev;
  ch->queue.clear();
  channels_.erase(&ch->pub);
  net::Close(ch->pub.fd);
  delete ch;
}

int Core::CreateChannel(rdma_event_channel** out) {
  std::lock_guard lock(mu_);
  int err = 0;
  CmChannel* ch = NewChannel(false, &err);
  if (ch == nullptr) return err;
  *out = &ch->pub;
  return 0;
}

void Core::DestroyChannel(rdma_event_channel* pub) {
  std::unique_lock lock(mu_);
  CmChannel* ch = FindChannel(pub);
  if (ch == nullptr || ch->sync) return;  // unknown, or owned by a synchronous id
  // Requests nobody can retrieve any more: drop their ids with them.
  std::vector<std::uint64_t> orphans;
  for (CmEvent* ev : ch->queue) {
    if (ev->pub.event == RDMA_CM_EVENT_CONNECT_REQUEST) orphans.push_back(ev->id_handle);
  }
  for (std::uint64_t handle : orphans) {
    const auto it = by_handle_.find(handle);
    if (it != by_handle_.end()) DestroyLocked(it->second);
  }
  for (auto& [key, id] : ids_) {
    if (id->channel == ch) {
      id->channel = nullptr;
      id->pub.channel = nullptr;
    }
  }
  FreeChannel(ch);
  const bool idle = live_ids_ == 0;
  lock.unlock();
  if (idle && !orphans.empty()) StopLoopIfIdle();
}

CmEvent* Core::Post(CmId* id, rdma_cm_event_type type, int status, ByteSpan private_data,
                    std::uint32_t ird, std::uint32_t ord) {
  CmChannel* ch = id->channel;
  if (type == RDMA_CM_EVENT_CONNECT_REQUEST && id->listener != nullptr) ch = id->listener->channel;
  if (ch == nullptr) {
    SIWX_LOG(kDebug, "CEP[%llu] %s dropped: the id has no event channel",
             static_cast<unsigned long long>(id->handle), rdma_event_str(type));
    return nullptr;
  }
  auto* ev = new CmEvent;
  ev->id = id;
  ev->id_handle = id->handle;
  ev->pub.id = &id->pub;
  ev->pub.event = type;
  ev->pub.status = status;
  // RDMA_CM private data lengths are 8 bits; siwx_cm_peer_private_data()
  // gives the rest of a longer MPA private data.
  const std::size_t len = std::min<std::size_t>(private_data.size(), 255);
  ev->private_data.assign(private_data.begin(), private_data.begin() + static_cast<std::ptrdiff_t>(len));
  ev->pub.param.conn.private_data = ev->private_data.empty() ? nullptr : ev->private_data.data();
  ev->pub.param.conn.private_data_len = static_cast<std::uint8_t>(len);
  ev->pub.param.conn.responder_resources = ClampU8(ird);
  ev->pub.param.conn.initiator_depth = ClampU8(ord);
  if (type == RDMA_CM_EVENT_CONNECT_REQUEST && id->listener != nullptr) {
    ev->listener = id->listener;
    ev->pub.listen_id = &id->listener->pub;
  }
  if (type != RDMA_CM_EVENT_ADDR_RESOLVED && type != RDMA_CM_EVENT_ROUTE_RESOLVED &&
      type != RDMA_CM_EVENT_ADDR_ERROR) {
    id->last_status = status;
  }
  ch->queue.push_back(ev);
  net::SignalEventFd(ch->pub.fd);
  SIWX_LOG(kDebug, "CEP[%llu] event %s status %d", static_cast<unsigned long long>(id->handle),
           rdma_event_str(type), status);
  return ev;
}

void Core::RemoveQueuedEvents(CmId* id) {
  for (auto& [key, ch] : channels_) {
    auto& q = ch->queue;
    const std::size_t before = q.size();
    for (auto it = q.begin(); it != q.end();) {
      if ((*it)->id == id || (*it)->listener == id) {
        delete *it;
        it = q.erase(it);
      } else {
        ++it;
      }
    }
    if (before != 0 && q.empty()) net::ClearEventFd(ch->pub.fd);
  }
}

// ---- Ids ----

CmId* Core::NewId(CmChannel* channel, bool sync, void* context, rdma_port_space ps,
                  ibv_qp_type qp_type) {
  auto* id = new CmId;
  id->handle = next_handle_++;
  id->channel = channel;
  id->sync = sync;
  id->options = GetCmConfig().mpa;
  id->pub.channel = channel != nullptr ? &channel->pub : nullptr;
  id->pub.context = context;
  id->pub.ps = ps;
  id->pub.qp_type = qp_type;
  ids_[&id->pub] = id;
  by_handle_[id->handle] = id;
  ++live_ids_;
  return id;
}

int Core::CreateId(rdma_event_channel* channel, rdma_cm_id** out, void* context,
                   rdma_port_space ps, ibv_qp_type qp_type) {
  if (out == nullptr) return EINVAL;
  // iWARP runs over TCP only: no UD QPs, no AF_IB.
  if (EnumValue(ps) != RDMA_PS_TCP || EnumValue(qp_type) != IBV_QPT_RC) return EPROTONOSUPPORT;
  int rc = 0;
  {
    std::unique_lock life(lifecycle_mu_);
    {
      std::lock_guard lock(mu_);
      if (channel != nullptr && FindChannel(channel) == nullptr) return EINVAL;
    }
    rc = EnsureLoop();
    if (rc != 0) return rc;
    std::lock_guard lock(mu_);
    CmChannel* ch = nullptr;
    const bool sync = channel == nullptr;
    if (sync) {
      ch = NewChannel(true, &rc);
    } else {
      ch = FindChannel(channel);
      if (ch == nullptr) rc = EINVAL;  // destroyed meanwhile
    }
    if (ch != nullptr) {
      CmId* id = NewId(ch, sync, context, ps, qp_type);
      *out = &id->pub;
      return 0;
    }
  }
  StopLoopIfIdle();  // started for an id that could not be made
  return rc;
}

void Core::ReleaseBacklogSlot(CmId* id) {
  CmId* l = id->listener;
  if (l == nullptr) return;
  id->listener = nullptr;
  if (id->backlog_slot && l->pending > 0) --l->pending;
  id->backlog_slot = false;
  UpdateInterest(l);
}

void Core::DestroyLocked(CmId* id) {
  RemoveQueuedEvents(id);
  // A listener takes its hidden children along; children already raised to
  // the application stay (they are the application's ids now).
  std::vector<CmId*> children;
  for (auto& [key, other] : ids_) {
    if (other->listener == id) children.push_back(other);
  }
  for (CmId* child : children) {
    if (child->hidden) {
      DestroyLocked(child);
    } else {
      child->listener = nullptr;
    }
  }
  ReleaseBacklogSlot(id);

  // As the kernel iw_cm: destroying a connected id resets its connection.
  if (id->stream_bound && !id->disconnect_posted) EndBoundStream(id, true);
  if (id->fd >= 0) {
    const bool graceful = id->state == IdState::kEstablished ||
                          id->state == IdState::kAwaitEstablish ||
                          id->state == IdState::kDisconnected;
    if (graceful) {
      if (!id->disconnect_posted) net::ShutdownWrite(id->fd);
      MoveToLinger(id, {});
    } else {
      CloseSocket(id, id->state != IdState::kBound && id->state != IdState::kListening &&
                          id->state != IdState::kAddrResolved &&
                          id->state != IdState::kRouteResolved);
    }
  }
  id->negotiator.reset();
  if (id->pub.event != nullptr) {
    const auto it = events_.find(id->pub.event);
    if (it != events_.end()) {
      delete it->second;
      events_.erase(it);
    }
    id->pub.event = nullptr;
  }
  if (id->sync && id->channel != nullptr) FreeChannel(id->channel);
  ids_.erase(&id->pub);
  by_handle_.erase(id->handle);
  --live_ids_;
  delete id;
}

int Core::DestroyId(rdma_cm_id* pub) {
  std::unique_lock lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  DestroyLocked(id);
  const bool idle = live_ids_ == 0;
  lock.unlock();
  if (idle) StopLoopIfIdle();
  return 0;
}

int Core::MigrateId(rdma_cm_id* pub, rdma_event_channel* channel) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  CmChannel* target = nullptr;
  if (channel == nullptr) {
    int err = 0;
    target = NewChannel(true, &err);
    if (target == nullptr) return err;
  } else {
    target = FindChannel(channel);
    if (target == nullptr || target->sync) return EINVAL;
  }
  CmChannel* old = id->channel;
  if (old == target) return 0;
  if (old != nullptr) {
    // Queued events of the id (and requests on a listener) follow it.
    for (auto it = old->queue.begin(); it != old->queue.end();) {
      if ((*it)->id == id || (*it)->listener == id) {
        target->queue.push_back(*it);
        net::SignalEventFd(target->pub.fd);
        it = old->queue.erase(it);
      } else {
        ++it;
      }
    }
    if (old->queue.empty()) net::ClearEventFd(old->pub.fd);
  }
  // Requests raised but not yet retrieved moved with the listener; their
  // ids follow them.
  for (auto& [key, child] : ids_) {
    if (child->listener == id && child->hidden && !child->sync && old != nullptr &&
        child->channel == old) {
      child->channel = target;
      child->pub.channel = &target->pub;
    }
  }
  if (id->sync) {
    if (id->pub.event != nullptr) {
      const auto it = events_.find(id->pub.event);
      if (it != events_.end()) {
        delete it->second;
        events_.erase(it);
      }
      id->pub.event = nullptr;
    }
    if (old != nullptr) FreeChannel(old);
  }
  id->channel = target;
  id->pub.channel = &target->pub;
  id->sync = channel == nullptr;
  return 0;
}

// ---- Events ----

int Core::GetEvent(rdma_event_channel* pub, rdma_cm_event** out) {
  if (out == nullptr) return EINVAL;
  for (;;) {
    int fd;
    {
      std::lock_guard lock(mu_);
      CmChannel* ch = FindChannel(pub);
      if (ch == nullptr) return EINVAL;
      fd = ch->pub.fd;
      if (!ch->queue.empty()) {
        CmEvent* ev = ch->queue.front();
        ch->queue.pop_front();
        // The fd is readable exactly while events are queued.
        if (ch->queue.empty()) net::ClearEventFd(fd);
        if (ev->id != nullptr && ev->id->hidden) ev->id->hidden = false;
        events_[&ev->pub] = ev;
        *out = &ev->pub;
        return 0;
      }
    }
    if (net::IsNonBlocking(fd)) return EAGAIN;
    const int rc = net::WaitReadable(fd);
    if (rc != 0 && rc != EINTR) return rc;
  }
}

int Core::AckEvent(rdma_cm_event* pub) {
  std::lock_guard lock(mu_);
  const auto it = events_.find(pub);
  if (it == events_.end()) return EINVAL;
  CmEvent* ev = it->second;
  events_.erase(it);
  // A synchronous id remembers its last event; forget it if acked directly.
  const auto owner = by_handle_.find(ev->id_handle);
  if (owner != by_handle_.end() && owner->second->pub.event == pub) {
    owner->second->pub.event = nullptr;
  }
  delete ev;
  return 0;
}

int Core::WaitSync(rdma_cm_id* pub) {
  rdma_event_channel* channel;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr || id->channel == nullptr) return EINVAL;
    if (id->pub.event != nullptr) {
      const auto it = events_.find(id->pub.event);
      if (it != events_.end()) {
        delete it->second;
        events_.erase(it);
      }
      id->pub.event = nullptr;
    }
    channel = &id->channel->pub;
  }
  rdma_cm_event* ev = nullptr;
  const int rc = GetEvent(channel, &ev);
  if (rc != 0) return rc;
  int status;
  rdma_cm_event_type type;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id != nullptr) id->pub.event = ev;
    status = ev->status;
    type = ev->event;
  }
  if (status == 0) return 0;
  if (type == RDMA_CM_EVENT_REJECTED) return ECONNREFUSED;
  return status < 0 ? -status : status;
}

// ---- Sockets and interest ----

void Core::SetInterest(CmId* id, std::uint32_t interest) {
  if (id->fd < 0 || epfd_ < 0) return;
  if (interest == id->interest && (interest == 0) == !id->registered) return;
  const int rc = net::EpollUpdate(epfd_, id->fd, interest, id->handle, &id->registered);
  if (rc != 0) {
    SIWX_LOG(kWarn, "CEP[%llu] epoll update failed (errno %d)",
             static_cast<unsigned long long>(id->handle), rc);
  }
  id->interest = interest;
}

void Core::UpdateInterest(CmId* id) {
  std::uint32_t interest = 0;
  switch (id->state) {
    case IdState::kListening:
      interest = id->pending < id->backlog && !id->accept_retry_at ? net::kWantRead : 0;
      break;
    case IdState::kTcpConnecting: interest = net::kWantWrite; break;
    case IdState::kMpaStartup:
    case IdState::kRequestPending:
    case IdState::kFlushing:
      interest = net::kWantHangup;
      if (id->negotiator != nullptr) {
        if (ExpectsFrames(*id->negotiator)) interest |= net::kWantRead;
        if (!id->negotiator->PendingOutput().empty()) interest |= net::kWantWrite;
      }
      break;
    case IdState::kAwaitEstablish:
    case IdState::kEstablished:
    case IdState::kDisconnected: interest = net::kWantHangup; break;
    default: interest = 0; break;
  }
  SetInterest(id, interest);
}

void Core::CloseSocket(CmId* id, bool abortive) {
  if (id->fd < 0) return;
  SetInterest(id, 0);
  if (abortive) {
    net::CloseAbortive(id->fd);
  } else {
    net::Close(id->fd);
  }
  id->fd = -1;
  id->registered = false;
  id->interest = 0;
}

void Core::MoveToLinger(CmId* id, ByteSpan out) {
  if (id->fd < 0) return;
  SetInterest(id, 0);
  const std::uint64_t handle = next_handle_++;
  Linger& l = lingers_[handle];
  l.fd = id->fd;
  l.out.assign(out.begin(), out.end());
  l.deadline = Clock::now() + kLingerTime;
  id->fd = -1;
  id->registered = false;
  id->interest = 0;
  // Try at once; the loop finishes what does not go out now.
  DriveLinger(handle, net::PollEvent{handle, true, true, false});
  Wake();
}

void Core::DriveLinger(std::uint64_t handle, const net::PollEvent& ev) {
  const auto it = lingers_.find(handle);
  if (it == lingers_.end()) return;
  Linger& l = it->second;
  bool done = false;
  if (!l.out.empty() && (ev.writable || ev.hangup)) {
    const net::IoResult r = net::SendSome(l.fd, l.out);
    if (r.status == net::IoResult::Status::kOk) {
      l.out.erase(l.out.begin(), l.out.begin() + static_cast<std::ptrdiff_t>(r.bytes));
    } else if (r.status == net::IoResult::Status::kError) {
      done = true;
    }
  }
  if (!done && l.out.empty() && !l.shut) {
    net::ShutdownWrite(l.fd);
    l.shut = true;
  }
  if (!done && (ev.readable || ev.hangup)) {
    const net::IoResult r = net::DrainInput(l.fd);
    done = r.status == net::IoResult::Status::kClosed || r.status == net::IoResult::Status::kError;
  }
  if (done) {
    if (l.registered && epfd_ >= 0) net::EpollUpdate(epfd_, l.fd, 0, handle, &l.registered);
    net::Close(l.fd);
    lingers_.erase(it);
    return;
  }
  const std::uint32_t interest = net::kWantRead | (l.out.empty() ? 0 : net::kWantWrite);
  if (epfd_ >= 0) net::EpollUpdate(epfd_, l.fd, interest, handle, &l.registered);
}

// ---- I/O dispatch ----

void Core::HandleIo(std::uint64_t cookie, const net::PollEvent& ev) {
  if (lingers_.count(cookie) != 0) {
    DriveLinger(cookie, ev);
    return;
  }
  const auto it = by_handle_.find(cookie);
  if (it == by_handle_.end()) return;  // closed since the event was queued
  CmId* id = it->second;
  switch (id->state) {
    case IdState::kListening:
      if (ev.readable) AcceptPending(id);
      break;
    case IdState::kTcpConnecting: {
      if (!ev.writable && !ev.hangup) break;
      const int error = net::TakeSocketError(id->fd);
      if (error == 0) {
        StartInitiatorMpa(id);
      } else {
        FailConnect(id, error);
      }
      break;
    }
    case IdState::kMpaStartup:
    case IdState::kRequestPending:
    case IdState::kFlushing: Drive(id, ev.hangup); break;
    case IdState::kAwaitEstablish:
    case IdState::kEstablished:
    case IdState::kDisconnected:
      if (ev.hangup) PeerClosed(id, 0);
      break;
    default: SetInterest(id, 0); break;
  }
}

bool Core::IsHalfOpen(const CmId* id) {
  return id->hidden && id->listener != nullptr && id->state == IdState::kMpaStartup;
}

void Core::MakeRoomForHalfOpen(const net::SockAddr& peer) {
  const CmConfig& config = GetCmConfig();
  for (;;) {
    std::size_t total = 0;
    std::size_t same_source = 0;
    std::optional<std::uint64_t> oldest;
    std::optional<std::uint64_t> oldest_same_source;
    for (auto it = half_open_.begin(); it != half_open_.end();) {
      const auto found = by_handle_.find(*it);
      if (found == by_handle_.end() || !IsHalfOpen(found->second)) {
        it = half_open_.erase(it);
        continue;
      }
      const std::optional<net::SockAddr> addr =
          net::SockAddr::From(&found->second->pub.route.addr.dst_addr);
      if (!oldest) oldest = *it;
      ++total;
      if (addr && net::SameAddress(*addr, peer)) {
        if (!oldest_same_source) oldest_same_source = *it;
        ++same_source;
      }
      ++it;
    }
    std::optional<std::uint64_t> victim;
    const char* bound = nullptr;
    if (same_source >= config.half_open_per_source) {
      victim = oldest_same_source;
      bound = "SIWX_CM_HALF_OPEN_PER_SOURCE";
    } else if (total >= config.half_open_max) {
      victim = oldest;
      bound = "SIWX_CM_HALF_OPEN_MAX";
    }
    if (!victim) return;
    // Its Request may have arrived since the last look (a burst of accepts
    // runs before the next poll): read it first, and count again if that
    // settled the connection either way.
    Drive(by_handle_.at(*victim), false);
    const auto it = by_handle_.find(*victim);
    if (it == by_handle_.end() || !IsHalfOpen(it->second)) continue;
    CmId* id = it->second;
    SIWX_LOG(kInfo,
             "CEP[%llu] dropped: no MPA Request yet, and a new connection from %s is over %s",
             static_cast<unsigned long long>(id->handle), peer.ToString().c_str(), bound);
    CloseSocket(id, true);
    DestroyLocked(id);
    return;
  }
}

void Core::BackOffAccepting(CmId* listener, int error) {
  const bool first = listener->accept_backoff.count() == 0;
  listener->accept_backoff =
      first ? kAcceptBackoffMin : std::min(listener->accept_backoff * 2, kAcceptBackoffMax);
  listener->accept_retry_at = Clock::now() + listener->accept_backoff;
  if (first) {
    SIWX_LOG(kWarn, "CEP[%llu] cannot accept connections: %s; retrying every %lld ms at most "
                    "while it lasts (raise the descriptor limit, ulimit -n)",
             static_cast<unsigned long long>(listener->handle), std::strerror(error),
             static_cast<long long>(kAcceptBackoffMax.count()));
  }
}

void Core::AcceptPending(CmId* listener) {
  const TimePoint now = Clock::now();
  while (listener->pending < listener->backlog && !listener->accept_retry_at) {
    int fd = -1;
    const int rc = net::AcceptOne(listener->fd, &fd);
    if (rc == EAGAIN) {
      listener->accept_backoff = std::chrono::milliseconds(0);  // any shortage is over
      break;
    }
    if (rc != 0) {
      // Out of descriptors or memory (or anything else): the connection
      // stays queued and the listener readable, so polling again at once
      // would spin. Look again later (OnTimers).
      BackOffAccepting(listener, rc);
      break;
    }
    listener->accept_backoff = std::chrono::milliseconds(0);
    net::SetNoDelay(fd);
    CmId* child = NewId(nullptr, false, listener->pub.context, listener->pub.ps,
                        listener->pub.qp_type);
    child->hidden = true;
    child->options = listener->options;
    child->listener = listener;
    child->fd = fd;
    child->role = mpa::MpaRole::kResponder;
    child->started = true;
    child->pub.verbs = listener->pub.verbs;
    child->pub.pd = listener->pub.pd;
    child->pub.port_num = listener->pub.port_num;
    net::SockAddr local;
    net::SockAddr peer;
    if (net::LocalAddress(fd, &local) == 0) {
      std::memcpy(&child->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
      if (child->pub.verbs == nullptr) {
        // A wildcard listener: the device is the one owning the address the
        // peer reached. The registry lookup never calls back into the CM.
        const DeviceLookup d = DeviceRegistry::Get().ForAddress(local);
        child->pub.verbs = d.context;
        child->pub.pd = d.pd;
        child->pub.port_num = d.context != nullptr ? 1 : 0;
      }
    }
    if (net::PeerAddress(fd, &peer) == 0) {
      std::memcpy(&child->pub.route.addr.dst_storage, &peer.storage, sizeof(peer.storage));
      MakeRoomForHalfOpen(peer);
    }
    child->negotiator = std::make_unique<mpa::MpaNegotiator>(
        MakeNegotiatorConfig(child->options, mpa::MpaRole::kResponder, 0, 0));
    if (child->negotiator->Start(NowMpa(now)) != mpa::NegotiatorStatus::kOk) {
      SIWX_LOG(kWarn, "CEP[%llu] MPA responder configuration refused; dropping %s",
               static_cast<unsigned long long>(child->handle), peer.ToString().c_str());
      CloseSocket(child, true);
      DestroyLocked(child);
      continue;
    }
    child->state = IdState::kMpaStartup;
    half_open_.push_back(child->handle);
    SIWX_LOG(kDebug, "CEP[%llu] TCP connection from %s on CEP[%llu]",
             static_cast<unsigned long long>(child->handle), peer.ToString().c_str(),
             static_cast<unsigned long long>(listener->handle));
    Drive(child, false);
  }
  UpdateInterest(listener);
}

// ---- Active side ----

void Core::FailConnect(CmId* id, int error) {
  id->failure = std::string("TCP connect failed: ") + std::strerror(error);
  id->failure_code = SIWX_CM_FAILURE_TCP_CONNECT;
  SIWX_LOG(kInfo, "CEP[%llu] %s", static_cast<unsigned long long>(id->handle), id->failure.c_str());
  CloseSocket(id, true);
  id->connect_deadline.reset();
  id->negotiator.reset();
  id->state = IdState::kFailed;
  Post(id, EventForConnectError(error), -error);
}

void Core::StartInitiatorMpa(CmId* id) {
  id->connect_deadline.reset();
  net::SockAddr local;
  if (net::LocalAddress(id->fd, &local) == 0) {
    std::memcpy(&id->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
  }
  id->negotiator = std::make_unique<mpa::MpaNegotiator>(
      MakeNegotiatorConfig(id->options, mpa::MpaRole::kInitiator, id->ird, id->ord));
  const mpa::NegotiatorStatus s = id->negotiator->Start(NowMpa(Clock::now()), id->private_data);
  if (s != mpa::NegotiatorStatus::kOk) {
    // Connect() checked the same configuration; this is only a safety net.
    id->failure = std::string("MPA Request refused: ") + std::string(mpa::NegotiatorStatusName(s));
    CloseSocket(id, true);
    id->negotiator.reset();
    id->state = IdState::kFailed;
    Post(id, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL);
    return;
  }
  id->state = IdState::kMpaStartup;
  Drive(id, false);
}

// ---- MPA startup ----

int Core::FlushNegotiatorOutput(CmId* id) {
  mpa::MpaNegotiator& n = *id->negotiator;
  while (!n.PendingOutput().empty()) {
    const net::IoResult r = net::SendSome(id->fd, n.PendingOutput());
    if (r.status == net::IoResult::Status::kWouldBlock) return 0;
    if (r.status != net::IoResult::Status::kOk) return r.error != 0 ? r.error : EPIPE;
    n.ConsumeOutput(r.bytes);
  }
  return 0;
}

void Core::Drive(CmId* id, bool hangup) {
  const std::uint64_t handle = id->handle;
  auto alive = [&] {
    const auto it = by_handle_.find(handle);
    return it != by_handle_.end() && it->second == id && id->negotiator != nullptr &&
           id->fd >= 0;
  };
  if (!alive()) return;
  const mpa::MpaTime now = NowMpa(Clock::now());
  mpa::MpaNegotiator& n = *id->negotiator;

  bool lost = FlushNegotiatorOutput(id) != 0;
  // Read startup frames only while one is expected; never past its end
  // (peek, feed, then consume exactly what the negotiator took).
  while (!lost && ExpectsFrames(n)) {
    std::array<std::uint8_t, kMaxStartupFrame> buf;
    const net::IoResult r = net::Peek(id->fd, buf);
    if (r.status == net::IoResult::Status::kWouldBlock) break;
    if (r.status != net::IoResult::Status::kOk) {
      lost = true;
      break;
    }
    const std::size_t consumed = n.Feed(now, ByteSpan(buf.data(), r.bytes));
    if (consumed > 0) {
      const net::IoResult d = net::Discard(id->fd, consumed);
      if (d.status != net::IoResult::Status::kOk) lost = true;
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
    if (id->negotiator->PendingOutput().empty()) {
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
  id->flush_deadline.reset();
  id->state = IdState::kFailed;
  id->negotiator.reset();
  CloseSocket(id, true);
  Post(id, error == ETIMEDOUT ? RDMA_CM_EVENT_UNREACHABLE : RDMA_CM_EVENT_CONNECT_ERROR, -error);
}

void Core::ProcessNegotiatorEvents(CmId* id) {
  const std::uint64_t handle = id->handle;
  while (true) {
    const auto it = by_handle_.find(handle);
    if (it == by_handle_.end() || it->second != id || id->negotiator == nullptr) return;
    std::optional<mpa::NegotiatorEvent> ev = id->negotiator->NextEvent();
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
  const mpa::StartupOffer& offer = id->negotiator->offer();
  const DeviceLimits limits = DeviceRegistry::Get().LimitsOf(id->pub.verbs);
  // What the application can pass straight to rdma_accept: our IRD need not
  // exceed the peer's ORD, our ORD must not exceed its IRD (RFC 6581 9.1).
  std::uint32_t ird = limits.max_ird;
  std::uint32_t ord = limits.max_ord;
  // Without the RFC 6581 word nothing is known of the peer: offer the
  // device limits, as Linux iWARP drivers report them for such peers; the
  // ULP's own agreement goes in rdma_accept's conn_param.
  if (offer.ird_ord) {
    if (offer.ird_ord->ord != mpa::kIrdOrdNotNegotiated) ird = std::min(ird, std::uint32_t{offer.ird_ord->ord});
    if (offer.ird_ord->ird != mpa::kIrdOrdNotNegotiated) ord = std::min(ord, std::uint32_t{offer.ird_ord->ird});
  }
  id->request_ird = ClampU8(ird);
  id->request_ord = ClampU8(ord);
  // From here the connection waits for the application: it takes a
  // backlog slot until rdma_accept or rdma_reject.
  id->backlog_slot = true;
  ++listener->pending;
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
    (void)id->negotiator->Reject({});
    MoveToLinger(id, id->negotiator->PendingOutput());
    DestroyLocked(id);
  }
}

void Core::LogEstablished(const CmId* id) {
  if (!log::Enabled(log::Level::kInfo)) return;
  const mpa::NegotiatedParams& p = id->negotiated;
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
           id->role == mpa::MpaRole::kInitiator ? "connected as Initiator" : "accepted as Responder",
           peer.ToString().c_str(), std::string(mpa::MpaDialectName(p.dialect)).c_str(),
           static_cast<unsigned>(p.revision), std::string(OnOff(p.crc)).c_str(),
           std::string(OnOff(p.markers_tx)).c_str(), std::string(OnOff(p.markers_rx)).c_str(),
           std::string(OnOff(p.large_fpdus)).c_str(), static_cast<unsigned>(p.ird), static_cast<unsigned>(p.ord),
           p.ird_ord_exchanged ? " (exchanged)" : "", rtr.c_str());
}

void Core::OnMpaEstablished(CmId* id) {
  id->mpa_done = true;
  id->negotiated = id->negotiator->params();
  LogEstablished(id);
  id->state = IdState::kFlushing;
  id->flush_deadline = Clock::now() + id->options.mpa_timeout;
  // Drive() writes what is left (the Reply, or the Rtr frame) and then
  // calls FinishHandover().
}

void Core::FinishHandover(CmId* id) {
  id->flush_deadline.reset();
  id->negotiator.reset();
  if (id->role == mpa::MpaRole::kInitiator && id->pub.qp == nullptr && id->conn_qp_num != 0 &&
      id->pub.verbs != nullptr) {
    // The application created its QP itself: it moves it and calls
    // rdma_establish (the IB CONNECT_RESPONSE pattern rping -q uses).
    id->state = IdState::kAwaitEstablish;
    UpdateInterest(id);
    Post(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, id->negotiated.peer_private_data,
         id->negotiated.ird, id->negotiated.ord);
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
        id->negotiated, id->role, static_cast<std::uint32_t>(id->options.mpa_timeout.count()));
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
    id->stream_bound = true;
    id->bound_qp_num = *qp_num;
  } else if (qp_num) {
    SIWX_LOG(kWarn, "CEP[%llu] the provider cannot take the stream (no siwx_qp_bind_stream_num): "
                    "the connection has no data path",
             static_cast<unsigned long long>(id->handle));
  }
  id->state = IdState::kEstablished;
  UpdateInterest(id);
  if (!post_established) return;
  const ByteSpan pd = id->role == mpa::MpaRole::kInitiator
                          ? ByteSpan(id->negotiated.peer_private_data)
                          : ByteSpan();
  Post(id, RDMA_CM_EVENT_ESTABLISHED, 0, pd, id->negotiated.ird, id->negotiated.ord);
}

void Core::OnMpaRejected(CmId* id, const mpa::NegotiatorEvent& ev) {
  id->negotiated = id->negotiator->params();
  id->failure = ev.reason;
  id->failure_code = ev.by_peer ? SIWX_CM_FAILURE_REJECTED : FailureCode(ev.failure);
  if (ev.by_peer) {
    // RFC 5044 7.1.2 rule 3: MPA is over; the ULP closes the connection.
    SIWX_LOG(kInfo, "CEP[%llu] rejected by the peer (%zu octets of private data)",
             static_cast<unsigned long long>(id->handle),
             id->negotiated.peer_private_data.size());
    CloseSocket(id, false);
    id->negotiator.reset();
    id->state = IdState::kRejected;
    Post(id, RDMA_CM_EVENT_REJECTED, -ECONNREFUSED, id->negotiated.peer_private_data);
    return;
  }
  // Our own policy refused the Request (CRC or markers) before the
  // application saw it: send the Reject, then let the connection go.
  SIWX_LOG(kInfo, "CEP[%llu] refused an MPA Request: %s",
           static_cast<unsigned long long>(id->handle), ev.reason.c_str());
  MoveToLinger(id, id->negotiator->PendingOutput());
  if (id->hidden) {
    DestroyLocked(id);
    return;
  }
  id->negotiator.reset();
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
  const mpa::NegotiatedParams& p = id->negotiator->params();
  mpa::FpduFramer framer(mpa::FpduFramingConfig{p.crc, p.markers_tx, 0});
  auto frame = std::make_unique<mpa::FpduFrame>();
  if (framer.Frame(ByteSpan(ulpdu.data(), enc.length), {}, *frame) != mpa::FrameStatus::kOk) return;
  std::vector<std::uint8_t> wire;
  for (const mpa::IoSlice& s : frame->slices()) wire.insert(wire.end(), s.base, s.base + s.len);
  // Best effort: a few dozen octets into a fresh socket buffer.
  (void)net::SendSome(id->fd, wire);
}

void Core::OnMpaFailed(CmId* id, const mpa::NegotiatorEvent& ev) {
  id->negotiated = id->negotiator->params();
  id->mpa_error = ev.error;
  id->failure = ev.reason;
  id->failure_code = FailureCode(ev.failure);
  if (ev.send_terminate) SendTerminate(id, ev.error);
  const bool hidden = id->hidden;
  const bool was_pending = id->state == IdState::kRequestPending;
  SIWX_LOG(kInfo, "CEP[%llu] MPA startup failed (%s): %s",
           static_cast<unsigned long long>(id->handle),
           std::string(mpa::StartupFailureName(ev.failure)).c_str(), ev.reason.c_str());
  CloseSocket(id, true);
  id->negotiator.reset();
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

void Core::EndBoundStream(CmId* id, bool abortive) {
  const ProviderHandover& provider = GetProviderHandover();
  if (!id->stream_bound || provider.disconnect == nullptr || id->pub.verbs == nullptr) return;
  // ENOENT: the QP, and with it the stream, is gone.
  const int rc = provider.disconnect(id->pub.verbs, id->bound_qp_num, abortive ? 1 : 0);
  if (rc != 0) {
    SIWX_LOG(kDebug, "CEP[%llu] ending the stream of QP %u returned %d",
             static_cast<unsigned long long>(id->handle), id->bound_qp_num, rc);
  }
}

void Core::PeerClosed(CmId* id, int error) {
  if (id->fd >= 0) {
    // Take what the peer still sent, then close (CM-only connections).
    (void)net::DrainInput(id->fd);
    CloseSocket(id, false);
  }
  if (!id->disconnect_posted) {
    id->disconnect_posted = true;
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
    if (!id->stream_bound) continue;
    SIWX_LOG(kDebug, "CEP[%llu] stream %s (errno %d)", static_cast<unsigned long long>(id->handle),
             n.event == SIWX_STREAM_EVENT_CLOSED ? "closed" : "failed", n.error);
    const int error = n.event == SIWX_STREAM_EVENT_CLOSED ? 0 : n.error;
    // The peer's last messages reach the CQ just before its close: an
    // application that polls the CQ empty and then reads this channel
    // (libfabric's ofi_rxm) would see DISCONNECTED first, destroy the QP and
    // lose them with it. So DISCONNECTED waits for them to be polled.
    if (!id->disconnect_posted && HasUnpolledCompletions(id)) {
      id->disconnect_held_until = Clock::now() + kDisconnectHold;
      id->held_disconnect_error = error;
      SIWX_LOG(kDebug, "CEP[%llu] DISCONNECTED held until the QP's completions are polled",
               static_cast<unsigned long long>(id->handle));
      continue;
    }
    PeerClosed(id, error);
  }
}

bool Core::HasUnpolledCompletions(CmId* id) {
  const ProviderHandover& provider = GetProviderHandover();
  if (provider.unpolled == nullptr || !id->stream_bound || id->pub.verbs == nullptr) {
    return false;
  }
  // By number: the application may destroy the QP with ibv_destroy_qp at
  // any time, and this runs on the CM's thread. A QP that is gone leaves
  // nothing to poll.
  std::uint32_t count = 0;
  return provider.unpolled(id->pub.verbs, id->bound_qp_num, &count) == 0 && count > 0;
}

void Core::ReleaseHeldDisconnects(TimePoint now) {
  // Handles, not pointers, as in OnTimers.
  std::vector<std::uint64_t> held;
  for (auto& [handle, id] : by_handle_) {
    if (id->disconnect_held_until) held.push_back(handle);
  }
  for (std::uint64_t handle : held) {
    const auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) continue;
    CmId* id = it->second;
    const bool expired = *id->disconnect_held_until <= now;
    if (!expired && !id->disconnect_posted && HasUnpolledCompletions(id)) continue;
    if (expired) {
      SIWX_LOG(kDebug, "CEP[%llu] DISCONNECTED after %lld ms with completions still unpolled",
               static_cast<unsigned long long>(id->handle),
               static_cast<long long>(kDisconnectHold.count()));
    }
    id->disconnect_held_until.reset();
    PeerClosed(id, id->held_disconnect_error);  // posts nothing after rdma_disconnect
  }
}

// ---- Timers ----

void Core::OnTimers(TimePoint now) {
  ReleaseHeldDisconnects(now);
  // Handles, not pointers: handling one expiry may destroy an id.
  std::vector<std::uint64_t> due;
  for (auto& [handle, id] : by_handle_) {
    const bool connect_due = id->connect_deadline && *id->connect_deadline <= now;
    const bool mpa_due = id->negotiator != nullptr && id->negotiator->Deadline() &&
                         FromMpa(*id->negotiator->Deadline()) <= now;
    const bool flush_due = id->flush_deadline && *id->flush_deadline <= now;
    const bool accept_due = id->accept_retry_at && *id->accept_retry_at <= now;
    if (connect_due || mpa_due || flush_due || accept_due) due.push_back(handle);
  }
  for (std::uint64_t handle : due) {
    const auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) continue;
    CmId* id = it->second;
    if (id->accept_retry_at && *id->accept_retry_at <= now) {
      id->accept_retry_at.reset();
      if (id->state == IdState::kListening) AcceptPending(id);
    } else if (id->flush_deadline && *id->flush_deadline <= now) {
      id->flush_deadline.reset();
      if (id->state == IdState::kFlushing) {
        FailFlushing(id, ETIMEDOUT, "the peer did not take the last startup frame in time");
      }
    } else if (id->connect_deadline) {
      FailConnect(id, ETIMEDOUT);
    } else if (id->negotiator != nullptr) {
      id->negotiator->OnTime(NowMpa(now));
      ProcessNegotiatorEvents(id);
    }
  }
  std::vector<std::uint64_t> expired;
  for (auto& [handle, l] : lingers_) {
    if (l.deadline <= now) expired.push_back(handle);
  }
  for (std::uint64_t handle : expired) {
    Linger& l = lingers_[handle];
    if (l.registered && epfd_ >= 0) net::EpollUpdate(epfd_, l.fd, 0, handle, &l.registered);
    net::Close(l.fd);
    lingers_.erase(handle);
  }
}

int Core::NextTimeoutMs(TimePoint now) {
  std::optional<TimePoint> next;
  auto consider = [&](TimePoint t) {
    if (!next || t < *next) next = t;
  };
  for (auto& [handle, id] : by_handle_) {
    if (id->connect_deadline) consider(*id->connect_deadline);
    if (id->flush_deadline) consider(*id->flush_deadline);
    if (id->accept_retry_at) consider(*id->accept_retry_at);
    if (id->negotiator != nullptr && id->negotiator->Deadline()) {
      consider(FromMpa(*id->negotiator->Deadline()));
    }
  }
  for (auto& [handle, l] : lingers_) consider(l.deadline);
  for (auto& [handle, id] : by_handle_) {
    // Polling by the application is not an event here: look again soon.
    if (id->disconnect_held_until) consider(std::min(*id->disconnect_held_until, now + kDisconnectRecheck));
  }
  if (!next) return -1;
  if (*next <= now) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
  return static_cast<int>(std::min<std::int64_t>(ms, 60000));
}

// ---- Addressing ----

int Core::BindAddr(rdma_cm_id* pub, const sockaddr* addr) {
  const std::optional<net::SockAddr> a = net::SockAddr::From(addr);
  if (!a) return addr == nullptr ? EINVAL : EAFNOSUPPORT;
  // The device lookup may enumerate devices: do it before taking mu_.
  // A loopback address binds no device, like the wildcard: the kernel CM
  // treats both as "any address" here and picks a device only when a
  // connection resolves or arrives. libfabric's verbs provider relies on
  // this (it binds "localhost" and, finding no device, offers the addresses
  // of its non-loopback interfaces instead).
  const DeviceLookup d =
      a->IsLoopback() ? DeviceLookup{} : DeviceRegistry::Get().ForAddress(*a);
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr || id->state != IdState::kIdle) return EINVAL;
  if (d.error != 0) return d.error;
  // The rdma_cm port space, not TCP's, decides what conflicts (as in the
  // kernel CM): a port is taken by ids bound to it, not by connections a
  // gone listener accepted on it. So the TCP socket of an explicit port
  // gets SO_REUSEADDR (Linux siw sets it on its sockets too), and conflicts
  // among our own ids are checked here.
  if (a->port() != 0) {
    const net::SockAddr mine = a->Unmapped();
    for (const auto& [key, other] : ids_) {
      if (!other->app_bound || other->fd < 0 || other == id) continue;
      const std::optional<net::SockAddr> theirs =
          net::SockAddr::From(&other->pub.route.addr.src_addr);
      if (!theirs || theirs->port() != a->port()) continue;
      if (id->reuseaddr && other->reuseaddr) continue;
      const net::SockAddr t = theirs->Unmapped();
      const bool same_address =
          t.family() == mine.family() && t.len == mine.len &&
          (t.family() == AF_INET
               ? reinterpret_cast<const sockaddr_in*>(&t.storage)->sin_addr.s_addr ==
                     reinterpret_cast<const sockaddr_in*>(&mine.storage)->sin_addr.s_addr
               : std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&t.storage)->sin6_addr,
                             &reinterpret_cast<const sockaddr_in6*>(&mine.storage)->sin6_addr,
                             sizeof(in6_addr)) == 0);
      if (same_address || t.IsWildcard() || mine.IsWildcard()) return EADDRINUSE;
    }
  }
  int fd = -1;
  int rc = net::OpenTcpSocket(a->family(), &fd);
  if (rc != 0) return rc;
  if (id->reuseaddr || a->port() != 0) (void)net::SetReuseAddr(fd, true);
  if (a->family() == AF_INET6 && id->afonly) (void)net::SetV6Only(fd, *id->afonly);
  rc = net::BindTo(fd, *a);
  net::SockAddr local;
  if (rc == 0) rc = net::LocalAddress(fd, &local);
  if (rc != 0) {
    net::Close(fd);
    return rc;
  }
  id->fd = fd;
  std::memcpy(&id->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
  id->pub.verbs = d.context;
  id->pub.pd = d.pd;
  id->pub.port_num = d.context != nullptr ? 1 : 0;
  id->state = IdState::kBound;
  id->app_bound = true;
  return 0;
}

int Core::ResolveAddr(rdma_cm_id* pub, const sockaddr* src, const sockaddr* dst) {
  const std::optional<net::SockAddr> d = net::SockAddr::From(dst);
  if (!d) return dst == nullptr ? EINVAL : EAFNOSUPPORT;
  bool bound;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return EINVAL;
    if (id->state != IdState::kIdle && id->state != IdState::kBound) return EINVAL;
    bound = id->state == IdState::kBound;
  }
  if (!bound && src != nullptr) {
    const int rc = BindAddr(pub, src);
    if (rc != 0) return rc;
    bound = true;
  }
  // The source address the kernel will use, and the device that owns it.
  net::SockAddr source;
  int route_error = net::SourceAddressFor(*d, &source);
  DeviceLookup device;
  if (route_error == 0) {
    device = DeviceRegistry::Get().ForAddress(source);
  }
  bool sync;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return EINVAL;
    if (id->state != IdState::kIdle && id->state != IdState::kBound) return EINVAL;
    sync = id->sync;
    if (bound && id->pub.route.addr.src_addr.sa_family != d->family()) return EINVAL;
    std::memcpy(&id->pub.route.addr.dst_storage, &d->storage, sizeof(d->storage));
    int error = route_error;
    if (error == 0 && !bound) {
      // Bind now (port 0): the id gets its local port at once, as the
      // kernel CM does, and the connect leaves from this address.
      int fd = -1;
      error = net::OpenTcpSocket(d->family(), &fd);
      if (error == 0) {
        if (id->reuseaddr) (void)net::SetReuseAddr(fd, true);
        net::SockAddr local;
        error = net::BindTo(fd, source);
        if (error == 0) error = net::LocalAddress(fd, &local);
        if (error == 0) {
          id->fd = fd;
          std::memcpy(&id->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
        } else {
          net::Close(fd);
        }
      }
    }
    if (error == 0 && id->pub.verbs == nullptr) {
      error = device.error;
      id->pub.verbs = device.context;
      id->pub.pd = device.pd;
      id->pub.port_num = device.context != nullptr ? 1 : 0;
    }
    if (error != 0) {
      id->failure = std::string("address resolution failed: ") + std::strerror(error);
      Post(id, RDMA_CM_EVENT_ADDR_ERROR, -error);
    } else {
      id->state = IdState::kAddrResolved;
      Post(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
    }
  }
  return sync ? WaitSync(pub) : 0;
}

int Core::ResolveRoute(rdma_cm_id* pub) {
  bool sync;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr || id->state != IdState::kAddrResolved) return EINVAL;
    // iWARP routes are TCP routes: nothing to resolve beyond the address.
    id->state = IdState::kRouteResolved;
    sync = id->sync;
    Post(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  }
  return sync ? WaitSync(pub) : 0;
}

int Core::Listen(rdma_cm_id* pub, int backlog) {
  bool idle;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return EINVAL;
    if (id->state != IdState::kIdle && id->state != IdState::kBound) return EINVAL;
    idle = id->state == IdState::kIdle;
  }
  if (idle) {
    // As the kernel CM: an unbound id listens on the IPv4 wildcard.
    const net::SockAddr any = net::SockAddr::Wildcard(AF_INET);
    const int rc = BindAddr(pub, any.get());
    if (rc != 0) return rc;
  }
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr || id->state != IdState::kBound) return EINVAL;
  id->backlog = backlog > 0 ? backlog : kDefaultBacklog;
  // Accepted connections inherit SO_REUSEADDR: they must not keep the port
  // from the next listener (see BindAddr).
  (void)net::SetReuseAddr(id->fd, true);
  // The kernel queue holds connections for the CM thread, which takes them
  // at once (half-open ones take no backlog slot): a small application
  // backlog must not make a burst of SYNs wait for retransmission.
  const int rc = net::ListenOn(id->fd, std::max(id->backlog, kMinKernelBacklog));
  if (rc != 0) return rc;
  net::SockAddr local;
  if (net::LocalAddress(id->fd, &local) == 0) {
    std::memcpy(&id->pub.route.addr.src_storage, &local.storage, sizeof(local.storage));
  }
  id->state = IdState::kListening;
  UpdateInterest(id);
  Wake();
  return 0;
}

// ---- Connection setup ----

int Core::Connect(rdma_cm_id* pub, const rdma_conn_param* param) {
  bool sync;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr || id->state != IdState::kRouteResolved) return EINVAL;
    const DeviceLimits limits = DeviceRegistry::Get().LimitsOf(id->pub.verbs);
    id->ird = ClampDepth(param ? param->responder_resources : 0, limits.max_ird,
                         param == nullptr || param->responder_resources == RDMA_MAX_RESP_RES);
    id->ord = ClampDepth(param ? param->initiator_depth : 0, limits.max_ord,
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
          MakeNegotiatorConfig(id->options, mpa::MpaRole::kInitiator, id->ird, id->ord));
      if (probe.Start(mpa::MpaTime::zero(), id->private_data) != mpa::NegotiatorStatus::kOk) {
        return EINVAL;
      }
    }
    if (id->fd < 0) return EINVAL;  // resolve_addr always leaves a socket
    id->role = mpa::MpaRole::kInitiator;
    id->started = true;
    id->mpa_done = false;
    id->mpa_error = mpa::MpaError::kNone;
    id->failure.clear();
    id->failure_code = SIWX_CM_FAILURE_NONE;
    if (id->tos) (void)net::SetTos(id->fd, id->pub.route.addr.src_addr.sa_family, *id->tos);
    (void)net::SetNoDelay(id->fd);
    const std::optional<net::SockAddr> dst = net::SockAddr::From(&id->pub.route.addr.dst_addr);
    const int rc = dst ? net::ConnectTo(id->fd, *dst) : EINVAL;
    sync = id->sync;
    if (rc == 0) {
      StartInitiatorMpa(id);
    } else if (rc == EINPROGRESS) {
      id->state = IdState::kTcpConnecting;
      id->connect_deadline = Clock::now() + id->options.connect_timeout;
      UpdateInterest(id);
      Wake();
    } else {
      FailConnect(id, rc);
    }
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
    if (id->state != IdState::kRequestPending || id->negotiator == nullptr) return EINVAL;
    const DeviceLimits limits = DeviceRegistry::Get().LimitsOf(id->pub.verbs);
    if (param == nullptr) {
      id->ird = id->request_ird;
      id->ord = id->request_ord;
    } else {
      id->ird = ClampDepth(param->responder_resources, limits.max_ird,
                           param->responder_resources == RDMA_MAX_RESP_RES);
      id->ord = ClampDepth(param->initiator_depth, limits.max_ord,
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
    mpa::NegotiatorStatus s = id->negotiator->Accept(NowMpa(Clock::now()), pd, id->ird, id->ord);
    if (s == mpa::NegotiatorStatus::kInvalidArgument && id->ird == 0) {
      // Only a Read RTR to grant and no inbound Read slot: one is needed.
      id->ird = 1;
      s = id->negotiator->Accept(NowMpa(Clock::now()), pd, id->ird, id->ord);
    }
    if (s != mpa::NegotiatorStatus::kOk) return EINVAL;
    ReleaseBacklogSlot(id);
    id->state = IdState::kMpaStartup;
    sync = id->sync;
    ProcessNegotiatorEvents(id);
    Drive(id, false);
    Wake();
  }
  return sync ? WaitSync(pub) : 0;
}

int Core::Reject(rdma_cm_id* pub, const void* private_data, std::uint8_t len) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  if (id->peer_gone) return 0;  // nothing left to reject
  if (id->state != IdState::kRequestPending || id->negotiator == nullptr) return EINVAL;
  ByteSpan pd;
  if (private_data != nullptr) pd = ByteSpan(static_cast<const std::uint8_t*>(private_data), len);
  // A v2 reject carries IRD/ORD 0: no resources offered.
  if (id->negotiator->Reject(pd) != mpa::NegotiatorStatus::kOk) return EINVAL;
  ReleaseBacklogSlot(id);
  // RFC 5044 7.1.2 rule 2: MPA exits after the Reject; we close the TCP
  // connection once the Reply is out and the peer has seen it.
  MoveToLinger(id, id->negotiator->PendingOutput());
  id->negotiator.reset();
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
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  switch (id->state) {
    case IdState::kEstablished:
    case IdState::kAwaitEstablish: break;
    case IdState::kDisconnected: return 0;
    default: return EINVAL;
  }
  if (id->stream_bound) {
    EndBoundStream(id, false);
  } else if (id->fd >= 0) {
    // CM-only: FIN now, close when the peer answers with its own.
    net::ShutdownWrite(id->fd);
    MoveToLinger(id, {});
  }
  id->disconnect_posted = true;
  id->state = IdState::kDisconnected;
  Post(id, RDMA_CM_EVENT_DISCONNECTED, 0);
  return 0;
}

int Core::GetRequest(rdma_cm_id* listen, rdma_cm_id** out) {
  if (out == nullptr) return EINVAL;
  rdma_event_channel* channel;
  {
    std::lock_guard lock(mu_);
    CmId* l = FindId(listen);
    if (l == nullptr || !l->sync || l->channel == nullptr) return EINVAL;
    if (l->pub.event != nullptr) {
      const auto it = events_.find(l->pub.event);
      if (it != events_.end()) {
        delete it->second;
        events_.erase(it);
      }
      l->pub.event = nullptr;
    }
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

// ---- QPs ----

int Core::InitQpAttr(rdma_cm_id* pub, ibv_qp_attr* attr, int* mask) {
  if (attr == nullptr || mask == nullptr) return EINVAL;
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  attr->port_num = id->pub.port_num != 0 ? id->pub.port_num : 1;
  // What the kernel's iw_cm answers: access flags for INIT, the state alone
  // (plus the port) for RTR and RTS.
  switch (EnumValue(attr->qp_state)) {
    case IBV_QPS_INIT:
      attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
      *mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT;
      return 0;
    case IBV_QPS_RTR:
    case IBV_QPS_RTS:
      *mask = IBV_QP_STATE | IBV_QP_PORT;
      return 0;
    default: return EINVAL;
  }
}

int Core::CreateQpEx(rdma_cm_id* pub, ibv_qp_init_attr_ex* attr) {
  if (attr == nullptr) return EINVAL;
  ibv_context* verbs;
  ibv_pd* shared_pd;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr || id->pub.qp != nullptr) return EINVAL;
    verbs = id->pub.verbs;
    shared_pd = id->pub.pd;
  }
  if (verbs == nullptr) return EINVAL;  // no device (CM-only mode, or not bound yet)
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_PD) == 0 || attr->pd == nullptr) {
    attr->pd = shared_pd;
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
  }
  if (attr->pd == nullptr || attr->pd->context != verbs) return EINVAL;

  // As stock librdmacm: CQs (each with its own completion channel) for the
  // queues the caller left without one.
  ibv_comp_channel* send_channel = nullptr;
  ibv_comp_channel* recv_channel = nullptr;
  ibv_cq* send_cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  auto cleanup = [&] {
    if (send_cq != nullptr) ibv_destroy_cq(send_cq);
    if (recv_cq != nullptr) ibv_destroy_cq(recv_cq);
    if (send_channel != nullptr) ibv_destroy_comp_channel(send_channel);
    if (recv_channel != nullptr) ibv_destroy_comp_channel(recv_channel);
  };
  errno = 0;
  // A CQ with its own completion channel, for a queue the caller gave none.
  auto make_cq = [&](ibv_comp_channel*& channel, ibv_cq*& cq, std::uint32_t depth) {
    channel = ibv_create_comp_channel(verbs);
    if (channel != nullptr) {
      cq = ibv_create_cq(verbs, static_cast<int>(std::max<std::uint32_t>(depth, 1)), pub, channel, 0);
    }
    return cq != nullptr;
  };
  if (attr->recv_cq == nullptr) {
    if (!make_cq(recv_channel, recv_cq, attr->cap.max_recv_wr)) {
      const int err = errno != 0 ? errno : ENOMEM;
      cleanup();
      return err;
    }
    attr->recv_cq = recv_cq;
  }
  if (attr->send_cq == nullptr) {
    if (!make_cq(send_channel, send_cq, attr->cap.max_send_wr)) {
      const int err = errno != 0 ? errno : ENOMEM;
      cleanup();
      return err;
    }
    attr->send_cq = send_cq;
  }
  ibv_qp* qp = ibv_create_qp_ex(verbs, attr);
  if (qp == nullptr) {
    const int err = errno != 0 ? errno : ENOMEM;
    if (send_cq != nullptr) attr->send_cq = nullptr;
    if (recv_cq != nullptr) attr->recv_cq = nullptr;
    cleanup();
    return err;
  }
  ibv_qp_attr qp_attr{};
  qp_attr.qp_state = IBV_QPS_INIT;
  int mask = 0;
  int rc = InitQpAttr(pub, &qp_attr, &mask);
  if (rc == 0) rc = ibv_modify_qp(qp, &qp_attr, mask);
  if (rc != 0) {
    ibv_destroy_qp(qp);
    cleanup();
    return rc;
  }
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) {  // destroyed meanwhile: undo
    ibv_destroy_qp(qp);
    cleanup();
    return EINVAL;
  }
  id->pub.qp = qp;
  id->own_qp_num = qp->qp_num;
  if (send_cq != nullptr) {
    id->pub.send_cq = send_cq;
    id->pub.send_cq_channel = send_channel;
  }
  if (recv_cq != nullptr) {
    id->pub.recv_cq = recv_cq;
    id->pub.recv_cq_channel = recv_channel;
  }
  return 0;
}

void Core::DestroyQp(rdma_cm_id* pub) {
  ibv_qp* qp;
  ibv_cq* cqs[2];
  ibv_comp_channel* channels[2];
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr) return;
    qp = id->pub.qp;
    id->pub.qp = nullptr;
    cqs[0] = id->pub.send_cq;
    cqs[1] = id->pub.recv_cq;
    channels[0] = id->pub.send_cq_channel;
    channels[1] = id->pub.recv_cq_channel;
    id->pub.send_cq = id->pub.recv_cq = nullptr;
    id->pub.send_cq_channel = id->pub.recv_cq_channel = nullptr;
  }
  if (qp != nullptr) ibv_destroy_qp(qp);
  for (ibv_cq* cq : cqs) {
    if (cq != nullptr) ibv_destroy_cq(cq);
  }
  for (ibv_comp_channel* ch : channels) {
    if (ch != nullptr) ibv_destroy_comp_channel(ch);
  }
}

int Core::SetEpQpInitAttr(rdma_cm_id* pub, const ibv_qp_init_attr& attr, ibv_pd* pd) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  id->ep_qp_init_attr = attr;
  if (pd != nullptr) id->pub.pd = pd;
  return 0;
}

void Core::ClearEpQpInitAttr(rdma_cm_id* pub) {
  std::lock_guard lock(mu_);
  if (CmId* id = FindId(pub)) id->ep_qp_init_attr.reset();
}

// ---- siwx_cm.h ----

int Core::GetMpaOptions(rdma_cm_id* pub, siwx_cm_mpa_options* out) {
  if (out == nullptr || out->size < sizeof(siwx_cm_mpa_options)) return EINVAL;
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  const MpaOptions& o = id->options;
  out->size = sizeof(siwx_cm_mpa_options);
  out->dialect = static_cast<std::uint32_t>(DialectNumber(o.dialect));
  out->crc = static_cast<std::uint32_t>(o.crc);
  out->markers = static_cast<std::uint32_t>(o.markers);
  out->peer_to_peer = o.peer_to_peer ? 1 : 0;
  out->rtr_mask = RtrMask(o.rtr_types);
  out->connect_timeout_ms = static_cast<std::uint32_t>(o.connect_timeout.count());
  out->mpa_timeout_ms = static_cast<std::uint32_t>(o.mpa_timeout.count());
  out->large_fpdus = o.large_fpdus ? 1 : 0;
  return 0;
}

int Core::SetMpaOptions(rdma_cm_id* pub, const siwx_cm_mpa_options& in) {
  if (in.size < sizeof(siwx_cm_mpa_options)) return EINVAL;
  MpaOptions o;
  switch (in.dialect) {
    case SIWX_MPA_DIALECT_V1: o.dialect = mpa::MpaDialect::kV1; break;
    case SIWX_MPA_DIALECT_V1_RTR: o.dialect = mpa::MpaDialect::kV1Rtr; break;
    case SIWX_MPA_DIALECT_V2: o.dialect = mpa::MpaDialect::kV2; break;
    default: return EINVAL;
  }
  if (in.crc > SIWX_CM_POLICY_REFUSE || in.markers > SIWX_CM_POLICY_REFUSE) return EINVAL;
  o.crc = static_cast<Policy>(in.crc);
  o.markers = static_cast<Policy>(in.markers);
  constexpr std::uint32_t kAllRtr = SIWX_RTR_MASK_SEND | SIWX_RTR_MASK_WRITE | SIWX_RTR_MASK_READ;
  if (in.rtr_mask == 0 || (in.rtr_mask & ~kAllRtr) != 0) return EINVAL;
  o.rtr_types = {(in.rtr_mask & SIWX_RTR_MASK_SEND) != 0, (in.rtr_mask & SIWX_RTR_MASK_WRITE) != 0,
                 (in.rtr_mask & SIWX_RTR_MASK_READ) != 0};
  if (in.peer_to_peer > 1) return EINVAL;
  o.peer_to_peer = in.peer_to_peer == 1;
  if (o.peer_to_peer && o.dialect != mpa::MpaDialect::kV2) return EINVAL;
  auto in_range = [](std::uint32_t ms) { return ms >= kMinTimeoutMs && ms <= kMaxTimeoutMs; };
  if (!in_range(in.connect_timeout_ms) || !in_range(in.mpa_timeout_ms)) return EINVAL;
  o.connect_timeout = std::chrono::milliseconds(in.connect_timeout_ms);
  o.mpa_timeout = std::chrono::milliseconds(in.mpa_timeout_ms);
  if (in.large_fpdus > 1) return EINVAL;
  o.large_fpdus = in.large_fpdus == 1;
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  id->options = o;
  return 0;
}

int Core::ConnectionInfo(rdma_cm_id* pub, siwx_cm_conn_info* out) {
  if (out == nullptr || out->size < sizeof(siwx_cm_conn_info)) return EINVAL;
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  if (!id->started) return ENOTCONN;
  siwx_cm_conn_info info{};
  info.size = sizeof(info);
  info.role = id->role == mpa::MpaRole::kInitiator ? SIWX_CM_ROLE_INITIATOR : SIWX_CM_ROLE_RESPONDER;
  const mpa::NegotiatedParams& p = id->negotiated;
  if (id->mpa_done) {
    info.dialect = static_cast<std::uint32_t>(DialectNumber(p.dialect));
    info.mpa_revision = p.revision;
    info.crc = p.crc ? 1 : 0;
    info.tx_markers = p.markers_tx ? 1 : 0;
    info.rx_markers = p.markers_rx ? 1 : 0;
    info.ird = p.ird;
    info.ord = p.ord;
    info.ird_ord_exchanged = p.ird_ord_exchanged ? 1 : 0;
    info.peer_to_peer = p.peer_to_peer ? 1 : 0;
    info.large_fpdus = p.large_fpdus ? 1 : 0;
    const siwx_stream_params sp =
        MakeStreamParams(p, id->role, static_cast<std::uint32_t>(id->options.mpa_timeout.count()));
    info.rtr_role = sp.rtr_role;
    info.rtr_message = sp.rtr_message;
    info.rtr_mask = RtrMask(p.rtr_types);
  }
  // The peer's word and private data are known from a Request or from any
  // Reply, accepting or rejecting (RFC 6581 9.1).
  const mpa::NegotiatedParams& seen =
      (!id->mpa_done && id->negotiator != nullptr) ? id->negotiator->params() : p;
  if (seen.peer_ird_ord) {
    info.peer_ird_ord_valid = 1;
    info.peer_ird = seen.peer_ird_ord->ird;
    info.peer_ord = seen.peer_ird_ord->ord;
  }
  info.peer_private_data_len = static_cast<std::uint32_t>(seen.peer_private_data.size());
  info.stream_bound = id->stream_bound ? 1 : 0;
  info.mpa_error = static_cast<std::uint32_t>(id->mpa_error);
  info.status = id->last_status;
  info.failure_code = static_cast<std::uint32_t>(id->failure_code);
  std::snprintf(info.failure, sizeof(info.failure), "%s", id->failure.c_str());
  *out = info;
  return 0;
}

int Core::PeerPrivateData(rdma_cm_id* pub, void* buf, std::size_t len, std::size_t* full) {
  std::lock_guard lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr || (buf == nullptr && len != 0)) return EINVAL;
  if (!id->started) return ENOTCONN;
  const mpa::NegotiatedParams& seen =
      (!id->mpa_done && id->negotiator != nullptr) ? id->negotiator->params() : id->negotiated;
  const std::vector<std::uint8_t>& pd = seen.peer_private_data;
  if (!pd.empty() && len != 0) std::memcpy(buf, pd.data(), std::min(len, pd.size()));
  *full = pd.size();
  return 0;
}

}  // namespace siwx::cm
