// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// TcpStream, Poller and Doorbell over socketpairs and loopback TCP.
#include "common/transport/tcp_stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

namespace siwx::transport {
namespace {

std::array<int, 2> SocketPair() {
  std::array<int, 2> fds{};
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds.data()), 0);
  return fds;
}

// Connected loopback TCP pair: {client, server}.
std::array<int, 2> TcpPair() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(listen(listener, 1), 0);
  EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), len), 0);
  const int server = accept(listener, nullptr, nullptr);
  close(listener);
  return {client, server};
}

TEST(TcpStream, ReadOnEmptySocketWouldBlock) {
  auto fds = SocketPair();
  TcpStream a(fds[0]), b(fds[1]);
  std::array<std::uint8_t, 8> buf{};
  EXPECT_EQ(a.Read(buf).status, IoStatus::kWouldBlock);
}

TEST(TcpStream, WriteVThenReadVScatters) {
  auto fds = SocketPair();
  TcpStream a(fds[0]), b(fds[1]);
  const char hello[] = "hello", world[] = "world";
  const std::array<iovec, 2> out{iovec{const_cast<char*>(hello), 5},
                                 iovec{const_cast<char*>(world), 5}};
  auto w = a.WriteV(out);
  ASSERT_EQ(w.status, IoStatus::kOk);
  EXPECT_EQ(w.bytes, 10u);
  char x[3], y[7];
  const std::array<iovec, 2> in{iovec{x, 3}, iovec{y, 7}};
  auto r = b.ReadV(in);
  ASSERT_EQ(r.status, IoStatus::kOk);
  EXPECT_EQ(r.bytes, 10u);
  EXPECT_EQ(std::memcmp(x, "hel", 3), 0);
  EXPECT_EQ(std::memcmp(y, "loworld", 7), 0);
}

TEST(TcpStream, PeerCloseReadsClosedAndWriteFailsWithoutSignal) {
  auto fds = SocketPair();
  TcpStream a(fds[0]);
  close(fds[1]);
  std::array<std::uint8_t, 4> buf{};
  EXPECT_EQ(a.Read(buf).status, IoStatus::kClosed);
  const std::array<iovec, 1> out{iovec{buf.data(), buf.size()}};
  auto w = a.WriteV(out);  // would raise SIGPIPE without MSG_NOSIGNAL
  EXPECT_EQ(w.status, IoStatus::kError);
  EXPECT_EQ(w.error, EPIPE);
}

TEST(TcpStream, AbortSendsReset) {
  auto fds = TcpPair();
  TcpStream client(fds[0]), server(fds[1]);
  client.Abort();
  std::array<std::uint8_t, 4> buf{};
  IoResult r;
  for (int i = 0; i < 1000; ++i) {
    r = server.Read(buf);
    if (r.status != IoStatus::kWouldBlock) break;
    usleep(1000);
  }
  EXPECT_EQ(r.status, IoStatus::kError);
  EXPECT_EQ(r.error, ECONNRESET);
}

TEST(TcpStream, EffectiveMssIsReportedForTcpOnly) {
  auto tcp = TcpPair();
  TcpStream client(tcp[0]), server(tcp[1]);
  EXPECT_GT(client.EffectiveMss(), 500u);
  auto unix_pair = SocketPair();
  TcpStream a(unix_pair[0]), b(unix_pair[1]);
  EXPECT_EQ(a.EffectiveMss(), 0u);
}

TEST(Poller, ReportsReadableCookieAndDoorbellWakes) {
  auto fds = SocketPair();
  TcpStream a(fds[0]), b(fds[1]);
  Poller poller;
  Doorbell bell;
  int stream_cookie = 0, bell_cookie = 0;
  ASSERT_EQ(poller.Add(b.fd(), &stream_cookie, true, false), 0);
  ASSERT_EQ(poller.Add(bell.fd(), &bell_cookie, true, false), 0);
  std::array<Poller::Event, 4> events{};
  EXPECT_EQ(poller.Wait(events, 0), 0);

  bell.Ring();
  bell.Ring();
  ASSERT_EQ(poller.Wait(events, 1000), 1);
  EXPECT_EQ(events[0].ptr(), &bell_cookie);
  bell.Drain();
  EXPECT_EQ(poller.Wait(events, 0), 0);

  const std::array<iovec, 1> out{iovec{const_cast<char*>("x"), 1}};
  ASSERT_EQ(a.WriteV(out).bytes, 1u);
  ASSERT_EQ(poller.Wait(events, 1000), 1);
  EXPECT_EQ(events[0].ptr(), &stream_cookie);
  EXPECT_TRUE(events[0].readable);
  EXPECT_FALSE(events[0].writable);
  EXPECT_EQ(poller.Remove(b.fd()), 0);
}

// The interest-bit interface the CM uses: numeric cookies, the peer's FIN
// alone (kWantHangup), and removal by interest 0.
TEST(Poller, UpdateTracksRegistrationAndReportsThePeersFin) {
  auto fds = SocketPair();
  TcpStream a(fds[0]), b(fds[1]);
  Poller poller;
  ASSERT_EQ(poller.error(), 0);
  bool registered = false;
  constexpr std::uint64_t kCookie = 0x1234567890abcdefull;
  ASSERT_EQ(poller.Update(b.fd(), kWantHangup, kCookie, &registered), 0);
  EXPECT_TRUE(registered);
  std::array<Poller::Event, 4> events{};
  const std::array<iovec, 1> out{iovec{const_cast<char*>("x"), 1}};
  ASSERT_EQ(a.WriteV(out).bytes, 1u);
  EXPECT_EQ(poller.Wait(events, 0), 0);  // data alone is not of interest
  ASSERT_EQ(poller.Update(b.fd(), kWantHangup | kWantRead, kCookie, &registered), 0);
  ASSERT_EQ(poller.Wait(events, 1000), 1);
  EXPECT_EQ(events[0].cookie, kCookie);
  EXPECT_TRUE(events[0].readable);
  EXPECT_FALSE(events[0].hangup);
  a.ShutdownWrite();
  ASSERT_EQ(poller.Wait(events, 1000), 1);
  EXPECT_TRUE(events[0].hangup);
  ASSERT_EQ(poller.Update(b.fd(), 0, kCookie, &registered), 0);
  EXPECT_FALSE(registered);
  EXPECT_EQ(poller.Update(b.fd(), 0, kCookie, &registered), 0);  // already out: no call
  EXPECT_EQ(poller.Wait(events, 0), 0);
}

}  // namespace
}  // namespace siwx::transport
