// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/wire/fpdu_parser.h"

#include <algorithm>
#include <cstring>

namespace siwx::mpa {

namespace {

// The two control octets DDP and RDMAP put first in every ULPDU.
constexpr std::size_t kControlOctets = 2;

}  // namespace

FpduParser::FpduParser(const FpduParserConfig& config)
    : config_(config), grid_offset_(config.marker_grid_offset % kMarkerInterval) {}

std::size_t FpduParser::BeforeMarker(std::size_t n) const {
  if (!config_.markers_enabled) return n;
  // Only asked when no marker is due, so this is at least 1.
  return std::min(n, OctetsBeforeNextMarker(grid_offset_));
}

void FpduParser::Advance(std::size_t n) {
  stream_pos_ += n;
  grid_offset_ = AdvanceGridOffset(grid_offset_, n);
}

RxDemand FpduParser::Demand() const {
  RxDemand demand;
  if (stage_ == Stage::kFailed) {
    demand.kind = RxDemand::Kind::kFailed;
    return demand;
  }
  if (MarkerDue()) {
    demand.length = kMarkerSize - marker_have_;
    return demand;
  }
  switch (stage_) {
    case Stage::kLength:
      // The two octets after ULPDU_Length are framing whatever it says: the
      // header's control octets, or pad/CRC of a shorter ULPDU.
      demand.length = BeforeMarker(kUlpduLengthSize - length_have_ + kControlOctets);
      break;
    case Stage::kHeader:
      demand.length = BeforeMarker(header_target_ - header_have_);
      break;
    case Stage::kPayload:
      demand.kind = RxDemand::Kind::kPayload;
      demand.length = BeforeMarker(PayloadRemaining());
      demand.payload_offset = payload_done_;
      break;
    case Stage::kDiscard:
      demand.length = BeforeMarker(PayloadRemaining());
      break;
    case Stage::kTrailer:
      demand.length = BeforeMarker(PadLength(ulpdu_length_) + kCrcSize - trailer_have_);
      break;
    case Stage::kFailed:
      break;
  }
  return demand;
}

void FpduParser::TakeMarker(ByteSpan data, RxProgress& progress) {
  const std::size_t n = std::min(kMarkerSize - marker_have_, data.size() - progress.consumed);
  std::memcpy(marker_buf_.data() + marker_have_, data.data() + progress.consumed, n);
  // The CRC covers the markers of the FPDU, the one in front of its
  // ULPDU_Length field included, but nothing from the CRC field on
  // (mpa_markers.h). Only off the RFC's grid can a marker split the CRC field.
  if (stage_ != Stage::kTrailer || trailer_have_ <= PadLength(ulpdu_length_)) {
    UpdateCrc(data.subspan(progress.consumed, n));
  }
  marker_have_ += n;
  progress.consumed += n;
  Advance(n);
  if (marker_have_ < kMarkerSize) return;

  marker_have_ = 0;
  ++markers_seen_;
  const Marker marker = *DecodeMarker(marker_buf_);
  if (marker.reserved != 0) ++markers_reserved_set_;
  // A marker before the first octet of ULPDU_Length sits on the FPDU boundary
  // and points at the FPDU it precedes with 0 (RFC 5044 4.3, 7.1.2 rule 7).
  // Any other marker points back to the ULPDU_Length field.
  const bool on_boundary = stage_ == Stage::kLength && length_have_ == 0;
  const std::uint64_t marker_pos = stream_pos_ - kMarkerSize;
  const std::uint64_t expected = on_boundary ? 0 : marker_pos - length_field_pos_;
  if (!FpduPtrMatches(marker.fpdu_ptr, expected)) marker_mismatch_ = true;
}

void FpduParser::StartFpdu() {
  // crc_ was reset when the previous FPDU ended: a marker in front of this
  // FPDU's ULPDU_Length field is already in it.
  length_field_pos_ = stream_pos_;
  header_have_ = 0;
  header_target_ = 0;
  header_sized_ = false;
  truncated_ = false;
  payload_length_ = 0;
  payload_done_ = 0;
  trailer_have_ = 0;
}

bool FpduParser::SizeHeader() {
  header_sized_ = true;
  if (ulpdu_length_ < kControlOctets) {
    // Too short even for the control octets: all of it is a truncated header.
    truncated_ = true;
    header_target_ = ulpdu_length_;
    return true;
  }
  std::size_t wanted = kControlOctets;
  if (config_.header_sizer != nullptr) {
    wanted = config_.header_sizer(header_buf_[0], header_buf_[1]);
    wanted = std::clamp(wanted, kControlOctets, kMaxUlpduHeaderSize);
  }
  truncated_ = wanted > ulpdu_length_;
  header_target_ = std::min<std::size_t>(wanted, ulpdu_length_);
  return header_have_ == header_target_;
}

RxEvent FpduParser::FinishHeader() {
  payload_length_ = ulpdu_length_ - header_have_;
  stage_ = payload_length_ > 0 ? Stage::kPayload : Stage::kTrailer;
  return RxEvent::kHeaderReady;
}

RxEvent FpduParser::FinishFpdu() {
  const std::size_t pad = PadLength(ulpdu_length_);
  if (config_.crc_enabled && Crc32cFromWire(trailer_buf_.data() + pad) != crc_.Value()) {
    return Fail(MpaError::kCrcMismatch);
  }
  // Checked only now: a marker disagreement counts when the CRC is valid or
  // not in use (RFC 5044 8, code 3).
  if (marker_mismatch_) return Fail(MpaError::kMarkerMismatch);
  completion_ = FpduCompletion{ulpdu_length_, config_.crc_enabled};
  crc_ = Crc32c{};
  length_have_ = 0;
  stage_ = Stage::kLength;
  return RxEvent::kFpduComplete;
}

RxEvent FpduParser::Fail(MpaError error) {
  error_ = error;
  stage_ = Stage::kFailed;
  return RxEvent::kError;
}

RxProgress FpduParser::ConsumeFraming(ByteSpan data) {
  RxProgress progress;
  while (progress.consumed < data.size() && progress.event == RxEvent::kNone) {
    if (stage_ == Stage::kFailed) break;
    // Markers interrupt any element, payload included.
    if (MarkerDue()) {
      TakeMarker(data, progress);
      continue;
    }
    if (stage_ == Stage::kPayload) break;  // the caller's octets
    const ByteSpan rest = data.subspan(progress.consumed);
    switch (stage_) {
      case Stage::kLength: {
        if (length_have_ == 0) StartFpdu();
        const std::size_t n = BeforeMarker(std::min(kUlpduLengthSize - length_have_, rest.size()));
        std::memcpy(length_buf_.data() + length_have_, rest.data(), n);
        UpdateCrc(rest.first(n));
        length_have_ += n;
        progress.consumed += n;
        Advance(n);
        if (length_have_ == kUlpduLengthSize) {
          ulpdu_length_ = LoadBe16(length_buf_.data());
          stage_ = Stage::kHeader;
          header_target_ = std::min<std::size_t>(kControlOctets, ulpdu_length_);
          if (ulpdu_length_ == 0 && SizeHeader()) progress.event = FinishHeader();
        }
        break;
      }
      case Stage::kHeader: {
        const std::size_t n = BeforeMarker(std::min(header_target_ - header_have_, rest.size()));
        std::memcpy(header_buf_.data() + header_have_, rest.data(), n);
        UpdateCrc(rest.first(n));
        header_have_ += n;
        progress.consumed += n;
        Advance(n);
        if (header_have_ == header_target_) {
          if (header_sized_ || SizeHeader()) progress.event = FinishHeader();
        }
        break;
      }
      case Stage::kDiscard: {
        const std::size_t n = BeforeMarker(std::min(PayloadRemaining(), rest.size()));
        UpdateCrc(rest.first(n));
        payload_done_ += n;
        progress.consumed += n;
        Advance(n);
        if (PayloadRemaining() == 0) stage_ = Stage::kTrailer;
        break;
      }
      case Stage::kTrailer: {
        const std::size_t pad = PadLength(ulpdu_length_);
        const std::size_t n =
            BeforeMarker(std::min(pad + kCrcSize - trailer_have_, rest.size()));
        std::memcpy(trailer_buf_.data() + trailer_have_, rest.data(), n);
        // Only the pad is covered by the CRC, never the CRC field itself.
        if (trailer_have_ < pad) {
          UpdateCrc(rest.first(std::min(n, pad - trailer_have_)));
        }
        trailer_have_ += n;
        progress.consumed += n;
        Advance(n);
        if (trailer_have_ == pad + kCrcSize) progress.event = FinishFpdu();
        break;
      }
      case Stage::kPayload:
      case Stage::kFailed:
        break;  // left the loop above
    }
  }
  return progress;
}

std::size_t FpduParser::CommitPayload(ByteSpan placed) {
  if (stage_ != Stage::kPayload || MarkerDue()) return 0;
  const std::size_t n = BeforeMarker(std::min(PayloadRemaining(), placed.size()));
  UpdateCrc(placed.first(n));
  payload_done_ += n;
  Advance(n);
  if (PayloadRemaining() == 0) stage_ = Stage::kTrailer;
  return n;
}

void FpduParser::DiscardPayload() {
  if (stage_ == Stage::kPayload) stage_ = Stage::kDiscard;
}

FpduHeaderInfo FpduParser::header() const {
  FpduHeaderInfo info;
  info.ulpdu_length = ulpdu_length_;
  info.header = ByteSpan(header_buf_.data(), header_have_);
  info.payload_length = payload_length_;
  info.truncated = truncated_;
  return info;
}

std::size_t FpduParser::Feed(ByteSpan data, FpduListener& listener) {
  std::size_t total = 0;
  while (total < data.size()) {
    const RxDemand demand = Demand();
    if (demand.kind == RxDemand::Kind::kFailed) break;
    const ByteSpan rest = data.subspan(total);
    if (demand.kind == RxDemand::Kind::kPayload) {
      const ByteSpan piece = rest.first(std::min(demand.length, rest.size()));
      const std::size_t taken = CommitPayload(piece);
      total += taken;
      listener.OnPayload(demand.payload_offset, piece.first(taken));
      continue;
    }
    const RxProgress progress = ConsumeFraming(rest);
    total += progress.consumed;
    switch (progress.event) {
      case RxEvent::kNone:
        break;
      case RxEvent::kHeaderReady:
        listener.OnFpduHeader(header());
        break;
      case RxEvent::kFpduComplete:
        listener.OnFpduComplete(completion_);
        break;
      case RxEvent::kError:
        listener.OnError(error_);
        return total;
    }
    // Cannot happen while framing is demanded; guards against looping forever.
    if (progress.consumed == 0 && progress.event == RxEvent::kNone) break;
  }
  return total;
}

}  // namespace siwx::mpa
