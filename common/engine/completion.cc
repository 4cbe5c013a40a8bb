// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/completion.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "common/engine/poll_wait_backoff.h"

namespace siwx::engine {

namespace {
// Set while this thread runs a driver's turn: a callback that polls from
// inside it must not drive again (the turn holds locks a driver would take).
thread_local bool tls_driving = false;

std::atomic<std::uint32_t> empty_polls_before_yield{
    CompletionQueue::kDefaultEmptyPollsBeforeYield};
// Empty PollWithProgress calls in a row on this thread (up to the
// threshold), and how many of them yielded.
thread_local std::uint32_t tls_empty_polls = 0;
thread_local std::uint64_t tls_yields = 0;

// Called for every poll that found its CQ empty. An application that
// busy-polls a CQ nothing arrives on (the passive ib_write_bw waits so for
// the end of the test) otherwise keeps a fair share of the CPUs from the
// threads that move the data; on a machine with a core to spare the yield
// returns at once.
void CountEmptyPoll() {
  const std::uint32_t threshold = empty_polls_before_yield.load(std::memory_order_relaxed);
  if (threshold == 0) return;
  if (tls_empty_polls < threshold) {
    ++tls_empty_polls;
    return;
  }
  ++tls_yields;
  sched_yield();
}

// DeferWakesOnThisThread: whether pushes on this thread defer waking the
// CQ's waiting pollers, and the CQs with a wake-up owed.
thread_local bool tls_defer_wakes = false;
thread_local std::vector<CompletionQueue*> tls_deferred_wakes;

// Progress threads of this process whose responder spin is on
// (CompletionQueue::NoteResponderSpin).
std::atomic<int> spinning_responders{0};

// The CQ this thread last polled with progress, by serial: a poll may wait
// only on a thread that polls this CQ and no other (one that polls several
// in turn would hold the others' completions back while it slept on one).
// Not its address: a CQ destroyed and another created at the same address
// would count as polled before.
thread_local std::uint64_t tls_last_polled = 0;
std::atomic<std::uint64_t> next_cq_serial{1};
}  // namespace

void CompletionQueue::NoteResponderSpin(bool spinning) {
  spinning_responders.fetch_add(spinning ? 1 : -1, std::memory_order_relaxed);
}

bool CompletionQueue::AnyResponderSpins() {
  return spinning_responders.load(std::memory_order_relaxed) > 0;
}

void CompletionQueue::SetEmptyPollsBeforeYield(std::uint32_t polls) {
  empty_polls_before_yield.store(polls, std::memory_order_relaxed);
}

std::uint64_t CompletionQueue::YieldsOnThisThread() { return tls_yields; }

std::string_view WcStatusName(WcStatus status) {
  switch (status) {
    case WcStatus::kSuccess: return "success";
    case WcStatus::kLocLenErr: return "local length error";
    case WcStatus::kLocQpOpErr: return "local QP operation error";
    case WcStatus::kLocEecOpErr: return "local EE context operation error";
    case WcStatus::kLocProtErr: return "local protection error";
    case WcStatus::kWrFlushErr: return "work request flushed";
    case WcStatus::kMwBindErr: return "memory window bind error";
    case WcStatus::kBadRespErr: return "bad response error";
    case WcStatus::kLocAccessErr: return "local access error";
    case WcStatus::kRemInvReqErr: return "remote invalid request error";
    case WcStatus::kRemAccessErr: return "remote access error";
    case WcStatus::kRemOpErr: return "remote operation error";
    case WcStatus::kRetryExcErr: return "retry count exceeded";
    case WcStatus::kRnrRetryExcErr: return "RNR retry count exceeded";
    case WcStatus::kLocRddViolErr: return "local RDD violation error";
    case WcStatus::kRemInvRdReqErr: return "remote invalid RD request";
    case WcStatus::kRemAbortErr: return "remote abort error";
    case WcStatus::kInvEecnErr: return "invalid EE context number";
    case WcStatus::kInvEecStateErr: return "invalid EE context state";
    case WcStatus::kFatalErr: return "fatal error";
    case WcStatus::kRespTimeoutErr: return "response timeout error";
    case WcStatus::kGeneralErr: return "general error";
  }
  return "unknown";
}

std::unique_ptr<CompletionQueue> CompletionQueue::Create(std::uint32_t capacity,
                                                         Callbacks callbacks) {
  if (capacity == 0 || capacity > kMaxCapacity) return nullptr;
  return std::unique_ptr<CompletionQueue>(new CompletionQueue(capacity, std::move(callbacks)));
}

CompletionQueue::CompletionQueue(std::uint32_t capacity, Callbacks callbacks)
    : capacity_(capacity),
      serial_(next_cq_serial.fetch_add(1, std::memory_order_relaxed)),
      callbacks_(std::move(callbacks)),
      ring_(capacity) {}

void CompletionQueue::DeferWakesOnThisThread(bool defer) {
  if (!defer) WakeDeferred();
  tls_defer_wakes = defer;
}

void CompletionQueue::WakeDeferred() {
  if (tls_deferred_wakes.empty()) return;
  std::vector<CompletionQueue*> owed;
  owed.swap(tls_deferred_wakes);
  for (CompletionQueue* cq : owed) cq->WakeWaitersIfQueued();
  owed.clear();
  if (tls_deferred_wakes.empty()) tls_deferred_wakes.swap(owed);  // keeps the capacity
}

void CompletionQueue::WakeWaitersIfQueued() {
  // No mutex_: a waiter counts itself in waiters_ under mutex_ before it
  // checks the ring, so a waiter that missed the Push behind this call is
  // counted by now (and one that left meanwhile costs a spare wake-up).
  if (waiters_.load() == 0 || (count_.load() == 0 && !in_error_.load())) return;
  WakeWaiters();
}

bool CompletionQueue::WakeToHelp() {
  // As for a push: a waiter counts itself before it reads wake_seq_, so one
  // that misses this flag is woken by the bump behind it.
  if (waiters_.load() == 0) return false;
  help_wanted_.store(true);
  WakeWaiters();
  return true;
}

void CompletionQueue::WakeWaiters() {
  waiter_wakes_.fetch_add(1, std::memory_order_relaxed);
  wake_seq_.fetch_add(1);
  syscall(SYS_futex, &wake_seq_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

PushStatus CompletionQueue::Push(const WorkCompletion& wc, bool solicited) {
  bool notify = false;
  bool wake_waiters = false;
  bool defer_wake = false;
  bool report_error = false;
  PushStatus status = PushStatus::kOk;
  {
    std::lock_guard lock(mutex_);
    const std::size_t count = count_.load(std::memory_order_relaxed);
    if (in_error_.load(std::memory_order_relaxed)) {
      status = PushStatus::kInError;
    } else if (count == capacity_) {
      in_error_.store(true, std::memory_order_release);
      report_error = true;
      wake_waiters = waiters_ > 0;
      status = PushStatus::kOverflow;
    } else {
      ring_[(head_ + count) % capacity_] = wc;
      count_.store(count + 1, std::memory_order_release);
      // Waiters wait for a non-empty ring: only the first entry wakes them,
      // unless this thread defers the wake-up (then the kWakeBatch-th does).
      if (waiters_ > 0) {
        if (!tls_defer_wakes) {
          wake_waiters = count == 0;
        } else if (count + 1 >= kWakeBatch) {
          wake_waiters = count + 1 == kWakeBatch;
        } else {
          defer_wake = count == 0;
        }
      }
      const bool counts_as_solicited = solicited || wc.status != WcStatus::kSuccess;
      if (arm_ == CqArm::kNextCompletion ||
          (arm_ == CqArm::kSolicited && counts_as_solicited)) {
        arm_ = CqArm::kNone;  // one notification per arm
        armed_.store(false, std::memory_order_relaxed);
        notify = true;
      }
    }
  }
  // Outside the lock: the callbacks may poll or re-arm.
  if (defer_wake &&
      std::find(tls_deferred_wakes.begin(), tls_deferred_wakes.end(), this) ==
          tls_deferred_wakes.end()) {
    tls_deferred_wakes.push_back(this);
  }
  if (wake_waiters) WakeWaiters();
  // A callback may block (or destroy a CQ): nothing stays owed across it.
  if ((report_error && callbacks_.on_async_event) || (notify && callbacks_.on_completion)) {
    WakeDeferred();
  }
  if (report_error && callbacks_.on_async_event) callbacks_.on_async_event(CqEvent::kCqError);
  if (notify && callbacks_.on_completion) callbacks_.on_completion();
  return status;
}

std::size_t CompletionQueue::Poll(std::span<WorkCompletion> out) {
  polls_.fetch_add(1, std::memory_order_relaxed);
  if (tx_owed_.load(std::memory_order_relaxed)) FlushOwedTx();
  // Lock-free fast path: a Push racing with this load is simply ordered after
  // this Poll, which is what a caller polling an empty CQ can observe anyway.
  if (out.empty() || count_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard lock(mutex_);
  const std::size_t count = count_.load(std::memory_order_relaxed);
  const std::size_t n = std::min(out.size(), count);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = ring_[head_];
    head_ = (head_ + 1) % capacity_;
  }
  count_.store(count - n, std::memory_order_release);
  return n;
}

std::size_t CompletionQueue::RemoveQp(std::uint32_t qp_num, QpEntries which) {
  std::lock_guard lock(mutex_);
  const std::size_t count = count_.load(std::memory_order_relaxed);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const WorkCompletion& wc = ring_[(head_ + i) % capacity_];
    const bool is_receive = (static_cast<std::uint32_t>(wc.opcode) &
                             static_cast<std::uint32_t>(WcOpcode::kRecv)) != 0;
    const bool remove =
        wc.qp_num == qp_num && (which == QpEntries::kAll || !is_receive);
    if (remove) continue;
    // Compacts toward the head; kept <= i, so no entry is overwritten unread.
    if (kept != i) ring_[(head_ + kept) % capacity_] = wc;
    ++kept;
  }
  count_.store(kept, std::memory_order_release);
  return count - kept;
}

std::size_t CompletionQueue::CountSuccessful(std::uint32_t qp_num) const {
  std::lock_guard lock(mutex_);
  const std::size_t count = count_.load(std::memory_order_relaxed);
  std::size_t found = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const WorkCompletion& wc = ring_[(head_ + i) % capacity_];
    if (wc.qp_num == qp_num && wc.status == WcStatus::kSuccess) ++found;
  }
  return found;
}

std::size_t CompletionQueue::PollWithProgress(std::span<WorkCompletion> out) {
  const bool polls_only_this = tls_last_polled == serial_;
  tls_last_polled = serial_;
  std::size_t n = Poll(out);
  if (n > 0) {
    tls_empty_polls = 0;
    ResetPollWait();
    if (answer_awaited_.load(std::memory_order_relaxed)) AwaitAnswers();
  }
  if (n > 0 || out.empty() || tls_driving) return n;
  // Yield before the drivers' turns, so a thread that gets its CPU back
  // looks at the sockets at once.
  CountEmptyPoll();
  bool may_wait = false;
  bool push_due = false;
  bool input_waited = false;
  {
    std::unique_lock lock(drivers_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || drivers_.empty()) return 0;
    tls_driving = true;
    // A CQ's QPs are its device context's, of one engine: the first asks it.
    const bool helped = drivers_.front()->HelpTransmit();
    // A few drivers per empty poll, round-robin: with many QPs on one CQ a
    // poll that drove them all cost a recvmsg each (docs/performance-notes.md
    // 3.4); the others get the next polls.
    const std::size_t turns = std::min(drivers_.size(), kDriversPerEmptyPoll);
    for (std::size_t i = 0; i < turns; ++i) {
      if (next_driver_ >= drivers_.size()) next_driver_ = 0;
      drivers_[next_driver_++]->DriveFromPoll(*this);
    }
    // Every driver, not only those that had a turn: one that could still
    // make progress on this thread keeps the poll from sleeping.
    may_wait = !helped && poll_wait_.count() > 0 && polls_only_this &&
               count_.load(std::memory_order_acquire) == 0 &&
               std::all_of(drivers_.begin(), drivers_.end(),
                           [this](PollDriver* d) { return d->PollMayWait(*this); });
    push_due = may_wait && std::any_of(drivers_.begin(), drivers_.end(),
                                       [](PollDriver* d) { return d->PollPushDue(); });
    // A single driver whose input this thread reads itself sleeps on that
    // input, not on a push from the progress thread, which does not read
    // it (docs/performance-notes.md 3.16); then it reads at once. Under
    // drivers_mutex_, so RemoveDriver waits for the sleep (at most one
    // wait's length) and the driver outlives it.
    if (may_wait && drivers_.size() == 1 &&
        drivers_.front()->WaitForInput(*this, PollWaitLength(push_due))) {
      input_waits_.fetch_add(1, std::memory_order_relaxed);
      input_waited = true;
      drivers_.front()->DriveFromPoll(*this);
    }
    tls_driving = false;
  }
  if (input_waited) {
    tls_empty_polls = 0;  // it slept: no yield on the next empty poll
    ResetPollWait();
  } else if (may_wait) {
    WaitForPush(push_due);
  } else {
    ResetPollWait();  // this thread could still make progress: it polls again soon
  }
  n = Poll(out);
  if (n > 0) {
    tls_empty_polls = 0;
    ResetPollWait();
  }
  return n;
}

void CompletionQueue::FlushOwedTx() {
  // Not from inside a driver's turn (a callback): the next poll does it.
  if (tls_driving) return;
  std::unique_lock lock(drivers_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread drives; it or the next poll flushes
  if (!tx_owed_.exchange(false, std::memory_order_acq_rel)) return;
  tls_driving = true;
  for (PollDriver* driver : drivers_) driver->FlushOwedTx();
  tls_driving = false;
}

void CompletionQueue::AwaitAnswers() {
  if (tls_driving) return;  // a callback inside a driver's turn
  std::unique_lock lock(drivers_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread drives
  if (!answer_awaited_.exchange(false, std::memory_order_acq_rel)) return;
  tls_driving = true;
  for (PollDriver* driver : drivers_) driver->AwaitAnswer(*this);
  tls_driving = false;
}

void CompletionQueue::ResetPollWait() {
  // A load first: the common case (nothing to reset) writes nothing shared.
  if (next_poll_wait_us_.load(std::memory_order_relaxed) != poll_wait_.count()) {
    next_poll_wait_us_.store(poll_wait_.count(), std::memory_order_relaxed);
  }
}

std::chrono::microseconds CompletionQueue::PollWaitLength(bool push_due) const {
  const auto backoff = next_poll_wait();
  return push_due ? std::max(backoff, kPollWaitForDuePush) : backoff;
}

void CompletionQueue::WaitForPush(bool push_due) {
  // The backoff's length, or longer when a push is known to be coming; the
  // backoff grows from its own length (a long wait that ran out says no
  // more about the next than a short one).
  const auto backoff = next_poll_wait();
  const auto wait = PollWaitLength(push_due);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::uint32_t seq = 0;
  {
    std::lock_guard lock(mutex_);
    if (count_.load(std::memory_order_relaxed) > 0 || in_error_.load(std::memory_order_relaxed)) {
      return;
    }
    // Push reads waiters_ under mutex_ after storing, so an entry pushed
    // after the check above finds this waiter counted and wakes it, after
    // bumping wake_seq_ past `seq`.
    waiters_.fetch_add(1);
    seq = wake_seq_.load();
  }
  poll_waits_.fetch_add(1, std::memory_order_relaxed);
  if (push_due) long_poll_waits_.fetch_add(1, std::memory_order_relaxed);
  bool pushed = false;
  for (;;) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) break;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec timeout{};
    timeout.tv_sec = static_cast<time_t>(ns / 1000000000);
    timeout.tv_nsec = static_cast<long>(ns % 1000000000);
    // Returns at once (EAGAIN) when a wake-up bumped wake_seq_ already.
    syscall(SYS_futex, &wake_seq_, FUTEX_WAIT_PRIVATE, seq, &timeout, nullptr, 0);
    // The next sequence number first, then the ring: a wake-up for an entry
    // this check misses changes the word after this load.
    seq = wake_seq_.load();
    if (count_.load() > 0 || in_error_.load()) {
      pushed = true;
      break;
    }
    if (help_wanted_.exchange(false)) {
      pushed = true;  // activity: the poll returns and helps
      break;
    }
  }
  waiters_.fetch_sub(1);
  if (!pushed) poll_wait_timeouts_.fetch_add(1, std::memory_order_relaxed);
  next_poll_wait_us_.store(
      NextPollWait(poll_wait_, backoff,
                   pushed ? PollWaitOutcome::kActivity : PollWaitOutcome::kRanOut,
                   AnyResponderSpins())
          .count(),
      std::memory_order_relaxed);
}

void CompletionQueue::AddDriver(PollDriver* driver) {
  std::lock_guard lock(drivers_mutex_);
  if (std::find(drivers_.begin(), drivers_.end(), driver) == drivers_.end()) {
    drivers_.push_back(driver);
  }
  driver_count_.store(drivers_.size(), std::memory_order_relaxed);
}

void CompletionQueue::RemoveDriver(PollDriver* driver) {
  std::lock_guard lock(drivers_mutex_);
  drivers_.erase(std::remove(drivers_.begin(), drivers_.end(), driver), drivers_.end());
  driver_count_.store(drivers_.size(), std::memory_order_relaxed);
}

void CompletionQueue::Arm(CqArm arm) {
  {
    std::lock_guard lock(mutex_);
    if (arm == CqArm::kNone || arm > arm_) arm_ = arm;  // widen, never narrow
    armed_.store(arm_ != CqArm::kNone, std::memory_order_relaxed);
  }
  // A callback inside a driver's turn may hold drivers_mutex_ already (on
  // this thread): it skips, and a lease it does not return ends by itself
  // (kReadLease, read_lease.h).
  if (arm == CqArm::kNone || tls_driving) return;
  std::lock_guard lock(drivers_mutex_);
  for (PollDriver* driver : drivers_) driver->OnCqArmed(*this);
}

CqArm CompletionQueue::arm() const {
  std::lock_guard lock(mutex_);
  return arm_;
}

}  // namespace siwx::engine
