// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/memory.h"

#include <linux/membarrier.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <limits>
#include <mutex>
#include <thread>
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

// Lookups that saw a writer before they give up and take the writer lock
// (so a stream of registrations cannot starve them).
constexpr int kOptimisticLookups = 16;

// Hazard words: the address of a region (aligned to 64) with the number of
// refs the word counts in the low six bits.
constexpr std::uint64_t kHazardCountMask = 63;
constexpr int kHazardWords = 8;  // one cache line
// Tables whose checks a record counts (checks()).
constexpr int kCountedTables = 4;

}  // namespace

// One thread's reader record: written only by that thread (so with plain
// loads and stores: a locked instruction would wait for the thread's
// earlier stores, such as a copy into a buffer the other CPU reads), read
// by Deregister and checks(). Records are never freed; a thread that ends
// gives its record to the next new thread.
struct alignas(64) ReaderRecord {
  std::atomic<std::uint64_t> hazards[kHazardWords] = {};
  struct CheckCount {
    std::atomic<std::uint64_t> table{0};  // MemoryTable::id_, 0: unused
    std::atomic<std::uint64_t> count{0};
  };
  alignas(64) CheckCount counts[kCountedTables];
  alignas(64) std::atomic<bool> in_use{false};
  ReaderRecord* next = nullptr;  // immutable once the record is listed

  // A hazard word now counting one more ref of `region`, or null if all
  // words count other regions. `fresh` is set if the word counted no ref
  // of it before (the caller must then fence before validating).
  std::atomic<std::uint64_t>* Hold(const MemoryRegion* region, bool& fresh) {
    const auto address = reinterpret_cast<std::uint64_t>(region);
    std::atomic<std::uint64_t>* unused = nullptr;
    for (std::atomic<std::uint64_t>& word : hazards) {
      const std::uint64_t value = word.load(std::memory_order_relaxed);
      const std::uint64_t count = value & kHazardCountMask;
      if ((value & ~kHazardCountMask) == address && count < kHazardCountMask) {
        word.store(value + 1, std::memory_order_relaxed);
        fresh = count == 0;
        return &word;
      }
      if (count == 0 && unused == nullptr) unused = &word;
    }
    if (unused != nullptr) {
      unused->store(address | 1, std::memory_order_relaxed);
      fresh = true;
    }
    return unused;
  }

  void CountCheck(std::uint64_t table) {
    CheckCount* oldest = &counts[0];
    for (CheckCount& c : counts) {
      const std::uint64_t id = c.table.load(std::memory_order_relaxed);
      if (id == table) {
        c.count.store(c.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        return;
      }
      if (id < oldest->table.load(std::memory_order_relaxed)) oldest = &c;
    }
    // Table ids grow: the smallest is the oldest table, most likely gone.
    oldest->table.store(table, std::memory_order_relaxed);
    oldest->count.store(1, std::memory_order_relaxed);
  }
};

namespace {

std::atomic<ReaderRecord*> g_records{nullptr};
std::atomic<std::uint64_t> g_next_table_id{1};
thread_local ReaderRecord* t_record = nullptr;

// The fence pair between a lookup (publishes its hazard word, then reads
// the version) and Deregister (changes the version, then reads the hazard
// words). With membarrier(2) the whole cost goes to Deregister: it makes
// every running thread of the process pass a full barrier, so a lookup
// needs only a compiler barrier. Without it (kernels before 4.14, or a
// seccomp filter that refuses it), both sides use a full fence.
bool RegisterAsymmetricFences() {
  const long supported = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

bool AsymmetricFences() {
  static const bool registered = RegisterAsymmetricFences();
  return registered;
}

void LightFence() {
  if (AsymmetricFences()) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

void HeavyFence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (AsymmetricFences() &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) {
    return;
  }
  // Registered, yet refused (never seen): a lookup's hazard word may still
  // sit in its CPU's store buffer, which drains within microseconds; wait
  // that out before the words are read.
  if (AsymmetricFences()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
thread_local bool t_record_returned = false;  // the thread is ending

struct RecordReturner {
  ~RecordReturner() {
    if (t_record == nullptr) return;
    t_record->in_use.store(false, std::memory_order_release);
    t_record = nullptr;
    t_record_returned = true;
  }
};

ReaderRecord& AcquireRecord() {
  for (ReaderRecord* r = g_records.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    bool expected = false;
    if (!r->in_use.load(std::memory_order_relaxed) &&
        r->in_use.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      t_record = r;
      break;
    }
  }
  if (t_record == nullptr) {
    auto* r = new ReaderRecord;
    r->in_use.store(true, std::memory_order_relaxed);
    r->next = g_records.load(std::memory_order_relaxed);
    while (!g_records.compare_exchange_weak(r->next, r, std::memory_order_acq_rel)) {
    }
    t_record = r;
  }
  // A check from a thread_local destructor after ours ran keeps its record.
  if (!t_record_returned) {
    thread_local RecordReturner returner;
    (void)returner;
  }
  return *t_record;
}

ReaderRecord& ThisThreadRecord() {
  ReaderRecord* record = t_record;
  return record != nullptr ? *record : AcquireRecord();
}

// Deregister's wait for holders, who hold a region for one copy (memory.h):
// yield first, then sleep, growing to a millisecond.
template <typename Done>
void WaitUntil(Done done) {
  for (int spin = 0; spin < 64; ++spin) {
    if (done()) return;
    std::this_thread::yield();
  }
  auto pause = std::chrono::microseconds(20);
  while (!done()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace

RegionRef& RegionRef::operator=(RegionRef&& other) noexcept {
  if (this != &other) {
    Release();
    region_ = std::exchange(other.region_, nullptr);
    hazard_ = std::exchange(other.hazard_, nullptr);
  }
  return *this;
}

void RegionRef::Release() {
  if (region_ == nullptr) return;
  // Release order: the holder's copies into the buffer happen before a
  // Deregister that observes the count reach zero.
  if (hazard_ != nullptr) {
    // Only the taking thread writes its words (memory.h).
    assert(t_record != nullptr && hazard_ >= t_record->hazards &&
           hazard_ < t_record->hazards + kHazardWords);
    hazard_->store(hazard_->load(std::memory_order_relaxed) - 1, std::memory_order_release);
  } else {
    region_->users_.fetch_sub(1, std::memory_order_release);
  }
  region_ = nullptr;
  hazard_ = nullptr;
}

MemoryTable::MemoryTable() : MemoryTable(Options{}) {}

MemoryTable::MemoryTable(Options options)
    : reuse_delay_(std::min(options.reuse_delay, kMaxReuseDelay)),
      max_regions_(std::clamp<std::uint32_t>(options.max_regions, 1, kMaxStagIndex / 4)),
      key_source_(std::move(options.key_source)),
      index_source_(std::move(options.index_source)),
      id_(g_next_table_id.fetch_add(1, std::memory_order_relaxed)) {
  AsymmetricFences();  // registers the process once, before any lookup
  current_ = std::make_unique<SlotArray>(kInitialSlots);
  slots_.store(current_.get(), std::memory_order_release);
}

MemoryTable::~MemoryTable() {
  for (std::size_t i = 0; i < current_->size(); ++i) {
    delete current_->slots[i].region.load(std::memory_order_relaxed);
  }
}

void MemoryTable::BeginWriteLocked() {
  version_.store(version_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

void MemoryTable::EndWriteLocked() {
  version_.store(version_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

PdId MemoryTable::AllocatePd() {
  std::lock_guard lock(writer_mutex_);
  if (next_pd_ == kNoPd) return kNoPd;  // the counter wrapped: ids are not reused
  const PdId pd = next_pd_++;
  pd_regions_.emplace(pd, 0);
  return pd;
}

PdStatus MemoryTable::DeallocatePd(PdId pd) {
  std::lock_guard lock(writer_mutex_);
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
    if (index == 0 ||
        current_->slots[ProbeLocked(index)].index.load(std::memory_order_relaxed) == index) {
      continue;
    }
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

  std::lock_guard lock(writer_mutex_);
  const auto pd_it = pd_regions_.find(pd);
  if (pd_it == pd_regions_.end()) return {RegisterStatus::kInvalidPd, 0};
  if (region_count_ >= max_regions_) return {RegisterStatus::kNoResources, 0};
  const std::optional<std::uint32_t> index = NextIndex();
  if (!index) return {RegisterStatus::kNoRandomness, 0};
  if (*index == 0) return {RegisterStatus::kNoResources, 0};
  const std::optional<std::uint8_t> key = NextKey();
  if (!key) return {RegisterStatus::kNoRandomness, 0};

  const std::uint32_t stag = MakeStag(*index, *key);
  auto* region = new MemoryRegion(stag, pd, access, iova, length, host_address);
  BeginWriteLocked();
  if (2 * (region_count_ + 1) > current_->size()) GrowLocked();
  Slot& slot = current_->slots[ProbeLocked(*index)];
  slot.region.store(region, std::memory_order_release);  // the record before its STag
  slot.stag.store(stag, std::memory_order_relaxed);
  slot.index.store(*index, std::memory_order_relaxed);
  EndWriteLocked();
  ++pd_it->second;
  ++region_count_;
  return {RegisterStatus::kOk, stag};
}

std::size_t MemoryTable::ProbeLocked(std::uint32_t index) const {
  const std::size_t mask = current_->mask;
  std::size_t position = index & mask;
  // Terminates: at most half the slots are used.
  for (;;) {
    const std::uint32_t at = current_->slots[position].index.load(std::memory_order_relaxed);
    if (at == 0 || at == index) return position;
    position = (position + 1) & mask;
  }
}

MemoryRegion* MemoryTable::FindLocked(std::uint32_t stag) const {
  const std::uint32_t index = StagIndex(stag);
  if (index == 0) return nullptr;
  const Slot& slot = current_->slots[ProbeLocked(index)];
  if (slot.index.load(std::memory_order_relaxed) != index ||
      slot.stag.load(std::memory_order_relaxed) != stag) {
    return nullptr;
  }
  return slot.region.load(std::memory_order_relaxed);
}

void MemoryTable::EraseLocked(std::size_t position) {
  // Linear probing without tombstones: move later entries of the probe run
  // back into the hole unless their home position lies after it.
  Slot* slots = current_->slots.get();
  const std::size_t mask = current_->mask;
  auto clear = [&](std::size_t at) {
    slots[at].index.store(0, std::memory_order_relaxed);
    slots[at].stag.store(0, std::memory_order_relaxed);
    slots[at].region.store(nullptr, std::memory_order_relaxed);
  };
  clear(position);
  for (std::size_t next = (position + 1) & mask;
       slots[next].index.load(std::memory_order_relaxed) != 0; next = (next + 1) & mask) {
    const std::size_t home = slots[next].index.load(std::memory_order_relaxed) & mask;
    const bool stays = position <= next ? (position < home && home <= next)
                                        : (position < home || home <= next);
    if (stays) continue;
    slots[position].region.store(slots[next].region.load(std::memory_order_relaxed),
                                 std::memory_order_relaxed);
    slots[position].stag.store(slots[next].stag.load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
    slots[position].index.store(slots[next].index.load(std::memory_order_relaxed),
                                std::memory_order_relaxed);
    clear(next);
    position = next;
  }
}

void MemoryTable::GrowLocked() {
  auto grown = std::make_unique<SlotArray>(current_->size() * 2);
  std::swap(grown, current_);
  for (std::size_t i = 0; i < grown->size(); ++i) {
    const Slot& old = grown->slots[i];
    const std::uint32_t index = old.index.load(std::memory_order_relaxed);
    if (index == 0) continue;
    Slot& slot = current_->slots[ProbeLocked(index)];
    slot.region.store(old.region.load(std::memory_order_relaxed), std::memory_order_relaxed);
    slot.stag.store(old.stag.load(std::memory_order_relaxed), std::memory_order_relaxed);
    slot.index.store(index, std::memory_order_relaxed);
  }
  slots_.store(current_.get(), std::memory_order_release);
  // A lookup may still be reading the old array (it will see the version
  // change and start again): kept until the table goes, at most as large
  // as the current one in all.
  retired_.push_back(std::move(grown));
}

DeregisterStatus MemoryTable::Deregister(std::uint32_t stag) {
  MemoryRegion* region = nullptr;
  {
    std::lock_guard lock(writer_mutex_);
    region = FindLocked(stag);
    if (region == nullptr) return DeregisterStatus::kInvalidStag;
    const std::uint32_t index = StagIndex(stag);
    BeginWriteLocked();
    EraseLocked(ProbeLocked(index));
    EndWriteLocked();
    if (reuse_delay_ > 0) {
      if (recently_freed_.size() == reuse_delay_) recently_freed_.pop_front();
      recently_freed_.push_back(index);
    }
    const auto pd_it = pd_regions_.find(region->pd_);
    if (pd_it != pd_regions_.end() && pd_it->second > 0) --pd_it->second;
    --region_count_;
    // Holders that re-check validity between segments stop early.
    region->state_.store(MemoryRegion::State::kDeregistered, std::memory_order_release);
  }
  // Pairs with the fence of a lookup between publishing its hazard word and
  // validating the version: either it sees the new version and lets go, or
  // this thread sees its word below.
  HeavyFence();
  const auto address = reinterpret_cast<std::uint64_t>(region);
  for (ReaderRecord* r = g_records.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    for (std::atomic<std::uint64_t>& word : r->hazards) {
      WaitUntil([&] {
        const std::uint64_t value = word.load(std::memory_order_acquire);
        return (value & ~kHazardCountMask) != address || (value & kHazardCountMask) == 0;
      });
    }
  }
  WaitUntil([&] { return region->users_.load(std::memory_order_acquire) == 0; });
  delete region;
  return DeregisterStatus::kOk;
}

RegionRef MemoryTable::Pin(std::uint32_t stag, ReaderRecord& record) const {
  const std::uint32_t index = StagIndex(stag);
  if (index == 0) return {};
  for (int attempt = 0; attempt < kOptimisticLookups; ++attempt) {
    const std::uint64_t before = version_.load(std::memory_order_acquire);
    if ((before & 1) != 0) {
      std::this_thread::yield();  // a writer is changing slots
      continue;
    }
    const SlotArray& array = *slots_.load(std::memory_order_acquire);
    MemoryRegion* region = nullptr;
    std::size_t position = index & array.mask;
    // At most every slot: a torn read must not loop for ever.
    for (std::size_t probes = 0; probes <= array.mask; ++probes) {
      const Slot& slot = array.slots[position];
      const std::uint32_t at = slot.index.load(std::memory_order_relaxed);
      if (at == 0) break;
      if (at == index) {
        if (slot.stag.load(std::memory_order_relaxed) == stag) {
          region = slot.region.load(std::memory_order_acquire);
        }
        break;
      }
      position = (position + 1) & array.mask;
    }
    if (region == nullptr) {
      std::atomic_thread_fence(std::memory_order_acquire);
      if (version_.load(std::memory_order_relaxed) == before) return {};
      continue;
    }
    // Nothing of the region is read before the version says it was
    // published while the hazard word counted it (memory.h).
    bool fresh = false;
    std::atomic<std::uint64_t>* hazard = record.Hold(region, fresh);
    if (hazard == nullptr) break;  // all words in use: the locked path
    if (fresh) LightFence();
    std::atomic_thread_fence(std::memory_order_acquire);  // the slot reads before the version
    if (version_.load(std::memory_order_relaxed) == before) return RegionRef(region, hazard);
    hazard->store(hazard->load(std::memory_order_relaxed) - 1, std::memory_order_release);
  }
  return PinLocked(stag);
}

RegionRef MemoryTable::PinLocked(std::uint32_t stag) const {
  std::lock_guard lock(writer_mutex_);
  MemoryRegion* region = FindLocked(stag);
  if (region == nullptr) return {};
  // Under the writer lock: Deregister, which unpublishes under it, sees
  // this count before it starts waiting.
  region->users_.fetch_add(1, std::memory_order_relaxed);
  return RegionRef(region, nullptr);
}

AccessCheckResult MemoryTable::Check(std::uint32_t stag, PdId qp_pd, AccessKind kind,
                                     std::uint64_t to, std::uint64_t length) const {
  AccessCheckResult result;
  // Zero-length accesses touch no memory and are not checked (file comment).
  if (length == 0) {
    result.status = AccessStatus::kOk;
    return result;
  }
  ReaderRecord& record = ThisThreadRecord();
  record.CountCheck(id_);
  RegionRef pinned = Pin(stag, record);
  const MemoryRegion* region = pinned.get();
  // A region Deregister unpublished after this lookup found it is gone too.
  const MemoryRegion::State state =
      region != nullptr ? region->state_.load(std::memory_order_acquire)
                        : MemoryRegion::State::kDeregistered;
  if (state == MemoryRegion::State::kDeregistered) {
    result.status = AccessStatus::kInvalidStag;
  } else if (region->pd_ != qp_pd) {
    result.status = AccessStatus::kPdMismatch;
  } else if (state == MemoryRegion::State::kInvalidated) {
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
    result.region = std::move(pinned);
  }
  return result;
}

InvalidateStatus MemoryTable::Invalidate(std::uint32_t stag, PdId qp_pd, bool remote) {
  // Invalidation changes no slot, only the region's own atomic flag; the
  // writer lock keeps Deregister from freeing the record meanwhile.
  std::lock_guard lock(writer_mutex_);
  MemoryRegion* const region = FindLocked(stag);
  if (region == nullptr) return InvalidateStatus::kInvalidStag;
  if (region->pd_ != qp_pd) return InvalidateStatus::kPdMismatch;
  // Every region here is a memory region shared by the PD's streams.
  if (remote) return InvalidateStatus::kCannotInvalidate;
  // Under the writer lock, so never over kDeregistered.
  region->state_.store(MemoryRegion::State::kInvalidated, std::memory_order_release);
  return InvalidateStatus::kOk;
}

InvalidateStatus MemoryTable::InvalidateLocal(std::uint32_t stag, PdId qp_pd) {
  return Invalidate(stag, qp_pd, /*remote=*/false);
}

InvalidateStatus MemoryTable::InvalidateRemote(std::uint32_t stag, PdId qp_pd) {
  return Invalidate(stag, qp_pd, /*remote=*/true);
}

std::uint64_t MemoryTable::checks() const {
  std::uint64_t total = 0;
  for (ReaderRecord* r = g_records.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    for (const ReaderRecord::CheckCount& c : r->counts) {
      if (c.table.load(std::memory_order_relaxed) == id_) {
        total += c.count.load(std::memory_order_relaxed);
      }
    }
  }
  return total;
}

std::size_t MemoryTable::region_count() const {
  std::lock_guard lock(writer_mutex_);
  return region_count_;
}

}  // namespace siwx::engine
