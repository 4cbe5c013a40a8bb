// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/wire/mpa_startup.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace siwx::mpa {
namespace {

constexpr std::array<StartupFrameKind, 3> kAllKinds = {
    StartupFrameKind::kRequest, StartupFrameKind::kReply, StartupFrameKind::kRtr};

bool RevisionValidFor(StartupFrameKind kind, std::uint8_t revision) {
  // The proposal defines the Rtr frame for Rev 1 only; RFC 6581 replaces it
  // with an RTR FPDU. Rev 3 and up would be a revision we cannot
  // interoperate with: RFC 5044 7.1.1 Rev says close.
  if (kind == StartupFrameKind::kRtr) return revision == kMpaRevision1;
  return revision == kMpaRevision1 || revision == kMpaRevision2;
}

StartupDecodeResult Malformed(StartupFrameError e) {
  StartupDecodeResult r;
  r.status = StartupDecodeStatus::kMalformed;
  r.error = e;
  return r;
}

StartupDecodeResult NeedMore(std::size_t needed) {
  StartupDecodeResult r;
  r.status = StartupDecodeStatus::kNeedMore;
  r.needed = needed;
  return r;
}

}  // namespace

std::string_view StartupFrameKindName(StartupFrameKind kind) {
  switch (kind) {
    case StartupFrameKind::kRequest: return "MPA Request";
    case StartupFrameKind::kReply: return "MPA Reply";
    case StartupFrameKind::kRtr: return "MPA Rtr";
  }
  return "unknown startup frame";
}

std::string_view StartupFrameKey(StartupFrameKind kind) {
  switch (kind) {
    case StartupFrameKind::kRequest: return kRequestKey;
    case StartupFrameKind::kReply: return kReplyKey;
    case StartupFrameKind::kRtr: return kRtrKey;
  }
  return kRequestKey;
}

std::string_view StartupFrameErrorName(StartupFrameError e) {
  switch (e) {
    case StartupFrameError::kNone: return "no error";
    case StartupFrameError::kBadKey: return "key is not an MPA Request, Reply or Rtr key";
    case StartupFrameError::kBadRevision: return "unsupported MPA revision";
    case StartupFrameError::kPrivateDataTooLong: return "PD_Length exceeds 512";
    case StartupFrameError::kMissingIrdOrd:
      return "enhanced (Rev 2, S = 1) frame without the 4-octet IRD/ORD word";
  }
  return "unknown startup frame error";
}

std::string_view StartupEncodeStatusName(StartupEncodeStatus s) {
  switch (s) {
    case StartupEncodeStatus::kOk: return "ok";
    case StartupEncodeStatus::kBadRevision: return "revision not valid for this frame";
    case StartupEncodeStatus::kRejectInRequest: return "R must be zero in a Request";
    case StartupEncodeStatus::kBadRtrFlags: return "R, S and L must be zero in an Rtr frame";
    case StartupEncodeStatus::kIrdOrdMismatch:
      return "IRD/ORD word goes with Rev 2 + S, and only there";
    case StartupEncodeStatus::kIrdOrdOutOfRange: return "IRD or ORD above 0x3FFF";
    case StartupEncodeStatus::kPrivateDataTooLong: return "private data exceeds 512 octets";
    case StartupEncodeStatus::kRtrFlagsWithoutPeerToPeer:
      return "RTR flags B, C, D must be zero when A is zero";
  }
  return "unknown encode status";
}

void EncodeStartupHeader(const StartupHeader& h, std::span<std::uint8_t, kStartupHeaderSize> out) {
  const std::string_view key = StartupFrameKey(h.kind);
  std::memcpy(out.data(), key.data(), kKeySize);
  std::uint16_t flags = h.revision;
  if (h.markers) flags |= kStartupFlagM;
  if (h.crc) flags |= kStartupFlagC;
  if (h.reject) flags |= kStartupFlagR;
  if (h.x_bit) flags |= kStartupFlagX;
  if (h.large_fpdus) flags |= kStartupFlagLargeFpdus;
  flags |= static_cast<std::uint16_t>((h.reserved << 8) & kStartupResMask);
  StoreBe16(out.data() + kStartupFlagsOffset, flags);
  StoreBe16(out.data() + kStartupPdLengthOffset, h.pd_length);
}

void EncodeIrdOrdWord(const IrdOrdWord& w, std::span<std::uint8_t, kIrdOrdWordSize> out) {
  std::uint16_t ird = w.ird & kMaxIrdOrd;
  std::uint16_t ord = w.ord & kMaxIrdOrd;
  if (w.peer_to_peer) ird |= kIrdOrdFlagHigh;
  if (w.send_rtr) ird |= kIrdOrdFlagLow;
  if (w.write_rtr) ord |= kIrdOrdFlagHigh;
  if (w.read_rtr) ord |= kIrdOrdFlagLow;
  StoreBe16(out.data(), ird);
  StoreBe16(out.data() + 2, ord);
}

IrdOrdWord DecodeIrdOrdWord(std::span<const std::uint8_t, kIrdOrdWordSize> in) {
  const std::uint16_t ird = LoadBe16(in.data());
  const std::uint16_t ord = LoadBe16(in.data() + 2);
  IrdOrdWord w;
  w.ird = ird & kMaxIrdOrd;
  w.ord = ord & kMaxIrdOrd;
  w.peer_to_peer = (ird & kIrdOrdFlagHigh) != 0;
  w.send_rtr = (ird & kIrdOrdFlagLow) != 0;
  w.write_rtr = (ord & kIrdOrdFlagHigh) != 0;
  w.read_rtr = (ord & kIrdOrdFlagLow) != 0;
  return w;
}

StartupDecodeResult DecodeStartupFrame(ByteSpan input) {
  // Key first, octet by octet: garbage (an HTTP request, a stray FPDU) is
  // refused at its first octet that no key starts with.
  if (input.empty()) return NeedMore(kStartupHeaderSize);
  const std::size_t key_octets = std::min(input.size(), kKeySize);
  std::optional<StartupFrameKind> kind;
  for (StartupFrameKind k : kAllKinds) {
    if (std::memcmp(input.data(), StartupFrameKey(k).data(), key_octets) == 0) {
      kind = k;  // the keys differ, so once all 16 octets are in, one remains
      break;
    }
  }
  if (!kind) return Malformed(StartupFrameError::kBadKey);

  // Rev sits at octet 17; check it as soon as it is here.
  if (input.size() > kStartupFlagsOffset + 1) {
    const std::uint8_t revision = input[kStartupFlagsOffset + 1];
    if (!RevisionValidFor(*kind, revision)) return Malformed(StartupFrameError::kBadRevision);
  }
  if (input.size() < kStartupHeaderSize) return NeedMore(kStartupHeaderSize - input.size());

  StartupHeader h;
  h.kind = *kind;
  const std::uint16_t flags = LoadBe16(input.data() + kStartupFlagsOffset);
  h.markers = (flags & kStartupFlagM) != 0;
  h.crc = (flags & kStartupFlagC) != 0;
  h.reject = (flags & kStartupFlagR) != 0;
  h.x_bit = (flags & kStartupFlagX) != 0;
  h.large_fpdus = (flags & kStartupFlagLargeFpdus) != 0;
  h.reserved = static_cast<std::uint8_t>((flags & kStartupResMask) >> 8);
  h.revision = static_cast<std::uint8_t>(flags & kStartupRevMask);
  h.pd_length = LoadBe16(input.data() + kStartupPdLengthOffset);

  if (h.pd_length > kMaxPrivateDataLength) return Malformed(StartupFrameError::kPrivateDataTooLong);
  if (IsEnhanced(h) && h.pd_length < kIrdOrdWordSize) {
    return Malformed(StartupFrameError::kMissingIrdOrd);
  }
  const std::size_t total = kStartupHeaderSize + h.pd_length;
  if (input.size() < total) return NeedMore(total - input.size());

  StartupDecodeResult r;
  r.status = StartupDecodeStatus::kComplete;
  r.consumed = total;
  r.frame.header = h;
  r.frame.private_data = input.subspan(kStartupHeaderSize, h.pd_length);
  r.frame.ulp_private_data = r.frame.private_data;
  if (IsEnhanced(h)) {
    r.frame.ird_ord = DecodeIrdOrdWord(r.frame.private_data.first<kIrdOrdWordSize>());
    r.frame.ulp_private_data = r.frame.private_data.subspan(kIrdOrdWordSize);
  }
  return r;
}

StartupEncodeStatus EncodeStartupFrame(const StartupFrameSpec& spec,
                                       std::vector<std::uint8_t>* out) {
  if (!RevisionValidFor(spec.kind, spec.revision)) return StartupEncodeStatus::kBadRevision;
  if (spec.kind == StartupFrameKind::kRequest && spec.reject) {
    return StartupEncodeStatus::kRejectInRequest;
  }
  // The Rtr frame answers nothing: siw's experiment lives in Request and
  // Reply only.
  if (spec.kind == StartupFrameKind::kRtr && (spec.reject || spec.x_bit || spec.large_fpdus)) {
    return StartupEncodeStatus::kBadRtrFlags;
  }
  const bool enhanced = spec.revision == kMpaRevision2 && spec.x_bit;
  if (enhanced != spec.ird_ord.has_value()) return StartupEncodeStatus::kIrdOrdMismatch;
  if (spec.ird_ord && (spec.ird_ord->ird > kMaxIrdOrd || spec.ird_ord->ord > kMaxIrdOrd)) {
    return StartupEncodeStatus::kIrdOrdOutOfRange;
  }
  if (spec.ird_ord && !spec.ird_ord->peer_to_peer &&
      (spec.ird_ord->send_rtr || spec.ird_ord->write_rtr || spec.ird_ord->read_rtr)) {
    return StartupEncodeStatus::kRtrFlagsWithoutPeerToPeer;
  }
  const std::size_t pd_length = (enhanced ? kIrdOrdWordSize : 0) + spec.ulp_private_data.size();
  if (pd_length > kMaxPrivateDataLength) return StartupEncodeStatus::kPrivateDataTooLong;

  StartupHeader h;
  h.kind = spec.kind;
  h.markers = spec.markers;
  h.crc = spec.crc;
  h.reject = spec.reject;
  h.x_bit = spec.x_bit;
  h.large_fpdus = spec.large_fpdus;
  h.reserved = 0;  // RFC 5044 7.1.1, RFC 6581 6: Res MUST be zero when sending
  h.revision = spec.revision;
  h.pd_length = static_cast<std::uint16_t>(pd_length);

  const std::size_t start = out->size();
  out->resize(start + kStartupHeaderSize + pd_length);
  std::uint8_t* p = out->data() + start;
  EncodeStartupHeader(h, std::span<std::uint8_t, kStartupHeaderSize>(p, kStartupHeaderSize));
  p += kStartupHeaderSize;
  if (enhanced) {
    EncodeIrdOrdWord(*spec.ird_ord, std::span<std::uint8_t, kIrdOrdWordSize>(p, kIrdOrdWordSize));
    p += kIrdOrdWordSize;
  }
  if (!spec.ulp_private_data.empty()) {
    std::memcpy(p, spec.ulp_private_data.data(), spec.ulp_private_data.size());
  }
  return StartupEncodeStatus::kOk;
}

}  // namespace siwx::mpa
