// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/completion.h"

#include <algorithm>
#include <utility>

namespace siwx::engine {

namespace {
// Set while this thread runs a driver's turn: a callback that polls from
// inside it must not drive again (the turn holds locks a driver would take).
thread_local bool tls_driving = false;
}  // namespace

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
    : capacity_(capacity), callbacks_(std::move(callbacks)), ring_(capacity) {}

PushStatus CompletionQueue::Push(const WorkCompletion& wc, bool solicited) {
  bool notify = false;
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
      status = PushStatus::kOverflow;
    } else {
      ring_[(head_ + count) % capacity_] = wc;
      count_.store(count + 1, std::memory_order_release);
      const bool counts_as_solicited = solicited || wc.status != WcStatus::kSuccess;
      if (arm_ == CqArm::kNextCompletion ||
          (arm_ == CqArm::kSolicited && counts_as_solicited)) {
        arm_ = CqArm::kNone;  // one notification per arm
        notify = true;
      }
    }
  }
  // Outside the lock: the callbacks may poll or re-arm.
  if (report_error && callbacks_.on_async_event) callbacks_.on_async_event(CqEvent::kCqError);
  if (notify && callbacks_.on_completion) callbacks_.on_completion();
  return status;
}

std::size_t CompletionQueue::Poll(std::span<WorkCompletion> out) {
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
  const std::size_t n = Poll(out);
  if (n > 0 || out.empty() || tls_driving) return n;
  {
    std::unique_lock lock(drivers_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || drivers_.empty()) return 0;
    tls_driving = true;
    // A few drivers per empty poll, round-robin: with many QPs on one CQ a
    // poll that drove them all cost a recvmsg each (docs/performance-notes.md
    // 3.4); the others get the next polls.
    const std::size_t turns = std::min(drivers_.size(), kDriversPerEmptyPoll);
    for (std::size_t i = 0; i < turns; ++i) {
      if (next_driver_ >= drivers_.size()) next_driver_ = 0;
      drivers_[next_driver_++]->DriveFromPoll(*this);
    }
    tls_driving = false;
  }
  return Poll(out);
}

void CompletionQueue::AddDriver(PollDriver* driver) {
  std::lock_guard lock(drivers_mutex_);
  if (std::find(drivers_.begin(), drivers_.end(), driver) == drivers_.end()) {
    drivers_.push_back(driver);
  }
}

void CompletionQueue::RemoveDriver(PollDriver* driver) {
  std::lock_guard lock(drivers_mutex_);
  drivers_.erase(std::remove(drivers_.begin(), drivers_.end(), driver), drivers_.end());
}

void CompletionQueue::Arm(CqArm arm) {
  {
    std::lock_guard lock(mutex_);
    if (arm == CqArm::kNone || arm > arm_) arm_ = arm;  // widen, never narrow
  }
  // A callback inside a driver's turn may hold drivers_mutex_ already (on
  // this thread): it skips, and a lease it does not return ends by itself
  // (Qp::kReadLease).
  if (arm == CqArm::kNone || tls_driving) return;
  std::lock_guard lock(drivers_mutex_);
  for (PollDriver* driver : drivers_) driver->OnCqArmed(*this);
}

CqArm CompletionQueue::arm() const {
  std::lock_guard lock(mutex_);
  return arm_;
}

}  // namespace siwx::engine
