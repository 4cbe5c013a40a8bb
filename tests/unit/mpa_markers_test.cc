// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// MPA marker format and marker-grid arithmetic (RFC 5044 4.3, 7.1.2 rule 7).
#include "common/wire/mpa_markers.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace siwx::mpa {
namespace {

TEST(MpaMarker, EncodeIsReservedThenFpduPtrBigEndian) {
  std::array<std::uint8_t, 4> out{};
  ASSERT_TRUE(EncodeMarker(Marker{0x0000, 0x01F4}, out));
  EXPECT_EQ(out, (std::array<std::uint8_t, 4>{
                     0x00, 0x00,   // RESERVED
                     0x01, 0xF4,   // FPDUPTR = 500
                 }));
  ASSERT_TRUE(EncodeMarker(Marker{0xA55A, 0xFFFC}, out));
  EXPECT_EQ(out, (std::array<std::uint8_t, 4>{0xA5, 0x5A, 0xFF, 0xFC}));
}

TEST(MpaMarker, EncodeRefusesShortBufferAndWritesNothing) {
  std::array<std::uint8_t, 3> out{0x11, 0x22, 0x33};
  EXPECT_FALSE(EncodeMarker(Marker{0, 4}, out));
  EXPECT_EQ(out, (std::array<std::uint8_t, 3>{0x11, 0x22, 0x33}));
}

TEST(MpaMarker, DecodeReadsBothHalves) {
  const std::array<std::uint8_t, 4> in = {
      0x00, 0x07,   // RESERVED (non-zero: kept for diagnostics)
      0x02, 0x08,   // FPDUPTR = 520
  };
  const auto m = DecodeMarker(in);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->reserved, 0x0007);
  EXPECT_EQ(m->fpdu_ptr, 0x0208);
}

TEST(MpaMarker, DecodeRejectsEveryShortPrefix) {
  const std::array<std::uint8_t, 4> in = {0x00, 0x00, 0x00, 0x10};
  for (std::size_t n = 0; n < in.size(); ++n) {
    EXPECT_FALSE(DecodeMarker(ByteSpan(in).first(n)).has_value()) << n;
  }
}

TEST(MpaMarker, FirstMarkerIsAllZero) {
  // RFC 5044 7.1.2 rule 7: "the special Marker 0x00000000".
  EXPECT_EQ(kFirstMarkerOctets, (std::array<std::uint8_t, 4>{0, 0, 0, 0}));
  EXPECT_EQ(DecodeMarker(kFirstMarkerOctets), (Marker{0, 0}));
}

TEST(MarkerGrid, OctetsBeforeNextMarker) {
  EXPECT_EQ(OctetsBeforeNextMarker(0), 0u);    // a marker is due now
  EXPECT_EQ(OctetsBeforeNextMarker(4), 508u);  // just after a marker
  EXPECT_EQ(OctetsBeforeNextMarker(1), 511u);
  EXPECT_EQ(OctetsBeforeNextMarker(511), 1u);
  EXPECT_EQ(OctetsBeforeNextMarker(512), 0u);  // taken modulo the interval
}

TEST(MarkerGrid, AdvanceWrapsAtTheInterval) {
  EXPECT_EQ(AdvanceGridOffset(0, 0), 0u);
  EXPECT_EQ(AdvanceGridOffset(508, 4), 0u);
  EXPECT_EQ(AdvanceGridOffset(500, 20), 8u);
  EXPECT_EQ(AdvanceGridOffset(3, 512 * 7 + 1), 4u);
  EXPECT_EQ(AdvanceGridOffset(0, 0xFFFFFFFFFFull), 0xFFFFFFFFFFull % 512);
}

// Counts markers by walking the FPDU octet by octet, the way RFC 5044 4.3
// describes placement: a marker before any octet that would sit on a
// multiple of 512.
std::size_t CountMarkersSlowly(std::uint32_t grid_offset, std::size_t unmarked) {
  std::size_t pos = grid_offset;
  std::size_t markers = 0;
  for (std::size_t i = 0; i < unmarked; ++i) {
    if (pos % 512 == 0) {
      ++markers;
      pos += 4;
    }
    ++pos;
  }
  return markers;
}

TEST(MarkerGrid, MarkersInFpduMatchesOctetWalkAtEveryOffset) {
  for (std::uint32_t offset = 0; offset < 512; ++offset) {
    for (std::size_t len : {0u, 1u, 8u, 12u, 504u, 505u, 508u, 509u, 512u, 1016u, 1017u,
                            1020u, 1024u, 1500u, 9000u, 65544u}) {
      ASSERT_EQ(MarkersInFpdu(offset, len), CountMarkersSlowly(offset, len))
          << "offset " << offset << " len " << len;
    }
  }
}

TEST(MarkerGrid, MarkerAtTheStartBelongsToTheFpduOneAtTheEndDoesNot) {
  // Grid offset 0: the marker due at the first octet is inside this FPDU.
  EXPECT_EQ(MarkersInFpdu(0, 8), 1u);
  // 504 octets starting at offset 8 end exactly on the next marker position:
  // that marker precedes the next FPDU, not this one.
  EXPECT_EQ(MarkersInFpdu(8, 504), 0u);
  EXPECT_EQ(MarkersInFpdu(8, 505), 1u);
  // 508 octets after a marker fill the interval; the 509th needs the next one.
  EXPECT_EQ(MarkersInFpdu(4, 508), 0u);
  EXPECT_EQ(MarkersInFpdu(4, 509), 1u);
  // From the stream start: marker, 508 octets, marker, 508 octets.
  EXPECT_EQ(MarkersInFpdu(0, 1016), 2u);
  EXPECT_EQ(MarkersInFpdu(0, 1017), 3u);
}

TEST(MarkerGrid, FpduPtrMatchesIgnoresTheLowTwoBits) {
  EXPECT_TRUE(FpduPtrMatches(0x0000, 0));
  EXPECT_TRUE(FpduPtrMatches(0x01F4, 500));
  EXPECT_TRUE(FpduPtrMatches(0x01F7, 500));  // low bits read as zero
  EXPECT_TRUE(FpduPtrMatches(0x01F4, 503));
  EXPECT_FALSE(FpduPtrMatches(0x01F0, 500));
  EXPECT_FALSE(FpduPtrMatches(0x01F8, 500));
  EXPECT_FALSE(FpduPtrMatches(0x0000, 4));
  EXPECT_TRUE(FpduPtrMatches(0xFFFC, 0xFFFC));
  // A distance no 16-bit field can hold never matches, not even modulo 2^16.
  EXPECT_FALSE(FpduPtrMatches(0x0000, 0x10000));
  EXPECT_FALSE(FpduPtrMatches(0x0004, 0x10004));
}

}  // namespace
}  // namespace siwx::mpa
