// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/receive_queue.h"

#include <utility>

namespace siwx::engine {

std::unique_ptr<ReceiveQueue> ReceiveQueue::Create(Kind kind, const QueueCaps& caps,
                                                   LimitCallback on_limit) {
  if (!CapsSupported(caps) || caps.max_inline_data != 0) return nullptr;
  return std::unique_ptr<ReceiveQueue>(new ReceiveQueue(kind, caps, std::move(on_limit)));
}

ReceiveQueue::ReceiveQueue(Kind kind, const QueueCaps& caps, LimitCallback on_limit)
    : kind_(kind),
      caps_(caps),
      on_limit_(std::move(on_limit)),
      slots_(caps.max_wr, std::size_t{caps.max_sge} * sizeof(Sge)) {}

PostStatus ReceiveQueue::Post(const ReceiveWorkRequest& wr) {
  const PostStatus valid = ValidateReceiveWorkRequest(wr, caps_);
  if (valid != PostStatus::kOk) return valid;
  std::lock_guard lock(mutex_);
  if (count_ == slots_.size()) return PostStatus::kQueueFull;
  slots_[(head_ + count_) % slots_.size()].Assign(wr);
  ++count_;
  return PostStatus::kOk;
}

bool ReceiveQueue::PopLocked(ReceiveWorkRequest& out) {
  if (count_ == 0) return false;
  slots_[head_].CopyTo(out);
  head_ = static_cast<std::uint32_t>((head_ + 1) % slots_.size());
  --count_;
  return true;
}

std::optional<ReceiveWorkRequest> ReceiveQueue::Take() {
  std::optional<ReceiveWorkRequest> wr;
  bool limit_reached = false;
  {
    std::lock_guard lock(mutex_);
    if (count_ == 0) return wr;
    wr.emplace();
    PopLocked(*wr);
    if (limit_ != 0 && count_ < limit_) {
      limit_ = 0;  // one event per arm
      limit_reached = true;
    }
  }
  if (limit_reached && on_limit_) on_limit_();
  return wr;
}

std::vector<ReceiveWorkRequest> ReceiveQueue::Flush() {
  std::vector<ReceiveWorkRequest> flushed;
  std::lock_guard lock(mutex_);
  flushed.resize(count_);
  for (ReceiveWorkRequest& wr : flushed) PopLocked(wr);
  return flushed;
}

SrqLimitStatus ReceiveQueue::SetLimit(std::uint32_t limit) {
  if (kind_ != Kind::kShared) return SrqLimitStatus::kNotShared;
  if (limit > caps_.max_wr) return SrqLimitStatus::kInvalidLimit;
  std::lock_guard lock(mutex_);
  limit_ = limit;
  return SrqLimitStatus::kOk;
}

std::uint32_t ReceiveQueue::limit() const {
  std::lock_guard lock(mutex_);
  return limit_;
}

std::uint32_t ReceiveQueue::size() const {
  std::lock_guard lock(mutex_);
  return count_;
}

}  // namespace siwx::engine
