// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Send and receive queues whose records are sized by the QP's caps
// (work_request.h, RecordSlots): WRs at max_send_sge / max_recv_sge, inline
// data at max_inline_data (in the slot, and longer than the slot in the
// queue's inline area) and one octet over it, through queues that wrap
// around many times. Every octet that arrives is checked.
#include <gtest/gtest.h>

#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

constexpr std::uint32_t kDepth = 3;
constexpr std::uint32_t kSendSge = 4;   // 64 octets of SGE room per SQ slot
constexpr std::uint32_t kRecvSge = 3;
constexpr std::uint32_t kMaxInline = 100;  // more than the slot room: the inline area
constexpr std::size_t kArea = 4096;

class WrLayoutTest : public ::testing::Test {
 protected:
  static NodeOptions Options() {
    NodeOptions o;
    o.sq_caps = QueueCaps{kDepth, kSendSge, kMaxInline};
    o.rq_caps = QueueCaps{kDepth, kRecvSge, 0};
    return o;
  }

  void SetUp() override {
    Link(a_, b_, Transport::kSocketPair, LinkOptions{});
    src_.Fill(7);
    src_key_ = src_.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
    dst_key_ = dst_.Register(b_.memory(), b_.pd,
                             AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite);
  }

  // An RDMA Write of `size` octets from src_ at `from` to dst_ at `to`,
  // inline or from `sges` SGEs.
  SendWorkRequest Write(std::uint64_t id, std::size_t from, std::size_t to, std::size_t size,
                        bool inline_data, std::size_t sges) {
    SendWorkRequest wr = MakeSend(id, SendOpcode::kRdmaWrite);
    wr.remote_addr = dst_.addr() + to;
    wr.rkey = dst_key_;
    if (inline_data) {
      const ByteSpan piece(src_.data() + from, size);
      EXPECT_TRUE(wr.CopyInline(std::span<const ByteSpan>(&piece, 1)));
    } else {
      AddSplitSges(wr, src_.addr() + from, size, src_key_, sges);
    }
    return wr;
  }

  // A zero-length Send from a to b, after the Writes posted before it: its
  // receive completion means they are placed (RFC 5040 5.5), and the CQ
  // orders the placement before the checks that follow.
  void Fence(std::uint64_t id) {
    ReceiveWorkRequest recv;
    recv.wr_id = id;
    ASSERT_EQ(b_.qp->PostRecv(recv), PostStatus::kOk);
    ASSERT_EQ(a_.qp->PostSend(MakeSend(id, SendOpcode::kSend)), PostStatus::kOk);
    const auto received = WaitCompletions(*b_.recv_cq, 1);
    ASSERT_EQ(received.size(), 1u);
    EXPECT_EQ(received[0].wr_id, id);
    EXPECT_EQ(received[0].status, WcStatus::kSuccess);
    const auto sent = WaitCompletions(*a_.send_cq, 1);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].wr_id, id);
  }

  void ExpectLanded(std::size_t from, std::size_t to, std::size_t size) {
    for (std::size_t i = 0; i < size; ++i) {
      ASSERT_EQ(dst_.data()[to + i], src_.data()[from + i]) << "octet " << i << " at " << to;
    }
  }

  Node a_{Options()};
  Node b_{Options()};
  Buffer src_{kArea};
  Buffer dst_{kArea};
  std::uint32_t src_key_ = 0;
  std::uint32_t dst_key_ = 0;
};

TEST_F(WrLayoutTest, LimitsAreTheQpCaps) {
  SendWorkRequest too_many = Write(1, 0, 0, 64, false, kSendSge + 1);
  EXPECT_EQ(a_.qp->PostSend(too_many), PostStatus::kTooManySge);
  SendWorkRequest too_long = Write(2, 0, 0, kMaxInline + 1, true, 0);
  EXPECT_EQ(a_.qp->PostSend(too_long), PostStatus::kInlineTooLong);
  ReceiveWorkRequest recv;
  AddSplitSges(recv, dst_.addr(), 64, dst_key_, kRecvSge + 1);
  EXPECT_EQ(a_.qp->PostRecv(recv), PostStatus::kTooManySge);
  // Nothing was queued: a full queue's worth of WRs still fits.
  for (std::uint64_t i = 0; i < kDepth; ++i) {
    ASSERT_EQ(a_.qp->PostSend(Write(10 + i, 0, 64 * i, 64, false, kSendSge)), PostStatus::kOk);
  }
  const auto done = WaitCompletions(*a_.send_cq, kDepth);
  ASSERT_EQ(done.size(), kDepth);
  for (const WorkCompletion& wc : done) EXPECT_EQ(wc.status, WcStatus::kSuccess);
  Fence(100);
  for (std::size_t i = 0; i < kDepth; ++i) ExpectLanded(0, 64 * i, 64);
}

TEST_F(WrLayoutTest, WritesWrapAroundTheSendQueue) {
  // Round r fills the 3-deep SQ with: max_sge SGEs, inline at the cap (the
  // inline area), and inline that fits the slot; 8 rounds wrap it 8 times.
  std::size_t to = 0;
  for (std::uint64_t round = 0; round < 8; ++round) {
    struct Posted {
      std::size_t from, to, size;
    };
    std::vector<Posted> posted;
    const std::size_t sizes[kDepth] = {200 + round, kMaxInline, 16 + round};
    for (std::uint32_t k = 0; k < kDepth; ++k) {
      const std::size_t from = (round * 37 + k * 301) % (kArea - 512);
      const bool inline_data = k != 0;
      ASSERT_EQ(a_.qp->PostSend(Write(round * 10 + k, from, to, sizes[k], inline_data, kSendSge)),
                PostStatus::kOk);
      posted.push_back({from, to, sizes[k]});
      to = (to + sizes[k]) % (kArea - 512);
    }
    const auto done = WaitCompletions(*a_.send_cq, kDepth);
    ASSERT_EQ(done.size(), kDepth);
    for (std::uint32_t k = 0; k < kDepth; ++k) {
      EXPECT_EQ(done[k].wr_id, round * 10 + k);
      EXPECT_EQ(done[k].status, WcStatus::kSuccess);
      EXPECT_EQ(done[k].byte_len, posted[k].size);
    }
    Fence(1000 + round);  // a fourth WR per round: the SQ wraps at another place
    for (const Posted& p : posted) ExpectLanded(p.from, p.to, p.size);
  }
  EXPECT_TRUE(dst_.GuardsIntact());
}

TEST_F(WrLayoutTest, SendsIntoReceivesAtMaxSgeWrapAround) {
  for (std::uint64_t round = 0; round < 4; ++round) {
    for (std::uint32_t k = 0; k < kDepth; ++k) {
      ReceiveWorkRequest recv;
      recv.wr_id = round * 10 + k;
      AddSplitSges(recv, dst_.addr() + 256 * k, 256, dst_key_, kRecvSge);
      ASSERT_EQ(b_.qp->PostRecv(recv), PostStatus::kOk);
    }
    for (std::uint32_t k = 0; k < kDepth; ++k) {
      const std::size_t size = k == 1 ? kMaxInline : 150 + round;
      SendWorkRequest send = MakeSend(round * 10 + k, SendOpcode::kSend);
      const std::size_t from = 512 * k + round;
      if (k == 1) {
        const ByteSpan piece(src_.data() + from, size);
        ASSERT_TRUE(send.CopyInline(std::span<const ByteSpan>(&piece, 1)));
      } else {
        AddSplitSges(send, src_.addr() + from, size, src_key_, kSendSge);
      }
      ASSERT_EQ(a_.qp->PostSend(send), PostStatus::kOk);
    }
    const auto received = WaitCompletions(*b_.recv_cq, kDepth);
    ASSERT_EQ(received.size(), kDepth);
    for (std::uint32_t k = 0; k < kDepth; ++k) {
      const std::size_t size = k == 1 ? kMaxInline : 150 + round;
      EXPECT_EQ(received[k].wr_id, round * 10 + k);
      EXPECT_EQ(received[k].status, WcStatus::kSuccess);
      EXPECT_EQ(received[k].byte_len, size);
      ExpectLanded(512 * k + round, 256 * k, size);
    }
    ASSERT_EQ(WaitCompletions(*a_.send_cq, kDepth).size(), kDepth);
  }
}

}  // namespace
}  // namespace siwx::engine::testing
