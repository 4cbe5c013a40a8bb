// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Work request records and their post checks, the WorkRing, and the receive
// queue / shared receive queue with ibv_modify_srq limit events.
#include "common/engine/receive_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/engine/work_request.h"

namespace siwx::engine {
namespace {

ReceiveWorkRequest Recv(std::uint64_t wr_id, std::uint32_t num_sge = 1) {
  ReceiveWorkRequest wr;
  wr.wr_id = wr_id;
  wr.num_sge = num_sge;
  for (std::uint32_t i = 0; i < num_sge && i < kMaxSge; ++i) {
    wr.sge[i] = {0x10000 * (wr_id + 1) + i * 0x100, 0x40 + i, 0x00000100u + i};
  }
  return wr;
}

QueueCaps Caps(std::uint32_t max_wr, std::uint32_t max_sge) { return {max_wr, max_sge, 0}; }

std::vector<std::uint64_t> Ids(const std::vector<ReceiveWorkRequest>& wrs) {
  std::vector<std::uint64_t> ids;
  for (const auto& wr : wrs) ids.push_back(wr.wr_id);
  return ids;
}

// ---- Work request records ----

TEST(WorkRequestLimits, Values) {
  EXPECT_EQ(kMaxSge, 16u);
  EXPECT_EQ(kMaxInlineData, 256u);
  EXPECT_EQ(kMaxReadSge, 1u);
  EXPECT_EQ(static_cast<std::uint32_t>(kSendFence), 1u);  // ibv_send_flags values
  EXPECT_EQ(static_cast<std::uint32_t>(kSendSignaled), 2u);
  EXPECT_EQ(static_cast<std::uint32_t>(kSendSolicited), 4u);
  EXPECT_EQ(static_cast<std::uint32_t>(kSendInline), 8u);
}

TEST(SendWorkRequest, SolicitedEventAndInvalidateByOpcodeAndFlag) {
  struct Case {
    SendOpcode opcode;
    std::uint32_t flags;
    bool se;
    bool inv;
  };
  const Case cases[] = {
      {SendOpcode::kSend, 0, false, false},
      {SendOpcode::kSend, kSendSolicited, true, false},
      {SendOpcode::kSendWithInvalidate, 0, false, true},
      {SendOpcode::kSendWithInvalidate, kSendSolicited, true, true},
      {SendOpcode::kSendWithSolicitedEvent, 0, true, false},
      {SendOpcode::kSendWithSeAndInvalidate, 0, true, true},
      {SendOpcode::kRdmaWrite, kSendSolicited, false, false},  // SE is a Send-only bit
      {SendOpcode::kRdmaRead, 0, false, false},
      {SendOpcode::kLocalInvalidate, 0, false, false},
  };
  for (const Case& c : cases) {
    SendWorkRequest wr;
    wr.opcode = c.opcode;
    wr.flags = c.flags;
    EXPECT_EQ(wr.solicited_event(), c.se) << static_cast<int>(c.opcode);
    EXPECT_EQ(wr.invalidates_remote(), c.inv) << static_cast<int>(c.opcode);
  }
}

TEST(SendWorkRequest, CopyInlineConcatenatesPieces) {
  const std::uint8_t a[] = {0xDE, 0xAD};
  const std::uint8_t b[] = {0xBE, 0xEF, 0x01};
  const ByteSpan pieces[] = {ByteSpan(a), ByteSpan(), ByteSpan(b)};
  SendWorkRequest wr;
  ASSERT_TRUE(wr.CopyInline(pieces));
  EXPECT_TRUE(wr.is_inline());
  EXPECT_EQ(wr.inline_length, 5u);
  EXPECT_EQ(wr.total_length(), 5u);
  EXPECT_EQ(std::vector<std::uint8_t>(wr.inline_data.begin(), wr.inline_data.begin() + 5),
            (std::vector<std::uint8_t>{0xDE, 0xAD, 0xBE, 0xEF, 0x01}));
}

TEST(SendWorkRequest, CopyInlineRefusesMoreThanTheRecordHolds) {
  std::vector<std::uint8_t> big(kMaxInlineData, 0x5A);
  const std::uint8_t one[] = {0x01};
  SendWorkRequest wr;
  const ByteSpan exact[] = {ByteSpan(big)};
  ASSERT_TRUE(wr.CopyInline(exact));
  EXPECT_EQ(wr.inline_length, kMaxInlineData);

  SendWorkRequest wr2;
  const ByteSpan over[] = {ByteSpan(big), ByteSpan(one)};
  EXPECT_FALSE(wr2.CopyInline(over));
  EXPECT_FALSE(wr2.is_inline());
  EXPECT_EQ(wr2.inline_length, 0u);
  EXPECT_EQ(wr2.inline_data[0], 0u);
}

TEST(SendWorkRequest, TotalLengthSumsSges) {
  SendWorkRequest wr;
  wr.num_sge = 3;
  wr.sge[0].length = 0xFFFFFFFFu;
  wr.sge[1].length = 0xFFFFFFFFu;
  wr.sge[2].length = 2;
  EXPECT_EQ(wr.total_length(), 0x200000000u);  // no 32-bit overflow
  wr.num_sge = 1000;  // corrupt count: sges() never reads past the record
  EXPECT_EQ(wr.sges().size(), kMaxSge);
}

TEST(ValidateSendWorkRequest, EveryRejection) {
  const QueueCaps caps{/*max_wr=*/8, /*max_sge=*/4, /*max_inline_data=*/64};
  auto with = [](SendOpcode op, std::uint32_t flags, std::uint32_t num_sge,
                 std::uint32_t inline_length) {
    SendWorkRequest wr;
    wr.opcode = op;
    wr.flags = flags;
    wr.num_sge = num_sge;
    wr.inline_length = inline_length;
    return wr;
  };
  struct Case {
    SendWorkRequest wr;
    PostStatus want;
  };
  const Case cases[] = {
      {with(SendOpcode::kSend, kSendSignaled, 4, 0), PostStatus::kOk},
      {with(SendOpcode::kSend, 0, 5, 0), PostStatus::kTooManySge},
      {with(static_cast<SendOpcode>(7), 0, 1, 0), PostStatus::kInvalidOpcode},
      {with(static_cast<SendOpcode>(255), 0, 1, 0), PostStatus::kInvalidOpcode},
      {with(SendOpcode::kSend, 1u << 4, 1, 0), PostStatus::kInvalidFlags},  // IBV_SEND_IP_CSUM
      {with(SendOpcode::kRdmaRead, 0, 1, 0), PostStatus::kOk},
      {with(SendOpcode::kRdmaRead, 0, 2, 0), PostStatus::kTooManySge},
      {with(SendOpcode::kRdmaRead, kSendInline, 1, 0), PostStatus::kInvalidFlags},
      {with(SendOpcode::kRdmaWrite, kSendInline, 1, 64), PostStatus::kOk},
      {with(SendOpcode::kRdmaWrite, kSendInline, 1, 65), PostStatus::kInlineTooLong},
      {with(SendOpcode::kSendWithInvalidate, kSendInline, 1, 0), PostStatus::kOk},
      {with(SendOpcode::kLocalInvalidate, kSendSignaled, 99, 0), PostStatus::kOk},  // SGEs ignored
      {with(SendOpcode::kSend, kSendInline, 0, 300), PostStatus::kInlineTooLong},
  };
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    EXPECT_EQ(ValidateSendWorkRequest(cases[i].wr, caps), cases[i].want) << "case " << i;
  }
}

TEST(CapsSupported, Bounds) {
  EXPECT_TRUE(CapsSupported({1, 0, 0}));
  EXPECT_TRUE(CapsSupported({kMaxQueueDepth, kMaxSge, kMaxInlineData}));
  EXPECT_FALSE(CapsSupported({0, 1, 0}));
  EXPECT_FALSE(CapsSupported({kMaxQueueDepth + 1, 1, 0}));
  EXPECT_FALSE(CapsSupported({1, kMaxSge + 1, 0}));
  EXPECT_FALSE(CapsSupported({1, 1, kMaxInlineData + 1}));
}

TEST(WorkRing, FifoWrapFrontAtAndClear) {
  WorkRing<int> ring(3);
  EXPECT_TRUE(ring.empty());
  EXPECT_EQ(ring.Front(), nullptr);
  EXPECT_EQ(ring.Pop(), std::nullopt);
  EXPECT_TRUE(ring.Push(1));
  EXPECT_TRUE(ring.Push(2));
  EXPECT_TRUE(ring.Push(3));
  EXPECT_TRUE(ring.full());
  EXPECT_FALSE(ring.Push(4));
  EXPECT_EQ(ring.Pop(), 1);
  EXPECT_TRUE(ring.Push(4));  // wraps into slot 0
  EXPECT_EQ(*ring.Front(), 2);
  EXPECT_EQ(ring.At(0), 2);
  EXPECT_EQ(ring.At(1), 3);
  EXPECT_EQ(ring.At(2), 4);
  EXPECT_EQ(ring.size(), 3u);
  ring.Clear();
  EXPECT_EQ(ring.size(), 0u);
  EXPECT_EQ(ring.Pop(), std::nullopt);
  WorkRing<int> none(0);  // a zero-depth ring is always full
  EXPECT_FALSE(none.Push(1));
}

// ---- Receive queue ----

TEST(ReceiveQueue, CreateRejectsUnsupportedCaps) {
  using Kind = ReceiveQueue::Kind;
  EXPECT_EQ(ReceiveQueue::Create(Kind::kQueuePair, Caps(0, 1)), nullptr);
  EXPECT_EQ(ReceiveQueue::Create(Kind::kQueuePair, Caps(kMaxQueueDepth + 1, 1)), nullptr);
  EXPECT_EQ(ReceiveQueue::Create(Kind::kShared, Caps(4, kMaxSge + 1)), nullptr);
  EXPECT_EQ(ReceiveQueue::Create(Kind::kShared, QueueCaps{4, 1, 1}), nullptr);  // no inline on RQs
  auto rq = ReceiveQueue::Create(Kind::kQueuePair, Caps(4, 0));
  ASSERT_NE(rq, nullptr);
  EXPECT_EQ(rq->caps().max_wr, 4u);
  EXPECT_EQ(rq->kind(), Kind::kQueuePair);
}

TEST(ReceiveQueue, PostAndTakeInFifoOrderWithContents) {
  auto rq = ReceiveQueue::Create(ReceiveQueue::Kind::kQueuePair, Caps(4, 2));
  EXPECT_EQ(rq->Take(), std::nullopt);
  EXPECT_EQ(rq->Post(Recv(10, 2)), PostStatus::kOk);
  EXPECT_EQ(rq->Post(Recv(11, 1)), PostStatus::kOk);
  EXPECT_EQ(rq->size(), 2u);
  const std::optional<ReceiveWorkRequest> first = rq->Take();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->wr_id, 10u);
  EXPECT_EQ(first->num_sge, 2u);
  EXPECT_EQ(first->sge[0].addr, 0xB0000u);
  EXPECT_EQ(first->sge[0].length, 0x40u);
  EXPECT_EQ(first->sge[0].lkey, 0x100u);
  EXPECT_EQ(first->sge[1].addr, 0xB0100u);
  EXPECT_EQ(first->sge[1].length, 0x41u);
  EXPECT_EQ(first->sge[1].lkey, 0x101u);
  EXPECT_EQ(first->total_length(), 0x81u);
  EXPECT_EQ(rq->Take()->wr_id, 11u);
  EXPECT_EQ(rq->Take(), std::nullopt);
}

TEST(ReceiveQueue, FullIsEnomemAndTooManySgeIsEinval) {
  auto rq = ReceiveQueue::Create(ReceiveQueue::Kind::kQueuePair, Caps(2, 1));
  EXPECT_EQ(rq->Post(Recv(1, 2)), PostStatus::kTooManySge);
  EXPECT_EQ(rq->Post(Recv(1, kMaxSge + 1)), PostStatus::kTooManySge);
  EXPECT_EQ(rq->Post(Recv(1, 0)), PostStatus::kOk);  // zero-length receive
  EXPECT_EQ(rq->Post(Recv(2, 1)), PostStatus::kOk);
  EXPECT_EQ(rq->Post(Recv(3, 1)), PostStatus::kQueueFull);
  EXPECT_EQ(rq->size(), 2u);
  EXPECT_EQ(rq->Take()->wr_id, 1u);
  EXPECT_EQ(rq->Post(Recv(3, 1)), PostStatus::kOk);
  EXPECT_EQ(Ids(rq->Flush()), (std::vector<std::uint64_t>{2, 3}));
}

TEST(ReceiveQueue, FlushReturnsAllOldestFirstAndEmpties) {
  auto rq = ReceiveQueue::Create(ReceiveQueue::Kind::kQueuePair, Caps(3, 1));
  EXPECT_TRUE(rq->Flush().empty());
  for (std::uint64_t id : {5, 6, 7}) ASSERT_EQ(rq->Post(Recv(id)), PostStatus::kOk);
  rq->Take();
  ASSERT_EQ(rq->Post(Recv(8)), PostStatus::kOk);  // wrapped
  EXPECT_EQ(Ids(rq->Flush()), (std::vector<std::uint64_t>{6, 7, 8}));
  EXPECT_EQ(rq->size(), 0u);
  EXPECT_EQ(rq->Take(), std::nullopt);
}

TEST(ReceiveQueue, QpQueueHasNoLimit) {
  auto rq = ReceiveQueue::Create(ReceiveQueue::Kind::kQueuePair, Caps(4, 1));
  EXPECT_EQ(rq->SetLimit(1), SrqLimitStatus::kNotShared);
  EXPECT_EQ(rq->limit(), 0u);
}

TEST(SharedReceiveQueue, LimitFiresOnceWhenCountDropsBelowIt) {
  int events = 0;
  auto srq = ReceiveQueue::Create(ReceiveQueue::Kind::kShared, Caps(8, 1), [&] { ++events; });
  for (std::uint64_t id = 1; id <= 5; ++id) ASSERT_EQ(srq->Post(Recv(id)), PostStatus::kOk);
  EXPECT_EQ(srq->SetLimit(3), SrqLimitStatus::kOk);
  EXPECT_EQ(srq->limit(), 3u);
  EXPECT_EQ(events, 0);           // arming alone does not fire
  srq->Take();                    // 4 left
  srq->Take();                    // 3 left: not below 3
  EXPECT_EQ(events, 0);
  EXPECT_EQ(srq->Take()->wr_id, 3u);  // 2 left: below 3
  EXPECT_EQ(events, 1);
  EXPECT_EQ(srq->limit(), 0u);    // disarmed
  srq->Take();                    // 1 left
  EXPECT_EQ(events, 1);
}

TEST(SharedReceiveQueue, ArmingBelowTheLimitFiresOnTheNextTake) {
  int events = 0;
  auto srq = ReceiveQueue::Create(ReceiveQueue::Kind::kShared, Caps(8, 1), [&] { ++events; });
  ASSERT_EQ(srq->Post(Recv(1)), PostStatus::kOk);
  ASSERT_EQ(srq->Post(Recv(2)), PostStatus::kOk);
  EXPECT_EQ(srq->SetLimit(5), SrqLimitStatus::kOk);
  EXPECT_EQ(events, 0);
  srq->Take();
  EXPECT_EQ(events, 1);
  // Armed on an empty SRQ: a Take that takes nothing fires nothing.
  srq->Take();
  EXPECT_EQ(events, 1);
  EXPECT_EQ(srq->SetLimit(1), SrqLimitStatus::kOk);
  EXPECT_EQ(srq->Take(), std::nullopt);
  EXPECT_EQ(events, 1);
  EXPECT_EQ(srq->limit(), 1u);
}

TEST(SharedReceiveQueue, LimitBoundsAndDisarm) {
  int events = 0;
  auto srq = ReceiveQueue::Create(ReceiveQueue::Kind::kShared, Caps(8, 1), [&] { ++events; });
  EXPECT_EQ(srq->SetLimit(9), SrqLimitStatus::kInvalidLimit);
  EXPECT_EQ(srq->limit(), 0u);
  EXPECT_EQ(srq->SetLimit(8), SrqLimitStatus::kOk);
  EXPECT_EQ(srq->SetLimit(0), SrqLimitStatus::kOk);  // disarm
  ASSERT_EQ(srq->Post(Recv(1)), PostStatus::kOk);
  srq->Take();
  EXPECT_EQ(events, 0);
}

TEST(SharedReceiveQueue, CallbackMayPostAndRearm) {
  std::unique_ptr<ReceiveQueue> srq;
  int events = 0;
  srq = ReceiveQueue::Create(ReceiveQueue::Kind::kShared, Caps(4, 1), [&] {
    ++events;
    EXPECT_EQ(srq->Post(Recv(100 + events)), PostStatus::kOk);
    EXPECT_EQ(srq->SetLimit(1), SrqLimitStatus::kOk);
  });
  ASSERT_EQ(srq->Post(Recv(1)), PostStatus::kOk);
  ASSERT_EQ(srq->SetLimit(1), SrqLimitStatus::kOk);
  EXPECT_EQ(srq->Take()->wr_id, 1u);  // 0 left: fires, callback posts 101
  EXPECT_EQ(events, 1);
  EXPECT_EQ(srq->Take()->wr_id, 101u);  // fires again, posts 102
  EXPECT_EQ(events, 2);
  EXPECT_EQ(srq->size(), 1u);
}

// Two application threads post while the progress thread takes: every WR is
// taken once, each poster's WRs in its own order.
TEST(SharedReceiveQueue, ConcurrentPostersAndTaker) {
  constexpr std::uint64_t kPerPoster = 20000;
  std::atomic<int> events{0};
  auto srq = ReceiveQueue::Create(ReceiveQueue::Kind::kShared, Caps(64, 1),
                                  [&] { events.fetch_add(1); });
  std::vector<std::thread> posters;
  for (std::uint64_t p = 0; p < 2; ++p) {
    posters.emplace_back([&, p] {
      for (std::uint64_t seq = 0; seq < kPerPoster;) {
        const PostStatus s = srq->Post(Recv((p << 32) | seq));
        if (s == PostStatus::kOk) {
          ++seq;
        } else {
          ASSERT_EQ(s, PostStatus::kQueueFull);
          std::this_thread::yield();
        }
      }
    });
  }
  std::uint64_t next[2] = {0, 0};
  std::uint64_t taken = 0;
  while (taken < 2 * kPerPoster) {
    if (taken % 1000 == 0) srq->SetLimit(16);
    const std::optional<ReceiveWorkRequest> wr = srq->Take();
    if (!wr) {
      std::this_thread::yield();
      continue;
    }
    const std::uint64_t p = wr->wr_id >> 32;
    ASSERT_LT(p, 2u);
    ASSERT_EQ(wr->wr_id & 0xFFFFFFFFu, next[p]);
    ++next[p];
    ++taken;
  }
  for (auto& t : posters) t.join();
  EXPECT_EQ(taken, 2 * kPerPoster);
  EXPECT_EQ(srq->size(), 0u);
  EXPECT_GE(events.load(), 1);  // the final drain passes below 16 while armed
}

}  // namespace
}  // namespace siwx::engine
