// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/transport/send_list.h"

#include <cstring>

namespace siwx::transport {

bool SendList::Add(const std::uint8_t* base, std::size_t len) {
  if (len == 0) return true;
  const bool copy = len <= kCopiedSliceOctets && len <= copied_.size() - copied_used_;
  const std::uint8_t* at = copy ? copied_.data() + copied_used_ : base;
  iovec* last = count_ > 0 ? &iov_[count_ - 1] : nullptr;
  const bool joins =
      last != nullptr && static_cast<const std::uint8_t*>(last->iov_base) + last->iov_len == at;
  if (!joins && count_ == kMaxIovecs) return false;
  if (copy) {
    std::memcpy(copied_.data() + copied_used_, base, len);
    copied_used_ += len;
  }
  if (joins) {
    last->iov_len += len;
  } else {
    iov_[count_++] = iovec{const_cast<std::uint8_t*>(at), len};
  }
  octets_ += len;
  return true;
}

}  // namespace siwx::transport
