// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "providers/siwx/event_queue.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace siwx::provider {
namespace {

enum class SendResult { kSent, kFull, kFailed };

SendResult SendRecord(int fd, const std::uint8_t* data, std::size_t size) {
  for (;;) {
    ssize_t n = ::send(fd, data, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(size)) return SendResult::kSent;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
      return SendResult::kFull;
    }
    return SendResult::kFailed;  // the reader end is gone: nobody will read it
  }
}

}  // namespace

std::unique_ptr<EventQueue> EventQueue::Create(std::size_t record_size) {
  if (record_size == 0 || record_size > kMaxRecordSize) {
    errno = EINVAL;
    return nullptr;
  }
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return nullptr;
  // The write end is never read; shutting its receive side keeps a stray
  // write on the read end from queueing anything.
  ::shutdown(fds[1], SHUT_RD);
  return std::unique_ptr<EventQueue>(new EventQueue(record_size, fds[0], fds[1]));
}

EventQueue::EventQueue(std::size_t record_size, int read_fd, int write_fd)
    : record_size_(record_size), read_fd_(read_fd), write_fd_(write_fd) {}

EventQueue::~EventQueue() {
  ::close(write_fd_);
  if (owns_read_fd_) ::close(read_fd_);
}

bool EventQueue::Post(ByteSpan record) {
  if (record.size() != record_size_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (backlog_.empty()) {
    switch (SendRecord(write_fd_, record.data(), record.size())) {
      case SendResult::kSent:
        return true;
      case SendResult::kFailed:
        return false;
      case SendResult::kFull:
        break;
    }
  }
  backlog_.emplace_back(record.begin(), record.end());
  return true;
}

void EventQueue::OnConsumed() {
  std::lock_guard<std::mutex> lock(mutex_);
  FlushLocked();
}

void EventQueue::FlushLocked() {
  while (!backlog_.empty()) {
    const std::vector<std::uint8_t>& front = backlog_.front();
    SendResult result = SendRecord(write_fd_, front.data(), front.size());
    if (result == SendResult::kFull) return;
    // kFailed: the reader is gone; drop the record rather than spin on it.
    backlog_.pop_front();
  }
}

std::size_t EventQueue::Purge(const std::function<bool(ByteSpan)>& match) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Everything in the socket is older than everything in the backlog.
  std::deque<std::vector<std::uint8_t>> unread;
  std::uint8_t buffer[kMaxRecordSize];
  for (;;) {
    ssize_t n = ::recv(read_fd_, buffer, record_size_, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // empty (EAGAIN) or closed
    if (static_cast<std::size_t>(n) != record_size_) continue;  // never written by us
    unread.emplace_back(buffer, buffer + n);
  }
  for (auto& record : backlog_) unread.push_back(std::move(record));
  backlog_.clear();

  std::size_t removed = 0;
  for (auto& record : unread) {
    if (match(ByteSpan(record.data(), record.size()))) {
      ++removed;
    } else {
      backlog_.push_back(std::move(record));
    }
  }
  FlushLocked();
  return removed;
}

std::size_t EventQueue::backlog_size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backlog_.size();
}

}  // namespace siwx::provider
