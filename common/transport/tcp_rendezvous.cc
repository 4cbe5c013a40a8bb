// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/transport/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace siwx::transport {
namespace {

int WaitFor(int fd, short events, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) return ETIMEDOUT;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return ETIMEDOUT;
    return 0;  // ready, or an error the next call reports
  }
}

// By system call, as socket_ops.cc does: librspreload (LD_PRELOAD)
// interposes libc's socket() and would make this an rsocket.
int TcpSocket() {
  return static_cast<int>(
      ::syscall(SYS_socket, AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
}

}  // namespace

int Ipv4AddressOf(const char* ifname, std::uint32_t* address) {
  if (if_nametoindex(ifname) == 0) return ENODEV;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return errno;
  int result = EADDRNOTAVAIL;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (std::strcmp(a->ifa_name, ifname) != 0) continue;
    sockaddr_in in;
    std::memcpy(&in, a->ifa_addr, sizeof(in));
    *address = in.sin_addr.s_addr;
    result = 0;
    break;
  }
  ::freeifaddrs(list);
  return result;
}

int ListenTcp(std::uint32_t address, std::uint16_t port, int* fd, std::uint16_t* bound_port) {
  const int s = TcpSocket();
  if (s < 0) return errno;
  const int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = address;
  in.sin_port = htons(port);
  socklen_t len = sizeof(in);
  if (::bind(s, reinterpret_cast<sockaddr*>(&in), sizeof(in)) != 0 || ::listen(s, 64) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&in), &len) != 0) {
    const int error = errno;
    ::close(s);
    return error;
  }
  *fd = s;
  *bound_port = ntohs(in.sin_port);
  return 0;
}

int AcceptTcp(int listen_fd, int timeout_ms, int* fd) {
  if (int error = WaitFor(listen_fd, POLLIN, timeout_ms); error != 0) return error;
  const int s = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (s < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? ETIMEDOUT : errno;
  *fd = s;
  return 0;
}

int ConnectTcp(std::uint32_t address, std::uint16_t port, int timeout_ms, int* fd) {
  const int s = TcpSocket();
  if (s < 0) return errno;
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = address;
  in.sin_port = htons(port);
  int error = 0;
  if (::connect(s, reinterpret_cast<sockaddr*>(&in), sizeof(in)) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      error = WaitFor(s, POLLOUT, timeout_ms);
      if (error == 0) {
        socklen_t len = sizeof(error);
        if (::getsockopt(s, SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
      }
    }
  }
  if (error != 0) {
    ::close(s);
    return error;
  }
  *fd = s;
  return 0;
}

int WaitReadable(int fd, int timeout_ms) { return WaitFor(fd, POLLIN, timeout_ms); }
int WaitWritable(int fd, int timeout_ms) { return WaitFor(fd, POLLOUT, timeout_ms); }

IoResult PeekSome(int fd, MutableByteSpan into) {
  const ssize_t n = ::recv(fd, into.data(), into.size(), MSG_PEEK);
  if (n > 0) return {IoStatus::kOk, static_cast<std::size_t>(n), 0};
  if (n == 0) return {IoStatus::kClosed, 0, 0};
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
    return {IoStatus::kWouldBlock, 0, 0};
  }
  return {IoStatus::kError, 0, errno};
}

int DiscardPeeked(int fd, std::size_t count) {
  std::uint8_t sink[512];
  while (count > 0) {
    const ssize_t n = ::recv(fd, sink, std::min(count, sizeof(sink)), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return n == 0 ? ECONNRESET : errno;  // the octets were peeked: they are there
    }
    count -= static_cast<std::size_t>(n);
  }
  return 0;
}

int WriteAll(int fd, ByteSpan data, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data = data.subspan(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return errno;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (int error = WaitFor(fd, POLLOUT, static_cast<int>(std::max<long>(left.count(), 0)));
        error != 0) {
      return error;
    }
  }
  return 0;
}

void CloseFd(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace siwx::transport
