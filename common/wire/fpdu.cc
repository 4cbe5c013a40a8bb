// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/wire/fpdu.h"

#include <algorithm>
#include <cstring>

#include "common/wire/crc32c.h"

namespace siwx::mpa {

std::size_t Mulpdu(std::size_t emss, bool markers_enabled) {
  std::size_t overhead = kFpduFixedOverhead + emss % kPadAlign;
  if (markers_enabled) {
    overhead += kMarkerSize * ((emss + kMarkerInterval - 1) / kMarkerInterval);
  }
  if (emss <= overhead) return 0;
  return std::min(emss - overhead, kMaxUlpduLength);
}

void FpduFrame::Clear() {
  slice_count_ = 0;
  wire_length_ = 0;
  marker_count_ = 0;
  crc_ = 0;
  ulpdu_length_ = 0;
}

void FpduFrame::Append(const std::uint8_t* base, std::size_t len) {
  // Capacity is guaranteed by the counts Frame checks before building.
  slices_[slice_count_++] = IoSlice{base, len};
  wire_length_ += len;
}

namespace {

// Kept out of line: inlined, with its length known to be at most the
// fused chunk, g++ turns the copy into `rep movsq`, slower here than
// glibc's vector memcpy.
[[gnu::noinline]] void CopyChunk(std::uint8_t* to, const std::uint8_t* from, std::size_t n) {
  std::memcpy(to, from, n);
}

}  // namespace

FpduFramer::FpduFramer(const FpduFramingConfig& config)
    : config_(config), grid_offset_(config.marker_grid_offset % kMarkerInterval) {}

FrameStatus FpduFramer::Frame(ByteSpan ulpdu_header, std::span<const ByteSpan> payload,
                              FpduFrame& out) {
  return FrameImpl(ulpdu_header, payload, nullptr, out);
}

FrameStatus FpduFramer::FrameCopy(ByteSpan ulpdu_header, std::span<const ByteSpan> payload,
                                  std::uint8_t* copy_to, FpduFrame& out) {
  return FrameImpl(ulpdu_header, payload, copy_to, out);
}

FrameStatus FpduFramer::FrameImpl(ByteSpan ulpdu_header, std::span<const ByteSpan> payload,
                                  std::uint8_t* copy_to, FpduFrame& out) {
  out.Clear();

  // Sizes first, so that a refusal leaves everything untouched.
  std::size_t ulpdu_length = ulpdu_header.size();
  std::size_t pieces = 0;
  for (ByteSpan piece : payload) {
    if (piece.empty()) continue;
    if (piece.size() > kMaxUlpduLength - std::min(ulpdu_length, kMaxUlpduLength)) {
      return FrameStatus::kUlpduTooLong;
    }
    ulpdu_length += piece.size();
    ++pieces;
  }
  if (ulpdu_length > kMaxUlpduLength) return FrameStatus::kUlpduTooLong;
  if (pieces > FpduFrame::kMaxPayloadPieces) return FrameStatus::kTooManyPieces;

  const std::size_t pad = PadLength(ulpdu_length);
  const std::size_t unmarked = UnmarkedFpduLength(ulpdu_length);
  const std::size_t markers =
      config_.markers_enabled ? MarkersInFpdu(grid_offset_, unmarked) : 0;
  if (markers > 0) {
    // The last marker is the farthest from the ULPDU_Length field. A marker
    // due at the very start carries 0 and moves the field 4 octets on.
    const std::size_t first = OctetsBeforeNextMarker(grid_offset_);
    const std::size_t last_wire = first + (markers - 1) * kMarkerInterval;
    const std::size_t field_wire = first == 0 ? kMarkerSize : 0;
    if (last_wire > 0 && last_wire - field_wire > kMaxFpduPtr) {
      return FrameStatus::kMarkerPointerOverflow;
    }
  }

  StoreBe16(out.length_field_.data(), static_cast<std::uint16_t>(ulpdu_length));
  std::fill(out.trailer_.begin(), out.trailer_.end(), std::uint8_t{0});
  out.ulpdu_length_ = static_cast<std::uint16_t>(ulpdu_length);

  // Walk the unmarked octets in order and cut them at every marker position.
  const bool use_markers = config_.markers_enabled;
  std::size_t before_marker = OctetsBeforeNextMarker(grid_offset_);
  const std::size_t field_wire = (use_markers && before_marker == 0) ? kMarkerSize : 0;
  // Wire position of the CRC field's first octet: the CRC covers everything
  // before it, markers included.
  const std::size_t crc_unmarked_at = unmarked - kCrcSize;
  std::size_t crc_field_at = 0;
  std::size_t unmarked_done = 0;
  auto emit = [&](const std::uint8_t* base, std::size_t len) {
    while (len > 0) {
      if (use_markers && before_marker == 0) {
        const std::size_t at = out.wire_length_;
        // A marker at the FPDU's first octet points at the FPDU it precedes.
        const std::size_t ptr = at == 0 ? 0 : at - field_wire;
        auto& octets = out.markers_[out.marker_count_++];
        EncodeMarker(Marker{0, static_cast<std::uint16_t>(ptr & ~std::size_t{kFpduPtrIgnoredBits})},
                     octets);
        out.Append(octets.data(), octets.size());
        before_marker = kMarkerInterval - kMarkerSize;
      }
      const std::size_t n = use_markers ? std::min(len, before_marker) : len;
      if (unmarked_done <= crc_unmarked_at && crc_unmarked_at < unmarked_done + n) {
        crc_field_at = out.wire_length_ + (crc_unmarked_at - unmarked_done);
      }
      unmarked_done += n;
      out.Append(base, n);
      base += n;
      len -= n;
      if (use_markers) before_marker -= n;
    }
  };
  std::uint8_t* crc_field = out.trailer_.data() + pad;
  std::uint8_t* copied_payload = nullptr;
  if (copy_to == nullptr) {
    emit(out.length_field_.data(), out.length_field_.size());
    emit(ulpdu_header.data(), ulpdu_header.size());
    for (ByteSpan piece : payload) emit(piece.data(), piece.size());
    emit(out.trailer_.data(), pad + kCrcSize);
  } else {
    // The whole unmarked FPDU in one buffer: without markers it is one
    // slice, one iovec for sendmsg instead of four.
    std::memcpy(copy_to, out.length_field_.data(), kUlpduLengthSize);
    if (!ulpdu_header.empty()) {
      std::memcpy(copy_to + kUlpduLengthSize, ulpdu_header.data(), ulpdu_header.size());
    }
    copied_payload = copy_to + kUlpduLengthSize + ulpdu_header.size();
    crc_field = copy_to + unmarked - kCrcSize;
    std::memset(crc_field - pad, 0, pad + kCrcSize);
    emit(copy_to, unmarked);  // the payload is copied below, before anything reads it
  }

  // Without markers the CRC covers length field, header, payload and pad in
  // that order, so the copy can feed it chunk by chunk, each chunk small
  // enough to stay in L1 between the copy and the CRC.
  const bool fused = copy_to != nullptr && config_.crc_enabled && !use_markers;
  Crc32c running;
  if (fused) running.Update(ByteSpan(copy_to, copied_payload - copy_to));
  if (copy_to != nullptr) {
    constexpr std::size_t kChunk = 8192;
    std::uint8_t* at = copied_payload;
    for (ByteSpan piece : payload) {
      for (std::size_t done = 0; done < piece.size();) {
        const std::size_t n = std::min(kChunk, piece.size() - done);
        CopyChunk(at, piece.data() + done, n);
        if (fused) running.Update(ByteSpan(at, n));
        at += n;
        done += n;
      }
    }
  }

  // Otherwise the CRC covers the FPDU as it goes out, markers included (see
  // mpa_markers.h), so it is computed over the slices in wire order. The
  // CRC field's slice is filled in below.
  std::uint32_t crc = 0;
  if (fused) {
    running.Update(ByteSpan(crc_field - pad, pad));
    crc = running.Value();
  } else if (config_.crc_enabled) {
    std::size_t left = crc_field_at;
    for (std::size_t i = 0; i < out.slice_count_ && left > 0; ++i) {
      const IoSlice& slice = out.slices_[i];
      const std::size_t n = std::min(slice.len, left);
      running.Update(ByteSpan(slice.base, n));
      left -= n;
    }
    crc = running.Value();
  }
  Crc32cToWire(crc, crc_field);
  out.crc_ = crc;

  grid_offset_ = AdvanceGridOffset(grid_offset_, out.wire_length_);
  return FrameStatus::kOk;
}

}  // namespace siwx::mpa
