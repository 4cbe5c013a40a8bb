// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Bounded teardown: every way a stream starts ending reaches "every WR
// flushed, QP in Error, stream closed (the CM's DISCONNECTED)" within the
// engine's teardown timeout, even when the peer stops reading and our
// Terminate or FIN is stuck behind a full send buffer; it then ends with
// an RST. And when the peer only half-closes, what we still owe it (the
// Terminate, then FIN) gets out once it reads.
//
// Each test fills the engine's send buffer first: a large RDMA Write that a
// peer with a tiny receive buffer never reads. Then one trigger:
//  - the peer sends a bad FPDU: our Terminate is queued behind the Write;
//  - the peer sends a Terminate: our FIN is queued behind it;
//  - the application disconnects: our FIN is queued behind it;
//  - the peer half-closes at a message boundary: our FIN, likewise;
//  - the peer sends a bad FPDU and half-closes: end-of-file while our
//    Terminate is queued (the receive side used to stop polling the socket
//    altogether, so nothing more was ever sent and nothing flushed).
// Loopback TCP where the peer must tell FIN from RST.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kWriteSize = std::size_t{4} << 20;
constexpr std::uint32_t kBogusRkey = 0x1234'5600;

enum class Trigger {
  kPeerBadFpdu,
  kPeerTerminate,
  kLocalDisconnect,
  kPeerFin,
  kPeerBadFpduThenFin,
};

std::string TriggerName(Trigger t) {
  switch (t) {
    case Trigger::kPeerBadFpdu: return "PeerBadFpdu";
    case Trigger::kPeerTerminate: return "PeerTerminate";
    case Trigger::kLocalDisconnect: return "LocalDisconnect";
    case Trigger::kPeerFin: return "PeerFin";
    case Trigger::kPeerBadFpduThenFin: return "PeerBadFpduThenFin";
  }
  return "?";
}

void SetBuffer(int fd, int option, int bytes) {
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, option, &bytes, sizeof(bytes)), 0);
}

// A node whose send buffer is full: a 4 MiB Write posted, a peer with a
// tiny receive buffer that reads nothing.
class StuckStream {
 public:
  StuckStream(milliseconds teardown_timeout, Transport transport)
      : node_(Options(teardown_timeout)) {
    const std::array<int, 2> fds = Connect(transport);
    SetBuffer(fds[0], SO_SNDBUF, 4096);
    SetBuffer(fds[1], SO_RCVBUF, 4096);
    node_.Bind(fds[0], ParamsFor(LinkOptions{}));
    peer_ = std::make_unique<RawPeer>(fds[1], false, false);
    source_.Fill(7);
    source_.Register(node_.memory(), node_.pd, kAllRemote);
    SendWorkRequest write = MakeSend(1, SendOpcode::kRdmaWrite);
    write.rkey = kBogusRkey;
    write.remote_addr = 0;
    AddSge(write, source_.addr(), static_cast<std::uint32_t>(source_.size()), source_.stag());
    EXPECT_EQ(node_.qp->PostSend(write), PostStatus::kOk);
    EXPECT_TRUE(WaitUntil([&] { return node_.qp->Counters().tx_would_block > 0; }))
        << "the send buffer never filled";
  }

  Node& node() { return node_; }
  RawPeer& peer() { return *peer_; }

  // A Write to an STag the node never registered: a DDP tagged error that
  // the node answers with a Terminate (RFC 5040 7.1).
  void SendBadFpdu() {
    const std::array<std::uint8_t, 4> payload{1, 2, 3, 4};
    peer_->SendHeader(WriteHeader(0xBADBAD00, 0), ByteSpan(payload.data(), payload.size()));
  }
  void SendTerminate() {
    const rdmap::TerminateHeader t =
        rdmap::MakeTerminate(rdmap::TerminateCause::RdmapLocalCatastrophic());
    std::array<std::uint8_t, 128> buf{};
    const rdmap::EncodeResult r = rdmap::EncodeTerminateMessage(t, 1, buf);
    ASSERT_EQ(r.status, rdmap::EncodeStatus::kOk);
    peer_->SendUlpdu(ByteSpan(buf.data(), r.length));
  }
  void HalfClose() { ASSERT_EQ(shutdown(peer_->fd(), SHUT_WR), 0); }

  // Reads the peer's socket to its end: 0 for FIN, else the errno (ECONNRESET
  // for an RST). Only called once the node has given up on the stream.
  int ReadToEnd() {
    std::vector<std::uint8_t> buf(64 * 1024);
    const auto deadline = Clock::now() + kWait;
    while (Clock::now() < deadline) {
      const ssize_t n = recv(peer_->fd(), buf.data(), buf.size(), 0);
      if (n == 0) return 0;
      if (n < 0) return errno;
    }
    return -1;
  }

 private:
  static NodeOptions Options(milliseconds teardown_timeout) {
    NodeOptions o;
    o.teardown_timeout = teardown_timeout;
    return o;
  }

  Node node_;
  std::unique_ptr<RawPeer> peer_;
  Buffer source_{kWriteSize};
};

std::string TriggerParamName(const ::testing::TestParamInfo<Trigger>& p) {
  return TriggerName(p.param);
}

class TeardownBoundTest : public ::testing::TestWithParam<Trigger> {};

TEST_P(TeardownBoundTest, PeerThatNeverReadsIsResetWithinTheBound) {
  Watchdog watchdog(std::chrono::seconds(120), "TeardownBoundTest");
  constexpr milliseconds kBound{300};
  StuckStream s(kBound, Transport::kTcp);
  Node& node = s.node();
  const Trigger trigger = GetParam();

  const auto started = Clock::now();
  switch (trigger) {
    case Trigger::kPeerBadFpdu:
      s.SendBadFpdu();
      break;
    case Trigger::kPeerTerminate:
      s.SendTerminate();
      break;
    case Trigger::kLocalDisconnect:
      ASSERT_TRUE(node.qp->Disconnect());
      break;
    case Trigger::kPeerFin:
      s.HalfClose();
      break;
    case Trigger::kPeerBadFpduThenFin:
      s.SendBadFpdu();
      s.HalfClose();
      break;
  }

  // The stream's end (what the CM turns into DISCONNECTED) comes within the
  // bound, give or take scheduling under sanitizers.
  ASSERT_TRUE(node.events.WaitFor(AsyncEventType::kStreamClosed, kWait))
      << "no stream end: the teardown is not bounded";
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
  EXPECT_GE(took.count(), kBound.count() * 9 / 10) << "the stream was cut before the bound";
  EXPECT_LT(took.count(), 10'000) << "the bound is " << kBound.count() << " ms";

  // The Write never got out: flushed. The QP is in Error.
  const std::vector<WorkCompletion> wcs = WaitCompletions(*node.send_cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(node.qp->state(), QpState::kError);
  const QpAttributes a = node.qp->Query();
  switch (trigger) {
    case Trigger::kPeerBadFpdu:
    case Trigger::kPeerBadFpduThenFin:
      // The Terminate was decided (and given up on with the stream).
      ASSERT_TRUE(a.terminate_sent.has_value());
      EXPECT_EQ(a.terminate_sent->cause, rdmap::TerminateCause::DdpInvalidStag());
      break;
    case Trigger::kPeerTerminate:
      EXPECT_TRUE(a.terminate_received.has_value());
      break;
    case Trigger::kLocalDisconnect:
    case Trigger::kPeerFin:
      // Nothing said why: the lost connection does.
      ASSERT_TRUE(a.local_error.has_value());
      EXPECT_EQ(*a.local_error, rdmap::TerminateCause::MpaConnectionLost());
      break;
  }

  // The peer sees an RST, not a FIN: nothing we owed it was delivered.
  EXPECT_EQ(s.ReadToEnd(), ECONNRESET);
}

INSTANTIATE_TEST_SUITE_P(Triggers, TeardownBoundTest,
                         ::testing::Values(Trigger::kPeerBadFpdu, Trigger::kPeerTerminate,
                                           Trigger::kLocalDisconnect, Trigger::kPeerFin,
                                           Trigger::kPeerBadFpduThenFin),
                         TriggerParamName);

// End-of-file while our Terminate waits behind unsent data: the peer only
// half-closed, so once it reads it gets the FPDUs already framed, the
// Terminate (RFC 5040 7.1: the last message on the stream, and the message
// in progress is not continued) and then FIN. A long bound, so that only
// the delivery can finish this test.
TEST(TeardownDrain, TerminateQueuedAtEndOfFileStillGoesOutWhenThePeerReads) {
  Watchdog watchdog(std::chrono::seconds(120), "TerminateQueuedAtEndOfFile");
  // A socket pair: a loopback TCP receiver with a tiny buffer reopens its
  // window only on TCP's persist timer, which backs off to seconds.
  StuckStream s(milliseconds(600'000), Transport::kSocketPair);
  Node& node = s.node();
  s.SendBadFpdu();
  s.HalfClose();
  // The node has seen the error (and, with it or right after, the FIN).
  ASSERT_TRUE(WaitUntil([&] { return node.qp->state() == QpState::kTerminate; }));

  const std::optional<rdmap::TerminateHeader> t = s.peer().WaitTerminate(kWait);
  ASSERT_TRUE(t.has_value()) << "the queued Terminate never came out (" << s.peer().raw().size()
                             << " octets, " << s.peer().segments().size() << " FPDUs, eof "
                             << s.peer().eof() << ", sent " << node.qp->Counters().tx_octets << ")";
  EXPECT_EQ(t->cause, rdmap::TerminateCause::DdpInvalidStag());
  EXPECT_TRUE(s.peer().WaitEof(kWait));
  EXPECT_EQ(s.peer().parse_error(), mpa::MpaError::kNone);
  // The Write was cut by the Terminate: flushed.
  const std::vector<WorkCompletion> wcs = WaitCompletions(*node.send_cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::kWrFlushErr);
  ASSERT_TRUE(node.events.WaitFor(AsyncEventType::kStreamClosed, kWait));
  EXPECT_EQ(node.qp->state(), QpState::kError);
}

}  // namespace
}  // namespace siwx::engine::testing
