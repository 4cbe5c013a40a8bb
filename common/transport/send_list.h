// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The scatter list of one sendmsg, built slice by slice.
//
// Small slices (ULPDU_Length fields, DDP/RDMAP headers, pad and CRC,
// markers, short payloads) are copied into the list's own octets and joined
// with their neighbours, and slices that continue the previous one in memory
// extend it. An FPDU's trailer and the next FPDU's length field and header
// thus become one iovec instead of three: the kernel spends about 50 ns on
// each iovec of a sendmsg, more than the copy of a few dozen octets
// (docs/performance-notes.md 3.43).
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace siwx::transport {

class SendList {
 public:
  // iovecs per sendmsg (IOV_MAX on Linux).
  static constexpr std::size_t kMaxIovecs = 1024;
  // Slices up to this long are copied; a Terminate ULPDU's header fits.
  static constexpr std::size_t kCopiedSliceOctets = 128;
  // Copied octets per list; when they run out, small slices are referenced.
  static constexpr std::size_t kCopiedOctets = 16 * 1024;

  SendList() = default;
  SendList(const SendList&) = delete;
  SendList& operator=(const SendList&) = delete;

  void Clear() {
    count_ = 0;
    copied_used_ = 0;
    octets_ = 0;
  }
  // True when the next slice may find no iovec left.
  bool full() const { return count_ == kMaxIovecs; }
  // Appends `len` octets at `base`, or returns false and adds nothing when
  // they would need an iovec the list no longer has. Octets not copied must
  // stay unchanged until the sendmsg is made.
  bool Add(const std::uint8_t* base, std::size_t len);

  std::span<const iovec> iovecs() const { return {iov_.data(), count_}; }
  std::size_t octets() const { return octets_; }

 private:
  std::array<iovec, kMaxIovecs> iov_;
  std::size_t count_ = 0;
  std::array<std::uint8_t, kCopiedOctets> copied_;
  std::size_t copied_used_ = 0;
  std::size_t octets_ = 0;
};

}  // namespace siwx::transport
