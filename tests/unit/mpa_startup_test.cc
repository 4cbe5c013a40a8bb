// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// MPA startup frame codec: RFC 5044 7.1.1, the Rtr/S-bit proposal, RFC 6581.
#include "common/wire/mpa_startup.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace siwx::mpa {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes Cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
Bytes Ascii(std::string_view s) { return Bytes(s.begin(), s.end()); }

// clang-format off
const Bytes kReqKey = {0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,   // "MPA ID R"
                       0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65};  // "eq Frame"
const Bytes kRepKey = {0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,   // "MPA ID R"
                       0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65};  // "ep Frame"
const Bytes kRtrKeyBytes = {0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,   // "MPA ID R"
                            0x74, 0x52, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65};  // "tR Frame"

// What Linux siw (6.1) sends as Initiator for rping (docs/kernel-siw-interop.md).
const Bytes kSiwRequest = Cat({kReqKey,
    {0x10, 0x02,     // M=0 C=0 R=0 enhanced=1 Res=0 | Rev=2
     0x00, 0x04,     // PD_Length = 4
     0x00, 0x01,     // A=0 B=0 IRD=1
     0x00, 0x01}});  // C=0 D=0 ORD=1
// The same from a siw with try_gso: its MPA_RR_FLAG_GSO_EXP, siwx's L bit.
const Bytes kSiwRequestLargeFpdus = Cat({kReqKey,
    {0x18, 0x02,     // M=0 C=0 R=0 enhanced=1 L=1 Res=0 | Rev=2
     0x00, 0x04,     // PD_Length = 4
     0x00, 0x01,     // A=0 B=0 IRD=1
     0x00, 0x01}});  // C=0 D=0 ORD=1
// The same with CRC required.
const Bytes kSiwRequestCrc = Cat({kReqKey,
    {0x50, 0x02,     // M=0 C=1 R=0 enhanced=1 | Rev=2
     0x00, 0x04,     // PD_Length = 4
     0x00, 0x01,     // IRD=1
     0x00, 0x01}});  // ORD=1
// RFC 5044 v1 Request with CRC and three octets of private data.
const Bytes kV1RequestCrcPd = Cat({kReqKey,
    {0x40, 0x01,             // M=0 C=1 R=0 Res=0 | Rev=1
     0x00, 0x03,             // PD_Length = 3
     0x61, 0x62, 0x63}});    // "abc"
// RFC 5044 v1 rejecting Reply with private data "no".
const Bytes kV1RejectReply = Cat({kRepKey,
    {0x20, 0x01,         // M=0 C=0 R=1 | Rev=1
     0x00, 0x02,         // PD_Length = 2
     0x6E, 0x6F}});      // "no"
// Rtr proposal: Request with S (the requester will send an Rtr frame).
const Bytes kSbitRequest = Cat({kReqKey,
    {0x10, 0x01,         // M=0 C=0 R=0 S=1 | Rev=1
     0x00, 0x00}});      // PD_Length = 0
// Rtr proposal: accepting Reply with M and S (Responder waits for Rtr).
const Bytes kSbitReply = Cat({kRepKey,
    {0x90, 0x01,         // M=1 C=0 R=0 S=1 | Rev=1
     0x00, 0x00}});      // PD_Length = 0
// Rtr proposal: the Rtr frame, C copied from a Reply with C=1.
const Bytes kRtrFrame = Cat({kRtrKeyBytes,
    {0x40, 0x01,         // M=0 C=1 R=0 S=0 | Rev=1
     0x00, 0x00}});      // PD_Length = 0
// RFC 6581 Reply granting peer-to-peer with a zero-length Write RTR.
const Bytes kV2P2pReply = Cat({kRepKey,
    {0x50, 0x02,         // M=0 C=1 R=0 enhanced=1 | Rev=2
     0x00, 0x06,         // PD_Length = 6
     0x80, 0x80,         // A=1 B=0 IRD=0x0080
     0x80, 0x10,         // C=1 D=0 ORD=0x0010
     0x6F, 0x6B}});      // ULP private data "ok"
// clang-format on

TEST(MpaStartupDecode, LinuxSiwRequest) {
  const StartupDecodeResult r = DecodeStartupFrame(kSiwRequest);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.error, StartupFrameError::kNone);
  EXPECT_EQ(r.consumed, 24u);
  const StartupHeader& h = r.frame.header;
  EXPECT_EQ(h.kind, StartupFrameKind::kRequest);
  EXPECT_FALSE(h.markers);
  EXPECT_FALSE(h.crc);
  EXPECT_FALSE(h.reject);
  EXPECT_TRUE(h.x_bit);
  EXPECT_FALSE(h.large_fpdus);
  EXPECT_EQ(h.reserved, 0);
  EXPECT_EQ(h.revision, 2);
  EXPECT_EQ(h.pd_length, 4);
  EXPECT_TRUE(IsEnhanced(h));
  EXPECT_FALSE(HasRtrIndicator(h));
  ASSERT_TRUE(r.frame.ird_ord.has_value());
  EXPECT_EQ(*r.frame.ird_ord, (IrdOrdWord{1, 1, false, false, false, false}));
  EXPECT_EQ(r.frame.private_data.size(), 4u);
  EXPECT_EQ(r.frame.ulp_private_data.size(), 0u);
}

TEST(MpaStartupDecode, LinuxSiwRequestWithTryGso) {
  const StartupDecodeResult r = DecodeStartupFrame(kSiwRequestLargeFpdus);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.consumed, 24u);
  const StartupHeader& h = r.frame.header;
  EXPECT_TRUE(h.large_fpdus);
  EXPECT_EQ(h.reserved, 0);  // L is not counted among the other Res bits
  EXPECT_TRUE(h.x_bit);
  EXPECT_FALSE(h.markers);
  EXPECT_FALSE(h.crc);
  EXPECT_FALSE(h.reject);
  EXPECT_EQ(h.revision, 2);
  EXPECT_TRUE(IsEnhanced(h));
  ASSERT_TRUE(r.frame.ird_ord.has_value());
  EXPECT_EQ(*r.frame.ird_ord, (IrdOrdWord{1, 1, false, false, false, false}));
}

TEST(MpaStartupDecode, OtherReservedBitsDoNotHideL) {
  // RFC 5044 7.1.1: Res is not checked on reception. 0x0700 (the three
  // other Res bits) set, L clear and then set; a v1 Reply and an S-bit
  // Request alike.
  const Bytes v1_res = Cat({kRepKey, {0x07, 0x01, 0x00, 0x00}});  // Res=0x7 | Rev 1
  const StartupDecodeResult a = DecodeStartupFrame(v1_res);
  ASSERT_EQ(a.status, StartupDecodeStatus::kComplete);
  EXPECT_FALSE(a.frame.header.large_fpdus);
  EXPECT_EQ(a.frame.header.reserved, 0x07);
  EXPECT_FALSE(a.frame.header.x_bit);
  const Bytes sbit_all = Cat({kReqKey, {0x1F, 0x01, 0x00, 0x00}});  // S=1 L=1 Res=0x7 | Rev 1
  const StartupDecodeResult b = DecodeStartupFrame(sbit_all);
  ASSERT_EQ(b.status, StartupDecodeStatus::kComplete);
  EXPECT_TRUE(b.frame.header.large_fpdus);
  EXPECT_EQ(b.frame.header.reserved, 0x07);
  EXPECT_TRUE(HasRtrIndicator(b.frame.header));
  const Bytes v2_res = Cat({kRepKey, {0x1D, 0x02, 0x00, 0x04, 0x00, 0x02, 0x00, 0x03}});
  const StartupDecodeResult c = DecodeStartupFrame(v2_res);  // S=1 L=1 Res=0x5 | Rev 2
  ASSERT_EQ(c.status, StartupDecodeStatus::kComplete);
  EXPECT_TRUE(c.frame.header.large_fpdus);
  EXPECT_EQ(c.frame.header.reserved, 0x05);
  ASSERT_TRUE(c.frame.ird_ord.has_value());
  EXPECT_EQ(*c.frame.ird_ord, (IrdOrdWord{2, 3, false, false, false, false}));
}

TEST(MpaStartupDecode, LinuxSiwRequestWithCrc) {
  const StartupDecodeResult r = DecodeStartupFrame(kSiwRequestCrc);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_TRUE(r.frame.header.crc);
  EXPECT_TRUE(IsEnhanced(r.frame.header));
  EXPECT_EQ(r.consumed, 24u);
}

TEST(MpaStartupDecode, V1RequestWithPrivateData) {
  const StartupDecodeResult r = DecodeStartupFrame(kV1RequestCrcPd);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.consumed, 23u);
  EXPECT_EQ(r.frame.header.kind, StartupFrameKind::kRequest);
  EXPECT_TRUE(r.frame.header.crc);
  EXPECT_FALSE(r.frame.header.x_bit);
  EXPECT_EQ(r.frame.header.revision, 1);
  EXPECT_FALSE(r.frame.ird_ord.has_value());
  EXPECT_EQ(Bytes(r.frame.ulp_private_data.begin(), r.frame.ulp_private_data.end()), Ascii("abc"));
  EXPECT_EQ(Bytes(r.frame.private_data.begin(), r.frame.private_data.end()), Ascii("abc"));
}

TEST(MpaStartupDecode, V1RejectReply) {
  const StartupDecodeResult r = DecodeStartupFrame(kV1RejectReply);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.consumed, 22u);
  EXPECT_EQ(r.frame.header.kind, StartupFrameKind::kReply);
  EXPECT_TRUE(r.frame.header.reject);
  EXPECT_FALSE(r.frame.header.crc);
  EXPECT_EQ(Bytes(r.frame.ulp_private_data.begin(), r.frame.ulp_private_data.end()), Ascii("no"));
}

TEST(MpaStartupDecode, SbitRequestAndReply) {
  const StartupDecodeResult req = DecodeStartupFrame(kSbitRequest);
  ASSERT_EQ(req.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(req.consumed, 20u);
  EXPECT_TRUE(HasRtrIndicator(req.frame.header));
  EXPECT_FALSE(IsEnhanced(req.frame.header));
  EXPECT_FALSE(req.frame.ird_ord.has_value());

  const StartupDecodeResult rep = DecodeStartupFrame(kSbitReply);
  ASSERT_EQ(rep.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(rep.frame.header.kind, StartupFrameKind::kReply);
  EXPECT_TRUE(rep.frame.header.markers);
  EXPECT_TRUE(HasRtrIndicator(rep.frame.header));
}

TEST(MpaStartupDecode, RtrFrame) {
  const StartupDecodeResult r = DecodeStartupFrame(kRtrFrame);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.consumed, 20u);
  EXPECT_EQ(r.frame.header.kind, StartupFrameKind::kRtr);
  EXPECT_TRUE(r.frame.header.crc);
  EXPECT_EQ(r.frame.header.revision, 1);
  EXPECT_FALSE(HasRtrIndicator(r.frame.header));
}

TEST(MpaStartupDecode, V2PeerToPeerReply) {
  const StartupDecodeResult r = DecodeStartupFrame(kV2P2pReply);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.consumed, 26u);
  ASSERT_TRUE(r.frame.ird_ord.has_value());
  EXPECT_EQ(*r.frame.ird_ord, (IrdOrdWord{0x80, 0x10, true, false, true, false}));
  EXPECT_EQ(Bytes(r.frame.ulp_private_data.begin(), r.frame.ulp_private_data.end()), Ascii("ok"));
  EXPECT_EQ(r.frame.private_data.size(), 6u);
}

struct WordCase {
  Bytes wire;
  IrdOrdWord word;
};

TEST(MpaStartupIrdOrd, EachBitAndValue) {
  // clang-format off
  const std::vector<WordCase> cases = {
      {{0x80, 0x00, 0x00, 0x00}, {0, 0, true, false, false, false}},        // A: peer-to-peer
      {{0x40, 0x00, 0x00, 0x00}, {0, 0, false, true, false, false}},        // B: Send RTR
      {{0x00, 0x00, 0x80, 0x00}, {0, 0, false, false, true, false}},        // C: Write RTR
      {{0x00, 0x00, 0x40, 0x00}, {0, 0, false, false, false, true}},        // D: Read RTR
      {{0x3F, 0xFF, 0x00, 0x00}, {0x3FFF, 0, false, false, false, false}},  // IRD 0x3FFF (9.1)
      {{0x00, 0x00, 0x3F, 0xFF}, {0, 0x3FFF, false, false, false, false}},  // ORD 0x3FFF (9.1)
      {{0x12, 0x34, 0x23, 0x45}, {0x1234, 0x2345, false, false, false, false}},
      {{0xFF, 0xFF, 0xFF, 0xFF}, {0x3FFF, 0x3FFF, true, true, true, true}},
  };
  // clang-format on
  for (const WordCase& c : cases) {
    EXPECT_EQ(DecodeIrdOrdWord(std::span<const std::uint8_t, 4>(c.wire.data(), 4)), c.word);
    std::uint8_t out[4] = {0xAA, 0xAA, 0xAA, 0xAA};
    EncodeIrdOrdWord(c.word, out);
    EXPECT_EQ(Bytes(out, out + 4), c.wire);
  }
}

TEST(MpaStartupIrdOrd, ConstantsMatchRfc6581) {
  // RFC 6581 6: S is the bit after R; 9: A/C top bit, B/D next, 14-bit
  // values; 9.1: all ones (0x3FFF) leaves the value to the ULP.
  EXPECT_EQ(kStartupFlagX, 0x1000);
  // siw's iwarp.h: MPA_RR_FLAG_GSO_EXP is 0x0800; Res keeps the rest.
  EXPECT_EQ(kStartupFlagLargeFpdus, 0x0800);
  EXPECT_EQ(kStartupResMask, 0x0700);
  EXPECT_EQ(kIrdOrdWordSize, 4u);
  EXPECT_EQ(kIrdOrdFlagHigh, 0x8000);
  EXPECT_EQ(kIrdOrdFlagLow, 0x4000);
  EXPECT_EQ(kMaxIrdOrd, 0x3FFF);
  EXPECT_EQ(kIrdOrdNotNegotiated, 0x3FFF);
  EXPECT_EQ(kMaxUlpPrivateDataEnhanced, 508u);  // 9: "reduced by 4 bytes"
}

TEST(MpaStartupDecode, RtrFlagsWithoutAAreReportedAsReceived) {
  // RFC 6581 9.2: B, C, D "MUST be ignored" when A is 0; ignoring is the
  // negotiator's job, the codec shows the wire.
  // clang-format off
  const Bytes req = Cat({kReqKey,
      {0x10, 0x02,     // S=1 | Rev 2
       0x00, 0x04,     // PD_Length 4
       0x40, 0x02,     // A=0 B=1 IRD 2
       0xC0, 0x03}});  // C=1 D=1 ORD 3
  // clang-format on
  const StartupDecodeResult r = DecodeStartupFrame(req);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.frame.ird_ord, (IrdOrdWord{2, 3, false, true, true, true}));
}

TEST(MpaStartupIrdOrd, EncodeTruncatesTo14Bits) {
  std::uint8_t out[4];
  EncodeIrdOrdWord({0xFFFF, 0x4001, false, false, false, false}, out);
  EXPECT_EQ(Bytes(out, out + 4), (Bytes{0x3F, 0xFF, 0x00, 0x01}));
}

const std::vector<const Bytes*> kAllVectors = {&kSiwRequest,    &kSiwRequestCrc, &kV1RequestCrcPd,
                                               &kV1RejectReply, &kSbitRequest,   &kSbitReply,
                                               &kRtrFrame,      &kV2P2pReply};

TEST(MpaStartupDecode, EveryPrefixNeedsMoreWithExactCount) {
  for (const Bytes* v : kAllVectors) {
    for (std::size_t n = 0; n < v->size(); ++n) {
      const StartupDecodeResult r = DecodeStartupFrame(ByteSpan(v->data(), n));
      ASSERT_EQ(r.status, StartupDecodeStatus::kNeedMore) << "prefix " << n << " of " << v->size();
      EXPECT_EQ(r.error, StartupFrameError::kNone);
      const std::size_t expected = n < kStartupHeaderSize ? kStartupHeaderSize - n : v->size() - n;
      EXPECT_EQ(r.needed, expected) << "prefix " << n;
      EXPECT_EQ(r.consumed, 0u);
    }
    EXPECT_EQ(DecodeStartupFrame(*v).status, StartupDecodeStatus::kComplete);
  }
}

TEST(MpaStartupDecode, TrailingOctetsAreNotConsumed) {
  // A first FPDU right behind the frame: ULPDU_Length 0x0012, DDP/RDMAP 0x41 0x43.
  const Bytes fpdu_start = {0x00, 0x12, 0x41, 0x43};
  for (const Bytes* v : kAllVectors) {
    const Bytes joined = Cat({*v, fpdu_start});
    const StartupDecodeResult r = DecodeStartupFrame(joined);
    ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
    EXPECT_EQ(r.consumed, v->size());
    EXPECT_EQ(r.frame.private_data.size(), v->size() - kStartupHeaderSize);
  }
}

TEST(MpaStartupDecode, WrongKeyOctetIsRefusedAsSoonAsItArrives) {
  for (const Bytes* v : {&kSiwRequest, &kV1RejectReply, &kRtrFrame}) {
    for (std::size_t i = 0; i < kKeySize; ++i) {
      Bytes bad = *v;
      bad[i] = 0x00;  // no key has a NUL octet anywhere
      // The prefix that ends with the bad octet is already refused...
      const StartupDecodeResult early = DecodeStartupFrame(ByteSpan(bad.data(), i + 1));
      EXPECT_EQ(early.status, StartupDecodeStatus::kMalformed) << "key octet " << i;
      EXPECT_EQ(early.error, StartupFrameError::kBadKey);
      // ...and so is the whole frame.
      const StartupDecodeResult whole = DecodeStartupFrame(bad);
      EXPECT_EQ(whole.status, StartupDecodeStatus::kMalformed);
      EXPECT_EQ(whole.error, StartupFrameError::kBadKey);
      // The prefix before it is still a possible key.
      EXPECT_EQ(DecodeStartupFrame(ByteSpan(bad.data(), i)).status, StartupDecodeStatus::kNeedMore);
    }
  }
}

TEST(MpaStartupDecode, LowercaseKeyAndHttpAreBadKeys) {
  const Bytes lower = Cat({Ascii("mpa id req frame"), {0x00, 0x01, 0x00, 0x00}});
  EXPECT_EQ(DecodeStartupFrame(lower).error, StartupFrameError::kBadKey);
  const Bytes http = Ascii("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  const StartupDecodeResult r = DecodeStartupFrame(http);
  EXPECT_EQ(r.status, StartupDecodeStatus::kMalformed);
  EXPECT_EQ(r.error, StartupFrameError::kBadKey);
  // "M" alone could still be a key; "MX" cannot.
  EXPECT_EQ(DecodeStartupFrame(Ascii("M")).status, StartupDecodeStatus::kNeedMore);
  EXPECT_EQ(DecodeStartupFrame(Ascii("MX")).error, StartupFrameError::kBadKey);
}

TEST(MpaStartupDecode, BadRevisionsAreRefusedAtOctet17) {
  struct Case {
    const Bytes* key;
    std::uint8_t rev;
  };
  // clang-format off
  const std::vector<Case> cases = {
      {&kReqKey, 0}, {&kReqKey, 3}, {&kReqKey, 255},
      {&kRepKey, 0}, {&kRepKey, 3}, {&kRepKey, 0x80},
      {&kRtrKeyBytes, 0}, {&kRtrKeyBytes, 2}, {&kRtrKeyBytes, 3},  // Rtr is Rev 1 only
  };
  // clang-format on
  for (const Case& c : cases) {
    const Bytes frame = Cat({*c.key, {0x00, c.rev, 0x00, 0x00}});
    EXPECT_EQ(DecodeStartupFrame(ByteSpan(frame.data(), 17)).status,
              StartupDecodeStatus::kNeedMore);
    const StartupDecodeResult r18 = DecodeStartupFrame(ByteSpan(frame.data(), 18));
    EXPECT_EQ(r18.status, StartupDecodeStatus::kMalformed) << "rev " << int{c.rev};
    EXPECT_EQ(r18.error, StartupFrameError::kBadRevision);
    EXPECT_EQ(DecodeStartupFrame(frame).error, StartupFrameError::kBadRevision);
  }
}

TEST(MpaStartupDecode, PrivateDataLengthLimit) {
  for (std::uint16_t len : {std::uint16_t{513}, std::uint16_t{0x1000}, std::uint16_t{0xFFFF}}) {
    const Bytes header =
        Cat({kReqKey,
             {0x00, 0x01, static_cast<std::uint8_t>(len >> 8), static_cast<std::uint8_t>(len)}});
    const StartupDecodeResult r = DecodeStartupFrame(header);
    EXPECT_EQ(r.status, StartupDecodeStatus::kMalformed) << len;
    EXPECT_EQ(r.error, StartupFrameError::kPrivateDataTooLong);
  }
  // 512 is the largest legal PD_Length (RFC 5044 7.1.1).
  Bytes max = Cat({kRepKey, {0x00, 0x01, 0x02, 0x00}});
  max.resize(kStartupHeaderSize + 512, 0x5A);
  const StartupDecodeResult r = DecodeStartupFrame(max);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.consumed, 532u);
  EXPECT_EQ(r.frame.ulp_private_data.size(), 512u);
  EXPECT_EQ(DecodeStartupFrame(ByteSpan(max.data(), 531)).needed, 1u);
}

TEST(MpaStartupDecode, EnhancedNeedsTheIrdOrdWord) {
  for (std::uint8_t len = 0; len < 4; ++len) {
    const Bytes header = Cat({kReqKey, {0x10, 0x02, 0x00, len}});
    const StartupDecodeResult r = DecodeStartupFrame(header);
    EXPECT_EQ(r.status, StartupDecodeStatus::kMalformed) << int{len};
    EXPECT_EQ(r.error, StartupFrameError::kMissingIrdOrd);
  }
  // Rev 2 without the enhanced bit, and Rev 1 with S, need no word.
  EXPECT_EQ(DecodeStartupFrame(Cat({kReqKey, {0x00, 0x02, 0x00, 0x00}})).status,
            StartupDecodeStatus::kComplete);
  EXPECT_EQ(DecodeStartupFrame(Cat({kRepKey, {0x10, 0x01, 0x00, 0x00}})).status,
            StartupDecodeStatus::kComplete);
}

TEST(MpaStartupDecode, ReservedBitsAndRequestRAreNotCheckedOnReception) {
  // RFC 5044 7.1.1: Res "MUST be set to zero when sending, and not checked on
  // reception"; R "is set to zero, and not checked on reception in the MPA
  // Request Frame". Both are reported, neither is an error.
  const Bytes req = Cat({kReqKey, {0x2F, 0x01, 0x00, 0x00}});  // R=1 L=1 Res=0x7 | Rev 1
  const StartupDecodeResult r = DecodeStartupFrame(req);
  ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(r.frame.header.reserved, 0x07);
  EXPECT_TRUE(r.frame.header.large_fpdus);
  EXPECT_TRUE(r.frame.header.reject);
  EXPECT_FALSE(r.frame.header.x_bit);
  // Linux siw's GSO_EXP bit (0x0800) is L, not one of the other Res bits.
  const Bytes siw_gso = Cat({kRepKey, {0x18, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01}});
  const StartupDecodeResult g = DecodeStartupFrame(siw_gso);
  ASSERT_EQ(g.status, StartupDecodeStatus::kComplete);
  EXPECT_EQ(g.frame.header.reserved, 0x00);
  EXPECT_TRUE(g.frame.header.large_fpdus);
  EXPECT_TRUE(IsEnhanced(g.frame.header));
}

TEST(MpaStartupEncode, LinuxSiwRequestExactBytes) {
  StartupFrameSpec spec;
  spec.kind = StartupFrameKind::kRequest;
  spec.revision = 2;
  spec.x_bit = true;
  spec.ird_ord = IrdOrdWord{1, 1, false, false, false, false};
  Bytes out;
  ASSERT_EQ(EncodeStartupFrame(spec, &out), StartupEncodeStatus::kOk);
  EXPECT_EQ(out, kSiwRequest);
  spec.crc = true;
  out.clear();
  ASSERT_EQ(EncodeStartupFrame(spec, &out), StartupEncodeStatus::kOk);
  EXPECT_EQ(out, kSiwRequestCrc);
  spec.crc = false;
  spec.large_fpdus = true;
  out.clear();
  ASSERT_EQ(EncodeStartupFrame(spec, &out), StartupEncodeStatus::kOk);
  EXPECT_EQ(out, kSiwRequestLargeFpdus);
}

TEST(MpaStartupEncode, HeaderEncodesLAndResApart) {
  StartupHeader h;
  h.kind = StartupFrameKind::kReply;
  h.large_fpdus = true;
  h.reserved = 0x0F;  // only the low three bits are Res now
  h.revision = 1;
  std::uint8_t out[kStartupHeaderSize] = {};
  EncodeStartupHeader(h, out);
  EXPECT_EQ(out[16], 0x0F);  // L=1 Res=0x7
  EXPECT_EQ(out[17], 0x01);
  h.large_fpdus = false;
  EncodeStartupHeader(h, out);
  EXPECT_EQ(out[16], 0x07);
}

TEST(MpaStartupEncode, EveryVectorExactBytes) {
  const Bytes abc = Ascii("abc"), no = Ascii("no"), ok = Ascii("ok");
  struct Case {
    StartupFrameSpec spec;
    const Bytes* expected;
  };
  std::vector<Case> cases;
  {
    StartupFrameSpec s;
    s.crc = true;
    s.ulp_private_data = abc;
    cases.push_back({s, &kV1RequestCrcPd});
  }
  {
    StartupFrameSpec s;
    s.kind = StartupFrameKind::kReply;
    s.reject = true;
    s.ulp_private_data = no;
    cases.push_back({s, &kV1RejectReply});
  }
  {
    StartupFrameSpec s;
    s.x_bit = true;
    cases.push_back({s, &kSbitRequest});
  }
  {
    StartupFrameSpec s;
    s.kind = StartupFrameKind::kReply;
    s.markers = true;
    s.x_bit = true;
    cases.push_back({s, &kSbitReply});
  }
  {
    StartupFrameSpec s;
    s.kind = StartupFrameKind::kRtr;
    s.crc = true;
    cases.push_back({s, &kRtrFrame});
  }
  {
    StartupFrameSpec s;
    s.kind = StartupFrameKind::kReply;
    s.crc = true;
    s.x_bit = true;
    s.revision = 2;
    s.ird_ord = IrdOrdWord{0x80, 0x10, true, false, true, false};
    s.ulp_private_data = ok;
    cases.push_back({s, &kV2P2pReply});
  }
  for (const Case& c : cases) {
    Bytes out;
    ASSERT_EQ(EncodeStartupFrame(c.spec, &out), StartupEncodeStatus::kOk);
    EXPECT_EQ(out, *c.expected);
    // And back: the decoder reads what the encoder wrote.
    const StartupDecodeResult r = DecodeStartupFrame(out);
    ASSERT_EQ(r.status, StartupDecodeStatus::kComplete);
    EXPECT_EQ(r.frame.header.kind, c.spec.kind);
    EXPECT_EQ(r.frame.header.markers, c.spec.markers);
    EXPECT_EQ(r.frame.header.crc, c.spec.crc);
    EXPECT_EQ(r.frame.header.reject, c.spec.reject);
    EXPECT_EQ(r.frame.header.x_bit, c.spec.x_bit);
    EXPECT_EQ(r.frame.header.revision, c.spec.revision);
    EXPECT_EQ(r.frame.ird_ord, c.spec.ird_ord);
    EXPECT_EQ(Bytes(r.frame.ulp_private_data.begin(), r.frame.ulp_private_data.end()),
              Bytes(c.spec.ulp_private_data.begin(), c.spec.ulp_private_data.end()));
  }
}

TEST(MpaStartupEncode, AppendsAfterExistingOctets) {
  Bytes out = {0xEE};
  StartupFrameSpec s;
  s.x_bit = true;
  ASSERT_EQ(EncodeStartupFrame(s, &out), StartupEncodeStatus::kOk);
  EXPECT_EQ(out, Cat({{0xEE}, kSbitRequest}));
}

TEST(MpaStartupEncode, RefusesWhatASenderMustNotSend) {
  const Bytes pd512(512, 0x11), pd513(513, 0x11), pd508(508, 0x22), pd509(509, 0x22);
  struct Case {
    StartupFrameSpec spec;
    StartupEncodeStatus expected;
  };
  std::vector<Case> cases;
  StartupFrameSpec base;
  {
    StartupFrameSpec s = base;
    s.revision = 0;
    cases.push_back({s, StartupEncodeStatus::kBadRevision});
    s.revision = 3;
    cases.push_back({s, StartupEncodeStatus::kBadRevision});
  }
  {
    StartupFrameSpec s = base;
    s.kind = StartupFrameKind::kRtr;
    s.revision = 2;
    cases.push_back({s, StartupEncodeStatus::kBadRevision});
  }
  {
    StartupFrameSpec s = base;
    s.reject = true;
    cases.push_back({s, StartupEncodeStatus::kRejectInRequest});
  }
  {
    StartupFrameSpec s = base;
    s.kind = StartupFrameKind::kRtr;
    s.x_bit = true;
    cases.push_back({s, StartupEncodeStatus::kBadRtrFlags});
    s.x_bit = false;
    s.reject = true;
    cases.push_back({s, StartupEncodeStatus::kBadRtrFlags});
    s.reject = false;
    s.large_fpdus = true;
    cases.push_back({s, StartupEncodeStatus::kBadRtrFlags});
  }
  {
    StartupFrameSpec s = base;  // Rev 2 + enhanced without the word
    s.revision = 2;
    s.x_bit = true;
    cases.push_back({s, StartupEncodeStatus::kIrdOrdMismatch});
    s.x_bit = false;  // the word without the enhanced bit
    s.ird_ord = IrdOrdWord{};
    cases.push_back({s, StartupEncodeStatus::kIrdOrdMismatch});
    s.revision = 1;  // the word in Rev 1 (with S)
    s.x_bit = true;
    cases.push_back({s, StartupEncodeStatus::kIrdOrdMismatch});
  }
  {
    StartupFrameSpec s = base;
    s.revision = 2;
    s.x_bit = true;
    s.ird_ord = IrdOrdWord{0x4000, 0, false, false, false, false};
    cases.push_back({s, StartupEncodeStatus::kIrdOrdOutOfRange});
    s.ird_ord = IrdOrdWord{0, 0x4000, false, false, false, false};
    cases.push_back({s, StartupEncodeStatus::kIrdOrdOutOfRange});
    s.ird_ord = IrdOrdWord{0x3FFF, 0x3FFF, false, false, false, false};
    cases.push_back({s, StartupEncodeStatus::kOk});
    s.ulp_private_data = pd508;
    cases.push_back({s, StartupEncodeStatus::kOk});
    s.ulp_private_data = pd509;
    cases.push_back({s, StartupEncodeStatus::kPrivateDataTooLong});
  }
  {
    // RFC 6581 9.2: "If Control Flag A is set to 0, then Control Flags B, C,
    // and D MUST also be set to 0."
    StartupFrameSpec s = base;
    s.revision = 2;
    s.x_bit = true;
    s.ird_ord = IrdOrdWord{1, 1, false, true, false, false};
    cases.push_back({s, StartupEncodeStatus::kRtrFlagsWithoutPeerToPeer});
    s.ird_ord = IrdOrdWord{1, 1, false, false, true, false};
    cases.push_back({s, StartupEncodeStatus::kRtrFlagsWithoutPeerToPeer});
    s.ird_ord = IrdOrdWord{1, 1, false, false, false, true};
    cases.push_back({s, StartupEncodeStatus::kRtrFlagsWithoutPeerToPeer});
    s.ird_ord = IrdOrdWord{1, 1, true, true, true, true};
    cases.push_back({s, StartupEncodeStatus::kOk});
    s.ird_ord = IrdOrdWord{1, 1, true, false, false, false};  // A alone is legal on the wire
    cases.push_back({s, StartupEncodeStatus::kOk});
  }
  {
    StartupFrameSpec s = base;
    s.ulp_private_data = pd512;
    cases.push_back({s, StartupEncodeStatus::kOk});
    s.ulp_private_data = pd513;
    cases.push_back({s, StartupEncodeStatus::kPrivateDataTooLong});
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Bytes out = {0x01, 0x02};
    EXPECT_EQ(EncodeStartupFrame(cases[i].spec, &out), cases[i].expected) << "case " << i;
    if (cases[i].expected != StartupEncodeStatus::kOk) {
      EXPECT_EQ(out, (Bytes{0x01, 0x02})) << "case " << i << " must leave the output alone";
    } else {
      const std::size_t pd =
          (cases[i].spec.ird_ord ? 4 : 0) + cases[i].spec.ulp_private_data.size();
      EXPECT_EQ(out.size(), 2 + kStartupHeaderSize + pd) << "case " << i;
    }
  }
}

TEST(MpaStartupEncode, HeaderEncoderWritesResAsGiven) {
  StartupHeader h;
  h.kind = StartupFrameKind::kReply;
  h.large_fpdus = true;  // 0x08 of the octet
  h.reserved = 0x02;
  h.revision = 1;
  h.pd_length = 0x0102;
  std::uint8_t out[kStartupHeaderSize];
  EncodeStartupHeader(h, out);
  EXPECT_EQ(Bytes(out, out + kStartupHeaderSize), Cat({kRepKey, {0x0A, 0x01, 0x01, 0x02}}));
}

TEST(MpaStartupNames, ArePinned) {
  EXPECT_EQ(StartupFrameKey(StartupFrameKind::kRtr), "MPA ID RtR Frame");
  EXPECT_EQ(StartupFrameKindName(StartupFrameKind::kReply), "MPA Reply");
  EXPECT_EQ(StartupFrameErrorName(StartupFrameError::kPrivateDataTooLong), "PD_Length exceeds 512");
  EXPECT_EQ(StartupEncodeStatusName(StartupEncodeStatus::kRejectInRequest),
            "R must be zero in a Request");
  EXPECT_EQ(StartupEncodeStatusName(StartupEncodeStatus::kBadRtrFlags),
            "R, S and L must be zero in an Rtr frame");
  EXPECT_EQ(StartupEncodeStatusName(StartupEncodeStatus::kRtrFlagsWithoutPeerToPeer),
            "RTR flags B, C, D must be zero when A is zero");
}

}  // namespace
}  // namespace siwx::mpa
