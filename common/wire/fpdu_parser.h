// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Resumable, sans-IO FPDU receive parser for one MPA half-connection
// (RFC 5044 sections 4, 6 and 8).
//
// The parser walks the FPDU stream of one direction: ULPDU_Length, the ULPDU
// (split into the DDP/RDMAP header, which it gathers, and the payload, which
// it hands on), the pad, the CRC, and the markers wherever the grid puts them.
// It finds FPDU boundaries from ULPDU_Length (RFC 5044 6, rule 1), checks each
// marker's FPDUPTR against them, removes the markers, and checks the CRC when
// it was negotiated. The CRC is computed over the FPDU as received, markers
// included (RFC 5044 4.3, 4.4; mpa_markers.h says which markers).
//
// The header and payload of an FPDU are handed over before its CRC, at the
// end, has been checked: that is what direct placement means. The completion
// that follows says whether the FPDU was good; an error instead means it was
// not, and the half-connection is dead (RFC 5044 8: after an error MPA passes
// nothing more on; closing is DDP's ULP's job).
//
// Error precedence at the end of an FPDU (RFC 5044 8): a CRC mismatch (code
// 2) wins; a marker that disagrees with ULPDU_Length (code 3) is reported
// only when the CRC was valid, or not in use. Every marker is checked. The
// marker's reserved half and the pad are ignored apart from the CRC (RFC 5044
// 4.1, 4.3).
//
// Not checked here: anything inside the ULPDU (DDP/RDMAP validation belongs to
// the consumer, which is told when ULPDU_Length is shorter than the header),
// and MULPDU (a receiver takes any ULPDU_Length).
//
// Two ways to drive it, one state machine:
//  - Pull, for direct placement. Demand() says what the next stream octets
//    are: framing octets the parser takes itself (give them to
//    ConsumeFraming, any amount; it stops at payload and after every event),
//    or up to N payload octets at payload offset X (receive them straight
//    into the target, then CommitPayload the placed span so they are CRC'd
//    and counted). A payload demand never crosses a marker or the payload's
//    end. DiscardPayload turns the rest of the current payload into framing
//    octets the parser reads, CRC-checks and drops.
//  - Push: Feed(bytes, listener), which delivers the same events to a
//    listener.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "common/util/bytes.h"
#include "common/wire/crc32c.h"
#include "common/wire/fpdu.h"
#include "common/wire/mpa_constants.h"
#include "common/wire/mpa_markers.h"

namespace siwx::mpa {

// How many leading ULPDU octets are DDP+RDMAP header (fixed bodies such as
// the Read Request's included), given the first two ULPDU octets. Supplied by
// the DDP/RDMAP codec; must not fail.
using UlpduHeaderSizer = std::size_t (*)(std::uint8_t ddp_control, std::uint8_t rdmap_control);

struct FpduParserConfig {
  bool crc_enabled = false;
  bool markers_enabled = false;
  // Stream position modulo kMarkerInterval of the first octet to be parsed;
  // 0 at the start of Full Operation, where the first marker sits.
  std::uint32_t marker_grid_offset = 0;
  // Null means a header of just the two control octets.
  UlpduHeaderSizer header_sizer = nullptr;
};

// The start of the FPDU being received.
struct FpduHeaderInfo {
  std::uint16_t ulpdu_length = 0;
  // The gathered header octets: min(header size, ULPDU_Length). Points into
  // the parser; valid until the next FPDU's ULPDU_Length is consumed.
  ByteSpan header;
  std::size_t payload_length = 0;  // ulpdu_length - header.size()
  // ULPDU_Length is shorter than the header the sizer asked for (or than the
  // two control octets): the whole ULPDU is in `header`; reject it.
  bool truncated = false;
};

struct FpduCompletion {
  std::uint16_t ulpdu_length = 0;
  bool crc_checked = false;  // CRC in use and matched; false when CRC is off
};

// Receives the events of FpduParser::Feed. The parser's DiscardPayload may be
// called from OnFpduHeader and OnPayload; Feed must not be re-entered.
class FpduListener {
 public:
  virtual ~FpduListener() = default;
  virtual void OnFpduHeader(const FpduHeaderInfo& header) = 0;
  // `octets` are payload octets [offset, offset + size) of the current FPDU.
  virtual void OnPayload(std::size_t offset, ByteSpan octets) = 0;
  virtual void OnFpduComplete(const FpduCompletion& completion) = 0;
  // kCrcMismatch or kMarkerMismatch; nothing follows it.
  virtual void OnError(MpaError error) = 0;
};

enum class RxEvent : std::uint8_t {
  kNone = 0,
  kHeaderReady,   // header() describes the new FPDU
  kFpduComplete,  // completion() describes the FPDU just finished
  kError,         // error() says why; the parser takes nothing more
};

struct RxDemand {
  enum class Kind : std::uint8_t {
    kFraming,  // `length` octets the parser takes itself (a hint: it may
               // stop earlier at an event; it never wants fewer than 1)
    kPayload,  // up to `length` payload octets at `payload_offset`
    kFailed,   // an error was reported; nothing more is taken
  };
  Kind kind = Kind::kFraming;
  std::size_t length = 0;
  std::size_t payload_offset = 0;
};

struct RxProgress {
  std::size_t consumed = 0;
  RxEvent event = RxEvent::kNone;
};

class FpduParser {
 public:
  // Capacity for gathered ULPDU headers; larger sizer answers are capped.
  static constexpr std::size_t kMaxUlpduHeaderSize = 128;

  explicit FpduParser(const FpduParserConfig& config);

  RxDemand Demand() const;
  // Takes framing octets from the front of `data`. Stops when the next octet
  // is payload, after an event, or when `data` runs out.
  RxProgress ConsumeFraming(ByteSpan data);
  // Reports payload octets the caller placed, from the front of what Demand
  // offered; returns how many were taken (fewer only if more were given).
  std::size_t CommitPayload(ByteSpan placed);
  // Reads the rest of the current payload as framing: CRC-checked, dropped.
  void DiscardPayload();

  // Push interface over the same state; returns the octets taken (all of
  // `data` unless an error stopped it; 0 once failed).
  std::size_t Feed(ByteSpan data, FpduListener& listener);

  FpduHeaderInfo header() const;
  const FpduCompletion& completion() const { return completion_; }
  MpaError error() const { return error_; }
  bool failed() const { return stage_ == Stage::kFailed; }

  const FpduParserConfig& config() const { return config_; }
  std::uint32_t marker_grid_offset() const { return grid_offset_; }
  std::uint64_t stream_position() const { return stream_pos_; }
  std::uint64_t markers_seen() const { return markers_seen_; }
  // Markers whose reserved half was not zero (ignored per RFC 5044 4.3).
  std::uint64_t markers_with_reserved_bits() const { return markers_reserved_set_; }

 private:
  enum class Stage : std::uint8_t { kLength, kHeader, kPayload, kDiscard, kTrailer, kFailed };

  bool MarkerDue() const {
    return config_.markers_enabled && (marker_have_ > 0 || grid_offset_ == 0);
  }
  // Largest run that does not cross the next marker position.
  std::size_t BeforeMarker(std::size_t n) const;
  void Advance(std::size_t n);
  void TakeMarker(ByteSpan data, RxProgress& progress);
  void StartFpdu();
  bool SizeHeader();  // after the control octets; true when the header is complete
  RxEvent FinishHeader();
  RxEvent FinishFpdu();
  RxEvent Fail(MpaError error);
  // The CRC is only worth computing when it was negotiated.
  void UpdateCrc(ByteSpan octets) {
    if (config_.crc_enabled) crc_.Update(octets);
  }
  std::size_t PayloadRemaining() const { return payload_length_ - payload_done_; }

  FpduParserConfig config_;
  Stage stage_ = Stage::kLength;
  std::uint32_t grid_offset_ = 0;
  std::uint64_t stream_pos_ = 0;

  // Marker in progress.
  std::array<std::uint8_t, kMarkerSize> marker_buf_{};
  std::size_t marker_have_ = 0;
  bool marker_mismatch_ = false;  // some marker of this FPDU disagreed
  std::uint64_t markers_seen_ = 0;
  std::uint64_t markers_reserved_set_ = 0;

  // Current FPDU.
  std::uint64_t length_field_pos_ = 0;  // stream position of ULPDU_Length
  std::array<std::uint8_t, kUlpduLengthSize> length_buf_{};
  std::size_t length_have_ = 0;
  std::uint16_t ulpdu_length_ = 0;
  std::array<std::uint8_t, kMaxUlpduHeaderSize> header_buf_{};
  std::size_t header_have_ = 0;
  std::size_t header_target_ = 0;
  bool header_sized_ = false;
  bool truncated_ = false;
  std::size_t payload_length_ = 0;
  std::size_t payload_done_ = 0;
  std::array<std::uint8_t, kPadAlign - 1 + kCrcSize> trailer_buf_{};
  std::size_t trailer_have_ = 0;
  Crc32c crc_;

  FpduCompletion completion_;
  MpaError error_ = MpaError::kNone;
};

}  // namespace siwx::mpa
