// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// MPA FPDU framing for transmit (RFC 5044 4.1, 4.3, 4.4) and MULPDU (4.5).
//
// Expected FPDUs come from a reference model written here from the RFC text:
// a bitwise CRC32c (RFC 3720 B.4 parameters, checked against its vectors
// below) and an octet-by-octet marker insertion. The library's CRC and grid
// arithmetic are not used to compute any expectation.
#include "common/wire/fpdu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "test_tools/fpdu_reference.h"
#include "test_tools/mpa_crc_vectors.h"

namespace siwx::mpa {
namespace {

using reference::Bytes;

TEST(FramingReference, CrcModelMatchesRfc3720Vectors) {
  EXPECT_EQ(reference::Crc32c(Bytes(32, 0x00)), 0x8A9136AAu);
  EXPECT_EQ(reference::Crc32c(Bytes(32, 0xFF)), 0x62A8AB43u);
  Bytes inc(32);
  std::iota(inc.begin(), inc.end(), std::uint8_t{0});
  EXPECT_EQ(reference::Crc32c(inc), 0x46DD794Eu);
}

Bytes Flatten(std::span<const IoSlice> slices) {
  Bytes out;
  for (const IoSlice& s : slices) out.insert(out.end(), s.base, s.base + s.len);
  return out;
}

Bytes Pattern(std::size_t n, std::uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

Bytes Concat(const Bytes& a, const Bytes& b) {
  Bytes out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// --- Hand-written vectors -------------------------------------------------

// An untagged RDMAP Send: 18-octet DDP header, 4 payload octets.
const Bytes kSendHeader = {
    0x41,                    // DDP control: T=0, L=1, DV=01
    0x43,                    // RDMAP control: RV=01, opcode 3 (Send)
    0x00, 0x00, 0x00, 0x00,  // RsvdULP (Send: reserved)
    0x00, 0x00, 0x00, 0x00,  // QN = 0
    0x00, 0x00, 0x00, 0x01,  // MSN = 1
    0x00, 0x00, 0x00, 0x00,  // MO = 0
};
const Bytes kSendPayload = {0x61, 0x62, 0x63, 0x64};  // "abcd"

TEST(FpduFramer, HandWrittenSendWithCrc) {
  FpduFramer framer({.crc_enabled = true, .markers_enabled = false});
  FpduFrame frame;
  const ByteSpan payload[] = {kSendPayload};
  ASSERT_EQ(framer.Frame(kSendHeader, payload, frame), FrameStatus::kOk);
  const Bytes expected = {
      0x00, 0x16,                                      // ULPDU_Length = 22
      0x41, 0x43, 0x00, 0x00, 0x00, 0x00,              // DDP/RDMAP control, RsvdULP
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,  // QN 0, MSN 1
      0x00, 0x00, 0x00, 0x00,                          // MO 0
      0x61, 0x62, 0x63, 0x64,                          // payload "abcd"
                                                       // no pad: 2 + 22 = 24
      0x71, 0x64, 0x4d, 0x92,                          // CRC32c 0x924D6471, LSB first
  };
  EXPECT_EQ(Flatten(frame.slices()), expected);
  EXPECT_EQ(frame.crc(), 0x924D6471u);
  EXPECT_EQ(frame.ulpdu_length(), 22u);
  EXPECT_EQ(frame.wire_length(), 28u);
  EXPECT_EQ(frame.marker_count(), 0u);
}

TEST(FpduFramer, HandWrittenTaggedWriteWithThreePadOctets) {
  const Bytes header = {
      0xC1,                                            // DDP control: T=1, L=1, DV=01
      0x40,                                            // RDMAP control: RV=01, Write
      0x12, 0x34, 0x56, 0x78,                          // STag
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,  // TO = 0x1000
  };
  const Bytes data = {0x5A};
  FpduFramer framer({.crc_enabled = true});
  FpduFrame frame;
  const ByteSpan payload[] = {data};
  ASSERT_EQ(framer.Frame(header, payload, frame), FrameStatus::kOk);
  const Bytes expected = {
      0x00, 0x0F,                                      // ULPDU_Length = 15
      0xC1, 0x40, 0x12, 0x34, 0x56, 0x78,              // controls, STag
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,  // TO
      0x5A,                                            // payload
      0x00, 0x00, 0x00,                                // pad: 2 + 15 = 17 -> 20
      0x26, 0xE8, 0x59, 0xEC,                          // CRC32c 0xEC59E826, LSB first
  };
  EXPECT_EQ(Flatten(frame.slices()), expected);
  EXPECT_EQ(frame.crc(), 0xEC59E826u);
}

TEST(FpduFramer, CrcOffSendsAZeroCrcField) {
  FpduFramer framer({.crc_enabled = false});
  FpduFrame frame;
  const ByteSpan payload[] = {kSendPayload};
  ASSERT_EQ(framer.Frame(kSendHeader, payload, frame), FrameStatus::kOk);
  const Bytes wire = Flatten(frame.slices());
  ASSERT_EQ(wire.size(), 28u);
  EXPECT_EQ(Bytes(wire.end() - 4, wire.end()), (Bytes{0, 0, 0, 0}));
  EXPECT_EQ(frame.crc(), 0u);
  EXPECT_EQ(wire, reference::UnmarkedFpdu(Concat(kSendHeader, kSendPayload), false));
}

// --- Lengths and pad --------------------------------------------------------

TEST(FpduLengths, PadMakesLengthFieldPlusUlpduAMultipleOfFour) {
  EXPECT_EQ(PadLength(2), 0u);  // 2 + 2 = 4
  EXPECT_EQ(PadLength(1), 1u);
  EXPECT_EQ(PadLength(0), 2u);
  EXPECT_EQ(PadLength(3), 3u);
  EXPECT_EQ(PadLength(22), 0u);
  EXPECT_EQ(PadLength(65535), 3u);
  EXPECT_EQ(UnmarkedFpduLength(0), 8u);
  EXPECT_EQ(UnmarkedFpduLength(22), 28u);
  EXPECT_EQ(UnmarkedFpduLength(65535), 65544u);
  EXPECT_EQ(FpduWireLength(22, false, 0), 28u);
  EXPECT_EQ(FpduWireLength(22, true, 0), 32u);    // first marker ahead of it
  EXPECT_EQ(FpduWireLength(22, true, 4), 28u);
  EXPECT_EQ(FpduWireLength(22, true, 500), 32u);  // marker 12 octets in
}

TEST(FpduFramer, EveryPadLengthWithCrc) {
  for (std::size_t payload_len = 0; payload_len < 8; ++payload_len) {
    const Bytes header = Pattern(18, 1);
    const Bytes data = Pattern(payload_len, 2);
    FpduFramer framer({.crc_enabled = true});
    FpduFrame frame;
    const ByteSpan payload[] = {data};
    ASSERT_EQ(framer.Frame(header, payload, frame), FrameStatus::kOk);
    const Bytes wire = Flatten(frame.slices());
    EXPECT_EQ(wire, reference::UnmarkedFpdu(Concat(header, data), true)) << payload_len;
    EXPECT_EQ(wire.size() % 4, 0u);
    const std::size_t pad = (4 - (2 + 18 + payload_len) % 4) % 4;
    EXPECT_EQ(wire.size(), 2 + 18 + payload_len + pad + 4);
  }
}

TEST(FpduFramer, UlpduLengthZero) {
  FpduFramer framer({.crc_enabled = true});
  FpduFrame frame;
  ASSERT_EQ(framer.Frame({}, {}, frame), FrameStatus::kOk);
  const Bytes zero_fpdu = reference::UnmarkedFpdu({}, true);
  ASSERT_EQ(zero_fpdu.size(), 8u);  // length 00 00, pad 00 00, CRC
  EXPECT_EQ(Flatten(frame.slices()), zero_fpdu);
  EXPECT_EQ(frame.ulpdu_length(), 0u);
}

// --- Scatter list -----------------------------------------------------------

// FrameCopy (a Read Response with CRC on): the copy is framed instead of the
// pieces, and the FPDU on the wire is the one Frame would send, CRC
// included, whether the CRC is fused with the copy (no markers) or not.
TEST(FpduFramer, FrameCopySendsTheSameFpduFromTheCopy) {
  const Bytes header = Pattern(14, 30);
  // Pieces across the framer's 8 KiB copy chunks, and a 3-octet tail (pad 1).
  Bytes a = Pattern(5000, 31);
  const Bytes b = Pattern(20000, 32);
  const Bytes c = Pattern(3, 33);
  const Bytes ulpdu = Concat(Concat(Concat(header, a), b), c);
  const ByteSpan payload[] = {a, ByteSpan{}, b, c};
  for (const bool crc : {true, false}) {
    for (const bool markers : {false, true}) {
      SCOPED_TRACE(testing::Message() << "crc " << crc << " markers " << markers);
      FpduFramer framer({.crc_enabled = crc, .markers_enabled = markers,
                         .marker_grid_offset = 100});
      Bytes copy(UnmarkedFpduLength(ulpdu.size()), 0xEE);
      FpduFrame frame;
      ASSERT_EQ(framer.FrameCopy(header, payload, copy.data(), frame), FrameStatus::kOk);
      // The whole unmarked FPDU is laid out in the copy (with markers, its
      // CRC field holds the CRC over the marked FPDU, RFC 5044 4.3, 4.4); without
      // markers it is the one slice (one iovec for sendmsg).
      const Bytes unmarked = reference::UnmarkedFpdu(ulpdu, crc);
      EXPECT_TRUE(std::equal(copy.begin(), copy.end() - kCrcSize, unmarked.begin()));
      if (!markers) {
        EXPECT_EQ(copy, unmarked);
        ASSERT_EQ(frame.slices().size(), 1u);
        EXPECT_EQ(frame.slices()[0].base, copy.data());
      }
      for (const IoSlice& slice : frame.slices()) {
        for (const Bytes* piece : std::array<const Bytes*, 3>{&a, &b, &c}) {
          EXPECT_FALSE(slice.base >= piece->data() && slice.base < piece->data() + piece->size())
              << "a slice points at a source piece";
        }
      }
      const Bytes expected = markers ? reference::MarkedFpdu(ulpdu, crc, 100)
                                     : reference::UnmarkedFpdu(ulpdu, crc);
      EXPECT_EQ(Flatten(frame.slices()), expected);
      // The copy is what goes out: changing a source afterwards changes nothing.
      a[0] ^= 0xFF;
      EXPECT_EQ(Flatten(frame.slices()), expected);
      a[0] ^= 0xFF;
    }
  }
}

TEST(FpduFramer, FrameCopyWithoutPayloadLaysOutHeaderPadAndCrc) {
  const Bytes header = Pattern(28, 34);
  FpduFramer framer({.crc_enabled = true});
  FpduFrame frame;
  Bytes copy(UnmarkedFpduLength(header.size()) + 1, 0x5A);
  ASSERT_EQ(framer.FrameCopy(header, {}, copy.data(), frame), FrameStatus::kOk);
  EXPECT_EQ(copy.back(), 0x5A);  // nothing past the FPDU
  copy.pop_back();
  EXPECT_EQ(copy, reference::UnmarkedFpdu(header, true));
  EXPECT_EQ(Flatten(frame.slices()), copy);
}

TEST(FpduFramer, RefusedFrameCopyWritesNothing) {
  const Bytes header = Pattern(14, 35);
  const Bytes big = Pattern(kMaxUlpduLength, 36);
  const ByteSpan payload[] = {big};
  FpduFramer framer({.crc_enabled = true});
  FpduFrame frame;
  Bytes copy(16, 0x5A);
  ASSERT_EQ(framer.FrameCopy(header, payload, copy.data(), frame), FrameStatus::kUlpduTooLong);
  EXPECT_EQ(copy, Bytes(16, 0x5A));
}

TEST(FpduFramer, ScatterListReferencesCallerMemoryWithoutCopying) {
  const Bytes header = Pattern(14, 3);
  const Bytes a = Pattern(100, 4);
  const Bytes b = Pattern(7, 5);
  FpduFramer framer({.crc_enabled = true});
  FpduFrame frame;
  const ByteSpan payload[] = {a, ByteSpan{}, b};  // the empty piece is skipped
  ASSERT_EQ(framer.Frame(header, payload, frame), FrameStatus::kOk);
  const auto slices = frame.slices();
  ASSERT_EQ(slices.size(), 5u);  // length, header, a, b, pad+CRC
  EXPECT_EQ(slices[0].len, 2u);
  EXPECT_EQ(slices[1].base, header.data());
  EXPECT_EQ(slices[1].len, 14u);
  EXPECT_EQ(slices[2].base, a.data());
  EXPECT_EQ(slices[2].len, 100u);
  EXPECT_EQ(slices[3].base, b.data());
  EXPECT_EQ(slices[3].len, 7u);
  EXPECT_EQ(slices[4].len, 1u + 4u);  // 2 + 121 = 123 -> pad 1, then CRC
  EXPECT_EQ(Flatten(slices), reference::UnmarkedFpdu(Concat(Concat(header, a), b), true));
}

TEST(FpduFramer, MarkerSplitsAPayloadPieceInTwo) {
  // Offset 8 on the grid: the marker is due 504 octets in, inside the payload.
  const Bytes header = Pattern(18, 6);
  const Bytes data = Pattern(1000, 7);
  FpduFramer framer({.crc_enabled = false, .markers_enabled = true, .marker_grid_offset = 8});
  FpduFrame frame;
  const ByteSpan payload[] = {data};
  ASSERT_EQ(framer.Frame(header, payload, frame), FrameStatus::kOk);
  const auto slices = frame.slices();
  // length(2) header(18) data[0,484) marker data[484,992) marker data[992,1000) pad+CRC
  ASSERT_EQ(slices.size(), 8u);
  EXPECT_EQ(slices[2].base, data.data());
  EXPECT_EQ(slices[2].len, 484u);
  EXPECT_EQ(slices[3].len, 4u);
  EXPECT_EQ(slices[4].base, data.data() + 484);
  EXPECT_EQ(slices[4].len, 508u);
  EXPECT_EQ(slices[6].base, data.data() + 992);
  EXPECT_EQ(frame.marker_count(), 2u);
}

// --- Markers ----------------------------------------------------------------

TEST(FpduFramer, StreamStartBeginsWithTheSpecialFirstMarker) {
  FpduFramer framer({.crc_enabled = true, .markers_enabled = true, .marker_grid_offset = 0});
  FpduFrame frame;
  const ByteSpan payload[] = {kSendPayload};
  ASSERT_EQ(framer.Frame(kSendHeader, payload, frame), FrameStatus::kOk);
  const Bytes wire = Flatten(frame.slices());
  ASSERT_EQ(wire.size(), 32u);
  EXPECT_EQ(Bytes(wire.begin(), wire.begin() + 6),
            (Bytes{0x00, 0x00, 0x00, 0x00,   // first marker 0x00000000 (7.1.2 rule 7)
                   0x00, 0x16}));            // then ULPDU_Length
  // The CRC covers the marker (RFC 5044 4.3, 4.4): 0xE17F4FF6, not the
  // 0x924D6471 of the same FPDU without it (test_tools/mpa_crc_vectors.h).
  EXPECT_EQ(Bytes(wire.end() - 4, wire.end()), (Bytes{0xf6, 0x4f, 0x7f, 0xe1}));
  EXPECT_EQ(framer.marker_grid_offset(), 32u);
}

TEST(FpduFramer, MarkerInsideAnFpduPointsBackToUlpduLength) {
  // The FPDU starts 16 octets before a marker position.
  const Bytes ulpdu = Pattern(40, 8);
  FpduFramer framer({.crc_enabled = true, .markers_enabled = true, .marker_grid_offset = 496});
  FpduFrame frame;
  const ByteSpan payload[] = {ByteSpan(ulpdu).subspan(18)};
  ASSERT_EQ(framer.Frame(ByteSpan(ulpdu).first(18), payload, frame), FrameStatus::kOk);
  const Bytes wire = Flatten(frame.slices());
  ASSERT_EQ(wire.size(), 2u + 40u + 2u + 4u + 4u);
  EXPECT_EQ(Bytes(wire.begin() + 16, wire.begin() + 20),
            (Bytes{0x00, 0x00, 0x00, 0x10}));  // FPDUPTR = 16
  // Without the marker the octets are the plain FPDU, up to the CRC, which
  // covers the marker too.
  Bytes unmarked = wire;
  unmarked.erase(unmarked.begin() + 16, unmarked.begin() + 20);
  const Bytes plain = reference::UnmarkedFpdu(ulpdu, true);
  EXPECT_EQ(Bytes(unmarked.begin(), unmarked.end() - 4), Bytes(plain.begin(), plain.end() - 4));
  EXPECT_EQ(wire, reference::MarkedFpdu(ulpdu, true, 496));
}

// RFC 5044 4.3, 4.4: the CRC covers the FPDU as sent, markers included.
// The expected octets, CRC included, were derived apart from this code
// (test_tools/mpa_crc_vectors.h says how).
TEST(FpduFramer, CrcCoversTheFirstMarkerInFrontOfTheFpdu) {
  FpduFramer framer({.crc_enabled = true, .markers_enabled = true, .marker_grid_offset = 0});
  FpduFrame frame;
  const ByteSpan payload[] = {ByteSpan(crc_vectors::kSendUlpdu).subspan(18)};
  ASSERT_EQ(framer.Frame(ByteSpan(crc_vectors::kSendUlpdu).first(18), payload, frame),
            FrameStatus::kOk);
  EXPECT_EQ(Flatten(frame.slices()), crc_vectors::kSendAfterFirstMarker);
  EXPECT_EQ(frame.crc(), 0xE17F4FF6u);
}

TEST(FpduFramer, CrcCoversAMarkerInsideTheUlpdu) {
  FpduFramer framer({.crc_enabled = true, .markers_enabled = true, .marker_grid_offset = 504});
  FpduFrame frame;
  ASSERT_EQ(framer.Frame(crc_vectors::kWriteUlpdu, {}, frame), FrameStatus::kOk);
  EXPECT_EQ(Flatten(frame.slices()), crc_vectors::kWriteWithMarkerInUlpdu);
}

TEST(FpduFramer, CrcCoversAMarkerBetweenPadAndCrc) {
  FpduFramer framer({.crc_enabled = true, .markers_enabled = true, .marker_grid_offset = 492});
  FpduFrame frame;
  const ByteSpan payload[] = {ByteSpan(crc_vectors::kWriteUlpdu).subspan(14)};
  ASSERT_EQ(framer.Frame(ByteSpan(crc_vectors::kWriteUlpdu).first(14), payload, frame),
            FrameStatus::kOk);
  EXPECT_EQ(Flatten(frame.slices()), crc_vectors::kWriteWithMarkerBeforeCrc);
}

TEST(FpduFramer, MarkerOnTheBoundaryBelongsToTheNextFpduWithPointerZero) {
  // First FPDU: 508 octets from grid offset 4, so it ends exactly where the
  // next marker is due. That marker goes out in front of the second FPDU.
  FpduFramer framer({.crc_enabled = true, .markers_enabled = true, .marker_grid_offset = 4});
  const Bytes first_ulpdu = Pattern(508 - 8, 9);
  ASSERT_EQ(UnmarkedFpduLength(first_ulpdu.size()), 508u);
  FpduFrame first;
  ASSERT_EQ(framer.Frame(first_ulpdu, {}, first), FrameStatus::kOk);
  EXPECT_EQ(first.marker_count(), 0u);
  EXPECT_EQ(first.wire_length(), 508u);
  EXPECT_EQ(framer.marker_grid_offset(), 0u);

  FpduFrame second;
  const Bytes second_ulpdu = Pattern(20, 10);
  ASSERT_EQ(framer.Frame(second_ulpdu, {}, second), FrameStatus::kOk);
  const Bytes wire = Flatten(second.slices());
  EXPECT_EQ(Bytes(wire.begin(), wire.begin() + 6),
            (Bytes{0x00, 0x00, 0x00, 0x00,   // marker, FPDUPTR 0: points at this FPDU
                   0x00, 0x14}));            // ULPDU_Length = 20
  EXPECT_EQ(second.marker_count(), 1u);
}

TEST(FpduFramer, SecondMarkerInAnFpduCountsTheFirstMarkersOctets) {
  // From grid offset 100: markers 412, 924 and 1436 wire octets in.
  const Bytes ulpdu = Pattern(1500, 11);
  FpduFramer framer({.markers_enabled = true, .marker_grid_offset = 100});
  FpduFrame frame;
  ASSERT_EQ(framer.Frame(ulpdu, {}, frame), FrameStatus::kOk);
  const Bytes wire = Flatten(frame.slices());
  EXPECT_EQ(Bytes(wire.begin() + 412, wire.begin() + 416), (Bytes{0, 0, 0x01, 0x9C}));  // 412
  EXPECT_EQ(Bytes(wire.begin() + 924, wire.begin() + 928), (Bytes{0, 0, 0x03, 0x9C}));  // 924
  EXPECT_EQ(frame.marker_count(), 3u);
  EXPECT_EQ(Bytes(wire.begin() + 1436, wire.begin() + 1440), (Bytes{0, 0, 0x05, 0x9C}));
}

TEST(FpduFramer, MarkersAtEveryGridOffsetMatchTheReferenceModel) {
  for (std::size_t ulpdu_len : {0u, 1u, 22u, 499u, 500u, 1000u, 1442u, 3000u}) {
    const Bytes ulpdu = Pattern(ulpdu_len, static_cast<std::uint32_t>(ulpdu_len));
    const Bytes unmarked = reference::UnmarkedFpdu(ulpdu, true);
    for (std::uint32_t offset = 0; offset < 512; ++offset) {
      FpduFramer framer({.crc_enabled = true, .markers_enabled = true,
                         .marker_grid_offset = offset});
      FpduFrame frame;
      const std::size_t split = std::min<std::size_t>(ulpdu_len, 18);
      const ByteSpan payload[] = {ByteSpan(ulpdu).subspan(split)};
      ASSERT_EQ(framer.Frame(ByteSpan(ulpdu).first(split), payload, frame), FrameStatus::kOk);
      const Bytes expected = reference::MarkedFpdu(ulpdu, true, offset);
      ASSERT_EQ(Flatten(frame.slices()), expected) << "len " << ulpdu_len << " offset " << offset;
      ASSERT_EQ(frame.wire_length(), expected.size());
      ASSERT_EQ(frame.marker_count(), (expected.size() - unmarked.size()) / 4);
      ASSERT_EQ(framer.marker_grid_offset(), (offset + expected.size()) % 512);
    }
  }
}

TEST(FpduFramer, ConsecutiveFpdusFollowOneGrid) {
  // A stream of FPDUs of many sizes framed back to back equals the reference
  // model applied to each FPDU at its running stream position.
  std::mt19937 rng(12);
  FpduFramer framer({.crc_enabled = true, .markers_enabled = true});
  Bytes stream;
  Bytes expected;
  std::size_t pos = 0;
  for (int i = 0; i < 200; ++i) {
    const Bytes ulpdu = Pattern(rng() % 2000, static_cast<std::uint32_t>(i));
    FpduFrame frame;
    ASSERT_EQ(framer.Frame(ulpdu, {}, frame), FrameStatus::kOk);
    const Bytes wire = Flatten(frame.slices());
    stream.insert(stream.end(), wire.begin(), wire.end());
    const Bytes ref =
        reference::MarkedFpdu(ulpdu, true, static_cast<std::uint32_t>(pos % 512));
    expected.insert(expected.end(), ref.begin(), ref.end());
    pos += ref.size();
  }
  EXPECT_EQ(stream, expected);
  // Every marker position of the stream holds a marker with a zero reserved half.
  for (std::size_t at = 0; at < stream.size(); at += 512) {
    EXPECT_EQ(stream[at], 0u);
    EXPECT_EQ(stream[at + 1], 0u);
    EXPECT_EQ(stream[at + 3] & 3u, 0u);  // FPDUPTR low bits are zero
  }
}

TEST(FpduFramer, DirectionsAreIndependent) {
  // Each half-connection has its own framer: markers on one side do not move
  // the other side's octets.
  FpduFramer a_to_b({.crc_enabled = true, .markers_enabled = true});
  FpduFramer b_to_a({.crc_enabled = true, .markers_enabled = false});
  const Bytes ulpdu = Pattern(600, 13);
  for (int i = 0; i < 5; ++i) {
    FpduFrame fa;
    FpduFrame fb;
    ASSERT_EQ(a_to_b.Frame(ulpdu, {}, fa), FrameStatus::kOk);
    ASSERT_EQ(b_to_a.Frame(ulpdu, {}, fb), FrameStatus::kOk);
    EXPECT_EQ(Flatten(fb.slices()), reference::UnmarkedFpdu(ulpdu, true));
    EXPECT_GT(fa.marker_count(), 0u);
  }
  EXPECT_EQ(b_to_a.marker_grid_offset(), (5 * 608) % 512);  // counts, never inserts
}

// --- Limits -----------------------------------------------------------------

TEST(FpduFramer, LargestUlpduWithoutMarkers) {
  const Bytes ulpdu = Pattern(65535, 14);
  FpduFramer framer({.crc_enabled = true});
  FpduFrame frame;
  const ByteSpan payload[] = {ByteSpan(ulpdu).subspan(18)};
  ASSERT_EQ(framer.Frame(ByteSpan(ulpdu).first(18), payload, frame), FrameStatus::kOk);
  EXPECT_EQ(frame.ulpdu_length(), 0xFFFFu);
  EXPECT_EQ(frame.wire_length(), 65544u);
  EXPECT_EQ(Flatten(frame.slices()), reference::UnmarkedFpdu(ulpdu, true));
}

TEST(FpduFramer, RefusesUlpduOverSixtyFourKiB) {
  const Bytes header(18, 0);
  const Bytes data(65535 - 18 + 1, 0);
  FpduFramer framer({.markers_enabled = true, .marker_grid_offset = 40});
  FpduFrame frame;
  const ByteSpan payload[] = {data};
  EXPECT_EQ(framer.Frame(header, payload, frame), FrameStatus::kUlpduTooLong);
  EXPECT_TRUE(frame.slices().empty());
  EXPECT_EQ(framer.marker_grid_offset(), 40u);  // unchanged
  const ByteSpan two_pieces[] = {ByteSpan(data).first(40000), ByteSpan(data).first(40000)};
  EXPECT_EQ(framer.Frame({}, two_pieces, frame), FrameStatus::kUlpduTooLong);
  EXPECT_EQ(framer.Frame(Bytes(65536, 0), {}, frame), FrameStatus::kUlpduTooLong);
}

TEST(FpduFramer, PayloadPieceLimit) {
  const Bytes one = {0x01};
  std::vector<ByteSpan> pieces(FpduFrame::kMaxPayloadPieces, ByteSpan(one));
  FpduFramer framer({.crc_enabled = true});
  FpduFrame frame;
  ASSERT_EQ(framer.Frame({}, pieces, frame), FrameStatus::kOk);
  EXPECT_EQ(frame.ulpdu_length(), 32u);
  pieces.push_back(ByteSpan{});  // empty pieces do not count
  ASSERT_EQ(framer.Frame({}, pieces, frame), FrameStatus::kOk);
  pieces.push_back(ByteSpan(one));
  EXPECT_EQ(framer.Frame({}, pieces, frame), FrameStatus::kTooManyPieces);
  EXPECT_TRUE(frame.slices().empty());
}

TEST(FpduFramer, MarkerPointerMustFitSixteenBits) {
  // A 64 KiB FPDU with markers always has a marker more than 65535 octets
  // after its ULPDU_Length field.
  const Bytes ulpdu(65535, 0x33);
  for (std::uint32_t offset : {0u, 4u, 256u, 508u}) {
    FpduFramer framer({.markers_enabled = true, .marker_grid_offset = offset});
    FpduFrame frame;
    EXPECT_EQ(framer.Frame(ulpdu, {}, frame), FrameStatus::kMarkerPointerOverflow) << offset;
    EXPECT_EQ(framer.marker_grid_offset(), offset);
  }
  // The largest FPDU that fits at offset 4 (right after a marker) is 65532
  // unmarked octets: its 128th marker sits 65532 octets on. Four octets more
  // need a 129th marker, 66044 octets on.
  FpduFramer framer({.crc_enabled = true, .markers_enabled = true, .marker_grid_offset = 4});
  FpduFrame frame;
  const Bytes fits(65526, 0x44);
  ASSERT_EQ(UnmarkedFpduLength(fits.size()), 65532u);
  ASSERT_EQ(framer.Frame(fits, {}, frame), FrameStatus::kOk);
  const Bytes wire = Flatten(frame.slices());
  EXPECT_EQ(wire, reference::MarkedFpdu(fits, true, 4));
  EXPECT_EQ(frame.marker_count(), 128u);
  EXPECT_EQ(Bytes(wire.begin() + 65532, wire.begin() + 65536), (Bytes{0, 0, 0xFF, 0xFC}));
  FpduFramer other({.markers_enabled = true, .marker_grid_offset = 4});
  EXPECT_EQ(other.Frame(Bytes(65527, 0x44), {}, frame), FrameStatus::kMarkerPointerOverflow);
}

TEST(FpduFramer, MarkerPointerLimitAtTheStreamStartAndOffTheGrid) {
  FpduFrame frame;
  // Grid offset 0: the FPDU starts behind a marker, so its ULPDU_Length is 4
  // octets on and the 129th marker, 65536 octets on, points back 65532.
  FpduFramer at_start({.markers_enabled = true, .marker_grid_offset = 0});
  const Bytes fits(65526, 0x55);
  ASSERT_EQ(at_start.Frame(fits, {}, frame), FrameStatus::kOk);
  EXPECT_EQ(frame.marker_count(), 129u);
  const Bytes wire = Flatten(frame.slices());
  EXPECT_EQ(Bytes(wire.begin() + 65536, wire.begin() + 65540), (Bytes{0, 0, 0xFF, 0xFC}));
  // 65532 + 129 * 4 = 66048 octets: the grid is back at offset 0, where
  // four more octets need a 130th marker, 66048 octets on.
  ASSERT_EQ(at_start.marker_grid_offset(), 0u);
  EXPECT_EQ(at_start.Frame(Bytes(65527, 0x55), {}, frame), FrameStatus::kMarkerPointerOverflow);
  // Off the 4-octet grid (offset 511) the 129th marker is 65537 octets on:
  // just past what 16 bits hold.
  FpduFramer off_grid({.markers_enabled = true, .marker_grid_offset = 511});
  EXPECT_EQ(off_grid.Frame(Bytes(65020, 0x55), {}, frame), FrameStatus::kMarkerPointerOverflow);
  const Bytes off_grid_ulpdu(65016, 0x55);
  ASSERT_EQ(off_grid.Frame(off_grid_ulpdu, {}, frame), FrameStatus::kOk);
  EXPECT_EQ(frame.marker_count(), 128u);
  // Offset 1: the 128th marker is exactly 65535 octets on, which still fits
  // (sent as 0xFFFC, the low bits cleared).
  // (The frame references the ULPDU octets, so they must outlive it.)
  FpduFramer edge({.markers_enabled = true, .marker_grid_offset = 1});
  const Bytes edge_ulpdu(65022, 0x55);
  ASSERT_EQ(edge.Frame(edge_ulpdu, {}, frame), FrameStatus::kOk);
  ASSERT_EQ(frame.marker_count(), 128u);
  const Bytes edge_wire = Flatten(frame.slices());
  EXPECT_EQ(Bytes(edge_wire.begin() + 65535, edge_wire.begin() + 65539), (Bytes{0, 0, 0xFF, 0xFC}));
}

// --- MULPDU -----------------------------------------------------------------

TEST(Mulpdu, WithoutMarkers) {
  // MULPDU = EMSS - (6 + EMSS mod 4)
  EXPECT_EQ(Mulpdu(1460, false), 1454u);
  EXPECT_EQ(Mulpdu(1448, false), 1442u);
  EXPECT_EQ(Mulpdu(1449, false), 1442u);
  EXPECT_EQ(Mulpdu(1451, false), 1442u);
  EXPECT_EQ(Mulpdu(8948, false), 8942u);
  EXPECT_EQ(Mulpdu(10, false), 2u);
  EXPECT_EQ(Mulpdu(9, false), 2u);
  EXPECT_EQ(Mulpdu(8, false), 2u);
  EXPECT_EQ(Mulpdu(7, false), 0u);
  EXPECT_EQ(Mulpdu(6, false), 0u);
  EXPECT_EQ(Mulpdu(0, false), 0u);
  EXPECT_EQ(Mulpdu(70000, false), 65535u);  // capped by the 16-bit length
}

TEST(Mulpdu, WithMarkers) {
  // MULPDU = EMSS - (6 + 4 * Ceiling(EMSS / 512) + EMSS mod 4)
  EXPECT_EQ(Mulpdu(1460, true), 1460u - (6 + 12 + 0));
  EXPECT_EQ(Mulpdu(1448, true), 1448u - (6 + 12 + 0));
  EXPECT_EQ(Mulpdu(512, true), 512u - (6 + 4 + 0));
  EXPECT_EQ(Mulpdu(513, true), 513u - (6 + 8 + 1));
  EXPECT_EQ(Mulpdu(8960, true), 8960u - (6 + 72 + 0));
  EXPECT_EQ(Mulpdu(65495, true), 65495u - (6 + 4 * 128 + 3));
  EXPECT_EQ(Mulpdu(10, true), 0u);
  EXPECT_EQ(Mulpdu(14, true), 2u);
  EXPECT_EQ(Mulpdu(16, true), 6u);
}

TEST(Mulpdu, AnFpduOfMulpduFitsTheEmssAtEveryGridOffset) {
  // FpduWireLength is checked against an octet walk in mpa_markers_test.
  for (std::size_t emss = 16; emss <= 9100; emss += 7) {
    const std::size_t plain = Mulpdu(emss, false);
    ASSERT_EQ(FpduWireLength(plain, false, 0), emss - emss % 4) << emss;
    const std::size_t marked = Mulpdu(emss, true);
    for (std::uint32_t offset = 0; offset < 512; ++offset) {
      ASSERT_LE(FpduWireLength(marked, true, offset), emss) << emss << " " << offset;
    }
  }
  // The common cases, through the reference model.
  for (std::size_t emss : {1448u, 1460u, 8948u, 8960u}) {
    const Bytes unmarked(UnmarkedFpduLength(Mulpdu(emss, true)), 1);
    std::size_t longest = 0;
    for (std::uint32_t offset = 0; offset < 512; offset += 4) {
      longest = std::max(longest, reference::InsertMarkers(unmarked, offset).size());
    }
    EXPECT_EQ(longest, emss - emss % 4) << emss;
  }
}

}  // namespace
}  // namespace siwx::mpa
