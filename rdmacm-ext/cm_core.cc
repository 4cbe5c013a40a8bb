// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// cm::Core: the CM thread's loop and its lifetime, fork(), the registries of
// ids, channels and events, event delivery, socket interest and I/O
// dispatch (with the listener's accept path), and timers. The rest of Core
// is in cm_address.cc, cm_connect.cc, cm_mpa.cc, cm_stream.cc, cm_qp.cc and
// cm_options.cc.
#include "rdmacm-ext/cm_core.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "common/util/log.h"
#include "common/util/service_thread.h"
#include "rdmacm-ext/cm_core_internal.h"
#include "rdmacm-ext/cm_devices.h"
#include "rdmacm-ext/stream_handover.h"

namespace siwx::cm {
namespace {

constexpr std::uint64_t kWakeCookie = 0;
// How long a closing connection (after a reject or a local disconnect
// without a QP) waits for the peer's FIN before the socket is closed anyway.
constexpr auto kLingerTime = std::chrono::seconds(2);

const char* PortSpaceName(rdma_port_space ps) {
  switch (EnumValue(ps)) {
    case RDMA_PS_TCP: return "RDMA_PS_TCP";
    case RDMA_PS_UDP: return "RDMA_PS_UDP";
    case RDMA_PS_IPOIB: return "RDMA_PS_IPOIB";
    case RDMA_PS_IB: return "RDMA_PS_IB";
  }
  return "unknown";
}

const char* QpTypeName(ibv_qp_type type) {
  switch (EnumValue(type)) {
    case IBV_QPT_RC: return "RC";
    case IBV_QPT_UC: return "UC";
    case IBV_QPT_UD: return "UD";
    case IBV_QPT_RAW_PACKET: return "raw packet";
    case IBV_QPT_XRC_SEND: return "XRC send";
    case IBV_QPT_XRC_RECV: return "XRC receive";
    case IBV_QPT_DRIVER: return "driver";
  }
  return "unknown";
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
    // SIWX_TRACE: the startup frames go into the provider's trace too.
    const char* trace = std::getenv("SIWX_TRACE");
    if (trace != nullptr && trace[0] != '\0') {
      net::SetStartupIoTap(GetProviderHandover().trace_io);
    }
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
  poller_.reset();
  wake_.reset();
  ids_.clear();
  by_handle_.clear();
  channels_.clear();
  events_.clear();
  lingers_.clear();
  next_timer_ = TimePoint::max();
  sleeping_with_timer_.reset();
  held_.clear();
  half_open_.clear();
  notes_.clear();
  ack_waiters_.clear();
  live_ids_ = 0;
  notify_wake_fd_ = -1;
  stop_ = false;
  // Threads of the parent may have been waiting on it: start afresh.
  new (&acked_) std::condition_variable();
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
  auto poller = std::make_unique<net::Poller>();
  auto wake = std::make_unique<net::Doorbell>();
  int rc = poller->error();
  if (rc == 0) rc = wake->error();
  bool registered = false;
  if (rc == 0) rc = poller->Update(wake->fd(), net::kWantRead, kWakeCookie, &registered);
  if (rc != 0) return rc;
  const int wake_fd = wake->fd();
  {
    std::lock_guard lock(mu_);
    poller_ = std::move(poller);
    wake_ = std::move(wake);
    stop_ = false;
  }
  {
    std::lock_guard lock(notify_mu_);
    notify_wake_fd_ = wake_fd;
  }
  thread_ = util::StartServiceThread("siwx-cm", [this] { Run(); });
  return 0;
}

void Core::StopLoopIfIdle() {
  std::lock_guard life(lifecycle_mu_);
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    if (live_ids_ != 0) return;
    stop_ = true;
    wake_->Ring();
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
  poller_.reset();
  wake_.reset();
}

void Core::Wake() {
  if (wake_ != nullptr) wake_->Ring();
}

void Core::WakeForTimers() {
  // Sockets need no wake: epoll_ctl wakes the loop for a ready one itself.
  if (sleeping_with_timer_ && next_timer_ < *sleeping_with_timer_) Wake();
}

void Core::Run() {
  std::array<net::Poller::Event, 64> events;
  for (;;) {
    int timeout_ms;
    net::Poller* poller;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      timeout_ms = NextTimeoutMs(Clock::now());
      poller = poller_.get();
      sleeping_with_timer_ = next_timer_;
    }
    // The poller lives until this thread is joined (StopLoopIfIdle).
    const int n = poller->Wait(events, timeout_ms);
    std::lock_guard lock(mu_);
    sleeping_with_timer_.reset();
    if (stop_) return;
    for (int i = 0; i < n; ++i) {
      if (events[i].cookie == kWakeCookie) {
        wake_->Drain();
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
  if (ch->readers > 0) {
    // As a kernel rdma_cm file closed while a read() waits in it: the
    // readers stay blocked, and nothing reaches the channel any more.
    net::ClearEventFd(ch->pub.fd);
    ch->destroyed = true;
    return;
  }
  net::Close(ch->pub.fd);
  delete ch;
}

void Core::LeaveChannel(CmChannel* ch) {
  --ch->readers;
  if (ch->destroyed && ch->readers == 0) {
    net::Close(ch->pub.fd);
    delete ch;
  }
}

void Core::SetTestHooks(const CoreTestHooks& hooks) {
  std::lock_guard lock(mu_);
  test_hooks_ = hooks;
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
  ev->private_data.assign(private_data.begin(),
                          private_data.begin() + static_cast<std::ptrdiff_t>(len));
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

void Core::DropSyncEvent(CmId* id) {
  if (id->pub.event == nullptr) return;
  const auto it = events_.find(id->pub.event);
  id->pub.event = nullptr;
  if (it != events_.end()) ReleaseReturned(it->second);
}

void Core::ReleaseReturned(CmEvent* ev) {
  events_.erase(&ev->pub);
  CmId* const refs[] = {ev->id, ev->listener};
  delete ev;
  for (CmId* id : refs) {
    if (id == nullptr) continue;
    --id->unacked_refs;
    FreeIdIfUnreferenced(id);
  }
  acked_.notify_all();
}

void Core::FreeIdIfUnreferenced(CmId* id) {
  if (id->destroyed && id->unacked_refs == 0) delete id;
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
  // iWARP runs over TCP only: no UD QPs, no AF_IB. An id of another port
  // space could only ever carry a QP kernel siw refuses with EOPNOTSUPP, so
  // it is refused at once with that errno (a UD program on kernel siw fails
  // only when it creates its QP, and its peer may wait for ever).
  if (EnumValue(ps) != RDMA_PS_TCP || EnumValue(qp_type) != IBV_QPT_RC) {
    SIWX_LOG(kError,
             "rdma_create_id refused: %s with %s QPs; iWARP has only RC QPs over TCP "
             "(RDMA_PS_TCP), no UD, UC, XRC or multicast (EOPNOTSUPP)",
             PortSpaceName(ps), QpTypeName(qp_type));
    return EOPNOTSUPP;
  }
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
  if (id->backlog_slot && l->listen.pending > 0) --l->listen.pending;
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
  if (id->stream.bound && !id->stream.disconnect_posted) EndBoundStream(id, true);
  if (id->fd >= 0) {
    const bool graceful = id->state == IdState::kEstablished ||
                          id->state == IdState::kAwaitEstablish ||
                          id->state == IdState::kDisconnected;
    if (graceful) {
      if (!id->stream.disconnect_posted) net::ShutdownWrite(id->fd);
      MoveToLinger(id, {});
    } else {
      CloseSocket(id, id->state != IdState::kBound && id->state != IdState::kListening &&
                          id->state != IdState::kAddrResolved &&
                          id->state != IdState::kRouteResolved);
    }
  }
  id->mpa.negotiator.reset();
  DropSyncEvent(id);
  if (id->sync && id->channel != nullptr) FreeChannel(id->channel);
  ids_.erase(&id->pub);
  by_handle_.erase(id->handle);
  held_.erase(id->handle);
  --live_ids_;
  // Events the application holds still point at it (event->id).
  id->destroyed = true;
  FreeIdIfUnreferenced(id);
}

bool Core::AwaitsAck(std::uint64_t handle) const {
  const std::thread::id self = std::this_thread::get_id();
  for (const auto& [key, ev] : events_) {
    if (ev->reported_for != handle || ev->holder == self) continue;
    // A thread waiting in rdma_destroy_id cannot ack before its own wait
    // ends: waiting for it could close a circle.
    if (std::find(ack_waiters_.begin(), ack_waiters_.end(), ev->holder) != ack_waiters_.end()) {
      continue;
    }
    return true;
  }
  return false;
}

void Core::WaitForAcks(std::unique_lock<std::mutex>& lock, std::uint64_t handle,
                       const char* call) {
  if (!AwaitsAck(handle)) return;
  const std::thread::id self = std::this_thread::get_id();
  ack_waiters_.push_back(self);
  const CoreTestHooks hooks = test_hooks_;
  if (hooks.awaiting_acks != nullptr) {
    lock.unlock();
    hooks.awaiting_acks(hooks.arg);
    lock.lock();
  }
  const bool acked = acked_.wait_for(lock, kAckWait, [&] { return !AwaitsAck(handle); });
  ack_waiters_.erase(std::find(ack_waiters_.begin(), ack_waiters_.end(), self));
  if (!acked) {
    SIWX_LOG(kWarn,
             "%s: CEP[%llu]: another thread still holds an event of it unacknowledged after "
             "%lld ms; every event from rdma_get_cm_event needs its rdma_ack_cm_event",
             call, static_cast<unsigned long long>(handle),
             static_cast<long long>(kAckWait.count()));
  }
}

int Core::DestroyId(rdma_cm_id* pub) {
  std::unique_lock lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  const std::uint64_t handle = id->handle;
  DestroyLocked(id);
  // As librdmacm: the events already returned for the id are handled
  // before rdma_destroy_id returns.
  WaitForAcks(lock, handle, "rdma_destroy_id");
  const bool idle = live_ids_ == 0;
  lock.unlock();
  if (idle) StopLoopIfIdle();
  return 0;
}

int Core::MigrateId(rdma_cm_id* pub, rdma_event_channel* channel) {
  std::unique_lock lock(mu_);
  CmId* id = FindId(pub);
  if (id == nullptr) return EINVAL;
  if (id->sync && channel == nullptr) return EINVAL;  // already synchronous (as librdmacm)
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
  if (old != target) MoveId(id, old, target, channel == nullptr);
  // As librdmacm: the events already returned for the id on its old channel
  // are handled before the id is used on the new one.
  WaitForAcks(lock, id->handle, "rdma_migrate_id");
  return 0;
}

void Core::MoveId(CmId* id, CmChannel* old, CmChannel* target, bool sync) {
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
    DropSyncEvent(id);
    if (old != nullptr) FreeChannel(old);
  }
  id->channel = target;
  id->pub.channel = &target->pub;
  id->sync = sync;
}

// ---- Events ----

int Core::GetEvent(rdma_event_channel* pub, rdma_cm_event** out) {
  if (out == nullptr) return EINVAL;
  std::unique_lock lock(mu_);
  CmChannel* ch = FindChannel(pub);
  if (ch == nullptr) return EINVAL;
  // The channel lives while this thread is in it, even if destroyed; the
  // reader leaves it (with mu_ held) on every return.
  ++ch->readers;
  struct Reader {
    Core* core;
    CmChannel* ch;
    std::unique_lock<std::mutex>* lock;
    ~Reader() {
      if (!lock->owns_lock()) lock->lock();
      core->LeaveChannel(ch);
    }
  } reader{this, ch, &lock};
  for (;;) {
    // A destroyed channel stays empty: its readers wait for ever, as in
    // the kernel (where the blocked read() keeps the closed file alive).
    if (!ch->queue.empty()) {
      CmEvent* ev = ch->queue.front();
      ch->queue.pop_front();
      // The fd is readable exactly while events are queued.
      if (ch->queue.empty()) net::ClearEventFd(ch->pub.fd);
      if (ev->id->hidden) ev->id->hidden = false;
      ev->holder = std::this_thread::get_id();
      ev->reported_for = ev->listener != nullptr ? ev->listener->handle : ev->id_handle;
      ++ev->id->unacked_refs;
      if (ev->listener != nullptr) ++ev->listener->unacked_refs;
      events_[&ev->pub] = ev;
      *out = &ev->pub;
      return 0;
    }
    const int fd = ch->pub.fd;
    if (net::IsNonBlocking(fd)) return EAGAIN;
    const CoreTestHooks hooks = test_hooks_;
    lock.unlock();
    if (hooks.before_block != nullptr) hooks.before_block(hooks.arg);
    const int rc = net::WaitReadable(fd);
    if (hooks.after_wake != nullptr) hooks.after_wake(hooks.arg);
    lock.lock();
    // Woken for an event that is gone (another reader took it, or
    // rdma_destroy_id discarded it unread): wait again, as the kernel does.
    if (rc != 0 && rc != EINTR) return rc;
  }
}

int Core::AckEvent(rdma_cm_event* pub) {
  std::lock_guard lock(mu_);
  const auto it = events_.find(pub);
  if (it == events_.end()) return EINVAL;
  CmEvent* ev = it->second;
  // A synchronous id remembers its last event; forget it if acked directly.
  const auto owner = by_handle_.find(ev->id_handle);
  if (owner != by_handle_.end() && owner->second->pub.event == pub) {
    owner->second->pub.event = nullptr;
  }
  ReleaseReturned(ev);
  return 0;
}

int Core::WaitSync(rdma_cm_id* pub) {
  rdma_event_channel* channel;
  {
    std::lock_guard lock(mu_);
    CmId* id = FindId(pub);
    if (id == nullptr || id->channel == nullptr) return EINVAL;
    DropSyncEvent(id);
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
  if (id->fd < 0 || poller_ == nullptr) return;
  if (interest == id->interest && (interest == 0) == !id->registered) return;
  const int rc = poller_->Update(id->fd, interest, id->handle, &id->registered);
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
      interest = id->listen.pending < id->listen.backlog && !id->listen.accept_retry_at
                     ? net::kWantRead
                     : 0;
      break;
    case IdState::kTcpConnecting: interest = net::kWantWrite; break;
    case IdState::kMpaStartup:
    case IdState::kRequestPending:
    case IdState::kFlushing:
      interest = net::kWantHangup;
      if (id->mpa.negotiator != nullptr) {
        if (ExpectsFrames(*id->mpa.negotiator)) interest |= net::kWantRead;
        if (!id->mpa.negotiator->PendingOutput().empty()) interest |= net::kWantWrite;
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
  ArmTimer(l.deadline);
  id->fd = -1;
  id->registered = false;
  id->interest = 0;
  // Try at once; the loop finishes what does not go out now.
  DriveLinger(handle, net::Poller::Event{handle, true, true, false});
  WakeForTimers();
}

void Core::DriveLinger(std::uint64_t handle, const net::Poller::Event& ev) {
  const auto it = lingers_.find(handle);
  if (it == lingers_.end()) return;
  Linger& l = it->second;
  bool done = false;
  if (!l.out.empty() && (ev.writable || ev.hangup)) {
    const net::IoResult r = net::SendSome(l.fd, l.out);
    if (r.status == net::IoStatus::kOk) {
      l.out.erase(l.out.begin(), l.out.begin() + static_cast<std::ptrdiff_t>(r.bytes));
    } else if (r.status == net::IoStatus::kError) {
      done = true;
    }
  }
  if (!done && l.out.empty() && !l.shut) {
    net::ShutdownWrite(l.fd);
    l.shut = true;
  }
  if (!done && (ev.readable || ev.hangup)) {
    const net::IoResult r = net::DrainInput(l.fd);
    done = r.status == net::IoStatus::kClosed || r.status == net::IoStatus::kError;
  }
  if (done) {
    if (l.registered && poller_ != nullptr) poller_->Update(l.fd, 0, handle, &l.registered);
    net::Close(l.fd);
    lingers_.erase(it);
    return;
  }
  const std::uint32_t interest = net::kWantRead | (l.out.empty() ? 0 : net::kWantWrite);
  if (poller_ != nullptr) poller_->Update(l.fd, interest, handle, &l.registered);
}

// ---- I/O dispatch ----

void Core::HandleIo(std::uint64_t cookie, const net::Poller::Event& ev) {
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

std::optional<TimePoint> Core::MakeRoomForHalfOpen(const net::SockAddr& peer, TimePoint now,
                                                  std::size_t incoming) {
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
    if (same_source + incoming > config.half_open_per_source) {
      victim = oldest_same_source;
      bound = "SIWX_CM_HALF_OPEN_PER_SOURCE";
    } else if (total + incoming > config.half_open_max) {
      victim = oldest;
      bound = "SIWX_CM_HALF_OPEN_MAX";
    }
    if (!victim) return std::nullopt;
    // Its Request may have arrived since the last look (a burst of accepts
    // runs before the next poll): read it first, and count again if that
    // settled the connection either way.
    Drive(by_handle_.at(*victim), false);
    const auto it = by_handle_.find(*victim);
    if (it == by_handle_.end() || !IsHalfOpen(it->second)) continue;
    CmId* id = it->second;
    const TimePoint ripe = id->accepted_at + kHalfOpenGrace;
    if (ripe > now) {
      // Most likely an honest Request still on its way: keep it, and the
      // new one, and accept no more until then (see cm_core.h).
      SIWX_LOG(kDebug, "CEP[%llu] over %s with the oldest half-open connection %lld ms old: "
                       "pausing accept",
               static_cast<unsigned long long>(id->handle), bound,
               static_cast<long long>(
                   std::chrono::duration_cast<std::chrono::milliseconds>(now - id->accepted_at)
                       .count()));
      return ripe;
    }
    SIWX_LOG(kInfo,
             "CEP[%llu] dropped: no MPA Request yet, and a new connection from %s is over %s",
             static_cast<unsigned long long>(id->handle), peer.ToString().c_str(), bound);
    CloseSocket(id, true);
    DestroyLocked(id);
    return std::nullopt;
  }
}

void Core::ResumeAfterHalfOpenPause(CmId* listener) {
  if (!listener->listen.half_open_pause) return;
  listener->listen.half_open_pause = false;
  listener->listen.half_open_pause_peer.reset();
  listener->listen.accept_retry_at.reset();
  UpdateInterest(listener);
}

void Core::BackOffAccepting(CmId* listener, int error) {
  const bool first = listener->listen.accept_backoff.count() == 0;
  listener->listen.accept_backoff =
      first ? kAcceptBackoffMin : std::min(listener->listen.accept_backoff * 2, kAcceptBackoffMax);
  listener->listen.accept_retry_at = Clock::now() + listener->listen.accept_backoff;
  ArmTimers(listener);
  listener->listen.half_open_pause = false;
  listener->listen.half_open_pause_peer.reset();
  if (first) {
    SIWX_LOG(kWarn, "CEP[%llu] cannot accept connections: %s; retrying every %lld ms at most "
                    "while it lasts (raise the descriptor limit, ulimit -n)",
             static_cast<unsigned long long>(listener->handle), std::strerror(error),
             static_cast<long long>(kAcceptBackoffMax.count()));
  }
}

void Core::AcceptPending(CmId* listener) {
  const TimePoint now = Clock::now();
  while (listener->listen.pending < listener->listen.backlog && !listener->listen.accept_retry_at) {
    int fd = -1;
    const int rc = net::AcceptOne(listener->fd, &fd);
    if (rc == EAGAIN) {
      listener->listen.accept_backoff = std::chrono::milliseconds(0);  // any shortage is over
      break;
    }
    if (rc != 0) {
      // Out of descriptors or memory (or anything else): the connection
      // stays queued and the listener readable, so polling again at once
      // would spin. Look again later (OnTimers).
      BackOffAccepting(listener, rc);
      break;
    }
    listener->listen.accept_backoff = std::chrono::milliseconds(0);
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
    child->accepted_at = Clock::now();  // not `now`: a burst of accepts takes a while
    std::optional<TimePoint> pause_until;
    if (net::PeerAddress(fd, &peer) == 0) {
      std::memcpy(&child->pub.route.addr.dst_storage, &peer.storage, sizeof(peer.storage));
      pause_until = MakeRoomForHalfOpen(peer, child->accepted_at);
    }
    if (pause_until) {
      listener->listen.accept_retry_at = *pause_until;
      listener->listen.half_open_pause = true;
      listener->listen.half_open_pause_peer = peer;
      ArmTimers(listener);
    }
    child->mpa.negotiator = std::make_unique<mpa::MpaNegotiator>(
        MakeNegotiatorConfig(child->options, mpa::MpaRole::kResponder, 0, 0));
    if (child->mpa.negotiator->Start(NowMpa(now)) != mpa::NegotiatorStatus::kOk) {
      SIWX_LOG(kWarn, "CEP[%llu] MPA responder configuration refused; dropping %s",
               static_cast<unsigned long long>(child->handle), peer.ToString().c_str());
      CloseSocket(child, true);
      DestroyLocked(child);
      continue;
    }
    ArmTimers(child);
    child->state = IdState::kMpaStartup;
    half_open_.push_back(child->handle);
    SIWX_LOG(kDebug, "CEP[%llu] TCP connection from %s on CEP[%llu]",
             static_cast<unsigned long long>(child->handle), peer.ToString().c_str(),
             static_cast<unsigned long long>(listener->handle));
    Drive(child, false);
  }
  UpdateInterest(listener);
}

// ---- Timers ----

void Core::OnTimers(TimePoint now) {
  ReleaseHeldDisconnects(now);
  if (now < next_timer_) return;
  // Everything not due now is armed again, as it is found.
  next_timer_ = TimePoint::max();
  // Handles, not pointers: handling one expiry may destroy an id.
  std::vector<std::uint64_t> due;
  for (auto& [handle, id] : by_handle_) {
    const std::optional<TimePoint> deadline = EarliestDeadline(id);
    if (!deadline) continue;
    if (*deadline <= now) {
      due.push_back(handle);
    } else {
      ArmTimer(*deadline);
    }
  }
  for (std::uint64_t handle : due) {
    const auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) continue;
    CmId* id = it->second;
    if (id->listen.accept_retry_at && *id->listen.accept_retry_at <= now) {
      id->listen.accept_retry_at.reset();
      const bool paused = std::exchange(id->listen.half_open_pause, false);
      const std::optional<net::SockAddr> over = std::exchange(id->listen.half_open_pause_peer, {});
      if (paused && over) {
        // The pause kept one over the bound: drop the oldest now that it
        // is ripe, even if no connection comes to make room for.
        if (const std::optional<TimePoint> later = MakeRoomForHalfOpen(*over, now, 0)) {
          id->listen.accept_retry_at = *later;
          id->listen.half_open_pause = true;
          id->listen.half_open_pause_peer = over;
          ArmTimers(id);
          continue;
        }
      }
      if (id->state == IdState::kListening) AcceptPending(id);
    } else if (id->mpa.flush_deadline && *id->mpa.flush_deadline <= now) {
      id->mpa.flush_deadline.reset();
      if (id->state == IdState::kFlushing) {
        FailFlushing(id, ETIMEDOUT, "the peer did not take the last startup frame in time");
      }
    } else if (id->connect_deadline) {
      FailConnect(id, ETIMEDOUT);
    } else if (id->mpa.negotiator != nullptr) {
      id->mpa.negotiator->OnTime(NowMpa(now));
      ProcessNegotiatorEvents(id);
    }
    // One expiry is handled per turn; any other deadline of the id stays armed.
    const auto still = by_handle_.find(handle);
    if (still != by_handle_.end()) ArmTimers(still->second);
  }
  std::vector<std::uint64_t> expired;
  for (auto& [handle, l] : lingers_) {
    if (l.deadline <= now) {
      expired.push_back(handle);
    } else {
      ArmTimer(l.deadline);
    }
  }
  for (std::uint64_t handle : expired) {
    Linger& l = lingers_[handle];
    if (l.registered && poller_ != nullptr) poller_->Update(l.fd, 0, handle, &l.registered);
    net::Close(l.fd);
    lingers_.erase(handle);
  }
}

void Core::ArmTimer(TimePoint deadline) { next_timer_ = std::min(next_timer_, deadline); }

void Core::ArmTimers(const CmId* id) {
  if (const std::optional<TimePoint> deadline = EarliestDeadline(id)) ArmTimer(*deadline);
}

std::optional<TimePoint> Core::EarliestDeadline(const CmId* id) {
  std::optional<TimePoint> earliest;
  auto consider = [&](TimePoint t) {
    if (!earliest || t < *earliest) earliest = t;
  };
  if (id->connect_deadline) consider(*id->connect_deadline);
  if (id->mpa.flush_deadline) consider(*id->mpa.flush_deadline);
  if (id->listen.accept_retry_at) consider(*id->listen.accept_retry_at);
  if (id->mpa.negotiator != nullptr && id->mpa.negotiator->Deadline()) {
    consider(FromMpa(*id->mpa.negotiator->Deadline()));
  }
  return earliest;
}

int Core::NextTimeoutMs(TimePoint now) {
#ifndef NDEBUG
  // Every deadline set must have been armed.
  for (auto& [handle, id] : by_handle_) {
    const std::optional<TimePoint> deadline = EarliestDeadline(id);
    assert(!deadline || next_timer_ <= *deadline);
  }
  for (auto& [handle, l] : lingers_) assert(next_timer_ <= l.deadline);
#endif
  TimePoint next = next_timer_;
  for (std::uint64_t handle : held_) {
    const auto it = by_handle_.find(handle);
    if (it == by_handle_.end() || !it->second->stream.held_until) continue;
    // Polling by the application is not an event here: look again soon.
    next = std::min({next, *it->second->stream.held_until, now + kDisconnectRecheck});
  }
  if (next == TimePoint::max()) return -1;
  if (next <= now) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::min<std::int64_t>(ms, 60000));
}

}  // namespace siwx::cm
