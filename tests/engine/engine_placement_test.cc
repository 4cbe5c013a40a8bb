// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Placement of the progress thread (common/engine/placement.h): with
// ProgressAffinity::kAway it keeps off the CPU an application thread posts
// from while that thread leaves the QP's inbound work to it, returns to every
// CPU once the application reads the stream itself (read lease), and with
// kAny its affinity is never touched. Needs two allowed CPUs (else skipped).
// And the progress thread carries a name of its own, whatever the CPUs.
#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>
#include <string>
#include <thread>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

cpu_set_t AffinityOf(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(tid, sizeof(set), &set), 0);
  return set;
}

// Waits until the progress thread's affinity satisfies `pred`, waking it
// every 2 ms (it applies a hint that stayed the same for
// ProgressPlacement::kSettle, at its wake-ups).
template <typename Pred>
bool ProgressAffinityBecomes(Engine& engine, Pred pred) {
  const auto deadline = Clock::now() + kWait;
  while (Clock::now() < deadline) {
    if (pred(AffinityOf(engine.progress_thread_tid()))) return true;
    engine.WakeProgressThread();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred(AffinityOf(engine.progress_thread_tid()));
}

class PlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(sched_getaffinity(0, sizeof(allowed_), &allowed_), 0);
    if (CPU_COUNT(&allowed_) < 2) GTEST_SKIP() << "needs two allowed CPUs";
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &allowed_)) {
        cpu_ = cpu;
        break;
      }
    }
  }
  void TearDown() override { sched_setaffinity(0, sizeof(allowed_), &allowed_); }

  // Pins the calling (test) thread to cpu_.
  void PinToCpu() {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu_, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  }

  // One signaled 8-octet inline Send from a to b (a receive posted at b).
  void SendOne(Node& a, Node& b, std::uint64_t id, Buffer& rbuf, std::uint32_t rkey) {
    PostRecv(b, id, rbuf, rkey);
    SendWorkRequest wr = MakeSend(id, SendOpcode::kSend, kSendSignaled | kSendInline);
    wr.inline_length = 8;
    ASSERT_EQ(a.qp->PostSend(wr), PostStatus::kOk);
  }

  // a sends to b, b answers, a sees the answer without driving (its
  // progress thread placed it): the next post of a is a ping-pong post.
  void Exchange(Node& a, Node& b, std::uint64_t id, Buffer& rbuf, std::uint32_t rkey,
                Buffer& abuf, std::uint32_t akey) {
    SendOne(a, b, id, rbuf, rkey);
    ASSERT_EQ(WaitCompletions(*b.recv_cq, 1).size(), 1u);
    SendOne(b, a, id + 1, abuf, akey);
    ASSERT_EQ(WaitCompletions(*a.recv_cq, 1).size(), 1u);
  }

  cpu_set_t allowed_{};
  int cpu_ = 0;
};

TEST_F(PlacementTest, ProgressThreadKeepsOffTheCpuTheApplicationPostsFrom) {
  Node a;
  Node b;
  Link(a, b, Transport::kTcp, {});
  Buffer rbuf(64);
  const std::uint32_t rkey = rbuf.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  Buffer abuf(64);
  const std::uint32_t akey = abuf.Register(a.memory(), a.pd, AccessFlags::kLocalWrite);
  PinToCpu();
  Exchange(a, b, 1, rbuf, rkey, abuf, akey);
  SendOne(a, b, 3, rbuf, rkey);  // after b's answer, into an idle SQ

  EXPECT_TRUE(ProgressAffinityBecomes(*a.engine, [&](const cpu_set_t& set) {
    if (CPU_ISSET(cpu_, &set)) return false;
    cpu_set_t expected = allowed_;
    CPU_CLR(cpu_, &expected);
    return CPU_EQUAL(&set, &expected);  // every other allowed CPU
  }));
  // The message still arrives (b's progress thread places it).
  EXPECT_EQ(WaitCompletions(*b.recv_cq, 1).size(), 1u);
}

TEST_F(PlacementTest, ReadLeaseReturnsTheProgressThreadToEveryCpu) {
  Node a;
  Node b;
  Link(a, b, Transport::kTcp, {});
  Buffer rbuf(64);
  const std::uint32_t rkey = rbuf.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  Buffer abuf(64);
  const std::uint32_t akey = abuf.Register(a.memory(), a.pd, AccessFlags::kLocalWrite);
  PinToCpu();
  Exchange(a, b, 1, rbuf, rkey, abuf, akey);
  SendOne(a, b, 3, rbuf, rkey);
  ASSERT_EQ(WaitCompletions(*b.recv_cq, 1).size(), 1u);
  ASSERT_TRUE(ProgressAffinityBecomes(
      *a.engine, [&](const cpu_set_t& set) { return !CPU_ISSET(cpu_, &set); }));

  // a's application now waits for b's Send by polling its receive CQ with a
  // receive posted: the first empty poll reads the stream itself (and takes
  // the read lease), before b sends anything.
  PostRecv(a, 5, abuf, akey);
  std::array<WorkCompletion, 4> wcs;
  ASSERT_TRUE(WaitUntil([&] {
    EXPECT_EQ(a.recv_cq->PollWithProgress(wcs), 0u);
    return a.qp->poll_receive_turns() > 0;  // a turn taken: the lease with it
  }));
  SendWorkRequest wr = MakeSend(3, SendOpcode::kSend, kSendSignaled | kSendInline);
  wr.inline_length = 8;
  ASSERT_EQ(b.qp->PostSend(wr), PostStatus::kOk);
  const auto deadline = Clock::now() + kWait;
  std::size_t got = 0;
  while (got == 0 && Clock::now() < deadline) got = a.recv_cq->PollWithProgress(wcs);
  ASSERT_EQ(got, 1u);
  EXPECT_EQ(wcs[0].wr_id, 5u);
  EXPECT_TRUE(ProgressAffinityBecomes(
      *a.engine, [&](const cpu_set_t& set) { return CPU_EQUAL(&set, &allowed_); }));
}

TEST_F(PlacementTest, PostsWithNothingReceivedBetweenThemLeaveTheProgressThreadAlone) {
  Node a;
  Node b;
  Link(a, b, Transport::kTcp, {});
  Buffer rbuf(64);
  const std::uint32_t rkey = rbuf.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  PinToCpu();
  // A stream: every post finds the SQ idle (inline Sends complete at once)
  // but nothing comes back between them.
  for (std::uint64_t id = 1; id <= 4; ++id) {
    SendOne(a, b, id, rbuf, rkey);
    ASSERT_EQ(WaitCompletions(*a.send_cq, 1).size(), 1u);
    a.engine->WakeProgressThread();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(WaitCompletions(*b.recv_cq, 4).size(), 4u);
  a.engine->WakeProgressThread();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const cpu_set_t set = AffinityOf(a.engine->progress_thread_tid());
  EXPECT_TRUE(CPU_EQUAL(&set, &allowed_));
}

TEST_F(PlacementTest, AnyNeverTouchesTheProgressThread) {
  NodeOptions options;
  options.progress_affinity = ProgressAffinity::kAny;
  Node a(options);
  Node b;
  Link(a, b, Transport::kTcp, {});
  Buffer rbuf(64);
  const std::uint32_t rkey = rbuf.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  PinToCpu();
  for (std::uint64_t id = 1; id <= 4; ++id) {
    SendOne(a, b, id, rbuf, rkey);
    a.engine->WakeProgressThread();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(WaitCompletions(*b.recv_cq, 4).size(), 4u);
  const cpu_set_t set = AffinityOf(a.engine->progress_thread_tid());
  EXPECT_TRUE(CPU_EQUAL(&set, &allowed_));
}

// ProgressPlacement alone, on the test thread in the progress thread's
// role: a note taken on a thread pinned to `cpu`.
void NoteFrom(ProgressPlacement& placement, int cpu) {
  std::thread poster([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    placement.NoteApplicationCpu();
  });
  poster.join();
}

// A ping-pong wakes the progress thread once a message, and every message
// before it moves waits behind a spinning application (about 20 us instead
// of 6 in ib_write_lat): it moves after kSettleWakeups wake-ups that saw the
// same note, however little time they took (before: only after 1 ms, about
// 24 slow iterations; docs/performance-notes.md 3.21).
TEST_F(PlacementTest, ANoteSeenAtEnoughWakeupsInARowMovesTheThreadAtOnce) {
  ProgressPlacement placement(ProgressAffinity::kAway);
  placement.Start();
  NoteFrom(placement, cpu_);
  placement.Apply();  // first sight of the note
  for (int i = 1; i < ProgressPlacement::kSettleWakeups; ++i) placement.Apply();
  EXPECT_EQ(placement.avoided_cpu(), -1) << "moved before kSettleWakeups wake-ups";
  placement.Apply();
  EXPECT_EQ(placement.avoided_cpu(), cpu_);
  const cpu_set_t set = AffinityOf(0);
  EXPECT_FALSE(CPU_ISSET(cpu_, &set));
}

// The count is of wake-ups in a row: a note that changes at every wake-up
// (two threads posting from two CPUs in turn) never settles.
TEST_F(PlacementTest, ANoteThatChangesAtEveryWakeupNeverMovesTheThread) {
  int other = -1;
  for (int cpu = cpu_ + 1; cpu < CPU_SETSIZE && other < 0; ++cpu) {
    if (CPU_ISSET(cpu, &allowed_)) other = cpu;
  }
  ASSERT_GE(other, 0);
  ProgressPlacement placement(ProgressAffinity::kAway);
  placement.Start();
  for (int i = 0; i < 8 * ProgressPlacement::kSettleWakeups; ++i) {
    NoteFrom(placement, i % 2 == 0 ? cpu_ : other);
    placement.Apply();
  }
  EXPECT_EQ(placement.avoided_cpu(), -1);
  const cpu_set_t set = AffinityOf(0);
  EXPECT_TRUE(CPU_EQUAL(&set, &allowed_));
}

// `top -H`, `ps -L`, gdb and perf tell it from the application's threads
// (a thread otherwise inherits the process's name).
TEST(ProgressThread, IsNamedSiwxProgress) {
  Node a;
  const auto deadline = Clock::now() + kWait;
  while (a.engine->progress_thread_tid() == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const pid_t tid = a.engine->progress_thread_tid();
  ASSERT_NE(tid, 0) << "the progress thread never started";
  std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(comm, name);
  EXPECT_EQ(name, "siwx-progress");
}

}  // namespace
}  // namespace siwx::engine::testing
