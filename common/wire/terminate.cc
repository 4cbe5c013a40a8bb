// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/wire/terminate.h"

#include <cstdio>

namespace siwx::rdmap {
namespace {

// siw's little-endian bitfield positions (see the header comment).
constexpr std::uint8_t kSiwFlagM = 0x01;
constexpr std::uint8_t kSiwFlagD = 0x02;
constexpr std::uint8_t kSiwFlagR = 0x04;
constexpr std::uint8_t kSiwFlagMask = kSiwFlagM | kSiwFlagD | kSiwFlagR;
constexpr std::uint8_t kRfcFlagMask = kTerminateFlagM | kTerminateFlagD | kTerminateFlagR;
constexpr std::uint8_t kRfcReservedInOctet2 = 0x1F;  // the top 5 of the 13 reserved bits

constexpr std::uint8_t kRdmapLayer = static_cast<std::uint8_t>(TerminateLayer::kRdmap);
constexpr std::uint8_t kDdpLayer = static_cast<std::uint8_t>(TerminateLayer::kDdp);
constexpr std::uint8_t kLlpLayer = static_cast<std::uint8_t>(TerminateLayer::kLlp);

constexpr std::size_t TerminatedDdpHeaderSize(std::uint8_t ddp_control) {
  return (ddp_control & kDdpTaggedFlag) != 0 ? kDdpTaggedHeaderSize : kDdpUntaggedHeaderSize;
}

const TerminateCodeInfo* FindCode(const TerminateCause& cause) {
  for (const TerminateCodeInfo& info : kTerminateCodeTable) {
    if (info.cause == cause) return &info;
  }
  return nullptr;
}

// Why `t` cannot be encoded, or kOk.
EncodeStatus CheckTerminate(const TerminateHeader& t) {
  if (t.cause.layer > 0xF || t.cause.etype > 0xF || t.reserved > kTerminateReservedMax) {
    return EncodeStatus::kFieldOutOfRange;
  }
  const bool ddp_copy_ok =
      t.d ? (t.ddp_header_length != 0 &&
             t.ddp_header_length == TerminatedDdpHeaderSize(t.ddp_header[0]))
          : t.ddp_header_length == 0;
  const bool rdma_copy_ok = t.rdma_header_length == (t.r ? kTerminatedRdmaHeaderSize : 0);
  return ddp_copy_ok && rdma_copy_ok ? EncodeStatus::kOk : EncodeStatus::kInconsistent;
}

bool IsLocalCatastrophic(const TerminateCause& cause) {
  return (cause.layer == kRdmapLayer &&
          cause.etype == static_cast<std::uint8_t>(RdmapErrorType::kLocalCatastrophic)) ||
         (cause.layer == kDdpLayer &&
          cause.etype == static_cast<std::uint8_t>(DdpErrorType::kLocalCatastrophic));
}

}  // namespace

bool IsDefinedTerminateCause(const TerminateCause& cause) {
  if (cause.layer == kRdmapLayer &&
      cause.etype == static_cast<std::uint8_t>(RdmapErrorType::kLocalCatastrophic)) {
    return true;  // RFC 5040 Figure 9: any code is acceptable
  }
  return FindCode(cause) != nullptr;
}

std::string_view TerminateLayerName(std::uint8_t layer) {
  switch (layer) {
    case kRdmapLayer: return "RDMAP";
    case kDdpLayer: return "DDP";
    case kLlpLayer: return "LLP";
    default: return "unknown layer";
  }
}

std::string_view TerminateErrorTypeName(std::uint8_t layer, std::uint8_t etype) {
  switch (layer) {
    case kRdmapLayer:
      switch (etype) {
        case 0x0: return "Local Catastrophic Error";
        case 0x1: return "Remote Protection Error";
        case 0x2: return "Remote Operation Error";
        default: break;
      }
      break;
    case kDdpLayer:
      switch (etype) {
        case 0x0: return "Local Catastrophic";
        case 0x1: return "Tagged Buffer Error";
        case 0x2: return "Untagged Buffer Error";
        case 0x3: return "Reserved for the LLP";
        default: break;
      }
      break;
    case kLlpLayer:
      if (etype == static_cast<std::uint8_t>(LlpErrorType::kMpa)) return "MPA Error";
      break;
    default:
      break;
  }
  return "unknown error type";
}

std::string_view TerminateErrorCodeName(const TerminateCause& cause) {
  if (cause.layer == kRdmapLayer &&
      cause.etype == static_cast<std::uint8_t>(RdmapErrorType::kLocalCatastrophic)) {
    return "Local Catastrophic Error";
  }
  const TerminateCodeInfo* info = FindCode(cause);
  return info != nullptr ? info->name : "unknown error code";
}

std::string DescribeTerminateCause(const TerminateCause& cause) {
  std::string text;
  text.append(TerminateLayerName(cause.layer));
  text.append(" / ");
  text.append(TerminateErrorTypeName(cause.layer, cause.etype));
  text.append(" / ");
  text.append(TerminateErrorCodeName(cause));
  char numbers[48];
  std::snprintf(numbers, sizeof(numbers), " (layer %u, type %u, code 0x%02x)",
                static_cast<unsigned>(cause.layer), static_cast<unsigned>(cause.etype),
                static_cast<unsigned>(cause.ecode));
  text.append(numbers);
  return text;
}

std::optional<TerminateCause> TerminateCauseFromMpaError(mpa::MpaError error) {
  if (error == mpa::MpaError::kNone) return std::nullopt;
  return TerminateCause::Mpa(static_cast<MpaErrorCode>(error));
}

std::optional<TerminateCause> TerminateCauseForHeader(const HeaderDecodeResult& result) {
  switch (result.status) {
    case HeaderStatus::kOk:
      return std::nullopt;
    case HeaderStatus::kTruncated:
      return TerminateCause::RdmapOperationUnspecified();
    case HeaderStatus::kInvalidDdpVersion:
      return result.header.tagged ? TerminateCause::DdpTaggedInvalidVersion()
                                  : TerminateCause::DdpUntaggedInvalidVersion();
    case HeaderStatus::kInvalidQueueNumber:
    case HeaderStatus::kWrongQueueNumber:
      return TerminateCause::DdpInvalidQn();
    case HeaderStatus::kNonZeroMessageOffset:
      return TerminateCause::DdpInvalidMo();
    case HeaderStatus::kNotLastSegment:
      return TerminateCause::DdpMessageTooLong();
    case HeaderStatus::kInvalidRdmapVersion:
      return TerminateCause::RdmapInvalidVersion();
    case HeaderStatus::kUnknownOpcode:
    case HeaderStatus::kTaggedFlagMismatch:
      return TerminateCause::RdmapUnexpectedOpcode();
  }
  return TerminateCause::RdmapOperationUnspecified();
}

TerminateHeader MakeTerminate(const TerminateCause& cause) {
  TerminateHeader t;
  t.cause = cause;
  return t;
}

TerminateHeader MakeTerminateForSegment(const TerminateCause& cause, ByteSpan offending,
                                        std::uint16_t ddp_segment_length) {
  TerminateHeader t = MakeTerminate(cause);
  if (cause.layer == kLlpLayer || IsLocalCatastrophic(cause)) return t;
  if (cause.layer != kRdmapLayer && cause.layer != kDdpLayer) return t;
  // The header can be copied only if its layout is known (DV 1) and whole.
  if (offending.empty() || (offending[0] & kDdpVersionMask) != kDdpVersion) return t;
  const std::size_t ddp_size = TerminatedDdpHeaderSize(offending[0]);
  if (offending.size() < ddp_size) return t;

  t.m = true;
  t.d = true;
  t.ddp_segment_length = ddp_segment_length;
  t.ddp_header_length = static_cast<std::uint8_t>(ddp_size);
  for (std::size_t i = 0; i < ddp_size; ++i) t.ddp_header[i] = offending[i];

  const bool protection =
      cause.layer == kRdmapLayer &&
      cause.etype == static_cast<std::uint8_t>(RdmapErrorType::kRemoteProtection);
  const std::uint8_t rdmap_control = offending.size() > 1 ? offending[1] : 0;
  const bool read_request =
      ddp_size == kDdpUntaggedHeaderSize &&
      (rdmap_control & kRdmapVersionMask) >> kRdmapVersionShift == kRdmapVersion &&
      (rdmap_control & kRdmapOpcodeMask) == static_cast<std::uint8_t>(Opcode::kRdmaReadRequest);
  if (protection && read_request && offending.size() >= ddp_size + kTerminatedRdmaHeaderSize) {
    t.r = true;
    t.rdma_header_length = static_cast<std::uint8_t>(kTerminatedRdmaHeaderSize);
    for (std::size_t i = 0; i < kTerminatedRdmaHeaderSize; ++i) {
      t.rdma_header[i] = offending[ddp_size + i];
    }
  }
  return t;
}

std::optional<TerminatedDdpHeader> DecodeTerminatedDdpHeader(const TerminateHeader& t) {
  if (!t.d || t.ddp_header_length == 0) return std::nullopt;
  const std::uint8_t* h = t.ddp_header.data();
  if (t.ddp_header_length != TerminatedDdpHeaderSize(h[0])) return std::nullopt;
  TerminatedDdpHeader out;
  out.tagged = (h[0] & kDdpTaggedFlag) != 0;
  out.last = (h[0] & kDdpLastFlag) != 0;
  out.rdmap_control = h[1];
  if (out.tagged) {  // RFC 5041 4.2: control, RsvdULP, STag, TO
    out.stag = LoadBe32(h + 2);
    out.to = LoadBe64(h + 6);
  } else {  // RFC 5041 4.3: control, RsvdULP[0:39], QN, MSN, MO
    out.qn = LoadBe32(h + 6);
    out.msn = LoadBe32(h + 10);
    out.mo = LoadBe32(h + 14);
  }
  return out;
}

std::size_t TerminateHeaderLength(const TerminateHeader& t) {
  return kTerminateControlSize + ((t.m || t.d) ? kDdpSegmentLengthSize : 0) +
         t.ddp_header_length + t.rdma_header_length;
}

EncodeResult EncodeTerminateHeader(const TerminateHeader& t, MutableByteSpan out) {
  EncodeResult r;
  r.length = TerminateHeaderLength(t);
  r.status = CheckTerminate(t);
  if (r.status != EncodeStatus::kOk) return r;
  if (out.size() < r.length) {
    r.status = EncodeStatus::kBufferTooSmall;
    return r;
  }

  std::uint8_t* p = out.data();
  p[0] = static_cast<std::uint8_t>((t.cause.layer << 4) | t.cause.etype);
  p[1] = t.cause.ecode;
  p[2] = static_cast<std::uint8_t>((t.m ? kTerminateFlagM : 0) | (t.d ? kTerminateFlagD : 0) |
                                   (t.r ? kTerminateFlagR : 0) | (t.reserved >> 8));
  p[3] = static_cast<std::uint8_t>(t.reserved);
  std::size_t pos = kTerminateControlSize;
  if (t.m || t.d) {
    StoreBe16(p + pos, t.ddp_segment_length);
    pos += kDdpSegmentLengthSize;
  }
  for (std::size_t i = 0; i < t.ddp_header_length; ++i) p[pos++] = t.ddp_header[i];
  for (std::size_t i = 0; i < t.rdma_header_length; ++i) p[pos++] = t.rdma_header[i];
  return r;
}

EncodeResult EncodeTerminateMessage(const TerminateHeader& t, std::uint32_t msn,
                                    MutableByteSpan out) {
  DdpRdmapHeader ddp = MakeHeader(Opcode::kTerminate, /*last=*/true);
  ddp.msn = msn;
  ddp.body = std::monostate{};  // the Terminate Control is written below
  EncodeResult r;
  r.length = EncodedLength(ddp) + TerminateHeaderLength(t);
  // Check the Terminate header first so nothing is written on failure.
  r.status = CheckTerminate(t);
  if (r.status != EncodeStatus::kOk) return r;
  if (out.size() < r.length) {
    r.status = EncodeStatus::kBufferTooSmall;
    return r;
  }
  const EncodeResult head = EncodeDdpRdmapHeader(ddp, out);
  const EncodeResult tail = EncodeTerminateHeader(t, out.subspan(head.length));
  r.status = tail.status;
  return r;
}

std::string_view TerminateStatusName(TerminateStatus status) {
  switch (status) {
    case TerminateStatus::kOk: return "ok";
    case TerminateStatus::kTruncated: return "Terminate header truncated";
    case TerminateStatus::kTrailingOctets: return "octets after the Terminate header";
  }
  return "unknown Terminate status";
}

TerminateDecodeResult DecodeTerminateHeader(ByteSpan in, TerminateLayout layout) {
  TerminateDecodeResult r;
  TerminateHeader& t = r.header;
  if (in.size() < kTerminateControlSize) {
    r.status = TerminateStatus::kTruncated;
    r.length = kTerminateControlSize;
    return r;
  }
  const std::uint8_t b0 = in[0];
  const std::uint8_t b2 = in[2];
  const std::uint8_t b3 = in[3];
  t.cause.ecode = in[1];
  if (layout == TerminateLayout::kSiwSwapped) {
    t.cause.layer = b0 & 0x0F;
    t.cause.etype = static_cast<std::uint8_t>(b0 >> 4);
    t.m = (b2 & kSiwFlagM) != 0;
    t.d = (b2 & kSiwFlagD) != 0;
    t.r = (b2 & kSiwFlagR) != 0;
    t.reserved = static_cast<std::uint16_t>((b2 >> 3) | (b3 << 5));
  } else {
    t.cause.layer = static_cast<std::uint8_t>(b0 >> 4);
    t.cause.etype = b0 & 0x0F;
    t.m = (b2 & kTerminateFlagM) != 0;
    t.d = (b2 & kTerminateFlagD) != 0;
    t.r = (b2 & kTerminateFlagR) != 0;
    t.reserved = static_cast<std::uint16_t>(((b2 & kRfcReservedInOctet2) << 8) | b3);
  }
  r.cause_defined = IsDefinedTerminateCause(t.cause);
  r.reserved_bits_set = t.reserved != 0;

  std::size_t pos = kTerminateControlSize;
  if (t.m || t.d) {
    if (in.size() < pos + kDdpSegmentLengthSize) {
      r.status = TerminateStatus::kTruncated;
      r.length = pos + kDdpSegmentLengthSize;
      return r;
    }
    t.ddp_segment_length = LoadBe16(in.data() + pos);
    pos += kDdpSegmentLengthSize;
  }
  if (t.d) {
    // The copy's own T flag gives its size; without its first octet the
    // smaller (tagged) size is the least that could complete it.
    const std::size_t size = in.size() > pos ? TerminatedDdpHeaderSize(in[pos])
                                             : kDdpTaggedHeaderSize;
    if (in.size() < pos + size) {
      r.status = TerminateStatus::kTruncated;
      r.length = pos + size;
      return r;
    }
    for (std::size_t i = 0; i < size; ++i) t.ddp_header[i] = in[pos + i];
    t.ddp_header_length = static_cast<std::uint8_t>(size);
    pos += size;
  }
  // siw sets R for errors on inbound Sends without an RDMA header to copy.
  const bool r_without_copy = layout == TerminateLayout::kSiwSwapped && in.size() == pos;
  if (t.r && !r_without_copy) {
    if (in.size() < pos + kTerminatedRdmaHeaderSize) {
      r.status = TerminateStatus::kTruncated;
      r.length = pos + kTerminatedRdmaHeaderSize;
      return r;
    }
    for (std::size_t i = 0; i < kTerminatedRdmaHeaderSize; ++i) t.rdma_header[i] = in[pos + i];
    t.rdma_header_length = static_cast<std::uint8_t>(kTerminatedRdmaHeaderSize);
    pos += kTerminatedRdmaHeaderSize;
  }
  r.length = pos;
  r.status = in.size() == pos ? TerminateStatus::kOk : TerminateStatus::kTrailingOctets;
  return r;
}

std::optional<TerminateLayout> GuessTerminateLayout(ByteSpan in) {
  if (in.size() < 3) return std::nullopt;
  const bool rfc_bits = (in[2] & kRfcFlagMask) != 0;
  const bool siw_bits = (in[2] & kSiwFlagMask) != 0;
  if (rfc_bits == siw_bits) return std::nullopt;
  return rfc_bits ? TerminateLayout::kRfc5040 : TerminateLayout::kSiwSwapped;
}

}  // namespace siwx::rdmap
