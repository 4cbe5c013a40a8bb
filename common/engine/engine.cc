// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/engine.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <utility>

#include "common/util/service_thread.h"

namespace siwx::engine {
namespace {

// Timer nodes kept for reuse (about 64 octets each). A QP has one or two
// timers pending at a time; ib_write_bw -q 64 kept 64 pending and came back
// for more nodes than 64 spares held.
constexpr std::size_t kSpareTimerNodes = 256;

}  // namespace

std::unique_ptr<Engine> Engine::Create(EngineConfig config) {
  std::unique_ptr<Engine> engine(new Engine(std::move(config)));
  if (!engine->Start()) return nullptr;
  return engine;
}

Engine::Engine(EngineConfig config)
    : config_(std::move(config)),
      memory_(config_.memory),
      spin_budget_(std::clamp(config_.progress_spin, std::chrono::microseconds::zero(),
                              kMaxProgressSpin)),
      responder_spin_(std::clamp(config_.responder_spin, std::chrono::microseconds::zero(),
                                 std::chrono::microseconds(std::chrono::seconds(10)))),
      placement_(config_.progress_affinity) {
  spare_timer_nodes_.reserve(kSpareTimerNodes);
}

bool Engine::Start() {
  if (poller_.Add(doorbell_.fd(), &doorbell_, /*want_read=*/true, /*want_write=*/false) != 0 ||
      lease_watch_alarm_.error() != 0 ||
      poller_.Add(lease_watch_alarm_.fd(), &lease_watch_alarm_, /*want_read=*/true,
                  /*want_write=*/false) != 0) {
    return false;
  }
  std::lock_guard lock(command_mutex_);
  thread_ = util::StartServiceThread("siwx-progress", [this] {
    {
      // Start() publishes thread_id_ under this lock before the loop runs.
      std::lock_guard started(command_mutex_);
    }
    progress_tid_.store(gettid(), std::memory_order_release);
    placement_.Start();
    Run();
  });
  thread_id_ = thread_.get_id();
  return true;
}

Engine::~Engine() {
  {
    std::lock_guard lock(command_mutex_);
    stopping_ = true;
  }
  stop_.store(true, std::memory_order_release);
  doorbell_.Ring();
  if (thread_.joinable()) thread_.join();
  // Commands submitted before the thread stopped still run, in order (their
  // waiters were told not to wait once stopping_ was set).
  RunCommands();
  std::vector<std::shared_ptr<Qp>> watched;  // released outside the lock
  {
    std::lock_guard lock(lease_watch_mutex_);
    watched.swap(watched_leases_);
  }
  std::unordered_map<std::uint32_t, std::shared_ptr<Qp>> remaining;
  {
    std::lock_guard lock(registry_mutex_);
    remaining.swap(qps_);
  }
  for (auto& [num, qp] : remaining) {
    qp->destroyed_.store(true, std::memory_order_release);
    qp->Detach();
  }
}

bool Engine::OnProgressThread() const { return std::this_thread::get_id() == thread_id_; }

std::shared_ptr<Qp> Engine::CreateQp(const QpConfig& config, CreateQpStatus* status) {
  auto fail = [&](CreateQpStatus s) {
    if (status != nullptr) *status = s;
    return std::shared_ptr<Qp>();
  };
  if (config.pd == kNoPd || config.send_cq == nullptr || config.recv_cq == nullptr ||
      !CapsSupported(config.sq_caps) || config.max_ird > kMaxReadDepth ||
      config.max_ord > kMaxReadDepth) {
    return fail(CreateQpStatus::kInvalidConfig);
  }
  std::unique_ptr<ReceiveQueue> own_rq;
  if (config.srq != nullptr) {
    if (config.srq->kind() != ReceiveQueue::Kind::kShared) {
      return fail(CreateQpStatus::kInvalidConfig);
    }
  } else {
    QueueCaps rq_caps = config.rq_caps;
    rq_caps.max_inline_data = 0;
    own_rq = ReceiveQueue::Create(ReceiveQueue::Kind::kQueuePair, rq_caps);
    if (!own_rq) return fail(CreateQpStatus::kInvalidConfig);
  }

  std::lock_guard lock(registry_mutex_);
  // qp_nums 1..2^24-1 (the verbs qp_num space), skipping live ones.
  constexpr std::uint32_t kMaxQpNum = 0x00FFFFFFu;
  std::uint32_t num = 0;
  for (std::uint32_t tries = 0; tries < kMaxQpNum; ++tries) {
    const std::uint32_t candidate = next_qp_num_;
    next_qp_num_ = candidate == kMaxQpNum ? 1 : candidate + 1;
    if (qps_.find(candidate) == qps_.end()) {
      num = candidate;
      break;
    }
  }
  if (num == 0) return fail(CreateQpStatus::kNoResources);
  std::shared_ptr<Qp> qp(new Qp(this, num, config, std::move(own_rq)));
  qps_.emplace(num, qp);
  if (status != nullptr) *status = CreateQpStatus::kOk;
  return qp;
}

std::shared_ptr<Qp> Engine::FindQp(std::uint32_t qp_num) const {
  std::lock_guard lock(registry_mutex_);
  const auto it = qps_.find(qp_num);
  return it == qps_.end() ? nullptr : it->second;
}

std::size_t Engine::qp_count() const {
  std::lock_guard lock(registry_mutex_);
  return qps_.size();
}

void Engine::Unregister(std::uint32_t qp_num) {
  std::shared_ptr<Qp> keep;  // released outside the lock
  std::lock_guard lock(registry_mutex_);
  const auto it = qps_.find(qp_num);
  if (it == qps_.end()) return;
  keep = std::move(it->second);
  qps_.erase(it);
}

std::uint64_t Engine::Submit(Command command) {
  std::uint64_t ticket;
  {
    std::lock_guard lock(command_mutex_);
    commands_.push_back(std::move(command));
    ticket = ++submitted_ticket_;
  }
  doorbell_.Ring();
  return ticket;
}

void Engine::SubmitAndWait(Command command) {
  const std::uint64_t ticket = Submit(std::move(command));
  if (OnProgressThread()) return;
  std::unique_lock lock(command_mutex_);
  command_cv_.wait(lock, [&] { return completed_ticket_ >= ticket || stopping_; });
}

void Engine::Emit(const AsyncEvent& event) const {
  if (config_.on_async_event) config_.on_async_event(event);
}

void Engine::Run() {
  std::array<transport::Poller::Event, kEventsPerWait> events{};
  // Pollers sleeping on a CQ are woken once per phase below, not per
  // completion (CompletionQueue::DeferWakesOnThisThread).
  CompletionQueue::DeferWakesOnThisThread(true);
  while (!stop_.load(std::memory_order_acquire)) {
    placement_.Apply();
    const int n = WaitForEvents(events);
    bool rung = false;
    bool alarmed = false;
    std::size_t shared = 0;
    for (int i = 0; i < n; ++i) {
      const transport::Poller::Event& ev = events[static_cast<std::size_t>(i)];
      if (ev.ptr() == &doorbell_) {
        rung = true;
        continue;
      }
      if (ev.ptr() == &lease_watch_alarm_) {
        alarmed = true;
        continue;
      }
      // Valid: the registry keeps the QP alive until its detach command,
      // which runs only after this batch.
      Qp* const qp = static_cast<Qp*>(ev.ptr());
      // A finalized QP's writable turn may end in closing its drained
      // stream (OnPollEvent), which only this thread does.
      if (ev.writable && !ev.readable && !ev.hangup && !qp->finalized()) {
        shared_tx_[shared++] = qp;  // at most kEventsPerWait
        continue;
      }
      qp->OnPollEvent(ev.readable, ev.writable, ev.hangup);
    }
    ShareTransmitTurns(shared);
    if (rung) doorbell_.Drain();
    CompletionQueue::WakeDeferred();
    RunCommands();
    RunTimers();
    if (alarmed) LookAtWatchedLeases();
    CompletionQueue::WakeDeferred();
    if (responder_spin_.OnWakeupHandled(wake_)) {
      responder_spin_arms_.fetch_add(1, std::memory_order_relaxed);
    }
    NoteResponderSpin();
  }
  if (spin_noted_) CompletionQueue::NoteResponderSpin(false);
  spin_noted_ = false;
  CompletionQueue::DeferWakesOnThisThread(false);
}

void Engine::ShareTransmitTurns(std::size_t count) {
  if (count == 0) return;
  if (count == 1) {
    shared_tx_[0]->TransmitWhenWritable();
    return;
  }
  shared_tx_count_.store(static_cast<std::uint32_t>(count), std::memory_order_relaxed);
  shared_tx_next_.store(0, std::memory_order_relaxed);
  shared_tx_open_.store(true, std::memory_order_seq_cst);
  // One helper: a second CPU is what this thread lacks; every sleeping
  // poller woken would be a wake-up for a turn or two.
  for (std::size_t i = 0; i < count; ++i) {
    if (shared_tx_[i]->config().send_cq->WakeToHelp()) break;
  }
  TakeSharedTurns();
  // Closed first, then the helpers counted: a helper that comes later sees
  // it closed (both sequentially consistent).
  shared_tx_open_.store(false, std::memory_order_seq_cst);
  while (shared_tx_helpers_.load(std::memory_order_seq_cst) != 0) sched_yield();
}

std::uint64_t Engine::TakeSharedTurns() {
  const std::uint32_t count = shared_tx_count_.load(std::memory_order_relaxed);
  std::uint64_t taken = 0;
  for (;;) {
    const std::uint32_t turn = shared_tx_next_.fetch_add(1, std::memory_order_relaxed);
    if (turn >= count) return taken;
    shared_tx_[turn]->TransmitWhenWritable();
    ++taken;
  }
}

bool Engine::HelpTransmit() {
  if (!shared_tx_open_.load(std::memory_order_relaxed) || OnProgressThread()) return false;
  shared_tx_helpers_.fetch_add(1, std::memory_order_seq_cst);
  const std::uint64_t taken =
      shared_tx_open_.load(std::memory_order_seq_cst) ? TakeSharedTurns() : 0;
  shared_tx_helpers_.fetch_sub(1, std::memory_order_seq_cst);
  if (taken == 0) return false;
  transmit_turns_helped_.fetch_add(taken, std::memory_order_relaxed);
  return true;
}

int Engine::WaitForEvents(std::span<transport::Poller::Event> events) {
  const int timeout_ms = TimerWaitMs();
  const std::chrono::nanoseconds spin_max =
      std::clamp(config_.progress_spin, std::chrono::microseconds::zero(), kMaxProgressSpin);
  if (spin_max <= std::chrono::nanoseconds::zero()) {
    return WaitAfterResponderSpin(events, timeout_ms);
  }
  wake_ = ResponderSpin::Wake::kLate;
  if (timeout_ms == 0) return poller_.Wait(events, timeout_ms);
  // Polls without blocking for up to spin_budget_, then sleeps. The budget
  // halves after a spin that found nothing and returns to the maximum when
  // the sleep that followed ended within the maximum (a longer spin would
  // have caught that event): spinning stops paying for itself once events
  // come more slowly than the spin lasts (docs/performance-notes.md 3.3).
  using Clock = std::chrono::steady_clock;
  bool at_once = false;
  bool target_read = false;
  int n = Spin(events, spin_budget_, std::chrono::nanoseconds::max(), nullptr, &at_once,
               &target_read);
  if (n > 0 || stop_.load(std::memory_order_relaxed)) return n;
  spin_budget_ /= 2;
  if (spin_budget_ < std::chrono::microseconds(1)) spin_budget_ = {};
  const Clock::time_point sleep_start = Clock::now();
  n = poller_.Wait(events, timeout_ms);
  if (n > 0 && Clock::now() - sleep_start <= spin_max) spin_budget_ = spin_max;
  return n;
}

int Engine::WaitAfterResponderSpin(std::span<transport::Poller::Event> events,
                                   int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  using Wake = ResponderSpin::Wake;
  wake_ = Wake::kLate;
  if (responder_spin_.max() <= std::chrono::nanoseconds::zero()) {
    return poller_.Wait(events, timeout_ms);
  }
  if (responder_spin_.budget() > std::chrono::nanoseconds::zero() && timeout_ms != 0) {
    // A spinner sharing its CPU with the requester (other threads took the
    // other one) would hold back the very Request it waits for (60-100 us
    // per Read under load); yielding at once handed the CPU to any other
    // thread for its slice (a worse p99). So it yields only once the
    // Request is later than a round trip on another CPU would make it
    // (docs/performance-notes.md 3.8). It reads the socket the last
    // Request came on itself: epoll_wait would only say where to read, one
    // more system call before the Response (performance-notes 3.28).
    bool at_once = false;
    bool target_read = false;
    const int n = Spin(events, responder_spin_.budget(), ResponderSpin::kYieldAfter,
                       spin_target_, &at_once, &target_read);
    if (n > 0 || target_read) {
      wake_ = at_once ? Wake::kAtOnce : Wake::kSoon;
      responder_spin_catches_.fetch_add(1, std::memory_order_relaxed);
      if (target_read) responder_spin_reads_.fetch_add(1, std::memory_order_relaxed);
      return n;
    }
    if (stop_.load(std::memory_order_relaxed)) return 0;
    responder_spin_.OnSpinFoundNothing();
    NoteResponderSpin();
  }
  const Clock::time_point sleep_start = Clock::now();
  const int n = poller_.Wait(events, timeout_ms);
  if (n > 0 && responder_spin_.SleptBriefly(Clock::now() - sleep_start)) wake_ = Wake::kSoon;
  return n;
}

void Engine::NoteResponderSpin() {
  const bool spinning = responder_spin_.budget() > std::chrono::nanoseconds::zero();
  if (spinning == spin_noted_) return;
  spin_noted_ = spinning;
  CompletionQueue::NoteResponderSpin(spinning);
}

int Engine::Spin(std::span<transport::Poller::Event> events, std::chrono::nanoseconds budget,
                 std::chrono::nanoseconds yield_after, Qp* target, bool* at_once,
                 bool* target_read) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  *at_once = true;
  *target_read = false;
  unsigned turn = 0;
  for (Clock::duration spun{}; spun < budget; spun = Clock::now() - start) {
    if (target != nullptr && ++turn % kPollsPerEventWait != 0) {
      if (target->ReadInResponderSpin()) {
        *target_read = true;
        return 0;
      }
    } else {
      const int n = poller_.Wait(events, 0);
      if (n > 0) return n;
    }
    if (stop_.load(std::memory_order_relaxed)) return 0;
    *at_once = false;
    if (spun >= yield_after) sched_yield();
  }
  return 0;
}

void Engine::ScheduleTimer(const std::shared_ptr<Qp>& qp, TimerClock::time_point when) {
  bool earliest;
  {
    std::lock_guard lock(timer_mutex_);
    earliest = timers_.empty() || when < timers_.begin()->first;
    if (spare_timer_nodes_.empty()) {
      timers_.emplace(when, qp);
    } else {
      TimerMap::node_type node = std::move(spare_timer_nodes_.back());
      spare_timer_nodes_.pop_back();
      node.key() = when;
      node.mapped() = qp;
      timers_.insert(std::move(node));
    }
  }
  // The progress thread sleeps until the earliest timer it knew of.
  if (earliest && !OnProgressThread()) doorbell_.Ring();
}

int Engine::TimerWaitMs() {
  std::lock_guard lock(timer_mutex_);
  if (timers_.empty()) return -1;
  const auto left = timers_.begin()->first - TimerClock::now();
  if (left <= TimerClock::duration::zero()) return 0;
  // Rounded up, so the wait never ends just before the deadline.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, 60'000));
}

void Engine::RunTimers() {
  const TimerClock::time_point now = TimerClock::now();
  {
    std::lock_guard lock(timer_mutex_);
    while (!timers_.empty() && timers_.begin()->first <= now) {
      TimerMap::node_type node = timers_.extract(timers_.begin());
      if (std::shared_ptr<Qp> qp = node.mapped().lock()) due_timers_.push_back(std::move(qp));
      node.mapped().reset();
      if (spare_timer_nodes_.size() < kSpareTimerNodes) {
        spare_timer_nodes_.push_back(std::move(node));
      }
    }
  }
  if (due_timers_.empty()) return;
  timer_turns_.fetch_add(1, std::memory_order_relaxed);
  for (const std::shared_ptr<Qp>& qp : due_timers_) qp->OnTimer(now);
  due_timers_.clear();
}

void Engine::WatchReadLease(const std::shared_ptr<Qp>& qp) {
  std::lock_guard lock(lease_watch_mutex_);
  if (std::find(watched_leases_.begin(), watched_leases_.end(), qp) == watched_leases_.end()) {
    watched_leases_.push_back(qp);
  }
  RearmLeaseWatchLocked(TimerClock::now());
}

void Engine::RearmLeaseWatchLocked(TimerClock::time_point now) {
  // Ended leases (0) count for nothing; the progress thread drops their QPs.
  TimerClock::rep earliest = 0;
  for (const std::shared_ptr<Qp>& qp : watched_leases_) {
    const TimerClock::rep until = qp->read_lease_until_.load(std::memory_order_relaxed);
    if (until != 0 && (earliest == 0 || until < earliest)) earliest = until;
  }
  const TimerClock::time_point due =
      earliest == 0 ? TimerClock::time_point::max()
                    : LeaseWatchDue(TimerClock::time_point(TimerClock::duration(earliest)));
  if (due != lease_watch_due_) {
    // Fails only for a closed fd or a time out of range, neither of which
    // can happen here; the alarm would then stay as it was.
    if (lease_watch_alarm_.ArmAt(due) == 0) lease_watch_due_ = due;
  }
  const TimerClock::time_point rearm_after =
      due == TimerClock::time_point::max() ? due : LeaseWatchRearmAfter(now, due);
  lease_watch_rearm_after_.store(rearm_after.time_since_epoch().count(),
                                 std::memory_order_relaxed);
}

void Engine::LookAtWatchedLeases() {
  lease_watch_alarm_.Drain();
  lease_watch_turns_.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::shared_ptr<Qp>> watched;
  {
    std::lock_guard lock(lease_watch_mutex_);
    watched = watched_leases_;
  }
  // Outside the lock: ending a lease takes the QP's locks and may raise an
  // error. The QPs that hold no lease any more leave the watch.
  const TimerClock::time_point now = TimerClock::now();
  std::vector<const Qp*> unleased;
  for (const std::shared_ptr<Qp>& qp : watched) {
    if (!qp->LookAtWatchedLease(now)) unleased.push_back(qp.get());
  }
  std::vector<std::shared_ptr<Qp>> dropped;  // released outside the lock
  std::lock_guard lock(lease_watch_mutex_);
  for (const Qp* qp : unleased) dropped.push_back(UnwatchLocked(*qp));
  // Re-armed even for the time it went off for (drained now).
  lease_watch_due_ = TimerClock::time_point::min();
  RearmLeaseWatchLocked(now);
}

void Engine::ForgetWatchedLease(const Qp& qp) {
  std::shared_ptr<Qp> dropped;  // released outside the lock
  std::lock_guard lock(lease_watch_mutex_);
  dropped = UnwatchLocked(qp);
  if (dropped) RearmLeaseWatchLocked(TimerClock::now());
}

std::shared_ptr<Qp> Engine::UnwatchLocked(const Qp& qp) {
  const auto it = std::find_if(watched_leases_.begin(), watched_leases_.end(),
                               [&](const std::shared_ptr<Qp>& w) { return w.get() == &qp; });
  if (it == watched_leases_.end()) return nullptr;
  std::shared_ptr<Qp> taken = std::move(*it);
  watched_leases_.erase(it);
  return taken;
}

void Engine::RunCommands() {
  for (;;) {
    std::vector<Command> batch;
    {
      std::lock_guard lock(command_mutex_);
      if (commands_.empty()) return;
      batch.swap(commands_);
    }
    for (const Command& command : batch) {
      Execute(command);
      // Before the submitter goes on (it may destroy a CQ pushed to).
      CompletionQueue::WakeDeferred();
      {
        std::lock_guard lock(command_mutex_);
        ++completed_ticket_;
      }
      command_cv_.notify_all();
    }
  }
}

void Engine::Execute(const Command& command) {
  Qp& qp = *command.qp;
  switch (command.kind) {
    case CommandKind::kAttach:
      qp.Attach();
      break;
    case CommandKind::kFinalize:
      qp.Finalize(command.flags);
      break;
    case CommandKind::kDetach:
      if (spin_target_ == &qp) spin_target_ = nullptr;
      qp.Detach();
      ForgetWatchedLease(qp);
      Unregister(qp.qp_num());
      break;
    case CommandKind::kFlushReceives:
      qp.FlushReceives();
      break;
    case CommandKind::kKickTx:
      qp.KickTx();
      break;
  }
}

}  // namespace siwx::engine
