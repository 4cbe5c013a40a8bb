// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What the engine puts on the wire, octet for octet, read by a raw peer that
// parses FPDUs with the wire codecs (RFC 5044 4, RFC 5041 4, RFC 5040 4).
#include <gtest/gtest.h>

#include <vector>

#include "common/wire/crc32c.h"
#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

std::vector<std::uint8_t> Bytes(std::initializer_list<int> list) {
  std::vector<std::uint8_t> out;
  for (int v : list) out.push_back(static_cast<std::uint8_t>(v));
  return out;
}

TEST(EngineWire, SendFpduOctetForOctetWithCrc) {
  Node node;
  LinkOptions o;
  o.crc = true;
  RawLink link(node, o);
  Buffer src(10);
  for (int i = 0; i < 10; ++i) src.data()[i] = static_cast<std::uint8_t>('0' + i);
  const std::uint32_t key = src.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  SendWorkRequest wr = MakeSend(1, SendOpcode::kSend);
  AddSge(wr, src.addr(), 10, key);
  ASSERT_EQ(node.qp->PostSend(wr), PostStatus::kOk);
  ASSERT_TRUE(link.peer->WaitSegments(1));

  std::vector<std::uint8_t> want = Bytes({
      0x00, 0x1C,              // ULPDU_Length 28 = 18 header + 10 payload (RFC 5044 4.1)
      0x41,                    // DDP control: T=0, L=1, DV=1 (RFC 5041 4.1)
      0x43,                    // RDMAP control: RV=1, OpCode 3 Send (RFC 5040 4.1)
      0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]: no Invalidate STag
      0x00, 0x00, 0x00, 0x00,  // QN 0 (RFC 5040 4.1 Figure 4)
      0x00, 0x00, 0x00, 0x01,  // MSN 1: the first message on QN 0 (RFC 5041 5.1)
      0x00, 0x00, 0x00, 0x00,  // MO 0
      '0', '1', '2', '3', '4', '5', '6', '7', '8', '9',  // ULP payload
      0x00, 0x00,              // pad to a multiple of 4 (2 + 28 + 2 = 32)
  });
  // CRC32c over ULPDU_Length, ULPDU and pad, least significant octet first
  // (RFC 5044 4.4).
  std::uint8_t crc[4];
  Crc32cToWire(ComputeCrc32c(want), crc);
  want.insert(want.end(), crc, crc + 4);
  ASSERT_GE(link.peer->raw().size(), want.size());
  EXPECT_EQ(std::vector<std::uint8_t>(link.peer->raw().begin(),
                                      link.peer->raw().begin() + static_cast<std::ptrdiff_t>(want.size())),
            want);
  const auto wc = WaitCompletions(*node.send_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
}

TEST(EngineWire, CrcFieldIsZeroWithoutCrc) {
  Node node;
  RawLink link(node, LinkOptions{});
  ASSERT_EQ(node.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);
  ASSERT_TRUE(link.peer->WaitSegments(1));
  const std::vector<std::uint8_t> want = Bytes({
      0x00, 0x12,              // ULPDU_Length 18: header only
      0x41, 0x43,              // DDP L DV=1 / RDMAP RV=1 Send
      0, 0, 0, 0,              // no Invalidate STag
      0, 0, 0, 0,              // QN 0
      0, 0, 0, 1,              // MSN 1
      0, 0, 0, 0,              // MO 0
      0, 0, 0, 0,              // CRC field present, zero (RFC 5044 7.1.1, no pad: 2+18 = 20)
  });
  EXPECT_EQ(link.peer->raw(), want);
}

TEST(EngineWire, TakesFpdusOfAnyLengthWithoutTheLargeFpduAgreement) {
  // RFC 5044 4.5: MULPDU bounds what a sender sends; a receiver takes any
  // ULPDU_Length up to 65535. Without the (non-standard) large-FPDU
  // agreement and with our own FPDUs small, a peer's 64 KiB FPDUs, such as
  // a siw with try_gso sends, are placed like any other.
  Node node;
  LinkOptions o;
  o.crc = true;
  o.max_ulpdu = 512;
  o.large_fpdus = false;
  RawLink link(node, o, Transport::kTcp);
  constexpr std::size_t kWrite = mpa::kMaxUlpduLength - rdmap::kDdpTaggedHeaderSize;
  constexpr std::size_t kSend = mpa::kMaxUlpduLength - rdmap::kDdpUntaggedHeaderSize;
  Buffer sink(kWrite);
  const std::uint32_t stag = sink.Register(node.memory(), node.pd, kAllRemote);
  Buffer inbox(kSend);
  const std::uint32_t inbox_key = inbox.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  PostRecv(node, 1, inbox, inbox_key);
  std::vector<std::uint8_t> write(kWrite);
  std::vector<std::uint8_t> send(kSend);
  for (std::size_t i = 0; i < kWrite; ++i) write[i] = PatternByte(31, i);
  for (std::size_t i = 0; i < kSend; ++i) send[i] = PatternByte(32, i);
  link.peer->SendHeader(WriteHeader(stag, sink.addr()), write);
  link.peer->SendHeader(SendHeaderOf(1, 0), send);
  const auto wc = WaitCompletions(*node.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(wc[0].byte_len, kSend);
  EXPECT_TRUE(SameBytes(sink.data(), write.data(), kWrite));
  EXPECT_TRUE(SameBytes(inbox.data(), send.data(), kSend));
  EXPECT_FALSE(node.events.Has(AsyncEventType::kQpFatal));
  EXPECT_EQ(node.qp->Query().max_ulpdu, 512u);  // what we send stays small
}

TEST(EngineWire, WriteSegmentsCarryAdvancingToAndLastOnlyAtTheEnd) {
  Node node;
  LinkOptions o;
  o.max_ulpdu = 128;  // 114 payload octets per tagged segment
  RawLink link(node, o);
  Buffer src(250);
  src.Fill(3);
  const std::uint32_t key = src.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  SendWorkRequest wr = MakeSend(9, SendOpcode::kRdmaWrite);
  AddSplitSges(wr, src.addr(), 250, key, 4);
  wr.rkey = 0x12345678;
  wr.remote_addr = 0xFFFF'FFFF'0000'1000ull;
  ASSERT_EQ(node.qp->PostSend(wr), PostStatus::kOk);
  ASSERT_TRUE(link.peer->WaitSegments(3));
  const auto& s = link.peer->segments();
  const std::size_t sizes[] = {114, 114, 22};
  std::size_t at = 0;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(s[i].decoded.status, rdmap::HeaderStatus::kOk);
    const rdmap::DdpRdmapHeader& h = s[i].decoded.header;
    EXPECT_TRUE(h.tagged);
    EXPECT_EQ(h.last, i == 2);
    EXPECT_EQ(h.opcode, rdmap::Opcode::kRdmaWrite);
    EXPECT_EQ(h.stag, 0x12345678u);
    EXPECT_EQ(h.to, 0xFFFF'FFFF'0000'1000ull + at);
    EXPECT_EQ(s[i].ulpdu_length, rdmap::kDdpTaggedHeaderSize + sizes[i]);
    ASSERT_EQ(s[i].payload.size(), sizes[i]);
    EXPECT_TRUE(SameBytes(s[i].payload.data(), src.data() + at, sizes[i]));
    // The DDP control octet: T=1, L only on the last (RFC 5041 4.1).
    EXPECT_EQ(s[i].header[0], i == 2 ? 0xC1 : 0x81);
    EXPECT_EQ(s[i].header[1], 0x40);
    at += sizes[i];
  }
}

TEST(EngineWire, SendSegmentsCarryMsnAndAdvancingMo) {
  Node node;
  LinkOptions o;
  o.max_ulpdu = 128;  // 110 payload octets per untagged segment
  RawLink link(node, o);
  Buffer src(300);
  src.Fill(4);
  const std::uint32_t key = src.Register(node.memory(), node.pd, AccessFlags::kLocalWrite);
  ASSERT_EQ(node.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);  // MSN 1, empty
  SendWorkRequest wr = MakeSend(2, SendOpcode::kSendWithInvalidate);
  AddSge(wr, src.addr(), 300, key);
  wr.invalidate_stag = 0xCAFE0101;
  ASSERT_EQ(node.qp->PostSend(wr), PostStatus::kOk);
  ASSERT_TRUE(link.peer->WaitSegments(4));
  const auto& s = link.peer->segments();
  EXPECT_EQ(s[0].decoded.header.msn, 1u);
  const std::uint32_t mos[] = {0, 110, 220};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const rdmap::DdpRdmapHeader& h = s[i + 1].decoded.header;
    EXPECT_FALSE(h.tagged);
    EXPECT_EQ(h.opcode, rdmap::Opcode::kSendWithInvalidate);
    EXPECT_EQ(h.qn, rdmap::kQnSend);
    EXPECT_EQ(h.msn, 2u);
    EXPECT_EQ(h.mo, mos[i]);
    EXPECT_EQ(h.last, i == 2);
    EXPECT_EQ(h.invalidate_stag, 0xCAFE0101u);
    EXPECT_EQ(s[i + 1].header[1], 0x44);  // RV=1, OpCode 4
  }
  EXPECT_EQ(s[3].payload.size(), 80u);
}

TEST(EngineWire, SolicitedOpcodes) {
  Node node;
  RawLink link(node, LinkOptions{});
  ASSERT_EQ(node.qp->PostSend(MakeSend(1, SendOpcode::kSend, kSendSolicited)), PostStatus::kOk);
  ASSERT_EQ(node.qp->PostSend(MakeSend(2, SendOpcode::kSendWithSolicitedEvent, 0)), PostStatus::kOk);
  SendWorkRequest inv = MakeSend(3, SendOpcode::kSendWithSeAndInvalidate, 0);
  inv.invalidate_stag = 0x0000AB01;
  ASSERT_EQ(node.qp->PostSend(inv), PostStatus::kOk);
  ASSERT_TRUE(link.peer->WaitSegments(3));
  const auto& s = link.peer->segments();
  EXPECT_EQ(s[0].header[1], 0x45);  // Send with Solicited Event (flag on a plain Send)
  EXPECT_EQ(s[1].header[1], 0x45);
  EXPECT_EQ(s[2].header[1], 0x46);  // Send with SE and Invalidate
  EXPECT_EQ(s[2].decoded.header.invalidate_stag, 0x0000AB01u);
  EXPECT_EQ(s[2].decoded.header.msn, 3u);
}

TEST(EngineWire, ReadRequestOctetForOctet) {
  Node node;
  RawLink link(node, LinkOptions{});
  Buffer sink(64);
  const std::uint32_t key = sink.Register(node.memory(), node.pd, kAllRemote);
  SendWorkRequest wr = MakeSend(5, SendOpcode::kRdmaRead);
  AddSge(wr, sink.addr(), 64, key);
  wr.rkey = 0x0A0B0C0D;
  wr.remote_addr = 0x1122334455667788ull;
  ASSERT_EQ(node.qp->PostSend(wr), PostStatus::kOk);
  ASSERT_TRUE(link.peer->WaitSegments(1));
  std::vector<std::uint8_t> want = Bytes({
      0x00, 0x2E,              // ULPDU_Length 46 = 18 + 28 (RFC 5040 4.4)
      0x41, 0x41,              // DDP L DV=1 / RDMAP RV=1 OpCode 1 Read Request
      0, 0, 0, 0,              // RsvdULP
      0, 0, 0, 1,              // QN 1 (RFC 5040 4.1 Figure 4)
      0, 0, 0, 1,              // MSN 1: first Read Request
      0, 0, 0, 0,              // MO 0
  });
  std::uint8_t field[8];
  StoreBe32(field, key);  // Data Sink STag
  want.insert(want.end(), field, field + 4);
  StoreBe64(field, sink.addr());  // Data Sink Tagged Offset
  want.insert(want.end(), field, field + 8);
  StoreBe32(field, 64);  // RDMA Read Message Size
  want.insert(want.end(), field, field + 4);
  const std::vector<std::uint8_t> source = Bytes({0x0A, 0x0B, 0x0C, 0x0D,  // Data Source STag
                                                   0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88});
  want.insert(want.end(), source.begin(), source.end());
  want.insert(want.end(), {0, 0, 0, 0});  // CRC off; 2 + 46 = 48, no pad
  EXPECT_EQ(link.peer->raw(), want);
}

TEST(EngineWire, ReadResponsesFollowRequestOrderIntoEachSink) {
  Node node;
  LinkOptions o;
  o.ird = 3;
  RawLink link(node, o);
  Buffer source(3000);
  source.Fill(8);
  const std::uint32_t rkey = source.Register(node.memory(), node.pd, kAllRemote);
  const std::uint32_t sizes[] = {1000, 0, 2000};
  const std::uint64_t offsets[] = {500, 0, 1000};
  for (std::uint32_t i = 0; i < 3; ++i) {
    rdmap::ReadRequestBody body;
    body.sink_stag = 0x100 + i;
    body.sink_to = 0x9000 + i * 0x10000;
    body.read_size = sizes[i];
    body.source_stag = rkey;
    body.source_to = source.addr() + offsets[i];
    link.peer->SendHeader(ReadRequestOf(i + 1, body));
  }
  ASSERT_TRUE(link.peer->WaitSegments(3));
  const auto& s = link.peer->segments();
  for (std::uint32_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const rdmap::DdpRdmapHeader& h = s[i].decoded.header;
    EXPECT_EQ(h.opcode, rdmap::Opcode::kRdmaReadResponse);
    EXPECT_TRUE(h.tagged);
    EXPECT_TRUE(h.last);
    EXPECT_EQ(h.stag, 0x100 + i);
    EXPECT_EQ(h.to, 0x9000 + i * 0x10000);
    ASSERT_EQ(s[i].payload.size(), sizes[i]);
    EXPECT_TRUE(SameBytes(s[i].payload.data(), source.data() + offsets[i], sizes[i]));
  }
  EXPECT_TRUE(StaysEmpty(*node.send_cq, std::chrono::milliseconds(20)));
  EXPECT_TRUE(StaysEmpty(*node.recv_cq, std::chrono::milliseconds(1)));
}

TEST(EngineWire, OrdLimitHoldsTheSecondReadUntilTheFirstCompletes) {
  Node node;
  LinkOptions o;
  o.ord = 1;
  RawLink link(node, o);
  Buffer sink(16);
  const std::uint32_t key = sink.Register(node.memory(), node.pd, kAllRemote);
  for (std::uint64_t id = 1; id <= 2; ++id) {
    SendWorkRequest wr = MakeSend(id, SendOpcode::kRdmaRead);
    AddSge(wr, sink.addr() + (id - 1) * 8, 8, key);
    wr.rkey = 0x500;
    wr.remote_addr = id * 100;
    ASSERT_EQ(node.qp->PostSend(wr), PostStatus::kOk);
  }
  ASSERT_TRUE(link.peer->WaitSegments(1));
  // ORD 1: the second Read Request must not follow before a response.
  link.peer->Pump(std::chrono::milliseconds(50));
  ASSERT_EQ(link.peer->segments().size(), 1u);
  EXPECT_EQ(link.peer->segments()[0].decoded.header.msn, 1u);
  EXPECT_EQ(node.qp->Query().sq_outstanding, 2u);

  rdmap::DdpRdmapHeader resp = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadResponse, true);
  resp.stag = key;
  resp.to = sink.addr();
  const std::uint8_t data1[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  link.peer->SendHeader(resp, data1);
  const auto first = WaitCompletions(*node.send_cq, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].wr_id, 1u);
  EXPECT_EQ(first[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(first[0].byte_len, 8u);
  ASSERT_TRUE(link.peer->WaitSegments(2));
  const rdmap::DdpRdmapHeader& second = link.peer->segments()[1].decoded.header;
  EXPECT_EQ(second.msn, 2u);
  const auto& body = std::get<rdmap::ReadRequestBody>(second.body);
  EXPECT_EQ(body.sink_to, sink.addr() + 8);
  EXPECT_EQ(body.source_to, 200u);
  EXPECT_TRUE(SameBytes(sink.data(), data1, 8));
}

TEST(EngineWire, FencedSendWaitsForEarlierRead) {
  Node node;
  RawLink link(node, LinkOptions{});
  Buffer sink(8);
  const std::uint32_t key = sink.Register(node.memory(), node.pd, kAllRemote);
  SendWorkRequest read = MakeSend(1, SendOpcode::kRdmaRead);
  AddSge(read, sink.addr(), 8, key);
  read.rkey = 0x700;
  ASSERT_EQ(node.qp->PostSend(read), PostStatus::kOk);
  ASSERT_EQ(node.qp->PostSend(MakeSend(2, SendOpcode::kSend, kSendSignaled | kSendFence)),
            PostStatus::kOk);
  ASSERT_TRUE(link.peer->WaitSegments(1));
  link.peer->Pump(std::chrono::milliseconds(50));
  ASSERT_EQ(link.peer->segments().size(), 1u);  // the fenced Send waits
  rdmap::DdpRdmapHeader resp = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadResponse, true);
  resp.stag = key;
  resp.to = sink.addr();
  const std::uint8_t data[8] = {9, 9, 9, 9, 9, 9, 9, 9};
  link.peer->SendHeader(resp, data);
  ASSERT_TRUE(link.peer->WaitSegments(2));
  EXPECT_EQ(link.peer->segments()[1].decoded.header.opcode, rdmap::Opcode::kSend);
  const auto wc = WaitCompletions(*node.send_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].wr_id, 2u);
}

TEST(EngineWire, WriteAfterReadCompletesAfterTheRead) {
  Node node;
  RawLink link(node, LinkOptions{});
  Buffer sink(8);
  const std::uint32_t key = sink.Register(node.memory(), node.pd, kAllRemote);
  SendWorkRequest read = MakeSend(1, SendOpcode::kRdmaRead);
  AddSge(read, sink.addr(), 8, key);
  read.rkey = 0x700;
  ASSERT_EQ(node.qp->PostSend(read), PostStatus::kOk);
  SendWorkRequest write = MakeSend(2, SendOpcode::kRdmaWrite);
  write.rkey = 0x800;
  ASSERT_EQ(node.qp->PostSend(write), PostStatus::kOk);
  // Both are on the wire (no fence), but the Write's completion waits for
  // the Read's (RFC 5040 5.5: completions in WR order).
  ASSERT_TRUE(link.peer->WaitSegments(2));
  EXPECT_TRUE(StaysEmpty(*node.send_cq, std::chrono::milliseconds(30)));
  rdmap::DdpRdmapHeader resp = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadResponse, true);
  resp.stag = key;
  resp.to = sink.addr();
  const std::uint8_t data[8] = {};
  link.peer->SendHeader(resp, data);
  const auto wc = WaitCompletions(*node.send_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].opcode, WcOpcode::kRdmaWrite);
}

// ---- RTR (RFC 6581 7.1) ----

TEST(EngineWire, RtrSenderStartsWithZeroLengthSend) {
  Node node;
  StreamParams p;
  p.rtr_role = RtrRole::kSend;
  p.rtr_message = RtrMessage::kSend;
  RawLink link(node, LinkOptions{}, Transport::kSocketPair, p, true);
  ASSERT_EQ(node.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);
  ASSERT_TRUE(link.peer->WaitSegments(2));
  const auto& s = link.peer->segments();
  EXPECT_EQ(s[0].ulpdu_length, 18u);
  EXPECT_EQ(s[0].decoded.header.opcode, rdmap::Opcode::kSend);
  EXPECT_EQ(s[0].decoded.header.msn, 1u);
  EXPECT_EQ(s[1].decoded.header.msn, 2u);  // the RTR used MSN 1
}

TEST(EngineWire, RtrSenderWriteAndRead) {
  for (RtrMessage m : {RtrMessage::kWrite, RtrMessage::kRead}) {
    SCOPED_TRACE(static_cast<int>(m));
    Node node;
    StreamParams p;
    p.rtr_role = RtrRole::kSend;
    p.rtr_message = m;
    RawLink link(node, LinkOptions{}, Transport::kSocketPair, p, true);
    ASSERT_TRUE(link.peer->WaitSegments(1));
    const auto& h = link.peer->segments()[0].decoded.header;
    if (m == RtrMessage::kWrite) {
      EXPECT_EQ(h.opcode, rdmap::Opcode::kRdmaWrite);
      EXPECT_EQ(link.peer->segments()[0].ulpdu_length, 14u);
    } else {
      EXPECT_EQ(h.opcode, rdmap::Opcode::kRdmaReadRequest);
      EXPECT_EQ(h.msn, 1u);
      EXPECT_EQ(std::get<rdmap::ReadRequestBody>(h.body).read_size, 0u);
      // The zero-length response is absorbed: no completion, stream healthy.
      rdmap::DdpRdmapHeader resp = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadResponse, true);
      link.peer->SendHeader(resp);
      ASSERT_EQ(node.qp->PostSend(MakeSend(3, SendOpcode::kSend)), PostStatus::kOk);
      const auto wc = WaitCompletions(*node.send_cq, 1);
      ASSERT_EQ(wc.size(), 1u);
      EXPECT_EQ(wc[0].wr_id, 3u);
      EXPECT_EQ(node.qp->state(), QpState::kRts);
    }
  }
}

TEST(EngineWire, AwaitingRtrSendsNothingUntilItArrives) {
  Node node;
  StreamParams p;
  p.rtr_role = RtrRole::kAwait;
  p.rtr_message = RtrMessage::kWrite;
  RawLink link(node, LinkOptions{}, Transport::kSocketPair, p, true);
  ASSERT_EQ(node.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);
  link.peer->Pump(std::chrono::milliseconds(50));
  EXPECT_TRUE(link.peer->segments().empty());
  link.peer->SendHeader(WriteHeader(0x1234, 0));  // zero-length Write RTR, arbitrary STag
  ASSERT_TRUE(link.peer->WaitSegments(1));
  EXPECT_EQ(link.peer->segments()[0].decoded.header.msn, 1u);
  EXPECT_EQ(node.qp->state(), QpState::kRts);
}

TEST(EngineWire, AwaitingReadRtrAnswersWithZeroLengthResponse) {
  Node node;
  StreamParams p;
  p.rtr_role = RtrRole::kAwait;
  p.rtr_message = RtrMessage::kRead;
  p.ird = 1;
  RawLink link(node, LinkOptions{}, Transport::kSocketPair, p, true);
  rdmap::ReadRequestBody body;
  body.sink_stag = 0x42;
  body.sink_to = 0x77;
  link.peer->SendHeader(ReadRequestOf(1, body));
  ASSERT_TRUE(link.peer->WaitSegments(1));
  const auto& h = link.peer->segments()[0].decoded.header;
  EXPECT_EQ(h.opcode, rdmap::Opcode::kRdmaReadResponse);
  EXPECT_EQ(h.stag, 0x42u);
  EXPECT_EQ(h.to, 0x77u);
  EXPECT_TRUE(h.last);
  EXPECT_TRUE(link.peer->segments()[0].payload.empty());
  // The RTR used QN 1 MSN 1; a real Read Request is MSN 2.
  Buffer src(4);
  src.Fill(1);
  body.read_size = 4;
  body.source_stag = src.Register(node.memory(), node.pd, kAllRemote);
  body.source_to = src.addr();
  link.peer->SendHeader(ReadRequestOf(2, body));
  ASSERT_TRUE(link.peer->WaitSegments(2));
  EXPECT_EQ(link.peer->segments()[1].payload.size(), 4u);
  EXPECT_TRUE(StaysEmpty(*node.recv_cq, std::chrono::milliseconds(10)));
}

// RFC 6581 9.2: "For each initiator-supported RTR indication option, the
// responder SHOULD set the corresponding Control Flag if the responder can
// support that option"; the Initiator then chooses one of them (1.1). So a
// Responder whose Reply advertised Write and Read must take either RTR, not
// only the one it would have preferred (a cxgb4 Initiator sends Read).
TEST(EngineWire, AwaitingRtrTakesAnyAdvertisedType) {
  for (RtrMessage m : {RtrMessage::kWrite, RtrMessage::kRead}) {
    SCOPED_TRACE(static_cast<int>(m));
    Node node;
    StreamParams p;
    p.rtr_role = RtrRole::kAwait;
    p.rtr_message = RtrMessage::kWrite;  // the preferred one
    p.rtr_accept_mask = (1u << static_cast<unsigned>(RtrMessage::kWrite)) |
                        (1u << static_cast<unsigned>(RtrMessage::kRead));
    p.ird = 1;
    RawLink link(node, LinkOptions{}, Transport::kSocketPair, p, true);
    ASSERT_EQ(node.qp->PostSend(MakeSend(1, SendOpcode::kSend)), PostStatus::kOk);
    if (m == RtrMessage::kWrite) {
      link.peer->SendHeader(WriteHeader(0x1234, 0));
    } else {
      rdmap::ReadRequestBody body;
      body.sink_stag = 0x42;
      link.peer->SendHeader(ReadRequestOf(1, body));
    }
    // A Read RTR is answered first; then the Send held back behind the RTR.
    const std::size_t expected = m == RtrMessage::kRead ? 2 : 1;
    ASSERT_TRUE(link.peer->WaitSegments(expected));
    if (m == RtrMessage::kRead) {
      EXPECT_EQ(link.peer->segments()[0].decoded.header.opcode,
                rdmap::Opcode::kRdmaReadResponse);
    }
    EXPECT_EQ(link.peer->segments()[expected - 1].decoded.header.opcode, rdmap::Opcode::kSend);
    EXPECT_EQ(node.qp->state(), QpState::kRts);
  }
}

TEST(EngineWire, AwaitingSendRtrConsumesNoReceive) {
  Node node;
  StreamParams p;
  p.rtr_role = RtrRole::kAwait;
  p.rtr_message = RtrMessage::kSend;
  RawLink link(node, LinkOptions{}, Transport::kSocketPair, p, true);
  ReceiveWorkRequest rwr;
  rwr.wr_id = 5;
  ASSERT_EQ(node.qp->PostRecv(rwr), PostStatus::kOk);
  link.peer->SendHeader(SendHeaderOf(1, 0));  // the RTR
  link.peer->SendHeader(SendHeaderOf(2, 0));  // the first real Send
  const auto wc = WaitCompletions(*node.recv_cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 5u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  EXPECT_TRUE(StaysEmpty(*node.recv_cq, std::chrono::milliseconds(10)));
}

}  // namespace
}  // namespace siwx::engine::testing
