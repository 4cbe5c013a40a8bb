// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// However TCP cuts the stream, the receive side places the same octets and
// completes the same WRs: one wire image of several messages is written
// whole, one octet at a time, and in random chunks (RFC 5044 is a stream
// protocol; FPDU boundaries mean nothing to TCP).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

enum class Cut { kWhole, kOctets, kRandom };

struct StreamConfig {
  Cut cut;
  bool crc;
  bool markers;
};

std::string StreamName(const ::testing::TestParamInfo<StreamConfig>& info) {
  const char* cut = info.param.cut == Cut::kWhole ? "Whole"
                    : info.param.cut == Cut::kOctets ? "OctetByOctet"
                                                     : "RandomChunks";
  return std::string(cut) + (info.param.crc ? "_Crc" : "_NoCrc") +
         (info.param.markers ? "_Markers" : "_NoMarkers");
}

class StreamCutTest : public ::testing::TestWithParam<StreamConfig> {};

TEST_P(StreamCutTest, SameOutcomeHoweverTheStreamIsCut) {
  const StreamConfig c = GetParam();
  Node node;
  LinkOptions o;
  o.crc = c.crc;
  o.markers = c.markers;
  o.ird = 2;
  RawLink link(node, o);

  // Receive buffers: WR 1 over three SGEs, WR 2 empty, WR 3 one SGE.
  Buffer recv(400, 0);
  const std::uint32_t recv_key = recv.Register(node.memory(), node.pd, AccessFlags::kLocalWrite, true);
  ReceiveWorkRequest r1;
  r1.wr_id = 1;
  AddSge(r1, recv.addr(), 100, recv_key);
  AddSge(r1, recv.addr() + 100, 7, recv_key);
  AddSge(r1, recv.addr() + 107, 193, recv_key);
  ReceiveWorkRequest r2;
  r2.wr_id = 2;
  ReceiveWorkRequest r3;
  r3.wr_id = 3;
  AddSge(r3, recv.addr() + 300, 100, recv_key);
  for (const ReceiveWorkRequest* r : {&r1, &r2, &r3}) ASSERT_EQ(node.qp->PostRecv(*r), PostStatus::kOk);
  Buffer target(2000, 0);
  const std::uint32_t rkey = target.Register(node.memory(), node.pd, kAllRemote, true);
  Buffer source(600);
  source.Fill(12);
  const std::uint32_t skey = source.Register(node.memory(), node.pd, kAllRemote);

  std::vector<std::uint8_t> msg1(300), write1(1000), msg3(50);
  for (std::size_t i = 0; i < msg1.size(); ++i) msg1[i] = PatternByte(1, i);
  for (std::size_t i = 0; i < write1.size(); ++i) write1[i] = PatternByte(2, i);
  for (std::size_t i = 0; i < msg3.size(); ++i) msg3[i] = PatternByte(3, i);

  std::vector<std::uint8_t> wire;
  RawPeer& peer = *link.peer;
  // A Send in two segments (MSN 1).
  peer.FrameTo(SendHeaderOf(1, 0, false), ByteSpan(msg1).first(200), wire);
  peer.FrameTo(SendHeaderOf(1, 200, true), ByteSpan(msg1).subspan(200), wire);
  // An RDMA Write in three segments at TO + 10.
  const std::uint64_t to = target.addr() + 10;
  peer.FrameTo(WriteHeader(rkey, to, false), ByteSpan(write1).first(333), wire);
  peer.FrameTo(WriteHeader(rkey, to + 333, false), ByteSpan(write1).subspan(333, 333), wire);
  peer.FrameTo(WriteHeader(rkey, to + 666, true), ByteSpan(write1).subspan(666), wire);
  // A Read Request for 500 octets of `source` at offset 50.
  peer.FrameTo(ReadRequestOf(1, rdmap::ReadRequestBody{0x4400, 0x10, 500, skey, source.addr() + 50}),
               {}, wire);
  // A zero-length Send (MSN 2), a 1-octet Write, a Send with SE (MSN 3).
  // The last Send is delivered after the Writes before it are placed
  // (RFC 5040 5.5), so its completion orders every check below.
  peer.FrameTo(SendHeaderOf(2, 0), {}, wire);
  const std::uint8_t one = 0xA5;
  peer.FrameTo(WriteHeader(rkey, target.addr() + 1500), ByteSpan(&one, 1), wire);
  peer.FrameTo(SendHeaderOf(3, 0, true, rdmap::Opcode::kSendWithSe), msg3, wire);

  switch (c.cut) {
    case Cut::kWhole:
      peer.WriteAll(wire);
      break;
    case Cut::kOctets:
      for (std::size_t i = 0; i < wire.size(); ++i) {
        peer.WriteAll(ByteSpan(wire).subspan(i, 1));
        if (i % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      break;
    case Cut::kRandom: {
      std::mt19937 rng(1234);
      std::size_t at = 0;
      while (at < wire.size()) {
        const std::size_t n = std::min<std::size_t>(wire.size() - at, 1 + rng() % 97);
        peer.WriteAll(ByteSpan(wire).subspan(at, n));
        at += n;
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
      }
      break;
    }
  }

  const auto wc = WaitCompletions(*node.recv_cq, 3);
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].byte_len, 300u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].byte_len, 0u);
  EXPECT_EQ(wc[2].wr_id, 3u);
  EXPECT_EQ(wc[2].byte_len, 50u);
  for (const WorkCompletion& w : wc) EXPECT_EQ(w.status, WcStatus::kSuccess);
  EXPECT_EQ(node.recv_notifications.load(), 0);  // not armed
  EXPECT_TRUE(SameBytes(recv.data(), msg1.data(), 300));
  EXPECT_TRUE(SameBytes(recv.data() + 300, msg3.data(), 50));
  for (std::size_t i = 350; i < 400; ++i) ASSERT_EQ(recv.data()[i], 0) << i;
  EXPECT_TRUE(recv.GuardsIntact());
  for (std::size_t i = 0; i < 10; ++i) ASSERT_EQ(target.data()[i], 0) << i;
  EXPECT_TRUE(SameBytes(target.data() + 10, write1.data(), 1000));
  for (std::size_t i = 1010; i < 2000; ++i) ASSERT_EQ(target.data()[i], i == 1500 ? 0xA5 : 0) << i;
  EXPECT_TRUE(target.GuardsIntact());

  ASSERT_TRUE(peer.WaitSegments(1));
  const WireSegment& resp = peer.segments()[0];
  EXPECT_EQ(resp.decoded.header.opcode, rdmap::Opcode::kRdmaReadResponse);
  EXPECT_EQ(resp.decoded.header.stag, 0x4400u);
  EXPECT_EQ(resp.decoded.header.to, 0x10u);
  ASSERT_EQ(resp.payload.size(), 500u);
  EXPECT_TRUE(SameBytes(resp.payload.data(), source.data() + 50, 500));
  EXPECT_EQ(node.qp->state(), QpState::kRts);
  EXPECT_FALSE(node.qp->Query().terminate_sent.has_value());
}

INSTANTIATE_TEST_SUITE_P(
    Cuts, StreamCutTest,
    ::testing::Values(StreamConfig{Cut::kWhole, false, false}, StreamConfig{Cut::kWhole, true, true},
                      StreamConfig{Cut::kOctets, false, false}, StreamConfig{Cut::kOctets, true, false},
                      StreamConfig{Cut::kOctets, false, true}, StreamConfig{Cut::kOctets, true, true},
                      StreamConfig{Cut::kRandom, false, false}, StreamConfig{Cut::kRandom, true, false},
                      StreamConfig{Cut::kRandom, false, true}, StreamConfig{Cut::kRandom, true, true}),
    StreamName);

}  // namespace
}  // namespace siwx::engine::testing
