// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The transmit side (QpTx) alone, on a socketpair, against a fake QP that
// implements QpForTx (qp_sides.h): no engine, no progress thread, no receive
// side. Each test puts WRs into the fake's SQ (or Read Requests into its
// IRQ, or mail into its mailbox), pumps, parses what reached the peer's end
// of the socketpair and checks the FPDUs and the calls the transmit side made.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "common/engine/qp_sides.h"
#include "common/engine/tx.h"
#include "common/wire/ddp_rdmap.h"
#include "common/wire/terminate.h"
#include "engine/engine_test_util.h"

namespace siwx::engine {
namespace {

using testing::DecodeTerminateSegment;
using testing::ParsedWire;
using testing::ParseWire;
using testing::WireSegment;

// A send WR as the SQ stores it: the record with its SGEs right behind it
// (work_request.h asserts that SendRecord leaves no padding before them).
struct StoredSend {
  SendRecord record;
  std::array<Sge, kMaxSge> sges;
  std::array<std::uint8_t, kMaxInlineData> inline_area;
};

class FakeQp final : public QpForTx {
 public:
  FakeQp() : pd_(memory_.AllocatePd()) {}

  // QpForSide
  std::uint32_t qp_num() const override { return 9; }
  QpState state() const override { return QpState::kRts; }
  MemoryTable& memory() override { return memory_; }
  PdId pd() const override { return pd_; }
  stats::QpCounterBlock& counters() override { return counters_; }
  bool RtrReceived() const override { return rtr_received; }
  bool RaiseError(const ErrorReport& report) override {
    errors.push_back(report);
    if (errors.size() > 1) return false;
    // As Qp does: the Terminate goes to the transmit side's mailbox.
    if (report.terminate) mail = TxMail{report.terminate, TxClose::kNone};
    return true;
  }
  void EndStream(bool abort) override { end_stream.push_back(abort); }

  // QpForTx
  transport::TcpStream* stream() override { return stream_.get(); }
  bool SetWriteInterest(bool want) override {
    write_interest = want;
    return true;
  }
  void NoteTxIdle() override { ++idle_notes; }
  std::optional<TxMail> TakeMail() override { return std::exchange(mail, std::nullopt); }
  std::uint64_t SqHead() override { return 0; }
  SqPeek PeekSq(std::uint64_t seq) override {
    SqPeek peek;
    if (seq < sq.size()) peek.wr = &sq[seq]->record;
    peek.reads_outstanding = orq.size();
    return peek;
  }
  void SetSqMsn(std::uint64_t seq, std::uint32_t msn) override { sq_msn.emplace_back(seq, msn); }
  void MarkSqDone(std::uint64_t seq) override { done.push_back(seq); }
  void RetireSq() override { ++retires; }
  void PushOrq(const OrqEntry& read) override { orq.push_back(read); }
  std::optional<IrqEntry> TakeReadRequest() override {
    if (irq.empty()) return std::nullopt;
    IrqEntry entry = irq.front();
    irq.pop_front();
    return entry;
  }
  void ResponsesSent(std::uint32_t count) override { responses_sent += count; }
  void BeginSendAccounting() override {}
  void EndSendAccounting() override {}

  void Attach(int fd) { stream_ = std::make_unique<transport::TcpStream>(fd); }
  // Appends a WR to the SQ; returns its sequence number.
  std::uint64_t Post(const SendWorkRequest& wr) {
    auto stored = std::make_unique<StoredSend>();
    stored->record.Assign(wr, stored->inline_area.data());
    sq.push_back(std::move(stored));
    return sq.size() - 1;
  }

  bool rtr_received = true;
  std::vector<std::unique_ptr<StoredSend>> sq;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> sq_msn;
  std::vector<std::uint64_t> done;
  int retires = 0;
  std::vector<OrqEntry> orq;
  std::deque<IrqEntry> irq;
  std::uint32_t responses_sent = 0;
  std::optional<TxMail> mail;
  std::vector<ErrorReport> errors;
  std::vector<bool> end_stream;
  bool write_interest = false;
  int idle_notes = 0;

 private:
  MemoryTable memory_;
  PdId pd_;
  stats::QpCounterBlock counters_;
  std::unique_ptr<transport::TcpStream> stream_;
};

constexpr std::size_t kMaxUlpdu = 1024;  // small, so messages are segmented

class TxSideTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::array<int, 2> fds{-1, -1};
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds.data()), 0);
    peer_fd_ = fds[0];
    qp_.Attach(fds[1]);
  }
  void TearDown() override {
    tx_.Stop();
    close(peer_fd_);
  }

  void Start(const StreamParams& params = {}) { tx_.Start(params, kMaxUlpdu); }

  // Everything the peer has received so far, parsed from the first octet.
  ParsedWire PeerReceived() {
    std::array<std::uint8_t, 65536> chunk{};
    for (;;) {
      const ssize_t n = recv(peer_fd_, chunk.data(), chunk.size(), MSG_DONTWAIT);
      if (n <= 0) break;
      wire_.insert(wire_.end(), chunk.begin(), chunk.begin() + n);
    }
    ParsedWire parsed = ParseWire(wire_, /*crc=*/false, /*markers=*/false);
    EXPECT_EQ(parsed.error, mpa::MpaError::kNone);
    EXPECT_EQ(parsed.consumed, wire_.size());  // whole FPDUs only
    return parsed;
  }

  // Registers `buffer` (its address as the TO) and returns its STag.
  std::uint32_t Register(std::vector<std::uint8_t>& buffer, AccessFlags access) {
    const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
    const RegisterResult reg =
        qp_.memory().Register(qp_.pd(), address, buffer.size(), address, access);
    EXPECT_EQ(reg.status, RegisterStatus::kOk);
    return reg.stag;
  }

  SendWorkRequest WrOver(SendOpcode opcode, std::vector<std::uint8_t>& buffer,
                         std::uint32_t lkey, std::uint64_t wr_id) {
    SendWorkRequest wr;
    wr.wr_id = wr_id;
    wr.opcode = opcode;
    wr.flags = kSendSignaled;
    wr.num_sge = 1;
    wr.sge[0] = Sge{reinterpret_cast<std::uintptr_t>(buffer.data()),
                    static_cast<std::uint32_t>(buffer.size()), lkey};
    return wr;
  }

  // The WR numbered `seq` failed with a local protection error and the peer
  // got nothing but a Terminate: that Terminate's header, or nothing (with
  // the failure recorded).
  std::optional<rdmap::TerminateHeader> OnlyATerminateAfterLocProtErr(std::uint64_t seq) {
    EXPECT_EQ(qp_.errors.size(), 1u);
    if (qp_.errors.size() != 1 || !qp_.errors[0].failed_seq.has_value()) {
      ADD_FAILURE() << "the QP reported no failed WR";
      return std::nullopt;
    }
    EXPECT_EQ(*qp_.errors[0].failed_seq, seq);
    EXPECT_EQ(qp_.errors[0].failed_status, WcStatus::kLocProtErr);
    const ParsedWire wire = PeerReceived();
    EXPECT_EQ(wire.segments.size(), 1u);  // the Terminate only
    if (wire.segments.size() != 1) return std::nullopt;
    return DecodeTerminateSegment(wire.segments[0]);
  }

  static std::vector<std::uint8_t> Pattern(std::size_t n, std::uint8_t seed) {
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 7);
    return v;
  }

  FakeQp qp_;
  QpTx tx_{qp_};
  int peer_fd_ = -1;
  std::vector<std::uint8_t> wire_;
};

// RFC 5041 4.3 and RFC 5040 5.3: a Send is cut into untagged segments on
// QN 0 that all carry the message's MSN (1 for the first Send), "the MO
// field ... the offset, in octets, from the start of the message", and the
// Last flag only on the final one; every ULPDU fits the stream's max ULPDU
// (RFC 5044 4.5 MULPDU). It completes once the kernel has all of it.
TEST_F(TxSideTest, ASendIsSegmentedWithOneMsnAndRisingMessageOffsets) {
  Start();
  std::vector<std::uint8_t> data = Pattern(3000, 1);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  const std::uint64_t seq = qp_.Post(WrOver(SendOpcode::kSend, data, lkey, 5));
  tx_.Pump();

  const ParsedWire wire = PeerReceived();
  ASSERT_GE(wire.segments.size(), 3u);
  std::vector<std::uint8_t> joined;
  for (std::size_t i = 0; i < wire.segments.size(); ++i) {
    const WireSegment& s = wire.segments[i];
    ASSERT_EQ(s.decoded.status, rdmap::HeaderStatus::kOk);
    EXPECT_LE(s.ulpdu_length, kMaxUlpdu);
    EXPECT_EQ(s.decoded.header.opcode, rdmap::Opcode::kSend);
    EXPECT_FALSE(s.decoded.header.tagged);
    EXPECT_EQ(s.decoded.header.qn, rdmap::kQnSend);
    EXPECT_EQ(s.decoded.header.msn, 1u);
    EXPECT_EQ(s.decoded.header.mo, joined.size());
    EXPECT_EQ(s.decoded.header.last, i + 1 == wire.segments.size());
    joined.insert(joined.end(), s.payload.begin(), s.payload.end());
  }
  EXPECT_EQ(joined, data);
  ASSERT_EQ(qp_.sq_msn.size(), 1u);
  EXPECT_EQ(qp_.sq_msn[0], std::make_pair(seq, std::uint32_t{1}));
  EXPECT_EQ(qp_.done, std::vector<std::uint64_t>{seq});
  EXPECT_GE(qp_.retires, 1);
  EXPECT_FALSE(qp_.write_interest);
  EXPECT_TRUE(qp_.errors.empty());
}

// RFC 5041 4.2: tagged segments name the Data Sink's STag, and each one's TO
// is the sink TO of the message plus the octets sent before it.
TEST_F(TxSideTest, AWriteIsSegmentedWithTheSinkStagAndAdvancingOffsets) {
  Start();
  std::vector<std::uint8_t> data = Pattern(2500, 3);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  SendWorkRequest wr = WrOver(SendOpcode::kRdmaWrite, data, lkey, 6);
  wr.rkey = 0xABCD0102;
  wr.remote_addr = 0x7000;
  const std::uint64_t seq = qp_.Post(wr);
  tx_.Pump();

  const ParsedWire wire = PeerReceived();
  ASSERT_GE(wire.segments.size(), 3u);
  std::vector<std::uint8_t> joined;
  for (std::size_t i = 0; i < wire.segments.size(); ++i) {
    const rdmap::DdpRdmapHeader& h = wire.segments[i].decoded.header;
    EXPECT_EQ(h.opcode, rdmap::Opcode::kRdmaWrite);
    EXPECT_TRUE(h.tagged);
    EXPECT_EQ(h.stag, 0xABCD0102u);
    EXPECT_EQ(h.to, 0x7000u + joined.size());
    EXPECT_EQ(h.last, i + 1 == wire.segments.size());
    joined.insert(joined.end(), wire.segments[i].payload.begin(), wire.segments[i].payload.end());
  }
  EXPECT_EQ(joined, data);
  EXPECT_TRUE(qp_.sq_msn.empty());  // a Write takes no MSN
  EXPECT_EQ(qp_.done, std::vector<std::uint64_t>{seq});
}

// The check of a WR's SGEs before it starts (verbs: every lkey must name a
// region of the QP's PD) pins the region for the turn, so framing the WR
// looks the region up no second time: each lookup writes the table's lock
// and the region's counts, cache lines the receive side's placement writes
// on another CPU (docs/performance-notes.md 3.18). Small Writes (one FPDU
// each, as ib_write_lat posts them) and a segmented one: one lookup per
// turn, every octet on the wire, and nothing holds the region afterwards.
TEST_F(TxSideTest, AWrsSourceRegionIsLookedUpOncePerTurn) {
  Start();
  std::vector<std::uint8_t> data = Pattern(3000, 5);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  constexpr int kSmallWrites = 4;
  std::vector<std::uint64_t> seqs;
  for (int i = 0; i < kSmallWrites; ++i) {
    SendWorkRequest wr = WrOver(SendOpcode::kRdmaWrite, data, lkey, 20 + i);
    wr.sge[0].addr += 8 * static_cast<std::uint64_t>(i);
    wr.sge[0].length = 8;
    wr.rkey = 0x1234;
    wr.remote_addr = 0x9000 + 8 * static_cast<std::uint64_t>(i);
    const std::uint64_t checks_before = qp_.memory().checks();
    seqs.push_back(qp_.Post(wr));
    tx_.Pump();
    EXPECT_EQ(qp_.memory().checks() - checks_before, 1u) << "Write " << i;
  }
  SendWorkRequest big = WrOver(SendOpcode::kRdmaWrite, data, lkey, 30);
  big.rkey = 0x5678;
  big.remote_addr = 0xA000;
  const std::uint64_t checks_before = qp_.memory().checks();
  seqs.push_back(qp_.Post(big));
  tx_.Pump();
  EXPECT_EQ(qp_.memory().checks() - checks_before, 1u);  // was one per WR plus one per turn

  const ParsedWire wire = PeerReceived();
  ASSERT_GE(wire.segments.size(), static_cast<std::size_t>(kSmallWrites) + 3);
  for (int i = 0; i < kSmallWrites; ++i) {
    const WireSegment& s = wire.segments[static_cast<std::size_t>(i)];
    EXPECT_EQ(s.decoded.header.to, 0x9000u + 8 * static_cast<std::uint64_t>(i));
    EXPECT_EQ(s.payload, std::vector<std::uint8_t>(data.begin() + 8 * i,
                                                   data.begin() + 8 * i + 8));
  }
  std::vector<std::uint8_t> joined;
  for (std::size_t i = kSmallWrites; i < wire.segments.size(); ++i) {
    EXPECT_EQ(wire.segments[i].decoded.header.stag, 0x5678u);
    joined.insert(joined.end(), wire.segments[i].payload.begin(),
                  wire.segments[i].payload.end());
  }
  EXPECT_EQ(joined, data);
  EXPECT_EQ(qp_.done, seqs);
  EXPECT_TRUE(qp_.errors.empty());
  // Deregister waits for every holder (memory.h): it returns, so the pin
  // taken by the check went with the turn.
  EXPECT_EQ(qp_.memory().Deregister(lkey), DeregisterStatus::kOk);
}

// The check still fails a WR whose second SGE lies outside its region, with
// the pin of the first SGE's region taken: nothing of the WR goes out.
TEST_F(TxSideTest, AWrWithOneBadSgeAfterAGoodOneFailsWholly) {
  Start();
  std::vector<std::uint8_t> data = Pattern(64, 6);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  SendWorkRequest wr = WrOver(SendOpcode::kRdmaWrite, data, lkey, 40);
  wr.num_sge = 2;
  wr.sge[0].length = 16;
  wr.sge[1] = Sge{reinterpret_cast<std::uintptr_t>(data.data()) + 32, 64, lkey};  // past the end
  wr.rkey = 0x1111;
  const std::uint64_t seq = qp_.Post(wr);
  tx_.Pump();

  EXPECT_TRUE(OnlyATerminateAfterLocProtErr(seq).has_value());
  EXPECT_EQ(qp_.memory().Deregister(lkey), DeregisterStatus::kOk);
}

// RFC 5040 5.2: a Read Request goes on QN 1 with its own MSN sequence and
// names the local sink and the remote source; it enters the ORQ before it
// can reach the wire, and does not complete when sent (its response does).
// RFC 6581 7.1 ORD: with ORD Reads outstanding the next one waits.
TEST_F(TxSideTest, AReadRequestEntersTheOrqAndOrdHoldsBackTheNext) {
  StreamParams params;
  params.ord = 2;
  Start(params);
  std::vector<std::uint8_t> sink(4096);
  const std::uint32_t sink_stag = Register(sink, AccessFlags::kLocalWrite |
                                                     AccessFlags::kRemoteWrite);
  SendWorkRequest read = WrOver(SendOpcode::kRdmaRead, sink, sink_stag, 7);
  read.rkey = 0x55;
  read.remote_addr = 0x9000;
  for (int i = 0; i < 3; ++i) qp_.Post(read);
  tx_.Pump();

  const ParsedWire wire = PeerReceived();
  ASSERT_EQ(wire.segments.size(), 2u);  // ORD 2
  for (std::uint32_t i = 0; i < 2; ++i) {
    const rdmap::DdpRdmapHeader& h = wire.segments[i].decoded.header;
    EXPECT_EQ(h.opcode, rdmap::Opcode::kRdmaReadRequest);
    EXPECT_EQ(h.qn, rdmap::kQnReadRequest);
    EXPECT_EQ(h.msn, i + 1);
    const auto& body = std::get<rdmap::ReadRequestBody>(h.body);
    EXPECT_EQ(body.sink_stag, sink_stag);
    EXPECT_EQ(body.sink_to, reinterpret_cast<std::uintptr_t>(sink.data()));
    EXPECT_EQ(body.read_size, sink.size());
    EXPECT_EQ(body.source_stag, 0x55u);
    EXPECT_EQ(body.source_to, 0x9000u);
    EXPECT_EQ(qp_.orq[i].msn, i + 1);
    EXPECT_EQ(qp_.orq[i].seq, i);
  }
  EXPECT_TRUE(qp_.done.empty());
  // Held back by ORD, nothing else to send: the pump says it stopped idle
  // (what a poll may then wait for is input, Qp::PollMayWait).
  EXPECT_EQ(qp_.idle_notes, 1);

  // The first response arrived (the receive side pops the ORQ): one more.
  qp_.orq.erase(qp_.orq.begin());
  tx_.Pump();
  const ParsedWire more = PeerReceived();
  ASSERT_EQ(more.segments.size(), 3u);
  EXPECT_EQ(more.segments[2].decoded.header.msn, 3u);
}

// RFC 5040 5.2: "the RDMA Read Response ... uses the Data Sink STag and Data
// Sink Tagged Offset from the RDMA Read Request"; the payload is the
// source's octets. The request leaves the IRD count once all of its
// response is in the kernel.
TEST_F(TxSideTest, AReadResponseCarriesTheSourceToTheRequestedSink) {
  Start();
  std::vector<std::uint8_t> source = Pattern(2200, 9);
  const std::uint32_t source_stag = Register(source, AccessFlags::kRemoteRead);
  IrqEntry request;
  request.sink_stag = 0x4242;
  request.sink_to = 0x100;
  request.source_stag = source_stag;
  request.source_to = reinterpret_cast<std::uintptr_t>(source.data());
  request.size = static_cast<std::uint32_t>(source.size());
  qp_.irq.push_back(request);
  tx_.Pump();

  const ParsedWire wire = PeerReceived();
  ASSERT_GE(wire.segments.size(), 3u);
  std::vector<std::uint8_t> joined;
  for (const WireSegment& s : wire.segments) {
    EXPECT_EQ(s.decoded.header.opcode, rdmap::Opcode::kRdmaReadResponse);
    EXPECT_EQ(s.decoded.header.stag, 0x4242u);
    EXPECT_EQ(s.decoded.header.to, 0x100u + joined.size());
    joined.insert(joined.end(), s.payload.begin(), s.payload.end());
  }
  EXPECT_TRUE(wire.segments.back().decoded.header.last);
  EXPECT_EQ(joined, source);
  EXPECT_EQ(qp_.responses_sent, 1u);
}

// Verbs: the lkey of every SGE must name a region of the QP's PD. A WR that
// does not fails with a local protection error; the peer learns of the QP's
// end from a Local Catastrophic Terminate (RFC 5040 7.1 rule 1), with no
// header copy, and nothing of the WR is sent.
TEST_F(TxSideTest, AWrWithABadLkeyFailsAndOnlyTheTerminateIsSent) {
  Start();
  std::vector<std::uint8_t> data = Pattern(100, 4);
  const std::uint64_t seq = qp_.Post(WrOver(SendOpcode::kSend, data, 0xDEAD00, 8));
  tx_.Pump();

  const std::optional<rdmap::TerminateHeader> t = OnlyATerminateAfterLocProtErr(seq);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->cause, rdmap::TerminateCause::RdmapLocalCatastrophic());
  EXPECT_FALSE(t->d);
  EXPECT_TRUE(qp_.done.empty());
}

// A full socket: the transmit side arms write interest and keeps the rest
// framed; when the peer drains, the next pump sends it exactly as framed
// (no FPDU is cut or framed twice) and the WRs complete in order.
TEST_F(TxSideTest, AFullSocketArmsWriteInterestAndResumesExactly) {
  Start();  // 1 MiB of Writes: more than a socketpair holds
  std::vector<std::uint8_t> data = Pattern(256 * 1024, 5);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  for (std::uint64_t i = 0; i < 4; ++i) {
    SendWorkRequest wr = WrOver(SendOpcode::kRdmaWrite, data, lkey, i);
    wr.rkey = 0x77;
    wr.remote_addr = 0;
    qp_.Post(wr);
  }
  tx_.Pump();
  EXPECT_TRUE(qp_.write_interest);
  EXPECT_LT(qp_.done.size(), 4u);

  for (int round = 0; round < 10000 && qp_.done.size() < 4; ++round) {
    PeerReceived();
    tx_.Pump();
  }
  const ParsedWire wire = PeerReceived();
  EXPECT_EQ(qp_.done, (std::vector<std::uint64_t>{0, 1, 2, 3}));
  EXPECT_FALSE(qp_.write_interest);
  std::uint64_t octets = 0;
  for (const WireSegment& s : wire.segments) {
    EXPECT_EQ(s.decoded.header.to, octets % data.size());
    octets += s.payload.size();
  }
  EXPECT_EQ(octets, 4 * data.size());
  EXPECT_TRUE(qp_.errors.empty());
}

// The source region of Writes stuck behind a full socket is deregistered
// on another thread: the transmit side holds no region between turns
// (memory.h: never across waiting for the network), so Deregister returns
// while the framed FPDUs still wait, and the next turn's re-check fails
// the stream instead of sending octets of memory no longer registered.
TEST_F(TxSideTest, ADeregisterBehindAFullSocketReturnsAndTheRestFails) {
  Start();
  std::vector<std::uint8_t> data = Pattern(256 * 1024, 9);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  for (std::uint64_t i = 0; i < 4; ++i) {
    SendWorkRequest wr = WrOver(SendOpcode::kRdmaWrite, data, lkey, i);
    wr.rkey = 0x99;
    qp_.Post(wr);
  }
  tx_.Pump();
  ASSERT_TRUE(qp_.write_interest);  // blocked: the peer reads nothing yet
  std::future<DeregisterStatus> deregistered = std::async(
      std::launch::async, [&] { return qp_.memory().Deregister(lkey); });
  // A generous bound for a loaded machine; a Deregister that waited for the
  // socket would never return, since nothing drains it meanwhile.
  if (deregistered.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    ADD_FAILURE() << "Deregister waits for a transfer blocked on a full socket";
    PeerReceived();  // let the transmit side move on, so the test can end
    tx_.Pump();
  }
  EXPECT_EQ(deregistered.get(), DeregisterStatus::kOk);

  const std::size_t done_before = qp_.done.size();
  for (int round = 0; round < 10000 && qp_.errors.empty() && qp_.done.size() < 4; ++round) {
    PeerReceived();
    tx_.Pump();
  }
  EXPECT_EQ(qp_.done.size(), done_before);  // nothing more completes
  ASSERT_FALSE(qp_.errors.empty());
  if (qp_.errors[0].failed_seq.has_value()) {
    EXPECT_EQ(qp_.errors[0].failed_status, WcStatus::kLocProtErr);
  } else {
    EXPECT_TRUE(qp_.errors[0].abort);  // half an FPDU was out: the stream is cut
  }
}

// RFC 6581 7.1: the initiator of a peer-to-peer startup sends the RTR
// message it negotiated (here a zero-length Write) before anything posted.
TEST_F(TxSideTest, TheRtrMessageGoesFirst) {
  StreamParams params;
  params.rtr_role = RtrRole::kSend;
  params.rtr_message = RtrMessage::kWrite;
  Start(params);
  std::vector<std::uint8_t> data = Pattern(10, 6);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  qp_.Post(WrOver(SendOpcode::kSend, data, lkey, 1));
  tx_.Pump();

  const ParsedWire wire = PeerReceived();
  ASSERT_EQ(wire.segments.size(), 2u);
  EXPECT_EQ(wire.segments[0].decoded.header.opcode, rdmap::Opcode::kRdmaWrite);
  EXPECT_EQ(wire.segments[0].ulpdu_length, rdmap::kDdpTaggedHeaderSize);
  EXPECT_EQ(wire.segments[1].decoded.header.opcode, rdmap::Opcode::kSend);
  EXPECT_EQ(wire.segments[1].decoded.header.msn, 1u);
}

// RFC 6581 7.1: the responder sends nothing before the initiator's RTR has
// arrived (the receive side says so through RtrReceived).
TEST_F(TxSideTest, NothingGoesOutBeforeThePeersRtr) {
  qp_.rtr_received = false;
  Start();
  std::vector<std::uint8_t> data = Pattern(10, 7);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  qp_.Post(WrOver(SendOpcode::kSend, data, lkey, 1));
  tx_.Pump();
  EXPECT_TRUE(PeerReceived().segments.empty());

  qp_.rtr_received = true;
  tx_.Pump();
  EXPECT_EQ(PeerReceived().segments.size(), 1u);
}

// RFC 5040 7.1: a Terminate ends the stream's messages: it follows the FPDUs
// already framed (never cuts one) and the transmit side then sends nothing
// more of the SQ.
TEST_F(TxSideTest, ATerminateInTheMailboxIsTheLastMessage) {
  Start();
  std::vector<std::uint8_t> data = Pattern(100, 8);
  const std::uint32_t lkey = Register(data, AccessFlags::kNone);
  qp_.Post(WrOver(SendOpcode::kSend, data, lkey, 1));
  tx_.Pump();
  qp_.mail = TxMail{rdmap::MakeTerminate(rdmap::TerminateCause::RdmapUnexpectedOpcode()),
                    TxClose::kNone};
  qp_.Post(WrOver(SendOpcode::kSend, data, lkey, 2));
  tx_.Pump();

  const ParsedWire wire = PeerReceived();
  ASSERT_EQ(wire.segments.size(), 2u);
  EXPECT_EQ(wire.segments[0].decoded.header.opcode, rdmap::Opcode::kSend);
  const std::optional<rdmap::TerminateHeader> t = DecodeTerminateSegment(wire.segments[1]);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->cause, rdmap::TerminateCause::RdmapUnexpectedOpcode());
  EXPECT_EQ(qp_.done, std::vector<std::uint64_t>{0});
}

}  // namespace
}  // namespace siwx::engine
