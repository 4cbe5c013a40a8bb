// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// CRC32c (Castagnoli, RFC 3385 / RFC 3720 appendix B.4) for MPA FPDUs,
// computed by Intel ISA-L; pieces of up to 128 octets (an FPDU's length
// field, header and pad) by the CPU's SSE4.2 CRC32 instruction where there
// is one, which is cheaper than ISA-L's call at that size.
//
// The CRC covers the ULPDU_Length field, the ULPDU, the pad and the markers
// among them (RFC 5044 sections 4.3, 4.4; see mpa_markers.h). It is
// transmitted least significant
// octet first: RFC 3720's bit ordering makes the CRC register's low byte the
// first on the wire. Crc32cToWire/Crc32cFromWire hold that rule in one place.
#pragma once

#include <cstdint>

#include "common/util/bytes.h"

namespace siwx {

// Running state of a CRC32c over several pieces (header, payload, pad).
class Crc32c {
 public:
  void Update(ByteSpan data);
  // The finished CRC value (register inverted), as RFC 3720 defines it.
  std::uint32_t Value() const { return ~state_; }

 private:
  std::uint32_t state_ = 0xFFFFFFFFu;
};

// One-shot CRC32c of `data`.
std::uint32_t ComputeCrc32c(ByteSpan data);

// The four octets that carry `crc` in an FPDU's CRC field.
void Crc32cToWire(std::uint32_t crc, std::uint8_t out[4]);
// The CRC value carried by an FPDU's CRC field.
std::uint32_t Crc32cFromWire(const std::uint8_t in[4]);

}  // namespace siwx
