// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Two engines connected over a socketpair or loopback TCP, every data
// operation at sizes 0 .. 16 MiB, with SGE lists on both sides, CRC and
// markers on and off. Every target octet is checked, as are the guard
// octets around it, and every completion field.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>
#include <tuple>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * 1024;

struct DataConfig {
  Transport transport;
  bool crc;
  bool markers;
};

std::string ConfigName(const ::testing::TestParamInfo<DataConfig>& info) {
  return TransportName(info.param.transport) + (info.param.crc ? "_Crc" : "_NoCrc") +
         (info.param.markers ? "_Markers" : "_NoMarkers");
}

class DataPathTest : public ::testing::TestWithParam<DataConfig> {
 protected:
  void SetUp() override {
    LinkOptions o;
    o.crc = GetParam().crc;
    o.markers = GetParam().markers;
    Link(a_, b_, GetParam().transport, o);
  }

  // A Send of `size` octets from 2 SGEs at a into 3 SGEs at b (plus room).
  void RunSend(std::size_t size, std::uint32_t seed) {
    Buffer src(size);
    src.Fill(seed);
    const std::uint32_t src_key = src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
    const std::size_t room = size + 16;  // receive buffer larger than the message
    Buffer dst(room, 0x5A);
    const std::uint32_t dst_key = dst.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite, true);

    ReceiveWorkRequest rwr;
    rwr.wr_id = 1000 + seed;
    AddSplitSges(rwr, dst.addr(), room, dst_key, 3);
    ASSERT_EQ(b_.qp->PostRecv(rwr), PostStatus::kOk);

    SendWorkRequest swr = MakeSend(2000 + seed, SendOpcode::kSend);
    AddSplitSges(swr, src.addr(), size, src_key, 2);
    ASSERT_EQ(a_.qp->PostSend(swr), PostStatus::kOk);

    const auto sent = WaitCompletions(*a_.send_cq, 1);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].wr_id, 2000u + seed);
    EXPECT_EQ(sent[0].status, WcStatus::kSuccess);
    EXPECT_EQ(sent[0].opcode, WcOpcode::kSend);
    EXPECT_EQ(sent[0].byte_len, size);
    EXPECT_EQ(sent[0].qp_num, a_.qp->qp_num());
    const auto recv = WaitCompletions(*b_.recv_cq, 1);
    ASSERT_EQ(recv.size(), 1u);
    EXPECT_EQ(recv[0].wr_id, 1000u + seed);
    EXPECT_EQ(recv[0].status, WcStatus::kSuccess);
    EXPECT_EQ(recv[0].opcode, WcOpcode::kRecv);
    EXPECT_EQ(recv[0].byte_len, size);
    EXPECT_EQ(recv[0].wc_flags, 0u);
    EXPECT_EQ(recv[0].qp_num, b_.qp->qp_num());
    EXPECT_TRUE(SameBytes(dst.data(), src.data(), size));
    for (std::size_t i = size; i < room; ++i) ASSERT_EQ(dst.data()[i], 0x5A) << i;
    EXPECT_TRUE(dst.GuardsIntact());
  }

  // An RDMA Write of `size` octets from 3 SGEs into the middle of a region.
  void RunWrite(std::size_t size, std::uint32_t seed) {
    Buffer src(size);
    src.Fill(seed);
    const std::uint32_t src_key = src.Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite);
    Buffer dst(size, 0x11);
    const std::uint32_t rkey = dst.Register(b_.memory(), b_.pd, kAllRemote, true);

    SendWorkRequest wr = MakeSend(3000 + seed, SendOpcode::kRdmaWrite);
    AddSplitSges(wr, src.addr(), size, src_key, 3);
    wr.rkey = rkey;
    wr.remote_addr = dst.addr();
    ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
    // The Write completes locally; then a Send behind it tells b it is placed
    // (RFC 5040 5.5: a Send is delivered after the Writes before it).
    ReceiveWorkRequest rwr;
    rwr.wr_id = 77;
    ASSERT_EQ(b_.qp->PostRecv(rwr), PostStatus::kOk);
    ASSERT_EQ(a_.qp->PostSend(MakeSend(78, SendOpcode::kSend, 0)), PostStatus::kOk);

    const auto sent = WaitCompletions(*a_.send_cq, 1);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].wr_id, 3000u + seed);
    EXPECT_EQ(sent[0].status, WcStatus::kSuccess);
    EXPECT_EQ(sent[0].opcode, WcOpcode::kRdmaWrite);
    EXPECT_EQ(sent[0].byte_len, size);
    const auto recv = WaitCompletions(*b_.recv_cq, 1);
    ASSERT_EQ(recv.size(), 1u);
    EXPECT_EQ(recv[0].wr_id, 77u);
    EXPECT_EQ(recv[0].byte_len, 0u);
    EXPECT_TRUE(SameBytes(dst.data(), src.data(), size));
    EXPECT_TRUE(dst.GuardsIntact());
  }

  // An RDMA Read of `size` octets from the middle of b's region into a.
  void RunRead(std::size_t size, std::uint32_t seed) {
    Buffer src(size);
    src.Fill(seed);
    const std::uint32_t rkey = src.Register(b_.memory(), b_.pd, kAllRemote);
    Buffer dst(size, 0x22);
    const std::uint32_t sink = dst.Register(a_.memory(), a_.pd, kAllRemote, true);

    SendWorkRequest wr = MakeSend(4000 + seed, SendOpcode::kRdmaRead);
    AddSge(wr, dst.addr(), static_cast<std::uint32_t>(size), sink);
    wr.rkey = rkey;
    wr.remote_addr = src.addr();
    ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
    const auto done = WaitCompletions(*a_.send_cq, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].wr_id, 4000u + seed);
    EXPECT_EQ(done[0].status, WcStatus::kSuccess);
    EXPECT_EQ(done[0].opcode, WcOpcode::kRdmaRead);
    EXPECT_EQ(done[0].byte_len, size);
    EXPECT_TRUE(SameBytes(dst.data(), src.data(), size));
    EXPECT_TRUE(dst.GuardsIntact());
  }

  Node a_;
  Node b_;
};

const std::size_t kSizes[] = {0, 1, 4095, 4096, 64 * kKiB, kMiB};

TEST_P(DataPathTest, SendAtEverySize) {
  std::uint32_t seed = 1;
  for (std::size_t size : kSizes) {
    SCOPED_TRACE(size);
    RunSend(size, seed++);
  }
}

TEST_P(DataPathTest, WriteAtEverySize) {
  std::uint32_t seed = 1;
  for (std::size_t size : kSizes) {
    SCOPED_TRACE(size);
    RunWrite(size, seed++);
  }
}

TEST_P(DataPathTest, ReadAtEverySize) {
  std::uint32_t seed = 1;
  for (std::size_t size : kSizes) {
    SCOPED_TRACE(size);
    RunRead(size, seed++);
  }
}

// Writes posted back to back from three source regions in turn, then a
// Send whose SGEs lie in two of them: the transmit side checks a turn's
// pieces against the first region it checked and looks the others up, so
// every piece must come from its own region. Once all completed, nothing
// of the transmit side holds a region (Deregister waits for holders,
// memory.h).
TEST_P(DataPathTest, WritesFromAlternatingRegions) {
  constexpr std::size_t kPiece = 20 * kKiB;
  constexpr int kWrites = 9;
  std::vector<std::unique_ptr<Buffer>> sources;
  std::vector<std::uint32_t> keys;
  for (std::uint32_t r = 0; r < 3; ++r) {
    sources.push_back(std::make_unique<Buffer>(kPiece * kWrites));
    sources.back()->Fill(50 + r);
    keys.push_back(sources.back()->Register(a_.memory(), a_.pd, AccessFlags::kLocalWrite));
  }
  Buffer dst(kPiece * kWrites, 0x33);
  const std::uint32_t rkey = dst.Register(b_.memory(), b_.pd, kAllRemote, true);
  for (int k = 0; k < kWrites; ++k) {
    const Buffer& src = *sources[k % 3];
    SendWorkRequest wr = MakeSend(500 + k, SendOpcode::kRdmaWrite);
    AddSge(wr, src.addr() + kPiece * k, kPiece, keys[k % 3]);
    wr.rkey = rkey;
    wr.remote_addr = dst.addr() + kPiece * k;
    ASSERT_EQ(a_.qp->PostSend(wr), PostStatus::kOk);
  }
  Buffer recv(200, 0x44);
  const std::uint32_t lkey = recv.Register(b_.memory(), b_.pd, AccessFlags::kLocalWrite, true);
  ReceiveWorkRequest rwr;
  rwr.wr_id = 600;
  AddSge(rwr, recv.addr(), 200, lkey);
  ASSERT_EQ(b_.qp->PostRecv(rwr), PostStatus::kOk);
  SendWorkRequest send = MakeSend(601, SendOpcode::kSend);
  AddSge(send, sources[1]->addr(), 100, keys[1]);
  AddSge(send, sources[2]->addr(), 100, keys[2]);
  ASSERT_EQ(a_.qp->PostSend(send), PostStatus::kOk);

  const auto sent = WaitCompletions(*a_.send_cq, kWrites + 1);
  ASSERT_EQ(sent.size(), static_cast<std::size_t>(kWrites + 1));
  for (const WorkCompletion& wc : sent) EXPECT_EQ(wc.status, WcStatus::kSuccess) << wc.wr_id;
  const auto got = WaitCompletions(*b_.recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, 200u);
  for (int k = 0; k < kWrites; ++k) {
    EXPECT_TRUE(SameBytes(dst.data() + kPiece * k, sources[k % 3]->data() + kPiece * k, kPiece))
        << k;
  }
  EXPECT_TRUE(SameBytes(recv.data(), sources[1]->data(), 100));
  EXPECT_TRUE(SameBytes(recv.data() + 100, sources[2]->data(), 100));
  EXPECT_TRUE(dst.GuardsIntact());
  for (std::uint32_t key : keys) {
    EXPECT_EQ(a_.memory().Deregister(key), DeregisterStatus::kOk);
  }
}

// One 16 MiB operation per configuration, rotating the operation.
TEST_P(DataPathTest, SixteenMebibytes) {
  const DataConfig c = GetParam();
  const int which = (c.transport == Transport::kTcp ? 4 : 0) + (c.crc ? 2 : 0) + (c.markers ? 1 : 0);
  switch (which % 3) {
    case 0:
      RunWrite(16 * kMiB, 99);
      break;
    case 1:
      RunRead(16 * kMiB, 98);
      break;
    default:
      RunSend(16 * kMiB, 97);
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllConfigs, DataPathTest,
    ::testing::Values(DataConfig{Transport::kSocketPair, false, false},
                      DataConfig{Transport::kSocketPair, true, false},
                      DataConfig{Transport::kSocketPair, false, true},
                      DataConfig{Transport::kSocketPair, true, true},
                      DataConfig{Transport::kTcp, false, false},
                      DataConfig{Transport::kTcp, true, false},
                      DataConfig{Transport::kTcp, false, true},
                      DataConfig{Transport::kTcp, true, true}),
    ConfigName);

}  // namespace
}  // namespace siwx::engine::testing
