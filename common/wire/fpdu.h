// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// MPA FPDU framing for transmit (RFC 5044 section 4) and the MULPDU a
// transmitter derives from the TCP EMSS (RFC 5044 4.5).
//
// An FPDU on the wire, markers aside:
//
//   ULPDU_Length (2) | ULPDU (ULPDU_Length octets) | pad (0..3) | CRC (4)
//
// ULPDU_Length counts the ULPDU only; the pad makes ULPDU_Length field +
// ULPDU + pad a multiple of 4 (RFC 5044 4.1). The CRC field is always
// present: it is zero when CRC was not negotiated (RFC 5044 7.1.1 "C", and
// what Linux siw sends). When the direction uses markers, they are inserted
// at their stream positions (see mpa_markers.h) and counted by neither
// ULPDU_Length nor the pad. The CRC32c covers the FPDU as it goes out: every
// octet before the CRC field, markers included (RFC 5044 4.3, 4.4; which
// markers belong to an FPDU is set out in mpa_markers.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/util/bytes.h"
#include "common/wire/mpa_constants.h"
#include "common/wire/mpa_markers.h"

namespace siwx::mpa {

inline constexpr std::size_t kMaxUlpduLength = 0xFFFF;  // 16-bit ULPDU_Length, RFC 5044 4.1
// The ULPDU_Length field and the CRC: the "6" of the MULPDU formula.
inline constexpr std::size_t kFpduFixedOverhead = kUlpduLengthSize + kCrcSize;  // RFC 5044 4.5
static_assert(kFpduFixedOverhead == 6);

// Pad octets after a ULPDU of `ulpdu_length` octets (RFC 5044 4.1).
constexpr std::size_t PadLength(std::size_t ulpdu_length) {
  return (kPadAlign - (kUlpduLengthSize + ulpdu_length) % kPadAlign) % kPadAlign;
}

// Octets of an FPDU without markers: ULPDU_Length field, ULPDU, pad, CRC.
constexpr std::size_t UnmarkedFpduLength(std::size_t ulpdu_length) {
  return kUlpduLengthSize + ulpdu_length + PadLength(ulpdu_length) + kCrcSize;
}

// Octets an FPDU occupies on the wire when its first octet goes out at
// `grid_offset` (ignored without markers), markers included.
constexpr std::size_t FpduWireLength(std::size_t ulpdu_length, bool markers_enabled,
                                     std::uint32_t grid_offset) {
  const std::size_t unmarked = UnmarkedFpduLength(ulpdu_length);
  if (!markers_enabled) return unmarked;
  return unmarked + kMarkerSize * MarkersInFpdu(grid_offset, unmarked);
}

// The largest ULPDU that keeps an FPDU within one TCP segment of `emss`
// octets (RFC 5044 4.5):
//   markers:    MULPDU = EMSS - (6 + 4 * Ceiling(EMSS / 512) + EMSS mod 4)
//   no markers: MULPDU = EMSS - (6 + EMSS mod 4)
// The "EMSS mod 4" keeps the FPDU a multiple of 4 with no pad; the marker
// term is the most markers an EMSS-sized stretch of stream can hold. Returns 0
// when the EMSS leaves no room for a ULPDU, and never more than
// kMaxUlpduLength.
std::size_t Mulpdu(std::size_t emss, bool markers_enabled);

// One entry of a scatter list, laid out like struct iovec's two members so
// the transport can hand it to sendmsg one for one.
struct IoSlice {
  const std::uint8_t* base = nullptr;
  std::size_t len = 0;
};
static_assert(sizeof(IoSlice) == sizeof(void*) + sizeof(std::size_t));

// Configuration of one transmit half-connection, fixed at the end of MPA
// negotiation.
struct FpduFramingConfig {
  bool crc_enabled = false;
  bool markers_enabled = false;
  // Stream position modulo kMarkerInterval of the next octet to go out; 0 at
  // the start of Full Operation, where the first marker goes.
  std::uint32_t marker_grid_offset = 0;
};

enum class FrameStatus : std::uint8_t {
  kOk = 0,
  kUlpduTooLong,           // header + payload exceed kMaxUlpduLength
  kTooManyPieces,          // more payload pieces than FpduFrame holds
  kMarkerPointerOverflow,  // with markers, some FPDUPTR would exceed 16 bits
};

// One framed FPDU: the scatter list that puts it on the wire, and the octets
// of it that belong to no caller (ULPDU_Length, markers, pad, CRC).
//
// The ULPDU header and payload are referenced, never copied (except by
// FrameCopy, into the caller's buffer): they must stay alive and unchanged
// until the scatter list has been sent (the CRC was computed over them at
// framing time). The scatter list points into this
// object, which is therefore neither copyable nor movable. Keep one per FPDU
// in flight; the whole object is fixed-size (no heap).
class FpduFrame {
 public:
  static constexpr std::size_t kMaxPayloadPieces = 32;
  // An FPDU of kMaxUlpduLength holds at most this many markers.
  static constexpr std::size_t kMaxMarkers =
      MarkersInFpdu(0, UnmarkedFpduLength(kMaxUlpduLength));
  // Length field, header, payload pieces, pad+CRC; each marker adds its own
  // slice and may split one other slice in two.
  static constexpr std::size_t kMaxSlices = 3 + kMaxPayloadPieces + 2 * kMaxMarkers;
  static_assert(kMaxMarkers == 130);

  FpduFrame() = default;
  FpduFrame(const FpduFrame&) = delete;
  FpduFrame& operator=(const FpduFrame&) = delete;

  // The FPDU in wire order; empty when the last Frame call failed.
  std::span<const IoSlice> slices() const { return {slices_.data(), slice_count_}; }
  std::size_t wire_length() const { return wire_length_; }
  std::uint16_t ulpdu_length() const { return ulpdu_length_; }
  std::size_t marker_count() const { return marker_count_; }
  // The CRC value carried in the CRC field (0 when CRC is off).
  std::uint32_t crc() const { return crc_; }

 private:
  friend class FpduFramer;
  void Clear();
  void Append(const std::uint8_t* base, std::size_t len);

  std::array<std::uint8_t, kUlpduLengthSize> length_field_{};
  std::array<std::uint8_t, kPadAlign - 1 + kCrcSize> trailer_{};  // pad, CRC
  std::array<std::array<std::uint8_t, kMarkerSize>, kMaxMarkers> markers_{};
  std::array<IoSlice, kMaxSlices> slices_{};
  std::size_t slice_count_ = 0;
  std::size_t wire_length_ = 0;
  std::size_t marker_count_ = 0;
  std::uint32_t crc_ = 0;
  std::uint16_t ulpdu_length_ = 0;
};

// Frames ULPDUs into FPDUs for one transmit half-connection and keeps that
// direction's position on the marker grid across FPDUs. It does not enforce
// MULPDU (the DDP segmenter sizes ULPDUs with Mulpdu()) and does not look
// inside the ULPDU header. Framing with markers at grid offset 0 starts the
// FPDU with a marker of FPDUPTR 0, which at the stream start is the special
// first marker of RFC 5044 7.1.2 rule 7.
//
// Every FPDU framed must be sent, in order: the grid position advances by
// each frame's wire length.
class FpduFramer {
 public:
  explicit FpduFramer(const FpduFramingConfig& config);

  // Frames one FPDU whose ULPDU is `ulpdu_header` followed by the `payload`
  // pieces (empty pieces are skipped). On kOk `out` holds the FPDU and the
  // grid position has advanced; otherwise `out` is empty and nothing changed.
  FrameStatus Frame(ByteSpan ulpdu_header, std::span<const ByteSpan> payload, FpduFrame& out);
  // The same, but the whole unmarked FPDU (ULPDU_Length, header, payload,
  // pad, CRC) is laid out in `copy_to`, which has room for
  // UnmarkedFpduLength(header + payload) octets, and the frame points at it
  // instead of the pieces: a later change to a piece changes nothing sent.
  // The CRC is computed over the copy a few KiB at a time, right behind the
  // copy, so it reads octets still in the L1 cache instead of a second pass
  // over memory. Nothing is written when the frame is refused.
  FrameStatus FrameCopy(ByteSpan ulpdu_header, std::span<const ByteSpan> payload,
                        std::uint8_t* copy_to, FpduFrame& out);

  const FpduFramingConfig& config() const { return config_; }
  std::uint32_t marker_grid_offset() const { return grid_offset_; }
  // Wire length of an FPDU carrying `ulpdu_length` octets if framed next.
  std::size_t NextWireLength(std::size_t ulpdu_length) const {
    return FpduWireLength(ulpdu_length, config_.markers_enabled, grid_offset_);
  }

 private:
  FrameStatus FrameImpl(ByteSpan ulpdu_header, std::span<const ByteSpan> payload,
                        std::uint8_t* copy_to, FpduFrame& out);

  FpduFramingConfig config_;
  std::uint32_t grid_offset_;
};

}  // namespace siwx::mpa
