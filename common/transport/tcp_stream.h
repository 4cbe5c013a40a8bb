// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The only place in siwx that makes socket system calls.
//
// TcpStream wraps one connected, non-blocking stream socket (TCP, or a
// socketpair in tests) with readv/sendmsg calls that never block and never
// raise SIGPIPE. Poller is a thin epoll wrapper and Doorbell an eventfd that
// lets application threads wake a progress thread. None of them know about
// MPA or RDMA.
#pragma once

#include <sys/uio.h>

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

  int fd() const { return fd_; }

 private:
  int fd_;
  // SIWX_TRACE: this stream's trace, or null (the common case: one branch
  // per call).
  std::shared_ptr<trace::Connection> trace_;
};

// Level-triggered epoll set. `cookie` comes back with each ready event.
class Poller {
 public:
  Poller();
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  struct Event {
    void* cookie;
    bool readable;
    bool writable;
    bool hangup;  // EPOLLHUP/EPOLLERR/EPOLLRDHUP
  };

  // Returns 0 or an errno.
  int Add(int fd, void* cookie, bool want_read, bool want_write);
  int Modify(int fd, void* cookie, bool want_read, bool want_write);
  int Remove(int fd);
  // Waits up to timeout_ms (-1 forever); returns the number of events filled
  // (0 on timeout or EINTR).
  int Wait(std::span<Event> events, int timeout_ms);

 private:
  int epfd_;
};

// An eventfd: application threads Ring() it, the progress thread polls it.
class Doorbell {
 public:
  Doorbell();
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  void Ring();
  void Drain();
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace siwx::transport
