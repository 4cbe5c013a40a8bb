// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Terminate messages (RFC 5040 4.8, 5.4, 7) and the error triples of RFC 5040
// Figure 9, RFC 5041 7.2, RFC 5044 8 and RFC 6581 8.
#include "common/wire/terminate.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace siwx::rdmap {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes Concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---- The code table, checked against the RFC numbers ----

TEST(TerminateCause, RdmapCodesAreRfc5040Figure9) {
  // Layer 0000b RDMA; EType 0000b Local Catastrophic has no code.
  EXPECT_EQ(TerminateCause::RdmapLocalCatastrophic(), (TerminateCause{0x0, 0x0, 0x00}));
  // EType 0001b Remote Protection Error.
  EXPECT_EQ(TerminateCause::RdmapInvalidStag(), (TerminateCause{0x0, 0x1, 0x00}));
  EXPECT_EQ(TerminateCause::RdmapBaseOrBounds(), (TerminateCause{0x0, 0x1, 0x01}));
  EXPECT_EQ(TerminateCause::RdmapAccessRights(), (TerminateCause{0x0, 0x1, 0x02}));
  EXPECT_EQ(TerminateCause::RdmapStagNotAssociated(), (TerminateCause{0x0, 0x1, 0x03}));
  EXPECT_EQ(TerminateCause::RdmapToWrap(), (TerminateCause{0x0, 0x1, 0x04}));
  EXPECT_EQ(TerminateCause::RdmapStagCannotBeInvalidated(), (TerminateCause{0x0, 0x1, 0x09}));
  EXPECT_EQ(TerminateCause::RdmapProtectionUnspecified(), (TerminateCause{0x0, 0x1, 0xFF}));
  // EType 0010b Remote Operation Error.
  EXPECT_EQ(TerminateCause::RdmapInvalidVersion(), (TerminateCause{0x0, 0x2, 0x05}));
  EXPECT_EQ(TerminateCause::RdmapUnexpectedOpcode(), (TerminateCause{0x0, 0x2, 0x06}));
  EXPECT_EQ(TerminateCause::RdmapCatastrophicStream(), (TerminateCause{0x0, 0x2, 0x07}));
  EXPECT_EQ(TerminateCause::RdmapCatastrophicGlobal(), (TerminateCause{0x0, 0x2, 0x08}));
  EXPECT_EQ(TerminateCause::RdmapOperationStagCannotBeInvalidated(),
            (TerminateCause{0x0, 0x2, 0x09}));
  EXPECT_EQ(TerminateCause::RdmapOperationUnspecified(), (TerminateCause{0x0, 0x2, 0xFF}));
}

TEST(TerminateCause, DdpCodesAreRfc5041Section7_2) {
  EXPECT_EQ(TerminateCause::DdpLocalCatastrophic(), (TerminateCause{0x1, 0x0, 0x00}));
  // 0x1 Tagged Buffer Error.
  EXPECT_EQ(TerminateCause::DdpInvalidStag(), (TerminateCause{0x1, 0x1, 0x00}));
  EXPECT_EQ(TerminateCause::DdpBaseOrBounds(), (TerminateCause{0x1, 0x1, 0x01}));
  EXPECT_EQ(TerminateCause::DdpStagNotAssociated(), (TerminateCause{0x1, 0x1, 0x02}));
  EXPECT_EQ(TerminateCause::DdpToWrap(), (TerminateCause{0x1, 0x1, 0x03}));
  EXPECT_EQ(TerminateCause::DdpTaggedInvalidVersion(), (TerminateCause{0x1, 0x1, 0x04}));
  // 0x2 Untagged Buffer Error.
  EXPECT_EQ(TerminateCause::DdpInvalidQn(), (TerminateCause{0x1, 0x2, 0x01}));
  EXPECT_EQ(TerminateCause::DdpNoBuffer(), (TerminateCause{0x1, 0x2, 0x02}));
  EXPECT_EQ(TerminateCause::DdpInvalidMsnRange(), (TerminateCause{0x1, 0x2, 0x03}));
  EXPECT_EQ(TerminateCause::DdpInvalidMo(), (TerminateCause{0x1, 0x2, 0x04}));
  EXPECT_EQ(TerminateCause::DdpMessageTooLong(), (TerminateCause{0x1, 0x2, 0x05}));
  EXPECT_EQ(TerminateCause::DdpUntaggedInvalidVersion(), (TerminateCause{0x1, 0x2, 0x06}));
}

TEST(TerminateCause, LlpCodesAreRfc5044Section8AndRfc6581Section8) {
  EXPECT_EQ(TerminateCause::MpaConnectionLost(), (TerminateCause{0x2, 0x0, 0x01}));
  EXPECT_EQ(TerminateCause::MpaCrcMismatch(), (TerminateCause{0x2, 0x0, 0x02}));
  EXPECT_EQ(TerminateCause::MpaMarkerMismatch(), (TerminateCause{0x2, 0x0, 0x03}));
  EXPECT_EQ(TerminateCause::MpaInvalidStartupFrame(), (TerminateCause{0x2, 0x0, 0x04}));
  EXPECT_EQ(TerminateCause::MpaLocalCatastrophic(), (TerminateCause{0x2, 0x0, 0x05}));
  EXPECT_EQ(TerminateCause::MpaInsufficientIrd(), (TerminateCause{0x2, 0x0, 0x06}));
  EXPECT_EQ(TerminateCause::MpaNoMatchingRtr(), (TerminateCause{0x2, 0x0, 0x07}));
}

TEST(TerminateCause, TableHoldsEveryDefinedTripleOnce) {
  EXPECT_EQ(kTerminateCodeTable.size(), 1u + 7 + 6 + 1 + 5 + 6 + 7);
  for (std::size_t i = 0; i < kTerminateCodeTable.size(); ++i) {
    const TerminateCause& c = kTerminateCodeTable[i].cause;
    EXPECT_TRUE(IsDefinedTerminateCause(c)) << i;
    EXPECT_EQ(TerminateErrorCodeName(c), kTerminateCodeTable[i].name) << i;
    for (std::size_t j = i + 1; j < kTerminateCodeTable.size(); ++j) {
      EXPECT_NE(c, kTerminateCodeTable[j].cause) << i << " " << j;
    }
  }
}

TEST(TerminateCause, DefinedAndUndefinedTriples) {
  // RDMAP Local Catastrophic takes any code.
  for (int code : {0x00, 0x42, 0xFF}) {
    EXPECT_TRUE(IsDefinedTerminateCause({0, 0, static_cast<std::uint8_t>(code)})) << code;
  }
  const TerminateCause undefined[] = {
      {0x0, 0x1, 0x05},  // Invalid RDMAP version is a Remote Operation error
      {0x0, 0x1, 0x0A},  // past the Remote Protection codes
      {0x0, 0x2, 0x00},  // Invalid STag is a Remote Protection error
      {0x0, 0x3, 0x00},  // no RDMAP error type 3
      {0x1, 0x0, 0x01},  // DDP Local Catastrophic has code 0 only
      {0x1, 0x1, 0x05},  // past the tagged codes
      {0x1, 0x2, 0x00},  // untagged codes start at 1
      {0x1, 0x2, 0x07},  // past the untagged codes
      {0x1, 0x3, 0x00},  // reserved for the LLP
      {0x2, 0x0, 0x00},  // MPA codes start at 1
      {0x2, 0x0, 0x08},  // past RFC 6581's codes
      {0x2, 0x1, 0x01},  // no LLP error type 1
      {0x3, 0x0, 0x00},  // no layer 3
      {0xF, 0xF, 0xFF},
  };
  for (const TerminateCause& c : undefined) {
    EXPECT_FALSE(IsDefinedTerminateCause(c))
        << int(c.layer) << "/" << int(c.etype) << "/" << int(c.ecode);
    EXPECT_EQ(TerminateErrorCodeName(c), "unknown error code");
  }
}

TEST(TerminateCause, Names) {
  EXPECT_EQ(TerminateLayerName(0), "RDMAP");
  EXPECT_EQ(TerminateLayerName(1), "DDP");
  EXPECT_EQ(TerminateLayerName(2), "LLP");
  EXPECT_EQ(TerminateLayerName(3), "unknown layer");
  EXPECT_EQ(TerminateErrorTypeName(0, 0), "Local Catastrophic Error");
  EXPECT_EQ(TerminateErrorTypeName(0, 1), "Remote Protection Error");
  EXPECT_EQ(TerminateErrorTypeName(0, 2), "Remote Operation Error");
  EXPECT_EQ(TerminateErrorTypeName(0, 3), "unknown error type");
  EXPECT_EQ(TerminateErrorTypeName(1, 0), "Local Catastrophic");
  EXPECT_EQ(TerminateErrorTypeName(1, 1), "Tagged Buffer Error");
  EXPECT_EQ(TerminateErrorTypeName(1, 2), "Untagged Buffer Error");
  EXPECT_EQ(TerminateErrorTypeName(1, 3), "Reserved for the LLP");
  EXPECT_EQ(TerminateErrorTypeName(2, 0), "MPA Error");
  EXPECT_EQ(TerminateErrorTypeName(2, 1), "unknown error type");
  EXPECT_EQ(TerminateErrorTypeName(7, 0), "unknown error type");
  EXPECT_EQ(TerminateErrorCodeName(TerminateCause::DdpInvalidMsnRange()),
            "Invalid MSN - MSN range is not valid");
  EXPECT_EQ(TerminateErrorCodeName(TerminateCause::RdmapUnexpectedOpcode()), "Unexpected OpCode");
  EXPECT_EQ(TerminateErrorCodeName({0, 0, 0x77}), "Local Catastrophic Error");
  EXPECT_EQ(TerminateErrorCodeName(TerminateCause::MpaNoMatchingRtr()), "No matching RTR option");
}

TEST(TerminateCause, FromMpaError) {
  EXPECT_EQ(TerminateCauseFromMpaError(mpa::MpaError::kNone), std::nullopt);
  EXPECT_EQ(TerminateCauseFromMpaError(mpa::MpaError::kConnectionLost),
            TerminateCause::MpaConnectionLost());
  EXPECT_EQ(TerminateCauseFromMpaError(mpa::MpaError::kCrcMismatch), (TerminateCause{2, 0, 2}));
  EXPECT_EQ(TerminateCauseFromMpaError(mpa::MpaError::kMarkerMismatch), (TerminateCause{2, 0, 3}));
  EXPECT_EQ(TerminateCauseFromMpaError(mpa::MpaError::kInvalidStartupFrame),
            (TerminateCause{2, 0, 4}));
}

// ---- Terminate header vectors ----

struct Vector {
  std::string name;
  Bytes bytes;
  TerminateHeader expected;
};

const Bytes kSendOnQn9 = {
    0x41, 0x43,              // DDP control (untagged, last) | RDMAP control (Send)
    0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
    0x00, 0x00, 0x00, 0x09,  // QN 9
    0x00, 0x00, 0x00, 0x01,  // MSN 1
    0x00, 0x00, 0x00, 0x00,  // MO 0
};
const Bytes kWriteHeader = {
    0xC1, 0x40,              // DDP control (tagged, last) | RDMAP control (Write)
    0xDE, 0xAD, 0xBE, 0xEF,  // STag
    0x00, 0x00, 0x00, 0x00,  // TO (high)
    0x00, 0x10, 0x00, 0x00,  // TO (low)
};
const Bytes kReadRequestDdp = {
    0x41, 0x41,              // DDP control | RDMAP control (Read Request)
    0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
    0x00, 0x00, 0x00, 0x01,  // QN 1
    0x00, 0x00, 0x00, 0x03,  // MSN 3
    0x00, 0x00, 0x00, 0x00,  // MO 0
};
const Bytes kReadRequestBody = {
    0x00, 0x00, 0x01, 0x00,                          // Data Sink STag
    0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00,  // Data Sink Tagged Offset
    0x00, 0x00, 0x10, 0x00,                          // RDMA Read Message Size 4096
    0x00, 0x00, 0x02, 0x00,                          // Data Source STag
    0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,  // Data Source Tagged Offset
};
const Bytes kUnknownOpcodeHeader = {
    0x41, 0x4C,              // DDP control | RDMAP control: RV 1, opcode 1100 (unassigned)
    0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
    0x00, 0x00, 0x00, 0x00,  // QN 0
    0x00, 0x00, 0x00, 0x04,  // MSN 4
    0x00, 0x00, 0x00, 0x00,  // MO 0
};

template <std::size_t N>
void CopyInto(std::array<std::uint8_t, N>& dst, const Bytes& src) {
  ASSERT_LE(src.size(), N);
  for (std::size_t i = 0; i < src.size(); ++i) dst[i] = src[i];
}

std::vector<Vector> AllVectors() {
  std::vector<Vector> v;
  {
    TerminateHeader t;
    t.cause = TerminateCause::MpaCrcMismatch();
    v.push_back({"LlpCrcNoCopies",
                 {0x20,         // Layer 0010 (LLP) | EType 0000 (MPA)
                  0x02,         // Error Code: MPA CRC mismatch
                  0x00, 0x00},  // M=0 D=0 R=0, reserved 0
                 t});
  }
  {
    TerminateHeader t;
    t.cause = TerminateCause::RdmapLocalCatastrophic();
    v.push_back({"RdmapLocalCatastrophic",
                 {0x00,         // Layer 0000 (RDMAP) | EType 0000 (Local Catastrophic)
                  0x00,         // Error Code: none
                  0x00, 0x00},  // no copies
                 t});
  }
  {
    TerminateHeader t;
    t.cause = TerminateCause::DdpInvalidQn();
    t.m = t.d = true;
    t.ddp_segment_length = 42;
    t.ddp_header_length = 18;
    CopyInto(t.ddp_header, kSendOnQn9);
    v.push_back({"DdpUntaggedInvalidQn",
                 Concat({{0x12,         // Layer 0001 (DDP) | EType 0010 (Untagged Buffer)
                          0x01,         // Error Code: Invalid QN
                          0xC0, 0x00,   // M=1 D=1 R=0
                          0x00, 0x2A},  // DDP Segment Length 42
                         kSendOnQn9}),  // Terminated DDP Header (untagged, 18 octets)
                 t});
  }
  {
    TerminateHeader t;
    t.cause = TerminateCause::DdpInvalidStag();
    t.m = t.d = true;
    t.ddp_segment_length = 1460;
    t.ddp_header_length = 14;
    CopyInto(t.ddp_header, kWriteHeader);
    v.push_back({"DdpTaggedInvalidStag",
                 Concat({{0x11,         // Layer 0001 (DDP) | EType 0001 (Tagged Buffer)
                          0x00,         // Error Code: Invalid STag
                          0xC0, 0x00,   // M=1 D=1 R=0
                          0x05, 0xB4},  // DDP Segment Length 1460
                         kWriteHeader}),  // Terminated DDP Header (tagged, 14 octets)
                 t});
  }
  {
    TerminateHeader t;
    t.cause = TerminateCause::RdmapAccessRights();
    t.m = t.d = t.r = true;
    t.ddp_segment_length = 46;
    t.ddp_header_length = 18;
    CopyInto(t.ddp_header, kReadRequestDdp);
    t.rdma_header_length = 28;
    CopyInto(t.rdma_header, kReadRequestBody);
    v.push_back({"RdmapAccessRightsOnReadRequest",
                 Concat({{0x01,         // Layer 0000 (RDMAP) | EType 0001 (Remote Protection)
                          0x02,         // Error Code: Access rights violation
                          0xE0, 0x00,   // M=1 D=1 R=1
                          0x00, 0x2E},  // DDP Segment Length 46
                         kReadRequestDdp,    // Terminated DDP Header
                         kReadRequestBody}),  // Terminated RDMA Header
                 t});
  }
  {
    TerminateHeader t;
    t.cause = TerminateCause::RdmapUnexpectedOpcode();
    t.d = true;
    t.ddp_header_length = 18;
    CopyInto(t.ddp_header, kUnknownOpcodeHeader);
    v.push_back({"DOnlyLengthPresentButNotValid",
                 Concat({{0x02,         // Layer 0000 (RDMAP) | EType 0010 (Remote Operation)
                          0x06,         // Error Code: Unexpected OpCode
                          0x40, 0x00,   // M=0 D=1 R=0
                          0x00, 0x00},  // DDP Segment Length: present (D), not valid (M=0)
                         kUnknownOpcodeHeader}),
                 t});
  }
  {
    TerminateHeader t;
    t.cause = TerminateCause::DdpMessageTooLong();
    t.m = true;
    t.ddp_segment_length = 4096;
    v.push_back({"MOnlyLengthWithoutHeader",
                 {0x12,         // DDP | Untagged Buffer
                  0x05,         // DDP Message too long for available buffer
                  0x80, 0x00,   // M=1 D=0 R=0
                  0x10, 0x00},  // DDP Segment Length 4096
                 t});
  }
  {
    TerminateHeader t;
    t.cause = TerminateCause::RdmapBaseOrBounds();
    t.r = true;
    t.rdma_header_length = 28;
    CopyInto(t.rdma_header, kReadRequestBody);
    v.push_back({"ROnly",
                 Concat({{0x01,        // RDMAP | Remote Protection
                          0x01,        // Base or bounds violation
                          0x20, 0x00},  // M=0 D=0 R=1
                         kReadRequestBody}),
                 t});
  }
  return v;
}

TEST(Terminate, EncodesEveryVector) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    EXPECT_EQ(TerminateHeaderLength(v.expected), v.bytes.size());
    Bytes out(v.bytes.size() + 2, 0xEE);
    const EncodeResult r = EncodeTerminateHeader(v.expected, out);
    ASSERT_EQ(r.status, EncodeStatus::kOk) << EncodeStatusName(r.status);
    EXPECT_EQ(r.length, v.bytes.size());
    EXPECT_EQ(Bytes(out.begin(), out.begin() + r.length), v.bytes);
    EXPECT_EQ(out[r.length], 0xEE);
  }
}

TEST(Terminate, DecodesEveryVector) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    const TerminateDecodeResult r = DecodeTerminateHeader(v.bytes);
    ASSERT_EQ(r.status, TerminateStatus::kOk) << TerminateStatusName(r.status);
    EXPECT_EQ(r.header, v.expected);
    EXPECT_EQ(r.length, v.bytes.size());
    EXPECT_TRUE(r.cause_defined);
    EXPECT_FALSE(r.reserved_bits_set);
  }
}

// The fewest octets that could complete a header whose first `n` octets
// match `t` (RFC 5040 4.8 layout arithmetic).
std::size_t Needed(const TerminateHeader& t, std::size_t n, const Bytes& bytes) {
  if (n < 4) return 4;
  std::size_t pos = 4;
  if (t.m || t.d) {
    if (n < pos + 2) return pos + 2;
    pos += 2;
  }
  if (t.d) {
    const std::size_t size = n > pos ? ((bytes[pos] & 0x80) ? 14 : 18) : 14;
    if (n < pos + size) return pos + size;
    pos += size;
  }
  return pos + 28;  // only R is left
}

TEST(Terminate, EveryPrefixIsTruncated) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    for (std::size_t n = 0; n < v.bytes.size(); ++n) {
      const TerminateDecodeResult r = DecodeTerminateHeader(ByteSpan(v.bytes).first(n));
      ASSERT_EQ(r.status, TerminateStatus::kTruncated) << "prefix " << n;
      EXPECT_EQ(r.length, Needed(v.expected, n, v.bytes)) << "prefix " << n;
      EXPECT_GT(r.length, n);
    }
  }
}

TEST(Terminate, TrailingOctetsAreReported) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    const Bytes longer = Concat({v.bytes, {0x00}});
    const TerminateDecodeResult r = DecodeTerminateHeader(longer);
    EXPECT_EQ(r.status, TerminateStatus::kTrailingOctets);
    EXPECT_EQ(r.length, v.bytes.size());
    EXPECT_EQ(r.header, v.expected);
  }
}

TEST(Terminate, ReservedBitsAreReportedNotRejected) {
  TerminateDecodeResult r = DecodeTerminateHeader(Bytes{0x20, 0x02, 0x00, 0x01});
  EXPECT_EQ(r.status, TerminateStatus::kOk);
  EXPECT_TRUE(r.reserved_bits_set);
  EXPECT_EQ(r.header.reserved, 0x0001);
  r = DecodeTerminateHeader(Bytes{0x20, 0x02, 0x1F, 0xFF});
  EXPECT_EQ(r.status, TerminateStatus::kOk);
  EXPECT_EQ(r.header.reserved, 0x1FFF);
  EXPECT_FALSE(r.header.m || r.header.d || r.header.r);
  // And they survive a round trip.
  Bytes out(4);
  ASSERT_EQ(EncodeTerminateHeader(r.header, out).status, EncodeStatus::kOk);
  EXPECT_EQ(out, (Bytes{0x20, 0x02, 0x1F, 0xFF}));
}

TEST(Terminate, UndefinedCauseStillDecodes) {
  const TerminateDecodeResult r = DecodeTerminateHeader(Bytes{0x35, 0x99, 0x00, 0x00});
  EXPECT_EQ(r.status, TerminateStatus::kOk);
  EXPECT_EQ(r.header.cause, (TerminateCause{3, 5, 0x99}));
  EXPECT_FALSE(r.cause_defined);
  EXPECT_EQ(TerminateLayerName(r.header.cause.layer), "unknown layer");
}

TEST(Terminate, EncodeRejectsInconsistentCopies) {
  Bytes out(64, 0);
  const std::vector<Vector> all = AllVectors();
  TerminateHeader t = all[2].expected;  // D with an 18-octet untagged copy
  t.ddp_header_length = 0;
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kInconsistent);  // D, no copy
  t = all[2].expected;
  t.ddp_header_length = 14;  // the copy's T flag says 18
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kInconsistent);
  t = all[3].expected;
  t.ddp_header_length = 18;  // the copy's T flag says 14
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kInconsistent);
  t = all[2].expected;
  t.d = false;  // a copy without D
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kInconsistent);
  t = all[4].expected;
  t.r = false;  // an RDMA copy without R
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kInconsistent);
  t = all[4].expected;
  t.rdma_header_length = 0;  // R without an RDMA copy
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kInconsistent);
  t = all[4].expected;
  t.rdma_header_length = 27;
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kInconsistent);
  EXPECT_EQ(out, Bytes(64, 0));
}

TEST(Terminate, EncodeRejectsFieldsWiderThanTheWire) {
  Bytes out(8, 0);
  TerminateHeader t = MakeTerminate({0x10, 0, 0});
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kFieldOutOfRange);
  t = MakeTerminate({0, 0x10, 0});
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kFieldOutOfRange);
  t = MakeTerminate(TerminateCause::MpaCrcMismatch());
  t.reserved = 0x2000;
  EXPECT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kFieldOutOfRange);
  EXPECT_EQ(out, Bytes(8, 0));
  t = MakeTerminate({0xF, 0xF, 0xFF});
  t.reserved = 0x1FFF;
  ASSERT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kOk);
  EXPECT_EQ(Bytes(out.begin(), out.begin() + 4), (Bytes{0xFF, 0xFF, 0x1F, 0xFF}));
}

TEST(Terminate, EncodeIntoEveryShortBufferWritesNothing) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    for (std::size_t n = 0; n < v.bytes.size(); ++n) {
      Bytes out(n, 0x5A);
      const EncodeResult r = EncodeTerminateHeader(v.expected, out);
      ASSERT_EQ(r.status, EncodeStatus::kBufferTooSmall);
      EXPECT_EQ(r.length, v.bytes.size());
      EXPECT_EQ(out, Bytes(n, 0x5A));
    }
  }
}

// ---- The whole Terminate ULPDU (RFC 5040 A.6) ----

TEST(Terminate, WholeMessage) {
  const Vector v = AllVectors()[2];  // DDP untagged Invalid QN with a copy
  const Bytes expected = Concat({{0x41,                    // DDP control: untagged, last
                                  0x47,                    // RDMAP control: Terminate
                                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                                  0x00, 0x00, 0x00, 0x02,  // QN 2: Terminate queue
                                  0x00, 0x00, 0x00, 0x01,  // MSN 1
                                  0x00, 0x00, 0x00, 0x00},  // MO 0
                                 v.bytes});
  Bytes out(expected.size());
  const EncodeResult r = EncodeTerminateMessage(v.expected, 1, out);
  ASSERT_EQ(r.status, EncodeStatus::kOk);
  EXPECT_EQ(r.length, expected.size());
  EXPECT_EQ(out, expected);

  // The receive path: the DDP/RDMAP header first, then the Terminate header.
  const HeaderDecodeResult h = DecodeDdpRdmapHeader(out);
  ASSERT_EQ(h.status, HeaderStatus::kOk);
  EXPECT_EQ(h.header.opcode, Opcode::kTerminate);
  EXPECT_EQ(h.length, 22u);
  const TerminateDecodeResult t = DecodeTerminateHeader(ByteSpan(out).subspan(18));
  ASSERT_EQ(t.status, TerminateStatus::kOk);
  EXPECT_EQ(t.header, v.expected);
  // The copied header decodes as the Send on QN 9 it was.
  const HeaderDecodeResult copy = DecodeDdpRdmapHeader(t.header.DdpHeaderCopy());
  EXPECT_EQ(copy.status, HeaderStatus::kInvalidQueueNumber);
  EXPECT_EQ(copy.header.qn, 9u);

  for (std::size_t n = 0; n < expected.size(); ++n) {
    Bytes short_out(n, 0x5A);
    EXPECT_EQ(EncodeTerminateMessage(v.expected, 1, short_out).status,
              EncodeStatus::kBufferTooSmall);
    EXPECT_EQ(short_out, Bytes(n, 0x5A));
  }
  TerminateHeader bad = v.expected;
  bad.ddp_header_length = 0;
  EXPECT_EQ(EncodeTerminateMessage(bad, 1, out).status, EncodeStatus::kInconsistent);
}

// ---- Building the Terminate for an offending segment (Figure 10, 7.1) ----

TEST(Terminate, MakeForSegmentCopiesWhatFigure10Says) {
  const Bytes read_request = Concat({kReadRequestDdp, kReadRequestBody});

  // LLP and Local Catastrophic errors carry no copies.
  for (const TerminateCause& c :
       {TerminateCause::MpaCrcMismatch(), TerminateCause::RdmapLocalCatastrophic(),
        TerminateCause::DdpLocalCatastrophic()}) {
    EXPECT_EQ(MakeTerminateForSegment(c, read_request, 46), MakeTerminate(c));
  }

  // DDP error on a tagged segment: the 14-octet header, M and D.
  TerminateHeader t = MakeTerminateForSegment(TerminateCause::DdpBaseOrBounds(),
                                              Concat({kWriteHeader, Bytes(100, 0xAB)}), 114);
  EXPECT_TRUE(t.m && t.d && !t.r);
  EXPECT_EQ(t.ddp_segment_length, 114);
  EXPECT_EQ(Bytes(t.DdpHeaderCopy().begin(), t.DdpHeaderCopy().end()), kWriteHeader);
  EXPECT_EQ(t.rdma_header_length, 0);

  // Remote Protection error on a Read Request: also the Read Request header.
  t = MakeTerminateForSegment(TerminateCause::RdmapAccessRights(), read_request, 46);
  EXPECT_EQ(t, AllVectors()[4].expected);

  // Remote Protection error on a Send with Invalidate: DDP header only.
  const Bytes send_inv = {0x41, 0x44, 0x00, 0x00, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0};
  t = MakeTerminateForSegment(TerminateCause::RdmapStagCannotBeInvalidated(), send_inv, 18);
  EXPECT_TRUE(t.m && t.d && !t.r);
  EXPECT_EQ(Bytes(t.DdpHeaderCopy().begin(), t.DdpHeaderCopy().end()), send_inv);

  // Remote Operation error on a Read Request: no RDMA header (Figure 10).
  t = MakeTerminateForSegment(TerminateCause::RdmapCatastrophicStream(), read_request, 46);
  EXPECT_TRUE(t.m && t.d && !t.r);
  EXPECT_EQ(t.ddp_header_length, 18);

  // Read Request body cut short: the DDP header is still copied, R is not.
  t = MakeTerminateForSegment(TerminateCause::RdmapInvalidStag(),
                              ByteSpan(read_request).first(40), 46);
  EXPECT_TRUE(t.m && t.d && !t.r);

  // A header of another DDP version has an unknown layout: nothing copied.
  Bytes bad_version = kSendOnQn9;
  bad_version[0] = 0x42;
  EXPECT_EQ(MakeTerminateForSegment(TerminateCause::DdpUntaggedInvalidVersion(), bad_version, 18),
            MakeTerminate(TerminateCause::DdpUntaggedInvalidVersion()));
  // A header cut short: nothing copied.
  EXPECT_EQ(MakeTerminateForSegment(TerminateCause::DdpInvalidQn(),
                                    ByteSpan(kSendOnQn9).first(17), 17),
            MakeTerminate(TerminateCause::DdpInvalidQn()));
  EXPECT_EQ(MakeTerminateForSegment(TerminateCause::DdpInvalidQn(), ByteSpan(), 0),
            MakeTerminate(TerminateCause::DdpInvalidQn()));

  // What the header decoder rejects maps to a Terminate that encodes.
  const HeaderDecodeResult h = DecodeDdpRdmapHeader(kSendOnQn9);
  ASSERT_EQ(h.status, HeaderStatus::kInvalidQueueNumber);
  t = MakeTerminateForSegment(*TerminateCauseForHeader(h), kSendOnQn9, 42);
  EXPECT_EQ(t, AllVectors()[2].expected);
}

// RFC 5040 4.8: "Terminated DDP Header: For Terminate Messages that are a
// result of a DDP error, the DDP header of the DDP Segment that caused the
// error." Its layout is RFC 5041 4.2 (tagged: STag, TO) or 4.3 (untagged:
// QN, MSN, MO); the receiver of a Terminate reads it to find its failed WR.
TEST(Terminate, DecodesTheTerminatedDdpHeaderCopy) {
  TerminateHeader t = MakeTerminateForSegment(TerminateCause::DdpBaseOrBounds(),
                                              Concat({kWriteHeader, Bytes(8, 0)}), 22);
  std::optional<TerminatedDdpHeader> copy = DecodeTerminatedDdpHeader(t);
  ASSERT_TRUE(copy.has_value());
  EXPECT_TRUE(copy->tagged && copy->last);
  EXPECT_EQ(copy->rdmap_control, 0x40);
  EXPECT_EQ(copy->stag, 0xDEADBEEFu);
  EXPECT_EQ(copy->to, 0x100000u);
  EXPECT_EQ(copy->qn, 0u);
  EXPECT_EQ(copy->msn, 0u);

  t = MakeTerminateForSegment(TerminateCause::RdmapAccessRights(),
                              Concat({kReadRequestDdp, kReadRequestBody}), 46);
  copy = DecodeTerminatedDdpHeader(t);
  ASSERT_TRUE(copy.has_value());
  EXPECT_FALSE(copy->tagged);
  EXPECT_EQ(copy->rdmap_control, 0x41);
  EXPECT_EQ(copy->qn, 1u);
  EXPECT_EQ(copy->msn, 3u);
  EXPECT_EQ(copy->mo, 0u);
  EXPECT_EQ(copy->stag, 0u);

  // No copy (D clear), and a copy whose length contradicts its T flag.
  EXPECT_FALSE(DecodeTerminatedDdpHeader(MakeTerminate(TerminateCause::DdpInvalidQn())));
  t = MakeTerminateForSegment(TerminateCause::DdpInvalidQn(), kSendOnQn9, 18);
  ASSERT_TRUE(DecodeTerminatedDdpHeader(t).has_value());
  EXPECT_EQ(DecodeTerminatedDdpHeader(t)->qn, 9u);
  t.ddp_header[0] |= kDdpTaggedFlag;  // says 14 octets, holds 18
  EXPECT_FALSE(DecodeTerminatedDdpHeader(t).has_value());
  t.ddp_header[0] &= static_cast<std::uint8_t>(~kDdpTaggedFlag);
  t.d = false;
  EXPECT_FALSE(DecodeTerminatedDdpHeader(t).has_value());
}

// ---- siw's swapped layout (diagnostics only) ----

TEST(Terminate, DecodesSiwSwappedLayout) {
  // siw reporting DDP / Untagged Buffer / Invalid QN with M and D set.
  const Bytes siw = Concat({{0x21,        // EType 0010 (high nibble) | Layer 0001 (low nibble)
                             0x01,        // Error Code: Invalid QN
                             0x03, 0x00,  // flag_m 0x01, flag_d 0x02
                             0x00, 0x2A},  // DDP Segment Length
                            kSendOnQn9});
  TerminateDecodeResult r = DecodeTerminateHeader(siw, TerminateLayout::kSiwSwapped);
  ASSERT_EQ(r.status, TerminateStatus::kOk);
  EXPECT_EQ(r.header, AllVectors()[2].expected);
  EXPECT_FALSE(r.reserved_bits_set);
  EXPECT_EQ(GuessTerminateLayout(siw), TerminateLayout::kSiwSwapped);

  // Read per the RFC the same octets make no sense: LLP, no flags, reserved
  // bits set, and 24 octets left over.
  r = DecodeTerminateHeader(siw, TerminateLayout::kRfc5040);
  EXPECT_EQ(r.status, TerminateStatus::kTrailingOctets);
  EXPECT_EQ(r.header.cause, (TerminateCause{2, 1, 0x01}));
  EXPECT_TRUE(r.reserved_bits_set);
  EXPECT_EQ(r.length, 4u);
}

TEST(Terminate, SiwSetsRWithoutAnRdmaHeaderForSends) {
  // RDMAP / Remote Protection / STag cannot be Invalidated on a Send with
  // Invalidate: siw sets M, D and R but appends only the DDP header.
  const Bytes send_inv = {0x41, 0x44, 0x00, 0x00, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0};
  const Bytes siw = Concat({{0x10,        // EType 0001 | Layer 0000
                             0x09,        // STag cannot be Invalidated
                             0x07, 0x00,  // flag_m | flag_d | flag_r
                             0x00, 0x00},  // DDP Segment Length (siw: payload length 0)
                            send_inv});
  TerminateDecodeResult r = DecodeTerminateHeader(siw, TerminateLayout::kSiwSwapped);
  ASSERT_EQ(r.status, TerminateStatus::kOk);
  EXPECT_EQ(r.header.cause, TerminateCause::RdmapStagCannotBeInvalidated());
  EXPECT_TRUE(r.header.m && r.header.d && r.header.r);
  EXPECT_EQ(r.header.ddp_header_length, 18);
  EXPECT_EQ(r.header.rdma_header_length, 0);
  EXPECT_EQ(r.length, siw.size());

  // A siw Read Request error does carry the RDMA header.
  const Bytes siw_rr = Concat({{0x10, 0x02, 0x07, 0x00, 0x00, 0x00}, kReadRequestDdp,
                               kReadRequestBody});
  r = DecodeTerminateHeader(siw_rr, TerminateLayout::kSiwSwapped);
  ASSERT_EQ(r.status, TerminateStatus::kOk);
  EXPECT_EQ(r.header.rdma_header_length, 28);
  EXPECT_EQ(Bytes(r.header.RdmaHeaderCopy().begin(), r.header.RdmaHeaderCopy().end()),
            kReadRequestBody);

  // siw's reserved bits sit above its flags.
  r = DecodeTerminateHeader(Bytes{0x02, 0x00, 0x08, 0x01}, TerminateLayout::kSiwSwapped);
  EXPECT_EQ(r.status, TerminateStatus::kOk);
  EXPECT_EQ(r.header.cause, (TerminateCause{2, 0, 0}));
  EXPECT_EQ(r.header.reserved, 0x0021);  // (0x08 >> 3) | (0x01 << 5)
  EXPECT_TRUE(r.reserved_bits_set);
}

TEST(Terminate, GuessLayoutOnlyWhenTheFlagsTell) {
  EXPECT_EQ(GuessTerminateLayout(AllVectors()[2].bytes), TerminateLayout::kRfc5040);
  EXPECT_EQ(GuessTerminateLayout(Bytes{0x12, 0x01, 0x03, 0x00}), TerminateLayout::kSiwSwapped);
  EXPECT_EQ(GuessTerminateLayout(Bytes{0x20, 0x02, 0x00, 0x00}), std::nullopt);  // no flags
  EXPECT_EQ(GuessTerminateLayout(Bytes{0x12, 0x01, 0xC3, 0x00}), std::nullopt);  // both
  EXPECT_EQ(GuessTerminateLayout(Bytes{0x12, 0x01}), std::nullopt);
}

// ---- Round trips and hostile input ----

TEST(Terminate, RandomHeadersRoundTrip) {
  std::mt19937_64 rng(0x7E53);
  for (int i = 0; i < 20000; ++i) {
    TerminateHeader t;
    t.cause = {static_cast<std::uint8_t>(rng() % 16), static_cast<std::uint8_t>(rng() % 16),
               static_cast<std::uint8_t>(rng())};
    t.reserved = static_cast<std::uint16_t>(rng() & 0x1FFF);
    t.m = rng() % 2;
    t.d = rng() % 2;
    t.r = rng() % 2;
    t.ddp_segment_length = (t.m || t.d) ? static_cast<std::uint16_t>(rng()) : 0;
    if (t.d) {
      const bool tagged = rng() % 2;
      t.ddp_header_length = tagged ? 14 : 18;
      for (std::size_t k = 0; k < t.ddp_header_length; ++k) {
        t.ddp_header[k] = static_cast<std::uint8_t>(rng());
      }
      t.ddp_header[0] = static_cast<std::uint8_t>(tagged ? (t.ddp_header[0] | 0x80)
                                                         : (t.ddp_header[0] & 0x7F));
    }
    if (t.r) {
      t.rdma_header_length = 28;
      for (auto& o : t.rdma_header) o = static_cast<std::uint8_t>(rng());
    }
    Bytes out(TerminateHeaderLength(t));
    ASSERT_EQ(EncodeTerminateHeader(t, out).status, EncodeStatus::kOk);
    const TerminateDecodeResult r = DecodeTerminateHeader(out);
    ASSERT_EQ(r.status, TerminateStatus::kOk);
    ASSERT_EQ(r.header, t);
    ASSERT_EQ(r.length, out.size());
    ASSERT_EQ(r.cause_defined, IsDefinedTerminateCause(t.cause));
  }
}

TEST(Terminate, RandomOctetsDecodeSafely) {
  std::mt19937 rng(11);
  for (int i = 0; i < 50000; ++i) {
    Bytes b(rng() % 60);
    for (auto& o : b) o = static_cast<std::uint8_t>(rng());
    for (TerminateLayout layout : {TerminateLayout::kRfc5040, TerminateLayout::kSiwSwapped}) {
      const TerminateDecodeResult r = DecodeTerminateHeader(b, layout);
      if (r.status == TerminateStatus::kTruncated) {
        ASSERT_GT(r.length, b.size());
      } else {
        ASSERT_LE(r.length, b.size());
        ASSERT_EQ(r.status == TerminateStatus::kOk, r.length == b.size());
      }
    }
  }
}

TEST(Terminate, StatusNames) {
  EXPECT_EQ(TerminateStatusName(TerminateStatus::kOk), "ok");
  EXPECT_EQ(TerminateStatusName(TerminateStatus::kTruncated), "Terminate header truncated");
  EXPECT_EQ(TerminateStatusName(TerminateStatus::kTrailingOctets),
            "octets after the Terminate header");
}

}  // namespace
}  // namespace siwx::rdmap

// The form of every Terminate log line and of `siwx stat`: RFC 5040 7.2/7.3
// names of layer, type and code, then the numbers.
TEST(TerminateDescribe, NamesLayerTypeAndCode) {
  EXPECT_EQ(siwx::rdmap::DescribeTerminateCause(siwx::rdmap::TerminateCause::MpaCrcMismatch()),
            "LLP / MPA Error / Received MPA CRC does not match (layer 2, type 0, code 0x02)");
  EXPECT_EQ(siwx::rdmap::DescribeTerminateCause(siwx::rdmap::TerminateCause::DdpInvalidStag()),
            "DDP / Tagged Buffer Error / Invalid STag (layer 1, type 1, code 0x00)");
  const siwx::rdmap::TerminateCause odd{0xF, 0xE, 0x77};
  EXPECT_EQ(siwx::rdmap::DescribeTerminateCause(odd),
            "unknown layer / unknown error type / unknown error code "
            "(layer 15, type 14, code 0x77)");
}
