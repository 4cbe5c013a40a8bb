// A reference model of MPA FPDUs written from the RFC text, for tests that
// must not compute their expectations with the library under test: a bitwise
// CRC32c (RFC 3720 B.4 parameters, checked against its vectors in
// fpdu_framing_test), FPDU assembly (RFC 5044 4.1, 4.4) and octet-by-octet
// marker insertion (RFC 5044 4.3).
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

}  // namespace siwx::mpa::reference
