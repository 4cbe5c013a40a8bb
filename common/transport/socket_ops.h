// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Socket and eventfd system calls besides the data path's (tcp_stream.h):
// socket addresses, TCP sockets of the connection manager (bind, listen,
// accept, non-blocking connect, peek/discard/send of MPA startup frames,
// orderly and abortive close), source-address selection, interface lookup,
// and the eventfd operations that Doorbell and the CM's event channels use.
//
// Everything here is a thin, errno-preserving wrapper: 0 or a positive errno
// value, never an exception, never SIGPIPE. It knows nothing of MPA or
// rdma_cm. Epoll is Poller's (tcp_stream.h).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/transport/tcp_stream.h"
#include "common/util/bytes.h"

namespace siwx::transport {

// An IPv4 or IPv6 socket address.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  // nullopt unless `addr` is AF_INET or AF_INET6.
  static std::optional<SockAddr> From(const sockaddr* addr);
  static SockAddr Wildcard(int family);

  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
  std::uint16_t port() const;  // host order
  void set_port(std::uint16_t port);
  bool IsWildcard() const;
  // 127/8, ::1, or 127/8 mapped into IPv6.
  bool IsLoopback() const;
  // An IPv4-mapped IPv6 address as plain IPv4; others unchanged.
  SockAddr Unmapped() const;
  std::string ToString() const;  // "1.2.3.4:5" / "[::1]:5"
};

// The same IP address, ports ignored; an IPv4-mapped IPv6 address equals
// its IPv4 address.
bool SameAddress(const SockAddr& a, const SockAddr& b);

// A non-blocking, close-on-exec TCP socket.
int OpenTcpSocket(int family, int* fd_out);
int SetReuseAddr(int fd, bool on);
int SetV6Only(int fd, bool on);
int SetTos(int fd, int family, std::uint8_t tos);
int SetNoDelay(int fd);
int BindTo(int fd, const SockAddr& addr);
int ListenOn(int fd, int backlog);
// A non-blocking, close-on-exec connection; EAGAIN when none is waiting.
// EMFILE, ENFILE, ENOBUFS, ENOMEM: out of descriptors or memory; the
// connection stays queued in the kernel.
int AcceptOne(int listen_fd, int* fd_out);
// 0 (connected), EINPROGRESS, or the error.
int ConnectTo(int fd, const SockAddr& dst);
// The pending error of a non-blocking connect (SO_ERROR), 0 if connected.
int TakeSocketError(int fd);
int LocalAddress(int fd, SockAddr* out);
int PeerAddress(int fd, SockAddr* out);

// Reads without consuming (MSG_PEEK): the CM never takes octets past a
// startup frame, so the FPDU stream starts exactly where the QP reads.
IoResult Peek(int fd, MutableByteSpan into);
// Consumes `n` octets a previous Peek saw.
IoResult Discard(int fd, std::size_t n);
// Reads and drops whatever is there (a closing connection).
IoResult DrainInput(int fd);
IoResult SendSome(int fd, ByteSpan bytes);
void ShutdownWrite(int fd);

// SIWX_TRACE: a tap that sees the octets Discard, DrainInput and SendSome
// move (direction 0 sent, 1 received), so the MPA startup frames appear in
// the wire trace in front of the QP's FPDUs. The CM installs the provider's
// tracer (one trace per process); none by default.
using StartupIoTap = void (*)(int fd, int direction, const void* data, std::size_t length);
void SetStartupIoTap(StartupIoTap tap);
void Close(int fd);
// RST instead of FIN (SO_LINGER 0).
void CloseAbortive(int fd);

// The local address the kernel would use toward `dst` (a connected UDP
// socket; nothing is sent). Port 0.
int SourceAddressFor(const SockAddr& dst, SockAddr* src);
// The interface that owns `addr`: an exact address match, or for 127/8 the
// loopback interface. nullopt if none.
std::optional<std::string> InterfaceForAddress(const SockAddr& addr);

// An eventfd used as a readiness flag: readable while its counter is
// non-zero. `nonblocking` sets O_NONBLOCK (the CM's own wake-up fd); event
// channel fds start blocking, as the application may change that.
int CreateEventFd(bool nonblocking, int* fd_out);
void SignalEventFd(int fd);
// Resets the counter if it is set, without ever blocking: callers serialise
// all signalling and clearing of the fd, so a readable fd stays readable
// until the read.
void ClearEventFd(int fd);
// Blocks until `fd` is readable: 0, EINTR, or another errno.
int WaitReadable(int fd);
// Waits at most `max` for `fd` to be readable (or to report an error or
// hang-up): true if it is, false when the time ran out or poll failed.
bool WaitReadableFor(int fd, std::chrono::nanoseconds max);
bool IsNonBlocking(int fd);
// Takes everything (the non-blocking wake-up fd; a timerfd's expirations).
void DrainEventFd(int fd);
// A non-blocking timerfd on CLOCK_MONOTONIC (std::chrono::steady_clock's
// clock), disarmed: 0 or an errno.
int CreateTimerFd(int* fd_out);
// Arms the timerfd to expire once at `at` (steady_clock time; a time in the
// past expires at once), or disarms it at time_point::max(). Resets its
// expirations, so a timer re-armed before it was read is no longer
// readable. 0 or an errno.
int ArmTimerFdAt(int fd, std::chrono::steady_clock::time_point at);

}  // namespace siwx::transport
