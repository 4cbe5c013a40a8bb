// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Send and receive work request records, the checks a post applies to them,
// and the bounded ring the work queues are built from.
//
// Records are self-contained copies of what the application posted: the SGE
// list lives in the record (up to kMaxSge entries; a QP may allow fewer), and
// inline data is copied in at post time so the application may reuse its
// buffers as soon as the post returns (IBV_SEND_INLINE). Records carry no
// pointers into the application's ibv_* structures.
//
// Two forms: SendWorkRequest / ReceiveWorkRequest are what a post hands in
// (room for the device limits); SendRecord / ReceiveRecord are what a queue
// keeps, sized by the queue's caps in fixed-stride slots (RecordSlots), so
// that an idle QP costs octets in proportion to its caps (issue 10).
//
// What is not validated here: lkeys, rkeys and addresses (those are checked
// against the STag table when the data path touches memory, see memory.h)
// and QP state (see qp_state.h).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "common/util/bytes.h"

namespace siwx::engine {

inline constexpr std::uint32_t kMaxSge = 16;          // SGEs a record can hold
inline constexpr std::uint32_t kMaxInlineData = 256;  // inline octets a record can hold
// An RDMA Read Request names one Data Sink STag and TO (RFC 5040 4.4), so a
// Read has one local SGE (max_sge_rd = 1).
inline constexpr std::uint32_t kMaxReadSge = 1;
// Depth limit of one work queue (a sanity bound for the rings).
inline constexpr std::uint32_t kMaxQueueDepth = 1u << 20;

// One scatter/gather element: `length` octets at `addr` in the region `lkey`.
struct Sge {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};
static_assert(sizeof(Sge) == 16);

// The RDMAP message (or local operation) a send work request asks for.
enum class SendOpcode : std::uint8_t {
  kSend = 0,                   // RDMAP Send (RFC 5040 5.3)
  kSendWithInvalidate,         // RDMAP Send with Invalidate
  kSendWithSolicitedEvent,     // RDMAP Send with Solicited Event
  kSendWithSeAndInvalidate,    // RDMAP Send with SE and Invalidate
  kRdmaWrite,                  // RDMAP RDMA Write (RFC 5040 5.1)
  kRdmaRead,                   // RDMAP RDMA Read Request (RFC 5040 5.2)
  kLocalInvalidate,            // local: invalidate one of our STags
};
inline constexpr std::uint8_t kSendOpcodeCount = 7;

// Bits equal enum ibv_send_flags.
enum SendFlags : std::uint32_t {
  kSendFence = 1u << 0,      // wait for earlier RDMA Reads to complete
  kSendSignaled = 1u << 1,   // generate a completion on success
  kSendSolicited = 1u << 2,  // set the Solicited Event bit (Send only)
  kSendInline = 1u << 3,     // data copied into the record at post time
};
inline constexpr std::uint32_t kAllSendFlags =
    kSendFence | kSendSignaled | kSendSolicited | kSendInline;

// The fields of a send WR other than its SGEs and inline data, shared by the
// posted form (SendWorkRequest) and the stored one (SendRecord).
struct SendWrFields {
  std::uint64_t wr_id = 0;
  std::uint64_t remote_addr = 0;       // Write: sink TO; Read: source TO
  SendOpcode opcode = SendOpcode::kSend;
  std::uint32_t flags = 0;             // SendFlags
  std::uint32_t num_sge = 0;
  std::uint32_t rkey = 0;              // Write: sink STag; Read: source STag
  std::uint32_t invalidate_stag = 0;   // Send w/ Inv: peer's STag; Local Inv: ours
  std::uint32_t imm_data = 0;          // reserved for RFC 7306 immediate data
  std::uint32_t inline_length = 0;     // octets of inline data (kSendInline)

  bool is_inline() const { return (flags & kSendInline) != 0; }
  bool signaled() const { return (flags & kSendSignaled) != 0; }
  // A Send that carries the Solicited Event bit, by opcode or by flag.
  bool solicited_event() const {
    return opcode == SendOpcode::kSendWithSolicitedEvent ||
           opcode == SendOpcode::kSendWithSeAndInvalidate ||
           (IsSend() && (flags & kSendSolicited) != 0);
  }
  bool IsSend() const { return opcode <= SendOpcode::kSendWithSeAndInvalidate; }
  bool invalidates_remote() const {
    return opcode == SendOpcode::kSendWithInvalidate ||
           opcode == SendOpcode::kSendWithSeAndInvalidate;
  }
};

// Octets a WR moves: inline_length, or the sum of its SGEs.
inline std::uint64_t SendLength(const SendWrFields& wr, std::span<const Sge> sges) {
  if (wr.is_inline()) return wr.inline_length;
  std::uint64_t total = 0;
  for (const Sge& s : sges) total += s.length;
  return total;
}

// A send WR as the application posts it (room for kMaxSge SGEs and
// kMaxInlineData octets: a transient, on the stack or in a batch).
struct SendWorkRequest : SendWrFields {
  std::array<Sge, kMaxSge> sge{};
  std::array<std::uint8_t, kMaxInlineData> inline_data{};

  std::span<const Sge> sges() const { return {sge.data(), std::min(num_sge, kMaxSge)}; }
  std::uint64_t total_length() const { return SendLength(*this, sges()); }
  // Copies `pieces` (the application's SGE buffers) into inline_data and sets
  // kSendInline. False, leaving the record unchanged, if they exceed
  // kMaxInlineData.
  bool CopyInline(std::span<const ByteSpan> pieces) {
    std::size_t total = 0;
    for (const ByteSpan& p : pieces) {
      if (p.size() > kMaxInlineData - total) return false;
      total += p.size();
    }
    std::size_t at = 0;
    for (const ByteSpan& p : pieces) {
      if (!p.empty()) std::memcpy(inline_data.data() + at, p.data(), p.size());
      at += p.size();
    }
    inline_length = static_cast<std::uint32_t>(total);
    flags |= kSendInline;
    return true;
  }
};

// A send WR as a send queue stores it: only what the WR carries. Its SGEs
// follow the record in its ring slot (RecordSlots), so SendRecord must be
// the last member of whatever a slot holds; inline data is in that slot too
// when it fits, else in the queue's inline area. An inline record keeps no
// SGEs (num_sge 0): inline data replaces them.
struct SendRecord : SendWrFields {
  const std::uint8_t* inline_at = nullptr;  // the inline octets, when is_inline()

  std::span<const Sge> sges() const {
    return {reinterpret_cast<const Sge*>(this + 1), num_sge};
  }
  ByteSpan inline_bytes() const { return {inline_at, inline_length}; }
  std::uint64_t total_length() const { return SendLength(*this, sges()); }

  // Stores `wr` (already validated against caps whose max_sge SGEs fit after
  // this record). Inline data goes to `inline_area`, which must hold
  // wr.inline_length octets (it may be the octets after this record).
  void Assign(const SendWorkRequest& wr, std::uint8_t* inline_area) {
    static_cast<SendWrFields&>(*this) = wr;
    if (wr.is_inline()) {
      num_sge = 0;
      if (wr.inline_length > 0) std::memcpy(inline_area, wr.inline_data.data(), wr.inline_length);
      inline_at = inline_area;
      return;
    }
    // A Local Invalidate has no SGEs (and its count is not validated).
    if (wr.opcode == SendOpcode::kLocalInvalidate) num_sge = 0;
    inline_at = nullptr;
    if (num_sge > 0) {
      std::memcpy(reinterpret_cast<Sge*>(this + 1), wr.sge.data(), num_sge * sizeof(Sge));
    }
  }
};
static_assert(sizeof(SendRecord) % alignof(Sge) == 0);

struct ReceiveWorkRequest {
  std::uint64_t wr_id = 0;
  std::uint32_t num_sge = 0;
  std::array<Sge, kMaxSge> sge{};

  std::span<const Sge> sges() const { return {sge.data(), std::min(num_sge, kMaxSge)}; }
  // Octets the buffers can take (a longer Send is a local length error).
  std::uint64_t total_length() const {
    std::uint64_t total = 0;
    for (const Sge& s : sges()) total += s.length;
    return total;
  }
};

// A receive WR as a receive queue stores it; num_sge SGEs follow it in its
// ring slot.
struct ReceiveRecord {
  std::uint64_t wr_id = 0;
  std::uint32_t num_sge = 0;

  std::span<const Sge> sges() const {
    return {reinterpret_cast<const Sge*>(this + 1), num_sge};
  }
  // Stores `wr` (already validated: its SGEs fit after this record).
  void Assign(const ReceiveWorkRequest& wr) {
    wr_id = wr.wr_id;
    num_sge = wr.num_sge;
    if (num_sge > 0) {
      std::memcpy(reinterpret_cast<Sge*>(this + 1), wr.sge.data(), num_sge * sizeof(Sge));
    }
  }
  // The posted form back (what Take hands the receive side).
  void CopyTo(ReceiveWorkRequest& out) const {
    out.wr_id = wr_id;
    out.num_sge = num_sge;
    if (num_sge > 0) std::memcpy(out.sge.data(), sges().data(), num_sge * sizeof(Sge));
  }
};
static_assert(sizeof(ReceiveRecord) % alignof(Sge) == 0);

// `count` entries of type Entry, each followed by `payload` octets (the SGEs
// or inline data of the record it ends with), in one allocation with a
// fixed stride: a queue costs what its caps need, not kMaxSge SGEs and
// kMaxInlineData octets per WR.
template <typename Entry>
class RecordSlots {
  static_assert(std::is_trivially_destructible_v<Entry>);
  static_assert(alignof(Entry) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);

 public:
  RecordSlots() = default;
  RecordSlots(std::uint32_t count, std::size_t payload)
      : stride_((sizeof(Entry) + payload + alignof(Entry) - 1) / alignof(Entry) * alignof(Entry)),
        count_(count),
        storage_(new std::byte[stride_ * count]) {
    for (std::uint32_t i = 0; i < count; ++i) new (storage_.get() + i * stride_) Entry();
  }

  std::size_t size() const { return count_; }
  // Octets after each entry.
  std::size_t payload_capacity() const { return stride_ - sizeof(Entry); }
  Entry& operator[](std::size_t i) {
    return *std::launder(reinterpret_cast<Entry*>(storage_.get() + i * stride_));
  }
  const Entry& operator[](std::size_t i) const {
    return *std::launder(reinterpret_cast<const Entry*>(storage_.get() + i * stride_));
  }
  // The octets after entry i.
  std::uint8_t* payload(std::size_t i) {
    return reinterpret_cast<std::uint8_t*>(storage_.get() + i * stride_ + sizeof(Entry));
  }

 private:
  std::size_t stride_ = 0;
  std::size_t count_ = 0;
  std::unique_ptr<std::byte[]> storage_;
};

// Limits of one work queue, fixed at creation (ibv_qp_cap / ibv_srq_attr).
struct QueueCaps {
  std::uint32_t max_wr = 0;
  std::uint32_t max_sge = 0;
  std::uint32_t max_inline_data = 0;  // send queues only
};

// Result of posting one work request. The provider maps kQueueFull to ENOMEM
// and everything else but kOk to EINVAL (ibv_post_send(3), ibv_post_recv(3)).
enum class PostStatus : std::uint8_t {
  kOk = 0,
  kQueueFull,       // max_wr WRs already outstanding
  kTooManySge,      // num_sge above the queue's max_sge (or 1 for a Read)
  kInlineTooLong,   // inline data above the queue's max_inline_data
  kInvalidOpcode,   // not a SendOpcode
  kInvalidFlags,    // unknown flag, or inline on an operation without payload
  kInvalidState,    // the QP state does not accept this post
};

// Whether `caps` can be honoured by records and rings of this engine.
constexpr bool CapsSupported(const QueueCaps& caps) {
  return caps.max_wr >= 1 && caps.max_wr <= kMaxQueueDepth && caps.max_sge <= kMaxSge &&
         caps.max_inline_data <= kMaxInlineData;
}

// The checks ibv_post_send applies to one WR, against the send queue's caps.
inline PostStatus ValidateSendWorkRequest(const SendWorkRequest& wr, const QueueCaps& caps) {
  if (static_cast<std::uint8_t>(wr.opcode) >= kSendOpcodeCount) return PostStatus::kInvalidOpcode;
  if ((wr.flags & ~kAllSendFlags) != 0) return PostStatus::kInvalidFlags;
  if (wr.opcode == SendOpcode::kLocalInvalidate) return PostStatus::kOk;  // no SGEs, no data
  if (wr.num_sge > caps.max_sge || wr.num_sge > kMaxSge) return PostStatus::kTooManySge;
  if (wr.opcode == SendOpcode::kRdmaRead) {
    // Inline carries payload; a Read Request carries none.
    if (wr.is_inline()) return PostStatus::kInvalidFlags;
    if (wr.num_sge > kMaxReadSge) return PostStatus::kTooManySge;
  }
  if (wr.is_inline() &&
      (wr.inline_length > caps.max_inline_data || wr.inline_length > kMaxInlineData)) {
    return PostStatus::kInlineTooLong;
  }
  return PostStatus::kOk;
}

inline PostStatus ValidateReceiveWorkRequest(const ReceiveWorkRequest& wr, const QueueCaps& caps) {
  if (wr.num_sge > caps.max_sge || wr.num_sge > kMaxSge) return PostStatus::kTooManySge;
  return PostStatus::kOk;
}

// A bounded FIFO of `capacity` records, allocated once. Not thread-safe: the
// owning queue holds its lock around every call.
template <typename T>
class WorkRing {
 public:
  explicit WorkRing(std::uint32_t capacity) : slots_(capacity) {}

  std::uint32_t capacity() const { return static_cast<std::uint32_t>(slots_.size()); }
  std::uint32_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  bool full() const { return count_ == slots_.size(); }

  // False (and nothing stored) when full.
  bool Push(const T& item) {
    if (full()) return false;
    slots_[(head_ + count_) % slots_.size()] = item;
    ++count_;
    return true;
  }
  // The oldest record, or nullptr when empty.
  T* Front() { return empty() ? nullptr : &slots_[head_]; }
  const T* Front() const { return empty() ? nullptr : &slots_[head_]; }
  // Removes and returns the oldest record.
  std::optional<T> Pop() {
    if (empty()) return std::nullopt;
    std::optional<T> item(std::move(slots_[head_]));
    head_ = (head_ + 1) % slots_.size();
    --count_;
    return item;
  }
  // The i-th oldest record (i < size()).
  const T& At(std::uint32_t i) const { return slots_[(head_ + i) % slots_.size()]; }
  void Clear() {
    head_ = 0;
    count_ = 0;
  }

 private:
  std::vector<T> slots_;
  std::uint32_t head_ = 0;
  std::uint32_t count_ = 0;
};

}  // namespace siwx::engine
