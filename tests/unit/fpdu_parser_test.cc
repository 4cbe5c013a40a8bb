// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The resumable FPDU receive parser (RFC 5044 sections 4, 6 and 8).
//
// Streams are built by a reference model written here from the RFC text
// (bitwise CRC32c, octet-by-octet marker insertion), except the round-trip
// tests, which use FpduFramer on purpose.
#include "common/wire/fpdu_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <random>
#include <set>
#include <vector>

#include "common/wire/fpdu.h"

#include "test_tools/fpdu_reference.h"
#include "test_tools/mpa_crc_vectors.h"

namespace siwx::mpa {
namespace {

using reference::Bytes;

// --- Reference model ----------------------------------------------------

struct StreamShape {
  bool crc = false;
  bool markers = false;
  std::uint32_t grid = 0;
};

Bytes ReferenceStream(const std::vector<Bytes>& ulpdus, const StreamShape& shape) {
  Bytes stream;
  for (const Bytes& ulpdu : ulpdus) {
    const Bytes fpdu =
        shape.markers
            ? reference::MarkedFpdu(ulpdu, shape.crc,
                                    static_cast<std::uint32_t>((shape.grid + stream.size()) % 512))
            : reference::UnmarkedFpdu(ulpdu, shape.crc);
    stream.insert(stream.end(), fpdu.begin(), fpdu.end());
  }
  return stream;
}

// Stream positions (relative to the stream start) of every marker octet.
std::set<std::size_t> MarkerOctets(std::size_t stream_size, std::uint32_t grid) {
  std::set<std::size_t> octets;
  for (std::size_t at = (512 - grid % 512) % 512; at < stream_size; at += 512) {
    for (std::size_t i = 0; i < 4; ++i) octets.insert(at + i);
  }
  return octets;
}

// The test's header sizer: tagged 14, untagged 18, Read Request 18 + 28.
std::size_t TestHeaderSizer(std::uint8_t ddp_control, std::uint8_t rdmap_control) {
  if (ddp_control & 0x80) return 14;
  if ((rdmap_control & 0x0F) == 1) return 18 + 28;
  return 18;
}

FpduParserConfig Config(const StreamShape& shape, UlpduHeaderSizer sizer = TestHeaderSizer) {
  return {.crc_enabled = shape.crc, .markers_enabled = shape.markers,
          .marker_grid_offset = shape.grid, .header_sizer = sizer};
}

// --- Events -------------------------------------------------------------

struct Event {
  enum Kind { kHeader, kPayload, kComplete, kError };
  Kind kind = kHeader;
  std::uint16_t ulpdu_length = 0;  // kHeader, kComplete
  Bytes octets;                    // kHeader: header; kPayload: payload
  std::size_t number = 0;          // kHeader: payload length; kPayload: offset
  bool flag = false;               // kHeader: truncated; kComplete: crc checked
  MpaError error = MpaError::kNone;
  bool operator==(const Event&) const = default;
};

void PrintTo(const Event& e, std::ostream* os) {
  static const char* const kNames[] = {"header", "payload", "complete", "error"};
  *os << "{" << kNames[e.kind] << " len=" << e.ulpdu_length << " n=" << e.number
      << " flag=" << e.flag << " octets=" << e.octets.size()
      << " error=" << static_cast<int>(e.error) << "}";
}

Event HeaderEvent(const Bytes& ulpdu, std::size_t header_len, bool truncated) {
  return {Event::kHeader, static_cast<std::uint16_t>(ulpdu.size()),
          Bytes(ulpdu.begin(), ulpdu.begin() + static_cast<std::ptrdiff_t>(header_len)),
          ulpdu.size() - header_len, truncated};
}
Event PayloadEvent(std::size_t offset, Bytes octets) {
  return {Event::kPayload, 0, std::move(octets), offset, false};
}
Event CompleteEvent(std::size_t ulpdu_length, bool crc) {
  return {Event::kComplete, static_cast<std::uint16_t>(ulpdu_length), {}, 0, crc};
}
Event ErrorEvent(MpaError error) {
  Event e;
  e.kind = Event::kError;
  e.error = error;
  return e;
}

// Records Feed's events and checks, as they arrive, what must always hold:
// nothing after an error, payload offsets contiguous and inside the payload.
class Recorder : public FpduListener {
 public:
  void OnFpduHeader(const FpduHeaderInfo& h) override {
    Check();
    EXPECT_FALSE(in_fpdu_) << "header inside an FPDU";
    EXPECT_EQ(h.header.size() + h.payload_length, h.ulpdu_length);
    in_fpdu_ = true;
    next_offset_ = 0;
    payload_length_ = h.payload_length;
    events.push_back({Event::kHeader, h.ulpdu_length, Bytes(h.header.begin(), h.header.end()),
                      h.payload_length, h.truncated});
  }
  void OnPayload(std::size_t offset, ByteSpan octets) override {
    Check();
    EXPECT_TRUE(in_fpdu_);
    EXPECT_EQ(offset, next_offset_);
    EXPECT_FALSE(octets.empty());
    EXPECT_LE(offset + octets.size(), payload_length_);
    next_offset_ = offset + octets.size();
    events.push_back(PayloadEvent(offset, Bytes(octets.begin(), octets.end())));
  }
  void OnFpduComplete(const FpduCompletion& c) override {
    Check();
    EXPECT_TRUE(in_fpdu_);
    if (!payload_may_be_discarded) {
      EXPECT_EQ(next_offset_, payload_length_) << "completion before all payload";
    }
    in_fpdu_ = false;
    events.push_back(CompleteEvent(c.ulpdu_length, c.crc_checked));
  }
  void OnError(MpaError error) override {
    Check();
    failed_ = true;
    events.push_back(ErrorEvent(error));
  }

  std::vector<Event> events;
  bool payload_may_be_discarded = false;

 private:
  void Check() { EXPECT_FALSE(failed_) << "event after an error"; }
  bool failed_ = false;
  bool in_fpdu_ = false;
  std::size_t next_offset_ = 0;
  std::size_t payload_length_ = 0;
};

// Merges adjacent payload pieces, so that chunkings can be compared.
std::vector<Event> Normalize(const std::vector<Event>& events) {
  std::vector<Event> out;
  for (const Event& e : events) {
    if (e.kind == Event::kPayload && !out.empty() && out.back().kind == Event::kPayload &&
        out.back().number + out.back().octets.size() == e.number) {
      out.back().octets.insert(out.back().octets.end(), e.octets.begin(), e.octets.end());
      continue;
    }
    out.push_back(e);
  }
  return out;
}

// What a correct parser reports for a good stream of these ULPDUs.
std::vector<Event> ExpectedEvents(const std::vector<Bytes>& ulpdus, bool crc) {
  std::vector<Event> out;
  for (const Bytes& u : ulpdus) {
    std::size_t header_len = u.size();
    bool truncated = true;
    if (u.size() >= 2) {
      const std::size_t wanted = std::clamp<std::size_t>(TestHeaderSizer(u[0], u[1]), 2, 128);
      truncated = wanted > u.size();
      header_len = std::min(wanted, u.size());
    }
    out.push_back(HeaderEvent(u, header_len, truncated));
    if (header_len < u.size()) out.push_back(PayloadEvent(0, Bytes(u.begin() + static_cast<std::ptrdiff_t>(header_len), u.end())));
    out.push_back(CompleteEvent(u.size(), crc));
  }
  return out;
}

enum class Chunking { kWhole, kByteAtATime, kRandom };

std::vector<Event> FeedAll(const Bytes& stream, const FpduParserConfig& config, Chunking how,
                           std::uint32_t seed = 1) {
  FpduParser parser(config);
  Recorder recorder;
  std::mt19937 rng(seed);
  std::size_t at = 0;
  while (at < stream.size()) {
    std::size_t n = stream.size() - at;
    if (how == Chunking::kByteAtATime) n = 1;
    if (how == Chunking::kRandom) n = std::min<std::size_t>(n, 1 + rng() % 700);
    const std::size_t taken = parser.Feed(ByteSpan(stream).subspan(at, n), recorder);
    if (parser.failed()) break;
    EXPECT_EQ(taken, n);
    at += n;
  }
  return Normalize(recorder.events);
}

Bytes Pattern(std::size_t n, std::uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

// A ULPDU of `length` octets that starts like a DDP/RDMAP header of `kind`.
Bytes MakeUlpdu(std::size_t length, int kind, std::uint32_t seed) {
  Bytes u = Pattern(length, seed);
  static const std::uint8_t kControls[][2] = {
      {0xC1, 0x40},  // tagged RDMA Write: 14-octet header
      {0x41, 0x43},  // untagged Send: 18
      {0x41, 0x41},  // Read Request: 46
  };
  if (length >= 1) u[0] = kControls[kind % 3][0];
  if (length >= 2) u[1] = kControls[kind % 3][1];
  return u;
}

std::vector<Bytes> RandomUlpdus(std::size_t count, std::size_t max_len, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Bytes> out;
  for (std::size_t i = 0; i < count; ++i) {
    // Some short ones, to cover truncated headers and empty payloads.
    const std::size_t len = (rng() % 4 == 0) ? rng() % 50 : rng() % (max_len + 1);
    out.push_back(MakeUlpdu(len, static_cast<int>(rng() % 3), static_cast<std::uint32_t>(rng())));
  }
  return out;
}

const Bytes kSendUlpdu = {
    0x41,                    // DDP control: T=0, L=1, DV=01
    0x43,                    // RDMAP control: RV=01, Send
    0x00, 0x00, 0x00, 0x00,  // RsvdULP
    0x00, 0x00, 0x00, 0x00,  // QN = 0
    0x00, 0x00, 0x00, 0x01,  // MSN = 1
    0x00, 0x00, 0x00, 0x00,  // MO = 0
    0x61, 0x62, 0x63, 0x64,  // payload "abcd"
};

// --- Hand-written vectors -----------------------------------------------

TEST(FpduParser, HandWrittenSendWithCrc) {
  const Bytes stream = {
      0x00, 0x16,                                      // ULPDU_Length = 22
      0x41, 0x43, 0x00, 0x00, 0x00, 0x00,              // controls, RsvdULP
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,  // QN 0, MSN 1
      0x00, 0x00, 0x00, 0x00,                          // MO 0
      0x61, 0x62, 0x63, 0x64,                          // "abcd"
      0x71, 0x64, 0x4d, 0x92,                          // CRC32c 0x924D6471, LSB first
  };
  const std::vector<Event> expected = {
      HeaderEvent(kSendUlpdu, 18, false),
      PayloadEvent(0, {0x61, 0x62, 0x63, 0x64}),
      CompleteEvent(22, true),
  };
  EXPECT_EQ(FeedAll(stream, Config({.crc = true}), Chunking::kWhole), expected);
  EXPECT_EQ(FeedAll(stream, Config({.crc = true}), Chunking::kByteAtATime), expected);
}

TEST(FpduParser, HandWrittenStreamStartWithFirstMarker) {
  // The marker in front of the FPDU is covered by its CRC (RFC 5044 4.3, 4.4).
  const Bytes& stream = crc_vectors::kSendAfterFirstMarker;
  FpduParser parser(Config({.crc = true, .markers = true, .grid = 0}));
  Recorder recorder;
  EXPECT_EQ(parser.Feed(stream, recorder), stream.size());
  EXPECT_EQ(Normalize(recorder.events),
            (std::vector<Event>{HeaderEvent(kSendUlpdu, 18, false),
                                PayloadEvent(0, {0x61, 0x62, 0x63, 0x64}),
                                CompleteEvent(22, true)}));
  EXPECT_EQ(parser.markers_seen(), 1u);
  EXPECT_EQ(parser.stream_position(), 32u);
  EXPECT_EQ(parser.marker_grid_offset(), 32u);
}

TEST(FpduParser, HandWrittenTaggedWriteWithPad) {
  const Bytes stream = {
      0x00, 0x0F,                                      // ULPDU_Length = 15
      0xC1, 0x40, 0x12, 0x34, 0x56, 0x78,              // T=1 L=1, Write, STag
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,  // TO
      0x5A,                                            // payload
      0x00, 0x00, 0x00,                                // pad
      0x26, 0xE8, 0x59, 0xEC,                          // CRC32c 0xEC59E826
  };
  const Bytes ulpdu(stream.begin() + 2, stream.begin() + 17);
  EXPECT_EQ(FeedAll(stream, Config({.crc = true}), Chunking::kByteAtATime),
            (std::vector<Event>{HeaderEvent(ulpdu, 14, false), PayloadEvent(0, {0x5A}),
                                CompleteEvent(15, true)}));
}

TEST(FpduParser, HandWrittenMarkerInsideTheUlpduIsCoveredByTheCrc) {
  const Bytes& ulpdu = crc_vectors::kWriteUlpdu;
  const std::vector<Event> expected = {HeaderEvent(ulpdu, 14, false), PayloadEvent(0, {0x5A}),
                                       CompleteEvent(15, true)};
  const FpduParserConfig config = Config({.crc = true, .markers = true, .grid = 504});
  EXPECT_EQ(FeedAll(crc_vectors::kWriteWithMarkerInUlpdu, config, Chunking::kWhole), expected);
  EXPECT_EQ(FeedAll(crc_vectors::kWriteWithMarkerInUlpdu, config, Chunking::kByteAtATime), expected);
}

TEST(FpduParser, HandWrittenMarkerBetweenPadAndCrcIsCoveredByTheCrc) {
  const Bytes& ulpdu = crc_vectors::kWriteUlpdu;
  const std::vector<Event> expected = {HeaderEvent(ulpdu, 14, false), PayloadEvent(0, {0x5A}),
                                       CompleteEvent(15, true)};
  const FpduParserConfig config = Config({.crc = true, .markers = true, .grid = 492});
  EXPECT_EQ(FeedAll(crc_vectors::kWriteWithMarkerBeforeCrc, config, Chunking::kWhole), expected);
  EXPECT_EQ(FeedAll(crc_vectors::kWriteWithMarkerBeforeCrc, config, Chunking::kByteAtATime), expected);
}

// --- Lengths ----------------------------------------------------------------

TEST(FpduParser, EveryPadLength) {
  for (std::size_t len = 18; len < 26; ++len) {
    const std::vector<Bytes> ulpdus = {MakeUlpdu(len, 1, static_cast<std::uint32_t>(len))};
    for (bool crc : {false, true}) {
      EXPECT_EQ(FeedAll(ReferenceStream(ulpdus, {.crc = crc}), Config({.crc = crc}),
                        Chunking::kByteAtATime),
                ExpectedEvents(ulpdus, crc))
          << len;
    }
  }
}

TEST(FpduParser, UlpduLengthZero) {
  const Bytes stream = reference::UnmarkedFpdu({}, true);
  ASSERT_EQ(stream.size(), 8u);  // 00 00 | pad 00 00 | CRC
  EXPECT_EQ(FeedAll(stream, Config({.crc = true}), Chunking::kByteAtATime),
            (std::vector<Event>{HeaderEvent({}, 0, true), CompleteEvent(0, true)}));
}

TEST(FpduParser, UlpduShorterThanItsHeaderIsFlaggedTruncated) {
  // Untagged control octets ask for 18 header octets; ULPDU_Length is 10.
  const Bytes short_send = {0x41, 0x43, 1, 2, 3, 4, 5, 6, 7, 8};
  // A Read Request header is 46 octets; this one has 30.
  const Bytes short_read = MakeUlpdu(30, 2, 1);
  // One octet: not even both control octets.
  const Bytes one = {0x41};
  // A complete Read Request: 46 octets of header, no payload.
  const Bytes read = MakeUlpdu(46, 2, 2);
  const std::vector<Bytes> ulpdus = {short_send, short_read, one, read};
  const std::vector<Event> expected = {
      HeaderEvent(short_send, 10, true), CompleteEvent(10, true),
      HeaderEvent(short_read, 30, true), CompleteEvent(30, true),
      HeaderEvent(one, 1, true),         CompleteEvent(1, true),
      HeaderEvent(read, 46, false),      CompleteEvent(46, true),
  };
  EXPECT_EQ(FeedAll(ReferenceStream(ulpdus, {.crc = true}), Config({.crc = true}), Chunking::kWhole),
            expected);
  EXPECT_EQ(FeedAll(ReferenceStream(ulpdus, {.crc = true}), Config({.crc = true}),
                    Chunking::kByteAtATime),
            expected);
}

TEST(FpduParser, LargestUlpdu) {
  const std::vector<Bytes> ulpdus = {MakeUlpdu(65535, 1, 3), MakeUlpdu(22, 0, 4)};
  const Bytes stream = ReferenceStream(ulpdus, {.crc = true});
  ASSERT_EQ(stream.size(), 65544u + 28u);
  for (Chunking how : {Chunking::kWhole, Chunking::kRandom}) {
    EXPECT_EQ(FeedAll(stream, Config({.crc = true}), how), ExpectedEvents(ulpdus, true));
  }
}

TEST(FpduParser, LargestUlpduWithMarkersCannotPointBackSoItMismatches) {
  // With markers, a 64 KiB FPDU has markers more than 65535 octets after its
  // ULPDU_Length; no FPDUPTR can say so. The stream carries the low 16 bits.
  const std::vector<Bytes> ulpdus = {MakeUlpdu(65535, 1, 5)};
  const StreamShape shape{.crc = true, .markers = true, .grid = 4};
  const std::vector<Event> events = FeedAll(ReferenceStream(ulpdus, shape), Config(shape), Chunking::kRandom);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0], HeaderEvent(ulpdus[0], 18, false));
  EXPECT_EQ(events[1].octets.size(), 65535u - 18u);
  EXPECT_EQ(events[2], ErrorEvent(MpaError::kMarkerMismatch));
}

// --- Chunking -----------------------------------------------------------------

TEST(FpduParser, WholeByteAtATimeAndRandomChunksAgree) {
  const std::vector<Bytes> ulpdus = RandomUlpdus(60, 1800, 7);
  for (bool crc : {false, true}) {
    for (bool markers : {false, true}) {
      for (std::uint32_t grid : {0u, 4u, 96u, 508u, 3u}) {
        const StreamShape shape{.crc = crc, .markers = markers, .grid = grid};
        const Bytes stream = ReferenceStream(ulpdus, shape);
        const std::vector<Event> expected = ExpectedEvents(ulpdus, crc);
        EXPECT_EQ(FeedAll(stream, Config(shape), Chunking::kWhole), expected);
        EXPECT_EQ(FeedAll(stream, Config(shape), Chunking::kByteAtATime), expected);
        for (std::uint32_t seed = 1; seed <= 5; ++seed) {
          EXPECT_EQ(FeedAll(stream, Config(shape), Chunking::kRandom, seed), expected)
              << "crc " << crc << " markers " << markers << " grid " << grid << " seed " << seed;
        }
      }
    }
  }
}

TEST(FpduParser, MarkersAtEveryGridOffsetAreRemoved) {
  const std::vector<Bytes> ulpdus = {MakeUlpdu(700, 1, 8), MakeUlpdu(3, 0, 9), MakeUlpdu(1100, 0, 10)};
  const std::vector<Event> expected = ExpectedEvents(ulpdus, true);
  for (std::uint32_t grid = 0; grid < 512; ++grid) {
    const StreamShape shape{.crc = true, .markers = true, .grid = grid};
    const Bytes stream = ReferenceStream(ulpdus, shape);
    FpduParser parser(Config(shape));
    Recorder recorder;
    ASSERT_EQ(parser.Feed(stream, recorder), stream.size());
    ASSERT_EQ(Normalize(recorder.events), expected) << grid;
    ASSERT_EQ(parser.markers_seen(), MarkerOctets(stream.size(), grid).size() / 4) << grid;
    ASSERT_EQ(parser.marker_grid_offset(), (grid + stream.size()) % 512);
  }
}

// --- Truncation ---------------------------------------------------------------

TEST(FpduParser, EveryPrefixWaitsThenResumesCleanly) {
  const std::vector<Bytes> ulpdus = {MakeUlpdu(30, 1, 11), MakeUlpdu(600, 0, 12), MakeUlpdu(5, 2, 13),
                                     MakeUlpdu(0, 0, 14)};
  for (bool markers : {false, true}) {
    const StreamShape shape{.crc = true, .markers = markers, .grid = 452};
    const Bytes stream = ReferenceStream(ulpdus, shape);
    const std::vector<Event> expected = ExpectedEvents(ulpdus, true);
    // Where each FPDU ends in the stream.
    std::vector<std::size_t> ends;
    {
      std::size_t at = 0;
      for (const Bytes& u : ulpdus) {
        at += FpduWireLength(u.size(), markers, static_cast<std::uint32_t>((shape.grid + at) % 512));
        ends.push_back(at);
      }
      ASSERT_EQ(at, stream.size());
    }
    for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
      FpduParser parser(Config(shape));
      Recorder recorder;
      ASSERT_EQ(parser.Feed(ByteSpan(stream).first(cut), recorder), cut);
      const std::size_t complete =
          static_cast<std::size_t>(std::upper_bound(ends.begin(), ends.end(), cut) - ends.begin());
      std::size_t completions = 0;
      for (const Event& e : recorder.events) {
        ASSERT_NE(e.kind, Event::kError) << cut;
        if (e.kind == Event::kComplete) ++completions;
      }
      ASSERT_EQ(completions, complete) << cut;
      ASSERT_FALSE(parser.failed());
      ASSERT_EQ(parser.Feed(ByteSpan(stream).subspan(cut), recorder), stream.size() - cut);
      ASSERT_EQ(Normalize(recorder.events), expected) << "cut " << cut;
    }
  }
}

// --- Errors -------------------------------------------------------------------

TEST(FpduParser, FlippingAnyOctetOfAnFpduIsACrcMismatch) {
  const Bytes fpdu = reference::UnmarkedFpdu(kSendUlpdu, true);
  ASSERT_EQ(fpdu.size(), 28u);
  for (std::size_t pos = 0; pos < fpdu.size(); ++pos) {
    for (std::uint8_t bit : {0x01, 0x80}) {
      Bytes stream = fpdu;
      stream[pos] ^= bit;
      // Trailing octets let a corrupted ULPDU_Length still reach "its" CRC.
      stream.resize(stream.size() + 70000, 0x00);
      FpduParser parser(Config({.crc = true}));
      Recorder recorder;
      const std::size_t taken = parser.Feed(stream, recorder);
      ASSERT_FALSE(recorder.events.empty());
      EXPECT_EQ(recorder.events.back(), ErrorEvent(MpaError::kCrcMismatch)) << pos;
      for (const Event& e : recorder.events) EXPECT_NE(e.kind, Event::kComplete) << pos;
      EXPECT_EQ(parser.error(), MpaError::kCrcMismatch);
      // It stopped right after the CRC field of the FPDU it believed in.
      const std::size_t believed = (std::size_t{stream[0]} << 8) | stream[1];
      EXPECT_EQ(taken, UnmarkedFpduLength(believed)) << pos;
    }
  }
}

TEST(FpduParser, WithoutCrcTheCrcFieldIsNotChecked) {
  Bytes stream = reference::UnmarkedFpdu(kSendUlpdu, true);  // a real CRC
  stream[24] ^= 0xFF;  // ... now wrong; and a zero-CRC FPDU follows
  const Bytes plain = reference::UnmarkedFpdu(kSendUlpdu, false);
  stream.insert(stream.end(), plain.begin(), plain.end());
  const std::vector<Event> events = FeedAll(stream, Config({.crc = false}), Chunking::kByteAtATime);
  EXPECT_EQ(events, ExpectedEvents({kSendUlpdu, kSendUlpdu}, false));
}

TEST(FpduParser, PadIsIgnoredExceptByTheCrc) {
  const Bytes ulpdu = MakeUlpdu(19, 1, 15);  // 2 + 19 = 21: three pad octets
  // CRC off: any pad goes.
  EXPECT_EQ(FeedAll(reference::UnmarkedFpdu(ulpdu, false, 0xEE), Config({.crc = false}), Chunking::kWhole),
            ExpectedEvents({ulpdu}, false));
  // CRC on, computed over the non-zero pad: good.
  EXPECT_EQ(FeedAll(reference::UnmarkedFpdu(ulpdu, true, 0xEE), Config({.crc = true}), Chunking::kWhole),
            ExpectedEvents({ulpdu}, true));
  // CRC over a zero pad, but the pad sent is not zero: the CRC catches it.
  Bytes stream = reference::UnmarkedFpdu(ulpdu, true, 0x00);
  stream[2 + 19] = 0x01;
  const std::vector<Event> events = FeedAll(stream, Config({.crc = true}), Chunking::kWhole);
  EXPECT_EQ(events.back(), ErrorEvent(MpaError::kCrcMismatch));
}

// A stream of two FPDUs, the first containing markers: grid offset 100, so
// markers sit 412 and 924 octets into the first FPDU.
// Two FPDUs from grid offset 100: markers 412 and 924 octets in, both inside
// the first FPDU. With CRC on, the CRC covers them (RFC 5044 4.3, 4.4).
struct MarkedPair {
  explicit MarkedPair(bool crc = true) : shape{.crc = crc, .markers = true, .grid = 100} {}
  std::vector<Bytes> ulpdus = {MakeUlpdu(1200, 1, 16), MakeUlpdu(40, 0, 17)};
  StreamShape shape;
  Bytes stream = ReferenceStream(ulpdus, shape);
};

TEST(FpduParser, MarkerPointingWrongIsAMarkerMismatchAfterTheFpdu) {
  // CRC off: only the marker check can notice (with CRC on, the CRC over the
  // marker catches it first; see CrcMismatchTakesPrecedenceOverMarkerMismatch).
  MarkedPair pair(/*crc=*/false);
  ASSERT_EQ(Bytes(pair.stream.begin() + 412, pair.stream.begin() + 416), (Bytes{0, 0, 0x01, 0x9C}));
  Bytes stream = pair.stream;
  stream[415] = 0xA0;  // FPDUPTR 0x01A0 = 416: four octets off
  const std::vector<Event> events = FeedAll(stream, Config(pair.shape), Chunking::kRandom);
  // Header and payload went out (direct placement); then the error instead of
  // the completion, and nothing of the second FPDU.
  const std::vector<Event> good = ExpectedEvents(pair.ulpdus, false);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0], good[0]);
  EXPECT_EQ(events[1], good[1]);
  EXPECT_EQ(events[2], ErrorEvent(MpaError::kMarkerMismatch));
}

TEST(FpduParser, MarkerPointerLowBitsAndReservedHalfAreIgnored) {
  // Ignored by the marker check (RFC 5044 4.3), but not by the CRC.
  for (const bool crc : {false, true}) {
    MarkedPair pair(crc);
    Bytes stream = pair.stream;
    stream[415] |= 0x03;  // FPDUPTR low two bits: read as zero
    stream[924] = 0x12;   // reserved half of the second marker
    stream[925] = 0x34;
    FpduParser parser(Config(pair.shape));
    Recorder recorder;
    parser.Feed(stream, recorder);
    if (crc) {
      EXPECT_EQ(recorder.events.back(), ErrorEvent(MpaError::kCrcMismatch));
      continue;
    }
    EXPECT_EQ(Normalize(recorder.events), ExpectedEvents(pair.ulpdus, false));
    EXPECT_EQ(parser.markers_seen(), 2u);
    EXPECT_EQ(parser.markers_with_reserved_bits(), 1u);
  }
}

TEST(FpduParser, CrcMismatchTakesPrecedenceOverMarkerMismatch) {
  MarkedPair pair;
  Bytes stream = pair.stream;
  stream[415] = 0xA0;  // wrong marker
  stream[600] ^= 0x40;  // and a payload octet damaged
  const std::vector<Event> events = FeedAll(stream, Config(pair.shape), Chunking::kByteAtATime);
  EXPECT_EQ(events.back(), ErrorEvent(MpaError::kCrcMismatch));
}

TEST(FpduParser, EachMarkerOctetFlipped) {
  // CRC off: flips in the reserved half or the low FPDUPTR bits are ignored;
  // any other FPDUPTR bit is a marker mismatch.
  MarkedPair pair(/*crc=*/false);
  for (std::size_t pos = 412; pos < 416; ++pos) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes stream = pair.stream;
      stream[pos] ^= static_cast<std::uint8_t>(1u << bit);
      const std::vector<Event> events = FeedAll(stream, Config(pair.shape), Chunking::kWhole);
      const bool ignored = pos < 414 || (pos == 415 && bit < 2);
      if (ignored) {
        EXPECT_EQ(events, ExpectedEvents(pair.ulpdus, false)) << pos << " " << bit;
      } else {
        EXPECT_EQ(events.back(), ErrorEvent(MpaError::kMarkerMismatch)) << pos << " " << bit;
      }
    }
  }
}

TEST(FpduParser, WithCrcEveryMarkerBitIsCovered) {
  // RFC 5044 4.3, 4.4: the CRC covers the FPDU as sent, markers included, so
  // with CRC on a flip of any marker bit, even one the marker check ignores,
  // is a CRC mismatch (code 2), which wins over a marker mismatch (8).
  MarkedPair pair(/*crc=*/true);
  for (const std::size_t marker : {412u, 924u}) {
    for (std::size_t pos = marker; pos < marker + 4; ++pos) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes stream = pair.stream;
        stream[pos] ^= static_cast<std::uint8_t>(1u << bit);
        const std::vector<Event> events = FeedAll(stream, Config(pair.shape), Chunking::kRandom);
        EXPECT_EQ(events.back(), ErrorEvent(MpaError::kCrcMismatch)) << pos << " " << bit;
      }
    }
  }
}

TEST(FpduParser, UlpduLengthThatDisagreesWithAMarker) {
  // CRC off, so nothing but the marker can notice. The first FPDU (500-octet
  // ULPDU, 508 octets from grid offset 4) ends exactly where a marker is due;
  // its ULPDU_Length is lowered to 496, so the parser believes it ends four
  // octets early. It then reads the real CRC field (zeros) as an FPDU with
  // ULPDU_Length 0, finds the marker two octets into that FPDU, expects
  // FPDUPTR 4 there, and sees 0.
  const std::vector<Bytes> ulpdus = {MakeUlpdu(500, 1, 18), MakeUlpdu(60, 1, 19)};
  const StreamShape shape{.crc = false, .markers = true, .grid = 4};
  Bytes stream = ReferenceStream(ulpdus, shape);
  ASSERT_EQ(Bytes(stream.begin() + 508, stream.begin() + 512), (Bytes{0, 0, 0, 0}));
  stream[1] = 0xF0;  // ULPDU_Length 0x01F4 -> 0x01F0
  const Bytes believed(ulpdus[0].begin(), ulpdus[0].begin() + 496);
  const std::vector<Event> expected = {
      HeaderEvent(believed, 18, false),
      PayloadEvent(0, Bytes(believed.begin() + 18, believed.end())),
      CompleteEvent(496, false),
      HeaderEvent({}, 0, true),
      ErrorEvent(MpaError::kMarkerMismatch),
  };
  EXPECT_EQ(FeedAll(stream, Config(shape), Chunking::kWhole), expected);
  EXPECT_EQ(FeedAll(stream, Config(shape), Chunking::kByteAtATime), expected);
}

TEST(FpduParser, NothingIsTakenOrReportedAfterAnError) {
  Bytes stream = ReferenceStream({kSendUlpdu, kSendUlpdu}, {.crc = true});
  stream[10] ^= 1;
  FpduParser parser(Config({.crc = true}));
  Recorder recorder;
  EXPECT_EQ(parser.Feed(stream, recorder), 28u);  // up to the bad CRC
  ASSERT_TRUE(parser.failed());
  const std::size_t count = recorder.events.size();
  EXPECT_EQ(parser.Feed(stream, recorder), 0u);
  EXPECT_EQ(parser.Feed(ByteSpan(stream).subspan(28), recorder), 0u);
  EXPECT_EQ(recorder.events.size(), count);
  EXPECT_EQ(parser.Demand().kind, RxDemand::Kind::kFailed);
  EXPECT_EQ(parser.ConsumeFraming(stream).consumed, 0u);
  EXPECT_EQ(parser.CommitPayload(stream), 0u);
  EXPECT_EQ(parser.error(), MpaError::kCrcMismatch);
}

// --- Header sizer -------------------------------------------------------------

std::size_t ZeroSizer(std::uint8_t, std::uint8_t) { return 0; }
std::size_t HugeSizer(std::uint8_t, std::uint8_t) { return 100000; }

TEST(FpduParser, HeaderSizerAnswersAreClampedToTwoAndCapacity) {
  const Bytes ulpdu = MakeUlpdu(300, 1, 20);
  const Bytes stream = ReferenceStream({ulpdu}, {.crc = true});
  for (UlpduHeaderSizer sizer : {UlpduHeaderSizer{nullptr}, UlpduHeaderSizer{ZeroSizer}}) {
    FpduParser parser(Config({.crc = true}, sizer));
    Recorder recorder;
    parser.Feed(stream, recorder);
    EXPECT_EQ(Normalize(recorder.events),
              (std::vector<Event>{HeaderEvent(ulpdu, 2, false),
                                  PayloadEvent(0, Bytes(ulpdu.begin() + 2, ulpdu.end())),
                                  CompleteEvent(300, true)}));
  }
  FpduParser parser(Config({.crc = true}, HugeSizer));
  Recorder recorder;
  parser.Feed(stream, recorder);
  EXPECT_EQ(Normalize(recorder.events),
            (std::vector<Event>{HeaderEvent(ulpdu, FpduParser::kMaxUlpduHeaderSize, false),
                                PayloadEvent(0, Bytes(ulpdu.begin() + 128, ulpdu.end())),
                                CompleteEvent(300, true)}));
}

// --- Pull interface -----------------------------------------------------------

// Drives the pull interface the way a transport doing direct placement would:
// framing octets read in pieces no longer than demanded, payload received
// straight into per-FPDU target buffers.
struct PullResult {
  std::vector<Bytes> placed;  // payload octets, per FPDU, as placed
  std::vector<Bytes> headers;
  std::size_t completions = 0;
  MpaError error = MpaError::kNone;
};

PullResult DrivePull(const Bytes& stream, const FpduParserConfig& config, std::uint32_t seed,
                     bool discard = false) {
  FpduParser parser(config);
  PullResult result;
  const std::set<std::size_t> marker_octets =
      config.markers_enabled ? MarkerOctets(stream.size(), config.marker_grid_offset)
                             : std::set<std::size_t>{};
  std::mt19937 rng(seed);
  std::size_t at = 0;
  while (at < stream.size()) {
    const RxDemand demand = parser.Demand();
    if (demand.kind == RxDemand::Kind::kFailed) break;
    EXPECT_GE(demand.length, 1u);
    const std::size_t avail = stream.size() - at;
    if (demand.kind == RxDemand::Kind::kPayload) {
      // A payload demand never covers a marker octet nor runs past the payload.
      for (std::size_t i = 0; i < std::min(demand.length, avail); ++i) {
        EXPECT_EQ(marker_octets.count(at + i), 0u) << at + i;
      }
      Bytes& target = result.placed.back();
      EXPECT_LE(demand.payload_offset + demand.length, target.size());
      const std::size_t n = std::min({demand.length, avail, std::size_t{1} + rng() % 300});
      // "recv" straight into the target, then report the placed span.
      std::copy_n(stream.begin() + static_cast<std::ptrdiff_t>(at), n,
                  target.begin() + static_cast<std::ptrdiff_t>(demand.payload_offset));
      EXPECT_EQ(parser.CommitPayload(ByteSpan(target).subspan(demand.payload_offset, n)), n);
      at += n;
      continue;
    }
    // Framing: sometimes exactly the demand, sometimes a little, sometimes more
    // than demanded (the parser stops where the payload starts).
    std::size_t n = demand.length;
    if (rng() % 3 == 0) n = 1 + rng() % demand.length;
    if (rng() % 3 == 0) n += rng() % 64;
    n = std::min(n, avail);
    const RxProgress progress = parser.ConsumeFraming(ByteSpan(stream).subspan(at, n));
    at += progress.consumed;
    switch (progress.event) {
      case RxEvent::kHeaderReady: {
        const FpduHeaderInfo h = parser.header();
        result.headers.emplace_back(h.header.begin(), h.header.end());
        result.placed.emplace_back(h.payload_length, 0);
        if (discard) parser.DiscardPayload();
        break;
      }
      case RxEvent::kFpduComplete:
        ++result.completions;
        break;
      case RxEvent::kError:
        result.error = parser.error();
        return result;
      case RxEvent::kNone:
        // No event: it took all it was given, or stopped where payload starts.
        if (progress.consumed < n) {
          EXPECT_EQ(parser.Demand().kind, RxDemand::Kind::kPayload);
        }
        break;
    }
  }
  return result;
}

TEST(FpduParser, PullInterfacePlacesPayloadDirectly) {
  const std::vector<Bytes> ulpdus = RandomUlpdus(40, 2500, 21);
  for (bool markers : {false, true}) {
    for (std::uint32_t grid : {0u, 36u, 500u, 7u}) {
      const StreamShape shape{.crc = true, .markers = markers, .grid = grid};
      const Bytes stream = ReferenceStream(ulpdus, shape);
      for (std::uint32_t seed = 1; seed <= 3; ++seed) {
        const PullResult r = DrivePull(stream, Config(shape), seed);
        EXPECT_EQ(r.error, MpaError::kNone);
        ASSERT_EQ(r.completions, ulpdus.size());
        const std::vector<Event> expected = ExpectedEvents(ulpdus, true);
        std::size_t fpdu = 0;
        for (const Event& e : expected) {
          if (e.kind == Event::kHeader) {
            EXPECT_EQ(r.headers[fpdu], e.octets);
            EXPECT_EQ(r.placed[fpdu].size(), e.number);
            ++fpdu;
          } else if (e.kind == Event::kPayload) {
            EXPECT_EQ(r.placed[fpdu - 1], e.octets) << "fpdu " << fpdu - 1;
          }
        }
      }
    }
  }
}

TEST(FpduParser, DemandHints) {
  // Grid offset 4, so no marker before the 508th octet.
  const Bytes stream = ReferenceStream({kSendUlpdu}, {.crc = true, .markers = true, .grid = 4});
  FpduParser parser(Config({.crc = true, .markers = true, .grid = 4}));
  RxDemand d = parser.Demand();
  EXPECT_EQ(d.kind, RxDemand::Kind::kFraming);
  EXPECT_EQ(d.length, 4u);  // ULPDU_Length and the two control octets
  RxProgress p = parser.ConsumeFraming(ByteSpan(stream).first(4));
  EXPECT_EQ(p.consumed, 4u);
  EXPECT_EQ(p.event, RxEvent::kNone);
  d = parser.Demand();
  EXPECT_EQ(d.kind, RxDemand::Kind::kFraming);
  EXPECT_EQ(d.length, 16u);  // rest of the 18-octet header
  p = parser.ConsumeFraming(ByteSpan(stream).subspan(4));  // more than that
  EXPECT_EQ(p.consumed, 16u);                              // stops at the payload
  EXPECT_EQ(p.event, RxEvent::kHeaderReady);
  EXPECT_EQ(parser.header().payload_length, 4u);
  d = parser.Demand();
  EXPECT_EQ(d.kind, RxDemand::Kind::kPayload);
  EXPECT_EQ(d.length, 4u);
  EXPECT_EQ(d.payload_offset, 0u);
  EXPECT_EQ(parser.ConsumeFraming(ByteSpan(stream).subspan(20)).consumed, 0u);  // not framing
  EXPECT_EQ(parser.CommitPayload(ByteSpan(stream).subspan(20, 3)), 3u);
  d = parser.Demand();
  EXPECT_EQ(d.length, 1u);
  EXPECT_EQ(d.payload_offset, 3u);
  EXPECT_EQ(parser.CommitPayload(ByteSpan(stream).subspan(23)), 1u);  // takes only what is due
  d = parser.Demand();
  EXPECT_EQ(d.kind, RxDemand::Kind::kFraming);
  EXPECT_EQ(d.length, 4u);  // no pad, CRC
  p = parser.ConsumeFraming(ByteSpan(stream).subspan(24));
  EXPECT_EQ(p.consumed, 4u);
  EXPECT_EQ(p.event, RxEvent::kFpduComplete);
  EXPECT_EQ(parser.completion().ulpdu_length, 22u);
  EXPECT_TRUE(parser.completion().crc_checked);
  // The header stays readable until the next FPDU starts.
  EXPECT_EQ(Bytes(parser.header().header.begin(), parser.header().header.end()),
            Bytes(kSendUlpdu.begin(), kSendUlpdu.begin() + 18));
}

TEST(FpduParser, PayloadDemandStopsAtAMarker) {
  // Grid offset 500: the marker is due 12 octets in, inside the header; the
  // next one 524 octets later, inside the payload.
  const Bytes ulpdu = MakeUlpdu(1000, 1, 22);
  const StreamShape shape{.crc = true, .markers = true, .grid = 500};
  const Bytes stream = ReferenceStream({ulpdu}, shape);
  FpduParser parser(Config(shape));
  RxProgress p = parser.ConsumeFraming(stream);
  EXPECT_EQ(p.consumed, 2u + 18u + 4u);  // the marker inside the header is taken too
  EXPECT_EQ(p.event, RxEvent::kHeaderReady);
  const RxDemand d = parser.Demand();
  EXPECT_EQ(d.kind, RxDemand::Kind::kPayload);
  EXPECT_EQ(d.length, 512u - 4u - (2 + 18 - 12));  // up to the next marker position
  EXPECT_EQ(parser.CommitPayload(ByteSpan(stream).subspan(24, 1000)), d.length);
  const RxDemand m = parser.Demand();
  EXPECT_EQ(m.kind, RxDemand::Kind::kFraming);
  EXPECT_EQ(m.length, 4u);
}

TEST(FpduParser, DiscardedPayloadIsStillCrcChecked) {
  const std::vector<Bytes> ulpdus = {MakeUlpdu(900, 1, 23), MakeUlpdu(50, 0, 24)};
  const StreamShape shape{.crc = true, .markers = true, .grid = 0};
  const Bytes stream = ReferenceStream(ulpdus, shape);
  PullResult r = DrivePull(stream, Config(shape), 5, /*discard=*/true);
  EXPECT_EQ(r.error, MpaError::kNone);
  EXPECT_EQ(r.completions, 2u);
  EXPECT_EQ(r.placed[0], Bytes(900 - 18, 0));  // nothing was placed
  // A damaged octet in the discarded payload is still a CRC mismatch.
  Bytes damaged = stream;
  damaged[300] ^= 0x10;
  r = DrivePull(damaged, Config(shape), 5, /*discard=*/true);
  EXPECT_EQ(r.error, MpaError::kCrcMismatch);
  EXPECT_EQ(r.completions, 0u);
}

class DiscardingRecorder : public Recorder {
 public:
  explicit DiscardingRecorder(FpduParser& parser) : parser_(parser) {
    payload_may_be_discarded = true;
  }
  void OnFpduHeader(const FpduHeaderInfo& h) override {
    Recorder::OnFpduHeader(h);
    if (h.truncated || h.ulpdu_length > 100) parser_.DiscardPayload();
  }

 private:
  FpduParser& parser_;
};

TEST(FpduParser, FeedListenerMayDiscardPayload) {
  const std::vector<Bytes> ulpdus = {MakeUlpdu(400, 1, 25), MakeUlpdu(60, 1, 26)};
  const StreamShape shape{.crc = true, .markers = false};
  FpduParser parser(Config(shape));
  DiscardingRecorder recorder(parser);
  const Bytes stream = ReferenceStream(ulpdus, shape);
  EXPECT_EQ(parser.Feed(stream, recorder), stream.size());
  EXPECT_EQ(Normalize(recorder.events),
            (std::vector<Event>{HeaderEvent(ulpdus[0], 18, false), CompleteEvent(400, true),
                                HeaderEvent(ulpdus[1], 18, false),
                                PayloadEvent(0, Bytes(ulpdus[1].begin() + 18, ulpdus[1].end())),
                                CompleteEvent(60, true)}));
}

// --- Round trip and directions ------------------------------------------------

TEST(FpduRoundTrip, FramerToParserForManySizesAndOffsets) {
  std::mt19937 rng(27);
  for (int round = 0; round < 40; ++round) {
    const bool crc = rng() % 2;
    const bool markers = rng() % 2;
    const std::uint32_t grid = markers ? static_cast<std::uint32_t>(rng() % 512) : 0;
    FpduFramer framer({.crc_enabled = crc, .markers_enabled = markers, .marker_grid_offset = grid});
    std::vector<Bytes> ulpdus;
    Bytes stream;
    for (int i = 0; i < 30; ++i) {
      const std::size_t len = rng() % 3000;
      ulpdus.push_back(MakeUlpdu(len, static_cast<int>(rng() % 3), static_cast<std::uint32_t>(rng())));
      const Bytes& u = ulpdus.back();
      // Header and payload in up to three pieces.
      const std::size_t h = std::min<std::size_t>(u.size(), 18);
      const std::size_t cut = h + (u.size() - h) / 3;
      const ByteSpan pieces[] = {ByteSpan(u).subspan(h, cut - h), ByteSpan(u).subspan(cut)};
      FpduFrame frame;
      ASSERT_EQ(framer.Frame(ByteSpan(u).first(h), pieces, frame), FrameStatus::kOk);
      for (const IoSlice& s : frame.slices()) stream.insert(stream.end(), s.base, s.base + s.len);
    }
    const StreamShape shape{.crc = crc, .markers = markers, .grid = grid};
    ASSERT_EQ(stream, ReferenceStream(ulpdus, shape));
    EXPECT_EQ(FeedAll(stream, Config(shape), Chunking::kRandom, static_cast<std::uint32_t>(round)),
              ExpectedEvents(ulpdus, crc));
    const PullResult r = DrivePull(stream, Config(shape), static_cast<std::uint32_t>(round));
    EXPECT_EQ(r.completions, ulpdus.size());
  }
}

TEST(FpduRoundTrip, LargestUlpduWithoutMarkers) {
  const Bytes u = MakeUlpdu(65535, 1, 28);
  FpduFramer framer({.crc_enabled = true});
  FpduFrame frame;
  ASSERT_EQ(framer.Frame(u, {}, frame), FrameStatus::kOk);
  Bytes stream;
  for (const IoSlice& s : frame.slices()) stream.insert(stream.end(), s.base, s.base + s.len);
  EXPECT_EQ(FeedAll(stream, Config({.crc = true}), Chunking::kRandom), ExpectedEvents({u}, true));
}

TEST(FpduRoundTrip, BothDirectionsAreIndependent) {
  // A->B with markers and CRC, B->A with neither; the FPDUs interleave in time
  // but each parser only sees its own direction's stream.
  FpduFramer a_tx({.crc_enabled = true, .markers_enabled = true});
  FpduFramer b_tx({.crc_enabled = false, .markers_enabled = false});
  FpduParser b_rx({.crc_enabled = true, .markers_enabled = true, .header_sizer = TestHeaderSizer});
  FpduParser a_rx({.crc_enabled = false, .markers_enabled = false, .header_sizer = TestHeaderSizer});
  Recorder at_b;
  Recorder at_a;
  std::vector<Bytes> a_sent;
  std::vector<Bytes> b_sent;
  for (int i = 0; i < 20; ++i) {
    const Bytes from_a = MakeUlpdu(100 + 37 * static_cast<std::size_t>(i), 1, 100 + i);
    const Bytes from_b = MakeUlpdu(700 - 11 * static_cast<std::size_t>(i), 0, 200 + i);
    FpduFrame fa;
    FpduFrame fb;
    ASSERT_EQ(a_tx.Frame(from_a, {}, fa), FrameStatus::kOk);
    ASSERT_EQ(b_tx.Frame(from_b, {}, fb), FrameStatus::kOk);
    for (const IoSlice& s : fa.slices()) EXPECT_EQ(b_rx.Feed(ByteSpan(s.base, s.len), at_b), s.len);
    for (const IoSlice& s : fb.slices()) EXPECT_EQ(a_rx.Feed(ByteSpan(s.base, s.len), at_a), s.len);
    a_sent.push_back(from_a);
    b_sent.push_back(from_b);
  }
  EXPECT_EQ(Normalize(at_b.events), ExpectedEvents(a_sent, true));
  EXPECT_EQ(Normalize(at_a.events), ExpectedEvents(b_sent, false));
  EXPECT_GT(b_rx.markers_seen(), 0u);
  EXPECT_EQ(a_rx.markers_seen(), 0u);
}

}  // namespace
}  // namespace siwx::mpa
