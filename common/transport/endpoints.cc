// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/transport/endpoints.h"

#include <arpa/inet.h>

#include <cstring>

namespace siwx::transport {

Endpoint EndpointFromSockaddr(const sockaddr* address) {
  Endpoint e;
  if (address == nullptr) return e;
  if (address->sa_family == AF_INET) {
    sockaddr_in in;
    std::memcpy(&in, address, sizeof(in));
    e.family = AF_INET;
    e.port = ntohs(in.sin_port);
    std::memcpy(e.address, &in.sin_addr, 4);
  } else if (address->sa_family == AF_INET6) {
    sockaddr_in6 in6;
    std::memcpy(&in6, address, sizeof(in6));
    e.port = ntohs(in6.sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      e.family = AF_INET;
      std::memcpy(e.address, in6.sin6_addr.s6_addr + 12, 4);
    } else {
      e.family = AF_INET6;
      std::memcpy(e.address, &in6.sin6_addr, 16);
    }
  }
  return e;
}

Endpoints QueryEndpoints(int fd) {
  Endpoints result;
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length) == 0) {
    result.local = EndpointFromSockaddr(reinterpret_cast<const sockaddr*>(&storage));
  }
  storage = {};
  length = sizeof(storage);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&storage), &length) == 0) {
    result.peer = EndpointFromSockaddr(reinterpret_cast<const sockaddr*>(&storage));
  }
  return result;
}

std::string FormatEndpoint(const Endpoint& endpoint) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (!endpoint.known() ||
      inet_ntop(endpoint.family, endpoint.address, text, sizeof(text)) == nullptr) {
    return "?";
  }
  const std::string port = std::to_string(endpoint.port);
  if (endpoint.family == AF_INET6) return "[" + std::string(text) + "]:" + port;
  return std::string(text) + ":" + port;
}

}  // namespace siwx::transport
