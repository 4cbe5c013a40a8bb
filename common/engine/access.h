// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Access rights of memory regions and the result of a tagged-buffer access
// check (RFC 5040 section 7, RFC 5041 section 7, RFC 5042 section 6).
//
// AccessFlags are the rights a region was registered with. Their bit values
// equal enum ibv_access_flags so the provider can pass verbs flags through;
// the provider static_asserts that, since common/ never sees verbs.h.
//
// AccessStatus says which check failed, so the data path can pick the exact
// Terminate code. The mapping it should use:
//
//   AccessStatus        DDP tagged error (RFC 5041 7.2)  RDMAP remote protection (RFC 5040 4.8)
//   kInvalidStag        Invalid STag          (1/1/00)   Invalid STag               (0/1/00)
//   kInvalidated        Invalid STag          (1/1/00)   Invalid STag               (0/1/00)
//   kPdMismatch         STag not associated   (1/1/02)   STag not assoc. w/ stream  (0/1/03)
//   kAccessViolation    Invalid STag          (1/1/00)   Access rights violation    (0/1/02)
//   kToWrap             TO wrap               (1/1/03)   TO wrap                    (0/1/04)
//   kBaseOrBounds       Base or bounds        (1/1/01)   Base or bounds violation   (0/1/01)
//
// (Layer/EType/ECode as in the IANA RDDP registry.) DDP has no access-rights
// code, so a rights violation is best reported at the RDMAP layer, which has
// one; kInvalidated has no code of its own in either layer.
#pragma once

#include <cstdint>
#include <string_view>

namespace siwx::engine {

// Rights of a memory region. Values mirror enum ibv_access_flags.
enum class AccessFlags : std::uint32_t {
  kNone = 0,
  kLocalWrite = 1u << 0,    // IBV_ACCESS_LOCAL_WRITE
  kRemoteWrite = 1u << 1,   // IBV_ACCESS_REMOTE_WRITE: RDMA Write sink (RFC 5040 5.1)
  kRemoteRead = 1u << 2,    // IBV_ACCESS_REMOTE_READ: RDMA Read source (RFC 5040 5.2)
  kRemoteAtomic = 1u << 3,  // IBV_ACCESS_REMOTE_ATOMIC (RFC 7306; not served yet)
  kMwBind = 1u << 4,        // IBV_ACCESS_MW_BIND (windows not supported yet)
  kZeroBased = 1u << 5,     // IBV_ACCESS_ZERO_BASED: TO is an offset from 0
};

constexpr AccessFlags operator|(AccessFlags a, AccessFlags b) {
  return static_cast<AccessFlags>(static_cast<std::uint32_t>(a) |
                                  static_cast<std::uint32_t>(b));
}
constexpr AccessFlags operator&(AccessFlags a, AccessFlags b) {
  return static_cast<AccessFlags>(static_cast<std::uint32_t>(a) &
                                  static_cast<std::uint32_t>(b));
}
constexpr AccessFlags operator~(AccessFlags a) {
  return static_cast<AccessFlags>(~static_cast<std::uint32_t>(a));
}
// True if every right in `wanted` is present in `granted`.
constexpr bool HasAll(AccessFlags granted, AccessFlags wanted) {
  return (granted & wanted) == wanted;
}
constexpr bool HasAny(AccessFlags granted, AccessFlags wanted) {
  return (granted & wanted) != AccessFlags::kNone;
}

// Every flag a registration may carry; anything else is rejected.
inline constexpr AccessFlags kAllAccessFlags =
    AccessFlags::kLocalWrite | AccessFlags::kRemoteWrite | AccessFlags::kRemoteRead |
    AccessFlags::kRemoteAtomic | AccessFlags::kMwBind | AccessFlags::kZeroBased;

// What an access needs. Local reads need no flag: every region is locally
// readable (it is the source of Sends, Writes and Read Responses).
enum class AccessKind : std::uint8_t {
  kLocalRead,    // source of an outbound Send / RDMA Write / Read Response
  kLocalWrite,   // receive buffer of a Send, sink of a Read Response
  kRemoteWrite,  // sink of an inbound RDMA Write
  kRemoteRead,   // source named by an inbound RDMA Read Request
};

constexpr AccessFlags RequiredFlags(AccessKind kind) {
  switch (kind) {
    case AccessKind::kLocalRead:
      return AccessFlags::kNone;
    case AccessKind::kLocalWrite:
      return AccessFlags::kLocalWrite;
    case AccessKind::kRemoteWrite:
      return AccessFlags::kRemoteWrite;
    case AccessKind::kRemoteRead:
      return AccessFlags::kRemoteRead;
  }
  return AccessFlags::kNone;
}

// Outcome of one access check, in the order the checks run (the first
// failing check is reported). See the table at the top of this file.
enum class AccessStatus : std::uint8_t {
  kOk = 0,
  kInvalidStag,      // no region at the index, or the key differs
  kPdMismatch,       // region belongs to another PD than the stream's QP
  kInvalidated,      // region was invalidated (locally or by the peer)
  kAccessViolation,  // region lacks the right the access needs
  kToWrap,           // TO + length overflows the 64-bit TO space
  kBaseOrBounds,     // [TO, TO + length) is not inside the region
};

constexpr std::string_view AccessStatusName(AccessStatus status) {
  switch (status) {
    case AccessStatus::kOk:
      return "ok";
    case AccessStatus::kInvalidStag:
      return "invalid STag";
    case AccessStatus::kPdMismatch:
      return "STag not associated with this stream (PD mismatch)";
    case AccessStatus::kInvalidated:
      return "STag invalidated";
    case AccessStatus::kAccessViolation:
      return "access rights violation";
    case AccessStatus::kToWrap:
      return "tagged offset wrap";
    case AccessStatus::kBaseOrBounds:
      return "base or bounds violation";
  }
  return "unknown";
}

}  // namespace siwx::engine
