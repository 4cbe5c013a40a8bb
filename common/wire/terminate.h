// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The RDMAP Terminate message (RFC 5040 sections 4.8, 5.4 and 7) and the
// error triples it carries: layer, error type and error code as defined by
// RFC 5040 Figure 9 (RDMAP), RFC 5041 7.2 (DDP) and RFC 5044 section 8 plus
// RFC 6581 section 8 (LLP = MPA).
//
// Wire layout of the Terminate header, which follows the untagged DDP header
// of a Terminate (QN 2) ULPDU:
//
//   octet 0       Layer (high nibble) | EType (low nibble)
//   octet 1       Error Code
//   octets 2-3    M(0x8000) D(0x4000) R(0x2000) | 13 reserved bits
//   [2 octets]    DDP Segment Length      present when M or D is set
//   [14|18]       Terminated DDP Header   present when D is set; its own T
//                                         flag says tagged (14) or untagged (18)
//   [28]          Terminated RDMA Header  present when R is set (the RDMA
//                                         Read Request header)
//
// RFC 5040 says the DDP Segment Length "MUST be valid if the M bit is set"
// and "MUST be present when the D bit is set"; a valid field must be there,
// so this codec puts it on the wire when either bit is set.
//
// The decoder checks the structure only: that the octets match the flags.
// Whether the triple is one the RFCs define is reported alongside
// (cause_defined), since a peer's Terminate ends the stream either way.
//
// The Linux siw driver declares the Terminate control word with C bitfields,
// so on little-endian hosts it sends Layer in the low nibble and EType in
// the high nibble of octet 0, and M/D/R as 0x01/0x02/0x04 of octet 2. It also
// sets R on errors of inbound Sends without appending an RDMA header. Encoding
// is always per the RFC; TerminateLayout::kSiwSwapped decodes siw's layout
// for diagnostics.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/util/bytes.h"
#include "common/wire/ddp_rdmap.h"
#include "common/wire/mpa_constants.h"

namespace siwx::rdmap {

// ---- Layers, error types and error codes ----

enum class TerminateLayer : std::uint8_t {  // RFC 5040 4.8 Figure 9
  kRdmap = 0x0,
  kDdp = 0x1,
  kLlp = 0x2,
};

enum class RdmapErrorType : std::uint8_t {  // RFC 5040 4.8 Figure 9
  kLocalCatastrophic = 0x0,  // no error code; any value is acceptable
  kRemoteProtection = 0x1,
  kRemoteOperation = 0x2,
};

enum class RdmapErrorCode : std::uint8_t {  // RFC 5040 4.8 Figure 9
  kInvalidStag = 0x00,               // Remote Protection
  kBaseOrBounds = 0x01,              // Remote Protection
  kAccessRights = 0x02,              // Remote Protection
  kStagNotAssociated = 0x03,         // Remote Protection: STag not associated with RDMAP Stream
  kToWrap = 0x04,                    // Remote Protection
  kInvalidVersion = 0x05,            // Remote Operation: invalid RDMAP version
  kUnexpectedOpcode = 0x06,          // Remote Operation
  kCatastrophicStream = 0x07,        // Remote Operation: localized to RDMAP Stream
  kCatastrophicGlobal = 0x08,        // Remote Operation
  kStagCannotBeInvalidated = 0x09,   // Remote Protection and Remote Operation
  kUnspecified = 0xFF,               // Remote Protection and Remote Operation
};

enum class DdpErrorType : std::uint8_t {  // RFC 5041 7.2
  kLocalCatastrophic = 0x0,
  kTaggedBuffer = 0x1,
  kUntaggedBuffer = 0x2,
  kReservedForLlp = 0x3,
};

inline constexpr std::uint8_t kDdpLocalCatastrophicCode = 0x00;  // RFC 5041 7.2

enum class DdpTaggedErrorCode : std::uint8_t {  // RFC 5041 7.2
  kInvalidStag = 0x00,
  kBaseOrBounds = 0x01,
  kStagNotAssociated = 0x02,  // STag not associated with DDP Stream
  kToWrap = 0x03,
  kInvalidVersion = 0x04,     // invalid DDP version
};

enum class DdpUntaggedErrorCode : std::uint8_t {  // RFC 5041 7.2
  kInvalidQn = 0x01,
  kNoBuffer = 0x02,         // invalid MSN - no buffer available
  kInvalidMsnRange = 0x03,  // invalid MSN - MSN range is not valid
  kInvalidMo = 0x04,
  kMessageTooLong = 0x05,   // DDP Message too long for available buffer
  kInvalidVersion = 0x06,   // invalid DDP version
};

enum class LlpErrorType : std::uint8_t { kMpa = 0x0 };  // RFC 6581 8

enum class MpaErrorCode : std::uint8_t {
  kConnectionLost = 0x01,       // RFC 5044 8
  kCrcMismatch = 0x02,          // RFC 5044 8
  kMarkerMismatch = 0x03,       // RFC 5044 8
  kInvalidStartupFrame = 0x04,  // RFC 5044 8
  kLocalCatastrophic = 0x05,    // RFC 6581 8
  kInsufficientIrd = 0x06,      // RFC 6581 8
  kNoMatchingRtr = 0x07,        // RFC 6581 8
};
static_assert(static_cast<int>(MpaErrorCode::kConnectionLost) ==
              static_cast<int>(mpa::MpaError::kConnectionLost));
static_assert(static_cast<int>(MpaErrorCode::kCrcMismatch) ==
              static_cast<int>(mpa::MpaError::kCrcMismatch));
static_assert(static_cast<int>(MpaErrorCode::kMarkerMismatch) ==
              static_cast<int>(mpa::MpaError::kMarkerMismatch));
static_assert(static_cast<int>(MpaErrorCode::kInvalidStartupFrame) ==
              static_cast<int>(mpa::MpaError::kInvalidStartupFrame));

// The error a Terminate reports. Holds raw values so a received Terminate
// with any triple can be represented; the named constructors are the errors
// this implementation raises. Layer and etype are 4-bit fields.
struct TerminateCause {
  std::uint8_t layer = 0;
  std::uint8_t etype = 0;
  std::uint8_t ecode = 0;

  friend constexpr bool operator==(const TerminateCause&, const TerminateCause&) = default;

  static constexpr TerminateCause Rdmap(RdmapErrorType etype, RdmapErrorCode ecode) {
    return {static_cast<std::uint8_t>(TerminateLayer::kRdmap), static_cast<std::uint8_t>(etype),
            static_cast<std::uint8_t>(ecode)};
  }
  static constexpr TerminateCause DdpTagged(DdpTaggedErrorCode ecode) {
    return {static_cast<std::uint8_t>(TerminateLayer::kDdp),
            static_cast<std::uint8_t>(DdpErrorType::kTaggedBuffer), static_cast<std::uint8_t>(ecode)};
  }
  static constexpr TerminateCause DdpUntagged(DdpUntaggedErrorCode ecode) {
    return {static_cast<std::uint8_t>(TerminateLayer::kDdp),
            static_cast<std::uint8_t>(DdpErrorType::kUntaggedBuffer),
            static_cast<std::uint8_t>(ecode)};
  }
  static constexpr TerminateCause Mpa(MpaErrorCode ecode) {
    return {static_cast<std::uint8_t>(TerminateLayer::kLlp),
            static_cast<std::uint8_t>(LlpErrorType::kMpa), static_cast<std::uint8_t>(ecode)};
  }

  // RDMAP layer (RFC 5040 4.8 Figure 9).
  static constexpr TerminateCause RdmapLocalCatastrophic() {
    return {static_cast<std::uint8_t>(TerminateLayer::kRdmap),
            static_cast<std::uint8_t>(RdmapErrorType::kLocalCatastrophic), 0x00};
  }
  static constexpr TerminateCause RdmapInvalidStag() {
    return Rdmap(RdmapErrorType::kRemoteProtection, RdmapErrorCode::kInvalidStag);
  }
  static constexpr TerminateCause RdmapBaseOrBounds() {
    return Rdmap(RdmapErrorType::kRemoteProtection, RdmapErrorCode::kBaseOrBounds);
  }
  static constexpr TerminateCause RdmapAccessRights() {
    return Rdmap(RdmapErrorType::kRemoteProtection, RdmapErrorCode::kAccessRights);
  }
  static constexpr TerminateCause RdmapStagNotAssociated() {
    return Rdmap(RdmapErrorType::kRemoteProtection, RdmapErrorCode::kStagNotAssociated);
  }
  static constexpr TerminateCause RdmapToWrap() {
    return Rdmap(RdmapErrorType::kRemoteProtection, RdmapErrorCode::kToWrap);
  }
  // Send with Invalidate naming an STag that cannot be invalidated (RFC 5040
  // 5.3). Figure 9 lists the code under both error types; Figure 10 says
  // Send with Invalidate errors are Remote Protection errors, so this is it.
  static constexpr TerminateCause RdmapStagCannotBeInvalidated() {
    return Rdmap(RdmapErrorType::kRemoteProtection, RdmapErrorCode::kStagCannotBeInvalidated);
  }
  static constexpr TerminateCause RdmapProtectionUnspecified() {
    return Rdmap(RdmapErrorType::kRemoteProtection, RdmapErrorCode::kUnspecified);
  }
  static constexpr TerminateCause RdmapInvalidVersion() {
    return Rdmap(RdmapErrorType::kRemoteOperation, RdmapErrorCode::kInvalidVersion);
  }
  // Also the answer to RFC 7306 opcodes while siwx does not offer RFC 7306.
  static constexpr TerminateCause RdmapUnexpectedOpcode() {
    return Rdmap(RdmapErrorType::kRemoteOperation, RdmapErrorCode::kUnexpectedOpcode);
  }
  // Also the Atomic Request misalignment error (RFC 7306 8.2).
  static constexpr TerminateCause RdmapCatastrophicStream() {
    return Rdmap(RdmapErrorType::kRemoteOperation, RdmapErrorCode::kCatastrophicStream);
  }
  static constexpr TerminateCause RdmapCatastrophicGlobal() {
    return Rdmap(RdmapErrorType::kRemoteOperation, RdmapErrorCode::kCatastrophicGlobal);
  }
  static constexpr TerminateCause RdmapOperationStagCannotBeInvalidated() {
    return Rdmap(RdmapErrorType::kRemoteOperation, RdmapErrorCode::kStagCannotBeInvalidated);
  }
  static constexpr TerminateCause RdmapOperationUnspecified() {
    return Rdmap(RdmapErrorType::kRemoteOperation, RdmapErrorCode::kUnspecified);
  }

  // DDP layer (RFC 5041 7.2).
  static constexpr TerminateCause DdpLocalCatastrophic() {
    return {static_cast<std::uint8_t>(TerminateLayer::kDdp),
            static_cast<std::uint8_t>(DdpErrorType::kLocalCatastrophic), kDdpLocalCatastrophicCode};
  }
  static constexpr TerminateCause DdpInvalidStag() {
    return DdpTagged(DdpTaggedErrorCode::kInvalidStag);
  }
  static constexpr TerminateCause DdpBaseOrBounds() {
    return DdpTagged(DdpTaggedErrorCode::kBaseOrBounds);
  }
  static constexpr TerminateCause DdpStagNotAssociated() {
    return DdpTagged(DdpTaggedErrorCode::kStagNotAssociated);
  }
  static constexpr TerminateCause DdpToWrap() { return DdpTagged(DdpTaggedErrorCode::kToWrap); }
  static constexpr TerminateCause DdpTaggedInvalidVersion() {
    return DdpTagged(DdpTaggedErrorCode::kInvalidVersion);
  }
  static constexpr TerminateCause DdpInvalidQn() {
    return DdpUntagged(DdpUntaggedErrorCode::kInvalidQn);
  }
  static constexpr TerminateCause DdpNoBuffer() {
    return DdpUntagged(DdpUntaggedErrorCode::kNoBuffer);
  }
  static constexpr TerminateCause DdpInvalidMsnRange() {
    return DdpUntagged(DdpUntaggedErrorCode::kInvalidMsnRange);
  }
  static constexpr TerminateCause DdpInvalidMo() {
    return DdpUntagged(DdpUntaggedErrorCode::kInvalidMo);
  }
  static constexpr TerminateCause DdpMessageTooLong() {
    return DdpUntagged(DdpUntaggedErrorCode::kMessageTooLong);
  }
  static constexpr TerminateCause DdpUntaggedInvalidVersion() {
    return DdpUntagged(DdpUntaggedErrorCode::kInvalidVersion);
  }

  // LLP layer, MPA error type (RFC 5044 8, RFC 6581 8).
  static constexpr TerminateCause MpaConnectionLost() { return Mpa(MpaErrorCode::kConnectionLost); }
  static constexpr TerminateCause MpaCrcMismatch() { return Mpa(MpaErrorCode::kCrcMismatch); }
  static constexpr TerminateCause MpaMarkerMismatch() { return Mpa(MpaErrorCode::kMarkerMismatch); }
  static constexpr TerminateCause MpaInvalidStartupFrame() {
    return Mpa(MpaErrorCode::kInvalidStartupFrame);
  }
  static constexpr TerminateCause MpaLocalCatastrophic() {
    return Mpa(MpaErrorCode::kLocalCatastrophic);
  }
  static constexpr TerminateCause MpaInsufficientIrd() { return Mpa(MpaErrorCode::kInsufficientIrd); }
  static constexpr TerminateCause MpaNoMatchingRtr() { return Mpa(MpaErrorCode::kNoMatchingRtr); }
};

// Every triple the RFCs define, with its name. RDMAP Local Catastrophic is
// listed with code 0, but RFC 5040 accepts any code with it.
struct TerminateCodeInfo {
  TerminateCause cause;
  std::string_view name;
};

inline constexpr std::array<TerminateCodeInfo, 33> kTerminateCodeTable = {{
    {TerminateCause::RdmapLocalCatastrophic(), "Local Catastrophic Error"},
    {TerminateCause::RdmapInvalidStag(), "Invalid STag"},
    {TerminateCause::RdmapBaseOrBounds(), "Base or bounds violation"},
    {TerminateCause::RdmapAccessRights(), "Access rights violation"},
    {TerminateCause::RdmapStagNotAssociated(), "STag not associated with RDMAP Stream"},
    {TerminateCause::RdmapToWrap(), "TO wrap"},
    {TerminateCause::RdmapStagCannotBeInvalidated(), "STag cannot be Invalidated"},
    {TerminateCause::RdmapProtectionUnspecified(), "Unspecified Error"},
    {TerminateCause::RdmapInvalidVersion(), "Invalid RDMAP version"},
    {TerminateCause::RdmapUnexpectedOpcode(), "Unexpected OpCode"},
    {TerminateCause::RdmapCatastrophicStream(), "Catastrophic error, localized to RDMAP Stream"},
    {TerminateCause::RdmapCatastrophicGlobal(), "Catastrophic error, global"},
    {TerminateCause::RdmapOperationStagCannotBeInvalidated(), "STag cannot be Invalidated"},
    {TerminateCause::RdmapOperationUnspecified(), "Unspecified Error"},
    {TerminateCause::DdpLocalCatastrophic(), "Local Catastrophic"},
    {TerminateCause::DdpInvalidStag(), "Invalid STag"},
    {TerminateCause::DdpBaseOrBounds(), "Base or bounds violation"},
    {TerminateCause::DdpStagNotAssociated(), "STag not associated with DDP Stream"},
    {TerminateCause::DdpToWrap(), "TO wrap"},
    {TerminateCause::DdpTaggedInvalidVersion(), "Invalid DDP version"},
    {TerminateCause::DdpInvalidQn(), "Invalid QN"},
    {TerminateCause::DdpNoBuffer(), "Invalid MSN - no buffer available"},
    {TerminateCause::DdpInvalidMsnRange(), "Invalid MSN - MSN range is not valid"},
    {TerminateCause::DdpInvalidMo(), "Invalid MO"},
    {TerminateCause::DdpMessageTooLong(), "DDP Message too long for available buffer"},
    {TerminateCause::DdpUntaggedInvalidVersion(), "Invalid DDP version"},
    {TerminateCause::MpaConnectionLost(), "TCP connection closed, terminated or lost"},
    {TerminateCause::MpaCrcMismatch(), "Received MPA CRC does not match"},
    {TerminateCause::MpaMarkerMismatch(), "MPA Marker and ULPDU Length disagree on FPDU start"},
    {TerminateCause::MpaInvalidStartupFrame(), "Invalid MPA Request or Reply Frame"},
    {TerminateCause::MpaLocalCatastrophic(), "Local catastrophic"},
    {TerminateCause::MpaInsufficientIrd(), "Insufficient IRD resources"},
    {TerminateCause::MpaNoMatchingRtr(), "No matching RTR option"},
}};

// True if the RFCs define the triple (any code counts for RDMAP Local
// Catastrophic).
bool IsDefinedTerminateCause(const TerminateCause& cause);

// Names for logs. Unknown values get a generic name, never an empty one.
std::string_view TerminateLayerName(std::uint8_t layer);
std::string_view TerminateErrorTypeName(std::uint8_t layer, std::uint8_t etype);
std::string_view TerminateErrorCodeName(const TerminateCause& cause);
// "<layer> / <type> / <code> (layer L, type T, code 0xCC)" with the RFC names,
// the form every log line and `siwx stat` use.
std::string DescribeTerminateCause(const TerminateCause& cause);

// The LLP cause for an error MPA reported (nullopt for kNone).
std::optional<TerminateCause> TerminateCauseFromMpaError(mpa::MpaError error);

// The Terminate that answers a header DecodeDdpRdmapHeader rejected
// (nullopt for kOk):
//   kInvalidDdpVersion    DDP 1/1/04 (tagged) or 1/2/06 (untagged)
//   kInvalidQueueNumber   DDP 1/2/01 Invalid QN
//   kWrongQueueNumber     DDP 1/2/01 Invalid QN
//   kNonZeroMessageOffset DDP 1/2/04 Invalid MO
//   kNotLastSegment       DDP 1/2/05 message too long for the (header-sized) buffer
//   kInvalidRdmapVersion  RDMAP 0/2/05 Invalid RDMAP version
//   kUnknownOpcode        RDMAP 0/2/06 Unexpected OpCode
//   kTaggedFlagMismatch   RDMAP 0/2/06 Unexpected OpCode
//   kTruncated            RDMAP 0/2/FF Unspecified: no code names a ULPDU
//                         shorter than its own header
std::optional<TerminateCause> TerminateCauseForHeader(const HeaderDecodeResult& result);

// ---- The Terminate header ----

inline constexpr std::uint8_t kTerminateFlagM = 0x80;  // octet 2: DDP Segment Length valid, RFC 5040 4.8
inline constexpr std::uint8_t kTerminateFlagD = 0x40;  // octet 2: DDP Header included, RFC 5040 4.8
inline constexpr std::uint8_t kTerminateFlagR = 0x20;  // octet 2: RDMAP Header included, RFC 5040 4.8
inline constexpr std::uint16_t kTerminateReservedMax = 0x1FFF;  // 13 bits, RFC 5040 4.8
inline constexpr std::size_t kDdpSegmentLengthSize = 2;          // RFC 5040 4.8
inline constexpr std::size_t kTerminatedRdmaHeaderSize = kReadRequestBodySize;  // 224 bits, RFC 5040 4.8
inline constexpr std::size_t kMaxTerminateHeaderSize =
    kTerminateControlSize + kDdpSegmentLengthSize + kDdpUntaggedHeaderSize +
    kTerminatedRdmaHeaderSize;
static_assert(kMaxTerminateHeaderSize == 52);

struct TerminateHeader {
  TerminateCause cause;
  bool m = false;  // DDP Segment Length valid
  bool d = false;  // Terminated DDP Header included
  bool r = false;  // Terminated RDMA Header included
  std::uint16_t reserved = 0;             // 13 bits: zero on transmit, ignored on receive
  std::uint16_t ddp_segment_length = 0;   // on the wire when m or d is set
  // The copied DDP header: 14 octets if its T flag is set, 18 if not, 0 when
  // absent. Octets past the length are zero.
  std::uint8_t ddp_header_length = 0;
  std::array<std::uint8_t, kDdpUntaggedHeaderSize> ddp_header{};
  // The copied RDMA Read Request header: 28 octets or 0 (siw may set R
  // without sending it).
  std::uint8_t rdma_header_length = 0;
  std::array<std::uint8_t, kTerminatedRdmaHeaderSize> rdma_header{};

  ByteSpan DdpHeaderCopy() const { return ByteSpan(ddp_header.data(), ddp_header_length); }
  ByteSpan RdmaHeaderCopy() const { return ByteSpan(rdma_header.data(), rdma_header_length); }
  friend bool operator==(const TerminateHeader&, const TerminateHeader&) = default;
};

// The fields of a Terminate's DDP header copy (RFC 5040 4.8: the header of the
// segment that caused the error) that name the message it belonged to, in the
// layout of RFC 5041 4.2 (tagged) or 4.3 (untagged).
struct TerminatedDdpHeader {
  bool tagged = false;
  bool last = false;
  std::uint8_t rdmap_control = 0;  // RV and the opcode, as copied
  std::uint32_t stag = 0;          // tagged only
  std::uint64_t to = 0;            // tagged only
  std::uint32_t qn = 0;            // untagged only
  std::uint32_t msn = 0;           // untagged only
  std::uint32_t mo = 0;            // untagged only
  friend bool operator==(const TerminatedDdpHeader&, const TerminatedDdpHeader&) = default;
};

// The copy's fields, or nullopt when the Terminate carries no DDP header (D
// clear) or its length is not the one its T flag calls for.
std::optional<TerminatedDdpHeader> DecodeTerminatedDdpHeader(const TerminateHeader& t);

// A Terminate with no header copies: errors not tied to an incoming message
// (RFC 5040 7.1 rule 1), Local Catastrophic and LLP errors (Figure 10).
TerminateHeader MakeTerminate(const TerminateCause& cause);

// A Terminate reporting `cause` for the incoming DDP segment whose ULPDU
// starts with `offending` (at least its DDP header; for a Read Request also
// its 28-octet body; further octets are ignored). `ddp_segment_length` is
// that segment's length, i.e. its ULPDU_Length (DDP header plus payload,
// RFC 5041 4.4). Header copies follow RFC 5040 Figure 10 and 7.1:
//  - Local Catastrophic (RDMAP or DDP) and LLP errors: none;
//  - DDP errors and RDMAP Remote Protection/Operation errors: the DDP header
//    with M and D set, when it can be copied (the offending DV is 1 and its
//    header is all there);
//  - RDMAP Remote Protection errors on an RDMA Read Request: also its Read
//    Request header, with R set.
TerminateHeader MakeTerminateForSegment(const TerminateCause& cause, ByteSpan offending,
                                        std::uint16_t ddp_segment_length);

// Octets EncodeTerminateHeader writes: 4, plus 2 if M or D, plus the copies.
std::size_t TerminateHeaderLength(const TerminateHeader& header);

// Encodes per RFC 5040 4.8. kInconsistent if D is set without a 14/18-octet
// copy whose T flag matches its length (or a copy is there without D), or R
// and a 28-octet RDMA copy disagree. kFieldOutOfRange if layer, etype or
// reserved exceed their widths. Nothing is written on failure.
EncodeResult EncodeTerminateHeader(const TerminateHeader& header, MutableByteSpan out);

// Encodes a whole Terminate ULPDU: the untagged DDP header (Last set, QN 2,
// the given MSN, MO 0, opcode Terminate) followed by the Terminate header.
EncodeResult EncodeTerminateMessage(const TerminateHeader& header, std::uint32_t msn,
                                    MutableByteSpan out);

enum class TerminateLayout : std::uint8_t {
  kRfc5040,     // RFC 5040 4.8
  kSiwSwapped,  // Linux siw on little-endian hosts (see the file comment)
};

enum class TerminateStatus : std::uint8_t {
  kOk,
  kTruncated,       // the flags announce more octets than there are
  kTrailingOctets,  // octets left after everything the flags announce
};
std::string_view TerminateStatusName(TerminateStatus status);

struct TerminateDecodeResult {
  TerminateStatus status = TerminateStatus::kTruncated;
  TerminateHeader header;  // what was decoded before the failure; all of it on kOk
  // On kOk and kTrailingOctets, the octets the header occupies; on
  // kTruncated, the fewest octets that could complete it.
  std::size_t length = 0;
  bool cause_defined = false;      // IsDefinedTerminateCause(header.cause)
  bool reserved_bits_set = false;  // the 13 reserved bits were not zero
};

// Decodes a Terminate header. `in` starts at the Terminate Control field
// (the ULPDU after its 18-octet DDP header) and ends where the ULPDU ends.
TerminateDecodeResult DecodeTerminateHeader(ByteSpan in,
                                            TerminateLayout layout = TerminateLayout::kRfc5040);

// Which layout a Terminate header is in, when its flag bits tell: M/D/R bits
// present in exactly one of the two positions. nullopt if no flag is set
// (LLP and catastrophic errors) or both positions hold bits.
std::optional<TerminateLayout> GuessTerminateLayout(ByteSpan in);

}  // namespace siwx::rdmap
