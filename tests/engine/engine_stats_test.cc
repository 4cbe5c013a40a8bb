// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// What the engine publishes in the process's statistics file for `siwx
// stat`: the bound stream's parameters and addresses, the QP state, the
// data-path counters (the engine's own), a Terminate each way with its
// cause, and unsuccessful completions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>

#include "common/stats/stats_file.h"
#include "common/transport/endpoints.h"
#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

std::optional<stats::QpSnapshot> SlotOf(const transport::Endpoint& local) {
  stats::ProcessSnapshot snapshot;
  int error = 0;
  const stats::ReadStatus status =
      stats::ReadStatsFile(stats::StatsPathFor(::getpid()), &snapshot, &error);
  EXPECT_EQ(status, stats::ReadStatus::kOk) << "errno " << error;
  for (const stats::QpSnapshot& q : snapshot.qps) {
    if (q.description.bound != 0 && q.description.local == local) return q;
  }
  return std::nullopt;
}

TEST(EngineStats, SlotShowsStreamCountersTerminatesAndErrors) {
  const char* setting = std::getenv("SIWX_STATS");
  if (setting != nullptr && std::string(setting) == "off") GTEST_SKIP() << "SIWX_STATS=off";
  Node a;
  Node b;
  const std::array<int, 2> fds = Connect(Transport::kTcp);
  const transport::Endpoints a_ends = transport::QueryEndpoints(fds[0]);
  const transport::Endpoints b_ends = transport::QueryEndpoints(fds[1]);
  LinkOptions o;
  o.crc = true;
  o.ird = 4;
  o.ord = 2;
  StreamParams params = ParamsFor(o);
  params.mpa_dialect = 3;
  params.mpa_revision = 2;
  a.Bind(fds[0], params);
  b.Bind(fds[1], params);

  // One Send of 4 KiB from a to b.
  Buffer src(4096);
  src.Fill(7);
  // Also the sink of the Read below: a Read Response is a tagged message.
  const std::uint32_t src_key =
      src.Register(a.memory(), a.pd, AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite);
  Buffer dst(4096);
  const std::uint32_t dst_key = dst.Register(b.memory(), b.pd, AccessFlags::kLocalWrite);
  PostRecv(b, 1, dst, dst_key);
  SendWorkRequest send = MakeSend(2, SendOpcode::kSend);
  AddSge(send, src.addr(), 4096, src_key);
  ASSERT_EQ(a.qp->PostSend(send), PostStatus::kOk);
  ASSERT_EQ(WaitCompletions(*b.recv_cq, 1).size(), 1u);
  ASSERT_EQ(WaitCompletions(*a.send_cq, 1).size(), 1u);

  std::optional<stats::QpSnapshot> qa = SlotOf(a_ends.local);
  ASSERT_TRUE(qa.has_value()) << "no slot with a's local address";
  EXPECT_EQ(qa->qp_num, a.qp->qp_num());
  EXPECT_EQ(qa->state, static_cast<std::uint8_t>(QpState::kRts));
  EXPECT_EQ(qa->description.peer, a_ends.peer);
  EXPECT_EQ(qa->description.mpa_dialect, 3);
  EXPECT_EQ(qa->description.mpa_revision, 2);
  EXPECT_EQ(qa->description.crc, 1);
  EXPECT_EQ(qa->description.ird, 4u);
  EXPECT_EQ(qa->description.ord, 2u);
  EXPECT_GT(qa->description.max_ulpdu, 0u);
  EXPECT_EQ(qa->tx_octets, a.qp->Counters().tx_octets);
  EXPECT_GE(qa->tx_octets, 4096u);
  EXPECT_GE(qa->tx_fpdus, 1u);
  EXPECT_EQ(qa->completion_errors, 0u);
  std::optional<stats::QpSnapshot> qb = SlotOf(b_ends.local);
  ASSERT_TRUE(qb.has_value());
  EXPECT_EQ(qb->rx_octets, qa->tx_octets);

  // An RDMA Read of an STag b never registered: b answers with a Terminate
  // (RFC 5040 7.2 and 6.4: RDMAP Remote Protection Error, Invalid STag) and
  // a's Read completes in error.
  SendWorkRequest read = MakeSend(3, SendOpcode::kRdmaRead);
  AddSge(read, src.addr(), 64, src_key);
  read.remote_addr = 0x1000;
  read.rkey = 0x7F00FF00;
  ASSERT_EQ(a.qp->PostSend(read), PostStatus::kOk);
  ASSERT_TRUE(WaitUntil([&] { return a.qp->state() == QpState::kError; }));
  ASSERT_TRUE(WaitUntil([&] {
    const auto q = SlotOf(a_ends.local);
    return q && q->description.terminate_received.valid && q->completion_errors >= 1;
  }));
  qa = SlotOf(a_ends.local);
  ASSERT_TRUE(qa.has_value());
  EXPECT_EQ(qa->description.terminate_received.layer, 0);  // RDMAP
  EXPECT_EQ(qa->description.terminate_received.etype, 1);  // Remote Protection Error
  EXPECT_EQ(qa->description.terminate_received.ecode, 0);  // Invalid STag
  EXPECT_EQ(qa->description.terminate_sent.valid, 0);
  EXPECT_EQ(qa->state, static_cast<std::uint8_t>(QpState::kError));
  qb = SlotOf(b_ends.local);
  ASSERT_TRUE(qb.has_value());
  EXPECT_EQ(qb->description.terminate_sent.valid, 1);
  EXPECT_EQ(qb->description.terminate_sent.layer, 0);
  EXPECT_EQ(qb->description.terminate_received.valid, 0);

  // A destroyed QP leaves the file once the engine lets go of it (the last
  // reference may be a command the progress thread is finishing).
  const std::uint32_t a_num = a.qp->qp_num();
  a.qp->Destroy();
  a.qp.reset();
  EXPECT_TRUE(WaitUntil([&] { return !SlotOf(a_ends.local).has_value(); }))
      << "QP " << a_num << " still listed";
}

}  // namespace
}  // namespace siwx::engine::testing
