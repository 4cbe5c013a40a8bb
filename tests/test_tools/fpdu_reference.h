// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// A reference model of MPA FPDUs written from the RFC text, for tests that
// must not compute their expectations with the library under test: a bitwise
// CRC32c (RFC 3720 B.4 parameters, checked against its vectors in
// fpdu_framing_test), FPDU assembly (RFC 5044 4.1, 4.4) and octet-by-octet
// marker insertion (RFC 5044 4.3). With markers, the CRC covers the FPDU as
// sent, markers included (RFC 5044 4.3, 4.4): use MarkedFpdu, not
// InsertMarkers over an UnmarkedFpdu with a CRC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace siwx::mpa::reference {

using Bytes = std::vector<std::uint8_t>;

// Reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF.
inline std::uint32_t Crc32c(const Bytes& data) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::uint8_t octet : data) {
    crc ^= octet;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
  }
  return crc ^ 0xFFFFFFFFu;
}

// ULPDU_Length | ULPDU | pad | CRC (least significant octet first), or a zero
// CRC field when CRC is off.
inline Bytes UnmarkedFpdu(const Bytes& ulpdu, bool crc_enabled, std::uint8_t pad_octet = 0) {
  Bytes fpdu = {static_cast<std::uint8_t>(ulpdu.size() >> 8),
                static_cast<std::uint8_t>(ulpdu.size())};
  fpdu.insert(fpdu.end(), ulpdu.begin(), ulpdu.end());
  while (fpdu.size() % 4 != 0) fpdu.push_back(pad_octet);
  const std::uint32_t crc = crc_enabled ? Crc32c(fpdu) : 0;
  for (int i = 0; i < 4; ++i) fpdu.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  return fpdu;
}

// Inserts a marker before every octet whose stream position is a multiple of
// 512. FPDUPTR is 0 for a marker ahead of the ULPDU_Length field, otherwise
// its distance back to that field's first octet (only the low 16 bits fit).
inline Bytes InsertMarkers(const Bytes& unmarked, std::uint32_t grid_offset) {
  Bytes wire;
  std::size_t pos = grid_offset;
  std::size_t field_at = 0;
  for (std::size_t i = 0; i < unmarked.size(); ++i) {
    if (pos % 512 == 0) {
      const std::size_t ptr = wire.empty() ? 0 : wire.size() - field_at;
      wire.insert(wire.end(), {0x00, 0x00, static_cast<std::uint8_t>(ptr >> 8),
                               static_cast<std::uint8_t>(ptr & 0xFC)});
      pos += 4;
    }
    if (i == 0) field_at = wire.size();
    wire.push_back(unmarked[i]);
    ++pos;
  }
  return wire;
}

// An FPDU as it goes out at `grid_offset` with markers: markers inserted as
// InsertMarkers does, then the CRC computed over every wire octet before the
// CRC field's first octet (the markers in front of and inside the FPDU
// included) and written into the CRC field's four octets, wherever they are.
inline Bytes MarkedFpdu(const Bytes& ulpdu, bool crc_enabled, std::uint32_t grid_offset,
                        std::uint8_t pad_octet = 0) {
  const Bytes unmarked = UnmarkedFpdu(ulpdu, false, pad_octet);  // CRC field zero
  Bytes wire = InsertMarkers(unmarked, grid_offset);
  // Wire index of each unmarked octet: walk both and skip the markers.
  std::vector<std::size_t> at;
  std::size_t pos = grid_offset;
  std::size_t w = 0;
  for (std::size_t i = 0; i < unmarked.size(); ++i) {
    if (pos % 512 == 0) {
      w += 4;
      pos += 4;
    }
    at.push_back(w++);
    ++pos;
  }
  if (!crc_enabled) return wire;
  const std::size_t crc_first = at[unmarked.size() - 4];
  const std::uint32_t crc = Crc32c(Bytes(wire.begin(), wire.begin() + crc_first));
  for (int i = 0; i < 4; ++i) {
    wire[at[unmarked.size() - 4 + i]] = static_cast<std::uint8_t>(crc >> (8 * i));
  }
  return wire;
}

}  // namespace siwx::mpa::reference
