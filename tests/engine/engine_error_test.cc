// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Error paths. A raw peer sends malformed or forbidden traffic to an engine
// QP and decodes the Terminate it gets back (RFC 5040 4.8, 7; RFC 5041 7;
// RFC 5044 8). Every case checks the exact layer/type/code and header
// copies, that nothing was written outside the permitted range, the
// completions of the outstanding WRs, the async event, the QP state and
// that the engine closed the stream after the Terminate.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "engine/engine_test_util.h"

namespace siwx::engine::testing {
namespace {

using rdmap::TerminateCause;

std::vector<std::uint8_t> Encode(const rdmap::DdpRdmapHeader& h) {
  std::vector<std::uint8_t> out(128);
  const rdmap::EncodeResult r = rdmap::EncodeDdpRdmapHeader(h, out);
  EXPECT_EQ(r.status, rdmap::EncodeStatus::kOk);
  out.resize(r.length);
  return out;
}

struct ExpectedTerminate {
  TerminateCause cause;
  std::vector<std::uint8_t> ddp_copy;   // empty: no M/D
  std::uint16_t segment_length = 0;
  std::vector<std::uint8_t> rdma_copy;  // empty: no R
};

class ErrorTest : public ::testing::Test {
 protected:
  void Start(const LinkOptions& o = {}, std::size_t receives = 2) {
    link_ = std::make_unique<RawLink>(node_, o);
    for (std::size_t i = 0; i < receives; ++i) {
      ReceiveWorkRequest rwr;
      rwr.wr_id = 11 + i;
      AddSge(rwr, recv_buf_.addr(), 16, recv_key_);
      ASSERT_EQ(node_.qp->PostRecv(rwr), PostStatus::kOk);
    }
  }
  RawPeer& peer() { return *link_->peer; }

  // The Terminate arrived as specified, the engine closed its side, and the
  // QP reports it.
  void ExpectTerminated(const ExpectedTerminate& want, AsyncEventType event) {
    const std::optional<rdmap::TerminateHeader> t = peer().WaitTerminate();
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->cause, want.cause) << int{t->cause.layer} << "/" << int{t->cause.etype} << "/"
                                    << int{t->cause.ecode};
    EXPECT_EQ(t->m, !want.ddp_copy.empty());
    EXPECT_EQ(t->d, !want.ddp_copy.empty());
    EXPECT_EQ(t->r, !want.rdma_copy.empty());
    if (!want.ddp_copy.empty()) {
      EXPECT_EQ(t->ddp_segment_length, want.segment_length);
      EXPECT_EQ(std::vector<std::uint8_t>(t->DdpHeaderCopy().begin(), t->DdpHeaderCopy().end()),
                want.ddp_copy);
    }
    EXPECT_EQ(std::vector<std::uint8_t>(t->RdmaHeaderCopy().begin(), t->RdmaHeaderCopy().end()),
              want.rdma_copy);
    // Nothing follows the Terminate but FIN (RFC 5040 7.1).
    EXPECT_EQ(peer().segments().back().decoded.header.opcode, rdmap::Opcode::kTerminate);
    EXPECT_TRUE(peer().WaitEof());
    EXPECT_TRUE(node_.events.WaitFor(event));
    EXPECT_TRUE(WaitUntil([&] { return node_.qp->state() == QpState::kError; }));
    const QpAttributes a = node_.qp->Query();
    ASSERT_TRUE(a.terminate_sent.has_value());
    EXPECT_EQ(a.terminate_sent->cause, want.cause);
    EXPECT_FALSE(a.terminate_received.has_value());
  }

  // Receive WRs still posted complete with WrFlushErr, in order.
  void ExpectFlushedReceives(std::uint64_t first_id, std::size_t n) {
    const auto wc = WaitCompletions(*node_.recv_cq, n);
    ASSERT_EQ(wc.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(wc[i].wr_id, first_id + i);
      EXPECT_EQ(wc[i].status, WcStatus::kWrFlushErr);
      EXPECT_EQ(wc[i].opcode, WcOpcode::kRecv);
    }
    EXPECT_TRUE(StaysEmpty(*node_.recv_cq, std::chrono::milliseconds(5)));
  }

  Node node_;
  std::unique_ptr<RawLink> link_;
  Buffer recv_buf_{16, 0x33};
  std::uint32_t recv_key_ = recv_buf_.Register(node_.memory(), node_.pd, AccessFlags::kLocalWrite);
};

// ---- Tagged (RDMA Write) protection errors: RFC 5041 7.2, RFC 5040 4.8 ----

TEST_F(ErrorTest, WriteToInvalidStag) {
  Start();
  Buffer target(64, 0x44);
  const std::uint32_t rkey = target.Register(node_.memory(), node_.pd, kAllRemote);
  const rdmap::DdpRdmapHeader h = WriteHeader(rkey ^ 0x01, target.addr());  // wrong key
  const std::uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  peer().SendHeader(h, payload);
  ExpectTerminated({TerminateCause::DdpInvalidStag(), Encode(h), 14 + 8, {}},
                   AsyncEventType::kQpAccessError);
  ExpectFlushedReceives(11, 2);
  EXPECT_TRUE(target.GuardsIntact());
  for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(target.data()[i], 0x44);
}

TEST_F(ErrorTest, WriteToStagOfAnotherPd) {
  Start();
  const PdId other = node_.memory().AllocatePd();
  Buffer target(64, 0x44);
  const std::uint32_t rkey = target.Register(node_.memory(), other, kAllRemote);
  const rdmap::DdpRdmapHeader h = WriteHeader(rkey, target.addr());
  const std::uint8_t payload[4] = {1, 2, 3, 4};
  peer().SendHeader(h, payload);
  ExpectTerminated({TerminateCause::DdpStagNotAssociated(), Encode(h), 14 + 4, {}},
                   AsyncEventType::kQpAccessError);
  for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(target.data()[i], 0x44);
}

TEST_F(ErrorTest, WriteWithoutRemoteWriteRight) {
  Start();
  Buffer target(64, 0x44);
  const std::uint32_t rkey = target.Register(node_.memory(), node_.pd,
                                             AccessFlags::kLocalWrite | AccessFlags::kRemoteRead);
  const rdmap::DdpRdmapHeader h = WriteHeader(rkey, target.addr());
  const std::uint8_t payload[4] = {1, 2, 3, 4};
  peer().SendHeader(h, payload);
  // DDP has no access-rights code; RDMAP Remote Protection 0x02 says it.
  ExpectTerminated({TerminateCause::RdmapAccessRights(), Encode(h), 14 + 4, {}},
                   AsyncEventType::kQpAccessError);
  for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(target.data()[i], 0x44);
}

TEST_F(ErrorTest, WriteCrossingTheRegionEnd) {
  Start();
  Buffer target(64, 0x44);
  const std::uint32_t rkey = target.Register(node_.memory(), node_.pd, kAllRemote);
  const rdmap::DdpRdmapHeader h = WriteHeader(rkey, target.addr() + 60);
  const std::uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};  // 4 octets past the end
  peer().SendHeader(h, payload);
  ExpectTerminated({TerminateCause::DdpBaseOrBounds(), Encode(h), 14 + 8, {}},
                   AsyncEventType::kQpAccessError);
  EXPECT_TRUE(target.GuardsIntact());
  for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(target.data()[i], 0x44) << i;
}

TEST_F(ErrorTest, WriteWhoseToWraps) {
  Start();
  Buffer target(64, 0x44);
  const std::uint32_t rkey = target.Register(node_.memory(), node_.pd, kAllRemote);
  const rdmap::DdpRdmapHeader h = WriteHeader(rkey, 0xFFFF'FFFF'FFFF'FFFCull);
  const std::uint8_t payload[8] = {};
  peer().SendHeader(h, payload);
  ExpectTerminated({TerminateCause::DdpToWrap(), Encode(h), 14 + 8, {}},
                   AsyncEventType::kQpAccessError);
}

TEST_F(ErrorTest, WriteToInvalidatedStag) {
  Start();
  Buffer target(64, 0x44);
  const std::uint32_t rkey = target.Register(node_.memory(), node_.pd, kAllRemote);
  ASSERT_EQ(node_.memory().InvalidateLocal(rkey, node_.pd), InvalidateStatus::kOk);
  const rdmap::DdpRdmapHeader h = WriteHeader(rkey, target.addr());
  const std::uint8_t payload[4] = {1, 2, 3, 4};
  peer().SendHeader(h, payload);
  ExpectTerminated({TerminateCause::DdpInvalidStag(), Encode(h), 14 + 4, {}},
                   AsyncEventType::kQpAccessError);
  for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(target.data()[i], 0x44);
}

TEST_F(ErrorTest, SecondSegmentOutOfBoundsLeavesTheFirstAndNothingElse) {
  Start();
  Buffer target(64, 0x44);
  const std::uint32_t rkey = target.Register(node_.memory(), node_.pd, kAllRemote);
  const std::uint8_t first[32] = {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
                                  7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
  peer().SendHeader(WriteHeader(rkey, target.addr(), false), first);
  const rdmap::DdpRdmapHeader h = WriteHeader(rkey, target.addr() + 32);
  std::vector<std::uint8_t> second(40, 9);  // 8 past the end
  peer().SendHeader(h, second);
  ExpectTerminated({TerminateCause::DdpBaseOrBounds(), Encode(h), 14 + 40, {}},
                   AsyncEventType::kQpAccessError);
  for (std::size_t i = 0; i < 32; ++i) ASSERT_EQ(target.data()[i], 7) << i;
  for (std::size_t i = 32; i < 64; ++i) ASSERT_EQ(target.data()[i], 0x44) << i;
  EXPECT_TRUE(target.GuardsIntact());
}

// ---- Untagged (Send) errors: RFC 5041 7.2 ----

TEST_F(ErrorTest, SendWithNoReceivePosted) {
  Start({}, 0);
  const rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0);
  const std::uint8_t payload[4] = {1, 2, 3, 4};
  peer().SendHeader(h, payload);
  ExpectTerminated({TerminateCause::DdpNoBuffer(), Encode(h), 18 + 4, {}},
                   AsyncEventType::kQpRequestError);
  EXPECT_TRUE(StaysEmpty(*node_.recv_cq, std::chrono::milliseconds(10)));
}

TEST_F(ErrorTest, SendTooLongForTheReceive) {
  Start();  // receives of 16 octets
  const rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0);
  std::vector<std::uint8_t> payload(20, 0x99);
  peer().SendHeader(h, payload);
  ExpectTerminated({TerminateCause::DdpMessageTooLong(), Encode(h), 18 + 20, {}},
                   AsyncEventType::kQpRequestError);
  const auto wc = WaitCompletions(*node_.recv_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 11u);
  EXPECT_EQ(wc[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(wc[1].wr_id, 12u);
  EXPECT_EQ(wc[1].status, WcStatus::kWrFlushErr);
  for (std::size_t i = 0; i < 16; ++i) ASSERT_EQ(recv_buf_.data()[i], 0x33);  // nothing placed
  EXPECT_TRUE(recv_buf_.GuardsIntact());
}

TEST_F(ErrorTest, SendSecondSegmentTooLong) {
  Start();
  const std::uint8_t first[10] = {5, 5, 5, 5, 5, 5, 5, 5, 5, 5};
  peer().SendHeader(SendHeaderOf(1, 0, false), first);
  const rdmap::DdpRdmapHeader h = SendHeaderOf(1, 10);
  const std::uint8_t second[10] = {6, 6, 6, 6, 6, 6, 6, 6, 6, 6};  // 20 > 16
  peer().SendHeader(h, second);
  ExpectTerminated({TerminateCause::DdpMessageTooLong(), Encode(h), 18 + 10, {}},
                   AsyncEventType::kQpRequestError);
  const auto wc = WaitCompletions(*node_.recv_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(wc[1].status, WcStatus::kWrFlushErr);
  for (std::size_t i = 0; i < 10; ++i) ASSERT_EQ(recv_buf_.data()[i], 5);
  for (std::size_t i = 10; i < 16; ++i) ASSERT_EQ(recv_buf_.data()[i], 0x33);
}

TEST_F(ErrorTest, SendWithWrongMsn) {
  Start();
  const rdmap::DdpRdmapHeader h = SendHeaderOf(2, 0);  // expected MSN 1
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::DdpInvalidMsnRange(), Encode(h), 18, {}},
                   AsyncEventType::kQpRequestError);
  ExpectFlushedReceives(11, 2);
}

TEST_F(ErrorTest, SendWithWrongMo) {
  Start();
  const std::uint8_t first[4] = {1, 2, 3, 4};
  peer().SendHeader(SendHeaderOf(1, 0, false), first);
  const rdmap::DdpRdmapHeader h = SendHeaderOf(1, 8);  // expected MO 4
  peer().SendHeader(h, first);
  ExpectTerminated({TerminateCause::DdpInvalidMo(), Encode(h), 18 + 4, {}},
                   AsyncEventType::kQpRequestError);
  ExpectFlushedReceives(11, 2);  // the one in progress flushes too
}

TEST_F(ErrorTest, SendWithInvalidateOfUnknownStag) {
  Start();
  rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0, true, rdmap::Opcode::kSendWithInvalidate);
  h.invalidate_stag = 0x00FFFF01;  // no such region
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::RdmapStagCannotBeInvalidated(), Encode(h), 18, {}},
                   AsyncEventType::kQpAccessError);
  const auto wc = WaitCompletions(*node_.recv_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, WcStatus::kRemInvReqErr);
  EXPECT_EQ(wc[1].status, WcStatus::kWrFlushErr);
}

TEST_F(ErrorTest, SendWithInvalidateOfLocalOnlyStag) {
  Start();
  Buffer local(16);
  const std::uint32_t key = local.Register(node_.memory(), node_.pd, AccessFlags::kLocalWrite);
  rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0, true, rdmap::Opcode::kSendWithSeAndInvalidate);
  h.invalidate_stag = key;  // no remote right: cannot be invalidated remotely (RFC 5042 6.4.5)
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::RdmapStagCannotBeInvalidated(), Encode(h), 18, {}},
                   AsyncEventType::kQpAccessError);
  EXPECT_TRUE(node_.memory().Check(key, node_.pd, AccessKind::kLocalWrite, local.addr(), 1).ok());
}

// ---- Registered memory the application made read-only ----

// Registration refuses write access to read-only memory (verbs pd_mr), but
// the application may mprotect a region after registering it. A Write whose
// payload is received straight into that memory (a payload of at least
// QpRx::kDirectPlacementMin octets; smaller ones are copied from the staging
// buffer and fault like the application's own store, rx.h) must not crash
// the process: recvmsg fails with EFAULT, nothing is placed, and the stream
// ends as a local protection error with a DDP Local Catastrophic Terminate
// (no header copy, RFC 5040 Figure 10) and the QP's access error event.
TEST_F(ErrorTest, WriteIntoMemoryMadeReadOnlyEndsTheStreamWithoutAFault) {
  Start();
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t payload_size = (QpRx::kDirectPlacementMin + page - 1) / page * page;
  const std::size_t mapped = payload_size + page;
  void* mem = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  const auto addr = reinterpret_cast<std::uintptr_t>(mem);
  const RegisterResult reg = node_.memory().Register(node_.pd, addr, mapped, addr, kAllRemote);
  ASSERT_EQ(reg.status, RegisterStatus::kOk);
  ASSERT_EQ(mprotect(mem, mapped, PROT_READ), 0);

  // The framing first, and the payload only once the engine has read it, so
  // the payload is received straight into the target.
  const std::vector<std::uint8_t> payload(payload_size, 0x5A);
  std::vector<std::uint8_t> wire;
  peer().FrameTo(WriteHeader(reg.stag, addr + 16), payload, wire);
  const std::size_t framing = mpa::kUlpduLengthSize + rdmap::kDdpTaggedHeaderSize;
  const std::uint64_t before = node_.qp->Counters().rx_octets;
  peer().WriteAll(ByteSpan(wire.data(), framing));
  ASSERT_TRUE(WaitUntil([&] { return node_.qp->Counters().rx_octets >= before + framing; }));
  peer().WriteAll(ByteSpan(wire.data() + framing, wire.size() - framing));

  ExpectTerminated({TerminateCause::DdpLocalCatastrophic(), {}, 0, {}},
                   AsyncEventType::kQpAccessError);
  const auto* bytes = static_cast<const std::uint8_t*>(mem);
  EXPECT_TRUE(std::all_of(bytes, bytes + mapped, [](std::uint8_t b) { return b == 0; }));
  EXPECT_EQ(node_.memory().Deregister(reg.stag), DeregisterStatus::kOk);
  EXPECT_EQ(munmap(mem, mapped), 0);
}

// ---- Read Request errors: RFC 5040 4.8 Remote Protection, with R copies ----

class ReadRequestErrorTest : public ErrorTest {
 protected:
  void ExpectReadRefused(const rdmap::ReadRequestBody& body, TerminateCause cause) {
    const rdmap::DdpRdmapHeader h = ReadRequestOf(1, body);
    peer().SendHeader(h);
    const std::vector<std::uint8_t> all = Encode(h);
    ExpectTerminated({cause, std::vector<std::uint8_t>(all.begin(), all.begin() + 18), 46,
                      std::vector<std::uint8_t>(all.begin() + 18, all.end())},
                     AsyncEventType::kQpAccessError);
  }
};

TEST_F(ReadRequestErrorTest, InvalidSourceStag) {
  Start();
  rdmap::ReadRequestBody body{0x100, 0x2000, 16, 0x00ABCD01, 0x3000};
  ExpectReadRefused(body, TerminateCause::RdmapInvalidStag());
}

TEST_F(ReadRequestErrorTest, SourceWithoutRemoteRead) {
  Start();
  Buffer src(32);
  const std::uint32_t key = src.Register(node_.memory(), node_.pd,
                                         AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite);
  rdmap::ReadRequestBody body{0x100, 0x2000, 16, key, src.addr()};
  ExpectReadRefused(body, TerminateCause::RdmapAccessRights());
}

TEST_F(ReadRequestErrorTest, SourceOutOfBounds) {
  Start();
  Buffer src(32);
  const std::uint32_t key = src.Register(node_.memory(), node_.pd, kAllRemote);
  rdmap::ReadRequestBody body{0x100, 0x2000, 16, key, src.addr() + 20};
  ExpectReadRefused(body, TerminateCause::RdmapBaseOrBounds());
}

TEST_F(ReadRequestErrorTest, SourceInAnotherPd) {
  Start();
  Buffer src(32);
  const std::uint32_t key = src.Register(node_.memory(), node_.memory().AllocatePd(), kAllRemote);
  rdmap::ReadRequestBody body{0x100, 0x2000, 16, key, src.addr()};
  ExpectReadRefused(body, TerminateCause::RdmapStagNotAssociated());
}

TEST_F(ErrorTest, ReadRequestBeyondIrd) {
  LinkOptions o;
  o.ird = 1;
  Start(o);
  // The first response (4 MiB) cannot leave while the peer does not read,
  // so the first request stays outstanding when the second arrives.
  Buffer src(4 << 20);
  const std::uint32_t key = src.Register(node_.memory(), node_.pd, kAllRemote);
  rdmap::ReadRequestBody body{0x100, 0x2000, 4u << 20, key, src.addr()};
  peer().SendHeader(ReadRequestOf(1, body));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  body.read_size = 8;
  const rdmap::DdpRdmapHeader second = ReadRequestOf(2, body);
  peer().SendHeader(second);
  const std::vector<std::uint8_t> all = Encode(second);
  // A DDP error: header copy, no RDMA header copy (RFC 5040 Figure 10).
  ExpectTerminated({TerminateCause::DdpNoBuffer(), std::vector<std::uint8_t>(all.begin(), all.begin() + 18),
                    46, {}},
                   AsyncEventType::kQpRequestError);
}

// RFC 5040 5.2.1: "One RDMA Read Request Message MUST consume one Untagged
// Buffer." 5.2.2: "The Data Source MUST ensure that a sufficient number of
// Untagged Buffers are available on the RDMA Read Request Queue (Queue with
// DDP Queue Number 1) to support the maximum number of RDMA Read Requests
// negotiated by the ULP." A request beyond the IRD finds no QN 1 buffer: the
// DDP Untagged Buffer error "Invalid MSN - no buffer available" (1/2/1,
// RFC 5041 7.2; Linux siw answers an IRQ overflow the same way), checked
// like every Untagged DDP Segment field (RFC 5040 7.2 rule 1). A request is
// outstanding until the last octet of its response went to the kernel, so
// small requests that arrive together cannot free each other's slot.
TEST_F(ErrorTest, BackToBackSmallReadRequestsBeyondIrd) {
  LinkOptions o;
  o.ird = 1;
  Start(o);
  Buffer src(8);
  src.Fill(7);
  const std::uint32_t key = src.Register(node_.memory(), node_.pd, kAllRemote);
  std::vector<std::uint8_t> wire;
  std::vector<std::uint8_t> second;
  for (std::uint32_t msn = 1; msn <= 64; ++msn) {
    const rdmap::DdpRdmapHeader h =
        ReadRequestOf(msn, rdmap::ReadRequestBody{0x100, 0x2000 + 8 * msn, 8, key, src.addr()});
    if (msn == 2) second = Encode(h);
    peer().FrameTo(h, {}, wire);
  }
  peer().WriteAll(wire);  // all 64 in one write
  ExpectTerminated({TerminateCause::DdpNoBuffer(),
                    std::vector<std::uint8_t>(second.begin(), second.begin() + 18), 46, {}},
                   AsyncEventType::kQpRequestError);
  std::size_t responses = 0;
  for (const WireSegment& seg : peer().segments()) {
    if (seg.decoded.header.opcode == rdmap::Opcode::kRdmaReadResponse) ++responses;
  }
  EXPECT_LE(responses, o.ird);
}

// The other side of the same rule: a peer that keeps IRD requests in flight
// and sends the next one the moment a response has arrived is served
// without a Terminate, every response in request order with the right data.
TEST_F(ErrorTest, ReadRequestsPipelinedUpToIrdAreServed) {
  constexpr std::uint32_t kIrd = 8;
  constexpr std::uint32_t kReads = 600;
  LinkOptions o;
  o.ird = kIrd;
  o.ord = kIrd;
  Start(o);
  Buffer src(64);
  src.Fill(9);
  const std::uint32_t key = src.Register(node_.memory(), node_.pd, kAllRemote);
  auto request = [&](std::uint32_t msn) {
    const std::uint32_t i = msn - 1;
    return ReadRequestOf(msn, rdmap::ReadRequestBody{0x700, 0x10000 + 8ull * i, 8, key,
                                                     src.addr() + 8 * (i % 8)});
  };
  std::vector<std::uint8_t> window;
  for (std::uint32_t msn = 1; msn <= kIrd; ++msn) peer().FrameTo(request(msn), {}, window);
  peer().WriteAll(window);  // IRD requests at once: allowed
  for (std::uint32_t next = kIrd + 1, got = 0; got < kReads; ++got) {
    ASSERT_TRUE(peer().WaitSegments(got + 1)) << "response " << got;
    const WireSegment& seg = peer().segments()[got];
    ASSERT_EQ(seg.decoded.header.opcode, rdmap::Opcode::kRdmaReadResponse) << "segment " << got;
    EXPECT_EQ(seg.decoded.header.to, 0x10000 + 8ull * got);
    ASSERT_EQ(seg.payload.size(), 8u);
    EXPECT_TRUE(SameBytes(seg.payload.data(), src.data() + 8 * (got % 8), 8));
    if (next <= kReads) peer().SendHeader(request(next++));  // one slot freed: refill it
  }
  EXPECT_FALSE(peer().WaitEof(std::chrono::milliseconds(50)));
  EXPECT_EQ(node_.qp->state(), QpState::kRts);
  EXPECT_FALSE(node_.qp->Query().terminate_sent.has_value());
}

TEST_F(ErrorTest, ReadRequestWithWrongMsn) {
  Start();
  rdmap::ReadRequestBody body{0x100, 0x2000, 0, 0, 0};
  const rdmap::DdpRdmapHeader h = ReadRequestOf(3, body);
  peer().SendHeader(h);
  const std::vector<std::uint8_t> all = Encode(h);
  ExpectTerminated({TerminateCause::DdpInvalidMsnRange(),
                    std::vector<std::uint8_t>(all.begin(), all.begin() + 18), 46, {}},
                   AsyncEventType::kQpRequestError);
}

TEST_F(ErrorTest, ReadResponseWithoutRequest) {
  Start();
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kRdmaReadResponse, true);
  h.stag = 0x1234;
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::RdmapUnexpectedOpcode(), Encode(h), 14, {}},
                   AsyncEventType::kQpRequestError);
}

// ---- Header errors: RFC 5041 4.1, RFC 5040 4.1 ----

TEST_F(ErrorTest, BadDdpVersionUntagged) {
  Start();
  rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0);
  h.ddp_version = 2;
  peer().SendHeader(h);
  // The offending header has an unknown layout: no copy.
  ExpectTerminated({TerminateCause::DdpUntaggedInvalidVersion(), {}, 0, {}},
                   AsyncEventType::kQpRequestError);
}

TEST_F(ErrorTest, BadDdpVersionTagged) {
  Start();
  rdmap::DdpRdmapHeader h = WriteHeader(0x100, 0);
  h.ddp_version = 0;
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::DdpTaggedInvalidVersion(), {}, 0, {}},
                   AsyncEventType::kQpAccessError);
}

TEST_F(ErrorTest, BadRdmapVersion) {
  Start();
  rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0);
  h.rdmap_version = 0;  // the RDMA Consortium version: not spoken (RFC 5040 4.1)
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::RdmapInvalidVersion(), Encode(h), 18, {}},
                   AsyncEventType::kQpRequestError);
}

TEST_F(ErrorTest, UnassignedOpcode) {
  Start();
  rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0);
  h.opcode = static_cast<rdmap::Opcode>(0xC);
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::RdmapUnexpectedOpcode(), Encode(h), 18, {}},
                   AsyncEventType::kQpRequestError);
}

TEST_F(ErrorTest, Rfc7306AtomicRequestIsRecognisedAndRefused) {
  Start();
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kAtomicRequest, true);
  h.msn = 1;
  peer().SendHeader(h);
  const std::vector<std::uint8_t> all = Encode(h);
  ExpectTerminated({TerminateCause::RdmapUnexpectedOpcode(),
                    std::vector<std::uint8_t>(all.begin(), all.begin() + 18),
                    static_cast<std::uint16_t>(all.size()), {}},
                   AsyncEventType::kQpRequestError);
}

TEST_F(ErrorTest, Rfc7306ImmediateDataIsRefused) {
  Start();
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kImmediateData, true);
  h.msn = 1;
  peer().SendHeader(h);
  const std::vector<std::uint8_t> all = Encode(h);
  ExpectTerminated({TerminateCause::RdmapUnexpectedOpcode(),
                    std::vector<std::uint8_t>(all.begin(), all.begin() + 18),
                    static_cast<std::uint16_t>(all.size()), {}},
                   AsyncEventType::kQpRequestError);
}

TEST_F(ErrorTest, UntaggedQueueNumberOutOfRange) {
  Start();
  rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0);
  h.qn = 7;
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::DdpInvalidQn(), Encode(h), 18, {}},
                   AsyncEventType::kQpRequestError);
}

TEST_F(ErrorTest, SendOnReadRequestQueue) {
  Start();
  rdmap::DdpRdmapHeader h = SendHeaderOf(1, 0);
  h.qn = rdmap::kQnReadRequest;
  peer().SendHeader(h);
  ExpectTerminated({TerminateCause::DdpInvalidQn(), Encode(h), 18, {}},
                   AsyncEventType::kQpRequestError);
}

TEST_F(ErrorTest, TruncatedUlpdu) {
  Start();
  // ULPDU_Length 10 claims a tagged header of 14: RDMAP Unspecified, no copy.
  const std::uint8_t ulpdu[10] = {0xC1, 0x40, 0, 0, 1, 0, 0, 0, 0, 0};
  peer().SendUlpdu(ulpdu);
  ExpectTerminated({TerminateCause::RdmapOperationUnspecified(), {}, 0, {}},
                   AsyncEventType::kQpRequestError);
}

// ---- LLP errors: RFC 5044 8 ----

TEST_F(ErrorTest, CrcMismatch) {
  LinkOptions o;
  o.crc = true;
  Start(o);
  Buffer target(64, 0x44);
  const std::uint32_t rkey = target.Register(node_.memory(), node_.pd, kAllRemote);
  std::array<std::uint8_t, 64> hb{};
  const rdmap::EncodeResult r = rdmap::EncodeDdpRdmapHeader(WriteHeader(rkey, target.addr()), hb);
  const std::uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  mpa::FpduFrame frame;
  const std::array<ByteSpan, 1> pieces{ByteSpan(payload)};
  ASSERT_EQ(peer().framer().Frame(ByteSpan(hb.data(), r.length), pieces, frame), mpa::FrameStatus::kOk);
  std::vector<std::uint8_t> wire;
  for (const mpa::IoSlice& s : frame.slices()) wire.insert(wire.end(), s.base, s.base + s.len);
  wire[2 + 14 + 3] ^= 0x10;  // one payload bit
  peer().WriteAll(wire);
  ExpectTerminated({TerminateCause::MpaCrcMismatch(), {}, 0, {}}, AsyncEventType::kQpFatal);
  // Placed before the CRC was known, but only inside the validated range.
  EXPECT_TRUE(target.GuardsIntact());
  ExpectFlushedReceives(11, 2);
}

TEST_F(ErrorTest, MarkerMismatch) {
  LinkOptions o;
  o.markers = true;
  Start(o);
  // The stream opens with the special marker 0 at grid offset 0; corrupt it.
  std::array<std::uint8_t, 64> hb{};
  const rdmap::EncodeResult r = rdmap::EncodeDdpRdmapHeader(SendHeaderOf(1, 0), hb);
  mpa::FpduFrame frame;
  ASSERT_EQ(peer().framer().Frame(ByteSpan(hb.data(), r.length), {}, frame), mpa::FrameStatus::kOk);
  std::vector<std::uint8_t> wire;
  for (const mpa::IoSlice& s : frame.slices()) wire.insert(wire.end(), s.base, s.base + s.len);
  wire[3] = 0x08;  // FPDUPTR 8 instead of 0
  peer().WriteAll(wire);
  ExpectTerminated({TerminateCause::MpaMarkerMismatch(), {}, 0, {}}, AsyncEventType::kQpFatal);
}

TEST_F(ErrorTest, PeerFinInsideAMessage) {
  Start();
  const std::uint8_t first[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  peer().SendHeader(SendHeaderOf(1, 0, false), first);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  shutdown(peer().fd(), SHUT_WR);
  ExpectTerminated({TerminateCause::MpaConnectionLost(), {}, 0, {}}, AsyncEventType::kQpFatal);
  ExpectFlushedReceives(11, 2);  // the one in progress, then the other
}

TEST_F(ErrorTest, PeerFinInsideAnFpdu) {
  Start();
  const std::uint8_t partial[6] = {0x00, 0x16, 0x41, 0x43, 0, 0};  // 6 of 28 octets
  peer().WriteAll(partial);
  shutdown(peer().fd(), SHUT_WR);
  ExpectTerminated({TerminateCause::MpaConnectionLost(), {}, 0, {}}, AsyncEventType::kQpFatal);
}

TEST_F(ErrorTest, PeerResetInsideAMessage) {
  // TCP: an AF_UNIX peer's abortive close reads as a plain EOF.
  link_ = std::make_unique<RawLink>(node_, LinkOptions{}, Transport::kTcp);
  for (std::uint64_t id = 11; id <= 12; ++id) {
    ReceiveWorkRequest rwr;
    rwr.wr_id = id;
    AddSge(rwr, recv_buf_.addr(), 16, recv_key_);
    ASSERT_EQ(node_.qp->PostRecv(rwr), PostStatus::kOk);
  }
  SendWorkRequest wr = MakeSend(21, SendOpcode::kRdmaRead);
  wr.rkey = 0x100;
  ASSERT_EQ(node_.qp->PostSend(wr), PostStatus::kOk);  // outstanding Read
  ASSERT_TRUE(peer().WaitSegments(1));
  const std::uint8_t first[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  peer().SendHeader(SendHeaderOf(1, 0, false), first);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  linger l{1, 0};
  setsockopt(peer().fd(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  link_->peer.reset();  // close with RST
  EXPECT_TRUE(node_.events.WaitFor(AsyncEventType::kQpFatal));
  EXPECT_TRUE(WaitUntil([&] { return node_.qp->state() == QpState::kError; }));
  const QpAttributes a = node_.qp->Query();
  EXPECT_FALSE(a.terminate_sent.has_value());
  ASSERT_TRUE(a.local_error.has_value());
  EXPECT_EQ(*a.local_error, TerminateCause::MpaConnectionLost());
  ExpectFlushedReceives(11, 2);
  const auto sq = WaitCompletions(*node_.send_cq, 1);
  ASSERT_EQ(sq.size(), 1u);
  EXPECT_EQ(sq[0].wr_id, 21u);
  EXPECT_EQ(sq[0].status, WcStatus::kWrFlushErr);
}

TEST_F(ErrorTest, PeerCloseAtMessageBoundaryIsOrderly) {
  Start();
  const std::uint8_t payload[4] = {4, 3, 2, 1};
  peer().SendHeader(SendHeaderOf(1, 0), payload);
  shutdown(peer().fd(), SHUT_WR);
  const auto wc = WaitCompletions(*node_.recv_cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 11u);
  EXPECT_EQ(wc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(wc[0].byte_len, 4u);
  EXPECT_EQ(wc[1].wr_id, 12u);
  EXPECT_EQ(wc[1].status, WcStatus::kWrFlushErr);
  EXPECT_TRUE(peer().WaitEof());
  EXPECT_FALSE(peer().WaitTerminate(std::chrono::milliseconds(1)).has_value());
  EXPECT_TRUE(node_.events.WaitFor(AsyncEventType::kStreamClosed));
  EXPECT_FALSE(node_.events.Has(AsyncEventType::kQpFatal));
  EXPECT_TRUE(WaitUntil([&] { return node_.qp->state() == QpState::kError; }));
  EXPECT_FALSE(node_.qp->Query().terminate_sent.has_value());
}

// ---- RTR (RFC 6581 7.1) ----

TEST_F(ErrorTest, WrongFirstMessageWhileAwaitingRtr) {
  StreamParams p;
  p.rtr_role = RtrRole::kAwait;
  p.rtr_message = RtrMessage::kWrite;
  link_ = std::make_unique<RawLink>(node_, LinkOptions{}, Transport::kSocketPair, p, true);
  ReceiveWorkRequest rwr;
  rwr.wr_id = 11;
  ASSERT_EQ(node_.qp->PostRecv(rwr), PostStatus::kOk);
  peer().SendHeader(SendHeaderOf(1, 0));  // a Send, not the Write RTR
  ExpectTerminated({TerminateCause::MpaNoMatchingRtr(), {}, 0, {}}, AsyncEventType::kQpFatal);
  ExpectFlushedReceives(11, 1);
}

// A type the Reply did not advertise is still refused (RFC 6581 9.2).
TEST_F(ErrorTest, RtrOfATypeNotAdvertised) {
  StreamParams p;
  p.rtr_role = RtrRole::kAwait;
  p.rtr_message = RtrMessage::kWrite;
  p.rtr_accept_mask = (1u << static_cast<unsigned>(RtrMessage::kWrite)) |
                      (1u << static_cast<unsigned>(RtrMessage::kRead));
  link_ = std::make_unique<RawLink>(node_, LinkOptions{}, Transport::kSocketPair, p, true);
  peer().SendHeader(SendHeaderOf(1, 0));  // a zero-length Send RTR: not advertised
  ExpectTerminated({TerminateCause::MpaNoMatchingRtr(), {}, 0, {}}, AsyncEventType::kQpFatal);
}

// ---- The peer's Terminate ----

TEST_F(ErrorTest, ReceivedTerminateFailsTheReadItNamesAndFlushesTheRest) {
  Start();
  Buffer sink(8);
  const std::uint32_t key = sink.Register(node_.memory(), node_.pd, kAllRemote);
  SendWorkRequest read = MakeSend(31, SendOpcode::kRdmaRead);
  AddSge(read, sink.addr(), 8, key);
  read.rkey = 0x900;
  ASSERT_EQ(node_.qp->PostSend(read), PostStatus::kOk);
  SendWorkRequest write = MakeSend(32, SendOpcode::kRdmaWrite);
  write.rkey = 0x901;
  ASSERT_EQ(node_.qp->PostSend(write), PostStatus::kOk);
  ASSERT_TRUE(peer().WaitSegments(2));
  // The peer refuses the Read Request with an RDMAP Remote Protection error
  // and copies of our headers.
  const WireSegment& req = peer().segments()[0];
  const rdmap::TerminateHeader t = rdmap::MakeTerminateForSegment(
      TerminateCause::RdmapInvalidStag(), req.header, req.ulpdu_length);
  ASSERT_TRUE(t.r);
  std::array<std::uint8_t, 128> buf{};
  const rdmap::EncodeResult r = rdmap::EncodeTerminateMessage(t, 1, buf);
  ASSERT_EQ(r.status, rdmap::EncodeStatus::kOk);
  peer().SendUlpdu(ByteSpan(buf.data(), r.length));

  const auto sq = WaitCompletions(*node_.send_cq, 2);
  ASSERT_EQ(sq.size(), 2u);
  EXPECT_EQ(sq[0].wr_id, 31u);
  EXPECT_EQ(sq[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(sq[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(sq[1].wr_id, 32u);
  EXPECT_EQ(sq[1].status, WcStatus::kWrFlushErr);
  ExpectFlushedReceives(11, 2);
  EXPECT_TRUE(node_.events.WaitFor(AsyncEventType::kQpFatal));
  EXPECT_TRUE(WaitUntil([&] { return node_.qp->state() == QpState::kError; }));
  const QpAttributes a = node_.qp->Query();
  ASSERT_TRUE(a.terminate_received.has_value());
  EXPECT_EQ(a.terminate_received->cause, TerminateCause::RdmapInvalidStag());
  EXPECT_TRUE(a.terminate_received->r);
  EXPECT_FALSE(a.terminate_sent.has_value());
  // No Terminate answers a Terminate; the engine just closes.
  EXPECT_TRUE(peer().WaitEof());
  EXPECT_EQ(peer().segments().size(), 2u);
}

TEST_F(ErrorTest, TerminateInLinuxSiwLayoutIsUnderstood) {
  Start();
  Buffer sink(8);
  const std::uint32_t key = sink.Register(node_.memory(), node_.pd, kAllRemote);
  SendWorkRequest read = MakeSend(31, SendOpcode::kRdmaRead);
  AddSge(read, sink.addr(), 8, key);
  read.rkey = 0x900;
  ASSERT_EQ(node_.qp->PostSend(read), PostStatus::kOk);
  ASSERT_TRUE(peer().WaitSegments(1));
  const WireSegment& req = peer().segments()[0];
  // siw's little-endian bitfields: EType in the high nibble, Layer in the
  // low one; M/D/R as 0x01/0x02/0x04 of octet 2 (terminate.h).
  std::vector<std::uint8_t> body = {
      0x10,        // EType 1 (Remote Protection) | Layer 0 (RDMAP), swapped
      0x00,        // ECode 0: Invalid STag
      0x07, 0x00,  // M, D, R in siw's positions
      0x00, 0x2E,  // DDP Segment Length 46
  };
  body.insert(body.end(), req.header.begin(), req.header.end());  // 18 + 28 octets of copies
  rdmap::DdpRdmapHeader h = rdmap::MakeHeader(rdmap::Opcode::kTerminate, true);
  h.msn = 1;
  std::array<std::uint8_t, 64> hb{};
  const rdmap::EncodeResult r = rdmap::EncodeDdpRdmapHeader(h, hb);
  ASSERT_EQ(r.status, rdmap::EncodeStatus::kOk);
  // The encoded header ends with a zero control field; siw's goes in its place.
  std::vector<std::uint8_t> ulpdu(hb.begin(), hb.begin() + rdmap::kDdpUntaggedHeaderSize);
  ulpdu.insert(ulpdu.end(), body.begin(), body.end());
  peer().SendUlpdu(ulpdu);
  const auto sq = WaitCompletions(*node_.send_cq, 1);
  ASSERT_EQ(sq.size(), 1u);
  EXPECT_EQ(sq[0].wr_id, 31u);
  EXPECT_EQ(sq[0].status, WcStatus::kRemAccessErr);
  ASSERT_TRUE(WaitUntil([&] { return node_.qp->Query().terminate_received.has_value(); }));
  EXPECT_EQ(node_.qp->Query().terminate_received->cause, TerminateCause::RdmapInvalidStag());
}

TEST_F(ErrorTest, PostsAfterTheErrorAreFlushedInOrder) {
  Start({}, 0);
  peer().SendHeader(SendHeaderOf(1, 0));  // no receive posted
  ASSERT_TRUE(peer().WaitTerminate().has_value());
  ASSERT_TRUE(WaitUntil([&] { return node_.qp->state() == QpState::kError; }));
  ASSERT_EQ(node_.qp->PostSend(MakeSend(41, SendOpcode::kSend, 0)), PostStatus::kOk);
  ASSERT_EQ(node_.qp->PostSend(MakeSend(42, SendOpcode::kRdmaWrite, 0)), PostStatus::kOk);
  const auto sq = WaitCompletions(*node_.send_cq, 2);
  ASSERT_EQ(sq.size(), 2u);
  EXPECT_EQ(sq[0].wr_id, 41u);
  EXPECT_EQ(sq[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(sq[1].wr_id, 42u);
  EXPECT_EQ(sq[1].status, WcStatus::kWrFlushErr);
  ReceiveWorkRequest rwr;
  rwr.wr_id = 43;
  ASSERT_EQ(node_.qp->PostRecv(rwr), PostStatus::kOk);
  const auto rq = WaitCompletions(*node_.recv_cq, 1);
  ASSERT_EQ(rq.size(), 1u);
  EXPECT_EQ(rq[0].wr_id, 43u);
  EXPECT_EQ(rq[0].status, WcStatus::kWrFlushErr);
}

}  // namespace
}  // namespace siwx::engine::testing
