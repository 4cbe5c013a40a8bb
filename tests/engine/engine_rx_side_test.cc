// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The receive side (QpRx) alone, on a socketpair, against a fake QP that
// implements QpForRx (qp_sides.h) and records what the receive side asks of
// it: no engine, no progress thread, no transmit side. Each test writes
// FPDUs by hand and checks the calls they cause.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "common/engine/qp_sides.h"
#include "common/engine/rx.h"
#include "common/wire/ddp_rdmap.h"
#include "common/wire/fpdu.h"
#include "common/wire/terminate.h"

namespace siwx::engine {
namespace {

class FakeQp final : public QpForRx {
 public:
  FakeQp() : pd_(memory_.AllocatePd()) {}

  // QpForSide
  std::uint32_t qp_num() const override { return 7; }
  QpState state() const override { return QpState::kRts; }
  MemoryTable& memory() override { return memory_; }
  PdId pd() const override { return pd_; }
  stats::QpCounterBlock& counters() override { return counters_; }
  bool RtrReceived() const override { return true; }
  bool RaiseError(const ErrorReport& report) override {
    errors.push_back(report);
    return errors.size() == 1;
  }
  void EndStream(bool abort) override { end_stream.push_back(abort); }

  // QpForRx
  std::optional<ReceiveWorkRequest> TakeReceive() override {
    if (receives.empty()) return std::nullopt;
    ReceiveWorkRequest wr = receives.front();
    receives.pop_front();
    return wr;
  }
  void CompleteReceive(const WorkCompletion& wc, bool /*solicited*/) override {
    completions.push_back(wc);
  }
  std::optional<OrqEntry> OldestRead() override { return std::nullopt; }
  void CompleteOldestRead(const OrqEntry& /*read*/) override {}
  std::uint32_t ReadRequestsOutstanding() override { return read_requests_outstanding; }
  void WaitForSendAccounting() const override {}
  void QueueReadRequest(const IrqEntry& request) override { read_requests.push_back(request); }
  void KickTx() override { ++tx_kicks; }
  std::optional<std::uint64_t> FindReadByMsn(std::uint32_t) override { return std::nullopt; }
  std::optional<std::uint64_t> FindUnfinishedSendByMsn(std::uint32_t) override {
    return std::nullopt;
  }
  std::optional<std::uint64_t> FindUnfinishedWriteByStag(std::uint32_t) override {
    return std::nullopt;
  }
  void RecordTerminateReceived(const rdmap::TerminateHeader&) override {}
  void MarkRtrReceived() override {}
  void OnPeerClosedInOrder() override { ++orderly_closes; }
  void StopReading() override {}
  void StopPolling() override {}
  bool finalized() const override { return false; }

  std::deque<ReceiveWorkRequest> receives;
  std::vector<WorkCompletion> completions;
  std::vector<ErrorReport> errors;
  std::vector<bool> end_stream;
  std::vector<IrqEntry> read_requests;
  std::uint32_t read_requests_outstanding = 0;
  int tx_kicks = 0;
  int orderly_closes = 0;

 private:
  MemoryTable memory_;
  PdId pd_;
  stats::QpCounterBlock counters_;
};

class RxSideTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::array<int, 2> fds{-1, -1};
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds.data()), 0);
    peer_fd_ = fds[0];
    stream_ = std::make_unique<transport::TcpStream>(fds[1]);
    params_.ird = 1;
    rx_.Start(params_);
  }
  void TearDown() override {
    rx_.Stop();
    close(peer_fd_);
  }

  // Frames one FPDU (no CRC, no markers) with `header` and `payload`, as the
  // peer sends it.
  void PeerSends(const rdmap::DdpRdmapHeader& header, ByteSpan payload = {}) {
    std::array<std::uint8_t, 64> raw{};
    const rdmap::EncodeResult encoded = rdmap::EncodeDdpRdmapHeader(header, raw);
    ASSERT_EQ(encoded.status, rdmap::EncodeStatus::kOk);
    mpa::FpduFrame frame;
    const std::array<ByteSpan, 1> pieces{payload};
    ASSERT_EQ(framer_.Frame(ByteSpan(raw.data(), encoded.length), pieces, frame),
              mpa::FrameStatus::kOk);
    for (const mpa::IoSlice& s : frame.slices()) {
      ASSERT_EQ(write(peer_fd_, s.base, s.len), static_cast<ssize_t>(s.len));
    }
  }

  // A receive WR whose one SGE is `buffer`, registered for local write.
  ReceiveWorkRequest PostedReceive(std::vector<std::uint8_t>& buffer, std::uint64_t wr_id) {
    const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
    const RegisterResult reg =
        qp_.memory().Register(qp_.pd(), address, buffer.size(), address, AccessFlags::kLocalWrite);
    EXPECT_EQ(reg.status, RegisterStatus::kOk);
    ReceiveWorkRequest wr;
    wr.wr_id = wr_id;
    wr.num_sge = 1;
    wr.sge[0] = Sge{address, static_cast<std::uint32_t>(buffer.size()), reg.stag};
    return wr;
  }

  static rdmap::DdpRdmapHeader Send(std::uint32_t msn) {
    rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kSend, true);
    h.msn = msn;
    return h;
  }

  FakeQp qp_;
  QpRx rx_{qp_};
  StreamParams params_;
  mpa::FpduFramer framer_{mpa::FpduFramingConfig{}};
  int peer_fd_ = -1;
  std::unique_ptr<transport::TcpStream> stream_;
};

TEST_F(RxSideTest, ASendIsPlacedIntoTheReceiveAndCompletesThroughTheQp) {
  std::vector<std::uint8_t> buffer(64, 0);
  qp_.receives.push_back(PostedReceive(buffer, 42));
  const std::array<std::uint8_t, 5> data{1, 2, 3, 4, 5};
  PeerSends(Send(1), ByteSpan(data.data(), data.size()));
  rx_.OnReadable(*stream_);
  ASSERT_EQ(qp_.completions.size(), 1u);
  EXPECT_EQ(qp_.completions[0].wr_id, 42u);
  EXPECT_EQ(qp_.completions[0].status, WcStatus::kSuccess);
  EXPECT_EQ(qp_.completions[0].byte_len, data.size());
  EXPECT_EQ(qp_.completions[0].qp_num, 7u);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buffer.begin()));
  EXPECT_TRUE(qp_.errors.empty());
}

// RFC 5041 7.1 untagged rule 2 through the QP: no receive posted raises the
// DDP "Invalid MSN - no buffer available" Terminate (RFC 5041 7.2) with the
// segment's header copy, and nothing completes.
TEST_F(RxSideTest, ASendWithoutAReceiveRaisesNoBuffer) {
  PeerSends(Send(1));
  rx_.OnReadable(*stream_);
  ASSERT_EQ(qp_.errors.size(), 1u);
  const ErrorReport& report = qp_.errors[0];
  ASSERT_TRUE(report.terminate.has_value());
  const rdmap::TerminateCause expected = rdmap::TerminateCause::DdpNoBuffer();
  EXPECT_EQ(report.cause.layer, expected.layer);
  EXPECT_EQ(report.cause.etype, expected.etype);
  EXPECT_EQ(report.cause.ecode, expected.ecode);
  EXPECT_TRUE(report.terminate->d);  // DDP header copy (RFC 5040 4.8)
  EXPECT_EQ(report.event, AsyncEventType::kQpRequestError);
  EXPECT_TRUE(qp_.completions.empty());
}

// RFC 5040 5.2.1: a Read Request takes one of IRD buffers; with IRD
// outstanding the next one is refused before it reaches the IRQ.
TEST_F(RxSideTest, AReadRequestBeyondIrdNeverReachesTheIrq) {
  qp_.read_requests_outstanding = 1;  // IRD 1, one being answered
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadRequest, true);
  h.msn = 1;
  h.body = rdmap::ReadRequestBody{};
  PeerSends(h);
  rx_.OnReadable(*stream_);
  EXPECT_TRUE(qp_.read_requests.empty());
  ASSERT_EQ(qp_.errors.size(), 1u);
  EXPECT_EQ(qp_.errors[0].cause.ecode, rdmap::TerminateCause::DdpNoBuffer().ecode);
}

// A zero-length Read Request within IRD goes to the IRQ and the transmit
// side is kicked once for what that read brought.
TEST_F(RxSideTest, AnAcceptedReadRequestIsQueuedAndKicksTheTransmitSide) {
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadRequest, true);
  h.msn = 1;
  rdmap::ReadRequestBody body;
  body.sink_stag = 0x1234;
  h.body = body;
  PeerSends(h);
  rx_.OnReadable(*stream_);
  ASSERT_EQ(qp_.read_requests.size(), 1u);
  EXPECT_EQ(qp_.read_requests[0].sink_stag, 0x1234u);
  EXPECT_GE(qp_.tx_kicks, 1);
  EXPECT_TRUE(qp_.errors.empty());
}

// The peer's FIN at a message boundary is an orderly close, handed to the QP.
TEST_F(RxSideTest, APeerFinAtAMessageBoundaryIsAnOrderlyClose) {
  shutdown(peer_fd_, SHUT_WR);
  rx_.OnReadable(*stream_);
  EXPECT_EQ(qp_.orderly_closes, 1);
  EXPECT_TRUE(rx_.eof());
  EXPECT_TRUE(qp_.errors.empty());
}

}  // namespace
}  // namespace siwx::engine
