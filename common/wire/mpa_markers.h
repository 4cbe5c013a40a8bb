// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// MPA Markers (RFC 5044 section 4.3): the marker format and the arithmetic of
// the marker grid, shared by the FPDU framer (transmit) and the FPDU parser
// (receive).
//
// Markers belong to one half-connection. When that direction negotiated them,
// a 4-octet marker sits at every 512th octet of its FPDU stream, counted from
// the first octet after the startup frames; that first position holds the
// special first marker 0x00000000 (RFC 5044 7.1.2 rule 7). Positions are
// counted on the wire, markers included. ULPDU_Length and the pad never count
// markers (RFC 5044 4.1).
//
// FPDUPTR is the number of stream octets from the first octet of the FPDU's
// ULPDU_Length field back to the first octet of the marker. A marker that sits
// exactly on the boundary between two FPDUs belongs to the FPDU that follows
// and carries 0, like the first marker (RFC 5044 4.3 and 7.1.2 rule 7).
//
// The MPA CRC covers the markers of its FPDU (RFC 5044 4.3, 4.4): it is
// computed over the FPDU's octets as they go out, from its first octet to the
// last octet before the CRC field. So it covers a marker inside the
// ULPDU_Length field, the ULPDU or the pad, one between the pad and the CRC
// field, and one on the boundary in front of the FPDU (FPDUPTR 0, the FPDU's
// first octet; the previous FPDU's CRC ended before it). This is also how
// Wireshark's iWARP dissector checks it. Only off the RFC's grid (a grid
// offset that is not a multiple of 4) can a marker fall inside the CRC field;
// the CRC cannot cover it and both ends leave it out.
//
// A "grid offset" below is a stream position modulo kMarkerInterval: 0 means a
// marker is due at the next octet. RFC streams only ever see multiples of 4 at
// FPDU starts (FPDUs are multiples of 4 octets long and the grid starts at an
// FPDU boundary); every other offset is supported as well so that the code is
// total, and is exercised by the tests.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/util/bytes.h"
#include "common/wire/mpa_constants.h"

namespace siwx::mpa {

inline constexpr std::size_t kMarkerReservedSize = 2;  // RFC 5044 4.3
inline constexpr std::size_t kMarkerFpduPtrSize = 2;   // RFC 5044 4.3
// The two low bits of FPDUPTR are sent as zero and read as zero.
inline constexpr std::uint16_t kFpduPtrIgnoredBits = 0x0003;  // RFC 5044 4.3
inline constexpr std::uint32_t kMaxFpduPtr = 0xFFFF;          // 16-bit field, RFC 5044 4.3
static_assert(kMarkerReservedSize + kMarkerFpduPtrSize == kMarkerSize);
static_assert(kMarkerInterval % kPadAlign == 0);

// One marker, host order. The reserved half is sent as zero and ignored on
// receive (RFC 5044 4.3); Decode keeps it so diagnostics can see it.
struct Marker {
  std::uint16_t reserved = 0;
  std::uint16_t fpdu_ptr = 0;

  friend bool operator==(const Marker&, const Marker&) = default;
};

// Writes `marker` into out[0..3]. Returns false, writing nothing, when `out`
// is shorter than kMarkerSize.
bool EncodeMarker(const Marker& marker, MutableByteSpan out);
// Reads the marker in in[0..3]; nullopt when `in` is shorter than kMarkerSize.
std::optional<Marker> DecodeMarker(ByteSpan in);

// The special marker that starts the FPDU stream when markers are enabled
// (RFC 5044 7.1.2 rule 7). The framer emits it by itself when a stream starts
// at grid offset 0; this is for callers that frame the stream start by hand.
inline constexpr std::array<std::uint8_t, kMarkerSize> kFirstMarkerOctets = {0, 0, 0, 0};

// The grid offset after `octets` more stream octets.
constexpr std::uint32_t AdvanceGridOffset(std::uint32_t grid_offset, std::uint64_t octets) {
  return static_cast<std::uint32_t>((grid_offset + octets) % kMarkerInterval);
}

// Stream octets that pass before the next marker position; 0 when a marker is
// due at the next octet.
constexpr std::size_t OctetsBeforeNextMarker(std::uint32_t grid_offset) {
  return (kMarkerInterval - grid_offset % kMarkerInterval) % kMarkerInterval;
}

// How many markers fall inside an FPDU whose unmarked length (ULPDU_Length
// field, ULPDU, pad and CRC) is `unmarked_octets`, when its first octet would
// go out at `grid_offset`. A marker due right at the start counts (it belongs
// to this FPDU); one due right after the last octet does not (it belongs to
// the next FPDU).
constexpr std::size_t MarkersInFpdu(std::uint32_t grid_offset, std::size_t unmarked_octets) {
  // Markers come every kMarkerInterval wire octets, i.e. after every
  // kMarkerInterval - kMarkerSize unmarked octets once the first one is out.
  const std::size_t first = OctetsBeforeNextMarker(grid_offset);
  if (first >= unmarked_octets) return 0;
  return 1 + (unmarked_octets - 1 - first) / (kMarkerInterval - kMarkerSize);
}

// Whether a received FPDUPTR agrees with the FPDU start the receiver derived
// from ULPDU_Length. `expected` is the distance the receiver computed (it may
// exceed 16 bits, which no FPDUPTR can express). The low two bits count as
// zero on both sides (RFC 5044 4.3).
constexpr bool FpduPtrMatches(std::uint16_t received, std::uint64_t expected) {
  if (expected > kMaxFpduPtr) return false;
  return (received & ~kFpduPtrIgnoredBits) ==
         (static_cast<std::uint16_t>(expected) & ~kFpduPtrIgnoredBits);
}

}  // namespace siwx::mpa
