// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The addresses of a connected socket and what TCP knows about it, for logs,
// `siwx stat` and the wire trace. Off the data path: called once per stream
// (or per trace record when SIWX_TRACE is set).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace siwx::transport {

// One end of a TCP connection: IPv4 or IPv6 address and port, host order.
struct Endpoint {
  std::uint16_t family = 0;  // AF_INET, AF_INET6, or 0 when unknown
  std::uint16_t port = 0;
  std::uint8_t address[16] = {};  // IPv4 in the first 4 octets

  bool known() const { return family == AF_INET || family == AF_INET6; }
  bool operator==(const Endpoint&) const = default;
};

struct Endpoints {
  Endpoint local;
  Endpoint peer;
  bool operator==(const Endpoints&) const = default;
};

// getsockname/getpeername of `fd`; family 0 where not an IP socket.
Endpoints QueryEndpoints(int fd);

// Converts a sockaddr (AF_INET/AF_INET6) to an Endpoint (family 0 otherwise).
Endpoint EndpointFromSockaddr(const sockaddr* address);

// "192.0.2.1:4791" or "[2001:db8::1]:4791"; "?" when unknown. A v4-mapped
// IPv6 address prints as IPv4.
std::string FormatEndpoint(const Endpoint& endpoint);

}  // namespace siwx::transport
