// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The engine's part of the out-of-band QP connect
// (docs/out-of-band-connect.md): Sends posted in RTR after the application
// asked for RTS wait for the stream and go out first, in order; and a QP
// told to end as an InfiniBand RC QP closes with FIN on Destroy, keeps its
// receives when the peer closes in order, and holds its Sends for the
// transport timeout.
#include <cstdint>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

constexpr std::uint32_t kMsg = 1024;

SendWorkRequest SendOf(std::uint64_t wr_id, Buffer& buf, std::uint32_t key) {
  SendWorkRequest wr = MakeSend(wr_id, SendOpcode::kSend);
  AddSge(wr, buf.addr(), kMsg, key);
  return wr;
}

// Waits for one completion on `cq` and checks which WR it is and how it ended.
void ExpectCompletion(CompletionQueue& cq, std::uint64_t wr_id, WcStatus status) {
  const std::vector<WorkCompletion> wc = WaitCompletions(cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, wr_id);
  EXPECT_EQ(wc[0].status, status);
}

TEST(EngineOobTest, SendsPostedInRtrWaitForTheStreamAndGoFirstInOrder) {
  Node a;
  Node b;
  ASSERT_EQ(a.qp->Modify(QpState::kRtr), QpStatus::kOk);
  ASSERT_EQ(b.qp->Modify(QpState::kRtr), QpStatus::kOk);
  std::vector<std::unique_ptr<Buffer>> src;
  std::vector<std::uint32_t> src_keys;
  for (std::uint32_t i = 0; i < 3; ++i) {
    src.push_back(std::make_unique<Buffer>(kMsg));
    src.back()->Fill(100 + i);
    src_keys.push_back(src.back()->Register(a.memory(), a.pd, AccessFlags::kLocalWrite));
  }
  // Without the request for RTS a send in RTR is refused, as verbs says.
  EXPECT_EQ(a.qp->PostSend(SendOf(1, *src[0], src_keys[0])), PostStatus::kInvalidState);
  a.qp->QueueSendsBeforeStream();
  ASSERT_EQ(a.qp->PostSend(SendOf(1, *src[0], src_keys[0])), PostStatus::kOk);
  ASSERT_EQ(a.qp->PostSend(SendOf(2, *src[1], src_keys[1])), PostStatus::kOk);
  EXPECT_TRUE(StaysEmpty(*a.send_cq, std::chrono::milliseconds(50)));

  std::vector<std::unique_ptr<Buffer>> dst;
  for (std::uint32_t i = 0; i < 3; ++i) {
    dst.push_back(std::make_unique<Buffer>(kMsg));
    PostRecv(b, 10 + i, *dst.back(), dst.back()->Register(b.memory(), b.pd,
                                                          AccessFlags::kLocalWrite));
  }
  Link(a, b, Transport::kTcp, {});
  ASSERT_EQ(a.qp->PostSend(SendOf(3, *src[2], src_keys[2])), PostStatus::kOk);

  const std::vector<WorkCompletion> sent = WaitCompletions(*a.send_cq, 3);
  ASSERT_EQ(sent.size(), 3u);
  const std::vector<WorkCompletion> got = WaitCompletions(*b.recv_cq, 3);
  ASSERT_EQ(got.size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(sent[i].wr_id, i + 1);
    EXPECT_EQ(sent[i].status, WcStatus::kSuccess);
    EXPECT_EQ(got[i].wr_id, 10 + i);
    EXPECT_EQ(got[i].status, WcStatus::kSuccess);
    EXPECT_TRUE(SameBytes(dst[i]->data(), src[i]->data(), kMsg));
  }
}

TEST(EngineOobTest, QueuedSendsFlushWhenTheQpFailsBeforeTheStream) {
  Node a;
  ASSERT_EQ(a.qp->Modify(QpState::kRtr), QpStatus::kOk);
  a.qp->QueueSendsBeforeStream();
  Buffer src(kMsg);
  const std::uint32_t key = src.Register(a.memory(), a.pd, AccessFlags::kLocalWrite);
  ASSERT_EQ(a.qp->PostSend(SendOf(1, src, key)), PostStatus::kOk);
  ASSERT_EQ(a.qp->Modify(QpState::kError), QpStatus::kOk);
  ExpectCompletion(*a.send_cq, 1, WcStatus::kWrFlushErr);
}

// The peer destroys its QP after its last Send: that Send arrives, the
// stream ends with FIN (no RST that could drop it), and the receives still
// posted here stay outstanding until the application moves the QP to ERR.
TEST(EngineOobTest, IbTeardownDeliversTheLastMessageAndKeepsReceives) {
  auto a = std::make_unique<Node>();
  Node b;
  a->qp->UseIbTeardown();
  b.qp->UseIbTeardown();
  // Registered in a's engine: freed before a goes.
  auto src = std::make_unique<Buffer>(kMsg);
  src->Fill(7);
  const std::vector<std::uint8_t> sent(src->data(), src->data() + kMsg);
  const std::uint32_t src_key = src->Register(a->memory(), a->pd, AccessFlags::kLocalWrite);
  Buffer dst0(kMsg);
  Buffer dst1(kMsg);
  PostRecv(b, 20, dst0, dst0.Register(b.memory(), b.pd, AccessFlags::kLocalWrite));
  PostRecv(b, 21, dst1, dst1.Register(b.memory(), b.pd, AccessFlags::kLocalWrite));
  Link(*a, b, Transport::kTcp, {});
  ASSERT_EQ(a->qp->PostSend(SendOf(1, *src, src_key)), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*a->send_cq, 1).size(), 1u);
  src.reset();
  a.reset();  // Destroy, then the engine goes

  const std::vector<WorkCompletion> got = WaitCompletions(*b.recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 20u);
  EXPECT_EQ(got[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(SameBytes(dst0.data(), sent.data(), kMsg));
  // The orderly close ends the stream: the QP goes to ERR without a fatal
  // event, and receive 21 is kept.
  const Clock::time_point deadline = Clock::now() + kWait;
  while (b.qp->state() != QpState::kError && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(b.qp->state(), QpState::kError);
  EXPECT_FALSE(b.events.Has(AsyncEventType::kQpFatal));
  EXPECT_TRUE(StaysEmpty(*b.recv_cq, std::chrono::milliseconds(100)));
  ASSERT_EQ(b.qp->Modify(QpState::kError), QpStatus::kOk);
  ExpectCompletion(*b.recv_cq, 21, WcStatus::kWrFlushErr);
}

// Without UseIbTeardown the peer's close flushes the receives at once, as
// the iWARP verbs say (the QP goes to ERR, WRs flush), and so a Send posted
// after it.
TEST(EngineOobTest, WithoutIbTeardownThePeersCloseFlushesReceivesAndSends) {
  auto a = std::make_unique<Node>();
  Node b;
  b.qp->SetIbRetryTimeout(std::chrono::seconds(30));  // not used without UseIbTeardown
  Buffer dst(kMsg);
  PostRecv(b, 30, dst, dst.Register(b.memory(), b.pd, AccessFlags::kLocalWrite));
  Link(*a, b, Transport::kTcp, {});
  ASSERT_TRUE(a->qp->Disconnect());
  ExpectCompletion(*b.recv_cq, 30, WcStatus::kWrFlushErr);
  Buffer src(kMsg);
  ASSERT_EQ(b.qp->PostSend(SendOf(31, src, src.Register(b.memory(), b.pd,
                                                         AccessFlags::kLocalWrite))),
            PostStatus::kOk);
  ExpectCompletion(*b.send_cq, 31, WcStatus::kWrFlushErr);
}

// b's peer destroys its QP (an orderly end); b waits until its QP is in ERR.
void PeerDestroysItsQp(std::unique_ptr<Node>& a, Node& b) {
  a->qp->UseIbTeardown();
  b.qp->UseIbTeardown();
  Link(*a, b, Transport::kTcp, {});
  a.reset();
  const Clock::time_point deadline = Clock::now() + kWait;
  while (b.qp->state() != QpState::kError && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(b.qp->state(), QpState::kError);
}

// With UseIbTeardown a Send posted after the peer's orderly end waits as an
// InfiniBand Send to a destroyed QP waits for its acknowledgement: for the
// transport timeout (SetIbRetryTimeout), then it completes with
// RetryExcErr and the one behind it flushes. The QP is in error from then
// on: a later Send flushes at once. (A flush at once failed ibv_srq_pingpong
// -q 4, which posts Sends its peer never takes and polls them with its last
// message.)
TEST(EngineOobTest, IbTeardownHoldsSendsAfterThePeersEndForTheRetryTimeout) {
  constexpr auto kRetryTimeout = std::chrono::milliseconds(300);
  auto a = std::make_unique<Node>();
  Node b;
  b.qp->SetIbRetryTimeout(kRetryTimeout);
  ASSERT_NO_FATAL_FAILURE(PeerDestroysItsQp(a, b));
  Buffer src(kMsg);
  const std::uint32_t key = src.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  const Clock::time_point posted = Clock::now();
  ASSERT_EQ(b.qp->PostSend(SendOf(40, src, key)), PostStatus::kOk);
  ASSERT_EQ(b.qp->PostSend(SendOf(41, src, key)), PostStatus::kOk);
  const std::vector<WorkCompletion> wc = WaitCompletions(*b.send_cq, 2);
  const Clock::duration waited = Clock::now() - posted;
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_GE(waited, kRetryTimeout);
  EXPECT_EQ(wc[0].wr_id, 40u);
  EXPECT_EQ(wc[0].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(wc[1].wr_id, 41u);
  EXPECT_EQ(wc[1].status, WcStatus::kWrFlushErr);
  EXPECT_FALSE(b.events.Has(AsyncEventType::kQpFatal));

  ASSERT_EQ(b.qp->PostSend(SendOf(42, src, key)), PostStatus::kOk);
  ExpectCompletion(*b.send_cq, 42, WcStatus::kWrFlushErr);
}

// Timeout 0 is InfiniBand's "retry for ever": held Sends wait until the
// application moves the QP to ERR, which flushes them.
TEST(EngineOobTest, IbTeardownWithoutATimeoutHoldsSendsUntilModifyToError) {
  auto a = std::make_unique<Node>();
  Node b;
  ASSERT_NO_FATAL_FAILURE(PeerDestroysItsQp(a, b));
  Buffer src(kMsg);
  const std::uint32_t key = src.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  ASSERT_EQ(b.qp->PostSend(SendOf(50, src, key)), PostStatus::kOk);
  EXPECT_TRUE(StaysEmpty(*b.send_cq, std::chrono::milliseconds(200)));
  ASSERT_EQ(b.qp->Modify(QpState::kError), QpStatus::kOk);
  ExpectCompletion(*b.send_cq, 50, WcStatus::kWrFlushErr);
}

}  // namespace
}  // namespace siwx::engine::testing
