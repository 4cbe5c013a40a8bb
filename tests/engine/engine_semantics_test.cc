// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// RDMAP semantics between two engine QPs (RFC 5040 5, 7; RFC 5042 6):
// invalidation, solicited events, inline data, signaling, local operations,
// fences and completion order, local errors, errors reported by Terminate
// across engines, RTR, disconnect, modify to ERR, destroy, SRQ.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <vector>

#include "common/util/bytes.h"
#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

using rdmap::TerminateCause;

class SemanticsTest : public ::testing::Test {
 protected:
  void Connect(const LinkOptions& o = {}, Transport t = Transport::kSocketPair) {
    Link(a_, b_, t, o);
  }

  Node a_;
  Node b_;
};

// RFC 5040 5.3: on a Send with Invalidate the RDMAP layer MUST "Invalidate
// the STag if it is associated with the RDMAP Stream; or issue a Terminate
// Message with the STag Cannot be Invalidated Terminate Error Code, if the
// STag is not associated with the RDMAP Stream"; 8.1.1 rule 7: "An RNIC MUST
// ensure that a Remote Peer is not able to invalidate an STag enabled for
// remote access, if the STag is shared on multiple streams." A memory
// region is valid on every QP of its PD: the peer on one connection gets
// RDMAP Remote Protection / STag cannot be Invalidated (0/1/0x09), and the
// region keeps serving the other connection.
TEST_F(SemanticsTest, SendWithInvalidateCannotInvalidateAMemoryRegion) {
  NodeOptions shared;
  shared.pd = b_.pd;
  Node b2(shared, b_.engine);  // second QP of b's engine, same PD
  Node c;
  Connect();                                      // a <-> b
  Link(c, b2, Transport::kSocketPair, LinkOptions{});  // c <-> b2
  Buffer exposed(64);
  const std::uint32_t rkey = exposed.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer rbuf(16);
  PostRecv(b_, 1, rbuf, rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite));

  SendWorkRequest inv = MakeSend(2, SendOpcode::kSendWithInvalidate);
  inv.invalidate_stag = rkey;
  ASSERT_EQ(a_.qp->PostSend(inv), PostStatus::kOk);
  const auto rwc = WaitCompletions(*b_.recv_cq, 1);
  ASSERT_EQ(rwc.size(), 1u);
  EXPECT_EQ(rwc[0].status, WcStatus::kRemInvReqErr);
  EXPECT_TRUE(b_.events.WaitFor(AsyncEventType::kQpAccessError));
  EXPECT_TRUE(WaitUntil([&] { return a_.qp->Query().terminate_received.has_value(); }));
  const QpAttributes ba = b_.qp->Query();
  ASSERT_TRUE(ba.terminate_sent.has_value());
  EXPECT_EQ(ba.terminate_sent->cause, TerminateCause::RdmapStagCannotBeInvalidated());
  EXPECT_EQ(ba.terminate_sent->cause.layer, 0);  // RDMAP
  EXPECT_EQ(ba.terminate_sent->cause.etype, 1);  // Remote Protection Error
  EXPECT_EQ(ba.terminate_sent->cause.ecode, 0x09);
  // The DDP header copy names the offending Send with Invalidate (Figure 10).
  ASSERT_TRUE(ba.terminate_sent->d);
  const ByteSpan copy = ba.terminate_sent->DdpHeaderCopy();
  ASSERT_GE(copy.size(), rdmap::kDdpUntaggedHeaderSize);
  EXPECT_EQ(copy[1] & 0x0F, static_cast<int>(rdmap::Opcode::kSendWithInvalidate));
  EXPECT_EQ(LoadBe32(copy.data() + 2), rkey);  // the Invalidate STag field
  EXPECT_EQ(a_.qp->Query().terminate_received->cause, TerminateCause::RdmapStagCannotBeInvalidated());
  EXPECT_TRUE(WaitUntil([&] { return b_.qp->state() == QpState::kError; }));

  // The region is still valid, and the other connection still writes it.
  EXPECT_TRUE(b_.memory().Check(rkey, b_.pd, AccessKind::kRemoteWrite, exposed.addr(), 64).ok());
  Buffer src(64);
  src.Fill(21);
  const std::uint32_t key = src.Register(c.memory(), c.pd, AccessFlags::kLocalWrite);
  SendWorkRequest write = MakeSend(3, SendOpcode::kRdmaWrite);
  AddSge(write, src.addr(), 64, key);
  write.rkey = rkey;
  write.remote_addr = exposed.addr();
  // The Send behind the Write tells b2's side the Write was placed.
  Buffer note(16);
  PostRecv(b2, 4, note, note.Register(b2.memory(), b2.pd, AccessFlags::kLocalWrite));
  ASSERT_EQ(c.qp->PostSend(write), PostStatus::kOk);
  ASSERT_EQ(c.qp->PostSend(MakeSend(5, SendOpcode::kSend)), PostStatus::kOk);
  const auto swc = WaitCompletions(*c.send_cq, 2);
  ASSERT_EQ(swc.size(), 2u);
  EXPECT_EQ(swc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(swc[1].status, WcStatus::kSuccess);
  const auto delivered = WaitCompletions(*b2.recv_cq, 1);
  ASSERT_EQ(delivered.size(), 1u);
  EXPECT_EQ(delivered[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(SameBytes(exposed.data(), src.data(), 64));
  EXPECT_TRUE(exposed.GuardsIntact());
  EXPECT_EQ(b2.qp->state(), QpState::kRts);
  EXPECT_FALSE(b2.qp->Query().terminate_sent.has_value());
}

TEST_F(SemanticsTest, SolicitedEventNotifiesAnArmedCq) {
  Connect();
  Buffer rbuf(16);
  const std::uint32_t key = rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  PostRecv(b_, 1, rbuf, key);
  PostRecv(b_, 2, rbuf, key);
  b_.recv_cq->Arm(CqArm::kSolicited);
  ASSERT_EQ(a_.qp->PostSend(MakeSend(10, SendOpcode::kSend, 0)), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*b_.recv_cq, 1).size(), 1u);
  EXPECT_EQ(b_.recv_notifications.load(), 0);  // not solicited
  ASSERT_EQ(a_.qp->PostSend(MakeSend(11, SendOpcode::kSendWithSolicitedEvent, 0)), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*b_.recv_cq, 1).size(), 1u);
  // The notification runs on the pushing thread after the entry became
  // pollable, so it may come a moment after the poll saw the entry.
  EXPECT_TRUE(WaitUntil([&] { return b_.recv_notifications.load() == 1; }));
  EXPECT_EQ(b_.recv_notifications.load(), 1);
}

TEST_F(SemanticsTest, InlineDataIsCopiedAtPost) {
  Connect();
  Buffer rbuf(32, 0);
  PostRecv(b_, 1, rbuf, rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite));
  std::uint8_t app[20];
  for (int i = 0; i < 20; ++i) app[i] = static_cast<std::uint8_t>(100 + i);
  SendWorkRequest wr = MakeSend(1, SendOpcode::kSend, kSendSignaled);
  const std::array<ByteSpan, 2> pieces{ByteSpan(app, 12), ByteSpan(app + 12, 8)};
  ASSERT_TRUE(wr.CopyInline(pieces));
  ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  std::memset(app, 0, sizeof(app));  // reusable as soon as the post returns
  const auto wc = WaitCompletions(*b_.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].byte_len, 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(rbuf.data()[i], 100 + i);
  const auto sc = WaitCompletions(*a_.send_cq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].byte_len, 20u);
}

TEST_F(SemanticsTest, OnlySignaledWrsComplete) {
  Connect();
  Buffer target(16);
  const std::uint32_t rkey = target.Register(b_.memory(), b_.pd, kAllRemote);
  SendWorkRequest w1 = MakeSend(1, SendOpcode::kRdmaWrite, 0);
  w1.rkey = rkey;
  SendWorkRequest w2 = MakeSend(2, SendOpcode::kRdmaWrite, 0);
  w2.rkey = rkey;
  const std::array<SendWorkRequest, 3> wrs{w1, w2, MakeSend(3, SendOpcode::kRdmaWrite)};
  std::size_t posted = 0;
  ASSERT_EQ(a_.qp->PostSend(wrs, &posted), PostStatus::kOk);
  EXPECT_EQ(posted, 3u);
  const auto wc = WaitCompletions(*a_.send_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
  EXPECT_TRUE(StaysEmpty(*a_.send_cq, std::chrono::milliseconds(10)));
  EXPECT_TRUE(WaitUntil([&] { return a_.qp->Query().sq_outstanding == 0; }));
}

// ibv_wr_complete (ibv_wr_post(3)): "If a failure is detected ... the
// entire posting will be aborted". PostSendAll queues every WR or none:
// a bad WR anywhere, or too little room in the SQ, leaves the SQ as it was;
// PostSend, as ibv_post_send, keeps the WRs before the bad one.
TEST_F(SemanticsTest, PostSendAllPostsEveryWrOrNone) {
  NodeOptions options;
  options.sq_caps.max_wr = 4;
  Node a(options);
  Node b;
  Link(a, b, Transport::kSocketPair, {});
  Buffer rbuf(64, 0);
  const std::uint32_t lkey = rbuf.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  for (std::uint64_t i = 1; i <= 4; ++i) PostRecv(b, i, rbuf, lkey);

  SendWorkRequest bad = MakeSend(3, SendOpcode::kSend);
  bad.num_sge = options.sq_caps.max_sge + 1;
  const std::array<SendWorkRequest, 3> with_bad{MakeSend(1, SendOpcode::kSend),
                                                MakeSend(2, SendOpcode::kSend), bad};
  EXPECT_EQ(a.qp->PostSendAll(with_bad), PostStatus::kTooManySge);
  const std::vector<SendWorkRequest> five(5, MakeSend(4, SendOpcode::kSend));
  EXPECT_EQ(a.qp->PostSendAll(five), PostStatus::kQueueFull);
  EXPECT_EQ(a.qp->Query().sq_outstanding, 0u);
  EXPECT_TRUE(StaysEmpty(*b.recv_cq, std::chrono::milliseconds(20)));
  EXPECT_TRUE(StaysEmpty(*a.send_cq, std::chrono::milliseconds(0)));

  std::size_t posted = 0;
  EXPECT_EQ(a.qp->PostSend(with_bad, &posted), PostStatus::kTooManySge);
  EXPECT_EQ(posted, 2u);
  ASSERT_EQ(WaitCompletions(*b.recv_cq, 2).size(), 2u);
  ASSERT_EQ(WaitCompletions(*a.send_cq, 2).size(), 2u);
  ASSERT_TRUE(WaitUntil([&] { return a.qp->Query().sq_outstanding == 0; }));
  const std::vector<SendWorkRequest> two(2, MakeSend(5, SendOpcode::kSend));
  EXPECT_EQ(a.qp->PostSendAll(two), PostStatus::kOk);
  EXPECT_EQ(WaitCompletions(*b.recv_cq, 2).size(), 2u);
  EXPECT_EQ(WaitCompletions(*a.send_cq, 2).size(), 2u);
}

TEST_F(SemanticsTest, SqSigAllCompletesEveryWr) {
  NodeOptions options;
  options.sq_sig_all = true;
  Node a(options);
  Node b;
  Link(a, b, Transport::kSocketPair, {});
  std::vector<SendWorkRequest> wrs;
  for (std::uint64_t i = 1; i <= 3; ++i) wrs.push_back(MakeSend(i, SendOpcode::kRdmaWrite, 0));
  std::size_t posted = 0;
  ASSERT_EQ(a.qp->PostSend(wrs, &posted), PostStatus::kOk);
  const auto wc = WaitCompletions(*a.send_cq, 3);
  ASSERT_EQ(wc.size(), 3u);
  for (std::uint64_t i = 0; i < 3; ++i) EXPECT_EQ(wc[i].wr_id, i + 1);
}

TEST_F(SemanticsTest, LocalInvalidateCompletesInSqOrder) {
  Connect();
  Buffer mine(16);
  const std::uint32_t key = mine.Register(a_.memory(), a_.pd, kAllRemote);
  SendWorkRequest write = MakeSend(1, SendOpcode::kRdmaWrite);
  write.rkey = 0x100;  // zero length: no STag check at the peer
  SendWorkRequest inv = MakeSend(2, SendOpcode::kLocalInvalidate);
  inv.invalidate_stag = key;
  const std::array<SendWorkRequest, 2> wrs{write, inv};
  std::size_t posted = 0;
  ASSERT_EQ(a_.qp->PostSend(wrs, &posted), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].opcode, WcOpcode::kRdmaWrite);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].opcode, WcOpcode::kLocalInv);
  EXPECT_EQ(wc[1].status, WcStatus::kSuccess);
  EXPECT_EQ(wc[1].byte_len, 0u);
  EXPECT_EQ(a_.memory().Check(key, a_.pd, AccessKind::kLocalRead, mine.addr(), 1).status,
            AccessStatus::kInvalidated);
}

TEST_F(SemanticsTest, BadLkeyIsALocalProtectionErrorAndEndsTheStream) {
  Connect();
  Buffer rbuf(16);
  PostRecv(b_, 7, rbuf, rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite));
  Buffer src(16);
  const std::uint32_t key = src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  SendWorkRequest bad = MakeSend(1, SendOpcode::kSend);
  AddSge(bad, src.addr(), 16, key ^ 0x5);
  ASSERT_EQ(a_.qp->PostSend(bad), PostStatus::kOk);
  ASSERT_EQ(a_.qp->PostSend(MakeSend(2, SendOpcode::kSend)), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kLocProtErr);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].status, WcStatus::kWrFlushErr);
  // The peer learns of it from a Local Catastrophic Terminate (RFC 5040 7.1).
  EXPECT_TRUE(WaitUntil([&] { return b_.qp->Query().terminate_received.has_value(); }));
  EXPECT_EQ(b_.qp->Query().terminate_received->cause, TerminateCause::RdmapLocalCatastrophic());
  const auto rc = WaitCompletions(*b_.recv_cq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::kWrFlushErr);
}

TEST_F(SemanticsTest, SgeOutsideItsRegionIsALocalProtectionError) {
  Connect();
  Buffer src(16);
  const std::uint32_t key = src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  SendWorkRequest wr = MakeSend(1, SendOpcode::kRdmaWrite);
  AddSge(wr, src.addr(), 8, key);
  AddSge(wr, src.addr() + 8, 9, key);  // one octet past the region
  wr.rkey = 0x100;
  ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kLocProtErr);
  EXPECT_TRUE(WaitUntil([&] { return a_.qp->state() == QpState::kError; }));
}

TEST_F(SemanticsTest, ReadSinkNeedsRemoteWrite) {
  Connect();
  Buffer sink(16);
  const std::uint32_t key = sink.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  SendWorkRequest wr = MakeSend(1, SendOpcode::kRdmaRead);
  AddSge(wr, sink.addr(), 16, key);
  wr.rkey = 0x100;
  ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kLocProtErr);
  EXPECT_EQ(wc[0].opcode, WcOpcode::kRdmaRead);
}

TEST_F(SemanticsTest, OversizedMessageIsALocalLengthError) {
  Connect();
  Buffer src(16);
  const std::uint32_t key = src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  SendWorkRequest wr = MakeSend(1, SendOpcode::kSend);
  // 2^31 + 15 octets over two SGEs (never touched: refused before).
  AddSge(wr, src.addr(), 0x80000000u, key);
  AddSge(wr, src.addr(), 15, key);
  ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kLocLenErr);
}

TEST_F(SemanticsTest, FenceOrdersAWriteAfterTheReadItDependsOn) {
  Connect();
  const std::size_t n = 256 * 1024;
  Buffer remote_src(n);
  remote_src.Fill(5);
  const std::uint32_t src_key = remote_src.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer remote_dst(n, 0);
  const std::uint32_t dst_key = remote_dst.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer local(n, 0);
  const std::uint32_t local_key = local.Register(a_.memory(), a_.pd, kAllRemote);

  SendWorkRequest read = MakeSend(1, SendOpcode::kRdmaRead);
  AddSge(read, local.addr(), static_cast<std::uint32_t>(n), local_key);
  read.rkey = src_key;
  read.remote_addr = remote_src.addr();
  SendWorkRequest write = MakeSend(2, SendOpcode::kRdmaWrite, kSendSignaled | kSendFence);
  AddSge(write, local.addr(), static_cast<std::uint32_t>(n), local_key);
  write.rkey = dst_key;
  write.remote_addr = remote_dst.addr();
  const std::array<SendWorkRequest, 2> wrs{read, write};
  std::size_t posted = 0;
  ASSERT_EQ(a_.qp->PostSend(wrs, &posted), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  // The Write read `local` only after the Read filled it.
  ReceiveWorkRequest rwr;
  rwr.wr_id = 9;
  ASSERT_EQ(b_.qp->PostRecv(rwr), PostStatus::kOk);
  ASSERT_EQ(a_.qp->PostSend(MakeSend(3, SendOpcode::kSend, 0)), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*b_.recv_cq, 1).size(), 1u);
  EXPECT_TRUE(SameBytes(remote_dst.data(), remote_src.data(), n));
}

TEST_F(SemanticsTest, CompletionsKeepWrOrderAcrossReadsAndSends) {
  Connect();
  const std::size_t n = 1 << 20;
  Buffer src(n);
  src.Fill(2);
  const std::uint32_t rkey = src.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer sink(n);
  const std::uint32_t sink_key = sink.Register(a_.memory(), a_.pd, kAllRemote);
  Buffer rbuf(8);
  PostRecv(b_, 50, rbuf, rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite));
  SendWorkRequest read = MakeSend(1, SendOpcode::kRdmaRead);
  AddSge(read, sink.addr(), static_cast<std::uint32_t>(n), sink_key);
  read.rkey = rkey;
  read.remote_addr = src.addr();
  const std::array<SendWorkRequest, 3> wrs{read, MakeSend(2, SendOpcode::kSend),
                                           MakeSend(3, SendOpcode::kRdmaWrite)};
  std::size_t posted = 0;
  ASSERT_EQ(a_.qp->PostSend(wrs, &posted), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 3);
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].byte_len, n);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[2].wr_id, 3u);
  EXPECT_TRUE(SameBytes(sink.data(), src.data(), n));
}

TEST_F(SemanticsTest, ManyReadsWithinOrdAndIrd) {
  LinkOptions o;
  o.ord = 2;
  o.ird = 2;
  Connect(o);
  Buffer src(64 * 100);
  src.Fill(9);
  const std::uint32_t rkey = src.Register(b_.memory(), b_.pd, kAllRemote);
  Buffer sink(64 * 100, 0);
  const std::uint32_t key = sink.Register(a_.memory(), a_.pd, kAllRemote, true);
  std::vector<SendWorkRequest> wrs;
  for (std::uint32_t i = 0; i < 100; ++i) {
    SendWorkRequest wr = MakeSend(i, SendOpcode::kRdmaRead);
    AddSge(wr, sink.addr() + 64 * i, 64, key);
    wr.rkey = rkey;
    wr.remote_addr = src.addr() + 64 * i;
    wrs.push_back(wr);
  }
  std::size_t posted = 0;
  ASSERT_EQ(a_.qp->PostSend(wrs, &posted), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 100);
  ASSERT_EQ(wc.size(), 100u);
  for (std::uint32_t i = 0; i < 100; ++i) {
    EXPECT_EQ(wc[i].wr_id, i);
    EXPECT_EQ(wc[i].status, WcStatus::kSuccess);
  }
  EXPECT_TRUE(SameBytes(sink.data(), src.data(), 64 * 100));
  EXPECT_TRUE(sink.GuardsIntact());
  EXPECT_EQ(a_.qp->state(), QpState::kRts);
  EXPECT_EQ(b_.qp->state(), QpState::kRts);
}

TEST_F(SemanticsTest, ReadOfAnInvalidStagFailsTheRead) {
  Connect();
  Buffer sink(8);
  const std::uint32_t key = sink.Register(a_.memory(), a_.pd, kAllRemote);
  SendWorkRequest wr = MakeSend(1, SendOpcode::kRdmaRead);
  AddSge(wr, sink.addr(), 8, key);
  wr.rkey = 0x00777701;
  ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  ASSERT_EQ(a_.qp->PostSend(MakeSend(2, SendOpcode::kSend)), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.send_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].status, WcStatus::kWrFlushErr);
  EXPECT_TRUE(b_.events.WaitFor(AsyncEventType::kQpAccessError));
  const QpAttributes ba = b_.qp->Query();
  ASSERT_TRUE(ba.terminate_sent.has_value());
  EXPECT_EQ(ba.terminate_sent->cause, TerminateCause::RdmapInvalidStag());
  EXPECT_TRUE(ba.terminate_sent->r);
}

TEST_F(SemanticsTest, SendWithoutReceiveEndsTheStreamOnBothSides) {
  Connect();
  ASSERT_EQ(a_.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);
  EXPECT_TRUE(WaitUntil([&] { return a_.qp->Query().terminate_received.has_value(); }));
  EXPECT_EQ(a_.qp->Query().terminate_received->cause, TerminateCause::DdpNoBuffer());
  EXPECT_TRUE(b_.events.WaitFor(AsyncEventType::kQpRequestError));
  EXPECT_TRUE(a_.events.WaitFor(AsyncEventType::kQpFatal));
  EXPECT_TRUE(WaitUntil([&] {
    return a_.qp->state() == QpState::kError && b_.qp->state() == QpState::kError;
  }));
}

// ---- RTR between engines (RFC 6581 7.1) ----

TEST_F(SemanticsTest, RtrOfEveryKind) {
  for (RtrMessage m : {RtrMessage::kSend, RtrMessage::kWrite, RtrMessage::kRead}) {
    SCOPED_TRACE(static_cast<int>(m));
    Node a;
    Node b;
    StreamParams pa = ParamsFor({});
    pa.rtr_role = RtrRole::kSend;
    pa.rtr_message = m;
    StreamParams pb = pa;
    pb.rtr_role = RtrRole::kAwait;
    const std::array<int, 2> fds = testing::Connect(Transport::kSocketPair);
    Buffer abuf(8), bbuf(8);
    const std::uint32_t akey = abuf.Register(a.memory(), a.pd, AccessFlags::kLocalWrite);
    const std::uint32_t bkey = bbuf.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
    ReceiveWorkRequest ra;
    ra.wr_id = 1;
    AddSge(ra, abuf.addr(), 8, akey);
    ReceiveWorkRequest rb;
    rb.wr_id = 2;
    AddSge(rb, bbuf.addr(), 8, bkey);
    ASSERT_EQ(a.qp->PostRecv(ra), PostStatus::kOk);
    ASSERT_EQ(b.qp->PostRecv(rb), PostStatus::kOk);
    a.Bind(fds[0], pa);
    b.Bind(fds[1], pb);
    // b posts at once; it goes out only after a's RTR, and a's RTR consumes
    // none of b's receives.
    ASSERT_EQ(b.qp->PostSend(MakeSend(3, SendOpcode::kSend)), PostStatus::kOk);
    ASSERT_EQ(a.qp->PostSend(MakeSend(4, SendOpcode::kSend)), PostStatus::kOk);
    const auto wa = WaitCompletions(*a.recv_cq, 1);
    const auto wb = WaitCompletions(*b.recv_cq, 1);
    ASSERT_EQ(wa.size(), 1u);
    ASSERT_EQ(wb.size(), 1u);
    EXPECT_EQ(wa[0].wr_id, 1u);
    EXPECT_EQ(wb[0].wr_id, 2u);
    EXPECT_EQ(wa[0].status, WcStatus::kSuccess);
    EXPECT_EQ(wb[0].status, WcStatus::kSuccess);
    EXPECT_EQ(WaitCompletions(*a.send_cq, 1).size(), 1u);
    EXPECT_EQ(WaitCompletions(*b.send_cq, 1).size(), 1u);
    EXPECT_TRUE(StaysEmpty(*a.send_cq, std::chrono::milliseconds(5)));
  }
}

// ---- Closing ----

TEST_F(SemanticsTest, DisconnectSendsWhatWasPostedThenClosesBothSides) {
  Connect({}, Transport::kTcp);
  Buffer big(1 << 20);
  big.Fill(3);
  const std::uint32_t key = big.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  Buffer rbuf(1 << 20, 0);
  const std::uint32_t rkey = rbuf.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite);
  PostRecv(b_, 1, rbuf, rkey);
  PostRecv(b_, 2, rbuf, rkey);
  SendWorkRequest send = MakeSend(5, SendOpcode::kSend);
  AddSge(send, big.addr(), 1 << 20, key);
  ASSERT_EQ(a_.qp->PostSend(send), PostStatus::kOk);
  EXPECT_TRUE(a_.qp->Disconnect());
  EXPECT_EQ(a_.qp->PostSend(MakeSend(6, SendOpcode::kSend)), PostStatus::kOk);  // flushed
  const auto sc = WaitCompletions(*a_.send_cq, 2);
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_EQ(sc[0].wr_id, 5u);
  EXPECT_EQ(sc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sc[1].wr_id, 6u);
  EXPECT_EQ(sc[1].status, WcStatus::kWrFlushErr);
  const auto rc = WaitCompletions(*b_.recv_cq, 2);
  ASSERT_EQ(rc.size(), 2u);
  EXPECT_EQ(rc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(rc[0].byte_len, 1u << 20);
  EXPECT_EQ(rc[1].status, WcStatus::kWrFlushErr);
  EXPECT_TRUE(SameBytes(rbuf.data(), big.data(), 1 << 20));
  EXPECT_TRUE(a_.events.WaitFor(AsyncEventType::kStreamClosed));
  EXPECT_TRUE(b_.events.WaitFor(AsyncEventType::kStreamClosed));
  EXPECT_TRUE(WaitUntil([&] {
    return a_.qp->state() == QpState::kError && b_.qp->state() == QpState::kError;
  }));
  EXPECT_FALSE(a_.events.Has(AsyncEventType::kQpFatal));
  EXPECT_FALSE(b_.events.Has(AsyncEventType::kQpFatal));
  EXPECT_FALSE(a_.qp->Query().terminate_sent.has_value());
  EXPECT_FALSE(b_.qp->Query().terminate_sent.has_value());
}

TEST_F(SemanticsTest, ModifyToErrorFlushesEverythingAndResetsThePeer) {
  Connect({}, Transport::kTcp);
  Buffer rbuf(8);
  const std::uint32_t key = rbuf.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  for (std::uint64_t id = 1; id <= 3; ++id) PostRecv(a_, id, rbuf, key);
  SendWorkRequest read = MakeSend(10, SendOpcode::kRdmaRead);
  read.rkey = 0x100;  // zero-length: never refused, but b will not answer in time
  ASSERT_EQ(b_.qp->Modify(QpState::kError), QpStatus::kOk);  // b stops serving
  ASSERT_EQ(a_.qp->PostSend(read), PostStatus::kOk);
  ASSERT_EQ(a_.qp->Modify(QpState::kError), QpStatus::kOk);
  EXPECT_EQ(a_.qp->state(), QpState::kError);
  // Modify returns after the flush (synchronous, like ibv_modify_qp).
  const auto rc = WaitCompletions(*a_.recv_cq, 3, std::chrono::milliseconds(1000));
  ASSERT_EQ(rc.size(), 3u);
  for (std::uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rc[i].wr_id, i + 1);
    EXPECT_EQ(rc[i].status, WcStatus::kWrFlushErr);
  }
  const auto sc = WaitCompletions(*a_.send_cq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::kWrFlushErr);
  EXPECT_FALSE(a_.qp->Query().terminate_sent.has_value());
}

TEST_F(SemanticsTest, ResetDiscardsAndTheQpCanBeBoundAgain) {
  Connect();
  Buffer rbuf(8);
  const std::uint32_t key = rbuf.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  PostRecv(a_, 1, rbuf, key);
  ASSERT_EQ(a_.qp->Modify(QpState::kReset), QpStatus::kOk);
  EXPECT_TRUE(StaysEmpty(*a_.recv_cq, std::chrono::milliseconds(10)));  // discarded, not flushed
  EXPECT_FALSE(a_.qp->Query().bound);
  ASSERT_EQ(a_.qp->Modify(QpState::kInit), QpStatus::kOk);
  Node c;
  const std::array<int, 2> fds = testing::Connect(Transport::kSocketPair);
  a_.Bind(fds[0], ParamsFor({}));
  c.Bind(fds[1], ParamsFor({}));
  PostRecv(a_, 2, rbuf, key);
  ASSERT_EQ(c.qp->PostSend(MakeSend(3, SendOpcode::kSend)), PostStatus::kOk);
  const auto wc = WaitCompletions(*a_.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
}

TEST_F(SemanticsTest, DestroyDuringTrafficIsSafe) {
  Connect({}, Transport::kTcp);
  const std::size_t n = 16 << 20;
  auto src = std::make_unique<Buffer>(n);
  const std::uint32_t key = src->Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
  auto dst = std::make_unique<Buffer>(n);
  const std::uint32_t rkey = dst->Register(b_.memory(), b_.pd, kAllRemote);
  for (int i = 0; i < 4; ++i) {
    SendWorkRequest wr = MakeSend(i, SendOpcode::kRdmaWrite);
    AddSge(wr, src->addr(), static_cast<std::uint32_t>(n), key);
    wr.rkey = rkey;
    wr.remote_addr = dst->addr();
    ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  b_.qp->Destroy();  // the target goes away mid-stream
  a_.qp->Destroy();
  // Nothing holds the regions any more: deregistration does not wait.
  dst.reset();
  src.reset();
  EXPECT_EQ(a_.engine->FindQp(a_.qp->qp_num()), nullptr);
  EXPECT_EQ(a_.qp->PostSend(MakeSend(9, SendOpcode::kSend)), PostStatus::kInvalidState);
}

TEST_F(SemanticsTest, TwoQpsOnOneEngine) {
  Node a;
  Node b(NodeOptions{}, a.engine);
  Link(a, b, Transport::kSocketPair, {});
  EXPECT_NE(a.qp->qp_num(), b.qp->qp_num());
  Buffer src(5000);
  src.Fill(4);
  const std::uint32_t key = src.Register(a.memory(), a.pd, AccessFlags::kLocalWrite);
  Buffer dst(5000);
  const std::uint32_t dkey = dst.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  ReceiveWorkRequest rwr;
  rwr.wr_id = 1;
  AddSge(rwr, dst.addr(), 5000, dkey);
  ASSERT_EQ(b.qp->PostRecv(rwr), PostStatus::kOk);
  SendWorkRequest wr = MakeSend(2, SendOpcode::kSend);
  AddSge(wr, src.addr(), 5000, key);
  ASSERT_EQ(a.qp->PostSend(wr), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*b.recv_cq, 1).size(), 1u);
  EXPECT_TRUE(SameBytes(dst.data(), src.data(), 5000));
}

TEST_F(SemanticsTest, SharedReceiveQueueServesTwoQps) {
  int limit_events = 0;
  std::mutex m;
  auto srq = ReceiveQueue::Create(ReceiveQueue::Kind::kShared, QueueCaps{16, 2, 0}, [&] {
    std::lock_guard lock(m);
    ++limit_events;
  });
  ASSERT_NE(srq, nullptr);
  NodeOptions with_srq;
  with_srq.srq = srq.get();
  Node server(with_srq);
  Node p1, p2;
  {
    const std::array<int, 2> f1 = testing::Connect(Transport::kSocketPair);
    server.Bind(f1[0], ParamsFor({}));
    p1.Bind(f1[1], ParamsFor({}));
  }
  // A second QP of the same engine on the same SRQ.
  QpConfig config = server.qp->config();
  auto qp2 = server.engine->CreateQp(config);
  ASSERT_NE(qp2, nullptr);
  ASSERT_EQ(qp2->Modify(QpState::kInit), QpStatus::kOk);
  {
    const std::array<int, 2> f2 = testing::Connect(Transport::kSocketPair);
    ASSERT_EQ(qp2->Bind(std::make_unique<transport::TcpStream>(f2[0]), ParamsFor({})),
              BindStatus::kOk);
    p2.Bind(f2[1], ParamsFor({}));
  }
  EXPECT_EQ(server.qp->PostRecv(ReceiveWorkRequest{}), PostStatus::kInvalidState);
  Buffer buf(64);
  const std::uint32_t key = buf.Register(server.memory(), server.pd, AccessFlags::kLocalWrite);
  for (std::uint64_t i = 0; i < 4; ++i) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = 100 + i;
    AddSge(rwr, buf.addr() + 16 * i, 16, key);
    ASSERT_EQ(srq->Post(rwr), PostStatus::kOk);
  }
  ASSERT_EQ(srq->SetLimit(3), SrqLimitStatus::kOk);
  ASSERT_EQ(p1.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*server.recv_cq, 1).size(), 1u);
  ASSERT_EQ(p2.qp->PostSend(MakeSend(2, SendOpcode::kSend)), PostStatus::kOk);
  const auto wc = WaitCompletions(*server.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 101u);
  EXPECT_EQ(wc[0].qp_num, qp2->qp_num());
  EXPECT_EQ(srq->size(), 2u);
  std::lock_guard lock(m);
  EXPECT_EQ(limit_events, 1);
  qp2->Destroy();
}

TEST_F(SemanticsTest, DefaultMaxUlpduFollowsTheEmss) {
  const std::array<int, 2> fds = testing::Connect(Transport::kTcp);
  int mss = 0;
  socklen_t len = sizeof(mss);
  ASSERT_EQ(getsockopt(fds[0], IPPROTO_TCP, TCP_MAXSEG, &mss, &len), 0);
  a_.Bind(fds[0], ParamsFor({}));
  b_.Bind(fds[1], ParamsFor({}));
  // RFC 5044 4.5: MULPDU = EMSS - (6 + EMSS mod 4) without markers.
  const std::size_t emss = static_cast<std::size_t>(mss);
  EXPECT_EQ(a_.qp->Query().max_ulpdu, emss - (6 + emss % 4));
  // Both ends agreed to large FPDUs: the 16-bit ULPDU_Length bound instead.
  Node e, f;
  LinkOptions large;
  large.large_fpdus = true;
  Link(e, f, Transport::kTcp, large);
  EXPECT_EQ(e.qp->Query().max_ulpdu, mpa::Mulpdu(kLargeFpduEmss, false));
  Node c, d;
  LinkOptions small;
  small.max_ulpdu = 1000;
  small.markers = true;
  Link(c, d, Transport::kSocketPair, small);
  EXPECT_EQ(c.qp->Query().max_ulpdu, 1000u);
  EXPECT_TRUE(c.qp->Query().bound);
  EXPECT_TRUE(c.qp->Query().params.tx_markers);
}

TEST_F(SemanticsTest, BindRefusesBadParametersAndStates) {
  Node c;
  const std::array<int, 2> fds = testing::Connect(Transport::kSocketPair);
  StreamParams p = ParamsFor({});
  p.ird = kDefaultMaxReadDepth + 1;
  EXPECT_EQ(c.qp->Bind(std::make_unique<transport::TcpStream>(fds[0]), p), BindStatus::kInvalidParams);
  p = ParamsFor({});
  p.max_ulpdu = 64;
  EXPECT_EQ(c.qp->Bind(std::make_unique<transport::TcpStream>(fds[1]), p), BindStatus::kInvalidParams);
  EXPECT_EQ(c.qp->Bind(nullptr, ParamsFor({})), BindStatus::kInvalidStream);
  ASSERT_EQ(c.qp->Modify(QpState::kReset), QpStatus::kOk);
  const std::array<int, 2> more = testing::Connect(Transport::kSocketPair);
  close(more[1]);
  EXPECT_EQ(c.qp->Bind(std::make_unique<transport::TcpStream>(more[0]), ParamsFor({})),
            BindStatus::kInvalidState);
  EXPECT_EQ(c.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kInvalidState);
}

}  // namespace
}  // namespace siwx::engine::testing
