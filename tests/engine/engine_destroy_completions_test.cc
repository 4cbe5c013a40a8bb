// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// CompletionQueue::RemoveQp, which the provider's ibv_destroy_qp uses so
// that no completion of a destroyed QP is polled afterwards: first on the
// ring alone (order, wrap-around, receives kept for SRQ QPs), then with two
// live QPs sharing a send and a receive CQ, one of them destroyed while its
// completions are still queued.
#include <gtest/gtest.h>

#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

WorkCompletion Entry(std::uint32_t qp_num, std::uint64_t wr_id, WcOpcode opcode) {
  WorkCompletion wc;
  wc.qp_num = qp_num;
  wc.wr_id = wr_id;
  wc.opcode = opcode;
  return wc;
}

std::vector<std::uint64_t> PollAllIds(CompletionQueue& cq) {
  std::vector<std::uint64_t> ids;
  std::array<WorkCompletion, 4> batch;
  for (;;) {
    const std::size_t n = cq.Poll(batch);
    for (std::size_t i = 0; i < n; ++i) ids.push_back(batch[i].wr_id);
    if (n == 0) return ids;
  }
}

TEST(CqRemoveQp, RemovesOnlyThatQpAndKeepsOrderAcrossWrapAround) {
  auto cq = CompletionQueue::Create(5, {});
  ASSERT_NE(cq, nullptr);
  // Move the head to slot 3 so the entries below wrap around the ring end.
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_EQ(cq->Push(Entry(9, i, WcOpcode::kSend)), PushStatus::kOk);
  ASSERT_EQ(PollAllIds(*cq).size(), 3u);
  ASSERT_EQ(cq->Push(Entry(7, 10, WcOpcode::kSend)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(8, 11, WcOpcode::kRecv)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(7, 12, WcOpcode::kRecv)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(8, 13, WcOpcode::kRdmaWrite)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(7, 14, WcOpcode::kRdmaRead)), PushStatus::kOk);

  EXPECT_EQ(cq->RemoveQp(7, QpEntries::kAll), 3u);
  EXPECT_EQ(cq->size(), 2u);
  EXPECT_EQ(PollAllIds(*cq), (std::vector<std::uint64_t>{11, 13}));
  EXPECT_EQ(cq->RemoveQp(7, QpEntries::kAll), 0u);
}

TEST(CqRemoveQp, AllButReceivesKeepsEveryReceiveOpcode) {
  auto cq = CompletionQueue::Create(8, {});
  ASSERT_NE(cq, nullptr);
  WorkCompletion flushed = Entry(7, 4, WcOpcode::kRecv);
  flushed.status = WcStatus::kWrFlushErr;
  ASSERT_EQ(cq->Push(Entry(7, 1, WcOpcode::kSend)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(7, 2, WcOpcode::kRecv)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(7, 3, WcOpcode::kRecvRdmaWithImm)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(flushed), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(7, 5, WcOpcode::kLocalInv)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(6, 6, WcOpcode::kSend)), PushStatus::kOk);

  EXPECT_EQ(cq->RemoveQp(7, QpEntries::kAllButReceives), 2u);
  EXPECT_EQ(PollAllIds(*cq), (std::vector<std::uint64_t>{2, 3, 4, 6}));
}

TEST(CqRemoveQp, FreedRoomTakesNewEntriesAndAnErrorStays) {
  auto cq = CompletionQueue::Create(2, {});
  ASSERT_NE(cq, nullptr);
  ASSERT_EQ(cq->Push(Entry(7, 1, WcOpcode::kSend)), PushStatus::kOk);
  ASSERT_EQ(cq->Push(Entry(8, 2, WcOpcode::kSend)), PushStatus::kOk);
  EXPECT_EQ(cq->RemoveQp(7, QpEntries::kAll), 1u);
  ASSERT_EQ(cq->Push(Entry(8, 3, WcOpcode::kSend)), PushStatus::kOk);
  // Full again: the overflow puts the CQ in error, and removing does not
  // take the error back (the consumer has lost a completion).
  EXPECT_EQ(cq->Push(Entry(8, 4, WcOpcode::kSend)), PushStatus::kOverflow);
  EXPECT_EQ(cq->RemoveQp(8, QpEntries::kAll), 2u);
  EXPECT_TRUE(cq->in_error());
  EXPECT_EQ(cq->Push(Entry(8, 5, WcOpcode::kSend)), PushStatus::kInError);
  EXPECT_TRUE(PollAllIds(*cq).empty());
}

// Two QPs on one engine share a's CQs, each connected to its own peer. Both
// have a completed Send and two completed receives queued, plus a receive
// still posted; the first QP is destroyed before anything is polled.
TEST(CqRemoveQp, DestroyedQpLeavesOnlyTheOtherQpsCompletions) {
  Node a;
  Node peer_x;
  Node peer_y;
  QpConfig config;
  config.pd = a.pd;
  config.send_cq = a.send_cq.get();
  config.recv_cq = a.recv_cq.get();
  config.sq_caps = QueueCaps{16, 2, 0};
  config.rq_caps = QueueCaps{16, 2, 0};
  std::shared_ptr<Qp> y = a.engine->CreateQp(config);
  ASSERT_NE(y, nullptr);
  ASSERT_EQ(y->Modify(QpState::kInit), QpStatus::kOk);
  std::shared_ptr<Qp>& x = a.qp;
  Link(a, peer_x, Transport::kSocketPair, {});
  {
    const std::array<int, 2> fds = Connect(Transport::kSocketPair);
    ASSERT_EQ(y->Bind(std::make_unique<transport::TcpStream>(fds[0]), ParamsFor({})),
              BindStatus::kOk);
    peer_y.Bind(fds[1], ParamsFor({}));
  }

  constexpr std::size_t kSize = 64;
  // Slots 0-5 take the receives; a's two Sends read slot 6, which no receive
  // covers: a Send may still be reading its source while the peer's Send is
  // placed into a receive, so the two must never share octets.
  constexpr std::size_t kSendSlot = 6;
  Buffer a_mem(7 * kSize);
  const std::uint32_t a_key = a_mem.Register(a.memory(), a.pd, AccessFlags::kLocalWrite);
  Buffer x_mem(2 * kSize);
  const std::uint32_t x_key = x_mem.Register(peer_x.memory(), peer_x.pd, AccessFlags::kLocalWrite);
  Buffer y_mem(2 * kSize);
  const std::uint32_t y_key = y_mem.Register(peer_y.memory(), peer_y.pd, AccessFlags::kLocalWrite);

  // wr_ids: x's are 1xx, y's 2xx; receives x0/y0 and x1/y1 complete, x2/y2 stay.
  auto post_receives = [&](Qp& qp, std::uint64_t base, std::size_t slot) {
    for (std::uint64_t i = 0; i < 3; ++i) {
      ReceiveWorkRequest r;
      r.wr_id = base + i;
      AddSge(r, a_mem.addr() + (slot + i) * kSize, kSize, a_key);
      ASSERT_EQ(qp.PostRecv(r), PostStatus::kOk);
    }
  };
  post_receives(*x, 100, 0);
  post_receives(*y, 200, 3);
  auto peer_sends = [&](Node& peer, Buffer& mem, std::uint32_t key) {
    ReceiveWorkRequest r;
    r.wr_id = 900;
    AddSge(r, mem.addr() + kSize, kSize, key);
    ASSERT_EQ(peer.qp->PostRecv(r), PostStatus::kOk);
    for (std::uint64_t i = 0; i < 2; ++i) {
      SendWorkRequest s = MakeSend(800 + i, SendOpcode::kSend, 0);
      AddSge(s, mem.addr(), kSize, key);
      ASSERT_EQ(peer.qp->PostSend(s), PostStatus::kOk);
    }
  };
  peer_sends(peer_x, x_mem, x_key);
  peer_sends(peer_y, y_mem, y_key);
  SendWorkRequest to_x = MakeSend(110, SendOpcode::kSend);
  AddSge(to_x, a_mem.addr() + kSendSlot * kSize, kSize, a_key);
  ASSERT_EQ(x->PostSend(to_x), PostStatus::kOk);
  SendWorkRequest to_y = MakeSend(210, SendOpcode::kSend);
  AddSge(to_y, a_mem.addr() + kSendSlot * kSize, kSize, a_key);
  ASSERT_EQ(y->PostSend(to_y), PostStatus::kOk);
  ASSERT_TRUE(WaitUntil([&] { return a.recv_cq->size() == 4 && a.send_cq->size() == 2; }))
      << "recv " << a.recv_cq->size() << " send " << a.send_cq->size();
  ASSERT_EQ(WaitCompletions(*peer_x.recv_cq, 1).size(), 1u);
  ASSERT_EQ(WaitCompletions(*peer_y.recv_cq, 1).size(), 1u);

  const std::uint32_t x_num = x->qp_num();
  x->Destroy();
  EXPECT_EQ(a.send_cq->RemoveQp(x_num, QpEntries::kAll), 1u);
  EXPECT_EQ(a.recv_cq->RemoveQp(x_num, QpEntries::kAll), 2u);
  x.reset();

  const std::vector<WorkCompletion> sends = WaitCompletions(*a.send_cq, 1);
  ASSERT_EQ(sends.size(), 1u);
  EXPECT_EQ(sends[0].wr_id, 210u);
  EXPECT_EQ(sends[0].qp_num, y->qp_num());
  EXPECT_EQ(sends[0].status, WcStatus::kSuccess);
  const std::vector<WorkCompletion> recvs = WaitCompletions(*a.recv_cq, 2);
  ASSERT_EQ(recvs.size(), 2u);
  EXPECT_EQ(recvs[0].wr_id, 200u);
  EXPECT_EQ(recvs[1].wr_id, 201u);
  for (const WorkCompletion& wc : recvs) {
    EXPECT_EQ(wc.qp_num, y->qp_num());
    EXPECT_EQ(wc.status, WcStatus::kSuccess);
    EXPECT_EQ(wc.byte_len, kSize);
  }
  // The destroyed QP's posted receive (102) never completes.
  EXPECT_TRUE(StaysEmpty(*a.recv_cq, std::chrono::milliseconds(100)));
  EXPECT_TRUE(StaysEmpty(*a.send_cq, std::chrono::milliseconds(0)));
  y->Destroy();
}

}  // namespace
}  // namespace siwx::engine::testing
