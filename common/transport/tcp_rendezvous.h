// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Socket calls of the out-of-band QP connect (docs/out-of-band-connect.md):
// the interface's IPv4 address, a listening socket, a connect and the
// blocking-with-a-deadline reads and writes of an MPA exchange. Like
// tcp_stream.h, the only place such system calls are made; nothing here
// knows MPA or RDMA.
//
// Every function returns 0 or an errno value; every wait has a time bound.
// Descriptors are close-on-exec and non-blocking.
#pragma once

#include <cstdint>

#include "common/transport/tcp_stream.h"
#include "common/util/bytes.h"

namespace siwx::transport {

// The first IPv4 address of interface `ifname` (network order) in *address:
// 0, ENODEV (no such interface) or EADDRNOTAVAIL (it has no IPv4 address).
int Ipv4AddressOf(const char* ifname, std::uint32_t* address);

// Listens on `address`:`port` (both network order; port 0 picks a free
// one); *fd and *bound_port (host order) on success. SO_REUSEADDR is set so
// a fixed port can be reused at once after a restart.
int ListenTcp(std::uint32_t address, std::uint16_t port, int* fd, std::uint16_t* bound_port);

// Waits up to timeout_ms for a connection on `listen_fd`; 0 with *fd, or
// ETIMEDOUT, or the accept errno (EMFILE, ...).
int AcceptTcp(int listen_fd, int timeout_ms, int* fd);

// Connects to `address`:`port` (network order, host order) within
// timeout_ms: 0 with *fd, ETIMEDOUT, ECONNREFUSED, EHOSTUNREACH, ...
int ConnectTcp(std::uint32_t address, std::uint16_t port, int timeout_ms, int* fd);

// Waits until `fd` is readable (or writable) for at most timeout_ms:
// 0, ETIMEDOUT or an errno.
int WaitReadable(int fd, int timeout_ms);
int WaitWritable(int fd, int timeout_ms);

// Copies what `fd` holds into `into` without consuming it (MSG_PEEK), so a
// startup-frame parser can take exactly its frame and leave the rest of the
// stream in the socket.
IoResult PeekSome(int fd, MutableByteSpan into);
// Consumes `count` octets already peeked.
int DiscardPeeked(int fd, std::size_t count);
// Writes all of `data` within timeout_ms: 0, ETIMEDOUT or the send errno.
int WriteAll(int fd, ByteSpan data, int timeout_ms);

// Closes `fd` (ignoring errors), for the owners of the descriptors above.
void CloseFd(int fd);

}  // namespace siwx::transport
