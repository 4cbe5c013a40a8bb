// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// libFuzzer target for the FPDU receive parser (and, in round-trip mode, the
// FPDU framer).
//
// Input layout:
//   [0]     mode bits: 0x01 CRC, 0x02 markers, 0x04 odd header sizer,
//           0x08 discard payloads, 0x10 round trip
//   [1..2]  initial marker grid offset (low 9 bits)
//   [3]     seed of the chunking pattern
//   [4..]   raw mode: the FPDU stream as received
//           round trip: ULPDUs as [length high, length low (mod 3000), octets]
//
// Raw mode checks, with __builtin_trap() on violation: no event after an
// error; payload offsets contiguous and inside the payload; consistent header
// sizes; whole, chunked and pull-driven parsing agree exactly; nothing is
// taken after an error. Round trip additionally checks that the parser gives
// back exactly the ULPDUs the framer framed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/wire/fpdu.h"
#include "common/wire/fpdu_parser.h"

namespace {

using siwx::ByteSpan;
using siwx::mpa::FpduCompletion;
using siwx::mpa::FpduFrame;
using siwx::mpa::FpduFramer;
using siwx::mpa::FpduHeaderInfo;
using siwx::mpa::FpduListener;
using siwx::mpa::FpduParser;
using siwx::mpa::FpduParserConfig;
using siwx::mpa::FrameStatus;
using siwx::mpa::IoSlice;
using siwx::mpa::MpaError;
using siwx::mpa::RxDemand;
using siwx::mpa::RxEvent;
using Bytes = std::vector<std::uint8_t>;

void Require(bool ok) {
  if (!ok) __builtin_trap();
}

std::size_t PlainSizer(std::uint8_t ddp_control, std::uint8_t rdmap_control) {
  if (ddp_control & 0x80) return 14;
  if ((rdmap_control & 0x0F) == 1) return 46;
  return 18;
}

// Answers anything from 0 to far beyond the parser's capacity.
std::size_t OddSizer(std::uint8_t ddp_control, std::uint8_t rdmap_control) {
  return std::size_t{ddp_control} * 3 + (rdmap_control & 1 ? 100000 : 0);
}

struct Event {
  int kind = 0;  // 1 header, 2 payload, 3 complete, 4 error
  std::size_t a = 0;
  std::size_t b = 0;
  Bytes octets;
  bool operator==(const Event&) const = default;
};

void AppendPayload(std::vector<Event>& log, std::size_t offset, ByteSpan octets) {
  if (!log.empty() && log.back().kind == 2 &&
      log.back().a + log.back().octets.size() == offset) {
    log.back().octets.insert(log.back().octets.end(), octets.begin(), octets.end());
    return;
  }
  log.push_back({2, offset, 0, Bytes(octets.begin(), octets.end())});
}

// Records normalized events and checks the invariants as they come.
class Checker : public FpduListener {
 public:
  Checker(FpduParser& parser, bool discard) : parser_(parser), discard_(discard) {}

  void OnFpduHeader(const FpduHeaderInfo& h) override {
    Require(!failed_ && !in_fpdu_);
    Require(h.header.size() + h.payload_length == h.ulpdu_length);
    Require(h.header.size() <= FpduParser::kMaxUlpduHeaderSize);
    in_fpdu_ = true;
    next_ = 0;
    payload_length_ = h.payload_length;
    discarding_ = discard_ && (h.ulpdu_length & 1);
    log.push_back({1, h.ulpdu_length, h.payload_length + (h.truncated ? 1000000 : 0),
                   Bytes(h.header.begin(), h.header.end())});
    if (discarding_) parser_.DiscardPayload();
  }
  void OnPayload(std::size_t offset, ByteSpan octets) override {
    Require(!failed_ && in_fpdu_ && !discarding_);
    Require(offset == next_ && !octets.empty() && offset + octets.size() <= payload_length_);
    next_ = offset + octets.size();
    AppendPayload(log, offset, octets);
  }
  void OnFpduComplete(const FpduCompletion& c) override {
    Require(!failed_ && in_fpdu_);
    Require(discarding_ || next_ == payload_length_);
    in_fpdu_ = false;
    log.push_back({3, c.ulpdu_length, c.crc_checked ? 1u : 0u, {}});
  }
  void OnError(MpaError e) override {
    Require(!failed_);
    Require(e == MpaError::kCrcMismatch || e == MpaError::kMarkerMismatch);
    failed_ = true;
    log.push_back({4, static_cast<std::size_t>(e), 0, {}});
  }

  std::vector<Event> log;

 private:
  FpduParser& parser_;
  bool discard_;
  bool failed_ = false;
  bool in_fpdu_ = false;
  bool discarding_ = false;
  std::size_t next_ = 0;
  std::size_t payload_length_ = 0;
};

// A small deterministic generator for chunk sizes.
struct Chunks {
  std::uint32_t state;
  std::size_t Next(std::size_t left) {
    state = state * 1103515245u + 12345u;
    const std::size_t pick = (state >> 16) % 8;
    const std::size_t n = pick < 4 ? pick + 1 : (state >> 8) % 600 + 1;
    return std::min(n, left);
  }
};

std::vector<Event> FeedWhole(const FpduParserConfig& config, bool discard, ByteSpan stream) {
  FpduParser parser(config);
  Checker checker(parser, discard);
  const std::size_t taken = parser.Feed(stream, checker);
  Require(parser.failed() || taken == stream.size());
  Require(parser.stream_position() == taken);
  if (parser.failed()) {
    Require(parser.Feed(stream, checker) == 0);
    Require(parser.Demand().kind == RxDemand::Kind::kFailed);
  }
  return checker.log;
}

std::vector<Event> FeedChunked(const FpduParserConfig& config, bool discard, ByteSpan stream,
                               std::uint32_t seed) {
  FpduParser parser(config);
  Checker checker(parser, discard);
  Chunks chunks{seed};
  std::size_t at = 0;
  while (at < stream.size() && !parser.failed()) {
    const std::size_t n = chunks.Next(stream.size() - at);
    const std::size_t taken = parser.Feed(stream.subspan(at, n), checker);
    Require(parser.failed() || taken == n);
    at += taken;
  }
  Require(parser.stream_position() == at);
  return checker.log;
}

// The pull interface, placing payload into per-FPDU buffers; reports the same
// normalized events as Feed would.
std::vector<Event> Pull(const FpduParserConfig& config, bool discard, ByteSpan stream,
                        std::uint32_t seed) {
  FpduParser parser(config);
  Checker checker(parser, discard);
  Chunks chunks{seed ^ 0x5A5A5A5Au};
  Bytes target;
  std::size_t at = 0;
  while (at < stream.size()) {
    const RxDemand d = parser.Demand();
    if (d.kind == RxDemand::Kind::kFailed) break;
    Require(d.length >= 1);
    const std::size_t n = chunks.Next(stream.size() - at);
    if (d.kind == RxDemand::Kind::kPayload) {
      Require(d.payload_offset + d.length <= target.size());
      const std::size_t m = std::min(n, d.length);
      std::copy_n(stream.begin() + static_cast<std::ptrdiff_t>(at), m,
                  target.begin() + static_cast<std::ptrdiff_t>(d.payload_offset));
      const ByteSpan placed = ByteSpan(target).subspan(d.payload_offset, m);
      Require(parser.CommitPayload(placed) == m);
      checker.OnPayload(d.payload_offset, placed);
      at += m;
      continue;
    }
    const auto p = parser.ConsumeFraming(stream.subspan(at, n));
    Require(p.consumed <= n);
    at += p.consumed;
    switch (p.event) {
      case RxEvent::kNone:
        Require(p.consumed == n || parser.Demand().kind == RxDemand::Kind::kPayload);
        break;
      case RxEvent::kHeaderReady:
        target.assign(parser.header().payload_length, 0);
        checker.OnFpduHeader(parser.header());
        break;
      case RxEvent::kFpduComplete:
        checker.OnFpduComplete(parser.completion());
        break;
      case RxEvent::kError:
        checker.OnError(parser.error());
        Require(parser.ConsumeFraming(stream.subspan(at)).consumed == 0);
        return checker.log;
    }
  }
  Require(parser.stream_position() == at);
  return checker.log;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  const std::uint8_t mode = data[0];
  FpduParserConfig config;
  config.crc_enabled = mode & 0x01;
  config.markers_enabled = mode & 0x02;
  config.header_sizer = (mode & 0x04) ? OddSizer : PlainSizer;
  config.marker_grid_offset = ((std::uint32_t{data[1]} << 8) | data[2]) & 0x1FF;
  const bool discard = mode & 0x08;
  const std::uint32_t seed = data[3];
  const ByteSpan rest(data + 4, size - 4);

  Bytes framed;
  std::vector<Bytes> ulpdus;
  if (mode & 0x10) {
    // Round trip: frame the ULPDUs the input describes.
    FpduFramer framer({.crc_enabled = config.crc_enabled,
                       .markers_enabled = config.markers_enabled,
                       .marker_grid_offset = config.marker_grid_offset});
    std::size_t at = 0;
    while (at + 2 <= rest.size()) {
      const std::size_t want = ((std::size_t{rest[at]} << 8) | rest[at + 1]) % 3000;
      at += 2;
      const std::size_t len = std::min(want, rest.size() - at);
      ulpdus.emplace_back(rest.begin() + static_cast<std::ptrdiff_t>(at),
                          rest.begin() + static_cast<std::ptrdiff_t>(at + len));
      at += len;
      const Bytes& u = ulpdus.back();
      const std::size_t split = u.size() / 2;
      const ByteSpan pieces[] = {ByteSpan(u).subspan(split)};
      FpduFrame frame;
      Require(framer.Frame(ByteSpan(u).first(split), pieces, frame) == FrameStatus::kOk);
      Require(frame.wire_length() ==
              siwx::mpa::FpduWireLength(u.size(), config.markers_enabled,
                                        static_cast<std::uint32_t>(
                                            (config.marker_grid_offset + framed.size()) % 512)));
      for (const IoSlice& s : frame.slices()) framed.insert(framed.end(), s.base, s.base + s.len);
    }
  }
  const ByteSpan stream = (mode & 0x10) ? ByteSpan(framed) : rest;

  const std::vector<Event> whole = FeedWhole(config, discard, stream);
  Require(FeedChunked(config, discard, stream, seed) == whole);
  Require(Pull(config, discard, stream, seed) == whole);

  if (mode & 0x10) {
    // Exactly the ULPDUs framed, each complete, no error.
    std::size_t completions = 0;
    Bytes got;
    Bytes sent;
    for (const Bytes& u : ulpdus) sent.insert(sent.end(), u.begin(), u.end());
    for (const Event& e : whole) {
      Require(e.kind != 4);
      if (e.kind == 1) got.insert(got.end(), e.octets.begin(), e.octets.end());
      if (e.kind == 2) got.insert(got.end(), e.octets.begin(), e.octets.end());
      if (e.kind == 3) ++completions;
    }
    Require(completions == ulpdus.size());
    if (!discard) Require(got == sent);
  }
  return 0;
}
