// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/transport/socket_ops.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace siwx::transport {
namespace {

int Errno() { return errno != 0 ? errno : EIO; }

// IPv4 127.0.0.0/8 answers on the loopback interface although only
// 127.0.0.1/8 is configured.
bool IsIpv4Loopback(const sockaddr_in& a) { return (ntohl(a.sin_addr.s_addr) >> 24) == 127; }

IoResult FromCount(ssize_t n, bool read_side) {
  IoResult r;
  if (n > 0) {
    r.bytes = static_cast<std::size_t>(n);
    return r;
  }
  if (n == 0 && read_side) {
    r.status = IoStatus::kClosed;
    return r;
  }
  if (n == 0) return r;
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    r.status = IoStatus::kWouldBlock;
    return r;
  }
  r.status = IoStatus::kError;
  r.error = Errno();
  return r;
}

// One non-blocking recv, retried on EINTR.
IoResult RecvOnce(int fd, void* into, std::size_t len, int flags) {
  ssize_t n;
  do {
    n = recv(fd, into, len, flags | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return FromCount(n, true);
}

}  // namespace

std::optional<SockAddr> SockAddr::From(const sockaddr* addr) {
  if (addr == nullptr) return std::nullopt;
  SockAddr s;
  if (addr->sa_family == AF_INET) {
    s.len = sizeof(sockaddr_in);
  } else if (addr->sa_family == AF_INET6) {
    s.len = sizeof(sockaddr_in6);
  } else {
    return std::nullopt;
  }
  std::memcpy(&s.storage, addr, s.len);
  return s;
}

SockAddr SockAddr::Wildcard(int family) {
  SockAddr s;
  s.storage.ss_family = static_cast<sa_family_t>(family);
  s.len = family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  return s;
}

std::uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return 0;
}

void SockAddr::set_port(std::uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

bool SockAddr::IsWildcard() const {
  if (family() == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (family() == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  }
  return true;
}

bool SockAddr::IsLoopback() const {
  const SockAddr plain = Unmapped();
  if (plain.family() == AF_INET) {
    return IsIpv4Loopback(*reinterpret_cast<const sockaddr_in*>(&plain.storage));
  }
  if (plain.family() == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&plain.storage)->sin6_addr);
  }
  return false;
}

SockAddr SockAddr::Unmapped() const {
  if (family() != AF_INET6) return *this;
  const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&storage);
  if (!IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) return *this;
  SockAddr s;
  auto* a4 = reinterpret_cast<sockaddr_in*>(&s.storage);
  a4->sin_family = AF_INET;
  a4->sin_port = a6->sin6_port;
  std::memcpy(&a4->sin_addr, &a6->sin6_addr.s6_addr[12], 4);
  s.len = sizeof(sockaddr_in);
  return s;
}

std::string SockAddr::ToString() const {
  char text[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, text,
              sizeof(text));
    return std::string(text) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, text,
              sizeof(text));
    return "[" + std::string(text) + "]:" + std::to_string(port());
  }
  return "(no address)";
}

bool SameAddress(const SockAddr& a, const SockAddr& b) {
  const SockAddr x = a.Unmapped();
  const SockAddr y = b.Unmapped();
  if (x.family() != y.family()) return false;
  if (x.family() == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&x.storage)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&y.storage)->sin_addr.s_addr;
  }
  if (x.family() == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&x.storage)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&y.storage)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  }
  return false;
}

// socket(2) by system call, not through libc's socket(): LD_PRELOAD of
// librspreload interposes socket() and would turn the CM's own TCP sockets
// into rsockets, which run over this CM (endless recursion).
static int RawSocket(int family, int type, int protocol) {
  return static_cast<int>(syscall(SYS_socket, family, type, protocol));
}

int OpenTcpSocket(int family, int* fd_out) {
  const int fd = RawSocket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
  if (fd < 0) return Errno();
  *fd_out = fd;
  return 0;
}

int SetReuseAddr(int fd, bool on) {
  const int v = on ? 1 : 0;
  return setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &v, sizeof(v)) == 0 ? 0 : Errno();
}

int SetV6Only(int fd, bool on) {
  const int v = on ? 1 : 0;
  return setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v, sizeof(v)) == 0 ? 0 : Errno();
}

int SetTos(int fd, int family, std::uint8_t tos) {
  const int v = tos;
  const int rc = family == AF_INET6 ? setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &v, sizeof(v))
                                    : setsockopt(fd, IPPROTO_IP, IP_TOS, &v, sizeof(v));
  return rc == 0 ? 0 : Errno();
}

int SetNoDelay(int fd) {
  const int v = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)) == 0 ? 0 : Errno();
}

int BindTo(int fd, const SockAddr& addr) {
  return bind(fd, addr.get(), addr.len) == 0 ? 0 : Errno();
}

int ListenOn(int fd, int backlog) { return listen(fd, backlog) == 0 ? 0 : Errno(); }

int AcceptOne(int listen_fd, int* fd_out) {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      *fd_out = fd;
      return 0;
    }
    if (errno == EINTR) continue;
    // A connection reset while queued is the peer's loss, not the listener's.
    if (errno == ECONNABORTED || errno == EPROTO) continue;
    return (errno == EWOULDBLOCK) ? EAGAIN : Errno();
  }
}

int ConnectTo(int fd, const SockAddr& dst) {
  if (connect(fd, dst.get(), dst.len) == 0) return 0;
  return errno == EINTR ? EINPROGRESS : Errno();
}

int TakeSocketError(int fd) {
  int error = 0;
  socklen_t len = sizeof(error);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) return Errno();
  return error;
}

int LocalAddress(int fd, SockAddr* out) {
  SockAddr s;
  s.len = sizeof(s.storage);
  if (getsockname(fd, s.get(), &s.len) != 0) return Errno();
  *out = s;
  return 0;
}

int PeerAddress(int fd, SockAddr* out) {
  SockAddr s;
  s.len = sizeof(s.storage);
  if (getpeername(fd, s.get(), &s.len) != 0) return Errno();
  *out = s;
  return 0;
}

namespace {
std::atomic<StartupIoTap> startup_io_tap{nullptr};

void TraceIo(int fd, int direction, const std::uint8_t* data, std::size_t n) {
  if (n == 0) return;
  if (const StartupIoTap tap = startup_io_tap.load(std::memory_order_acquire)) {
    tap(fd, direction, data, n);
  }
}
}  // namespace

void SetStartupIoTap(StartupIoTap tap) { startup_io_tap.store(tap, std::memory_order_release); }

IoResult Peek(int fd, MutableByteSpan into) {
  return RecvOnce(fd, into.data(), into.size(), MSG_PEEK);
}

IoResult Discard(int fd, std::size_t n) {
  std::array<std::uint8_t, 1024> scratch;
  IoResult total;
  while (total.bytes < n) {
    const std::size_t want = std::min(scratch.size(), n - total.bytes);
    const IoResult r = RecvOnce(fd, scratch.data(), want, 0);
    TraceIo(fd, 1, scratch.data(), r.bytes);
    if (r.status != IoStatus::kOk) {
      total.status = r.status;
      total.error = r.error;
      return total;
    }
    total.bytes += r.bytes;
  }
  return total;
}

IoResult DrainInput(int fd) {
  std::array<std::uint8_t, 4096> scratch;
  IoResult total;
  for (;;) {
    const IoResult r = RecvOnce(fd, scratch.data(), scratch.size(), 0);
    TraceIo(fd, 1, scratch.data(), r.bytes);
    if (r.status != IoStatus::kOk) {
      total.status = r.status;
      total.error = r.error;
      return total;
    }
    total.bytes += r.bytes;
  }
}

IoResult SendSome(int fd, ByteSpan bytes) {
  ssize_t n;
  do {
    n = send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  const IoResult r = FromCount(n, false);
  TraceIo(fd, 0, bytes.data(), r.bytes);
  return r;
}

void ShutdownWrite(int fd) { (void)shutdown(fd, SHUT_WR); }

void Close(int fd) {
  if (fd >= 0) (void)close(fd);
}

void CloseAbortive(int fd) {
  if (fd < 0) return;
  linger l{};
  l.l_onoff = 1;
  l.l_linger = 0;
  (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  (void)close(fd);
}

int SourceAddressFor(const SockAddr& dst, SockAddr* src) {
  const int fd = RawSocket(dst.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno();
  SockAddr probe = dst;
  // Any port will do for a route lookup; 0 is refused by some kernels.
  if (probe.port() == 0) probe.set_port(9);
  int rc = connect(fd, probe.get(), probe.len) == 0 ? 0 : Errno();
  if (rc == 0) {
    rc = LocalAddress(fd, src);
    if (rc == 0) src->set_port(0);
  }
  (void)close(fd);
  return rc;
}

std::optional<std::string> InterfaceForAddress(const SockAddr& raw) {
  const SockAddr addr = raw.Unmapped();
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> exact;
  std::optional<std::string> loopback;
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_name == nullptr) continue;
    if (ifa->ifa_addr->sa_family != addr.family()) continue;
    if ((ifa->ifa_flags & IFF_LOOPBACK) != 0 && !loopback) loopback = ifa->ifa_name;
    if (addr.family() == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr);
      const auto* b = reinterpret_cast<const sockaddr_in*>(&addr.storage);
      if (a->sin_addr.s_addr == b->sin_addr.s_addr) {
        exact = ifa->ifa_name;
        break;
      }
    } else {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
      const auto* b = reinterpret_cast<const sockaddr_in6*>(&addr.storage);
      if (std::memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(in6_addr)) == 0 &&
          (b->sin6_scope_id == 0 || a->sin6_scope_id == b->sin6_scope_id)) {
        exact = ifa->ifa_name;
        break;
      }
    }
  }
  freeifaddrs(list);
  if (exact) return exact;
  if (addr.family() == AF_INET &&
      IsIpv4Loopback(*reinterpret_cast<const sockaddr_in*>(&addr.storage))) {
    return loopback;
  }
  return std::nullopt;
}

int CreateEventFd(bool nonblocking, int* fd_out) {
  const int fd = eventfd(0, EFD_CLOEXEC | (nonblocking ? EFD_NONBLOCK : 0));
  if (fd < 0) return Errno();
  *fd_out = fd;
  return 0;
}

void SignalEventFd(int fd) {
  const std::uint64_t one = 1;
  ssize_t n;
  do {
    n = write(fd, &one, sizeof(one));
  } while (n < 0 && errno == EINTR);
}

void ClearEventFd(int fd) {
  pollfd p{fd, POLLIN, 0};
  int n;
  do {
    n = poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n == 1 && (p.revents & POLLIN) != 0) DrainEventFd(fd);
}

int WaitReadable(int fd) {
  pollfd p{fd, POLLIN, 0};
  const int n = poll(&p, 1, -1);
  if (n < 0) return Errno();
  return 0;
}

bool WaitReadableFor(int fd, std::chrono::nanoseconds max) {
  if (max <= std::chrono::nanoseconds::zero()) return false;
  pollfd p{fd, POLLIN, 0};
  timespec timeout{};
  timeout.tv_sec = static_cast<time_t>(max.count() / 1000000000);
  timeout.tv_nsec = static_cast<long>(max.count() % 1000000000);
  // EINTR counts as readable: the caller reads (EAGAIN) and polls again.
  const int n = ppoll(&p, 1, &timeout, nullptr);
  return n != 0;
}

bool IsNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_NONBLOCK) != 0;
}

void DrainEventFd(int fd) {
  std::uint64_t value = 0;
  ssize_t n;
  do {
    n = read(fd, &value, sizeof(value));
  } while (n < 0 && errno == EINTR);
}

int CreateTimerFd(int* fd_out) {
  const int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd < 0) return Errno();
  *fd_out = fd;
  return 0;
}

int ArmTimerFdAt(int fd, std::chrono::steady_clock::time_point at) {
  itimerspec spec{};
  if (at != std::chrono::steady_clock::time_point::max()) {
    // it_value 0 would disarm: a time at or before the clock's start is
    // one nanosecond after it.
    const auto ns = std::max<std::int64_t>(
        1, std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count());
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  }
  if (timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, nullptr) != 0) return Errno();
  return 0;
}

}  // namespace siwx::transport
