// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The stored forms of work requests (SendRecord, ReceiveRecord) in their
// fixed-stride slots (RecordSlots), sized by a queue's caps: the SGE count
// at max_sge, inline data in the slot, Local Invalidate, and a receive queue
// whose records wrap around with different SGE counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/engine/receive_queue.h"
#include "common/engine/work_request.h"

namespace siwx::engine {
namespace {

Sge SgeFor(std::uint64_t wr_id, std::uint32_t i) {
  return {0x100000 * (wr_id + 1) + 0x100 * i, 0x20 + i, 0xA000u + static_cast<std::uint32_t>(i)};
}

ReceiveWorkRequest Recv(std::uint64_t wr_id, std::uint32_t num_sge) {
  ReceiveWorkRequest wr;
  wr.wr_id = wr_id;
  wr.num_sge = num_sge;
  for (std::uint32_t i = 0; i < num_sge; ++i) wr.sge[i] = SgeFor(wr_id, i);
  return wr;
}

void ExpectSges(std::span<const Sge> got, std::uint64_t wr_id, std::uint32_t num_sge) {
  ASSERT_EQ(got.size(), num_sge);
  for (std::uint32_t i = 0; i < num_sge; ++i) {
    const Sge want = SgeFor(wr_id, i);
    EXPECT_EQ(got[i].addr, want.addr) << "wr " << wr_id << " sge " << i;
    EXPECT_EQ(got[i].length, want.length) << "wr " << wr_id << " sge " << i;
    EXPECT_EQ(got[i].lkey, want.lkey) << "wr " << wr_id << " sge " << i;
  }
}

TEST(RecordSlots, StrideHoldsTheCapsAndNoMore) {
  for (const std::uint32_t max_sge : {0u, 1u, 3u, kMaxSge}) {
    RecordSlots<ReceiveRecord> slots(4, std::size_t{max_sge} * sizeof(Sge));
    EXPECT_EQ(slots.size(), 4u);
    EXPECT_EQ(slots.payload_capacity(), max_sge * sizeof(Sge)) << max_sge;
  }
  // A payload that is not a multiple of the alignment is rounded up.
  RecordSlots<ReceiveRecord> odd(2, 5);
  EXPECT_GE(odd.payload_capacity(), 5u);
  EXPECT_LT(odd.payload_capacity(), 5u + alignof(ReceiveRecord));
  // One SGE: 32 octets per receive WR instead of 272 with kMaxSge.
  EXPECT_LE(sizeof(ReceiveRecord) + sizeof(Sge), 32u);
}

TEST(RecordSlots, FullRecordsDoNotOverlap) {
  constexpr std::uint32_t kSge = 3;
  RecordSlots<ReceiveRecord> slots(5, kSge * sizeof(Sge));
  for (std::uint32_t i = 0; i < slots.size(); ++i) slots[i].Assign(Recv(i, kSge));
  for (std::uint32_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(slots[i].wr_id, i);
    ExpectSges(slots[i].sges(), i, kSge);
    ReceiveWorkRequest back;
    slots[i].CopyTo(back);
    EXPECT_EQ(back.wr_id, i);
    ExpectSges(back.sges(), i, kSge);
  }
}

struct SendSlot {
  std::uint32_t marker = 0;
  SendRecord wr;  // last: the payload follows
};

TEST(SendRecord, SgesAtMaxSgeStayInTheirSlot) {
  constexpr std::uint32_t kSge = 4;
  RecordSlots<SendSlot> slots(3, kSge * sizeof(Sge));
  for (std::uint32_t i = 0; i < slots.size(); ++i) {
    SendWorkRequest wr;
    wr.wr_id = i;
    wr.opcode = SendOpcode::kRdmaWrite;
    wr.flags = kSendSignaled;
    wr.remote_addr = 0x5000 + i;
    wr.rkey = 0x77 + i;
    wr.num_sge = kSge;
    for (std::uint32_t k = 0; k < kSge; ++k) wr.sge[k] = SgeFor(i, k);
    slots[i].marker = 0xC0DE0000u + i;
    slots[i].wr.Assign(wr, slots.payload(i));
  }
  for (std::uint32_t i = 0; i < slots.size(); ++i) {
    const SendRecord& r = slots[i].wr;
    EXPECT_EQ(slots[i].marker, 0xC0DE0000u + i);
    EXPECT_EQ(r.wr_id, i);
    EXPECT_EQ(r.opcode, SendOpcode::kRdmaWrite);
    EXPECT_TRUE(r.signaled());
    EXPECT_FALSE(r.is_inline());
    EXPECT_EQ(r.remote_addr, 0x5000u + i);
    EXPECT_EQ(r.rkey, 0x77u + i);
    ExpectSges(r.sges(), i, kSge);
    std::uint64_t total = 0;
    for (std::uint32_t k = 0; k < kSge; ++k) total += SgeFor(i, k).length;
    EXPECT_EQ(r.total_length(), total);
  }
}

TEST(SendRecord, InlineDataFillingTheSlotKeepsNoSges) {
  constexpr std::uint32_t kSge = 2;  // 32 octets of payload room
  RecordSlots<SendSlot> slots(2, kSge * sizeof(Sge));
  ASSERT_EQ(slots.payload_capacity(), 32u);
  std::vector<std::uint8_t> data(32);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(0x30 + i);
  const ByteSpan piece(data);
  SendWorkRequest wr;
  wr.wr_id = 9;
  wr.opcode = SendOpcode::kSend;
  wr.num_sge = 1;  // the application's buffer, copied in: not kept
  wr.sge[0] = SgeFor(9, 0);
  ASSERT_TRUE(wr.CopyInline(std::span<const ByteSpan>(&piece, 1)));
  slots[0].wr.Assign(wr, slots.payload(0));
  slots[1].marker = 0x11223344;
  const SendRecord& r = slots[0].wr;
  EXPECT_TRUE(r.is_inline());
  EXPECT_EQ(r.num_sge, 0u);
  EXPECT_TRUE(r.sges().empty());
  EXPECT_EQ(r.total_length(), 32u);
  ASSERT_EQ(r.inline_bytes().size(), 32u);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), r.inline_bytes().begin()));
  EXPECT_EQ(slots[1].marker, 0x11223344u);  // the next slot is untouched
}

TEST(SendRecord, LocalInvalidateKeepsNoSges) {
  RecordSlots<SendSlot> slots(1, 0);  // max_sge 0
  SendWorkRequest wr;
  wr.opcode = SendOpcode::kLocalInvalidate;
  wr.invalidate_stag = 0x4242;
  wr.num_sge = 3;  // not validated for a Local Invalidate; must not be copied
  slots[0].wr.Assign(wr, slots.payload(0));
  EXPECT_EQ(slots[0].wr.num_sge, 0u);
  EXPECT_EQ(slots[0].wr.invalidate_stag, 0x4242u);
}

TEST(ReceiveQueueRecords, MaxSgeRoundTripsAndOneMoreIsRefused) {
  for (const std::uint32_t max_sge : {1u, 4u, kMaxSge}) {
    auto rq = ReceiveQueue::Create(ReceiveQueue::Kind::kQueuePair, {2, max_sge, 0});
    ASSERT_NE(rq, nullptr);
    EXPECT_EQ(rq->Post(Recv(1, max_sge)), PostStatus::kOk);
    if (max_sge < kMaxSge) {
      EXPECT_EQ(rq->Post(Recv(2, max_sge + 1)), PostStatus::kTooManySge);
    }
    const std::optional<ReceiveWorkRequest> wr = rq->Take();
    ASSERT_TRUE(wr.has_value());
    EXPECT_EQ(wr->wr_id, 1u);
    ExpectSges(wr->sges(), 1, max_sge);
    EXPECT_FALSE(rq->Take().has_value());
  }
}

TEST(ReceiveQueueRecords, WrapAroundWithMixedSgeCounts) {
  constexpr std::uint32_t kDepth = 3;
  constexpr std::uint32_t kSge = 4;
  auto rq = ReceiveQueue::Create(ReceiveQueue::Kind::kQueuePair, {kDepth, kSge, 0});
  ASSERT_NE(rq, nullptr);
  std::uint64_t next_post = 0;
  std::uint64_t next_take = 0;
  const auto sges_of = [](std::uint64_t id) { return static_cast<std::uint32_t>(id % (kSge + 1)); };
  // Fill, then alternate take one / post one, so head and tail wrap many times.
  for (std::uint32_t i = 0; i < kDepth; ++i) {
    ASSERT_EQ(rq->Post(Recv(next_post, sges_of(next_post))), PostStatus::kOk);
    ++next_post;
  }
  EXPECT_EQ(rq->Post(Recv(99, 1)), PostStatus::kQueueFull);
  for (int round = 0; round < 20; ++round) {
    const std::optional<ReceiveWorkRequest> wr = rq->Take();
    ASSERT_TRUE(wr.has_value());
    EXPECT_EQ(wr->wr_id, next_take);
    ExpectSges(wr->sges(), next_take, sges_of(next_take));
    ++next_take;
    ASSERT_EQ(rq->Post(Recv(next_post, sges_of(next_post))), PostStatus::kOk);
    ++next_post;
  }
  // Flush after the wrap: oldest first, SGEs intact.
  const std::vector<ReceiveWorkRequest> flushed = rq->Flush();
  ASSERT_EQ(flushed.size(), kDepth);
  for (const ReceiveWorkRequest& wr : flushed) {
    EXPECT_EQ(wr.wr_id, next_take);
    ExpectSges(wr.sges(), next_take, sges_of(next_take));
    ++next_take;
  }
  EXPECT_EQ(rq->size(), 0u);
}

}  // namespace
}  // namespace siwx::engine
