// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Destroy right after the last completions, with or without an orderly
// disconnect first (rdma_disconnect then rdma_destroy_qp at once, the usual
// rdma_cm pattern; or ibv_destroy_qp alone, as perftest ends its rdma_cm
// control connection), must not lose what TCP already holds: the messages
// whose completions the application saw are still in the sender's socket
// buffer when it destroys the QP, and a slow receiver must get every octet,
// complete the messages and see an orderly end (FIN, not RST). TCP delivers
// what was sent before a FIN; Linux siw releases the socket the same way
// (no RST) when a connected QP is destroyed.
//
// The receiver's progress is held by binding its end of the connection
// to its QP only after the sender destroyed its own: until then nothing
// reads, so the data is in flight in the kernel.
#include <gtest/gtest.h>

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

enum class Traffic { kLargeWrite, kManySends, kLargeWriteNoDisconnect, kManySendsNoDisconnect };

bool IsSends(Traffic t) { return t == Traffic::kManySends || t == Traffic::kManySendsNoDisconnect; }
bool Disconnects(Traffic t) {
  return t != Traffic::kLargeWriteNoDisconnect && t != Traffic::kManySendsNoDisconnect;
}

std::string TrafficName(const ::testing::TestParamInfo<Traffic>& p) {
  switch (p.param) {
    case Traffic::kLargeWrite: return "LargeWrite";
    case Traffic::kManySends: return "ManySends";
    case Traffic::kLargeWriteNoDisconnect: return "LargeWriteNoDisconnect";
    case Traffic::kManySendsNoDisconnect: return "ManySendsNoDisconnect";
  }
  return "?";
}

int SetAndGetBuffer(int fd, int option, int bytes) {
  EXPECT_EQ(setsockopt(fd, SOL_SOCKET, option, &bytes, sizeof(bytes)), 0);
  int effective = 0;
  socklen_t len = sizeof(effective);
  EXPECT_EQ(getsockopt(fd, SOL_SOCKET, option, &effective, &len), 0);
  return effective;
}

class OrderlyDestroyTest : public ::testing::TestWithParam<Traffic> {};

TEST_P(OrderlyDestroyTest, SlowPeerGetsEverythingTcpHeld) {
  Watchdog watchdog(std::chrono::seconds(120), "OrderlyDestroyTest");
  const Traffic traffic = GetParam();
  const LinkOptions link{.crc = true};
  Node sender;
  Node receiver;
  const std::array<int, 2> fds = Connect(Transport::kTcp);
  // A large send buffer takes the whole transfer; a small receive buffer
  // keeps most of it in the sender's kernel until the receiver reads (not
  // a tiny one: its window would make the rest crawl by window probes).
  const int sndbuf = SetAndGetBuffer(fds[0], SO_SNDBUF, 4 << 20);
  SetAndGetBuffer(fds[1], SO_RCVBUF, 64 << 10);
  // What fits in the send buffer with room for the kernel's overhead.
  const std::size_t total = std::clamp<std::size_t>(static_cast<std::size_t>(sndbuf) / 4,
                                                    std::size_t{64} << 10, std::size_t{3} << 20);
  sender.Bind(fds[0], ParamsFor(link));

  Buffer source(total);
  source.Fill(11);
  source.Register(sender.memory(), sender.pd, kAllRemote);
  Buffer target(total);
  target.Register(receiver.memory(), receiver.pd, kAllRemote);

  constexpr std::size_t kSendSize = 16 << 10;
  const std::size_t sends = IsSends(traffic) ? total / kSendSize : 1;
  std::vector<std::unique_ptr<Buffer>> landing;
  for (std::size_t i = 0; i < sends; ++i) {
    landing.push_back(std::make_unique<Buffer>(kSendSize));
    landing.back()->Register(receiver.memory(), receiver.pd, kAllRemote);
    PostRecv(receiver, 100 + i, *landing.back(), landing.back()->stag());
  }

  std::size_t posted = 0;
  if (IsSends(traffic)) {
    for (std::size_t i = 0; i < sends; ++i) {
      SendWorkRequest send = MakeSend(i + 1, SendOpcode::kSend);
      AddSge(send, source.addr() + i * kSendSize, kSendSize, source.stag());
      ASSERT_EQ(sender.qp->PostSend(send), PostStatus::kOk);
      ++posted;
    }
  } else {
    SendWorkRequest write = MakeSend(1, SendOpcode::kRdmaWrite);
    write.rkey = target.stag();
    write.remote_addr = target.addr();
    AddSge(write, source.addr(), static_cast<std::uint32_t>(total), source.stag());
    ASSERT_EQ(sender.qp->PostSend(write), PostStatus::kOk);
    // The Send after it tells the receiver the Write is complete (RFC 5040 5.5).
    SendWorkRequest send = MakeSend(2, SendOpcode::kSend);
    AddSge(send, source.addr(), kSendSize, source.stag());
    ASSERT_EQ(sender.qp->PostSend(send), PostStatus::kOk);
    posted = 2;
  }
  // Every WR completed: TCP has taken all of it (the socket holds it).
  const std::vector<WorkCompletion> sent = WaitCompletions(*sender.send_cq, posted);
  ASSERT_EQ(sent.size(), posted);
  for (const WorkCompletion& wc : sent) {
    ASSERT_EQ(wc.status, WcStatus::kSuccess);
  }

  // The point of the test: most of it is still in the sender's kernel.
  int unsent = 0;
  ASSERT_EQ(ioctl(fds[0], SIOCOUTQ, &unsent), 0);
  ASSERT_GT(unsent, 0) << "the receiver's kernel took everything: nothing is in flight";

  if (Disconnects(traffic)) {
    ASSERT_TRUE(sender.qp->Disconnect());
  }
  sender.qp->Destroy();  // at once, as rdma_disconnect + rdma_destroy_qp do

  // Now the receiver starts reading.
  receiver.Bind(fds[1], ParamsFor(link));
  const std::vector<WorkCompletion> got = WaitCompletions(*receiver.recv_cq, sends);
  ASSERT_EQ(got.size(), sends) << "receiver read " << receiver.qp->Counters().rx_octets
                               << " octets, state " << static_cast<int>(receiver.qp->state());
  for (std::size_t i = 0; i < sends; ++i) {
    EXPECT_EQ(got[i].status, WcStatus::kSuccess) << "receive " << i;
    EXPECT_EQ(got[i].wr_id, 100 + i);
    EXPECT_EQ(got[i].byte_len, kSendSize);
  }
  if (IsSends(traffic)) {
    for (std::size_t i = 0; i < sends; ++i) {
      ASSERT_TRUE(SameBytes(landing[i]->data(), source.data() + i * kSendSize, kSendSize))
          << "Send " << i;
    }
  } else {
    EXPECT_TRUE(SameBytes(target.data(), source.data(), total));
  }
  // The orderly end: the sender's FIN at a message boundary, no RST, no
  // lost connection, no Terminate.
  ASSERT_TRUE(receiver.events.WaitFor(AsyncEventType::kStreamClosed));
  const QpAttributes a = receiver.qp->Query();
  EXPECT_EQ(a.state, QpState::kError);
  EXPECT_FALSE(a.local_error.has_value())
      << rdmap::DescribeTerminateCause(*a.local_error);
  EXPECT_FALSE(a.terminate_received.has_value());
  EXPECT_FALSE(a.terminate_sent.has_value());
}

// Where the FPDUs in `wire` (CRC on, no markers) end: the walk stops at the
// first one that is not whole.
std::size_t WholeFpduOctets(const std::vector<std::uint8_t>& wire) {
  std::size_t at = 0;
  while (at + 2 <= wire.size()) {
    const std::size_t ulpdu = (std::size_t{wire[at]} << 8) | wire[at + 1];
    // RFC 5044 4.1: length field, ULPDU, pad to a multiple of 4, CRC.
    const std::size_t fpdu = ((2 + ulpdu + 3) & ~std::size_t{3}) + 4;
    if (at + fpdu > wire.size()) break;
    at += fpdu;
  }
  return at;
}

// Destroy while a large Write is still being written, right after the
// disconnect: the WRs not yet sent may be dropped, but the stream must
// never end with a FIN inside an FPDU (RFC 5044 4.1 framing: the peer
// would find a truncated FPDU, not a clean end). Either every FPDU that
// reached the peer is whole and then FIN comes, or the stream is reset.
// Repeated: when destroy finds room in the socket it finishes a started
// FPDU and closes gracefully, when not it resets.
TEST(OrderlyDestroyMidMessage, FinNeverCutsAnFpdu) {
  Watchdog watchdog(std::chrono::seconds(120), "OrderlyDestroyMidMessage");
  constexpr int kRounds = 12;
  constexpr std::size_t kWriteSize = std::size_t{2} << 20;
  int fins = 0;
  int resets = 0;
  int cut_messages = 0;  // the peer got part of the Write only
  for (int round = 0; round < kRounds; ++round) {
    Node sender;
    const std::array<int, 2> fds = Connect(Transport::kTcp);
    // Small buffers and a reader that pauses: the socket is full at times,
    // so destroy may find an FPDU partly written and no room for its rest.
    SetAndGetBuffer(fds[0], SO_SNDBUF, 64 << 10);
    SetAndGetBuffer(fds[1], SO_RCVBUF, 64 << 10);
    sender.Bind(fds[0], ParamsFor(LinkOptions{.crc = true}));
    std::vector<std::uint8_t> wire;
    int end = -1;  // 0 FIN, else the errno
    std::thread reader([&] {
      std::vector<std::uint8_t> buf(16 << 10);
      for (;;) {
        std::this_thread::sleep_for(std::chrono::microseconds(50 * (round % 4)));
        const ssize_t n = recv(fds[1], buf.data(), buf.size(), 0);
        if (n == 0) {
          end = 0;
          break;
        }
        if (n < 0) {
          if (errno == EINTR) continue;
          end = errno;
          break;
        }
        wire.insert(wire.end(), buf.begin(), buf.begin() + n);
      }
    });
    Buffer source(kWriteSize);
    source.Fill(static_cast<std::uint32_t>(round));
    source.Register(sender.memory(), sender.pd, kAllRemote);
    SendWorkRequest write = MakeSend(1, SendOpcode::kRdmaWrite);
    write.rkey = 0x1234'5600;
    AddSge(write, source.addr(), static_cast<std::uint32_t>(kWriteSize), source.stag());
    ASSERT_EQ(sender.qp->PostSend(write), PostStatus::kOk);
    // Part of it is out; with the reader keeping up, likely not all.
    ASSERT_TRUE(WaitUntil([&] { return sender.qp->Counters().tx_octets > 100'000; }));
    ASSERT_TRUE(sender.qp->Disconnect());
    sender.qp->Destroy();
    reader.join();
    close(fds[1]);
    ASSERT_TRUE(end == 0 || end == ECONNRESET) << "round " << round << ": " << end;
    if (wire.size() < kWriteSize) ++cut_messages;
    if (end == 0) {
      ++fins;
      EXPECT_EQ(WholeFpduOctets(wire), wire.size())
          << "round " << round << ": FIN after " << wire.size() << " octets, inside an FPDU";
    } else {
      ++resets;
    }
  }
  std::printf("orderly destroy mid-message: %d FIN, %d RST, %d Writes cut, in %d rounds\n",
              fins, resets, cut_messages, kRounds);
}

INSTANTIATE_TEST_SUITE_P(Traffic, OrderlyDestroyTest,
                         ::testing::Values(Traffic::kLargeWrite, Traffic::kManySends,
                                           Traffic::kLargeWriteNoDisconnect,
                                           Traffic::kManySendsNoDisconnect),
                         TrafficName);

}  // namespace
}  // namespace siwx::engine::testing
