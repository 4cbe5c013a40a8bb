// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The responder's wait for the initiator's first FPDU (RFC 5044 7.1.2) and,
// peer-to-peer, for its RTR (RFC 6581 7.1), against a raw initiator:
//
//   "4. MPA Responder mode implementations MUST receive and validate at
//    least one FPDU before sending any FPDUs or Markers."
//   "10. MPA implementations SHOULD implement a reasonable timeout while
//    waiting for the entire set of startup frames; ... ULPs SHOULD
//    implement a reasonable timeout while waiting for FPDUs ..."
//                                           (RFC 5044 7.1.2)
//
// A responder holds back everything it has to send until that FPDU has
// arrived and been validated. If it does not come within the stream's
// first_fpdu_timeout the stream is reset: no Terminate, which would be an
// FPDU sent before the first one arrived; every WR is flushed and the QP
// fails (the CM turns the stream's end into DISCONNECTED).
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kFirstFpduTimeout{300};

StreamParams ResponderParams(RtrRole role) {
  StreamParams p = ParamsFor(LinkOptions{});
  p.await_first_fpdu = true;
  p.rtr_role = role;
  p.rtr_message = RtrMessage::kWrite;
  p.first_fpdu_timeout = kFirstFpduTimeout;
  return p;
}

class FirstFpduTest : public ::testing::TestWithParam<RtrRole> {
 protected:
  void Start() {
    link_ = std::make_unique<RawLink>(node_, LinkOptions{}, Transport::kTcp,
                                      ResponderParams(GetParam()), true);
    payload_.Fill(3);
    payload_.Register(node_.memory(), node_.pd, kAllRemote);
    // Posted at once: what a responder that would speak first does.
    SendWorkRequest send = MakeSend(1, SendOpcode::kSend);
    AddSge(send, payload_.addr(), static_cast<std::uint32_t>(payload_.size()), payload_.stag());
    ASSERT_EQ(node_.qp->PostSend(send), PostStatus::kOk);
    ReceiveWorkRequest recv;
    recv.wr_id = 2;
    AddSge(recv, inbox_.addr(), static_cast<std::uint32_t>(inbox_.size()),
           inbox_.Register(node_.memory(), node_.pd, kAllRemote));
    ASSERT_EQ(node_.qp->PostRecv(recv), PostStatus::kOk);
  }
  RawPeer& peer() { return *link_->peer; }
  bool p2p() const { return GetParam() == RtrRole::kAwait; }

  Node node_;
  std::unique_ptr<RawLink> link_;
  Buffer payload_{16};
  Buffer inbox_{64};
};

TEST_P(FirstFpduTest, SilentInitiatorFailsTheResponderWithinTheBoundAndGetsNothing) {
  Watchdog watchdog(std::chrono::seconds(120), "SilentInitiator");
  const auto started = Clock::now();
  Start();

  ASSERT_TRUE(node_.events.WaitFor(AsyncEventType::kStreamClosed, kWait))
      << "the responder waits for the first FPDU forever";
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
  EXPECT_GE(took.count(), kFirstFpduTimeout.count() * 9 / 10);
  EXPECT_LT(took.count(), 10'000) << "the bound is " << kFirstFpduTimeout.count() << " ms";
  EXPECT_TRUE(node_.events.Has(AsyncEventType::kQpFatal));
  EXPECT_EQ(node_.qp->state(), QpState::kError);

  // Both WRs flushed; the Send never started.
  const std::vector<WorkCompletion> sq = WaitCompletions(*node_.send_cq, 1);
  ASSERT_EQ(sq.size(), 1u);
  EXPECT_EQ(sq[0].wr_id, 1u);
  EXPECT_EQ(sq[0].status, WcStatus::kWrFlushErr);
  const std::vector<WorkCompletion> rq = WaitCompletions(*node_.recv_cq, 1);
  ASSERT_EQ(rq.size(), 1u);
  EXPECT_EQ(rq[0].wr_id, 2u);
  EXPECT_EQ(rq[0].status, WcStatus::kWrFlushErr);

  const QpAttributes a = node_.qp->Query();
  EXPECT_FALSE(a.terminate_sent.has_value()) << "a Terminate is an FPDU: rule 4 forbids it";
  ASSERT_TRUE(a.local_error.has_value());
  EXPECT_EQ(*a.local_error, rdmap::TerminateCause::MpaConnectionLost());

  // Not one octet reached the initiator: the stream was reset.
  EXPECT_TRUE(peer().WaitEof());
  EXPECT_TRUE(peer().raw().empty()) << peer().raw().size() << " octets sent before the first FPDU";
}

TEST_P(FirstFpduTest, ResponderSendsOnlyAfterTheFirstFpduAndThenStaysUp) {
  Watchdog watchdog(std::chrono::seconds(120), "FirstFpduArrives");
  Start();
  // Nothing leaves before the initiator's first FPDU.
  peer().Pump(milliseconds(100));
  EXPECT_TRUE(peer().raw().empty());
  EXPECT_EQ(node_.send_cq->size(), 0u);

  if (p2p()) {
    peer().SendHeader(WriteHeader(0, 0));  // the zero-length Write RTR
  } else {
    const std::array<std::uint8_t, 4> hello{'h', 'e', 'l', 'o'};
    peer().SendHeader(SendHeaderOf(1, 0), ByteSpan(hello.data(), hello.size()));
    const std::vector<WorkCompletion> rq = WaitCompletions(*node_.recv_cq, 1);
    ASSERT_EQ(rq.size(), 1u);
    EXPECT_EQ(rq[0].status, WcStatus::kSuccess);
    EXPECT_EQ(rq[0].byte_len, 4u);
  }
  // Now the held Send goes out.
  ASSERT_TRUE(peer().WaitSegments(1));
  EXPECT_EQ(peer().segments()[0].decoded.header.opcode, rdmap::Opcode::kSend);
  const std::vector<WorkCompletion> sq = WaitCompletions(*node_.send_cq, 1);
  ASSERT_EQ(sq.size(), 1u);
  EXPECT_EQ(sq[0].status, WcStatus::kSuccess);

  // Past the timeout the connection is still up.
  EXPECT_TRUE(StaysEmpty(*node_.send_cq, kFirstFpduTimeout * 2));
  EXPECT_EQ(node_.qp->state(), QpState::kRts);
  EXPECT_FALSE(node_.events.Has(AsyncEventType::kStreamClosed));
}

std::string RoleName(const ::testing::TestParamInfo<RtrRole>& p) {
  return p.param == RtrRole::kAwait ? "PeerToPeerRtr" : "FirstFpdu";
}

INSTANTIATE_TEST_SUITE_P(Waits, FirstFpduTest, ::testing::Values(RtrRole::kNone, RtrRole::kAwait),
                         RoleName);

}  // namespace
}  // namespace siwx::engine::testing
