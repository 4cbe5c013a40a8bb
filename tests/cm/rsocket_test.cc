// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// rsockets of librdmacm-siwx.so (rdmacm-ext/rsocket*.cc): the wire formats
// byte for byte (RsocketWire, no device needed), and stream rsockets between
// two ends of one process, with every octet checked (Rsocket, under siwx-run
// as the ctest entry cm_rsockets; without a siwx device they skip).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/util/sanitizers.h"
#include "rdmacm-ext/rsocket_wire.h"
#include "tests/cm/cm_test_util.h"

extern char** environ;

// Memory a peer writes by RDMA with no completion to synchronize on (the
// riostream pattern): ThreadSanitizer cannot see the order the protocol gives
// it, so the test's reads of it are hidden from it.
#ifdef SIWX_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#define RS_TEST_IGNORE_READS_BEGIN() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define RS_TEST_IGNORE_READS_END() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define RS_TEST_IGNORE_READS_BEGIN() (void)0
#define RS_TEST_IGNORE_READS_END() (void)0
#endif

namespace {

namespace wire = siwx::rs::wire;
using Bytes = std::vector<std::uint8_t>;

// ---- wire formats (docs/rsockets.md) ----------------------------------------

TEST(RsocketWire, ConnDataIsFortyOctetsBigEndian) {
  wire::ConnData c;
  c.version = 1;
  c.flags = wire::kFlagIomap;
  c.credits = 384;
  c.target_iomap_size = wire::ScaleEncode(4);
  c.target_sgl = {0x0102030405060708ull, 0x11223344u, 2};
  c.data_buf = {0xA1A2A3A4A5A6A7A8ull, 0x55667788u, 65536};
  std::uint8_t out[wire::kConnDataSize];
  wire::EncodeConnData(c, out);
  const Bytes expected = {
      0x01, 0x02, 0x01, 0x80, 0x00, 0x00, 0x00, 0x04,          // version flags credits rsvd iomap
      0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,          // target_sgl.addr
      0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x00, 0x02,          // .key .length
      0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 0xA8,          // data_buf.addr
      0x55, 0x66, 0x77, 0x88, 0x00, 0x01, 0x00, 0x00};         // .key .length
  EXPECT_EQ(Bytes(out, out + sizeof(out)), expected);

  wire::ConnData back;
  ASSERT_TRUE(wire::DecodeConnData(out, sizeof(out), &back));
  EXPECT_EQ(back.credits, 384);
  EXPECT_EQ(back.flags, wire::kFlagIomap);
  EXPECT_EQ(wire::ScaleDecode(back.target_iomap_size), 4);
  EXPECT_EQ(back.target_sgl.addr, c.target_sgl.addr);
  EXPECT_EQ(back.target_sgl.key, c.target_sgl.key);
  EXPECT_EQ(back.target_sgl.length, 2u);
  EXPECT_EQ(back.data_buf.length, 65536u);
}

TEST(RsocketWire, ConnDataRejectsShortOrOtherVersions) {
  std::uint8_t out[wire::kConnDataSize];
  wire::EncodeConnData(wire::ConnData{}, out);
  wire::ConnData c;
  EXPECT_FALSE(wire::DecodeConnData(out, sizeof(out) - 1, &c));
  EXPECT_FALSE(wire::DecodeConnData(nullptr, sizeof(out), &c));
  out[0] = 2;
  EXPECT_FALSE(wire::DecodeConnData(out, sizeof(out), &c));
  out[0] = 1;
  EXPECT_TRUE(wire::DecodeConnData(out, sizeof(out), &c));
}

TEST(RsocketWire, MessagesCarryTypeInTopThreeBits) {
  EXPECT_EQ(wire::MakeMsg(wire::kOpData, 4096), 0x00001000u);
  EXPECT_EQ(wire::MakeMsg(wire::kOpSgl, 768), 0x80000300u);
  EXPECT_EQ(wire::MakeMsg(wire::kOpIomapSgl, 3), 0xC0000003u);
  EXPECT_EQ(wire::MakeMsg(wire::kOpCtrl, wire::kCtrlDisconnect), 0xE0000000u);
  EXPECT_EQ(wire::MakeMsg(wire::kOpCtrl, wire::kCtrlShutdown), 0xE0000002u);
  EXPECT_EQ(wire::MsgOp(0xE0000002u), wire::kOpCtrl);
  EXPECT_EQ(wire::MsgArg(0xFFFFFFFFu), 0x1FFFFFFFu);
}

TEST(RsocketWire, IomapSizeScale) {
  EXPECT_EQ(wire::ScaleEncode(0), 0);
  EXPECT_EQ(wire::ScaleEncode(128), 128);
  EXPECT_EQ(wire::ScaleEncode(256), 0x81);
  EXPECT_EQ(wire::ScaleDecode(0x81), 256);
  EXPECT_EQ(wire::ScaleDecode(wire::ScaleEncode(1000)), 768);  // rounded down to 256s
}

TEST(RsocketWire, TableEntriesInTheOwnersByteOrder) {
  std::uint8_t out[wire::kSgeSize];
  wire::EncodeSge({0x1122334455667788ull, 0xAABBCCDDu, 0x10000u}, false, out);
  const wire::Sge same = wire::DecodeSge(out);
  EXPECT_EQ(same.addr, 0x1122334455667788ull);
  EXPECT_EQ(same.key, 0xAABBCCDDu);
  EXPECT_EQ(same.length, 0x10000u);
  wire::EncodeSge({0x1122334455667788ull, 0xAABBCCDDu, 0x10000u}, true, out);
  EXPECT_EQ(wire::DecodeSge(out).key, 0xDDCCBBAAu);
  std::uint8_t iom[wire::kIomapSize];
  wire::EncodeIomap({42, {7, 8, 9}}, false, iom);
  const wire::Iomap m = wire::DecodeIomap(iom);
  EXPECT_EQ(m.offset, 42u);
  EXPECT_EQ(m.sge.addr, 7u);
  EXPECT_EQ(m.sge.length, 9u);
}

// ---- stream rsockets ---------------------------------------------------------

Bytes Pattern(std::size_t n, std::uint32_t seed) {
  Bytes b(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& v : b) {
    x = x * 1103515245u + 12345u;
    v = static_cast<std::uint8_t>(x >> 16);
  }
  return b;
}

bool SendAll(int fd, const std::uint8_t* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = rsend(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool RecvAll(int fd, std::uint8_t* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = rrecv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

class Rsocket : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = siwx::cm::test::MissingSiwxDevice(true)) GTEST_SKIP() << *why;
  }
  void TearDown() override {
    for (int fd : {client_, server_, listener_}) {
      if (fd >= 0) rclose(fd);
    }
  }

  // A listener on 127.0.0.1, an ephemeral port.
  void Listen(int type_flags = 0) {
    listener_ = rsocket(AF_INET, SOCK_STREAM | type_flags, 0);
    ASSERT_GE(listener_, 0) << strerror(errno);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(rbind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
    ASSERT_EQ(rlisten(listener_, 8), 0) << strerror(errno);
    socklen_t len = sizeof(a);
    ASSERT_EQ(rgetsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    ASSERT_NE(port_, 0);
  }

  sockaddr_in ServerAddr() const {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port_);
    return a;
  }

  // Blocking connect and accept on two threads.
  void ConnectPair() {
    Listen();
    std::thread t([&] { server_ = raccept(listener_, nullptr, nullptr); });
    client_ = rsocket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(client_, 0);
    const sockaddr_in a = ServerAddr();
    const int rc = rconnect(client_, reinterpret_cast<const sockaddr*>(&a), sizeof(a));
    t.join();
    ASSERT_EQ(rc, 0) << strerror(errno);
    ASSERT_GE(server_, 0) << strerror(errno);
  }

  int listener_ = -1, client_ = -1, server_ = -1;
  std::uint16_t port_ = 0;
};

TEST_F(Rsocket, ManySizesBothDirectionsAtOnce) {
  ConnectPair();
  const std::vector<std::size_t> sizes = {1, 7, 64, 1000, 2047, 2048, 4096, 65535, 65536,
                                          65537, 100000, 262144, 1 << 20, 3 << 20};
  // Each end sends every size while it receives the other's: both
  // directions at once, with flow control on both.
  auto run = [&](int fd, std::uint32_t my_seed, std::uint32_t peer_seed, std::atomic<int>* bad) {
    std::thread sender([&] {
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const Bytes b = Pattern(sizes[i], my_seed + static_cast<std::uint32_t>(i));
        if (!SendAll(fd, b.data(), b.size())) ++*bad;
      }
    });
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Bytes got(sizes[i]);
      if (!RecvAll(fd, got.data(), got.size()) ||
          got != Pattern(sizes[i], peer_seed + static_cast<std::uint32_t>(i))) {
        ++*bad;
      }
    }
    sender.join();
  };
  std::atomic<int> bad{0};
  std::thread a([&] { run(client_, 100, 200, &bad); });
  run(server_, 200, 100, &bad);
  a.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(Rsocket, NonBlockingConnectSendRecvWithRpoll) {
  Listen(SOCK_NONBLOCK);
  client_ = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(client_, 0);
  const sockaddr_in a = ServerAddr();
  const int rc = rconnect(client_, reinterpret_cast<const sockaddr*>(&a), sizeof(a));
  ASSERT_TRUE(rc == 0 || errno == EINPROGRESS) << strerror(errno);
  // One thread drives both ends: accept, then connect completion.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool connected = rc == 0;
  while ((server_ < 0 || !connected) && std::chrono::steady_clock::now() < deadline) {
    pollfd fds[2] = {{listener_, POLLIN, 0}, {client_, POLLOUT, 0}};
    ASSERT_GE(rpoll(fds, 2, 100), 0);
    if (server_ < 0 && (fds[0].revents & POLLIN)) {
      server_ = raccept(listener_, nullptr, nullptr);
      ASSERT_GE(server_, 0) << strerror(errno);
    }
    if (fds[1].revents & POLLOUT) connected = true;
  }
  ASSERT_TRUE(connected && server_ >= 0);
  int err = -1;
  socklen_t len = sizeof(err);
  ASSERT_EQ(rgetsockopt(client_, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  EXPECT_EQ(err, 0);
  EXPECT_EQ(rfcntl(server_, F_GETFL) & O_NONBLOCK, O_NONBLOCK);  // inherited, as stock

  // Nothing to read yet: EAGAIN at once, and rpoll times out.
  std::uint8_t byte;
  EXPECT_EQ(rrecv(server_, &byte, 1, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  pollfd in{server_, POLLIN, 0};
  EXPECT_EQ(rpoll(&in, 1, 50), 0);

  // 8 MiB one way from one thread: the sender runs out of credits or
  // buffer (EAGAIN) and waits in rpoll for the receiver to read.
  const Bytes data = Pattern(8 << 20, 7);
  Bytes got(data.size());
  std::size_t sent = 0, received = 0;
  int short_or_eagain = 0;
  while (received < data.size() && std::chrono::steady_clock::now() < deadline) {
    pollfd fds[2] = {{client_, POLLOUT, 0}, {server_, POLLIN, 0}};
    ASSERT_GE(rpoll(fds, 2, 1000), 0);
    if (sent < data.size()) {
      const ssize_t n = rsend(client_, data.data() + sent, data.size() - sent, 0);
      if (n > 0) {
        if (static_cast<std::size_t>(n) < data.size() - sent) ++short_or_eagain;
        sent += static_cast<std::size_t>(n);
      } else {
        ASSERT_EQ(errno, EAGAIN) << strerror(errno);
        ++short_or_eagain;
      }
    }
    const ssize_t n = rrecv(server_, got.data() + received, got.size() - received, 0);
    if (n > 0) {
      received += static_cast<std::size_t>(n);
    } else {
      ASSERT_EQ(errno, EAGAIN) << strerror(errno);
    }
  }
  ASSERT_EQ(received, data.size());
  EXPECT_TRUE(got == data);
  EXPECT_GT(short_or_eagain, 0) << "8 MiB cannot fit in one rsend: flow control";
}

TEST_F(Rsocket, ShutdownWriteIsEndOfStreamAndTheOtherWayStaysOpen) {
  ConnectPair();
  const Bytes hello = Pattern(5000, 1);
  ASSERT_TRUE(SendAll(client_, hello.data(), hello.size()));
  ASSERT_EQ(rshutdown(client_, SHUT_WR), 0);
  Bytes got(hello.size());
  ASSERT_TRUE(RecvAll(server_, got.data(), got.size()));
  EXPECT_TRUE(got == hello);
  std::uint8_t extra;
  EXPECT_EQ(rrecv(server_, &extra, 1, 0), 0);  // end of stream
  pollfd p{server_, POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 0), 1);  // and readable (EOF) from now on
  // Half-closed: the server still sends, the client still receives.
  const Bytes reply = Pattern(70000, 2);
  ASSERT_TRUE(SendAll(server_, reply.data(), reply.size()));
  Bytes back(reply.size());
  ASSERT_TRUE(RecvAll(client_, back.data(), back.size()));
  EXPECT_TRUE(back == reply);
  // The client can no longer send.
  EXPECT_EQ(rsend(client_, "x", 1, 0), -1);
  EXPECT_EQ(errno, EPIPE);
  ASSERT_EQ(rclose(server_), 0);
  server_ = -1;
  EXPECT_EQ(rrecv(client_, &extra, 1, 0), 0);
}

TEST_F(Rsocket, CloseDeliversEverythingSentBefore) {
  ConnectPair();
  const Bytes data = Pattern(1 << 20, 3);
  std::thread t([&] {
    SendAll(client_, data.data(), data.size());
    rclose(client_);
    client_ = -1;
  });
  Bytes got(data.size());
  const bool ok = RecvAll(server_, got.data(), got.size());
  t.join();
  ASSERT_TRUE(ok);
  EXPECT_TRUE(got == data);
  std::uint8_t extra;
  EXPECT_EQ(rrecv(server_, &extra, 1, 0), 0);
  EXPECT_EQ(rsend(server_, "x", 1, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);
}

TEST_F(Rsocket, PeekVectorsAndSelect) {
  ConnectPair();
  const Bytes data = Pattern(3000, 9);
  iovec out[3] = {{const_cast<std::uint8_t*>(data.data()), 1000},
                  {const_cast<std::uint8_t*>(data.data() + 1000), 0},
                  {const_cast<std::uint8_t*>(data.data() + 1000), 2000}};
  ASSERT_EQ(rwritev(client_, out, 3), 3000);
  fd_set rd;
  FD_ZERO(&rd);
  FD_SET(server_, &rd);
  timeval tv{10, 0};
  ASSERT_EQ(rselect(server_ + 1, &rd, nullptr, nullptr, &tv), 1);
  EXPECT_TRUE(FD_ISSET(server_, &rd));
  Bytes peek(100);
  ASSERT_EQ(rrecv(server_, peek.data(), peek.size(), MSG_PEEK), 100);
  EXPECT_TRUE(std::equal(peek.begin(), peek.end(), data.begin()));
  Bytes got(3000);
  std::size_t have = 0;
  while (have < got.size()) {
    iovec in[2] = {{got.data() + have, std::min<std::size_t>(500, got.size() - have)},
                   {got.data() + have + std::min<std::size_t>(500, got.size() - have),
                    got.size() - have - std::min<std::size_t>(500, got.size() - have)}};
    const ssize_t n = rreadv(server_, in, 2);
    ASSERT_GT(n, 0);
    have += static_cast<std::size_t>(n);
  }
  EXPECT_TRUE(got == data);
}

TEST_F(Rsocket, IomapAndIowrite) {
  // Both ends offer one iomap slot, as riostream does.
  Listen();
  const int one = 1;
  ASSERT_EQ(rsetsockopt(listener_, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof(one)), 0);
  std::thread t([&] { server_ = raccept(listener_, nullptr, nullptr); });
  client_ = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(rsetsockopt(client_, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof(one)), 0);
  const sockaddr_in a = ServerAddr();
  ASSERT_EQ(rconnect(client_, reinterpret_cast<const sockaddr*>(&a), sizeof(a)), 0);
  t.join();
  ASSERT_GE(server_, 0);

  Bytes target(100000, 0);
  ASSERT_EQ(riomap(server_, target.data(), target.size(), PROT_WRITE, 0, 4096), 4096);
  // The mapping travels with the server's next data.
  ASSERT_TRUE(SendAll(server_, reinterpret_cast<const std::uint8_t*>("m"), 1));
  std::uint8_t m;
  ASSERT_TRUE(RecvAll(client_, &m, 1));
  const Bytes data = Pattern(60000, 5);
  EXPECT_EQ(static_cast<ssize_t>(riowrite(client_, data.data(), data.size(), 4096 + 1000, 0)),
            static_cast<ssize_t>(data.size()));
  // Outside every mapping: refused.
  EXPECT_EQ(static_cast<ssize_t>(riowrite(client_, data.data(), 10, 0, 0)), -1);
  EXPECT_EQ(errno, EINVAL);
  // A message sent after the writes arrives after them.
  ASSERT_TRUE(SendAll(client_, reinterpret_cast<const std::uint8_t*>("d"), 1));
  ASSERT_TRUE(RecvAll(server_, &m, 1));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), target.begin() + 1000));
  EXPECT_EQ(target[999], 0);
  EXPECT_EQ(riounmap(server_, target.data(), target.size()), 0);
  EXPECT_EQ(riounmap(server_, target.data(), target.size()), -1);
}

// riostream's pattern: the writer closes right after its last riowrite, the
// reader makes no rsocket call, it only watches its mapped memory. Closing
// must not reset the connection before the reader's engine took the data
// (it did about once in ten runs when rclose destroyed the QP at once).
TEST_F(Rsocket, IowriteThenCloseReachesAPeerThatOnlyWatchesMemory) {
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    Listen();
    const int one = 1;
    ASSERT_EQ(rsetsockopt(listener_, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof(one)), 0);
    std::thread t([&] { server_ = raccept(listener_, nullptr, nullptr); });
    client_ = rsocket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(rsetsockopt(client_, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof(one)), 0);
    const sockaddr_in a = ServerAddr();
    ASSERT_EQ(rconnect(client_, reinterpret_cast<const sockaddr*>(&a), sizeof(a)), 0);
    t.join();
    ASSERT_GE(server_, 0);
    constexpr std::size_t kSize = 256 * 1024;
    Bytes buffer(kSize, 0);
    volatile std::uint8_t* target = buffer.data();  // written behind the compiler's back
    ASSERT_EQ(riomap(server_, buffer.data(), kSize, PROT_WRITE, 0, 0), 0);
    ASSERT_TRUE(SendAll(server_, reinterpret_cast<const std::uint8_t*>("m"), 1));
    std::uint8_t m;
    ASSERT_TRUE(RecvAll(client_, &m, 1));
    Bytes data = Pattern(kSize, 20 + static_cast<std::uint32_t>(round));
    data[kSize - 1] = 0xA5;  // the marker, written last
    for (std::size_t off = 0; off < kSize;) {
      const auto n = static_cast<ssize_t>(riowrite(client_, data.data() + off, kSize - off,
                                                   static_cast<off_t>(off), 0));
      ASSERT_GT(n, 0) << strerror(errno);
      off += static_cast<std::size_t>(n);
    }
    ASSERT_EQ(rclose(client_), 0);
    client_ = -1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    RS_TEST_IGNORE_READS_BEGIN();
    while (target[kSize - 1] != 0xA5 && std::chrono::steady_clock::now() < deadline) {
    }
    const bool arrived = target[kSize - 1] == 0xA5;
    std::size_t first_bad = kSize;
    for (std::size_t i = 0; i < kSize && first_bad == kSize; ++i) {
      if (target[i] != data[i]) first_bad = i;
    }
    RS_TEST_IGNORE_READS_END();
    ASSERT_TRUE(arrived) << "the last riowrite never arrived";
    EXPECT_EQ(first_bad, kSize) << "the mapped memory differs from what was written";
    rclose(server_);
    server_ = -1;
    rclose(listener_);
    listener_ = -1;
  }
}

// More clients at once than the listener's backlog: each is served, each
// connection carries its own data.
TEST_F(Rsocket, ListenerServesMoreClientsThanItsBacklog) {
  listener_ = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener_, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(rbind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(rlisten(listener_, 2), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(rgetsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len), 0);
  constexpr int kClients = 6;
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
      std::uint8_t id = static_cast<std::uint8_t>(c);
      std::uint8_t echo = 0xFF;
      if (fd < 0 || rconnect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
          !SendAll(fd, &id, 1) || !RecvAll(fd, &echo, 1) || echo != id + 100) {
        ++failures;
      }
      if (fd >= 0) rclose(fd);
    });
  }
  for (int c = 0; c < kClients; ++c) {
    const int fd = raccept(listener_, nullptr, nullptr);
    ASSERT_GE(fd, 0) << strerror(errno);
    std::uint8_t id;
    ASSERT_TRUE(RecvAll(fd, &id, 1));
    const std::uint8_t reply = static_cast<std::uint8_t>(id + 100);
    ASSERT_TRUE(SendAll(fd, &reply, 1));
    rclose(fd);
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// The wire as a stock rsockets peer on an iWARP device sees it, checked by
// a peer written here by hand with rdma_cm and verbs from the protocol
// facts (docs/rsockets.md), not with siwx's rsocket code: the connection
// data, the first SGL advertisement (16 octets into entry 1 of our target
// SGL, then the 4-octet Send 0x80000000 | 384), a DATA message after its
// RDMA Write, and the other way: our Write + DATA, then DISCONNECT, then a
// DATA message larger than the ring (refused with EPROTO).
TEST_F(Rsocket, WireSeenByAHandWrittenStockPeer) {
  using siwx::cm::test::Expect;
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* lid = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &lid, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = siwx::cm::test::Loopback4();
  ASSERT_EQ(rdma_bind_addr(lid, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_EQ(rdma_listen(lid, 4), 0);
  port_ = siwx::cm::test::SrcPort(lid);
  std::thread t([&] {
    client_ = rsocket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in dst = ServerAddr();
    if (rconnect(client_, reinterpret_cast<const sockaddr*>(&dst), sizeof(dst)) != 0) {
      rclose(client_);
      client_ = -1;
    }
  });
  const auto req = Expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req.id, nullptr);
  rdma_cm_id* id = req.id;
  ASSERT_GE(req.private_data.size(), wire::kConnDataSize);
  const std::uint8_t* cd = req.private_data.data();
  EXPECT_EQ(cd[0], 1);                                // version
  EXPECT_EQ(cd[1], wire::kFlagIomap);                 // little-endian host, iomap size valid
  EXPECT_EQ((cd[2] << 8) | cd[3], 384);               // credits: the default queue
  EXPECT_EQ(cd[7], 0);                                // no iomap entries by default
  auto be = [&](int off, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | cd[off + i];
    return v;
  };
  EXPECT_EQ(be(20, 4), 2u);                           // target SGL: 2 entries
  EXPECT_EQ(be(36, 4), 65536u);                       // first buffer: half of 128 KiB
  const std::uint64_t their_buf = be(24, 8);
  const std::uint32_t their_buf_key = static_cast<std::uint32_t>(be(32, 4));

  // Our side: a 128 KiB receive ring, a 2-entry target SGL, 64 receives.
  ibv_pd* pd = ibv_alloc_pd(id->verbs);
  ibv_cq* cq = ibv_create_cq(id->verbs, 256, nullptr, nullptr, 0);
  ASSERT_TRUE(pd != nullptr && cq != nullptr);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1;
  qa.cap = {64, 64, 1, 1, 0};
  ASSERT_EQ(rdma_create_qp(id, pd, &qa), 0);
  Bytes ring(1 << 17), table(32), slots(64 * 4), out(64);
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const int local = IBV_ACCESS_LOCAL_WRITE;
  ibv_mr* ring_mr = ibv_reg_mr(pd, ring.data(), ring.size(), remote);
  ibv_mr* table_mr = ibv_reg_mr(pd, table.data(), table.size(), remote);
  ibv_mr* slots_mr = ibv_reg_mr(pd, slots.data(), slots.size(), local);
  ibv_mr* out_mr = ibv_reg_mr(pd, out.data(), out.size(), local);
  ASSERT_TRUE(ring_mr && table_mr && slots_mr && out_mr);
  for (std::uint32_t i = 0; i < 64; ++i) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(&slots[i * 4]), 4, slots_mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    ASSERT_EQ(ibv_post_recv(id->qp, &wr, &bad), 0);
  }
  wire::ConnData mine;
  mine.flags = wire::kFlagIomap;
  mine.credits = 64;
  mine.target_sgl = {reinterpret_cast<std::uintptr_t>(table.data()), table_mr->rkey, 2};
  mine.data_buf = {reinterpret_cast<std::uintptr_t>(ring.data()), ring_mr->rkey, 65536};
  std::uint8_t reply[wire::kConnDataSize];
  wire::EncodeConnData(mine, reply);
  rdma_conn_param p{};
  p.private_data = reply;
  p.private_data_len = sizeof(reply);
  p.responder_resources = static_cast<std::uint8_t>(req.responder_resources);
  p.initiator_depth = static_cast<std::uint8_t>(req.initiator_depth);
  ASSERT_EQ(rdma_accept(id, &p), 0);
  Expect(ch, RDMA_CM_EVENT_ESTABLISHED);
  t.join();
  ASSERT_GE(client_, 0);

  // The next receive completion, and the 32-bit message it carries.
  auto next_msg = [&](std::uint32_t* msg) {
    ibv_wc wc{};
    const bool got = siwx::cm::test::WaitFor(
        [&] {
          // Keep the rsocket's progress going (its credits and adverts).
          pollfd pf{client_, POLLIN, 0};
          (void)rpoll(&pf, 1, 0);
          for (;;) {
            const int n = ibv_poll_cq(cq, 1, &wc);
            if (n <= 0) return false;
            if (wc.opcode & IBV_WC_RECV) return true;  // send completions: skipped
          }
        },
        std::chrono::seconds(10));
    if (!got || wc.status != IBV_WC_SUCCESS || wc.byte_len != 4) return false;
    std::memcpy(msg, &slots[wc.wr_id * 4], 4);  // the sender's host order: little-endian here
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(&slots[wc.wr_id * 4]), 4, slots_mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wc.wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_recv(id->qp, &wr, &bad) == 0;
  };

  // 1. The rsocket advertises the second half of its ring in entry 1.
  std::uint32_t msg = 0;
  ASSERT_TRUE(next_msg(&msg));
  EXPECT_EQ(msg, 0x80000000u | 384u);
  const wire::Sge advert = wire::DecodeSge(&table[16]);
  EXPECT_EQ(advert.addr, their_buf + 65536);
  EXPECT_EQ(advert.key, their_buf_key);
  EXPECT_EQ(advert.length, 65536u);

  // 2. rsend: an RDMA Write at the start of our first buffer, then DATA|5.
  ASSERT_EQ(rsend(client_, "hello", 5, 0), 5);
  ASSERT_TRUE(next_msg(&msg));
  EXPECT_EQ(msg, 5u);
  EXPECT_EQ(std::string(ring.begin(), ring.begin() + 5), "hello");

  // 3. The other way, as stock sends it: Write into their buffer, DATA|6.
  std::memcpy(out.data(), "world!", 6);
  ibv_sge wsge{reinterpret_cast<std::uintptr_t>(out.data()), 6, out_mr->lkey};
  ibv_send_wr w{};
  w.sg_list = &wsge;
  w.num_sge = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.wr.rdma.remote_addr = their_buf;
  w.wr.rdma.rkey = their_buf_key;
  const std::uint32_t data_msg = 6, disconnect = 0xE0000000u;
  std::memcpy(out.data() + 16, &data_msg, 4);
  std::memcpy(out.data() + 20, &disconnect, 4);
  ibv_sge msge{reinterpret_cast<std::uintptr_t>(out.data() + 16), 4, out_mr->lkey};
  ibv_send_wr s{};
  s.sg_list = &msge;
  s.num_sge = 1;
  s.opcode = IBV_WR_SEND;
  w.next = &s;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(id->qp, &w, &bad), 0);
  char got[6] = {};
  ASSERT_EQ(rrecv(client_, got, sizeof(got), MSG_WAITALL), 6) << strerror(errno);
  EXPECT_EQ(std::string(got, 6), "world!");

  // 4. DISCONNECT: end of stream for the rsocket.
  ibv_sge dsge{reinterpret_cast<std::uintptr_t>(out.data() + 20), 4, out_mr->lkey};
  ibv_send_wr d{};
  d.sg_list = &dsge;
  d.num_sge = 1;
  d.opcode = IBV_WR_SEND;
  ASSERT_EQ(ibv_post_send(id->qp, &d, &bad), 0);
  std::uint8_t b;
  EXPECT_EQ(rrecv(client_, &b, 1, 0), 0);

  // 5. A DATA message for more octets than the ring holds: the rsocket
  // closes the connection with EPROTO and nothing else happens.
  const std::uint32_t bogus = 1u << 20;
  std::memcpy(out.data() + 24, &bogus, 4);
  ibv_sge bsge{reinterpret_cast<std::uintptr_t>(out.data() + 24), 4, out_mr->lkey};
  d.sg_list = &bsge;
  ASSERT_EQ(ibv_post_send(id->qp, &d, &bad), 0);
  int so_error = 0;
  EXPECT_TRUE(siwx::cm::test::WaitFor(
      [&] {
        socklen_t len = sizeof(so_error);
        return rgetsockopt(client_, SOL_SOCKET, SO_ERROR, &so_error, &len) == 0 &&
               so_error == EPROTO;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(rrecv(client_, &b, 1, 0), 0);
  EXPECT_EQ(rsend(client_, "x", 1, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);
  rclose(client_);
  client_ = -1;

  rdma_disconnect(id);
  rdma_destroy_qp(id);
  for (ibv_mr* mr : {ring_mr, table_mr, slots_mr, out_mr}) ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(id);
  rdma_destroy_id(lid);
  rdma_destroy_event_channel(ch);
}

// fork(): the child cannot use the parent's rsockets (siwx's verbs objects
// refuse it), fails cleanly, and the parent's connection is untouched.
TEST_F(Rsocket, ChildOfForkCannotDisturbTheParentsConnection) {
  ConnectPair();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: every call fails or does nothing to the parent's stream.
    const bool send_failed = rsend(client_, "child", 5, MSG_DONTWAIT) == -1;
    rclose(client_);
    rclose(server_);
    _exit(send_failed ? 0 : 3);
  }
  int status = -1;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child could send on the parent's rsocket";
  const Bytes data = Pattern(300000, 31);
  std::thread t([&] { SendAll(client_, data.data(), data.size()); });
  Bytes got(data.size());
  ASSERT_TRUE(RecvAll(server_, got.data(), got.size()));
  t.join();
  EXPECT_TRUE(got == data);
  ASSERT_TRUE(SendAll(server_, data.data(), 1000));
  ASSERT_TRUE(RecvAll(client_, got.data(), 1000));
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 1000, data.begin()));
}

TEST_F(Rsocket, RefusedAndUnsupportedCallsFailCleanly) {
  EXPECT_EQ(rsocket(AF_INET, SOCK_DGRAM, 0), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(rsocket(AF_UNIX, SOCK_STREAM, 0), -1);
  EXPECT_EQ(rsocket(AF_IB, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  EXPECT_EQ(rsend(123456, "x", 1, 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rclose(123456), -1);

  client_ = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client_, 0);
  EXPECT_EQ(rsend(client_, "x", 1, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  std::uint8_t b;
  EXPECT_EQ(rrecv(client_, &b, 1, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  int v = 0;
  socklen_t len = sizeof(v);
  EXPECT_EQ(rgetsockopt(client_, SOL_SOCKET, SO_PEERCRED, &v, &len), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(rsetsockopt(client_, SOL_SOCKET, SO_RCVBUF, nullptr, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(static_cast<ssize_t>(riowrite(client_, "x", 1, 0, 0)), -1);
  EXPECT_EQ(errno, ENOTCONN);

  // Nobody listens on this port: refused, at once.
  Listen();
  const sockaddr_in gone = ServerAddr();
  rclose(listener_);
  listener_ = -1;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rconnect(client_, reinterpret_cast<const sockaddr*>(&gone), sizeof(gone)), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(rsend(client_, "x", 1, 0), -1);
}

// The peer process ends without closing: its data stays readable, then
// end of stream; sending fails; nothing hangs.
TEST_F(Rsocket, PeerProcessVanishes) {
  const char* helper_port = std::getenv("SIWX_RSOCKET_TEST_PEER_PORT");
  if (helper_port != nullptr) GTEST_SKIP() << "helper run";
  Listen();
  const std::string env_port = "SIWX_RSOCKET_TEST_PEER_PORT=" + std::to_string(port_);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(env_port.c_str()));
  env.push_back(nullptr);
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  char filter[] = "--gtest_filter=RsocketPeer.SendThenExit";
  char* argv[] = {self, filter, nullptr};
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, self, nullptr, nullptr, argv, env.data()), 0);
  server_ = raccept(listener_, nullptr, nullptr);
  ASSERT_GE(server_, 0) << strerror(errno);
  Bytes got(200000);
  ASSERT_TRUE(RecvAll(server_, got.data(), got.size()));
  EXPECT_TRUE(got == Pattern(got.size(), 11));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::uint8_t b;
  EXPECT_EQ(rrecv(server_, &b, 1, 0), 0);
  const Bytes junk(100000, 1);
  ssize_t r = 0;
  for (int i = 0; i < 100 && r >= 0; ++i) r = rsend(server_, junk.data(), junk.size(), 0);
  EXPECT_EQ(r, -1);
  EXPECT_EQ(errno, ECONNRESET);
}

// Helper of PeerProcessVanishes, run in a child process.
TEST(RsocketPeer, SendThenExit) {
  const char* port = std::getenv("SIWX_RSOCKET_TEST_PEER_PORT");
  if (port == nullptr) GTEST_SKIP() << "run by Rsocket.PeerProcessVanishes";
  const int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(std::atoi(port)));
  ASSERT_EQ(rconnect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const Bytes data = Pattern(200000, 11);
  ASSERT_TRUE(SendAll(fd, data.data(), data.size()));
  // Let the last writes leave, then vanish without rclose.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  _exit(0);
}

}  // namespace
