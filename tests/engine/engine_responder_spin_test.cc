// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The progress thread's spin while it answers a Read ping-pong itself
// (common/engine/responder_spin.h, docs/performance-notes.md 3.8): the pure
// policy, and which inbound traffic arms it in a running engine. Only small
// Read Requests queued on the progress thread arm it; Writes and Sends (the
// ib_write_lat / ib_send_lat traffic, where a spinning progress thread
// costs 4x), Read Responses and bulk Reads never do.
#include <gtest/gtest.h>

#include <chrono>

#include "common/engine/responder_spin.h"
#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;
using Wake = ResponderSpin::Wake;

TEST(ResponderSpinPolicy, StartsWithoutSpinning) {
  const ResponderSpin spin(microseconds(50));
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
}

TEST(ResponderSpinPolicy, SmallReadSoonAfterTheWaitArmsTheFullSpin) {
  ResponderSpin spin(microseconds(50));
  spin.OnReadRequest(8, 1);
  EXPECT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
  EXPECT_EQ(spin.budget(), microseconds(50));
}

TEST(ResponderSpinPolicy, WakeupsWithoutReadRequestsNeverArm) {
  // ib_write_lat's and ib_send_lat's progress threads: inbound Writes and
  // Sends come in quick succession, yet no spin.
  ResponderSpin spin(microseconds(50));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(spin.OnWakeupHandled(Wake::kSoon));
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
}

TEST(ResponderSpinPolicy, ReadAfterALongSleepDoesNotArm) {
  // A requester that reads less often than the spin lasts: no spin.
  ResponderSpin spin(microseconds(50));
  EXPECT_FALSE(spin.SleptBriefly(microseconds(51)));
  EXPECT_TRUE(spin.SleptBriefly(microseconds(50)));
  spin.OnReadRequest(8, 1);
  const bool soon = spin.SleptBriefly(microseconds(400));
  EXPECT_FALSE(spin.OnWakeupHandled(soon ? Wake::kSoon : Wake::kLate));
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
}

TEST(ResponderSpinPolicy, BulkReadsDoNotArm) {
  ResponderSpin spin(microseconds(50));
  spin.OnReadRequest(ResponderSpin::kSmallRead + 1, 1);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kSoon));
  spin.OnReadRequest(ResponderSpin::kSmallRead, 1);
  EXPECT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
}

TEST(ResponderSpinPolicy, ReadsWhileResponsesAreOwedStopTheSpin) {
  // ib_read_bw's shape: Requests arrive while earlier ones are unanswered.
  ResponderSpin spin(microseconds(50));
  spin.OnReadRequest(8, 1);
  ASSERT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
  spin.OnReadRequest(8, 1);
  spin.OnReadRequest(8, 2);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kSoon));
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
  // A lone Request again (the stream ended): a ping-pong once more.
  spin.OnReadRequest(8, 1);
  EXPECT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
}

TEST(ResponderSpinPolicy, RequestsWaitingWhenTheSpinBeganTwiceInARowStopIt) {
  // A requester that did not wait for the previous Response (a stream of
  // small Reads, one Request per receive): the spin's first poll finds it,
  // at every wake-up.
  ResponderSpin spin(microseconds(50));
  spin.OnReadRequest(8, 1);
  ASSERT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
  spin.OnReadRequest(8, 1);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kAtOnce));
  EXPECT_EQ(spin.budget(), microseconds(50));  // once: maybe a preemption
  spin.OnReadRequest(8, 1);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kAtOnce));
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
  // Other events found at once (no Read among them) change nothing.
  spin.OnReadRequest(8, 1);
  ASSERT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kAtOnce));
  EXPECT_EQ(spin.budget(), microseconds(50));
}

// A ping-pong whose responder was preempted between a Response and its
// spin (a woken thread took the CPU): the next Request is there at the
// spin's first poll once, then the ping-pong goes on as before. The spin
// keeps going (docs/performance-notes.md 3.15: stopping it there put the
// responder to sleep and cost a second slow iteration).
TEST(ResponderSpinPolicy, OneRequestFoundAtOnceKeepsTheSpin) {
  ResponderSpin spin(microseconds(50));
  spin.OnReadRequest(8, 1);
  ASSERT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
  for (int i = 0; i < 3; ++i) {
    spin.OnReadRequest(8, 1);
    EXPECT_FALSE(spin.OnWakeupHandled(Wake::kAtOnce)) << i;
    EXPECT_EQ(spin.budget(), microseconds(50)) << i;
    spin.OnReadRequest(8, 1);
    EXPECT_TRUE(spin.OnWakeupHandled(Wake::kSoon)) << i;
  }
  // At-once wake-ups without a Read in them do not count toward a stream.
  spin.OnReadRequest(8, 1);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kAtOnce));
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kAtOnce));
  spin.OnReadRequest(8, 1);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kAtOnce));
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
}

TEST(ResponderSpinPolicy, ABulkReadStopsTheSpin) {
  ResponderSpin spin(microseconds(50));
  spin.OnReadRequest(8, 1);
  ASSERT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
  spin.OnReadRequest(64 * 1024, 1);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kSoon));
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
}

TEST(ResponderSpinPolicy, AReadCountsForItsOwnWakeupOnly) {
  ResponderSpin spin(microseconds(50));
  spin.OnReadRequest(8, 1);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kLate));
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kSoon));  // no Read in this one
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
}

TEST(ResponderSpinPolicy, EmptySpinsHalveUntilNone) {
  // Self-limiting: after the Reads stop, 50 + 25 + ... < 100 us of spinning.
  ResponderSpin spin(microseconds(50));
  spin.OnReadRequest(8, 1);
  ASSERT_TRUE(spin.OnWakeupHandled(Wake::kSoon));
  nanoseconds total{0};
  int spins = 0;
  while (spin.budget() > nanoseconds::zero()) {
    total += spin.budget();
    spin.OnSpinFoundNothing();
    ASSERT_LT(++spins, 64);
  }
  EXPECT_LT(total, microseconds(100));
  EXPECT_GE(spins, 5);
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
}

TEST(ResponderSpinPolicy, ZeroMaximumNeverSpins) {
  ResponderSpin spin(nanoseconds::zero());
  spin.OnReadRequest(8, 1);
  EXPECT_FALSE(spin.OnWakeupHandled(Wake::kSoon));
  EXPECT_EQ(spin.budget(), nanoseconds::zero());
}

// Engines whose spin is long enough (1 s) that any wake-up of this test
// counts as soon: whether the spin arms is then decided by the traffic
// alone, not by the machine's speed.
constexpr microseconds kLongSpin{1'000'000};

class ResponderSpinEngineTest : public ::testing::Test {
 protected:
  static NodeOptions Options() {
    NodeOptions o;
    o.responder_spin = kLongSpin;
    return o;
  }
  void SetUp() override { Link(a_, b_, Transport::kTcp, {}); }

  // `count` Reads of `size` octets by a from b, one at a time; a polls its
  // send CQ without driving, so a's progress thread places the responses.
  void ReadOneAtATime(std::size_t size, int count) { ReadOneAtATime(a_, b_, size, count); }
  static void ReadOneAtATime(Node& from, Node& to, std::size_t size, int count) {
    Buffer src(size);
    src.Fill(7);
    const std::uint32_t rkey = src.Register(to.memory(), to.pd, kAllRemote);
    Buffer dst(size, 0);
    const std::uint32_t lkey = dst.Register(from.memory(), from.pd, kAllRemote);
    for (int i = 0; i < count; ++i) {
      SendWorkRequest wr = MakeSend(static_cast<std::uint64_t>(i), SendOpcode::kRdmaRead);
      AddSge(wr, dst.addr(), static_cast<std::uint32_t>(size), lkey);
      wr.rkey = rkey;
      wr.remote_addr = src.addr();
      ASSERT_EQ(from.qp->PostSend(wr), PostStatus::kOk);
      const auto done = WaitCompletions(*from.send_cq, 1);
      ASSERT_EQ(done.size(), 1u);
      ASSERT_EQ(done[0].status, WcStatus::kSuccess);
    }
    EXPECT_TRUE(SameBytes(dst.data(), src.data(), size));
  }

  Node a_{Options()};
  Node b_{Options()};
};

TEST_F(ResponderSpinEngineTest, SmallReadsAnsweredByTheProgressThreadArmItsSpin) {
  ReadOneAtATime(8, 20);
  // b's progress thread answered every Read Request (b's application makes
  // no call): its spin armed, and later Requests found it spinning instead
  // of asleep.
  EXPECT_GE(b_.engine->responder_spin_arms(), 1u);
  EXPECT_GE(b_.engine->responder_spin_catches(), 1u);
  // The requester's progress thread only placed Read Responses.
  EXPECT_EQ(a_.engine->responder_spin_arms(), 0u);
  // b's spin (1 s) is still on: the process's idle pollers wait longer
  // (poll_wait_backoff.h, kMaxPollWaitBesideSpin).
  EXPECT_TRUE(CompletionQueue::AnyResponderSpins());
}

// The spin reads the socket of the QP whose Request armed it instead of
// asking epoll_wait which socket is ready: a Request it catches costs one
// system call fewer (docs/performance-notes.md 3.28).
TEST_F(ResponderSpinEngineTest, TheSpinReadsTheRequestersSocketItself) {
  ReadOneAtATime(8, 20);
  ASSERT_GE(b_.engine->responder_spin_arms(), 1u);
  // One poll in Engine::kPollsPerEventWait is an epoll_wait, which may
  // find a Request first, but not each of the 19 after the first.
  EXPECT_GE(b_.engine->responder_spin_reads(), 1u);
  EXPECT_LE(b_.engine->responder_spin_reads(), b_.engine->responder_spin_catches());
}

// While it reads one QP's socket, the spin still polls the others: a
// Request on another connection of the same engine is caught by the spin
// (1 s long here), not by the sleep after it ran out.
TEST_F(ResponderSpinEngineTest, ASpinOnOneQpStillServesTheOthers) {
  Node c(Options(), a_.engine);
  Node d(Options(), b_.engine);
  Link(c, d, Transport::kTcp, {});
  ReadOneAtATime(8, 20);
  ASSERT_GE(b_.engine->responder_spin_arms(), 1u);
  const std::uint64_t catches_before = b_.engine->responder_spin_catches();
  ReadOneAtATime(c, d, 8, 1);
  EXPECT_GT(b_.engine->responder_spin_catches(), catches_before)
      << "the Request on the other connection waited for the spin to run out";
}

// A stopped engine takes its spin's note back: idle pollers of the process
// return to kMaxPollWait.
TEST_F(ResponderSpinEngineTest, AStoppedEngineNoLongerCountsAsSpinning) {
  ReadOneAtATime(8, 20);
  ASSERT_GE(b_.engine->responder_spin_arms(), 1u);
  ASSERT_TRUE(CompletionQueue::AnyResponderSpins());
  b_.qp->Destroy();
  b_.qp.reset();
  b_.own_engine.reset();
  b_.engine = nullptr;
  EXPECT_FALSE(CompletionQueue::AnyResponderSpins());
}

TEST_F(ResponderSpinEngineTest, BulkReadsDoNotArmTheSpin) {
  ReadOneAtATime(64 * 1024, 10);
  EXPECT_EQ(b_.engine->responder_spin_arms(), 0u);
  EXPECT_EQ(a_.engine->responder_spin_arms(), 0u);
}

TEST_F(ResponderSpinEngineTest, WritesAndSendsDoNotArmTheSpin) {
  // The ib_write_lat / ib_send_lat shape: 8-octet messages both ways,
  // placed by the progress threads.
  Buffer abuf(64);
  const std::uint32_t akey = abuf.Register(a_.memory(), a_.pd, kAllRemote);
  Buffer bbuf(64);
  const std::uint32_t bkey = bbuf.Register(b_.memory(), b_.pd, kAllRemote);
  auto write = [](Node& from, std::uint64_t id, Buffer& to, std::uint32_t rkey) {
    SendWorkRequest wr = MakeSend(id, SendOpcode::kRdmaWrite, kSendSignaled | kSendInline);
    wr.inline_length = 8;
    wr.rkey = rkey;
    wr.remote_addr = to.addr();
    ASSERT_EQ(from.qp->PostSend(wr), PostStatus::kOk);
    ASSERT_EQ(WaitCompletions(*from.send_cq, 1).size(), 1u);
  };
  auto send = [](Node& from, Node& to, std::uint64_t id, Buffer& buf, std::uint32_t key) {
    PostRecv(to, id, buf, key);
    SendWorkRequest wr = MakeSend(id, SendOpcode::kSend, kSendSignaled | kSendInline);
    wr.inline_length = 8;
    ASSERT_EQ(from.qp->PostSend(wr), PostStatus::kOk);
    ASSERT_EQ(WaitCompletions(*to.recv_cq, 1).size(), 1u);
  };
  for (std::uint64_t i = 0; i < 20; ++i) {
    write(a_, i, bbuf, bkey);
    write(b_, i, abuf, akey);
    send(a_, b_, i, bbuf, bkey);
    send(b_, a_, i, abuf, akey);
  }
  EXPECT_EQ(a_.engine->responder_spin_arms(), 0u);
  EXPECT_EQ(b_.engine->responder_spin_arms(), 0u);
  EXPECT_EQ(b_.engine->responder_spin_catches(), 0u);
  EXPECT_FALSE(CompletionQueue::AnyResponderSpins());
}

}  // namespace
}  // namespace siwx::engine::testing
