// MPA startup frames: the Request, Reply and Rtr frames exchanged before Full
// Operation, in the three dialects siwx speaks.
//
//   0                   1                   2                   3
//   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//  |          Key (16 octets: "MPA ID Req Frame" / "MPA ID Rep Frame"
//  |                           / "MPA ID RtR Frame")                 |
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//  |M|C|R|X|  Res  |      Rev      |          PD_Length            |
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//  ~                 Private Data (PD_Length octets)                 ~
//
// Dialects (the revision tells them apart; bit X is the same position):
//  - MPA v1, RFC 5044 section 7.1.1: Rev 1, X is reserved.
//  - v1 + the Rtr/S-bit peer-to-peer proposal: Rev 1, X is "S" in Request
//    and Reply; a third frame, the Rtr frame, has its own key.
//  - MPA v2, RFC 6581: Rev 2, X is the "enhanced connection establishment"
//    bit; when set, the first 4 octets of Private Data are the IRD/ORD word:
//
//   0                   1                   2                   3
//   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//  |A|B|           IRD             |C|D|           ORD             |
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//   A peer-to-peer, B zero-length Send RTR, C zero-length RDMA Write RTR,
//   D zero-length RDMA Read RTR.
//
// What the decoder checks: the key (one of the three, rejected at the first
// octet that cannot belong to any of them), Rev (1 or 2 for Request and
// Reply; 1 for Rtr, the only revision the proposal defines it for),
// PD_Length <= 512, and PD_Length >= 4 for a Rev 2 frame with the enhanced
// bit. What it deliberately does not check, because RFC 5044 7.1.1 says
// "not checked on reception": the Res bits and the R bit of a Request; both
// are reported so a caller can log them. Which frame kind is acceptable in
// which state, and whether the flags make sense for the connection, is the
// negotiator's business (common/mpa/mpa_negotiator.h).
//
// The decoder is incremental-friendly: given any prefix of a frame it says
// how many more octets it needs; it never consumes octets past the frame
// (those belong to the FPDU stream). Decoded spans point into the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/util/bytes.h"
#include "common/wire/mpa_constants.h"

namespace siwx::mpa {

inline constexpr std::uint8_t kMpaRevision1 = 1;  // RFC 5044 7.1.1
inline constexpr std::uint8_t kMpaRevision2 = 2;  // RFC 6581 (MPA v2)

// The 16-bit word at octet 16 of every startup frame.
inline constexpr std::uint16_t kStartupFlagM = 0x8000;  // RFC 5044 7.1.1 markers
inline constexpr std::uint16_t kStartupFlagC = 0x4000;  // RFC 5044 7.1.1 CRC
inline constexpr std::uint16_t kStartupFlagR = 0x2000;  // RFC 5044 7.1.1 rejected
// S (Rtr proposal, Rev 1) or "enhanced" (RFC 6581, Rev 2): same bit.
inline constexpr std::uint16_t kStartupFlagX = 0x1000;
inline constexpr std::uint16_t kStartupResMask = 0x0F00;  // RFC 5044 7.1.1 Res
inline constexpr std::uint16_t kStartupRevMask = 0x00FF;  // RFC 5044 7.1.1 Rev

inline constexpr std::size_t kStartupFlagsOffset = kKeySize;         // RFC 5044 7.1.1
inline constexpr std::size_t kStartupPdLengthOffset = kKeySize + 2;  // RFC 5044 7.1.1
static_assert(kStartupHeaderSize == kKeySize + 4, "key + flags/Rev + PD_Length");
static_assert(kKeySize == kRequestKey.size() && kKeySize == kReplyKey.size() &&
              kKeySize == kRtrKey.size());

// The RFC 6581 IRD/ORD word at the front of v2 private data.
inline constexpr std::size_t kIrdOrdWordSize = 4;         // RFC 6581 IRD/ORD word
inline constexpr std::uint16_t kMaxIrdOrd = 0x3FFF;       // RFC 6581: 14-bit values
inline constexpr std::uint16_t kIrdOrdFlagHigh = 0x8000;  // A (IRD half), C (ORD half)
inline constexpr std::uint16_t kIrdOrdFlagLow = 0x4000;   // B (IRD half), D (ORD half)
static_assert(kMaxIrdOrd == static_cast<std::uint16_t>(~(kIrdOrdFlagHigh | kIrdOrdFlagLow)));

// Largest ULP private data a frame can carry: all 512 octets, minus the
// IRD/ORD word when that word is present.
inline constexpr std::size_t kMaxUlpPrivateDataV1 = kMaxPrivateDataLength;
inline constexpr std::size_t kMaxUlpPrivateDataEnhanced = kMaxPrivateDataLength - kIrdOrdWordSize;

enum class StartupFrameKind : std::uint8_t {
  kRequest,  // "MPA ID Req Frame", sent by the Initiator
  kReply,    // "MPA ID Rep Frame", sent by the Responder
  kRtr,      // "MPA ID RtR Frame", Rtr/S-bit proposal, sent by the Initiator
};
std::string_view StartupFrameKindName(StartupFrameKind kind);
std::string_view StartupFrameKey(StartupFrameKind kind);

// The fixed 20-octet part of a startup frame, in host order.
struct StartupHeader {
  StartupFrameKind kind = StartupFrameKind::kRequest;
  bool markers = false;       // M
  bool crc = false;           // C
  bool reject = false;        // R (meaningful in a Reply only)
  bool x_bit = false;         // S in Rev 1, enhanced in Rev 2
  std::uint8_t reserved = 0;  // the four Res bits, 0..15
  std::uint8_t revision = kMpaRevision1;
  std::uint16_t pd_length = 0;
};

// Rev 1 Request or Reply with S set: the Rtr/S-bit proposal's indicator.
inline bool HasRtrIndicator(const StartupHeader& h) {
  return h.revision == kMpaRevision1 && h.x_bit && h.kind != StartupFrameKind::kRtr;
}
// Rev 2 with the enhanced bit: private data starts with the IRD/ORD word.
inline bool IsEnhanced(const StartupHeader& h) { return h.revision == kMpaRevision2 && h.x_bit; }

// Writes the key of h.kind and the flags/Rev/PD_Length word exactly as given
// (Res included, so tests can build frames a conforming sender never would).
void EncodeStartupHeader(const StartupHeader& h, std::span<std::uint8_t, kStartupHeaderSize> out);

// The RFC 6581 IRD/ORD word, in host order.
struct IrdOrdWord {
  std::uint16_t ird = 0;      // 14 bits: incoming RDMA Read queue depth
  std::uint16_t ord = 0;      // 14 bits: outgoing RDMA Read queue depth
  bool peer_to_peer = false;  // A
  bool send_rtr = false;      // B: zero-length Send
  bool write_rtr = false;     // C: zero-length RDMA Write
  bool read_rtr = false;      // D: zero-length RDMA Read

  friend bool operator==(const IrdOrdWord&, const IrdOrdWord&) = default;
};
// Values above kMaxIrdOrd are truncated to 14 bits; EncodeStartupFrame
// refuses them before it gets here.
void EncodeIrdOrdWord(const IrdOrdWord& w, std::span<std::uint8_t, kIrdOrdWordSize> out);
IrdOrdWord DecodeIrdOrdWord(std::span<const std::uint8_t, kIrdOrdWordSize> in);

enum class StartupDecodeStatus : std::uint8_t {
  kComplete,   // a whole frame; `consumed` octets belong to it
  kNeedMore,   // a valid prefix; at least `needed` more octets are required
  kMalformed,  // `error` says why; the connection must be closed (RFC 5044 7.1.2 rules 2, 3, 5, 9)
};

enum class StartupFrameError : std::uint8_t {
  kNone,
  kBadKey,              // none of the three keys (RFC 5044 7.1.2 rule 5)
  kBadRevision,         // Rev 0 or 3+, or an Rtr frame that is not Rev 1 (RFC 5044 7.1.1 Rev)
  kPrivateDataTooLong,  // PD_Length > 512 (RFC 5044 7.1.1 PD_Length, rule 9)
  kMissingIrdOrd,       // Rev 2 + enhanced bit but PD_Length < 4 (RFC 6581)
};
std::string_view StartupFrameErrorName(StartupFrameError e);

struct StartupFrameView {
  StartupHeader header;
  std::optional<IrdOrdWord> ird_ord;  // set iff IsEnhanced(header)
  ByteSpan private_data;              // the whole PD_Length octets
  ByteSpan ulp_private_data;          // private_data after the IRD/ORD word, if any
};

struct StartupDecodeResult {
  StartupDecodeStatus status = StartupDecodeStatus::kNeedMore;
  StartupFrameError error = StartupFrameError::kNone;
  std::size_t needed = 0;    // kNeedMore only
  std::size_t consumed = 0;  // kComplete only: 20 + PD_Length
  StartupFrameView frame;    // kComplete only
};

// Decodes the frame at the front of `input`; octets after it are ignored.
StartupDecodeResult DecodeStartupFrame(ByteSpan input);

// What a sender puts in a frame. Res is always sent as zero (RFC 5044 7.1.1).
struct StartupFrameSpec {
  StartupFrameKind kind = StartupFrameKind::kRequest;
  bool markers = false;
  bool crc = false;
  bool reject = false;
  bool x_bit = false;
  std::uint8_t revision = kMpaRevision1;
  std::optional<IrdOrdWord> ird_ord;  // required iff revision 2 with x_bit
  ByteSpan ulp_private_data;
};

enum class StartupEncodeStatus : std::uint8_t {
  kOk,
  kBadRevision,         // not 1 or 2; or an Rtr frame that is not Rev 1
  kRejectInRequest,     // R is "set to zero" in a Request (RFC 5044 7.1.1)
  kBadRtrFlags,         // an Rtr frame with R or S set (proposal: S is 0 in Rtr)
  kIrdOrdMismatch,      // IRD/ORD word given without Rev 2 + enhanced, or missing with it
  kIrdOrdOutOfRange,    // IRD or ORD above 0x3FFF
  kPrivateDataTooLong,  // the word plus ULP private data exceed 512 octets
};
std::string_view StartupEncodeStatusName(StartupEncodeStatus s);

// Appends the encoded frame to *out. On any status but kOk, *out is unchanged.
StartupEncodeStatus EncodeStartupFrame(const StartupFrameSpec& spec,
                                       std::vector<std::uint8_t>* out);

}  // namespace siwx::mpa
