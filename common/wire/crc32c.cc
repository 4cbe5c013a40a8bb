#include "common/wire/crc32c.h"

#include <isa-l/crc.h>

#include <limits>

namespace siwx {

void Crc32c::Update(ByteSpan data) {
  // ISA-L takes an int length and a non-const pointer it only reads.
  auto* p = const_cast<std::uint8_t*>(data.data());
  std::size_t left = data.size();
  constexpr std::size_t kMaxChunk = std::numeric_limits<int>::max() & ~std::size_t{63};
  while (left > 0) {
    const std::size_t n = left < kMaxChunk ? left : kMaxChunk;
    state_ = crc32_iscsi(p, static_cast<int>(n), state_);
    p += n;
    left -= n;
  }
}

std::uint32_t ComputeCrc32c(ByteSpan data) {
  Crc32c crc;
  crc.Update(data);
  return crc.Value();
}

void Crc32cToWire(std::uint32_t crc, std::uint8_t out[4]) {
  out[0] = static_cast<std::uint8_t>(crc);
  out[1] = static_cast<std::uint8_t>(crc >> 8);
  out[2] = static_cast<std::uint8_t>(crc >> 16);
  out[3] = static_cast<std::uint8_t>(crc >> 24);
}

std::uint32_t Crc32cFromWire(const std::uint8_t in[4]) {
  return std::uint32_t{in[0]} | (std::uint32_t{in[1]} << 8) |
         (std::uint32_t{in[2]} << 16) | (std::uint32_t{in[3]} << 24);
}

}  // namespace siwx
