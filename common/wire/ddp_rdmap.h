// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// DDP (RFC 5041) and RDMAP (RFC 5040, RFC 7306) headers of a ULPDU: the
// control octets, the tagged and untagged DDP headers, and the fixed RDMAP
// bodies that follow them (RDMA Read Request, Immediate Data, Atomic Request
// and Atomic Response; for Terminate, the raw 4-octet Terminate Control).
// The Terminate header proper has its own codec in common/wire/terminate.h.
//
// Everything here is host order; Encode/Decode are the only code that knows
// the wire layout. A ULPDU starts with the DDP header:
//
//   octet 0     DDP control: T(0x80) L(0x40) Rsvd(0x3C) DV(0x03)
//   octet 1     RsvdULP[0:7] = RDMAP control: RV(0xC0) Rsv(0x30) OpCode(0x0F)
//   tagged:     STag(4) TO(8)                                -> 14 octets
//   untagged:   RsvdULP[8:39] = Invalidate STag(4) QN(4) MSN(4) MO(4) -> 18
//   then the opcode's fixed RDMAP body, if it has one.
//
// What the decoder validates is listed with HeaderStatus. It does not check
// anything that needs connection state (STag validity, MSN range, buffer
// sizes, whether RFC 7306 was negotiated): that is the engine's job.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include "common/util/bytes.h"

namespace siwx::rdmap {

// ---- DDP header (RFC 5041 section 4) ----

inline constexpr std::size_t kDdpTaggedHeaderSize = 14;    // RFC 5041 4.2
inline constexpr std::size_t kDdpUntaggedHeaderSize = 18;  // RFC 5041 4.3
// Control + RsvdULP, STag, TO / control + RsvdULP (40 bits), QN, MSN, MO.
static_assert(kDdpTaggedHeaderSize == 1 + 1 + 4 + 8);
static_assert(kDdpUntaggedHeaderSize == 1 + 5 + 4 + 4 + 4);

inline constexpr std::uint8_t kDdpTaggedFlag = 0x80;     // T, RFC 5041 4.1
inline constexpr std::uint8_t kDdpLastFlag = 0x40;       // L, RFC 5041 4.1
inline constexpr std::uint8_t kDdpReservedMask = 0x3C;   // Rsvd, RFC 5041 4.1
inline constexpr unsigned kDdpReservedShift = 2;
inline constexpr std::uint8_t kDdpVersionMask = 0x03;    // DV, RFC 5041 4.1
inline constexpr std::uint8_t kDdpVersion = 1;           // RFC 5041 4.1

// ---- RDMAP control field (RFC 5040 section 4.1) ----

inline constexpr std::uint8_t kRdmapVersionMask = 0xC0;   // RV, RFC 5040 4.1
inline constexpr unsigned kRdmapVersionShift = 6;
inline constexpr std::uint8_t kRdmapReservedMask = 0x30;  // Rsv, RFC 5040 4.1
inline constexpr unsigned kRdmapReservedShift = 4;
inline constexpr std::uint8_t kRdmapOpcodeMask = 0x0F;    // OpCode, RFC 5040 4.1
// RFC 5040 4.1 also calls RV 00b (the RDMA Consortium protocol) valid; siwx
// speaks only the IETF version and rejects 00b as an invalid version.
inline constexpr std::uint8_t kRdmapVersion = 1;          // RFC 5040 4.1

// ---- Fixed RDMAP bodies ----

inline constexpr std::size_t kReadRequestBodySize = 28;     // RFC 5040 4.4
inline constexpr std::size_t kTerminateControlSize = 4;     // RFC 5040 4.8 (19 bits + 13 reserved)
inline constexpr std::size_t kImmediateDataSize = 8;        // RFC 7306 6.2
inline constexpr std::size_t kAtomicRequestBodySize = 52;   // RFC 7306 5.2.1, Figure 4
// RFC 7306 section 4 says 32 octets, but Figure 6 and Appendix A.2 define
// 4 + 8 octets; the figures are what peers put on the wire.
inline constexpr std::size_t kAtomicResponseBodySize = 12;  // RFC 7306 5.2.2, Figure 6
static_assert(kReadRequestBodySize == 4 + 8 + 4 + 4 + 8);
static_assert(kAtomicRequestBodySize == 4 + 4 + 4 + 8 + 4 * 8);
static_assert(kAtomicResponseBodySize == 4 + 8);

// Untagged queue numbers (RFC 5040 4.1 Figure 4, RFC 7306 10.2).
inline constexpr std::uint32_t kQnSend = 0;            // Send variants, Immediate Data
inline constexpr std::uint32_t kQnReadRequest = 1;     // RDMA Read Request, Atomic Request
inline constexpr std::uint32_t kQnTerminate = 2;       // Terminate
inline constexpr std::uint32_t kQnAtomicResponse = 3;  // Atomic Response (RFC 7306 4)
inline constexpr std::uint32_t kMaxQueueNumber = kQnAtomicResponse;

// RDMA Message OpCodes (RFC 5040 4.1 Figure 4, RFC 7306 4.1 Figure 2).
// 0xC-0xF are unassigned. A value of this type may hold any 4-bit code.
enum class Opcode : std::uint8_t {
  kRdmaWrite = 0x0,
  kRdmaReadRequest = 0x1,
  kRdmaReadResponse = 0x2,
  kSend = 0x3,
  kSendWithInvalidate = 0x4,
  kSendWithSe = 0x5,
  kSendWithSeAndInvalidate = 0x6,
  kTerminate = 0x7,
  kImmediateData = 0x8,        // RFC 7306
  kImmediateDataWithSe = 0x9,  // RFC 7306
  kAtomicRequest = 0xA,        // RFC 7306
  kAtomicResponse = 0xB,       // RFC 7306
};

// What follows the fixed header of a message's DDP segments.
enum class AfterHeader : std::uint8_t {
  kUlpPayload,             // ULP payload allowed (RFC 5040 Figure 5)
  kNothing,                // the message is exactly its header
  kTerminateHeaderCopies,  // the variable part of the Terminate header (RFC 5040 4.8)
};

enum class OpcodeSpec : std::uint8_t { kRfc5040, kRfc7306 };

// One row of the opcode table.
struct OpcodeInfo {
  Opcode opcode;
  std::string_view name;
  bool tagged;                 // T flag the message must carry
  std::uint32_t queue_number;  // QN for untagged messages; unused when tagged
  // DDP header plus the fixed RDMAP body: what UlpduHeaderLength returns.
  std::size_t header_length;
  bool has_invalidate_stag;    // RsvdULP[8:39] carries an STag to invalidate
  AfterHeader after_header;
  // The message must be exactly one DDP segment (L set, MO zero): true for
  // every message that is only a header, since its body cannot be split.
  bool single_segment;
  OpcodeSpec spec;
};

inline constexpr std::array<OpcodeInfo, 12> kOpcodeTable = {{
    {Opcode::kRdmaWrite, "RDMA Write", true, 0, kDdpTaggedHeaderSize, false,
     AfterHeader::kUlpPayload, false, OpcodeSpec::kRfc5040},
    {Opcode::kRdmaReadRequest, "RDMA Read Request", false, kQnReadRequest,
     kDdpUntaggedHeaderSize + kReadRequestBodySize, false, AfterHeader::kNothing, true,
     OpcodeSpec::kRfc5040},
    {Opcode::kRdmaReadResponse, "RDMA Read Response", true, 0, kDdpTaggedHeaderSize, false,
     AfterHeader::kUlpPayload, false, OpcodeSpec::kRfc5040},
    {Opcode::kSend, "Send", false, kQnSend, kDdpUntaggedHeaderSize, false,
     AfterHeader::kUlpPayload, false, OpcodeSpec::kRfc5040},
    {Opcode::kSendWithInvalidate, "Send with Invalidate", false, kQnSend,
     kDdpUntaggedHeaderSize, true, AfterHeader::kUlpPayload, false, OpcodeSpec::kRfc5040},
    {Opcode::kSendWithSe, "Send with Solicited Event", false, kQnSend, kDdpUntaggedHeaderSize,
     false, AfterHeader::kUlpPayload, false, OpcodeSpec::kRfc5040},
    {Opcode::kSendWithSeAndInvalidate, "Send with Solicited Event and Invalidate", false,
     kQnSend, kDdpUntaggedHeaderSize, true, AfterHeader::kUlpPayload, false,
     OpcodeSpec::kRfc5040},
    {Opcode::kTerminate, "Terminate", false, kQnTerminate,
     kDdpUntaggedHeaderSize + kTerminateControlSize, false,
     AfterHeader::kTerminateHeaderCopies, true, OpcodeSpec::kRfc5040},
    {Opcode::kImmediateData, "Immediate Data", false, kQnSend,
     kDdpUntaggedHeaderSize + kImmediateDataSize, false, AfterHeader::kNothing, true,
     OpcodeSpec::kRfc7306},
    {Opcode::kImmediateDataWithSe, "Immediate Data with Solicited Event", false, kQnSend,
     kDdpUntaggedHeaderSize + kImmediateDataSize, false, AfterHeader::kNothing, true,
     OpcodeSpec::kRfc7306},
    {Opcode::kAtomicRequest, "Atomic Request", false, kQnReadRequest,
     kDdpUntaggedHeaderSize + kAtomicRequestBodySize, false, AfterHeader::kNothing, true,
     OpcodeSpec::kRfc7306},
    {Opcode::kAtomicResponse, "Atomic Response", false, kQnAtomicResponse,
     kDdpUntaggedHeaderSize + kAtomicResponseBodySize, false, AfterHeader::kNothing, true,
     OpcodeSpec::kRfc7306},
}};

// The table row of a 4-bit opcode, or nullptr if it is unassigned.
constexpr const OpcodeInfo* FindOpcode(std::uint8_t opcode) {
  return opcode < kOpcodeTable.size() ? &kOpcodeTable[opcode] : nullptr;
}
constexpr const OpcodeInfo* FindOpcode(Opcode opcode) {
  return FindOpcode(static_cast<std::uint8_t>(opcode));
}

// The table is indexed by opcode value.
constexpr bool OpcodeTableIsIndexed() {
  for (std::size_t i = 0; i < kOpcodeTable.size(); ++i) {
    if (static_cast<std::size_t>(kOpcodeTable[i].opcode) != i) return false;
  }
  return true;
}
static_assert(OpcodeTableIsIndexed());

// Name of an opcode for logs ("unassigned opcode" for 0xC-0xF and beyond).
std::string_view OpcodeName(std::uint8_t opcode);

// Control octets as this implementation sends them: DV 1, RV 1, reserved 0.
constexpr std::uint8_t MakeDdpControl(bool tagged, bool last) {
  return static_cast<std::uint8_t>((tagged ? kDdpTaggedFlag : 0) | (last ? kDdpLastFlag : 0) |
                                   kDdpVersion);
}
constexpr std::uint8_t MakeRdmapControl(Opcode opcode) {
  return static_cast<std::uint8_t>((kRdmapVersion << kRdmapVersionShift) |
                                   (static_cast<std::uint8_t>(opcode) & kRdmapOpcodeMask));
}
static_assert(MakeDdpControl(false, true) == 0x41);  // siw's untagged control octet
static_assert(MakeDdpControl(true, true) == 0xC1);   // siw's tagged control octet
static_assert(MakeRdmapControl(Opcode::kSend) == 0x43);
static_assert(MakeRdmapControl(Opcode::kRdmaReadRequest) == 0x41);
static_assert(MakeRdmapControl(Opcode::kRdmaWrite) == 0x40);
static_assert(MakeRdmapControl(Opcode::kRdmaReadResponse) == 0x42);

// How many octets at the start of a ULPDU make up its DDP header and fixed
// RDMAP body, judged from the first two octets alone. This is what the FPDU
// parser reads before it places payload. For control octets that name no
// usable message (DV or RV other than 1, an unassigned opcode, or a T flag
// that contradicts the opcode) it returns the plain DDP header length (14
// tagged, 18 untagged), enough for DecodeDdpRdmapHeader to say what is wrong.
// For Terminate it covers the 4-octet Terminate Control only; the header
// copies after it are left for DecodeTerminateHeader.
std::size_t UlpduHeaderLength(std::uint8_t ddp_control, std::uint8_t rdmap_control);

// ---- Fixed bodies ----

// RDMA Read Request Header (RFC 5040 4.4, Figure 6).
struct ReadRequestBody {
  std::uint32_t sink_stag = 0;    // Data Sink STag
  std::uint64_t sink_to = 0;      // Data Sink Tagged Offset
  std::uint32_t read_size = 0;    // RDMA Read Message Size (RDMARDSZ)
  std::uint32_t source_stag = 0;  // Data Source STag
  std::uint64_t source_to = 0;    // Data Source Tagged Offset
  friend bool operator==(const ReadRequestBody&, const ReadRequestBody&) = default;
};

// Immediate Data header (RFC 7306 6.2): eight opaque octets.
struct ImmediateDataBody {
  std::array<std::uint8_t, kImmediateDataSize> data{};
  friend bool operator==(const ImmediateDataBody&, const ImmediateDataBody&) = default;
};

// Atomic Operation Codes (RFC 7306 5.2.1 Figure 5, 10.1); 0x1 is reserved.
enum class AtomicOpcode : std::uint8_t { kFetchAdd = 0x0, kCmpSwap = 0x2 };
inline constexpr std::uint32_t kAtomicOpcodeMask = 0x0000000F;  // RFC 7306 5.2.1
inline constexpr std::uint32_t kAtomicReservedMax = 0x0FFFFFFF;  // 28 reserved bits

// Atomic Operation Request Header (RFC 7306 5.2.1, Figure 4).
struct AtomicRequestBody {
  std::uint32_t reserved = 0;       // 28 bits: zero on transmit, ignored on receive
  std::uint8_t atomic_opcode = 0;   // AOpCode, 4 bits (AtomicOpcode)
  std::uint32_t request_id = 0;     // Request Identifier
  std::uint32_t remote_stag = 0;    // Remote STag
  std::uint64_t remote_to = 0;      // Remote Tagged Offset
  std::uint64_t add_or_swap_data = 0;
  std::uint64_t add_or_swap_mask = 0;
  std::uint64_t compare_data = 0;
  std::uint64_t compare_mask = 0;
  friend bool operator==(const AtomicRequestBody&, const AtomicRequestBody&) = default;
};

// Atomic Operation Response Header (RFC 7306 5.2.2, Figure 6).
struct AtomicResponseBody {
  std::uint32_t original_request_id = 0;    // Original Request Identifier
  std::uint64_t original_remote_data = 0;   // Original Remote Data Value
  friend bool operator==(const AtomicResponseBody&, const AtomicResponseBody&) = default;
};

// The Terminate Control field (RFC 5040 4.8) as raw octets, so that a
// Terminate header round-trips here too; DecodeTerminateHeader in
// common/wire/terminate.h interprets it together with the header copies.
struct TerminateControlBody {
  std::array<std::uint8_t, kTerminateControlSize> octets{};
  friend bool operator==(const TerminateControlBody&, const TerminateControlBody&) = default;
};

using HeaderBody = std::variant<std::monostate, ReadRequestBody, ImmediateDataBody,
                                AtomicRequestBody, AtomicResponseBody, TerminateControlBody>;

// Octets a body takes on the wire (0 for none).
std::size_t BodySize(const HeaderBody& body);

// The body codecs, also used for the Terminated RDMA Header (which is a Read
// Request header). Decode needs at least the body's size; extra octets are
// not looked at. Encode returns false if `out` is too small.
bool DecodeReadRequestBody(ByteSpan in, ReadRequestBody& out);
bool EncodeReadRequestBody(const ReadRequestBody& body, MutableByteSpan out);

// ---- The whole header ----

// A decoded DDP + RDMAP header, field for field as on the wire (reserved
// fields included, so a decode/encode round trip is exact). Fields of the
// buffer model the header does not use stay zero.
struct DdpRdmapHeader {
  // DDP Control Field (RFC 5041 4.1).
  bool tagged = false;
  bool last = true;
  std::uint8_t ddp_reserved = 0;            // Rsvd, 4 bits
  std::uint8_t ddp_version = kDdpVersion;   // DV, 2 bits
  // RDMAP Control Field (RFC 5040 4.1).
  std::uint8_t rdmap_version = kRdmapVersion;  // RV, 2 bits
  std::uint8_t rdmap_reserved = 0;             // Rsv, 2 bits
  Opcode opcode = Opcode::kSend;               // 4 bits, may be unassigned
  // Tagged Buffer Model (RFC 5041 4.2).
  std::uint32_t stag = 0;
  std::uint64_t to = 0;
  // Untagged Buffer Model (RFC 5041 4.3). RsvdULP[8:39] is the Invalidate
  // STag for the two Send with Invalidate opcodes and reserved otherwise.
  std::uint32_t invalidate_stag = 0;
  std::uint32_t qn = 0;
  std::uint32_t msn = 0;
  std::uint32_t mo = 0;
  // The opcode's fixed body, if it has one.
  HeaderBody body;
  friend bool operator==(const DdpRdmapHeader&, const DdpRdmapHeader&) = default;
};

// A header for `opcode` as this implementation sends it: the T flag and QN
// from the opcode table, DV and RV 1, reserved fields zero, and a
// zero-filled body of the right kind. The caller fills STag/TO or MSN/MO
// and the body.
DdpRdmapHeader MakeHeader(Opcode opcode, bool last);

// Why a header was rejected, in the order the decoder checks. DDP checks
// come first (RFC 5040 7.2 item 1), then RDMAP's.
enum class HeaderStatus : std::uint8_t {
  kOk,
  kTruncated,            // fewer octets than the header needs
  kInvalidDdpVersion,    // DV != 1 (RFC 5041 4.1)
  kInvalidQueueNumber,   // untagged QN names no RDMAP queue (QN > 3)
  kInvalidRdmapVersion,  // RV != 1 (RFC 5040 4.1)
  kUnknownOpcode,        // OpCode 0xC-0xF (RFC 5040 Figure 4, RFC 7306 Figure 2)
  kTaggedFlagMismatch,   // T flag differs from the opcode's buffer model
  kWrongQueueNumber,     // QN is not the opcode's queue (e.g. Read Request on QN 0)
  kNonZeroMessageOffset, // MO != 0 on a single-segment message
  kNotLastSegment,       // L clear on a single-segment message
};
std::string_view HeaderStatusName(HeaderStatus status);

struct HeaderDecodeResult {
  HeaderStatus status = HeaderStatus::kTruncated;
  // The fields decoded before the check that failed; all of them on kOk.
  DdpRdmapHeader header;
  // On kOk, the octets the header occupies (equal to UlpduHeaderLength of
  // its control octets). On kTruncated, the octets the next check needs.
  // 0 for the other statuses.
  std::size_t length = 0;
  // A field that must be zero on transmit and is ignored on receive was not
  // zero: DDP Rsvd, RDMAP Rsv, the unused RsvdULP[8:39], the Atomic Request's
  // reserved bits. RFC 5040 4.1 and RFC 5041 4.1 say not to reject these, so
  // this is a diagnostic only.
  bool reserved_bits_set = false;
};

// Decodes the header at the start of `ulpdu` (the ULPDU or a prefix of it
// holding at least the header). Never reads past the span.
HeaderDecodeResult DecodeDdpRdmapHeader(ByteSpan ulpdu);

enum class EncodeStatus : std::uint8_t {
  kOk,
  kBufferTooSmall,   // `out` is shorter than the encoding
  kFieldOutOfRange,  // a field does not fit its bit width
  kInconsistent,     // fields contradict each other (Terminate flags vs. copies)
};
std::string_view EncodeStatusName(EncodeStatus status);

struct EncodeResult {
  EncodeStatus status = EncodeStatus::kOk;
  std::size_t length = 0;  // octets written on kOk; octets needed otherwise
};

// Octets EncodeDdpRdmapHeader writes for `header`: 14 or 18 by the T flag,
// plus the body's size.
std::size_t EncodedLength(const DdpRdmapHeader& header);

// Writes `header` exactly as given, reserved fields and invalid versions
// included (tests build malformed headers with it). Fails only if a field
// does not fit its width or `out` is too small; nothing is written then.
EncodeResult EncodeDdpRdmapHeader(const DdpRdmapHeader& header, MutableByteSpan out);

}  // namespace siwx::rdmap
