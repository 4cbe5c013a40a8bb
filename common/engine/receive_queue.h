// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Receive queue of a QP, and shared receive queue (SRQ) with limit events.
//
// Both are a bounded FIFO of receive WRs sized at creation (max_wr), with a
// per-WR SGE limit (max_sge); a WR is stored with room for max_sge SGEs only
// (ReceiveRecord). Applications post; the data path takes
// the oldest WR when an untagged Send message starts (RFC 5041 untagged
// buffers are consumed in order, QN 0, MSN order), and flushes every WR when
// the QP goes to Error so each can complete with WrFlushErr.
//
// SRQ limit (ibv_modify_srq with IBV_SRQ_LIMIT): SetLimit(n) arms the SRQ;
// the first Take that leaves fewer than n WRs posted disarms it and invokes
// the limit callback once (IBV_EVENT_SRQ_LIMIT_REACHED). Arming does not fire
// by itself even if fewer than n WRs are posted at that moment: the event
// comes with the next Take, as on hardware that evaluates the limit when it
// consumes a WR. SetLimit(0) disarms; a limit above max_wr is rejected
// (EINVAL). A QP's own receive queue has no limit.
//
// Threading: Post from application threads, Take and Flush from the progress
// thread, SetLimit from application threads. `mutex_` guards the ring and the
// limit; the limit callback runs on the taking thread after the lock is
// released, so it may post or re-arm.
//
// Not validated here: lkeys and buffer addresses (checked at placement, see
// memory.h) and QP state (the caller asks qp_state.h first). Not supported:
// resizing (IBV_SRQ_MAX_WR).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/engine/work_request.h"

namespace siwx::engine {

enum class SrqLimitStatus : std::uint8_t {
  kOk = 0,
  kInvalidLimit,  // above max_wr
  kNotShared,     // the queue is a QP's own receive queue
};

class ReceiveQueue {
 public:
  enum class Kind : std::uint8_t { kQueuePair, kShared };
  using LimitCallback = std::function<void()>;

  // nullptr if the caps are not supported (CapsSupported; max_inline_data
  // must be 0). `on_limit` is used by kShared queues only.
  static std::unique_ptr<ReceiveQueue> Create(Kind kind, const QueueCaps& caps,
                                              LimitCallback on_limit = {});

  ReceiveQueue(const ReceiveQueue&) = delete;
  ReceiveQueue& operator=(const ReceiveQueue&) = delete;

  // kOk, kTooManySge (EINVAL) or kQueueFull (ENOMEM).
  PostStatus Post(const ReceiveWorkRequest& wr);

  // The oldest posted WR, removed from the queue; nullopt when empty.
  std::optional<ReceiveWorkRequest> Take();

  // Removes every posted WR, oldest first, for flush completions.
  std::vector<ReceiveWorkRequest> Flush();

  // ibv_modify_srq(IBV_SRQ_LIMIT). 0 disarms.
  SrqLimitStatus SetLimit(std::uint32_t limit);
  // The armed limit, 0 when not armed (ibv_query_srq's srq_limit).
  std::uint32_t limit() const;

  Kind kind() const { return kind_; }
  const QueueCaps& caps() const { return caps_; }
  std::uint32_t size() const;

 private:
  ReceiveQueue(Kind kind, const QueueCaps& caps, LimitCallback on_limit);

  const Kind kind_;
  const QueueCaps caps_;
  const LimitCallback on_limit_;

  // Removes the oldest record into `out`; false when empty. mutex_ held.
  bool PopLocked(ReceiveWorkRequest& out);

  mutable std::mutex mutex_;
  // A FIFO of records with max_sge SGEs each (guarded by mutex_).
  RecordSlots<ReceiveRecord> slots_;
  std::uint32_t head_ = 0;   // guarded by mutex_; oldest record
  std::uint32_t count_ = 0;  // guarded by mutex_
  std::uint32_t limit_ = 0;  // guarded by mutex_; 0 = not armed
};

}  // namespace siwx::engine
