// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Event records delivered through a file descriptor, the way the kernel's
// uverbs event files deliver them, so stock libibverbs can read them:
//  - a completion channel's fd carries 8-byte records, the ibv_cq pointer of
//    a CQ whose armed notification fired (ibv_get_cq_event reads exactly
//    sizeof(struct ib_uverbs_comp_event_desc) = 8 and casts it back);
//  - a context's async_fd carries 16-byte records {element, event_type,
//    reserved} (struct ib_uverbs_async_event_desc, read by
//    ibv_get_async_event).
//
// The fd is one end of an AF_UNIX SOCK_SEQPACKET socketpair: one record per
// packet, pollable, and the application may make it non-blocking (libfabric
// does; ibv_get_cq_event then fails with EAGAIN when nothing is pending). A
// pipe would do for delivery, but only a socket lets Purge() take records
// back out with MSG_DONTWAIT without touching the O_NONBLOCK flag the
// application's reader shares.
//
// Backlog: a socket buffer holds only a few hundred small packets. A record
// that does not fit waits in a FIFO in memory and is moved into the socket
// when the application has consumed one (OnConsumed, called from the
// provider's cq_event/async_event ops, which libibverbs runs after every
// successful read). Records are never dropped and keep their order.
//
// Purge: destroying a CQ or SRQ must remove its events that were not read
// yet (the kernel drops them from its event file; a stale pointer read later
// would be a use after free). Purge drains the socket, keeps the records that
// do not match, writes them back in order, and returns how many it removed.
// A record the application read concurrently is not removed: it counts as
// delivered and the destroy then waits for its acknowledgement, which is the
// libibverbs contract (ibv_get_cq_event(3): "destroying a CQ will wait for
// all completion events to be acknowledged").
//
// Threading: Post from any thread (engine callbacks); Purge and OnConsumed
// from application threads. `mutex_` serialises all writers and purgers. The
// application's reader needs no lock: each read of one record size takes
// exactly one packet.
//
// No rdma-core types here; records are opaque bytes of a fixed size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/util/bytes.h"

namespace siwx::provider {

class EventQueue {
 public:
  static constexpr std::size_t kMaxRecordSize = 64;

  // nullptr with errno set (EINVAL for a bad size, or socketpair's errno).
  static std::unique_ptr<EventQueue> Create(std::size_t record_size);

  ~EventQueue();
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  // The fd the application reads.
  int read_fd() const { return read_fd_; }
  // From now on someone else closes the read end (libibverbs closes
  // ctx->async_fd in verbs_uninit_context). The queue still reads it in
  // Purge, so it must be destroyed before that close.
  void ReleaseReadFd() { owns_read_fd_ = false; }

  // Queues one record of record_size() octets (others are ignored, false).
  bool Post(ByteSpan record);
  // The application consumed a record: move backlog into the socket.
  void OnConsumed();
  // Removes every unread record for which `match` is true; returns how many.
  std::size_t Purge(const std::function<bool(ByteSpan)>& match);

  std::size_t record_size() const { return record_size_; }
  // Records waiting in memory because the socket was full (for tests).
  std::size_t backlog_size() const;

 private:
  EventQueue(std::size_t record_size, int read_fd, int write_fd);
  // Moves backlog records into the socket until it is full. Needs mutex_.
  void FlushLocked();

  const std::size_t record_size_;
  const int read_fd_;
  const int write_fd_;
  bool owns_read_fd_ = true;

  mutable std::mutex mutex_;
  std::deque<std::vector<std::uint8_t>> backlog_;  // guarded by mutex_
};

}  // namespace siwx::provider
