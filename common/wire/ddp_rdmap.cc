// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/wire/ddp_rdmap.h"

namespace siwx::rdmap {
namespace {

// Octet offsets inside the DDP header (RFC 5041 4.2, 4.3).
constexpr std::size_t kDdpControlOffset = 0;
constexpr std::size_t kRdmapControlOffset = 1;
constexpr std::size_t kStagOffset = 2;            // tagged
constexpr std::size_t kToOffset = 6;              // tagged
constexpr std::size_t kInvalidateStagOffset = 2;  // untagged RsvdULP[8:39]
constexpr std::size_t kQnOffset = 6;              // untagged
constexpr std::size_t kMsnOffset = 10;            // untagged
constexpr std::size_t kMoOffset = 14;             // untagged
static_assert(kToOffset + 8 == kDdpTaggedHeaderSize);
static_assert(kMoOffset + 4 == kDdpUntaggedHeaderSize);

// RDMA Read Request Header offsets (RFC 5040 4.4, Figure 6).
constexpr std::size_t kRrSinkStag = 0;
constexpr std::size_t kRrSinkTo = 4;
constexpr std::size_t kRrReadSize = 12;
constexpr std::size_t kRrSourceStag = 16;
constexpr std::size_t kRrSourceTo = 20;
static_assert(kRrSourceTo + 8 == kReadRequestBodySize);

// Atomic Request Header offsets (RFC 7306 5.2.1, Figure 4).
constexpr std::size_t kArOpcodeWord = 0;
constexpr std::size_t kArRequestId = 4;
constexpr std::size_t kArRemoteStag = 8;
constexpr std::size_t kArRemoteTo = 12;
constexpr std::size_t kArAddOrSwapData = 20;
constexpr std::size_t kArAddOrSwapMask = 28;
constexpr std::size_t kArCompareData = 36;
constexpr std::size_t kArCompareMask = 44;
static_assert(kArCompareMask + 8 == kAtomicRequestBodySize);

// Atomic Response Header offsets (RFC 7306 5.2.2, Figure 6).
constexpr std::size_t kAsRequestId = 0;
constexpr std::size_t kAsRemoteData = 4;
static_assert(kAsRemoteData + 8 == kAtomicResponseBodySize);

constexpr std::size_t DdpHeaderSize(bool tagged) {
  return tagged ? kDdpTaggedHeaderSize : kDdpUntaggedHeaderSize;
}

void DecodeAtomicRequestBody(const std::uint8_t* p, AtomicRequestBody& b) {
  const std::uint32_t word = LoadBe32(p + kArOpcodeWord);
  b.reserved = word >> 4;
  b.atomic_opcode = static_cast<std::uint8_t>(word & kAtomicOpcodeMask);
  b.request_id = LoadBe32(p + kArRequestId);
  b.remote_stag = LoadBe32(p + kArRemoteStag);
  b.remote_to = LoadBe64(p + kArRemoteTo);
  b.add_or_swap_data = LoadBe64(p + kArAddOrSwapData);
  b.add_or_swap_mask = LoadBe64(p + kArAddOrSwapMask);
  b.compare_data = LoadBe64(p + kArCompareData);
  b.compare_mask = LoadBe64(p + kArCompareMask);
}

void EncodeAtomicRequestBody(const AtomicRequestBody& b, std::uint8_t* p) {
  StoreBe32(p + kArOpcodeWord, (b.reserved << 4) | (b.atomic_opcode & kAtomicOpcodeMask));
  StoreBe32(p + kArRequestId, b.request_id);
  StoreBe32(p + kArRemoteStag, b.remote_stag);
  StoreBe64(p + kArRemoteTo, b.remote_to);
  StoreBe64(p + kArAddOrSwapData, b.add_or_swap_data);
  StoreBe64(p + kArAddOrSwapMask, b.add_or_swap_mask);
  StoreBe64(p + kArCompareData, b.compare_data);
  StoreBe64(p + kArCompareMask, b.compare_mask);
}

void DecodeReadRequestAt(const std::uint8_t* p, ReadRequestBody& b) {
  b.sink_stag = LoadBe32(p + kRrSinkStag);
  b.sink_to = LoadBe64(p + kRrSinkTo);
  b.read_size = LoadBe32(p + kRrReadSize);
  b.source_stag = LoadBe32(p + kRrSourceStag);
  b.source_to = LoadBe64(p + kRrSourceTo);
}

void EncodeReadRequestAt(const ReadRequestBody& b, std::uint8_t* p) {
  StoreBe32(p + kRrSinkStag, b.sink_stag);
  StoreBe64(p + kRrSinkTo, b.sink_to);
  StoreBe32(p + kRrReadSize, b.read_size);
  StoreBe32(p + kRrSourceStag, b.source_stag);
  StoreBe64(p + kRrSourceTo, b.source_to);
}

// Decodes the fixed body of `opcode` from `p`, which holds at least its size.
HeaderBody DecodeBody(Opcode opcode, const std::uint8_t* p) {
  switch (opcode) {
    case Opcode::kRdmaReadRequest: {
      ReadRequestBody b;
      DecodeReadRequestAt(p, b);
      return b;
    }
    case Opcode::kImmediateData:
    case Opcode::kImmediateDataWithSe: {
      ImmediateDataBody b;
      for (std::size_t i = 0; i < kImmediateDataSize; ++i) b.data[i] = p[i];
      return b;
    }
    case Opcode::kAtomicRequest: {
      AtomicRequestBody b;
      DecodeAtomicRequestBody(p, b);
      return b;
    }
    case Opcode::kAtomicResponse: {
      AtomicResponseBody b;
      b.original_request_id = LoadBe32(p + kAsRequestId);
      b.original_remote_data = LoadBe64(p + kAsRemoteData);
      return b;
    }
    case Opcode::kTerminate: {
      TerminateControlBody b;
      for (std::size_t i = 0; i < kTerminateControlSize; ++i) b.octets[i] = p[i];
      return b;
    }
    default:
      return std::monostate{};
  }
}

}  // namespace

std::string_view OpcodeName(std::uint8_t opcode) {
  const OpcodeInfo* info = FindOpcode(opcode);
  return info != nullptr ? info->name : "unassigned opcode";
}

std::size_t UlpduHeaderLength(std::uint8_t ddp_control, std::uint8_t rdmap_control) {
  const bool tagged = (ddp_control & kDdpTaggedFlag) != 0;
  const std::size_t plain = DdpHeaderSize(tagged);
  if ((ddp_control & kDdpVersionMask) != kDdpVersion) return plain;
  if ((rdmap_control & kRdmapVersionMask) >> kRdmapVersionShift != kRdmapVersion) return plain;
  const OpcodeInfo* info = FindOpcode(static_cast<std::uint8_t>(rdmap_control & kRdmapOpcodeMask));
  if (info == nullptr || info->tagged != tagged) return plain;
  return info->header_length;
}

std::size_t BodySize(const HeaderBody& body) {
  if (std::holds_alternative<ReadRequestBody>(body)) return kReadRequestBodySize;
  if (std::holds_alternative<ImmediateDataBody>(body)) return kImmediateDataSize;
  if (std::holds_alternative<AtomicRequestBody>(body)) return kAtomicRequestBodySize;
  if (std::holds_alternative<AtomicResponseBody>(body)) return kAtomicResponseBodySize;
  if (std::holds_alternative<TerminateControlBody>(body)) return kTerminateControlSize;
  return 0;
}

bool DecodeReadRequestBody(ByteSpan in, ReadRequestBody& out) {
  if (in.size() < kReadRequestBodySize) return false;
  DecodeReadRequestAt(in.data(), out);
  return true;
}

bool EncodeReadRequestBody(const ReadRequestBody& body, MutableByteSpan out) {
  if (out.size() < kReadRequestBodySize) return false;
  EncodeReadRequestAt(body, out.data());
  return true;
}

DdpRdmapHeader MakeHeader(Opcode opcode, bool last) {
  DdpRdmapHeader h;
  h.opcode = opcode;
  h.last = last;
  const OpcodeInfo* info = FindOpcode(opcode);
  if (info == nullptr) return h;
  h.tagged = info->tagged;
  if (!h.tagged) h.qn = info->queue_number;
  switch (opcode) {
    case Opcode::kRdmaReadRequest: h.body = ReadRequestBody{}; break;
    case Opcode::kImmediateData:
    case Opcode::kImmediateDataWithSe: h.body = ImmediateDataBody{}; break;
    case Opcode::kAtomicRequest: h.body = AtomicRequestBody{}; break;
    case Opcode::kAtomicResponse: h.body = AtomicResponseBody{}; break;
    case Opcode::kTerminate: h.body = TerminateControlBody{}; break;
    default: break;
  }
  return h;
}

std::string_view HeaderStatusName(HeaderStatus status) {
  switch (status) {
    case HeaderStatus::kOk: return "ok";
    case HeaderStatus::kTruncated: return "header truncated";
    case HeaderStatus::kInvalidDdpVersion: return "invalid DDP version";
    case HeaderStatus::kInvalidQueueNumber: return "invalid DDP queue number";
    case HeaderStatus::kInvalidRdmapVersion: return "invalid RDMAP version";
    case HeaderStatus::kUnknownOpcode: return "unassigned RDMAP opcode";
    case HeaderStatus::kTaggedFlagMismatch: return "DDP tagged flag contradicts the opcode";
    case HeaderStatus::kWrongQueueNumber: return "queue number is not the opcode's queue";
    case HeaderStatus::kNonZeroMessageOffset: return "single-segment message with non-zero MO";
    case HeaderStatus::kNotLastSegment: return "single-segment message without the Last flag";
  }
  return "unknown header status";
}

HeaderDecodeResult DecodeDdpRdmapHeader(ByteSpan in) {
  HeaderDecodeResult r;
  DdpRdmapHeader& h = r.header;
  // Fields not reached stay zero rather than holding the "as sent" defaults.
  h.last = false;
  h.ddp_version = 0;
  h.rdmap_version = 0;
  h.opcode = static_cast<Opcode>(0);

  if (in.size() < 1) {
    r.status = HeaderStatus::kTruncated;
    r.length = 1;
    return r;
  }
  const std::uint8_t ddp_control = in[kDdpControlOffset];
  h.tagged = (ddp_control & kDdpTaggedFlag) != 0;
  h.last = (ddp_control & kDdpLastFlag) != 0;
  h.ddp_reserved = static_cast<std::uint8_t>((ddp_control & kDdpReservedMask) >> kDdpReservedShift);
  h.ddp_version = ddp_control & kDdpVersionMask;
  r.reserved_bits_set = h.ddp_reserved != 0;
  // A DDP header of another version has an unknown layout: stop here.
  if (h.ddp_version != kDdpVersion) {
    r.status = HeaderStatus::kInvalidDdpVersion;
    return r;
  }

  const std::size_t ddp_size = DdpHeaderSize(h.tagged);
  if (in.size() < ddp_size) {
    r.status = HeaderStatus::kTruncated;
    r.length = ddp_size;
    return r;
  }
  const std::uint8_t rdmap_control = in[kRdmapControlOffset];
  h.rdmap_version = static_cast<std::uint8_t>((rdmap_control & kRdmapVersionMask) >> kRdmapVersionShift);
  h.rdmap_reserved =
      static_cast<std::uint8_t>((rdmap_control & kRdmapReservedMask) >> kRdmapReservedShift);
  h.opcode = static_cast<Opcode>(rdmap_control & kRdmapOpcodeMask);
  r.reserved_bits_set = r.reserved_bits_set || h.rdmap_reserved != 0;
  const std::uint8_t* p = in.data();
  if (h.tagged) {
    h.stag = LoadBe32(p + kStagOffset);
    h.to = LoadBe64(p + kToOffset);
  } else {
    h.invalidate_stag = LoadBe32(p + kInvalidateStagOffset);
    h.qn = LoadBe32(p + kQnOffset);
    h.msn = LoadBe32(p + kMsnOffset);
    h.mo = LoadBe32(p + kMoOffset);
    // DDP's own check (RFC 5041 7.1 item 1): the QN must name a queue.
    if (h.qn > kMaxQueueNumber) {
      r.status = HeaderStatus::kInvalidQueueNumber;
      return r;
    }
  }

  if (h.rdmap_version != kRdmapVersion) {
    r.status = HeaderStatus::kInvalidRdmapVersion;
    return r;
  }
  const OpcodeInfo* info = FindOpcode(h.opcode);
  if (info == nullptr) {
    r.status = HeaderStatus::kUnknownOpcode;
    return r;
  }
  if (info->tagged != h.tagged) {
    r.status = HeaderStatus::kTaggedFlagMismatch;
    return r;
  }
  if (!h.tagged && h.qn != info->queue_number) {
    r.status = HeaderStatus::kWrongQueueNumber;
    return r;
  }
  if (!h.tagged && !info->has_invalidate_stag && h.invalidate_stag != 0) {
    r.reserved_bits_set = true;  // RFC 5040 4.1: zero on transmit, ignored on receive
  }

  if (in.size() < info->header_length) {
    r.status = HeaderStatus::kTruncated;
    r.length = info->header_length;
    return r;
  }
  h.body = DecodeBody(h.opcode, p + ddp_size);
  if (const auto* atomic = std::get_if<AtomicRequestBody>(&h.body); atomic != nullptr) {
    r.reserved_bits_set = r.reserved_bits_set || atomic->reserved != 0;
  }
  if (info->single_segment) {
    if (h.mo != 0) {
      r.status = HeaderStatus::kNonZeroMessageOffset;
      return r;
    }
    if (!h.last) {
      r.status = HeaderStatus::kNotLastSegment;
      return r;
    }
  }
  r.status = HeaderStatus::kOk;
  r.length = info->header_length;
  return r;
}

std::string_view EncodeStatusName(EncodeStatus status) {
  switch (status) {
    case EncodeStatus::kOk: return "ok";
    case EncodeStatus::kBufferTooSmall: return "output buffer too small";
    case EncodeStatus::kFieldOutOfRange: return "field value does not fit its width";
    case EncodeStatus::kInconsistent: return "fields contradict each other";
  }
  return "unknown encode status";
}

std::size_t EncodedLength(const DdpRdmapHeader& header) {
  return DdpHeaderSize(header.tagged) + BodySize(header.body);
}

EncodeResult EncodeDdpRdmapHeader(const DdpRdmapHeader& h, MutableByteSpan out) {
  EncodeResult r;
  r.length = EncodedLength(h);
  const auto opcode = static_cast<std::uint8_t>(h.opcode);
  if (h.ddp_reserved > (kDdpReservedMask >> kDdpReservedShift) ||
      h.ddp_version > kDdpVersionMask ||
      h.rdmap_version > (kRdmapVersionMask >> kRdmapVersionShift) ||
      h.rdmap_reserved > (kRdmapReservedMask >> kRdmapReservedShift) ||
      opcode > kRdmapOpcodeMask) {
    r.status = EncodeStatus::kFieldOutOfRange;
    return r;
  }
  if (const auto* atomic = std::get_if<AtomicRequestBody>(&h.body);
      atomic != nullptr &&
      (atomic->reserved > kAtomicReservedMax || atomic->atomic_opcode > kAtomicOpcodeMask)) {
    r.status = EncodeStatus::kFieldOutOfRange;
    return r;
  }
  if (out.size() < r.length) {
    r.status = EncodeStatus::kBufferTooSmall;
    return r;
  }

  std::uint8_t* p = out.data();
  p[kDdpControlOffset] = static_cast<std::uint8_t>(
      (h.tagged ? kDdpTaggedFlag : 0) | (h.last ? kDdpLastFlag : 0) |
      (h.ddp_reserved << kDdpReservedShift) | h.ddp_version);
  p[kRdmapControlOffset] = static_cast<std::uint8_t>((h.rdmap_version << kRdmapVersionShift) |
                                                     (h.rdmap_reserved << kRdmapReservedShift) |
                                                     opcode);
  if (h.tagged) {
    StoreBe32(p + kStagOffset, h.stag);
    StoreBe64(p + kToOffset, h.to);
  } else {
    StoreBe32(p + kInvalidateStagOffset, h.invalidate_stag);
    StoreBe32(p + kQnOffset, h.qn);
    StoreBe32(p + kMsnOffset, h.msn);
    StoreBe32(p + kMoOffset, h.mo);
  }
  std::uint8_t* body = p + DdpHeaderSize(h.tagged);
  if (const auto* rr = std::get_if<ReadRequestBody>(&h.body)) {
    EncodeReadRequestAt(*rr, body);
  } else if (const auto* imm = std::get_if<ImmediateDataBody>(&h.body)) {
    for (std::size_t i = 0; i < kImmediateDataSize; ++i) body[i] = imm->data[i];
  } else if (const auto* areq = std::get_if<AtomicRequestBody>(&h.body)) {
    EncodeAtomicRequestBody(*areq, body);
  } else if (const auto* aresp = std::get_if<AtomicResponseBody>(&h.body)) {
    StoreBe32(body + kAsRequestId, aresp->original_request_id);
    StoreBe64(body + kAsRemoteData, aresp->original_remote_data);
  } else if (const auto* term = std::get_if<TerminateControlBody>(&h.body)) {
    for (std::size_t i = 0; i < kTerminateControlSize; ++i) body[i] = term->octets[i];
  }
  return r;
}

}  // namespace siwx::rdmap
