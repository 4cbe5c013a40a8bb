// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The receive side's header checks (common/engine/rx_checks.h) without a
// socket or a QP: one test per rule, each quoting the RFC section it checks
// and asserting the exact Terminate layer/type/code (RFC 5040 4.8, RFC 5041
// 7.2) and the status of the local WR it hits.
#include "common/engine/rx_checks.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <optional>

#include "common/wire/ddp_rdmap.h"
#include "common/wire/terminate.h"

namespace siwx::engine {
namespace {

using rdmap::DdpRdmapHeader;
using rdmap::Opcode;
using rdmap::TerminateCause;

void ExpectRejects(const RxVerdict& verdict, const TerminateCause& cause) {
  ASSERT_FALSE(verdict.accepted());
  EXPECT_EQ(verdict.cause->layer, cause.layer);
  EXPECT_EQ(verdict.cause->etype, cause.etype);
  EXPECT_EQ(verdict.cause->ecode, cause.ecode);
}

DdpRdmapHeader SendHeader(std::uint32_t msn, std::uint32_t mo, bool last = true) {
  DdpRdmapHeader h = rdmap::MakeHeader(Opcode::kSend, last);
  h.msn = msn;
  h.mo = mo;
  return h;
}

DdpRdmapHeader ReadRequestHeader(std::uint32_t msn, std::uint32_t size) {
  DdpRdmapHeader h = rdmap::MakeHeader(Opcode::kRdmaReadRequest, true);
  h.msn = msn;
  rdmap::ReadRequestBody body;
  body.read_size = size;
  h.body = body;
  return h;
}

DdpRdmapHeader ResponseHeader(std::uint32_t stag, std::uint64_t to, bool last) {
  DdpRdmapHeader h = rdmap::MakeHeader(Opcode::kRdmaReadResponse, last);
  h.stag = stag;
  h.to = to;
  return h;
}

rdmap::HeaderDecodeResult Decode(const DdpRdmapHeader& h) {
  std::array<std::uint8_t, 64> raw{};
  const rdmap::EncodeResult encoded = rdmap::EncodeDdpRdmapHeader(h, raw);
  EXPECT_EQ(encoded.status, rdmap::EncodeStatus::kOk);
  return rdmap::DecodeDdpRdmapHeader(ByteSpan(raw.data(), encoded.length));
}

// ---- Every segment ----

TEST(RxChecksTest, AWellFormedHeaderIsAccepted) {
  EXPECT_TRUE(CheckDecodedHeader(Decode(SendHeader(1, 0)), false).accepted());
}

// RFC 5041 7.2: DDP "0x2 / 0x06 Invalid DDP version" for an untagged
// segment whose DV is not 1 (RFC 5041 4.1: "DV ... MUST be set to one").
TEST(RxChecksTest, InvalidDdpVersionIsAnUntaggedBufferError) {
  rdmap::HeaderDecodeResult decoded = Decode(SendHeader(1, 0));
  decoded.status = rdmap::HeaderStatus::kInvalidDdpVersion;
  decoded.header.ddp_version = 0;
  ExpectRejects(CheckDecodedHeader(decoded, false), TerminateCause::DdpUntaggedInvalidVersion());
}

// RFC 5040 4.8: "Unexpected OpCode" (RDMAP, Remote Operation Error, 0x06)
// for an RFC 7306 opcode on a stream that never negotiated RFC 7306.
TEST(RxChecksTest, AnOpcodeOutsideRfc5040IsUnexpected) {
  rdmap::HeaderDecodeResult decoded = Decode(SendHeader(1, 0));
  decoded.header.opcode = Opcode::kImmediateData;
  ExpectRejects(CheckDecodedHeader(decoded, false), TerminateCause::RdmapUnexpectedOpcode());
}

// A header cut short (the FPDU ended inside it) cannot be judged further.
TEST(RxChecksTest, ATruncatedHeaderIsRejected) {
  EXPECT_FALSE(CheckDecodedHeader(Decode(SendHeader(1, 0)), /*truncated=*/true).accepted());
}

// ---- RTR (RFC 6581 7.1) ----

constexpr unsigned kSendRtrOnly = 1u << static_cast<unsigned>(RtrMessage::kSend);

// RFC 6581 7.1: the first FPDU of the Initiator is the RTR, a zero-length
// message of the type the Responder accepted.
TEST(RxChecksTest, AZeroLengthSendRtrIsAccepted) {
  EXPECT_TRUE(CheckRtr(SendHeader(1, 0), 0, kSendRtrOnly).accepted());
}

// RFC 6581 7.1 / RFC 5044 8: anything else first is "No matching RTR
// option" (MPA layer, code 0x07), sent without header copies.
TEST(RxChecksTest, ARtrOfATypeNotAcceptedHasNoMatch) {
  DdpRdmapHeader write = rdmap::MakeHeader(Opcode::kRdmaWrite, true);
  const RxVerdict verdict = CheckRtr(write, 0, kSendRtrOnly);
  ExpectRejects(verdict, TerminateCause::MpaNoMatchingRtr());
  EXPECT_FALSE(verdict.copy_header);
}

// RFC 6581 7.1: the RTR is zero-length; a Send carrying data is not one.
TEST(RxChecksTest, ARtrWithPayloadHasNoMatch) {
  ExpectRejects(CheckRtr(SendHeader(1, 0), 4, kSendRtrOnly), TerminateCause::MpaNoMatchingRtr());
}

TEST(RxChecksTest, TheAcceptMaskDefaultsToTheAdvertisedRtrMessage) {
  StreamParams params;
  params.rtr_message = RtrMessage::kRead;
  EXPECT_EQ(AcceptedRtrMask(params), 1u << static_cast<unsigned>(RtrMessage::kRead));
  params.rtr_accept_mask = 0x3;
  EXPECT_EQ(AcceptedRtrMask(params), 0x3u);
}

// ---- Untagged QN 0: Sends ----

TEST(RxChecksTest, TheNextSendInOrderIsAccepted) {
  EXPECT_TRUE(CheckSendPosition(SendHeader(3, 0), {false, 3, 0}).accepted());
  EXPECT_TRUE(CheckSendPosition(SendHeader(3, 100, false), {true, 3, 100}).accepted());
}

// RFC 5041 7.1, untagged rule 5: "The Message Sequence Number falls in the
// range of legal Message Sequence Numbers, for the queue defined by the
// QN." Otherwise 7.2: "0x2 / 0x03 Invalid MSN - MSN range is not valid".
TEST(RxChecksTest, ASendWithTheWrongMsnIsOutOfRange) {
  ExpectRejects(CheckSendPosition(SendHeader(4, 0), {false, 3, 0}),
                TerminateCause::DdpInvalidMsnRange());
  ExpectRejects(CheckSendPosition(SendHeader(4, 100), {true, 3, 100}),
                TerminateCause::DdpInvalidMsnRange());
}

// RFC 5041 7.1, untagged rule 3: "The MO falls in the range of legal
// offsets associated with the Untagged Buffer." Segments arrive in order,
// so the legal offset is the octets placed so far. 7.2: "0x2 / 0x04
// Invalid MO".
TEST(RxChecksTest, ASendSegmentAtTheWrongOffsetHasAnInvalidMo) {
  ExpectRejects(CheckSendPosition(SendHeader(3, 8), {false, 3, 0}),
                TerminateCause::DdpInvalidMo());
  ExpectRejects(CheckSendPosition(SendHeader(3, 50), {true, 3, 100}),
                TerminateCause::DdpInvalidMo());
}

// RFC 5041 7.1, untagged rule 2: "The QN and MSN have an associated buffer
// that allows Placement of the payload." 7.2: "0x2 / 0x02 Invalid MSN - no
// buffer available".
TEST(RxChecksTest, ASendWithNoReceivePostedFindsNoBuffer) {
  ExpectRejects(CheckSendBuffer(std::nullopt, SendHeader(1, 0), 16), TerminateCause::DdpNoBuffer());
  EXPECT_TRUE(CheckSendBuffer(16, SendHeader(1, 0), 16).accepted());
}

// RFC 5041 7.1, untagged rule 4: "The sum of the DDP Segment payload
// length and the MO falls in the range of legal offsets associated with
// the Untagged Buffer." 7.2: "0x2 / 0x05 DDP Message too long for
// available buffer"; our receive WR completes with a length error.
TEST(RxChecksTest, ASendLongerThanTheReceiveBufferIsTooLong) {
  const RxVerdict verdict = CheckSendBuffer(100, SendHeader(1, 90, false), 11);
  ExpectRejects(verdict, TerminateCause::DdpMessageTooLong());
  EXPECT_EQ(verdict.recv_status, WcStatus::kLocLenErr);
}

// ---- Tagged: RDMA Write ----

TEST(RxChecksTest, AWriteToAValidTargetIsAccepted) {
  EXPECT_TRUE(CheckWriteTarget(AccessStatus::kOk).accepted());
}

// RFC 5041 7.1, tagged rule 1: "The STag is valid for this stream."
// 7.2: "0x1 / 0x00 Invalid STag". An invalidated STag is invalid.
TEST(RxChecksTest, AWriteToAnUnknownStagHasAnInvalidStag) {
  ExpectRejects(CheckWriteTarget(AccessStatus::kInvalidStag), TerminateCause::DdpInvalidStag());
  ExpectRejects(CheckWriteTarget(AccessStatus::kInvalidated), TerminateCause::DdpInvalidStag());
}

// RFC 5041 8.2 (Association of an STag and a DDP Stream): an STag of
// another Protection Domain is not placed. 7.2: "0x1 / 0x02 STag not
// associated with DDP Stream".
TEST(RxChecksTest, AWriteToAnotherPdsStagIsNotAssociated) {
  ExpectRejects(CheckWriteTarget(AccessStatus::kPdMismatch),
                TerminateCause::DdpStagNotAssociated());
}

// RFC 5041 7.1, tagged rules 3 and 4: "The TO falls in the range of legal
// offsets registered for the STag" and so does the TO plus the payload
// length. 7.2: "0x1 / 0x01 Base or bounds violation".
TEST(RxChecksTest, AWriteOutsideTheRegionIsABoundsViolation) {
  ExpectRejects(CheckWriteTarget(AccessStatus::kBaseOrBounds), TerminateCause::DdpBaseOrBounds());
}

// RFC 5041 7.1, tagged rule 5: "A 64-bit unsigned sum of the DDP Segment
// payload length and the TO does not wrap." 7.2: "0x1 / 0x03 TO wrap".
TEST(RxChecksTest, AWriteWhoseTargetWrapsIsAToWrap) {
  ExpectRejects(CheckWriteTarget(AccessStatus::kToWrap), TerminateCause::DdpToWrap());
}

// RFC 5040 4.8: DDP has no access-rights code; RDMAP's "Remote Protection
// Error / Access rights violation" (0/1/02) reports a Write to memory
// registered without remote write.
TEST(RxChecksTest, AWriteWithoutRemoteWriteRightsIsAnRdmapAccessViolation) {
  ExpectRejects(CheckWriteTarget(AccessStatus::kAccessViolation),
                TerminateCause::RdmapAccessRights());
}

// ---- Tagged: Read Response ----

constexpr ExpectedResponse kRead{/*sink_stag=*/0x100, /*sink_to=*/0x1000, /*size=*/64,
                                 /*received=*/0};

TEST(RxChecksTest, AResponseAtTheNextOffsetOfTheOldestReadIsAccepted) {
  EXPECT_TRUE(CheckReadResponse(ResponseHeader(0x100, 0x1000, false), 32, kRead).accepted());
  ExpectedResponse rest = kRead;
  rest.received = 32;
  EXPECT_TRUE(CheckReadResponse(ResponseHeader(0x100, 0x1020, true), 32, rest).accepted());
}

// RFC 5040 5.2: a Read Response answers an RDMA Read Request; one that
// answers none is "Unexpected OpCode" (RFC 5040 4.8, 0/2/06).
TEST(RxChecksTest, AResponseWithNoReadOutstandingIsUnexpected) {
  ExpectRejects(CheckReadResponse(ResponseHeader(0x100, 0x1000, true), 0, std::nullopt),
                TerminateCause::RdmapUnexpectedOpcode());
}

// RFC 5040 5.2: the Read Response goes to the Data Sink STag the Read
// Request named ("The Data Sink STag ... of the RDMA Read Request");
// another STag is "0x1 / 0x00 Invalid STag" (RFC 5041 7.2), our Read fails
// with a bad response.
TEST(RxChecksTest, AResponseToAnotherStagIsAnInvalidStag) {
  const RxVerdict verdict = CheckReadResponse(ResponseHeader(0x200, 0x1000, true), 64, kRead);
  ExpectRejects(verdict, TerminateCause::DdpInvalidStag());
  EXPECT_EQ(verdict.read_status, WcStatus::kBadRespErr);
}

// RFC 5041 7.1, tagged rules 3 and 4, against the sink of our Read: the
// segment must land at the next TO and within RDMARDSZ. 7.2: "0x1 / 0x01
// Base or bounds violation".
TEST(RxChecksTest, AResponseOutsideTheReadSinkIsABoundsViolation) {
  const RxVerdict skipped = CheckReadResponse(ResponseHeader(0x100, 0x1008, false), 8, kRead);
  ExpectRejects(skipped, TerminateCause::DdpBaseOrBounds());
  EXPECT_EQ(skipped.read_status, WcStatus::kBadRespErr);
  ExpectRejects(CheckReadResponse(ResponseHeader(0x100, 0x1000, true), 65, kRead),
                TerminateCause::DdpBaseOrBounds());
}

// RFC 5040 4.4: RDMARDSZ is "the size of the RDMA Read operation"; a
// response whose last segment (L) comes before that many octets is broken:
// RDMAP "Remote Operation Error / Unspecified Error" (0/2/FF).
TEST(RxChecksTest, AResponseThatEndsShortIsAnUnspecifiedError) {
  const RxVerdict verdict = CheckReadResponse(ResponseHeader(0x100, 0x1000, true), 32, kRead);
  ExpectRejects(verdict, TerminateCause::RdmapOperationUnspecified());
  EXPECT_EQ(verdict.read_status, WcStatus::kBadRespErr);
}

// RFC 5041 7.1 tagged rules on our own sink: a sink deregistered meanwhile
// fails our Read locally (LocProtErr) with the DDP tagged cause.
TEST(RxChecksTest, AResponseToASinkThatFailsTheLookupFailsTheReadLocally) {
  EXPECT_TRUE(CheckReadResponseTarget(AccessStatus::kOk).accepted());
  const RxVerdict verdict = CheckReadResponseTarget(AccessStatus::kInvalidated);
  ExpectRejects(verdict, TerminateCause::DdpInvalidStag());
  EXPECT_EQ(verdict.read_status, WcStatus::kLocProtErr);
}

// ---- Untagged QN 1: Read Requests ----

TEST(RxChecksTest, TheNextReadRequestIsAccepted) {
  EXPECT_TRUE(CheckReadRequest(ReadRequestHeader(2, 64), 0, 2).accepted());
  EXPECT_TRUE(CheckReadRequestBuffer(3, 4).accepted());
  EXPECT_TRUE(CheckReadSource(AccessStatus::kOk).accepted());
}

// RFC 5040 4.4: the RDMA Read Request Header follows the DDP header; a
// request without it cannot be served: "Remote Operation Error /
// Unspecified Error" (RFC 5040 4.8, 0/2/FF).
TEST(RxChecksTest, AReadRequestWithoutItsBodyIsAnUnspecifiedError) {
  DdpRdmapHeader h = ReadRequestHeader(1, 0);
  h.body = std::monostate{};
  ExpectRejects(CheckReadRequest(h, 0, 1), TerminateCause::RdmapOperationUnspecified());
}

// RFC 5040 5.2.1: "One RDMA Read Request Message MUST consume one Untagged
// Buffer" on QN 1, sized for the request; payload behind the header is
// "0x2 / 0x05 DDP Message too long for available buffer" (RFC 5041 7.2).
TEST(RxChecksTest, AReadRequestWithPayloadIsTooLong) {
  ExpectRejects(CheckReadRequest(ReadRequestHeader(1, 64), 4, 1),
                TerminateCause::DdpMessageTooLong());
}

// RFC 5041 7.1, untagged rule 5, on QN 1: "The Message Sequence Number
// falls in the range of legal Message Sequence Numbers, for the queue
// defined by the QN." 7.2: "0x2 / 0x03 Invalid MSN - MSN range is not
// valid".
TEST(RxChecksTest, AReadRequestWithTheWrongMsnIsOutOfRange) {
  ExpectRejects(CheckReadRequest(ReadRequestHeader(5, 64), 0, 2),
                TerminateCause::DdpInvalidMsnRange());
}

// RFC 5040 5.2.1: "One RDMA Read Request Message MUST consume one Untagged
// Buffer"; the Data Source has IRD of them. RFC 5041 7.1 untagged rule 2:
// "The QN and MSN have an associated buffer that allows Placement of the
// payload." 7.2: "0x2 / 0x02 Invalid MSN - no buffer available".
TEST(RxChecksTest, AReadRequestBeyondIrdFindsNoBuffer) {
  ExpectRejects(CheckReadRequestBuffer(4, 4), TerminateCause::DdpNoBuffer());
  ExpectRejects(CheckReadRequestBuffer(0, 0), TerminateCause::DdpNoBuffer());
}

// RFC 5040 4.8: a bad Data Source is an RDMAP "Remote Protection Error"
// (0/1/xx), not a DDP one: the Read Request itself is untagged.
TEST(RxChecksTest, AReadOfABadSourceIsAnRdmapProtectionError) {
  ExpectRejects(CheckReadSource(AccessStatus::kInvalidStag), TerminateCause::RdmapInvalidStag());
  ExpectRejects(CheckReadSource(AccessStatus::kInvalidated), TerminateCause::RdmapInvalidStag());
  ExpectRejects(CheckReadSource(AccessStatus::kPdMismatch),
                TerminateCause::RdmapStagNotAssociated());
  ExpectRejects(CheckReadSource(AccessStatus::kAccessViolation),
                TerminateCause::RdmapAccessRights());
  ExpectRejects(CheckReadSource(AccessStatus::kToWrap), TerminateCause::RdmapToWrap());
  ExpectRejects(CheckReadSource(AccessStatus::kBaseOrBounds), TerminateCause::RdmapBaseOrBounds());
}

}  // namespace
}  // namespace siwx::engine
