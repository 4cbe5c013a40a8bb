// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/wire/mpa_markers.h"

namespace siwx::mpa {

bool EncodeMarker(const Marker& marker, MutableByteSpan out) {
  if (out.size() < kMarkerSize) return false;
  StoreBe16(out.data(), marker.reserved);
  StoreBe16(out.data() + kMarkerReservedSize, marker.fpdu_ptr);
  return true;
}

std::optional<Marker> DecodeMarker(ByteSpan in) {
  if (in.size() < kMarkerSize) return std::nullopt;
  return Marker{LoadBe16(in.data()), LoadBe16(in.data() + kMarkerReservedSize)};
}

}  // namespace siwx::mpa
