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
    : kind_(kind), caps_(caps), on_limit_(std::move(on_limit)), ring_(caps.max_wr) {}

PostStatus ReceiveQueue::Post(const ReceiveWorkRequest& wr) {
  const PostStatus valid = ValidateReceiveWorkRequest(wr, caps_);
  if (valid != PostStatus::kOk) return valid;
  std::lock_guard lock(mutex_);
  return ring_.Push(wr) ? PostStatus::kOk : PostStatus::kQueueFull;
}

std::optional<ReceiveWorkRequest> ReceiveQueue::Take() {
  std::optional<ReceiveWorkRequest> wr;
  bool limit_reached = false;
  {
    std::lock_guard lock(mutex_);
    wr = ring_.Pop();
    if (wr && limit_ != 0 && ring_.size() < limit_) {
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
  flushed.reserve(ring_.size());
  while (std::optional<ReceiveWorkRequest> wr = ring_.Pop()) flushed.push_back(*wr);
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
  return ring_.size();
}

}  // namespace siwx::engine
