// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/memory.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <mutex>
#include <utility>

namespace siwx::engine {
namespace {

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();
// Slots of an empty table (a power of two; the table doubles at half full).
constexpr std::size_t kInitialSlots = 64;
// Index draws per registration before giving up: with at most a quarter of
// the 2^24 indices used (plus the few recently freed), 32 draws all hit one
// with chance below 2^-60.
constexpr int kIndexDraws = 32;
// The recently freed indices are searched linearly at each draw.
constexpr std::uint32_t kMaxReuseDelay = 4096;

// Fills `out` from the kernel CSPRNG. getrandom(2) with flags 0 blocks only
// until the pool is initialised at boot; small requests are not split unless
// a signal interrupts, which we retry.
bool FillRandom(std::uint8_t* out, std::size_t size) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = getrandom(out + done, size - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

RegionRef::RegionRef(std::shared_ptr<MemoryRegion> region) : region_(std::move(region)) {
  // Called under MemoryTable::mutex_ (shared), so Deregister, which unpublishes
  // under the exclusive lock, sees this count before it starts waiting.
  region_->users_.fetch_add(1, std::memory_order_relaxed);
}

RegionRef& RegionRef::operator=(RegionRef&& other) noexcept {
  if (this != &other) {
    Release();
    region_ = std::move(other.region_);
  }
  return *this;
}

void RegionRef::Release() {
  if (!region_) return;
  // Release order: the holder's copies into the buffer happen before a
  // Deregister that observes the count reach zero.
  if (region_->users_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    region_->users_.notify_all();
  }
  // The shared_ptr keeps the atomic alive until after notify_all returned.
  region_.reset();
}

MemoryTable::MemoryTable() : MemoryTable(Options{}) {}

MemoryTable::MemoryTable(Options options)
    : reuse_delay_(std::min(options.reuse_delay, kMaxReuseDelay)),
      max_regions_(std::clamp<std::uint32_t>(options.max_regions, 1, kMaxStagIndex / 4)),
      key_source_(std::move(options.key_source)),
      index_source_(std::move(options.index_source)) {
  slots_.resize(kInitialSlots);
}

MemoryTable::~MemoryTable() = default;

PdId MemoryTable::AllocatePd() {
  std::unique_lock lock(mutex_);
  if (next_pd_ == kNoPd) return kNoPd;  // the counter wrapped: ids are not reused
  const PdId pd = next_pd_++;
  pd_regions_.emplace(pd, 0);
  return pd;
}

PdStatus MemoryTable::DeallocatePd(PdId pd) {
  std::unique_lock lock(mutex_);
  const auto it = pd_regions_.find(pd);
  if (it == pd_regions_.end()) return PdStatus::kInvalidPd;
  if (it->second != 0) return PdStatus::kBusy;
  pd_regions_.erase(it);
  return PdStatus::kOk;
}

bool MemoryTable::TakeRandom(std::uint8_t* out, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) {
    if (random_left_ == 0) {
      if (!FillRandom(random_pool_, sizeof(random_pool_))) return false;
      random_left_ = sizeof(random_pool_);
    }
    out[i] = random_pool_[--random_left_];
    random_pool_[random_left_] = 0;  // used randomness is not kept around
  }
  return true;
}

std::optional<std::uint8_t> MemoryTable::NextKey() {
  if (key_source_) return key_source_();
  std::uint8_t key;
  if (!TakeRandom(&key, 1)) return std::nullopt;
  return key;
}

std::optional<std::uint32_t> MemoryTable::NextIndex() {
  for (int draw = 0; draw < kIndexDraws; ++draw) {
    std::uint32_t value;
    if (index_source_) {
      const std::optional<std::uint32_t> drawn = index_source_();
      if (!drawn) return std::nullopt;
      value = *drawn;
    } else {
      std::uint8_t bytes[3];
      if (!TakeRandom(bytes, sizeof(bytes))) return std::nullopt;
      value = std::uint32_t{bytes[0]} << 16 | std::uint32_t{bytes[1]} << 8 | bytes[2];
    }
    const std::uint32_t index = value & kMaxStagIndex;
    if (index == 0 || slots_[ProbeLocked(index)].index == index) continue;
    if (std::find(recently_freed_.begin(), recently_freed_.end(), index) !=
        recently_freed_.end()) {
      continue;
    }
    return index;
  }
  return 0;
}

RegisterResult MemoryTable::Register(PdId pd, std::uint64_t iova, std::uint64_t length,
                                     std::uintptr_t host_address, AccessFlags access) {
  if (HasAny(access, ~kAllAccessFlags)) return {RegisterStatus::kInvalidAccess, 0};
  // ibv_reg_mr(3): remote write or remote atomic requires local write.
  if (HasAny(access, AccessFlags::kRemoteWrite | AccessFlags::kRemoteAtomic) &&
      !HasAll(access, AccessFlags::kLocalWrite)) {
    return {RegisterStatus::kInvalidAccess, 0};
  }
  if (length == 0) return {RegisterStatus::kInvalidLength, 0};
  if (length - 1 > std::numeric_limits<std::uintptr_t>::max() - host_address) {
    return {RegisterStatus::kInvalidLength, 0};
  }
  const bool zero_based = HasAll(access, AccessFlags::kZeroBased);
  if (!zero_based && length - 1 > kU64Max - iova) return {RegisterStatus::kInvalidLength, 0};

  std::unique_lock lock(mutex_);
  const auto pd_it = pd_regions_.find(pd);
  if (pd_it == pd_regions_.end()) return {RegisterStatus::kInvalidPd, 0};
  if (region_count_ >= max_regions_) return {RegisterStatus::kNoResources, 0};
  if (2 * (region_count_ + 1) > slots_.size()) GrowLocked();

  const std::optional<std::uint32_t> index = NextIndex();
  if (!index) return {RegisterStatus::kNoRandomness, 0};
  if (*index == 0) return {RegisterStatus::kNoResources, 0};
  const std::optional<std::uint8_t> key = NextKey();
  if (!key) return {RegisterStatus::kNoRandomness, 0};

  const std::uint32_t stag = MakeStag(*index, *key);
  Slot& slot = slots_[ProbeLocked(*index)];
  slot.index = *index;
  slot.region = std::make_shared<MemoryRegion>(stag, pd, access, iova, length, host_address);
  ++pd_it->second;
  ++region_count_;
  return {RegisterStatus::kOk, stag};
}

std::size_t MemoryTable::ProbeLocked(std::uint32_t index) const {
  const std::size_t mask = slots_.size() - 1;
  std::size_t position = index & mask;
  // Terminates: at most half the slots are used.
  while (slots_[position].index != 0 && slots_[position].index != index) {
    position = (position + 1) & mask;
  }
  return position;
}

std::shared_ptr<MemoryRegion> MemoryTable::FindLocked(std::uint32_t stag) const {
  const std::uint32_t index = StagIndex(stag);
  if (index == 0) return nullptr;
  const Slot& slot = slots_[ProbeLocked(index)];
  if (slot.index != index || slot.region->stag_ != stag) return nullptr;
  return slot.region;
}

void MemoryTable::EraseLocked(std::size_t position) {
  // Linear probing without tombstones: move later entries of the probe run
  // back into the hole unless their home position lies after it.
  const std::size_t mask = slots_.size() - 1;
  slots_[position] = Slot{};
  for (std::size_t next = (position + 1) & mask; slots_[next].index != 0;
       next = (next + 1) & mask) {
    const std::size_t home = slots_[next].index & mask;
    const bool stays = position <= next ? (position < home && home <= next)
                                        : (position < home || home <= next);
    if (stays) continue;
    slots_[position] = std::move(slots_[next]);
    slots_[next] = Slot{};
    position = next;
  }
}

void MemoryTable::GrowLocked() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  for (Slot& slot : old) {
    if (slot.index != 0) slots_[ProbeLocked(slot.index)] = std::move(slot);
  }
}

DeregisterStatus MemoryTable::Deregister(std::uint32_t stag) {
  std::shared_ptr<MemoryRegion> region;
  {
    std::unique_lock lock(mutex_);
    region = FindLocked(stag);
    if (!region) return DeregisterStatus::kInvalidStag;
    const std::uint32_t index = StagIndex(stag);
    EraseLocked(ProbeLocked(index));
    if (reuse_delay_ > 0) {
      if (recently_freed_.size() == reuse_delay_) recently_freed_.pop_front();
      recently_freed_.push_back(index);
    }
    const auto pd_it = pd_regions_.find(region->pd_);
    if (pd_it != pd_regions_.end() && pd_it->second > 0) --pd_it->second;
    --region_count_;
    // Holders that re-check validity between segments stop early.
    region->valid_.store(false, std::memory_order_release);
  }
  // No new RegionRef can appear now; wait for the ones taken before.
  for (std::uint32_t users = region->users_.load(std::memory_order_acquire); users != 0;
       users = region->users_.load(std::memory_order_acquire)) {
    region->users_.wait(users, std::memory_order_acquire);
  }
  return DeregisterStatus::kOk;
}

AccessCheckResult MemoryTable::Check(std::uint32_t stag, PdId qp_pd, AccessKind kind,
                                     std::uint64_t to, std::uint64_t length) const {
  AccessCheckResult result;
  // Zero-length accesses touch no memory and are not checked (file comment).
  if (length == 0) {
    result.status = AccessStatus::kOk;
    return result;
  }
  checks_.fetch_add(1, std::memory_order_relaxed);
  std::shared_lock lock(mutex_);
  std::shared_ptr<MemoryRegion> region = FindLocked(stag);
  if (!region) {
    result.status = AccessStatus::kInvalidStag;
  } else if (region->pd_ != qp_pd) {
    result.status = AccessStatus::kPdMismatch;
  } else if (!region->valid_.load(std::memory_order_acquire)) {
    result.status = AccessStatus::kInvalidated;
  } else if (!HasAll(region->access_, RequiredFlags(kind))) {
    result.status = AccessStatus::kAccessViolation;
  } else if (length - 1 > kU64Max - to) {
    result.status = AccessStatus::kToWrap;
  } else if (to < region->base_to() || length > region->length_ ||
             to - region->base_to() > region->length_ - length) {
    result.status = AccessStatus::kBaseOrBounds;
  } else {
    result.status = AccessStatus::kOk;
    result.region = RegionRef(std::move(region));  // counted while the lock is held
  }
  return result;
}

InvalidateStatus MemoryTable::Invalidate(std::uint32_t stag, PdId qp_pd, bool remote) {
  // Invalidation changes no slot, only the region's own atomic flag.
  std::shared_lock lock(mutex_);
  const std::shared_ptr<MemoryRegion> region = FindLocked(stag);
  if (!region) return InvalidateStatus::kInvalidStag;
  if (region->pd_ != qp_pd) return InvalidateStatus::kPdMismatch;
  // Every region here is a memory region shared by the PD's streams.
  if (remote) return InvalidateStatus::kCannotInvalidate;
  region->valid_.store(false, std::memory_order_release);
  return InvalidateStatus::kOk;
}

InvalidateStatus MemoryTable::InvalidateLocal(std::uint32_t stag, PdId qp_pd) {
  return Invalidate(stag, qp_pd, /*remote=*/false);
}

InvalidateStatus MemoryTable::InvalidateRemote(std::uint32_t stag, PdId qp_pd) {
  return Invalidate(stag, qp_pd, /*remote=*/true);
}

std::size_t MemoryTable::region_count() const {
  std::shared_lock lock(mutex_);
  return region_count_;
}

}  // namespace siwx::engine
