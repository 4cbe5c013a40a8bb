// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The socket calls of the out-of-band connect (tcp_rendezvous.h) on
// loopback: listen, connect, accept, peek without consuming, discard
// exactly, and the time-bounded failures.
#include "common/transport/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <cerrno>
#include <cstdint>

namespace siwx::transport {
namespace {

const std::uint32_t kLoopback = htonl(INADDR_LOOPBACK);

TEST(TcpRendezvousTest, LoopbackHasItsIpv4Address) {
  std::uint32_t address = 0;
  ASSERT_EQ(Ipv4AddressOf("lo", &address), 0);
  EXPECT_EQ(address, kLoopback);
  EXPECT_EQ(Ipv4AddressOf("siwx-no-such-if", &address), ENODEV);
}

TEST(TcpRendezvousTest, PeekLeavesOctetsAndDiscardTakesExactly) {
  int listener = -1;
  std::uint16_t port = 0;
  ASSERT_EQ(ListenTcp(kLoopback, 0, &listener, &port), 0);
  ASSERT_NE(port, 0);
  int client = -1;
  ASSERT_EQ(ConnectTcp(kLoopback, port, 5000, &client), 0);
  int server = -1;
  ASSERT_EQ(AcceptTcp(listener, 5000, &server), 0);

  const std::array<std::uint8_t, 6> data = {1, 2, 3, 4, 5, 6};
  ASSERT_EQ(WriteAll(client, data, 5000), 0);
  ASSERT_EQ(WaitReadable(server, 5000), 0);
  std::array<std::uint8_t, 16> buffer{};
  // Loopback delivers the six octets at once.
  IoResult r = PeekSome(server, buffer);
  ASSERT_EQ(r.status, IoStatus::kOk);
  ASSERT_EQ(r.bytes, 6u);
  r = PeekSome(server, buffer);  // still there
  ASSERT_EQ(r.bytes, 6u);
  ASSERT_EQ(DiscardPeeked(server, 4), 0);
  r = PeekSome(server, buffer);
  ASSERT_EQ(r.status, IoStatus::kOk);
  ASSERT_EQ(r.bytes, 2u);
  EXPECT_EQ(buffer[0], 5);
  EXPECT_EQ(buffer[1], 6);

  CloseFd(client);
  ASSERT_EQ(DiscardPeeked(server, 2), 0);
  ASSERT_EQ(WaitReadable(server, 5000), 0);
  EXPECT_EQ(PeekSome(server, buffer).status, IoStatus::kClosed);
  CloseFd(server);
  CloseFd(listener);
}

TEST(TcpRendezvousTest, FailuresAreErrnosWithinTheirBounds) {
  int listener = -1;
  std::uint16_t port = 0;
  ASSERT_EQ(ListenTcp(kLoopback, 0, &listener, &port), 0);
  int fd = -1;
  EXPECT_EQ(AcceptTcp(listener, 10, &fd), ETIMEDOUT);  // nobody connects
  // A bound port that does not listen refuses.
  const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = kLoopback;
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&in), sizeof(in)), 0);
  socklen_t len = sizeof(in);
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&in), &len), 0);
  EXPECT_EQ(ConnectTcp(kLoopback, ntohs(in.sin_port), 5000, &fd), ECONNREFUSED);
  ::close(holder);
  // The same fixed port twice cannot listen.
  int second = -1;
  std::uint16_t second_port = 0;
  EXPECT_EQ(ListenTcp(kLoopback, port, &second, &second_port), EADDRINUSE);
  CloseFd(listener);
}

}  // namespace
}  // namespace siwx::transport
