// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Work completion records and the completion queue: ring order, overflow,
// ibv_req_notify_cq arming, and concurrent producers.
#include "common/engine/completion.h"
#include "common/engine/poll_wait_backoff.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace siwx::engine {
namespace {

WorkCompletion Wc(std::uint64_t wr_id, WcStatus status = WcStatus::kSuccess) {
  WorkCompletion wc;
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = WcOpcode::kRecv;
  wc.byte_len = static_cast<std::uint32_t>(wr_id * 10);
  return wc;
}

struct Counters {
  std::atomic<int> notifications{0};
  std::atomic<int> cq_errors{0};
  CompletionQueue::Callbacks Callbacks() {
    return {[this] { notifications.fetch_add(1); },
            [this](CqEvent e) {
              if (e == CqEvent::kCqError) cq_errors.fetch_add(1);
            }};
  }
};

std::vector<std::uint64_t> PollIds(CompletionQueue& cq, std::size_t batch) {
  std::vector<WorkCompletion> out(batch);
  const std::size_t n = cq.Poll(out);
  std::vector<std::uint64_t> ids;
  for (std::size_t i = 0; i < n; ++i) ids.push_back(out[i].wr_id);
  return ids;
}

TEST(WorkCompletionValues, MirrorIbvWcStatus) {
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kSuccess), 0u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kLocLenErr), 1u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kLocQpOpErr), 2u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kLocProtErr), 4u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kWrFlushErr), 5u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kMwBindErr), 6u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kLocAccessErr), 8u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kRemInvReqErr), 9u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kRemAccessErr), 10u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kRemOpErr), 11u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kRemAbortErr), 16u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kFatalErr), 19u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kRespTimeoutErr), 20u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcStatus::kGeneralErr), 21u);
}

TEST(WorkCompletionValues, MirrorIbvWcOpcodeAndFlags) {
  EXPECT_EQ(static_cast<std::uint32_t>(WcOpcode::kSend), 0u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcOpcode::kRdmaWrite), 1u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcOpcode::kRdmaRead), 2u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcOpcode::kLocalInv), 6u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcOpcode::kRecv), 128u);
  EXPECT_EQ(static_cast<std::uint32_t>(WcOpcode::kRecvRdmaWithImm), 129u);
  EXPECT_EQ(static_cast<std::uint32_t>(kWcWithImm), 2u);
  EXPECT_EQ(static_cast<std::uint32_t>(kWcWithInv), 8u);
  EXPECT_EQ(WcStatusName(WcStatus::kWrFlushErr), "work request flushed");
  EXPECT_EQ(WcStatusName(static_cast<WcStatus>(99)), "unknown");
}

TEST(CompletionQueue, CreateBoundsCapacity) {
  EXPECT_EQ(CompletionQueue::Create(0, {}), nullptr);
  EXPECT_EQ(CompletionQueue::Create(CompletionQueue::kMaxCapacity + 1, {}), nullptr);
  auto cq = CompletionQueue::Create(CompletionQueue::kMaxCapacity, {});
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(cq->capacity(), CompletionQueue::kMaxCapacity);
  EXPECT_EQ(CompletionQueue::Create(1, {})->capacity(), 1u);
}

TEST(CompletionQueue, FifoAcrossWrapAround) {
  auto cq = CompletionQueue::Create(4, {});
  std::array<WorkCompletion, 4> out{};
  EXPECT_EQ(cq->Poll(out), 0u);  // empty
  for (std::uint64_t id : {1, 2, 3}) EXPECT_EQ(cq->Push(Wc(id)), PushStatus::kOk);
  EXPECT_EQ(PollIds(*cq, 2), (std::vector<std::uint64_t>{1, 2}));
  for (std::uint64_t id : {4, 5, 6}) EXPECT_EQ(cq->Push(Wc(id)), PushStatus::kOk);
  EXPECT_EQ(cq->size(), 4u);
  EXPECT_EQ(PollIds(*cq, 1), (std::vector<std::uint64_t>{3}));
  EXPECT_EQ(PollIds(*cq, 8), (std::vector<std::uint64_t>{4, 5, 6}));
  EXPECT_EQ(cq->size(), 0u);
  EXPECT_EQ(cq->Poll(std::span<WorkCompletion>()), 0u);
}

TEST(CompletionQueue, PollCopiesEveryField) {
  auto cq = CompletionQueue::Create(2, {});
  WorkCompletion wc;
  wc.wr_id = 0x1122334455667788u;
  wc.status = WcStatus::kRemAccessErr;
  wc.opcode = WcOpcode::kRecv;
  wc.vendor_err = 0x0102;
  wc.byte_len = 4096;
  wc.imm_data = 0xCAFEF00D;
  wc.invalidated_rkey = 0x000123AB;
  wc.qp_num = 17;
  wc.src_qp = 18;
  wc.wc_flags = kWcWithInv;
  ASSERT_EQ(cq->Push(wc), PushStatus::kOk);
  std::array<WorkCompletion, 1> out{};
  ASSERT_EQ(cq->Poll(out), 1u);
  EXPECT_EQ(out[0].wr_id, 0x1122334455667788u);
  EXPECT_EQ(out[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(out[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(out[0].vendor_err, 0x0102u);
  EXPECT_EQ(out[0].byte_len, 4096u);
  EXPECT_EQ(out[0].imm_data, 0xCAFEF00Du);
  EXPECT_EQ(out[0].invalidated_rkey, 0x000123ABu);
  EXPECT_EQ(out[0].qp_num, 17u);
  EXPECT_EQ(out[0].src_qp, 18u);
  EXPECT_EQ(out[0].wc_flags, 8u);
}

TEST(CompletionQueue, OverflowReportsOnceAndNeverOverwrites) {
  Counters counters;
  auto cq = CompletionQueue::Create(2, counters.Callbacks());
  cq->Arm(CqArm::kNextCompletion);
  EXPECT_EQ(cq->Push(Wc(1)), PushStatus::kOk);
  EXPECT_EQ(counters.notifications.load(), 1);
  EXPECT_EQ(cq->Push(Wc(2)), PushStatus::kOk);
  cq->Arm(CqArm::kNextCompletion);
  EXPECT_EQ(cq->Push(Wc(3)), PushStatus::kOverflow);
  EXPECT_TRUE(cq->in_error());
  EXPECT_EQ(counters.cq_errors.load(), 1);
  EXPECT_EQ(counters.notifications.load(), 1);  // a lost entry does not notify
  EXPECT_EQ(cq->Push(Wc(4)), PushStatus::kInError);
  EXPECT_EQ(counters.cq_errors.load(), 1);      // reported once
  // The entries stored before the overflow are intact.
  EXPECT_EQ(PollIds(*cq, 4), (std::vector<std::uint64_t>{1, 2}));
  // Room again, but the CQ stays in error: a completion was already lost.
  EXPECT_EQ(cq->Push(Wc(5)), PushStatus::kInError);
  EXPECT_EQ(cq->size(), 0u);
  EXPECT_EQ(counters.cq_errors.load(), 1);
}

TEST(CompletionQueue, NoNotificationWithoutArm) {
  Counters counters;
  auto cq = CompletionQueue::Create(8, counters.Callbacks());
  EXPECT_EQ(cq->arm(), CqArm::kNone);
  cq->Push(Wc(1), /*solicited=*/true);
  cq->Push(Wc(2, WcStatus::kRemOpErr));
  EXPECT_EQ(counters.notifications.load(), 0);
}

TEST(CompletionQueue, NextCompletionFiresOncePerArm) {
  Counters counters;
  auto cq = CompletionQueue::Create(8, counters.Callbacks());
  cq->Push(Wc(1));
  cq->Arm(CqArm::kNextCompletion);
  EXPECT_EQ(cq->arm(), CqArm::kNextCompletion);
  EXPECT_EQ(counters.notifications.load(), 0);  // queued entries do not fire
  cq->Push(Wc(2));
  EXPECT_EQ(counters.notifications.load(), 1);
  EXPECT_EQ(cq->arm(), CqArm::kNone);
  cq->Push(Wc(3));
  EXPECT_EQ(counters.notifications.load(), 1);
  cq->Arm(CqArm::kNextCompletion);
  cq->Push(Wc(4));
  EXPECT_EQ(counters.notifications.load(), 2);
}

TEST(CompletionQueue, SolicitedFiresOnSolicitedOrUnsuccessfulOnly) {
  Counters counters;
  auto cq = CompletionQueue::Create(8, counters.Callbacks());
  cq->Arm(CqArm::kSolicited);
  cq->Push(Wc(1));  // successful, unsolicited
  EXPECT_EQ(counters.notifications.load(), 0);
  cq->Push(Wc(2), /*solicited=*/true);
  EXPECT_EQ(counters.notifications.load(), 1);
  cq->Push(Wc(3), /*solicited=*/true);  // disarmed
  EXPECT_EQ(counters.notifications.load(), 1);
  cq->Arm(CqArm::kSolicited);
  cq->Push(Wc(4, WcStatus::kWrFlushErr));  // unsuccessful counts as solicited
  EXPECT_EQ(counters.notifications.load(), 2);
}

TEST(CompletionQueue, ArmWidensButNeverNarrows) {
  Counters counters;
  auto cq = CompletionQueue::Create(8, counters.Callbacks());
  cq->Arm(CqArm::kSolicited);
  cq->Arm(CqArm::kNextCompletion);
  EXPECT_EQ(cq->arm(), CqArm::kNextCompletion);
  cq->Arm(CqArm::kSolicited);
  EXPECT_EQ(cq->arm(), CqArm::kNextCompletion);
  cq->Push(Wc(1));  // unsolicited fires: the arm is "next"
  EXPECT_EQ(counters.notifications.load(), 1);
  cq->Arm(CqArm::kNextCompletion);
  cq->Arm(CqArm::kNone);  // explicit disarm
  cq->Push(Wc(2));
  EXPECT_EQ(counters.notifications.load(), 1);
}

TEST(CompletionQueue, CallbackMayPollAndRearm) {
  std::unique_ptr<CompletionQueue> cq;
  std::vector<std::uint64_t> seen;
  cq = CompletionQueue::Create(4, {[&] {
                                     for (std::uint64_t id : PollIds(*cq, 4)) seen.push_back(id);
                                     cq->Arm(CqArm::kNextCompletion);
                                   },
                                   {}});
  cq->Arm(CqArm::kNextCompletion);
  for (std::uint64_t id : {7, 8, 9}) cq->Push(Wc(id));
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{7, 8, 9}));
  EXPECT_EQ(cq->size(), 0u);
}

// Producers on several threads, one consumer polling batches: nothing lost,
// nothing duplicated, each producer's entries in its push order.
TEST(CompletionQueue, ConcurrentProducersAndConsumer) {
  constexpr int kProducers = 4;
  constexpr std::uint64_t kPerProducer = 5000;
  Counters counters;
  auto cq = CompletionQueue::Create(1u << 15, counters.Callbacks());  // never overflows
  std::atomic<bool> consumer_done{false};

  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (std::uint64_t seq = 0; seq < kPerProducer; ++seq) {
        ASSERT_EQ(cq->Push(Wc((std::uint64_t(p) << 32) | seq), (seq % 7) == 0), PushStatus::kOk);
      }
    });
  }
  std::thread armer([&] {
    while (!consumer_done.load()) {
      cq->Arm(CqArm::kSolicited);
      std::this_thread::yield();
    }
  });

  std::vector<std::uint64_t> next(kProducers, 0);
  std::uint64_t total = 0;
  std::array<WorkCompletion, 16> out{};
  while (total < kProducers * kPerProducer) {
    const std::size_t n = cq->Poll(out);
    for (std::size_t i = 0; i < n; ++i) {
      const auto p = static_cast<std::size_t>(out[i].wr_id >> 32);
      const std::uint64_t seq = out[i].wr_id & 0xFFFFFFFFu;
      ASSERT_LT(p, next.size());
      ASSERT_EQ(seq, next[p]) << "producer " << p;
      ASSERT_EQ(out[i].byte_len, static_cast<std::uint32_t>(out[i].wr_id * 10));
      ++next[p];
    }
    total += n;
    if (n == 0) std::this_thread::yield();
  }
  consumer_done.store(true);
  for (auto& t : producers) t.join();
  armer.join();
  EXPECT_EQ(total, kProducers * kPerProducer);
  EXPECT_EQ(cq->size(), 0u);
  EXPECT_FALSE(cq->in_error());
  EXPECT_EQ(counters.cq_errors.load(), 0);
}

// Sets the yield threshold for one test and puts the default back.
class YieldThreshold {
 public:
  explicit YieldThreshold(std::uint32_t polls) { CompletionQueue::SetEmptyPollsBeforeYield(polls); }
  ~YieldThreshold() {
    CompletionQueue::SetEmptyPollsBeforeYield(CompletionQueue::kDefaultEmptyPollsBeforeYield);
  }
};

// Runs `body` on a fresh thread, whose empty-poll run and yield count start at 0.
template <typename Body>
void OnFreshThread(Body body) {
  std::thread thread(body);
  thread.join();
}

// A busy poller yields only after a run of empty polls, on every empty poll
// after it, and a poll that returns a completion starts the run anew.
TEST(CompletionQueueYield, EmptyPollsYieldOnlyAfterTheThresholdAndACompletionResets) {
  constexpr std::uint32_t kThreshold = 8;
  YieldThreshold threshold(kThreshold);
  auto cq = CompletionQueue::Create(4, {});
  OnFreshThread([&] {
    std::array<WorkCompletion, 2> out{};
    for (std::uint32_t i = 0; i < kThreshold; ++i) EXPECT_EQ(cq->PollWithProgress(out), 0u);
    EXPECT_EQ(CompletionQueue::YieldsOnThisThread(), 0u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(cq->PollWithProgress(out), 0u);
    EXPECT_EQ(CompletionQueue::YieldsOnThisThread(), 3u);

    ASSERT_EQ(cq->Push(Wc(1)), PushStatus::kOk);
    EXPECT_EQ(cq->PollWithProgress(out), 1u);
    for (std::uint32_t i = 0; i < kThreshold; ++i) EXPECT_EQ(cq->PollWithProgress(out), 0u);
    EXPECT_EQ(CompletionQueue::YieldsOnThisThread(), 3u) << "the completion did not reset the run";
    EXPECT_EQ(cq->PollWithProgress(out), 0u);
    EXPECT_EQ(CompletionQueue::YieldsOnThisThread(), 4u);
  });
}

// The run is the thread's, not the CQ's: completions on one CQ keep a
// thread that also polls an empty one (perftest's data and sync CQs) from
// yielding, and empty polls of two CQs add up.
TEST(CompletionQueueYield, TheRunCountsEveryCqTheThreadPolls) {
  constexpr std::uint32_t kThreshold = 8;
  YieldThreshold threshold(kThreshold);
  auto busy = CompletionQueue::Create(4, {});
  auto idle = CompletionQueue::Create(4, {});
  OnFreshThread([&] {
    std::array<WorkCompletion, 2> out{};
    for (std::uint64_t id = 0; id < 4 * kThreshold; ++id) {
      ASSERT_EQ(busy->Push(Wc(id)), PushStatus::kOk);
      EXPECT_EQ(busy->PollWithProgress(out), 1u);
      EXPECT_EQ(idle->PollWithProgress(out), 0u);
    }
    EXPECT_EQ(CompletionQueue::YieldsOnThisThread(), 0u);
    for (std::uint32_t i = 0; i < kThreshold / 2; ++i) {
      EXPECT_EQ(busy->PollWithProgress(out), 0u);
      EXPECT_EQ(idle->PollWithProgress(out), 0u);
    }
    EXPECT_EQ(CompletionQueue::YieldsOnThisThread(), 1u);
  });
}

// Threshold 0 turns yielding off; a zero-length poll and plain Poll never count.
TEST(CompletionQueueYield, ZeroThresholdZeroLengthPollsAndPlainPollNeverYield) {
  auto cq = CompletionQueue::Create(4, {});
  {
    YieldThreshold threshold(0);
    OnFreshThread([&] {
      std::array<WorkCompletion, 2> out{};
      for (int i = 0; i < 1000; ++i) EXPECT_EQ(cq->PollWithProgress(out), 0u);
      EXPECT_EQ(CompletionQueue::YieldsOnThisThread(), 0u);
    });
  }
  YieldThreshold threshold(1);
  OnFreshThread([&] {
    std::array<WorkCompletion, 2> out{};
    for (int i = 0; i < 100; ++i) {
      EXPECT_EQ(cq->PollWithProgress(std::span<WorkCompletion>()), 0u);
      EXPECT_EQ(cq->Poll(out), 0u);
    }
    EXPECT_EQ(CompletionQueue::YieldsOnThisThread(), 0u);
  });
}

// Makes this thread's last polled CQ one that is not `cq` (a CQ made at the
// address of one this thread polled before would otherwise count as polled).
void PollSomethingElse() {
  auto other = CompletionQueue::Create(1, {});
  std::array<WorkCompletion, 1> out;
  other->PollWithProgress(out);
}

// A driver whose PollMayWait answer the test sets; it drives nothing.
class FakeDriver : public PollDriver {
 public:
  void DriveFromPoll(const CompletionQueue& /*polled*/) override { turns.fetch_add(1); }
  void OnCqArmed(const CompletionQueue& /*cq*/) override {}
  bool PollMayWait(const CompletionQueue& /*polled*/) override { return may_wait.load(); }
  bool PollPushDue() override { return push_due.load(); }
  bool HelpTransmit() override {
    help_asks.fetch_add(1);
    return helps.load();
  }
  std::atomic<bool> may_wait{true};
  std::atomic<bool> push_due{false};
  std::atomic<bool> helps{false};  // HelpTransmit's answer: it took turns
  std::atomic<int> turns{0};
  std::atomic<int> help_asks{0};
};

// The set-up the poll-wait tests share: CQs that fake drivers drive, with
// the poll wait set. Every driver attached is removed when the test ends,
// also when an assertion ended it early.
class CompletionQueuePollWait : public ::testing::Test {
 protected:
  // Far longer than any test may run: a lost wake-up shows as a timeout.
  static constexpr std::chrono::microseconds kForever = std::chrono::minutes(10);

  // A CQ of `capacity` entries that `drivers` drive, whose empty polls may
  // wait `wait`; it lives as long as the test.
  CompletionQueue* DrivenCq(std::uint32_t capacity, std::chrono::microseconds wait,
                            std::initializer_list<FakeDriver*> drivers) {
    cqs_.push_back(CompletionQueue::Create(capacity, {}));
    CompletionQueue* cq = cqs_.back().get();
    for (FakeDriver* d : drivers) {
      cq->AddDriver(d);
      attached_.emplace_back(cq, d);
    }
    cq->set_poll_wait(wait);
    return cq;
  }

  void Detach(CompletionQueue* cq, FakeDriver* d) {
    cq->RemoveDriver(d);
    std::erase(attached_, std::pair(cq, d));
  }

  void TearDown() override {
    for (auto it = attached_.rbegin(); it != attached_.rend(); ++it) {
      it->first->RemoveDriver(it->second);
    }
    attached_.clear();
  }

  // A fresh thread's first polls of `cq`, where nothing arrives: the first
  // only notes the CQ, then `waits` waits run out, each twice as long as the
  // one before, from `first` up to `cap`.
  void ExpectDoublingWaits(CompletionQueue* cq, std::chrono::microseconds first,
                           std::chrono::microseconds cap, int waits) {
    ASSERT_EQ(cq->PollWithProgress(out), 0u);  // notes the CQ; no wait yet
    std::chrono::microseconds expected = first;
    for (int i = 0; i < waits; ++i) {
      EXPECT_EQ(cq->next_poll_wait(), expected) << "wait " << i;
      ASSERT_EQ(cq->PollWithProgress(out), 0u);
      expected = std::min(expected * 2, cap);
    }
  }

  FakeDriver driver;
  FakeDriver second_driver;
  std::array<WorkCompletion, 4> out;

 private:
  std::vector<std::unique_ptr<CompletionQueue>> cqs_;
  std::vector<std::pair<CompletionQueue*, FakeDriver*>> attached_;
};

// The bounded wait of an empty PollWithProgress: it sleeps only when every
// driver agrees, only on a thread that polls this CQ alone, and a Push from
// another thread ends it with that entry returned by the same call.
TEST_F(CompletionQueuePollWait, PushFromAnotherThreadEndsTheWaitWithItsEntry) {
  CompletionQueue* cq = DrivenCq(8, kForever, {&driver});
  std::size_t got = 0;
  std::thread poller([&] {
    // The first poll on this thread only notes the CQ; the second waits.
    got = cq->PollWithProgress(out);
    if (got == 0) got = cq->PollWithProgress(out);
  });
  while (cq->poll_waits() == 0) std::this_thread::yield();
  ASSERT_EQ(cq->Push(Wc(5)), PushStatus::kOk);
  poller.join();
  ASSERT_EQ(got, 1u);
  EXPECT_EQ(out[0].wr_id, 5u);
  EXPECT_EQ(cq->poll_waits(), 1u);
  EXPECT_EQ(cq->poll_wait_timeouts(), 0u);
}

// The progress thread shares transmit turns (Engine::ShareTransmitTurns)
// and asks a CQ for a helper: the wait of the thread asleep in an empty poll
// of it ends (no timeout), and its next empty poll asks the driver for
// turns. With nobody waiting there is nobody to wake.
TEST_F(CompletionQueuePollWait, AskedForAHelperTheWaitOfAnEmptyPollEnds) {
  CompletionQueue* cq = DrivenCq(8, kForever, {&driver});
  EXPECT_FALSE(cq->WakeToHelp());
  std::thread poller([&] {
    // The first poll only notes the CQ, the second waits; the third helps
    // (and so does not wait).
    for (int i = 0; i < 3; ++i) cq->PollWithProgress(out);
  });
  while (cq->poll_waits() == 0) std::this_thread::yield();
  driver.helps = true;
  EXPECT_TRUE(cq->WakeToHelp());
  poller.join();
  EXPECT_EQ(cq->poll_waits(), 1u);
  EXPECT_EQ(cq->poll_wait_timeouts(), 0u);
  EXPECT_EQ(driver.help_asks.load(), 3);
}

// A poll whose thread took transmit turns (the driver says it helped) does
// not wait: those turns may have completed work, and more may be shared.
TEST_F(CompletionQueuePollWait, APollThatHelpedTransmitDoesNotWait) {
  CompletionQueue* cq = DrivenCq(8, kForever, {&driver});
  driver.helps = true;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 0u);
  // Without turns taken the same thread's next empty poll waits again.
  driver.helps = false;
  std::thread pusher([&] {
    while (cq->poll_waits() == 0) std::this_thread::yield();
    EXPECT_EQ(cq->Push(Wc(1)), PushStatus::kOk);
  });
  EXPECT_EQ(cq->PollWithProgress(out), 1u);
  pusher.join();
  EXPECT_EQ(cq->poll_waits(), 1u);
  PollSomethingElse();
}

// A wait where a driver says a push is due (a sink's stream, a full
// socket) may last kPollWaitForDuePush, not the short SIWX_POLL_WAIT_US: a
// 64 KiB Send receiver otherwise timed out several waits per message. Only
// then: a CQ whose drivers expect nothing keeps the short wait, and a CQ
// that never waits (poll wait 0) does not start waiting.
TEST_F(CompletionQueuePollWait, WaitsLongOnlyWhenADriverSaysAPushIsDue) {
  FakeDriver& quiet = driver;
  FakeDriver& sink = second_driver;
  CompletionQueue* cq = DrivenCq(8, std::chrono::microseconds(1), {&quiet, &sink});
  ASSERT_EQ(cq->PollWithProgress(out), 0u);  // notes the CQ: polls it alone
  ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 1u);
  EXPECT_EQ(cq->long_poll_waits(), 0u);
  sink.push_due = true;
  ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 2u);
  EXPECT_EQ(cq->long_poll_waits(), 1u);
  // A driver that could still make progress keeps the poll from sleeping,
  // however due a push is elsewhere.
  quiet.may_wait = false;
  ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 2u);
  quiet.may_wait = true;
  cq->set_poll_wait(std::chrono::microseconds(0));
  ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 2u);
  EXPECT_EQ(cq->long_poll_waits(), 1u);
}

// A thread's first empty poll of a CQ only notes it, also when the CQ
// takes the address of one the thread polled before and that was destroyed:
// the note is the CQ's serial, not its address. Before, that first poll
// waited, and which test ran before decided this one's counts.
TEST_F(CompletionQueuePollWait, ANewCqAtADestroyedOnesAddressIsNotTakenForIt) {
  bool reused = false;
  for (int i = 0; i < 64 && !reused; ++i) {
    auto first = CompletionQueue::Create(8, {});
    first->AddDriver(&driver);
    first->set_poll_wait(std::chrono::microseconds(1));
    ASSERT_EQ(first->PollWithProgress(out), 0u);  // notes it
    ASSERT_EQ(first->PollWithProgress(out), 0u);  // waits
    ASSERT_EQ(first->poll_waits(), 1u);
    first->RemoveDriver(&driver);
    const void* address = first.get();
    first.reset();
    auto second = CompletionQueue::Create(8, {});
    if (second.get() != address) continue;
    reused = true;
    second->AddDriver(&driver);
    second->set_poll_wait(std::chrono::microseconds(1));
    EXPECT_EQ(second->PollWithProgress(out), 0u);
    EXPECT_EQ(second->poll_waits(), 0u) << "the first poll of a new CQ waited";
    second->RemoveDriver(&driver);
  }
  if (!reused) {
    GTEST_SKIP() << "the allocator gave no CQ a destroyed one's address in 64 tries "
                    "(ASan's quarantine holds freed memory back)";
  }
}

// Pushes on a thread that defers wake-ups (the engine's progress thread)
// wake a poller sleeping on the CQ once, when the thread calls WakeDeferred
// (done with what it read), not once per message: no wake-up before it,
// every entry there for the woken poll, none lost.
TEST_F(CompletionQueuePollWait, DeferredPushesWakeTheSleepingPollerOnceAtWakeDeferred) {
  CompletionQueue* cq = DrivenCq(64, kForever, {&driver});
  std::array<WorkCompletion, 8> entries;
  std::vector<std::uint64_t> got;
  std::thread poller([&] {
    while (got.size() < 5) {
      const std::size_t n = cq->PollWithProgress(entries);
      for (std::size_t i = 0; i < n; ++i) got.push_back(entries[i].wr_id);
    }
  });
  while (cq->poll_waits() == 0) std::this_thread::yield();
  std::thread pusher([&] {
    CompletionQueue::DeferWakesOnThisThread(true);
    for (std::uint64_t id = 0; id < 5; ++id) ASSERT_EQ(cq->Push(Wc(id)), PushStatus::kOk);
    // Without deferral the first push woke the poller.
    EXPECT_EQ(cq->waiter_wakes(), 0u);
    CompletionQueue::WakeDeferred();
    CompletionQueue::DeferWakesOnThisThread(false);
  });
  pusher.join();
  poller.join();
  EXPECT_EQ(got, (std::vector<std::uint64_t>{0, 1, 2, 3, 4}));
  // The poller may have found the entries before the deferred wake-up (a
  // spurious wake-up), then nobody waits and none is sent.
  EXPECT_LE(cq->waiter_wakes(), 1u);
  EXPECT_EQ(cq->poll_wait_timeouts(), 0u);
}

// A deferring thread that queues kWakeBatch entries wakes the sleeping
// poller at once, without WakeDeferred (a long turn of the progress thread
// holds no wake-up back for longer than that).
TEST_F(CompletionQueuePollWait, DeferredPushesWakeTheSleepingPollerAtTheBatchSize) {
  CompletionQueue* cq = DrivenCq(64, kForever, {&driver});
  std::array<WorkCompletion, 64> entries;
  std::size_t got = 0;
  std::thread poller([&] {
    while (got < CompletionQueue::kWakeBatch) got += cq->PollWithProgress(entries);
  });
  while (cq->poll_waits() == 0) std::this_thread::yield();
  std::thread pusher([&] {
    CompletionQueue::DeferWakesOnThisThread(true);
    for (std::uint64_t id = 0; id < CompletionQueue::kWakeBatch; ++id) {
      ASSERT_EQ(cq->Push(Wc(id)), PushStatus::kOk);
    }
  });
  pusher.join();  // it never called WakeDeferred
  poller.join();
  EXPECT_EQ(got, CompletionQueue::kWakeBatch);
  EXPECT_EQ(cq->poll_wait_timeouts(), 0u);
}

// A CQ in error (it overflowed) gets nothing more: a poll never sleeps on it.
TEST_F(CompletionQueuePollWait, CqInErrorNeverWaits) {
  CompletionQueue* cq = DrivenCq(1, kForever, {&driver});
  ASSERT_EQ(cq->Push(Wc(1)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Wc(2)), PushStatus::kOverflow);
  ASSERT_EQ(cq->PollWithProgress(out), 1u);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 0u);
}

TEST_F(CompletionQueuePollWait, NoWaitWhenADriverCanProgressOrWaitIsOff) {
  FakeDriver& ready = driver;
  FakeDriver& busy = second_driver;
  busy.may_wait = false;
  CompletionQueue* cq = DrivenCq(8, kForever, {&ready, &busy});
  for (int i = 0; i < 50; ++i) ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 0u);
  Detach(cq, &busy);
  cq->set_poll_wait(std::chrono::microseconds(0));  // SIWX_POLL_WAIT_US=0
  for (int i = 0; i < 50; ++i) ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 0u);
  EXPECT_GT(ready.turns.load(), 0);
}

// On a CQ where nothing arrives, each wait that runs out doubles the next
// one up to kMaxPollWait (a poller on perftest's idle key-exchange CQ woke
// every 50 us: docs/performance-notes.md 3.11); a returned entry or an
// empty poll that may not wait brings back the configured length. Counts
// waits, not time: a wait with nothing pushed always runs out.
TEST_F(CompletionQueuePollWait, WaitsWithNothingPushedGrowAndActivityResetsThem) {
  const std::chrono::microseconds configured(1);
  CompletionQueue* cq = DrivenCq(8, configured, {&driver});
  OnFreshThread([&] {
    ASSERT_NO_FATAL_FAILURE(ExpectDoublingWaits(cq, configured, kMaxPollWait, 14));
    EXPECT_EQ(cq->poll_waits(), 14u);
    EXPECT_EQ(cq->poll_wait_timeouts(), 14u);
    EXPECT_EQ(cq->next_poll_wait(), kMaxPollWait);
    // An entry returned: back to the configured wait.
    ASSERT_EQ(cq->Push(Wc(7)), PushStatus::kOk);
    ASSERT_EQ(cq->PollWithProgress(out), 1u);
    EXPECT_EQ(cq->next_poll_wait(), configured);
    ASSERT_EQ(cq->PollWithProgress(out), 0u);
    ASSERT_EQ(cq->PollWithProgress(out), 0u);
    EXPECT_EQ(cq->next_poll_wait(), configured * 4);
    // The driver can make progress on this thread (it posted): no wait,
    // and the next one is short again.
    driver.may_wait = false;
    ASSERT_EQ(cq->PollWithProgress(out), 0u);
    EXPECT_EQ(cq->poll_waits(), 16u);
    EXPECT_EQ(cq->next_poll_wait(), configured);
  });
}

// While an engine of the process says its responder spins, the waits grow
// to kMaxPollWaitBesideSpin instead (docs/performance-notes.md 3.15); once
// it says the spin stopped, the next one that runs out is back within
// kMaxPollWait. Counts waits, not time, as above.
TEST_F(CompletionQueuePollWait, WaitsGrowFurtherWhileAResponderSpins) {
  const std::chrono::microseconds configured(1);
  CompletionQueue* cq = DrivenCq(8, configured, {&driver});
  ASSERT_FALSE(CompletionQueue::AnyResponderSpins());
  CompletionQueue::NoteResponderSpin(true);
  CompletionQueue::NoteResponderSpin(true);  // two engines
  CompletionQueue::NoteResponderSpin(false);
  EXPECT_TRUE(CompletionQueue::AnyResponderSpins());
  OnFreshThread([&] {
    ASSERT_NO_FATAL_FAILURE(ExpectDoublingWaits(cq, configured, kMaxPollWaitBesideSpin, 14));
    EXPECT_EQ(cq->next_poll_wait(), kMaxPollWaitBesideSpin);
    CompletionQueue::NoteResponderSpin(false);
    EXPECT_FALSE(CompletionQueue::AnyResponderSpins());
    ASSERT_EQ(cq->PollWithProgress(out), 0u);
    EXPECT_EQ(cq->next_poll_wait(), kMaxPollWait);
    EXPECT_EQ(cq->poll_wait_timeouts(), 15u);
  });
}

// A thread that polls two CQs in turn never sleeps on either: while it
// slept on one, the other's completions would wait.
TEST_F(CompletionQueuePollWait, ThreadPollingTwoCqsInTurnNeverWaits) {
  CompletionQueue* first = DrivenCq(8, kForever, {&driver});
  CompletionQueue* second = DrivenCq(8, kForever, {&second_driver});
  PollSomethingElse();
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(first->PollWithProgress(out), 0u);
    ASSERT_EQ(second->PollWithProgress(out), 0u);
  }
  EXPECT_EQ(first->poll_waits(), 0u);
  EXPECT_EQ(second->poll_waits(), 0u);
}

// A bounded wait that nothing ends returns empty after its bound.
TEST_F(CompletionQueuePollWait, WaitWithoutPushReturnsEmpty) {
  CompletionQueue* cq = DrivenCq(8, std::chrono::microseconds(200), {&driver});
  PollSomethingElse();
  for (int i = 0; i < 5; ++i) ASSERT_EQ(cq->PollWithProgress(out), 0u);
  EXPECT_EQ(cq->poll_waits(), 4u);  // the first poll only noted the CQ
  EXPECT_EQ(cq->poll_wait_timeouts(), 4u);
}

}  // namespace
}  // namespace siwx::engine
