// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// MPA startup frames: the Request, Reply and Rtr frames exchanged before Full
// Operation, in the three dialects siwx speaks.
//
//   0                   1                   2                   3
//   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//  |          Key (16 octets: "MPA ID Req Frame" / "MPA ID Rep Frame"
//  |                           / "MPA ID RtR Frame")                 |
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//  |M|C|R|S|L| Res |      Rev      |          PD_Length            |
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//  ~                 Private Data (PD_Length octets)                 ~
//
// Dialects (both extensions call the bit after R "S"; the revision tells
// them apart, so this file calls it x_bit):
//  - MPA v1, RFC 5044 section 7.1.1: Rev 1, S is part of the reserved Res.
//  - v1 + the Rtr/S-bit peer-to-peer proposal: Rev 1, S in Request and
//    Reply says "an Rtr frame follows"; the Rtr frame has its own key.
//  - MPA v2, RFC 6581 section 6: Rev 2 (enhanced features need Rev >= 2),
//    S = 1 says the Private Data begins with the 4-octet enhanced RDMA
//    connection establishment data (the IRD/ORD word, RFC 6581 section 9);
//    ULP private data follows it and PD_Length counts both. S = 0 is an
//    unenhanced frame whatever the revision.
//
// L (0x0800 of the word, the top bit left of RFC 6581's Res) is not an RFC
// bit: it is the Linux siw driver's experiment "MPA_RR_FLAG_GSO_EXP"
// (drivers/infiniband/sw/siw/iwarp.h defines it as 0x0800 of the flags/Rev
// word). siw sets it in its Request when its try_gso option is on; its Reply
// is the received Request header with the key rewritten (siw_proc_mpareq,
// siw_send_mpareqrep in siw_cm.c), so it echoes the bit; and each siw end
// then lifts its per-FPDU segment limit when the peer's frame carried it
// (siw_proc_mpareply for the Initiator, siw_accept for the Responder). siwx
// reads it the same way: "this end sends and accepts FPDUs larger than the
// EMSS allows (RFC 5044 4.5 MULPDU)". To a peer that does not know it, it is
// a Res bit: set to zero when sending and not checked on reception (RFC 5044
// 7.1.1), so it costs nothing there.
//
//   0                   1                   2                   3
//   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//  |A|B|           IRD             |C|D|           ORD             |
//  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//   RFC 6581 9: A peer-to-peer model, B zero-length Send (FULPDU) RTR,
//   C zero-length RDMA Write RTR, D zero-length RDMA Read RTR; IRD and ORD
//   are 14-bit unsigned, 0x3FFF meaning "not negotiated here, the ULP does
//   it" (9.1).
//
// What the decoder checks: the key (one of the three, rejected at the first
// octet that cannot belong to any of them), Rev (1 or 2 for Request and
// Reply; 1 for Rtr, the only revision the proposal defines it for),
// PD_Length <= 512, and PD_Length >= 4 for a Rev 2 frame with S (RFC 6581 6:
// Private Data MUST begin with the word). What it deliberately does not
// check, because RFC 5044 7.1.1 says "not checked on reception": the Res
// bits (L included) and the R bit of a Request; all are reported so a
// caller can log them. The word's B, C and D are reported as received even when A is 0;
// RFC 6581 9.2 says to ignore them then, and the negotiator does. Which
// frame kind is acceptable in which state, and whether the flags make sense
// for the connection, is the negotiator's business
// (common/mpa/mpa_negotiator.h).
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
inline constexpr std::uint8_t kMpaRevision2 = 2;  // RFC 6581 6: enhanced needs Rev >= 2

// The 16-bit word at octet 16 of every startup frame.
inline constexpr std::uint16_t kStartupFlagM = 0x8000;  // RFC 5044 7.1.1 markers
inline constexpr std::uint16_t kStartupFlagC = 0x4000;  // RFC 5044 7.1.1 CRC
inline constexpr std::uint16_t kStartupFlagR = 0x2000;  // RFC 5044 7.1.1 rejected
// S: the Rtr proposal's indicator in Rev 1, RFC 6581's enhanced-data
// indicator in Rev 2 (RFC 6581 6); it was the top bit of RFC 5044's Res.
inline constexpr std::uint16_t kStartupFlagX = 0x1000;
// L: Linux siw's MPA_RR_FLAG_GSO_EXP, the top bit of RFC 6581's Res.
inline constexpr std::uint16_t kStartupFlagLargeFpdus = 0x0800;
// The Res bits left besides L (RFC 6581 6 Res minus siw's experiment).
inline constexpr std::uint16_t kStartupResMask = 0x0700;
inline constexpr std::uint16_t kStartupRevMask = 0x00FF;  // RFC 5044 7.1.1 Rev

inline constexpr std::size_t kStartupFlagsOffset = kKeySize;         // RFC 5044 7.1.1
inline constexpr std::size_t kStartupPdLengthOffset = kKeySize + 2;  // RFC 5044 7.1.1
static_assert(kStartupHeaderSize == kKeySize + 4, "key + flags/Rev + PD_Length");
static_assert(kKeySize == kRequestKey.size() && kKeySize == kReplyKey.size() &&
              kKeySize == kRtrKey.size());

// The RFC 6581 IRD/ORD word at the front of v2 private data.
inline constexpr std::size_t kIrdOrdWordSize = 4;         // RFC 6581 9
inline constexpr std::uint16_t kMaxIrdOrd = 0x3FFF;       // RFC 6581 9: 14-bit unsigned
inline constexpr std::uint16_t kIrdOrdFlagHigh = 0x8000;  // RFC 6581 9: A (IRD half), C (ORD half)
inline constexpr std::uint16_t kIrdOrdFlagLow = 0x4000;   // RFC 6581 9: B (IRD half), D (ORD half)
// All ones: automatic negotiation of this IRD or ORD is not wanted, the ULP
// handles it; the receiver keeps its local value (RFC 6581 9.1).
inline constexpr std::uint16_t kIrdOrdNotNegotiated = 0x3FFF;  // RFC 6581 9.1
static_assert(kMaxIrdOrd == static_cast<std::uint16_t>(~(kIrdOrdFlagHigh | kIrdOrdFlagLow)));
static_assert(kIrdOrdNotNegotiated == kMaxIrdOrd, "the special value is the all-ones 14 bits");

// Largest ULP private data a frame can carry: all 512 octets, minus the
// IRD/ORD word when that word is present (RFC 6581 9: "reduced by 4 bytes").
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
  bool x_bit = false;         // S: Rtr indicator in Rev 1, enhanced data in Rev 2
  bool large_fpdus = false;   // L: the sender sends and takes FPDUs above MULPDU
  std::uint8_t reserved = 0;  // the three other Res bits, 0..7
  std::uint8_t revision = kMpaRevision1;
  std::uint16_t pd_length = 0;
};

// Rev 1 Request or Reply with S set: the Rtr/S-bit proposal's indicator.
inline bool HasRtrIndicator(const StartupHeader& h) {
  return h.revision == kMpaRevision1 && h.x_bit && h.kind != StartupFrameKind::kRtr;
}
// Rev 2 with S: private data starts with the IRD/ORD word (RFC 6581 6).
inline bool IsEnhanced(const StartupHeader& h) { return h.revision == kMpaRevision2 && h.x_bit; }

// Writes the key of h.kind and the flags/Rev/PD_Length word exactly as given
// (L and Res included, so tests can build frames a conforming sender never
// would).
void EncodeStartupHeader(const StartupHeader& h, std::span<std::uint8_t, kStartupHeaderSize> out);

// The RFC 6581 section 9 IRD/ORD word, in host order.
struct IrdOrdWord {
  std::uint16_t ird = 0;      // 14 bits: inbound RDMA Read queue depth (0x3FFF: ULP's)
  std::uint16_t ord = 0;      // 14 bits: outbound RDMA Read queue depth (0x3FFF: ULP's)
  bool peer_to_peer = false;  // A: peer-to-peer connection model (9.2)
  bool send_rtr = false;      // B: zero-length Send (FULPDU) RTR
  bool write_rtr = false;     // C: zero-length RDMA Write RTR
  bool read_rtr = false;      // D: zero-length RDMA Read RTR

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
  kMissingIrdOrd,       // Rev 2 + S but PD_Length < 4 (RFC 6581 6, 9)
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

// What a sender puts in a frame. Res is always sent as zero (RFC 5044 7.1.1);
// L only when large_fpdus asks for it.
struct StartupFrameSpec {
  StartupFrameKind kind = StartupFrameKind::kRequest;
  bool markers = false;
  bool crc = false;
  bool reject = false;
  bool x_bit = false;
  bool large_fpdus = false;  // L; Request and Reply only
  std::uint8_t revision = kMpaRevision1;
  std::optional<IrdOrdWord> ird_ord;  // required iff revision 2 with x_bit (RFC 6581 6)
  ByteSpan ulp_private_data;
};

enum class StartupEncodeStatus : std::uint8_t {
  kOk,
  kBadRevision,         // not 1 or 2; or an Rtr frame that is not Rev 1
  kRejectInRequest,     // R is "set to zero" in a Request (RFC 5044 7.1.1)
  kBadRtrFlags,         // an Rtr frame with R, S or L set (proposal: S is 0 in Rtr)
  kIrdOrdMismatch,      // IRD/ORD word given without Rev 2 + S, or missing with it (RFC 6581 6)
  kIrdOrdOutOfRange,    // IRD or ORD above 0x3FFF (RFC 6581 9: 14 bits)
  kPrivateDataTooLong,  // the word plus ULP private data exceed 512 octets (RFC 6581 6 PD_Length)
  kRtrFlagsWithoutPeerToPeer,  // B, C or D set with A clear (RFC 6581 9.2: MUST be 0)
};
std::string_view StartupEncodeStatusName(StartupEncodeStatus s);

// Appends the encoded frame to *out. On any status but kOk, *out is unchanged.
StartupEncodeStatus EncodeStartupFrame(const StartupFrameSpec& spec,
                                       std::vector<std::uint8_t>* out);

}  // namespace siwx::mpa
