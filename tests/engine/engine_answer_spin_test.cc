// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The answer spin (Qp::AwaitAnswer, EngineConfig::answer_spin): after a
// ping-pong post (alone in the SQ, after something came in) on a QP whose
// stream no CQ poll reads, the poll of the send CQ that returns completions
// reads the stream itself until the answer comes in, so the answer is in
// place when that poll returns, placed by the polling thread. A spin that
// finds nothing, and a caught one, hand the stream back to the progress
// thread; posts that are no ping-pong, an armed CQ and a zero setting never
// spin; threads that ping-pong while the progress thread also runs lose
// nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

// Long enough that a spin in these tests ends only with its answer.
constexpr std::chrono::microseconds kSpinUntilAnswered{20'000'000};

class AnswerSpinTest : public ::testing::Test {
 protected:
  void Start(std::chrono::microseconds spin) {
    NodeOptions options;
    options.answer_spin = spin;
    a_ = std::make_unique<Node>(options);
    b_ = std::make_unique<Node>(options);
    Link(*a_, *b_, Transport::kTcp, {});
    a_target_ = std::make_unique<Buffer>(64);
    b_target_ = std::make_unique<Buffer>(64);
    a_key_ = a_target_->Register(a_->memory(), a_->pd, kAllRemote);
    b_key_ = b_target_->Register(b_->memory(), b_->pd, kAllRemote);
  }
  // Buffers deregister from their node's memory table: they go first.
  void Stop() {
    a_target_.reset();
    b_target_.reset();
    a_.reset();
    b_.reset();
  }
  void TearDown() override { Stop(); }

  // `from` writes `value` (8 octets, inline, signaled) into `target`.
  static SendWorkRequest Write(std::uint64_t value, const Buffer& target, std::uint32_t rkey) {
    SendWorkRequest wr = MakeSend(value, SendOpcode::kRdmaWrite, kSendSignaled | kSendInline);
    std::memcpy(wr.inline_data.data(), &value, sizeof(value));
    wr.inline_length = sizeof(value);
    wr.rkey = rkey;
    wr.remote_addr = target.addr();
    return wr;
  }
  std::uint64_t ValueAt(const Buffer& target) const {
    std::uint64_t value = 0;
    std::memcpy(&value, target.data(), sizeof(value));
    return value;
  }

  // One round of a Write ping-pong driven from this thread, as
  // ib_write_lat's two ends would: a writes `value`, b's progress thread
  // places it, b answers with value + 1, a's progress thread places that.
  // Both completions are taken with plain polls (no spin, no driving).
  void Round(std::uint64_t value) {
    ASSERT_EQ(a_->qp->PostSend(Write(value, *b_target_, b_key_)), PostStatus::kOk);
    ASSERT_EQ(WaitCompletions(*a_->send_cq, 1).size(), 1u);
    ASSERT_TRUE(WaitUntil([&] { return b_->qp->Counters().rx_fpdus >= value; }));
    ASSERT_EQ(b_->qp->PostSend(Write(value + 1, *a_target_, a_key_)), PostStatus::kOk);
    ASSERT_EQ(WaitCompletions(*b_->send_cq, 1).size(), 1u);
    ASSERT_TRUE(WaitUntil([&] { return a_->qp->Counters().rx_fpdus >= value; }));
  }

  // After Round(1) and Round(2) (a's posts in them: the first of the
  // connection, then a ping-pong post): a's next ping-pong post, Write 3,
  // then the poll that returns its completion, into `wcs`. b answers with
  // Write 30 only once that poll spins (read interest is then off a's
  // poller, so only the polling thread can place the answer). Returns what
  // the poll returned.
  std::size_t PostAndAwaitAnswer(std::span<WorkCompletion> wcs) {
    EXPECT_EQ(a_->qp->PostSend(Write(3, *b_target_, b_key_)), PostStatus::kOk);
    std::thread peer([&] {
      const auto deadline = Clock::now() + kWait;
      while (a_->qp->answer_spins() == 0 && Clock::now() < deadline) std::this_thread::yield();
      EXPECT_TRUE(WaitUntil([&] { return b_->qp->Counters().rx_fpdus >= 3; }));
      EXPECT_EQ(b_->qp->PostSend(Write(30, *a_target_, a_key_)), PostStatus::kOk);
    });
    std::size_t got = 0;
    const auto deadline = Clock::now() + kWait;
    while (got == 0 && Clock::now() < deadline) got = a_->send_cq->PollWithProgress(wcs);
    peer.join();
    return got;
  }

  std::unique_ptr<Buffer> a_target_;
  std::unique_ptr<Buffer> b_target_;
  std::uint32_t a_key_ = 0;
  std::uint32_t b_key_ = 0;
  std::unique_ptr<Node> a_;
  std::unique_ptr<Node> b_;
};

TEST_F(AnswerSpinTest, APollReturnsOnlyOnceTheAnswerIsPlaced) {
  Start(kSpinUntilAnswered);
  Round(1);
  Round(2);
  std::array<WorkCompletion, 4> wcs;
  const std::size_t got = PostAndAwaitAnswer(wcs);
  ASSERT_EQ(got, 1u);
  EXPECT_EQ(wcs[0].wr_id, 3u);
  EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
  EXPECT_EQ(a_->qp->answer_spins(), 1u);
  EXPECT_EQ(a_->qp->answers_caught(), 1u);
  // Placed by this thread before the poll returned.
  EXPECT_EQ(ValueAt(*a_target_), 30u);
  EXPECT_TRUE(a_target_->GuardsIntact());
}

TEST_F(AnswerSpinTest, AfterACaughtAnswerTheProgressThreadReadsAgain) {
  Start(kSpinUntilAnswered);
  Round(1);
  Round(2);
  std::array<WorkCompletion, 4> wcs;
  ASSERT_EQ(PostAndAwaitAnswer(wcs), 1u);
  ASSERT_EQ(a_->qp->answers_caught(), 1u);
  const std::uint64_t fpdus = a_->qp->Counters().rx_fpdus;

  // A Send from b that a's application does not drive for (plain polls):
  // a's progress thread reads it.
  Buffer rbuf(64);
  PostRecv(*a_, 7, rbuf, rbuf.Register(a_->memory(), a_->pd, AccessFlags::kLocalWrite));
  SendWorkRequest send = MakeSend(8, SendOpcode::kSend, kSendSignaled | kSendInline);
  send.inline_length = 8;
  ASSERT_EQ(b_->qp->PostSend(send), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_->recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(a_->qp->Counters().rx_fpdus, fpdus + 1);
  EXPECT_EQ(a_->qp->answer_spins(), 1u);
}

TEST_F(AnswerSpinTest, ASpinThatFindsNothingHandsTheStreamBack) {
  constexpr std::chrono::microseconds kSpin{2000};
  Start(kSpin);
  Round(1);
  Round(2);
  ASSERT_EQ(a_->qp->PostSend(Write(3, *b_target_, b_key_)), PostStatus::kOk);
  std::array<WorkCompletion, 4> wcs;
  std::size_t got = 0;
  const auto start = Clock::now();
  const auto deadline = start + kWait;
  while (got == 0 && Clock::now() < deadline) got = a_->send_cq->PollWithProgress(wcs);
  const auto spent = Clock::now() - start;
  ASSERT_EQ(got, 1u);
  EXPECT_EQ(a_->qp->answer_spins(), 1u);
  EXPECT_EQ(a_->qp->answers_caught(), 0u);
  EXPECT_GE(spent, kSpin);  // it spun its whole budget

  // b's answer now comes with nobody polling: a's progress thread reads it.
  const std::uint64_t fpdus = a_->qp->Counters().rx_fpdus;
  ASSERT_EQ(b_->qp->PostSend(Write(30, *a_target_, a_key_)), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*b_->send_cq, 1).size(), 1u);
  EXPECT_TRUE(WaitUntil([&] { return a_->qp->Counters().rx_fpdus == fpdus + 1; }));
  EXPECT_EQ(a_->qp->answer_spins(), 1u);
}

TEST_F(AnswerSpinTest, PostsThatAreNoPingPongNeverSpin) {
  Start(kSpinUntilAnswered);
  // The first post of a connection: nothing came in before it.
  ASSERT_EQ(a_->qp->PostSend(Write(1, *b_target_, b_key_)), PostStatus::kOk);
  ASSERT_EQ(PollProgressFor(*a_->send_cq, 1).size(), 1u);
  // Two posts back to back, nothing received between them: a stream.
  ASSERT_EQ(a_->qp->PostSend(Write(2, *b_target_, b_key_)), PostStatus::kOk);
  ASSERT_EQ(a_->qp->PostSend(Write(3, *b_target_, b_key_)), PostStatus::kOk);
  ASSERT_EQ(PollProgressFor(*a_->send_cq, 2).size(), 2u);
  EXPECT_EQ(a_->qp->answer_spins(), 0u);
}

TEST_F(AnswerSpinTest, AnArmedCqOrAZeroSettingNeverSpins) {
  Start(kSpinUntilAnswered);
  Round(1);
  Round(2);
  // An application that sleeps on its completion channel.
  a_->send_cq->Arm(CqArm::kNextCompletion);
  ASSERT_EQ(a_->qp->PostSend(Write(3, *b_target_, b_key_)), PostStatus::kOk);
  ASSERT_EQ(PollProgressFor(*a_->send_cq, 1).size(), 1u);
  EXPECT_EQ(a_->qp->answer_spins(), 0u);

  Stop();
  Start(std::chrono::microseconds::zero());
  Round(1);
  Round(2);
  Round(3);
  ASSERT_EQ(a_->qp->PostSend(Write(4, *b_target_, b_key_)), PostStatus::kOk);
  ASSERT_EQ(PollProgressFor(*a_->send_cq, 1).size(), 1u);
  EXPECT_EQ(a_->qp->answer_spins(), 0u);
}

// Two application threads ping-pong Sends, each taking its own send
// completion with driving polls (the spin) and the peer's message with
// plain polls of its receive CQ (as an application spinning on memory
// would, it leaves the reading to others): every message arrives once, in
// order, whether a spin or the progress thread read it.
TEST_F(AnswerSpinTest, ThreadsThatPingPongLoseNothingWhoeverReads) {
  Start(std::chrono::microseconds(50));
  constexpr std::uint64_t kRounds = 1000;
  constexpr std::size_t kSlots = 16;
  // Outlive the threads: b's last message lands in a's after they end.
  Buffer a_rbuf(kSlots * 8);
  Buffer b_rbuf(kSlots * 8);
  const std::uint32_t a_rkey = a_rbuf.Register(a_->memory(), a_->pd, AccessFlags::kLocalWrite);
  const std::uint32_t b_rkey = b_rbuf.Register(b_->memory(), b_->pd, AccessFlags::kLocalWrite);
  auto post_recv = [](Node& self, Buffer& rbuf, std::uint32_t key, std::uint64_t id) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = id;
    AddSge(rwr, rbuf.addr() + (id % kSlots) * 8, 8, key);
    return self.qp->PostRecv(rwr) == PostStatus::kOk;
  };
  // Both receive queues are full before either side sends.
  for (std::uint64_t id = 0; id < kSlots; ++id) {
    ASSERT_TRUE(post_recv(*a_, a_rbuf, a_rkey, id));
    ASSERT_TRUE(post_recv(*b_, b_rbuf, b_rkey, id));
  }
  auto side = [&](Node& self, Buffer& rbuf, std::uint32_t key, bool first,
                  std::atomic<bool>& failed) {
    std::array<WorkCompletion, 4> wcs;
    const auto deadline = Clock::now() + kWait;
    for (std::uint64_t round = 0; round < kRounds && !failed; ++round) {
      if (!first || round > 0) {
        // The peer's message `round - (first ? 1 : 0)`, by plain polls.
        std::size_t got = 0;
        // Yielding: on a loaded machine the progress threads need the CPU.
        while (got == 0 && Clock::now() < deadline && !failed) {
          got = self.recv_cq->Poll(wcs);
          if (got == 0) std::this_thread::yield();
        }
        const std::uint64_t expected = first ? round - 1 : round;
        std::uint64_t value = ~expected;
        if (got == 1) std::memcpy(&value, rbuf.data() + (expected % kSlots) * 8, 8);
        if (got != 1 || wcs[0].status != WcStatus::kSuccess || wcs[0].wr_id != expected ||
            value != expected || !post_recv(self, rbuf, key, expected + kSlots)) {
          failed = true;
          return;
        }
      }
      SendWorkRequest send = MakeSend(round, SendOpcode::kSend, kSendSignaled | kSendInline);
      std::memcpy(send.inline_data.data(), &round, 8);
      send.inline_length = 8;
      if (self.qp->PostSend(send) != PostStatus::kOk) {
        failed = true;
        return;
      }
      std::size_t got = 0;
      while (got == 0 && Clock::now() < deadline) got = self.send_cq->PollWithProgress(wcs);
      if (got != 1 || wcs[0].wr_id != round || wcs[0].status != WcStatus::kSuccess) {
        failed = true;
        return;
      }
    }
  };
  std::atomic<bool> a_failed{false};
  std::atomic<bool> b_failed{false};
  std::thread a_side([&] { side(*a_, a_rbuf, a_rkey, true, a_failed); });
  std::thread b_side([&] { side(*b_, b_rbuf, b_rkey, false, b_failed); });
  a_side.join();
  b_side.join();
  EXPECT_FALSE(a_failed.load());
  EXPECT_FALSE(b_failed.load());
  // b's last message was never awaited by a: a's progress thread reads it.
  const auto wc = WaitCompletions(*a_->recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, kRounds - 1);
  EXPECT_FALSE(a_->events.Has(AsyncEventType::kQpFatal));
  EXPECT_FALSE(b_->events.Has(AsyncEventType::kQpFatal));
}

}  // namespace
}  // namespace siwx::engine::testing
