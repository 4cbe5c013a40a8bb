// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/transport/tcp_stream.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/trace/stream_trace.h"

namespace siwx::transport {
namespace {

IoResult FromSyscall(ssize_t n, bool reading) {
  if (n > 0) return {IoStatus::kOk, static_cast<std::size_t>(n), 0};
  if (n == 0) return reading ? IoResult{IoStatus::kClosed, 0, 0} : IoResult{};
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
    return {IoStatus::kWouldBlock, 0, 0};
  }
  return {IoStatus::kError, 0, errno};
}

std::uint32_t EpollMask(bool want_read, bool want_write) {
  std::uint32_t mask = 0;
  if (want_read) mask |= EPOLLIN | EPOLLRDHUP;
  if (want_write) mask |= EPOLLOUT;
  return mask;
}

}  // namespace

TcpStream::TcpStream(int fd) : fd_(fd) {
  const int flags = fcntl(fd_, F_GETFL);
  if (flags >= 0) fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  // Fails harmlessly (ENOTSUP/EOPNOTSUPP) on a socketpair.
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (trace::Tracer* tracer = trace::Tracer::Global()) trace_ = tracer->ConnectionOf(fd_);
}

TcpStream::~TcpStream() {
  if (trace_ != nullptr) trace::Tracer::Global()->Forget(*trace_);
  if (fd_ >= 0) close(fd_);
}

IoResult TcpStream::Read(MutableByteSpan into) {
  const IoResult r = FromSyscall(recv(fd_, into.data(), into.size(), MSG_DONTWAIT), true);
  if (trace_ != nullptr && r.bytes > 0) {
    trace::Tracer::Global()->Record(*trace_, trace::Direction::kReceived,
                                    ByteSpan(into.data(), r.bytes));
  }
  return r;
}

IoResult TcpStream::ReadV(std::span<const iovec> into) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(into.data());
  msg.msg_iovlen = into.size();
  const IoResult r = FromSyscall(recvmsg(fd_, &msg, MSG_DONTWAIT), true);
  if (trace_ != nullptr && r.bytes > 0) {
    trace::Tracer::Global()->Record(*trace_, trace::Direction::kReceived, into, r.bytes);
  }
  return r;
}

IoResult TcpStream::WriteV(std::span<const iovec> from) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(from.data());
  msg.msg_iovlen = from.size();
  const IoResult r = FromSyscall(sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL), false);
  if (trace_ != nullptr && r.bytes > 0) {
    trace::Tracer::Global()->Record(*trace_, trace::Direction::kSent, from, r.bytes);
  }
  return r;
}

std::size_t TcpStream::EffectiveMss() const {
  int mss = 0;
  socklen_t len = sizeof(mss);
  if (getsockopt(fd_, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) != 0 || mss <= 0) return 0;
  return static_cast<std::size_t>(mss);
}

void TcpStream::ShutdownWrite() { shutdown(fd_, SHUT_WR); }

void TcpStream::Abort() {
  linger l{1, 0};
  setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd_);
  fd_ = -1;
}

Poller::Poller() : epfd_(epoll_create1(EPOLL_CLOEXEC)) {}
Poller::~Poller() {
  if (epfd_ >= 0) close(epfd_);
}

int Poller::Add(int fd, void* cookie, bool want_read, bool want_write) {
  epoll_event ev{};
  ev.events = EpollMask(want_read, want_write);
  ev.data.ptr = cookie;
  return epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : errno;
}

int Poller::Modify(int fd, void* cookie, bool want_read, bool want_write) {
  epoll_event ev{};
  ev.events = EpollMask(want_read, want_write);
  ev.data.ptr = cookie;
  return epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : errno;
}

int Poller::Remove(int fd) {
  return epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr) == 0 ? 0 : errno;
}

int Poller::Wait(std::span<Event> events, int timeout_ms) {
  constexpr int kMaxBatch = 64;
  epoll_event raw[kMaxBatch];
  const int want = events.size() < kMaxBatch ? static_cast<int>(events.size()) : kMaxBatch;
  const int n = epoll_wait(epfd_, raw, want, timeout_ms);
  if (n <= 0) return 0;
  for (int i = 0; i < n; ++i) {
    events[i].cookie = raw[i].data.ptr;
    events[i].readable = (raw[i].events & EPOLLIN) != 0;
    events[i].writable = (raw[i].events & EPOLLOUT) != 0;
    events[i].hangup = (raw[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0;
  }
  return n;
}

Doorbell::Doorbell() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
Doorbell::~Doorbell() {
  if (fd_ >= 0) close(fd_);
}

void Doorbell::Ring() {
  const std::uint64_t one = 1;
  // A full counter (EAGAIN) already means "rung".
  [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof(one));
}

void Doorbell::Drain() {
  std::uint64_t value;
  [[maybe_unused]] ssize_t n = read(fd_, &value, sizeof(value));
}

}  // namespace siwx::transport
