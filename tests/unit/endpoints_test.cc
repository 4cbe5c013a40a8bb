// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/transport/endpoints.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace siwx::transport {
namespace {

TEST(Endpoints, FormatsIpv4Ipv6AndMapped) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(4791);
  inet_pton(AF_INET, "192.0.2.7", &in.sin_addr);
  EXPECT_EQ(FormatEndpoint(EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&in))),
            "192.0.2.7:4791");
  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  in6.sin6_port = htons(1);
  inet_pton(AF_INET6, "2001:db8::5", &in6.sin6_addr);
  EXPECT_EQ(FormatEndpoint(EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&in6))),
            "[2001:db8::5]:1");
  inet_pton(AF_INET6, "::ffff:10.1.2.3", &in6.sin6_addr);
  const Endpoint mapped = EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&in6));
  EXPECT_EQ(mapped.family, AF_INET);
  EXPECT_EQ(FormatEndpoint(mapped), "10.1.2.3:1");
  EXPECT_EQ(FormatEndpoint(Endpoint{}), "?");
}

TEST(Endpoints, QueriesBothEndsOfALoopbackConnection) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof(any)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  const Endpoints server_side = QueryEndpoints(listener);
  ASSERT_EQ(server_side.local.family, AF_INET);
  const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  any.sin_port = htons(server_side.local.port);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&any), sizeof(any)), 0);
  const int accepted = accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  const Endpoints c = QueryEndpoints(client);
  const Endpoints a = QueryEndpoints(accepted);
  EXPECT_EQ(c.local, a.peer);
  EXPECT_EQ(c.peer, a.local);
  EXPECT_EQ(c.peer.port, server_side.local.port);
  EXPECT_FALSE(QueryEndpoints(-1).local.known());
  close(accepted);
  close(client);
  close(listener);
}

}  // namespace
}  // namespace siwx::transport
