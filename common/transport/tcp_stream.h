// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The only place in siwx that makes socket system calls.
//
// TcpStream wraps one connected, non-blocking stream socket (TCP, or a
// socketpair in tests) with readv/sendmsg calls that never block and never
// raise SIGPIPE. Poller is the one epoll wrapper (the engine's progress
// thread and the CM thread use it), Doorbell an eventfd that lets other
// threads wake a polling thread, and Alarm a timerfd they can re-arm.
// socket_ops.h has the other socket calls. None of them know about MPA or
// RDMA.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/util/bytes.h"

namespace siwx::trace {
class Connection;
}

namespace siwx::transport {

enum class IoStatus : std::uint8_t {
  kOk,          // `bytes` octets moved (may be fewer than asked)
  kWouldBlock,  // nothing moved; wait for readiness
  kClosed,      // orderly close by the peer (read side only)
  kError,       // `error` holds the errno (ECONNRESET, EPIPE, ...)
};

struct IoResult {
  IoStatus status = IoStatus::kOk;
  std::size_t bytes = 0;
  int error = 0;
};

class TcpStream {
 public:
  // Takes ownership of a connected socket; makes it non-blocking and, for
  // TCP, turns Nagle off (FPDUs are already sized; small ones must not wait).
  explicit TcpStream(int fd);
  ~TcpStream();
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;

  IoResult Read(MutableByteSpan into);
  IoResult ReadV(std::span<const iovec> into);
  IoResult WriteV(std::span<const iovec> from);

  // Effective MSS of the connection (TCP_MAXSEG), or 0 when the socket is not
  // TCP; MULPDU is derived from it.
  std::size_t EffectiveMss() const;
  // Sends FIN after queued data; reads continue.
  void ShutdownWrite();
  // Closes with RST instead of FIN (SO_LINGER 0): the abortive close of
  // RFC 5040 for a stream in error.
  void Abort();
  // How many octets the socket may hold that were not sent yet before a
  // write finds it full (TCP_NOTSENT_LOWAT); 0: the system's default (no
  // limit unless net.ipv4.tcp_notsent_lowat says otherwise). Returns 0 or
  // an errno value (a socket that is not TCP has no such limit).
  int SetUnsentLimit(std::size_t octets);

  int fd() const { return fd_; }

 private:
  int fd_;
  // ThreadSanitizer builds only (null elsewhere): the sync points of the
  // two directions of this connection, see WireSyncPoint in tcp_stream.cc.
  void* sent_point_ = nullptr;
  void* received_point_ = nullptr;
  // SIWX_TRACE: this stream's trace, or null (the common case: one branch
  // per call).
  std::shared_ptr<trace::Connection> trace_;
};

// Interest bits of Poller::Update.
inline constexpr std::uint32_t kWantRead = 1u << 0;
inline constexpr std::uint32_t kWantWrite = 1u << 1;
inline constexpr std::uint32_t kWantHangup = 1u << 2;  // peer FIN (EPOLLRDHUP)

// Level-triggered, close-on-exec epoll set. `cookie` comes back with each
// ready event: a pointer (the engine's QPs) or a number (the CM's ids).
class Poller {
 public:
  Poller();
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  struct Event {
    std::uint64_t cookie;
    bool readable;
    bool writable;
    bool hangup;  // EPOLLHUP/EPOLLERR/EPOLLRDHUP

    void* ptr() const { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(cookie)); }
  };

  // 0, or the errno epoll_create1 failed with (then every call fails).
  int error() const { return error_; }
  // The epoll fd.
  int fd() const { return epfd_; }

  // Returns 0 or an errno. want_read includes the peer's FIN.
  int Add(int fd, void* cookie, bool want_read, bool want_write);
  int Modify(int fd, void* cookie, bool want_read, bool want_write);
  int Remove(int fd);
  // Adds, modifies or (interest 0) removes `fd` with kWant* bits;
  // `registered` says which of those applies and is kept up to date.
  int Update(int fd, std::uint32_t interest, std::uint64_t cookie, bool* registered);
  // Waits up to timeout_ms (-1 forever); returns the number of events filled
  // (0 on timeout or EINTR).
  int Wait(std::span<Event> events, int timeout_ms);

 private:
  int Control(int op, int fd, std::uint32_t epoll_events, std::uint64_t cookie);

  int epfd_;
  int error_ = 0;
};

// A non-blocking eventfd: other threads Ring() it, a polling thread sees it
// readable and Drain()s it. Built on the eventfd calls of socket_ops.h.
class Doorbell {
 public:
  Doorbell();
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // 0, or the errno eventfd failed with.
  int error() const { return error_; }
  void Ring();
  void Drain();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int error_ = 0;
};

// A non-blocking timerfd that a polling thread waits on in its Poller: any
// thread re-arms it (without waking the poller unless the new time has
// passed), the polling thread sees it readable when it expires and
// Drain()s it. Built on the timerfd calls of socket_ops.h.
class Alarm {
 public:
  Alarm();
  ~Alarm();
  Alarm(const Alarm&) = delete;
  Alarm& operator=(const Alarm&) = delete;

  // 0, or the errno timerfd_create failed with.
  int error() const { return error_; }
  // Expires once at `at` (steady_clock), or never at time_point::max();
  // forgets an expiry not yet drained. 0 or an errno.
  int ArmAt(std::chrono::steady_clock::time_point at);
  void Drain();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int error_ = 0;
};

}  // namespace siwx::transport
