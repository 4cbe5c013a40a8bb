// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/transport/tcp_stream.h"

#include "common/transport/socket_ops.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <functional>
#include <string_view>

#include "common/trace/stream_trace.h"
#include "common/util/sanitizers.h"

#ifdef SIWX_TSAN
#include <sanitizer/tsan_interface.h>
#include <sys/syscall.h>
// Exported by the TSan runtime (its instrumentation calls it); not in the
// public header.
extern "C" void __tsan_read_range(void* addr, unsigned long size);
#endif

namespace siwx::transport {
namespace {

#ifdef SIWX_TSAN
// ThreadSanitizer cannot see that the kernel carries octets from one
// socket's sendmsg to its peer's recv, so with both ends of a connection in
// one process it takes what the protocol orders through the wire for a
// race: memory written before a Read was posted at one end and framed into
// the Read Response by a thread of the other, or the Read source written
// again once the Read completed while TSan still has the responder's
// sendmsg reading it. Under TSan, a stream releases the sync point of (its
// address, its peer's) before it sends and acquires the point of (its
// peer's, its own) after it reads octets; both ends name a direction alike.
// Coarser than the wire (a read acquires every send so far, and distinct
// connections may share a point), never finer.
void* WireSyncPoint(const sockaddr_storage& from, socklen_t from_length,
                    const sockaddr_storage& to, socklen_t to_length) {
  static char points[4096];
  const auto bytes = [](const sockaddr_storage& a, socklen_t n) {
    return std::string_view(reinterpret_cast<const char*>(&a), n);
  };
  const std::size_t h = std::hash<std::string_view>{}(bytes(from, from_length)) * 31 +
                        std::hash<std::string_view>{}(bytes(to, to_length));
  return &points[h % sizeof(points)];
}

// TSan's sendmsg interceptor notes the octets as read on entry, after any
// release made before the call; a peer that got them could then write the
// source again (the Read completed) unordered with that read. So the reads
// are noted here, then the release, then the system call itself, which the
// interceptor does not see (a partial send notes more reads than it made:
// the rest is read by a later send, before any completion frees it).
ssize_t SendAfterRelease(int fd, const msghdr& msg, int flags, void* point) {
  for (std::size_t i = 0; i < msg.msg_iovlen; ++i) {
    __tsan_read_range(msg.msg_iov[i].iov_base, msg.msg_iov[i].iov_len);
  }
  __tsan_release(point);
  return syscall(SYS_sendmsg, fd, &msg, flags);
}
#endif

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
#ifdef SIWX_TSAN
  sockaddr_storage local{}, peer{};
  socklen_t local_length = sizeof(local), peer_length = sizeof(peer);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &local_length) == 0 &&
      getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &peer_length) == 0) {
    sent_point_ = WireSyncPoint(local, local_length, peer, peer_length);
    received_point_ = WireSyncPoint(peer, peer_length, local, local_length);
  }
#endif
}

TcpStream::~TcpStream() {
  if (trace_ != nullptr) trace::Tracer::Global()->Forget(*trace_);
  if (fd_ >= 0) close(fd_);
}

IoResult TcpStream::Read(MutableByteSpan into) {
  const IoResult r = FromSyscall(recv(fd_, into.data(), into.size(), MSG_DONTWAIT), true);
#ifdef SIWX_TSAN
  if (received_point_ != nullptr && r.bytes > 0) __tsan_acquire(received_point_);
#endif
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
#ifdef SIWX_TSAN
  if (received_point_ != nullptr && r.bytes > 0) __tsan_acquire(received_point_);
#endif
  if (trace_ != nullptr && r.bytes > 0) {
    trace::Tracer::Global()->Record(*trace_, trace::Direction::kReceived, into, r.bytes);
  }
  return r;
}

IoResult TcpStream::WriteV(std::span<const iovec> from) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(from.data());
  msg.msg_iovlen = from.size();
  constexpr int kFlags = MSG_DONTWAIT | MSG_NOSIGNAL;
#ifdef SIWX_TSAN
  const IoResult r = FromSyscall(sent_point_ != nullptr
                                     ? SendAfterRelease(fd_, msg, kFlags, sent_point_)
                                     : sendmsg(fd_, &msg, kFlags),
                                 false);
#else
  const IoResult r = FromSyscall(sendmsg(fd_, &msg, kFlags), false);
#endif
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

int TcpStream::SetUnsentLimit(std::size_t octets) {
  const int value = static_cast<int>(std::min<std::size_t>(octets, INT_MAX));
  return setsockopt(fd_, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &value, sizeof(value)) == 0 ? 0 : errno;
}

void TcpStream::Abort() {
  linger l{1, 0};
  setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd_);
  fd_ = -1;
}

Poller::Poller() : epfd_(epoll_create1(EPOLL_CLOEXEC)) {
  if (epfd_ < 0) error_ = errno != 0 ? errno : EMFILE;
}

Poller::~Poller() {
  if (epfd_ >= 0) close(epfd_);
}

int Poller::Control(int op, int fd, std::uint32_t epoll_events, std::uint64_t cookie) {
  epoll_event ev{};
  ev.events = epoll_events;
  ev.data.u64 = cookie;
  return epoll_ctl(epfd_, op, fd, op == EPOLL_CTL_DEL ? nullptr : &ev) == 0 ? 0 : errno;
}

int Poller::Add(int fd, void* cookie, bool want_read, bool want_write) {
  return Control(EPOLL_CTL_ADD, fd, EpollMask(want_read, want_write),
                 reinterpret_cast<std::uintptr_t>(cookie));
}

int Poller::Modify(int fd, void* cookie, bool want_read, bool want_write) {
  return Control(EPOLL_CTL_MOD, fd, EpollMask(want_read, want_write),
                 reinterpret_cast<std::uintptr_t>(cookie));
}

int Poller::Remove(int fd) { return Control(EPOLL_CTL_DEL, fd, 0, 0); }

int Poller::Update(int fd, std::uint32_t interest, std::uint64_t cookie, bool* registered) {
  if (interest == 0) {
    if (!*registered) return 0;
    *registered = false;
    return Remove(fd);
  }
  std::uint32_t mask = 0;
  if ((interest & kWantRead) != 0) mask |= EPOLLIN;
  if ((interest & kWantWrite) != 0) mask |= EPOLLOUT;
  if ((interest & kWantHangup) != 0) mask |= EPOLLRDHUP;
  const int rc = Control(*registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, mask, cookie);
  if (rc == 0) *registered = true;
  return rc;
}

int Poller::Wait(std::span<Event> events, int timeout_ms) {
  constexpr int kMaxBatch = 64;
  epoll_event raw[kMaxBatch];
  const int want = events.size() < kMaxBatch ? static_cast<int>(events.size()) : kMaxBatch;
  const int n = epoll_wait(epfd_, raw, want, timeout_ms);
  if (n <= 0) return 0;
  for (int i = 0; i < n; ++i) {
    events[i].cookie = raw[i].data.u64;
    events[i].readable = (raw[i].events & EPOLLIN) != 0;
    events[i].writable = (raw[i].events & EPOLLOUT) != 0;
    events[i].hangup = (raw[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0;
  }
  return n;
}

Doorbell::Doorbell() { error_ = CreateEventFd(/*nonblocking=*/true, &fd_); }

Doorbell::~Doorbell() { Close(fd_); }

void Doorbell::Ring() {
  // A full counter (EAGAIN) already means "rung".
  SignalEventFd(fd_);
}

void Doorbell::Drain() { DrainEventFd(fd_); }

Alarm::Alarm() { error_ = CreateTimerFd(&fd_); }

Alarm::~Alarm() { Close(fd_); }

int Alarm::ArmAt(std::chrono::steady_clock::time_point at) { return ArmTimerFdAt(fd_, at); }

void Alarm::Drain() { DrainEventFd(fd_); }

}  // namespace siwx::transport
