// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Protection domains, memory regions and the STag table (RFC 5040, RFC 5041
// tagged buffers; RFC 5042 sections 2.2.4, 2.2.5 and 6).
//
// An STag is a 24-bit index plus an 8-bit key: stag = index << 8 | key.
// Both parts are drawn from the kernel CSPRNG (getrandom(2)) at every
// registration, so STags are not predictable and are spread over the whole
// 32-bit space (RFC 5042 6.1.1; RFC 5040 8.1.1 rule 8: "An RNIC MUST choose
// the value of STags in a way difficult to predict. It is RECOMMENDED to
// sparsely populate them over the full available range"). A drawn index
// that is in use, or among the last Options::reuse_delay indices freed, is
// drawn again, so a freed STag is never reissued soon and a stale one names
// a new region only if its index and key are both drawn again later
// (chance 2^-32 per registration). Index 0 is never handed out, so STag
// values 0..255 are always invalid.
//
// The regions live in an open-addressing table indexed by the low bits of
// the index (uniformly random, so no hashing is needed) with linear probing
// and at most half the slots used: a lookup reads about one slot on average
// and writes nothing another thread writes (see "Threading" below).
//
// What a region checks, in this order (first failure wins, see access.h):
// STag (index in range, region present, key equal), PD of the region equal to
// the PD of the QP, not invalidated, access right, TO + length not wrapping,
// and [TO, TO + length) inside the region. For VA-based regions the TO is the
// IOVA the application registered; for zero-based regions the TO is an offset
// from 0 (RFC 5041 leaves the meaning of a TO to the Data Sink).
//
// Zero-length accesses: a check with length 0 succeeds without looking at the
// STag at all and returns no region. Nothing is read or written, RFC 5042
// 6.3.5 says a zero-length RDMA Read "does not even require a valid STag",
// and MPA v2 peer-to-peer RTR messages (RFC 6581) are zero-length RDMA Writes
// or Reads whose STag is arbitrary (Linux siw sends STag 1). Treating Writes
// and Read Responses the same way keeps one rule for all tagged messages.
//
// Invalidation: Local Invalidate by the owner (any region of the caller's
// PD). A region registered here is a memory region, valid on every stream of
// its PD, so a peer's Send with Invalidate never invalidates it: RFC 5040
// 8.1.1 rule 7, "An RNIC MUST ensure that a Remote Peer is not able to
// invalidate an STag enabled for remote access, if the STag is shared on
// multiple streams" (RFC 5042 6.4.5); verbs lets a peer invalidate only
// memory windows bound to one QP (type 2), which siwx does not offer. An
// invalidated region fails every check with kInvalidated until it is
// deregistered; libibverbs has no call that re-validates a plain MR.
// Invalidating an already invalid region succeeds (verbs semantics).
//
// Threading and ownership: registration, deregistration and PD calls come
// from application threads; checks and invalidations come from the progress
// thread (and from application threads posting work). Everything that
// changes slots (Register, Deregister, PD calls, Invalidate) takes
// `writer_mutex_`; a check takes no lock and writes only lines of its own
// thread, because a Write ping-pong has the posting application and the
// progress thread of the same process (placing the peer's Writes) check on
// two CPUs in turn, and every line both write moves between the CPUs at
// every check (docs/performance-notes.md 3.18, 3.23):
//  - The table is read optimistically: writers make `version_` odd while
//    they change slots (or grow the slot array, whose old copies are kept
//    until the table goes), and a lookup that saw the version change
//    starts again (a seqlock). Slots carry index, STag and region, so a
//    lookup reads no region record before it has validated it.
//  - A successful check returns a RegionRef, which counts as a user of the
//    region's memory. The count lives in a hazard word of the checking
//    thread's own reader record (region address | count, 8 words, one
//    cache line, written only by that thread, with plain stores): the word
//    is published before the version is validated, and Deregister reads
//    the words after changing the version, with a fence between on both
//    sides (membarrier(2) on Deregister's side and a compiler barrier on
//    the lookup's where the kernel offers it), so either Deregister sees
//    the word or the lookup sees the region gone. A thread holding 8
//    distinct regions at once takes the ninth under `writer_mutex_` and
//    counts it in the region's `users_`.
// Deregister unpublishes the STag under the writer lock and marks the
// region deregistered (holders that re-check see it invalid; a check that
// found it a moment before fails with kInvalidStag), so no new check can
// succeed, and then waits
// (outside the lock, polling with a growing sleep) until no hazard word
// and no `users_` count names the region; then it frees the record. When
// it returns, no engine thread touches the buffer any more and the
// application may free it. Hence the contract for RegionRef holders: hold
// one only while copying bytes of the region (one DDP segment or less, or
// one transmit turn), never across waiting for the network, and never call
// Deregister on a thread that holds a RegionRef of the same region; and
// release a RegionRef on the thread that took it (the engine's transmit
// and receive turns release every ref before they return; debug builds
// assert it).
//
// The table does not pin or translate memory: host addresses are the
// process's own virtual addresses, which is what a userspace device needs.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/engine/access.h"

namespace siwx::engine {

// The STag is 32 bits (RFC 5041 4.2); the index/key split is ours.
inline constexpr std::uint32_t kStagKeyBits = 8;
inline constexpr std::uint32_t kStagKeyMask = 0xFFu;
inline constexpr std::uint32_t kMaxStagIndex = 0x00FFFFFFu;  // 24-bit index

constexpr std::uint32_t MakeStag(std::uint32_t index, std::uint8_t key) {
  return (index << kStagKeyBits) | key;
}
constexpr std::uint32_t StagIndex(std::uint32_t stag) { return stag >> kStagKeyBits; }
constexpr std::uint8_t StagKey(std::uint32_t stag) {
  return static_cast<std::uint8_t>(stag & kStagKeyMask);
}

// A protection domain's identity. Never 0 for a live PD; ids are never
// reused within one table (a 32-bit counter), so a stale id matches nothing.
using PdId = std::uint32_t;
inline constexpr PdId kNoPd = 0;

// One registered memory region. Immutable after registration except for the
// validity flag, so readers holding a RegionRef need no lock. Aligned to a
// cache line: its address leaves the low bits of a hazard word to the count.
class alignas(64) MemoryRegion {
 public:
  MemoryRegion(std::uint32_t stag, PdId pd, AccessFlags access, std::uint64_t iova,
               std::uint64_t length, std::uintptr_t host_address)
      : stag_(stag), pd_(pd), access_(access), iova_(iova), length_(length),
        host_address_(host_address) {}
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  std::uint32_t stag() const { return stag_; }
  PdId pd() const { return pd_; }
  AccessFlags access() const { return access_; }
  bool zero_based() const { return HasAll(access_, AccessFlags::kZeroBased); }
  // First TO of the region: the registered IOVA, or 0 when zero-based.
  std::uint64_t base_to() const { return zero_based() ? 0 : iova_; }
  std::uint64_t iova() const { return iova_; }
  std::uint64_t length() const { return length_; }
  std::uintptr_t host_address() const { return host_address_; }
  // False once invalidated or deregistered.
  bool valid() const { return state_.load(std::memory_order_acquire) == State::kValid; }

  // Host address of the byte at `to`. Only meaningful for a TO that passed a
  // check against this region.
  std::uint8_t* HostPointer(std::uint64_t to) const {
    return reinterpret_cast<std::uint8_t*>(host_address_ +
                                           static_cast<std::uintptr_t>(to - base_to()));
  }

 private:
  friend class MemoryTable;
  friend class RegionRef;

  // Refs taken under the writer lock when the taking thread's hazard words
  // were all in use (memory.cc); Deregister waits for 0.
  std::atomic<std::uint32_t> users_{0};
  enum class State : std::uint8_t { kValid, kInvalidated, kDeregistered };
  // Deregistered wins over invalidated: a check that found the region just
  // before Deregister unpublished it says kInvalidStag, as one just after.
  std::atomic<State> state_{State::kValid};
  const std::uint32_t stag_;
  const PdId pd_;
  const AccessFlags access_;
  const std::uint64_t iova_;
  const std::uint64_t length_;
  const std::uintptr_t host_address_;
};

struct ReaderRecord;  // memory.cc: one thread's hazard words and check counts

// A region that passed a check, pinned for the duration of one copy. Move-only.
class RegionRef {
 public:
  RegionRef() = default;
  ~RegionRef() { Release(); }
  RegionRef(RegionRef&& other) noexcept
      : region_(std::exchange(other.region_, nullptr)),
        hazard_(std::exchange(other.hazard_, nullptr)) {}
  RegionRef& operator=(RegionRef&& other) noexcept;
  RegionRef(const RegionRef&) = delete;
  RegionRef& operator=(const RegionRef&) = delete;

  explicit operator bool() const { return region_ != nullptr; }
  const MemoryRegion* get() const { return region_; }
  const MemoryRegion* operator->() const { return region_; }
  // Drops the pin early (Deregister may then return).
  void Release();

 private:
  friend class MemoryTable;
  RegionRef(MemoryRegion* region, std::atomic<std::uint64_t>* hazard)
      : region_(region), hazard_(hazard) {}

  MemoryRegion* region_ = nullptr;
  // The hazard word of the taking thread's reader record that counts this
  // ref, or null when region_->users_ counts it (memory.cc).
  std::atomic<std::uint64_t>* hazard_ = nullptr;
};

struct AccessCheckResult {
  AccessStatus status = AccessStatus::kInvalidStag;
  RegionRef region;  // set iff status == kOk and length > 0
  bool ok() const { return status == AccessStatus::kOk; }
};

enum class RegisterStatus : std::uint8_t {
  kOk = 0,
  kInvalidPd,          // PD not allocated in this table
  kInvalidAccess,      // unknown flag, or remote write/atomic without local write
  kInvalidLength,      // length 0, or the address or IOVA range wraps
  kNoResources,        // no free STag index left
  kNoRandomness,       // getrandom(2) failed; no unpredictable key available
};

struct RegisterResult {
  RegisterStatus status = RegisterStatus::kNoResources;
  std::uint32_t stag = 0;  // lkey == rkey == stag when status == kOk
};

enum class DeregisterStatus : std::uint8_t {
  kOk = 0,
  kInvalidStag,  // no region with this STag (includes a second deregister)
};

enum class InvalidateStatus : std::uint8_t {
  kOk = 0,
  kInvalidStag,       // no region with this STag
  kPdMismatch,        // region belongs to another PD than the QP
  kCannotInvalidate,  // remote invalidate of a memory region, which is shared
                      // by every stream of its PD (RDMAP "STag cannot be
                      // invalidated", ECode 0x09)
};

enum class PdStatus : std::uint8_t {
  kOk = 0,
  kInvalidPd,  // not allocated (or already deallocated)
  kBusy,       // regions still registered in it (ibv_dealloc_pd: EBUSY)
};

class MemoryTable {
 public:
  // Sources of keys and of indices (only the low 24 bits are used): return
  // std::nullopt when no randomness is available. Tests inject
  // deterministic ones; production uses getrandom(2).
  using KeySource = std::function<std::optional<std::uint8_t>()>;
  using IndexSource = std::function<std::optional<std::uint32_t>()>;

  struct Options {
    // Clamped to [1, kMaxStagIndex / 4], so random draws find a free index.
    std::uint32_t max_regions = 1u << 20;
    // A freed index is not issued again until this many more have been
    // freed, so STags come back slowly (RFC 5042 6.1.1). At most 4096.
    std::uint32_t reuse_delay = 256;
    KeySource key_source;      // empty: getrandom(2)
    IndexSource index_source;  // empty: getrandom(2)
  };

  MemoryTable();
  explicit MemoryTable(Options options);
  ~MemoryTable();
  MemoryTable(const MemoryTable&) = delete;
  MemoryTable& operator=(const MemoryTable&) = delete;

  // Protection domains. ids are 1, 2, 3, ... and never reused; kNoPd once
  // 2^32 - 1 PDs have been allocated.
  PdId AllocatePd();
  PdStatus DeallocatePd(PdId pd);

  // Registers [host_address, host_address + length) in `pd`, reachable at TOs
  // [iova, iova + length) (or [0, length) with kZeroBased). Verbs rule: remote
  // write or remote atomic needs local write too.
  RegisterResult Register(PdId pd, std::uint64_t iova, std::uint64_t length,
                          std::uintptr_t host_address, AccessFlags access);

  // Unpublishes the STag, then blocks until every RegionRef of the region has
  // been released. Call from application threads only.
  DeregisterStatus Deregister(std::uint32_t stag);

  // The tagged-access check (see the file comment). `qp_pd` is the PD of the
  // QP the access arrived on or was posted to.
  AccessCheckResult Check(std::uint32_t stag, PdId qp_pd, AccessKind kind, std::uint64_t to,
                          std::uint64_t length) const;

  InvalidateStatus InvalidateLocal(std::uint32_t stag, PdId qp_pd);
  // A peer's Send with Invalidate: never succeeds (file comment); says why.
  InvalidateStatus InvalidateRemote(std::uint32_t stag, PdId qp_pd);

  std::size_t region_count() const;
  // How many Checks ran on this table (tests count the lookups a holder of
  // a region saves, rx.h pin_). Counted per thread (memory.cc), so read it
  // while no check runs; a thread that checks more than four tables in
  // turn forgets the counts of the oldest.
  std::uint64_t checks() const;

 private:
  // Read by lookups without a lock while writers change them (the version
  // says when a read may have been torn), hence atomics.
  struct Slot {
    std::atomic<std::uint32_t> index{0};  // 0: empty
    std::atomic<std::uint32_t> stag{0};
    std::atomic<MemoryRegion*> region{nullptr};  // owned by the table
  };
  struct SlotArray {
    explicit SlotArray(std::size_t size) : mask(size - 1), slots(new Slot[size]) {}
    std::size_t size() const { return mask + 1; }
    const std::size_t mask;  // size - 1, size a power of two
    const std::unique_ptr<Slot[]> slots;
  };

  // The region of `stag` with a ref counted in `record` (the calling
  // thread's, memory.cc), or an empty ref if the STag names no region.
  RegionRef Pin(std::uint32_t stag, ReaderRecord& record) const;
  RegionRef PinLocked(std::uint32_t stag) const;  // takes writer_mutex_
  // Slot position of `index`, or of the empty slot where it would go.
  std::size_t ProbeLocked(std::uint32_t index) const;  // needs writer_mutex_
  MemoryRegion* FindLocked(std::uint32_t stag) const;  // needs writer_mutex_
  void EraseLocked(std::size_t position);  // needs writer_mutex_, version odd
  void GrowLocked();                       // needs writer_mutex_, version odd
  void BeginWriteLocked();  // version_ odd: lookups that overlap start again
  void EndWriteLocked();    // version_ even
  InvalidateStatus Invalidate(std::uint32_t stag, PdId qp_pd, bool remote);
  // Draws an index not in use and not recently freed; 0 if the draws kept
  // hitting used ones, nullopt if no randomness is available.
  std::optional<std::uint32_t> NextIndex();  // needs writer_mutex_
  std::optional<std::uint8_t> NextKey();     // needs writer_mutex_
  bool TakeRandom(std::uint8_t* out, std::size_t size);  // needs writer_mutex_

  const std::uint32_t reuse_delay_;
  const std::uint32_t max_regions_;
  const KeySource key_source_;
  const IndexSource index_source_;
  const std::uint64_t id_;  // never reused: the per-thread check counts name it

  // Read by every lookup, written only when slots change: a line of its own.
  alignas(64) std::atomic<std::uint64_t> version_{0};
  std::atomic<SlotArray*> slots_{nullptr};
  alignas(64) mutable std::mutex writer_mutex_;
  std::unique_ptr<SlotArray> current_;                 // guarded by writer_mutex_
  std::vector<std::unique_ptr<SlotArray>> retired_;    // guarded; lookups may still read them
  std::deque<std::uint32_t> recently_freed_;  // guarded by writer_mutex_; at most reuse_delay_
  std::unordered_map<PdId, std::uint32_t> pd_regions_;  // guarded; live PD -> #regions
  PdId next_pd_ = 1;                                 // guarded by writer_mutex_
  std::size_t region_count_ = 0;                     // guarded by writer_mutex_
  std::uint8_t random_pool_[64] = {};                // guarded by writer_mutex_
  std::size_t random_left_ = 0;                      // guarded by writer_mutex_
};

}  // namespace siwx::engine
