// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// CRC32c check values from RFC 3720 appendix B.4 and the common "123456789"
// check, plus the MPA wire byte order.
#include "common/wire/crc32c.h"

#include <gtest/gtest.h>

#include "test_tools/fpdu_reference.h"

#include <array>
#include <numeric>
#include <string_view>
#include <vector>

namespace siwx {
namespace {

std::uint32_t CrcOf(const std::vector<std::uint8_t>& v) { return ComputeCrc32c(v); }

TEST(Crc32c, CheckValue) {
  constexpr std::string_view kCheck = "123456789";
  ByteSpan s(reinterpret_cast<const std::uint8_t*>(kCheck.data()), kCheck.size());
  EXPECT_EQ(ComputeCrc32c(s), 0xE3069283u);
}

TEST(Crc32c, Rfc3720Zeros) { EXPECT_EQ(CrcOf(std::vector<std::uint8_t>(32, 0x00)), 0x8A9136AAu); }
TEST(Crc32c, Rfc3720Ones) { EXPECT_EQ(CrcOf(std::vector<std::uint8_t>(32, 0xFF)), 0x62A8AB43u); }

TEST(Crc32c, Rfc3720Incrementing) {
  std::vector<std::uint8_t> v(32);
  std::iota(v.begin(), v.end(), std::uint8_t{0});
  EXPECT_EQ(CrcOf(v), 0x46DD794Eu);
}

TEST(Crc32c, Rfc3720Decrementing) {
  std::vector<std::uint8_t> v(32);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<std::uint8_t>(31 - i);
  EXPECT_EQ(CrcOf(v), 0x113FDB5Cu);
}

TEST(Crc32c, Rfc3720IscsiReadCommand) {
  const std::vector<std::uint8_t> v = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
      0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(CrcOf(v), 0xD9963A56u);
}

TEST(Crc32c, IncrementalEqualsOneShot) {
  std::vector<std::uint8_t> v(4099);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint8_t>(i * 131 + 7);
  const std::uint32_t whole = CrcOf(v);
  for (std::size_t cut : {0u, 1u, 3u, 64u, 4098u, 4099u}) {
    Crc32c crc;
    crc.Update(ByteSpan(v).first(cut));
    crc.Update(ByteSpan(v).subspan(cut));
    EXPECT_EQ(crc.Value(), whole) << "cut at " << cut;
  }
}

// The bitwise reference (RFC 3720 B.4) is the oracle for the two ways Update
// computes: short pieces by the CPU's CRC32 instruction, longer ones by ISA-L.
std::uint32_t BitwiseCrc32c(ByteSpan data) {
  return mpa::reference::Crc32c(mpa::reference::Bytes(data.begin(), data.end()));
}

TEST(Crc32c, PiecesOfEveryLengthAgreeWithTheBitwiseDefinition) {
  std::vector<std::uint8_t> v(1031);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint8_t>(i * 37 + 11);
  // Every piece length from 0 to 300 (both sides of the 128-octet switch),
  // at unaligned starts, after a prefix so the running state is not the
  // initial one.
  for (std::size_t length = 0; length <= 300; ++length) {
    for (std::size_t start : {1u, 8u, 13u}) {
      const ByteSpan prefix = ByteSpan(v).first(start);
      const ByteSpan piece = ByteSpan(v).subspan(start, length);
      Crc32c crc;
      crc.Update(prefix);
      crc.Update(piece);
      EXPECT_EQ(crc.Value(), BitwiseCrc32c(ByteSpan(v).first(start + length)))
          << "piece of " << length << " after " << start;
    }
  }
  // An FPDU's pieces: length field, header, payload, pad.
  Crc32c fpdu;
  std::size_t at = 0;
  for (std::size_t piece : {2u, 18u, 1000u, 2u}) {
    fpdu.Update(ByteSpan(v).subspan(at, piece));
    at += piece;
  }
  EXPECT_EQ(fpdu.Value(), BitwiseCrc32c(ByteSpan(v).first(at)));
}

TEST(Crc32c, WireOrderIsLeastSignificantOctetFirst) {
  // RFC 3720 B.4 gives the 32 zero octets' CRC as the octet sequence
  // aa 36 91 8a, i.e. value 0x8A9136AA sent low octet first.
  std::array<std::uint8_t, 4> wire{};
  Crc32cToWire(0x8A9136AAu, wire.data());
  EXPECT_EQ(wire, (std::array<std::uint8_t, 4>{0xaa, 0x36, 0x91, 0x8a}));
  EXPECT_EQ(Crc32cFromWire(wire.data()), 0x8A9136AAu);
}

}  // namespace
}  // namespace siwx
